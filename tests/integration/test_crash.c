/*
 * Crash safety with the reconciler: SIGKILL of ferry-mountd or of
 * ferry-reconciler in the middle of a stream of creates loses nothing whose
 * close() returned; fsync=local is durable on the node (it survives both
 * processes killed at once) without uploading.
 */
#include "mount_util.h"

#include "reconcile_job.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

TestSuite(crash, .init = fm_setup, .fini = fm_teardown, .timeout = 300);

#define FILE_LEN 70000 /* not a block multiple: a partial last object */

static void content(int n, unsigned char *buf)
{
	uint64_t st = 0x1234 + (uint64_t)n;

	fm_fill_random(&st, buf, FILE_LEN);
}

/*
 * A child creates f0, f1, ... and writes each completed index (close()
 * returned 0) to the pipe, until an error. Returns the child's pid.
 */
static pid_t start_writer(int wfd)
{
	pid_t pid = fork();

	cr_assert_geq(pid, 0);
	if (pid == 0) {
		static unsigned char buf[FILE_LEN];
		for (int n = 0; n < 100000; n++) {
			char path[PATH_MAX + 32];
			int fd;

			snprintf(path, sizeof(path), "%s/s/f%d", fm.mnt, n);
			content(n, buf);
			fd = open(path, O_CREAT | O_WRONLY | O_TRUNC, 0644);
			if (fd < 0)
				_exit(0);
			if (write(fd, buf, FILE_LEN) != FILE_LEN) {
				close(fd);
				_exit(0);
			}
			if (close(fd) != 0)
				_exit(0);
			if (write(wfd, &n, sizeof(n)) != sizeof(n))
				_exit(0);
		}
		_exit(0);
	}
	return pid;
}

/* Reads completed indexes until at least want have come; returns the
 * highest seen. */
static int wait_completed(int rfd, int want)
{
	int n = -1, got = 0, last = -1;

	while (got < want && read(rfd, &n, sizeof(n)) == sizeof(n)) {
		last = n;
		got++;
	}
	cr_assert_geq(got, want, "the writer stopped after %d files", got);
	return last;
}

static int drain_completed(int rfd, int last)
{
	int n;

	while (read(rfd, &n, sizeof(n)) == sizeof(n))
		last = n;
	return last;
}

static void check_files(int upto)
{
	unsigned char want[FILE_LEN];

	for (int n = 0; n <= upto; n++) {
		size_t len;
		unsigned char *got;

		content(n, want);
		got = fm_read_file(mp("s/f%d", n), &len);
		cr_assert_eq(len, FILE_LEN, "s/f%d: %zu bytes after the crash", n, len);
		cr_assert(memcmp(got, want, FILE_LEN) == 0, "s/f%d: wrong bytes after the crash", n);
		free(got);
	}
}

/* Pids of processes named name whose command line mentions the fixture. */
static int find_procs(const char *name, pid_t *pids, int max)
{
	DIR *d = opendir("/proc");
	struct dirent *de;
	int n = 0;

	cr_assert(d);
	while ((de = readdir(d)) && n < max) {
		char path[300], cmd[4096];
		int fd;
		ssize_t len;

		if (de->d_name[0] < '0' || de->d_name[0] > '9')
			continue;
		snprintf(path, sizeof(path), "/proc/%s/cmdline", de->d_name);
		fd = open(path, O_RDONLY);
		if (fd < 0)
			continue;
		len = read(fd, cmd, sizeof(cmd) - 1);
		close(fd);
		if (len <= 0)
			continue;
		cmd[len] = '\0';
		for (ssize_t k = 0; k < len; k++)
			if (cmd[k] == '\0')
				cmd[k] = ' ';
		if (strstr(cmd, name) && strstr(cmd, fm.dir))
			pids[n++] = (pid_t)atoi(de->d_name);
	}
	closedir(d);
	return n;
}

Test(crash, sigkill_of_mountd_mid_stream_loses_no_closed_file)
{
	int p[2], status, last;
	pid_t w;

	OK(mkdir(mp("s"), 0755));
	cr_assert_eq(pipe(p), 0);
	w = start_writer(p[1]);
	close(p[1]);
	last = wait_completed(p[0], 40);
	fm_crash(); /* SIGKILL ferry-mountd; its reconciler is told to stop */
	last = drain_completed(p[0], last);
	close(p[0]);
	waitpid(w, &status, 0);
	fm_mount();
	check_files(last);
}

Test(crash, sigkill_of_reconciler_mid_stream_loses_no_closed_file)
{
	int p[2], status, last;
	pid_t w, rec[4];
	int nrec;

	OK(mkdir(mp("s"), 0755));
	cr_assert_eq(pipe(p), 0);
	w = start_writer(p[1]);
	close(p[1]);
	wait_completed(p[0], 30);
	nrec = find_procs("ferry-reconciler", rec, 4);
	cr_assert_eq(nrec, 1, "%d reconcilers for this mount", nrec);
	kill(rec[0], SIGKILL);
	/* The writer goes on, and ferry-mountd starts another reconciler and
	 * hands it the jobs that were in flight. */
	last = wait_completed(p[0], 30);
	pid_t now[4];
	int nnow = 0;
	for (int t = 0; t < 200; t++) {
		nnow = find_procs("ferry-reconciler", now, 4);
		if (nnow == 1 && now[0] != rec[0])
			break;
		usleep(50 * 1000);
	}
	cr_assert(nnow == 1 && now[0] != rec[0], "no new reconciler after the old one was killed");
	/* Every file closed so far opens and reads right without a remount. */
	int upto = last;
	check_files(upto);
	kill(w, SIGTERM);
	last = drain_completed(p[0], last);
	close(p[0]);
	waitpid(w, &status, 0);
	/* Jobs the dead reconciler held stay journaled; the next mount's
	 * reconciler finishes them. */
	fm_umount();
	fm_mount();
	check_files(last);
}

Test(crash, fsync_local_is_durable_on_the_node_without_uploading)
{
	unsigned char want[FILE_LEN];
	struct fm_stats s;
	uint64_t put0;
	pid_t pids[8];
	int fd, n;

	fm_umount();
	setenv("FERRY_IT_MOUNT_OPTIONS", "fsync=local", 1);
	fm_mount();
	unsetenv("FERRY_IT_MOUNT_OPTIONS");
	fm_stats_read(&s);
	cr_assert_eq(fm_stats_need(&s, "fsync_local"), 1);
	put0 = fm_stats_need(&s, "objects_put");

	content(1, want);
	fd = OK(open(mp("pt"), O_CREAT | O_WRONLY, 0644)); /* passthrough */
	fm_pwrite_all(fd, want, FILE_LEN, 0);
	OK(fsync(fd));
	fm_write_file(mp("old"), "0123456789", 10);
	int fd2 = OK(open(mp("old"), O_WRONLY)); /* daemon path: not empty at open */
	fm_pwrite_all(fd2, "ABC", 3, 2);
	OK(fdatasync(fd2));
	fm_stats_read(&s);
	/* fsync=local uploads nothing from ferry-mountd. */
	cr_assert_eq(fm_stats_need(&s, "objects_put"), put0);

	/* Both processes die, with both files still open: the reconciler,
	 * then ferry-mountd. */
	n = find_procs("ferry-reconciler", pids, 8);
	cr_assert_eq(n, 1, "%d reconcilers for this mount", n);
	kill(pids[0], SIGKILL);
	fm_crash();
	close(fd);
	close(fd2);
	fm_mount();
	size_t len;
	unsigned char *got = fm_read_file(mp("pt"), &len);
	cr_assert_eq(len, FILE_LEN);
	cr_assert(memcmp(got, want, FILE_LEN) == 0, "pt: wrong bytes after the crash");
	free(got);
	got = fm_read_file(mp("old"), &len);
	cr_assert_eq(len, 10);
	cr_assert(memcmp(got, "01ABC56789", 10) == 0, "old: '%.10s' after the crash", got);
	free(got);
}

/*
 * A write open of a file with content copies it into a staging file, which
 * holds the whole file from then on. Written without fsync, the copy is
 * whole only while the page cache that took it lives: a power loss may
 * take any of its pages (they read as zeros). Simulated here: both daemons
 * killed, every byte of the file's staging files punched out (pages never
 * written back), and the daemons started again under another boot id
 * (tests/integration/shim_fake_boot.c), as after the machine restarted.
 */
#define COPY_LEN (1u << 20)
#define FAKE_BOOT "0badb007-0000-4000-8000-000000000001"

static void committed_file(const char *name, unsigned char fill)
{
	unsigned char *buf = malloc(COPY_LEN);

	cr_assert(buf);
	memset(buf, fill, COPY_LEN);
	fm_write_file(mp("%s", name), buf, COPY_LEN);
	free(buf);
}

static void expect_file(const char *name, const char *head, unsigned char fill)
{
	size_t len, k = strlen(head);
	unsigned char *got = fm_read_file(mp("%s", name), &len);

	cr_assert_eq(len, COPY_LEN, "%s: %zu bytes", name, len);
	cr_assert(memcmp(got, head, k) == 0, "%s starts with '%.8s', not '%s'", name,
		  (const char *)got, head);
	for (size_t at = k; at < len; at++)
		cr_assert(got[at] == fill, "%s: byte %zu is %#x, not %#x", name, at, got[at], fill);
	free(got);
}

/* Both daemons killed, the mount's files left open as they are. The
 * reconciler is stopped first, or ferry-mountd could start another before
 * it dies (which would go on with the jobs). */
static void kill_both(void)
{
	pid_t pids[8];
	int n = find_procs("ferry-reconciler", pids, 8);

	cr_assert_eq(n, 1, "%d reconcilers for this mount", n);
	kill(pids[0], SIGSTOP);
	fm_crash();
	kill(pids[0], SIGKILL);
	for (int t = 0; t < 500 && find_procs("ferry-reconciler", pids, 8) > 0; t++)
		usleep(10000);
	cr_assert_eq(find_procs("ferry-reconciler", pids, 8), 0, "a reconciler survived");
}

static void name_of(const char *path, void *arg)
{
	size_t n = strlen(path);

	if (n <= 4 || strcmp(path + n - 4, ".job") != 0)
		snprintf(arg, 256, "%s", strrchr(path, '/') + 1);
}

/* The name of the one staging file of inode ino (its journal record, a
 * .job where there are no user xattrs, aside). */
static void staging_name_of(uint64_t ino, char name[256])
{
	name[0] = '\0';
	cr_assert_geq(fm_staging_each(ino, name_of, name), 1, "inode %llu has no staging file",
		      (unsigned long long)ino);
	cr_assert(name[0]);
}

static void punch(const char *path, void *arg)
{
	struct stat st;
	size_t n = strlen(path);

	(void)arg;
	if (n > 4 && strcmp(path + n - 4, ".job") == 0)
		return; /* a record: the file's own data is what a power loss takes */
	int fd = OK(open(path, O_RDWR));

	OK(fstat(fd, &st));
	if (st.st_size > 0)
		OK(fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, st.st_size));
	close(fd);
}

/* Punches out every byte of the staging files of inode ino (as a power
 * loss does to pages never written back); returns how many there were. */
static int staging_punch(uint64_t ino)
{
	return fm_staging_each(ino, punch, NULL);
}

static uint64_t ino_of(const char *name)
{
	struct stat st;

	OK(stat(mp("%s", name), &st));
	return st.st_ino;
}

/* The daemons started again as after the machine restarted, and what they
 * commit at start committed. */
static void restart_under_another_boot(void)
{
	fm_daemon_preload("fake_boot");
	fm_daemon_env("FERRY_FAKE_BOOT_ID", FAKE_BOOT);
	fm_mount();
	fm_wait_committed("the recovered copy", 60);
}

/* The one staging file of ino is a flushed copy (named .p). */
static void expect_flushed(uint64_t ino, const char *what)
{
	char name[256];

	staging_name_of(ino, name);
	cr_assert(strlen(name) > 2 && strcmp(name + strlen(name) - 2, ".p") == 0,
		  "%s: %s", what, name);
}

Test(crash, a_copy_never_flushed_is_set_aside_after_the_machine_restarts)
{
	committed_file("open", 'A');
	committed_file("closed", 'C');
	fm_wait_committed("the files' first uploads", 60);
	uint64_t open_ino = ino_of("open"), closed_ino = ino_of("closed");
	/* The next close's upload waits: its job is still journaled when the
	 * daemons die. */
	fm_umount();
	fm_forget_saved_copies(); /* the write opens copy in, not take a kept copy over */
	setenv("FERRY_IT_MOUNT_OPTIONS", "upload_quiet_ms=600000,upload_delay_max_ms=600000", 1);
	fm_mount();

	/* One file open with a write, one written and closed. */
	int fd = OK(open(mp("open"), O_RDWR));
	fm_pwrite_all(fd, "BBBB", 4, 0);
	int fd2 = OK(open(mp("closed"), O_RDWR));
	fm_pwrite_all(fd2, "DDDD", 4, 0);
	OK(close(fd2));
	cr_assert_geq(fm_stat("copy_ups"), 2, "the write opens made no copies");
	kill_both();
	close(fd);
	cr_assert_eq(staging_punch(open_ino), 1, "the open file has no staging file");
	cr_assert_eq(staging_punch(closed_ino), 1, "the closed file has no staging file");

	unsetenv("FERRY_IT_MOUNT_OPTIONS");
	fm_daemon_preload("fake_boot");
	fm_daemon_env("FERRY_FAKE_BOOT_ID", FAKE_BOOT);
	fm_mount();
	fm_wait_committed("whatever the restart committed", 60);
	/* Committed content, not zeros: the writes were never flushed, so
	 * they may go, but nothing that was committed before them. */
	expect_file("open", "", 'A');
	expect_file("closed", "", 'C');
	cr_assert_eq(fm_stat("staging_copies_set_aside"), 2);
	fm_remount_cold();
	expect_file("open", "", 'A');
	expect_file("closed", "", 'C');
}

Test(crash, a_copy_survives_a_crash_of_the_daemons_under_the_same_boot)
{
	committed_file("f", 'A');
	fm_wait_committed("the file's first upload", 60);
	int fd = OK(open(mp("f"), O_RDWR));
	fm_pwrite_all(fd, "BBBB", 4, 0); /* returned: must survive the daemons */
	/* A copy-in, or the local copy taken over (the same kind of file). */
	cr_assert_geq(fm_stat("copy_ups") + fm_stat("local_copy_takeovers"), 1,
		      "the write open made no copy");
	kill_both();
	close(fd);
	fm_mount();
	fm_wait_committed("the recovered copy", 60);
	expect_file("f", "BBBB", 'A');
	cr_assert_eq(fm_stat("staging_copies_set_aside"), 0);
}

Test(crash, an_fsynced_copy_survives_the_machine_restarting)
{
	fm_umount();
	setenv("FERRY_IT_MOUNT_OPTIONS", "fsync=local", 1);
	fm_mount();
	committed_file("f", 'A');
	fm_wait_committed("the file's first upload", 60);
	int fd = OK(open(mp("f"), O_RDWR));
	fm_pwrite_all(fd, "BBBB", 4, 0);
	OK(fdatasync(fd)); /* durable on the node from here, copy and all */
	cr_assert_geq(fm_stat("copy_ups") + fm_stat("local_copy_takeovers"), 1,
		      "the write open made no copy");
	expect_flushed(ino_of("f"), "the copy of an fsync=local mount is not flushed at open");
	kill_both();
	close(fd);

	unsetenv("FERRY_IT_MOUNT_OPTIONS");
	restart_under_another_boot();
	expect_file("f", "BBBB", 'A');
	cr_assert_eq(fm_stat("staging_copies_set_aside"), 0);
}

/* An open with O_DSYNC that shares a copy made by an earlier open (which
 * left it unflushed) flushes it first: its writes are durable on return,
 * and after a power loss the file is whole. */
Test(crash, an_o_dsync_open_of_a_shared_copy_flushes_it)
{
	char name[256];

	committed_file("f", 'A');
	fm_wait_committed("the file's first upload", 60);
	uint64_t ino = ino_of("f");
	int fd = OK(open(mp("f"), O_RDWR));
	fm_pwrite_all(fd, "BBBB", 4, 0);
	staging_name_of(ino, name);
	cr_assert(strstr(name, STAGING_COPY_SUFFIX), "not an unflushed copy: %s", name);
	int fd2 = OK(open(mp("f"), O_RDWR | O_DSYNC));
	expect_flushed(ino, "the O_DSYNC open did not flush the shared copy");
	fm_pwrite_all(fd2, "CCCC", 4, 8); /* durable when it returns */
	kill_both();
	close(fd);
	close(fd2);

	restart_under_another_boot();
	expect_file("f", "BBBBAAAACCCC", 'A');
	cr_assert_eq(fm_stat("staging_copies_set_aside"), 0);
}

/* A flush of a copy that failed once is never followed by a rename to a
 * whole file: the next flush may succeed with the lost pages unwritten
 * (the kernel reports a writeback error once). The staging disk's flushes
 * fail through tests/integration/shim_fault_fsync.c. */
Test(crash, a_copy_whose_flush_failed_stays_unflushed)
{
	char name[256];

	fm_umount();
	fm_daemon_preload("fault_fsync");
	fm_daemon_env("FERRY_FAULT_FSYNC_PROG", "ferry-mountd");
	fm_daemon_env("FERRY_FAULT_FSYNC_CTL", sp("fsync-ctl"));
	fm_daemon_env("FERRY_FAULT_FSYNC_UNDER", fm_staging_dir());
	fm_mount();
	committed_file("f", 'A');
	fm_wait_committed("the file's first upload", 60);
	uint64_t ino = ino_of("f");
	int fd = OK(open(mp("f"), O_RDWR));
	fm_pwrite_all(fd, "BBBB", 4, 0);

	fm_write_file(sp("fsync-ctl"), "", 0); /* flushes fail from here */
	int fd2 = open(mp("f"), O_RDWR | O_DSYNC);
	int err = errno;
	cr_assert(fd2 < 0 && err == EIO, "an O_DSYNC open whose flush failed: %d (%s)", fd2,
		  strerror(err));
	OK(unlink(sp("fsync-ctl"))); /* and succeed again */
	fd2 = open(mp("f"), O_RDWR | O_DSYNC);
	err = errno;
	cr_assert(fd2 < 0 && err == EIO, "an O_DSYNC open after a failed flush: %d (%s)", fd2,
		  strerror(err));
	staging_name_of(ino, name);
	cr_assert(strstr(name, STAGING_COPY_SUFFIX), "a copy whose flush failed was renamed: %s",
		  name);
	OK(close(fd));
}

/* A staging directory is one volume's: another volume's daemons refuse it,
 * even where its owner crashed and left uploads for its next start. (Its
 * files are named by inode and sequence only: a second volume's reconciler
 * took them for its own, dropped them as committed already, and the
 * owner's writes were gone.) */
Test(crash, another_volume_refuses_a_staging_directory_and_leaves_its_uploads)
{
	/* Own copies: sp()'s results are reused after 16 calls. */
	char *staging = strdup(fm_staging_dir());
	char *objs = strdup(sp("objs-b")), *vol = strdup(sp("vol-b")), *mnt = strdup(sp("mnt-b"));
	char *cache = strdup(sp("cache-b")), *url = NULL, *opts = NULL;
	const char *given = getenv("FERRY_IT_MOUNT_OPTIONS");

	cr_assert(staging && objs && vol && mnt && cache && asprintf(&url, "file://%s", objs) > 0);
	cr_assert(asprintf(&opts, "%s%supload_quiet_ms=600000,upload_delay_max_ms=600000",
			   given ? given : "", given && *given ? "," : "") > 0);
	char *given_copy = given ? strdup(given) : NULL;
	OK(mkdir(objs, 0700));
	OK(mkdir(mnt, 0700));
	committed_file("f", 'A');
	fm_wait_committed("the file's first upload", 60);
	fm_umount();
	setenv("FERRY_IT_MOUNT_OPTIONS", opts, 1);
	fm_mount();
	int fd = OK(open(mp("f"), O_RDWR));
	fm_pwrite_all(fd, "BBBB", 4, 0);
	OK(close(fd)); /* returned: must survive */
	fm_write_file(mp("new"), "new file", 8);
	kill_both();
	if (given_copy)
		setenv("FERRY_IT_MOUNT_OPTIONS", given_copy, 1);
	else
		unsetenv("FERRY_IT_MOUNT_OPTIONS");

	const char *format[] = { fm_bin("ferry"), "format", "--storage", url, vol, NULL };
	const char *mount[] = { fm_bin("ferry"), "mount", "--staging-dir", staging, "--cache-dir",
				cache, vol, mnt, NULL };
	const char *umount[] = { fm_bin("ferry"), "umount", mnt, NULL };
	cr_assert_eq(fm_run(format, NULL, NULL, 60), 0, "ferry format of a second volume");
	int rc = fm_run(mount, sp("out"), sp("err"), 60);
	char *err = fm_slurp(sp("err"));
	if (rc == 0)
		fm_run(umount, NULL, NULL, 60);
	cr_assert_neq(rc, 0, "another volume mounted with this one's staging directory");
	cr_assert(err && strstr(err, "belongs to volume"), "why the mount was refused: %s",
		  err ? err : "");
	free(err);

	fm_mount();
	fm_wait_committed("the uploads the crash left", 60);
	expect_file("f", "BBBB", 'A');
	fm_expect_content(mp("new"), "new file", 8);
	fm_remount_cold();
	expect_file("f", "BBBB", 'A');
	fm_expect_content(mp("new"), "new file", 8);
	free(staging);
	free(objs);
	free(vol);
	free(mnt);
	free(cache);
	free(url);
	free(opts);
	free(given_copy);
}
