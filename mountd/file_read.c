/*
 * Reads: a byte range of a file is resolved chunk by chunk into the visible
 * extents of its slices; each extent is read object by object through the
 * read cache. Holes and zero slices read as zeros. Any object that is missing
 * or damaged fails the read with EIO: a wrong byte is never returned.
 */
#include <errno.h>
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
