/*
 * Differential test: random sequences of file operations applied in
 * lockstep to a directory on ext4 (the oracle) and to a ferryfs mount, with
 * every result compared. ferryfs must behave as a local filesystem does.
 *
 * The operations work on a small set of names (so that creates, renames and
 * links collide) and on a table of up to 16 open files per side (slot ->
 * fd on ext4, fd on ferryfs): open with every combination of access mode,
 * O_CREAT, O_TRUNC, O_APPEND and O_EXCL, close, close and reopen,
 * write/pwrite of 0..70 KiB (now and then 1.5 MiB) at random, sparse and
 * boundary offsets (64 KiB pieces, 4 MiB blocks, rarely the 64 MiB chunk),
 * read/pread, lseek, SEEK_DATA/SEEK_HOLE, ftruncate/truncate,
 * fsync/fdatasync, fallocate, copy_file_range, unlink, rename (also
 * renameat2 NOREPLACE/EXCHANGE) and link while files are open on the names
 * involved, mkdir/rmdir, symlink, chmod, user.* xattrs, mmap MAP_SHARED
 * writes with msync and mapped reads, readdir of an open directory, fstat,
 * dropping an open file's page cache, and (rarely, with every file closed)
 * a remount of ferryfs, half of them with an empty read cache.
 *
 * What is compared after every operation: its return value, or -1 and
 * errno; the bytes a read returned; fstat of the file it used, or lstat of
 * the names it touched (mode, type, nlink, and size for regular files and
 * symlinks). Periodically, and at the end before and after a remount, the
 * whole tree: names, types, modes, link counts, sizes, symlink targets,
 * xattrs and every byte.
 * Not compared, because filesystems legitimately differ in them: times,
 * inode numbers, st_blocks, directory sizes and offsets, readdir order,
 * and where SEEK_DATA/SEEK_HOLE put the boundaries (a filesystem may report
 * a hole as data; what ferryfs reports as a hole must be zeros in the
 * oracle, and its SEEK_DATA must never skip a non-zero byte). rmdir and
 * rename of a non-empty directory may fail with ENOTEMPTY or EEXIST.
 *
 * Each test is one profile (a mix of operation weights) run from a seed:
 *   FERRY_DIFF_SEED=N    seed (default: one per profile)
 *   FERRY_DIFF_OPS=N     operations per test (default 6000)
 *   FERRY_DIFF_SKIP=LIST operations not to run ("3,10-250"), to shrink a
 *                        failing sequence: each operation draws its choices
 *                        from a random stream of its own
 *   FERRY_DIFF_TRACE=1   print every operation and both results to stderr
 *   FERRY_DIFF_NO_RECONCILER=1  mount with --no-reconciler (local campaigns)
 * A failure prints the seed, the failing operation, the last 32 operations,
 * the open files and mappings, the end of ferry-mountd's log and the
 * command line that replays it.
 *
 * The discrepancies the campaigns found are also tests of their own, fixed
 * sequences at the end of this file, so that a failure names the bug.
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
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/xattr.h>
#include <unistd.h>

#define KiB (1024LL)
#define MiB (1024LL * 1024)

#define EXT4_MAGIC 0xEF53

#define NSLOT 16
#define MAX_WRITE (70 * KiB)
#define MAX_READ (140 * KiB)
#define MAX_BIG (1536 * KiB)  /* the occasional big write or read */
#define MAX_MAP (256 * KiB)
#define NMAP 4
#define MAX_PMAP (1 * MiB)    /* length of a persistent mapping */
#define LOG_LINES 32
#define LOG_WIDTH 320

enum side { ORACLE, FERRY };

/*
 * The names every operation picks from. Files and directories are not
 * fixed: mkdir may take "f1" and open(O_CREAT) "d0" when they are free, and
 * the nested names exist only while their parent is a directory.
 */
static const char *const names[] = {
	"f0", "f1", "f2", "f3", "d0", "d1", "d0/f0", "d0/f1", "d0/d2", "d1/f0", "d0/d2/f0",
};
#define NNAMES ((int)(sizeof(names) / sizeof(names[0])))

enum op {
	OP_OPEN, OP_CLOSE, OP_REOPEN, OP_WRITE, OP_PWRITE, OP_READ, OP_PREAD,
	OP_LSEEK, OP_SEEK_DATA_HOLE, OP_FTRUNCATE, OP_TRUNCATE, OP_FSYNC,
	OP_FALLOCATE, OP_FSTAT, OP_LSTAT, OP_UNLINK, OP_RENAME, OP_RENAME2, OP_LINK,
	OP_MKDIR, OP_RMDIR, OP_CHMOD, OP_MMAP_WRITE, OP_MMAP_READ, OP_TREE,
	OP_REMOUNT, OP_SYMLINK, OP_XATTR, OP_COPY_RANGE, OP_READDIR_FD,
	OP_DROP_CACHE, OP_REOPEN_FD, OP_LINK_FD, OP_FCHMOD, OP_MAP_NEW,
	OP_MAP_STORE, OP_MAP_LOAD, OP_MAP_SYNC, OP_MAP_DROP, NOPS
};

/* Relative weights of the operations in one test (OP_REMOUNT's is not
 * used: remounts are counted per 1000 operations). */
struct profile {
	const char *name;
	uint64_t seed;
	int w[NOPS];
	int trunc_pct;      /* how often an open has O_TRUNC */
	int far_pct;        /* how often an offset is near the 64 MiB chunk */
	int remount_pm;     /* remounts per 1000 operations */
	const char *mount_opts; /* -o options the campaign mounts with, or NULL */
};

struct slot {
	bool used;
	bool is_dir;
	int fd[2];
	int flags;
	char name[16];      /* the name it was opened by */
};

/*
 * A MAP_SHARED mapping that lives across operations, and across the close
 * of the fd it was made from (POSIX: the mapping keeps the file). ofd is
 * an oracle-only O_PATH fd on the same inode, for its current size.
 */
struct mapping {
	bool used;
	char *addr[2];
	size_t len;
	int prot;
	int ofd;
	char name[16];
	int from;           /* the slot it was made from */
};

static struct diff {
	const struct profile *p;
	char root[2][PATH_MAX];
	bool loop_mounted;  /* oracle on a loop ext4 image we mounted */
	uint64_t seed, rs;
	long nops, op;      /* operations to run, index of the current one */
	bool trace;
	bool in_remount;    /* inside remount(), whose fixture calls assert */
	struct slot slot[NSLOT];
	struct mapping map[NMAP];
	char log[LOG_LINES][LOG_WIDTH];
	long nlog;
	char *wbuf, *rbuf[2], *cbuf[2];
} D;

/* ---- small helpers ------------------------------------------------------ */

static uint64_t rnd(uint64_t n)
{
	return n ? fm_rand(&D.rs) % n : 0;
}

static bool chance(int pct)
{
	return (int)rnd(100) < pct;
}

static const char *side_name(int side)
{
	return side == ORACLE ? "ext4" : "ferryfs";
}

/* root[side]/name, in a ring of static buffers. */
static const char *P(int side, const char *name)
{
	static char ring[8][PATH_MAX];
	static int n;
	char *out = ring[n++ % 8];

	snprintf(out, PATH_MAX, "%.3000s/%.64s", D.root[side], name);
	return out;
}

static const char *flags_str(int f)
{
	static char buf[4][96];
	static int n;
	char *b = buf[n++ % 4];
	int acc = f & O_ACCMODE;

	snprintf(b, 96, "%s%s%s%s%s",
		 acc == O_RDONLY ? "O_RDONLY" : acc == O_WRONLY ? "O_WRONLY" : "O_RDWR",
		 f & O_CREAT ? "|O_CREAT" : "", f & O_TRUNC ? "|O_TRUNC" : "",
		 f & O_APPEND ? "|O_APPEND" : "", f & O_EXCL ? "|O_EXCL" : "");
	return b;
}

/* ---- the operation log and failures ------------------------------------- */

/* Starts the log line of the current operation. */
static void logop(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void logop(const char *fmt, ...)
{
	char *l = D.log[D.nlog % LOG_LINES];
	int n = snprintf(l, LOG_WIDTH, "#%ld ", D.op);
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(l + n, LOG_WIDTH - (size_t)n, fmt, ap);
	va_end(ap);
	D.nlog++;
}

/* Appends to the current log line (results). */
static void logmore(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void logmore(const char *fmt, ...)
{
	char *l = D.log[(D.nlog + LOG_LINES - 1) % LOG_LINES];
	size_t len = strlen(l);
	va_list ap;

	if (len + 1 >= LOG_WIDTH)
		return;
	va_start(ap, fmt);
	vsnprintf(l + len, LOG_WIDTH - len, fmt, ap);
	va_end(ap);
}

static void trace_current(void)
{
	if (D.trace && D.nlog)
		fprintf(stderr, "%s\n", D.log[(D.nlog - 1) % LOG_LINES]);
}

/* The open files at a failure: name, flags, offset and size on each side. */
static void dump_slots(void)
{
	for (int s = 0; s < NSLOT; s++) {
		const struct slot *sl = &D.slot[s];
		struct stat st[2];

		if (!sl->used)
			continue;
		fprintf(stderr, "  slot %2d '%s' %s%s:", s, sl->name, flags_str(sl->flags),
			sl->is_dir ? " (directory)" : "");
		for (int side = 0; side < 2; side++) {
			off_t pos = lseek(sl->fd[side], 0, SEEK_CUR);

			if (fstat(sl->fd[side], &st[side]) == 0)
				fprintf(stderr, " %s offset %lld size %lld nlink %lu;",
					side == ORACLE ? "ext4" : "ferryfs", (long long)pos,
					(long long)st[side].st_size, (unsigned long)st[side].st_nlink);
		}
		fprintf(stderr, "\n");
	}
	for (int m = 0; m < NMAP; m++)
		if (D.map[m].used)
			fprintf(stderr, "  map %d '%s' len %zu%s\n", m, D.map[m].name, D.map[m].len,
				D.map[m].prot & PROT_WRITE ? " writable" : "");
}

/* The end of ferry-mountd's log: what the daemon said about the failure. */
static void daemon_log_tail(void)
{
	char path[PATH_MAX];
	char *text;
	size_t len;

	snprintf(path, sizeof(path), "%.4000s", fm_mountd_log_path());
	text = fm_slurp(path);
	if (!text)
		return;
	len = strlen(text);
	fprintf(stderr, "--- end of %s ---\n%s\n", path, len > 3000 ? text + len - 3000 : text);
	free(text);
}

/* Reports a discrepancy: the last operations, the seed and how to replay. */
static void diff_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void diff_fail(const char *fmt, ...)
{
	char msg[1024];
	long from = D.nlog > LOG_LINES ? D.nlog - LOG_LINES : 0;
	const char *skip_env = getenv("FERRY_DIFF_SKIP");
	const char *opts = getenv("FERRY_IT_MOUNT_OPTIONS");
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	fprintf(stderr, "\n=== differential/%s: DISCREPANCY at op #%ld (seed 0x%llx)\n", D.p->name,
		D.op, (unsigned long long)D.seed);
	fprintf(stderr, "last operations (results as value/errno, ext4 first):\n");
	for (long i = from; i < D.nlog; i++)
		fprintf(stderr, "  %s\n", D.log[i % LOG_LINES]);
	fprintf(stderr, "%s\n", msg);
	dump_slots();
	daemon_log_tail();
	fprintf(stderr, "replay: FERRY_IT_MOUNT_OPTIONS='%s' FERRY_DIFF_SEED=0x%llx FERRY_DIFF_OPS=%ld "
		"FERRY_DIFF_SKIP='%s' FERRY_DIFF_TRACE=1 integration-differential "
		"--filter 'differential/%s'\n", opts ? opts : "", (unsigned long long)D.seed,
		D.op + 1, skip_env ? skip_env : "", D.p->name);
	cr_assert_fail("differential/%s seed 0x%llx op #%ld: %s", D.p->name,
		       (unsigned long long)D.seed, D.op, msg);
}

/* ---- results of one call on both sides ---------------------------------- */

struct rv {
	long long v;
	int err;
};

/* Runs expr once per side (expr sees `side`), recording value and errno. */
#define BOTH(r, expr)                                                         \
	do {                                                                  \
		for (int side = 0; side < 2; side++) {                        \
			errno = 0;                                            \
			long long v_ = (long long)(expr);                     \
			(r)[side].v = v_;                                     \
			(r)[side].err = v_ < 0 ? errno : 0;                   \
		}                                                             \
	} while (0)

static const char *rv_str(const struct rv *r)
{
	static char buf[4][48];
	static int n;
	char *b = buf[n++ % 4];

	if (r->v < 0)
		snprintf(b, 48, "-1/%s", fm_errname(r->err));
	else
		snprintf(b, 48, "%lld", r->v);
	return b;
}

/*
 * Errors POSIX lets a filesystem choose between: removing or replacing a
 * non-empty directory (rmdir, rename) fails with ENOTEMPTY or EEXIST.
 */
static bool same_err(const char *what, int a, int b)
{
	bool dir_removal = !strncmp(what, "rmdir", 5) || !strncmp(what, "rename", 6);

	if (a == b)
		return true;
	return dir_removal && (a == ENOTEMPTY || a == EEXIST) && (b == ENOTEMPTY || b == EEXIST);
}

/* Logs both results; fails unless they agree. value_matters: a success
 * must return the same value (not for open, whose fds differ). */
static void check_rv(const char *what, const struct rv r[2], bool value_matters)
{
	logmore(" -> %s %s", rv_str(&r[ORACLE]), rv_str(&r[FERRY]));
	trace_current();
	if ((r[ORACLE].v < 0) != (r[FERRY].v < 0))
		diff_fail("MISMATCH %s: ext4 returned %s, ferryfs %s", what, rv_str(&r[ORACLE]),
			  rv_str(&r[FERRY]));
	if (r[ORACLE].v < 0 && !same_err(what, r[ORACLE].err, r[FERRY].err))
		diff_fail("MISMATCH %s errno: ext4 %s, ferryfs %s", what, fm_errname(r[ORACLE].err),
			  fm_errname(r[FERRY].err));
	if (value_matters && r[ORACLE].v != r[FERRY].v)
		diff_fail("MISMATCH %s result: ext4 %lld, ferryfs %lld", what, r[ORACLE].v,
			  r[FERRY].v);
}

/* An internal check on the oracle side alone (test-side sanity). */
static void oracle_ok(bool cond, const char *what)
{
	if (!cond)
		diff_fail("ext4 oracle: %s failed: %s (test-side problem)", what, strerror(errno));
}

/*
 * Compares two stat results of the same object: type and permission bits,
 * link count, and the size of a regular file. Times, inode numbers,
 * st_blocks and directory sizes may differ.
 */
static void cmp_stat(const char *what, const struct stat *a, const struct stat *b)
{
	if (a->st_mode != b->st_mode)
		diff_fail("MISMATCH %s st_mode: ext4 0%o, ferryfs 0%o", what, a->st_mode, b->st_mode);
	if (a->st_nlink != b->st_nlink)
		diff_fail("MISMATCH %s st_nlink: ext4 %lu, ferryfs %lu", what,
			  (unsigned long)a->st_nlink, (unsigned long)b->st_nlink);
	if ((S_ISREG(a->st_mode) || S_ISLNK(a->st_mode)) && a->st_size != b->st_size)
		diff_fail("MISMATCH %s st_size: ext4 %lld, ferryfs %lld", what,
			  (long long)a->st_size, (long long)b->st_size);
}

static void cmp_fstat(int s, const char *when)
{
	struct stat st[2];
	struct rv r[2];
	char what[96];

	BOTH(r, fstat(D.slot[s].fd[side], &st[side]));
	snprintf(what, sizeof(what), "fstat(slot %d '%s') %s", s, D.slot[s].name, when);
	if ((r[0].v < 0) != (r[1].v < 0) || (r[0].v < 0 && r[0].err != r[1].err))
		check_rv(what, r, true);
	if (r[0].v == 0)
		cmp_stat(what, &st[ORACLE], &st[FERRY]);
}

static void cmp_lstat(const char *name, const char *when)
{
	struct stat st[2];
	struct rv r[2];
	char what[96];

	BOTH(r, lstat(P(side, name), &st[side]));
	snprintf(what, sizeof(what), "lstat('%s') %s", name, when);
	if ((r[0].v < 0) != (r[1].v < 0) || (r[0].v < 0 && r[0].err != r[1].err))
		check_rv(what, r, true);
	if (r[0].v == 0)
		cmp_stat(what, &st[ORACLE], &st[FERRY]);
}

/* The oracle's view of a name: -1 absent, else its st_mode. */
static long oracle_mode(const char *name)
{
	struct stat st;

	return lstat(P(ORACLE, name), &st) == 0 ? (long)st.st_mode : -1;
}

static off_t oracle_fsize(int s)
{
	struct stat st;

	oracle_ok(fstat(D.slot[s].fd[ORACLE], &st) == 0, "fstat");
	return st.st_size;
}

/* ---- picking operands --------------------------------------------------- */

/* Mostly the top-level files, so that fds pile up on the same inodes. */
static const char *pick_name(void)
{
	uint64_t r = rnd(100);

	if (r < 60)
		return names[rnd(4)];
	if (r < 75)
		return names[4 + rnd(2)];
	return names[6 + rnd((uint64_t)NNAMES - 6)];
}

/* A name that exists in the oracle, most of the time. */
static const char *pick_existing(void)
{
	for (int tries = 0; tries < 8; tries++) {
		const char *n = pick_name();

		if (oracle_mode(n) >= 0)
			return n;
	}
	return pick_name();
}

static int pick_used(void)
{
	int used[NSLOT], n = 0;

	for (int s = 0; s < NSLOT; s++)
		if (D.slot[s].used)
			used[n++] = s;
	return n ? used[rnd((uint64_t)n)] : -1;
}

enum want { ANY_FILE, READABLE, WRITABLE, READ_WRITE };

static bool slot_fits(const struct slot *sl, enum want w)
{
	int acc = sl->flags & O_ACCMODE;

	if (!sl->used || sl->is_dir)
		return false;
	switch (w) {
	case READABLE: return acc != O_WRONLY;
	case WRITABLE: return acc != O_RDONLY;
	case READ_WRITE: return acc == O_RDWR;
	default: return true;
	}
}

/*
 * A used slot on a regular file, or -1. Most of the time one whose access
 * mode suits the operation, so that data operations mostly do something;
 * the rest of the time any slot at all (directories included), for the
 * errors (EBADF, EISDIR, EACCES).
 */
static int pick_slot(enum want w)
{
	int ok[NSLOT], n = 0;

	if (chance(12))
		return pick_used();
	for (int s = 0; s < NSLOT; s++)
		if (slot_fits(&D.slot[s], w))
			ok[n++] = s;
	if (!n)
		return pick_used();
	return ok[rnd((uint64_t)n)];
}

/* A used slot on a regular file, or -1. */
static int pick_file_slot(void)
{
	int ok[NSLOT], n = 0;

	for (int s = 0; s < NSLOT; s++)
		if (slot_fits(&D.slot[s], ANY_FILE))
			ok[n++] = s;
	return n ? ok[rnd((uint64_t)n)] : -1;
}

/* Like pick_file_slot(), preferring the access mode w. */
static int pick_file_slot_for(enum want w)
{
	int ok[NSLOT], n = 0;

	if (chance(12))
		return pick_file_slot();
	for (int s = 0; s < NSLOT; s++)
		if (slot_fits(&D.slot[s], w))
			ok[n++] = s;
	return n ? ok[rnd((uint64_t)n)] : pick_file_slot();
}

static int pick_free(void)
{
	int fr[NSLOT], n = 0;

	for (int s = 0; s < NSLOT; s++)
		if (!D.slot[s].used)
			fr[n++] = s;
	return n ? fr[rnd((uint64_t)n)] : -1;
}

/*
 * An offset where filesystems built from pieces go wrong: 0, inside or at
 * the end of the file, past it (sparse), next to a 64 KiB piece or a 4 MiB
 * block boundary, rarely next to the 64 MiB chunk boundary.
 */
static off_t pick_off(off_t size)
{
	switch (rnd(10)) {
	case 0:
		return 0;
	case 1:
		return size ? (off_t)rnd((uint64_t)size) : 0;
	case 2:
		return size;
	case 3:
		return size + (off_t)rnd(256 * KiB);
	case 4:
	case 5: {
		off_t o = (off_t)(rnd(72) * 64 * KiB) + (off_t)rnd(1024) - 512;

		return o > 0 ? o : 0;
	}
	case 6:
		return (off_t)((1 + rnd(2)) * 4 * MiB) - (off_t)rnd(MAX_WRITE) +
		       (off_t)rnd(MAX_WRITE / 2);
	case 7:
		if (chance(D.p->far_pct))
			return 64 * MiB - (off_t)rnd(MAX_WRITE) + (off_t)rnd(MAX_WRITE / 2);
		return (off_t)rnd(4 * MiB + 512 * KiB);
	default:
		return (off_t)rnd(256 * KiB);
	}
}

static size_t pick_len(uint64_t max)
{
	switch (rnd(8)) {
	case 0:
		return 0;
	case 1:
		return 1 + rnd(16);
	case 2:
		return 4096 < max ? 4096 : max;
	case 3:
		return 64 * KiB < (long long)max ? 64 * KiB : max;
	default:
		return rnd(max + 1);
	}
}

/* New size for a truncate: shrink, grow, zero or a boundary. */
static off_t pick_size(off_t size)
{
	switch (rnd(6)) {
	case 0:
		return 0;
	case 1:
	case 2:
		return size ? (off_t)rnd((uint64_t)size) : 0;
	case 3:
		return size + (off_t)rnd(512 * KiB);
	default:
		return pick_off(size);
	}
}

static void fill(size_t len)
{
	/* Some writes are zeros: a zero write is data, not a hole. */
	if (chance(10))
		memset(D.wbuf, 0, len);
	else
		fm_fill_random(&D.rs, D.wbuf, len);
}

/* ---- whole-tree comparison ----------------------------------------------- */

static int cmp_names(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Sorted entry names of a directory (without . and ..); returns the count. */
static int list_dir(const char *path, char **out, int max, int *err)
{
	DIR *d = opendir(path);
	struct dirent *de;
	int n = 0;

	*err = 0;
	if (!d) {
		*err = errno;
		return -1;
	}
	while ((de = readdir(d))) {
		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		if (n < max)
			out[n] = strdup(de->d_name);
		n++;
	}
	closedir(d);
	if (n > max)
		n = max;
	qsort(out, (size_t)n, sizeof(out[0]), cmp_names);
	return n;
}

/* Every byte of two open files of equal size; fails at the first difference. */
static void cmp_content(const char *what, int fa, int fb, off_t size)
{
	for (off_t off = 0; off < size; off += MiB) {
		size_t len = (size_t)(size - off < MiB ? size - off : MiB);
		ssize_t a = pread(fa, D.cbuf[0], len, off);
		ssize_t b = pread(fb, D.cbuf[1], len, off);

		oracle_ok(a == (ssize_t)len, "pread for the tree check");
		if (b != a)
			diff_fail("MISMATCH %s: pread(%zu at %lld) gave %zd (%s) on ferryfs, %zd on ext4",
				  what, len, (long long)off, b, b < 0 ? fm_errname(errno) : "short",
				  a);
		if (memcmp(D.cbuf[0], D.cbuf[1], len)) {
			size_t i = 0;

			while (D.cbuf[0][i] == D.cbuf[1][i])
				i++;
			diff_fail("MISMATCH %s content at offset %lld: ext4 0x%02x, ferryfs 0x%02x",
				  what, (long long)off + (long long)i, (unsigned char)D.cbuf[0][i],
				  (unsigned char)D.cbuf[1][i]);
		}
	}
}

/* The same extended attributes (names in any order, values) on both. */
static void cmp_xattrs(const char *what, const char *rel)
{
	char *l[2][16];
	ssize_t len[2];
	int n[2] = { 0, 0 };

	for (int side = 0; side < 2; side++) {
		len[side] = llistxattr(P(side, rel), D.cbuf[side], MiB / 2);
		if (len[side] < 0)
			diff_fail("%s %s: llistxattr: %s", side == FERRY ? "MISMATCH" : "ext4 oracle",
				  what, fm_errname(errno));
		for (char *k = D.cbuf[side]; k < D.cbuf[side] + len[side]; k += strlen(k) + 1)
			if (n[side] < 16)
				l[side][n[side]++] = k;
		qsort(l[side], (size_t)n[side], sizeof(l[side][0]), cmp_names);
	}
	for (int i = 0; i < n[0] || i < n[1]; i++) {
		const char *a = i < n[0] ? l[0][i] : "(none)", *b = i < n[1] ? l[1][i] : "(none)";
		ssize_t v[2];

		if (strcmp(a, b))
			diff_fail("MISMATCH %s: xattr '%s' on ext4 where ferryfs has '%s'", what, a, b);
		for (int side = 0; side < 2; side++)
			v[side] = lgetxattr(P(side, rel), a, D.cbuf[side] + MiB / 2, MiB / 4);
		if (v[0] != v[1] || (v[0] > 0 && memcmp(D.cbuf[0] + MiB / 2, D.cbuf[1] + MiB / 2,
							  (size_t)v[0])))
			diff_fail("MISMATCH %s: xattr '%s' value differs (%zd vs %zd bytes)", what, a,
				  v[0], v[1]);
	}
}

static void tree_compare_dir(const char *rel, const char *when)
{
	char *ln[2][64];
	int n[2], err[2];
	char what[PATH_MAX + 64];

	for (int side = 0; side < 2; side++)
		n[side] = list_dir(rel[0] ? P(side, rel) : D.root[side], ln[side], 64, &err[side]);
	oracle_ok(n[ORACLE] >= 0, "opendir");
	if (n[FERRY] < 0)
		diff_fail("MISMATCH tree %s: opendir('%s') failed on ferryfs: %s", when, rel,
			  fm_errname(err[FERRY]));
	for (int i = 0; i < n[0] || i < n[1]; i++) {
		const char *a = i < n[0] ? ln[0][i] : "(none)";
		const char *b = i < n[1] ? ln[1][i] : "(none)";

		if (i >= n[0] || i >= n[1] || strcmp(a, b))
			diff_fail("MISMATCH tree %s: directory '%s' holds '%s' on ext4 where ferryfs "
				  "has '%s' (%d vs %d entries)", when, rel[0] ? rel : "/", a, b, n[0],
				  n[1]);
	}
	for (int i = 0; i < n[0]; i++) {
		char child[PATH_MAX];
		struct stat st[2];

		snprintf(child, sizeof(child), "%s%s%s", rel, rel[0] ? "/" : "", ln[0][i]);
		snprintf(what, sizeof(what), "tree %s: '%s'", when, child);
		oracle_ok(lstat(P(ORACLE, child), &st[ORACLE]) == 0, "lstat");
		if (lstat(P(FERRY, child), &st[FERRY]) != 0)
			diff_fail("MISMATCH %s: listed but lstat fails on ferryfs: %s", what,
				  fm_errname(errno));
		cmp_stat(what, &st[ORACLE], &st[FERRY]);
		cmp_xattrs(what, child);
		if (S_ISLNK(st[ORACLE].st_mode)) {
			char t[2][PATH_MAX];
			ssize_t tl[2];

			for (int side = 0; side < 2; side++)
				tl[side] = readlink(P(side, child), t[side], PATH_MAX);
			oracle_ok(tl[ORACLE] >= 0, "readlink");
			if (tl[FERRY] != tl[ORACLE] || memcmp(t[0], t[1], (size_t)tl[ORACLE]))
				diff_fail("MISMATCH %s: readlink gives '%.*s' on ext4, '%.*s' (%zd) on "
					  "ferryfs", what, (int)tl[0], t[0], tl[1] > 0 ? (int)tl[1] : 0,
					  t[1], tl[1]);
		} else if (S_ISDIR(st[ORACLE].st_mode)) {
			tree_compare_dir(child, when);
		} else if (S_ISREG(st[ORACLE].st_mode)) {
			int fa = open(P(ORACLE, child), O_RDONLY | O_CLOEXEC);
			int fb = open(P(FERRY, child), O_RDONLY | O_CLOEXEC);

			oracle_ok(fa >= 0, "open for the tree check");
			if (fb < 0)
				diff_fail("MISMATCH %s: open(O_RDONLY) fails on ferryfs: %s", what,
					  fm_errname(errno));
			cmp_content(what, fa, fb, st[ORACLE].st_size);
			close(fa);
			close(fb);
		}
	}
	for (int side = 0; side < 2; side++)
		for (int i = 0; i < n[side]; i++)
			free(ln[side][i]);
}

static void tree_compare(const char *when)
{
	tree_compare_dir("", when);
}

/* ---- the operations ----------------------------------------------------- */

static int random_open_flags(bool allow_excl)
{
	static const int acc[] = { O_RDONLY, O_WRONLY, O_RDWR };
	int f = acc[rnd(3)];

	if (chance(55))
		f |= O_CREAT;
	if (chance(D.p->trunc_pct))
		f |= O_TRUNC;
	if (chance(20))
		f |= O_APPEND;
	if (allow_excl && chance(12))
		f |= O_EXCL;
	return f;
}

/* /proc/self/fd/N: opens and links the inode an fd holds, whatever its
 * names are now (or none). */
static const char *proc_fd(int fd)
{
	static char buf[4][40];
	static int n;
	char *b = buf[n++ % 4];

	snprintf(b, 40, "/proc/self/fd/%d", fd);
	return b;
}

/* Opens name into slot s; via >= 0: opens slot via's inode again through
 * /proc/self/fd instead (it may have no name left). */
static void do_open_slot(int s, const char *name, int flags, int via)
{
	static const mode_t modes[] = { 0644, 0600, 0755, 0444, 0640 };
	mode_t mode = modes[rnd(5)];
	struct rv r[2];
	int fd[2];
	char what[96];

	if (via >= 0) {
		logop("open slot %d through /proc/self/fd of slot %d '%s' %s", s, via, name,
		      flags_str(flags));
		BOTH(r, fd[side] = open(proc_fd(D.slot[via].fd[side]), flags | O_CLOEXEC, mode));
	} else {
		logop("open slot %d '%s' %s 0%o", s, name, flags_str(flags), mode);
		BOTH(r, fd[side] = open(P(side, name), flags | O_CLOEXEC, mode));
	}
	snprintf(what, sizeof(what), "open('%s'%s, %s)", name, via >= 0 ? " by fd" : "",
		 flags_str(flags));
	if (r[0].v >= 0 && r[1].v < 0)
		close(fd[ORACLE]);
	if (r[1].v >= 0 && r[0].v < 0)
		close(fd[FERRY]);
	check_rv(what, r, false);
	if (r[0].v < 0)
		return;
	struct slot *sl = &D.slot[s];
	struct stat st;

	*sl = (struct slot){ .used = true, .fd = { fd[0], fd[1] }, .flags = flags };
	snprintf(sl->name, sizeof(sl->name), "%s", name);
	oracle_ok(fstat(fd[ORACLE], &st) == 0, "fstat");
	sl->is_dir = S_ISDIR(st.st_mode);
	cmp_fstat(s, "after open");
}

static void op_open(void)
{
	int s = pick_free();
	int flags = random_open_flags(true);

	if (s < 0)
		return;
	/* without O_CREAT, mostly a name that exists */
	do_open_slot(s, flags & O_CREAT ? pick_name() : pick_existing(), flags, -1);
}

static void drop_map(int m);

static void close_slot(int s)
{
	struct rv r[2];

	logop("close slot %d '%s'", s, D.slot[s].name);
	BOTH(r, close(D.slot[s].fd[side]));
	D.slot[s].used = false;
	check_rv("close", r, true);
}

static void op_close(void)
{
	int s = pick_used();

	if (s >= 0)
		close_slot(s);
}

/* Close, then open the same name again: the commit-then-reopen path. */
static void op_reopen(void)
{
	int s = pick_used();
	char name[16];

	if (s < 0)
		return;
	snprintf(name, sizeof(name), "%s", D.slot[s].name);
	close_slot(s);
	do_open_slot(s, name, random_open_flags(false), -1);
}

static void op_write(bool positional)
{
	int s = pick_slot(WRITABLE);
	struct rv r[2];

	if (s < 0)
		return;
	off_t size = D.slot[s].is_dir ? 0 : oracle_fsize(s);
	/* now and then a big write: many 64 KiB pieces, often across a 4 MiB
	 * block boundary */
	size_t len = chance(3) ? (size_t)rnd(MAX_BIG) : pick_len(MAX_WRITE);
	off_t off = pick_off(size);

	fill(len);
	if (positional) {
		logop("pwrite slot %d '%s' len %zu off %lld", s, D.slot[s].name, len, (long long)off);
		BOTH(r, pwrite(D.slot[s].fd[side], D.wbuf, len, off));
		check_rv("pwrite", r, true);
	} else {
		/* Half of the writes go where the last one left the offset. */
		if (chance(50)) {
			logop("lseek slot %d '%s' SEEK_SET %lld", s, D.slot[s].name, (long long)off);
			BOTH(r, lseek(D.slot[s].fd[side], off, SEEK_SET));
			check_rv("lseek before write", r, true);
		}
		logop("write slot %d '%s' len %zu", s, D.slot[s].name, len);
		BOTH(r, write(D.slot[s].fd[side], D.wbuf, len));
		check_rv("write", r, true);
	}
	cmp_fstat(s, "after write");
}

static void op_read(bool positional)
{
	int s = pick_slot(READABLE);
	struct rv r[2];

	if (s < 0)
		return;
	off_t size = D.slot[s].is_dir ? 0 : oracle_fsize(s);
	size_t len = chance(3) ? (size_t)rnd(MAX_BIG) : pick_len(MAX_READ);
	/* Reads mostly inside the file, sometimes across or past its end. */
	off_t off = chance(70) && size ? (off_t)rnd((uint64_t)size) : pick_off(size);

	if (positional) {
		logop("pread slot %d '%s' len %zu off %lld", s, D.slot[s].name, len, (long long)off);
		BOTH(r, pread(D.slot[s].fd[side], D.rbuf[side], len, off));
	} else {
		logop("read slot %d '%s' len %zu", s, D.slot[s].name, len);
		BOTH(r, read(D.slot[s].fd[side], D.rbuf[side], len));
	}
	check_rv(positional ? "pread" : "read", r, true);
	if (r[0].v > 0 && memcmp(D.rbuf[0], D.rbuf[1], (size_t)r[0].v)) {
		long long i = 0;

		while (D.rbuf[0][i] == D.rbuf[1][i])
			i++;
		diff_fail("MISMATCH %s data: byte %lld of the %lld read differs: ext4 0x%02x, "
			  "ferryfs 0x%02x", positional ? "pread" : "read", i, r[0].v,
			  (unsigned char)D.rbuf[0][i], (unsigned char)D.rbuf[1][i]);
	}
}

static void op_lseek(void)
{
	int s = pick_file_slot();
	static const int wh[] = { SEEK_SET, SEEK_CUR, SEEK_END };
	static const char *const whn[] = { "SEEK_SET", "SEEK_CUR", "SEEK_END" };
	struct rv r[2];
	int w = (int)rnd(3);
	off_t off;

	/* Directory offsets are the filesystem's own cookies: files only. */
	if (s < 0)
		return;
	off = w == SEEK_SET ? pick_off(oracle_fsize(s)) : (off_t)rnd(128 * KiB) - 64 * KiB;
	if (chance(3))
		off = -1 - (off_t)rnd(5 * MiB); /* may land before 0: EINVAL */
	logop("lseek slot %d '%s' %s %lld", s, D.slot[s].name, whn[w], (long long)off);
	BOTH(r, lseek(D.slot[s].fd[side], off, wh[w]));
	check_rv("lseek", r, true);
}

/* Are the oracle's bytes in [from, to) all zero? Sets *bad to the first
 * non-zero offset. The slot's fd may be write-only and its name gone, so
 * the file is opened again for reading through /proc/self/fd. */
static bool oracle_zeros(int slotfd, off_t from, off_t to, off_t *bad)
{
	char path[64];
	int fd;
	bool zeros = true;

	snprintf(path, sizeof(path), "/proc/self/fd/%d", slotfd);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	oracle_ok(fd >= 0, "reopen for the hole check");
	for (off_t off = from; zeros && off < to; off += MiB) {
		size_t len = (size_t)(to - off < MiB ? to - off : MiB);
		ssize_t n = pread(fd, D.cbuf[0], len, off);

		oracle_ok(n == (ssize_t)len, "pread for the hole check");
		for (size_t i = 0; i < len; i++) {
			if (D.cbuf[0][i]) {
				*bad = off + (off_t)i;
				zeros = false;
				break;
			}
		}
	}
	close(fd);
	return zeros;
}

/*
 * SEEK_DATA and SEEK_HOLE may legitimately differ between filesystems, so
 * only what ferryfs claims is checked: past the end both must fail with
 * ENXIO; inside the file, a range ferryfs calls a hole must read as zeros
 * on ext4 (SEEK_DATA never skips data, SEEK_HOLE never starts a hole at a
 * non-zero byte). The offsets are put back afterwards on both sides, since
 * the two results may differ.
 */
static void op_seek_data_hole(void)
{
	int s = pick_file_slot();
	struct rv r[2], pos[2];
	bool hole = chance(50);
	const char *wn = hole ? "SEEK_HOLE" : "SEEK_DATA";
	off_t size, off, from, to, bad;
	char what[64];

	if (s < 0)
		return;
	size = oracle_fsize(s);
	off = chance(15) ? size + (off_t)rnd(3) : size ? (off_t)rnd((uint64_t)size) : 0;
	BOTH(pos, lseek(D.slot[s].fd[side], 0, SEEK_CUR));
	logop("lseek slot %d '%s' %s %lld (size %lld)", s, D.slot[s].name, wn, (long long)off,
	      (long long)size);
	BOTH(r, lseek(D.slot[s].fd[side], off, hole ? SEEK_HOLE : SEEK_DATA));
	logmore(" -> %s %s", rv_str(&r[ORACLE]), rv_str(&r[FERRY]));
	trace_current();
	snprintf(what, sizeof(what), "lseek(%s, %lld) with size %lld", wn, (long long)off,
		 (long long)size);
	if (off >= size) {
		check_rv(what, r, true);
	} else if (hole) {
		if (r[FERRY].v < off || r[FERRY].v > size)
			diff_fail("MISMATCH %s: ferryfs returned %s, outside [%lld, %lld]", what,
				  rv_str(&r[FERRY]), (long long)off, (long long)size);
		from = r[FERRY].v;
		to = size;
		if (from < size) {
			/* the hole ends where ferryfs says data starts again */
			off_t d = lseek(D.slot[s].fd[FERRY], from, SEEK_DATA);

			if (d < 0 && errno != ENXIO)
				diff_fail("MISMATCH %s: ferryfs SEEK_DATA from its hole at %lld failed: %s",
					  what, (long long)from, fm_errname(errno));
			if (d >= 0)
				to = d;
			if (d >= 0 && (d < from || d > size))
				diff_fail("MISMATCH %s: ferryfs SEEK_DATA from %lld returned %lld",
					  what, (long long)from, (long long)d);
		}
		if (!oracle_zeros(D.slot[s].fd[ORACLE], from, to, &bad))
			diff_fail("MISMATCH %s: ferryfs reports a hole over [%lld, %lld) but ext4 "
				  "has a non-zero byte at %lld", what, (long long)from, (long long)to,
				  (long long)bad);
	} else {
		if (r[FERRY].v < 0 && r[FERRY].err != ENXIO)
			diff_fail("MISMATCH %s: ferryfs failed with %s", what,
				  fm_errname(r[FERRY].err));
		if (r[FERRY].v >= 0 && (r[FERRY].v < off || r[FERRY].v >= size))
			diff_fail("MISMATCH %s: ferryfs returned %lld, outside [%lld, %lld)", what,
				  r[FERRY].v, (long long)off, (long long)size);
		to = r[FERRY].v < 0 ? size : r[FERRY].v;
		if (!oracle_zeros(D.slot[s].fd[ORACLE], off, to, &bad))
			diff_fail("MISMATCH %s: ferryfs SEEK_DATA skips [%lld, %lld) but ext4 has a "
				  "non-zero byte at %lld", what, (long long)off, (long long)to,
				  (long long)bad);
	}
	for (int side = 0; side < 2; side++)
		if (pos[side].v >= 0)
			lseek(D.slot[s].fd[side], pos[side].v, SEEK_SET);
}

static void op_ftruncate(void)
{
	int s = pick_slot(WRITABLE);
	struct rv r[2];
	off_t ns;

	if (s < 0)
		return;
	ns = pick_size(D.slot[s].is_dir ? 0 : oracle_fsize(s));
	logop("ftruncate slot %d '%s' %lld", s, D.slot[s].name, (long long)ns);
	BOTH(r, ftruncate(D.slot[s].fd[side], ns));
	check_rv("ftruncate", r, true);
	cmp_fstat(s, "after ftruncate");
}

static void op_truncate(void)
{
	const char *name = pick_existing();
	struct stat st;
	off_t ns = pick_size(lstat(P(ORACLE, name), &st) == 0 ? st.st_size : 0);
	struct rv r[2];

	logop("truncate '%s' %lld", name, (long long)ns);
	BOTH(r, truncate(P(side, name), ns));
	check_rv("truncate", r, true);
	cmp_lstat(name, "after truncate");
}

static void op_fsync(void)
{
	int s = pick_used();
	bool data = chance(40);
	struct rv r[2];

	if (s < 0)
		return;
	logop("%s slot %d '%s'", data ? "fdatasync" : "fsync", s, D.slot[s].name);
	BOTH(r, data ? fdatasync(D.slot[s].fd[side]) : fsync(D.slot[s].fd[side]));
	check_rv(data ? "fdatasync" : "fsync", r, true);
	cmp_fstat(s, "after fsync");
}

/* The modes ferryfs supports (others are EOPNOTSUPP there, legitimately). */
static void op_fallocate(void)
{
	static const int modes[] = { 0, FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE };
	static const char *const mn[] = { "0", "KEEP_SIZE", "PUNCH_HOLE|KEEP_SIZE" };
	int s = pick_file_slot_for(WRITABLE);
	int m = (int)rnd(3);
	struct rv r[2];
	off_t off, len;

	if (s < 0)
		return;
	off = pick_off(oracle_fsize(s));
	len = 1 + (off_t)rnd(chance(20) ? 5 * MiB : 200 * KiB);
	logop("fallocate slot %d '%s' %s off %lld len %lld", s, D.slot[s].name, mn[m],
	      (long long)off, (long long)len);
	BOTH(r, fallocate(D.slot[s].fd[side], modes[m], off, len));
	check_rv("fallocate", r, true);
	cmp_fstat(s, "after fallocate");
}

static void op_fstat(void)
{
	int s = pick_used();

	if (s < 0)
		return;
	logop("fstat slot %d '%s'", s, D.slot[s].name);
	trace_current();
	cmp_fstat(s, "");
}

static void op_lstat(void)
{
	const char *name = pick_name();

	logop("lstat '%s'", name);
	trace_current();
	cmp_lstat(name, "");
}

static void op_unlink(void)
{
	const char *name = pick_existing();
	struct rv r[2];

	logop("unlink '%s'", name);
	BOTH(r, unlink(P(side, name)));
	check_rv("unlink", r, true);
	cmp_lstat(name, "after unlink");
}

static void after_two_names(const char *a, const char *b, const char *what)
{
	char when[64];

	snprintf(when, sizeof(when), "after %s", what);
	cmp_lstat(a, when);
	cmp_lstat(b, when);
	/* an fd open on either name must see the same inode state */
	for (int s = 0; s < NSLOT; s++)
		if (D.slot[s].used)
			cmp_fstat(s, when);
}

static void op_rename(void)
{
	const char *a = pick_existing(), *b = chance(60) ? pick_existing() : pick_name();
	struct rv r[2];

	logop("rename '%s' -> '%s'", a, b);
	BOTH(r, rename(P(side, a), P(side, b)));
	check_rv("rename", r, true);
	after_two_names(a, b, "rename");
}

static void op_rename2(void)
{
	const char *a = pick_existing(), *b = chance(70) ? pick_existing() : pick_name();
	bool ex = chance(50);
	unsigned int fl = ex ? RENAME_EXCHANGE : RENAME_NOREPLACE;
	struct rv r[2];

	logop("renameat2 '%s' -> '%s' %s", a, b, ex ? "RENAME_EXCHANGE" : "RENAME_NOREPLACE");
	BOTH(r, renameat2(AT_FDCWD, P(side, a), AT_FDCWD, P(side, b), fl));
	check_rv(ex ? "renameat2(RENAME_EXCHANGE)" : "renameat2(RENAME_NOREPLACE)", r, true);
	after_two_names(a, b, "renameat2");
}

static void op_link(void)
{
	const char *a = pick_existing(), *b = pick_name();
	struct rv r[2];

	logop("link '%s' -> '%s'", a, b);
	BOTH(r, link(P(side, a), P(side, b)));
	check_rv("link", r, true);
	after_two_names(a, b, "link");
}

static void op_mkdir(void)
{
	const char *name = pick_name();
	mode_t mode = chance(80) ? 0755 : 0700;
	struct rv r[2];

	logop("mkdir '%s' 0%o", name, mode);
	BOTH(r, mkdir(P(side, name), mode));
	check_rv("mkdir", r, true);
	cmp_lstat(name, "after mkdir");
}

static void op_rmdir(void)
{
	const char *name = pick_existing();
	struct rv r[2];

	logop("rmdir '%s'", name);
	BOTH(r, rmdir(P(side, name)));
	check_rv("rmdir", r, true);
	cmp_lstat(name, "after rmdir");
}

static void op_chmod(void)
{
	static const mode_t modes[] = { 0644, 0600, 0755, 0444, 0700, 0666 };
	const char *name = pick_existing();
	mode_t mode = modes[rnd(6)];
	struct rv r[2];

	logop("chmod '%s' 0%o", name, mode);
	BOTH(r, chmod(P(side, name), mode));
	check_rv("chmod", r, true);
	cmp_lstat(name, "after chmod");
}

/* mmap a range of a slot's file on both sides; returns the map length, or
 * 0 if it failed alike on both (the results are checked). */
static size_t map_both(int s, int prot, off_t *start_out, char *map[2], off_t *size_out)
{
	off_t size = oracle_fsize(s);
	long pg = sysconf(_SC_PAGESIZE);
	off_t start = size ? (off_t)rnd((uint64_t)size) / pg * pg : 0;
	size_t len = size ? (size_t)(size - start) : 4096;
	struct rv r[2];

	if (len > (size_t)MAX_MAP)
		len = (size_t)(pg + (off_t)rnd(MAX_MAP - pg));
	logop("mmap slot %d '%s' %s MAP_SHARED off %lld len %zu (size %lld)", s, D.slot[s].name,
	      prot & PROT_WRITE ? "PROT_READ|PROT_WRITE" : "PROT_READ", (long long)start, len,
	      (long long)size);
	for (int side = 0; side < 2; side++) {
		errno = 0;
		map[side] = mmap(NULL, len, prot, MAP_SHARED, D.slot[s].fd[side], start);
		r[side].v = map[side] == MAP_FAILED ? -1 : 0;
		r[side].err = map[side] == MAP_FAILED ? errno : 0;
	}
	if (r[0].v == 0 && r[1].v < 0)
		munmap(map[ORACLE], len);
	if (r[1].v == 0 && r[0].v < 0)
		munmap(map[FERRY], len);
	check_rv("mmap", r, true);
	*start_out = start;
	*size_out = size;
	return r[0].v == 0 ? len : 0;
}

/*
 * Mapped accesses that fault (SIGBUS: a page the filesystem could not
 * supply) are reported as a discrepancy instead of killing the test.
 */
static sigjmp_buf bus_jmp;
static volatile sig_atomic_t in_map_access;

static void on_sigbus(int sig)
{
	if (in_map_access)
		siglongjmp(bus_jmp, 1);
	signal(sig, SIG_DFL);
	raise(sig);
}

static bool guarded_memcpy(void *dst, const void *src, size_t n)
{
	if (sigsetjmp(bus_jmp, 1)) {
		in_map_access = 0;
		return false;
	}
	in_map_access = 1;
	memcpy(dst, src, n);
	in_map_access = 0;
	return true;
}

static void unmap_both(char *map[2], size_t len)
{
	struct rv r[2];

	logop("  munmap");
	BOTH(r, munmap(map[side], len));
	check_rv("munmap", r, true);
}

static void op_mmap_write(void)
{
	int s = pick_file_slot_for(READ_WRITE);
	char *map[2];
	off_t start, size;
	size_t len;
	struct rv r[2];

	if (s < 0)
		return;
	/* sizes agree (checked) before touching pages: no SIGBUS on either side */
	cmp_fstat(s, "before mmap");
	len = map_both(s, PROT_READ | PROT_WRITE, &start, map, &size);
	if (!len)
		return;
	if (size > start) {
		size_t avail = (size_t)(size - start) < len ? (size_t)(size - start) : len;
		size_t a = (size_t)rnd(avail);
		size_t n = 1 + (size_t)rnd(avail - a < 64 * KiB ? avail - a : 64 * KiB);

		fill(n);
		logop("  store %zu bytes at map offset %zu, msync MS_SYNC", n, a);
		for (int side = 0; side < 2; side++) {
			if (!guarded_memcpy(map[side] + a, D.wbuf, n)) {
				trace_current();
				diff_fail("%s: SIGBUS storing %zu bytes at file offset %lld of a %lld-byte "
					  "file through MAP_SHARED",
					  side == FERRY ? "MISMATCH mapped write" : "ext4 oracle", n,
					  (long long)(start + (off_t)a), (long long)size);
			}
		}
		BOTH(r, msync(map[side], len, MS_SYNC));
		check_rv("msync", r, true);
	}
	unmap_both(map, len);
	cmp_fstat(s, "after mmap write");
}

static void op_mmap_read(void)
{
	int s = pick_file_slot_for(READABLE);
	char *map[2];
	off_t start, size;
	size_t len;

	if (s < 0)
		return;
	cmp_fstat(s, "before mmap");
	len = map_both(s, PROT_READ, &start, map, &size);
	if (!len)
		return;
	if (size > start) {
		size_t avail = (size_t)(size - start) < len ? (size_t)(size - start) : len;

		logop("  load %zu bytes", avail);
		for (int side = 0; side < 2; side++) {
			if (!guarded_memcpy(D.cbuf[side], map[side], avail)) {
				trace_current();
				diff_fail("%s: SIGBUS loading [%lld, %lld) of a %lld-byte file through "
					  "MAP_SHARED", side == FERRY ? "MISMATCH mapped read" : "ext4 oracle",
					  (long long)start, (long long)(start + (off_t)avail),
					  (long long)size);
			}
		}
		trace_current();
		if (memcmp(D.cbuf[ORACLE], D.cbuf[FERRY], avail)) {
			size_t i = 0;

			while (D.cbuf[ORACLE][i] == D.cbuf[FERRY][i])
				i++;
			diff_fail("MISMATCH mapped read at file offset %lld: ext4 0x%02x, ferryfs 0x%02x",
				  (long long)start + (long long)i, (unsigned char)D.cbuf[ORACLE][i],
				  (unsigned char)D.cbuf[FERRY][i]);
		}
	}
	unmap_both(map, len);
}

/* A symlink named by one of the names, pointing at another (relative to
 * the link's directory, so some dangle), at itself or nowhere. No target
 * has "..": a link can be renamed to the top, from where both sides' links
 * would reach the same file beside the two roots. */
static void op_symlink(void)
{
	static const char *const targets[] = { "f0", "f1", "d0", "d0/f0", "./f2", "f3", "nowhere", "d1/" };
	const char *name = pick_name(), *target = targets[rnd(8)];
	struct rv r[2];

	logop("symlink '%s' -> '%s'", name, target);
	BOTH(r, symlink(target, P(side, name)));
	check_rv("symlink", r, true);
	cmp_lstat(name, "after symlink");
}

/* user.* extended attributes: set (plain, XATTR_CREATE, XATTR_REPLACE),
 * get (also the size query), remove and list, on names that may be
 * files, directories or symlinks (followed). */
static void op_xattr(void)
{
	static const char *const keys[] = { "user.a", "user.b", "user.long.name.c" };
	const char *name = pick_existing(), *key = keys[rnd(3)];
	struct rv r[2];
	int kind = (int)rnd(6);

	switch (kind) {
	case 0:
	case 1: {
		/* ext4 keeps an inode's xattrs in one block (ENOSPC beyond
		 * it); three values of at most 1000 bytes always fit */
		size_t len = chance(10) ? (size_t)rnd(1001) : (size_t)rnd(64);
		int fl = chance(60) ? 0 : chance(50) ? XATTR_CREATE : XATTR_REPLACE;

		fill(len);
		logop("setxattr '%s' %s len %zu %s", name, key, len,
		      fl == XATTR_CREATE ? "XATTR_CREATE" : fl == XATTR_REPLACE ? "XATTR_REPLACE" : "0");
		BOTH(r, setxattr(P(side, name), key, D.wbuf, len, fl));
		check_rv("setxattr", r, true);
		break;
	}
	case 2:
	case 3: {
		size_t size = chance(20) ? 0 : chance(10) ? 3 : 8192;

		logop("getxattr '%s' %s size %zu", name, key, size);
		BOTH(r, getxattr(P(side, name), key, size ? D.rbuf[side] : NULL, size));
		check_rv("getxattr", r, true);
		if (size && r[0].v > 0 && memcmp(D.rbuf[0], D.rbuf[1], (size_t)r[0].v))
			diff_fail("MISMATCH getxattr value of %s on '%s'", key, name);
		break;
	}
	case 4:
		logop("removexattr '%s' %s", name, key);
		BOTH(r, removexattr(P(side, name), key));
		check_rv("removexattr", r, true);
		break;
	default: {
		char *l[2][8];
		int n[2] = { 0, 0 };

		logop("listxattr '%s'", name);
		BOTH(r, listxattr(P(side, name), D.rbuf[side], 8192));
		check_rv("listxattr", r, true);
		if (r[0].v <= 0)
			break;
		/* the same names, in any order */
		for (int side = 0; side < 2; side++) {
			for (char *k = D.rbuf[side]; k < D.rbuf[side] + r[side].v; k += strlen(k) + 1)
				if (n[side] < 8)
					l[side][n[side]++] = k;
			qsort(l[side], (size_t)n[side], sizeof(l[side][0]), cmp_names);
		}
		for (int i = 0; i < n[0]; i++)
			if (n[0] != n[1] || strcmp(l[0][i], l[1][i]))
				diff_fail("MISMATCH listxattr of '%s': ext4 has '%s', ferryfs '%s'", name,
					  l[0][i], i < n[1] ? l[1][i] : "(none)");
	}
	}
}

/*
 * copy_file_range between two open files (possibly the same one; an
 * overlap within one file is EINVAL). Either side may copy less than asked
 * in one call, so each side loops until it copies nothing or fails, and
 * the totals are compared.
 */
static void op_copy_range(void)
{
	int si = pick_slot(READABLE), so = pick_slot(WRITABLE);
	struct rv r[2];

	if (si < 0 || so < 0)
		return;
	off_t isize = D.slot[si].is_dir ? 0 : oracle_fsize(si);
	off_t osize = D.slot[so].is_dir ? 0 : oracle_fsize(so);
	off_t ioff = chance(80) && isize ? (off_t)rnd((uint64_t)isize) : pick_off(isize);
	off_t ooff = pick_off(osize);
	size_t len = chance(5) ? (size_t)rnd(MAX_BIG) : pick_len(MAX_WRITE);

	logop("copy_file_range slot %d '%s' off %lld -> slot %d '%s' off %lld len %zu", si,
	      D.slot[si].name, (long long)ioff, so, D.slot[so].name, (long long)ooff, len);
	for (int side = 0; side < 2; side++) {
		loff_t in = ioff, out = ooff;
		long long total = 0;

		r[side].err = 0;
		for (;;) {
			ssize_t n = copy_file_range(D.slot[si].fd[side], &in, D.slot[so].fd[side], &out,
						    len - (size_t)total, 0);
			if (n < 0) {
				r[side].err = errno;
				break;
			}
			total += n;
			if (n == 0 || (size_t)total == len)
				break;
		}
		/* a failure after a partial copy is reported as the failure */
		r[side].v = r[side].err ? -1 : total;
	}
	check_rv("copy_file_range", r, true);
	cmp_fstat(so, "after copy_file_range");
}

/* Reads an open directory from its start, through a new open of it: the
 * same names, in any order. A removed directory reads as ENOENT on both. */
static void op_readdir_fd(void)
{
	int ok[NSLOT], n = 0;
	char *ln[2][64];
	int cnt[2] = { 0, 0 };
	struct rv r[2];

	for (int s = 0; s < NSLOT; s++)
		if (D.slot[s].used && D.slot[s].is_dir)
			ok[n++] = s;
	if (!n)
		return;
	int s = ok[rnd((uint64_t)n)];

	logop("readdir slot %d '%s' from the start", s, D.slot[s].name);
	for (int side = 0; side < 2; side++) {
		/* A new open file description: directory offsets are each
		 * filesystem's own cookies, so the slot's must not move. */
		char self[64];
		int fd;
		DIR *d;
		struct dirent *de;

		snprintf(self, sizeof(self), "/proc/self/fd/%d", D.slot[s].fd[side]);
		fd = open(self, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (fd < 0 && side == FERRY)
			diff_fail("MISMATCH reopening directory slot %d through /proc/self/fd: %s", s,
				  fm_errname(errno));
		oracle_ok(fd >= 0, "reopen through /proc/self/fd");
		d = fdopendir(fd);
		oracle_ok(d != NULL, "fdopendir");
		r[side].v = 0;
		r[side].err = 0;
		for (;;) {
			errno = 0;
			de = readdir(d);
			if (!de) {
				if (errno) {
					r[side].v = -1;
					r[side].err = errno;
				}
				break;
			}
			if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..") || cnt[side] >= 64)
				continue;
			ln[side][cnt[side]++] = strdup(de->d_name);
		}
		closedir(d);
		if (r[side].v == 0)
			r[side].v = cnt[side];
	}
	check_rv("readdir", r, true);
	for (int side = 0; side < 2; side++)
		qsort(ln[side], (size_t)cnt[side], sizeof(ln[side][0]), cmp_names);
	for (int i = 0; i < cnt[0] && i < cnt[1]; i++)
		if (strcmp(ln[0][i], ln[1][i]))
			diff_fail("MISMATCH readdir of slot %d '%s': ext4 has '%s' where ferryfs has '%s'",
				  s, D.slot[s].name, ln[0][i], ln[1][i]);
	for (int side = 0; side < 2; side++)
		for (int i = 0; i < cnt[side]; i++)
			free(ln[side][i]);
}

/* Drops the page cache of an open file, so the next reads and faults go
 * to the filesystem (ferry-mountd, the staging file or the read cache)
 * instead of pages the kernel kept. No visible effect on either side. */
static void op_drop_cache(void)
{
	int s = pick_file_slot();
	struct rv r[2];

	if (s < 0)
		return;
	logop("posix_fadvise slot %d '%s' DONTNEED", s, D.slot[s].name);
	BOTH(r, -posix_fadvise(D.slot[s].fd[side], 0, 0, POSIX_FADV_DONTNEED));
	check_rv("posix_fadvise", r, true);
}

/*
 * Another open of an open file's inode through /proc/self/fd, with any
 * flags (O_TRUNC included): reaches files that were unlinked or renamed
 * over while open, which no name reaches any more.
 */
static void op_reopen_fd(void)
{
	int via = pick_used(), s = pick_free();
	char name[16];

	if (via < 0 || s < 0)
		return;
	snprintf(name, sizeof(name), "%s", D.slot[via].name);
	do_open_slot(s, name, random_open_flags(false), via);
}

/* linkat() of an open file by its fd: a new name for a file whatever its
 * names are now; ENOENT once it has none (both sides). */
static void op_link_fd(void)
{
	int s = pick_used();
	const char *name = pick_name();
	struct rv r[2];
	char when[64];

	if (s < 0)
		return;
	logop("linkat slot %d '%s' (AT_SYMLINK_FOLLOW on /proc/self/fd) -> '%s'", s,
	      D.slot[s].name, name);
	BOTH(r, linkat(AT_FDCWD, proc_fd(D.slot[s].fd[side]), AT_FDCWD, P(side, name),
		       AT_SYMLINK_FOLLOW));
	check_rv("linkat by fd", r, true);
	snprintf(when, sizeof(when), "after linkat of slot %d", s);
	cmp_lstat(name, when);
	cmp_fstat(s, "after linkat");
}

static void op_fchmod(void)
{
	static const mode_t modes[] = { 0644, 0600, 0755, 0444, 0700, 0666 };
	int s = pick_used();
	mode_t mode = modes[rnd(6)];
	struct rv r[2];

	if (s < 0)
		return;
	logop("fchmod slot %d '%s' 0%o", s, D.slot[s].name, mode);
	BOTH(r, fchmod(D.slot[s].fd[side], mode));
	check_rv("fchmod", r, true);
	cmp_fstat(s, "after fchmod");
}

/* ---- persistent mappings ------------------------------------------------- */

static int pick_map(bool writable)
{
	int ok[NMAP], n = 0;

	for (int m = 0; m < NMAP; m++)
		if (D.map[m].used && (!writable || (D.map[m].prot & PROT_WRITE)))
			ok[n++] = m;
	return n ? ok[rnd((uint64_t)n)] : -1;
}

static void drop_map(int m)
{
	struct rv r[2];

	logop("munmap map %d '%s'", m, D.map[m].name);
	BOTH(r, munmap(D.map[m].addr[side], D.map[m].len));
	close(D.map[m].ofd);
	D.map[m].used = false;
	check_rv("munmap", r, true);
}

static void drop_all_maps(void)
{
	for (int m = 0; m < NMAP; m++)
		if (D.map[m].used)
			drop_map(m);
}

/* The part of a mapping that is inside the file now: [0, min(len, size)).
 * Pages past the end are never touched (SIGBUS, or bytes no filesystem
 * keeps). */
static size_t map_inside(int m)
{
	struct stat st;

	oracle_ok(fstat(D.map[m].ofd, &st) == 0, "fstat of a mapping's file");
	return (size_t)st.st_size < D.map[m].len ? (size_t)st.st_size : D.map[m].len;
}

/* A mapping of the start of an open file (read-write if the fd allows),
 * kept until OP_MAP_DROP, a remount or the end, whatever happens to the
 * fd or the names meanwhile. */
static void op_map_new(void)
{
	int s = pick_file_slot_for(READ_WRITE), m;
	struct rv r[2];
	char *addr[2];
	size_t len = (size_t)(4096 + (off_t)rnd(MAX_PMAP - 4096));
	int prot;

	for (m = 0; m < NMAP && D.map[m].used; m++)
		;
	if (s < 0)
		return;
	if (m == NMAP) {
		drop_map((int)rnd(NMAP));
		return;
	}
	prot = (D.slot[s].flags & O_ACCMODE) == O_RDWR ? PROT_READ | PROT_WRITE : PROT_READ;
	logop("mmap map %d of slot %d '%s' %s MAP_SHARED off 0 len %zu", m, s, D.slot[s].name,
	      prot & PROT_WRITE ? "PROT_READ|PROT_WRITE" : "PROT_READ", len);
	for (int side = 0; side < 2; side++) {
		errno = 0;
		addr[side] = mmap(NULL, len, prot, MAP_SHARED, D.slot[s].fd[side], 0);
		r[side].v = addr[side] == MAP_FAILED ? -1 : 0;
		r[side].err = addr[side] == MAP_FAILED ? errno : 0;
	}
	if (r[0].v == 0 && r[1].v < 0)
		munmap(addr[ORACLE], len);
	if (r[1].v == 0 && r[0].v < 0)
		munmap(addr[FERRY], len);
	check_rv("mmap", r, true);
	if (r[0].v < 0)
		return;
	D.map[m] = (struct mapping){ .used = true, .addr = { addr[0], addr[1] }, .len = len,
				     .prot = prot };
	D.map[m].from = s;
	D.map[m].ofd = open(proc_fd(D.slot[s].fd[ORACLE]), O_PATH | O_CLOEXEC);
	oracle_ok(D.map[m].ofd >= 0, "O_PATH open of a mapped file");
	memcpy(D.map[m].name, D.slot[s].name, sizeof(D.map[m].name));
}

static void op_map_store(void)
{
	int m = pick_map(true);
	size_t inside, a, n;

	if (m < 0)
		return;
	inside = map_inside(m);
	if (!inside)
		return;
	a = (size_t)rnd(inside);
	n = 1 + (size_t)rnd(inside - a < 64 * KiB ? inside - a : 64 * KiB);
	fill(n);
	logop("store %zu bytes at offset %zu through map %d '%s' (file size now %zu+)", n, a, m,
	      D.map[m].name, inside);
	trace_current();
	for (int side = 0; side < 2; side++)
		if (!guarded_memcpy(D.map[m].addr[side] + a, D.wbuf, n))
			diff_fail("%s: SIGBUS storing [%zu, %zu) through a mapping of a file of "
				  "at least %zu bytes", side == FERRY ? "MISMATCH mapped store" : "ext4 oracle",
				  a, a + n, inside);
}

static void op_map_load(void)
{
	int m = pick_map(false);
	size_t inside, a, n;

	if (m < 0)
		return;
	inside = map_inside(m);
	if (!inside)
		return;
	a = chance(30) ? 0 : (size_t)rnd(inside);
	n = 1 + (size_t)rnd(inside - a < 256 * KiB ? inside - a : 256 * KiB);
	logop("load %zu bytes at offset %zu through map %d '%s'", n, a, m, D.map[m].name);
	trace_current();
	for (int side = 0; side < 2; side++)
		if (!guarded_memcpy(D.cbuf[side], D.map[m].addr[side] + a, n))
			diff_fail("%s: SIGBUS loading [%zu, %zu) through a mapping of a file of at "
				  "least %zu bytes", side == FERRY ? "MISMATCH mapped load" : "ext4 oracle",
				  a, a + n, inside);
	if (memcmp(D.cbuf[ORACLE], D.cbuf[FERRY], n)) {
		size_t i = 0;

		while (D.cbuf[ORACLE][i] == D.cbuf[FERRY][i])
			i++;
		diff_fail("MISMATCH mapped load through map %d '%s' at file offset %zu: ext4 0x%02x, "
			  "ferryfs 0x%02x", m, D.map[m].name, a + i, (unsigned char)D.cbuf[ORACLE][i],
			  (unsigned char)D.cbuf[FERRY][i]);
	}
}

static void op_map_sync(void)
{
	int m = pick_map(false);
	int fl = chance(70) ? MS_SYNC : MS_ASYNC;
	struct rv r[2];

	if (m < 0)
		return;
	logop("msync map %d '%s' %s", m, D.map[m].name, fl == MS_SYNC ? "MS_SYNC" : "MS_ASYNC");
	BOTH(r, msync(D.map[m].addr[side], D.map[m].len, fl));
	check_rv("msync", r, true);
}

static void op_map_drop(void)
{
	int m = pick_map(false);

	if (m >= 0)
		drop_map(m);
}

static void op_tree(void)
{
	logop("compare the whole tree");
	trace_current();
	tree_compare("(periodic check)");
}

static void close_all(void)
{
	for (int s = 0; s < NSLOT; s++)
		if (D.slot[s].used)
			close_slot(s);
}

/*
 * fm_remount(), remembering only the daemon of the current mount: the
 * fixture checks after each unmount that every ferry-mountd it ever saw is
 * gone, by pid, and a campaign remounts often enough on a busy machine
 * (pid_max 32768) for an old pid to be a new, unrelated process by then.
 * cold: with a new, empty --cache-dir, as fm_remount_cold().
 */
static void remount(bool cold)
{
	fm_umount();
	fm.n_mountd = 0;
	if (cold) {
		fm.n_cache++;
		snprintf(fm.cache, sizeof(fm.cache), "%s/cache-%d", fm.dir, fm.n_cache);
		cr_assert(mkdir(fm.cache, 0700) == 0, "mkdir %s: %s", fm.cache, strerror(errno));
	}
	fm_mount();
}

/* With every file closed and unmapped: unmount, mount again (half of the
 * time with an empty read cache, so every byte comes from the object
 * store), and the tree must match. */
static void op_remount(void)
{
	bool cold = chance(50);

	close_all();
	drop_all_maps();
	logop("remount ferryfs%s", cold ? " with an empty read cache" : "");
	trace_current();
	D.in_remount = true;
	remount(cold);
	D.in_remount = false;
	tree_compare("after remount");
}

/* ---- driver ------------------------------------------------------------- */

static void run_op(enum op o)
{
	switch (o) {
	case OP_OPEN: op_open(); break;
	case OP_CLOSE: op_close(); break;
	case OP_REOPEN: op_reopen(); break;
	case OP_WRITE: op_write(false); break;
	case OP_PWRITE: op_write(true); break;
	case OP_READ: op_read(false); break;
	case OP_PREAD: op_read(true); break;
	case OP_LSEEK: op_lseek(); break;
	case OP_SEEK_DATA_HOLE: op_seek_data_hole(); break;
	case OP_FTRUNCATE: op_ftruncate(); break;
	case OP_TRUNCATE: op_truncate(); break;
	case OP_FSYNC: op_fsync(); break;
	case OP_FALLOCATE: op_fallocate(); break;
	case OP_FSTAT: op_fstat(); break;
	case OP_LSTAT: op_lstat(); break;
	case OP_UNLINK: op_unlink(); break;
	case OP_RENAME: op_rename(); break;
	case OP_RENAME2: op_rename2(); break;
	case OP_LINK: op_link(); break;
	case OP_MKDIR: op_mkdir(); break;
	case OP_RMDIR: op_rmdir(); break;
	case OP_CHMOD: op_chmod(); break;
	case OP_MMAP_WRITE: op_mmap_write(); break;
	case OP_MMAP_READ: op_mmap_read(); break;
	case OP_TREE: op_tree(); break;
	case OP_REMOUNT: op_remount(); break;
	case OP_SYMLINK: op_symlink(); break;
	case OP_XATTR: op_xattr(); break;
	case OP_COPY_RANGE: op_copy_range(); break;
	case OP_READDIR_FD: op_readdir_fd(); break;
	case OP_DROP_CACHE: op_drop_cache(); break;
	case OP_REOPEN_FD: op_reopen_fd(); break;
	case OP_LINK_FD: op_link_fd(); break;
	case OP_FCHMOD: op_fchmod(); break;
	case OP_MAP_NEW: op_map_new(); break;
	case OP_MAP_STORE: op_map_store(); break;
	case OP_MAP_LOAD: op_map_load(); break;
	case OP_MAP_SYNC: op_map_sync(); break;
	case OP_MAP_DROP: op_map_drop(); break;
	case NOPS: break;
	}
}

static enum op pick_op(void)
{
	int total = 0, r;

	for (int o = 0; o < NOPS; o++)
		total += D.p->w[o];
	r = (int)rnd((uint64_t)total);
	for (int o = 0; o < NOPS; o++) {
		if (r < D.p->w[o])
			return (enum op)o;
		r -= D.p->w[o];
	}
	return OP_FSTAT;
}

static bool any_used(void)
{
	for (int s = 0; s < NSLOT; s++)
		if (D.slot[s].used)
			return true;
	return false;
}

static uint64_t splitmix(uint64_t x)
{
	x += 0x9E3779B97F4A7C15ULL;
	x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
	x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
	x ^= x >> 31;
	return x ? x : 1;
}

/*
 * FERRY_DIFF_SKIP="3,10-250,300": operations not to run, for shrinking a
 * failing sequence (scripts drive it: drop ranges while the same mismatch
 * still appears at the same last operation).
 */
static struct {
	long from[256], to[256];
	int n;
} skip;

static void parse_skip(const char *spec)
{
	skip.n = 0;
	while (spec && *spec && skip.n < 256) {
		char *end;
		long a = strtol(spec, &end, 10), b = a;

		if (end == spec)
			break;
		if (*end == '-')
			b = strtol(end + 1, &end, 10);
		skip.from[skip.n] = a;
		skip.to[skip.n++] = b;
		spec = *end == ',' ? end + 1 : end;
	}
}

static bool skipped(long op)
{
	for (int i = 0; i < skip.n; i++)
		if (op >= skip.from[i] && op <= skip.to[i])
			return true;
	return false;
}

static long env_long(const char *name, long def)
{
	const char *v = getenv(name);

	return v && *v ? strtol(v, NULL, 0) : def;
}

static void run_campaign(const struct profile *p)
{
	const char *env_seed = getenv("FERRY_DIFF_SEED");

	D.p = p;
	D.seed = env_seed && *env_seed ? strtoull(env_seed, NULL, 0) : p->seed;
	D.nops = env_long("FERRY_DIFF_OPS", 6000);
	D.trace = env_long("FERRY_DIFF_TRACE", 0) != 0;
	cr_log_info("differential/%s: seed 0x%llx, %ld operations", p->name,
		    (unsigned long long)D.seed, D.nops);
	if (D.trace)
		fprintf(stderr, "differential/%s: seed 0x%llx, %ld operations\n", p->name,
			(unsigned long long)D.seed, D.nops);
	parse_skip(getenv("FERRY_DIFF_SKIP"));
	for (D.op = 0; D.op < D.nops; D.op++) {
		enum op o;

		/* Each operation draws from its own stream, so that skipping
		 * some (FERRY_DIFF_SKIP) leaves the others' choices alone as far
		 * as the state allows: that is what makes minimizing work. */
		D.rs = splitmix(D.seed ^ splitmix((uint64_t)D.op + 1));
		if (skipped(D.op))
			continue;
		o = pick_op();
		/* Steer towards what is possible: fd operations need an open
		 * file, an open needs a free slot, a remount needs none open
		 * (it closes them, so it is taken only now and then). */
		if (o != OP_OPEN && o < OP_LSTAT && !any_used())
			o = OP_OPEN;
		if (o == OP_OPEN && pick_free() < 0)
			o = OP_CLOSE;
		if ((int)rnd(1000) < p->remount_pm)
			o = OP_REMOUNT;
		run_op(o);
	}
	D.op = D.nops;
	close_all();
	drop_all_maps();
	logop("final comparison, every file closed");
	trace_current();
	tree_compare("at the end");
	logop("final remount");
	trace_current();
	D.in_remount = true;
	remount(false);
	D.in_remount = false;
	tree_compare("at the end, after a remount");
}

/* ---- fixture ------------------------------------------------------------ */

/*
 * The oracle must be ext4. /tmp is ext4 on the machines this runs on; where
 * it is not, a small ext4 image is made and loop-mounted for the test.
 */
static void diff_setup(void)
{
	struct statfs sf;

	fm_setup();
	/* FERRY_DIFF_NO_RECONCILER=1: ferry-mountd commits at close itself
	 * (a mode CI does not run; for local campaigns). */
	if (env_long("FERRY_DIFF_NO_RECONCILER", 0)) {
		fm.no_reconciler = true;
		remount(false);
	}
	memset(&D, 0, sizeof(D));
	snprintf(D.root[ORACLE], PATH_MAX, "%s", sp("oracle"));
	snprintf(D.root[FERRY], PATH_MAX, "%s", fm.mnt);
	cr_assert(mkdir(D.root[ORACLE], 0755) == 0, "mkdir %s: %s", D.root[ORACLE], strerror(errno));
	cr_assert(statfs(D.root[ORACLE], &sf) == 0, "statfs %s: %s", D.root[ORACLE], strerror(errno));
	if (sf.f_type != EXT4_MAGIC) {
		const char *img = sp("oracle.img");
		const char *mkfs[] = { "/sbin/mkfs.ext4", "-q", "-F", img, "1G", NULL };
		const char *mnt[] = { "/bin/mount", "-o", "loop", img, D.root[ORACLE], NULL };

		cr_assert(fm_run(mkfs, NULL, NULL, 120) == 0, "mkfs.ext4 %s failed (see %s)", img,
			  fm.log);
		cr_assert(fm_run(mnt, NULL, NULL, 60) == 0, "mount -o loop %s failed (see %s)", img,
			  fm.log);
		D.loop_mounted = true;
		cr_assert(statfs(D.root[ORACLE], &sf) == 0 && sf.f_type == EXT4_MAGIC,
			  "%s is not ext4 after mounting the image", D.root[ORACLE]);
	}
	signal(SIGBUS, on_sigbus);
	D.wbuf = malloc(MAX_BIG);
	for (int side = 0; side < 2; side++) {
		D.rbuf[side] = malloc(MAX_BIG);
		D.cbuf[side] = malloc(MiB);
	}
	cr_assert(D.wbuf && D.rbuf[0] && D.rbuf[1] && D.cbuf[0] && D.cbuf[1], "malloc");
}

static void diff_teardown(void)
{
	/* A remount that failed asserted in the fixture, without the seed and
	 * the operations that led there: print them now. */
	if (D.in_remount) {
		long from = D.nlog > LOG_LINES ? D.nlog - LOG_LINES : 0;

		fprintf(stderr, "\n=== differential/%s: the remount at op #%ld failed (seed 0x%llx); "
			"last operations:\n", D.p ? D.p->name : "?", D.op, (unsigned long long)D.seed);
		for (long i = from; i < D.nlog; i++)
			fprintf(stderr, "  %s\n", D.log[i % LOG_LINES]);
		D.in_remount = false;
	}
	for (int m = 0; m < NMAP; m++) {
		if (D.map[m].used) {
			munmap(D.map[m].addr[ORACLE], D.map[m].len);
			munmap(D.map[m].addr[FERRY], D.map[m].len);
			close(D.map[m].ofd);
			D.map[m].used = false;
		}
	}
	for (int s = 0; s < NSLOT; s++) {
		if (D.slot[s].used) {
			close(D.slot[s].fd[ORACLE]);
			close(D.slot[s].fd[FERRY]);
			D.slot[s].used = false;
		}
	}
	if (D.loop_mounted) {
		/* mount -o loop sets autoclear: the loop device goes with it */
		if (umount2(D.root[ORACLE], 0) != 0)
			umount2(D.root[ORACLE], MNT_DETACH);
		D.loop_mounted = false;
	}
	free(D.wbuf);
	for (int side = 0; side < 2; side++) {
		free(D.rbuf[side]);
		free(D.cbuf[side]);
	}
	signal(SIGBUS, SIG_DFL);
	fm_teardown();
}

/* Per-test time limit: the default campaign takes well under a minute. */
TestSuite(differential, .init = diff_setup, .fini = diff_teardown, .timeout = 280);

/* ---- the profiles ------------------------------------------------------- */

/* Everything, evenly. */
static const struct profile mixed = {
	.name = "mixed", .seed = 0x6d697865,
	.w = { [OP_OPEN] = 10, [OP_CLOSE] = 6, [OP_REOPEN] = 4, [OP_WRITE] = 10, [OP_PWRITE] = 10,
	       [OP_READ] = 6, [OP_PREAD] = 6, [OP_LSEEK] = 3, [OP_SEEK_DATA_HOLE] = 3,
	       [OP_FTRUNCATE] = 4, [OP_TRUNCATE] = 2, [OP_FSYNC] = 2, [OP_FALLOCATE] = 2,
	       [OP_FSTAT] = 3, [OP_LSTAT] = 2, [OP_UNLINK] = 4, [OP_RENAME] = 4, [OP_RENAME2] = 2,
	       [OP_LINK] = 2, [OP_MKDIR] = 2, [OP_RMDIR] = 2, [OP_CHMOD] = 1, [OP_MMAP_WRITE] = 3,
	       [OP_MMAP_READ] = 2, [OP_TREE] = 2, [OP_SYMLINK] = 1, [OP_XATTR] = 2,
	       [OP_COPY_RANGE] = 2, [OP_READDIR_FD] = 1, [OP_DROP_CACHE] = 2, [OP_REOPEN_FD] = 2,
	       [OP_LINK_FD] = 1, [OP_FCHMOD] = 1, [OP_MAP_NEW] = 1, [OP_MAP_STORE] = 2,
	       [OP_MAP_LOAD] = 2, [OP_MAP_SYNC] = 1, [OP_MAP_DROP] = 1 },
	.trunc_pct = 20, .far_pct = 3, .remount_pm = 1,
};

/*
 * Files unlinked, renamed over and linked while other fds hold them open,
 * then written and read through those fds; O_TRUNC opens (also O_RDONLY)
 * of files that are open elsewhere; close and reopen.
 */
static const struct profile unlinked_open = {
	.name = "unlinked_open", .seed = 0x756e6c6b,
	.w = { [OP_OPEN] = 14, [OP_CLOSE] = 5, [OP_REOPEN] = 6, [OP_WRITE] = 10, [OP_PWRITE] = 10,
	       [OP_READ] = 6, [OP_PREAD] = 8, [OP_LSEEK] = 2, [OP_SEEK_DATA_HOLE] = 1,
	       [OP_FTRUNCATE] = 3, [OP_TRUNCATE] = 2, [OP_FSYNC] = 2, [OP_FALLOCATE] = 1,
	       [OP_FSTAT] = 4, [OP_LSTAT] = 1, [OP_UNLINK] = 8, [OP_RENAME] = 7, [OP_RENAME2] = 3,
	       [OP_LINK] = 5, [OP_MKDIR] = 1, [OP_RMDIR] = 1, [OP_MMAP_WRITE] = 2,
	       [OP_MMAP_READ] = 1, [OP_TREE] = 2, [OP_XATTR] = 1, [OP_COPY_RANGE] = 1,
	       [OP_DROP_CACHE] = 2, [OP_REOPEN_FD] = 5, [OP_LINK_FD] = 3, [OP_FCHMOD] = 1,
	       [OP_MAP_NEW] = 2, [OP_MAP_STORE] = 3, [OP_MAP_LOAD] = 3, [OP_MAP_SYNC] = 1,
	       [OP_MAP_DROP] = 1 },
	.trunc_pct = 35, .far_pct = 1, .remount_pm = 1,
};

/* Data at piece, block and chunk boundaries: sparse writes, truncates,
 * holes, mmap and fallocate, with fsyncs between. */
static const struct profile boundaries = {
	.name = "boundaries", .seed = 0x626f756e,
	.w = { [OP_OPEN] = 8, [OP_CLOSE] = 4, [OP_REOPEN] = 4, [OP_WRITE] = 12, [OP_PWRITE] = 14,
	       [OP_READ] = 5, [OP_PREAD] = 10, [OP_LSEEK] = 3, [OP_SEEK_DATA_HOLE] = 6,
	       [OP_FTRUNCATE] = 6, [OP_TRUNCATE] = 3, [OP_FSYNC] = 4, [OP_FALLOCATE] = 4,
	       [OP_FSTAT] = 3, [OP_LSTAT] = 1, [OP_UNLINK] = 1, [OP_RENAME] = 1, [OP_LINK] = 1,
	       [OP_MMAP_WRITE] = 5, [OP_MMAP_READ] = 4, [OP_TREE] = 2, [OP_COPY_RANGE] = 3,
	       [OP_DROP_CACHE] = 3, [OP_REOPEN_FD] = 1, [OP_MAP_NEW] = 2, [OP_MAP_STORE] = 4,
	       [OP_MAP_LOAD] = 4, [OP_MAP_SYNC] = 2, [OP_MAP_DROP] = 1 },
	.trunc_pct = 15, .far_pct = 8, .remount_pm = 1,
};

/* Directories, symlinks, renames and links over every name, xattrs, and
 * remounts in the middle (a remount closes every fd first). */
static const struct profile namespace_remount = {
	.name = "namespace_remount", .seed = 0x6e616d65,
	.w = { [OP_OPEN] = 10, [OP_CLOSE] = 6, [OP_REOPEN] = 3, [OP_WRITE] = 6, [OP_PWRITE] = 6,
	       [OP_READ] = 4, [OP_PREAD] = 4, [OP_LSEEK] = 1, [OP_SEEK_DATA_HOLE] = 1,
	       [OP_FTRUNCATE] = 2, [OP_TRUNCATE] = 2, [OP_FSYNC] = 1, [OP_FALLOCATE] = 1,
	       [OP_FSTAT] = 3, [OP_LSTAT] = 3, [OP_UNLINK] = 6, [OP_RENAME] = 8, [OP_RENAME2] = 4,
	       [OP_LINK] = 5, [OP_MKDIR] = 6, [OP_RMDIR] = 5, [OP_CHMOD] = 2, [OP_MMAP_WRITE] = 1,
	       [OP_MMAP_READ] = 1, [OP_TREE] = 3, [OP_SYMLINK] = 3, [OP_XATTR] = 4,
	       [OP_READDIR_FD] = 3, [OP_REOPEN_FD] = 2, [OP_LINK_FD] = 3, [OP_FCHMOD] = 2,
	       [OP_MAP_NEW] = 1, [OP_MAP_STORE] = 1, [OP_MAP_LOAD] = 1, [OP_MAP_DROP] = 1 },
	.trunc_pct = 20, .far_pct = 1, .remount_pm = 5,
};

/*
 * The namespace mix on a mount whose kernel caches no name (attr_timeout=0):
 * every path walk asks ferry-mountd, so its own answers for absent names
 * (meta_names.h: directories made by this mount) are what the oracle's are
 * compared with, through creates, renames, links and removals.
 */
static const struct profile namespace_uncached = {
	.name = "namespace_uncached", .seed = 0x6e6f6361,
	.w = { [OP_OPEN] = 10, [OP_CLOSE] = 6, [OP_REOPEN] = 3, [OP_WRITE] = 4, [OP_PWRITE] = 2,
	       [OP_READ] = 2, [OP_PREAD] = 2, [OP_FTRUNCATE] = 1, [OP_TRUNCATE] = 2,
	       [OP_FSTAT] = 3, [OP_LSTAT] = 8, [OP_UNLINK] = 8, [OP_RENAME] = 10, [OP_RENAME2] = 5,
	       [OP_LINK] = 6, [OP_MKDIR] = 8, [OP_RMDIR] = 6, [OP_CHMOD] = 1, [OP_TREE] = 4,
	       [OP_SYMLINK] = 3, [OP_XATTR] = 1, [OP_READDIR_FD] = 2, [OP_REOPEN_FD] = 2,
	       [OP_LINK_FD] = 3 },
	.trunc_pct = 20, .far_pct = 1, .remount_pm = 2, .mount_opts = "attr_timeout=0",
};

static void campaign(const struct profile *p)
{
	if (p->mount_opts) {
		/* Each test runs in a process of its own: the environment
		 * holds the options for every remount of this campaign. */
		const char *env = getenv("FERRY_IT_MOUNT_OPTIONS");
		char all[512];

		snprintf(all, sizeof(all), "%s%s%s", env && *env ? env : "",
			 env && *env ? "," : "", p->mount_opts);
		setenv("FERRY_IT_MOUNT_OPTIONS", all, 1);
		remount(false);
	}
	run_campaign(p);
}

Test(differential, mixed) { campaign(&mixed); }
Test(differential, unlinked_open) { campaign(&unlinked_open); }
Test(differential, boundaries) { campaign(&boundaries); }
Test(differential, namespace_remount) { campaign(&namespace_remount); }
Test(differential, namespace_uncached) { campaign(&namespace_uncached); }

/*
 * Discrepancies the campaigns found, each as a fixed sequence run on both
 * sides, so that a failure names the bug instead of a random seed.
 */

/* The first byte of a file read through a new open, or -1. */
static int first_byte(const char *path)
{
	unsigned char c;
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	ssize_t n = fd >= 0 ? pread(fd, &c, 1, 0) : -1;

	if (fd >= 0)
		close(fd);
	return n == 1 ? c : -1;
}

/*
 * A MAP_SHARED mapping outlives close() of its fd, and stores through it
 * afterwards reach the file (POSIX mmap: the mapping holds its own
 * reference to the file). On ext4 they do; on ferryfs with passthrough, a
 * store made after the closed file's upload committed goes to the retired
 * staging file and is lost: readers, and the file after a remount, keep
 * the old bytes.
 */
Test(differential, mmap_store_after_close_reaches_file)
{
	static char buf[8192];
	int got[2][2];

	memset(buf, 'a', sizeof(buf));
	for (int side = 0; side < 2; side++) {
		const char *path = P(side, "mapped");
		int fd = OK(open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
		char *m;

		fm_pwrite_all(fd, buf, sizeof(buf), 0);
		m = mmap(NULL, sizeof(buf), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
		cr_assert(m != MAP_FAILED, "%s: mmap: %s", side_name(side), strerror(errno));
		OK(close(fd));
		/* an open waits for the commit of the last close's upload */
		OK(close(OK(open(path, O_RDONLY | O_CLOEXEC))));
		memset(m, 'B', 4096);
		OK(msync(m, sizeof(buf), MS_SYNC));
		OK(munmap(m, sizeof(buf)));
		got[side][0] = first_byte(path);
	}
	remount(false);
	for (int side = 0; side < 2; side++)
		got[side][1] = first_byte(P(side, "mapped"));
	cr_assert_eq(got[ORACLE][0], 'B', "ext4 oracle: the store did not reach the file");
	cr_expect_eq(got[FERRY][0], 'B',
		     "MISMATCH mmap store after close: ferryfs reads '%c' where ext4 reads 'B' "
		     "(stored through a mapping whose fd was closed and committed)", got[FERRY][0]);
	cr_expect_eq(got[FERRY][1], 'B',
		     "MISMATCH mmap store after close: after a remount ferryfs has '%c', ext4 'B'",
		     got[FERRY][1]);
}

/*
 * SEEK_DATA/SEEK_HOLE must count bytes stored through a MAP_SHARED mapping
 * that are not msync'ed yet: they are the file's contents already (reads
 * return them), and copy tools that follow SEEK_DATA would skip them. ext4
 * does; on ferryfs a file served through ferry-mountd (passthrough=off, or
 * with passthrough a file that was not empty when opened for writing)
 * answers from what the daemon has, which lacks the kernel's dirty pages.
 */
Test(differential, seek_data_hole_see_unsynced_mmap_stores)
{
	off_t data[2], hole[2];
	int data_err[2];

	for (int side = 0; side < 2; side++) {
		const char *path = P(side, "sparse");
		int fd = OK(open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
		char *m;

		/* not empty when opened again below: the daemon path on ferryfs */
		fm_pwrite_all(fd, "y", 1, 0);
		OK(ftruncate(fd, MiB));
		OK(close(fd));
		fd = OK(open(path, O_RDWR | O_CLOEXEC));
		m = mmap(NULL, MiB, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
		cr_assert(m != MAP_FAILED, "%s: mmap: %s", side_name(side), strerror(errno));
		memset(m + 64 * KiB, 'x', 4096);
		data[side] = lseek(fd, 4096, SEEK_DATA);
		data_err[side] = errno;
		hole[side] = lseek(fd, 64 * KiB, SEEK_HOLE);
		OK(munmap(m, MiB));
		OK(close(fd));
	}
	cr_assert(data[ORACLE] >= 4096 && data[ORACLE] <= 64 * KiB && hole[ORACLE] > 64 * KiB,
		  "ext4 oracle: SEEK_DATA %lld, SEEK_HOLE %lld", (long long)data[ORACLE],
		  (long long)hole[ORACLE]);
	cr_expect(data[FERRY] >= 4096 && data[FERRY] <= 64 * KiB,
		  "MISMATCH SEEK_DATA over unsynced mmap stores: ferryfs returns %lld (%s), skipping "
		  "the bytes stored at 64 KiB; ext4 returns %lld", (long long)data[FERRY],
		  data[FERRY] < 0 ? fm_errname(data_err[FERRY]) : "-", (long long)data[ORACLE]);
	cr_expect(hole[FERRY] > 64 * KiB,
		  "MISMATCH SEEK_HOLE over unsynced mmap stores: ferryfs reports a hole at %lld, "
		  "over the bytes stored there; ext4 returns %lld", (long long)hole[FERRY],
		  (long long)hole[ORACLE]);
}

/*
 * The other direction of the same thing: a mapping kept after close() sees
 * what is written to the file later through another open (one page cache
 * on ext4). On ferryfs with passthrough it keeps showing the retired
 * staging file; where the file grew since, loads and stores past the
 * staging file's old end even fault (SIGBUS).
 */
Test(differential, mmap_after_close_sees_later_writes)
{
	static char buf[8192];
	int got[2];

	memset(buf, 'a', sizeof(buf));
	for (int side = 0; side < 2; side++) {
		const char *path = P(side, "mapped");
		int fd = OK(open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
		char *m;

		fm_pwrite_all(fd, buf, sizeof(buf), 0);
		m = mmap(NULL, sizeof(buf), PROT_READ, MAP_SHARED, fd, 0);
		cr_assert(m != MAP_FAILED, "%s: mmap: %s", side_name(side), strerror(errno));
		OK(close(fd));
		OK(close(OK(open(path, O_RDONLY | O_CLOEXEC))));
		fd = OK(open(path, O_WRONLY | O_CLOEXEC));
		fm_pwrite_all(fd, "C", 1, 0);
		OK(close(fd));
		got[side] = (unsigned char)m[0];
		OK(munmap(m, sizeof(buf)));
	}
	cr_assert_eq(got[ORACLE], 'C', "ext4 oracle: the mapping did not see the write");
	cr_expect_eq(got[FERRY], 'C',
		     "MISMATCH mmap after close: the mapping shows '%c' on ferryfs where ext4 shows "
		     "'C', written through a later open", got[FERRY]);
}
