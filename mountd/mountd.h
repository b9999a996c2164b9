/*
 * ferry-mountd: the unprivileged FUSE daemon of one volume.
 *
 * Who owns what:
 *  - struct mountd (one, in main.c) owns the session, the metadata engine,
 *    the object store, the inode table, the handle table and the read cache.
 *  - struct inode (inode_table.c) is owned by the table; it lives while the
 *    kernel holds lookups on it or a handle has it open (references).
 *  - struct open_file (fuse_ops.c) is owned by the handle table slot from
 *    OPEN to RELEASE; it holds one reference on its inode.
 *  - struct wstate (write_back.c) is owned by its inode: the staging file
 *    and dirty ranges of writes not yet committed to the object store.
 *
 * Prototypes are grouped by the file that defines them.
 */
#ifndef FERRY_MOUNTD_H
#define FERRY_MOUNTD_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>

#include <fuse_lowlevel.h>

#include "boot.h"
#include "broker_client.h"
#include "clock.h"
#include "handle_table.h"
#include "handover_blob.h"
#include "meta.h"
#include "objstore.h"
#include "reconcile_job.h"

struct mountd;
struct inode;

/* The read-only statistics file in the root; never a database inode. */
#define STATS_NAME ".stats"
#define STATS_INO  0xfffffffffffff001ull
/* The owner's control file in the root (special.c); never a database inode. */
#define CONTROL_NAME ".control"
#define CONTROL_INO  0xfffffffffffff002ull
/* Staging files of passthrough opens end in this: they hold whole files. */
#define STAGING_PT_SUFFIX ".p"
/* ... or in STAGING_COPY_SUFFIX (reconcile_job.h) and a boot tag. */
/* The journal record close() leaves for a daemon-path staging file. */
#define STAGING_FLUSH_SUFFIX ".fj"

/* ---- stats.c: per-opcode request counts and gauges ---- */
enum op_id {
	OP_LOOKUP, OP_FORGET, OP_GETATTR, OP_SETATTR, OP_READLINK, OP_MKNOD, OP_MKDIR,
	OP_UNLINK, OP_RMDIR, OP_SYMLINK, OP_RENAME, OP_LINK, OP_OPEN, OP_READ, OP_WRITE,
	OP_FLUSH, OP_RELEASE, OP_FSYNC, OP_OPENDIR, OP_READDIR, OP_RELEASEDIR, OP_FSYNCDIR,
	OP_STATFS, OP_SETXATTR, OP_GETXATTR, OP_LISTXATTR, OP_REMOVEXATTR, OP_ACCESS,
	OP_CREATE, OP_FALLOCATE, OP_READDIRPLUS, OP_LSEEK, OP_INTERRUPT_EINTR,
	OP_COUNT
};

struct stats {
	_Atomic uint64_t requests[OP_COUNT];
	_Atomic uint64_t uring_requests; /* of those, the ones that came over io_uring */
	_Atomic uint64_t bytes_read, bytes_written;
	_Atomic uint64_t objects_put, objects_get, bytes_uploaded, bytes_downloaded;
	_Atomic uint64_t cache_hits, cache_misses;
	_Atomic uint64_t cache_dropped; /* cache files found damaged, fetched again */
	_Atomic uint64_t cache_seeded;  /* objects the reconciler's uploads put in the cache */
	_Atomic uint64_t uploads_drop_asked; /* drops sent (rclient_drop) */
	_Atomic uint64_t commits, commit_failures;
	_Atomic uint64_t io_errors;
	_Atomic uint64_t passthrough_opens, backing_open, backing_close;
	_Atomic uint64_t broker_relinks;     /* reconnections to ferry-brokerd */
	_Atomic uint64_t blocks_unchanged;   /* passthrough commits that skipped a block */
	_Atomic uint64_t passthrough_no_room; /* opens refused passthrough for staging space */
	/* staging_pool.c: opens served from the pool, those that found it
	 * empty (and made their own file), files the filler failed to make */
	_Atomic uint64_t staging_pool_hits, staging_pool_misses, staging_pool_failures;
	_Atomic uint64_t staging_pool_returns; /* untouched files given back at close */
	_Atomic uint64_t copy_ups, copy_up_bytes; /* non-empty files brought into staging at open */
	_Atomic uint64_t copy_up_too_big, copy_up_failures;
	_Atomic uint64_t copy_ups_from_staging; /* of copy_ups: from the last job's staging file */
	_Atomic uint64_t staging_copies_set_aside; /* copies of an earlier boot, never flushed */
	/* local_copy.c: passthrough opens of readers on a local copy, writers
	 * that took a local copy over as their staging file, copies made,
	 * dropped (stale, evicted, forgotten) and not made (no room). */
	_Atomic uint64_t local_copy_opens, local_copy_takeovers;
	_Atomic uint64_t local_copies_made, local_copies_dropped, local_copies_skipped;
	_Atomic uint64_t local_copies_handed_over; /* taken from the daemon before (upgrade) */
	_Atomic uint64_t local_copies_restored; /* taken up from the last run's list (unmount) */
	_Atomic uint64_t local_copies_built; /* of files read whole (copy_build.c) */
	_Atomic uint64_t local_copy_builds_given_up; /* changed meanwhile, no room, an error */
	_Atomic uint64_t writeback_bypassed; /* writers given direct I/O: staging space low */
	_Atomic uint64_t handoffs, handoff_failures, handoff_stalls, reopen_waits;
	/* Closes that found no room for their hand-off while this daemon was
	 * short of fds: their files went to the retry list, fd closed. */
	_Atomic uint64_t handoff_fd_scarce;
	_Atomic uint64_t reconciler_restarts;
	/* Reconciler commits that dropped the kernel's cache of the inode, and
	 * those that did not need to (it already held what the commit made). */
	_Atomic uint64_t commit_invalidations, commit_invalidations_skipped;
	_Atomic uint64_t releasing; /* RELEASEs being handled (open_handles) */
	/* Staging files of jobs in flight opened for readers (they did not wait). */
	_Atomic uint64_t inflight_reads;
	_Atomic uint64_t spliced_reads; /* READ replies spliced from cache files */
	/* Sizes and chunk layouts READs found in layout_cache.c, and those
	 * that went to the database. */
	_Atomic uint64_t layout_hits, layout_misses;
	_Atomic uint64_t prefetch_queued, prefetch_fetched, prefetch_failed, prefetch_dropped;
	_Atomic uint64_t prefetch_cached; /* cached objects read ahead from their files */
	_Atomic uint64_t mapped_after_close; /* hand-offs held back for a live mapping */
	_Atomic uint64_t release_probes_deferred; /* lease probe still refused after the settle loop */
	_Atomic uint64_t gc_rounds, gc_objects_deleted, gc_bytes_freed;
	_Atomic uint64_t staging_adopted; /* staging files a dead daemon's opens held */
};

const char *stats_op_name(enum op_id op);
/* Renders the whole .stats text into a malloc'ed buffer the caller owns. */
int stats_render(struct mountd *md, char **out, size_t *len);

/* ---- read_cache.c: local copies of immutable objects ---- */
struct read_cache;
/* dir is created if missing; limit_bytes bounds its size (least recently
 * used files go first); the files already there are indexed, and each is
 * checked (its trailer) before its first use. */
int read_cache_open(const char *dir, uint64_t limit_bytes, struct read_cache **out);
void read_cache_close(struct read_cache *c);
/* Reads [off, off+len) of the object key, whose full size is objsize, from
 * the cache or else the store (caching the whole object). Returns len or a
 * negative errno (-ENOENT for a missing object, -EBADMSG for a
 * damaged one, another errno from the store). */
ssize_t read_cache_read(struct read_cache *c, struct objstore *s, struct stats *st,
			const char *key, uint32_t objsize, uint32_t off, void *buf, uint32_t len);
/* Is key cached whole? */
bool read_cache_has(struct read_cache *c, const char *key, uint32_t objsize);
/* Has the kernel start reading key's cache file into the page cache (for
 * a sequential reader about to reach it); false if it is not cached. */
bool read_cache_willneed(struct read_cache *c, struct stats *st, const char *key,
			 uint32_t objsize);
/* Lets the page cache go of key's cache file (its bytes are read from
 * elsewhere now: a local copy), if its fd is kept open; not a use of it
 * (the LRU order stays). */
void read_cache_dontneed(struct read_cache *c, const char *key, uint32_t objsize);
/* Fetches key into the cache unless it is cached or being fetched (by a
 * reader or another prefetch: this one then returns at once). 1 fetched,
 * 0 nothing to do, or the fetch's negative errno. */
int read_cache_prefetch(struct read_cache *c, struct objstore *s, struct stats *st,
			const char *key, uint32_t objsize);
/* An fd open on the cached copy of key (the caller closes it), or -ENOENT
 * when it is not cached whole: replies splice from it. */
int read_cache_fd(struct read_cache *c, struct stats *st, const char *key, uint32_t objsize);
/* Adds an object just uploaded or fetched, so reads need not fetch it:
 * buf holds len bytes of data and their trailer (block_seal). */
void read_cache_insert(struct read_cache *c, const char *key, const void *buf, uint32_t len);
/* Takes the file tmp (a name under the cache directory, written whole by
 * the reconciler: data and trailer) as key's cache file, of len data
 * bytes, if it is a regular file of that size and fits the limit; else
 * removes it. true: cached. */
bool read_cache_adopt(struct read_cache *c, const char *key, const char *tmp, uint32_t len);
/* The cache directory (owned by c); NULL when nothing can be cached. */
const char *read_cache_dir(struct read_cache *c);
uint64_t read_cache_bytes(struct read_cache *c);

/* ---- prefetch.c: read-ahead from the object store ---- */
/* Threads that fetch objects ahead of sequential readers into the read
 * cache, streams GETs at a time (-o readahead_streams), at most budget
 * bytes queued or being fetched (more is dropped: the reader then fetches
 * as it would without); objects cached already have their files read
 * ahead into the page cache instead. Owned by struct mountd. */
#define READAHEAD_STREAMS_DEFAULT 8u
#define READAHEAD_STREAMS_MAX 64u
#define READAHEAD_DEFAULT_MIB 64ull
struct prefetch;
int prefetch_start(struct mountd *md, uint64_t budget, unsigned streams, struct prefetch **out);
/* Gives up fetches in flight, joins the threads, frees p (NULL: nothing). */
void prefetch_stop(struct prefetch *p);
/* Queues key (objsize bytes) unless it is cached, queued already, or over
 * the budget. */
void prefetch_object(struct prefetch *p, const char *key, uint32_t objsize);
/* Bytes queued or being fetched now. */
uint64_t prefetch_bytes(struct prefetch *p);
/* The fetching threads (0 for NULL), and the most GETs they had in flight
 * at once since the start. */
unsigned prefetch_streams(struct prefetch *p);
unsigned prefetch_fetching_max(struct prefetch *p);

/* ---- write_back.c: staging files, dirty ranges, upload and commit ---- */
struct range { uint64_t start, end; }; /* [start, end) */

struct wstate {
	int fd;                  /* the staging file, O_RDWR; -1 while on the retry
	                            list after a failed try (wstate_reopen) */
	char *path;              /* owned */
	struct range *dirty;     /* sorted, disjoint, merged; owned */
	size_t ndirty, cap;
	uint64_t size;           /* the file's size with these writes */
	uint64_t base_size;      /* daemon path: the committed size when staging began */
	struct timespec mtime;   /* passthrough: the floor for the staging file's */
	bool mtime_set;          /* passthrough: mtime set explicitly (utimens) */
	struct timespec started_mtime; /* passthrough: the staging file's own, as made */
	bool dir_synced;         /* fsync=local: the staging file's name is durable */
	bool copy_unsynced;      /* a copy named STAGING_COPY_SUFFIX (see there), not flushed */
	bool copy_torn;          /* a flush of that copy failed: it stays unflushed */
	bool born_ready;         /* passthrough: started with md->layout_ready set */
	bool copy_rename_pending; /* renamed .p, the directory not yet synced */
	bool flush_recorded;     /* a <path>.fj may exist (rclient_journal wrote one) */
	bool size_changed;
	int last_error;          /* negative errno of the last failed commit */
	/* Writeback cache: a write-back the staging file refused (ENOSPC,
	 * EFBIG, EIO). The staged file is cut at the lowest offset that failed
	 * (wb_cut) and later write-backs at or past it are refused, while those
	 * below it still land (the kernel writes back in no fixed order): what
	 * is committed is a prefix of what was written, never data after a gap
	 * of zeros; a truncate clears it. */
	int wb_error;
	uint64_t wb_cut;
	/* Passthrough: the kernel writes the staging file directly, so it
	 * holds the whole file and there are no dirty ranges to track. */
	bool passthrough;
	int backing_id;          /* registered while passthrough opens may come; 0 after */
	uint32_t npt;            /* open handles sharing backing_id */
	/* Passthrough: a mapping of the staging file outlived the last open
	 * (the kernel keeps it on the staging file, not on the FUSE file), so
	 * the file stays the inode's until the mapping goes; committed now and
	 * then meanwhile. */
	bool mapped;
	struct timespec mapped_commit; /* CLOCK_MONOTONIC of the last such commit */
	/* Passthrough: the last close's lease probe was refused, maybe only
	 * because the kernel had not let go of the file yet; the retry list
	 * asks again (write_back_probe_later). */
	bool probing;
	/* Put on the retry list by a close short of fds (write_back_defer_closed):
	 * its handoff from there is the expected way, not worth a log line. */
	bool fd_deferred;
	struct timespec probe_since;   /* CLOCK_MONOTONIC of the first refusal */
	struct block_print *prints; /* per PT_UNIT: what the last commit stored; owned */
	size_t nprints;
};

/* What a passthrough commit stored for one PT_UNIT of the file, so the next
 * commit (an fsync) uploads only the units that changed since. 64 KiB: a
 * small write costs a 64 KiB upload, and a 64 GiB file 16 MiB of prints. */
#define PT_UNIT (64u << 10)
struct block_print {
	uint64_t print;          /* block_fingerprint() of the bytes */
	uint32_t len;            /* 0: nothing committed for this block */
};

/* Starts a passthrough staging file for the inode (which has no write
 * state) and registers it; returns the backing id or a negative errno.
 * mtime_floor: the file's mtime now, which the staging file's (coarser)
 * clock must not take back. meta_size: the file's size in the metadata
 * now (a staging file left as it started commits nothing when that is 0).
 * copy: the file's content is copied in next (wstate_copy_up()): the file
 * is named STAGING_COPY_SUFFIX and this boot until it is flushed.
 * Caller holds ino->lock. */
int wstate_passthrough_start(struct mountd *md, struct inode *ino, uint64_t fh,
			     struct timespec mtime_floor, uint64_t meta_size, bool copy);
/* What a staging file's name says it holds. */
enum staging_kind {
	STAGING_PARTIAL,   /* daemon path: ranges, told by a journal record */
	STAGING_WHOLE,     /* passthrough: ".p", or a copy made under this boot */
	STAGING_COPY_TORN, /* a copy of another boot's run not known flushed: maybe torn */
	STAGING_COPY_UNKNOWN, /* a copy, and this boot cannot be told */
};
/* The kind of staging file `name`, and in *seq (if not NULL) the job seq
 * its name carries ("-s<seq>" of a whole file's name), else 0. */
enum staging_kind staging_kind(const struct mountd *md, const char *name, uint64_t *seq);

/* Fills the new passthrough staging file of an inode with the file's
 * committed content (size bytes; holes stay holes) and the fingerprints
 * of what it holds, so that commits store only what changes. src (or -1):
 * a file whose first size bytes are that content (the staging file of the
 * job just committed), read instead of the read cache and the store.
 * Caller holds ino->lock. */
int wstate_copy_up(struct mountd *md, struct inode *ino, uint64_t size, int src, bool flush);
/* Makes the file kept_name (a local copy: the committed file, size bytes)
 * the inode's passthrough staging file, renamed as a copy; fd, id: the open
 * of it registered as backing id, which the staging file keeps (its lease
 * probe then counts no other open), or -1 and 0 if it is not registered. Returns the backing id or a
 * negative errno (then kept_name is as it was, or gone if the rename was
 * made). The fingerprints come from reading it. */
int wstate_passthrough_adopt(struct mountd *md, struct inode *ino, uint64_t fh,
			     const char *kept_name, int fd, int id, uint64_t size, bool flush);
/* A copy's staging file (copy_unsynced) onto stable storage: fdatasync,
 * then renamed from STAGING_COPY_SUFFIX to STAGING_PT_SUFFIX (w->path
 * follows) and the directory synced. 0 (also when there was nothing to
 * do) or -errno. Caller holds the inode's lock. */
int wstate_copy_flush(struct mountd *md, struct wstate *w);
/* Whether name is a copy's (STAGING_COPY_SUFFIX), of whichever boot. */
bool staging_is_copy(const char *name);
/* See write_back.c. */
bool wstate_has_prints(const struct wstate *w);
/* The ranges of a passthrough staging file (its first size bytes) that
 * differ from what the last commit or the copy-up stored, at most
 * RECONCILE_RANGES_MAX of them (*out owned by the caller). */
int wstate_changed_ranges(struct mountd *md, struct wstate *w, uint64_t size,
			  struct reconcile_range **out, size_t *nout);
/* Opens the staging file again if its fd was closed while the inode
 * waited on the retry list (w->fd -1). Caller holds ino->lock. */
int wstate_reopen(struct wstate *w);
/* Size and mtime of the file as the staging file has them now. */
int wstate_stat(struct wstate *w, uint64_t *size, struct timespec *mtime);
/* Creates the inode's write state if it has none. Caller holds ino->lock. */
int wstate_ensure(struct mountd *md, struct inode *ino, uint64_t fh);
/* Writes buf at off into the staging file and marks it dirty. Holds ino->lock. */
ssize_t wstate_write(struct mountd *md, struct inode *ino, const void *buf, size_t len,
		     off_t off);
/* Uploads the dirty ranges as slices and commits them with the size in one
 * metadata transaction. On failure the data stays staged and the error is
 * returned (and kept in last_error). Caller holds ino->lock. */
int wstate_commit(struct mountd *md, struct inode *ino);
/* Drops the write state (after a successful commit, or for an unlinked
 * inode whose data nobody can see again). Caller holds ino->lock. */
void wstate_drop(struct mountd *md, struct inode *ino);
/* wstate_drop() for a passthrough staging file that stayed empty and was
 * never handed over: its file (and backing_id, if > 0) go back to the
 * staging pool. false: not such a file, or the pool is full (the caller
 * drops it and closes backing_id). */
bool wstate_recycle(struct mountd *md, struct inode *ino, int backing_id);
/* Copies the dirty bytes overlapping [off, off+len) over buf. */
int wstate_overlay(struct wstate *w, void *buf, size_t len, off_t off);
/* Truncates the staged view: dirty ranges past size go, the size is set. */
int wstate_truncate(struct wstate *w, uint64_t size);
/* A write-back from the kernel's cache at off failed with err (negative):
 * see wb_error. Caller holds ino->lock. */
void wstate_writeback_failed(struct wstate *w, uint64_t off, int err);
/* Whether a write-back of [off, off+len) is refused (see wb_error). */
bool wstate_writeback_refused(const struct wstate *w, uint64_t off, size_t len);
/* Puts an inode whose commit failed at close on the retry list (holds a
 * reference). Caller holds ino->lock and checked !ino->pending. */
void write_back_defer(struct mountd *md, struct inode *ino);
/* write_back_defer() of a file whose last close could not hand it over
 * while this daemon is short of fds: its fd is closed until the retry
 * (which opens it again by name). Caller holds ino->lock. */
void write_back_defer_closed(struct mountd *md, struct inode *ino);
/* Whether something besides w->fd holds the staging file open: a shared
 * mapping that outlived its passthrough open, or (for a moment after a
 * close) the kernel's own reference it has not dropped yet. */
bool wstate_mapped(struct wstate *w);
/* Whether a lease probe found no lease support: a mapping outliving a
 * close cannot be told. */
bool wstate_lease_unknown(void);
/* wstate_mapped() for the last close of a passthrough file: a refusal is
 * asked again a few times on the spot, yielding the CPU between (see
 * write_back.c); still refused, it counts in release_probes_deferred. */
bool wstate_mapped_at_release(struct mountd *md, struct wstate *w);
/* The last passthrough open of an inode closed and wstate_mapped() said
 * yes: the retry list asks again shortly, then hands the file over, or
 * (a mapping lives on) commits what it has and keeps the staging file
 * until the mapping goes. Caller holds ino->lock and checked
 * !ino->pending. */
void write_back_probe_later(struct mountd *md, struct inode *ino);
/* Registers the passthrough staging file of an inode again (its backing id
 * was closed with its last open); returns the id or a negative errno.
 * Caller holds ino->lock. */
int wstate_passthrough_resume(struct mountd *md, struct inode *ino);
/* Starts / stops the thread that retries commits that failed at close. */
int write_back_start(struct mountd *md);
void write_back_stop(struct mountd *md);
/* Takes the staging files staging_recover() found still open (md->adopt)
 * as their inodes' write state, as for a mapping that outlived its close. */
void staging_adopt(struct mountd *md);
/* Commits every pending inode now (unmount). Returns the number left. */
size_t write_back_flush_all(struct mountd *md);

/* ---- broker_link.c: ferry-brokerd, for a mount by an unprivileged user ---- */
/* Connects, learns the policy root, and has the broker mount the mountpoint
 * with options (NULL-terminated); *fuse_fd is the new mount's /dev/fuse fd.
 * On error, a negative errno and a message for the user in err. */
int broker_link_mount(struct mountd *md, const char *const *options, int *fuse_fd, char *err,
		      size_t errlen);
/* backing_open()/backing_close() through the broker, relinking after a
 * broker restart; -ENOTCONN while the broker is away (a close is then kept
 * for after the relink: 1). */
int broker_link_backing_open(struct mountd *md, int fd);
/* fds[0..n) in as few requests as the broker takes (BACKING_OPEN_MANY, or
 * one by one from a broker without it): ids[k] the id or -errno of fds[k].
 * 0, or -ENOTCONN for all while the broker is away. */
int broker_link_backing_open_many(struct mountd *md, const int *fds, size_t n, int *ids);
/* 0: sent; 1: queued, to go with others (or after a relink), counted in
 * stats.backing_close when sent; < 0: not sent. */
int broker_link_backing_close(struct mountd *md, int id);
/* Sends the closes queued so far, now. */
void broker_link_flush_closes(struct mountd *md);
/* Connects and tells the broker that fuse_fd (handed over by the daemon
 * before) serves our mount there (ATTACH). As broker_link_mount(). */
int broker_link_attach(struct mountd *md, int fuse_fd, char *err, size_t errlen);
/* Asks the broker to unmount (at exit; nothing if it is gone already). */
void broker_link_umount(struct mountd *md);
void broker_link_close(struct mountd *md); /* accepts a mount without a broker */

/* Writes all of buf at off; false with errno set otherwise (write_back.c). */
bool pwrite_all(int fd, const void *buf, size_t len, off_t off);
/* Whether len bytes at p are all zero (write_back.c). */
bool is_zero(const char *p, size_t len);

/* ---- local_copy.c: committed staging files kept as the files' local copies ---- */
/* A passthrough staging file holds the whole file. Once the reconciler has
 * committed it, it is the committed file byte for byte until the next
 * change, so instead of going with the commit it is kept (a hard link made
 * at hand-off, ".kept-<pid>-<serial>") while there is room under
 * -o local_copies: readers open it in passthrough mode (the kernel reads it
 * with no upcall), and a writer takes it over as its staging file instead
 * of copying the file in. A copy holds a reference of its inode, so it
 * outlives the kernel's FORGET; it goes with the last link. Copies outlive
 * a daemon through a hand-over (`ferry mount --upgrade`) and a clean stop
 * (local_copy_saved.c), never a crash. */
/* Whether the staging filesystem is near full (fuse_ops.c; looked at every
 * ROOM_CHECK_NS at most). */
bool staging_room_low(struct mountd *md);
/* Without -o local_copies: this share of the staging filesystem's size
 * (staging_open()). */
#define LOCAL_COPY_SHARE_DEFAULT 4 /* a quarter */
#define LOCAL_COPY_MIN (1u << 20) /* smaller files: a spliced READ beats a registration */
/* At `ferry mount --upgrade`, once the mount is the new daemon's: the
 * current copies no reader holds go to out (at most max; each name is
 * out's, to free), their records here go and their files stay. Returns
 * how many. */
struct local_copy_handed {
	uint64_t ino;
	char *name;
	uint64_t size;          /* 0: not to be sent */
	struct timespec ctime;  /* the file's, committed */
	uint64_t layout_print;  /* local_copy_layout_print() of it */
	bool built;             /* built from a read (kept_built) */
};
size_t local_copy_hand_over(struct mountd *md, struct local_copy_handed *out, size_t max);
/* The new daemon's side: keeps the copy name (as sent, checked) of inode
 * ino if the file and the volume still agree on its size and change time
 * and on the fingerprint of its committed slices (print; NULL: a sender
 * that had none), this daemon would have made it, and there is room;
 * otherwise (size 0: not to be kept) removes it, unless another live
 * daemon's name is given and the name is not from this volume's saved
 * list (saved). */
void local_copy_adopt(struct mountd *md, uint64_t ino, const char *name, uint64_t size,
		      struct timespec ctime, const uint64_t *print, bool built, bool saved);

/* ---- local_copy_saved.c: local copies kept across a clean stop ---- */
struct local_copy_saved_list;
/* At a clean stop, instead of removing them: the current copies no open
 * holds stay, listed (with what each was committed as, and the copy
 * file's own inode and mtime) in the staging directory's
 * ".local-copies-<uuid>", written durably once they are flushed; the rest
 * are local_copy_drop_all()'s. */
void local_copy_save(struct mountd *md);
/* At start, once the staging directory is open (before the sweep): reads
 * that list into md->saved; a list that is not this volume's, or not
 * well formed, is removed (its copies go with the sweep), except by a
 * follower, which changes nothing of the writer's. */
void local_copy_saved_load(struct mountd *md);
/* Whether name is in the list (the sweep leaves it). */
bool local_copy_saved_names(struct mountd *md, const char *name);
/* The bytes the listed copies hold (free space for the default limit). */
uint64_t local_copy_saved_bytes(struct mountd *md);
/* Once every earlier job is committed (layout_ready) and before the
 * first request: takes up each listed copy that is the file the volume
 * has (its committed slices' fingerprint too) and local_copy_adopt()
 * keeps, removes the others and the list, durably. A follower leaves
 * them all. */
void local_copy_saved_adopt(struct mountd *md);
/* At exit, if the start never got as far as adopting: forgets the list
 * (its copies and file stay for the next start). */
void local_copy_saved_free(struct mountd *md);
/* A fingerprint of ino's committed slices up to size (every change of the
 * file's data commits slices of new ids), in *out; 0 or -errno. */
int local_copy_layout_print(struct mountd *md, uint64_t ino, uint64_t size, uint64_t *out);
/* When the staging filesystem runs low, removes the unread copies (not
 * self's, whose lock the caller may hold; NULL: none) and returns true.
 * Called at every hand-off and every gc round: passthrough writes fill
 * the staging filesystem without asking the daemon. */
bool local_copy_room_check(struct mountd *md, struct inode *self);
/* After a hand-off (rclient_handoff) of the inode's passthrough staging
 * file: keeps it if it is large enough and there is room. Caller holds
 * i->lock. */
void local_copy_keep(struct mountd *md, struct inode *i);
/* The last close of a passthrough staging file that holds exactly what is
 * committed (its hand-off found nothing to commit: an fsync committed it,
 * or nothing was written): keeps it as the copy, renamed, and forgets the
 * write state; false (nothing done) if it is not kept. Caller holds
 * i->lock; no open shares the staging file and its backing id is the
 * caller's to close. */
bool local_copy_keep_unchanged(struct mountd *md, struct inode *i);
/* For a reader's open: the backing id to open it with (the copy is
 * registered on first use), or 0 if it has no usable copy. The caller
 * counts the open in i->nkept. Caller holds i->lock; i->w is NULL. */
int local_copy_share(struct mountd *md, struct inode *i);
/* The last reader of the copy closed (i->nkept is 0): the backing id to
 * close once i->lock is released. Caller holds i->lock. */
int local_copy_unshare(struct mountd *md, struct inode *i);
/* A change to the file's data is coming: a writer's open (writer), an
 * O_TRUNC open or a size change (emptying: the copy's content need not be
 * kept, as it is cut next). A copy that readers share, or that a mapping
 * made through it may still show, becomes the inode's passthrough staging
 * file (they go on sharing it and see the change); so does an unshared one
 * that is still the committed file when a writer comes (no copy-in). Any
 * other copy is dropped. 0 (i->w may be set now), or a negative errno if
 * readers share the copy and it could not be taken over. fh names the
 * staging file; flush: the copy must be on stable storage first
 * (copy_flushed_at_open()). Caller holds i->lock and a reference of its
 * own (the copy's may go). */
int local_copy_before_change(struct mountd *md, struct inode *i, uint64_t fh, bool flush,
			     bool writer, bool emptying);
/* Drops the copy, if nobody reads it, and the reference it held of the
 * inode. Caller holds i->lock and a reference of its own. */
void local_copy_drop(struct mountd *md, struct inode *i);
/* The inode is being freed: its copy goes (no lock needed: nobody else
 * can reach it but the eviction, which kept_lock keeps out). */
void local_copy_forget(struct mountd *md, struct inode *i);
/* At stop: removes every copy nobody reads. */
void local_copy_drop_all(struct mountd *md);
/* At exit, once no thread runs and every handle is dropped: removes the
 * copies local_copy_drop_all() left (made or read meanwhile, or locked by
 * a thread then) and frees their names. */
void local_copy_exit(struct mountd *md);
/* For copy_build.c: room for a copy of size bytes of i (true: counted in
 * the copies' bytes until recorded or given back), evicting only unread
 * copies built the same way: a pass that reads many files once (a backup)
 * never takes the copies writers left. Caller holds i->lock. */
bool local_copy_reserve(struct mountd *md, struct inode *i, uint64_t size);
void local_copy_unreserve(struct mountd *md, uint64_t size);
/* Records name (size bytes, reserved, in the staging directory) as i's
 * copy if i's committed data is still at layout generation gen and
 * nothing is changing it; false: nothing recorded (the file and the
 * reservation stay the caller's). Caller holds i->lock. */
bool local_copy_install(struct mountd *md, struct inode *i, const char *name, uint64_t size,
			uint64_t gen);

/* ---- copy_build.c: local copies of files read whole from the store ---- */
/* A file this node did not write has no local copy, so every open reads it
 * through FUSE READs. Once one handle has read such a file whole, in order
 * (what a sequential reader does), a thread of its own writes the file
 * into a new local copy through the read path, and the next opens read it
 * in passthrough mode. At most COPY_BUILD_QUEUE files wait; more are not
 * built. Owned by struct mountd (md->copy_build). */
#define COPY_BUILD_QUEUE 16
int copy_build_start(struct mountd *md);
/* Ends the thread (a build in flight is given up, its file removed) and
 * gives back the queued inodes; later calls of copy_build_later() queue
 * nothing. Nothing if not started or stopped already. */
void copy_build_stop(struct mountd *md);
/* Stops, then frees md->copy_build; once no request runs. */
void copy_build_free(struct mountd *md);
/* The last of a handle that read the file whole (size bytes, committed)
 * closed: queues a copy's build if i may have one. Caller holds i->lock. */
void copy_build_later(struct mountd *md, struct inode *i, uint64_t size);

/* ---- staging_pool.c: passthrough staging files made ahead of opens ---- */
struct staging_pool;
int staging_pool_new(struct mountd *md);
/* Gives a ready staging file the name `name` (in the staging directory)
 * and hands over its fd and backing id (the caller owns both from here);
 * *exact_stamps: the staging file system keeps a stamp as given. -EAGAIN
 * when none is ready (the filler is woken; the caller makes its own), or
 * the rename's errno. */
int staging_pool_take(struct mountd *md, const char *name, int *fd, int *backing_id,
		      bool *exact_stamps);
/* Takes back staging file `name` (open as fd, registered as backing_id, or
 * 0: not registered), empty, as a pool file: 0 (the pool owns fd and id
 * now), or -EAGAIN (full) or the rename's errno (the caller keeps both). */
int staging_pool_give(struct mountd *md, int fd, const char *name, int backing_id);
/* Stops the filler and removes the files left: at exit, once no request
 * runs (their backing ids go with the connection). Accepts no pool. */
void staging_pool_free(struct mountd *md);
/* Removes the pool files of a daemon that is gone (at start). */
void staging_pool_sweep(struct mountd *md);

/* ---- backing.c: passthrough backing files ---- */
/* Registers fd as a backing file; returns the id (> 0) or a negative errno.
 * EPERM latches passthrough off for the mount. */
int backing_open(struct mountd *md, int fd);
/* Registers fds[0..n) (n <= BROKER_FDS_MAX) at once: ids[k] the id of
 * fds[k] or a negative errno (each as backing_open() returns it). Through
 * ferry-brokerd one request instead of n. */
void backing_open_many(struct mountd *md, const int *fds, size_t n, int *ids);
void backing_close(struct mountd *md, int id); /* ignores id <= 0 */
/* Turns passthrough off for the rest of the mount, logging why once. code
 * is a short token for .stats (passthrough_off_reason), why the log line. */
void passthrough_latch_off(struct mountd *md, const char *code, const char *why);
/* Records why passthrough is off from the start (no warning: it was asked
 * for, or it cannot be). */
void passthrough_set_reason(struct mountd *md, const char *code, const char *why);
/* An open of ino takes the daemon path because a passthrough staging file
 * could not be started or registered (err): logged when the cause first
 * shows, not at every open while it lasts. */
void passthrough_unavailable(struct mountd *md, uint64_t ino, int err);

/* Frees the write state without touching the staging file (it was handed to
 * the reconciler). Caller holds ino->lock. */
void wstate_forget(struct mountd *md, struct inode *ino);

/* Reconciler options a mount sets with -o NAME=MS. */
enum { RC_OPT_COMMIT_WINDOW, RC_OPT_UPLOAD_QUIET, RC_OPT_UPLOAD_DELAY_MAX, RC_NOPTS };
struct rc_opt_def {
	const char *name;  /* the -o name */
	const char *flag;  /* ferry-reconciler's option */
	long max;
};
extern const struct rc_opt_def rc_opt_defs[RC_NOPTS];

/* ---- reconcile_client.c: closed staging files to ferry-reconciler ---- */
/* Takes a seq epoch, recovers staging files left by a crash, starts (or
 * connects to) the reconciler and the reply reader. */
int rclient_start(struct mountd *md);
/* Drains (deadline growing while jobs complete), then stops the reader and
 * the spawned reconciler. */
void rclient_stop(struct mountd *md);
bool rclient_up(struct mountd *md);
/* Deals with staging files an earlier run left (see the .c); with_jobs:
 * journal what can be committed, for the reconciler. Returns how many the
 * reconciler will commit (SIZE_MAX: the directory could not be listed). */
size_t staging_recover(struct mountd *md, bool with_jobs);
/* At an orderly stop (nothing writes staging files any more): flushes the
 * staging directory and records the runs of this boot's copies there as
 * flushed (boot.h's BOOT_FLUSHED_NAME; STAGING_COPY_SUFFIX). */
void staging_flushed_mark(struct mountd *md);
/* Journals and hands the inode's write state to the reconciler; on success
 * the state is gone and the inode reserved until the job commits. -ENODATA:
 * nothing to commit. Caller holds ino->lock. */
int rclient_handoff(struct mountd *md, struct inode *ino);
/* Waits (ino->lock held, released while waiting) until ino has no job in
 * flight. -ETIMEDOUT, -ENOTCONN (the reconciler is gone). */
/* Waits (caller holds ino->lock) until the inode's job in flight is
 * committed: 0, -ETIMEDOUT, -ENOTCONN (no reconciler), or -ENOSPC/-EDQUOT
 * when an attempt at it failed for want of space during the wait (the job
 * goes on; the commit cannot be made until space is freed). */
int rclient_wait(struct mountd *md, struct inode *ino, int timeout_ms);
/* Copies the staging file name of the inode's job in flight (empty if
 * none) into buf. */
void rclient_inflight_name(struct mountd *md, struct inode *i, char *buf, size_t cap);
/* Waits until every job the reconciler knows of (this run's handoffs and
 * what an earlier run left) is committed or failed for good; gives up after
 * idle_timeout_ms without progress (-ETIMEDOUT). */
int rclient_drain(struct mountd *md, int idle_timeout_ms);
int rclient_stats(struct mountd *md, struct reconcile_stats *out);
/* ino is deleted and nothing can reach it but its job (inode_unref):
 * asks the reconciler to drop its jobs not yet started. Best effort: with
 * no room on the socket, or a reconciler this daemon did not start (it
 * may not know the request), nothing is sent and the jobs run as before.
 * Never on an fsync=local mount: there a job may hold bytes an fsync made
 * durable only in its staging file, which the drop removes at once, while
 * the unlink is durable only once the metadata batch holding it is
 * synced; a power loss in between would bring the file back without
 * them. Nor for a file an O_SYNC/O_DSYNC writer had open (keep_upload),
 * for the same reason. Elsewhere a job holds nothing promised durable:
 * after such a loss the file is back as last committed, as with any
 * change not synced. Nor after taking a connection over (lookups_unknown). */
void rclient_drop(struct mountd *md, uint64_t ino);
/* Writes a journal record for the daemon-path writes staged so far, so they
 * outlive a killed daemon once close() returned. Caller holds ino->lock. */
int rclient_journal(struct mountd *md, struct inode *ino, unsigned flags);
/* The next reconcile seq (numbers jobs, records and passthrough staging
 * file names; increasing across restarts). */
uint64_t rclient_seq_next(struct mountd *md);
/* A staging file of ino whose bytes are committed (or no longer the
 * file's) could not be removed: no record or name of it may replay it at
 * the next start. Logs a failure. */
void staging_superseded(struct mountd *md, uint64_t ino);

/* ---- gc.c: deleting what no file refers to ---- */
#define GC_GRACE_DEFAULT_S 300
/* SQLite: other writers (the reconciler) signal that they wait (the intent
 * lock), so batches can be long. PostgreSQL has no such signal, and every
 * other writer waits for the whole open batch (its advisory lock). */
#define META_BATCH_MS_DEFAULT 50
#define META_BATCH_MS_PG_DEFAULT 5
#define NAMES_MAX_DEFAULT 1000000
#define ATTR_TIMEOUT_DEFAULT_S 3600.0
/* A read-only follower's (md->follower) bound on how stale a name, an
 * attribute or a page it shows may be past the writer's commit. */
#define FOLLOW_TIMEOUT_S 1.0
#define PT_COPY_MAX_DEFAULT (1ull << 30)
int gc_start(struct mountd *md);
/* A round now (tests; `ferry gc`). */
void gc_poke(struct mountd *md);
void gc_stop(struct mountd *md);

/* main.c: the daemon could not start: says why (log, ready fd) and exits. */
_Noreturn void start_failed(struct mountd *md, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
/* start_failed() for a staging directory whose record (staging_owner.h)
 * names another volume than uuid (rc -EEXIST) or none (-EBADMSG); held is
 * what it names. Any other rc returns. */
void staging_owner_refuse(struct mountd *md, int rc, const char *held, const char *uuid);

/* ---- special.c: .stats and .control, the virtual files in the root ---- */
bool special_ino(uint64_t ino);
/* The special inode parent/name names, or 0. */
uint64_t special_named(uint64_t parent, const char *name);
void special_stat(struct mountd *md, uint64_t ino, struct stat *st);
int special_open(struct mountd *md, uint64_t ino, struct fuse_file_info *fi);
void special_release(struct mountd *md, uint64_t fh);
/* Frees a HANDLE_SPECIAL object (its drain cancelled) at unmount. */
void special_handle_free(void *obj);
/* Reply to the request themselves. */
void special_read(fuse_req_t req, struct mountd *md, size_t size, off_t off,
		  struct fuse_file_info *fi);
void special_write(fuse_req_t req, struct mountd *md, const char *buf, size_t size,
		   struct fuse_file_info *fi);

uint64_t special_handle_ino(void *obj);
/* A special handle again, after a handover (handover.c). */
void *special_handle_rebuild(struct mountd *md, uint64_t ino);
/* fuse_ops.c, for handover.c: what a handle is, and one made again. */
void handle_describe(enum handle_type type, void *obj, uint64_t *ino, bool *writer,
		     bool *passthrough, bool *setid_clear);
void *handle_rebuild(struct mountd *md, enum handle_type type, uint64_t fh, uint64_t ino,
		     bool writer, bool passthrough, bool setid_clear);

/* ---- handover.c: a live mount handed to a new ferry-mountd ---- */
/* Old side: asked through .control; ends the FUSE loop. 0 or -errno. */
int handover_request(struct mountd *md, const char *socket_path);
/* Old side, once the loop ended: 0 when the mount is the new daemon's
 * (exit without unmounting), else serve on. */
int handover_send(struct mountd *md);
/* New side: --handover FUSEFD:BLOBFD, decoded and checked into md->ho
 * (common/handover_blob.h). 0, or -errno with a line for the user in err. */
int handover_load(struct mountd *md, const char *arg, char *err, size_t errlen);
/* New side, in place of mounting: serves the connection handed over (and
 * attaches it to the broker, for a brokered mount). 0, or -errno with a
 * line for the user in err. */
int handover_serve(struct mountd *md, char *err, size_t errlen);
/* New side, before serving: the handles and staging files again; frees
 * md->ho. */
int handover_restore(struct mountd *md);
/* New side: is name a staging file handed over (staging_recover() leaves
 * it to handover_restore())? */
bool handover_names(struct mountd *md, const char *name);
/* The same for the local copies only (at most HANDOVER_KEPT_MAX). */
bool handover_kept_names(struct mountd *md, const char *name);
/* The bytes of the local copies handed over (0 without a hand-over). */
uint64_t handover_kept_bytes(struct mountd *md);
/* fuse_ops.c: frees a handle object that never made it into the table. */
void mountd_handle_free(struct mountd *md, enum handle_type type, void *obj);

/* ---- drain.c: commits everything written up to a mark (ferry drain) ---- */
enum drain_state { DRAIN_RUNNING, DRAIN_DONE, DRAIN_TIMED_OUT, DRAIN_FAILED, DRAIN_CANCELLED };
struct drain_progress {
	enum drain_state state;
	uint64_t mark;            /* the last reconcile seq the drain waits for */
	uint64_t elapsed_ms;
	uint64_t files_left, bytes_left, blocks_left; /* blocks: 4 MiB, as the gauge */
	uint64_t open_left;       /* of files_left: open for write, being committed here */
	uint64_t files_at_mark, bytes_at_mark; /* what was left when the mark was taken */
	uint64_t failed;          /* files whose upload failed for good */
	/* A checkpoint taken once drained (checkpoint.c): */
	bool checkpoint;          /* asked for */
	bool checkpoint_taken;
	double pause_ms;          /* how long the namespace was fenced */
	double slice_pause_ms;    /* of which commits of slices were fenced */
	uint64_t ckpt_records, ckpt_dump_bytes, ckpt_slices, ckpt_slice_bytes;
};
struct drain;
/* Takes the mark and starts committing up to it in a thread of its own;
 * timeout_ms <= 0: no deadline. With checkpoint (a name), once drained
 * the checkpoint is taken (checkpoint_take) before the drain is done.
 * *out is the caller's (drain_free). */
int drain_start(struct mountd *md, int64_t timeout_ms, const char *checkpoint,
		struct drain **out);
/* A copy of the progress, and a malloc'ed report (the caller frees it;
 * NULL when memory is short): a line per failed or unfinished file. */
char *drain_progress(struct drain *d, struct drain_progress *p);
/* Waits up to ms for the drain to end; its state then. */
enum drain_state drain_wait(struct drain *d, int ms);
/* Cancels a drain still running, joins its thread, frees d (NULL: nothing). */
void drain_free(struct drain *d);
const char *drain_state_name(enum drain_state s);

/* ---- checkpoint.c: ferry checkpoint ---- */
/* Takes checkpoint name of the mounted volume (drained by the caller) and
 * stores it with the objects; p's checkpoint fields are filled. 0, or
 * -errno with the reason in err. */
int checkpoint_take(struct mountd *md, const char *name, struct drain_progress *p, char *err,
		    size_t errlen);

/* ---- lease.c: one read-write mount of a shared volume at a time ---- */
#define LEASE_MS_DEFAULT 15000
/* A PostgreSQL volume: takes the writer's lease (-o lease_ms, --takeover)
 * before anything writes; start_failed() names the holder when another has
 * it. A SQLite volume: nothing (its file lock is the lease). */
void lease_take(struct mountd *md);
/* Renews it every lease_ms / 3 on a thread of its own. */
int lease_start(struct mountd *md);
/* Stops renewing; releases the lease unless it was taken over. */
void lease_stop(struct mountd *md);

/* ---- caller.c: what a signal may do (FUSE_INTERRUPT) ---- */
/* Is req's caller being killed (or gone)? Only then may a wait that
 * changed nothing end early (with EINTR). */
bool caller_dying(fuse_req_t req);
/* Did req come over FUSE-over-io_uring? libfuse delivers no FUSE_INTERRUPT
 * for those: a wait that would stop for one asks caller_dying() too. */
static inline bool req_on_ring(fuse_req_t req)
{
#ifdef FUSE_CAP_OVER_IO_URING
	return fuse_req_is_uring(req);
#else
	(void)req;
	return false;
#endif
}
/* The same, asked often during a long wait: looks at most every
 * CALLER_WATCH_MS, and at once once the request is interrupted. */
#define CALLER_WATCH_MS 250
struct caller_watch {
	fuse_req_t req;            /* NULL: never dying */
	struct timespec next;      /* zero: look at the first call */
};
bool caller_watch(struct caller_watch *w);

/* ---- layout_cache.c: committed layouts of held inodes ---- */
struct slice_extent;
/* The committed size of i, from its layout if known, else from the
 * database (and kept). */
int layout_size(struct mountd *md, struct inode *i, uint64_t *size);
/* The extents that tile [pos, pos+len) of chunk of i's committed layout,
 * like slice_resolve() (*out malloc'ed, the caller's). */
int layout_extents(struct mountd *md, struct inode *i, uint32_t chunk, uint32_t pos,
		   uint32_t len, struct slice_extent **out, size_t *nout);
/* After a change to i's committed data is in the database: the layout
 * kept goes, and a read of the old one in flight is not kept. */
void layout_forget(struct mountd *md, struct inode *i);
/* Frees i's layout (i is being freed; md NULL at exit). */
void layout_free(struct mountd *md, struct inode *i);

/* ---- file_read.c: assembling reads from slices ---- */
/* Reads up to len bytes at off of a regular file whose committed size is
 * size into buf; returns the byte count or a negative errno. */
ssize_t file_read(struct mountd *md, fuse_req_t req, struct inode *i, uint64_t size,
		  void *buf, size_t len, off_t off);
/* Replies to req with up to len bytes at off, spliced from the read-cache
 * files that hold them (holes from zeros in memory): no copy through this
 * daemon. Returns the byte count replied, -EAGAIN when some object is not
 * cached (nothing replied: file_read() fetches it), or another negative
 * errno (nothing replied). */
ssize_t file_read_reply(struct mountd *md, fuse_req_t req, struct inode *i, uint64_t size,
			size_t len, off_t off);
/* How far a READ may land from where the last one ended and still count
 * as sequential: the kernel's readahead sends several READs at once, and
 * they arrive in any order. */
#define RA_SLACK (2u << 20)
/* Where one handle's reads stand, to tell a sequential reader; updated
 * without a lock by concurrent READs (readahead sends several at once):
 * a wrong guess costs a prefetch, never a wrong byte. */
struct readahead {
	_Atomic uint64_t next;  /* where the last READ ended */
	_Atomic uint64_t end;   /* prefetched up to here */
	_Atomic uint64_t run;   /* bytes READ in a row, each READ near the one before */
};
/* After a READ of [off, off+len) through ra of a file of committed size
 * size: a sequential reader gets the objects ahead of it prefetched. */
void file_readahead(struct mountd *md, struct readahead *ra, struct inode *i, uint64_t size,
		    uint64_t off, size_t len);
/* Whether every object of i's committed data (size bytes) is in the read
 * cache now: reading it costs no fetch. */
bool file_cached(struct mountd *md, struct inode *i, uint64_t size);
/* Lets the page cache go of the cache files of i's committed data (size
 * bytes): a local copy holds them now, and holds the pages its readers use. */
void file_cache_dontneed(struct mountd *md, struct inode *i, uint64_t size);
/* SEEK_DATA / SEEK_HOLE over the committed slices. */
off_t file_seek_data(struct mountd *md, struct inode *i, uint64_t size, off_t off, int whence);

/* ---- inode_table.c ---- */
struct inode {
	uint64_t ino;
	/* Guarded by the table's bucket lock: */
	uint64_t nlookup;         /* kernel lookups not yet forgotten */
	uint32_t nopen;           /* open handles and internal references */
	bool unlinked;            /* nlink reached 0: free the metadata at the end */
	/* Unlinked, forgotten by the kernel, one reference left: its job
	 * was asked dropped, once (inode_unref). Under the stripe lock. */
	bool drop_asked;
	/* Written through an O_SYNC/O_DSYNC open: what it staged was promised
	 * durable, so its upload is never dropped (inode_keep_upload()).
	 * Under the stripe lock. */
	bool keep_upload;
	/* This daemon made the inode and set no xattr on it since: GETXATTR
	 * (the kernel asks security.capability of every new file before its
	 * first write) and LISTXATTR answer without the database. */
	_Atomic bool xattr_none;
	struct inode *hnext;      /* hash chain */
	/* Guarded by lock: */
	pthread_mutex_t lock;
	pthread_cond_t committed; /* signalled when inflight_seq ends */
	uint64_t inflight_seq;    /* a job handed to the reconciler, not committed yet */
	uint64_t inflight_size;   /* the file's size and mtime in that job */
	struct timespec inflight_mtime;
	int inflight_error;       /* the last job failed for good (it is kept as .orphan) */
	/* The last failed attempt of the job in flight (it is retried), and
	 * how many were reported: a waiter learns of one after it began. */
	int inflight_retry_error;
	uint64_t inflight_retry_gen;
	/* The staging file of the job in flight, read-only (-1: not open):
	 * it holds every byte of the file as that close left it, so readers
	 * need not wait for the commit (inflight_file() in fuse_ops.c). */
	int inflight_fd;
	bool inflight_whole;      /* its staging file holds every byte of the file */
	bool told_valid;          /* told_* below hold a reply */
	bool told_racy;           /* ... made while a passthrough writer was open */
	uint64_t inflight_fd_seq; /* the job inflight_fd belongs to */
	/* The last job of this inode the reconciler committed, and layout_gen
	 * right after that commit: while layout_gen is still that, the
	 * committed file is that job's staging file byte for byte (a writer's
	 * open copies it from there, open_file()). */
	uint64_t committed_seq, committed_gen;
	/* The size and times of the last attributes replied for this regular
	 * file (told_record() in fuse_ops.c): what a commit changes is checked
	 * against them before it drops the kernel's cache (job_committed()). */
	uint64_t told_size;
	struct timespec told_mtime, told_ctime;
	/* Guarded by md->rc_lock (inflight_name is set and freed under lock
	 * too, so a holder of lock may read it while inflight_seq is set): */
	/* The staging file of the job in flight: malloc'ed at the hand-off
	 * (rclient_handoff()), freed when the job ends; NULL while none is.
	 * Not in the struct: most inodes never have a job, and a volume of a
	 * million files keeps a million of these structs. */
	char *inflight_name;
	struct inode *inext;      /* md->inflight list */
	struct inode **iprevp;    /* what points at this one in it (O(1) removal) */
	uint64_t iseq, isize;     /* its job's seq and the file's size in it (drain.c) */
	uint32_t nwriters;        /* open handles with write access */
	/* Writeback cache: a write-back failed before the inode had a staging
	 * file to cut (one could not be made: a read-only or full staging
	 * disk). Later write-backs are refused, so nothing lands after the
	 * hole, and FLUSH reports it, until the last writer closes. */
	int wb_error_unstaged;
	uint32_t ncached;         /* open handles in the kernel's cached I/O mode */
	bool pending;             /* on the write-back retry list (holds a reference) */
	/* The committed layout last read from the database (layout_cache.c);
	 * layout_gen grows at every change to the committed data. Lock order:
	 * lock, then layout_lock. */
	pthread_mutex_t layout_lock;
	uint64_t layout_gen;
	struct layout *layout;
	struct wstate *w;         /* pending writes, or NULL */
	/* The local copy (local_copy.c): a hard link, named kept_name in the
	 * staging directory (owned; NULL: none), to the staging file of job
	 * kept_seq, kept_size bytes. kept_id: its backing id, registered while
	 * nkept > 0, the count of passthrough opens reading it (there is no
	 * write state then: a writer takes the copy over first). */
	char *kept_name;
	uint64_t kept_seq, kept_size;
	int kept_id;
	int kept_fd;              /* the open registered as kept_id, or -1 */
	bool kept_shared;         /* a reader has had it: a mapping may hold it */
	/* Its content is committed: the layout was kept_gen right after (a
	 * job's commit, or a close with nothing left to commit). */
	bool kept_committed;
	uint64_t kept_gen;
	uint32_t nkept;
	bool kept_building;       /* queued or being built (copy_build.c) */
	bool kept_built;          /* the copy was built from a read (copy_build.c) */
	/* Guarded by md->kept_lock: the least recently used order of copies. */
	struct inode *kprev, *knext;
	/* Guarded by md->pending_lock: */
	struct inode *pnext;
};

struct inode_table;
int inode_table_new(struct inode_table **out);
void inode_table_free(struct inode_table *t);
/* Finds or creates the inode and adds nlookup lookups and nopen opens to it
 * atomically with finding it (so a concurrent forget cannot free it). */
struct inode *inode_ref(struct mountd *md, uint64_t ino, uint64_t nlookup, uint32_t nopen);
/* Finds an inode without taking a reference, NULL if the kernel does not
 * hold it. Only for short, lock-protected peeks (getattr size). */
struct inode *inode_find(struct mountd *md, uint64_t ino);
/* Takes one reference (nopen) on ino if the daemon holds it, else NULL. */
struct inode *inode_ref_existing(struct mountd *md, uint64_t ino);
/* Drops nlookup lookups and nopen opens; frees the inode (and, if unlinked,
 * its metadata) when nothing holds it any more. */
void inode_unref(struct mountd *md, struct inode *ino, uint64_t nlookup, uint32_t nopen);
size_t inode_table_count(struct inode_table *t);
/* Records that ino's last link is gone. False if the daemon does not hold
 * the inode, in which case the caller frees its metadata at once. */
/* The kernel forgot nlookup lookups of ino (FORGET): dropped, freed if
 * nothing else holds it. */
void inode_forget(struct mountd *md, uint64_t ino, uint64_t nlookup);
bool inode_mark_unlinked(struct mountd *md, uint64_t ino);
/* A reference (nopen) on every inode held open now (a handle, the retry
 * list, a job in flight), for a drain: *out is malloc'ed and the caller's,
 * as are the references (inode_unref each). */
int inode_table_held_open(struct mountd *md, struct inode ***out, size_t *nout);
bool inode_is_unlinked(struct mountd *md, struct inode *ino);
/* An O_SYNC/O_DSYNC writer opened i: its uploads are never dropped. */
void inode_keep_upload(struct mountd *md, struct inode *i);

/* ---- fuse_ops.c ---- */
extern const struct fuse_lowlevel_ops mountd_ops;
/* At exit: frees the handles the kernel never released (a connection cut
 * by unmount drops pending RELEASEs). */
void mountd_handles_drop(struct mountd *md);

/* ---- main.c ---- */
/* Reports the start's outcome ("ok" or the reason it failed) to whoever
 * started the daemon; only the first call counts. */
void mountd_ready(struct mountd *md, const char *msg);
struct mountd_config {
	char *db_path;         /* owned */
	char *vol_dir;         /* owned */
	char *mountpoint;      /* owned */
	char *cache_dir;       /* owned */
	char *staging_dir;     /* owned */
	uint64_t cache_bytes;
	bool foreground;
	_Atomic int ready_fd;  /* written "ok" or an error line once serving */
	double attr_timeout, entry_timeout;
	char *reconciler;      /* owned: an external reconciler's socket, or NULL to spawn one */
	bool no_reconciler;    /* commit in ferry-mountd itself */
	char *metrics;         /* owned: --metrics ADDR:PORT for the spawned reconciler */
	int reopen_timeout_ms; /* how long an open waits for the inode's job */
	char *broker;          /* owned: ferry-brokerd's socket (--broker), or NULL */
};

#define RC_FAILURES_KEPT 32
struct rc_failure {
	uint64_t seq, ino;
	int error;                    /* negative errno */
	char message[160];
};

/* fuse_io.c: a brokered mount's FUSE connection, which a new daemon can
 * take over after a crash. */
struct fuse_io {
	pthread_mutex_t lock;         /* guards replay_len and swallow_unique */
	pthread_cond_t cond;          /* swallow_unique went 0 */
	uint8_t replay[HANDOVER_INIT_MAX]; /* the kernel's INIT, to replay (reattach) */
	size_t replay_len;            /* 0: replayed (or none) */
	uint64_t swallow_unique;      /* the replayed INIT's reply is not sent */
	_Atomic bool swallowing;      /* swallow_unique != 0, read without the lock */
	bool captured;                /* the INIT is kept in the staging directory */
	uint8_t init[HANDOVER_INIT_MAX]; /* ... and here, for a handover */
	size_t init_len;
	int fd;                       /* the connection (libfuse's to close) */
};
/* Serves fuse_fd through custom I/O (fuse_io.c); replay (replay_len bytes):
 * the kernel's INIT as the first daemon read it, for a daemon that takes a
 * live connection over; NULL for a new one. 0 or -errno. */
int fuse_io_start(struct mountd *md, int fuse_fd, const uint8_t *replay, size_t replay_len);
/* The INIT the first daemon of this staging directory kept. */
int fuse_io_saved_init(struct mountd *md, uint8_t *buf, size_t cap, size_t *len);

struct mountd {
	struct mountd_config cfg;
	struct fuse_session *se;
	struct meta *meta;
	struct objstore *store;
	struct meta_volume vol;
	struct read_cache *cache;
	/* Layouts may be kept (layout_cache.c): the reconciler has finished
	 * what it recovered from an earlier run. */
	_Atomic bool layout_ready;
	_Atomic uint64_t layout_bytes; /* memory the kept layouts take */
	struct prefetch *prefetch;   /* owned; NULL: no read-ahead */
	struct copy_build *copy_build; /* owned; NULL: not running */
	uint64_t readahead_budget;   /* -o readahead: bytes queued or being fetched */
	uint64_t readahead_window;   /* bytes ahead of a sequential reader */
	unsigned readahead_streams;  /* -o readahead_streams: GETs at once */
	bool readdirplus_auto;       /* -o readdirplus=auto: the kernel decides */
	struct inode_table *inodes;
	struct handle_table *handles;
	struct stats stats;
	int lock_fd;
	int staging_dirfd;
	struct staging_pool *pool;   /* owned; NULL after staging_pool_free() */
	_Atomic bool fuse_done;      /* the FUSE loop ended: no notifications */
	time_t started;            /* wall clock: the special files' times */
	int64_t started_mono_ns;   /* uptime: the wall clock may jump */
	/* write-back retry list */
	pthread_mutex_t pending_lock;
	pthread_cond_t pending_cond;
	bool pending_probes;          /* under pending_lock: a lease probe waits on the list */
	struct inode *pending;
	bool pending_stop;
	pthread_t pending_thread;
	bool pending_thread_live;
	/* passthrough */
	enum { PT_OFF, PT_AUTO, PT_ON } pt_mode;
	/* -o writeback=auto|on|off: the kernel's writeback cache for writes on
	 * the daemon path; auto: when passthrough is off for the whole mount
	 * at INIT. The two are not mixed: writeback=on turns passthrough off. */
	enum { WB_OFF, WB_AUTO, WB_ON } wb_mode;
	bool writeback;               /* in effect (set at INIT) */
	/* -o io_uring=auto|on|off: FUSE-over-io_uring (Linux >= 6.14 with the
	 * fuse module's enable_uring parameter; libfuse >= 3.18 built with
	 * liburing). Only on a direct mount: a brokered or handed-over one is
	 * served through custom I/O (fuse_io.c), which libfuse keeps off the
	 * ring. uring_asked: -o io_uring went to libfuse; uring: the kernel
	 * offered it at INIT (libfuse then starts one ring thread per CPU);
	 * ur_reason: why not, a token for .stats. */
	enum { UR_OFF, UR_AUTO, UR_ON } ur_mode;
	bool uring_asked;
	_Atomic bool uring_offered;   /* by the kernel, at INIT */
	_Atomic bool uring;           /* a request came over the ring */
	char ur_reason[64];           /* under pt_reason_lock */
	struct inval *inval;          /* inval.h; only on a mount that asked for the ring */
	bool fsync_local;             /* -o fsync=local: fsync is durable on the node only */
	bool ro_asked;                /* -o ro */
	/* -o ro on a PostgreSQL volume: a read-only follower of whichever node
	 * holds the writer's lease. It takes no lease, replays no journal,
	 * starts no reconciler or collector, its engine handle is fenced so no
	 * write transaction goes through, and the kernel asks again after
	 * attr_timeout (FOLLOW_TIMEOUT_S unless set) instead of caching names,
	 * attributes and pages as if every change passed through it. */
	bool follower;
	bool attr_timeout_set;        /* -o attr_timeout or --attr-timeout given */
	/* -o passthrough_copy_max: the largest non-empty file a write open
	 * copies into a passthrough staging file; larger ones take the daemon
	 * path (a copy reads the whole file before the open returns). */
	uint64_t pt_copy_max;
	/* -o local_copies: the staging space that local copies (local_copy.c)
	 * may take; 0: none are kept. local_copy_auto: not given, set from
	 * the staging filesystem's size once it is open. */
	uint64_t local_copy_max;
	bool local_copy_auto;
	pthread_mutex_t kept_lock;
	struct inode *kept_oldest, *kept_newest; /* guarded by kept_lock */
	uint64_t kept_bytes;                     /* guarded by kept_lock */
	uint64_t max_file_size;       /* see staging_max_file_size() in main.c */
	_Atomic bool pt_off;          /* latched off (or never on) for this mount */
	pthread_mutex_t pt_reason_lock;
	char pt_reason[64];           /* why pt_off: a token for .stats */
	_Atomic int pt_unavailable;   /* the errno last logged by passthrough_unavailable() */
	uint64_t staging_min_free;    /* bytes; below it new opens take the daemon path */
	_Atomic int64_t staging_room_checked_ns; /* staging_room_low()'s last look */
	_Atomic bool staging_room_low;
	/* -o options handed to the reconciler this daemon starts (rc_opt_defs
	 * names them); -1: its default. */
	int rc_opt[RC_NOPTS];
	/* -o meta_batch_ms: namespace changes commit in batches this far apart
	 * (meta_journal_open); 0: each on its own; -1 until the volume's
	 * engine gives the default. */
	/* -o names_max: names of directories made here kept for lookups of
	 * absent names (meta_names_keep); 0: none. */
	size_t names_max;
	int meta_batch_ms;
	/* lease.c: the writer's lease of a PostgreSQL volume */
	int64_t lease_ms;            /* -o lease_ms */
	bool lease_takeover;         /* --takeover */
	bool lease_held;             /* taken at start */
	_Atomic bool lease_fenced;   /* another mount took it over: read-only now */
	_Atomic bool meta_up;        /* the last renewal reached the database */
	_Atomic uint64_t lease_leftovers; /* journal/staging moved aside at start */
	pthread_t lease_thread;
	bool lease_live;
	pthread_mutex_t lease_lock;
	pthread_cond_t lease_cond;
	bool lease_stopping;         /* under lease_lock */
	/* gc.c: deletes the objects of garbage slices after gc_grace_s */
	int64_t gc_grace_s;
	/* At unmount or SIGTERM: how long the uploads left may go without
	 * one finishing before they are left journaled (-o stop_timeout). */
	int stop_timeout_s;
	pthread_t gc_thread;
	bool gc_live;
	pthread_mutex_t gc_lock;
	pthread_cond_t gc_cond;
	bool gc_stop, gc_poked;       /* under gc_lock */
	/* ferry-brokerd (broker_link.c), with --broker */
	struct broker_conn *broker;   /* owned */
	char *broker_name;            /* owned: the mount's name beneath the policy root */
	_Atomic uint64_t broker_mount_id; /* 0: not mounted through the broker */
	_Atomic bool broker_up;       /* the link works; else opens take the daemon path */
	pthread_mutex_t broker_lock;  /* one relink at a time */
	time_t broker_retry_at;       /* CLOCK_MONOTONIC seconds of the last relink */
	/* Backing ids whose close could not be sent while the broker was away,
	 * closed once it is back (under broker_lock); owned. */
	int *broker_unclosed;
	size_t broker_nunclosed, broker_unclosed_cap;
	/* Closes waiting to go as one BACKING_CLOSE_MANY (broker_link.c): a
	 * thread of their own sends what came within CLOSE_BATCH_WAIT_MS. */
	pthread_mutex_t broker_close_lock;
	pthread_cond_t broker_close_cv;  /* the sender waits on it */
	int broker_closing[BROKER_CLOSE_MANY_MAX];
	size_t broker_nclosing;
	bool broker_close_live, broker_close_stop;
	unsigned broker_close_sending; /* batches taken and not sent yet */
	pthread_cond_t broker_close_sent; /* a flush waits on it for them */
	pthread_t broker_close_thread;
	/* reconciler client (reconcile_client.c) */
	char *rc_path;                /* owned */
	int rc_sock;
	pid_t rc_child;               /* the reconciler we spawned, or 0 */
	pid_t pid;                    /* ours: the child's parent-death check, staging names */
	char boot_tag[BOOT_TAG_LEN + 1]; /* this boot's (boot.h); "" when unknown */
	struct boot_set flushed_boots; /* the staging directory's, as found at start */
	bool copies_flushed;           /* copies are flushed at open: see copy_flushed_at_open() */
	bool flushed_unreadable;       /* flushed_boots could not be read: never stored */
	_Atomic bool rc_up, rc_stopping;
	pthread_t rc_reader;
	bool rc_reader_live;
	pthread_mutex_t rc_lock;      /* guards sends and everything below */
	pthread_cond_t rc_cond;
	_Atomic uint64_t rc_next_seq; /* taken without rc_lock for staging file names */
	uint64_t rc_drained;
	uint64_t layout_upto;         /* layout_ready once rc_drained reaches it */
	uint64_t rc_conn_gen;         /* bumped when a restart installs a new socket */
	struct reconcile_stats rc_stats;
	uint64_t rc_stats_gen;
	_Atomic uint64_t rc_inflight;
	struct inode *inflight;       /* inodes with a job in flight (each holds a reference) */
	_Atomic bool rc_restarting;   /* the reader is starting a new reconciler */
	_Atomic bool rc_stalled;      /* a hand-off found no room (logged once per stall) */
	/* fds_scarce() in reconcile_client.c: its last answer, and when. */
	_Atomic bool fd_scarce;
	_Atomic int64_t fd_checked_ns;
	_Atomic bool rc_committed;    /* a job committed since the last reconciler start */
	unsigned rc_restart_pause_ms; /* reader thread: the pause before the next restart */
	/* The last jobs the reconciler gave up on (kept as .orphan), for
	 * drains: the k-th ever is rc_failures[k % RC_FAILURES_KEPT]. */
	struct rc_failure rc_failures[RC_FAILURES_KEPT];
	uint64_t rc_nfailures;
	struct fuse_io fio;
	bool reattached;              /* took over a dead daemon's FUSE connection */
	/* Took a FUSE connection over (an upgrade's hand-over, a reattach):
	 * the kernel's lookups of the inodes it knew before were not counted
	 * here, so nlookup 0 does not mean it forgot them (no drops). */
	bool lookups_unknown;
	/* Passthrough staging files a dead daemon's opens still hold
	 * (staging_recover), adopted once serving (staging_adopt); owned. */
	char **adopt;
	size_t nadopt;
	/* handover.c */
	pthread_t main_thread;        /* runs the FUSE loop */
	pthread_mutex_t handover_lock;
	char *handover_path;          /* asked for: the CLI's socket; owned */
	bool handing_over;            /* the mount is the new daemon's now */
	struct Ferry__Handover__Handover *ho; /* new side: what came; owned */
	struct local_copy_saved_list *saved;  /* local_copy_saved.c: the last run's copies */
	int ho_fuse_fd;
	bool unmount_self;            /* a handed-over mount of our own to end at exit */
	int argc;                     /* main()'s, for a foreground daemon's re-exec */
	char **argv;
	/* drain.c: drains running (each owned by its .control handle) */
	_Atomic uint64_t drains_running;
	/* A checkpoint's namespace fence (drain.c, fuse_ops.c): changes of
	 * names and attributes and writers' closes hold it shared; a
	 * checkpoint holds it alone, writer-preferred, for a moment. */
	pthread_rwlock_t ns_fence;
	_Atomic bool ns_fenced;        /* held alone now (by the drain's thread) */
	int64_t ns_fence_lifted_ns;    /* when checkpoint_take let it go */
};

#endif
