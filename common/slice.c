/*
 * slice: object keys of a slice and the visible extents of a chunk.
 *
 * slice_resolve() walks the slices newest first and keeps a sorted array of
 * the parts of the range no newer slice has covered yet (the gaps). Each
 * slice claims the parts of the gaps it overlaps; what is left at the end is
 * a hole. Work is O(n * gaps) in the worst case and stops early once the
 * range is fully covered, which is the common case for a chunk written
 * front to back.
 */
#include "slice.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

uint32_t slice_object_size(uint32_t index, uint32_t size, uint32_t block_size)
{
	uint64_t start = (uint64_t)index * block_size;

	if (block_size == 0 || start >= size)
		return 0;
	return size - start < block_size ? (uint32_t)(size - start) : block_size;
}

void slice_object_key(uint64_t id, uint32_t index, uint32_t size, uint32_t block_size,
		      char *buf, size_t buflen)
{
	if (buf == NULL || buflen == 0)
		return;
	snprintf(buf, buflen, "chunks/%llu/%llu/%llu_%u_%u", (unsigned long long)(id / 1000000),
		 (unsigned long long)(id / 1000), (unsigned long long)id, index,
		 slice_object_size(index, size, block_size));
}

struct gap {
	uint32_t start, end; /* [start, end), never empty */
};

struct vec {
	void *v;
	size_t n, cap, elem;
};

static int vec_reserve(struct vec *a, size_t more)
{
	size_t cap;
	void *p;

	if (a->n + more <= a->cap)
		return 0;
	cap = a->cap ? a->cap : 16;
	while (cap < a->n + more) {
		if (cap > SIZE_MAX / 2 / a->elem)
			return -ENOMEM;
		cap *= 2;
	}
	p = realloc(a->v, cap * a->elem);
	if (p == NULL)
		return -ENOMEM;
	a->v = p;
	a->cap = cap;
	return 0;
}

static int slice_usable(const struct meta_slice *sl)
{
	if (sl->len == 0 || sl->pos >= META_CHUNK_SIZE || sl->len > META_CHUNK_SIZE - sl->pos)
		return 0;
	if (sl->id != 0 && (sl->off > sl->size || sl->len > sl->size - sl->off))
		return 0;
	return 1;
}

/* First gap whose end is past x (gaps sorted and disjoint). */
static size_t gap_search(const struct gap *g, size_t n, uint32_t x)
{
	size_t lo = 0, hi = n;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (g[mid].end <= x)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

static int extent_cmp(const void *a, const void *b)
{
	const struct slice_extent *x = a, *y = b;

	return (x->pos > y->pos) - (x->pos < y->pos);
}

static int extent_push(struct vec *ex, uint32_t pos, uint32_t len, uint64_t id,
		       uint32_t slice_off, uint32_t slice_size)
{
	struct slice_extent *e;
	int rc = vec_reserve(ex, 1);

	if (rc)
		return rc;
	e = (struct slice_extent *)ex->v + ex->n++;
	e->pos = pos;
	e->len = len;
	e->id = id;
	e->slice_off = id ? slice_off : 0;
	e->slice_size = id ? slice_size : 0;
	return 0;
}

/* Claims the part of gaps overlapping [a, b) for slice sl. */
static int claim(struct vec *gv, struct vec *ex, const struct meta_slice *sl)
{
	uint32_t a = sl->pos, b = sl->pos + sl->len;
	struct gap *g = gv->v;
	size_t i = gap_search(g, gv->n, a);
	int rc;

	while (i < gv->n && g[i].start < b) {
		uint32_t s = g[i].start > a ? g[i].start : a;
		uint32_t e = g[i].end < b ? g[i].end : b;

		rc = extent_push(ex, s, e - s, sl->id, sl->off + (s - a), sl->size);
		if (rc)
			return rc;
		if (s > g[i].start && e < g[i].end) {
			/* The slice sits inside the gap: split it in two. */
			rc = vec_reserve(gv, 1);
			if (rc)
				return rc;
			g = gv->v;
			memmove(&g[i + 2], &g[i + 1], (gv->n - i - 1) * sizeof(*g));
			gv->n++;
			g[i + 1].start = e;
			g[i + 1].end = g[i].end;
			g[i].end = s;
			return 0;
		}
		if (s > g[i].start) {
			g[i].end = s; /* keeps the left part */
			i++;
		} else if (e < g[i].end) {
			g[i].start = e; /* keeps the right part */
			i++;
		} else {
			memmove(&g[i], &g[i + 1], (gv->n - i - 1) * sizeof(*g));
			gv->n--;
		}
	}
	return 0;
}

int slice_resolve(const struct meta_slice *s, size_t n, uint32_t pos, uint32_t len,
		  struct slice_extent **out, size_t *nout)
{
	struct vec gv = { .elem = sizeof(struct gap) };
	struct vec ex = { .elem = sizeof(struct slice_extent) };
	struct slice_extent *e;
	size_t i, w;
	int rc;

	if (out == NULL || nout == NULL)
		return -EINVAL;
	*out = NULL;
	*nout = 0;
	if ((s == NULL && n > 0) || pos > META_CHUNK_SIZE || len > META_CHUNK_SIZE - pos)
		return -EINVAL;
	if (len == 0)
		return 0;

	rc = vec_reserve(&gv, 1);
	if (rc)
		goto out;
	((struct gap *)gv.v)[0] = (struct gap){ pos, pos + len };
	gv.n = 1;

	for (i = n; i-- > 0 && gv.n > 0;) {
		if (!slice_usable(&s[i]))
			continue;
		rc = claim(&gv, &ex, &s[i]);
		if (rc)
			goto out;
	}
	for (i = 0; i < gv.n; i++) {
		const struct gap *g = (const struct gap *)gv.v + i;

		rc = extent_push(&ex, g->start, g->end - g->start, 0, 0, 0);
		if (rc)
			goto out;
	}

	e = ex.v;
	qsort(e, ex.n, sizeof(*e), extent_cmp);
	/* Merge neighbours that continue each other (zeros with zeros, or the
	 * same slice at consecutive offsets). */
	for (w = 0, i = 0; i < ex.n; i++) {
		if (w > 0) {
			struct slice_extent *p = &e[w - 1];

			if (p->id == e[i].id && p->pos + p->len == e[i].pos &&
			    (p->id == 0 || (p->slice_size == e[i].slice_size &&
					    p->slice_off + p->len == e[i].slice_off))) {
				p->len += e[i].len;
				continue;
			}
		}
		e[w++] = e[i];
	}
	*out = e;
	*nout = w;
	ex.v = NULL;
	rc = 0;
out:
	free(gv.v);
	free(ex.v);
	return rc;
}
