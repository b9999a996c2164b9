/*
 * Reconciler client helpers for the integration tests: see
 * reconciler_client_util.h.
 */
#include "reconciler_client_util.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "rpc_frame.h"

static const char *rcu_bin(void)
{
	static char buf[4096];
	const char *dir = getenv("FERRY_BIN_DIR");

	snprintf(buf, sizeof(buf), "%s/ferry-reconciler", dir && *dir ? dir : FERRY_BIN_DIR);
	return buf;
}

void rcu_init(struct rcu *r, const char *volume, const char *staging, const char *sock,
	      const char *log)
{
	memset(r, 0, sizeof(*r));
	r->pid = -1;
	snprintf(r->volume, sizeof(r->volume), "%s", volume);
	snprintf(r->staging, sizeof(r->staging), "%s", staging);
	snprintf(r->sock, sizeof(r->sock), "%s", sock);
	snprintf(r->log, sizeof(r->log), "%s", log);
	cr_assert(mkdir(staging, 0700) == 0 || errno == EEXIST, "mkdir %s: %s", staging,
		  strerror(errno));
	r->staging_fd = open(staging, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	cr_assert(r->staging_fd >= 0);
}

bool rcu_alive(const struct rcu *r)
{
	return r->pid > 0 && kill(r->pid, 0) == 0 && waitpid(r->pid, NULL, WNOHANG) == 0;
}

void rcu_start(struct rcu *r)
{
	const char *argv[32];
	int a = 0;
	pid_t parent = getpid();

	argv[a++] = rcu_bin();
	argv[a++] = "-f";
	argv[a++] = "--volume";
	argv[a++] = r->volume;
	argv[a++] = "--staging-dir";
	argv[a++] = r->staging;
	argv[a++] = "--socket";
	argv[a++] = r->sock;
	for (int i = 0; r->extra[i] && a < 30; i++)
		argv[a++] = r->extra[i];
	argv[a] = NULL;
	r->pid = fork();
	cr_assert(r->pid >= 0);
	if (r->pid == 0) {
		int fd = open(r->log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
		int in = open("/dev/null", O_RDONLY | O_CLOEXEC);

		/* Never outlive the test. */
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent)
			_exit(1);
		dup2(in, 0);
		dup2(fd, 1);
		dup2(fd, 2);
		close_range(3, ~0U, 0); /* the test runner's own fds */
		if (r->nofile) {
			struct rlimit l = { r->nofile, r->nofile };

			if (setrlimit(RLIMIT_NOFILE, &l) < 0)
				_exit(126);
		}
		execv(argv[0], (char *const *)argv);
		_exit(127);
	}
	for (int i = 0; i < 400; i++) {
		int s;

		if (reconcile_connect(r->sock, &s) == 0) {
			close(s);
			return;
		}
		if (!rcu_alive(r))
			break;
		usleep(25000);
	}
	char *log = NULL;
	FILE *f = fopen(r->log, "re");
	if (f) {
		size_t n = 0;
		ssize_t got = getdelim(&log, &n, '\0', f);
		(void)got;
		fclose(f);
	}
	cr_assert_fail("ferry-reconciler did not start; its log:\n%s", log ? log : "(none)");
}

int rcu_stop(struct rcu *r, int sig)
{
	int st = 0;

	if (r->pid <= 0)
		return -1;
	kill(r->pid, sig);
	for (int i = 0; i < 1200; i++) {
		pid_t w = waitpid(r->pid, &st, WNOHANG);
		if (w == r->pid) {
			r->pid = -1;
			return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
		}
		usleep(50000);
	}
	kill(r->pid, SIGKILL);
	waitpid(r->pid, &st, 0);
	r->pid = -1;
	cr_assert_fail("ferry-reconciler did not stop within 60 s of signal %d", sig);
	return -1;
}

void rcu_fini(struct rcu *r)
{
	if (r->pid > 0) {
		kill(r->pid, SIGKILL);
		waitpid(r->pid, NULL, 0);
		r->pid = -1;
	}
	if (r->staging_fd >= 0)
		close(r->staging_fd);
	r->staging_fd = -1;
}

int rcu_connect(const struct rcu *r)
{
	int s = -1, rc = reconcile_connect(r->sock, &s);

	cr_assert_eq(rc, 0, "connect %s: %s", r->sock, strerror(-rc));
	return s;
}

void rcu_stage(const struct rcu *r, const char *name, const void *data, size_t len)
{
	int fd = openat(r->staging_fd, name, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	size_t done = 0;

	cr_assert(fd >= 0, "create %s: %s", name, strerror(errno));
	while (data && done < len) {
		ssize_t n = write(fd, (const char *)data + done, len - done);
		cr_assert(n > 0, "write %s: %s", name, strerror(errno));
		done += (size_t)n;
	}
	cr_assert_eq(ftruncate(fd, (off_t)len), 0);
	close(fd);
}

void rcu_job(struct reconcile_job *j, uint64_t seq, uint64_t ino, uint64_t length, const char *name)
{
	memset(j, 0, sizeof(*j));
	j->seq = seq;
	j->ino = ino;
	j->length = length;
	clock_gettime(CLOCK_REALTIME, &j->mtime);
	snprintf(j->name, sizeof(j->name), "%s", name);
}

/* The record of j on fd (see rcu_handoff). */
static void record(const struct rcu *r, int fd, const struct reconcile_job *j)
{
	bool in_xattr = false;
	int rc;

	if (j->seq % 2)
		rc = reconcile_job_write(r->staging_fd, j, 0);
	else
		rc = reconcile_job_attach(r->staging_fd, fd, j, &in_xattr);
	cr_assert_eq(rc, 0, "journal record of %s: %s", j->name, strerror(-rc));
	cr_assert(j->seq % 2 || in_xattr, "no xattr record on %s", j->name);
}

void rcu_record(const struct rcu *r, const struct reconcile_job *j)
{
	int fd = openat(r->staging_fd, j->name, O_RDONLY | O_CLOEXEC);

	cr_assert(fd >= 0, "open %s: %s", j->name, strerror(errno));
	record(r, fd, j);
	close(fd);
}

void rcu_handoff(const struct rcu *r, int sock, const struct reconcile_job *j)
{
	int fd, rc;

	fd = openat(r->staging_fd, j->name, O_RDONLY | O_CLOEXEC);
	cr_assert(fd >= 0, "open %s: %s", j->name, strerror(errno));
	record(r, fd, j);
	rc = reconcile_handoff(sock, j, fd);
	cr_assert_eq(rc, 0, "handoff of %s: %s", j->name, strerror(-rc));
	close(fd);
}

int rcu_wait_committed(int sock, uint64_t seq)
{
	struct reconcile_reply rep;

	for (;;) {
		int rc = reconcile_recv_reply(sock, &rep);
		cr_assert_eq(rc, 0, "waiting for seq %llu: %s", (unsigned long long)seq,
			     strerror(-rc));
		cr_assert_neq(rep.type, RECONCILE_REPLY_ERROR, "error reply: %s", rep.message);
		if (rep.type == RECONCILE_REPLY_COMMITTED && rep.seq == seq)
			return rep.error;
	}
}

void rcu_wait_range(int sock, uint64_t first, int n, int *errs)
{
	bool *seen = calloc((size_t)n, sizeof(*seen));
	int left = n;

	while (left > 0) {
		struct reconcile_reply rep;
		int rc = reconcile_recv_reply(sock, &rep);

		cr_assert_eq(rc, 0, "waiting for %d more replies: %s", left, strerror(-rc));
		cr_assert_neq(rep.type, RECONCILE_REPLY_ERROR, "error reply: %s", rep.message);
		if (rep.type != RECONCILE_REPLY_COMMITTED || rep.seq < first ||
		    rep.seq >= first + (uint64_t)n)
			continue;
		cr_assert(!seen[rep.seq - first], "two replies for seq %llu",
			  (unsigned long long)rep.seq);
		seen[rep.seq - first] = true;
		left--;
		if (errs)
			errs[rep.seq - first] = rep.error;
		else
			cr_assert_eq(rep.error, 0, "seq %llu: %s (%s)", (unsigned long long)rep.seq,
				     strerror(-rep.error), rep.message);
	}
	free(seen);
}

void rcu_stats(const struct rcu *r, struct reconcile_stats *s)
{
	struct reconcile_reply rep;
	int sock = rcu_connect(r);

	cr_assert_eq(reconcile_stats_query(sock), 0);
	cr_assert_eq(reconcile_recv_reply(sock, &rep), 0);
	cr_assert_eq(rep.type, RECONCILE_REPLY_STATS);
	*s = rep.stats;
	close(sock);
}

static bool has_suffix(const char *s, const char *suffix)
{
	size_t n = strlen(s), k = strlen(suffix);
	return n >= k && strcmp(s + n - k, suffix) == 0;
}

int rcu_count(const struct rcu *r, const char *suffix)
{
	DIR *d = opendir(r->staging);
	struct dirent *de;
	int n = 0;

	cr_assert(d);
	while ((de = readdir(d)))
		if (de->d_name[0] != '.' && has_suffix(de->d_name, suffix))
			n++;
	closedir(d);
	return n;
}

int rcu_count_attached(const struct rcu *r)
{
	DIR *d = opendir(r->staging);
	struct dirent *de;
	int n = 0;

	cr_assert(d);
	while ((de = readdir(d))) {
		int fd = openat(r->staging_fd, de->d_name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW |
						       O_NONBLOCK);
		if (fd >= 0 && reconcile_job_attached(fd) == 1)
			n++;
		if (fd >= 0)
			close(fd);
	}
	closedir(d);
	return n;
}

char rcu_fd_list[8192];

int rcu_nfds(const struct rcu *r)
{
	char path[64];
	DIR *d;
	struct dirent *de;
	int n = 0;

	rcu_fd_list[0] = '\0';
	snprintf(path, sizeof(path), "/proc/%d/fd", (int)r->pid);
	d = opendir(path);
	cr_assert(d);
	while ((de = readdir(d))) {
		char link[320], target[4096];
		ssize_t k;

		if (de->d_name[0] == '.')
			continue;
		snprintf(link, sizeof(link), "%s/%s", path, de->d_name);
		k = readlink(link, target, sizeof(target) - 1);
		target[k > 0 ? k : 0] = '\0';
		/* Each worker thread opens its own database connection when it
		 * first needs one: not a leak. */
		if (strstr(target, "meta.db"))
			continue;
		n++;
		if (strlen(rcu_fd_list) + strlen(target) + 2 < sizeof(rcu_fd_list)) {
			strcat(rcu_fd_list, target);
			strcat(rcu_fd_list, "\n");
		}
	}
	closedir(d);
	return n;
}

int rcu_nfds_settled(const struct rcu *r)
{
	int n = rcu_nfds(r), same = 0;

	for (int i = 0; i < 200 && same < 3; i++) {
		int m;

		usleep(50000);
		m = rcu_nfds(r);
		same = m == n ? same + 1 : 0;
		n = m;
	}
	return n;
}
