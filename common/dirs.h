/*
 * dirs: making a directory with its missing parents (mkdir -p).
 */
#ifndef FERRY_DIRS_H
#define FERRY_DIRS_H

#include <sys/types.h>

/* Makes path and any missing parent with mode (existing ones are left as
 * they are). Returns 0 or a negative errno. */
int dirs_make(const char *path, mode_t mode);

#endif
