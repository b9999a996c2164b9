/*
 * meta_dump: `ferry dump` and `ferry load` on either engine. The records
 * are the tables' rows, named by table and column as in the schemas
 * (meta_sqlite.c and meta_pg.c agree on both), read and written through
 * the engine's driver (meta_db.h): a dump of one engine loads into the
 * other, and the two dumps of one volume are the same past the header.
 *
 * A value is a JSON integer, null, or a string; a blob that is not UTF-8
 * text (names are any bytes but '/' and NUL) is written as "COLUMN@hex".
 * Tables are read a page at a time in key order (keyset pages, not one
 * result: a server's result is held whole by its client).
 */
#include "meta_dump.h"

#include <errno.h>
#include <fcntl.h>
#include <json-c/json.h>
#include <limits.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "meta.h"
#include "meta_engine.h"
#include "url.h"

/* A column as the dump knows it: its type ('i' integer, 't' UTF-8 text,
 * 'b' bytes, 'n' an entry's name, 'z' bytes without a NUL) and whether it
 * may be null. */
struct dump_col {
	const char *name;
	char type;
	bool null_ok;
};
#define I(c) { #c, 'i', false }
#define T(c) { #c, 't', false }
#define END { NULL, 0, false }
static const struct dump_col volume_cols[] = { I(id), T(uuid), I(block_size), T(storage_url),
					       I(created_at), I(s3_http), END };
static const struct dump_col counters_cols[] = { I(id), I(next_ino), I(next_slice),
						 I(next_cookie), END };
static const struct dump_col seq_epoch_cols[] = { I(id), I(epoch), END };
static const struct dump_col journal_cols[] = { I(id), I(seq), END };
static const struct dump_col inode_cols[] = { I(ino), I(mode), I(uid), I(gid), I(rdev),
					      I(nlink), I(size), I(atime_sec), I(atime_nsec),
					      I(mtime_sec), I(mtime_nsec), I(ctime_sec),
					      I(ctime_nsec), END };
static const struct dump_col dentry_cols[] = { I(parent), { "name", 'n', false }, I(ino),
					       I(cookie), END };
static const struct dump_col symlink_cols[] = { I(ino), { "target", 'z', false }, END };
static const struct dump_col xattr_cols[] = { I(ino), { "name", 'z', false },
					      { "value", 'b', false }, END };
static const struct dump_col slice_cols[] = { I(seq), I(ino), I(chunk), I(id), I(size), I(off),
					      I(pos), I(len), END };
static const struct dump_col ino_cols[] = { I(ino), END };
static const struct dump_col ino_seq_cols[] = { I(ino), I(seq), END };
static const struct dump_col gc_slice_cols[] = { I(id), I(size), I(since), { "seen", 'i', true },
						 END };
/* The highest slice seq ever given: not a table of either engine (SQLite's
 * sqlite_sequence, PostgreSQL's identity sequence), read and set through
 * the engine's own statements. */
static const struct dump_col sequence_cols[] = { T(name), I(seq), END };
static const struct dump_col checkpoint_cols[] = { T(name), I(taken_ms), I(slices), I(bytes),
						   END };
static const struct dump_col checkpoint_slice_cols[] = { T(name), I(id), END };
static const struct dump_col slice_range_cols[] = { I(id), I(base), END };
#undef I
#undef T
#undef END

/* The tables, in the order they are written and loaded; each's key is its
 * first nkey columns. The lease is not part of a dump. */
static const struct dump_table {
	const char *table; /* and the record's "t" */
	const struct dump_col *cols;
	int nkey;
} tables[] = {
	{ "volume", volume_cols, 1 },       { "counters", counters_cols, 1 },
	{ "seq_epoch", seq_epoch_cols, 1 }, { "journal", journal_cols, 1 },
	{ "inode", inode_cols, 1 },         { "dentry", dentry_cols, 2 },
	{ "symlink", symlink_cols, 1 },     { "xattr", xattr_cols, 2 },
	{ "slice", slice_cols, 1 },         { "orphan", ino_cols, 1 },
	{ "commit_seq", ino_seq_cols, 1 },  { "times_seq", ino_seq_cols, 1 },
	{ "gc_slice", gc_slice_cols, 1 },   { "checkpoint", checkpoint_cols, 1 },
	{ "checkpoint_slice", checkpoint_slice_cols, 2 },
	{ "slice_range", slice_range_cols, 1 }, { "sequence", sequence_cols, 0 },
};
#define NTABLES (sizeof(tables) / sizeof(tables[0]))
#define SEQUENCE (NTABLES - 1)
#define MAX_COLS 16
#define MAX_KEY 2
/* The longest record line taken: the largest real one is an xattr value of
 * 64 KiB, as 128 KiB of hex. */
#define LINE_MAX_BYTES (1u << 20)
/* Rows a dump reads per statement. */
#define PAGE_ROWS 4096
#define BIG_NUM 4611686018427387904LL /* 2^62: far past any counter's reach */
/* A dump of a PostgreSQL volume holds its lease this long, and renews it
 * at a third of that while it runs. */
#define DUMP_LEASE_MS 30000

static void say(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
}

static bool utf8_text(const unsigned char *s, size_t n)
{
	size_t i = 0;

	while (i < n) {
		unsigned char b = s[i];
		size_t more;
		uint32_t cp;

		if (b == 0)
			return false;
		if (b < 0x80) {
			i++;
			continue;
		}
		if ((b & 0xe0) == 0xc0)
			more = 1, cp = b & 0x1f;
		else if ((b & 0xf0) == 0xe0)
			more = 2, cp = b & 0x0f;
		else if ((b & 0xf8) == 0xf0)
			more = 3, cp = b & 0x07;
		else
			return false;
		if (i + more >= n)
			return false; /* cut short */
		for (size_t k = 1; k <= more; k++) {
			if ((s[i + k] & 0xc0) != 0x80)
				return false;
			cp = (cp << 6) | (s[i + k] & 0x3f);
		}
		/* overlong forms, surrogates and past U+10FFFF are not text */
		if ((more == 1 && cp < 0x80) || (more == 2 && cp < 0x800) ||
		    (more == 3 && cp < 0x10000) || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
			return false;
		i += more + 1;
	}
	return true;
}

static char *hex_encode(const unsigned char *p, size_t n)
{
	static const char digits[] = "0123456789abcdef";
	char *s = malloc(2 * n + 1);

	if (!s)
		return NULL;
	for (size_t i = 0; i < n; i++) {
		s[2 * i] = digits[p[i] >> 4];
		s[2 * i + 1] = digits[p[i] & 15];
	}
	s[2 * n] = '\0';
	return s;
}

static int hex_digit(char c)
{
	return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* *out malloc'ed (the caller's), *n its length; -EINVAL if not hex. */
static int hex_decode(const char *s, size_t len, unsigned char **out, size_t *n)
{
	unsigned char *p;

	if (len % 2)
		return -EINVAL;
	p = malloc(len / 2 + 1);
	if (!p)
		return -ENOMEM;
	for (size_t i = 0; i < len / 2; i++) {
		int hi = hex_digit(s[2 * i]), lo = hex_digit(s[2 * i + 1]);

		if (hi < 0 || lo < 0) {
			free(p);
			return -EINVAL;
		}
		p[i] = (unsigned char)(hi << 4 | lo);
	}
	p[len / 2] = '\0'; /* a text column's value is bound as a string */
	*out = p;
	*n = len / 2;
	return 0;
}

/* ---- the volume lock and the journal ---- */

/* The lock ferry-mountd holds on <db>.lock while a volume is mounted; held
 * here for the dump's length, so no daemon mounts it meanwhile. Returns
 * the fd, or -errno. */
static int volume_lock(const char *db_path, char *err, size_t errlen)
{
	struct flock fl = { .l_type = F_WRLCK, .l_whence = SEEK_SET };
	char path[PATH_MAX], pid[32] = "";
	int fd;

	if (snprintf(path, sizeof(path), "%s.lock", db_path) >= (int)sizeof(path))
		return -ENAMETOOLONG;
	fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (fd < 0) {
		say(err, errlen, "%s: %s", path, strerror(errno));
		return -errno;
	}
	if (fcntl(fd, F_OFD_SETLK, &fl) < 0) {
		int e = errno;
		ssize_t n = pread(fd, pid, sizeof(pid) - 1, 0);

		pid[n > 0 ? n : 0] = '\0';
		pid[strcspn(pid, "\n")] = '\0';
		close(fd);
		if (e == EAGAIN || e == EACCES) {
			say(err, errlen, "the volume is mounted (ferry-mountd pid %s); unmount it first",
			    *pid ? pid : "?");
			return -EBUSY;
		}
		say(err, errlen, "%s: %s", path, strerror(e));
		return -e;
	}
	return fd;
}

/* Opens the volume through the engine, which checks that it is one and
 * of this schema, and replays its journal (or, for a new volume, makes
 * the tables that come with the first open and the first journal). */
static int volume_settle(const char *db_path, char *err, size_t errlen)
{
	char journal[PATH_MAX];
	struct meta *m = NULL;
	int rc;

	if (snprintf(journal, sizeof(journal), "%s%s", db_path, META_JOURNAL_SUFFIX) >=
	    (int)sizeof(journal))
		return -ENAMETOOLONG;
	rc = meta_open(db_path, &m);
	if (rc < 0) {
		say(err, errlen, "%s is not a volume this ferry can open: %s", db_path,
		    strerror(-rc));
		return rc;
	}
	rc = meta_journal_open(m, journal, 1000, NULL);
	if (rc < 0)
		say(err, errlen, "metadata journal %s: %s", journal, strerror(-rc));
	meta_close(m); /* commits what the journal replayed */
	return rc;
}


static int ncols(const struct dump_table *t)
{
	int n = 0;

	while (t->cols[n].name)
		n++;
	return n;
}

/* Runs sql (no parameters, no rows wanted) on c. */
static int exec_sql(struct conn *c, const char *sql)
{
	struct db_stmt *st = NULL;
	int rc = c->drv->stmt_new(c, sql, "", &st);

	if (rc == 0) {
		rc = c->drv->step(st);
		if (rc > 0)
			rc = 0;
	}
	c->drv->stmt_free(st);
	return rc;
}

/* The first column of sql's only row as an integer in *v; 0 if there is
 * a row, 1 if none (or a null), or -errno. */
static int query_one(struct conn *c, const char *sql, int64_t *v)
{
	struct db_stmt *st = NULL;
	int rc = c->drv->stmt_new(c, sql, "", &st);

	if (rc == 0)
		rc = c->drv->step(st);
	if (rc == 0 || (rc == 1 && c->drv->col_type(st, 0) == DB_NULL)) {
		rc = 1;
	} else if (rc == 1) {
		rc = c->drv->col_type(st, 0) == DB_INT ? 0 : -EIO;
		*v = c->drv->col_i64(st, 0);
	}
	c->drv->stmt_free(st);
	return rc;
}

static void say_db(struct conn *c, char *err, size_t errlen, const char *what)
{
	char msg[256];

	say(err, errlen, "%s: %s", what, c->drv->errmsg(c, msg, sizeof(msg)));
}

/* ---- holding a volume still for a dump ---- */

struct hold {
	int lock;          /* SQLite: the volume's lock, -1: none */
	bool lease;        /* PostgreSQL: its lease is ours */
	struct timespec renewed;
};

static double ms_to_s(int64_t ms)
{
	return (double)ms / 1000.0;
}

/* Opens the volume at loc into *m, held so that no daemon changes it while
 * it is read: a SQLite volume by its lock (and its journal replayed), a
 * PostgreSQL one by its lease, which a mount holds and a clean unmount
 * frees (a lease that ran out without a release may have changes in its
 * node's journal: they are not in the database yet). */
static int volume_hold(const char *loc, struct meta **m, struct hold *h, char *err, size_t errlen)
{
	struct meta_lease cur;
	char holder[META_LEASE_HOLDER_MAX + 1], host[64] = "?";
	int rc;

	if (!meta_url_is_pg(loc)) {
		h->lock = volume_lock(loc, err, errlen);
		if (h->lock < 0)
			return h->lock;
		rc = volume_settle(loc, err, errlen);
		if (rc == 0 && (rc = meta_open(loc, m)) < 0)
			say(err, errlen, "cannot open %s: %s", loc, strerror(-rc));
		return rc;
	}
	rc = meta_open(loc, m);
	if (rc < 0) {
		say(err, errlen, "%s is not a volume this ferry can open: %s", loc, strerror(-rc));
		return rc;
	}
	gethostname(host, sizeof(host) - 1);
	snprintf(holder, sizeof(holder), "ferry dump on %s pid %d", host, (int)getpid());
	rc = meta_lease_take(*m, holder, DUMP_LEASE_MS, 0, 0, &cur);
	if (rc == -EBUSY && cur.expires_ms > cur.now_ms)
		say(err, errlen, "the volume is in use: its lease is held by %s for %.1f s more",
		    cur.holder, ms_to_s(cur.expires_ms - cur.now_ms));
	else if (rc == -EBUSY)
		say(err, errlen, "the lease of %s ran out %.1f s ago without a release: its node may "
		    "hold changes not in the database yet; mount the volume there (or take it over "
		    "with ferry mount --takeover) and unmount it first", cur.holder,
		    ms_to_s(cur.now_ms - cur.expires_ms));
	else if (rc < 0)
		say(err, errlen, "cannot take the volume's lease: %s", strerror(-rc));
	if (rc == 0) {
		h->lease = true;
		clock_gettime(CLOCK_MONOTONIC, &h->renewed);
	}
	return rc;
}

/* Keeps a dump's lease while it runs. */
static int hold_renew(struct meta *m, struct hold *h, char *err, size_t errlen)
{
	struct timespec now;
	int rc;

	if (!h->lease)
		return 0;
	clock_gettime(CLOCK_MONOTONIC, &now);
	if ((now.tv_sec - h->renewed.tv_sec) * 1000 < DUMP_LEASE_MS / 3)
		return 0;
	rc = meta_lease_renew(m, DUMP_LEASE_MS);
	if (rc < 0)
		say(err, errlen, "the volume's lease was lost during the dump: %s", strerror(-rc));
	h->renewed = now;
	return rc;
}

static void volume_unhold(struct meta *m, struct hold *h)
{
	if (h->lease)
		meta_lease_release(m);
	if (h->lock >= 0)
		close(h->lock);
}

/* ---- dump ---- */

/* The value of column i of st's row into o under col's name. */
static int value_put(struct db_stmt *st, int i, const struct dump_col *col, json_object *o,
		     char *err, size_t errlen)
{
	const unsigned char *p;
	size_t n;
	char key[80];
	char *hex;

	switch (st->drv->col_type(st, i)) {
	case DB_INT:
		json_object_object_add(o, col->name, json_object_new_int64(st->drv->col_i64(st, i)));
		return 0;
	case DB_NULL:
		json_object_object_add(o, col->name, NULL);
		return 0;
	case DB_TEXT:
	case DB_BLOB:
		p = st->drv->col_blob(st, i, &n);
		if (!p)
			p = (const unsigned char *)"";
		if (utf8_text(p, n)) {
			json_object_object_add(o, col->name,
					       json_object_new_string_len((const char *)p, (int)n));
			return 0;
		}
		snprintf(key, sizeof(key), "%s@hex", col->name);
		if (!(hex = hex_encode(p, n)))
			return -ENOMEM;
		json_object_object_add(o, key, json_object_new_string(hex));
		free(hex);
		return 0;
	default: /* a REAL: no column of ours holds one */
		say(err, errlen, "%s holds a value of a type ferry never writes", col->name);
		return -EIO;
	}
}

/* One row of st as a record of table t. */
static int row_write(struct db_stmt *st, const struct dump_table *t, FILE *out, char *err,
		     size_t errlen)
{
	json_object *o = json_object_new_object();
	int rc = 0;

	if (!o)
		return -ENOMEM;
	json_object_object_add(o, "t", json_object_new_string(t->table));
	for (int i = 0; t->cols[i].name && rc == 0; i++)
		rc = value_put(st, i, &t->cols[i], o, err, errlen);
	if (rc == 0 &&
	    fprintf(out, "%s\n", json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN |
								  JSON_C_TO_STRING_NOSLASHESCAPE)) < 0) {
		rc = errno ? -errno : -EIO;
		say(err, errlen, "cannot write the dump: %s", strerror(errno));
	}
	json_object_put(o);
	return rc;
}

/* The key of the last row read, kept to start the next page after it. */
struct key {
	int64_t i[MAX_KEY];
	unsigned char *p[MAX_KEY]; /* owned; a blob's bytes */
	size_t n[MAX_KEY];
};

static int key_keep(struct db_stmt *st, const struct dump_table *t, struct key *k)
{
	for (int i = 0; i < t->nkey; i++) {
		const void *p;
		size_t n;

		if (t->cols[i].type == 'i') {
			k->i[i] = st->drv->col_i64(st, i);
			continue;
		}
		p = st->drv->col_blob(st, i, &n);
		free(k->p[i]);
		k->p[i] = malloc(n + 1);
		if (!k->p[i])
			return -ENOMEM;
		if (n)
			memcpy(k->p[i], p, n);
		k->n[i] = n;
	}
	return 0;
}

static int key_bind(struct db_stmt *st, const struct dump_table *t, const struct key *k)
{
	int rc = 0;

	for (int i = 0; i < t->nkey && rc == 0; i++)
		rc = t->cols[i].type == 'i' ? st->drv->bind_i64(st, i + 1, k->i[i]) :
					      st->drv->bind_blob(st, i + 1, k->p[i], k->n[i]);
	return rc;
}

/* SELECT of t's columns in key order, a page at a time; after: from the
 * row past the bound key (?1, ?2). */
static int select_sql(const struct dump_table *t, bool after, char *sql, size_t size,
		      char *params)
{
	size_t len = (size_t)snprintf(sql, size, "SELECT ");

	for (int i = 0; t->cols[i].name && len < size; i++)
		len += (size_t)snprintf(sql + len, size - len, "%s%s", i ? ", " : "", t->cols[i].name);
	if (len < size)
		len += (size_t)snprintf(sql + len, size - len, " FROM %s", t->table);
	for (int i = 0; after && i < t->nkey && len < size; i++) {
		len += (size_t)snprintf(sql + len, size - len, "%s%s", i ? ", " : " WHERE (",
					t->cols[i].name);
		params[i] = t->cols[i].type == 'i' ? 'i' : 'b';
	}
	params[after ? t->nkey : 0] = '\0';
	for (int i = 0; after && i < t->nkey && len < size; i++)
		len += (size_t)snprintf(sql + len, size - len, "%s?%d", i ? ", " : ") > (", i + 1);
	if (after && len < size)
		len += (size_t)snprintf(sql + len, size - len, ")");
	for (int i = 0; i < t->nkey && len < size; i++)
		len += (size_t)snprintf(sql + len, size - len, "%s%s", i ? ", " : " ORDER BY ",
					t->cols[i].name);
	if (len < size)
		len += (size_t)snprintf(sql + len, size - len, " LIMIT %d", PAGE_ROWS);
	return len < size ? 0 : -ENAMETOOLONG;
}

static int dump_table(struct meta *m, struct hold *h, struct conn *c, const struct dump_table *t,
		      FILE *out, uint64_t *records, char *err, size_t errlen)
{
	struct db_stmt *first = NULL, *next = NULL, *st;
	struct key k = { 0 };
	char sql[512], params[MAX_KEY + 1];
	int rc, rows;

	if ((rc = select_sql(t, false, sql, sizeof(sql), params)) < 0 ||
	    (rc = c->drv->stmt_new(c, sql, params, &first)) < 0 ||
	    (rc = select_sql(t, true, sql, sizeof(sql), params)) < 0 ||
	    (rc = c->drv->stmt_new(c, sql, params, &next)) < 0) {
		say_db(c, err, errlen, t->table);
		goto out;
	}
	st = first;
	do {
		rows = 0;
		while ((rc = st->drv->step(st)) == 1) {
			if ((rc = row_write(st, t, out, err, errlen)) < 0)
				goto out;
			(*records)++;
			rows++;
			if (rows == PAGE_ROWS && (rc = key_keep(st, t, &k)) < 0)
				goto out;
		}
		if (rc < 0) {
			say_db(c, err, errlen, t->table);
			goto out;
		}
		st->drv->done(st);
		if ((rc = hold_renew(m, h, err, errlen)) < 0)
			goto out;
		st = next;
		if (rows == PAGE_ROWS && (rc = key_bind(st, t, &k)) < 0)
			goto out;
	} while (rows == PAGE_ROWS);
	rc = 0;
out:
	c->drv->stmt_free(first);
	c->drv->stmt_free(next);
	for (int i = 0; i < MAX_KEY; i++)
		free(k.p[i]);
	return rc;
}

/* The slice sequence, if the volume has one yet, as a "sequence" record. */
static int dump_sequence(struct meta *m, struct conn *c, FILE *out, uint64_t *records,
			 char *err, size_t errlen)
{
	int64_t seq = 0;
	int rc = query_one(c, m->vol->slice_seq_get_sql, &seq);

	if (rc < 0) {
		say_db(c, err, errlen, "the slice sequence");
		return rc;
	}
	if (rc == 1)
		return 0;
	if (fprintf(out, "{\"t\":\"sequence\",\"name\":\"slice\",\"seq\":%lld}\n", (long long)seq) < 0) {
		say(err, errlen, "cannot write the dump: %s", strerror(errno));
		return errno ? -errno : -EIO;
	}
	(*records)++;
	return 0;
}

/* Begins c's read transaction and takes its snapshot now (the first read
 * does): the volume's uuid into uuid. */
static int snapshot_begin(struct meta *m, struct conn *c, char *uuid, size_t ulen, char *err,
			  size_t errlen)
{
	struct db_stmt *st = NULL;
	size_t len;
	const char *u;
	int rc;

	if ((rc = exec_sql(c, m->vol->snapshot_sql)) < 0 ||
	    (rc = c->drv->stmt_new(c, "SELECT uuid FROM volume", "", &st)) < 0 ||
	    (rc = c->drv->step(st)) != 1 || c->drv->col_type(st, 0) != DB_TEXT) {
		say_db(c, err, errlen, "cannot read the volume record");
		c->drv->stmt_free(st);
		return rc < 0 ? rc : -EIO;
	}
	u = c->drv->col_blob(st, 0, &len);
	snprintf(uuid, ulen, "%.*s", (int)(len < 40 ? len : 40), u ? u : "");
	c->drv->stmt_free(st);
	return 0;
}

/* The stream from c's snapshot: header, tables, sequence, end. */
static int dump_snapshot(struct meta *m, struct hold *h, struct conn *c, const char *uuid,
			 bool checkpoint, FILE *out, uint64_t *records, char *err, size_t errlen)
{
	uint64_t n = 0;
	int rc;

	if (fprintf(out, "{\"ferry_dump\":%d,\"schema\":%d,\"engine\":\"%s\",\"volume\":\"%s\"}\n",
		    META_DUMP_VERSION, META_SCHEMA_VERSION, m->drv->name, uuid) < 0) {
		rc = errno ? -errno : -EIO;
		say(err, errlen, "cannot write the dump: %s", strerror(errno));
		return rc;
	}
	for (size_t i = 0; i < SEQUENCE; i++) {
		/* A checkpoint's volume keeps none of the origin's checkpoints
		 * (meta_restore_adopt): they would only grow each dump. */
		if (checkpoint && !strncmp(tables[i].table, "checkpoint", 10))
			continue;
		if ((rc = dump_table(m, h, c, &tables[i], out, &n, err, errlen)) < 0)
			return rc;
	}
	if ((rc = dump_sequence(m, c, out, &n, err, errlen)) < 0)
		return rc;
	if (fprintf(out, "{\"t\":\"end\",\"records\":%llu}\n", (unsigned long long)n) < 0 ||
	    fflush(out) != 0) {
		rc = errno ? -errno : -EIO;
		say(err, errlen, "cannot write the dump: %s", strerror(errno));
		return rc;
	}
	if (records)
		*records = n;
	return 0;
}

/* Ends c's transaction (it only read, or failed) and frees it. */
static void conn_end(struct conn *c)
{
	if (!c)
		return;
	if (c->drv->txn_open(c))
		exec_sql(c, "ROLLBACK");
	c->drv->conn_free(c);
}

int meta_dump(const char *loc, FILE *out, uint64_t *records, char *err, size_t errlen)
{
	struct hold h = { .lock = -1 };
	struct meta *m = NULL;
	struct conn *c = NULL;
	char uuid[64] = "";
	int rc;

	rc = volume_hold(loc, &m, &h, err, errlen);
	if (rc < 0)
		goto out;
	rc = m->drv->conn_open(m, &c);
	if (rc < 0) {
		say(err, errlen, "cannot connect to %s: %s", loc, strerror(-rc));
		goto out;
	}
	/* One read transaction: every table from the same instant. */
	rc = snapshot_begin(m, c, uuid, sizeof(uuid), err, errlen);
	if (rc == 0)
		rc = dump_snapshot(m, &h, c, uuid, false, out, records, err, errlen);
out:
	conn_end(c);
	if (m)
		volume_unhold(m, &h);
	else if (h.lock >= 0)
		close(h.lock);
	meta_close(m);
	return rc;
}

/* ---- load ---- */

/* The values a record binds and frees after its step. */
struct bound {
	void *buf[MAX_COLS]; /* owned: decoded hex */
	int n;
};

static void bound_free(struct bound *b)
{
	for (int i = 0; i < b->n; i++)
		free(b->buf[i]);
	b->n = 0;
}

/* An entry's name as the engine takes one (meta_rules.c): 1 to 255 bytes,
 * no '/' or NUL, not "." or "..". */
static bool name_ok(const char *p, size_t n)
{
	return n >= 1 && n <= 255 && !memchr(p, '/', n) && !memchr(p, 0, n) &&
	       !(n == 1 && p[0] == '.') && !(n == 2 && p[0] == '.' && p[1] == '.');
}

/* Binds the bytes of col, parameter i, after checking them. */
static int bytes_bind(struct db_stmt *st, int i, const struct dump_col *col, const char *p,
		      size_t n, char *why, size_t whylen)
{
	if (col->type == 'n' && !name_ok(p, n)) {
		say(why, whylen, "an entry's name out of range (empty, '.', '..', a '/' or NUL, "
		    "over 255 bytes)");
		return -EINVAL;
	}
	if (col->type == 'z' && memchr(p, 0, n)) {
		say(why, whylen, "%s holds a NUL byte", col->name);
		return -EINVAL;
	}
	if (col->type == 't') {
		if (memchr(p, 0, n) || !utf8_text((const unsigned char *)p, n)) {
			say(why, whylen, "%s is not UTF-8 text", col->name);
			return -EINVAL;
		}
		return st->drv->bind_text(st, i, p) ? -EIO : 0;
	}
	return st->drv->bind_blob(st, i, p, n) ? -EIO : 0;
}

/* Binds the record's values to st: every column there (null only where
 * the column allows it), nothing else. The record and b hold what was
 * bound until st has run. */
static int record_bind(const struct dump_table *t, struct db_stmt *st, json_object *o,
		       struct bound *b, char *why, size_t whylen)
{
	int used = 1; /* "t" */

	for (int i = 0; t->cols[i].name; i++) {
		const struct dump_col *col = &t->cols[i];
		char key[80];
		json_object *v = NULL;
		int rc;

		if (json_object_object_get_ex(o, col->name, &v)) {
			used++;
			if (v == NULL) {
				if (!col->null_ok) {
					say(why, whylen, "%s is null", col->name);
					return -EINVAL;
				}
				continue; /* bound null */
			}
			if (json_object_is_type(v, json_type_int)) {
				int64_t x = json_object_get_int64(v);

				if (col->type != 'i') {
					say(why, whylen, "%s is a number, not text", col->name);
					return -EINVAL;
				}
				/* json-c clamps what is past int64 to its ends */
				if ((x == INT64_MAX && json_object_get_uint64(v) != (uint64_t)INT64_MAX) ||
				    (x == INT64_MIN && strcmp(json_object_get_string(v), "-9223372036854775808"))) {
					say(why, whylen, "%s is out of range", col->name);
					return -EINVAL;
				}
				if (st->drv->bind_i64(st, i + 1, x))
					return -EIO;
			} else if (json_object_is_type(v, json_type_string)) {
				if (col->type == 'i') {
					say(why, whylen, "%s is text, not a number", col->name);
					return -EINVAL;
				}
				rc = bytes_bind(st, i + 1, col, json_object_get_string(v),
						(size_t)json_object_get_string_len(v), why, whylen);
				if (rc)
					return rc;
			} else {
				say(why, whylen, "%s is neither a number, text nor null", col->name);
				return -EINVAL;
			}
			continue;
		}
		snprintf(key, sizeof(key), "%s@hex", col->name);
		if (json_object_object_get_ex(o, key, &v) && json_object_is_type(v, json_type_string)) {
			unsigned char *p;
			size_t n;

			used++;
			if (col->type == 'i' || hex_decode(json_object_get_string(v),
							   (size_t)json_object_get_string_len(v), &p, &n) < 0) {
				say(why, whylen, "%s is not hex of a text or blob column", key);
				return -EINVAL;
			}
			b->buf[b->n++] = p;
			rc = bytes_bind(st, i + 1, col, (const char *)p, n, why, whylen);
			if (rc)
				return rc;
			continue;
		}
		say(why, whylen, "no %s", col->name);
		return -EINVAL;
	}
	if (used != json_object_object_length(o)) {
		say(why, whylen, "fields this table does not have");
		return -EINVAL;
	}
	return 0;
}

/* What makes the rows a file system that ferry-mountd can use: queries
 * that must all find nothing, in SQL both engines run (the bytes of names
 * and targets are checked as they are read: record_bind). They hold the rows to what the engine
 * itself writes and checks as it reads (meta_rules.c: row_attr, names,
 * SYMLINK_MAX, chunk bounds), so a stream that was edited, or made by
 * hand, cannot load a volume that fails later (EIO on a readdir, a create
 * that collides with a cookie, a collector told to delete a live slice). */
#define FT "(mode & 61440)"
#define DIR_T "16384"
#define BIG "4611686018427387904" /* 2^62: far past any counter's reach */
static const struct {
	const char *sql, *what;
} load_checks[] = {
	{ "SELECT 1 WHERE (SELECT count(*) FROM volume) != 1 OR (SELECT count(*) FROM counters) != 1",
	  "not exactly one volume and one counters record" },
	{ "SELECT 1 FROM counters WHERE next_ino < 2 OR next_ino > " BIG " OR next_slice < 1"
	  " OR next_slice > " BIG " OR next_cookie < 1 OR next_cookie > " BIG,
	  "counters out of range" },
	{ "SELECT 1 FROM volume WHERE block_size < 4096 OR block_size > 67108864"
	  " OR block_size % 4096 != 0 OR length(storage_url) = 0",
	  "a volume record out of range" },
	{ "SELECT 1 WHERE NOT EXISTS (SELECT 1 FROM inode WHERE ino = 1 AND " FT " = " DIR_T ")",
	  "no root directory (inode 1)" },
	{ "SELECT 1 FROM inode WHERE ino < 1 OR ino >= (SELECT next_ino FROM counters)"
	  " OR " FT " NOT IN (4096, 8192, 16384, 24576, 32768, 40960, 49152)"
	  " OR mode < 0 OR mode > 65535 OR uid < 0 OR uid > 4294967295 OR gid < 0"
	  " OR gid > 4294967295 OR rdev < 0 OR nlink < 0 OR nlink > 4294967295"
	  " OR size < 0 OR size > 288230376151711744"
	  " OR atime_nsec NOT BETWEEN 0 AND 999999999 OR mtime_nsec NOT BETWEEN 0 AND 999999999"
	  " OR ctime_nsec NOT BETWEEN 0 AND 999999999 OR (" FT " = " DIR_T " AND size != 0) LIMIT 1",
	  "an inode out of range (number, type, ids, size or times)" },
	{ "SELECT 1 FROM dentry WHERE length(name) NOT BETWEEN 1 AND 255"
	  " OR cookie < 1 OR cookie >= (SELECT next_cookie FROM counters) LIMIT 1",
	  "an entry's name or cookie out of range (empty, '.', '..', a '/' or NUL, "
	  "over 255 bytes; a cookie the counters would give again)" },
	{ "SELECT 1 FROM dentry d LEFT JOIN inode i ON i.ino = d.ino WHERE i.ino IS NULL LIMIT 1",
	  "an entry names an inode that is not there" },
	{ "SELECT 1 FROM dentry d LEFT JOIN inode p ON p.ino = d.parent"
	  " WHERE p.ino IS NULL OR (p.mode & 61440) != " DIR_T " LIMIT 1",
	  "an entry's parent is not a directory" },
	{ "SELECT 1 FROM inode i WHERE " FT " = " DIR_T " AND (SELECT count(*) FROM dentry d"
	  " WHERE d.ino = i.ino) != CASE WHEN i.ino = 1 THEN 0 ELSE 1 END LIMIT 1",
	  "a directory with no entry or more than one (or an entry for the root)" },
	/* An anti-join, not NOT IN: PostgreSQL checks NOT IN of a subquery
	 * larger than work_mem row by row (hours at a million inodes). */
	{ "WITH RECURSIVE r(ino) AS (SELECT CAST(1 AS BIGINT) UNION SELECT d.ino FROM dentry d JOIN r"
	  " ON d.parent = r.ino) SELECT 1 FROM inode i LEFT JOIN r ON r.ino = i.ino"
	  " LEFT JOIN orphan o ON o.ino = i.ino WHERE r.ino IS NULL AND o.ino IS NULL LIMIT 1",
	  "an inode neither reachable from the root nor an orphan (a cycle?)" },
	{ "SELECT 1 FROM inode i WHERE " FT " != " DIR_T " AND i.nlink != (SELECT count(*)"
	  " FROM dentry d WHERE d.ino = i.ino) LIMIT 1",
	  "a file whose link count is not its number of entries" },
	{ "SELECT 1 FROM inode i WHERE " FT " = " DIR_T " AND i.nlink != 2 + (SELECT count(*)"
	  " FROM dentry d JOIN inode c ON c.ino = d.ino WHERE d.parent = i.ino"
	  " AND (c.mode & 61440) = " DIR_T ") LIMIT 1",
	  "a directory whose link count is not 2 and its subdirectories" },
	{ "SELECT 1 FROM orphan o LEFT JOIN inode i ON i.ino = o.ino WHERE i.ino IS NULL"
	  " OR i.nlink != 0 LIMIT 1",
	  "an orphan that is not an unlinked inode" },
	{ "SELECT 1 FROM symlink s LEFT JOIN inode i ON i.ino = s.ino WHERE i.ino IS NULL"
	  " OR (i.mode & 61440) != 40960 OR length(s.target) NOT BETWEEN 1 AND 4095"
	  " OR i.size != length(s.target) LIMIT 1",
	  "a symlink target out of range or of an inode that is not a symlink" },
	{ "SELECT 1 FROM inode i WHERE " FT " = 40960 AND NOT EXISTS (SELECT 1 FROM symlink s"
	  " WHERE s.ino = i.ino) LIMIT 1",
	  "a symlink without a target" },
	{ "SELECT 1 FROM xattr x LEFT JOIN inode i ON i.ino = x.ino WHERE i.ino IS NULL"
	  " OR length(x.name) NOT BETWEEN 1 AND 255"
	  " OR length(x.value) > 65536 LIMIT 1",
	  "an xattr out of range or of an inode that is not there" },
	{ "SELECT 1 FROM slice s LEFT JOIN inode i ON i.ino = s.ino WHERE i.ino IS NULL"
	  " OR (i.mode & 61440) != 32768 OR s.seq < 1 OR s.chunk < 0 OR s.chunk > 4294967295"
	  " OR s.id < 0 OR s.id >= (SELECT next_slice FROM counters) OR s.size < 0"
	  " OR s.size > 67108864 OR s.off < 0 OR s.pos < 0 OR s.len < 1"
	  " OR s.pos + s.len > 67108864 OR (s.id != 0 AND s.off + s.len > s.size) LIMIT 1",
	  "a slice out of range or of an inode that is not a regular file" },
	{ "SELECT 1 FROM gc_slice g WHERE g.id < 1 OR g.id >= (SELECT next_slice FROM counters)"
	  " OR g.size < 0 OR EXISTS (SELECT 1 FROM slice s WHERE s.id = g.id) LIMIT 1",
	  "a freed slice that a file still uses (or out of range)" },
	{ "SELECT 1 WHERE EXISTS (SELECT 1 FROM journal WHERE seq < 0 OR seq > " BIG ")"
	  " OR EXISTS (SELECT 1 FROM commit_seq WHERE seq < 0 OR seq > " BIG ")"
	  " OR EXISTS (SELECT 1 FROM times_seq WHERE seq < 0 OR seq > " BIG ")"
	  " OR EXISTS (SELECT 1 FROM seq_epoch WHERE epoch < 0 OR epoch > 1073741824)",
	  "a journal, commit or epoch number out of range" },
};


static int load_check(struct conn *c, char *err, size_t errlen)
{
	for (size_t i = 0; i < sizeof(load_checks) / sizeof(load_checks[0]); i++) {
		int64_t v;
		int rc = query_one(c, load_checks[i].sql, &v);

		if (rc < 0) {
			say_db(c, err, errlen, "cannot check the loaded volume");
			return rc;
		}
		if (rc == 0) {
			say(err, errlen, "not a file system: %s", load_checks[i].what);
			return -EINVAL;
		}
	}
	return 0;
}

/* One line as one JSON object, strictly: no trailing text, no NUL inside,
 * none of json-c's leniencies (single quotes, trailing commas). NULL if
 * the line is not that. */
static json_object *parse_line(const char *line, size_t len)
{
	json_tokener *tok;
	json_object *o;

	if (len > LINE_MAX_BYTES || memchr(line, 0, len))
		return NULL;
	tok = json_tokener_new();
	if (!tok)
		return NULL;
	json_tokener_set_flags(tok, JSON_TOKENER_STRICT);
	o = json_tokener_parse_ex(tok, line, (int)len);
	if (o && (json_tokener_get_error(tok) != json_tokener_success ||
		  json_tokener_get_parse_end(tok) != len || !json_object_is_type(o, json_type_object))) {
		json_object_put(o);
		o = NULL;
	}
	json_tokener_free(tok);
	return o;
}

/* The header: {"ferry_dump":1,"schema":N,...}; fills uuid. */
static int load_header(const char *line, char uuid[37], char *err, size_t errlen)
{
	size_t len = strlen(line);
	json_object *o, *x;

	if (len > 0 && line[len - 1] == '\n')
		len--;
	o = parse_line(line, len);
	int rc = -EINVAL;

	if (!o || !json_object_is_type(o, json_type_object) ||
	    !json_object_object_get_ex(o, "ferry_dump", &x) || !json_object_is_type(x, json_type_int)) {
		say(err, errlen, "line 1: not a ferry dump");
		goto out;
	}
	if (json_object_get_int64(x) != META_DUMP_VERSION) {
		say(err, errlen, "line 1: a dump of stream version %lld; this ferry reads %d",
		    (long long)json_object_get_int64(x), META_DUMP_VERSION);
		goto out;
	}
	if (!json_object_object_get_ex(o, "schema", &x) || !json_object_is_type(x, json_type_int) ||
	    json_object_get_int64(x) != META_SCHEMA_VERSION) {
		say(err, errlen, "line 1: a dump of metadata schema %s; this ferry knows %d",
		    x ? json_object_get_string(x) : "(none)", META_SCHEMA_VERSION);
		goto out;
	}
	if (!json_object_object_get_ex(o, "volume", &x) || !json_object_is_type(x, json_type_string) ||
	    json_object_get_string_len(x) != 36) {
		say(err, errlen, "line 1: no volume uuid");
		goto out;
	}
	memcpy(uuid, json_object_get_string(x), 36);
	uuid[36] = '\0';
	rc = 0;
out:
	json_object_put(o);
	return rc;
}

struct load {
	FILE *in;
	char uuid[37]; /* the header's */
	bool have_seq; /* a "sequence" record came, with seq */
	int64_t seq;
	uint64_t records;
	char *err;
	size_t errlen;
};

/* The sequence record: {"t":"sequence","name":"slice","seq":N}. */
static int sequence_take(struct load *l, json_object *o, char *why, size_t whylen)
{
	json_object *name, *seq;

	if (!json_object_object_get_ex(o, "name", &name) || !json_object_is_type(name, json_type_string) ||
	    strcmp(json_object_get_string(name), "slice") != 0 ||
	    !json_object_object_get_ex(o, "seq", &seq) || !json_object_is_type(seq, json_type_int) ||
	    json_object_object_length(o) != 3 || l->have_seq) {
		say(why, whylen, "not the slice sequence");
		return -EINVAL;
	}
	l->seq = json_object_get_int64(seq);
	if (l->seq < 1 || l->seq > BIG_NUM) {
		say(why, whylen, "seq is out of range");
		return -EINVAL;
	}
	l->have_seq = true;
	return 0;
}

/* INSERT of every column of t. */
static int insert_new(struct conn *c, const struct dump_table *t, struct db_stmt **out)
{
	char sql[512], params[MAX_COLS + 1];
	size_t len = (size_t)snprintf(sql, sizeof(sql), "INSERT INTO %s(", t->table);
	int n = ncols(t);

	for (int i = 0; i < n && len < sizeof(sql); i++) {
		len += (size_t)snprintf(sql + len, sizeof(sql) - len, "%s%s", i ? ", " : "",
					t->cols[i].name);
		params[i] = t->cols[i].type == 'i' ? 'i' : t->cols[i].type == 't' ? 't' : 'b';
	}
	params[n] = '\0';
	for (int i = 0; i < n && len < sizeof(sql); i++)
		len += (size_t)snprintf(sql + len, sizeof(sql) - len, "%s?%d",
					i ? ", " : ") VALUES (", i + 1);
	if (len < sizeof(sql))
		len += (size_t)snprintf(sql + len, sizeof(sql) - len, ")");
	if (len >= sizeof(sql))
		return -ENAMETOOLONG;
	return c->drv->stmt_new(c, sql, params, out);
}

/* Loads the records after the header into c's transaction. */
static int load_records(struct load *l, struct conn *c)
{
	struct db_stmt *ins[NTABLES] = { 0 };
	char *line = NULL, why[256], *err = l->err;
	size_t cap = 0, next = 0, errlen = l->errlen; /* tables come in order: next is the earliest allowed */
	uint64_t lineno = 1, n = 0;
	bool ended = false;
	ssize_t len;
	int rc = 0;

	while ((len = getline(&line, &cap, l->in)) >= 0) {
		struct bound b = { .n = 0 };
		json_object *o, *t;
		char name[64];
		size_t k;

		lineno++;
		if (ended) {
			say(err, errlen, "line %llu: records after the end record",
			    (unsigned long long)lineno);
			rc = -EINVAL;
			goto out;
		}
		if (len > 0 && line[len - 1] == '\n')
			line[--len] = '\0';
		o = parse_line(line, (size_t)len);
		if (!o ||
		    !json_object_object_get_ex(o, "t", &t) || !json_object_is_type(t, json_type_string)) {
			json_object_put(o);
			say(err, errlen, "line %llu: not a record", (unsigned long long)lineno);
			rc = -EINVAL;
			goto out;
		}
		/* A copy: the record goes before the messages that name it. */
		snprintf(name, sizeof(name), "%s", json_object_get_string(t));
		if (strcmp(name, "end") == 0) {
			json_object *x;

			ended = json_object_object_get_ex(o, "records", &x) &&
				json_object_is_type(x, json_type_int) &&
				(uint64_t)json_object_get_int64(x) == n;
			json_object_put(o);
			if (!ended) {
				say(err, errlen, "line %llu: the end record does not count the %llu records "
				    "before it", (unsigned long long)lineno, (unsigned long long)n);
				rc = -EINVAL;
				goto out;
			}
			continue;
		}
		for (k = next; k < NTABLES && strcmp(tables[k].table, name) != 0; k++)
			;
		if (k == NTABLES) {
			json_object_put(o);
			say(err, errlen, "line %llu: a record of table %s, unknown or out of order",
			    (unsigned long long)lineno, name);
			rc = -EINVAL;
			goto out;
		}
		next = k;
		if (k == SEQUENCE) {
			rc = sequence_take(l, o, why, sizeof(why));
		} else if (!ins[k] && (rc = insert_new(c, &tables[k], &ins[k])) < 0) {
			say_db(c, why, sizeof(why), "cannot load it");
		} else {
			rc = record_bind(&tables[k], ins[k], o, &b, why, sizeof(why));
			if (rc == 0 && (rc = ins[k]->drv->step(ins[k])) != 0) {
				say_db(c, why, sizeof(why), "cannot load it");
				rc = -EINVAL;
			}
			ins[k]->drv->done(ins[k]);
		}
		json_object_put(o);
		bound_free(&b);
		if (rc < 0) {
			say(err, errlen, "line %llu (%s): %s", (unsigned long long)lineno, name, why);
			goto out;
		}
		n++;
	}
	if (ferror(l->in)) {
		say(err, errlen, "cannot read the dump: %s", strerror(errno));
		rc = -EIO;
		goto out;
	}
	if (!ended) {
		say(err, errlen, "the dump ends at line %llu without its end record (cut short?)",
		    (unsigned long long)lineno);
		rc = -EINVAL;
		goto out;
	}
	l->records = n;
	rc = 0;
out:
	for (size_t i = 0; i < NTABLES; i++)
		c->drv->stmt_free(ins[i]);
	free(line);
	return rc;
}

/* The slice sequence as the dump had it (never below the slices' seqs),
 * or after the slices when it had none. */
static int load_sequence(struct meta *m, struct load *l, struct conn *c)
{
	int64_t max = 0, seq;
	int rc = query_one(c, "SELECT coalesce(max(seq), 0) FROM slice", &max);

	if (rc != 0) {
		say_db(c, l->err, l->errlen, "cannot read the slices");
		return rc < 0 ? rc : -EIO;
	}
	if (l->have_seq && l->seq < max) {
		say(l->err, l->errlen, "not a file system: a slice sequence below the slices'");
		return -EINVAL;
	}
	seq = l->have_seq ? l->seq : max;
	for (int i = 0; i < 2 && seq > 0 && m->vol->slice_seq_set_sql[i]; i++) {
		const char *sql = m->vol->slice_seq_set_sql[i];
		struct db_stmt *st = NULL;
		bool param = strstr(sql, "?1") != NULL;

		rc = c->drv->stmt_new(c, sql, param ? "i" : "", &st);
		if (rc == 0 && param)
			rc = c->drv->bind_i64(st, 1, seq);
		if (rc == 0 && (rc = c->drv->step(st)) > 0)
			rc = 0;
		if (rc < 0)
			say_db(c, l->err, l->errlen, "cannot set the slice sequence");
		c->drv->stmt_free(st);
		if (rc < 0)
			return rc;
	}
	return 0;
}

/* The uuid the header named is the volume record's. */
static int load_uuid_check(struct load *l, struct conn *c)
{
	struct db_stmt *st = NULL;
	const char *u;
	size_t n = 0;
	int rc = c->drv->stmt_new(c, "SELECT uuid FROM volume", "", &st);

	if (rc == 0 && (rc = c->drv->step(st)) == 1 && (u = c->drv->col_blob(st, 0, &n)) &&
	    n == 36 && memcmp(u, l->uuid, 36) == 0)
		rc = 0;
	else if (rc >= 0) {
		say(l->err, l->errlen, "not a file system: the volume record is not the volume the "
		    "header names (%s)", l->uuid);
		rc = -EINVAL;
	}
	c->drv->stmt_free(st);
	return rc;
}

/* The new volume's rows, in the transaction that makes its schema. */
static int load_fill(struct conn *c, void *arg)
{
	struct load *l = arg;
	int rc;

	/* The schema comes with a journal record of its own: the dump's
	 * replaces it. */
	rc = exec_sql(c, "DELETE FROM journal");
	if (rc < 0) {
		say_db(c, l->err, l->errlen, "cannot write the new volume");
		return rc;
	}
	if ((rc = load_records(l, c)) < 0 || (rc = load_sequence(c->m, l, c)) < 0 ||
	    (rc = load_check(c, l->err, l->errlen)) < 0 || (rc = load_uuid_check(l, c)) < 0)
		return rc;
	return 0;
}

/* Removes a volume's database and the files beside it; .lock too when
 * with_lock. */
static void volume_remove(const char *db_path, bool with_lock)
{
	static const char *const sfx[] = { "", "-wal", "-shm", "-journal", META_JOURNAL_SUFFIX,
					   "-intent", ".lock" };
	char p[PATH_MAX];

	for (size_t i = 0; i < sizeof(sfx) / sizeof(sfx[0]); i++) {
		if (!with_lock && strcmp(sfx[i], ".lock") == 0)
			continue;
		if (snprintf(p, sizeof(p), "%s%s", db_path, sfx[i]) < (int)sizeof(p))
			unlink(p);
	}
}

/* The loaded volume opens (schema, volume record). */
static int volume_opens(const char *loc, char *err, size_t errlen)
{
	struct meta *m = NULL;
	int rc = meta_open(loc, &m);

	if (rc < 0)
		say(err, errlen, "the loaded volume does not open: %s", strerror(-rc));
	meta_close(m);
	return rc;
}

/* A PostgreSQL volume is made whole in one transaction, schema and rows:
 * a load that fails, or is cut off, leaves no schema behind. */
static int load_pg(struct load *l, const char *url)
{
	int rc = meta_format_with(url, 0, load_fill, l);

	if (rc == -EEXIST)
		say(l->err, l->errlen, "%s already holds a volume", url);
	else if (rc < 0 && !l->err[0])
		say(l->err, l->errlen, "cannot create %s: %s", url, strerror(-rc));
	return rc < 0 ? rc : volume_opens(url, l->err, l->errlen);
}

int meta_load(FILE *in, const char *loc, uint64_t *records, char *err, size_t errlen)
{
	struct load l = { .in = in, .err = err, .errlen = errlen };
	char *line = NULL, tmp[PATH_MAX];
	size_t cap = 0;
	bool placed = false, pg = meta_url_is_pg(loc);
	struct stat st;
	int lock = -1, rc;

	if (err && errlen)
		err[0] = '\0';
	/* A SQLite volume is built aside and renamed into place once whole and
	 * checked: a load that fails or is killed leaves no volume at loc (a
	 * leftover loc.load.PID is not one). Its lock is held throughout, as
	 * ferry-mountd holds it, so nothing mounts the path meanwhile. */
	if (!pg) {
		if (snprintf(tmp, sizeof(tmp), "%s.load.%d", loc, (int)getpid()) >= (int)sizeof(tmp))
			return -ENAMETOOLONG;
		if (stat(loc, &st) == 0) {
			say(err, errlen, "%s already holds a volume", loc);
			return -EEXIST;
		}
		lock = volume_lock(loc, err, errlen);
		if (lock < 0)
			return lock;
	}
	if (getline(&line, &cap, in) < 0) {
		say(err, errlen, "the dump is empty");
		rc = -EINVAL;
		goto out;
	}
	if ((rc = load_header(line, l.uuid, err, errlen)) < 0)
		goto out;
	if (pg) {
		rc = load_pg(&l, loc);
		goto out;
	}
	volume_remove(tmp, true);
	rc = meta_format_with(tmp, 0, load_fill, &l);
	if (rc < 0) {
		if (!err[0])
			say(err, errlen, "cannot create %s: %s", tmp, strerror(-rc));
		goto out;
	}
	/* Only the database goes: its WAL is empty (the engine's last close
	 * checkpoints it), and the files beside it belong to its old name. */
	if (renameat2(AT_FDCWD, tmp, AT_FDCWD, loc, RENAME_NOREPLACE) < 0) {
		rc = errno == EEXIST ? -EEXIST : -errno;
		say(err, errlen, "cannot put the volume at %s: %s", loc, strerror(errno));
		goto out;
	}
	placed = true;
	volume_remove(tmp, true);
	rc = volume_opens(loc, err, errlen);
out:
	if (!pg && rc < 0) {
		volume_remove(tmp, true);
		if (placed)
			volume_remove(loc, false);
		else {
			char p[PATH_MAX];

			if (snprintf(p, sizeof(p), "%s.lock", loc) < (int)sizeof(p))
				unlink(p); /* ours: there was no volume here */
		}
	}
	if (rc == 0 && records)
		*records = l.records;
	if (lock >= 0)
		close(lock);
	free(line);
	return rc;
}

/* ---- checkpoints ---- */

bool meta_checkpoint_name_ok(const char *name)
{
	size_t n = strlen(name);

	if (n == 0 || n > META_CHECKPOINT_NAME_MAX || name[0] == '.' || name[0] == '-')
		return false;
	for (size_t i = 0; i < n; i++) {
		char ch = name[i];
		if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
		      ch == '.' || ch == '_' || ch == '-'))
			return false;
	}
	return true;
}

/* Runs sql with one text parameter, ?1 = name; *changed: rows it changed. */
static int exec_named(struct conn *c, const char *sql, const char *name, int64_t *changed)
{
	struct db_stmt *st = NULL;
	int rc = c->drv->stmt_new(c, sql, "t", &st);

	if (rc == 0)
		rc = c->drv->bind_text(st, 1, name);
	if (rc == 0) {
		rc = c->drv->step(st);
		if (rc > 0)
			rc = 0;
	}
	c->drv->stmt_free(st);
	if (rc == 0)
		rc = c->drv->settle(c);
	if (rc == 0 && changed)
		*changed = c->drv->changes(c);
	return rc;
}

struct take {
	struct meta *m;
	const char *name;
	int64_t taken_ms;
	struct conn *r;          /* the snapshot's connection */
	char uuid[64];
	char *err;
	size_t errlen;
};

/* Inside the write transaction: nobody else changes the slices until it
 * ends. The snapshot is taken here, then the same slices are kept. */
static int take_fenced(struct conn *c, void *arg)
{
	struct take *t = arg;
	struct db_stmt *st = NULL;
	char sql[256];
	int64_t n = 0;
	int rc;

	if (t->m->vol->fence_sql && (rc = exec_sql(c, t->m->vol->fence_sql)) < 0) {
		say_db(c, t->err, t->errlen, "cannot fence the slices");
		return rc;
	}
	if ((rc = c->drv->stmt_new(c, "SELECT 1 FROM checkpoint WHERE name = ?1", "t",
					      &st)) == 0 &&
	    (rc = c->drv->bind_text(st, 1, t->name)) == 0)
		rc = c->drv->step(st);
	c->drv->stmt_free(st);
	if (rc == 1) {
		say(t->err, t->errlen, "a checkpoint named %s exists", t->name);
		return -EEXIST;
	}
	if (rc < 0) {
		say_db(c, t->err, t->errlen, "cannot read the checkpoints");
		return rc;
	}
	/* Run again after a busy retry: a new snapshot then. */
	if (t->r->drv->txn_open(t->r))
		exec_sql(t->r, "ROLLBACK");
	rc = snapshot_begin(t->m, t->r, t->uuid, sizeof(t->uuid), t->err, t->errlen);
	if (rc < 0)
		return rc;
	if ((rc = exec_named(c, "INSERT INTO checkpoint_slice(name, id) SELECT DISTINCT ?1, id "
				"FROM slice", t->name, &n)) < 0) {
		say_db(c, t->err, t->errlen, "cannot keep the checkpoint's slices");
		return rc;
	}
	snprintf(sql, sizeof(sql),
		 "INSERT INTO checkpoint(name, taken_ms, slices, bytes) SELECT ?1, %lld, COUNT(*), "
		 "CAST(COALESCE(SUM(size), 0) AS BIGINT) FROM (SELECT DISTINCT id, size FROM slice) s",
		 (long long)t->taken_ms);
	if ((rc = exec_named(c, sql, t->name, NULL)) < 0)
		say_db(c, t->err, t->errlen, "cannot record the checkpoint");
	return rc;
}

static double mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1000.0 + (double)ts.tv_nsec / 1e6;
}

int meta_checkpoint_take(struct meta *m, const char *name, FILE *out, struct meta_checkpoint *cp,
			 uint64_t *records, double *pause_ms, void (*snapshot_begun)(void *arg),
			 void *arg, char *err, size_t errlen)
{
	struct hold h = { .lock = -1 };
	struct take t = { .m = m, .name = name, .err = err, .errlen = errlen };
	struct timespec now;
	double t0;
	int rc;

	if (errlen)
		err[0] = '\0';
	*pause_ms = 0;
	if (!meta_checkpoint_name_ok(name)) {
		say(err, errlen, "bad checkpoint name '%.80s' (1 to %d of A-Z a-z 0-9 . _ -, not "
			"starting with . or -)", name, META_CHECKPOINT_NAME_MAX);
		return -EINVAL;
	}
	clock_gettime(CLOCK_REALTIME, &now);
	t.taken_ms = (int64_t)now.tv_sec * 1000 + now.tv_nsec / 1000000;
	rc = m->drv->conn_open(m, &t.r);
	if (rc < 0) {
		say(err, errlen, "cannot connect to the volume: %s", strerror(-rc));
		return rc;
	}
	t0 = mono_ms();
	rc = meta_txn_settled(m, take_fenced, &t);
	*pause_ms = mono_ms() - t0;
	if (rc < 0) {
		if (!*err)
			say(err, errlen, "cannot take the checkpoint: %s", strerror(-rc));
		goto out;
	}
	if (snapshot_begun)
		snapshot_begun(arg);
	rc = dump_snapshot(m, &h, t.r, t.uuid, true, out, records, err, errlen);
	if (rc < 0) {
		char e2[128];
		meta_checkpoint_drop(m, name, e2, sizeof(e2));
		goto out;
	}
	memset(cp, 0, sizeof(*cp));
	snprintf(cp->name, sizeof(cp->name), "%s", name);
	cp->taken_ms = t.taken_ms;
	rc = meta_checkpoint_list(m, name, NULL, cp, err, errlen);
	if (rc == 0)
		rc = meta_sync(m); /* the checkpoint's rows keep its objects: durable first */
out:
	conn_end(t.r);
	return rc;
}

struct drop {
	const char *name;
	int64_t n;
};

static int drop_rows(struct conn *c, void *arg)
{
	struct drop *d = arg;
	int rc = exec_named(c, "DELETE FROM checkpoint_slice WHERE name = ?1", d->name, NULL);

	if (rc == 0)
		rc = exec_named(c, "DELETE FROM checkpoint WHERE name = ?1", d->name, &d->n);
	return rc;
}

int meta_checkpoint_drop(struct meta *m, const char *name, char *err, size_t errlen)
{
	struct drop d = { .name = name };
	int rc = meta_txn(m, drop_rows, &d);

	if (rc < 0) {
		say(err, errlen, "cannot delete checkpoint %s: %s", name, strerror(-rc));
		return rc;
	}
	if (d.n == 0) {
		say(err, errlen, "no checkpoint named %s", name);
		return -ENOENT;
	}
	return meta_sync(m);
}

int meta_checkpoint_list(struct meta *m, const char *name,
			 int (*cb)(const struct meta_checkpoint *cp, void *arg), void *arg,
			 char *err, size_t errlen)
{
	struct meta_checkpoint one;
	struct db_stmt *st = NULL;
	READ_CONN(c);
	bool found = false;
	int rc;

	rc = meta_read_conn(m, &c);
	if (rc == 0)
		rc = c->drv->stmt_new(c, name ? "SELECT name, taken_ms, slices, bytes FROM checkpoint "
						"WHERE name = ?1" :
						"SELECT name, taken_ms, slices, bytes FROM checkpoint "
						"ORDER BY taken_ms, name",
				      name ? "t" : "", &st);
	if (rc == 0 && name)
		rc = c->drv->bind_text(st, 1, name);
	while (rc == 0 && (rc = c->drv->step(st)) == 1) {
		size_t len;
		const char *p = c->drv->col_blob(st, 0, &len);

		memset(&one, 0, sizeof(one));
		snprintf(one.name, sizeof(one.name), "%.*s", (int)len, p ? p : "");
		one.taken_ms = c->drv->col_i64(st, 1);
		one.slices = (uint64_t)c->drv->col_i64(st, 2);
		one.bytes = (uint64_t)c->drv->col_i64(st, 3);
		found = true;
		rc = cb ? cb(&one, arg) : 0;
		if (!cb)
			*(struct meta_checkpoint *)arg = one;
	}
	if (rc < 0 && c)
		say_db(c, err, errlen, "cannot list the checkpoints");
	if (c)
		c->drv->stmt_free(st);
	if (rc == 0 && name && !found) {
		say(err, errlen, "no checkpoint named %s", name);
		rc = -ENOENT;
	}
	return rc;
}

/* ---- slice ranges, and what gc must keep ---- */

int meta_slice_range_base(struct meta *m, uint64_t *base)
{
	READ_CONN(c);
	int64_t v = 0;
	int rc = meta_read_conn(m, &c);

	if (rc == 0)
		rc = query_one(c, "SELECT base FROM slice_range WHERE id = 1", &v);
	if (rc < 0)
		return rc;
	*base = rc == 1 ? 0 : (uint64_t)v;
	return 0;
}

bool meta_slice_id_ours(uint64_t base, uint64_t id)
{
	return id >= base && id - base < (1ull << META_SLICE_RANGE_BITS);
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

int meta_slices_kept(struct meta *m, int64_t freed_after_s, struct meta_kept *k, char *err,
		     size_t errlen)
{
	struct db_stmt *st = NULL;
	READ_CONN(c);
	size_t cap = 0;
	int64_t v;
	int rc;

	memset(k, 0, sizeof(*k));
	rc = meta_read_conn(m, &c);
	if (rc < 0) {
		say(err, errlen, "cannot read the volume: %s", strerror(-rc));
		return rc;
	}
	if ((rc = meta_slice_range_base(m, &k->base)) < 0 ||
	    (rc = query_one(c, "SELECT next_slice FROM counters WHERE id = 1", &v)) < 0) {
		say_db(c, err, errlen, "cannot read the counters");
		return rc;
	}
	k->next_slice = rc == 0 ? (uint64_t)v : 0;
	rc = c->drv->stmt_new(c, "SELECT id FROM slice UNION SELECT id FROM checkpoint_slice "
				 "UNION SELECT id FROM gc_slice WHERE since > ?1",
			      "i", &st);
	if (rc == 0)
		rc = c->drv->bind_i64(st, 1, freed_after_s);
	while (rc == 0 && (rc = c->drv->step(st)) == 1) {
		if (k->n == cap) {
			size_t ncap = cap ? cap * 2 : 4096;
			uint64_t *nid = realloc(k->ids, ncap * sizeof(*nid));
			if (!nid) {
				rc = -ENOMEM;
				break;
			}
			k->ids = nid;
			cap = ncap;
		}
		k->ids[k->n++] = (uint64_t)c->drv->col_i64(st, 0);
		rc = 0;
	}
	if (rc < 0)
		say_db(c, err, errlen, "cannot list the slices");
	c->drv->stmt_free(st);
	if (rc < 0) {
		free(k->ids);
		memset(k, 0, sizeof(*k));
		return rc;
	}
	qsort(k->ids, k->n, sizeof(*k->ids), cmp_u64);
	return 0;
}

bool meta_kept_has(const struct meta_kept *k, uint64_t id)
{
	size_t lo = 0, hi = k->n;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (k->ids[mid] == id)
			return true;
		if (k->ids[mid] < id)
			lo = mid + 1;
		else
			hi = mid;
	}
	return false;
}

static int forget_freed(struct conn *c, void *arg)
{
	struct db_stmt *st = NULL;
	int rc = c->drv->stmt_new(c, "DELETE FROM gc_slice WHERE since <= ?1 AND NOT EXISTS "
				     "(SELECT 1 FROM checkpoint_slice k WHERE k.id = gc_slice.id)",
				  "i", &st);

	if (rc == 0)
		rc = c->drv->bind_i64(st, 1, *(int64_t *)arg);
	if (rc == 0 && (rc = c->drv->step(st)) > 0)
		rc = 0;
	c->drv->stmt_free(st);
	return rc;
}

int meta_gc_forget_freed(struct meta *m, int64_t freed_before_s)
{
	int rc = meta_txn(m, forget_freed, &freed_before_s);

	return rc < 0 ? rc : meta_sync(m);
}

/* ---- restore ---- */

struct adopt {
	const char *uuid;
	uint64_t base;
};

static int adopt_rows(struct conn *c, void *arg)
{
	struct adopt *a = arg;
	char sql[160];
	int rc;

	/* The origin's checkpoints and garbage are the origin's to keep and
	 * to collect; slices below base are the origin's objects. */
	if ((rc = exec_sql(c, "DELETE FROM checkpoint_slice")) < 0 ||
	    (rc = exec_sql(c, "DELETE FROM checkpoint")) < 0 ||
	    (rc = exec_sql(c, "DELETE FROM gc_slice")) < 0 ||
	    (rc = exec_sql(c, "DELETE FROM slice_range")) < 0)
		return rc;
	snprintf(sql, sizeof(sql), "INSERT INTO slice_range(id, base) VALUES (1, %llu)",
		 (unsigned long long)a->base);
	if ((rc = exec_sql(c, sql)) < 0)
		return rc;
	snprintf(sql, sizeof(sql), "UPDATE counters SET next_slice = %llu WHERE id = 1",
		 (unsigned long long)(a->base ? a->base : 1));
	if ((rc = exec_sql(c, sql)) < 0)
		return rc;
	return exec_named(c, "UPDATE volume SET uuid = ?1 WHERE id = 1", a->uuid, NULL);
}

int meta_restore_adopt(const char *loc, const char *uuid, uint64_t base, char *err,
		       size_t errlen)
{
	struct adopt a = { .uuid = uuid, .base = base };
	struct meta *m = NULL;
	int rc = meta_open(loc, &m);

	if (rc == 0)
		rc = meta_txn(m, adopt_rows, &a);
	if (rc == 0)
		rc = meta_sync(m);
	if (rc < 0)
		say(err, errlen, "cannot make %s a volume of its own: %s", loc, strerror(-rc));
	meta_close(m);
	return rc;
}

/* ---- holding a volume for a tool ---- */

struct meta_hold {
	struct hold h;
};

int meta_hold_open(const char *loc, struct meta **m, struct meta_hold **out, char *err,
		   size_t errlen)
{
	struct meta_hold *mh = calloc(1, sizeof(*mh));
	int rc;

	*m = NULL;
	if (!mh)
		return -ENOMEM;
	mh->h.lock = -1;
	rc = volume_hold(loc, m, &mh->h, err, errlen);
	if (rc < 0) {
		if (mh->h.lock >= 0)
			close(mh->h.lock);
		meta_close(*m);
		*m = NULL;
		free(mh);
		return rc;
	}
	*out = mh;
	return 0;
}

void meta_hold_close(struct meta *m, struct meta_hold *mh)
{
	if (mh)
		volume_unhold(m, &mh->h);
	free(mh);
	meta_close(m);
}
