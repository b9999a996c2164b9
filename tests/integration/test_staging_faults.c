/*
 * The staging file system misbehaving, through a real mount whose
 * --staging-dir is a small tmpfs of the test's own, full (ENOSPC) in the
 * middle of a write. (A read-only remount of it is refused while the
 * daemons hold staging files open, so that case is not here.) What close() reported as
 * done must be intact afterwards (read back after a remount with an empty
 * cache); the application sees ENOSPC or EROFS -- honest errors -- and
 * never wrong bytes; and the mount works again once the staging file
 * system has room. scripts/test runs it with passthrough on and off.
 */
#include "mount_util.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mount.h>
#include <sys/statvfs.h>
#include <sys/stat.h>
#include <unistd.h>

#define MiB (1024 * 1024)

static void staging_setup(void)
{
	fm_setup_opts(&(struct fm_opts){ .no_mount = true });
	snprintf(fm.staging, sizeof(fm.staging), "%s", sp("staging"));
	cr_assert(mkdir(fm.staging, 0700) == 0);
	cr_assert(mount("ferry-test-staging", fm.staging, "tmpfs", MS_NOSUID | MS_NODEV,
			"size=8m,mode=0700") == 0, "tmpfs: %s", strerror(errno));
	/* Passthrough even on a nearly full staging file system: the point
	 * is to fill it in the middle of a write. */
	fm.staging_min_free = "0";
	fm_mount();
}

static void staging_teardown(void)
{
	/* ferryfs first (it stages there), then the tmpfs, lazily, even if
	 * that failed -- and both before fm_teardown() removes the tree. */
	if (fm.mounted) {
		const char *argv[] = { fm_bin("ferry"), "umount", fm.mnt, NULL };

		if (fm_run(argv, NULL, NULL, 60) == 0)
			fm.mounted = false;
	}
	if (fm.staging[0])
		umount2(fm.staging, MNT_DETACH);
	fm_teardown();
}

TestSuite(staging_faults, .init = staging_setup, .fini = staging_teardown, .timeout = 180);

/* Until the reconciler has nothing staged and the staging file system is
 * nearly empty again (a file that could not be handed over, its journal
 * record finding no room, is committed by ferry-mountd in its RELEASE,
 * after close() returned). */
static void drained(void)
{
	struct fm_stats s;
	struct statvfs sv;

	for (int i = 0; i < 300; i++) {
		fm_stats_read(&s);
		if (fm_stats_need(&s, "passthrough_staging_blocks") == 0 &&
		    statvfs(fm.staging, &sv) == 0 &&
		    (uint64_t)(sv.f_blocks - sv.f_bfree) * sv.f_frsize < 1024 * 1024)
			return;
		usleep(100 * 1000);
	}
	cr_assert_fail("staged blocks never drained");
}

Test(staging_faults, full_staging_is_enospc_and_closed_files_stay)
{
	size_t big_len = 16 * MiB, done = 0;
	unsigned char *small = malloc(64 * 1024), *big = malloc(big_len);
	uint64_t seed = 21;
	int fd, err = 0, close_rc;

	cr_assert(small && big);
	fm_fill_random(&seed, small, 64 * 1024);
	fm_fill_random(&seed, big, big_len);
	fm_write_file(mp("small"), small, 64 * 1024);

	/* More than the staging file system holds. */
	fd = OK(open(mp("big"), O_CREAT | O_WRONLY | O_CLOEXEC, 0644));
	while (done < big_len) {
		ssize_t n = write(fd, big + done, MiB < big_len - done ? MiB : big_len - done);

		if (n < 0) {
			err = errno;
			break;
		}
		done += (size_t)n;
	}
	close_rc = close(fd);
	int close_err = close_rc < 0 ? errno : 0;
	struct fm_stats st;
	uint64_t wb = 0;
	fm_stats_read(&st);
	fm_stats_get(&st, "writeback_cache", &wb);
	/* With the writeback cache (the daemon path by default) the kernel
	 * takes the writes and the write-back fails: close() says ENOSPC,
	 * as on NFS. Otherwise write() does. */
	if (wb && !err)
		cr_assert_eq(close_err, ENOSPC, "writes into a full staging file system through "
			     "the writeback cache: close() said %s",
			     close_err ? fm_errname(close_err) : "ok");
	else
		cr_assert_eq(err, ENOSPC, "a write into a full staging file system: %s, after %zu "
			     "bytes", err ? fm_errname(err) : "no error", done);
	cr_log_info("wrote %zu of %zu bytes before ENOSPC; close %s", done, big_len,
		    close_rc == 0 ? "ok" : strerror(close_err));

	/* Once the reconciler has taken what was staged, there is room again. */
	drained();
	fm_write_file(mp("after"), small, 64 * 1024);
	drained();
	fm_remount_cold();
	fm_expect_content(mp("small"), small, 64 * 1024);
	fm_expect_content(mp("after"), small, 64 * 1024);
	if (close_rc == 0) {
		/* close() said the file is as written: every byte a write()
		 * reported is there, nothing else. */
		fm_expect_content(mp("big"), big, done);
	} else {
		/* Not promised; still never wrong bytes where it has any. */
		size_t got = 0;
		unsigned char *back = fm_read_file(mp("big"), &got);

		cr_assert(back || errno == EIO);
		if (back)
			cr_assert(got <= done && memcmp(back, big, got) == 0,
				  "wrong bytes in a file whose close failed");
		free(back);
	}
	free(small);
	free(big);
}
