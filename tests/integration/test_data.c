/*
 * Data integrity through a real ferryfs mount: random writes, overwrites,
 * truncates and punched holes checked against a model file on local disk,
 * files beyond 4 GiB, mmap MAP_SHARED, several handles on one inode,
 * unlinked-but-open files, fsync durability across a killed ferry-mountd,
 * and remounts (with an empty read cache) that must read back every byte
 * and every attribute.
 *
 * FERRY_IT_SEED=N in the environment changes the random seed.
 */
#include "mount_util.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/falloc.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

TestSuite(data, .init = fm_setup, .fini = fm_teardown, .timeout = 240);

#define KiB (1024LL)
#define MiB (1024LL * 1024)
#define GiB (1024LL * 1024 * 1024)

static uint64_t seed_for(uint64_t salt)
{
	const char *env = getenv("FERRY_IT_SEED");
	uint64_t s = env ? strtoull(env, NULL, 0) : 0x5eed2024ULL;

	s ^= salt * 0x9E3779B97F4A7C15ULL;
	return s ? s : 1;
}

static struct stat fst(int fd)
{
	struct stat st;

	OK(fstat(fd, &st));
	return st;
}

static struct stat lst(const char *path)
{
	struct stat st;

	OK(lstat(path, &st));
	return st;
}

/* Drops the page cache of an open file so the next read goes to mountd. */
static void drop_cache(int fd)
{
	OK(posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED));
}

/* ---- random operations against a model -------------------------------- */

struct oplog {
	char line[32][128];
	int n;
};

static void logop(struct oplog *l, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void logop(struct oplog *l, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(l->line[l->n % 32], sizeof(l->line[0]), fmt, ap);
	va_end(ap);
	l->n++;
}

static void dump_log(const struct oplog *l)
{
	int from = l->n > 32 ? l->n - 32 : 0;

	for (int i = from; i < l->n; i++)
		cr_log_info("op %d: %s", i, l->line[i % 32]);
}

/* First offset where the files at a and b differ, -1 if identical,
 * -2 if their sizes differ. */
static long long first_diff(int fa, int fb)
{
	static char ba[1 << 20], bb[1 << 20];
	struct stat sa = fst(fa), sb = fst(fb);

	if (sa.st_size != sb.st_size)
		return -2;
	for (off_t off = 0; off < sa.st_size; off += (off_t)sizeof(ba)) {
		size_t len = (size_t)(sa.st_size - off) < sizeof(ba) ? (size_t)(sa.st_size - off)
								       : sizeof(ba);

		fm_pread_all(fa, ba, len, off);
		fm_pread_all(fb, bb, len, off);
		if (memcmp(ba, bb, len)) {
			size_t i = 0;

			while (ba[i] == bb[i])
				i++;
			return (long long)off + (long long)i;
		}
	}
	return -1;
}

static void check_same(int ffd, int mfd, const struct oplog *l, const char *when)
{
	long long d = first_diff(ffd, mfd);

	if (d == -1)
		return;
	dump_log(l);
	if (d == -2)
		cr_assert_fail("%s: size %lld, model %lld (seed 0x%llx, last ops above)", when,
			       (long long)fst(ffd).st_size, (long long)fst(mfd).st_size,
			       (unsigned long long)seed_for(1));
	cr_assert_fail("%s: content differs from the model at offset %lld (last ops above)",
		       when, d);
}

/* An offset in the interesting ranges: the first 24 MiB (six 4 MiB blocks)
 * or around the 64 MiB chunk boundary. */
static off_t pick_off(uint64_t *rs)
{
	uint64_t r = fm_rand(rs);

	switch (r % 8) {
	case 0: /* straddle a 4 MiB block boundary */
		return (off_t)((1 + fm_rand(rs) % 5) * 4 * MiB) - (off_t)(fm_rand(rs) % (64 * KiB));
	case 1: /* around the chunk boundary */
		return 64 * MiB - 2 * MiB + (off_t)(fm_rand(rs) % (4 * MiB));
	default:
		return (off_t)(fm_rand(rs) % (24 * MiB));
	}
}

static size_t pick_len(uint64_t *rs)
{
	uint64_t r = fm_rand(rs);

	switch (r % 6) {
	case 0:
		return 1 + fm_rand(rs) % 16;
	case 1:
		return (size_t)(1 * MiB + fm_rand(rs) % (3 * MiB)); /* big */
	default:
		return 1 + fm_rand(rs) % (128 * KiB);
	}
}

Test(data, random_ops_match_model)
{
	static char buf[4 * MiB], got[4 * MiB], want[4 * MiB];
	struct oplog *l = calloc(1, sizeof(*l));
	uint64_t rs = seed_for(1);
	char *fpath = strdup(mp("model-file")), *mpath = strdup(sp("model"));
	int ffd, mfd;
	const int nops = 1200;

	cr_log_info("seed 0x%llx", (unsigned long long)rs);
	ffd = OK(open(fpath, O_CREAT | O_RDWR, 0644));
	mfd = OK(open(mpath, O_CREAT | O_RDWR, 0644));
	for (int i = 0; i < nops; i++) {
		uint64_t r = fm_rand(&rs) % 100;
		off_t size = fst(mfd).st_size;

		if (r < 40) {
			off_t off = pick_off(&rs);
			size_t len = pick_len(&rs);

			fm_fill_random(&rs, buf, len);
			logop(l, "pwrite off=%lld len=%zu", (long long)off, len);
			fm_pwrite_all(ffd, buf, len, off);
			fm_pwrite_all(mfd, buf, len, off);
		} else if (r < 50) {
			off_t ns = fm_rand(&rs) % 3 == 0 ? pick_off(&rs)
							  : (off_t)(fm_rand(&rs) % (size + 1));

			logop(l, "ftruncate %lld (was %lld)", (long long)ns, (long long)size);
			OK(ftruncate(ffd, ns));
			OK(ftruncate(mfd, ns));
		} else if (r < 60 && size > 0) {
			off_t off = (off_t)(fm_rand(&rs) % (uint64_t)size);
			off_t len = 1 + (off_t)(fm_rand(&rs) % (uint64_t)(2 * MiB));

			logop(l, "punch off=%lld len=%lld", (long long)off, (long long)len);
			OK(fallocate(ffd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, off, len));
			OK(fallocate(mfd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, off, len));
		} else if (r < 64) {
			off_t off = pick_off(&rs);
			off_t len = 1 + (off_t)(fm_rand(&rs) % MiB);

			logop(l, "fallocate off=%lld len=%lld", (long long)off, (long long)len);
			OK(fallocate(ffd, 0, off, len));
			OK(fallocate(mfd, 0, off, len));
		} else if (r < 74) {
			/* close and reopen: the commit path */
			logop(l, "close+reopen");
			OK(close(ffd));
			ffd = OK(open(fpath, O_RDWR));
			if (fm_rand(&rs) % 2)
				drop_cache(ffd);
		} else if (r < 78) {
			logop(l, "fsync");
			OK(fsync(ffd));
		} else if (r < 80) {
			/* an O_TRUNC reopen */
			logop(l, "reopen O_TRUNC");
			OK(close(ffd));
			ffd = OK(open(fpath, O_RDWR | O_TRUNC));
			OK(ftruncate(mfd, 0));
		} else {
			off_t off = size ? (off_t)(fm_rand(&rs) % (uint64_t)size) : 0;
			size_t len = 1 + fm_rand(&rs) % sizeof(got);
			ssize_t a, b;

			a = pread(ffd, got, len, off);
			b = pread(mfd, want, len, off);
			if (a != b || (a > 0 && memcmp(got, want, (size_t)a))) {
				dump_log(l);
				cr_assert_fail("op %d: pread(%zu at %lld) returned %zd bytes, model %zd, "
					       "or the bytes differ", i, len, (long long)off, a, b);
			}
		}
		if (i % 100 == 99) {
			char when[64];

			snprintf(when, sizeof(when), "after op %d", i);
			check_same(ffd, mfd, l, when);
		}
	}
	check_same(ffd, mfd, l, "at the end, file open");
	OK(close(ffd));
	ffd = OK(open(fpath, O_RDONLY));
	check_same(ffd, mfd, l, "after close and reopen");
	OK(close(ffd));

	fm_remount_cold();
	ffd = OK(open(fpath, O_RDONLY));
	check_same(ffd, mfd, l, "after a remount with an empty cache");
	OK(close(ffd));
	OK(close(mfd));
	free(l);
	free(fpath);
	free(mpath);
}

Test(data, overlapping_overwrites_across_blocks)
{
	static char model[12 * MiB];
	uint64_t rs = seed_for(2);
	int fd;

	/* a base of 12 MiB, then many overwrites of different sizes in
	 * separate opens, each leaving a new slice over the old ones */
	fm_fill_random(&rs, model, sizeof(model));
	fm_write_file(mp("f"), model, sizeof(model));
	for (int round = 0; round < 40; round++) {
		off_t off = (off_t)(fm_rand(&rs) % (sizeof(model) - 1));
		size_t len = 1 + fm_rand(&rs) % (round % 4 == 0 ? 3 * MiB : 8 * KiB);

		if (off + (off_t)len > (off_t)sizeof(model))
			len = sizeof(model) - (size_t)off;
		fm_fill_random(&rs, model + off, len);
		fd = OK(open(mp("f"), O_WRONLY));
		fm_pwrite_all(fd, model + off, len, off);
		OK(close(fd));
	}
	/* byte writes right at the block edges */
	fd = OK(open(mp("f"), O_WRONLY));
	for (int b = 1; b < 3; b++) {
		off_t edge = b * 4 * MiB;

		for (off_t o = edge - 2; o <= edge + 1; o++) {
			model[o] = (char)(0xA0 + (o - edge));
			fm_pwrite_all(fd, model + o, 1, o);
		}
	}
	OK(close(fd));
	fm_write_file(sp("model"), model, sizeof(model));
	fm_assert_same_content(mp("f"), sp("model"));
	fm_remount_cold();
	fm_assert_same_content(mp("f"), sp("model"));
}

Test(data, beyond_4GiB_sparse)
{
	static char a[8192], b[MiB], got[MiB], zero[MiB];
	uint64_t rs = seed_for(3);
	const off_t off_a = 4 * GiB - 4096, off_b = 5 * GiB + 12345, size = 6 * GiB;
	int fd;

	fm_fill_random(&rs, a, sizeof(a));
	fm_fill_random(&rs, b, sizeof(b));
	fd = OK(open(mp("big"), O_CREAT | O_RDWR, 0644));
	fm_pwrite_all(fd, "head", 4, 0);
	fm_pwrite_all(fd, a, sizeof(a), off_a); /* straddles 2^32 */
	fm_pwrite_all(fd, b, sizeof(b), off_b);
	fm_pwrite_all(fd, "tail", 4, size - 4);
	cr_assert_eq(fst(fd).st_size, size, "size %lld", (long long)fst(fd).st_size);
	OK(close(fd));

	for (int pass = 0; pass < 2; pass++) {
		fd = OK(open(mp("big"), O_RDONLY));
		cr_assert_eq(fst(fd).st_size, size, "pass %d: size %lld", pass,
			     (long long)fst(fd).st_size);
		drop_cache(fd);
		fm_pread_all(fd, got, 4, 0);
		cr_assert(memcmp(got, "head", 4) == 0, "pass %d: head", pass);
		fm_pread_all(fd, got, sizeof(a), off_a);
		cr_assert(memcmp(got, a, sizeof(a)) == 0, "pass %d: data across 4 GiB differs", pass);
		fm_pread_all(fd, got, sizeof(b), off_b);
		cr_assert(memcmp(got, b, sizeof(b)) == 0, "pass %d: data at 5 GiB differs", pass);
		fm_pread_all(fd, got, 4, size - 4);
		cr_assert(memcmp(got, "tail", 4) == 0, "pass %d: tail", pass);
		/* holes, including one right after 4 GiB and one in a later chunk */
		fm_pread_all(fd, got, MiB, 2 * GiB);
		cr_assert(memcmp(got, zero, MiB) == 0, "pass %d: hole at 2 GiB", pass);
		fm_pread_all(fd, got, MiB, 4 * GiB + 4096);
		cr_assert(memcmp(got, zero, MiB) == 0, "pass %d: hole after 4 GiB", pass);
		fm_pread_all(fd, got, MiB, off_b - (off_t)MiB);
		cr_assert(memcmp(got, zero, MiB) == 0, "pass %d: hole before 5 GiB", pass);
		cr_assert_eq(OK(pread(fd, got, 16, size)), 0, "pass %d: read at EOF", pass);
		OK(close(fd));
		if (pass == 0)
			fm_remount_cold();
	}

	/* truncate inside the high region, then grow again: zeros, not old data */
	OK(truncate(mp("big"), off_b + 100));
	OK(truncate(mp("big"), off_b + (off_t)MiB));
	fd = OK(open(mp("big"), O_RDWR));
	fm_pread_all(fd, got, MiB, off_b);
	cr_assert(memcmp(got, b, 100) == 0, "kept part of the 5 GiB data differs");
	cr_assert(memcmp(got + 100, zero, MiB - 100) == 0, "truncated data came back");
	/* and a write just past 4 GiB on the open file */
	fm_pwrite_all(fd, "4G+1", 4, 4 * GiB + 1);
	OK(close(fd));
	fm_remount_cold();
	fd = OK(open(mp("big"), O_RDONLY));
	cr_assert_eq(fst(fd).st_size, off_b + (off_t)MiB);
	fm_pread_all(fd, got, 4, 4 * GiB + 1);
	cr_assert(memcmp(got, "4G+1", 4) == 0);
	fm_pread_all(fd, got, MiB, off_b);
	cr_assert(memcmp(got, b, 100) == 0 && memcmp(got + 100, zero, MiB - 100) == 0,
		  "after remount: region at 5 GiB differs");
	OK(close(fd));
}

Test(data, mmap_shared_write_then_read)
{
	const size_t size = 8 * MiB + 123;
	char *model = malloc(size), *map;
	uint64_t rs = seed_for(4);
	int fd;

	fd = OK(open(mp("m"), O_CREAT | O_RDWR, 0644));
	OK(ftruncate(fd, (off_t)size));
	map = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	cr_assert(map != MAP_FAILED, "mmap: %s", strerror(errno));
	memset(model, 0, size);
	/* scattered stores, then a full fill of one block */
	for (int i = 0; i < 2000; i++) {
		size_t off = fm_rand(&rs) % size;

		model[off] = map[off] = (char)fm_rand(&rs);
	}
	fm_fill_random(&rs, model + 4 * MiB, 4 * MiB);
	memcpy(map + 4 * MiB, model + 4 * MiB, 4 * MiB);
	OK(msync(map, size, MS_SYNC));
	/* read() on another fd sees the stores while mapped */
	{
		int rfd = OK(open(mp("m"), O_RDONLY));
		char *got = malloc(size);

		fm_pread_all(rfd, got, size, 0);
		cr_assert(memcmp(got, model, size) == 0, "read() does not see the mmap stores");
		free(got);
		OK(close(rfd));
	}
	OK(munmap(map, size));
	OK(close(fd));
	cr_assert_eq(lst(mp("m")).st_size, (off_t)size);
	fm_write_file(sp("model"), model, size);
	fm_assert_same_content(mp("m"), sp("model"));
	fm_remount_cold();
	fm_assert_same_content(mp("m"), sp("model"));
	free(model);
}

Test(data, mmap_shared_read_and_coherence)
{
	const size_t size = 5 * MiB + 7;
	char *model = malloc(size), *map;
	uint64_t rs = seed_for(5);
	int fd, wfd;

	fm_fill_random(&rs, model, size);
	fm_write_file(mp("r"), model, size);
	fm_remount_cold();
	fd = OK(open(mp("r"), O_RDONLY));
	map = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
	cr_assert(map != MAP_FAILED, "mmap: %s", strerror(errno));
	cr_assert(memcmp(map, model, size) == 0, "mapped content differs");
	/* a write through another fd shows in the mapping */
	wfd = OK(open(mp("r"), O_WRONLY));
	fm_pwrite_all(wfd, "COHERENT", 8, (off_t)MiB + 3);
	OK(close(wfd));
	cr_assert(memcmp(map + MiB + 3, "COHERENT", 8) == 0,
		  "a write() is not visible through a MAP_SHARED mapping");
	OK(munmap(map, size));
	OK(close(fd));

	/* mmap write into an existing (committed) file */
	fd = OK(open(mp("r"), O_RDWR));
	map = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	cr_assert(map != MAP_FAILED, "mmap: %s", strerror(errno));
	memcpy(model + MiB + 3, "COHERENT", 8);
	memcpy(map + size - 5, "END!!", 5);
	memcpy(model + size - 5, "END!!", 5);
	memcpy(map + 10, "start", 5);
	memcpy(model + 10, "start", 5);
	OK(munmap(map, size)); /* no msync: munmap + close must be enough */
	OK(close(fd));
	fm_write_file(sp("model"), model, size);
	fm_assert_same_content(mp("r"), sp("model"));
	fm_remount_cold();
	fm_assert_same_content(mp("r"), sp("model"));
	free(model);
}

/* ---- several handles on one inode ------------------------------------- */

Test(data, readers_see_writers_bytes)
{
	char got[16];
	int w, r, r0;

	/* reader opened before the writer */
	r0 = OK(open(mp("f"), O_CREAT | O_RDONLY, 0644));
	w = OK(open(mp("f"), O_WRONLY));
	fm_pwrite_all(w, "abc", 3, 0);
	cr_assert_eq(OK(pread(r0, got, sizeof(got), 0)), 3, "reader opened first sees %lld bytes",
		     (long long)fst(r0).st_size);
	cr_assert(memcmp(got, "abc", 3) == 0);
	/* reader opened while the writer is open */
	r = OK(open(mp("f"), O_RDONLY));
	cr_assert_eq(OK(pread(r, got, sizeof(got), 0)), 3);
	cr_assert(memcmp(got, "abc", 3) == 0);
	cr_assert_eq(fst(r).st_size, 3);
	cr_assert_eq(lst(mp("f")).st_size, 3, "stat size while a writer is open");
	fm_pwrite_all(w, "defg", 4, 3);
	cr_assert_eq(OK(pread(r, got, sizeof(got), 0)), 7);
	cr_assert(memcmp(got, "abcdefg", 7) == 0);
	OK(close(w));
	cr_assert_eq(OK(pread(r, got, sizeof(got), 0)), 7);
	cr_assert(memcmp(got, "abcdefg", 7) == 0);
	OK(close(r));
	OK(close(r0));
}

Test(data, two_writers_one_file)
{
	static char a[2 * MiB], b[2 * MiB], model[4 * MiB];
	int w1, w2;

	memset(a, 'a', sizeof(a));
	memset(b, 'b', sizeof(b));
	/* the first writer gets an empty file, the second joins it */
	w1 = OK(open(mp("f"), O_CREAT | O_WRONLY, 0644));
	w2 = OK(open(mp("f"), O_WRONLY));
	fm_pwrite_all(w2, b, sizeof(b), 2 * MiB);
	fm_pwrite_all(w1, a, sizeof(a), 0);
	fm_pwrite_all(w2, "B", 1, 100);
	memcpy(model, a, sizeof(a));
	memcpy(model + 2 * MiB, b, sizeof(b));
	model[100] = 'B';
	/* closing the shorter writer last must not cut the file */
	OK(close(w2));
	OK(close(w1));
	cr_assert_eq(lst(mp("f")).st_size, 4 * MiB, "size %lld after both writers closed",
		     (long long)lst(mp("f")).st_size);
	fm_write_file(sp("model"), model, sizeof(model));
	fm_assert_same_content(mp("f"), sp("model"));

	/* a truncate by path while a writer is open */
	w1 = OK(open(mp("f"), O_WRONLY));
	OK(truncate(mp("f"), MiB));
	cr_assert_eq(fst(w1).st_size, MiB);
	fm_pwrite_all(w1, "after", 5, MiB + 10);
	OK(close(w1));
	memset(model + MiB, 0, 3 * MiB);
	memcpy(model + MiB + 10, "after", 5);
	fm_write_file(sp("model"), model, MiB + 15);
	fm_assert_same_content(mp("f"), sp("model"));
	fm_remount_cold();
	fm_assert_same_content(mp("f"), sp("model"));
}

/* ---- unlinked but open ----------------------------------------------- */

Test(data, unlinked_but_open)
{
	static char data[10000], got[20000];
	struct stat st;
	int fd, fd2, nfd;

	for (size_t i = 0; i < sizeof(data); i++)
		data[i] = (char)('0' + i % 10);
	fd = OK(open(mp("f"), O_CREAT | O_RDWR, 0644));
	fm_pwrite_all(fd, data, sizeof(data), 0);
	fd2 = OK(open(mp("f"), O_RDONLY));
	OK(unlink(mp("f")));
	FAILS(stat(mp("f"), &st), ENOENT);
	st = fst(fd);
	cr_assert_eq(st.st_nlink, 0, "nlink %lu after unlink", (unsigned long)st.st_nlink);
	cr_assert_eq(st.st_size, (off_t)sizeof(data));
	fm_pread_all(fd2, got, sizeof(data), 0);
	cr_assert(memcmp(got, data, sizeof(data)) == 0);
	/* still writable, truncatable, syncable */
	fm_pwrite_all(fd, "more", 4, sizeof(data));
	fm_pread_all(fd2, got, sizeof(data) + 4, 0);
	cr_assert(memcmp(got + sizeof(data), "more", 4) == 0);
	OK(fsync(fd));
	OK(ftruncate(fd, 5000));
	cr_assert_eq(fst(fd2).st_size, 5000);
	OK(fchmod(fd, 0600));
	cr_assert_eq(fst(fd2).st_mode & 07777, 0600);
	OK(fsetxattr(fd, "user.gone", "1", 1, 0));
	/* the name is free for a new file */
	nfd = OK(open(mp("f"), O_CREAT | O_EXCL | O_RDWR, 0644));
	fm_pwrite_all(nfd, "new", 3, 0);
	OK(close(nfd));
	fm_pread_all(fd, got, 5000, 0);
	cr_assert(memcmp(got, data, 5000) == 0, "unlinked file's data changed");
	{
		DIR *d = opendir(fm.mnt);
		struct dirent *de;
		int n = 0;

		while ((de = readdir(d)))
			n += strcmp(de->d_name, "f") == 0;
		closedir(d);
		cr_assert_eq(n, 1, "'f' listed %d times", n);
	}
	OK(close(fd));
	/* the last close is the other fd */
	fm_pread_all(fd2, got, 5000, 0);
	cr_assert(memcmp(got, data, 5000) == 0);
	OK(close(fd2));
	fm_remount_cold();
	{
		size_t len;
		char *c = fm_read_file(mp("f"), &len);

		cr_assert(len == 3 && memcmp(c, "new", 3) == 0, "the new 'f' has %zu bytes", len);
		free(c);
	}
}

Test(data, unlinked_and_replaced_committed_files_stay_readable)
{
	const size_t size = 6 * MiB + 5;
	char *model = malloc(size), *got = malloc(size);
	uint64_t rs = seed_for(6);
	int fd, fd2;

	/* committed data (closed, remounted), then unlinked while open:
	 * reads must still reach its objects */
	fm_fill_random(&rs, model, size);
	fm_write_file(mp("u"), model, size);
	fm_write_file(mp("victim"), model, size);
	fm_remount_cold();
	fd = OK(open(mp("u"), O_RDWR));
	OK(unlink(mp("u")));
	drop_cache(fd);
	fm_pread_all(fd, got, size, 0);
	cr_assert(memcmp(got, model, size) == 0, "unlinked committed file reads wrong bytes");
	fm_pwrite_all(fd, "X", 1, 4 * MiB);
	OK(fsync(fd));
	drop_cache(fd);
	fm_pread_all(fd, got, size, 0);
	model[4 * MiB] = 'X';
	cr_assert(memcmp(got, model, size) == 0, "unlinked file after write+fsync");
	OK(close(fd));

	/* replaced by rename while open */
	fd2 = OK(open(mp("victim"), O_RDONLY));
	fm_write_file(mp("other"), "other", 5);
	OK(rename(mp("other"), mp("victim")));
	drop_cache(fd2);
	fm_pread_all(fd2, got, size, 0);
	{
		char *orig = malloc(size);
		uint64_t rs2 = seed_for(6);

		fm_fill_random(&rs2, orig, size);
		cr_assert(memcmp(got, orig, size) == 0, "replaced file reads wrong bytes");
		free(orig);
	}
	OK(close(fd2));
	{
		size_t len;
		char *c = fm_read_file(mp("victim"), &len);

		cr_assert(len == 5 && memcmp(c, "other", 5) == 0);
		free(c);
	}
	free(model);
	free(got);
}

/* ---- durability --------------------------------------------------------- */

Test(data, fsync_survives_killed_mountd)
{
	const size_t size = 5 * MiB + 11;
	char *model = malloc(size);
	uint64_t rs = seed_for(7);
	int fd;

	fm_fill_random(&rs, model, size);
	OK(mkdir(mp("d"), 0755));
	fd = OK(open(mp("d/synced"), O_CREAT | O_WRONLY, 0640));
	fm_pwrite_all(fd, model, size, 0);
	OK(fsync(fd));
	OK(fsetxattr(fd, "user.k", "v", 1, 0));
	/* the open fd dies with the mount */
	fm_crash();
	close(fd);
	fm_mount();
	fm_write_file(sp("model"), model, size);
	fm_assert_same_content(mp("d/synced"), sp("model"));
	cr_assert_eq(lst(mp("d/synced")).st_mode & 07777, 0640);

	/* close() then fsync of the directory is durable too */
	fd = OK(open(mp("d/closed"), O_CREAT | O_WRONLY, 0644));
	fm_pwrite_all(fd, model, size, 0);
	OK(fsync(fd));
	OK(close(fd));
	fd = OK(open(mp("d"), O_RDONLY | O_DIRECTORY));
	OK(fsync(fd));
	OK(close(fd));
	fm_crash();
	fm_mount();
	fm_assert_same_content(mp("d/closed"), sp("model"));
	free(model);
}

/* ---- a whole tree across remounts -------------------------------------- */

struct entry {
	const char *name;
	struct stat st;
};

static const char *tree_names[] = {
	"tree",          "tree/sub",      "tree/empty",    "tree/one",      "tree/page",
	"tree/block",    "tree/block1",   "tree/nine",     "tree/sparse",   "tree/patched",
	"tree/link",     "tree/hard",     "tree/fifo",     "tree/chr",      "tree/sock",
	"tree/suid",     "tree/timed",    "tree/sub/deep", "tree/owned",
};
#define NTREE (sizeof(tree_names) / sizeof(tree_names[0]))

/* Model file of tree/a/b: DIR/model-a_b */
static const char *model_of(const char *rel)
{
	char name[PATH_MAX];

	snprintf(name, sizeof(name), "%s", strchr(rel, '/') + 1);
	for (char *p = name; *p; p++)
		if (*p == '/')
			*p = '_';
	return sp("model-%s", name);
}

static void make_random_file(const char *rel, size_t size, uint64_t *rs)
{
	char *buf = malloc(size ? size : 1);

	fm_fill_random(rs, buf, size);
	fm_write_file(mp("%s", rel), buf, size);
	fm_write_file(model_of(rel), buf, size);
	free(buf);
}

static void check_tree(const struct entry *saved, const char *when)
{
	char buf[4096];
	ssize_t n;

	for (size_t i = 0; i < NTREE; i++) {
		struct stat st = lst(mp("%s", saved[i].name));
		const struct stat *o = &saved[i].st;

		cr_assert_eq(st.st_ino, o->st_ino, "%s: %s: inode %lu, was %lu", when, saved[i].name,
			     (unsigned long)st.st_ino, (unsigned long)o->st_ino);
		cr_assert_eq(st.st_mode, o->st_mode, "%s: %s: mode %o, was %o", when, saved[i].name,
			     st.st_mode, o->st_mode);
		cr_assert_eq(st.st_uid, o->st_uid, "%s: %s: uid", when, saved[i].name);
		cr_assert_eq(st.st_gid, o->st_gid, "%s: %s: gid", when, saved[i].name);
		cr_assert_eq(st.st_nlink, o->st_nlink, "%s: %s: nlink %lu, was %lu", when,
			     saved[i].name, (unsigned long)st.st_nlink, (unsigned long)o->st_nlink);
		cr_assert_eq(st.st_size, o->st_size, "%s: %s: size %lld, was %lld", when,
			     saved[i].name, (long long)st.st_size, (long long)o->st_size);
		cr_assert_eq(st.st_rdev, o->st_rdev, "%s: %s: rdev", when, saved[i].name);
		cr_assert(st.st_mtim.tv_sec == o->st_mtim.tv_sec &&
			  st.st_mtim.tv_nsec == o->st_mtim.tv_nsec,
			  "%s: %s: mtime %lld.%09ld, was %lld.%09ld", when, saved[i].name,
			  (long long)st.st_mtim.tv_sec, st.st_mtim.tv_nsec,
			  (long long)o->st_mtim.tv_sec, o->st_mtim.tv_nsec);
		if (S_ISREG(st.st_mode) && strcmp(saved[i].name, "tree/hard") != 0)
			fm_assert_same_content(mp("%s", saved[i].name), model_of(saved[i].name));
	}
	fm_assert_same_content(mp("tree/hard"), sp("model-one"));
	n = OK(readlink(mp("tree/link"), buf, sizeof(buf)));
	cr_assert(n == 13 && memcmp(buf, "./sub/../nine", 13) == 0, "%s: readlink", when);
	fm_assert_same_content(mp("tree/link"), sp("model-nine"));
	n = OK(getxattr(mp("tree/nine"), "user.big", buf, sizeof(buf)));
	cr_assert_eq(n, 1000, "%s: xattr size %zd", when, n);
	for (int i = 0; i < 1000; i++)
		cr_assert_eq((unsigned char)buf[i], (unsigned char)(i * 7), "%s: xattr byte %d", when,
			     i);
	n = OK(getxattr(mp("tree/sub"), "user.d", buf, sizeof(buf)));
	cr_assert(n == 3 && memcmp(buf, "dir", 3) == 0, "%s: dir xattr", when);
	/* the root lists exactly tree, the tree its entries */
	{
		DIR *d = opendir(mp("tree"));
		struct dirent *de;
		int count = 0;

		cr_assert_not_null(d);
		while ((de = readdir(d))) {
			if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
				continue;
			count++;
		}
		closedir(d);
		cr_assert_eq(count, 17, "%s: tree has %d entries", when, count);
	}
	for (int i = 0; i < 100; i++)
		fm_assert_same_content(mp("many/f%03d", i), sp("model-many%03d", i));
}

Test(data, remount_reads_back_everything)
{
	static struct entry saved[NTREE];
	uint64_t rs = seed_for(8);
	char xv[1000];
	int fd;

	OK(mkdir(mp("tree"), 0755));
	OK(mkdir(mp("tree/sub"), 0700));
	OK(chown(mp("tree/sub"), 123, 456));
	OK(setxattr(mp("tree/sub"), "user.d", "dir", 3, 0));
	make_random_file("tree/empty", 0, &rs);
	make_random_file("tree/one", 1, &rs);
	make_random_file("tree/page", 4095, &rs);
	make_random_file("tree/block", 4 * MiB, &rs);
	make_random_file("tree/block1", 4 * MiB + 1, &rs);
	make_random_file("tree/nine", 9 * MiB + 77, &rs);
	make_random_file("tree/sub/deep", 12345, &rs);
	for (int i = 0; i < 1000; i++)
		xv[i] = (char)(i * 7);
	OK(setxattr(mp("tree/nine"), "user.big", xv, sizeof(xv), 0));
	{
		/* sparse: data at 0 and at 19 MiB */
		char *m = calloc(1, 20 * MiB);

		fm_fill_random(&rs, m, 1000);
		fm_fill_random(&rs, m + 19 * MiB, 1000);
		fd = OK(open(mp("tree/sparse"), O_CREAT | O_WRONLY, 0644));
		fm_pwrite_all(fd, m, 1000, 0);
		fm_pwrite_all(fd, m + 19 * MiB, 1000, 19 * MiB);
		OK(ftruncate(fd, 20 * MiB));
		OK(close(fd));
		fm_write_file(sp("model-sparse"), m, 20 * MiB);
		/* patched: many slices, cut mid-block */
		fm_fill_random(&rs, m, 6 * MiB);
		fm_write_file(mp("tree/patched"), m, 6 * MiB);
		for (int i = 0; i < 5; i++) {
			off_t off = (off_t)(fm_rand(&rs) % (5 * MiB));

			fm_fill_random(&rs, m + off, 300 * KiB + (size_t)i);
			fd = OK(open(mp("tree/patched"), O_WRONLY));
			fm_pwrite_all(fd, m + off, 300 * KiB + (size_t)i, off);
			OK(close(fd));
		}
		OK(truncate(mp("tree/patched"), 5 * MiB + 3));
		fm_write_file(sp("model-patched"), m, 5 * MiB + 3);
		free(m);
	}
	OK(symlink("./sub/../nine", mp("tree/link")));
	OK(link(mp("tree/one"), mp("tree/hard")));
	OK(mkfifo(mp("tree/fifo"), 0620));
	OK(mknod(mp("tree/chr"), S_IFCHR | 0600, makedev(4, 64)));
	OK(mknod(mp("tree/sock"), S_IFSOCK | 0755, 0));
	make_random_file("tree/suid", 100, &rs);
	OK(chmod(mp("tree/suid"), 06711));
	make_random_file("tree/timed", 10, &rs);
	make_random_file("tree/owned", 10, &rs);
	OK(chown(mp("tree/owned"), FM_NOBODY_UID, 4242));
	{
		struct timespec ts[2] = { { 1111111111, 222222222 }, { 1333333333, 444444444 } };

		OK(utimensat(AT_FDCWD, mp("tree/timed"), ts, 0));
		OK(utimensat(AT_FDCWD, mp("tree/link"), ts, AT_SYMLINK_NOFOLLOW));
	}
	OK(mkdir(mp("many"), 0755));
	for (int i = 0; i < 100; i++) {
		size_t len = fm_rand(&rs) % (300 * KiB);
		char *buf = malloc(len + 1);

		fm_fill_random(&rs, buf, len);
		fm_write_file(mp("many/f%03d", i), buf, len);
		fm_write_file(sp("model-many%03d", i), buf, len);
		free(buf);
	}
	for (size_t i = 0; i < NTREE; i++) {
		saved[i].name = tree_names[i];
		saved[i].st = lst(mp("%s", tree_names[i]));
	}
	check_tree(saved, "before remount");
	fm_remount_cold();
	check_tree(saved, "after remount");

	/* changes after a remount persist across the next one */
	fd = OK(open(mp("tree/nine"), O_WRONLY | O_APPEND));
	fm_pwrite_all(fd, "appended", 8, 0);
	OK(close(fd));
	{
		int mfd = OK(open(sp("model-nine"), O_WRONLY | O_APPEND));

		fm_pwrite_all(mfd, "appended", 8, 0);
		OK(close(mfd));
	}
	OK(unlink(mp("tree/hard")));
	OK(rename(mp("tree/page"), mp("tree/sub/page")));
	fm_remount_cold();
	cr_assert_eq(lst(mp("tree/nine")).st_size, 9 * MiB + 77 + 8);
	fm_assert_same_content(mp("tree/nine"), sp("model-nine"));
	cr_assert_eq(lst(mp("tree/one")).st_nlink, 1);
	fm_assert_same_content(mp("tree/sub/page"), sp("model-page"));
	{
		struct stat st;

		FAILS(stat(mp("tree/page"), &st), ENOENT);
		FAILS(stat(mp("tree/hard"), &st), ENOENT);
	}
}

/* A truncate while the file is still open for writing (truncate(path) racing
 * the RELEASE of a close() looks the same to the daemon) marks mtime; the
 * writes staged before it, committed at close, must not bring back their
 * older mtime. They did on the daemon path (the commit carried the last
 * write's time), so a remount showed an older mtime than before. */
static bool ts_later(struct timespec a, struct timespec b)
{
	return a.tv_sec > b.tv_sec || (a.tv_sec == b.tv_sec && a.tv_nsec > b.tv_nsec);
}

static bool ts_same(struct timespec a, struct timespec b)
{
	return a.tv_sec == b.tv_sec && a.tv_nsec == b.tv_nsec;
}

/* One round in directory dir of the mount as it is; remounts at the end.
 * The truncate: ftruncate() of the writer's fd, truncate() by path, or an
 * open(O_TRUNC) of another fd. */
static const char *const trunc_ways[] = { "by_fd", "by_path", "by_open_trunc" };
#define NWAYS 3

static void truncate_while_open_round(const char *dir)
{
	struct timespec pause = { 0, 30 * 1000 * 1000 };
	struct stat written, truncated[NWAYS], st;
	char buf[3 * 4096];
	int fd;

	memset(buf, 'x', sizeof(buf));
	OK(mkdir(mp("%s", dir), 0755));
	for (int how = 0; how < NWAYS; how++) {
		const char *name = mp("%s/%s", dir, trunc_ways[how]);

		fd = OK(open(name, O_CREAT | O_WRONLY, 0644));
		fm_pwrite_all(fd, buf, sizeof(buf), 0);
		OK(fstat(fd, &written));
		nanosleep(&pause, NULL);
		if (how == 0)
			OK(ftruncate(fd, 5000));
		else if (how == 1)
			OK(truncate(name, 5000));
		else
			OK(close(OK(open(name, O_WRONLY | O_TRUNC))));
		OK(fstat(fd, &truncated[how]));
		cr_assert(ts_later(truncated[how].st_mtim, written.st_mtim),
			  "%s: mtime %lld.%09ld after the truncate, %lld.%09ld before", name,
			  (long long)truncated[how].st_mtim.tv_sec, truncated[how].st_mtim.tv_nsec,
			  (long long)written.st_mtim.tv_sec, written.st_mtim.tv_nsec);
		OK(close(fd));
		st = lst(name);
		cr_assert(ts_same(st.st_mtim, truncated[how].st_mtim),
			  "%s: mtime %lld.%09ld after close, %lld.%09ld at the truncate", name,
			  (long long)st.st_mtim.tv_sec, st.st_mtim.tv_nsec,
			  (long long)truncated[how].st_mtim.tv_sec, truncated[how].st_mtim.tv_nsec);
	}
	fm_remount_cold();
	for (int how = 0; how < NWAYS; how++) {
		const char *name = mp("%s/%s", dir, trunc_ways[how]);
		off_t want = how == 2 ? 0 : 5000;

		st = lst(name);
		cr_assert_eq(st.st_size, want, "%s: size %lld", name, (long long)st.st_size);
		cr_assert(ts_same(st.st_mtim, truncated[how].st_mtim),
			  "%s: mtime %lld.%09ld after remount, %lld.%09ld at the truncate", name,
			  (long long)st.st_mtim.tv_sec, st.st_mtim.tv_nsec,
			  (long long)truncated[how].st_mtim.tv_sec, truncated[how].st_mtim.tv_nsec);
	}
}

/* On the mount as the run has it, then on the daemon path without the
 * writeback cache (where the daemon stamps the truncate itself). */
Test(data, truncate_while_open_keeps_its_mtime_across_remount)
{
	truncate_while_open_round("as_run");
	fm_umount();
	fm_mount_with("passthrough=off,writeback=off");
	truncate_while_open_round("daemon_path");
}

/* ---- concurrency ---------------------------------------------------------- */

#include <pthread.h>

#define NWRITERS 4

struct writer {
	int id;
	char path[PATH_MAX];
	char *model;
	size_t size;
	char err[256]; /* first failure; threads do not call Criterion */
};

static void *writer_main(void *arg)
{
	struct writer *w = arg;
	uint64_t rs = seed_for(100 + (uint64_t)w->id);
	char *buf = malloc(256 * KiB), *got = malloc(w->size);
	int fd = open(w->path, O_CREAT | O_RDWR, 0644);

	for (int i = 0; i < 150 && fd >= 0 && !w->err[0]; i++) {
		size_t len = 1 + fm_rand(&rs) % (256 * KiB);
		off_t off = (off_t)(fm_rand(&rs) % (w->size - len));

		fm_fill_random(&rs, buf, len);
		if (pwrite(fd, buf, len, off) != (ssize_t)len) {
			snprintf(w->err, sizeof(w->err), "pwrite %zu at %lld: %s", len,
				 (long long)off, strerror(errno));
			break;
		}
		memcpy(w->model + off, buf, len);
		if (i % 25 == 24) {
			if (close(fd) != 0)
				snprintf(w->err, sizeof(w->err), "close: %s", strerror(errno));
			fd = open(w->path, O_RDWR);
		}
	}
	if (fd < 0 && !w->err[0])
		snprintf(w->err, sizeof(w->err), "open %.180s: %s", w->path, strerror(errno));
	if (fd >= 0 && !w->err[0]) {
		off_t end = lseek(fd, 0, SEEK_END);
		ssize_t n = pread(fd, got, (size_t)end, 0);

		if (n != end || memcmp(got, w->model, (size_t)n))
			snprintf(w->err, sizeof(w->err), "read back of %lld bytes differs (got %zd)",
				 (long long)end, n);
		w->size = (size_t)end;
		close(fd);
	}
	free(buf);
	free(got);
	return NULL;
}

struct churner {
	char dir[PATH_MAX];
	volatile int stop;
	char err[256];
};

static void *churn_main(void *arg)
{
	struct churner *c = arg;
	char path[PATH_MAX + 32];

	for (int i = 0; !c->stop && !c->err[0]; i++) {
		struct stat st;
		DIR *d;
		int fd;

		snprintf(path, sizeof(path), "%s/c%d", c->dir, i % 50);
		fd = open(path, O_CREAT | O_WRONLY | O_TRUNC, 0644);
		if (fd < 0 || write(fd, path, 10) != 10 || close(fd) != 0) {
			snprintf(c->err, sizeof(c->err), "create %.180s: %s", path, strerror(errno));
			break;
		}
		if (stat(path, &st) != 0 || st.st_size != 10) {
			snprintf(c->err, sizeof(c->err), "stat %.180s: %s", path, strerror(errno));
			break;
		}
		if (i % 3 == 0 && unlink(path) != 0) {
			snprintf(c->err, sizeof(c->err), "unlink %.180s: %s", path, strerror(errno));
			break;
		}
		d = opendir(c->dir);
		if (!d) {
			snprintf(c->err, sizeof(c->err), "opendir: %s", strerror(errno));
			break;
		}
		while (readdir(d))
			;
		closedir(d);
	}
	return NULL;
}

Test(data, concurrent_writers_and_namespace_churn)
{
	static struct writer w[NWRITERS];
	static struct churner c;
	pthread_t wt[NWRITERS], ct;

	OK(mkdir(mp("churn"), 0755));
	snprintf(c.dir, sizeof(c.dir), "%s", mp("churn"));
	cr_assert_eq(pthread_create(&ct, NULL, churn_main, &c), 0);
	for (int i = 0; i < NWRITERS; i++) {
		w[i].id = i;
		w[i].size = 8 * MiB;
		w[i].model = calloc(1, w[i].size);
		snprintf(w[i].path, sizeof(w[i].path), "%s", mp("w%d", i));
		cr_assert_eq(pthread_create(&wt[i], NULL, writer_main, &w[i]), 0);
	}
	for (int i = 0; i < NWRITERS; i++)
		pthread_join(wt[i], NULL);
	c.stop = 1;
	pthread_join(ct, NULL);
	cr_assert_str_empty(c.err, "namespace churn: %s", c.err);
	for (int i = 0; i < NWRITERS; i++)
		cr_assert_str_empty(w[i].err, "writer %d: %s", i, w[i].err);
	fm_remount_cold();
	for (int i = 0; i < NWRITERS; i++) {
		size_t len;
		char *got = fm_read_file(w[i].path, &len);

		cr_assert_eq(len, w[i].size, "w%d: size %zu after remount, expected %zu", i, len,
			     w[i].size);
		cr_assert(memcmp(got, w[i].model, len) == 0, "w%d differs after remount", i);
		free(got);
		free(w[i].model);
	}
}

/* ---- more ways programs touch data ----------------------------------------- */

Test(data, rename_and_unlink_parent_while_writing)
{
	char got[64];
	int fd;

	OK(mkdir(mp("a"), 0755));
	OK(mkdir(mp("b"), 0755));
	fd = OK(open(mp("a/f"), O_CREAT | O_WRONLY, 0644));
	fm_pwrite_all(fd, "before-", 7, 0);
	OK(rename(mp("a/f"), mp("b/g")));
	fm_pwrite_all(fd, "after", 5, 7);
	OK(close(fd));
	{
		size_t len;
		char *c = fm_read_file(mp("b/g"), &len);

		cr_assert(len == 12 && memcmp(c, "before-after", 12) == 0,
			  "renamed-while-open file has %zu bytes", len);
		free(c);
	}
	/* a file whose directory went away while it was open */
	fd = OK(open(mp("a/h"), O_CREAT | O_RDWR, 0644));
	fm_pwrite_all(fd, "orphan", 6, 0);
	OK(unlink(mp("a/h")));
	OK(rmdir(mp("a")));
	fm_pwrite_all(fd, "!", 1, 6);
	cr_assert_eq(OK(pread(fd, got, sizeof(got), 0)), 7);
	cr_assert(memcmp(got, "orphan!", 7) == 0);
	OK(close(fd));
	fm_remount_cold();
	{
		size_t len;
		char *c = fm_read_file(mp("b/g"), &len);
		struct stat st;

		cr_assert(len == 12 && memcmp(c, "before-after", 12) == 0);
		free(c);
		FAILS(stat(mp("a"), &st), ENOENT);
	}
}

Test(data, lseek_on_a_file_open_for_writing)
{
	char blk[4096];
	off_t h, d;
	int fd;

	memset(blk, 'w', sizeof(blk));
	fd = OK(open(mp("f"), O_CREAT | O_RDWR, 0644));
	fm_pwrite_all(fd, blk, sizeof(blk), 0);
	fm_pwrite_all(fd, blk, sizeof(blk), 8 * MiB);
	cr_assert_eq(OK(lseek(fd, 0, SEEK_END)), 8 * MiB + 4096, "SEEK_END of a staged file");
	cr_assert_eq(OK(lseek(fd, 0, SEEK_DATA)), 0);
	/* With the writeback cache the kernel answers, with the whole file as
	 * data (the daemon has not seen what it holds). */
	struct fm_stats s;
	uint64_t wb = 0;
	fm_stats_read(&s);
	fm_stats_get(&s, "writeback_cache", &wb);
	h = OK(lseek(fd, 0, SEEK_HOLE));
	cr_assert((h >= 4096 && h <= 8 * MiB) || (wb && h == 8 * MiB + 4096),
		  "SEEK_HOLE on an open staged file gave %lld", (long long)h);
	d = OK(lseek(fd, 4 * MiB, SEEK_DATA));
	cr_assert((d >= 4 * MiB && d <= 8 * MiB) || (wb && d == 4 * MiB),
		  "SEEK_DATA on an open staged file gave %lld", (long long)d);
	FAILS(lseek(fd, 8 * MiB + 4096, SEEK_DATA), ENXIO);
	OK(close(fd));
	/* a committed file reopened and extended: both sources count */
	fd = OK(open(mp("f"), O_RDWR));
	fm_pwrite_all(fd, blk, sizeof(blk), 16 * MiB);
	d = OK(lseek(fd, 8 * MiB + 4096, SEEK_DATA));
	cr_assert(d > 8 * MiB && d <= 16 * MiB, "SEEK_DATA after an extension gave %lld",
		  (long long)d);
	cr_assert_eq(OK(lseek(fd, 8 * MiB, SEEK_DATA)), 8 * MiB);
	OK(close(fd));
}

Test(data, o_direct_and_copy_file_range)
{
	void *buf = NULL, *got = NULL;
	int fd, src, dst;
	loff_t in = 0, out = 0;
	ssize_t n;
	uint64_t rs = seed_for(9);

	cr_assert_eq(posix_memalign(&buf, 4096, 64 * KiB), 0);
	cr_assert_eq(posix_memalign(&got, 4096, 64 * KiB), 0);
	fm_fill_random(&rs, buf, 64 * KiB);
	fd = OK(open(mp("direct"), O_CREAT | O_RDWR | O_DIRECT, 0644));
	cr_assert_eq(OK(pwrite(fd, buf, 64 * KiB, 0)), 64 * KiB);
	cr_assert_eq(OK(pread(fd, got, 64 * KiB, 0)), 64 * KiB);
	cr_assert(memcmp(buf, got, 64 * KiB) == 0, "O_DIRECT read back differs");
	OK(close(fd));
	fm_remount_cold();
	fd = OK(open(mp("direct"), O_RDONLY | O_DIRECT));
	cr_assert_eq(OK(pread(fd, got, 64 * KiB, 0)), 64 * KiB);
	cr_assert(memcmp(buf, got, 64 * KiB) == 0, "O_DIRECT read after remount differs");
	OK(close(fd));

	src = OK(open(mp("direct"), O_RDONLY));
	dst = OK(open(mp("copy"), O_CREAT | O_WRONLY, 0644));
	while ((n = copy_file_range(src, &in, dst, &out, 64 * KiB - (size_t)in, 0)) > 0)
		;
	cr_assert_geq(n, 0, "copy_file_range: %s", strerror(errno));
	OK(close(src));
	OK(close(dst));
	{
		size_t len;
		char *c = fm_read_file(mp("copy"), &len);

		cr_assert(len == 64 * KiB && memcmp(c, buf, len) == 0, "copy_file_range result");
		free(c);
	}
	free(buf);
	free(got);
}

Test(data, large_xattr_values)
{
	static char v[65536], g[65536];
	uint64_t rs = seed_for(10);

	fm_write_file(mp("f"), "x", 1);
	fm_fill_random(&rs, v, sizeof(v));
	OK(setxattr(mp("f"), "user.max", v, sizeof(v), 0));
	cr_assert_eq(OK(getxattr(mp("f"), "user.max", NULL, 0)), (ssize_t)sizeof(v));
	cr_assert_eq(OK(getxattr(mp("f"), "user.max", g, sizeof(g))), (ssize_t)sizeof(v));
	cr_assert(memcmp(v, g, sizeof(v)) == 0, "64 KiB xattr differs");
	/* many names */
	for (int i = 0; i < 200; i++) {
		char name[32];

		snprintf(name, sizeof(name), "user.n%03d", i);
		OK(setxattr(mp("f"), name, name, strlen(name), XATTR_CREATE));
	}
	fm_remount_cold();
	cr_assert_eq(OK(getxattr(mp("f"), "user.max", g, sizeof(g))), (ssize_t)sizeof(v));
	cr_assert(memcmp(v, g, sizeof(v)) == 0, "64 KiB xattr differs after remount");
	{
		ssize_t n = OK(listxattr(mp("f"), g, sizeof(g)));
		int count = 0;

		for (ssize_t i = 0; i < n; i += (ssize_t)strlen(g + i) + 1)
			count++;
		cr_assert_eq(count, 201, "listxattr lists %d names", count);
	}
}

/* A file changed in more places than one journal record holds (3000
 * disjoint writes on the daemon path): close() commits it in ferry-mountd
 * instead of handing it over, and every byte is there after a cold
 * remount. */
Test(data, close_after_thousands_of_scattered_writes)
{
	const size_t len = 3000 * 8192;
	unsigned char *want = calloc(1, len), *got;
	size_t n = 0;
	int fd;

	cr_assert_not_null(want);
	for (size_t i = 0; i < len; i++)
		want[i] = (unsigned char)(i * 7);
	fm_write_file(mp("scattered"), want, len); /* not empty at the next open */
	fd = OK(open(mp("scattered"), O_WRONLY));
	for (size_t i = 0; i < 3000; i++) {
		size_t at = i * 8192 + (i % 4096);
		want[at] = 0xA5;
		fm_pwrite_all(fd, &want[at], 1, (off_t)at);
	}
	OK(close(fd));
	fm_remount_cold();
	got = fm_read_file(mp("scattered"), &n);
	cr_assert_eq(n, len);
	cr_assert(memcmp(got, want, len) == 0, "content differs after the commit");
	free(got);
	free(want);
}
