/*
 * The ferry-brokerd fixture (broker_fixture_util.h).
 */
#include "broker_fixture_util.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <grp.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "broker.pb-c.h"
#include "rpc_frame.h"

struct bk_fixture bk;

/* ---- small helpers ---- */

const char *bp(const char *fmt, ...)
{
	static _Thread_local char ring[16][PATH_MAX];
	static _Thread_local int next;
	char *out = ring[next++ % 16], rel[1024];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(rel, sizeof(rel), fmt, ap);
	va_end(ap);
	snprintf(out, PATH_MAX, "%s/%s", bk.dir, rel);
	return out;
}

void mkdir_owned(const char *path, uid_t uid, mode_t mode)
{
	cr_assert(mkdir(path, mode) == 0, "mkdir %s: %s", path, strerror(errno));
	cr_assert(chown(path, uid, uid) == 0);
	cr_assert(chmod(path, mode) == 0);
}

void write_text(const char *path, const char *text, uid_t uid, mode_t mode)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);

	cr_assert(fd >= 0, "%s: %s", path, strerror(errno));
	cr_assert(write(fd, text, strlen(text)) == (ssize_t)strlen(text));
	cr_assert(fchown(fd, uid, uid) == 0);
	cr_assert(fchmod(fd, mode) == 0);
	close(fd);
}

void log_tail(void)
{
	char *t = fm_slurp(bk.log);

	if (t) {
		size_t n = strlen(t);
		fprintf(stderr, "---- broker log (tail) ----\n%s\n",
			n > 6000 ? t + n - 6000 : t);
		free(t);
	}
}

/* ---- the broker process ---- */

int try_status(const char *path, struct broker_status *st)
{
	struct broker_conn *c;
	int rc = broker_connect(path, &c);

	if (rc < 0)
		return rc;
	broker_set_timeout(c, 5000);
	rc = broker_status(c, st);
	broker_close(c);
	return rc;
}

void broker_start_args(const char *const *args)
{
	struct broker_status st;
	const char *argv[32];
	int i, n = 0, rc = -1;
	pid_t pid;

	if (bk.new_mount_ns) {
		argv[n++] = "/usr/bin/unshare";
		argv[n++] = "--mount";
		argv[n++] = "--propagation";
		argv[n++] = "unchanged";
	}
	argv[n++] = fm_bin("ferry-brokerd");
	argv[n++] = "--socket";
	argv[n++] = bk.sock;
	argv[n++] = "--policy";
	argv[n++] = bk.policy;
	argv[n++] = "--state-dir";
	argv[n++] = bk.state;
	/* FERRY_IT_BROKER_DEBUG=1: every request in the log. */
	if (getenv("FERRY_IT_BROKER_DEBUG"))
		argv[n++] = "-v";
	for (i = 0; args && args[i] && n < 31; i++)
		argv[n++] = args[i];
	argv[n] = NULL;

	pid = fork();
	cr_assert(pid >= 0);
	if (pid == 0) {
		int log = open(bk.log, O_WRONLY | O_CREAT | O_APPEND, 0644);
		/* A stray fd the broker must close at start. */
		int stray = open("/dev/null", O_RDONLY);

		if (log < 0 || dup2(log, 1) < 0 || dup2(log, 2) < 0 || dup2(stray, 50) < 0)
			_exit(126);
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		execv(argv[0], (char *const *)argv);
		_exit(127);
	}
	bk.pid = pid;
	for (i = 0; i < 500; i++) {
		if (waitpid(pid, NULL, WNOHANG) == pid) {
			bk.pid = 0;
			log_tail();
			cr_assert_fail("ferry-brokerd exited at start");
		}
		rc = try_status(bk.sock, &st);
		if (rc == 0)
			break;
		usleep(10000);
	}
	if (rc != 0)
		log_tail();
	cr_assert_eq(rc, 0, "ferry-brokerd does not answer on %s: %s", bk.sock, strerror(-rc));
}

void broker_start(void)
{
	broker_start_args(bk.args);
}

void broker_kill(int sig)
{
	int status;

	if (bk.pid <= 0)
		return;
	kill(bk.pid, sig);
	for (int i = 0; i < 500; i++) {
		if (waitpid(bk.pid, &status, WNOHANG) == bk.pid) {
			bk.pid = 0;
			return;
		}
		usleep(10000);
	}
	kill(bk.pid, SIGKILL);
	waitpid(bk.pid, &status, 0);
	bk.pid = 0;
}

void write_policy(const char *text)
{
	FILE *f = fopen(bk.policy, "w");

	cr_assert(f);
	fputs(text, f);
	fclose(f);
}

void default_policy(void)
{
	char text[4096];

	snprintf(text, sizeof(text),
		 "# test policy\n"
		 "allow uid=%d root=%s max_mounts=3 max_backing=256\n"
		 "allow uid=%d root=%s max_mounts=2 max_backing=2 allow_other=1\n",
		 PEER, bk.root, PEER2, bk.root2);
	write_policy(text);
}

static void make_tree(void)
{
	snprintf(bk.dir, sizeof(bk.dir), "/tmp/ferry-broker.XXXXXX");
	cr_assert(mkdtemp(bk.dir), "mkdtemp: %s", strerror(errno));
	cr_assert(chmod(bk.dir, 0755) == 0);
	snprintf(bk.sock, sizeof(bk.sock), "%s/broker.sock", bk.dir);
	snprintf(bk.state, sizeof(bk.state), "%s/state", bk.dir);
	snprintf(bk.policy, sizeof(bk.policy), "%s/policy", bk.dir);
	snprintf(bk.log, sizeof(bk.log), "%s/broker.log", bk.dir);
	snprintf(bk.root, sizeof(bk.root), "%s/root", bk.dir);
	snprintf(bk.root2, sizeof(bk.root2), "%s/root2", bk.dir);
	snprintf(bk.outside, sizeof(bk.outside), "%s/outside", bk.dir);
	mkdir_owned(bk.root, 0, 0755);
	mkdir_owned(bk.root2, 0, 0755);
	mkdir_owned(bk.outside, PEER, 0755);
	mkdir_owned(bp("root/m1"), PEER, 0755);
	mkdir_owned(bp("root/m2"), PEER, 0755);
	mkdir_owned(bp("root/m3"), PEER, 0755);
	mkdir_owned(bp("root/m4"), PEER, 0755);
	mkdir_owned(bp("root/rootowned"), 0, 0755);
	mkdir_owned(bp("root/other"), STRANGER, 0755);
	mkdir_owned(bp("root/real"), PEER, 0755);
	mkdir_owned(bp("root/real/x"), PEER, 0755);
	mkdir_owned(bp("root2/n1"), PEER2, 0755);
	mkdir_owned(bp("root2/n2"), PEER2, 0755);
	cr_assert(symlink("../outside", bp("root/link")) == 0);
	cr_assert(symlink("real", bp("root/mid")) == 0);
	cr_assert(symlink(bp("root/m1"), bp("root/abslink")) == 0); /* inside, still refused */
}

static int rm_cb(const char *path, const struct stat *st, int type, struct FTW *ftw)
{
	(void)st;
	(void)type;
	(void)ftw;
	remove(path);
	return 0;
}

int unmount_all(void)
{
	char *mi = fm_slurp("/proc/self/mountinfo"), *line, *save = NULL;
	char points[64][PATH_MAX];
	int n = 0;

	if (!mi)
		return 0;
	for (line = strtok_r(mi, "\n", &save); line && n < 64; line = strtok_r(NULL, "\n", &save)) {
		char point[PATH_MAX];

		if (sscanf(line, "%*u %*u %*u:%*u %*s %4095s", point) == 1 &&
		    !strncmp(point, bk.dir, strlen(bk.dir)) && point[strlen(bk.dir)] == '/')
			snprintf(points[n++], PATH_MAX, "%s", point);
	}
	free(mi);
	for (int i = n - 1; i >= 0; i--)
		umount2(points[i], MNT_DETACH);
	return n;
}

/* Through a private fusectl mount, so nothing can stay stuck waiting for a
 * test's server. */
void abort_fuse_beneath(void)
{
	char *mi = fm_slurp("/proc/self/mountinfo"), *line, *save = NULL;
	int fs = fsopen("fusectl", FSOPEN_CLOEXEC), ctl = -1;

	if (fs >= 0 && fsconfig(fs, FSCONFIG_CMD_CREATE, NULL, NULL, 0) == 0)
		ctl = fsmount(fs, FSMOUNT_CLOEXEC, 0);
	for (line = mi ? strtok_r(mi, "\n", &save) : NULL; line && ctl >= 0;
	     line = strtok_r(NULL, "\n", &save)) {
		char point[PATH_MAX], path[64];
		unsigned ma, mi_;
		int fd;

		if (sscanf(line, "%*u %*u %u:%u %*s %4095s", &ma, &mi_, point) != 3 ||
		    strncmp(point, bk.dir, strlen(bk.dir)) || !strstr(line, " - fuse"))
			continue;
		snprintf(path, sizeof(path), "%u/abort", (ma << 20) | mi_);
		fd = openat(ctl, path, O_WRONLY | O_CLOEXEC);
		if (fd >= 0) {
			(void)!write(fd, "1", 1);
			close(fd);
		}
	}
	if (ctl >= 0)
		close(ctl);
	if (fs >= 0)
		close(fs);
	free(mi);
}

void bk_setup(void)
{
	struct broker_status st;

	memset(&bk, 0, sizeof(bk));
	make_tree();
	default_policy();
	broker_start();
	/* The idle count: the least of a few looks, as the socket of the
	 * connection before may still be closing (off the broker's loop) when
	 * the next one asks. */
	bk.fds0 = UINT64_MAX;
	for (int i = 0; i < 5; i++) {
		cr_assert_eq(try_status(bk.sock, &st), 0);
		if (st.fds < bk.fds0)
			bk.fds0 = st.fds;
		usleep(20000);
	}
}

void bk_child(pid_t pid)
{
	if (bk.n_kids < sizeof(bk.kids) / sizeof(bk.kids[0]))
		bk.kids[bk.n_kids++] = pid;
}

void bk_reap_children(void)
{
	for (size_t i = 0; i < bk.n_kids; i++) {
		int status;

		/* Reaped already (by the test): not ours to signal any more. */
		if (waitpid(bk.kids[i], &status, WNOHANG) != 0)
			continue;
		kill(bk.kids[i], SIGKILL);
		for (int t = 0; t < 500; t++) {
			if (waitpid(bk.kids[i], &status, WNOHANG) != 0)
				break;
			usleep(10000);
		}
	}
	bk.n_kids = 0;
}

void bk_teardown(void)
{
	if (bk.dir[0])
		abort_fuse_beneath();
	/* Before the tree goes: a child still renaming in it would leave
	 * some of it behind. */
	bk_reap_children();
	broker_kill(SIGTERM);
	unmount_all();
	if (bk.dir[0])
		nftw(bk.dir, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
}

/* ---- peers ---- */

static int drop_to(uid_t uid, gid_t gid)
{
	return setgroups(0, NULL) || setresgid(gid, gid, gid) || setresuid(uid, uid, uid) ? -1 : 0;
}

static void sock_addr(struct sockaddr_un *sa)
{
	memset(sa, 0, sizeof(*sa));
	sa->sun_family = AF_UNIX;
	snprintf(sa->sun_path, sizeof(sa->sun_path), "%s", bk.sock);
}

int connect_raw(uid_t uid, gid_t gid)
{
	struct sockaddr_un sa;
	int sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0), status;
	pid_t pid;

	cr_assert(sock >= 0);
	sock_addr(&sa);
	pid = fork();
	cr_assert(pid >= 0);
	if (pid == 0) {
		struct broker_conn *c;
		struct broker_status st;

		if (drop_to(uid, gid) < 0)
			_exit(2);
		if (connect(sock, (struct sockaddr *)&sa, sizeof(sa)) < 0)
			_exit(3);
		/* Once this is answered the broker has taken us, alive. */
		if (broker_adopt(dup(sock), &c) < 0)
			_exit(4);
		broker_set_timeout(c, 10000);
		if (broker_status(c, &st) < 0)
			_exit(4);
		broker_close(c);
		_exit(0);
	}
	cr_assert(waitpid(pid, &status, 0) == pid);
	cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0,
		  "connecting as uid %d failed (status 0x%x)", (int)uid, status);
	return sock;
}

struct broker_conn *connect_as(uid_t uid, gid_t gid)
{
	struct broker_conn *c;

	cr_assert_eq(broker_adopt(connect_raw(uid, gid), &c), 0);
	return c;
}

void connect_only_n(uid_t uid, gid_t gid, int *socks, size_t n)
{
	struct sockaddr_un sa;
	int status;
	pid_t pid;

	sock_addr(&sa);
	for (size_t i = 0; i < n; i++) {
		socks[i] = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
		cr_assert(socks[i] >= 0, "socket: %s", strerror(errno));
	}
	pid = fork();
	cr_assert(pid >= 0);
	if (pid == 0) {
		/* A broker that stops accepting must not hang the test. */
		alarm(20);
		if (drop_to(uid, gid) < 0)
			_exit(2);
		for (size_t i = 0; i < n; i++)
			if (connect(socks[i], (struct sockaddr *)&sa, sizeof(sa)) < 0)
				_exit(3);
		_exit(0);
	}
	cr_assert(waitpid(pid, &status, 0) == pid);
	cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0,
		  "connecting %zu sockets as uid %d failed (status 0x%x)", n, (int)uid, status);
}

int connect_only(uid_t uid, gid_t gid)
{
	int sock;

	connect_only_n(uid, gid, &sock, 1);
	return sock;
}

struct broker_conn *connect_as_within(uid_t uid, gid_t gid, int timeout_ms)
{
	struct timespec t0, t;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (;;) {
		struct broker_conn *c;
		struct broker_status st;

		cr_assert_eq(broker_adopt(connect_only(uid, gid), &c), 0);
		broker_set_timeout(c, 2000);
		if (broker_status(c, &st) == 0)
			return c;
		broker_close(c);
		clock_gettime(CLOCK_MONOTONIC, &t);
		if ((t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000 > timeout_ms)
			return NULL;
		usleep(100000);
	}
}

int open_as(uid_t uid, gid_t gid, const char *path, int flags)
{
	uint8_t *buf = NULL;
	size_t len = 0, nfds = 0;
	int sv[2], fds[RPC_FDS_MAX], err = 0, status, rc;
	pid_t pid;

	cr_assert(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
	pid = fork();
	cr_assert(pid >= 0);
	if (pid == 0) {
		int fd = -1, e = 0;

		close(sv[0]);
		if (drop_to(uid, gid) < 0 || (fd = open(path, flags | O_CLOEXEC, 0600)) < 0)
			e = errno;
		(void)!rpc_frame_send(sv[1], &e, sizeof(e), &fd, fd >= 0 ? 1 : 0);
		_exit(0);
	}
	close(sv[1]);
	rc = rpc_frame_recv(sv[0], 64, 1, &buf, &len, fds, &nfds);
	close(sv[0]);
	waitpid(pid, &status, 0);
	cr_assert_eq(rc, 0, "open_as: %s", strerror(-rc));
	cr_assert(len == sizeof(err));
	memcpy(&err, buf, sizeof(err));
	free(buf);
	if (err)
		return -err;
	cr_assert_eq(nfds, 1);
	return fds[0];
}

void bk_status(struct broker_status *st)
{
	int rc = try_status(bk.sock, st);

	cr_assert_eq(rc, 0, "STATUS: %s", strerror(-rc));
}

void assert_no_leaks(int extra_fds)
{
	struct broker_status st;

	for (int i = 0; i < 200; i++) {
		bk_status(&st);
		if (st.connections == 1 && st.fds == bk.fds0 + (uint64_t)extra_fds)
			break;
		usleep(10000);
	}
	cr_assert_eq(st.connections, 1, "connections: %" PRIu64, st.connections);
	cr_assert_eq(st.fds, bk.fds0 + (uint64_t)extra_fds, "broker fds: %" PRIu64 ", expected %"
		     PRIu64, st.fds, bk.fds0 + (uint64_t)extra_fds);
	cr_assert_eq(st.backing_ids, 0, "live backing ids: %" PRIu64, st.backing_ids);
}

bool is_dead(struct broker_conn *c)
{
	struct broker_status st;
	int rc = broker_status(c, &st);

	return rc == -EPIPE || rc == -ENOTCONN;
}

char *mountinfo_of(const char *path)
{
	char *mi = fm_slurp("/proc/self/mountinfo"), *line, *save = NULL, *found = NULL;

	cr_assert(mi);
	for (line = strtok_r(mi, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		char point[PATH_MAX];

		if (sscanf(line, "%*u %*u %*u:%*u %*s %4095s", point) == 1 && !strcmp(point, path)) {
			free(found);
			found = strdup(line);
		}
	}
	free(mi);
	return found;
}

uint64_t mount_ok(struct broker_conn *c, const char *name, const char *const *opts,
		  int *fuse_fd)
{
	uint64_t id = 0;
	int fd = -1, rc = broker_mount(c, name, opts, &fd, &id);

	if (rc < 0)
		log_tail();
	cr_assert_eq(rc, 0, "MOUNT %s: %s: %s", name, strerror(-rc), broker_last_message());
	cr_assert(fd >= 0 && id != 0);
	if (fuse_fd)
		*fuse_fd = fd;
	else
		close(fd);
	return id;
}

uint64_t served_mount(struct broker_conn *c, const char *name, uid_t uid,
		      const char *const *opts, struct rawfuse *rf, int *fuse_fd)
{
	int fd;
	uint64_t id = mount_ok(c, name, opts, &fd);

	rawfuse_start(rf, fd, uid, uid);
	cr_assert(rawfuse_wait_init(rf, 5000), "no INIT on the brokered mount");
	cr_assert(atomic_load(&rf->passthrough), "the kernel did not take FUSE_PASSTHROUGH");
	if (fuse_fd)
		*fuse_fd = fd;
	else
		close(fd);
	return id;
}

/* ---- raw frames ---- */

int read_reply_within(int sock, int timeout_ms, uint32_t *error, bool *closing, uint64_t *id)
{
	struct timeval tv = { .tv_sec = timeout_ms / 1000, .tv_usec = (timeout_ms % 1000) * 1000 };
	uint8_t *buf = NULL;
	size_t len = 0, nfds = 0;
	int fds[RPC_FDS_MAX];
	Ferry__Broker__Reply *r;
	int rc;

	setsockopt(sock, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	rc = rpc_frame_recv(sock, BROKER_FRAME_MAX, 1, &buf, &len, fds, &nfds);
	if (rc == -EWOULDBLOCK)
		rc = -EAGAIN;
	if (rc < 0)
		return rc;
	for (size_t i = 0; i < nfds; i++)
		close(fds[i]);
	r = ferry__broker__reply__unpack(NULL, len, buf);
	free(buf);
	if (!r)
		return -EBADMSG;
	*error = r->error;
	*closing = r->has_closing && r->closing;
	*id = r->id;
	rc = r->version == BROKER_PROTO_VERSION ? 0 : -EPROTONOSUPPORT;
	ferry__broker__reply__free_unpacked(r, NULL);
	return rc;
}

void read_reply(int sock, uint32_t *error, bool *closing, uint64_t *id)
{
	struct timeval tv = { .tv_sec = 5 };
	uint8_t *buf = NULL;
	size_t len = 0, nfds = 0;
	int fds[RPC_FDS_MAX];
	Ferry__Broker__Reply *r;
	int rc;

	setsockopt(sock, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	rc = rpc_frame_recv(sock, BROKER_FRAME_MAX, 1, &buf, &len, fds, &nfds);
	cr_assert_eq(rc, 0, "no reply: %s", strerror(-rc));
	cr_assert_eq(nfds, 0);
	r = ferry__broker__reply__unpack(NULL, len, buf);
	cr_assert(r, "undecodable reply");
	cr_assert_eq(r->version, BROKER_PROTO_VERSION);
	*error = r->error;
	*closing = r->has_closing && r->closing;
	*id = r->id;
	ferry__broker__reply__free_unpacked(r, NULL);
	free(buf);
}

static double mono_ms(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

bool eof_within(int sock, int timeout_ms)
{
	double end = mono_ms() + timeout_ms;

	for (;;) {
		struct pollfd p = { .fd = sock, .events = POLLIN };
		double left = end - mono_ms();
		char buf[4096];
		ssize_t n;

		if (left < 0)
			left = 0;
		if (poll(&p, 1, (int)left) < 0 && errno != EINTR)
			return false;
		n = recv(sock, buf, sizeof(buf), MSG_DONTWAIT);
		if (n == 0 || (n < 0 && (errno == ECONNRESET || errno == EPIPE)))
			return true;
		if (n < 0 && errno != EAGAIN && errno != EINTR)
			return false;
		if (n < 0 && left <= 0)
			return false; /* nothing, in time */
	}
}

void expect_eof(int sock)
{
	struct timeval tv = { .tv_sec = 5 };
	char ch;
	ssize_t n;

	setsockopt(sock, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	n = recv(sock, &ch, 1, 0);
	cr_assert(n == 0 || (n < 0 && errno == ECONNRESET), "the connection stayed open (%zd, %s)",
		  n, n < 0 ? strerror(errno) : "-");
}

int send_iov_fds(int sock, struct iovec *iov, int niov, const int *fds, size_t n)
{
	union {
		struct cmsghdr align;
		char buf[CMSG_SPACE(sizeof(int) * 64)];
	} ctl;
	struct msghdr msg = { .msg_iov = iov, .msg_iovlen = (size_t)niov };
	struct cmsghdr *cm;
	size_t want = 0;
	ssize_t got;

	if (n == 0 || n > 64)
		return -EINVAL;
	for (int k = 0; k < niov; k++)
		want += iov[k].iov_len;
	memset(&ctl, 0, sizeof(ctl));
	msg.msg_control = ctl.buf;
	msg.msg_controllen = CMSG_SPACE(sizeof(int) * n);
	cm = CMSG_FIRSTHDR(&msg);
	cm->cmsg_level = SOL_SOCKET;
	cm->cmsg_type = SCM_RIGHTS;
	cm->cmsg_len = CMSG_LEN(sizeof(int) * n);
	memcpy(CMSG_DATA(cm), fds, sizeof(int) * n);
	got = sendmsg(sock, &msg, MSG_NOSIGNAL);
	if (got < 0)
		return -errno;
	return (size_t)got == want ? 0 : -EIO;
}

int send_frame_fds(int sock, const void *buf, size_t len, const int *fds, size_t n)
{
	uint8_t hdr[RPC_FRAME_HDR];
	struct iovec iov[2] = { { hdr, sizeof(hdr) }, { (void *)buf, len } };

	rpc_frame_header(hdr, (uint32_t)len);
	return send_iov_fds(sock, iov, 2, fds, n);
}
