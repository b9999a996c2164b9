/* Unit tests for the metadata engine (common/meta_*.c): a real SQLite volume
 * in a temporary directory per test, or with META_TEST_PG (unit-meta_pg) a
 * volume of its own in the test PostgreSQL server ($FERRY_TEST_PG_URL,
 * scripts/pg-server) per test. Raw SQL that pokes at the rows is written in
 * SQLite's dialect and translated (raw_sql); what the two engines cannot
 * share (files, WAL, triggers) has a variant per engine. */
#include <criterion/criterion.h>

#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <sqlite3.h>
#ifdef META_TEST_PG
#include <libpq-fe.h>
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "meta.h"
#include "meta_names.h"
#include "tmp_dir.h"
#include "slice.h"

static char dir[64];
static char db[640];
static struct meta *m;

#define CS ((uint64_t)META_CHUNK_SIZE)

#ifdef META_TEST_PG
#define BY_ENGINE(sqlite, pg) (pg)
static char pg_base[512]; /* $FERRY_TEST_PG_URL */
static char pg_schema[64];
#else
#define BY_ENGINE(sqlite, pg) (sqlite)
#endif

static void setup_dir(void)
{
	strcpy(dir, "/tmp/ferry-meta-XXXXXX");
	cr_assert_not_null(mkdtemp(dir));
#ifdef META_TEST_PG
	const char *url = getenv("FERRY_TEST_PG_URL");
	unsigned r;

	cr_assert(url != NULL && *url,
		  "FERRY_TEST_PG_URL is not set: start a server with scripts/pg-server");
	cr_assert_lt(strlen(url), sizeof(pg_base));
	strcpy(pg_base, url);
	cr_assert_eq(getrandom(&r, sizeof(r), 0), (ssize_t)sizeof(r));
	snprintf(pg_schema, sizeof(pg_schema), "ferry_t%d_%08x", (int)getpid(), r);
	snprintf(db, sizeof(db), "%s&volume=%s", pg_base, pg_schema + 6);
#else
	snprintf(db, sizeof(db), "%s/meta.db", dir);
#endif
}

static void format_volume(void)
{
	struct meta_volume v = { .block_size = 0, .storage_url = "file:///tmp/objs" };

	cr_assert_eq(meta_format(db, &v, 1000, 1000, 0), 0);
}

/* unit-meta_deferred runs every test with deferred commits (the journal
 * of meta_journal_open), as ferry-mountd uses the engine. */
static void defer_maybe(struct meta *mm)
{
#ifdef META_TEST_DEFERRED
	char j[160];

	snprintf(j, sizeof(j), "%s/meta.db" META_JOURNAL_SUFFIX, dir);
	cr_assert_eq(meta_journal_open(mm, j, 5, NULL), 0);
#else
	(void)mm;
#endif
}

static void setup(void)
{
	setup_dir();
	format_volume();
	cr_assert_eq(meta_open(db, &m), 0);
	defer_maybe(m);
}

static void raw_volume_drop(void);

static void teardown(void)
{
	meta_close(m);
	m = NULL;
	raw_volume_drop();
	rm_dir(dir);
}

#ifdef META_TEST_PG
/* SQLite's dialect as the tests write it -> PostgreSQL's: X'hex' blobs,
 * CAST(... AS BLOB), PRAGMA user_version (the schema's version row). */
static char *pg_dialect(const char *sql)
{
	size_t n = strlen(sql);
	char *out = malloc(4 * n + 64), *o = out;

	cr_assert_not_null(out);
	if (strncmp(sql, "PRAGMA user_version = ", 22) == 0) {
		sprintf(out, "UPDATE meta_schema SET version = %s", sql + 22);
		return out;
	}
	if (strcmp(sql, "PRAGMA user_version") == 0) {
		strcpy(out, "SELECT version FROM meta_schema");
		return out;
	}
	for (const char *p = sql; *p;) {
		if (p[0] == 'X' && p[1] == '\'' && (p == sql || p[-1] == ' ' || p[-1] == '(')) {
			const char *end = strchr(p + 2, '\'');
			cr_assert_not_null(end);
			o += sprintf(o, "'\\x%.*s'::bytea", (int)(end - p - 2), p + 2);
			p = end + 1;
		} else if (strncmp(p, " AS BLOB)", 9) == 0) {
			o += sprintf(o, " AS BYTEA)");
			p += 9;
		} else {
			*o++ = *p++;
		}
	}
	*o = '\0';
	return out;
}

static void notice_drop(void *arg, const char *message)
{
	(void)arg;
	(void)message;
}

/* A connection of its own to the test's volume schema. */
static PGconn *pg_raw_conn(void)
{
	char sp[96];
	PGconn *h = PQconnectdb(pg_base);
	PGresult *r;

	cr_assert_eq(PQstatus(h), CONNECTION_OK, "%s", PQerrorMessage(h));
	PQsetNoticeProcessor(h, notice_drop, NULL);
	snprintf(sp, sizeof(sp), "SET search_path TO %s", pg_schema);
	r = PQexec(h, sp);
	cr_assert_eq(PQresultStatus(r), PGRES_COMMAND_OK);
	PQclear(r);
	return h;
}

static void pg_raw_exec(PGconn *h, const char *sql)
{
	PGresult *r = PQexec(h, sql);

	cr_assert(PQresultStatus(r) == PGRES_COMMAND_OK || PQresultStatus(r) == PGRES_TUPLES_OK,
		  "%s: %s", sql, PQerrorMessage(h));
	PQclear(r);
}
#endif

/* Removes the test's volume from the server (SQLite's goes with dir). */
static void raw_volume_drop(void)
{
#ifdef META_TEST_PG
	char sql[192];
	PGconn *h = PQconnectdb(pg_base);

	snprintf(sql, sizeof(sql), "SET client_min_messages = warning;"
		 " DROP SCHEMA IF EXISTS %s CASCADE", pg_schema);
	if (PQstatus(h) == CONNECTION_OK)
		PQclear(PQexec(h, sql));
	PQfinish(h);
#endif
}

/* Runs SQL on the volume through a connection of its own. */
static void raw_sql(const char *sql)
{
	meta_flush(m); /* another connection sees only what is committed */
#ifdef META_TEST_PG
	PGconn *h = pg_raw_conn();
	char *q = pg_dialect(sql);

	pg_raw_exec(h, q);
	free(q);
	PQfinish(h);
#else
	sqlite3 *h;
	char *err = NULL;

	cr_assert_eq(sqlite3_open(db, &h), SQLITE_OK);
	sqlite3_busy_timeout(h, 5000);
	cr_assert_eq(sqlite3_exec(h, sql, NULL, NULL, &err), SQLITE_OK, "%s: %s", sql,
		     err ? err : "");
	sqlite3_close(h);
#endif
}

static int64_t raw_int(const char *sql)
{
	int64_t v = -1;

	meta_flush(m);
#ifdef META_TEST_PG
	PGconn *h = pg_raw_conn();
	char *q = pg_dialect(sql);
	PGresult *r = PQexec(h, q);

	cr_assert_eq(PQresultStatus(r), PGRES_TUPLES_OK, "%s: %s", q, PQerrorMessage(h));
	if (PQntuples(r) > 0 && !PQgetisnull(r, 0, 0))
		v = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
	PQclear(r);
	free(q);
	PQfinish(h);
#else
	sqlite3 *h;
	sqlite3_stmt *st;

	cr_assert_eq(sqlite3_open(db, &h), SQLITE_OK);
	cr_assert_eq(sqlite3_prepare_v2(h, sql, -1, &st, NULL), SQLITE_OK, "%s", sql);
	if (sqlite3_step(st) == SQLITE_ROW)
		v = sqlite3_column_int64(st, 0);
	sqlite3_finalize(st);
	sqlite3_close(h);
#endif
	return v;
}

/* A failure injected into the database: a trigger on table that fails the
 * statement (event: "BEFORE UPDATE", ...) when cond holds (NEW./OLD.). */
static void raw_trigger(const char *name, const char *event, const char *table, const char *cond)
{
	char sql[1024];

#ifdef META_TEST_PG
	char *c = pg_dialect(cond);

	snprintf(sql, sizeof(sql),
		 "CREATE FUNCTION %s_f() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
		 " IF %s THEN RAISE EXCEPTION 'injected'; END IF;"
		 " IF TG_OP = 'DELETE' THEN RETURN OLD; END IF; RETURN NEW; END $$;"
		 "CREATE TRIGGER %s %s ON %s FOR EACH ROW EXECUTE FUNCTION %s_f()",
		 name, c, name, event, table, name);
	free(c);
#else
	snprintf(sql, sizeof(sql),
		 "CREATE TRIGGER %s %s ON %s WHEN %s BEGIN SELECT RAISE(ABORT, 'injected'); END",
		 name, event, table, cond);
#endif
	raw_sql(sql);
}

static void raw_trigger_drop(const char *name, const char *table)
{
	char sql[256];

#ifdef META_TEST_PG
	snprintf(sql, sizeof(sql), "DROP TRIGGER %s ON %s; DROP FUNCTION %s_f()", name, table,
		 name);
#else
	(void)table;
	snprintf(sql, sizeof(sql), "DROP TRIGGER %s", name);
#endif
	raw_sql(sql);
}

/* Another connection, as ferry-reconciler is to ferry-mountd, inside a
 * write transaction that holds what the engine's writers wait for (SQLite's
 * write lock; PostgreSQL's counters row, which every create updates). */
struct raw_txn {
#ifdef META_TEST_PG
	PGconn *h;
#else
	sqlite3 *h;
#endif
};

static void raw_txn_begin(struct raw_txn *t)
{
#ifdef META_TEST_PG
	t->h = pg_raw_conn();
	pg_raw_exec(t->h, "BEGIN; UPDATE counters SET next_ino = next_ino");
#else
	cr_assert_eq(sqlite3_open(db, &t->h), SQLITE_OK);
	cr_assert_eq(sqlite3_exec(t->h, "BEGIN IMMEDIATE; UPDATE inode SET uid = uid;", NULL, NULL,
				  NULL),
		     SQLITE_OK);
#endif
}

static void raw_txn_commit(struct raw_txn *t)
{
#ifdef META_TEST_PG
	pg_raw_exec(t->h, "COMMIT");
	PQfinish(t->h);
#else
	cr_assert_eq(sqlite3_exec(t->h, "COMMIT", NULL, NULL, NULL), SQLITE_OK);
	sqlite3_close(t->h);
#endif
	t->h = NULL;
}

static uint64_t mk(uint64_t parent, const char *name, uint32_t mode)
{
	struct meta_attr a;
	int rc = meta_create(m, parent, name, mode, 1000, 1000, 0,
			     S_ISLNK(mode) ? "target" : NULL, &a);

	cr_assert_eq(rc, 0, "create %s: %d", name, rc);
	return a.ino;
}

static struct meta_attr attr(uint64_t ino)
{
	struct meta_attr a;

	cr_assert_eq(meta_getattr(m, ino, &a), 0);
	return a;
}

/* Puts ino's times in 2001 so a later change is visible. */
static void age(uint64_t ino)
{
	struct meta_attr in = { 0 };

	in.atime.tv_sec = in.mtime.tv_sec = in.ctime.tv_sec = 1000000000;
	cr_assert_eq(meta_setattr(m, ino, META_SET_ATIME | META_SET_MTIME | META_SET_CTIME, &in,
				  NULL),
		     0);
}

static int is_old(struct timespec t)
{
	return t.tv_sec == 1000000000;
}

static int orphan_count(void)
{
	return (int)raw_int("SELECT COUNT(*) FROM orphan");
}

/* ---- volume ------------------------------------------------------------ */

TestSuite(meta, .init = setup, .fini = teardown);
TestSuite(meta_open, .init = setup_dir, .fini = teardown);

/* A storage URL of no bytes is a value like another (the CLI refuses it
 * before; the engine stores and reads it back). */
Test(meta_open, an_empty_storage_url_reads_back)
{
	struct meta_volume v = { .storage_url = "" }, got = { 0 };

	cr_assert_eq(meta_format(db, &v, 0, 0, 0), 0);
	cr_assert_eq(meta_open(db, &m), 0);
	cr_assert_eq(meta_volume_get(m, &got), 0);
	cr_assert_str_eq(got.storage_url, "");
	meta_volume_free(&got);
}

Test(meta_open, format_open_reopen)
{
	struct meta_volume v = { .block_size = 1u << 20, .storage_url = "s3://b/p",
				 .created_at = 42, .s3_http = 1 };
	struct meta_volume got, got2;
	struct meta_attr root;
	int i;

	cr_assert_eq(meta_open(db, &m), -ENOENT);
	cr_assert_eq(meta_format(db, &v, 7, 8, 0), 0);
	cr_assert_eq(meta_format(db, &v, 7, 8, 0), -EEXIST);
	cr_assert_eq(meta_open(db, &m), 0);
	cr_assert_eq(meta_volume_get(m, &got), 0);
	cr_assert_eq(strlen(got.uuid), 36);
	cr_assert_eq(got.uuid[14], '4', "uuid v4: %s", got.uuid);
	for (i = 0; i < 36; i++)
		cr_assert(got.uuid[i] == '-' || (got.uuid[i] >= '0' && got.uuid[i] <= '9') ||
			  (got.uuid[i] >= 'a' && got.uuid[i] <= 'f'));
	cr_assert_eq(got.block_size, 1u << 20);
	cr_assert_str_eq(got.storage_url, "s3://b/p");
	cr_assert_eq(got.created_at, 42);
	cr_assert_eq(got.s3_http, 1);
	root = attr(META_ROOT_INO);
	cr_assert(S_ISDIR(root.mode));
	cr_assert_eq(root.uid, 7);
	cr_assert_eq(root.gid, 8);
	cr_assert_eq(root.nlink, 2);
	mk(META_ROOT_INO, "f", S_IFREG | 0644);
	meta_close(m);
	m = NULL;

	cr_assert_eq(meta_open(db, &m), 0);
	cr_assert_eq(meta_volume_get(m, &got2), 0);
	cr_assert_str_eq(got.uuid, got2.uuid);
	cr_assert_eq(meta_lookup(m, META_ROOT_INO, "f", NULL), 0);
	meta_volume_free(&got2);
	meta_close(m);
	m = NULL;

	/* force replaces it: a new uuid, an empty root. */
	strcpy(v.uuid, "0b3e2c1a-1111-4222-8333-444455556666");
	cr_assert_eq(meta_format(db, &v, 0, 0, 1), 0);
	cr_assert_eq(meta_open(db, &m), 0);
	cr_assert_eq(meta_volume_get(m, &got2), 0);
	cr_assert_str_eq(got2.uuid, "0b3e2c1a-1111-4222-8333-444455556666");
	cr_assert_eq(meta_lookup(m, META_ROOT_INO, "f", NULL), -ENOENT);
	meta_volume_free(&got);
	meta_volume_free(&got2);
	meta_volume_free(NULL);

	strcpy(v.uuid, "not-a-uuid");
	cr_assert_eq(meta_format(db, &v, 0, 0, 1), -EINVAL);
	v.uuid[0] = '\0';
	v.block_size = META_CHUNK_SIZE + 1;
	cr_assert_eq(meta_format(db, &v, 0, 0, 1), -EINVAL);
}

/* A volume of another schema version, then a damaged volume record: both
 * refused, on either engine. */
static void wrong_version_and_damaged_volume_record(void)
{
	/* A ferryfs volume of another schema version. */
	format_volume();
	raw_sql("PRAGMA user_version = 2");
	cr_assert_eq(meta_open(db, &m), -EIO);
	raw_sql("PRAGMA user_version = 1");
	cr_assert_eq(meta_open(db, &m), 0);
	meta_close(m);
	m = NULL;

	/* A damaged volume record. */
	raw_sql("UPDATE volume SET block_size = 0");
	cr_assert_eq(meta_open(db, &m), -EIO);
	raw_sql("DELETE FROM volume");
	cr_assert_eq(meta_open(db, &m), -EIO);
}

#ifdef META_TEST_PG
/* What a database can hold under a volume's name that is not a volume of
 * this build: nothing, another application's tables, a schema from the
 * future, a damaged volume record. */
Test(meta_open, wrong_schemas)
{
	char sql[256];

	cr_assert_eq(meta_open(db, &m), -ENOENT);
	cr_assert_null(m);

	/* Another application's schema of the same name. */
	snprintf(sql, sizeof(sql), "CREATE SCHEMA %s; CREATE TABLE %s.t(x int)", pg_schema,
		 pg_schema);
	raw_sql(sql);
	cr_assert_eq(meta_open(db, &m), -ENOENT);
	snprintf(sql, sizeof(sql), "CREATE TABLE %s.meta_schema(id int, version bigint,"
		 " application text); INSERT INTO %s.meta_schema VALUES (1, 1, 'other')",
		 pg_schema, pg_schema);
	raw_sql(sql);
	cr_assert_eq(meta_open(db, &m), -EIO);
	raw_volume_drop();

	wrong_version_and_damaged_volume_record();

	/* A second format of the same name, unless forced. */
	raw_volume_drop();
	format_volume();
	{
		struct meta_volume v = { .storage_url = "file:///tmp/objs" };
		cr_assert_eq(meta_format(db, &v, 0, 0, 0), -EEXIST);
		cr_assert_eq(meta_format(db, &v, 0, 0, 1), 0);
	}
}

/* A volume formatted over while a mount holds its lease is refused (that
 * mount would go on writing into the new one); once it let go, the new
 * volume's epochs go on from the old one's, so a holder fenced to an old
 * epoch never matches a new one. */
Test(meta_open, no_format_over_a_held_lease)
{
	struct meta_volume v = { .storage_url = "file:///tmp/objs" };
	struct meta *o = NULL;

	format_volume();
	cr_assert_eq(meta_open(db, &m), 0);
	cr_assert_eq(meta_lease_take(m, "holder", 60000, 0, 0, NULL), 0);
	cr_assert_eq(meta_format(db, &v, 0, 0, 1), -EBUSY);
	cr_assert_eq(meta_lease_release(m), 0);
	cr_assert_eq(meta_format(db, &v, 0, 0, 1), 0);
	cr_assert_eq(meta_open(db, &o), 0);
	cr_assert_eq(meta_lease_take(o, "next", 60000, 0, 0, NULL), 0);
	cr_assert_eq(meta_lease_fenced_to(o), 2, "epoch %llu",
		     (unsigned long long)meta_lease_fenced_to(o));
	/* The old meta, fenced to epoch 1, writes nothing into the new volume. */
	cr_assert_eq(meta_create(m, META_ROOT_INO, "old", S_IFREG | 0644, 1, 1, 0, NULL, NULL),
		     -EROFS);
	meta_close(o);
}

/* A URL the engine refuses before it connects. */
Test(meta_open, bad_urls)
{
	struct meta_volume v = { .storage_url = "file:///tmp/objs" };
	char url[700];

	/* No volume, a bad volume name, a password in the URL. */
	cr_assert_eq(meta_format(pg_base, &v, 0, 0, 0), -EINVAL);
	snprintf(url, sizeof(url), "%s&volume=Bad-Name", pg_base);
	cr_assert_eq(meta_format(url, &v, 0, 0, 0), -EINVAL);
	cr_assert_eq(meta_open("postgresql://u:secret@localhost/db?volume=x", &m), -EINVAL);
	/* A password however it is put: as a parameter, or with a '?' in the
	 * user part (where libpq's reading and a naive split part ways). */
	snprintf(url, sizeof(url), "%s&password=x&volume=%s", pg_base, pg_schema + 6);
	cr_assert_eq(meta_format(url, &v, 0, 0, 0), -EINVAL);
	cr_assert_eq(meta_open("postgresql://u:pw?x@/db?volume=x", &m), -EINVAL);
	/* Nobody listening. */
	cr_assert_eq(meta_open("postgresql:///db?host=/nonexistent&volume=x", &m), -ECONNREFUSED);
}

/* A BEGIN whose lock wait times out leaves no transaction behind: the same
 * thread's next change goes through once the lock is free. */
Test(meta_open, a_timed_out_begin_leaves_the_connection_usable)
{
	struct meta *o = NULL;
	struct meta_attr a;
	char jp[160], url[800];
	int rc;

	format_volume();
	cr_assert_eq(meta_open(db, &m), 0);
	snprintf(jp, sizeof(jp), "%s/meta.db" META_JOURNAL_SUFFIX, dir);
	cr_assert_eq(meta_journal_open(m, jp, 60000, NULL), 0);
	snprintf(url, sizeof(url), "%s&options=-c%%20lock_timeout%%3D100&volume=%s", pg_base,
		 pg_schema + 6);
	cr_assert_eq(meta_open(url, &o), 0);
	/* m's batch is open, and holds the volume's write lock for a minute. */
	cr_assert_eq(meta_create(m, META_ROOT_INO, "held", S_IFREG | 0644, 1, 1, 0, NULL, &a), 0);
	rc = meta_create(o, META_ROOT_INO, "waits", S_IFREG | 0644, 1, 1, 0, NULL, &a);
	cr_assert_eq(rc, -EIO, "a create that never got the lock: %d", rc);
	cr_assert_eq(meta_flush(m), 0);
	rc = meta_create(o, META_ROOT_INO, "after", S_IFREG | 0644, 1, 1, 0, NULL, &a);
	cr_assert_eq(rc, 0, "the next create on the same connection: %d", rc);
	cr_assert_eq(meta_getattr(o, a.ino, &a), 0);
	meta_close(o);
}

/* The server drops the connections of a meta whose commits did not wait
 * for the WAL flush: it may have lost them, so the next meta_sync() says
 * so (once), and the meta goes on, connected again. */
Test(meta_open, a_lost_connection_fails_the_next_sync_once)
{
	struct meta_attr a;
	char sql[256];
	PGconn *h;
	PGresult *r;

	format_volume();
	cr_assert_eq(meta_open(db, &m), 0);
	cr_assert_eq(meta_set_batched(m, 1), 0);
	cr_assert_eq(meta_create(m, META_ROOT_INO, "f", S_IFREG | 0644, 1, 1, 0, NULL, &a), 0);
	h = pg_raw_conn();
	snprintf(sql, sizeof(sql),
		 "SELECT COUNT(pg_terminate_backend(pid)) FROM pg_stat_activity"
		 " WHERE application_name = 'ferryfs %s'",
		 pg_schema + 6);
	r = PQexec(h, sql);
	cr_assert_eq(PQresultStatus(r), PGRES_TUPLES_OK, "%s", PQerrorMessage(h));
	PQclear(r);
	PQfinish(h);
	usleep(100 * 1000);
	cr_assert_eq(meta_getattr(m, a.ino, &a), 0, "a read connects again");
	cr_assert_eq(meta_sync(m), -EIO);
	cr_assert_eq(meta_sync(m), 0);
	cr_assert_eq(meta_create(m, META_ROOT_INO, "g", S_IFREG | 0644, 1, 1, 0, NULL, &a), 0);
	cr_assert_eq(meta_sync(m), 0);
}

/* The password comes from libpq's own sources; a wrong one, or none, is
 * refused as such (not as an I/O error), and the right one works. */
Test(meta_open, password_role)
{
	struct meta_volume v = { .storage_url = "file:///tmp/objs" };
	const char *pw_url = getenv("FERRY_TEST_PG_PW_URL"), *pw = getenv("FERRY_TEST_PG_PASSWORD");
	char url[700];

	cr_assert(pw_url && pw, "FERRY_TEST_PG_PW_URL and _PASSWORD come from scripts/pg-server");
	snprintf(url, sizeof(url), "%s&volume=%s", pw_url, pg_schema + 6);
	unsetenv("PGPASSWORD");
	setenv("PGPASSFILE", "/nonexistent", 1);
	cr_assert_eq(meta_format(url, &v, 0, 0, 0), -EACCES);
	setenv("PGPASSWORD", "not-the-password", 1);
	cr_assert_eq(meta_format(url, &v, 0, 0, 0), -EACCES);
	cr_assert_eq(meta_open(url, &m), -EACCES);
	setenv("PGPASSWORD", pw, 1);
	cr_assert_eq(meta_format(url, &v, 0, 0, 0), 0);
	cr_assert_eq(meta_open(url, &m), 0);
	cr_assert_eq(meta_create(m, META_ROOT_INO, "f", S_IFREG | 0644, 1, 1, 0, NULL, NULL), 0);
}
#else
Test(meta_open, wal_mode)
{
	sqlite3 *h;
	sqlite3_stmt *st;

	format_volume();
	cr_assert_eq(sqlite3_open(db, &h), SQLITE_OK);
	cr_assert_eq(sqlite3_prepare_v2(h, "PRAGMA journal_mode", -1, &st, NULL), SQLITE_OK);
	cr_assert_eq(sqlite3_step(st), SQLITE_ROW);
	cr_assert_str_eq((const char *)sqlite3_column_text(st, 0), "wal");
	sqlite3_finalize(st);
	sqlite3_close(h);
}

Test(meta_open, wrong_files)
{
	FILE *f;

	/* Not a database at all. */
	f = fopen(db, "w");
	cr_assert_not_null(f);
	fputs("this is not an sqlite database, not at all; it is just some text\n", f);
	for (int i = 0; i < 200; i++)
		fputs("padding padding padding padding padding\n", f);
	fclose(f);
	cr_assert_eq(meta_open(db, &m), -EIO);
	cr_assert_null(m);
	unlink(db);

	/* An empty file. */
	f = fopen(db, "w");
	fclose(f);
	cr_assert_eq(meta_open(db, &m), -EIO);
	unlink(db);

	/* Some other SQLite database. */
	raw_sql("CREATE TABLE t(x); INSERT INTO t VALUES (1);");
	cr_assert_eq(meta_open(db, &m), -EIO);
	unlink(db);

	wrong_version_and_damaged_volume_record();
	meta_close(NULL);
}
#endif

/* ---- namespace ----------------------------------------------------------- */

Test(meta, create_every_type)
{
	struct meta_attr a, root;
	char *t;

	age(META_ROOT_INO);
	cr_assert_eq(meta_create(m, META_ROOT_INO, "f", S_IFREG | 0640, 5, 6, 0, NULL, &a), 0);
	cr_assert_eq(a.mode, S_IFREG | 0640);
	cr_assert_eq(a.uid, 5);
	cr_assert_eq(a.gid, 6);
	cr_assert_eq(a.nlink, 1);
	cr_assert_eq(a.size, 0);
	root = attr(META_ROOT_INO);
	cr_assert(!is_old(root.mtime) && !is_old(root.ctime));
	cr_assert_eq(root.nlink, 2);

	cr_assert_eq(meta_create(m, META_ROOT_INO, "d", S_IFDIR | 0755, 5, 6, 0, NULL, &a), 0);
	cr_assert_eq(a.nlink, 2);
	cr_assert_eq(attr(META_ROOT_INO).nlink, 3);

	cr_assert_eq(meta_create(m, META_ROOT_INO, "l", S_IFLNK | 0777, 5, 6, 0, "../x/y", &a), 0);
	cr_assert_eq(a.size, 6);
	cr_assert_eq(meta_readlink(m, a.ino, &t), 0);
	cr_assert_str_eq(t, "../x/y");
	free(t);
	cr_assert_eq(meta_readlink(m, META_ROOT_INO, &t), -EINVAL);
	cr_assert_eq(meta_readlink(m, 9999, &t), -ENOENT);

	cr_assert_eq(meta_create(m, META_ROOT_INO, "p", S_IFIFO | 0600, 5, 6, 0, NULL, &a), 0);
	cr_assert_eq(meta_create(m, META_ROOT_INO, "s", S_IFSOCK | 0600, 5, 6, 0, NULL, &a), 0);
	cr_assert_eq(meta_create(m, META_ROOT_INO, "c", S_IFCHR | 0600, 5, 6, 0x0103, NULL, &a), 0);
	cr_assert_eq(a.rdev, 0x0103);
	cr_assert_eq(meta_create(m, META_ROOT_INO, "b", S_IFBLK | 0600, 5, 6, 0x0801, NULL, &a), 0);
	cr_assert_eq(meta_lookup(m, META_ROOT_INO, "b", &a), 0);
	cr_assert(S_ISBLK(a.mode));
	cr_assert_eq(a.rdev, 0x0801);
	cr_assert_eq(attr(META_ROOT_INO).nlink, 3);
}

Test(meta, create_errors)
{
	char longname[META_NAME_MAX + 2];
	uint64_t f = mk(META_ROOT_INO, "f", S_IFREG | 0644);

	memset(longname, 'a', sizeof(longname));
	longname[META_NAME_MAX + 1] = '\0';
	cr_assert_eq(meta_create(m, META_ROOT_INO, "f", S_IFREG | 0644, 0, 0, 0, NULL, NULL),
		     -EEXIST);
	cr_assert_eq(meta_create(m, META_ROOT_INO, "f", S_IFDIR | 0755, 0, 0, 0, NULL, NULL),
		     -EEXIST);
	cr_assert_eq(meta_create(m, META_ROOT_INO, longname, S_IFREG, 0, 0, 0, NULL, NULL),
		     -ENAMETOOLONG);
	longname[META_NAME_MAX] = '\0';
	cr_assert_eq(meta_create(m, META_ROOT_INO, longname, S_IFREG, 0, 0, 0, NULL, NULL), 0);
	cr_assert_eq(meta_lookup(m, META_ROOT_INO, longname, NULL), 0);
	cr_assert_eq(meta_create(m, META_ROOT_INO, "", S_IFREG, 0, 0, 0, NULL, NULL), -EINVAL);
	cr_assert_eq(meta_create(m, META_ROOT_INO, ".", S_IFREG, 0, 0, 0, NULL, NULL), -EINVAL);
	cr_assert_eq(meta_create(m, META_ROOT_INO, "..", S_IFDIR, 0, 0, 0, NULL, NULL), -EINVAL);
	cr_assert_eq(meta_create(m, META_ROOT_INO, "a/b", S_IFREG, 0, 0, 0, NULL, NULL), -EINVAL);
	cr_assert_eq(meta_create(m, META_ROOT_INO, "x", 0644, 0, 0, 0, NULL, NULL), -EINVAL);
	cr_assert_eq(meta_create(m, META_ROOT_INO, "x", S_IFLNK | 0777, 0, 0, 0, NULL, NULL),
		     -EINVAL);
	cr_assert_eq(meta_create(m, f, "x", S_IFREG, 0, 0, 0, NULL, NULL), -ENOTDIR);
	cr_assert_eq(meta_create(m, 9999, "x", S_IFREG, 0, 0, 0, NULL, NULL), -ENOENT);
	cr_assert_eq(meta_create(m, 0, "x", S_IFREG, 0, 0, 0, NULL, NULL), -ENOENT);
	cr_assert_eq(meta_lookup(m, META_ROOT_INO, "x", NULL), -ENOENT);
	cr_assert_eq(meta_lookup(m, f, "x", NULL), -ENOTDIR);
	cr_assert_eq(meta_lookup(m, 9999, "x", NULL), -ENOENT);
	cr_assert_eq(meta_lookup(m, META_ROOT_INO, "a/b", NULL), -EINVAL);
	cr_assert_eq(meta_getattr(m, 9999, NULL), -ENOENT);
	cr_assert_eq(meta_getattr(m, 0, NULL), -ENOENT);
	cr_assert_eq(meta_getattr(m, UINT64_MAX, NULL), -ENOENT);
}

Test(meta, setgid_inheritance)
{
	struct meta_attr in = { .mode = 02775, .gid = 4242 }, a;
	uint64_t g = mk(META_ROOT_INO, "g", S_IFDIR | 0775);

	cr_assert_eq(meta_setattr(m, g, META_SET_MODE | META_SET_GID, &in, &a), 0);
	cr_assert_eq(a.mode, S_IFDIR | 02775);
	cr_assert_eq(a.gid, 4242);
	cr_assert_eq(meta_create(m, g, "f", S_IFREG | 0644, 1, 2, 0, NULL, &a), 0);
	cr_assert_eq(a.gid, 4242);
	cr_assert_eq(a.uid, 1);
	cr_assert_eq(a.mode, S_IFREG | 0644);
	cr_assert_eq(meta_create(m, g, "sub", S_IFDIR | 0755, 1, 2, 0, NULL, &a), 0);
	cr_assert_eq(a.gid, 4242);
	cr_assert_eq(a.mode, S_IFDIR | S_ISGID | 0755);
	/* ... and it carries on down. */
	cr_assert_eq(meta_create(m, a.ino, "deeper", S_IFDIR | 0700, 1, 2, 0, NULL, &a), 0);
	cr_assert_eq(a.gid, 4242);
	cr_assert(a.mode & S_ISGID);
	/* Not under a plain directory. */
	cr_assert_eq(meta_create(m, META_ROOT_INO, "plain", S_IFDIR | 0755, 1, 2, 0, NULL, &a), 0);
	cr_assert_eq(a.gid, 2);
	cr_assert_eq(a.mode & S_ISGID, 0);
}

Test(meta, link)
{
	struct meta_attr a;
	uint64_t d = mk(META_ROOT_INO, "d", S_IFDIR | 0755);
	uint64_t f = mk(META_ROOT_INO, "f", S_IFREG | 0644);

	age(f);
	age(d);
	cr_assert_eq(meta_link(m, f, d, "g", &a), 0);
	cr_assert_eq(a.ino, f);
	cr_assert_eq(a.nlink, 2);
	cr_assert(!is_old(a.ctime));
	cr_assert(is_old(a.mtime));
	cr_assert(!is_old(attr(d).mtime) && !is_old(attr(d).ctime));
	cr_assert_eq(attr(d).nlink, 2);
	cr_assert_eq(meta_lookup(m, d, "g", &a), 0);
	cr_assert_eq(a.ino, f);
	cr_assert_eq(meta_link(m, d, META_ROOT_INO, "dd", NULL), -EPERM);
	cr_assert_eq(meta_link(m, f, d, "g", NULL), -EEXIST);
	cr_assert_eq(meta_link(m, f, f, "x", NULL), -ENOTDIR);
	cr_assert_eq(meta_link(m, 9999, d, "x", NULL), -ENOENT);
	cr_assert_eq(meta_link(m, f, 9999, "x", NULL), -ENOENT);
}

Test(meta, unlink)
{
	struct meta_attr a;
	uint64_t d = mk(META_ROOT_INO, "d", S_IFDIR | 0755);
	uint64_t f = mk(META_ROOT_INO, "f", S_IFREG | 0644);

	cr_assert_eq(meta_link(m, f, d, "g", NULL), 0);
	age(f);
	age(META_ROOT_INO);
	cr_assert_eq(meta_unlink(m, META_ROOT_INO, "f", &a), 0);
	cr_assert_eq(a.ino, f);
	cr_assert_eq(a.nlink, 1);
	cr_assert(!is_old(a.ctime));
	cr_assert(!is_old(attr(META_ROOT_INO).mtime));
	cr_assert_eq(orphan_count(), 0);
	cr_assert_eq(meta_unlink(m, META_ROOT_INO, "f", &a), -ENOENT);
	cr_assert_eq(meta_unlink(m, d, "g", &a), 0);
	cr_assert_eq(a.nlink, 0);
	cr_assert_eq(orphan_count(), 1);
	/* The unlinked inode lives on until released. */
	cr_assert_eq(attr(f).nlink, 0);
	cr_assert_eq(meta_unlink(m, META_ROOT_INO, "d", &a), -EISDIR);
	cr_assert_eq(meta_unlink(m, f, "x", &a), -ENOTDIR);
	cr_assert_eq(meta_unlink(m, META_ROOT_INO, "..", &a), -EINVAL);
}

Test(meta, rmdir)
{
	struct meta_attr a;
	uint64_t d = mk(META_ROOT_INO, "d", S_IFDIR | 0755);
	uint64_t e = mk(d, "e", S_IFDIR | 0755);

	mk(META_ROOT_INO, "f", S_IFREG | 0644);
	cr_assert_eq(attr(META_ROOT_INO).nlink, 3);
	cr_assert_eq(attr(d).nlink, 3);
	cr_assert_eq(meta_rmdir(m, META_ROOT_INO, "f", &a), -ENOTDIR);
	cr_assert_eq(meta_rmdir(m, META_ROOT_INO, "d", &a), -ENOTEMPTY);
	cr_assert_eq(meta_rmdir(m, META_ROOT_INO, "nope", &a), -ENOENT);
	age(d);
	cr_assert_eq(meta_rmdir(m, d, "e", &a), 0);
	cr_assert_eq(a.ino, e);
	cr_assert_eq(a.nlink, 0);
	cr_assert_eq(attr(d).nlink, 2);
	cr_assert(!is_old(attr(d).mtime) && !is_old(attr(d).ctime));
	cr_assert_eq(meta_rmdir(m, META_ROOT_INO, "d", &a), 0);
	cr_assert_eq(attr(META_ROOT_INO).nlink, 2);
	cr_assert_eq(orphan_count(), 2);
	/* Nothing can be created in a removed directory. */
	cr_assert_eq(meta_create(m, d, "x", S_IFREG, 0, 0, 0, NULL, NULL), -ENOENT);
}

/* ---- readdir --------------------------------------------------------------- */

#define NENT 300

struct seen {
	int count[2 * NENT];
	uint64_t last;
	int n, stop_after, plus;
	int bad;
};

static int collect(void *arg, const char *name, const struct meta_attr *a, uint64_t cookie)
{
	struct seen *s = arg;
	int i = atoi(name + 1);

	if (cookie <= s->last || i < 0 || i >= 2 * NENT || a->ino == 0 || !S_ISREG(a->mode) ||
	    (s->plus && a->nlink != 1) || (!s->plus && a->nlink != 0))
		s->bad++;
	s->count[i]++;
	s->last = cookie;
	s->n++;
	return s->stop_after && s->n >= s->stop_after;
}

Test(meta, readdir_cookies_stable)
{
	struct seen s = { .stop_after = 100, .plus = 1 };
	char name[16];
	int i;
	uint64_t d = mk(META_ROOT_INO, "d", S_IFDIR | 0755);

	for (i = 0; i < NENT; i++) {
		snprintf(name, sizeof(name), "e%d", i);
		mk(d, name, S_IFREG | 0644);
	}
	cr_assert_eq(meta_readdir(m, d, 0, 1, collect, &s), 0);
	cr_assert_eq(s.n, 100);
	for (i = 0; i < 100; i++)
		cr_assert_eq(s.count[i], 1, "entry %d in the first page", i);

	/* Between pages: delete seen and unseen entries, create new ones. */
	for (i = 0; i < NENT; i += 3) {
		snprintf(name, sizeof(name), "e%d", i);
		cr_assert_eq(meta_unlink(m, d, name, NULL), 0);
	}
	for (i = NENT; i < NENT + 50; i++) {
		snprintf(name, sizeof(name), "e%d", i);
		mk(d, name, S_IFREG | 0644);
	}
	/* Re-creating a deleted name gives it a new cookie: it comes again. */
	mk(d, "e0", S_IFREG | 0644);

	s.stop_after = 0;
	s.plus = 0;
	cr_assert_eq(meta_readdir(m, d, s.last, 0, collect, &s), 0);
	cr_assert_eq(s.bad, 0);
	for (i = 0; i < NENT + 50; i++) {
		int want;

		if (i < 100)
			want = 1 + (i == 0);
		else if (i < NENT)
			want = (i % 3 == 0) ? 0 : 1;
		else
			want = 1;
		cr_assert_eq(s.count[i], want, "entry %d seen %d times", i, s.count[i]);
	}

	/* A listing from the start now sees each live entry exactly once. */
	memset(&s, 0, sizeof(s));
	cr_assert_eq(meta_readdir(m, d, 0, 0, collect, &s), 0);
	cr_assert_eq(s.n, NENT - NENT / 3 + 50 + 1);
	cr_assert_eq(meta_readdir(m, mk(META_ROOT_INO, "f", S_IFREG), 0, 0, collect, &s),
		     -ENOTDIR);
	cr_assert_eq(meta_readdir(m, 9999, 0, 0, collect, &s), -ENOENT);
}

static int count_cb(void *arg, const char *name, const struct meta_attr *a, uint64_t cookie)
{
	(*(int *)arg)++;
	return 0;
}

/* The callback can call back into meta (no statement is held open). */
struct reenter {
	uint64_t dir;
	int n;
};

static int reenter_cb(void *arg, const char *name, const struct meta_attr *a, uint64_t cookie)
{
	struct reenter *r = arg;
	int n = 0;

	cr_assert_eq(meta_readdir(m, r->dir, 0, 1, count_cb, &n), 0);
	cr_assert_eq(meta_unlink(m, r->dir, name, NULL), 0);
	r->n++;
	return 0;
}

Test(meta, readdir_reentrant)
{
	struct reenter r = { .dir = mk(META_ROOT_INO, "d", S_IFDIR | 0755) };
	char name[16];
	int i, n = 0;

	for (i = 0; i < 300; i++) {
		snprintf(name, sizeof(name), "f%d", i);
		mk(r.dir, name, S_IFREG | 0644);
	}
	cr_assert_eq(meta_readdir(m, r.dir, 0, 0, reenter_cb, &r), 0);
	cr_assert_eq(r.n, 300);
	cr_assert_eq(meta_readdir(m, r.dir, 0, 0, count_cb, &n), 0);
	cr_assert_eq(n, 0);
}

/* ---- rename ------------------------------------------------------------------ */

static uint64_t ino_of(uint64_t parent, const char *name)
{
	struct meta_attr a;
	int rc = meta_lookup(m, parent, name, &a);

	return rc == 0 ? a.ino : 0;
}

Test(meta, rename_simple_and_across)
{
	struct meta_attr r;
	uint64_t a = mk(META_ROOT_INO, "a", S_IFDIR | 0755);
	uint64_t b = mk(META_ROOT_INO, "b", S_IFDIR | 0755);
	uint64_t f = mk(a, "f", S_IFREG | 0644);
	uint64_t sub = mk(a, "sub", S_IFDIR | 0755);

	age(f);
	age(a);
	age(b);
	cr_assert_eq(meta_rename(m, a, "f", a, "g", 0, &r), 0);
	cr_assert_eq(r.ino, 0);
	cr_assert_eq(ino_of(a, "g"), f);
	cr_assert_eq(ino_of(a, "f"), 0);
	cr_assert(!is_old(attr(f).ctime));
	cr_assert(!is_old(attr(a).mtime));

	cr_assert_eq(attr(a).nlink, 3);
	cr_assert_eq(meta_rename(m, a, "sub", b, "sub2", 0, &r), 0);
	cr_assert_eq(ino_of(b, "sub2"), sub);
	cr_assert_eq(attr(a).nlink, 2);
	cr_assert_eq(attr(b).nlink, 3);
	cr_assert(!is_old(attr(b).mtime) && !is_old(attr(b).ctime));

	cr_assert_eq(meta_rename(m, a, "nope", b, "x", 0, &r), -ENOENT);
	cr_assert_eq(meta_rename(m, a, "g", 9999, "x", 0, &r), -ENOENT);
	cr_assert_eq(meta_rename(m, a, "g", f, "x", 0, &r), -ENOTDIR);
	cr_assert_eq(meta_rename(m, a, "g", b, "x", 4, &r), -EINVAL);
	cr_assert_eq(meta_rename(m, a, "g", b, "x",
				 META_RENAME_NOREPLACE | META_RENAME_EXCHANGE, &r),
		     -EINVAL);
	cr_assert_eq(meta_rename(m, a, "g", b, "", 0, &r), -EINVAL);
}

Test(meta, rename_replace)
{
	struct meta_attr r;
	uint64_t f = mk(META_ROOT_INO, "f", S_IFREG | 0644);
	uint64_t g = mk(META_ROOT_INO, "g", S_IFREG | 0644);
	uint64_t h = mk(META_ROOT_INO, "h", S_IFREG | 0644);
	uint64_t d1 = mk(META_ROOT_INO, "d1", S_IFDIR | 0755);
	uint64_t d2 = mk(META_ROOT_INO, "d2", S_IFDIR | 0755);
	uint64_t d3 = mk(META_ROOT_INO, "d3", S_IFDIR | 0755);

	mk(d3, "inside", S_IFREG | 0644);
	cr_assert_eq(meta_link(m, h, d3, "hl", NULL), 0);

	/* A file over a file: the victim loses a link. */
	age(g);
	cr_assert_eq(meta_rename(m, META_ROOT_INO, "f", META_ROOT_INO, "g", 0, &r), 0);
	cr_assert_eq(r.ino, g);
	cr_assert_eq(r.nlink, 0);
	cr_assert(!is_old(r.ctime));
	cr_assert_eq(ino_of(META_ROOT_INO, "g"), f);
	cr_assert_eq(orphan_count(), 1);
	/* One with another link keeps living. */
	cr_assert_eq(meta_rename(m, META_ROOT_INO, "g", META_ROOT_INO, "h", 0, &r), 0);
	cr_assert_eq(r.ino, h);
	cr_assert_eq(r.nlink, 1);
	cr_assert_eq(orphan_count(), 1);

	cr_assert_eq(attr(META_ROOT_INO).nlink, 5);
	cr_assert_eq(meta_rename(m, META_ROOT_INO, "h", META_ROOT_INO, "d2", 0, &r), -EISDIR);
	cr_assert_eq(meta_rename(m, META_ROOT_INO, "d2", META_ROOT_INO, "h", 0, &r), -ENOTDIR);
	cr_assert_eq(meta_rename(m, META_ROOT_INO, "d2", META_ROOT_INO, "d3", 0, &r), -ENOTEMPTY);
	cr_assert_eq(meta_rename(m, META_ROOT_INO, "h", META_ROOT_INO, "d1", 0, &r), -EISDIR);
	/* An empty directory over an empty directory. */
	cr_assert_eq(meta_rename(m, META_ROOT_INO, "d2", META_ROOT_INO, "d1", 0, &r), 0);
	cr_assert_eq(r.ino, d1);
	cr_assert_eq(r.nlink, 0);
	cr_assert_eq(ino_of(META_ROOT_INO, "d1"), d2);
	cr_assert_eq(attr(META_ROOT_INO).nlink, 4);
	cr_assert_eq(orphan_count(), 2);
}

Test(meta, rename_dir_over_nonempty_with_link)
{
	/* d1 holds a hard link, so it is not empty. */
	struct meta_attr r;
	uint64_t h = mk(META_ROOT_INO, "h", S_IFREG | 0644);
	uint64_t d1 = mk(META_ROOT_INO, "d1", S_IFDIR | 0755);

	mk(META_ROOT_INO, "d2", S_IFDIR | 0755);
	cr_assert_eq(meta_link(m, h, d1, "hl", NULL), 0);
	cr_assert_eq(meta_rename(m, META_ROOT_INO, "d2", META_ROOT_INO, "d1", 0, &r), -ENOTEMPTY);
}

Test(meta, rename_self_and_flags)
{
	struct meta_attr r;
	uint64_t f = mk(META_ROOT_INO, "f", S_IFREG | 0644);
	uint64_t d = mk(META_ROOT_INO, "d", S_IFDIR | 0755);

	cr_assert_eq(meta_link(m, f, d, "f2", NULL), 0);
	age(f);
	cr_assert_eq(meta_rename(m, META_ROOT_INO, "f", META_ROOT_INO, "f", 0, &r), 0);
	cr_assert_eq(r.ino, 0);
	cr_assert(is_old(attr(f).ctime));
	cr_assert_eq(meta_rename(m, META_ROOT_INO, "d", META_ROOT_INO, "d", 0, &r), 0);
	/* Hard links of one inode: nothing happens, both names stay. */
	cr_assert_eq(meta_rename(m, META_ROOT_INO, "f", d, "f2", 0, &r), 0);
	cr_assert_eq(ino_of(META_ROOT_INO, "f"), f);
	cr_assert_eq(ino_of(d, "f2"), f);
	cr_assert_eq(attr(f).nlink, 2);

	mk(META_ROOT_INO, "g", S_IFREG | 0644);
	cr_assert_eq(meta_rename(m, META_ROOT_INO, "f", META_ROOT_INO, "g",
				 META_RENAME_NOREPLACE, &r),
		     -EEXIST);
	cr_assert_eq(meta_rename(m, META_ROOT_INO, "f", META_ROOT_INO, "new",
				 META_RENAME_NOREPLACE, &r),
		     0);
	cr_assert_eq(meta_rename(m, META_ROOT_INO, "new", META_ROOT_INO, "missing",
				 META_RENAME_EXCHANGE, &r),
		     -ENOENT);
}

Test(meta, rename_into_own_subtree)
{
	struct meta_attr r;
	uint64_t a = mk(META_ROOT_INO, "a", S_IFDIR | 0755);
	uint64_t b = mk(a, "b", S_IFDIR | 0755);
	uint64_t c = mk(b, "c", S_IFDIR | 0755);

	cr_assert_eq(meta_rename(m, META_ROOT_INO, "a", c, "a", 0, &r), -EINVAL);
	cr_assert_eq(meta_rename(m, META_ROOT_INO, "a", a, "x", 0, &r), -EINVAL);
	cr_assert_eq(meta_rename(m, META_ROOT_INO, "a", b, "x", 0, &r), -EINVAL);
	cr_assert_eq(meta_rename(m, a, "b", c, "x", 0, &r), -EINVAL);
	/* Exchanging a directory with something inside it. */
	cr_assert_eq(meta_rename(m, b, "c", META_ROOT_INO, "a", META_RENAME_EXCHANGE, &r),
		     -EINVAL);
	cr_assert_eq(meta_rename(m, META_ROOT_INO, "a", b, "c", META_RENAME_EXCHANGE, &r),
		     -EINVAL);
	/* Onto an ancestor: not empty. */
	cr_assert_eq(meta_rename(m, b, "c", META_ROOT_INO, "a", 0, &r), -ENOTEMPTY);
	/* Up the tree is fine. */
	cr_assert_eq(meta_rename(m, b, "c", META_ROOT_INO, "c", 0, &r), 0);
	cr_assert_eq(attr(b).nlink, 2);
	cr_assert_eq(attr(META_ROOT_INO).nlink, 4);
}

Test(meta, rename_exchange_file_dir_across_parents)
{
	struct meta_attr r;
	uint64_t p1 = mk(META_ROOT_INO, "p1", S_IFDIR | 0755);
	uint64_t p2 = mk(META_ROOT_INO, "p2", S_IFDIR | 0755);
	uint64_t f = mk(p1, "f", S_IFREG | 0644);
	uint64_t d = mk(p2, "d", S_IFDIR | 0755);
	uint64_t inner = mk(d, "inner", S_IFREG | 0644);

	cr_assert_eq(attr(p1).nlink, 2);
	cr_assert_eq(attr(p2).nlink, 3);
	age(f);
	age(d);
	age(p1);
	age(p2);
	cr_assert_eq(meta_rename(m, p1, "f", p2, "d", META_RENAME_EXCHANGE, &r), 0);
	cr_assert_eq(r.ino, 0);
	cr_assert_eq(ino_of(p1, "f"), d);
	cr_assert_eq(ino_of(p2, "d"), f);
	cr_assert_eq(ino_of(d, "inner"), inner); /* the non-empty directory moved whole */
	cr_assert_eq(attr(p1).nlink, 3);
	cr_assert_eq(attr(p2).nlink, 2);
	cr_assert(!is_old(attr(f).ctime) && !is_old(attr(d).ctime));
	cr_assert(!is_old(attr(p1).mtime) && !is_old(attr(p2).mtime));
	cr_assert_eq(attr(f).nlink, 1);
	cr_assert_eq(attr(d).nlink, 2);
	cr_assert_eq(orphan_count(), 0);

	/* And back, with the directory as the source this time. */
	cr_assert_eq(meta_rename(m, p1, "f", p2, "d", META_RENAME_EXCHANGE, &r), 0);
	cr_assert_eq(ino_of(p1, "f"), f);
	cr_assert_eq(ino_of(p2, "d"), d);
	cr_assert_eq(attr(p1).nlink, 2);
	cr_assert_eq(attr(p2).nlink, 3);

	/* Two directories in one parent: link counts stay. */
	mk(p2, "e", S_IFDIR | 0755);
	cr_assert_eq(meta_rename(m, p2, "d", p2, "e", META_RENAME_EXCHANGE, &r), 0);
	cr_assert_eq(ino_of(p2, "e"), d);
	cr_assert_eq(attr(p2).nlink, 4);
	/* Moving the subtree afterwards still works (parents were fixed). */
	cr_assert_eq(meta_rename(m, p2, "e", p1, "moved", 0, &r), 0);
	cr_assert_eq(meta_rename(m, META_ROOT_INO, "p1", d, "x", 0, &r), -EINVAL);
}

/* ---- data: truncate, write_commit, punch ----------------------------------------- */

static void commit1(uint64_t ino, uint32_t chunk, uint64_t id, uint32_t pos, uint32_t len,
		    uint64_t size)
{
	struct meta_chunk_slice s = { .chunk = chunk,
				      .s = { .id = id, .size = len, .off = 0, .pos = pos,
					     .len = len } };

	cr_assert_eq(meta_write_commit(m, ino, &s, 1, size, NULL, NULL), 0);
}

/* What a reader sees at chunk bytes [pos, pos+len): the extents. */
static size_t view(uint64_t ino, uint32_t chunk, uint32_t pos, uint32_t len,
		   struct slice_extent **e)
{
	struct meta_slice *s;
	size_t n, ne;

	cr_assert_eq(meta_chunk_slices(m, ino, chunk, &s, &n), 0);
	cr_assert_eq(slice_resolve(s, n, pos, len, e, &ne), 0);
	free(s);
	return ne;
}

static void expect(const struct slice_extent *e, uint32_t pos, uint32_t len, uint64_t id)
{
	cr_assert_eq(e->pos, pos, "pos %u != %u", e->pos, pos);
	cr_assert_eq(e->len, len, "len %u != %u at %u", e->len, len, pos);
	cr_assert_eq(e->id, id, "id %llu != %llu at %u", (unsigned long long)e->id,
		     (unsigned long long)id, pos);
}

static size_t nslices(uint64_t ino, uint32_t chunk)
{
	struct meta_slice *s;
	size_t n;

	cr_assert_eq(meta_chunk_slices(m, ino, chunk, &s, &n), 0);
	free(s);
	return n;
}

static void set_size(uint64_t ino, uint64_t size)
{
	struct meta_attr in = { .size = size }, out;

	cr_assert_eq(meta_setattr(m, ino, META_SET_SIZE, &in, &out), 0);
	cr_assert_eq(out.size, size);
}

Test(meta, truncate_then_extend_reads_zeros)
{
	struct slice_extent *e;
	uint64_t f = mk(META_ROOT_INO, "f", S_IFREG | 0644);
	size_t n;

	commit1(f, 0, 11, 0, 1000, 1000);
	set_size(f, 500);
	set_size(f, 2000);
	n = view(f, 0, 0, 2000, &e);
	cr_assert_eq(n, 2);
	expect(&e[0], 0, 500, 11);
	expect(&e[1], 500, 1500, 0);
	free(e);

	/* Growing adds nothing when nothing shows past the end, and cycles of
	 * truncate and extend do not pile up zero slices. */
	n = nslices(f, 0);
	cr_assert_eq(n, 2);
	set_size(f, 5000);
	set_size(f, 300);
	set_size(f, 4000);
	set_size(f, 250);
	set_size(f, 500);
	cr_assert_eq(nslices(f, 0), 4);
	n = view(f, 0, 0, 4000, &e);
	cr_assert_eq(n, 2);
	expect(&e[0], 0, 250, 11);
	expect(&e[1], 250, 3750, 0);
	free(e);
}

Test(meta, shrink_across_chunks)
{
	struct meta_chunk_slice s[3] = {
		{ 0, { 21, (uint32_t)CS, 0, 0, (uint32_t)CS } },
		{ 1, { 22, (uint32_t)CS, 0, 0, (uint32_t)CS } },
		{ 2, { 23, 100, 0, 0, 100 } },
	};
	struct slice_extent *e;
	uint64_t f = mk(META_ROOT_INO, "f", S_IFREG | 0644);
	size_t n;

	cr_assert_eq(meta_write_commit(m, f, s, 3, 2 * CS + 100, NULL, NULL), 0);
	set_size(f, CS + 10);
	cr_assert_eq(nslices(f, 2), 0);
	cr_assert_eq(raw_int("SELECT COUNT(*) FROM gc_slice WHERE id = 23"), 1);
	cr_assert_eq(raw_int("SELECT COUNT(*) FROM gc_slice WHERE id = 22"), 0);
	/* Extend again: the tail of chunk 1 and all of chunk 2 are zeros. */
	set_size(f, 3 * CS);
	n = view(f, 1, 0, (uint32_t)CS, &e);
	cr_assert_eq(n, 2);
	expect(&e[0], 0, 10, 22);
	expect(&e[1], 10, (uint32_t)CS - 10, 0);
	free(e);
	n = view(f, 2, 0, (uint32_t)CS, &e);
	cr_assert_eq(n, 1);
	expect(&e[0], 0, (uint32_t)CS, 0);
	free(e);

	/* Truncating to a chunk boundary drops the chunk after it entirely. */
	set_size(f, CS);
	cr_assert_eq(nslices(f, 1), 0);
	cr_assert_eq(raw_int("SELECT COUNT(*) FROM gc_slice WHERE id = 22"), 1);
	set_size(f, 0);
	cr_assert_eq(nslices(f, 0), 0);
	cr_assert_eq(raw_int("SELECT COUNT(*) FROM gc_slice"), 3);
	cr_assert_eq(raw_int("SELECT COUNT(*) FROM slice"), 0);
}

Test(meta, write_commit_smaller_size_then_grow)
{
	/* A commit that shrinks the file must not let old bytes come back. */
	struct slice_extent *e;
	uint64_t f = mk(META_ROOT_INO, "f", S_IFREG | 0644);
	size_t n;

	commit1(f, 0, 31, 0, 1000, 1000);
	commit1(f, 0, 32, 0, 100, 100);
	commit1(f, 0, 33, 800, 100, 900);
	n = view(f, 0, 0, 900, &e);
	cr_assert_eq(n, 3);
	expect(&e[0], 0, 100, 32);
	expect(&e[1], 100, 700, 0);
	expect(&e[2], 800, 100, 33);
	free(e);
}

Test(meta, setattr_size_errors)
{
	struct meta_attr in = { .size = 10 };
	uint64_t d = mk(META_ROOT_INO, "d", S_IFDIR | 0755);
	uint64_t l = mk(META_ROOT_INO, "l", S_IFLNK | 0777);
	uint64_t f = mk(META_ROOT_INO, "f", S_IFREG | 0644);

	cr_assert_eq(meta_setattr(m, d, META_SET_SIZE, &in, NULL), -EISDIR);
	cr_assert_eq(meta_setattr(m, l, META_SET_SIZE, &in, NULL), -EINVAL);
	in.size = UINT64_MAX;
	cr_assert_eq(meta_setattr(m, f, META_SET_SIZE, &in, NULL), -EFBIG);
	cr_assert_eq(meta_setattr(m, 9999, META_SET_MODE, &in, NULL), -ENOENT);
	cr_assert_eq(meta_setattr(m, f, 1u << 20, &in, NULL), -EINVAL);
	in.mtime.tv_nsec = 1000000000;
	cr_assert_eq(meta_setattr(m, f, META_SET_MTIME, &in, NULL), -EINVAL);
}

Test(meta, setattr_fields)
{
	struct meta_attr in = { 0 }, out;
	uint64_t f = mk(META_ROOT_INO, "f", S_IFREG | 0644);

	in.mode = S_IFDIR | 04711; /* the type bits are ignored */
	in.uid = 77;
	in.gid = 88;
	in.atime = (struct timespec){ 123, 456 };
	in.mtime = (struct timespec){ 789, 999999999 };
	in.ctime = (struct timespec){ 5, 6 };
	cr_assert_eq(meta_setattr(m, f,
				  META_SET_MODE | META_SET_UID | META_SET_GID | META_SET_ATIME |
					  META_SET_MTIME,
				  &in, &out),
		     0);
	cr_assert_eq(out.mode, S_IFREG | 04711);
	cr_assert_eq(out.uid, 77);
	cr_assert_eq(out.gid, 88);
	cr_assert_eq(out.atime.tv_sec, 123);
	cr_assert_eq(out.atime.tv_nsec, 456);
	cr_assert_eq(out.mtime.tv_nsec, 999999999);
	cr_assert_gt(out.ctime.tv_sec, 1000000000);
	cr_assert_eq(meta_setattr(m, f, META_SET_CTIME | META_SET_ATIME_NOW, &in, &out), 0);
	cr_assert_eq(out.ctime.tv_sec, 5);
	cr_assert_eq(out.ctime.tv_nsec, 6);
	cr_assert_gt(out.atime.tv_sec, 1000000000);
	cr_assert_eq(out.mtime.tv_sec, 789);
	out = attr(f);
	cr_assert_eq(out.ctime.tv_sec, 5);
	cr_assert_eq(meta_setattr(m, f, META_SET_MTIME_NOW, &in, &out), 0);
	cr_assert_gt(out.mtime.tv_sec, 1000000000);
}

Test(meta, write_commit_order_and_ids)
{
	struct meta_chunk_slice s[3] = {
		{ 0, { 0, 0, 0, 0, 0 } },
		{ 0, { 0, 0, 0, 0, 0 } },
		{ 1, { 0, 0, 0, 0, 0 } },
	};
	struct timespec mt = { 1234, 5678 };
	struct meta_slice *got;
	struct meta_attr out;
	uint64_t first, next;
	size_t n;
	uint64_t f = mk(META_ROOT_INO, "f", S_IFREG | 0644);

	cr_assert_eq(meta_slice_id_alloc(m, 3, &first), 0);
	cr_assert_eq(first, 1);
	cr_assert_eq(meta_slice_id_alloc(m, 1, &next), 0);
	cr_assert_eq(next, 4);
	cr_assert_eq(meta_slice_id_alloc(m, 0, &next), -EINVAL);
	/* Each handle takes ids ahead in ranges; another handle's never meet
	 * this one's, and a request larger than a range is served whole. */
	{
		struct meta *o = NULL;
		uint64_t theirs, big, mine;

		cr_assert_eq(meta_open(db, &o), 0);
		cr_assert_eq(meta_slice_id_alloc(o, 2, &theirs), 0);
		cr_assert_eq(meta_slice_id_alloc(o, 5000, &big), 0);
		cr_assert_eq(meta_slice_id_alloc(m, 1, &mine), 0);
		cr_assert_eq(mine, 5);
		cr_assert(theirs > 5 && big >= theirs + 2, "ids %llu and %llu overlap this handle's",
			  (unsigned long long)theirs, (unsigned long long)big);
		meta_close(o);
	}

	cr_assert_eq(meta_chunk_slices(m, f, 0, &got, &n), 0);
	cr_assert_null(got);
	cr_assert_eq(n, 0);
	cr_assert_eq(meta_chunk_slices(m, 9999, 0, &got, &n), -ENOENT);

	s[0].s = (struct meta_slice){ first, 4096, 0, 0, 4096 };
	s[1].s = (struct meta_slice){ first + 1, 4096, 1024, 100, 2048 };
	s[2].s = (struct meta_slice){ first + 2, 10, 0, 0, 10 };
	cr_assert_eq(meta_write_commit(m, f, s, 3, CS + 10, &mt, &out), 0);
	cr_assert_eq(out.size, CS + 10);
	cr_assert_eq(out.mtime.tv_sec, 1234);
	cr_assert_eq(out.ctime.tv_nsec, 5678);
	commit1(f, 0, next, 50, 10, CS + 10);

	cr_assert_eq(meta_chunk_slices(m, f, 0, &got, &n), 0);
	cr_assert_eq(n, 3);
	cr_assert_eq(got[0].id, first);
	cr_assert_eq(got[1].id, first + 1);
	cr_assert_eq(got[1].off, 1024);
	cr_assert_eq(got[1].pos, 100);
	cr_assert_eq(got[1].len, 2048);
	cr_assert_eq(got[1].size, 4096);
	cr_assert_eq(got[2].id, next);
	free(got);
	cr_assert_eq(nslices(f, 1), 1);

	/* Invalid slices are refused whole. */
	s[0].s = (struct meta_slice){ 9, 10, 5, 0, 10 };
	cr_assert_eq(meta_write_commit(m, f, s, 1, 10, NULL, NULL), -EINVAL);
	s[0].s = (struct meta_slice){ 9, 10, 0, META_CHUNK_SIZE - 5, 10 };
	cr_assert_eq(meta_write_commit(m, f, s, 1, 10, NULL, NULL), -EINVAL);
	s[0].s = (struct meta_slice){ 9, 10, 0, 0, 0 };
	cr_assert_eq(meta_write_commit(m, f, s, 1, 10, NULL, NULL), -EINVAL);
	cr_assert_eq(meta_write_commit(m, META_ROOT_INO, NULL, 0, 0, NULL, NULL), -EISDIR);
	cr_assert_eq(attr(f).size, CS + 10);
}

Test(meta, punch_hole)
{
	struct meta_chunk_slice s[3] = {
		{ 0, { 41, (uint32_t)CS, 0, 0, (uint32_t)CS } },
		{ 1, { 42, (uint32_t)CS, 0, 0, (uint32_t)CS } },
		{ 2, { 43, (uint32_t)CS, 0, 0, (uint32_t)CS } },
	};
	struct slice_extent *e;
	struct meta_attr out;
	uint64_t f = mk(META_ROOT_INO, "f", S_IFREG | 0644);
	size_t n;

	cr_assert_eq(meta_write_commit(m, f, s, 3, 2 * CS + 1000, NULL, NULL), 0);
	age(f);
	/* From inside chunk 0 to inside chunk 2: chunk 1 goes whole. */
	cr_assert_eq(meta_punch_hole(m, f, 100, 2 * CS, &out), 0);
	cr_assert_eq(out.size, 2 * CS + 1000);
	cr_assert(!is_old(out.mtime) && !is_old(out.ctime));
	cr_assert_eq(nslices(f, 1), 0);
	cr_assert_eq(raw_int("SELECT COUNT(*) FROM gc_slice WHERE id = 42"), 1);
	n = view(f, 0, 0, (uint32_t)CS, &e);
	cr_assert_eq(n, 2);
	expect(&e[0], 0, 100, 41);
	expect(&e[1], 100, (uint32_t)CS - 100, 0);
	free(e);
	n = view(f, 2, 0, 1000, &e);
	cr_assert_eq(n, 2);
	expect(&e[0], 0, 100, 0);
	expect(&e[1], 100, 900, 43);
	free(e);

	/* From a chunk start past the end of the file: that chunk goes whole. */
	cr_assert_eq(meta_punch_hole(m, f, 2 * CS, CS * 5, &out), 0);
	cr_assert_eq(nslices(f, 2), 0);
	cr_assert_eq(attr(f).size, 2 * CS + 1000);
	/* Past the end: nothing happens. */
	cr_assert_eq(meta_punch_hole(m, f, 10 * CS, 10, &out), 0);
	cr_assert_eq(meta_punch_hole(m, f, 10, 0, &out), -EINVAL);
	cr_assert_eq(meta_punch_hole(m, f, UINT64_MAX, 2, &out), -EINVAL);
	cr_assert_eq(meta_punch_hole(m, META_ROOT_INO, 0, 2, &out), -EISDIR);
	/* Inside one chunk. */
	cr_assert_eq(meta_punch_hole(m, f, 10, 20, &out), 0);
	n = view(f, 0, 0, 100, &e);
	cr_assert_eq(n, 3);
	expect(&e[0], 0, 10, 41);
	expect(&e[1], 10, 20, 0);
	expect(&e[2], 30, 70, 41);
	free(e);
}

/* ---- orphans ------------------------------------------------------------------- */

Test(meta, orphans_release_purge)
{
	struct meta_attr a;
	uint64_t f1 = mk(META_ROOT_INO, "f1", S_IFREG | 0644);
	uint64_t f2 = mk(META_ROOT_INO, "f2", S_IFREG | 0644);
	uint64_t l = mk(META_ROOT_INO, "l", S_IFLNK | 0777);
	uint64_t d = mk(META_ROOT_INO, "d", S_IFDIR | 0755);
	uint64_t keep = mk(META_ROOT_INO, "keep", S_IFREG | 0644);
	uint64_t count;

	commit1(f1, 0, 51, 0, 100, 100);
	commit1(f2, 0, 52, 0, 100, 100);
	commit1(keep, 0, 53, 0, 100, 100);
	cr_assert_eq(meta_setxattr(m, f1, "user.a", "v", 1, 0), 0);
	{
		/* A time set (journaled: it records its seq for the commits). */
		struct meta_attr in = { .mtime = { 1600000000, 5 } };
		cr_assert_eq(meta_setattr(m, f2, META_SET_MTIME, &in, NULL), 0);
	}

	/* Linked: release leaves it alone. */
	cr_assert_eq(meta_inode_release(m, f1), 0);
	cr_assert_eq(attr(f1).nlink, 1);

	cr_assert_eq(meta_unlink(m, META_ROOT_INO, "f1", &a), 0);
	cr_assert_eq(meta_unlink(m, META_ROOT_INO, "f2", &a), 0);
	cr_assert_eq(meta_unlink(m, META_ROOT_INO, "l", &a), 0);
	cr_assert_eq(meta_rmdir(m, META_ROOT_INO, "d", &a), 0);
	cr_assert_eq(orphan_count(), 4);

	cr_assert_eq(meta_inode_release(m, f1), 0);
	cr_assert_eq(meta_getattr(m, f1, &a), -ENOENT);
	cr_assert_eq(meta_inode_release(m, f1), -ENOENT);
	cr_assert_eq(orphan_count(), 3);
	cr_assert_eq(raw_int("SELECT COUNT(*) FROM xattr"), 0);
	cr_assert_eq(raw_int("SELECT COUNT(*) FROM gc_slice WHERE id = 51"), 1);

	/* A crash later: the rest are purged at the next mount. */
	meta_close(m);
	cr_assert_eq(meta_open(db, &m), 0);
	cr_assert_eq(meta_orphans_purge(m, &count), 0);
	cr_assert_eq(count, 3);
	cr_assert_eq(meta_getattr(m, f2, &a), -ENOENT);
	cr_assert_eq(meta_getattr(m, l, &a), -ENOENT);
	cr_assert_eq(meta_getattr(m, d, &a), -ENOENT);
	cr_assert_eq(orphan_count(), 0);
	cr_assert_eq(raw_int("SELECT COUNT(*) FROM symlink"), 0);
	cr_assert_eq(raw_int("SELECT COUNT(*) FROM times_seq WHERE ino NOT IN (SELECT ino FROM inode)"),
		     0);
	cr_assert_eq(raw_int("SELECT COUNT(*) FROM gc_slice"), 2);
	cr_assert_eq(raw_int("SELECT COUNT(*) FROM slice"), 1);
	cr_assert_eq(attr(keep).nlink, 1);
	cr_assert_eq(meta_orphans_purge(m, &count), 0);
	cr_assert_eq(count, 0);
}

Test(meta, shared_slice_not_collected)
{
	/* A slice id still referenced by another file is not handed to gc. */
	uint64_t f1 = mk(META_ROOT_INO, "f1", S_IFREG | 0644);
	uint64_t f2 = mk(META_ROOT_INO, "f2", S_IFREG | 0644);

	commit1(f1, 0, 61, 0, 100, 100);
	commit1(f2, 0, 61, 0, 100, 100);
	cr_assert_eq(meta_unlink(m, META_ROOT_INO, "f1", NULL), 0);
	cr_assert_eq(meta_inode_release(m, f1), 0);
	cr_assert_eq(raw_int("SELECT COUNT(*) FROM gc_slice"), 0);
	set_size(f2, 0);
	cr_assert_eq(raw_int("SELECT COUNT(*) FROM gc_slice WHERE id = 61"), 1);
}

/* ---- xattr, statfs ---------------------------------------------------------------- */

Test(meta, xattr)
{
	char name[META_XATTR_NAME_MAX + 2];
	static char big[META_XATTR_SIZE_MAX + 1];
	uint64_t f = mk(META_ROOT_INO, "f", S_IFREG | 0644);
	void *v;
	char *list;
	size_t n;

	cr_assert_eq(meta_listxattr(m, f, &list, &n), 0);
	cr_assert_eq(n, 0);
	free(list);
	age(f);
	cr_assert_eq(meta_setxattr(m, f, "user.b", "hello", 5, META_XATTR_REPLACE), -ENODATA);
	cr_assert_eq(meta_setxattr(m, f, "user.b", "hello", 5, META_XATTR_CREATE), 0);
	cr_assert(!is_old(attr(f).ctime));
	cr_assert(is_old(attr(f).mtime));
	cr_assert_eq(meta_setxattr(m, f, "user.b", "x", 1, META_XATTR_CREATE), -EEXIST);
	cr_assert_eq(meta_getxattr(m, f, "user.b", &v, &n), 0);
	cr_assert_eq(n, 5);
	cr_assert_eq(memcmp(v, "hello", 5), 0);
	free(v);
	cr_assert_eq(meta_setxattr(m, f, "user.b", "bye", 3, META_XATTR_REPLACE), 0);
	cr_assert_eq(meta_getxattr(m, f, "user.b", &v, &n), 0);
	cr_assert_eq(n, 3);
	free(v);
	cr_assert_eq(meta_setxattr(m, f, "user.a", NULL, 0, 0), 0);
	cr_assert_eq(meta_getxattr(m, f, "user.a", &v, &n), 0);
	cr_assert_eq(n, 0);
	free(v);
	cr_assert_eq(meta_listxattr(m, f, &list, &n), 0);
	cr_assert_eq(n, strlen("user.a") + 1 + strlen("user.b") + 1);
	cr_assert_eq(memcmp(list, "user.a\0user.b\0", n), 0);
	free(list);

	cr_assert_eq(meta_getxattr(m, f, "user.none", &v, &n), -ENODATA);
	cr_assert_eq(meta_removexattr(m, f, "user.none"), -ENODATA);
	age(f);
	cr_assert_eq(meta_removexattr(m, f, "user.a"), 0);
	cr_assert(!is_old(attr(f).ctime));
	cr_assert_eq(meta_getxattr(m, f, "user.a", &v, &n), -ENODATA);

	memset(name, 'n', sizeof(name));
	name[META_XATTR_NAME_MAX + 1] = '\0';
	cr_assert_eq(meta_setxattr(m, f, name, "x", 1, 0), -ERANGE);
	cr_assert_eq(meta_getxattr(m, f, name, &v, &n), -ERANGE);
	name[META_XATTR_NAME_MAX] = '\0';
	cr_assert_eq(meta_setxattr(m, f, name, "x", 1, 0), 0);
	cr_assert_eq(meta_setxattr(m, f, "user.big", big, sizeof(big), 0), -E2BIG);
	cr_assert_eq(meta_setxattr(m, f, "user.big", big, sizeof(big) - 1, 0), 0);
	cr_assert_eq(meta_getxattr(m, f, "user.big", &v, &n), 0);
	cr_assert_eq(n, META_XATTR_SIZE_MAX);
	free(v);
	cr_assert_eq(meta_setxattr(m, f, "user.x", "x", 1, 3), -EINVAL);
	cr_assert_eq(meta_setxattr(m, 9999, "user.x", "x", 1, 0), -ENOENT);
	cr_assert_eq(meta_getxattr(m, 9999, "user.x", &v, &n), -ENOENT);
	cr_assert_eq(meta_listxattr(m, 9999, &list, &n), -ENOENT);
	cr_assert_eq(meta_removexattr(m, 9999, "user.x"), -ENOENT);
}

Test(meta, statfs)
{
	uint64_t bytes, inodes;
	uint64_t f = mk(META_ROOT_INO, "f", S_IFREG | 0644);
	uint64_t g = mk(META_ROOT_INO, "g", S_IFREG | 0644);

	mk(META_ROOT_INO, "d", S_IFDIR | 0755);
	mk(META_ROOT_INO, "l", S_IFLNK | 0777); /* its size is not file data */
	commit1(f, 0, 71, 0, 1000, 1000);
	set_size(g, 3 * CS);
	cr_assert_eq(meta_statfs(m, &bytes, &inodes), 0);
	cr_assert_eq(bytes, 1000 + 3 * CS);
	cr_assert_eq(inodes, 5);
}

/* ---- threads --------------------------------------------------------------------- */

struct worker {
	uint64_t dir;
	int errors;
};

static void *work(void *p)
{
	struct worker *w = p;
	struct meta_attr a;
	char name[32];
	int i;

	for (i = 0; i < 150; i++) {
		snprintf(name, sizeof(name), "f%d", i);
		if (meta_create(m, w->dir, name, S_IFREG | 0644, 0, 0, 0, NULL, &a) != 0)
			w->errors++;
		if (meta_lookup(m, w->dir, name, &a) != 0 || meta_getattr(m, a.ino, &a) != 0)
			w->errors++;
		snprintf(name, sizeof(name), "f%d", i / 2);
		if (meta_lookup(m, w->dir, name, &a) != 0)
			w->errors++;
		if (i % 10 == 0 && meta_lookup(m, META_ROOT_INO, "d0", &a) != 0)
			w->errors++;
	}
	return NULL;
}

Test(meta, four_threads)
{
	struct worker w[4];
	pthread_t t[4];
	char name[8];
	int i, n;

	for (i = 0; i < 4; i++) {
		snprintf(name, sizeof(name), "d%d", i);
		w[i] = (struct worker){ .dir = mk(META_ROOT_INO, name, S_IFDIR | 0755) };
	}
	for (i = 0; i < 4; i++)
		cr_assert_eq(pthread_create(&t[i], NULL, work, &w[i]), 0);
	for (i = 0; i < 4; i++) {
		pthread_join(t[i], NULL);
		cr_assert_eq(w[i].errors, 0, "thread %d: %d errors", i, w[i].errors);
		n = 0;
		cr_assert_eq(meta_readdir(m, w[i].dir, 0, 0, count_cb, &n), 0);
		cr_assert_eq(n, 150);
	}
	/* Threads that exit hand their connections back; later ones get new ones. */
	for (i = 0; i < 4; i++)
		cr_assert_eq(pthread_create(&t[i], NULL, work, &w[i]), 0);
	for (i = 0; i < 4; i++)
		pthread_join(t[i], NULL);
	for (i = 0; i < 4; i++)
		cr_assert_eq(w[i].errors, 150, "second round: every create is EEXIST");
}

static void *hold_lock(void *p)
{
	usleep(300 * 1000);
	raw_txn_commit(p);
	return NULL;
}

Test(meta, waits_for_another_writer)
{
	/* Another process (the reconciler) holds the write lock for a while. */
	struct raw_txn h;
	pthread_t t;

	raw_txn_begin(&h);
	cr_assert_eq(pthread_create(&t, NULL, hold_lock, &h), 0);
	mk(META_ROOT_INO, "after", S_IFREG | 0644);
	pthread_join(t, NULL);
	cr_assert_eq(meta_lookup(m, META_ROOT_INO, "after", NULL), 0);
}

/* ---- damage ------------------------------------------------------------------------ */

Test(meta, damaged_rows)
{
	struct meta_slice *s;
	struct meta_attr a;
	size_t n;
	char *t;
	int cnt = 0;
	uint64_t f = mk(META_ROOT_INO, "f", S_IFREG | 0644);
	uint64_t d = mk(META_ROOT_INO, "d", S_IFDIR | 0755);
	uint64_t l = mk(META_ROOT_INO, "l", S_IFLNK | 0777);
	uint64_t g = mk(d, "g", S_IFREG | 0644);
	char sql[256];

	commit1(f, 0, 81, 0, 100, 100);

	snprintf(sql, sizeof(sql), "UPDATE inode SET mode = 0644 WHERE ino = %llu",
		 (unsigned long long)f);
	raw_sql(sql);
	cr_assert_eq(meta_getattr(m, f, &a), -EIO);
	cr_assert_eq(meta_lookup(m, META_ROOT_INO, "f", &a), -EIO);
	cr_assert_eq(meta_unlink(m, META_ROOT_INO, "f", &a), -EIO);
	/* A value of the wrong type where the engine lets one in (SQLite). */
	snprintf(sql, sizeof(sql), "UPDATE inode SET mode = %s WHERE ino = %llu",
		 BY_ENGINE("'garbage'", "-1"), (unsigned long long)f);
	raw_sql(sql);
	cr_assert_eq(meta_getattr(m, f, &a), -EIO);
	snprintf(sql, sizeof(sql),
		 "UPDATE inode SET mode = 33188, size = -5 WHERE ino = %llu",
		 (unsigned long long)f);
	raw_sql(sql);
	cr_assert_eq(meta_getattr(m, f, &a), -EIO);
	snprintf(sql, sizeof(sql),
		 "UPDATE inode SET size = 100, mtime_nsec = 1000000000 WHERE ino = %llu",
		 (unsigned long long)f);
	raw_sql(sql);
	cr_assert_eq(meta_getattr(m, f, &a), -EIO);
	snprintf(sql, sizeof(sql),
		 "UPDATE inode SET mtime_nsec = 0, uid = 4294967296 WHERE ino = %llu",
		 (unsigned long long)f);
	raw_sql(sql);
	cr_assert_eq(meta_getattr(m, f, &a), -EIO);
	snprintf(sql, sizeof(sql), "UPDATE inode SET uid = 0 WHERE ino = %llu",
		 (unsigned long long)f);
	raw_sql(sql);
	cr_assert_eq(meta_getattr(m, f, &a), 0);

	/* Slices. */
	raw_sql("UPDATE slice SET len = 200 WHERE id = 81"); /* past its size */
	cr_assert_eq(meta_chunk_slices(m, f, 0, &s, &n), -EIO);
	cr_assert_null(s);
	raw_sql("UPDATE slice SET len = 100, pos = 67108860 WHERE id = 81");
	cr_assert_eq(meta_chunk_slices(m, f, 0, &s, &n), -EIO);
	raw_sql(BY_ENGINE("UPDATE slice SET pos = 0, id = X'00' WHERE id = 81",
			  "UPDATE slice SET pos = 0, id = -1 WHERE id = 81"));
	cr_assert_eq(meta_chunk_slices(m, f, 0, &s, &n), -EIO);

	/* A child's damaged inode spoils its directory's listing. */
	snprintf(sql, sizeof(sql), "UPDATE inode SET nlink = -1 WHERE ino = %llu",
		 (unsigned long long)g);
	raw_sql(sql);
	cr_assert_eq(meta_readdir(m, d, 0, 1, count_cb, &cnt), -EIO);

	/* An entry naming no inode. */
	snprintf(sql, sizeof(sql), "DELETE FROM inode WHERE ino = %llu", (unsigned long long)g);
	raw_sql(sql);
	cr_assert_eq(meta_lookup(m, d, "g", &a), -EIO);
	cr_assert_eq(meta_unlink(m, d, "g", &a), -EIO);
	cr_assert_eq(meta_rename(m, d, "g", META_ROOT_INO, "x", 0, &a), -EIO);

	/* A symlink that lost its target; a name with a NUL in it. */
	snprintf(sql, sizeof(sql), "DELETE FROM symlink WHERE ino = %llu", (unsigned long long)l);
	raw_sql(sql);
	cr_assert_eq(meta_readlink(m, l, &t), -EIO);
	cr_assert_null(t);
	raw_sql("UPDATE dentry SET name = X'610062' WHERE name = X'64'");
	cnt = 0;
	cr_assert_eq(meta_readdir(m, META_ROOT_INO, 0, 0, count_cb, &cnt), -EIO);

	/* The counters row. */
	raw_sql(BY_ENGINE("UPDATE counters SET next_ino = 'x'", "UPDATE counters SET next_ino = 0"));
	cr_assert_eq(meta_create(m, META_ROOT_INO, "new", S_IFREG, 0, 0, 0, NULL, &a), -EIO);
	cr_assert_eq(meta_lookup(m, META_ROOT_INO, "new", &a), -ENOENT);
}

/* ---- meta_write_commit_seq ---------------------------------------------- */

Test(meta, write_commit_seq_orders_and_replays)
{
	uint64_t f = mk(META_ROOT_INO, "seqf", S_IFREG | 0644), g = mk(META_ROOT_INO, "seqg", S_IFREG | 0644);
	struct meta_chunk_slice s = { .chunk = 0, .s = { .id = 500, .size = 10, .pos = 0, .len = 10 } };
	struct meta_slice *got = NULL;
	struct timespec mt = { .tv_sec = 1600000000, .tv_nsec = 5 };
	struct meta_attr out;
	size_t n = 0;

	cr_assert_eq(meta_write_commit_seq(m, f, 5, &s, 1, 10, &mt, &out), 0);
	cr_assert(out.size == 10 && out.mtime.tv_sec == 1600000000 && out.mtime.tv_nsec == 5);
	/* The same job again (a replay after a crash): nothing changes. */
	s.s.id = 501;
	cr_assert_eq(meta_write_commit_seq(m, f, 5, &s, 1, 20, NULL, &out), -EALREADY);
	/* An older one: nothing changes either. */
	cr_assert_eq(meta_write_commit_seq(m, f, 4, &s, 1, 20, NULL, &out), -EALREADY);
	cr_assert_eq(attr(f).size, 10);
	cr_assert_eq(meta_chunk_slices(m, f, 0, &got, &n), 0);
	cr_assert(n == 1 && got[0].id == 500);
	free(got);
	/* Sequence numbers are per inode. */
	cr_assert_eq(meta_write_commit_seq(m, g, 1, &s, 1, 10, NULL, NULL), 0);
	/* A newer job commits and becomes the mark. */
	cr_assert_eq(meta_write_commit_seq(m, f, 9, &s, 1, 10, NULL, NULL), 0);
	cr_assert_eq(meta_chunk_slices(m, f, 0, &got, &n), 0);
	/* 501 hides 500 wholly: 500 left the chunk for gc. */
	cr_assert(n == 1 && got[0].id == 501);
	cr_assert_eq(raw_int("SELECT COUNT(*) FROM gc_slice WHERE id = 500"), 1);
	free(got);
	cr_assert_eq(meta_write_commit_seq(m, f, 6, NULL, 0, 0, NULL, NULL), -EALREADY);
	cr_assert_eq(attr(f).size, 10);
	cr_assert_eq(raw_int("SELECT seq FROM commit_seq WHERE ino = (SELECT ino FROM dentry WHERE name = X'73657167')"), 1);
	cr_assert_eq(raw_int("SELECT MAX(seq) FROM commit_seq"), 9);
	/* A failed commit records no seq: the job may be retried. */
	s.s.len = 0;
	cr_assert_eq(meta_write_commit_seq(m, f, 10, &s, 1, 10, NULL, NULL), -EINVAL);
	s.s.len = 10;
	cr_assert_eq(meta_write_commit_seq(m, 999999, 10, &s, 1, 10, NULL, NULL), -ENOENT);
	cr_assert_eq(meta_write_commit_seq(m, f, 0, &s, 1, 10, NULL, NULL), -EINVAL);
	cr_assert_eq(meta_write_commit_seq(m, f, (uint64_t)INT64_MAX + 1, &s, 1, 10, NULL, NULL),
		     -EINVAL);
	cr_assert_eq(meta_write_commit_seq(m, f, 10, &s, 1, 10, NULL, NULL), 0);
	cr_assert_eq(meta_write_commit_seq(m, META_ROOT_INO, 1, NULL, 0, 0, NULL, NULL), -EISDIR);
}

Test(meta, seq_floor_only_raises)
{
	struct meta_chunk_slice s = { .chunk = 0, .s = { .id = 1, .size = 1, .pos = 0, .len = 1 } };
	struct meta_attr a;

	cr_assert_eq(meta_create(m, META_ROOT_INO, "f", S_IFREG | 0644, 0, 0, 0, NULL, &a), 0);
	cr_assert_eq(meta_seq_floor(m, a.ino, 10), 0);
	cr_assert_eq(meta_write_commit_seq(m, a.ino, 10, &s, 1, 1, NULL, NULL), -EALREADY);
	/* A lower floor leaves the higher one. */
	cr_assert_eq(meta_seq_floor(m, a.ino, 3), 0);
	cr_assert_eq(meta_write_commit_seq(m, a.ino, 7, &s, 1, 1, NULL, NULL), -EALREADY);
	cr_assert_eq(meta_write_commit_seq(m, a.ino, 11, &s, 1, 1, NULL, NULL), 0);
	cr_assert_eq(meta_seq_floor(m, a.ino, 11), 0);
	cr_assert_eq(meta_write_commit_seq(m, a.ino, 11, &s, 1, 1, NULL, NULL), -EALREADY);
}

#ifndef META_TEST_PG /* SQLite files of before the table; PostgreSQL volumes start at version 1 whole */
Test(meta_open, commit_seq_table_added_to_older_volumes)
{
	struct meta_chunk_slice s = { .chunk = 0, .s = { .id = 1, .size = 1, .pos = 0, .len = 1 } };
	struct meta_attr a;

	format_volume();
	/* A volume formatted before the table existed. */
	raw_sql("DROP TABLE IF EXISTS commit_seq");
	cr_assert_eq(meta_open(db, &m), 0);
	cr_assert_eq(meta_create(m, META_ROOT_INO, "f", S_IFREG | 0644, 0, 0, 0, NULL, &a), 0);
	cr_assert_eq(meta_write_commit_seq(m, a.ino, 3, &s, 1, 1, NULL, NULL), 0);
	cr_assert_eq(meta_write_commit_seq(m, a.ino, 3, &s, 1, 1, NULL, NULL), -EALREADY);
	cr_assert_eq(raw_int("PRAGMA user_version"), 1);
}
#endif

Test(meta, seq_epochs_increase_across_reopens)
{
	uint64_t e1 = 0, e2 = 0, e3 = 0;

	cr_assert_eq(meta_seq_epoch(m, &e1), 0);
	cr_assert_eq(meta_seq_epoch(m, &e2), 0);
	cr_assert_eq(e2, e1 + 1);
	meta_close(m);
	cr_assert_eq(meta_open(db, &m), 0);
	cr_assert_eq(meta_seq_epoch(m, &e3), 0);
	cr_assert_eq(e3, e2 + 1, "epoch went from %llu to %llu across a reopen",
		     (unsigned long long)e2, (unsigned long long)e3);
}

Test(meta, batched_commits_and_sync)
{
	struct meta_attr a;

	cr_assert_eq(meta_set_batched(m, 1), 0);
	cr_assert_eq(meta_create(m, META_ROOT_INO, "batched", S_IFREG | 0644, 1000, 1000, 0, NULL,
				 &a), 0);
	/* Visible at once to this connection, and to another one as soon as
	 * the batch commits: at once when batched alone, within the journal's
	 * window (5 ms here) when deferred. On PostgreSQL the other connection
	 * cannot hurry that commit (the unit-meta_pg_deferred run of a CI under
	 * load looked before it came). */
	struct meta *other;
	cr_assert_eq(meta_open(db, &other), 0);
	struct meta_attr b;
#ifdef META_TEST_DEFERRED
	for (int i = 0; i < 500 && meta_lookup(other, META_ROOT_INO, "batched", &b) != 0; i++)
		usleep(10 * 1000);
#endif
	cr_assert_eq(meta_lookup(other, META_ROOT_INO, "batched", &b), 0);
	cr_assert_eq(b.ino, a.ino);
	meta_close(other);
	cr_assert_eq(meta_sync(m), 0);
	cr_assert_eq(meta_sync(m), 0);
	meta_close(m);
	cr_assert_eq(meta_open(db, &m), 0);
	cr_assert_eq(meta_lookup(m, META_ROOT_INO, "batched", &b), 0);
	/* Unbatched: meta_sync has nothing to do. */
	cr_assert_eq(meta_sync(m), 0);
}

/* ---- commit batches, busy waits, the checkpointer ------------------------- */

Test(meta, write_commit_batch_items_fail_alone)
{
	uint64_t f = mk(META_ROOT_INO, "bf", S_IFREG | 0644), g = mk(META_ROOT_INO, "bg", S_IFREG | 0644);
	struct meta_chunk_slice s = { .chunk = 0, .s = { .id = 700, .size = 10, .pos = 0, .len = 10 } };
	struct meta_commit_item it[5] = {
		{ .ino = f, .seq = 3, .slices = &s, .n = 1, .new_size = 10 },
		{ .ino = f, .seq = 2, .slices = &s, .n = 1, .new_size = 99 }, /* older: refused */
		{ .ino = 999999, .seq = 1, .slices = &s, .n = 1, .new_size = 10 }, /* no inode */
		{ .ino = META_ROOT_INO, .seq = 1, .new_size = 0 },                 /* a directory */
		{ .ino = g, .seq = 1, .slices = &s, .n = 1, .new_size = 7 },
	};

	cr_assert_eq(meta_write_commit_batch(m, it, 5), 0);
	cr_assert_eq(it[0].rc, 0);
	cr_assert_eq(it[0].out.size, 10);
	cr_assert_eq(it[1].rc, -EALREADY);
	cr_assert_eq(it[2].rc, -ENOENT);
	cr_assert_eq(it[3].rc, -EISDIR);
	cr_assert_eq(it[4].rc, 0);
	cr_assert_eq(attr(f).size, 10);
	cr_assert_eq(attr(g).size, 7);
	cr_assert_eq(raw_int("SELECT COUNT(*) FROM commit_seq"), 2);
	cr_assert_eq(meta_write_commit_batch(m, it, 0), 0);
	cr_assert_eq(meta_write_commit_batch(m, NULL, 1), -EINVAL);
}

/* A write that fails after the statement that checked the name (on
 * PostgreSQL a write nobody reads at once goes into the pipeline, and its
 * failure comes back with a later answer): the change fails whole, and
 * what was acknowledged before it stays. Except in PostgreSQL's batch,
 * where a change is acknowledged once journaled, with its writes
 * unanswered: there the batch fails, the journal holds it while the
 * database refuses it, and it is made once the database takes it. */
Test(meta, a_write_failing_after_the_checks_fails_its_change_whole)
{
	struct meta_attr a;

	cr_assert_eq(meta_create(m, META_ROOT_INO, "before", S_IFREG | 0644, 1, 1, 0, NULL, &a), 0);
	raw_trigger("no_mode", "BEFORE INSERT", "inode", "NEW.mode = 33188");
#if defined(META_TEST_PG) && defined(META_TEST_DEFERRED)
	struct meta_journal_stats js;

	cr_assert_eq(meta_create(m, META_ROOT_INO, "bad", S_IFREG | 0644, 1, 1, 0, NULL, NULL), 0);
	cr_assert_neq(meta_flush(m), 0, "a batch whose write failed committed");
	meta_journal_stats_get(m, &js);
	cr_assert_geq(js.commit_failures, 1);
	cr_assert_eq(js.pending, 1, "the acknowledged change left the journal");
	raw_trigger_drop("no_mode", "inode");
	cr_assert_eq(meta_create(m, META_ROOT_INO, "after", S_IFREG | 0644, 1, 1, 0, NULL, &a), 0);
	cr_assert_eq(meta_flush(m), 0);
	cr_assert_eq(raw_int("SELECT COUNT(*) FROM inode"), 4, "root, before, bad, after");
	cr_assert_eq(meta_lookup(m, META_ROOT_INO, "bad", &a), 0);
	cr_assert_eq(meta_lookup(m, META_ROOT_INO, "before", &a), 0);
	return;
#endif
	cr_assert_neq(meta_create(m, META_ROOT_INO, "bad", S_IFREG | 0644, 1, 1, 0, NULL, NULL), 0);
	raw_trigger_drop("no_mode", "inode");
	cr_assert_eq(meta_lookup(m, META_ROOT_INO, "bad", &a), -ENOENT);
	cr_assert_eq(meta_lookup(m, META_ROOT_INO, "before", &a), 0);
	cr_assert_eq(meta_create(m, META_ROOT_INO, "after", S_IFREG | 0644, 1, 1, 0, NULL, &a), 0);
	cr_assert_eq(meta_flush(m), 0);
	cr_assert_eq(raw_int("SELECT COUNT(*) FROM dentry WHERE name = CAST('bad' AS BLOB)"), 0);
	cr_assert_eq(raw_int("SELECT COUNT(*) FROM inode"), 3, "root, before, after");
	cr_assert_eq(meta_lookup(m, META_ROOT_INO, "after", &a), 0);
}

/* A name that is taken: the change fails with EEXIST and leaves nothing,
 * not even in the rows a deferring batch holds (on PostgreSQL the name's
 * answer comes after the change's other writes were sent). */
Test(meta, a_taken_name_leaves_the_parent_as_it_was)
{
	struct meta_attr d, before, after, a;

	cr_assert_eq(meta_create(m, META_ROOT_INO, "d", S_IFDIR | 0755, 1, 1, 0, NULL, &d), 0);
	cr_assert_eq(meta_create(m, META_ROOT_INO, "f", S_IFREG | 0644, 1, 1, 0, NULL, &a), 0);
	cr_assert_eq(meta_getattr(m, META_ROOT_INO, &before), 0);
	usleep(2000); /* a change would move the parent's times */
	cr_assert_eq(meta_create(m, META_ROOT_INO, "d", S_IFDIR | 0755, 1, 1, 0, NULL, NULL),
		     -EEXIST);
	cr_assert_eq(meta_create(m, META_ROOT_INO, "f", S_IFREG | 0644, 1, 1, 0, NULL, NULL),
		     -EEXIST);
	cr_assert_eq(meta_getattr(m, META_ROOT_INO, &after), 0);
	cr_assert_eq(after.nlink, before.nlink);
	cr_assert_eq(after.mtime.tv_sec, before.mtime.tv_sec);
	cr_assert_eq(after.mtime.tv_nsec, before.mtime.tv_nsec);
	cr_assert_eq(meta_create(m, META_ROOT_INO, "g", S_IFREG | 0644, 1, 1, 0, NULL, &a), 0);
	cr_assert_eq(meta_flush(m), 0);
	cr_assert_eq(raw_int("SELECT COUNT(*) FROM inode"), 4, "root, d, f, g");
	cr_assert_eq(raw_int("SELECT nlink FROM inode WHERE ino = 1"), 3);
}

/* A failure that is not the item's own rolls the whole batch back. */
Test(meta, write_commit_batch_rolls_back_together)
{
	uint64_t f = mk(META_ROOT_INO, "rf", S_IFREG | 0644), g = mk(META_ROOT_INO, "rg", S_IFREG | 0644);
	struct meta_chunk_slice s = { .chunk = 0, .s = { .id = 800, .size = 10, .pos = 0, .len = 10 } };
	struct meta_commit_item it[2] = {
		{ .ino = f, .seq = 1, .slices = &s, .n = 1, .new_size = 10 },
		{ .ino = g, .seq = 1, .slices = &s, .n = 1, .new_size = 10 },
	};

	/* A trigger makes the second item's slice insert fail mid-way. */
	raw_trigger("no_g", "BEFORE UPDATE", "inode",
		    "NEW.ino = (SELECT ino FROM dentry WHERE name = X'7267')");
	cr_assert_neq(meta_write_commit_batch(m, it, 2), 0);
	cr_assert_neq(it[0].rc, 0);
	cr_assert_eq(it[0].rc, it[1].rc);
	cr_assert_eq(attr(f).size, 0, "the first item was rolled back with the second");
	cr_assert_eq(raw_int("SELECT COUNT(*) FROM commit_seq"), 0);
}

/* Another connection (as ferry-reconciler is to ferry-mountd) holds the
 * write lock for a while: a transaction here waits for it, not fails. */
struct holder {
	int ready, go;
	pthread_mutex_t mu;
	pthread_cond_t cv;
};

static void *hold_write_lock(void *arg)
{
	struct holder *h = arg;
	struct raw_txn x;

	raw_txn_begin(&x);
	pthread_mutex_lock(&h->mu);
	h->ready = 1;
	pthread_cond_signal(&h->cv);
	pthread_mutex_unlock(&h->mu);
	usleep(300 * 1000);
	raw_txn_commit(&x);
	return NULL;
}

Test(meta, writer_waits_for_another_connection)
{
	struct holder h = { .mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER };
	pthread_t t;
	struct meta_attr a;

	cr_assert_eq(pthread_create(&t, NULL, hold_write_lock, &h), 0);
	pthread_mutex_lock(&h.mu);
	while (!h.ready)
		pthread_cond_wait(&h.cv, &h.mu);
	pthread_mutex_unlock(&h.mu);
	cr_assert_eq(meta_create(m, META_ROOT_INO, "waited", S_IFREG | 0644, 1, 1, 0, NULL, &a), 0);
	pthread_join(t, NULL);
	cr_assert_eq(meta_lookup(m, META_ROOT_INO, "waited", &a), 0);
}

#ifndef META_TEST_PG /* SQLite's WAL file */
/* Batched mode turns off SQLite's checkpoint-at-commit; the meta's own
 * thread keeps the WAL short, and where it cannot keep up (here: paused,
 * as it is in effect under a storm of commits on two busy cores), commits
 * checkpoint themselves once it holds WAL_FRAMES_MAX (8000) frames. 12,000
 * creates write ~90,000 frames (~370 MiB) if nothing checkpoints. */
Test(meta, wal_stays_bounded_without_the_checkpointer, .timeout = 300)
{
	char name[32], wal[700];
	struct meta_attr a;
	struct stat st;
	off_t biggest = 0;

	cr_assert_eq(meta_set_batched(m, 1), 0);
	meta_ckpt_pause(m, 1);
	snprintf(wal, sizeof(wal), "%s-wal", db);
	for (int i = 0; i < 12000; i++) {
		snprintf(name, sizeof(name), "c%d", i);
		cr_assert_eq(meta_create(m, META_ROOT_INO, name, S_IFREG | 0644, 1, 1, 0, NULL, &a), 0);
		if (i % 500 == 0 && stat(wal, &st) == 0 && st.st_size > biggest)
			biggest = st.st_size;
	}
	cr_assert_eq(stat(wal, &st), 0);
	if (st.st_size > biggest)
		biggest = st.st_size;
	/* 8000 frames of 4 KiB pages (+24 bytes each), plus a transaction. */
	cr_assert_lt(biggest, 36 << 20, "WAL reached %lld bytes", (long long)biggest);
#ifndef META_TEST_DEFERRED /* batches write far fewer frames: no bound is reached */
	cr_assert_gt(meta_ckpt_inline(m), 0, "no commit checkpointed: the bound was not needed?");
#endif
	/* Everything is still there, and meta_close() stops the thread. */
	meta_close(m);
	cr_assert_eq(meta_open(db, &m), 0);
	cr_assert_eq(meta_lookup(m, META_ROOT_INO, "c11999", &a), 0);
}
#endif

/* Data that later writes hide wholly leaves its chunk at commit and waits
 * as garbage; partly hidden data stays; meta_gc_list() hands garbage out
 * only once it is old enough, and meta_gc_forget() drops it. */
Test(meta, overwritten_slices_become_garbage)
{
	uint64_t f = mk(META_ROOT_INO, "gcf", S_IFREG | 0644);
	struct meta_chunk_slice a = { .chunk = 0, .s = { .id = 700, .size = 100, .pos = 0, .len = 100 } };
	struct meta_chunk_slice b = { .chunk = 0, .s = { .id = 701, .size = 100, .pos = 0, .len = 100 } };
	struct meta_chunk_slice c = { .chunk = 0, .s = { .id = 702, .size = 10, .pos = 10, .len = 10 } };
	struct meta_chunk_slice d = { .chunk = 0, .s = { .id = 703, .size = 60, .pos = 40, .len = 60 } };
	struct meta_gc_item *items = NULL;
	struct meta_slice *got = NULL;
	uint64_t slices, bytes;
	int64_t mark = -1;
	size_t n = 0;

	cr_assert_eq(meta_write_commit(m, f, &a, 1, 100, NULL, NULL), 0);
	cr_assert_eq(meta_write_commit(m, f, &b, 1, 100, NULL, NULL), 0);
	cr_assert_eq(meta_write_commit(m, f, &c, 1, 100, NULL, NULL), 0);
	cr_assert_eq(meta_write_commit(m, f, &d, 1, 100, NULL, NULL), 0);
	/* 700 is hidden by 701; 701 shows at 0..10, 20..40; 702 and 703 show. */
	cr_assert_eq(meta_chunk_slices(m, f, 0, &got, &n), 0);
	cr_assert_eq(n, 3);
	cr_assert(got[0].id == 701 && got[1].id == 702 && got[2].id == 703);
	free(got);
	cr_assert_eq(meta_gc_pending(m, &slices, &bytes), 0);
	cr_assert(slices == 1 && bytes == 100, "%llu slices, %llu bytes", (unsigned long long)slices,
		  (unsigned long long)bytes);
	/* Not handed out before a collector saw it (marked it)... */
	cr_assert_eq(meta_gc_last_mark(m, &mark), 0);
	cr_assert_eq(mark, 0);
	cr_assert_eq(meta_gc_list(m, INT64_MAX, (int64_t)time(NULL) + 1, 16, &items, &n), 0);
	cr_assert_eq(n, 0);
	free(items);
	cr_assert_eq(meta_gc_mark(m, 5), 0);
	cr_assert_eq(meta_gc_last_mark(m, &mark), 0);
	cr_assert_eq(mark, 5);
	/* ...nor for a mark made before it was seen... */
	cr_assert_eq(meta_gc_list(m, 4, (int64_t)time(NULL) + 1, 16, &items, &n), 0);
	cr_assert_eq(n, 0);
	free(items);
	/* ...nor while its own stamp says it is younger than asked... */
	cr_assert_eq(meta_gc_list(m, 5, (int64_t)time(NULL) - 60, 16, &items, &n), 0);
	cr_assert_eq(n, 0);
	free(items);
	/* ...and there once both say so. */
	cr_assert_eq(meta_gc_list(m, 5, (int64_t)time(NULL) + 1, 16, &items, &n), 0);
	cr_assert(n == 1 && items[0].id == 700 && items[0].size == 100);
	cr_assert_eq(meta_gc_forget(m, items, n), 0);
	free(items);
	cr_assert_eq(meta_gc_pending(m, &slices, &bytes), 0);
	cr_assert_eq(slices, 0);
	/* Truncating to 0 makes the rest garbage too. */
	cr_assert_eq(meta_setattr(m, f, META_SET_SIZE, &(struct meta_attr){ .size = 0 }, NULL), 0);
	cr_assert_eq(meta_gc_pending(m, &slices, &bytes), 0);
	cr_assert_eq(slices, 3);
	/* What the file reads is unchanged by any of it. */
	cr_assert_eq(attr(f).size, 0);
}

/* A truncation stamps "now", but never before the file's mtime (the wall
 * clock may have stepped back since it was set); a time asked for is set as
 * asked. */
Test(meta, truncation_never_moves_mtime_back)
{
	uint64_t f = mk(META_ROOT_INO, "mtf", S_IFREG | 0644);
	struct meta_attr in = { .mtime = { .tv_sec = (time_t)time(NULL) + 86400, .tv_nsec = 7 } };
	struct meta_attr out;

	cr_assert_eq(meta_setattr(m, f, META_SET_MTIME, &in, &out), 0);
	in.size = 0;
	cr_assert_eq(meta_setattr(m, f, META_SET_SIZE | META_SET_MTIME_NOW, &in, &out), 0);
	cr_assert(out.mtime.tv_sec == in.mtime.tv_sec && out.mtime.tv_nsec == 7,
		  "a truncation moved mtime from %lld back to %lld", (long long)in.mtime.tv_sec,
		  (long long)out.mtime.tv_sec);
	cr_assert_eq(meta_setattr(m, f, META_SET_MTIME_NOW, &in, &out), 0);
	cr_assert_lt(out.mtime.tv_sec, in.mtime.tv_sec, "UTIME_NOW is set as asked");
}

#ifndef META_TEST_PG /* SQLite files of before the column */
/* A volume whose gc_slice predates gc_slice.seen gets the column at open;
 * its garbage waits for a mark like any other. */
Test(meta, gc_seen_is_added_to_an_older_volume)
{
	struct meta_gc_item *items = NULL;
	size_t n = 0;

	meta_close(m);
	m = NULL;
	raw_sql("DROP INDEX IF EXISTS gc_slice_seen; DROP TABLE gc_slice;"
		"CREATE TABLE gc_slice(id INTEGER PRIMARY KEY, size INTEGER NOT NULL,"
		" since INTEGER NOT NULL);"
		"CREATE INDEX gc_slice_since ON gc_slice(since);"
		"INSERT INTO gc_slice(id, size, since) VALUES (900, 10, 1)");
	cr_assert_eq(meta_open(db, &m), 0);
	cr_assert_eq(raw_int("SELECT COUNT(*) FROM gc_slice WHERE seen IS NULL"), 1);
	cr_assert_eq(meta_gc_list(m, INT64_MAX, INT64_MAX, 4, &items, &n), 0);
	cr_assert_eq(n, 0);
	free(items);
	cr_assert_eq(meta_gc_mark(m, 1), 0);
	cr_assert_eq(meta_gc_list(m, 1, INT64_MAX, 4, &items, &n), 0);
	cr_assert(n == 1 && items[0].id == 900);
	free(items);
	/* And opening it again finds the column there. */
	meta_close(m);
	cr_assert_eq(meta_open(db, &m), 0);
	cr_assert_eq(raw_int("SELECT seen FROM gc_slice WHERE id = 900"), 1);
}
#endif

/* ---- the metadata journal (meta_journal_open) ------------------------------ */

static void setup_nodefer(void)
{
	setup_dir();
	format_volume();
	cr_assert_eq(meta_open(db, &m), 0);
}

static void journal_path(char *buf, size_t cap)
{
	snprintf(buf, cap, "%s/meta.db" META_JOURNAL_SUFFIX, dir);
}

/* In a forked child that is to die with its batch open: the volume with
 * deferred commits that never flush on their own (exits 2 if it cannot). */
static struct meta *child_journal_open(const char *jp)
{
	struct meta *c = NULL;

	if (meta_open(db, &c) || meta_journal_open(c, jp, 60000, NULL))
		_exit(2);
	return c;
}

/* Closes the test's volume and forks a process that is to die with its
 * batch open: in it (0 returned) *child is the volume opened as
 * child_journal_open() does; the parent gets its pid. */
static pid_t journal_child_fork(const char *jp, struct meta **child)
{
	pid_t pid;

	meta_close(m);
	m = NULL;
	pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0)
		*child = child_journal_open(jp);
	return pid;
}

/* The changes the journal tests make, on mm (returns how many it made). */
static int journal_changes(struct meta *mm)
{
	struct meta_attr a, d, in = { 0 };
	char name[32];
	int n = 0;

	cr_assert_eq(meta_create(mm, META_ROOT_INO, "d", S_IFDIR | 0755, 7, 8, 0, NULL, &d), 0);
	n++;
	for (int i = 0; i < 40; i++) {
		snprintf(name, sizeof(name), "f%d", i);
		cr_assert_eq(meta_create(mm, d.ino, name, S_IFREG | 0640, 7, 8, 0, NULL, &a), 0);
		n++;
	}
	cr_assert_eq(meta_create(mm, d.ino, "ln", S_IFLNK | 0777, 7, 8, 0, "f1", &a), 0);
	cr_assert_eq(meta_create(mm, META_ROOT_INO, "empty", S_IFDIR | 0700, 7, 8, 0, NULL, &a), 0);
	cr_assert_eq(meta_lookup(mm, d.ino, "f3", &a), 0);
	cr_assert_eq(meta_link(mm, a.ino, META_ROOT_INO, "hard", NULL), 0);
	cr_assert_eq(meta_rename(mm, d.ino, "f4", META_ROOT_INO, "moved", 0, NULL), 0);
	cr_assert_eq(meta_rename(mm, d.ino, "f5", d.ino, "f6", 0, NULL), 0); /* replaces f6 */
	cr_assert_eq(meta_unlink(mm, d.ino, "f7", NULL), 0);
	cr_assert_eq(meta_rmdir(mm, META_ROOT_INO, "empty", NULL), 0);
	n += 7;
	/* Refused changes are not journaled and change nothing. */
	cr_assert_eq(meta_create(mm, d.ino, "f8", S_IFREG | 0644, 0, 0, 0, NULL, NULL), -EEXIST);
	cr_assert_eq(meta_rmdir(mm, META_ROOT_INO, "d", NULL), -ENOTEMPTY);
	cr_assert_eq(meta_lookup(mm, d.ino, "f9", &a), 0);
	in.mode = 0600;
	in.uid = 42;
	in.size = 12345;
	in.mtime = (struct timespec){ 1600000000, 123456789 };
	in.atime = (struct timespec){ 1500000000, 1 };
	cr_assert_eq(meta_setattr(mm, a.ino, META_SET_MODE | META_SET_UID | META_SET_SIZE |
						  META_SET_MTIME | META_SET_ATIME,
				  &in, NULL), 0);
	cr_assert_eq(meta_setxattr(mm, a.ino, "user.a", "one", 3, 0), 0);
	cr_assert_eq(meta_setxattr(mm, a.ino, "user.b", "two", 3, META_XATTR_CREATE), 0);
	cr_assert_eq(meta_removexattr(mm, a.ino, "user.a"), 0);
	n += 4;
	return n;
}

struct dump {
	char *buf;
	size_t len;
	FILE *f;
	struct meta *mm;
	int times;
};

static int dump_one(void *arg, const char *name, const struct meta_attr *a, uint64_t cookie);

static void dump_dir(struct dump *d, uint64_t ino)
{
	cr_assert_eq(meta_readdir(d->mm, ino, 0, 1, dump_one, d), 0);
}

static int dump_one(void *arg, const char *name, const struct meta_attr *a, uint64_t cookie)
{
	struct dump *d = arg;
	char *list = NULL, *target = NULL;
	size_t ln = 0;

	fprintf(d->f, "%s ino=%llu mode=%o uid=%u gid=%u nlink=%u size=%llu", name,
		(unsigned long long)a->ino, a->mode, a->uid, a->gid, a->nlink,
		(unsigned long long)a->size);
	if (d->times)
		fprintf(d->f, " m=%lld.%09ld c=%lld.%09ld", (long long)a->mtime.tv_sec,
			a->mtime.tv_nsec, (long long)a->ctime.tv_sec, a->ctime.tv_nsec);
	if (S_ISLNK(a->mode) && meta_readlink(d->mm, a->ino, &target) == 0)
		fprintf(d->f, " -> %s", target);
	if (meta_listxattr(d->mm, a->ino, &list, &ln) == 0 && ln)
		fprintf(d->f, " xattrs=%.*s", (int)ln, list);
	fprintf(d->f, "\n");
	free(list);
	free(target);
	(void)cookie;
	if (S_ISDIR(a->mode))
		dump_dir(d, a->ino);
	return 0;
}

/* The whole tree as text (times when asked). The caller frees it. */
static char *dump_tree(struct meta *mm, int times)
{
	struct dump d = { .mm = mm, .times = times };

	d.f = open_memstream(&d.buf, &d.len);
	cr_assert_not_null(d.f);
	dump_dir(&d, META_ROOT_INO);
	fclose(d.f);
	return d.buf;
}

/* A process that journals changes and is killed before its batch commits
 * loses none of them: the next open replays each, with the times it made
 * them, and the tree is what the same changes make on a volume that
 * commits each at once. */
Test(meta_journal, replay_after_kill_makes_the_same_tree, .init = setup_nodefer,
     .fini = teardown)
{
	char jp[160], *want, *got, *got_times;
	uint64_t replayed = 0;
	struct meta_journal_stats js;
	int status, n;
	pid_t pid;

	journal_path(jp, sizeof(jp));
	struct meta *c = NULL;
	pid = journal_child_fork(jp, &c);
	if (pid == 0) {
		n = journal_changes(c);
		/* The tree as the dying process saw it, times included. */
		char *seen = dump_tree(c, 1);
		char sp[200];
		snprintf(sp, sizeof(sp), "%s/seen", dir);
		FILE *f = fopen(sp, "w");
		if (f == NULL || fputs(seen, f) < 0 || fclose(f) != 0)
			_exit(3);
		snprintf(sp, sizeof(sp), "%s/count", dir);
		f = fopen(sp, "w");
		if (f == NULL || fprintf(f, "%d", n) < 0 || fclose(f) != 0)
			_exit(3);
		kill(getpid(), SIGKILL);
		_exit(4);
	}
	cr_assert_eq(waitpid(pid, &status, 0), pid);
	cr_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL, "child status %d", status);
	/* Nothing of it was committed... */
	cr_assert_eq(raw_int("SELECT COUNT(*) FROM dentry WHERE name = CAST('d' AS BLOB)"), 0);
	/* ...and all of it comes back. */
	cr_assert_eq(meta_open(db, &m), 0);
	cr_assert_eq(meta_journal_open(m, jp, 5, &replayed), 0);
	char sp[200], seen[1 << 14] = "";
	int count = 0;
	snprintf(sp, sizeof(sp), "%s/count", dir);
	FILE *f = fopen(sp, "r");
	cr_assert_not_null(f);
	cr_assert_eq(fscanf(f, "%d", &count), 1);
	fclose(f);
	cr_assert_eq(replayed, (uint64_t)count);
	meta_journal_stats_get(m, &js);
	cr_assert_eq(js.replay_errors, 0);
	cr_assert_eq(js.pending, 0, "the replay is committed before open returns");
	snprintf(sp, sizeof(sp), "%s/seen", dir);
	f = fopen(sp, "r");
	cr_assert_not_null(f);
	size_t sl = fread(seen, 1, sizeof(seen) - 1, f);
	seen[sl] = '\0';
	fclose(f);
	got_times = dump_tree(m, 1);
	cr_assert_str_eq(got_times, seen, "replayed tree differs from what the process saw");
	cr_assert_gt(raw_int("SELECT COUNT(*) FROM dentry WHERE name = CAST('d' AS BLOB)"), 0);

	/* The oracle: the same changes, each committed at once. */
	got = dump_tree(m, 0);
	meta_close(m);
	m = NULL;
	raw_volume_drop();
	rm_dir(dir);
	setup_nodefer();
	journal_changes(m);
	want = dump_tree(m, 0);
	cr_assert_str_eq(got, want);
	free(want);
	free(got);
	free(got_times);
}

/* A batch holds the rows of the directories it changed and writes them
 * when it commits: until then every read through the daemon's meta sees
 * them (getattr, lookup, readdirplus), a directory removed and released in
 * the batch is not written back, more directories than it holds are
 * written as they go, and after the commit another connection reads the
 * same tree. */
Test(meta_journal, directory_rows_held_by_the_batch_are_the_ones_committed,
     .init = setup_nodefer, .fini = teardown)
{
	struct meta_attr root0, d, a, g, l, sub;
	char jp[160], name[32], *live, *after, *other;
	struct meta_journal_stats js;
	struct meta *o = NULL;
	uint64_t last = 0;

	journal_path(jp, sizeof(jp));
	cr_assert_eq(meta_journal_open(m, jp, 60000, NULL), 0); /* commits only when asked */
	cr_assert_eq(meta_getattr(m, META_ROOT_INO, &root0), 0);
	for (int i = 0; i < 40; i++) { /* more directories than a batch holds */
		snprintf(name, sizeof(name), "d%d", i);
		cr_assert_eq(meta_create(m, META_ROOT_INO, name, S_IFDIR | 0755, 1, 2, 0, NULL, &d),
			     0);
		for (int k = 0; k < 3; k++) {
			snprintf(name, sizeof(name), "f%d", k);
			cr_assert_eq(meta_create(m, d.ino, name, S_IFREG | 0644, 1, 2, 0, NULL, &a),
				     0);
		}
		cr_assert_eq(meta_create(m, d.ino, "sub", S_IFDIR | 0700, 1, 2, 0, NULL, &sub), 0);
		cr_assert_eq(meta_create(m, sub.ino, "x", S_IFREG | 0600, 1, 2, 0, NULL, &a), 0);
		cr_assert_gt(a.ino, last);
		last = a.ino;
		if (i % 2) { /* sub emptied, removed and released in the same batch */
			cr_assert_eq(meta_unlink(m, sub.ino, "x", NULL), 0);
			cr_assert_eq(meta_inode_release(m, a.ino), 0);
			cr_assert_eq(meta_rmdir(m, d.ino, "sub", NULL), 0);
			cr_assert_eq(meta_inode_release(m, sub.ino), 0);
		}
		cr_assert_eq(meta_getattr(m, d.ino, &g), 0);
		cr_assert_eq(g.nlink, i % 2 ? 2u : 3u, "d%d nlink %u", i, g.nlink);
		cr_assert(g.mtime.tv_sec > d.mtime.tv_sec ||
			  (g.mtime.tv_sec == d.mtime.tv_sec && g.mtime.tv_nsec >= d.mtime.tv_nsec));
		snprintf(name, sizeof(name), "d%d", i);
		cr_assert_eq(meta_lookup(m, META_ROOT_INO, name, &l), 0);
		cr_assert_eq(memcmp(&l, &g, sizeof(l)), 0, "lookup and getattr of d%d differ", i);
	}
	cr_assert_eq(meta_getattr(m, META_ROOT_INO, &g), 0);
	cr_assert_eq(g.nlink, root0.nlink + 40);
	meta_journal_stats_get(m, &js);
	cr_assert_gt(js.pending, 200, "nothing is committed yet");
	live = dump_tree(m, 1);
	cr_assert_eq(meta_flush(m), 0);
	after = dump_tree(m, 1);
	cr_assert_str_eq(after, live, "the committed tree differs from the batch's");
	cr_assert_eq(meta_open(db, &o), 0);
	other = dump_tree(o, 1);
	cr_assert_str_eq(other, live, "another connection reads another tree");
	cr_assert_eq(raw_int("SELECT nlink FROM inode WHERE ino = 1"), (int64_t)root0.nlink + 40);
	/* The batch's inode counter went to the database with it: the next
	 * create, on another connection, takes the next number. */
	cr_assert_eq(meta_create(o, META_ROOT_INO, "next", S_IFREG | 0644, 1, 2, 0, NULL, &g), 0);
	cr_assert_eq(g.ino, last + 1, "ino %llu after %llu", (unsigned long long)g.ino,
		     (unsigned long long)last);
	meta_close(o);
	free(live);
	free(after);
	free(other);
}

/* An unlinked inode handed to meta_inode_release_later() is freed by the
 * next commit, with nothing journaled for it; a linked one is left alone;
 * one queued in a process that dies before that commit stays an orphan
 * that the purge at the next start frees. */
Test(meta_journal, a_release_later_frees_in_the_next_commit, .init = setup_nodefer,
     .fini = teardown)
{
	struct meta_attr a, b, g, v;
	struct meta_journal_stats js0, js;
	uint64_t purged = 0;
	char jp[160];
	int status;
	pid_t pid;

	journal_path(jp, sizeof(jp));
	cr_assert_eq(meta_journal_open(m, jp, 60000, NULL), 0); /* commits only when asked */
	cr_assert_eq(meta_create(m, META_ROOT_INO, "a", S_IFREG | 0644, 1, 2, 0, NULL, &a), 0);
	cr_assert_eq(meta_create(m, META_ROOT_INO, "b", S_IFREG | 0644, 1, 2, 0, NULL, &b), 0);
	cr_assert_eq(meta_flush(m), 0);
	meta_journal_stats_get(m, &js0);
	cr_assert_eq(meta_unlink(m, META_ROOT_INO, "a", &v), 0);
	cr_assert_eq(v.nlink, 0u);
	cr_assert_eq(meta_inode_release_later(m, a.ino), 0);
	cr_assert_eq(meta_inode_release_later(m, b.ino), 0); /* still linked */
	cr_assert_eq(meta_releases_pending(m), 2);
	meta_journal_stats_get(m, &js);
	cr_assert_eq(js.records, js0.records + 1, "only the unlink is journaled");
	/* Until the commit the inode lives on, as an orphan. */
	cr_assert_eq(meta_getattr(m, a.ino, &g), 0);
	cr_assert_eq(g.nlink, 0u);
	cr_assert_eq(meta_flush(m), 0);
	cr_assert_eq(meta_releases_pending(m), 0);
	cr_assert_eq(meta_getattr(m, a.ino, &g), -ENOENT);
	cr_assert_eq(meta_getattr(m, b.ino, &g), 0, "a linked inode is not freed");
	cr_assert_eq(g.nlink, 1u);
	cr_assert_eq(raw_int("SELECT COUNT(*) FROM orphan"), 0);
	meta_journal_stats_get(m, &js);
	cr_assert_eq(js.released, js0.released + 2);
	cr_assert_eq(js.release_failures, 0);

	/* The flusher frees queued inodes on its own when no batch is open. */
	meta_close(m);
	m = NULL;
	cr_assert_eq(meta_open(db, &m), 0);
	cr_assert_eq(meta_journal_open(m, jp, 5, NULL), 0);
	cr_assert_eq(meta_unlink(m, META_ROOT_INO, "b", NULL), 0);
	cr_assert_eq(meta_flush(m), 0);
	cr_assert_eq(meta_inode_release_later(m, b.ino), 0);
	/* Bounded, not timed: a loaded machine may take its time. */
	for (int i = 0; i < 2000 && meta_getattr(m, b.ino, &g) == 0; i++)
		usleep(5000);
	cr_assert_eq(meta_getattr(m, b.ino, &g), -ENOENT, "no batch freed the queued inode");

	/* Queued by a process killed before its batch committed. */
	cr_assert_eq(meta_create(m, META_ROOT_INO, "c", S_IFREG | 0644, 1, 2, 0, NULL, &a), 0);
	struct meta *c = NULL;
	pid = journal_child_fork(jp, &c);
	if (pid == 0) {
		if (meta_unlink(c, META_ROOT_INO, "c", NULL) || meta_inode_release_later(c, a.ino))
			_exit(3);
		kill(getpid(), SIGKILL);
		_exit(4);
	}
	cr_assert_eq(waitpid(pid, &status, 0), pid);
	cr_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL, "child status %d", status);
	cr_assert_eq(meta_open(db, &m), 0);
	cr_assert_eq(meta_journal_open(m, jp, 5, NULL), 0); /* replays the unlink */
	cr_assert_eq(meta_lookup(m, META_ROOT_INO, "c", &g), -ENOENT);
	cr_assert_eq(raw_int("SELECT COUNT(*) FROM orphan"), 1);
	cr_assert_eq(meta_orphans_purge(m, &purged), 0);
	cr_assert_eq(purged, 1);
	cr_assert_eq(meta_getattr(m, a.ino, &g), -ENOENT);
}

/* A torn or damaged tail (a power loss mid-append) ends the journal: the
 * records before it replay, and later records go after them. */
Test(meta_journal, damaged_tail_ends_the_journal, .init = setup_nodefer, .fini = teardown)
{
	char jp[160], name[16];
	uint64_t replayed = 0;
	struct meta_attr a;
	int status;
	pid_t pid;

	journal_path(jp, sizeof(jp));
	meta_close(m);
	m = NULL;
	for (int round = 0; round < 2; round++) {
		pid = fork();
		cr_assert_geq(pid, 0);
		if (pid == 0) {
			struct meta *c = child_journal_open(jp);
			for (int i = 0; i < 10; i++) {
				snprintf(name, sizeof(name), "r%d-%d", round, i);
				if (meta_create(c, META_ROOT_INO, name, S_IFREG | 0644, 0, 0, 0, NULL,
						NULL))
					_exit(3);
			}
			kill(getpid(), SIGKILL);
			_exit(4);
		}
		cr_assert_eq(waitpid(pid, &status, 0), pid);
		cr_assert(WIFSIGNALED(status), "child status %d", status);
		/* A torn record, then bytes that are no record at all. */
		FILE *f = fopen(jp, "a");
		cr_assert_not_null(f);
		fwrite("FJr1\x40\x00\x00\x00garbage", 1, 15, f);
		fwrite("\xff\xfe junk junk junk", 1, 17, f);
		fclose(f);
		cr_assert_eq(meta_open(db, &m), 0);
		cr_assert_eq(meta_journal_open(m, jp, 5, &replayed), 0);
		cr_assert_eq(replayed, 10, "round %d: replayed %llu", round,
			     (unsigned long long)replayed);
		for (int r = 0; r <= round; r++)
			for (int i = 0; i < 10; i++) {
				snprintf(name, sizeof(name), "r%d-%d", r, i);
				cr_assert_eq(meta_lookup(m, META_ROOT_INO, name, &a), 0, "%s", name);
			}
		meta_close(m);
		m = NULL;
	}
	cr_assert_eq(meta_open(db, &m), 0);
}

/* One journal per volume: a second opener is told so. */
Test(meta_journal, second_opener_is_refused, .init = setup_nodefer, .fini = teardown)
{
	char jp[160];
	struct meta *other = NULL;

	journal_path(jp, sizeof(jp));
	cr_assert_eq(meta_journal_open(m, jp, 5, NULL), 0);
	cr_assert_eq(meta_open(db, &other), 0);
	cr_assert_eq(meta_journal_open(other, jp, 5, NULL), -EBUSY);
	meta_close(other);
}

struct other_writer {
	int creates, failures;
	_Atomic int done;
};

static void *other_writer_main(void *p)
{
	struct other_writer *w = p;
	struct meta *o = NULL;
	char name[32];

	/* A handle without a journal: each create is a transaction. */
	cr_assert_eq(meta_open(db, &o), 0);
	for (int i = 0; i < w->creates; i++) {
		snprintf(name, sizeof(name), "o%d", i);
		if (meta_create(o, META_ROOT_INO, name, S_IFREG | 0644, 0, 0, 0, NULL, NULL) != 0)
			w->failures++;
	}
	meta_close(o);
	atomic_store(&w->done, 1);
	return NULL;
}

/* Batches opened back to back never starve another writer of the database
 * (another process's, here another connection's): each of its
 * transactions gets in between two batches. */
Test(meta_journal, batches_do_not_starve_other_writers, .init = setup_nodefer,
     .fini = teardown, .timeout = 120)
{
	struct other_writer w = { .creates = 200 };
	char jp[160], name[32];
	pthread_t t;
	int i = 0;

	journal_path(jp, sizeof(jp));
	cr_assert_eq(meta_journal_open(m, jp, 20, NULL), 0);
	cr_assert_eq(pthread_create(&t, NULL, other_writer_main, &w), 0);
	while (!atomic_load(&w.done)) {
		snprintf(name, sizeof(name), "s%d", i++);
		cr_assert_eq(meta_create(m, META_ROOT_INO, name, S_IFREG | 0644, 0, 0, 0, NULL, NULL),
			     0);
	}
	pthread_join(t, NULL);
	cr_assert_eq(w.failures, 0);
	cr_log_info("%d creates while the other writer made %d transactions", i, w.creates);
}

#ifndef META_TEST_PG
/* An open batch nobody adds to lets another writer in within the flusher's
 * look for one (a few ms), not when flush_ms ends: a burst's last close
 * must not wait that long for the reconciler's commit. The window here is
 * 600 s, so without the look the writer would never get in in time.
 * SQLite only: PostgreSQL has no intent lock, and every writer there
 * waits for the whole batch (its advisory lock), until flush_ms ends. */
Test(meta_journal, an_idle_batch_lets_another_writer_in, .init = setup_nodefer,
     .fini = teardown, .timeout = 60)
{
	struct other_writer w = { .creates = 3 };
	struct timespec t0, t1;
	char jp[160];
	pthread_t t;
	double s;

	journal_path(jp, sizeof(jp));
	cr_assert_eq(meta_journal_open(m, jp, 600000, NULL), 0);
	cr_assert_eq(meta_create(m, META_ROOT_INO, "idle", S_IFREG | 0644, 0, 0, 0, NULL, NULL), 0);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	cr_assert_eq(pthread_create(&t, NULL, other_writer_main, &w), 0);
	pthread_join(t, NULL);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
	cr_assert_eq(w.failures, 0);
	cr_assert_lt(s, 30.0, "3 creates of another writer took %.1f s behind an idle batch", s);
	cr_log_info("3 creates of another writer behind an idle batch: %.1f ms", s * 1000);
}

/* meta_open skips the schema additions' writes when nothing is missing
 * (they would wait for another process's open batch); anything missing is
 * still made: a table, a seeded row, slices freed the old way. */
Test(meta, open_makes_what_the_schema_lacks)
{
	raw_sql("DROP TABLE slice_range");
	raw_sql("DROP INDEX checkpoint_slice_id");
	raw_sql("DELETE FROM journal");
	raw_sql("INSERT INTO delslice(id, size) VALUES (4242, 10)");
	meta_close(m);
	cr_assert_eq(meta_open(db, &m), 0);
	cr_assert_eq(raw_int("SELECT COUNT(*) FROM sqlite_master WHERE name = 'slice_range'"), 1);
	cr_assert_eq(raw_int("SELECT COUNT(*) FROM sqlite_master WHERE name = 'checkpoint_slice_id'"),
		     1);
	cr_assert_eq(raw_int("SELECT COUNT(*) FROM journal"), 1);
	cr_assert_eq(raw_int("SELECT COUNT(*) FROM delslice"), 0);
	cr_assert_eq(raw_int("SELECT COUNT(*) FROM gc_slice WHERE id = 4242"), 1);
}
#endif

/* A data commit that names a journal seq waits until the database holds
 * the journal that far: refused with -EINPROGRESS while the journal's
 * writer is dead with them uncommitted, committed once it replayed them. */
Test(meta_journal, commit_waits_for_the_journal_seq, .init = setup_nodefer, .fini = teardown)
{
	struct meta_chunk_slice s = { .chunk = 0, .s = { .id = 9, .size = 10, .len = 10 } };
	char jp[160];
	int status, fds[2];
	uint64_t vals[2];
	pid_t pid;

	journal_path(jp, sizeof(jp));
	cr_assert_eq(pipe(fds), 0);
	pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		struct meta *c = child_journal_open(jp);
		struct meta_attr a;

		if (meta_create(c, META_ROOT_INO, "late", S_IFREG | 0644, 0, 0, 0, NULL, &a))
			_exit(2);
		vals[0] = a.ino;
		vals[1] = meta_journal_last(c);
		if (write(fds[1], vals, sizeof(vals)) != sizeof(vals))
			_exit(3);
		kill(getpid(), SIGKILL);
		_exit(4);
	}
	close(fds[1]);
	cr_assert_eq(read(fds[0], vals, sizeof(vals)), (ssize_t)sizeof(vals));
	close(fds[0]);
	cr_assert_eq(waitpid(pid, &status, 0), pid);
	cr_assert_gt(vals[1], 0);

	struct meta_commit_item it = { .ino = vals[0], .seq = 1, .slices = &s, .n = 1,
				       .new_size = 10, .meta_seq = vals[1] };
	cr_assert_eq(meta_write_commit_batch(m, &it, 1), 0);
	cr_assert_eq(it.rc, -EINPROGRESS);
	/* The journal's owner comes back: its replay makes the file. */
	struct meta *o = NULL;
	cr_assert_eq(meta_open(db, &o), 0);
	cr_assert_eq(meta_journal_open(o, jp, 5, NULL), 0);
	it.rc = 1;
	cr_assert_eq(meta_write_commit_batch(m, &it, 1), 0);
	cr_assert_eq(it.rc, 0);
	cr_assert_eq(attr(vals[0]).size, 10);
	meta_close(o);
}

/* ---- failures inside a batch (injected with triggers, or SQLite memory) --- */

/* inode_free() drops the held row (hot_forget) before DELETE FROM inode; when
 * that DELETE fails it has changed no row, so batch_run() does not lose the
 * batch, and the held copy (nlink 0) is gone: the row reads as before the
 * rmdir, a create inside the removed directory is accepted, and a later
 * replay of the journal (here after another change fails part way) refuses
 * that create, so every later create gets another inode number (ESTALE). */
Test(meta_journal, a_failed_release_keeps_the_removed_directory_removed, .init = setup_nodefer,
     .fini = teardown)
{
	struct meta_attr d, x, y, g;
	struct meta_journal_stats js;
	char jp[160], sql[512];
	int rc;

	journal_path(jp, sizeof(jp));
	cr_assert_eq(meta_journal_open(m, jp, 60000, NULL), 0);
	cr_assert_eq(meta_create(m, META_ROOT_INO, "d", S_IFDIR | 0755, 1, 2, 0, NULL, &d), 0);
	snprintf(sql, sizeof(sql), "OLD.ino = %llu", (unsigned long long)d.ino);
	raw_trigger("no_del", "BEFORE DELETE", "inode", sql); /* commits the batch first */
	raw_trigger("boom", "BEFORE INSERT", "dentry", "NEW.name = CAST('boom' AS BLOB)");
	cr_assert_eq(meta_rmdir(m, META_ROOT_INO, "d", NULL), 0);
	cr_assert_eq(meta_getattr(m, d.ino, &g), 0);
	cr_assert_eq(g.nlink, 0);
	rc = meta_inode_release(m, d.ino);
	cr_assert_neq(rc, 0, "the injected DELETE failure");
	cr_assert_eq(meta_getattr(m, d.ino, &g), 0);
	cr_assert_eq(g.nlink, 0, "removed directory reads nlink %u after a failed release", g.nlink);
	rc = meta_create(m, d.ino, "x", S_IFREG | 0644, 1, 2, 0, NULL, &x);
	cr_assert_eq(rc, -ENOENT, "create in a removed directory: %d", rc);
	cr_assert_eq(meta_create(m, META_ROOT_INO, "y", S_IFREG | 0644, 1, 2, 0, NULL, &y), 0);
	/* A change that fails part way: the batch is made again from the journal. */
	rc = meta_create(m, META_ROOT_INO, "boom", S_IFREG | 0644, 1, 2, 0, NULL, NULL);
	cr_assert_neq(rc, 0);
	meta_journal_stats_get(m, &js);
	cr_assert_eq(js.replay_errors, 0, "%llu records refused at replay",
		     (unsigned long long)js.replay_errors);
	rc = meta_lookup(m, META_ROOT_INO, "y", &g);
	cr_assert_eq(rc, 0);
	cr_assert_eq(g.ino, y.ino, "y was made live as %llu, replayed as %llu",
		     (unsigned long long)y.ino, (unsigned long long)g.ino);
	rc = meta_getattr(m, y.ino, &g);
	cr_assert_eq(rc, 0, "getattr of y's inode number: %d", rc);
	/* And the next create takes a number of its own. */
	struct meta_attr z;
	cr_assert_eq(meta_create(m, META_ROOT_INO, "z", S_IFREG | 0644, 1, 2, 0, NULL, &z), 0);
	cr_assert_neq(z.ino, y.ino, "z got the inode number y was given live (%llu)",
		      (unsigned long long)y.ino);
}

/* m->ctr.dirty outlives batch_closed(): a batch lost with numbers taken
 * leaves {held 0, dirty 1} with that batch's values, batch_run() restores
 * that snapshot when a replayed record fails before it takes a number, and
 * hot_flush() then writes those stale values. While m was stuck another
 * writer took numbers past them: the counters go back and the next create
 * collides with an existing inode. */
Test(meta_journal, counters_of_a_lost_batch_are_never_written, .init = setup_nodefer,
     .fini = teardown)
{
	struct meta *o = NULL;
	struct meta_attr a, g;
	char jp[160];
	int rc;

	journal_path(jp, sizeof(jp));
	cr_assert_eq(meta_journal_open(m, jp, 60000, NULL), 0);
	/* Updating the root's row fails once an entry 'poison' exists: live the
	 * root's row is held (no UPDATE), a replay writes it at each change. */
	raw_trigger("poison", "BEFORE UPDATE", "inode",
		    "NEW.ino = 1 AND EXISTS (SELECT 1 FROM dentry WHERE name = CAST('poison' AS BLOB))");
	raw_trigger("boom", "BEFORE INSERT", "dentry", "NEW.name = CAST('boom' AS BLOB)");
	cr_assert_eq(meta_create(m, META_ROOT_INO, "poison", S_IFREG | 0644, 1, 2, 0, NULL, &a), 0);
	/* Fails part way: batch lost, the replay fails (the trigger), m is stuck. */
	cr_assert_neq(meta_create(m, META_ROOT_INO, "boom", S_IFREG | 0644, 1, 2, 0, NULL, NULL), 0);
	/* poison's create was acknowledged and is in no batch: a sync says so. */
	cr_assert_eq(meta_sync(m), -EIO);
	raw_trigger_drop("poison", "inode");
	raw_trigger_drop("boom", "dentry");
	/* Another writer, while no batch is open. */
	cr_assert_eq(meta_open(db, &o), 0);
	cr_assert_eq(meta_create(o, META_ROOT_INO, "poison", S_IFREG | 0644, 1, 2, 0, NULL, &g), 0);
	for (int i = 0; i < 5; i++) {
		char name[16];
		snprintf(name, sizeof(name), "o%d", i);
		cr_assert_eq(meta_create(o, META_ROOT_INO, name, S_IFREG | 0644, 1, 2, 0, NULL, &g), 0);
	}
	meta_close(o);
	int64_t next0 = raw_int("SELECT next_ino FROM counters");
	/* m comes unstuck (its replay refuses 'poison': EEXIST) and commits. */
	cr_assert_eq(meta_getattr(m, META_ROOT_INO, &g), 0);
	cr_assert_eq(meta_flush(m), 0);
	int64_t next1 = raw_int("SELECT next_ino FROM counters");
	cr_assert_geq(next1, next0, "next_ino went back from %lld to %lld", (long long)next0,
		      (long long)next1);
	rc = meta_create(m, META_ROOT_INO, "after", S_IFREG | 0644, 1, 2, 0, NULL, &g);
	cr_assert_eq(rc, 0, "create after the counters went back: %d", rc);
}

/* A commit whose hot_flush() fails part way: the batch is made again from the
 * journal and the commit tried once more holds everything, counters
 * included. */
Test(meta_journal, a_commit_failing_on_held_rows_is_made_again, .init = setup_nodefer,
     .fini = teardown)
{
	struct meta_attr d1, d2, f, g, root0;
	struct meta_journal_stats js;
	char jp[160];
	int rc;

	journal_path(jp, sizeof(jp));
	cr_assert_eq(meta_journal_open(m, jp, 60000, NULL), 0);
	cr_assert_eq(meta_getattr(m, META_ROOT_INO, &root0), 0);
	/* Only the live commit raises the root's nlink by 2 in one UPDATE. */
	raw_trigger("two", "BEFORE UPDATE", "inode", "NEW.ino = 1 AND NEW.nlink = OLD.nlink + 2");
	cr_assert_eq(meta_create(m, META_ROOT_INO, "d1", S_IFDIR | 0755, 1, 2, 0, NULL, &d1), 0);
	cr_assert_eq(meta_create(m, d1.ino, "f", S_IFREG | 0644, 1, 2, 0, NULL, &f), 0);
	cr_assert_eq(meta_create(m, META_ROOT_INO, "d2", S_IFDIR | 0755, 1, 2, 0, NULL, &d2), 0);
	/* The commit fails; the batch made again (nlink raised step by step)
	 * commits in the same call. */
	rc = meta_flush(m);
	cr_assert_eq(rc, 0, "flush: %d", rc);
	meta_journal_stats_get(m, &js);
	cr_assert_eq(js.commit_failures, 1, "no injected failure");
	cr_assert_eq(js.replay_errors, 0);
	cr_assert_eq(raw_int("SELECT nlink FROM inode WHERE ino = 1"), (int64_t)root0.nlink + 2);
	cr_assert_eq(raw_int("SELECT COUNT(*) FROM inode WHERE ino >= (SELECT next_ino FROM counters)"), 0);
	cr_assert_eq(meta_lookup(m, d1.ino, "f", &g), 0);
	cr_assert_eq(g.ino, f.ino);
	cr_assert_eq(meta_create(m, META_ROOT_INO, "n", S_IFREG | 0644, 1, 2, 0, NULL, &g), 0);
	cr_assert_eq(g.ino, d2.ino + 1);
}

/* A read on the batch's connection that SQLite answers by rolling the whole
 * transaction back (SQLITE_NOMEM here, SQLITE_IOERR alike) leaves batch_open
 * set, with the held rows and counters of a transaction that is gone. On
 * PostgreSQL the same comes of a connection the server ends. */
Test(meta_journal, a_batch_rolled_back_under_a_read_is_made_again, .init = setup_nodefer, .fini = teardown)
{
	struct meta *o = NULL;
	struct meta_attr a, b, g;
	struct meta_journal_stats js;
	char jp[160], name[48];
	int rc;

	journal_path(jp, sizeof(jp));
	cr_assert_eq(meta_journal_open(m, jp, 60000, NULL), 0);
	cr_assert_eq(meta_create(m, META_ROOT_INO, "a0", S_IFREG | 0644, 1, 2, 0, NULL, &g), 0);
	cr_assert_eq(meta_statfs(m, NULL, NULL), 0); /* prepared on the batch's connection */
	cr_assert_eq(meta_flush(m), 0);
	cr_assert_eq(meta_open(db, &o), 0);
	for (int i = 0; i < 3000; i++) { /* m's cached pages go stale */
		snprintf(name, sizeof(name), "file-with-a-long-name-%d", i);
		cr_assert_eq(meta_create(o, META_ROOT_INO, name, S_IFREG | 0644, 1, 2, 0, NULL, &g), 0);
	}
	meta_close(o);
	cr_assert_eq(meta_create(m, META_ROOT_INO, "a", S_IFDIR | 0755, 1, 2, 0, NULL, &a), 0);
#ifdef META_TEST_PG
	/* The server ends every connection m has (an administrator, a
	 * failover): the open batch goes with them, and m connects again. */
	{
		char sql[256];
		PGconn *h = pg_raw_conn(); /* no meta_flush(): the batch stays open */
		PGresult *r;

		snprintf(sql, sizeof(sql),
			 "SELECT COUNT(pg_terminate_backend(pid)) FROM pg_stat_activity"
			 " WHERE application_name = 'ferryfs %s'",
			 pg_schema + 6);
		r = PQexec(h, sql);
		cr_assert_eq(PQresultStatus(r), PGRES_TUPLES_OK, "%s", PQerrorMessage(h));
		cr_assert_gt(atoi(PQgetvalue(r, 0, 0)), 0);
		PQclear(r);
		PQfinish(h);
	}
	rc = meta_statfs(m, NULL, NULL);
#else
	sqlite3_hard_heap_limit64(sqlite3_memory_used());
	rc = meta_statfs(m, NULL, NULL);
	sqlite3_hard_heap_limit64(0);
#endif
	rc = meta_lookup(m, META_ROOT_INO, "a", &g);
	cr_assert_eq(rc, 0, "the acknowledged create of a is not seen: %d", rc);
	rc = meta_create(m, META_ROOT_INO, "b", S_IFDIR | 0755, 1, 2, 0, NULL, &b);
	cr_assert_eq(rc, 0, "create b: %d", rc);
	rc = meta_flush(m);
	cr_assert_eq(rc, 0, "flush: %d", rc);
	rc = meta_flush(m);
	cr_assert_eq(rc, 0, "flush again: %d", rc);
	meta_journal_stats_get(m, &js);
	cr_assert_eq(js.replay_errors, 0, "%llu records refused at replay",
		     (unsigned long long)js.replay_errors);
	cr_assert_eq(js.pending, 0);
	cr_assert_eq(meta_lookup(m, META_ROOT_INO, "a", &g), 0);
	cr_assert_eq(meta_lookup(m, META_ROOT_INO, "b", &g), 0);
	cr_assert_eq(raw_int("SELECT nlink FROM inode WHERE ino = 1"), 4);
	cr_assert_eq(raw_int("SELECT COUNT(*) FROM inode WHERE ino >= (SELECT next_ino FROM counters)"), 0);
}

/* A record the replay refuses moves no later create to another inode
 * number: the kernel and later records know each by the number it got live.
 * Here the replay first fails as a database would (a trigger on the root's
 * row, which only a replay writes per create: live, the batch holds it), so
 * the meta is stuck; meanwhile another writer links a file in as p, so the
 * next replay refuses p's create (EEXIST) and must still give q its number. */
Test(meta_journal, a_refused_record_moves_no_later_inode_number, .init = setup_nodefer,
     .fini = teardown)
{
	struct meta_attr f, p, q, g;
	struct meta_journal_stats js;
	struct meta *o = NULL;
	char jp[160];

	journal_path(jp, sizeof(jp));
	cr_assert_eq(meta_journal_open(m, jp, 60000, NULL), 0);
	cr_assert_eq(meta_create(m, META_ROOT_INO, "f", S_IFREG | 0644, 1, 2, 0, NULL, &f), 0);
	raw_trigger("stall", "BEFORE UPDATE", "inode",
		    "NEW.ino = 1 AND EXISTS (SELECT 1 FROM dentry WHERE name = CAST('q' AS BLOB))");
	raw_trigger("boom", "BEFORE INSERT", "dentry", "NEW.name = CAST('boom' AS BLOB)"); /* commits f */
	cr_assert_eq(meta_create(m, META_ROOT_INO, "p", S_IFREG | 0644, 1, 2, 0, NULL, &p), 0);
	cr_assert_eq(meta_create(m, META_ROOT_INO, "q", S_IFREG | 0644, 1, 2, 0, NULL, &q), 0);
	/* Fails part way (its inode row is written): the batch is lost, and
	 * its replay fails at q: stuck. */
	cr_assert_neq(meta_create(m, META_ROOT_INO, "boom", S_IFREG | 0644, 1, 2, 0, NULL, NULL), 0);
	raw_trigger_drop("stall", "inode");
	raw_trigger_drop("boom", "dentry");
	cr_assert_eq(meta_open(db, &o), 0);
	cr_assert_eq(meta_link(o, f.ino, META_ROOT_INO, "p", NULL), 0); /* takes no number */
	meta_close(o);
	/* The next read makes the batch again: p is refused, q keeps its number. */
	cr_assert_eq(meta_lookup(m, META_ROOT_INO, "q", &g), 0);
	cr_assert_eq(g.ino, q.ino, "q made live as %llu, replayed as %llu",
		     (unsigned long long)q.ino, (unsigned long long)g.ino);
	meta_journal_stats_get(m, &js);
	cr_assert_eq(js.replay_errors, 1, "p's record is refused");
	cr_assert_eq(meta_lookup(m, META_ROOT_INO, "p", &g), 0);
	cr_assert_eq(g.ino, f.ino);
	cr_assert_eq(meta_flush(m), 0);
	cr_assert_eq(meta_create(m, META_ROOT_INO, "r", S_IFREG | 0644, 1, 2, 0, NULL, &g), 0);
	cr_assert_gt(g.ino, q.ino);
	(void)p;
}

/* ---- the writer's lease ------------------------------------------------------- */

/* One writer at a time: a second is refused while the first's lease runs,
 * and after it ran out, until it asks to take over; the first, fenced,
 * then changes nothing (its writes fail with EROFS), and a lease let go is
 * taken by anyone. */
Test(meta, lease_one_writer_takeover_and_fencing)
{
	struct meta *o = NULL;
	struct meta_lease cur;
	struct meta_attr a;
	int rc;

	cr_assert_eq(meta_lease_get(m, &cur), 0);
	cr_assert_str_eq(cur.holder, "");
	cr_assert_eq(cur.epoch, 0);
	cr_assert_eq(meta_lease_take(m, "node-a pid 1", 600, 0, 0, &cur), 0);
	cr_assert_eq(meta_lease_fenced_to(m), 1);
	cr_assert_eq(meta_create(m, META_ROOT_INO, "by-a", S_IFREG | 0644, 1, 1, 0, NULL, &a), 0);

	cr_assert_eq(meta_open(db, &o), 0);
	rc = meta_lease_take(o, "node-b pid 2", 600, 1, 0, &cur);
	cr_assert_eq(rc, -EBUSY, "a running lease taken over: %d", rc);
	cr_assert_str_eq(cur.holder, "node-a pid 1");
	cr_assert_gt(cur.expires_ms, cur.now_ms);
	cr_assert_eq(meta_lease_renew(m, 600), 0);
	/* a stops renewing (its node died): the lease runs out... */
	usleep(900 * 1000);
	rc = meta_lease_get(o, &cur);
	cr_assert_eq(rc, 0, "get: %d", rc);
	cr_assert_leq(cur.expires_ms, cur.now_ms);
	/* ...and is still a's until someone takes it over. */
	cr_assert_eq(meta_lease_take(o, "node-b pid 2", 60000, 0, 0, NULL), -EBUSY);
	cr_assert_eq(meta_lease_take(o, "node-b pid 2", 60000, 1, 0, NULL), 0);
	cr_assert_eq(meta_lease_fenced_to(o), 2);

	/* a comes back: it changes nothing, whatever it tries. */
	rc = meta_create(m, META_ROOT_INO, "late", S_IFREG | 0644, 1, 1, 0, NULL, &a);
	cr_assert_eq(rc, -EROFS, "a fenced writer's create: %d", rc);
	cr_assert_eq(meta_setattr(m, META_ROOT_INO, META_SET_MODE, &(struct meta_attr){ .mode = 0700 },
				  NULL),
		     -EROFS);
	cr_assert_eq(meta_lease_renew(m, 600), -EROFS);
	cr_assert_eq(meta_lease_release(m), 0, "releasing a lease taken over is a no-op");
	cr_assert_eq(meta_lookup(o, META_ROOT_INO, "late", &a), -ENOENT);
	cr_assert_eq(meta_lookup(o, META_ROOT_INO, "by-a", &a), 0);
	cr_assert_eq(attr(META_ROOT_INO).mode & 07777, 0755);

	/* A restart of b's node (its daemon known dead) takes its own running
	 * lease at once; anyone else's running lease stays refused. */
	meta_close(o);
	cr_assert_eq(meta_open(db, &o), 0);
	cr_assert_eq(meta_lease_take(o, "node-b again", 60000, 0, 1, NULL), -EBUSY);
	cr_assert_eq(meta_lease_take(o, "node-b again", 60000, 0, 2, NULL), 0);
	cr_assert_eq(meta_lease_fenced_to(o), 3);
	/* b writes, lets go; anyone takes a free lease, no takeover needed. */
	cr_assert_eq(meta_create(o, META_ROOT_INO, "by-b", S_IFREG | 0644, 1, 1, 0, NULL, &a), 0);
	cr_assert_eq(meta_lease_release(o), 0);
	cr_assert_eq(meta_lease_get(o, &cur), 0);
	cr_assert_str_eq(cur.holder, "");
	meta_close(o);
	cr_assert_eq(meta_lease_take(m, "node-a pid 3", 60000, 0, 0, NULL), 0);
	cr_assert_eq(meta_lease_fenced_to(m), 4);
	cr_assert_eq(meta_create(m, META_ROOT_INO, "again", S_IFREG | 0644, 1, 1, 0, NULL, &a), 0);
	cr_assert_eq(meta_lookup(m, META_ROOT_INO, "by-b", &a), 0);
}

/* A change refused after reading rows (EEXIST, EISDIR, ENOTEMPTY) wrote
 * nothing: the batch stays as it is, not rolled back and made again from
 * the journal (which would cost the whole batch each time). */
Test(meta_journal, refused_changes_keep_the_batch, .init = setup_nodefer, .fini = teardown)
{
	struct meta_journal_stats js;
	struct meta_attr d, a;
	char jp[160], name[32];

	journal_path(jp, sizeof(jp));
	cr_assert_eq(meta_journal_open(m, jp, 60000, NULL), 0);
	cr_assert_eq(meta_create(m, META_ROOT_INO, "d", S_IFDIR | 0755, 1, 2, 0, NULL, &d), 0);
	for (int i = 0; i < 50; i++) {
		snprintf(name, sizeof(name), "f%d", i);
		cr_assert_eq(meta_create(m, d.ino, name, S_IFREG | 0644, 1, 2, 0, NULL, &a), 0);
	}
	for (int i = 0; i < 20; i++) {
		cr_assert_eq(meta_unlink(m, META_ROOT_INO, "d", NULL), -EISDIR);
		cr_assert_eq(meta_rmdir(m, META_ROOT_INO, "d", NULL), -ENOTEMPTY);
		cr_assert_eq(meta_create(m, d.ino, "f1", S_IFREG | 0644, 1, 2, 0, NULL, NULL),
			     -EEXIST);
		cr_assert_eq(meta_link(m, a.ino, d.ino, "f2", NULL), -EEXIST);
	}
	meta_journal_stats_get(m, &js);
	cr_assert_eq(js.replayed, 0, "%llu records made again", (unsigned long long)js.replayed);
	cr_assert_eq(js.pending, 51);
	cr_assert_eq(meta_flush(m), 0);
	cr_assert_eq(meta_lookup(m, d.ino, "f49", &a), 0);
}

/* What a change costs the engine: statements run, and exchanges with a
 * server (none for SQLite, in the process). */
Test(meta, counters_count_statements_and_round_trips)
{
	uint64_t s0, r0, s1, r1;

	meta_counters(m, &s0, &r0);
	mk(META_ROOT_INO, "counted", S_IFREG | 0644);
	cr_assert_eq(meta_getattr(m, META_ROOT_INO, NULL), 0);
	meta_flush(m);
	meta_counters(m, &s1, &r1);
	cr_assert_gt(s1, s0 + 1, "statements %llu -> %llu", (unsigned long long)s0,
		     (unsigned long long)s1);
#ifdef META_TEST_PG
	cr_assert_gt(r1, r0, "no round trip counted");
#else
	cr_assert_eq(r1, 0);
#endif
}

/* Looks parent/name up: its inode, or 0 for ENOENT; *stmts says how many
 * statements the lookup ran. */
static uint64_t look(uint64_t parent, const char *name, uint64_t *stmts)
{
	struct meta_attr a;
	uint64_t s0;
	int rc;

	/* This thread's statements: a deferred volume's batch thread may
	 * commit in between. */
	s0 = meta_thread_statements();
	rc = meta_lookup(m, parent, name, &a);
	*stmts = meta_thread_statements() - s0;
	cr_assert(rc == 0 || rc == -ENOENT, "lookup %s: %d", name, rc);
	return rc == 0 ? a.ino : 0;
}

/* Another writer's entry parent/name -> ino, behind the engine's back (and
 * behind the volume's lease, which forbids it). */
static void foreign_name(uint64_t parent, const char *hexname, uint64_t ino, int64_t cookie)
{
	char sql[256];

	snprintf(sql, sizeof(sql),
		 "INSERT INTO dentry(parent, name, ino, cookie) VALUES (%llu, X'%s', %llu, %lld)",
		 (unsigned long long)parent, hexname, (unsigned long long)ino, (long long)cookie);
	raw_sql(sql);
}

#ifdef META_TEST_PG
#define ANSWER_COMES_LATER 1 /* PostgreSQL's batch: the insert is queued */
#else
#define ANSWER_COMES_LATER 0
#endif

/* A name the names set takes for free is inserted without waiting for the
 * answer. Taken after all (another writer went behind the volume's only
 * one): where the answer comes at once the create fails with EEXIST; in
 * PostgreSQL's batch the create was acknowledged, and its failure comes
 * with what reads next: the batch is made again from the journal, whose
 * replay refuses the create (counted). A change that met it did not fail
 * itself: it runs again and goes through; a read fails with EIO. The
 * refused create's inode number, which the kernel may hold, is not given
 * again. */
Test(meta_journal, a_free_name_taken_behind_the_names_set_fails_one_change_only,
     .init = setup_nodefer, .fini = teardown)
{
	struct meta_journal_stats js;
	struct meta_attr a, x;
	uint64_t d, e, f, g, h;
	char sql[256], jp[160];
	int rc;

	/* A batch no flusher commits under the test (what meets the failure
	 * is the next statement, not a commit in between). */
	journal_path(jp, sizeof(jp));
	cr_assert_eq(meta_journal_open(m, jp, 60000, NULL), 0);
	cr_assert_eq(meta_names_keep(m, 1000), 0);
	d = mk(META_ROOT_INO, "d", S_IFDIR | 0755);
	f = mk(META_ROOT_INO, "f", S_IFREG | 0644);
	g = mk(META_ROOT_INO, "g", S_IFREG | 0644);

	/* A read comes next, of a name the database answers for: it carries
	 * the insert's answer and fails with EIO (not the create's EEXIST);
	 * the next change makes the batch again. */
	foreign_name(d, "78", g, 999999); /* d/x */
	rc = meta_create(m, d, "x", S_IFREG | 0644, 1, 1, 0, NULL, &x);
	cr_assert_eq(rc, ANSWER_COMES_LATER ? 0 : -EEXIST, "create: %d", rc);
	rc = meta_lookup(m, META_ROOT_INO, "f", &a);
	cr_assert_eq(rc, ANSWER_COMES_LATER ? -EIO : 0, "lookup: %d", rc);
	h = mk(META_ROOT_INO, "h", S_IFREG | 0644);
	cr_assert_eq(meta_lookup(m, META_ROOT_INO, "f", &a), 0);
	cr_assert_eq(a.ino, f);
	if (ANSWER_COMES_LATER)
		cr_assert_neq(h, x.ino, "the refused create's inode number was given again");

	/* A change comes next (the set forgot everything: a new directory). */
	e = mk(META_ROOT_INO, "e", S_IFDIR | 0755);
	foreign_name(e, "78", g, 999998); /* e/x */
	rc = meta_create(m, e, "x", S_IFREG | 0644, 1, 1, 0, NULL, NULL);
	cr_assert_eq(rc, ANSWER_COMES_LATER ? 0 : -EEXIST, "create: %d", rc);
	cr_assert_eq(meta_unlink(m, META_ROOT_INO, "f", NULL), 0);
	cr_assert_eq(meta_flush(m), 0);

	meta_journal_stats_get(m, &js);
	cr_assert_eq(js.changes_retried, ANSWER_COMES_LATER ? 1 : 0);
	cr_assert_eq(js.replay_errors, ANSWER_COMES_LATER ? 2 : 0);
	cr_assert_eq(meta_lookup(m, d, "x", &a), 0);
	cr_assert_eq(a.ino, g, "the name is the other writer's");
	cr_assert_eq(meta_lookup(m, e, "x", &a), 0);
	cr_assert_eq(a.ino, g, "the name is the other writer's");
	cr_assert_eq(meta_lookup(m, META_ROOT_INO, "f", &a), -ENOENT);
	snprintf(sql, sizeof(sql),
		 "SELECT COUNT(*) FROM inode WHERE ino NOT IN (1, %llu, %llu, %llu, %llu, %llu)",
		 (unsigned long long)d, (unsigned long long)e, (unsigned long long)f,
		 (unsigned long long)g, (unsigned long long)h);
	cr_assert_eq(raw_int(sql), 0, "an inode of a refused create");
}

/* With meta_names_keep, absent names of a directory made here are answered
 * without a statement, and every change that makes, moves or removes a name
 * keeps the answers right (ext4's answers for the same steps). */
Test(meta, kept_names_answer_absent_lookups_and_follow_every_change)
{
	struct meta_names_stats ns;
	uint64_t d, s, a, b, x, y, n;

	cr_assert_eq(meta_names_keep(m, 1000), 0);
	cr_assert_eq(meta_names_keep(m, 1000), -EINVAL);
	/* The root was not made here: the database answers. */
	cr_assert_eq(look(META_ROOT_INO, "nothing", &n), 0);
	cr_assert_gt(n, 0);
	d = mk(META_ROOT_INO, "d", S_IFDIR | 0755);
	cr_assert_eq(look(d, "a", &n), 0);
	cr_assert_eq(n, 0, "an absent name in a directory made here ran %llu statements",
		     (unsigned long long)n);
	a = mk(d, "a", S_IFREG | 0644);
	b = mk(d, "b", S_IFREG | 0644);
	cr_assert_eq(look(d, "a", &n), a);
	cr_assert_eq(look(d, "b", &n), b);
	cr_assert_eq(look(d, "c", &n), 0);
	cr_assert_eq(n, 0);
	cr_assert_eq(meta_create(m, d, "a", S_IFREG | 0644, 1, 1, 0, NULL, NULL), -EEXIST);
	cr_assert_eq(look(d, "a", &n), a);

	/* link, rename, rename over a name, exchange, noreplace */
	cr_assert_eq(meta_link(m, a, d, "l", NULL), 0);
	cr_assert_eq(look(d, "l", &n), a);
	cr_assert_eq(meta_rename(m, d, "a", d, "c", 0, NULL), 0);
	cr_assert_eq(look(d, "a", &n), 0);
	cr_assert_eq(n, 0);
	cr_assert_eq(look(d, "c", &n), a);
	cr_assert_eq(meta_rename(m, d, "b", d, "c", 0, NULL), 0);
	cr_assert_eq(look(d, "b", &n), 0);
	cr_assert_eq(look(d, "c", &n), b);
	cr_assert_eq(look(d, "l", &n), a);
	/* Two names of one inode: rename does nothing, both stay. */
	cr_assert_eq(meta_link(m, b, d, "b2", NULL), 0);
	cr_assert_eq(meta_rename(m, d, "c", d, "b2", 0, NULL), 0);
	cr_assert_eq(look(d, "c", &n), b);
	cr_assert_eq(look(d, "b2", &n), b);
	x = mk(d, "x", S_IFREG | 0644);
	y = mk(d, "y", S_IFDIR | 0755);
	cr_assert_eq(meta_rename(m, d, "x", d, "y", META_RENAME_EXCHANGE, NULL), 0);
	cr_assert_eq(look(d, "x", &n), y);
	cr_assert_eq(look(d, "y", &n), x);
	cr_assert_eq(meta_rename(m, d, "x", d, "y", META_RENAME_NOREPLACE, NULL), -EEXIST);
	cr_assert_eq(look(d, "x", &n), y);

	/* Into and out of another directory made here, and the root. */
	s = mk(d, "s", S_IFDIR | 0755);
	cr_assert_eq(meta_rename(m, d, "l", s, "l", 0, NULL), 0);
	cr_assert_eq(look(d, "l", &n), 0);
	cr_assert_eq(look(s, "l", &n), a);
	cr_assert_eq(meta_rename(m, s, "l", META_ROOT_INO, "top", 0, NULL), 0);
	cr_assert_eq(look(s, "l", &n), 0);
	cr_assert_eq(n, 0);
	cr_assert_eq(look(META_ROOT_INO, "top", &n), a);
	cr_assert_eq(meta_rename(m, META_ROOT_INO, "top", s, "back", 0, NULL), 0);
	cr_assert_eq(look(s, "back", &n), a);

	/* unlink, rmdir, a directory replaced by a rename */
	cr_assert_eq(meta_unlink(m, d, "c", NULL), 0);
	cr_assert_eq(look(d, "c", &n), 0);
	cr_assert_eq(look(d, "b2", &n), b);
	cr_assert_eq(meta_unlink(m, s, "back", NULL), 0);
	cr_assert_eq(meta_rename(m, d, "x", d, "s", 0, NULL), 0); /* empty s replaced */
	cr_assert_eq(look(d, "x", &n), 0);
	cr_assert_eq(look(d, "s", &n), y);
	cr_assert_eq(meta_lookup(m, s, "anything", NULL), -ENOENT);
	cr_assert_eq(meta_rmdir(m, d, "s", NULL), 0);
	cr_assert_eq(look(d, "s", &n), 0);
	cr_assert_eq(meta_create(m, y, "late", S_IFREG | 0644, 1, 1, 0, NULL, NULL), -ENOENT);

	/* What the engine holds agrees with every answer. */
	char q[96];
	snprintf(q, sizeof(q), "SELECT COUNT(*) FROM dentry WHERE parent = %llu",
		 (unsigned long long)d);
	cr_assert_eq(raw_int(q), 2, "b2 and y");
	meta_names_stats(m, &ns);
	cr_assert_geq(ns.absent, 8);
	cr_assert_geq(ns.dirs, 1);
}

struct stop_after {
	int left;
};

static int stop_after_cb(void *arg, const char *name, const struct meta_attr *a, uint64_t cookie)
{
	struct stop_after *sa = arg;

	(void)name, (void)a, (void)cookie;
	return sa->left-- > 0 ? 0 : 1;
}

/* A directory that was there before (the root here) is learnt from a
 * listing read whole, not from one read in part. */
Test(meta, kept_names_learn_a_directory_from_a_whole_listing)
{
	struct stop_after sa = { .left = 2 };
	char name[16];
	uint64_t n, f0 = 0;

	for (int i = 0; i < 300; i++) { /* more than one page of the engine's */
		snprintf(name, sizeof(name), "f%03d", i);
		uint64_t ino = mk(META_ROOT_INO, name, S_IFREG | 0644);
		if (i == 0)
			f0 = ino;
	}
	cr_assert_eq(meta_names_keep(m, 10000), 0);
	cr_assert_eq(meta_readdir(m, META_ROOT_INO, 0, 0, stop_after_cb, &sa), 0);
	cr_assert_eq(look(META_ROOT_INO, "nothing", &n), 0);
	cr_assert_gt(n, 0, "a listing read in part taught it the directory");
	sa.left = 1000;
	cr_assert_eq(meta_readdir(m, META_ROOT_INO, 0, 1, stop_after_cb, &sa), 0);
	cr_assert_eq(look(META_ROOT_INO, "nothing", &n), 0);
	cr_assert_eq(n, 0);
	cr_assert_eq(look(META_ROOT_INO, "f000", &n), f0);
	cr_assert_neq(look(META_ROOT_INO, "f299", &n), 0);
	cr_assert_eq(meta_unlink(m, META_ROOT_INO, "f000", NULL), 0);
	cr_assert_eq(look(META_ROOT_INO, "f000", &n), 0);
	cr_assert_eq(n, 0);
}
