/*
 * closer: how the broker lets go of an fd a peer sent.
 *
 * close() of a regular file on FUSE sends FUSE_FLUSH to its server and
 * waits for the answer -- a forced request, waited for uninterruptibly
 * (fs/fuse/file.c fuse_flush, dev.c request_wait_answer). A peer serving a
 * FUSE mount of its own could send us an fd of one of its files and never
 * answer: the loop would hang for every peer. So an fd a peer sent is
 * closed on the loop only when it provably cannot reach a FUSE server (not
 * a regular file, O_PATH, or on a file system known not to be FUSE or
 * stacked); any other goes to the closer thread.
 *
 * A close that stays stuck there for BROKER_CLOSE_STALL_S is ended by
 * aborting that FUSE connection through the broker's private fusectl mount
 * (<dev>/abort, written as the connection's owner): the peer's own mount
 * breaks, nobody else's. Connections of a uid with BROKER_CLOSE_PENDING_MAX
 * closes waiting are not read from until those are done (server.c), so the
 * fds a peer can make us hold this way stay bounded.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

#include "brokerd.h"
#include "log.h"

#ifndef STATX_MNT_ID_UNIQUE
#define STATX_MNT_ID_UNIQUE 0x00004000U
#endif

struct close_item {
	int fd;
	uid_t uid;                 /* whose peer sent it */
	uint64_t dev;              /* its st_dev, 0 if unknown */
	TAILQ_ENTRY(close_item) link;
};

struct closer {
	pthread_t thread;
	pthread_mutex_t lock;
	pthread_cond_t cv;
	bool stop;
	TAILQ_HEAD(, close_item) queue;
	struct close_item *current;  /* being closed; owned by the thread */
	struct timespec since;       /* when current started */
	bool aborted;                /* current's connection was aborted already */
};

static double elapsed_s(const struct timespec *t)
{
	struct timespec now;

	clock_gettime(CLOCK_MONOTONIC, &now);
	return (double)(now.tv_sec - t->tv_sec) + (double)(now.tv_nsec - t->tv_nsec) / 1e9;
}

static void *closer_run(void *arg)
{
	struct closer *cl = arg;

	pthread_mutex_lock(&cl->lock);
	for (;;) {
		struct close_item *it;

		while (!cl->stop && TAILQ_EMPTY(&cl->queue))
			pthread_cond_wait(&cl->cv, &cl->lock);
		if (cl->stop)
			break;
		it = TAILQ_FIRST(&cl->queue);
		TAILQ_REMOVE(&cl->queue, it, link);
		cl->current = it;
		cl->aborted = false;
		clock_gettime(CLOCK_MONOTONIC, &cl->since);
		pthread_mutex_unlock(&cl->lock);
		close(it->fd); /* may wait for a FUSE server */
		pthread_mutex_lock(&cl->lock);
		cl->current = NULL;
		free(it);
	}
	pthread_mutex_unlock(&cl->lock);
	return NULL;
}

int closer_start(struct broker *b)
{
	struct closer *cl = calloc(1, sizeof(*cl));

	if (!cl)
		return -ENOMEM;
	pthread_mutex_init(&cl->lock, NULL);
	pthread_cond_init(&cl->cv, NULL);
	TAILQ_INIT(&cl->queue);
	if (pthread_create(&cl->thread, NULL, closer_run, cl) != 0) {
		free(cl);
		return -EAGAIN;
	}
	b->closer = cl;
	return 0;
}

void closer_stop(struct broker *b)
{
	struct closer *cl = b->closer;
	struct close_item *it;
	bool stuck;

	if (!cl)
		return;
	pthread_mutex_lock(&cl->lock);
	cl->stop = true;
	pthread_cond_signal(&cl->cv);
	/* What is still queued is closed here, at exit: a FUSE server that
	 * leaves its FLUSH unanswered holds up the exit (as it would the exit
	 * of any process), not the service. */
	while ((it = TAILQ_FIRST(&cl->queue))) {
		TAILQ_REMOVE(&cl->queue, it, link);
		close(it->fd);
		free(it);
	}
	stuck = cl->current != NULL;
	pthread_mutex_unlock(&cl->lock);
	if (stuck) {
		/* Not joined (nor freed): it may never come back. The process
		 * exits anyway. */
		log_warnx("a close of a peer's fd is still waiting for its FUSE server");
		b->closer = NULL;
		return;
	}
	pthread_join(cl->thread, NULL);
	pthread_mutex_destroy(&cl->lock);
	pthread_cond_destroy(&cl->cv);
	free(cl);
	b->closer = NULL;
}

/* Can closing fd reach a FUSE server? false only when that is ruled out.
 * *dev gets its st_dev in any case (0 if even that is unknown). */
static bool may_reach_fuse(struct broker *b, int fd, uint64_t *dev)
{
	struct statx sx;
	int fl;
	char err[128];

	*dev = 0;
	fl = fcntl(fd, F_GETFL);
	if (fl >= 0 && (fl & O_PATH))
		return false; /* no file operations at all */
	/* An empty mask: FUSE fills st_dev even for a mount that does not
	 * admit us, and only that (no type then). */
	if (statx(fd, "", AT_EMPTY_PATH | AT_STATX_DONT_SYNC, 0, &sx) < 0)
		return true;
	*dev = makedev(sx.stx_dev_major, sx.stx_dev_minor);
	if (!(sx.stx_mask & STATX_TYPE))
		return true; /* a FUSE mount that does not admit us */
	/* FUSE has a flush only for regular files (CUSE devices and FUSE
	 * directories have none). */
	if (!S_ISREG(sx.stx_mode))
		return false;
	if (statx(fd, "", AT_EMPTY_PATH | AT_STATX_DONT_SYNC, STATX_MNT_ID_UNIQUE, &sx) < 0)
		return true;
	return fsprobe_fs_known_safe(b, *dev,
				     (sx.stx_mask & STATX_MNT_ID_UNIQUE) ? sx.stx_mnt_id : 0, err,
				     sizeof(err)) != 0;
}

void peer_fd_drop(struct broker *b, uid_t uid, int fd)
{
	struct closer *cl = b->closer;
	struct close_item *it;
	uint64_t dev;

	if (fd < 0)
		return;
	if (!cl || !may_reach_fuse(b, fd, &dev)) {
		close(fd);
		return;
	}
	it = malloc(sizeof(*it));
	if (!it) {
		close(fd); /* no memory: better a risk than a leak */
		return;
	}
	it->fd = fd;
	it->uid = uid;
	it->dev = dev;
	log_debug("uid %d sent an fd that may be on FUSE: closed aside", (int)uid);
	pthread_mutex_lock(&cl->lock);
	TAILQ_INSERT_TAIL(&cl->queue, it, link);
	pthread_cond_signal(&cl->cv);
	pthread_mutex_unlock(&cl->lock);
}

void peer_fds_drop(struct broker *b, uid_t uid, int *fds, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		peer_fd_drop(b, uid, fds[i]);
		fds[i] = -1;
	}
}

unsigned closer_pending(struct broker *b, uid_t uid)
{
	struct closer *cl = b->closer;
	struct close_item *it;
	unsigned n = 0;

	if (!cl)
		return 0;
	pthread_mutex_lock(&cl->lock);
	TAILQ_FOREACH(it, &cl->queue, link)
		if (it->uid == uid)
			n++;
	if (cl->current && cl->current->uid == uid)
		n++;
	pthread_mutex_unlock(&cl->lock);
	return n;
}

/* Writes "1" to <fusectl>/<dev>/abort as the connection's owner (its
 * directory is 0500, the file 0200, both the mount's user's). */
static int abort_connection(struct broker *b, uint64_t dev)
{
	char dir[24], path[40];
	struct stat st;
	int fd, rc;

	if (b->fusectl_fd < 0 || !dev)
		return -ENOENT;
	snprintf(dir, sizeof(dir), "%" PRIu64, ((uint64_t)major(dev) << 20) | (uint64_t)minor(dev));
	snprintf(path, sizeof(path), "%s/abort", dir);
	if (fstatat(b->fusectl_fd, dir, &st, AT_SYMLINK_NOFOLLOW) < 0)
		return -errno;
	rc = privs_become(st.st_uid, st.st_gid);
	if (rc < 0)
		return rc;
	fd = openat(b->fusectl_fd, path, O_WRONLY | O_CLOEXEC | O_NOFOLLOW);
	rc = fd < 0 ? -errno : 0;
	privs_restore();
	if (rc < 0)
		return rc;
	if (write(fd, "1", 1) != 1)
		rc = -errno;
	close(fd);
	return rc;
}

void closer_watch(struct broker *b)
{
	struct closer *cl = b->closer;
	uint64_t dev = 0;
	uid_t uid = 0;
	double stalled = 0;
	int rc;

	if (!cl)
		return;
	/* Only once per stuck close (aborted stays set until the next). */
	pthread_mutex_lock(&cl->lock);
	if (cl->current && !cl->aborted) {
		stalled = elapsed_s(&cl->since);
		if (stalled >= BROKER_CLOSE_STALL_S) {
			dev = cl->current->dev;
			uid = cl->current->uid;
			cl->aborted = true;
		}
	}
	pthread_mutex_unlock(&cl->lock);
	if (stalled < BROKER_CLOSE_STALL_S)
		return;
	rc = abort_connection(b, dev);
	if (rc < 0)
		log_errno(rc, "a close of an fd uid %d sent has waited %.0f s for its FUSE server "
			  "(dev %u:%u), which cannot be aborted", (int)uid, stalled, major(dev),
			  minor(dev));
	else
		log_warnx("a close of an fd uid %d sent waited %.0f s for its FUSE server: aborted "
			  "that FUSE connection (dev %u:%u)", (int)uid, stalled, major(dev),
			  minor(dev));
}
