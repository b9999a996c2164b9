/*
 * ferry-reconciler short of memory. Two cells of the fault matrix:
 *
 *  - its allocations fail (tests/integration/shim_fault_malloc.c, loaded
 *    into ferry-reconciler only: malloc, calloc, realloc... return NULL,
 *    every Nth call or at random, in our code, SQLite, libcurl, libevent
 *    and libc alike) while files are written and patched: it must not
 *    crash, commit wrong or partial data, or give up on a job; once the
 *    failures stop, everything closed is committed (checked from the
 *    object store after a remount with an empty cache);
 *  - it runs under a hard address-space limit (RLIMIT_AS) with many files
 *    larger than the limit altogether: it streams them, and its peak
 *    resident size (VmHWM) stays under a documented bound.
 */
#include "mount_util.h"
#include "workload_util.h"

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define KiB 1024
#define MiB (1024 * KiB)

static void oom_init(void)
{
	/* 256 KiB objects: a file of a few MiB is many of them. */
	fm_setup_opts(&(struct fm_opts){ .no_mount = true, .block_size = "262144" });
}

static void oom_fini(void)
{
	wl_cleanup(); /* a failed test's writer would keep the mount busy */
	fm_teardown();
}

TestSuite(oom, .init = oom_init, .fini = oom_fini, .timeout = 900);

/* Waits (bounded) until nothing closed is only on local disk. */
static void wait_committed(const char *when)
{
	fm_wait_committed(when, 300);
}

/* Commits made by either daemon so far. */
static uint64_t commits_made(void)
{
	struct fm_stats s;

	fm_stats_read(&s);
	return fm_stats_need(&s, "commits") + fm_stats_need(&s, "reconcile_committed_total");
}

/* ---- allocation failures ---- */

/* The shim's shared counters: [0] calls while on, [1] failures, [2]
 * processes that acted. */
static volatile uint64_t *counts;

static void faults_load(void)
{
	int fd = open(sp("malloc-counts"), O_CREAT | O_RDWR | O_CLOEXEC, 0644);

	cr_assert(fd >= 0, "%s: %s", sp("malloc-counts"), strerror(errno));
	OK(ftruncate(fd, 4096));
	counts = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	cr_assert(counts != MAP_FAILED);
	close(fd);
	fm_daemon_preload("fault_malloc");
	fm_daemon_env("FERRY_FAULT_MALLOC_PROG", "ferry-reconciler");
	fm_daemon_env("FERRY_FAULT_MALLOC_CTL", sp("malloc-ctl"));
	fm_daemon_env("FERRY_FAULT_MALLOC_COUNT", sp("malloc-counts"));
}

/* Failures on, as the shim's control file says (see the shim). */
static void faults_on(const char *how)
{
	char tmp[PATH_MAX];
	int fd;

	snprintf(tmp, sizeof(tmp), "%s.new", sp("malloc-ctl"));
	fd = open(tmp, O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0644);
	cr_assert(fd >= 0);
	cr_assert(dprintf(fd, "%s\n", how) > 0);
	OK(close(fd));
	OK(rename(tmp, sp("malloc-ctl")));
}

static void faults_off(void)
{
	OK(unlink(sp("malloc-ctl")));
}

/*
 * Episodes of memory shortage, as a machine has them: failures on for a
 * while (until the shim made EPISODE_FAILURES of them, or EPISODE_S
 * passed), then off until commits go on again; the writer never stops. A
 * reopen of a file whose upload waits for memory waits with it (bounded by
 * --reopen-timeout, 120 s, far beyond an episode).
 */
#define EPISODE_FAILURES 150
#define EPISODE_S 8

Test(oom, failing_allocations_in_the_reconciler_lose_nothing)
{
	/*
	 * At random (seeded), and half of the big allocations (object
	 * buffers). Not "every N": a retried step whose allocations line up
	 * with N fails the same way every time, a livelock no real shortage
	 * makes.
	 */
	static const struct {
		const char *what, *ctl;
	} modes[] = {
		{ "0.5% of allocations", "ppm 5000 3" },
		{ "2%", "ppm 20000 7" },
		{ "5%", "ppm 50000 11" },
		{ "10%", "ppm 100000 5" },
		{ "half of those of 64 KiB or more", "ppm 500000 13\nmin 65536" },
	};
	struct wl_opts o = { .names = 30, .file_max = 3 * MiB / 2, .seed = 3, .fsync_every = 3 };
	struct wl *w;
	pid_t rec;
	char *log;

	faults_load();
	fm_mount();
	rec = fm_reconciler_pid();
	w = wl_start(&o);
	wl_wait_done(w, 2 * (uint64_t)o.names);
	for (size_t m = 0; m < sizeof(modes) / sizeof(modes[0]); m++) {
		uint64_t failed0 = counts[1], committed;
		struct timespec t0, now;

		faults_on(modes[m].ctl);
		clock_gettime(CLOCK_MONOTONIC, &t0);
		do {
			wl_poll(w, 100);
			clock_gettime(CLOCK_MONOTONIC, &now);
		} while (counts[1] < failed0 + EPISODE_FAILURES && now.tv_sec - t0.tv_sec < EPISODE_S);
		faults_off();
		committed = fm_stat("reconcile_committed_total");
		cr_log_info("%s failing: %llu failed in %lld s; %llu ops done", modes[m].what,
			    (unsigned long long)(counts[1] - failed0),
			    (long long)(now.tv_sec - t0.tv_sec), (unsigned long long)wl_done(w));
		/* Memory back: commits go on, and so does the writer. */
		clock_gettime(CLOCK_MONOTONIC, &t0);
		while (fm_stat("reconcile_committed_total") < committed + 10) {
			wl_poll(w, 100);
			clock_gettime(CLOCK_MONOTONIC, &now);
			cr_assert_lt(now.tv_sec - t0.tv_sec, 300, "after %s failed: no commits",
				     modes[m].what);
		}
		wl_wait_done(w, wl_done(w) + 10);
	}
	cr_assert_gt(counts[1], 0, "the shim made no allocation fail (is it loaded?)");
	cr_log_info("%llu allocations failed of %llu asked for while failures were on",
		    (unsigned long long)counts[1], (unsigned long long)counts[0]);
	wl_stop(w);
	/* The same reconciler all along: it never crashed, nor had to be
	 * replaced; and no job was given up for want of memory. */
	cr_assert_eq(fm_reconciler_pid(), rec, "ferry-reconciler %d was replaced", rec);
	wait_committed("after the failures stopped");
	cr_assert_eq(fm_stat("reconcile_orphans"), 0, "jobs were given up (kept as .orphan)");
	fm_remount_cold();
	wl_check(w);
	wl_free(w);
	log = fm_slurp(fm_mountd_log_path());
	cr_assert(log);
	cr_assert(!strstr(log, "started a new ferry-reconciler"), "the reconciler was restarted");
	cr_assert(!strstr(log, "ended with status"), "the reconciler did not exit cleanly");
	free(log);
}

/* ---- a hard limit ---- */

/*
 * The bound on ferry-reconciler's peak resident size: its object buffers
 * (--buffer-mib, 64 MiB by default, of which --max-uploads 8 objects of
 * 4 MiB use half) plus 32 MiB for the rest (SQLite's page caches, libcurl,
 * libevent, thread stacks, the binary). Measured here: about 45 MiB.
 */
#define RSS_BOUND_KIB ((64 + 32) * 1024)
/* Its address space may not exceed this (it starts at about 95 MiB, most of
 * it thread stacks): the files written are over three times as big
 * together. malloc finds its arenas refused at the limit and makes do. */
#define AS_LIMIT (160ull << 20)
#define BIG_FILES 24
#define BIG_FILE (24 * MiB)

static long status_kib(pid_t pid, const char *field)
{
	char path[64], *text, *p;
	long v = -1;

	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	text = fm_slurp(path);
	cr_assert(text, "%s: %s", path, strerror(errno));
	p = strstr(text, field);
	if (p)
		v = strtol(p + strlen(field) + 1, NULL, 10);
	free(text);
	return v;
}

static void big_content(int k, unsigned char *buf)
{
	uint64_t st = 0xB16 + (uint64_t)k;

	fm_fill_random(&st, buf, BIG_FILE);
}

Test(oom, bounded_memory_under_a_hard_address_space_limit)
{
	unsigned char *buf = malloc(BIG_FILE);
	struct rlimit lim = { AS_LIMIT, AS_LIMIT };
	uint64_t committed;
	long hwm, size0;
	pid_t rec;

	if (fm_asan()) {
		/* ASan reserves terabytes of shadow address space and keeps
		 * freed memory in quarantine: no address-space limit can hold
		 * it, and its resident size says nothing of ours. */
		fm_teardown();
		cr_skip_test("not under AddressSanitizer: RLIMIT_AS and VmHWM measure ASan itself");
	}
	cr_assert(buf);
	fm_mount();
	rec = fm_reconciler_pid();
	size0 = status_kib(rec, "VmSize:");
	cr_assert_lt((unsigned long long)size0 << 10, AS_LIMIT * 3 / 4, "ferry-reconciler starts at "
		     "%ld KiB of address space", size0);
	cr_assert_eq(prlimit(rec, RLIMIT_AS, &lim, NULL), 0, "prlimit: %s", strerror(errno));
	committed = commits_made();
	for (int k = 0; k < BIG_FILES; k++) {
		big_content(k, buf);
		fm_write_file(mp("big%d", k), buf, BIG_FILE);
	}
	/* Each handed over (at RELEASE, which may come after close()) and
	 * committed: by the reconciler, or (a few) by ferry-mountd, which
	 * keeps a file whose release found it still mapped. */
	for (int i = 0; i < 3000 && commits_made() < committed + BIG_FILES; i++)
		usleep(100 * 1000);
	cr_assert_geq(commits_made(), committed + BIG_FILES,
		      "the big files were not all committed in 5 minutes");
	wait_committed("the big files");
	hwm = status_kib(rec, "VmHWM:");
	cr_log_info("ferry-reconciler: peak resident %ld KiB (bound %d KiB), address space %ld KiB "
		    "(limit %llu KiB), after %d files of %d MiB", hwm, RSS_BOUND_KIB,
		    status_kib(rec, "VmPeak:"), AS_LIMIT >> 10, BIG_FILES, BIG_FILE / MiB);
	cr_assert_eq(fm_reconciler_pid(), rec, "ferry-reconciler %d was replaced", rec);
	cr_assert_eq(fm_stat("reconcile_orphans"), 0, "jobs were given up (kept as .orphan)");
	cr_assert_lt(hwm, RSS_BOUND_KIB, "ferry-reconciler's peak resident size %ld KiB is over "
		     "its bound of %d KiB", hwm, RSS_BOUND_KIB);
	fm_remount_cold();
	for (int k = 0; k < BIG_FILES; k++) {
		big_content(k, buf);
		fm_expect_content(mp("big%d", k), buf, BIG_FILE);
	}
	free(buf);
}
