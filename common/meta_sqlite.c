/*
 * meta_sqlite: the embedded engine's driver (meta_db.h) on SQLite in WAL
 * mode, and its volume operations: the schema, format and open, WAL
 * checkpoints on a thread of their own, durability by syncing the WAL.
 *
 * Each thread gets its own connection (meta_batch.c), with its prepared
 * statements cached for its lifetime. Transactions are BEGIN IMMEDIATE, so
 * a busy database is found at BEGIN (-EAGAIN: the engine retries).
 *
 * Schema version 1 (PRAGMA user_version, with PRAGMA application_id marking
 * the file as a ferryfs volume):
 *   volume(id=1, uuid, block_size, storage_url, created_at, s3_http)
 *   counters(id=1, next_ino, next_slice, next_cookie)
 *   inode(ino, mode, uid, gid, rdev, nlink, size, [amc]time_sec/_nsec)
 *   dentry(parent, name, ino, cookie)   cookies come from a counter, never reused
 *   symlink(ino, target), xattr(ino, name, value)
 *   slice(seq, ino, chunk, id, size, off, pos, len)   seq orders a chunk's slices
 *   orphan(ino)           inodes with nlink 0 not yet released
 *   delslice(id, size)    (before gc_slice: moved there at open)
 *   gc_slice(id, size, since, seen)  slices no row references any more
 *                         since `since` (unix s, the freeing process's wall
 *                         clock), first seen by a collector at its mark
 *                         `seen` (meta_gc_mark; NULL until then): their
 *                         objects go after a grace period (meta_gc_list);
 *                         made at open if missing, `seen` added if missing
 *   commit_seq(ino, seq)  the last reconcile job committed per inode
 *                         (meta_write_commit_seq); made at open if missing,
 *                         so volumes formatted before it keep version 1
 *   journal(id=1, seq)    the last journal record committed (meta_batch.c)
 *   lease(id=1, holder, expires_ms, epoch)  the writer's lease (meta_lease_take)
 *
 * Ownership: struct sq_conn owns its sqlite3 handle and statements;
 * struct sq_vol (m->drv_state) is freed by sq_close's second stage.
 */
#include "clock.h"
#include "meta_engine.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define SCHEMA_VERSION META_SCHEMA_VERSION
#define APPLICATION_ID 0x46455252 /* "FERR" */
#define BUSY_TIMEOUT_MS 5000
#define CKPT_FRAMES 1000 /* SQLite's own wal_autocheckpoint default */
/* The WAL's bound, whatever the load: a commit that finds it this long
 * checkpoints itself (see wal_grown). ~33 MB with 4 KiB pages. */
#define WAL_FRAMES_MAX (8 * CKPT_FRAMES)
/* After a WAL restart its file is cut back to this (journal_size_limit). */
#define WAL_SIZE_LIMIT "33554432"

static const char schema_sql[] =
	"CREATE TABLE volume(id INTEGER PRIMARY KEY CHECK (id = 1), uuid TEXT NOT NULL,"
	" block_size INTEGER NOT NULL, storage_url TEXT NOT NULL, created_at INTEGER NOT NULL,"
	" s3_http INTEGER NOT NULL);"
	"CREATE TABLE counters(id INTEGER PRIMARY KEY CHECK (id = 1), next_ino INTEGER NOT NULL,"
	" next_slice INTEGER NOT NULL, next_cookie INTEGER NOT NULL);"
	"CREATE TABLE inode(ino INTEGER PRIMARY KEY, mode INTEGER NOT NULL, uid INTEGER NOT NULL,"
	" gid INTEGER NOT NULL, rdev INTEGER NOT NULL, nlink INTEGER NOT NULL,"
	" size INTEGER NOT NULL, atime_sec INTEGER NOT NULL, atime_nsec INTEGER NOT NULL,"
	" mtime_sec INTEGER NOT NULL, mtime_nsec INTEGER NOT NULL, ctime_sec INTEGER NOT NULL,"
	" ctime_nsec INTEGER NOT NULL);"
	"CREATE TABLE dentry(parent INTEGER NOT NULL, name BLOB NOT NULL, ino INTEGER NOT NULL,"
	" cookie INTEGER NOT NULL UNIQUE, PRIMARY KEY (parent, name)) WITHOUT ROWID;"
	"CREATE INDEX dentry_cookie ON dentry(parent, cookie);"
	"CREATE INDEX dentry_ino ON dentry(ino);"
	"CREATE TABLE symlink(ino INTEGER PRIMARY KEY, target BLOB NOT NULL);"
	"CREATE TABLE xattr(ino INTEGER NOT NULL, name BLOB NOT NULL, value BLOB NOT NULL,"
	" PRIMARY KEY (ino, name)) WITHOUT ROWID;"
	"CREATE TABLE slice(seq INTEGER PRIMARY KEY AUTOINCREMENT, ino INTEGER NOT NULL,"
	" chunk INTEGER NOT NULL, id INTEGER NOT NULL, size INTEGER NOT NULL,"
	" off INTEGER NOT NULL, pos INTEGER NOT NULL, len INTEGER NOT NULL);"
	"CREATE INDEX slice_chunk ON slice(ino, chunk, seq);"
	"CREATE INDEX slice_id ON slice(id);"
	"CREATE TABLE orphan(ino INTEGER PRIMARY KEY);"
	"CREATE TABLE delslice(id INTEGER PRIMARY KEY, size INTEGER NOT NULL);";

/* Added after schema version 1 shipped: created when missing (meta_open).
 * A table or index added here goes into schema_needs_update() too. */
static const char commit_seq_sql[] =
	"CREATE TABLE IF NOT EXISTS commit_seq(ino INTEGER PRIMARY KEY, seq INTEGER NOT NULL);"
	/* The journal seq of the last explicit mtime change per inode (a
	 * deferring daemon's setattr): a data commit handed over before it
	 * leaves the times alone (meta_commit_item.meta_seq). */
	"CREATE TABLE IF NOT EXISTS times_seq(ino INTEGER PRIMARY KEY, seq INTEGER NOT NULL);"
	"CREATE TABLE IF NOT EXISTS seq_epoch(id INTEGER PRIMARY KEY CHECK (id = 1),"
	" epoch INTEGER NOT NULL);"
	"CREATE TABLE IF NOT EXISTS gc_slice(id INTEGER PRIMARY KEY, size INTEGER NOT NULL,"
	" since INTEGER NOT NULL, seen INTEGER);"
	"CREATE INDEX IF NOT EXISTS gc_slice_since ON gc_slice(since);"
	/* Slices a volume freed before gc_slice existed: due at once. */
	"INSERT OR IGNORE INTO gc_slice(id, size, since) SELECT id, size, 0 FROM delslice;"
	"DELETE FROM delslice;"
	/* The last journal record a deferring daemon's batch committed. */
	"CREATE TABLE IF NOT EXISTS journal(id INTEGER PRIMARY KEY CHECK (id = 1),"
	" seq INTEGER NOT NULL);"
	"INSERT OR IGNORE INTO journal(id, seq) VALUES (1, 0);"
	/* The writer's lease (meta_lease_take): not part of a dump. */
	"CREATE TABLE IF NOT EXISTS lease(id INTEGER PRIMARY KEY CHECK (id = 1),"
	" holder TEXT NOT NULL, expires_ms INTEGER NOT NULL, epoch INTEGER NOT NULL);"
	"INSERT OR IGNORE INTO lease(id, holder, expires_ms, epoch) VALUES (1, '', 0, 0);"
	/* Checkpoints (meta_checkpoint_take) and the slices each keeps from
	 * gc; the range of slice ids this volume's own objects use. */
	"CREATE TABLE IF NOT EXISTS checkpoint(name TEXT PRIMARY KEY, taken_ms INTEGER NOT NULL,"
	" slices INTEGER NOT NULL, bytes INTEGER NOT NULL);"
	"CREATE TABLE IF NOT EXISTS checkpoint_slice(name TEXT NOT NULL, id INTEGER NOT NULL,"
	" PRIMARY KEY (name, id)) WITHOUT ROWID;"
	"CREATE INDEX IF NOT EXISTS checkpoint_slice_id ON checkpoint_slice(id);"
	"CREATE TABLE IF NOT EXISTS slice_range(id INTEGER PRIMARY KEY CHECK (id = 1),"
	" base INTEGER NOT NULL)";

/*
 * Whether commit_seq_sql has anything left to do. Its INSERTs and DELETE
 * take the write lock even when they change nothing, so running it at
 * every open would make each connection opened while ferry-mountd's batch
 * is open (a reconciler starting, a CLI) wait for that batch's commit; a
 * read answers instead. Any doubt (a table missing) says yes.
 */
static bool schema_needs_update(sqlite3 *db)
{
	/* Every table and index commit_seq_sql creates: add there, add here. */
	static const char *const added[] = { "commit_seq",  "times_seq",	    "seq_epoch",
					     "gc_slice",    "gc_slice_since",	    "journal",
					     "lease",	    "checkpoint",	    "checkpoint_slice",
					     "checkpoint_slice_id", "slice_range" };
	char sql[1024];
	size_t n = (size_t)snprintf(sql, sizeof(sql),
				    "SELECT (SELECT COUNT(*) FROM sqlite_master WHERE name IN (");
	sqlite3_stmt *probe = NULL;
	bool current = false;

	for (size_t i = 0; i < sizeof(added) / sizeof(added[0]) && n < sizeof(sql); i++)
		n += (size_t)snprintf(sql + n, sizeof(sql) - n, "%s'%s'", i ? ", " : "", added[i]);
	if (n < sizeof(sql))
		n += (size_t)snprintf(sql + n, sizeof(sql) - n,
				      ")) = %zu AND NOT EXISTS (SELECT 1 FROM delslice)"
				      " AND EXISTS (SELECT 1 FROM journal)"
				      " AND EXISTS (SELECT 1 FROM lease)",
				      sizeof(added) / sizeof(added[0]));
	if (n < sizeof(sql) && sqlite3_prepare_v2(db, sql, -1, &probe, NULL) == SQLITE_OK &&
	    sqlite3_step(probe) == SQLITE_ROW)
		current = sqlite3_column_int(probe, 0) == 1;
	sqlite3_finalize(probe);
	return !current;
}

/*
 * gc_slice.seen came after gc_slice: added when missing (meta_open). Both
 * daemons of a mount open the volume at once; one of them adds it.
 */
static int gc_seen_column(sqlite3 *db)
{
	static const char probe_sql[] = "SELECT seen FROM gc_slice LIMIT 0";
	sqlite3_stmt *probe = NULL;
	int rc = sqlite3_prepare_v2(db, probe_sql, -1, &probe, NULL);

	sqlite3_finalize(probe);
	if (rc != SQLITE_OK) {
		rc = sqlite3_exec(db, "ALTER TABLE gc_slice ADD COLUMN seen INTEGER", NULL, NULL,
				  NULL);
		if (rc != SQLITE_OK) {
			/* The other daemon's ALTER came first? */
			rc = sqlite3_prepare_v2(db, probe_sql, -1, &probe, NULL);
			sqlite3_finalize(probe);
		}
	}
	if (rc == SQLITE_OK)
		rc = sqlite3_exec(db, "CREATE INDEX IF NOT EXISTS gc_slice_seen ON gc_slice(seen)",
				  NULL, NULL, NULL);
	return rc == SQLITE_OK ? 0 : rc == SQLITE_NOMEM ? -ENOMEM : -EIO;
}

struct sq_conn;

struct sq_stmt {
	struct db_stmt base;
	sqlite3_stmt *s; /* NULL until first used */
	struct sq_conn *c;
};

struct sq_conn {
	struct conn base;
	sqlite3 *db;
	struct sq_stmt st[ST_COUNT];
	struct timespec busy_since; /* when the current busy wait began */
	int batched;                /* synchronous=NORMAL is set on db */
};

struct sq_vol {
	_Atomic int dir_synced; /* meta_sync() synced the directory holding the WAL */
	/* Batched mode checkpoints the WAL on a thread of its own, so no
	 * commit pays for copying pages and two fsyncs (see ckpt_main). */
	pthread_mutex_t ckpt_lock;
	pthread_cond_t ckpt_cond;
	pthread_t ckpt_thread;
	int ckpt_started, ckpt_wanted, ckpt_stop; /* under ckpt_lock */
	_Atomic int ckpt_paused;      /* tests: the thread skips its checkpoints */
	_Atomic uint64_t ckpt_inline; /* checkpoints commits had to make */
};

static struct sq_conn *sq(struct conn *c)
{
	return (struct sq_conn *)c;
}

static struct sq_stmt *sqs(struct db_stmt *st)
{
	return (struct sq_stmt *)st;
}

/* SQLite result code -> negative errno. -EAGAIN (busy) makes txn() retry.
 * SQLITE_FULL is the disk under the database (or its WAL) being full: the
 * application is told so (ENOSPC), as a local file system would, rather
 * than an I/O error it cannot act on. */
static int db_err(int rc)
{
	switch (rc & 0xff) {
	case SQLITE_BUSY:
	case SQLITE_LOCKED:
		return -EAGAIN;
	case SQLITE_NOMEM:
		return -ENOMEM;
	case SQLITE_FULL:
		return -ENOSPC;
	default:
		return -EIO;
	}
}

static void sq_conn_free(struct conn *base)
{
	struct sq_conn *c = sq(base);

	if (c == NULL)
		return;
	for (size_t i = 0; i < ST_COUNT; i++)
		sqlite3_finalize(c->st[i].s);
	sqlite3_close(c->db);
	free(c);
}

/*
 * SQLite's own busy_timeout sleeps at least 1 ms per retry, which is longer
 * than most of our transactions hold the lock (the other process is
 * typically ferry-reconciler committing one job). Poll from 20 us up,
 * doubling to 1 ms, for at most BUSY_TIMEOUT_MS in all.
 */
static int busy_wait(void *arg, int count)
{
	struct sq_conn *c = arg;
	struct timespec now;
	long us;
	int64_t waited_ms;

	clock_gettime(CLOCK_MONOTONIC, &now);
	if (count == 0)
		c->busy_since = now;
	waited_ms = (int64_t)(now.tv_sec - c->busy_since.tv_sec) * 1000 +
		    (now.tv_nsec - c->busy_since.tv_nsec) / 1000000;
	if (waited_ms >= BUSY_TIMEOUT_MS)
		return 0;
	us = 20L << (count < 6 ? count : 6);
	if (us > 1000)
		us = 1000;
	nanosleep(&(struct timespec){ 0, us * 1000L }, NULL);
	return 1;
}

/* The database's clock, in ms since the epoch (META_SQL_NOW_MS). */
#define SQ_NOW_MS "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)"

static int sq_prepare(struct sq_conn *c, enum st id)
{
	/* The write lock at BEGIN: a busy database is found there, before any
	 * work, and never in the middle of a transaction. */
	const char *sql = id == ST_BEGIN ? "BEGIN IMMEDIATE" : meta_sql[id].sql;
	char *x = NULL;
	int rc;

	if (strstr(sql, META_SQL_NOW_MS) != NULL) {
		x = meta_sql_expand(sql, SQ_NOW_MS, '?');
		if (x == NULL)
			return -ENOMEM;
		sql = x;
	}
	rc = sqlite3_prepare_v3(c->db, sql, -1, SQLITE_PREPARE_PERSISTENT, &c->st[id].s, NULL);
	free(x);
	if (rc != SQLITE_OK) {
		c->st[id].s = NULL;
		return db_err(rc);
	}
	return 0;
}

static int sq_conn_open(struct meta *m, struct conn **out)
{
	struct sq_conn *c;
	int rc;

	c = calloc(1, sizeof(*c));
	if (c == NULL)
		return -ENOMEM;
	c->base.drv = &meta_sqlite_driver;
	c->base.m = m;
	for (size_t i = 0; i < ST_COUNT; i++) {
		c->st[i].base.drv = &meta_sqlite_driver;
		c->st[i].c = c;
	}
	rc = sqlite3_open_v2(m->path, &c->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX, NULL);
	if (rc != SQLITE_OK) {
		rc = (rc == SQLITE_CANTOPEN && access(m->path, F_OK) != 0 && errno == ENOENT) ?
			     -ENOENT :
			     db_err(rc);
		goto fail;
	}
	sqlite3_busy_handler(c->db, busy_wait, c);
	rc = sqlite3_exec(c->db,
			  "PRAGMA synchronous = FULL; PRAGMA foreign_keys = OFF; "
			  "PRAGMA journal_size_limit = " WAL_SIZE_LIMIT ";",
			  NULL, NULL, NULL);
	if (rc != SQLITE_OK) {
		rc = db_err(rc) == -ENOMEM ? -ENOMEM : -EIO;
		goto fail;
	}
	/* Prepared now, so that ending a failed transaction never needs the
	 * memory to prepare it (see txn_abort). */
	rc = sq_prepare(c, ST_ROLLBACK);
	if (rc) {
		rc = rc == -ENOMEM ? -ENOMEM : -EIO;
		goto fail;
	}
	*out = &c->base;
	return 0;
fail:
	sq_conn_free(&c->base);
	return rc;
}

/*
 * A commit's WAL hook, on the committing thread: wake the checkpointer
 * once the WAL is CKPT_FRAMES long. If it has not kept up (a storm of
 * commits never lets a PASSIVE checkpoint catch up, and it shares two
 * cores with the writers), the commit that finds WAL_FRAMES_MAX frames
 * checkpoints itself: every write transaction runs under write_lock, which
 * this commit still holds, so nothing of this process writes meanwhile, the
 * checkpoint catches up and the next write starts the WAL over (cut back to
 * journal_size_limit). So the WAL stays below WAL_FRAMES_MAX plus one
 * transaction, unless another process's reader pins an old snapshot.
 */
static int wal_grown(void *arg, sqlite3 *db, const char *name, int frames)
{
	struct sq_vol *v = ((struct meta *)arg)->drv_state;

	if (frames >= WAL_FRAMES_MAX) {
		sqlite3_wal_checkpoint_v2(db, name, SQLITE_CHECKPOINT_PASSIVE, NULL, NULL);
		atomic_fetch_add(&v->ckpt_inline, 1);
	} else if (frames >= CKPT_FRAMES) {
		pthread_mutex_lock(&v->ckpt_lock);
		v->ckpt_wanted = 1;
		pthread_cond_signal(&v->ckpt_cond);
		pthread_mutex_unlock(&v->ckpt_lock);
	}
	return SQLITE_OK;
}

/*
 * The checkpointer: a PASSIVE checkpoint (it waits for no reader or
 * writer) when a commit found the WAL long, and once a second anyway so
 * the other process's commits are copied back too. Errors are left for the
 * next round: a checkpoint is never needed for correctness, only to keep
 * the WAL short.
 */
static void *ckpt_main(void *arg)
{
	struct meta *m = arg;
	struct sq_vol *v = m->drv_state;
	struct conn *c = NULL;

	pthread_mutex_lock(&v->ckpt_lock);
	while (!v->ckpt_stop) {
		struct timespec until;

		if (!v->ckpt_wanted) {
			mono_deadline_ms(&until, 1000);
			pthread_cond_timedwait(&v->ckpt_cond, &v->ckpt_lock, &until);
			if (v->ckpt_stop)
				break;
		}
		v->ckpt_wanted = 0;
		pthread_mutex_unlock(&v->ckpt_lock);
		if (!atomic_load(&v->ckpt_paused) && (c != NULL || meta_conn_get(m, &c) == 0)) {
			int frames = 0, done = 0;

			/* Most pages are copied while writers go on... */
			sqlite3_wal_checkpoint_v2(sq(c)->db, NULL, SQLITE_CHECKPOINT_PASSIVE,
						  &frames, &done);
			/* ...but the WAL starts over from its beginning only once
			 * a checkpoint has caught up with it, which it never does
			 * while commits keep coming. So finish with this process's
			 * writers held off for the few frames that came meanwhile. */
			if (frames > done) {
				pthread_mutex_lock(&m->write_lock);
				sqlite3_wal_checkpoint_v2(sq(c)->db, NULL,
							  SQLITE_CHECKPOINT_PASSIVE, NULL, NULL);
				pthread_mutex_unlock(&m->write_lock);
			}
		}
		pthread_mutex_lock(&v->ckpt_lock);
	}
	pthread_mutex_unlock(&v->ckpt_lock);
	return NULL;
}

/*
 * Batched: WAL commits reach the page cache (they survive a killed process)
 * and stable storage at the next meta_sync() or checkpoint. Applied by the
 * thread that owns the connection, before its next write transaction, so a
 * connection opened before meta_set_batched() (meta_open's own) follows too.
 */
static int conn_sync_mode(struct conn *base)
{
	struct sq_conn *c = sq(base);
	int want = atomic_load(&base->m->batched) ? 1 : 0;

	if (c->batched == want)
		return 0;
	int rc = sqlite3_exec(c->db,
			      want ? "PRAGMA synchronous = NORMAL; PRAGMA wal_autocheckpoint = 0" :
				     "PRAGMA synchronous = FULL; PRAGMA wal_autocheckpoint = 1000",
			      NULL, NULL, NULL);

	if (rc != SQLITE_OK)
		return db_err(rc) == -ENOMEM ? -ENOMEM : -EIO;
	sqlite3_wal_hook(c->db, want ? wal_grown : NULL, base->m);
	c->batched = want;
	return 0;
}

static int sq_stmt_get(struct conn *base, enum st id, struct db_stmt **out)
{
	struct sq_conn *c = sq(base);

	if (c->st[id].s == NULL) {
		int rc = sq_prepare(c, id);

		if (rc)
			return rc;
	}
	*out = &c->st[id].base;
	return 0;
}

static void sq_done(struct db_stmt *st)
{
	sqlite3_reset(sqs(st)->s);
	sqlite3_clear_bindings(sqs(st)->s);
}

static int sq_step(struct db_stmt *st)
{
	int rc = sqlite3_step(sqs(st)->s);

	if (rc == SQLITE_ROW)
		return 1;
	if (rc == SQLITE_DONE)
		return 0;
	return db_err(rc);
}

static int sq_bind_i64(struct db_stmt *st, int i, int64_t v)
{
	return sqlite3_bind_int64(sqs(st)->s, i, v) == SQLITE_OK ? 0 : -EIO;
}

static int sq_bind_blob(struct db_stmt *st, int i, const void *p, size_t n)
{
	/* A NULL pointer would bind SQL NULL; an empty value is an empty blob. */
	if (n > INT32_MAX)
		return -EIO;
	return sqlite3_bind_blob(sqs(st)->s, i, p ? p : "", (int)n, SQLITE_STATIC) == SQLITE_OK ?
		       0 :
		       -EIO;
}

static int sq_bind_text(struct db_stmt *st, int i, const char *s)
{
	return sqlite3_bind_text(sqs(st)->s, i, s, -1, SQLITE_STATIC) == SQLITE_OK ? 0 : -EIO;
}

static enum db_type sq_col_type(struct db_stmt *st, int i)
{
	switch (sqlite3_column_type(sqs(st)->s, i)) {
	case SQLITE_NULL:
		return DB_NULL;
	case SQLITE_INTEGER:
		return DB_INT;
	case SQLITE_BLOB:
		return DB_BLOB;
	case SQLITE_TEXT:
		return DB_TEXT;
	default:
		return DB_OTHER;
	}
}

static int64_t sq_col_i64(struct db_stmt *st, int i)
{
	return sqlite3_column_int64(sqs(st)->s, i);
}

static const void *sq_col_blob(struct db_stmt *st, int i, size_t *n)
{
	const void *p = sqlite3_column_blob(sqs(st)->s, i);
	int len = sqlite3_column_bytes(sqs(st)->s, i);

	*n = len > 0 ? (size_t)len : 0;
	return *n ? p : NULL;
}

static int64_t sq_changes(struct conn *c)
{
	return sqlite3_changes64(sq(c)->db);
}

static int sq_expect_changes(struct conn *c, int64_t n, int err)
{
	return sqlite3_changes64(sq(c)->db) == n ? 0 : err;
}

static int sq_settle(struct conn *c)
{
	(void)c;
	return 0; /* every statement was answered when it ran */
}

static int64_t sq_change_start(struct conn *c)
{
	(void)c;
	return 0;
}

static bool sq_failed_earlier(struct conn *c)
{
	(void)c;
	return false; /* every failure is the statement's that ran */
}

static int64_t sq_total_changes(struct conn *c)
{
	return sqlite3_total_changes64(sq(c)->db);
}

static bool sq_txn_open(struct conn *c)
{
	return !sqlite3_get_autocommit(sq(c)->db);
}

static bool sq_conn_ok(struct conn *c)
{
	(void)c;
	return true; /* a file does not hang up */
}

static int sq_stmt_new(struct conn *base, const char *sql, const char *params,
		       struct db_stmt **out)
{
	struct sq_stmt *st = calloc(1, sizeof(*st));
	char *x = meta_sql_expand(sql, SQ_NOW_MS, '?');
	int rc = 0;

	(void)params; /* SQLite's values carry their own types */
	if (st == NULL || x == NULL) {
		rc = -ENOMEM;
		goto out;
	}
	st->base.drv = &meta_sqlite_driver;
	st->c = sq(base);
	rc = sqlite3_prepare_v2(sq(base)->db, x, -1, &st->s, NULL);
	if (rc != SQLITE_OK) {
		rc = db_err(rc);
		goto out;
	}
	*out = &st->base;
	st = NULL;
out:
	free(x);
	free(st);
	return rc;
}

static void sq_stmt_free(struct db_stmt *st)
{
	if (st == NULL)
		return;
	sqlite3_finalize(sqs(st)->s);
	free(st);
}

static const char *sq_errmsg(struct conn *c, char *buf, size_t len)
{
	snprintf(buf, len, "%s", sqlite3_errmsg(sq(c)->db));
	return buf;
}

const struct db_driver meta_sqlite_driver = {
	.name = "sqlite",
	.conn_open = sq_conn_open,
	.conn_free = sq_conn_free,
	.conn_write_prepare = conn_sync_mode,
	.stmt = sq_stmt_get,
	.bind_i64 = sq_bind_i64,
	.bind_blob = sq_bind_blob,
	.bind_text = sq_bind_text,
	.step = sq_step,
	.done = sq_done,
	.col_type = sq_col_type,
	.col_i64 = sq_col_i64,
	.col_blob = sq_col_blob,
	.changes = sq_changes,
	.expect_changes = sq_expect_changes,
	.settle = sq_settle,
	.change_start = sq_change_start,
	.failed_earlier = sq_failed_earlier,
	.total_changes = sq_total_changes,
	.in_txn = sq_txn_open,
	.txn_open = sq_txn_open,
	.conn_ok = sq_conn_ok,
	.stmt_new = sq_stmt_new,
	.stmt_free = sq_stmt_free,
	.errmsg = sq_errmsg,
};

/* ---- the volume ----------------------------------------------------------- */

static int unlink_db_files(const char *path)
{
	static const char *const sfx[] = { "", "-wal", "-shm", "-journal", META_JOURNAL_SUFFIX,
					   "-intent" };
	char buf[4096];
	size_t i;

	for (i = 0; i < sizeof(sfx) / sizeof(sfx[0]); i++) {
		if ((size_t)snprintf(buf, sizeof(buf), "%s%s", path, sfx[i]) >= sizeof(buf))
			return -ENAMETOOLONG;
		if (unlink(buf) != 0 && errno != ENOENT)
			return -errno;
	}
	return 0;
}

static int check_volume(struct sq_conn *c)
{
	static const char *const q[] = { "PRAGMA application_id", "PRAGMA user_version" };
	static const int64_t want[] = { APPLICATION_ID, SCHEMA_VERSION };
	sqlite3_stmt *st = NULL;
	size_t i;
	int rc = 0;

	for (i = 0; i < 2 && rc == 0; i++) {
		rc = sqlite3_prepare_v2(c->db, q[i], -1, &st, NULL);
		if (rc != SQLITE_OK) {
			rc = -EIO;
			break;
		}
		rc = sqlite3_step(st) == SQLITE_ROW &&
				     sqlite3_column_type(st, 0) == SQLITE_INTEGER &&
				     sqlite3_column_int64(st, 0) == want[i] ?
			     0 :
			     -EIO;
		sqlite3_finalize(st);
		st = NULL;
	}
	if (rc == 0 &&
	    sqlite3_exec(c->db, "PRAGMA journal_mode = WAL", NULL, NULL, NULL) != SQLITE_OK)
		rc = -EIO;
	return rc;
}

/* The intent lock's file, beside the database; -1 if it cannot be made
 * (a read-only directory: then nothing writes there either). */
static int intent_open(const char *db_path)
{
	char p[PATH_MAX];

	if ((size_t)snprintf(p, sizeof(p), "%s-intent", db_path) >= sizeof(p))
		return -1;
	return open(p, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
}

static int sq_format(struct meta *m, int force, int (*fill)(struct conn *c, void *arg),
		     void *arg)
{
	char pragmas[128];
	struct conn *c = NULL;
	sqlite3 *db;
	int fd, rc;

	if (force) {
		rc = unlink_db_files(m->path);
		if (rc)
			return rc;
	}
	/* O_EXCL decides, race-free, whether a volume is there. */
	fd = open(m->path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (fd < 0)
		return -errno;
	close(fd);
	rc = sq_conn_open(m, &c);
	if (rc)
		goto out;
	db = sq(c)->db;
	sqlite3_busy_timeout(db, BUSY_TIMEOUT_MS);
	snprintf(pragmas, sizeof(pragmas), "PRAGMA application_id = %d; PRAGMA user_version = %d;",
		 APPLICATION_ID, SCHEMA_VERSION);
	if (sqlite3_exec(db, "PRAGMA journal_mode = WAL; BEGIN IMMEDIATE", NULL, NULL, NULL) !=
		    SQLITE_OK ||
	    sqlite3_exec(db, schema_sql, NULL, NULL, NULL) != SQLITE_OK ||
	    sqlite3_exec(db, commit_seq_sql, NULL, NULL, NULL) != SQLITE_OK ||
	    sqlite3_exec(db, pragmas, NULL, NULL, NULL) != SQLITE_OK) {
		rc = db_err(sqlite3_errcode(db)) == -ENOMEM ? -ENOMEM : -EIO;
		goto out;
	}
	rc = fill(c, arg);
	if (rc == 0 && sqlite3_exec(db, "COMMIT", NULL, NULL, NULL) != SQLITE_OK)
		rc = db_err(sqlite3_errcode(db)) == -ENOMEM ? -ENOMEM : -EIO;
out:
	sq_conn_free(c);
	if (rc)
		unlink_db_files(m->path); /* ours: we created it */
	return rc;
}

static void sq_close(struct meta *m, int stage)
{
	struct sq_vol *v = m->drv_state;

	if (v == NULL)
		return;
	if (stage == 0) {
		pthread_mutex_lock(&v->ckpt_lock);
		v->ckpt_stop = 1;
		pthread_cond_signal(&v->ckpt_cond);
		pthread_mutex_unlock(&v->ckpt_lock);
		if (v->ckpt_started)
			pthread_join(v->ckpt_thread, NULL); /* its conn goes with the thread */
		v->ckpt_started = 0;
		return;
	}
	pthread_mutex_destroy(&v->ckpt_lock);
	pthread_cond_destroy(&v->ckpt_cond);
	free(v);
	m->drv_state = NULL;
}

static int sq_open(struct meta *m)
{
	struct sq_vol *v;
	struct conn *c;
	int rc;

	if (access(m->path, F_OK) != 0)
		return errno == ENOENT ? -ENOENT : -EIO;
	v = calloc(1, sizeof(*v));
	if (v == NULL)
		return -ENOMEM;
	pthread_mutex_init(&v->ckpt_lock, NULL);
	mono_cond_init(&v->ckpt_cond);
	m->drv_state = v;
	m->intent_fd = intent_open(m->path);
	rc = meta_conn_get(m, &c);
	if (rc == 0)
		rc = check_volume(sq(c));
	/* Tables added since version 1 shipped. */
	if (rc == 0 && schema_needs_update(sq(c)->db) &&
	    sqlite3_exec(sq(c)->db, commit_seq_sql, NULL, NULL, NULL) != SQLITE_OK)
		rc = -EIO;
	if (rc == 0)
		rc = gc_seen_column(sq(c)->db);
	return rc;
}

static int sq_set_batched(struct meta *m, int batched)
{
	struct sq_vol *v = m->drv_state;
	int rc = 0;

	pthread_mutex_lock(&v->ckpt_lock);
	if (batched && !v->ckpt_started) {
		rc = -pthread_create(&v->ckpt_thread, NULL, ckpt_main, m);
		v->ckpt_started = rc == 0;
	}
	pthread_mutex_unlock(&v->ckpt_lock);
	return rc;
}

/*
 * A batched commit has appended its frames to the WAL with write(); syncing
 * that file makes them (and all before them) durable, which is what
 * synchronous=FULL does at each commit. Done outside any transaction, the
 * sync holds no database lock: other writers go on. No WAL: everything was
 * checkpointed into the database, which a checkpoint syncs.
 */
static int sq_sync(struct meta *m)
{
	struct sq_vol *v = m->drv_state;
	char wal[PATH_MAX];
	int fd, rc = 0;

	if ((size_t)snprintf(wal, sizeof(wal), "%s-wal", m->path) >= sizeof(wal))
		return -ENAMETOOLONG;
	fd = open(wal, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return errno == ENOENT ? 0 : -errno;
	if (fdatasync(fd) < 0)
		rc = -EIO;
	close(fd);
	/* Once: the WAL's own name in its directory. */
	if (rc == 0 && !atomic_load(&v->dir_synced)) {
		char *slash = strrchr(wal, '/');
		if (slash) {
			*slash = '\0';
			fd = open(slash == wal ? "/" : wal, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
			if (fd >= 0) {
				if (fsync(fd) == 0)
					atomic_store(&v->dir_synced, 1);
				close(fd);
			}
		}
	}
	return rc;
}

const struct db_volume_ops meta_sqlite_volume = {
	.format = sq_format,
	.open = sq_open,
	.close = sq_close,
	.set_batched = sq_set_batched,
	.sync = sq_sync,
	.snapshot_sql = "BEGIN",
	/* AUTOINCREMENT's record of the highest seq given; the slices' own
	 * inserts (a load) write it, and the dump's value replaces it. */
	.slice_seq_get_sql = "SELECT seq FROM sqlite_sequence WHERE name = 'slice'",
	.slice_seq_set_sql = { "DELETE FROM sqlite_sequence WHERE name = 'slice'",
			       "INSERT INTO sqlite_sequence(name, seq) VALUES ('slice', ?1)" },
};

/* Test hooks of the SQLite engine's checkpointer (meta.h). */
void meta_ckpt_pause(struct meta *m, int paused)
{
	if (m->drv == &meta_sqlite_driver)
		atomic_store(&((struct sq_vol *)m->drv_state)->ckpt_paused, paused);
}

uint64_t meta_ckpt_inline(struct meta *m)
{
	if (m->drv != &meta_sqlite_driver)
		return 0;
	return atomic_load(&((struct sq_vol *)m->drv_state)->ckpt_inline);
}
