/*
 * ferry-reconciler's uploads to a file:// store are flushed once per commit
 * batch (objstore_sync), not once per object. What that must keep true,
 * with a disk whose flushes fail (tests/integration/shim_fault_fsync.c,
 * loaded into ferry-reconciler only, failing fsync() of the object
 * directory's files):
 *  - nothing is committed whose objects were not flushed: while flushes
 *    fail, a closed file stays staged (and reads back right, through
 *    passthrough: a daemon-path reader waits for the commit);
 *  - a failed flush is not forgotten when the disk recovers (the page
 *    cache no longer says what reached the disk): the reconciler exits,
 *    ferry-mountd starts a new one (after a pause growing with each one
 *    that commits nothing), which uploads the job again; then it commits,
 *    and reads back right from the store alone.
 */
#include "mount_util.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define KiB 1024
#define MiB (1024 * KiB)

static volatile uint64_t *failures; /* the shim's count of failed flushes */

static void sync_init(void)
{
	int fd;

	fm_setup_opts(&(struct fm_opts){ .no_mount = true });
	fd = open(sp("fsync-counts"), O_CREAT | O_RDWR | O_CLOEXEC, 0644);
	cr_assert(fd >= 0);
	OK(ftruncate(fd, 4096));
	failures = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	cr_assert(failures != MAP_FAILED);
	close(fd);
	fm_daemon_preload("fault_fsync");
	fm_daemon_env("FERRY_FAULT_FSYNC_CTL", sp("fsync-ctl"));
	char under[PATH_MAX];
	snprintf(under, sizeof(under), "%s/", fm_store_dir());
	fm_daemon_env("FERRY_FAULT_FSYNC_UNDER", under);
	fm_daemon_env("FERRY_FAULT_FSYNC_COUNT", sp("fsync-counts"));
	fm_mount();
}

TestSuite(object_sync, .init = sync_init, .fini = fm_teardown, .timeout = 300);

/* Jobs ferry-mountd heard were committed (across reconciler restarts). */
static uint64_t jobs_committed(void)
{
	struct fm_stats s;

	fm_stats_read(&s);
	return fm_stats_need(&s, "commit_invalidations") +
	       fm_stats_need(&s, "commit_invalidations_skipped");
}

static void write_model(const char *name, size_t size, uint64_t seed)
{
	char *buf = malloc(size);

	fm_fill_random(&seed, buf, size);
	fm_write_file(mp("%s", name), buf, size);
	fm_write_file(sp("model-%s", name), buf, size);
	free(buf);
}

Test(object_sync, failed_flushes_commit_nothing_and_are_uploaded_again)
{
	uint64_t committed;
	pid_t first;
	time_t t0;

	/* Flushes work: a file commits as usual, its objects flushed. */
	write_model("before", 3 * MiB + 5, 1);
	fm_wait_committed("before any fault", 120);
	first = fm_reconciler_pid();
	committed = jobs_committed();

	/* Flushes fail: the file stays staged, and reads back right. */
	fm_write_file(sp("fsync-ctl"), "on\n", 3);
	write_model("during", 5 * MiB + 7, 2);
	fm_wait_released(0);
	t0 = time(NULL);
	while (failures[0] == 0) {
		cr_assert_lt(time(NULL) - t0, 60, "no flush of the object store failed in 60 s");
		usleep(20 * 1000);
	}
	usleep(300 * 1000); /* a commit that should not come would have come by now */
	cr_assert_eq(jobs_committed(), committed,
		     "committed although its objects' flush failed");
	/* Through passthrough a reader reads the staging file meanwhile; on
	 * the daemon path it waits for the commit (README), so it reads after. */
	if (fm_stat("passthrough_active"))
		fm_assert_same_content(mp("during"), sp("model-during"));

	/* The disk recovers: the failed flush still counts. A new
	 * reconciler (not the one that saw it fail) uploads the job again. */
	OK(unlink(sp("fsync-ctl")));
	fm_wait_committed("after the faults", 120);
	cr_assert_neq(fm_reconciler_pid(), first, "the reconciler that saw a flush fail went on");
	{
		uint64_t now = jobs_committed();
		char *st = fm_slurp(mp(".stats"));
		cr_assert_gt(now, committed, "jobs committed: %llu, before: %llu; .stats:\n%s",
			     (unsigned long long)now, (unsigned long long)committed, st ? st : "?");
		free(st);
	}
	fm_remount_cold();
	fm_assert_same_content(mp("before"), sp("model-before"));
	fm_assert_same_content(mp("during"), sp("model-during"));
}
