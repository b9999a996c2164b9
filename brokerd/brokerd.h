/*
 * ferry-brokerd: the one privileged process of a node (DESIGN.md, "Processes
 * and trust"). It keeps CAP_SYS_ADMIN (and, permitted but effective only
 * while it switches its fsuid/fsgid to a peer's, CAP_SETUID/CAP_SETGID) and
 * serves a narrow request set (proto/broker.proto) over a Unix socket:
 * MOUNT and UMOUNT of FUSE file systems beneath the peer's policy root,
 * ATTACH of a peer's /dev/fuse fd, BACKING_OPEN/BACKING_CLOSE of
 * passthrough backing files, STATUS.
 *
 * One libevent loop, one thread, owns every structure below (the closer
 * thread owns only its queue of fds to close). So a handler must never
 * block on anything a peer controls: the broker never looks inside a FUSE
 * mount (no stat that may reach a FUSE server, no statfs of a peer's file
 * that may be on one), never closes on the loop an fd that may be a FUSE
 * file (close sends FLUSH and waits), and never waits for a peer to read.
 *
 * Files, and who owns what:
 *   main.c        options, -n, --ping, start-up, the loop, shutdown
 *   privs.c       capabilities at start; the switch to a peer's fsuid/fsgid
 *   server.c      the socket, connections, frames, the dispatch table,
 *                 replies and their output queue
 *   request.c     pure: decoding and checking requests (names, options),
 *                 encoding replies -- what the fuzzer drives
 *   peer.c        a peer's identity when it connects; owners
 *   mount.c       MOUNT, UMOUNT, ATTACH: resolution beneath the root, the
 *                 new mount API
 *   backing.c     BACKING_OPEN, BACKING_CLOSE (and _MANY): the checks of the file fd and
 *                 the ioctls
 *   mount_table.c the mounts in memory and on disk (--state-dir), rebuilt
 *                 against /proc/self/mountinfo at start and from time to time
 *   fsprobe.c     what a file or mount is, asked without reaching a FUSE
 *                 server: mount identity, file system type, mountinfo
 *   closer.c      letting go of fds peers sent: a close that may wait for
 *                 a FUSE server happens on a thread of its own
 *   idset.c       pure: a set of backing ids
 *
 * Ownership: struct broker owns the connections, owners and mounts. An
 * owner (a uid and its policy root: what the policy tells apart) owns its
 * mounts; a mount owns its /dev/fuse fd and its set of backing ids. A
 * connection points at its owner (counted) and owns its pending output. All
 * internal functions return 0 or a negative errno.
 */
#ifndef FERRY_BROKERD_H
#define FERRY_BROKERD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/queue.h>
#include <sys/types.h>

#include <event2/event.h>

#include "broker_client.h"
#include "policy.h"
#include "rpc_frame.h"

#define BROKER_STATE_DIR_DEFAULT "/run/ferryfs/brokerd"
#define BROKER_CONN_MAX 1024u        /* connections in all */
#define BROKER_CONN_PER_UID 64u      /* connections of one uid */
#define BROKER_CONN_OUT_MAX 64u      /* replies queued before we stop reading a peer */
#define BROKER_FRAMES_PER_WAKE 32u   /* frames taken from one peer before others go */
#define BROKER_FRAME_TIMEOUT_S 10    /* a frame started must be whole by then, and
                                        queued replies must move within it */
#define BROKER_IDLE_TIMEOUT_S 120    /* default --idle-timeout: a connection that
                                        serves no mount and sends nothing */
/* Room for every fd one recvmsg can bring (the kernel's SCM_MAX_FD), so
 * that the kernel never drops (and so closes, in our thread) any. */
#define BROKER_RECV_FDS_ROOM 253u
#define BROKER_FDS_RESERVED 64u      /* our own fds: listener, state, fusectl, logs... */
#define BROKER_STRANGER_PENDING_MAX 256u /* refused sockets closing before accept pauses */
#define BROKER_REAP_INTERVAL_S 30    /* mounts checked against mountinfo */
#define BROKER_MOUNT_HASH 64u
#define BROKER_CLOSE_STALL_S 5       /* a close stuck this long: its owner is cut off */
#define BROKER_CLOSE_PENDING_MAX 8u  /* fds in an owner's closer before its peers are paused */
/* fds an owner's connections may hold in frames not read whole yet before
 * its peers are paused: a frame comes whole from a well-behaved peer, so
 * this is four BACKING_OPEN_MANY frames caught half-way at once. */
#define BROKER_OWNER_FRAME_FDS_MAX (4u * BROKER_FDS_MAX)

#define FUSE_SUPER_MAGIC_ 0x65735546u
#define OVERLAYFS_SUPER_MAGIC_ 0x794c7630u

struct broker;
struct conn;
struct owner;
struct bmount;

/* ---- idset.c: a set of backing ids (open addressing) ---- */

struct idset {
	uint32_t *slots;       /* 0: empty */
	size_t cap;            /* a power of two, or 0 */
	size_t n;
};

/* 0, or -ENOMEM; -EEXIST if id (> 0) is there already. */
int idset_add(struct idset *s, uint32_t id);
bool idset_has(const struct idset *s, uint32_t id);
/* true if it was there. */
bool idset_del(struct idset *s, uint32_t id);
void idset_free(struct idset *s);  /* empties it; the struct may be reused */

/* ---- request.c: pure decoding and checking ---- */

struct mount_opts {
	bool allow_other;
	bool default_permissions;
	bool ro, noexec, noatime, nodiratime;
	uint32_t max_read;              /* 0: not given */
	char fsname[129];               /* "" : not given */
	char subtype[33];
};

struct broker_req {
	enum broker_msg type;
	uint64_t id;
	char name[BROKER_NAME_MAX + 1]; /* MOUNT, ATTACH; UMOUNT if has_name */
	bool has_name;
	struct mount_opts opts;         /* MOUNT */
	uint64_t mount_id;              /* UMOUNT (if !has_name), BACKING_* */
	uint32_t backing_id;            /* BACKING_CLOSE */
	uint32_t backing_ids[BROKER_CLOSE_MANY_MAX]; /* BACKING_CLOSE_MANY */
	size_t nids;
};

/* 0 if name is a valid mount name (see proto Mount.name); else -EINVAL and
 * why in err. */
int broker_name_check(const char *name, char *err, size_t errlen);
/* Parses one option into o (which collects them); -EINVAL with why. */
int broker_option_parse(const char *opt, struct mount_opts *o, unsigned *seen, char *err,
			size_t errlen);
/*
 * Decodes and checks one request frame that came with nfds fds. On success
 * *out holds it. On failure returns -EBADMSG (does not decode),
 * -EPROTONOSUPPORT (version), -EOPNOTSUPP (no known body), -EBADF (wrong
 * number of fds), -EINVAL (bad name, option or field), with why in err;
 * out->id is the request's id if it got that far, else 0. Every failure
 * here ends the connection.
 */
int broker_request_parse(const uint8_t *buf, size_t len, size_t nfds, struct broker_req *out,
			 char *err, size_t errlen);
/* What the policy rule says of a parsed request (MOUNT: allow_other). 0 or
 * -EPERM with why. rule may be NULL (no rule: only STATUS passes). */
int broker_request_permitted(const struct policy_rule *rule, const struct broker_req *q,
			     char *err, size_t errlen);
const char *broker_msg_name(enum broker_msg t);

/* A reply, before encoding. */
struct broker_rep {
	uint64_t id;
	int error;                     /* 0 or -errno */
	bool closing;
	char message[BROKER_MSG_MAX];
	enum broker_msg type;          /* which body, if error == 0 */
	uint64_t mount_id;             /* MOUNT, ATTACH */
	uint32_t backing_id;           /* BACKING_OPEN */
	/* BACKING_OPEN_MANY (ids and errors, one per fd) and
	 * BACKING_CLOSE_MANY (errors, one per id): 0 or -errno each. */
	uint32_t many_ids[BROKER_CLOSE_MANY_MAX];
	int many_errors[BROKER_CLOSE_MANY_MAX];
	size_t nmany;
	struct broker_status status;   /* STATUS */
	int fd;                        /* MOUNT: rides with the reply; owned; -1 */
	uint32_t fds_safe;             /* bit k: the handler showed the request's
	                                  fd k cannot reach a FUSE server, so it
	                                  is closed in place */
};

/* Encodes rep (without its fd) as a frame payload into buf (room for
 * BROKER_FRAME_MAX); *len gets its size. */
int broker_reply_encode(const struct broker_rep *rep, uint8_t *buf, size_t *len);

/* ---- privs.c ---- */

/* Closes every fd above 2 (the first thing at start). */
void privs_close_stray_fds(void);
/* Are the capabilities privs_drop() keeps there at all? -EPERM with a
 * message naming the missing one. */
int privs_check(char *err, size_t errlen);
/* At start, as root: keeps CAP_SYS_ADMIN effective, CAP_SETUID/CAP_SETGID
 * permitted only, drops the rest (bounding set too), clears ambient and
 * inheritable caps and supplementary groups (for good), sets no_new_privs. Errors say
 * what is missing in err. */
int privs_drop(char *err, size_t errlen);
/* fsuid/fsgid become the peer's (groups are empty already); verified. Until
 * privs_restore(), CAP_SETUID/CAP_SETGID stay raised. */
int privs_become(uid_t uid, gid_t gid);
/* Back to our own fsuid/fsgid and capabilities; verified. A failure here is
 * fatal: the process cannot trust its own credentials any more. */
void privs_restore(void);
/* Frees what privs_drop() prepared (at exit). */
void privs_fini(void);
/* The capability sets as text, for logs. */
void privs_describe(char *buf, size_t len);

/* ---- peer.c ---- */

struct owner {
	uid_t uid;
	char *root;                    /* the policy root; owned */
	unsigned nconns;
	unsigned nmounts;
	unsigned nbacking;             /* live ids over its mounts */
	unsigned frame_fds;            /* fds its connections hold in partial frames */
	struct closer *closer;         /* closes what its peers sent; owned */
	bool wedged;                   /* a close has been stuck: cut off */
	uint64_t aborted_seq;          /* the stuck close whose mount we aborted */
	TAILQ_HEAD(, bmount) mounts;
	TAILQ_ENTRY(owner) link;
};

struct peer {
	pid_t pid;
	uid_t uid;
	gid_t gid;
	char *cgroup;                  /* NULL: unknown; owned */
	const struct policy_rule *rule;/* NULL: not in the policy */
	struct owner *owner;           /* with rule: counted reference */
};

/* SO_PEERCRED, then the cgroup (v2 line of /proc/PID/cgroup, trusted only if
 * the pidfd shows the same process still alive after the read). */
int peer_identify(struct broker *b, int sock, struct peer *p);
void peer_clear(struct broker *b, struct peer *p);
/* The owner for (uid, root), made if need be. */
struct owner *owner_get(struct broker *b, uid_t uid, const char *root);
/* Frees it if nothing refers to it any more (no connection, no mount,
 * nothing left in its closer). */
void owner_put(struct broker *b, struct owner *o);
/* Could any rule admit uid/gid (whatever its cgroup)? The cheap test made
 * at accept before anything else is read about a peer. */
bool peer_may_be_admitted(const struct broker *b, uid_t uid, gid_t gid);
/* At exit, after the connections and mounts: every owner and its closer. */
void owners_free_all(struct broker *b);

/* ---- fsprobe.c ---- */

struct mnt_ident {
	uint64_t id;                   /* unique mount id (0: kernel cannot tell) */
	uint32_t old_id;               /* mountinfo's */
	uint64_t dev;                  /* st_dev of its root, makedev() */
	bool is_root;                  /* fd is the root of its mount */
};

/* Identity of the mount fd is on, without reaching its file system. */
int fsprobe_mount_ident(int fd, struct mnt_ident *m);
/*
 * Is a regular file (whose statx gave dev, the unique mnt_id and the
 * reusable old_mnt_id) on a FUSE or overlay file system? 0: no; -EXDEV:
 * yes; other: cannot tell. Uses statmount(), then the fusectl mount, then
 * the mountinfo of the peer's process (pid), which lists the mounts of its
 * namespace; never the file system itself.
 */
int fsprobe_fs_forbidden(struct broker *b, pid_t pid, uint64_t dev, uint64_t mnt_id,
			 uint32_t old_mnt_id, char *err, size_t errlen);
/* Is the mount with unique id (and that mountinfo id) still in our mount
 * namespace? 1 yes, 0 no, -EOPNOTSUPP: the kernel cannot tell (statmount). */
int fsprobe_mount_alive(uint64_t id, uint32_t old_id);
/* Where the mount with unique id is mounted, as a path in our namespace
 * (statmount). -ENOENT: not in our namespace any more. */
int fsprobe_mount_point(uint64_t id, char *buf, size_t len);
/* Without asking the file system: 0 if dev/mnt_id is known to be neither
 * FUSE nor overlayfs, else -EXDEV or -EOPNOTSUPP. */
int fsprobe_fs_known_safe(struct broker *b, uint64_t dev, uint64_t mnt_id, char *err,
			  size_t errlen);
/* A private fusectl mount (detached), for fsprobe_fs_forbidden. */
int fsprobe_init(struct broker *b);
void fsprobe_fini(struct broker *b);

struct mountinfo_ent {
	uint32_t id;
	uint64_t dev;
	char fstype[32];
	bool user_id_set;
	uid_t user_id;                 /* from the super options (FUSE) */
};
/* Reads /proc/self/mountinfo: *out (malloc'ed, caller frees), *n. */
int mountinfo_read(struct mountinfo_ent **out, size_t *n);
/* The same for another process's mount namespace (/proc/PID/mountinfo). */
int mountinfo_read_pid(pid_t pid, struct mountinfo_ent **out, size_t *n);
const struct mountinfo_ent *mountinfo_find(const struct mountinfo_ent *v, size_t n, uint32_t id,
					   uint64_t dev);
int boot_id_read(char *buf, size_t len);

/* ---- closer.c ---- */

struct closer;

/* A closer with no thread yet (started at the first push); NULL: ENOMEM. */
struct closer *closer_new(void);
/* Stops and frees cl if it is idle and returns true. at_exit: closes what
 * is queued first, and leaves a closer whose close is stuck running
 * (false; the process is about to exit anyway). */
bool closer_free(struct closer *cl, bool at_exit);
/* Queues fd (owned by the closer from now on). Never blocks. */
int closer_push(struct closer *cl, int fd);
/* fds queued or being closed; 0 for NULL. */
unsigned closer_pending(struct closer *cl);
/* The same over every closer. */
unsigned closer_pending_total(void);
/* How long the current close has waited (0: none), which one (*seq), and
 * the st_dev of its file (0: unknown or not a regular file). */
double closer_stuck(struct closer *cl, uint64_t *seq, uint64_t *dev);
/* Lets go of fd, sent by a peer of owner o (NULL: a peer with no owner),
 * on o's closer: never on the loop. */
void peer_fd_drop(struct broker *b, struct owner *o, int fd);
void peer_fds_drop(struct broker *b, struct owner *o, int *fds, size_t n);
/* Every second: an owner whose close is stuck is cut off (and its own
 * FUSE connection aborted if that is where it is stuck); one whose close
 * returned is admitted again; owners left with nothing are freed. */
void closer_watch(struct broker *b);

/* ---- mount_table.c ---- */

struct bmount {
	uint64_t id;                   /* unique mount id: the protocol's mount id */
	uint32_t old_id;
	uint64_t dev;
	struct owner *owner;
	char *name;                    /* beneath owner->root; owned */
	char *cgroup;                  /* of the peer that made it; owned, may be NULL */
	gid_t gid;
	int fuse_fd;                   /* the broker's own; -1 until attached after a restart */
	bool made;                     /* made by this broker (on disk) or only attached */
	/* The connection of the ferry-mountd serving it (it made, attached
	 * or reattached the mount); NULL once that connection closed: a new
	 * daemon may then REATTACH. */
	struct conn *server;
	bool adopted;                  /* known from disk after a restart: ids from
	                                  before it are not in ids */
	time_t created;
	struct idset ids;              /* backing ids registered through us */
	TAILQ_ENTRY(bmount) olink;     /* owner->mounts */
	TAILQ_ENTRY(bmount) link;      /* b->mounts */
	struct bmount *hnext;          /* b->by_id chain */
};

/* Loads the records under the state directory, keeps those whose mount is
 * still there (mountinfo and its name beneath the root agree), drops the
 * rest. */
int mount_table_load(struct broker *b);
/* Writes m's record atomically (temp, fsync, rename, fsync dir). */
int mount_table_write(struct broker *b, const struct bmount *m);
/* Adds m (filled by the caller) to the in-memory table. */
void mount_table_add(struct broker *b, struct bmount *m);
struct bmount *mount_find_id(struct broker *b, uint64_t id);
struct bmount *mount_find_name(struct owner *o, const char *name);
/* Forgets m: closes its fd, drops its ids from the counts, removes its
 * record (if made), frees it. The kernel keeps whatever it keeps. */
void mount_forget(struct broker *b, struct bmount *m, const char *why);
/* 1 if m is still mounted (mountinfo, and statmount where it can tell), 0
 * if not, or a negative errno. */
int mount_is_live(const struct bmount *m);
/* Forgets every mount that is gone from /proc/self/mountinfo. */
void mount_reap(struct broker *b);
void mount_table_free(struct broker *b);

/* ---- mount.c ---- */

/*
 * Opens name beneath root (O_PATH, O_CLOEXEC) with the file-system identity
 * uid/gid, never following a symlink or a magic link and never leaving
 * root. mount_root false: the directory itself, on root's own mount (no
 * mount crossed, none on it): the target of a new mount. true: the parent
 * likewise, then the last component may step onto what is mounted on it:
 * the root of an existing mount. Nothing here reaches a FUSE server.
 */
int resolve_beneath(const char *root, uid_t uid, gid_t gid, const char *name, bool mount_root,
		    int *out, char *err, size_t errlen);
/* Is the mount at m's name still m? 0 with *fd (O_PATH on its root) if so;
 * -ESTALE if something else is there; other errors from resolution. */
int mount_verify(const struct bmount *m, gid_t gid, int *fd, char *err, size_t errlen);
/* For a live mount of ours whose name no longer leads to it (its peer
 * renamed a directory on the way): follows it within the root (new name,
 * record rewritten), or unmounts and forgets it if it was carried out of
 * the root (-EXDEV; m is freed then). 0 if it is where the table says. */
int mount_follow(struct broker *b, struct bmount *m);

/* ---- the handlers (mount.c, backing.c, server.c) ---- */

/* fds[0..nfds) came with the request (as many as broker_request_parse()
 * allowed for its type): the handler's to use, never to keep or close. */
typedef int (*broker_handler)(struct broker *b, struct conn *c, const struct broker_req *q,
			      const int *fds, size_t nfds, struct broker_rep *rep);
int handle_mount(struct broker *b, struct conn *c, const struct broker_req *q,
		 const int *fds, size_t nfds, struct broker_rep *rep);
int handle_umount(struct broker *b, struct conn *c, const struct broker_req *q,
		  const int *fds, size_t nfds, struct broker_rep *rep);
int handle_reattach(struct broker *b, struct conn *c, const struct broker_req *q,
		    const int *fds, size_t nfds, struct broker_rep *rep);
int handle_attach(struct broker *b, struct conn *c, const struct broker_req *q,
		  const int *fds, size_t nfds, struct broker_rep *rep);
int handle_backing_open(struct broker *b, struct conn *c, const struct broker_req *q,
			const int *fds, size_t nfds, struct broker_rep *rep);
int handle_backing_close(struct broker *b, struct conn *c, const struct broker_req *q,
			 const int *fds, size_t nfds, struct broker_rep *rep);
int handle_backing_open_many(struct broker *b, struct conn *c, const struct broker_req *q,
			     const int *fds, size_t nfds, struct broker_rep *rep);
int handle_backing_close_many(struct broker *b, struct conn *c, const struct broker_req *q,
			      const int *fds, size_t nfds, struct broker_rep *rep);
int handle_status(struct broker *b, struct conn *c, const struct broker_req *q,
		  const int *fds, size_t nfds, struct broker_rep *rep);

/* ---- server.c ---- */

struct out_frame {
	TAILQ_ENTRY(out_frame) link;
	int fd;                        /* rides with the first byte; owned; -1 */
	size_t len, off;
	uint8_t data[];                /* header + payload */
};

/* The frame being read: bounded before allocation, and fds kept in our
 * custody (rpc_reader would close surplus ones itself, on the loop). */
struct frame_in {
	uint8_t hdr[RPC_FRAME_HDR];
	size_t hdr_got;
	uint8_t *buf;
	uint32_t len, got;
	int fds[BROKER_FDS_MAX];
	size_t nfds;
};

struct conn {
	struct broker *b;
	int sock;
	struct peer peer;
	struct event *rev, *wev, *tmo;
	struct frame_in in;
	TAILQ_HEAD(, out_frame) out;
	unsigned nout;
	bool session;                  /* it made or attached a mount: no idle timeout */
	bool rights;                   /* SO_PASSRIGHTS on: its queue may hold fds */
	time_t last_active;            /* CLOCK_MONOTONIC s of its last frame */
	time_t last_moved;             /* ... of the last progress of its output */
	bool paused;                   /* not reading: too many replies queued */
	bool throttled;                /* not reading: its owner has fds closing aside */
	bool closing;                  /* close once the output is written */
	TAILQ_ENTRY(conn) link;
};

/* The peer of a connection, for handlers. */
const struct peer *conn_peer(const struct conn *c);
int server_listen(struct broker *b, const char *path, mode_t mode, gid_t gid);
/* Every second: resumes peers throttled while their fds were closing,
 * closes idle connections and those whose replies do not move. */
void server_tick(struct broker *b);
/* Takes an accepted (or socketpair) connection: identifies the peer and
 * admits or refuses it. fd is the broker's from then on. */
void server_conn_add(struct broker *b, int fd);
/* Closes every connection of o (it is wedged). */
void server_cut_off(struct broker *b, struct owner *o);
void server_close_all(struct broker *b);

/* ---- main.c: the broker ---- */

struct broker {
	struct event_base *base;
	struct policy *policy;
	const char *socket_path;
	const char *state_dir;
	int state_fd;                  /* the state directory */
	int fusectl_fd;                /* a detached fusectl mount, or -1 */
	struct closer *stranger_closer;/* sockets of peers with no owner, where
	                                  the kernel cannot keep fds out of them */
	uint64_t stranger_warned_seq;
	bool rights_gated;             /* SO_PASSRIGHTS: fds only from admitted peers */
	unsigned idle_timeout_s;
	unsigned nofile;               /* RLIMIT_NOFILE: headroom for received fds */
	unsigned conn_max;             /* BROKER_CONN_MAX, or what nofile leaves room for */
	bool accept_paused;            /* strangers' sockets pile up (stranger_backlog) */
	uint64_t refused_at_accept;    /* for the rate-limited log line */
	time_t refused_logged;
	char boot_id[64];
	int listen_fd;
	struct event *listen_ev;
	TAILQ_HEAD(, conn) conns;
	unsigned nconns;
	unsigned frame_fds;            /* fds held in partial frames, all connections */
	TAILQ_HEAD(, owner) owners;
	TAILQ_HEAD(, bmount) mounts;
	unsigned nmounts;
	uint64_t nbacking;
	struct bmount *by_id[BROKER_MOUNT_HASH];
	uint64_t requests, refusals;
};

/* Open fds of this process (/proc/self/fd). */
uint64_t broker_count_fds(void);

#endif
