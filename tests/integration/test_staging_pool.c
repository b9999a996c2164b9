/*
 * The staging pool through a real mount: passthrough creates take staging
 * files made and registered ahead of time (.stats staging_pool_hits), a
 * file closed untouched gives its staging file back (staging_pool_returns)
 * and the next file that takes it holds only its own bytes, a mapping that
 * outlives its close keeps its staging file out of the pool, pool files
 * never outlive an unmount, and those of a daemon that died are removed by
 * the next start.
 */
#include "mount_util.h"

#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

TestSuite(staging_pool, .init = fm_setup, .fini = fm_teardown, .timeout = 300);

static const char *staging_dir(void)
{
	return fm_staging_dir();
}

/* How many pool files (".pool-*") the staging directory holds. */
static int pool_files(void)
{
	DIR *d = opendir(staging_dir());
	struct dirent *e;
	int n = 0;

	cr_assert(d, "%s: %s", staging_dir(), strerror(errno));
	while ((e = readdir(d)))
		n += strncmp(e->d_name, ".pool-", 6) == 0;
	closedir(d);
	return n;
}

static bool passthrough_on(void)
{
	uint64_t v;
	struct fm_stats s;

	fm_stats_read(&s);
	return fm_stats_get(&s, "passthrough_active", &v) && v == 1;
}

Test(staging_pool, creates_take_ready_files_and_untouched_ones_come_back)
{
	char name[64], want[64];
	uint64_t hits0, returns0;

	if (!passthrough_on())
		cr_skip_test("passthrough is off for this mount (FERRY_IT_MOUNT_OPTIONS)");
	hits0 = fm_stat("staging_pool_hits");
	returns0 = fm_stat("staging_pool_returns");
	/* Untouched files first: their staging files go back to the pool. */
	for (int k = 0; k < 40; k++) {
		snprintf(name, sizeof(name), "empty%02d", k);
		OK(close(OK(open(mp("%s", name), O_CREAT | O_WRONLY, 0644))));
	}
	fm_wait_released(0);
	/* Then files with content, which take those staging files again. */
	for (int k = 0; k < 40; k++) {
		snprintf(name, sizeof(name), "full%02d", k);
		snprintf(want, sizeof(want), "content of file %02d\n", k);
		fm_write_file(mp("%s", name), want, strlen(want));
	}
	fm_wait_released(0);
	cr_assert_gt(fm_stat("staging_pool_hits"), hits0, "no create took a pool file");
	cr_assert_gt(fm_stat("staging_pool_returns"), returns0,
		     "no untouched file gave its staging file back");
	fm_remount_cold();
	for (int k = 0; k < 40; k++) {
		struct stat st;

		snprintf(name, sizeof(name), "empty%02d", k);
		OK(stat(mp("%s", name), &st));
		cr_assert_eq(st.st_size, 0, "%s: size %lld", name, (long long)st.st_size);
		snprintf(name, sizeof(name), "full%02d", k);
		snprintf(want, sizeof(want), "content of file %02d\n", k);
		fm_expect_content(mp("%s", name), want, strlen(want));
	}
	/* (the new daemon has made none: no create since it started) */
	cr_assert_eq(pool_files(), 0, "pool files outlived the unmount");
}

/* The staging file of a file closed while mapped is the mapping's: it must
 * not be handed to the next create, or stores through the mapping would
 * land in another file. */
Test(staging_pool, a_file_mapped_past_its_close_is_not_reused)
{
	const size_t len = 4096;
	unsigned char *p;
	int fd;

	if (!passthrough_on())
		cr_skip_test("passthrough is off for this mount (FERRY_IT_MOUNT_OPTIONS)");
	/* Mapped past its end and closed unwritten: empty and untouched,
	 * as a file whose staging file goes back to the pool is. */
	uint64_t held0 = fm_stat("mapped_after_close");
	fd = OK(open(mp("mapped"), O_CREAT | O_RDWR, 0644));
	p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	cr_assert(p != MAP_FAILED, "mmap: %s", strerror(errno));
	OK(close(fd));
	/* RELEASE is asynchronous: wait until the daemon has seen the close */
	for (int tries = 0; tries < 100 && fm_stat("mapped_after_close") == held0; tries++)
		usleep(50 * 1000);
	cr_assert_eq(fm_stat("mapped_after_close"), held0 + 1,
		     "the close of a mapped file was not held back for its mapping");
	/* Creates that would take a recycled staging file */
	for (int k = 0; k < 40; k++)
		fm_write_file(mp("other%02d", k), "other\n", 6);
	/* The mapping reaches past the end: growing the file through another
	 * open makes the page real, and a store goes to the mapped file. */
	fd = OK(open(mp("mapped"), O_RDWR));
	OK(ftruncate(fd, (off_t)len));
	OK(close(fd));
	memset(p, 'm', len);
	OK(msync(p, len, MS_SYNC));
	OK(munmap(p, len));
	fm_wait_released(0);
	fm_remount_cold();
	for (int k = 0; k < 40; k++)
		fm_expect_content(mp("other%02d", k), "other\n", 6);
	char *want = malloc(len);
	cr_assert(want);
	memset(want, 'm', len);
	fm_expect_content(mp("mapped"), want, len);
	free(want);
}

/* A daemon killed with its pool full leaves pool files; the next start
 * removes them, and nothing of them shows in the volume. */
Test(staging_pool, a_killed_daemons_pool_files_are_removed_at_start)
{
	if (!passthrough_on())
		cr_skip_test("passthrough is off for this mount (FERRY_IT_MOUNT_OPTIONS)");
	fm_write_file(mp("a"), "a\n", 2);
	/* The filler runs after the first create: wait for its files. */
	for (int tries = 0; tries < 100 && pool_files() == 0; tries++)
		usleep(50 * 1000);
	cr_assert_gt(pool_files(), 0, "the pool made no files");
	fm_crash();
	cr_assert_gt(pool_files(), 0, "a killed daemon's pool files are already gone");
	fm_mount();
	cr_assert_eq(pool_files(), 0, "the start left a dead daemon's pool files");
	fm_expect_content(mp("a"), "a\n", 2);
	fm_umount();
	cr_assert_eq(pool_files(), 0, "pool files outlived the unmount");
	fm_mount();
}

struct creator {
	int id, n, err;
};

static void *create_empty_files(void *arg)
{
	struct creator *c = arg;

	for (int k = 0; k < c->n && !c->err; k++) {
		int fd = open(mp("c%d/f%05d", c->id, k), O_CREAT | O_WRONLY, 0644);

		if (fd < 0 || close(fd) < 0)
			c->err = errno;
	}
	return NULL;
}

/* Closes give files back while the filler makes new ones: the pool never
 * holds more than it has room for, and no create gets a file or a backing
 * id that another one has. */
Test(staging_pool, closes_giving_back_while_the_filler_fills)
{
	enum { THREADS = 4, FILES = 1500 };
	struct creator c[THREADS];
	pthread_t t[THREADS];

	if (!passthrough_on())
		cr_skip_test("passthrough is off for this mount (FERRY_IT_MOUNT_OPTIONS)");
	for (int round = 0; round < 3; round++) {
		for (int k = 0; k < THREADS; k++) {
			OK(mkdir(mp("c%d", k), 0755));
			c[k] = (struct creator){ .id = k, .n = FILES };
			cr_assert_eq(pthread_create(&t[k], NULL, create_empty_files, &c[k]), 0);
		}
		for (int k = 0; k < THREADS; k++) {
			pthread_join(t[k], NULL);
			cr_assert_eq(c[k].err, 0, "round %d, creator %d: %s", round, k,
				     strerror(c[k].err));
		}
		/* Idle long enough for the pool to empty, then again. */
		fm_wait_released(0);
		for (int k = 0; k < THREADS; k++) {
			for (int f = 0; f < FILES; f++)
				cr_assert_eq(unlink(mp("c%d/f%05d", k, f)), 0,
					     "round %d: unlink c%d/f%05d: %s", round, k, f,
					     strerror(errno));
			OK(rmdir(mp("c%d", k)));
		}
		usleep(2500 * 1000);
	}
	cr_assert_eq(fm_stat("staging_pool_failures"), 0);
	for (int k = 0; k < 40; k++)
		fm_write_file(mp("after%02d", k), "after\n", 6);
	fm_wait_released(0);
	fm_remount_cold();
	for (int k = 0; k < 40; k++)
		fm_expect_content(mp("after%02d", k), "after\n", 6);
}
