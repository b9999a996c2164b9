/*
 * idset: a set of backing ids (uint32, > 0), open addressing with linear
 * probing and backward-shift deletion: O(1) add, lookup and delete on the
 * BACKING_OPEN/BACKING_CLOSE path, no tombstones. Kept at most half full.
 */
#include <errno.h>
#include <stdlib.h>

#include "brokerd.h"

static size_t slot_of(uint32_t id, size_t cap)
{
	/* Kernel ids are small and dense: spread them (Knuth's multiplier). */
	return (size_t)((id * 2654435761u) & (uint32_t)(cap - 1));
}

static int grow(struct idset *s)
{
	size_t ncap = s->cap ? s->cap * 2 : 16;
	uint32_t *n = calloc(ncap, sizeof(*n));

	if (!n)
		return -ENOMEM;
	for (size_t i = 0; i < s->cap; i++) {
		uint32_t id = s->slots[i];
		size_t j;

		if (!id)
			continue;
		for (j = slot_of(id, ncap); n[j]; j = (j + 1) & (ncap - 1))
			;
		n[j] = id;
	}
	free(s->slots);
	s->slots = n;
	s->cap = ncap;
	return 0;
}

int idset_add(struct idset *s, uint32_t id)
{
	size_t i;

	if (id == 0)
		return -EINVAL;
	if (idset_has(s, id))
		return -EEXIST;
	if ((s->n + 1) * 2 > s->cap) {
		int rc = grow(s);
		if (rc < 0)
			return rc;
	}
	for (i = slot_of(id, s->cap); s->slots[i]; i = (i + 1) & (s->cap - 1))
		;
	s->slots[i] = id;
	s->n++;
	return 0;
}

bool idset_has(const struct idset *s, uint32_t id)
{
	if (id == 0 || s->cap == 0)
		return false;
	for (size_t i = slot_of(id, s->cap); s->slots[i]; i = (i + 1) & (s->cap - 1))
		if (s->slots[i] == id)
			return true;
	return false;
}

bool idset_del(struct idset *s, uint32_t id)
{
	size_t i, j, mask = s->cap - 1;

	if (id == 0 || s->cap == 0)
		return false;
	for (i = slot_of(id, s->cap); s->slots[i] != id; i = (i + 1) & mask)
		if (!s->slots[i])
			return false;
	/* Shift later members of the run back over the hole. */
	for (j = (i + 1) & mask; s->slots[j]; j = (j + 1) & mask) {
		size_t home = slot_of(s->slots[j], s->cap);

		/* Move j to i unless its home lies cyclically in (i, j]. */
		if ((j > i && (home <= i || home > j)) || (j < i && home <= i && home > j)) {
			s->slots[i] = s->slots[j];
			i = j;
		}
	}
	s->slots[i] = 0;
	s->n--;
	return true;
}

void idset_free(struct idset *s)
{
	free(s->slots);
	s->slots = NULL;
	s->cap = s->n = 0;
}
