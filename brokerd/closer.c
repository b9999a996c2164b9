/*
 * closer: how the broker lets go of what a peer sent it.
 *
 * Closing a peer-supplied fd can take as long as that peer likes. close()
 * of a regular file on FUSE sends FLUSH and waits uninterruptibly; the last
 * fput of such a file with dirty pages waits for their writeback; a TCP
 * socket with SO_LINGER waits for its unsent data; and a Unix socket may
 * hold any of these in flight in its receive queue, let go of (fput) when
 * the socket is. None of that may happen on the event loop, which serves
 * every peer. So each owner (peer.c) gets a closer of its own: a queue and
 * a thread, started at its first use, that closes what that owner's peers
 * sent -- the fds of their frames and, once rights are enabled on it, their
 * connection sockets. A stuck close then holds up that owner's closer and
 * nobody else.
 *
 * The loop still closes in place what it has shown cannot wait on anyone:
 * a backing file it checked (a regular file on a file system that is
 * neither FUSE nor stacked) and the FUSE device (handlers set fd_safe).
 *
 * What a stuck owner costs is bounded: its connections are not read while
 * BROKER_CLOSE_PENDING_MAX fds wait in its closer (server.c), and once one
 * close has waited BROKER_CLOSE_STALL_S, closer_watch() cuts the owner off
 * (its connections closed, new ones refused until the close returns). If
 * the stuck file is on one of that same owner's own mounts, that FUSE
 * connection is aborted, which ends the close; the broker never aborts a
 * connection that is not the stuck owner's own.
 *
 * Ownership: an owner owns its closer (closer_free() when the owner goes,
 * which peer.c allows only once the closer is idle); the closer's thread
 * owns the item it is closing, the queue owns the rest.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

#include "brokerd.h"
#include "log.h"

struct close_item {
	int fd;
	uint64_t dev;              /* its st_dev, 0 if unknown */
	TAILQ_ENTRY(close_item) link;
};

struct closer {
	pthread_t thread;
	bool started;
	pthread_mutex_t lock;
	pthread_cond_t cv;
	bool stop;
	TAILQ_HEAD(, close_item) queue;
	unsigned queued;
	struct close_item *current;  /* being closed; owned by the thread */
	uint64_t current_seq;        /* tells one stuck close from the next */
	struct timespec since;       /* when current started */
	struct closer *next_abandoned;
};

/* fds waiting in every closer: the fd table's headroom (server.c). */
static atomic_uint pending_total;

/* Closers left running at exit with a close still stuck: not freed (their
 * thread may still use them), and kept reachable so that nothing reports
 * them as leaked. Only ever added to, at exit. */
static struct closer *abandoned;

static double elapsed_s(const struct timespec *t)
{
	struct timespec now;

	clock_gettime(CLOCK_MONOTONIC, &now);
	return (double)(now.tv_sec - t->tv_sec) + (double)(now.tv_nsec - t->tv_nsec) / 1e9;
}

/* Its st_dev (0: unknown): the FUSE connection to abort if the close is
 * stuck on one of its owner's own mounts. An empty mask: FUSE fills st_dev
 * even on a mount that does not admit us. */
static uint64_t fd_dev(int fd)
{
	struct statx sx;

	if (statx(fd, "", AT_EMPTY_PATH | AT_STATX_DONT_SYNC, 0, &sx) < 0)
		return 0;
	return makedev(sx.stx_dev_major, sx.stx_dev_minor);
}

static void *closer_run(void *arg)
{
	struct closer *cl = arg;

	pthread_mutex_lock(&cl->lock);
	for (;;) {
		struct close_item *it;
		uint64_t dev;

		while (!cl->stop && TAILQ_EMPTY(&cl->queue))
			pthread_cond_wait(&cl->cv, &cl->lock);
		if (cl->stop)
			break;
		it = TAILQ_FIRST(&cl->queue);
		TAILQ_REMOVE(&cl->queue, it, link);
		cl->queued--;
		cl->current = it;
		cl->current_seq++;
		clock_gettime(CLOCK_MONOTONIC, &cl->since);
		pthread_mutex_unlock(&cl->lock);
		dev = fd_dev(it->fd);
		pthread_mutex_lock(&cl->lock);
		it->dev = dev;
		pthread_mutex_unlock(&cl->lock);
		close(it->fd); /* may wait as long as the peer likes */
		pthread_mutex_lock(&cl->lock);
		cl->current = NULL;
		/* After current is cleared: both counts agree when read. */
		atomic_fetch_sub(&pending_total, 1);
		free(it);
	}
	pthread_mutex_unlock(&cl->lock);
	return NULL;
}

struct closer *closer_new(void)
{
	struct closer *cl = calloc(1, sizeof(*cl));

	if (!cl)
		return NULL;
	pthread_mutex_init(&cl->lock, NULL);
	pthread_cond_init(&cl->cv, NULL);
	TAILQ_INIT(&cl->queue);
	return cl;
}

bool closer_free(struct closer *cl, bool at_exit)
{
	struct close_item *it;
	bool stuck;

	if (!cl)
		return true;
	pthread_mutex_lock(&cl->lock);
	cl->stop = true;
	pthread_cond_signal(&cl->cv);
	if (at_exit) {
		/* What is still queued is closed here: a peer that holds up
		 * these closes holds up the exit (as it would any process's),
		 * not the service. */
		while ((it = TAILQ_FIRST(&cl->queue))) {
			TAILQ_REMOVE(&cl->queue, it, link);
			cl->queued--;
			close(it->fd);
			atomic_fetch_sub(&pending_total, 1);
			free(it);
		}
	}
	stuck = cl->current != NULL || cl->queued;
	pthread_mutex_unlock(&cl->lock);
	if (stuck) {
		/* Not joined nor freed: its thread may never come back, and it
		 * still refers to cl. Only at exit. */
		cl->next_abandoned = abandoned;
		abandoned = cl;
		return false;
	}
	if (cl->started)
		pthread_join(cl->thread, NULL);
	pthread_mutex_destroy(&cl->lock);
	pthread_cond_destroy(&cl->cv);
	free(cl);
	return true;
}

int closer_push(struct closer *cl, int fd)
{
	struct close_item *it;
	int rc = 0;

	it = malloc(sizeof(*it));
	if (!it)
		return -ENOMEM;
	it->fd = fd;
	it->dev = 0; /* the thread finds it out: even a statx stays off the loop */
	pthread_mutex_lock(&cl->lock);
	if (!cl->started) {
		/* A small stack: the thread only ever calls close(). */
		pthread_attr_t attr;

		pthread_attr_init(&attr);
		pthread_attr_setstacksize(&attr, 64 << 10);
		rc = pthread_create(&cl->thread, &attr, closer_run, cl);
		pthread_attr_destroy(&attr);
		if (rc != 0) {
			pthread_mutex_unlock(&cl->lock);
			free(it);
			return -rc;
		}
		cl->started = true;
	}
	TAILQ_INSERT_TAIL(&cl->queue, it, link);
	cl->queued++;
	atomic_fetch_add(&pending_total, 1);
	pthread_cond_signal(&cl->cv);
	pthread_mutex_unlock(&cl->lock);
	return 0;
}

unsigned closer_pending(struct closer *cl)
{
	unsigned n;

	if (!cl)
		return 0;
	pthread_mutex_lock(&cl->lock);
	n = cl->queued + (cl->current != NULL);
	pthread_mutex_unlock(&cl->lock);
	return n;
}

unsigned closer_pending_total(void)
{
	return atomic_load(&pending_total);
}

double closer_stuck(struct closer *cl, uint64_t *seq, uint64_t *dev)
{
	double s = 0;

	*seq = 0;
	*dev = 0;
	if (!cl)
		return 0;
	pthread_mutex_lock(&cl->lock);
	if (cl->current) {
		s = elapsed_s(&cl->since);
		*seq = cl->current_seq;
		*dev = cl->current->dev;
	}
	pthread_mutex_unlock(&cl->lock);
	return s;
}

void peer_fd_drop(struct broker *b, struct owner *o, int fd)
{
	struct closer *cl;
	int rc;

	if (fd < 0)
		return;
	cl = o ? o->closer : b->stranger_closer;
	if (!cl) {
		/* Only before start-up made the closers, or out of memory
		 * when the owner was made: nothing better is left. */
		log_warnx("no closer for an fd a peer sent: closing it in place");
		close(fd);
		return;
	}
	rc = closer_push(cl, fd);
	if (rc < 0) {
		log_errno(rc, "cannot queue an fd a peer sent for closing: closing it in place");
		close(fd);
	}
}

void peer_fds_drop(struct broker *b, struct owner *o, int *fds, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		peer_fd_drop(b, o, fds[i]);
		fds[i] = -1;
	}
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

/* Is dev one of o's own mounts? Only those may be aborted for o. */
static bool owners_mount(const struct owner *o, uint64_t dev)
{
	const struct bmount *m;

	TAILQ_FOREACH(m, &o->mounts, olink)
		if (dev && m->dev == dev)
			return true;
	return false;
}

static void watch_owner(struct broker *b, struct owner *o)
{
	uint64_t seq, dev;
	double stuck = closer_stuck(o->closer, &seq, &dev);
	int rc;

	if (stuck < BROKER_CLOSE_STALL_S) {
		if (o->wedged) {
			o->wedged = false;
			log_info("uid %d (%s): its stuck close returned; connections admitted again",
				 (int)o->uid, o->root);
		}
		return;
	}
	if (!o->wedged) {
		o->wedged = true;
		log_warnx("uid %d (%s): a close of an fd it sent has waited %.0f s: wedged; its "
			  "connections are closed and new ones refused until that close returns",
			  (int)o->uid, o->root, stuck);
		server_cut_off(b, o);
	}
	if (seq == o->aborted_seq || !owners_mount(o, dev))
		return;
	o->aborted_seq = seq;
	rc = abort_connection(b, dev);
	if (rc < 0)
		log_errno(rc, "uid %d: the stuck file is on its own mount (dev %u:%u), whose FUSE "
			  "connection cannot be aborted", (int)o->uid, major(dev), minor(dev));
	else
		log_warnx("uid %d: the stuck file is on its own mount: aborted that FUSE "
			  "connection (dev %u:%u)", (int)o->uid, major(dev), minor(dev));
}

void closer_watch(struct broker *b)
{
	struct owner *o, *next;
	uint64_t seq, dev;
	double stuck;

	for (o = TAILQ_FIRST(&b->owners); o; o = next) {
		next = TAILQ_NEXT(o, link);
		watch_owner(b, o);
		owner_put(b, o); /* frees an owner whose last close just returned */
	}
	stuck = closer_stuck(b->stranger_closer, &seq, &dev);
	if (stuck >= BROKER_CLOSE_STALL_S && seq != b->stranger_warned_seq) {
		b->stranger_warned_seq = seq;
		log_warnx("a connection of a refused peer has taken %.0f s to close", stuck);
	}
}
