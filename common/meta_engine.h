/*
 * meta_engine: what the metadata engine's files share (internal to
 * common/meta_*.c). struct meta, the transactions and deferred commits of
 * meta_batch.c, and short typed statement runs over the driver (meta_db.h).
 *
 * Ownership: struct meta owns its connections (the per-thread ones on its
 * list, the batch's m->bc), the journal fd and the driver's state
 * (drv_state, freed by the driver's vol_close).
 */
#ifndef FERRY_META_ENGINE_H
#define FERRY_META_ENGINE_H

#include "meta.h"
#include "meta_db.h"
#include "meta_journal.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

#define TXN_TRIES 8
#define SYMLINK_MAX 4095
/* Chunk indexes are uint32_t, which bounds a file's size. */
#define MAX_FILE_SIZE ((uint64_t)META_CHUNK_SIZE << 32)
#define HOT_DIRS 16
#define J_RESULT 11 /* a journal record's slot for the change's result (a new ino) */

/* What a volume's engine does beyond statements (meta_sqlite.c, meta_pg.c). */
struct db_volume_ops {
	/* Makes the empty schema at m->path (a new volume; -EEXIST if one is
	 * there and !force) and, in the same transaction, calls fill to write
	 * the first rows through the catalogue. */
	int (*format)(struct meta *m, int force, int (*fill)(struct conn *c, void *arg), void *arg);
	/* Checks that m->path holds a volume of this schema, sets drv_state
	 * and anything else the driver needs on m (intent_fd). */
	int (*open)(struct meta *m);
	/* Stops the driver's threads (before m's connections go), then, with
	 * stage 1, frees drv_state (after). */
	void (*close)(struct meta *m, int stage);
	int (*set_batched)(struct meta *m, int batched);
	/* Makes every commit m made so far durable. */
	int (*sync)(struct meta *m);
	/* For ferry dump and load (meta_dump.c), in the catalogue's dialect:
	 * a read transaction that sees the whole volume at one instant; the
	 * highest slice seq ever given (a row of one integer, or none before
	 * the first slice); the statements that set it to ?1 after a load
	 * (the second may be NULL). */
	const char *snapshot_sql;
	const char *slice_seq_get_sql;
	const char *slice_seq_set_sql[2];
	/* Run first in a write transaction, it keeps every other writer of
	 * slices out until the transaction ends (a checkpoint's fence,
	 * meta_checkpoint_take); NULL where the transaction already does
	 * (SQLite's BEGIN IMMEDIATE). */
	const char *fence_sql;
};

struct meta {
	char *path; /* the volume's location: a file path or a URL */
	const struct db_driver *drv;
	const struct db_volume_ops *vol;
	void *drv_state;
	_Atomic int batched; /* commits not synced one by one (meta_set_batched) */
	/* Commits this handle made, and how many of them the last meta_sync()
	 * made durable: a sync with nothing new of ours to sync is skipped. */
	_Atomic uint64_t commits_made, commits_synced;
	pthread_key_t key;
	pthread_mutex_t lock; /* guards conns */
	/* Slice ids taken from the counter and not handed out yet
	 * [ids_next, ids_end), under ids_lock: see meta_slice_id_alloc. */
	pthread_mutex_t ids_lock;
	uint64_t ids_next, ids_end;
	/* Held around every write transaction: threads of one process queue
	 * here, woken at once, instead of polling the database's lock. */
	pthread_mutex_t write_lock;
	struct conn *conns;
	int opened; /* meta_open() went through */
	_Atomic uint64_t reconnects; /* connections replaced after the server hung up */
	_Atomic uint64_t statements;  /* statements run (meta_counters) */
	_Atomic uint64_t round_trips; /* exchanges with a database server */
	_Atomic uint64_t fence;      /* the lease epoch write transactions check (0: none) */
	/* A connection was replaced while commits made without waiting for
	 * the server's WAL flush were not synced yet: the server may have lost
	 * them, so the next meta_sync() reports -EIO. */
	_Atomic int sync_lost;
	/* Cross-process, for an engine whose writers take turns (SQLite): held
	 * shared by a deferring daemon while it opens a batch and exclusive by
	 * every other writer around its transaction, so a stream of batches
	 * never starves them (see batch_begin). -1: none. */
	int intent_fd;
	int64_t intent_asked_ns; /* intent_wanted()'s last look (write_lock) */
	/* Deferred commits (meta_journal_open); all under write_lock. */
	int jfd;                 /* the journal, -1: commits are immediate */
	struct conn *bc;         /* the batch's connection, owned here */
	int batch_open;          /* bc is inside the batch's transaction */
	_Atomic int batch_dirty; /* batch_open, for reads that take no lock */
	struct timespec batch_since; /* monotonic: when the batch opened */
	uint64_t batch_records;
	uint64_t jseq;     /* the last seq appended to the journal */
	uint64_t applied;  /* the last seq the database holds */
	off_t jsize;       /* the journal's length */
	_Atomic int stuck; /* see batch_restore() */
	int flush_ms;
	pthread_cond_t flush_cond;
	pthread_t flush_thread;
	int flush_started, flush_stop;
	struct meta_journal_stats js;
	/* Directories whose rows the open batch changed, held here and written
	 * once, when the batch commits (meta_hot_flush), instead of at every
	 * entry made or removed in them: a create storm in one directory would
	 * otherwise rewrite its row at each file. Only on bc, under
	 * write_lock, while a batch is open; every read of an inode row on bc
	 * looks here first (inode_get, meta_lookup, readdir). */
	struct hot_dir {
		uint64_t ino;
		struct meta_attr a;
	} hot[HOT_DIRS];
	unsigned nhot;
	uint64_t hot_puts; /* rows held here so far: a change that made any has written */
	/* The counters row's next_ino and next_cookie, held the same way (an
	 * UPDATE ... RETURNING per create cost more than the rest of it). */
	struct ctr {
		int held, dirty;
		uint64_t ino, cookie;
	} ctr;
	/* Names of directories made here, for lookups of absent names
	 * (meta_names_keep); NULL unless this handle is the only writer. */
	struct meta_names *names;
	/* Unlinked inodes nothing holds any more, freed in the batch right
	 * before it commits (meta_inode_release_later) rather than one
	 * journaled change each on the thread of the kernel's FORGET, which
	 * an rm -rf's next request waited behind. The array is owned here;
	 * under rel_lock, taken after write_lock, never before it. Losing
	 * them loses nothing: their orphan rows are freed at a later start. */
	pthread_mutex_t rel_lock;
	uint64_t *rel;
	size_t nrel, relcap;
};

extern const struct db_driver meta_sqlite_driver;
extern const struct db_volume_ops meta_sqlite_volume;
extern const struct db_driver meta_pg_driver;
extern const struct db_volume_ops meta_pg_volume;

/* ---- transactions and deferred commits (meta_batch.c) ---- */

typedef int (*txn_fn)(struct conn *c, void *arg);

/* A deferred change runs with the time it records in the journal, and its
 * replay with the recorded one, so both come out the same. */
extern _Thread_local const struct timespec *meta_tl_now;
extern _Thread_local int meta_tl_replaying; /* meta_batch_run() journals nothing */
extern _Thread_local uint64_t meta_tl_statements; /* meta_thread_statements() */
/* The journal seq of the change being made (0: not a journaled one). */
extern _Thread_local uint64_t meta_tl_seq;

/* A struct meta for the volume at loc (a path or a URL) with its engine
 * chosen and no connection yet: meta_close() frees it. */
int meta_alloc(const char *loc, struct meta **out);
/* Makes a new volume at loc as meta_format() does, with fill writing its
 * first rows in the transaction that makes its schema (ferry load). */
int meta_format_with(const char *loc, int force, int (*fill)(struct conn *c, void *arg),
		     void *arg);
/* A connection of m's was made again (the server hung up). */
void meta_conn_replaced(struct meta *m);
/* This thread's connection to m's database. */
int meta_conn_get(struct meta *m, struct conn **out);
void meta_conn_unlink(struct meta *m, struct conn *c);
void meta_conn_thread_exit(void *p);
/* fn in a transaction of its own, or in the batch when m defers (then
 * journaled as r, with result in its result slot, when r is given). fn
 * returns 0 to commit or a negative errno to roll back; it must be safe to
 * run again (it may be, after -EAGAIN). */
int meta_txn_rec(struct meta *m, struct mj_rec *r, const uint64_t *result, txn_fn fn, void *arg);
int meta_txn(struct meta *m, txn_fn fn, void *arg);
/* fn in a transaction of its own, begun with none of this process's
 * deferred changes outstanding: the open batch is committed first, and
 * write_lock is held from there to fn's commit, so nothing of this process
 * comes between (a checkpoint's snapshot, on another connection, must see
 * what fn's transaction sees). */
int meta_txn_settled(struct meta *m, txn_fn fn, void *arg);
/* fn in the batch (write_lock held): for a replayed record. */
int meta_batch_run(struct meta *m, struct mj_rec *r, const uint64_t *result, txn_fn fn,
		   void *arg);
/* The connection a read uses; see READ_CONN. */
int meta_read_conn(struct meta *m, struct conn **out);
void meta_read_done(struct conn **pc);
#define READ_CONN(c) struct conn *c __attribute__((cleanup(meta_read_done))) = NULL

/* ---- from the rules (meta_rules.c), for the batch ---- */

/* Writes the rows held in m->hot (and the counters) and empties it. */
int meta_hot_flush(struct meta *m);
/* Makes journal record r's change again in the batch (write_lock held,
 * meta_tl_replaying set). */
int meta_replay_one(struct meta *m, const struct mj_rec *r);
/* Frees unlinked inode ino in the open batch (write_lock held): as
 * meta_inode_release(), journaling nothing. */
int meta_release_in_batch(struct meta *m, uint64_t ino);

/* ---- statements over the driver ---- */

static inline int stmt(struct conn *c, enum st id, struct db_stmt **out)
{
	atomic_fetch_add_explicit(&c->m->statements, 1, memory_order_relaxed);
	meta_tl_statements++;
	return c->drv->stmt(c, id, out);
}

static inline void stmt_done(struct db_stmt *st)
{
	if (st != NULL)
		st->drv->done(st);
}

/* 1: a row, 0: done, <0: error. */
static inline int step(struct db_stmt *st)
{
	return st->drv->step(st);
}

static inline int bind_i64(struct db_stmt *st, int i, int64_t v)
{
	return st->drv->bind_i64(st, i, v);
}

static inline int bind_ints(struct db_stmt *st, int n, const int64_t *v)
{
	for (int i = 0; i < n; i++)
		if (bind_i64(st, i + 1, v[i]))
			return -EIO;
	return 0;
}

/* An empty value is an empty blob, never SQL NULL. */
static inline int bind_blob(struct db_stmt *st, int i, const void *p, size_t n)
{
	return st->drv->bind_blob(st, i, p, n);
}

static inline enum db_type col_type(struct db_stmt *st, int i)
{
	return st->drv->col_type(st, i);
}

static inline const void *col_blob(struct db_stmt *st, int i, size_t *n)
{
	return st->drv->col_blob(st, i, n);
}

static inline int64_t db_changes(struct conn *c)
{
	return c->drv->changes(c);
}

/* A write that must have changed exactly one row (a sanity check, not a
 * rule's question: a rule that acts on the count reads db_changes()). */
static inline int expect_one(struct conn *c)
{
	return c->drv->expect_changes(c, 1, -EIO);
}

static inline int col_int(struct db_stmt *st, int i, int64_t lo, int64_t hi, int64_t *out)
{
	if (col_type(st, i) != DB_INT)
		return -EIO;
	*out = st->drv->col_i64(st, i);
	return (*out < lo || *out > hi) ? -EIO : 0;
}

/* Runs a statement with integer parameters that returns no rows. */
static inline int run_ints(struct conn *c, enum st id, int n, const int64_t *v)
{
	struct db_stmt *st = NULL;
	int rc;

	rc = stmt(c, id, &st);
	if (rc)
		return rc;
	rc = bind_ints(st, n, v);
	if (rc == 0)
		rc = step(st);
	if (rc > 0)
		rc = 0;
	stmt_done(st);
	return rc;
}

static inline int exec_st(struct conn *c, enum st id)
{
	return run_ints(c, id, 0, NULL);
}

/* Runs a statement with integer parameters whose first row's first column
 * is an integer in [lo, hi]. -ENOENT if there is no row (or it is NULL and
 * null_ok is set), -EIO for anything else. */
static inline int query_int(struct conn *c, enum st id, int n, const int64_t *v, int64_t lo,
			    int64_t hi, int null_ok, int64_t *out)
{
	struct db_stmt *st = NULL;
	int rc;

	rc = stmt(c, id, &st);
	if (rc)
		return rc;
	rc = bind_ints(st, n, v);
	if (rc)
		goto out;
	rc = step(st);
	if (rc < 0)
		goto out;
	if (rc == 0 || (col_type(st, 0) == DB_NULL && null_ok)) {
		rc = -ENOENT;
		goto out;
	}
	rc = col_int(st, 0, lo, hi, out);
out:
	stmt_done(st);
	return rc;
}

#endif
