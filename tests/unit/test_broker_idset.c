/*
 * brokerd/idset.c: the set of backing ids a mount holds, checked against a
 * plain array under a long random sequence of adds and deletes (deletion
 * shifts entries back, which is where open addressing goes wrong).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "brokerd.h"

Test(broker_idset, basics)
{
	struct idset s = { 0 };

	cr_assert(!idset_has(&s, 1));
	cr_assert(!idset_del(&s, 1));
	cr_assert_eq(idset_add(&s, 0), -EINVAL);
	cr_assert_eq(idset_add(&s, 1), 0);
	cr_assert_eq(idset_add(&s, 1), -EEXIST);
	cr_assert(idset_has(&s, 1));
	cr_assert_eq(s.n, 1);
	cr_assert(idset_del(&s, 1));
	cr_assert(!idset_has(&s, 1));
	cr_assert_eq(s.n, 0);
	idset_free(&s);
	idset_free(&s); /* twice is fine */
}

Test(broker_idset, random_against_a_model)
{
	enum { RANGE = 3000, STEPS = 200000 };
	static bool model[RANGE];
	struct idset s = { 0 };
	uint64_t x = 88172645463325252ull;
	size_t n = 0;

	for (int i = 0; i < STEPS; i++) {
		uint32_t id;

		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		/* Dense small ids, as the kernel hands out, and a few large ones. */
		id = (uint32_t)(x % RANGE) + 1;
		if (id == RANGE)
			id = 0x7fffffff; /* model slot 0 */
		if ((x >> 40) % 3 == 0) {
			bool had = idset_del(&s, id);
			cr_assert_eq(had, model[id == 0x7fffffff ? 0 : id], "del %u", id);
			if (had)
				n--;
			model[id == 0x7fffffff ? 0 : id] = false;
		} else {
			int rc = idset_add(&s, id);
			cr_assert_eq(rc, model[id == 0x7fffffff ? 0 : id] ? -EEXIST : 0, "add %u", id);
			if (rc == 0)
				n++;
			model[id == 0x7fffffff ? 0 : id] = true;
		}
		cr_assert_eq(s.n, n);
	}
	for (uint32_t id = 1; id < RANGE; id++)
		cr_assert_eq(idset_has(&s, id), model[id], "has %u", id);
	cr_assert(s.n * 2 <= s.cap, "more than half full");
	idset_free(&s);
}
