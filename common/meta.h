/*
 * meta: the metadata engine interface. A volume's metadata (the volume record,
 * inodes, directory entries, symlinks, xattrs, and each file's chunks of
 * slices) lives behind these calls; SQLite in WAL mode is the embedded engine
 * (meta_sqlite.c) and PostgreSQL the shared one (meta_pg.c: a location of
 * postgresql://...?volume=NAME), under rules written once for every engine
 * (meta_rules.c, meta_batch.c; see meta_db.h).
 *
 * Every call returns 0 or a negative errno and is safe from many threads at
 * once on one struct meta (the SQLite engine keeps one connection per
 * thread). Each mutating call is one transaction: it happens whole or not at
 * all. Names are single path components (no '/', not "." or ".."), at most
 * META_NAME_MAX bytes. Out-parameters that are pointers are malloc'ed and
 * owned by the caller.
 *
 * Timestamps are nanosecond-precise, taken by the engine (CLOCK_REALTIME)
 * unless given. Errors: -ENOENT no such inode/entry, -EEXIST, -ENOTDIR,
 * -EISDIR, -ENOTEMPTY, -EINVAL, -EPERM, -ENODATA (xattr), -ERANGE,
 * -ENAMETOOLONG, -EIO (the database failed or a row is damaged).
 */
#ifndef FERRY_META_H
#define FERRY_META_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

/* The version of the metadata schema ferry format writes and meta_open
 * accepts (a volume of another is refused). */
#define META_SCHEMA_VERSION 1
#define META_ROOT_INO 1
#define META_NAME_MAX 255
#define META_CHUNK_SIZE (64u << 20)
#define META_DEFAULT_BLOCK_SIZE (4u << 20)
#define META_XATTR_NAME_MAX 255
#define META_XATTR_SIZE_MAX 65536

struct meta;

struct meta_volume {
	char uuid[37];
	uint32_t block_size;  /* bytes per object, at most META_CHUNK_SIZE */
	char *storage_url;    /* owned; freed by meta_volume_free() */
	int64_t created_at;   /* seconds since the epoch */
	int s3_http;          /* the storage URL is plain HTTP */
};
void meta_volume_free(struct meta_volume *v);

struct meta_attr {
	uint64_t ino;
	uint32_t mode;   /* type and permission bits */
	uint32_t uid, gid;
	uint64_t rdev;
	uint32_t nlink;
	uint64_t size;
	struct timespec atime, mtime, ctime;
};

/* One slice piece of a chunk: bytes [off, off+len) of slice id appear at
 * [pos, pos+len) of the chunk. size is the slice's whole length (it names the
 * slice's objects). id 0 is a run of zeros (truncate, punch hole). */
struct meta_slice {
	uint64_t id;
	uint32_t size;
	uint32_t off;
	uint32_t pos;
	uint32_t len;
};

struct meta_chunk_slice {
	uint32_t chunk;        /* chunk index: file offset / META_CHUNK_SIZE */
	struct meta_slice s;
};

/* Creates a volume's database. -EEXIST if one is there and !force (force
 * replaces it). Creates the root directory owned by root_uid/root_gid. */
int meta_format(const char *db_path, const struct meta_volume *v, uint32_t root_uid,
		uint32_t root_gid, int force);
/* Opens an existing volume: -ENOENT if there is none, -EIO if the file is
 * not a ferryfs volume (or of an unknown schema version); with PostgreSQL
 * also -EINVAL (a URL that names no volume, or holds a password),
 * -ECONNREFUSED (no server) and -EACCES (the server refused the role,
 * password or database). */
int meta_open(const char *db_path, struct meta **out);
void meta_close(struct meta *m); /* accepts NULL */
int meta_volume_get(struct meta *m, struct meta_volume *out);

/* Batched mode (for the FUSE daemon and the reconciler): a commit is
 * durable against a killed process at once, and against a power loss only
 * after the next meta_sync() (fsync, fsyncdir) or a checkpoint; unbatched
 * (the default) syncs every commit. Batched mode also moves WAL checkpoints
 * (page copies and their fsyncs) from the committing thread to a thread of
 * the meta's own, stopped by meta_close(). Set it right after meta_open();
 * returns 0 or a negative errno (the thread could not start). */
int meta_set_batched(struct meta *m, int batched);
/*
 * Garbage: slices no file refers to any more (deleted or truncated files,
 * and data that later writes hid wholly, dropped at commit). Their objects
 * may be deleted once they have been garbage for a while, so readers that
 * resolved a file just before still find what they resolved.
 */
struct meta_gc_item {
	uint64_t id;
	uint32_t size;
};
/*
 * The wall clock that stamps a slice when it becomes garbage may jump, so
 * its collector also watches it on a clock that does not: meta_gc_mark()
 * stamps every garbage slice not stamped yet with mark, a number that grows
 * from one call to the next (and from one collector to the next: start
 * above meta_gc_last_mark()), and the caller notes when it made each mark.
 * A slice stamped with mark k was garbage when k was made.
 */
int meta_gc_mark(struct meta *m, int64_t mark);
/* The highest mark a garbage slice carries (0: none). */
int meta_gc_last_mark(struct meta *m, int64_t *mark);
/* Up to max slices stamped with a mark at or below `mark` that became
 * garbage at or before `before` (unix time) by their own stamp as well,
 * in the order they were stamped: *out (malloc'ed, the caller frees) and
 * *n. */
int meta_gc_list(struct meta *m, int64_t mark, int64_t before, size_t max,
		 struct meta_gc_item **out, size_t *n);
/* Forgets them: their objects are gone. */
int meta_gc_forget(struct meta *m, const struct meta_gc_item *items, size_t n);
/* How many slices, and how many bytes, wait as garbage. */
int meta_gc_pending(struct meta *m, uint64_t *slices, uint64_t *bytes);

/* For tests: the checkpointer thread skips its work, so that the WAL's
 * bound is shown to hold without it; and how many times a commit had to
 * checkpoint itself to keep that bound. */
void meta_ckpt_pause(struct meta *m, int paused);
uint64_t meta_ckpt_inline(struct meta *m);
/* Makes every commit made so far durable (no-op when unbatched); with
 * deferred commits, commits the open batch first. */
int meta_sync(struct meta *m);

/*
 * Deferred commits, for the volume's one writing daemon (its namespace
 * operations then cost no commit each). From this call on, this struct
 * meta's namespace changes (meta_create, _link, _unlink, _rmdir, _rename,
 * _setattr, _setxattr, _removexattr, _inode_release) are made inside one
 * open transaction, the batch, and each is appended as a record to the
 * journal at journal_path (a local file) before the call returns. The batch
 * commits every flush_ms milliseconds, at meta_flush(), meta_sync() and
 * meta_close(), and with any other change made through this meta (slice
 * ids, data commits, ...), which therefore never returns before the changes
 * that came ahead of it are committed. This meta's reads see the batch at
 * once; other connections and processes see it at its commit, and their
 * writes wait for it: on SQLite it commits as soon as this meta's next
 * change sees one waiting (the intent lock), or within a few milliseconds
 * when no change comes; on PostgreSQL (no such signal) at flush_ms.
 *
 * A killed process loses nothing that returned: the next meta_journal_open()
 * replays the records past the last one the database holds (*replayed: how
 * many, may be NULL) and commits them before it returns. Against a power
 * loss, as before: durable after meta_sync(). Implies meta_set_batched().
 * Returns 0, -EBUSY if another process has the journal open, or an error.
 */
int meta_journal_open(struct meta *m, const char *journal_path, int flush_ms,
		      uint64_t *replayed);
/* Where a volume's journal goes: its database's path and this. meta_format()
 * with force removes it with the old database. */
#define META_JOURNAL_SUFFIX "-changes"
/* The seq of the last change journaled (0: none, or no deferral). A
 * commit item with this meta_seq commits only once the database holds the
 * journal up to it (else -EINPROGRESS). */
uint64_t meta_journal_last(struct meta *m);
/* Commits the open batch now (no-op without one, or without deferral). */
int meta_flush(struct meta *m);
struct meta_journal_stats {
	uint64_t records;         /* changes journaled */
	uint64_t batches;         /* batches committed */
	uint64_t replayed;        /* records replayed at open or after a failed commit */
	uint64_t replay_errors;   /* replayed records the database refused */
	uint64_t commit_failures; /* batch commits that failed (then replayed) */
	/* changes run again because the batch failed under them (an earlier
	 * change's write, answered late, failed) */
	uint64_t changes_retried;
	uint64_t pending;         /* records journaled and not yet committed */
	uint64_t released;        /* inodes freed by batches (meta_inode_release_later) */
	uint64_t release_failures; /* of those, left as orphans by a failure */
};
void meta_journal_stats_get(struct meta *m, struct meta_journal_stats *out);

/* m is the volume's only writer of names (ferry-mountd holding the volume):
 * from now on a lookup of a name absent from a directory this handle made
 * is answered without the database (meta_names.h); max_names bounds the
 * memory (16 bytes a name, twice over). -EINVAL if already on. */
int meta_names_keep(struct meta *m, size_t max_names);
struct meta_names_stats;
void meta_names_stats(struct meta *m, struct meta_names_stats *out);

int meta_getattr(struct meta *m, uint64_t ino, struct meta_attr *out);
int meta_lookup(struct meta *m, uint64_t parent, const char *name, struct meta_attr *out);

/* Which fields meta_setattr() changes. */
#define META_SET_MODE      (1u << 0)
#define META_SET_UID       (1u << 1)
#define META_SET_GID       (1u << 2)
#define META_SET_SIZE      (1u << 3)
#define META_SET_ATIME     (1u << 4)
#define META_SET_MTIME     (1u << 5)
#define META_SET_ATIME_NOW (1u << 6)
#define META_SET_MTIME_NOW (1u << 7)
#define META_SET_CTIME     (1u << 8)
/* Changes the fields in valid (taking values from in) and sets ctime to now
 * unless META_SET_CTIME gives one. A size change on a regular file truncates
 * or extends it: bytes past the old end read as zeros afterwards. Returns the
 * new attributes in out. -EISDIR for a size change on a directory. */
int meta_setattr(struct meta *m, uint64_t ino, unsigned valid, const struct meta_attr *in,
		 struct meta_attr *out);

/* Creates parent/name: any type of mode (S_IFREG, S_IFDIR, S_IFLNK with
 * target, S_IFIFO, S_IFSOCK, S_IFCHR/S_IFBLK with rdev). The owner is
 * uid/gid, except that under a setgid directory the gid is the parent's and a
 * new directory inherits S_ISGID. Updates the parent's mtime/ctime (and nlink
 * for a directory). -EEXIST if the name is taken. */
int meta_create(struct meta *m, uint64_t parent, const char *name, uint32_t mode, uint32_t uid,
		uint32_t gid, uint64_t rdev, const char *target, struct meta_attr *out);
/* Adds newparent/newname for ino (not a directory: -EPERM). */
int meta_link(struct meta *m, uint64_t ino, uint64_t newparent, const char *newname,
	      struct meta_attr *out);
/* Removes a non-directory entry; *victim gets its attributes afterwards
 * (nlink 0 means the inode is now unlinked: it lives on, listed as an
 * orphan, until meta_inode_release()). -EISDIR for a directory. */
int meta_unlink(struct meta *m, uint64_t parent, const char *name, struct meta_attr *victim);
/* Removes an empty directory. -ENOTDIR, -ENOTEMPTY. */
int meta_rmdir(struct meta *m, uint64_t parent, const char *name, struct meta_attr *victim);

#define META_RENAME_NOREPLACE (1u << 0)
#define META_RENAME_EXCHANGE  (1u << 1)
/* rename(2) semantics with RENAME_NOREPLACE / RENAME_EXCHANGE. If an entry
 * was replaced, *replaced gets its attributes afterwards (ino 0 if none). */
int meta_rename(struct meta *m, uint64_t parent, const char *name, uint64_t newparent,
		const char *newname, unsigned flags, struct meta_attr *replaced);
int meta_readlink(struct meta *m, uint64_t ino, char **target);

/* Lists a directory in a stable order: every entry has a cookie > 0 that
 * never changes while the entry lives, and entries come in cookie order, so a
 * listing resumed "after cookie c" is correct across concurrent creates and
 * deletes. Calls cb for each entry with cookie > after; attr is filled only
 * when plus is set (readdirplus), otherwise just ino and mode. cb returning
 * non-zero stops the listing (not an error). */
typedef int (*meta_readdir_cb)(void *arg, const char *name, const struct meta_attr *attr,
			       uint64_t cookie);
int meta_readdir(struct meta *m, uint64_t ino, uint64_t after, int plus, meta_readdir_cb cb,
		 void *arg);

#define META_XATTR_CREATE  1  /* same values as XATTR_CREATE / XATTR_REPLACE */
#define META_XATTR_REPLACE 2
int meta_setxattr(struct meta *m, uint64_t ino, const char *name, const void *value,
		  size_t size, int flags);
int meta_getxattr(struct meta *m, uint64_t ino, const char *name, void **value, size_t *size);
/* *list: the names, each NUL-terminated, back to back; *size its length. */
int meta_listxattr(struct meta *m, uint64_t ino, char **list, size_t *size);
int meta_removexattr(struct meta *m, uint64_t ino, const char *name);

int meta_statfs(struct meta *m, uint64_t *used_bytes, uint64_t *used_inodes);

/* The slices of one chunk, oldest first (later ones cover earlier ones).
 * *out is NULL and *n 0 for a chunk never written. */
int meta_chunk_slices(struct meta *m, uint64_t ino, uint32_t chunk, struct meta_slice **out,
		      size_t *n);
/* Reserves count consecutive slice ids, the first in *first (ids start at 1). */
int meta_slice_id_alloc(struct meta *m, uint32_t count, uint64_t *first);
/* Commits a write in one transaction: appends the slices (in the given
 * order, after every existing one) and sets the file's size to new_size and
 * its mtime/ctime to mtime (now if NULL). */
int meta_write_commit(struct meta *m, uint64_t ino, const struct meta_chunk_slice *slices,
		      size_t n, uint64_t new_size, const struct timespec *mtime,
		      struct meta_attr *out);
/* meta_write_commit() for reconcile job seq (1 .. INT64_MAX) of ino: in the
 * same transaction, commits only if seq is above the last seq committed for
 * ino, and then records seq. Otherwise returns -EALREADY and changes
 * nothing, so a job replayed after a crash, or an older job arriving after a
 * newer one, never overwrites newer data. */
int meta_write_commit_seq(struct meta *m, uint64_t ino, uint64_t seq,
			  const struct meta_chunk_slice *slices, size_t n, uint64_t new_size,
			  const struct timespec *mtime, struct meta_attr *out);
/* One reconcile job's commit in meta_write_commit_batch(). */
struct meta_commit_item {
	uint64_t ino, seq;
	const struct meta_chunk_slice *slices; /* the caller's */
	size_t n;
	uint64_t new_size;
	const struct timespec *mtime;          /* NULL: now */
	uint64_t meta_seq;                     /* wait for the journal's seq (0: no) */
	int rc;                                /* out: as meta_write_commit_seq() */
	struct meta_attr out;                  /* out, when rc is 0 */
};
/* meta_write_commit_seq() for n jobs in one transaction, so a burst of
 * small files costs one commit (and one meta_sync()) rather than n. An item
 * refused before it changed anything (-EALREADY, -ENOENT, -EISDIR, -EINVAL)
 * fails alone; any other error rolls the whole batch back, and is then
 * every item's rc and the return value. An item's -EINPROGRESS: its
 * meta_seq is past what the database holds of the journal: the changes it
 * depends on sit in a deferring daemon's journal (the daemon died before
 * its batch committed, and replays it at its next start); try again later. */
int meta_write_commit_batch(struct meta *m, struct meta_commit_item *items, size_t n);
/* Raises the last seq committed for ino to at least seq (a no-op if it is
 * higher), so no reconcile job of ino numbered seq or below commits after
 * this: for a staging file whose bytes are committed, or no longer the
 * file's, but which could not be removed (a read-only staging disk), and
 * whose journal record or name would otherwise replay it at the next start
 * over newer data. */
int meta_seq_floor(struct meta *m, uint64_t ino, uint64_t seq);
/* A new epoch for this volume's reconcile seqs (1, 2, ...; durable): a
 * daemon takes one at start and numbers its jobs epoch << 32 | n, so seqs
 * keep increasing across restarts whatever the clock does. */
int meta_seq_epoch(struct meta *m, uint64_t *epoch);
/* Zeroes [off, off+len) of a regular file without changing its size
 * (fallocate punch hole). */
int meta_punch_hole(struct meta *m, uint64_t ino, uint64_t off, uint64_t len,
		    struct meta_attr *out);

/*
 * The writer's lease: one read-write mount of a volume at a time, on any
 * node. A holder (a free-form line naming host, pid and mount) holds it
 * until expires_ms, on the database's own clock, and renews it; each take
 * raises the epoch. Not part of a dump.
 */
#define META_LEASE_HOLDER_MAX 255
struct meta_lease {
	char holder[META_LEASE_HOLDER_MAX + 1]; /* "" when free (released) */
	int64_t expires_ms; /* ms since the epoch, the database's clock */
	int64_t now_ms;     /* the database's clock when it was read */
	uint64_t epoch;     /* 0: never taken */
};
int meta_lease_get(struct meta *m, struct meta_lease *out);
/* Takes the lease for holder, for ttl_ms from now: a free one at once; one
 * whose holder let it expire (it died with its node) only with takeover;
 * one still at epoch mine (!= 0), an epoch the caller's node held and whose
 * daemon it knows dead (its local lock), at once; -EBUSY otherwise, with
 * the lease as it stands in *cur (may be NULL). Then fences m to the new
 * epoch (meta_lease_fence). */
int meta_lease_take(struct meta *m, const char *holder, int64_t ttl_ms, int takeover,
		    uint64_t mine, struct meta_lease *cur);
/* Extends m's lease to ttl_ms from now; -EROFS if another took it. */
int meta_lease_renew(struct meta *m, int64_t ttl_ms);
/* Frees m's lease (a clean unmount); a no-op if another took it. */
int meta_lease_release(struct meta *m);
/* From now on every write transaction through m checks, inside itself,
 * that the lease's epoch is still epoch, and fails with -EROFS changing
 * nothing if it is not: a holder that comes back after a takeover (and
 * its reconciler, fenced to its mount's epoch) changes nothing. 0: no
 * check. */
void meta_lease_fence(struct meta *m, uint64_t epoch);
uint64_t meta_lease_fenced_to(struct meta *m);
/* Connections made again after the database hung up (PostgreSQL). */
uint64_t meta_reconnects(struct meta *m);
/* Statements this meta ran, and exchanges with a database server (0 for
 * SQLite, which runs in the process). */
void meta_counters(struct meta *m, uint64_t *statements, uint64_t *round_trips);
/* Statements the calling thread ran, in any meta: what one call cost,
 * without the batch thread's commits that meta_counters also counts. */
uint64_t meta_thread_statements(void);

/* Frees an unlinked inode (nlink 0) once nothing holds it open: removes it,
 * its slices and xattrs; the slices' objects are recorded for gc. A linked
 * inode is left alone (returns 0). */
int meta_inode_release(struct meta *m, uint64_t ino);
/* The same, for a daemon whose changes go in batches (meta_journal_open):
 * the inode is freed in the next batch, before it commits (meta_flush and
 * meta_close commit it too). Nobody waits for it: a freeing that fails is
 * logged, and the inode stays an orphan until a later start frees it.
 * Without a journal it is meta_inode_release(). */
int meta_inode_release_later(struct meta *m, uint64_t ino);
/* Inodes queued by meta_inode_release_later() and not yet taken by a batch. */
uint64_t meta_releases_pending(struct meta *m);
/* At mount: frees every orphan left by a crash (nothing can hold them open). */
int meta_orphans_purge(struct meta *m, uint64_t *count);

#endif
