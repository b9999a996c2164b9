/*
 * The object store misbehaving, through a real mount: each test puts a
 * fault-injecting proxy (s3_proxy_util.h) between ferryfs and the test's
 * S3 server and checks that what close() or fsync() reported as done is
 * intact afterwards (read back after a remount with an empty cache), that
 * the application sees only honest errors (EIO), never wrong bytes, and
 * what a signal or a killed caller does to a read the store holds up
 * (mountd/caller.c). Needs the S3 server scripts/test starts
 * (FERRY_TEST_S3_HOSTPORT, FERRY_TEST_S3_BUCKET and the AWS_* variables).
 */
#include "mount_util.h"
#include "s3_proxy_util.h"

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MiB (1024 * 1024)

static struct s3_proxy *proxy;

static void faults_setup(void)
{
	proxy = s3_proxy_volume_setup("faults");
}

static void faults_teardown(void)
{
	if (proxy)
		s3_proxy_release(proxy);
	fm_teardown();
	s3_proxy_stop(proxy);
	proxy = NULL;
}

TestSuite(store_faults, .init = faults_setup, .fini = faults_teardown, .timeout = 240);

static unsigned char *pattern(size_t len, uint64_t seed)
{
	unsigned char *d = malloc(len);

	cr_assert(d);
	fm_fill_random(&seed, d, len);
	return d;
}

/* Writes path with fsync (fsync=remote: the store has it when it returns). */
static void write_synced(const char *path, const void *data, size_t len)
{
	int fd = OK(open(path, O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0644));

	fm_pwrite_all(fd, data, len, 0);
	OK(fsync(fd));
	OK(close(fd));
}

/* 500s and 503 SlowDown on uploads are retried: fsync succeeds and the
 * bytes are there after a cold remount. */
Test(store_faults, uploads_ride_out_500_and_slowdown)
{
	unsigned char *a = pattern(3 * MiB, 1), *b = pattern(MiB, 2);

	s3_proxy_fault(proxy, S3F_500, 3, "PUT", "/chunks/");
	write_synced(mp("a"), a, 3 * MiB);
	cr_assert_eq(s3_proxy_faults_done(proxy), 3);
	s3_proxy_fault(proxy, S3F_503, 2, "PUT", "/chunks/");
	write_synced(mp("b"), b, MiB);
	cr_assert_eq(s3_proxy_faults_done(proxy), 5);
	fm_remount_cold();
	fm_expect_content(mp("a"), a, 3 * MiB);
	fm_expect_content(mp("b"), b, MiB);
	free(a);
	free(b);
}

/* Downloads cut by a reset, ended short or answered 500 are retried: the
 * read returns the right bytes. */
Test(store_faults, downloads_ride_out_resets_and_short_bodies)
{
	unsigned char *a = pattern(2 * MiB, 3);
	static const enum s3_fault kinds[] = { S3F_RESET, S3F_SHORT, S3F_500, S3F_503 };

	write_synced(mp("a"), a, 2 * MiB);
	for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++) {
		unsigned done = s3_proxy_faults_done(proxy);

		fm_remount_cold();
		s3_proxy_fault(proxy, kinds[i], 1, "GET", "/chunks/");
		fm_expect_content(mp("a"), a, 2 * MiB);
		cr_assert_eq(s3_proxy_faults_done(proxy), done + 1, "fault %zu never happened", i);
	}
	free(a);
}

/* A damaged body (one byte flipped) is never returned: while every answer
 * is damaged the read fails with EIO (the kernel asks again once itself),
 * and once the store is sound again the read returns the right bytes. */
Test(store_faults, damaged_download_is_eio_never_wrong_bytes)
{
	unsigned char *a = pattern(MiB, 4), buf[4096];
	int fd;

	write_synced(mp("a"), a, MiB);
	fm_remount_cold();
	fd = OK(open(mp("a"), O_RDONLY | O_CLOEXEC));
	s3_proxy_fault(proxy, S3F_GARBLE, 1000, "GET", "/chunks/");
	FAILS(pread(fd, buf, sizeof(buf), 0), EIO);
	cr_assert_geq(s3_proxy_faults_done(proxy), 1);
	s3_proxy_fault(proxy, S3F_NONE, 0, NULL, NULL);
	cr_assert_eq(OK(pread(fd, buf, sizeof(buf), 0)), (ssize_t)sizeof(buf));
	cr_assert(memcmp(buf, a, sizeof(buf)) == 0, "wrong bytes after the store came right");
	OK(close(fd));
	fm_expect_content(mp("a"), a, MiB);
	free(a);
}

/* A bucket that disappears: fsync says EIO and keeps the data staged; when
 * the bucket is back the reconciler commits it, and it reads back. */
Test(store_faults, vanished_bucket_then_back)
{
	unsigned char *a = pattern(MiB, 5);
	struct fm_stats s;
	int fd;

	s3_proxy_fault(proxy, S3F_NO_BUCKET, 1000000, NULL, NULL);
	fd = OK(open(mp("a"), O_CREAT | O_WRONLY | O_CLOEXEC, 0644));
	fm_pwrite_all(fd, a, MiB, 0);
	FAILS(fsync(fd), EIO);
	OK(close(fd)); /* staged and journaled on the node */
	/* Handed over first: the staging gauge is 0 before the handoff too. */
	fm_wait_released(0);
	s3_proxy_fault(proxy, S3F_NONE, 0, NULL, NULL);
	for (int i = 0; i < 600; i++) {
		fm_stats_read(&s);
		if (fm_stats_need(&s, "passthrough_staging_blocks") == 0)
			break;
		usleep(100 * 1000);
	}
	cr_assert_eq(fm_stats_need(&s, "passthrough_staging_blocks"), 0, "never committed");
	fm_remount_cold();
	fm_expect_content(mp("a"), a, MiB);
	free(a);
}

static volatile sig_atomic_t got_usr1;

static void on_usr1(int sig)
{
	(void)sig;
	got_usr1 = 1;
}

/* In a child: reads path whole and writes what read() returned (or
 * -errno) to fd out. O_DIRECT: the READ is the caller's own request, which
 * FUSE_INTERRUPT reaches (a page-cache read would wait on a readahead
 * request that no signal interrupts). */
static void reader(const char *path, size_t len, int out)
{
	struct sigaction sa = { .sa_handler = on_usr1 }; /* no SA_RESTART */
	void *buf = NULL;
	long rc;
	int fd;

	prctl(PR_SET_PDEATHSIG, SIGKILL);
	sigaction(SIGUSR1, &sa, NULL);
	if (posix_memalign(&buf, 4096, len) != 0)
		_exit(4);
	fd = open(path, O_RDONLY | O_DIRECT | O_CLOEXEC);
	rc = fd < 0 ? -errno : (long)read(fd, buf, len);
	if (rc < 0 && fd >= 0)
		rc = -errno;
	(void)!write(out, &rc, sizeof(rc));
	_exit(got_usr1 ? 0 : 3);
}

static bool wait_stalled(void)
{
	for (int i = 0; i < 200; i++) {
		if (s3_proxy_stalled(proxy) > 0)
			return true;
		usleep(50 * 1000);
	}
	return false;
}

/*
 * FUSE_INTERRUPT (mountd/caller.c): a read the store holds up is not cut
 * short by a signal (the caller gets its bytes when the store answers),
 * and a caller killed while it waits is let go at once -- the daemon
 * answers the request instead of holding it until the store's timeout.
 */
Test(store_faults, held_read_signal_waits_sigkill_lets_go)
{
	unsigned char *a = pattern(MiB, 6);
	int p[2], status;
	long rc = 0;
	pid_t pid;
	struct timespec t0, t1;

	write_synced(mp("a"), a, MiB);

	/* A signal: the read waits on, then returns every byte. */
	fm_remount_cold();
	s3_proxy_fault(proxy, S3F_STALL, 1, "GET", "/chunks/");
	cr_assert(pipe2(p, O_CLOEXEC) == 0);
	pid = fork();
	cr_assert(pid >= 0);
	if (pid == 0)
		reader(mp("a"), MiB, p[1]);
	close(p[1]);
	cr_assert(wait_stalled(), "the read never reached the store");
	kill(pid, SIGUSR1);
	usleep(500 * 1000);
	cr_assert_eq(waitpid(pid, &status, WNOHANG), 0, "the read ended on a signal");
	s3_proxy_release(proxy); /* the held GET fails; its retry goes through */
	cr_assert_eq(read(p[0], &rc, sizeof(rc)), (ssize_t)sizeof(rc));
	close(p[0]);
	cr_assert_eq(rc, MiB, "read after a signal: %ld (%s)", rc, rc < 0 ? fm_errname((int)-rc) : "");
	cr_assert(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && !WEXITSTATUS(status),
		  "the reader did not take the signal (status 0x%x)", status);

	/* SIGKILL: the caller is let go long before the store's 30 s timeout. */
	fm_remount_cold();
	s3_proxy_fault(proxy, S3F_STALL, 1000, "GET", "/chunks/");
	pid = fork();
	cr_assert(pid >= 0);
	if (pid == 0) {
		int devnull = open("/dev/null", O_WRONLY | O_CLOEXEC);
		reader(mp("a"), MiB, devnull);
	}
	cr_assert(wait_stalled(), "the read never reached the store");
	clock_gettime(CLOCK_MONOTONIC, &t0);
	kill(pid, SIGKILL);
	for (int i = 0; i < 100 && waitpid(pid, &status, WNOHANG) == 0; i++)
		usleep(100 * 1000);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	if (kill(pid, 0) == 0 && waitpid(pid, &status, WNOHANG) == 0) {
		/* Let the store answer so the test can end, then fail. */
		s3_proxy_fault(proxy, S3F_NONE, 0, NULL, NULL);
		s3_proxy_release(proxy);
		waitpid(pid, &status, 0);
		cr_assert_fail("a killed reader was still held after %ld s",
			       (long)(t1.tv_sec - t0.tv_sec));
	}
	cr_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
	/* ...because the daemon gave the store's request up (curl closes it). */
	for (int i = 0; i < 40 && s3_proxy_stalled(proxy) > 0; i++)
		usleep(50 * 1000);
	cr_assert_eq(s3_proxy_stalled(proxy), 0, "the daemon still holds the store's request");
	/* Nothing was left behind: the store comes back and the file reads
	 * whole. */
	s3_proxy_fault(proxy, S3F_NONE, 0, NULL, NULL);
	s3_proxy_release(proxy);
	fm_expect_content(mp("a"), a, MiB);
	free(a);
}
