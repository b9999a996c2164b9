/*
 * gc: gives the object store back what no file refers to any more.
 *
 * The metadata engine keeps garbage slices (meta_gc_list: deleted and
 * truncated files, and data that later writes hid wholly, dropped from
 * its chunk at commit). Once a slice has been garbage for the grace period
 * (-o gc_grace=SEC, default 300 s) this thread deletes its objects and then
 * forgets it. The grace is for readers that resolved a file's slices just
 * before they became garbage: they still find the objects they resolved.
 * A deletion that fails (the store is away) leaves the slice listed, and
 * it is tried again at the next round; a missing object counts as deleted.
 *
 * The grace is measured on two clocks, and a slice goes only when both say
 * it has passed. Its row carries the wall-clock time it became garbage
 * (gc_slice.since), which is all a slice freed before this process
 * started can tell; but the wall clock jumps, and a step forward of a day
 * would make every slice look a day old at once. So each round also stamps
 * the slices it sees for the first time with a mark (meta_gc_mark: numbers
 * that grow) and notes the CLOCK_MONOTONIC time it made the mark: a slice
 * stamped with a mark made a grace ago has been garbage that long. A slice
 * stamped by an earlier process counts as seen by this one's first mark.
 * A step back delays the slices freed before it (their `since` lies ahead
 * of the clock), by at most the step; those freed after it go on time.
 *
 * Owned by struct mountd (gc_start/gc_stop), one thread, woken every
 * GC_INTERVAL_S or by gc_poke().
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "log.h"
#include "meta_dump.h"
#include "mountd.h"
#include "slice.h"

#define GC_INTERVAL_S 10
#define GC_BATCH 256
/* Marks younger than the grace: at most GC_MARKS_PER_GRACE + 1 of them (a
 * new one waits for grace / GC_MARKS_PER_GRACE after the last), plus the
 * newest older one, which is the one that is due. */
#define GC_MARKS_PER_GRACE 32
#define GC_MARKS (GC_MARKS_PER_GRACE + 2)

/* The marks this process made that may still matter, oldest first. */
struct gc_marks {
	int64_t mark[GC_MARKS];
	int64_t made_ns[GC_MARKS]; /* CLOCK_MONOTONIC */
	int n;
	int64_t next;              /* 0: not known yet (meta_gc_last_mark) */
	/* The volume's own slice ids start here (meta_dump.h): a restored
	 * volume's slices below it are its origin's objects, only forgotten. */
	uint64_t slice_base;
	bool base_known;
};

/* Deletes the objects of one slice: 0, or the store's error. */
static int slice_objects_delete(struct mountd *md, const struct meta_gc_item *it)
{
	uint32_t bs = md->vol.block_size;
	uint32_t nobj = it->size / bs + (it->size % bs != 0);
	char key[SLICE_KEY_MAX];

	for (uint32_t i = 0; i < nobj; i++) {
		int rc;

		slice_object_key(it->id, i, it->size, bs, key, sizeof(key));
		rc = objstore_delete(md->store, key);
		if (rc < 0 && rc != -ENOENT)
			return rc;
		atomic_fetch_add(&md->stats.gc_objects_deleted, 1);
	}
	return 0;
}

/*
 * Stamps the slices seen for the first time with a new mark, unless the
 * last one is too recent to need another. Drops the marks that no longer
 * matter: all but the newest of those made a grace ago.
 */
static void marks_update(struct mountd *md, struct gc_marks *k)
{
	int64_t grace_ns = md->gc_grace_s * 1000000000, now = mono_now_ns();
	int rc;

	while (k->n >= 2 && now - k->made_ns[1] >= grace_ns) {
		memmove(k->mark, k->mark + 1, (size_t)(k->n - 1) * sizeof(k->mark[0]));
		memmove(k->made_ns, k->made_ns + 1, (size_t)(k->n - 1) * sizeof(k->made_ns[0]));
		k->n--;
	}
	if (k->next == 0) {
		int64_t last;

		rc = meta_gc_last_mark(md->meta, &last);
		if (rc < 0) {
			log_errno(rc, "gc: cannot read the last mark (will retry)");
			return;
		}
		k->next = last + 1;
	}
	if (k->n == GC_MARKS ||
	    (k->n && now - k->made_ns[k->n - 1] < grace_ns / GC_MARKS_PER_GRACE))
		return;
	rc = meta_gc_mark(md->meta, k->next);
	if (rc < 0) {
		log_errno(rc, "gc: cannot mark the new garbage (will retry)");
		return;
	}
	/* Taken after the stamp: every slice it stamped was garbage by then. */
	k->made_ns[k->n] = mono_now_ns();
	k->mark[k->n++] = k->next++;
}

/* The newest mark made at least the grace ago, or 0 (none yet). */
static int64_t marks_due(struct mountd *md, const struct gc_marks *k)
{
	int64_t grace_ns = md->gc_grace_s * 1000000000, now = mono_now_ns();

	for (int i = k->n - 1; i >= 0; i--)
		if (now - k->made_ns[i] >= grace_ns)
			return k->mark[i];
	return 0;
}

/* One round: what is due, in batches. Returns false if the store failed. */
static bool gc_round(struct mountd *md, struct gc_marks *k)
{
	int64_t due;

	if (!k->base_known) {
		int rc = meta_slice_range_base(md->meta, &k->slice_base);
		if (rc < 0) {
			log_errno(rc, "gc: cannot read the volume's slice range (will retry)");
			return true;
		}
		k->base_known = true;
	}
	marks_update(md, k);
	due = marks_due(md, k);
	if (due == 0)
		return true;
	for (;;) {
		struct meta_gc_item *items = NULL;
		size_t n = 0, done;
		int rc = meta_gc_list(md->meta, due, (int64_t)time(NULL) - md->gc_grace_s, GC_BATCH,
				      &items, &n);

		if (rc < 0) {
			log_errno(rc, "gc: cannot list garbage slices");
			return false;
		}
		for (done = 0; done < n; done++) {
			pthread_mutex_lock(&md->gc_lock);
			bool stop = md->gc_stop;
			pthread_mutex_unlock(&md->gc_lock);
			if (stop)
				break;
			rc = meta_slice_id_ours(k->slice_base, items[done].id) ?
				     slice_objects_delete(md, &items[done]) : 0;
			if (rc < 0) {
				log_errno(rc, "gc: cannot delete the objects of slice %llu%s%s (will "
					  "retry)", (unsigned long long)items[done].id,
					  *objstore_last_error() ? ": " : "", objstore_last_error());
				break;
			}
			atomic_fetch_add(&md->stats.gc_bytes_freed, items[done].size);
		}
		rc = meta_gc_forget(md->meta, items, done);
		if (rc < 0)
			log_errno(rc, "gc: cannot forget %zu deleted slices (their deletion is "
				  "repeated later)", done);
		free(items);
		if (done < n)
			return false;
		if (n < GC_BATCH)
			return true;
	}
}

static void *gc_main(void *arg)
{
	struct mountd *md = arg;
	struct gc_marks k = { .n = 0 };

	pthread_mutex_lock(&md->gc_lock);
	while (!md->gc_stop) {
		struct timespec until;

		if (!md->gc_poked) {
			/* Every GC_INTERVAL_S, or as often as the grace asks
			 * for when it is shorter (tests: gc_grace=0). */
			mono_deadline_ms(&until, 1000L * (md->gc_grace_s >= GC_INTERVAL_S ? GC_INTERVAL_S :
							  md->gc_grace_s > 1 ? md->gc_grace_s : 1));
			pthread_cond_timedwait(&md->gc_cond, &md->gc_lock, &until);
			if (md->gc_stop)
				break;
		}
		md->gc_poked = false;
		pthread_mutex_unlock(&md->gc_lock);
		/* A fenced mount's writes all fail: the new holder collects. */
		if (!atomic_load(&md->lease_fenced))
			gc_round(md, &k);
		(void)local_copy_room_check(md, NULL);
		atomic_fetch_add(&md->stats.gc_rounds, 1);
		pthread_mutex_lock(&md->gc_lock);
	}
	pthread_mutex_unlock(&md->gc_lock);
	return NULL;
}

int gc_start(struct mountd *md)
{
	int rc;

	pthread_mutex_init(&md->gc_lock, NULL);
	mono_cond_init(&md->gc_cond);
	md->gc_stop = false;
	rc = pthread_create(&md->gc_thread, NULL, gc_main, md);
	md->gc_live = rc == 0;
	return -rc;
}

void gc_poke(struct mountd *md)
{
	if (!md->gc_live)
		return;
	pthread_mutex_lock(&md->gc_lock);
	md->gc_poked = true;
	pthread_cond_signal(&md->gc_cond);
	pthread_mutex_unlock(&md->gc_lock);
}

void gc_stop(struct mountd *md)
{
	if (!md->gc_live)
		return;
	pthread_mutex_lock(&md->gc_lock);
	md->gc_stop = true;
	pthread_cond_signal(&md->gc_cond);
	pthread_mutex_unlock(&md->gc_lock);
	pthread_join(md->gc_thread, NULL);
	md->gc_live = false;
	pthread_mutex_destroy(&md->gc_lock);
	pthread_cond_destroy(&md->gc_cond);
}
