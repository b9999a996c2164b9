/*
 * Space is given back: after files are overwritten, truncated and deleted
 * for a while, the object store holds about what the live files hold, and
 * every live file still reads right (after a remount with an empty cache,
 * so every byte comes from the store). The mount runs with gc_grace=0 so
 * garbage goes at the next gc round (every second at that grace).
 */
#include "mount_util.h"

#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#define KiB 1024
#define NFILES 12
#define FSIZE (384 * KiB)

static void gc_setup(void)
{
	const char *extra = getenv("FERRY_IT_MOUNT_OPTIONS");
	char opts[256];

	snprintf(opts, sizeof(opts), "%s%sgc_grace=0", extra && *extra ? extra : "",
		 extra && *extra ? "," : "");
	setenv("FERRY_IT_MOUNT_OPTIONS", opts, 1);
	fm_setup();
}

TestSuite(gc, .init = gc_setup, .fini = fm_teardown, .timeout = 240);

static uint64_t store_bytes, store_objects;

static int add_object(const char *path, const struct stat *st, int type, struct FTW *ftw)
{
	(void)ftw;
	if (type == FTW_F && fm_store_is_object(path)) {
		store_bytes += (uint64_t)st->st_size;
		store_objects++;
	}
	return 0;
}

static void store_size(void)
{
	store_bytes = store_objects = 0;
	struct stat st;

	/* On s3rver the prefix's directory comes with its first object. */
	if (stat(fm_store_dir(), &st) < 0 && errno == ENOENT)
		return;
	cr_assert_eq(nftw(fm_store_dir(), add_object, 16, FTW_PHYS), 0, "%s", fm_store_dir());
}

static uint64_t stat_of(const char *name)
{
	struct fm_stats s;

	fm_stats_read(&s);
	return fm_stats_need(&s, name);
}

/* Until nothing is staged, no unlinked inode waits for the batch that
 * frees it (and so queues its slices), and no garbage waits (bounded).
 * The gauge says nothing of a close whose RELEASE ferry-mountd has not
 * seen yet (the kernel sends it after close() returned): those first. */
static void settle(void)
{
	fm_wait_released(0);
	for (int i = 0; i < 300; i++) {
		struct fm_stats s;

		fm_stats_read(&s);
		if (fm_stats_need(&s, "passthrough_staging_blocks") == 0 &&
		    fm_stats_need(&s, "meta_inodes_release_pending") == 0 &&
		    fm_stats_need(&s, "gc_pending_slices") == 0)
			return;
		usleep(100 * 1000);
	}
	cr_assert_fail("still %llu blocks staged, %llu slices of garbage",
		       (unsigned long long)stat_of("passthrough_staging_blocks"),
		       (unsigned long long)stat_of("gc_pending_slices"));
}

Test(gc, churn_keeps_the_store_near_the_live_data)
{
	static unsigned char want[NFILES][FSIZE];
	size_t size[NFILES] = { 0 };
	uint64_t seed = 11, live = 0, written = 0;
	char name[32];

	for (int round = 0; round < 6; round++) {
		for (int f = 0; f < NFILES; f++) {
			uint64_t r = fm_rand(&seed) % 8;

			snprintf(name, sizeof(name), "f%d", f);
			if (r < 4) {
				/* Write it whole (new, or an overwrite). */
				fm_fill_random(&seed, want[f], FSIZE);
				fm_write_file(mp("%s", name), want[f], FSIZE);
				size[f] = FSIZE;
				written += FSIZE;
			} else if (r < 6 && size[f]) {
				/* Overwrite a part in place. */
				int fd = OK(open(mp("%s", name), O_WRONLY | O_CLOEXEC));
				size_t at = (size_t)(fm_rand(&seed) % (size[f] / 2));

				fm_fill_random(&seed, want[f] + at, size[f] / 4);
				fm_pwrite_all(fd, want[f] + at, size[f] / 4, (off_t)at);
				OK(close(fd));
				written += size[f] / 4;
			} else if (r == 6 && size[f]) {
				OK(truncate(mp("%s", name), (off_t)(size[f] / 3)));
				size[f] /= 3;
			} else if (size[f]) {
				OK(unlink(mp("%s", name)));
				size[f] = 0;
			}
		}
		/* Each round's closes seen by ferry-mountd before the next round
		 * opens the files again: an open before the RELEASE shares the
		 * staging file, and the rounds would make one commit, no garbage. */
		fm_wait_released(0);
	}
	settle();
	live = 0;
	for (int f = 0; f < NFILES; f++)
		live += size[f];
	store_size();
	cr_log_info("written %llu bytes; live %llu; store %llu bytes in %llu objects",
		    (unsigned long long)written, (unsigned long long)live,
		    (unsigned long long)store_bytes, (unsigned long long)store_objects);
	/* Partial overwrites keep the parts they did not hide: allow that,
	 * and the small trailer of each object. Without gc the store holds
	 * everything written (several times the live data). */
	cr_assert_leq(store_bytes, live * 2 + 64 * KiB,
		      "the store holds %llu bytes for %llu live (%llu written)",
		      (unsigned long long)store_bytes, (unsigned long long)live,
		      (unsigned long long)written);
	cr_assert_gt(stat_of("gc_objects_deleted"), 0);
	/* Nothing live was taken: every byte reads back from the store. */
	fm_remount_cold();
	for (int f = 0; f < NFILES; f++) {
		struct stat st;

		snprintf(name, sizeof(name), "f%d", f);
		if (!size[f] && stat(mp("%s", name), &st) < 0)
			continue;
		fm_expect_content(mp("%s", name), want[f], size[f]);
	}
	/* Everything deleted: the store empties. */
	for (int f = 0; f < NFILES; f++) {
		snprintf(name, sizeof(name), "f%d", f);
		unlink(mp("%s", name));
	}
	settle();
	store_size();
	cr_assert_eq(store_objects, 0, "%llu objects (%llu bytes) left after every file went",
		     (unsigned long long)store_objects, (unsigned long long)store_bytes);
}
