/*
 * The metadata journal (meta_batch_ms): ferry-mountd makes namespace
 * changes inside one open SQLite transaction, journals each one on local
 * disk before it answers and commits the batch every meta_batch_ms, at
 * fsync/fsyncdir and at unmount. These tests check what that promises
 * through a real mount:
 *  - a SIGKILL inside an open batch (of ferry-mountd alone, or of
 *    ferry-mountd and ferry-reconciler) loses nothing that returned: the
 *    tree after the next mount equals the same steps run on a plain
 *    directory on the local disk, and the mount's own view before the kill;
 *  - fsync and fsyncdir commit the batch (read straight from the database:
 *    meta.db, or the volume's PostgreSQL schema), and
 *    without them the commit is deferred;
 *  - a SIGKILL at random points of a create/rename/unlink storm loses no
 *    operation whose call returned.
 * FERRY_JOURNAL_SEED=N fixes the random kill points of the storm test.
 */
#include "mount_util.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <libpq-fe.h>
#include <sqlite3.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

TestSuite(journal, .init = fm_setup, .fini = fm_teardown, .timeout = 240);

/* ---- helpers ------------------------------------------------------------ */

/* snprintf into an array that must not cut the text short. */
#define FMT(buf, ...)                                                         \
	do {                                                                  \
		int fmt_n_ = snprintf(buf, sizeof(buf), __VA_ARGS__);         \
		cr_assert(fmt_n_ >= 0 && (size_t)fmt_n_ < sizeof(buf),        \
			  "%s:%d: path too long", __FILE__, __LINE__);       \
	} while (0)

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static uint64_t stat_of(const char *name)
{
	struct fm_stats s;

	fm_stats_read(&s);
	return fm_stats_need(&s, name);
}

/* Logs the ferry-reconcilers of this fixture still running: after a kill of
 * ferry-mountd alone its reconciler is told to stop, and finishes what
 * does not wait for metadata only the next mount's journal replay commits
 * (a_reconciler_whose_mount_died_...). The tests mount again right away,
 * as a restarted pod would. */
static void note_reconcilers(const char *when)
{
	pid_t pids[8];
	int n = fm_daemon_pids("ferry-reconciler", pids, 8);

	if (n)
		cr_log_info("%s: %d ferry-reconciler(s) of the killed mount still running", when, n);
}

static void kill_reconcilers(void)
{
	pid_t rec[8];
	int n = fm_daemon_pids("ferry-reconciler", rec, 8);

	for (int i = 0; i < n; i++)
		kill(rec[i], SIGKILL);
}

/* SIGKILL ferry-mountd (and, with both, ferry-reconciler in the same
 * breath), then lazily unmount the dead mount (fm_crash). */
static void crash(bool both)
{
	if (both) {
		pid_t rec[8];

		cr_assert_geq(fm_daemon_pids("ferry-reconciler", rec, 8), 1,
			      "no ferry-reconciler found for %s", fm.dir);
		kill_reconcilers();
	}
	fm_crash();
	/* Between the two kills ferry-mountd may have seen its reconciler go
	 * and started another: both daemons die here. */
	if (both)
		kill_reconcilers();
	note_reconcilers("after the kill");
}

/* The tail of the volume's ferry-mountd.log, for messages. */
static const char *mountd_log_tail(void)
{
	static char buf[6000];
	char *all = fm_slurp(fm_mountd_log_path());
	size_t len;

	if (!all)
		return "(no ferry-mountd.log)";
	len = strlen(all);
	snprintf(buf, sizeof(buf), "%s", len >= sizeof(buf) ? all + len - (sizeof(buf) - 1) : all);
	free(all);
	return buf;
}

/* ---- a tree and its walk ------------------------------------------------- */

struct ent {
	char rel[256];
	struct stat st;
	char target[512];
};

struct tree {
	int n, cap;
	struct ent *e;
};

static void walk_rec(const char *root, const char *rel, struct tree *t)
{
	char dpath[PATH_MAX];
	DIR *d;
	struct dirent *de;

	snprintf(dpath, sizeof(dpath), "%s%s%s", root, rel[0] ? "/" : "", rel);
	d = opendir(dpath);
	cr_assert(d, "opendir %s: %s", dpath, strerror(errno));
	while ((de = readdir(d))) {
		struct ent *x;
		char full[PATH_MAX];

		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		/* The mount root's special files (.stats, .control); the tree
		 * itself has no dot names. */
		if (de->d_name[0] == '.')
			continue;
		if (t->n == t->cap) {
			t->cap = t->cap ? 2 * t->cap : 256;
			t->e = realloc(t->e, (size_t)t->cap * sizeof(*t->e));
			cr_assert(t->e);
		}
		x = &t->e[t->n++];
		memset(x, 0, sizeof(*x));
		FMT(x->rel, "%s%s%s", rel, rel[0] ? "/" : "", de->d_name);
		FMT(full, "%s/%s", root, x->rel);
		cr_assert(lstat(full, &x->st) == 0, "lstat %s: %s", full, strerror(errno));
		if (S_ISLNK(x->st.st_mode)) {
			ssize_t k = readlink(full, x->target, sizeof(x->target) - 1);

			cr_assert(k >= 0, "readlink %s: %s", full, strerror(errno));
			x->target[k] = '\0';
		}
		if (S_ISDIR(x->st.st_mode))
			walk_rec(root, x->rel, t);
	}
	closedir(d);
}

static int ent_cmp(const void *a, const void *b)
{
	return strcmp(((const struct ent *)a)->rel, ((const struct ent *)b)->rel);
}

static void walk(const char *root, struct tree *t)
{
	memset(t, 0, sizeof(*t));
	walk_rec(root, "", t);
	qsort(t->e, (size_t)t->n, sizeof(*t->e), ent_cmp);
}

static const struct ent *find_ent(const struct tree *t, const char *rel)
{
	struct ent key;

	snprintf(key.rel, sizeof(key.rel), "%s", rel);
	return bsearch(&key, t->e, (size_t)t->n, sizeof(*t->e), ent_cmp);
}

/* The user.* xattrs of path as sorted "name=value\n" text (values hex). */
static char *user_xattrs(const char *path)
{
	char names[16384], *out;
	size_t cap = 1 << 16, len = 0;
	ssize_t n = llistxattr(path, names, sizeof(names));
	const char *list[256];
	int cnt = 0;

	cr_assert(n >= 0, "llistxattr %s: %s", path, strerror(errno));
	for (ssize_t off = 0; off < n; off += (ssize_t)strlen(names + off) + 1)
		if (!strncmp(names + off, "user.", 5) && cnt < 256)
			list[cnt++] = names + off;
	for (int i = 1; i < cnt; i++)
		for (int j = i; j > 0 && strcmp(list[j - 1], list[j]) > 0; j--) {
			const char *tmp = list[j];
			list[j] = list[j - 1];
			list[j - 1] = tmp;
		}
	out = malloc(cap);
	cr_assert(out);
	out[0] = '\0';
	for (int i = 0; i < cnt; i++) {
		static unsigned char val[70000];
		ssize_t v = lgetxattr(path, list[i], val, sizeof(val));

		cr_assert(v >= 0, "lgetxattr %s %s: %s", path, list[i], strerror(errno));
		while (len + strlen(list[i]) + 2 * (size_t)v + 8 > cap) {
			cap *= 2;
			out = realloc(out, cap);
			cr_assert(out);
		}
		len += (size_t)sprintf(out + len, "%s=", list[i]);
		for (ssize_t k = 0; k < v; k++)
			len += (size_t)sprintf(out + len, "%02x", val[k]);
		out[len++] = '\n';
		out[len] = '\0';
	}
	return out;
}

static bool ts_eq(struct timespec a, struct timespec b)
{
	return a.tv_sec == b.tv_sec && a.tv_nsec == b.tv_nsec;
}

/*
 * The tree under got (the mount after the crash) against want (the same
 * steps on a plain local directory): names, types, modes, owners, sizes,
 * nlink of non-directories, contents, symlink targets, user xattrs, and
 * the mtimes set explicitly. Against before (the mount's own view just
 * before the kill): every mtime, and nlink of directories (a convention of
 * the file system, not necessarily ext4's).
 */
static void compare_trees(const char *got_root, const char *want_root, const struct tree *before)
{
	struct tree got, want;
	int missing = 0, extra = 0;
	char msg[4096] = "";
	size_t ml = 0;

	walk(got_root, &got);
	walk(want_root, &want);
	for (int i = 0; i < want.n; i++)
		if (!find_ent(&got, want.e[i].rel)) {
			missing++;
			if (ml < sizeof(msg) - 300)
				ml += (size_t)snprintf(msg + ml, sizeof(msg) - ml, " -%s", want.e[i].rel);
		}
	for (int i = 0; i < got.n; i++)
		if (!find_ent(&want, got.e[i].rel)) {
			extra++;
			if (ml < sizeof(msg) - 300)
				ml += (size_t)snprintf(msg + ml, sizeof(msg) - ml, " +%s", got.e[i].rel);
		}
	cr_assert(missing == 0 && extra == 0,
		  "after the crash: %d entries missing (-), %d that should not be there (+):%s\n"
		  "ferry-mountd.log:\n%s",
		  missing, extra, msg, mountd_log_tail());
	cr_assert_eq(got.n, want.n);
	for (int i = 0; i < got.n; i++) {
		const struct ent *g = &got.e[i], *w = &want.e[i];
		const struct ent *b = find_ent(before, g->rel);
		char gp[PATH_MAX], wp[PATH_MAX];

		cr_assert_str_eq(g->rel, w->rel);
		FMT(gp, "%s/%s", got_root, g->rel);
		FMT(wp, "%s/%s", want_root, w->rel);
		cr_assert_eq(g->st.st_mode, w->st.st_mode, "%s: mode 0%o, expected 0%o", g->rel,
			     g->st.st_mode, w->st.st_mode);
		cr_assert(g->st.st_uid == w->st.st_uid && g->st.st_gid == w->st.st_gid,
			  "%s: owner %d:%d, expected %d:%d", g->rel, g->st.st_uid, g->st.st_gid,
			  w->st.st_uid, w->st.st_gid);
		if (!S_ISDIR(g->st.st_mode)) {
			cr_assert_eq(g->st.st_size, w->st.st_size,
				     "%s: size %lld, expected %lld\nferry-mountd.log:\n%s", g->rel,
				     (long long)g->st.st_size, (long long)w->st.st_size,
				     mountd_log_tail());
			cr_assert_eq(g->st.st_nlink, w->st.st_nlink, "%s: nlink %lu, expected %lu",
				     g->rel, (unsigned long)g->st.st_nlink,
				     (unsigned long)w->st.st_nlink);
		}
		if (S_ISREG(g->st.st_mode))
			fm_assert_same_content(gp, wp);
		if (S_ISLNK(g->st.st_mode))
			cr_assert_str_eq(g->target, w->target, "%s: symlink to '%s', expected '%s'",
					 g->rel, g->target, w->target);
		if (!S_ISLNK(g->st.st_mode) && !S_ISFIFO(g->st.st_mode)) {
			char *gx = user_xattrs(gp), *wx = user_xattrs(wp);

			cr_assert_str_eq(gx, wx, "%s: xattrs\n%s\nexpected\n%s", g->rel, gx, wx);
			free(gx);
			free(wx);
		}
		/* Explicit mtimes (the tree sets them far in the past). */
		if (w->st.st_mtim.tv_sec < 1500000000)
			cr_assert(ts_eq(g->st.st_mtim, w->st.st_mtim),
				  "%s: mtime %lld.%09ld, set to %lld.%09ld", g->rel,
				  (long long)g->st.st_mtim.tv_sec, g->st.st_mtim.tv_nsec,
				  (long long)w->st.st_mtim.tv_sec, w->st.st_mtim.tv_nsec);
		if (b) {
			cr_assert(ts_eq(g->st.st_mtim, b->st.st_mtim),
				  "%s: mtime %lld.%09ld after the crash, %lld.%09ld before it",
				  g->rel, (long long)g->st.st_mtim.tv_sec, g->st.st_mtim.tv_nsec,
				  (long long)b->st.st_mtim.tv_sec, b->st.st_mtim.tv_nsec);
			cr_assert_eq(g->st.st_nlink, b->st.st_nlink,
				     "%s: nlink %lu after the crash, %lu before it", g->rel,
				     (unsigned long)g->st.st_nlink, (unsigned long)b->st.st_nlink);
			cr_assert_eq(g->st.st_ino, b->st.st_ino,
				     "%s: inode %llu after the crash, %llu before it", g->rel,
				     (unsigned long long)g->st.st_ino,
				     (unsigned long long)b->st.st_ino);
		}
	}
	free(got.e);
	free(want.e);
}

#define NFILES 200
#define LEN_MAX 12000

static size_t file_content(int i, unsigned char *buf)
{
	uint64_t st = 0xfe77 + (uint64_t)i * 7919;
	size_t len = i % 50 == 0 ? 0 : (size_t)(fm_rand(&st) % LEN_MAX) + 1;

	fm_fill_random(&st, buf, len);
	return len;
}

static const char *const dirs[] = { "a", "a/b", "a/b/c", "d", "e" };
#define NDIRS 5

static const char *P(const char *root, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static const char *P(const char *root, const char *fmt, ...)
{
	static char ring[8][PATH_MAX];
	static int slot;
	char rel[PATH_MAX];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(rel, sizeof(rel), fmt, ap);
	va_end(ap);
	slot = (slot + 1) % 8;
	FMT(ring[slot], "%s/%s", root, rel);
	return ring[slot];
}

static void set_times(const char *path, time_t at, long ans, time_t mt, long mns)
{
	struct timespec ts[2] = { { at, ans }, { mt, mns } };

	OK(utimensat(AT_FDCWD, path, ts, AT_SYMLINK_NOFOLLOW));
}

/*
 * Builds the tree under root. Run once on the mount and once on a plain
 * directory: the same calls in the same order.
 */
static void build_tree(const char *root)
{
	static unsigned char buf[LEN_MAX + 1];
	char big[3000]; /* ext4 (the oracle) takes no more in one xattr block */
	int fd;

	for (int i = 0; i < NDIRS; i++)
		OK(mkdir(P(root, "%s", dirs[i]), 0755));
	OK(mkdir(P(root, "private"), 0700));
	for (int i = 0; i < NFILES; i++) {
		size_t len = file_content(i, buf);

		fm_write_file(P(root, "%s/f%03d", dirs[i % NDIRS], i), buf, len);
	}
	/* Renames: across directories, within one, and over an existing
	 * file (which goes). */
	for (int i = 3; i < NFILES; i += 20)
		OK(rename(P(root, "%s/f%03d", dirs[i % NDIRS], i),
			  P(root, "%s/moved%03d", dirs[(i + 2) % NDIRS], i)));
	OK(rename(P(root, "e/f004"), P(root, "e/renamed004")));
	OK(rename(P(root, "a/f010"), P(root, "a/b/f011"))); /* replaces f011 */
	/* Unlinks. */
	for (int i = 7; i < NFILES; i += 15)
		if (i % 20 != 3)
			OK(unlink(P(root, "%s/f%03d", dirs[i % NDIRS], i)));
	/* A directory rename, with what it holds. */
	OK(rename(P(root, "a/b"), P(root, "d/bb")));
	OK(mkdir(P(root, "d/bb/new"), 0750));
	OK(rmdir(P(root, "d/bb/new")));
	OK(mkdir(P(root, "d/bb/kept"), 0750));
	/* Hard links: one kept with both names, one whose first name goes. */
	OK(link(P(root, "e/f009"), P(root, "a/hl009")));
	OK(link(P(root, "e/f014"), P(root, "d/hl014")));
	OK(unlink(P(root, "e/f014")));
	OK(link(P(root, "d/f018"), P(root, "private/hl018a")));
	OK(link(P(root, "d/f018"), P(root, "private/hl018b")));
	/* Symlinks: relative, dangling, long. */
	OK(symlink("../e/f019", P(root, "a/sl019")));
	OK(symlink("/nowhere/at/all", P(root, "d/dangling")));
	memset(big, 'x', 1000);
	big[1000] = '\0';
	OK(symlink(big, P(root, "e/longlink")));
	/* A FIFO (mknod). */
	OK(mknod(P(root, "e/fifo"), S_IFIFO | 0640, 0));
	/* Modes and owners. */
	OK(chmod(P(root, "e/f024"), 0600));
	OK(chmod(P(root, "a/f025"), 04755));
	OK(chmod(P(root, "d"), 0711));
	OK(chown(P(root, "e/f029"), FM_NOBODY_UID, FM_NOBODY_GID));
	OK(chown(P(root, "d/bb/kept"), FM_NOBODY_UID, 0));
	OK(lchown(P(root, "a/sl019"), FM_NOBODY_UID, FM_NOBODY_GID));
	/* Truncates of existing files: shorter, longer, to zero (one through
	 * an open fd). */
	OK(truncate(P(root, "a/f030"), 100));
	OK(truncate(P(root, "e/f034"), 20000));
	fd = OK(open(P(root, "d/f038"), O_WRONLY | O_TRUNC));
	OK(close(fd));
	fd = OK(open(P(root, "e/f039"), O_WRONLY));
	OK(ftruncate(fd, 7));
	OK(close(fd));
	/* xattrs: set, replace, remove, a large value, on a directory. */
	OK(setxattr(P(root, "e/f044"), "user.one", "1", 1, 0));
	OK(setxattr(P(root, "e/f044"), "user.two", "two", 3, XATTR_CREATE));
	OK(setxattr(P(root, "e/f044"), "user.one", "uno", 3, XATTR_REPLACE));
	OK(setxattr(P(root, "e/f044"), "user.gone", "x", 1, 0));
	OK(removexattr(P(root, "e/f044"), "user.gone"));
	memset(big, 0, sizeof(big));
	for (size_t k = 0; k < sizeof(big); k++)
		big[k] = (char)(k * 31);
	OK(setxattr(P(root, "a/f045"), "user.big", big, sizeof(big), 0));
	OK(setxattr(P(root, "d/bb"), "user.dir", "on a dir", 8, 0));
	OK(setxattr(P(root, "a/hl009"), "user.link", "via the link", 12, 0));
	OK(setxattr(P(root, "e/f049"), "user.empty", "", 0, 0));
	/* Explicit times last (the steps above change mtimes). */
	set_times(P(root, "e/f019"), 1000000000, 123456789, 1234567890, 987654321);
	set_times(P(root, "a/f030"), 1100000000, 1, 1200000000, 999999999);
	set_times(P(root, "d/bb/c"), 1300000000, 0, 1300000001, 500);
	set_times(P(root, "e/fifo"), 1400000000, 0, 1400000000, 42);
	set_times(P(root, "e/f054"), 0, 0, 86400, 0);
}

/* Run the steps on the mount and on <scratch>/oracle, snapshot the mount,
 * kill inside the open batch, mount again and compare. */
static void kill_inside_batch(bool both)
{
	char oracle[PATH_MAX]; /* sp()'s buffer is reused */
	struct tree before;
	uint64_t pending = 0;
	double t0;

	FMT(oracle, "%s", sp("oracle"));
	fm_umount();
	fm_mount_with("meta_batch_ms=1000");
	cr_assert_eq(stat_of("meta_batch_ms"), 1000);
	OK(mkdir(oracle, 0755));
	build_tree(oracle);
	t0 = now_s();
	build_tree(fm.mnt);
	cr_log_info("built the tree on the mount in %.2f s", now_s() - t0);
	/* The uploads committed first: a reconciler waiting to commit one has
	 * the batch commit within a few ms (the flusher looks for it), which
	 * could come between the look at the batch below and the kill. */
	fm_wait_committed("the tree's uploads", 60);
	walk(fm.mnt, &before);
	/* The kill must land inside an open batch: if the flusher just
	 * committed, make one more change (on both sides). */
	for (int k = 0; k < 20; k++) {
		char name[32];

		pending = stat_of("meta_journal_pending");
		if (pending > 0)
			break;
		snprintf(name, sizeof(name), "user.nudge%d", k);
		OK(setxattr(P(oracle, "e/f059"), name, "n", 1, 0));
		OK(setxattr(mp("e/f059"), name, "n", 1, 0));
	}
	cr_assert_gt(pending, 0, "nothing pending in the batch just before the kill");
	cr_log_info("%llu journal records pending at the kill (%llu batches committed so far)",
		    (unsigned long long)pending, (unsigned long long)stat_of("meta_batches"));
	crash(both);
	fm_mount();
	struct fm_stats s;
	fm_stats_read(&s);
	uint64_t replayed = fm_stats_need(&s, "meta_journal_replayed");
	uint64_t errors = fm_stats_need(&s, "meta_journal_replay_errors");
	cr_assert_gt(replayed, 0, "the mount after the kill replayed nothing\n%s", mountd_log_tail());
	cr_assert_geq(replayed, pending, "replayed %llu records, %llu were pending",
		      (unsigned long long)replayed, (unsigned long long)pending);
	cr_assert_eq(errors, 0, "%llu journal records failed to replay\n%s",
		     (unsigned long long)errors, mountd_log_tail());
	cr_assert_eq(fm_stats_need(&s, "meta_batch_commit_failures"), 0);
	compare_trees(fm.mnt, oracle, &before);
	/* And once more after a clean unmount (the replayed batch was
	 * committed, not only held in memory). */
	fm_remount_cold();
	compare_trees(fm.mnt, oracle, &before);
	free(before.e);
}

Test(journal, kill_inside_a_batch_loses_nothing)
{
	kill_inside_batch(false);
}

Test(journal, kill_of_mountd_and_reconciler_inside_a_batch_loses_nothing)
{
	kill_inside_batch(true);
}

/* ferry-mountd killed with its batch open while its reconciler holds jobs
 * for files that batch made: each commit waits for journal records only
 * the next ferry-mountd's start replays, and that start waits for the old
 * reconciler to exit. It exits at once, leaving the jobs journaled, and
 * the next mount finishes them. */
Test(journal, a_reconciler_whose_mount_died_leaves_what_waits_for_its_journal)
{
	unsigned char want[8][4096];
	uint64_t seed = 5, pending = 0;
	pid_t rec[8];
	int n = 0, tries;

	fm_umount();
	fm_mount_with("meta_batch_ms=1000,upload_quiet_ms=600000,upload_delay_max_ms=600000");
	cr_assert_eq(fm_daemon_pids("ferry-reconciler", rec, 8), 1);
	/* The files' creates must still be in the open batch at the kill. */
	for (tries = 0; tries < 20; tries++) {
		for (int i = 0; i < 8; i++) {
			fm_fill_random(&seed, want[i], sizeof(want[i]));
			fm_write_file(mp("t%d-f%d", tries, i), want[i], sizeof(want[i]));
		}
		fm_wait_released(0);
		pending = stat_of("meta_journal_pending");
		if (pending >= 8)
			break;
	}
	cr_assert_geq(pending, 8, "the batch committed before every try's kill");
	crash(false);
	double t0 = now_s();
	while (kill(rec[0], 0) == 0 && now_s() - t0 < 30)
		usleep(20 * 1000);
	cr_assert_neq(kill(rec[0], 0), 0,
		      "ferry-reconciler %d still runs %.0f s after its ferry-mountd was killed",
		      (int)rec[0], now_s() - t0);
	cr_log_info("the reconciler exited %.2f s after the kill", now_s() - t0);
	t0 = now_s();
	fm_mount();
	cr_log_info("mounted again in %.2f s", now_s() - t0);
	n = fm_daemon_pids("ferry-reconciler", rec, 8);
	cr_assert_eq(n, 1, "%d reconcilers after the mount", n);
	fm_wait_committed("the left jobs", 60);
	fm_remount_cold();
	for (int i = 0; i < 8; i++)
		fm_expect_content(mp("t%d-f%d", tries, i), want[i], sizeof(want[i]));
}

/* ---- fsync / fsyncdir commit the batch ------------------------------------ */

/* The next component of *p, into comp (NUL-terminated); its length. */
static size_t path_next(const char **p, char *comp)
{
	size_t l = strcspn(*p, "/");

	memcpy(comp, *p, l);
	comp[l] = '\0';
	*p += l;
	if (**p == '/')
		(*p)++;
	return l;
}

/* db_lookup() on a PostgreSQL volume: its schema, read over a connection of
 * our own in one read-only transaction. */
static uint64_t pg_lookup(const char *rel)
{
	const char *url = getenv("FERRY_TEST_PG_URL");
	char comp[PATH_MAX], sql[160], inos[24];
	uint64_t ino = 1; /* META_ROOT_INO */
	const char *p = rel;
	PGresult *res;
	PGconn *h;

	cr_assert(url && *url, "FERRY_TEST_PG_URL is not set");
	h = PQconnectdb(url);
	cr_assert_eq(PQstatus(h), CONNECTION_OK, "connect: %s", PQerrorMessage(h));
	snprintf(sql, sizeof(sql), "BEGIN READ ONLY; SET LOCAL search_path = %s", fm.pg_schema);
	res = PQexec(h, sql);
	cr_assert_eq(PQresultStatus(res), PGRES_COMMAND_OK, "%s: %s", sql, PQerrorMessage(h));
	PQclear(res);
	while (*p && ino) {
		size_t l = path_next(&p, comp);
		const char *vals[2] = { inos, comp };
		int lens[2] = { 0, (int)l }, fmts[2] = { 0, 1 };

		snprintf(inos, sizeof(inos), "%llu", (unsigned long long)ino);
		res = PQexecParams(h, "SELECT ino FROM dentry WHERE parent = $1 AND name = $2", 2,
				   NULL, vals, lens, fmts, 0);
		cr_assert_eq(PQresultStatus(res), PGRES_TUPLES_OK, "query %s: %s", rel,
			     PQerrorMessage(h));
		ino = PQntuples(res) ? strtoull(PQgetvalue(res, 0, 0), NULL, 10) : 0;
		PQclear(res);
	}
	PQclear(PQexec(h, "COMMIT"));
	PQfinish(h);
	return ino;
}

/* The inode a path names in the committed database (read-only connection
 * of our own), or 0 if it is not there. */
static uint64_t db_lookup(const char *rel)
{
	sqlite3 *db = NULL;
	sqlite3_stmt *st = NULL;
	char path[PATH_MAX], comp[PATH_MAX];
	uint64_t ino = 1; /* META_ROOT_INO */
	const char *p = rel;
	int rc;

	if (fm.pg_schema[0])
		return pg_lookup(rel);
	FMT(path, "%s/meta.db", fm.vol);
	rc = sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL);
	cr_assert_eq(rc, SQLITE_OK, "open %s: %s", path, db ? sqlite3_errmsg(db) : "?");
	sqlite3_busy_timeout(db, 5000);
	rc = sqlite3_prepare_v2(db, "SELECT ino FROM dentry WHERE parent = ?1 AND name = ?2", -1,
				&st, NULL);
	cr_assert_eq(rc, SQLITE_OK, "prepare: %s", sqlite3_errmsg(db));
	/* One read transaction for the whole walk. */
	cr_assert_eq(sqlite3_exec(db, "BEGIN", NULL, NULL, NULL), SQLITE_OK);
	while (*p && ino) {
		size_t l = path_next(&p, comp);

		sqlite3_reset(st);
		sqlite3_bind_int64(st, 1, (sqlite3_int64)ino);
		sqlite3_bind_blob(st, 2, comp, (int)l, SQLITE_TRANSIENT);
		rc = sqlite3_step(st);
		if (rc == SQLITE_ROW) {
			ino = (uint64_t)sqlite3_column_int64(st, 0);
		} else {
			cr_assert_eq(rc, SQLITE_DONE, "query %s: %s", rel, sqlite3_errmsg(db));
			ino = 0;
		}
	}
	sqlite3_finalize(st);
	sqlite3_exec(db, "COMMIT", NULL, NULL, NULL);
	sqlite3_close(db);
	return ino;
}

static void assert_in_db(const char *rel, const char *when)
{
	struct stat sb;
	uint64_t ino = db_lookup(rel);

	cr_assert(ino != 0, "%s is not in the committed database %s\n%s", rel, when,
		  mountd_log_tail());
	/* Node ids are inode numbers. */
	if (fm.mounted && lstat(mp("%s", rel), &sb) == 0)
		cr_assert_eq((uint64_t)sb.st_ino, ino, "%s: st_ino %llu, row names %llu", rel,
			     (unsigned long long)sb.st_ino, (unsigned long long)ino);
}

/* Asserts that rel is not yet committed if fewer than 500 ms passed since
 * t0 (the start of the change); too slow a machine only logs. Returns
 * whether it checked. */
static bool check_deferred(const char *rel, double t0, bool want_absent, const char *what)
{
	uint64_t ino = db_lookup(rel);
	double dt = now_s() - t0;

	if (dt >= 0.5) {
		cr_log_info("%s: %.0f ms passed before the database was read: the deferral "
			    "is not checked", what, dt * 1000);
		return false;
	}
	if (want_absent)
		cr_assert(ino == 0, "%s: %s is committed %.0f ms after the change, with "
			  "meta_batch_ms=1000 and no fsync", what, rel, dt * 1000);
	else
		cr_assert(ino != 0, "%s: %s is gone from the committed database %.0f ms after "
			  "the change, with meta_batch_ms=1000 and no fsync", what, rel, dt * 1000);
	return true;
}

/* Returns once path's last close is uploaded and committed. */
static void settle(const char *path)
{
	int fd = OK(open(path, O_RDONLY));

	OK(fsync(fd));
	OK(close(fd));
}

Test(journal, fsync_commits_the_batch)
{
	int fd, dfd, checked = 0;
	double t0;

	fm_umount();
	fm_mount_with("meta_batch_ms=1000");
	cr_assert_eq(stat_of("meta_batch_ms"), 1000);

	/* fsync of a file commits it and its new directory. */
	OK(mkdir(mp("d2"), 0755));
	fd = OK(open(mp("d2/synced"), O_CREAT | O_WRONLY, 0644));
	fm_pwrite_all(fd, "hello", 5, 0);
	OK(fsync(fd));
	assert_in_db("d2", "right after fsync of a file in it");
	assert_in_db("d2/synced", "right after fsync");
	OK(close(fd));

	/* A create without fsync waits for the batch (unless another writer
	 * of the database, the reconciler with an upload, asks it to commit:
	 * so let the uploads of earlier closes finish first; fsync of a
	 * reader's fd waits for them). */
	settle(mp("d2/synced"));
	t0 = now_s();
	fd = OK(open(mp("d2/unsynced"), O_CREAT | O_WRONLY, 0644));
	OK(close(fd));
	checked += check_deferred("d2/unsynced", t0, true, "create without fsync");
	cr_assert_gt(stat_of("meta_journal_pending") + (checked ? 0 : 1), 0);

	/* fsyncdir after a mkdir and a rename into it. */
	fm_write_file(mp("d2/tomove"), "move me", 7);
	OK(mkdir(mp("d3"), 0755));
	OK(rename(mp("d2/tomove"), mp("d3/moved")));
	dfd = OK(open(mp("d3"), O_RDONLY | O_DIRECTORY));
	OK(fsync(dfd));
	OK(close(dfd));
	assert_in_db("d3", "right after fsyncdir");
	assert_in_db("d3/moved", "right after fsyncdir");
	cr_assert_eq(db_lookup("d2/tomove"), 0, "d2/tomove is still committed after fsyncdir of "
		     "the directory it was renamed into");
	/* The fsync committed the whole batch: the earlier create too. */
	assert_in_db("d2/unsynced", "after a later fsyncdir");

	/* Without fsyncdir a mkdir and a rename wait for the batch. */
	settle(mp("d3/moved"));
	settle(mp("d2/unsynced"));
	t0 = now_s();
	OK(mkdir(mp("d4"), 0755));
	OK(rename(mp("d3/moved"), mp("d4/moved2")));
	if (check_deferred("d4", t0, true, "mkdir without fsyncdir")) {
		checked++;
		cr_assert(db_lookup("d3/moved") != 0 && db_lookup("d4/moved2") == 0,
			  "the rename d3/moved -> d4/moved2 committed with no fsyncdir");
	}
	cr_log_info("deferral checked %d of 2 times", checked);

	/* The batch commits on its own, within meta_batch_ms and some. */
	for (int t = 0; t < 100 && db_lookup("d4/moved2") == 0; t++)
		usleep(50 * 1000);
	assert_in_db("d4/moved2", "5 s after the rename (meta_batch_ms=1000)");

	/* A last change, then unmount: the unmount commits it. */
	OK(mkdir(mp("d5"), 0755));
	fm_write_file(mp("d5/last"), "last", 4);
	fm_umount();
	assert_in_db("d2/synced", "after unmount");
	assert_in_db("d2/unsynced", "after unmount");
	assert_in_db("d4/moved2", "after unmount");
	assert_in_db("d5/last", "after unmount");
	cr_assert_eq(db_lookup("d3/moved"), 0);
	cr_assert_eq(db_lookup("d2/tomove"), 0);
	fm_mount();
	fm_expect_content(mp("d2/synced"), "hello", 5);
	fm_expect_content(mp("d4/moved2"), "move me", 7);
	fm_expect_content(mp("d5/last"), "last", 4);
}

/* ---- a create storm killed at random points ------------------------------ */

#define STORM_MAX 100000
#define STORM_LEN_MAX 6000

enum { S_CREATE, S_RENAME, S_UNLINK };

struct srec {
	int done; /* 0 begun, 1 returned 0 */
	int op, i;
};

static size_t storm_content(int round, int i, unsigned char *buf)
{
	uint64_t st = 0x5707 + (uint64_t)round * 1000003 + (uint64_t)i * 31;
	size_t len = (size_t)(fm_rand(&st) % STORM_LEN_MAX) + 1;

	fm_fill_random(&st, buf, len);
	/* unique: the index in the first bytes */
	memcpy(buf, &i, len < sizeof(i) ? len : sizeof(i));
	return len;
}

static void storm_name(char *out, size_t cap, const char *root, int round, int i, bool renamed)
{
	if (renamed)
		snprintf(out, cap, "%s/s%d/moved/r%d", root, round, i);
	else
		snprintf(out, cap, "%s/s%d/f%d", root, round, i);
}

static void tell(int fd, struct srec r)
{
	if (write(fd, &r, sizeof(r)) != (ssize_t)sizeof(r))
		_exit(0);
}

/* The child: create+write+close each file; every 10th renamed (into
 * another directory), every 7th unlinked. Each call is told before it
 * starts and after it returned 0; the first failure ends it. */
static void storm_child(int round, int out)
{
	static unsigned char buf[STORM_LEN_MAX];

	for (int i = 0; i < STORM_MAX; i++) {
		char a[PATH_MAX + 64], b[PATH_MAX + 64];
		size_t len = storm_content(round, i, buf);
		int fd;

		storm_name(a, sizeof(a), fm.mnt, round, i, false);
		tell(out, (struct srec){ 0, S_CREATE, i });
		fd = open(a, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0644);
		if (fd < 0)
			_exit(0);
		if (write(fd, buf, len) != (ssize_t)len || close(fd) != 0)
			_exit(0);
		tell(out, (struct srec){ 1, S_CREATE, i });
		if (i % 10 == 0) {
			storm_name(b, sizeof(b), fm.mnt, round, i, true);
			tell(out, (struct srec){ 0, S_RENAME, i });
			if (rename(a, b) != 0)
				_exit(0);
			tell(out, (struct srec){ 1, S_RENAME, i });
			memcpy(a, b, sizeof(a));
		}
		if (i % 7 == 0) {
			tell(out, (struct srec){ 0, S_UNLINK, i });
			if (unlink(a) != 0)
				_exit(0);
			tell(out, (struct srec){ 1, S_UNLINK, i });
		}
	}
	_exit(0);
}

/* What the parent knows of file i. */
struct sfile {
	bool created, renamed, unlinked; /* returned */
	int inflight;                     /* -1, or the op begun and not returned */
};

/* Checks round's directory on the mount against what the child reported. */
static void storm_check(int round, struct sfile *f, int nf)
{
	static unsigned char want[STORM_LEN_MAX];
	char dir[PATH_MAX];
	int present = 0;

	for (int i = 0; i < nf; i++) {
		char pf[PATH_MAX + 64], pr[PATH_MAX + 64];
		size_t len = storm_content(round, i, want);
		struct stat sb;
		bool has_f, has_r;

		storm_name(pf, sizeof(pf), fm.mnt, round, i, false);
		storm_name(pr, sizeof(pr), fm.mnt, round, i, true);
		has_f = lstat(pf, &sb) == 0;
		has_r = lstat(pr, &sb) == 0;
		if (f[i].inflight == S_CREATE) {
			/* May be there or not, with any part of its content. */
			cr_assert(!has_r, "s%d: r%d exists, its file was still being created", round, i);
			present += has_f;
			continue;
		}
		if (!f[i].created)
			cr_assert(!has_f && !has_r, "s%d: file %d exists, its create never began",
				  round, i);
		if (!f[i].created)
			continue;
		if (f[i].inflight == S_RENAME) {
			cr_assert(has_f != has_r, "s%d: %d in flight of a rename: f%d %s, r%d %s",
				  round, i, i, has_f ? "present" : "absent", i,
				  has_r ? "present" : "absent");
		} else if (f[i].inflight == S_UNLINK) {
			cr_assert(!(has_f && has_r), "s%d: %d under both names", round, i);
			if (f[i].renamed)
				cr_assert(!has_f, "s%d: f%d present after its rename returned", round, i);
			else
				cr_assert(!has_r, "s%d: r%d present, never renamed", round, i);
		} else if (f[i].unlinked) {
			cr_assert(!has_f && !has_r,
				  "s%d: %d is there (as %s) after its unlink returned\n%s", round, i,
				  has_f ? "f" : "r", mountd_log_tail());
		} else if (f[i].renamed) {
			cr_assert(has_r && !has_f,
				  "s%d: renamed %d: f%d %s, r%d %s (rename returned)\n%s", round, i, i,
				  has_f ? "present" : "absent", i, has_r ? "present" : "absent",
				  mountd_log_tail());
		} else {
			cr_assert(has_f && !has_r,
				  "s%d: f%d %s, r%d %s (its create returned)\n%s", round, i,
				  has_f ? "present" : "absent", i, has_r ? "present" : "absent",
				  mountd_log_tail());
		}
		if (has_f || has_r) {
			fm_expect_content(has_f ? pf : pr, want, len);
			present++;
		}
	}
	/* Nothing else is there. */
	int entries = 0;
	for (int sub = 0; sub < 2; sub++) {
		DIR *d;
		struct dirent *de;

		FMT(dir, "%s/s%d%s", fm.mnt, round, sub ? "/moved" : "");
		d = opendir(dir);
		cr_assert(d, "opendir %s: %s", dir, strerror(errno));
		while ((de = readdir(d))) {
			int idx;
			char c;

			if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..") ||
			    (!sub && !strcmp(de->d_name, "moved")))
				continue;
			cr_assert(sscanf(de->d_name, sub ? "r%d%c" : "f%d%c", &idx, &c) == 1 &&
					  idx >= 0 && idx < nf,
				  "s%d: unexpected entry %s%s", round, sub ? "moved/" : "", de->d_name);
			entries++;
		}
		closedir(d);
	}
	cr_assert_eq(entries, present, "s%d: %d entries, %d expected", round, entries, present);
}

struct sround {
	struct sfile *f;
	int nf;
};

Test(journal, random_kill_points_in_a_create_storm, .timeout = 300)
{
	const char *env = getenv("FERRY_JOURNAL_SEED");
	uint64_t seed = env ? strtoull(env, NULL, 0) : (uint64_t)time(NULL);
	struct sround rounds[5] = { 0 };
	const int nrounds = 5;

	cr_log_info("storm: FERRY_JOURNAL_SEED=%llu", (unsigned long long)seed);
	seed = seed * 2654435761u + 1;
	fm_umount();
	for (int round = 0; round < nrounds; round++) {
		int p[2], status;
		unsigned delay_ms = 50 + (unsigned)(fm_rand(&seed) % 651);
		bool both = round % 2 == 1;
		pid_t child;
		struct srec r;
		int cap = 4096, last_created = -1, ndone = 0;
		double t0;

		fm_mount_with("meta_batch_ms=200");
		OK(mkdir(mp("s%d", round), 0755));
		OK(mkdir(mp("s%d/moved", round), 0755));
		cr_assert_eq(pipe2(p, O_CLOEXEC), 0);
		child = fork();
		cr_assert_geq(child, 0);
		if (child == 0) {
			close(p[0]);
			storm_child(round, p[1]);
		}
		close(p[1]);
		t0 = now_s();
		usleep(delay_ms * 1000);
		uint64_t pending = stat_of("meta_journal_pending");
		crash(both);
		kill(child, SIGKILL);
		waitpid(child, &status, 0);

		struct sfile *f = calloc((size_t)cap, sizeof(*f));
		cr_assert(f);
		for (int i = 0; i < cap; i++)
			f[i].inflight = -1;
		while (read(p[0], &r, sizeof(r)) == (ssize_t)sizeof(r)) {
			if (r.i >= cap) {
				f = realloc(f, (size_t)cap * 2 * sizeof(*f));
				cr_assert(f);
				memset(f + cap, 0, (size_t)cap * sizeof(*f));
				for (int i = cap; i < 2 * cap; i++)
					f[i].inflight = -1;
				cap *= 2;
			}
			if (!r.done) {
				f[r.i].inflight = r.op;
				continue;
			}
			f[r.i].inflight = -1;
			ndone++;
			if (r.op == S_CREATE) {
				f[r.i].created = true;
				last_created = r.i;
			} else if (r.op == S_RENAME) {
				f[r.i].renamed = true;
			} else {
				f[r.i].unlinked = true;
			}
		}
		close(p[0]);
		rounds[round].f = f;
		rounds[round].nf = last_created + 2; /* and the one in flight */
		if (rounds[round].nf > cap)
			rounds[round].nf = cap;
		cr_log_info("storm round %d: kill of %s after %u ms (%.0f ms): %d calls returned, "
			    "%d files created, %llu journal records pending shortly before",
			    round, both ? "ferry-mountd and ferry-reconciler" : "ferry-mountd",
			    delay_ms, (now_s() - t0) * 1000, ndone, last_created + 1,
			    (unsigned long long)pending);
		fm_mount();
		struct fm_stats s;
		fm_stats_read(&s);
		cr_assert_eq(fm_stats_need(&s, "meta_journal_replay_errors"), 0,
			     "round %d: journal records failed to replay\n%s", round,
			     mountd_log_tail());
		cr_log_info("storm round %d: %llu records replayed", round,
			    (unsigned long long)fm_stats_need(&s, "meta_journal_replayed"));
		/* This round, and every earlier one again. */
		for (int k = 0; k <= round; k++)
			storm_check(k, rounds[k].f, rounds[k].nf);
		fm_umount();
	}
	fm_mount();
	for (int k = 0; k < nrounds; k++) {
		storm_check(k, rounds[k].f, rounds[k].nf);
		free(rounds[k].f);
	}
}

/* ---- closes whose upload is in flight ------------------------------------ */

/* Stops (SIGSTOP) or resumes (SIGCONT) this mount's ferry-reconciler, so
 * that uploads stay in flight for as long as a test needs. */
static void reconciler_signal(int sig)
{
	pid_t rec[8];
	int n = fm_daemon_pids("ferry-reconciler", rec, 8);

	cr_assert_geq(n, 1, "no ferry-reconciler found for %s", fm.dir);
	for (int i = 0; i < n; i++)
		kill(rec[i], sig);
}

/*
 * A reader of a file whose upload is in flight reads what the close left,
 * at once, from the staging file; utimensat() after close() (tar, cp -p,
 * git clone) returns at once too, and the upload's commit, made later,
 * keeps those times: after it, after a remount, and after a SIGKILL of
 * both daemons with the upload still in flight.
 */
Test(journal, closes_in_flight_do_not_hold_readers_or_utimes)
{
	const struct timespec set[2] = { { 1500000000, 1 }, { 1600000000, 123456789 } };
	char body[64], got[64];
	double t0, read_s, utimes_s;
	struct stat st_in_flight;
	uint64_t waits0;
	int fd, n, round;

	/* The default window: long on SQLite, whose reconciler signals that
	 * it waits; short on PostgreSQL, where it would wait out the batch. */
	cr_assert_eq(stat_of("meta_batch_ms"), fm.pg_schema[0] ? 5 : 50);
	if (fm.no_reconciler) {
		fm_teardown();
		cr_skip_test("needs a reconciler");
	}
	/* On the daemon path (passthrough off) a staging file holds only the
	 * ranges written: readers wait for the upload there. */
	bool pt = stat_of("passthrough_active") == 1;
	for (round = 0; round < 2; round++) {
		waits0 = stat_of("reopen_waits");
		uint64_t reads0 = stat_of("inflight_reads"), handoffs0 = stat_of("handoffs");
		snprintf(body, sizeof(body), "in flight, round %d", round);
		reconciler_signal(SIGSTOP);
		fm_write_file(mp("f%d", round), body, strlen(body));
		/* RELEASE comes after close() returns: wait for its handoff. */
		for (int t = 0; t < 500 && stat_of("handoffs") == handoffs0; t++)
			usleep(10 * 1000);
		bool handed = stat_of("handoffs") > handoffs0;
		t0 = now_s();
		fd = pt ? open(mp("f%d", round), O_RDONLY) : -1;
		n = fd >= 0 ? (int)read(fd, got, sizeof(got)) : -1;
		if (fd >= 0)
			close(fd);
		read_s = now_s() - t0;
		t0 = now_s();
		int urc = utimensat(AT_FDCWD, mp("f%d", round), set, 0);
		utimes_s = now_s() - t0;
		int src = stat(mp("f%d", round), &st_in_flight);
		uint64_t reads1 = stat_of("inflight_reads"), waits1 = stat_of("reopen_waits");
		if (round == 1) {
			/* Both daemons die with the upload in flight. */
			crash(true);
			fm_mount();
		} else {
			reconciler_signal(SIGCONT);
		}
		cr_assert(handed, "the close was not handed to the reconciler within 5 s");
		if (pt) {
			cr_assert_gt(reads1, reads0, "the reader did not read the staging file in flight");
			cr_assert_eq(n, (int)strlen(body), "read %d bytes in flight", n);
			cr_assert(memcmp(got, body, (size_t)n) == 0);
		}
		cr_assert_eq(urc, 0, "utimensat: %s", strerror(errno));
		cr_assert_eq(src, 0);
		/* With the reconciler stopped the upload cannot end: a call that
		 * waited for it would have failed (EIO after --reopen-timeout),
		 * not returned the data. The times are only logged. */
		cr_log_info("round %d: read %.3f s, utimensat %.3f s with the upload held", round,
			    read_s, utimes_s);
		cr_assert(st_in_flight.st_mtim.tv_sec == set[1].tv_sec &&
			  st_in_flight.st_mtim.tv_nsec == set[1].tv_nsec &&
			  st_in_flight.st_size == (off_t)strlen(body));
		cr_assert_eq(waits1, waits0, "an open or setattr waited for the upload");
		/* fsync of a reader's fd returns once the upload is committed. */
		settle(mp("f%d", round));
		fm_remount_cold();
		struct stat st;
		OK(stat(mp("f%d", round), &st));
		cr_assert(st.st_mtim.tv_sec == set[1].tv_sec && st.st_mtim.tv_nsec == set[1].tv_nsec,
			  "round %d: mtime %lld.%09ld after the commit, set %lld.%09ld", round,
			  (long long)st.st_mtim.tv_sec, st.st_mtim.tv_nsec, (long long)set[1].tv_sec,
			  set[1].tv_nsec);
		fm_expect_content(mp("f%d", round), body, strlen(body));
	}
}

/* ferry-mountd asks the reconciler to commit at once whenever a call
 * waits for an upload: with a commit window longer than this test may
 * run, an fsync of a closed file (through a reader's fd) and a truncate
 * of it return only because of that, with the data committed. */
Test(journal, waits_for_an_upload_do_not_wait_for_the_commit_window, .timeout = 120)
{
	static const char body[] = "committed because someone waited\n";
	struct stat st;
	uint64_t handoffs0;

	fm_umount();
	fm_mount_with("commit_window_ms=600000");
	for (int round = 0; round < 2; round++) {
		handoffs0 = stat_of("handoffs");
		fm_write_file(mp("w%d", round), body, strlen(body));
		for (int t = 0; t < 500 && stat_of("handoffs") == handoffs0; t++)
			usleep(10 * 1000);
		cr_assert_gt(stat_of("handoffs"), handoffs0, "the close was not handed over");
		if (round == 0) {
			settle(mp("w%d", round));
			cr_assert_eq(stat_of("reconcile_handed_inflight"), 0);
		} else {
			/* A truncate of a file whose upload is in flight waits
			 * for its commit first. */
			OK(truncate(mp("w%d", round), 5));
		}
	}
	fm_remount_cold();
	fm_expect_content(mp("w0"), body, strlen(body));
	fm_expect_content(mp("w1"), body, 5);
	OK(stat(mp("w1"), &st));
	cr_assert_eq(st.st_size, 5);
}

/* The value of `name` in .stats text, or UINT64_MAX. */
static uint64_t stats_value(const char *text, const char *name)
{
	size_t n = strlen(name);

	for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
		if (strncmp(p, name, n) == 0 && p[n] == ' ')
			return strtoull(p + n + 1, NULL, 10);
	return UINT64_MAX;
}

/*
 * A reconciler that reads nothing (stopped here; also one holding its most
 * jobs) stalls no close and no .stats read: past what the connection holds,
 * closes commit their files themselves, nothing is lost, and the stalled
 * hand-offs are counted. Asked from a child, so a hang fails the test
 * instead of hanging it.
 */
Test(journal, a_reconciler_that_reads_nothing_stalls_no_close, .timeout = 600)
{
	enum { FILES = 800 };
	char body[64];
	pid_t child;
	int st = 0, waited;

	if (fm.no_reconciler) {
		fm_teardown();
		cr_skip_test("needs a reconciler");
	}
	reconciler_signal(SIGSTOP);
	child = fork();
	cr_assert(child >= 0);
	if (child == 0) {
		/* Files written (a create waits for a free worker thread),
		 * then every close handled and every .stats read answered. */
		for (int k = 0; k < FILES; k++) {
			int fd = open(mp("s%d", k), O_CREAT | O_WRONLY | O_TRUNC, 0644);

			snprintf(body, sizeof(body), "file %d of a stalled reconciler", k);
			if (fd < 0 || write(fd, body, strlen(body)) != (ssize_t)strlen(body) ||
			    close(fd) < 0)
				_exit(2);
		}
		for (;;) {
			char *text = fm_slurp(mp(".stats"));
			uint64_t open = text ? stats_value(text, "open_handles") : UINT64_MAX;
			uint64_t pending = text ? stats_value(text, "pending_commits") : UINT64_MAX;

			free(text);
			if (open == 0 && pending == 0)
				_exit(0);
			usleep(100 * 1000);
		}
	}
	for (waited = 0; waited < 3000 && waitpid(child, &st, WNOHANG) == 0; waited++)
		usleep(100 * 1000);
	if (waited == 3000) {
		kill(child, SIGKILL);
		waitpid(child, NULL, 0);
	}
	uint64_t stalls = waited < 3000 ? stat_of("handoff_stalls") : 0;
	reconciler_signal(SIGCONT);
	cr_assert_lt(waited, 3000, "creates, closes or .stats still stalled 5 minutes after the "
		     "reconciler stopped reading");
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "writing the files failed");
	cr_assert_gt(stalls, 0, "no hand-off found the connection full");
	fm_remount_cold();
	for (int k = 0; k < FILES; k++) {
		snprintf(body, sizeof(body), "file %d of a stalled reconciler", k);
		fm_expect_content(mp("s%d", k), body, strlen(body));
	}
}
