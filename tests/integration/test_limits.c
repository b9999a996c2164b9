/*
 * Limits and hostile input (issue 9), through a real mount, with ext4 (a
 * directory in the test's scratch directory, on the filesystem that also
 * holds the staging files) as the oracle wherever ext4 has an answer:
 *
 *   names_of_255_bytes        255-byte names work for every namespace call,
 *                             256 (and 1024, FUSE's own bound) ENAMETOOLONG
 *   deep_tree_past_path_max   a tree 10 KiB deep built and used through
 *                             dirfds; paths and symlink targets at PATH_MAX
 *   xattrs_at_their_limits    names of XATTR_NAME_MAX, values of
 *                             XATTR_SIZE_MAX, a list past XATTR_LIST_MAX
 *   sparse_file_of_1_tib      1 TiB sparse: holes, SEEK_DATA/SEEK_HOLE,
 *                             truncates, cold remount; the commit reads and
 *                             uploads the data, not the holes
 *   max_file_size             the largest size ferryfs takes, EFBIG past it
 *   truncate_past_max_file_size, fsync_of_a_sparse_file: bugs found here
 *   many_open_files           FERRY_LIMITS_OPEN_FILES files open at once
 *                             (default 20000, 4000 in a sanitized build),
 *                             half written
 *   daemon_out_of_fds         ferry-mountd at its RLIMIT_NOFILE: what the
 *                             application sees, nothing lost
 *   a_stopped_reconciler_under_a_low_fd_limit
 *                             closes a stopped ferry-reconciler does not
 *                             take fill no fd table: a writer that holds
 *                             one file at a time sees no error, and every
 *                             file reads back after
 *   big_directory             FERRY_LIMITS_DIR_ENTRIES entries (default
 *                             50000, 10000 in a sanitized build): each
 *                             exactly once, telldir/seekdir, creates and
 *                             unlinks during the listing
 *
 * ferry-mountd's and ferry-reconciler's VmRSS, VmHWM, open fds and bytes
 * read (/proc/PID/{status,fd,io}) are logged with cr_log_info (shown with
 * --verbose) and held to generous bounds, documented where they are set.
 * Nothing here asserts a duration: durations are logged; what is asserted
 * is the mechanism (bytes read, bytes uploaded, fds held, RSS grown).
 */
#include "mount_util.h"

#include <dirent.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#include <linux/limits.h>

#include "meta.h"
#include "reconcile_plan.h"

#define KiB ((uint64_t)1024)
#define MiB (1024 * KiB)
#define GiB (1024 * MiB)
#define TiB (1024 * GiB)

#if defined(__SANITIZE_ADDRESS__)
#define ASAN_BUILD 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define ASAN_BUILD 1
#endif
#endif
#ifndef ASAN_BUILD
#define ASAN_BUILD 0
#endif

/*
 * Memory bounds are growth of ferry-mountd's VmRSS over what it had before
 * the work, not absolute sizes. A sanitized daemon (the ASan build of the
 * same tree) holds freed memory in quarantine and pads every allocation, so
 * its allowance is four times as large plus ASan's default quarantine.
 */
/*
 * fds ferry-mountd may hold above what it had before a test's work, once
 * that work is done: each of its FUSE worker threads (up to 16) and its
 * own threads keeps a SQLite connection (the database and its WAL: 2-3
 * fds), opened as load makes libfuse start threads. Measured: 34 above
 * after 20000 files, 64 after the out-of-fds round.
 */
#define FD_SLACK 128
/* After reads of committed files, the read cache may keep 256 of its files
 * open too (README: a READ costs a dup): small files are in the cache once
 * committed (cache seeds). */
#define CACHE_KEPT_FDS 256
#define FD_SLACK_READS (FD_SLACK + CACHE_KEPT_FDS)

static uint64_t rss_allowance(uint64_t bytes)
{
	return ASAN_BUILD ? 4 * bytes + 256 * MiB : bytes;
}

static void limits_fini(void);

TestSuite(limits, .init = fm_setup, .fini = limits_fini, .timeout = 300);

/* ---- small helpers -------------------------------------------------------- */

static uint64_t env_u64(const char *name, uint64_t dflt)
{
	const char *e = getenv(name);
	char *end;
	unsigned long long v;

	if (!e || !*e)
		return dflt;
	errno = 0;
	v = strtoull(e, &end, 10);
	cr_assert(errno == 0 && *end == '\0' && v > 0, "%s=%s is not a positive number", name, e);
	return v;
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* The reference directory on the local disk (ext4 here): sp("ref"). */
static const char *ref_dir(void)
{
	const char *r = sp("ref");

	if (mkdir(r, 0755) != 0)
		cr_assert(errno == EEXIST, "mkdir %s: %s", r, strerror(errno));
	return r;
}

/* errno of a call: 0 on success. */
#define ERR_OF(expr) ({ errno = 0; (expr) < 0 ? errno : 0; })

/* Removes name under dfd, whatever its depth: fd-relative all the way down
 * (nftw, which the fixture uses, stops at PATH_MAX). */
static void rm_at(int dfd, const char *name)
{
	struct stat st;
	int fd;
	DIR *d;
	struct dirent *de;

	if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0)
		return;
	if (!S_ISDIR(st.st_mode)) {
		unlinkat(dfd, name, 0);
		return;
	}
	fd = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return;
	d = fdopendir(fd);
	if (!d) {
		close(fd);
		return;
	}
	while ((de = readdir(d))) {
		if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
			continue;
		rm_at(dirfd(d), de->d_name);
	}
	closedir(d);
	unlinkat(dfd, name, AT_REMOVEDIR);
}

/* A daemon whose fd limit a test lowered, and the limit to give back
 * (also when the test failed half-way: a daemon at its limit cannot even
 * unmount cleanly). */
static pid_t lowered_pid;
static long lowered_soft;
/* A daemon a test stopped (SIGSTOP), to go on whatever happened. */
static pid_t stopped_pid;

static void limits_fini(void)
{
	if (stopped_pid > 0) {
		kill(stopped_pid, SIGCONT);
		stopped_pid = 0;
	}
	if (lowered_pid > 0) {
		struct rlimit rl;

		if (prlimit(lowered_pid, RLIMIT_NOFILE, NULL, &rl) == 0) {
			rl.rlim_cur = (rlim_t)lowered_soft;
			prlimit(lowered_pid, RLIMIT_NOFILE, &rl, NULL);
		}
		lowered_pid = 0;
	}
	/* The reference trees first: the deep one is past what the fixture's
	 * nftw can remove. */
	if (fm.created) {
		int fd = open(fm.dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);

		if (fd >= 0) {
			rm_at(fd, "ref");
			close(fd);
		}
	}
	fm_teardown();
}

/* ---- the daemons' processes ----------------------------------------------- */

struct psample {
	pid_t pid;
	long rss_kb, hwm_kb;
	long fds;
	unsigned long long rchar;
	long nofile_soft, nofile_hard;
};

static bool pid_alive(pid_t pid)
{
	char path[64], buf[512], *p;
	int fd;
	ssize_t n;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return false;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return false;
	buf[n] = '\0';
	p = strrchr(buf, ')');
	return !(p && p[1] == ' ' && p[2] == 'Z');
}

/* The fixture's ferry-mountd that serves the mount now (the newest live one
 * it recorded: remounts append). */
static pid_t mountd_pid(void)
{
	for (int i = fm.n_mountd - 1; i >= 0; i--)
		if (pid_alive(fm.mountd[i]))
			return fm.mountd[i];
	cr_assert_fail("no live ferry-mountd among the %d the fixture started", fm.n_mountd);
	return -1;
}

/* The ferry-reconciler that ferry-mountd started (its child), or 0. */
static pid_t reconciler_pid(pid_t mountd)
{
	DIR *d = opendir("/proc");
	struct dirent *de;
	pid_t found = 0;

	if (!d)
		return 0;
	while (!found && (de = readdir(d))) {
		char path[64], buf[512], comm[64];
		int pid = atoi(de->d_name), ppid = 0, fd;
		ssize_t n;
		char *p, *q;

		if (pid <= 0)
			continue;
		snprintf(path, sizeof(path), "/proc/%d/stat", pid);
		fd = open(path, O_RDONLY | O_CLOEXEC);
		if (fd < 0)
			continue;
		n = read(fd, buf, sizeof(buf) - 1);
		close(fd);
		if (n <= 0)
			continue;
		buf[n] = '\0';
		p = strchr(buf, '(');
		q = strrchr(buf, ')');
		if (!p || !q || q < p || (size_t)(q - p - 1) >= sizeof(comm))
			continue;
		memcpy(comm, p + 1, (size_t)(q - p - 1));
		comm[q - p - 1] = '\0';
		if (sscanf(q + 2, "%*c %d", &ppid) != 1)
			continue;
		if (ppid == mountd && strncmp(comm, "ferry-reconcil", 14) == 0 && pid_alive(pid))
			found = pid;
	}
	closedir(d);
	return found;
}

static long count_fds(pid_t pid)
{
	char path[64];
	DIR *d;
	struct dirent *de;
	long n = 0;

	snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
	d = opendir(path);
	if (!d)
		return -1;
	while ((de = readdir(d)))
		if (de->d_name[0] != '.')
			n++;
	closedir(d);
	return n;
}

static bool psample(pid_t pid, struct psample *s)
{
	char path[64], line[512];
	FILE *f;

	memset(s, 0, sizeof(*s));
	s->pid = pid;
	if (pid <= 0)
		return false;
	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	f = fopen(path, "re");
	if (!f)
		return false;
	while (fgets(line, sizeof(line), f)) {
		sscanf(line, "VmRSS: %ld", &s->rss_kb);
		sscanf(line, "VmHWM: %ld", &s->hwm_kb);
	}
	fclose(f);
	snprintf(path, sizeof(path), "/proc/%d/io", (int)pid);
	f = fopen(path, "re");
	if (f) {
		while (fgets(line, sizeof(line), f))
			sscanf(line, "rchar: %llu", &s->rchar);
		fclose(f);
	}
	snprintf(path, sizeof(path), "/proc/%d/limits", (int)pid);
	f = fopen(path, "re");
	if (f) {
		while (fgets(line, sizeof(line), f)) {
			char soft[32], hard[32];

			if (sscanf(line, "Max open files %31s %31s", soft, hard) == 2) {
				s->nofile_soft = strcmp(soft, "unlimited") ? atol(soft) : LONG_MAX;
				s->nofile_hard = strcmp(hard, "unlimited") ? atol(hard) : LONG_MAX;
			}
		}
		fclose(f);
	}
	s->fds = count_fds(pid);
	return s->fds >= 0;
}

/* Both daemons of the mount, sampled and logged. */
struct daemons {
	struct psample m, r;
};

static void sample(const char *when, struct daemons *d)
{
	pid_t m = mountd_pid();

	cr_assert(psample(m, &d->m), "cannot read /proc/%d", (int)m);
	psample(reconciler_pid(m), &d->r);
	cr_log_info("%s: ferry-mountd %d: VmRSS %ld KiB, VmHWM %ld KiB, %ld fds, %llu bytes "
		    "read; ferry-reconciler %d: VmRSS %ld KiB, VmHWM %ld KiB, %ld fds, %llu "
		    "bytes read", when, (int)d->m.pid, d->m.rss_kb, d->m.hwm_kb, d->m.fds,
		    d->m.rchar, (int)d->r.pid, d->r.rss_kb, d->r.hwm_kb, d->r.fds, d->r.rchar);
}

/* ---- .stats --------------------------------------------------------------- */

/* Reads .stats like fm_stats_read, but answers false instead of failing
 * when the mount cannot serve it (a daemon out of fds answers EIO). */
static bool stats_try(struct fm_stats *s)
{
	char *text = fm_slurp(mp(".stats")), *save = NULL, *line;

	s->n = 0;
	if (!text)
		return false;
	for (line = strtok_r(text, "\n", &save); line && s->n < 512;
	     line = strtok_r(NULL, "\n", &save)) {
		char *sp1 = strchr(line, ' ');

		if (!sp1 || (size_t)(sp1 - line) >= sizeof(s->e[0].name) ||
		    strlen(sp1 + 1) >= sizeof(s->e[0].value))
			continue;
		memcpy(s->e[s->n].name, line, (size_t)(sp1 - line));
		s->e[s->n].name[sp1 - line] = '\0';
		strcpy(s->e[s->n].value, sp1 + 1);
		s->n++;
	}
	free(text);
	return s->n > 0;
}

static uint64_t stat_or0(const struct fm_stats *s, const char *name)
{
	uint64_t v = 0;

	fm_stats_get(s, name, &v);
	return v;
}

/* Waits until nothing closed is still waiting for its upload or commit
 * (a liveness bound, not a timing claim: limit_s is far beyond need). */
static void wait_drained(int limit_s)
{
	static const char *const keys[] = { "passthrough_staging_bytes", "reconcile_inflight",
					    "reconcile_handed_inflight", "pending_commits" };
	double until = now_s() + limit_s;
	struct fm_stats *s = malloc(sizeof(*s));

	cr_assert(s);
	for (;;) {
		uint64_t sum = 0;
		bool ok = stats_try(s);

		for (size_t k = 0; k < sizeof(keys) / sizeof(keys[0]); k++)
			sum += stat_or0(s, keys[k]);
		if (ok && sum == 0)
			break;
		cr_assert(now_s() < until,
			  "uploads still pending after %d s (.stats %s): staging bytes %" PRIu64 ", inflight %"
			  PRIu64 ", handed %" PRIu64 ", pending commits %" PRIu64, limit_s,
			  ok ? "read" : "unreadable", stat_or0(s, keys[0]), stat_or0(s, keys[1]), stat_or0(s, keys[2]),
			  stat_or0(s, keys[3]));
		usleep(20000);
	}
	free(s);
}

static uint64_t stat_now(const char *name)
{
	struct fm_stats *s = malloc(sizeof(*s));
	uint64_t v;

	cr_assert(s);
	fm_stats_read(s);
	v = stat_or0(s, name);
	free(s);
	return v;
}

static bool passthrough_active(void)
{
	return stat_now("passthrough_active") == 1;
}

/* A staging file's name: <ino>-<fh>-<pid>-<serial>, ".p" for passthrough. */
static bool staging_name(const char *name)
{
	int end = -1;

	if (sscanf(name, "%*u-%*u-%*d-%*u%n", &end) != 0 || end <= 0)
		return false;
	return name[end] == '\0' || strcmp(name + end, ".p") == 0;
}

/* Staging files ferry-mountd holds open: fds whose target is in the
 * staging directory (VOLUME/staging unless the fixture moved it). */
static long staging_fds(pid_t pid)
{
	char dir[PATH_MAX + 16], path[64], target[PATH_MAX];
	DIR *d;
	struct dirent *de;
	size_t dl;
	long n = 0;

	if (fm.staging[0])
		snprintf(dir, sizeof(dir), "%s/", fm.staging);
	else
		snprintf(dir, sizeof(dir), "%s/staging/", fm.vol);
	dl = strlen(dir);
	snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
	d = opendir(path);
	if (!d)
		return -1;
	while ((de = readdir(d))) {
		char link[PATH_MAX];
		ssize_t len;

		if (de->d_name[0] == '.')
			continue;
		snprintf(link, sizeof(link), "%s/%s", path, de->d_name);
		len = readlink(link, target, sizeof(target) - 1);
		if (len <= 0)
			continue;
		target[len] = '\0';
		if (strncmp(target, dir, dl) == 0 && staging_name(target + dl))
			n++;
	}
	closedir(d);
	return n;
}

/*
 * Waits until every closed file is handed off or committed, then until
 * nothing is pending. FUSE sends RELEASE asynchronously: when close()
 * returns, ferry-mountd may not even have started the hand-off, so
 * "nothing pending" alone proves nothing right after a close. A written
 * file's staging file stays open in ferry-mountd until its hand-off (the
 * job is counted in flight before that fd is closed) or its commit: none
 * left means every release got that far. (A liveness bound, not a timing
 * claim.)
 */
static void wait_released(int limit_s)
{
	double until = now_s() + limit_s;
	pid_t md = mountd_pid();
	long n;

	while ((n = staging_fds(md)) > 0) {
		cr_assert(now_s() < until, "ferry-mountd still holds %ld staging files %d s after "
			  "they were closed", n, limit_s);
		usleep(20000);
	}
	wait_drained(limit_s);
}

/* ---- 1. names of 255 bytes ------------------------------------------------ */

enum nop_kind { N_CREATE, N_MKDIR, N_MKNOD, N_STAT, N_SYMLINK, N_READLINK, N_LINK, N_RENAME,
		N_UNLINK, N_RMDIR, N_OPEN };

struct nop {
	enum nop_kind kind;
	const char *a, *b; /* names relative to the directory */
	int want;          /* the errno ext4 gives (0: success) */
	const char *what;
};

/* One namespace call relative to dfd: 0 or its errno. */
static int nop_run(int dfd, const struct nop *p)
{
	char buf[PATH_MAX + 1];
	struct stat st;
	int fd, e = 0;
	ssize_t n;

	errno = 0;
	switch (p->kind) {
	case N_CREATE:
		fd = openat(dfd, p->a, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0644);
		if (fd < 0)
			return errno;
		if (write(fd, p->a, strlen(p->a)) != (ssize_t)strlen(p->a))
			e = errno ? errno : EIO;
		if (close(fd) != 0 && !e)
			e = errno;
		return e;
	case N_OPEN:
		fd = openat(dfd, p->a, O_RDONLY | O_CLOEXEC);
		if (fd < 0)
			return errno;
		close(fd);
		return 0;
	case N_MKDIR:
		return ERR_OF(mkdirat(dfd, p->a, 0755));
	case N_MKNOD:
		return ERR_OF(mknodat(dfd, p->a, S_IFREG | 0644, 0));
	case N_STAT:
		return ERR_OF(fstatat(dfd, p->a, &st, AT_SYMLINK_NOFOLLOW));
	case N_SYMLINK:
		return ERR_OF(symlinkat(p->b, dfd, p->a));
	case N_READLINK:
		n = readlinkat(dfd, p->a, buf, sizeof(buf));
		if (n < 0)
			return errno;
		/* the target must come back whole */
		return (size_t)n == strlen(p->b) && memcmp(buf, p->b, (size_t)n) == 0 ? 0 : EBADMSG;
	case N_LINK:
		return ERR_OF(linkat(dfd, p->a, dfd, p->b, 0));
	case N_RENAME:
		return ERR_OF(renameat(dfd, p->a, dfd, p->b));
	case N_UNLINK:
		return ERR_OF(unlinkat(dfd, p->a, 0));
	case N_RMDIR:
		return ERR_OF(unlinkat(dfd, p->a, AT_REMOVEDIR));
	}
	return EINVAL;
}

/* Runs ops[0..n) on ferryfs (mdir) and on ext4 (rdir): each must give what
 * ext4 gives, and ext4 what the table says (the test's own premise). */
static void nops_both(int mdir, int rdir, const struct nop *ops, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		int r = nop_run(rdir, &ops[i]);
		int m = nop_run(mdir, &ops[i]);

		cr_assert_eq(r, ops[i].want, "ext4: %s: %s, the test expected %s", ops[i].what,
			     fm_errname(r), fm_errname(ops[i].want));
		cr_assert_eq(m, r, "%s: ferryfs says %s, ext4 %s", ops[i].what, fm_errname(m),
			     fm_errname(r));
	}
}

/* The entries of a directory (without . and ..), each name once: asserts
 * that the listing holds exactly want[0..n) (as a set), nothing twice. */
static void expect_listing(const char *dir, const char *const *want, size_t n)
{
	DIR *d = opendir(dir);
	struct dirent *de;
	int *seen = calloc(n ? n : 1, sizeof(int));
	size_t total = 0;

	cr_assert(d, "opendir %s: %s", dir, strerror(errno));
	cr_assert(seen);
	while ((errno = 0, de = readdir(d))) {
		size_t k;

		if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
			continue;
		total++;
		for (k = 0; k < n && strcmp(want[k], de->d_name) != 0; k++)
			;
		cr_assert(k < n, "%s: unexpected entry '%.40s...' (%zu bytes)", dir, de->d_name,
			  strlen(de->d_name));
		cr_assert_eq(seen[k], 0, "%s: entry of %zu bytes listed twice", dir,
			     strlen(de->d_name));
		seen[k]++;
	}
	cr_assert_eq(errno, 0, "readdir %s: %s", dir, strerror(errno));
	closedir(d);
	cr_assert_eq(total, n, "%s: %zu entries, expected %zu", dir, total, n);
	free(seen);
}

static void fill_name(char *buf, char c, size_t len)
{
	memset(buf, c, len);
	buf[len] = '\0';
}

Test(limits, names_of_255_bytes)
{
	static char a255[256], b255[256], d255[256], s255[256], l255[256], r255[256],
		u255[256], in_d[520], n256[257], n1024[1025], n1025[1026], e256[257],
		via_x[270], d_long[520];
	const char *rd = ref_dir();
	int mdir, rdir;

	fill_name(a255, 'a', 255);
	fill_name(b255, 'b', 255);
	fill_name(d255, 'd', 255);
	fill_name(s255, 's', 255);
	fill_name(l255, 'l', 255);
	fill_name(r255, 'r', 255);
	fill_name(n256, 'n', 256);
	fill_name(e256, 'e', 256);
	fill_name(n1024, 'k', 1024);
	fill_name(n1025, 'K', 1025);
	/* 255 bytes of UTF-8: the limit is in bytes, not characters. */
	for (int i = 0; i < 127; i++)
		memcpy(u255 + 2 * i, "\xc3\xa9", 2); /* U+00E9 */
	u255[254] = 'x';
	u255[255] = '\0';
	snprintf(in_d, sizeof(in_d), "%s/%s", d255, b255);
	snprintf(via_x, sizeof(via_x), "x/../%s", n256);
	snprintf(d_long, sizeof(d_long), "%s/%s", d255, n256);
	cr_assert_eq(strlen(u255), 255);

	mdir = OK(open(fm.mnt, O_RDONLY | O_DIRECTORY | O_CLOEXEC));
	rdir = OK(open(rd, O_RDONLY | O_DIRECTORY | O_CLOEXEC));

	const struct nop make[] = {
		{ N_CREATE, a255, NULL, 0, "create a 255-byte name" },
		{ N_STAT, a255, NULL, 0, "stat a 255-byte name" },
		{ N_OPEN, a255, NULL, 0, "open a 255-byte name" },
		{ N_MKDIR, d255, NULL, 0, "mkdir a 255-byte name" },
		{ N_CREATE, in_d, NULL, 0, "create 255/255" },
		{ N_SYMLINK, s255, a255, 0, "symlink named 255 bytes to a 255-byte name" },
		{ N_READLINK, s255, a255, 0, "readlink of it" },
		{ N_LINK, a255, l255, 0, "link a 255-byte name to another" },
		{ N_MKNOD, u255, NULL, 0, "mknod a 255-byte UTF-8 name (127 two-byte characters)" },
		{ N_CREATE, n256, NULL, ENAMETOOLONG, "create a 256-byte name" },
		{ N_MKDIR, n256, NULL, ENAMETOOLONG, "mkdir a 256-byte name" },
		{ N_MKNOD, n256, NULL, ENAMETOOLONG, "mknod a 256-byte name" },
		{ N_STAT, n256, NULL, ENAMETOOLONG, "lookup of a 256-byte name" },
		{ N_OPEN, n256, NULL, ENAMETOOLONG, "open of a 256-byte name" },
		{ N_SYMLINK, n256, a255, ENAMETOOLONG, "symlink named 256 bytes" },
		{ N_LINK, a255, n256, ENAMETOOLONG, "link to a 256-byte name" },
		{ N_RENAME, a255, n256, ENAMETOOLONG, "rename to a 256-byte name" },
		{ N_RENAME, e256, b255, ENAMETOOLONG, "rename from a 256-byte name" },
		{ N_UNLINK, n256, NULL, ENAMETOOLONG, "unlink a 256-byte name" },
		{ N_RMDIR, n256, NULL, ENAMETOOLONG, "rmdir a 256-byte name" },
		/* FUSE's kernel side passes names up to 1024 bytes to the daemon:
		 * 256..1024 are ferry-mountd's to refuse, 1025 the kernel's. */
		{ N_CREATE, n1024, NULL, ENAMETOOLONG, "create a 1024-byte name" },
		{ N_MKDIR, n1024, NULL, ENAMETOOLONG, "mkdir a 1024-byte name" },
		{ N_STAT, n1024, NULL, ENAMETOOLONG, "lookup of a 1024-byte name" },
		{ N_CREATE, n1025, NULL, ENAMETOOLONG, "create a 1025-byte name" },
		/* a component too long in the middle of a path */
		{ N_STAT, via_x, NULL, ENOENT,
		  "lookup through a missing directory before a 256-byte component" },
		{ N_STAT, d_long, NULL, ENAMETOOLONG, "lookup of 255/256" },
		{ N_CREATE, d_long, NULL, ENAMETOOLONG, "create 255/256" },
	};
	nops_both(mdir, rdir, make, sizeof(make) / sizeof(make[0]));

	const char *const listed[] = { a255, d255, s255, l255, u255 };
	expect_listing(fm.mnt, listed, 5);
	expect_listing(rd, listed, 5);
	{
		const char *const inner[] = { b255 };
		expect_listing(mp("%s", d255), inner, 1);
	}
	struct stat st;
	OK(fstatat(mdir, a255, &st, 0));
	cr_assert_eq(st.st_nlink, 2, "nlink of a 255-byte name with a 255-byte link: %lu",
		     (unsigned long)st.st_nlink);
	cr_assert_eq(st.st_size, 255);

	/* The names are in the metadata, not only in the kernel's dcache. */
	close(mdir);
	fm_remount_cold();
	mdir = OK(open(fm.mnt, O_RDONLY | O_DIRECTORY | O_CLOEXEC));
	expect_listing(fm.mnt, listed, 5);
	fm_expect_content(mp("%s", a255), a255, 255);
	fm_expect_content(mp("%s", in_d), in_d, strlen(in_d));

	const struct nop unmake[] = {
		{ N_READLINK, s255, a255, 0, "readlink of the 255-byte symlink after a remount" },
		{ N_RENAME, a255, r255, 0, "rename a 255-byte name to another" },
		{ N_STAT, a255, NULL, ENOENT, "the old name after the rename" },
		{ N_STAT, r255, NULL, 0, "the new name after the rename" },
		{ N_RENAME, r255, n256, ENAMETOOLONG, "rename to 256 bytes after a remount" },
		{ N_UNLINK, r255, NULL, 0, "unlink a 255-byte name" },
		{ N_UNLINK, l255, NULL, 0, "unlink its 255-byte link" },
		{ N_UNLINK, s255, NULL, 0, "unlink the 255-byte symlink" },
		{ N_UNLINK, u255, NULL, 0, "unlink the 255-byte UTF-8 name" },
		{ N_UNLINK, in_d, NULL, 0, "unlink 255/255" },
		{ N_RMDIR, d255, NULL, 0, "rmdir a 255-byte name" },
	};
	nops_both(mdir, rdir, unmake, sizeof(unmake) / sizeof(unmake[0]));
	expect_listing(fm.mnt, NULL, 0);
	close(mdir);
	close(rdir);
}

/* ---- 2. deep trees, PATH_MAX ---------------------------------------------- */

#define DEEP_LEVELS 40            /* 40 components of 255 bytes: 10 KiB deep */
#define DEEP_AT_PATH_MAX 15       /* 15 * 256 bytes + "/f" still fits in 4095 */

static char deep_comp[256];

/* prefix (or nothing: a relative path) + k components, the first followed
 * by as many extra slashes as make the whole exactly total bytes, + "/f". */
static void padded_path(char *out, size_t cap, const char *prefix, int k, size_t total)
{
	size_t base = (prefix[0] ? strlen(prefix) + 1 : 0) + (size_t)k * 256 + 1;
	size_t pad, o = 0;

	cr_assert(total >= base && total < cap, "padded_path: %zu bytes cannot make %zu", base,
		  total);
	pad = total - base;
	if (prefix[0])
		o += (size_t)snprintf(out + o, cap - o, "%s/", prefix);
	memcpy(out + o, deep_comp, 255);
	o += 255;
	memset(out + o, '/', pad);
	o += pad;
	for (int i = 1; i < k; i++) {
		out[o++] = '/';
		memcpy(out + o, deep_comp, 255);
		o += 255;
	}
	memcpy(out + o, "/f", 3);
	cr_assert_eq(strlen(out), total);
}

/* Builds the tree under root through dirfds; fds[0..DEEP_LEVELS] are the
 * directories, fds[0] a dup of root. Every level holds f = "level N". */
static void deep_build(int root, int *fds)
{
	fds[0] = OK(dup(root));
	for (int lv = 1; lv <= DEEP_LEVELS; lv++) {
		char text[32];
		int fd;

		OK(mkdirat(fds[lv - 1], deep_comp, 0755));
		fds[lv] = OK(openat(fds[lv - 1], deep_comp, O_RDONLY | O_DIRECTORY | O_CLOEXEC));
		fd = OK(openat(fds[lv], "f", O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0644));
		snprintf(text, sizeof(text), "level %d", lv);
		fm_pwrite_all(fd, text, strlen(text), 0);
		OK(close(fd));
	}
}

static void deep_close(int *fds)
{
	for (int lv = 0; lv <= DEEP_LEVELS; lv++)
		if (fds[lv] >= 0)
			close(fds[lv]);
}

/* Contents of dfd/name (small), or the errno as a negative number. */
static ssize_t read_at(int dfd, const char *name, char *buf, size_t cap)
{
	int fd = openat(dfd, name, O_RDONLY | O_CLOEXEC);
	ssize_t n;

	if (fd < 0)
		return -errno;
	n = read(fd, buf, cap - 1);
	if (n < 0)
		n = -errno;
	else
		buf[n] = '\0';
	close(fd);
	return n;
}

static void expect_level(int dfd, const char *name, int lv, const char *where)
{
	char buf[64], want[32];
	ssize_t n = read_at(dfd, name, buf, sizeof(buf));

	snprintf(want, sizeof(want), "level %d", lv);
	cr_assert(n >= 0, "%s: %s: %s", where, name, fm_errname((int)-n));
	cr_assert_str_eq(buf, want, "%s: %s holds '%s', expected '%s'", where, name, buf, want);
}

/* What the tree's calls give under one root, recorded for comparison. */
struct deep_result {
	int e[24];
	size_t cwd_len;
};

static void deep_ops(const char *root_path, int *fds, struct deep_result *r)
{
	static char p[PATH_MAX + 64];
	unsigned char data[8192];
	struct stat st;
	int fd, cwd, k = 0, L = DEEP_LEVELS;
	long rc;
	char *g;

	memset(r, 0, sizeof(*r));
	for (size_t i = 0; i < sizeof(data); i++)
		data[i] = (unsigned char)(i * 7 + 1);
	/* file calls at the bottom, relative to its dirfd */
	fd = OK(openat(fds[L], "file", O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0644));
	fm_pwrite_all(fd, data, sizeof(data), 0);
	OK(close(fd));
	OK(fstatat(fds[L], "file", &st, 0));
	cr_assert_eq(st.st_size, (off_t)sizeof(data), "%s: size at the bottom", root_path);
	r->e[k++] = ERR_OF(renameat(fds[L], "file", fds[L - 1], "moved")); /* up a level */
	r->e[k++] = ERR_OF(renameat(fds[L - 1], "moved", fds[L], "file"));
	r->e[k++] = ERR_OF(linkat(fds[L], "file", fds[1], "hardlink", 0)); /* 39 levels apart */
	r->e[k++] = ERR_OF(fstatat(fds[1], "hardlink", &st, 0));
	cr_assert_eq(st.st_nlink, 2, "%s: nlink across the tree", root_path);
	r->e[k++] = ERR_OF(unlinkat(fds[1], "hardlink", 0));
	r->e[k++] = ERR_OF(symlinkat("../f", fds[L], "up"));
	expect_level(fds[L], "up", L - 1, root_path);
	r->e[k++] = ERR_OF(mkdirat(fds[L], "sub", 0700));
	r->e[k++] = ERR_OF(unlinkat(fds[L], "sub", AT_REMOVEDIR));
	r->e[k++] = ERR_OF(fsetxattr(fds[L], "user.deep", "1", 1, 0));
	r->e[k++] = ERR_OF(fchmodat(fds[L], "file", 0600, 0));
	fd = OK(openat(fds[L], "file", O_RDONLY | O_CLOEXEC));
	{
		unsigned char back[sizeof(data)];
		fm_pread_all(fd, back, sizeof(back), 0);
		cr_assert(memcmp(back, data, sizeof(data)) == 0, "%s: the bottom file", root_path);
	}
	close(fd);

	/* getcwd down there: the kernel's answer is ENAMETOOLONG past a page;
	 * glibc then walks up through "..", which must work too. */
	cwd = OK(open(".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
	OK(fchdir(fds[L]));
	{
		static char big[65536];
		errno = 0;
		rc = syscall(SYS_getcwd, big, sizeof(big));
		r->e[k++] = rc < 0 ? errno : 0;
	}
	g = getcwd(NULL, 0);
	r->e[k++] = g ? 0 : errno;
	OK(fchdir(cwd));
	close(cwd);
	if (g) {
		r->cwd_len = strlen(g) - strlen(root_path);
		cr_assert(strncmp(g, root_path, strlen(root_path)) == 0,
			  "getcwd at the bottom of %s starts with '%.60s'", root_path, g);
		cr_assert_eq(r->cwd_len, (size_t)L * 256, "%s: getcwd is %zu bytes below the root",
			     root_path, r->cwd_len);
		free(g);
	}

	/* paths of exactly 4095 bytes resolve, 4096 are the kernel's ENAMETOOLONG */
	padded_path(p, sizeof(p), "", DEEP_AT_PATH_MAX, PATH_MAX - 1);
	r->e[k++] = ERR_OF(fstatat(fds[0], p, &st, 0));
	expect_level(fds[0], p, DEEP_AT_PATH_MAX, "relative path of 4095 bytes");
	padded_path(p, sizeof(p), "", DEEP_AT_PATH_MAX, PATH_MAX);
	r->e[k++] = ERR_OF(fstatat(fds[0], p, &st, 0));
	r->e[k++] = ERR_OF(mkdirat(fds[0], p, 0755));
	padded_path(p, sizeof(p), root_path, DEEP_AT_PATH_MAX, PATH_MAX - 1);
	r->e[k++] = ERR_OF(stat(p, &st));
	expect_level(AT_FDCWD, p, DEEP_AT_PATH_MAX, "absolute path of 4095 bytes");
	padded_path(p, sizeof(p), root_path, DEEP_AT_PATH_MAX, PATH_MAX);
	r->e[k++] = ERR_OF(stat(p, &st));
	r->e[k++] = ERR_OF(open(p, O_CREAT | O_WRONLY | O_CLOEXEC, 0644));
	r->e[k++] = ERR_OF(unlink(p));

	/* a symlink target of 4095 bytes (that path) works and is followed;
	 * 4096 is refused by the kernel before any filesystem sees it */
	padded_path(p, sizeof(p), "", DEEP_AT_PATH_MAX, PATH_MAX - 1);
	r->e[k++] = ERR_OF(symlinkat(p, fds[0], "t4095"));
	{
		static char back[PATH_MAX + 1];
		ssize_t n = readlinkat(fds[0], "t4095", back, sizeof(back));
		cr_assert_eq(n, (ssize_t)PATH_MAX - 1, "%s: readlink of a 4095-byte target: %zd",
			     root_path, n);
		cr_assert(memcmp(back, p, (size_t)n) == 0, "%s: the 4095-byte target", root_path);
	}
	expect_level(fds[0], "t4095", DEEP_AT_PATH_MAX, "through a 4095-byte symlink");
	padded_path(p, sizeof(p), "", DEEP_AT_PATH_MAX, PATH_MAX);
	r->e[k++] = ERR_OF(symlinkat(p, fds[0], "t4096"));
	cr_assert(k <= (int)(sizeof(r->e) / sizeof(r->e[0])));
}

Test(limits, deep_tree_past_path_max)
{
	static const char *const names[] = {
		"rename up a level", "rename back", "link 39 levels apart", "stat the link",
		"unlink the link", "symlink ../f", "mkdir at the bottom", "rmdir at the bottom",
		"fsetxattr at the bottom", "fchmodat at the bottom", "getcwd syscall at the bottom",
		"glibc getcwd at the bottom", "fstatat of a 4095-byte path",
		"fstatat of a 4096-byte path", "mkdirat of a 4096-byte path",
		"stat of a 4095-byte absolute path", "stat of a 4096-byte absolute path",
		"open(O_CREAT) of a 4096-byte absolute path", "unlink of a 4096-byte absolute path",
		"symlink with a 4095-byte target", "symlink with a 4096-byte target",
	};
	static const int want[] = { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, ENAMETOOLONG, 0, 0, ENAMETOOLONG,
				    ENAMETOOLONG, 0, ENAMETOOLONG, ENAMETOOLONG, ENAMETOOLONG, 0,
				    ENAMETOOLONG };
	const char *rd = ref_dir();
	int mfds[DEEP_LEVELS + 1], rfds[DEEP_LEVELS + 1], root;
	struct deep_result mr, rr;

	memset(deep_comp, 'D', 255);
	deep_comp[255] = '\0';

	root = OK(open(rd, O_RDONLY | O_DIRECTORY | O_CLOEXEC));
	deep_build(root, rfds);
	close(root);
	root = OK(open(fm.mnt, O_RDONLY | O_DIRECTORY | O_CLOEXEC));
	deep_build(root, mfds);
	close(root);
	deep_ops(rd, rfds, &rr);
	deep_ops(fm.mnt, mfds, &mr);
	for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
		cr_assert_eq(rr.e[i], want[i], "ext4: %s: %s, the test expected %s", names[i],
			     fm_errname(rr.e[i]), fm_errname(want[i]));
		cr_assert_eq(mr.e[i], rr.e[i], "%s: ferryfs says %s, ext4 %s", names[i],
			     fm_errname(mr.e[i]), fm_errname(rr.e[i]));
	}
	cr_log_info("deep tree: %d levels of 255-byte names, %zu bytes below the mount; paths of "
		    "4095 bytes resolve, 4096 give ENAMETOOLONG, as on ext4", DEEP_LEVELS,
		    mr.cwd_len);

	/* Everything is in the metadata: walk it again from a cold mount. */
	deep_close(mfds);
	fm_remount_cold();
	{
		int fd = OK(open(fm.mnt, O_RDONLY | O_DIRECTORY | O_CLOEXEC));
		static char p[PATH_MAX + 64];
		static char back[PATH_MAX + 1];

		for (int lv = 1; lv <= DEEP_LEVELS; lv++) {
			int next = OK(openat(fd, deep_comp, O_RDONLY | O_DIRECTORY | O_CLOEXEC));
			close(fd);
			fd = next;
			expect_level(fd, "f", lv, "after a cold remount");
		}
		close(fd);
		fd = OK(open(fm.mnt, O_RDONLY | O_DIRECTORY | O_CLOEXEC));
		padded_path(p, sizeof(p), "", DEEP_AT_PATH_MAX, PATH_MAX - 1);
		cr_assert_eq(readlinkat(fd, "t4095", back, sizeof(back)), (ssize_t)PATH_MAX - 1);
		cr_assert(memcmp(back, p, PATH_MAX - 1) == 0, "the 4095-byte target after a remount");
		expect_level(fd, "t4095", DEEP_AT_PATH_MAX, "through the symlink after a remount");

		/* and it all goes away again, bottom up through dirfds */
		rm_at(fd, deep_comp);
		unlinkat(fd, "t4095", 0);
		close(fd);
		expect_listing(fm.mnt, NULL, 0);
	}
	deep_close(rfds);
}

/* ---- 3. xattrs at their limits ------------------------------------------- */

/*
 * The oracle here is the Linux VFS, not ext4: XATTR_NAME_MAX (255) bounds
 * the whole name, "user." included (fs/xattr.c copies it into a buffer of
 * XATTR_NAME_MAX + 1 and answers ERANGE), and XATTR_SIZE_MAX (65536) a
 * value (E2BIG). ext4 with 4 KiB blocks and no ea_inode feature stores a
 * value of at most about a block and answers ENOSPC above that, and it
 * cannot hold a thousand attributes on one inode; tmpfs, which keeps them
 * in memory, takes exactly the VFS limits. Names are compared with ext4.
 */
static void xname(char *buf, size_t total, char fill)
{
	memcpy(buf, "user.", 5);
	memset(buf + 5, fill, total - 5);
	buf[total] = '\0';
}

static void xvalue(unsigned char *v, size_t len, unsigned seed)
{
	for (size_t i = 0; i < len; i++)
		v[i] = (unsigned char)((i * 131 + seed * 7) >> 3);
}

/* The names of listxattr's answer, checked against want (each once). */
static void expect_xattr_list(const char *path, char **want, size_t n)
{
	ssize_t size = listxattr(path, NULL, 0), got;
	char *buf, *p;
	size_t seen = 0, total = 0;
	unsigned char *mark = calloc(n, 1);

	for (size_t i = 0; i < n; i++)
		total += strlen(want[i]) + 1;
	cr_assert_eq(size, (ssize_t)total, "%s: listxattr size query %zd, expected %zu", path,
		     size, total);
	buf = malloc((size_t)size + 1);
	cr_assert(buf && mark);
	/* one byte short: ERANGE, as the size query promised */
	FAILS(listxattr(path, buf, (size_t)size - 1), ERANGE);
	got = OK(listxattr(path, buf, (size_t)size));
	cr_assert_eq(got, size);
	for (p = buf; p < buf + got; p += strlen(p) + 1) {
		size_t k;

		for (k = 0; k < n && strcmp(want[k], p) != 0; k++)
			;
		cr_assert(k < n, "%s: listxattr lists '%.40s', not set", path, p);
		cr_assert(!mark[k], "%s: listxattr lists '%.40s' twice", path, p);
		mark[k] = 1;
		seen++;
	}
	cr_assert_eq(seen, n);
	free(buf);
	free(mark);
}

Test(limits, xattrs_at_their_limits)
{
	enum { MANY = 1000 };
	static char n255[XATTR_NAME_MAX + 1], n256[XATTR_NAME_MAX + 2], p255[XATTR_NAME_MAX + 7];
	static unsigned char big[XATTR_SIZE_MAX + 1], back[XATTR_SIZE_MAX + 1];
	char **names = calloc(MANY + 2, sizeof(char *));
	const char *rd = ref_dir();
	const char *mf = mp("x"), *rf = sp("ref/x");
	ssize_t n;
	int e;

	cr_assert(names);
	fm_write_file(mf, "x", 1);
	fm_write_file(rf, "x", 1);
	(void)rd;

	/* names: 255 bytes in all work, 256 are ERANGE, on ferryfs as on ext4 */
	xname(n255, XATTR_NAME_MAX, 'n');
	xname(n256, XATTR_NAME_MAX + 1, 'o');
	xname(p255, XATTR_NAME_MAX + 5, 'p'); /* 255 bytes after the prefix */
	OK(setxattr(rf, n255, "v255", 4, 0));
	OK(setxattr(mf, n255, "v255", 4, 0));
	FAILS(setxattr(rf, n256, "v", 1, 0), ERANGE);
	FAILS(setxattr(mf, n256, "v", 1, 0), ERANGE);
	FAILS(setxattr(rf, p255, "v", 1, 0), ERANGE);
	FAILS(setxattr(mf, p255, "v", 1, 0), ERANGE);
	FAILS(getxattr(mf, n256, back, sizeof(back)), ERANGE);
	FAILS(removexattr(mf, n256), ERANGE);
	n = OK(getxattr(mf, n255, back, sizeof(back)));
	cr_assert(n == 4 && memcmp(back, "v255", 4) == 0, "the value under a 255-byte name");
	cr_log_info("xattr names: 255 bytes including \"user.\" work, 256 give ERANGE (ferryfs "
		    "and ext4 alike: the limit is the VFS's, on the whole name)");

	/* values: XATTR_SIZE_MAX works, one more is E2BIG (the VFS's answer) */
	xvalue(big, sizeof(big), 1);
	OK(setxattr(mf, "user.big", big, XATTR_SIZE_MAX, 0));
	FAILS(setxattr(mf, "user.big2", big, XATTR_SIZE_MAX + 1, 0), E2BIG);
	FAILS(setxattr(mf, "user.big", big, XATTR_SIZE_MAX + 1, XATTR_REPLACE), E2BIG);
	e = ERR_OF(setxattr(rf, "user.big", big, XATTR_SIZE_MAX, 0));
	cr_log_info("xattr value of %d bytes: ferryfs takes it, ext4 says %s (its values live "
		    "in one block; the VFS and tmpfs allow %d)", XATTR_SIZE_MAX, fm_errname(e),
		    XATTR_SIZE_MAX);
	FAILS(setxattr(rf, "user.big2", big, XATTR_SIZE_MAX + 1, 0), E2BIG);
	cr_assert_eq(getxattr(mf, "user.big", NULL, 0), (ssize_t)XATTR_SIZE_MAX, "size query");
	FAILS(getxattr(mf, "user.big", back, XATTR_SIZE_MAX - 1), ERANGE);
	n = OK(getxattr(mf, "user.big", back, sizeof(back)));
	cr_assert(n == XATTR_SIZE_MAX && memcmp(back, big, XATTR_SIZE_MAX) == 0,
		  "the %d-byte value read back", XATTR_SIZE_MAX);
	/* a replace by a shorter value leaves no tail of the longer one */
	OK(setxattr(mf, "user.big", big + 1, 100, XATTR_REPLACE));
	cr_assert_eq(getxattr(mf, "user.big", back, sizeof(back)), 100);
	OK(setxattr(mf, "user.big", big, XATTR_SIZE_MAX, XATTR_REPLACE));

	/* many attributes on one inode */
	names[0] = n255;
	names[1] = "user.big";
	for (int i = 0; i < MANY; i++) {
		char v[40];
		int len = snprintf(v, sizeof(v), "value of %d", i);

		cr_assert(asprintf(&names[i + 2], "user.many.%04d", i) > 0);
		OK(setxattr(mf, names[i + 2], v, (size_t)len, XATTR_CREATE));
	}
	FAILS(setxattr(mf, names[2], "x", 1, XATTR_CREATE), EEXIST);
	FAILS(setxattr(mf, "user.absent", "x", 1, XATTR_REPLACE), ENODATA);
	expect_xattr_list(mf, names, MANY + 2);

	/* all of it survives a cold remount */
	fm_remount_cold();
	expect_xattr_list(mf, names, MANY + 2);
	n = OK(getxattr(mf, "user.big", back, sizeof(back)));
	cr_assert(n == XATTR_SIZE_MAX && memcmp(back, big, XATTR_SIZE_MAX) == 0,
		  "the %d-byte value after a cold remount", XATTR_SIZE_MAX);
	for (int i = 0; i < MANY; i += 97) {
		char v[40], got[40];
		int len = snprintf(v, sizeof(v), "value of %d", i);

		n = OK(getxattr(mf, names[i + 2], got, sizeof(got)));
		cr_assert(n == len && memcmp(got, v, (size_t)len) == 0, "%s after a remount",
			  names[i + 2]);
	}

	/* A list longer than XATTR_LIST_MAX: the kernel cannot hand it out
	 * (E2BIG from listxattr, as on tmpfs); each name still works and the
	 * list comes back once it fits again. FUSE's kernel side caps the
	 * size query at XATTR_LIST_MAX (tmpfs reports the true size). */
	{
		const char *g = mp("g");
		static char buf[XATTR_LIST_MAX + 1];
		static char lname[300][XATTR_NAME_MAX + 1];
		char *lp[300];

		fm_write_file(g, "", 0);
		for (int i = 0; i < 300; i++) {
			char head[16];

			xname(lname[i], XATTR_NAME_MAX, 'L');
			snprintf(head, sizeof(head), "%03d", i);
			memcpy(lname[i] + 5, head, 3);
			lp[i] = lname[i];
			OK(setxattr(g, lname[i], "1", 1, 0));
		}
		/* 300 * 256 = 76800 bytes of list */
		n = listxattr(g, NULL, 0);
		cr_log_info("listxattr size query on a 76800-byte list: %zd", n);
		cr_assert(n == XATTR_LIST_MAX || n == 300 * 256, "size query: %zd", n);
		FAILS(listxattr(g, buf, sizeof(buf)), E2BIG);
		n = OK(getxattr(g, lname[299], buf, sizeof(buf)));
		cr_assert_eq(n, 1);
		for (int i = 0; i < 50; i++)
			OK(removexattr(g, lname[i]));
		expect_xattr_list(g, lp + 50, 250);
	}
	for (int i = 0; i < MANY; i++)
		free(names[i + 2]);
	free(names);
}

/* ---- 4. a 1 TiB sparse file, the largest file ---------------------------- */

#define SPARSE_SIZE TiB
#define MID_AT (SPARSE_SIZE / 2 + 12345) /* unaligned, in the middle */

/* The data extents SEEK_DATA/SEEK_HOLE report for fd in [0, size). */
struct extents {
	int n;
	off_t s[64], e[64];
	uint64_t data_bytes;
};

static void seek_walk(int fd, off_t size, struct extents *x, const char *what)
{
	off_t at = 0;

	memset(x, 0, sizeof(*x));
	while (at < size) {
		off_t d = lseek(fd, at, SEEK_DATA), h;

		if (d < 0) {
			cr_assert_eq(errno, ENXIO, "%s: SEEK_DATA from %lld: %s", what, (long long)at,
				     strerror(errno));
			break;
		}
		cr_assert(d >= at && d < size, "%s: SEEK_DATA from %lld gave %lld", what,
			  (long long)at, (long long)d);
		h = lseek(fd, d, SEEK_HOLE);
		cr_assert(h > d && h <= size, "%s: SEEK_HOLE from %lld gave %lld", what,
			  (long long)d, (long long)h);
		cr_assert(x->n < 64, "%s: more than 64 data extents", what);
		x->s[x->n] = d;
		x->e[x->n] = h;
		x->n++;
		x->data_bytes += (uint64_t)(h - d);
		at = h;
	}
	FAILS(lseek(fd, size, SEEK_DATA), ENXIO);
	{
		/* the last byte: SEEK_HOLE answers the end if it is data, itself
		 * if it is in a hole, consistently with the walk */
		bool last_is_data = x->n > 0 && x->e[x->n - 1] == size;
		off_t h = lseek(fd, size - 1, SEEK_HOLE);

		cr_assert_eq(h, last_is_data ? size : size - 1,
			     "%s: SEEK_HOLE at the last byte gave %lld (the walk says it is %s)",
			     what, (long long)h, last_is_data ? "data" : "a hole");
	}
}

static void log_extents(const char *what, const struct extents *x)
{
	char line[1024];
	size_t o = 0;

	line[0] = '\0';
	for (int i = 0; i < x->n && o < sizeof(line) - 64; i++)
		o += (size_t)snprintf(line + o, sizeof(line) - o, " [%lld, %lld)",
				      (long long)x->s[i], (long long)x->e[i]);
	cr_log_info("%s: %d data extents, %" PRIu64 " bytes of data:%s", what, x->n, x->data_bytes,
		    line);
}

/* Every non-zero byte of written[] lies in a data extent: SEEK_DATA never
 * skips data, SEEK_HOLE never starts a hole over it. */
static void extents_cover(const struct extents *x, const off_t *at, const size_t *len, int n,
			  const char *what)
{
	for (int i = 0; i < n; i++) {
		bool in = false;

		for (int k = 0; k < x->n && !in; k++)
			in = x->s[k] <= at[i] && at[i] + (off_t)len[i] <= x->e[k];
		cr_assert(in, "%s: bytes [%lld, %lld) are data but no data extent covers them", what,
			  (long long)at[i], (long long)(at[i] + (off_t)len[i]));
	}
}

/* Reads the same windows of both files and compares them: ext4 decides
 * what a hole reads as and where the end is. */
static void same_windows(int mfd, int rfd, const char *when)
{
	static const off_t probes[] = { 0, 4096, 65536, (off_t)(SPARSE_SIZE / 4),
					(off_t)MID_AT - 100, (off_t)MID_AT - 4096, (off_t)MID_AT + 3,
					(off_t)(SPARSE_SIZE / 2 + GiB), (off_t)(SPARSE_SIZE - 8192),
					(off_t)(SPARSE_SIZE - 4096), (off_t)(SPARSE_SIZE - 100),
					(off_t)SPARSE_SIZE, (off_t)(SPARSE_SIZE + 4096) };
	static unsigned char a[65536], b[65536];

	for (size_t i = 0; i < sizeof(probes) / sizeof(probes[0]); i++) {
		ssize_t na = pread(mfd, a, sizeof(a), probes[i]);
		ssize_t nb = pread(rfd, b, sizeof(b), probes[i]);

		cr_assert(nb >= 0, "ext4 pread at %lld: %s", (long long)probes[i], strerror(errno));
		cr_assert_eq(na, nb, "%s: pread of 64 KiB at %lld: %zd bytes, ext4 %zd", when,
			     (long long)probes[i], na, nb);
		if (na > 0 && memcmp(a, b, (size_t)na) != 0) {
			ssize_t k = 0;
			while (a[k] == b[k])
				k++;
			cr_assert_fail("%s: byte %lld is 0x%02x, ext4 has 0x%02x", when,
				       (long long)(probes[i] + k), a[k], b[k]);
		}
	}
}

static bool writeback_cache(void)
{
	return stat_now("writeback_cache") == 1;
}

/* A sparse file's holes are reported (at most 256 MiB of it is data). */
static void expect_holes(const struct extents *x, const char *when)
{
	if (writeback_cache()) {
		cr_log_info("%s: writeback cache on: the kernel reports %" PRIu64 " bytes of data "
			    "(SEEK_HOLE is not ferryfs's on such a mount)", when, x->data_bytes);
		return;
	}
	cr_assert_lt(x->data_bytes, 256 * MiB, "%s: SEEK_HOLE reports %" PRIu64 " bytes of data",
		     when, x->data_bytes);
}

static void sparse_writes(int fd, const unsigned char *tail)
{
	fm_pwrite_all(fd, "ferry sparse head", 17, 0);
	fm_pwrite_all(fd, "middle", 6, (off_t)MID_AT);
	fm_pwrite_all(fd, tail, 4096, (off_t)(SPARSE_SIZE - 4096));
}

Test(limits, sparse_file_of_1_tib)
{
	static unsigned char tail[4096];
	const off_t at[] = { 0, (off_t)MID_AT, (off_t)(SPARSE_SIZE - 4096) };
	const size_t len[] = { 17, 6, 4096 };
	struct daemons d0, d1, d2;
	struct extents xm, xr;
	uint64_t up0, up1;
	int mfd, rfd;
	double t0, t_close, t_commit;

	ref_dir();
	for (size_t i = 0; i < sizeof(tail); i++)
		tail[i] = (unsigned char)(i % 251 + 1);
	cr_log_info("sparse file: passthrough %s", passthrough_active() ? "active" : "off");
	sample("sparse, before", &d0);
	up0 = stat_now("reconcile_upload_bytes_total") + stat_now("bytes_uploaded");

	rfd = OK(open(sp("ref/sparse"), O_CREAT | O_RDWR | O_CLOEXEC, 0644));
	sparse_writes(rfd, tail);
	mfd = OK(open(mp("sparse"), O_CREAT | O_RDWR | O_CLOEXEC, 0644));
	sparse_writes(mfd, tail);
	{
		struct stat st;
		OK(fstat(mfd, &st));
		cr_assert_eq((uint64_t)st.st_size, SPARSE_SIZE, "st_size while open: %lld",
			     (long long)st.st_size);
	}
	same_windows(mfd, rfd, "1 TiB sparse, open");
	seek_walk(rfd, (off_t)SPARSE_SIZE, &xr, "ext4");
	seek_walk(mfd, (off_t)SPARSE_SIZE, &xm, "ferryfs, open");
	extents_cover(&xm, at, len, 3, "ferryfs, open");
	log_extents("ext4", &xr);
	log_extents("ferryfs while open", &xm);

	/* close and commit: only the data is read and uploaded */
	t0 = now_s();
	OK(close(mfd));
	t_close = now_s() - t0;
	wait_released(240);
	t_commit = now_s() - t0;
	sample("sparse, committed", &d1);
	up1 = stat_now("reconcile_upload_bytes_total") + stat_now("bytes_uploaded");
	cr_log_info("1 TiB sparse file with %zu bytes of data: close() %.3f s, committed %.3f s "
		    "after it; %" PRIu64 " bytes uploaded; ferry-mountd read %llu bytes, "
		    "ferry-reconciler %llu", len[0] + len[1] + len[2], t_close, t_commit,
		    up1 - up0, d1.m.rchar - d0.m.rchar,
		    d1.r.pid == d0.r.pid ? d1.r.rchar - d0.r.rchar : 0ULL);
	/* The commit reads the data extents, not 1 TiB of holes: 64 MiB allows
	 * for the FUSE requests ferry-mountd reads and its own metadata I/O. */
	cr_assert_lt(d1.m.rchar - d0.m.rchar, 64 * MiB,
		     "ferry-mountd read %llu bytes to commit 4 KiB of data in a sparse file",
		     d1.m.rchar - d0.m.rchar);
	if (d1.r.pid && d1.r.pid == d0.r.pid)
		cr_assert_lt(d1.r.rchar - d0.r.rchar, 64 * MiB,
			     "ferry-reconciler read %llu bytes to commit 4 KiB of data",
			     d1.r.rchar - d0.r.rchar);
	cr_assert_lt(up1 - up0, 1 * MiB, "%" PRIu64 " bytes uploaded for 4 KiB of data",
		     up1 - up0);
	cr_assert_lt((uint64_t)(d1.m.rss_kb - d0.m.rss_kb) * KiB, rss_allowance(64 * MiB),
		     "ferry-mountd grew by %ld KiB for a 1 TiB sparse file",
		     d1.m.rss_kb - d0.m.rss_kb);

	/* Read-only opens from here: while a cached-mode (daemon path) writer
	 * is open, ferryfs counts the whole file as data for SEEK_DATA and
	 * SEEK_HOLE (allowed; README), which would hide the holes. */
	mfd = OK(open(mp("sparse"), O_RDONLY | O_CLOEXEC));
	same_windows(mfd, rfd, "1 TiB sparse, committed");
	seek_walk(mfd, (off_t)SPARSE_SIZE, &xm, "ferryfs, committed");
	extents_cover(&xm, at, len, 3, "ferryfs, committed");
	log_extents("ferryfs committed", &xm);
	/* Holes are reported as holes, not the whole TiB as data, except on a
	 * mount with the writeback cache, where the kernel answers SEEK_DATA
	 * and SEEK_HOLE itself (README, -o writeback) */
	expect_holes(&xm, "committed");
	close(mfd);

	/* truncate down into the middle data, then up again: the cut bytes
	 * read as zeros, as on ext4 */
	OK(truncate(sp("ref/sparse"), (off_t)MID_AT + 3));
	OK(truncate(mp("sparse"), (off_t)MID_AT + 3));
	mfd = OK(open(mp("sparse"), O_RDONLY | O_CLOEXEC));
	same_windows(mfd, rfd, "truncated to the middle");
	close(mfd);
	OK(truncate(sp("ref/sparse"), (off_t)SPARSE_SIZE));
	OK(truncate(mp("sparse"), (off_t)SPARSE_SIZE));
	mfd = OK(open(mp("sparse"), O_RDONLY | O_CLOEXEC));
	same_windows(mfd, rfd, "truncated down and up");
	{
		const off_t at2[] = { 0, (off_t)MID_AT };
		const size_t len2[] = { 17, 3 };
		seek_walk(mfd, (off_t)SPARSE_SIZE, &xm, "ferryfs, truncated down and up");
		extents_cover(&xm, at2, len2, 2, "ferryfs, truncated down and up");
		expect_holes(&xm, "truncated down and up");
	}
	close(mfd);
	wait_drained(240);

	/* from the object store and the metadata alone */
	fm_remount_cold();
	mfd = OK(open(mp("sparse"), O_RDONLY | O_CLOEXEC));
	{
		struct stat st;
		OK(fstat(mfd, &st));
		cr_assert_eq((uint64_t)st.st_size, SPARSE_SIZE);
	}
	same_windows(mfd, rfd, "after a cold remount");
	{
		const off_t at2[] = { 0, (off_t)MID_AT };
		const size_t len2[] = { 17, 3 };
		seek_walk(mfd, (off_t)SPARSE_SIZE, &xm, "ferryfs, after a cold remount");
		extents_cover(&xm, at2, len2, 2, "ferryfs, after a cold remount");
	}
	close(mfd);
	close(rfd);
	sample("sparse, after a cold remount", &d2);
	OK(unlink(sp("ref/sparse")));
}

/* The largest file size a filesystem takes: ftruncate probes on fd. */
static off_t max_size_of(int fd)
{
	off_t lo = (off_t)TiB, hi = INT64_MAX; /* lo works, hi does not */

	OK(ftruncate(fd, lo));
	FAILS(ftruncate(fd, hi), EFBIG);
	while (hi - lo > 1) {
		off_t mid = lo + (hi - lo) / 2;

		if (ftruncate(fd, mid) == 0) {
			lo = mid;
		} else {
			cr_assert_eq(errno, EFBIG, "ftruncate(%lld): %s", (long long)mid,
				     strerror(errno));
			hi = mid;
		}
	}
	OK(ftruncate(fd, 0));
	return lo;
}

/*
 * ferryfs's largest file: every write lands in a staging file first (both
 * write paths), so the filesystem that holds the staging directory bounds
 * it (ext4 with 4 KiB blocks: 16 TiB - 4 KiB, its s_maxbytes). Behind that,
 * the metadata takes sizes up to META_CHUNK_SIZE << 32 (2^58, chunk indexes
 * are 32 bits) and a reconcile job up to RECONCILE_LENGTH_MAX (2^44).
 * statfs and FUSE's INIT carry no size limit (the kernel's FUSE superblock
 * has s_maxbytes = MAX_LFS_FILESIZE), so the staging filesystem's EFBIG is
 * what an application sees. The staging directory is in the scratch
 * directory, on the same filesystem as the reference file. Through the
 * writeback cache (-o writeback, on mounts without passthrough) the page
 * cache takes a write past it, so the write-back fails instead, and the
 * README promises that fsync() and close() report that. This test found
 * them returning 0 and the byte gone after a remount (the short write-back
 * was replied as success); a short write-back is now a failed one.
 */
Test(limits, max_file_size)
{
	int rfd, mfd;
	off_t max;
	char c;

	ref_dir();
	rfd = OK(open(sp("ref/max"), O_CREAT | O_RDWR | O_CLOEXEC, 0644));
	max = max_size_of(rfd);
	cr_log_info("largest file on the staging filesystem (the oracle): %lld bytes; ferryfs's "
		    "metadata takes %llu, a reconcile job %llu", (long long)max,
		    (unsigned long long)META_CHUNK_SIZE << 32,
		    (unsigned long long)RECONCILE_LENGTH_MAX);
	mfd = OK(open(mp("max"), O_CREAT | O_RDWR | O_CLOEXEC, 0644));
	/* the last byte there can be */
	cr_assert_eq(pwrite(rfd, "Z", 1, max - 1), 1);
	cr_assert_eq(pwrite(mfd, "Z", 1, max - 1), 1, "pwrite of the last byte (%lld): %s",
		     (long long)(max - 1), strerror(errno));
	/* past it */
	FAILS(pwrite(rfd, "Y", 1, max), EFBIG);
	if (!writeback_cache()) {
		FAILS(pwrite(mfd, "Y", 1, max), EFBIG);
		FAILS(pwrite(mfd, "Y", 1, (off_t)((uint64_t)META_CHUNK_SIZE << 32)), EFBIG);
		FAILS(pwrite(mfd, "Y", 1, INT64_MAX - 1), EFBIG);
	} else {
		/* With the writeback cache the page cache takes the byte (FUSE's
		 * superblock allows MAX_LFS_FILESIZE); the write-back that the
		 * staging file refuses must then be reported, by fsync() and
		 * close() (README, -o writeback), not dropped. */
		ssize_t r = pwrite(mfd, "Y", 1, max);
		int e = r < 0 ? errno : 0;

		if (r < 0) {
			cr_assert_eq(e, EFBIG, "pwrite at %lld: %s", (long long)max, fm_errname(e));
		} else {
			e = ERR_OF(fsync(mfd));
			cr_log_info("writeback cache: pwrite at the largest size returned %zd, then "
				    "fsync %s", r, fm_errname(e));
			cr_assert(e != 0, "writeback cache: a byte written at %lld (past the "
				  "largest file: ext4 says EFBIG) was taken and fsync() returned 0; "
				  "the write-back came back short and the byte is gone after a "
				  "remount", (long long)max);
			OK(ftruncate(mfd, max));
		}
	}
	{
		struct stat st;
		OK(fstat(mfd, &st));
		cr_assert_eq(st.st_size, max, "size after the refused writes: %lld",
			     (long long)st.st_size);
	}
	FAILS(ftruncate(rfd, max + 1), EFBIG);
	FAILS(ftruncate(mfd, max + 1), EFBIG);

	OK(close(mfd));
	wait_drained(120);
	fm_remount_cold();
	{
		/* On the daemon path the refused size is applied all the same
		 * (see truncate_past_max_file_size) */
		struct stat st;
		bool pt = passthrough_active();
		OK(stat(mp("max"), &st));
		cr_assert(st.st_size == max, "ftruncate(%lld) answered EFBIG, yet after a remount "
			  "the file is %lld bytes (passthrough %s)", (long long)(max + 1),
			  (long long)st.st_size, pt ? "active" : "off");
		if (st.st_size != max)
			OK(truncate(mp("max"), max));
	}
	mfd = OK(open(mp("max"), O_RDONLY | O_CLOEXEC));
	{
		struct stat st;
		OK(fstat(mfd, &st));
		cr_assert_eq(st.st_size, max, "size after a cold remount: %lld",
			     (long long)st.st_size);
	}
	cr_assert_eq(pread(mfd, &c, 1, max - 1), 1);
	cr_assert_eq(c, 'Z');
	cr_assert_eq(pread(mfd, &c, 1, max - 2), 1);
	cr_assert_eq(c, 0);
	cr_assert_eq(pread(mfd, &c, 1, max), 0);
	close(mfd);
	close(rfd);
	OK(unlink(sp("ref/max")));
}

/*
 * Sizes past the largest file. On ext4 truncate(2) and ftruncate(2) to
 * 2^50 fail with EFBIG and change nothing. This test found ferryfs taking
 * truncate(path, 2^50) of a closed file (only the metadata's 2^58 bound was
 * checked), and answering EFBIG to an ftruncate(2^50) on the daemon path
 * after the metadata had changed (its next writers' close() then failed);
 * ferry-mountd now refuses any size past the staging filesystem's largest
 * file (.stats max_file_size) before anything changes.
 */
Test(limits, truncate_past_max_file_size)
{
	const off_t huge = (off_t)1 << 50;
	struct stat st;
	int fd, e;

	ref_dir();
	fm_write_file(sp("ref/t"), "x", 1);
	fm_write_file(mp("t"), "x", 1);
	wait_drained(120);

	/* through a handle of an existing file (the daemon path) */
	fd = OK(open(sp("ref/t"), O_WRONLY | O_CLOEXEC));
	cr_assert_eq(pwrite(fd, "y", 1, 1), 1);
	FAILS(ftruncate(fd, huge), EFBIG);
	OK(close(fd));
	OK(stat(sp("ref/t"), &st));
	cr_assert_eq(st.st_size, 2, "ext4: size %lld", (long long)st.st_size);

	fd = OK(open(mp("t"), O_WRONLY | O_CLOEXEC));
	cr_assert_eq(pwrite(fd, "y", 1, 1), 1);
	FAILS(ftruncate(fd, huge), EFBIG);
	OK(fstat(fd, &st));
	cr_assert(st.st_size == 2, "ftruncate(2^50) of a daemon-path handle answered EFBIG but "
		  "fstat says %lld bytes (ext4: 2)", (long long)st.st_size);
	e = ERR_OF(close(fd));
	cr_assert(e == 0, "close() after the refused ftruncate: %s", fm_errname(e));
	wait_drained(120);
	OK(stat(mp("t"), &st));
	cr_assert(st.st_size == 2, "after a refused ftruncate(2^50) and close, the file is %lld "
		  "bytes (ext4: 2)", (long long)st.st_size);
	fm_expect_content(sp("ref/t"), "xy", 2);
	if (st.st_size != 2)
		OK(truncate(mp("t"), 2));
	fm_expect_content(mp("t"), "xy", 2);

	/* by path, on a closed file */
	FAILS(truncate(sp("ref/t"), huge), EFBIG);
	e = ERR_OF(truncate(mp("t"), huge));
	cr_assert(e == EFBIG, "truncate(path, 2^50) of a closed file: %s (ext4: EFBIG)",
		  fm_errname(e));
	if (e == 0) {
		/* what such a file does to its next writer */
		fd = OK(open(mp("t"), O_WRONLY | O_CLOEXEC));
		cr_assert_eq(pwrite(fd, "z", 1, 0), 1);
		e = ERR_OF(close(fd));
		cr_assert(e == 0, "close() of a writer of a 2^50-byte file: %s", fm_errname(e));
		wait_drained(120);
		fd = OK(open(mp("t"), O_RDONLY | O_CLOEXEC));
		{
			char c = 0;
			cr_assert_eq(pread(fd, &c, 1, 0), 1);
			cr_assert_eq(c, 'z', "the byte written before that close() is %d", c);
		}
		close(fd);
	}
	OK(stat(mp("t"), &st));
	cr_log_info("truncate past the largest file: ferryfs leaves t at %lld bytes (ext4: 2)",
		    (long long)st.st_size);
}

/*
 * fsync (fsync=remote, the default) of a passthrough file that is mostly
 * holes. This test found ferry-mountd fingerprinting the whole apparent
 * size (a 1 TiB sparse file with 15 bytes of data took 850 s, VmHWM 36 ->
 * 317 MB, the inode locked), a zero slice per block, and the close() after
 * it handing the reconciler the whole file, which uploaded every hole as
 * zeros (70 GB of objects in two minutes). Now holes are not read and
 * only changed units go; the file is FERRY_LIMITS_SPARSE_FSYNC_GIB
 * (default 1) GiB. (The fingerprints of a file that was fsynced still take
 * 16 bytes per 64 KiB of its size.)
 */
Test(limits, fsync_of_a_sparse_file)
{
	uint64_t size = env_u64("FERRY_LIMITS_SPARSE_FSYNC_GIB", 1) * GiB;
	struct daemons d0, d1, d2;
	uint64_t up0, up1, up2;
	double t0, t_fsync;
	int fd;

	sample("sparse fsync, before", &d0);
	up0 = stat_now("reconcile_upload_bytes_total") + stat_now("bytes_uploaded");
	fd = OK(open(mp("fs"), O_CREAT | O_RDWR | O_CLOEXEC, 0644));
	fm_pwrite_all(fd, "head", 4, 0);
	fm_pwrite_all(fd, "middle", 6, (off_t)(size / 2));
	fm_pwrite_all(fd, "tail", 4, (off_t)(size - 4));
	t0 = now_s();
	OK(fsync(fd));
	t_fsync = now_s() - t0;
	sample("sparse fsync, after fsync", &d1);
	OK(close(fd));
	wait_released(240);
	sample("sparse fsync, committed", &d2);
	up1 = stat_now("reconcile_upload_bytes_total") + stat_now("bytes_uploaded");
	(void)up1;
	up2 = up1 - up0;
	cr_log_info("fsync of a %llu MiB sparse file (passthrough %s) with 14 bytes of "
		    "data: %.3f s, ferry-mountd read %llu bytes; after close %" PRIu64
		    " bytes uploaded, ferry-reconciler read %llu", (unsigned long long)(size / MiB),
		    passthrough_active() ? "active" : "off", t_fsync, d1.m.rchar - d0.m.rchar,
		    up2, d2.r.pid == d0.r.pid ? d2.r.rchar - d0.r.rchar : 0ULL);
	cr_assert(d1.m.rchar - d0.m.rchar < 64 * MiB,
		  "fsync of a %llu MiB sparse file with 14 bytes of data made ferry-mountd "
		  "read %llu bytes (every hole)", (unsigned long long)(size / MiB), d1.m.rchar - d0.m.rchar);
	cr_assert(up2 < 1 * MiB,
		  "after fsync and close of a %llu MiB sparse file with 14 bytes of data, "
		  "%" PRIu64 " bytes were uploaded (its holes, as zeros)",
		  (unsigned long long)(size / MiB), up2);
	fm_remount_cold();
	{
		char b[8] = { 0 };
		fd = OK(open(mp("fs"), O_RDONLY | O_CLOEXEC));
		fm_pread_all(fd, b, 6, (off_t)(size / 2));
		cr_assert(memcmp(b, "middle", 6) == 0);
		fm_pread_all(fd, b, 4, (off_t)(size - 4));
		cr_assert(memcmp(b, "tail", 4) == 0);
		close(fd);
	}
}

/* ---- 5. many open files --------------------------------------------------- */

/* Errors an application may honestly see when a daemon runs out of fds. */
static bool honest_errno(int e)
{
	return e == EMFILE || e == ENFILE || e == ENOSPC || e == EIO || e == ENOMEM;
}

/* Per-file outcomes, shared with the worker processes. */
struct many {
	int n;
	bool all_written;                         /* else the even half */
	int *open_e, *write_e, *read_e, *close_e; /* errno, 0, or -1: not tried */
};

static void many_name(char *buf, size_t cap, int i)
{
	if ((size_t)snprintf(buf, cap, "%s/many/f%06d", fm.mnt, i) >= cap)
		abort(); /* fm.mnt is a short path in /tmp */
}

static int many_text(char *buf, size_t cap, int i, bool written)
{
	return snprintf(buf, cap, "%s file %d of the many-open-files test\n",
			written ? "written" : "read-only", i);
}

/*
 * A worker: opens files [lo, hi) (even ones created and written, odd ones
 * prepared beforehand and read), says so on ready, waits for a byte on go,
 * closes them all. Outcomes go to m; it calls no Criterion function.
 */
static void many_worker(struct many *m, int lo, int hi, int ready, int go)
{
	int *fds = malloc(sizeof(int) * (size_t)(hi - lo));
	char path[PATH_MAX], text[128], back[128];
	char c = 'r';

	if (!fds)
		_exit(3);
	for (int i = lo; i < hi; i++) {
		bool w = i % 2 == 0;
		int fd, len = many_text(text, sizeof(text), i, w);

		many_name(path, sizeof(path), i);
		fd = w ? open(path, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0644)
		       : open(path, O_RDONLY | O_CLOEXEC);
		fds[i - lo] = fd;
		m->open_e[i] = fd < 0 ? errno : 0;
		if (fd < 0)
			continue;
		if (w) {
			ssize_t n = write(fd, text, (size_t)len);
			m->write_e[i] = n == len ? 0 : n < 0 ? errno : EIO;
		} else {
			ssize_t n = pread(fd, back, sizeof(back), 0);
			m->read_e[i] = n < 0 ? errno : n == len && !memcmp(back, text, (size_t)len)
							? 0 : EBADMSG;
		}
	}
	if (write(ready, &c, 1) != 1 || read(go, &c, 1) != 1)
		_exit(4);
	for (int i = lo; i < hi; i++) {
		if (fds[i - lo] < 0)
			continue;
		m->close_e[i] = close(fds[i - lo]) == 0 ? 0 : errno;
	}
	_exit(0);
}

static int *shared_ints(size_t n, int fill)
{
	int *p = mmap(NULL, n * sizeof(int), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
		      -1, 0);

	cr_assert(p != MAP_FAILED, "mmap: %s", strerror(errno));
	for (size_t i = 0; i < n; i++)
		p[i] = fill;
	return p;
}

static void many_init(struct many *m, int n)
{
	m->n = n;
	m->all_written = false;
	m->open_e = shared_ints((size_t)n, -1);
	m->write_e = shared_ints((size_t)n, -1);
	m->read_e = shared_ints((size_t)n, -1);
	m->close_e = shared_ints((size_t)n, -1);
}

static void many_free(struct many *m)
{
	munmap(m->open_e, (size_t)m->n * sizeof(int));
	munmap(m->write_e, (size_t)m->n * sizeof(int));
	munmap(m->read_e, (size_t)m->n * sizeof(int));
	munmap(m->close_e, (size_t)m->n * sizeof(int));
}

/* Raises this process's soft RLIMIT_NOFILE to its hard limit (all a
 * process without CAP_SYS_RESOURCE may do; /proc/sys/fs/nr_open bounds the
 * hard limit of those that have it). Returns the limit. */
static long raise_nofile(void)
{
	struct rlimit rl;

	OK(getrlimit(RLIMIT_NOFILE, &rl));
	if (rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		OK(setrlimit(RLIMIT_NOFILE, &rl));
	}
	return rl.rlim_cur > (rlim_t)LONG_MAX ? LONG_MAX : (long)rl.rlim_cur;
}

/* Sets pid's soft RLIMIT_NOFILE (the hard one stays: it can be restored). */
static void set_nofile_soft(pid_t pid, long soft)
{
	struct rlimit old, rl;

	OK(prlimit(pid, RLIMIT_NOFILE, NULL, &old));
	rl.rlim_cur = (rlim_t)soft > old.rlim_max ? old.rlim_max : (rlim_t)soft;
	rl.rlim_max = old.rlim_max;
	OK(prlimit(pid, RLIMIT_NOFILE, &rl, NULL));
}

struct many_counts {
	int open_fail, write_fail, read_fail, close_fail, intact;
	int by_errno[160];
};

static void count_outcome(struct many_counts *c, int e, int *what)
{
	if (e > 0) {
		(*what)++;
		if (e < 160)
			c->by_errno[e]++;
	}
}

/*
 * Runs the whole open/write/close round with n files over as many worker
 * processes as this process's fd limit needs; the odd files are made
 * beforehand with their content. Samples the daemons while all are open.
 */
static void many_round(struct many *m, int n, struct daemons *open_sample)
{
	long lim = raise_nofile();
	int per = (int)(lim - 64 < 50000 ? lim - 64 : 50000), nw = (n + per - 1) / per;
	pid_t *pids = calloc((size_t)nw, sizeof(pid_t));
	int *go = calloc((size_t)nw, sizeof(int)), ready[2];
	char path[PATH_MAX], text[128];
	double t0 = now_s();

	cr_assert(pids && go && per > 0);
	OK(mkdir(mp("many"), 0755));
	for (int i = 1; i < n; i += 2) {
		many_name(path, sizeof(path), i);
		fm_write_file(path, text, (size_t)many_text(text, sizeof(text), i, false));
	}
	wait_released(240);
	cr_log_info("many open files: %d files prepared in %.1f s; %d worker process(es) of at "
		    "most %d fds each (RLIMIT_NOFILE %ld)", n / 2, now_s() - t0, nw, per, lim);
	OK(pipe2(ready, O_CLOEXEC));
	t0 = now_s();
	for (int w = 0; w < nw; w++) {
		int g[2];

		OK(pipe2(g, O_CLOEXEC));
		pids[w] = fork();
		cr_assert(pids[w] >= 0, "fork: %s", strerror(errno));
		if (pids[w] == 0) {
			close(ready[0]);
			close(g[1]);
			many_worker(m, w * per, (w + 1) * per < n ? (w + 1) * per : n, ready[1], g[0]);
		}
		close(g[0]);
		go[w] = g[1];
	}
	close(ready[1]);
	for (int w = 0; w < nw; w++) {
		char c;
		cr_assert_eq(read(ready[0], &c, 1), 1, "a worker died before it had its files open");
	}
	cr_log_info("many open files: %d open at once after %.1f s", n, now_s() - t0);
	sample("many open files, all open", open_sample);
	t0 = now_s();
	for (int w = 0; w < nw; w++) {
		OK(write(go[w], "g", 1));
		close(go[w]);
	}
	for (int w = 0; w < nw; w++) {
		int st;
		OK(waitpid(pids[w], &st, 0));
		cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "worker %d: status 0x%x", w, st);
	}
	close(ready[0]);
	cr_log_info("many open files: all closed in %.1f s", now_s() - t0);
	wait_released(300);
	free(pids);
	free(go);
}

/* Tallies the outcomes; checks that every error is an honest one and that
 * every written file whose write and close returned 0 holds its bytes. */
static void many_check(const struct many *m, struct many_counts *c, const char *when)
{
	char path[PATH_MAX], text[128];

	memset(c, 0, sizeof(*c));
	for (int i = 0; i < m->n; i++) {
		count_outcome(c, m->open_e[i], &c->open_fail);
		count_outcome(c, m->write_e[i], &c->write_fail);
		count_outcome(c, m->read_e[i], &c->read_fail);
		count_outcome(c, m->close_e[i], &c->close_fail);
		cr_assert(m->open_e[i] <= 0 || honest_errno(m->open_e[i]),
			  "open of file %d: %s", i, fm_errname(m->open_e[i]));
		cr_assert(m->write_e[i] <= 0 || honest_errno(m->write_e[i]),
			  "write of file %d: %s", i, fm_errname(m->write_e[i]));
		cr_assert(m->read_e[i] <= 0 || honest_errno(m->read_e[i]),
			  "read of file %d: %s", i, fm_errname(m->read_e[i]));
		cr_assert(m->close_e[i] <= 0 || honest_errno(m->close_e[i]),
			  "close of file %d: %s", i, fm_errname(m->close_e[i]));
		if ((m->all_written || i % 2 == 0) && m->open_e[i] == 0 && m->write_e[i] == 0 &&
		    m->close_e[i] == 0) {
			int len = many_text(text, sizeof(text), i, true);
			many_name(path, sizeof(path), i);
			fm_expect_content(path, text, (size_t)len);
			c->intact++;
		}
	}
	cr_log_info("many open files (%s): %d files; failed: %d opens, %d writes, %d reads, "
		    "%d closes (EMFILE %d, ENFILE %d, EIO %d, ENOSPC %d, ENOMEM %d); %d written "
		    "files closed with 0 and intact", when, m->n, c->open_fail, c->write_fail,
		    c->read_fail, c->close_fail, c->by_errno[EMFILE], c->by_errno[ENFILE],
		    c->by_errno[EIO], c->by_errno[ENOSPC], c->by_errno[ENOMEM], c->intact);
}

static uint64_t grown(long before_kb, long after_kb)
{
	return after_kb > before_kb ? (uint64_t)(after_kb - before_kb) * KiB : 0;
}

/* A new file created, written and closed, and the root listed: 0 or the
 * first errno. */
static int probe_write(void)
{
	int fd, e;
	DIR *d;

	fd = open(mp("probe"), O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0644);
	if (fd < 0)
		return errno;
	e = write(fd, "probe", 5) == 5 ? 0 : errno ? errno : EIO;
	if (close(fd) != 0 && !e)
		e = errno;
	if (e)
		return e;
	d = opendir(fm.mnt);
	if (!d)
		return errno;
	closedir(d);
	return 0;
}

/* Waits until pid holds at most max fds (a liveness bound: limit_s is far
 * beyond need), then asserts it. */
static void wait_fds_back(pid_t pid, long max, int limit_s)
{
	double until = now_s() + limit_s;
	long n;

	while ((n = count_fds(pid)) > max && now_s() < until)
		usleep(50000);
	cr_assert_leq(n, max, "process %d still holds %ld fds %d s after its work was done "
		      "(bound %ld)", (int)pid, n, limit_s, max);
}

/*
 * FERRY_LIMITS_OPEN_FILES files (default 20000; the benchmark runs
 * 100000) open at once, half created and written (each holds a staging
 * file, one fd, in ferry-mountd until its close is handed to the
 * reconciler), half read. ferry-mountd gets the room a service manager's
 * LimitNOFILE would give it (its soft limit raised to its hard limit, all
 * a process may do without CAP_SYS_RESOURCE); if even that is short of one
 * fd per written file, the round is cut to fit and says so
 * (daemon_out_of_fds is the test of a daemon without room). Bounds: one fd
 * per written file plus 256 (and the read cache's CACHE_KEPT_FDS) while
 * open; back within FD_SLACK_READS of the start after the uploads; RSS growth at most 64 MiB + 8 KiB per open file
 * (measured: about 0.9 KiB).
 */
Test(limits, many_open_files, .timeout = 600)
{
	int n = (int)env_u64("FERRY_LIMITS_OPEN_FILES", ASAN_BUILD ? 4000 : 20000);
	struct daemons d0, d_open, d1;
	struct many m;
	struct many_counts c;
	pid_t md = mountd_pid();
	long room;

	n += n % 2;
	sample("many open files, before", &d0);
	set_nofile_soft(md, d0.m.nofile_hard);
	psample(md, &d0.m);
	room = d0.m.nofile_soft - d0.m.fds - 512;
	if (room < n / 2) {
		cr_log_info("many open files: ferry-mountd's RLIMIT_NOFILE is %ld (hard %ld): room "
			    "for %ld written files, not %d; the round is cut to %ld files",
			    d0.m.nofile_soft, d0.m.nofile_hard, room, n / 2, 2 * room);
		n = (int)(2 * room);
	}
	many_init(&m, n);
	many_round(&m, n, &d_open);
	wait_fds_back(md, d0.m.fds + FD_SLACK_READS, 120);
	sample("many open files, closed and committed", &d1);
	many_check(&m, &c, "with room");
	cr_assert_eq(c.open_fail + c.write_fail + c.read_fail + c.close_fail, 0,
		     "ferry-mountd had room for every file, yet calls failed");
	cr_assert_eq(c.intact, n / 2);
	cr_assert_leq(d_open.m.fds, d0.m.fds + n / 2 + 256 + CACHE_KEPT_FDS,
		      "ferry-mountd held %ld fds with %d files open (%d written), %ld before",
		      d_open.m.fds, n, n / 2, d0.m.fds);
	cr_assert_leq(d1.m.fds, d0.m.fds + FD_SLACK_READS,
		      "ferry-mountd holds %ld fds after every file was closed and committed, %ld "
		      "before", d1.m.fds, d0.m.fds);
	if (d1.r.pid && d1.r.pid == d0.r.pid)
		cr_assert_leq(d1.r.fds, d0.r.fds + FD_SLACK,
			      "ferry-reconciler holds %ld fds after everything was committed, %ld "
			      "before", d1.r.fds, d0.r.fds);
	cr_assert_leq(grown(d0.m.rss_kb, d_open.m.rss_kb),
		      rss_allowance(64 * MiB + (uint64_t)n * 8 * KiB),
		      "ferry-mountd grew by %" PRIu64 " KiB with %d files open",
		      grown(d0.m.rss_kb, d_open.m.rss_kb) / KiB, n);
	cr_log_info("many open files: ferry-mountd %ld -> %ld -> %ld fds, RSS %ld -> %ld -> %ld "
		    "KiB (%.2f KiB per open file); ferry-reconciler %ld -> %ld -> %ld fds",
		    d0.m.fds, d_open.m.fds, d1.m.fds, d0.m.rss_kb, d_open.m.rss_kb, d1.m.rss_kb,
		    (double)(d_open.m.rss_kb - d0.m.rss_kb) / n, d0.r.fds, d_open.r.fds, d1.r.fds);
	fm_remount_cold();
	many_check(&m, &c, "after a cold remount");
	many_free(&m);
}

/*
 * ferry-mountd out of fds: its soft RLIMIT_NOFILE is set to 200 above what
 * it holds, then 1000 files are created and written and kept open at once.
 * What the application must see: honest errors (EMFILE, ENFILE, ENOSPC,
 * EIO, ENOMEM), no crash, every file whose write and close returned 0
 * intact (after the limit is restored and after a cold remount), and the
 * daemon back to its fds once the files are closed.
 *
 * This test found a daemon that did not come back by itself: closed files
 * whose hand-off and commit failed for want of an fd stayed on the retry
 * list with their staging files open, and every retry needed another fd,
 * so it stayed at its limit for good (EIO to opendir, create, .stats).
 * Now a file that fails a retry gives its fd back until the next try, and
 * the retry hands the file to the reconciler first (one fd for its
 * record, and the staging file's comes back).
 */
Test(limits, daemon_out_of_fds, .timeout = 300)
{
	const int n = 1000, headroom = 200;
	struct daemons d0, d1, d2;
	struct many m;
	struct many_counts c;
	pid_t md = mountd_pid();
	long soft0;
	int probe_e = -1;
	double until;

	sample("out of fds, before", &d0);
	soft0 = d0.m.nofile_soft;
	lowered_pid = md;
	lowered_soft = soft0;
	set_nofile_soft(md, d0.m.fds + headroom);
	cr_log_info("out of fds: ferry-mountd's soft RLIMIT_NOFILE lowered from %ld to %ld (%d "
		    "above the %ld it holds); %d files to write", soft0, d0.m.fds + headroom,
		    headroom, d0.m.fds, n);
	many_init(&m, n);
	m.all_written = true;
	{
		int *fds = malloc(sizeof(int) * (size_t)n);
		char path[PATH_MAX], text[128];

		cr_assert(fds);
		raise_nofile();
		OK(mkdir(mp("many"), 0755));
		for (int i = 0; i < n; i++) {
			int len = many_text(text, sizeof(text), i, true);
			ssize_t w;

			many_name(path, sizeof(path), i);
			fds[i] = open(path, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0644);
			m.open_e[i] = fds[i] < 0 ? errno : 0;
			if (fds[i] < 0)
				continue;
			w = write(fds[i], text, (size_t)len);
			m.write_e[i] = w == len ? 0 : w < 0 ? errno : EIO;
		}
		cr_assert(pid_alive(md), "ferry-mountd died while files were opened");
		sample("out of fds, all open", &d1);
		for (int i = 0; i < n; i++)
			if (fds[i] >= 0)
				m.close_e[i] = close(fds[i]) == 0 ? 0 : errno;
		free(fds);
	}
	cr_assert(pid_alive(md), "ferry-mountd died when the files were closed");
	/* The files are closed: the daemon must come back down to its fds and
	 * take new writes, still under the lowered limit. */
	until = now_s() + 30;
	for (;;) {
		probe_e = probe_write();
		psample(md, &d2.m);
		if ((probe_e == 0 && d2.m.fds <= d0.m.fds + FD_SLACK) || now_s() > until)
			break;
		usleep(200000);
	}
	sample("out of fds, up to 30 s after the closes, limit still lowered", &d2);
	/* the limit back first (a wedged daemon could not even be unmounted),
	 * then the verdict */
	set_nofile_soft(md, soft0);
	lowered_pid = 0;
	cr_assert(probe_e == 0 && d2.m.fds <= d0.m.fds + FD_SLACK,
		  "ferry-mountd stays at its fd limit after every file was closed: %ld fds (%ld "
		  "before); a new file's create+write+close+opendir fails with %s",
		  d2.m.fds, d0.m.fds, fm_errname(probe_e));

	/* whatever is pending commits now, and nothing is lost */
	wait_drained(240);
	wait_fds_back(md, d0.m.fds + FD_SLACK, 120);
	cr_assert(pid_alive(md), "ferry-mountd died");
	cr_assert_eq(mountd_pid(), md, "ferry-mountd was replaced");
	sample("out of fds, limit restored and drained", &d2);
	cr_assert_eq(probe_write(), 0, "the mount does not take a new file after the limit was "
		     "restored");
	many_check(&m, &c, "daemon out of fds");
	cr_log_info("out of fds: ferry-mountd held %ld fds with %d files open (limit %ld)",
		    d1.m.fds, n, d0.m.fds + headroom);
	fm_remount_cold();
	many_check(&m, &c, "daemon out of fds, after a cold remount");
	many_free(&m);
}

/* ferry-reconciler stopped (stuck, or holding its most jobs: it reads no
 * hand-off) while ferry-mountd is under a low RLIMIT_NOFILE. Each close
 * then found no room for its hand-off and waited for some with its staging
 * file open, while the writer went on creating files: ferry-mountd's fd
 * table filled, and creates failed with EMFILE (2,448 of 3,000 under a
 * limit of 512, some with EIO) from a writer that held one file at a time.
 * Now, short of fds, a close leaves its file on the retry list with the fd
 * closed; the writer sees no error, and once the reconciler goes on, the
 * drain commits everything and every file reads back. */
/* Lines of ferry-mountd's log past its first `from` bytes that contain
 * what; *end (if given) is the log's length now. */
static unsigned log_lines_since(size_t from, const char *what, size_t *end)
{
	char *log = fm_slurp(fm_mountd_log_path());
	unsigned n = 0;
	size_t len = log ? strlen(log) : 0;

	if (end)
		*end = len;
	for (const char *p = log && from < len ? log + from : ""; *what && (p = strstr(p, what));
	     p++)
		n++;
	free(log);
	return n;
}

Test(limits, a_stopped_reconciler_under_a_low_fd_limit, .timeout = 300)
{
	const int n = 2000, headroom = 220;
	struct daemons d0;
	pid_t md = mountd_pid(), rp = fm_reconciler_pid();
	int open_fail = 0, write_fail = 0, close_fail = 0, first_e = 0;
	char path[PATH_MAX + 32], text[64], got[64];
	/* (Bounded: a drain that never ended would outlive the test.) */
	const char *argv[] = { fm_bin("ferry"), "drain", "--timeout", "240", fm.mnt, NULL };
	struct fm_stats st;
	size_t log_at = 0;

	(void)log_lines_since(0, "", &log_at);
	sample("stopped reconciler, before", &d0);
	lowered_pid = md;
	lowered_soft = d0.m.nofile_soft;
	set_nofile_soft(md, d0.m.fds + headroom);
	OK(mkdir(mp("one_by_one"), 0755));
	stopped_pid = rp;
	OK(kill(rp, SIGSTOP));
	for (int i = 0; i < n; i++) {
		int len = snprintf(text, sizeof(text), "file %d of a stopped reconciler\n", i);
		int fd;

		snprintf(path, sizeof(path), "%s/one_by_one/%d", fm.mnt, i);
		fd = open(path, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0644);
		if (fd < 0) {
			first_e = first_e ? first_e : errno;
			open_fail++;
			continue;
		}
		if (write(fd, text, (size_t)len) != len) {
			first_e = first_e ? first_e : errno;
			write_fail++;
		}
		if (close(fd) != 0) {
			first_e = first_e ? first_e : errno;
			close_fail++;
		}
	}
	uint64_t scarce = 0;
	fm_stats_read(&st);
	(void)fm_stats_get(&st, "handoff_fd_scarce", &scarce); /* asserted below */
	/* A drain asked now counts every file closed: the ones the stopped
	 * reconciler holds, and those on the retry list, whose commits here
	 * may have failed for want of fds (they are retried: not a failure
	 * of the drain once they succeed). */
	pid_t drain = fork();
	cr_assert(drain >= 0);
	if (drain == 0) {
		execv(argv[0], (char *const *)argv);
		_exit(127);
	}
	usleep(500 * 1000);
	OK(kill(rp, SIGCONT));
	stopped_pid = 0;
	int drain_status = 0;
	cr_assert_eq(waitpid(drain, &drain_status, 0), drain);
	cr_assert(pid_alive(md), "ferry-mountd died");
	cr_assert_eq(open_fail + write_fail + close_fail, 0,
		     "with the reconciler stopped and %d fds to spare, %d creates, %d writes and "
		     "%d closes of %d failed (the first with %s)", headroom, open_fail, write_fail,
		     close_fail, n, fm_errname(first_e));
	cr_assert_gt(scarce, 0, "ferry-mountd never ran short of fds: this test proves nothing "
		     "(lower the headroom)");
	cr_assert(WIFEXITED(drain_status) && WEXITSTATUS(drain_status) == 0,
		  "ferry drain, asked while the reconciler was stopped, failed (status %#x)",
		  drain_status);
	wait_drained(240);
	/* Commits tried on the retry list while fds were short failed alike;
	 * each round says so a few times, not once per file. */
	unsigned warnings = log_lines_since(log_at, " warning: ", NULL);
	cr_log_info("%u warnings in ferry-mountd's log for %d files closed behind a stopped "
		    "reconciler", warnings, n);
	cr_assert_leq(warnings, 30, "%u warnings in ferry-mountd's log for %d files", warnings, n);
	set_nofile_soft(md, lowered_soft);
	lowered_pid = 0;
	fm_remount_cold();
	for (int i = 0; i < n; i++) {
		int len = snprintf(text, sizeof(text), "file %d of a stopped reconciler\n", i);
		int fd;
		ssize_t r;

		snprintf(path, sizeof(path), "%s/one_by_one/%d", fm.mnt, i);
		fd = open(path, O_RDONLY | O_CLOEXEC);
		cr_assert(fd >= 0, "%s: %s", path, strerror(errno));
		r = read(fd, got, sizeof(got));
		close(fd);
		cr_assert(r == len && memcmp(got, text, (size_t)len) == 0,
			  "%s reads back %zd bytes, not what was written", path, r);
	}
}

/* ---- 6. a big directory --------------------------------------------------- */

static const char dir_fill[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
			       "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";

/* Original entry i: 7 digits, a dot, and 0..96 filler bytes. */
static void dir_name(char *buf, size_t cap, unsigned i)
{
	snprintf(buf, cap, "%07u.%.*s", i, (int)(i % 97), dir_fill);
}

enum { CAT_ORIG, CAT_NEW, CAT_CHURN, CAT_LATE, NCAT };
#define EXTRA_MAX 20000u

struct listing {
	unsigned n;
	unsigned char *count[NCAT]; /* times each name was listed */
	unsigned char *gone;        /* originals unlinked during the listing */
	unsigned n_new, n_late;     /* made during the listing, kept */
	unsigned entries;           /* names listed, . and .. apart */
};

static void listing_init(struct listing *L, unsigned n)
{
	memset(L, 0, sizeof(*L));
	L->n = n;
	L->count[CAT_ORIG] = calloc(n, 1);
	for (int c = CAT_NEW; c < NCAT; c++)
		L->count[c] = calloc(EXTRA_MAX, 1);
	L->gone = calloc(n, 1);
	for (int c = 0; c < NCAT; c++)
		cr_assert(L->count[c]);
	cr_assert(L->gone);
}

static void listing_reset(struct listing *L)
{
	memset(L->count[CAT_ORIG], 0, L->n);
	for (int c = CAT_NEW; c < NCAT; c++)
		memset(L->count[c], 0, EXTRA_MAX);
	L->entries = 0;
}

static void listing_free(struct listing *L)
{
	for (int c = 0; c < NCAT; c++)
		free(L->count[c]);
	free(L->gone);
}

/* Counts one listed name; asserts it is one of ours and not seen before. */
static void listing_take(struct listing *L, const char *name, const char *where)
{
	static const char prefix[NCAT] = { 0, 'n', 'c', 'l' };
	char want[160];
	unsigned i;
	int cat;

	if (strcmp(name, ".") == 0 || strcmp(name, "..") == 0)
		return;
	L->entries++;
	for (cat = CAT_NEW; cat < NCAT && name[0] != prefix[cat]; cat++)
		;
	if (cat == NCAT) {
		cat = CAT_ORIG;
		cr_assert(sscanf(name, "%7u.", &i) == 1 && i < L->n, "%s: unexpected entry '%s'",
			  where, name);
		dir_name(want, sizeof(want), i);
	} else {
		cr_assert(sscanf(name + 1, "%7u", &i) == 1 && i < EXTRA_MAX,
			  "%s: unexpected entry '%s'", where, name);
		snprintf(want, sizeof(want), "%c%07u", prefix[cat], i);
	}
	cr_assert_str_eq(name, want, "%s: entry '%s' is not a name this test made", where, name);
	cr_assert_eq(L->count[cat][i], 0, "%s: '%s' listed twice", where, name);
	L->count[cat][i]++;
}

/* What the churn thread does while the directory is listed: creates and
 * unlinks names of its own, and keeps one in four. */
struct churn {
	int dfd;
	atomic_bool stop;
	unsigned made, kept;
	int err;
	const char *what;
};

static void *churn_main(void *arg)
{
	struct churn *c = arg;
	char name[32];

	while (!atomic_load(&c->stop) && c->made < EXTRA_MAX) {
		unsigned i = c->made;

		snprintf(name, sizeof(name), "c%07u", i);
		if (mknodat(c->dfd, name, S_IFREG | 0644, 0) != 0 || unlinkat(c->dfd, name, 0) != 0) {
			c->err = errno;
			c->what = "create+unlink";
			break;
		}
		if (i % 4 == 0) {
			snprintf(name, sizeof(name), "l%07u", i / 4);
			if (mknodat(c->dfd, name, S_IFREG | 0644, 0) != 0) {
				c->err = errno;
				c->what = "create";
				break;
			}
			c->kept++;
		}
		c->made++;
	}
	return NULL;
}

/*
 * One listing of dir. Halfway, telldir/seekdir: the next 200 entries are
 * read, the stream is moved back, and the same 200 must come again. With
 * churn: after a third, one original in 97 is unlinked (listed already or
 * not) and 500 new names are made, while a thread creates and unlinks
 * names of its own the whole time.
 */
static void list_dir(const char *path, struct listing *L, bool churn, const char *where)
{
	DIR *d = opendir(path);
	struct dirent *de;
	unsigned k = 0;
	struct churn ch = { 0 };
	pthread_t th;
	int dfd;

	cr_assert(d, "opendir %s: %s", path, strerror(errno));
	dfd = OK(open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC));
	listing_reset(L);
	if (churn) {
		ch.dfd = dfd;
		atomic_init(&ch.stop, false);
		cr_assert_eq(pthread_create(&th, NULL, churn_main, &ch), 0);
	}
	for (;;) {
		errno = 0;
		de = readdir(d);
		if (!de)
			break;
		listing_take(L, de->d_name, where);
		k++;
		if (!churn && k == L->n / 2) {
			long pos = telldir(d);
			static char seen[200][NAME_MAX + 1];
			int got = 0;

			cr_assert(pos >= 0, "%s: telldir: %s", where, strerror(errno));
			while (got < 200 && (de = readdir(d))) {
				snprintf(seen[got++], sizeof(seen[0]), "%s", de->d_name);
				listing_take(L, de->d_name, where);
			}
			seekdir(d, pos);
			for (int j = 0; j < got; j++) {
				de = readdir(d);
				cr_assert(de, "%s: after seekdir, the listing ends at entry %d of %d",
					  where, j, got);
				cr_assert_str_eq(de->d_name, seen[j],
						 "%s: after seekdir, entry %d is '%s', before it "
						 "was '%s'", where, j, de->d_name, seen[j]);
			}
			k += (unsigned)got;
		}
		if (churn && k == L->n / 3) {
			char name[160];

			for (unsigned i = 3; i < L->n; i += 97) {
				dir_name(name, sizeof(name), i);
				OK(unlinkat(dfd, name, 0));
				L->gone[i] = 1;
			}
			for (unsigned i = 0; i < 500; i++) {
				snprintf(name, sizeof(name), "n%07u", i);
				OK(mknodat(dfd, name, S_IFREG | 0644, 0));
			}
			L->n_new = 500;
		}
	}
	cr_assert_eq(errno, 0, "%s: readdir: %s", where, strerror(errno));
	if (churn) {
		atomic_store(&ch.stop, true);
		pthread_join(th, NULL);
		cr_assert_eq(ch.err, 0, "%s: the churn thread's %s failed: %s", where,
			     ch.what ? ch.what : "?", fm_errname(ch.err));
		L->n_late = ch.kept;
		cr_log_info("%s: during the listing %u names were created and unlinked and %u kept "
			    "beside it", where, ch.made, ch.kept);
	}
	closedir(d);
	close(dfd);
	/* every original not unlinked during the listing exactly once */
	for (unsigned i = 0; i < L->n; i++) {
		char name[160];

		dir_name(name, sizeof(name), i);
		if (L->gone[i])
			cr_assert_leq(L->count[CAT_ORIG][i], 1);
		else
			cr_assert_eq(L->count[CAT_ORIG][i], 1, "%s: '%s' listed %d times", where,
				     name, L->count[CAT_ORIG][i]);
	}
}

/* A listing that must hold exactly the names the model says. */
static void list_exact(const char *path, struct listing *L, const char *where)
{
	DIR *d = opendir(path);
	struct dirent *de;

	cr_assert(d, "opendir %s: %s", path, strerror(errno));
	listing_reset(L);
	while ((errno = 0, de = readdir(d)))
		listing_take(L, de->d_name, where);
	cr_assert_eq(errno, 0, "%s: readdir: %s", where, strerror(errno));
	closedir(d);
	for (unsigned i = 0; i < L->n; i++)
		cr_assert_eq(L->count[CAT_ORIG][i], !L->gone[i], "%s: original %u listed %d times",
			     where, i, L->count[CAT_ORIG][i]);
	for (unsigned i = 0; i < EXTRA_MAX; i++) {
		cr_assert_eq(L->count[CAT_NEW][i], i < L->n_new, "%s: n%07u listed %d times", where,
			     i, L->count[CAT_NEW][i]);
		cr_assert_eq(L->count[CAT_LATE][i], i < L->n_late, "%s: l%07u listed %d times",
			     where, i, L->count[CAT_LATE][i]);
		cr_assert_eq(L->count[CAT_CHURN][i], 0, "%s: c%07u was unlinked but is listed",
			     where, i);
	}
}

static double make_entries(const char *dir, unsigned n)
{
	int dfd = OK(open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC));
	char name[160];
	double t0 = now_s();

	for (unsigned i = 0; i < n; i++) {
		dir_name(name, sizeof(name), i);
		if (mknodat(dfd, name, S_IFREG | 0644, 0) != 0)
			cr_assert_fail("%s: mknod of entry %u: %s", dir, i, strerror(errno));
	}
	close(dfd);
	return (double)n / (now_s() - t0);
}

/*
 * FERRY_LIMITS_DIR_ENTRIES entries (default 50000: about 7000 creates/s
 * here, so under 10 s; the benchmark runs 1000000) in one directory, on
 * ferryfs and on ext4 (which checks the checker). ferry-mountd keeps an
 * inode record for every entry the kernel holds a lookup on (as any FUSE
 * daemon must, until the kernel forgets them), so its RSS grows with the
 * entries the kernel caches: bounded here by 64 MiB + 2 KiB per entry
 * (measured: about 0.7 KiB).
 */
Test(limits, big_directory, .timeout = 600)
{
	unsigned n = (unsigned)env_u64("FERRY_LIMITS_DIR_ENTRIES", ASAN_BUILD ? 10000 : 50000);
	struct listing L;
	struct daemons d0, d1, d2, d3;
	double rate, rate_ref, t0;
	const char *md = mp("big"), *rd;

	ref_dir();
	rd = sp("ref/big");
	OK(mkdir(rd, 0755));
	OK(mkdir(md, 0755));
	listing_init(&L, n);

	rate_ref = make_entries(rd, n);
	list_dir(rd, &L, false, "ext4");
	list_dir(rd, &L, true, "ext4 with churn");
	list_exact(rd, &L, "ext4 after the churn");
	memset(L.gone, 0, n);

	sample("big directory, before", &d0);
	rate = make_entries(md, n);
	cr_log_info("big directory: %u entries created at %.0f/s (ext4: %.0f/s)", n, rate,
		    rate_ref);
	sample("big directory, created", &d1);
	t0 = now_s();
	list_dir(md, &L, false, "ferryfs");
	cr_log_info("big directory: %u entries listed in %.2f s", n, now_s() - t0);
	sample("big directory, listed", &d2);
	list_dir(md, &L, true, "ferryfs with churn");
	sample("big directory, listed with churn", &d3);
	cr_assert_leq(grown(d0.m.rss_kb, d3.m.rss_kb),
		      rss_allowance(64 * MiB + (uint64_t)n * 2 * KiB),
		      "ferry-mountd grew by %" PRIu64 " KiB for a directory of %u entries",
		      grown(d0.m.rss_kb, d3.m.rss_kb) / KiB, n);
	cr_assert_leq(d3.m.fds, d0.m.fds + FD_SLACK, "ferry-mountd holds %ld fds after the listings, "
		      "%ld before", d3.m.fds, d0.m.fds);
	cr_log_info("big directory: ferry-mountd RSS %ld -> %ld (created) -> %ld (listed) -> %ld "
		    "KiB (listed with churn): %.2f KiB per entry", d0.m.rss_kb, d1.m.rss_kb,
		    d2.m.rss_kb, d3.m.rss_kb, (double)(d3.m.rss_kb - d0.m.rss_kb) / n);
	list_exact(md, &L, "ferryfs after the churn");
	fm_remount();
	list_exact(md, &L, "ferryfs after a remount");
	sample("big directory, remounted and listed", &d3);
	listing_free(&L);
}
