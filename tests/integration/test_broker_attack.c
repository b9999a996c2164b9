/*
 * ferry-brokerd under attack: one tenant (A, uid PEER) that plays foul, and
 * another (B, uid PEER2, allow_other=1) that must not notice. Each test is
 * an attack that worked on the broker as first landed:
 *
 *   1a  a Unix socket whose receive queue holds the only reference to a
 *       TCP socket that lingers on close (SO_LINGER, unsent data, a peer
 *       that never reads): whoever closes the Unix socket waits up to the
 *       linger time. The broker closed it on its event loop.
 *   1b  the same TCP socket as the third fd of a frame: the broker's
 *       control buffer had room for two, so the kernel dropped the rest
 *       inside its recvmsg() and the final close lingered there. A peer
 *       whose close stays stuck is cut off until it ends.
 *   1c  the same TCP socket queued behind a frame that ends the
 *       connection: the broker's close() of the connection's socket drops
 *       it, on the event loop.
 *   2   A sends the broker a file on B's FUSE mount whose server leaves
 *       FLUSH unanswered: the broker aborted B's FUSE connection.
 *   3   a rename of the target directory between MOUNT's resolution and
 *       move_mount(): the mount landed outside the policy root.
 *   4   append-only, immutable and O_APPEND files became backing files.
 *   5   strangers (no policy rule) filled every connection slot.
 *   5b  allowed uids filled them: a newcomer was turned away instead of
 *       evicting a connection of the biggest holder.
 *   6   all of it, repeatedly, while B runs its ordinary workload.
 *   7   idle connections were kept forever (--idle-timeout).
 *   8   another tenant's mount ids and figures were disclosed.
 *   9   renaming a parent of a mount point took the mount out of the root
 *       afterwards (the periodic check now unmounts it; a rename within
 *       the root is followed by the table).
 *
 * The stall of 1a/1b stands in for the original report's FUSE file with
 * dirty writeback pages: a lingering TCP close blocks the closing task the
 * same way and needs no special FUSE server.
 *
 * Every wait is bounded (broker_set_timeout, poll, alarms in children). A
 * failed check is recorded with cr_expect_fail and the test goes to its
 * cleanup (CHECK); the suite's teardown also ends whatever a test left
 * behind (lingering sockets, children, inode flags, stuck FUSE requests)
 * before the shared fixture stops the broker and removes the tree.
 * FERRY_IT_BROKER_DEBUG=1 logs every request and prints the broker's log
 * tail at a failed CHECK.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <inttypes.h>
#include <limits.h>
#include <linux/fs.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "broker.pb-c.h"
#include "broker_client.h"
#include "broker_fixture_util.h"
#include "mount_util.h"
#include "rawfuse_util.h"
#include "rpc_frame.h"

/* Tries at a race the tests need (the broker, not the test, holding the
 * last reference to a socket): each is likely, not certain, on a loaded
 * machine under ASan. */
#define ATTEMPTS 20

#define UID_A PEER          /* A, the attacker */
#define UID_B PEER2         /* B, the tenant that must not notice */
#define ANSWER_MS 1000      /* the longest any request of B's may take */
#define B_TIMEOUT_MS 3000   /* B's client gives up then: the test cannot hang */
#define LINGER_S 20         /* how long a lingering close can block its task */
#define CLOSE_STALL_S 5     /* brokerd.h's BROKER_CLOSE_STALL_S: a stuck owner is cut off */

/* A failed check is recorded and the test goes to its cleanup (out:),
 * which a cr_assert would skip. */
#define CHECK(cond, ...)                                                                 \
	do {                                                                             \
		if (!(cond)) {                                                           \
			cr_expect_fail(__VA_ARGS__);                                     \
			if (getenv("FERRY_IT_BROKER_DEBUG"))                             \
				log_tail();                                              \
			goto out;                                                        \
		}                                                                        \
	} while (0)

/* What a test leaves that the suite's teardown must end, even when a
 * cr_assert cut the test short. */
static struct {
	int linger_peers[128];     /* accepted ends of lingering TCP sockets */
	size_t n_peers;
	char flagged[4][PATH_MAX]; /* files with FS_APPEND_FL/FS_IMMUTABLE_FL */
	size_t n_flagged;
	struct rawfuse *servers[4];
	size_t n_servers;
} at;

static double ms_since(const struct timespec *t0)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)(t.tv_sec - t0->tv_sec) * 1e3 + (double)(t.tv_nsec - t0->tv_nsec) / 1e6;
}

#define TIMED(rc, ms, expr)                                                              \
	do {                                                                             \
		struct timespec t_;                                                      \
		clock_gettime(CLOCK_MONOTONIC, &t_);                                     \
		(rc) = (expr);                                                           \
		(ms) = ms_since(&t_);                                                    \
	} while (0)

/* "ok" or the errno's name and the broker's message, for failure texts. */
static const char *outcome(int rc)
{
	static char buf[4][BROKER_MSG_MAX + 64];
	static int slot;
	char *out = buf[slot++ % 4];

	if (rc >= 0)
		snprintf(out, sizeof(buf[0]), "ok (%d)", rc);
	else
		snprintf(out, sizeof(buf[0]), "%s: %s", fm_errname(-rc), broker_last_message());
	return out;
}

static int drop_to(uid_t uid)
{
	return setgroups(0, NULL) || setresgid(uid, uid, uid) || setresuid(uid, uid, uid) ? -1 : 0;
}

static void serve_add(struct rawfuse *rf)
{
	if (at.n_servers < sizeof(at.servers) / sizeof(at.servers[0]))
		at.servers[at.n_servers++] = rf;
}

/* ---- lingering TCP sockets ---- */

/*
 * A loopback TCP socket whose final close lingers: SO_LINGER {1, secs} and
 * unsent data the other end has no room for (it accepts and never reads),
 * so close() waits in tcp_close() for the FIN to be acked -- up to secs, in
 * whichever task drops the last reference. The accepted end goes to
 * peers[] (n, room for cap; the oldest is closed when full); closing it
 * resets the connection and ends the wait at once. -1 on failure (no
 * asserts: children use it too).
 */
static int lingering_tcp_into(int secs, int *peers, size_t *n, size_t cap)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	struct linger lg = { .l_onoff = 1, .l_linger = secs };
	socklen_t sl = sizeof(sa);
	int small = 4096, lfd, cfd = -1, afd = -1, fl;
	static char junk[65536];

	lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (lfd < 0)
		return -1;
	/* Small buffers on both ends: filled in a few sends. The accepted
	 * socket inherits the listener's (locked) receive buffer. */
	if (setsockopt(lfd, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small)) < 0 ||
	    bind(lfd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(lfd, 1) < 0 ||
	    getsockname(lfd, (struct sockaddr *)&sa, &sl) < 0)
		goto fail;
	cfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (cfd < 0 || setsockopt(cfd, SOL_SOCKET, SO_SNDBUF, &small, sizeof(small)) < 0 ||
	    connect(cfd, (struct sockaddr *)&sa, sizeof(sa)) < 0)
		goto fail;
	afd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
	if (afd < 0 || setsockopt(cfd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg)) < 0)
		goto fail;
	fl = fcntl(cfd, F_GETFL);
	if (fl < 0 || fcntl(cfd, F_SETFL, fl | O_NONBLOCK) < 0)
		goto fail;
	/* Until the peer's window and our send buffer are both full; again
	 * after a pause, in case acks made room meanwhile. */
	for (int round = 0; round < 3; round++) {
		while (send(cfd, junk, sizeof(junk), MSG_NOSIGNAL | MSG_DONTWAIT) > 0)
			;
		if (errno != EAGAIN && errno != EWOULDBLOCK)
			goto fail;
		usleep(2000);
	}
	close(lfd);
	if (*n == cap) {
		close(peers[0]);
		memmove(peers, peers + 1, (cap - 1) * sizeof(*peers));
		(*n)--;
	}
	peers[(*n)++] = afd;
	return cfd;
fail:
	if (afd >= 0)
		close(afd);
	if (cfd >= 0)
		close(cfd);
	close(lfd);
	return -1;
}

static int lingering_tcp(int secs)
{
	return lingering_tcp_into(secs, at.linger_peers, &at.n_peers,
				  sizeof(at.linger_peers) / sizeof(at.linger_peers[0]));
}

/* Ends every linger at once: the peers reset their connections. */
static void release_lingers(void)
{
	for (size_t i = 0; i < at.n_peers; i++)
		close(at.linger_peers[i]);
	at.n_peers = 0;
}

/* A Unix socket whose receive queue holds, in flight, the only reference
 * to fd (ours is closed here). -1 on failure. */
static int socket_holding(int fd)
{
	int sv[2], rc;

	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0) {
		close(fd);
		return -1;
	}
	rc = rpc_frame_send(sv[1], "x", 1, &fd, 1);
	close(fd);
	close(sv[1]);
	if (rc < 0) {
		close(sv[0]);
		return -1;
	}
	return sv[0];
}

#ifndef sigev_notify_thread_id
#define sigev_notify_thread_id _sigev_un._tid /* glibc < 2.37 */
#endif

/* Installed for good (so a late one can do no harm): it only interrupts. */
static void on_sigusr2(int sig)
{
	(void)sig;
}

/*
 * close(fd), right after sending fd to the broker. Whoever drops the last
 * reference to a lingering socket waits in that close. If ours returns at
 * once, the last reference -- and the wait -- is the broker's: the attack
 * hit. If the broker had let go of its copy first, ours is the last: a
 * signal cuts our wait short after ms (it is interruptible), and the
 * attack missed: false.
 */
static bool close_was_quick(int fd, int ms)
{
	struct sigevent sev = { .sigev_notify = SIGEV_THREAD_ID, .sigev_signo = SIGUSR2 };
	struct itimerspec its = {
		.it_value = { .tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000 } };
	struct timespec t0;
	timer_t timer;
	double took;

	sev.sigev_notify_thread_id = gettid();
	if (timer_create(CLOCK_MONOTONIC, &sev, &timer) < 0) {
		close(fd);
		return false;
	}
	timer_settime(timer, 0, &its, NULL);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	close(fd);
	took = ms_since(&t0);
	timer_delete(timer);
	return took < ms / 2.0;
}

/* ---- raw requests ---- */

/* One BACKING_OPEN (many: BACKING_OPEN_MANY) frame with fds[0..nfds) in
 * one SCM_RIGHTS on its first byte, however many. */
static int send_open_frame(int sock, uint64_t mount_id, bool many, const int *fds, size_t nfds)
{
	Ferry__Broker__Request q = FERRY__BROKER__REQUEST__INIT;
	Ferry__Broker__BackingOpen bo = FERRY__BROKER__BACKING_OPEN__INIT;
	Ferry__Broker__BackingOpenMany bm = FERRY__BROKER__BACKING_OPEN_MANY__INIT;
	uint8_t buf[128];
	size_t len;

	q.version = BROKER_PROTO_VERSION;
	q.id = 1;
	bo.mount_id = bm.mount_id = mount_id;
	if (many) {
		q.body_case = FERRY__BROKER__REQUEST__BODY_BACKING_OPEN_MANY;
		q.backing_open_many = &bm;
	} else {
		q.body_case = FERRY__BROKER__REQUEST__BODY_BACKING_OPEN;
		q.backing_open = &bo;
	}
	len = ferry__broker__request__pack(&q, buf);
	return send_frame_fds(sock, buf, len, fds, nfds);
}

static int send_backing_open(int sock, uint64_t mount_id, const int *fds, size_t nfds)
{
	return send_open_frame(sock, mount_id, false, fds, nfds);
}

static int send_backing_open_many(int sock, uint64_t mount_id, const int *fds, size_t nfds)
{
	return send_open_frame(sock, mount_id, true, fds, nfds);
}

/* ---- B, the tenant that must not notice ---- */

/* B's STATUS (and with_mount: MOUNT n1, UMOUNT) each answered without
 * error within ANSWER_MS; else a failure is recorded, and false. */
static bool victim_served(struct broker_conn *b, const char *when, bool with_mount)
{
	struct broker_status st;
	uint64_t id = 0;
	double ms;
	int rc, fd = -1;

	TIMED(rc, ms, broker_status(b, &st));
	if (rc < 0 || ms > ANSWER_MS) {
		cr_expect_fail("%s: B's STATUS took %.0f ms (at most %d allowed): %s", when, ms,
			       ANSWER_MS, outcome(rc));
		return false;
	}
	if (!with_mount)
		return true;
	TIMED(rc, ms, broker_mount(b, "n1", NULL, &fd, &id));
	if (rc == 0)
		close(fd);
	if (rc < 0 || ms > ANSWER_MS) {
		cr_expect_fail("%s: B's MOUNT n1 took %.0f ms (at most %d allowed): %s", when, ms,
			       ANSWER_MS, outcome(rc));
		return false;
	}
	TIMED(rc, ms, broker_umount(b, NULL, id));
	if (rc < 0 || ms > ANSWER_MS) {
		cr_expect_fail("%s: B's UMOUNT n1 took %.0f ms (at most %d allowed): %s", when, ms,
			       ANSWER_MS, outcome(rc));
		return false;
	}
	return true;
}

static struct broker_conn *victim(void)
{
	struct broker_conn *b = connect_as(UID_B, UID_B);

	broker_set_timeout(b, B_TIMEOUT_MS);
	return b;
}

/* ---- inode flags ---- */

static int inode_flags(const char *path, int add, int del)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC), fl = 0, rc = 0;

	if (fd < 0)
		return -errno;
	if (ioctl(fd, FS_IOC_GETFLAGS, &fl) < 0) {
		rc = -errno;
	} else {
		fl = (fl | add) & ~del;
		if (ioctl(fd, FS_IOC_SETFLAGS, &fl) < 0)
			rc = -errno;
	}
	close(fd);
	return rc;
}

static void clear_flags(void)
{
	for (size_t i = 0; i < at.n_flagged; i++)
		inode_flags(at.flagged[i], 0, FS_APPEND_FL | FS_IMMUTABLE_FL);
	at.n_flagged = 0;
}

/* Sets flag on path (remembered, so teardown can clear it). */
static int flag_file(const char *path, int flag)
{
	if (at.n_flagged < sizeof(at.flagged) / sizeof(at.flagged[0]))
		snprintf(at.flagged[at.n_flagged++], PATH_MAX, "%s", path);
	return inode_flags(path, flag, 0);
}

/* ---- the suite ---- */

static void attack_setup(void)
{
	struct sigaction sa = { .sa_handler = on_sigusr2 };

	memset(&at, 0, sizeof(at));
	sigemptyset(&sa.sa_mask);
	cr_assert(sigaction(SIGUSR2, &sa, NULL) == 0); /* for close_was_quick() */
	bk_setup();
}

static void attack_teardown(void)
{
	release_lingers();      /* the broker's stuck closes end at once */
	clear_flags();          /* else the tree cannot be removed */
	if (bk.dir[0])
		abort_fuse_beneath(); /* unanswered FLUSHes fail: stuck children go */
	bk_reap_children();
	for (size_t i = 0; i < at.n_servers; i++)
		rawfuse_stop(at.servers[i]);
	at.n_servers = 0;
	bk_teardown();
}

TestSuite(broker_attack, .init = attack_setup, .fini = attack_teardown, .timeout = 120);

/* ---- 1a: a socket in a socket ---- */

Test(broker_attack, socket_in_a_socket_stalls_no_one)
{
	struct broker_conn *a = connect_as(UID_A, UID_A), *b = victim();
	uint64_t ma = mount_ok(a, "m1", NULL, NULL), rid;
	struct timespec t0;
	uint32_t err = 0;
	bool closing, hit = false;
	double ms;
	int s = -1, tcp, holder, rc = 0;

	/* Control: closing such a wrapped socket does wait (here 1 s), or
	 * the attack below would prove nothing. */
	tcp = lingering_tcp(1);
	CHECK(tcp >= 0, "cannot make a lingering TCP socket: %s", strerror(errno));
	holder = socket_holding(tcp);
	CHECK(holder >= 0, "cannot wrap the TCP socket: %s", strerror(errno));
	clock_gettime(CLOCK_MONOTONIC, &t0);
	close(holder);
	ms = ms_since(&t0);
	CHECK(ms >= 800, "closing a socket that holds a lingering TCP socket took %.0f ms, not "
	      "~1000: the attack would prove nothing", ms);
	release_lingers();

	/* The attack: the wrapped socket as a backing fd. Refused (not a
	 * regular file), and the broker's copy is to be the last reference
	 * (tried again if ours was: close_was_quick). */
	for (int tries = 0; tries < ATTEMPTS && !hit; tries++) {
		if (s >= 0)
			close(s);
		s = connect_raw(UID_A, UID_A);
		tcp = lingering_tcp(LINGER_S);
		CHECK(tcp >= 0, "cannot make a lingering TCP socket: %s", strerror(errno));
		holder = socket_holding(tcp);
		CHECK(holder >= 0, "cannot wrap the TCP socket: %s", strerror(errno));
		rc = send_backing_open(s, ma, &holder, 1);
		hit = close_was_quick(holder, 300);
		CHECK(rc == 0, "sending A's BACKING_OPEN: %s", strerror(-rc));
		if (!hit)
			release_lingers();
	}
	CHECK(hit, "the broker never held the last reference to A's socket");
	usleep(100000); /* the broker has had time to let go of the fd */

	CHECK(victim_served(b, "while the socket A sent lingers in its close", true),
	      "B was held up by A's socket");
	/* A's own refusal came at once too. */
	rc = read_reply_within(s, ANSWER_MS, &err, &closing, &rid);
	CHECK(rc == 0, "A's BACKING_OPEN got no reply within %d ms: %s", ANSWER_MS,
	      strerror(-rc));
	CHECK(err != 0, "a Unix socket was registered as a backing file");
out:
	release_lingers();
	if (s >= 0)
		close(s);
	broker_close(a);
	broker_close(b);
}

/* ---- 1b: fds beyond the control buffer ---- */

Test(broker_attack, fds_beyond_the_control_buffer_stall_no_one)
{
	struct broker_conn *a = connect_as(UID_A, UID_A), *b = victim(), *a2 = NULL;
	uint64_t ma = mount_ok(a, "m1", NULL, NULL), rid;
	/* One more than a frame may carry: the last is the lingering one. */
	enum { NFDS = BROKER_FDS_MAX + 1 };
	int s = -1, fds[NFDS], rc = 0;
	struct timespec t0;
	uint32_t err = 0;
	bool closing = false, dead = false, hit = false;

	broker_set_timeout(a, 2000);
	/* One frame, BROKER_FDS_MAX + 1 fds in one SCM_RIGHTS; ours are
	 * closed right after, so the last one's last reference rides in the
	 * message (tried again if ours was the last after all:
	 * close_was_quick). */
	for (int tries = 0; tries < ATTEMPTS && !hit; tries++) {
		bool made = true;

		if (s >= 0)
			close(s);
		s = connect_raw(UID_A, UID_A);
		for (int k = 0; k < NFDS - 1; k++)
			made &= (fds[k] = open("/dev/null", O_RDONLY | O_CLOEXEC)) >= 0;
		fds[NFDS - 1] = lingering_tcp(LINGER_S);
		CHECK(made && fds[NFDS - 1] >= 0, "cannot make the fds: %s", strerror(errno));
		rc = send_backing_open_many(s, ma, fds, NFDS);
		hit = close_was_quick(fds[NFDS - 1], 300);
		for (int k = 0; k < NFDS - 1; k++)
			close(fds[k]);
		CHECK(rc == 0, "sending A's BACKING_OPEN_MANY with %d fds: %s", NFDS,
		      strerror(-rc));
		if (!hit)
			release_lingers();
	}
	CHECK(hit, "the broker never held the last reference to A's TCP socket");
	clock_gettime(CLOCK_MONOTONIC, &t0);
	usleep(100000);

	CHECK(victim_served(b, "after A sent too many fds with one frame", true),
	      "B was held up by A's surplus fds");
	/* A: ETOOMANYREFS and closing, or the connection just ends. */
	rc = read_reply_within(s, ANSWER_MS, &err, &closing, &rid);
	CHECK((rc == 0 && err == ETOOMANYREFS && closing) || rc == -EPIPE ||
	      rc == -ECONNRESET, "A's frame with too many fds: %s (error %u%s), expected "
	      "ETOOMANYREFS and closing, or EOF, within %d ms", rc ? strerror(-rc) : "a reply",
	      err, closing ? ", closing" : "", ANSWER_MS);

	/* The close of the TCP socket stays stuck (20 s): after 5 s A is cut
	 * off, its established connection closed, while B goes on. (A is
	 * not read from before that, either: more than
	 * BROKER_CLOSE_PENDING_MAX of its fds wait behind the stuck one.) */
	while ((!dead || ms_since(&t0) < (CLOSE_STALL_S + 1) * 1000.0) &&
	       ms_since(&t0) < 9000) {
		CHECK(victim_served(b, "while A's close is stuck", false), "B was held up");
		dead = is_dead(a);
		if (!dead)
			usleep(250000);
	}
	CHECK(dead, "A's connection still served %.0f ms after its close got stuck",
	      ms_since(&t0));
	/* A new connection of A's is refused as long as the close lasts. */
	cr_assert_eq(broker_adopt(connect_only(UID_A, UID_A), &a2), 0);
	broker_set_timeout(a2, 2000);
	CHECK(is_dead(a2), "a new connection of A's was served while its close was stuck");
	broker_close(a2);
	a2 = NULL;
	CHECK(victim_served(b, "while A is cut off", true), "B was held up");
	/* Once the close is over (the TCP peer resets), A is let in again. */
	release_lingers();
	a2 = connect_as_within(UID_A, UID_A, 3000);
	CHECK(a2, "A is still refused 3 s after its stuck close ended");
	CHECK(victim_served(b, "after A's close ended", true), "B was held up");
out:
	release_lingers();
	if (s >= 0)
		close(s);
	broker_close(a);
	broker_close(a2);
	broker_close(b);
}

/* ---- 1c: fds still queued in a connection the broker ends ---- */

/* Frame 1 (len1 bytes of garbage) and frame 2 (a BACKING_OPEN with fd) in
 * one sendmmsg(): two messages, so the fd rides with frame 2's first
 * byte, sent before the broker can have read frame 1 and gone. The number
 * of frames sent (2: both), or -errno. */
static int send_fatal_then_fd(int sock, const uint8_t *junk, size_t len1, int fd)
{
	Ferry__Broker__Request q = FERRY__BROKER__REQUEST__INIT;
	Ferry__Broker__BackingOpen bo = FERRY__BROKER__BACKING_OPEN__INIT;
	uint8_t h1[RPC_FRAME_HDR], h2[RPC_FRAME_HDR], body[128];
	union {
		struct cmsghdr align;
		char buf[CMSG_SPACE(sizeof(int))];
	} ctl;
	struct iovec iov1[2] = { { h1, sizeof(h1) }, { (void *)junk, len1 } };
	struct iovec iov2[2] = { { h2, sizeof(h2) }, { body, 0 } };
	struct mmsghdr m[2];
	struct cmsghdr *cm;
	int n;

	q.version = BROKER_PROTO_VERSION;
	q.id = 2;
	bo.mount_id = 1;
	q.body_case = FERRY__BROKER__REQUEST__BODY_BACKING_OPEN;
	q.backing_open = &bo;
	iov2[1].iov_len = ferry__broker__request__pack(&q, body);
	rpc_frame_header(h1, (uint32_t)len1);
	rpc_frame_header(h2, (uint32_t)iov2[1].iov_len);
	memset(m, 0, sizeof(m));
	memset(&ctl, 0, sizeof(ctl));
	m[0].msg_hdr.msg_iov = iov1;
	m[0].msg_hdr.msg_iovlen = 2;
	m[1].msg_hdr.msg_iov = iov2;
	m[1].msg_hdr.msg_iovlen = 2;
	m[1].msg_hdr.msg_control = ctl.buf;
	m[1].msg_hdr.msg_controllen = sizeof(ctl.buf);
	cm = CMSG_FIRSTHDR(&m[1].msg_hdr);
	cm->cmsg_level = SOL_SOCKET;
	cm->cmsg_type = SCM_RIGHTS;
	cm->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(cm), &fd, sizeof(int));
	n = sendmmsg(sock, m, 2, MSG_NOSIGNAL);
	return n < 0 ? -errno : n;
}

/* One byte of a frame's header, with fds[0..n) on it: a frame begun and
 * never finished. 0 or -errno. */
static int send_frame_start(int sock, const int *fds, size_t n)
{
	uint8_t first = 0;
	struct iovec iov = { &first, 1 };

	return send_iov_fds(sock, &iov, 1, fds, n);
}

/*
 * A frame may carry BROKER_FDS_MAX fds, and the broker holds them from the
 * frame's first byte until its last. A tenant that begins frames on many
 * connections and never finishes them holds 16 fds a connection: past
 * BROKER_OWNER_FRAME_FDS_MAX (64) of them its connections are not read,
 * so it cannot fill the broker's fd table, and another tenant does not
 * notice. Once the frames time out (10 s) the fds go and A is served again.
 */
Test(broker_attack, fds_held_in_unfinished_frames_are_bounded)
{
	struct broker_conn *b = victim(), *a2 = NULL;
	enum { CONNS = 5 };
	int socks[CONNS], fds[BROKER_FDS_MAX], rc = 0;
	struct broker_status st;

	for (int k = 0; k < CONNS; k++)
		socks[k] = -1;
	for (int k = 0; k < CONNS; k++) {
		socks[k] = connect_raw(UID_A, UID_A);
		for (int f = 0; f < (int)BROKER_FDS_MAX; f++) {
			fds[f] = open("/dev/null", O_RDONLY | O_CLOEXEC);
			CHECK(fds[f] >= 0, "open /dev/null: %s", strerror(errno));
		}
		rc = send_frame_start(socks[k], fds, BROKER_FDS_MAX);
		for (int f = 0; f < (int)BROKER_FDS_MAX; f++)
			close(fds[f]);
		CHECK(rc == 0, "sending A's frame start %d: %s", k, strerror(-rc));
	}
	usleep(200000); /* the broker has read them */
	CHECK(victim_served(b, "while A holds fds in unfinished frames", true),
	      "B was held up by A's unfinished frames");
	/* 80 fds held: A's new connection is not read. */
	cr_assert_eq(broker_adopt(connect_only(UID_A, UID_A), &a2), 0);
	broker_set_timeout(a2, 1000);
	rc = broker_status(a2, &st);
	CHECK(rc == -ETIMEDOUT, "A was served while it held %d fds in unfinished frames: %s",
	      CONNS * (int)BROKER_FDS_MAX, rc ? strerror(-rc) : "answered");
	broker_close(a2);
	a2 = NULL;
	/* The frames time out, their fds go, and A is served again. */
	a2 = connect_as_within(UID_A, UID_A, 15000);
	CHECK(a2, "A is still not served 15 s after its frames timed out");
	CHECK(victim_served(b, "after A's frames timed out", true), "B was held up");
out:
	for (int k = 0; k < CONNS; k++)
		if (socks[k] >= 0)
			close(socks[k]);
	broker_close(a2);
	broker_close(b);
}

/*
 * The broker never reads past the frame at hand, so fds of the frames
 * after it wait in the connection's receive queue. When the broker ends
 * the connection itself (here: the first frame is garbage, a fatal error),
 * its close() of the connection's socket drops them: a lingering TCP
 * socket queued there lingers in whoever closes that socket. The same
 * goes for every connection the broker ends on its own (refused at accept,
 * cut off, idle, evicted), so none may be closed on the event loop.
 */
Test(broker_attack, fds_queued_behind_a_fatal_frame_stall_no_one)
{
	struct broker_conn *b = victim();
	uint8_t junk[64];
	uint64_t seed = 7, rid;
	uint32_t err = 0;
	bool closing = false;
	int s = -1, tcp = -1, rc = 0, tries;
	bool hit = false;

	/* Frame 1: garbage (the broker ends the connection). Frame 2: a
	 * BACKING_OPEN with a lingering TCP socket, whose last reference then
	 * waits in the queue. Frame 2 is never read (the broker reads no
	 * further once a connection is closing). Tried again if the broker
	 * was quicker than our second frame (it failed) or than our close
	 * (ours was the last reference: close_was_quick). */
	fm_fill_random(&seed, junk, sizeof(junk));
	for (tries = 0; tries < 20 && !hit; tries++) {
		if (s >= 0)
			close(s);
		s = connect_raw(UID_A, UID_A);
		tcp = lingering_tcp(LINGER_S);
		CHECK(tcp >= 0, "cannot make a lingering TCP socket: %s", strerror(errno));
		rc = send_fatal_then_fd(s, junk, sizeof(junk), tcp);
		hit = close_was_quick(tcp, 300) && rc == 2;
		if (!hit)
			release_lingers();
	}
	CHECK(hit, "the fd never stayed queued with the last reference in the broker's socket "
	      "(%d tries, last: %s)", tries, rc < 0 ? strerror(-rc) : rc == 2 ? "ours was the last" :
	      "one frame sent");
	usleep(100000);

	CHECK(victim_served(b, "after the broker ended A's connection with an fd queued in it",
			    true), "B was held up by the fd queued in A's connection");
	rc = read_reply_within(s, ANSWER_MS, &err, &closing, &rid);
	CHECK((rc == 0 && err != 0 && closing) || rc == -EPIPE || rc == -ECONNRESET,
	      "A's garbage frame: %s (error %u%s), expected an error with closing, or EOF",
	      rc ? strerror(-rc) : "a reply", err, closing ? ", closing" : "");
out:
	release_lingers();
	if (s >= 0)
		close(s);
	broker_close(b);
}

/* ---- 2: a tenant's FUSE connection aborted for another's close ---- */

static long stat_path(void *arg)
{
	struct stat st;

	return stat(arg, &st);
}

Test(broker_attack, anothers_stuck_flush_aborts_no_mount_of_mine)
{
	static struct rawfuse rf;
	const char *opts[] = { "allow_other", NULL };
	struct broker_conn *a = connect_as(UID_A, UID_A), *b = victim();
	uint64_t mb = served_mount(b, "n1", UID_B, opts, &rf, NULL);
	struct pollfd pfd;
	struct timespec t0;
	int p[2] = { -1, -1 }, rc = 0;
	char *log = NULL;
	long r;
	pid_t pid;

	serve_add(&rf);
	atomic_store(&rf.stall_flush, true);
	cr_assert(pipe2(p, O_CLOEXEC) == 0);
	pid = fork();
	cr_assert(pid >= 0);
	if (pid == 0) {
		int fd, res = -1;

		prctl(PR_SET_PDEATHSIG, SIGKILL);
		/* allow_other lets A open B's file; the broker refuses it (B's,
		 * on FUSE) and drops the fd: its close sends FLUSH, which B's
		 * server never answers. */
		if (drop_to(UID_A) == 0 && (fd = open(bp("root2/n1/f"), O_RDWR | O_CLOEXEC)) >= 0)
			res = broker_backing_open(a, mb, fd);
		(void)!write(p[1], &res, sizeof(res));
		_exit(0); /* its own close waits for FLUSH too, until teardown's abort */
	}
	bk_child(pid);
	close(p[1]);
	p[1] = -1;
	pfd = (struct pollfd){ .fd = p[0], .events = POLLIN };
	CHECK(poll(&pfd, 1, 5000) == 1 && read(p[0], &rc, sizeof(rc)) == (ssize_t)sizeof(rc),
	      "A's child did not report within 5 s");
	CHECK(rc < 0, "B's FUSE file was registered for A as backing id %d", rc);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	/* 8 s: well past the 5 s after which a stuck close was aborted. */
	while (ms_since(&t0) < 8000) {
		CHECK(victim_served(b, "while A's fd's FLUSH is stuck", false), "B was held up");
		usleep(500000);
	}
	CHECK(atomic_load(&rf.n_flush) >= 1, "no FLUSH reached B's server: nothing was stuck");
	/* Two views of one thing: both reported. */
	errno = 0;
	r = fm_as_user(UID_B, UID_B, stat_path, (void *)bp("root2/n1"));
	cr_expect(r == 0, "B's own mount after A's stuck close: stat: %s", strerror(errno));
	log = fm_slurp(bk.log);
	cr_expect(log && !strstr(log, "aborted that FUSE connection"),
		  "the broker aborted a FUSE connection for A's stuck close");
out:
	free(log);
	if (p[0] >= 0)
		close(p[0]);
	/* The FLUSHes still pending fail; A's child and the broker's close
	 * return. */
	abort_fuse_beneath();
	bk_reap_children();
	rawfuse_stop(&rf);
	broker_close(a);
	broker_close(b);
}

/* ---- 3: a rename between resolution and mount ---- */

/* The mount point of the first FUSE mount beneath bk.dir but not beneath
 * bk.root (malloc'ed), or NULL. */
static char *escaped_fuse_mount(void)
{
	char *mi = fm_slurp("/proc/self/mountinfo"), *line, *save = NULL, *found = NULL;
	size_t nd = strlen(bk.dir), nr = strlen(bk.root);

	for (line = mi ? strtok_r(mi, "\n", &save) : NULL; line && !found;
	     line = strtok_r(NULL, "\n", &save)) {
		char point[PATH_MAX];

		if (sscanf(line, "%*u %*u %*u:%*u %*s %4095s", point) != 1 ||
		    !strstr(line, " - fuse"))
			continue;
		if (!strncmp(point, bk.dir, nd) && point[nd] == '/' &&
		    !(!strncmp(point, bk.root, nr) && point[nr] == '/'))
			found = strdup(point);
	}
	free(mi);
	return found;
}

/*
 * A moves me/x out of the root and back while it asks to mount there. The
 * broker resolved the name to the directory, then mounted on that
 * directory wherever it was by then. Checking afterwards where the mount
 * is tells the truth here: a rename across directories locks the
 * directory it moves, as attaching a mount does, and a mount point cannot
 * be renamed. (A rename within one directory takes no such lock and can
 * still move a directory a mount is just attaching to -- within that
 * directory only: see symlink_swapped_in_after_resolution in
 * test_broker.c.)
 */
Test(broker_attack, rename_during_mount_lands_nothing_outside)
{
	struct broker_conn *a = connect_as(UID_A, UID_A);
	char in[PATH_MAX], out_[PATH_MAX], *esc = NULL, *mi = NULL;
	volatile unsigned long *renames;
	struct timespec t0;
	int ok = 0, refused = 0, i;
	pid_t pid;

	mkdir_owned(bp("root/me"), UID_A, 0755);
	mkdir_owned(bp("root/me/x"), UID_A, 0755);
	snprintf(in, sizeof(in), "%s", bp("root/me/x"));
	snprintf(out_, sizeof(out_), "%s/x", bk.outside);
	renames = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	cr_assert(renames != MAP_FAILED);
	pid = fork();
	cr_assert(pid >= 0);
	if (pid == 0) {
		/* A moves its own directory out of the root and back, as
		 * fast as it can (both parents are its own). */
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		alarm(60);
		if (drop_to(UID_A) < 0)
			_exit(2);
		for (;;) {
			if (rename(in, out_) == 0)
				(*renames)++;
			if (rename(out_, in) == 0)
				(*renames)++;
		}
	}
	bk_child(pid);

	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (i = 0; i < 400 && ms_since(&t0) < 20000; i++) {
		uint64_t id = 0;
		int fd = -1, rc = broker_mount(a, "me/x", NULL, &fd, &id);

		if (fd >= 0)
			close(fd);
		esc = escaped_fuse_mount();
		CHECK(!esc, "MOUNT me/x (try %d: %s) left a FUSE mount at %s, outside the policy "
		      "root", i + 1, outcome(rc), esc);
		if (rc < 0) {
			refused++; /* the race made it fail: fine, as long as nothing escaped */
			continue;
		}
		ok++;
		mi = mountinfo_of(in);
		CHECK(mi, "MOUNT me/x (try %d) succeeded, but nothing is mounted at %s", i + 1, in);
		free(mi);
		mi = NULL;
		rc = broker_umount(a, "me/x", 0);
		CHECK(rc == 0, "UMOUNT me/x after try %d: %s", i + 1, outcome(rc));
	}
	esc = escaped_fuse_mount();
	CHECK(!esc, "a FUSE mount at %s, outside the policy root", esc);
	CHECK(*renames > 0, "the directory was never renamed: the test proves nothing");
	cr_log_info("rename race: %d tries, %d mounted, %d refused, %lu renames", i, ok, refused,
		    *renames);
out:
	free(esc);
	free(mi);
	bk_reap_children();
	munmap((void *)renames, 4096);
	broker_close(a);
}

/*
 * Not a race at all: a mount point cannot be renamed, but the directories
 * above it can. A mounts at me/x/y (verified where it landed), then
 * renames me/x -- its own directory in its own me/ -- to outside/x: the
 * mount goes along, out of the policy root. Nothing at MOUNT time can
 * prevent that; the broker's periodic check (--check-interval, 1 s here)
 * finds it and unmounts it. A rename within the root is followed: the
 * table names the mount's new place, and UMOUNT by that name works.
 */
static char g_from[PATH_MAX], g_to[PATH_MAX];

static long rename_as(void *arg)
{
	(void)arg;
	return rename(g_from, g_to);
}

/* The broker's mount count as root sees it, once it settles on want
 * (bounded). */
static uint64_t mounts_settle(uint64_t want)
{
	struct broker_status st = { 0 };

	for (int i = 0; i < 100; i++) {
		bk_status(&st);
		if (st.mounts == want)
			break;
		usleep(100 * 1000);
	}
	return st.mounts;
}

Test(broker_attack, renaming_a_parent_moves_no_mount_outside)
{
	const char *args[] = { "--check-interval", "1", NULL };
	struct broker_conn *a = NULL;
	char *esc = NULL;
	uint64_t n;
	long r;

	broker_kill(SIGTERM);
	broker_start_args(args);
	a = connect_as(UID_A, UID_A);
	mkdir_owned(bp("root/me"), UID_A, 0755);
	mkdir_owned(bp("root/me/x"), UID_A, 0755);
	mkdir_owned(bp("root/me/x/y"), UID_A, 0755);
	mkdir_owned(bp("root/me/w"), UID_A, 0755);
	mkdir_owned(bp("root/me/w/v"), UID_A, 0755);
	mount_ok(a, "me/x/y", NULL, NULL);
	mount_ok(a, "me/w/v", NULL, NULL);

	/* Within the root: followed. */
	snprintf(g_from, sizeof(g_from), "%s", bp("root/me/w"));
	snprintf(g_to, sizeof(g_to), "%s", bp("root/me/u"));
	r = fm_as_user(UID_A, UID_A, rename_as, NULL);
	CHECK(r == 0, "A's rename of me/w to me/u: %s", strerror(errno));

	/* Out of it: undone. */
	snprintf(g_from, sizeof(g_from), "%s", bp("root/me/x"));
	snprintf(g_to, sizeof(g_to), "%s/x", bk.outside);
	r = fm_as_user(UID_A, UID_A, rename_as, NULL);
	CHECK(r == 0, "A's rename of me/x out of the root: %s", strerror(errno));
	n = mounts_settle(1);
	esc = escaped_fuse_mount();
	CHECK(!esc, "the mount A carried out of its root along with me/x is still at %s", esc);
	CHECK(n == 1, "the broker knows %llu mounts, not 1", (unsigned long long)n);
	r = broker_umount(a, "me/u/v", 0);
	CHECK(r == 0, "UMOUNT me/u/v (the renamed mount, by its new name): %s: %s", outcome((int)r),
	      broker_last_message());
	CHECK(mounts_settle(0) == 0, "a mount is left after UMOUNT");
out:
	free(esc);
	broker_close(a);
}

/* ---- 4: append-only, immutable, O_APPEND ---- */

Test(broker_attack, append_only_and_immutable_files_are_no_backing)
{
	static struct rawfuse rf;
	struct broker_conn *a = connect_as(UID_A, UID_A);
	uint64_t ma = served_mount(a, "m1", UID_A, NULL, &rf, NULL);
	int fd = -1, id, rc;

	serve_add(&rf);
	write_text(bp("data-a"), "", UID_A, 0600);
	write_text(bp("data-i"), "", UID_A, 0600);
	write_text(bp("data-o"), "", UID_A, 0600);

	/* Append-only, set after A opened it read-write. */
	fd = open_as(UID_A, UID_A, bp("data-a"), O_RDWR);
	CHECK(fd >= 0, "A's open of data-a: %s", strerror(-fd));
	rc = flag_file(bp("data-a"), FS_APPEND_FL);
	CHECK(rc == 0, "FS_IOC_SETFLAGS FS_APPEND_FL: %s", strerror(-rc));
	id = broker_backing_open(a, ma, fd);
	cr_expect_eq(id, -EPERM, "BACKING_OPEN of an append-only file: %s, expected EPERM",
		     outcome(id));
	if (id > 0)
		broker_backing_close(a, ma, id);
	close(fd);

	/* Immutable, likewise. */
	fd = open_as(UID_A, UID_A, bp("data-i"), O_RDWR);
	CHECK(fd >= 0, "A's open of data-i: %s", strerror(-fd));
	rc = flag_file(bp("data-i"), FS_IMMUTABLE_FL);
	CHECK(rc == 0, "FS_IOC_SETFLAGS FS_IMMUTABLE_FL: %s", strerror(-rc));
	id = broker_backing_open(a, ma, fd);
	cr_expect_eq(id, -EPERM, "BACKING_OPEN of an immutable file: %s, expected EPERM",
		     outcome(id));
	if (id > 0)
		broker_backing_close(a, ma, id);
	close(fd);

	/* No attribute, but an O_APPEND fd. */
	fd = open_as(UID_A, UID_A, bp("data-o"), O_RDWR | O_APPEND);
	CHECK(fd >= 0, "A's open of data-o: %s", strerror(-fd));
	id = broker_backing_open(a, ma, fd);
	cr_expect_eq(id, -EINVAL, "BACKING_OPEN of an O_APPEND fd: %s, expected EINVAL",
		     outcome(id));
	if (id > 0)
		broker_backing_close(a, ma, id);
	close(fd);
	fd = -1;
	/* Refusals on the merits: the connection goes on, and a plain file
	 * of A's still registers. */
	fd = open_as(UID_A, UID_A, bp("data-o"), O_RDWR);
	CHECK(fd >= 0, "A's open of data-o: %s", strerror(-fd));
	id = broker_backing_open(a, ma, fd);
	CHECK(id > 0, "BACKING_OPEN of a plain file of A's: %s", outcome(id));
	CHECK(broker_backing_close(a, ma, id) == 0, "BACKING_CLOSE: %s", broker_last_message());
out:
	if (fd >= 0)
		close(fd);
	clear_flags();
	rawfuse_stop(&rf);
	broker_close(a);
}

/* Room for n fds in this process (and in a broker started after). */
static void raise_nofile(rlim_t n)
{
	struct rlimit rl;

	cr_assert(getrlimit(RLIMIT_NOFILE, &rl) == 0);
	if (rl.rlim_cur < n) {
		rl.rlim_cur = rl.rlim_max < n ? rl.rlim_max : n;
		cr_assert(setrlimit(RLIMIT_NOFILE, &rl) == 0);
	}
}

/* ---- 5: strangers take every connection ---- */

#define STRANGERS 18
#define STRANGER0 2000      /* uids STRANGER0 .. +STRANGERS-1: no rule */
#define PER_STRANGER 64

Test(broker_attack, strangers_cannot_take_every_connection)
{
	static int socks[STRANGERS * PER_STRANGER];
	struct broker_conn *a = NULL;
	struct broker_status st;
	struct timespec t0;
	uint64_t id = 0;
	size_t n = 0;
	double ms;
	int rc, fd = -1;

	/* Room for the strangers' sockets in this process. */
	raise_nofile(4096);
	for (int u = 0; u < STRANGERS; u++) {
		connect_only_n(STRANGER0 + u, STRANGER0 + u, socks + n, PER_STRANGER);
		n += PER_STRANGER;
	}

	/* Then A, allowed, connects and asks. */
	cr_assert_eq(broker_adopt(connect_only(UID_A, UID_A), &a), 0);
	broker_set_timeout(a, B_TIMEOUT_MS);
	TIMED(rc, ms, broker_status(a, &st));
	CHECK(rc == 0 && ms <= ANSWER_MS, "A's STATUS after %d strangers opened %d connections "
	      "each: %s after %.0f ms", STRANGERS, PER_STRANGER, outcome(rc), ms);
	TIMED(rc, ms, broker_mount(a, "m1", NULL, &fd, &id));
	CHECK(rc == 0 && ms <= ANSWER_MS, "A's MOUNT m1 after the strangers: %s after %.0f ms",
	      outcome(rc), ms);
	close(fd);
	fd = -1;
	CHECK(broker_umount(a, NULL, id) == 0, "UMOUNT: %s", broker_last_message());

	/* Every stranger's connection was closed by the broker. */
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (size_t i = 0; i < n; i++) {
		double left = ANSWER_MS - ms_since(&t0);

		CHECK(eof_within(socks[i], left > 0 ? (int)left : 0),
		      "connection %zu of stranger uid %zu still open %.0f ms on", i % PER_STRANGER,
		      STRANGER0 + i / PER_STRANGER, ms_since(&t0));
	}
out:
	if (fd >= 0)
		close(fd);
	for (size_t i = 0; i < n; i++)
		close(socks[i]);
	broker_close(a);
}

/* ---- 5b: allowed uids fill every slot ---- */

#define HOLDERS 16
#define HOLDER0 3000        /* uids HOLDER0 .. +HOLDERS: allowed, never mount */
#define PER_HOLDER 60       /* HOLDER0 + HOLDERS (the biggest) holds 64 */

/*
 * 16 allowed uids with 60 connections each and one with 64: 1024, all the
 * broker takes. A newcomer whose uid holds fewer than the biggest holder
 * evicts that holder's least recently used connection instead of being
 * turned away: A gets its STATUS and MOUNT, one connection of the biggest
 * holder's is closed, nobody else's.
 */
Test(broker_attack, a_full_broker_evicts_the_biggest_holder)
{
	static int socks[HOLDERS * PER_HOLDER + 64];
	const size_t n_small = HOLDERS * PER_HOLDER;
	struct broker_conn *a = NULL;
	struct broker_status st;
	struct timespec t0;
	char text[8192];
	size_t n = 0, len, evicted = 0;
	uint64_t id = 0;
	double ms;
	int rc, fd = -1;

	raise_nofile(4096);
	len = (size_t)snprintf(text, sizeof(text),
			       "allow uid=%d root=%s max_mounts=3 max_backing=256\n"
			       "allow uid=%d root=%s max_mounts=2 max_backing=2 allow_other=1\n",
			       PEER, bk.root, PEER2, bk.root2);
	for (int u = 0; u <= HOLDERS; u++)
		len += (size_t)snprintf(text + len, sizeof(text) - len,
					"allow uid=%d root=%s max_mounts=1 max_backing=1\n",
					HOLDER0 + u, bk.outside);
	write_policy(text);
	broker_kill(SIGTERM);
	broker_start();
	for (int u = 0; u < HOLDERS; u++) {
		connect_only_n(HOLDER0 + u, HOLDER0 + u, socks + n, PER_HOLDER);
		n += PER_HOLDER;
	}
	connect_only_n(HOLDER0 + HOLDERS, HOLDER0 + HOLDERS, socks + n, 64);
	n += 64;
	usleep(500000); /* all accepted by now */

	cr_assert_eq(broker_adopt(connect_only(UID_A, UID_A), &a), 0);
	broker_set_timeout(a, B_TIMEOUT_MS);
	TIMED(rc, ms, broker_status(a, &st));
	CHECK(rc == 0 && ms <= ANSWER_MS, "A's STATUS with all 1024 connections taken: %s after "
	      "%.0f ms", outcome(rc), ms);
	TIMED(rc, ms, broker_mount(a, "m1", NULL, &fd, &id));
	CHECK(rc == 0 && ms <= ANSWER_MS, "A's MOUNT m1 with all 1024 connections taken: %s "
	      "after %.0f ms", outcome(rc), ms);
	close(fd);
	fd = -1;
	CHECK(broker_umount(a, NULL, id) == 0, "UMOUNT: %s", broker_last_message());
	/* One of the biggest holder's went, nobody else's. */
	clock_gettime(CLOCK_MONOTONIC, &t0);
	do {
		for (size_t i = n_small; i < n; i++)
			evicted += eof_within(socks[i], 0);
		if (!evicted)
			usleep(10000);
	} while (!evicted && ms_since(&t0) < ANSWER_MS);
	CHECK(evicted, "no connection of uid %d (the biggest holder, 64) was closed for A's",
	      HOLDER0 + HOLDERS);
	for (size_t i = 0; i < n_small; i++)
		CHECK(!eof_within(socks[i], 0), "connection %zu of uid %zu (60 connections) was "
		      "closed, not one of uid %d's (64)", i % PER_HOLDER, HOLDER0 + i / PER_HOLDER,
		      HOLDER0 + HOLDERS);
out:
	if (fd >= 0)
		close(fd);
	for (size_t i = 0; i < n; i++)
		close(socks[i]);
	broker_close(a);
}

/* ---- 6: B's workload while A attacks ---- */

#define ATTACK_LINGER_S 2

/*
 * A, in a child of its own uid: every 50 ms one of a socket holding a
 * lingering TCP socket as a backing fd (1a), three fds with a BACKING_OPEN (1b),
 * a connection opened and dropped, a connection dropped half-way through a
 * frame header. The TCP peers it keeps (the last 64) make each close
 * linger ATTACK_LINGER_S. Never returns.
 */
static void attacker(uint64_t mount_id, volatile unsigned long *attacks)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int peers[64];
	size_t npeers = 0;

	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", bk.sock);
	for (unsigned long i = 0;; i++) {
		int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0), fds[3] = { -1, -1, -1 };
		size_t nfds = 0;
		bool lingers = false; /* a new TCP peer is peers[npeers - 1] */

		if (s < 0 || connect(s, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
			/* Refused or cut off: fine, try again. */
			if (s >= 0)
				close(s);
			usleep(50000);
			continue;
		}
		switch (i % 4) {
		case 0: /* 1a */
			fds[0] = lingering_tcp_into(ATTACK_LINGER_S, peers, &npeers, 64);
			lingers = fds[0] >= 0;
			if (lingers)
				fds[0] = socket_holding(fds[0]);
			nfds = fds[0] >= 0 ? 1 : 0;
			break;
		case 1: /* 1b */
			fds[0] = open("/dev/null", O_RDONLY | O_CLOEXEC);
			fds[1] = open("/dev/null", O_RDONLY | O_CLOEXEC);
			fds[2] = lingering_tcp_into(ATTACK_LINGER_S, peers, &npeers, 64);
			lingers = fds[2] >= 0;
			nfds = fds[0] >= 0 && fds[1] >= 0 && fds[2] >= 0 ? 3 : 0;
			break;
		case 2: /* connect, drop */
			break;
		case 3: { /* half a header, drop */
			uint8_t hdr[2] = { 0, 0 };

			(void)!send(s, hdr, sizeof(hdr), MSG_NOSIGNAL);
			break;
		}
		}
		if (nfds && send_backing_open(s, mount_id, fds, nfds) == 0) {
			(*attacks)++;
		} else if (lingers) {
			/* Not sent (refused, cut off): the last reference is
			 * ours. Reset the TCP connection first. */
			close(peers[--npeers]);
		}
		/* Ours at once, so the broker's is the last (if ours is,
		 * our wait is cut short). */
		for (int k = 2; k >= 0; k--)
			if (fds[k] >= 0)
				close_was_quick(fds[k], 100);
		close(s);
		usleep(50000);
	}
}

Test(broker_attack, a_tenant_under_attack_keeps_its_service)
{
	static struct rawfuse rf;
	struct broker_conn *a = connect_as(UID_A, UID_A), *b = victim();
	uint64_t ma = mount_ok(a, "m1", NULL, NULL);
	uint64_t mb = served_mount(b, "n1", UID_B, NULL, &rf, NULL);
	volatile unsigned long *attacks;
	double ms, worst = 0;
	struct timespec t0;
	int rounds = 0, fd = -1, id = 0, rc;
	pid_t pid;

	serve_add(&rf);
	mkdir_owned(bp("stage"), UID_B, 0700);
	attacks = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	cr_assert(attacks != MAP_FAILED);
	pid = fork();
	cr_assert(pid >= 0);
	if (pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		alarm(60);
		if (drop_to(UID_A) < 0)
			_exit(2);
		attacker(ma, attacks);
	}
	bk_child(pid);
	/* Once the attack is under way. */
	for (int i = 0; i < 200 && *attacks < 2; i++)
		usleep(10000);
	CHECK(*attacks >= 2, "the attacker did not get going");

	/* B's workload, as ferry-mountd's passthrough opens: a fresh staging
	 * file of B's registered and released, each round trip timed. */
	clock_gettime(CLOCK_MONOTONIC, &t0);
	while (ms_since(&t0) < 5000) {
		char path[PATH_MAX];

		snprintf(path, sizeof(path), "%s", bp("stage/s%d", rounds));
		fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
		CHECK(fd >= 0 && fchown(fd, UID_B, UID_B) == 0, "staging file: %s", strerror(errno));
		TIMED(id, ms, broker_backing_open(b, mb, fd));
		worst = ms > worst ? ms : worst;
		CHECK(id > 0 && ms <= ANSWER_MS, "B's BACKING_OPEN (round %d, %lu attacks so far): "
		      "%s after %.0f ms", rounds + 1, *attacks, outcome(id), ms);
		TIMED(rc, ms, broker_backing_close(b, mb, id));
		worst = ms > worst ? ms : worst;
		CHECK(rc == 0 && ms <= ANSWER_MS, "B's BACKING_CLOSE (round %d, %lu attacks so far): "
		      "%s after %.0f ms", rounds + 1, *attacks, outcome(rc), ms);
		id = 0;
		close(fd);
		fd = -1;
		unlink(path);
		rounds++;
	}
	cr_log_info("B: %d rounds, slowest round trip %.1f ms; A: %lu attacks", rounds, worst,
		    *attacks);
	/* Refused or cut off, A may get few frames in; a few are enough. */
	CHECK(*attacks >= 4, "only %lu attacks got to the broker in 5 s: the test proves little",
	      *attacks);
out:
	if (fd >= 0)
		close(fd);
	bk_reap_children(); /* its TCP peers go with it: the lingers end */
	munmap((void *)attacks, 4096);
	rawfuse_stop(&rf);
	broker_close(a);
	broker_close(b);
}

/* ---- 7: idle connections ---- */

Test(broker_attack, idle_connections_are_closed)
{
	const char *args[] = { "--idle-timeout", "2", NULL };
	struct broker_conn *m = NULL;
	struct timespec t0;
	bool closed;
	double ms;
	int s = -1;

	broker_kill(SIGTERM);
	broker_start_args(args);
	/* One STATUS when it connects, then nothing. */
	s = connect_raw(UID_A, UID_A);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	/* This one mounts, then says nothing either. */
	m = connect_as(UID_A, UID_A);
	broker_set_timeout(m, 2000);
	mount_ok(m, "m1", NULL, NULL);
	closed = eof_within(s, 6000);
	ms = ms_since(&t0);
	CHECK(closed, "an idle connection was still open after %.0f ms (--idle-timeout 2)", ms);
	CHECK(ms >= 1500, "the idle connection was closed after %.0f ms, before the idle timeout",
	      ms);
	while (ms_since(&t0) < 4500)
		usleep(100000);
	CHECK(!is_dead(m), "a connection that did MOUNT was closed as idle");
out:
	if (s >= 0)
		close(s);
	broker_close(m);
}

/* ---- 8: what one tenant learns of another ---- */

/* msg with the decimal id replaced by "<id>". */
static void normalized(char *out, size_t len, const char *msg, uint64_t id)
{
	char num[24];
	size_t o = 0, nn;

	snprintf(num, sizeof(num), "%" PRIu64, id);
	nn = strlen(num);
	while (*msg && o + 5 < len) {
		if (!strncmp(msg, num, nn)) {
			memcpy(out + o, "<id>", 4);
			o += 4;
			msg += nn;
		} else {
			out[o++] = *msg++;
		}
	}
	out[o] = '\0';
}

/* Does msg name A: its uid, or its policy root (not root2, B's)? */
static bool names_a(const char *msg)
{
	char uid[16];
	size_t nr = strlen(bk.root);

	snprintf(uid, sizeof(uid), "%d", UID_A);
	if (strstr(msg, uid))
		return true;
	for (const char *p = strstr(msg, bk.root); p; p = strstr(p + 1, bk.root))
		if (p[nr] != '2')
			return true;
	return false;
}

/* B's refusal for A's mount id against that for a mount id that does not
 * exist: ENOENT both, and the same words. */
static void same_as_nonexistent(const char *what, int rc_a, const char *msg_a, int rc_none,
				const char *msg_none)
{
	cr_expect_eq(rc_a, -ENOENT, "%s of A's mount id by B: %s: \"%s\", expected ENOENT", what,
		     rc_a < 0 ? fm_errname(-rc_a) : "ok", msg_a);
	cr_expect(!names_a(msg_a), "%s of A's mount id by B names A: \"%s\"", what, msg_a);
	cr_expect_str_eq(msg_a, msg_none, "%s by B: \"%s\" for A's mount id, \"%s\" (%s) for one "
			 "that does not exist", what, msg_a, msg_none,
			 rc_none < 0 ? fm_errname(-rc_none) : "ok");
}

Test(broker_attack, other_tenants_mounts_are_invisible)
{
	static struct rawfuse rf;
	struct broker_conn *a = connect_as(UID_A, UID_A), *b = victim();
	uint64_t ma = mount_ok(a, "m1", NULL, NULL);
	uint64_t mb = served_mount(b, "n1", UID_B, NULL, &rf, NULL);
	uint64_t mb2 = mount_ok(b, "n2", NULL, NULL), none = ma + 1000003;
	char msg_a[BROKER_MSG_MAX + 32], msg_none[BROKER_MSG_MAX + 32];
	struct broker_status st;
	int fd, idb, rc_a, rc_none;

	serve_add(&rf);
	cr_assert(none != mb && none != mb2);
	write_text(bp("fb"), "", UID_B, 0600);
	fd = open(bp("fb"), O_RDWR | O_CLOEXEC);
	cr_assert(fd >= 0);
	idb = broker_backing_open(b, mb, fd);
	cr_assert(idb > 0, "B's BACKING_OPEN: %s", outcome(idb));

	rc_none = broker_umount(b, NULL, none);
	normalized(msg_none, sizeof(msg_none), broker_last_message(), none);
	rc_a = broker_umount(b, NULL, ma);
	normalized(msg_a, sizeof(msg_a), broker_last_message(), ma);
	same_as_nonexistent("UMOUNT", rc_a, msg_a, rc_none, msg_none);

	rc_none = broker_backing_open(b, none, fd);
	normalized(msg_none, sizeof(msg_none), broker_last_message(), none);
	rc_a = broker_backing_open(b, ma, fd);
	normalized(msg_a, sizeof(msg_a), broker_last_message(), ma);
	same_as_nonexistent("BACKING_OPEN", rc_a, msg_a, rc_none, msg_none);
	if (rc_a > 0)
		broker_backing_close(a, ma, rc_a);

	rc_none = broker_backing_close(b, none, idb);
	normalized(msg_none, sizeof(msg_none), broker_last_message(), none);
	rc_a = broker_backing_close(b, ma, idb);
	normalized(msg_a, sizeof(msg_a), broker_last_message(), ma);
	same_as_nonexistent("BACKING_CLOSE", rc_a, msg_a, rc_none, msg_none);
	cr_expect(fm_is_mounted(bp("root/m1")), "A's mount is gone");

	/* Each tenant's STATUS: its own figures. */
	cr_assert_eq(broker_status(a, &st), 0);
	cr_expect_eq(st.mounts, 1, "A's STATUS: mounts %" PRIu64 ", A has 1 (B 2)", st.mounts);
	cr_expect_eq(st.backing_ids, 0, "A's STATUS: backing_ids %" PRIu64 ", A has 0 (B 1)",
		     st.backing_ids);
	cr_assert_eq(broker_status(b, &st), 0);
	cr_expect_eq(st.mounts, 2, "B's STATUS: mounts %" PRIu64 ", B has 2 (A 1)", st.mounts);
	cr_expect_eq(st.backing_ids, 1, "B's STATUS: backing_ids %" PRIu64 ", B has 1 (A 0)",
		     st.backing_ids);
	/* Root's: everything. */
	bk_status(&st);
	cr_expect_eq(st.mounts, 3, "root's STATUS: mounts %" PRIu64 ", expected 3", st.mounts);
	cr_expect_eq(st.backing_ids, 1, "root's STATUS: backing_ids %" PRIu64 ", expected 1",
		     st.backing_ids);

	close(fd);
	cr_expect_eq(broker_backing_close(b, mb, idb), 0, "%s", broker_last_message());
	rawfuse_stop(&rf);
	broker_close(a);
	broker_close(b);
}
