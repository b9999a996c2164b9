/*
 * Reads: a byte range of a file is resolved chunk by chunk into the visible
 * extents of its slices; each extent is read object by object through the
 * read cache. Holes and zero slices read as zeros. Any object that is missing
 * or damaged fails the read with EIO: a wrong byte is never returned.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"
#include "mountd.h"
#include "slice.h"

static ssize_t read_extent(struct mountd *md, uint64_t ino, const struct slice_extent *x,
			   char *dst)
{
	uint32_t bs = md->vol.block_size;
	uint32_t done = 0;

	while (done < x->len) {
		uint32_t at = x->slice_off + done;
		uint32_t idx = at / bs, in = at % bs;
		uint32_t osize = slice_object_size(idx, x->slice_size, bs);
		uint32_t n = osize - in;
		char key[SLICE_KEY_MAX];
		ssize_t rc;

		if (n > x->len - done)
			n = x->len - done;
		slice_object_key(x->id, idx, x->slice_size, bs, key, sizeof(key));
		rc = read_cache_read(md->cache, md->store, &md->stats, key, osize, in, dst + done, n);
		if (rc == -EINTR)
			return rc; /* its caller is gone: not a store failure */
		if (rc < 0) {
			atomic_fetch_add(&md->stats.io_errors, 1);
			if (rc == -ENOENT)
				log_warnx("inode %llu: object %s is missing from the store",
					  (unsigned long long)ino, key);
			else if (rc == -EBADMSG)
				log_warnx("inode %llu: object %s is damaged (length or checksum)",
					  (unsigned long long)ino, key);
			else
				log_errno((int)rc, "inode %llu: cannot read object %s%s%s",
					  (unsigned long long)ino, key,
					  *objstore_last_error() ? ": " : "", objstore_last_error());
			return rc == -ENOMEM ? rc : -EIO;
		}
		done += n;
	}
	return done;
}

static ssize_t file_read_range(struct mountd *md, fuse_req_t req, uint64_t ino, uint64_t size,
			       void *buf, size_t len, off_t off)
{
	uint64_t pos = (uint64_t)off, end;
	char *out = buf;

	if (pos >= size)
		return 0;
	end = pos + len < size ? pos + len : size;
	while (pos < end) {
		uint32_t chunk = (uint32_t)(pos / META_CHUNK_SIZE);
		uint32_t cpos = (uint32_t)(pos % META_CHUNK_SIZE);
		uint64_t cend = (uint64_t)(chunk + 1) * META_CHUNK_SIZE;
		uint32_t clen = (uint32_t)((end < cend ? end : cend) - pos);
		struct meta_slice *sl = NULL;
		struct slice_extent *xs = NULL;
		size_t nsl = 0, nx = 0;
		int rc;

		if (req && fuse_req_interrupted(req) && caller_dying(req))
			return -EINTR; /* nobody will read the reply (caller.c) */
		rc = meta_chunk_slices(md->meta, ino, chunk, &sl, &nsl);
		if (rc == 0)
			rc = slice_resolve(sl, nsl, cpos, clen, &xs, &nx);
		free(sl);
		if (rc < 0) {
			log_errno(rc, "inode %llu: cannot resolve chunk %u", (unsigned long long)ino, chunk);
			free(xs);
			return rc == -ENOENT ? -EIO : rc;
		}
		for (size_t i = 0; i < nx; i++) {
			char *dst = out + (pos - (uint64_t)off) + (xs[i].pos - cpos);
			if (xs[i].id == 0) {
				memset(dst, 0, xs[i].len);
				continue;
			}
			ssize_t n = read_extent(md, ino, &xs[i], dst);
			if (n < 0) {
				free(xs);
				return n;
			}
		}
		free(xs);
		pos += clen;
	}
	atomic_fetch_add(&md->stats.bytes_read, end - (uint64_t)off);
	return (ssize_t)(end - (uint64_t)off);
}

/* Holes in a spliced reply come from here: read-only, shared by every
 * thread. */
static const char zeros[128 << 10];

/* The pieces of one spliced reply: the bufvec libfuse sends and the
 * cache-file fds it reads (owned: closed by reply_pieces_free). */
struct reply_pieces {
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

/* Adds the cache-file pieces of one data extent; -EAGAIN when an object is
 * not in the read cache. */
static int reply_extent(struct mountd *md, const struct slice_extent *x, struct reply_pieces *p)
{
	uint32_t bs = md->vol.block_size;
	uint32_t done = 0;

	while (done < x->len) {
		uint32_t at = x->slice_off + done;
		uint32_t idx = at / bs, in = at % bs;
		uint32_t osize = slice_object_size(idx, x->slice_size, bs);
		uint32_t n = osize - in;
		char key[SLICE_KEY_MAX];
		int fd, rc;

		if (n > x->len - done)
			n = x->len - done;
		slice_object_key(x->id, idx, x->slice_size, bs, key, sizeof(key));
		fd = read_cache_fd(md->cache, &md->stats, key, osize);
		if (fd < 0)
			return -EAGAIN;
		rc = reply_piece_add(p, (struct fuse_buf){ .size = n, .fd = fd, .pos = in,
				    .flags = FUSE_BUF_IS_FD | FUSE_BUF_FD_SEEK });
		if (rc) {
			close(fd);
			return rc;
		}
		done += n;
	}
	return 0;
}

static int reply_zeros(struct reply_pieces *p, uint32_t len)
{
	while (len > 0) {
		uint32_t n = len < sizeof(zeros) ? len : (uint32_t)sizeof(zeros);
		int rc = reply_piece_add(p, (struct fuse_buf){ .size = n, .mem = (void *)zeros });

		if (rc)
			return rc;
		len -= n;
	}
	return 0;
}

ssize_t file_read_reply(struct mountd *md, fuse_req_t req, uint64_t ino, uint64_t size,
			size_t len, off_t off)
{
	struct reply_pieces p = { 0 };
	uint64_t pos = (uint64_t)off, end;
	ssize_t rc = 0;

	if (md->cache == NULL || off < 0)
		return -EAGAIN;
	end = pos >= size ? pos : (pos + len < size ? pos + len : size);
	while (pos < end && rc == 0) {
		uint32_t chunk = (uint32_t)(pos / META_CHUNK_SIZE);
		uint32_t cpos = (uint32_t)(pos % META_CHUNK_SIZE);
		uint64_t cend = (uint64_t)(chunk + 1) * META_CHUNK_SIZE;
		uint32_t clen = (uint32_t)((end < cend ? end : cend) - pos);
		struct meta_slice *sl = NULL;
		struct slice_extent *xs = NULL;
		size_t nsl = 0, nx = 0;

		rc = meta_chunk_slices(md->meta, ino, chunk, &sl, &nsl);
		if (rc == 0)
			rc = slice_resolve(sl, nsl, cpos, clen, &xs, &nx);
		free(sl);
		/* Extents come in file order; the pieces follow one another as
		 * the reply's bytes do, any gap between extents read as zeros. */
		uint32_t at = cpos;
		for (size_t i = 0; i < nx && rc == 0; i++) {
			if (xs[i].pos > at)
				rc = reply_zeros(&p, xs[i].pos - at);
			if (rc == 0)
				rc = xs[i].id == 0 ? reply_zeros(&p, xs[i].len) :
						     reply_extent(md, &xs[i], &p);
			at = xs[i].pos + xs[i].len;
		}
		if (rc == 0 && at < cpos + clen)
			rc = reply_zeros(&p, cpos + clen - at);
		free(xs);
		pos += clen;
	}
	if (rc == -ENOENT)
		rc = -EIO; /* a chunk the layout names is gone: as file_read() */
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

/* How far a READ may land from where the last one ended and still count
 * as sequential: the kernel's readahead sends several READs at once, and
 * they arrive in any order. */
#define RA_SLACK (2u << 20)

void file_readahead(struct mountd *md, struct readahead *ra, uint64_t ino, uint64_t size,
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
	if (atomic_fetch_add(&ra->run, 1) < 1)
		return; /* one READ is not a pattern yet */
	from = atomic_load(&ra->end);
	if (from < off + len)
		from = off + len;
	to = off + len + window < size ? off + len + window : size;
	/* Queue in batches: once half the window is used up. */
	if (from >= to || from > off + len + window / 2)
		return;
	atomic_store(&ra->end, to);
	while (from < to) {
		uint32_t chunk = (uint32_t)(from / META_CHUNK_SIZE);
		uint32_t cpos = (uint32_t)(from % META_CHUNK_SIZE);
		uint64_t cend = (uint64_t)(chunk + 1) * META_CHUNK_SIZE;
		uint32_t clen = (uint32_t)((to < cend ? to : cend) - from);
		uint32_t bs = md->vol.block_size;
		struct meta_slice *sl = NULL;
		struct slice_extent *xs = NULL;
		size_t nsl = 0, nx = 0;
		int rc = meta_chunk_slices(md->meta, ino, chunk, &sl, &nsl);

		if (rc == 0)
			rc = slice_resolve(sl, nsl, cpos, clen, &xs, &nx);
		free(sl);
		for (size_t i = 0; rc == 0 && i < nx; i++) {
			if (xs[i].id == 0)
				continue;
			/* Each object the extent touches, once. */
			uint32_t first = xs[i].slice_off / bs;
			uint32_t last = (xs[i].slice_off + xs[i].len - 1) / bs;
			for (uint32_t idx = first; idx <= last; idx++) {
				uint32_t osize = slice_object_size(idx, xs[i].slice_size, bs);
				char key[SLICE_KEY_MAX];

				slice_object_key(xs[i].id, idx, xs[i].slice_size, bs, key, sizeof(key));
				prefetch_object(md->prefetch, key, osize);
			}
		}
		free(xs);
		if (rc)
			return; /* the reads themselves will say what is wrong */
		from += clen;
	}
}

static bool read_given_up(void *arg)
{
	return caller_watch(arg);
}

ssize_t file_read(struct mountd *md, fuse_req_t req, uint64_t ino, uint64_t size, void *buf,
		  size_t len, off_t off)
{
	struct caller_watch w = { .req = req };
	ssize_t n;

	/* A fetch from the store this read waits for may stop early if its
	 * caller is being killed (caller.c). */
	objstore_set_cancel(req ? read_given_up : NULL, &w);
	n = file_read_range(md, req, ino, size, buf, len, off);
	objstore_set_cancel(NULL, NULL);
	return n;
}

off_t file_seek_data(struct mountd *md, uint64_t ino, uint64_t size, off_t off, int whence)
{
	uint64_t pos = (uint64_t)off;

	if (off < 0)
		return -EINVAL;
	if (pos >= size)
		return -ENXIO;
	while (pos < size) {
		uint32_t chunk = (uint32_t)(pos / META_CHUNK_SIZE);
		uint32_t cpos = (uint32_t)(pos % META_CHUNK_SIZE);
		uint64_t cend = (uint64_t)(chunk + 1) * META_CHUNK_SIZE;
		uint32_t clen = (uint32_t)((size < cend ? size : cend) - pos);
		struct meta_slice *sl = NULL;
		struct slice_extent *xs = NULL;
		size_t nsl = 0, nx = 0;
		int rc = meta_chunk_slices(md->meta, ino, chunk, &sl, &nsl);

		if (rc == 0)
			rc = slice_resolve(sl, nsl, cpos, clen, &xs, &nx);
		free(sl);
		if (rc < 0) {
			free(xs);
			return rc;
		}
		for (size_t i = 0; i < nx; i++) {
			bool data = xs[i].id != 0;
			if ((whence == SEEK_DATA) == data) {
				uint64_t at = (uint64_t)chunk * META_CHUNK_SIZE + xs[i].pos;
				free(xs);
				return (off_t)(at > pos ? at : pos);
			}
		}
		free(xs);
		pos += clen;
	}
	/* Past the last data there is only the implicit hole at the end. */
	return whence == SEEK_HOLE ? (off_t)size : -ENXIO;
}
