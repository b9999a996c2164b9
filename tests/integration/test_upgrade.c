/*
 * ferry mount --upgrade (mountd/handover.c): a live mount handed to a new
 * ferry-mountd. What fsx (test_fsx.c) does not look at: handles other than
 * files (a directory being listed, .stats), a file unlinked while open, a
 * foreground daemon (a container's main process) that re-executes itself
 * under the same pid, and a second upgrade refused while one runs.
 */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "mount_util.h"

TestSuite(upgrade, .init = fm_setup, .fini = fm_teardown, .timeout = 240);

static pid_t mountd_pid(void)
{
	return (pid_t)fm_stat("pid");
}

Test(upgrade, handles_of_every_kind_go_on)
{
	static const char data[] = "written before the upgrade, read after it";
	char buf[64] = "";
	pid_t before = mountd_pid();
	struct dirent *de;
	int n = 0;

	/* Its data committed, so that reads after the upgrade go to the
	 * volume (an orphan purged at the new daemon's start would fail them),
	 * and one handle still open for writing. */
	fm_write_file(mp("gone"), data, sizeof(data));
	fm_wait_committed("gone", 60);
	int ro = open(mp("gone"), O_RDONLY);
	cr_assert_geq(ro, 0);
	int gone = open(mp("gone"), O_RDWR);
	cr_assert_geq(gone, 0);
	cr_assert_eq(unlink(mp("gone")), 0);
	for (int i = 0; i < 40; i++) {
		char name[32];
		snprintf(name, sizeof(name), "d/f%02d", i);
		if (i == 0)
			cr_assert_eq(mkdir(mp("d"), 0755), 0);
		fm_write_file(mp("%s", name), "x", 1);
	}
	DIR *d = opendir(mp("d"));
	cr_assert_not_null(d);
	for (int i = 0; i < 10 && (de = readdir(d)); i++)
		n++;
	int stats = open(mp(".stats"), O_RDONLY);
	cr_assert_geq(stats, 0);

	fm_upgrade();
	cr_assert_neq(mountd_pid(), before, "a new ferry-mountd serves");

	/* The listing goes on where it was. */
	while ((de = readdir(d)))
		n++;
	cr_assert_eq(n, 40 + 2, "%d entries listed across the upgrade", n);
	closedir(d);
	/* The unlinked file keeps its data and takes more. */
	fm_pread_all(ro, buf, sizeof(data), 0);
	cr_assert_str_eq(buf, data);
	cr_assert_eq(close(ro), 0);
	fm_pwrite_all(gone, "W", 1, 0);
	fm_pread_all(gone, buf, 1, 0);
	cr_assert_eq(buf[0], 'W');
	cr_assert_eq(close(gone), 0);
	cr_assert_gt(read(stats, buf, sizeof(buf)), 0, ".stats read: %s", strerror(errno));
	cr_assert_eq(close(stats), 0);
	cr_assert_eq(access(mp("gone"), F_OK), -1);
	fm_remount();
	cr_assert_eq(access(mp("d/f39"), F_OK), 0);
}

Test(upgrade, a_second_upgrade_meanwhile_is_refused)
{
	int ctl = open(mp(".control"), O_RDWR);
	const char *argv[] = { fm_bin("ferry"), "mount", "--upgrade", fm.mnt, NULL };

	cr_assert_geq(ctl, 0);
	/* What the running upgrade holds. */
	cr_assert_eq(flock(ctl, LOCK_EX | LOCK_NB), 0);
	int rc = fm_run(argv, sp("second.out"), sp("second.err"), 60);
	char *err = fm_slurp(sp("second.err"));
	cr_assert_neq(rc, 0);
	cr_assert(err && strstr(err, "is running"), "%s", err ? err : "");
	free(err);
	cr_assert_eq(close(ctl), 0);
	fm_upgrade();
}

/* A file opened for writing before the upgrade and closed after it: its
 * commit stores only the 64 KiB units written since the last commit (the
 * fingerprints came along), not the whole file. */
Test(upgrade, a_writer_across_it_uploads_only_what_changed)
{
	const size_t len = 8u << 20;
	unsigned char *data = malloc(len);
	uint64_t st = 0x75706772;
	uint64_t up;
	int fd;

	cr_assert_not_null(data);
	fm_fill_random(&st, data, len);
	fm_write_file(mp("big"), data, len);
	fm_wait_committed("big", 60);
	fd = open(mp("big"), O_RDWR);
	cr_assert_geq(fd, 0);
	if (fm_stat("passthrough_active") != 1) {
		cr_log_warn("passthrough is off on this mount: the writer takes the daemon path, "
			    "which commits before the hand-over; nothing to check");
		close(fd);
		free(data);
		return;
	}
	cr_assert_eq(pwrite(fd, "before", 6, 100), 6);
	fm_upgrade();
	/* A new reconciler: its counter starts at 0. */
	up = fm_stat("reconcile_upload_bytes_total");
	cr_assert_eq(pwrite(fd, "after", 5, 5u << 20), 5);
	cr_assert_eq(close(fd), 0);
	fm_wait_committed("big, written across the upgrade", 60);
	up = fm_stat("reconcile_upload_bytes_total") - up;
	cr_log_info("the commit after the upgrade uploaded %llu bytes of an 8 MiB file",
		    (unsigned long long)up);
	/* Two units changed (one before the upgrade, one after): 128 KiB;
	 * the whole file would be 8 MiB. */
	cr_assert_leq(up, 256u << 10, "%llu bytes uploaded: the fingerprints did not come along",
		      (unsigned long long)up);
	memcpy(data + 100, "before", 6);
	memcpy(data + (5u << 20), "after", 5);
	fm_remount_cold();
	fm_expect_content(mp("big"), data, len);
	free(data);
}

/* New binaries that cannot run here are found before the old daemon lets
 * go: the upgrade is refused and the mount goes on, served as before. */
Test(upgrade, a_new_daemon_that_cannot_run_is_refused_first)
{
	static const char data[] = "still served by the same daemon";
	const char *cp[] = { "/bin/cp", fm_bin("ferry"), sp("bin/ferry"), NULL };
	char daemon[PATH_MAX], *err;
	pid_t before = mountd_pid();
	int fd, rc;

	cr_assert_eq(mkdir(sp("bin"), 0755), 0);
	cr_assert_eq(fm_run(cp, NULL, NULL, 30), 0);
	/* A daemon built for another machine: not an executable here. */
	snprintf(daemon, sizeof(daemon), "%s", sp("bin/ferry-mountd"));
	fm_write_file(daemon, "\177ELF not really", 16);
	cr_assert_eq(chmod(daemon, 0755), 0);
	fd = open(mp("kept"), O_CREAT | O_RDWR, 0644);
	cr_assert_geq(fd, 0);
	const char *argv[] = { sp("bin/ferry"), "mount", "--upgrade", fm.mnt, NULL };
	rc = fm_run(argv, sp("bad.out"), sp("bad.err"), 60);
	err = fm_slurp(sp("bad.err"));
	cr_assert_neq(rc, 0, "an upgrade to a daemon that cannot run succeeded");
	cr_assert(err && strstr(err, "does not run here") && strstr(err, "unchanged"), "%s",
		  err ? err : "");
	free(err);
	cr_assert_eq(mountd_pid(), before, "the daemon changed");
	cr_assert_eq(pwrite(fd, data, sizeof(data), 0), (ssize_t)sizeof(data));
	cr_assert_eq(close(fd), 0);
	fm_expect_content(mp("kept"), data, sizeof(data));
}

/* A daemon in the foreground is some process's child (a container's main
 * process): it re-executes itself, so the pid and its parent's wait stay. */
Test(upgrade, a_foreground_daemon_keeps_its_pid)
{
	static const char data[] = "held open across an in-place upgrade";
	char buf[64] = "";
	int status;

	fm_umount();
	pid_t child = fork();
	cr_assert_geq(child, 0);
	if (child == 0) {
		int log = open(fm.log, O_WRONLY | O_APPEND | O_CREAT, 0600);
		if (log >= 0) {
			dup2(log, 1);
			dup2(log, 2);
		}
		execl(fm_bin("ferry"), "ferry", "mount", "-f", "--cache-dir", fm.cache, fm.vol,
		      fm.mnt, (char *)NULL);
		_exit(127);
	}
	fm.mounted = true; /* the teardown unmounts it if this test fails */
	for (int i = 0; i < 200 && !fm_is_mounted(fm.mnt); i++)
		usleep(50000);
	cr_assert(fm_is_mounted(fm.mnt), "ferry mount -f did not mount");
	for (int i = 0; i < 100 && access(mp(".stats"), F_OK) != 0; i++)
		usleep(50000);
	cr_assert_eq(mountd_pid(), child, "ferry mount -f executes ferry-mountd");

	int fd = open(mp("held"), O_CREAT | O_RDWR, 0644);
	cr_assert_geq(fd, 0);
	fm_pwrite_all(fd, data, 10, 0);
	fm_upgrade();
	cr_assert_eq(mountd_pid(), child, "the same process serves");
	cr_assert_eq(waitpid(child, &status, WNOHANG), 0, "the parent's child did not exit");
	fm_pwrite_all(fd, data + 10, sizeof(data) - 10, 10);
	fm_pread_all(fd, buf, sizeof(data), 0);
	cr_assert_str_eq(buf, data);
	cr_assert_eq(close(fd), 0);
	fm_upgrade(); /* and again, from the re-executed one */
	cr_assert_eq(mountd_pid(), child);

	fm_umount();
	cr_assert_eq(waitpid(child, &status, 0), child);
	cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "status %#x", status);
	fm_mount();
	fm_expect_content(mp("held"), data, sizeof(data));
}
