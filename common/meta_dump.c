/*
 * meta_dump: `ferry dump` and `ferry load` on the SQLite engine. The
 * records are the tables' rows, named by table and column as in the schema
 * (meta_sqlite.c), so a later engine reads and writes the same stream.
 * Generic over the columns (PRAGMA table_info): what a row holds is written
 * and read back as it is, whatever a later schema version adds to a table.
 *
 * A value is a JSON integer, null, or a string; a blob that is not UTF-8
 * text (names are any bytes but '/' and NUL) is written as "COLUMN@hex".
 */
#include "meta_dump.h"

#include <errno.h>
#include <fcntl.h>
#include <json-c/json.h>
#include <limits.h>
#include <sqlite3.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "meta.h"

/* The tables, in the order they are written and loaded; "sequence" is
 * SQLite's record of the highest slice seq ever given (AUTOINCREMENT),
 * after the slices, whose inserts move it. */
static const struct dump_table {
	const char *record; /* the record's "t" */
	const char *table;
} tables[] = {
	{ "volume", "volume" },       { "counters", "counters" },   { "seq_epoch", "seq_epoch" },
	{ "journal", "journal" },     { "inode", "inode" },         { "dentry", "dentry" },
	{ "symlink", "symlink" },     { "xattr", "xattr" },         { "slice", "slice" },
	{ "orphan", "orphan" },       { "commit_seq", "commit_seq" }, { "times_seq", "times_seq" },
	{ "gc_slice", "gc_slice" },   { "delslice", "delslice" },   { "sequence", "sqlite_sequence" },
};
#define NTABLES (sizeof(tables) / sizeof(tables[0]))
#define MAX_COLS 32
/* The longest record line taken: the largest real one is an xattr value of
 * 64 KiB, as 128 KiB of hex. */
#define LINE_MAX_BYTES (1u << 20)

/* A table's columns as the database declares them. */
struct columns {
	int n;
	char *name[MAX_COLS]; /* owned */
	char type[MAX_COLS];  /* 'i' INTEGER, 't' TEXT, 'b' BLOB, '?' none declared */
	bool notnull[MAX_COLS];
	int pk[MAX_COLS];     /* position in the primary key, 0: not in it */
};

static void say(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
}

static void columns_free(struct columns *c)
{
	for (int i = 0; i < c->n; i++)
		free(c->name[i]);
	c->n = 0;
}

/* 0, 1 if the table does not exist, or -errno. */
static int columns_get(sqlite3 *db, const char *table, struct columns *c)
{
	char sql[128];
	sqlite3_stmt *st = NULL;
	int rc = 0;

	c->n = 0;
	snprintf(sql, sizeof(sql), "PRAGMA table_info(%s)", table);
	if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK)
		return -EIO;
	while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
		const char *name = (const char *)sqlite3_column_text(st, 1);
		const char *type = (const char *)sqlite3_column_text(st, 2);

		if (c->n == MAX_COLS || !name || !(c->name[c->n] = strdup(name))) {
			rc = -ENOMEM;
			goto out;
		}
		c->type[c->n] = !type ? '?' : strcasecmp(type, "INTEGER") == 0 ? 'i' :
				strcasecmp(type, "TEXT") == 0 ? 't' : strcasecmp(type, "BLOB") == 0 ? 'b' : '?';
		c->notnull[c->n] = sqlite3_column_int(st, 3) != 0;
		c->pk[c->n] = sqlite3_column_int(st, 5);
		c->n++;
	}
	rc = rc == SQLITE_DONE ? (c->n == 0 ? 1 : 0) : -EIO;
out:
	sqlite3_finalize(st);
	if (rc < 0)
		columns_free(c);
	return rc;
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

/* ---- dump ---- */

static int dump_table(sqlite3 *db, const struct dump_table *t, FILE *out, uint64_t *records,
		      char *err, size_t errlen)
{
	struct columns c;
	char sql[512];
	size_t len;
	sqlite3_stmt *st = NULL;
	int rc = columns_get(db, t->table, &c);

	if (rc == 1)
		return 0; /* not made in this volume (yet): nothing to write */
	if (rc < 0) {
		say(err, errlen, "cannot read the columns of %s", t->table);
		return rc;
	}
	/* In key order: the same volume always gives the same stream. */
	len = (size_t)snprintf(sql, sizeof(sql), "SELECT * FROM \"%s\"", t->table);
	for (int k = 1, any = 0; k <= c.n; k++)
		for (int i = 0; i < c.n; i++)
			if (c.pk[i] == k && len < sizeof(sql))
				len += (size_t)snprintf(sql + len, sizeof(sql) - len, "%s\"%s\"",
							any++ ? ", " : " ORDER BY ", c.name[i]);
	if (len >= sizeof(sql) || sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK) {
		say(err, errlen, "cannot read %s: %s", t->table, sqlite3_errmsg(db));
		rc = -EIO;
		goto out;
	}
	while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
		json_object *o = json_object_new_object();

		if (!o) {
			rc = -ENOMEM;
			goto out;
		}
		json_object_object_add(o, "t", json_object_new_string(t->record));
		for (int i = 0; i < c.n; i++) {
			const unsigned char *p;
			size_t n;
			char key[80];
			char *hex;

			switch (sqlite3_column_type(st, i)) {
			case SQLITE_INTEGER:
				json_object_object_add(o, c.name[i],
						       json_object_new_int64(sqlite3_column_int64(st, i)));
				break;
			case SQLITE_NULL:
				json_object_object_add(o, c.name[i], NULL);
				break;
			case SQLITE_TEXT:
			case SQLITE_BLOB:
				p = sqlite3_column_blob(st, i);
				n = (size_t)sqlite3_column_bytes(st, i);
				if (!p)
					p = (const unsigned char *)"";
				if (utf8_text(p, n)) {
					json_object_object_add(o, c.name[i],
							       json_object_new_string_len((const char *)p,
											  (int)n));
					break;
				}
				snprintf(key, sizeof(key), "%s@hex", c.name[i]);
				if (!(hex = hex_encode(p, n))) {
					json_object_put(o);
					rc = -ENOMEM;
					goto out;
				}
				json_object_object_add(o, key, json_object_new_string(hex));
				free(hex);
				break;
			default: /* a REAL: no column of ours holds one */
				json_object_put(o);
				say(err, errlen, "%s.%s holds a value of a type ferry never writes",
				    t->table, c.name[i]);
				rc = -EIO;
				goto out;
			}
		}
		int w = fprintf(out, "%s\n", json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE));

		json_object_put(o);
		if (w < 0) {
			rc = errno ? -errno : -EIO;
			say(err, errlen, "cannot write the dump: %s", strerror(errno));
			goto out;
		}
		(*records)++;
	}
	if (rc != SQLITE_DONE) {
		say(err, errlen, "cannot read %s: %s", t->table, sqlite3_errmsg(db));
		rc = -EIO;
		goto out;
	}
	rc = 0;
out:
	sqlite3_finalize(st);
	columns_free(&c);
	return rc;
}

/* The stream is read and written on the SQLite engine only so far. */
static int engine_sqlite(const char *loc, char *err, size_t errlen)
{
	if (strncmp(loc, "postgres://", 11) != 0 && strncmp(loc, "postgresql://", 13) != 0)
		return 0;
	say(err, errlen, "dump and load of a PostgreSQL volume are not built yet");
	return -EPROTONOSUPPORT;
}

int meta_dump(const char *db_path, FILE *out, uint64_t *records, char *err, size_t errlen)
{
	sqlite3 *db = NULL;
	uint64_t n = 0;
	int lock, rc;
	char uuid[64] = "";
	sqlite3_stmt *st = NULL;

	rc = engine_sqlite(db_path, err, errlen);
	if (rc)
		return rc;
	lock = volume_lock(db_path, err, errlen);
	if (lock < 0)
		return lock;
	rc = volume_settle(db_path, err, errlen);
	if (rc < 0)
		goto out;
	if (sqlite3_open_v2(db_path, &db, SQLITE_OPEN_READONLY | SQLITE_OPEN_NOMUTEX, NULL) !=
	    SQLITE_OK) {
		say(err, errlen, "cannot open %s: %s", db_path, db ? sqlite3_errmsg(db) : "no memory");
		rc = -EIO;
		goto out;
	}
	sqlite3_busy_timeout(db, 5000);
	/* One read transaction: every table from the same instant. */
	if (sqlite3_exec(db, "BEGIN", NULL, NULL, NULL) != SQLITE_OK ||
	    sqlite3_prepare_v2(db, "SELECT uuid FROM volume", -1, &st, NULL) != SQLITE_OK ||
	    sqlite3_step(st) != SQLITE_ROW) {
		say(err, errlen, "cannot read the volume record of %s: %s", db_path, sqlite3_errmsg(db));
		rc = -EIO;
		goto out;
	}
	snprintf(uuid, sizeof(uuid), "%s", (const char *)sqlite3_column_text(st, 0));
	if (fprintf(out, "{\"ferry_dump\":%d,\"schema\":%d,\"engine\":\"sqlite\",\"volume\":\"%s\"}\n",
		    META_DUMP_VERSION, META_SCHEMA_VERSION, uuid) < 0) {
		rc = errno ? -errno : -EIO;
		say(err, errlen, "cannot write the dump: %s", strerror(errno));
		goto out;
	}
	for (size_t i = 0; i < NTABLES; i++)
		if ((rc = dump_table(db, &tables[i], out, &n, err, errlen)) < 0)
			goto out;
	if (fprintf(out, "{\"t\":\"end\",\"records\":%llu}\n", (unsigned long long)n) < 0 ||
	    fflush(out) != 0) {
		rc = errno ? -errno : -EIO;
		say(err, errlen, "cannot write the dump: %s", strerror(errno));
		goto out;
	}
	if (records)
		*records = n;
	rc = 0;
out:
	sqlite3_finalize(st);
	if (db)
		sqlite3_exec(db, "COMMIT", NULL, NULL, NULL);
	sqlite3_close(db);
	close(lock);
	return rc;
}

/* ---- load ---- */

/* The insert of one table's rows: every column, in table_info order. */
struct loader {
	const struct dump_table *t;
	struct columns c;
	sqlite3_stmt *st;
};

static int loader_prepare(sqlite3 *db, struct loader *l, char *err, size_t errlen)
{
	char sql[1024];
	size_t len;
	int rc = columns_get(db, l->t->table, &l->c);

	if (rc != 0) {
		say(err, errlen, "the new volume has no table %s", l->t->table);
		return rc < 0 ? rc : -EIO;
	}
	/* sqlite_sequence has no key, and the slices' inserts (the table
	 * before it) made its rows: the dump's replace them. */
	if (strcmp(l->t->table, "sqlite_sequence") == 0 &&
	    sqlite3_exec(db, "DELETE FROM sqlite_sequence", NULL, NULL, NULL) != SQLITE_OK) {
		say(err, errlen, "cannot load %s: %s", l->t->table, sqlite3_errmsg(db));
		return -EIO;
	}
	len = (size_t)snprintf(sql, sizeof(sql), "INSERT INTO \"%s\"(", l->t->table);
	for (int i = 0; i < l->c.n && len < sizeof(sql); i++)
		len += (size_t)snprintf(sql + len, sizeof(sql) - len, "%s\"%s\"", i ? ", " : "",
					l->c.name[i]);
	for (int i = 0; i < l->c.n && len < sizeof(sql); i++)
		len += (size_t)snprintf(sql + len, sizeof(sql) - len, "%s?", i ? ", " : ") VALUES (");
	if (len < sizeof(sql))
		len += (size_t)snprintf(sql + len, sizeof(sql) - len, ")");
	if (len >= sizeof(sql))
		return -ENAMETOOLONG;
	if (sqlite3_prepare_v2(db, sql, -1, &l->st, NULL) != SQLITE_OK) {
		say(err, errlen, "cannot load %s: %s", l->t->table, sqlite3_errmsg(db));
		return -EIO;
	}
	return 0;
}

/* Binds the record's values to l->st. Every column must be there (null
 * only where the column allows it), nothing else. */
static int record_bind(struct loader *l, json_object *o, char *why, size_t whylen)
{
	int used = 1; /* "t" */

	sqlite3_reset(l->st);
	sqlite3_clear_bindings(l->st);
	for (int i = 0; i < l->c.n; i++) {
		char key[80];
		json_object *v = NULL;
		int col = i + 1;

		if (json_object_object_get_ex(o, l->c.name[i], &v)) {
			used++;
			if (v == NULL) {
				if (l->c.notnull[i]) {
					say(why, whylen, "%s is null", l->c.name[i]);
					return -EINVAL;
				}
				continue; /* bound null */
			}
			if (json_object_is_type(v, json_type_int)) {
				if (l->c.type[i] == 't' || l->c.type[i] == 'b') {
					say(why, whylen, "%s is a number, not text", l->c.name[i]);
					return -EINVAL;
				}
				int64_t x = json_object_get_int64(v);

				/* json-c clamps what is past int64 to its ends */
				if ((x == INT64_MAX && json_object_get_uint64(v) != (uint64_t)INT64_MAX) ||
				    (x == INT64_MIN && strcmp(json_object_get_string(v), "-9223372036854775808"))) {
					say(why, whylen, "%s is out of range", l->c.name[i]);
					return -EINVAL;
				}
				sqlite3_bind_int64(l->st, col, x);
			} else if (json_object_is_type(v, json_type_string)) {
				const char *s = json_object_get_string(v);
				int n = json_object_get_string_len(v);

				if (l->c.type[i] == 'i') {
					say(why, whylen, "%s is text, not a number", l->c.name[i]);
					return -EINVAL;
				}
				if (l->c.type[i] == 'b')
					sqlite3_bind_blob(l->st, col, s, n, SQLITE_TRANSIENT);
				else
					sqlite3_bind_text(l->st, col, s, n, SQLITE_TRANSIENT);
			} else {
				say(why, whylen, "%s is neither a number, text nor null", l->c.name[i]);
				return -EINVAL;
			}
			continue;
		}
		snprintf(key, sizeof(key), "%s@hex", l->c.name[i]);
		if (json_object_object_get_ex(o, key, &v) && json_object_is_type(v, json_type_string)) {
			unsigned char *p;
			size_t n;

			used++;
			if (l->c.type[i] == 'i' || hex_decode(json_object_get_string(v),
							       (size_t)json_object_get_string_len(v), &p, &n) < 0) {
				say(why, whylen, "%s is not hex of a text or blob column", key);
				return -EINVAL;
			}
			if (l->c.type[i] == 't') /* text that is not UTF-8, as it was */
				sqlite3_bind_text(l->st, col, (const char *)p, (int)n, free);
			else
				sqlite3_bind_blob(l->st, col, p, (int)n, free);
			continue;
		}
		say(why, whylen, "no %s", l->c.name[i]);
		return -EINVAL;
	}
	if (used != json_object_object_length(o)) {
		say(why, whylen, "fields this table does not have");
		return -EINVAL;
	}
	return 0;
}

/* What makes the rows a file system that ferry-mountd can use: queries
 * that must all find nothing. They hold the rows to what the engine
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
	{ "SELECT 1 FROM dentry WHERE typeof(name) != 'blob' OR length(name) NOT BETWEEN 1 AND 255"
	  " OR instr(name, X'2F') OR instr(name, X'00') OR name IN (X'2E', X'2E2E')"
	  " OR cookie < 1 OR cookie >= (SELECT next_cookie FROM counters) LIMIT 1",
	  "an entry's name or cookie out of range (empty, '.', '..', a '/' or NUL, "
	  "over 255 bytes; a cookie the counters would give again)" },
	{ "SELECT 1 FROM dentry d LEFT JOIN inode i ON i.ino = d.ino WHERE i.ino IS NULL LIMIT 1",
	  "an entry names an inode that is not there" },
	{ "SELECT 1 FROM dentry d LEFT JOIN inode p ON p.ino = d.parent"
	  " WHERE p.ino IS NULL OR (p.mode & 61440) != " DIR_T " LIMIT 1",
	  "an entry's parent is not a directory" },
	{ "SELECT 1 FROM inode i WHERE " FT " = " DIR_T " AND (SELECT count(*) FROM dentry d"
	  " WHERE d.ino = i.ino) != (i.ino != 1) LIMIT 1",
	  "a directory with no entry or more than one (or an entry for the root)" },
	{ "WITH RECURSIVE r(ino) AS (SELECT 1 UNION SELECT d.ino FROM dentry d JOIN r"
	  " ON d.parent = r.ino) SELECT 1 FROM inode WHERE ino NOT IN (SELECT ino FROM r)"
	  " AND ino NOT IN (SELECT ino FROM orphan) LIMIT 1",
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
	  " OR instr(s.target, X'00') OR i.size != length(s.target) LIMIT 1",
	  "a symlink target out of range or of an inode that is not a symlink" },
	{ "SELECT 1 FROM inode i WHERE " FT " = 40960 AND NOT EXISTS (SELECT 1 FROM symlink s"
	  " WHERE s.ino = i.ino) LIMIT 1",
	  "a symlink without a target" },
	{ "SELECT 1 FROM xattr x LEFT JOIN inode i ON i.ino = x.ino WHERE i.ino IS NULL"
	  " OR length(x.name) NOT BETWEEN 1 AND 255 OR instr(x.name, X'00')"
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
	{ "SELECT 1 FROM delslice g WHERE g.id < 1 OR g.id >= (SELECT next_slice FROM counters)"
	  " OR EXISTS (SELECT 1 FROM slice s WHERE s.id = g.id) LIMIT 1",
	  "a freed slice that a file still uses (or out of range)" },
	{ "SELECT 1 FROM sqlite_sequence WHERE name != 'slice' OR seq < (SELECT coalesce(max(seq), 0)"
	  " FROM slice) OR seq > " BIG " LIMIT 1",
	  "a slice sequence below the slices' or out of range" },
	{ "SELECT 1 WHERE EXISTS (SELECT 1 FROM journal WHERE seq < 0 OR seq > " BIG ")"
	  " OR EXISTS (SELECT 1 FROM commit_seq WHERE seq < 0 OR seq > " BIG ")"
	  " OR EXISTS (SELECT 1 FROM times_seq WHERE seq < 0 OR seq > " BIG ")"
	  " OR EXISTS (SELECT 1 FROM seq_epoch WHERE epoch < 0 OR epoch > 1073741824)",
	  "a journal, commit or epoch number out of range" },
};

static int load_check(sqlite3 *db, char *err, size_t errlen)
{
	for (size_t i = 0; i < sizeof(load_checks) / sizeof(load_checks[0]); i++) {
		sqlite3_stmt *st = NULL;
		int rc;

		if (sqlite3_prepare_v2(db, load_checks[i].sql, -1, &st, NULL) != SQLITE_OK) {
			say(err, errlen, "cannot check the loaded volume: %s", sqlite3_errmsg(db));
			return -EIO;
		}
		rc = sqlite3_step(st);
		sqlite3_finalize(st);
		if (rc == SQLITE_ROW) {
			say(err, errlen, "not a file system: %s", load_checks[i].what);
			return -EINVAL;
		}
		if (rc != SQLITE_DONE) {
			say(err, errlen, "cannot check the loaded volume: %s", sqlite3_errmsg(db));
			return -EIO;
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
static int load_header(const char *line, struct meta_volume *v, char *err, size_t errlen)
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
	memcpy(v->uuid, json_object_get_string(x), 36);
	v->uuid[36] = '\0';
	rc = 0;
out:
	json_object_put(o);
	return rc;
}

/* Loads the records after the header into db (a transaction is open). */
static int load_records(FILE *in, sqlite3 *db, uint64_t *records, char *err, size_t errlen)
{
	struct loader l[NTABLES] = { 0 };
	char *line = NULL, why[256];
	size_t cap = 0, next = 0; /* tables come in order: l[next] is the earliest allowed */
	uint64_t lineno = 1, n = 0;
	bool ended = false;
	ssize_t len;
	int rc = 0;

	for (size_t i = 0; i < NTABLES; i++)
		l[i].t = &tables[i];
	while ((len = getline(&line, &cap, in)) >= 0) {
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
		for (k = next; k < NTABLES && strcmp(tables[k].record, name) != 0; k++)
			;
		if (k == NTABLES) {
			json_object_put(o);
			say(err, errlen, "line %llu: a record of table %s, unknown or out of order",
			    (unsigned long long)lineno, name);
			rc = -EINVAL;
			goto out;
		}
		next = k;
		if (!l[k].st && (rc = loader_prepare(db, &l[k], err, errlen)) < 0) {
			json_object_put(o);
			goto out;
		}
		rc = record_bind(&l[k], o, why, sizeof(why));
		json_object_put(o);
		if (rc < 0) {
			say(err, errlen, "line %llu (%s): %s", (unsigned long long)lineno, name, why);
			goto out;
		}
		if (sqlite3_step(l[k].st) != SQLITE_DONE) {
			say(err, errlen, "line %llu (%s): %s", (unsigned long long)lineno, name,
			    sqlite3_errmsg(db));
			rc = -EINVAL;
			goto out;
		}
		n++;
	}
	if (ferror(in)) {
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
	*records = n;
	rc = 0;
out:
	for (size_t i = 0; i < NTABLES; i++) {
		sqlite3_finalize(l[i].st);
		columns_free(&l[i].c);
	}
	free(line);
	return rc;
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

/* The uuid the header named is the volume record's. */
static int load_uuid_check(sqlite3 *db, const char *uuid, char *err, size_t errlen)
{
	sqlite3_stmt *st = NULL;
	int rc = -EINVAL;

	if (sqlite3_prepare_v2(db, "SELECT uuid FROM volume", -1, &st, NULL) == SQLITE_OK &&
	    sqlite3_step(st) == SQLITE_ROW && sqlite3_column_text(st, 0) &&
	    strcmp((const char *)sqlite3_column_text(st, 0), uuid) == 0)
		rc = 0;
	else
		say(err, errlen, "not a file system: the volume record is not the volume the header "
		    "names (%s)", uuid);
	sqlite3_finalize(st);
	return rc;
}

int meta_load(FILE *in, const char *db_path, uint64_t *records, char *err, size_t errlen)
{
	struct meta_volume v = { .storage_url = "file:///nonexistent", .block_size = 4096 };
	char *line = NULL, tmp[PATH_MAX];
	size_t cap = 0;
	sqlite3 *db = NULL;
	uint64_t n = 0;
	bool made = false, placed = false;
	struct stat st;
	int lock = -1, rc;

	/* Built aside and renamed into place once whole and checked: a load
	 * that fails or is killed leaves no volume at db_path (a leftover
	 * db_path.load.PID is not one). The volume's lock is held throughout,
	 * as ferry-mountd holds it, so nothing mounts the path meanwhile. */
	rc = engine_sqlite(db_path, err, errlen);
	if (rc)
		return rc;
	if (snprintf(tmp, sizeof(tmp), "%s.load.%d", db_path, (int)getpid()) >= (int)sizeof(tmp))
		return -ENAMETOOLONG;
	if (stat(db_path, &st) == 0) {
		say(err, errlen, "%s already holds a volume", db_path);
		return -EEXIST;
	}
	lock = volume_lock(db_path, err, errlen);
	if (lock < 0)
		return lock;
	if (getline(&line, &cap, in) < 0) {
		say(err, errlen, "the dump is empty");
		rc = -EINVAL;
		goto out;
	}
	if ((rc = load_header(line, &v, err, errlen)) < 0)
		goto out;
	/* The engine makes the file, its schema and the tables the first open
	 * adds; the records then replace every row it wrote. */
	volume_remove(tmp, true);
	rc = meta_format(tmp, &v, 0, 0, 0);
	if (rc < 0) {
		say(err, errlen, "cannot create %s: %s", tmp, strerror(-rc));
		goto out;
	}
	made = true;
	if ((rc = volume_settle(tmp, err, errlen)) < 0)
		goto out;
	if (sqlite3_open_v2(tmp, &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX, NULL) !=
	    SQLITE_OK) {
		say(err, errlen, "cannot open %s", tmp);
		rc = -EIO;
		goto out;
	}
	sqlite3_busy_timeout(db, 5000);
	if (sqlite3_exec(db, "BEGIN IMMEDIATE", NULL, NULL, NULL) != SQLITE_OK) {
		say(err, errlen, "cannot write %s: %s", tmp, sqlite3_errmsg(db));
		rc = -EIO;
		goto out;
	}
	for (size_t i = 0; i < NTABLES; i++) {
		char sql[96];
		struct columns c;

		if (strcmp(tables[i].table, "sqlite_sequence") == 0)
			continue; /* follows the slices */
		if (columns_get(db, tables[i].table, &c) != 0)
			continue;
		columns_free(&c);
		snprintf(sql, sizeof(sql), "DELETE FROM \"%s\"", tables[i].table);
		if (sqlite3_exec(db, sql, NULL, NULL, NULL) != SQLITE_OK) {
			say(err, errlen, "cannot write %s: %s", tmp, sqlite3_errmsg(db));
			rc = -EIO;
			goto out;
		}
	}
	if ((rc = load_records(in, db, &n, err, errlen)) < 0 ||
	    (rc = load_check(db, err, errlen)) < 0 || (rc = load_uuid_check(db, v.uuid, err, errlen)) < 0)
		goto out;
	if (sqlite3_exec(db, "COMMIT", NULL, NULL, NULL) != SQLITE_OK ||
	    sqlite3_exec(db, "PRAGMA wal_checkpoint(TRUNCATE)", NULL, NULL, NULL) != SQLITE_OK) {
		say(err, errlen, "cannot commit %s: %s", tmp, sqlite3_errmsg(db));
		rc = -EIO;
		goto out;
	}
	sqlite3_close(db);
	db = NULL;
	/* Only the database goes: its WAL is empty, and the files beside it
	 * (journal, intent, lock) belong to its old name. */
	if (renameat2(AT_FDCWD, tmp, AT_FDCWD, db_path, RENAME_NOREPLACE) < 0) {
		rc = errno == EEXIST ? -EEXIST : -errno;
		say(err, errlen, "cannot put the volume at %s: %s", db_path, strerror(errno));
		goto out;
	}
	placed = true;
	volume_remove(tmp, true);
	/* The engine opens what was loaded (schema, volume record). */
	if ((rc = volume_settle(db_path, err, errlen)) < 0)
		goto out;
	if (records)
		*records = n;
	rc = 0;
out:
	sqlite3_close(db); /* an open transaction rolls back */
	if (rc < 0 && made)
		volume_remove(tmp, true);
	if (rc < 0 && placed)
		volume_remove(db_path, false);
	if (rc < 0 && !placed) {
		char p[PATH_MAX];

		if (snprintf(p, sizeof(p), "%s.lock", db_path) < (int)sizeof(p))
			unlink(p); /* ours: there was no volume here */
	}
	if (lock >= 0)
		close(lock);
	free(line);
	return rc;
}
