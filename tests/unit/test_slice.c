/* Unit tests for common/slice.c: object keys and sizes, and slice_resolve()
 * against a byte-by-byte model. */
#include <criterion/criterion.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "slice.h"

Test(slice, object_size)
{
	const uint32_t bs = 4u << 20;

	cr_assert_eq(slice_object_size(0, 100, bs), 100);
	cr_assert_eq(slice_object_size(1, 100, bs), 0);
	cr_assert_eq(slice_object_size(0, bs, bs), bs);
	cr_assert_eq(slice_object_size(1, bs, bs), 0);
	cr_assert_eq(slice_object_size(2, 2 * bs + 5, bs), 5);
	cr_assert_eq(slice_object_size(1, 2 * bs + 5, bs), bs);
	cr_assert_eq(slice_object_size(15, META_CHUNK_SIZE, bs), bs);
	cr_assert_eq(slice_object_size(16, META_CHUNK_SIZE, bs), 0);
	cr_assert_eq(slice_object_size(0, 100, 0), 0);
	/* index * block_size past 32 bits does not wrap. */
	cr_assert_eq(slice_object_size(UINT32_MAX, UINT32_MAX, bs), 0);
}

Test(slice, object_key)
{
	char buf[SLICE_KEY_MAX];
	const uint32_t bs = 4u << 20;

	slice_object_key(1234567890ull, 2, 2 * bs + 5, bs, buf, sizeof(buf));
	cr_assert_str_eq(buf, "chunks/1234/1234567/1234567890_2_5");
	slice_object_key(1234567890ull, 0, 2 * bs + 5, bs, buf, sizeof(buf));
	cr_assert_str_eq(buf, "chunks/1234/1234567/1234567890_0_4194304");
	slice_object_key(7, 0, 100, bs, buf, sizeof(buf));
	cr_assert_str_eq(buf, "chunks/0/0/7_0_100");
	slice_object_key(UINT64_MAX, UINT32_MAX - 1, UINT32_MAX, 1, buf, sizeof(buf));
	cr_assert_str_eq(buf, "chunks/18446744073709/18446744073709551/"
			      "18446744073709551615_4294967294_1");
	cr_assert_lt(strlen(buf), SLICE_KEY_MAX);
	/* A short buffer is truncated, never overrun. */
	memset(buf, 'x', sizeof(buf));
	slice_object_key(7, 0, 100, bs, buf, 8);
	cr_assert_str_eq(buf, "chunks/");
	cr_assert_eq(buf[8], 'x');
}

Test(slice, resolve_bad_input)
{
	struct meta_slice s = { .id = 1, .size = 10, .off = 0, .pos = 0, .len = 10 };
	struct slice_extent *e = (void *)1;
	size_t n = 99;

	cr_assert_eq(slice_resolve(&s, 1, UINT32_MAX - 1, 10, &e, &n), -EINVAL);
	cr_assert_null(e);
	cr_assert_eq(n, 0);
	cr_assert_eq(slice_resolve(&s, 1, META_CHUNK_SIZE - 1, 2, &e, &n), -EINVAL);
	cr_assert_eq(slice_resolve(&s, 1, META_CHUNK_SIZE + 1, 0, &e, &n), -EINVAL);
	cr_assert_eq(slice_resolve(NULL, 1, 0, 10, &e, &n), -EINVAL);
	cr_assert_eq(slice_resolve(&s, 1, 5, 0, &e, &n), 0);
	cr_assert_null(e);
	cr_assert_eq(n, 0);
	cr_assert_eq(slice_resolve(NULL, 0, 0, META_CHUNK_SIZE, &e, &n), 0);
	cr_assert_eq(n, 1);
	cr_assert_eq(e[0].pos, 0);
	cr_assert_eq(e[0].len, META_CHUNK_SIZE);
	cr_assert_eq(e[0].id, 0);
	free(e);
}

Test(slice, resolve_skips_invalid_slices)
{
	struct meta_slice s[] = {
		{ .id = 1, .size = 100, .off = 0, .pos = 0, .len = 100 },
		{ .id = 2, .size = 10, .off = 5, .pos = 10, .len = 10 },     /* reads past size */
		{ .id = 3, .size = 10, .off = 0, .pos = 20, .len = 0 },      /* empty */
		{ .id = 4, .size = 100, .off = 0, .pos = META_CHUNK_SIZE - 50, .len = 100 },
		{ .id = 5, .size = UINT32_MAX, .off = UINT32_MAX - 1, .pos = 30, .len = 5 },
	};
	struct slice_extent *e;
	size_t n;

	cr_assert_eq(slice_resolve(s, 5, 0, 100, &e, &n), 0);
	cr_assert_eq(n, 1);
	cr_assert_eq(e[0].id, 1);
	cr_assert_eq(e[0].len, 100);
	cr_assert_eq(e[0].slice_size, 100);
	free(e);
}

Test(slice, resolve_simple_overlay)
{
	struct meta_slice s[] = {
		{ .id = 1, .size = 1000, .off = 0, .pos = 0, .len = 1000 },
		{ .id = 2, .size = 100, .off = 0, .pos = 100, .len = 100 },
		{ .id = 0, .size = 50, .off = 0, .pos = 500, .len = 50 },
	};
	struct slice_extent *e;
	size_t n;

	cr_assert_eq(slice_resolve(s, 3, 50, 1000, &e, &n), 0);
	cr_assert_eq(n, 6);
	cr_assert(e[0].pos == 50 && e[0].len == 50 && e[0].id == 1 && e[0].slice_off == 50);
	cr_assert(e[1].pos == 100 && e[1].len == 100 && e[1].id == 2 && e[1].slice_off == 0);
	cr_assert(e[2].pos == 200 && e[2].len == 300 && e[2].id == 1 && e[2].slice_off == 200);
	cr_assert(e[3].pos == 500 && e[3].len == 50 && e[3].id == 0);
	cr_assert(e[4].pos == 550 && e[4].len == 450 && e[4].id == 1 && e[4].slice_off == 550);
	cr_assert(e[5].pos == 1000 && e[5].len == 50 && e[5].id == 0); /* hole */
	free(e);
}

/* The model: for each byte of a window, which slice shows it and where. */
#define W 1024
#define MAXS 64

static uint32_t rnd(uint32_t n)
{
	return n ? (uint32_t)(random() % n) : 0;
}

static int usable(const struct meta_slice *s)
{
	if (s->len == 0 || s->pos >= META_CHUNK_SIZE || s->len > META_CHUNK_SIZE - s->pos)
		return 0;
	return s->id == 0 || (s->off <= s->size && s->len <= s->size - s->off);
}

Test(slice, resolve_random_against_model)
{
	struct meta_slice s[MAXS];
	uint64_t id_at[W];
	uint32_t off_at[W];
	int cases;

	srandom(20240611);
	for (cases = 0; cases < 4000; cases++) {
		/* The window sits at the start of the chunk or against its end. */
		uint32_t base = (cases & 1) ? META_CHUNK_SIZE - W : 0;
		size_t n = rnd(MAXS), i, k;
		uint32_t qpos, qlen, x;
		struct slice_extent *e;
		size_t ne;

		for (i = 0; i < n; i++) {
			uint32_t p = rnd(W), l = 1 + rnd(W / 2);

			s[i].id = rnd(5) == 0 ? 0 : i + 1;
			s[i].pos = base + p;
			s[i].len = l;
			s[i].off = rnd(300);
			s[i].size = s[i].off + l + rnd(100);
			if (rnd(40) == 0)
				s[i].len = 0;
			if (rnd(40) == 0)
				s[i].size = s[i].off + l - 1; /* reads past its size */
			/* Slices reaching past the chunk end are skipped. */
		}
		for (x = 0; x < W; x++) {
			id_at[x] = 0;
			off_at[x] = 0;
		}
		for (i = 0; i < n; i++) {
			if (!usable(&s[i]))
				continue;
			for (x = s[i].pos; x < s[i].pos + s[i].len && x - base < W; x++) {
				id_at[x - base] = s[i].id;
				off_at[x - base] = s[i].off + (x - s[i].pos);
			}
		}
		qpos = rnd(W);
		qlen = 1 + rnd(W - qpos);
		cr_assert_eq(slice_resolve(s, n, base + qpos, qlen, &e, &ne), 0);
		cr_assert_gt(ne, 0);
		x = base + qpos;
		for (k = 0; k < ne; k++) {
			uint32_t b;

			cr_assert_eq(e[k].pos, x, "case %d: extents must tile", cases);
			cr_assert_gt(e[k].len, 0);
			if (k > 0)
				cr_assert(!(e[k].id == 0 && e[k - 1].id == 0),
					  "adjacent zero extents are merged");
			for (b = 0; b < e[k].len; b++) {
				uint32_t at = e[k].pos + b - base;

				cr_assert_eq(e[k].id, id_at[at], "case %d byte %u", cases, at);
				if (e[k].id != 0) {
					cr_assert_eq(e[k].slice_off + b, off_at[at], "case %d byte %u",
						     cases, at);
					cr_assert_eq(e[k].slice_size, s[e[k].id - 1].size);
				}
			}
			x += e[k].len;
		}
		cr_assert_eq(x, base + qpos + qlen, "case %d: extents must end at the range end",
			     cases);
		free(e);
	}
}

Test(slice, resolve_many_slices_fast)
{
	const size_t n = 5000;
	struct meta_slice *s = calloc(n, sizeof(*s));
	struct slice_extent *e;
	struct timespec t0, t1;
	size_t ne, i;
	uint64_t total = 0;

	cr_assert_not_null(s);
	srandom(7);
	for (i = 0; i < n; i++) {
		/* Small random writes all over the chunk: the worst case for gaps. */
		s[i].id = i + 1;
		s[i].len = 1 + rnd(65536);
		s[i].pos = rnd(META_CHUNK_SIZE - s[i].len);
		s[i].size = s[i].len;
	}
	clock_gettime(CLOCK_MONOTONIC, &t0);
	cr_assert_eq(slice_resolve(s, n, 0, META_CHUNK_SIZE, &e, &ne), 0);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	for (i = 0; i < ne; i++)
		total += e[i].len;
	cr_assert_eq(total, META_CHUNK_SIZE);
	cr_assert_lt((t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000, 2000);
	free(e);
	free(s);
}
