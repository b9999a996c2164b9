/* Shared by the unit tests that make a volume in a temporary directory:
 * removes the directory and the files in it (no subdirectories). */
#ifndef FERRY_TEST_TMP_DIR_H
#define FERRY_TEST_TMP_DIR_H

#include <dirent.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static inline void rm_dir(const char *path)
{
	DIR *d = opendir(path);
	struct dirent *de;
	char p[512];

	if (d == NULL)
		return;
	while ((de = readdir(d)) != NULL) {
		if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
			continue;
		snprintf(p, sizeof(p), "%s/%s", path, de->d_name);
		unlink(p);
	}
	closedir(d);
	rmdir(path);
}

#endif
