/*
 * Fixture for the tests that drive ferry-brokerd, the real binary
 * (FERRY_BIN_DIR), over its socket (test_broker.c, test_broker_attack.c).
 *
 * Every test gets /tmp/ferry-broker.XXXXXX (mode 0755) with a policy, a
 * state directory, a socket and mount roots:
 *   root/        policy root of uid PEER (root's, 0755), holding m1..m4
 *                (PEER's), rootowned/ (root's), other/ (STRANGER's),
 *                link -> ../outside, mid -> real (real/x is PEER's)
 *   root2/       policy root of uid PEER2 (allow_other=1, max_backing=2),
 *                holding n1, n2 (PEER2's)
 *   outside/     PEER's, beneath no root
 * Peers are made by a child that drops to the peer's uid/gid, connects a
 * socket the test process holds and exits: SO_PEERCRED is what connect(2)
 * recorded, so the test process then speaks as that peer. connect_raw()
 * and connect_as() also prove the broker took the connection (a STATUS
 * round trip in the child); connect_only() says nothing, for peers the
 * broker turns away at accept. Operations the peer must do itself (open a
 * file as the peer, use its FUSE mount) run in children (fm_as_user,
 * open_as) on the same connection.
 *
 * Teardown aborts every FUSE connection beneath the directory, kills the
 * test's children, stops the broker, detaches whatever is mounted beneath
 * the directory and removes it. Mounts get a FUSE server only where a test needs one
 * (rawfuse_util.h); otherwise nothing ever touches them.
 *
 * Linked into every integration program (*_util.c), used by the broker ones.
 */
#ifndef FERRY_IT_BROKER_FIXTURE_UTIL_H
#define FERRY_IT_BROKER_FIXTURE_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

#include <criterion/criterion.h>

#include "broker_client.h"
#include "mount_util.h"
#include "rawfuse_util.h"

#define PEER 65534          /* uid and gid of the main peer */
#define PEER2 65533         /* the second peer (allow_other, max_backing=2) */
#define STRANGER 1234       /* in no rule */

#define BK_ARGS_MAX 8

struct bk_fixture {
	char dir[64];
	char sock[96], state[96], policy[96], log[96];
	char root[96], root2[96], outside[96];
	pid_t pid;
	uint64_t fds0;          /* the broker's fds when idle, with one connection */
	bool new_mount_ns;      /* start the broker in a mount namespace of its own */
	/* Added to the broker's command line by broker_start() (NULL-ended). */
	const char *args[BK_ARGS_MAX + 1];
	pid_t kids[8];          /* children teardown kills (bk_child) */
	size_t n_kids;
};

/* The one fixture of this test process. */
extern struct bk_fixture bk;

/* Criterion .init/.fini: the tree, the default policy, a broker. */
void bk_setup(void);
void bk_teardown(void);

/* A child of the test (a swapper, an attacker) that teardown kills and
 * reaps, if the test did not, before it removes the tree. */
void bk_child(pid_t pid);
/* Kills and reaps those still running now: SIGKILL, then up to 5 s each (a
 * child stuck in an unanswered FUSE request goes only once that connection
 * is aborted). */
void bk_reap_children(void);

/* bk.dir/<fmt>, in a ring of 16 static buffers. */
const char *bp(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void mkdir_owned(const char *path, uid_t uid, mode_t mode);
void write_text(const char *path, const char *text, uid_t uid, mode_t mode);
/* The end of the broker's log, on stderr. */
void log_tail(void);

/* ---- the broker process ---- */

/* A STATUS round trip as root on a connection of its own. */
int try_status(const char *path, struct broker_status *st);
/* Starts the broker with bk.args appended; asserts it answers. */
void broker_start(void);
/* The same with these arguments instead of bk.args (NULL-ended, or NULL). */
void broker_start_args(const char *const *args);
void broker_kill(int sig);
void write_policy(const char *text);
void default_policy(void);
/* Detaches everything mounted beneath bk.dir (deepest first); how many. */
int unmount_all(void);
/* Aborts the FUSE connection of every mount beneath bk.dir. */
void abort_fuse_beneath(void);

/* ---- peers ---- */

/* A socket connected as uid/gid that the broker has answered a STATUS on. */
int connect_raw(uid_t uid, gid_t gid);
struct broker_conn *connect_as(uid_t uid, gid_t gid);
/* A socket connected as uid/gid, nothing sent: for peers the broker may
 * turn away at once. */
int connect_only(uid_t uid, gid_t gid);
/* A connection of uid/gid whose STATUS is answered, tried again until
 * timeout_ms have passed (a peer the broker cut off is let in again once
 * what it was cut off for is over); NULL if none was. */
struct broker_conn *connect_as_within(uid_t uid, gid_t gid, int timeout_ms);
/* n such sockets into socks[], connected by one child. */
void connect_only_n(uid_t uid, gid_t gid, int *socks, size_t n);
/* fd of path opened with flags by a child running as uid/gid (passed
 * back over a socket), or -errno. */
int open_as(uid_t uid, gid_t gid, const char *path, int flags);

/* STATUS as root (global figures); asserts. */
void bk_status(struct broker_status *st);
/* Waits until the broker has one connection (ours) and no backing ids,
 * then checks its fds are what they were at the start (+ extra). */
void assert_no_leaks(int extra_fds);
/* A STATUS on c fails as on a closed connection. */
bool is_dead(struct broker_conn *c);
/* Mountinfo line of the mount at path (its last one; malloc'ed), or NULL. */
char *mountinfo_of(const char *path);
/* MOUNT that must succeed; the /dev/fuse fd into *fuse_fd, or closed. */
uint64_t mount_ok(struct broker_conn *c, const char *name, const char *const *opts,
		  int *fuse_fd);
/* A mount of uid's with a rawfuse server that took passthrough at INIT. */
uint64_t served_mount(struct broker_conn *c, const char *name, uid_t uid,
		      const char *const *opts, struct rawfuse *rf, int *fuse_fd);

#define REFUSED(expr, err)                                                               \
	do {                                                                             \
		int r_ = (expr);                                                         \
		cr_assert_eq(r_, -(err), "%s: expected %s, got %d (%s): %s", #expr,     \
			     fm_errname(err), r_, r_ < 0 ? fm_errname(-r_) : "-",       \
			     broker_last_message());                                     \
	} while (0)

/* ---- raw frames ---- */

/* Reads one reply within timeout_ms: 0 with its error, closing flag and
 * id, or a negative errno (-EAGAIN: nothing came in time; -EPIPE: EOF). */
/* Sends iov[0..niov) in one sendmsg with fds[0..n) in one SCM_RIGHTS, n
 * up to 64: more than rpc_frame_send() (and a well-behaved peer) would ever
 * send. 0, -EIO if not all went, or -errno. */
int send_iov_fds(int sock, struct iovec *iov, int niov, const int *fds, size_t n);
/* One whole frame (header and buf[0..len)) so. */
int send_frame_fds(int sock, const void *buf, size_t len, const int *fds, size_t n);
int read_reply_within(int sock, int timeout_ms, uint32_t *error, bool *closing, uint64_t *id);
/* Reads one reply (5 s at most), asserting one came. */
void read_reply(int sock, uint32_t *error, bool *closing, uint64_t *id);
/* true if the broker closed sock (EOF or reset) within timeout_ms; what
 * comes before the end (a reply) is read and dropped. */
bool eof_within(int sock, int timeout_ms);
/* After a fatal error, the broker closes: EOF within 5 s. */
void expect_eof(int sock);

#endif
