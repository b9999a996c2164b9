/*
 * meta_dump: a volume's whole metadata as a portable stream, and a new
 * volume made from one (`ferry dump`, `ferry load`). The stream is JSON
 * lines, one record per row, described in README.md ("Moving a volume's
 * metadata"): a header, then each table's rows in a fixed order, then an
 * end record that counts them, so a stream cut short is refused.
 *
 * Both work row by row (memory does not grow with the volume). The caller
 * owns the FILE; these own nothing they do not free.
 */
#ifndef FERRY_META_DUMP_H
#define FERRY_META_DUMP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

struct meta;

/* The stream's own version (the header's "ferry_dump"). */
#define META_DUMP_VERSION 1

/*
 * Writes the volume at loc (a SQLite path or a PostgreSQL URL) to out.
 * Refuses a volume a ferry-mountd has mounted (-EBUSY, naming it in err):
 * on SQLite, its lock, and the journal is replayed first (a daemon killed
 * before it committed), so the dump has every change that returned; on
 * PostgreSQL, its lease, which the dump holds for its length (a lease that
 * ran out without a release is refused too: its node's journal may hold
 * changes). *records: how many records were written (may be NULL).
 * Returns 0 or -errno, with the reason in err.
 */
int meta_dump(const char *loc, FILE *out, uint64_t *records, char *err, size_t errlen);

/*
 * Makes a new volume at loc (which must not exist) from the stream in.
 * Every record is checked (known table, known columns, types) and the
 * result must be a file system (the root a directory, every entry's parent
 * a directory and its inode present); anything else is refused with the
 * line number in err, and nothing is left at loc. Returns 0 or -errno.
 */
int meta_load(FILE *in, const char *loc, uint64_t *records, char *err, size_t errlen);

/* ---- checkpoints (ferry checkpoint, ferry restore, ferry gc) ----
 *
 * A checkpoint is a dump of a mounted volume taken at one instant, and a
 * row per slice it names (checkpoint_slice), which gc keeps (the engine's
 * gc list skips them; ferry gc counts them as referenced) until the
 * checkpoint is dropped. The dump itself is stored with the objects by
 * the caller (checkpoint_store.h).
 */
#define META_CHECKPOINT_NAME_MAX 64
struct meta_checkpoint {
	char name[META_CHECKPOINT_NAME_MAX + 1];
	int64_t taken_ms; /* wall clock, ms since the epoch */
	uint64_t slices, bytes;
};
/* 1 to 64 of A-Z a-z 0-9 . _ -, not starting with . or -: an object key's
 * part on every store. */
bool meta_checkpoint_name_ok(const char *name);
/*
 * Takes checkpoint name of m (open by its mounted daemon): in one write
 * transaction that keeps every other writer of slices out (the fence:
 * *pause_ms is how long it held them), a snapshot is begun and the slices
 * it sees are recorded as the checkpoint's; then the snapshot is written
 * to out as a dump (meta_dump's format) while writers go on;
 * snapshot_begun(arg) (if not NULL) is called once the snapshot is taken,
 * before the dump, on this thread. *cp gets the
 * checkpoint's row. -EEXIST if the name is taken. On failure nothing is
 * kept.
 */
int meta_checkpoint_take(struct meta *m, const char *name, FILE *out, struct meta_checkpoint *cp,
			 uint64_t *records, double *pause_ms, void (*snapshot_begun)(void *arg),
			 void *arg, char *err, size_t errlen);
/* Drops checkpoint name's rows: its slices may be collected. -ENOENT. */
int meta_checkpoint_drop(struct meta *m, const char *name, char *err, size_t errlen);
/* Calls cb for each checkpoint, oldest first; with name, only that one
 * (-ENOENT if none), and with cb NULL it is copied to *(struct
 * meta_checkpoint *)arg. */
int meta_checkpoint_list(struct meta *m, const char *name,
			 int (*cb)(const struct meta_checkpoint *cp, void *arg), void *arg,
			 char *err, size_t errlen);

/*
 * Slice ids of one volume's own objects lie in [base, base + 2^40): 0 for
 * a volume that was formatted, a random multiple of 2^40 for one restored
 * from a checkpoint, which shares the origin's objects (ids below its base
 * or past its range are the origin's: never deleted by it).
 */
#define META_SLICE_RANGE_BITS 40
int meta_slice_range_base(struct meta *m, uint64_t *base);
bool meta_slice_id_ours(uint64_t base, uint64_t id);

/* What gc must keep: every slice id a live file, a checkpoint or a slice
 * freed after freed_after_s (wall clock, gc_slice.since) names, sorted;
 * ids is the caller's to free. */
struct meta_kept {
	uint64_t *ids;
	size_t n;
	uint64_t base, next_slice;
};
int meta_slices_kept(struct meta *m, int64_t freed_after_s, struct meta_kept *k, char *err,
		     size_t errlen);
bool meta_kept_has(const struct meta_kept *k, uint64_t id);
/* Forgets freed slices (gc_slice) freed at or before freed_before_s that
 * no checkpoint keeps: their objects are gone. */
int meta_gc_forget_freed(struct meta *m, int64_t freed_before_s);

/* After meta_load of a checkpoint at loc: the new volume takes uuid, drops
 * the origin's checkpoints and garbage, and allocates slice ids from base. */
int meta_restore_adopt(const char *loc, const char *uuid, uint64_t base, char *err,
		       size_t errlen);

/* A volume opened for a tool and held as meta_dump holds it (no daemon
 * mounts it meanwhile): -EBUSY while one has it. meta_hold_close closes m
 * too. */
struct meta_hold;
int meta_hold_open(const char *loc, struct meta **m, struct meta_hold **h, char *err,
		   size_t errlen);
void meta_hold_close(struct meta *m, struct meta_hold *h);

#endif
