/*
 * The read cache: whole objects copied from the store into files under the
 * cache directory, keyed by object key. Objects are immutable, so a cache
 * file is valid forever; it appears atomically (written aside, then renamed)
 * and is either complete or absent.
 *
 * A hit is an open+pread with no lock. Insertions go through one mutex that
 * keeps the index in insertion order; past the size limit the oldest files
 * are evicted (FIFO: a hit does not move a file, which keeps hits lock-free).
 * Concurrent misses of one object (readahead makes them common) share one
 * fetch: the first reader fetches, the others wait for it and copy from the
 * object it got.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "block.h"
#include "mountd.h"

struct cache_entry {
	char *key;          /* owned */
	uint32_t size;
	struct cache_entry *next;
};

/* An object being fetched; guarded by read_cache.lock. Its fetcher and
 * every waiter hold a reference; the last one out frees it. A successful
 * fetch leaves the verified object in obj, so waiters copy their range from
 * it (the cache file may be evicted again before they could open it). */
struct fetch {
	char *key;          /* owned */
	char *obj;          /* owned; the verified object once done, or NULL */
	bool done;
	unsigned refs;
	struct fetch *next;
};

struct read_cache {
	char *dir;          /* owned */
	int dirfd;
	uint64_t limit;
	_Atomic uint64_t bytes;
	pthread_mutex_t lock;   /* guards the FIFO and the fetches below */
	struct cache_entry *head, *tail;
	struct fetch *fetching;
	pthread_cond_t fetched;
	_Atomic uint64_t tmp_seq;
};

static int mkdirs_at(int dirfd, const char *path)
{
	char buf[PATH_MAX];
	size_t n = strlen(path);

	if (n >= sizeof(buf))
		return -ENAMETOOLONG;
	memcpy(buf, path, n + 1);
	for (char *p = buf + 1; *p; p++) {
		if (*p != '/')
			continue;
		*p = '\0';
		if (mkdirat(dirfd, buf, 0700) < 0 && errno != EEXIST)
			return -errno;
		*p = '/';
	}
	return 0;
}

static void fifo_push(struct read_cache *c, struct cache_entry *e)
{
	e->next = NULL;
	if (c->tail)
		c->tail->next = e;
	else
		c->head = e;
	c->tail = e;
	atomic_fetch_add(&c->bytes, e->size);
}

/* Evicts the oldest entries until the cache fits. Holds c->lock. */
static void evict_locked(struct read_cache *c)
{
	while (c->head && atomic_load(&c->bytes) > c->limit) {
		struct cache_entry *e = c->head;
		c->head = e->next;
		if (!c->head)
			c->tail = NULL;
		unlinkat(c->dirfd, e->key, 0);
		atomic_fetch_sub(&c->bytes, e->size);
		free(e->key);
		free(e);
	}
}

static struct read_cache *scan_target;
static size_t scan_prefix;

static int scan_one(const char *path, const struct stat *st, int type, struct FTW *ftw)
{
	struct read_cache *c = scan_target;
	const char *rel = path + scan_prefix;
	struct cache_entry *e;

	if (type != FTW_F)
		return 0;
	if (strstr(rel, ".tmp.")) {  /* an insertion cut short by a crash */
		unlink(path);
		return 0;
	}
	e = calloc(1, sizeof(*e));
	if (!e || !(e->key = strdup(rel))) {
		free(e);
		return -1;
	}
	e->size = (uint32_t)st->st_size;
	fifo_push(c, e);
	return 0;
}

int read_cache_open(const char *dir, uint64_t limit_bytes, struct read_cache **out)
{
	static pthread_mutex_t scan_lock = PTHREAD_MUTEX_INITIALIZER;
	struct read_cache *c = calloc(1, sizeof(*c));
	int rc;

	if (!c)
		return -ENOMEM;
	c->dirfd = -1;
	pthread_mutex_init(&c->lock, NULL);
	mono_cond_init(&c->fetched);
	c->limit = limit_bytes;
	if (!(c->dir = strdup(dir))) {
		rc = -ENOMEM;
		goto fail;
	}
	if (mkdir(dir, 0700) < 0 && errno != EEXIST) {
		rc = -errno;
		goto fail;
	}
	c->dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (c->dirfd < 0) {
		rc = -errno;
		goto fail;
	}
	/* nftw has no user pointer: the scan runs once, at start, under a lock. */
	pthread_mutex_lock(&scan_lock);
	scan_target = c;
	scan_prefix = strlen(dir) + 1;
	rc = nftw(dir, scan_one, 16, FTW_PHYS);
	pthread_mutex_unlock(&scan_lock);
	if (rc != 0) {
		rc = -EIO;
		goto fail;
	}
	evict_locked(c);
	*out = c;
	return 0;
fail:
	read_cache_close(c);
	return rc;
}

void read_cache_close(struct read_cache *c)
{
	if (!c)
		return;
	for (struct cache_entry *e = c->head, *n; e; e = n) {
		n = e->next;
		free(e->key);
		free(e);
	}
	if (c->dirfd >= 0)
		close(c->dirfd);
	pthread_mutex_destroy(&c->lock);
	pthread_cond_destroy(&c->fetched);
	free(c->dir);
	free(c);
}

uint64_t read_cache_bytes(struct read_cache *c)
{
	return c ? atomic_load(&c->bytes) : 0;
}

void read_cache_insert(struct read_cache *c, const char *key, const void *buf, uint32_t len)
{
	char tmp[PATH_MAX];
	struct cache_entry *e = NULL;
	int fd = -1;

	if (!c || c->limit < len)
		return;
	if (mkdirs_at(c->dirfd, key) < 0)
		return;
	snprintf(tmp, sizeof(tmp), "%s.tmp.%d.%llu", key, (int)getpid(),
		 (unsigned long long)atomic_fetch_add(&c->tmp_seq, 1));
	fd = openat(c->dirfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (fd < 0)
		return;
	/* No fsync: after a crash a cache file is checked against its size. */
	if (write(fd, buf, len) != (ssize_t)len)
		goto fail;
	close(fd);
	fd = -1;
	/* Objects are immutable: one that is already cached stays as it is
	 * (and is not counted twice). */
	if (faccessat(c->dirfd, key, F_OK, 0) == 0 ||
	    renameat2(c->dirfd, tmp, c->dirfd, key, RENAME_NOREPLACE) < 0)
		goto fail;
	e = calloc(1, sizeof(*e));
	if (!e || !(e->key = strdup(key))) {
		free(e);
		unlinkat(c->dirfd, key, 0);
		return;
	}
	e->size = len;
	pthread_mutex_lock(&c->lock);
	fifo_push(c, e);
	evict_locked(c);
	pthread_mutex_unlock(&c->lock);
	return;
fail:
	if (fd >= 0)
		close(fd);
	unlinkat(c->dirfd, tmp, 0);
}

/* Removes the cache file of key that was found wrong (sb: what was found),
 * unless another has replaced it since: a fetch may have just put the
 * right object there. */
static void drop_bad(struct read_cache *c, const char *key, const struct stat *sb)
{
	struct stat now;

	if (fstatat(c->dirfd, key, &now, AT_SYMLINK_NOFOLLOW) == 0 && now.st_ino == sb->st_ino &&
	    now.st_dev == sb->st_dev)
		unlinkat(c->dirfd, key, 0);
}

/* Reads from the cache file of key; -ENOENT if it is not (validly) cached. */
static ssize_t cache_file_read(struct read_cache *c, struct stats *st, const char *key,
			       uint32_t objsize, uint32_t off, void *buf, uint32_t len)
{
	struct stat sb;
	ssize_t n = -ENOENT;
	int fd = openat(c->dirfd, key, O_RDONLY | O_CLOEXEC);

	if (fd < 0)
		return -ENOENT;
	if (fstat(fd, &sb) < 0) {
		close(fd);
		return -ENOENT;
	}
	if (sb.st_size == objsize)
		n = pread(fd, buf, len, off);
	close(fd);
	if (n == (ssize_t)len) {
		atomic_fetch_add(&st->cache_hits, 1);
		return n;
	}
	/* A cache file of the wrong size is not trusted: fetch again. */
	drop_bad(c, key, &sb);
	return -ENOENT;
}

int read_cache_fd(struct read_cache *c, struct stats *st, const char *key, uint32_t objsize)
{
	struct stat sb;
	int fd;

	if (c == NULL)
		return -ENOENT;
	fd = openat(c->dirfd, key, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -ENOENT;
	if (fstat(fd, &sb) < 0) {
		close(fd);
		return -ENOENT;
	}
	if (sb.st_size != objsize) {
		/* Not trusted, as in cache_file_read(): the next read fetches. */
		drop_bad(c, key, &sb);
		close(fd);
		return -ENOENT;
	}
	atomic_fetch_add(&st->cache_hits, 1);
	return fd;
}

static void fetch_put_locked(struct fetch *f)
{
	if (--f->refs > 0)
		return;
	free(f->key);
	free(f->obj);
	free(f);
}

/* Joins a fetch of key in flight (returns false once it is done, or with
 * *gave_up when the caller is gone; *f holds a reference either way, for
 * fetch_put; without wait it returns false at once, *f NULL) or starts one (returns true; *f is the caller's to finish with
 * fetch_end, NULL when there was no memory to share it). */
static bool fetch_begin(struct read_cache *c, const char *key, bool wait, struct fetch **f,
			bool *gave_up)
{
	struct fetch *x;

	pthread_mutex_lock(&c->lock);
	for (x = c->fetching; x; x = x->next)
		if (strcmp(x->key, key) == 0)
			break;
	if (x && !wait) {
		pthread_mutex_unlock(&c->lock);
		*f = NULL;
		return false;
	}
	if (x) {
		x->refs++;
		while (!x->done) {
			/* Woken now and then: a waiter whose caller is gone
			 * (objstore_set_cancel) stops waiting. */
			struct timespec until;

			mono_deadline_ms(&until, 100);
			pthread_cond_timedwait(&c->fetched, &c->lock, &until);
			if (!x->done && objstore_cancelled()) {
				*gave_up = true;
				break;
			}
		}
		pthread_mutex_unlock(&c->lock);
		*f = x;
		return false;
	}
	x = calloc(1, sizeof(*x));
	if (x && !(x->key = strdup(key))) {
		free(x);
		x = NULL;
	}
	if (x) {
		x->refs = 1;
		x->next = c->fetching;
		c->fetching = x;
	}
	pthread_mutex_unlock(&c->lock);
	*f = x;
	return true;
}

static void fetch_put(struct read_cache *c, struct fetch *f)
{
	pthread_mutex_lock(&c->lock);
	fetch_put_locked(f);
	pthread_mutex_unlock(&c->lock);
}

/* Ends the caller's fetch f (NULL: an unshared one); obj (owned by the
 * caller until now; NULL when the fetch failed) passes to the waiters. */
static void fetch_end(struct read_cache *c, struct fetch *f, char *obj)
{
	struct fetch **pp;

	if (!f)
		return;
	pthread_mutex_lock(&c->lock);
	for (pp = &c->fetching; *pp && *pp != f; pp = &(*pp)->next)
		;
	if (*pp)
		*pp = f->next;
	if (!f->done) {
		f->obj = obj;
		f->done = true;
		pthread_cond_broadcast(&c->fetched);
	}
	fetch_put_locked(f);
	pthread_mutex_unlock(&c->lock);
}

/* Hands the verified object (owned by f from now on; the fetcher may read
 * it until its fetch_end, whose obj is then ignored) to the waiters before
 * it is written to the cache: they need not wait for that write. f stays
 * in c->fetching meanwhile, so a reader that comes now joins it rather
 * than fetching the object again. */
static void fetch_publish(struct read_cache *c, struct fetch *f, char *obj)
{
	pthread_mutex_lock(&c->lock);
	f->obj = obj;
	f->done = true;
	pthread_cond_broadcast(&c->fetched);
	pthread_mutex_unlock(&c->lock);
}

/* A fresh object buffer is mapped page by page as the body is copied in,
 * and a page fault is dear (in a VM most of all): one call maps it all.
 * Best effort: a kernel without MADV_POPULATE_WRITE faults as before. */
static void populate(void *p, size_t len)
{
#ifdef MADV_POPULATE_WRITE
	long pg = sysconf(_SC_PAGESIZE);
	uintptr_t a = ((uintptr_t)p + (uintptr_t)pg - 1) & ~((uintptr_t)pg - 1);
	uintptr_t e = ((uintptr_t)p + len) & ~((uintptr_t)pg - 1);

	if (len >= (1u << 20) && e > a)
		(void)madvise((void *)a, e - a, MADV_POPULATE_WRITE);
#else
	(void)p;
	(void)len;
#endif
}

/* Gets key whole from the store into *out (malloc'ed, the caller's once
 * this returns 0), verified: a damaged object is -EBADMSG, never bytes. */
static int object_fetch(struct objstore *s, struct stats *st, const char *key, uint32_t objsize,
			char **out)
{
	size_t cap = (size_t)objsize + BLOCK_TRAILER + 1;
	char *obj = malloc(cap);
	ssize_t n;

	if (!obj)
		return -ENOMEM;
	populate(obj, cap);
	/* Ask for one byte more than the object should hold: a longer object
	 * is as damaged as a shorter one. */
	n = objstore_get(s, key, 0, obj, (size_t)objsize + BLOCK_TRAILER + 1);
	atomic_fetch_add(&st->objects_get, 1);
	if (n >= 0) {
		atomic_fetch_add(&st->bytes_downloaded, (uint64_t)n);
		if (block_verify(obj, (size_t)n, objsize) < 0)
			n = -EBADMSG;
	}
	if (n < 0) {
		free(obj);
		return (int)n;
	}
	*out = obj;
	return 0;
}

bool read_cache_has(struct read_cache *c, const char *key, uint32_t objsize)
{
	struct stat sb;

	if (!c || fstatat(c->dirfd, key, &sb, AT_SYMLINK_NOFOLLOW) < 0)
		return false;
	if (sb.st_size == objsize)
		return true;
	/* Damaged: out of the way, or a fetch could not put the object
	 * there (insertions never replace a cached file). */
	drop_bad(c, key, &sb);
	return false;
}

int read_cache_prefetch(struct read_cache *c, struct objstore *s, struct stats *st,
			const char *key, uint32_t objsize)
{
	struct fetch *f = NULL;
	char *obj = NULL;
	bool gave_up = false;
	int rc;

	if (!c || c->limit < objsize || read_cache_has(c, key, objsize))
		return 0;
	if (!fetch_begin(c, key, false, &f, &gave_up))
		return 0; /* a reader (or another prefetch) is fetching it */
	if (read_cache_has(c, key, objsize)) {
		/* Cached between the look above and fetch_begin: waiters
		 * look in the cache again. */
		fetch_end(c, f, NULL);
		return 0;
	}
	rc = object_fetch(s, st, key, objsize, &obj);
	if (rc == 0 && f) {
		fetch_publish(c, f, obj);
		read_cache_insert(c, key, obj, objsize);
		obj = NULL; /* f's */
	} else if (rc == 0) {
		read_cache_insert(c, key, obj, objsize);
	}
	fetch_end(c, f, NULL);
	free(obj);
	return rc == 0 ? 1 : rc;
}

ssize_t read_cache_read(struct read_cache *c, struct objstore *s, struct stats *st,
			const char *key, uint32_t objsize, uint32_t off, void *buf, uint32_t len)
{
	struct fetch *f = NULL;
	char *obj = NULL;
	bool gave_up = false;
	ssize_t n;

	if ((uint64_t)off + len > objsize)
		return -EINVAL;
	if (c) {
		n = cache_file_read(c, st, key, objsize, off, buf, len);
		if (n != -ENOENT)
			return n;
		if (!fetch_begin(c, key, true, &f, &gave_up)) {
			/* f->obj is only written before done, under the lock
			 * this thread has taken since. */
			if (f->done && f->obj) {
				memcpy(buf, f->obj + off, len);
				n = len;
			} else {
				n = gave_up ? -EINTR : -ENOENT;
			}
			fetch_put(c, f);
			f = NULL;
			if (n != -ENOENT)
				return n;
			/* That fetch found the object cached, or failed: look
			 * again, then fetch alone. */
			n = cache_file_read(c, st, key, objsize, off, buf, len);
			if (n != -ENOENT)
				return n;
		} else {
			/* A fetch of key may have ended between the miss above
			 * and fetch_begin: the object is cached then. */
			n = cache_file_read(c, st, key, objsize, off, buf, len);
			if (n != -ENOENT) {
				fetch_end(c, f, NULL);
				return n;
			}
		}
	}
	atomic_fetch_add(&st->cache_misses, 1);
	n = object_fetch(s, st, key, objsize, &obj);
	if (n < 0)
		goto out;
	memcpy(buf, obj + off, len);
	if (c && f) {
		fetch_publish(c, f, obj);
		read_cache_insert(c, key, obj, objsize);
		obj = NULL; /* f's */
	} else {
		read_cache_insert(c, key, obj, objsize);
	}
	n = len;
out:
	if (c && f) {
		/* The waiters get the object only when it was verified. */
		fetch_end(c, f, n >= 0 ? obj : NULL);
		if (n >= 0)
			obj = NULL;
	}
	free(obj);
	return n;
}
