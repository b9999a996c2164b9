/*
 * meta_db: the driver under the metadata engine. The engine's rules (what a
 * rename, a link or a commit does: meta_rules.c) and its deferred commits
 * (meta_batch.c) are written once, against this; a driver (meta_sqlite.c,
 * meta_pg.c) only runs the catalogue's statements on a connection of its
 * database, opens and ends transactions, and reads typed rows.
 *
 * The catalogue (meta_sql.c) holds each statement once, in SQL that both
 * engines run; its parameters are ?1, ?2, ... with their types spelled out
 * (a driver that needs them declared, PostgreSQL, declares them). A driver
 * may substitute its own text for a statement where the engines' dialects
 * part (BEGIN IMMEDIATE), and replaces META_SQL_NOW_MS with its database's
 * clock in milliseconds since the epoch (meta_sql_expand). 
 *
 * Ownership: a connection belongs to one thread at a time (the engine's
 * per-thread key, or the batch under write_lock); its statements belong to
 * it and live until it is freed. A row's column values stay valid until
 * the statement's next step or done.
 */
#ifndef FERRY_META_DB_H
#define FERRY_META_DB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct meta;

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
	ST_VOLUME_INSERT,
	ST_COUNTERS_INSERT,
	ST_SEQS_GET,
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
	ST_LEASE_GET,
	ST_LEASE_TAKE,
	ST_LEASE_RENEW,
	ST_LEASE_RELEASE,
	ST_LEASE_EPOCH,
	ST_COUNT
};

/* A statement of the catalogue: its SQL, and its parameters' types, one
 * letter each: 'i' a 64-bit integer, 'b' bytes, 't' text. */
struct meta_sql {
	const char *sql;
	const char *params;
};
extern const struct meta_sql meta_sql[ST_COUNT];
#define META_SQL_NOW_MS "{now_ms}"
/* sql with every META_SQL_NOW_MS replaced by now_ms, and each '?' by
 * param_mark (PostgreSQL's '$'; '?' keeps it): malloc'ed, NULL if out of
 * memory. */
char *meta_sql_expand(const char *sql, const char *now_ms, char param_mark);

enum db_type { DB_NULL, DB_INT, DB_BLOB, DB_TEXT, DB_OTHER };

struct db_driver;

/* A connection; a driver's own begins with this. */
struct conn {
	const struct db_driver *drv;
	struct meta *m;
	struct conn *prev, *next; /* on m's list, under its lock */
};

/* A statement prepared on a connection; a driver's own begins with this. */
struct db_stmt {
	const struct db_driver *drv;
};

struct db_driver {
	const char *name;
	/* A new connection to m's database. */
	int (*conn_open)(struct meta *m, struct conn **out);
	void (*conn_free)(struct conn *c); /* accepts NULL */
	/* Before a write transaction on c (the thread that owns c). */
	int (*conn_write_prepare)(struct conn *c);
	/* Statement id of the catalogue, prepared once per connection. */
	int (*stmt)(struct conn *c, enum st id, struct db_stmt **out);
	int (*bind_i64)(struct db_stmt *st, int i, int64_t v);
	int (*bind_blob)(struct db_stmt *st, int i, const void *p, size_t n);
	int (*bind_text)(struct db_stmt *st, int i, const char *s);
	/* 1: a row, 0: done, or a negative errno (-EAGAIN: busy, retry the
	 * transaction). */
	int (*step)(struct db_stmt *st);
	/* Ends a run: the next bind and step start the statement over. */
	void (*done)(struct db_stmt *st);
	enum db_type (*col_type)(struct db_stmt *st, int i);
	int64_t (*col_i64)(struct db_stmt *st, int i);
	/* The column's bytes (a blob or text) and their length; NULL for an
	 * empty one. */
	const void *(*col_blob)(struct db_stmt *st, int i, size_t *n);
	/* Rows the last INSERT, UPDATE or DELETE on c changed. */
	int64_t (*changes)(struct conn *c);
	/* The last statement on c must have changed n rows, or the change
	 * fails with err (< 0): now, or, for a write whose answer the driver
	 * has not read yet (meta_pg.c's pipeline), from the statement that
	 * reads it or settle(); the change is then rolled back whole. 0 if it
	 * did, or may yet. */
	int (*expect_changes)(struct conn *c, int64_t n, int err);
	/* Reads what the database answered to every write sent on c so far
	 * (meta_pg.c queues some): the first failure among them, or 0. A
	 * replay settles each change, so that a failure is its own; a live
	 * change of the batch is acknowledged once journaled, with its writes
	 * unanswered (meta_batch.c: a write that fails later loses the batch,
	 * which the journal makes again). */
	int (*settle)(struct conn *c);
	/* A change starts on c: how many writes of earlier ones are still
	 * unanswered (0: none). Their answers, read later, no longer move
	 * total_changes. */
	int64_t (*change_start)(struct conn *c);
	/* Since change_start, a statement on c failed with the answer to a
	 * write of an earlier change, not one of its own. */
	bool (*failed_earlier)(struct conn *c);
	/* Rows changed on c since it was opened (goes up, never down). */
	int64_t (*total_changes)(struct conn *c);
	/* c is inside a transaction that can still commit: false when the
	 * database ended it on its own (SQLite after some errors) or it can
	 * only roll back (PostgreSQL after any error). */
	bool (*in_txn)(struct conn *c);
	/* Inside a transaction at all, even one that can only roll back. */
	bool (*txn_open)(struct conn *c);
	/* The connection still reaches its database (a server's connection
	 * can drop; the engine then opens another). */
	bool (*conn_ok)(struct conn *c);
	/* A statement outside the catalogue (ferry dump and load, which are
	 * generic over tables), in the catalogue's dialect with params' types:
	 * prepared on c, owned by the caller until stmt_free. */
	int (*stmt_new)(struct conn *c, const char *sql, const char *params,
			struct db_stmt **out);
	void (*stmt_free)(struct db_stmt *st); /* accepts NULL */
	/* What the database said of c's last failure, on one line. */
	const char *(*errmsg)(struct conn *c, char *buf, size_t len);
};

#endif
