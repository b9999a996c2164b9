/* libFuzzer target: slice resolution of arbitrary slice lists matches a
 * byte-by-byte model and never crashes. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "slice.h"

#define SPAN 4096u /* model a small window of the chunk */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	size_t n = size / 8, nx = 0;
	struct meta_slice *s = calloc(n ? n : 1, sizeof(*s));
	struct slice_extent *xs = NULL;
	uint64_t model[SPAN];

	if (!s)
		return 0;
	memset(model, 0, sizeof(model));
	for (size_t i = 0; i < n; i++) {
		const uint8_t *p = data + i * 8;
		s[i].id = p[0] % 4 == 0 ? 0 : i + 1;
		s[i].pos = (uint32_t)(p[1] | p[2] << 8) % SPAN;
		s[i].len = (uint32_t)(p[3] | p[4] << 8) % (SPAN - s[i].pos) + 1;
		s[i].size = s[i].len + p[5];
		s[i].off = p[5] ? p[6] % (p[5] + 1u) : 0;
		for (uint32_t b = s[i].pos; b < s[i].pos + s[i].len; b++)
			model[b] = s[i].id ? (s[i].id << 32) | (s[i].off + (b - s[i].pos)) : 0;
	}
	uint32_t pos = size ? data[0] % SPAN : 0;
	uint32_t len = SPAN - pos;
	if (slice_resolve(s, n, pos, len, &xs, &nx) == 0) {
		uint32_t at = pos;
		for (size_t k = 0; k < nx; k++) {
			if (xs[k].pos != at || xs[k].len == 0)
				abort(); /* extents must tile the range in order */
			for (uint32_t b = 0; b < xs[k].len; b++) {
				uint64_t got = xs[k].id ? (xs[k].id << 32) | (xs[k].slice_off + b) : 0;
				if (got != model[at + b])
					abort();
			}
			at += xs[k].len;
		}
		if (at != pos + len)
			abort();
	}
	free(xs);
	free(s);
	return 0;
}
