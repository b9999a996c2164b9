/*
 * ferry_bench: ferryfs side by side with plain local directories, in one run.
 * Four suites (--suite core|passthrough|broker|compare|all, default all):
 *
 * core (issue 2; one ferryfs volume mounted with its defaults, so
 * passthrough=auto, against a plain directory):
 *   - sequential write (1 MiB blocks, close() included; ferryfs commits to the
 *     object store in close), once more with fsync() before close()
 *   - sequential read, three ways: cold (ferryfs: read cache emptied, kernel
 *     caches dropped, objects fetched from the file:// store; baseline:
 *     page cache dropped, read from disk), from ferryfs's read cache (ferryfs
 *     remounted so its page cache is gone; baseline: page-cache hot) and a
 *     re-read without remount (both: kernel page cache)
 *   - 4 KiB random pwrite() IOPS into a prefilled, reopened file (not empty
 *     at open, so the daemon write path even with passthrough), close() apart
 *   - a create + write(2 KiB) + close() loop over many files (left out under
 *     --suite all: the passthrough suite has it on all three targets)
 *
 * passthrough (issue 3; three targets side by side: a ferryfs volume with
 * passthrough=auto, a second volume mounted with passthrough=off, and a
 * plain directory on the filesystem the staging files live on):
 *   - 4 KiB random pwrite() IOPS into a file opened empty (O_CREAT|O_TRUNC,
 *     then filled in the same open, untimed), buffered; close() timed apart
 *   - the same with fdatasync() after every write (a fixed count), with the
 *     volumes mounted fsync=remote (every fdatasync uploads the changed
 *     block and commits) and then again remounted fsync=local (fdatasync of
 *     the staging file and a journal record; uploaded after close)
 *   - sequential write in 1 MiB blocks, write() calls and close() apart
 *   - the create + write(2 KiB) + close() loop
 *   with the ratios passthrough/directory and passthrough/passthrough=off,
 *   issue 3's targets marked PASS or MISS (information only), and the FUSE
 *   requests per write and per created file.
 *
 * broker (issue 4; the cost of registering backing files through
 * ferry-brokerd, one round trip per passthrough open): the create + write(2
 * KiB) + close() loop on three targets: a volume mounted by root with its
 * defaults (ferry-mountd registers its staging files with the ioctl on its
 * own /dev/fuse fd), a volume mounted by uid 65534 through a ferry-brokerd
 * we start ourselves (policy, socket, state directory and log in
 * SCRATCH/broker; policy root MNT-ROOT/broker-root, mountpoint
 * MNT-ROOT/broker-root/mnt-broker), and the plain directory. The loop on the
 * broker's mount runs in a child that dropped to uid 65534 (a mount without
 * allow_other is its owner's alone, .stats included): it takes the .stats
 * snapshots, times the loop with its own clock and sends everything back
 * through a pipe. Each volume is unmounted after its turn (`ferry umount`
 * waits for every upload), so no upload of one target runs under the next.
 * Reported: time per file (and per call), the ratio broker/direct against
 * issue 4's target (<= 1.3, information only), FUSE requests, backing_open
 * and backing_close per file on both volumes, and the broker's own request
 * count per file; whether passthrough was engaged on both (passthrough_active
 * 1, no WRITE request in the loop) is checked and printed.
 *
 * compare (issue 10; four columns, one after the other: the staging
 * filesystem itself, libfuse's passthrough_hp example over a directory of
 * it, the broker suite's two volumes: ferryfs mounted by root and by uid
 * 65534 through ferry-brokerd, every workload of that column run as uid
 * 65534): git clone (checkout included) of a repository generated once per
 * run (--files files of about --file-size bytes, 50 to a directory), git
 * status in the checkout (then every file compared with the repository's),
 * rm -rf of it, the create + write + close loop, 4 KiB random writes into an
 * existing --rand-size-mib file (laid out, closed, opened again) and the
 * same with fdatasync after each write (ferryfs also remounted -o
 * fsync=local); FUSE requests per file or write by opcode, passthrough_hp's
 * counted in a second, untimed turn with --debug-fuse (libfuse logs every
 * request); issue 10's targets (ferry direct ahead of passthrough_hp in every
 * row, git clone within 3x of the staging filesystem) as PASS/MISS,
 * information only. Without --pthp the passthrough_hp column shows '-' and
 * --pthp-missing's reason, and a failure in that column empties it without
 * failing the run.
 *
 * For every ferryfs phase the per-opcode FUSE request counts are taken from
 * MOUNTPOINT/.stats before and after (minus what reading .stats costs).
 *
 * The program mounts and unmounts the volumes itself (`ferry mount`, `ferry
 * umount`), starts and stops ferry-brokerd and passthrough_hp (its child,
 * unmounted and reaped after its turn; SIGTERM should we die); scripts/bench makes the
 * scratch filesystem, formats the volumes (SCRATCH/vol-{core,pt,off,direct,
 * broker}; vol-broker, objects-broker, cache-broker and staging-broker owned
 * by uid 65534, which formatted it) and cleans up. It reports; it asserts
 * nothing about timings. It fails (non-zero exit) on I/O errors and on data that does
 * not read back exactly as written.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <getopt.h>
#include <grp.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MIB (1024ull * 1024ull)
#define BLOCK (1u << 20)       /* sequential I/O size */
#define PAGE 4096u             /* random write size */
#define STAMP_MAGIC 0x66657272796231ull /* "ferryb1" */
#define MAX_FIGS 160

enum { SUITE_CORE = 1, SUITE_PT = 2, SUITE_BROKER = 4, SUITE_CMP = 8, SUITE_ALL = 15 };

/* Who mounts through the broker (and owns that mount). */
#define NOBODY_UID 65534
#define NOBODY_GID 65534

struct opts {
	const char *ferry, *scratch, *mnt_root, *pidfile_prefix;
	const char *brokerd, *brokerd_pidfile;
	const char *scratch_desc, *command, *source_desc;
	const char *pthp, *pthp_missing, *pthp_pidfile; /* passthrough_hp, or why there is none */
	const char *direct_o;  /* -o of the direct column (--direct-options), or NULL */
	unsigned long cache_mib;
	unsigned long size_mib, rand_mib, files, file_size, sync_ops, sync_mib;
	double seconds;
	unsigned long rand_max_ops;
	uint64_t seed;
	bool fsync_row;
	int suite;
};

/* ---- small helpers ------------------------------------------------------ */

static void errf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void errf(const char *fmt, ...)
{
	va_list ap;

	fputs("ferry_bench: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
}

static void progress(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void progress(const char *fmt, ...)
{
	va_list ap;

	fputs("  .. ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static uint64_t xorshift64(uint64_t *s)
{
	uint64_t x = *s;

	x ^= x << 13;
	x ^= x >> 7;
	x ^= x << 17;
	return *s = x;
}

static char *path_join(const char *dir, const char *name)
{
	char *p = NULL;

	if (asprintf(&p, "%s/%s", dir, name) < 0)
		return NULL;
	return p;
}

static int write_full(int fd, const void *buf, size_t len)
{
	const char *p = buf;

	while (len > 0) {
		ssize_t n = write(fd, p, len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -1;
		if (n == 0) {
			errno = EIO;
			return -1;
		}
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

static ssize_t read_full(int fd, void *buf, size_t len)
{
	char *p = buf;
	size_t got = 0;

	while (got < len) {
		ssize_t n = read(fd, p + got, len - got);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -1;
		if (n == 0)
			break;
		got += (size_t)n;
	}
	return (ssize_t)got;
}

/* ---- data pattern --------------------------------------------------------
 * A 1 MiB random template; every 4 KiB page of a written block starts with a
 * 16-byte stamp (magic, block << 8 | page), so a page read at the wrong place,
 * a stale page or zeros are caught cheaply inside the timed loop. The rest of
 * each page is checked against the template in an untimed pass.
 */
static unsigned char *g_tmpl;

static void stamp_block(unsigned char *buf, uint64_t block)
{
	for (unsigned pg = 0; pg < BLOCK / PAGE; pg++) {
		uint64_t st[2] = { STAMP_MAGIC, block << 8 | pg };
		memcpy(buf + (size_t)pg * PAGE, st, sizeof(st));
	}
}

/* Returns the first bad page of the block, or -1 when all stamps match. */
static long check_stamps(const unsigned char *buf, uint64_t block)
{
	for (unsigned pg = 0; pg < BLOCK / PAGE; pg++) {
		uint64_t st[2];
		memcpy(st, buf + (size_t)pg * PAGE, sizeof(st));
		if (st[0] != STAMP_MAGIC || st[1] != (block << 8 | pg))
			return (long)pg;
	}
	return -1;
}

static long check_body(const unsigned char *buf)
{
	for (unsigned pg = 0; pg < BLOCK / PAGE; pg++) {
		size_t off = (size_t)pg * PAGE + 16;
		if (memcmp(buf + off, g_tmpl + off, PAGE - 16) != 0)
			return (long)pg;
	}
	return -1;
}

/* ---- system actions ----------------------------------------------------- */

/* In a forked child: become uid/gid 65534 with no supplementary groups, in /. */
static int drop_to_nobody(void)
{
	if (setgroups(0, NULL) < 0 || setresgid(NOBODY_GID, NOBODY_GID, NOBODY_GID) < 0 ||
	    setresuid(NOBODY_UID, NOBODY_UID, NOBODY_UID) < 0 || chdir("/") < 0)
		return -1;
	return 0;
}

/*
 * Runs argv (argv[0] a path, or a name looked up in PATH; as uid 65534 if
 * nobody); its exit status, or -1. The child is killed should we die first
 * (a git clone must not go on writing into a mount the clean-up unmounts).
 */
static int run_cmd_as(char *const argv[], bool quiet, bool nobody)
{
	pid_t parent = getpid(), pid = fork();
	int st;

	if (pid < 0) {
		errf("fork for %s: %s", argv[0], strerror(errno));
		return -1;
	}
	if (pid == 0) {
		if (quiet) {
			int fd = open("/dev/null", O_WRONLY);
			if (fd >= 0)
				dup2(fd, STDOUT_FILENO);
		}
		if (nobody && drop_to_nobody() < 0) {
			fprintf(stderr, "ferry_bench: cannot drop to uid %d for %s: %s\n", NOBODY_UID,
				argv[0], strerror(errno));
			_exit(126);
		}
		/* After the uid change, which clears it. */
		if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0 || getppid() != parent)
			_exit(125);
		execvp(argv[0], argv);
		fprintf(stderr, "ferry_bench: exec %s: %s\n", argv[0], strerror(errno));
		_exit(127);
	}
	while (waitpid(pid, &st, 0) < 0) {
		if (errno != EINTR) {
			errf("waitpid %s: %s", argv[0], strerror(errno));
			return -1;
		}
	}
	if (WIFEXITED(st))
		return WEXITSTATUS(st);
	errf("%s %s killed by signal %d", argv[0], argv[1], WTERMSIG(st));
	return -1;
}

/* Runs argv with its stdout into out (NUL-terminated, truncated to len - 1
 * bytes; stderr goes to /dev/null). Exit status, or -1. */
static int run_capture(char *const argv[], char *out, size_t len)
{
	int p[2], st, dn;
	size_t got = 0;
	ssize_t n;
	pid_t pid;

	out[0] = '\0';
	if (pipe2(p, O_CLOEXEC) < 0) {
		errf("pipe: %s", strerror(errno));
		return -1;
	}
	pid = fork();
	if (pid < 0) {
		errf("fork for %s: %s", argv[0], strerror(errno));
		close(p[0]);
		close(p[1]);
		return -1;
	}
	if (pid == 0) {
		dn = open("/dev/null", O_WRONLY | O_CLOEXEC);
		if (dup2(p[1], STDOUT_FILENO) < 0 || dn < 0 || dup2(dn, STDERR_FILENO) < 0)
			_exit(127);
		execvp(argv[0], argv);
		_exit(127);
	}
	close(p[1]);
	for (;;) {
		char sink[256];

		if (got + 1 < len)
			n = read(p[0], out + got, len - 1 - got);
		else
			n = read(p[0], sink, sizeof(sink));
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		if (got + 1 < len)
			got += (size_t)n;
	}
	out[got] = '\0';
	close(p[0]);
	while (waitpid(pid, &st, 0) < 0) {
		if (errno != EINTR) {
			errf("waitpid %s: %s", argv[0], strerror(errno));
			return -1;
		}
	}
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/*
 * Drops the kernel page cache: sync, fadvise(DONTNEED) on path if given,
 * then "echo 1 > /proc/sys/vm/drop_caches". Returns false (after a warning)
 * when drop_caches could not be written.
 */
static bool drop_caches(const char *path)
{
	int fd;

	sync();
	if (path) {
		fd = open(path, O_RDONLY | O_CLOEXEC);
		if (fd >= 0) {
			fsync(fd);
			posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
			close(fd);
		}
	}
	fd = open("/proc/sys/vm/drop_caches", O_WRONLY | O_CLOEXEC);
	if (fd < 0 || write(fd, "1\n", 2) != 2) {
		errf("warning: cannot write /proc/sys/vm/drop_caches: %s (cold reads are not cold)",
		     strerror(errno));
		if (fd >= 0)
			close(fd);
		return false;
	}
	close(fd);
	return true;
}

static int rm_one(const char *path, const struct stat *st, int type, struct FTW *ftw)
{
	(void)st;
	if (ftw->level == 0)
		return 0;
	if ((type == FTW_DP ? rmdir(path) : unlink(path)) < 0 && errno != ENOENT) {
		errf("remove %s: %s", path, strerror(errno));
		return -1;
	}
	return 0;
}

/* Empties a directory (keeps the directory itself). */
static int clear_dir(const char *dir)
{
	if (nftw(dir, rm_one, 32, FTW_DEPTH | FTW_PHYS) != 0) {
		if (errno == ENOENT)
			return 0;
		errf("emptying %s failed", dir);
		return -1;
	}
	return 0;
}

/* Removes the list of local copies an unmount kept in the staging
 * directory (".local-copies-<uuid>"): the next mount then removes the
 * copies, and its reads take the read path, as a cold read must. */
static int forget_local_copies(const char *staging_dir)
{
	DIR *d = opendir(staging_dir);
	struct dirent *e;
	int rc = 0;

	if (!d)
		return errno == ENOENT ? 0 : -1;
	while ((e = readdir(d)))
		if (strncmp(e->d_name, ".local-copies-", 14) == 0 &&
		    unlinkat(dirfd(d), e->d_name, 0) < 0 && errno != ENOENT) {
			errf("remove %s/%s: %s", staging_dir, e->d_name, strerror(errno));
			rc = -1;
		}
	closedir(d);
	return rc;
}

/* ---- .stats -------------------------------------------------------------- */

struct snap {
	size_t n;
	char name[MAX_FIGS][64];
	uint64_t val[MAX_FIGS];
};

/* Cumulative counters worth a difference (gauges like cache_bytes are not). */
static bool is_counter(const char *name)
{
	static const char *const counters[] = {
		"bytes_read", "bytes_written", "objects_put", "objects_get",
		"bytes_uploaded", "bytes_downloaded", "cache_hits", "cache_misses",
		"commits", "commit_failures", "io_errors", "passthrough_opens",
		"backing_open", "backing_close", "blocks_unchanged", "passthrough_no_room",
	};

	if (strncmp(name, "fuse_requests_", 14) == 0)
		return true;
	for (size_t i = 0; i < sizeof(counters) / sizeof(counters[0]); i++)
		if (strcmp(name, counters[i]) == 0)
			return true;
	return false;
}

static int snap_take(const char *mnt, struct snap *s)
{
	char path[PATH_MAX], line[512];
	FILE *f;

	snprintf(path, sizeof(path), "%s/.stats", mnt);
	f = fopen(path, "re");
	if (!f) {
		errf("open %s: %s", path, strerror(errno));
		return -1;
	}
	s->n = 0;
	while (fgets(line, sizeof(line), f) && s->n < MAX_FIGS) {
		char name[64], *end;
		unsigned long long v;
		char val[256];

		if (sscanf(line, "%63s %255s", name, val) != 2 || !is_counter(name))
			continue;
		errno = 0;
		v = strtoull(val, &end, 10);
		if (errno || *end)
			continue;
		snprintf(s->name[s->n], sizeof(s->name[0]), "%s", name);
		s->val[s->n++] = v;
	}
	if (ferror(f)) {
		errf("read %s: %s", path, strerror(errno));
		fclose(f);
		return -1;
	}
	fclose(f);
	if (s->n == 0) {
		errf("%s has no fuse_requests_* lines", path);
		return -1;
	}
	return 0;
}

static uint64_t snap_get(const struct snap *s, const char *name)
{
	for (size_t i = 0; i < s->n; i++)
		if (strcmp(s->name[i], name) == 0)
			return s->val[i];
	return 0;
}

/* d = after - before - overhead, clamped at 0. */
static void snap_diff(const struct snap *after, const struct snap *before,
		      const struct snap *overhead, struct snap *d)
{
	d->n = 0;
	for (size_t i = 0; i < after->n; i++) {
		uint64_t b = snap_get(before, after->name[i]);
		uint64_t o = overhead ? snap_get(overhead, after->name[i]) : 0;
		uint64_t v = after->val[i] >= b ? after->val[i] - b : 0;

		v = v >= o ? v - o : 0;
		memcpy(d->name[d->n], after->name[i], sizeof(d->name[0]));
		d->val[d->n++] = v;
	}
}

/* ---- FUSE request counts of a file system that is not ferryfs ------------
 * passthrough_hp has no .stats: run with --debug-fuse, libfuse logs a line
 * "unique: N, opcode: NAME (n), nodeid: ..." for every request it receives.
 * The log is read from where the last snapshot stopped, so a snapshot costs
 * what the log grew by since.
 */
struct debug_log {
	char *path;
	off_t off;              /* whole lines up to here are counted */
	struct snap total;      /* fuse_requests_<opcode> (lower case) so far */
};

/* Adds n to the figure name, appending it when new (ignored when full). */
static void snap_add(struct snap *s, const char *name, uint64_t n)
{
	for (size_t i = 0; i < s->n; i++) {
		if (strcmp(s->name[i], name) == 0) {
			s->val[i] += n;
			return;
		}
	}
	if (s->n == MAX_FIGS)
		return;
	snprintf(s->name[s->n], sizeof(s->name[0]), "%s", name);
	s->val[s->n++] = n;
}

/* Counts the "opcode: NAME" of one log line. */
static void debug_log_line(struct debug_log *l, const char *line, size_t len)
{
	static const char key[] = "opcode: ";
	char name[64] = "fuse_requests_";
	size_t k = strlen(name);
	const char *p = memmem(line, len, key, sizeof(key) - 1);

	if (!p)
		return;
	p += sizeof(key) - 1;
	while (p < line + len && k + 1 < sizeof(name) &&
	       ((*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '_')) {
		name[k++] = (char)(*p >= 'A' && *p <= 'Z' ? *p - 'A' + 'a' : *p);
		p++;
	}
	name[k] = '\0';
	if (k > strlen("fuse_requests_"))
		snap_add(&l->total, name, 1);
}

static int debug_log_read(struct debug_log *l)
{
	char buf[65536];
	size_t have = 0;
	int fd = open(l->path, O_RDONLY | O_CLOEXEC);

	if (fd < 0) {
		errf("open %s: %s", l->path, strerror(errno));
		return -1;
	}
	for (;;) {
		ssize_t n = pread(fd, buf + have, sizeof(buf) - have, l->off + (off_t)have);
		char *start = buf, *nl;

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			errf("read %s: %s", l->path, strerror(errno));
			close(fd);
			return -1;
		}
		if (n == 0)
			break;
		have += (size_t)n;
		while ((nl = memchr(start, '\n', have - (size_t)(start - buf)))) {
			debug_log_line(l, start, (size_t)(nl - start));
			start = nl + 1;
		}
		/* A partial last line waits for the next snapshot; one longer than
		 * the buffer is no request line of libfuse's and is skipped. */
		l->off += start - buf;
		have -= (size_t)(start - buf);
		memmove(buf, start, have);
		if (have == sizeof(buf)) {
			l->off += (off_t)have;
			have = 0;
		}
	}
	close(fd);
	return 0;
}

/* Where a phase's FUSE request counts come from: a ferryfs mount's .stats or
 * passthrough_hp's debug log (neither: nothing to count). */
struct counter {
	const char *mnt;
	struct debug_log *log;
};

static int counter_snap(const struct counter *c, struct snap *s)
{
	if (c->mnt)
		return snap_take(c->mnt, s);
	if (c->log) {
		if (debug_log_read(c->log) < 0)
			return -1;
		*s = c->log->total;
		return 0;
	}
	s->n = 0;
	return 0;
}

/* ---- results -------------------------------------------------------------- */

/* A core-suite row: ferryfs and the baseline directory. */
struct row {
	char label[64];
	double f, b;
	bool has_f, has_b;
	const char *fmt;
};

/* A passthrough-suite row: the three targets. */
enum { W_PT, W_OFF, W_DIR, NW };

struct row3 {
	char label[64];
	const char *fmt;
	const char *na;         /* printed where a value is missing (default "-") */
	double v[NW];
	bool has[NW];
	bool ratios;            /* print pt/dir and pt/off */
};

struct phase {
	int suite;
	char name[64];
	double per;             /* divisor for per-item figures (0: none) */
	const char *per_what;
	struct snap d;
};

enum { T_CORE, T_PT, T_OFF, T_DIRECT, T_BROKER, NTGT };

/* The broker suite's columns (row3's three values). */
enum { B_DIRECT, B_BROKER, B_DIR };

struct target {
	const char *tag;        /* core, pt, off, direct, broker */
	const char *mount_o;    /* -o for `ferry mount`, or NULL */
	char *mount_o_local;    /* mount_o plus fsync=local, once remounted so */
	char *volume, *mnt, *cache_dir, *staging_dir, *pidfile;
	const char *broker;     /* `ferry mount --broker` socket, or NULL */
	bool nobody;            /* mounted (and only readable) by uid 65534 */
	bool mounted;
	struct snap overhead;   /* what reading .stats itself costs */
};

#define MAX_ROWS 24
#define MAX_PHASES 40
#define MAX_NOTES 40

/* The compare suite's columns. */
enum { C_DIR, C_PTHP, C_DIRECT, C_BROKER, NC };

/* Its rows, in print order; the *_REQ rows are FUSE requests per item. */
enum {
	CR_CLONE, CR_CLONE_REQ, CR_CLONE_DRAIN,
	CR_STATUS, CR_STATUS_REQ,
	CR_RM, CR_RM_REQ,
	CR_SMALL, CR_SMALL_FPS, CR_SMALL_REQ, CR_SMALL_DRAIN,
	CR_RAND, CR_RAND_OPEN, CR_RAND_CLOSE, CR_RAND_REQ,
	CR_SYNC, CR_SYNC_LAT, CR_SYNC_FIRST, CR_SYNC_MED, CR_SYNC_OPEN, CR_SYNC_CLOSE,
	CR_SYNC_REQ, CR_SYNC_PUT,
	CR_SYNC_LOCAL, CR_SYNC_LOCAL_LAT, CR_SYNC_LOCAL_FIRST, CR_SYNC_LOCAL_MED, CR_SYNC_LOCAL_OPEN,
	CR_UMOUNT,
	CR_N
};

/* Its workloads, each with FUSE request counts per column. */
enum { CP_CLONE, CP_STATUS, CP_RM, CP_SMALL, CP_RAND, CP_SYNC, CP_N };

struct row4 {
	char label[80];
	const char *fmt;
	int better;             /* +1 higher is better, -1 lower is better, 0 no ratios (also
				 * for times near 0 on the local columns: noise) */
	double v[NC];
	bool has[NC];
};

struct cphase {
	const char *name, *per_what;
	struct snap d[NC];      /* requests and ferryfs figures, after - before */
	double per[NC];         /* the divisor: files, or writes */
	bool has[NC];
};

struct bench {
	struct opts o;
	struct target t[NTGT];
	char *baseline;         /* the plain directory, on the staging filesystem */
	bool cold_ok;
	bool tmpfs;             /* the scratch filesystem is RAM: nothing is cold */
	int data_errors;
	bool ran_core, ran_pt;
	struct row rows[MAX_ROWS];
	size_t nrows;
	char notes[MAX_NOTES][384];
	size_t nnotes;
	struct row3 rows3[MAX_ROWS];
	size_t nrows3;
	char notes3[MAX_NOTES][384];
	size_t nnotes3;
	struct phase phases[MAX_PHASES];
	size_t nphases;
	int small_phase[2];     /* phases[] index of the small-file loop, pt and off (-1: none) */
	char pt_state[2][160];  /* passthrough_active and reason at mount, pt and off */
	/* for the targets */
	double rand_iops[NW], small_us[NW];
	bool has_rand[NW], has_small[NW];
	/* the broker suite */
	bool ran_broker;
	struct row3 rowsb[MAX_ROWS];
	size_t nrowsb;
	char notesb[MAX_NOTES][384];
	size_t nnotesb;
	int bsmall_phase[2];    /* phases[] index of the loop, direct and broker (-1: none) */
	char bstate[2][256];    /* passthrough state at mount, direct and broker */
	bool bengaged[2];       /* passthrough engaged for the whole loop */
	double bsmall_us[NW];
	bool has_bsmall[NW];
	char *broker_dir, *broker_sock, *broker_policy, *broker_log, *broker_root;
	pid_t brokerd;          /* ferry-brokerd, while it runs (0: not running) */
	/* the compare suite */
	bool ran_cmp;
	struct row4 rowsc[CR_N];
	struct cphase cphases[CP_N];
	char notesc[MAX_NOTES][384];
	size_t nnotesc;
	char cstate[NC][256];   /* each column's set-up, as printed */
	char pthp_off[320];     /* why the passthrough_hp column is empty ("": it is not) */
	bool pthp_counted;      /* its request counts were taken (the --debug-fuse run) */
	unsigned long pthp_rand_ops; /* its timed random writes, for the counting run */
	pid_t pthp;             /* passthrough_hp, while it runs (0: not running) */
	char *pthp_src, *pthp_mnt, *pthp_log, *gitsrc, *gitcfg;
	struct debug_log pthp_dlog;
	unsigned char *buf;     /* BLOCK bytes, aligned */
};

static struct row *row_add(struct bench *b, const char *label, const char *fmt)
{
	static struct row spare;
	struct row *r;

	if (b->nrows == MAX_ROWS)
		return &spare;
	r = &b->rows[b->nrows++];
	memset(r, 0, sizeof(*r));
	snprintf(r->label, sizeof(r->label), "%s", label);
	r->fmt = fmt;
	return r;
}

static struct row3 *row3_push(struct row3 *rows, size_t *n, const char *label, const char *fmt,
			      bool ratios)
{
	static struct row3 spare;
	struct row3 *r;

	if (*n == MAX_ROWS)
		return &spare;
	r = &rows[(*n)++];
	memset(r, 0, sizeof(*r));
	snprintf(r->label, sizeof(r->label), "%s", label);
	r->fmt = fmt;
	r->ratios = ratios;
	return r;
}

static struct row3 *row3_add(struct bench *b, const char *label, const char *fmt, bool ratios)
{
	return row3_push(b->rows3, &b->nrows3, label, fmt, ratios);
}

/* A broker-suite row (columns B_DIRECT, B_BROKER, B_DIR). */
static struct row3 *rowb_add(struct bench *b, const char *label, const char *fmt, bool ratios)
{
	return row3_push(b->rowsb, &b->nrowsb, label, fmt, ratios);
}

static void row3_set(struct row3 *r, int w, double v)
{
	r->v[w] = v;
	r->has[w] = true;
}

static void vnote(char (*notes)[384], size_t *n, const char *fmt, va_list ap)
{
	if (*n == MAX_NOTES)
		return;
	vsnprintf(notes[(*n)++], sizeof(notes[0]), fmt, ap);
}

static void note(struct bench *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void note(struct bench *b, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vnote(b->notes, &b->nnotes, fmt, ap);
	va_end(ap);
}

static void note3(struct bench *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void note3(struct bench *b, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vnote(b->notes3, &b->nnotes3, fmt, ap);
	va_end(ap);
}

static void noteb(struct bench *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void noteb(struct bench *b, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vnote(b->notesb, &b->nnotesb, fmt, ap);
	va_end(ap);
}

/* Returns the new phase's index, or -1 when the table is full. */
static int phase_add(struct bench *b, int suite, const struct target *t, const char *name,
		     const struct snap *before, const struct snap *after, double per,
		     const char *per_what)
{
	struct phase *p;

	if (b->nphases == MAX_PHASES)
		return -1;
	p = &b->phases[b->nphases];
	p->suite = suite;
	snprintf(p->name, sizeof(p->name), "%s", name);
	p->per = per;
	p->per_what = per_what;
	snap_diff(after, before, &t->overhead, &p->d);
	return (int)b->nphases++;
}

/* Sum of the fuse_requests_* figures of a difference. */
static uint64_t snap_requests(const struct snap *d)
{
	uint64_t n = 0;

	for (size_t i = 0; i < d->n; i++)
		if (strncmp(d->name[i], "fuse_requests_", 14) == 0 &&
		    strcmp(d->name[i], "fuse_requests_interrupted") != 0)
			n += d->val[i];
	return n;
}

/* One "name value" line of MOUNTPOINT/.stats, as text ("?" if absent). */
static void stats_str(const char *mnt, const char *name, char *out, size_t len)
{
	char path[PATH_MAX], line[512];
	size_t nl = strlen(name);
	FILE *f;

	snprintf(out, len, "?");
	snprintf(path, sizeof(path), "%s/.stats", mnt);
	f = fopen(path, "re");
	if (!f)
		return;
	while (fgets(line, sizeof(line), f)) {
		if (strncmp(line, name, nl) == 0 && line[nl] == ' ') {
			line[strcspn(line, "\n")] = '\0';
			snprintf(out, len, "%s", line + nl + 1);
			break;
		}
	}
	fclose(f);
}

/* ---- as uid 65534 ----------------------------------------------------------- */

struct child_hdr {
	int rc;                 /* fn's return value */
	int data_errors;        /* what fn added to b->data_errors */
};

/*
 * Runs fn(b, arg, out) in a forked child that dropped to uid/gid 65534 (no
 * groups; killed should we die) and copies the child's out (outlen bytes)
 * back through a pipe. Returns fn's return value, or -1 when the child could
 * not run it to the end. The data errors the child counted are added to ours.
 */
static int as_nobody(struct bench *b, int (*fn)(struct bench *b, void *arg, void *out), void *arg,
		     void *out, size_t outlen)
{
	struct child_hdr h = { .rc = -1 };
	pid_t parent = getpid(), pid;
	int p[2], st;

	if (pipe2(p, O_CLOEXEC) < 0) {
		errf("pipe: %s", strerror(errno));
		return -1;
	}
	fflush(stdout);
	pid = fork();
	if (pid < 0) {
		errf("fork: %s", strerror(errno));
		close(p[0]);
		close(p[1]);
		return -1;
	}
	if (pid == 0) {
		close(p[0]);
		if (drop_to_nobody() < 0) {
			fprintf(stderr, "ferry_bench: cannot drop to uid %d: %s\n", NOBODY_UID,
				strerror(errno));
			_exit(126);
		}
		/* Set after the uid change, which clears it. */
		if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0 || getppid() != parent)
			_exit(125);
		b->data_errors = 0;
		h.rc = fn(b, arg, out);
		h.data_errors = b->data_errors;
		if (write_full(p[1], &h, sizeof(h)) < 0 || write_full(p[1], out, outlen) < 0)
			_exit(124);
		_exit(0);
	}
	close(p[1]);
	if (read_full(p[0], &h, sizeof(h)) != (ssize_t)sizeof(h) ||
	    read_full(p[0], out, outlen) != (ssize_t)outlen)
		h = (struct child_hdr){ .rc = -1 };
	close(p[0]);
	while (waitpid(pid, &st, 0) < 0) {
		if (errno != EINTR) {
			errf("waitpid: %s", strerror(errno));
			return -1;
		}
	}
	if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
		errf("the child running as uid %d %s %d", NOBODY_UID,
		     WIFEXITED(st) ? "exited with status" : "was killed by signal",
		     WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
		h.rc = -1;
	}
	b->data_errors += h.data_errors;
	return h.rc;
}

static int child_snap(struct bench *b, void *mnt, void *out)
{
	return snap_take(mnt, out);
}

struct stats_q {
	const char *mnt, *name;
	char val[160];
};

static int child_stats_str(struct bench *b, void *arg, void *out)
{
	struct stats_q *q = arg;

	stats_str(q->mnt, q->name, out, sizeof(q->val));
	return 0;
}

/* snap_take and stats_str as whoever may read the target's .stats. */
static int tsnap(struct bench *b, const struct target *t, struct snap *s)
{
	if (!t->nobody)
		return snap_take(t->mnt, s);
	return as_nobody(b, child_snap, t->mnt, s, sizeof(*s));
}

static void tstats_str(struct bench *b, const struct target *t, const char *name, char *out,
		       size_t len)
{
	struct stats_q q = { .mnt = t->mnt, .name = name };

	if (!t->nobody) {
		stats_str(t->mnt, name, out, len);
		return;
	}
	if (as_nobody(b, child_stats_str, &q, q.val, sizeof(q.val)) < 0)
		snprintf(q.val, sizeof(q.val), "?");
	if (len) { /* cut to fit, as stats_str() does */
		size_t n = strnlen(q.val, len - 1);
		memcpy(out, q.val, n);
		out[n] = '\0';
	}
}

/* ---- mounting -------------------------------------------------------------- */

static int ferry_mount(struct bench *b, struct target *t)
{
	char cache_mib[32];
	struct snap s0, s1;
	char *argv[18];
	int n = 0, rc;

	snprintf(cache_mib, sizeof(cache_mib), "%lu", b->o.cache_mib);
	argv[n++] = (char *)b->o.ferry;
	argv[n++] = "mount";
	if (t->broker) {
		argv[n++] = "--broker";
		argv[n++] = (char *)t->broker;
	}
	argv[n++] = "--cache-dir";
	argv[n++] = t->cache_dir;
	argv[n++] = "--cache-size";
	argv[n++] = cache_mib;
	argv[n++] = "--staging-dir";
	argv[n++] = t->staging_dir;
	if (t->mount_o) {
		argv[n++] = "-o";
		argv[n++] = (char *)t->mount_o;
	}
	argv[n++] = t->volume;
	argv[n++] = t->mnt;
	argv[n] = NULL;
	rc = run_cmd_as(argv, true, t->nobody);
	if (rc != 0) {
		errf("`ferry mount%s%s%s%s %s %s`%s failed (exit %d); see the lines above and "
		     "%s/ferry-mountd.log", t->broker ? " --broker " : "", t->broker ? t->broker : "",
		     t->mount_o ? " -o " : "", t->mount_o ? t->mount_o : "", t->volume, t->mnt,
		     t->nobody ? " as uid 65534" : "", rc, t->volume);
		return -1;
	}
	t->mounted = true;
	/* Remember ferry-mountd's pid so scripts/bench can end it should we die. */
	if (t->pidfile) {
		char pid[32];
		FILE *pf;

		tstats_str(b, t, "pid", pid, sizeof(pid));
		pf = fopen(t->pidfile, "we");
		if (pf) {
			fprintf(pf, "%s\n", pid);
			fclose(pf);
		}
	}
	/* Two snapshots with nothing between: the cost of one .stats read. */
	if (tsnap(b, t, &s0) < 0 || tsnap(b, t, &s1) < 0)
		return -1;
	snap_diff(&s1, &s0, NULL, &t->overhead);
	return 0;
}

static int ferry_umount(struct bench *b, struct target *t, double *secs)
{
	char *argv[] = { (char *)b->o.ferry, "umount", t->mnt, NULL };
	double t0 = now_s();
	int rc;

	rc = run_cmd_as(argv, true, t->nobody);
	if (secs)
		*secs = now_s() - t0;
	if (rc != 0) {
		errf("`ferry umount %s`%s failed (exit %d)", t->mnt, t->nobody ? " as uid 65534" : "",
		     rc);
		return -1;
	}
	t->mounted = false;
	return 0;
}

/* ---- the workloads ------------------------------------------------------- */

/* Writes bytes in 1 MiB blocks; *total includes close(), *tclose is close alone. */
static int seq_write(struct bench *b, const char *path, uint64_t bytes, bool do_fsync,
		     double *total, double *tclose)
{
	uint64_t nblocks = bytes / BLOCK;
	double t0, t1;
	int fd, rc;

	memcpy(b->buf, g_tmpl, BLOCK);
	t0 = now_s();
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0) {
		errf("create %s: %s", path, strerror(errno));
		return -1;
	}
	for (uint64_t i = 0; i < nblocks; i++) {
		stamp_block(b->buf, i);
		if (write_full(fd, b->buf, BLOCK) < 0) {
			errf("write %s at %" PRIu64 ": %s", path, i * BLOCK, strerror(errno));
			close(fd);
			return -1;
		}
	}
	if (do_fsync && fsync(fd) < 0) {
		errf("fsync %s: %s", path, strerror(errno));
		close(fd);
		return -1;
	}
	t1 = now_s();
	rc = close(fd);
	*total = now_s() - t0;
	*tclose = now_s() - t1;
	if (rc < 0) {
		errf("close %s (commit): %s", path, strerror(errno));
		return -1;
	}
	return 0;
}

/*
 * Reads the file in 1 MiB blocks, checking each page's stamp (cheap). With
 * full_check the page bodies are compared with the template too (untimed use).
 */
static int seq_read(struct bench *b, const char *path, uint64_t bytes, bool full_check,
		    double *secs)
{
	uint64_t nblocks = bytes / BLOCK, i;
	double t0 = now_s();
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	ssize_t n;

	if (fd < 0) {
		errf("open %s: %s", path, strerror(errno));
		return -1;
	}
	for (i = 0;; i++) {
		long bad;

		n = read_full(fd, b->buf, BLOCK);
		if (n < 0) {
			errf("read %s at %" PRIu64 ": %s", path, i * BLOCK, strerror(errno));
			goto fail;
		}
		if (n == 0)
			break;
		if (i >= nblocks || n != BLOCK) {
			errf("read %s: %zd bytes at %" PRIu64 ", file should be %" PRIu64 " bytes",
			     path, n, i * BLOCK, bytes);
			b->data_errors++;
			goto fail;
		}
		bad = check_stamps(b->buf, i);
		if (bad < 0 && full_check)
			bad = check_body(b->buf);
		if (bad >= 0) {
			errf("WRONG DATA in %s: 4 KiB page at offset %" PRIu64, path,
			     i * BLOCK + (uint64_t)bad * PAGE);
			b->data_errors++;
			goto fail;
		}
	}
	if (i != nblocks) {
		errf("read %s: EOF after %" PRIu64 " bytes, expected %" PRIu64, path, i * BLOCK, bytes);
		b->data_errors++;
		goto fail;
	}
	if (close(fd) < 0) {
		errf("close %s: %s", path, strerror(errno));
		return -1;
	}
	*secs = now_s() - t0;
	return 0;
fail:
	close(fd);
	return -1;
}

/*
 * 4 KiB pwrite()s at random page-aligned offsets of an existing file: for
 * `seconds` (checked every 64 writes) up to *ops, or exactly *ops when
 * seconds is 0. The same seed gives the same offsets and contents.
 */
static int rand_write(struct bench *b, const char *path, uint64_t file_bytes, double seconds,
		      unsigned long *ops, double *twrite, double *tclose,
		      const char *mnt, struct snap *mid /* taken before close, may be NULL */)
{
	uint64_t pages = file_bytes / PAGE, seed = b->o.seed | 1;
	unsigned char *pg = b->buf; /* the first page of buf */
	unsigned long max = *ops, i;
	double t0, t1;
	int fd, rc;

	memcpy(pg, g_tmpl, PAGE);
	fd = open(path, O_RDWR | O_CLOEXEC);
	if (fd < 0) {
		errf("open %s: %s", path, strerror(errno));
		return -1;
	}
	t0 = now_s();
	for (i = 0; i < max; i++) {
		uint64_t page = xorshift64(&seed) % pages;
		uint64_t st[2] = { STAMP_MAGIC ^ 0xff, i };

		memcpy(pg, st, sizeof(st));
		if (pwrite(fd, pg, PAGE, (off_t)(page * PAGE)) != (ssize_t)PAGE) {
			errf("pwrite %s at %" PRIu64 ": %s", path, page * PAGE,
			     errno ? strerror(errno) : "short write");
			close(fd);
			return -1;
		}
		if (seconds > 0 && (i & 63) == 63 && now_s() - t0 >= seconds) {
			i++;
			break;
		}
	}
	t1 = now_s();
	*twrite = t1 - t0;
	*ops = i;
	if (mid && snap_take(mnt, mid) < 0) {
		close(fd);
		return -1;
	}
	t1 = now_s();
	rc = close(fd);
	*tclose = now_s() - t1;
	if (rc < 0) {
		errf("close %s (commit): %s", path, strerror(errno));
		return -1;
	}
	return 0;
}

/* Fraction of the pages that rand_write's first ops writes touched. */
static double distinct_pages(struct bench *b, uint64_t pages, unsigned long ops)
{
	uint64_t seed = b->o.seed | 1, hit = 0;
	unsigned char *bits = calloc((size_t)(pages + 7) / 8, 1);

	if (!bits)
		return 0;
	for (unsigned long i = 0; i < ops; i++) {
		uint64_t pg = xorshift64(&seed) % pages;
		if (!(bits[pg / 8] & (1u << (pg % 8)))) {
			bits[pg / 8] |= (unsigned char)(1u << (pg % 8));
			hit++;
		}
	}
	free(bits);
	return (double)hit / (double)pages;
}

/* Byte-compares two files (untimed). Returns 0 when identical. */
static int compare_files(struct bench *b, const char *p1, const char *p2)
{
	unsigned char *other = NULL;
	int fd1 = -1, fd2 = -1, rc = -1;
	uint64_t off = 0;

	if (posix_memalign((void **)&other, 4096, BLOCK) != 0) {
		errf("out of memory");
		return -1;
	}
	fd1 = open(p1, O_RDONLY | O_CLOEXEC);
	fd2 = open(p2, O_RDONLY | O_CLOEXEC);
	if (fd1 < 0 || fd2 < 0) {
		errf("open %s: %s", fd1 < 0 ? p1 : p2, strerror(errno));
		goto out;
	}
	for (;;) {
		ssize_t n1 = read_full(fd1, b->buf, BLOCK), n2 = read_full(fd2, other, BLOCK);
		if (n1 < 0 || n2 < 0) {
			errf("read %s at %" PRIu64 ": %s", n1 < 0 ? p1 : p2, off, strerror(errno));
			goto out;
		}
		if (n1 != n2 || memcmp(b->buf, other, (size_t)n1) != 0) {
			size_t k = 0;
			while (k < (size_t)(n1 < n2 ? n1 : n2) && b->buf[k] == other[k])
				k++;
			errf("WRONG DATA: %s and %s differ at offset %" PRIu64, p1, p2, off + k);
			b->data_errors++;
			goto out;
		}
		if (n1 == 0)
			break;
		off += (uint64_t)n1;
	}
	rc = 0;
out:
	if (fd1 >= 0)
		close(fd1);
	if (fd2 >= 0)
		close(fd2);
	free(other);
	return rc;
}

static void small_content(unsigned char *buf, size_t size, unsigned long i)
{
	memcpy(buf, g_tmpl + (i % 64) * 16, size);
	memcpy(buf, &i, sizeof(i));
}

struct small_res {
	double total, topen, twrite, tclose; /* seconds, for all files */
};

/* create + write(file_size) + close, files times, in a new directory. The
 * three calls are also timed apart (clock_gettime costs ~25 ns here). */
static int small_files(struct bench *b, const char *dir, struct small_res *res)
{
	unsigned long n = b->o.files;
	size_t size = b->o.file_size;
	char name[32];
	double t0;
	int dfd;

	if (mkdir(dir, 0755) < 0) {
		errf("mkdir %s: %s", dir, strerror(errno));
		return -1;
	}
	dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0) {
		errf("open %s: %s", dir, strerror(errno));
		return -1;
	}
	memset(res, 0, sizeof(*res));
	t0 = now_s();
	for (unsigned long i = 0; i < n; i++) {
		double ta, tb, tc, td;
		int fd;

		snprintf(name, sizeof(name), "f%07lu", i);
		small_content(b->buf, size, i);
		ta = now_s();
		fd = openat(dfd, name, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
		tb = now_s();
		if (fd < 0) {
			errf("create %s/%s: %s", dir, name, strerror(errno));
			goto fail;
		}
		if (write_full(fd, b->buf, size) < 0) {
			errf("write %s/%s: %s", dir, name, strerror(errno));
			close(fd);
			goto fail;
		}
		tc = now_s();
		if (close(fd) < 0) {
			errf("close %s/%s (commit): %s", dir, name, strerror(errno));
			goto fail;
		}
		td = now_s();
		res->topen += tb - ta;
		res->twrite += tc - tb;
		res->tclose += td - tc;
	}
	res->total = now_s() - t0;
	close(dfd);
	return 0;
fail:
	close(dfd);
	return -1;
}

/* Reads back every step-th small file (and the last), untimed. */
static int small_verify(struct bench *b, const char *dir, unsigned long step)
{
	unsigned char *want = b->buf + BLOCK / 2;
	unsigned char *got = b->buf;
	size_t size = b->o.file_size;
	char path[PATH_MAX];

	if (size > BLOCK / 2 - 1)
		return 0;
	for (unsigned long i = 0; i < b->o.files; i += step) {
		ssize_t n;
		int fd;

		if (i + step >= b->o.files)
			i = b->o.files - 1;
		snprintf(path, sizeof(path), "%s/f%07lu", dir, i);
		small_content(want, size, i);
		fd = open(path, O_RDONLY | O_CLOEXEC);
		if (fd < 0) {
			errf("open %s: %s", path, strerror(errno));
			return -1;
		}
		n = read_full(fd, got, size + 1);
		close(fd);
		if (n < 0) {
			errf("read %s: %s", path, strerror(errno));
			return -1;
		}
		if ((size_t)n != size || memcmp(got, want, size) != 0) {
			errf("WRONG DATA in %s (%zd bytes read, %zu written)", path, n, size);
			b->data_errors++;
			return -1;
		}
	}
	return 0;
}


/* ---- passthrough-suite workloads -------------------------------------------- */

struct rand_res {
	unsigned long ops;
	double tfill, twrite, tclose;
	double topen; /* reopen: the open() of the laid-out file */
	/* sync_each: the first write+fdatasync and the median one, in ms (the
	 * first also flushes what the open left dirty: a copy-up on ferryfs) */
	double first_ms, median_ms;
};

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

/*
 * 4 KiB random writes into a file that is empty at open, the open that gets a
 * passthrough staging file on ferryfs: open(O_RDWR|O_CREAT|O_TRUNC), fill the
 * whole size with stamped 1 MiB blocks in the same open (untimed), then make
 * the fill durable and quiet: with sync_each an fdatasync() (ferryfs: uploads
 * and commits it, so the timed fdatasyncs below each carry one changed
 * block); else sync() (no writeback of the fill competes with the timed
 * writes; it makes no FUSE request). Then pwrite()s of 4 KiB at random page
 * offsets, the same sequence as the core suite's, for `seconds` (checked
 * every 64 writes) up to max_ops, or exactly max_ops when seconds is 0; with
 * sync_each an fdatasync() after each. close() is timed apart. With mnt, .stats
 * snapshots: s0 before the timed writes, smid before close(), s1 after it.
 */
/* reopen: the fill is closed and the file opened again (without O_TRUNC)
 * for the random writes, as a database or fio with a laid-out file does.
 * ctr: where the snapshots come from (NULL: none). */
static int rand_run(struct bench *b, const struct counter *ctr, const char *path, uint64_t bytes,
		    double seconds, unsigned long max_ops, bool sync_each, bool reopen,
		    struct snap *s0, struct snap *smid, struct snap *s1, struct rand_res *r)
{
	uint64_t pages = bytes / PAGE, nblocks = bytes / BLOCK, seed = b->o.seed | 1;
	unsigned char *pg = b->buf;
	unsigned long i;
	double t0, t1, *lat = NULL; /* sync_each: each op's time, ms (owned) */
	int fd, rc;

	memset(r, 0, sizeof(*r));
	if (sync_each && max_ops > 0 && !(lat = calloc(max_ops, sizeof(*lat)))) {
		errf("out of memory");
		return -1;
	}
	t0 = now_s();
	fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0) {
		errf("create %s: %s", path, strerror(errno));
		return -1;
	}
	memcpy(b->buf, g_tmpl, BLOCK);
	for (uint64_t k = 0; k < nblocks; k++) {
		stamp_block(b->buf, k);
		if (write_full(fd, b->buf, BLOCK) < 0) {
			errf("write %s at %" PRIu64 ": %s", path, k * BLOCK, strerror(errno));
			goto fail;
		}
	}
	if (sync_each) {
		if (fdatasync(fd) < 0) {
			errf("fdatasync %s after the fill: %s", path, strerror(errno));
			goto fail;
		}
	} else {
		sync();
	}
	r->tfill = now_s() - t0;
	if (reopen) {
		if (close(fd) < 0) {
			errf("close %s after the fill: %s", path, strerror(errno));
			return -1;
		}
		t0 = now_s();
		fd = open(path, O_RDWR | O_CLOEXEC);
		r->topen = now_s() - t0;
		if (fd < 0) {
			errf("open %s again: %s", path, strerror(errno));
			return -1;
		}
	}
	if (ctr && counter_snap(ctr, s0) < 0)
		goto fail;
	memcpy(pg, g_tmpl, PAGE);
	t0 = now_s();
	for (i = 0; i < max_ops; i++) {
		uint64_t page = xorshift64(&seed) % pages;
		uint64_t st[2] = { STAMP_MAGIC ^ 0xff, i };
		double top = lat ? now_s() : 0;

		memcpy(pg, st, sizeof(st));
		if (pwrite(fd, pg, PAGE, (off_t)(page * PAGE)) != (ssize_t)PAGE) {
			errf("pwrite %s at %" PRIu64 ": %s", path, page * PAGE,
			     errno ? strerror(errno) : "short write");
			goto fail;
		}
		if (sync_each && fdatasync(fd) < 0) {
			errf("fdatasync %s after write %lu: %s", path, i, strerror(errno));
			goto fail;
		}
		if (lat)
			lat[i] = (now_s() - top) * 1e3;
		if (seconds > 0 && (i & 63) == 63 && now_s() - t0 >= seconds) {
			i++;
			break;
		}
	}
	r->twrite = now_s() - t0;
	r->ops = i;
	if (lat && i > 0) {
		r->first_ms = lat[0];
		qsort(lat, i, sizeof(*lat), cmp_double);
		r->median_ms = lat[i / 2];
	}
	free(lat);
	lat = NULL;
	if (ctr && counter_snap(ctr, smid) < 0)
		goto fail;
	t1 = now_s();
	rc = close(fd);
	r->tclose = now_s() - t1;
	if (rc < 0) {
		errf("close %s (commit): %s", path, strerror(errno));
		return -1;
	}
	if (ctr && counter_snap(ctr, s1) < 0)
		return -1;
	return 0;
fail:
	free(lat);
	close(fd);
	return -1;
}

/*
 * Reads path back (untimed) and compares every byte with what rand_run wrote:
 * the fill, overwritten by the first ops random writes (the last one to hit a
 * page wins). Returns 0 when all matches.
 */
static int rand_check(struct bench *b, const char *path, uint64_t bytes, unsigned long ops)
{
	uint64_t pages = bytes / PAGE, nblocks = bytes / BLOCK, seed = b->o.seed | 1, k;
	uint32_t *last = malloc((size_t)pages * sizeof(*last));
	int fd, rc = -1;

	if (!last || ops >= UINT32_MAX) {
		errf("rand_check: out of memory");
		free(last);
		return -1;
	}
	memset(last, 0xff, (size_t)pages * sizeof(*last));
	for (unsigned long i = 0; i < ops; i++)
		last[xorshift64(&seed) % pages] = (uint32_t)i;
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		errf("open %s: %s", path, strerror(errno));
		free(last);
		return -1;
	}
	for (k = 0;; k++) {
		ssize_t n = read_full(fd, b->buf, BLOCK);

		if (n < 0) {
			errf("read %s at %" PRIu64 ": %s", path, k * BLOCK, strerror(errno));
			goto out;
		}
		if (n == 0)
			break;
		if (k >= nblocks || n != BLOCK) {
			errf("WRONG SIZE: %s: %zd bytes at %" PRIu64 ", the file should be %" PRIu64
			     " bytes", path, n, k * BLOCK, bytes);
			b->data_errors++;
			goto out;
		}
		for (unsigned p = 0; p < BLOCK / PAGE; p++) {
			uint64_t page = k * (BLOCK / PAGE) + p;
			const unsigned char *got = b->buf + (size_t)p * PAGE, *body;
			uint64_t st[2];

			if (last[page] == UINT32_MAX) {
				st[0] = STAMP_MAGIC;
				st[1] = k << 8 | p;
				body = g_tmpl + (size_t)p * PAGE + 16;
			} else {
				st[0] = STAMP_MAGIC ^ 0xff;
				st[1] = last[page];
				body = g_tmpl + 16;
			}
			if (memcmp(got, st, sizeof(st)) != 0 || memcmp(got + 16, body, PAGE - 16) != 0) {
				errf("WRONG DATA in %s: 4 KiB page at offset %" PRIu64 " (expected %s)",
				     path, page * PAGE,
				     last[page] == UINT32_MAX ? "the fill" : "a random write");
				b->data_errors++;
				goto out;
			}
		}
	}
	if (k != nblocks) {
		errf("WRONG SIZE: %s: EOF after %" PRIu64 " bytes, expected %" PRIu64, path,
		     k * BLOCK, bytes);
		b->data_errors++;
		goto out;
	}
	rc = 0;
out:
	close(fd);
	free(last);
	return rc;
}


/* ---- the core suite (issue 2's rows) ----------------------------------------- */

static int suite_core(struct bench *b, bool with_small)
{
	struct target *t = &b->t[T_CORE];
	char *fseq = NULL, *bseq = NULL, *fseq2 = NULL, *bseq2 = NULL;
	char *frand = NULL, *brand = NULL, *fsmall = NULL, *bsmall = NULL;
	uint64_t seq_bytes = (uint64_t)b->o.size_mib * MIB, rand_bytes = (uint64_t)b->o.rand_mib * MIB;
	struct snap s0, s1, smid;
	double tt, tc, t_umount = 0;
	int rc = -1;

	b->ran_core = true;
	if (!(fseq = path_join(t->mnt, "seq.dat")) || !(bseq = path_join(b->baseline, "seq.dat")) ||
	    !(fseq2 = path_join(t->mnt, "seq-fsync.dat")) ||
	    !(bseq2 = path_join(b->baseline, "seq-fsync.dat")) ||
	    !(frand = path_join(t->mnt, "rand.dat")) || !(brand = path_join(b->baseline, "rand.dat")) ||
	    !(fsmall = path_join(t->mnt, "small")) || !(bsmall = path_join(b->baseline, "small"))) {
		errf("out of memory");
		goto out;
	}

	progress("core suite: mounting ferryfs (its defaults) at %s", t->mnt);
	if (ferry_mount(b, t) < 0)
		goto out;

	/* -- sequential write -- */
	{
		struct row *r = row_add(b, "seq write 1 MiB, incl. close (MB/s)", "%.1f");
		double fclose_s = 0, bclose_s = 0;

		progress("seq write %lu MiB on ferryfs", b->o.size_mib);
		if (snap_take(t->mnt, &s0) < 0 || seq_write(b, fseq, seq_bytes, false, &tt, &fclose_s) < 0 ||
		    snap_take(t->mnt, &s1) < 0)
			goto out;
		phase_add(b, SUITE_CORE, t, "seq write", &s0, &s1, 0, NULL);
		r->f = (double)seq_bytes / 1e6 / tt;
		r->has_f = true;
		progress("seq write %lu MiB on baseline", b->o.size_mib);
		if (seq_write(b, bseq, seq_bytes, false, &tt, &bclose_s) < 0)
			goto out;
		r->b = (double)seq_bytes / 1e6 / tt;
		r->has_b = true;
		note(b, "seq write: close() took %.3f s on ferryfs (upload + commit), %.3f s on baseline.",
		     fclose_s, bclose_s);
	}
	if (b->o.fsync_row) {
		struct row *r = row_add(b, "seq write 1 MiB + fsync + close (MB/s)", "%.1f");
		double fc = 0, bc = 0;

		progress("seq write + fsync on ferryfs");
		if (snap_take(t->mnt, &s0) < 0 || seq_write(b, fseq2, seq_bytes, true, &tt, &fc) < 0 ||
		    snap_take(t->mnt, &s1) < 0)
			goto out;
		phase_add(b, SUITE_CORE, t, "seq write + fsync", &s0, &s1, 0, NULL);
		r->f = (double)seq_bytes / 1e6 / tt;
		r->has_f = true;
		progress("seq write + fsync on baseline");
		if (seq_write(b, bseq2, seq_bytes, true, &tt, &bc) < 0)
			goto out;
		r->b = (double)seq_bytes / 1e6 / tt;
		r->has_b = true;
		if (unlink(fseq2) < 0 || unlink(bseq2) < 0) {
			errf("unlink seq-fsync.dat: %s", strerror(errno));
			goto out;
		}
	}

	/* -- sequential read: cold (store), read cache, page cache -- */
	{
		struct row *rc_cold = row_add(b, "seq read, cold: object store (MB/s)", "%.1f");
		struct row *rc_cache = row_add(b, "seq read, ferry read cache (MB/s)", "%.1f");
		struct row *rc_page = row_add(b, "seq re-read, kernel page cache (MB/s)", "%.1f");
		bool c1, c2;

		progress("seq read cold on ferryfs (remount, read cache emptied, drop_caches)");
		if (ferry_umount(b, t, NULL) < 0 || clear_dir(t->cache_dir) < 0 ||
		    forget_local_copies(t->staging_dir) < 0)
			goto out;
		c1 = drop_caches(NULL);
		if (ferry_mount(b, t) < 0)
			goto out;
		if (snap_take(t->mnt, &s0) < 0 || seq_read(b, fseq, seq_bytes, false, &tt) < 0 ||
		    snap_take(t->mnt, &s1) < 0)
			goto out;
		phase_add(b, SUITE_CORE, t, "seq read cold", &s0, &s1, 0, NULL);
		rc_cold->f = (double)seq_bytes / 1e6 / tt;
		rc_cold->has_f = true;
		progress("seq read cold on baseline (fadvise DONTNEED + drop_caches)");
		c2 = drop_caches(bseq);
		b->cold_ok = c1 && c2;
		if (seq_read(b, bseq, seq_bytes, false, &tt) < 0)
			goto out;
		rc_cold->b = (double)seq_bytes / 1e6 / tt;
		rc_cold->has_b = true;

		progress("seq read from the read cache on ferryfs (remount)");
		if (ferry_umount(b, t, NULL) < 0 || forget_local_copies(t->staging_dir) < 0 ||
		    ferry_mount(b, t) < 0)
			goto out;
		if (snap_take(t->mnt, &s0) < 0 || seq_read(b, fseq, seq_bytes, false, &tt) < 0 ||
		    snap_take(t->mnt, &s1) < 0)
			goto out;
		phase_add(b, SUITE_CORE, t, "seq read read-cache", &s0, &s1, 0, NULL);
		rc_cache->f = (double)seq_bytes / 1e6 / tt;
		rc_cache->has_f = true;
		progress("seq read (page cache) on baseline");
		if (seq_read(b, bseq, seq_bytes, false, &tt) < 0)
			goto out;
		rc_cache->b = (double)seq_bytes / 1e6 / tt;
		rc_cache->has_b = true;

		progress("seq re-read on both");
		if (snap_take(t->mnt, &s0) < 0 || seq_read(b, fseq, seq_bytes, false, &tt) < 0 ||
		    snap_take(t->mnt, &s1) < 0)
			goto out;
		phase_add(b, SUITE_CORE, t, "seq re-read", &s0, &s1, 0, NULL);
		rc_page->f = (double)seq_bytes / 1e6 / tt;
		rc_page->has_f = true;
		if (seq_read(b, bseq, seq_bytes, false, &tt) < 0)
			goto out;
		rc_page->b = (double)seq_bytes / 1e6 / tt;
		rc_page->has_b = true;

		progress("verifying every byte of %s (untimed)", fseq);
		if (seq_read(b, fseq, seq_bytes, true, &tt) < 0)
			goto out;
		note(b, "data check: %s read back byte for byte (stamps in every timed read, "
		     "full compare once).", "seq.dat");
		if (unlink(fseq) < 0 || unlink(bseq) < 0) {
			errf("unlink seq.dat: %s", strerror(errno));
			goto out;
		}
	}

	/* -- random 4 KiB writes into an existing file: the daemon write path -- */
	{
		struct row *r_iops = row_add(b, "rand write 4 KiB, existing file (IOPS)", "%.0f");
		struct row *r_close = row_add(b, "rand write: close() after (ms)", "%.3f");
		unsigned long ops = b->o.rand_max_ops, bops;
		double tw, tcl;

		progress("prefilling %lu MiB for random writes on both", b->o.rand_mib);
		if (seq_write(b, frand, rand_bytes, false, &tt, &tc) < 0 ||
		    seq_write(b, brand, rand_bytes, false, &tt, &tc) < 0)
			goto out;
		progress("random 4 KiB writes on ferryfs for %.0f s", b->o.seconds);
		if (snap_take(t->mnt, &s0) < 0 ||
		    rand_write(b, frand, rand_bytes, b->o.seconds, &ops, &tw, &tcl, t->mnt, &smid) < 0 ||
		    snap_take(t->mnt, &s1) < 0)
			goto out;
		phase_add(b, SUITE_CORE, t, "rand write (pwrites)", &s0, &smid, (double)ops, "write");
		phase_add(b, SUITE_CORE, t, "rand write close()", &smid, &s1, 0, NULL);
		r_iops->f = (double)ops / tw;
		r_iops->has_f = true;
		r_close->f = tcl * 1e3;
		r_close->has_f = true;
		bops = ops;
		progress("the same %lu random writes on baseline", ops);
		if (rand_write(b, brand, rand_bytes, 0, &bops, &tw, &tcl, NULL, NULL) < 0)
			goto out;
		r_iops->b = (double)bops / tw;
		r_iops->has_b = true;
		r_close->b = tcl * 1e3;
		r_close->has_b = true;
		note(b, "rand write: %lu writes on each side, %.1f%% of the file's 4 KiB pages written "
		     "at least once.", ops, 100.0 * distinct_pages(b, rand_bytes / PAGE, ops));
		progress("comparing rand.dat on ferryfs and baseline (untimed)");
		if (compare_files(b, frand, brand) < 0)
			goto out;
		note(b, "data check: rand.dat on ferryfs is byte-identical to the baseline's.");
		if (unlink(frand) < 0 || unlink(brand) < 0) {
			errf("unlink rand.dat: %s", strerror(errno));
			goto out;
		}
	}

	/* -- small files -- */
	if (with_small) {
		struct row *r_fps = row_add(b, "small files create+write+close (files/s)", "%.0f");
		struct row *r_us = row_add(b, "small files (us per file)", "%.1f");
		unsigned long step = b->o.files >= 200 ? b->o.files / 200 : 1;
		struct small_res sr;

		progress("%lu small files on ferryfs", b->o.files);
		if (snap_take(t->mnt, &s0) < 0 || small_files(b, fsmall, &sr) < 0 ||
		    snap_take(t->mnt, &s1) < 0)
			goto out;
		phase_add(b, SUITE_CORE, t, "small files", &s0, &s1, (double)b->o.files, "file");
		r_fps->f = (double)b->o.files / sr.total;
		r_us->f = sr.total * 1e6 / (double)b->o.files;
		r_fps->has_f = r_us->has_f = true;
		progress("%lu small files on baseline", b->o.files);
		if (small_files(b, bsmall, &sr) < 0)
			goto out;
		r_fps->b = (double)b->o.files / sr.total;
		r_us->b = sr.total * 1e6 / (double)b->o.files;
		r_fps->has_b = r_us->has_b = true;
		progress("reading back every %lu-th small file on ferryfs (untimed)", step);
		if (small_verify(b, fsmall, step) < 0)
			goto out;
		note(b, "data check: every %lu-th small file (and the last) read back from ferryfs.", step);
	} else {
		note(b, "small files: in the passthrough table below (all three targets).");
	}

	progress("unmounting the core volume");
	if (ferry_umount(b, t, &t_umount) < 0)
		goto out;
	note(b, "final `ferry umount` took %.3f s.", t_umount);
	rc = 0;
out:
	free(fseq);
	free(bseq);
	free(fseq2);
	free(bseq2);
	free(frand);
	free(brand);
	free(fsmall);
	free(bsmall);
	return rc;
}

/* ---- the passthrough suite (issue 3) ------------------------------------------ */

static const char *const wlabel[NW] = { "ferry pt", "ferry off", "staging dir" };

static struct target *wtarget(struct bench *b, int w)
{
	return w == W_PT ? &b->t[T_PT] : w == W_OFF ? &b->t[T_OFF] : NULL;
}

static const char *wdir(struct bench *b, int w)
{
	struct target *t = wtarget(b, w);

	return t ? t->mnt : b->baseline;
}

static int wsnap(struct target *t, struct snap *s)
{
	return t ? snap_take(t->mnt, s) : 0;
}

static int unlink_checked(const char *path)
{
	if (unlink(path) < 0) {
		errf("unlink %s: %s", path, strerror(errno));
		return -1;
	}
	return 0;
}

/* Removes dir/f0000000 .. and dir itself (untimed clean-up). */
static int small_remove(struct bench *b, const char *dir)
{
	char path[PATH_MAX];

	for (unsigned long i = 0; i < b->o.files; i++) {
		if (snprintf(path, sizeof(path), "%s/f%07lu", dir, i) >= (int)sizeof(path) ||
		    unlink_checked(path) < 0)
			return -1;
	}
	if (rmdir(dir) < 0) {
		errf("rmdir %s: %s", dir, strerror(errno));
		return -1;
	}
	return 0;
}

/* fsync: for the label of the write+fdatasync rows, "remote" or "local".
 * reopen: into an existing file (see rand_run). */
static int pt_rand(struct bench *b, bool sync_each, const char *fsync, bool reopen)
{
	char label[96];
	uint64_t bytes = (uint64_t)(sync_each ? b->o.sync_mib : b->o.rand_mib) * MIB;
	struct row3 *ri, *rl = NULL, *rc, *rq, *ru = NULL, *rb = NULL;
	struct snap sopen, s0, smid, s1;
	char path[PATH_MAX], name[64];

	struct row3 *ro = NULL;

	if (!sync_each) {
		ri = row3_add(b, reopen ? "rand write 4 KiB into an existing file, buffered (IOPS)" :
					  "rand write 4 KiB, buffered (IOPS)", "%.0f", true);
		if (reopen)
			ro = row3_add(b, "  open() of the existing file (ms)", "%.1f", true);
		rc = row3_add(b, "  close() after it (ms)", "%.1f", true);
		rq = row3_add(b, "  FUSE requests per write", "%.3f", false);
	} else {
		snprintf(label, sizeof(label), "rand write 4 KiB + fdatasync, fsync=%s (IOPS)", fsync);
		ri = row3_add(b, label, "%.0f", true);
		rl = row3_add(b, "  per write + fdatasync (ms)", "%.2f", true);
		rc = row3_add(b, "  close() after it (ms)", "%.1f", true);
		rq = row3_add(b, "  FUSE requests per write+fdatasync", "%.3f", false);
		ru = row3_add(b, "  objects put per fdatasync", "%.2f", false);
		rb = row3_add(b, "  MiB uploaded per fdatasync", "%.2f", false);
	}
	for (int w = 0; w < NW; w++) {
		struct target *t = wtarget(b, w);
		struct counter ctr = { .mnt = t ? t->mnt : NULL };
		struct rand_res r;
		int pi = -1;

		snprintf(path, sizeof(path), "%s/%s", wdir(b, w), sync_each ? "pt-sync.dat" : "pt-rand.dat");
		if (reopen)
			progress("%s: 4 KiB random writes for %.0f s into a %lu MiB file laid out, "
				 "closed and opened again", wlabel[w], b->o.seconds, b->o.rand_mib);
		else if (sync_each)
			progress("%s: %lu x (4 KiB pwrite + fdatasync) into a %lu MiB file opened empty",
				 wlabel[w], b->o.sync_ops, b->o.sync_mib);
		else
			progress("%s: 4 KiB random writes for %.0f s into a %lu MiB file opened empty",
				 wlabel[w], b->o.seconds, b->o.rand_mib);
		sync();
		if (wsnap(t, &sopen) < 0 ||
		    rand_run(b, t ? &ctr : NULL, path, bytes, sync_each ? 0 : b->o.seconds,
			     sync_each ? b->o.sync_ops : b->o.rand_max_ops, sync_each, reopen, &s0,
			     &smid, &s1, &r) < 0)
			return -1;
		row3_set(ri, w, (double)r.ops / r.twrite);
		if (ro)
			row3_set(ro, w, r.topen * 1e3);
		if (rl)
			row3_set(rl, w, r.twrite * 1e3 / (double)r.ops);
		row3_set(rc, w, r.tclose * 1e3);
		if (!sync_each && !reopen) {
			b->rand_iops[w] = (double)r.ops / r.twrite;
			b->has_rand[w] = true;
		}
		if (t) {
			struct snap dopen;

			snprintf(name, sizeof(name), "%s: rand %s%s", t->tag,
				 sync_each ? "write+fdatasync" : "buffered writes",
				 reopen ? " (existing file)" : "");
			pi = phase_add(b, SUITE_PT, t, name, &s0, &smid, (double)r.ops,
				       sync_each ? "write+fdatasync" : "write");
			snprintf(name, sizeof(name), "%s: rand %s close()", t->tag,
				 sync_each ? "write+fdatasync" : "buffered");
			phase_add(b, SUITE_PT, t, name, &smid, &s1, 0, NULL);
			snap_diff(&s1, &sopen, NULL, &dopen);
			if (pi >= 0) {
				const struct snap *d = &b->phases[pi].d;

				row3_set(rq, w, (double)snap_requests(d) / (double)r.ops);
				if (ru)
					row3_set(ru, w, (double)snap_get(d, "objects_put") / (double)r.ops);
				if (rb)
					row3_set(rb, w, (double)snap_get(d, "bytes_uploaded") / (double)MIB /
						 (double)r.ops);
				if (w == W_PT) {
					uint64_t opens = snap_get(&dopen, "passthrough_opens");
					uint64_t wr = snap_get(d, "fuse_requests_write");

					note3(b, "%s %s%s: passthrough %s (passthrough_opens +%" PRIu64
					      ", %" PRIu64 " WRITE requests for %lu writes).",
					      t->tag, sync_each ? "write+fdatasync" : "buffered",
					      reopen ? " (existing file)" : "",
					      opens >= 1 && wr == 0 ? "engaged" : "NOT ENGAGED", opens, wr,
					      r.ops);
				}
			}
		}
		note3(b, "rand %s%s, %s: %lu writes in %.2f s; the %lu MiB fill%s%s took %.2f s "
		      "(untimed).", sync_each ? "write+fdatasync" : "buffered",
		      reopen ? " (existing file)" : "", wlabel[w], r.ops, r.twrite,
		      (unsigned long)(bytes / MIB), reopen ? "" : " in the same open",
		      sync_each ? " and its fdatasync" : " and sync()", r.tfill);
		progress("%s: checking every byte of %s against the writes (untimed)", wlabel[w], path);
		if (rand_check(b, path, bytes, r.ops) < 0 || unlink_checked(path) < 0)
			return -1;
	}
	return 0;
}

static int pt_seq(struct bench *b)
{
	uint64_t bytes = (uint64_t)b->o.size_mib * MIB;
	struct row3 *rt = row3_add(b, "seq write 1 MiB, incl. close() (MB/s)", "%.1f", true);
	struct row3 *rw = row3_add(b, "  write() calls only (MB/s)", "%.1f", true);
	struct row3 *rc = row3_add(b, "  close() (s)", "%.3f", true);
	struct snap s0, s1;
	char path[PATH_MAX], name[64];

	for (int w = 0; w < NW; w++) {
		struct target *t = wtarget(b, w);
		double tot, tcl, tr;

		snprintf(path, sizeof(path), "%s/pt-seq.dat", wdir(b, w));
		progress("%s: seq write %lu MiB", wlabel[w], b->o.size_mib);
		sync();
		if (wsnap(t, &s0) < 0 || seq_write(b, path, bytes, false, &tot, &tcl) < 0 ||
		    wsnap(t, &s1) < 0)
			return -1;
		row3_set(rt, w, (double)bytes / 1e6 / tot);
		row3_set(rw, w, (double)bytes / 1e6 / (tot - tcl));
		row3_set(rc, w, tcl);
		if (t) {
			snprintf(name, sizeof(name), "%s: seq write", t->tag);
			phase_add(b, SUITE_PT, t, name, &s0, &s1, 0, NULL);
		}
		progress("%s: verifying every byte of %s (untimed)", wlabel[w], path);
		if (seq_read(b, path, bytes, true, &tr) < 0 || unlink_checked(path) < 0)
			return -1;
	}
	return 0;
}

static int pt_small(struct bench *b)
{
	struct row3 *rf = row3_add(b, "small files create+write+close (files/s)", "%.0f", true);
	struct row3 *ru = row3_add(b, "  per file (us)", "%.1f", true);
	struct row3 *ro = row3_add(b, "    openat(O_CREAT|O_EXCL) (us)", "%.1f", true);
	struct row3 *rw = row3_add(b, "    write() 2 KiB (us)", "%.1f", true);
	struct row3 *rc = row3_add(b, "    close() (us)", "%.1f", true);
	struct row3 *rq = row3_add(b, "  FUSE requests per file", "%.3f", false);
	double n = (double)b->o.files;
	struct snap s0, s1;
	char dir[PATH_MAX], name[64];

	for (int w = 0; w < NW; w++) {
		struct target *t = wtarget(b, w);
		struct small_res sr;

		snprintf(dir, sizeof(dir), "%s/pt-small", wdir(b, w));
		progress("%s: %lu x create + write(%lu) + close", wlabel[w], b->o.files, b->o.file_size);
		sync();
		if (wsnap(t, &s0) < 0 || small_files(b, dir, &sr) < 0 || wsnap(t, &s1) < 0)
			return -1;
		row3_set(rf, w, n / sr.total);
		row3_set(ru, w, sr.total * 1e6 / n);
		row3_set(ro, w, sr.topen * 1e6 / n);
		row3_set(rw, w, sr.twrite * 1e6 / n);
		row3_set(rc, w, sr.tclose * 1e6 / n);
		b->small_us[w] = sr.total * 1e6 / n;
		b->has_small[w] = true;
		if (t) {
			int pi;

			snprintf(name, sizeof(name), "%s: small files", t->tag);
			pi = phase_add(b, SUITE_PT, t, name, &s0, &s1, n, "file");
			b->small_phase[w] = pi;
			if (pi >= 0)
				row3_set(rq, w, (double)snap_requests(&b->phases[pi].d) / n);
		}
		progress("%s: reading back all %lu small files (untimed)", wlabel[w], b->o.files);
		if (small_verify(b, dir, 1) < 0 || small_remove(b, dir) < 0)
			return -1;
	}
	note3(b, "data check: every small file read back (content and size) on each target, then removed.");
	return 0;
}

static int suite_pt(struct bench *b)
{
	double tu;

	b->ran_pt = true;
	for (int k = T_PT; k <= T_OFF; k++) {
		struct target *t = &b->t[k];
		char act[16], why[128];

		progress("passthrough suite: mounting %s (-o %s) at %s", t->volume, t->mount_o, t->mnt);
		if (ferry_mount(b, t) < 0)
			return -1;
		stats_str(t->mnt, "passthrough_active", act, sizeof(act));
		stats_str(t->mnt, "passthrough_off_reason", why, sizeof(why));
		if (snprintf(b->pt_state[k - T_PT], sizeof(b->pt_state[0]),
			     "passthrough_active %s, passthrough_off_reason %s", act, why) < 0)
			b->pt_state[k - T_PT][0] = '\0';
	}
	if (pt_rand(b, false, NULL, false) < 0 || pt_rand(b, false, NULL, true) < 0 ||
	    pt_rand(b, true, "remote", false) < 0 || pt_seq(b) < 0 ||
	    pt_small(b) < 0)
		return -1;
	if (b->o.fsync_row) {
		/* Both volumes again, remounted -o fsync=local. */
		for (int k = T_PT; k <= T_OFF; k++) {
			struct target *t = &b->t[k];
			char *o = NULL;

			progress("remounting %s with fsync=local", t->mnt);
			if (ferry_umount(b, t, &tu) < 0)
				return -1;
			if (asprintf(&o, "%s%sfsync=local", t->mount_o ? t->mount_o : "",
				     t->mount_o ? "," : "") < 0)
				return -1;
			t->mount_o_local = o; /* owned by the target, freed with it */
			t->mount_o = o;
			if (ferry_mount(b, t) < 0)
				return -1;
		}
		if (pt_rand(b, true, "local", false) < 0)
			return -1;
	}
	for (int k = T_PT; k <= T_OFF; k++) {
		progress("unmounting %s", b->t[k].mnt);
		if (ferry_umount(b, &b->t[k], &tu) < 0)
			return -1;
		note3(b, "`ferry umount` of the %s volume took %.3f s.", b->t[k].tag, tu);
	}
	return 0;
}

/* ---- the broker suite (issue 4) ------------------------------------------------ */

static const char *const blabel[NW] = { "ferry direct", "ferry broker", "staging dir" };

/* CPU time (user + system) process pid has used, in seconds; -1 if it
 * cannot be read. */
static double proc_cpu_s(pid_t pid)
{
	char path[64], buf[1024];
	unsigned long ut, st;
	const char *p;
	size_t n;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	f = fopen(path, "re");
	if (!f)
		return -1;
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	/* After the command name, which may hold anything but ends at the
	 * last ')': state, 10 numbers, then utime and stime in ticks. */
	p = strrchr(buf, ')');
	if (!p || sscanf(p + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut,
			 &st) != 2)
		return -1;
	return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

/* ferry-brokerd's own counters (`ferry-brokerd --ping`). */
struct bstat {
	uint64_t connections, peers, mounts, backing_ids, fds, requests, refusals;
};

static int brokerd_status(struct bench *b, struct bstat *st)
{
	char *argv[] = { (char *)b->o.brokerd, "--ping", "--socket", b->broker_sock, NULL };
	unsigned long long v[7];
	char out[512];

	if (run_capture(argv, out, sizeof(out)) != 0 ||
	    sscanf(out, "ok: connections %llu peers %llu mounts %llu backing_ids %llu fds %llu "
		   "requests %llu refusals %llu", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5],
		   &v[6]) != 7)
		return -1;
	*st = (struct bstat){ .connections = v[0], .peers = v[1], .mounts = v[2],
			      .backing_ids = v[3], .fds = v[4], .requests = v[5],
			      .refusals = v[6] };
	return 0;
}

/* mkdir that accepts an existing directory, then owner and mode. */
static int mkdir_as(const char *path, uid_t uid, gid_t gid, mode_t mode)
{
	if (mkdir(path, mode) < 0 && errno != EEXIST) {
		errf("mkdir %s: %s", path, strerror(errno));
		return -1;
	}
	if (chown(path, uid, gid) < 0 || chmod(path, mode) < 0) {
		errf("chown/chmod %s: %s", path, strerror(errno));
		return -1;
	}
	return 0;
}

/*
 * Starts ferry-brokerd as root on SCRATCH/broker/broker.sock (mode 0666),
 * with a policy that lets uid 65534 mount beneath MNT-ROOT/broker-root, its
 * mount table in SCRATCH/broker/state and its log in SCRATCH/broker/
 * brokerd.log; writes its pid to --brokerd-pidfile and waits until it
 * answers --ping.
 */
static int brokerd_start(struct bench *b)
{
	const struct target *t = &b->t[T_BROKER];
	struct bstat st;
	char *state = NULL;
	int rc = -1, fd;
	FILE *f;

	if (!(state = path_join(b->broker_dir, "state"))) {
		errf("out of memory");
		goto out;
	}
	if (mkdir_as(b->broker_dir, 0, 0, 0755) < 0 || mkdir_as(b->broker_root, 0, 0, 0755) < 0 ||
	    mkdir_as(t->mnt, NOBODY_UID, NOBODY_GID, 0755) < 0)
		goto out;
	f = fopen(b->broker_policy, "we");
	if (!f || fprintf(f, "# ferry_bench, broker suite\nallow uid=%d root=%s max_mounts=16 "
			  "max_backing=4096\n", NOBODY_UID, b->broker_root) < 0 || fclose(f) != 0) {
		errf("writing %s: %s", b->broker_policy, strerror(errno));
		goto out;
	}
	fflush(stdout);
	b->brokerd = fork();
	if (b->brokerd < 0) {
		errf("fork: %s", strerror(errno));
		b->brokerd = 0;
		goto out;
	}
	if (b->brokerd == 0) {
		fd = open(b->broker_log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
		if (fd < 0 || dup2(fd, STDOUT_FILENO) < 0 || dup2(fd, STDERR_FILENO) < 0)
			_exit(127);
		/* Out of the terminal's process group: a Ctrl-C must not stop it
		 * before scripts/bench's clean-up has had it unmount its mounts
		 * (it stops it itself afterwards). */
		setsid();
		execl(b->o.brokerd, "ferry-brokerd", "--socket", b->broker_sock, "--socket-mode",
		      "0666", "--policy", b->broker_policy, "--state-dir", state, (char *)NULL);
		fprintf(stderr, "ferry_bench: exec %s: %s\n", b->o.brokerd, strerror(errno));
		_exit(127);
	}
	/* So that scripts/bench can end it should we die. */
	if (b->o.brokerd_pidfile) {
		f = fopen(b->o.brokerd_pidfile, "we");
		if (f) {
			fprintf(f, "%d\n", (int)b->brokerd);
			fclose(f);
		}
	}
	for (int i = 0; i < 400; i++) {
		int wst;

		if (brokerd_status(b, &st) == 0) {
			rc = 0;
			goto out;
		}
		if (waitpid(b->brokerd, &wst, WNOHANG) == b->brokerd) {
			b->brokerd = 0;
			errf("ferry-brokerd exited at start (see %s)", b->broker_log);
			goto out;
		}
		usleep(25 * 1000);
	}
	errf("ferry-brokerd did not answer --ping within 10 s (see %s)", b->broker_log);
out:
	free(state);
	return rc;
}

/* SIGTERM, 10 s, then SIGKILL. Mounts it made stay (they are ours to end). */
static void brokerd_stop(struct bench *b)
{
	int st;

	if (b->brokerd <= 0)
		return;
	kill(b->brokerd, SIGTERM);
	for (int i = 0; i < 500; i++) {
		if (waitpid(b->brokerd, &st, WNOHANG) == b->brokerd) {
			b->brokerd = 0;
			return;
		}
		usleep(20 * 1000);
	}
	errf("ferry-brokerd (pid %d) ignored SIGTERM for 10 s; killing it", (int)b->brokerd);
	kill(b->brokerd, SIGKILL);
	waitpid(b->brokerd, &st, 0);
	b->brokerd = 0;
}

struct small_job {
	const char *mnt;        /* .stats snapshots around the loop, or NULL */
	const char *dir;        /* made by the loop, removed after it */
};

struct small_out {
	struct small_res sr;
	struct snap s0, s1;
};

/*
 * One target's turn, as the user who may read the mount: a .stats snapshot,
 * the create + write + close loop, another snapshot, then every file read
 * back and removed (untimed). Fits as_nobody().
 */
static int small_round(struct bench *b, void *arg, void *out)
{
	const struct small_job *j = arg;
	struct small_out *r = out;

	memset(r, 0, sizeof(*r));
	if (j->mnt && snap_take(j->mnt, &r->s0) < 0)
		return -1;
	if (small_files(b, j->dir, &r->sr) < 0)
		return -1;
	if (j->mnt && snap_take(j->mnt, &r->s1) < 0)
		return -1;
	if (small_verify(b, j->dir, 1) < 0 || small_remove(b, j->dir) < 0)
		return -1;
	return 0;
}

static int suite_broker(struct bench *b)
{
	struct row3 *rf = rowb_add(b, "small files create+write+close (files/s)", "%.0f", true);
	struct row3 *rt = rowb_add(b, "  whole loop (ms)", "%.0f", true);
	struct row3 *ru = rowb_add(b, "  per file (us)", "%.1f", true);
	struct row3 *ro = rowb_add(b, "    openat(O_CREAT|O_EXCL) (us)", "%.1f", true);
	struct row3 *rw = rowb_add(b, "    write() 2 KiB (us)", "%.1f", true);
	struct row3 *rc = rowb_add(b, "    close() (us)", "%.1f", true);
	struct row3 *rq = rowb_add(b, "  FUSE requests per file", "%.3f", false);
	struct row3 *rbo = rowb_add(b, "  backing_open per file", "%.3f", false);
	struct row3 *rbc = rowb_add(b, "  backing_close per file", "%.3f", false);
	struct row3 *rbr = rowb_add(b, "  ferry-brokerd requests per file", "%.3f", false);
	struct row3 *rcm = rowb_add(b, "  ferry-mountd CPU per file (us)", "%.1f", false);
	struct row3 *rcb = rowb_add(b, "  ferry-brokerd CPU per file (us)", "%.1f", false);
	struct row3 *rum = rowb_add(b, "  `ferry umount` after the loop (s)", "%.2f", false);
	double n = (double)b->o.files;
	char dir[PATH_MAX], name[64];

	b->ran_broker = true;
	for (int w = 0; w < NW; w++) {
		struct target *t = w == B_DIRECT ? &b->t[T_DIRECT] : w == B_BROKER ? &b->t[T_BROKER] : NULL;
		struct bstat bs0 = { 0 }, bs1 = { 0 }, bsa, bsb, bsend;
		double cm0 = -1, cm1 = -1, cb0 = -1, cb1 = -1;
		pid_t mountd = 0;
		uint64_t ping_cost = 0;
		struct small_job job;
		struct small_out r;
		double tu;
		int k = w == B_DIRECT ? 0 : 1, rv;

		if (w == B_BROKER) {
			progress("broker suite: starting ferry-brokerd on %s (policy %s)", b->broker_sock,
				 b->broker_policy);
			if (brokerd_start(b) < 0)
				return -1;
			/* Two pings with nothing between: what one costs in its request count. */
			if (brokerd_status(b, &bsa) < 0 || brokerd_status(b, &bsb) < 0) {
				errf("ferry-brokerd stopped answering --ping (see %s)", b->broker_log);
				return -1;
			}
			ping_cost = bsb.requests - bsa.requests;
		}
		if (t) {
			char act[16], why[128], up[16] = "";

			progress("broker suite: mounting %s at %s%s", t->volume, t->mnt,
				 t->nobody ? " as uid 65534 through ferry-brokerd" : " as root");
			if (ferry_mount(b, t) < 0)
				return -1;
			tstats_str(b, t, "passthrough_active", act, sizeof(act));
			tstats_str(b, t, "passthrough_off_reason", why, sizeof(why));
			if (t->broker)
				tstats_str(b, t, "broker_up", up, sizeof(up));
			snprintf(b->bstate[k], sizeof(b->bstate[0]),
				 "passthrough_active %s, passthrough_off_reason %s%s%s", act, why,
				 *up ? ", broker_up " : "", up);
		}
		snprintf(dir, sizeof(dir), "%s/bk-small", t ? t->mnt : b->baseline);
		job = (struct small_job){ .mnt = t ? t->mnt : NULL, .dir = dir };
		progress("%s: %lu x create + write(%lu) + close%s, then read back and removed",
			 blabel[w], b->o.files, b->o.file_size,
			 t && t->nobody ? " (in a child as uid 65534)" : "");
		sync();
		if (w == B_BROKER && brokerd_status(b, &bs0) < 0) {
			errf("ferry-brokerd stopped answering --ping (see %s)", b->broker_log);
			return -1;
		}
		if (t) {
			char pid[32];

			tstats_str(b, t, "pid", pid, sizeof(pid));
			mountd = (pid_t)atoi(pid);
			cm0 = mountd > 0 ? proc_cpu_s(mountd) : -1;
		}
		if (w == B_BROKER)
			cb0 = proc_cpu_s(b->brokerd);
		if (t && t->nobody)
			rv = as_nobody(b, small_round, &job, &r, sizeof(r));
		else
			rv = small_round(b, &job, &r);
		if (rv < 0)
			return -1;
		if (mountd > 0)
			cm1 = proc_cpu_s(mountd);
		if (w == B_BROKER)
			cb1 = proc_cpu_s(b->brokerd);
		if (cm0 >= 0 && cm1 >= 0)
			row3_set(rcm, w, (cm1 - cm0) * 1e6 / n);
		if (cb0 >= 0 && cb1 >= 0)
			row3_set(rcb, w, (cb1 - cb0) * 1e6 / n);
		if (w == B_BROKER && brokerd_status(b, &bs1) < 0) {
			errf("ferry-brokerd stopped answering --ping (see %s)", b->broker_log);
			return -1;
		}
		row3_set(rf, w, n / r.sr.total);
		row3_set(rt, w, r.sr.total * 1e3);
		row3_set(ru, w, r.sr.total * 1e6 / n);
		row3_set(ro, w, r.sr.topen * 1e6 / n);
		row3_set(rw, w, r.sr.twrite * 1e6 / n);
		row3_set(rc, w, r.sr.tclose * 1e6 / n);
		b->bsmall_us[w] = r.sr.total * 1e6 / n;
		b->has_bsmall[w] = true;
		if (!t)
			continue;

		snprintf(name, sizeof(name), "%s: small files", t->tag);
		b->bsmall_phase[k] = phase_add(b, SUITE_BROKER, t, name, &r.s0, &r.s1, n, "file");
		if (b->bsmall_phase[k] >= 0) {
			const struct snap *d = &b->phases[b->bsmall_phase[k]].d;
			uint64_t wr = snap_get(d, "fuse_requests_write");
			uint64_t opens = snap_get(d, "passthrough_opens");
			uint64_t bo = snap_get(d, "backing_open");
			char act0[16], act1[16];

			row3_set(rq, w, (double)snap_requests(d) / n);
			row3_set(rbo, w, (double)bo / n);
			row3_set(rbc, w, (double)snap_get(d, "backing_close") / n);
			/* passthrough_active right after mount (in bstate) and now */
			if (sscanf(b->bstate[k], "passthrough_active %15[^,]", act0) != 1)
				snprintf(act0, sizeof(act0), "?");
			tstats_str(b, t, "passthrough_active", act1, sizeof(act1));
			b->bengaged[k] = !strcmp(act0, "1") && !strcmp(act1, "1") && wr == 0 &&
					 opens >= b->o.files && bo >= b->o.files;
			noteb(b, "%s: passthrough %s: passthrough_active %s at mount and %s after the "
			      "loop; passthrough_opens +%" PRIu64 ", backing_open +%" PRIu64
			      " for %lu files; %" PRIu64 " WRITE requests for %lu write() calls.",
			      blabel[w], b->bengaged[k] ? "ENGAGED" : "NOT ENGAGED", act0, act1, opens,
			      bo, b->o.files, wr, b->o.files);
		}
		if (w == B_BROKER) {
			uint64_t req = bs1.requests - bs0.requests;

			req = req >= ping_cost ? req - ping_cost : 0;
			row3_set(rbr, w, (double)req / n);
			noteb(b, "ferry-brokerd: %" PRIu64 " requests during the loop, its read-back and "
			      "removal (%.3f per file; one --ping costs %" PRIu64 "); refusals +%" PRIu64
			      "; %" PRIu64 " live backing ids and %" PRIu64 " fds just after.",
			      req, (double)req / n, ping_cost, bs1.refusals - bs0.refusals,
			      bs1.backing_ids, bs1.fds);
		}
		progress("broker suite: unmounting %s (waits for every upload)", t->mnt);
		if (ferry_umount(b, t, &tu) < 0)
			return -1;
		row3_set(rum, w, tu);
		if (w == B_BROKER) {
			if (brokerd_status(b, &bsend) < 0) {
				errf("ferry-brokerd stopped answering --ping (see %s)", b->broker_log);
				return -1;
			}
			noteb(b, "ferry-brokerd after the unmount: %" PRIu64 " mounts, %" PRIu64
			      " live backing ids, %" PRIu64 " fds (%" PRIu64 " before the mount), %"
			      PRIu64 " refusals in all.", bsend.mounts, bsend.backing_ids, bsend.fds,
			      bsb.fds, bsend.refusals);
			progress("broker suite: stopping ferry-brokerd");
			brokerd_stop(b);
		}
	}
	noteb(b, "data check: every small file read back (content and size) on each target, then "
	      "removed.");
	return 0;
}

/* ---- the compare suite (issue 10) ------------------------------------------------
 * Four columns, one after the other, each with the same workloads: the
 * staging filesystem itself (a plain directory), libfuse's passthrough_hp
 * example over a directory of the same filesystem, ferryfs mounted by root
 * (ferry-mountd registers its backing files itself) and ferryfs mounted by
 * uid 65534 through ferry-brokerd (the broker suite's volume and broker;
 * every workload of that column runs as uid 65534). A column's file system
 * is mounted for its turn only, so no background work of one (uploads,
 * garbage collection) runs under another's.
 */

static const char *const clabel[NC] = { "staging dir", "passthrough_hp", "ferry direct",
					"ferry broker" };

#define FUSE_SUPER_MAGIC 0x65735546
#define CMP_FILES_PER_DIR 50
#define CMP_DIRS_PER_TOP 10
#define CMP_QUIET_MAX_S 900.0

static void notec(struct bench *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void notec(struct bench *b, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vnote(b->notesc, &b->nnotesc, fmt, ap);
	va_end(ap);
}

static void rowc_init(struct bench *b, int r, const char *fmt, int better, const char *label, ...)
	__attribute__((format(printf, 5, 6)));
static void rowc_init(struct bench *b, int r, const char *fmt, int better, const char *label, ...)
{
	struct row4 *row = &b->rowsc[r];
	va_list ap;

	memset(row, 0, sizeof(*row));
	va_start(ap, label);
	vsnprintf(row->label, sizeof(row->label), label, ap);
	va_end(ap);
	row->fmt = fmt;
	row->better = better;
}

static void rowc_set(struct bench *b, int r, int w, double v)
{
	b->rowsc[r].v[w] = v;
	b->rowsc[r].has[w] = true;
}

static void cmp_rows_init(struct bench *b)
{
	static const char *const pname[CP_N] = {
		"git clone + checkout", "git status", "rm -rf of the checkout",
		"small files create+write+close", "rand write 4 KiB, existing file",
		"rand write 4 KiB + fdatasync, existing file",
	};
	static const char *const pper[CP_N] = { "file", "file", "file", "file", "write",
						"write+fdatasync" };

	rowc_init(b, CR_CLONE, "%.2f", -1, "git clone + checkout, %lu files (s)", b->o.files);
	rowc_init(b, CR_CLONE_REQ, "%.2f", 0, "  FUSE requests per file");
	rowc_init(b, CR_CLONE_DRAIN, "%.1f", 0, "  ferryfs uploads after it, drained (s, untimed)");
	rowc_init(b, CR_STATUS, "%.3f", -1, "git status in the checkout (s)");
	rowc_init(b, CR_STATUS_REQ, "%.2f", 0, "  FUSE requests per file");
	rowc_init(b, CR_RM, "%.2f", -1, "rm -rf of the checkout (s)");
	rowc_init(b, CR_RM_REQ, "%.2f", 0, "  FUSE requests per file");
	rowc_init(b, CR_SMALL, "%.1f", -1, "small files create+write(%lu)+close (us per file)",
		  b->o.file_size);
	rowc_init(b, CR_SMALL_FPS, "%.0f", 1, "  files per second");
	rowc_init(b, CR_SMALL_REQ, "%.2f", 0, "  FUSE requests per file");
	rowc_init(b, CR_SMALL_DRAIN, "%.1f", 0, "  ferryfs uploads after it, drained (s, untimed)");
	rowc_init(b, CR_RAND, "%.0f", 1, "rand write 4 KiB into an existing %lu MiB file (IOPS)",
		  b->o.rand_mib);
	rowc_init(b, CR_RAND_OPEN, "%.1f", 0, "  open() of the existing file (ms)");
	rowc_init(b, CR_RAND_CLOSE, "%.1f", 0, "  close() after the writes (ms)");
	rowc_init(b, CR_RAND_REQ, "%.3f", 0, "  FUSE requests per write");
	rowc_init(b, CR_SYNC, "%.0f", 1, "rand write 4 KiB + fdatasync, existing file (IOPS)");
	rowc_init(b, CR_SYNC_LAT, "%.2f", -1, "  per write + fdatasync (ms)");
	rowc_init(b, CR_SYNC_FIRST, "%.2f", 0, "  the first one (ms)");
	rowc_init(b, CR_SYNC_MED, "%.2f", -1, "  the median one (ms)");
	rowc_init(b, CR_SYNC_OPEN, "%.1f", 0, "  open() of the existing file (ms)");
	rowc_init(b, CR_SYNC_CLOSE, "%.1f", 0, "  close() after the writes (ms)");
	rowc_init(b, CR_SYNC_REQ, "%.3f", 0, "  FUSE requests per write+fdatasync");
	rowc_init(b, CR_SYNC_PUT, "%.2f", 0, "  ferryfs objects put per fdatasync");
	rowc_init(b, CR_SYNC_LOCAL, "%.0f", 1, "the same, ferryfs remounted -o fsync=local (IOPS)");
	rowc_init(b, CR_SYNC_LOCAL_LAT, "%.2f", -1, "  per write + fdatasync (ms)");
	rowc_init(b, CR_SYNC_LOCAL_FIRST, "%.2f", 0, "  the first one (ms)");
	rowc_init(b, CR_SYNC_LOCAL_MED, "%.2f", -1, "  the median one (ms)");
	/* On ferryfs it flushes the copy of the file (its durability must
	 * not wait for an fsync the daemon might never hear of). */
	rowc_init(b, CR_SYNC_LOCAL_OPEN, "%.1f", 0, "  open() of the existing file (ms)");
	rowc_init(b, CR_UMOUNT, "%.2f", 0, "`ferry umount` at the end of the turn (s)");
	for (int p = 0; p < CP_N; p++) {
		memset(&b->cphases[p], 0, sizeof(b->cphases[p]));
		b->cphases[p].name = pname[p];
		b->cphases[p].per_what = pper[p];
	}
}

/*
 * git's environment for the whole suite: no system or user configuration
 * (HOME is root's, unreadable to uid 65534), but a global one of ours that
 * trusts every repository (uid 65534 clones root's repository: git refuses
 * a repository another user owns otherwise, and a local clone drops -c and
 * GIT_CONFIG_* settings before it runs upload-pack), fixed names and dates
 * (the repository is the same in every run).
 */
static int cmp_git_env(struct bench *b)
{
	char *xdg = NULL, *cfg = NULL;
	int rc = -1;
	FILE *f;

	if (asprintf(&xdg, "%s/xdg", b->gitcfg) < 0 || asprintf(&cfg, "%s/config", b->gitcfg) < 0) {
		errf("out of memory");
		goto out;
	}
	if (mkdir_as(b->gitcfg, 0, 0, 0755) < 0 || mkdir_as(xdg, 0, 0, 0755) < 0)
		goto out;
	f = fopen(cfg, "we");
	if (!f || fputs("[safe]\n\tdirectory = *\n[init]\n\tdefaultBranch = main\n"
			"[advice]\n\tdetachedHead = false\n", f) < 0 || fclose(f) != 0) {
		errf("writing %s: %s", cfg, strerror(errno));
		goto out;
	}
	if (chmod(cfg, 0644) < 0 || setenv("GIT_CONFIG_NOSYSTEM", "1", 1) < 0 ||
	    setenv("GIT_CONFIG_GLOBAL", cfg, 1) < 0 || setenv("XDG_CONFIG_HOME", xdg, 1) < 0 ||
	    setenv("GIT_AUTHOR_NAME", "ferry bench", 1) < 0 ||
	    setenv("GIT_AUTHOR_EMAIL", "bench@ferryfs.invalid", 1) < 0 ||
	    setenv("GIT_AUTHOR_DATE", "2000-01-01T00:00:00Z", 1) < 0 ||
	    setenv("GIT_COMMITTER_NAME", "ferry bench", 1) < 0 ||
	    setenv("GIT_COMMITTER_EMAIL", "bench@ferryfs.invalid", 1) < 0 ||
	    setenv("GIT_COMMITTER_DATE", "2000-01-01T00:00:00Z", 1) < 0 ||
	    setenv("GIT_TERMINAL_PROMPT", "0", 1) < 0 || setenv("LC_ALL", "C", 1) < 0) {
		errf("setting git's environment: %s", strerror(errno));
		goto out;
	}
	rc = 0;
out:
	free(xdg);
	free(cfg);
	return rc;
}

static int git_in(const char *dir, const char *what, char *const args[])
{
	char *argv[16] = { "git", "-C", (char *)dir };
	int n = 3, rc;

	for (int i = 0; args[i] && n < 15; i++)
		argv[n++] = args[i];
	argv[n] = NULL;
	rc = run_cmd_as(argv, true, false);
	if (rc != 0) {
		errf("git %s in %s failed (exit %d)", what, dir, rc);
		return -1;
	}
	return 0;
}

/*
 * The repository every column clones, generated (untimed) the same way in
 * every run: --files files in directories of 50, ten directories to a top
 * directory (10,000 files: 200 + 20 directories), each file lines of hex
 * digits from the seed, sizes spread evenly from half to one and a half
 * times --file-size; committed, then packed (a local clone copies one pack
 * instead of every loose object).
 */
static int cmp_make_repo(struct bench *b)
{
	uint64_t seed = b->o.seed ^ 0x676974726570ull, content = 0;
	unsigned long n = b->o.files, ndirs = 0;
	char *init[] = { "init", "-q", NULL }, *add[] = { "add", "-A", NULL };
	char *commit[] = { "commit", "-q", "-m", "generated by ferry_bench", NULL };
	char *repack[] = { "repack", "-a", "-d", "-q", NULL };
	char *head[] = { "git", "-C", b->gitsrc, "rev-parse", "--short", "HEAD", NULL };
	char path[PATH_MAX], hash[64];
	double t0 = now_s();

	if (mkdir_as(b->gitsrc, 0, 0, 0755) < 0)
		return -1;
	for (unsigned long i = 0; i < n; i++) {
		unsigned long leaf = i / CMP_FILES_PER_DIR, top = leaf / CMP_DIRS_PER_TOP;
		size_t size = b->o.file_size / 2 + (size_t)(xorshift64(&seed) % (b->o.file_size + 1));
		int fd;

		if (i % CMP_FILES_PER_DIR == 0) {
			if (leaf % CMP_DIRS_PER_TOP == 0) {
				snprintf(path, sizeof(path), "%s/t%03lu", b->gitsrc, top);
				if (mkdir_as(path, 0, 0, 0755) < 0)
					return -1;
				ndirs++;
			}
			snprintf(path, sizeof(path), "%s/t%03lu/d%03lu", b->gitsrc, top, leaf);
			if (mkdir_as(path, 0, 0, 0755) < 0)
				return -1;
			ndirs++;
		}
		for (size_t k = 0; k < size; k += 64) {
			uint64_t v = xorshift64(&seed);

			for (size_t j = 0; j < 64 && k + j < size; j++)
				b->buf[k + j] = j == 63 ? '\n' : "0123456789abcdef"[(v >> (j % 16 * 4)) & 15];
		}
		snprintf(path, sizeof(path), "%s/t%03lu/d%03lu/f%07lu.txt", b->gitsrc, top, leaf, i);
		fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
		if (fd < 0 || write_full(fd, b->buf, size) < 0 || close(fd) < 0) {
			errf("writing %s: %s", path, strerror(errno));
			if (fd >= 0)
				close(fd);
			return -1;
		}
		content += size;
	}
	if (git_in(b->gitsrc, "init", init) < 0 || git_in(b->gitsrc, "add", add) < 0 ||
	    git_in(b->gitsrc, "commit", commit) < 0 || git_in(b->gitsrc, "repack", repack) < 0)
		return -1;
	if (run_capture(head, hash, sizeof(hash)) != 0)
		snprintf(hash, sizeof(hash), "?");
	hash[strcspn(hash, "\n")] = '\0';
	notec(b, "repository: %lu files (%.1f MiB) in %lu directories, commit %s, one pack; "
	      "generated in %.1f s (untimed) at %s.", n, (double)content / (double)MIB, ndirs, hash,
	      now_s() - t0, b->gitsrc);
	return 0;
}

/*
 * Waits until ferryfs has nothing handed over, uploading or waiting for a
 * commit, so that a step's uploads do not run under the next step's clock.
 * *secs: how long that took.
 */
static int ferry_quiet(const char *mnt, double *secs)
{
	static const char *const gauges[] = {
		"reconcile_handed_inflight", "reconcile_inflight", "passthrough_staging_blocks",
		"pending_commits",
	};
	char path[PATH_MAX], line[512], busy[64];
	double t0 = now_s();

	snprintf(path, sizeof(path), "%s/.stats", mnt);
	for (;;) {
		FILE *f = fopen(path, "re");

		if (!f) {
			errf("open %s: %s", path, strerror(errno));
			return -1;
		}
		busy[0] = '\0';
		while (fgets(line, sizeof(line), f)) {
			for (size_t i = 0; i < sizeof(gauges) / sizeof(gauges[0]); i++) {
				size_t nl = strlen(gauges[i]);

				if (strncmp(line, gauges[i], nl) == 0 && line[nl] == ' ' &&
				    strtoull(line + nl + 1, NULL, 10) != 0)
					snprintf(busy, sizeof(busy), "%s", gauges[i]);
			}
		}
		fclose(f);
		*secs = now_s() - t0;
		if (!busy[0])
			return 0;
		if (*secs > CMP_QUIET_MAX_S) {
			errf("%s: %s still not 0 after %.0f s", mnt, busy, CMP_QUIET_MAX_S);
			return -1;
		}
		usleep(50 * 1000);
	}
}

/* One column's turn: what every step needs to know. */
struct cmp_ctx {
	int w;
	const char *root;       /* the directory the column's files go in */
	struct counter ctr;     /* its request counts (none: nothing to count) */
	bool ferry;             /* ferryfs: wait until it is quiet before each step */
	bool nobody;            /* run every step as uid 65534 */
	bool counting;          /* passthrough_hp's untimed run with --debug-fuse */
	/* the random-write steps */
	bool sync_each;
	double seconds;
	unsigned long max_ops;
};

struct step_out {
	double secs, topen, tclose;
	double first_ms, median_ms; /* rand_res's */
	double drained;         /* ferryfs: the wait for quiet before the step */
	unsigned long ops;
	struct snap s0, smid, s1;
};

/* Before each step (untimed): the previous step's writes on disk and, on
 * ferryfs, its uploads committed. */
static int cmp_settle(const struct cmp_ctx *c, struct step_out *o)
{
	sync();
	if (c->ferry && ferry_quiet(c->ctr.mnt, &o->drained) < 0)
		return -1;
	return 0;
}

static void cmp_clone_path(const struct cmp_ctx *c, char *out, size_t len)
{
	snprintf(out, len, "%s/cmp-clone", c->root);
}

static int step_clone(struct bench *b, void *arg, void *out)
{
	const struct cmp_ctx *c = arg;
	struct step_out *o = out;
	char dst[PATH_MAX];
	char *argv[] = { "git", "clone", "-q", "--no-hardlinks", b->gitsrc, dst, NULL };
	double t0;
	int rc;

	/* --no-hardlinks: on the staging dir (the source's filesystem) git
	 * would link the pack instead of copying it as it must elsewhere. */
	cmp_clone_path(c, dst, sizeof(dst));
	if (cmp_settle(c, o) < 0 || counter_snap(&c->ctr, &o->s0) < 0)
		return -1;
	t0 = now_s();
	rc = run_cmd_as(argv, true, false);
	o->secs = now_s() - t0;
	if (rc != 0) {
		errf("git clone %s %s failed (exit %d)", b->gitsrc, dst, rc);
		return -1;
	}
	return counter_snap(&c->ctr, &o->s1);
}

/* verify_tree's state for nftw's callbacks (nftw passes no argument). */
static struct {
	struct bench *b;
	size_t src_len;
	const char *dst;
	unsigned long files;
	bool failed;
} g_tree;

static int tree_cmp_one(const char *path, const struct stat *st, int type, struct FTW *ftw)
{
	char other[PATH_MAX];

	(void)st;
	if (type == FTW_D && strcmp(path + ftw->base, ".git") == 0)
		return FTW_SKIP_SUBTREE;
	if (type != FTW_F)
		return FTW_CONTINUE;
	g_tree.files++;
	if (g_tree.dst) {
		snprintf(other, sizeof(other), "%s%s", g_tree.dst, path + g_tree.src_len);
		if (compare_files(g_tree.b, path, other) < 0) {
			g_tree.failed = true;
			return FTW_STOP;
		}
	}
	return FTW_CONTINUE;
}

/* Regular files under dir, .git left out (-1 on error); with dst, each is
 * compared byte for byte with its namesake under dst. */
static long tree_walk(struct bench *b, const char *dir, const char *dst)
{
	g_tree.b = b;
	g_tree.src_len = strlen(dir);
	g_tree.dst = dst;
	g_tree.files = 0;
	g_tree.failed = false;
	if (nftw(dir, tree_cmp_one, 32, FTW_PHYS | FTW_ACTIONRETVAL) != 0 || g_tree.failed) {
		if (!g_tree.failed)
			errf("walking %s failed: %s", dir, strerror(errno));
		return -1;
	}
	return (long)g_tree.files;
}

/* The checkout holds exactly the repository's files, byte for byte (untimed). */
static int verify_checkout(struct bench *b, const char *dst)
{
	long n_src = tree_walk(b, b->gitsrc, dst), n_dst;

	if (n_src < 0)
		return -1;
	n_dst = tree_walk(b, dst, NULL);
	if (n_dst < 0)
		return -1;
	if (n_src != (long)b->o.files || n_dst != n_src) {
		errf("WRONG CHECKOUT: %s has %ld files, the repository %ld (%lu generated)", dst,
		     n_dst, n_src, b->o.files);
		b->data_errors++;
		return -1;
	}
	return 0;
}

static int step_status(struct bench *b, void *arg, void *out)
{
	const struct cmp_ctx *c = arg;
	struct step_out *o = out;
	char dst[PATH_MAX];
	char *argv[] = { "git", "-C", dst, "status", NULL };
	double t0;
	int rc;

	cmp_clone_path(c, dst, sizeof(dst));
	if (cmp_settle(c, o) < 0 || counter_snap(&c->ctr, &o->s0) < 0)
		return -1;
	t0 = now_s();
	rc = run_cmd_as(argv, true, false);
	o->secs = now_s() - t0;
	if (rc != 0) {
		errf("git status in %s failed (exit %d)", dst, rc);
		return -1;
	}
	if (counter_snap(&c->ctr, &o->s1) < 0)
		return -1;
	return c->counting ? 0 : verify_checkout(b, dst);
}

static int step_rm(struct bench *b, void *arg, void *out)
{
	const struct cmp_ctx *c = arg;
	struct step_out *o = out;
	char dst[PATH_MAX];
	char *argv[] = { "rm", "-rf", dst, NULL };
	struct stat st;
	double t0;
	int rc;

	cmp_clone_path(c, dst, sizeof(dst));
	if (cmp_settle(c, o) < 0 || counter_snap(&c->ctr, &o->s0) < 0)
		return -1;
	t0 = now_s();
	rc = run_cmd_as(argv, true, false);
	o->secs = now_s() - t0;
	if (rc != 0) {
		errf("rm -rf %s failed (exit %d)", dst, rc);
		return -1;
	}
	if (lstat(dst, &st) == 0 || errno != ENOENT) {
		errf("%s is still there after rm -rf", dst);
		return -1;
	}
	return counter_snap(&c->ctr, &o->s1);
}

static int step_small(struct bench *b, void *arg, void *out)
{
	const struct cmp_ctx *c = arg;
	struct step_out *o = out;
	struct small_res sr;
	char dir[PATH_MAX];

	snprintf(dir, sizeof(dir), "%s/cmp-small", c->root);
	if (cmp_settle(c, o) < 0 || counter_snap(&c->ctr, &o->s0) < 0 ||
	    small_files(b, dir, &sr) < 0 || counter_snap(&c->ctr, &o->s1) < 0)
		return -1;
	o->secs = sr.total;
	if (!c->counting && small_verify(b, dir, 1) < 0)
		return -1;
	return small_remove(b, dir);
}

static int step_rand(struct bench *b, void *arg, void *out)
{
	const struct cmp_ctx *c = arg;
	struct step_out *o = out;
	uint64_t bytes = (uint64_t)b->o.rand_mib * MIB;
	struct rand_res r;
	char path[PATH_MAX];

	snprintf(path, sizeof(path), "%s/%s", c->root, c->sync_each ? "cmp-sync.dat" : "cmp-rand.dat");
	if (cmp_settle(c, o) < 0 ||
	    rand_run(b, &c->ctr, path, bytes, c->seconds, c->max_ops, c->sync_each, true, &o->s0,
		     &o->smid, &o->s1, &r) < 0)
		return -1;
	o->secs = r.twrite;
	o->topen = r.topen;
	o->tclose = r.tclose;
	o->first_ms = r.first_ms;
	o->median_ms = r.median_ms;
	o->ops = r.ops;
	if (!c->counting && rand_check(b, path, bytes, r.ops) < 0)
		return -1;
	return unlink_checked(path);
}

static int cmp_step(struct bench *b, const struct cmp_ctx *c,
		    int (*fn)(struct bench *b, void *arg, void *out), struct step_out *o)
{
	memset(o, 0, sizeof(*o));
	if (c->nobody)
		return as_nobody(b, fn, (void *)c, o, sizeof(*o));
	return fn(b, (void *)c, o);
}

static struct target *cmp_target(struct bench *b, int w)
{
	return w == C_DIRECT ? &b->t[T_DIRECT] : w == C_BROKER ? &b->t[T_BROKER] : NULL;
}

/* A step's request counts (and ferryfs figures), divided by per in the
 * *_REQ row req (-1: none). */
static void cmp_record(struct bench *b, const struct cmp_ctx *c, int phase, int req,
		       const struct snap *before, const struct snap *after, double per)
{
	struct cphase *p = &b->cphases[phase];
	struct target *t = cmp_target(b, c->w);

	if (!c->ctr.mnt && !c->ctr.log)
		return;
	snap_diff(after, before, t ? &t->overhead : NULL, &p->d[c->w]);
	p->per[c->w] = per;
	p->has[c->w] = per > 0;
	if (req >= 0 && per > 0)
		rowc_set(b, req, c->w, (double)snap_requests(&p->d[c->w]) / per);
}

/*
 * One column's workloads, in order: git clone, git status (then the checkout
 * compared with the repository), rm -rf, the small-file loop, random writes
 * into an existing file, and the same with fdatasync. In the counting run
 * only the request counts are kept.
 */
static int cmp_turn(struct bench *b, struct cmp_ctx *c)
{
	const char *lab = clabel[c->w];
	double n = (double)b->o.files;
	struct step_out o;
	bool timed = !c->counting;

	progress("%s: git clone of the %lu-file repository%s", lab, b->o.files,
		 c->nobody ? " (as uid 65534)" : "");
	if (cmp_step(b, c, step_clone, &o) < 0)
		return -1;
	cmp_record(b, c, CP_CLONE, CR_CLONE_REQ, &o.s0, &o.s1, n);
	if (timed)
		rowc_set(b, CR_CLONE, c->w, o.secs);

	progress("%s: git status, then the checkout compared with the repository (untimed)", lab);
	if (cmp_step(b, c, step_status, &o) < 0)
		return -1;
	cmp_record(b, c, CP_STATUS, CR_STATUS_REQ, &o.s0, &o.s1, n);
	if (timed) {
		rowc_set(b, CR_STATUS, c->w, o.secs);
		if (c->ferry)
			rowc_set(b, CR_CLONE_DRAIN, c->w, o.drained);
	}

	progress("%s: rm -rf of the checkout", lab);
	if (cmp_step(b, c, step_rm, &o) < 0)
		return -1;
	cmp_record(b, c, CP_RM, CR_RM_REQ, &o.s0, &o.s1, n);
	if (timed)
		rowc_set(b, CR_RM, c->w, o.secs);

	progress("%s: %lu x create + write(%lu) + close, then read back and removed", lab,
		 b->o.files, b->o.file_size);
	if (cmp_step(b, c, step_small, &o) < 0)
		return -1;
	cmp_record(b, c, CP_SMALL, CR_SMALL_REQ, &o.s0, &o.s1, n);
	if (timed) {
		rowc_set(b, CR_SMALL, c->w, o.secs * 1e6 / n);
		rowc_set(b, CR_SMALL_FPS, c->w, n / o.secs);
	}
	if (c->ferry && timed) {
		const struct snap *d = &b->cphases[CP_SMALL].d[c->w];

		notec(b, "%s small files: passthrough_opens +%" PRIu64 ", %" PRIu64
		      " WRITE requests for %lu files.", lab, snap_get(d, "passthrough_opens"),
		      snap_get(d, "fuse_requests_write"), b->o.files);
	}

	c->sync_each = false;
	c->seconds = timed ? b->o.seconds : 0;
	c->max_ops = timed ? b->o.rand_max_ops : b->pthp_rand_ops;
	progress("%s: 4 KiB random writes %s into a %lu MiB file laid out, closed and opened "
		 "again", lab, timed ? "for the set time" : "(as many as timed)", b->o.rand_mib);
	if (cmp_step(b, c, step_rand, &o) < 0)
		return -1;
	cmp_record(b, c, CP_RAND, CR_RAND_REQ, &o.s0, &o.smid, (double)o.ops);
	if (timed) {
		rowc_set(b, CR_RAND, c->w, (double)o.ops / o.secs);
		rowc_set(b, CR_RAND_OPEN, c->w, o.topen * 1e3);
		rowc_set(b, CR_RAND_CLOSE, c->w, o.tclose * 1e3);
		if (c->ferry)
			rowc_set(b, CR_SMALL_DRAIN, c->w, o.drained);
		if (c->w == C_PTHP)
			b->pthp_rand_ops = o.ops;
		notec(b, "%s rand write: %lu writes in %.2f s.", lab, o.ops, o.secs);
	}
	if (c->ferry && timed) {
		const struct snap *d = &b->cphases[CP_RAND].d[c->w];

		notec(b, "%s rand write: %" PRIu64 " WRITE requests for %lu writes (passthrough %s).",
		      lab, snap_get(d, "fuse_requests_write"), o.ops,
		      snap_get(d, "fuse_requests_write") == 0 ? "engaged" : "NOT ENGAGED");
	}

	c->sync_each = true;
	c->seconds = 0;
	c->max_ops = b->o.sync_ops;
	progress("%s: %lu x (4 KiB pwrite + fdatasync) into a %lu MiB file laid out, closed and "
		 "opened again", lab, b->o.sync_ops, b->o.rand_mib);
	if (cmp_step(b, c, step_rand, &o) < 0)
		return -1;
	cmp_record(b, c, CP_SYNC, CR_SYNC_REQ, &o.s0, &o.smid, (double)o.ops);
	if (timed) {
		rowc_set(b, CR_SYNC, c->w, (double)o.ops / o.secs);
		rowc_set(b, CR_SYNC_LAT, c->w, o.secs * 1e3 / (double)o.ops);
		rowc_set(b, CR_SYNC_FIRST, c->w, o.first_ms);
		rowc_set(b, CR_SYNC_MED, c->w, o.median_ms);
		rowc_set(b, CR_SYNC_OPEN, c->w, o.topen * 1e3);
		rowc_set(b, CR_SYNC_CLOSE, c->w, o.tclose * 1e3);
		if (c->ferry)
			rowc_set(b, CR_SYNC_PUT, c->w,
				 (double)snap_get(&b->cphases[CP_SYNC].d[c->w], "objects_put") /
					 (double)o.ops);
		else {
			/* Their fdatasync is local whatever ferryfs's mode: the
			 * fsync=local row compares with the same figures. */
			rowc_set(b, CR_SYNC_LOCAL, c->w, (double)o.ops / o.secs);
			rowc_set(b, CR_SYNC_LOCAL_LAT, c->w, o.secs * 1e3 / (double)o.ops);
			rowc_set(b, CR_SYNC_LOCAL_FIRST, c->w, o.first_ms);
			rowc_set(b, CR_SYNC_LOCAL_MED, c->w, o.median_ms);
			rowc_set(b, CR_SYNC_LOCAL_OPEN, c->w, o.topen * 1e3);
		}
	}
	return 0;
}

/*
 * The write+fdatasync row again on a ferryfs column remounted -o fsync=local
 * (fdatasync makes the data durable on the node, as on a local file system;
 * uploaded after close): the like-for-like comparison with the others, whose
 * fdatasync never leaves the machine. The mount stays so for the rest of
 * the turn.
 */
static int cmp_sync_local(struct bench *b, struct cmp_ctx *c, struct target *t)
{
	struct step_out o;

	progress("%s: remounting -o fsync=local; the write+fdatasync row again", clabel[c->w]);
	if (ferry_umount(b, t, NULL) < 0)
		return -1;
	t->mount_o = "fsync=local";
	if (ferry_mount(b, t) < 0)
		return -1;
	c->sync_each = true;
	c->seconds = 0;
	c->max_ops = b->o.sync_ops;
	if (cmp_step(b, c, step_rand, &o) < 0)
		return -1;
	rowc_set(b, CR_SYNC_LOCAL, c->w, (double)o.ops / o.secs);
	rowc_set(b, CR_SYNC_LOCAL_LAT, c->w, o.secs * 1e3 / (double)o.ops);
	rowc_set(b, CR_SYNC_LOCAL_FIRST, c->w, o.first_ms);
	rowc_set(b, CR_SYNC_LOCAL_MED, c->w, o.median_ms);
	rowc_set(b, CR_SYNC_LOCAL_OPEN, c->w, o.topen * 1e3);
	{
		struct snap d;

		snap_diff(&o.smid, &o.s0, &t->overhead, &d);
		notec(b, "%s, fsync=local: %.3f FUSE requests and %.2f objects put per "
		      "write+fdatasync.", clabel[c->w], (double)snap_requests(&d) / (double)o.ops,
		      (double)snap_get(&d, "objects_put") / (double)o.ops);
	}
	return 0;
}

/*
 * Starts passthrough_hp SCRATCH/pthp-src MNT-ROOT/mnt-pthp in the foreground
 * as our child (its output to a log; with debug, --debug-fuse and the log
 * truncated first) and waits until the mount answers. It gets SIGTERM should
 * we die (it unmounts then); its pid goes to --pthp-pidfile for
 * scripts/bench. On failure *why says what went wrong.
 */
static int pthp_start(struct bench *b, bool debug, char *why, size_t whylen)
{
	pid_t parent = getpid();
	struct statfs sf;
	int st;

	if (mkdir_as(b->pthp_src, 0, 0, 0755) < 0 || mkdir_as(b->pthp_mnt, 0, 0, 0755) < 0) {
		snprintf(why, whylen, "cannot make its directories");
		return -1;
	}
	fflush(stdout);
	b->pthp = fork();
	if (b->pthp < 0) {
		snprintf(why, whylen, "fork: %s", strerror(errno));
		b->pthp = 0;
		return -1;
	}
	if (b->pthp == 0) {
		int fd = open(b->pthp_log, O_WRONLY | O_CREAT | O_CLOEXEC | (debug ? O_TRUNC : O_APPEND),
			      0644);

		if (fd < 0 || dup2(fd, STDOUT_FILENO) < 0 || dup2(fd, STDERR_FILENO) < 0)
			_exit(127);
		if (prctl(PR_SET_PDEATHSIG, SIGTERM) < 0 || getppid() != parent)
			_exit(125);
		if (debug)
			execl(b->o.pthp, "passthrough_hp", "--foreground", "--debug-fuse", b->pthp_src,
			      b->pthp_mnt, (char *)NULL);
		else
			execl(b->o.pthp, "passthrough_hp", "--foreground", b->pthp_src, b->pthp_mnt,
			      (char *)NULL);
		fprintf(stderr, "ferry_bench: exec %s: %s\n", b->o.pthp, strerror(errno));
		_exit(127);
	}
	if (b->o.pthp_pidfile) {
		FILE *f = fopen(b->o.pthp_pidfile, "we");

		if (f) {
			fprintf(f, "%d\n", (int)b->pthp);
			fclose(f);
		}
	}
	for (int i = 0; i < 500; i++) {
		if (statfs(b->pthp_mnt, &sf) == 0 && sf.f_type == FUSE_SUPER_MAGIC)
			return 0;
		if (waitpid(b->pthp, &st, WNOHANG) == b->pthp) {
			b->pthp = 0;
			snprintf(why, whylen, "passthrough_hp exited at start (status %d; see %s)",
				 WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st), b->pthp_log);
			return -1;
		}
		usleep(20 * 1000);
	}
	snprintf(why, whylen, "passthrough_hp did not mount %s within 10 s (see %s)", b->pthp_mnt,
		 b->pthp_log);
	return -1;
}

static bool fuse_mounted_at(const char *dir)
{
	struct statfs sf;

	return statfs(dir, &sf) == 0 && sf.f_type == FUSE_SUPER_MAGIC;
}

/* Unmounts (lazily if it stays busy for 5 s) and reaps passthrough_hp
 * (SIGTERM after 10 s, SIGKILL after 5 more). */
static void pthp_stop(struct bench *b)
{
	int st;

	if (b->pthp <= 0)
		return;
	for (int i = 0; i < 50 && fuse_mounted_at(b->pthp_mnt); i++) {
		if (umount2(b->pthp_mnt, 0) == 0 || errno == EINVAL)
			break;
		usleep(100 * 1000);
	}
	if (fuse_mounted_at(b->pthp_mnt)) {
		errf("%s stays busy; detaching it", b->pthp_mnt);
		umount2(b->pthp_mnt, MNT_DETACH);
	}
	for (int i = 0; i < 750; i++) {
		if (waitpid(b->pthp, &st, WNOHANG) == b->pthp) {
			b->pthp = 0;
			return;
		}
		if (i == 500) {
			errf("passthrough_hp (pid %d) still runs 10 s after the unmount; SIGTERM",
			     (int)b->pthp);
			kill(b->pthp, SIGTERM);
		}
		usleep(20 * 1000);
	}
	errf("passthrough_hp (pid %d) ignored SIGTERM; killing it", (int)b->pthp);
	kill(b->pthp, SIGKILL);
	waitpid(b->pthp, &st, 0);
	b->pthp = 0;
}

/* A failure in the passthrough_hp column empties it (with the reason) but
 * is not ours: the rest runs. */
static void pthp_fail(struct bench *b, const char *why)
{
	snprintf(b->pthp_off, sizeof(b->pthp_off), "%s", why);
	for (int r = 0; r < CR_N; r++)
		b->rowsc[r].has[C_PTHP] = false;
	pthp_stop(b);
}

static int cmp_column(struct bench *b, int w)
{
	struct cmp_ctx c = { .w = w };
	struct target *t = cmp_target(b, w);
	char why[256];
	double tu;

	switch (w) {
	case C_DIR:
		c.root = b->baseline;
		snprintf(b->cstate[w], sizeof(b->cstate[w]), "%s", b->baseline);
		return cmp_turn(b, &c);
	case C_PTHP:
		if (b->pthp_off[0])
			return 0;
		progress("compare suite: starting passthrough_hp %s %s", b->pthp_src, b->pthp_mnt);
		if (pthp_start(b, false, why, sizeof(why)) < 0) {
			pthp_fail(b, why);
			return 0;
		}
		snprintf(b->cstate[w], sizeof(b->cstate[w]), "%s --foreground %s %s", b->o.pthp,
			 b->pthp_src, b->pthp_mnt);
		c.root = b->pthp_mnt;
		if (cmp_turn(b, &c) < 0) {
			pthp_fail(b, "a workload failed on it (see the errors on stderr)");
			return 0;
		}
		pthp_stop(b);
		return 0;
	default:
		break;
	}
	if (w == C_BROKER) {
		progress("compare suite: starting ferry-brokerd on %s", b->broker_sock);
		if (brokerd_start(b) < 0)
			return -1;
	}
	progress("compare suite: mounting %s at %s%s", t->volume, t->mnt,
		 t->nobody ? " as uid 65534 through ferry-brokerd" : " as root");
	if (ferry_mount(b, t) < 0)
		return -1;
	{
		char act[16], wb[16], up[16] = "";

		tstats_str(b, t, "passthrough_active", act, sizeof(act));
		tstats_str(b, t, "writeback_cache", wb, sizeof(wb));
		if (t->broker)
			tstats_str(b, t, "broker_up", up, sizeof(up));
		snprintf(b->cstate[w], sizeof(b->cstate[w]),
			 "passthrough_active %s, writeback_cache %s%s%s", act, wb,
			 *up ? ", broker_up " : "", up);
	}
	c.root = t->mnt;
	c.ctr.mnt = t->mnt;
	c.ferry = true;
	c.nobody = t->nobody;
	if (cmp_turn(b, &c) < 0 || cmp_sync_local(b, &c, t) < 0)
		return -1;
	progress("compare suite: unmounting %s", t->mnt);
	if (ferry_umount(b, t, &tu) < 0)
		return -1;
	t->mount_o = NULL;
	rowc_set(b, CR_UMOUNT, w, tu);
	if (w == C_BROKER) {
		progress("compare suite: stopping ferry-brokerd");
		brokerd_stop(b);
	}
	return 0;
}

/*
 * passthrough_hp's request counts: a second turn, untimed, with --debug-fuse
 * (libfuse logs every request; that costs time, so the timed turn runs
 * without it). The random writes are as many as in the timed turn, at most
 * 100,000.
 */
static void cmp_pthp_count(struct bench *b)
{
	struct cmp_ctx c = { .w = C_PTHP, .counting = true };
	char why[256];

	if (b->pthp_off[0])
		return;
	if (b->pthp_rand_ops == 0 || b->pthp_rand_ops > 100000)
		b->pthp_rand_ops = 100000;
	b->pthp_dlog.off = 0;
	b->pthp_dlog.total.n = 0;
	b->pthp_dlog.path = b->pthp_log;
	progress("compare suite: passthrough_hp again with --debug-fuse, to count its requests "
		 "(untimed)");
	if (pthp_start(b, true, why, sizeof(why)) < 0) {
		notec(b, "passthrough_hp's request counts: none (%s).", why);
		return;
	}
	c.root = b->pthp_mnt;
	c.ctr.log = &b->pthp_dlog;
	if (cmp_turn(b, &c) < 0) {
		notec(b, "passthrough_hp's request counts: none (the counting run failed; see stderr).");
		for (int p = 0; p < CP_N; p++)
			b->cphases[p].has[C_PTHP] = false;
		for (int r = 0; r < CR_N; r++)
			if (strstr(b->rowsc[r].label, "FUSE requests"))
				b->rowsc[r].has[C_PTHP] = false;
		pthp_stop(b);
		return;
	}
	pthp_stop(b);
	b->pthp_counted = true;
}

static int suite_compare(struct bench *b)
{
	b->ran_cmp = true;
	cmp_rows_init(b);
	if (!b->o.pthp)
		snprintf(b->pthp_off, sizeof(b->pthp_off), "%s",
			 b->o.pthp_missing ? b->o.pthp_missing : "no --pthp given");
	progress("compare suite: generating the %lu-file git repository (untimed)", b->o.files);
	if (cmp_git_env(b) < 0 || cmp_make_repo(b) < 0)
		return -1;
	for (int w = 0; w < NC; w++)
		if (cmp_column(b, w) < 0)
			return -1;
	cmp_pthp_count(b);
	return 0;
}

/* ---- output -------------------------------------------------------------- */

static void fmt_val(char *out, size_t len, const char *fmt, bool has, double v)
{
	if (!has)
		snprintf(out, len, "-");
	else
		snprintf(out, len, fmt, v);
}

/* num/den with a precision that suits its size; "-" when either is missing. */
static void fmt_q(char *out, size_t len, bool has, double num, double den)
{
	double q;

	if (!has || den <= 0 || num < 0) {
		snprintf(out, len, "-");
		return;
	}
	q = num / den;
	if (q >= 100)
		snprintf(out, len, "%.0f", q);
	else if (q >= 10)
		snprintf(out, len, "%.1f", q);
	else if (q >= 0.1)
		snprintf(out, len, "%.2f", q);
	else
		snprintf(out, len, "%.2g", q);
}

static void fmt_ratio(char *out, size_t len, const struct row *r)
{
	fmt_q(out, len, r->has_f && r->has_b, r->f, r->b);
}

/* Prints " arg", single-quoted for a shell when it needs to be. */
static void print_quoted(const char *arg)
{
	if (*arg && strspn(arg, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
			   "0123456789_./=:,+-@%") == strlen(arg)) {
		printf(" %s", arg);
		return;
	}
	printf(" '");
	for (const char *p = arg; *p; p++) {
		if (*p == '\'')
			printf("'\\''");
		else
			putchar(*p);
	}
	putchar('\'');
}


static void print_phases(struct bench *b, int suite)
{
	static const char *const key_ops[] = {
		"write", "getxattr", "lookup", "create", "flush", "release", "getattr",
	};

	for (size_t i = 0; i < b->nphases; i++) {
		struct phase *p = &b->phases[i];
		int col = 0;

		if (p->suite != suite)
			continue;
		printf("  %-30s", p->name);
		for (size_t k = 0; k < p->d.n; k++) {
			const char *nm = p->d.name[k];
			if (strncmp(nm, "fuse_requests_", 14) != 0 || p->d.val[k] == 0)
				continue;
			if (col && col % 6 == 0)
				printf("\n  %-30s", "");
			printf(" %s=%" PRIu64, nm + 14, p->d.val[k]);
			col++;
		}
		if (!col)
			printf(" (no FUSE requests)");
		printf("\n  %-30s", "");
		col = 0;
		for (size_t k = 0; k < p->d.n; k++) {
			const char *nm = p->d.name[k];
			if (strncmp(nm, "fuse_requests_", 14) == 0 || p->d.val[k] == 0)
				continue;
			if (col && col % 5 == 0)
				printf("\n  %-30s", "");
			printf(" %s=%" PRIu64, nm, p->d.val[k]);
			col++;
		}
		if (!col)
			printf(" (no store/cache activity)");
		printf("\n");
		if (p->per > 0) {
			char nm[64];

			printf("  %-30s per %s:", "", p->per_what);
			for (size_t k = 0; k < sizeof(key_ops) / sizeof(key_ops[0]); k++) {
				snprintf(nm, sizeof(nm), "fuse_requests_%s", key_ops[k]);
				printf(" %s=%.3f", key_ops[k], (double)snap_get(&p->d, nm) / p->per);
			}
			/* Any other opcode that showed up. */
			for (size_t k = 0; k < p->d.n; k++) {
				const char *n2 = p->d.name[k];
				bool listed = false;
				if (strncmp(n2, "fuse_requests_", 14) != 0 || p->d.val[k] == 0)
					continue;
				for (size_t j = 0; j < sizeof(key_ops) / sizeof(key_ops[0]); j++)
					if (strcmp(n2 + 14, key_ops[j]) == 0)
						listed = true;
				if (!listed)
					printf(" %s=%.3f", n2 + 14, (double)p->d.val[k] / p->per);
			}
			printf("\n");
		}
	}
}

static void print_header(struct bench *b, int argc, char **argv)
{
	printf("\nferryfs benchmark\n");
	if (b->o.command)
		printf("command: %s\n", b->o.command);
	printf("ran:    ");
	for (int i = 0; i < argc; i++)
		print_quoted(argv[i]);
	printf("\n");
	if (b->o.source_desc)
		printf("source: %s\n", b->o.source_desc);
	if (b->o.scratch_desc)
		printf("scratch filesystem (plain directory, ferryfs stores/caches/staging/metadata): %s\n",
		       b->o.scratch_desc);
	printf("sizes: seq file %lu MiB in 1 MiB blocks; random writes 4 KiB into a %lu MiB file "
	       "for %.0f s per target; write+fdatasync: %lu into a %lu MiB file; %lu files of %lu bytes\n",
	       b->o.size_mib, b->o.rand_mib, b->o.seconds, b->o.sync_ops, b->o.sync_mib, b->o.files,
	       b->o.file_size);
	if (b->o.suite & SUITE_CMP)
		printf("compare suite: a generated git repository of %lu files (about %lu bytes each); "
		       "random writes into an existing %lu MiB file, %.0f s per column;\n"
		       "               write+fdatasync: %lu into an existing %lu MiB file\n",
		       b->o.files, b->o.file_size, b->o.rand_mib, b->o.seconds, b->o.sync_ops,
		       b->o.rand_mib);
	printf("MB = 10^6 bytes, MiB = 2^20 bytes\n");
}

static void print_core(struct bench *b)
{
	char fv[32], bv[32], rv[32];

	printf("\n== suite core (issue 2): ferryfs mounted with its defaults (passthrough=auto) vs a "
	       "plain directory ==\n");
	printf("ratio = ferryfs / baseline (rates: higher is better for ferryfs; times: lower is better)\n\n");
	printf("%-44s %14s %14s %9s\n", "test", "ferryfs", "baseline", "ratio");
	for (size_t i = 0; i < b->nrows; i++) {
		struct row *r = &b->rows[i];
		fmt_val(fv, sizeof(fv), r->fmt, r->has_f, r->f);
		fmt_val(bv, sizeof(bv), r->fmt, r->has_b, r->b);
		fmt_ratio(rv, sizeof(rv), r);
		printf("%-44s %14s %14s %9s\n", r->label, fv, bv, rv);
	}

	printf("\nwhat the rows measure:\n");
	printf("  seq write: open(O_CREAT|O_TRUNC) + write() 1 MiB blocks + close(); on ferryfs "
	       "close() hands the file to ferry-reconciler, which uploads and commits after it.\n");
	if (b->o.fsync_row)
		printf("  seq write + fsync: the same with fsync() before close() (baseline durable too).\n");
	printf("  seq read cold: ferryfs remounted with its read cache emptied and the kernel page cache "
	       "dropped%s, so every object comes from the file:// store;\n"
	       "                baseline: page cache dropped, read from the scratch filesystem's %s.\n",
	       b->cold_ok ? "" : " (FAILED: drop_caches not writable, store files may be cached)",
	       b->tmpfs ? "RAM (tmpfs: there is no disk, so 'cold' only means not in the FUSE page cache)"
			: "disk");
	printf("  seq read read-cache: ferryfs remounted (FUSE page cache gone), data served by "
	       "ferry-mountd from its read cache (cache files filled by the cold read,\n"
	       "                likely still in the page cache); baseline: read from the page cache.\n");
	printf("  seq re-read: the same file again without remount: both from the kernel page cache "
	       "(ferryfs: if it kept the cache across open).\n");
	printf("  rand write, existing file: pwrite() 4 KiB at random 4 KiB-aligned offsets of a file "
	       "written and closed before (so not empty at open: ferryfs\n"
	       "                takes the daemon write path, one WRITE request per write; baseline: the "
	       "same offsets, same count); close() timed apart.\n");
	printf("  durability: a ferryfs close() returns with the data staged and journaled on the node "
	       "(uploaded afterwards); fsync() returns with it in the object\n"
	       "                store and the metadata committed; a baseline close() leaves the data "
	       "in the page cache, except in the 'seq write + fsync' row.\n");
	for (size_t i = 0; i < b->nnotes; i++)
		printf("  %s\n", b->notes[i]);

	printf("\nferryfs FUSE requests per phase, core volume (MOUNTPOINT/.stats after - before, minus one "
	       ".stats read; +-1 lookup or getattr from the .stats read itself):\n");
	print_phases(b, SUITE_CORE);
}

/* "PASS"/"MISS" for a figure against a floor (at_least) or a ceiling. */
static void print_target(const char *what, bool has, double q, bool at_least, double goal,
			 const char *unit_note)
{
	char qv[32];

	fmt_q(qv, sizeof(qv), has, q, 1.0);
	printf("  %-54s %8s x   target %s %-4g x   %s%s\n", what, qv, at_least ? ">=" : "<=", goal,
	       !has ? "n/a" : (at_least ? q >= goal : q <= goal) ? "PASS" : "MISS", unit_note);
}

/*
 * The small-file loop's .stats delta per created file, for two ferryfs
 * targets side by side (phase[] indexes phases[], -1 for none).
 */
static void print_per_file(struct bench *b, const int phase[2], const char *const label[])
{
	const char *names[MAX_FIGS];
	size_t nn = 0;

	if (phase[0] < 0 && phase[1] < 0)
		return;
	printf("\nsmall-file loop: FUSE requests and store work per created file (.stats delta / "
	       "%lu files):\n", b->o.files);
	printf("  %-22s %11s %11s\n", "", label[0], label[1]);
	for (int w = 0; w < 2; w++) {
		const struct phase *p;

		if (phase[w] < 0)
			continue;
		p = &b->phases[phase[w]];
		for (size_t k = 0; k < p->d.n; k++) {
			bool seen = false;
			if (p->d.val[k] == 0 || strcmp(p->d.name[k], "fuse_requests_interrupted") == 0)
				continue;
			for (size_t j = 0; j < nn; j++)
				if (strcmp(names[j], p->d.name[k]) == 0)
					seen = true;
			if (!seen && nn < MAX_FIGS)
				names[nn++] = p->d.name[k];
		}
	}
	for (int pass = 0; pass < 2; pass++) {
		for (size_t j = 0; j < nn; j++) {
			bool req = strncmp(names[j], "fuse_requests_", 14) == 0;
			if (req != (pass == 0))
				continue;
			printf("  %-22s", req ? names[j] + 14 : names[j]);
			for (int w = 0; w < 2; w++) {
				char val[32] = "-";
				if (phase[w] >= 0)
					snprintf(val, sizeof(val), "%.3f",
						 (double)snap_get(&b->phases[phase[w]].d,
								  names[j]) / (double)b->o.files);
				printf(" %11s", val);
			}
			printf("\n");
		}
		if (pass == 0) {
			printf("  %-22s", "= FUSE requests");
			for (int w = 0; w < 2; w++) {
				char val[32] = "-";
				if (phase[w] >= 0)
					snprintf(val, sizeof(val), "%.3f",
						 (double)snap_requests(&b->phases[phase[w]].d) /
							 (double)b->o.files);
				printf(" %11s", val);
			}
			printf("\n");
		}
	}
	printf("  (lookup and getattr may include one from reading .stats when the kernel's entry "
	       "for it expired: +-1 in total, not per file)\n");
}

static void print_pt(struct bench *b)
{
	char v[NW][32], q1[32], q2[32];

	printf("\n== suite passthrough (issue 3): three targets side by side ==\n");
	printf("  ferry pt    = ferryfs volume mounted -o passthrough=auto (%s)\n", b->pt_state[0]);
	printf("  ferry off   = a second ferryfs volume mounted -o passthrough=off (%s)\n", b->pt_state[1]);
	printf("  staging dir = a plain directory on the filesystem the staging files live on (%s)\n",
	       b->baseline);
	printf("  both ferryfs volumes: fsync=remote (fsync/fdatasync upload to the file:// store and "
	       "commit the metadata before returning; close() hands over to ferry-reconciler),\n"
	       "  except the fsync=local row, for which both are remounted -o fsync=local (fdatasync "
	       "syncs the staging file and a journal record on this node; the upload follows close())\n");
	printf("ratios: pt/dir = ferry pt / staging dir, pt/off = ferry pt / ferry off; for rates higher "
	       "is better for pt, for times (ms, s, us) lower is better\n\n");
	printf("%-50s %11s %11s %11s %8s %8s\n", "test", wlabel[0], wlabel[1], wlabel[2], "pt/dir",
	       "pt/off");
	for (size_t i = 0; i < b->nrows3; i++) {
		struct row3 *r = &b->rows3[i];

		for (int w = 0; w < NW; w++) {
			if (!r->has[w] && r->na && w != W_DIR)
				snprintf(v[w], sizeof(v[w]), "%s", r->na);
			else
				fmt_val(v[w], sizeof(v[w]), r->fmt, r->has[w], r->v[w]);
		}
		if (r->ratios) {
			fmt_q(q1, sizeof(q1), r->has[W_PT] && r->has[W_DIR], r->v[W_PT], r->v[W_DIR]);
			fmt_q(q2, sizeof(q2), r->has[W_PT] && r->has[W_OFF], r->v[W_PT], r->v[W_OFF]);
		} else {
			snprintf(q1, sizeof(q1), "%s", "");
			snprintf(q2, sizeof(q2), "%s", "");
		}
		printf("%-50s %11s %11s %11s %8s %8s\n", r->label, v[0], v[1], v[2], q1, q2);
	}

	printf("\nissue 3 targets (information only: the benchmark exits 0 whether they are met or "
	       "not):\n");
	print_target("rand write 4 KiB buffered, IOPS: pt / staging dir",
		     b->has_rand[W_PT] && b->has_rand[W_DIR],
		     b->has_rand[W_DIR] ? b->rand_iops[W_PT] / b->rand_iops[W_DIR] : 0, true, 0.8, "");
	{
		char bound[96] = "";

		/* pt cannot beat the filesystem it writes to: dir/off caps pt/off. */
		if (b->has_rand[W_DIR] && b->has_rand[W_OFF] && b->rand_iops[W_OFF] > 0)
			snprintf(bound, sizeof(bound), " (ceiling here: staging dir / off = %.1f x)",
				 b->rand_iops[W_DIR] / b->rand_iops[W_OFF]);
		print_target("rand write 4 KiB buffered, IOPS: pt / passthrough=off",
			     b->has_rand[W_PT] && b->has_rand[W_OFF],
			     b->has_rand[W_OFF] ? b->rand_iops[W_PT] / b->rand_iops[W_OFF] : 0, true,
			     50, bound);
	}
	print_target("small-file loop, time: pt / staging dir",
		     b->has_small[W_PT] && b->has_small[W_DIR],
		     b->has_small[W_DIR] ? b->small_us[W_PT] / b->small_us[W_DIR] : 0, false, 3, "");

	/* The upcalls one created file costs. */
	print_per_file(b, b->small_phase, wlabel);

	printf("\nwhat the rows measure:\n");
	printf("  rand write buffered: open(O_RDWR|O_CREAT|O_TRUNC) -- empty at open, so ferryfs gives it "
	       "a passthrough staging file -- then the whole file\n"
	       "                written in 1 MiB blocks in the same open and sync() (untimed), then 4 KiB "
	       "pwrite()s at random 4 KiB-aligned offsets for a fixed\n"
	       "                time per target; IOPS over the pwrite()s; close() timed apart (ferryfs: "
	       "hands the file to ferry-reconciler).\n");
	printf("  rand write into an existing file: the same fill, then close() and open(O_RDWR) again "
	       "(timed: on ferryfs it waits for the fill's upload and\n"
	       "                copies the file into a passthrough staging file), then the same random "
	       "writes, as a database or fio with a laid-out file.\n");
	printf("  rand write + fdatasync: the same file set-up with fdatasync() after the fill (untimed: "
	       "ferryfs uploads and commits it), then a fixed number of\n"
	       "                pwrite(4 KiB) + fdatasync() pairs; on ferryfs (fsync=remote) each fdatasync "
	       "uploads what changed since the last one and commits.\n");
	printf("  seq write: open(O_CREAT|O_TRUNC) + write() 1 MiB blocks + close(); 'write() calls only' "
	       "excludes close(), which on ferryfs hands the file to ferry-reconciler.\n");
	printf("  small files: openat(O_CREAT|O_EXCL) + write() + close() per file in one new directory, "
	       "each call timed too; on ferryfs every file is committed by ferry-reconciler after its close().\n");
	printf("  sync() runs (untimed) before each target's turn so that no writeback of the previous "
	       "one competes; nothing else is flushed: the staging dir's\n"
	       "                close() leaves data in the page cache, a ferryfs close() returns with it "
	       "in the object store and the metadata committed.\n");
	printf("  data check: every file of every row is read back after close() and compared byte for "
	       "byte with what was written (random writes: the last\n"
	       "                write to each page wins), then removed.\n");
	for (size_t i = 0; i < b->nnotes3; i++)
		printf("  %s\n", b->notes3[i]);

	printf("\nferryfs FUSE requests per phase, pt and off volumes (.stats after - before, minus one "
	       ".stats read; +-1 lookup or getattr from the .stats read itself):\n");
	print_phases(b, SUITE_PT);
}

static void print_broker(struct bench *b)
{
	char v[NW][32], q1[32], q2[32], q3[32];
	bool both = b->bengaged[0] && b->bengaged[1];

	printf("\n== suite broker (issue 4): passthrough registration through ferry-brokerd vs the "
	       "direct ioctl ==\n");
	printf("  ferry direct = ferryfs volume mounted by root with its defaults: ferry-mountd "
	       "registers each staging file itself (FUSE_DEV_IOC_BACKING_OPEN\n"
	       "                 on its /dev/fuse fd) (%s)\n", b->bstate[0]);
	printf("  ferry broker = ferryfs volume mounted by uid 65534 with `ferry mount --broker`: "
	       "ferry-brokerd mounts it and registers each staging file\n"
	       "                 (one round trip per passthrough open) (%s)\n", b->bstate[1]);
	printf("  staging dir  = a plain directory on the filesystem the staging files live on (%s)\n",
	       b->baseline);
	printf("  the loop on ferry broker runs in a child of ferry_bench that dropped to uid 65534 "
	       "(timed there, sent back through a pipe); the others as root\n");
	printf("ratios: brk/dct = ferry broker / ferry direct, brk/dir = ferry broker / staging dir, "
	       "dct/dir = ferry direct / staging dir; for rates higher is\n"
	       "better for the first, for times lower is better\n\n");
	printf("%-44s %12s %12s %12s %8s %8s %8s\n", "test", blabel[0], blabel[1], blabel[2],
	       "brk/dct", "brk/dir", "dct/dir");
	for (size_t i = 0; i < b->nrowsb; i++) {
		struct row3 *r = &b->rowsb[i];

		for (int w = 0; w < NW; w++)
			fmt_val(v[w], sizeof(v[w]), r->fmt, r->has[w], r->v[w]);
		if (r->ratios) {
			fmt_q(q1, sizeof(q1), r->has[B_BROKER] && r->has[B_DIRECT], r->v[B_BROKER],
			      r->v[B_DIRECT]);
			fmt_q(q2, sizeof(q2), r->has[B_BROKER] && r->has[B_DIR], r->v[B_BROKER],
			      r->v[B_DIR]);
			fmt_q(q3, sizeof(q3), r->has[B_DIRECT] && r->has[B_DIR], r->v[B_DIRECT],
			      r->v[B_DIR]);
		} else {
			q1[0] = q2[0] = q3[0] = '\0';
		}
		printf("%-44s %12s %12s %12s %8s %8s %8s\n", r->label, v[0], v[1], v[2], q1, q2, q3);
	}

	printf("\nissue 4 target (information only: the benchmark exits 0 whether it is met or not):\n");
	print_target("small-file loop, time per file: broker / direct",
		     both && b->has_bsmall[B_BROKER] && b->has_bsmall[B_DIRECT],
		     b->has_bsmall[B_DIRECT] ? b->bsmall_us[B_BROKER] / b->bsmall_us[B_DIRECT] : 0,
		     false, 1.3,
		     both ? "" : " (passthrough was not engaged on both volumes: no comparison)");
	printf("passthrough: %s on ferry direct, %s on ferry broker (passthrough_active 1 at mount "
	       "and after the loop, no WRITE request in it, a backing file per created file)\n",
	       b->bengaged[0] ? "engaged" : "NOT ENGAGED", b->bengaged[1] ? "engaged" : "NOT ENGAGED");

	print_per_file(b, b->bsmall_phase, blabel);

	printf("\nwhat the rows measure:\n");
	printf("  small files: openat(O_CREAT|O_EXCL) + write() + close() per file in one new "
	       "directory, each call timed too (the same loop as the passthrough suite's);\n"
	       "                on ferryfs CREATE takes a staging file from the pool, made and "
	       "registered as a passthrough backing file ahead (ferry broker: up to 16\n"
	       "                to a BACKING_OPEN_MANY request to ferry-brokerd), the write goes "
	       "to it without an upcall, and RELEASE closes the backing id (ferry broker:\n"
	       "                queued and sent with the others of the last 5 ms as one "
	       "BACKING_CLOSE_MANY; RELEASE is asynchronous to close()) and\n"
	       "                hands the file to ferry-reconciler, which uploads and commits it.\n");
	printf("  ferry-brokerd requests: its own request count (`ferry-brokerd --ping`) before the "
	       "loop and after its read-back and removal, minus the pings.\n");
	printf("  CPU per file: user + system time of the process (/proc/PID/stat) over the same "
	       "span (the loop, its read-back and removal), in the clock's ticks.\n");
	printf("  each volume is unmounted after its turn (`ferry umount` returns once every upload "
	       "is committed), so no upload of one target runs under the next;\n"
	       "                sync() runs (untimed) before each turn.\n");
	for (size_t i = 0; i < b->nnotesb; i++)
		printf("  %s\n", b->notesb[i]);

	printf("\nferryfs FUSE requests per phase, direct and broker volumes (.stats after - before, "
	       "minus one .stats read; +-1 lookup or getattr from the .stats read itself):\n");
	print_phases(b, SUITE_BROKER);
}

/* Row r's ferry-column value over passthrough_hp's (or the staging dir's). */
static bool rowc_q(const struct bench *b, int r, int num, int den, double *q)
{
	const struct row4 *row = &b->rowsc[r];

	if (!row->has[num] || !row->has[den] || row->v[den] <= 0)
		return false;
	*q = row->v[num] / row->v[den];
	return true;
}

/* The compare suite's FUSE requests per item by opcode, and ferryfs's own
 * figures per item, one block per workload. */
static void print_cmp_requests(struct bench *b)
{
	static const int cols[] = { C_PTHP, C_DIRECT, C_BROKER };

	printf("\nFUSE requests per item, by opcode (ferryfs: MOUNTPOINT/.stats after - before, minus "
	       "one .stats read; passthrough_hp: %s):\n",
	       b->pthp_counted ? "counted from libfuse's --debug-fuse log in a second, untimed turn "
				 "of the same workloads" :
				 "not counted ('-')");
	printf("  %-44s %14s %14s %14s\n", "", clabel[C_PTHP], clabel[C_DIRECT], clabel[C_BROKER]);
	for (int p = 0; p < CP_N; p++) {
		const struct cphase *ph = &b->cphases[p];
		const char *names[MAX_FIGS];
		size_t nn = 0;

		printf("  %s (per %s)\n", ph->name, ph->per_what);
		for (size_t c = 0; c < sizeof(cols) / sizeof(cols[0]); c++) {
			const struct snap *d = &ph->d[cols[c]];

			if (!ph->has[cols[c]])
				continue;
			for (size_t k = 0; k < d->n; k++) {
				bool seen = false;

				if (d->val[k] == 0 || !strcmp(d->name[k], "fuse_requests_interrupted"))
					continue;
				for (size_t j = 0; j < nn; j++)
					if (!strcmp(names[j], d->name[k]))
						seen = true;
				if (!seen && nn < MAX_FIGS)
					names[nn++] = d->name[k];
			}
		}
		/* Requests first, their sum, then ferryfs's other figures. */
		for (int pass = 0; pass < 3; pass++) {
			for (size_t j = 0; j < (pass == 1 ? 1 : nn); j++) {
				bool req = pass == 1 || strncmp(names[j], "fuse_requests_", 14) == 0;

				if ((pass == 0 && !req) || (pass == 2 && req))
					continue;
				printf("    %-42s", pass == 1 ? "= FUSE requests" :
						    req ? names[j] + 14 : names[j]);
				for (size_t c = 0; c < sizeof(cols) / sizeof(cols[0]); c++) {
					char v[32] = "-";
					int w = cols[c];

					if (ph->has[w]) {
						double x = pass == 1 ? (double)snap_requests(&ph->d[w]) :
							   (double)snap_get(&ph->d[w], names[j]);
						snprintf(v, sizeof(v), "%.3f", x / ph->per[w]);
					}
					printf(" %14s", v);
				}
				printf("\n");
			}
		}
	}
	printf("  (ferryfs: lookup and getattr may include one from reading .stats: +-1 in total, "
	       "not per item; passthrough_hp's batch_forget is the kernel's\n"
	       "   batched FORGET, which ferryfs counts as forget; its flush/release of a turn may "
	       "land in the next workload, as may ferryfs's)\n");
}

static void print_cmp(struct bench *b)
{
	static const struct {
		int row;
		const char *what;
	} goals[] = {
		{ CR_CLONE, "git clone + checkout" }, { CR_STATUS, "git status" },
		{ CR_RM, "rm -rf" }, { CR_SMALL, "small-file loop" },
		{ CR_RAND, "rand write" }, { CR_SYNC, "rand write + fdatasync" },
		{ CR_SYNC_LOCAL, "the same, fsync=local" },
	};
	char v[NC][32], q[3][32], what[96];
	double x;

	printf("\n== suite compare (issue 10): the staging filesystem, libfuse's passthrough_hp and "
	       "ferryfs, side by side ==\n");
	printf("  staging dir    = a plain directory on the scratch filesystem, where ferryfs's "
	       "staging files and passthrough_hp's source also are (%s)\n", b->cstate[C_DIR]);
	if (b->pthp_off[0])
		printf("  passthrough_hp = - (not measured: %s)\n", b->pthp_off);
	else
		printf("  passthrough_hp = libfuse's example, fuse3 3.18 with FUSE_CAP_HANDLE_KILLPRIV_V2 "
		       "enabled (scripts/passthrough-hp), passthrough on, 86400 s\n"
		       "                   caches, multithreaded; mounted by root over a directory of "
		       "the scratch filesystem: %s\n", b->cstate[C_PTHP]);
	printf("  ferry direct   = ferryfs mounted by root with %s%s (%s)\n",
	       b->o.direct_o ? "-o " : "its defaults", b->o.direct_o ? b->o.direct_o : "",
	       b->cstate[C_DIRECT]);
	printf("  ferry broker   = ferryfs mounted by uid 65534 through ferry-brokerd, every workload "
	       "run as uid 65534 (%s)\n", b->cstate[C_BROKER]);
	printf("  one column at a time, its file system mounted for its turn only; before each "
	       "workload sync() and, on ferryfs, a wait until every upload is\n"
	       "  committed (untimed; shown where it matters)\n");
	printf("ratios: dct/dir = ferry direct / staging dir, dct/pthp = ferry direct / passthrough_hp, "
	       "brk/pthp = ferry broker / passthrough_hp;\n"
	       "        for times lower is better for ferryfs, for rates (IOPS, files per second) "
	       "higher\n\n");
	printf("%-52s %12s %14s %12s %12s %8s %8s %8s\n", "test", clabel[0], clabel[1], clabel[2],
	       clabel[3], "dct/dir", "dct/pthp", "brk/pthp");
	for (int r = 0; r < CR_N; r++) {
		const struct row4 *row = &b->rowsc[r];

		for (int w = 0; w < NC; w++)
			fmt_val(v[w], sizeof(v[w]), row->fmt, row->has[w], row->v[w]);
		q[0][0] = q[1][0] = q[2][0] = '\0';
		if (row->better) {
			fmt_q(q[0], sizeof(q[0]), row->has[C_DIRECT] && row->has[C_DIR],
			      row->v[C_DIRECT], row->v[C_DIR]);
			fmt_q(q[1], sizeof(q[1]), row->has[C_DIRECT] && row->has[C_PTHP],
			      row->v[C_DIRECT], row->v[C_PTHP]);
			fmt_q(q[2], sizeof(q[2]), row->has[C_BROKER] && row->has[C_PTHP],
			      row->v[C_BROKER], row->v[C_PTHP]);
		}
		printf("%-52s %12s %14s %12s %12s %8s %8s %8s\n", row->label, v[0], v[1], v[2], v[3],
		       q[0], q[1], q[2]);
	}
	if (b->rowsc[CR_CLONE_REQ].has[C_PTHP])
		printf("(passthrough_hp's FUSE requests: from its second, untimed turn with "
		       "--debug-fuse)\n");
	printf("(fsync=local row: staging dir and passthrough_hp repeat the row above, the same "
	       "workload: their fdatasync is local anyway)\n");

	printf("\nissue 10 targets (information only: the benchmark exits 0 whether they are met "
	       "or not):\n");
	for (size_t i = 0; i < sizeof(goals) / sizeof(goals[0]); i++) {
		bool rate = b->rowsc[goals[i].row].better > 0;
		bool has = rowc_q(b, goals[i].row, C_DIRECT, C_PTHP, &x);

		snprintf(what, sizeof(what), "%s: ferry direct / passthrough_hp", goals[i].what);
		print_target(what, has, has ? x : 0, rate, 1, rate ? " (rate: ahead when higher)" :
								    " (time: ahead when lower)");
	}
	{
		bool has = rowc_q(b, CR_CLONE, C_DIRECT, C_DIR, &x);

		print_target("git clone + checkout: ferry direct / staging dir", has, has ? x : 0, false,
			     3, "");
	}
	printf("the same for ferry broker (information):\n");
	for (size_t i = 0; i < sizeof(goals) / sizeof(goals[0]); i++) {
		bool rate = b->rowsc[goals[i].row].better > 0;
		bool has = rowc_q(b, goals[i].row, C_BROKER, C_PTHP, &x);

		snprintf(what, sizeof(what), "%s: ferry broker / passthrough_hp", goals[i].what);
		print_target(what, has, has ? x : 0, rate, 1, "");
	}

	print_cmp_requests(b);

	printf("\nwhat the rows measure:\n");
	printf("  git clone: `git clone -q --no-hardlinks REPO DIR` of the generated repository (one "
	       "pack; no hard links, so every column copies it), checkout\n"
	       "                included; git's defaults otherwise (it fsyncs the pack and refs).\n");
	printf("  git status: `git status` in the fresh checkout (stats every file; may refresh the "
	       "index); afterwards (untimed) every file of the checkout is\n"
	       "                compared byte for byte with the repository's.\n");
	printf("  rm -rf: `rm -rf` of the checkout, .git included.\n");
	printf("  small files: openat(O_CREAT|O_EXCL) + write() + close() per file in one new "
	       "directory (--files of them); read back and removed untimed.\n");
	printf("  rand write, existing file: the file is written in 1 MiB blocks, closed and opened "
	       "again without O_TRUNC (open() timed: on ferryfs it waits for\n"
	       "                the first upload and copies the file into a passthrough staging "
	       "file); then 4 KiB pwrite()s at random offsets for the set time;\n"
	       "                IOPS over the pwrite()s; close() apart. + fdatasync: the fill is "
	       "fdatasync'ed, then a fixed number of pwrite() + fdatasync()\n"
	       "                pairs (ferryfs, fsync=remote: each uploads what changed and "
	       "commits). Every byte is checked afterwards (untimed).\n"
	       "                fsync=local: ferryfs unmounted and mounted again with it, "
	       "the same pairs (durable on the node; uploaded after close).\n");
	printf("  ferryfs uploads drained: how long the wait for ferry-reconciler's commits took "
	       "before the next workload (not in any figure above).\n");
	for (size_t i = 0; i < b->nnotesc; i++)
		printf("  %s\n", b->notesc[i]);
}

static void print_report(struct bench *b, int argc, char **argv)
{
	print_header(b, argc, argv);
	if (b->ran_core)
		print_core(b);
	if (b->ran_pt)
		print_pt(b);
	if (b->ran_broker)
		print_broker(b);
	if (b->ran_cmp)
		print_cmp(b);
	if (b->data_errors)
		printf("\nDATA ERRORS: %d (see the messages above); the figures are not trustworthy\n",
		       b->data_errors);
	fflush(stdout);
}

/* ---- main ------------------------------------------------------------------ */

static void usage(FILE *f)
{
	fprintf(f,
		"usage: ferry_bench --ferry PATH --scratch DIR --mnt-root DIR [options]\n"
		"Mounts the formatted volumes SCRATCH/vol-TAG at MNT-ROOT/mnt-TAG (TAG: core, pt, off,\n"
		"direct) with `ferry mount` (cache SCRATCH/cache-TAG, staging SCRATCH/staging-TAG),\n"
		"and SCRATCH/vol-broker (uid 65534's) at MNT-ROOT/broker-root/mnt-broker as uid 65534\n"
		"through a ferry-brokerd it starts (files in SCRATCH/broker); the compare suite also\n"
		"mounts passthrough_hp SCRATCH/pthp-src at MNT-ROOT/mnt-pthp (log MNT-ROOT/pthp.log)\n"
		"and generates a git repository in SCRATCH/cmp-gitsrc; measures against the\n"
		"plain directory SCRATCH/baseline, unmounts. Normally run by scripts/bench, which\n"
		"makes the scratch filesystem and formats the volumes.\n"
		"  --suite core|passthrough|broker|compare|all  which rows (default all)\n"
		"  --cache-size MIB     ferryfs read cache limit (default 4096)\n"
		"  --size-mib N         sequential file size (default 1024)\n"
		"  --rand-size-mib N    random-write file size (default 256)\n"
		"  --seconds S          random-write duration per target (default 10)\n"
		"  --rand-max-ops N     cap on random writes (default 10000000)\n"
		"  --sync-ops N         write+fdatasync pairs per target (default 200)\n"
		"  --sync-size-mib N    write+fdatasync file size (default: min(64, --rand-size-mib))\n"
		"  --files N            small files (default 10000)\n"
		"  --file-size BYTES    small file size (default 2048)\n"
		"  --no-fsync-row       skip the core suite's write+fsync row\n"
		"  --seed N             random offsets seed\n"
		"  --pidfile-prefix P   write ferry-mountd's pid to P.TAG.pid after each mount\n"
		"  --brokerd PATH       ferry-brokerd (default: next to --ferry)\n"
		"  --brokerd-pidfile F  write ferry-brokerd's pid to F once started\n"
		"  --pthp PATH          libfuse's passthrough_hp (scripts/passthrough-hp builds it)\n"
		"  --pthp-missing WHY   no passthrough_hp: its column shows '-' and WHY\n"
		"  --pthp-pidfile F     write passthrough_hp's pid to F while it runs\n"
		"  --direct-options O   mount the direct column with -o O (e.g. io_uring=on)\n"
		"  --scratch-desc TEXT  --command TEXT  --source-desc TEXT   printed in the header\n");
}

static int parse_ul(const char *s, const char *opt, unsigned long *out)
{
	char *end;

	errno = 0;
	*out = strtoul(s, &end, 10);
	if (errno || *end || !*s) {
		errf("%s: not a number: %s", opt, s);
		return -1;
	}
	return 0;
}

static int parse_opts(int argc, char **argv, struct opts *o)
{
	static const struct option lo[] = {
		{ "ferry", required_argument, NULL, 'F' },
		{ "scratch", required_argument, NULL, 'X' },
		{ "mnt-root", required_argument, NULL, 'M' },
		{ "suite", required_argument, NULL, 'U' },
		{ "cache-size", required_argument, NULL, 'Z' },
		{ "size-mib", required_argument, NULL, 's' },
		{ "rand-size-mib", required_argument, NULL, 'r' },
		{ "seconds", required_argument, NULL, 't' },
		{ "rand-max-ops", required_argument, NULL, 'R' },
		{ "sync-ops", required_argument, NULL, 'y' },
		{ "sync-size-mib", required_argument, NULL, 'Y' },
		{ "files", required_argument, NULL, 'n' },
		{ "file-size", required_argument, NULL, 'z' },
		{ "no-fsync-row", no_argument, NULL, 'N' },
		{ "seed", required_argument, NULL, 'S' },
		{ "pidfile-prefix", required_argument, NULL, 'P' },
		{ "brokerd", required_argument, NULL, 'B' },
		{ "brokerd-pidfile", required_argument, NULL, 'b' },
		{ "scratch-desc", required_argument, NULL, 'D' },
		{ "command", required_argument, NULL, 'c' },
		{ "source-desc", required_argument, NULL, 'G' },
		{ "pthp", required_argument, NULL, 'H' },
		{ "pthp-missing", required_argument, NULL, 'I' },
		{ "pthp-pidfile", required_argument, NULL, 'J' },
		{ "direct-options", required_argument, NULL, 'O' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	unsigned long v;
	int c;

	*o = (struct opts){
		.cache_mib = 4096, .size_mib = 1024, .rand_mib = 256, .files = 10000,
		.file_size = 2048, .seconds = 10, .rand_max_ops = 10000000, .sync_ops = 200,
		.seed = 0x9e3779b97f4a7c15ull, .fsync_row = true, .suite = SUITE_ALL,
	};
	while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
		switch (c) {
		case 'F': o->ferry = optarg; break;
		case 'X': o->scratch = optarg; break;
		case 'M': o->mnt_root = optarg; break;
		case 'P': o->pidfile_prefix = optarg; break;
		case 'B': o->brokerd = optarg; break;
		case 'b': o->brokerd_pidfile = optarg; break;
		case 'D': o->scratch_desc = optarg; break;
		case 'c': o->command = optarg; break;
		case 'G': o->source_desc = optarg; break;
		case 'H': o->pthp = optarg; break;
		case 'I': o->pthp_missing = optarg; break;
		case 'J': o->pthp_pidfile = optarg; break;
		case 'O': o->direct_o = optarg; break;
		case 'N': o->fsync_row = false; break;
		case 'U':
			if (!strcmp(optarg, "core"))
				o->suite = SUITE_CORE;
			else if (!strcmp(optarg, "passthrough"))
				o->suite = SUITE_PT;
			else if (!strcmp(optarg, "broker"))
				o->suite = SUITE_BROKER;
			else if (!strcmp(optarg, "compare"))
				o->suite = SUITE_CMP;
			else if (!strcmp(optarg, "all"))
				o->suite = SUITE_ALL;
			else {
				errf("--suite is core, passthrough, broker, compare or all, not %s", optarg);
				return -1;
			}
			break;
		case 'Z': if (parse_ul(optarg, "--cache-size", &o->cache_mib) < 0) return -1; break;
		case 's': if (parse_ul(optarg, "--size-mib", &o->size_mib) < 0) return -1; break;
		case 'r': if (parse_ul(optarg, "--rand-size-mib", &o->rand_mib) < 0) return -1; break;
		case 'R': if (parse_ul(optarg, "--rand-max-ops", &o->rand_max_ops) < 0) return -1; break;
		case 'y': if (parse_ul(optarg, "--sync-ops", &o->sync_ops) < 0) return -1; break;
		case 'Y': if (parse_ul(optarg, "--sync-size-mib", &o->sync_mib) < 0) return -1; break;
		case 'n': if (parse_ul(optarg, "--files", &o->files) < 0) return -1; break;
		case 'z': if (parse_ul(optarg, "--file-size", &o->file_size) < 0) return -1; break;
		case 'S': if (parse_ul(optarg, "--seed", &v) < 0) return -1; o->seed = v; break;
		case 't': {
			char *end;
			o->seconds = strtod(optarg, &end);
			if (*end || o->seconds <= 0) {
				errf("--seconds: not a positive number: %s", optarg);
				return -1;
			}
			break;
		}
		case 'h': usage(stdout); exit(0);
		default: usage(stderr); return -1;
		}
	}
	if (optind != argc || !o->ferry || !o->scratch || !o->mnt_root) {
		usage(stderr);
		return -1;
	}
	if (!o->sync_mib)
		o->sync_mib = o->rand_mib < 64 ? o->rand_mib : 64;
	if (o->size_mib == 0 || o->rand_mib == 0 || o->files == 0 || o->file_size == 0 ||
	    o->file_size > BLOCK / 4 || o->rand_max_ops == 0 || o->rand_max_ops >= UINT32_MAX ||
	    o->sync_ops == 0) {
		errf("sizes must be positive (and --file-size at most %u, --rand-max-ops below 2^32)",
		     BLOCK / 4);
		return -1;
	}
	return 0;
}

static int target_init(struct bench *b, int k, const char *tag, const char *mount_o)
{
	struct target *t = &b->t[k];
	const char *s = b->o.scratch;

	t->tag = tag;
	t->mount_o = mount_o;
	if (asprintf(&t->volume, "%s/vol-%s", s, tag) < 0 ||
	    asprintf(&t->cache_dir, "%s/cache-%s", s, tag) < 0 ||
	    asprintf(&t->staging_dir, "%s/staging-%s", s, tag) < 0 ||
	    asprintf(&t->mnt, "%s/mnt-%s", b->o.mnt_root, tag) < 0 ||
	    (b->o.pidfile_prefix && asprintf(&t->pidfile, "%s.%s.pid", b->o.pidfile_prefix, tag) < 0))
		return -1;
	return 0;
}

/* The broker suite's paths: the volume mounted by uid 65534 beneath the
 * policy root MNT-ROOT/broker-root, and the broker's files in SCRATCH/broker. */
static int broker_init(struct bench *b, char **brokerd_bin)
{
	struct target *t = &b->t[T_BROKER];
	const char *slash;

	if (!b->o.brokerd) {
		slash = strrchr(b->o.ferry, '/');
		if (asprintf(brokerd_bin, "%.*sferry-brokerd", slash ? (int)(slash - b->o.ferry + 1) : 0,
			     b->o.ferry) < 0)
			return -1;
		b->o.brokerd = *brokerd_bin;
	}
	free(t->mnt);
	t->mnt = NULL;
	if (asprintf(&b->broker_root, "%s/broker-root", b->o.mnt_root) < 0 ||
	    asprintf(&t->mnt, "%s/mnt-broker", b->broker_root) < 0 ||
	    asprintf(&b->broker_dir, "%s/broker", b->o.scratch) < 0 ||
	    asprintf(&b->broker_sock, "%s/broker.sock", b->broker_dir) < 0 ||
	    asprintf(&b->broker_policy, "%s/broker.policy", b->broker_dir) < 0 ||
	    asprintf(&b->broker_log, "%s/brokerd.log", b->broker_dir) < 0)
		return -1;
	t->broker = b->broker_sock;
	t->nobody = true;
	return 0;
}

int main(int argc, char **argv)
{
	struct bench *b = calloc(1, sizeof(*b));
	char *brokerd_bin = NULL;
	int rc = 1;

	setvbuf(stdout, NULL, _IOLBF, 0);
	if (!b) {
		errf("out of memory");
		return 1;
	}
	if (parse_opts(argc, argv, &b->o) < 0) {
		free(b);
		return 2;
	}
	b->small_phase[0] = b->small_phase[1] = -1;
	b->bsmall_phase[0] = b->bsmall_phase[1] = -1;
	if (target_init(b, T_CORE, "core", NULL) < 0 ||
	    target_init(b, T_PT, "pt", "passthrough=auto") < 0 ||
	    target_init(b, T_OFF, "off", "passthrough=off") < 0 ||
	    target_init(b, T_DIRECT, "direct", b->o.direct_o) < 0 ||
	    target_init(b, T_BROKER, "broker", NULL) < 0 || broker_init(b, &brokerd_bin) < 0 ||
	    !(b->baseline = path_join(b->o.scratch, "baseline")) ||
	    !(b->pthp_src = path_join(b->o.scratch, "pthp-src")) ||
	    !(b->pthp_mnt = path_join(b->o.mnt_root, "mnt-pthp")) ||
	    !(b->pthp_log = path_join(b->o.mnt_root, "pthp.log")) ||
	    !(b->gitsrc = path_join(b->o.scratch, "cmp-gitsrc")) ||
	    !(b->gitcfg = path_join(b->o.scratch, "cmp-git"))) {
		errf("out of memory");
		goto out;
	}
	{
		struct statfs sf;
		if (statfs(b->baseline, &sf) < 0) {
			errf("statfs %s: %s", b->baseline, strerror(errno));
			goto out;
		}
		b->tmpfs = sf.f_type == 0x01021994; /* TMPFS_MAGIC */
	}
	if (geteuid() != 0)
		errf("warning: not root: dropping the page cache for cold reads will fail");
	if (posix_memalign((void **)&b->buf, 4096, BLOCK) != 0 ||
	    posix_memalign((void **)&g_tmpl, 4096, BLOCK) != 0) {
		errf("out of memory");
		goto out;
	}
	{
		uint64_t s = b->o.seed | 1;
		for (size_t i = 0; i < BLOCK; i += 8) {
			uint64_t v = xorshift64(&s);
			memcpy(g_tmpl + i, &v, 8);
		}
	}
	if ((b->o.suite & SUITE_CORE) && suite_core(b, !(b->o.suite & SUITE_PT)) < 0)
		goto out;
	if ((b->o.suite & SUITE_PT) && suite_pt(b) < 0)
		goto out;
	if ((b->o.suite & SUITE_BROKER) && suite_broker(b) < 0)
		goto out;
	if ((b->o.suite & SUITE_CMP) && suite_compare(b) < 0)
		goto out;
	rc = b->data_errors ? 1 : 0;
out:
	for (int k = 0; k < NTGT; k++) {
		if (b->t[k].mounted) {
			progress("unmounting %s after an error", b->t[k].mnt);
			ferry_umount(b, &b->t[k], NULL);
		}
	}
	if (b->pthp > 0) {
		progress("stopping passthrough_hp after an error");
		pthp_stop(b);
	}
	if (b->brokerd > 0) {
		progress("stopping ferry-brokerd after an error");
		brokerd_stop(b);
	}
	if (b->ran_core || b->ran_pt || b->ran_broker || b->ran_cmp)
		print_report(b, argc, argv);
	if (rc != 0)
		errf("benchmark FAILED (see the errors above); the tables show what was measured before");
	for (int k = 0; k < NTGT; k++) {
		free(b->t[k].volume);
		free(b->t[k].cache_dir);
		free(b->t[k].staging_dir);
		free(b->t[k].mnt);
		free(b->t[k].pidfile);
		free(b->t[k].mount_o_local);
	}
	free(b->baseline);
	free(b->broker_root);
	free(b->broker_dir);
	free(b->broker_sock);
	free(b->broker_policy);
	free(b->broker_log);
	free(b->pthp_src);
	free(b->pthp_mnt);
	free(b->pthp_log);
	free(b->gitsrc);
	free(b->gitcfg);
	free(brokerd_bin);
	free(b->buf);
	free(g_tmpl);
	free(b);
	return rc;
}
