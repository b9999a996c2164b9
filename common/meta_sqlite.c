/*
 * meta_sqlite: the embedded metadata engine (meta.h) on SQLite in WAL mode.
 *
 * Each thread gets its own connection (a pthread key on struct meta; the key's
 * destructor closes it when the thread exits, meta_close() closes the rest),
 * with its prepared statements cached for its lifetime. Every mutation is one
 * BEGIN IMMEDIATE transaction run by txn(), retried when SQLite reports the
 * database busy. Rows are checked as they are read: a damaged row gives -EIO.
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
 *
 * Invariant kept by every size change: no slice shows data past the file's
 * size, so bytes past the end read as zeros after any extension.
 */
#include "clock.h"
#include "meta.h"
#include "meta_journal.h"
#include "slice.h"

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
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define SCHEMA_VERSION META_SCHEMA_VERSION
#define APPLICATION_ID 0x46455252 /* "FERR" */
#define BUSY_TIMEOUT_MS 5000
#define TXN_TRIES 8
#define CKPT_FRAMES 1000 /* SQLite's own wal_autocheckpoint default */
/* The WAL's bound, whatever the load: a commit that finds it this long
 * checkpoints itself (see wal_grown). ~33 MB with 4 KiB pages. */
#define WAL_FRAMES_MAX (8 * CKPT_FRAMES)
/* After a WAL restart its file is cut back to this (journal_size_limit). */
#define WAL_SIZE_LIMIT "33554432"
#define READDIR_PAGE 128
#define PURGE_BATCH 64
#define MAX_DEPTH (1 << 20) /* a longer parent walk means a loop */
#define SYMLINK_MAX 4095
/* Chunk indexes are uint32_t, which bounds a file's size. */
#define MAX_FILE_SIZE ((uint64_t)META_CHUNK_SIZE << 32)

#define INODE_COLS                                                                          \
	"ino, mode, uid, gid, rdev, nlink, size, atime_sec, atime_nsec, mtime_sec, mtime_nsec," \
	" ctime_sec, ctime_nsec"
#define INODE_COLS_I                                                                        \
	"i.ino, i.mode, i.uid, i.gid, i.rdev, i.nlink, i.size, i.atime_sec, i.atime_nsec,"      \
	" i.mtime_sec, i.mtime_nsec, i.ctime_sec, i.ctime_nsec"

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

enum st {
	ST_BEGIN,
	ST_COMMIT,
	ST_ROLLBACK,
	ST_SAVEPOINT,
	ST_SAVEPOINT_RELEASE,
	ST_SAVEPOINT_ROLLBACK,
	ST_JOURNAL_GET,
	ST_JOURNAL_PUT,
	ST_GETATTR,
	ST_LOOKUP,
	ST_INODE_INSERT,
	ST_INODE_UPDATE,
	ST_INODE_DELETE,
	ST_DENTRY_GET,
	ST_DENTRY_INSERT,
	ST_DENTRY_DELETE,
	ST_DENTRY_MOVE,
	ST_DENTRY_SETINO,
	ST_DENTRY_PARENT,
	ST_DIR_HAS_CHILD,
	ST_READDIR,
	ST_NEXT_INO,
	ST_NEXT_COOKIE,
	ST_COUNTERS_GET,
	ST_COUNTERS_PUT,
	ST_NEXT_SLICE,
	ST_SYMLINK_INSERT,
	ST_SYMLINK_GET,
	ST_SYMLINK_DELETE,
	ST_ORPHAN_ADD,
	ST_ORPHAN_DELETE,
	ST_ORPHAN_LIST,
	ST_XATTR_GET,
	ST_XATTR_PUT,
	ST_XATTR_DELETE,
	ST_XATTR_LIST,
	ST_XATTR_DELETE_ALL,
	ST_SLICE_LIST,
	ST_SLICE_INSERT,
	ST_SLICE_GC,
	ST_SLICE_DROP,
	ST_STATFS,
	ST_VOLUME_GET,
	ST_SEQ_GET,
	ST_TIMES_SEQ_GET,
	ST_TIMES_SEQ_PUT,
	ST_TIMES_SEQ_DELETE,
	ST_SEQ_PUT,
	ST_SEQ_FLOOR,
	ST_EPOCH_NEXT,
	ST_SLICE_LIST_SEQ,
	ST_SLICE_DELETE_SEQ,
	ST_GC_ADD_UNREF,
	ST_GC_LIST,
	ST_GC_FORGET,
	ST_GC_PENDING,
	ST_GC_MARK,
	ST_GC_LAST_MARK,
	ST_COUNT
};

static const char *const st_sql[ST_COUNT] = {
	[ST_BEGIN] = "BEGIN IMMEDIATE",
	[ST_COMMIT] = "COMMIT",
	[ST_ROLLBACK] = "ROLLBACK",
	[ST_SAVEPOINT] = "SAVEPOINT j",
	[ST_SAVEPOINT_RELEASE] = "RELEASE j",
	[ST_SAVEPOINT_ROLLBACK] = "ROLLBACK TO j",
	[ST_JOURNAL_GET] = "SELECT seq FROM journal WHERE id = 1",
	[ST_JOURNAL_PUT] = "UPDATE journal SET seq = ?1 WHERE id = 1",
	[ST_GETATTR] = "SELECT " INODE_COLS " FROM inode WHERE ino = ?1",
	[ST_LOOKUP] = "SELECT d.ino, " INODE_COLS_I " FROM dentry d LEFT JOIN inode i"
		      " ON i.ino = d.ino WHERE d.parent = ?1 AND d.name = ?2",
	[ST_INODE_INSERT] = "INSERT INTO inode(" INODE_COLS ") VALUES"
			    " (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)",
	[ST_INODE_UPDATE] = "UPDATE inode SET mode = ?2, uid = ?3, gid = ?4, rdev = ?5,"
			    " nlink = ?6, size = ?7, atime_sec = ?8, atime_nsec = ?9,"
			    " mtime_sec = ?10, mtime_nsec = ?11, ctime_sec = ?12,"
			    " ctime_nsec = ?13 WHERE ino = ?1",
	[ST_INODE_DELETE] = "DELETE FROM inode WHERE ino = ?1",
	[ST_DENTRY_GET] = "SELECT ino FROM dentry WHERE parent = ?1 AND name = ?2",
	/* Taken (parent, name): no row changed (an error would abort a
	 * PostgreSQL transaction). */
	[ST_DENTRY_INSERT] = "INSERT INTO dentry(parent, name, ino, cookie)"
			     " VALUES (?1, ?2, ?3, ?4) ON CONFLICT(parent, name) DO NOTHING",
	[ST_DENTRY_DELETE] = "DELETE FROM dentry WHERE parent = ?1 AND name = ?2",
	[ST_DENTRY_MOVE] = "UPDATE dentry SET parent = ?3, name = ?4"
			   " WHERE parent = ?1 AND name = ?2",
	[ST_DENTRY_SETINO] = "UPDATE dentry SET ino = ?3 WHERE parent = ?1 AND name = ?2",
	[ST_DENTRY_PARENT] = "SELECT parent FROM dentry WHERE ino = ?1 LIMIT 1",
	[ST_DIR_HAS_CHILD] = "SELECT 1 FROM dentry WHERE parent = ?1 LIMIT 1",
	[ST_READDIR] = "SELECT d.name, d.cookie, d.ino, " INODE_COLS_I " FROM dentry d"
		       " LEFT JOIN inode i ON i.ino = d.ino WHERE d.parent = ?1"
		       " AND d.cookie > ?2 ORDER BY d.cookie LIMIT ?3",
	[ST_NEXT_INO] = "UPDATE counters SET next_ino = next_ino + 1,"
			" next_cookie = next_cookie + 1 WHERE id = 1"
			" RETURNING next_ino - 1, next_cookie - 1",
	[ST_NEXT_COOKIE] = "UPDATE counters SET next_cookie = next_cookie + 1 WHERE id = 1"
			   " RETURNING next_cookie - 1",
	[ST_COUNTERS_GET] = "SELECT next_ino, next_cookie FROM counters WHERE id = 1",
	[ST_COUNTERS_PUT] = "UPDATE counters SET next_ino = ?1, next_cookie = ?2 WHERE id = 1",
	[ST_NEXT_SLICE] = "UPDATE counters SET next_slice = next_slice + ?1 WHERE id = 1"
			  " AND next_slice >= 1 AND next_slice <= 9223372036854775807 - ?1"
			  " RETURNING next_slice - ?1",
	[ST_SYMLINK_INSERT] = "INSERT INTO symlink(ino, target) VALUES (?1, ?2)",
	[ST_SYMLINK_GET] = "SELECT target FROM symlink WHERE ino = ?1",
	[ST_SYMLINK_DELETE] = "DELETE FROM symlink WHERE ino = ?1",
	[ST_ORPHAN_ADD] = "INSERT INTO orphan(ino) VALUES (?1) ON CONFLICT(ino) DO NOTHING",
	[ST_ORPHAN_DELETE] = "DELETE FROM orphan WHERE ino = ?1",
	[ST_ORPHAN_LIST] = "SELECT ino FROM orphan WHERE ino > ?1 ORDER BY ino LIMIT ?2",
	[ST_XATTR_GET] = "SELECT value FROM xattr WHERE ino = ?1 AND name = ?2",
	[ST_XATTR_PUT] = "INSERT INTO xattr(ino, name, value) VALUES (?1, ?2, ?3)"
			 " ON CONFLICT(ino, name) DO UPDATE SET value = excluded.value",
	[ST_XATTR_DELETE] = "DELETE FROM xattr WHERE ino = ?1 AND name = ?2",
	[ST_XATTR_LIST] = "SELECT name FROM xattr WHERE ino = ?1 ORDER BY name",
	[ST_XATTR_DELETE_ALL] = "DELETE FROM xattr WHERE ino = ?1",
	[ST_SLICE_LIST] = "SELECT id, size, off, pos, len FROM slice"
			  " WHERE ino = ?1 AND chunk = ?2 ORDER BY seq",
	[ST_SLICE_INSERT] = "INSERT INTO slice(ino, chunk, id, size, off, pos, len)"
			    " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
	/* Slices of chunks [?2, ?3] of ?1 that no other row references, freed
	 * at ?4 (unix s). */
	[ST_SLICE_GC] = "INSERT INTO gc_slice(id, size, since)"
			" SELECT s.id, MAX(s.size), ?4"
			" FROM slice s WHERE s.ino = ?1 AND s.chunk BETWEEN ?2 AND ?3"
			" AND s.id <> 0 AND NOT EXISTS (SELECT 1 FROM slice t WHERE t.id = s.id"
			" AND NOT (t.ino = ?1 AND t.chunk BETWEEN ?2 AND ?3)) GROUP BY s.id"
			" ON CONFLICT(id) DO NOTHING",
	[ST_SLICE_DROP] = "DELETE FROM slice WHERE ino = ?1 AND chunk BETWEEN ?2 AND ?3",
	[ST_STATFS] = "SELECT (SELECT CAST(COALESCE(SUM(size), 0) AS BIGINT) FROM inode"
		      " WHERE (mode & 61440) = 32768), (SELECT COUNT(*) FROM inode)",
	[ST_VOLUME_GET] = "SELECT uuid, block_size, storage_url, created_at, s3_http"
			  " FROM volume WHERE id = 1",
	[ST_SEQ_GET] = "SELECT seq FROM commit_seq WHERE ino = ?1",
	[ST_TIMES_SEQ_GET] = "SELECT seq FROM times_seq WHERE ino = ?1",
	[ST_TIMES_SEQ_PUT] = "INSERT INTO times_seq(ino, seq) VALUES (?1, ?2)"
			     " ON CONFLICT(ino) DO UPDATE SET seq = excluded.seq",
	[ST_TIMES_SEQ_DELETE] = "DELETE FROM times_seq WHERE ino = ?1",
	[ST_SEQ_PUT] = "INSERT INTO commit_seq(ino, seq) VALUES (?1, ?2)"
		       " ON CONFLICT(ino) DO UPDATE SET seq = excluded.seq",
	[ST_SEQ_FLOOR] = "INSERT INTO commit_seq(ino, seq) VALUES (?1, ?2) ON CONFLICT(ino)"
			 " DO UPDATE SET seq = excluded.seq WHERE excluded.seq > commit_seq.seq",
	[ST_EPOCH_NEXT] = "INSERT INTO seq_epoch(id, epoch) VALUES (1, 1) ON CONFLICT(id)"
			  " DO UPDATE SET epoch = seq_epoch.epoch + 1 RETURNING epoch",
	[ST_SLICE_LIST_SEQ] = "SELECT seq, id, size, off, pos, len FROM slice"
			      " WHERE ino = ?1 AND chunk = ?2 ORDER BY seq",
	[ST_SLICE_DELETE_SEQ] = "DELETE FROM slice WHERE seq = ?1",
	/* Slice ?1 (of ?2 bytes) if no row references it any more, freed at
	 * ?3 (unix s). */
	[ST_GC_ADD_UNREF] = "INSERT INTO gc_slice(id, size, since) SELECT ?1, ?2, ?3"
			    " WHERE ?1 <> 0 AND NOT EXISTS (SELECT 1 FROM slice WHERE id = ?1)"
			    " ON CONFLICT(id) DO NOTHING",
	[ST_GC_LIST] = "SELECT id, size FROM gc_slice WHERE seen <= ?1 AND since <= ?2"
		       " ORDER BY seen, id LIMIT ?3",
	[ST_GC_FORGET] = "DELETE FROM gc_slice WHERE id = ?1",
	[ST_GC_PENDING] = "SELECT COUNT(*), CAST(COALESCE(SUM(size), 0) AS BIGINT) FROM gc_slice",
	[ST_GC_MARK] = "UPDATE gc_slice SET seen = ?1 WHERE seen IS NULL",
	[ST_GC_LAST_MARK] = "SELECT COALESCE(MAX(seen), 0) FROM gc_slice",
};

/* Added after schema version 1 shipped: created when missing (meta_open). */
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
	"DELETE FROM delslice";

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

#define HOT_DIRS 16

struct conn {
	sqlite3 *db;
	sqlite3_stmt *st[ST_COUNT];
	struct meta *m;
	struct conn *prev, *next;
	struct timespec busy_since; /* when the current busy wait began */
	int batched;                /* synchronous=NORMAL is set on db */
};

struct meta {
	char *path;
	_Atomic int batched;  /* commits not synced one by one (meta_set_batched) */
	_Atomic int dir_synced; /* meta_sync() synced the directory holding the WAL */
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
	 * here, woken at once, instead of polling SQLite's file lock. */
	pthread_mutex_t write_lock;
	struct conn *conns;
	/* Batched mode checkpoints the WAL on a thread of its own, so no
	 * commit pays for copying pages and two fsyncs (see ckpt_main). */
	pthread_mutex_t ckpt_lock;
	pthread_cond_t ckpt_cond;
	pthread_t ckpt_thread;
	int ckpt_started, ckpt_wanted, ckpt_stop; /* under ckpt_lock */
	_Atomic int ckpt_paused;  /* tests: the thread skips its checkpoints */
	_Atomic uint64_t ckpt_inline; /* checkpoints commits had to make */
	/* Cross-process: held shared by a deferring daemon while it opens a
	 * batch and exclusive by every other writer around its transaction,
	 * so a stream of batches never starves them (see batch_begin). -1:
	 * none (the volume's directory is read-only). */
	int intent_fd;
	int64_t intent_asked_ns; /* intent_wanted()'s last look (write_lock) */
	/* Deferred commits (meta_journal_open); all under write_lock. */
	int jfd;               /* the journal, -1: commits are immediate */
	struct conn *bc;       /* the batch's connection, owned here */
	int batch_open;        /* bc is inside BEGIN IMMEDIATE */
	_Atomic int batch_dirty; /* batch_open, for reads that take no lock */
	struct timespec batch_since; /* monotonic: when the batch opened */
	uint64_t batch_records;
	uint64_t jseq;         /* the last seq appended to the journal */
	uint64_t applied;      /* the last seq the database holds */
	off_t jsize;           /* the journal's length */
	_Atomic int stuck;     /* see batch_restore() */
	int flush_ms;
	pthread_cond_t flush_cond;
	pthread_t flush_thread;
	int flush_started, flush_stop;
	struct meta_journal_stats js;
	/* Directories whose rows the open batch changed, held here and written
	 * once, when the batch commits (hot_flush), instead of at every entry
	 * made or removed in them: a create storm in one directory would
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
};

/* ---- small helpers ---------------------------------------------------- */

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

/* A deferred change runs with the time it records in the journal, and its
 * replay with the recorded one, so both come out the same. */
static _Thread_local const struct timespec *tl_now;

static struct timespec now_ts(void)
{
	struct timespec ts;

	if (tl_now != NULL)
		return *tl_now;
	clock_gettime(CLOCK_REALTIME, &ts);
	return ts;
}

static int ts_valid(const struct timespec *ts)
{
	return ts->tv_nsec >= 0 && ts->tv_nsec < 1000000000L;
}

static int mode_type_valid(uint32_t mode)
{
	switch (mode & S_IFMT) {
	case S_IFREG:
	case S_IFDIR:
	case S_IFLNK:
	case S_IFIFO:
	case S_IFSOCK:
	case S_IFCHR:
	case S_IFBLK:
		return 1;
	default:
		return 0;
	}
}

static int name_check(const char *name, size_t *len)
{
	size_t n;

	if (name == NULL)
		return -EINVAL;
	n = strnlen(name, META_NAME_MAX + 1);
	if (n > META_NAME_MAX)
		return -ENAMETOOLONG;
	if (n == 0 || memchr(name, '/', n) != NULL || strcmp(name, ".") == 0 ||
	    strcmp(name, "..") == 0)
		return -EINVAL;
	*len = n;
	return 0;
}

/* An inode number that can be in the table (SQLite integers are signed). */
static int ino_ok(uint64_t ino)
{
	return ino != 0 && ino <= INT64_MAX;
}

/* ---- connections and statements --------------------------------------- */

static void conn_free(struct conn *c)
{
	size_t i;

	if (c == NULL)
		return;
	for (i = 0; i < ST_COUNT; i++)
		sqlite3_finalize(c->st[i]);
	sqlite3_close(c->db);
	free(c);
}

static void conn_unlink(struct meta *m, struct conn *c)
{
	pthread_mutex_lock(&m->lock);
	if (c->prev)
		c->prev->next = c->next;
	else
		m->conns = c->next;
	if (c->next)
		c->next->prev = c->prev;
	pthread_mutex_unlock(&m->lock);
}

/* The key's destructor: the thread is exiting. */
static void conn_thread_exit(void *p)
{
	struct conn *c = p;

	conn_unlink(c->m, c);
	conn_free(c);
}

/*
 * SQLite's own busy_timeout sleeps at least 1 ms per retry, which is longer
 * than most of our transactions hold the lock (the other process is
 * typically ferry-reconciler committing one job). Poll from 20 us up,
 * doubling to 1 ms, for at most BUSY_TIMEOUT_MS in all.
 */
static int busy_wait(void *arg, int count)
{
	struct conn *c = arg;
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

static int conn_open(const char *path, struct conn **out)
{
	struct conn *c;
	int rc;

	c = calloc(1, sizeof(*c));
	if (c == NULL)
		return -ENOMEM;
	rc = sqlite3_open_v2(path, &c->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX, NULL);
	if (rc != SQLITE_OK) {
		rc = (rc == SQLITE_CANTOPEN && access(path, F_OK) != 0 && errno == ENOENT) ?
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
	rc = sqlite3_prepare_v3(c->db, st_sql[ST_ROLLBACK], -1, SQLITE_PREPARE_PERSISTENT,
				&c->st[ST_ROLLBACK], NULL);
	if (rc != SQLITE_OK) {
		rc = db_err(rc) == -ENOMEM ? -ENOMEM : -EIO;
		goto fail;
	}
	*out = c;
	return 0;
fail:
	conn_free(c);
	return rc;
}

static int conn_get(struct meta *m, struct conn **out);

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
	struct meta *m = arg;

	if (frames >= WAL_FRAMES_MAX) {
		sqlite3_wal_checkpoint_v2(db, name, SQLITE_CHECKPOINT_PASSIVE, NULL, NULL);
		atomic_fetch_add(&m->ckpt_inline, 1);
	} else if (frames >= CKPT_FRAMES) {
		pthread_mutex_lock(&m->ckpt_lock);
		m->ckpt_wanted = 1;
		pthread_cond_signal(&m->ckpt_cond);
		pthread_mutex_unlock(&m->ckpt_lock);
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
	struct conn *c = NULL;

	pthread_mutex_lock(&m->ckpt_lock);
	while (!m->ckpt_stop) {
		struct timespec until;

		if (!m->ckpt_wanted) {
			mono_deadline_ms(&until, 1000);
			pthread_cond_timedwait(&m->ckpt_cond, &m->ckpt_lock, &until);
			if (m->ckpt_stop)
				break;
		}
		m->ckpt_wanted = 0;
		pthread_mutex_unlock(&m->ckpt_lock);
		if (!atomic_load(&m->ckpt_paused) && (c != NULL || conn_get(m, &c) == 0)) {
			int frames = 0, done = 0;

			/* Most pages are copied while writers go on... */
			sqlite3_wal_checkpoint_v2(c->db, NULL, SQLITE_CHECKPOINT_PASSIVE, &frames,
						  &done);
			/* ...but the WAL starts over from its beginning only once
			 * a checkpoint has caught up with it, which it never does
			 * while commits keep coming. So finish with this process's
			 * writers held off for the few frames that came meanwhile. */
			if (frames > done) {
				pthread_mutex_lock(&m->write_lock);
				sqlite3_wal_checkpoint_v2(c->db, NULL, SQLITE_CHECKPOINT_PASSIVE,
							  NULL, NULL);
				pthread_mutex_unlock(&m->write_lock);
			}
		}
		pthread_mutex_lock(&m->ckpt_lock);
	}
	pthread_mutex_unlock(&m->ckpt_lock);
	return NULL;
}

/*
 * Batched: WAL commits reach the page cache (they survive a killed process)
 * and stable storage at the next meta_sync() or checkpoint. Applied by the
 * thread that owns the connection, before its next write transaction, so a
 * connection opened before meta_set_batched() (meta_open's own) follows too.
 */
static int conn_sync_mode(struct conn *c)
{
	int want = atomic_load(&c->m->batched) ? 1 : 0;

	if (c->batched == want)
		return 0;
	int rc = sqlite3_exec(c->db,
			      want ? "PRAGMA synchronous = NORMAL; PRAGMA wal_autocheckpoint = 0" :
				     "PRAGMA synchronous = FULL; PRAGMA wal_autocheckpoint = 1000",
			      NULL, NULL, NULL);

	if (rc != SQLITE_OK)
		return db_err(rc) == -ENOMEM ? -ENOMEM : -EIO;
	sqlite3_wal_hook(c->db, want ? wal_grown : NULL, c->m);
	c->batched = want;
	return 0;
}

static int conn_get(struct meta *m, struct conn **out)
{
	struct conn *c = pthread_getspecific(m->key);
	int rc;

	if (c != NULL) {
		*out = c;
		return 0;
	}
	rc = conn_open(m->path, &c);
	if (rc)
		return rc;
	c->m = m;
	pthread_mutex_lock(&m->lock);
	c->next = m->conns;
	if (m->conns)
		m->conns->prev = c;
	m->conns = c;
	pthread_mutex_unlock(&m->lock);
	if (pthread_setspecific(m->key, c) != 0) {
		conn_unlink(m, c);
		conn_free(c);
		return -ENOMEM;
	}
	*out = c;
	return 0;
}

static int stmt(struct conn *c, enum st id, sqlite3_stmt **out)
{
	if (c->st[id] == NULL) {
		int rc = sqlite3_prepare_v3(c->db, st_sql[id], -1, SQLITE_PREPARE_PERSISTENT,
					    &c->st[id], NULL);
		if (rc != SQLITE_OK) {
			c->st[id] = NULL;
			return db_err(rc);
		}
	}
	*out = c->st[id];
	return 0;
}

static void stmt_done(sqlite3_stmt *st)
{
	if (st != NULL) {
		sqlite3_reset(st);
		sqlite3_clear_bindings(st);
	}
}

/* 1: a row, 0: done, <0: error. */
static int step(sqlite3_stmt *st)
{
	int rc = sqlite3_step(st);

	if (rc == SQLITE_ROW)
		return 1;
	if (rc == SQLITE_DONE)
		return 0;
	return db_err(rc);
}

static int bind_i64(sqlite3_stmt *st, int i, int64_t v)
{
	return sqlite3_bind_int64(st, i, v) == SQLITE_OK ? 0 : -EIO;
}

static int bind_ints(sqlite3_stmt *st, int n, const int64_t *v)
{
	int i;

	for (i = 0; i < n; i++)
		if (bind_i64(st, i + 1, v[i]))
			return -EIO;
	return 0;
}

static int bind_blob(sqlite3_stmt *st, int i, const void *p, size_t n)
{
	/* A NULL pointer would bind SQL NULL; an empty value is an empty blob. */
	if (n > INT32_MAX)
		return -EIO;
	return sqlite3_bind_blob(st, i, p ? p : "", (int)n, SQLITE_STATIC) == SQLITE_OK ? 0 : -EIO;
}

/* Runs a statement with integer parameters that returns no rows. */
static int run_ints(struct conn *c, enum st id, int n, const int64_t *v)
{
	sqlite3_stmt *st = NULL;
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

/* Runs a statement with integer parameters whose first row's first column
 * is an integer in [lo, hi]. -ENOENT if there is no row (or it is NULL and
 * null_ok is set), -EIO for anything else. */
static int query_int(struct conn *c, enum st id, int n, const int64_t *v, int64_t lo, int64_t hi,
		     int null_ok, int64_t *out)
{
	sqlite3_stmt *st = NULL;
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
	if (rc == 0) {
		rc = -ENOENT;
		goto out;
	}
	if (sqlite3_column_type(st, 0) == SQLITE_NULL && null_ok) {
		rc = -ENOENT;
		goto out;
	}
	if (sqlite3_column_type(st, 0) != SQLITE_INTEGER) {
		rc = -EIO;
		goto out;
	}
	*out = sqlite3_column_int64(st, 0);
	rc = (*out < lo || *out > hi) ? -EIO : 0;
out:
	stmt_done(st);
	return rc;
}

static int col_int(sqlite3_stmt *st, int i, int64_t lo, int64_t hi, int64_t *out)
{
	if (sqlite3_column_type(st, i) != SQLITE_INTEGER)
		return -EIO;
	*out = sqlite3_column_int64(st, i);
	return (*out < lo || *out > hi) ? -EIO : 0;
}

/* Reads the 13 inode columns starting at column i0, checking each. */
static int row_attr(sqlite3_stmt *st, int i0, struct meta_attr *a)
{
	int64_t v[13];
	static const int64_t lo[13] = { 1, 0, 0, 0, 0, 0, 0, INT64_MIN, 0, INT64_MIN, 0,
					INT64_MIN, 0 };
	static const int64_t hi[13] = { INT64_MAX, S_IFMT | 07777, UINT32_MAX, UINT32_MAX,
					INT64_MAX, UINT32_MAX, (int64_t)MAX_FILE_SIZE,
					INT64_MAX, 999999999, INT64_MAX, 999999999,
					INT64_MAX, 999999999 };
	int i;

	for (i = 0; i < 13; i++)
		if (col_int(st, i0 + i, lo[i], hi[i], &v[i]))
			return -EIO;
	if (!mode_type_valid((uint32_t)v[1]))
		return -EIO;
	memset(a, 0, sizeof(*a));
	a->ino = (uint64_t)v[0];
	a->mode = (uint32_t)v[1];
	a->uid = (uint32_t)v[2];
	a->gid = (uint32_t)v[3];
	a->rdev = (uint64_t)v[4];
	a->nlink = (uint32_t)v[5];
	a->size = (uint64_t)v[6];
	a->atime.tv_sec = v[7];
	a->atime.tv_nsec = v[8];
	a->mtime.tv_sec = v[9];
	a->mtime.tv_nsec = v[10];
	a->ctime.tv_sec = v[11];
	a->ctime.tv_nsec = v[12];
	if (S_ISDIR(a->mode) && a->size != 0)
		return -EIO;
	return 0;
}

static int bind_attr(sqlite3_stmt *st, const struct meta_attr *a)
{
	const int64_t v[13] = { (int64_t)a->ino,	  a->mode,	     a->uid,
				a->gid,			  (int64_t)a->rdev,  a->nlink,
				(int64_t)a->size,	  a->atime.tv_sec,   a->atime.tv_nsec,
				a->mtime.tv_sec,	  a->mtime.tv_nsec,  a->ctime.tv_sec,
				a->ctime.tv_nsec };

	return bind_ints(st, 13, v);
}

/* Reads a name-like blob column (1..META_NAME_MAX bytes, no NUL or '/'). */
static int col_name(sqlite3_stmt *st, int i, char *buf, size_t max)
{
	const void *p;
	int n;

	if (sqlite3_column_type(st, i) != SQLITE_BLOB && sqlite3_column_type(st, i) != SQLITE_TEXT)
		return -EIO;
	p = sqlite3_column_blob(st, i);
	n = sqlite3_column_bytes(st, i);
	if (p == NULL || n <= 0 || (size_t)n > max || memchr(p, '\0', (size_t)n) != NULL)
		return -EIO;
	memcpy(buf, p, (size_t)n);
	buf[n] = '\0';
	return 0;
}

/* ---- transactions ------------------------------------------------------ */

typedef int (*txn_fn)(struct conn *c, void *arg);

static int exec_st(struct conn *c, enum st id)
{
	return run_ints(c, id, 0, NULL);
}

/*
 * Ends a transaction that failed. A transaction left open would keep the
 * database's write lock from every other thread and process, for good, so
 * if even ROLLBACK fails (short of memory, say) the connection goes: closing
 * it rolls back, and this thread opens another when it next needs one.
 * Returns false if c was closed.
 */
static bool txn_abort(struct meta *m, struct conn *c)
{
	if (sqlite3_get_autocommit(c->db))
		return true;
	exec_st(c, ST_ROLLBACK);
	if (sqlite3_get_autocommit(c->db))
		return true;
	pthread_setspecific(m->key, NULL);
	conn_unlink(m, c);
	conn_free(c);
	return false;
}

/*
 * The intent file holds two OFD locks, one byte each:
 *  INTENT_BYTE, the intent lock: held exclusively by a non-deferring writer
 *    around its transaction, shared for a moment by a deferring daemon
 *    opening its batch (see batch_begin);
 *  BATCH_BYTE, held exclusively by a deferring daemon while its batch is
 *    open. A writer that holds the intent lock waits on it (batch_wait)
 *    instead of polling SQLite's lock (busy_wait sleeps up to 1 ms a try):
 *    the kernel wakes it the moment the batch commits.
 * Every lock request waits for its turn unless said otherwise.
 */
#define INTENT_BYTE 0
#define BATCH_BYTE 1

static int intent_range(struct meta *m, int cmd, short type, off_t byte)
{
	struct flock fl = { .l_type = type, .l_whence = SEEK_SET, .l_start = byte, .l_len = 1 };
	int rc;

	if (m->intent_fd < 0)
		return 0;
	while ((rc = fcntl(m->intent_fd, cmd, &fl)) < 0 && errno == EINTR)
		;
	if (rc == 0 && cmd == F_OFD_GETLK)
		return fl.l_type != F_UNLCK;
	return rc;
}

static void intent_lock(struct meta *m, short type)
{
	intent_range(m, F_OFD_SETLKW, type, INTENT_BYTE);
}

/* Another writer waits for the database (holds the intent lock). Asked at
 * most once per INTENT_ASK_NS (write_lock held): asking is a system call,
 * and a burst of creates would ask once per file; the writer waits at most
 * that much longer (and never past the flusher's next round). */
#define INTENT_ASK_NS 1000000LL
static bool intent_wanted(struct meta *m)
{
	struct timespec now;
	int64_t ns;

	clock_gettime(CLOCK_MONOTONIC, &now);
	ns = (int64_t)now.tv_sec * 1000000000LL + now.tv_nsec;
	if (ns - m->intent_asked_ns < INTENT_ASK_NS)
		return false;
	m->intent_asked_ns = ns;
	return intent_range(m, F_OFD_GETLK, F_RDLCK, INTENT_BYTE) > 0;
}

/* The batch is open (F_WRLCK, which nobody else takes: a second deferring
 * daemon is refused) or closed (F_UNLCK). */
static void batch_lock(struct meta *m, short type)
{
	intent_range(m, F_OFD_SETLK, type, BATCH_BYTE);
}

/* Waits until no batch is open (the intent lock held: none opens next). */
static void batch_wait(struct meta *m)
{
	if (intent_range(m, F_OFD_SETLKW, F_RDLCK, BATCH_BYTE) == 0)
		intent_range(m, F_OFD_SETLK, F_UNLCK, BATCH_BYTE);
}

/* Runs fn inside BEGIN IMMEDIATE ... COMMIT, retrying when busy. fn returns
 * 0 to commit or a negative errno to roll back; it must be safe to run again
 * (it may be, after -EAGAIN). */
static int txn_now(struct meta *m, txn_fn fn, void *arg)
{
	struct conn *c;
	int rc, tries;

	rc = conn_get(m, &c);
	if (rc)
		return rc;
	rc = conn_sync_mode(c);
	if (rc)
		return rc;
	pthread_mutex_lock(&m->write_lock);
	intent_lock(m, F_WRLCK);
	batch_wait(m);
	for (tries = 1;; tries++) {
		rc = exec_st(c, ST_BEGIN);
		if (rc == 0) {
			rc = fn(c, arg);
			if (rc == 0 && (rc = exec_st(c, ST_COMMIT)) == 0)
				atomic_fetch_add(&m->commits_made, 1);
			if (rc != 0 && !txn_abort(m, c)) {
				/* Its connection is gone: no retry on it. */
				if (rc == -EAGAIN)
					rc = -EIO;
				break;
			}
			if (rc == 0)
				break;
		}
		if (rc != -EAGAIN || tries >= TXN_TRIES)
			break;
		/* busy_wait() already waited; back off a little more. */
		nanosleep(&(struct timespec){ 0, 1000000L << (tries < 6 ? tries : 6) }, NULL);
	}
	intent_lock(m, F_UNLCK);
	pthread_mutex_unlock(&m->write_lock);
	return rc == -EAGAIN ? -EIO : rc;
}

/*
 * ---- deferred commits (meta_journal_open) ----
 *
 * The batch is one BEGIN IMMEDIATE transaction on m->bc, open from the
 * first change after a commit until the flusher (or a caller that needs
 * the changes committed) commits it. Each change runs in a savepoint, so a
 * refused one (EEXIST, ENOTEMPTY, ...) leaves the rest; a change that went
 * through is appended to the journal before write_lock is let go, so the
 * journal's order is the order the changes were made in. The commit also
 * records the last seq it holds (table journal), and then the journal is
 * cut back to nothing: what it held is in the database.
 *
 * SQLite lets one writer in at a time and another process's writer polls
 * for its turn (busy_wait); batches opened back to back would starve it. So
 * such writers hold the intent lock exclusively around their transaction
 * (txn_now), and a batch opens only with the lock taken shared for a moment:
 * a waiting writer goes first.
 */
#define BATCH_RECORDS_MAX 4096
#define JOURNAL_CUT_BYTES (4u << 20)
#define J_RESULT 11 /* the record's slot for the change's result (a new ino) */

static _Thread_local int tl_replaying; /* batch_run() journals nothing */
/* The journal seq of the change being made (0: not a journaled one). */
static _Thread_local uint64_t tl_seq;

static void batch_closed(struct meta *m)
{
	if (m->batch_open)
		batch_lock(m, F_UNLCK);
	m->batch_open = 0;
	atomic_store(&m->batch_dirty, 0);
	m->batch_records = 0;
	m->nhot = 0; /* written by a commit, or rolled back with the batch */
	m->ctr = (struct ctr){ 0 };
}

static int batch_restore(struct meta *m);
static int hot_flush(struct meta *m);

static void batch_lost(struct meta *m);

/* SQLite rolled the open batch back on its own (a read that failed with
 * SQLITE_NOMEM or SQLITE_IOERR): make it again before anything uses it. */
static void batch_check(struct meta *m)
{
	if (m->batch_open && !tl_replaying && sqlite3_get_autocommit(m->bc->db))
		batch_lost(m);
}

static int batch_begin(struct meta *m)
{
	int rc, tries;

	batch_check(m);
	if (m->batch_open)
		return 0;
	if (m->stuck && !tl_replaying) {
		rc = batch_restore(m);
		if (rc || m->batch_open)
			return rc;
	}
	if (m->bc == NULL) {
		rc = conn_open(m->path, &m->bc);
		if (rc)
			return rc;
		m->bc->m = m;
	}
	rc = conn_sync_mode(m->bc);
	if (rc)
		return rc;
	intent_lock(m, F_RDLCK);
	for (tries = 1;; tries++) {
		rc = exec_st(m->bc, ST_BEGIN);
		if (rc != -EAGAIN || tries >= TXN_TRIES)
			break;
		nanosleep(&(struct timespec){ 0, 1000000L << (tries < 6 ? tries : 6) }, NULL);
	}
	if (rc == 0)
		batch_lock(m, F_WRLCK);
	intent_lock(m, F_UNLCK);
	if (rc)
		return rc == -EAGAIN ? -EIO : rc;
	m->batch_open = 1;
	atomic_store(&m->batch_dirty, 1);
	clock_gettime(CLOCK_MONOTONIC, &m->batch_since);
	pthread_cond_signal(&m->flush_cond);
	return 0;
}

/* Appends r (its seq and time filled) at the journal's end; a short or
 * failed write is cut off again, so no torn record hides later ones. */
static int journal_append(struct meta *m, struct mj_rec *r)
{
	unsigned char small[1024], *buf = small;
	size_t n = mj_size(r);
	ssize_t w;
	int rc = 0;

	if (n > sizeof(small) && (buf = malloc(n)) == NULL)
		return -ENOMEM;
	if (mj_encode(r, buf, n) != n) {
		rc = -EINVAL;
		goto out;
	}
	do
		w = pwrite(m->jfd, buf, n, m->jsize);
	while (w < 0 && errno == EINTR);
	if (w == (ssize_t)n) {
		m->jsize += (off_t)n;
		goto out;
	}
	rc = w < 0 ? -errno : -ENOSPC;
	if (ftruncate(m->jfd, m->jsize) < 0 && rc == -ENOSPC)
		rc = -EIO;
out:
	if (buf != small)
		free(buf);
	return rc;
}

static int journal_replay(struct meta *m, uint64_t *count);

/*
 * Puts what the journal holds past the last commit back into a new batch
 * (write_lock held, no batch open). If that fails (the disk under the
 * database is full, say), m is stuck: each change first tries this again
 * and fails with its error while it does, so nothing acknowledged is
 * dropped by a commit that would skip it.
 */
static int batch_restore(struct meta *m)
{
	uint64_t n;
	int rc;

	m->stuck = 0;
	if (m->jseq <= m->applied)
		return 0;
	rc = journal_replay(m, &n);
	if (rc) {
		if (m->bc != NULL && !sqlite3_get_autocommit(m->bc->db))
			exec_st(m->bc, ST_ROLLBACK);
		if (m->bc != NULL && !sqlite3_get_autocommit(m->bc->db)) {
			conn_free(m->bc);
			m->bc = NULL;
		}
		batch_closed(m);
		m->stuck = 1;
	}
	return rc;
}

/* The batch was rolled back whole (a failed commit, or SQLite gave up the
 * transaction): what the journal holds past the last commit goes back in. */
static void batch_lost(struct meta *m)
{
	if (m->bc != NULL && !sqlite3_get_autocommit(m->bc->db)) {
		exec_st(m->bc, ST_ROLLBACK);
		if (!sqlite3_get_autocommit(m->bc->db)) {
			/* Closing it rolls back; batch_begin() opens another. */
			conn_free(m->bc);
			m->bc = NULL;
		}
	}
	batch_closed(m);
	batch_restore(m);
}

/* Commits the open batch (write_lock held). On failure the batch is made
 * again from the journal and stays open: the flusher tries again. */
static int batch_commit(struct meta *m)
{
	int rc = 0;

	batch_check(m);
	if (!m->batch_open)
		return 0;
	rc = hot_flush(m);
	if (rc == 0 && m->jseq > m->applied)
		rc = run_ints(m->bc, ST_JOURNAL_PUT, 1, (const int64_t[]){ (int64_t)m->jseq });
	if (rc == 0)
		rc = exec_st(m->bc, ST_COMMIT);
	if (rc) {
		m->js.commit_failures++;
		batch_lost(m);
		return rc == -EAGAIN ? -EIO : rc;
	}
	batch_closed(m);
	atomic_fetch_add(&m->commits_made, 1);
	m->applied = m->jseq;
	m->js.batches++;
	/* Everything in it is in the database now: the next record goes at
	 * the start again, over the old ones. No truncate (on ext4 it can wait
	 * for the file system's journal, which other processes' syncs keep
	 * busy): a replay reads the new records and stops at the first bytes
	 * that are not a whole record, or skips old ones (their seqs are all
	 * committed). The file is cut back only when it has grown large. */
	if (m->jsize > JOURNAL_CUT_BYTES && ftruncate(m->jfd, 0) < 0)
		return 0; /* keeps appending: replay skips what is committed */
	m->jsize = 0;
	return 0;
}

/*
 * Runs fn in the batch (write_lock held): opens the batch if needed, a
 * savepoint around fn, and r (if any) appended to the journal once fn went
 * through (result: a value fn made that the record must carry). Without r
 * the change is one that replay cannot make again, so the batch commits
 * before this returns.
 */
static int batch_run(struct meta *m, struct mj_rec *r, const uint64_t *result, txn_fn fn,
		     void *arg)
{
	struct timespec now;
	bool journaled = false;
	/* A change that fails after writing part of itself must leave nothing
	 * behind. A savepoint around each costs two statements more than the
	 * change itself, so only a replay takes one (a record it cannot make
	 * again is skipped, the rest goes on); a live change that fails part
	 * way instead loses the whole batch, which the journal makes again
	 * without it (batch_lost). Changes fail that way only when the
	 * database does (full disk, I/O): their checks come before their
	 * writes. */
	bool savepoint = tl_replaying;
	sqlite3_int64 changes = 0;
	struct ctr ctr0;
	int rc;

	rc = batch_begin(m);
	if (rc)
		return rc;
	if (savepoint) {
		rc = exec_st(m->bc, ST_SAVEPOINT);
		if (rc)
			goto broken;
	} else {
		changes = sqlite3_total_changes64(m->bc->db) + (sqlite3_int64)m->hot_puts;
	}
	ctr0 = m->ctr; /* a change that fails takes no number */
	if (tl_replaying) {
		rc = fn(m->bc, arg);
	} else {
		clock_gettime(CLOCK_REALTIME, &now);
		tl_now = &now;
		tl_seq = r != NULL ? m->jseq + 1 : 0;
		rc = fn(m->bc, arg);
		tl_seq = 0;
		tl_now = NULL;
		if (rc == 0 && r != NULL) {
			r->seq = m->jseq + 1;
			r->now = now;
			if (result)
				r->v[J_RESULT] = *result;
			rc = journal_append(m, r);
			if (rc == 0) {
				m->jseq = r->seq;
				m->js.records++;
				m->batch_records++;
				journaled = true;
			}
		}
	}
	if (sqlite3_get_autocommit(m->bc->db))
		goto broken; /* SQLite rolled the whole batch back itself */
	if (rc) {
		m->ctr = ctr0;
		if (!savepoint) {
			if (sqlite3_total_changes64(m->bc->db) + (sqlite3_int64)m->hot_puts != changes)
				batch_lost(m); /* made again from the journal, without this one */
			return rc;
		}
		if (exec_st(m->bc, ST_SAVEPOINT_ROLLBACK) || exec_st(m->bc, ST_SAVEPOINT_RELEASE))
			goto broken;
		return rc;
	}
	if (savepoint && exec_st(m->bc, ST_SAVEPOINT_RELEASE))
		goto broken;
	if (r == NULL && !tl_replaying)
		return batch_commit(m); /* not journaled: committed, or not made */
	/* A writer of another process waits for the database: let it in now
	 * rather than at the flusher's next round. The change is journaled,
	 * so a failed commit is not its failure: the batch is made again from
	 * the journal (batch_lost) and the change commits with it later. */
	if (!tl_replaying && (m->batch_records >= BATCH_RECORDS_MAX || intent_wanted(m)))
		(void)batch_commit(m);
	return 0;
broken:
	if (rc == 0)
		rc = -EIO;
	if (!tl_replaying)
		batch_lost(m); /* makes the batch again from the journal */
	if (journaled)
		return 0; /* so this change is made (or will be: see m->stuck) */
	return rc == -EAGAIN ? -EIO : rc;
}

/* A change made through m: in the batch when m defers (journaled when r is
 * given), else in a transaction of its own. */
static int txn_rec(struct meta *m, struct mj_rec *r, const uint64_t *result, txn_fn fn,
		   void *arg)
{
	int rc;

	if (m->jfd < 0)
		return txn_now(m, fn, arg);
	pthread_mutex_lock(&m->write_lock);
	rc = batch_run(m, r, result, fn, arg);
	pthread_mutex_unlock(&m->write_lock);
	return rc;
}

static int txn(struct meta *m, txn_fn fn, void *arg)
{
	return txn_rec(m, NULL, NULL, fn, arg);
}

/*
 * The connection a read uses. While a batch is open its changes are seen
 * only on m->bc, so reads go there, under write_lock; otherwise the
 * thread's own (no lock: a change that returned before this read began has
 * either set batch_dirty or been committed). Declared with READ_CONN, so
 * write_lock goes when the variable does.
 */
static int read_conn(struct meta *m, struct conn **out)
{
	if (atomic_load(&m->batch_dirty) || atomic_load(&m->stuck)) {
		pthread_mutex_lock(&m->write_lock);
		batch_check(m);
		/* Acknowledged changes that no batch holds (the database could
		 * not take them): try again, so this read sees them. */
		if (m->stuck && !m->batch_open)
			batch_restore(m);
		if (m->batch_open) {
			*out = m->bc;
			return 0;
		}
		pthread_mutex_unlock(&m->write_lock);
	}
	return conn_get(m, out);
}

/* Called as the variable made by READ_CONN goes out of scope. */
static void read_done(struct conn **pc)
{
	struct conn *c = *pc;

	if (c != NULL && c == c->m->bc)
		pthread_mutex_unlock(&c->m->write_lock);
}
#define READ_CONN(c) struct conn *c __attribute__((cleanup(read_done))) = NULL

/* ---- rows --------------------------------------------------------------- */

static int inode_write(struct conn *c, enum st id, const struct meta_attr *a);

/* The batch's own copy of directory ino's row, or NULL. */
static const struct meta_attr *hot_find(struct conn *c, uint64_t ino)
{
	struct meta *m = c->m;

	if (m == NULL || c != m->bc)
		return NULL;
	for (unsigned i = 0; i < m->nhot; i++)
		if (m->hot[i].ino == ino)
			return &m->hot[i].a;
	return NULL;
}

/* Writes the rows held in m->hot and empties it. */
static int hot_flush(struct meta *m)
{
	int rc = 0;

	for (unsigned i = 0; i < m->nhot && rc == 0; i++)
		rc = inode_write(m->bc, ST_INODE_UPDATE, &m->hot[i].a);
	if (rc == 0 && m->ctr.held && m->ctr.dirty) {
		rc = run_ints(m->bc, ST_COUNTERS_PUT, 2,
			      (const int64_t[]){ (int64_t)m->ctr.ino, (int64_t)m->ctr.cookie });
		if (rc == 0 && sqlite3_changes(m->bc->db) != 1)
			rc = -EIO;
	}
	m->nhot = 0; /* a failure loses the batch (batch_lost), these with it */
	m->ctr.held = m->ctr.dirty = 0;
	return rc;
}

/* Holds a directory's changed row in m->hot: 1 if held, 0 if it must be
 * written now (not the batch's connection, a replay, not a directory). */
static int hot_put(struct conn *c, const struct meta_attr *a)
{
	struct meta *m = c->m;
	unsigned i;
	int rc;

	if (m == NULL || c != m->bc || !m->batch_open || tl_replaying || !S_ISDIR(a->mode))
		return 0;
	for (i = 0; i < m->nhot && m->hot[i].ino != a->ino; i++)
		;
	if (i == HOT_DIRS) {
		/* Full: the oldest goes to the database. */
		rc = inode_write(c, ST_INODE_UPDATE, &m->hot[0].a);
		if (rc)
			return rc;
		memmove(&m->hot[0], &m->hot[1], sizeof(m->hot[0]) * (HOT_DIRS - 1));
		i = --m->nhot;
	}
	if (i == m->nhot)
		m->nhot++;
	m->hot[i].ino = a->ino;
	m->hot[i].a = *a;
	m->hot_puts++;
	return 1;
}

/* Row ino is being deleted: no copy of it may be written back. */
static void hot_forget(struct conn *c, uint64_t ino)
{
	struct meta *m = c->m;

	if (m == NULL || c != m->bc)
		return;
	for (unsigned i = 0; i < m->nhot; i++) {
		if (m->hot[i].ino == ino) {
			memmove(&m->hot[i], &m->hot[i + 1], sizeof(m->hot[0]) * (m->nhot - i - 1));
			m->nhot--;
			return;
		}
	}
}

static int inode_get(struct conn *c, uint64_t ino, struct meta_attr *a)
{
	const struct meta_attr *h;
	sqlite3_stmt *st = NULL;
	int rc;

	if (!ino_ok(ino))
		return -ENOENT;
	h = hot_find(c, ino);
	if (h != NULL) {
		*a = *h;
		return 0;
	}
	rc = stmt(c, ST_GETATTR, &st);
	if (rc)
		return rc;
	rc = bind_i64(st, 1, (int64_t)ino);
	if (rc == 0)
		rc = step(st);
	if (rc == 0)
		rc = -ENOENT;
	else if (rc > 0)
		rc = row_attr(st, 0, a);
	if (rc == 0 && a->ino != ino)
		rc = -EIO;
	stmt_done(st);
	return rc;
}

static int inode_write(struct conn *c, enum st id, const struct meta_attr *a)
{
	sqlite3_stmt *st = NULL;
	int rc;

	rc = stmt(c, id, &st);
	if (rc)
		return rc;
	rc = bind_attr(st, a);
	if (rc == 0)
		rc = step(st);
	if (rc > 0)
		rc = 0;
	if (rc == 0 && sqlite3_changes(c->db) != 1)
		rc = -EIO;
	stmt_done(st);
	return rc;
}

static int inode_put(struct conn *c, const struct meta_attr *a)
{
	int rc = hot_put(c, a);

	if (rc)
		return rc > 0 ? 0 : rc;
	return inode_write(c, ST_INODE_UPDATE, a);
}

static int dir_get(struct conn *c, uint64_t ino, struct meta_attr *a)
{
	int rc = inode_get(c, ino, a);

	if (rc == 0 && !S_ISDIR(a->mode))
		rc = -ENOTDIR;
	return rc;
}

/* A directory that can take new entries (not removed). */
static int dir_get_live(struct conn *c, uint64_t ino, struct meta_attr *a)
{
	int rc = dir_get(c, ino, a);

	if (rc == 0 && a->nlink == 0)
		rc = -ENOENT;
	return rc;
}

static int dentry_get(struct conn *c, uint64_t parent, const char *name, size_t nlen,
		      uint64_t *ino)
{
	sqlite3_stmt *st = NULL;
	int64_t v;
	int rc;

	rc = stmt(c, ST_DENTRY_GET, &st);
	if (rc)
		return rc;
	rc = bind_i64(st, 1, (int64_t)parent);
	if (rc == 0)
		rc = bind_blob(st, 2, name, nlen);
	if (rc == 0)
		rc = step(st);
	if (rc == 0)
		rc = -ENOENT;
	else if (rc > 0) {
		rc = col_int(st, 0, 1, INT64_MAX, &v);
		if (rc == 0)
			*ino = (uint64_t)v;
	}
	stmt_done(st);
	return rc;
}

/* Entry parent/name -> its inode; a dangling entry is damage. */
static int entry_get(struct conn *c, uint64_t parent, const char *name, size_t nlen,
		     struct meta_attr *a)
{
	uint64_t ino;
	int rc = dentry_get(c, parent, name, nlen, &ino);

	if (rc)
		return rc;
	rc = inode_get(c, ino, a);
	return rc == -ENOENT ? -EIO : rc;
}

/* Statements keyed by (parent, name) with more parameters after them. */
static int dentry_run(struct conn *c, enum st id, uint64_t parent, const char *name, size_t nlen,
		      int64_t p3, const char *name4, size_t nlen4, int nparams)
{
	sqlite3_stmt *st = NULL;
	int rc;

	rc = stmt(c, id, &st);
	if (rc)
		return rc;
	rc = bind_i64(st, 1, (int64_t)parent);
	if (rc == 0)
		rc = bind_blob(st, 2, name, nlen);
	if (rc == 0 && nparams >= 3)
		rc = bind_i64(st, 3, p3);
	if (rc == 0 && nparams >= 4)
		rc = bind_blob(st, 4, name4, nlen4);
	if (rc == 0)
		rc = step(st);
	if (rc > 0)
		rc = 0;
	if (rc == 0 && sqlite3_changes(c->db) != 1)
		rc = -EIO;
	stmt_done(st);
	return rc;
}

static int dentry_insert(struct conn *c, uint64_t parent, const char *name, size_t nlen,
			 uint64_t ino, uint64_t cookie)
{
	sqlite3_stmt *st = NULL;
	int rc;

	rc = stmt(c, ST_DENTRY_INSERT, &st);
	if (rc)
		return rc;
	rc = bind_i64(st, 1, (int64_t)parent);
	if (rc == 0)
		rc = bind_blob(st, 2, name, nlen);
	if (rc == 0)
		rc = bind_i64(st, 3, (int64_t)ino);
	if (rc == 0)
		rc = bind_i64(st, 4, (int64_t)cookie);
	if (rc == 0)
		rc = step(st);
	if (rc == 0 && sqlite3_changes(c->db) != 1)
		rc = -EEXIST; /* (parent, name) is taken; nothing was written */
	else if (rc > 0)
		rc = -EIO;
	stmt_done(st);
	return rc;
}

/* The batch's counters (see struct ctr), loaded at their first use in it:
 * NULL if c is not the batch's connection (then the row is updated at
 * once). */
static struct ctr *ctr_held(struct conn *c, int *rc)
{
	struct meta *m = c->m;
	sqlite3_stmt *st = NULL;
	int64_t a = 0, b = 0;

	*rc = 0;
	if (m == NULL || c != m->bc || !m->batch_open)
		return NULL;
	if (m->ctr.held)
		return &m->ctr;
	*rc = stmt(c, ST_COUNTERS_GET, &st);
	if (*rc)
		return NULL;
	*rc = step(st);
	if (*rc > 0) {
		*rc = col_int(st, 0, 2, INT64_MAX - 1, &a);
		if (*rc == 0)
			*rc = col_int(st, 1, 1, INT64_MAX - 1, &b);
	} else if (*rc == 0) {
		*rc = -EIO; /* no counters row */
	}
	stmt_done(st);
	if (*rc)
		return NULL;
	m->ctr = (struct ctr){ .held = 1, .ino = (uint64_t)a, .cookie = (uint64_t)b };
	return &m->ctr;
}

static int next_cookie(struct conn *c, uint64_t *cookie)
{
	int rc;
	struct ctr *h = ctr_held(c, &rc);
	int64_t v;

	if (rc)
		return rc;
	if (h != NULL) {
		if (h->cookie >= INT64_MAX - 1)
			return -EIO; /* ran out */
		*cookie = h->cookie++;
		h->dirty = 1;
		return 0;
	}
	rc = query_int(c, ST_NEXT_COOKIE, 0, NULL, 1, INT64_MAX - 1, 0, &v);

	if (rc == 0)
		*cookie = (uint64_t)v;
	return rc == -ENOENT ? -EIO : rc;
}

static int next_ino(struct conn *c, uint64_t *ino, uint64_t *cookie)
{
	sqlite3_stmt *st = NULL;
	int64_t a, b;
	int rc;
	struct ctr *h = ctr_held(c, &rc);

	if (rc)
		return rc;
	if (h != NULL) {
		if (h->ino >= INT64_MAX - 1 || h->cookie >= INT64_MAX - 1)
			return -EIO; /* ran out */
		*ino = h->ino++;
		*cookie = h->cookie++;
		h->dirty = 1;
		return 0;
	}
	rc = stmt(c, ST_NEXT_INO, &st);
	if (rc)
		return rc;
	rc = step(st);
	if (rc == 0)
		rc = -EIO;
	if (rc > 0) {
		rc = col_int(st, 0, 2, INT64_MAX - 1, &a);
		if (rc == 0)
			rc = col_int(st, 1, 1, INT64_MAX - 1, &b);
	}
	/* A RETURNING statement finishes its work only when run to the end. */
	if (rc == 0 && (rc = step(st)) > 0)
		rc = -EIO;
	stmt_done(st);
	if (rc == 0) {
		*ino = (uint64_t)a;
		*cookie = (uint64_t)b;
	}
	return rc;
}

/* A replayed create makes the inode it made live, whatever the counter
 * says: a record refused before it (its change could not be made again)
 * must not move every later create to another number than the one the
 * kernel and later records know. The counter goes past it. */
static int replay_ino(struct conn *c, uint64_t want, uint64_t *ino, uint64_t *cookie)
{
	struct meta_attr a;
	struct ctr *h;
	int rc;

	if (!ino_ok(want) || want >= INT64_MAX - 1)
		return -EIO;
	rc = inode_get(c, want, &a);
	if (rc == 0)
		return -ESTALE; /* taken: by another writer while the journal waited */
	if (rc != -ENOENT)
		return rc;
	h = ctr_held(c, &rc);
	if (rc)
		return rc;
	if (h == NULL)
		return -EIO; /* replays run in the batch */
	rc = next_cookie(c, cookie);
	if (rc)
		return rc;
	if (h->ino <= want)
		h->ino = want + 1;
	h->dirty = 1;
	*ino = want;
	return 0;
}

static int dir_has_child(struct conn *c, uint64_t ino)
{
	int64_t v;
	int rc = query_int(c, ST_DIR_HAS_CHILD, 1, (int64_t[]){ (int64_t)ino }, 1, 1, 0, &v);

	if (rc == -ENOENT)
		return 0;
	return rc == 0 ? 1 : rc;
}

static int orphan_add(struct conn *c, uint64_t ino)
{
	return run_ints(c, ST_ORPHAN_ADD, 1, (int64_t[]){ (int64_t)ino });
}

/* Is dir anc itself or one of its ancestors? 1/0 or <0. */
static int dir_within(struct conn *c, uint64_t dir, uint64_t anc)
{
	uint64_t cur = dir;
	int64_t parent;
	long depth;
	int rc;

	for (depth = 0; depth < MAX_DEPTH; depth++) {
		if (cur == anc)
			return 1;
		if (cur == META_ROOT_INO)
			return 0;
		rc = query_int(c, ST_DENTRY_PARENT, 1, (int64_t[]){ (int64_t)cur }, 1, INT64_MAX,
			       0, &parent);
		if (rc == -ENOENT)
			return 0; /* a removed directory hangs nowhere */
		if (rc)
			return rc;
		cur = (uint64_t)parent;
	}
	return -EIO;
}

/* ---- slices ------------------------------------------------------------- */

/* Removes the slices of chunks [lo, hi] of ino, recording for gc those no
 * other row references. */
static int slices_drop(struct conn *c, uint64_t ino, int64_t lo, int64_t hi)
{
	const int64_t v[4] = { (int64_t)ino, lo, hi, now_ts().tv_sec };
	int rc;

	if (lo > hi)
		return 0;
	rc = run_ints(c, ST_SLICE_GC, 4, v);
	if (rc == 0)
		rc = run_ints(c, ST_SLICE_DROP, 3, v);
	return rc;
}

struct seq_slice {
	int64_t seq;
	struct meta_slice s;
};

/* Is [pos, end) wholly inside the union of the sorted, disjoint intervals
 * iv[0..n)? */
static bool covered(const uint32_t (*iv)[2], size_t n, uint32_t pos, uint32_t end)
{
	for (size_t i = 0; i < n && pos < end; i++) {
		if (iv[i][1] <= pos)
			continue;
		if (iv[i][0] > pos)
			return false;
		pos = iv[i][1];
	}
	return pos >= end;
}

/* Adds [pos, end) to the sorted, disjoint intervals iv[0..*n) (room for
 * one more), merging. */
static void cover(uint32_t (*iv)[2], size_t *n, uint32_t pos, uint32_t end)
{
	size_t i = 0, j, k;

	while (i < *n && iv[i][1] < pos)
		i++;
	for (j = i; j < *n && iv[j][0] <= end; j++) {
		if (iv[j][0] < pos)
			pos = iv[j][0];
		if (iv[j][1] > end)
			end = iv[j][1];
	}
	/* iv[i..j) merge into one at i. */
	if (j == i) {
		memmove(iv + i + 1, iv + i, (*n - i) * sizeof(iv[0]));
		(*n)++;
	} else {
		for (k = j; k < *n; k++)
			memcpy(iv[i + 1 + k - j], iv[k], sizeof(iv[0]));
		*n -= j - i - 1;
	}
	iv[i][0] = pos;
	iv[i][1] = end;
}

/*
 * Drops the rows of a chunk that later rows hide wholly (an overwrite, a
 * truncation's zeros), and hands their slices to gc if nothing else refers
 * to them: without it every overwrite would keep its old objects forever.
 * Readers that resolved the chunk before keep what they read: objects go
 * only after meta_gc_list()'s grace period.
 */
static int chunk_compact(struct conn *c, uint64_t ino, uint32_t chunk)
{
	sqlite3_stmt *st = NULL;
	struct seq_slice *v = NULL, *nv;
	uint32_t (*iv)[2] = NULL;
	size_t n = 0, cap = 0, niv = 0;
	int rc;

	rc = stmt(c, ST_SLICE_LIST_SEQ, &st);
	if (rc)
		return rc;
	rc = bind_i64(st, 1, (int64_t)ino);
	if (rc == 0)
		rc = bind_i64(st, 2, chunk);
	while (rc == 0 && (rc = step(st)) > 0) {
		if (n == cap) {
			cap = cap ? 2 * cap : 16;
			nv = realloc(v, cap * sizeof(*v));
			if (!nv) {
				rc = -ENOMEM;
				break;
			}
			v = nv;
		}
		rc = col_int(st, 0, 1, INT64_MAX, &v[n].seq);
		if (rc == 0) {
			sqlite3_stmt *one = st;
			/* Columns 1..5 are ST_SLICE_LIST's 0..4. */
			int64_t f[5];
			for (int k = 0; k < 5 && rc == 0; k++)
				rc = col_int(one, k + 1, 0, INT64_MAX, &f[k]);
			if (rc == 0 && (f[3] >= META_CHUNK_SIZE || f[4] < 1 ||
					f[3] + f[4] > META_CHUNK_SIZE || f[1] > UINT32_MAX ||
					f[2] > UINT32_MAX))
				rc = -EIO;
			if (rc == 0)
				v[n++].s = (struct meta_slice){ .id = (uint64_t)f[0],
								.size = (uint32_t)f[1],
								.off = (uint32_t)f[2],
								.pos = (uint32_t)f[3],
								.len = (uint32_t)f[4] };
		}
	}
	stmt_done(st);
	if (rc < 0 || n < 2)
		goto out;
	iv = malloc((n + 1) * sizeof(*iv));
	if (!iv) {
		rc = -ENOMEM;
		goto out;
	}
	/* Newest first: a row is dead if the rows after it cover it. */
	for (size_t i = n; i-- > 0 && rc == 0;) {
		uint32_t pos = v[i].s.pos, end = pos + v[i].s.len;

		if (!covered((const uint32_t (*)[2])iv, niv, pos, end)) {
			cover(iv, &niv, pos, end);
			continue;
		}
		rc = run_ints(c, ST_SLICE_DELETE_SEQ, 1, (int64_t[]){ v[i].seq });
		if (rc == 0)
			rc = run_ints(c, ST_GC_ADD_UNREF, 3,
				      (int64_t[]){ (int64_t)v[i].s.id, v[i].s.size,
						   now_ts().tv_sec });
	}
out:
	free(iv);
	free(v);
	return rc < 0 ? rc : 0;
}

static int slice_insert(struct conn *c, uint64_t ino, uint32_t chunk, const struct meta_slice *s)
{
	const int64_t v[7] = { (int64_t)ino, chunk, (int64_t)s->id, s->size, s->off, s->pos,
			       s->len };
	int rc = run_ints(c, ST_SLICE_INSERT, 7, v);

	return rc ? rc : chunk_compact(c, ino, chunk);
}

static int zero_insert(struct conn *c, uint64_t ino, uint32_t chunk, uint32_t from, uint32_t to)
{
	struct meta_slice z = { .id = 0, .size = to - from, .off = 0, .pos = from,
				.len = to - from };

	return from < to ? slice_insert(c, ino, chunk, &z) : 0;
}

static int row_slice(sqlite3_stmt *st, struct meta_slice *s);

/* The slices of a chunk, oldest first (*out NULL when there are none). */
static int chunk_load(struct conn *c, uint64_t ino, uint32_t chunk, struct meta_slice **out,
		      size_t *n)
{
	sqlite3_stmt *st = NULL;
	struct meta_slice *v = NULL, *nv;
	size_t len = 0, cap = 0;
	int rc;

	*out = NULL;
	*n = 0;
	rc = stmt(c, ST_SLICE_LIST, &st);
	if (rc)
		return rc;
	if (bind_i64(st, 1, (int64_t)ino) || bind_i64(st, 2, chunk)) {
		rc = -EIO;
		goto out;
	}
	while ((rc = step(st)) > 0) {
		if (len == cap) {
			size_t ncap = cap ? cap * 2 : 16;

			nv = realloc(v, ncap * sizeof(*v));
			if (nv == NULL) {
				rc = -ENOMEM;
				goto out;
			}
			v = nv;
			cap = ncap;
		}
		rc = row_slice(st, &v[len]);
		if (rc)
			goto out;
		len++;
	}
out:
	stmt_done(st);
	if (rc == 0) {
		*out = v;
		*n = len;
		v = NULL;
	}
	free(v);
	return rc;
}

/* Makes chunk bytes [from, to) read as zeros: appends one zero slice over
 * the part of it where data still shows, if any does. */
static int zero_range(struct conn *c, uint64_t ino, uint32_t chunk, uint32_t from, uint32_t to)
{
	struct meta_slice *s = NULL;
	struct slice_extent *e = NULL;
	size_t n, ne, i, first = SIZE_MAX, last = 0;
	int rc;

	rc = chunk_load(c, ino, chunk, &s, &n);
	if (rc || n == 0)
		goto out;
	rc = slice_resolve(s, n, from, to - from, &e, &ne);
	if (rc)
		goto out;
	for (i = 0; i < ne; i++) {
		if (e[i].id == 0)
			continue;
		if (first == SIZE_MAX)
			first = i;
		last = i;
	}
	if (first != SIZE_MAX)
		rc = zero_insert(c, ino, chunk, e[first].pos, e[last].pos + e[last].len);
out:
	free(e);
	free(s);
	return rc;
}

/* The size changes from old to new: whatever lies past the smaller of the
 * two is cleared, so the file's new bytes read as zeros. */
static int resize_slices(struct conn *c, uint64_t ino, uint64_t old, uint64_t new)
{
	uint64_t keep = old < new ? old : new;
	int64_t first_gone = (int64_t)(keep / META_CHUNK_SIZE + (keep % META_CHUNK_SIZE != 0));
	int rc;

	if (old == new)
		return 0;
	rc = slices_drop(c, ino, first_gone, INT64_MAX);
	if (rc == 0 && keep % META_CHUNK_SIZE != 0)
		rc = zero_range(c, ino, (uint32_t)(keep / META_CHUNK_SIZE),
				(uint32_t)(keep % META_CHUNK_SIZE), META_CHUNK_SIZE);
	return rc;
}

static int row_slice(sqlite3_stmt *st, struct meta_slice *s)
{
	int64_t v[5];

	if (col_int(st, 0, 0, INT64_MAX, &v[0]) || col_int(st, 1, 0, UINT32_MAX, &v[1]) ||
	    col_int(st, 2, 0, UINT32_MAX, &v[2]) || col_int(st, 3, 0, META_CHUNK_SIZE - 1, &v[3]) ||
	    col_int(st, 4, 1, META_CHUNK_SIZE, &v[4]))
		return -EIO;
	if (v[3] + v[4] > META_CHUNK_SIZE || (v[0] != 0 && v[2] + v[4] > v[1]))
		return -EIO;
	s->id = (uint64_t)v[0];
	s->size = (uint32_t)v[1];
	s->off = (uint32_t)v[2];
	s->pos = (uint32_t)v[3];
	s->len = (uint32_t)v[4];
	return 0;
}

/* ---- volume ------------------------------------------------------------- */

void meta_volume_free(struct meta_volume *v)
{
	if (v == NULL)
		return;
	free(v->storage_url);
	v->storage_url = NULL;
}

static int uuid_valid(const char *u)
{
	size_t i;

	if (strnlen(u, 37) != 36)
		return 0;
	for (i = 0; i < 36; i++) {
		if (i == 8 || i == 13 || i == 18 || i == 23) {
			if (u[i] != '-')
				return 0;
		} else if (!((u[i] >= '0' && u[i] <= '9') || (u[i] >= 'a' && u[i] <= 'f') ||
			     (u[i] >= 'A' && u[i] <= 'F'))) {
			return 0;
		}
	}
	return 1;
}

static int uuid_generate(char out[37])
{
	unsigned char b[16];
	size_t got = 0;

	while (got < sizeof(b)) {
		ssize_t r = getrandom(b + got, sizeof(b) - got, 0);
		if (r < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		got += (size_t)r;
	}
	b[6] = (unsigned char)((b[6] & 0x0f) | 0x40);
	b[8] = (unsigned char)((b[8] & 0x3f) | 0x80);
	snprintf(out, 37,
		 "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
		 b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
		 b[14], b[15]);
	return 0;
}

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

static int format_db(sqlite3 *db, const struct meta_volume *v, const char *uuid, uint32_t uid,
		     uint32_t gid)
{
	sqlite3_stmt *st = NULL;
	struct timespec now = now_ts();
	char pragmas[128];
	int rc;

	rc = sqlite3_exec(db, "PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL;", NULL,
			  NULL, NULL);
	if (rc == SQLITE_OK)
		rc = sqlite3_exec(db, "BEGIN IMMEDIATE", NULL, NULL, NULL);
	if (rc == SQLITE_OK)
		rc = sqlite3_exec(db, schema_sql, NULL, NULL, NULL);
	snprintf(pragmas, sizeof(pragmas), "PRAGMA application_id = %d; PRAGMA user_version = %d;",
		 APPLICATION_ID, SCHEMA_VERSION);
	if (rc == SQLITE_OK)
		rc = sqlite3_exec(db, pragmas, NULL, NULL, NULL);
	if (rc == SQLITE_OK)
		rc = sqlite3_exec(db,
				  "INSERT INTO counters(id, next_ino, next_slice, next_cookie)"
				  " VALUES (1, 2, 1, 1)",
				  NULL, NULL, NULL);
	if (rc != SQLITE_OK)
		goto out;

	rc = sqlite3_prepare_v2(db,
				"INSERT INTO volume(id, uuid, block_size, storage_url, created_at,"
				" s3_http) VALUES (1, ?1, ?2, ?3, ?4, ?5)",
				-1, &st, NULL);
	if (rc != SQLITE_OK)
		goto out;
	if (sqlite3_bind_text(st, 1, uuid, -1, SQLITE_STATIC) != SQLITE_OK ||
	    sqlite3_bind_int64(st, 2, v->block_size ? v->block_size : META_DEFAULT_BLOCK_SIZE) ||
	    sqlite3_bind_text(st, 3, v->storage_url, -1, SQLITE_STATIC) != SQLITE_OK ||
	    sqlite3_bind_int64(st, 4, v->created_at ? v->created_at : (int64_t)now.tv_sec) ||
	    sqlite3_bind_int64(st, 5, v->s3_http ? 1 : 0)) {
		rc = SQLITE_ERROR;
		goto out;
	}
	rc = sqlite3_step(st);
	if (rc != SQLITE_DONE)
		goto out;
	sqlite3_finalize(st);
	st = NULL;

	rc = sqlite3_prepare_v2(db, st_sql[ST_INODE_INSERT], -1, &st, NULL);
	if (rc != SQLITE_OK)
		goto out;
	{
		struct meta_attr root = { .ino = META_ROOT_INO, .mode = S_IFDIR | 0755,
					  .uid = uid, .gid = gid, .nlink = 2, .atime = now,
					  .mtime = now, .ctime = now };
		if (bind_attr(st, &root)) {
			rc = SQLITE_ERROR;
			goto out;
		}
	}
	rc = sqlite3_step(st);
	if (rc != SQLITE_DONE)
		goto out;
	rc = sqlite3_exec(db, "COMMIT", NULL, NULL, NULL);
out:
	sqlite3_finalize(st);
	if (rc == SQLITE_DONE)
		rc = SQLITE_OK;
	return rc == SQLITE_OK ? 0 : db_err(rc) == -ENOMEM ? -ENOMEM : -EIO;
}

int meta_format(const char *db_path, const struct meta_volume *v, uint32_t root_uid,
		uint32_t root_gid, int force)
{
	sqlite3 *db = NULL;
	char uuid[37];
	int fd, rc;

	if (db_path == NULL || v == NULL || v->storage_url == NULL ||
	    v->block_size > META_CHUNK_SIZE)
		return -EINVAL;
	if (v->uuid[0] == '\0') {
		rc = uuid_generate(uuid);
		if (rc)
			return rc;
	} else {
		if (!uuid_valid(v->uuid))
			return -EINVAL;
		memcpy(uuid, v->uuid, sizeof(uuid));
	}
	if (force) {
		rc = unlink_db_files(db_path);
		if (rc)
			return rc;
	}
	/* O_EXCL decides, race-free, whether a volume is there. */
	fd = open(db_path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (fd < 0)
		return -errno;
	close(fd);

	rc = sqlite3_open_v2(db_path, &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX, NULL);
	if (rc != SQLITE_OK) {
		rc = -EIO;
		goto out;
	}
	sqlite3_busy_timeout(db, BUSY_TIMEOUT_MS);
	rc = format_db(db, v, uuid, root_uid, root_gid);
out:
	sqlite3_close(db);
	if (rc)
		unlink_db_files(db_path); /* ours: we created it */
	return rc;
}

static int check_volume(struct conn *c)
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

static int volume_read(struct conn *c, struct meta_volume *out)
{
	sqlite3_stmt *st = NULL;
	const unsigned char *u, *url;
	int64_t bs, created, http;
	int rc;

	rc = stmt(c, ST_VOLUME_GET, &st);
	if (rc)
		return rc;
	rc = step(st);
	if (rc == 0)
		rc = -EIO;
	if (rc < 0)
		goto out;
	u = sqlite3_column_text(st, 0);
	if (sqlite3_column_type(st, 0) != SQLITE_TEXT || u == NULL || !uuid_valid((const char *)u) ||
	    sqlite3_column_type(st, 2) != SQLITE_TEXT ||
	    col_int(st, 1, 1, META_CHUNK_SIZE, &bs) || col_int(st, 3, INT64_MIN, INT64_MAX, &created) ||
	    col_int(st, 4, 0, 1, &http)) {
		rc = -EIO;
		goto out;
	}
	url = sqlite3_column_text(st, 2);
	if (url == NULL || (int)strlen((const char *)url) != sqlite3_column_bytes(st, 2)) {
		rc = -EIO;
		goto out;
	}
	rc = 0;
	if (out != NULL) {
		memset(out, 0, sizeof(*out));
		memcpy(out->uuid, u, 36);
		out->uuid[36] = '\0';
		out->block_size = (uint32_t)bs;
		out->created_at = created;
		out->s3_http = (int)http;
		out->storage_url = strdup((const char *)url);
		if (out->storage_url == NULL)
			rc = -ENOMEM;
	}
out:
	stmt_done(st);
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

int meta_open(const char *db_path, struct meta **out)
{
	struct meta *m;
	struct conn *c;
	int rc;

	if (db_path == NULL || out == NULL)
		return -EINVAL;
	*out = NULL;
	if (access(db_path, F_OK) != 0)
		return errno == ENOENT ? -ENOENT : -EIO;
	m = calloc(1, sizeof(*m));
	if (m == NULL)
		return -ENOMEM;
	m->path = strdup(db_path);
	if (m->path == NULL) {
		free(m);
		return -ENOMEM;
	}
	if (pthread_key_create(&m->key, conn_thread_exit) != 0) {
		free(m->path);
		free(m);
		return -ENOMEM;
	}
	pthread_mutex_init(&m->lock, NULL);
	pthread_mutex_init(&m->ids_lock, NULL);
	pthread_mutex_init(&m->write_lock, NULL);
	pthread_mutex_init(&m->ckpt_lock, NULL);
	mono_cond_init(&m->ckpt_cond);
	mono_cond_init(&m->flush_cond);
	m->jfd = -1;
	m->intent_fd = intent_open(db_path);
	rc = conn_get(m, &c);
	if (rc == 0)
		rc = check_volume(c);
	if (rc == 0)
		rc = volume_read(c, NULL);
	if (rc == 0 && sqlite3_exec(c->db, commit_seq_sql, NULL, NULL, NULL) != SQLITE_OK)
		rc = -EIO;
	if (rc == 0)
		rc = gc_seen_column(c->db);
	if (rc) {
		meta_close(m);
		return rc == -ENOMEM || rc == -ENOENT ? rc : -EIO;
	}
	*out = m;
	return 0;
}

void meta_close(struct meta *m)
{
	struct conn *c, *next;

	if (m == NULL)
		return;
	pthread_mutex_lock(&m->ckpt_lock);
	m->ckpt_stop = 1;
	pthread_cond_signal(&m->ckpt_cond);
	pthread_mutex_unlock(&m->ckpt_lock);
	if (m->ckpt_started)
		pthread_join(m->ckpt_thread, NULL); /* its conn goes with the thread */
	if (m->jfd >= 0) {
		pthread_mutex_lock(&m->write_lock);
		m->flush_stop = 1;
		pthread_cond_signal(&m->flush_cond);
		pthread_mutex_unlock(&m->write_lock);
		if (m->flush_started)
			pthread_join(m->flush_thread, NULL);
		/* What does not commit now is replayed at the next open. */
		meta_flush(m);
		close(m->jfd);
		m->jfd = -1;
	}
	if (m->bc)
		conn_free(m->bc);
	if (m->intent_fd >= 0)
		close(m->intent_fd);
	/* The caller's workers are gone (or never touch m again); no key
	 * destructor runs for this key after this. */
	pthread_key_delete(m->key);
	pthread_mutex_lock(&m->lock);
	c = m->conns;
	m->conns = NULL;
	pthread_mutex_unlock(&m->lock);
	for (; c != NULL; c = next) {
		next = c->next;
		conn_free(c);
	}
	pthread_mutex_destroy(&m->lock);
	pthread_mutex_destroy(&m->ids_lock);
	pthread_mutex_destroy(&m->write_lock);
	pthread_mutex_destroy(&m->ckpt_lock);
	pthread_cond_destroy(&m->ckpt_cond);
	pthread_cond_destroy(&m->flush_cond);
	free(m->path);
	free(m);
}

int meta_volume_get(struct meta *m, struct meta_volume *out)
{
	READ_CONN(c);
	int rc;

	if (m == NULL || out == NULL)
		return -EINVAL;
	rc = read_conn(m, &c);
	if (rc)
		return rc;
	rc = volume_read(c, out);
	return rc == -EAGAIN ? -EIO : rc;
}

/* ---- attributes and lookup ---------------------------------------------- */

/* Read-only calls outside txn(): a busy database is an I/O error for them. */
static int ro(int rc)
{
	return rc == -EAGAIN ? -EIO : rc;
}

int meta_getattr(struct meta *m, uint64_t ino, struct meta_attr *out)
{
	struct meta_attr a;
	READ_CONN(c);
	int rc;

	if (m == NULL)
		return -EINVAL;
	rc = read_conn(m, &c);
	if (rc == 0)
		rc = inode_get(c, ino, &a);
	if (rc == 0 && out != NULL)
		*out = a;
	return ro(rc);
}

int meta_lookup(struct meta *m, uint64_t parent, const char *name, struct meta_attr *out)
{
	const struct meta_attr *h;
	sqlite3_stmt *st = NULL;
	struct meta_attr a, p;
	READ_CONN(c);
	size_t nlen;
	int rc;

	if (m == NULL)
		return -EINVAL;
	rc = name_check(name, &nlen);
	if (rc)
		return rc;
	if (!ino_ok(parent))
		return -ENOENT;
	rc = read_conn(m, &c);
	if (rc)
		return rc;
	rc = stmt(c, ST_LOOKUP, &st);
	if (rc)
		return ro(rc);
	rc = bind_i64(st, 1, (int64_t)parent);
	if (rc == 0)
		rc = bind_blob(st, 2, name, nlen);
	if (rc == 0)
		rc = step(st);
	if (rc > 0)
		rc = sqlite3_column_type(st, 1) == SQLITE_NULL ? -EIO : row_attr(st, 1, &a);
	else if (rc == 0)
		rc = -ENOENT;
	stmt_done(st);
	if (rc == 0 && (h = hot_find(c, a.ino)) != NULL)
		a = *h;
	if (rc == -ENOENT) {
		/* Say why: no parent, or not a directory. */
		int prc = dir_get(c, parent, &p);
		if (prc)
			rc = prc;
	}
	if (rc == 0 && out != NULL)
		*out = a;
	return ro(rc);
}

/* ---- setattr -------------------------------------------------------------- */

#define META_SET_ALL                                                                         \
	(META_SET_MODE | META_SET_UID | META_SET_GID | META_SET_SIZE | META_SET_ATIME |        \
	 META_SET_MTIME | META_SET_ATIME_NOW | META_SET_MTIME_NOW | META_SET_CTIME)

struct setattr_args {
	uint64_t ino;
	unsigned valid;
	const struct meta_attr *in;
	struct meta_attr out;
};

static int do_setattr(struct conn *c, void *p)
{
	struct setattr_args *a = p;
	const struct meta_attr *in = a->in;
	struct timespec now = now_ts();
	struct meta_attr at;
	int rc;

	rc = inode_get(c, a->ino, &at);
	if (rc)
		return rc;
	if (a->valid & META_SET_SIZE) {
		if (S_ISDIR(at.mode))
			return -EISDIR;
		if (!S_ISREG(at.mode))
			return -EINVAL;
		if (in->size > MAX_FILE_SIZE)
			return -EFBIG;
		rc = resize_slices(c, at.ino, at.size, in->size);
		if (rc)
			return rc;
		at.size = in->size;
	}
	if (a->valid & META_SET_MODE)
		at.mode = (at.mode & S_IFMT) | (in->mode & 07777);
	if (a->valid & META_SET_UID)
		at.uid = in->uid;
	if (a->valid & META_SET_GID)
		at.gid = in->gid;
	if (a->valid & META_SET_ATIME_NOW)
		at.atime = now;
	else if (a->valid & META_SET_ATIME)
		at.atime = in->atime;
	if (a->valid & META_SET_MTIME_NOW) {
		/* A size change stamps "now" of its own accord (truncate,
		 * O_TRUNC): after a step back of the wall clock that must not
		 * make the file look older than it was, as a commit may not. A
		 * time asked for (utimensat UTIME_NOW, no size) is set as asked. */
		bool back = now.tv_sec < at.mtime.tv_sec ||
			    (now.tv_sec == at.mtime.tv_sec && now.tv_nsec < at.mtime.tv_nsec);
		if (!((a->valid & META_SET_SIZE) && back))
			at.mtime = now;
	} else if (a->valid & META_SET_MTIME) {
		at.mtime = in->mtime;
	}
	at.ctime = (a->valid & META_SET_CTIME) ? in->ctime : now;
	rc = inode_put(c, &at);
	if (rc == 0 && tl_seq && (a->valid & (META_SET_MTIME | META_SET_MTIME_NOW)) &&
	    S_ISREG(at.mode))
		rc = run_ints(c, ST_TIMES_SEQ_PUT, 2,
			      (const int64_t[]){ (int64_t)at.ino, (int64_t)tl_seq });
	if (rc == 0)
		a->out = at;
	return rc;
}

int meta_setattr(struct meta *m, uint64_t ino, unsigned valid, const struct meta_attr *in,
		 struct meta_attr *out)
{
	struct setattr_args a = { .ino = ino, .valid = valid, .in = in };
	int rc;

	if (m == NULL || (valid & ~META_SET_ALL) || (valid && in == NULL))
		return -EINVAL;
	if (in != NULL && (((valid & META_SET_ATIME) && !ts_valid(&in->atime)) ||
			   ((valid & META_SET_MTIME) && !ts_valid(&in->mtime)) ||
			   ((valid & META_SET_CTIME) && !ts_valid(&in->ctime))))
		return -EINVAL;
	struct mj_rec r = { .op = MJ_SETATTR, .v = { ino, valid } };
	if (in != NULL) {
		r.v[2] = in->mode;
		r.v[3] = in->uid;
		r.v[4] = in->gid;
		r.v[5] = in->size;
		r.v[6] = (uint64_t)in->atime.tv_sec;
		r.v[7] = (uint64_t)in->atime.tv_nsec;
		r.v[8] = (uint64_t)in->mtime.tv_sec;
		r.v[9] = (uint64_t)in->mtime.tv_nsec;
		r.v[10] = (uint64_t)in->ctime.tv_sec;
		r.v[11] = (uint64_t)in->ctime.tv_nsec;
	}
	rc = txn_rec(m, &r, NULL, do_setattr, &a);
	if (rc == 0 && out != NULL)
		*out = a.out;
	return rc;
}

/* ---- namespace ------------------------------------------------------------ */

struct create_args {
	uint64_t parent;
	const char *name;
	size_t nlen;
	uint32_t mode, uid, gid;
	uint64_t rdev;
	const char *target;
	size_t tlen;
	uint64_t want_ino; /* a replay: the inode number the change made live */
	struct meta_attr out;
};

static int do_create(struct conn *c, void *p)
{
	struct create_args *a = p;
	struct timespec now = now_ts();
	struct meta_attr par, at;
	uint64_t ino, cookie;
	int rc, isdir = S_ISDIR(a->mode);

	rc = dir_get_live(c, a->parent, &par);
	if (rc)
		return rc;
	if (isdir && par.nlink == UINT32_MAX)
		return -EMLINK;
	if (a->want_ino)
		rc = replay_ino(c, a->want_ino, &ino, &cookie);
	else
		rc = next_ino(c, &ino, &cookie);
	if (rc)
		return rc;
	/* The entry first: a name taken fails its insert (-EEXIST) before
	 * anything is written, so no lookup of the name is needed first. */
	rc = dentry_insert(c, a->parent, a->name, a->nlen, ino, cookie);
	if (rc)
		return rc;

	memset(&at, 0, sizeof(at));
	at.ino = ino;
	at.mode = a->mode;
	at.uid = a->uid;
	at.gid = a->gid;
	at.rdev = (S_ISCHR(a->mode) || S_ISBLK(a->mode)) ? a->rdev : 0;
	at.nlink = isdir ? 2 : 1;
	at.size = S_ISLNK(a->mode) ? a->tlen : 0;
	at.atime = at.mtime = at.ctime = now;
	if (par.mode & S_ISGID) {
		at.gid = par.gid;
		if (isdir)
			at.mode |= S_ISGID;
	}
	rc = inode_write(c, ST_INODE_INSERT, &at);
	if (rc == 0 && S_ISLNK(a->mode)) {
		sqlite3_stmt *st = NULL;

		rc = stmt(c, ST_SYMLINK_INSERT, &st);
		if (rc == 0) {
			rc = bind_i64(st, 1, (int64_t)ino);
			if (rc == 0)
				rc = bind_blob(st, 2, a->target, a->tlen);
			if (rc == 0)
				rc = step(st);
			if (rc > 0)
				rc = 0;
			stmt_done(st);
		}
	}
	if (rc)
		return rc;
	par.mtime = par.ctime = now;
	if (isdir)
		par.nlink++;
	rc = inode_put(c, &par);
	if (rc == 0)
		a->out = at;
	return rc;
}

int meta_create(struct meta *m, uint64_t parent, const char *name, uint32_t mode, uint32_t uid,
		uint32_t gid, uint64_t rdev, const char *target, struct meta_attr *out)
{
	struct create_args a = { .parent = parent, .name = name, .mode = mode, .uid = uid,
				 .gid = gid, .rdev = rdev, .target = target };
	int rc;

	if (m == NULL)
		return -EINVAL;
	rc = name_check(name, &a.nlen);
	if (rc)
		return rc;
	if ((mode & ~(uint32_t)(S_IFMT | 07777)) || !mode_type_valid(mode) || rdev > INT64_MAX)
		return -EINVAL;
	if (S_ISLNK(mode)) {
		if (target == NULL)
			return -EINVAL;
		a.tlen = strnlen(target, SYMLINK_MAX + 1);
		if (a.tlen > SYMLINK_MAX)
			return -ENAMETOOLONG;
		if (a.tlen == 0)
			return -ENOENT; /* as symlink(2) */
	}
	if (!ino_ok(parent))
		return -ENOENT;
	struct mj_rec r = { .op = MJ_CREATE, .v = { parent, mode, uid, gid, rdev },
			    .s = { name, target }, .slen = { (uint32_t)a.nlen, (uint32_t)a.tlen } };
	rc = txn_rec(m, &r, &a.out.ino, do_create, &a);
	if (rc == 0 && out != NULL)
		*out = a.out;
	return rc;
}

struct link_args {
	uint64_t ino, parent;
	const char *name;
	size_t nlen;
	struct meta_attr out;
};

static int do_link(struct conn *c, void *p)
{
	struct link_args *a = p;
	struct timespec now = now_ts();
	struct meta_attr at, par;
	uint64_t x, cookie;
	int rc;

	rc = inode_get(c, a->ino, &at);
	if (rc)
		return rc;
	if (S_ISDIR(at.mode))
		return -EPERM;
	if (at.nlink == 0)
		return -ENOENT; /* as linkat(2) on an unlinked file */
	if (at.nlink == UINT32_MAX)
		return -EMLINK;
	rc = dir_get_live(c, a->parent, &par);
	if (rc)
		return rc;
	rc = dentry_get(c, a->parent, a->name, a->nlen, &x);
	if (rc == 0)
		return -EEXIST;
	if (rc != -ENOENT)
		return rc;
	rc = next_cookie(c, &cookie);
	if (rc == 0)
		rc = dentry_insert(c, a->parent, a->name, a->nlen, at.ino, cookie);
	if (rc)
		return rc;
	at.nlink++;
	at.ctime = now;
	par.mtime = par.ctime = now;
	rc = inode_put(c, &at);
	if (rc == 0)
		rc = inode_put(c, &par);
	if (rc == 0)
		a->out = at;
	return rc;
}

int meta_link(struct meta *m, uint64_t ino, uint64_t newparent, const char *newname,
	      struct meta_attr *out)
{
	struct link_args a = { .ino = ino, .parent = newparent, .name = newname };
	int rc;

	if (m == NULL)
		return -EINVAL;
	rc = name_check(newname, &a.nlen);
	if (rc)
		return rc;
	if (!ino_ok(ino) || !ino_ok(newparent))
		return -ENOENT;
	struct mj_rec r = { .op = MJ_LINK, .v = { ino, newparent }, .s = { newname },
			    .slen = { (uint32_t)a.nlen } };
	rc = txn_rec(m, &r, NULL, do_link, &a);
	if (rc == 0 && out != NULL)
		*out = a.out;
	return rc;
}

struct remove_args {
	uint64_t parent;
	const char *name;
	size_t nlen;
	int dir;
	struct meta_attr out;
};

static int do_remove(struct conn *c, void *p)
{
	struct remove_args *a = p;
	struct timespec now = now_ts();
	struct meta_attr par, vic;
	int rc;

	rc = dir_get(c, a->parent, &par);
	if (rc)
		return rc;
	rc = entry_get(c, a->parent, a->name, a->nlen, &vic);
	if (rc)
		return rc;
	if (vic.ino == par.ino)
		return -EIO;
	if (a->dir) {
		if (!S_ISDIR(vic.mode))
			return -ENOTDIR;
		rc = dir_has_child(c, vic.ino);
		if (rc)
			return rc > 0 ? -ENOTEMPTY : rc;
		vic.nlink = 0;
		if (par.nlink > 2)
			par.nlink--;
	} else {
		if (S_ISDIR(vic.mode))
			return -EISDIR;
		if (vic.nlink > 0)
			vic.nlink--;
	}
	rc = dentry_run(c, ST_DENTRY_DELETE, a->parent, a->name, a->nlen, 0, NULL, 0, 2);
	if (rc)
		return rc;
	vic.ctime = now;
	par.mtime = par.ctime = now;
	if (vic.nlink == 0)
		rc = orphan_add(c, vic.ino);
	if (rc == 0)
		rc = inode_put(c, &vic);
	if (rc == 0)
		rc = inode_put(c, &par);
	if (rc == 0)
		a->out = vic;
	return rc;
}

static int remove_entry(struct meta *m, uint64_t parent, const char *name, int dir,
			struct meta_attr *victim)
{
	struct remove_args a = { .parent = parent, .name = name, .dir = dir };
	int rc;

	if (m == NULL)
		return -EINVAL;
	rc = name_check(name, &a.nlen);
	if (rc)
		return rc;
	if (!ino_ok(parent))
		return -ENOENT;
	struct mj_rec r = { .op = dir ? MJ_RMDIR : MJ_UNLINK, .v = { parent }, .s = { name },
			    .slen = { (uint32_t)a.nlen } };
	rc = txn_rec(m, &r, NULL, do_remove, &a);
	if (rc == 0 && victim != NULL)
		*victim = a.out;
	return rc;
}

int meta_unlink(struct meta *m, uint64_t parent, const char *name, struct meta_attr *victim)
{
	return remove_entry(m, parent, name, 0, victim);
}

int meta_rmdir(struct meta *m, uint64_t parent, const char *name, struct meta_attr *victim)
{
	return remove_entry(m, parent, name, 1, victim);
}

struct rename_args {
	uint64_t parent, newparent;
	const char *name, *newname;
	size_t nlen, newnlen;
	unsigned flags;
	struct meta_attr replaced;
};

static int do_rename(struct conn *c, void *p)
{
	struct rename_args *a = p;
	struct timespec now = now_ts();
	struct meta_attr pa, pb, src, tgt;
	struct meta_attr *P = &pa, *Q;
	int rc, have_tgt, sdir, tdir;

	memset(&a->replaced, 0, sizeof(a->replaced));
	rc = dir_get(c, a->parent, &pa);
	if (rc)
		return rc;
	if (a->newparent != a->parent) {
		rc = dir_get_live(c, a->newparent, &pb);
		if (rc)
			return rc;
		Q = &pb;
	} else {
		Q = &pa;
	}
	rc = entry_get(c, a->parent, a->name, a->nlen, &src);
	if (rc)
		return rc;
	rc = entry_get(c, a->newparent, a->newname, a->newnlen, &tgt);
	if (rc && rc != -ENOENT)
		return rc;
	have_tgt = rc == 0;
	sdir = S_ISDIR(src.mode);
	tdir = have_tgt && S_ISDIR(tgt.mode);

	if (have_tgt && (a->flags & META_RENAME_NOREPLACE))
		return -EEXIST;
	if (!have_tgt && (a->flags & META_RENAME_EXCHANGE))
		return -ENOENT;
	if (have_tgt && tgt.ino == src.ino)
		return 0; /* the same inode (same entry or hard links): nothing to do */
	if (Q->nlink == 0)
		return -ENOENT;

	/* A directory cannot move into its own subtree. */
	if (sdir && a->newparent != a->parent) {
		rc = dir_within(c, a->newparent, src.ino);
		if (rc)
			return rc > 0 ? -EINVAL : rc;
	}
	if (tdir && (a->flags & META_RENAME_EXCHANGE) && a->newparent != a->parent) {
		rc = dir_within(c, a->parent, tgt.ino);
		if (rc)
			return rc > 0 ? -EINVAL : rc;
	}
	if (have_tgt && !(a->flags & META_RENAME_EXCHANGE)) {
		if (sdir && !tdir)
			return -ENOTDIR;
		if (!sdir && tdir)
			return -EISDIR;
		if (tdir) {
			rc = dir_has_child(c, tgt.ino);
			if (rc)
				return rc > 0 ? -ENOTEMPTY : rc;
		}
	}
	/* Whatever aliases survived the checks above is damage. */
	if (src.ino == pa.ino || src.ino == Q->ino ||
	    (have_tgt && (tgt.ino == pa.ino || tgt.ino == Q->ino)))
		return -EIO;

	if (a->flags & META_RENAME_EXCHANGE) {
		rc = dentry_run(c, ST_DENTRY_SETINO, a->parent, a->name, a->nlen,
				(int64_t)tgt.ino, NULL, 0, 3);
		if (rc == 0)
			rc = dentry_run(c, ST_DENTRY_SETINO, a->newparent, a->newname,
					a->newnlen, (int64_t)src.ino, NULL, 0, 3);
		if (rc)
			return rc;
		if (P != Q && sdir != tdir) {
			if (sdir) {
				P->nlink--;
				Q->nlink++;
			} else {
				Q->nlink--;
				P->nlink++;
			}
		}
		tgt.ctime = now;
	} else {
		if (have_tgt) {
			rc = dentry_run(c, ST_DENTRY_DELETE, a->newparent, a->newname,
					a->newnlen, 0, NULL, 0, 2);
			if (rc)
				return rc;
			if (tdir) {
				tgt.nlink = 0;
				Q->nlink--;
			} else if (tgt.nlink > 0) {
				tgt.nlink--;
			}
			tgt.ctime = now;
			if (tgt.nlink == 0)
				rc = orphan_add(c, tgt.ino);
			if (rc)
				return rc;
		}
		rc = dentry_run(c, ST_DENTRY_MOVE, a->parent, a->name, a->nlen,
				(int64_t)a->newparent, a->newname, a->newnlen, 4);
		if (rc)
			return rc;
		if (sdir && P != Q) {
			P->nlink--;
			Q->nlink++;
		}
	}
	src.ctime = now;
	P->mtime = P->ctime = now;
	Q->mtime = Q->ctime = now;
	rc = inode_put(c, &src);
	if (rc == 0 && have_tgt)
		rc = inode_put(c, &tgt);
	if (rc == 0)
		rc = inode_put(c, P);
	if (rc == 0 && Q != P)
		rc = inode_put(c, Q);
	if (rc == 0 && have_tgt && !(a->flags & META_RENAME_EXCHANGE))
		a->replaced = tgt;
	return rc;
}

int meta_rename(struct meta *m, uint64_t parent, const char *name, uint64_t newparent,
		const char *newname, unsigned flags, struct meta_attr *replaced)
{
	struct rename_args a = { .parent = parent, .newparent = newparent, .name = name,
				 .newname = newname, .flags = flags };
	int rc;

	if (m == NULL)
		return -EINVAL;
	rc = name_check(name, &a.nlen);
	if (rc == 0)
		rc = name_check(newname, &a.newnlen);
	if (rc)
		return rc;
	if ((flags & ~(META_RENAME_NOREPLACE | META_RENAME_EXCHANGE)) ||
	    (flags == (META_RENAME_NOREPLACE | META_RENAME_EXCHANGE)))
		return -EINVAL;
	if (!ino_ok(parent) || !ino_ok(newparent))
		return -ENOENT;
	struct mj_rec r = { .op = MJ_RENAME, .v = { parent, newparent, flags },
			    .s = { name, newname },
			    .slen = { (uint32_t)a.nlen, (uint32_t)a.newnlen } };
	rc = txn_rec(m, &r, NULL, do_rename, &a);
	if (rc == 0 && replaced != NULL)
		*replaced = a.replaced;
	return rc;
}

int meta_readlink(struct meta *m, uint64_t ino, char **target)
{
	sqlite3_stmt *st = NULL;
	struct meta_attr at;
	READ_CONN(c);
	const void *p;
	char *t;
	int rc, n;

	if (m == NULL || target == NULL)
		return -EINVAL;
	*target = NULL;
	rc = read_conn(m, &c);
	if (rc)
		return rc;
	rc = inode_get(c, ino, &at);
	if (rc)
		return ro(rc);
	if (!S_ISLNK(at.mode))
		return -EINVAL;
	rc = stmt(c, ST_SYMLINK_GET, &st);
	if (rc)
		return ro(rc);
	rc = bind_i64(st, 1, (int64_t)ino);
	if (rc == 0)
		rc = step(st);
	if (rc == 0)
		rc = -EIO; /* a symlink inode with no target */
	if (rc < 0)
		goto out;
	p = sqlite3_column_blob(st, 0);
	n = sqlite3_column_bytes(st, 0);
	if ((sqlite3_column_type(st, 0) != SQLITE_BLOB &&
	     sqlite3_column_type(st, 0) != SQLITE_TEXT) ||
	    p == NULL || n <= 0 || n > SYMLINK_MAX || memchr(p, '\0', (size_t)n) != NULL) {
		rc = -EIO;
		goto out;
	}
	t = malloc((size_t)n + 1);
	if (t == NULL) {
		rc = -ENOMEM;
		goto out;
	}
	memcpy(t, p, (size_t)n);
	t[n] = '\0';
	*target = t;
	rc = 0;
out:
	stmt_done(st);
	return ro(rc);
}

/* ---- readdir ---------------------------------------------------------------- */

struct rd_ent {
	char name[META_NAME_MAX + 1];
	struct meta_attr attr;
	uint64_t cookie;
};

/* Reads up to READDIR_PAGE entries after cookie after into page. */
static int readdir_page(struct conn *c, uint64_t ino, uint64_t after, int plus,
			struct rd_ent *page, size_t *n)
{
	sqlite3_stmt *st = NULL;
	int64_t cookie, dino;
	int rc;

	*n = 0;
	rc = stmt(c, ST_READDIR, &st);
	if (rc)
		return rc;
	if (bind_i64(st, 1, (int64_t)ino) || bind_i64(st, 2, (int64_t)after) ||
	    bind_i64(st, 3, READDIR_PAGE)) {
		rc = -EIO;
		goto out;
	}
	while ((rc = step(st)) > 0) {
		struct rd_ent *e = &page[*n];

		if (*n >= READDIR_PAGE || col_name(st, 0, e->name, META_NAME_MAX) ||
		    col_int(st, 1, 1, INT64_MAX, &cookie) || col_int(st, 2, 1, INT64_MAX, &dino) ||
		    row_attr(st, 3, &e->attr) || e->attr.ino != (uint64_t)dino) {
			rc = -EIO;
			goto out;
		}
		const struct meta_attr *h = hot_find(c, e->attr.ino);

		if (h != NULL)
			e->attr = *h;
		if (!plus) {
			uint32_t mode = e->attr.mode;

			memset(&e->attr, 0, sizeof(e->attr));
			e->attr.ino = (uint64_t)dino;
			e->attr.mode = mode;
		}
		e->cookie = (uint64_t)cookie;
		(*n)++;
	}
out:
	stmt_done(st);
	return rc;
}

int meta_readdir(struct meta *m, uint64_t ino, uint64_t after, int plus, meta_readdir_cb cb,
		 void *arg)
{
	struct rd_ent *page = NULL;
	struct meta_attr d;
	READ_CONN(c);
	size_t n, i;
	int rc;

	if (m == NULL || cb == NULL)
		return -EINVAL;
	rc = read_conn(m, &c);
	if (rc)
		return rc;
	rc = dir_get(c, ino, &d);
	read_done(&c);
	c = NULL;
	if (rc)
		return ro(rc);
	if (after >= INT64_MAX)
		return 0;
	page = malloc(READDIR_PAGE * sizeof(*page));
	if (page == NULL)
		return -ENOMEM;
	/* Callbacks run with no statement open and no lock held (a batch's
	 * reads hold write_lock), so they may call back in. */
	for (;;) {
		rc = read_conn(m, &c);
		if (rc == 0)
			rc = readdir_page(c, ino, after, plus, page, &n);
		read_done(&c);
		c = NULL;
		if (rc)
			goto out;
		for (i = 0; i < n; i++) {
			if (page[i].cookie <= after) {
				rc = -EIO;
				goto out;
			}
			after = page[i].cookie;
			if (cb(arg, page[i].name, &page[i].attr, page[i].cookie) != 0)
				goto out;
		}
		if (n < READDIR_PAGE)
			break;
	}
out:
	free(page);
	return ro(rc);
}

/* ---- xattrs ------------------------------------------------------------------ */

static int xattr_name_check(const char *name, size_t *len)
{
	size_t n;

	if (name == NULL)
		return -EINVAL;
	n = strnlen(name, META_XATTR_NAME_MAX + 1);
	if (n == 0 || n > META_XATTR_NAME_MAX)
		return -ERANGE;
	*len = n;
	return 0;
}

/* 1 if ino has xattr name, 0 if not. */
static int xattr_exists(struct conn *c, uint64_t ino, const char *name, size_t nlen)
{
	sqlite3_stmt *st = NULL;
	int rc;

	rc = stmt(c, ST_XATTR_GET, &st);
	if (rc)
		return rc;
	rc = bind_i64(st, 1, (int64_t)ino);
	if (rc == 0)
		rc = bind_blob(st, 2, name, nlen);
	if (rc == 0)
		rc = step(st);
	stmt_done(st);
	return rc;
}

struct xattr_args {
	uint64_t ino;
	const char *name;
	size_t nlen;
	const void *value;
	size_t size;
	int flags;
	int remove;
};

static int do_xattr(struct conn *c, void *p)
{
	struct xattr_args *a = p;
	struct meta_attr at;
	sqlite3_stmt *st = NULL;
	int rc, exists;

	rc = inode_get(c, a->ino, &at);
	if (rc)
		return rc;
	exists = xattr_exists(c, a->ino, a->name, a->nlen);
	if (exists < 0)
		return exists;
	if (a->remove || (a->flags & META_XATTR_REPLACE)) {
		if (!exists)
			return -ENODATA;
	} else if ((a->flags & META_XATTR_CREATE) && exists) {
		return -EEXIST;
	}
	rc = stmt(c, a->remove ? ST_XATTR_DELETE : ST_XATTR_PUT, &st);
	if (rc)
		return rc;
	rc = bind_i64(st, 1, (int64_t)a->ino);
	if (rc == 0)
		rc = bind_blob(st, 2, a->name, a->nlen);
	if (rc == 0 && !a->remove)
		rc = bind_blob(st, 3, a->value, a->size);
	if (rc == 0)
		rc = step(st);
	if (rc > 0)
		rc = 0;
	stmt_done(st);
	if (rc)
		return rc;
	at.ctime = now_ts();
	return inode_put(c, &at);
}

int meta_setxattr(struct meta *m, uint64_t ino, const char *name, const void *value,
		  size_t size, int flags)
{
	struct xattr_args a = { .ino = ino, .name = name, .value = value, .size = size,
				.flags = flags };
	int rc;

	if (m == NULL || (value == NULL && size > 0) ||
	    (flags & ~(META_XATTR_CREATE | META_XATTR_REPLACE)) ||
	    flags == (META_XATTR_CREATE | META_XATTR_REPLACE))
		return -EINVAL;
	rc = xattr_name_check(name, &a.nlen);
	if (rc)
		return rc;
	if (size > META_XATTR_SIZE_MAX)
		return -E2BIG;
	if (!ino_ok(ino))
		return -ENOENT;
	struct mj_rec r = { .op = MJ_SETXATTR, .v = { ino, (uint64_t)flags }, .s = { name, value },
			    .slen = { (uint32_t)a.nlen, (uint32_t)size } };
	return txn_rec(m, &r, NULL, do_xattr, &a);
}

int meta_removexattr(struct meta *m, uint64_t ino, const char *name)
{
	struct xattr_args a = { .ino = ino, .name = name, .remove = 1 };
	int rc;

	if (m == NULL)
		return -EINVAL;
	rc = xattr_name_check(name, &a.nlen);
	if (rc)
		return rc;
	if (!ino_ok(ino))
		return -ENOENT;
	struct mj_rec r = { .op = MJ_REMOVEXATTR, .v = { ino }, .s = { name },
			    .slen = { (uint32_t)a.nlen } };
	return txn_rec(m, &r, NULL, do_xattr, &a);
}

int meta_getxattr(struct meta *m, uint64_t ino, const char *name, void **value, size_t *size)
{
	sqlite3_stmt *st = NULL;
	struct meta_attr at;
	READ_CONN(c);
	const void *p;
	size_t nlen;
	void *v;
	int rc, n;

	if (m == NULL || value == NULL || size == NULL)
		return -EINVAL;
	*value = NULL;
	*size = 0;
	rc = xattr_name_check(name, &nlen);
	if (rc)
		return rc;
	rc = read_conn(m, &c);
	if (rc)
		return rc;
	rc = inode_get(c, ino, &at);
	if (rc)
		return ro(rc);
	rc = stmt(c, ST_XATTR_GET, &st);
	if (rc)
		return ro(rc);
	rc = bind_i64(st, 1, (int64_t)ino);
	if (rc == 0)
		rc = bind_blob(st, 2, name, nlen);
	if (rc == 0)
		rc = step(st);
	if (rc == 0)
		rc = -ENODATA;
	if (rc < 0)
		goto out;
	p = sqlite3_column_blob(st, 0);
	n = sqlite3_column_bytes(st, 0);
	if ((sqlite3_column_type(st, 0) != SQLITE_BLOB &&
	     sqlite3_column_type(st, 0) != SQLITE_TEXT) ||
	    n < 0 || n > META_XATTR_SIZE_MAX || (n > 0 && p == NULL)) {
		rc = -EIO;
		goto out;
	}
	v = malloc(n > 0 ? (size_t)n : 1);
	if (v == NULL) {
		rc = -ENOMEM;
		goto out;
	}
	if (n > 0)
		memcpy(v, p, (size_t)n);
	*value = v;
	*size = (size_t)n;
	rc = 0;
out:
	stmt_done(st);
	return ro(rc);
}

int meta_listxattr(struct meta *m, uint64_t ino, char **list, size_t *size)
{
	sqlite3_stmt *st = NULL;
	struct meta_attr at;
	READ_CONN(c);
	char *buf = NULL, *nb;
	size_t len = 0, cap = 0;
	char name[META_XATTR_NAME_MAX + 1];
	int rc;

	if (m == NULL || list == NULL || size == NULL)
		return -EINVAL;
	*list = NULL;
	*size = 0;
	rc = read_conn(m, &c);
	if (rc)
		return rc;
	rc = inode_get(c, ino, &at);
	if (rc)
		return ro(rc);
	rc = stmt(c, ST_XATTR_LIST, &st);
	if (rc)
		return ro(rc);
	rc = bind_i64(st, 1, (int64_t)ino);
	if (rc)
		goto out;
	while ((rc = step(st)) > 0) {
		size_t n;

		if (col_name(st, 0, name, META_XATTR_NAME_MAX)) {
			rc = -EIO;
			goto out;
		}
		n = strlen(name) + 1;
		if (len + n > cap) {
			size_t ncap = cap ? cap * 2 : 256;
			while (ncap < len + n)
				ncap *= 2;
			nb = realloc(buf, ncap);
			if (nb == NULL) {
				rc = -ENOMEM;
				goto out;
			}
			buf = nb;
			cap = ncap;
		}
		memcpy(buf + len, name, n);
		len += n;
	}
	if (rc == 0) {
		*list = buf;
		*size = len;
		buf = NULL;
	}
out:
	stmt_done(st);
	free(buf);
	return ro(rc);
}

/* ---- statfs and slices ------------------------------------------------------ */

int meta_statfs(struct meta *m, uint64_t *used_bytes, uint64_t *used_inodes)
{
	sqlite3_stmt *st = NULL;
	READ_CONN(c);
	int64_t b, n;
	int rc;

	if (m == NULL)
		return -EINVAL;
	rc = read_conn(m, &c);
	if (rc)
		return rc;
	rc = stmt(c, ST_STATFS, &st);
	if (rc)
		return ro(rc);
	rc = step(st);
	if (rc == 0)
		rc = -EIO;
	if (rc > 0)
		rc = (col_int(st, 0, 0, INT64_MAX, &b) || col_int(st, 1, 0, INT64_MAX, &n)) ? -EIO :
											      0;
	stmt_done(st);
	if (rc == 0) {
		if (used_bytes)
			*used_bytes = (uint64_t)b;
		if (used_inodes)
			*used_inodes = (uint64_t)n;
	}
	return ro(rc);
}

/* ---- gc ------------------------------------------------------------------ */

static int do_gc_mark(struct conn *c, void *p)
{
	return run_ints(c, ST_GC_MARK, 1, p);
}

int meta_gc_mark(struct meta *m, int64_t mark)
{
	if (m == NULL || mark <= 0)
		return -EINVAL;
	return txn(m, do_gc_mark, &mark);
}

int meta_gc_last_mark(struct meta *m, int64_t *mark)
{
	READ_CONN(c);
	int rc;

	if (m == NULL || mark == NULL)
		return -EINVAL;
	rc = read_conn(m, &c);
	if (rc == 0)
		rc = query_int(c, ST_GC_LAST_MARK, 0, NULL, 0, INT64_MAX, 0, mark);
	return ro(rc);
}

int meta_gc_list(struct meta *m, int64_t mark, int64_t before, size_t max,
		 struct meta_gc_item **out, size_t *n)
{
	sqlite3_stmt *st = NULL;
	struct meta_gc_item *v = NULL;
	READ_CONN(c);
	int rc;

	if (m == NULL || out == NULL || n == NULL || max == 0 || max > INT32_MAX)
		return -EINVAL;
	*out = NULL;
	*n = 0;
	rc = read_conn(m, &c);
	if (rc)
		return rc;
	v = calloc(max, sizeof(*v));
	if (!v)
		return -ENOMEM;
	rc = stmt(c, ST_GC_LIST, &st);
	if (rc == 0)
		rc = bind_i64(st, 1, mark);
	if (rc == 0)
		rc = bind_i64(st, 2, before);
	if (rc == 0)
		rc = bind_i64(st, 3, (int64_t)max);
	while (rc == 0 && *n < max && (rc = step(st)) > 0) {
		int64_t id, size;

		rc = (col_int(st, 0, 1, INT64_MAX, &id) || col_int(st, 1, 0, UINT32_MAX, &size)) ?
			     -EIO : 0;
		if (rc == 0)
			v[(*n)++] = (struct meta_gc_item){ .id = (uint64_t)id, .size = (uint32_t)size };
	}
	stmt_done(st);
	if (rc < 0) {
		free(v);
		*n = 0;
		return ro(rc);
	}
	*out = v;
	return 0;
}

struct gc_forget_args {
	const struct meta_gc_item *items;
	size_t n;
};

static int do_gc_forget(struct conn *c, void *p)
{
	struct gc_forget_args *a = p;
	int rc = 0;

	for (size_t i = 0; i < a->n && rc == 0; i++)
		rc = run_ints(c, ST_GC_FORGET, 1, (int64_t[]){ (int64_t)a->items[i].id });
	return rc;
}

int meta_gc_forget(struct meta *m, const struct meta_gc_item *items, size_t n)
{
	struct gc_forget_args a = { items, n };

	if (m == NULL || (items == NULL && n > 0))
		return -EINVAL;
	return n ? txn(m, do_gc_forget, &a) : 0;
}

int meta_gc_pending(struct meta *m, uint64_t *slices, uint64_t *bytes)
{
	sqlite3_stmt *st = NULL;
	READ_CONN(c);
	int64_t cnt = 0, sum = 0;
	int rc;

	if (m == NULL)
		return -EINVAL;
	rc = read_conn(m, &c);
	if (rc)
		return rc;
	rc = stmt(c, ST_GC_PENDING, &st);
	if (rc == 0)
		rc = step(st);
	if (rc == 0)
		rc = -EIO;
	if (rc > 0)
		rc = (col_int(st, 0, 0, INT64_MAX, &cnt) || col_int(st, 1, 0, INT64_MAX, &sum)) ?
			     -EIO : 0;
	stmt_done(st);
	if (rc == 0) {
		if (slices)
			*slices = (uint64_t)cnt;
		if (bytes)
			*bytes = (uint64_t)sum;
	}
	return ro(rc);
}

int meta_chunk_slices(struct meta *m, uint64_t ino, uint32_t chunk, struct meta_slice **out,
		      size_t *n)
{
	struct meta_attr at;
	READ_CONN(c);
	int rc;

	if (m == NULL || out == NULL || n == NULL)
		return -EINVAL;
	*out = NULL;
	*n = 0;
	if (!ino_ok(ino))
		return -ENOENT;
	rc = read_conn(m, &c);
	if (rc)
		return rc;
	rc = chunk_load(c, ino, chunk, out, n);
	if (rc == 0 && *n == 0)
		rc = inode_get(c, ino, &at); /* nothing written, or no such file? */
	return ro(rc);
}

struct slice_alloc_args {
	uint32_t count;
	uint64_t first;
};

static int do_slice_alloc(struct conn *c, void *p)
{
	struct slice_alloc_args *a = p;
	sqlite3_stmt *st = NULL;
	int64_t v;
	int rc;

	rc = stmt(c, ST_NEXT_SLICE, &st);
	if (rc)
		return rc;
	rc = bind_i64(st, 1, a->count);
	if (rc == 0)
		rc = step(st);
	if (rc == 0)
		rc = -EIO; /* no counters row, or the ids ran out */
	if (rc > 0)
		rc = col_int(st, 0, 1, INT64_MAX, &v);
	if (rc == 0 && (rc = step(st)) > 0)
		rc = -EIO;
	stmt_done(st);
	if (rc == 0)
		a->first = (uint64_t)v;
	return rc;
}

/* Ids are names and nothing more, so a range taken and never handed out
 * (this handle closed first) is a harmless gap; taking SLICE_ID_RESERVE at
 * a time spares each staging file a write transaction of its own, which
 * in another process would end a deferring daemon's batch. */
#define SLICE_ID_RESERVE 1024

int meta_slice_id_alloc(struct meta *m, uint32_t count, uint64_t *first)
{
	struct slice_alloc_args a;
	int rc = 0;

	if (m == NULL || first == NULL || count == 0)
		return -EINVAL;
	pthread_mutex_lock(&m->ids_lock);
	if (m->ids_end - m->ids_next < count) {
		a = (struct slice_alloc_args){ .count = count < SLICE_ID_RESERVE ? SLICE_ID_RESERVE
										 : count };
		rc = txn(m, do_slice_alloc, &a);
		if (rc == 0) {
			m->ids_next = a.first;
			m->ids_end = a.first + a.count;
		}
	}
	if (rc == 0) {
		*first = m->ids_next;
		m->ids_next += count;
	}
	pthread_mutex_unlock(&m->ids_lock);
	return rc;
}

struct commit_args {
	uint64_t ino;
	const struct meta_chunk_slice *slices;
	size_t n;
	uint64_t new_size;
	const struct timespec *mtime;
	bool keep_times;        /* leave mtime and ctime as they are */
	struct meta_attr out;
};

static int do_write_commit(struct conn *c, void *p)
{
	struct commit_args *a = p;
	struct meta_attr at;
	size_t i;
	int rc;

	rc = inode_get(c, a->ino, &at);
	if (rc)
		return rc;
	if (S_ISDIR(at.mode))
		return -EISDIR;
	if (!S_ISREG(at.mode))
		return -EINVAL;
	rc = resize_slices(c, at.ino, at.size, a->new_size);
	for (i = 0; i < a->n && rc == 0; i++)
		rc = slice_insert(c, at.ino, a->slices[i].chunk, &a->slices[i].s);
	if (rc)
		return rc;
	at.size = a->new_size;
	if (!a->keep_times)
		at.mtime = at.ctime = a->mtime ? *a->mtime : now_ts();
	rc = inode_put(c, &at);
	if (rc == 0)
		a->out = at;
	return rc;
}

static int slice_valid(const struct meta_slice *s)
{
	if (s->len == 0 || s->pos >= META_CHUNK_SIZE || s->len > META_CHUNK_SIZE - s->pos ||
	    s->id > INT64_MAX)
		return 0;
	return s->id == 0 || (s->off <= s->size && s->len <= s->size - s->off);
}

/* Checks a commit's arguments before any transaction. */
static int commit_args_check(struct meta *m, const struct commit_args *a)
{
	if (m == NULL || (a->slices == NULL && a->n > 0) || (a->mtime != NULL && !ts_valid(a->mtime)))
		return -EINVAL;
	if (a->new_size > MAX_FILE_SIZE)
		return -EFBIG;
	for (size_t i = 0; i < a->n; i++)
		if (!slice_valid(&a->slices[i].s))
			return -EINVAL;
	if (!ino_ok(a->ino))
		return -ENOENT;
	return 0;
}

int meta_write_commit(struct meta *m, uint64_t ino, const struct meta_chunk_slice *slices,
		      size_t n, uint64_t new_size, const struct timespec *mtime,
		      struct meta_attr *out)
{
	struct commit_args a = { .ino = ino, .slices = slices, .n = n, .new_size = new_size,
				 .mtime = mtime };
	int rc = commit_args_check(m, &a);

	if (rc == 0)
		rc = txn(m, do_write_commit, &a);
	if (rc == 0 && out != NULL)
		*out = a.out;
	return rc;
}

struct commit_seq_args {
	struct commit_args commit;
	uint64_t seq;
	uint64_t meta_seq;
};

static int do_write_commit_seq(struct conn *c, void *p)
{
	struct commit_seq_args *a = p;
	int64_t ino = (int64_t)a->commit.ino, last = 0;
	int rc;

	rc = query_int(c, ST_SEQ_GET, 1, &ino, 0, INT64_MAX, 0, &last);
	if (rc == -ENOENT)
		rc = 0;
	else if (rc == 0 && (uint64_t)last >= a->seq)
		rc = -EALREADY;
	if (rc == 0 && a->meta_seq > 0) {
		int64_t tseq = 0;

		/* Times set explicitly after the handoff stay. */
		rc = query_int(c, ST_TIMES_SEQ_GET, 1, &ino, 0, INT64_MAX, 0, &tseq);
		if (rc == 0 && (uint64_t)tseq > a->meta_seq)
			a->commit.keep_times = true;
		if (rc == -ENOENT)
			rc = 0;
	}
	if (rc == 0)
		rc = do_write_commit(c, &a->commit);
	if (rc == 0)
		rc = run_ints(c, ST_SEQ_PUT, 2, (const int64_t[]){ ino, (int64_t)a->seq });
	return rc;
}

/* Refusals that do_write_commit_seq() makes before it changes a row: the
 * item fails alone and the batch's transaction goes on. */
static int commit_refused_early(int rc)
{
	return rc == -EALREADY || rc == -ENOENT || rc == -EISDIR || rc == -EINVAL ||
	       rc == -EINPROGRESS;
}

/* The database holds less of the journal than seq (see meta.h). */
static bool journal_behind(struct conn *c, uint64_t seq)
{
	int64_t have = 0;
	int rc = query_int(c, ST_JOURNAL_GET, 0, NULL, 0, INT64_MAX, 0, &have);

	/* No table: no journal was ever opened here; that seq is not ours. */
	return rc == 0 ? (uint64_t)have < seq : rc != -EIO;
}

struct commit_batch_args {
	struct meta_commit_item *items;
	size_t n;
};

static int do_write_commit_batch(struct conn *c, void *p)
{
	struct commit_batch_args *b = p;

	for (size_t i = 0; i < b->n; i++) {
		struct meta_commit_item *it = &b->items[i];
		struct commit_seq_args a = { .commit = { .ino = it->ino, .slices = it->slices,
							 .n = it->n, .new_size = it->new_size,
							 .mtime = it->mtime },
					     .seq = it->seq, .meta_seq = it->meta_seq };
		int rc;

		if (it->seq == 0 || it->seq > INT64_MAX || it->meta_seq > INT64_MAX)
			rc = -EINVAL;
		else if (it->meta_seq > 0 && journal_behind(c, it->meta_seq))
			rc = -EINPROGRESS;
		else if ((rc = commit_args_check(c->m, &a.commit)) == 0)
			rc = do_write_commit_seq(c, &a);
		if (rc != 0 && !commit_refused_early(rc))
			return rc; /* the whole transaction goes */
		it->rc = rc;
		if (rc == 0)
			it->out = a.commit.out;
	}
	return 0;
}

int meta_write_commit_batch(struct meta *m, struct meta_commit_item *items, size_t n)
{
	struct commit_batch_args b = { .items = items, .n = n };
	int rc;

	if (m == NULL || (items == NULL && n > 0))
		return -EINVAL;
	if (n == 0)
		return 0;
	rc = txn(m, do_write_commit_batch, &b);
	if (rc != 0)
		for (size_t i = 0; i < n; i++)
			items[i].rc = rc;
	return rc;
}

int meta_write_commit_seq(struct meta *m, uint64_t ino, uint64_t seq,
			  const struct meta_chunk_slice *slices, size_t n, uint64_t new_size,
			  const struct timespec *mtime, struct meta_attr *out)
{
	struct meta_commit_item it = { .ino = ino, .seq = seq, .slices = slices, .n = n,
				       .new_size = new_size, .mtime = mtime };
	int rc = meta_write_commit_batch(m, &it, 1);

	if (rc == 0)
		rc = it.rc;
	if (rc == 0 && out != NULL)
		*out = it.out;
	return rc;
}

int meta_set_batched(struct meta *m, int batched)
{
	int rc = 0;

	atomic_store(&m->batched, batched);
	pthread_mutex_lock(&m->ckpt_lock);
	if (batched && !m->ckpt_started) {
		rc = -pthread_create(&m->ckpt_thread, NULL, ckpt_main, m);
		m->ckpt_started = rc == 0;
	}
	pthread_mutex_unlock(&m->ckpt_lock);
	return rc;
}

void meta_ckpt_pause(struct meta *m, int paused)
{
	atomic_store(&m->ckpt_paused, paused);
}

uint64_t meta_ckpt_inline(struct meta *m)
{
	return atomic_load(&m->ckpt_inline);
}

int meta_sync(struct meta *m)
{
	char wal[PATH_MAX];
	uint64_t made, synced;
	int fd, rc = 0;

	if (m == NULL)
		return -EINVAL;
	if (m->jfd >= 0) {
		rc = meta_flush(m);
		if (rc)
			return rc;
	}
	if (!atomic_load(&m->batched))
		return 0; /* every commit was synced already */
	/* Read before the sync: a commit that lands during it may miss it. */
	made = atomic_load(&m->commits_made);
	if (made == atomic_load(&m->commits_synced))
		return 0; /* nothing of ours since the last sync */
	/*
	 * A batched commit has appended its frames to the WAL with write();
	 * syncing that file makes them (and all before them) durable, which is
	 * what synchronous=FULL does at each commit. Done here, outside any
	 * transaction, the sync holds no database lock: other writers go on.
	 * No WAL: everything was checkpointed into the database, which a
	 * checkpoint syncs.
	 */
	if ((size_t)snprintf(wal, sizeof(wal), "%s-wal", m->path) >= sizeof(wal))
		return -ENAMETOOLONG;
	fd = open(wal, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return errno == ENOENT ? 0 : -errno;
	if (fdatasync(fd) < 0)
		rc = -EIO;
	close(fd);
	/* Raised, never lowered: syncs run on several threads at once. */
	synced = atomic_load(&m->commits_synced);
	while (rc == 0 && synced < made &&
	       !atomic_compare_exchange_weak(&m->commits_synced, &synced, made))
		;
	/* Once: the WAL's own name in its directory. */
	if (rc == 0 && !atomic_load(&m->dir_synced)) {
		char *slash = strrchr(wal, '/');
		if (slash) {
			*slash = '\0';
			fd = open(slash == wal ? "/" : wal, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
			if (fd >= 0) {
				if (fsync(fd) == 0)
					atomic_store(&m->dir_synced, 1);
				close(fd);
			}
		}
	}
	return rc;
}

static int do_seq_epoch(struct conn *c, void *p)
{
	int64_t *epoch = p;

	return query_int(c, ST_EPOCH_NEXT, 0, NULL, 1, INT32_MAX, 0, epoch);
}

static int do_seq_floor(struct conn *c, void *p)
{
	const int64_t *v = p;

	return run_ints(c, ST_SEQ_FLOOR, 2, v);
}

int meta_seq_floor(struct meta *m, uint64_t ino, uint64_t seq)
{
	int64_t v[2] = { (int64_t)ino, (int64_t)seq };

	if (m == NULL || seq == 0 || seq > INT64_MAX || !ino_ok(ino))
		return -EINVAL;
	return txn(m, do_seq_floor, v);
}

int meta_seq_epoch(struct meta *m, uint64_t *epoch)
{
	int64_t e = 0;
	int rc;

	if (m == NULL || epoch == NULL)
		return -EINVAL;
	rc = txn(m, do_seq_epoch, &e);
	if (rc == 0)
		*epoch = (uint64_t)e;
	return rc;
}

struct punch_args {
	uint64_t ino, off, len;
	struct meta_attr out;
};

/* Zeroes chunk bytes [s, e) of chunk; whole = nothing of the chunk stays. */
static int punch_chunk(struct conn *c, uint64_t ino, uint32_t chunk, uint32_t s, uint32_t e,
		       int whole)
{
	if (whole)
		return slices_drop(c, ino, chunk, chunk);
	return zero_range(c, ino, chunk, s, e);
}

static int do_punch(struct conn *c, void *p)
{
	struct punch_args *a = p;
	struct meta_attr at;
	uint64_t end, c0, c1, k;
	int rc = 0;

	rc = inode_get(c, a->ino, &at);
	if (rc)
		return rc;
	if (S_ISDIR(at.mode))
		return -EISDIR;
	if (!S_ISREG(at.mode))
		return -EINVAL;
	end = a->off + a->len < at.size ? a->off + a->len : at.size;
	if (a->off < end) {
		c0 = a->off / META_CHUNK_SIZE;
		c1 = (end - 1) / META_CHUNK_SIZE;
		/* A chunk is dropped whole when the punch covers it from its start
		 * to its end or to the end of the file. */
		for (k = c0; k <= c1 && rc == 0; k = (k == c0 && c1 > c0 + 1) ? c1 : k + 1) {
			uint64_t base = k * META_CHUNK_SIZE;
			uint32_t s = (uint32_t)((a->off > base ? a->off : base) - base);
			uint64_t ce = end < base + META_CHUNK_SIZE ? end : base + META_CHUNK_SIZE;
			uint32_t e = (uint32_t)(ce - base);
			int whole = s == 0 && (e == META_CHUNK_SIZE || ce >= at.size);

			rc = punch_chunk(c, at.ino, (uint32_t)k, s, e, whole);
		}
		if (rc == 0 && c1 > c0 + 1)
			rc = slices_drop(c, at.ino, (int64_t)c0 + 1, (int64_t)c1 - 1);
		if (rc)
			return rc;
	}
	at.mtime = at.ctime = now_ts();
	rc = inode_put(c, &at);
	if (rc == 0)
		a->out = at;
	return rc;
}

int meta_punch_hole(struct meta *m, uint64_t ino, uint64_t off, uint64_t len,
		    struct meta_attr *out)
{
	struct punch_args a = { .ino = ino, .off = off, .len = len };
	int rc;

	if (m == NULL || len == 0 || off > UINT64_MAX - len)
		return -EINVAL;
	if (!ino_ok(ino))
		return -ENOENT;
	rc = txn(m, do_punch, &a);
	if (rc == 0 && out != NULL)
		*out = a.out;
	return rc;
}

/* ---- unlinked inodes ---------------------------------------------------------- */

/* Frees ino if its link count is 0. 1: freed, 0: still linked. */
static int inode_free(struct conn *c, uint64_t ino)
{
	const int64_t v[1] = { (int64_t)ino };
	struct meta_attr at;
	int rc;

	rc = inode_get(c, ino, &at);
	if (rc)
		return rc;
	if (at.nlink > 0)
		return 0;
	/* Only a regular file has data and commit seqs, only a symlink a
	 * target: each statement that cannot match is spared (rm -rf runs
	 * this once per file). */
	if (S_ISREG(at.mode))
		rc = slices_drop(c, ino, 0, INT64_MAX);
	if (rc == 0)
		rc = run_ints(c, ST_XATTR_DELETE_ALL, 1, v);
	if (rc == 0 && S_ISLNK(at.mode))
		rc = run_ints(c, ST_SYMLINK_DELETE, 1, v);
	if (rc == 0)
		rc = run_ints(c, ST_INODE_DELETE, 1, v);
	if (rc == 0)
		hot_forget(c, ino); /* only once the row is gone */
	if (rc == 0)
		rc = run_ints(c, ST_ORPHAN_DELETE, 1, v);
	if (rc == 0 && S_ISREG(at.mode))
		rc = run_ints(c, ST_TIMES_SEQ_DELETE, 1, v);
	return rc ? rc : 1;
}

static int do_release(struct conn *c, void *p)
{
	int rc = inode_free(c, *(uint64_t *)p);

	return rc > 0 ? 0 : rc;
}

int meta_inode_release(struct meta *m, uint64_t ino)
{
	if (m == NULL)
		return -EINVAL;
	if (!ino_ok(ino))
		return -ENOENT;
	struct mj_rec r = { .op = MJ_RELEASE, .v = { ino } };
	return txn_rec(m, &r, NULL, do_release, &ino);
}

struct purge_args {
	uint64_t ino[PURGE_BATCH];
	size_t n;
	uint64_t freed;
};

static int do_purge(struct conn *c, void *p)
{
	struct purge_args *a = p;
	size_t i;
	int rc;

	a->freed = 0;
	for (i = 0; i < a->n; i++) {
		rc = inode_free(c, a->ino[i]);
		if (rc == 1) {
			a->freed++;
			continue;
		}
		/* Linked again or gone: the orphan row is stale. */
		if (rc == 0 || rc == -ENOENT)
			rc = run_ints(c, ST_ORPHAN_DELETE, 1, (int64_t[]){ (int64_t)a->ino[i] });
		if (rc)
			return rc;
	}
	return 0;
}

int meta_orphans_purge(struct meta *m, uint64_t *count)
{
	struct purge_args a;
	sqlite3_stmt *st = NULL;
	uint64_t total = 0, after = 0;
	struct conn *c;
	int64_t v;
	int rc;

	if (m == NULL)
		return -EINVAL;
	rc = conn_get(m, &c);
	if (rc)
		return rc;
	for (;;) {
		a.n = 0;
		rc = stmt(c, ST_ORPHAN_LIST, &st);
		if (rc)
			break;
		if (bind_i64(st, 1, (int64_t)after) || bind_i64(st, 2, PURGE_BATCH)) {
			rc = -EIO;
			stmt_done(st);
			break;
		}
		while ((rc = step(st)) > 0) {
			if (col_int(st, 0, 1, INT64_MAX, &v) || a.n >= PURGE_BATCH) {
				rc = -EIO;
				break;
			}
			a.ino[a.n++] = (uint64_t)v;
		}
		stmt_done(st);
		if (rc || a.n == 0)
			break;
		after = a.ino[a.n - 1];
		rc = txn(m, do_purge, &a);
		if (rc)
			break;
		total += a.freed;
	}
	if (count != NULL)
		*count = total;
	return ro(rc);
}

/* ---- the journal: replay, open, flush ------------------------------------ */

/* A record's string as a C string (names and targets hold no NUL). */
static int rec_str(const struct mj_rec *r, int i, char *buf, size_t cap)
{
	if (r->slen[i] >= cap || (r->slen[i] && memchr(r->s[i], '\0', r->slen[i]) != NULL))
		return -EINVAL;
	if (r->slen[i])
		memcpy(buf, r->s[i], r->slen[i]);
	buf[r->slen[i]] = '\0';
	return 0;
}

/* Makes r's change again in the batch (write_lock held, tl_replaying set). */
static int replay_one(struct meta *m, const struct mj_rec *r)
{
	char name[SYMLINK_MAX + 1], name2[SYMLINK_MAX + 1];
	int rc;

	rc = rec_str(r, 0, name, META_NAME_MAX + 1);
	if (rc == 0 && r->op != MJ_SETXATTR)
		rc = rec_str(r, 1, name2, sizeof(name2));
	if (rc)
		return rc;
	switch (r->op) {
	case MJ_CREATE: {
		struct create_args a = { .parent = r->v[0], .name = name, .nlen = r->slen[0],
					 .mode = (uint32_t)r->v[1], .uid = (uint32_t)r->v[2],
					 .gid = (uint32_t)r->v[3], .rdev = r->v[4],
					 .target = r->slen[1] ? name2 : NULL, .tlen = r->slen[1],
					 .want_ino = r->v[J_RESULT] };
		rc = batch_run(m, NULL, NULL, do_create, &a);
		/* The same state and the same changes give the same inode; if
		 * not, later records name the wrong one. */
		if (rc == 0 && a.out.ino != r->v[J_RESULT])
			rc = -ESTALE;
		return rc;
	}
	case MJ_LINK: {
		struct link_args a = { .ino = r->v[0], .parent = r->v[1], .name = name,
				       .nlen = r->slen[0] };
		return batch_run(m, NULL, NULL, do_link, &a);
	}
	case MJ_UNLINK:
	case MJ_RMDIR: {
		struct remove_args a = { .parent = r->v[0], .name = name, .nlen = r->slen[0],
					 .dir = r->op == MJ_RMDIR };
		return batch_run(m, NULL, NULL, do_remove, &a);
	}
	case MJ_RENAME: {
		struct rename_args a = { .parent = r->v[0], .newparent = r->v[1], .name = name,
					 .newname = name2, .nlen = r->slen[0],
					 .newnlen = r->slen[1], .flags = (unsigned)r->v[2] };
		return batch_run(m, NULL, NULL, do_rename, &a);
	}
	case MJ_SETATTR: {
		struct meta_attr in = { .mode = (uint32_t)r->v[2], .uid = (uint32_t)r->v[3],
					.gid = (uint32_t)r->v[4], .size = r->v[5],
					.atime = { (time_t)r->v[6], (long)r->v[7] },
					.mtime = { (time_t)r->v[8], (long)r->v[9] },
					.ctime = { (time_t)r->v[10], (long)r->v[11] } };
		struct setattr_args a = { .ino = r->v[0], .valid = (unsigned)r->v[1], .in = &in };
		if ((a.valid & ~META_SET_ALL) || !ts_valid(&in.atime) || !ts_valid(&in.mtime) ||
		    !ts_valid(&in.ctime))
			return -EINVAL;
		return batch_run(m, NULL, NULL, do_setattr, &a);
	}
	case MJ_SETXATTR:
	case MJ_REMOVEXATTR: {
		struct xattr_args a = { .ino = r->v[0], .name = name, .nlen = r->slen[0],
					.flags = (int)r->v[1], .remove = r->op == MJ_REMOVEXATTR };
		if (r->op == MJ_SETXATTR) {
			if (r->slen[1] > META_XATTR_SIZE_MAX)
				return -EINVAL;
			a.value = r->s[1];
			a.size = r->slen[1];
		}
		return batch_run(m, NULL, NULL, do_xattr, &a);
	}
	case MJ_RELEASE: {
		uint64_t ino = r->v[0];
		return batch_run(m, NULL, NULL, do_release, &ino);
	}
	}
	return -EINVAL;
}

/*
 * Makes every journal record past m->applied again, in order, into the
 * batch (write_lock held). A record that ends the file early or fails its
 * check ends the journal. A record the database refuses now is counted and
 * skipped: the others do not depend on the database agreeing with it.
 */
static int journal_replay(struct meta *m, uint64_t *count)
{
	unsigned char *buf = NULL;
	struct stat sb;
	size_t off = 0, len;
	int rc = 0;

	*count = 0;
	if (fstat(m->jfd, &sb) < 0)
		return -errno;
	len = (size_t)sb.st_size;
	if (len == 0)
		goto out;
	buf = malloc(len);
	if (buf == NULL)
		return -ENOMEM;
	for (size_t got = 0; got < len;) {
		ssize_t n = pread(m->jfd, buf + got, len - got, (off_t)got);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			rc = n < 0 ? -errno : -EIO;
			goto out;
		}
		got += (size_t)n;
	}
	tl_replaying = 1;
	while (off < len) {
		struct mj_rec r;
		long n = mj_decode(buf + off, len - off, &r);

		if (n <= 0)
			break;
		if (r.seq > m->applied) {
			tl_now = &r.now;
			tl_seq = r.seq;
			rc = replay_one(m, &r);
			tl_seq = 0;
			tl_now = NULL;
			if (rc == -ENOSPC || rc == -EIO || rc == -ENOMEM || rc == -EAGAIN ||
			    m->bc == NULL || sqlite3_get_autocommit(m->bc->db)) {
				/* The database failed, not the record. */
				tl_replaying = 0;
				if (rc == 0)
					rc = -EIO;
				goto out;
			}
			if (rc == 0)
				(*count)++;
			else
				m->js.replay_errors++;
			rc = 0;
			if (r.seq > m->jseq)
				m->jseq = r.seq;
		}
		off += (size_t)n;
	}
	tl_replaying = 0;
	m->js.replayed += *count;
	/* Later records go after the last good one. */
	m->jsize = (off_t)off;
out:
	free(buf);
	return rc;
}

/* The flusher: commits a batch flush_ms after it opened. */
static void *flush_main(void *arg)
{
	struct meta *m = arg;

	pthread_mutex_lock(&m->write_lock);
	while (!m->flush_stop) {
		struct timespec until, now;

		if (!m->batch_open) {
			pthread_cond_wait(&m->flush_cond, &m->write_lock);
			continue;
		}
		until = m->batch_since;
		until.tv_nsec += (long)m->flush_ms * 1000000L;
		until.tv_sec += until.tv_nsec / 1000000000L;
		until.tv_nsec %= 1000000000L;
		clock_gettime(CLOCK_MONOTONIC, &now);
		if (now.tv_sec < until.tv_sec ||
		    (now.tv_sec == until.tv_sec && now.tv_nsec < until.tv_nsec)) {
			pthread_cond_timedwait(&m->flush_cond, &m->write_lock, &until);
			continue;
		}
		if (batch_commit(m) != 0) {
			/* The batch is open again (replayed): wait a round. */
			clock_gettime(CLOCK_MONOTONIC, &m->batch_since);
		}
	}
	pthread_mutex_unlock(&m->write_lock);
	return NULL;
}

int meta_journal_open(struct meta *m, const char *journal_path, int flush_ms,
		      uint64_t *replayed)
{
	uint64_t n = 0;
	int64_t applied = 0;
	int fd = -1, rc;

	if (m == NULL || journal_path == NULL || flush_ms <= 0)
		return -EINVAL;
	if (m->jfd >= 0)
		return -EALREADY;
	rc = meta_set_batched(m, 1);
	if (rc)
		return rc;
	fd = open(journal_path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (fd < 0)
		return -errno;
	if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
		rc = errno == EWOULDBLOCK ? -EBUSY : -errno;
		goto fail;
	}
	rc = conn_open(m->path, &m->bc);
	if (rc)
		goto fail;
	m->bc->m = m;
	if (sqlite3_exec(m->bc->db,
			 "CREATE TABLE IF NOT EXISTS journal(id INTEGER PRIMARY KEY CHECK (id = 1),"
			 " seq INTEGER NOT NULL); INSERT OR IGNORE INTO journal(id, seq)"
			 " VALUES (1, 0)",
			 NULL, NULL, NULL) != SQLITE_OK) {
		rc = -EIO;
		goto fail;
	}
	rc = query_int(m->bc, ST_JOURNAL_GET, 0, NULL, 0, INT64_MAX, 0, &applied);
	if (rc)
		goto fail;
	pthread_mutex_lock(&m->write_lock);
	m->applied = m->jseq = (uint64_t)applied;
	m->flush_ms = flush_ms;
	m->jfd = fd;
	rc = journal_replay(m, &n);
	if (rc == 0)
		rc = batch_commit(m);
	if (rc == 0 && ftruncate(fd, 0) == 0)
		m->jsize = 0;
	if (rc) {
		batch_lost(m);
		m->jfd = -1;
	}
	pthread_mutex_unlock(&m->write_lock);
	if (rc)
		goto fail;
	rc = -pthread_create(&m->flush_thread, NULL, flush_main, m);
	if (rc) {
		meta_flush(m);
		m->jfd = -1;
		goto fail;
	}
	m->flush_started = 1;
	if (replayed)
		*replayed = n;
	return 0;
fail:
	if (m->bc) {
		conn_free(m->bc);
		m->bc = NULL;
	}
	close(fd);
	return rc;
}

uint64_t meta_journal_last(struct meta *m)
{
	uint64_t seq;

	if (m == NULL || m->jfd < 0)
		return 0;
	pthread_mutex_lock(&m->write_lock);
	seq = m->jseq;
	pthread_mutex_unlock(&m->write_lock);
	return seq;
}

int meta_flush(struct meta *m)
{
	int rc;

	if (m == NULL)
		return -EINVAL;
	if (m->jfd < 0)
		return 0;
	pthread_mutex_lock(&m->write_lock);
	rc = batch_commit(m);
	pthread_mutex_unlock(&m->write_lock);
	return rc;
}

void meta_journal_stats_get(struct meta *m, struct meta_journal_stats *out)
{
	memset(out, 0, sizeof(*out));
	if (m == NULL || m->jfd < 0)
		return;
	pthread_mutex_lock(&m->write_lock);
	*out = m->js;
	out->pending = m->jseq - m->applied;
	pthread_mutex_unlock(&m->write_lock);
}
