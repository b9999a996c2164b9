/*
 * staging_owner: which volume a staging directory belongs to.
 *
 * Staging files and their journal records are named by inode and sequence
 * only, so a directory given to two volumes has each daemon take the
 * other's leftovers for its own at start: committed into the wrong file,
 * or dropped as stale (a write that returned, lost). The first daemon to
 * use a directory records its volume's uuid there (STAGING_OWNER_NAME);
 * every later one, ferry-mountd's and ferry-reconciler's, checks it before
 * it looks at anything else in the directory.
 */
#ifndef FERRY_STAGING_OWNER_H
#define FERRY_STAGING_OWNER_H

#include <errno.h>
#include <stddef.h>

#define STAGING_OWNER_NAME ".volume"

/*
 * 0: the directory dirfd is volume uuid's (now, if it was nobody's: the
 * record is written durably, and of two daemons claiming at once one
 * wins). -EEXIST: it is another volume's, whose uuid goes into other.
 * -EBADMSG: the record names no volume (other gets what it holds, cut
 * short). Another -errno: it cannot be read or written.
 */
int staging_owner_claim(int dirfd, const char *uuid, char *other, size_t otherlen);
/* Whether a claim's error only says the record could not be written
 * there (a full or read-only filesystem, or one without hard links): the
 * directory is then used unrecorded, as before there were records. */
static inline int staging_owner_unwritable(int rc)
{
	return rc == -ENOSPC || rc == -EDQUOT || rc == -EROFS || rc == -EPERM ||
	       rc == -EXDEV || rc == -EOPNOTSUPP;
}
/* The uuid the record names into uuid (len bytes; "" where none): 0,
 * -ENOENT (no record), -EBADMSG (it names no volume: what it holds, made
 * printable), or another -errno. Claims nothing. */
int staging_owner_get(int dirfd, char *uuid, size_t len);
/* Removes the record, durably: for the one who moved the volume's files
 * out of the directory (mountd/lease.c). 0 or -errno. */
int staging_owner_drop(int dirfd);

#endif
