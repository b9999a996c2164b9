/*
 * broker_client: the client side of ferry-brokerd's protocol
 * (proto/broker.proto), for ferry-mountd and the ferry CLI. Each call here
 * is the stub of one handler in brokerd/ (broker_backing_open() here,
 * handle_backing_open() there), after OpenSSH's monitor_wrap.c.
 *
 * Threads: one struct broker_conn may be used by many threads at once (the
 * FUSE workers of a mount). Each call takes a request id, sends its frame
 * whole under a send lock, and waits for the reply with that id; whichever
 * waiting thread finds no one reading becomes the reader and hands every
 * reply it reads to its waiter, until its own comes (leader/follower: no
 * thread of its own, and an uncontended call is one sendmsg and the reads of
 * its reply). So requests from many threads are pipelined on one socket.
 *
 * Errors: 0 or a positive value on success, a negative errno otherwise: the
 * broker's refusal (its message is in broker_last_message()), or a
 * transport error. A broker that went away (or broke the protocol) makes the
 * call that saw it fail with -EPIPE (-ETIMEDOUT after the timeout) and every
 * later call on the connection with -ENOTCONN until broker_reconnect().
 * Sends use MSG_NOSIGNAL: never SIGPIPE. Every fd made here is O_CLOEXEC.
 * Nothing here logs.
 *
 * After a broker restart (or any reconnect) the broker still knows the
 * mounts it made (same mount ids) but holds no /dev/fuse fd for them:
 * broker_attach() the mount's fd again before asking for backing files.
 * Backing ids registered before stay valid in the kernel and may be closed
 * through the new connection.
 */
#ifndef FERRY_BROKER_CLIENT_H
#define FERRY_BROKER_CLIENT_H

#include <stddef.h>
#include <stdint.h>

#define BROKER_PROTO_VERSION 1u
#define BROKER_DEFAULT_SOCKET "/run/ferryfs/broker.sock"
/* The largest frame either side sends or accepts; the most fds a request
 * carries (BACKING_OPEN_MANY), and a reply. */
#define BROKER_FRAME_MAX 4096u
#define BROKER_FDS_MAX 16u
#define BROKER_REPLY_FDS_MAX 1u
/* The most backing ids one BACKING_CLOSE_MANY closes. */
#define BROKER_CLOSE_MANY_MAX 64u
/* Status.features bits (proto Feature). */
#define BROKER_FEATURE_MANY 0x1u
/* A mount name (relative to the policy root) and the options of a Mount. */
#define BROKER_NAME_MAX 1024u
#define BROKER_OPTIONS_MAX 16u
#define BROKER_OPTION_MAX 256u
#define BROKER_MSG_MAX 256u
/* The longest policy root a Status reply carries. */
#define BROKER_ROOT_MAX 2048u
/* Replies of broker_backing_close_nowait() left unread at most. */
#define BROKER_NOWAIT_MAX 32u
/* Default wait for a reply before the connection is given up. */
#define BROKER_TIMEOUT_MS_DEFAULT 30000

/* The request types: one enum for both sides (brokerd's dispatch table). */
enum broker_msg {
	BROKER_MSG_MOUNT = 1,
	BROKER_MSG_UMOUNT,
	BROKER_MSG_ATTACH,
	BROKER_MSG_BACKING_OPEN,
	BROKER_MSG_BACKING_CLOSE,
	BROKER_MSG_STATUS,
	BROKER_MSG_REATTACH,
	BROKER_MSG_BACKING_OPEN_MANY,
	BROKER_MSG_BACKING_CLOSE_MANY,
	BROKER_MSG_COUNT            /* one past the last */
};

/* The broker's counters (proto Status). */
struct broker_status {
	uint64_t connections;
	uint64_t peers;
	uint64_t mounts;
	uint64_t backing_ids;
	uint64_t fds;
	uint64_t requests;
	uint64_t refusals;
	uint32_t features;          /* BROKER_FEATURE_* this broker understands */
	char root[BROKER_ROOT_MAX + 1]; /* the caller's policy root; "" if no rule matches */
};

struct broker_conn;

/* Connects to the broker's socket. */
int broker_connect(const char *path, struct broker_conn **out);
/* Takes over sock, a connected stream socket (it is closed by broker_close);
 * such a connection cannot reconnect. */
int broker_adopt(int sock, struct broker_conn **out);
/* Closes the socket and frees c; no call may be running on it. Accepts NULL. */
void broker_close(struct broker_conn *c);
/*
 * For a connection that failed: waits until no call is running on it any
 * more, then connects to the same path again. 0 if it is (or already was)
 * connected. Safe to call from several threads at once.
 */
int broker_reconnect(struct broker_conn *c);
/* How long a call waits for its reply (ms, > 0); the default is
 * BROKER_TIMEOUT_MS_DEFAULT. A timeout fails the connection. */
int broker_set_timeout(struct broker_conn *c, int ms);

/*
 * Mounts at name (relative to the peer's policy root) with options, a
 * NULL-terminated array (NULL: none). On success *fuse_fd is the new
 * mount's /dev/fuse fd (the caller's; libfuse serves it through the
 * "/dev/fd/N" mountpoint form) and *mount_id its id.
 */
int broker_mount(struct broker_conn *c, const char *name, const char *const *options,
		 int *fuse_fd, uint64_t *mount_id);
/* Hands the broker a dup of fuse_fd (the caller keeps its own) for the FUSE
 * mount at name; *mount_id gets its id. */
int broker_attach(struct broker_conn *c, const char *name, int fuse_fd, uint64_t *mount_id);
/* Unmounts a mount the broker made for this peer: by name, or by mount_id
 * if name is NULL. */
/* Takes over the FUSE connection of the peer's mount at name, which lost
 * its ferry-mountd (proto Reattach): *fuse_fd is a dup of the broker's
 * /dev/fuse fd (the caller's). -ENOENT: no such mount (mount it); -EBUSY:
 * a live daemon serves it. */
int broker_reattach(struct broker_conn *c, const char *name, int *fuse_fd, uint64_t *mount_id);
int broker_umount(struct broker_conn *c, const char *name, uint64_t mount_id);
/* Registers fd (a regular file of the peer's, open read-write) as a
 * passthrough backing file of the mount: returns the backing id (> 0) or a
 * negative errno. fd stays the caller's. */
int broker_backing_open(struct broker_conn *c, uint64_t mount_id, int fd);
int broker_backing_close(struct broker_conn *c, uint64_t mount_id, int backing_id);
/*
 * The same without waiting for the reply (for FUSE RELEASE, where nothing
 * waits for the answer anyway): 0 once the request is sent, or a transport
 * error. The reply is taken and dropped by whichever call reads next; a
 * refusal is only counted (broker_async_failures()). With
 * BROKER_NOWAIT_MAX replies unread it waits, like broker_backing_close().
 * So a passthrough open through the broker costs one round trip.
 */
int broker_backing_close_nowait(struct broker_conn *c, uint64_t mount_id, int backing_id);
/*
 * Registers fds[0..n) (1 <= n <= BROKER_FDS_MAX) in one request, each as
 * broker_backing_open() would: 0 with ids[k] the backing id (> 0) of
 * fds[k] or a negative errno (the first refusal's message is in
 * broker_last_message()), or a negative errno for all of them:
 * -EOPNOTSUPP (without a request) if the broker does not list
 * BROKER_FEATURE_MANY. The fds stay the caller's.
 */
int broker_backing_open_many(struct broker_conn *c, uint64_t mount_id, const int *fds, size_t n,
			     int *ids);
/* Closes ids[0..n) (1 <= n <= BROKER_CLOSE_MANY_MAX) in one request: 0
 * with errs[k] (0 or a negative errno) for each, or a negative errno for
 * all; -EOPNOTSUPP as above. The nowait form is broker_backing_close_nowait()'s
 * for many: each refusal counts in broker_async_failures(), each id lost
 * with the connection in broker_lost_closes(). */
int broker_backing_close_many(struct broker_conn *c, uint64_t mount_id, const int *ids, size_t n,
			      int *errs);
int broker_backing_close_many_nowait(struct broker_conn *c, uint64_t mount_id, const int *ids,
				     size_t n);
/* BROKER_FEATURE_* of the broker at the other end, as its Status said at
 * the last connect (or the last broker_status(); 0 until then on a
 * connection from broker_adopt()). */
uint32_t broker_features(struct broker_conn *c);
/* Replies to nowait calls that were refusals, or lost with the connection. */
uint64_t broker_async_failures(struct broker_conn *c);
/*
 * The backing ids of nowait closes whose replies were lost with the
 * connection (the broker died with the request unread, or before it
 * answered): up to max of them into ids, forgotten here; how many. Each may
 * or may not have been closed; sending the close again after
 * broker_reconnect() is safe, as the kernel numbers backing ids cyclically
 * (a closed id is not given out again meanwhile, and closing it again is
 * refused harmlessly).
 */
size_t broker_lost_closes(struct broker_conn *c, int *ids, size_t max);
int broker_status(struct broker_conn *c, struct broker_status *st);

/*
 * The mount name of mountpoint beneath root (the root Status reports): both
 * absolute, mountpoint canonical (realpath). On success *name is malloc'ed
 * (the caller frees it). -EXDEV if mountpoint is not strictly beneath root
 * (compared as given, then with root's symlinks resolved), -EINVAL if it is
 * not a valid name (see proto Mount.name), -ENOMEM.
 */
int broker_mount_name(const char *root, const char *mountpoint, char **name);
/* mountpoint as an absolute path (malloc'ed; NULL with errno set), found
 * without looking at the mountpoint itself: only its parent is resolved.
 * A brokered mount whose ferry-mountd died still has its connection (the
 * broker holds it), and a stat() of its root would wait for a daemon. */
char *broker_mountpoint_path(const char *mountpoint);

/* The broker's message for the calling thread's last refused call ("" if
 * there was none). Thread-local storage, valid until the thread's next call. */
const char *broker_last_message(void);

#endif
