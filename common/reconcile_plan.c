/*
 * reconcile_plan: dirty ranges -> slices -> objects (reconcile_plan.h).
 */
#include "reconcile_plan.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "slice.h"

void reconcile_plan_free(struct reconcile_plan *p)
{
	if (!p)
		return;
	free(p->slices);
	free(p->obj_base);
	memset(p, 0, sizeof(*p));
}

/* Appends the slices of [s, e) (e <= length) to p, one per chunk. */
static int add_range(struct reconcile_plan *p, size_t *cap, uint64_t s, uint64_t e)
{
	while (s < e) {
		uint64_t cend = (s / META_CHUNK_SIZE + 1) * (uint64_t)META_CHUNK_SIZE;
		uint64_t pe = e < cend ? e : cend;
		struct meta_chunk_slice *cs;
		uint32_t len = (uint32_t)(pe - s);

		if (p->nslices == *cap) {
			size_t nc = *cap ? *cap * 2 : 16;
			struct meta_chunk_slice *ns = realloc(p->slices, nc * sizeof(*ns));
			if (!ns)
				return -ENOMEM;
			p->slices = ns;
			*cap = nc;
		}
		cs = &p->slices[p->nslices++];
		memset(cs, 0, sizeof(*cs));
		cs->chunk = (uint32_t)(s / META_CHUNK_SIZE);
		cs->s.pos = (uint32_t)(s % META_CHUNK_SIZE);
		cs->s.len = len;
		cs->s.size = len;
		cs->s.off = 0;
		p->nobjects += (len + (uint64_t)p->block_size - 1) / p->block_size;
		if (p->nobjects > RECONCILE_OBJECTS_MAX)
			return -EFBIG;
		s = pe;
	}
	return 0;
}

int reconcile_plan_make(uint64_t length, const struct reconcile_range *r, size_t n,
			uint32_t block_size, struct reconcile_plan *out)
{
	struct reconcile_plan p = { .block_size = block_size };
	size_t cap = 0;
	int rc = 0;

	memset(out, 0, sizeof(*out));
	if (block_size == 0 || block_size > META_CHUNK_SIZE || (n && !r))
		return -EINVAL;
	if (length > RECONCILE_LENGTH_MAX)
		return -EFBIG;
	if (n == 0) {
		rc = add_range(&p, &cap, 0, length);
	} else {
		for (size_t i = 0; i < n && rc == 0; i++) {
			uint64_t s = r[i].start, e = r[i].end < length ? r[i].end : length;
			if (s < e)
				rc = add_range(&p, &cap, s, e);
		}
	}
	if (rc == 0) {
		p.obj_base = malloc((p.nslices + 1) * sizeof(*p.obj_base));
		if (!p.obj_base)
			rc = -ENOMEM;
	}
	if (rc < 0) {
		reconcile_plan_free(&p);
		return rc;
	}
	p.obj_base[0] = 0;
	for (size_t k = 0; k < p.nslices; k++)
		p.obj_base[k + 1] = p.obj_base[k] +
				    (p.slices[k].s.len + (uint64_t)block_size - 1) / block_size;
	*out = p;
	return 0;
}

int reconcile_plan_object(const struct reconcile_plan *p, uint64_t j, struct reconcile_object *o)
{
	size_t lo = 0, hi;
	const struct meta_chunk_slice *cs;

	if (!p || !o || j >= p->nobjects)
		return -EINVAL;
	/* The last slice whose first object is <= j. */
	hi = p->nslices;
	while (hi - lo > 1) {
		size_t mid = lo + (hi - lo) / 2;
		if (p->obj_base[mid] <= j)
			lo = mid;
		else
			hi = mid;
	}
	cs = &p->slices[lo];
	o->slice = lo;
	o->index = (uint32_t)(j - p->obj_base[lo]);
	o->size = slice_object_size(o->index, cs->s.size, p->block_size);
	o->file_off = (uint64_t)cs->chunk * META_CHUNK_SIZE + cs->s.pos +
		      (uint64_t)o->index * p->block_size;
	return 0;
}
