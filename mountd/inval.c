/* See inval.h. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>

#include "inval.h"
#include "log.h"
#include "mountd.h"

struct inval {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	uint64_t *inos;  /* queued, oldest first */
	size_t n, cap;
	bool stop;
	pthread_t thread;
};

static void send_one(struct mountd *md, uint64_t ino)
{
	/* Not once the loop is over: libfuse closes /dev/fuse at the
	 * unmount (EBADF). */
	if (!atomic_load(&md->fuse_done))
		fuse_lowlevel_notify_inval_inode(md->se, ino, 0, 0);
}

void inval_attr(struct mountd *md, uint64_t ino)
{
	/* A negative offset: the attributes only, so the kernel waits for
	 * no page (a handler's own request may hold some locked). */
	if (!atomic_load(&md->fuse_done))
		fuse_lowlevel_notify_inval_inode(md->se, ino, -1, 0);
}

static void *inval_main(void *arg)
{
	struct mountd *md = arg;
	struct inval *q = md->inval;

	pthread_mutex_lock(&q->lock);
	for (;;) {
		while (!q->stop && q->n == 0)
			pthread_cond_wait(&q->cond, &q->lock);
		if (q->stop)
			break;
		uint64_t ino = q->inos[0];

		q->n--;
		for (size_t k = 0; k < q->n; k++)
			q->inos[k] = q->inos[k + 1];
		pthread_mutex_unlock(&q->lock);
		send_one(md, ino);
		pthread_mutex_lock(&q->lock);
	}
	pthread_mutex_unlock(&q->lock);
	return NULL;
}

int inval_start(struct mountd *md)
{
	struct inval *q = calloc(1, sizeof(*q));
	int rc;

	if (!q)
		return -ENOMEM;
	pthread_mutex_init(&q->lock, NULL);
	pthread_cond_init(&q->cond, NULL);
	md->inval = q;
	rc = pthread_create(&q->thread, NULL, inval_main, md);
	if (rc) {
		md->inval = NULL;
		pthread_cond_destroy(&q->cond);
		pthread_mutex_destroy(&q->lock);
		free(q);
		return -rc;
	}
	return 0;
}

static void queue_or_send(struct mountd *md, struct inval *q, uint64_t ino, bool send_if_full)
{
	bool queued = false;

	pthread_mutex_lock(&q->lock);
	/* An inode already waiting needs no second one. */
	for (size_t k = 0; k < q->n && !queued; k++)
		queued = q->inos[k] == ino;
	if (!queued && q->n == q->cap) {
		size_t cap = q->cap ? 2 * q->cap : 64;
		uint64_t *p = realloc(q->inos, cap * sizeof(*p));

		if (p) {
			q->inos = p;
			q->cap = cap;
		}
	}
	if (!queued && q->n < q->cap) {
		q->inos[q->n++] = ino;
		queued = true;
		pthread_cond_signal(&q->cond);
	}
	pthread_mutex_unlock(&q->lock);
	if (!queued && send_if_full) {
		/* No memory for the queue: better a wait than a stale cache. */
		log_warnx("inval: out of memory for the queue; invalidating inode %llu at once",
			  (unsigned long long)ino);
		send_one(md, ino);
	}
}

void inval_inode(struct mountd *md, uint64_t ino)
{
	/* Through /dev/fuse another worker answers a READ holding the pages:
	 * at once, before the commit is known. */
	if (!md->inval || !md->uring_asked)
		send_one(md, ino);
	else
		queue_or_send(md, md->inval, ino, true);
}

void inval_inode_later(struct mountd *md, uint64_t ino)
{
	if (md->inval)
		queue_or_send(md, md->inval, ino, false);
}

void inval_stop(struct mountd *md)
{
	struct inval *q = md->inval;

	if (!q)
		return;
	pthread_mutex_lock(&q->lock);
	q->stop = true;
	pthread_cond_signal(&q->cond);
	pthread_mutex_unlock(&q->lock);
	pthread_join(q->thread, NULL);
	md->inval = NULL;
	free(q->inos);
	pthread_cond_destroy(&q->cond);
	pthread_mutex_destroy(&q->lock);
	free(q);
}
