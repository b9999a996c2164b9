/*
 * Read-ahead from the object store. A sequential reader (file_readahead()
 * in file_read.c tells one) queues the objects ahead of it here; a few
 * threads fetch them into the read cache at once, so the reader finds them
 * cached, or joins a fetch in flight, instead of waiting for one GET after
 * another. An object that is cached already has its cache file read ahead
 * instead (the disk under the cache is read in parallel too, not one
 * READ's splice at a time). Random readers queue nothing: they fetch only
 * what they read.
 *
 * How many GETs run at once is -o readahead_streams: one S3 connection
 * carries well under what a node's network does, so a store far away
 * wants more streams than one on the same machine.
 *
 * The queue and the fetches in flight together come to at most p->budget
 * bytes of objects not cached yet (each is streamed into its cache file,
 * so this bounds what read-ahead puts in flight, not memory); past it a
 * request is dropped, never waited for. Everything here is owned by
 * struct prefetch, which struct mountd owns.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "mountd.h"
#include "slice.h"

#define QUEUE_MAX 64

struct prefetch_item {
	char key[SLICE_KEY_MAX];
	uint32_t size;
	bool cached; /* in the read cache: only its file is read ahead */
};

struct prefetch {
	struct mountd *md;
	pthread_mutex_t lock;      /* guards everything below */
	pthread_cond_t work;
	struct prefetch_item q[QUEUE_MAX]; /* a ring: q[head], then n-1 more */
	unsigned head, n;
	uint64_t budget, bytes;    /* bytes: queued plus being fetched */
	unsigned fetching, fetching_max; /* GETs in flight now, and the most at once */
	_Atomic bool stop;
	pthread_t *threads;        /* owned: one per stream */
	unsigned nthreads;
};

/* A fetch in flight stops when the mount does (objstore_set_cancel). */
static bool stopping(void *arg)
{
	struct prefetch *p = arg;

	return atomic_load(&p->stop);
}

static void *prefetch_main(void *arg)
{
	struct prefetch *p = arg;
	struct mountd *md = p->md;

	objstore_set_cancel(stopping, p);
	pthread_mutex_lock(&p->lock);
	for (;;) {
		struct prefetch_item it;
		int rc;

		while (p->n == 0 && !atomic_load(&p->stop))
			pthread_cond_wait(&p->work, &p->lock);
		if (atomic_load(&p->stop))
			break;
		it = p->q[p->head];
		p->head = (p->head + 1) % QUEUE_MAX;
		p->n--;
		pthread_mutex_unlock(&p->lock);
		if (it.cached && read_cache_willneed(md->cache, &md->stats, it.key, it.size)) {
			atomic_fetch_add(&md->stats.prefetch_cached, 1);
			pthread_mutex_lock(&p->lock);
			continue;
		}
		/* Evicted since it was queued: fetched like the others. */
		pthread_mutex_lock(&p->lock);
		if (++p->fetching > p->fetching_max)
			p->fetching_max = p->fetching;
		pthread_mutex_unlock(&p->lock);
		rc = read_cache_prefetch(md->cache, md->store, &md->stats, it.key, it.size);
		if (rc > 0) {
			atomic_fetch_add(&md->stats.prefetch_fetched, 1);
		} else if (rc < 0 && rc != -EINTR) {
			/* The reader fetches it again itself and reports what it
			 * meets; one line here says read-ahead met it first. */
			atomic_fetch_add(&md->stats.prefetch_failed, 1);
			log_errno(rc, "read-ahead of object %s", it.key);
		}
		pthread_mutex_lock(&p->lock);
		p->fetching--;
		p->bytes -= it.cached ? 0 : it.size;
	}
	pthread_mutex_unlock(&p->lock);
	return NULL;
}

int prefetch_start(struct mountd *md, uint64_t budget, unsigned streams, struct prefetch **out)
{
	struct prefetch *p = calloc(1, sizeof(*p));
	int rc = 0;

	if (!p)
		return -ENOMEM;
	p->md = md;
	p->budget = budget;
	pthread_mutex_init(&p->lock, NULL);
	pthread_cond_init(&p->work, NULL);
	p->threads = calloc(streams ? streams : 1, sizeof(*p->threads));
	if (!p->threads) {
		prefetch_stop(p);
		return -ENOMEM;
	}
	for (unsigned i = 0; i < streams; i++) {
		rc = -pthread_create(&p->threads[i], NULL, prefetch_main, p);
		if (rc)
			break;
		p->nthreads++;
	}
	if (p->nthreads == 0) {
		prefetch_stop(p);
		return rc;
	}
	*out = p;
	return 0;
}

void prefetch_stop(struct prefetch *p)
{
	if (!p)
		return;
	pthread_mutex_lock(&p->lock);
	atomic_store(&p->stop, true);
	pthread_cond_broadcast(&p->work);
	pthread_mutex_unlock(&p->lock);
	for (unsigned i = 0; i < p->nthreads; i++)
		pthread_join(p->threads[i], NULL);
	pthread_cond_destroy(&p->work);
	pthread_mutex_destroy(&p->lock);
	free(p->threads);
	free(p);
}

void prefetch_object(struct prefetch *p, const char *key, uint32_t objsize)
{
	struct mountd *md;
	bool queued = false, dropped = false;

	if (!p || strlen(key) >= SLICE_KEY_MAX)
		return;
	md = p->md;
	/* A cached object costs no memory here, only its file's pages. */
	bool cached = read_cache_has(md->cache, key, objsize);
	uint32_t holds = cached ? 0 : objsize;
	pthread_mutex_lock(&p->lock);
	for (unsigned i = 0; i < p->n; i++)
		if (strcmp(p->q[(p->head + i) % QUEUE_MAX].key, key) == 0)
			goto out;
	if (p->n == QUEUE_MAX || p->bytes + holds > p->budget) {
		dropped = true;
		goto out;
	}
	struct prefetch_item *it = &p->q[(p->head + p->n) % QUEUE_MAX];
	memcpy(it->key, key, strlen(key) + 1);
	it->size = objsize;
	it->cached = cached;
	p->n++;
	p->bytes += holds;
	queued = true;
	pthread_cond_signal(&p->work);
out:
	pthread_mutex_unlock(&p->lock);
	if (queued)
		atomic_fetch_add(&md->stats.prefetch_queued, 1);
	if (dropped)
		atomic_fetch_add(&md->stats.prefetch_dropped, 1);
}

uint64_t prefetch_bytes(struct prefetch *p)
{
	uint64_t n;

	if (!p)
		return 0;
	pthread_mutex_lock(&p->lock);
	n = p->bytes;
	pthread_mutex_unlock(&p->lock);
	return n;
}

unsigned prefetch_streams(struct prefetch *p)
{
	return p ? p->nthreads : 0;
}

unsigned prefetch_fetching_max(struct prefetch *p)
{
	unsigned n;

	if (!p)
		return 0;
	pthread_mutex_lock(&p->lock);
	n = p->fetching_max;
	pthread_mutex_unlock(&p->lock);
	return n;
}
