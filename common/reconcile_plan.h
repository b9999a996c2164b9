/*
 * reconcile_plan: how one reconcile job's bytes become slices and objects.
 * A pure function of (length, dirty ranges, block size): one slice per
 * dirty range and 64 MiB chunk, clamped to the length, each stored as
 * objects of at most block_size bytes (slice.h names them). The caller
 * assigns the slice ids (meta_slice_id_alloc) and owns the plan.
 */
#ifndef FERRY_RECONCILE_PLAN_H
#define FERRY_RECONCILE_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "meta.h"

/* Largest file a job may describe, and most objects one plan may have. */
#define RECONCILE_LENGTH_MAX (1ull << 44)
#define RECONCILE_OBJECTS_MAX (1ull << 24)

/* Bytes [start, end) of a file. */
struct reconcile_range {
	uint64_t start, end;
};

struct reconcile_plan {
	struct meta_chunk_slice *slices;  /* in range order; s.id 0 until assigned */
	size_t nslices;
	uint64_t *obj_base;               /* nslices + 1: index of each slice's first object */
	uint64_t nobjects;
	uint32_t block_size;
};

/* One object of a plan. */
struct reconcile_object {
	size_t slice;       /* index into slices */
	uint32_t index;     /* object index within the slice */
	uint32_t size;      /* data bytes */
	uint64_t file_off;  /* where its bytes are in the file */
};

/*
 * Plans [0, length) restricted to r[0..n) (n 0: the whole file). Ranges may
 * come in any order, overlap, be empty or reach past length: each is
 * clamped, empty ones are skipped. Returns 0, -EINVAL (block_size 0 or above
 * META_CHUNK_SIZE, r NULL with n > 0), -EFBIG (length above
 * RECONCILE_LENGTH_MAX or more than RECONCILE_OBJECTS_MAX objects) or
 * -ENOMEM. *out is zeroed on failure.
 */
int reconcile_plan_make(uint64_t length, const struct reconcile_range *r, size_t n,
			uint32_t block_size, struct reconcile_plan *out);
/* Object j (0 <= j < nobjects). Returns 0 or -EINVAL. */
int reconcile_plan_object(const struct reconcile_plan *p, uint64_t j, struct reconcile_object *o);
/* Frees what the plan holds; accepts NULL and a zeroed plan. */
void reconcile_plan_free(struct reconcile_plan *p);

#endif
