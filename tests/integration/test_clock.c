/*
 * The wall clock jumps, forwards and backwards, by an hour and by a day,
 * while files are written, committed and collected. The daemons run with
 * the shim tests/integration/shim_fake_clock.c, which adds the number of
 * seconds in a file to their CLOCK_REALTIME, gettimeofday() and time();
 * the test rewrites that file. The machine's clock is never touched, so the
 * kernel (file times, timed waits on CLOCK_REALTIME) stays on the real
 * time, as it would be on either side of a real jump.
 *
 * What a jump must not break, each held below:
 *   - nothing whose close() or fsync() returned is lost, and commits go on
 *     after a jump either way (no wait that sleeps for the jump's length);
 *   - the gc never deletes garbage before its grace has really passed: a
 *     jump forward of far more than the grace leaves the objects of a
 *     replaced file version in the store (a reader that resolved it before
 *     the overwrite still reads them), and they go once the grace has
 *     passed on the monotonic clock;
 *   - a file's mtime does not go back from one commit to the next unless
 *     it is set explicitly;
 *   - S3 requests, whose signatures carry the date, go on being accepted
 *     (the server's clock wins, as in AWS's SDKs).
 */
#include "mount_util.h"
#include "workload_util.h"

#include <dirent.h>
#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define KiB 1024
#define HOUR 3600LL
#define DAY 86400LL

static char clock_file[PATH_MAX];

/* Sets the daemons' wall clock to the real one plus off seconds. */
static void clock_set(long long off)
{
	char tmp[PATH_MAX + 8];
	int fd;

	snprintf(tmp, sizeof(tmp), "%s.new", clock_file);
	fd = open(tmp, O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0644);
	cr_assert(fd >= 0, "%s: %s", tmp, strerror(errno));
	cr_assert(dprintf(fd, "%lld\n", off) > 0);
	OK(close(fd));
	OK(rename(tmp, clock_file));
}

static time_t real_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return ts.tv_sec;
}

/*
 * Waits until ferry-mountd's clock reads the real one plus off: a new
 * directory's mtime comes from its clock. Bounded; the shim looks at the
 * file every 10 ms. The shim's being in effect at all is checked here too.
 */
static void clock_confirm(long long off)
{
	static int probe;

	for (int i = 0; i < 400; i++) {
		const char *d = mp("clock-probe-%d", probe++);
		struct stat st;
		long long want, got;

		OK(mkdir(d, 0755));
		OK(stat(d, &st));
		OK(rmdir(d));
		want = (long long)real_now() + off;
		got = (long long)st.st_mtime;
		if (got > want - 600 && got < want + 600)
			return;
		usleep(25 * 1000);
	}
	cr_assert_fail("ferry-mountd's clock never moved by %lld s (is the shim %s loaded?)", off,
		       fm_shim("fake_clock"));
}

static uint64_t stat_of(const char *name)
{
	struct fm_stats s;

	fm_stats_read(&s);
	return fm_stats_need(&s, name);
}

/* Mounts (after a setup with .no_mount) with the fake clock at off. */
static void mount_with_clock(long long off, const char *mount_opts)
{
	snprintf(clock_file, sizeof(clock_file), "%s/fake-clock", fm.dir);
	clock_set(off);
	fm_daemon_preload("fake_clock");
	fm_daemon_env("FERRY_FAKE_CLOCK_FILE", clock_file);
	if (mount_opts)
		setenv("FERRY_IT_MOUNT_OPTIONS", mount_opts, 1);
	fm_mount();
	unsetenv("FERRY_IT_MOUNT_OPTIONS");
	clock_confirm(off);
}

static void clock_init(void)
{
	/* 64 KiB objects: a file of a few hundred KiB is several of them. */
	fm_setup_opts(&(struct fm_opts){ .no_mount = true, .block_size = "65536" });
}

static void clock_fini(void)
{
	wl_cleanup(); /* a failed test's writer would keep the mount busy */
	fm_teardown();
}

TestSuite(clock, .init = clock_init, .fini = clock_fini, .timeout = 600);

/* ---- commits while the clock jumps ---- */

/* Waits until stat name reaches at least want (bounded: 3 minutes, far
 * more than it needs; a daemon asleep for the jump's length never gets
 * there). Keeps the writer's reports flowing meanwhile. */
static void wait_stat(struct wl *w, const char *name, uint64_t want, const char *why)
{
	struct timespec t0, now;
	uint64_t v = 0;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	do {
		v = stat_of(name);
		if (v >= want)
			return;
		if (w)
			wl_poll(w, 100);
		else
			usleep(100 * 1000);
		clock_gettime(CLOCK_MONOTONIC, &now);
	} while (now.tv_sec - t0.tv_sec < 180);
	cr_assert_fail("%s: %s stayed at %llu, below %llu", why, name, (unsigned long long)v,
		       (unsigned long long)want);
}

Test(clock, commits_go_on_across_jumps_and_nothing_is_lost)
{
	static const long long jumps[] = { HOUR, -HOUR, DAY, -DAY, HOUR, 0 };
	struct wl_opts o = { .names = 50, .file_max = 160 * KiB, .seed = 1, .fsync_every = 2 };
	struct wl *w;
	char *log;

	/* gc_grace=2: a gc round every 2 s, so a stalled gc thread shows. */
	mount_with_clock(0, "gc_grace=2");
	w = wl_start(&o);
	wl_wait_done(w, 2 * (uint64_t)o.names + 20);
	for (size_t j = 0; j < sizeof(jumps) / sizeof(jumps[0]); j++) {
		uint64_t committed, rounds;

		clock_set(jumps[j]);
		clock_confirm(jumps[j]);
		cr_log_info("clock at %+lld s: %llu ops done", jumps[j],
			    (unsigned long long)wl_done(w));
		committed = stat_of("reconcile_committed_total");
		rounds = stat_of("gc_rounds");
		/* The writer goes on; the reconciler commits; the gc runs. */
		wl_wait_done(w, wl_done(w) + 40);
		wait_stat(w, "reconcile_committed_total", committed + 8, "commits after the jump");
		wait_stat(w, "gc_rounds", rounds + 2, "gc rounds after the jump");
	}
	/* It stops between two ops; every op it reported is in the model. */
	wl_stop(w);
	cr_log_info("%llu ops done; unmounting", (unsigned long long)wl_done(w));
	/* The unmount waits for every upload: a daemon asleep for the jump's
	 * length would make it time out. Then every byte comes from the store. */
	fm_remount_cold();
	wl_check(w);
	wl_free(w);
	log = fm_slurp(fm_mountd_log_path());
	cr_assert(log);
	cr_assert(!strstr(log, "started a new ferry-reconciler"),
		  "the reconciler had to be restarted");
	free(log);
}

/* ---- gc ---- */

struct obj_list {
	char (*path)[PATH_MAX];
	int n, cap;
};

static struct obj_list *collect;

static int add_obj(const char *path, const struct stat *st, int type, struct FTW *ftw)
{
	(void)st;
	(void)ftw;
	if (type != FTW_F)
		return 0;
	if (collect->n == collect->cap) {
		collect->cap = collect->cap ? collect->cap * 2 : 64;
		collect->path = realloc(collect->path, (size_t)collect->cap * sizeof(*collect->path));
		cr_assert(collect->path);
	}
	snprintf(collect->path[collect->n++], PATH_MAX, "%s", path);
	return 0;
}

static void objects(struct obj_list *l)
{
	l->n = 0;
	collect = l;
	cr_assert_eq(nftw(fm_store_dir(), add_obj, 16, FTW_PHYS), 0);
}

static int missing(const struct obj_list *l)
{
	int k = 0;

	for (int i = 0; i < l->n; i++)
		k += access(l->path[i], R_OK) != 0;
	return k;
}

static double mono_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/*
 * Files whose last close ferry-mountd has seen (RELEASE, which the kernel
 * may send after close() returned): handed to the reconciler, committed by
 * ferry-mountd because the handoff failed, or kept because still mapped
 * (committed there and then).
 */
static uint64_t released(void)
{
	struct fm_stats s;

	fm_stats_read(&s);
	return fm_stats_need(&s, "handoffs") + fm_stats_need(&s, "handoff_failures") +
	       fm_stats_need(&s, "mapped_after_close");
}

/*
 * Waits until a file closed after `before` (released() then) was released
 * and every handoff so far is committed (the reconciler's reply came);
 * false after 3 minutes.
 */
static bool committed_since(uint64_t before)
{
	for (int i = 0; i < 1800; i++) {
		struct fm_stats s;

		if (released() > before) {
			fm_stats_read(&s);
			if (fm_stats_need(&s, "reconcile_handed_inflight") == 0 &&
			    fm_stats_need(&s, "passthrough_staging_blocks") == 0)
				return true;
		}
		usleep(100 * 1000);
	}
	return false;
}

/* Writes path whole with len bytes from seed and waits for its commit. */
static void put_committed(const char *path, uint64_t seed, size_t len, unsigned char *buf)
{
	uint64_t before = released();

	fm_fill_random(&seed, buf, len);
	fm_write_file(path, buf, len);
	cr_assert(committed_since(before), "%s never committed", path);
}

#define GRACE 40

Test(clock, gc_keeps_garbage_for_its_grace_across_a_forward_jump)
{
	static unsigned char v1[512 * KiB], v2[512 * KiB];
	struct obj_list old = { 0 };
	uint64_t deleted0, rounds;
	double t_garbage, elapsed;
	char opts[64];

	snprintf(opts, sizeof(opts), "gc_grace=%d", GRACE);
	mount_with_clock(0, opts);
	put_committed(mp("f"), 1, sizeof(v1), v1);
	objects(&old);
	cr_assert_geq(old.n, 8, "%d objects for 512 KiB in 64 KiB blocks", old.n);
	/* The overwrite (its O_TRUNC) makes every object of v1 garbage. */
	t_garbage = mono_s();
	put_committed(mp("f"), 2, sizeof(v2), v2);
	cr_assert_geq(stat_of("gc_pending_slices"), 1);
	deleted0 = stat_of("gc_objects_deleted");

	/* A day later by the wall clock: far past the grace. Two gc rounds
	 * (a jump forward used to cut the grace short at the first). */
	clock_set(DAY);
	clock_confirm(DAY);
	rounds = stat_of("gc_rounds");
	for (int r = 1; r <= 2; r++) {
		wait_stat(NULL, "gc_rounds", rounds + (uint64_t)r, "gc rounds after the jump");
		elapsed = mono_s() - t_garbage;
		if (elapsed >= GRACE - 2) {
			cr_log_info("the machine is slow: %.0f s passed, more than the grace; early "
				    "deletion cannot be told from on-time deletion this run", elapsed);
			break;
		}
		cr_assert_eq(missing(&old), 0,
			     "%d of %d objects of the replaced version were deleted %.0f s after "
			     "they became garbage (grace %d s, gc round %d after the jump): the "
			     "jump cut the grace short", missing(&old), old.n, elapsed, GRACE, r);
		cr_assert_eq(stat_of("gc_objects_deleted"), deleted0);
	}
	/* The live version reads, and once the grace has really passed the old
	 * objects go. */
	fm_expect_content(mp("f"), v2, sizeof(v2));
	for (int i = 0; i < 1800 && missing(&old) < old.n; i++)
		usleep(100 * 1000);
	cr_assert_eq(missing(&old), old.n, "%d of %d garbage objects still there %.0f s after "
		     "they became garbage (grace %d s)", old.n - missing(&old), old.n,
		     mono_s() - t_garbage, GRACE);
	fm_remount_cold();
	fm_expect_content(mp("f"), v2, sizeof(v2));
	free(old.path);
}

/* Objects in b that are not in a. */
static void objects_minus(const struct obj_list *b, const struct obj_list *a, struct obj_list *out)
{
	out->n = 0;
	for (int i = 0; i < b->n; i++) {
		bool in_a = false;

		for (int k = 0; k < a->n && !in_a; k++)
			in_a = strcmp(a->path[k], b->path[i]) == 0;
		if (in_a)
			continue;
		if (out->n == out->cap) {
			out->cap = out->cap ? out->cap * 2 : 64;
			out->path = realloc(out->path, (size_t)out->cap * sizeof(*out->path));
			cr_assert(out->path);
		}
		memcpy(out->path[out->n++], b->path[i], PATH_MAX);
	}
}

Test(clock, gc_goes_on_after_a_backward_jump)
{
	static unsigned char buf[256 * KiB];
	struct obj_list a1 = { 0 }, mid = { 0 }, all = { 0 }, b1 = { 0 };
	uint64_t seed;

	mount_with_clock(0, "gc_grace=3");
	put_committed(mp("a"), 1, sizeof(buf), buf);
	objects(&a1);
	/* Garbage from before the jump back (a's first version) ... */
	put_committed(mp("a"), 2, sizeof(buf), buf);
	clock_set(-DAY);
	clock_confirm(-DAY);
	/* ... and from after it (b's). */
	objects(&mid);
	put_committed(mp("b"), 3, sizeof(buf), buf);
	objects(&all);
	objects_minus(&all, &mid, &b1);
	cr_assert_geq(b1.n, 4);
	put_committed(mp("b"), 4, sizeof(buf), buf);
	/* What became garbage after the jump goes once its grace has passed. */
	for (int i = 0; i < 1800 && missing(&b1) < b1.n; i++)
		usleep(100 * 1000);
	cr_assert_eq(missing(&b1), b1.n, "%d of %d objects that became garbage after the jump "
		     "back were never deleted", b1.n - missing(&b1), b1.n);
	/* Garbage stamped before the jump waits until the wall clock, too,
	 * says its grace has passed: set right, it goes. */
	cr_log_info("%d of %d objects freed before the jump back still wait", a1.n - missing(&a1),
		    a1.n);
	clock_set(0);
	clock_confirm(0);
	for (int i = 0; i < 1800 && missing(&a1) < a1.n; i++)
		usleep(100 * 1000);
	cr_assert_eq(missing(&a1), a1.n, "garbage from before the jump stayed after the clock "
		     "was set right");
	fm_remount_cold();
	seed = 4;
	fm_fill_random(&seed, buf, sizeof(buf));
	fm_expect_content(mp("b"), buf, sizeof(buf));
	seed = 2;
	fm_fill_random(&seed, buf, sizeof(buf));
	fm_expect_content(mp("a"), buf, sizeof(buf));
	free(a1.path);
	free(mid.path);
	free(all.path);
	free(b1.path);
}

/* ---- mtime ---- */

static struct timespec mtime_of(const char *path)
{
	struct stat st;

	OK(stat(path, &st));
	return st.st_mtim;
}

static bool ts_before(struct timespec a, struct timespec b)
{
	return a.tv_sec < b.tv_sec || (a.tv_sec == b.tv_sec && a.tv_nsec < b.tv_nsec);
}

/* One more commit of path through a new open of the existing file (the
 * daemon path), fsync'ed. */
static void patch_commit(const char *path, const char *bytes)
{
	int fd = OK(open(path, O_WRONLY | O_CLOEXEC));

	fm_pwrite_all(fd, bytes, strlen(bytes), 0);
	OK(fsync(fd));
	OK(close(fd));
}

/*
 * Commits before and after a step back of a day: the file's mtime stays
 * where it was (a commit may not make a file look older than what it
 * replaced), unless set explicitly. Three write paths stamp mtimes three
 * ways: opts selects one.
 */
static void mtime_across_a_step_back(const char *opts)
{
	struct timespec m1, m2, m3, m4, ts[2];
	unsigned char buf[4096];

	mount_with_clock(0, opts);
	put_committed(mp("m"), 5, sizeof(buf), buf);
	patch_commit(mp("m"), "one");
	m1 = mtime_of(mp("m"));

	clock_set(-DAY);
	clock_confirm(-DAY);
	patch_commit(mp("m"), "two");
	m2 = mtime_of(mp("m"));
	cr_assert(!ts_before(m2, m1), "mtime went back from %lld to %lld across a commit",
		  (long long)m1.tv_sec, (long long)m2.tv_sec);
	/* A rewrite through a new, truncating open too. */
	put_committed(mp("m"), 6, sizeof(buf), buf);
	m3 = mtime_of(mp("m"));
	cr_assert(!ts_before(m3, m2), "mtime went back from %lld to %lld across a rewrite",
		  (long long)m2.tv_sec, (long long)m3.tv_sec);

	/* Set explicitly, it goes wherever it is told ... */
	ts[0].tv_nsec = UTIME_OMIT;
	ts[1] = (struct timespec){ .tv_sec = 1000000000, .tv_nsec = 0 };
	OK(utimensat(AT_FDCWD, mp("m"), ts, 0));
	m4 = mtime_of(mp("m"));
	cr_assert_eq(m4.tv_sec, 1000000000);
	/* ... and a write after that is a write now. */
	patch_commit(mp("m"), "three");
	m4 = mtime_of(mp("m"));
	cr_assert_gt(m4.tv_sec, 1000000000);
	clock_set(0);
	clock_confirm(0);
	fm_remount_cold();
	cr_assert(!ts_before(mtime_of(mp("m")), m4));
}

/* The default: a reopened file is copied up into a passthrough staging
 * file, which the kernel stamps (on the real clock). */
Test(clock, mtime_never_goes_back_between_commits)
{
	mtime_across_a_step_back(NULL);
}

/* Every write through ferry-mountd, which stamps them with its own clock. */
Test(clock, mtime_never_goes_back_between_commits_on_the_daemon_path)
{
	mtime_across_a_step_back("passthrough=off,writeback=off");
}

/* Writes cached by the kernel, which sends its mtimes at write-back. */
Test(clock, mtime_never_goes_back_between_commits_through_the_writeback_cache)
{
	mtime_across_a_step_back("passthrough=off,writeback=on");
}

/* ---- S3: signatures carry the date ---- */

static struct fm_s3 srv;

static void s3_clock_init(void)
{
	char url[256];

	snprintf(srv.dir, sizeof(srv.dir), "/tmp/ferry-it-s3clock.%d", (int)getpid());
	cr_assert(mkdir(srv.dir, 0700) == 0 || errno == EEXIST);
	setenv("AWS_ACCESS_KEY_ID", "S3RVER", 1);
	setenv("AWS_SECRET_ACCESS_KEY", "S3RVER", 1);
	setenv("AWS_REGION", "us-east-1", 1);
	fm_s3_start(&srv, NULL);
	snprintf(url, sizeof(url), "s3://%s/ferry-test/clock", srv.hostport);
	fm_setup_opts(&(struct fm_opts){ .storage = url, .s3_http = true, .no_mount = true,
					  .block_size = "65536" });
}

static void s3_clock_fini(void)
{
	fm_teardown();
	const char *stop[] = { FERRY_SOURCE_DIR "/scripts/s3-server", "stop", srv.dir, NULL };
	cr_expect_eq(fm_run(stop, "/dev/null", "/dev/null", 60), 0, "s3-server stop failed");
	const char *rm[] = { "/bin/rm", "-rf", srv.dir, NULL };
	fm_run(rm, "/dev/null", "/dev/null", 60);
}

TestSuite(clock_s3, .init = s3_clock_init, .fini = s3_clock_fini, .timeout = 600);

Test(clock_s3, requests_are_accepted_whatever_the_local_clock_says)
{
	static const long long jumps[] = { HOUR, -HOUR, DAY, -DAY };
	static unsigned char buf[200 * KiB];
	size_t nj = sizeof(jumps) / sizeof(jumps[0]);

	mount_with_clock(0, NULL);
	for (size_t j = 0; j <= nj; j++) {
		uint64_t seed = 100 + j, before = released();

		fm_fill_random(&seed, buf, sizeof(buf));
		fm_write_file(mp("s%zu", j), buf, sizeof(buf));
		/* Uploaded (by the reconciler) ... */
		cr_assert(committed_since(before), "s%zu was never uploaded with the clock %+lld s off",
			  j, j ? jumps[j - 1] : 0);
		/* ... and every file reads back from the store (ferry-mountd's
		 * GETs), with an empty cache. */
		fm_remount_cold();
		for (size_t k = 0; k <= j; k++) {
			seed = 100 + k;
			fm_fill_random(&seed, buf, sizeof(buf));
			fm_expect_content(mp("s%zu", k), buf, sizeof(buf));
		}
		if (j < nj) {
			clock_set(jumps[j]);
			clock_confirm(jumps[j]);
			cr_log_info("clock at %+lld s", jumps[j]);
		}
	}
}
