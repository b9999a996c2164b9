/*
 * meta_names: the names of directories whose every entry this process
 * knows, so that a lookup of a name that is not there needs no database
 * round trip (a create's LOOKUP first asks for the name it is about to
 * make). Only for the volume's one writer: a directory counts as known
 * from its mkdir in this process on, and each create, link, unlink, rmdir
 * and rename that succeeds here keeps it known.
 *
 * Entries are kept as 64-bit hashes of (directory, name) with a count each.
 * A name that is there is always counted, so a hash that is not counted is
 * a name that is not there; a hash that is counted may still be another
 * name's (a collision, or a stale count), and then the database is asked.
 * Counting more than is there only costs a query, never a wrong answer,
 * which is why nothing has to be undone when a change fails.
 *
 * Ownership: the set owns its tables; callers pass names they keep.
 * Thread-safe (one mutex).
 */
#ifndef FERRY_META_NAMES_H
#define FERRY_META_NAMES_H

#include <stddef.h>
#include <stdint.h>

struct meta_names;

struct meta_names_stats {
	uint64_t dirs, names; /* directories known, names counted */
	uint64_t absent;      /* lookups answered without the database */
	uint64_t resets;      /* times the set outgrew its bound and started over */
	uint64_t scans;       /* directories learnt from a whole listing */
};

/* max_names bounds the names counted (16 bytes each, at most half full):
 * past it the set forgets everything and starts over. */
int meta_names_new(size_t max_names, struct meta_names **out);
void meta_names_free(struct meta_names *s); /* accepts NULL */

/* Every directory unknown again (what was acknowledged may not be what the
 * database holds). */
void meta_names_forget(struct meta_names *s);
/* dir was just made here: it has no entry. */
void meta_names_dir_made(struct meta_names *s, uint64_t dir);
/* dir is gone (rmdir, replaced by a rename): no longer known. */
void meta_names_dir_gone(struct meta_names *s, uint64_t dir);
/* An entry parent/name was made, or removed. */
void meta_names_add(struct meta_names *s, uint64_t parent, const char *name, size_t nlen);
void meta_names_del(struct meta_names *s, uint64_t parent, const char *name, size_t nlen);
/* The database has parent/name (a change that makes it found it taken): if
 * it was not counted, parent is no longer known. */
void meta_names_taken(struct meta_names *s, uint64_t parent, const char *name, size_t nlen);
/* 1 if parent is known and has no entry name; 0 if the database must say. */
int meta_names_absent(struct meta_names *s, uint64_t parent, const char *name, size_t nlen);
/* A listing of dir: a part that starts after cookie after (0: the start)
 * is read; each name it hands out, with its cookie, in order; the part
 * reached the end of dir after the cookie after. A listing read whole in
 * order, with no name changed meanwhile, makes dir known. */
void meta_names_scan(struct meta_names *s, uint64_t dir, uint64_t after);
void meta_names_scan_name(struct meta_names *s, uint64_t dir, const char *name, size_t nlen,
			  uint64_t cookie);
void meta_names_scan_end(struct meta_names *s, uint64_t dir, uint64_t after);
void meta_names_stats_get(struct meta_names *s, struct meta_names_stats *out);

#endif
