/*
 * meta_pg: the shared engine's driver (meta_db.h) on PostgreSQL through
 * libpq, and its volume operations.
 *
 * A volume is named by a URL, postgres://[USER@]HOST[:PORT]/DB?volume=NAME
 * (any other query parameter is libpq's own: sslmode, passfile, host=/dir
 * for a Unix socket...). Each volume is one schema of the database,
 * ferry_NAME, holding the same tables as the SQLite engine's file, so
 * several volumes share one database. A password never comes from the URL
 * (it would sit in the process title and in logs): libpq finds it in
 * PGPASSWORD, ~/.pgpass or the file a passfile= parameter names.
 *
 * Writers take turns as on SQLite: every write transaction starts with a
 * transaction-level advisory lock of the volume's schema, so the rules
 * above (which read, then write) see no other writer's commit mid-way, and
 * READ COMMITTED is enough. Statements are prepared once per connection,
 * with their parameter types declared, and run with binary parameters and
 * results.
 *
 * Round trips: inside a transaction a write whose result nobody reads at
 * once (an INSERT, UPDATE or DELETE without RETURNING) is queued in
 * libpq's pipeline instead of waited for; the next statement that needs
 * an answer (a read, COMMIT, changes()) goes in the same pipeline and one
 * exchange brings every result back. A queued write that failed fails
 * that statement (the transaction is then lost, as after any error; so
 * is one whose row count was not the one expected: doomed). A change of
 * the batch is acknowledged once it is journaled, its writes maybe still
 * unanswered: a create in a directory whose names this mount knows costs
 * no exchange at all. One of them that fails later loses the batch, which
 * the journal makes again (meta_batch.c); a replay settles each change
 * (pg_settle), so that its failure is its own.
 *
 * Durability: a batched connection commits with synchronous_commit off;
 * meta_sync() ends with a commit that waits for the server's WAL flush,
 * which covers every commit before it.
 *
 * Ownership: struct pg_conn owns its PGconn and each statement's last
 * PGresult; struct pg_vol (m->drv_state) owns the connection string and
 * the schema name.
 */
#include "meta_engine.h"

#include <endian.h>
#include <errno.h>
#include <libpq-fe.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"

#define PG_SCHEMA_VERSION META_SCHEMA_VERSION
#define PG_MAX_PARAMS 16
#define PG_VOLUME_NAME_MAX 48
/* Writes queued before the pipeline is ended anyway: a bound on what a
 * failure there makes the engine redo, and on the client's buffers. */
#define PG_QUEUE_MAX 64
/* PostgreSQL's type oids (catalog/pg_type.h, stable across versions). */
#define OID_BOOL 16
#define OID_BYTEA 17
#define OID_INT8 20
#define OID_INT2 21
#define OID_INT4 23
#define OID_TEXT 25
#define OID_VARCHAR 1043

struct pg_conn;

struct pg_stmt {
	struct db_stmt base;
	struct pg_conn *c;
	enum st id;
	int nparams;
	const char *val[PG_MAX_PARAMS];
	int len[PG_MAX_PARAMS];
	int fmt[PG_MAX_PARAMS];
	uint64_t ibuf[PG_MAX_PARAMS]; /* integers in network order */
	PGresult *res;                /* the run's rows, owned */
	int row, nrows;
	bool queued; /* sent in the pipeline, its result not read: no rows */
};

struct pg_conn {
	struct conn base;
	PGconn *pc;
	bool prepared[ST_COUNT];
	struct pg_stmt st[ST_COUNT];
	int64_t changes, total_changes;
	int batched; /* synchronous_commit is off on pc */
	/* A transaction this connection began is open (from BEGIN to COMMIT or
	 * ROLLBACK): a connection lost inside one is never quietly made again,
	 * or the rest of the transaction would commit piece by piece. */
	bool txn;
	bool lost; /* the server hung up (or stopped answering) */
	/* A queued write changed other rows than it had to (expect_changes):
	 * the server does not know, so nothing but a rollback may follow. */
	bool doomed;
	int queued; /* writes sent in the pipeline whose results are not read */
	int earlier; /* the first of them, queued before the change running */
	/* The failure an answer brought was a write of an earlier change
	 * (since pg_change_start). */
	bool failed_earlier;
	bool last_queued; /* the last statement run is the queue's last */
	/* The rows each queued write must have changed (expect_changes), -1:
	 * any, and the failure if it did not. */
	int64_t expect[PG_QUEUE_MAX];
	int expect_err[PG_QUEUE_MAX];
};

/* A statement outside the catalogue (stmt_new): st.id is ST_COUNT. */
struct pg_adhoc {
	struct pg_stmt st;
	char *sql; /* owned: the text with $N */
	Oid oids[PG_MAX_PARAMS];
};

struct pg_vol {
	char *conninfo; /* the URL without volume= */
	char schema[sizeof("ferry_") + PG_VOLUME_NAME_MAX];
	int64_t lock_key; /* the advisory lock every write transaction takes */
};

static struct pg_conn *pgc(struct conn *c)
{
	return (struct pg_conn *)c;
}

static struct pg_stmt *pgs(struct db_stmt *st)
{
	return (struct pg_stmt *)st;
}

/* One exchange with the server (meta_counters). */
static void trip(struct pg_conn *c)
{
	atomic_fetch_add_explicit(&c->base.m->round_trips, 1, memory_order_relaxed);
}

/* A failed result -> a negative errno. -EAGAIN: the transaction may be
 * tried again (a serialization failure or a deadlock). */
static int pg_err(PGconn *pc, const PGresult *res)
{
	const char *state = res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;

	if (PQstatus(pc) != CONNECTION_OK || state == NULL)
		return -EIO;
	/* serialization_failure, deadlock_detected, lock_not_available,
	 * query_canceled (a lock or statement timeout) */
	if (strcmp(state, "40001") == 0 || strcmp(state, "40P01") == 0 ||
	    strcmp(state, "55P03") == 0 || strcmp(state, "57014") == 0)
		return -EAGAIN;
	if (strcmp(state, "53100") == 0)
		return -ENOSPC; /* disk_full */
	if (strcmp(state, "53200") == 0)
		return -ENOMEM; /* out_of_memory */
	return -EIO;
}

struct pg_conn;
static int conn_err(struct pg_conn *c, const PGresult *res);
static int pipe_end(struct pg_conn *c, PGresult **last, bool keep_going);

/* Runs sql (no parameters, any number of statements) on pc. */
static int pg_exec(PGconn *pc, const char *sql)
{
	PGresult *res = PQexec(pc, sql);
	int rc = 0;

	if (PQresultStatus(res) != PGRES_COMMAND_OK && PQresultStatus(res) != PGRES_TUPLES_OK)
		rc = pg_err(pc, res);
	PQclear(res);
	return rc;
}

/* ---- the volume's URL ----------------------------------------------------- */

static bool volume_name_ok(const char *s, size_t n)
{
	if (n == 0 || n > PG_VOLUME_NAME_MAX)
		return false;
	for (size_t i = 0; i < n; i++)
		if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= '0' && s[i] <= '9') || s[i] == '_'))
			return false;
	return true;
}

/*
 * Splits url into libpq's connection string (every parameter but volume=)
 * and the volume's schema. -EINVAL for a URL without a volume, with a bad
 * name, or with a password in it.
 */
static int url_parse(const char *url, struct pg_vol *v)
{
	const char *q = strchr(url, '?'), *auth_end, *host;
	size_t n = strlen(url);
	char *out, *o;
	int have = 0;

	host = strstr(url, "://");
	if (host == NULL)
		return -EINVAL;
	host += 3;
	auth_end = strrchr(host, '@');
	/* A '?' in the user part would make this split differ from libpq's. */
	if (auth_end != NULL && q != NULL && q < auth_end)
		return -EINVAL;
	out = malloc(n + 1);
	if (out == NULL)
		return -ENOMEM;
	if (q == NULL) {
		free(out);
		return -EINVAL;
	}
	memcpy(out, url, (size_t)(q - url));
	o = out + (q - url);
	for (const char *p = q + 1; *p;) {
		const char *end = strchr(p, '&');
		size_t len = end ? (size_t)(end - p) : strlen(p);

		if (len > 7 && strncmp(p, "volume=", 7) == 0) {
			if (have || !volume_name_ok(p + 7, len - 7)) {
				free(out);
				return -EINVAL;
			}
			snprintf(v->schema, sizeof(v->schema), "ferry_%.*s", (int)(len - 7), p + 7);
			have = 1;
		} else if (len > 0) {
			char sep = o == out + (q - url) ? '?' : '&';

			*o++ = sep;
			memcpy(o, p, len);
			o += len;
		}
		p += len;
		if (*p == '&')
			p++;
	}
	*o = '\0';
	if (!have) {
		free(out);
		return -EINVAL;
	}
	/* What libpq itself reads from it: no password (in the user part or
	 * as a parameter, however encoded). */
	{
		char *perr = NULL;
		PQconninfoOption *opts = PQconninfoParse(out, &perr);
		bool bad = opts == NULL;

		for (PQconninfoOption *o = opts; o != NULL && o->keyword != NULL; o++)
			if (strcmp(o->keyword, "password") == 0 && o->val != NULL && *o->val)
				bad = true;
		PQconninfoFree(opts);
		PQfreemem(perr);
		if (bad) {
			free(out);
			return -EINVAL;
		}
	}
	v->conninfo = out;
	/* A stable number for the schema's name (FNV-1a). */
	uint64_t h = 14695981039346656037ull;
	for (const char *s = v->schema; *s; s++)
		h = (h ^ (unsigned char)*s) * 1099511628211ull;
	v->lock_key = (int64_t)(h >> 1);
	return 0;
}

/* ---- connections and statements ------------------------------------------- */

static void pg_conn_free(struct conn *base)
{
	struct pg_conn *c = pgc(base);

	if (c == NULL)
		return;
	for (size_t i = 0; i < ST_COUNT; i++)
		PQclear(c->st[i].res);
	PQfinish(c->pc);
	free(c);
}

static void notice_drop(void *arg, const char *message)
{
	(void)arg;
	(void)message;
}

/* The session a connection needs: its search path on the volume's schema
 * (which need not exist yet: format makes it), an application name that
 * tells an operator's pg_stat_activity which volume a connection serves,
 * and the commit mode. */
static int session_setup(PGconn *pc, const struct pg_vol *v, int batched)
{
	char sql[384];

	/* libpq prints the server's notices on stderr otherwise. */
	PQsetNoticeProcessor(pc, notice_drop, NULL);
	/* The fence check reads the lease inside each write transaction after
	 * its lock: READ COMMITTED, whatever the URL's options say. A writer
	 * whose node died with a transaction open holds the volume's lock
	 * until the server drops that transaction: after a minute, so a
	 * takeover waits no longer (a batch is open a few ms at a time). */
	snprintf(sql, sizeof(sql),
		 "SET search_path TO %s; SET application_name = 'ferryfs %s';"
		 " SET synchronous_commit = %s;"
		 " SET default_transaction_isolation = 'read committed';"
		 " SET idle_in_transaction_session_timeout = '60s'",
		 v->schema, v->schema + 6, batched ? "off" : "on");
	return pg_exec(pc, sql);
}

/* Why a connection failed, as an errno: the server refused who we are
 * (-EACCES: a wrong or missing password, an unknown role or database), or
 * could not be reached (-ECONNREFUSED). */
static int connect_err(PGconn *pc)
{
	const char *msg = PQerrorMessage(pc);

	if (PQconnectionNeedsPassword(pc) || strstr(msg, "authentication failed") ||
	    strstr(msg, "does not exist") || strstr(msg, "no pg_hba.conf entry"))
		return -EACCES;
	return -ECONNREFUSED;
}

static int pg_connect(const struct pg_vol *v, PGconn **out)
{
	PGconn *pc;
	int rc;

	/* Defaults the URL may override (they come first): a server that
	 * stops answering (a partition, a dead host) fails a request within
	 * seconds instead of TCP's quarter of an hour. */
	static const char *const keys[] = { "connect_timeout", "keepalives_idle",
					    "keepalives_interval", "keepalives_count",
					    "tcp_user_timeout", "dbname", NULL };
	const char *vals[] = { "10", "10", "5", "3", "15000", v->conninfo, NULL };

	pc = PQconnectdbParams(keys, vals, 1);
	if (pc == NULL)
		return -ENOMEM;
	if (PQstatus(pc) != CONNECTION_OK) {
		rc = connect_err(pc);
		PQfinish(pc);
		return rc;
	}
	rc = session_setup(pc, v, 0);
	if (rc) {
		PQfinish(pc);
		return rc;
	}
	*out = pc;
	return 0;
}

static int pg_conn_open(struct meta *m, struct conn **out)
{
	struct pg_conn *c;
	int rc;

	c = calloc(1, sizeof(*c));
	if (c == NULL)
		return -ENOMEM;
	c->base.drv = &meta_pg_driver;
	c->base.m = m;
	for (size_t i = 0; i < ST_COUNT; i++) {
		c->st[i].base.drv = &meta_pg_driver;
		c->st[i].c = c;
		c->st[i].id = (enum st)i;
	}
	rc = pg_connect(m->drv_state, &c->pc);
	if (rc) {
		free(c);
		return rc;
	}
	*out = &c->base;
	return 0;
}

/* Batched connections commit without waiting for the WAL flush. */
static int pg_write_prepare(struct conn *base)
{
	struct pg_conn *c = pgc(base);
	int want = atomic_load(&base->m->batched) ? 1 : 0;
	int rc;

	if (c->batched == want)
		return 0;
	rc = pg_exec(c->pc, want ? "SET synchronous_commit = off" : "SET synchronous_commit = on");
	if (rc == 0)
		c->batched = want;
	return rc;
}

/* A statement whose result need not be read before the next one is sent:
 * a write without RETURNING, a savepoint taken or released (see "Round
 * trips" above). */
static bool queueable(enum st id)
{
	const char *sql = meta_sql[id].sql;

	if (id == ST_SAVEPOINT || id == ST_SAVEPOINT_RELEASE)
		return true;
	return (strncmp(sql, "INSERT", 6) == 0 || strncmp(sql, "UPDATE", 6) == 0 ||
		strncmp(sql, "DELETE", 6) == 0) &&
	       strstr(sql, "RETURNING") == NULL;
}

static Oid param_oid(char t)
{
	return t == 'b' ? OID_BYTEA : t == 't' ? OID_TEXT : OID_INT8;
}

/* The server's clock in ms since the epoch (META_SQL_NOW_MS). */
#define PG_NOW_MS "CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)"

/* The catalogue's ?N as PostgreSQL's $N, and the server's clock. */
static char *pg_sql_text(enum st id)
{
	return meta_sql_expand(meta_sql[id].sql, PG_NOW_MS, '$');
}

static int prepare(struct pg_conn *c, enum st id)
{
	const char *types = meta_sql[id].params;
	int n = (int)strlen(types);
	Oid oids[PG_MAX_PARAMS];
	char name[16];
	char *sql;
	PGresult *res;
	int rc = 0;

	if (c->prepared[id] || id == ST_BEGIN)
		return 0;
	if (n > PG_MAX_PARAMS)
		return -EIO;
	/* PQprepare waits for its answer: not inside a pipeline. */
	if (c->queued > 0 && (rc = pipe_end(c, NULL, false)) != 0)
		return rc;
	for (int i = 0; i < n; i++)
		oids[i] = param_oid(types[i]);
	sql = pg_sql_text(id);
	if (sql == NULL)
		return -ENOMEM;
	snprintf(name, sizeof(name), "s%d", (int)id);
	trip(c);
	res = PQprepare(c->pc, name, sql, n, oids);
	free(sql);
	if (PQresultStatus(res) != PGRES_COMMAND_OK)
		rc = conn_err(c, res);
	PQclear(res);
	if (rc)
		return rc;
	c->prepared[id] = true;
	c->st[id].nparams = n;
	return 0;
}

/*
 * The server hung up on c outside a transaction: nothing was lost with it,
 * so the same connection is made again (PQreset keeps its parameters) and
 * the statement tried once more. Inside a transaction the caller gets -EIO
 * instead: the transaction is gone, and the engine makes its batch again
 * from the journal on a new connection.
 */
static int reconnect(struct pg_conn *c)
{
	PQreset(c->pc);
	if (PQstatus(c->pc) != CONNECTION_OK)
		return -EIO;
	c->lost = false;
	c->txn = false;
	c->doomed = false;
	c->queued = 0;
	c->earlier = 0;
	memset(c->prepared, 0, sizeof(c->prepared));
	meta_conn_replaced(c->base.m);
	return session_setup(c->pc, c->base.m->drv_state, c->batched) ? -EIO : 0;
}
static int pg_stmt_get(struct conn *base, enum st id, struct db_stmt **out)
{
	struct pg_conn *c = pgc(base);
	int rc = prepare(c, id);

	if (rc && c->lost && !c->txn && reconnect(c) == 0)
		rc = prepare(c, id);
	if (rc)
		return rc;
	*out = &c->st[id].base;
	return 0;
}

static int pg_bind_i64(struct db_stmt *base, int i, int64_t v)
{
	struct pg_stmt *st = pgs(base);

	if (i < 1 || i > st->nparams)
		return -EIO;
	st->ibuf[i - 1] = htobe64((uint64_t)v);
	st->val[i - 1] = (const char *)&st->ibuf[i - 1];
	st->len[i - 1] = 8;
	st->fmt[i - 1] = 1;
	return 0;
}

static int pg_bind_blob(struct db_stmt *base, int i, const void *p, size_t n)
{
	struct pg_stmt *st = pgs(base);

	if (i < 1 || i > st->nparams || n > INT32_MAX)
		return -EIO;
	st->val[i - 1] = p ? p : "";
	st->len[i - 1] = (int)n;
	st->fmt[i - 1] = 1;
	return 0;
}

static int pg_bind_text(struct db_stmt *base, int i, const char *s)
{
	struct pg_stmt *st = pgs(base);

	if (i < 1 || i > st->nparams)
		return -EIO;
	st->val[i - 1] = s;
	st->len[i - 1] = 0;
	st->fmt[i - 1] = 0;
	return 0;
}

/* A failed result on c -> a negative errno; a result without a SQLSTATE
 * (the server closed the connection, it did not answer) marks c lost. */
static int conn_err(struct pg_conn *c, const PGresult *res)
{
	const char *state = res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;

	if (PQstatus(c->pc) != CONNECTION_OK || state == NULL) {
		c->lost = true;
		return -EIO;
	}
	return pg_err(c->pc, res);
}

static int begin_write(struct pg_conn *c)
{
	const struct pg_vol *v = c->base.m->drv_state;
	PGresult *res;
	char sql[96];
	int rc;

	snprintf(sql, sizeof(sql), "BEGIN; SELECT pg_advisory_xact_lock(%lld)",
		 (long long)v->lock_key);
	trip(c);
	res = PQexec(c->pc, sql);
	if (PQresultStatus(res) == PGRES_TUPLES_OK) {
		PQclear(res);
		c->txn = true;
		c->doomed = false;
		return 0;
	}
	rc = conn_err(c, res);
	PQclear(res);
	/* BEGIN went through and the lock did not (a timeout, a cancel): a
	 * failed BEGIN must leave no transaction behind, as SQLite's does. */
	if (!c->lost && PQtransactionStatus(c->pc) != PQTRANS_IDLE)
		pg_exec(c->pc, "ROLLBACK");
	return rc;
}
/* Rows a write's command tag says it changed (a SELECT's counts rows too,
 * and must not). */
static int64_t tag_changes(const PGresult *res)
{
	const char *tag = PQcmdStatus((PGresult *)res), *tuples = PQcmdTuples((PGresult *)res);

	if (strncmp(tag, "INSERT", 6) == 0 || strncmp(tag, "UPDATE", 6) == 0 ||
	    strncmp(tag, "DELETE", 6) == 0)
		return tuples[0] ? strtoll(tuples, NULL, 10) : 0;
	return 0;
}

/*
 * Ends the pipeline: a sync, then the results of the c->queued writes and,
 * if last is given, of one more statement sent after them, whose result
 * goes to *last. Returns the first failure; with keep_going (a ROLLBACK
 * follows) failures are only drained.
 */
static int pipe_end(struct pg_conn *c, PGresult **last, bool keep_going)
{
	int n = c->queued + (last != NULL), rc = 0, earlier = c->earlier;
	PGresult *res;

	c->queued = 0; /* c->expect[] is read below, before any is queued */
	c->earlier = 0;
	trip(c);
	if (PQpipelineSync(c->pc) != 1) {
		c->lost = true;
		return -EIO;
	}
	c->last_queued = false;
	for (int q = 0; q < n; q++) {
		bool any = false;

		while ((res = PQgetResult(c->pc)) != NULL) {
			ExecStatusType s = PQresultStatus(res);

			any = true;
			if (s == PGRES_COMMAND_OK || s == PGRES_TUPLES_OK) {
				c->changes = tag_changes(res);
				/* A write of an earlier change counts one row
				 * from the change's start (pg_change_start). */
				c->total_changes += q < earlier ? 1 : c->changes;
				if (q < n - (last != NULL) && c->expect[q] >= 0 &&
				    c->changes != c->expect[q]) {
					c->doomed = true;
					if (rc == 0) {
						/* A row that was (not) there: the
						 * change's own error, or EIO to
						 * whatever met another's. */
						rc = q < earlier ? -EIO : c->expect_err[q];
						c->failed_earlier = q < earlier;
					}
				}
				if (last && q == n - 1 && *last == NULL) {
					*last = res;
					continue;
				}
			} else if (s == PGRES_PIPELINE_ABORTED) {
				if (rc == 0)
					rc = -EIO; /* an earlier one failed: reported already */
			} else if (rc == 0) {
				rc = conn_err(c, res);
				c->failed_earlier = q < earlier;
			}
			PQclear(res);
		}
		if (!any || PQstatus(c->pc) != CONNECTION_OK) {
			c->lost = true;
			return -EIO;
		}
	}
	res = PQgetResult(c->pc);
	if (res == NULL || PQresultStatus(res) != PGRES_PIPELINE_SYNC ||
	    PQexitPipelineMode(c->pc) != 1) {
		PQclear(res);
		c->lost = true;
		return -EIO;
	}
	PQclear(res);
	return keep_going ? 0 : rc;
}

/* Sends st's write into the pipeline; its result is read later. */
static int queue(struct pg_stmt *st)
{
	struct pg_conn *c = st->c;
	char name[16];
	int rc = prepare(c, st->id);

	if (rc)
		return rc;
	if (c->queued == 0 && PQenterPipelineMode(c->pc) != 1) {
		c->lost = PQstatus(c->pc) != CONNECTION_OK;
		return -EIO;
	}
	snprintf(name, sizeof(name), "s%d", (int)st->id);
	if (PQsendQueryPrepared(c->pc, name, st->nparams, st->val, st->len, st->fmt, 1) != 1) {
		c->lost = true;
		return -EIO;
	}
	c->expect[c->queued++] = -1;
	c->last_queued = true;
	st->queued = true;
	st->nrows = 0;
	st->row = -1;
	return 0;
}

/* Runs st's statement with its bound parameters; st->res holds the rows. */
static int run(struct pg_stmt *st)
{
	struct pg_conn *c = st->c;
	bool undo = st->id == ST_ROLLBACK || st->id == ST_SAVEPOINT_ROLLBACK;
	ExecStatusType s;
	char name[16];
	int rc;

	if (st->id == ST_BEGIN)
		return begin_write(c);
	if (c->doomed && !undo)
		return -EIO;
	if (c->queued >= PG_QUEUE_MAX && (rc = pipe_end(c, NULL, false)) != 0)
		return rc;
	if (st->id < ST_COUNT && c->txn && !c->lost && queueable(st->id) && c->prepared[st->id])
		return queue(st);
	c->last_queued = false;
	/* A queued write whose row count is checked here, on the client, may
	 * fail its change without the server knowing: never COMMIT in the
	 * same exchange (the server would commit it). */
	for (int q = 0; st->id == ST_COMMIT && q < c->queued; q++)
		if (c->expect[q] >= 0) {
			rc = pipe_end(c, NULL, false);
			if (rc)
				return rc;
			break;
		}
	if (c->queued > 0 && (st->id == ST_COUNT || undo || !c->prepared[st->id])) {
		/* Not sent in the pipeline: it is ended first (a rollback
		 * drops whatever the queued writes did anyway, and in a
		 * pipeline would be skipped after a failed one). */
		rc = pipe_end(c, NULL, undo);
		if (rc && !undo)
			return rc;
	}
	if (st->id == ST_COUNT) {
		const struct pg_adhoc *a = (const struct pg_adhoc *)st;
		PGTransactionStatusType ts;

		trip(c);
		st->res = PQexecParams(c->pc, a->sql, st->nparams, a->oids, st->val, st->len,
				       st->fmt, 1);
		/* It may begin or end a transaction (a dump's snapshot). */
		ts = PQtransactionStatus(c->pc);
		c->txn = ts == PQTRANS_INTRANS || ts == PQTRANS_INERROR;
	} else {
		rc = prepare(c, st->id);
		if (rc)
			return rc;
		snprintf(name, sizeof(name), "s%d", (int)st->id);
		if (c->queued > 0) {
			/* After the queued writes, in the same exchange. */
			st->res = NULL;
			if (PQsendQueryPrepared(c->pc, name, st->nparams, st->val, st->len, st->fmt,
						1) != 1) {
				c->lost = true;
				rc = -EIO;
			} else {
				rc = pipe_end(c, &st->res, false);
			}
			if (st->id == ST_COMMIT)
				c->txn = false;
			if (rc) {
				PQclear(st->res);
				st->res = NULL;
				return rc;
			}
			st->nrows = PQntuples(st->res);
			st->row = -1;
			return 0;
		}
		trip(c);
		st->res = PQexecPrepared(c->pc, name, st->nparams, st->val, st->len, st->fmt, 1);
	}
	if (st->id == ST_COMMIT || st->id == ST_ROLLBACK) {
		c->txn = false; /* ended, whether or not it went through */
		c->doomed = false;
	}
	s = PQresultStatus(st->res);
	if (s != PGRES_COMMAND_OK && s != PGRES_TUPLES_OK) {
		rc = conn_err(c, st->res);
		PQclear(st->res);
		st->res = NULL;
		return rc;
	}
	if (undo)
		c->doomed = false; /* what the doomed write did is undone */
	c->changes = tag_changes(st->res);
	c->total_changes += c->changes;
	st->nrows = PQntuples(st->res);
	st->row = -1;
	return 0;
}

static int pg_step(struct db_stmt *base)
{
	struct pg_stmt *st = pgs(base);

	if (st->res == NULL && !st->queued) {
		/* Outside a transaction nothing is lost with the connection:
		 * the statement may run again on a new one. */
		bool idle = !st->c->txn && !st->c->lost;
		int rc = run(st);

		if (rc && idle && st->c->lost && reconnect(st->c) == 0)
			rc = run(st);
		if (rc || st->id == ST_BEGIN)
			return rc; /* BEGIN has no rows */
	}
	if (st->row + 1 >= st->nrows) {
		st->row = st->nrows;
		return 0;
	}
	st->row++;
	return 1;
}

static void pg_done(struct db_stmt *base)
{
	struct pg_stmt *st = pgs(base);

	PQclear(st->res);
	st->res = NULL;
	st->row = 0;
	st->nrows = 0;
	st->queued = false;
}

static enum db_type pg_col_type(struct db_stmt *base, int i)
{
	struct pg_stmt *st = pgs(base);

	if (st->res == NULL || st->row < 0 || st->row >= st->nrows || i >= PQnfields(st->res))
		return DB_OTHER;
	if (PQgetisnull(st->res, st->row, i))
		return DB_NULL;
	switch (PQftype(st->res, i)) {
	case OID_INT8:
	case OID_INT4:
	case OID_INT2:
		return DB_INT;
	case OID_BYTEA:
		return DB_BLOB;
	case OID_TEXT:
	case OID_VARCHAR:
		return DB_TEXT;
	default:
		return DB_OTHER;
	}
}

static int64_t pg_col_i64(struct db_stmt *base, int i)
{
	struct pg_stmt *st = pgs(base);
	const unsigned char *p;
	int len;

	if (pg_col_type(base, i) != DB_INT)
		return 0;
	p = (const unsigned char *)PQgetvalue(st->res, st->row, i);
	len = PQgetlength(st->res, st->row, i);
	if (len == 8) {
		uint64_t v;
		memcpy(&v, p, 8);
		return (int64_t)be64toh(v);
	}
	if (len == 4) {
		uint32_t v;
		memcpy(&v, p, 4);
		return (int32_t)be32toh(v);
	}
	if (len == 2) {
		uint16_t v;
		memcpy(&v, p, 2);
		return (int16_t)be16toh(v);
	}
	return 0;
}

static const void *pg_col_blob(struct db_stmt *base, int i, size_t *n)
{
	struct pg_stmt *st = pgs(base);
	enum db_type t = pg_col_type(base, i);
	int len;

	*n = 0;
	if (t != DB_BLOB && t != DB_TEXT)
		return NULL;
	len = PQgetlength(st->res, st->row, i);
	if (len <= 0)
		return NULL;
	*n = (size_t)len;
	return PQgetvalue(st->res, st->row, i);
}

/* The rows the last statement changed: a queued one's answer is read. */
static int64_t pg_changes(struct conn *base)
{
	struct pg_conn *c = pgc(base);

	if (c->queued > 0 && pipe_end(c, NULL, false) != 0)
		return -1;
	return c->changes;
}

static int pg_expect_changes(struct conn *base, int64_t n, int err)
{
	struct pg_conn *c = pgc(base);

	if (c->last_queued) {
		c->expect[c->queued - 1] = n;
		c->expect_err[c->queued - 1] = err;
		return 0;
	}
	return c->changes == n ? 0 : err;
}

static int pg_settle(struct conn *base)
{
	struct pg_conn *c = pgc(base);

	return c->queued > 0 ? pipe_end(c, NULL, false) : 0;
}

/* Queued writes count as one row each until their answers come (the
 * engine compares this before and after a change that failed, to know
 * whether it wrote anything; reading the answers here would cost the
 * exchange the pipeline saves), and those of earlier changes as one row
 * after too (pg_change_start). */
static int64_t pg_total_changes(struct conn *base)
{
	return pgc(base)->total_changes + pgc(base)->queued;
}

/* Queued writes leave the transaction "active" until their answers are
 * read: it is still open. */
static bool pg_in_txn(struct conn *base)
{
	struct pg_conn *c = pgc(base);
	PGTransactionStatusType s = PQtransactionStatus(c->pc);

	return !c->lost && !c->doomed &&
	       (s == PQTRANS_INTRANS || (s == PQTRANS_ACTIVE && c->queued > 0));
}

static int64_t pg_change_start(struct conn *base)
{
	struct pg_conn *c = pgc(base);

	c->earlier = c->queued;
	c->failed_earlier = false;
	return c->queued;
}

static bool pg_failed_earlier(struct conn *base)
{
	return pgc(base)->failed_earlier;
}

static bool pg_txn_open(struct conn *base)
{
	struct pg_conn *c = pgc(base);
	PGTransactionStatusType s = PQtransactionStatus(c->pc);

	return !c->lost && (s == PQTRANS_INTRANS || s == PQTRANS_INERROR ||
			    (s == PQTRANS_ACTIVE && c->queued > 0));
}

static bool pg_conn_ok(struct conn *c)
{
	return !pgc(c)->lost && PQstatus(pgc(c)->pc) == CONNECTION_OK;
}

static int pg_stmt_new(struct conn *base, const char *sql, const char *params,
		       struct db_stmt **out)
{
	struct pg_adhoc *a;
	int n = (int)strlen(params);

	if (n > PG_MAX_PARAMS)
		return -EINVAL;
	a = calloc(1, sizeof(*a));
	if (a == NULL)
		return -ENOMEM;
	a->sql = meta_sql_expand(sql, PG_NOW_MS, '$');
	if (a->sql == NULL) {
		free(a);
		return -ENOMEM;
	}
	for (int i = 0; i < n; i++)
		a->oids[i] = param_oid(params[i]);
	a->st.base.drv = &meta_pg_driver;
	a->st.c = pgc(base);
	a->st.id = ST_COUNT;
	a->st.nparams = n;
	*out = &a->st.base;
	return 0;
}

static void pg_stmt_free(struct db_stmt *base)
{
	struct pg_adhoc *a = (struct pg_adhoc *)base;

	if (a == NULL)
		return;
	PQclear(a->st.res);
	free(a->sql);
	free(a);
}

static const char *pg_errmsg(struct conn *c, char *buf, size_t len)
{
	const char *msg = PQerrorMessage(pgc(c)->pc);

	/* "ERROR:  what\nDETAIL: ...": the first line, without its label. */
	if (strncmp(msg, "ERROR:  ", 8) == 0)
		msg += 8;
	snprintf(buf, len, "%.*s", (int)strcspn(msg, "\n"), msg);
	return buf;
}

const struct db_driver meta_pg_driver = {
	.name = "postgresql",
	.conn_open = pg_conn_open,
	.conn_free = pg_conn_free,
	.conn_write_prepare = pg_write_prepare,
	.stmt = pg_stmt_get,
	.bind_i64 = pg_bind_i64,
	.bind_blob = pg_bind_blob,
	.bind_text = pg_bind_text,
	.step = pg_step,
	.done = pg_done,
	.col_type = pg_col_type,
	.col_i64 = pg_col_i64,
	.col_blob = pg_col_blob,
	.changes = pg_changes,
	.expect_changes = pg_expect_changes,
	.settle = pg_settle,
	.change_start = pg_change_start,
	.failed_earlier = pg_failed_earlier,
	.total_changes = pg_total_changes,
	.in_txn = pg_in_txn,
	.txn_open = pg_txn_open,
	.conn_ok = pg_conn_ok,
	.stmt_new = pg_stmt_new,
	.stmt_free = pg_stmt_free,
	.errmsg = pg_errmsg,
};

/* ---- the volume ----------------------------------------------------------- */

/* Tables that came after the first schema: made by format, and at open
 * when missing (a volume formatted before them). */
#define PG_LATER_SQL \
	"CREATE TABLE IF NOT EXISTS checkpoint(name TEXT PRIMARY KEY, taken_ms BIGINT NOT NULL," \
	" slices BIGINT NOT NULL, bytes BIGINT NOT NULL);" \
	"CREATE TABLE IF NOT EXISTS checkpoint_slice(name TEXT NOT NULL, id BIGINT NOT NULL," \
	" PRIMARY KEY (name, id));" \
	"CREATE INDEX IF NOT EXISTS checkpoint_slice_id ON checkpoint_slice(id);" \
	"CREATE TABLE IF NOT EXISTS slice_range(id INTEGER PRIMARY KEY CHECK (id = 1)," \
	" base BIGINT NOT NULL);"

static const char pg_schema_sql[] =
	"CREATE TABLE meta_schema(id INTEGER PRIMARY KEY CHECK (id = 1),"
	" version BIGINT NOT NULL, application TEXT NOT NULL);"
	"CREATE TABLE volume(id INTEGER PRIMARY KEY CHECK (id = 1), uuid TEXT NOT NULL,"
	" block_size BIGINT NOT NULL, storage_url TEXT NOT NULL, created_at BIGINT NOT NULL,"
	" s3_http BIGINT NOT NULL);"
	"CREATE TABLE counters(id INTEGER PRIMARY KEY CHECK (id = 1), next_ino BIGINT NOT NULL,"
	" next_slice BIGINT NOT NULL, next_cookie BIGINT NOT NULL);"
	"CREATE TABLE inode(ino BIGINT PRIMARY KEY, mode BIGINT NOT NULL, uid BIGINT NOT NULL,"
	" gid BIGINT NOT NULL, rdev BIGINT NOT NULL, nlink BIGINT NOT NULL,"
	" size BIGINT NOT NULL, atime_sec BIGINT NOT NULL, atime_nsec BIGINT NOT NULL,"
	" mtime_sec BIGINT NOT NULL, mtime_nsec BIGINT NOT NULL, ctime_sec BIGINT NOT NULL,"
	" ctime_nsec BIGINT NOT NULL);"
	"CREATE TABLE dentry(parent BIGINT NOT NULL, name BYTEA NOT NULL, ino BIGINT NOT NULL,"
	" cookie BIGINT NOT NULL UNIQUE, PRIMARY KEY (parent, name));"
	"CREATE INDEX dentry_cookie ON dentry(parent, cookie);"
	"CREATE INDEX dentry_ino ON dentry(ino);"
	"CREATE TABLE symlink(ino BIGINT PRIMARY KEY, target BYTEA NOT NULL);"
	"CREATE TABLE xattr(ino BIGINT NOT NULL, name BYTEA NOT NULL, value BYTEA NOT NULL,"
	" PRIMARY KEY (ino, name));"
	"CREATE TABLE slice(seq BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,"
	" ino BIGINT NOT NULL, chunk BIGINT NOT NULL, id BIGINT NOT NULL, size BIGINT NOT NULL,"
	" off BIGINT NOT NULL, pos BIGINT NOT NULL, len BIGINT NOT NULL);"
	"CREATE INDEX slice_chunk ON slice(ino, chunk, seq);"
	"CREATE INDEX slice_id ON slice(id);"
	"CREATE TABLE orphan(ino BIGINT PRIMARY KEY);"
	"CREATE TABLE commit_seq(ino BIGINT PRIMARY KEY, seq BIGINT NOT NULL);"
	"CREATE TABLE times_seq(ino BIGINT PRIMARY KEY, seq BIGINT NOT NULL);"
	"CREATE TABLE seq_epoch(id INTEGER PRIMARY KEY CHECK (id = 1), epoch BIGINT NOT NULL);"
	"CREATE TABLE gc_slice(id BIGINT PRIMARY KEY, size BIGINT NOT NULL,"
	" since BIGINT NOT NULL, seen BIGINT);"
	"CREATE INDEX gc_slice_since ON gc_slice(since);"
	"CREATE INDEX gc_slice_seen ON gc_slice(seen);"
	"CREATE TABLE journal(id INTEGER PRIMARY KEY CHECK (id = 1), seq BIGINT NOT NULL);"
	"INSERT INTO journal(id, seq) VALUES (1, 0);"
	"CREATE TABLE lease(id INTEGER PRIMARY KEY CHECK (id = 1), holder TEXT NOT NULL,"
	" expires_ms BIGINT NOT NULL, epoch BIGINT NOT NULL);"
	"INSERT INTO lease(id, holder, expires_ms, epoch) VALUES (1, '', 0, 0);"
	PG_LATER_SQL;

static void vol_free(struct pg_vol *v)
{
	if (v == NULL)
		return;
	free(v->conninfo);
	free(v);
}

static int vol_new(struct meta *m)
{
	struct pg_vol *v = calloc(1, sizeof(*v));
	int rc;

	if (v == NULL)
		return -ENOMEM;
	rc = url_parse(m->path, v);
	if (rc) {
		vol_free(v);
		return rc;
	}
	m->drv_state = v;
	return 0;
}

/* A volume about to be formatted over: -EBUSY while a mount holds its
 * lease (it would go on writing into the new one), else the epoch it
 * reached in *epoch (0: none). */
static int lease_before_reformat(struct pg_conn *c, const struct pg_vol *v, int64_t *epoch)
{
	char sql[320];
	PGresult *res;
	int rc = 0;

	snprintf(sql, sizeof(sql), "SELECT to_regclass('%s.lease') IS NOT NULL", v->schema);
	res = PQexec(c->pc, sql);
	if (PQresultStatus(res) != PGRES_TUPLES_OK || PQntuples(res) != 1)
		rc = conn_err(c, res);
	else if (strcmp(PQgetvalue(res, 0, 0), "t") != 0)
		rc = 1; /* no lease table: nothing to look at */
	PQclear(res);
	if (rc)
		return rc > 0 ? 0 : rc;
	snprintf(sql, sizeof(sql),
		 "SELECT epoch, holder <> '' AND expires_ms > " PG_NOW_MS
		 " FROM %s.lease WHERE id = 1",
		 v->schema);
	res = PQexec(c->pc, sql);
	if (PQresultStatus(res) != PGRES_TUPLES_OK)
		rc = conn_err(c, res);
	else if (PQntuples(res) == 1) {
		*epoch = strtoll(PQgetvalue(res, 0, 0), NULL, 10);
		if (strcmp(PQgetvalue(res, 0, 1), "t") == 0)
			rc = -EBUSY;
	}
	PQclear(res);
	return rc;
}

static int pg_format(struct meta *m, int force, int (*fill)(struct conn *c, void *arg), void *arg)
{
	struct conn *c = NULL;
	struct pg_vol *v;
	char sql[256];
	int64_t old_epoch = 0;
	int rc;

	rc = vol_new(m);
	if (rc)
		return rc;
	v = m->drv_state;
	rc = pg_conn_open(m, &c);
	if (rc)
		return rc;
	rc = begin_write(pgc(c));
	if (rc)
		goto out;
	if (force) {
		rc = lease_before_reformat(pgc(c), v, &old_epoch);
		if (rc)
			goto out;
		snprintf(sql, sizeof(sql), "DROP SCHEMA IF EXISTS %s CASCADE", v->schema);
		rc = pg_exec(pgc(c)->pc, sql);
		if (rc)
			goto out;
	}
	snprintf(sql, sizeof(sql), "CREATE SCHEMA %s", v->schema);
	{
		PGresult *res = PQexec(pgc(c)->pc, sql);
		const char *state = PQresultErrorField(res, PG_DIAG_SQLSTATE);

		if (PQresultStatus(res) != PGRES_COMMAND_OK)
			rc = state && strcmp(state, "42P06") == 0 ? -EEXIST : pg_err(pgc(c)->pc, res);
		PQclear(res);
		if (rc)
			goto out;
	}
	rc = pg_exec(pgc(c)->pc, pg_schema_sql);
	if (rc)
		goto out;
	snprintf(sql, sizeof(sql),
		 "INSERT INTO meta_schema(id, version, application) VALUES (1, %d, 'ferryfs')",
		 PG_SCHEMA_VERSION);
	rc = pg_exec(pgc(c)->pc, sql);
	/* Epochs go on from the volume this one replaces: a holder of that
	 * one, fenced to its epoch, never matches one of the new volume's. */
	if (rc == 0 && old_epoch > 0) {
		snprintf(sql, sizeof(sql), "UPDATE lease SET epoch = %lld WHERE id = 1",
			 (long long)old_epoch);
		rc = pg_exec(pgc(c)->pc, sql);
	}
	if (rc == 0)
		rc = fill(c, arg);
	if (rc == 0 && pgc(c)->queued > 0)
		rc = pipe_end(pgc(c), NULL, false); /* COMMIT below is not piped */
	if (rc == 0)
		rc = pg_exec(pgc(c)->pc, "COMMIT");
out:
	if (rc && pgc(c)->queued > 0)
		pipe_end(pgc(c), NULL, true);
	if (rc && pg_txn_open(c))
		pg_exec(pgc(c)->pc, "ROLLBACK");
	pg_conn_free(c);
	return rc;
}

/* The schema is a ferryfs volume of a version this build knows. */
static int check_volume(struct pg_conn *c)
{
	PGresult *res = PQexec(c->pc, "SELECT version, application FROM meta_schema WHERE id = 1");
	int rc = 0;

	if (PQresultStatus(res) != PGRES_TUPLES_OK) {
		const char *state = PQresultErrorField(res, PG_DIAG_SQLSTATE);

		/* No such table: no volume of that name. */
		rc = state && strcmp(state, "42P01") == 0 ? -ENOENT : pg_err(c->pc, res);
	} else if (PQntuples(res) != 1 || strcmp(PQgetvalue(res, 0, 1), "ferryfs") != 0 ||
		   strtoll(PQgetvalue(res, 0, 0), NULL, 10) != PG_SCHEMA_VERSION) {
		rc = -EIO;
	}
	PQclear(res);
	return rc;
}

/* PG_LATER_SQL on a volume that lacks its tables (two daemons opening one
 * volume at once: IF NOT EXISTS may still race; the loser looks again). */
static int later_tables(struct pg_conn *c)
{
	PGresult *res = PQexec(c->pc, "SELECT to_regclass('slice_range') IS NOT NULL");
	bool have = PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1 &&
		    strcmp(PQgetvalue(res, 0, 0), "t") == 0;
	int rc;

	PQclear(res);
	if (have)
		return 0;
	rc = pg_exec(c->pc, PG_LATER_SQL);
	if (rc) {
		res = PQexec(c->pc, "SELECT to_regclass('slice_range') IS NOT NULL");
		if (PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1 &&
		    strcmp(PQgetvalue(res, 0, 0), "t") == 0)
			rc = 0;
		PQclear(res);
	}
	return rc;
}

static int pg_open(struct meta *m)
{
	struct conn *c;
	int rc;

	rc = vol_new(m);
	if (rc)
		return rc;
	rc = meta_conn_get(m, &c);
	if (rc == 0)
		rc = check_volume(pgc(c));
	if (rc == 0 && (rc = later_tables(pgc(c))) < 0)
		log_warnx("%s: cannot add the checkpoint tables: %s", m->path, strerror(-rc));
	return rc;
}

static void pg_close(struct meta *m, int stage)
{
	if (stage == 1) {
		vol_free(m->drv_state);
		m->drv_state = NULL;
	}
}

static int pg_set_batched(struct meta *m, int batched)
{
	(void)m;
	(void)batched;
	return 0;
}

/* A transaction with an id commits with a WAL record, and with
 * synchronous_commit on its commit waits until the WAL is flushed up to
 * there: every earlier commit is durable with it. */
static int pg_sync(struct meta *m)
{
	struct conn *c;
	PGresult *res;
	int rc = meta_conn_get(m, &c);

	if (rc)
		return rc;
	trip(pgc(c));
	res = PQexec(pgc(c)->pc, "BEGIN; SET LOCAL synchronous_commit = on;"
				 " SELECT txid_current(); COMMIT");
	rc = PQresultStatus(res) == PGRES_COMMAND_OK ? 0 : conn_err(pgc(c), res);
	PQclear(res);
	if (rc && pg_txn_open(c))
		pg_exec(pgc(c)->pc, "ROLLBACK");
	return rc;
}
const struct db_volume_ops meta_pg_volume = {
	.format = pg_format,
	.open = pg_open,
	.close = pg_close,
	.set_batched = pg_set_batched,
	.sync = pg_sync,
	.snapshot_sql = "BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY",
	/* Writers of slices wait (INSERT and DELETE take ROW EXCLUSIVE). */
	.fence_sql = "LOCK TABLE slice IN SHARE ROW EXCLUSIVE MODE",
	/* The identity's sequence: it is not transactional, and only grows. */
	.slice_seq_get_sql = "SELECT last_value FROM pg_sequences WHERE format('%I.%I', schemaname,"
			     " sequencename) = pg_get_serial_sequence('slice', 'seq')"
			     " AND last_value IS NOT NULL",
	.slice_seq_set_sql = { "SELECT setval(pg_get_serial_sequence('slice', 'seq'), ?1)", NULL },
};
