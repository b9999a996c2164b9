#include "handle_table.h"

#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

/* The fh layout handle_table.c documents: generation << 24 | slot index. */
#define FH_IDX_MASK ((UINT64_C(1) << 24) - 1)

static struct handle_table *table(uint32_t max)
{
	struct handle_table *t = NULL;

	cr_assert_eq(handle_table_new(max, &t), 0);
	cr_assert_not_null(t);
	return t;
}

Test(handle_table, add_get_remove)
{
	struct handle_table *t = table(16);
	int a, b;
	uint64_t fa, fb;

	cr_assert_eq(handle_count(t), 0);
	cr_assert_eq(handle_add(t, HANDLE_FILE, &a, &fa), 0);
	cr_assert_eq(handle_add(t, HANDLE_DIR, &b, &fb), 0);
	cr_assert_neq(fa, 0);
	cr_assert_neq(fb, 0);
	cr_assert_neq(fa, fb);
	cr_assert_eq(handle_count(t), 2);

	cr_assert_eq(handle_get(t, fa, HANDLE_FILE), &a);
	cr_assert_eq(handle_get(t, fb, HANDLE_DIR), &b);

	cr_assert_eq(handle_remove(t, fa, HANDLE_FILE), &a);
	cr_assert_eq(handle_count(t), 1);
	cr_assert_null(handle_get(t, fa, HANDLE_FILE));
	cr_assert_null(handle_remove(t, fa, HANDLE_FILE), "second remove must fail");
	cr_assert_eq(handle_count(t), 1);
	cr_assert_eq(handle_get(t, fb, HANDLE_DIR), &b);

	cr_assert_eq(handle_remove(t, fb, HANDLE_DIR), &b);
	cr_assert_eq(handle_count(t), 0);
	handle_table_free(t);
}

Test(handle_table, bad_arguments)
{
	struct handle_table *t = NULL;
	uint64_t fh = 42;
	int a;

	cr_assert_eq(handle_table_new(0, &t), -EINVAL);
	cr_assert_eq(handle_table_new((UINT32_C(1) << 24) + 1, &t), -EINVAL);
	cr_assert_eq(handle_table_new(UINT32_MAX, &t), -EINVAL);
	cr_assert_null(t);
	handle_table_free(NULL);

	t = table(4);
	cr_assert_eq(handle_add(t, HANDLE_FILE, NULL, &fh), -EINVAL);
	cr_assert_eq(handle_add(t, (enum handle_type)0, &a, &fh), -EINVAL);
	cr_assert_eq(handle_add(t, (enum handle_type)4, &a, &fh), -EINVAL);
	cr_assert_eq(fh, 42, "a failed add must not write *fh");
	cr_assert_eq(handle_count(t), 0);
	handle_table_free(t);
}

Test(handle_table, wrong_type)
{
	struct handle_table *t = table(4);
	int a;
	uint64_t fh;

	cr_assert_eq(handle_add(t, HANDLE_FILE, &a, &fh), 0);
	cr_assert_null(handle_get(t, fh, HANDLE_DIR));
	cr_assert_null(handle_get(t, fh, HANDLE_SPECIAL));
	cr_assert_null(handle_get(t, fh, (enum handle_type)0));
	cr_assert_null(handle_get(t, fh, (enum handle_type)4));
	cr_assert_null(handle_get(t, fh, (enum handle_type)-1));
	cr_assert_null(handle_remove(t, fh, HANDLE_DIR));
	cr_assert_null(handle_remove(t, fh, (enum handle_type)7));
	cr_assert_eq(handle_count(t), 1, "a wrong-type remove must not remove");
	cr_assert_eq(handle_get(t, fh, HANDLE_FILE), &a);
	cr_assert_eq(handle_remove(t, fh, HANDLE_FILE), &a);
	handle_table_free(t);
}

Test(handle_table, stale_after_remove_and_reuse)
{
	struct handle_table *t = table(1);
	int a, b;
	uint64_t fa, fb, prev;

	cr_assert_eq(handle_add(t, HANDLE_FILE, &a, &fa), 0);
	cr_assert_eq(handle_remove(t, fa, HANDLE_FILE), &a);
	cr_assert_null(handle_get(t, fa, HANDLE_FILE));

	/* One slot: b must reuse a's slot under a new generation. */
	cr_assert_eq(handle_add(t, HANDLE_FILE, &b, &fb), 0);
	cr_assert_eq(fa & FH_IDX_MASK, fb & FH_IDX_MASK);
	cr_assert_neq(fa, fb);
	cr_assert_null(handle_get(t, fa, HANDLE_FILE), "stale fh reached the new handle");
	cr_assert_null(handle_remove(t, fa, HANDLE_FILE), "stale fh removed the new handle");
	cr_assert_eq(handle_get(t, fb, HANDLE_FILE), &b);
	cr_assert_eq(handle_count(t), 1);

	/* Every earlier generation of the slot stays dead. */
	prev = fb;
	cr_assert_eq(handle_remove(t, fb, HANDLE_FILE), &b);
	for (int i = 0; i < 1000; i++) {
		uint64_t fh;

		cr_assert_eq(handle_add(t, HANDLE_DIR, &a, &fh), 0);
		cr_assert_gt(fh >> 24, prev >> 24);
		cr_assert_null(handle_get(t, prev, HANDLE_DIR));
		cr_assert_null(handle_get(t, fa, HANDLE_DIR));
		cr_assert_null(handle_get(t, fb, HANDLE_FILE));
		cr_assert_eq(handle_get(t, fh, HANDLE_DIR), &a);
		cr_assert_eq(handle_remove(t, fh, HANDLE_DIR), &a);
		prev = fh;
	}
	cr_assert_eq(handle_count(t), 0);
	handle_table_free(t);
}

static uint64_t xorshift64(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

Test(handle_table, forged_fh)
{
	struct handle_table *t = table(8);
	int objs[8];
	uint64_t fhs[8], rng = 0x9e3779b97f4a7c15u;
	enum handle_type types[] = { HANDLE_FILE, HANDLE_DIR, HANDLE_SPECIAL };

	for (int i = 0; i < 8; i++)
		cr_assert_eq(handle_add(t, HANDLE_FILE, &objs[i], &fhs[i]), 0);

	for (size_t k = 0; k < sizeof(types) / sizeof(types[0]); k++) {
		enum handle_type ty = types[k];
		uint64_t forged[] = {
			0,
			UINT64_MAX,
			fhs[0] & FH_IDX_MASK,			/* generation 0 */
			(fhs[0] & ~FH_IDX_MASK) | 8,		/* index past the table */
			(fhs[0] & ~FH_IDX_MASK) | FH_IDX_MASK,	/* largest index */
			fhs[3] + (UINT64_C(1) << 24),		/* next generation */
			fhs[3] - (UINT64_C(1) << 24),		/* previous generation (0) */
			~FH_IDX_MASK,				/* largest generation */
		};

		for (size_t j = 0; j < sizeof(forged) / sizeof(forged[0]); j++) {
			cr_assert_null(handle_get(t, forged[j], ty), "fh %#llx",
				       (unsigned long long)forged[j]);
			cr_assert_null(handle_remove(t, forged[j], ty), "fh %#llx",
				       (unsigned long long)forged[j]);
		}
		for (int i = 0; i < 100000; i++) {
			uint64_t fh = xorshift64(&rng);

			cr_assert_null(handle_get(t, fh, ty), "fh %#llx", (unsigned long long)fh);
			cr_assert_null(handle_remove(t, fh, ty), "fh %#llx", (unsigned long long)fh);
		}
	}
	cr_assert_eq(handle_count(t), 8);
	for (int i = 0; i < 8; i++)
		cr_assert_eq(handle_get(t, fhs[i], HANDLE_FILE), &objs[i]);
	handle_table_free(t);
}

Test(handle_table, full_table)
{
	struct handle_table *t = table(5);	/* rounds up to 8 */
	int objs[9];
	uint64_t fhs[9], fh = 42;

	for (int i = 0; i < 8; i++)
		cr_assert_eq(handle_add(t, HANDLE_FILE, &objs[i], &fhs[i]), 0, "add %d", i);
	cr_assert_eq(handle_add(t, HANDLE_FILE, &objs[8], &fh), -EMFILE);
	cr_assert_eq(fh, 42, "a failed add must not write *fh");
	cr_assert_eq(handle_count(t), 8);

	cr_assert_eq(handle_remove(t, fhs[5], HANDLE_FILE), &objs[5]);
	cr_assert_eq(handle_add(t, HANDLE_DIR, &objs[8], &fhs[8]), 0);
	cr_assert_eq(handle_get(t, fhs[8], HANDLE_DIR), &objs[8]);
	cr_assert_eq(handle_add(t, HANDLE_FILE, &objs[5], &fh), -EMFILE);

	for (int i = 0; i < 9; i++)
		if (i != 5)
			cr_assert_not_null(handle_remove(t, fhs[i], i == 8 ? HANDLE_DIR : HANDLE_FILE));
	cr_assert_eq(handle_count(t), 0);
	handle_table_free(t);
}

Test(handle_table, smallest_table)
{
	struct handle_table *t = table(1);
	int a;
	uint64_t fa, fh;

	cr_assert_eq(handle_add(t, HANDLE_SPECIAL, &a, &fa), 0);
	cr_assert_eq(handle_add(t, HANDLE_SPECIAL, &a, &fh), -EMFILE);
	cr_assert_eq(handle_remove(t, fa, HANDLE_SPECIAL), &a);
	handle_table_free(t);
}

/*
 * Worker threads count errors instead of calling cr_assert, whose abort is
 * only safe on the test's main thread.
 */
#define OWN_THREADS	4
#define OWN_ITERS	100000

struct own_worker {
	struct handle_table *t;
	enum handle_type type;
	char objs[8];
	long errors;
};

static void *own_run(void *arg)
{
	struct own_worker *w = arg;
	enum handle_type other = w->type == HANDLE_FILE ? HANDLE_DIR : HANDLE_FILE;

	for (int i = 0; i < OWN_ITERS; i++) {
		void *obj = &w->objs[i & 7];
		uint64_t fh;

		if (handle_add(w->t, w->type, obj, &fh) != 0) {
			w->errors++;
			continue;
		}
		w->errors += handle_get(w->t, fh, w->type) != obj;
		w->errors += handle_get(w->t, fh, other) != NULL;
		w->errors += handle_remove(w->t, fh, w->type) != obj;
		w->errors += handle_get(w->t, fh, w->type) != NULL;
		w->errors += handle_remove(w->t, fh, w->type) != NULL;
	}
	return NULL;
}

Test(handle_table, threads_get_their_own_pointer, .timeout = 300)
{
	/* As many slots as threads: every slot is reused by every thread. */
	struct handle_table *t = table(OWN_THREADS);
	struct own_worker w[OWN_THREADS] = { 0 };
	pthread_t tid[OWN_THREADS];
	int objs[OWN_THREADS + 1];
	uint64_t fh;

	for (int i = 0; i < OWN_THREADS; i++) {
		w[i].t = t;
		w[i].type = (enum handle_type)(HANDLE_FILE + i % 3);
		cr_assert_eq(pthread_create(&tid[i], NULL, own_run, &w[i]), 0);
	}
	for (int i = 0; i < OWN_THREADS; i++) {
		cr_assert_eq(pthread_join(tid[i], NULL), 0);
		cr_expect_eq(w[i].errors, 0, "thread %d: %ld errors", i, w[i].errors);
	}
	cr_assert_eq(handle_count(t), 0);

	/* No slot leaked from the free list. */
	for (int i = 0; i < OWN_THREADS; i++)
		cr_assert_eq(handle_add(t, HANDLE_FILE, &objs[i], &fh), 0);
	cr_assert_eq(handle_add(t, HANDLE_FILE, &objs[OWN_THREADS], &fh), -EMFILE);
	handle_table_free(t);
}

/*
 * Each thread frees its first handle while it still holds its second: pop i,
 * pop j, push i, the sequence after which a pop that read i's next (j)
 * before being preempted would hand j out a second time, were the free list
 * head not tagged. Eight threads, more than most machines have CPUs, so
 * that pops get preempted.
 */
#define ABA_THREADS	8
#define ABA_ITERS	100000

struct aba_worker {
	struct handle_table *t;
	char objs[2];
	long errors;
};

static void *aba_run(void *arg)
{
	struct aba_worker *w = arg;

	for (int i = 0; i < ABA_ITERS; i++) {
		uint64_t fa, fb;

		/* Never full: each thread holds at most two of the 2 * ABA_THREADS slots. */
		if (handle_add(w->t, HANDLE_FILE, &w->objs[0], &fa) != 0 ||
		    handle_add(w->t, HANDLE_FILE, &w->objs[1], &fb) != 0) {
			w->errors++;
			return NULL;
		}
		w->errors += handle_remove(w->t, fa, HANDLE_FILE) != &w->objs[0];
		w->errors += handle_get(w->t, fb, HANDLE_FILE) != &w->objs[1];
		w->errors += handle_remove(w->t, fb, HANDLE_FILE) != &w->objs[1];
	}
	return NULL;
}

Test(handle_table, free_list_survives_interleaved_pops, .timeout = 300)
{
	struct handle_table *t = table(2 * ABA_THREADS);
	struct aba_worker w[ABA_THREADS] = { 0 };
	pthread_t tid[ABA_THREADS];

	for (int i = 0; i < ABA_THREADS; i++) {
		w[i].t = t;
		cr_assert_eq(pthread_create(&tid[i], NULL, aba_run, &w[i]), 0);
	}
	for (int i = 0; i < ABA_THREADS; i++) {
		cr_assert_eq(pthread_join(tid[i], NULL), 0);
		cr_expect_eq(w[i].errors, 0, "thread %d: %ld errors", i, w[i].errors);
	}
	cr_assert_eq(handle_count(t), 0);
	handle_table_free(t);
}

/*
 * Writers add, publish and remove fhs over a table so small that every slot
 * is reused constantly; getters look the published fhs up. Every object
 * carries its type, and the fh it was added under once its writer has it, so
 * a lookup that returns an object of another generation or type is caught.
 *
 * The strict getter reads the published fh with acquire, so the object's fh
 * is always stamped when it looks. The relaxed getter takes fhs as the
 * kernel hands them over, with no ordering of ours: only the table's own
 * release and acquire make an object's contents visible to it, and TSan
 * reports a race on the type if they do not; the stamp may still be 0 then.
 */
#define RACE_WRITERS	3
/* Enough that a handle_get without its re-check of the word fails every run
 * (100k with a single getter missed it in most runs). */
#define RACE_ITERS	1000000

struct race_obj {
	enum handle_type type;	/* set before the add: plain, for TSan */
	_Atomic uint64_t fh;	/* set after the add returns */
};

struct race_writer {
	struct handle_table *t;
	enum handle_type type;
	struct race_obj *objs;	/* one per add: never reused while getters run */
	_Atomic uint64_t published;
	long errors;
};

struct race_getter {
	struct race_writer *w;
	atomic_bool *done;
	bool strict;
	long errors;
	long hits;
	long lookups;
};

static void *race_write(void *arg)
{
	struct race_writer *w = arg;

	for (int i = 0; i < RACE_ITERS; i++) {
		struct race_obj *obj = &w->objs[i];
		uint64_t fh;

		obj->type = w->type;
		if (handle_add(w->t, w->type, obj, &fh) != 0) {
			w->errors++;
			continue;
		}
		atomic_store_explicit(&obj->fh, fh, memory_order_relaxed);
		atomic_store_explicit(&w->published, fh, memory_order_release);
		w->errors += handle_get(w->t, fh, w->type) != obj;
		w->errors += handle_remove(w->t, fh, w->type) != obj;
	}
	return NULL;
}

static void *race_get(void *arg)
{
	struct race_getter *g = arg;
	static const enum handle_type types[] = { HANDLE_FILE, HANDLE_DIR, HANDLE_SPECIAL };
	memory_order mo = g->strict ? memory_order_acquire : memory_order_relaxed;

	while (!atomic_load(g->done)) {
		for (int k = 0; k < RACE_WRITERS; k++) {
			uint64_t fh = atomic_load_explicit(&g->w[k].published, mo);

			if (fh == 0)
				continue;
			for (int j = 0; j < 3; j++) {
				struct race_obj *p = handle_get(g->w[k].t, fh, types[j]);
				uint64_t stamped;

				g->lookups++;
				if (!p)
					continue;
				g->hits++;
				stamped = atomic_load_explicit(&p->fh, memory_order_relaxed);
				if (p->type != types[j] || stamped != fh) {
					if (stamped != 0 || g->strict)
						g->errors++;
				}
			}
		}
	}
	return NULL;
}

Test(handle_table, racing_getters_never_see_other_generation, .timeout = 300)
{
	/* One slot more than writers: each writer holds at most one. */
	struct handle_table *t = table(RACE_WRITERS + 1);
	struct race_writer w[RACE_WRITERS];
	atomic_bool done = false;
	struct race_getter g[2] = {
		{ .w = w, .done = &done, .strict = true },
		{ .w = w, .done = &done, .strict = false },
	};
	pthread_t wt[RACE_WRITERS], gt[2];

	for (int i = 0; i < RACE_WRITERS; i++) {
		w[i] = (struct race_writer){ .t = t, .type = (enum handle_type)(HANDLE_FILE + i) };
		w[i].objs = calloc(RACE_ITERS, sizeof(*w[i].objs));
		cr_assert_not_null(w[i].objs);
	}
	for (int i = 0; i < 2; i++)
		cr_assert_eq(pthread_create(&gt[i], NULL, race_get, &g[i]), 0);
	for (int i = 0; i < RACE_WRITERS; i++)
		cr_assert_eq(pthread_create(&wt[i], NULL, race_write, &w[i]), 0);
	for (int i = 0; i < RACE_WRITERS; i++)
		cr_assert_eq(pthread_join(wt[i], NULL), 0);
	atomic_store(&done, true);
	for (int i = 0; i < 2; i++)
		cr_assert_eq(pthread_join(gt[i], NULL), 0);

	for (int i = 0; i < RACE_WRITERS; i++)
		cr_expect_eq(w[i].errors, 0, "writer %d: %ld errors", i, w[i].errors);
	for (int i = 0; i < 2; i++) {
		const char *kind = g[i].strict ? "strict" : "relaxed";

		cr_log_info("%s getter: %ld lookups, %ld hits", kind, g[i].lookups, g[i].hits);
		cr_expect_eq(g[i].errors, 0, "%s getter got %ld objects of another fh", kind,
			     g[i].errors);
	}
	cr_assert_eq(handle_count(t), 0);
	for (int i = 0; i < RACE_WRITERS; i++)
		free(w[i].objs);
	handle_table_free(t);
}

static void drain_cb(enum handle_type type, void *obj, void *arg)
{
	int *seen = arg;
	cr_assert_eq(*(int *)obj, (int)type, "object of type %d handed back as %d", *(int *)obj, type);
	seen[type]++;
}

Test(handle_table, drain_hands_back_every_live_handle)
{
	struct handle_table *t;
	int objs[3] = { HANDLE_FILE, HANDLE_DIR, HANDLE_SPECIAL };
	int seen[4] = { 0 };
	uint64_t fh[3], gone;

	cr_assert_eq(handle_table_new(64, &t), 0);
	for (int i = 0; i < 3; i++)
		cr_assert_eq(handle_add(t, (enum handle_type)objs[i], &objs[i], &fh[i]), 0);
	cr_assert_eq(handle_add(t, HANDLE_FILE, &objs[0], &gone), 0);
	cr_assert_eq(handle_remove(t, gone, HANDLE_FILE), &objs[0]);
	handle_table_drain(t, drain_cb, seen);
	cr_assert_eq(seen[HANDLE_FILE], 1);
	cr_assert_eq(seen[HANDLE_DIR], 1);
	cr_assert_eq(seen[HANDLE_SPECIAL], 1);
	cr_assert_eq(handle_count(t), 0);
	cr_assert_null(handle_get(t, fh[1], HANDLE_DIR));
	handle_table_free(t);
}

struct seen {
	uint64_t fh[8];
	enum handle_type type[8];
	void *obj[8];
	size_t n;
};

static void note(uint64_t fh, enum handle_type type, void *obj, void *arg)
{
	struct seen *s = arg;

	cr_assert_lt(s->n, 8u);
	s->fh[s->n] = fh;
	s->type[s->n] = type;
	s->obj[s->n++] = obj;
}

/* ferry mount --upgrade: what one table hands out, another takes up under
 * the same fh numbers, and then gives out only fhs of its own. */
Test(handle_table, each_then_restore_in_a_new_table)
{
	struct handle_table *t = table(16), *u = table(16);
	struct seen s = { .n = 0 };
	int a, b, c, d;
	uint64_t fa, fb, fc, fd;

	cr_assert_eq(handle_add(t, HANDLE_FILE, &a, &fa), 0);
	cr_assert_eq(handle_add(t, HANDLE_DIR, &b, &fb), 0);
	cr_assert_eq(handle_add(t, HANDLE_SPECIAL, &c, &fc), 0);
	cr_assert_eq(handle_remove(t, fb, HANDLE_DIR), &b);
	handle_table_each(t, note, &s);
	cr_assert_eq(s.n, 2u);
	cr_assert_eq(handle_count(t), 2u, "each leaves the handles live");

	cr_assert_eq(handle_table_restore(u, s.fh, s.type, s.obj, s.n), 0);
	cr_assert_eq(handle_count(u), 2u);
	cr_assert_eq(handle_get(u, fa, HANDLE_FILE), &a);
	cr_assert_eq(handle_get(u, fc, HANDLE_SPECIAL), &c);
	cr_assert_null(handle_get(u, fa, HANDLE_DIR), "the type came along");
	cr_assert_eq(handle_table_restore(u, s.fh, s.type, s.obj, s.n), -EBUSY);
	/* New handles take free slots, never a restored one's. */
	for (int k = 0; k < 10; k++) {
		cr_assert_eq(handle_add(u, HANDLE_FILE, &d, &fd), 0);
		cr_assert_neq(fd & FH_IDX_MASK, fa & FH_IDX_MASK);
		cr_assert_neq(fd & FH_IDX_MASK, fc & FH_IDX_MASK);
	}
	cr_assert_eq(handle_get(u, fa, HANDLE_FILE), &a);
	handle_table_free(t);
	handle_table_free(u);
}

Test(handle_table, restore_refuses_bad_fhs)
{
	struct handle_table *u = table(16);
	int a;
	void *objs[2] = { &a, &a };
	enum handle_type types[2] = { HANDLE_FILE, HANDLE_FILE };
	uint64_t out_of_table[1] = { (UINT64_C(5) << 24) | 9999 };
	uint64_t gen0[1] = { 3 };
	uint64_t twice[2] = { (UINT64_C(5) << 24) | 3, (UINT64_C(6) << 24) | 3 };
	enum handle_type bad_type[1] = { (enum handle_type)77 };
	uint64_t ok[1] = { (UINT64_C(5) << 24) | 3 };

	cr_assert_eq(handle_table_restore(u, out_of_table, types, objs, 1), -EINVAL);
	cr_assert_eq(handle_table_restore(u, gen0, types, objs, 1), -EINVAL);
	cr_assert_eq(handle_table_restore(u, ok, bad_type, objs, 1), -EINVAL);
	u = (handle_table_free(u), table(16));
	cr_assert_eq(handle_table_restore(u, twice, types, objs, 2), -EINVAL);
	handle_table_free(u);
}
