/*
 * The metadata disk fills up under the WAL, through a real mount. The
 * volume's meta.db (and so its -wal, -shm and lock files, and the daemon's
 * log) lives on a small tmpfs of the test's own; objects and staging files
 * stay on the ordinary disk. A workload of creates, writes (some fsync'ed),
 * renames, unlinks, mkdirs and rmdirs runs while a filler takes the tmpfs's
 * last byte, holds it full for a moment and gives it back. What the test
 * asserts:
 *  - while the disk is full, an operation either succeeds or fails with an
 *    honest error (ENOSPC, EIO, EDQUOT); a namespace operation that failed
 *    changed nothing; a write whose close() returned is kept even if its
 *    commit has to wait for space;
 *  - once the space is back, the same mount works again (every operation
 *    succeeds, without a restart);
 *  - after an unmount and a mount with an empty cache, everything that
 *    returned is there as it was left, file contents included;
 *  - the metadata database is consistent afterwards (there is no `ferry
 *    fsck` yet: the test checks SQLite's integrity_check and the
 *    namespace's own rules -- links, parents, counts -- with queries).
 */
#include "mount_util.h"

#include <fcntl.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#define NAMES 40
#define DIRS 4
#define LEN_MAX 24000
/* Operations before the filler starts, and after the space is back. */
#define OPS_BEFORE 150
#define OPS_AFTER 150
/* How long the filler keeps the disk full once an operation has failed
 * for it (and at most, if none does): an action's timing, never asserted. */
#define HOLD_MS 1500
#define HOLD_MAX_MS 20000

static char metafs[PATH_MAX];

static void meta_full_setup(void)
{
	char src[PATH_MAX + 16], dst[PATH_MAX + 16];
	const char *cp[] = { "/bin/cp", src, dst, NULL };

	/* Formatted on the ordinary disk first: its storage URL (objects in
	 * vol/objects) stays there; only the database moves to the tmpfs. */
	fm_setup_opts(&(struct fm_opts){ .no_mount = true });
	snprintf(metafs, sizeof(metafs), "%s", sp("metafs"));
	cr_assert(mkdir(metafs, 0700) == 0);
	cr_assert(mount("ferry-test-meta", metafs, "tmpfs", MS_NOSUID | MS_NODEV,
			"size=32m,mode=0700") == 0, "tmpfs: %s", strerror(errno));
	snprintf(src, sizeof(src), "%s/meta.db", fm.vol);
	snprintf(dst, sizeof(dst), "%s/meta.db", metafs);
	cr_assert_eq(fm_run(cp, NULL, NULL, 30), 0, "cp meta.db");
	snprintf(fm.vol, sizeof(fm.vol), "%s", metafs);
	snprintf(fm.staging, sizeof(fm.staging), "%s", sp("staging"));
	cr_assert(mkdir(fm.staging, 0700) == 0);
	fm_mount();
}

static void meta_full_teardown(void)
{
	/* ferryfs first (its database is there), then the tmpfs, lazily, even
	 * if that failed -- both before fm_teardown() removes the tree. */
	if (fm.mounted) {
		const char *argv[] = { fm_bin("ferry"), "umount", fm.mnt, NULL };

		if (fm_run(argv, NULL, NULL, 60) == 0)
			fm.mounted = false;
	}
	if (metafs[0])
		umount2(metafs, MNT_DETACH);
	fm_teardown();
}

TestSuite(meta_full, .init = meta_full_setup, .fini = meta_full_teardown, .timeout = 300);

/* ---- the filler ---- */

static _Atomic int fill_state;   /* 0 not yet, 1 full, 2 given back */
static _Atomic int failures_seen; /* operations the workload saw fail */

static long ms_since(const struct timespec *t0)
{
	struct timespec now;

	clock_gettime(CLOCK_MONOTONIC, &now);
	return (now.tv_sec - t0->tv_sec) * 1000 + (now.tv_nsec - t0->tv_nsec) / 1000000;
}

/* Writes to fd until the disk is full: big pieces, then small ones, so
 * every last page goes. */
static void fill(int fd, const char *chunk, size_t size)
{
	if (fd < 0)
		return;
	for (size_t piece = size; piece >= 512; piece /= 2)
		while (write(fd, chunk, piece) == (ssize_t)piece)
			;
}

static void *filler_main(void *arg)
{
	static char chunk[64 * 1024];
	char path[PATH_MAX + 16];
	struct timespec t0, first_fail = { 0 };
	int fd;

	(void)arg;
	memset(chunk, 0xa5, sizeof(chunk));
	snprintf(path, sizeof(path), "%s/filler", metafs);
	fd = open(path, O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
	fill(fd, chunk, sizeof(chunk));
	atomic_store(&fill_state, 1);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (;;) {
		if (atomic_load(&failures_seen) && !first_fail.tv_sec)
			clock_gettime(CLOCK_MONOTONIC, &first_fail);
		if (first_fail.tv_sec && ms_since(&first_fail) >= HOLD_MS)
			break;
		if (ms_since(&t0) >= HOLD_MAX_MS)
			break;
		/* Space SQLite gives back meanwhile (a WAL cut after a
		 * checkpoint) is taken again: the disk stays full. */
		fill(fd, chunk, sizeof(chunk));
		usleep(10 * 1000);
	}
	if (fd >= 0)
		close(fd);
	unlink(path);
	atomic_store(&fill_state, 2);
	return NULL;
}

/* ---- the workload and its model ---- */

enum { W_WRITE, W_WRITE_FSYNC, W_RENAME, W_UNLINK, W_MKDIR, W_RMDIR, W_N };

/* One state a name may be in: absent, empty, or a file of some content. */
struct outcome {
	enum { ABSENT, EMPTY, CONTENT } kind;
	uint32_t seed;
};

/* What the test knows of a name: the states it may be in. One, unless a
 * write failed without telling which of its steps applied (the open may
 * have created or truncated the file, the write not). */
#define OUTCOMES_MAX 16
struct name_state {
	struct outcome o[OUTCOMES_MAX];
	int n;
	char hist[200];      /* its last operations, for a failure message */
};

struct model {
	struct name_state f[NAMES];
	bool d[DIRS];
	int ops, failed, enospc, eio;
};

static void set_one(struct name_state *x, struct outcome o)
{
	x->o[0] = o;
	x->n = 1;
}

static void add_outcome(struct name_state *x, struct outcome o)
{
	for (int i = 0; i < x->n; i++)
		if (x->o[i].kind == o.kind && (o.kind != CONTENT || x->o[i].seed == o.seed))
			return;
	cr_assert_lt(x->n, OUTCOMES_MAX, "the model lost track: too many possible states");
	x->o[x->n++] = o;
}

static size_t content(uint32_t seed, unsigned char *buf)
{
	uint64_t st = 0x51ed + seed;
	size_t len = (size_t)(fm_rand(&st) % LEN_MAX);

	fm_fill_random(&st, buf, len);
	return len;
}

static const char *fpath(int i)
{
	return mp("w/file-%02d-with-a-longer-name-to-grow-the-metadata-faster", i);
}

static const char *dpath(int i)
{
	return mp("w/dir-%d", i);
}

static bool honest(int e)
{
	return e == ENOSPC || e == EIO || e == EDQUOT;
}

/* One write: open(O_CREAT|O_TRUNC), write, fsync if asked, close. Returns
 * 0, or the errno of the first step that failed; *closed says whether
 * close() returned 0 after every write succeeded (which promises the data
 * even if the fsync before failed), *wrote_all whether every write did. */
static const char *write_step; /* the step of do_write() that failed */

static int do_write(const char *path, const unsigned char *buf, size_t len, bool sync,
		    bool *closed, bool *wrote_all)
{
	int fd, err = 0;
	size_t done = 0;

	*closed = *wrote_all = false;
	write_step = "open";
	fd = open(path, O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0644);
	if (fd < 0)
		return errno;
	write_step = "write";
	while (done < len) {
		ssize_t n = write(fd, buf + done, len - done);

		if (n <= 0) {
			err = n < 0 ? errno : EIO;
			break;
		}
		done += (size_t)n;
	}
	*wrote_all = done == len;
	if (!err && sync && fsync(fd) != 0) {
		write_step = "fsync";
		err = errno;
	}
	if (close(fd) == 0) {
		*closed = done == len;
	} else if (!err) {
		write_step = "close";
		err = errno;
	}
	return err;
}

/* Appends " op(a,b)=result" to a name's history, dropping the oldest. */
static void note(struct name_state *x, int op, int a, int b, int err, size_t len)
{
	static const char *const names[W_N] = { "w", "wf", "mv", "rm", "mkdir", "rmdir" };
	char item[64];
	size_t il, hl;

	snprintf(item, sizeof(item), " %s(%d,%d%s%zu)=%s", names[op], a, b, len ? ",len " : "",
		 len, err ? fm_errname(err) : "ok");
	il = strlen(item);
	hl = strlen(x->hist);
	if (hl + il >= sizeof(x->hist)) {
		size_t cut = hl + il - sizeof(x->hist) + 1;

		memmove(x->hist, x->hist + cut, hl - cut + 1);
		hl -= cut;
	}
	memcpy(x->hist + hl, item, il + 1);
}

/* The end of ferry-mountd's log (on the metadata tmpfs), for a failure. */
static const char *mountd_log_tail(void)
{
	static char tail[6000];
	char path[PATH_MAX + 32], *all;
	size_t n;

	snprintf(path, sizeof(path), "%s/ferry-mountd.log", metafs);
	all = fm_slurp(path);
	if (!all)
		return "(no log)";
	n = strlen(all);
	snprintf(tail, sizeof(tail), "%s", n >= sizeof(tail) ? all + n - (sizeof(tail) - 1) : all);
	free(all);
	return tail;
}

/* Runs one operation, checks its errno is an honest one and updates the
 * model. must_succeed: the disk has room (a semantic refusal -- ENOENT,
 * EEXIST, ENOTEMPTY -- is still an answer). A namespace operation that
 * failed must have changed nothing, as on a local file system. */
static void one_op(struct model *m, uint64_t *rs, bool must_succeed)
{
	static unsigned char buf[LEN_MAX];
	int op = (int)(fm_rand(rs) % W_N), a = (int)(fm_rand(rs) % NAMES),
	    b = (int)(fm_rand(rs) % NAMES), dd = a % DIRS, err = 0;
	uint32_t seed = (uint32_t)fm_rand(rs);
	struct name_state *x = &m->f[a], *y = &m->f[b];
	bool closed, wrote_all;
	size_t len = 0;

	m->ops++;
	switch (op) {
	case W_WRITE:
	case W_WRITE_FSYNC:
		len = content(seed, buf);
		err = do_write(fpath(a), buf, len, op == W_WRITE_FSYNC, &closed, &wrote_all);
		cr_assert(!err || !must_succeed,
			  "write of file %d (%zu bytes, fsync %d) failed in %s with %s although "
			  "the disk has room (close %s); ferry-mountd's log ends:\n%s",
			  a, len, op == W_WRITE_FSYNC, write_step, fm_errname(err),
			  closed ? "returned 0" : "failed or not reached", mountd_log_tail());
		if (closed) {
			/* close() returned after every write did: the content is
			 * promised, whatever the fsync said. */
			set_one(x, (struct outcome){ CONTENT, seed });
		} else if (err) {
			/* Not told: the open may have created or truncated the
			 * file; the content only if every write went in. */
			add_outcome(x, (struct outcome){ EMPTY, 0 });
			if (wrote_all)
				add_outcome(x, (struct outcome){ CONTENT, seed });
		}
		break;
	case W_RENAME:
		err = rename(fpath(a), fpath(b)) ? errno : 0;
		if (!err && a != b) {
			struct name_state from = *x;
			int k = 0;

			/* It was there: only the present states of a move. */
			for (int i = 0; i < from.n; i++)
				if (from.o[i].kind != ABSENT)
					from.o[k++] = from.o[i];
			memcpy(y->o, from.o, sizeof(from.o));
			y->n = k ? k : from.n;
			set_one(x, (struct outcome){ ABSENT, 0 });
		}
		break;
	case W_UNLINK:
		err = unlink(fpath(a)) ? errno : 0;
		if (!err)
			set_one(x, (struct outcome){ ABSENT, 0 });
		break;
	case W_MKDIR:
		err = mkdir(dpath(dd), 0755) ? errno : 0;
		if (!err)
			m->d[dd] = true;
		break;
	case W_RMDIR:
		err = rmdir(dpath(dd)) ? errno : 0;
		if (!err)
			m->d[dd] = false;
		break;
	}
	if (op < W_MKDIR) {
		note(x, op, a, b, err, len);
		if (op == W_RENAME && a != b)
			note(y, op, a, b, err, 0);
	}
	if (!err || err == ENOENT || err == EEXIST || err == ENOTEMPTY)
		return;
	cr_assert(!must_succeed, "op %d on %d/%d failed with %s although the disk has room; "
		  "ferry-mountd's log ends:\n%s", op, a, b, fm_errname(err), mountd_log_tail());
	cr_assert(honest(err), "op %d on %d/%d failed with %s, not ENOSPC/EIO/EDQUOT", op, a, b,
		  fm_errname(err));
	m->failed++;
	m->enospc += err == ENOSPC;
	m->eio += err == EIO;
	atomic_fetch_add(&failures_seen, 1);
}

/* Metadata that only grows: a new xattr on the work directory. The files'
 * churn fits in the space the database and its WAL already hold (a WAL
 * reused from its start after a checkpoint needs no new blocks), so
 * without this the disk can be full with every operation succeeding;
 * this one must meet the fault sooner or later. Not modelled: verify()
 * looks at files and directories only. */
static void grow_op(struct model *m)
{
	static char value[4000];
	static int k;
	char name[64];
	int err;

	memset(value, 'x', sizeof(value));
	snprintf(name, sizeof(name), "user.grow.%d", k++);
	err = setxattr(mp("w"), name, value, sizeof(value), 0) ? errno : 0;
	if (!err)
		return;
	cr_assert(honest(err), "setxattr of %s failed with %s, not ENOSPC/EIO/EDQUOT", name,
		  fm_errname(err));
	m->failed++;
	m->enospc += err == ENOSPC;
	m->eio += err == EIO;
	atomic_fetch_add(&failures_seen, 1);
}

static bool state_is(const char *path, const struct outcome *o)
{
	static unsigned char want[LEN_MAX];
	struct stat st;
	size_t len, got_len = 0;
	unsigned char *got;
	bool ok;

	if (o->kind == ABSENT)
		return lstat(path, &st) < 0 && errno == ENOENT;
	if (lstat(path, &st) < 0 || !S_ISREG(st.st_mode))
		return false;
	if (o->kind == EMPTY)
		return st.st_size == 0;
	len = content(o->seed, want);
	got = fm_read_file(path, &got_len);
	ok = got && got_len == len && memcmp(got, want, len) == 0;
	free(got);
	return ok;
}

static void verify(const struct model *m, const char *when)
{
	static unsigned char want[LEN_MAX];
	struct stat st;

	for (int i = 0; i < NAMES; i++) {
		const struct name_state *x = &m->f[i];
		char states[256] = "";
		size_t sl = 0;
		bool ok = false;

		for (int k = 0; k < x->n && !ok; k++)
			ok = state_is(fpath(i), &x->o[k]);
		if (ok)
			continue;
		for (int k = 0; k < x->n && sl < sizeof(states) - 32; k++)
			sl += (size_t)snprintf(states + sl, sizeof(states) - sl, " %s",
					       x->o[k].kind == ABSENT ? "absent" :
					       x->o[k].kind == EMPTY ? "empty" : "content");
		if (lstat(fpath(i), &st) < 0)
			st.st_size = -1;
		cr_assert_fail("%s: file %d is in none of the states its returned operations allow "
			       "(%s%s; first content %zu bytes); it has %lld bytes; its history:%s",
			       when, i, states, "",
			       x->n && x->o[0].kind == CONTENT ? content(x->o[0].seed, want) : 0,
			       (long long)st.st_size, x->hist);
	}
	for (int i = 0; i < DIRS; i++) {
		bool there = stat(dpath(i), &st) == 0 && S_ISDIR(st.st_mode);

		cr_assert_eq(there, m->d[i], "%s: dir %d %s", when, i,
			     there ? "exists, should not" : "is missing");
	}
}

/* ---- the consistency check (there is no ferry fsck yet) ---- */

/* A query whose first column of its one row is an integer. */
static long long q_int(sqlite3 *db, const char *sql)
{
	sqlite3_stmt *st = NULL;
	long long v = -1;

	cr_assert_eq(sqlite3_prepare_v2(db, sql, -1, &st, NULL), SQLITE_OK, "%s: %s", sql,
		     sqlite3_errmsg(db));
	if (sqlite3_step(st) == SQLITE_ROW)
		v = sqlite3_column_int64(st, 0);
	sqlite3_finalize(st);
	return v;
}

static void meta_consistent(const char *db_path)
{
	sqlite3 *db = NULL;
	sqlite3_stmt *st = NULL;
	static const struct {
		const char *what, *sql;
	} rules[] = {
		{ "dentries naming no inode",
		  "SELECT COUNT(*) FROM dentry d LEFT JOIN inode i ON i.ino = d.ino "
		  "WHERE i.ino IS NULL" },
		{ "dentries whose parent is not a directory",
		  "SELECT COUNT(*) FROM dentry d LEFT JOIN inode p ON p.ino = d.parent "
		  "WHERE p.ino IS NULL OR (p.mode & 61440) != 16384" },
		{ "non-directories whose nlink is not their dentry count",
		  "SELECT COUNT(*) FROM inode i WHERE (i.mode & 61440) != 16384 AND i.nlink != "
		  "(SELECT COUNT(*) FROM dentry d WHERE d.ino = i.ino)" },
		{ "directories whose nlink is not 2 + their subdirectories",
		  "SELECT COUNT(*) FROM inode i WHERE (i.mode & 61440) = 16384 AND i.nlink != 2 + "
		  "(SELECT COUNT(*) FROM dentry d JOIN inode c ON c.ino = d.ino "
		  "WHERE d.parent = i.ino AND (c.mode & 61440) = 16384)" },
		{ "directories with other than one name (root: none)",
		  "SELECT COUNT(*) FROM inode i WHERE (i.mode & 61440) = 16384 AND "
		  "(SELECT COUNT(*) FROM dentry d WHERE d.ino = i.ino) != "
		  "CASE WHEN i.ino = 1 THEN 0 ELSE 1 END" },
		{ "inodes with no name left after a clean unmount",
		  "SELECT COUNT(*) FROM inode i WHERE i.ino != 1 AND NOT EXISTS "
		  "(SELECT 1 FROM dentry d WHERE d.ino = i.ino)" },
		{ "orphan rows after a clean unmount", "SELECT COUNT(*) FROM orphan" },
		{ "slices of inodes that do not exist",
		  "SELECT COUNT(*) FROM slice s LEFT JOIN inode i ON i.ino = s.ino "
		  "WHERE i.ino IS NULL" },
		{ "inode numbers at or past the allocator's next",
		  "SELECT COUNT(*) FROM inode WHERE ino >= (SELECT next_ino FROM counters)" },
		{ "dentries unreachable from the root",
		  "WITH RECURSIVE r(ino) AS (SELECT 1 UNION SELECT d.ino FROM dentry d "
		  "JOIN r ON d.parent = r.ino) "
		  "SELECT COUNT(*) FROM dentry WHERE parent NOT IN (SELECT ino FROM r)" },
	};

	cr_assert_eq(sqlite3_open_v2(db_path, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK,
		     "open %s: %s", db_path, sqlite3_errmsg(db));
	cr_assert_eq(sqlite3_prepare_v2(db, "PRAGMA integrity_check", -1, &st, NULL), SQLITE_OK);
	cr_assert_eq(sqlite3_step(st), SQLITE_ROW);
	cr_assert_str_eq((const char *)sqlite3_column_text(st, 0), "ok",
			 "integrity_check of %s", db_path);
	sqlite3_finalize(st);
	for (size_t k = 0; k < sizeof(rules) / sizeof(rules[0]); k++) {
		long long n = q_int(db, rules[k].sql);

		cr_assert_eq(n, 0, "metadata: %lld %s", n, rules[k].what);
	}
	sqlite3_close(db);
}

static void drained(void)
{
	struct fm_stats s;

	fm_wait_released(0); /* the gauge is 0 before a close's handoff too */
	for (int i = 0; i < 600; i++) {
		fm_stats_read(&s);
		if (fm_stats_need(&s, "passthrough_staging_blocks") == 0)
			return;
		usleep(100 * 1000);
	}
	cr_assert_fail("staged blocks never drained after the space came back");
}

Test(meta_full, full_metadata_disk_is_honest_and_loses_nothing)
{
	struct model m = { 0 };
	uint64_t rs = 0x6d657461;
	pthread_t filler;
	int during = 0;
	char db[PATH_MAX + 16];

	for (int i = 0; i < NAMES; i++)
		set_one(&m.f[i], (struct outcome){ ABSENT, 0 });
	OK(mkdir(mp("w"), 0755));
	for (int i = 0; i < OPS_BEFORE; i++)
		one_op(&m, &rs, true);
	cr_assert_eq(pthread_create(&filler, NULL, filler_main, NULL), 0);
	/* The workload goes on while the disk fills, stays full and is given
	 * back: each operation may meet any of the three. */
	while (atomic_load(&fill_state) != 2) {
		one_op(&m, &rs, false);
		if (++during % 4 == 0)
			grow_op(&m);
	}
	pthread_join(filler, NULL);
	cr_log_info("while the metadata disk was full: %d operations, %d failed (%d ENOSPC, "
		    "%d EIO)", during, m.failed, m.enospc, m.eio);
	cr_assert_gt(m.failed, 0, "no operation failed while the metadata disk was full: the "
		     "test did not reach the fault; ferry-mountd's log ends:\n%s", mountd_log_tail());
	/* The same mount, without a restart: everything works again. */
	for (int i = 0; i < OPS_AFTER; i++)
		one_op(&m, &rs, true);
	verify(&m, "live, after the space came back");
	drained();
	fm_remount_cold();
	verify(&m, "after a remount with an empty cache");
	fm_umount();
	snprintf(db, sizeof(db), "%s/meta.db", metafs);
	meta_consistent(db);
}
