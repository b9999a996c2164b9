/* dirs: mkdir -p, and emptying a directory. */
#include "dirs.h"

#include <errno.h>
#include <ftw.h>
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

/* nftw() passes no argument to its callback: the walk's state. */
static dev_t empty_dev;
static int empty_err;

static int empty_one(const char *path, const struct stat *st, int type, struct FTW *ftw)
{
	(void)type;
	if (ftw->level == 0)
		return 0; /* the directory itself stays */
	if (st->st_dev != empty_dev)
		return 0; /* a mount inside, or its mount point (FTW_MOUNT left it whole) */
	if (remove(path) < 0 && errno != ENOENT && empty_err == 0)
		empty_err = -errno;
	return 0;
}

int dirs_empty(const char *path)
{
	struct stat st;

	if (lstat(path, &st) < 0)
		return -errno;
	if (!S_ISDIR(st.st_mode))
		return -ENOTDIR;
	empty_dev = st.st_dev;
	empty_err = 0;
	if (nftw(path, empty_one, 16, FTW_DEPTH | FTW_PHYS | FTW_MOUNT) < 0 && empty_err == 0)
		empty_err = -errno;
	return empty_err;
}
