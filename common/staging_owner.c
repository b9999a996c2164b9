#include "staging_owner.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdint.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

/* A volume's uuid is 36 characters; the record holds it and a newline. */
#define OWNER_MAX 64

/* The record's one line into buf (at most OWNER_MAX bytes, NUL-ended):
 * 0, -ENOENT where there is none, -EBADMSG where it holds no line, or
 * another -errno. */
static int owner_read(int dirfd, char buf[OWNER_MAX + 1])
{
	int fd = openat(dirfd, STAGING_OWNER_NAME, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	ssize_t n;
	size_t len;

	buf[0] = '\0';
	if (fd < 0)
		return -errno;
	n = read(fd, buf, OWNER_MAX);
	if (n < 0) {
		int err = -errno;
		close(fd);
		return err;
	}
	close(fd);
	buf[n] = '\0';
	len = strcspn(buf, "\n");
	if (len == 0 || buf[len] != '\n')
		return -EBADMSG;
	buf[len] = '\0';
	for (size_t i = 0; i < len; i++) {
		if (buf[i] < 0x21 || buf[i] > 0x7e)
			return -EBADMSG;
	}
	return 0;
}

/* Writes the record as a file of its own first, then links it in:
 * linkat() fails with EEXIST where another daemon's record got there
 * first, so two claims at once cannot both win. */
static int owner_write(int dirfd, const char *uuid)
{
	char tmp[64];
	int fd, rc = 0;
	size_t len = strlen(uuid);
	ssize_t put;
	uint64_t r;

	/* A name of its own even where daemons in other pid namespaces share
	 * the directory (their pids may be equal). */
	if (getrandom(&r, sizeof(r), 0) != (ssize_t)sizeof(r))
		return -errno;
	snprintf(tmp, sizeof(tmp), "%s.%016llx.tmp", STAGING_OWNER_NAME, (unsigned long long)r);
	fd = openat(dirfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (fd < 0)
		return -errno;
	put = dprintf(fd, "%s\n", uuid);
	if (put < 0 || fsync(fd) < 0)
		rc = -errno;
	else if ((size_t)put != len + 1)
		rc = -ENOSPC;
	if (close(fd) < 0 && rc == 0)
		rc = -errno;
	if (rc == 0 && linkat(dirfd, tmp, dirfd, STAGING_OWNER_NAME, 0) < 0)
		rc = -errno;
	unlinkat(dirfd, tmp, 0);
	if (rc == 0 && fsync(dirfd) < 0)
		rc = -errno;
	return rc;
}

/* What the record holds, printable, for a message. */
static void owner_copy(char *out, size_t outlen, const char *held)
{
	size_t i;

	if (outlen == 0)
		return;
	for (i = 0; held[i] && i + 1 < outlen; i++)
		out[i] = held[i] >= 0x20 && held[i] <= 0x7e ? held[i] : '?';
	out[i] = '\0';
}

int staging_owner_get(int dirfd, char *uuid, size_t len)
{
	char held[OWNER_MAX + 1];
	int rc = owner_read(dirfd, held);

	owner_copy(uuid, len, rc == 0 || rc == -EBADMSG ? held : "");
	return rc;
}

int staging_owner_drop(int dirfd)
{
	if (unlinkat(dirfd, STAGING_OWNER_NAME, 0) < 0 && errno != ENOENT)
		return -errno;
	return fsync(dirfd) < 0 ? -errno : 0;
}

int staging_owner_claim(int dirfd, const char *uuid, char *other, size_t otherlen)
{
	char held[OWNER_MAX + 1];
	int rc;

	if (otherlen)
		other[0] = '\0';
	if (strlen(uuid) == 0 || strlen(uuid) > OWNER_MAX - 1 || strchr(uuid, '\n'))
		return -EINVAL;
	rc = owner_read(dirfd, held);
	if (rc == -ENOENT) {
		rc = owner_write(dirfd, uuid);
		if (rc != -EEXIST)
			return rc;
		rc = owner_read(dirfd, held); /* another claim won: whose? */
	}
	if (rc < 0) {
		if (rc == -EBADMSG)
			owner_copy(other, otherlen, held);
		return rc;
	}
	if (strcmp(held, uuid) == 0)
		return 0;
	owner_copy(other, otherlen, held);
	return -EEXIST;
}
