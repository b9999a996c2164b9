/*
 * Signals never make an ordinary call fail (caller.c). A child takes a
 * timer signal every millisecond -- Go programs take SIGURG every 10 ms --
 * with its handler installed without and with SA_RESTART, while it
 * creates, writes, fsyncs, closes, stats, renames, reads, unlinks, makes
 * and removes directories on the mount. Every call must succeed as it does
 * on ext4: no EINTR, and no ENOENT or EEXIST from a first attempt that was
 * applied and reported as failed. The same loop on the scratch directory
 * (ext4) is the control: it shows the loop itself cannot fail.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "mount_util.h"

TestSuite(signals, .init = fm_setup, .fini = fm_teardown, .timeout = 120);

enum { OP_CREATE, OP_WRITE, OP_FSYNC, OP_CLOSE, OP_STAT, OP_RENAME, OP_OPEN, OP_READ,
       OP_UNLINK, OP_MKDIR, OP_RMDIR, OP_N };
static const char *const op_name[OP_N] = { "create", "write", "fsync", "close", "stat",
	"rename", "open", "read", "unlink", "mkdir", "rmdir" };

struct tally {
	long fails[OP_N];
	int first_errno[OP_N];
	long rounds, signals;
};

static volatile sig_atomic_t nsig;

static void on_alarm(int sig)
{
	(void)sig;
	nsig++;
}

static void fail(struct tally *t, int op)
{
	if (!t->fails[op]++)
		t->first_errno[op] = errno;
}

/* The loop, in the child: one round per name, for secs seconds. */
static void churn(const char *dir, bool restart, double secs, struct tally *t)
{
	struct sigaction sa = { .sa_handler = on_alarm, .sa_flags = restart ? SA_RESTART : 0 };
	struct itimerval it = { { 0, 1000 }, { 0, 1000 } };
	struct timespec t0, now;
	static char buf[8192];
	char a[PATH_MAX], b[PATH_MAX], d[PATH_MAX];

	memset(buf, 'q', sizeof(buf));
	sigaction(SIGALRM, &sa, NULL);
	setitimer(ITIMER_REAL, &it, NULL);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (long i = 0;; i++) {
		struct stat st;
		int fd;

		clock_gettime(CLOCK_MONOTONIC, &now);
		if ((double)(now.tv_sec - t0.tv_sec) + (double)(now.tv_nsec - t0.tv_nsec) / 1e9 > secs)
			break;
		t->rounds++;
		snprintf(a, sizeof(a), "%s/f%ld", dir, i % 32);
		snprintf(b, sizeof(b), "%s/g%ld", dir, i % 32);
		snprintf(d, sizeof(d), "%s/d%ld", dir, i % 32);
		fd = open(a, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0644);
		if (fd < 0) {
			fail(t, OP_CREATE);
			unlink(a);
			continue;
		}
		if (write(fd, buf, sizeof(buf)) != (ssize_t)sizeof(buf))
			fail(t, OP_WRITE);
		if (fsync(fd) < 0)
			fail(t, OP_FSYNC);
		if (close(fd) < 0)
			fail(t, OP_CLOSE);
		if (stat(a, &st) < 0 || st.st_size != (off_t)sizeof(buf))
			fail(t, OP_STAT);
		if (rename(a, b) < 0) {
			fail(t, OP_RENAME);
			rename(a, b);
		}
		fd = open(b, O_RDONLY | O_CLOEXEC);
		if (fd < 0) {
			fail(t, OP_OPEN);
		} else {
			if (read(fd, buf, sizeof(buf)) != (ssize_t)sizeof(buf))
				fail(t, OP_READ);
			close(fd);
		}
		if (unlink(b) < 0) {
			fail(t, OP_UNLINK);
			unlink(b);
		}
		if (mkdir(d, 0755) < 0)
			fail(t, OP_MKDIR);
		if (rmdir(d) < 0) {
			fail(t, OP_RMDIR);
			rmdir(d);
		}
	}
	it = (struct itimerval){ { 0, 0 }, { 0, 0 } };
	setitimer(ITIMER_REAL, &it, NULL);
	t->signals = nsig;
}

/* Runs churn() in a child (so the signals hit only it) and returns its
 * tally. */
static struct tally run(const char *dir, bool restart, double secs)
{
	struct tally t = { 0 };
	int p[2], status;
	pid_t pid;

	cr_assert(pipe2(p, O_CLOEXEC) == 0);
	pid = fork();
	cr_assert(pid >= 0);
	if (pid == 0) {
		churn(dir, restart, secs, &t);
		_exit(write(p[1], &t, sizeof(t)) == (ssize_t)sizeof(t) ? 0 : 1);
	}
	close(p[1]);
	cr_assert_eq(read(p[0], &t, sizeof(t)), (ssize_t)sizeof(t));
	close(p[0]);
	cr_assert(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && !WEXITSTATUS(status));
	return t;
}

static void check(const char *where, const struct tally *t)
{
	char why[1024] = "";
	size_t n = 0;
	long total = 0;

	for (int i = 0; i < OP_N; i++) {
		if (!t->fails[i])
			continue;
		total += t->fails[i];
		n += (size_t)snprintf(why + n, n < sizeof(why) ? sizeof(why) - n : 0, " %s %ld (%s)",
				      op_name[i], t->fails[i], fm_errname(t->first_errno[i]));
	}
	cr_log_info("%s: %ld rounds, %ld signals, %ld failures", where, t->rounds, t->signals,
		    total);
	cr_assert(t->signals > 100, "%s: the signals did not come (%ld)", where, t->signals);
	cr_assert(t->rounds > 20, "%s: only %ld rounds", where, t->rounds);
	cr_assert_eq(total, 0, "%s: calls failed under signals:%s", where, why);
}

Test(signals, no_call_fails_without_sa_restart)
{
	struct tally t;

	OK(mkdir(sp("ext4"), 0755));
	t = run(sp("ext4"), false, 1.0);
	check("the scratch directory (control)", &t);
	t = run(fm.mnt, false, 4.0);
	check("ferryfs, handler without SA_RESTART", &t);
}

Test(signals, no_call_fails_with_sa_restart)
{
	struct tally t = run(fm.mnt, true, 4.0);

	check("ferryfs, handler with SA_RESTART", &t);
}
