/*
 * Local copies of files read whole from the store (see mountd.h). A file
 * read through FUSE READs pays a request per READ and lives in the FUSE
 * inode's page cache, whose small pages make even a warm read run at about
 * half the staging disk's speed; with a copy, the kernel reads the copy
 * itself. The copy is built off the reader's path, after its close, from
 * the read cache that read just filled.
 *
 * A copy is the committed file only while nothing changed the file since
 * the build began: the layout generation is taken first, the file is read
 * at that generation, and local_copy_install() records the copy only if
 * the generation has not moved and no change is under way (the same test
 * every other copy passes at each open, copy_state()).
 *
 * Ownership: struct copy_build is md->copy_build's; each queued inode holds
 * one reference (nopen) and its kept_building flag until its build is over.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "inval.h"
#include "log.h"
#include "mountd.h"

struct copy_build {
	struct mountd *md;
	pthread_mutex_t lock; /* guards q, head, n */
	pthread_cond_t work;
	struct inode *q[COPY_BUILD_QUEUE]; /* a ring: q[head], then n-1 more */
	unsigned head, n;
	_Atomic bool stop;
	pthread_t thread;
};

/* Names unique among this daemon's copies ("b": built). */
static _Atomic uint64_t serial;

/* A fetch in flight stops when the mount does (objstore_set_cancel). */
static bool stopping(void *arg)
{
	struct copy_build *b = arg;

	return atomic_load(&b->stop);
}

/* Whether i may get a copy of size bytes now, as a reader's open would use
 * it (local_copy_share()). Caller holds i->lock. */
static bool build_wanted(struct mountd *md, struct inode *i, uint64_t size)
{
	/* Without leases a copy's mapping could not be told from none
	 * (copy_mapped()), and a change would miss it. */
	return md->local_copy_max && !md->follower && md->pt_mode != PT_OFF &&
	       !atomic_load(&md->pt_off) && !atomic_load(&md->lease_fenced) &&
	       atomic_load(&md->layout_ready) && !i->w && !i->kept_name && !i->inflight_seq &&
	       !inode_is_unlinked(md, i) && size >= LOCAL_COPY_MIN && size <= md->pt_copy_max &&
	       !wstate_lease_unknown() && !staging_room_low(md);
}

void copy_build_later(struct mountd *md, struct inode *i, uint64_t size)
{
	struct copy_build *b = md->copy_build;

	if (!b || i->kept_building || !build_wanted(md, i, size))
		return;
	pthread_mutex_lock(&b->lock);
	if (b->n < COPY_BUILD_QUEUE && !atomic_load(&b->stop)) {
		b->q[(b->head + b->n) % COPY_BUILD_QUEUE] = i;
		b->n++;
		i->kept_building = true;
		inode_ref(md, i->ino, 0, 1); /* the queue's, given back after the build */
		pthread_cond_signal(&b->work);
	}
	pthread_mutex_unlock(&b->lock);
}

/* Whether the build must stop before the next block: the mount stops,
 * the file changed (-ESTALE), another mount took the volume, or the
 * staging filesystem runs low (writers need the space more). */
static int build_interrupted(struct copy_build *b, struct inode *i, uint64_t gen)
{
	struct mountd *md = b->md;
	bool moved;

	if (atomic_load(&b->stop))
		return -EINTR;
	pthread_mutex_lock(&i->layout_lock);
	moved = i->layout_gen != gen;
	pthread_mutex_unlock(&i->layout_lock);
	if (moved || atomic_load(&md->lease_fenced))
		return -ESTALE;
	return staging_room_low(md) ? -ENOSPC : 0;
}

/* Writes i's committed content (size bytes, as of generation gen) into fd
 * through the read path; zeros stay holes. 0, or a negative errno
 * (-ESTALE: the file changed under the build; see build_interrupted()). */
static int build_write(struct copy_build *b, struct inode *i, int fd, uint64_t size, uint64_t gen)
{
	struct mountd *md = b->md;
	uint32_t bs = md->vol.block_size;
	char *buf = malloc(bs); /* this function's */
	int rc = 0;

	if (!buf)
		return -ENOMEM;
	if (ftruncate(fd, (off_t)size) < 0) {
		rc = -errno;
		goto out;
	}
	for (uint64_t at = 0; at < size; at += bs) {
		uint32_t len = size - at < bs ? (uint32_t)(size - at) : bs;
		ssize_t n;

		/* A change gives the build up at once rather than at its end. */
		if ((rc = build_interrupted(b, i, gen)) < 0)
			goto out;
		/* (at most len: the size given, not the file's, bounds it) */
		n = file_read(md, NULL, i, size, buf, len, (off_t)at);
		if (n < 0) {
			rc = (int)n;
			goto out;
		}
		if (!is_zero(buf, len) && !pwrite_all(fd, buf, len, (off_t)at)) {
			rc = -errno;
			goto out;
		}
	}
out:
	free(buf);
	return rc;
}

/* Whether the staging filesystem has room for size more bytes and still
 * --staging-min-free left: a build adds bytes, where every other copy is
 * a file that exists already. */
static bool staging_has_room(struct mountd *md, uint64_t size)
{
	struct statvfs sv;

	return fstatvfs(md->staging_dirfd, &sv) == 0 &&
	       (uint64_t)sv.f_bavail * sv.f_frsize >= size + md->staging_min_free;
}

static void build_one(struct copy_build *b, struct inode *i)
{
	struct mountd *md = b->md;
	struct meta_attr a;
	char name[64];
	uint64_t gen;
	bool wanted, reserved = false, installed = false;
	int fd = -1, rc;

	/* The generation first: a commit after it moves it, so a size read
	 * next that is already the commit's is caught at install. */
	pthread_mutex_lock(&i->layout_lock);
	gen = i->layout_gen;
	pthread_mutex_unlock(&i->layout_lock);
	if (meta_getattr(md->meta, i->ino, &a) < 0 || !S_ISREG(a.mode) || a.nlink == 0)
		goto out;
	pthread_mutex_lock(&i->lock);
	wanted = build_wanted(md, i, a.size);
	pthread_mutex_unlock(&i->lock);
	/* Only what the read cache still holds: a build that fetched the
	 * file again would double what a pass over many files costs (an
	 * object evicted during the build is still fetched). */
	if (!wanted || !staging_has_room(md, a.size) || !file_cached(md, i, a.size))
		goto out;
	pthread_mutex_lock(&i->lock);
	if (build_wanted(md, i, a.size))
		reserved = local_copy_reserve(md, i, a.size);
	pthread_mutex_unlock(&i->lock);
	if (!reserved)
		goto out;
	snprintf(name, sizeof(name), ".kept-%d-%llu-b%llu", (int)md->pid,
		 (unsigned long long)i->ino, (unsigned long long)atomic_fetch_add(&serial, 1));
	fd = openat(md->staging_dirfd, name, O_CREAT | O_EXCL | O_RDWR | O_NOFOLLOW | O_CLOEXEC,
		    0600);
	if (fd < 0) {
		log_warn("cannot create local copy %s", name);
		goto out;
	}
	rc = build_write(b, i, fd, a.size, gen);
	/* A failure that a change explains (the file cut under the read) is
	 * the change's, not worth a line. */
	if (rc < 0 && rc != -EINTR && rc != -ENOSPC && build_interrupted(b, i, gen) == 0)
		log_errno(rc, "inode %llu: cannot build a local copy; its reads go on "
			  "through the daemon", (unsigned long long)i->ino);
	if (rc < 0)
		goto out;
	pthread_mutex_lock(&i->lock);
	installed = local_copy_install(md, i, name, a.size, gen);
	pthread_mutex_unlock(&i->lock);
	/* The copy's pages serve its readers now: the cache files' would be
	 * a second copy in memory (they stay on disk), and so would the FUSE
	 * file's, which the next open would otherwise drop (a passthrough
	 * open keeps no cache): 95 ms for 1 GiB, paid by that reader. */
	if (installed) {
		file_cache_dontneed(md, i, a.size);
		inval_inode_later(md, i->ino);
	}
out:
	if (fd >= 0)
		close(fd); /* the copy is opened again when a reader comes */
	if (fd >= 0 && !installed && unlinkat(md->staging_dirfd, name, 0) < 0)
		log_warn("cannot remove local copy %s", name);
	if (reserved && !installed)
		local_copy_unreserve(md, a.size);
	atomic_fetch_add(installed ? &md->stats.local_copies_built :
				    &md->stats.local_copy_builds_given_up, 1);
}

static void *build_main(void *arg)
{
	struct copy_build *b = arg;
	struct mountd *md = b->md;

	objstore_set_cancel(stopping, b);
	pthread_mutex_lock(&b->lock);
	for (;;) {
		struct inode *i;

		while (b->n == 0 && !atomic_load(&b->stop))
			pthread_cond_wait(&b->work, &b->lock);
		if (atomic_load(&b->stop))
			break;
		i = b->q[b->head];
		b->head = (b->head + 1) % COPY_BUILD_QUEUE;
		b->n--;
		pthread_mutex_unlock(&b->lock);
		build_one(b, i);
		pthread_mutex_lock(&i->lock);
		i->kept_building = false;
		pthread_mutex_unlock(&i->lock);
		inode_unref(md, i, 0, 1);
		pthread_mutex_lock(&b->lock);
	}
	pthread_mutex_unlock(&b->lock);
	return NULL;
}

int copy_build_start(struct mountd *md)
{
	struct copy_build *b = calloc(1, sizeof(*b)); /* md->copy_build's */
	int rc;

	if (!b)
		return -ENOMEM;
	b->md = md;
	pthread_mutex_init(&b->lock, NULL);
	pthread_cond_init(&b->work, NULL);
	rc = pthread_create(&b->thread, NULL, build_main, b);
	if (rc != 0) {
		pthread_cond_destroy(&b->work);
		pthread_mutex_destroy(&b->lock);
		free(b);
		return -rc;
	}
	md->copy_build = b;
	return 0;
}

void copy_build_stop(struct mountd *md)
{
	struct copy_build *b = md->copy_build;

	if (!b || atomic_load(&b->stop))
		return;
	pthread_mutex_lock(&b->lock);
	atomic_store(&b->stop, true); /* copy_build_later() queues nothing more */
	pthread_cond_broadcast(&b->work);
	pthread_mutex_unlock(&b->lock);
	pthread_join(b->thread, NULL);
	/* Queued, never built. */
	for (; b->n > 0; b->n--, b->head = (b->head + 1) % COPY_BUILD_QUEUE) {
		struct inode *i = b->q[b->head];

		pthread_mutex_lock(&i->lock);
		i->kept_building = false;
		pthread_mutex_unlock(&i->lock);
		inode_unref(md, i, 0, 1);
	}
}

void copy_build_free(struct mountd *md)
{
	struct copy_build *b = md->copy_build;

	if (!b)
		return;
	copy_build_stop(md);
	md->copy_build = NULL;
	pthread_cond_destroy(&b->work);
	pthread_mutex_destroy(&b->lock);
	free(b);
}
