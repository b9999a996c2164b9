/*
 * dirs: making a directory with its missing parents (mkdir -p), emptying
 * one, and replacing a small file in one durably.
 */
#ifndef FERRY_DIRS_H
#define FERRY_DIRS_H

#include <sys/types.h>

/* Makes path and any missing parent with mode (existing ones are left as
 * they are). Returns 0 or a negative errno. */
int dirs_make(const char *path, mode_t mode);
/* Makes the missing parent directories of path, relative to dfd, with
 * mode (path's last component is left alone). 0 or a negative errno. */
int dirs_make_parents_at(int dfd, const char *path, mode_t mode);
/* Removes everything under the directory open as dfd that is on its own
 * filesystem (what is mounted inside stays, and so does its mount point),
 * leaving the directory itself and its entry named keep (NULL: none).
 * Nothing is followed: names are taken relative to their directory's fd.
 * 0 or the first error met (the rest is still removed where it can be). */
int dirs_empty_at(int dfd, const char *keep);
/* Makes name, in the directory open as dfd, hold the len bytes at buf, all
 * or nothing across a crash or a power loss: written as name.tmp, flushed,
 * renamed over name, the directory flushed. 0 or a negative errno (the
 * temporary file is removed; name is as it was, or already the new file if
 * only the directory's flush failed). */
int dirs_replace_file_at(int dfd, const char *name, const void *buf, size_t len);

#endif
