/* Unit tests for common/meta_dump.c: real SQLite volumes in a temporary
 * directory; a volume made through the engine's calls is dumped, loaded
 * into a new one and dumped again. */
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

#include "meta.h"
#include "tmp_dir.h"
#include "meta_dump.h"

static char dir[64], db[128], db2[128];

static void setup(void)
{
	struct meta_volume v = { .storage_url = "file:///tmp/objs" };

	strcpy(dir, "/tmp/ferry-dump-XXXXXX");
	cr_assert_not_null(mkdtemp(dir));
	snprintf(db, sizeof(db), "%s/meta.db", dir);
	snprintf(db2, sizeof(db2), "%s/loaded.db", dir);
	cr_assert_eq(meta_format(db, &v, 1000, 1000, 0), 0);
}

static void teardown(void)
{
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
static int load_bytes(const char *text, size_t len, char *err, size_t errlen)
{
	FILE *f = fmemopen((void *)text, len, "r");
	uint64_t n = 0;
	int rc;

	cr_assert_not_null(f);
	rc = meta_load(f, db2, &n, err, errlen);
	fclose(f);
	return rc;
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
	char p[256];
	struct stat st;
	DIR *d;
	struct dirent *de;

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
static void populate(void)
{
	struct meta *m;
	struct meta_attr a, d, f, victim;
	uint64_t id;
	static const char bin_name[] = "bin\xff\xfe";
	static const unsigned char bin_value[] = { 0, 1, 0xff, 0x80, 'x' };

	cr_assert_eq(meta_open(db, &m), 0);
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

/* A mounted volume (its lock held, as ferry-mountd holds it) is not dumped:
 * its newest changes may be in a journal the daemon has not committed. */
Test(meta_dump, a_mounted_volume_is_refused)
{
	char lock[160], err[256] = "";
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

/* The stream has no PostgreSQL side yet: said, not half done. */
Test(meta_dump, a_postgresql_volume_is_refused_loudly)
{
	char err[256] = "";
	FILE *f = fopen("/dev/null", "w+");

	cr_assert_not_null(f);
	cr_assert_eq(meta_dump("postgresql:///db?volume=v", f, NULL, err, sizeof(err)),
		     -EPROTONOSUPPORT);
	cr_assert(strstr(err, "PostgreSQL"), "%s", err);
	err[0] = '\0';
	cr_assert_eq(meta_load(f, "postgresql:///db?volume=v", NULL, err, sizeof(err)),
		     -EPROTONOSUPPORT);
	cr_assert(strstr(err, "PostgreSQL"), "%s", err);
	fclose(f);
}
