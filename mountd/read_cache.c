/*
 * The read cache: whole objects copied from the store into files under the
 * cache directory, keyed by object key. Objects are immutable, so a cache
 * file is valid for as long as it is whole; it appears atomically (written
 * aside, then renamed) and holds the stored object, its trailer included.
 *
 * An index (a hash of keys, in least-recently-used order) says what is
 * cached; it is rebuilt at start from the files (one directory walk, no
 * reading). A file is trusted once its trailer was checked in this
 * process: files fetched now are, files found at start are checked at
 * their first use (a crash or a power loss may have left a file of the
 * right length and the wrong bytes: it is dropped and fetched again). Past
 * the size limit the least recently used files are evicted.
 *
 * Concurrent misses of one object (readahead makes them common) share one
 * fetch: the first reader fetches, the others wait for it and copy from the
 * object it got. Everything here is owned by struct read_cache.
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
#include "boot.h"
#include "dirs.h"
#include "fd_limit.h"
#include "mountd.h"

struct cache_entry {
	char *key;                  /* owned */
	uint32_t size;              /* data bytes; the file has the trailer too */
	bool verified;              /* its trailer was checked, or it is trusted */
	bool verifying;             /* a reader checks it now; others wait */
	ino_t fino;                 /* the file's inode: a newer one is not ours */
	/* An fd kept open on the verified file (-1: none), so a READ costs a
	 * dup() instead of a path walk and a stat, and the kernel's readahead
	 * state on the file lasts across READs. Readers get dups: closing
	 * this one never pulls a file from under a reply. */
	int fd;
	struct cache_entry *fprev, *fnext; /* entries keeping an fd, coldest first */
	struct cache_entry *prev, *next;  /* LRU order: head is the coldest */
	struct cache_entry *hnext;  /* hash chain */
};

/* An object being fetched; guarded by read_cache.lock. Its fetcher and
 * every waiter hold a reference; the last one out frees it. A successful
 * fetch leaves the verified object in obj, so waiters copy their range from
 * it, or an fd on the verified file it was streamed into (the cache file
 * may be evicted again before they could open it). */
struct fetch {
	char *key;          /* owned */
	char *obj;          /* owned; the verified object once done, or NULL */
	int fd;             /* owned; or a verified file of it once done (-1: none) */
	bool done;
	unsigned refs;
	struct fetch *next;
};

struct read_cache {
	char *dir;          /* owned */
	int dirfd;
	uint64_t limit;
	_Atomic uint64_t bytes;
	pthread_mutex_t lock;   /* guards the index and the fetches below */
	struct cache_entry *head, *tail;
	struct cache_entry **buckets; /* owned; nbuckets, a power of two */
	size_t nbuckets, nentries;
	struct fetch *fetching;
	pthread_cond_t fetched;
	struct cache_entry *fhead, *ftail; /* entries keeping an fd; nfds of them */
	size_t nfds, kept_max;
	_Atomic uint64_t tmp_seq;
	bool opened;            /* read_cache_open succeeded: close records state */
};

/*
 * Which files found at start can be trusted without reading them. A cache
 * file is written without fsync, so only a crash of the kernel (a power
 * loss) can leave one with the right length and the wrong bytes. STATE_NAME
 * says which boot last wrote files here and whether a clean stop synced
 * them since: files are trusted when they were synced, or were written
 * under the boot that runs now (the page cache they went through is still
 * the one the disk will get). Otherwise each is checked at its first use.
 */
#define STATE_NAME ".state"

static bool state_trusted(struct read_cache *c)
{
	char text[128] = "", boot[64], want[64];
	int synced = 0;
	ssize_t n;
	int fd = openat(c->dirfd, STATE_NAME, O_RDONLY | O_CLOEXEC);

	if (fd < 0)
		return false;
	n = read(fd, text, sizeof(text) - 1);
	close(fd);
	if (n <= 0)
		return false;
	text[n] = '\0';
	if (sscanf(text, "boot %63s synced %d", want, &synced) != 2)
		return false;
	boot_id(boot, sizeof(boot));
	return synced == 1 || (boot[0] && strcmp(boot, want) == 0);
}

/* Records the state durably (files written after this depend on it). */
static int state_write(struct read_cache *c, int synced)
{
	char text[128], boot[64];
	int len;

	boot_id(boot, sizeof(boot));
	len = snprintf(text, sizeof(text), "boot %s synced %d\n", boot[0] ? boot : "unknown", synced);
	return dirs_replace_file_at(c->dirfd, STATE_NAME, text, (size_t)len);
}

static size_t key_hash(const char *key)
{
	uint64_t h = 1469598103934665603ull; /* FNV-1a */

	for (; *key; key++)
		h = (h ^ (unsigned char)*key) * 1099511628211ull;
	return (size_t)h;
}

static struct cache_entry *index_find(struct read_cache *c, const char *key)
{
	struct cache_entry *e = c->buckets[key_hash(key) & (c->nbuckets - 1)];

	while (e && strcmp(e->key, key) != 0)
		e = e->hnext;
	return e;
}

static void lru_unlink(struct read_cache *c, struct cache_entry *e)
{
	if (e->prev)
		e->prev->next = e->next;
	else
		c->head = e->next;
	if (e->next)
		e->next->prev = e->prev;
	else
		c->tail = e->prev;
	e->prev = e->next = NULL;
}

static void lru_push(struct read_cache *c, struct cache_entry *e)
{
	e->prev = c->tail;
	e->next = NULL;
	if (c->tail)
		c->tail->next = e;
	else
		c->head = e;
	c->tail = e;
}

/* At most this many cache files are kept open (the hot ones), and no more
 * than an eighth of RLIMIT_NOFILE: under a limit of 256, 256 kept fds
 * left READs none to open an object with (EIO). */
#define KEPT_FDS_MAX 256
#define KEPT_FDS_MIN 8

static size_t kept_fds_max(void)
{
	long limit = fd_limit_soft();

	if (limit < 0 || limit / 8 >= KEPT_FDS_MAX)
		return KEPT_FDS_MAX;
	return limit / 8 > KEPT_FDS_MIN ? (size_t)(limit / 8) : KEPT_FDS_MIN;
}

/* Takes e off the list of kept fds; its fd is the caller's to close or
 * keep again. */
static void fd_unlink(struct read_cache *c, struct cache_entry *e)
{
	if (e->fprev)
		e->fprev->fnext = e->fnext;
	else
		c->fhead = e->fnext;
	if (e->fnext)
		e->fnext->fprev = e->fprev;
	else
		c->ftail = e->fprev;
	e->fprev = e->fnext = NULL;
	c->nfds--;
}

static void fd_forget(struct read_cache *c, struct cache_entry *e)
{
	if (e->fd < 0)
		return;
	fd_unlink(c, e);
	close(e->fd);
	e->fd = -1;
}

/* e keeps fd (ours now), the coldest kept fd going past kept_max. */
static void fd_keep(struct read_cache *c, struct cache_entry *e, int fd)
{
	if (c->nfds >= c->kept_max && c->fhead)
		fd_forget(c, c->fhead);
	e->fd = fd;
	e->fprev = c->ftail;
	e->fnext = NULL;
	if (c->ftail)
		c->ftail->fnext = e;
	else
		c->fhead = e;
	c->ftail = e;
	c->nfds++;
}

/* Adds e (the caller's until now) to the index as the most recent. A
 * table that cannot grow stays as it is: chains get longer, nothing
 * fails. */
static void index_add(struct read_cache *c, struct cache_entry *e)
{
	if (c->nentries >= c->nbuckets) {
		size_t n = c->nbuckets * 2;
		struct cache_entry **b = calloc(n, sizeof(*b));

		if (b) {
			for (size_t i = 0; i < c->nbuckets; i++) {
				for (struct cache_entry *x = c->buckets[i], *nx; x; x = nx) {
					nx = x->hnext;
					x->hnext = b[key_hash(x->key) & (n - 1)];
					b[key_hash(x->key) & (n - 1)] = x;
				}
			}
			free(c->buckets);
			c->buckets = b;
			c->nbuckets = n;
		}
	}
	size_t h = key_hash(e->key) & (c->nbuckets - 1);
	e->hnext = c->buckets[h];
	c->buckets[h] = e;
	c->nentries++;
	lru_push(c, e);
	atomic_fetch_add(&c->bytes, (uint64_t)e->size + BLOCK_TRAILER);
}

/* Takes e out of the index and frees it; its file is the caller's to
 * remove (or already gone). */
static void index_remove(struct read_cache *c, struct cache_entry *e)
{
	struct cache_entry **pp = &c->buckets[key_hash(e->key) & (c->nbuckets - 1)];

	while (*pp && *pp != e)
		pp = &(*pp)->hnext;
	if (*pp)
		*pp = e->hnext;
	c->nentries--;
	lru_unlink(c, e);
	fd_forget(c, e);
	atomic_fetch_sub(&c->bytes, (uint64_t)e->size + BLOCK_TRAILER);
	free(e->key);
	free(e);
}

/* Evicts the least recently used entries until the cache fits. Holds
 * c->lock. */
static void evict_locked(struct read_cache *c)
{
	while (c->head && atomic_load(&c->bytes) > c->limit) {
		unlinkat(c->dirfd, c->head->key, 0);
		index_remove(c, c->head);
	}
}

static struct cache_entry *entry_new(const char *key, uint32_t size, ino_t fino, bool verified)
{
	struct cache_entry *e = calloc(1, sizeof(*e));

	if (e && !(e->key = strdup(key))) {
		free(e);
		return NULL;
	}
	if (e) {
		e->fd = -1;
		e->size = size;
		e->fino = fino;
		e->verified = verified;
	}
	return e;
}

static struct read_cache *scan_target;
static size_t scan_prefix;
static bool scan_trusted;

static int scan_one(const char *path, const struct stat *st, int type, struct FTW *ftw)
{
	struct read_cache *c = scan_target;
	const char *rel = path + scan_prefix;
	struct cache_entry *e;

	(void)ftw;
	if (type != FTW_F || strcmp(rel, STATE_NAME) == 0)
		return 0;
	/* An insertion cut short by a crash, or a file too short to hold an
	 * object (one of an older layout, without the trailer, is fetched
	 * again). */
	if (strstr(rel, ".tmp.") || st->st_size < (off_t)BLOCK_TRAILER ||
	    st->st_size - BLOCK_TRAILER > UINT32_MAX || index_find(c, rel)) {
		unlink(path);
		return 0;
	}
	e = entry_new(rel, (uint32_t)(st->st_size - BLOCK_TRAILER), st->st_ino, scan_trusted);
	if (!e)
		return -1;
	index_add(c, e);
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
	c->kept_max = kept_fds_max();
	c->nbuckets = 1024;
	if (!(c->buckets = calloc(c->nbuckets, sizeof(*c->buckets))) || !(c->dir = strdup(dir))) {
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
	scan_trusted = state_trusted(c);
	rc = nftw(dir, scan_one, 16, FTW_PHYS);
	pthread_mutex_unlock(&scan_lock);
	if (rc != 0) {
		rc = -EIO;
		goto fail;
	}
	/* From now on files are written that no clean stop has synced. */
	rc = state_write(c, 0);
	if (rc < 0)
		goto fail;
	evict_locked(c);
	c->opened = true;
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
	/* A clean stop: what was written is synced, so the next start
	 * trusts it even after a reboot. */
	if (c->opened && syncfs(c->dirfd) == 0)
		(void)state_write(c, 1);
	for (struct cache_entry *e = c->head, *n; e; e = n) {
		n = e->next;
		if (e->fd >= 0)
			close(e->fd);
		free(e->key);
		free(e);
	}
	free(c->buckets);
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

/* Puts the whole file tmp (inode fino, len bytes of data; its trailer
 * checked already if verified) in place as key's cache file and indexes it
 * (true); otherwise removes it. Objects are immutable: one already cached
 * stays as it is (and is not counted twice). */
static bool file_install(struct read_cache *c, const char *tmp, const char *key, uint32_t len,
			 ino_t fino, bool verified)
{
	struct cache_entry *e = entry_new(key, len, fino, verified), *old;

	if (!e) {
		unlinkat(c->dirfd, tmp, 0);
		return false;
	}
	pthread_mutex_lock(&c->lock);
	old = index_find(c, key);
	if (old && old->size != len) {
		/* A damaged file (found at start) that nobody read yet. */
		unlinkat(c->dirfd, key, 0);
		index_remove(c, old);
		old = NULL;
	}
	if (old || renameat2(c->dirfd, tmp, c->dirfd, key, RENAME_NOREPLACE) < 0) {
		pthread_mutex_unlock(&c->lock);
		unlinkat(c->dirfd, tmp, 0);
		free(e->key);
		free(e);
		return false;
	}
	index_add(c, e);
	evict_locked(c);
	pthread_mutex_unlock(&c->lock);
	return true;
}

bool read_cache_adopt(struct read_cache *c, const char *key, const char *tmp, uint32_t len)
{
	size_t stored = (size_t)len + BLOCK_TRAILER;
	struct stat st;

	if (!c)
		return false;
	if (c->limit < stored || fstatat(c->dirfd, tmp, &st, AT_SYMLINK_NOFOLLOW) < 0 ||
	    !S_ISREG(st.st_mode) || (uint64_t)st.st_size != stored) {
		unlinkat(c->dirfd, tmp, 0);
		return false;
	}
	/* Written by another process: its trailer is checked at its first
	 * use, as for a file found at start. */
	return file_install(c, tmp, key, len, st.st_ino, false);
}

const char *read_cache_dir(struct read_cache *c)
{
	return c && c->limit > 0 ? c->dir : NULL;
}

void read_cache_insert(struct read_cache *c, const char *key, const void *buf, uint32_t len)
{
	char tmp[PATH_MAX];
	size_t stored = (size_t)len + BLOCK_TRAILER;
	struct stat sb;
	int fd;

	if (!c || c->limit < stored)
		return;
	if (dirs_make_parents_at(c->dirfd, key, 0700) < 0)
		return;
	snprintf(tmp, sizeof(tmp), "%s.tmp.%d.%llu", key, (int)getpid(),
		 (unsigned long long)atomic_fetch_add(&c->tmp_seq, 1));
	fd = openat(c->dirfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (fd < 0)
		return;
	/* No fsync: after a crash its trailer is checked before it is used. */
	if (write(fd, buf, stored) != (ssize_t)stored || fstat(fd, &sb) < 0) {
		close(fd);
		unlinkat(c->dirfd, tmp, 0);
		return;
	}
	close(fd);
	file_install(c, tmp, key, len, sb.st_ino, true);
}

/* Drops the cache file of key found wrong (fino: the file found), unless
 * another has replaced it since: a fetch may just have put the right
 * object there. */
static void drop_bad_locked(struct read_cache *c, const char *key, ino_t fino)
{
	struct cache_entry *e = index_find(c, key);
	bool ours = !e || e->fino == fino; /* the file is not another's */
	struct stat now;

	if (e && ours)
		index_remove(c, e); /* frees e */
	if (ours && fstatat(c->dirfd, key, &now, AT_SYMLINK_NOFOLLOW) == 0 && now.st_ino == fino)
		unlinkat(c->dirfd, key, 0);
}

/* Checks the trailer of a cache file found at start (read whole, once). */
static bool file_verify(int fd, uint32_t objsize)
{
	size_t stored = (size_t)objsize + BLOCK_TRAILER, got = 0;
	char *buf = malloc(stored);
	bool ok = false;

	if (!buf)
		return false;
	while (got < stored) {
		ssize_t n = pread(fd, buf + got, stored - got, (off_t)got);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		got += (size_t)n;
	}
	ok = got == stored && block_verify(buf, stored, objsize) == 0;
	free(buf);
	return ok;
}

/* An fd on the cached copy of key, which becomes the most recently used;
 * -ENOENT when it is not cached whole and right. A file not trusted yet is
 * checked by one reader while the others wait for its verdict. */
static int cache_open(struct read_cache *c, struct stats *st, const char *key, uint32_t objsize,
		      bool hit)
{
	struct cache_entry *e;
	struct stat sb;
	bool mine = false, ok = true;
	int fd;

	pthread_mutex_lock(&c->lock);
	e = index_find(c, key);
	ok = e && e->size == objsize;
	if (ok) {
		lru_unlink(c, e);
		lru_push(c, e);
		if (e->verified && e->fd >= 0 && (fd = fcntl(e->fd, F_DUPFD_CLOEXEC, 0)) >= 0) {
			fd_unlink(c, e); /* to the hot end of the kept fds */
			fd_keep(c, e, e->fd);
			pthread_mutex_unlock(&c->lock);
			if (hit)
				atomic_fetch_add(&st->cache_hits, 1);
			return fd;
		}
	} else if (e) {
		/* A key names its object's length: a file of another length
		 * (found at start) is damaged. */
		atomic_fetch_add(&st->cache_dropped, 1);
		drop_bad_locked(c, key, e->fino);
	}
	pthread_mutex_unlock(&c->lock);
	if (!ok)
		return -ENOENT;
	fd = openat(c->dirfd, key, O_RDONLY | O_CLOEXEC);
	if (fd < 0 && (errno == EMFILE || errno == ENFILE)) {
		/* The fds kept for speed are the first to give back. */
		pthread_mutex_lock(&c->lock);
		for (size_t n = c->nfds / 2 + 1; n > 0 && c->fhead; n--)
			fd_forget(c, c->fhead);
		pthread_mutex_unlock(&c->lock);
		fd = openat(c->dirfd, key, O_RDONLY | O_CLOEXEC);
	}
	if (fd < 0)
		return -ENOENT;
	if (fstat(fd, &sb) < 0) {
		close(fd);
		return -ENOENT;
	}
	pthread_mutex_lock(&c->lock);
	if (sb.st_size != (off_t)objsize + (off_t)BLOCK_TRAILER) {
		ok = false;
		goto bad;
	}
	for (;;) {
		e = index_find(c, key);
		if (!e || e->fino != sb.st_ino) {
			/* Evicted or replaced since: not the file we know. */
			pthread_mutex_unlock(&c->lock);
			close(fd);
			return -ENOENT;
		}
		if (e->verified)
			break;
		if (!e->verifying) {
			e->verifying = mine = true;
			break;
		}
		pthread_cond_wait(&c->fetched, &c->lock);
	}
	if (mine) {
		pthread_mutex_unlock(&c->lock);
		ok = file_verify(fd, objsize);
		pthread_mutex_lock(&c->lock);
		if ((e = index_find(c, key)) && e->fino == sb.st_ino) {
			e->verifying = false;
			e->verified = ok;
		}
		pthread_cond_broadcast(&c->fetched);
	}
bad:
	if (!ok) {
		/* Not trusted: the next read fetches it again. */
		atomic_fetch_add(&st->cache_dropped, 1);
		drop_bad_locked(c, key, sb.st_ino);
		pthread_mutex_unlock(&c->lock);
		close(fd);
		return -ENOENT;
	}
	/* Kept for the next READs of this file (a dup: this one is the
	 * caller's). */
	if ((e = index_find(c, key)) && e->fino == sb.st_ino && e->verified && e->fd < 0) {
		int kept = fcntl(fd, F_DUPFD_CLOEXEC, 0);

		if (kept >= 0)
			fd_keep(c, e, kept);
	}
	pthread_mutex_unlock(&c->lock);
	if (hit)
		atomic_fetch_add(&st->cache_hits, 1);
	return fd;
}

/* Reads from the cache file of key; -ENOENT if it is not (validly) cached. */
static ssize_t cache_file_read(struct read_cache *c, struct stats *st, const char *key,
			       uint32_t objsize, uint32_t off, void *buf, uint32_t len)
{
	int fd = cache_open(c, st, key, objsize, true);
	ssize_t n;

	if (fd < 0)
		return fd;
	n = pread(fd, buf, len, off);
	close(fd);
	return n == (ssize_t)len ? n : -ENOENT;
}

int read_cache_fd(struct read_cache *c, struct stats *st, const char *key, uint32_t objsize)
{
	return c ? cache_open(c, st, key, objsize, true) : -ENOENT;
}

static void fetch_put_locked(struct fetch *f)
{
	if (--f->refs > 0)
		return;
	free(f->key);
	free(f->obj);
	if (f->fd >= 0)
		close(f->fd);
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
		x->fd = -1;
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

/* fetch_publish() of a verified file instead of a buffer: the waiters
 * read from a dup of fd (the caller keeps its own). */
static void fetch_publish_fd(struct read_cache *c, struct fetch *f, int fd)
{
	int mine = fcntl(fd, F_DUPFD_CLOEXEC, 0);

	pthread_mutex_lock(&c->lock);
	f->fd = mine;  /* -1 (no fd left): the waiters look in the cache again */
	f->done = true;
	pthread_cond_broadcast(&c->fetched);
	pthread_mutex_unlock(&c->lock);
}

/* A fresh buffer is mapped page by page as the body is copied in,
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

/* A GET streamed into a file being written aside, checked as it comes.
 * curl hands the body over in pieces of at most 16 KiB whatever its
 * buffer (CURL_MAX_WRITE_SIZE); written one by one they were 16,000
 * pwrite calls per 256 MiB, most of ferry-mountd's CPU on a cold S3 read,
 * so they are gathered into buf (owned, STREAM_BUF bytes) first. */
#define STREAM_BUF (1u << 20)
struct stream {
	int fd;
	struct block_check k;
	char *buf;
	size_t used;    /* bytes in buf, to be written at k.seen - used */
};

static int stream_flush(struct stream *w)
{
	uint64_t pos = w->k.seen - w->used;
	size_t done = 0;

	while (done < w->used) {
		ssize_t n = pwrite(w->fd, w->buf + done, w->used - done, (off_t)(pos + done));

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return n < 0 ? -errno : -EIO;
		done += (size_t)n;
	}
	w->used = 0;
	return 0;
}

static int stream_put(void *arg, uint64_t pos, const void *data, size_t len)
{
	struct stream *w = arg;
	const char *p = data;

	if (pos == 0) {
		/* (again, for a retried GET: what it had gathered is void) */
		block_check_init(&w->k, w->k.data_len);
		w->used = 0;
	}
	if (pos != w->k.seen)
		return -EIO; /* not what a GET delivers */
	while (len > 0) {
		size_t n = len < STREAM_BUF - w->used ? len : STREAM_BUF - w->used;
		int rc;

		memcpy(w->buf + w->used, p, n);
		w->used += n;
		block_check_feed(&w->k, p, n);
		p += n;
		len -= n;
		if (w->used == STREAM_BUF && (rc = stream_flush(w)) < 0)
			return rc;
	}
	return 0;
}

/* Gets key whole from the store straight into a new cache file, checked
 * as the body arrives, without holding the object in memory; the file is
 * then put in place (file_install). *fd_out: an fd on the
 * verified file (the caller's), even when it could not be cached (then
 * it is already unlinked). A damaged object is -EBADMSG. */
static int object_stream(struct read_cache *c, struct objstore *s, struct stats *st,
			 const char *key, uint32_t objsize, int *fd_out)
{
	size_t stored = (size_t)objsize + BLOCK_TRAILER;
	struct stream w = { .fd = -1 };
	char tmp[PATH_MAX];
	struct stat sb;
	ssize_t n;

	if (dirs_make_parents_at(c->dirfd, key, 0700) < 0)
		return -EIO;
	snprintf(tmp, sizeof(tmp), "%s.tmp.%d.%llu", key, (int)getpid(),
		 (unsigned long long)atomic_fetch_add(&c->tmp_seq, 1));
	w.buf = malloc(STREAM_BUF);
	if (!w.buf)
		return -ENOMEM;
	populate(w.buf, STREAM_BUF);
	w.fd = openat(c->dirfd, tmp, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (w.fd < 0) {
		n = -errno;
		goto fail;
	}
	block_check_init(&w.k, objsize);
	/* One byte more than the object should hold: a longer object is as
	 * damaged as a shorter one. */
	n = objstore_get_to(s, key, 0, stored + 1, stream_put, &w);
	atomic_fetch_add(&st->objects_get, 1);
	if (n >= 0) {
		int rc;

		atomic_fetch_add(&st->bytes_downloaded, (uint64_t)n);
		/* A retried GET may have written past where the last one ended. */
		if (block_check_end(&w.k) < 0 || (size_t)n != stored)
			n = -EBADMSG;
		else if ((rc = stream_flush(&w)) < 0)
			n = rc;
		else if (ftruncate(w.fd, (off_t)stored) < 0 || fstat(w.fd, &sb) < 0)
			n = -errno;
	}
	if (n < 0)
		goto fail;
	free(w.buf);
	*fd_out = w.fd;
	/* The object goes to disk now, in one write-back of the whole file
	 * started here (not waited for), rather than piece by piece when
	 * READs drop the pages they spliced (POSIX_FADV_DONTNEED writes a
	 * dirty range back first, on the READ's thread). No fsync: after a
	 * crash its trailer is checked before it is used. */
	(void)sync_file_range(w.fd, 0, 0, SYNC_FILE_RANGE_WRITE);
	file_install(c, tmp, key, objsize, sb.st_ino, true);
	return 0;
fail:
	if (w.fd >= 0) {
		close(w.fd);
		unlinkat(c->dirfd, tmp, 0);
	}
	free(w.buf);
	return (int)n;
}

/* Reads len bytes at off of a verified object file. */
static ssize_t pread_whole(int fd, void *buf, uint32_t len, uint32_t off)
{
	uint32_t got = 0;

	while (got < len) {
		ssize_t n = pread(fd, (char *)buf + got, len - got, (off_t)off + got);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return n < 0 ? -errno : -EIO;
		got += (uint32_t)n;
	}
	return len;
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

#define WILLNEED_STEP (128u << 10)

bool read_cache_willneed(struct read_cache *c, struct stats *st, const char *key,
			 uint32_t objsize)
{
	int fd = c ? cache_open(c, st, key, objsize, false) : -ENOENT;

	if (fd < 0)
		return false;
	/* Starts the reads and returns: the pages arrive while the reader
	 * is still on the objects before this one. In steps: one WILLNEED
	 * reads at most the larger of the file's read-ahead window and the
	 * device's optimal I/O size (mm/readahead.c), 2.5 MiB of a 4 MiB
	 * object here, and the READs then read the rest themselves, one
	 * splice after another. 128 KiB is the kernel's default window. */
	for (uint32_t at = 0; at < objsize; at += WILLNEED_STEP)
		(void)posix_fadvise(fd, at, objsize - at < WILLNEED_STEP ? objsize - at : WILLNEED_STEP,
				    POSIX_FADV_WILLNEED);
	close(fd);
	return true;
}

void read_cache_dontneed(struct read_cache *c, const char *key, uint32_t objsize)
{
	struct cache_entry *e;
	int fd = -1;

	if (!c)
		return;
	/* Through the fd kept open only: not a use (the LRU order stays), and
	 * a file not verified yet is not read to verify it. */
	pthread_mutex_lock(&c->lock);
	e = index_find(c, key);
	if (e && e->size == objsize && e->verified && e->fd >= 0)
		fd = fcntl(e->fd, F_DUPFD_CLOEXEC, 0);
	pthread_mutex_unlock(&c->lock);
	if (fd < 0)
		return;
	(void)posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
	close(fd);
}

bool read_cache_has(struct read_cache *c, const char *key, uint32_t objsize)
{
	struct cache_entry *e;
	bool has;

	if (!c)
		return false;
	pthread_mutex_lock(&c->lock);
	e = index_find(c, key);
	has = e && e->size == objsize;
	pthread_mutex_unlock(&c->lock);
	return has;
}

int read_cache_prefetch(struct read_cache *c, struct objstore *s, struct stats *st,
			const char *key, uint32_t objsize)
{
	struct fetch *f = NULL;
	bool gave_up = false;
	int fd = -1, rc;

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
	rc = object_stream(c, s, st, key, objsize, &fd);
	if (rc == 0 && f)
		fetch_publish_fd(c, f, fd);
	if (fd >= 0)
		close(fd);
	fetch_end(c, f, NULL);
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
			/* f->obj and f->fd are only written before done,
			 * under the lock this thread has taken since. */
			if (f->done && f->obj) {
				memcpy(buf, f->obj + off, len);
				n = len;
			} else if (f->done && f->fd >= 0) {
				n = pread_whole(f->fd, buf, len, off);
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
	if (c && c->limit >= (uint64_t)objsize + BLOCK_TRAILER) {
		/* Streamed into the cache file; the waiters and this read
		 * take their bytes from it. */
		int fd = -1;

		n = object_stream(c, s, st, key, objsize, &fd);
		if (n == 0 && f)
			fetch_publish_fd(c, f, fd);
		if (n == 0)
			n = pread_whole(fd, buf, len, off);
		if (fd >= 0)
			close(fd);
		goto out;
	}
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
