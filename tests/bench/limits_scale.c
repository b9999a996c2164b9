/*
 * limits_scale: the workloads of tests/bench/limits_scale.sh (issue 9's
 * limits at full size), run against any directory: a ferryfs mount or a
 * plain local directory, side by side.
 *
 *   limits_scale open DIR N [--write-every K] [--watch PID]... [--stats FILE]
 *       N files open at once in DIR: every K-th (default 2) created and
 *       written, the others made beforehand and read while open; then all
 *       closed and the written ones read back. As many worker processes as
 *       this process's RLIMIT_NOFILE needs.
 *   limits_scale check DIR N --ok-file FILE [--write-every K]
 *       reads back the written files whose write and close returned 0 in an
 *       earlier `open` run that named the same --ok-file (after a restart
 *       of the daemon, say).
 *   limits_scale dir DIR N [--watch PID]... [--stats FILE]
 *       N entries made in DIR (mknod, names of 9..105 bytes), then listed
 *       twice, checking that each name comes exactly once.
 *
 * --watch PID (repeatable) samples a process (VmRSS, VmHWM, open fds) at
 * each phase: ferry-mountd and ferry-reconciler for a mount. --stats
 * names a ferryfs .stats file: after the closes, the run waits until
 * nothing is pending there before its last sample. Output: one
 * "key value..." line per fact, for the script to put side by side. Exit
 * status 1 if a byte read back differs or a name is missing or doubled;
 * failed calls are counted by errno, not fatal: what an application sees
 * at the limits is the point.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static pid_t watch[8];
static int nwatch;
static const char *stats_file, *ok_file;

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
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

static long kernel_slab_kb(void)
{
	FILE *f = fopen("/proc/meminfo", "re");
	char line[256];
	long v = -1;

	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "Slab: %ld", &v) == 1)
			break;
	fclose(f);
	return v;
}

/* One line per watched process: phase, name, VmRSS, VmHWM, fds. */
static void sample(const char *phase)
{
	for (int i = 0; i < nwatch; i++) {
		char path[64], line[256], name[64] = "?";
		long rss = -1, hwm = -1;
		FILE *f;

		snprintf(path, sizeof(path), "/proc/%d/status", (int)watch[i]);
		f = fopen(path, "re");
		if (!f) {
			printf("sample %s pid %d gone\n", phase, (int)watch[i]);
			continue;
		}
		while (fgets(line, sizeof(line), f)) {
			sscanf(line, "Name: %63s", name);
			sscanf(line, "VmRSS: %ld", &rss);
			sscanf(line, "VmHWM: %ld", &hwm);
		}
		fclose(f);
		printf("sample %s %s rss_kb %ld hwm_kb %ld fds %ld\n", phase, name, rss, hwm,
		       count_fds(watch[i]));
	}
	printf("sample %s kernel slab_kb %ld\n", phase, kernel_slab_kb());
	fflush(stdout);
}

/* Staging files a ferry-mountd holds open (<ino>-<fh>-<pid>-<serial>[.p]
 * in a staging directory): each is a closed file not yet handed off or
 * committed. */
static long staging_fds(pid_t pid)
{
	char path[64], link[320], target[4096];
	DIR *d;
	struct dirent *de;
	long n = 0;

	snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
	d = opendir(path);
	if (!d)
		return 0;
	while ((de = readdir(d))) {
		ssize_t len;
		const char *base;
		int end = -1;

		if (de->d_name[0] == '.')
			continue;
		snprintf(link, sizeof(link), "%s/%s", path, de->d_name);
		len = readlink(link, target, sizeof(target) - 1);
		if (len <= 0)
			continue;
		target[len] = '\0';
		base = strrchr(target, '/');
		if (!base || !strstr(target, "/staging/"))
			continue;
		base++;
		if (sscanf(base, "%*u-%*u-%*d-%*u%n", &end) == 0 && end > 0 &&
		    (base[end] == '\0' || strcmp(base + end, ".p") == 0))
			n++;
	}
	closedir(d);
	return n;
}

/*
 * Waits until the mount's .stats shows nothing pending and
 * the first watched process (ferry-mountd) holds no staging file: its
 * pending_commits reads 0 while a retry round has the list in hand, so
 * .stats alone can say "drained" about files still staged. Gives up after
 * a minute without progress (a daemon out of fds makes none).
 */
static void drain(void)
{
	static const char *const keys[] = { "passthrough_staging_bytes", "reconcile_inflight",
					    "reconcile_handed_inflight", "pending_commits" };
	double t0 = now_s(), progress = t0;
	unsigned long long last = ~0ULL;
	long held;

	if (!stats_file)
		return;
	for (;;) {
		FILE *f = fopen(stats_file, "re");
		char line[256];
		unsigned long long sum = 0, v;
		bool ok = f != NULL;

		while (f && fgets(line, sizeof(line), f))
			for (size_t k = 0; k < sizeof(keys) / sizeof(keys[0]); k++) {
				size_t kl = strlen(keys[k]);
				if (strncmp(line, keys[k], kl) == 0 && line[kl] == ' ' &&
				    sscanf(line + kl, "%llu", &v) == 1)
					sum += v;
			}
		if (f)
			fclose(f);
		held = nwatch ? staging_fds(watch[0]) : 0;
		if (ok && sum == 0 && held == 0)
			break;
		/* progress: fewer staging files held (pending_commits and the
		 * other counters come and go during a retry round) */
		if ((unsigned long long)held < last) {
			last = (unsigned long long)held;
			progress = now_s();
		}
		if (now_s() - progress > 60) {
			printf("drain gave_up_after_s %.0f no_progress_for_s 60 stats %s "
			       "staging_files_held %ld\n", now_s() - t0,
			       ok ? (sum ? "pending" : "idle") : "unreadable", held);
			return;
		}
		usleep(50000);
	}
	printf("drain seconds %.2f\n", now_s() - t0);
}

/* ---- open ----------------------------------------------------------------- */

static int text_of(char *buf, size_t cap, int i, bool w)
{
	return snprintf(buf, cap, "%s file %d of limits_scale\n", w ? "written" : "read-only", i);
}

static void name_of(char *buf, size_t cap, const char *dir, int i)
{
	if ((size_t)snprintf(buf, cap, "%s/f%07d", dir, i) >= cap)
		abort();
}

struct outcome {
	int open_e, io_e, close_e; /* -1 not tried, 0 ok, errno */
};

static void worker(const char *dir, struct outcome *o, int lo, int hi, int every, int ready,
		   int go)
{
	int *fds = malloc(sizeof(int) * (size_t)(hi - lo));
	char path[4200], text[128], back[128];
	char c = 'r';

	if (!fds)
		_exit(3);
	for (int i = lo; i < hi; i++) {
		bool w = i % every == 0;
		int len = text_of(text, sizeof(text), i, w), fd;
		ssize_t n;

		name_of(path, sizeof(path), dir, i);
		fd = w ? open(path, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0644)
		       : open(path, O_RDONLY | O_CLOEXEC);
		fds[i - lo] = fd;
		o[i].open_e = fd < 0 ? errno : 0;
		if (fd < 0)
			continue;
		if (w) {
			n = write(fd, text, (size_t)len);
			o[i].io_e = n == len ? 0 : n < 0 ? errno : EIO;
		} else {
			n = pread(fd, back, sizeof(back), 0);
			o[i].io_e = n < 0 ? errno : n == len && !memcmp(back, text, (size_t)len) ? 0
											  : EBADMSG;
		}
	}
	if (write(ready, &c, 1) != 1 || read(go, &c, 1) != 1)
		_exit(4);
	for (int i = lo; i < hi; i++)
		if (fds[i - lo] >= 0)
			o[i].close_e = close(fds[i - lo]) == 0 ? 0 : errno;
	_exit(0);
}

/* Failures of one call (0 open, 1 write or read, 2 close), by errno. */
static void tally(const char *what, const struct outcome *o, int n, int which)
{
	int fails = 0, by[160] = { 0 };
	char line[1024];
	size_t off = 0;

	for (int i = 0; i < n; i++) {
		int v = which == 0 ? o[i].open_e : which == 1 ? o[i].io_e : o[i].close_e;

		if (v > 0) {
			fails++;
			if (v < 160)
				by[v]++;
		}
	}
	line[0] = '\0';
	for (int k = 1; k < 160; k++)
		if (by[k] && off < sizeof(line) - 64)
			off += (size_t)snprintf(line + off, sizeof(line) - off, " %s %d",
						strerrorname_np(k) ? strerrorname_np(k) : "?", by[k]);
	printf("failed %s %d%s\n", what, fails, line);
}

/* Whether written file i holds its bytes; says why not if loud. */
static bool check_one(const char *dir, int i, bool loud)
{
	char path[4200], text[128], back[160];
	int len = text_of(text, sizeof(text), i, true), fd;
	ssize_t got;

	name_of(path, sizeof(path), dir, i);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	got = fd < 0 ? -1 : read(fd, back, sizeof(back));
	if (fd >= 0)
		close(fd);
	if (got == len && memcmp(back, text, (size_t)len) == 0)
		return true;
	if (loud)
		printf("error: %s: %s\n", path, got < 0 ? strerror(errno) : "wrong bytes");
	return false;
}

static int run_open(const char *dir, int n, int every)
{
	struct rlimit rl;
	long per;
	int nw, ready[2], bad = 0, intact = 0, written = 0;
	struct outcome *o;
	pid_t *pids;
	int *go;
	char path[4200], text[128];
	double t0;

	getrlimit(RLIMIT_NOFILE, &rl);
	rl.rlim_cur = rl.rlim_max;
	setrlimit(RLIMIT_NOFILE, &rl);
	per = (long)(rl.rlim_cur > 1000000 ? 1000000 : rl.rlim_cur) - 64;
	nw = (int)((n + per - 1) / per);
	o = mmap(NULL, sizeof(*o) * (size_t)n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
		 -1, 0);
	pids = calloc((size_t)nw, sizeof(pid_t));
	go = calloc((size_t)nw, sizeof(int));
	if (o == MAP_FAILED || !pids || !go)
		return 2;
	memset(o, 0xff, sizeof(*o) * (size_t)n);
	printf("open files %d write_every %d workers %d fds_per_worker %ld\n", n, every, nw, per);
	sample("start");
	t0 = now_s();
	for (int i = 0; i < n; i++) {
		int fd, len;

		if (i % every == 0)
			continue;
		name_of(path, sizeof(path), dir, i);
		len = text_of(text, sizeof(text), i, false);
		fd = open(path, O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0644);
		if (fd < 0 || write(fd, text, (size_t)len) != len || close(fd) != 0) {
			printf("error preparing %s: %s\n", path, strerror(errno));
			return 2;
		}
	}
	printf("phase prepare seconds %.2f files %d\n", now_s() - t0, n - (n + every - 1) / every);
	drain();
	sample("prepared");
	if (pipe2(ready, O_CLOEXEC) != 0)
		return 2;
	fflush(stdout);
	t0 = now_s();
	for (int w = 0; w < nw; w++) {
		int g[2];

		if (pipe2(g, O_CLOEXEC) != 0)
			return 2;
		pids[w] = fork();
		if (pids[w] < 0)
			return 2;
		if (pids[w] == 0) {
			close(ready[0]);
			close(g[1]);
			worker(dir, o, (int)(w * per), (int)((w + 1) * per < n ? (w + 1) * per : n),
			       every, ready[1], g[0]);
		}
		close(g[0]);
		go[w] = g[1];
	}
	close(ready[1]);
	for (int w = 0; w < nw; w++) {
		char c;
		if (read(ready[0], &c, 1) != 1) {
			printf("error: a worker died\n");
			return 2;
		}
	}
	printf("phase open_all seconds %.2f\n", now_s() - t0);
	{
		long fds = 0;
		for (int w = 0; w < nw; w++)
			fds += count_fds(pids[w]);
		printf("sample all_open workload fds %ld\n", fds);
	}
	sample("all_open");
	t0 = now_s();
	for (int w = 0; w < nw; w++) {
		if (write(go[w], "g", 1) != 1)
			return 2;
		close(go[w]);
	}
	for (int w = 0; w < nw; w++) {
		int st;
		waitpid(pids[w], &st, 0);
		if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
			printf("error: worker %d status 0x%x\n", w, st);
	}
	printf("phase close_all seconds %.2f\n", now_s() - t0);
	sample("closed");
	drain();
	sample("drained");
	tally("open", o, n, 0);
	tally("write_or_read", o, n, 1);
	tally("close", o, n, 2);
	if (ok_file) {
		FILE *f = fopen(ok_file, "we");
		if (!f)
			return 2;
		for (int i = 0; i < n; i += every)
			if (!o[i].open_e && !o[i].io_e && !o[i].close_e)
				fprintf(f, "%d\n", i);
		fclose(f);
	}
	t0 = now_s();
	for (int i = 0; i < n; i += every) {
		if (o[i].open_e || o[i].io_e || o[i].close_e)
			continue;
		written++;
		if (check_one(dir, i, bad < 5))
			intact++;
		else
			bad++;
	}
	printf("check written_and_closed_ok %d intact %d bad %d seconds %.2f\n", written, intact,
	       bad, now_s() - t0);
	return bad ? 1 : 0;
}

/* The written files an earlier run listed in --ok-file, read back. */
static int run_check(const char *dir)
{
	FILE *f = ok_file ? fopen(ok_file, "re") : NULL;
	int i, written = 0, intact = 0, bad = 0;

	if (!f)
		return 2;
	while (fscanf(f, "%d", &i) == 1) {
		written++;
		if (check_one(dir, i, bad < 5))
			intact++;
		else
			bad++;
	}
	fclose(f);
	printf("check after_restart written_and_closed_ok %d intact %d bad %d\n", written, intact,
	       bad);
	return bad ? 1 : 0;
}

/* ---- dir ------------------------------------------------------------------ */

static const char fill[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
			   "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";

static void entry_name(char *buf, size_t cap, unsigned i)
{
	snprintf(buf, cap, "%07u.%.*s", i, (int)(i % 97), fill);
}

/* Lists dir; every name exactly once. Returns the problems found. */
static long list_once(const char *dir, unsigned n, unsigned char *seen, const char *phase)
{
	DIR *d = opendir(dir);
	struct dirent *de;
	long bad = 0, total = 0;
	double t0 = now_s();
	char want[160];

	if (!d) {
		printf("error: opendir %s: %s\n", dir, strerror(errno));
		return 1;
	}
	memset(seen, 0, n);
	while ((errno = 0, de = readdir(d))) {
		unsigned i;

		if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
			continue;
		total++;
		if (sscanf(de->d_name, "%7u.", &i) != 1 || i >= n) {
			if (bad++ < 5)
				printf("error: unexpected entry %s\n", de->d_name);
			continue;
		}
		entry_name(want, sizeof(want), i);
		if (strcmp(want, de->d_name) != 0 || seen[i]++) {
			if (bad++ < 5)
				printf("error: entry %s wrong or twice\n", de->d_name);
		}
	}
	if (errno) {
		printf("error: readdir: %s\n", strerror(errno));
		bad++;
	}
	closedir(d);
	for (unsigned i = 0; i < n; i++)
		if (!seen[i] && bad++ < 5)
			printf("error: entry %u missing\n", i);
	printf("phase %s seconds %.2f entries %ld\n", phase, now_s() - t0, total);
	return bad;
}

static int run_dir(const char *dir, unsigned n)
{
	unsigned char *seen = malloc(n ? n : 1);
	char name[160];
	double t0;
	int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	long bad;

	if (!seen || dfd < 0)
		return 2;
	printf("dir entries %u\n", n);
	sample("start");
	t0 = now_s();
	for (unsigned i = 0; i < n; i++) {
		entry_name(name, sizeof(name), i);
		if (mknodat(dfd, name, S_IFREG | 0644, 0) != 0) {
			printf("error: mknod %s: %s\n", name, strerror(errno));
			return 2;
		}
		if (i && i % 100000 == 0) {
			printf("progress created %u seconds %.1f\n", i, now_s() - t0);
			fflush(stdout);
		}
	}
	printf("phase create seconds %.2f per_second %.0f\n", now_s() - t0,
	       n / (now_s() - t0 + 1e-9));
	close(dfd);
	sample("created");
	bad = list_once(dir, n, seen, "list");
	sample("listed");
	bad += list_once(dir, n, seen, "list_again");
	sample("listed_again");
	printf("check listing_problems %ld\n", bad);
	free(seen);
	return bad ? 1 : 0;
}

int main(int argc, char **argv)
{
	int every = 2, rc;
	struct rusage ru;

	if (argc < 4) {
		fprintf(stderr, "usage: limits_scale open|check|dir DIR N [--write-every K] "
				"[--watch PID]... [--stats FILE] [--ok-file FILE]\n");
		return 2;
	}
	for (int i = 4; i < argc; i++) {
		if (strcmp(argv[i], "--watch") == 0 && i + 1 < argc && nwatch < 8)
			watch[nwatch++] = (pid_t)atoi(argv[++i]);
		else if (strcmp(argv[i], "--stats") == 0 && i + 1 < argc)
			stats_file = argv[++i];
		else if (strcmp(argv[i], "--ok-file") == 0 && i + 1 < argc)
			ok_file = argv[++i];
		else if (strcmp(argv[i], "--write-every") == 0 && i + 1 < argc)
			every = atoi(argv[++i]) > 0 ? atoi(argv[i]) : 2;
		else {
			fprintf(stderr, "limits_scale: unknown argument %s\n", argv[i]);
			return 2;
		}
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (strcmp(argv[1], "open") == 0)
		rc = run_open(argv[2], atoi(argv[3]), every);
	else if (strcmp(argv[1], "check") == 0)
		rc = run_check(argv[2]);
	else if (strcmp(argv[1], "dir") == 0)
		rc = run_dir(argv[2], (unsigned)strtoul(argv[3], NULL, 10));
	else
		rc = 2;
	getrusage(RUSAGE_SELF, &ru);
	printf("self maxrss_kb %ld\n", ru.ru_maxrss);
	getrusage(RUSAGE_CHILDREN, &ru);
	printf("children maxrss_kb %ld\n", ru.ru_maxrss);
	return rc;
}
