/*
 * reconcile_plan against a model: random dirty ranges (unsorted,
 * overlapping, empty, past the end) over lengths around chunk and block
 * boundaries; the slices must be exactly the model's (one per range and
 * chunk, clamped, in range order) and the objects must tile each slice.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "reconcile_plan.h"

#define CH ((uint64_t)META_CHUNK_SIZE)

static uint64_t rs = 0x9E3779B97F4A7C15ull;
static uint64_t rnd(void)
{
	rs ^= rs << 13;
	rs ^= rs >> 7;
	rs ^= rs << 17;
	return rs;
}

/* The model: the obvious per-chunk loop, written independently. */
static size_t model(uint64_t length, const struct reconcile_range *r, size_t n,
		    struct meta_chunk_slice *out, size_t max)
{
	struct reconcile_range whole = { 0, length };
	size_t k = 0;

	if (n == 0) {
		r = &whole;
		n = 1;
	}
	for (size_t i = 0; i < n; i++) {
		uint64_t s = r[i].start, e = r[i].end > length ? length : r[i].end;
		if (s >= e)
			continue;
		for (uint64_t c = s / CH; c <= (e - 1) / CH; c++) {
			uint64_t a = s > c * CH ? s : c * CH, b = e < (c + 1) * CH ? e : (c + 1) * CH;
			cr_assert(k < max);
			out[k].chunk = (uint32_t)c;
			out[k].s.pos = (uint32_t)(a - c * CH);
			out[k].s.len = out[k].s.size = (uint32_t)(b - a);
			k++;
		}
	}
	return k;
}

static void check(uint64_t length, const struct reconcile_range *r, size_t n, uint32_t bs)
{
	static struct meta_chunk_slice want[4096];
	struct reconcile_plan p;
	size_t nw = model(length, r, n, want, 4096);
	uint64_t j = 0;

	cr_assert_eq(reconcile_plan_make(length, r, n, bs, &p), 0);
	cr_assert_eq(p.nslices, nw, "length %llu: %zu slices, model %zu",
		     (unsigned long long)length, p.nslices, nw);
	for (size_t k = 0; k < nw; k++) {
		const struct meta_chunk_slice *g = &p.slices[k];
		cr_assert(g->chunk == want[k].chunk && g->s.pos == want[k].s.pos &&
			  g->s.len == want[k].s.len && g->s.size == g->s.len && g->s.off == 0 &&
			  g->s.id == 0, "slice %zu differs", k);
		cr_assert(g->s.len > 0 && (uint64_t)g->s.pos + g->s.len <= CH);
		/* Its objects, in order, tile it. */
		uint64_t at = (uint64_t)g->chunk * CH + g->s.pos, left = g->s.len;
		for (uint32_t idx = 0; left; idx++, j++) {
			struct reconcile_object o;
			cr_assert_eq(reconcile_plan_object(&p, j, &o), 0);
			cr_assert_eq(o.slice, k);
			cr_assert_eq(o.index, idx);
			cr_assert_eq(o.file_off, at);
			cr_assert(o.size > 0 && o.size <= bs);
			cr_assert(o.size == bs || o.size == left, "only the last object is short");
			at += o.size;
			left -= o.size;
		}
	}
	cr_assert_eq(j, p.nobjects);
	struct reconcile_object o;
	cr_assert_eq(reconcile_plan_object(&p, p.nobjects, &o), -EINVAL);
	reconcile_plan_free(&p);
}

Test(reconcile_plan, whole_files)
{
	const uint64_t lens[] = { 0, 1, 4095, 4096, 4097, 4u << 20, (4u << 20) + 1, CH - 1, CH,
				  CH + 1, 200000000, 3 * CH + 12345 };
	const uint32_t bss[] = { 4096, 1u << 20, 4u << 20, 16u << 20, META_CHUNK_SIZE };

	for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++)
		for (size_t b = 0; b < sizeof(bss) / sizeof(bss[0]); b++)
			check(lens[i], NULL, 0, bss[b]);
}

Test(reconcile_plan, exact_example)
{
	/* 200 MB, one range across a chunk boundary, one empty, one past the end. */
	struct reconcile_range r[] = { { CH - 10, CH + 10 }, { 5, 5 }, { 199999990, 300000000 },
				       { 300000000, 300000001 } };
	struct reconcile_plan p;

	cr_assert_eq(reconcile_plan_make(200000000, r, 4, 4u << 20, &p), 0);
	cr_assert_eq(p.nslices, 3);
	cr_assert(p.slices[0].chunk == 0 && p.slices[0].s.pos == CH - 10 && p.slices[0].s.len == 10);
	cr_assert(p.slices[1].chunk == 1 && p.slices[1].s.pos == 0 && p.slices[1].s.len == 10);
	cr_assert(p.slices[2].chunk == 2 && p.slices[2].s.pos == 199999990 - 2 * CH &&
		  p.slices[2].s.len == 10);
	cr_assert_eq(p.nobjects, 3);
	reconcile_plan_free(&p);
	reconcile_plan_free(NULL);
}

Test(reconcile_plan, random_against_model)
{
	struct reconcile_range r[64];

	for (int round = 0; round < 3000; round++) {
		uint64_t length = rnd() % (5 * CH);
		size_t n = rnd() % 20;
		uint32_t bs = (uint32_t)(4096u << (rnd() % 13)); /* 4 KiB .. 16 MiB */

		if (round % 7 == 0)
			length = (rnd() % 5 + 1) * CH + (rnd() % 3) - 1; /* near a chunk edge */
		for (size_t i = 0; i < n; i++) {
			uint64_t a = rnd() % (length + length / 4 + 2), b;
			switch (rnd() % 4) {
			case 0: b = a; break;                           /* empty */
			case 1: b = a + rnd() % 4096; break;            /* small */
			case 2: b = a + rnd() % (2 * CH); break;        /* across chunks */
			default: b = a + rnd() % (length + 1); break;  /* maybe past the end */
			}
			r[i].start = a;
			r[i].end = b;
		}
		check(length, r, n, bs);
	}
}

Test(reconcile_plan, limits)
{
	struct reconcile_plan p;
	struct reconcile_range r = { 0, 10 };

	cr_assert_eq(reconcile_plan_make(10, NULL, 1, 4096, &p), -EINVAL);
	cr_assert_eq(reconcile_plan_make(10, &r, 1, 0, &p), -EINVAL);
	cr_assert_eq(reconcile_plan_make(10, &r, 1, META_CHUNK_SIZE + 1, &p), -EINVAL);
	cr_assert_eq(reconcile_plan_make(RECONCILE_LENGTH_MAX + 1, NULL, 0, 4u << 20, &p), -EFBIG);
	/* 16 TiB in 4 KiB objects is too many objects. */
	cr_assert_eq(reconcile_plan_make(RECONCILE_LENGTH_MAX, NULL, 0, 4096, &p), -EFBIG);
	cr_assert_null(p.slices);
	/* ...in 4 MiB objects it is fine. */
	cr_assert_eq(reconcile_plan_make(RECONCILE_LENGTH_MAX, NULL, 0, 4u << 20, &p), 0);
	cr_assert_eq(p.nobjects, RECONCILE_LENGTH_MAX / (4u << 20));
	cr_assert_eq(p.nslices, RECONCILE_LENGTH_MAX / CH);
	reconcile_plan_free(&p);
}
