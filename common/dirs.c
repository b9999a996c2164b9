/* dirs: mkdir -p, and emptying a directory. */
#include "dirs.h"

#include <errno.h>
#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int dirs_make(const char *path, mode_t mode)
{
	char buf[4096];
	size_t n = strlen(path);

	if (n >= sizeof(buf))
		return -ENAMETOOLONG;
	memcpy(buf, path, n + 1);
	for (char *p = buf + 1;; p++) {
		if (*p == '/' || *p == '\0') {
			char c = *p;

			*p = '\0';
			if (mkdir(buf, mode) < 0 && errno != EEXIST)
				return -errno;
			*p = c;
			if (!c)
				break;
		}
	}
	return 0;
}

/* Removes what dfd holds on device dev; dirs deeper than a few levels are
 * not the staging directory's. Names are taken relative to their parent's
 * fd, never followed: a symlink swapped in during the walk is removed,
 * not walked into. */
static int empty_at(int dfd, dev_t dev, int depth, const char *keep)
{
	DIR *d;
	struct dirent *de;
	int err = 0, fd = dup(dfd);

	if (fd < 0)
		return -errno;
	d = fdopendir(fd);
	if (!d) {
		err = -errno;
		close(fd);
		return err;
	}
	rewinddir(d); /* the dup shares dfd's offset */
	while ((de = readdir(d))) {
		const char *n = de->d_name;
		struct stat st;
		int rc = 0;

		if (strcmp(n, ".") == 0 || strcmp(n, "..") == 0 || (keep && strcmp(n, keep) == 0))
			continue;
		if (fstatat(dfd, n, &st, AT_SYMLINK_NOFOLLOW) < 0) {
			rc = errno == ENOENT ? 0 : -errno;
		} else if (S_ISDIR(st.st_mode)) {
			if (st.st_dev != dev)
				continue; /* a mount inside: its mount point stays */
			int sub = depth >= 16 ? -1 :
				  openat(dfd, n, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
			if (sub < 0) {
				rc = depth >= 16 ? -ELOOP : -errno;
			} else {
				struct stat again;
				/* The directory opened is the one looked at. */
				if (fstat(sub, &again) < 0 || again.st_dev != st.st_dev ||
				    again.st_ino != st.st_ino)
					rc = -ESTALE;
				else
					rc = empty_at(sub, dev, depth + 1, NULL);
				close(sub);
				if (rc == 0 && unlinkat(dfd, n, AT_REMOVEDIR) < 0 && errno != ENOENT)
					rc = -errno;
			}
		} else if (unlinkat(dfd, n, 0) < 0 && errno != ENOENT) {
			rc = -errno;
		}
		if (rc < 0 && err == 0)
			err = rc;
	}
	closedir(d);
	return err;
}

int dirs_empty_at(int dfd, const char *keep)
{
	struct stat st;

	if (fstat(dfd, &st) < 0)
		return -errno;
	if (!S_ISDIR(st.st_mode))
		return -ENOTDIR;
	return empty_at(dfd, st.st_dev, 0, keep);
}

int dirs_make_parents_at(int dfd, const char *path, mode_t mode)
{
	char buf[PATH_MAX];
	size_t n = strlen(path);

	if (n >= sizeof(buf))
		return -ENAMETOOLONG;
	memcpy(buf, path, n + 1);
	for (char *p = buf + 1; *p; p++) {
		if (*p != '/')
			continue;
		*p = '\0';
		if (mkdirat(dfd, buf, mode) < 0 && errno != EEXIST)
			return -errno;
		*p = '/';
	}
	return 0;
}

int dirs_replace_file_at(int dfd, const char *name, const void *buf, size_t len)
{
	char tmp[NAME_MAX + 1];
	size_t done = 0;
	int fd, rc = 0;

	if ((size_t)snprintf(tmp, sizeof(tmp), "%s.tmp", name) >= sizeof(tmp))
		return -ENAMETOOLONG;
	fd = openat(dfd, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (fd < 0)
		return -errno;
	while (rc == 0 && done < len) {
		ssize_t put = write(fd, (const char *)buf + done, len - done);

		if (put < 0 && errno != EINTR)
			rc = -errno;
		else if (put == 0)
			rc = -ENOSPC;
		else if (put > 0)
			done += (size_t)put;
	}
	if (rc == 0 && fsync(fd) < 0)
		rc = -errno;
	if (close(fd) < 0 && rc == 0)
		rc = -errno;
	if (rc == 0 && renameat(dfd, tmp, dfd, name) < 0)
		rc = -errno;
	if (rc < 0) {
		unlinkat(dfd, tmp, 0);
		return rc;
	}
	return fsync(dfd) < 0 ? -errno : 0;
}
