/*
 * ferry_bench: ferryfs side by side with a plain local directory, in one run.
 *
 *   - sequential write (1 MiB blocks, close() included; ferryfs commits to the
 *     object store in close), once more with fsync() before close()
 *   - sequential read, three ways: cold (ferryfs: read cache emptied, kernel
 *     caches dropped, objects fetched from the file:// store; baseline:
 *     page cache dropped, read from disk), from ferryfs's read cache (ferryfs
 *     remounted so its page cache is gone; baseline: page-cache hot) and a
 *     re-read without remount (both: kernel page cache)
 *   - 4 KiB random pwrite() IOPS into a prefilled file, close() timed apart
 *   - a create + write(2 KiB) + close() loop over many files
 *
 * For every ferryfs phase the per-opcode FUSE request counts are taken from
 * MOUNTPOINT/.stats before and after (minus what reading .stats costs).
 *
 * The program mounts and remounts the volume itself (`ferry mount`, `ferry
 * umount`); scripts/bench makes the scratch filesystem, formats the volume
 * and cleans up. It reports; it asserts nothing about timings. It fails
 * (non-zero exit) on I/O errors and on data that does not read back.
 */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

struct opts {
	const char *ferry, *volume, *mnt, *cache_dir, *staging_dir, *baseline;
	const char *pidfile, *scratch_desc, *command;
	unsigned long cache_mib;
	unsigned long size_mib, rand_mib, files, file_size;
	double seconds;
	unsigned long rand_max_ops;
	uint64_t seed;
	bool fsync_row;
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

static int run_cmd(char *const argv[], bool quiet)
{
	pid_t pid = fork();
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
		execv(argv[0], argv);
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
		"commits", "commit_failures", "io_errors",
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

/* ---- results -------------------------------------------------------------- */

enum { UNIT_RATE, UNIT_TIME };

struct row {
	char label[64];
	double f, b;
	bool has_f, has_b;
	const char *fmt;
};

struct phase {
	char name[64];
	double per;             /* divisor for per-item figures (0: none) */
	const char *per_what;
	struct snap d;
};

#define MAX_ROWS 16
#define MAX_PHASES 16

struct bench {
	struct opts o;
	bool mounted;
	bool cold_ok;
	bool tmpfs;             /* the scratch filesystem is RAM: nothing is cold */
	int data_errors;
	struct snap overhead;   /* what reading .stats itself costs */
	struct row rows[MAX_ROWS];
	size_t nrows;
	struct phase phases[MAX_PHASES];
	size_t nphases;
	char notes[16][256];
	size_t nnotes;
	unsigned char *buf;     /* BLOCK bytes, aligned */
};

static struct row *row_add(struct bench *b, const char *label, const char *fmt)
{
	struct row *r;

	if (b->nrows == MAX_ROWS)
		return NULL;
	r = &b->rows[b->nrows++];
	memset(r, 0, sizeof(*r));
	snprintf(r->label, sizeof(r->label), "%s", label);
	r->fmt = fmt;
	return r;
}

static void note(struct bench *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void note(struct bench *b, const char *fmt, ...)
{
	va_list ap;

	if (b->nnotes == sizeof(b->notes) / sizeof(b->notes[0]))
		return;
	va_start(ap, fmt);
	vsnprintf(b->notes[b->nnotes++], sizeof(b->notes[0]), fmt, ap);
	va_end(ap);
}

static void phase_add(struct bench *b, const char *name, const struct snap *before,
		      const struct snap *after, double per, const char *per_what)
{
	struct phase *p;

	if (b->nphases == MAX_PHASES)
		return;
	p = &b->phases[b->nphases++];
	snprintf(p->name, sizeof(p->name), "%s", name);
	p->per = per;
	p->per_what = per_what;
	snap_diff(after, before, &b->overhead, &p->d);
}

/* ---- mounting -------------------------------------------------------------- */

static int ferry_mount(struct bench *b)
{
	char cache_mib[32];
	struct snap s0, s1;
	char *argv[] = {
		(char *)b->o.ferry, "mount", "--cache-dir", (char *)b->o.cache_dir,
		"--cache-size", cache_mib, "--staging-dir", (char *)b->o.staging_dir,
		(char *)b->o.volume, (char *)b->o.mnt, NULL,
	};
	int rc;

	snprintf(cache_mib, sizeof(cache_mib), "%lu", b->o.cache_mib);
	rc = run_cmd(argv, true);
	if (rc != 0) {
		errf("`ferry mount %s %s` failed (exit %d); see the lines above and the "
		     "volume's ferry-mountd.log", b->o.volume, b->o.mnt, rc);
		return -1;
	}
	b->mounted = true;
	/* Remember ferry-mountd's pid so scripts/bench can end it should we die. */
	if (b->o.pidfile) {
		char path[PATH_MAX], line[128];
		FILE *f;

		snprintf(path, sizeof(path), "%s/.stats", b->o.mnt);
		f = fopen(path, "re");
		if (f) {
			while (fgets(line, sizeof(line), f)) {
				int pid;
				if (sscanf(line, "pid %d", &pid) == 1) {
					FILE *pf = fopen(b->o.pidfile, "we");
					if (pf) {
						fprintf(pf, "%d\n", pid);
						fclose(pf);
					}
					break;
				}
			}
			fclose(f);
		}
	}
	/* Two snapshots with nothing between: the cost of one .stats read. */
	if (snap_take(b->o.mnt, &s0) < 0 || snap_take(b->o.mnt, &s1) < 0)
		return -1;
	snap_diff(&s1, &s0, NULL, &b->overhead);
	return 0;
}

static int ferry_umount(struct bench *b, double *secs)
{
	char *argv[] = { (char *)b->o.ferry, "umount", (char *)b->o.mnt, NULL };
	double t0 = now_s();
	int rc;

	rc = run_cmd(argv, true);
	if (secs)
		*secs = now_s() - t0;
	if (rc != 0) {
		errf("`ferry umount %s` failed (exit %d)", b->o.mnt, rc);
		return -1;
	}
	b->mounted = false;
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
		      struct snap *mid /* taken before close, may be NULL */)
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
	if (mid && snap_take(b->o.mnt, mid) < 0) {
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

/* create + write(file_size) + close, files times, in a new directory. */
static int small_files(struct bench *b, const char *dir, double *secs)
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
	t0 = now_s();
	for (unsigned long i = 0; i < n; i++) {
		int fd;

		snprintf(name, sizeof(name), "f%07lu", i);
		small_content(b->buf, size, i);
		fd = openat(dfd, name, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
		if (fd < 0) {
			errf("create %s/%s: %s", dir, name, strerror(errno));
			goto fail;
		}
		if (write_full(fd, b->buf, size) < 0) {
			errf("write %s/%s: %s", dir, name, strerror(errno));
			close(fd);
			goto fail;
		}
		if (close(fd) < 0) {
			errf("close %s/%s (commit): %s", dir, name, strerror(errno));
			goto fail;
		}
	}
	*secs = now_s() - t0;
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

/* ---- output -------------------------------------------------------------- */

static void fmt_val(char *out, size_t len, const char *fmt, bool has, double v)
{
	if (!has)
		snprintf(out, len, "-");
	else
		snprintf(out, len, fmt, v);
}

static void fmt_ratio(char *out, size_t len, const struct row *r)
{
	double q;

	if (!r->has_f || !r->has_b || r->b <= 0) {
		snprintf(out, len, "-");
		return;
	}
	q = r->f / r->b;
	if (q >= 100)
		snprintf(out, len, "%.0f", q);
	else if (q >= 10)
		snprintf(out, len, "%.1f", q);
	else if (q >= 0.1)
		snprintf(out, len, "%.2f", q);
	else
		snprintf(out, len, "%.2g", q);
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

static void print_report(struct bench *b, int argc, char **argv)
{
	char fv[32], bv[32], rv[32];

	printf("\nferryfs benchmark\n");
	if (b->o.command)
		printf("command: %s\n", b->o.command);
	printf("ran:    ");
	for (int i = 0; i < argc; i++)
		print_quoted(argv[i]);
	printf("\n");
	if (b->o.scratch_desc)
		printf("scratch filesystem (baseline dir, ferryfs store/cache/staging/metadata): %s\n",
		       b->o.scratch_desc);
	printf("sizes: seq file %lu MiB in 1 MiB blocks; random writes 4 KiB into a %lu MiB file "
	       "for %.0f s; %lu files of %lu bytes\n",
	       b->o.size_mib, b->o.rand_mib, b->o.seconds, b->o.files, b->o.file_size);
	printf("MB = 10^6 bytes; ratio = ferryfs / baseline (rates: higher is better for ferryfs; "
	       "times: lower is better)\n\n");

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
	       "close() uploads to the store and commits the metadata.\n");
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
	printf("  rand write: pwrite() 4 KiB at random 4 KiB-aligned offsets of a prefilled file "
	       "(baseline: the same offsets, same count); close() timed apart.\n");
	printf("  small files: openat(O_CREAT|O_EXCL) + write() + close() per file in one new "
	       "directory; on ferryfs every close() commits.\n");
	printf("  durability: a ferryfs close() returns with the data in the object store and the "
	       "metadata committed (fsync'd); a baseline close() leaves the\n"
	       "                data in the page cache, except in the 'seq write + fsync' row.\n");
	for (size_t i = 0; i < b->nnotes; i++)
		printf("  %s\n", b->notes[i]);

	printf("\nferryfs FUSE requests per phase (MOUNTPOINT/.stats after - before, minus one .stats read;"
	       " +-1 lookup from the .stats read itself):\n");
	for (size_t i = 0; i < b->nphases; i++) {
		struct phase *p = &b->phases[i];
		int col = 0;

		printf("  %-22s", p->name);
		for (size_t k = 0; k < p->d.n; k++) {
			const char *nm = p->d.name[k];
			if (strncmp(nm, "fuse_requests_", 14) != 0 || p->d.val[k] == 0)
				continue;
			if (col && col % 6 == 0)
				printf("\n  %-22s", "");
			printf(" %s=%" PRIu64, nm + 14, p->d.val[k]);
			col++;
		}
		if (!col)
			printf(" (none)");
		printf("\n  %-22s", "");
		col = 0;
		for (size_t k = 0; k < p->d.n; k++) {
			const char *nm = p->d.name[k];
			if (strncmp(nm, "fuse_requests_", 14) == 0 || p->d.val[k] == 0)
				continue;
			printf(" %s=%" PRIu64, nm, p->d.val[k]);
			col++;
		}
		if (!col)
			printf(" (no store/cache activity)");
		printf("\n");
		if (p->per > 0) {
			static const char *const key_ops[] = {
				"write", "getxattr", "lookup", "create", "flush", "release", "getattr",
			};
			char nm[64];

			printf("  %-22s per %s:", "", p->per_what);
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
	if (b->data_errors)
		printf("\nDATA ERRORS: %d (see the messages above); the figures are not trustworthy\n",
		       b->data_errors);
	fflush(stdout);
}

/* ---- main ------------------------------------------------------------------ */

static void usage(FILE *f)
{
	fprintf(f,
		"usage: ferry_bench --ferry PATH --volume VOL --mountpoint DIR --cache-dir DIR\n"
		"                   --staging-dir DIR --baseline DIR [options]\n"
		"Mounts VOL (already formatted) at DIR with `ferry mount`, measures, unmounts.\n"
		"Normally run by scripts/bench, which makes the scratch filesystem.\n"
		"  --cache-size MIB     ferryfs read cache limit (default 4096)\n"
		"  --size-mib N         sequential file size (default 1024)\n"
		"  --rand-size-mib N    random-write file size (default 256)\n"
		"  --seconds S          random-write duration on ferryfs (default 10)\n"
		"  --rand-max-ops N     cap on random writes (default 10000000)\n"
		"  --files N            small files (default 10000)\n"
		"  --file-size BYTES    small file size (default 2048)\n"
		"  --no-fsync-row       skip the write+fsync row\n"
		"  --seed N             random offsets seed\n"
		"  --pidfile FILE       write ferry-mountd's pid there after each mount\n"
		"  --scratch-desc TEXT  --command TEXT   printed in the report header\n");
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
		{ "volume", required_argument, NULL, 'V' },
		{ "mountpoint", required_argument, NULL, 'M' },
		{ "cache-dir", required_argument, NULL, 'C' },
		{ "cache-size", required_argument, NULL, 'Z' },
		{ "staging-dir", required_argument, NULL, 'T' },
		{ "baseline", required_argument, NULL, 'B' },
		{ "size-mib", required_argument, NULL, 's' },
		{ "rand-size-mib", required_argument, NULL, 'r' },
		{ "seconds", required_argument, NULL, 't' },
		{ "rand-max-ops", required_argument, NULL, 'R' },
		{ "files", required_argument, NULL, 'n' },
		{ "file-size", required_argument, NULL, 'z' },
		{ "no-fsync-row", no_argument, NULL, 'N' },
		{ "seed", required_argument, NULL, 'S' },
		{ "pidfile", required_argument, NULL, 'P' },
		{ "scratch-desc", required_argument, NULL, 'D' },
		{ "command", required_argument, NULL, 'c' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	unsigned long v;
	int c;

	*o = (struct opts){
		.cache_mib = 4096, .size_mib = 1024, .rand_mib = 256, .files = 10000,
		.file_size = 2048, .seconds = 10, .rand_max_ops = 10000000,
		.seed = 0x9e3779b97f4a7c15ull, .fsync_row = true,
	};
	while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
		switch (c) {
		case 'F': o->ferry = optarg; break;
		case 'V': o->volume = optarg; break;
		case 'M': o->mnt = optarg; break;
		case 'C': o->cache_dir = optarg; break;
		case 'T': o->staging_dir = optarg; break;
		case 'B': o->baseline = optarg; break;
		case 'P': o->pidfile = optarg; break;
		case 'D': o->scratch_desc = optarg; break;
		case 'c': o->command = optarg; break;
		case 'N': o->fsync_row = false; break;
		case 'Z': if (parse_ul(optarg, "--cache-size", &o->cache_mib) < 0) return -1; break;
		case 's': if (parse_ul(optarg, "--size-mib", &o->size_mib) < 0) return -1; break;
		case 'r': if (parse_ul(optarg, "--rand-size-mib", &o->rand_mib) < 0) return -1; break;
		case 'R': if (parse_ul(optarg, "--rand-max-ops", &o->rand_max_ops) < 0) return -1; break;
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
	if (optind != argc || !o->ferry || !o->volume || !o->mnt || !o->cache_dir ||
	    !o->staging_dir || !o->baseline) {
		usage(stderr);
		return -1;
	}
	if (o->size_mib == 0 || o->rand_mib == 0 || o->files == 0 || o->file_size == 0 ||
	    o->file_size > BLOCK / 4 || o->rand_max_ops == 0) {
		errf("sizes must be positive (and --file-size at most %u)", BLOCK / 4);
		return -1;
	}
	return 0;
}

int main(int argc, char **argv)
{
	struct bench *b = calloc(1, sizeof(*b));
	char *fseq = NULL, *bseq = NULL, *fseq2 = NULL, *bseq2 = NULL;
	char *frand = NULL, *brand = NULL, *fsmall = NULL, *bsmall = NULL;
	struct snap s0, s1, smid;
	uint64_t seq_bytes, rand_bytes;
	double t, tc, t_umount = 0;
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
	{
		struct statfs sf;
		if (statfs(b->o.baseline, &sf) < 0) {
			errf("statfs %s: %s", b->o.baseline, strerror(errno));
			goto out;
		}
		b->tmpfs = sf.f_type == 0x01021994; /* TMPFS_MAGIC */
	}
	if (geteuid() != 0)
		errf("warning: not root: dropping the page cache for cold reads will fail");
	seq_bytes = (uint64_t)b->o.size_mib * MIB;
	rand_bytes = (uint64_t)b->o.rand_mib * MIB;
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
	if (!(fseq = path_join(b->o.mnt, "seq.dat")) || !(bseq = path_join(b->o.baseline, "seq.dat")) ||
	    !(fseq2 = path_join(b->o.mnt, "seq-fsync.dat")) ||
	    !(bseq2 = path_join(b->o.baseline, "seq-fsync.dat")) ||
	    !(frand = path_join(b->o.mnt, "rand.dat")) || !(brand = path_join(b->o.baseline, "rand.dat")) ||
	    !(fsmall = path_join(b->o.mnt, "small")) || !(bsmall = path_join(b->o.baseline, "small"))) {
		errf("out of memory");
		goto out;
	}

	progress("mounting ferryfs at %s", b->o.mnt);
	if (ferry_mount(b) < 0)
		goto out;

	/* -- sequential write -- */
	{
		struct row *r = row_add(b, "seq write 1 MiB, incl. close (MB/s)", "%.1f");
		double fclose_s = 0, bclose_s = 0;

		progress("seq write %lu MiB on ferryfs", b->o.size_mib);
		if (snap_take(b->o.mnt, &s0) < 0 || seq_write(b, fseq, seq_bytes, false, &t, &fclose_s) < 0 ||
		    snap_take(b->o.mnt, &s1) < 0)
			goto out;
		phase_add(b, "seq write", &s0, &s1, 0, NULL);
		r->f = (double)seq_bytes / 1e6 / t;
		r->has_f = true;
		progress("seq write %lu MiB on baseline", b->o.size_mib);
		if (seq_write(b, bseq, seq_bytes, false, &t, &bclose_s) < 0)
			goto out;
		r->b = (double)seq_bytes / 1e6 / t;
		r->has_b = true;
		note(b, "seq write: close() took %.3f s on ferryfs (upload + commit), %.3f s on baseline.",
		     fclose_s, bclose_s);
	}
	if (b->o.fsync_row) {
		struct row *r = row_add(b, "seq write 1 MiB + fsync + close (MB/s)", "%.1f");
		double fc = 0, bc = 0;

		progress("seq write + fsync on ferryfs");
		if (snap_take(b->o.mnt, &s0) < 0 || seq_write(b, fseq2, seq_bytes, true, &t, &fc) < 0 ||
		    snap_take(b->o.mnt, &s1) < 0)
			goto out;
		phase_add(b, "seq write + fsync", &s0, &s1, 0, NULL);
		r->f = (double)seq_bytes / 1e6 / t;
		r->has_f = true;
		progress("seq write + fsync on baseline");
		if (seq_write(b, bseq2, seq_bytes, true, &t, &bc) < 0)
			goto out;
		r->b = (double)seq_bytes / 1e6 / t;
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
		if (ferry_umount(b, NULL) < 0 || clear_dir(b->o.cache_dir) < 0)
			goto out;
		c1 = drop_caches(NULL);
		if (ferry_mount(b) < 0)
			goto out;
		if (snap_take(b->o.mnt, &s0) < 0 || seq_read(b, fseq, seq_bytes, false, &t) < 0 ||
		    snap_take(b->o.mnt, &s1) < 0)
			goto out;
		phase_add(b, "seq read cold", &s0, &s1, 0, NULL);
		rc_cold->f = (double)seq_bytes / 1e6 / t;
		rc_cold->has_f = true;
		progress("seq read cold on baseline (fadvise DONTNEED + drop_caches)");
		c2 = drop_caches(bseq);
		b->cold_ok = c1 && c2;
		if (seq_read(b, bseq, seq_bytes, false, &t) < 0)
			goto out;
		rc_cold->b = (double)seq_bytes / 1e6 / t;
		rc_cold->has_b = true;

		progress("seq read from the read cache on ferryfs (remount)");
		if (ferry_umount(b, NULL) < 0 || ferry_mount(b) < 0)
			goto out;
		if (snap_take(b->o.mnt, &s0) < 0 || seq_read(b, fseq, seq_bytes, false, &t) < 0 ||
		    snap_take(b->o.mnt, &s1) < 0)
			goto out;
		phase_add(b, "seq read read-cache", &s0, &s1, 0, NULL);
		rc_cache->f = (double)seq_bytes / 1e6 / t;
		rc_cache->has_f = true;
		progress("seq read (page cache) on baseline");
		if (seq_read(b, bseq, seq_bytes, false, &t) < 0)
			goto out;
		rc_cache->b = (double)seq_bytes / 1e6 / t;
		rc_cache->has_b = true;

		progress("seq re-read on both");
		if (snap_take(b->o.mnt, &s0) < 0 || seq_read(b, fseq, seq_bytes, false, &t) < 0 ||
		    snap_take(b->o.mnt, &s1) < 0)
			goto out;
		phase_add(b, "seq re-read", &s0, &s1, 0, NULL);
		rc_page->f = (double)seq_bytes / 1e6 / t;
		rc_page->has_f = true;
		if (seq_read(b, bseq, seq_bytes, false, &t) < 0)
			goto out;
		rc_page->b = (double)seq_bytes / 1e6 / t;
		rc_page->has_b = true;

		progress("verifying every byte of %s (untimed)", fseq);
		if (seq_read(b, fseq, seq_bytes, true, &t) < 0)
			goto out;
		note(b, "data check: %s read back byte for byte (stamps in every timed read, "
		     "full compare once).", "seq.dat");
		if (unlink(fseq) < 0 || unlink(bseq) < 0) {
			errf("unlink seq.dat: %s", strerror(errno));
			goto out;
		}
	}

	/* -- random 4 KiB writes -- */
	{
		struct row *r_iops = row_add(b, "rand write 4 KiB (IOPS)", "%.0f");
		struct row *r_close = row_add(b, "rand write: close() after (ms)", "%.3f");
		unsigned long ops = b->o.rand_max_ops, bops;
		double tw, tcl;

		progress("prefilling %lu MiB for random writes on both", b->o.rand_mib);
		if (seq_write(b, frand, rand_bytes, false, &t, &tc) < 0 ||
		    seq_write(b, brand, rand_bytes, false, &t, &tc) < 0)
			goto out;
		progress("random 4 KiB writes on ferryfs for %.0f s", b->o.seconds);
		if (snap_take(b->o.mnt, &s0) < 0 ||
		    rand_write(b, frand, rand_bytes, b->o.seconds, &ops, &tw, &tcl, &smid) < 0 ||
		    snap_take(b->o.mnt, &s1) < 0)
			goto out;
		phase_add(b, "rand write (pwrites)", &s0, &smid, (double)ops, "write");
		phase_add(b, "rand write close()", &smid, &s1, 0, NULL);
		r_iops->f = (double)ops / tw;
		r_iops->has_f = true;
		r_close->f = tcl * 1e3;
		r_close->has_f = true;
		bops = ops;
		progress("the same %lu random writes on baseline", ops);
		if (rand_write(b, brand, rand_bytes, 0, &bops, &tw, &tcl, NULL) < 0)
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
	{
		struct row *r_fps = row_add(b, "small files create+write+close (files/s)", "%.0f");
		struct row *r_us = row_add(b, "small files (us per file)", "%.1f");
		unsigned long step = b->o.files >= 200 ? b->o.files / 200 : 1;

		progress("%lu small files on ferryfs", b->o.files);
		if (snap_take(b->o.mnt, &s0) < 0 || small_files(b, fsmall, &t) < 0 ||
		    snap_take(b->o.mnt, &s1) < 0)
			goto out;
		phase_add(b, "small files", &s0, &s1, (double)b->o.files, "file");
		r_fps->f = (double)b->o.files / t;
		r_us->f = t * 1e6 / (double)b->o.files;
		r_fps->has_f = r_us->has_f = true;
		progress("%lu small files on baseline", b->o.files);
		if (small_files(b, bsmall, &t) < 0)
			goto out;
		r_fps->b = (double)b->o.files / t;
		r_us->b = t * 1e6 / (double)b->o.files;
		r_fps->has_b = r_us->has_b = true;
		progress("reading back every %lu-th small file on ferryfs (untimed)", step);
		if (small_verify(b, fsmall, step) < 0)
			goto out;
		note(b, "data check: every %lu-th small file (and the last) read back from ferryfs.", step);
	}

	progress("unmounting ferryfs");
	if (ferry_umount(b, &t_umount) < 0)
		goto out;
	note(b, "final `ferry umount` took %.3f s.", t_umount);
	rc = b->data_errors ? 1 : 0;
out:
	if (b->mounted) {
		progress("unmounting ferryfs after an error");
		ferry_umount(b, NULL);
	}
	if (b->nrows)
		print_report(b, argc, argv);
	if (rc != 0)
		errf("benchmark FAILED (see the errors above); the table shows what was measured before");
	free(fseq);
	free(bseq);
	free(fseq2);
	free(bseq2);
	free(frand);
	free(brand);
	free(fsmall);
	free(bsmall);
	free(b->buf);
	free(g_tmpl);
	free(b);
	return rc;
}
