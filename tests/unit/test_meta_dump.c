/* Unit tests for common/meta_dump.c: real SQLite volumes in a temporary
 * directory (unit-meta_dump), or schemas on the PostgreSQL server of
 * scripts/pg-server, named by $FERRY_TEST_PG_URL (unit-meta_dump_pg, which
 * also moves a volume from SQLite to PostgreSQL and back); a volume made
 * through the engine's calls is dumped, loaded into a new one and dumped
 * again. */
#include <criterion/criterion.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <sys/random.h>
#include <time.h>

#include "meta.h"
#include "tmp_dir.h"
#include "meta_dump.h"
#ifdef META_TEST_PG
#include <libpq-fe.h>
#endif

/* db: the volume a test fills; db2: where it loads. */
static char dir[64], db[640], db2[640];

#ifdef META_TEST_PG
static char pg_base[512];
static char schema[2][64];

/* A volume name of its own on the server (dropped at teardown). */
static void pg_volume(int i, char *url, size_t len)
{
	unsigned r;

	cr_assert_eq(getrandom(&r, sizeof(r), 0), (ssize_t)sizeof(r));
	snprintf(schema[i], sizeof(schema[i]), "ferry_d%d_%d_%08x", i, (int)getpid(), r);
	snprintf(url, len, "%s&volume=%s", pg_base, schema[i] + 6);
}

static void pg_drop(const char *s)
{
	char sql[160];
	PGconn *h = PQconnectdb(pg_base);

	snprintf(sql, sizeof(sql), "SET client_min_messages = warning; DROP SCHEMA IF EXISTS %s CASCADE",
		 s);
	if (PQstatus(h) == CONNECTION_OK)
		PQclear(PQexec(h, sql));
	PQfinish(h);
}
#endif

static void setup(void)
{
	struct meta_volume v = { .storage_url = "file:///tmp/objs" };

	strcpy(dir, "/tmp/ferry-dump-XXXXXX");
	cr_assert_not_null(mkdtemp(dir));
#ifdef META_TEST_PG
	const char *url = getenv("FERRY_TEST_PG_URL");

	cr_assert(url != NULL && *url,
		  "FERRY_TEST_PG_URL is not set: start a server with scripts/pg-server");
	cr_assert_lt(strlen(url), sizeof(pg_base));
	strcpy(pg_base, url);
	pg_volume(0, db, sizeof(db));
	pg_volume(1, db2, sizeof(db2));
#else
	snprintf(db, sizeof(db), "%s/meta.db", dir);
	snprintf(db2, sizeof(db2), "%s/loaded.db", dir);
#endif
	cr_assert_eq(meta_format(db, &v, 1000, 1000, 0), 0);
}

static void teardown(void)
{
#ifdef META_TEST_PG
	pg_drop(schema[0]);
	pg_drop(schema[1]);
#endif
	rm_dir(dir);
}

TestSuite(meta_dump, .init = setup, .fini = teardown);

/* The stream of db_path, NUL-terminated (malloc'ed, the caller's). */
static char *dump_of(const char *path, uint64_t *records)
{
	char *buf = NULL, err[256] = "";
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);

	cr_assert_not_null(f);
	cr_assert_eq(meta_dump(path, f, records, err, sizeof(err)), 0, "dump: %s", err);
	fclose(f);
	return buf;
}

/* meta_load of len bytes into db2; returns its result, err filled. */
static int load_bytes_to(const char *to, const char *text, size_t len, char *err, size_t errlen)
{
	FILE *f = fmemopen((void *)text, len, "r");
	uint64_t n = 0;
	int rc;

	cr_assert_not_null(f);
	rc = meta_load(f, to, &n, err, errlen);
	fclose(f);
	return rc;
}

static int load_bytes(const char *text, size_t len, char *err, size_t errlen)
{
	return load_bytes_to(db2, text, len, err, errlen);
}

static int load_text(const char *text, char *err, size_t errlen)
{
	return load_bytes(text, strlen(text), err, errlen);
}

/* Nothing of a volume at db2: not the database, nor a file beside it, nor
 * the copy a load builds aside. */
static void assert_no_volume(const char *when)
{
	static const char *const sfx[] = { "", "-wal", "-shm", "-changes", "-intent", ".lock" };
	char p[700];
	struct stat st;
	DIR *d;
	struct dirent *de;
#ifdef META_TEST_PG
	struct meta *m = NULL;

	cr_assert_eq(meta_open(db2, &m), -ENOENT, "%s: a schema was left behind", when);
	return;
#endif

	for (size_t i = 0; i < sizeof(sfx) / sizeof(sfx[0]); i++) {
		snprintf(p, sizeof(p), "%s%s", db2, sfx[i]);
		cr_assert_neq(stat(p, &st), 0, "%s: %s was left behind", when, p);
	}
	d = opendir(dir);
	cr_assert_not_null(d);
	while ((de = readdir(d)))
		cr_assert_null(strstr(de->d_name, ".load."), "%s: %s was left behind", when,
			       de->d_name);
	closedir(d);
}

/* A volume with something of every table: directories, a file with slices
 * in two chunks, a hard link, a symlink, a fifo, a name and an xattr value
 * that are not text, an unlinked inode still open (an orphan), freed
 * slices. */
static void populate_at(const char *path)
{
	struct meta *m;
	struct meta_attr a, d, f, victim;
	uint64_t id;
	static const char bin_name[] = "bin\xff\xfe";
	static const unsigned char bin_value[] = { 0, 1, 0xff, 0x80, 'x' };

	cr_assert_eq(meta_open(path, &m), 0);
	cr_assert_eq(meta_create(m, META_ROOT_INO, "d", S_IFDIR | 02775, 1000, 1000, 0, NULL, &d), 0);
	cr_assert_eq(meta_create(m, d.ino, "f", S_IFREG | 0640, 1000, 1000, 0, NULL, &f), 0);
	cr_assert_eq(meta_slice_id_alloc(m, 3, &id), 0);
	struct meta_chunk_slice s[2] = {
		{ .chunk = 0, .s = { .id = id, .size = 5000, .off = 0, .pos = 100, .len = 5000 } },
		{ .chunk = 1, .s = { .id = id + 1, .size = 70, .off = 10, .pos = 0, .len = 60 } },
	};
	cr_assert_eq(meta_write_commit(m, f.ino, s, 2, META_CHUNK_SIZE + 60, NULL, NULL), 0);
	cr_assert_eq(meta_link(m, f.ino, META_ROOT_INO, "hard", NULL), 0);
	cr_assert_eq(meta_create(m, META_ROOT_INO, "sym", S_IFLNK | 0777, 0, 0, 0, "d/f", &a), 0);
	cr_assert_eq(meta_create(m, META_ROOT_INO, "fifo", S_IFIFO | 0600, 0, 0, 0, NULL, &a), 0);
	cr_assert_eq(meta_create(m, META_ROOT_INO, bin_name, S_IFREG | 0600, 0, 0, 0, NULL, &a), 0);
	cr_assert_eq(meta_setxattr(m, f.ino, "user.bin", bin_value, sizeof(bin_value), 0), 0);
	cr_assert_eq(meta_setxattr(m, d.ino, "user.text", "hello", 5, 0), 0);
	/* An orphan: unlinked, not released. */
	cr_assert_eq(meta_create(m, META_ROOT_INO, "gone", S_IFREG | 0600, 0, 0, 0, NULL, &a), 0);
	cr_assert_eq(meta_unlink(m, META_ROOT_INO, "gone", &victim), 0);
	/* Freed slices: a truncate to 0 of a second file. */
	cr_assert_eq(meta_create(m, META_ROOT_INO, "cut", S_IFREG | 0600, 0, 0, 0, NULL, &a), 0);
	struct meta_chunk_slice c = { .chunk = 0, .s = { .id = id + 2, .size = 9, .len = 9 } };
	cr_assert_eq(meta_write_commit(m, a.ino, &c, 1, 9, NULL, NULL), 0);
	struct meta_attr zero = { .size = 0 };
	cr_assert_eq(meta_setattr(m, a.ino, META_SET_SIZE, &zero, NULL), 0);
	/* A reconcile epoch and a job's commit (seq_epoch, commit_seq). */
	uint64_t epoch;
	cr_assert_eq(meta_seq_epoch(m, &epoch), 0);
	cr_assert_eq(meta_slice_id_alloc(m, 1, &id), 0);
	struct meta_chunk_slice j = { .chunk = 0, .s = { .id = id, .size = 4, .len = 4 } };
	cr_assert_eq(meta_write_commit_seq(m, a.ino, (epoch << 32) + 1, &j, 1, 4, NULL, NULL), 0);
	meta_close(m);
}

static void populate(void)
{
	populate_at(db);
}

/* The stream past its header line (which names the engine). */
static const char *past_header(const char *dump)
{
	const char *p = strchr(dump, '\n');

	cr_assert_not_null(p);
	return p + 1;
}

/* What the engine reads of a volume, as text: every entry under the root
 * with its attributes, slices, link target and xattrs. */
struct listing {
	struct meta *m;
	FILE *out;
};

static void list_dir(struct listing *l, uint64_t ino, const char *path);

static int list_entry(void *arg, const char *name, const struct meta_attr *a, uint64_t cookie)
{
	struct listing *l = arg;
	char *target, *names;
	size_t n;
	struct meta_slice *sl;

	fprintf(l->out, "%s ino=%llu cookie=%llu mode=%o uid=%u gid=%u nlink=%u size=%llu "
		"mtime=%lld.%09ld ctime=%lld.%09ld\n", name, (unsigned long long)a->ino,
		(unsigned long long)cookie, (unsigned)a->mode, (unsigned)a->uid, (unsigned)a->gid,
		(unsigned)a->nlink, (unsigned long long)a->size, (long long)a->mtime.tv_sec,
		a->mtime.tv_nsec, (long long)a->ctime.tv_sec, a->ctime.tv_nsec);
	if (S_ISLNK(a->mode)) {
		cr_assert_eq(meta_readlink(l->m, a->ino, &target), 0);
		fprintf(l->out, "  -> %s\n", target);
		free(target);
	}
	for (uint32_t chunk = 0; S_ISREG(a->mode) && chunk < 2; chunk++) {
		cr_assert_eq(meta_chunk_slices(l->m, a->ino, chunk, &sl, &n), 0);
		for (size_t i = 0; i < n; i++)
			fprintf(l->out, "  chunk %u: id=%llu size=%u off=%u pos=%u len=%u\n", chunk,
				(unsigned long long)sl[i].id, sl[i].size, sl[i].off, sl[i].pos,
				sl[i].len);
		free(sl);
	}
	cr_assert_eq(meta_listxattr(l->m, a->ino, &names, &n), 0);
	for (size_t off = 0; off < n; off += strlen(names + off) + 1) {
		void *v;
		size_t vn;

		cr_assert_eq(meta_getxattr(l->m, a->ino, names + off, &v, &vn), 0);
		fprintf(l->out, "  xattr %s (%zu bytes) %.*s\n", names + off, vn, (int)vn, (char *)v);
		free(v);
	}
	free(names);
	if (S_ISDIR(a->mode))
		list_dir(l, a->ino, name);
	return 0;
}

static void list_dir(struct listing *l, uint64_t ino, const char *path)
{
	fprintf(l->out, "[%s]\n", path);
	cr_assert_eq(meta_readdir(l->m, ino, 0, 1, list_entry, l), 0);
}

/* malloc'ed, the caller's. */
static char *listing_of(const char *path)
{
	struct listing l = { 0 };
	char *buf = NULL;
	size_t len = 0;

	cr_assert_eq(meta_open(path, &l.m), 0);
	l.out = open_memstream(&buf, &len);
	cr_assert_not_null(l.out);
	list_dir(&l, META_ROOT_INO, "/");
	fclose(l.out);
	meta_close(l.m);
	return buf;
}

Test(meta_dump, a_loaded_volume_dumps_the_same_and_reads_the_same)
{
	char *first, *second, err[256] = "";
	uint64_t n1 = 0, n2 = 0;
	struct meta *m;
	struct meta_attr a, f;
	struct meta_slice *sl;
	size_t nsl, vsize;
	void *value;
	char *target;

	populate();
	first = dump_of(db, &n1);
	cr_assert_gt(n1, 15);
	cr_assert_eq(load_text(first, err, sizeof(err)), 0, "load: %s", err);
	second = dump_of(db2, &n2);
	cr_assert_eq(n1, n2);
	cr_assert_str_eq(first, second);
	char *tree1 = listing_of(db), *tree2 = listing_of(db2);
	cr_assert_str_eq(tree1, tree2);
	free(tree1);
	free(tree2);
	/* Not only the same rows: the engine reads them as the same tree. */
	cr_assert(strstr(first, "\"name@hex\":\"62696efffe\""), "a binary name is hex: %s", first);
	cr_assert(strstr(first, "\"value@hex\":\"0001ff8078\""), "a binary value is hex");
	cr_assert_eq(meta_open(db2, &m), 0);
	cr_assert_eq(meta_lookup(m, META_ROOT_INO, "d", &a), 0);
	cr_assert_eq(a.mode, S_IFDIR | 02775);
	cr_assert_eq(meta_lookup(m, a.ino, "f", &f), 0);
	cr_assert_eq(f.nlink, 2);
	cr_assert_eq(f.size, META_CHUNK_SIZE + 60);
	cr_assert_eq(meta_chunk_slices(m, f.ino, 1, &sl, &nsl), 0);
	cr_assert_eq(nsl, 1);
	cr_assert_eq(sl[0].off, 10);
	cr_assert_eq(sl[0].len, 60);
	free(sl);
	cr_assert_eq(meta_getxattr(m, f.ino, "user.bin", &value, &vsize), 0);
	cr_assert_eq(vsize, 5);
	cr_assert(memcmp(value, "\0\1\xff\x80x", 5) == 0);
	free(value);
	cr_assert_eq(meta_lookup(m, META_ROOT_INO, "sym", &a), 0);
	cr_assert_eq(meta_readlink(m, a.ino, &target), 0);
	cr_assert_str_eq(target, "d/f");
	free(target);
	cr_assert_eq(meta_lookup(m, META_ROOT_INO, "bin\xff\xfe", &a), 0);
	/* Counters carried over: a new inode does not reuse a number. */
	cr_assert_eq(meta_create(m, META_ROOT_INO, "new", S_IFREG | 0600, 0, 0, 0, NULL, &a), 0);
	cr_assert(strstr(first, "\"t\":\"orphan\""), "the orphan is in the dump");
	cr_assert(strstr(first, "\"t\":\"gc_slice\""), "the freed slice is in the dump");
	cr_assert(strstr(first, "\"t\":\"commit_seq\""), "the job's commit is in the dump");
	cr_assert(strstr(first, "\"t\":\"seq_epoch\""), "the epoch is in the dump");
	meta_close(m);
	free(first);
	free(second);
}

/* Each broken stream is refused with its reason, and leaves no volume. */
Test(meta_dump, a_damaged_or_foreign_stream_is_refused_and_leaves_nothing)
{
	char *good, *p, err[256], *bad;
	static const struct {
		const char *from, *to, *says;
	} edits[] = {
		{ "\"ferry_dump\":1", "\"ferry_dump\":7", "stream version 7" },
		{ "\"schema\":1", "\"schema\":9", "schema 9" },
		{ "\"t\":\"inode\",\"ino\":1,", "\"t\":\"inode\",\"ino\":1,\"x\":1,", "fields this table" },
		{ "\"t\":\"dentry\"", "\"t\":\"nosuch\"", "unknown or out of order" },
		{ "\"name\":\"d\"", "\"name\":5", "a number, not text" },
		{ "\"name@hex\":\"62696efffe\"", "\"name@hex\":\"6g\"", "not hex" },
		{ "\"t\":\"end\"", "\"t\":\"end\",\"records\":1,\"x\"", "not a record" },
		{ "\"t\":\"inode\",\"ino\":1,", "\"t\":\"inode\",\"ino\":99999,", "no root directory" },
		{ "\"t\":\"inode\",\"ino\":1,", "\"t\":\"inode\",\"ino\":1,\"ino\":2,", "" },
		{ "\"name\":\"d\"", "\"name\":\"d/x\"", "an entry's name" },
		{ "\"name\":\"d\"", "\"name\":\"\"", "an entry's name" },
		{ "\"name\":\"d\"", "\"name\":\"..\"", "an entry's name" },
		{ "\"name\":\"d\"", "\"name\":\"d\\u0000x\"", "an entry's name" },
		{ "\"size\":6", "\"size\":-6", "an inode out of range" },
		{ "\"nlink\":2,\"size\":6", "\"nlink\":3,\"size\":6", "link count" },
		{ "\"t\":\"gc_slice\",\"id\":", "\"t\":\"gc_slice\",\"id\":1,\"x\":", "fields" },
		{ "\"t\":\"end\"", "\"t\":\"end\"} trailing", "not a record" },
		{ "\"t\":\"end\"", "'t':'end'", "not a record" },
		{ "\"ino\":1,", "\"ino\":99999999999999999999,", "out of range" },
	};

	populate();
	good = dump_of(db, NULL);
	for (size_t i = 0; i < sizeof(edits) / sizeof(edits[0]); i++) {
		p = strstr(good, edits[i].from);
		cr_assert_not_null(p, "edit %zu: %s not in the dump", i, edits[i].from);
		cr_assert_geq(asprintf(&bad, "%.*s%s%s", (int)(p - good), good, edits[i].to,
				       p + strlen(edits[i].from)), 0);
		cr_assert_lt(load_text(bad, err, sizeof(err)), 0, "edit %zu was loaded", i);
		cr_assert(strstr(err, edits[i].says), "edit %zu: \"%s\" does not say \"%s\"", i, err,
			  edits[i].says);
		assert_no_volume(edits[i].to);
		free(bad);
	}
	/* Rows that are not a file system, each put before the line that has
	 * find (where its table's rows go). */
	static const struct {
		const char *find, *add, *says;
	} rows[] = {
		/* a live slice handed to the collector */
		{ "{\"t\":\"sequence\"", "{\"t\":\"gc_slice\",\"id\":1,\"size\":5000,"
		  "\"since\":0,\"seen\":null}", "a file still uses" },
		/* a second entry for a directory (a cycle; cookie 7 was "gone"'s) */
		{ "{\"t\":\"symlink\"",
		  "{\"t\":\"dentry\",\"parent\":2,\"name\":\"loop\",\"ino\":2,\"cookie\":7}",
		  "more than one" },
	};
	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
		const char *at = strstr(good, rows[i].find), *eol;

		cr_assert_not_null(at, "row %zu: %s not in the dump", i, rows[i].find);
		eol = at; /* the added row goes before the one found; the count goes up */
		char *end = strstr(good, "{\"t\":\"end\",\"records\":");
		long count = strtol(end + strlen("{\"t\":\"end\",\"records\":"), NULL, 10);
		cr_assert_geq(asprintf(&bad, "%.*s%s\n%.*s{\"t\":\"end\",\"records\":%ld}\n",
				       (int)(eol - good), good, rows[i].add, (int)(end - eol), eol,
				       count + 1), 0);
		cr_assert_lt(load_text(bad, err, sizeof(err)), 0, "row %zu was loaded", i);
		cr_assert(strstr(err, rows[i].says), "row %zu: \"%s\" does not say \"%s\"", i, err,
			  rows[i].says);
		assert_no_volume(rows[i].add);
		free(bad);
	}
	/* Cut short at a line's end: after the header, after a few records,
	 * and just before the end record. */
	size_t lines = 0;
	for (p = good; (p = strchr(p, '\n')); p++)
		lines++;
	size_t cuts[] = { 1, 5, lines / 2, lines - 1 };
	for (size_t i = 0; i < sizeof(cuts) / sizeof(cuts[0]); i++) {
		size_t k = 0;

		for (p = good; k < cuts[i]; p++)
			if (*p == '\n')
				k++;
		cr_assert_lt(load_bytes(good, (size_t)(p - good), err, sizeof(err)), 0,
			     "cut after %zu lines was loaded", cuts[i]);
		cr_assert(strstr(err, "without its end record"), "cut after %zu: %s", cuts[i], err);
		assert_no_volume("a cut stream");
	}
	cr_assert_lt(load_text("", err, sizeof(err)), 0);
	cr_assert_lt(load_bytes("\x00\xff garbage\n", 14, err, sizeof(err)), 0);
	cr_assert(strstr(err, "not a ferry dump"), "%s", err);
	assert_no_volume("garbage");
	/* Never over an existing volume. */
	cr_assert_eq(load_text(good, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(load_text(good, err, sizeof(err)), -EEXIST);
	free(good);
}

#ifdef META_TEST_PG
/* A mounted volume (its lease held, as ferry-mountd holds it) is not
 * dumped, nor one whose holder let the lease run out without a release:
 * its node's journal may hold changes the database does not have. */
Test(meta_dump, a_mounted_volume_is_refused)
{
	char err[512] = "";
	struct meta *holder;
	FILE *f = fopen("/dev/null", "w");

	cr_assert_not_null(f);
	cr_assert_eq(meta_open(db, &holder), 0);
	cr_assert_eq(meta_lease_take(holder, "host-a pid 1 at /mnt/a", 60000, 0, 0, NULL), 0);
	cr_assert_eq(meta_dump(db, f, NULL, err, sizeof(err)), -EBUSY);
	cr_assert(strstr(err, "in use") && strstr(err, "host-a pid 1 at /mnt/a"), "%s", err);
	cr_assert_eq(meta_lease_release(holder), 0);
	/* A holder that died: its lease runs out, unreleased. */
	cr_assert_eq(meta_lease_take(holder, "host-b pid 2 at /mnt/b", 50, 0, 0, NULL), 0);
	nanosleep(&(struct timespec){ 0, 200 * 1000000L }, NULL);
	cr_assert_eq(meta_dump(db, f, NULL, err, sizeof(err)), -EBUSY);
	cr_assert(strstr(err, "ran out") && strstr(err, "--takeover"), "%s", err);
	cr_assert_eq(meta_lease_take(holder, "host-c pid 3 at /mnt/c", 60000, 1, 0, NULL), 0);
	cr_assert_eq(meta_lease_release(holder), 0);
	/* Free again: the dump takes the lease for its length and frees it. */
	cr_assert_eq(meta_dump(db, f, NULL, err, sizeof(err)), 0, "%s", err);
	struct meta_lease l;
	cr_assert_eq(meta_lease_get(holder, &l), 0);
	cr_assert_str_eq(l.holder, "");
	meta_close(holder);
	fclose(f);
}
#else
/* A mounted volume (its lock held, as ferry-mountd holds it) is not dumped:
 * its newest changes may be in a journal the daemon has not committed. */
Test(meta_dump, a_mounted_volume_is_refused)
{
	char lock[700], err[256] = "";
	struct flock fl = { .l_type = F_WRLCK, .l_whence = SEEK_SET };
	int fd;
	pid_t pid;
	int pipefd[2], status;
	char c;

	snprintf(lock, sizeof(lock), "%s.lock", db);
	cr_assert_eq(pipe(pipefd), 0);
	pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		fd = open(lock, O_RDWR | O_CREAT, 0600);
		if (fd < 0 || fcntl(fd, F_OFD_SETLK, &fl) < 0 || dprintf(fd, "%d\n", (int)getpid()) < 0)
			_exit(1);
		(void)!write(pipefd[1], "x", 1);
		for (;;)
			pause(); /* holds the lock until killed */
	}
	cr_assert_eq(read(pipefd[0], &c, 1), 1);
	FILE *f = fopen("/dev/null", "w");
	cr_assert_eq(meta_dump(db, f, NULL, err, sizeof(err)), -EBUSY);
	cr_assert(strstr(err, "mounted"), "%s", err);
	fclose(f);
	kill(pid, SIGKILL);
	waitpid(pid, &status, 0);
	close(pipefd[0]);
	close(pipefd[1]);
}

#endif

/* More rows than a dump reads at a time, in tables keyed by one column
 * (inode) and by two (dentry: parent, name): every row once, in order. */
Test(meta_dump, a_large_volume_streams_in_pages)
{
	char journal[160], name[32], err[256] = "", *first, *second, *p;
	struct meta *m;
	struct meta_attr d, a;
	uint64_t n1 = 0, n2 = 0;
	size_t entries = 0;

	cr_assert_eq(meta_open(db, &m), 0);
	/* Deferred commits, as ferry-mountd makes them: quick to fill. */
	snprintf(journal, sizeof(journal), "%s/fill" META_JOURNAL_SUFFIX, dir);
	cr_assert_eq(meta_journal_open(m, journal, 1000, NULL), 0);
	cr_assert_eq(meta_create(m, META_ROOT_INO, "many", S_IFDIR | 0755, 0, 0, 0, NULL, &d), 0);
	for (int i = 0; i < 4500; i++) {
		snprintf(name, sizeof(name), "f%05d", (i * 7919) % 4500);
		cr_assert_eq(meta_create(m, d.ino, name, S_IFREG | 0644, 0, 0, 0, NULL, &a), 0);
	}
	meta_close(m);
	first = dump_of(db, &n1);
	cr_assert_gt(n1, 9000);
	for (p = first; (p = strstr(p, "{\"t\":\"dentry\",\"parent\":2,")); p++)
		entries++;
	cr_assert_eq(entries, 4500);
	/* Key order across the pages: f00000 ... f04499. */
	cr_assert_lt(strstr(first, "\"name\":\"f04095\""), strstr(first, "\"name\":\"f04096\""));
	cr_assert_lt(strstr(first, "\"name\":\"f04096\""), strstr(first, "\"name\":\"f04499\""));
	cr_assert_eq(load_text(first, err, sizeof(err)), 0, "load: %s", err);
	second = dump_of(db2, &n2);
	cr_assert_eq(n1, n2);
	cr_assert_str_eq(past_header(first), past_header(second));
	free(first);
	free(second);
}

#ifdef META_TEST_PG
/* A volume moves from SQLite to PostgreSQL and back: the dumps are the
 * same past their headers, and the engine reads the same tree from each. */
Test(meta_dump, sqlite_to_postgresql_and_back_round_trips_exactly)
{
	struct meta_volume v = { .storage_url = "file:///tmp/objs" };
	char lite[128], back[128], err[256] = "";
	char *first, *second, *third, *tree1, *tree2, *tree3;

	snprintf(lite, sizeof(lite), "%s/lite.db", dir);
	snprintf(back, sizeof(back), "%s/back.db", dir);
	cr_assert_eq(meta_format(lite, &v, 1000, 1000, 0), 0);
	populate_at(lite);
	first = dump_of(lite, NULL);
	cr_assert(strstr(first, "\"engine\":\"sqlite\""), "%s", first);
	cr_assert_eq(load_bytes_to(db2, first, strlen(first), err, sizeof(err)), 0, "%s", err);
	second = dump_of(db2, NULL);
	cr_assert(strstr(second, "\"engine\":\"postgresql\""), "%s", second);
	cr_assert_str_eq(past_header(first), past_header(second));
	cr_assert_eq(load_bytes_to(back, second, strlen(second), err, sizeof(err)), 0, "%s", err);
	third = dump_of(back, NULL);
	cr_assert_str_eq(first, third);
	tree1 = listing_of(lite);
	tree2 = listing_of(db2);
	tree3 = listing_of(back);
	cr_assert(strstr(tree1, "bin\xff\xfe") && strstr(tree1, "chunk 1: id=") &&
		  strstr(tree1, "-> d/f") && strstr(tree1, "xattr user.text (5 bytes) hello"),
		  "%s", tree1);
	cr_assert_str_eq(tree1, tree2);
	cr_assert_str_eq(tree1, tree3);
	/* The loaded volume goes on where the old one was: a new slice takes
	 * a seq past every loaded one. */
	struct meta *m;
	struct meta_attr a;
	uint64_t id;
	cr_assert_eq(meta_open(db2, &m), 0);
	cr_assert_eq(meta_create(m, META_ROOT_INO, "after", S_IFREG | 0600, 0, 0, 0, NULL, &a), 0);
	cr_assert_eq(meta_slice_id_alloc(m, 1, &id), 0);
	struct meta_chunk_slice c = { .chunk = 0, .s = { .id = id, .size = 3, .len = 3 } };
	cr_assert_eq(meta_write_commit(m, a.ino, &c, 1, 3, NULL, NULL), 0);
	meta_close(m);
	free(first);
	free(second);
	free(third);
	free(tree1);
	free(tree2);
	free(tree3);
}
#endif
