/*
 * The daemon's inodes: those the kernel holds lookups on, or that a handle
 * (or the write-back list) keeps. A fixed array of hash buckets behind
 * striped locks: a lookup takes one stripe, never a global lock.
 */
#include <errno.h>
#include <stdlib.h>
#include <unistd.h>

#include "log.h"
#include "mountd.h"

#define BUCKETS (1u << 16)
#define STRIPES 256u

struct inode_table {
	struct inode *bucket[BUCKETS];
	pthread_mutex_t stripe[STRIPES];
	_Atomic size_t count;
};

static inline uint32_t bucket_of(uint64_t ino)
{
	ino *= 0x9e3779b97f4a7c15ull; /* Fibonacci hashing spreads sequential inos */
	return (uint32_t)(ino >> 48) & (BUCKETS - 1);
}

static inline pthread_mutex_t *stripe_of(struct inode_table *t, uint32_t b)
{
	return &t->stripe[b & (STRIPES - 1)];
}

/* Caller holds the bucket's stripe lock. */
static struct inode *bucket_find(struct inode_table *t, uint32_t b, uint64_t ino)
{
	struct inode *i;

	for (i = t->bucket[b]; i; i = i->hnext)
		if (i->ino == ino)
			break;
	return i;
}

int inode_table_new(struct inode_table **out)
{
	struct inode_table *t = calloc(1, sizeof(*t));

	if (!t)
		return -ENOMEM;
	for (unsigned i = 0; i < STRIPES; i++)
		pthread_mutex_init(&t->stripe[i], NULL);
	*out = t;
	return 0;
}

/* md NULL: at exit, where nothing counts the layouts' memory any more. */
static void inode_free(struct mountd *md, struct inode *i)
{
	if (md)
		local_copy_forget(md, i);
	free(i->kept_name); /* at exit: a copy's name local_copy_exit() did not see */
	free(i->inflight_name); /* at exit: a job still in flight */
	if (!md && i->kept_fd >= 0)
		close(i->kept_fd);
	layout_free(md, i);
	pthread_mutex_destroy(&i->layout_lock);
	pthread_cond_destroy(&i->committed);
	if (i->inflight_fd >= 0)
		close(i->inflight_fd);
	pthread_mutex_destroy(&i->lock);
	free(i);
}

void inode_table_free(struct inode_table *t)
{
	if (!t)
		return;
	for (unsigned b = 0; b < BUCKETS; b++) {
		struct inode *i = t->bucket[b], *next;
		for (; i; i = next) {
			next = i->hnext;
			if (i->w)
				log_warnx("inode %llu: dropping uncommitted writes at exit (staged in %s)",
					  (unsigned long long)i->ino, i->w->path);
			free(i->w ? i->w->dirty : NULL);
			if (i->w) {
				free(i->w->path);
				free(i->w);
			}
			inode_free(NULL, i);
		}
	}
	for (unsigned i = 0; i < STRIPES; i++)
		pthread_mutex_destroy(&t->stripe[i]);
	free(t);
}

size_t inode_table_count(struct inode_table *t)
{
	return atomic_load(&t->count);
}

struct inode *inode_ref(struct mountd *md, uint64_t ino, uint64_t nlookup, uint32_t nopen)
{
	struct inode_table *t = md->inodes;
	uint32_t b = bucket_of(ino);
	struct inode *i;

	pthread_mutex_lock(stripe_of(t, b));
	i = bucket_find(t, b, ino);
	if (!i) {
		i = calloc(1, sizeof(*i));
		if (!i)
			goto out;
		i->ino = ino;
		i->inflight_fd = -1;
		i->kept_fd = -1;
		pthread_mutex_init(&i->lock, NULL);
		pthread_mutex_init(&i->layout_lock, NULL);
		mono_cond_init(&i->committed);
		i->hnext = t->bucket[b];
		t->bucket[b] = i;
		atomic_fetch_add(&t->count, 1);
	}
	i->nlookup += nlookup;
	i->nopen += nopen;
out:
	pthread_mutex_unlock(stripe_of(t, b));
	return i;
}

struct inode *inode_find(struct mountd *md, uint64_t ino)
{
	struct inode_table *t = md->inodes;
	uint32_t b = bucket_of(ino);
	struct inode *i;

	pthread_mutex_lock(stripe_of(t, b));
	i = bucket_find(t, b, ino);
	pthread_mutex_unlock(stripe_of(t, b));
	return i;
}

void inode_unref(struct mountd *md, struct inode *i, uint64_t nlookup, uint32_t nopen)
{
	struct inode_table *t = md->inodes;
	uint64_t ino = i->ino; /* i may be gone by the drop below */
	uint32_t b = bucket_of(ino);
	bool gone = false, drop = false;

	pthread_mutex_lock(stripe_of(t, b));
	i->nlookup = nlookup > i->nlookup ? 0 : i->nlookup - nlookup;
	i->nopen = nopen > i->nopen ? 0 : i->nopen - nopen;
	/*
	 * Unlinked and forgotten by the kernel, so no OPEN can come for it
	 * again, and one reference left: if that is its job's (a job holds
	 * exactly one), the upload would store, commit and then free data
	 * nobody can read (a checkout removed, a temporary file, a file
	 * renamed over). The reconciler is asked to drop it; if the one left
	 * is something else's, no job of i is in flight and the ask finds
	 * nothing. Not on fsync=local mounts (rclient_drop).
	 */
	if (i->unlinked && i->nlookup == 0 && i->nopen == 1 && !i->drop_asked && !i->keep_upload) {
		i->drop_asked = true;
		drop = true;
	}
	if (i->nlookup == 0 && i->nopen == 0) {
		struct inode **pp = &t->bucket[b];
		while (*pp && *pp != i)
			pp = &(*pp)->hnext;
		if (*pp) {
			*pp = i->hnext;
			gone = true;
			atomic_fetch_sub(&t->count, 1);
		}
	}
	pthread_mutex_unlock(stripe_of(t, b));
	if (drop)
		rclient_drop(md, ino);
	if (!gone)
		return;

	/* Nothing can reach i any more: no lock needed below. */
	if (i->w)
		wstate_drop(md, i);
	if (i->unlinked) {
		int rc = meta_inode_release_later(md->meta, i->ino);
		if (rc < 0)
			log_errno(rc, "inode %llu: cannot free unlinked inode (left as orphan)",
				  (unsigned long long)i->ino);
	}
	inode_free(md, i);
}

void inode_forget(struct mountd *md, uint64_t ino, uint64_t nlookup)
{
	/* Found and counted at once (inode_ref_existing): between a find and
	 * an unref the last other reference (a local copy's, say) could go and
	 * free the inode. */
	struct inode *i = inode_ref_existing(md, ino);

	if (i)
		inode_unref(md, i, nlookup, 1);
}

bool inode_mark_unlinked(struct mountd *md, uint64_t ino)
{
	struct inode_table *t = md->inodes;
	uint32_t b = bucket_of(ino);
	struct inode *i;

	pthread_mutex_lock(stripe_of(t, b));
	i = bucket_find(t, b, ino);
	if (i)
		i->unlinked = true; /* read by inode_unref() under this same stripe lock */
	pthread_mutex_unlock(stripe_of(t, b));
	return i != NULL;
}

struct inode *inode_ref_existing(struct mountd *md, uint64_t ino)
{
	struct inode_table *t = md->inodes;
	uint32_t b = bucket_of(ino);
	struct inode *i;

	pthread_mutex_lock(stripe_of(t, b));
	i = bucket_find(t, b, ino);
	if (i)
		i->nopen++;
	pthread_mutex_unlock(stripe_of(t, b));
	return i;
}

bool inode_is_unlinked(struct mountd *md, struct inode *i)
{
	struct inode_table *t = md->inodes;
	uint32_t b = bucket_of(i->ino);
	bool u;

	pthread_mutex_lock(stripe_of(t, b));
	u = i->unlinked;
	pthread_mutex_unlock(stripe_of(t, b));
	return u;
}

void inode_keep_upload(struct mountd *md, struct inode *i)
{
	struct inode_table *t = md->inodes;
	uint32_t b = bucket_of(i->ino);

	pthread_mutex_lock(stripe_of(t, b));
	i->keep_upload = true;
	pthread_mutex_unlock(stripe_of(t, b));
}

int inode_table_held_open(struct mountd *md, struct inode ***out, size_t *nout)
{
	struct inode_table *t = md->inodes;
	struct inode **v = NULL; /* owned until handed to *out */
	size_t n = 0, cap = 0;
	int rc = 0;

	for (uint32_t b = 0; b < BUCKETS; b++) {
		if (!t->bucket[b]) /* a racy peek: only saves the lock of empty buckets */
			continue;
		pthread_mutex_lock(stripe_of(t, b));
		for (struct inode *i = t->bucket[b]; i && rc == 0; i = i->hnext) {
			if (i->nopen == 0)
				continue;
			if (n == cap) {
				size_t ncap = cap ? cap * 2 : 64;
				struct inode **nv = realloc(v, ncap * sizeof(*v));
				if (!nv) {
					rc = -ENOMEM;
					break;
				}
				v = nv;
				cap = ncap;
			}
			i->nopen++;
			v[n++] = i;
		}
		pthread_mutex_unlock(stripe_of(t, b));
		if (rc < 0)
			break;
	}
	if (rc < 0) {
		for (size_t k = 0; k < n; k++)
			inode_unref(md, v[k], 0, 1);
		free(v);
		return rc;
	}
	*out = v;
	*nout = n;
	return 0;
}
