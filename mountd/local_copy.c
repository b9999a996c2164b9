/*
 * Local copies: the staging file of a passthrough writer's last close,
 * kept after its commit as the file's whole local copy (see mountd.h).
 *
 * Ownership: the copy's name (i->kept_name) and the file it names belong
 * to the inode, under i->lock; its place in the eviction order and the
 * bytes all copies hold, to md->kept_lock (lock order: i->lock, then
 * kept_lock; the eviction, which goes the other way, only try-locks). The
 * kernel's passthrough opens on the copy hold its backing id (i->kept_id)
 * until the last of them closes. A copy holds one reference (nopen) of its
 * inode, given back when the copy goes.
 *
 * The copy is the committed file only while nothing changed it since its
 * content was committed: by its job (the last one the reconciler reported
 * committed for the inode, committed_seq), or before a close that found
 * nothing left to commit; and the committed data has not moved since
 * (layout_gen == kept_gen, taken then), the test a writer's copy-in from a
 * job's staging file makes. While readers share it nothing can change the file
 * without taking it over first (local_copy_before_change()): every
 * writer's open and every truncate does, and the kernel lets no cached open
 * in meanwhile. A mapping made through the copy outlives its reader's close:
 * a change then takes the copy over too, and the eviction leaves it.
 */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"
#include "mountd.h"
#include "proc_live.h"

/* The last part of copies' names: unique among this daemon's. */
static _Atomic uint64_t serial;

/* Caller holds md->kept_lock. */
static void order_unlink(struct mountd *md, struct inode *i)
{
	if (i->kprev)
		i->kprev->knext = i->knext;
	else if (md->kept_oldest == i)
		md->kept_oldest = i->knext;
	if (i->knext)
		i->knext->kprev = i->kprev;
	else if (md->kept_newest == i)
		md->kept_newest = i->kprev;
	i->kprev = i->knext = NULL;
}

/* Caller holds md->kept_lock. */
static void order_append(struct mountd *md, struct inode *i)
{
	i->knext = NULL;
	i->kprev = md->kept_newest;
	if (md->kept_newest)
		md->kept_newest->knext = i;
	else
		md->kept_oldest = i;
	md->kept_newest = i;
}

/* Records i->kept_name (set, its bytes counted in kept_bytes) as the
 * committed file now, newest in the eviction order. Caller holds i->lock,
 * not kept_lock. */
static void copy_record_current(struct mountd *md, struct inode *i, uint64_t size)
{
	i->kept_seq = 0;
	i->kept_size = size;
	i->kept_committed = true;
	pthread_mutex_lock(&i->layout_lock);
	i->kept_gen = i->layout_gen;
	pthread_mutex_unlock(&i->layout_lock);
	pthread_mutex_lock(&md->kept_lock);
	order_append(md, i);
	pthread_mutex_unlock(&md->kept_lock);
}

/* Forgets the copy's record (not its place in the order, nor its bytes). */
static void copy_record_clear(struct inode *i)
{
	free(i->kept_name);
	i->kept_name = NULL;
	i->kept_seq = i->kept_size = 0;
	i->kept_shared = i->kept_committed = i->kept_built = false;
}

/* Removes the copy's file and record. Caller holds i->lock and kept_lock;
 * nobody reads the copy (i->nkept == 0). */
static void copy_remove(struct mountd *md, struct inode *i)
{
	if (unlinkat(md->staging_dirfd, i->kept_name, 0) < 0 && errno != ENOENT)
		log_warn("cannot remove local copy %s", i->kept_name);
	order_unlink(md, i);
	md->kept_bytes -= i->kept_size;
	copy_record_clear(i);
	atomic_fetch_add(&md->stats.local_copies_dropped, 1);
}

/*
 * Whether something may still hold the copy open although no reader of
 * ours does: a mapping a reader made through it (passthrough maps the copy
 * itself) outlives the reader's close. The kernel grants a write lease only
 * on a file nobody else holds open (fs/locks.c); a refusal for any other
 * reason (no lease support, the kernel not done with a close yet) counts
 * as mapped: the caller then takes the copy over, which is always right.
 * Caller holds i->lock (or has it try-locked); i->nkept is 0.
 */
static bool copy_mapped(struct mountd *md, struct inode *i, int tries)
{
	static _Atomic bool told;
	bool mapped = true;
	int fd;

	/* Only a reader's passthrough open can map it. */
	if (!i->kept_shared)
		return false;
	fd = openat(md->staging_dirfd, i->kept_name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return errno != ENOENT;
	/* Right after a close the closing task may not have let go of its
	 * open yet (wstate_mapped_at_release() waits the same way). */
	for (int k = 0; k < tries && mapped; k++) {
		if (fcntl(fd, F_SETLEASE, F_WRLCK) == 0) {
			(void)fcntl(fd, F_SETLEASE, F_UNLCK);
			mapped = false;
		} else if (errno != EAGAIN && errno != EBUSY) {
			/* Cannot tell (no leases here): as for staging files
			 * (wstate_mapped()), taken as not mapped, said once. */
			if (!atomic_exchange(&told, true))
				log_warn("cannot tell whether a mapping outlives the close of a local "
					 "copy (F_SETLEASE); such a mapping may miss later changes");
			mapped = false;
		} else if (k + 1 < tries) {
			sched_yield();
		}
	}
	close(fd);
	return mapped;
}

/* At most this many copies go in one eviction (their references are given
 * back once kept_lock is released): a copy that needs more room than that
 * frees is not made, and a low staging filesystem loses this many unread
 * copies per hand-off. */
#define EVICT_MAX 64

/* Evicts unread copies (built_only: only copies built from reads), oldest
 * first, until need more bytes fit under the limit (at most EVICT_MAX); each one's inode goes in gone[], whose
 * reference the caller gives back (copy_unref_all()) once it has let
 * kept_lock go: it may be the last. Caller holds kept_lock and self->lock. */
static bool room_make(struct mountd *md, struct inode *self, uint64_t need, bool built_only,
		      struct inode **gone, size_t *ngone)
{
	struct inode *v = md->kept_oldest, *next;

	if (need > md->local_copy_max)
		return false; /* never fits: evict nothing for it */
	for (; v && *ngone < EVICT_MAX && md->kept_bytes + need > md->local_copy_max; v = next) {
		next = v->knext;
		if (v == self || pthread_mutex_trylock(&v->lock) != 0)
			continue;
		/* A mapped copy stays: the next change must go through it. */
		if (v->nkept == 0 && v->kept_name && (v->kept_built || !built_only) &&
		    !copy_mapped(md, v, 1)) {
			copy_remove(md, v);
			gone[(*ngone)++] = v;
		}
		pthread_mutex_unlock(&v->lock);
	}
	return md->kept_bytes + need <= md->local_copy_max;
}

/* Gives back the references of evicted copies (see room_make). */
static void copy_unref_all(struct mountd *md, struct inode **gone, size_t n)
{
	for (size_t k = 0; k < n; k++)
		inode_unref(md, gone[k], 0, 1);
}

/* Room for a copy of size bytes of self, evicting older unread ones:
 * true and the bytes counted in kept_bytes (a reservation the copy's
 * record keeps, or local_copy_unreserve() gives back), or false. Caller
 * holds self->lock, not kept_lock. */
static bool copy_reserve(struct mountd *md, struct inode *self, uint64_t size, bool built_only)
{
	struct inode *gone[EVICT_MAX];
	size_t ngone = 0;
	bool room;

	pthread_mutex_lock(&md->kept_lock);
	room = room_make(md, self, size, built_only, gone, &ngone);
	if (room)
		md->kept_bytes += size;
	pthread_mutex_unlock(&md->kept_lock);
	copy_unref_all(md, gone, ngone);
	return room;
}

void local_copy_unreserve(struct mountd *md, uint64_t size)
{
	pthread_mutex_lock(&md->kept_lock);
	md->kept_bytes -= size;
	pthread_mutex_unlock(&md->kept_lock);
}

bool local_copy_room_check(struct mountd *md, struct inode *self)
{
	struct inode *gone[EVICT_MAX];
	size_t ngone = 0;

	if (!staging_room_low(md))
		return false;
	/* Writers need the space more: the unread copies go. */
	do {
		ngone = 0;
		pthread_mutex_lock(&md->kept_lock);
		if (md->kept_oldest)
			(void)room_make(md, self, md->local_copy_max, false, gone, &ngone);
		pthread_mutex_unlock(&md->kept_lock);
		copy_unref_all(md, gone, ngone);
	} while (ngone == EVICT_MAX);
	return true;
}

void local_copy_keep(struct mountd *md, struct inode *i)
{
	char name[64];
	bool room;

	local_copy_drop(md, i); /* a new job: the old copy is not the file any more */
	if (!md->local_copy_max || inode_is_unlinked(md, i)) /* nobody could open it */
		return;
	/* Looked at on every hand-off, not only those that could be kept:
	 * once space is low, new writers take the daemon path, and theirs
	 * could never be. */
	if (local_copy_room_check(md, i)) {
		atomic_fetch_add(&md->stats.local_copies_skipped, 1);
		return;
	}
	/* Without leases a writer's mapping may outlive the close unseen
	 * (wstate_mapped()) and write on into the copy. */
	if (!i->inflight_whole || !i->inflight_seq || i->kept_name ||
	    i->inflight_size < LOCAL_COPY_MIN || i->inflight_size > md->pt_copy_max ||
	    wstate_lease_unknown())
		return;
	room = copy_reserve(md, i, i->inflight_size, false); /* while the link is made */
	if (!room) {
		atomic_fetch_add(&md->stats.local_copies_skipped, 1);
		return;
	}
	snprintf(name, sizeof(name), ".kept-%d-%llu-%llu", (int)md->pid, (unsigned long long)i->ino,
		 (unsigned long long)atomic_fetch_add(&serial, 1));
	/* The reconciler may have committed and removed the job's file
	 * already (ENOENT): no copy then. */
	bool linked = linkat(md->staging_dirfd, i->inflight_name, md->staging_dirfd, name, 0) == 0;
	if (!linked || !(i->kept_name = strdup(name))) {
		if (errno != ENOENT)
			log_warn("cannot keep staging file %s as a local copy", i->inflight_name);
		if (linked)
			unlinkat(md->staging_dirfd, name, 0);
		local_copy_unreserve(md, i->inflight_size);
		atomic_fetch_add(&md->stats.local_copies_skipped, 1);
		return;
	}
	i->kept_seq = i->inflight_seq;
	i->kept_size = i->inflight_size;
	i->kept_committed = false;
	inode_ref(md, i->ino, 0, 1); /* the copy's: it outlives the kernel's FORGET */
	pthread_mutex_lock(&md->kept_lock);
	order_append(md, i);
	pthread_mutex_unlock(&md->kept_lock);
	atomic_fetch_add(&md->stats.local_copies_made, 1);
}

bool local_copy_keep_unchanged(struct mountd *md, struct inode *i)
{
	struct wstate *w = i->w;
	const char *from = w ? strrchr(w->path, '/') + 1 : NULL;
	char name[64];
	uint64_t size;
	bool room;

	/* Only a file whose content this write state set up after every
	 * earlier run's job was committed, whose flushes did not fail, and
	 * that no mapping can still be writing (unknowable without leases). */
	if (!md->local_copy_max || inode_is_unlinked(md, i) || !w || !w->passthrough ||
	    !w->born_ready || w->copy_torn ||
	    w->npt > 0 || i->kept_name || i->inflight_seq || w->size < LOCAL_COPY_MIN ||
	    w->size > md->pt_copy_max || !atomic_load(&md->layout_ready) ||
	    wstate_lease_unknown() || staging_room_low(md))
		return false;
	size = w->size;
	room = copy_reserve(md, i, size, false);
	if (!room) {
		atomic_fetch_add(&md->stats.local_copies_skipped, 1);
		return false;
	}
	snprintf(name, sizeof(name), ".kept-%d-%llu-u%llu", (int)md->pid, (unsigned long long)i->ino,
		 (unsigned long long)atomic_fetch_add(&serial, 1));
	if (renameat(md->staging_dirfd, from, md->staging_dirfd, name) < 0 ||
	    !(i->kept_name = strdup(name))) {
		log_warn("cannot keep staging file %s as a local copy", from);
		if (i->kept_name == NULL && faccessat(md->staging_dirfd, name, F_OK,
						      AT_SYMLINK_NOFOLLOW) == 0)
			(void)renameat(md->staging_dirfd, name, md->staging_dirfd, from);
		local_copy_unreserve(md, size);
		atomic_fetch_add(&md->stats.local_copies_skipped, 1);
		return false;
	}
	inode_ref(md, i->ino, 0, 1); /* the copy's: it outlives the kernel's FORGET */
	copy_record_current(md, i, size);
	wstate_forget(md, i); /* the file is the copy now */
	atomic_fetch_add(&md->stats.local_copies_made, 1);
	return true;
}

bool local_copy_install(struct mountd *md, struct inode *i, const char *name, uint64_t size,
			uint64_t gen)
{
	char *own;

	/* Nothing changed the file since gen, and nothing is changing it:
	 * no write state, no job in flight (each moves layout_gen when it
	 * commits), no name gone. */
	if (i->kept_name || i->w || i->inflight_seq || inode_is_unlinked(md, i) ||
	    !atomic_load(&md->layout_ready) || atomic_load(&md->lease_fenced) ||
	    !(own = strdup(name)))
		return false;
	pthread_mutex_lock(&i->layout_lock);
	if (i->layout_gen != gen) {
		pthread_mutex_unlock(&i->layout_lock);
		free(own);
		return false;
	}
	i->kept_gen = gen;
	pthread_mutex_unlock(&i->layout_lock);
	i->kept_name = own;
	i->kept_seq = 0;
	i->kept_size = size;
	i->kept_committed = true;
	i->kept_built = true;
	inode_ref(md, i->ino, 0, 1); /* the copy's: it outlives the kernel's FORGET */
	pthread_mutex_lock(&md->kept_lock);
	order_append(md, i);
	pthread_mutex_unlock(&md->kept_lock);
	return true;
}

bool local_copy_reserve(struct mountd *md, struct inode *i, uint64_t size)
{
	return copy_reserve(md, i, size, true);
}

enum copy_state {
	COPY_PENDING, /* its job is in flight: it will be the file once committed */
	COPY_CURRENT, /* the committed file, byte for byte */
	COPY_STALE,   /* something changed the file since, or its job failed */
};

/* Where the copy stands. Caller holds i->lock; i->kept_name is set. */
static enum copy_state copy_state(struct mountd *md, struct inode *i)
{
	bool same;

	if (i->w)
		return COPY_STALE;
	if (i->inflight_seq)
		return i->inflight_seq == i->kept_seq && !i->kept_committed ? COPY_PENDING
									    : COPY_STALE;
	if (!i->kept_committed) {
		/* Its job is over: committed, if it is the last the
		 * reconciler reported for the inode (job_committed()). */
		if (i->kept_seq != i->committed_seq)
			return COPY_STALE;
		i->kept_committed = true;
		i->kept_gen = i->committed_gen;
	}
	/* With jobs of an earlier run still to commit unannounced, no layout
	 * is known for sure: the copy may be right, but is not used. */
	if (!atomic_load(&md->layout_ready))
		return COPY_STALE;
	pthread_mutex_lock(&i->layout_lock);
	same = i->layout_gen == i->kept_gen;
	pthread_mutex_unlock(&i->layout_lock);
	return same ? COPY_CURRENT : COPY_STALE;
}

int local_copy_share(struct mountd *md, struct inode *i)
{
	int fd, id;

	if (i->nkept == 0) {
		enum copy_state st = copy_state(md, i);

		if (st == COPY_STALE)
			local_copy_drop(md, i);
		if (st != COPY_CURRENT || atomic_load(&md->pt_off))
			return 0;
	}
	if (i->kept_id <= 0) {
		fd = openat(md->staging_dirfd, i->kept_name, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
		if (fd < 0) {
			log_warn("cannot open local copy %s", i->kept_name);
			return 0;
		}
		/* Read and write: a writer that comes while readers share it
		 * writes through this registration too. fd stays open: a
		 * takeover makes it the staging file's. */
		id = backing_open(md, fd);
		if (id <= 0) {
			close(fd);
			passthrough_unavailable(md, i->ino, id);
			return 0;
		}
		i->kept_id = id;
		i->kept_fd = fd;
	}
	i->kept_shared = true;
	pthread_mutex_lock(&md->kept_lock);
	order_unlink(md, i);
	order_append(md, i);
	pthread_mutex_unlock(&md->kept_lock);
	atomic_fetch_add(&md->stats.local_copy_opens, 1);
	return i->kept_id;
}

int local_copy_unshare(struct mountd *md, struct inode *i)
{
	int id = i->kept_id;

	(void)md;
	if (i->nkept > 0)
		return 0;
	i->kept_id = 0;
	if (i->kept_fd >= 0)
		close(i->kept_fd); /* the id holds the file until it is closed */
	i->kept_fd = -1;
	return id;
}

/* Makes the copy the inode's passthrough staging file. Even where the change
 * empties it next, all of it is fingerprinted: a staging file without
 * fingerprints is taken for one that was empty in the metadata at open, and
 * its commit would store only its data extents, leaving what the committed
 * file holds in its holes (rclient_handoff()). */
static int copy_take(struct mountd *md, struct inode *i, uint64_t fh, bool flush)
{
	char *name = i->kept_name;
	int id;

	id = wstate_passthrough_adopt(md, i, fh, name, i->kept_fd, i->kept_id, i->kept_size, flush);
	if (id < 0) {
		log_errno(id, "inode %llu: cannot take its local copy over as a staging file%s",
			  (unsigned long long)i->ino,
			  i->nkept > 0 ? ", which readers share: the change is refused" : "");
		if (faccessat(md->staging_dirfd, name, F_OK, AT_SYMLINK_NOFOLLOW) == 0) {
			if (i->nkept > 0)
				return id;
			local_copy_drop(md, i); /* taken the usual way instead */
			return 0;
		}
		if (i->nkept > 0)
			return id; /* kept_name is gone: the next change is refused too */
		goto forget;   /* renamed, and gone with the failure */
	}
	atomic_fetch_add(&md->stats.local_copy_takeovers, 1);
	/* The readers' opens are the staging file's now. */
	i->w->npt += i->nkept;
	i->nkept = 0;
	i->kept_id = 0;
	if (i->kept_fd >= 0)
		close(i->kept_fd); /* the staging file holds a dup of it */
	i->kept_fd = -1;
forget:
	pthread_mutex_lock(&md->kept_lock);
	order_unlink(md, i);
	md->kept_bytes -= i->kept_size;
	pthread_mutex_unlock(&md->kept_lock);
	copy_record_clear(i); /* frees name */
	inode_unref(md, i, 0, 1); /* the copy's; never the last (see mountd.h) */
	return 0;
}

int local_copy_before_change(struct mountd *md, struct inode *i, uint64_t fh, bool flush,
			     bool writer, bool emptying)
{
	if (!i->kept_name)
		return i->nkept > 0 && !i->w ? -EBUSY : 0; /* lost by a failed takeover */
	if (i->w)
		return 0;
	if (i->nkept > 0)
		return copy_take(md, i, fh, flush);
	enum copy_state st = copy_state(md, i);
	if (st == COPY_PENDING)
		return 0; /* the change waited for its job in vain, or need not */
	if (st == COPY_STALE) {
		local_copy_drop(md, i);
		return 0;
	}
	bool mapped = copy_mapped(md, i, 16);
	/* Passthrough must still be possible: a writer then spares the
	 * copy-in; a mapping of the copy must see the change. */
	bool usable = i->ncached == 0 && !atomic_load(&md->pt_off) && md->pt_mode != PT_OFF;
	if (usable && (mapped || (writer && !emptying)))
		return copy_take(md, i, fh, flush);
	if (mapped)
		log_warnx("inode %llu: a mapping of its local copy may outlive this change, which "
			  "it will not show (cached opens keep the copy out of use)",
			  (unsigned long long)i->ino);
	local_copy_drop(md, i);
	return 0;
}

void local_copy_drop(struct mountd *md, struct inode *i)
{
	if (!i->kept_name || i->nkept > 0)
		return;
	pthread_mutex_lock(&md->kept_lock);
	copy_remove(md, i);
	pthread_mutex_unlock(&md->kept_lock);
	inode_unref(md, i, 0, 1); /* the copy's; never the last (see mountd.h) */
}

void local_copy_forget(struct mountd *md, struct inode *i)
{
	int id = i->kept_id;

	/* A copy holds a reference of its inode, so none is left here; an
	 * eviction that just dropped one may still hold i->lock until it lets
	 * kept_lock go: wait for that. */
	pthread_mutex_lock(&md->kept_lock);
	if (i->kept_name)
		copy_remove(md, i);
	pthread_mutex_unlock(&md->kept_lock);
	i->nkept = 0;
	i->kept_id = 0;
	if (i->kept_fd >= 0)
		close(i->kept_fd);
	i->kept_fd = -1;
	backing_close(md, id); /* ignores 0 */
}

void local_copy_drop_all(struct mountd *md)
{
	struct inode *v, *next, *gone[EVICT_MAX];
	size_t ngone;

	do {
		ngone = 0;
		pthread_mutex_lock(&md->kept_lock);
		for (v = md->kept_oldest; v && ngone < EVICT_MAX; v = next) {
			next = v->knext;
			if (pthread_mutex_trylock(&v->lock) != 0)
				continue;
			if (v->nkept == 0 && v->kept_name) {
				copy_remove(md, v);
				gone[ngone++] = v;
			}
			pthread_mutex_unlock(&v->lock);
		}
		pthread_mutex_unlock(&md->kept_lock);
		copy_unref_all(md, gone, ngone);
	} while (ngone == EVICT_MAX);
}

void local_copy_exit(struct mountd *md)
{
	struct inode *v;

	/* No lock of v: nothing else runs. Their backing ids went with the
	 * FUSE connection, their inode references with the inode table. */
	pthread_mutex_lock(&md->kept_lock);
	for (v = md->kept_oldest; v; v = v->knext) {
		if (!v->kept_name)
			continue;
		if (unlinkat(md->staging_dirfd, v->kept_name, 0) < 0 && errno != ENOENT)
			log_warn("cannot remove local copy %s", v->kept_name);
		md->kept_bytes -= v->kept_size;
		copy_record_clear(v);
		if (v->kept_fd >= 0)
			close(v->kept_fd);
		v->kept_fd = -1;
	}
	pthread_mutex_unlock(&md->kept_lock);
}

size_t local_copy_hand_over(struct mountd *md, struct local_copy_handed *out, size_t max)
{
	struct inode *v, *prev, *gone[EVICT_MAX];
	size_t n = 0, ngone;

	/* A fenced mount's view of the volume is not the volume's. */
	if (atomic_load(&md->lease_fenced))
		return 0;
	/* Newest first: the most recently read go over when not all can. */
	do {
		ngone = 0;
		pthread_mutex_lock(&md->kept_lock);
		for (v = md->kept_newest; v && ngone < EVICT_MAX && n < max; v = prev) {
			prev = v->kprev;
			if (pthread_mutex_trylock(&v->lock) != 0)
				continue;
			if (v->nkept == 0 && v->kept_name && copy_state(md, v) == COPY_CURRENT) {
				/* The record goes, the file stays: the name is out's. */
				out[n] = (struct local_copy_handed){ .ino = v->ino, .name = v->kept_name,
								     .size = v->kept_size,
								     .built = v->kept_built };
				n++;
				order_unlink(md, v);
				md->kept_bytes -= v->kept_size;
				v->kept_name = NULL; /* out's now */
				copy_record_clear(v);
				gone[ngone++] = v;
			}
			pthread_mutex_unlock(&v->lock);
		}
		pthread_mutex_unlock(&md->kept_lock);
		copy_unref_all(md, gone, ngone);
	} while (ngone == EVICT_MAX && n < max);
	/* The change time each was committed with and its slices' print, read
	 * once the locks are let go: the new daemon keeps only a copy whose
	 * file still has them. */
	for (size_t k = 0; k < n; k++) {
		struct meta_attr a;

		if (meta_getattr(md->meta, out[k].ino, &a) == 0 && a.size == out[k].size &&
		    local_copy_layout_print(md, out[k].ino, a.size, &out[k].layout_print) == 0)
			out[k].ctime = a.ctime;
		else
			out[k].size = 0; /* not sent: removed by the new daemon's sweep */
	}
	return n;
}

/* Whether name (".kept-PID-...") is a live daemon's other than this one:
 * never touched here. */
static bool name_of_live_other(struct mountd *md, const char *name)
{
	char *end;
	long pid = strtol(name + 6, &end, 10);

	return *end == '-' && pid > 0 && pid != (long)md->pid && proc_live(pid);
}

void local_copy_adopt(struct mountd *md, uint64_t ino, const char *name, uint64_t size,
		      struct timespec ctime, const uint64_t *print, bool built, bool saved)
{
	struct inode *i;
	struct meta_attr a;
	struct stat st;
	uint64_t now_print;
	char mine[64];
	bool room = false;

	/* A saved list's names are of a run of this volume that stopped (the
	 * pid in them may be another process's now). */
	if (!saved && name_of_live_other(md, name))
		return;
	/* The file must still be what was sent, and of the file as the
	 * volume has it now (another writer between the two daemons moved
	 * its change time); this daemon's own limits apply. */
	if (fstatat(md->staging_dirfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
		return; /* gone: nothing to keep or remove */
	/* Before the kernel's INIT is replayed: pt_off is not known yet, the
	 * mount option is (a copy that passthrough ends up off for is only
	 * never opened, and goes with the space or the unmount); nor is
	 * whether leases work (wstate_lease_unknown() learns it at the first
	 * probe, and a copy is probed before it is changed or evicted). */
	if (!S_ISREG(st.st_mode) || st.st_nlink != 1 || (uint64_t)st.st_size != size ||
	    size < LOCAL_COPY_MIN || size > md->pt_copy_max || !md->local_copy_max ||
	    md->follower || md->pt_mode == PT_OFF ||
	    !atomic_load(&md->layout_ready) || meta_getattr(md->meta, ino, &a) < 0 ||
	    a.nlink == 0 || a.size != size || !S_ISREG(a.mode) ||
	    a.ctime.tv_sec != ctime.tv_sec || a.ctime.tv_nsec != ctime.tv_nsec ||
	    (print && (local_copy_layout_print(md, ino, size, &now_print) < 0 ||
		       now_print != *print)))
		goto drop;
	i = inode_ref(md, ino, 0, 1); /* the copy's, kept if it is */
	if (!i)
		goto drop;
	pthread_mutex_lock(&i->lock);
	if (i->kept_name || i->w || i->inflight_seq) {
		pthread_mutex_unlock(&i->lock);
		inode_unref(md, i, 0, 1);
		goto drop;
	}
	room = copy_reserve(md, i, size, false);
	/* Renamed as this daemon's: its own names cannot meet it (after a
	 * re-exec the pid is the same, the serial starts again). */
	snprintf(mine, sizeof(mine), ".kept-%d-%llu-h%llu", (int)md->pid, (unsigned long long)ino,
		 (unsigned long long)atomic_fetch_add(&serial, 1));
	if (room && (renameat(md->staging_dirfd, name, md->staging_dirfd, mine) < 0 ||
		     !(i->kept_name = strdup(mine)))) {
		log_warn("cannot keep local copy %s", name);
		if (faccessat(md->staging_dirfd, mine, F_OK, AT_SYMLINK_NOFOLLOW) == 0)
			(void)renameat(md->staging_dirfd, mine, md->staging_dirfd, name);
		local_copy_unreserve(md, size);
		room = false;
	}
	if (room) {
		copy_record_current(md, i, size);
		/* A reader of the old daemon may have mapped it: probed. */
		i->kept_shared = true;
		i->kept_built = built;
		atomic_fetch_add(saved ? &md->stats.local_copies_restored
				       : &md->stats.local_copies_handed_over, 1);
	}
	pthread_mutex_unlock(&i->lock);
	if (room)
		return;
	inode_unref(md, i, 0, 1);
drop:
	if (unlinkat(md->staging_dirfd, name, 0) < 0 && errno != ENOENT)
		log_warn("cannot remove local copy %s", name);
	atomic_fetch_add(&md->stats.local_copies_dropped, 1);
}
