/*
 * The read cache through a real mount: it stays within --cache-size by
 * evicting, evicted objects are fetched again correctly, and a cold read
 * fetches each object once even though readahead asks for it many times.
 */
#include "mount_util.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#define MiB (1024 * 1024)

static void small_cache_setup(void)
{
	fm_setup_opts(&(struct fm_opts){ .block_size = "1048576", .no_mount = true });
}

TestSuite(cache, .init = small_cache_setup, .fini = fm_teardown, .timeout = 120);

/* Mounts with a cache of cache_mib MiB in a new, empty cache directory. */
static void mount_with_cache(const char *cache_mib)
{
	const char *argv[] = { fm_bin("ferry"), "mount", "--cache-dir", fm.cache,
			       "--cache-size", cache_mib, "-o", fm_mount_options(), fm.vol, fm.mnt, NULL };

	fm.n_cache++;
	snprintf(fm.cache, sizeof(fm.cache), "%s/cache-%d", fm.dir, fm.n_cache);
	cr_assert(mkdir(fm.cache, 0700) == 0);
	cr_assert_eq(fm_run(argv, NULL, NULL, 60), 0, "ferry mount --cache-size %s failed", cache_mib);
	fm.mounted = true;
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
	const char *argv[] = { fm_bin("ferry"), "mount", "--cache-dir", fm.cache, "--cache-size", "64",
			       "-o", fm_mount_options(), fm.vol, fm.mnt, NULL };
	cr_assert_eq(fm_run(argv, NULL, NULL, 60), 0);
	fm.mounted = true;
	read_all_and_check(mp("g"), data, len);
	fm_stats_read(&s);
	cr_assert_eq(fm_stats_need(&s, "objects_get"), 0);
	cr_assert_geq(fm_stats_need(&s, "cache_hits"), 4);
	free(data);
}
