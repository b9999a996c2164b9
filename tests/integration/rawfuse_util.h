/*
 * rawfuse: a tiny FUSE server speaking the kernel protocol directly on a
 * /dev/fuse fd, in a thread of the test process. It serves a root directory
 * holding one regular file "f" (both owned by uid/gid), negotiates
 * passthrough at INIT (FUSE_PASSTHROUGH, max_stack_depth 1) and answers an
 * OPEN of "f" with FOPEN_PASSTHROUGH and backing_id when that is set (> 0),
 * else without passthrough, so WRITEs come up here and are only counted.
 *
 * For the broker tests: a mount made through ferry-brokerd needs a server
 * that answered INIT before any backing id can be registered on it, and the
 * confused-deputy test wants to see where a write lands. It also counts
 * requests sent on behalf of one pid (watch_pid), to show that the broker
 * never reaches a FUSE server, and can leave STATFS or FLUSH unanswered.
 */
#ifndef FERRY_IT_RAWFUSE_UTIL_H
#define FERRY_IT_RAWFUSE_UTIL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <sys/types.h>

struct rawfuse {
	int fd;                     /* our dup of the /dev/fuse fd */
	int stop_fd;                /* eventfd: stop the thread */
	pthread_t thread;
	bool running;
	uid_t uid;
	gid_t gid;
	atomic_int backing_id;      /* > 0: OPEN of "f" gets passthrough with it */
	atomic_bool stall_statfs;   /* leave STATFS unanswered */
	atomic_bool stall_flush;    /* leave FLUSH unanswered */
	atomic_int watch_pid;       /* count requests made by this pid */
	atomic_uint n_from_watched;
	atomic_uint n_init, n_open, n_write, n_statfs, n_flush, n_requests;
	atomic_bool inited;
	atomic_bool passthrough;    /* the kernel took FUSE_PASSTHROUGH */
};

/* Starts serving fuse_fd (dup'ed; the caller keeps its own). Asserts. */
void rawfuse_start(struct rawfuse *rf, int fuse_fd, uid_t uid, gid_t gid);
/* Waits up to timeout_ms for INIT to have been answered. */
bool rawfuse_wait_init(struct rawfuse *rf, int timeout_ms);
/* Stops the thread and closes its fd. Accepts a never-started one. */
void rawfuse_stop(struct rawfuse *rf);

#endif
