/*
 * The committed layout of the inodes the kernel holds: a file's size and,
 * chunk by chunk, the extents its slices resolve to, as last read from the
 * metadata database. A READ of a known layout costs no database round trip.
 *
 * Every change to an inode's committed data calls layout_forget() once the
 * change is in the database: commits by this daemon (write_back.c), by the
 * reconciler (its reply, reconcile_client.c), truncates and punched holes
 * (fuse_ops.c). A reader that went to the database before that finds the
 * generation moved on and does not keep what it read, so an old layout is
 * never cached after the change.
 *
 * The reconciler commits the jobs it recovers from an earlier run without
 * telling anyone which inodes they touch: until it has finished those
 * (md->layout_ready, set by reconcile_client.c) nothing is cached.
 *
 * Memory: at most LAYOUT_CHUNKS_MAX chunks and LAYOUT_EXTENTS_MAX extents
 * per chunk are kept for an inode, and md->layout_bytes in all, bounded by
 * LAYOUT_BYTES_MAX; past that a layout is read from the database each time.
 *
 * struct layout is owned by its struct inode (inode->layout, guarded by
 * inode->layout_lock); a chunk's extents are owned by the layout.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "mountd.h"
#include "slice.h"

#define LAYOUT_CHUNKS_MAX 4096u     /* 256 GiB of a file */
#define LAYOUT_EXTENTS_MAX 4096u
#define LAYOUT_BYTES_MAX (64ull << 20)

struct layout_chunk {
	size_t n;
	struct slice_extent x[]; /* tiles the whole chunk, in position order */
};

struct layout {
	bool size_known;
	uint64_t size;
	uint32_t nchunks;              /* chunks[] has room for this many */
	struct layout_chunk **chunks;  /* by chunk index; NULL: not known */
	uint64_t bytes;                /* what this layout counts in md->layout_bytes */
};

static void layout_drop_locked(struct mountd *md, struct inode *i)
{
	struct layout *l = i->layout;

	i->layout = NULL;
	if (!l)
		return;
	for (uint32_t k = 0; k < l->nchunks; k++)
		free(l->chunks[k]);
	free(l->chunks);
	if (md)
		atomic_fetch_sub(&md->layout_bytes, l->bytes);
	free(l);
}

void layout_forget(struct mountd *md, struct inode *i)
{
	pthread_mutex_lock(&i->layout_lock);
	i->layout_gen++;
	layout_drop_locked(md, i);
	pthread_mutex_unlock(&i->layout_lock);
}

void layout_free(struct mountd *md, struct inode *i)
{
	layout_drop_locked(md, i);
}

/* The inode's layout, made if there is none and caching is allowed; NULL
 * otherwise. Holds layout_lock. */
static struct layout *layout_get_locked(struct mountd *md, struct inode *i)
{
	if (!i->layout && atomic_load(&md->layout_ready) &&
	    atomic_load(&md->layout_bytes) < LAYOUT_BYTES_MAX) {
		i->layout = calloc(1, sizeof(*i->layout));
		if (i->layout) {
			i->layout->bytes = sizeof(*i->layout);
			atomic_fetch_add(&md->layout_bytes, i->layout->bytes);
		}
	}
	return i->layout;
}

int layout_size(struct mountd *md, struct inode *i, uint64_t *size)
{
	struct meta_attr a;
	uint64_t gen;
	int rc;

	pthread_mutex_lock(&i->layout_lock);
	if (i->layout && i->layout->size_known) {
		*size = i->layout->size;
		pthread_mutex_unlock(&i->layout_lock);
		atomic_fetch_add(&md->stats.layout_hits, 1);
		return 0;
	}
	gen = i->layout_gen;
	pthread_mutex_unlock(&i->layout_lock);
	atomic_fetch_add(&md->stats.layout_misses, 1);
	rc = meta_getattr(md->meta, i->ino, &a);
	if (rc < 0)
		return rc;
	*size = a.size;
	pthread_mutex_lock(&i->layout_lock);
	struct layout *l = i->layout_gen == gen ? layout_get_locked(md, i) : NULL;
	if (l) {
		l->size = a.size;
		l->size_known = true;
	}
	pthread_mutex_unlock(&i->layout_lock);
	return 0;
}

/* The extents of all[0..nall) (a whole chunk's) that overlap [pos,
 * pos+len), cut to it, into *out (malloc'ed, the caller's). */
static int extents_cut(const struct slice_extent *all, size_t nall, uint32_t pos, uint32_t len,
		       struct slice_extent **out, size_t *nout)
{
	uint64_t end = (uint64_t)pos + len;
	size_t lo = 0, hi = nall, n = 0;
	struct slice_extent *xs;

	*out = NULL;
	*nout = 0;
	if (len == 0)
		return 0;
	/* The first extent that ends past pos. */
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if ((uint64_t)all[mid].pos + all[mid].len <= pos)
			lo = mid + 1;
		else
			hi = mid;
	}
	for (size_t k = lo; k < nall && all[k].pos < end; k++)
		n++;
	if (n == 0)
		return 0;
	xs = malloc(n * sizeof(*xs));
	if (!xs)
		return -ENOMEM;
	for (size_t k = 0; k < n; k++) {
		struct slice_extent x = all[lo + k];
		uint32_t from = x.pos > pos ? x.pos : pos;
		uint64_t to = (uint64_t)x.pos + x.len < end ? (uint64_t)x.pos + x.len : end;

		if (x.id != 0)
			x.slice_off += from - x.pos;
		x.len = (uint32_t)(to - from);
		x.pos = from;
		xs[k] = x;
	}
	*out = xs;
	*nout = n;
	return 0;
}

/* Keeps the resolved extents of a whole chunk in i's layout, unless the
 * layout changed since gen or the limits say no. Holds layout_lock. */
static void chunk_keep_locked(struct mountd *md, struct inode *i, uint64_t gen, uint32_t chunk,
			      const struct slice_extent *xs, size_t nx)
{
	struct layout *l;
	struct layout_chunk *c;
	size_t bytes = sizeof(*c) + nx * sizeof(*xs);

	if (i->layout_gen != gen || chunk >= LAYOUT_CHUNKS_MAX || nx > LAYOUT_EXTENTS_MAX ||
	    !(l = layout_get_locked(md, i)) ||
	    atomic_load(&md->layout_bytes) + bytes > LAYOUT_BYTES_MAX)
		return;
	if (chunk >= l->nchunks) {
		uint32_t n = l->nchunks ? l->nchunks : 4;
		struct layout_chunk **grown;

		while (n <= chunk)
			n *= 2;
		if (n > LAYOUT_CHUNKS_MAX)
			n = LAYOUT_CHUNKS_MAX;
		grown = realloc(l->chunks, n * sizeof(*grown));
		if (!grown)
			return;
		memset(grown + l->nchunks, 0, (n - l->nchunks) * sizeof(*grown));
		l->bytes += (uint64_t)(n - l->nchunks) * sizeof(*grown);
		atomic_fetch_add(&md->layout_bytes, (uint64_t)(n - l->nchunks) * sizeof(*grown));
		l->chunks = grown;
		l->nchunks = n;
	}
	if (l->chunks[chunk])
		return; /* another reader kept it first */
	c = malloc(bytes);
	if (!c)
		return;
	c->n = nx;
	if (nx)
		memcpy(c->x, xs, nx * sizeof(*xs));
	l->chunks[chunk] = c;
	l->bytes += bytes;
	atomic_fetch_add(&md->layout_bytes, bytes);
}

int layout_extents(struct mountd *md, struct inode *i, uint32_t chunk, uint32_t pos,
		   uint32_t len, struct slice_extent **out, size_t *nout)
{
	struct meta_slice *sl = NULL;
	struct slice_extent *all = NULL;
	size_t nsl = 0, nall = 0;
	uint64_t gen;
	int rc;

	pthread_mutex_lock(&i->layout_lock);
	if (i->layout && chunk < i->layout->nchunks && i->layout->chunks[chunk]) {
		const struct layout_chunk *c = i->layout->chunks[chunk];

		rc = extents_cut(c->x, c->n, pos, len, out, nout);
		pthread_mutex_unlock(&i->layout_lock);
		atomic_fetch_add(&md->stats.layout_hits, 1);
		return rc;
	}
	gen = i->layout_gen;
	pthread_mutex_unlock(&i->layout_lock);
	atomic_fetch_add(&md->stats.layout_misses, 1);
	rc = meta_chunk_slices(md->meta, i->ino, chunk, &sl, &nsl);
	if (rc == 0)
		rc = slice_resolve(sl, nsl, 0, META_CHUNK_SIZE, &all, &nall);
	free(sl);
	if (rc == 0) {
		rc = extents_cut(all, nall, pos, len, out, nout);
		pthread_mutex_lock(&i->layout_lock);
		chunk_keep_locked(md, i, gen, chunk, all, nall);
		pthread_mutex_unlock(&i->layout_lock);
	}
	free(all);
	return rc;
}
