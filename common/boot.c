#include "boot.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

#define BOOT_ID_PATH "/proc/sys/kernel/random/boot_id"

void boot_id(char *buf, size_t len)
{
	int fd = open(BOOT_ID_PATH, O_RDONLY | O_CLOEXEC);
	ssize_t n = -1;

	if (len == 0)
		return;
	buf[0] = '\0';
	if (fd < 0)
		return;
	n = read(fd, buf, len - 1);
	close(fd);
	buf[n > 0 ? n : 0] = '\0';
	buf[strcspn(buf, "\n")] = '\0';
}

bool boot_tag(char tag[BOOT_TAG_LEN + 1])
{
	char id[64];
	size_t k = 0;

	boot_id(id, sizeof(id));
	for (const char *p = id; *p && k < BOOT_TAG_LEN; p++) {
		if (isxdigit((unsigned char)*p))
			tag[k++] = (char)tolower((unsigned char)*p);
	}
	tag[k == BOOT_TAG_LEN ? k : 0] = '\0';
	return k == BOOT_TAG_LEN;
}

const char *boot_tag_of_name(const char *name, const char *mark)
{
	size_t n = strlen(name), k = strlen(mark);
	const char *at;

	if (n < k + BOOT_TAG_LEN)
		return NULL;
	at = name + n - BOOT_TAG_LEN - k;
	if (strncmp(at, mark, k) != 0)
		return NULL;
	for (const char *p = at + k; *p; p++) {
		if (!isxdigit((unsigned char)*p))
			return NULL;
	}
	return at + k;
}

int boot_set_load(int dirfd, struct boot_set *s)
{
	char text[BOOT_SET_MAX * (BOOT_TAG_LEN + 1) + 1];
	int fd = openat(dirfd, BOOT_FLUSHED_NAME, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	ssize_t len;

	s->n = 0;
	if (fd < 0)
		return errno == ENOENT ? 0 : -errno;
	len = read(fd, text, sizeof(text) - 1);
	close(fd);
	if (len < 0)
		return -errno;
	text[len] = '\0';
	for (char *save = NULL, *line = strtok_r(text, "\n", &save); line;
	     line = strtok_r(NULL, "\n", &save)) {
		if (strlen(line) == BOOT_TAG_LEN && boot_tag_of_name(line, ""))
			boot_set_add(s, line);
	}
	return 0;
}

int boot_set_store(int dirfd, const struct boot_set *s)
{
	static const char tmp[] = BOOT_FLUSHED_NAME ".tmp";
	char text[BOOT_SET_MAX * (BOOT_TAG_LEN + 1) + 1];
	size_t len = 0;
	int fd, rc = 0;

	for (size_t k = 0; k < s->n; k++)
		len += (size_t)snprintf(text + len, sizeof(text) - len, "%s\n", s->tag[k]);
	fd = openat(dirfd, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (fd < 0)
		return -errno;
	if (write(fd, text, len) != (ssize_t)len || fsync(fd) < 0)
		rc = errno ? -errno : -EIO;
	close(fd);
	if (rc == 0 && (renameat(dirfd, tmp, dirfd, BOOT_FLUSHED_NAME) < 0 || fsync(dirfd) < 0))
		rc = -errno;
	if (rc < 0)
		unlinkat(dirfd, tmp, 0);
	return rc;
}

bool boot_set_has(const struct boot_set *s, const char *tag)
{
	for (size_t k = 0; k < s->n; k++) {
		if (strcmp(s->tag[k], tag) == 0)
			return true;
	}
	return false;
}

void boot_set_add(struct boot_set *s, const char *tag)
{
	if (boot_set_has(s, tag))
		return;
	if (s->n == BOOT_SET_MAX) {
		memmove(s->tag[0], s->tag[1], (BOOT_SET_MAX - 1) * sizeof(s->tag[0]));
		s->n--;
	}
	snprintf(s->tag[s->n++], sizeof(s->tag[0]), "%s", tag);
}

bool boot_set_remove(struct boot_set *s, const char *tag)
{
	for (size_t k = 0; k < s->n; k++) {
		if (strcmp(s->tag[k], tag) == 0) {
			memmove(s->tag[k], s->tag[k + 1], (s->n - k - 1) * sizeof(s->tag[0]));
			s->n--;
			return true;
		}
	}
	return false;
}

enum boot_name boot_name_state(const char *name, const char *mark, const char *now,
			       const struct boot_set *flushed)
{
	const char *tag = boot_tag_of_name(name, mark);

	if (!tag)
		return BOOT_NAME_UNTAGGED;
	if (!now[0])
		return BOOT_NAME_UNKNOWN;
	if (strcmp(tag, now) == 0 || (flushed && boot_set_has(flushed, tag)))
		return BOOT_NAME_WHOLE;
	return BOOT_NAME_TORN;
}
