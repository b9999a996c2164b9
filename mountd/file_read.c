/*
 * Reads: a byte range of a file is resolved chunk by chunk into the visible
 * extents of its slices (layout_walk); each extent is read object by object
 * (extent_objects) through the read cache. Holes and zero slices read as
 * zeros. Any object that is missing or damaged fails the read with EIO: a
 * wrong byte is never returned.
 *
 * Replies to READs of cached objects splice from the cache files
 * (file_read_reply); others are fetched and copied (file_read). Sequential
 * readers have the objects ahead of them fetched (file_readahead).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"
#include "mountd.h"
#include "slice.h"

/* One extent of the walk: at is its offset in the file. Returns 0 to go
 * on; anything else ends the walk and is what layout_walk returns. */
typedef int (*extent_fn)(struct mountd *md, uint64_t at, const struct slice_extent *x, void *arg);

/* Calls fn for the extents that tile [from, to) of i's committed layout,
 * in file order (holes as id 0). req (or NULL): a read whose caller is
 * being killed stops between chunks with -EINTR (caller.c). A chunk that
 * cannot be resolved is logged and fails the walk (-EIO for a layout that
 * names what is not there). */
static int layout_walk(struct mountd *md, fuse_req_t req, struct inode *i, uint64_t from,
		       uint64_t to, extent_fn fn, void *arg)
{
	int rc = 0;

	while (from < to && rc == 0) {
		uint32_t chunk = (uint32_t)(from / META_CHUNK_SIZE);
		uint32_t cpos = (uint32_t)(from % META_CHUNK_SIZE);
		uint64_t base = (uint64_t)chunk * META_CHUNK_SIZE;
		uint64_t cend = base + META_CHUNK_SIZE;
		uint32_t clen = (uint32_t)((to < cend ? to : cend) - from);
		struct slice_extent *xs = NULL;
		size_t nx = 0;

		if (req && fuse_req_interrupted(req) && caller_dying(req))
			return -EINTR; /* nobody will read the reply */
		rc = layout_extents(md, i, chunk, cpos, clen, &xs, &nx);
		if (rc < 0) {
			log_errno(rc, "inode %llu: cannot resolve chunk %u", (unsigned long long)i->ino,
				  chunk);
			free(xs);
			return rc == -ENOENT ? -EIO : rc;
		}
		for (size_t k = 0; k < nx && rc == 0; k++)
			rc = fn(md, base + xs[k].pos, &xs[k], arg);
		free(xs);
		from += clen;
	}
	return rc;
}

/* One object's part of a data extent: its key and size, where the part
 * starts in the object (in), its length (n), and how far into the extent
 * it lies (done). Returns 0 to go on, else ends the extent. */
typedef int (*object_fn)(const char *key, uint32_t osize, uint32_t in, uint32_t n, uint32_t done,
			 void *arg);

static int extent_objects(struct mountd *md, const struct slice_extent *x, object_fn fn,
			  void *arg)
{
	uint32_t bs = md->vol.block_size;
	uint32_t done = 0;
	int rc = 0;

	while (done < x->len && rc == 0) {
		uint32_t at = x->slice_off + done;
		uint32_t idx = at / bs, in = at % bs;
		uint32_t osize = slice_object_size(idx, x->slice_size, bs);
		uint32_t n = osize - in;
		char key[SLICE_KEY_MAX];

		if (n > x->len - done)
			n = x->len - done;
		slice_object_key(x->id, idx, x->slice_size, bs, key, sizeof(key));
		rc = fn(key, osize, in, n, done, arg);
		done += n;
	}
	return rc;
}

/* ---- file_read: into a buffer, fetching what is not cached ---- */

struct copy_arg {
	struct mountd *md;
	uint64_t ino, off;  /* off: the read's start in the file */
	char *out;          /* the read's buffer */
	char *dst;          /* where the current extent's bytes go */
};

static int copy_object(const char *key, uint32_t osize, uint32_t in, uint32_t n, uint32_t done,
		       void *arg)
{
	struct copy_arg *a = arg;
	struct mountd *md = a->md;
	ssize_t rc = read_cache_read(md->cache, md->store, &md->stats, key, osize, in,
				     a->dst + done, n);

	if (rc == -EINTR)
		return -EINTR; /* its caller is gone: not a store failure */
	if (rc >= 0)
		return 0;
	atomic_fetch_add(&md->stats.io_errors, 1);
	if (rc == -ENOENT)
		log_warnx("inode %llu: object %s is missing from the store",
			  (unsigned long long)a->ino, key);
	else if (rc == -EBADMSG)
		log_warnx("inode %llu: object %s is damaged (length or checksum)",
			  (unsigned long long)a->ino, key);
	else
		log_errno((int)rc, "inode %llu: cannot read object %s%s%s", (unsigned long long)a->ino,
			  key, *objstore_last_error() ? ": " : "", objstore_last_error());
	return rc == -ENOMEM ? -ENOMEM : -EIO;
}

static int copy_extent(struct mountd *md, uint64_t at, const struct slice_extent *x, void *arg)
{
	struct copy_arg *a = arg;

	a->dst = a->out + (at - a->off);
	if (x->id == 0) {
		memset(a->dst, 0, x->len);
		return 0;
	}
	return extent_objects(md, x, copy_object, a);
}

static bool read_given_up(void *arg)
{
	return caller_watch(arg);
}

ssize_t file_read(struct mountd *md, fuse_req_t req, struct inode *i, uint64_t size, void *buf,
		  size_t len, off_t off)
{
	struct caller_watch w = { .req = req };
	struct copy_arg a = { .md = md, .ino = i->ino, .off = (uint64_t)off, .out = buf };
	uint64_t end;
	int rc;

	if ((uint64_t)off >= size)
		return 0;
	end = (uint64_t)off + len < size ? (uint64_t)off + len : size;
	/* A fetch from the store this read waits for may stop early if its
	 * caller is being killed (caller.c). Without a request the thread's
	 * own hook stays (copy_build.c stops with the mount). */
	if (req)
		objstore_set_cancel(read_given_up, &w);
	rc = layout_walk(md, req, i, (uint64_t)off, end, copy_extent, &a);
	if (req)
		objstore_set_cancel(NULL, NULL);
	if (rc < 0)
		return rc;
	atomic_fetch_add(&md->stats.bytes_read, end - (uint64_t)off);
	return (ssize_t)(end - (uint64_t)off);
}

/* ---- file_read_reply: spliced from the cache files ---- */

/* Holes in a spliced reply come from here: read-only, shared by every
 * thread. */
static const char zeros[128 << 10];

/* The pieces of one spliced reply: the bufvec libfuse sends and the
 * cache-file fds it reads (owned: closed by reply_pieces_free). */
struct reply_pieces {
	struct mountd *md;
	struct fuse_bufvec *bv; /* owned; bv->count pieces */
	size_t cap;
};

static int reply_piece_add(struct reply_pieces *p, struct fuse_buf b)
{
	if (p->bv == NULL || p->bv->count == p->cap) {
		size_t cap = p->cap ? p->cap * 2 : 8;
		struct fuse_bufvec *n = realloc(p->bv, sizeof(*n) + cap * sizeof(n->buf[0]));

		if (n == NULL)
			return -ENOMEM;
		if (p->bv == NULL)
			*n = (struct fuse_bufvec){ .count = 0 };
		p->bv = n;
		p->cap = cap;
	}
	p->bv->buf[p->bv->count++] = b;
	return 0;
}

/* After the reply, the cache files' pages that went into it are dropped:
 * the kernel holds the bytes in the FUSE file's own page cache now, and
 * keeping both would hold every cached block twice in memory. Pages the
 * splice moved rather than copied are gone from the cache file already. */
static void reply_pieces_free(struct reply_pieces *p, bool replied)
{
	for (size_t i = 0; p->bv && i < p->bv->count; i++) {
		struct fuse_buf *b = &p->bv->buf[i];

		if (!(b->flags & FUSE_BUF_IS_FD))
			continue;
		if (replied)
			(void)posix_fadvise(b->fd, b->pos, (off_t)b->size, POSIX_FADV_DONTNEED);
		close(b->fd);
	}
	free(p->bv);
}

/* -EAGAIN when the object is not in the read cache. */
static int reply_object(const char *key, uint32_t osize, uint32_t in, uint32_t n, uint32_t done,
			void *arg)
{
	struct reply_pieces *p = arg;
	int fd, rc;

	(void)done;
	fd = read_cache_fd(p->md->cache, &p->md->stats, key, osize);
	if (fd < 0)
		return -EAGAIN;
	rc = reply_piece_add(p, (struct fuse_buf){ .size = n, .fd = fd, .pos = in,
				    .flags = FUSE_BUF_IS_FD | FUSE_BUF_FD_SEEK });
	if (rc)
		close(fd);
	return rc;
}

/* Extents tile the range in file order: the pieces follow one another as
 * the reply's bytes do. */
static int reply_extent(struct mountd *md, uint64_t at, const struct slice_extent *x, void *arg)
{
	struct reply_pieces *p = arg;
	uint32_t len = x->len;

	(void)at;
	if (x->id != 0)
		return extent_objects(md, x, reply_object, p);
	while (len > 0) {
		uint32_t n = len < sizeof(zeros) ? len : (uint32_t)sizeof(zeros);
		int rc = reply_piece_add(p, (struct fuse_buf){ .size = n, .mem = (void *)zeros });

		if (rc)
			return rc;
		len -= n;
	}
	return 0;
}

ssize_t file_read_reply(struct mountd *md, fuse_req_t req, struct inode *i, uint64_t size,
			size_t len, off_t off)
{
	struct reply_pieces p = { .md = md };
	uint64_t end;
	ssize_t rc;

	if (md->cache == NULL || off < 0)
		return -EAGAIN;
	end = (uint64_t)off >= size ? (uint64_t)off :
	      ((uint64_t)off + len < size ? (uint64_t)off + len : size);
	rc = layout_walk(md, NULL, i, (uint64_t)off, end, reply_extent, &p);
	if (rc == 0) {
		struct fuse_bufvec none = FUSE_BUFVEC_INIT(0);

		/* The request is answered whatever this returns (libfuse
		 * replies with the error it met, or drops a reply the kernel
		 * no longer wants). */
		(void)fuse_reply_data(req, p.bv ? p.bv : &none, FUSE_BUF_SPLICE_MOVE);
		rc = (ssize_t)(end - (uint64_t)off);
		atomic_fetch_add(&md->stats.bytes_read, (uint64_t)rc);
		atomic_fetch_add(&md->stats.spliced_reads, 1);
	}
	reply_pieces_free(&p, rc >= 0);
	return rc;
}

/* ---- file_readahead: objects ahead of a sequential reader ---- */

/* How much a run must have read before it counts as sequential. By bytes,
 * not READs: a random reader's small READs land within RA_SLACK of each
 * other often enough in a large file (two in a row did, and each such pair
 * read a whole window ahead for nothing: 136 MiB of disk reads in a 5 s
 * 4 KiB random-read job), but not 64 times in a row. */
#define RA_MIN_RUN (256u << 10)

static int prefetch_piece(const char *key, uint32_t osize, uint32_t in, uint32_t n,
			  uint32_t done, void *arg)
{
	(void)in;
	(void)n;
	(void)done;
	prefetch_object(arg, key, osize); /* an object two extents share: queued once */
	return 0;
}

static int prefetch_extent(struct mountd *md, uint64_t at, const struct slice_extent *x,
			   void *arg)
{
	(void)at;
	(void)arg;
	return x->id == 0 ? 0 : extent_objects(md, x, prefetch_piece, md->prefetch);
}

void file_readahead(struct mountd *md, struct readahead *ra, struct inode *i, uint64_t size,
		    uint64_t off, size_t len)
{
	uint64_t next = atomic_exchange(&ra->next, off + len);
	uint64_t window = md->readahead_window, from, to;

	if (!md->prefetch || window == 0)
		return;
	if (off + RA_SLACK < next || off > next + RA_SLACK) {
		/* A jump: a random reader fetches only what it reads. */
		atomic_store(&ra->run, 0);
		atomic_store(&ra->end, 0);
		return;
	}
	/* Not a pattern yet: the first READ of a run never counts, however
	 * large (it would have its own object fetched by a read-ahead thread
	 * before it starts, and a fetch it merely waits for is not given up
	 * when its caller is killed). */
	uint64_t before = atomic_fetch_add(&ra->run, len);
	if (before == 0 || before + len < RA_MIN_RUN)
		return;
	from = atomic_load(&ra->end);
	if (from < off + len)
		from = off + len;
	to = off + len + window < size ? off + len + window : size;
	/* Queue in batches: once half the window is used up. */
	if (from >= to || from > off + len + window / 2)
		return;
	atomic_store(&ra->end, to);
	/* A layout that cannot be resolved: the reads themselves say so. */
	(void)layout_walk(md, NULL, i, from, to, prefetch_extent, NULL);
}

/* ---- file_cached: whether every object of a file is in the read cache ---- */

static int cached_piece(const char *key, uint32_t osize, uint32_t in, uint32_t n, uint32_t done,
			void *arg)
{
	struct mountd *md = arg;

	(void)in;
	(void)n;
	(void)done;
	return read_cache_has(md->cache, key, osize) ? 0 : -ENOENT;
}

static int cached_extent(struct mountd *md, uint64_t at, const struct slice_extent *x, void *arg)
{
	(void)at;
	(void)arg;
	return x->id == 0 ? 0 : extent_objects(md, x, cached_piece, md);
}

bool file_cached(struct mountd *md, struct inode *i, uint64_t size)
{
	return layout_walk(md, NULL, i, 0, size, cached_extent, NULL) == 0;
}

static int dontneed_piece(const char *key, uint32_t osize, uint32_t in, uint32_t n,
			  uint32_t done, void *arg)
{
	struct mountd *md = arg;

	(void)in;
	(void)n;
	(void)done;
	read_cache_dontneed(md->cache, key, osize);
	return 0;
}

static int dontneed_extent(struct mountd *md, uint64_t at, const struct slice_extent *x,
			   void *arg)
{
	(void)at;
	(void)arg;
	return x->id == 0 ? 0 : extent_objects(md, x, dontneed_piece, md);
}

void file_cache_dontneed(struct mountd *md, struct inode *i, uint64_t size)
{
	(void)layout_walk(md, NULL, i, 0, size, dontneed_extent, NULL);
}

/* ---- file_seek_data ---- */

struct seek_arg {
	uint64_t pos;
	bool data;        /* SEEK_DATA: looking for data, else for a hole */
	uint64_t found;
};

static int seek_extent(struct mountd *md, uint64_t at, const struct slice_extent *x, void *arg)
{
	struct seek_arg *a = arg;

	(void)md;
	if ((x->id != 0) != a->data)
		return 0;
	a->found = at > a->pos ? at : a->pos;
	return 1;
}

off_t file_seek_data(struct mountd *md, struct inode *i, uint64_t size, off_t off, int whence)
{
	struct seek_arg a = { .pos = (uint64_t)off, .data = whence == SEEK_DATA };
	int rc;

	if (off < 0)
		return -EINVAL;
	if ((uint64_t)off >= size)
		return -ENXIO;
	rc = layout_walk(md, NULL, i, (uint64_t)off, size, seek_extent, &a);
	if (rc < 0)
		return rc;
	if (rc == 1)
		return (off_t)a.found;
	/* Past the last data there is only the implicit hole at the end. */
	return whence == SEEK_HOLE ? (off_t)size : -ENXIO;
}
