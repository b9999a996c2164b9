/*
 * The FUSE lowlevel handlers. Each handler counts its request, does its work
 * in a helper that returns 0 or a negative errno, and replies exactly once.
 * Handles live in the lock-free handle table; inodes in the inode table.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "inval.h"
#include "log.h"
#include "mountd.h"

#ifndef FALLOC_FL_KEEP_SIZE
#define FALLOC_FL_KEEP_SIZE 0x01
#endif
#ifndef FALLOC_FL_PUNCH_HOLE
#define FALLOC_FL_PUNCH_HOLE 0x02
#endif

struct open_file {
	struct inode *ino;       /* one reference (nopen) */
	uint64_t fh;
	bool writer;             /* counted in ino->nwriters */
	bool passthrough;        /* counted in ino->w->npt, else in ino->ncached */
	bool setid_clear;        /* a write through it found no set-id bits to clear */
	struct readahead ra;     /* its reads so far, for read-ahead */
	/* Its READs of committed data (read_whole_note()): a reader that read
	 * the file whole, in order, asks at release for a local copy
	 * (copy_build_later()). Updated without a lock, as ra is. */
	_Atomic uint64_t whole_next;  /* where the last READ ended */
	_Atomic uint64_t whole_end;   /* the furthest any READ reached */
	_Atomic uint64_t whole_bytes; /* bytes READ */
	_Atomic uint64_t whole_size;  /* the file's, at the last READ */
	_Atomic bool whole_jumped;    /* a READ landed away from the last one */
};

/* Notes a READ of [off, off+len) of a file of committed size fsize. */
static void read_whole_note(struct open_file *of, uint64_t fsize, uint64_t off, size_t len)
{
	uint64_t end = len < fsize - off ? off + len : fsize, next, far;

	if (off >= fsize)
		return;
	/* Each READ near where the one before ended, the first near offset
	 * 0 (whole_next starts there): within RA_SLACK, as read-ahead sees a
	 * sequential reader. */
	next = atomic_exchange(&of->whole_next, end);
	if (off + RA_SLACK < next || off > next + RA_SLACK)
		atomic_store(&of->whole_jumped, true);
	far = atomic_load(&of->whole_end);
	while (far < end && !atomic_compare_exchange_weak(&of->whole_end, &far, end))
		;
	atomic_fetch_add(&of->whole_bytes, end - off);
	atomic_store(&of->whole_size, fsize);
}

/* Whether of read its file whole, in order, once: its READs went from the
 * start to the end (within RA_SLACK of each) with no jump, and carried at
 * least half of the file (the kernel serves the pages it still caches
 * without a READ: a file read at random before has gaps) and at most twice
 * it (not one part again and again). *size is the file's. */
static bool read_whole(struct open_file *of, uint64_t *size)
{
	uint64_t bytes = atomic_load(&of->whole_bytes);

	*size = atomic_load(&of->whole_size);
	return !of->writer && !of->passthrough && *size > 0 && !atomic_load(&of->whole_jumped) &&
	       atomic_load(&of->whole_end) + RA_SLACK >= *size && bytes >= *size / 2 &&
	       bytes / 2 <= *size;
}

static inline struct mountd *MD(fuse_req_t req)
{
	return fuse_req_userdata(req);
}

/* libfuse (3.18) ends its io_uring threads with pthread_cancel() at
 * unmount, and runs handlers on them with cancellation enabled: a handler
 * cancelled in a nanosleep or an fsync would leave what it holds held (a
 * mutex; a SQLite lock, for which every other connection of the process
 * then waits at exit). A ring thread's first request turns cancellation
 * off for good; the thread still ends, on the eventfd libfuse wakes it
 * with before the cancel. Every handler comes through here first. */
static inline void ring_request(fuse_req_t req)
{
#ifdef FUSE_CAP_OVER_IO_URING
	static _Thread_local bool cancel_off;

	if (!fuse_req_is_uring(req))
		return;
	if (!cancel_off) {
		pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, NULL);
		cancel_off = true;
		/* What .stats says: libfuse starts the ring after INIT and,
		 * should that fail, serves on through /dev/fuse (a log line). */
		atomic_store(&MD(req)->uring, true);
	}
	atomic_fetch_add_explicit(&MD(req)->stats.uring_requests, 1, memory_order_relaxed);
#else
	(void)req;
#endif
}

static inline void count(fuse_req_t req, enum op_id op)
{
	ring_request(req);
	atomic_fetch_add_explicit(&MD(req)->stats.requests[op], 1, memory_order_relaxed);
}

static bool name_ok(const char *name)
{
	return strlen(name) <= META_NAME_MAX;
}

/* Checks a name about to be created under parent: 0 or the errno. */
static int new_name_check(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	(void)req;
	if (!name_ok(name))
		return ENAMETOOLONG;
	if (special_named(parent, name))
		return EEXIST;
	return 0;
}

static void attr_to_stat(const struct meta_attr *a, struct stat *st)
{
	memset(st, 0, sizeof(*st));
	st->st_ino = a->ino;
	st->st_mode = a->mode;
	st->st_nlink = a->nlink;
	st->st_uid = a->uid;
	st->st_gid = a->gid;
	st->st_rdev = a->rdev;
	st->st_size = (off_t)a->size;
	st->st_blksize = 4096;
	st->st_blocks = (blkcnt_t)((a->size + 511) / 512);
	st->st_atim = a->atime;
	st->st_mtim = a->mtime;
	st->st_ctim = a->ctime;
}

static bool timespec_later(const struct timespec *a, const struct timespec *b)
{
	return a->tv_sec > b->tv_sec || (a->tv_sec == b->tv_sec && a->tv_nsec > b->tv_nsec);
}

/* a is what the kernel is about to be given for i (job_committed() in
 * reconcile_client.c). While a passthrough writer is open the kernel may
 * apply it after a write it did not see (kernels before the passthrough
 * write hook bumped attr_version): then it proves nothing about a size
 * the commit changed. Caller holds i->lock. */
static void told_record(struct inode *i, const struct meta_attr *a)
{
	i->told_valid = true;
	i->told_racy = i->w && i->w->passthrough;
	i->told_size = a->size;
	i->told_mtime = a->mtime;
	i->told_ctime = a->ctime;
}

/* The kernel holds attributes of i that no reply recorded (a change made
 * without telling it): the next commit drops them. Caller holds i->lock. */
static void told_forget(struct inode *i)
{
	i->told_valid = false;
}

static void told_forget_ino(struct mountd *md, uint64_t ino)
{
	struct inode *i = inode_ref_existing(md, ino);

	if (i) {
		pthread_mutex_lock(&i->lock);
		told_forget(i);
		pthread_mutex_unlock(&i->lock);
		inode_unref(md, i, 0, 1);
	}
}

/* Applies pending writes (size, mtime) of a live staging file or of a job
 * in flight over a. Caller holds i->lock, and read a under it: a commit
 * (which ends both) takes that lock too, so a and the overlay agree. */
static void overlay_locked(struct inode *i, struct meta_attr *a)
{
	if (i->inflight_seq && !i->w) {
		/* Handed to the reconciler, not committed yet. */
		a->size = i->inflight_size;
		a->mtime = i->inflight_mtime;
		if (timespec_later(&a->mtime, &a->ctime))
			a->ctime = a->mtime;
	} else if (i->w) {
		uint64_t size;
		struct timespec mtime;
		if (wstate_stat(i->w, &size, &mtime) == 0) {
			a->size = size;
			if (i->w->passthrough || i->w->ndirty || i->w->size_changed) {
				a->mtime = mtime;
				if (timespec_later(&mtime, &a->ctime))
					a->ctime = mtime;
			}
		}
	}
	told_record(i, a);
}

/* The attributes of ino as a reader sees them: committed metadata plus
 * what is staged or in flight. */
static int attr_get(struct mountd *md, uint64_t ino, struct meta_attr *a)
{
	struct inode *i = inode_ref_existing(md, ino);
	int rc;

	if (!i)
		return meta_getattr(md->meta, ino, a);
	pthread_mutex_lock(&i->lock);
	rc = meta_getattr(md->meta, ino, a);
	if (rc == 0 && S_ISREG(a->mode))
		overlay_locked(i, a);
	pthread_mutex_unlock(&i->lock);
	inode_unref(md, i, 0, 1);
	return rc;
}

/* Brings attributes read elsewhere (lookup, link, readdirplus) up to date
 * with attr_get(). */
static void overlay_wstate(struct mountd *md, struct meta_attr *a)
{
	struct meta_attr fresh;

	if (S_ISREG(a->mode) && inode_find(md, a->ino) && attr_get(md, a->ino, &fresh) == 0)
		*a = fresh;
}

static void fill_entry(struct mountd *md, const struct meta_attr *a, struct fuse_entry_param *e)
{
	memset(e, 0, sizeof(*e));
	e->ino = a->ino;
	e->generation = 1;
	attr_to_stat(a, &e->attr);
	e->attr_timeout = md->cfg.attr_timeout;
	e->entry_timeout = md->cfg.entry_timeout;
}

/* Marks an inode this daemon just made as having no xattrs (struct inode);
 * a, when given, is the regular file's attributes its reply carries. */
static void made_inode_note(struct mountd *md, uint64_t ino, const struct meta_attr *a)
{
	struct inode *i = inode_ref_existing(md, ino);

	if (i) {
		atomic_store(&i->xattr_none, true);
		if (a) {
			pthread_mutex_lock(&i->lock);
			told_record(i, a);
			i->told_racy = false; /* nothing has the file to write yet */
			pthread_mutex_unlock(&i->lock);
		}
		inode_unref(md, i, 0, 1);
	}
}

static bool xattr_none(struct mountd *md, uint64_t ino)
{
	struct inode *i = inode_ref_existing(md, ino);
	bool none = false;

	if (i) {
		none = atomic_load(&i->xattr_none);
		inode_unref(md, i, 0, 1);
	}
	return none;
}

/* Replies with an entry and takes the kernel's lookup reference. */
static void reply_entry(fuse_req_t req, const struct meta_attr *a)
{
	struct mountd *md = MD(req);
	struct fuse_entry_param e;

	struct inode *i;

	fill_entry(md, a, &e);
	i = inode_ref(md, a->ino, 1, 0);
	if (!i) {
		fuse_reply_err(req, ENOMEM);
		return;
	}
	if (fuse_reply_entry(req, &e) != 0) /* the kernel will never forget it */
		inode_unref(md, i, 1, 0);
}

/* An unlink or rename removed the last link of ino. */
static void last_link_gone(struct mountd *md, uint64_t ino)
{
	struct inode *i;

	if (!inode_mark_unlinked(md, ino)) {
		int rc = meta_inode_release_later(md->meta, ino);
		if (rc < 0)
			log_errno(rc, "inode %llu: cannot free unlinked inode (left as orphan)",
				  (unsigned long long)ino);
		return;
	}
	/* Its local copy holds the inode (and so its data) only while readers
	 * share it: nobody else can open the file again. */
	if ((i = inode_ref_existing(md, ino))) {
		pthread_mutex_lock(&i->lock);
		local_copy_drop(md, i);
		pthread_mutex_unlock(&i->lock);
		inode_unref(md, i, 0, 1);
	}
}

/* ---- namespace ---- */

static void op_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	struct mountd *md = MD(req);
	struct meta_attr a;
	int rc;

	count(req, OP_LOOKUP);
	if (special_named(parent, name)) {
		struct fuse_entry_param e = { .ino = special_named(parent, name), .generation = 1 };
		special_stat(md, e.ino, &e.attr);
		fuse_reply_entry(req, &e);
		return;
	}
	if (!name_ok(name)) {
		fuse_reply_err(req, ENAMETOOLONG);
		return;
	}
	rc = meta_lookup(md->meta, parent, name, &a);
	if (rc == -ENOENT) {
		/* A negative entry: the kernel caches the absence; every change
		 * of the namespace passes through this daemon, which the kernel
		 * sees, so the cache cannot go stale (a follower's entry_timeout
		 * bounds it instead). */
		struct fuse_entry_param e = { .ino = 0, .entry_timeout = md->cfg.entry_timeout };
		fuse_reply_entry(req, &e);
		return;
	}
	if (rc < 0) {
		fuse_reply_err(req, -rc);
		return;
	}
	overlay_wstate(md, &a);
	reply_entry(req, &a);
}

static void op_forget(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup)
{
	struct mountd *md = MD(req);

	count(req, OP_FORGET);
	if (!special_ino(ino))
		inode_forget(md, ino, nlookup);
	fuse_reply_none(req);
}

static void op_forget_multi(fuse_req_t req, size_t n, struct fuse_forget_data *f)
{
	struct mountd *md = MD(req);

	ring_request(req);
	atomic_fetch_add(&md->stats.requests[OP_FORGET], 1);
	for (size_t k = 0; k < n; k++)
		if (!special_ino(f[k].ino))
			inode_forget(md, f[k].ino, f[k].nlookup);
	fuse_reply_none(req);
}

static void op_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct mountd *md = MD(req);
	struct meta_attr a;
	struct stat st;
	int rc;

	count(req, OP_GETATTR);
	if (special_ino(ino)) {
		special_stat(md, ino, &st);
		fuse_reply_attr(req, &st, 0); /* it changes with every read */
		return;
	}
	rc = attr_get(md, ino, &a);
	if (rc < 0) {
		fuse_reply_err(req, -rc);
		return;
	}
	attr_to_stat(&a, &st);
	fuse_reply_attr(req, &st, md->cfg.attr_timeout);
}

/* Waits until the inode's job at the reconciler (if any) is committed: its
 * data and size are then in the metadata. Caller holds i->lock. */
static int inflight_wait(struct mountd *md, struct inode *i, const char *what)
{
	int rc;

	if (!i->inflight_seq)
		return 0;
	atomic_fetch_add(&md->stats.reopen_waits, 1);
	rc = rclient_wait(md, i, md->cfg.reopen_timeout_ms);
	if (rc == -ENOSPC || rc == -EDQUOT) {
		log_errno(rc, "inode %llu: %s waits for its upload (job %llu), which cannot be "
			  "committed for want of space (it is retried)", (unsigned long long)i->ino,
			  what, (unsigned long long)i->inflight_seq);
		return rc;
	}
	if (rc < 0) {
		log_errno(rc, "inode %llu: %s waited for its upload (job %llu) in vain",
			  (unsigned long long)i->ino, what, (unsigned long long)i->inflight_seq);
		return -EIO;
	}
	return 0;
}

/*
 * The inode's job in flight, for a reader: an fd on its staging file, which
 * the reconciler only reads and removes once the commit is made, so it
 * holds every byte the commit will (the file as its last close left it),
 * and a reader need not wait for the upload. -1 if there is no job in
 * flight, a writer has staged since (its staging file is the file now), or
 * the file is gone already (the commit is being reported: wait for it).
 * Caller holds i->lock.
 */
static int inflight_file_for(struct mountd *md, struct inode *i, bool reader)
{
	char name[RECONCILE_NAME_MAX + 1];
	int fd;

	if (!i->inflight_seq || i->w || !i->inflight_whole)
		return -1;
	if (i->inflight_fd >= 0 && i->inflight_fd_seq == i->inflight_seq)
		return i->inflight_fd;
	if (i->inflight_fd >= 0)
		close(i->inflight_fd);
	i->inflight_fd = -1;
	rclient_inflight_name(md, i, name, sizeof(name));
	if (!name[0])
		return -1;
	fd = openat(md->staging_dirfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return -1;
	i->inflight_fd = fd;
	i->inflight_fd_seq = i->inflight_seq;
	if (reader)
		atomic_fetch_add(&md->stats.inflight_reads, 1);
	return fd;
}

static int inflight_file(struct mountd *md, struct inode *i)
{
	return inflight_file_for(md, i, true);
}

/* Reads [off, off+len) of the file from its staging file in flight (fd),
 * which holds size bytes. */
static ssize_t inflight_read(int fd, uint64_t size, char *buf, size_t len, off_t off)
{
	size_t n, done = 0;

	if ((uint64_t)off >= size)
		return 0;
	n = size - (uint64_t)off < len ? (size_t)(size - (uint64_t)off) : len;
	while (done < n) {
		ssize_t r = pread(fd, buf + done, n - done, off + (off_t)done);

		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return -errno;
		if (r == 0) {
			/* A staging file shorter than the job: the rest is a hole. */
			memset(buf + done, 0, n - done);
			break;
		}
		done += (size_t)r;
	}
	return (ssize_t)n;
}

/* Commits the inode's staged writes, if any. Caller holds i->lock. */
static int commit_locked(struct mountd *md, struct inode *i)
{
	return i->w ? wstate_commit(md, i) : 0;
}

/* A size change of a file with writes staged on the daemon path, after
 * meta_setattr() made it (after: what it returned): the staged writes are
 * cut at the new size, and the commit at close, which stages the size
 * again, carries this change's mtime, not the last write's (that would
 * bring the older one back). Caller holds i->lock; i->w is set. */
static int staged_truncate(struct inode *i, uint64_t size, const struct meta_attr *after)
{
	i->w->mtime = after->mtime;
	return wstate_truncate(i->w, size);
}

static bool copy_flushed_at_open(const struct mountd *md, int open_flags);

static void op_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *attr, int to_set,
		       struct fuse_file_info *fi)
{
	struct mountd *md = MD(req);
	struct meta_attr in = { 0 }, out;
	struct inode *i;
	unsigned valid = 0;
	struct stat st;
	int rc;

	count(req, OP_SETATTR);
	if (special_ino(ino)) {
		fuse_reply_err(req, EACCES);
		return;
	}
	if (to_set & FUSE_SET_ATTR_MODE) {
		valid |= META_SET_MODE;
		in.mode = attr->st_mode;
	}
	if (to_set & FUSE_SET_ATTR_UID) {
		valid |= META_SET_UID;
		in.uid = attr->st_uid;
	}
	if (to_set & FUSE_SET_ATTR_GID) {
		valid |= META_SET_GID;
		in.gid = attr->st_gid;
	}
	if (to_set & FUSE_SET_ATTR_SIZE) {
		/* Refused before anything changes: past the largest file the
		 * staging filesystem holds (ext4 answers EFBIG the same way). */
		if ((uint64_t)attr->st_size > md->max_file_size) {
			fuse_reply_err(req, EFBIG);
			return;
		}
		valid |= META_SET_SIZE;
		in.size = (uint64_t)attr->st_size;
	}
	if (to_set & FUSE_SET_ATTR_ATIME_NOW)
		valid |= META_SET_ATIME_NOW;
	else if (to_set & FUSE_SET_ATTR_ATIME) {
		valid |= META_SET_ATIME;
		in.atime = attr->st_atim;
	}
	if (to_set & FUSE_SET_ATTR_MTIME_NOW)
		valid |= META_SET_MTIME_NOW;
	else if (to_set & FUSE_SET_ATTR_MTIME) {
		valid |= META_SET_MTIME;
		in.mtime = attr->st_mtim;
	}
	if (to_set & FUSE_SET_ATTR_CTIME) {
		valid |= META_SET_CTIME;
		in.ctime = attr->st_ctim;
	}
	/* A size change marks mtime and ctime (POSIX truncate); the kernel
	 * asks for it only for ftruncate. */
	if ((valid & META_SET_SIZE) && !(valid & (META_SET_MTIME | META_SET_MTIME_NOW)))
		valid |= META_SET_MTIME_NOW;
	/* HANDLE_KILLPRIV_V2: the kernel leaves clearing set-id bits to us, on
	 * chown of a non-directory and when it asks (truncate by a caller
	 * without CAP_FSETID). */
	if (!(valid & META_SET_MODE) &&
	    ((to_set & FUSE_SET_ATTR_KILL_SUID) || (valid & (META_SET_UID | META_SET_GID)))) {
		struct meta_attr cur;
		if (meta_getattr(md->meta, ino, &cur) == 0 && !S_ISDIR(cur.mode)) {
			in.mode = cur.mode & ~(uint32_t)S_ISUID;
			if ((cur.mode & (S_ISGID | S_IXGRP)) == (S_ISGID | S_IXGRP))
				in.mode &= ~(uint32_t)S_ISGID;
			if (in.mode != cur.mode)
				valid |= META_SET_MODE;
		}
	}
	/* A reference of its own: a local copy's may be the inode's last
	 * (after a hand-over the kernel's lookups are not counted), and a
	 * change drops or takes over the copy. */
	i = inode_ref_existing(md, ino);
	if (i)
		pthread_mutex_lock(&i->lock);
	bool times_only = !(valid & ~(META_SET_ATIME | META_SET_ATIME_NOW | META_SET_MTIME |
				      META_SET_MTIME_NOW | META_SET_CTIME));
	/* The job carries size and mtime: it commits first, or it would undo
	 * this change; except a change of times only, made with the metadata
	 * journal on: the job's commit leaves times set after its handoff
	 * alone (meta_commit_item.meta_seq), so utimensat() after close()
	 * (tar, cp -p, git clone) need not wait for the upload. */
	bool times_now = i && times_only && i->inflight_seq && !i->w && md->meta_batch_ms > 0;
	rc = i && !times_now ? inflight_wait(md, i, "setattr") : 0;
	if (rc == 0 && i && i->w)
		rc = wstate_reopen(i->w);
	/* Readers (or a mapping) may share the local copy: it is cut where
	 * they read it, as the inode's staging file, which, if this made it and
	 * no open holds it, is handed off once nothing maps it. */
	bool took_copy = false;
	if (rc == 0 && i && !i->w && (valid & META_SET_SIZE)) {
		rc = local_copy_before_change(md, i, fi ? fi->fh : 0, copy_flushed_at_open(md, 0),
					      false, true);
		took_copy = rc == 0 && i->w;
	}
	if (rc < 0) {
		/* nothing applied */
	} else if (times_now) {
		rc = meta_setattr(md->meta, ino, valid, &in, &out);
		if (rc == 0 && (valid & (META_SET_MTIME | META_SET_MTIME_NOW)))
			i->inflight_mtime = out.mtime; /* what getattr shows until the commit */
	} else if (i && i->w && i->w->passthrough) {
		/* The staging file is the file's data until it is committed:
		 * size and mtime changes go to it, the rest to the metadata. */
		rc = 0;
		if ((valid & META_SET_SIZE) && ftruncate(i->w->fd, (off_t)in.size) < 0)
			rc = -errno;
		if (valid & META_SET_SIZE)
			i->w->size_changed = true;
		if (rc == 0 && (valid & (META_SET_ATIME | META_SET_ATIME_NOW | META_SET_MTIME |
					 META_SET_MTIME_NOW))) {
			struct timespec ts[2] = {
				{ .tv_nsec = UTIME_OMIT }, { .tv_nsec = UTIME_OMIT } };
			if (valid & META_SET_ATIME_NOW)
				ts[0].tv_nsec = UTIME_NOW;
			else if (valid & META_SET_ATIME)
				ts[0] = in.atime;
			if (valid & META_SET_MTIME_NOW)
				ts[1].tv_nsec = UTIME_NOW;
			else if (valid & META_SET_MTIME)
				ts[1] = in.mtime;
			if (futimens(i->w->fd, ts) < 0)
				rc = -errno;
			else if (valid & (META_SET_MTIME | META_SET_MTIME_NOW))
				i->w->mtime_set = true;
		}
		if (rc == 0)
			rc = meta_setattr(md->meta, ino, valid & ~META_SET_SIZE, &in, &out);
	} else if (valid & META_SET_SIZE) {
		rc = i ? commit_locked(md, i) : 0;
		if (rc == 0)
			rc = meta_setattr(md->meta, ino, valid, &in, &out);
		if (rc == 0 && i && i->w)
			rc = staged_truncate(i, in.size, &out);
	} else if (i && i->w && !(valid & ~(META_SET_ATIME | META_SET_ATIME_NOW | META_SET_MTIME |
					     META_SET_MTIME_NOW | META_SET_CTIME))) {
		/* Times only, with writes staged on the daemon path (the
		 * writeback cache sends the kernel's mtime at every write-back):
		 * the staged commit will carry this mtime, so it need not go
		 * first. */
		rc = meta_setattr(md->meta, ino, valid, &in, &out);
		if (rc == 0 && (valid & (META_SET_MTIME | META_SET_MTIME_NOW)))
			i->w->mtime = out.mtime;
	} else {
		/* Staged writes carry their own mtime: commit them first so an
		 * explicit utimens() is not overwritten by a later commit. */
		rc = i ? commit_locked(md, i) : 0;
		if (rc == 0)
			rc = meta_setattr(md->meta, ino, valid, &in, &out);
	}
	if (rc == 0 && i && S_ISREG(out.mode))
		overlay_locked(i, &out);
	else if (rc < 0 && i)
		told_forget(i); /* a truncate may have been done, its reply not */
	if (i && (valid & META_SET_SIZE))
		layout_forget(md, i);
	if (took_copy && i->w && i->w->npt == 0 && i->nwriters == 0 && !i->pending)
		write_back_probe_later(md, i);
	if (i) {
		pthread_mutex_unlock(&i->lock);
		inode_unref(md, i, 0, 1);
	}
	if (rc < 0) {
		fuse_reply_err(req, -rc);
		return;
	}
	attr_to_stat(&out, &st);
	fuse_reply_attr(req, &st, md->cfg.attr_timeout);
}

static void op_readlink(fuse_req_t req, fuse_ino_t ino)
{
	char *target = NULL;
	int rc;

	count(req, OP_READLINK);
	rc = meta_readlink(MD(req)->meta, ino, &target);
	if (rc < 0)
		fuse_reply_err(req, -rc);
	else
		fuse_reply_readlink(req, target);
	free(target);
}

static void do_create_node(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode,
			   dev_t rdev, const char *target)
{
	struct mountd *md = MD(req);
	const struct fuse_ctx *ctx = fuse_req_ctx(req);
	struct meta_attr a;
	int rc;

	if ((rc = new_name_check(req, parent, name)) != 0) {
		fuse_reply_err(req, rc);
		return;
	}
	rc = meta_create(md->meta, parent, name, mode, ctx->uid, ctx->gid, rdev, target, &a);
	if (rc < 0) {
		fuse_reply_err(req, -rc);
		return;
	}
	reply_entry(req, &a);
}

static void op_mknod(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode, dev_t rdev)
{
	count(req, OP_MKNOD);
	switch (mode & S_IFMT) {
	case S_IFREG: case S_IFIFO: case S_IFSOCK: case S_IFCHR: case S_IFBLK:
		break;
	default:
		fuse_reply_err(req, EINVAL);
		return;
	}
	do_create_node(req, parent, name, mode, rdev, NULL);
}

static void op_mkdir(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode)
{
	count(req, OP_MKDIR);
	do_create_node(req, parent, name, S_IFDIR | (mode & 07777), 0, NULL);
}

static void op_symlink(fuse_req_t req, const char *link, fuse_ino_t parent, const char *name)
{
	count(req, OP_SYMLINK);
	if (strlen(link) >= PATH_MAX) {
		fuse_reply_err(req, ENAMETOOLONG);
		return;
	}
	do_create_node(req, parent, name, S_IFLNK | 0777, 0, link);
}

static void op_unlink(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	struct mountd *md = MD(req);
	struct meta_attr v;
	int rc;

	count(req, OP_UNLINK);
	if (special_named(parent, name)) {
		fuse_reply_err(req, EACCES);
		return;
	}
	rc = meta_unlink(md->meta, parent, name, &v);
	if (rc == 0 && v.nlink == 0)
		last_link_gone(md, v.ino);
	fuse_reply_err(req, -rc);
}

static void op_rmdir(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	struct mountd *md = MD(req);
	struct meta_attr v;
	int rc;

	count(req, OP_RMDIR);
	rc = meta_rmdir(md->meta, parent, name, &v);
	if (rc == 0)
		last_link_gone(md, v.ino);
	fuse_reply_err(req, -rc);
}

static void op_rename(fuse_req_t req, fuse_ino_t parent, const char *name, fuse_ino_t newparent,
		      const char *newname, unsigned int flags)
{
	struct mountd *md = MD(req);
	struct meta_attr v = { 0 };
	unsigned mflags = 0;
	int rc;

	count(req, OP_RENAME);
	if (flags & ~(RENAME_NOREPLACE | RENAME_EXCHANGE)) {
		fuse_reply_err(req, EINVAL);
		return;
	}
	if (!name_ok(newname)) {
		fuse_reply_err(req, ENAMETOOLONG);
		return;
	}
	if (special_named(parent, name) || special_named(newparent, newname)) {
		fuse_reply_err(req, EACCES);
		return;
	}
	if (flags & RENAME_NOREPLACE)
		mflags |= META_RENAME_NOREPLACE;
	if (flags & RENAME_EXCHANGE)
		mflags |= META_RENAME_EXCHANGE;
	rc = meta_rename(md->meta, parent, name, newparent, newname, mflags, &v);
	if (rc == 0 && v.ino && v.nlink == 0)
		last_link_gone(md, v.ino);
	fuse_reply_err(req, -rc);
}

static void op_link(fuse_req_t req, fuse_ino_t ino, fuse_ino_t newparent, const char *newname)
{
	struct mountd *md = MD(req);
	struct meta_attr a;
	int rc;

	count(req, OP_LINK);
	if (special_ino(ino)) {
		fuse_reply_err(req, EPERM);
		return;
	}
	if (!name_ok(newname)) {
		fuse_reply_err(req, ENAMETOOLONG);
		return;
	}
	if (special_named(newparent, newname)) {
		fuse_reply_err(req, EEXIST);
		return;
	}
	rc = meta_link(md->meta, ino, newparent, newname, &a);
	if (rc < 0) {
		fuse_reply_err(req, -rc);
		return;
	}
	overlay_wstate(md, &a);
	reply_entry(req, &a);
}

/* ---- files ---- */

/* O_TRUNC arrives inside OPEN (atomic_o_trunc), so the kernel's own
 * clearing of set-id bits on truncate does not run: do it as it would, for
 * callers without CAP_FSETID (here: not root). */
static unsigned trunc_kill_suid(struct mountd *md, uint64_t ino, uid_t caller,
				struct meta_attr *in)
{
	struct meta_attr a;

	if (caller == 0 || meta_getattr(md->meta, ino, &a) < 0 || !S_ISREG(a.mode))
		return 0;
	in->mode = a.mode & ~(mode_t)S_ISUID;
	if ((a.mode & (S_ISGID | S_IXGRP)) == (S_ISGID | S_IXGRP))
		in->mode &= ~(mode_t)S_ISGID;
	return in->mode != a.mode ? META_SET_MODE : 0;
}

/* Whether the staging file system has less than --staging-min-free. The
 * answer is kept for ROOM_CHECK_NS: a burst of small files would otherwise
 * pay a statfs per file, and noticing the threshold a few milliseconds
 * late only lets one more file start in passthrough. */
#define ROOM_CHECK_NS (20 * 1000 * 1000)
bool staging_room_low(struct mountd *md)
{
	int64_t now, then;
	struct statvfs sv;
	bool low;

	if (!md->staging_min_free)
		return false;
	now = mono_now_ns();
	then = atomic_load(&md->staging_room_checked_ns);
	if (then && now - then < ROOM_CHECK_NS)
		return atomic_load(&md->staging_room_low);
	low = fstatvfs(md->staging_dirfd, &sv) == 0 &&
	      (uint64_t)sv.f_bavail * sv.f_frsize < md->staging_min_free;
	atomic_store(&md->staging_room_low, low);
	atomic_store(&md->staging_room_checked_ns, now);
	return low;
}

/* Whether a new passthrough staging file may start now. */
static bool passthrough_allowed(struct mountd *md)
{
	if (atomic_load(&md->pt_off))
		return false;
	/* Staging headroom: a full staging disk would fail writes that the
	 * daemon path could still take. */
	if (staging_room_low(md)) {
		atomic_fetch_add(&md->stats.passthrough_no_room, 1);
		return false;
	}
	return true;
}

/*
 * Whether a copy in a staging file (wstate copy_unsynced) must be flushed
 * before this open returns, rather than stay named for this boot until a
 * daemon's orderly stop flushes it (STAGING_COPY_SUFFIX). An fsync=local
 * mount promises durability on the node at fsync(), and O_SYNC/O_DSYNC
 * writes and msync() of a passthrough file reach the staging file without
 * the daemon hearing of them: each must find the copy on stable storage
 * already. So must a start that could not record that this run's copies
 * are unflushed (staging_recover()).
 */
static bool copy_flushed_at_open(const struct mountd *md, int open_flags)
{
	return md->fsync_local || (open_flags & O_DSYNC) || md->copies_flushed;
}

/* An open sharing a passthrough staging file that holds an unflushed copy
 * flushes it first where it would expect durability of it. */
static int shared_copy_flush(struct mountd *md, struct wstate *w, int open_flags)
{
	if (!(w->copy_unsynced || w->copy_rename_pending) || !copy_flushed_at_open(md, open_flags))
		return 0;
	return wstate_copy_flush(md, w);
}

/*
 * The I/O mode of a new open. The kernel keeps one mode per inode
 * (fs/fuse/iomode.c): while the inode has a passthrough staging file every
 * open shares its backing id, and an inode open in cached mode gets no
 * passthrough writer. A writer of a file that is empty at open (created,
 * O_TRUNC, or length 0) with nothing else staged starts one; so does a
 * writer of a file of copy_size bytes up to passthrough_copy_max, whose
 * content is copied in first (copy_size UINT64_MAX: not copyable), from
 * copy_src when that is not -1 (see wstate_copy_up).
 * created: the attributes of a file this request made (see open_file).
 * Caller holds i->lock.
 */
static int open_mode_locked(struct mountd *md, struct inode *i, struct open_file *of,
			    bool empty, uint64_t copy_size, int copy_src,
			    const struct meta_attr *created, struct fuse_file_info *fi)
{
	struct wstate *w = i->w;
	int id;

	if (w && w->passthrough && w->backing_id > 0) {
		int rc = shared_copy_flush(md, w, fi->flags);

		if (rc < 0)
			return rc;
		fi->backing_id = w->backing_id;
		of->passthrough = true;
		w->npt++;
		return 0;
	}
	if (w && w->passthrough && w->npt == 0 && i->ncached == 0) {
		/* The staging file outlived its opens (a mapping of it lives on,
		 * or its commit is being retried): it holds the whole file, so
		 * this open shares it. */
		int rc = shared_copy_flush(md, w, fi->flags);

		if (rc < 0)
			return rc;
		id = wstate_passthrough_resume(md, i);
		if (id > 0) {
			fi->backing_id = id;
			of->passthrough = true;
			w->npt++;
			return 0;
		}
		passthrough_unavailable(md, i->ino, id);
	}
	if (!of->writer && !w && i->ncached == 0 && i->kept_name) {
		/* The file's local copy, read by the kernel itself. */
		id = local_copy_share(md, i);
		if (id > 0) {
			fi->backing_id = id;
			of->passthrough = true;
			i->nkept++;
			return 0;
		}
	}
	if (of->writer && !empty && copy_size != UINT64_MAX && copy_size > md->pt_copy_max &&
	    !w && i->ncached == 0 && md->pt_mode != PT_OFF)
		atomic_fetch_add(&md->stats.copy_up_too_big, 1);
	if (of->writer && (empty || copy_size <= md->pt_copy_max) && !w && i->ncached == 0 &&
	    md->pt_mode != PT_OFF && passthrough_allowed(md)) {
		struct meta_attr a;
		if (created)
			a = *created; /* nobody else knows the inode yet */
		else if (meta_getattr(md->meta, i->ino, &a) < 0) {
			clock_gettime(CLOCK_REALTIME, &a.mtime);
			a.size = UINT64_MAX; /* unknown: commit the size */
		}
		id = wstate_passthrough_start(md, i, of->fh, a.mtime, a.size, !empty);
		if (id > 0 && !empty) {
			/* A file with content: the staging file gets all of it,
			 * as the kernel will read and write it there. */
			int rc = wstate_copy_up(md, i, copy_size, copy_src,
						copy_flushed_at_open(md, fi->flags));
			if (rc < 0) {
				atomic_fetch_add(&md->stats.copy_up_failures, 1);
				log_errno(rc, "inode %llu: cannot copy %llu bytes into a staging "
					  "file; this open takes the daemon path",
					  (unsigned long long)i->ino, (unsigned long long)copy_size);
				wstate_drop(md, i);
				id = 0;
			}
		}
		if (id > 0) {
			fi->backing_id = id;
			of->passthrough = true;
			i->w->npt++;
			return 0;
		}
		if (id < 0) /* 0: the copy-up failed, logged above */
			passthrough_unavailable(md, i->ino, id);
	}
	i->ncached++;
	return 0;
}

/*
 * Ends a handle and frees of. When the last passthrough user goes, the
 * backing id is closed; when the last writer (and passthrough user) goes,
 * the staged writes are committed and the staging file dropped, or, if the
 * commit fails, left staged on the retry list. Caller holds no lock.
 */
static void file_release(struct mountd *md, struct open_file *of, uint64_t nlookup)
{
	struct inode *i = of->ino;
	struct wstate *w;
	int close_id = 0; /* closed at the end, unless the pool takes it */

	pthread_mutex_lock(&i->lock);
	w = i->w;
	if (of->writer && --i->nwriters == 0)
		i->wb_error_unstaged = 0; /* every writer was told */
	uint64_t whole;
	if (!of->passthrough) {
		i->ncached--;
		if (read_whole(of, &whole))
			copy_build_later(md, i, whole);
	} else if (w)
		w->npt--;
	else if (i->nkept > 0 && --i->nkept == 0) {
		close_id = local_copy_unshare(md, i);
		if (inode_is_unlinked(md, i))
			local_copy_drop(md, i); /* of holds a reference still */
	}
	if (w && w->passthrough && w->npt == 0 && w->backing_id > 0) {
		/* The id holds our own open of the staging file, which the
		 * lease probe below does not count: it can wait. */
		close_id = w->backing_id;
		w->backing_id = 0;
	}
	if (w && i->nwriters == 0 && w->npt == 0 && !i->pending) {
		int rc = -ENOTCONN;
		bool unlinked = inode_is_unlinked(md, i);

		if (unlinked && i->ncached > 0) {
			/* Unlinked, but readers still hold it open: POSIX keeps
			 * the contents until the last of them closes, and they
			 * read through the staging file (op_read's overlay). */
		} else if (unlinked) {
			wstate_drop(md, i); /* nobody can see these bytes again */
		} else if (w->passthrough && wstate_mapped_at_release(md, w)) {
			/* A shared mapping made through a passthrough open lives on
			 * the staging file itself: it stays this inode's file (later
			 * opens share it, so the mapping and they see one file) until
			 * the mapping goes. Or the kernel has not let go of the file
			 * yet: the retry list tells which, off this thread. */
			write_back_probe_later(md, i);
		} else if (rclient_up(md) && (rc = rclient_handoff(md, i)) == 0) {
			/* the reconciler has it; the inode waits for its commit */
			local_copy_keep(md, i);
		} else if (rc == -EMFILE) {
			/* No room for the hand-off and short of fds: committing
			 * here would need more of them, and waiting keeps this
			 * one while the writer opens more (rclient_handoff). */
			write_back_defer_closed(md, i);
		} else if (rc == -ENODATA) {
			if (wstate_recycle(md, i, close_id))
				close_id = 0; /* the pool's, with the file */
			else if (!local_copy_keep_unchanged(md, i))
				wstate_drop(md, i);
		} else {
			if (rc != -ENOTCONN && rc != -E2BIG && rc != -EAGAIN) { /* stall: logged once */
				atomic_fetch_add(&md->stats.handoff_failures, 1);
				log_errno(rc, "inode %llu: cannot hand the staging file to "
					  "ferry-reconciler; committing here", (unsigned long long)i->ino);
			}
			if (wstate_commit(md, i) == 0)
				wstate_drop(md, i);
			else
				write_back_defer(md, i); /* the data stays staged and is retried */
		}
	}
	pthread_mutex_unlock(&i->lock);
	backing_close(md, close_id); /* ignores 0 */
	inode_unref(md, i, nlookup, 1);
	free(of);
}

/* Opens a handle on ino; truncates first for O_TRUNC. created: the
 * attributes meta_create() gave the file when this request (CREATE) just
 * made it, else NULL. */
static int open_file(struct mountd *md, uint64_t ino, uid_t caller,
		     const struct meta_attr *created, struct fuse_file_info *fi)
{
	bool writer = (fi->flags & O_ACCMODE) != O_RDONLY;
	struct open_file *of;
	struct meta_attr a = { 0 };
	struct inode *i;
	uint64_t src_seq = 0, src_size = 0;
	int src = -1; /* the last job's staging file, see below; closed here */
	int rc = 0;

	of = calloc(1, sizeof(*of));
	if (!of)
		return -ENOMEM;
	i = inode_ref(md, ino, 0, 1);
	if (!i) {
		free(of);
		return -ENOMEM;
	}
	of->ino = i;
	of->writer = writer;
	rc = handle_add(md->handles, HANDLE_FILE, of, &of->fh);
	if (rc < 0)
		goto fail;
	pthread_mutex_lock(&i->lock);
	/* A writer of a file whose last close is being uploaded keeps that
	 * job's staging file: once the commit is made it holds what a copy
	 * into a new staging file would fetch from the store (the reconciler
	 * removes it then, this fd keeps it). */
	if (writer && !created && !(fi->flags & O_TRUNC) && md->pt_mode != PT_OFF &&
	    i->ncached == 0 && i->inflight_size <= md->pt_copy_max) {
		int fd = inflight_file_for(md, i, false);

		if (fd >= 0 && (src = fcntl(fd, F_DUPFD_CLOEXEC, 0)) >= 0) {
			src_seq = i->inflight_seq;
			src_size = i->inflight_size;
		}
	}
	/* Close-to-open: the last close's upload commits first, unless this
	 * is a reader, which reads the job's staging file meanwhile. */
	if (writer || (fi->flags & O_TRUNC) || inflight_file(md, i) < 0)
		rc = inflight_wait(md, i, "open");
	if (rc == 0 && i->w)
		rc = wstate_reopen(i->w);
	/* A change to the data is coming: the local copy goes, or becomes the
	 * staging file (local_copy_before_change()). */
	bool took_copy = false;
	if (rc == 0 && !i->w && (writer || (fi->flags & O_TRUNC))) {
		rc = local_copy_before_change(md, i, of->fh, copy_flushed_at_open(md, fi->flags),
					      writer, fi->flags & O_TRUNC);
		took_copy = rc == 0 && i->w;
	}
	if (rc < 0) {
		/* fall through to the unlock below */
	} else if (fi->flags & O_TRUNC) {
		/* Even O_RDONLY|O_TRUNC: POSIX leaves it undefined, Linux file
		 * systems truncate (the kernel checked write permission). */
		struct meta_attr in = { .size = 0 };
		unsigned valid = META_SET_SIZE | META_SET_MTIME_NOW;
		if (i->w && i->w->passthrough) {
			/* Shared staging file: truncate it; the commit stores it.
			 * The set-id bits go now, as on the path below. */
			unsigned kill;

			if (ftruncate(i->w->fd, 0) < 0)
				rc = -errno;
			i->w->size_changed = true;
			if (rc == 0 && (kill = trunc_kill_suid(md, ino, caller, &in)) != 0) {
				rc = meta_setattr(md->meta, ino, kill, &in, NULL);
				inval_attr(md, ino); /* the set-id bits it holds */
			}
			if (rc < 0)
				told_forget(i); /* truncated, and the open fails */
		} else {
			struct meta_attr after;

			rc = commit_locked(md, i);
			if (rc == 0) {
				valid |= trunc_kill_suid(md, ino, caller, &in);
				rc = meta_setattr(md->meta, ino, valid, &in, &after);
				layout_forget(md, i);
				if (valid & META_SET_MODE)
					inval_attr(md, ino); /* the set-id bits it holds */
			}
			if (rc == 0 && i->w)
				rc = staged_truncate(i, 0, &after);
			if (rc < 0)
				told_forget(i);
		}
	} else if (writer && !created && !i->w) {
		rc = meta_getattr(md->meta, ino, &a);
	}
	/* The job's staging file is the committed file only if the
	 * reconciler reported that job's commit and it is the last change to
	 * the data (every change to committed data moves layout_gen, under
	 * i->lock, which this thread holds), and no job left by an earlier run
	 * may still commit unannounced (layout_ready). */
	if (src >= 0) {
		bool same;

		pthread_mutex_lock(&i->layout_lock);
		same = i->layout_gen == i->committed_gen && atomic_load(&md->layout_ready);
		pthread_mutex_unlock(&i->layout_lock);
		if (rc < 0 || i->w || !same || i->committed_seq != src_seq || !a.ino ||
		    a.size != src_size) {
			close(src);
			src = -1;
		}
	}
	bool empty = created || (fi->flags & O_TRUNC) || (!i->w && a.ino && a.size == 0);
	/* A writer of a file with content may copy it into staging: its size,
	 * or UINT64_MAX where that cannot be. */
	uint64_t copy = empty ? 0 : !i->w && a.ino && S_ISREG(a.mode) ? a.size : UINT64_MAX;
	/* This open may get passthrough, a new staging file or the one another
	 * writer (or a close not yet handed over) keeps: its writes bypass the
	 * daemon, so set-id bits go now, as a write by this caller would
	 * (HANDLE_KILLPRIV_V2). */
	bool may_passthrough = (i->w && i->w->passthrough) ||
			       (!i->w && i->ncached == 0 && md->pt_mode != PT_OFF &&
				(empty || copy <= md->pt_copy_max));
	if (rc == 0 && writer && may_passthrough && !created && !(fi->flags & O_TRUNC) &&
	    caller != 0) {
		struct meta_attr in = { 0 };
		unsigned kill = trunc_kill_suid(md, ino, caller, &in);
		if (kill) {
			rc = meta_setattr(md->meta, ino, kill, &in, NULL);
			inval_attr(md, ino); /* the set-id bits the kernel holds */
		}
	}
	if (rc == 0)
		rc = open_mode_locked(md, i, of, writer && empty, copy, src, created, fi);
	if (rc == 0 && writer)
		i->nwriters++;
	/* Its writes may reach the staging file durably without this daemon
	 * hearing of them: the upload must not be dropped (inode_unref). */
	if (rc == 0 && writer && (fi->flags & O_DSYNC))
		inode_keep_upload(md, i);
	/* A copy this open took over and no open shares: the retry list hands
	 * it off (or drops it, unchanged) once no mapping holds it. */
	if (rc < 0 && took_copy && i->w && i->w->npt == 0 && i->nwriters == 0 && !i->pending)
		write_back_probe_later(md, i);
	pthread_mutex_unlock(&i->lock);
	if (src >= 0)
		close(src);
	if (rc < 0) {
		handle_remove(md->handles, of->fh, HANDLE_FILE);
		goto fail;
	}
	fi->fh = of->fh;
	if (of->passthrough) {
		/* Open in passthrough mode drops the kernel's old page cache. */
		fi->keep_cache = 0;
	} else if (md->writeback && writer && staging_room_low(md)) {
		/* With the writeback cache a full staging file system would
		 * fail only the write-back, reported at close(): near full, a
		 * writer bypasses the cache so write() itself says ENOSPC. */
		fi->direct_io = 1;
		fi->keep_cache = 1;
		atomic_fetch_add(&md->stats.writeback_bypassed, 1);
	} else {
		/* Every change to the data passes through this daemon and the
		 * kernel's page cache, so what it cached stays valid across opens;
		 * a follower's changes come from another node: each open reads
		 * afresh (and FUSE_AUTO_INVAL_DATA drops the pages of an open file
		 * once its attributes show a change). */
		fi->keep_cache = !md->follower;
	}
	/* A reader has nothing to flush and ferry takes no POSIX locks itself;
	 * a passthrough writer's data is already where the reconciler takes
	 * it from (the staging file), so close() needs no upcall either. */
	fi->noflush = !writer || (of->passthrough && rclient_up(md));
	return 0;
fail:
	inode_unref(md, i, 0, 1);
	free(of);
	return rc;
}

static void op_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct mountd *md = MD(req);
	int rc;

	count(req, OP_OPEN);
	/* Another mount took the volume over: nothing more is written here
	 * (the engine refuses every change; a new writer would only stage
	 * data that can never commit). */
	if (!special_ino(ino) && (fi->flags & O_ACCMODE) != O_RDONLY &&
	    atomic_load(&md->lease_fenced)) {
		fuse_reply_err(req, EROFS);
		return;
	}
	if (special_ino(ino))
		rc = special_open(md, ino, fi);
	else
		rc = open_file(md, ino, fuse_req_ctx(req)->uid, NULL, fi);
	if (rc < 0) {
		fuse_reply_err(req, -rc);
		return;
	}
	if (fuse_reply_open(req, fi) != 0) {
		/* The open was interrupted away: the kernel will not release it. */
		if (special_ino(ino)) {
			special_release(md, fi->fh);
		} else {
			struct open_file *of = handle_remove(md->handles, fi->fh, HANDLE_FILE);
			if (of)
				file_release(md, of, 0);
		}
	}
}

static void op_create(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode,
		      struct fuse_file_info *fi)
{
	struct mountd *md = MD(req);
	const struct fuse_ctx *ctx = fuse_req_ctx(req);
	struct fuse_entry_param e;
	struct meta_attr a;
	int rc;

	count(req, OP_CREATE);
	if ((rc = new_name_check(req, parent, name)) != 0) {
		fuse_reply_err(req, rc);
		return;
	}
	rc = meta_create(md->meta, parent, name, S_IFREG | (mode & 07777), ctx->uid, ctx->gid, 0,
			 NULL, &a);
	if (rc < 0) {
		fuse_reply_err(req, -rc);
		return;
	}
	fi->flags &= ~O_TRUNC; /* it is new: nothing to truncate */
	rc = open_file(md, a.ino, ctx->uid, &a, fi);
	if (rc < 0) {
		/* The file exists now; report the open failure honestly. */
		fuse_reply_err(req, -rc);
		return;
	}
	fill_entry(md, &a, &e);
	inode_ref(md, a.ino, 1, 0);
	made_inode_note(md, a.ino, &a);
	if (fuse_reply_create(req, &e, fi) != 0) {
		struct open_file *of = handle_remove(md->handles, fi->fh, HANDLE_FILE);
		if (of)
			file_release(md, of, 1);
	}
}

static void op_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		    struct fuse_file_info *fi)
{
	struct mountd *md = MD(req);
	struct open_file *of;
	struct meta_attr a;
	char *buf = NULL;
	ssize_t n;
	int sfd;
	int rc;

	count(req, OP_READ);
	if (special_ino(ino)) {
		special_read(req, md, size, off, fi);
		return;
	}
	of = handle_get(md->handles, fi->fh, HANDLE_FILE);
	if (!of || of->ino->ino != ino) {
		fuse_reply_err(req, EBADF);
		return;
	}
	if (off < 0) {
		fuse_reply_err(req, EINVAL);
		return;
	}
	/* While writes are staged, the inode lock keeps a commit from moving
	 * bytes between the staging file and the store under this read. With
	 * nothing staged the read needs no lock. */
	pthread_mutex_lock(&of->ino->lock);
	if (!of->ino->w && (sfd = inflight_file(md, of->ino)) >= 0) {
		/* Another's close is being uploaded: what it left is here. */
		buf = malloc(size ? size : 1);
		n = !buf ? -ENOMEM : inflight_read(sfd, of->ino->inflight_size, buf, size, off);
		pthread_mutex_unlock(&of->ino->lock);
	} else if (!of->ino->w) {
		/* A handle open across another's close reads what that close
		 * committed. */
		rc = inflight_wait(md, of->ino, "read");
		pthread_mutex_unlock(&of->ino->lock);
		/* The size and layout usually come from layout_cache.c,
		 * without a database round trip. */
		struct inode *i = of->ino;
		uint64_t fsize = 0;
		if (rc == 0)
			rc = layout_size(md, i, &fsize);
		/* Cached objects go to the kernel without passing through
		 * this daemon's memory; the others are fetched (and cached)
		 * by file_read(). */
		/* The objects ahead are asked for first: once this READ is
		 * answered, a RELEASE may free of (and i) on another thread. */
		if (rc == 0) {
			read_whole_note(of, fsize, (uint64_t)off, size);
			file_readahead(md, &of->ra, i, fsize, (uint64_t)off, size);
		}
		n = rc < 0 ? rc : file_read_reply(md, req, i, fsize, size, off);
		if (n >= 0)
			return; /* replied */
		if (n == -EAGAIN) {
			buf = malloc(size ? size : 1);
			n = !buf ? -ENOMEM : file_read(md, req, i, fsize, buf, size, off);
		}
	} else {
		buf = malloc(size ? size : 1);
		if (!buf) {
			pthread_mutex_unlock(&of->ino->lock);
			fuse_reply_err(req, ENOMEM);
			return;
		}
		struct wstate *w = of->ino->w;
		uint64_t fsize;
		struct timespec mt;
		size_t len = 0;

		rc = wstate_stat(w, &fsize, &mt);
		if (rc == 0)
			len = (uint64_t)off >= fsize ? 0 :
			      (size < fsize - (uint64_t)off ? size : (size_t)(fsize - (uint64_t)off));
		if (rc == 0 && !w->passthrough)
			rc = meta_getattr(md->meta, ino, &a);
		/* Bytes past the committed size and not dirty read as zeros; a
		 * passthrough staging file holds every byte itself. */
		memset(buf, 0, len);
		if (rc < 0)
			n = rc;
		else if (w->passthrough)
			n = 0;
		else
			n = file_read(md, req, of->ino, a.size < fsize ? a.size : fsize, buf, len,
				      off);
		if (n >= 0) {
			rc = wstate_overlay(of->ino->w, buf, len, off);
			n = rc < 0 ? rc : (ssize_t)len;
		}
		pthread_mutex_unlock(&of->ino->lock);
	}
	if (n < 0) {
		if (n == -EINTR)
			count(req, OP_INTERRUPT_EINTR);
		fuse_reply_err(req, (int)-n);
	} else {
		fuse_reply_buf(req, buf, (size_t)n);
	}
	free(buf);
}

static void op_write(fuse_req_t req, fuse_ino_t ino, const char *buf, size_t size, off_t off,
		     struct fuse_file_info *fi)
{
	struct mountd *md = MD(req);
	struct open_file *of;
	ssize_t n;
	int rc;

	count(req, OP_WRITE);
	if (special_ino(ino)) {
		special_write(req, md, buf, size, fi);
		return;
	}
	if (atomic_load(&md->lease_fenced)) {
		fuse_reply_err(req, EROFS); /* see op_open */
		return;
	}
	of = handle_get(md->handles, fi->fh, HANDLE_FILE);
	if (!of || of->ino->ino != ino || !of->writer) {
		fuse_reply_err(req, EBADF);
		return;
	}
	if (off < 0 || (uint64_t)off + size < (uint64_t)off) {
		fuse_reply_err(req, EINVAL);
		return;
	}
	/* HANDLE_KILLPRIV_V2: a write by a caller without CAP_FSETID (here:
	 * not root) clears set-id bits; checked once per handle. */
	if (!of->setid_clear && !fi->writepage && fuse_req_ctx(req)->uid != 0) {
		struct meta_attr in = { 0 };
		unsigned kill = trunc_kill_suid(md, ino, fuse_req_ctx(req)->uid, &in);
		if (kill && (rc = meta_setattr(md->meta, ino, kill, &in, NULL)) < 0) {
			fuse_reply_err(req, -rc);
			return;
		}
		if (kill)
			inval_attr(md, ino); /* the set-id bits the kernel holds */
		of->setid_clear = true;
	}
	pthread_mutex_lock(&of->ino->lock);
	rc = fi->writepage ? of->ino->wb_error_unstaged : 0;
	if (rc == 0)
		rc = wstate_ensure(md, of->ino, of->fh);
	if (rc < 0)
		n = rc;
	else if (fi->writepage && wstate_writeback_refused(of->ino->w, (uint64_t)off, size))
		n = of->ino->w->wb_error;
	else
		n = wstate_write(md, of->ino, buf, size, off);
	/* A short write-back is a failed one: the kernel would take it as
	 * done and drop the rest of its pages (past the largest file, say).
	 * What did land stays: the failure is where it stopped. */
	uint64_t failed_at = (uint64_t)off;
	if (n >= 0 && (size_t)n < size && fi->writepage) {
		failed_at += (uint64_t)n;
		n = (uint64_t)off + size > md->max_file_size ? -EFBIG : -ENOSPC;
	}
	if (n < 0 && fi->writepage && of->ino->w)
		wstate_writeback_failed(of->ino->w, failed_at, (int)n);
	else if (n < 0 && fi->writepage)
		of->ino->wb_error_unstaged = (int)n; /* no staging file to cut: see mountd.h */
	pthread_mutex_unlock(&of->ino->lock);
	if (n < 0)
		fuse_reply_err(req, (int)-n);
	else
		fuse_reply_write(req, (size_t)n);
}

static void op_flush(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct mountd *md = MD(req);
	struct open_file *of;
	int rc;

	count(req, OP_FLUSH);
	if (special_ino(ino)) {
		fuse_reply_err(req, 0);
		return;
	}
	of = handle_get(md->handles, fi->fh, HANDLE_FILE);
	if (!of) {
		fuse_reply_err(req, EBADF);
		return;
	}
	pthread_mutex_lock(&of->ino->lock);
	if (rclient_up(md)) {
		/* The upload happens after the last close; what close() promises
		 * is that the writes survive a killed daemon: journal them. A
		 * file changed in more places than a record holds, or whose
		 * record finds the staging file system full or read-only (its
		 * disk failed under us), is committed here instead, which
		 * promises more. */
		rc = rclient_journal(md, of->ino, 0);
		if (rc == -E2BIG || rc == -ENOSPC || rc == -EDQUOT || rc == -EROFS)
			rc = commit_locked(md, of->ino);
	} else {
		/* Without a reconciler, close() reports whether the data reached
		 * the object store. */
		rc = commit_locked(md, of->ino);
	}
	/* A write-back of this inode that failed is this close()'s error too:
	 * the kernel does not always report it (seen with a staging disk
	 * turning read-only under writers), and close() must not return 0
	 * for writes that were lost. Writers only: a reader has lost nothing. */
	if (rc == 0 && of->writer)
		rc = of->ino->wb_error_unstaged ? of->ino->wb_error_unstaged :
		     of->ino->w ? of->ino->w->wb_error : 0;
	pthread_mutex_unlock(&of->ino->lock);
	fuse_reply_err(req, -rc);
}

/* The staging file's bytes, its name and (daemon path) its journal record
 * on stable storage. Caller holds i->lock. */
static int fsync_local(struct mountd *md, struct inode *i, int datasync)
{
	struct wstate *w = i->w;
	int rc = 0;

	if ((datasync ? fdatasync(w->fd) : fsync(w->fd)) < 0) {
		/* A copy it could not flush stays unflushed (wstate_copy_flush()). */
		if (w->copy_unsynced)
			w->copy_torn = true;
		return -errno;
	}
	/* A copy is whole from now on, across a power loss too: its name
	 * must say so (a mount whose fsync mode changed since the copy, or
	 * one adopted). */
	if ((rc = wstate_copy_flush(md, w)) < 0)
		return rc;
	if (!w->passthrough) {
		rc = rclient_journal(md, i, RECONCILE_JOB_SYNC);
		if (rc == -E2BIG) /* too fragmented for a record: to the store */
			return commit_locked(md, i);
	}
	/* A new staging file's directory entry (and the record's rename). */
	if (rc == 0 && (!w->dir_synced || !w->passthrough)) {
		if (fsync(md->staging_dirfd) < 0)
			return -errno;
		w->dir_synced = true;
	}
	return rc;
}

static void op_fsync(fuse_req_t req, fuse_ino_t ino, int datasync, struct fuse_file_info *fi)
{
	struct mountd *md = MD(req);
	struct open_file *of;
	int rc;

	count(req, OP_FSYNC);
	of = handle_get(md->handles, fi->fh, HANDLE_FILE);
	if (!of) {
		fuse_reply_err(req, special_ino(ino) ? 0 : EBADF);
		return;
	}
	pthread_mutex_lock(&of->ino->lock);
	if (md->fsync_local && rclient_up(md)) {
		/* fsync=local: durable on this node; the reconciler uploads
		 * later, after a crash too (staging_recover()). The file's
		 * metadata (its creation) must be durable for that. */
		rc = of->ino->w ? fsync_local(md, of->ino, datasync) : 0;
		if (rc == 0)
			rc = meta_sync(md->meta);
	} else {
		/* Objects are durable once put; the commit runs with
		 * synchronous=FULL. A close's upload still in flight is part
		 * of the file too (a reader's open does not wait for it). */
		rc = of->ino->w ? commit_locked(md, of->ino) : inflight_wait(md, of->ino, "fsync");
	}
	pthread_mutex_unlock(&of->ino->lock);
	fuse_reply_err(req, -rc);
}

static void op_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct mountd *md = MD(req);
	struct open_file *of;

	count(req, OP_RELEASE);
	if (special_ino(ino)) {
		special_release(md, fi->fh);
		fuse_reply_err(req, 0);
		return;
	}
	/* Counted in .stats open_handles until the release is done (its
	 * handoff made), so "no handle open" means every close was handled. */
	atomic_fetch_add(&md->stats.releasing, 1);
	of = handle_remove(md->handles, fi->fh, HANDLE_FILE);
	if (of)
		file_release(md, of, 0);
	atomic_fetch_sub(&md->stats.releasing, 1);
	fuse_reply_err(req, of ? 0 : EBADF);
}

static void op_fallocate(fuse_req_t req, fuse_ino_t ino, int mode, off_t off, off_t len,
			 struct fuse_file_info *fi)
{
	struct mountd *md = MD(req);
	struct open_file *of;
	struct meta_attr a;
	struct inode *i;
	int rc = 0;

	count(req, OP_FALLOCATE);
	of = handle_get(md->handles, fi->fh, HANDLE_FILE);
	if (!of || !of->writer) {
		fuse_reply_err(req, EBADF);
		return;
	}
	if (off < 0 || len <= 0 || (uint64_t)off + (uint64_t)len < (uint64_t)off) {
		fuse_reply_err(req, EINVAL);
		return;
	}
	i = of->ino;
	pthread_mutex_lock(&i->lock);
	if ((rc = inflight_wait(md, i, "fallocate")) < 0) {
		pthread_mutex_unlock(&i->lock);
		fuse_reply_err(req, -rc);
		return;
	}
	if (i->w && i->w->passthrough) {
		/* The staging file holds the data: it takes the request itself. */
		if (mode != 0 && mode != FALLOC_FL_KEEP_SIZE &&
		    mode != (FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE))
			rc = -EOPNOTSUPP;
		else if (fallocate(i->w->fd, mode, off, len) < 0)
			rc = -errno;
		else
			i->w->size_changed = true;
		if (rc < 0)
			told_forget(i); /* a failed one may have grown it */
		pthread_mutex_unlock(&i->lock);
		fuse_reply_err(req, -rc);
		return;
	}
	rc = commit_locked(md, i);
	if (rc == 0)
		rc = meta_getattr(md->meta, ino, &a);
	if (rc == 0) {
		if (mode == 0 || mode == FALLOC_FL_KEEP_SIZE) {
			/* Space is not reserved in an object store; only the size
			 * changes (reads of the new range give zeros). */
			uint64_t end = (uint64_t)off + (uint64_t)len;
			if (mode == 0 && end > a.size) {
				struct meta_attr in = { .size = end };
				rc = meta_setattr(md->meta, ino, META_SET_SIZE, &in, &a);
				if (rc == 0 && i->w)
					i->w->size = end;
			}
		} else if (mode == (FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE)) {
			if ((uint64_t)off < a.size) {
				uint64_t l = (uint64_t)len;
				if ((uint64_t)off + l > a.size)
					l = a.size - (uint64_t)off;
				rc = meta_punch_hole(md->meta, ino, (uint64_t)off, l, &a);
			}
		} else {
			rc = -EOPNOTSUPP;
		}
	}
	if (rc < 0)
		told_forget(i);
	layout_forget(md, i);
	pthread_mutex_unlock(&i->lock);
	fuse_reply_err(req, -rc);
}

static void op_lseek(fuse_req_t req, fuse_ino_t ino, off_t off, int whence,
		     struct fuse_file_info *fi)
{
	struct mountd *md = MD(req);
	struct open_file *of;
	struct meta_attr a;
	off_t res;
	int rc;

	count(req, OP_LSEEK);
	of = handle_get(md->handles, fi->fh, HANDLE_FILE);
	if (!of) {
		fuse_reply_err(req, EBADF);
		return;
	}
	if (whence != SEEK_DATA && whence != SEEK_HOLE) {
		fuse_reply_err(req, EINVAL);
		return;
	}
	if (md->writeback) {
		/* The kernel's page cache holds writes (and sizes) this daemon
		 * has not seen yet. ENOSYS makes the kernel answer every later
		 * SEEK_DATA/SEEK_HOLE itself from its own size, with the whole
		 * file as data: never a hole over data. */
		fuse_reply_err(req, ENOSYS);
		return;
	}
	pthread_mutex_lock(&of->ino->lock);
	if ((rc = inflight_wait(md, of->ino, "lseek")) < 0) {
		res = rc;
		pthread_mutex_unlock(&of->ino->lock);
		goto reply;
	}
	if (of->ino->w && of->ino->w->passthrough) {
		res = lseek(of->ino->w->fd, off, whence);
		if (res < 0)
			res = -errno;
		pthread_mutex_unlock(&of->ino->lock);
		goto reply;
	}
	rc = commit_locked(md, of->ino);
	if (rc == 0)
		rc = meta_getattr(md->meta, ino, &a);
	if (rc < 0) {
		res = rc;
	} else if (of->ino->nwriters > 0) {
		/* A writer in the kernel's cached mode may have stores through
		 * a shared mapping in its page cache that this daemon has not
		 * seen: the whole file counts as data (which SEEK_DATA allows),
		 * so a sparse-aware copy skips none of them. */
		if ((uint64_t)off >= a.size)
			res = -ENXIO;
		else
			res = whence == SEEK_DATA ? off : (off_t)a.size;
	} else {
		res = file_seek_data(md, of->ino, a.size, off, whence);
	}
	pthread_mutex_unlock(&of->ino->lock);
reply:
	if (res < 0)
		fuse_reply_err(req, (int)-res);
	else
		fuse_reply_lseek(req, res);
}

/* ---- directories ---- */

struct dir_handle {
	uint64_t ino;
};

static void op_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct mountd *md = MD(req);
	struct dir_handle *d;
	struct meta_attr a;
	uint64_t fh;
	int rc;

	count(req, OP_OPENDIR);
	rc = meta_getattr(md->meta, ino, &a);
	if (rc == 0 && !S_ISDIR(a.mode))
		rc = -ENOTDIR;
	if (rc < 0) {
		fuse_reply_err(req, -rc);
		return;
	}
	d = calloc(1, sizeof(*d));
	if (!d) {
		fuse_reply_err(req, ENOMEM);
		return;
	}
	d->ino = ino;
	rc = handle_add(md->handles, HANDLE_DIR, d, &fh);
	if (rc < 0) {
		free(d);
		fuse_reply_err(req, -rc);
		return;
	}
	fi->fh = fh;
	/* The kernel keeps a listing in the directory's page cache and
	 * answers the next ones from it, across opens: this daemon is the
	 * volume's only writer, every change comes through the kernel, and
	 * the kernel drops the listing on each (the directory's i_version).
	 * A follower lists again: its directories change on another node
	 * (the kernel would see that only by the mtime, once the attributes
	 * expire). */
	fi->cache_readdir = !md->follower;
	fi->keep_cache = !md->follower;
	if (fuse_reply_open(req, fi) != 0)
		free(handle_remove(md->handles, fh, HANDLE_DIR));
}

struct dir_fill {
	fuse_req_t req;
	struct mountd *md;
	char *buf;
	size_t size, used;
	bool plus;
	bool full;
};

/* Readdir offsets: 1 after ".", 2 after "..", cookie+2 after an entry. */
static int dir_fill_one(void *arg, const char *name, const struct meta_attr *a, uint64_t cookie)
{
	struct dir_fill *f = arg;
	size_t n;

	if (f->plus) {
		struct fuse_entry_param e;
		struct meta_attr aa = *a;
		overlay_wstate(f->md, &aa);
		fill_entry(f->md, &aa, &e);
		n = fuse_add_direntry_plus(f->req, f->buf + f->used, f->size - f->used, name, &e,
					   (off_t)(cookie + 2));
		if (n > f->size - f->used) {
			/* overlay_wstate() recorded what the kernel never got */
			if (S_ISREG(aa.mode))
				told_forget_ino(f->md, a->ino);
			f->full = true;
			return 1;
		}
		/* The kernel now holds a lookup on this entry. */
		inode_ref(f->md, a->ino, 1, 0);
	} else {
		struct stat st = { .st_ino = a->ino, .st_mode = a->mode };
		n = fuse_add_direntry(f->req, f->buf + f->used, f->size - f->used, name, &st,
				      (off_t)(cookie + 2));
		if (n > f->size - f->used) {
			f->full = true;
			return 1;
		}
	}
	f->used += n;
	return 0;
}

static void do_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		       struct fuse_file_info *fi, bool plus)
{
	struct mountd *md = MD(req);
	struct dir_fill f = { .req = req, .md = md, .size = size, .plus = plus };
	struct dir_handle *d;
	int rc = 0;

	d = handle_get(md->handles, fi->fh, HANDLE_DIR);
	if (!d || d->ino != ino) {
		fuse_reply_err(req, EBADF);
		return;
	}
	f.buf = malloc(size ? size : 1);
	if (!f.buf) {
		fuse_reply_err(req, ENOMEM);
		return;
	}
	for (int k = (int)off; k < 2 && !f.full; k++) {
		const char *dot = k == 0 ? "." : "..";
		size_t n;
		if (plus) {
			/* ino 0: the kernel makes no dentry and takes no lookup. */
			struct fuse_entry_param e = { .ino = 0 };
			e.attr.st_ino = ino;
			e.attr.st_mode = S_IFDIR;
			n = fuse_add_direntry_plus(req, f.buf + f.used, size - f.used, dot, &e, k + 1);
		} else {
			struct stat st = { .st_ino = ino, .st_mode = S_IFDIR };
			n = fuse_add_direntry(req, f.buf + f.used, size - f.used, dot, &st, k + 1);
		}
		if (n > size - f.used)
			f.full = true;
		else
			f.used += n;
	}
	if (!f.full)
		rc = meta_readdir(md->meta, ino, off > 2 ? (uint64_t)off - 2 : 0, plus, dir_fill_one, &f);
	if (rc < 0 && f.used == 0)
		fuse_reply_err(req, -rc);
	else
		fuse_reply_buf(req, f.buf, f.used);
	free(f.buf);
}

static void op_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		       struct fuse_file_info *fi)
{
	count(req, OP_READDIR);
	do_readdir(req, ino, size, off, fi, false);
}

static void op_readdirplus(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
			   struct fuse_file_info *fi)
{
	count(req, OP_READDIRPLUS);
	do_readdir(req, ino, size, off, fi, true);
}

static void op_releasedir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	count(req, OP_RELEASEDIR);
	free(handle_remove(MD(req)->handles, fi->fh, HANDLE_DIR));
	fuse_reply_err(req, 0);
}

static void op_fsyncdir(fuse_req_t req, fuse_ino_t ino, int datasync, struct fuse_file_info *fi)
{
	count(req, OP_FSYNCDIR);
	if (!handle_get(MD(req)->handles, fi->fh, HANDLE_DIR)) {
		fuse_reply_err(req, EBADF);
		return;
	}
	/* Namespace changes are committed at once and synced in batches:
	 * this is where they all reach stable storage. */
	fuse_reply_err(req, -meta_sync(MD(req)->meta));
}

static void op_statfs(fuse_req_t req, fuse_ino_t ino)
{
	struct mountd *md = MD(req);
	uint64_t used = 0, inodes = 0;
	struct statvfs sv = { 0 };
	const uint64_t total_blocks = 1ull << 40; /* 4 PiB of 4 KiB: an object store is unbounded */
	const uint64_t total_files = 1ull << 40;
	int rc;

	count(req, OP_STATFS);
	rc = meta_statfs(md->meta, &used, &inodes);
	if (rc < 0) {
		fuse_reply_err(req, -rc);
		return;
	}
	sv.f_bsize = 4096;
	sv.f_frsize = 4096;
	sv.f_blocks = total_blocks;
	sv.f_bfree = sv.f_bavail = total_blocks - (used + 4095) / 4096;
	sv.f_files = total_files;
	sv.f_ffree = sv.f_favail = total_files - inodes;
	sv.f_namemax = META_NAME_MAX;
	fuse_reply_statfs(req, &sv);
}

/* ---- xattrs ---- */

/* POSIX ACLs are not enforced here (the kernel enforces them only with
 * FUSE_POSIX_ACL, which this daemon does not ask for): storing one would
 * show `+` in ls and grant or deny nothing. They are refused as on a file
 * system mounted noacl, which also tells ls and cp (they remember it per
 * device) to stop asking for every file. */
static bool posix_acl_name(const char *name)
{
	return strcmp(name, "system.posix_acl_access") == 0 ||
	       strcmp(name, "system.posix_acl_default") == 0;
}

/* Drops the POSIX ACL names (stored before they were refused) from a
 * listxattr list in place; returns the new length. */
static size_t list_without_acls(char *list, size_t len)
{
	size_t in = 0, out = 0;

	while (in < len) {
		size_t n = strnlen(list + in, len - in) + 1;

		if (!posix_acl_name(list + in)) {
			memmove(list + out, list + in, n);
			out += n;
		}
		in += n;
	}
	return out;
}

static void op_setxattr(fuse_req_t req, fuse_ino_t ino, const char *name, const char *value,
			size_t size, int flags)
{
	struct inode *i;

	count(req, OP_SETXATTR);
	if (special_ino(ino)) {
		fuse_reply_err(req, EPERM);
		return;
	}
	if (posix_acl_name(name)) {
		fuse_reply_err(req, EOPNOTSUPP);
		return;
	}
	/* Before the change: a concurrent getxattr asks the database. */
	if ((i = inode_ref_existing(MD(req), ino)) != NULL) {
		atomic_store(&i->xattr_none, false);
		inode_unref(MD(req), i, 0, 1);
	}
	if (flags & ~(XATTR_CREATE | XATTR_REPLACE)) {
		fuse_reply_err(req, EINVAL);
		return;
	}
	fuse_reply_err(req, -meta_setxattr(MD(req)->meta, ino, name, value, size, flags));
}

static void op_getxattr(fuse_req_t req, fuse_ino_t ino, const char *name, size_t size)
{
	void *value = NULL;
	size_t len = 0;
	int rc;

	count(req, OP_GETXATTR);
	if (posix_acl_name(name)) {
		fuse_reply_err(req, EOPNOTSUPP);
		return;
	}
	if (special_ino(ino)) {
		fuse_reply_err(req, ENODATA);
		return;
	}
	rc = xattr_none(MD(req), ino) ? -ENODATA :
					 meta_getxattr(MD(req)->meta, ino, name, &value, &len);
	if (rc < 0)
		fuse_reply_err(req, -rc);
	else if (size == 0)
		fuse_reply_xattr(req, len);
	else if (size < len)
		fuse_reply_err(req, ERANGE);
	else
		fuse_reply_buf(req, value, len);
	free(value);
}

static void op_listxattr(fuse_req_t req, fuse_ino_t ino, size_t size)
{
	char *list = NULL;
	size_t len = 0;
	int rc;

	count(req, OP_LISTXATTR);
	rc = special_ino(ino) || xattr_none(MD(req), ino) ?
		     0 :
		     meta_listxattr(MD(req)->meta, ino, &list, &len);
	if (rc == 0 && list)
		len = list_without_acls(list, len);
	if (rc < 0)
		fuse_reply_err(req, -rc);
	else if (size == 0)
		fuse_reply_xattr(req, len);
	else if (size < len)
		fuse_reply_err(req, ERANGE);
	else
		fuse_reply_buf(req, list, len);
	free(list);
}

static void op_removexattr(fuse_req_t req, fuse_ino_t ino, const char *name)
{
	count(req, OP_REMOVEXATTR);
	if (special_ino(ino)) {
		fuse_reply_err(req, EPERM);
		return;
	}
	if (posix_acl_name(name)) {
		fuse_reply_err(req, EOPNOTSUPP);
		return;
	}
	fuse_reply_err(req, -meta_removexattr(MD(req)->meta, ino, name));
}

static void op_access(fuse_req_t req, fuse_ino_t ino, int mask)
{
	struct mountd *md = MD(req);
	const struct fuse_ctx *ctx = fuse_req_ctx(req);
	struct meta_attr a;
	unsigned bits;
	int rc;

	count(req, OP_ACCESS);
	if (special_ino(ino)) {
		struct stat st;
		special_stat(md, ino, &st);
		bits = ctx->uid == 0 ? 06 : ctx->uid == st.st_uid ? (st.st_mode >> 6) & 7 :
								  st.st_mode & 7;
		fuse_reply_err(req, (unsigned)(mask & (R_OK | W_OK | X_OK)) & ~bits ? EACCES : 0);
		return;
	}
	rc = meta_getattr(md->meta, ino, &a);
	if (rc < 0) {
		fuse_reply_err(req, -rc);
		return;
	}
	if (mask == F_OK) {
		fuse_reply_err(req, 0);
		return;
	}
	if (ctx->uid == 0) {
		/* root may do anything but execute a file nobody may execute */
		bool x_denied = (mask & X_OK) && !S_ISDIR(a.mode) && !(a.mode & 0111);
		fuse_reply_err(req, x_denied ? EACCES : 0);
		return;
	}
	if (ctx->uid == a.uid)
		bits = (a.mode >> 6) & 7;
	else if (ctx->gid == a.gid)
		bits = (a.mode >> 3) & 7;
	else
		bits = a.mode & 7;
	fuse_reply_err(req, ((unsigned)mask & ~bits) ? EACCES : 0);
}

/* ---- session ---- */

/* -o io_uring was given to libfuse: does the kernel offer the ring? libfuse
 * starts it after this INIT only if so. false: the start failed (io_uring=on),
 * and the session is ending. */
static bool uring_offered(struct mountd *md, struct fuse_conn_info *conn)
{
#ifdef FUSE_CAP_OVER_IO_URING
	if (conn->capable_ext & FUSE_CAP_OVER_IO_URING) {
		atomic_store(&md->uring_offered, true);
		/* libfuse delivers no FUSE_INTERRUPT for a request that came over
		 * the ring; ENOSYS to the first stops the kernel sending them
		 * (waits that would stop for one watch their caller instead). */
		conn->no_interrupt = 1;
		log_info("io_uring: offered by the kernel (one ring thread per CPU serves requests "
			 "once libfuse has started them)");
		return true;
	}
#else
	(void)conn;
#endif
	pthread_mutex_lock(&md->pt_reason_lock);
	snprintf(md->ur_reason, sizeof(md->ur_reason), "kernel_lacks_io_uring");
	pthread_mutex_unlock(&md->pt_reason_lock);
	if (md->ur_mode == UR_ON) {
		mountd_ready(md, "io_uring=on, but the kernel does not offer FUSE-over-io_uring "
			     "(Linux >= 6.14, with the fuse module's enable_uring parameter set: "
			     "/sys/module/fuse/parameters/enable_uring)");
		fuse_session_exit(md->se);
		return false;
	}
	log_info("io_uring: the kernel does not offer it (the fuse module's enable_uring "
		 "parameter); serving through /dev/fuse");
	return true;
}

static void op_init(void *userdata, struct fuse_conn_info *conn)
{
	struct mountd *md = userdata;

	/* Requests of up to 1 MiB: 64 MiB in 1 MiB writes is 64 WRITE
	 * upcalls. One page less, because libfuse sizes READs (max_pages)
	 * from max_write, and a spliced READ reply (header included) must fit
	 * a pipe an unprivileged process may have (pipe-max-size, 1 MiB by
	 * default): past it libfuse copies the reply through a buffer, and
	 * 1 MiB READs (a larger read_ahead_kb, O_DIRECT) ran 4x slower. */
	conn->max_write = (1u << 20) - 4096;
	conn->max_readahead = 1u << 20;
	fuse_set_feature_flag(conn, FUSE_CAP_AUTO_INVAL_DATA);
	fuse_set_feature_flag(conn, FUSE_CAP_ATOMIC_O_TRUNC);
	fuse_set_feature_flag(conn, FUSE_CAP_READDIRPLUS);
	/* The kernel's own guess (READDIRPLUS_AUTO) lists with attributes
	 * only from offset 0, or once a lookup has followed a listing. rm -rf,
	 * cp -r and du read a whole directory before they touch an entry, so
	 * the guess came too late and each entry cost a LOOKUP after it
	 * (100,000 files: rm -rf 8.2 s with it, 6.0 s without). */
	if (md->readdirplus_auto)
		fuse_set_feature_flag(conn, FUSE_CAP_READDIRPLUS_AUTO);
	else
		fuse_unset_feature_flag(conn, FUSE_CAP_READDIRPLUS_AUTO);
	/* READ replies from read-cache files splice (file_read_reply); a
	 * move lets the kernel take a page instead of copying it where it
	 * can. */
	fuse_set_feature_flag(conn, FUSE_CAP_SPLICE_WRITE);
	fuse_set_feature_flag(conn, FUSE_CAP_SPLICE_MOVE);
	/* POSIX locks stay local to the kernel (one node per volume). */
	fuse_unset_feature_flag(conn, FUSE_CAP_POSIX_LOCKS);
	fuse_unset_feature_flag(conn, FUSE_CAP_FLOCK_LOCKS);
	/* Clearing set-id bits is ours: the kernel then marks the mount
	 * SB_NOSEC and stops asking GETXATTR(security.capability) before
	 * every write. */
	fuse_set_feature_flag(conn, FUSE_CAP_HANDLE_KILLPRIV_V2);
	if (md->uring_asked && !uring_offered(md, conn))
		return;
	if (md->wb_mode == WB_ON && md->pt_mode == PT_ON) {
		mountd_ready(md, "writeback=on and passthrough=on exclude each other");
		fuse_session_exit(md->se);
		return;
	}
	if (md->pt_mode == PT_OFF) {
		passthrough_set_reason(md, "mount_option_off", "off by mount option passthrough=off");
	} else if (md->wb_mode == WB_ON) {
		passthrough_set_reason(md, "writeback_on", "off for writeback=on");
	} else if (!fuse_set_feature_flag(conn, FUSE_CAP_PASSTHROUGH)) {
		passthrough_set_reason(md, "kernel_lacks_passthrough",
				       "the kernel does not offer FUSE passthrough (Linux >= 6.9)");
		if (md->pt_mode == PT_ON) {
			mountd_ready(md, "passthrough=on, but the kernel does not offer FUSE "
				     "passthrough (Linux >= 6.9)");
			fuse_session_exit(md->se);
			return;
		}
	} else {
		/* Staging files sit on a plain local filesystem (checked at start):
		 * one backing layer below this one. */
		conn->max_backing_stack_depth = 1;
		atomic_store(&md->pt_off, false);
	}
	/* Without passthrough for the whole mount, every write is an upcall
	 * unless the kernel's page cache takes it: writes then return at
	 * memory speed and reach the daemon in large batches (written back,
	 * and at the latest at close() and fsync()). With passthrough they
	 * are not mixed: a writeback-cached inode could not get a passthrough
	 * writer. */
	md->writeback = false;
	if (md->wb_mode != WB_OFF && atomic_load(&md->pt_off)) {
		md->writeback = fuse_set_feature_flag(conn, FUSE_CAP_WRITEBACK_CACHE);
		if (!md->writeback && md->wb_mode == WB_ON) {
			mountd_ready(md, "writeback=on, but the kernel does not offer the FUSE "
				     "writeback cache");
			fuse_session_exit(md->se);
			return;
		}
	} else {
		fuse_unset_feature_flag(conn, FUSE_CAP_WRITEBACK_CACHE);
	}
	if (md->writeback)
		log_info("writeback cache: on (writes on the daemon path are cached by the kernel)");
	mountd_ready(md, "ok");
}

static void op_destroy(void *userdata)
{
	struct mountd *md = userdata;
	size_t left = write_back_flush_all(md);

	if (left)
		log_warnx("%zu files had writes that could not be committed; see the lines above", left);
	/* Every job handed over is committed before the daemon exits (so
	 * `ferry umount` returns with nothing left on local disk only). */
	rclient_stop(md);
}

static void drop_handle(enum handle_type type, void *obj, void *arg)
{
	if (type == HANDLE_SPECIAL) {
		special_handle_free(obj);
		return;
	}
	/* An open_file's inode reference goes with the inode table. */
	free(obj);
}

void mountd_handles_drop(struct mountd *md)
{
	handle_table_drain(md->handles, drop_handle, NULL);
}

/*
 * The namespace fence (md->ns_fence, held by a checkpoint for a moment:
 * drain.c): what changes names, attributes or what a close hands over
 * waits while it is held; reads, writes into open files, fsync and the
 * special files do not. The handlers reply before they return, so the
 * fence is left once the change is made.
 */
static void fence_enter(struct mountd *md)
{
	pthread_rwlock_rdlock(&md->ns_fence);
}

static void fence_leave(struct mountd *md)
{
	pthread_rwlock_unlock(&md->ns_fence);
}

static void fenced_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *attr, int to_set,
			   struct fuse_file_info *fi)
{
	struct mountd *md = MD(req); /* req is gone once answered */

	fence_enter(md);
	op_setattr(req, ino, attr, to_set, fi);
	fence_leave(md);
}

static void fenced_mknod(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode,
			 dev_t rdev)
{
	struct mountd *md = MD(req); /* req is gone once answered */

	fence_enter(md);
	op_mknod(req, parent, name, mode, rdev);
	fence_leave(md);
}

static void fenced_mkdir(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode)
{
	struct mountd *md = MD(req); /* req is gone once answered */

	fence_enter(md);
	op_mkdir(req, parent, name, mode);
	fence_leave(md);
}

static void fenced_symlink(fuse_req_t req, const char *link, fuse_ino_t parent, const char *name)
{
	struct mountd *md = MD(req); /* req is gone once answered */

	fence_enter(md);
	op_symlink(req, link, parent, name);
	fence_leave(md);
}

static void fenced_unlink(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	struct mountd *md = MD(req); /* req is gone once answered */

	fence_enter(md);
	op_unlink(req, parent, name);
	fence_leave(md);
}

static void fenced_rmdir(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	struct mountd *md = MD(req); /* req is gone once answered */

	fence_enter(md);
	op_rmdir(req, parent, name);
	fence_leave(md);
}

static void fenced_rename(fuse_req_t req, fuse_ino_t parent, const char *name,
			  fuse_ino_t newparent, const char *newname, unsigned int flags)
{
	struct mountd *md = MD(req); /* req is gone once answered */

	fence_enter(md);
	op_rename(req, parent, name, newparent, newname, flags);
	fence_leave(md);
}

static void fenced_link(fuse_req_t req, fuse_ino_t ino, fuse_ino_t newparent, const char *newname)
{
	struct mountd *md = MD(req); /* req is gone once answered */

	fence_enter(md);
	op_link(req, ino, newparent, newname);
	fence_leave(md);
}

static void fenced_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct mountd *md = MD(req); /* req is gone once answered */
	bool fence = (fi->flags & O_TRUNC) && !special_ino(ino);

	if (fence)
		fence_enter(md);
	op_open(req, ino, fi);
	if (fence)
		fence_leave(md);
}

static void fenced_create(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode,
			  struct fuse_file_info *fi)
{
	struct mountd *md = MD(req); /* req is gone once answered */

	fence_enter(md);
	op_create(req, parent, name, mode, fi);
	fence_leave(md);
}

static void fenced_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct mountd *md = MD(req); /* req is gone once answered */
	bool fence = (fi->flags & O_ACCMODE) != O_RDONLY && !special_ino(ino);

	if (fence)
		fence_enter(md);
	op_release(req, ino, fi);
	if (fence)
		fence_leave(md);
}

static void fenced_fallocate(fuse_req_t req, fuse_ino_t ino, int mode, off_t off, off_t len,
			     struct fuse_file_info *fi)
{
	struct mountd *md = MD(req); /* req is gone once answered */

	fence_enter(md);
	op_fallocate(req, ino, mode, off, len, fi);
	fence_leave(md);
}

static void fenced_setxattr(fuse_req_t req, fuse_ino_t ino, const char *name, const char *value,
			    size_t size, int flags)
{
	struct mountd *md = MD(req); /* req is gone once answered */

	fence_enter(md);
	op_setxattr(req, ino, name, value, size, flags);
	fence_leave(md);
}

static void fenced_removexattr(fuse_req_t req, fuse_ino_t ino, const char *name)
{
	struct mountd *md = MD(req); /* req is gone once answered */

	fence_enter(md);
	op_removexattr(req, ino, name);
	fence_leave(md);
}

const struct fuse_lowlevel_ops mountd_ops = {
	.init = op_init,
	.destroy = op_destroy,
	.lookup = op_lookup,
	.forget = op_forget,
	.forget_multi = op_forget_multi,
	.getattr = op_getattr,
	.setattr = fenced_setattr,
	.readlink = op_readlink,
	.mknod = fenced_mknod,
	.mkdir = fenced_mkdir,
	.symlink = fenced_symlink,
	.unlink = fenced_unlink,
	.rmdir = fenced_rmdir,
	.rename = fenced_rename,
	.link = fenced_link,
	.open = fenced_open,
	.create = fenced_create,
	.read = op_read,
	.write = op_write,
	.flush = op_flush,
	.release = fenced_release,
	.fsync = op_fsync,
	.fallocate = fenced_fallocate,
	.lseek = op_lseek,
	.opendir = op_opendir,
	.readdir = op_readdir,
	.readdirplus = op_readdirplus,
	.releasedir = op_releasedir,
	.fsyncdir = op_fsyncdir,
	.statfs = op_statfs,
	.setxattr = fenced_setxattr,
	.getxattr = op_getxattr,
	.listxattr = op_listxattr,
	.removexattr = fenced_removexattr,
	.access = op_access,
};

/* ---- handover.c's view of the handles ---- */

void mountd_handle_free(struct mountd *md, enum handle_type type, void *obj)
{
	if (type == HANDLE_FILE)
		file_release(md, obj, 0);
	else if (type == HANDLE_SPECIAL)
		special_handle_free(obj);
	else
		free(obj);
}

void handle_describe(enum handle_type type, void *obj, uint64_t *ino, bool *writer,
		     bool *passthrough, bool *setid_clear)
{
	*writer = *passthrough = *setid_clear = false;
	if (type == HANDLE_FILE) {
		const struct open_file *of = obj;
		*ino = of->ino->ino;
		*writer = of->writer;
		*passthrough = of->passthrough;
		*setid_clear = of->setid_clear;
	} else if (type == HANDLE_DIR) {
		*ino = ((const struct dir_handle *)obj)->ino;
	} else {
		*ino = special_handle_ino(obj);
	}
}

void *handle_rebuild(struct mountd *md, enum handle_type type, uint64_t fh, uint64_t ino,
		     bool writer, bool passthrough, bool setid_clear)
{
	if (type == HANDLE_DIR) {
		struct dir_handle *d = calloc(1, sizeof(*d));
		if (d)
			d->ino = ino;
		return d;
	}
	if (type == HANDLE_SPECIAL)
		return special_handle_rebuild(md, ino);
	struct open_file *of = calloc(1, sizeof(*of));
	struct inode *i;
	if (!of || !(i = inode_ref(md, ino, 0, 1))) {
		free(of);
		return NULL;
	}
	of->ino = i;
	of->fh = fh;
	of->writer = writer;
	of->setid_clear = setid_clear;
	pthread_mutex_lock(&i->lock);
	/* A passthrough handle shares the inode's staging file, which
	 * handover_restore() made its write state first; without one (it
	 * could not be taken up) the handle is a cached one: its kernel file
	 * still goes to the backing file, and its close commits nothing. */
	of->passthrough = passthrough && i->w && i->w->passthrough;
	if (of->passthrough)
		i->w->npt++;
	else
		i->ncached++;
	if (writer)
		i->nwriters++; /* under i->lock, as open_file() counts it */
	pthread_mutex_unlock(&i->lock);
	return of;
}
