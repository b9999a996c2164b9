/*
 * fsx-style randomized exerciser (issue 10: copy-up correctness under fsx
 * with mmap). Random operations on one file (and, in a second run, on three
 * files at once) through a real mount: pwrite anywhere (holes past EOF
 * included), pread, MAP_SHARED mappings read and written (msync'ed or not),
 * ftruncate and truncate up and down, O_APPEND writes, fallocate (punch
 * hole, allocate), close and reopen for writing (a reopen of a file with
 * content copies it up into a new staging file; sometimes O_TRUNC) or for
 * reading, fsync/fdatasync of any fd, a shared mapping written after its
 * file's last close, a mapping held across many steps (closes, reopens,
 * truncates), and remounts. At the end the volume is mounted with an empty
 * read cache and every byte must come back from the object store.
 *
 * Each step is applied to the ferryfs file, to a plain file on the local
 * disk (the oracle: ext4 answers every POSIX question) and to an in-memory
 * model. The size is compared after every step, the whole content every
 * few steps and always after an open or remount. A disagreement between
 * the model and the oracle is a bug of this test, not of ferryfs.
 *
 * A second suite mounts with -o passthrough_copy_max=64k, so a reopen of
 * all but the smallest files takes the daemon path (staging file with
 * dirty ranges) instead of a copy-up.
 *
 * Reproducing a failure: the failure names the seed and the test, and logs
 * the last steps. FERRY_FSX_SEED=N replays a run (the same seed gives the
 * same steps); FERRY_FSX_OPS=N changes the number of steps (a longer soak).
 */
#include "mount_util.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/falloc.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define KiB (1024L)
#define MiB (1024L * 1024)
/* Files stay below this: big enough that a copy-up moves real content and
 * crosses the 4 MiB block boundary, small enough for many reopens. */
#define MAX_SIZE (5 * MiB + 12345)
#define MAX_FILES 3
/* Log lines kept for a failure's report (a step logs one or a few). */
#define RING 160
#define PAGE 4096L
/* Steps per test (FERRY_FSX_OPS overrides): a few seconds each here, well
 * inside the timeout under ASan on a loaded 2-core machine. */
#define NOPS 600

TestSuite(fsx, .init = fm_setup, .fini = fm_teardown, .timeout = 300);

/* ---- state ------------------------------------------------------------- */

struct file {
	char path[PATH_MAX];   /* in the mount */
	char opath[PATH_MAX];  /* the oracle, on the local disk */
	int wfd;               /* O_RDWR on the mount, -1 if closed */
	int rfd;               /* O_RDONLY on the mount, -1 if closed */
	int ofd;               /* the oracle, O_RDWR, always open */
	unsigned char *model;  /* MAX_SIZE bytes; zeros past size */
	size_t size;
	/* A mapping held across steps (K_HOLD), on the mount and on the
	 * oracle, of [hoff, hoff+hlen); NULL if none. */
	unsigned char *hp, *hq;
	size_t hoff, hlen;
	bool hrw;
};

/* One logged step: its text and the byte range it changed (len 0: none),
 * to name the steps that touched a wrong byte. */
struct logged {
	int op;
	int file;
	size_t off, len;
	char text[136];
};

enum kind {
	K_PWRITE, K_PREAD, K_MMAP_READ, K_MMAP_WRITE, K_TRUNCATE, K_APPEND, K_REOPEN_RW,
	K_REOPEN_RO, K_FSYNC, K_CLOSE, K_LINGER, K_HOLD, K_FALLOCATE, K_SETTLE, K_REMOUNT,
	K_UPGRADE, K_COUNT
};

static const char *const kind_names[K_COUNT] = {
	"pwrite", "pread", "mmap_read", "mmap_write", "truncate", "append", "reopen_rw",
	"reopen_ro", "fsync", "close", "linger", "hold", "fallocate", "settle", "remount",
	"upgrade",
};

/* The weights of the steps, out of their sum. */
static const int kind_weight[K_COUNT] = {
	[K_PWRITE] = 22, [K_PREAD] = 12, [K_MMAP_READ] = 7, [K_MMAP_WRITE] = 10,
	[K_TRUNCATE] = 8, [K_APPEND] = 6, [K_REOPEN_RW] = 10, [K_REOPEN_RO] = 6,
	[K_FSYNC] = 7, [K_CLOSE] = 4, [K_LINGER] = 4, [K_HOLD] = 6, [K_FALLOCATE] = 3,
	[K_SETTLE] = 2, [K_REMOUNT] = 1, [K_UPGRADE] = 1,
};

/* The whole run: one per test process (Criterion forks each test), global
 * so that any check can dump the log. */
static struct {
	const char *name;      /* the test, for the failure message */
	uint64_t seed;         /* FERRY_FSX_SEED or the default */
	uint64_t rs;           /* the PRNG of this run */
	int op;                /* current step */
	int cur;               /* file of the current step */
	struct logged ring[RING];
	int nlog;
	struct file f[MAX_FILES];
	int nfiles;
	unsigned char *buf;    /* scratch, MAX_SIZE */
	unsigned char *got;    /* scratch, MAX_SIZE */
	int count[K_COUNT];
	bool pt_off;           /* the mount has passthrough=off */
	int linger_seen, linger_unseen; /* wait_mapping_seen() */
	int settled, unsettled;         /* wait_staging_gone() */
	int copied_up;                  /* opens that copied the file up */
	bool running, reported;         /* run() under way; fail_at() logged */
	int full_checks;
	int upgrades;             /* ferry mount --upgrade steps done */
	/* Figures of the mounts before the current one (remounts restart
	 * ferry-mountd's counters). */
	uint64_t copy_ups, too_big, mapped_after_close, pt_opens, daemon_writes;
} X;

static void check_hold(struct file *f, const char *when);
static void check_content(struct file *f, int fd, const char *when);

static uint64_t rnd(uint64_t n)
{
	return n ? fm_rand(&X.rs) % n : 0;
}

/* ---- log and failure -------------------------------------------------- */

static void logop(size_t off, size_t len, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static void logop(size_t off, size_t len, const char *fmt, ...)
{
	struct logged *l = &X.ring[X.nlog % RING];
	va_list ap;

	l->op = X.op;
	l->file = X.cur;
	l->off = off;
	l->len = len;
	va_start(ap, fmt);
	vsnprintf(l->text, sizeof(l->text), fmt, ap);
	va_end(ap);
	X.nlog++;
}

static void dump_log(size_t bad_off, bool have_bad)
{
	int from = X.nlog > RING ? X.nlog - RING : 0;

	cr_log_error("fsx %s: seed 0x%llx (FERRY_FSX_SEED=0x%llx replays), the log of steps "
		     "#%d to #%d:", X.name, (unsigned long long)X.seed, (unsigned long long)X.seed,
		     X.ring[from % RING].op, X.op);
	for (int i = from; i < X.nlog; i++) {
		const struct logged *l = &X.ring[i % RING];
		bool touched = have_bad && l->file == X.cur && l->len && bad_off >= l->off &&
			       bad_off < l->off + l->len;

		cr_log_error("  #%d f%d %s%s", l->op, l->file, l->text,
			     touched ? "   <-- touched the first wrong byte" : "");
	}
}

static void fail_at(size_t bad_off, bool have_bad, const char *fmt, ...)
	__attribute__((format(printf, 3, 4), noreturn));
static void fail_at(size_t bad_off, bool have_bad, const char *fmt, ...)
{
	char msg[1024];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	dump_log(bad_off, have_bad);
	X.reported = true;
	cr_assert_fail("fsx %s, step %d, file f%d: %s\n(seed 0x%llx: FERRY_FSX_SEED=0x%llx "
		       "replays it; the last steps are logged above)", X.name, X.op, X.cur, msg,
		       (unsigned long long)X.seed, (unsigned long long)X.seed);
	abort(); /* not reached */
}

#define FAIL(...) fail_at(0, false, __VA_ARGS__)

/* A system call that must not fail; on failure the log is dumped. */
#define SYS(expr)                                                             \
	({                                                                    \
		errno = 0;                                                    \
		__typeof__(expr) sys_r_ = (expr);                             \
		if (sys_r_ < 0)                                               \
			FAIL("%s:%d: %s: %s", __FILE__, __LINE__, #expr,      \
			     fm_errname(errno));                              \
		sys_r_;                                                       \
	})

/* ---- I/O helpers ------------------------------------------------------ */

/* pread until len bytes or EOF: the count read. */
static size_t pread_full(int fd, void *buf, size_t len, off_t off, const char *what)
{
	size_t done = 0;

	while (done < len) {
		ssize_t n = pread(fd, (char *)buf + done, len - done, off + (off_t)done);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			FAIL("pread %s (%zu at %lld): %s", what, len - done,
			     (long long)(off + (off_t)done), fm_errname(errno));
		if (n == 0)
			break;
		done += (size_t)n;
	}
	return done;
}

static void pwrite_full(int fd, const void *buf, size_t len, off_t off, const char *what)
{
	size_t done = 0;

	while (done < len) {
		ssize_t n = pwrite(fd, (const char *)buf + done, len - done, off + (off_t)done);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			FAIL("pwrite %s (%zu at %lld): %s", what, len - done,
			     (long long)(off + (off_t)done), n < 0 ? fm_errname(errno) : "wrote 0");
		done += (size_t)n;
	}
}

static void write_full(int fd, const void *buf, size_t len, const char *what)
{
	size_t done = 0;

	while (done < len) {
		ssize_t n = write(fd, (const char *)buf + done, len - done);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			FAIL("write %s (%zu bytes): %s", what, len - done,
			     n < 0 ? fm_errname(errno) : "wrote 0");
		done += (size_t)n;
	}
}

static off_t size_of_fd(int fd)
{
	struct stat st;

	SYS(fstat(fd, &st));
	return st.st_size;
}

static void close_fd(int *fd, const char *what)
{
	if (*fd < 0)
		return;
	if (close(*fd) != 0)
		FAIL("close of %s: %s", what, fm_errname(errno));
	*fd = -1;
}

/* ---- mappings ---------------------------------------------------------- */

/*
 * Copies to or from a mapping with SIGBUS caught: a page the mapping
 * cannot back (the file on ferryfs is shorter than the model says) would
 * otherwise kill the test without its log.
 */
static sigjmp_buf bus_jmp;
static volatile sig_atomic_t bus_armed;

static void on_sigbus(int sig)
{
	if (bus_armed)
		siglongjmp(bus_jmp, 1);
	signal(sig, SIG_DFL);
	raise(sig);
}

static void map_copy(void *dst, const void *src, size_t len, const char *what, size_t off)
{
	static bool installed;

	if (!installed) {
		struct sigaction sa = { .sa_handler = on_sigbus };

		sigemptyset(&sa.sa_mask);
		SYS(sigaction(SIGBUS, &sa, NULL));
		installed = true;
	}
	if (sigsetjmp(bus_jmp, 1)) {
		bus_armed = 0;
		FAIL("SIGBUS on %s (%zu bytes at file offset %zu)", what, len, off);
	}
	bus_armed = 1;
	memcpy(dst, src, len);
	bus_armed = 0;
}

/* ---- checks ----------------------------------------------------------- */

/* The size seen on the mount (through an open fd if there is one, else by
 * path) and the oracle's must be the model's. */
static void check_size(struct file *f, const char *when)
{
	off_t osz = size_of_fd(f->ofd), fsz;
	struct stat st;

	if (osz != (off_t)f->size)
		FAIL("TEST BUG: %s: the oracle's size is %lld, the model's %zu", when,
		     (long long)osz, f->size);
	if (f->wfd >= 0)
		fsz = size_of_fd(f->wfd);
	else if (f->rfd >= 0)
		fsz = size_of_fd(f->rfd);
	else
		fsz = SYS(stat(f->path, &st)) == 0 ? st.st_size : -1;
	if (fsz != (off_t)f->size)
		FAIL("%s: size %lld on ferryfs, %zu on ext4", when, (long long)fsz, f->size);
}

static size_t first_diff(const unsigned char *a, const unsigned char *b, size_t len)
{
	size_t i = 0;

	while (i < len && a[i] == b[i])
		i++;
	return i;
}

static void hex(char *out, size_t outlen, const unsigned char *p, size_t n)
{
	size_t k = 0;

	out[0] = '\0';
	for (size_t i = 0; i < n && k + 3 < outlen; i++)
		k += (size_t)snprintf(out + k, outlen - k, "%02x", p[i]);
}

/* Reports where got and the model differ in [off, off+len) of f. */
static void report_diff(struct file *f, const unsigned char *got, size_t off, size_t len,
			const char *when, const char *how)
{
	size_t d = first_diff(got, f->model + off, len), e = d, zeros = 0;
	char g[40], w[40];

	while (e < len && got[e] != f->model[off + e])
		e++;
	for (size_t i = d; i < e; i++)
		zeros += got[i] == 0;
	hex(g, sizeof(g), got + d, len - d < 16 ? len - d : 16);
	hex(w, sizeof(w), f->model + off + d, len - d < 16 ? len - d : 16);
	fail_at(off + d, true,
		"%s: %s differs from ext4 at offset %zu (file size %zu): %zu bytes wrong from "
		"there (%zu of them zero on ferryfs); ferryfs %s..., ext4 %s...",
		when, how, off + d, f->size, e - d, zeros, g, w);
}

/* The oracle must hold the model (else the test is wrong). */
static void check_oracle(struct file *f, const char *when)
{
	size_t n = pread_full(f->ofd, X.got, f->size + 1, 0, "oracle");

	if (n != f->size)
		FAIL("TEST BUG: %s: the oracle holds %zu bytes, the model %zu", when, n, f->size);
	if (memcmp(X.got, f->model, n) != 0) {
		size_t d = first_diff(X.got, f->model, n);
		FAIL("TEST BUG: %s: the oracle differs from the model at %zu", when, d);
	}
}

/* The whole content of f on the mount, read through fd (a fresh O_RDONLY
 * open if fd < 0), against the model; the oracle against the model too. */
static void check_content(struct file *f, int fd, const char *when)
{
	int own = -1;
	size_t n;
	char how[64];

	X.full_checks++;
	check_oracle(f, when);
	if (fd < 0)
		fd = own = SYS(open(f->path, O_RDONLY));
	snprintf(how, sizeof(how), "the content read through %s",
		 own >= 0 ? "a new O_RDONLY open" : fd == f->wfd ? "the O_RDWR fd" : "the O_RDONLY fd");
	if (size_of_fd(fd) != (off_t)f->size)
		FAIL("%s: size %lld on ferryfs (fstat), %zu on ext4", when,
		     (long long)size_of_fd(fd), f->size);
	/* One byte more than the size: nothing may follow EOF. */
	n = pread_full(fd, X.got, f->size + 1, 0, "ferryfs");
	if (n != f->size)
		FAIL("%s: %s: %zu bytes, ext4 has %zu", when, how, n, f->size);
	if (memcmp(X.got, f->model, n) != 0)
		report_diff(f, X.got, 0, n, when, how);
	close_fd(&own, "the checking fd");
}

/* Any open fd of f that can read, or -1. */
static int any_fd(struct file *f)
{
	if (f->wfd >= 0 && f->rfd >= 0)
		return rnd(2) ? f->wfd : f->rfd;
	return f->wfd >= 0 ? f->wfd : f->rfd;
}

/* ---- opening and closing --------------------------------------------- */

static uint64_t stat_of(const char *name)
{
	static struct fm_stats s;

	fm_stats_read(&s);
	return fm_stats_need(&s, name);
}

/* What ferry-mountd did for an open, told by its figures before and after
 * (logged with the step: a failure says which path each open took). */
struct open_figs {
	uint64_t copy_ups, pt_opens, too_big, inflight_reads, reopen_waits;
};

static void open_figs(struct open_figs *o)
{
	static struct fm_stats s;

	fm_stats_read(&s);
	o->copy_ups = fm_stats_need(&s, "copy_ups");
	o->pt_opens = fm_stats_need(&s, "passthrough_opens");
	o->too_big = fm_stats_need(&s, "copy_up_too_big");
	o->inflight_reads = fm_stats_need(&s, "inflight_reads");
	o->reopen_waits = fm_stats_need(&s, "reopen_waits");
}

/* Opens f with flags, logging what the open was, and checks the whole
 * file through the new fd; true if the open copied the file up into a new
 * staging file. */
static bool open_logged(struct file *f, int flags, int *fd, const char *name)
{
	struct open_figs a, b;
	const char *kind;

	open_figs(&a);
	*fd = SYS(open(f->path, flags));
	open_figs(&b);
	if (b.copy_ups > a.copy_ups)
		kind = "copied up";
	else if (b.pt_opens > a.pt_opens)
		kind = "a new or resumed staging file";
	else if (b.too_big > a.too_big)
		kind = "daemon path: too big to copy up";
	else if (b.inflight_reads > a.inflight_reads)
		kind = "reads the upload in flight";
	else
		kind = "shares an open staging file, or cached mode";
	logop(0, 0, "open %s (size %zu%s%s): %s%s", name, f->size,
	      f->rfd >= 0 && fd != &f->rfd ? ", an O_RDONLY fd open" : "",
	      f->wfd >= 0 && fd != &f->wfd ? ", an O_RDWR fd open" : "", kind,
	      b.reopen_waits > a.reopen_waits ? ", after waiting for an upload" : "");
	if (b.copy_ups > a.copy_ups)
		X.copied_up++;
	/* Whatever the open did, the file is the same. */
	check_content(f, *fd, "right after an open");
	check_hold(f, "right after an open");
	return b.copy_ups > a.copy_ups;
}

static bool open_rw(struct file *f)
{
	return open_logged(f, O_RDWR, &f->wfd, "O_RDWR");
}

static void open_ro(struct file *f)
{
	open_logged(f, O_RDONLY, &f->rfd, "O_RDONLY");
}

static void close_rw(struct file *f, const char *why)
{
	if (f->wfd >= 0)
		logop(0, 0, "close rw%s", why);
	close_fd(&f->wfd, "the O_RDWR fd");
}

static void close_ro(struct file *f)
{
	if (f->rfd >= 0)
		logop(0, 0, "close ro");
	close_fd(&f->rfd, "the O_RDONLY fd");
}

static void close_all(struct file *f)
{
	if (f->wfd >= 0 || f->rfd >= 0)
		logop(0, 0, "close%s%s", f->wfd >= 0 ? " rw" : "", f->rfd >= 0 ? " ro" : "");
	close_fd(&f->wfd, "the O_RDWR fd");
	close_fd(&f->rfd, "the O_RDONLY fd");
}

static void ensure_writer(struct file *f)
{
	if (f->wfd < 0)
		open_rw(f);
}

/* ---- picking offsets and lengths ------------------------------------- */

/* An offset: near a 64 KiB unit edge, the 4 MiB block edge, the current
 * end of file, past it (a hole), or anywhere. */
static size_t pick_off(const struct file *f)
{
	size_t o;

	switch (rnd(10)) {
	case 0:
	case 1:
		o = (size_t)(rnd(MAX_SIZE / (64 * KiB)) * 64 * KiB) + (size_t)rnd(64);
		o = o >= 32 ? o - 32 : o;
		break;
	case 2:
		o = (size_t)(4 * MiB) - 8 * KiB + (size_t)rnd(16 * KiB);
		break;
	case 3:
		o = f->size ? f->size - (size_t)rnd(f->size < 4 * KiB ? f->size : 4 * KiB) : 0;
		break;
	case 4: /* past EOF: a hole */
		o = f->size + (size_t)rnd(MiB);
		break;
	default:
		o = (size_t)rnd(f->size + 64 * KiB);
		break;
	}
	return o < MAX_SIZE - 1 ? o : MAX_SIZE - 1 - (size_t)rnd(64 * KiB);
}

static size_t pick_len(void)
{
	switch (rnd(8)) {
	case 0:
		return 1 + (size_t)rnd(16);
	case 1:
		return (size_t)(256 * KiB) + (size_t)rnd(768 * KiB);
	default:
		return 1 + (size_t)rnd(64 * KiB);
	}
}

/* ---- the steps -------------------------------------------------------- */

/* Applies [off, off+len) of X.buf to the model (grown, zeros between). */
static void model_write(struct file *f, size_t off, size_t len)
{
	memcpy(f->model + off, X.buf, len);
	if (off + len > f->size)
		f->size = off + len;
}

static void do_pwrite(struct file *f)
{
	size_t off = pick_off(f), len = pick_len();

	if (off + len > MAX_SIZE)
		len = MAX_SIZE - off;
	ensure_writer(f);
	fm_fill_random(&X.rs, X.buf, len);
	logop(off, len, "pwrite %zu at %zu (size %zu)%s", len, off, f->size,
	      off > f->size ? " past EOF" : "");
	pwrite_full(f->wfd, X.buf, len, (off_t)off, "ferryfs");
	pwrite_full(f->ofd, X.buf, len, (off_t)off, "oracle");
	model_write(f, off, len);
}

static void do_pread(struct file *f)
{
	size_t off = (size_t)rnd(f->size + 16 * KiB), len = pick_len(), want, a, b;
	int fd;

	if (off > MAX_SIZE)
		off = MAX_SIZE;
	if (any_fd(f) < 0)
		open_ro(f);
	fd = any_fd(f);
	want = off >= f->size ? 0 : f->size - off < len ? f->size - off : len;
	logop(0, 0, "pread %zu at %zu through the %s fd (size %zu)", len, off,
	      fd == f->wfd ? "rw" : "ro", f->size);
	a = pread_full(fd, X.got, len, (off_t)off, "ferryfs");
	b = pread_full(f->ofd, X.buf, len, (off_t)off, "oracle");
	if (b != want || memcmp(X.buf, f->model + off, b) != 0)
		FAIL("TEST BUG: pread of the oracle: %zu bytes, the model %zu (or the bytes differ)",
		     b, want);
	if (a != want)
		FAIL("pread %zu at %zu: %zu bytes on ferryfs, %zu on ext4", len, off, a, want);
	if (memcmp(X.got, f->model + off, a) != 0)
		report_diff(f, X.got, off, a, "pread", "a pread");
}

/* A page-aligned window [*moff, *moff + *mlen) of a non-empty file. */
static void pick_window(const struct file *f, size_t *moff, size_t *mlen)
{
	*moff = rnd(3) == 0 ? 0 : (size_t)rnd(f->size) & ~(size_t)(PAGE - 1);
	*mlen = f->size - *moff;
	if (rnd(2))
		*mlen = 1 + (size_t)rnd(*mlen);
}

static unsigned char *map(int fd, size_t off, size_t len, int prot, const char *what)
{
	void *p = mmap(NULL, len, prot, MAP_SHARED, fd, (off_t)off);

	if (p == MAP_FAILED)
		FAIL("mmap of %s (%zu at %zu, prot %d): %s", what, len, off, prot,
		     fm_errname(errno));
	return p;
}

static void do_mmap_read(struct file *f)
{
	size_t moff, mlen;
	unsigned char *p;
	int fd;

	if (f->size == 0)
		return;
	if (any_fd(f) < 0)
		open_ro(f);
	fd = any_fd(f);
	pick_window(f, &moff, &mlen);
	logop(0, 0, "mmap read %zu at %zu through the %s fd (size %zu)", mlen, moff,
	      fd == f->wfd ? "rw" : "ro", f->size);
	p = map(fd, moff, mlen, PROT_READ, "ferryfs");
	map_copy(X.got, p, mlen, "a read of the mapping", moff);
	SYS(munmap(p, mlen));
	if (memcmp(X.got, f->model + moff, mlen) != 0)
		report_diff(f, X.got, moff, mlen, "mmap read", "a MAP_SHARED mapping");
}

/* A few random stores into the mapping p of [moff, moff+mlen), and the
 * same into the oracle's mapping q (if any) and the model. */
static void store_into(struct file *f, unsigned char *p, unsigned char *q, size_t moff,
		       size_t mlen, const char *how)
{
	int n = 1 + (int)rnd(4);

	for (int k = 0; k < n; k++) {
		size_t at = (size_t)rnd(mlen), len = 1 + (size_t)rnd(rnd(4) ? 8 * KiB : 512 * KiB);

		if (at + len > mlen)
			len = mlen - at;
		fm_fill_random(&X.rs, X.buf, len);
		logop(moff + at, len, "  %s store %zu at %zu", how, len, moff + at);
		map_copy(p + at, X.buf, len, "a store into the mapping", moff + at);
		if (q)
			memcpy(q + at, X.buf, len);
		memcpy(f->model + moff + at, X.buf, len);
	}
}

static void do_mmap_write(struct file *f)
{
	size_t moff, mlen;
	unsigned char *p, *q;
	uint64_t how;

	if (f->size == 0)
		return;
	ensure_writer(f);
	pick_window(f, &moff, &mlen);
	how = rnd(3);
	logop(0, 0, "mmap write %zu at %zu (size %zu), then %s", mlen, moff, f->size,
	      how == 0 ? "msync(MS_SYNC)" : how == 1 ? "msync(MS_ASYNC)" : "munmap, no msync");
	p = map(f->wfd, moff, mlen, PROT_READ | PROT_WRITE, "ferryfs");
	q = map(f->ofd, moff, mlen, PROT_READ | PROT_WRITE, "oracle");
	store_into(f, p, q, moff, mlen, "mmap");
	if (how < 2) {
		SYS(msync(p, mlen, how == 0 ? MS_SYNC : MS_ASYNC));
		SYS(msync(q, mlen, how == 0 ? MS_SYNC : MS_ASYNC));
	}
	SYS(munmap(p, mlen));
	SYS(munmap(q, mlen));
}

static void model_truncate(struct file *f, size_t ns)
{
	if (ns < f->size)
		memset(f->model + ns, 0, f->size - ns);
	f->size = ns;
}

static void do_truncate(struct file *f)
{
	size_t ns;
	bool by_path;

	switch (rnd(5)) {
	case 0: /* small: below passthrough_copy_max=64k, or just at it */
		ns = rnd(4) ? (size_t)rnd(64 * KiB) : (size_t)(64 * KiB) - 1 + (size_t)rnd(3);
		break;
	case 1: /* grow: a hole at the end */
		ns = f->size + (size_t)rnd(MiB);
		break;
	case 2: /* to a unit edge */
		ns = (size_t)(rnd(MAX_SIZE / (64 * KiB)) * 64 * KiB);
		break;
	default: /* shrink a little or a lot */
		ns = (size_t)rnd(f->size + 1);
		break;
	}
	if (ns > MAX_SIZE)
		ns = MAX_SIZE;
	/* truncate(2) by path when there is no writer, and sometimes anyway */
	by_path = f->wfd < 0 || rnd(4) == 0;
	logop(0, 0, "%s %zu (was %zu)", by_path ? "truncate(path)" : "ftruncate", ns, f->size);
	if (by_path)
		SYS(truncate(f->path, (off_t)ns));
	else
		SYS(ftruncate(f->wfd, (off_t)ns));
	SYS(ftruncate(f->ofd, (off_t)ns));
	model_truncate(f, ns);
}

static void do_append(struct file *f)
{
	size_t len = 1 + (size_t)rnd(rnd(4) ? 64 * KiB : 512 * KiB);
	int fd, ofd;
	off_t at;

	if (f->size + len > MAX_SIZE)
		return;
	fm_fill_random(&X.rs, X.buf, len);
	logop(f->size, len, "O_APPEND write %zu (size %zu), own fd", len, f->size);
	fd = SYS(open(f->path, O_WRONLY | O_APPEND));
	ofd = SYS(open(f->opath, O_WRONLY | O_APPEND));
	write_full(fd, X.buf, len, "ferryfs O_APPEND");
	write_full(ofd, X.buf, len, "oracle O_APPEND");
	at = SYS(lseek(fd, 0, SEEK_CUR));
	model_write(f, f->size, len);
	if (at != (off_t)f->size)
		FAIL("O_APPEND write of %zu: the offset is %lld after it, ext4's %zu", len,
		     (long long)at, f->size);
	close_fd(&fd, "the O_APPEND fd");
	close_fd(&ofd, "the oracle's O_APPEND fd");
}

/* fallocate: punch a hole (the size stays), or allocate (mode 0 may grow
 * the file; FALLOC_FL_KEEP_SIZE changes nothing visible). */
static void do_fallocate(struct file *f)
{
	static const int modes[3] = { FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0,
				      FALLOC_FL_KEEP_SIZE };
	static const char *const names[3] = { "punch hole", "allocate", "allocate keep-size" };
	uint64_t m = rnd(4) == 0 ? 1 + rnd(2) : 0;
	size_t off = pick_off(f), len = pick_len();

	if (off + len > MAX_SIZE)
		len = MAX_SIZE - off;
	ensure_writer(f);
	logop(m == 0 ? off : 0, m == 0 ? len : 0, "fallocate %s %zu at %zu (size %zu)", names[m],
	      len, off, f->size);
	SYS(fallocate(f->wfd, modes[m], (off_t)off, (off_t)len));
	SYS(fallocate(f->ofd, modes[m], (off_t)off, (off_t)len));
	if (m == 0 && off < f->size)
		memset(f->model + off, 0, off + len < f->size ? len : f->size - off);
	if (m == 1 && off + len > f->size)
		f->size = off + len;
}

static void do_reopen_rw(struct file *f)
{
	/* Mostly a last close then a new open: the new open of a file with
	 * content is a fresh copy-up. Sometimes a reader stays open. */
	if (rnd(4))
		close_all(f);
	else
		close_rw(f, "");
	if (rnd(10) == 0) {
		/* the empty-file path: no copy-up, the old content goes */
		SYS(ftruncate(f->ofd, 0));
		model_truncate(f, 0);
		open_logged(f, O_RDWR | O_TRUNC, &f->wfd, "O_RDWR|O_TRUNC");
	} else {
		open_rw(f);
	}
}

static void do_reopen_ro(struct file *f)
{
	close_all(f);
	open_ro(f);
	if (rnd(2)) {
		/* reads from ferry-mountd (or the backing file), not from the
		 * page cache the writes left */
		logop(0, 0, "posix_fadvise DONTNEED");
		SYS(posix_fadvise(f->rfd, 0, 0, POSIX_FADV_DONTNEED));
	}
	check_content(f, f->rfd, "after a reopen O_RDONLY");
	check_hold(f, "after a reopen O_RDONLY");
}

static void do_fsync(struct file *f)
{
	bool data = rnd(2);
	int fd = any_fd(f), own = -1;

	/* With nothing open: fsync of a new O_RDONLY fd waits for the upload
	 * of the last close. */
	if (fd < 0)
		fd = own = SYS(open(f->path, O_RDONLY));
	logop(0, 0, "%s of %s", data ? "fdatasync" : "fsync",
	      own >= 0 ? "a new O_RDONLY fd" : fd == f->wfd ? "the rw fd" : "the ro fd");
	if (data)
		SYS(fdatasync(fd));
	else
		SYS(fsync(fd));
	close_fd(&own, "the fsync fd");
}

static void do_close(struct file *f)
{
	close_all(f);
}

/*
 * A mapping held across steps. Whatever happens to the file meanwhile
 * (writes through fds, truncates, closes and reopens: with passthrough a
 * reopen must share the staging file the mapping maps, not copy the file
 * up into a new one), the part of its window inside the file shows the
 * file, and stores into it reach the file. Only bytes below the size are
 * touched (past it a page may be gone: SIGBUS).
 */
static size_t hold_visible(const struct file *f)
{
	if (!f->hp || f->size <= f->hoff)
		return 0;
	return f->size - f->hoff < f->hlen ? f->size - f->hoff : f->hlen;
}

static void check_hold(struct file *f, const char *when)
{
	size_t n = hold_visible(f);
	char how[96];

	if (n == 0)
		return;
	if (memcmp(f->hq, f->model + f->hoff, n) != 0)
		FAIL("TEST BUG: %s: the oracle's held mapping differs from the model at %zu", when,
		     f->hoff + first_diff(f->hq, f->model + f->hoff, n));
	map_copy(X.got, f->hp, n, "a read of the held mapping", f->hoff);
	snprintf(how, sizeof(how), "the held %s mapping of %zu at %zu", f->hrw ? "rw" : "ro",
		 f->hlen, f->hoff);
	if (memcmp(X.got, f->model + f->hoff, n) != 0)
		report_diff(f, X.got, f->hoff, n, when, how);
}

static void drop_hold(struct file *f)
{
	bool sync = f->hrw && rnd(2);

	if (!f->hp)
		return;
	logop(0, 0, "drop the held %s mapping%s", f->hrw ? "rw" : "ro", sync ? " after msync" : "");
	if (sync)
		SYS(msync(f->hp, f->hlen, MS_SYNC));
	SYS(munmap(f->hp, f->hlen));
	SYS(munmap(f->hq, f->hlen));
	f->hp = f->hq = NULL;
}

static void do_hold(struct file *f)
{
	int fd;

	if (f->hp) {
		size_t n = hold_visible(f);

		switch (rnd(3)) {
		case 0:
			if (f->hrw && n) {
				logop(0, 0, "stores into the held rw mapping (%zu visible)", n);
				store_into(f, f->hp, f->hq, f->hoff, n, "held");
			}
			break;
		case 1:
			drop_hold(f);
			return;
		default:
			break;
		}
		logop(0, 0, "check the held mapping (%zu visible)", n);
		check_hold(f, "a held mapping");
		return;
	}
	if (f->size == 0)
		return;
	f->hrw = rnd(2);
	if (f->hrw) {
		ensure_writer(f);
		fd = f->wfd;
	} else {
		if (any_fd(f) < 0)
			open_ro(f);
		fd = any_fd(f);
	}
	pick_window(f, &f->hoff, &f->hlen);
	logop(0, 0, "hold a %s mapping of %zu at %zu through the %s fd (size %zu)",
	      f->hrw ? "rw" : "ro", f->hlen, f->hoff, fd == f->wfd ? "rw" : "ro", f->size);
	f->hp = map(fd, f->hoff, f->hlen, f->hrw ? PROT_READ | PROT_WRITE : PROT_READ, "ferryfs");
	f->hq = map(f->ofd, f->hoff, f->hlen, f->hrw ? PROT_READ | PROT_WRITE : PROT_READ, "oracle");
	check_hold(f, "a new held mapping");
}

/*
 * The RELEASE of a passthrough file is asynchronous, and ferry-mountd
 * takes a moment to find that a mapping holds the staging file: stores
 * made right after close() mostly land before it looks. To have stores go
 * to a staging file it keeps for the mapping, wait until it has seen the
 * mapping (mapped_after_close). Not an assertion: a bounded wait, counted
 * (on a slow machine it may not come in time).
 */
static bool wait_mapping_seen(uint64_t before)
{
	int tries;

	for (tries = 0; tries < 50 && stat_of("mapped_after_close") == before; tries++)
		usleep(20 * 1000);
	if (stat_of("mapped_after_close") == before) {
		X.linger_unseen++;
		logop(0, 0, "  ferry-mountd did not see the mapping in %d ms", tries * 20);
		return false;
	}
	X.linger_seen++;
	logop(0, 0, "  ferry-mountd saw the mapping (after %d ms)", tries * 20);
	return true;
}

/* Waits (bounded: 5 s, more than the 2 s of ferry-mountd's retry list)
 * until no staging file of f is left: nothing is staged or uploading, so
 * the next write open copies the file up anew. Logs and counts the
 * outcome; true if they went. */
static bool wait_staging_gone(struct file *f)
{
	struct stat st;
	int tries;

	SYS(stat(f->path, &st));
	for (tries = 0; tries < 250 && fm_staging_files_of(st.st_ino) > 0; tries++)
		usleep(20 * 1000);
	if (fm_staging_files_of(st.st_ino) > 0) {
		X.unsettled++;
		logop(0, 0, "  a staging file is still there after %d ms", tries * 20);
		return false;
	}
	X.settled++;
	logop(0, 0, "  no staging file left (after %d ms)", tries * 20);
	return true;
}

/*
 * A staging file kept for a mapping is committed by ferry-mountd on its
 * own once the mapping is gone and nothing has the file open (its retry
 * list looks every 2 s), and then goes away. Wait for that and read the
 * file back: it is what the mapping left.
 */
static void wait_committed(struct file *f)
{
	if (wait_staging_gone(f))
		check_content(f, -1, "after ferry-mountd committed a dropped mapping's file");
}

/* Everything of f closed until ferry-mountd has committed it and let go
 * of its staging file, then a write open: a fresh copy-up of what was
 * committed (a held mapping or a recent one keeps the staging file the
 * inode's otherwise, and reopens share it). */
static void do_settle(struct file *f)
{
	logop(0, 0, "settle: close everything, wait until nothing is staged, reopen");
	drop_hold(f);
	close_all(f);
	wait_staging_gone(f);
	open_rw(f);
}

/*
 * A shared mapping that outlives the file's last close: with passthrough
 * it maps the staging file itself, which stays the inode's until the
 * mapping goes. Stores after the close must reach the file, whether the
 * mapping is dropped with or without msync, and a reopen while it lives
 * must see them (and its writes must show in the mapping).
 */
static void do_linger(struct file *f)
{
	size_t moff, mlen;
	unsigned char *p, *q;
	uint64_t how = rnd(4);

	bool wait = false, seen = false;
	uint64_t seen0 = 0;

	if (f->size == 0)
		return;
	close_ro(f);
	if (rnd(2) && !X.pt_off) {
		/* A new open alone on the inode: if it copies the file up into a
		 * new staging file, the mapping maps that, and ferry-mountd will
		 * find it at the close. (Not on the daemon path, past
		 * passthrough_copy_max, nor when it resumes a staging file still
		 * held for an earlier mapping: that one is on the retry list
		 * already, and the close changes nothing.) */
		close_rw(f, "");
		wait = open_rw(f);
		seen0 = stat_of("mapped_after_close");
	}
	ensure_writer(f);
	pick_window(f, &moff, &mlen);
	logop(0, 0, "linger: mmap %zu at %zu (size %zu), close, stores, then %s", mlen, moff,
	      f->size,
	      how == 0 ? "msync+munmap" : how == 1 ? "munmap" : how == 2 ? "reopen rw while mapped"
									: "fsync a new ro fd while mapped");
	p = map(f->wfd, moff, mlen, PROT_READ | PROT_WRITE, "ferryfs");
	q = map(f->ofd, moff, mlen, PROT_READ | PROT_WRITE, "oracle");
	close_rw(f, " (the mapping stays)");
	if (wait)
		seen = wait_mapping_seen(seen0);
	store_into(f, p, q, moff, mlen, "after close");
	if (how == 0)
		SYS(msync(p, mlen, MS_SYNC));
	if (how == 2) {
		/* A new open while the mapping lives: it shares the file. */
		size_t at = (size_t)rnd(mlen), len = 1 + (size_t)rnd(16 * KiB);

		open_rw(f);
		if (at + len > mlen)
			len = mlen - at;
		fm_fill_random(&X.rs, X.buf, len);
		logop(moff + at, len, "  pwrite %zu at %zu while mapped", len, moff + at);
		pwrite_full(f->wfd, X.buf, len, (off_t)(moff + at), "ferryfs");
		memcpy(q + at, X.buf, len);
		memcpy(f->model + moff + at, X.buf, len);
		map_copy(X.got, p, mlen, "a read of the mapping", moff);
		if (memcmp(X.got, f->model + moff, mlen) != 0)
			report_diff(f, X.got, moff, mlen, "linger",
				    "the mapping after a pwrite through a new fd");
		store_into(f, p, q, moff, mlen, "mapping, reopened,");
	}
	if (how == 3) {
		int fd = SYS(open(f->path, O_RDONLY));

		SYS(fsync(fd));
		check_content(f, fd, "fsync'ed while a mapping outlives the close");
		close_fd(&fd, "the fsync fd");
	}
	logop(0, 0, "  munmap");
	SYS(munmap(p, mlen));
	SYS(munmap(q, mlen));
	if (seen && f->wfd < 0 && !f->hp)
		wait_committed(f);
	if (f->wfd < 0)
		open_rw(f);
	check_content(f, f->wfd, "after a mapping that outlived its close was dropped");
	check_hold(f, "after a mapping that outlived its close was dropped");
}

/* The figures of the current mount, added to those of the earlier ones. */
static void collect_figures(void)
{
	struct fm_stats s;

	fm_stats_read(&s);
	X.copy_ups += fm_stats_need(&s, "copy_ups");
	X.too_big += fm_stats_need(&s, "copy_up_too_big");
	X.mapped_after_close += fm_stats_need(&s, "mapped_after_close");
	X.pt_opens += fm_stats_need(&s, "passthrough_opens");
	X.daemon_writes += fm_stats_need(&s, "fuse_requests_write");
}

static void remount(bool cold)
{
	for (int i = 0; i < X.nfiles; i++) {
		X.cur = i;
		drop_hold(&X.f[i]);
		close_all(&X.f[i]);
	}
	logop(0, 0, "%s", cold ? "remount with an empty read cache" : "remount");
	collect_figures();
	if (cold)
		fm_remount_cold();
	else
		fm_remount();
	const char *when = cold ? "after a remount with an empty read cache" : "after a remount";

	for (int i = 0; i < X.nfiles; i++) {
		X.cur = i;
		check_size(&X.f[i], when);
		check_content(&X.f[i], -1, when);
	}
}

/* ferry mount --upgrade under the open files and mappings: a new
 * ferry-mountd takes the mount over; every fd and mapping goes on. */
static void upgrade(void)
{
	const char *argv[] = { fm_bin("ferry"), "mount", "--upgrade", fm.mnt, NULL };

	/* A mount served over io_uring cannot be handed over: the upgrade
	 * is refused, and everything goes on in the same daemon. */
	bool ring = strstr(fm_mount_options(), "io_uring=on") != NULL;

	logop(0, 0, ring ? "upgrade (refused: the mount is on io_uring)" :
			   "upgrade (hand the mount to a new ferry-mountd)");
	collect_figures();
	int st = fm_run(argv, sp("upgrade.out"), sp("upgrade.err"), 240);
	char *err = fm_slurp(sp("upgrade.err"));
	if (ring)
		cr_assert(st != 0 && err && strstr(err, "refused the hand-over"),
			  "ferry mount --upgrade of a mount on io_uring: %d: %s", st, err ? err : "");
	else
		cr_assert_eq(st, 0, "ferry mount --upgrade: %d: %s", st, err ? err : "");
	free(err);
	char *out = fm_slurp(sp("upgrade.out"));
	if (out)
		cr_log_info("%s", out);
	free(out);
	X.upgrades++;
	for (int i = 0; i < X.nfiles; i++) {
		X.cur = i;
		check_size(&X.f[i], "after an upgrade");
		check_content(&X.f[i], any_fd(&X.f[i]), "after an upgrade");
	}
}

/* ---- the run ---------------------------------------------------------- */

static enum kind pick_kind(void)
{
	int sum = 0, r;

	for (int k = 0; k < K_COUNT; k++)
		sum += kind_weight[k];
	r = (int)rnd((uint64_t)sum);
	for (int k = 0; k < K_COUNT; k++) {
		if (r < kind_weight[k])
			return (enum kind)k;
		r -= kind_weight[k];
	}
	return K_PREAD;
}

static uint64_t env_u64(const char *name, uint64_t dflt)
{
	const char *v = getenv(name);

	return v && *v ? strtoull(v, NULL, 0) : dflt;
}

/* Creates file i with some content (on the mount: a new file, so no
 * copy-up yet) and its oracle. */
static void init_file(int i)
{
	struct file *f = &X.f[i];
	size_t len = (size_t)(MiB + rnd(2 * MiB));

	X.cur = i;
	snprintf(f->path, sizeof(f->path), "%s", mp("fsx%d", i));
	snprintf(f->opath, sizeof(f->opath), "%s", sp("oracle%d", i));
	f->model = calloc(1, MAX_SIZE);
	cr_assert(f->model);
	f->ofd = SYS(open(f->opath, O_CREAT | O_TRUNC | O_RDWR, 0644));
	f->wfd = f->rfd = -1;
	fm_fill_random(&X.rs, X.buf, len);
	logop(0, len, "create with %zu bytes", len);
	f->wfd = SYS(open(f->path, O_CREAT | O_EXCL | O_RDWR, 0644));
	pwrite_full(f->wfd, X.buf, len, 0, "ferryfs");
	pwrite_full(f->ofd, X.buf, len, 0, "oracle");
	model_write(f, 0, len);
	close_all(f);
}

/*
 * nfiles files, nops steps (FERRY_FSX_OPS overrides), the seed from
 * FERRY_FSX_SEED or the default, salted per test so the tests differ.
 */
static void run(const char *name, int nfiles, int nops, uint64_t salt)
{
	X.name = name;
	X.seed = env_u64("FERRY_FSX_SEED", 0xf5f5f5f5ULL);
	X.rs = (X.seed ^ (salt * 0x9E3779B97F4A7C15ULL)) | 1;
	X.nfiles = nfiles;
	nops = (int)env_u64("FERRY_FSX_OPS", (uint64_t)nops);
	X.pt_off = stat_of("passthrough_active") == 0;
	X.buf = malloc(MAX_SIZE + 1);
	X.got = malloc(MAX_SIZE + 1);
	cr_assert(X.buf && X.got);
	cr_log_info("fsx %s: seed 0x%llx (FERRY_FSX_SEED), %d steps on %d file(s), mount -o %s",
		    name, (unsigned long long)X.seed, nops, nfiles, fm_mount_options());
	X.running = true;
	for (int i = 0; i < nfiles; i++)
		init_file(i);

	for (X.op = 1; X.op <= nops; X.op++) {
		enum kind k = pick_kind();
		struct file *f;

		X.cur = (int)rnd((uint64_t)nfiles);
		f = &X.f[X.cur];
		X.count[k]++;
		switch (k) {
		case K_PWRITE: do_pwrite(f); break;
		case K_PREAD: do_pread(f); break;
		case K_MMAP_READ: do_mmap_read(f); break;
		case K_MMAP_WRITE: do_mmap_write(f); break;
		case K_TRUNCATE: do_truncate(f); break;
		case K_APPEND: do_append(f); break;
		case K_REOPEN_RW: do_reopen_rw(f); break;
		case K_REOPEN_RO: do_reopen_ro(f); break;
		case K_FSYNC: do_fsync(f); break;
		case K_CLOSE: do_close(f); break;
		case K_LINGER: do_linger(f); break;
		case K_HOLD: do_hold(f); break;
		case K_FALLOCATE: do_fallocate(f); break;
		case K_SETTLE: do_settle(f); break;
		case K_REMOUNT: remount(rnd(3) == 0); break;
		case K_UPGRADE: upgrade(); break;
		case K_COUNT: break;
		}
		X.cur = (int)(f - X.f);
		check_size(f, "after the step");
		if (X.op % 8 == 0) {
			check_content(f, any_fd(f), "a periodic check");
			check_hold(f, "a periodic check");
		}
	}

	/* Everything closed, then every byte from the object store. */
	remount(true);
	collect_figures();
	X.running = false;

	char counts[512];
	size_t k = 0;
	for (int i = 0; i < K_COUNT; i++)
		k += (size_t)snprintf(counts + k, sizeof(counts) - k, " %s %d", kind_names[i],
				      X.count[i]);
	cr_log_info("fsx %s: steps:%s; %d whole-file checks", name, counts, X.full_checks);
	/* The weights make one likely; the soak (FERRY_FSX_OPS) makes many. */
	if (X.upgrades == 0)
		upgrade();
	cr_log_info("fsx %s: mappings after close seen by ferry-mountd %d, not seen in 1 s %d; "
		    "waits for the staging file to go: %d ended, %d gave up after 5 s", name,
		    X.linger_seen, X.linger_unseen, X.settled, X.unsettled);
	cr_log_info("fsx %s: %d opens copied the file up; ferry-mountd: copy_ups %llu, "
		    "copy_up_too_big %llu, passthrough_opens %llu, WRITE requests %llu, "
		    "mapped_after_close %llu", name, X.copied_up,
		    (unsigned long long)X.copy_ups, (unsigned long long)X.too_big,
		    (unsigned long long)X.pt_opens, (unsigned long long)X.daemon_writes,
		    (unsigned long long)X.mapped_after_close);
	for (int i = 0; i < nfiles; i++) {
		close_fd(&X.f[i].ofd, "the oracle");
		free(X.f[i].model);
	}
	free(X.buf);
	free(X.got);
}

/* A test's .fini (before the fixture's): an assertion outside the checks
 * above (of the fixture: a remount that failed) ended the run; the last
 * steps say how it got there. */
static void log_if_stopped(void)
{
	if (X.running && !X.reported) {
		cr_log_error("fsx %s stopped at step %d by the assertion above", X.name, X.op);
		dump_log(0, false);
	}
}

Test(fsx, one_file, .fini = log_if_stopped, .timeout = 300)
{
	run("one_file", 1, NOPS, 1);
}

Test(fsx, three_files, .fini = log_if_stopped, .timeout = 300)
{
	run("three_files", 3, NOPS, 2);
}

/* ---- the daemon path: passthrough_copy_max=64k ------------------------ */

/* Every mount of these tests (the remounts too) adds -o
 * passthrough_copy_max=64k to the fixture's options. */
static void setup_copy_max(void)
{
	static char all[512];
	const char *env = getenv("FERRY_IT_MOUNT_OPTIONS");

	snprintf(all, sizeof(all), "%s%spassthrough_copy_max=64k", env && *env ? env : "",
		 env && *env ? "," : "");
	setenv("FERRY_IT_MOUNT_OPTIONS", all, 1);
	fm_setup();
}

TestSuite(fsx_copy_max, .init = setup_copy_max, .fini = fm_teardown, .timeout = 300);

Test(fsx_copy_max, two_files_mostly_on_the_daemon_path, .fini = log_if_stopped,
     .timeout = 300)
{
	/* The option is in effect: a write open of a file past 64 KiB with
	 * nothing else open takes the daemon path (with passthrough on). The
	 * remount makes sure that nothing is: the RELEASE of the close that
	 * wrote it is asynchronous, and an open before it would share its
	 * staging file. */
	if (stat_of("passthrough_active")) {
		static unsigned char blk[128 * KiB];
		uint64_t big0;

		fm_write_file(mp("big"), blk, sizeof(blk));
		fm_remount();
		big0 = stat_of("copy_up_too_big");
		OK(close(OK(open(mp("big"), O_RDWR))));
		cr_assert_eq(stat_of("copy_up_too_big"), big0 + 1,
			     "a write open of 128 KiB was not refused a copy-up: is "
			     "passthrough_copy_max=64k in effect?");
		OK(unlink(mp("big")));
	}
	run("copy_max_64k", 2, NOPS, 3);
}
