/*
 * Write-back: every write lands in a staging file (one per inode while it has
 * writers, named <ino>-<fh> after the open that made it), with the dirty
 * ranges tracked in memory. A commit cuts the dirty ranges into slices (one
 * per range and chunk), uploads their objects and commits the slices and the
 * size in one metadata transaction. A failed commit keeps everything staged;
 * if it failed at close, the inode goes on a retry list served by a thread.
 */
#include <ctype.h>
#include <errno.h>
#include <sched.h>
#include <fcntl.h>
#include <stdio.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "mountd.h"
#include "block.h"
#include "slice.h"

enum name_kind { NAME_PARTIAL, NAME_PT, NAME_COPY };

/* A new staging file's name: <ino>-<fh>-<pid>-<serial>[-s<seq>.p]. ".p"
 * marks a passthrough file, which holds the whole file and so can be
 * committed after a crash even without a journal record, as job <seq>
 * (staging_recover()); ".c<boot tag>" instead of ".p" marks one that holds
 * a copy not yet flushed (STAGING_COPY_SUFFIX). pid and serial keep names
 * unique across restarts. Names are never reused: an mmap of an older
 * staging file may outlive its open. */
static void staging_name(struct mountd *md, uint64_t ino, uint64_t fh, enum name_kind kind,
			 char *name, size_t len)
{
	static _Atomic uint64_t serial;
	/* (md->pid: a getpid() per file is a system call per file.) */
	pid_t pid = md->pid ? md->pid : getpid();
	int n = snprintf(name, len, "%llu-%llu-%d-%llu", (unsigned long long)ino,
			 (unsigned long long)fh, (int)pid,
			 (unsigned long long)atomic_fetch_add(&serial, 1));

	if (kind != NAME_PARTIAL && n > 0 && (size_t)n < len)
		snprintf(name + n, len - (size_t)n, "-s%llu%s%s",
			 (unsigned long long)rclient_seq_next(md),
			 kind == NAME_PT ? STAGING_PT_SUFFIX : STAGING_COPY_SUFFIX,
			 kind == NAME_PT ? "" : md->boot_tag);
}

enum staging_kind staging_kind(const struct mountd *md, const char *name, uint64_t *seq)
{
	const char *dash = strrchr(name, '-');
	char *end;
	uint64_t v;

	if (seq)
		*seq = 0;
	if (!dash || dash[1] != 's' || !isdigit((unsigned char)dash[2]))
		return STAGING_PARTIAL;
	errno = 0;
	v = strtoull(dash + 2, &end, 10);
	if (errno)
		return STAGING_PARTIAL;
	if (strcmp(end, STAGING_PT_SUFFIX) == 0) {
		if (seq)
			*seq = v;
		return STAGING_WHOLE;
	}
	char run[BOOT_RUN_LEN + 1];
	const char *tag = staging_copy_run(name, run);
	if (!tag || tag != end + strlen(STAGING_COPY_SUFFIX))
		return STAGING_PARTIAL;
	if (seq)
		*seq = v;
	switch (boot_name_state(tag, run, md->boot_tag,
				md->flushed_unreadable ? NULL : &md->flushed_boots)) {
	case BOOT_NAME_WHOLE:
		return STAGING_WHOLE;
	case BOOT_NAME_TORN:
		return STAGING_COPY_TORN;
	default:
		return STAGING_COPY_UNKNOWN;
	}
}

/* The write state of staging file `name`, open as fd (taken over). */
static int wstate_new(struct mountd *md, const char *name, int fd, struct wstate **out)
{
	struct wstate *w = calloc(1, sizeof(*w));

	if (!w || asprintf(&w->path, "%s/%s", md->cfg.staging_dir, name) < 0) {
		free(w);
		unlinkat(md->staging_dirfd, name, 0);
		close(fd);
		return -ENOMEM;
	}
	w->fd = fd;
	*out = w;
	return 0;
}

/* Creates a new, empty staging file and its write state. */
static int staging_create(struct mountd *md, struct inode *ino, uint64_t fh,
			  enum name_kind kind, struct wstate **out)
{
	char name[128];
	int fd;

	staging_name(md, ino->ino, fh, kind, name, sizeof(name));
	fd = openat(md->staging_dirfd, name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (fd < 0)
		return -errno;
	return wstate_new(md, name, fd, out);
}

/* A passthrough staging file from the pool, registered already (*id). */
static int staging_from_pool(struct mountd *md, struct inode *ino, uint64_t fh,
			     struct wstate **out, int *id, bool *exact_stamps)
{
	char name[128];
	int fd, rc;

	staging_name(md, ino->ino, fh, NAME_PT, name, sizeof(name));
	rc = staging_pool_take(md, name, &fd, id, exact_stamps);
	if (rc < 0)
		return rc;
	rc = wstate_new(md, name, fd, out);
	if (rc < 0)
		backing_close(md, *id);
	return rc;
}

/* Removes a staging file's close() record, if any. */
static void flush_record_remove(struct wstate *w)
{
	char fj[PATH_MAX];

	if (!w->flush_recorded)
		return; /* most never have one: spare the unlink */
	snprintf(fj, sizeof(fj), "%s%s", w->path, STAGING_FLUSH_SUFFIX);
	unlink(fj);
}

/* Frees the write state itself; its fd and file are the caller's business. */
static void wstate_free(struct wstate *w)
{
	free(w->path);
	free(w->dirty);
	free(w->prints);
	free(w);
}

static void staging_destroy(struct mountd *md, uint64_t ino, struct wstate *w)
{
	close(w->fd);
	flush_record_remove(w);
	if (unlink(w->path) < 0 && errno != ENOENT) {
		log_warn("cannot remove staging file %s", w->path);
		/* Left behind (a read-only staging disk), it must not be taken
		 * up again at the next start over what changes after now. */
		staging_superseded(md, ino);
	}
	wstate_free(w);
}

int wstate_ensure(struct mountd *md, struct inode *ino, uint64_t fh)
{
	struct meta_attr a;
	int rc;

	if (ino->w)
		return 0;
	rc = meta_getattr(md->meta, ino->ino, &a);
	if (rc < 0)
		return rc;
	rc = staging_create(md, ino, fh, NAME_PARTIAL, &ino->w);
	if (rc < 0)
		return rc;
	ino->w->size = a.size;
	ino->w->base_size = a.size;
	ino->w->mtime = a.mtime;
	return 0;
}

/* The passthrough write state of w, the inode's new staging file, registered
 * as id (see wstate_passthrough_start for the rest). */
static void passthrough_state_init(struct mountd *md, struct inode *ino, struct wstate *w, int id,
				   struct timespec mtime_floor, uint64_t meta_size, bool exact)
{
	struct stat st;

	w->passthrough = true;
	w->backing_id = id;
	/* Filled while no job of an earlier run may still commit unannounced:
	 * from here on only this write state changes the committed data. */
	w->born_ready = atomic_load(&md->layout_ready);
	/* The file is empty from here: a commit must store at least that,
	 * unless the metadata holds it already (a new file, an empty one, or
	 * one O_TRUNC truncated there first). */
	w->size_changed = meta_size != 0;
	w->mtime = mtime_floor;
	/* The staging file starts with the file's mtime, not its own creation
	 * stamp: unwritten, it shows what the file had (and keeps after an
	 * untouched close); the kernel's first write stamps it anew, even in
	 * the tick the staging file was made in. */
	struct timespec ts[2] = { { .tv_nsec = UTIME_OMIT }, mtime_floor };
	if (futimens(w->fd, ts) < 0)
		w->size_changed = true; /* cannot tell later: commit */
	else if (exact && mtime_floor.tv_sec >= 0 && mtime_floor.tv_sec < INT32_MAX)
		/* Kept as given: no need to ask (a stamp outside the range
		 * every file system keeps may be clamped: ask then). */
		w->started_mtime = mtime_floor;
	else if (fstat(w->fd, &st) == 0)
		w->started_mtime = st.st_mtim;
	else
		w->size_changed = true;
	ino->w = w;
	atomic_fetch_add(&md->stats.passthrough_opens, 1);
}

int wstate_passthrough_start(struct mountd *md, struct inode *ino, uint64_t fh,
			     struct timespec mtime_floor, uint64_t meta_size, bool copy)
{
	struct wstate *w = NULL;
	bool exact = false;
	int rc, id;

	/* A new or empty file takes a file from the pool: made and
	 * registered ahead (a file with content is copied in first, which
	 * dwarfs what the pool spares). */
	if (meta_size != 0 || copy || staging_from_pool(md, ino, fh, &w, &id, &exact) < 0) {
		rc = staging_create(md, ino, fh, copy ? NAME_COPY : NAME_PT, &w);
		if (rc < 0)
			return rc;
		w->copy_unsynced = copy;
		id = backing_open(md, w->fd);
		if (id < 0) {
			staging_destroy(md, ino->ino, w);
			return id;
		}
	}
	passthrough_state_init(md, ino, w, id, mtime_floor, meta_size, exact);
	return id;
}

int wstate_passthrough_adopt(struct mountd *md, struct inode *ino, uint64_t fh,
			     const char *kept_name, int reg_fd, int id, uint64_t size, bool flush)
{
	struct wstate *w = NULL;
	struct meta_attr a;
	char name[128];
	bool own_id = id <= 0;
	int fd, rc;

	rc = meta_getattr(md->meta, ino->ino, &a);
	if (rc < 0)
		return rc;
	if (own_id)
		fd = openat(md->staging_dirfd, kept_name, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
	else
		fd = fcntl(reg_fd, F_DUPFD_CLOEXEC, 0); /* the registered open itself */
	if (fd < 0)
		return -errno;
	/* It shares its inode with the job's staging file, whose record may
	 * be an xattr of it: a start after a crash must not take this file
	 * for that (committed) job. */
	if (fremovexattr(fd, RECONCILE_JOB_XATTR) < 0 && errno != ENODATA && errno != ENOTSUP) {
		rc = -errno;
		close(fd);
		return rc;
	}
	/* A copy until it is flushed, as a copied-in file would be: what the
	 * last writer left may not be on stable storage yet. */
	staging_name(md, ino->ino, fh, NAME_COPY, name, sizeof(name));
	if (renameat(md->staging_dirfd, kept_name, md->staging_dirfd, name) < 0) {
		rc = -errno;
		close(fd);
		return rc;
	}
	rc = wstate_new(md, name, fd, &w); /* takes fd */
	if (rc < 0)
		return rc;
	w->copy_unsynced = true;
	if (own_id && (id = backing_open(md, fd)) < 0) {
		rc = id;
		goto undo;
	}
	passthrough_state_init(md, ino, w, id, a.mtime, a.size, false);
	rc = wstate_copy_up(md, ino, size, fd, flush);
	if (rc == 0)
		return id;
	ino->w = NULL;
	if (own_id)
		backing_close(md, id);
undo:
	/* Back under its old name, which readers' later opens still need;
	 * failing that it goes. */
	if (renameat(md->staging_dirfd, name, md->staging_dirfd, kept_name) == 0) {
		close(w->fd);
		wstate_free(w);
	} else {
		staging_destroy(md, ino->ino, w);
	}
	return rc;
}

bool staging_is_copy(const char *name)
{
	char run[BOOT_RUN_LEN + 1];

	return staging_copy_run(name, run) != NULL;
}

int wstate_copy_flush(struct mountd *md, struct wstate *w)
{
	const char *name = strrchr(w->path, '/') + 1;
	const char *mark = strrchr(name, '.');
	char *path = NULL;

	if (w->copy_rename_pending)
		goto dir;
	if (!w->copy_unsynced)
		return 0;
	/* A flush that failed once may succeed the next time without the
	 * lost pages being written (the error is reported once): such a copy
	 * is never taken as whole. */
	if (w->copy_torn)
		return -EIO;
	if (fdatasync(w->fd) < 0) {
		int rc = -errno;

		w->copy_torn = true;
		log_errno(rc, "cannot flush staging file %s: it stays an unflushed copy", w->path);
		return rc;
	}
	/* "<stem>.c<tag>" (staging_name()) becomes "<stem>.p": whole under
	 * any boot, once the new name is durable. */
	if (asprintf(&path, "%.*s%s", (int)(mark - w->path), w->path, STAGING_PT_SUFFIX) < 0)
		return -ENOMEM;
	if (renameat(md->staging_dirfd, name, md->staging_dirfd, strrchr(path, '/') + 1) < 0) {
		int rc = -errno;

		log_errno(rc, "cannot rename flushed staging file %s", w->path);
		free(path);
		return rc;
	}
	free(w->path);
	w->path = path;
	w->copy_unsynced = false;
	w->copy_rename_pending = true;
dir:
	if (fsync(md->staging_dirfd) < 0)
		return -errno;
	w->copy_rename_pending = false;
	w->dir_synced = true;
	return 0;
}

int wstate_passthrough_resume(struct mountd *md, struct inode *ino)
{
	struct wstate *w = ino->w;
	int id;

	if (!w || !w->passthrough)
		return -EINVAL;
	if (w->backing_id > 0)
		return w->backing_id;
	id = backing_open(md, w->fd);
	if (id < 0)
		return id;
	w->backing_id = id;
	atomic_fetch_add(&md->stats.passthrough_opens, 1);
	return id;
}

/* Set once a lease probe could not tell (no lease support): a mapping may
 * then outlive any close unseen. */
static _Atomic bool lease_unknown;

bool wstate_lease_unknown(void)
{
	return atomic_load(&lease_unknown);
}

bool wstate_mapped(struct wstate *w)
{
	static _Atomic bool told;

	/* The kernel grants a write lease only on a file that nobody but the
	 * asker holds open (fs/locks.c, check_conflicting_open); a mapping
	 * holds its own open of the staging file. The lease is given back at
	 * once: an open of the staging file in between (none is expected)
	 * waits only for that. */
	if (fcntl(w->fd, F_SETLEASE, F_WRLCK) == 0) {
		(void)fcntl(w->fd, F_SETLEASE, F_UNLCK);
		return false;
	}
	if (errno != EAGAIN && errno != EBUSY) {
		atomic_store(&lease_unknown, true);
		if (!atomic_exchange(&told, true))
			log_warn("cannot tell whether a mapping outlives the close of a passthrough "
				 "file (F_SETLEASE on the staging directory); stores through such a "
				 "mapping after close are not kept");
		return false;
	}
	return true;
}

/* The closing task's last fput() of the staging file (FUSE passthrough's
 * own open of it) runs when that task returns to user space, which on
 * another CPU is usually a few microseconds after the RELEASE was queued:
 * asking again a few times here, yielding between, spares most closes the
 * retry thread's wake-up and its PROBE_RETRY_MS wait (38% of the closes of
 * a small-file loop on 2 CPUs went there). A live mapping costs these
 * tries once per close. */
#define PROBE_SETTLE_TRIES 16

bool wstate_mapped_at_release(struct mountd *md, struct wstate *w)
{
	for (int k = 0; k < PROBE_SETTLE_TRIES; k++) {
		if (!wstate_mapped(w))
			return false;
		sched_yield();
	}
	atomic_fetch_add(&md->stats.release_probes_deferred, 1);
	return true;
}

int wstate_reopen(struct wstate *w)
{
	if (w->fd >= 0)
		return 0;
	w->fd = open(w->path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
	return w->fd < 0 ? -errno : 0;
}

int wstate_stat(struct wstate *w, uint64_t *size, struct timespec *mtime)
{
	struct stat st;
	int rc;

	if (!w->passthrough) {
		*size = w->size;
		*mtime = w->mtime;
		return 0;
	}
	/* The kernel writes the staging file directly: it is the truth. */
	if ((rc = wstate_reopen(w)) < 0)
		return rc;
	if (fstat(w->fd, &st) < 0)
		return -errno;
	*size = (uint64_t)st.st_size;
	*mtime = st.st_mtim;
	/* The kernel stamps files from a coarse clock that may lag the one the
	 * metadata used at create: never let mtime go back, unless asked to. */
	if (!w->mtime_set && (st.st_mtim.tv_sec < w->mtime.tv_sec ||
			      (st.st_mtim.tv_sec == w->mtime.tv_sec &&
			       st.st_mtim.tv_nsec < w->mtime.tv_nsec)))
		*mtime = w->mtime;
	return 0;
}

/* Adds [start, end) to the sorted, merged dirty list. */
static int dirty_add(struct wstate *w, uint64_t start, uint64_t end)
{
	size_t i = 0, j;

	if (start >= end)
		return 0;
	/* Writes are mostly sequential: look from the end first. */
	if (w->ndirty && w->dirty[w->ndirty - 1].end >= start && w->dirty[w->ndirty - 1].start <= start) {
		struct range *r = &w->dirty[w->ndirty - 1];
		if (end > r->end)
			r->end = end;
		return 0;
	}
	while (i < w->ndirty && w->dirty[i].end < start)
		i++;
	j = i;
	while (j < w->ndirty && w->dirty[j].start <= end) {
		if (w->dirty[j].start < start)
			start = w->dirty[j].start;
		if (w->dirty[j].end > end)
			end = w->dirty[j].end;
		j++;
	}
	if (i == j) { /* no overlap: insert at i */
		if (w->ndirty == w->cap) {
			size_t cap = w->cap ? w->cap * 2 : 8;
			struct range *nr = realloc(w->dirty, cap * sizeof(*nr));
			if (!nr)
				return -ENOMEM;
			w->dirty = nr;
			w->cap = cap;
		}
		memmove(&w->dirty[i + 1], &w->dirty[i], (w->ndirty - i) * sizeof(*w->dirty));
		w->ndirty++;
	} else if (j - i > 1) {
		memmove(&w->dirty[i + 1], &w->dirty[j], (w->ndirty - j) * sizeof(*w->dirty));
		w->ndirty -= j - i - 1;
	}
	w->dirty[i].start = start;
	w->dirty[i].end = end;
	return 0;
}

ssize_t wstate_write(struct mountd *md, struct inode *ino, const void *buf, size_t len, off_t off)
{
	struct wstate *w = ino->w;
	size_t done = 0;
	int rc;

	while (done < len) {
		ssize_t n = pwrite(w->fd, (const char *)buf + done, len - done, off + (off_t)done);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (done)
				break;
			return -errno;
		}
		done += (size_t)n;
	}
	rc = dirty_add(w, (uint64_t)off, (uint64_t)off + done);
	if (rc < 0)
		return rc;
	if ((uint64_t)off + done > w->size)
		w->size = (uint64_t)off + done;
	w->size_changed = true;
	/* A step back of the wall clock must not make the file look older than
	 * what it had (the metadata's mtime, or an earlier write's), as
	 * wstate_stat() keeps a passthrough file's; a time set explicitly
	 * since (mtime_set) is no floor. */
	struct timespec now;
	clock_gettime(CLOCK_REALTIME, &now);
	if (w->mtime_set || now.tv_sec > w->mtime.tv_sec ||
	    (now.tv_sec == w->mtime.tv_sec && now.tv_nsec >= w->mtime.tv_nsec))
		w->mtime = now;
	atomic_fetch_add(&md->stats.bytes_written, done);
	return (ssize_t)done;
}

int wstate_truncate(struct wstate *w, uint64_t size)
{
	size_t k = 0;

	for (size_t i = 0; i < w->ndirty; i++) {
		if (w->dirty[i].start >= size)
			continue;
		w->dirty[k] = w->dirty[i];
		if (w->dirty[k].end > size)
			w->dirty[k].end = size;
		k++;
	}
	w->ndirty = k;
	w->size = size;
	if (size < w->base_size)
		w->base_size = size;
	w->size_changed = true;
	w->wb_error = 0;
	if (ftruncate(w->fd, (off_t)size) < 0)
		return -errno;
	return 0;
}

void wstate_writeback_failed(struct wstate *w, uint64_t off, int err)
{
	if (w->wb_error && off >= w->wb_cut)
		return;
	if (off < w->size)
		(void)wstate_truncate(w, off); /* clears wb_error */
	w->wb_error = err;
	w->wb_cut = off;
}

bool wstate_writeback_refused(const struct wstate *w, uint64_t off, size_t len)
{
	return w->wb_error && off + len > w->wb_cut;
}

int wstate_overlay(struct wstate *w, void *buf, size_t len, off_t off)
{
	uint64_t lo = (uint64_t)off, hi = (uint64_t)off + len;

	if (w->passthrough) {
		/* The staging file holds every byte of the file. */
		size_t done = 0;
		while (done < len) {
			ssize_t n = pread(w->fd, (char *)buf + done, len - done, off + (off_t)done);
			if (n < 0)
				return -errno;
			if (n == 0)
				break;
			done += (size_t)n;
		}
		memset((char *)buf + done, 0, len - done);
		return 0;
	}

	for (size_t i = 0; i < w->ndirty; i++) {
		uint64_t s = w->dirty[i].start, e = w->dirty[i].end;
		if (e <= lo)
			continue;
		if (s >= hi)
			break;
		if (s < lo)
			s = lo;
		if (e > hi)
			e = hi;
		ssize_t n = pread(w->fd, (char *)buf + (s - lo), e - s, (off_t)s);
		if (n < 0)
			return -errno;
		if ((uint64_t)n != e - s) /* the staging file lost bytes: never hand out garbage */
			return -EIO;
	}
	return 0;
}

/* Uploads bytes [start, end) of the staging file as one slice. */
static int upload_slice(struct mountd *md, struct wstate *w, uint64_t id, uint64_t start,
			uint32_t len, char *buf)
{
	uint32_t bs = md->vol.block_size;
	char key[SLICE_KEY_MAX];

	for (uint32_t idx = 0; (uint64_t)idx * bs < len; idx++) {
		uint32_t osize = slice_object_size(idx, len, bs);
		uint64_t at = start + (uint64_t)idx * bs;
		ssize_t n = pread(w->fd, buf, osize, (off_t)at);
		int rc;

		if (n < 0)
			return -errno;
		if ((uint32_t)n != osize)
			return -EIO;
		slice_object_key(id, idx, len, bs, key, sizeof(key));
		rc = objstore_put(md->store, key, buf, block_seal(buf, osize));
		if (rc < 0) {
			log_errno(rc, "upload of %s failed: %s", key, objstore_last_error());
			return rc;
		}
		atomic_fetch_add(&md->stats.objects_put, 1);
		atomic_fetch_add(&md->stats.bytes_uploaded, osize);
		read_cache_insert(md->cache, key, buf, osize);
	}
	return 0;
}

bool pwrite_all(int fd, const void *buf, size_t len, off_t off)
{
	while (len) {
		ssize_t n = pwrite(fd, buf, len, off);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			if (n == 0)
				errno = EIO;
			return false;
		}
		buf = (const char *)buf + n;
		len -= (size_t)n;
		off += n;
	}
	return true;
}

bool is_zero(const char *p, size_t len)
{
	static const char zeros[4096];

	while (len) {
		size_t n = len < sizeof(zeros) ? len : sizeof(zeros);
		if (memcmp(p, zeros, n) != 0)
			return false;
		p += n;
		len -= n;
	}
	return true;
}

/* A run of changed fingerprint units inside one block: one slice. */
struct pt_run {
	uint64_t at;  /* file offset */
	uint32_t len;
};

/*
 * Commits a passthrough staging file. The kernel wrote it directly, so
 * there are no dirty ranges: every PT_UNIT of the file is fingerprinted
 * and compared with what the last commit stored. Each run of changed units
 * within a block becomes one slice (its own object, or a zero slice), and
 * unchanged units are left to the slices already committed, so an fsync
 * after a small write uploads PT_UNIT-sized pieces, not whole blocks.
 * Called with the inode's lock held: the file may grow meanwhile (the
 * kernel writes on), never shrink (truncates come through us).
 */
/* The fingerprint of len zero bytes (len <= PT_UNIT). */
static uint64_t zero_print(uint32_t len)
{
	static const char zeros[PT_UNIT];
	static _Atomic uint64_t full; /* 0: not computed yet */
	uint64_t p;

	if (len != PT_UNIT)
		return block_fingerprint(zeros, len);
	p = atomic_load(&full);
	if (!p) {
		p = block_fingerprint(zeros, len);
		atomic_store(&full, p);
	}
	return p;
}

/*
 * Pass 1 of a passthrough commit: the fingerprint of every PT_UNIT of the
 * staging file's first size bytes (*npp, owned by the caller) and the runs
 * of units that differ from what the last commit stored (*runsp, owned by
 * the caller; a run never crosses a block). -EAGAIN: the file shrank under
 * the scan (the next commit sees it).
 */
static int pt_scan(struct mountd *md, struct wstate *w, uint64_t size, struct block_print **npp,
		   struct pt_run **runsp, size_t *nrunsp)
{
	uint32_t bs = md->vol.block_size;
	uint32_t unit = PT_UNIT < bs ? PT_UNIT : bs;
	size_t nunits = (size + unit - 1) / unit, nruns = 0, cap = 0, u = 0;
	struct block_print *np = calloc(nunits ? nunits : 1, sizeof(*np));
	struct pt_run *runs = NULL;
	uint64_t data_at = 0; /* the next byte at or after `at` that is not in a hole */
	char *buf = malloc(bs);
	int rc = 0;

	if (!np || !buf) {
		rc = -ENOMEM;
		goto out;
	}
	for (uint64_t at = 0; at < size; at += bs) {
		uint32_t len = size - at < bs ? (uint32_t)(size - at) : bs;
		bool block_changed = false, in_run = false, hole;

		if (data_at < at) {
			off_t d = lseek(w->fd, (off_t)at, SEEK_DATA);
			if (d < 0 && errno != ENXIO) {
				rc = -errno;
				goto out;
			}
			data_at = d < 0 ? UINT64_MAX : (uint64_t)d;
		}
		/* A block in a hole is not read: a sparse file of any size costs
		 * what its data costs. */
		hole = data_at >= at + len;
		if (!hole) {
			ssize_t n = pread(w->fd, buf, len, (off_t)at);
			if (n < 0) {
				rc = -errno;
				goto out;
			}
			if ((uint32_t)n != len) {
				rc = -EAGAIN;
				goto out;
			}
		}
		for (uint32_t off = 0; off < len; off += unit, u++) {
			uint32_t ulen = len - off < unit ? len - off : unit;
			bool same;

			np[u].print = hole ? zero_print(ulen) : block_fingerprint(buf + off, ulen);
			np[u].len = ulen;
			if (u < w->nprints)
				same = w->prints[u].len == ulen && w->prints[u].print == np[u].print;
			else /* past what was stored: zeros read as zeros already */
				same = hole || is_zero(buf + off, ulen);
			if (same) {
				in_run = false;
				continue;
			}
			block_changed = true;
			if (in_run) {
				runs[nruns - 1].len += ulen;
				continue;
			}
			if (nruns == cap) {
				size_t nc = cap ? 2 * cap : 64;
				struct pt_run *nr = realloc(runs, nc * sizeof(*nr));
				if (!nr) {
					rc = -ENOMEM;
					goto out;
				}
				runs = nr;
				cap = nc;
			}
			runs[nruns++] = (struct pt_run){ .at = at + off, .len = ulen };
			in_run = true;
		}
		if (!block_changed)
			atomic_fetch_add(&md->stats.blocks_unchanged, 1);
	}
	*npp = np;
	*runsp = runs;
	*nrunsp = nruns;
	np = NULL;
	runs = NULL;
out:
	free(np);
	free(runs);
	free(buf);
	return rc;
}

/* Whether a passthrough staging file has been committed before (fsync), or
 * was filled from the committed file at open (copy-up): then only the
 * units whose fingerprints changed need storing. */
bool wstate_has_prints(const struct wstate *w)
{
	return w->nprints > 0;
}

int wstate_changed_ranges(struct mountd *md, struct wstate *w, uint64_t size,
			  struct reconcile_range **out, size_t *nout)
{
	struct block_print *np = NULL;
	struct pt_run *runs = NULL;
	struct reconcile_range *r = NULL;
	size_t nruns = 0, n = 0;
	uint64_t gap = 0;
	int rc;

	rc = pt_scan(md, w, size, &np, &runs, &nruns);
	if (rc < 0)
		return rc;
	r = calloc(nruns ? nruns : 1, sizeof(*r));
	if (!r) {
		rc = -ENOMEM;
		goto out;
	}
	/* Adjacent runs (across blocks) join; past what one job holds, runs
	 * closer than a growing gap join too (the unchanged bytes between
	 * them are stored again, which is correct, only more). */
	for (;;) {
		n = 0;
		for (size_t k = 0; k < nruns; k++) {
			uint64_t s = runs[k].at, e = s + runs[k].len;
			if (n && s <= r[n - 1].end + gap)
				r[n - 1].end = e;
			else
				r[n++] = (struct reconcile_range){ s, e };
		}
		if (n <= RECONCILE_RANGES_MAX)
			break;
		gap = gap ? gap * 2 : PT_UNIT;
	}
	*out = r;
	*nout = n;
	r = NULL;
out:
	free(r);
	free(np);
	free(runs);
	return rc;
}

/* Reads len bytes at `at` of the file being copied up: from *src (see
 * wstate_copy_up) when given and readable, else through the read path
 * (*src is then -1 from here on: the committed file is in the store too). */
static int copy_up_read(struct mountd *md, struct inode *ino, uint64_t size, int *src, char *buf,
			uint32_t len, uint64_t at)
{
	ssize_t n;

	for (uint32_t got = 0; *src >= 0 && got < len;) {
		n = pread(*src, buf + got, len - got, (off_t)(at + got));
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			log_errno(n < 0 ? -errno : -EIO, "inode %llu: cannot read the staging file of "
				  "its last upload; copying from the store",
				  (unsigned long long)ino->ino);
			*src = -1;
			break;
		}
		got += (uint32_t)n;
		if (got == len)
			return 0;
	}
	n = file_read(md, NULL, ino, size, buf, len, (off_t)at);
	return n < 0 ? (int)n : (uint32_t)n == len ? 0 : -EIO;
}

int wstate_copy_up(struct mountd *md, struct inode *ino, uint64_t size, int src, bool flush)
{
	struct wstate *w = ino->w;
	uint32_t bs = md->vol.block_size;
	uint32_t unit = PT_UNIT < bs ? PT_UNIT : bs;
	size_t nunits = (size + unit - 1) / unit, u = 0;
	struct block_print *np = calloc(nunits ? nunits : 1, sizeof(*np));
	char *buf = malloc(bs);
	int rc = 0;

	if (!np || !buf) {
		rc = -ENOMEM;
		goto out;
	}
	struct stat st;

	/* A source shorter than the file would end the copy early: the read
	 * path is used instead (never expected: the job's file has its size). */
	/* A local copy taken over (wstate_passthrough_adopt) is read for its
	 * fingerprints, and written only where it cannot be read. */
	bool in_place = src >= 0 && src == w->fd;

	if (src >= 0 && (fstat(src, &st) < 0 || (uint64_t)st.st_size < size))
		src = -1;
	if (!in_place && ftruncate(w->fd, (off_t)size) < 0) {
		rc = -errno;
		goto out;
	}
	/* Block by block through the read path (read cache, then the store)
	 * or from src; zeros stay holes in the staging file. The fingerprints
	 * are what the file's committed layout holds, so a commit stores only
	 * what the writer changes. */
	for (uint64_t at = 0; at < size; at += bs) {
		uint32_t len = size - at < bs ? (uint32_t)(size - at) : bs;

		rc = copy_up_read(md, ino, size, &src, buf, len, at);
		if (rc < 0)
			goto out;
		for (uint32_t off = 0; off < len; off += unit, u++) {
			uint32_t ulen = len - off < unit ? len - off : unit;

			/* Unit-sized writes: ext4 (6.x) caches a large write in
			 * large folios and walks every block of a folio at each
			 * later small write into it, so a copy made in 4 MiB
			 * writes made the writer's 4 KiB writes cost twice what
			 * they cost in the original file. */
			if (!(in_place && src >= 0) && !is_zero(buf + off, ulen) &&
			    !pwrite_all(w->fd, buf + off, ulen, (off_t)(at + off))) {
				rc = -errno;
				goto out;
			}
			np[u].print = block_fingerprint(buf + off, ulen);
			np[u].len = ulen;
		}
	}
	/* On stable storage before the open returns (see
	 * copy_flushed_at_open()): then it is whole under any boot. */
	if (flush && (rc = wstate_copy_flush(md, w)) < 0)
		goto out;
	/* The copy is not a change: the staging file shows the file's mtime
	 * (set at the start, w->mtime) until the kernel writes to it. */
	struct timespec ts[2] = { { .tv_nsec = UTIME_OMIT }, w->mtime };
	if (futimens(w->fd, ts) < 0) {
		rc = -errno;
		goto out;
	}
	free(w->prints);
	w->prints = np;
	w->nprints = nunits;
	np = NULL;
	w->size = size;
	w->size_changed = false;
	if (!in_place) { /* a takeover is counted by local_copy.c */
		atomic_fetch_add(&md->stats.copy_ups, 1);
		atomic_fetch_add(&md->stats.copy_up_bytes, size);
		if (src >= 0)
			atomic_fetch_add(&md->stats.copy_ups_from_staging, 1);
	}
out:
	free(np);
	free(buf);
	return rc;
}

static int commit_passthrough(struct mountd *md, struct inode *ino)
{
	struct wstate *w = ino->w;
	uint32_t bs = md->vol.block_size;
	struct meta_chunk_slice *sl = NULL;
	struct block_print *np = NULL;
	struct pt_run *runs = NULL;
	struct timespec mtime = { 0 };
	uint64_t size = 0, first = 0;
	size_t nunits, nruns = 0, nsl = 0;
	uint32_t unit = PT_UNIT < bs ? PT_UNIT : bs;
	char *buf = NULL;
	int rc;

	rc = wstate_stat(w, &size, &mtime);
	if (rc < 0)
		return rc;
	nunits = (size + unit - 1) / unit;
	rc = pt_scan(md, w, size, &np, &runs, &nruns);
	if (rc < 0)
		goto out;
	buf = malloc((size_t)bs + BLOCK_TRAILER);
	if (!buf) {
		rc = -ENOMEM;
		goto out;
	}
	sl = calloc(nruns ? nruns : 1, sizeof(*sl));
	if (!sl) {
		rc = -ENOMEM;
		goto out;
	}
	/* One id per run; the ids of zero runs go unused. */
	if (nruns && (rc = meta_slice_id_alloc(md->meta, (uint32_t)nruns, &first)) < 0)
		goto out;
	/* Pass 2: store what changed. */
	for (size_t k = 0; k < nruns; k++) {
		struct pt_run *r = &runs[k];
		char key[SLICE_KEY_MAX];
		ssize_t n = pread(w->fd, buf, r->len, (off_t)r->at);

		if (n < 0) {
			rc = -errno;
			goto out;
		}
		if ((uint32_t)n != r->len) {
			rc = -EAGAIN;
			goto out;
		}
		sl[nsl].chunk = (uint32_t)(r->at / META_CHUNK_SIZE);
		sl[nsl].s = (struct meta_slice){ .id = 0, .size = r->len, .off = 0,
						 .pos = (uint32_t)(r->at % META_CHUNK_SIZE),
						 .len = r->len };
		if (is_zero(buf, r->len)) {
			/* A hole (or zeros): a zero slice, nothing to upload, and
			 * SEEK_HOLE still finds it. */
			nsl++;
			continue;
		}
		sl[nsl].s.id = first + k;
		slice_object_key(first + k, 0, r->len, bs, key, sizeof(key));
		rc = objstore_put(md->store, key, buf, block_seal(buf, r->len));
		if (rc < 0) {
			log_errno(rc, "upload of %s failed: %s", key, objstore_last_error());
			goto out;
		}
		atomic_fetch_add(&md->stats.objects_put, 1);
		atomic_fetch_add(&md->stats.bytes_uploaded, r->len);
		read_cache_insert(md->cache, key, buf, r->len);
		nsl++;
	}
	/* Nothing changed since the last commit; bytes written over with
	 * the same bytes still moved mtime, which is committed. */
	if (nsl == 0 && !w->size_changed && size == w->size &&
	    mtime.tv_sec == w->mtime.tv_sec && mtime.tv_nsec == w->mtime.tv_nsec)
		goto done;
	rc = meta_write_commit(md->meta, ino->ino, sl, nsl, size, &mtime, NULL);
	layout_forget(md, ino);
	if (rc < 0) {
		log_errno(rc, "inode %llu: metadata commit failed", (unsigned long long)ino->ino);
		goto out;
	}
	atomic_fetch_add(&md->stats.commits, 1);
done:
	free(w->prints);
	w->prints = np;
	w->nprints = nunits;
	np = NULL;
	w->size = size;
	w->mtime = mtime;
	w->size_changed = false;
out:
	free(np);
	free(runs);
	free(sl);
	free(buf);
	return rc;
}

int wstate_commit(struct mountd *md, struct inode *ino)
{
	struct wstate *w = ino->w;
	struct meta_chunk_slice *sl = NULL;
	size_t nsl = 0, cap = 0;
	uint64_t first = 0;
	char *buf = NULL;
	int rc = 0;

	if (!w)
		return 0;
	if ((rc = wstate_reopen(w)) < 0)
		goto out;
	if (w->passthrough) {
		rc = commit_passthrough(md, ino);
		goto out;
	}
	if (!w->ndirty && !w->size_changed)
		return 0;
	/* One slice per dirty range and chunk. */
	for (size_t i = 0; i < w->ndirty; i++) {
		uint64_t s = w->dirty[i].start, e = w->dirty[i].end;
		if (e > w->size)
			e = w->size;
		while (s < e) {
			uint64_t cend = (s / META_CHUNK_SIZE + 1) * (uint64_t)META_CHUNK_SIZE;
			uint64_t pe = e < cend ? e : cend;
			if (nsl == cap) {
				size_t nc = cap ? cap * 2 : 16;
				struct meta_chunk_slice *n = realloc(sl, nc * sizeof(*n));
				if (!n) {
					rc = -ENOMEM;
					goto out;
				}
				sl = n;
				cap = nc;
			}
			sl[nsl].chunk = (uint32_t)(s / META_CHUNK_SIZE);
			sl[nsl].s.pos = (uint32_t)(s % META_CHUNK_SIZE);
			sl[nsl].s.len = (uint32_t)(pe - s);
			sl[nsl].s.size = (uint32_t)(pe - s);
			sl[nsl].s.off = 0;
			nsl++;
			s = pe;
		}
	}
	if (nsl) {
		rc = meta_slice_id_alloc(md->meta, (uint32_t)nsl, &first);
		if (rc < 0)
			goto out;
		buf = malloc(md->vol.block_size + BLOCK_TRAILER);
		if (!buf) {
			rc = -ENOMEM;
			goto out;
		}
	}
	for (size_t k = 0; k < nsl; k++) {
		sl[k].s.id = first + k;
		rc = upload_slice(md, w, sl[k].s.id,
				  (uint64_t)sl[k].chunk * META_CHUNK_SIZE + sl[k].s.pos, sl[k].s.len, buf);
		if (rc < 0)
			goto out;
	}
	rc = meta_write_commit(md->meta, ino->ino, sl, nsl, w->size, &w->mtime, NULL);
	layout_forget(md, ino);
	if (rc < 0) {
		log_errno(rc, "inode %llu: metadata commit failed", (unsigned long long)ino->ino);
		goto out;
	}
	w->ndirty = 0;
	w->size_changed = false;
	atomic_fetch_add(&md->stats.commits, 1);
out:
	if (rc < 0) {
		w->last_error = rc;
		atomic_fetch_add(&md->stats.commit_failures, 1);
	} else {
		w->last_error = 0;
	}
	free(buf);
	free(sl);
	/* What a commit promises (fsync, or close without a reconciler) holds
	 * against a power loss too, and so do the namespace changes before it. */
	if (rc == 0) {
		int src = meta_sync(md->meta);
		if (src < 0) {
			log_errno(src, "inode %llu: cannot sync the metadata", (unsigned long long)ino->ino);
			rc = src;
		}
	}
	/* Callers hand this to close()/fsync(): a store that cannot be reached
	 * is an I/O error to the application; the real cause is logged. */
	if (rc < 0 && rc != -ENOMEM && rc != -ENOSPC && rc != -EDQUOT && rc != -EINTR)
		rc = -EIO;
	return rc;
}

void wstate_forget(struct mountd *md, struct inode *ino)
{
	struct wstate *w = ino->w;

	if (!w)
		return;
	flush_record_remove(w); /* the .job made at handoff supersedes it */
	backing_close(md, w->backing_id);
	close(w->fd);
	wstate_free(w);
	ino->w = NULL;
}

void wstate_drop(struct mountd *md, struct inode *ino)
{
	struct wstate *w = ino->w;

	if (!w)
		return;
	if ((w->ndirty || w->size_changed) && !ino->unlinked)
		log_warnx("inode %llu: discarding uncommitted writes staged in %s",
			  (unsigned long long)ino->ino, w->path);
	backing_close(md, w->backing_id);
	staging_destroy(md, ino->ino, w);
	ino->w = NULL;
}

bool wstate_recycle(struct mountd *md, struct inode *ino, int backing_id)
{
	struct wstate *w = ino->w;
	const char *name;
	struct stat st;

	/* Never committed, nothing recorded, no backing id left, and no byte
	 * in it (a file that had some is not reused even when cut to 0: its
	 * name may still be in a record). And only where the lease probe
	 * works: a mapping that outlived the close would write into the next
	 * file that took this one. */
	if (atomic_load(&lease_unknown) || !w || !w->passthrough || w->nprints || w->ndirty ||
	    w->flush_recorded || w->backing_id > 0 || w->fd < 0 || fstat(w->fd, &st) < 0 ||
	    st.st_size != 0 || st.st_blocks != 0)
		return false;
	name = strrchr(w->path, '/') + 1;
	if (staging_pool_give(md, w->fd, name, backing_id) < 0)
		return false;
	wstate_free(w);
	ino->w = NULL;
	return true;
}

/* ---- the retry list ---- */

/* While a mapping outlives its file's last close, its stores are committed
 * at this interval, as the kernel would write back a local file's dirty
 * pages. */
#define MAPPED_COMMIT_SEC 30
/* The RELEASE of a passthrough file can come a moment before the kernel's
 * last fput() of its staging file has run (deferred to the closing task's
 * return to user space, which on a busy machine may wait for a CPU), and
 * the lease probe is refused meanwhile as if a mapping held it. A refused
 * probe is asked again from the retry thread every PROBE_RETRY_MS, off the
 * FUSE thread that served the RELEASE, and believed after this long. */
#define PROBE_RETRY_MS 2
#define PROBE_GIVE_UP_SEC 0.05

static double since(const struct timespec *t)
{
	struct timespec now;

	clock_gettime(CLOCK_MONOTONIC, &now);
	return (double)(now.tv_sec - t->tv_sec) + (now.tv_nsec - t->tv_nsec) / 1e9;
}

/* A mapping outlives the file's last close: the staging file stays the
 * inode's. Caller holds ino->lock; the inode is on the retry list. */
static void mapped_found(struct mountd *md, struct inode *ino)
{
	struct wstate *w = ino->w;

	atomic_fetch_add(&md->stats.mapped_after_close, 1);
	log_info("inode %llu: its staging file is still open elsewhere (a mapping) after the "
		 "last close: it stays, and is committed from here", (unsigned long long)ino->ino);
	/* What the closed opens wrote is committed as a close would; the
	 * mapping's later stores follow from the retry list. A failure here is
	 * retried there too. */
	(void)wstate_commit(md, ino);
	w->mapped = true;
	clock_gettime(CLOCK_MONOTONIC, &w->mapped_commit);
}

/* One retry of a pending inode: true when it leaves the list. Caller holds
 * i->lock. */
static bool write_back_retry(struct mountd *md, struct inode *i)
{
	struct wstate *w = i->w;
	bool busy = i->nwriters > 0 || (w && w->npt > 0);
	bool probed = w && w->probing;
	bool fd_deferred = w && w->fd_deferred;

	if (probed) {
		w->probing = false;
		if (busy) {
			i->pending = false; /* its next close decides */
			return true;
		}
		if (wstate_mapped(w)) {
			if (since(&w->probe_since) < PROBE_GIVE_UP_SEC) {
				w->probing = true;
				return false;
			}
			mapped_found(md, i);
			return false;
		}
	}
	if (w && w->mapped) {
		if (busy)
			return false; /* its next close is ours again; nothing to do */
		if (wstate_mapped(w)) {
			if (since(&w->mapped_commit) >= MAPPED_COMMIT_SEC &&
			    wstate_commit(md, i) == 0)
				clock_gettime(CLOCK_MONOTONIC, &w->mapped_commit);
			return false;
		}
	}
	if (w && !busy && rclient_up(md)) {
		/* Handing the file over needs one fd (its record) and gives the
		 * staging file's back, where committing here needs several at
		 * once: what lets a daemon that ran out of fds recover. */
		int rc = rclient_handoff(md, i);
		if (rc == 0 || rc == -ENODATA) {
			/* As at a close (file_release): nothing left to commit
			 * makes the staging file the local copy, if it may be. */
			if (rc == -ENODATA && !local_copy_keep_unchanged(md, i))
				wstate_drop(md, i);
			else if (rc == 0)
				local_copy_keep(md, i);
			i->pending = false;
			if (!probed && !fd_deferred)
				log_info("inode %llu: staged writes handed to ferry-reconciler on "
					 "retry", (unsigned long long)i->ino);
			return true;
		}
	}
	if (wstate_commit(md, i) != 0) {
		/* Until the next try the staging file's fd is closed: a daemon
		 * that ran out of fds holds one per file that failed, and the
		 * tries (a record, an object) need free ones. */
		if (w && !busy && !w->mapped && w->fd >= 0) {
			close(w->fd);
			w->fd = -1;
		}
		return false;
	}
	if (w && !busy)
		wstate_drop(md, i);
	else if (w)
		w->mapped = false;
	i->pending = false;
	log_info("inode %llu: staged writes committed on retry", (unsigned long long)i->ino);
	return true;
}

static void *write_back_main(void *arg)
{
	struct mountd *md = arg;

	pthread_mutex_lock(&md->pending_lock);
	while (!md->pending_stop) {
		struct timespec until;
		bool probes = false;
		/* pending_cond waits on CLOCK_MONOTONIC */
		mono_deadline_ms(&until, md->pending_probes ? PROBE_RETRY_MS : 2000);
		pthread_cond_timedwait(&md->pending_cond, &md->pending_lock, &until);
		if (md->pending_stop)
			break;
		md->pending_probes = false;
		/* Take the whole list; put back what still fails. */
		struct inode *list = md->pending, *next, *keep = NULL;
		md->pending = NULL;
		pthread_mutex_unlock(&md->pending_lock);
		/* Short of fds, every commit tried here may fail alike (EMFILE
		 * for its object), and a round of them said so once each: 189
		 * lines for 2,000 files closed behind a stopped ferry-reconciler
		 * (limits/a_stopped_reconciler_under_a_low_fd_limit). */
		bool fds_short = atomic_load(&md->fd_scarce);
		if (fds_short)
			log_hold_begin(3);
		for (struct inode *i = list; i; i = next) {
			bool done;
			next = i->pnext;
			pthread_mutex_lock(&i->lock);
			done = write_back_retry(md, i);
			pthread_mutex_unlock(&i->lock);
			if (done) {
				inode_unref(md, i, 0, 1);
			} else {
				probes |= i->w && i->w->probing;
				i->pnext = keep;
				keep = i;
			}
		}
		if (fds_short)
			log_hold_end("while ferry-mountd was short of fds (they are retried)");
		pthread_mutex_lock(&md->pending_lock);
		md->pending_probes |= probes;
		while (keep) {
			next = keep->pnext;
			keep->pnext = md->pending;
			md->pending = keep;
			keep = next;
		}
	}
	pthread_mutex_unlock(&md->pending_lock);
	return NULL;
}

void write_back_defer(struct mountd *md, struct inode *ino)
{
	/* Caller holds ino->lock and has checked !ino->pending. */
	ino->pending = true;
	inode_ref(md, ino->ino, 0, 1);
	pthread_mutex_lock(&md->pending_lock);
	ino->pnext = md->pending;
	md->pending = ino;
	pthread_mutex_unlock(&md->pending_lock);
}

void write_back_defer_closed(struct mountd *md, struct inode *ino)
{
	struct wstate *w = ino->w;

	/* The writer's next creates need the fd more than this file needs
	 * to be handed over now: nothing writes it (its last close). */
	if (w && !w->mapped && w->fd >= 0) {
		close(w->fd);
		w->fd = -1;
	}
	if (w)
		w->fd_deferred = true;
	/* (No wake-up: the retry thread comes round on its own.) */
	write_back_defer(md, ino);
}

void write_back_probe_later(struct mountd *md, struct inode *ino)
{
	struct wstate *w = ino->w;

	w->probing = true;
	clock_gettime(CLOCK_MONOTONIC, &w->probe_since);
	write_back_defer(md, ino);
	pthread_mutex_lock(&md->pending_lock);
	md->pending_probes = true;
	pthread_cond_signal(&md->pending_cond);
	pthread_mutex_unlock(&md->pending_lock);
}

int write_back_start(struct mountd *md)
{
	int rc = pthread_create(&md->pending_thread, NULL, write_back_main, md);
	if (rc)
		return -rc;
	md->pending_thread_live = true;
	return 0;
}

void write_back_stop(struct mountd *md)
{
	if (!md->pending_thread_live)
		return;
	pthread_mutex_lock(&md->pending_lock);
	md->pending_stop = true;
	pthread_cond_signal(&md->pending_cond);
	pthread_mutex_unlock(&md->pending_lock);
	pthread_join(md->pending_thread, NULL);
	md->pending_thread_live = false;
}

size_t write_back_flush_all(struct mountd *md)
{
	size_t left = 0;
	struct inode *list, *next;

	pthread_mutex_lock(&md->pending_lock);
	list = md->pending;
	md->pending = NULL;
	pthread_mutex_unlock(&md->pending_lock);
	for (struct inode *i = list; i; i = next) {
		next = i->pnext;
		pthread_mutex_lock(&i->lock);
		if (wstate_commit(md, i) == 0) {
			wstate_drop(md, i);
			i->pending = false;
			pthread_mutex_unlock(&i->lock);
			inode_unref(md, i, 0, 1);
			continue;
		}
		/* Keep the staging file: its data must not be lost. */
		log_warnx("inode %llu: writes still staged in %s could not be committed (%s); "
			  "the file is kept",
			  (unsigned long long)i->ino, i->w->path, strerror(-i->w->last_error));
		/* The staging file and its close() record stay: the next start
		 * hands them to the reconciler (or keeps them as .orphan). */
		backing_close(md, i->w->backing_id);
		close(i->w->fd);
		free(i->w->path);
		free(i->w->dirty);
		free(i->w->prints);
		free(i->w);
		i->w = NULL;
		i->pending = false;
		pthread_mutex_unlock(&i->lock);
		inode_unref(md, i, 0, 1);
		left++;
	}
	return left;
}

void staging_adopt(struct mountd *md)
{
	for (size_t k = 0; k < md->nadopt; k++) {
		const char *n = md->adopt[k];
		char *end;
		uint64_t ino = strtoull(n, &end, 10);
		struct wstate *w = NULL;
		struct inode *i = NULL;
		struct stat st;
		int rc = -EINVAL;

		if (*end != '-' || ino == 0)
			goto next;
		i = inode_ref(md, ino, 0, 1);
		w = calloc(1, sizeof(*w));
		rc = !i || !w ? -ENOMEM : 0;
		if (rc == 0 && asprintf(&w->path, "%s/%s", md->cfg.staging_dir, n) < 0) {
			w->path = NULL;
			rc = -ENOMEM;
		}
		if (rc < 0)
			goto next;
		w->fd = openat(md->staging_dirfd, n, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
		if (w->fd < 0 || fstat(w->fd, &st) < 0) {
			rc = -errno;
			goto next;
		}
		pthread_mutex_lock(&i->lock);
		if (i->w && !strcmp(strrchr(i->w->path, '/') + 1, n)) {
			/* Handed over with its handles (handover_restore). */
			pthread_mutex_unlock(&i->lock);
			goto next;
		}
		if (i->w || i->pending) {
			pthread_mutex_unlock(&i->lock);
			rc = -EEXIST;
			goto next;
		}
		w->passthrough = true;
		w->copy_unsynced = staging_is_copy(n);
		w->size = (uint64_t)st.st_size;
		w->size_changed = true;
		w->mtime = st.st_mtim;
		w->started_mtime = st.st_mtim;
		w->dir_synced = true;
		/* A mapping's state: the staging file stays the inode's while
		 * the dead daemon's opens hold it, committed now and then from
		 * the retry list, and handed over once they are gone. */
		w->mapped = true;
		clock_gettime(CLOCK_MONOTONIC, &w->mapped_commit);
		w->mapped_commit.tv_sec -= MAPPED_COMMIT_SEC;
		i->w = w;
		w = NULL;
		write_back_defer(md, i);
		pthread_mutex_unlock(&i->lock);
		atomic_fetch_add(&md->stats.staging_adopted, 1);
		log_info("inode %llu: its staging file %s is still open through the FUSE connection "
			 "this daemon took over: it stays the file's, committed from here",
			 (unsigned long long)ino, n);
next:
		if (rc < 0)
			log_errno(rc, "cannot adopt the staging file %s still in use (left where it is; "
				  "the next start recovers it)", n);
		if (w) {
			if (w->fd >= 0)
				close(w->fd);
			free(w->path);
			free(w);
		}
		if (i)
			inode_unref(md, i, 0, 1);
		free(md->adopt[k]);
	}
	free(md->adopt);
	md->adopt = NULL;
	md->nadopt = 0;
}
