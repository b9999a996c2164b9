/*
 * The read cache through a real mount: it stays within --cache-size by
 * evicting, evicted objects are fetched again correctly, and a cold read
 * fetches each object once even though readahead asks for it many times.
 */
#include "mount_util.h"
#include "reconcile_job.h"

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#define MiB (1024 * 1024)

static void small_cache_setup(void)
{
	fm_setup_opts(&(struct fm_opts){ .block_size = "1048576", .no_mount = true });
}

TestSuite(cache, .init = small_cache_setup, .fini = fm_teardown, .timeout = 120);

/* Mounts with a cache of cache_mib MiB in a new, empty cache directory. */
static const char *cache_extra_options; /* more -o options, or NULL */

/* The fixture's options, without local copies: a file written here would
 * be read through its copy (passthrough), never through the read cache
 * these tests are about; then cache_extra_options. */
static const char *cache_mount_options(void)
{
	static char opts[320];

	snprintf(opts, sizeof(opts), "%s,local_copies=0%s%s", fm_mount_options(),
		 cache_extra_options ? "," : "", cache_extra_options ? cache_extra_options : "");
	return opts;
}

static void mount_with_cache(const char *cache_mib)
{
	const char *argv[] = { fm_bin("ferry"), "mount", "--cache-dir", fm.cache,
			       "--cache-size", cache_mib, "-o", cache_mount_options(), fm.vol, fm.mnt,
			       NULL };

	fm.n_cache++;
	snprintf(fm.cache, sizeof(fm.cache), "%s/cache-%d", fm.dir, fm.n_cache);
	cr_assert(mkdir(fm.cache, 0700) == 0);
	cr_assert_eq(fm_run(argv, NULL, NULL, 60), 0, "ferry mount --cache-size %s failed", cache_mib);
	fm.mounted = true;
}

/* Mounts again over the cache directory the last mount used. */
static void mount_again_with_cache(const char *cache_mib)
{
	const char *argv[] = { fm_bin("ferry"), "mount", "--cache-dir", fm.cache,
			       "--cache-size", cache_mib, "-o", cache_mount_options(), fm.vol, fm.mnt,
			       NULL };

	cr_assert_eq(fm_run(argv, NULL, NULL, 60), 0, "ferry mount --cache-dir %s failed", fm.cache);
	fm.mounted = true;
}

/* How many fds ferry-mountd (pid in .stats) has open on files under the
 * cache directory, and how many of those files are gone from it. */
static void cache_fds(int *open_n, int *deleted_n)
{
	struct fm_stats s;
	char dir[PATH_MAX], link[PATH_MAX * 2], target[PATH_MAX];
	struct dirent *de;
	size_t clen = strlen(fm.cache);
	DIR *d;

	fm_stats_read(&s);
	snprintf(dir, sizeof(dir), "/proc/%llu/fd", (unsigned long long)fm_stats_need(&s, "pid"));
	d = opendir(dir);
	cr_assert(d, "cannot list %s", dir);
	*open_n = *deleted_n = 0;
	while ((de = readdir(d))) {
		ssize_t n;

		snprintf(link, sizeof(link), "%s/%s", dir, de->d_name);
		n = readlink(link, target, sizeof(target) - 1);
		if (n <= 0)
			continue;
		target[n] = '\0';
		if (strncmp(target, fm.cache, clen) != 0 || target[clen] != '/')
			continue;
		(*open_n)++;
		if (strstr(target, " (deleted)"))
			(*deleted_n)++;
	}
	closedir(d);
}

static void read_all_and_check(const char *path, const unsigned char *want, size_t len)
{
	size_t got;
	unsigned char *data = fm_read_file(path, &got);

	cr_assert_eq(got, len);
	cr_assert(memcmp(data, want, len) == 0, "wrong bytes read back");
	free(data);
}

Test(cache, stays_within_its_limit_and_refetches_evicted_objects)
{
	size_t len = 12 * MiB; /* 12 objects of 1 MiB */
	unsigned char *data = malloc(len);
	uint64_t seed = 99, cache_bytes, gets1, gets2;
	struct fm_stats s;

	fm_fill_random(&seed, data, len);
	mount_with_cache("3");
	fm_write_file(mp("f"), data, len);
	fm_umount();

	mount_with_cache("3");
	read_all_and_check(mp("f"), data, len);
	fm_stats_read(&s);
	cache_bytes = fm_stats_need(&s, "cache_bytes");
	gets1 = fm_stats_need(&s, "objects_get");
	cr_assert_leq(cache_bytes, 3 * MiB, "cache holds %llu bytes over its 3 MiB limit",
		      (unsigned long long)cache_bytes);
	cr_assert_gt(cache_bytes, 0, "nothing was cached");
	/* Each object fetched once, readahead notwithstanding. */
	cr_assert_eq(gets1, 12, "cold read of 12 objects made %llu GETs", (unsigned long long)gets1);

	/* The first objects were evicted: reading them again fetches them
	 * again, and the bytes are still right. */
	int fd = OK(open(mp("f"), O_RDONLY));
	OK(posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED));
	close(fd);
	read_all_and_check(mp("f"), data, len);
	fm_stats_read(&s);
	gets2 = fm_stats_need(&s, "objects_get");
	cr_assert_gt(gets2, gets1, "evicted objects were not fetched again");
	cr_assert_leq(fm_stats_need(&s, "cache_bytes"), 3 * MiB);
	/* The daemon keeps the hot cache files open; an evicted one is not
	 * held (its disk space would never come back). */
	int open_n, deleted_n;
	cache_fds(&open_n, &deleted_n);
	cr_assert_eq(deleted_n, 0, "ferry-mountd holds %d evicted cache files open", deleted_n);
	cr_assert_leq(open_n, 3, "%d cache files open, the cache holds 3 objects", open_n);
	free(data);
}

Test(cache, a_warm_cache_serves_without_the_store)
{
	size_t len = 4 * MiB;
	unsigned char *data = malloc(len);
	uint64_t seed = 5;
	struct fm_stats s;

	fm_fill_random(&seed, data, len);
	mount_with_cache("64");
	fm_write_file(mp("g"), data, len);
	/* Once uploaded (fsync of any fd waits for that; until then readers
	 * read the staging file), a read fills the cache (the reconciler
	 * uploads without it). */
	int fd = OK(open(mp("g"), O_RDONLY));
	OK(fsync(fd));
	OK(close(fd));
	read_all_and_check(mp("g"), data, len);
	fm_stats_read(&s);
	cr_assert_geq(fm_stats_need(&s, "cache_bytes"), len);
	fm_umount();
	/* Same cache directory again: no GET needed. */
	mount_again_with_cache("64");
	read_all_and_check(mp("g"), data, len);
	fm_stats_read(&s);
	cr_assert_eq(fm_stats_need(&s, "objects_get"), 0);
	cr_assert_geq(fm_stats_need(&s, "cache_hits"), 4);
	free(data);
}

/* Runs `ferry drain` on the mount: every upload handed to the reconciler
 * is committed when it returns. */
static void drain_uploads(void)
{
	const char *argv[] = { fm_bin("ferry"), "drain", fm.mnt, NULL };

	cr_assert_eq(fm_run(argv, NULL, NULL, 60), 0, "ferry drain failed");
}

/* How many files under the cache directory have a temporary name. */
static int cache_tmp_files(void)
{
	char *cmd = NULL, line[64] = "";
	FILE *p;

	cr_assert(asprintf(&cmd, "find '%s' -name '*.tmp.*' | wc -l", fm.cache) > 0);
	p = popen(cmd, "r");
	cr_assert(p && fgets(line, sizeof(line), p));
	pclose(p);
	free(cmd);
	return atoi(line);
}

/* A file of 1 MiB or less read soon after its upload is committed finds
 * its bytes in the read cache: the reconciler wrote them there as it
 * stored them (cache seeds), so the read makes no GET. A larger file is
 * not seeded and is fetched. No seed is left under a temporary name, and
 * a new mount over the same cache directory finds the seeded objects. */
Test(cache, small_files_read_after_their_commit_need_no_get)
{
	size_t big_len = 2 * MiB + 5;
	unsigned char small[3000], *edge = malloc(MiB), *big = malloc(big_len);
	uint64_t seed = 31;
	struct fm_stats s;

	fm_fill_random(&seed, small, sizeof(small));
	fm_fill_random(&seed, edge, MiB);
	fm_fill_random(&seed, big, big_len);
	mount_with_cache("64");
	fm_write_file(mp("small"), small, sizeof(small));
	fm_write_file(mp("edge"), edge, MiB);
	fm_write_file(mp("big"), big, big_len);
	drain_uploads();
	fm_stats_read(&s);
	cr_assert_eq(fm_stats_need(&s, "cache_seeded"), 2, "%llu objects seeded, want small's and edge's",
		     (unsigned long long)fm_stats_need(&s, "cache_seeded"));
	cr_assert_eq(cache_tmp_files(), 0, "seeds left under temporary names");
	read_all_and_check(mp("small"), small, sizeof(small));
	read_all_and_check(mp("edge"), edge, MiB);
	fm_stats_read(&s);
	cr_assert_eq(fm_stats_need(&s, "objects_get"), 0, "reads of seeded files made %llu GETs",
		     (unsigned long long)fm_stats_need(&s, "objects_get"));
	read_all_and_check(mp("big"), big, big_len);
	fm_stats_read(&s);
	cr_assert_eq(fm_stats_need(&s, "objects_get"), 3, "the 3 objects of big took %llu GETs",
		     (unsigned long long)fm_stats_need(&s, "objects_get"));
	fm_umount();

	mount_again_with_cache("64");
	read_all_and_check(mp("small"), small, sizeof(small));
	read_all_and_check(mp("edge"), edge, MiB);
	fm_stats_read(&s);
	cr_assert_eq(fm_stats_need(&s, "objects_get"), 0);
	cr_assert_eq(fm_stats_need(&s, "cache_dropped"), 0);
	free(edge);
	free(big);
}

/* A reconciler killed with seeds on disk (written, never named in a
 * reply) leaves them under temporary names; the one ferry-mountd starts
 * next removes them before it takes any job, and seeds as before. */
Test(cache, seeds_a_killed_reconciler_left_go_with_the_next_one)
{
	unsigned char small[5000];
	uint64_t seed = 32;
	char *cmd = NULL;
	struct fm_stats s;

	fm_fill_random(&seed, small, sizeof(small));
	mount_with_cache("64");
	pid_t old = fm_reconciler_pid();
	cr_assert(asprintf(&cmd, "set -e; d=$(find '%s' -mindepth 1 -maxdepth 1 -type d); "
			   "[ -n \"$d\" ]; mkdir -p \"$d/chunks/0/0\"; "
			   "echo left > \"$d/chunks/0/0/77_0_5%s\"",
			   fm.cache, RECONCILE_SEED_SUFFIX) > 0);
	cr_assert_eq(system(cmd), 0, "could not leave a seed in the cache directory");
	free(cmd);
	cr_assert_eq(cache_tmp_files(), 1);
	OK(kill(old, SIGKILL));
	fm_write_file(mp("after"), small, sizeof(small));
	drain_uploads();
	cr_assert_neq(fm_reconciler_pid(), old, "the reconciler was not started again");
	cr_assert_eq(cache_tmp_files(), 0, "the left seed is still there");
	/* (That file went by whichever way the restart left it; one closed
	 * now goes through the new reconciler.) */
	fm_write_file(mp("later"), small, sizeof(small));
	drain_uploads();
	fm_stats_read(&s);
	cr_assert_eq(fm_stats_need(&s, "cache_seeded"), 1);
	uint64_t gets0 = fm_stats_need(&s, "objects_get");
	read_all_and_check(mp("later"), small, sizeof(small));
	fm_stats_read(&s);
	cr_assert_eq(fm_stats_need(&s, "objects_get"), gets0, "later was not read from its seed");
	/* after's bytes may be cached or not: a handoff the killed reconciler
	 * took is uploaded again from its journal record, with no seed. */
	read_all_and_check(mp("after"), small, sizeof(small));
}

/* Reads of cached objects are spliced from the cache files (no copy through
 * ferry-mountd): every byte right, holes between the slices included, at
 * offsets and lengths that cross object boundaries; a cache file of the
 * wrong size is never spliced but fetched again. */
Test(cache, reads_splice_from_cache_files_holes_and_all)
{
	size_t len = 5 * MiB + 12345;
	unsigned char *want = calloc(1, len);
	uint64_t seed = 7, gets, spliced;
	struct fm_stats s;
	int fd;

	/* Data, a hole of 1.5 MiB, data again, then a short tail. */
	fm_fill_random(&seed, want, 3 * MiB / 2);
	fm_fill_random(&seed, want + 3 * MiB, len - 3 * MiB);
	mount_with_cache("64");
	fd = OK(open(mp("h"), O_CREAT | O_WRONLY, 0644));
	cr_assert_eq(pwrite(fd, want, 3 * MiB / 2, 0), 3 * MiB / 2);
	cr_assert_eq(pwrite(fd, want + 3 * MiB, len - 3 * MiB, 3 * MiB), (ssize_t)(len - 3 * MiB));
	OK(fsync(fd));
	OK(close(fd));
	fm_umount();

	mount_with_cache("64");
	read_all_and_check(mp("h"), want, len); /* fetches into the cache */
	fm_stats_read(&s);
	gets = fm_stats_need(&s, "objects_get");
	cr_assert_gt(gets, 0);
	fd = OK(open(mp("h"), O_RDONLY));
	OK(posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED));
	/* Pieces at odd places: across the 1 MiB objects and the hole. */
	static const struct { off_t off; size_t n; } at[] = {
		{ 0, 4096 }, { 1048570, 20 }, { MiB - 1, 3 * MiB }, { 3 * MiB / 2 - 100, 200 },
		{ 2 * MiB, 4096 }, { 3 * MiB - 7, 300000 }, { 5 * MiB, 12345 }, { 5 * MiB + 12000, 4096 },
	};
	unsigned char *got = malloc(3 * MiB);
	for (size_t i = 0; i < sizeof(at) / sizeof(at[0]); i++) {
		size_t expect = (size_t)at[i].off + at[i].n > len ? len - (size_t)at[i].off : at[i].n;
		ssize_t n;

		OK(posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED));
		n = pread(fd, got, at[i].n, at[i].off);
		cr_assert_eq(n, (ssize_t)expect, "pread(%zu at %lld) returned %zd", at[i].n,
			     (long long)at[i].off, n);
		cr_assert(memcmp(got, want + at[i].off, expect) == 0, "wrong bytes at %lld",
			  (long long)at[i].off);
	}
	OK(close(fd));
	fm_stats_read(&s);
	spliced = fm_stats_need(&s, "spliced_reads");
	cr_assert_gt(spliced, 0, "no READ was spliced from the read cache");
	cr_assert_eq(fm_stats_need(&s, "objects_get"), gets, "cached objects were fetched again");

	/* A cache file cut short, and one of the right length with a wrong
	 * byte (what a power loss can leave of a file that was never
	 * fsynced), are not read: both objects come from the store again and
	 * the bytes are right. The cache's state is made that of a daemon
	 * killed under another boot, so no file found is trusted unread. */
	fm_umount();
	char *cmd = NULL;
	cr_assert(asprintf(&cmd,
		 "set -e; f=$(find '%s' -type f -size 1048584c | sort | head -n 2); "
		 "set -- $f; [ $# -eq 2 ]; truncate -s 1000 \"$1\"; "
		 "printf 'X' | dd of=\"$2\" bs=1 seek=4242 conv=notrunc status=none; "
		 "s=$(find '%s' -name .state); [ -n \"$s\" ]; "
		 "echo 'boot 00000000-0000-0000-0000-000000000000 synced 0' > \"$s\"",
		 fm.cache, fm.cache) > 0);
	cr_assert_eq(system(cmd), 0, "could not damage two cache files");
	free(cmd);
	mount_again_with_cache("64");
	read_all_and_check(mp("h"), want, len);
	fm_stats_read(&s);
	cr_assert_eq(fm_stats_need(&s, "objects_get"), 2, "the damaged cache files took %llu GETs",
		     (unsigned long long)fm_stats_need(&s, "objects_get"));
	cr_assert_eq(fm_stats_need(&s, "cache_dropped"), 2);
	free(got);
	free(want);
}

/* A sequential reader finds the objects ahead of it fetched already
 * (read-ahead), each object is fetched once, and the bytes are right; a
 * random reader has nothing fetched that it does not read. */
Test(cache, sequential_readers_get_read_ahead_random_ones_do_not)
{
	size_t len = 24 * MiB; /* 24 objects of 1 MiB */
	unsigned char *want = malloc(len), *got = malloc(MiB);
	uint64_t seed = 11;
	struct fm_stats s;
	int fd;

	fm_fill_random(&seed, want, len);
	mount_with_cache("64");
	fm_write_file(mp("seq"), want, len);
	fd = OK(open(mp("seq"), O_RDONLY));
	OK(fsync(fd)); /* uploaded: reads go to the store, not the staging file */
	OK(close(fd));
	fm_umount();

	mount_with_cache("64");
	fd = OK(open(mp("seq"), O_RDONLY));
	OK(posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM));
	/* Random: 4 KiB here and there, never two objects in a row; the last
	 * three are near each other (as random reads in a large file often
	 * are) but still read 12 KiB, not a sequential run. */
	static const off_t at[] = { 20 * MiB + 5, 3 * MiB + 4096, 11 * MiB, 7 * MiB + 999,
				    15 * MiB + 4096, 15 * MiB + 600 * 1024, 16 * MiB + 100 * 1024 };
	for (size_t i = 0; i < sizeof(at) / sizeof(at[0]); i++) {
		cr_assert_eq(pread(fd, got, 4096, at[i]), 4096);
		cr_assert(memcmp(got, want + at[i], 4096) == 0, "wrong bytes at %lld", (long long)at[i]);
	}
	fm_stats_read(&s);
	cr_assert_eq(fm_stats_need(&s, "prefetch_queued"), 0, "random reads queued read-ahead");
	cr_assert_eq(fm_stats_need(&s, "objects_get"), 6, "6 objects read at random took %llu GETs",
		     (unsigned long long)fm_stats_need(&s, "objects_get"));
	OK(close(fd));
	fm_umount();

	/* Two GETs at a time, never more. */
	cache_extra_options = "readahead_streams=2";
	mount_with_cache("64");
	cache_extra_options = NULL;
	fd = OK(open(mp("seq"), O_RDONLY));
	for (size_t off = 0; off < len; off += MiB) {
		cr_assert_eq(read(fd, got, MiB), MiB);
		cr_assert(memcmp(got, want + off, MiB) == 0, "wrong bytes at %zu", off);
	}
	cr_assert_eq(read(fd, got, MiB), 0);
	OK(close(fd));
	fm_stats_read(&s);
	cr_assert_gt(fm_stats_need(&s, "prefetch_fetched"), 0, "nothing was read ahead");
	cr_assert_eq(fm_stats_need(&s, "prefetch_streams"), 2);
	cr_assert(fm_stats_need(&s, "prefetch_streams_busy_max") >= 1 &&
		  fm_stats_need(&s, "prefetch_streams_busy_max") <= 2,
		  "%llu GETs of read-ahead at once with readahead_streams=2",
		  (unsigned long long)fm_stats_need(&s, "prefetch_streams_busy_max"));
	cr_assert_eq(fm_stats_need(&s, "prefetch_failed"), 0);
	cr_assert_eq(fm_stats_need(&s, "objects_get"), 24, "24 objects took %llu GETs",
		     (unsigned long long)fm_stats_need(&s, "objects_get"));
	/* The read-ahead thread that fetched the last object may still be
	 * writing it to the cache (the reader took it from the fetch itself):
	 * its budget comes back once it is done. */
	for (int t = 0; t < 500 && fm_stats_need(&s, "prefetch_bytes") != 0; t++) {
		usleep(10000);
		fm_stats_read(&s);
	}
	cr_assert_eq(fm_stats_need(&s, "prefetch_bytes"), 0, "read-ahead still holds %llu bytes",
		     (unsigned long long)fm_stats_need(&s, "prefetch_bytes"));
	free(got);
	free(want);
}

/* -o readahead_streams: 1 to 64, 8 when not given; anything else stops
 * the mount with a message that says so. */
Test(cache, readahead_streams_takes_1_to_64)
{
	static const char *const bad[] = { "readahead_streams=0", "readahead_streams=65",
					   "readahead_streams=", "readahead_streams=4x" };
	char err[PATH_MAX];
	struct fm_stats s;

	snprintf(err, sizeof(err), "%s/mount.err", fm.dir);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		char opts[400];
		const char *argv[] = { fm_bin("ferry"), "mount", "-o", opts, fm.vol, fm.mnt, NULL };

		snprintf(opts, sizeof(opts), "%s,%s", cache_mount_options(), bad[i]);
		cr_assert_neq(fm_run(argv, NULL, err, 60), 0, "-o %s mounted", bad[i]);
		cr_assert(!fm_is_mounted(fm.mnt));
		char *text = fm_slurp(err);
		cr_assert(text && strstr(text, "readahead_streams takes 1 to 64"), "-o %s: %s", bad[i],
			  text ? text : "(nothing)");
		free(text);
	}
	mount_with_cache("64");
	fm_stats_read(&s);
	cr_assert_eq(fm_stats_need(&s, "prefetch_streams"), 8);
}

/* Eviction takes the least recently used object, not the oldest: one read
 * again keeps its place. */
Test(cache, evicts_the_least_recently_used)
{
	size_t len = 3 * MiB; /* objects A, B, C of 1 MiB; the cache holds two */
	unsigned char *want = malloc(len), got[4096];
	uint64_t seed = 3, gets;
	struct fm_stats s;
	int fd;

	fm_fill_random(&seed, want, len);
	mount_with_cache("3");
	fm_write_file(mp("lru"), want, len);
	fm_umount();
	mount_with_cache("3");
	fd = OK(open(mp("lru"), O_RDONLY));
	OK(posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM));
	/* A, B, A again, then C: B goes, A stays. */
	static const off_t order[] = { 0, MiB, 0, 2 * MiB };
	for (size_t i = 0; i < sizeof(order) / sizeof(order[0]); i++) {
		OK(posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED));
		cr_assert_eq(pread(fd, got, sizeof(got), order[i]), (ssize_t)sizeof(got));
		cr_assert(memcmp(got, want + order[i], sizeof(got)) == 0);
	}
	fm_stats_read(&s);
	gets = fm_stats_need(&s, "objects_get");
	cr_assert_eq(gets, 3, "A, B, A, C took %llu GETs", (unsigned long long)gets);
	OK(posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED));
	cr_assert_eq(pread(fd, got, sizeof(got), 0), (ssize_t)sizeof(got));
	fm_stats_read(&s);
	cr_assert_eq(fm_stats_need(&s, "objects_get"), gets, "A was evicted, not B");
	OK(posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED));
	cr_assert_eq(pread(fd, got, sizeof(got), MiB), (ssize_t)sizeof(got));
	cr_assert(memcmp(got, want + MiB, sizeof(got)) == 0);
	fm_stats_read(&s);
	cr_assert_eq(fm_stats_need(&s, "objects_get"), gets + 1, "B was not evicted");
	OK(close(fd));
	free(want);
}

/* ferry warmup reads a tree once: its objects are in the read cache after,
 * and reading the files then fetches nothing. */
Test(cache, warmup_fills_the_cache_ahead_of_use)
{
	size_t len = 5 * MiB / 2;
	unsigned char *want = malloc(len);
	uint64_t seed = 21, gets;
	char out[PATH_MAX];
	struct fm_stats s;
	char *text;
	int fd;

	fm_fill_random(&seed, want, len);
	mount_with_cache("64");
	OK(mkdir(mp("tree"), 0755));
	OK(mkdir(mp("tree/sub"), 0755));
	fm_write_file(mp("tree/a"), want, len);           /* 3 objects */
	fm_write_file(mp("tree/sub/b"), want, MiB);       /* 1 */
	fm_write_file(mp("tree/empty"), want, 0);         /* none */
	fd = OK(open(mp("tree/a"), O_RDONLY));
	OK(fsync(fd)); /* every file uploaded: syncfs of the volume */
	OK(close(fd));
	fm_umount();

	mount_with_cache("64");
	snprintf(out, sizeof(out), "%s/warmup.out", fm.dir);
	const char *argv[] = { fm_bin("ferry"), "warmup", mp("tree"), NULL };
	cr_assert_eq(fm_run(argv, out, NULL, 60), 0, "ferry warmup failed");
	text = fm_slurp(out);
	cr_assert(text && strstr(text, "warmed 3 files, 3 MiB"), "warmup said: %s", text ? text : "");
	free(text);
	fm_stats_read(&s);
	gets = fm_stats_need(&s, "objects_get");
	cr_assert_eq(gets, 4, "warmup fetched %llu objects, not 4", (unsigned long long)gets);
	read_all_and_check(mp("tree/a"), want, len);
	read_all_and_check(mp("tree/sub/b"), want, MiB);
	fm_stats_read(&s);
	cr_assert_eq(fm_stats_need(&s, "objects_get"), gets, "reads after warmup fetched objects");

	/* Not a FUSE mount: refused with a reason, nothing read. */
	const char *bad[] = { fm_bin("ferry"), "warmup", fm.dir, NULL };
	cr_assert_eq(fm_run(bad, NULL, NULL, 60), 1);
	free(want);
}

/* Reads through the daemon (the kernel's copy dropped first) of [off,
 * off+len) of fd must give want[off..]. */
static void pread_check(int fd, const unsigned char *want, off_t off, size_t len, const char *when)
{
	unsigned char *got = malloc(len);

	OK(posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED));
	cr_assert_eq(pread(fd, got, len, off), (ssize_t)len, "%s: short read", when);
	cr_assert(memcmp(got, want + off, len) == 0, "%s: stale or wrong bytes at %lld", when,
		  (long long)off);
	free(got);
}

/* ferry-mountd keeps each held file's committed layout, so READs skip the
 * database; every change to the file must drop it. A reader holding the
 * file open across a commit by the reconciler (a write from another open),
 * a truncate and a punched hole reads what each made, never the layout it
 * read before. */
Test(cache, a_reader_sees_every_commit_through_its_open_file)
{
	size_t len = 3 * MiB + 4321;
	unsigned char *want = malloc(len), patch[300];
	uint64_t seed = 17, hits;
	struct fm_stats s;
	int rfd, wfd;

	fm_fill_random(&seed, want, len);
	mount_with_cache("64");
	fm_write_file(mp("k"), want, len);
	/* Uploaded and committed, and the writer's RELEASE (which the kernel
	 * sends after close() returns) handled: an open before it would share
	 * the staging file in passthrough, and its reads would never reach
	 * the daemon. */
	fm_wait_committed("after the first write", 60);
	rfd = OK(open(mp("k"), O_RDONLY));
	pread_check(rfd, want, 0, len, "first read");
	pread_check(rfd, want, 0, len, "second read");
	fm_stats_read(&s);
	hits = fm_stats_need(&s, "layout_hits");
	cr_assert_gt(hits, 0, "READs of an unchanged file still went to the database");

	/* Another open writes across an object boundary; the reconciler
	 * commits it while rfd stays open. */
	fm_fill_random(&seed, patch, sizeof(patch));
	memcpy(want + MiB - 100, patch, sizeof(patch));
	wfd = OK(open(mp("k"), O_WRONLY));
	cr_assert_eq(pwrite(wfd, patch, sizeof(patch), MiB - 100), (ssize_t)sizeof(patch));
	OK(close(wfd));
	OK(fsync(rfd));
	pread_check(rfd, want, MiB - 1000, 4000, "after another open's commit");
	pread_check(rfd, want, 0, len, "whole file after the commit");

	/* Shorter, longer again (what was cut reads as zeros), then a hole
	 * punched: the reader sees each. */
	OK(truncate(mp("k"), 2 * MiB + 10));
	OK(fsync(rfd));
	cr_assert_eq(pread(rfd, patch, sizeof(patch), 2 * MiB + 10), 0, "read past the new end");
	memset(want + 2 * MiB + 10, 0, len - (2 * MiB + 10));
	OK(truncate(mp("k"), (off_t)len));
	pread_check(rfd, want, 0, len, "after truncate down and up");
	wfd = OK(open(mp("k"), O_WRONLY));
	OK(fallocate(wfd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, MiB / 2, MiB));
	OK(close(wfd));
	memset(want + MiB / 2, 0, MiB);
	pread_check(rfd, want, 0, len, "after a punched hole");
	fm_stats_read(&s);
	cr_assert_gt(fm_stats_need(&s, "layout_hits"), hits);
	OK(close(rfd));
	free(want);
}
