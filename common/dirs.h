/*
 * dirs: making a directory with its missing parents (mkdir -p), and
 * emptying one.
 */
#ifndef FERRY_DIRS_H
#define FERRY_DIRS_H

#include <sys/types.h>

/* Makes path and any missing parent with mode (existing ones are left as
 * they are). Returns 0 or a negative errno. */
int dirs_make(const char *path, mode_t mode);
/* Removes everything under path that is on path's own filesystem (what
 * is mounted inside stays, and so does its mount point), leaving path
 * itself. 0, -ENOENT where path is missing, or the first error met (the
 * rest is still removed where it can be). Not thread-safe (nftw). */
int dirs_empty(const char *path);

#endif
