#include "handle_table.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

/*
 * An fh is generation << 24 | slot index. A slot's state word keeps its
 * generation at the same bits, so an fh and a slot word compare by value
 * once the fh's index bits are replaced by the type and the live bit: a
 * lookup is one load and one comparison.
 *
 * Generations start at 1 and skip 0 when they wrap, so fh 0 is never live.
 * A wrap takes 2^40 reuses of one slot; only then could a stale fh match.
 *
 * Each table starts its generations at a random base (below 2^38): a
 * ferry-mountd that takes over the FUSE connection of one that died gets
 * requests carrying the dead one's handles, and those must not name its
 * own (they answer -EBADF); two tables share a generation at one slot only
 * if their bases lie within the number of reuses of each other.
 */
#define IDX_BITS	24
#define IDX_MASK	((UINT64_C(1) << IDX_BITS) - 1)
#define GEN_MAX		(UINT64_MAX >> IDX_BITS)
#define MAX_SLOTS	(UINT32_C(1) << IDX_BITS)
#define SLOT_LIVE	UINT64_C(1)
#define TYPE_SHIFT	1

_Static_assert(((uint64_t)HANDLE_SPECIAL << TYPE_SHIFT | SLOT_LIVE) <= IDX_MASK,
	       "type and live bit must fit below the generation");

/*
 * The free list is a Treiber stack of slot indices. Its head carries a tag
 * above the index that every push and pop increments, so a pop whose slot
 * was popped and pushed back meanwhile (ABA) fails its CAS instead of
 * installing a stale next. The index field has one bit more than a slot
 * index, for FREE_END.
 */
#define HEAD_IDX_BITS	(IDX_BITS + 1)
#define HEAD_IDX_MASK	((UINT64_C(1) << HEAD_IDX_BITS) - 1)
#define FREE_END	MAX_SLOTS

struct slot {
	_Atomic uint64_t word;	/* generation | type | live */
	_Atomic(void *) obj;
	_Atomic uint32_t next;	/* free list link, meaningful while free */
};

struct handle_table {
	struct slot *slots;
	uint32_t nslots;
	_Atomic uint64_t free_head;
	_Atomic uint32_t count;
};

static bool type_ok(enum handle_type type)
{
	return type == HANDLE_FILE || type == HANDLE_DIR || type == HANDLE_SPECIAL;
}

static uint64_t live_word(uint64_t gen, enum handle_type type)
{
	return gen << IDX_BITS | (uint64_t)type << TYPE_SHIFT | SLOT_LIVE;
}

int handle_table_new(uint32_t max_handles, struct handle_table **out)
{
	struct handle_table *t;
	uint32_t n = 1, i;

	if (max_handles == 0 || max_handles > MAX_SLOTS)
		return -EINVAL;
	while (n < max_handles)
		n <<= 1;

	t = calloc(1, sizeof(*t));
	if (!t)
		return -ENOMEM;
	t->slots = calloc(n, sizeof(*t->slots));
	if (!t->slots) {
		handle_table_free(t);
		return -ENOMEM;
	}
	t->nslots = n;
	uint64_t base = 0;
	if (getrandom(&base, sizeof(base), 0) != sizeof(base))
		base = (uint64_t)time(NULL) ^ (uint64_t)getpid() << 20;
	base = (base & ((UINT64_C(1) << 38) - 1)) | 1;
	/* Chained in index order so a fresh table hands out slot 0 first. */
	for (i = 0; i < n; i++) {
		atomic_init(&t->slots[i].word, base << IDX_BITS);
		atomic_init(&t->slots[i].obj, NULL);
		atomic_init(&t->slots[i].next, i + 1 < n ? i + 1 : FREE_END);
	}
	atomic_init(&t->free_head, 0);
	atomic_init(&t->count, 0);
	*out = t;
	return 0;
}

void handle_table_free(struct handle_table *t)
{
	if (!t)
		return;
	free(t->slots);
	free(t);
}

static uint64_t head_next(uint64_t head, uint32_t idx)
{
	return ((head >> HEAD_IDX_BITS) + 1) << HEAD_IDX_BITS | idx;
}

/* Returns a slot index that the caller now owns, or FREE_END. */
static uint32_t free_pop(struct handle_table *t)
{
	uint64_t head, new;
	uint32_t idx, next;

	/* Acquire pairs with free_push's release: we see next and the slot's
	 * bumped generation as the pusher left them. */
	head = atomic_load_explicit(&t->free_head, memory_order_acquire);
	do {
		idx = (uint32_t)(head & HEAD_IDX_MASK);
		if (idx == FREE_END)
			return FREE_END;
		/* If idx is popped and pushed back before our CAS, next may be
		 * stale; the tag has moved on then, and the CAS fails. */
		next = atomic_load_explicit(&t->slots[idx].next, memory_order_relaxed);
		new = head_next(head, next);
	} while (!atomic_compare_exchange_weak_explicit(&t->free_head, &head, new,
							memory_order_acquire,
							memory_order_acquire));
	return idx;
}

static void free_push(struct handle_table *t, uint32_t idx)
{
	uint64_t head, new;

	head = atomic_load_explicit(&t->free_head, memory_order_relaxed);
	do {
		atomic_store_explicit(&t->slots[idx].next, (uint32_t)(head & HEAD_IDX_MASK),
				      memory_order_relaxed);
		new = head_next(head, idx);
	} while (!atomic_compare_exchange_weak_explicit(&t->free_head, &head, new,
							memory_order_release,
							memory_order_relaxed));
}

int handle_add(struct handle_table *t, enum handle_type type, void *obj, uint64_t *fh)
{
	struct slot *s;
	uint64_t gen;
	uint32_t idx;

	/* A NULL obj would be indistinguishable from "not live" in handle_get. */
	if (!type_ok(type) || !obj || !fh)
		return -EINVAL;
	idx = free_pop(t);
	if (idx == FREE_END)
		return -EMFILE;
	s = &t->slots[idx];

	/* Nobody else writes a slot between its pop and its live store. */
	gen = atomic_load_explicit(&s->word, memory_order_relaxed) >> IDX_BITS;
	/*
	 * Before the live store, so that a concurrent remove of this fh, which
	 * decrements after reading the live word, can never take count below 0.
	 */
	atomic_fetch_add_explicit(&t->count, 1, memory_order_relaxed);
	/*
	 * Release as well: a handle_get that read the previous generation's
	 * live word and then loads this obj must, on re-reading the word, see
	 * the generation bump that happened before our pop.
	 */
	atomic_store_explicit(&s->obj, obj, memory_order_release);
	/* Publishes obj: whoever sees the live bit sees obj. */
	atomic_store_explicit(&s->word, live_word(gen, type), memory_order_release);
	*fh = gen << IDX_BITS | idx;
	return 0;
}

/* The slot of fh, or NULL if fh cannot name a live handle of type. */
static struct slot *fh_slot(struct handle_table *t, uint64_t fh, enum handle_type type)
{
	uint64_t idx = fh & IDX_MASK;

	if (idx >= t->nslots || fh >> IDX_BITS == 0 || !type_ok(type))
		return NULL;
	return &t->slots[idx];
}

void *handle_get(struct handle_table *t, uint64_t fh, enum handle_type type)
{
	struct slot *s = fh_slot(t, fh, type);
	uint64_t w;
	void *obj;

	if (!s)
		return NULL;
	/* Pairs with handle_add's release store of the live word. */
	w = atomic_load_explicit(&s->word, memory_order_acquire);
	if (w != live_word(fh >> IDX_BITS, type))
		return NULL;
	obj = atomic_load_explicit(&s->obj, memory_order_acquire);
	/*
	 * Between the two loads the slot may have been removed and reused, so
	 * obj may belong to a later generation. If so, the acquire above pairs
	 * with that handle_add's release of obj, and the bumped word is visible
	 * now: an unchanged word means obj is this fh's. A word that changed
	 * was removed, so NULL is the right answer.
	 */
	if (atomic_load_explicit(&s->word, memory_order_relaxed) != w)
		return NULL;
	return obj;
}

void *handle_remove(struct handle_table *t, uint64_t fh, enum handle_type type)
{
	struct slot *s = fh_slot(t, fh, type);
	uint64_t gen, want;
	void *obj;

	if (!s)
		return NULL;
	gen = fh >> IDX_BITS;
	want = live_word(gen, type);
	/*
	 * One CAS both checks fh and retires it: of racing removes of one fh
	 * only one wins, and a stale fh fails. Acquire pairs with handle_add's
	 * release of the live word, for the obj load below.
	 */
	if (!atomic_compare_exchange_strong_explicit(&s->word, &want,
						     (gen == GEN_MAX ? 1 : gen + 1) << IDX_BITS,
						     memory_order_acquire,
						     memory_order_relaxed))
		return NULL;
	/* The slot is ours until pushed; obj is left for handle_add to overwrite. */
	obj = atomic_load_explicit(&s->obj, memory_order_relaxed);
	/* Before the push, so count never exceeds the slots in use. */
	atomic_fetch_sub_explicit(&t->count, 1, memory_order_relaxed);
	free_push(t, (uint32_t)(fh & IDX_MASK));
	return obj;
}

uint32_t handle_count(struct handle_table *t)
{
	return atomic_load_explicit(&t->count, memory_order_relaxed);
}

void handle_table_drain(struct handle_table *t,
			void (*cb)(enum handle_type type, void *obj, void *arg), void *arg)
{
	if (!t)
		return;
	for (uint32_t i = 0; i < t->nslots; i++) {
		uint64_t w = atomic_load_explicit(&t->slots[i].word, memory_order_acquire);
		enum handle_type type;
		void *obj;

		if (!(w & SLOT_LIVE))
			continue;
		type = (enum handle_type)((w & IDX_MASK) >> TYPE_SHIFT);
		obj = handle_remove(t, (w & ~IDX_MASK) | i, type);
		if (obj)
			cb(type, obj, arg);
	}
}

void handle_table_each(struct handle_table *t,
		       void (*cb)(uint64_t fh, enum handle_type type, void *obj, void *arg), void *arg)
{
	if (!t)
		return;
	for (uint32_t i = 0; i < t->nslots; i++) {
		uint64_t w = atomic_load_explicit(&t->slots[i].word, memory_order_acquire);
		void *obj;

		if (!(w & SLOT_LIVE))
			continue;
		obj = atomic_load_explicit(&t->slots[i].obj, memory_order_acquire);
		cb((w & ~IDX_MASK) | i, (enum handle_type)((w & IDX_MASK) >> TYPE_SHIFT), obj, arg);
	}
}

int handle_table_restore(struct handle_table *t, const uint64_t *fhs, const enum handle_type *types,
			 void *const *objs, size_t n)
{
	uint32_t prev = FREE_END;

	if (atomic_load(&t->count) != 0)
		return -EBUSY;
	for (size_t k = 0; k < n; k++) {
		uint64_t idx = fhs[k] & IDX_MASK, gen = fhs[k] >> IDX_BITS;

		if (idx >= t->nslots || gen == 0 || types[k] < HANDLE_FILE ||
		    types[k] > HANDLE_SPECIAL ||
		    (atomic_load(&t->slots[idx].word) & SLOT_LIVE))
			return -EINVAL;
		atomic_store(&t->slots[idx].obj, objs[k]);
		atomic_store(&t->slots[idx].word, live_word(gen, types[k]));
	}
	/* The free list anew, in index order, without the slots now live. */
	for (uint32_t i = t->nslots; i-- > 0;) {
		if (atomic_load(&t->slots[i].word) & SLOT_LIVE)
			continue;
		atomic_store(&t->slots[i].next, prev);
		prev = i;
	}
	atomic_store(&t->free_head, (uint64_t)prev);
	atomic_store(&t->count, (uint32_t)n);
	return 0;
}
