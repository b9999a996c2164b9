/*
 * The reconciler client: ferry-mountd's side of proto/reconcile.proto.
 *
 * When the last user of a staging file goes, ferry-mountd journals the job
 * (<name>.job beside the staging file), hands the file's fd to
 * ferry-reconciler and forgets the staging file; the inode stays reserved
 * (inflight_seq) until the reconciler says the job is committed, and an open
 * of it waits for that. One reader thread takes every reply: it ends the
 * reservations, invalidates the kernel's cache of the inode, and passes
 * stats and drain answers to whoever asked.
 *
 * Seqs are epoch << 32 | n, the epoch taken from the volume at start, so
 * they keep increasing across restarts (the reconciler commits a job only if
 * its seq is above the inode's last).
 *
 * By default ferry-mountd starts ferry-reconciler itself (a child on a socket
 * in the staging directory) and stops it at unmount, after draining; with
 * --reconciler SOCKET it uses one started on its own.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "fd_limit.h"
#include "log.h"
#include "inval.h"
#include "mountd.h"
#include "url.h"
#include "reconcile_job.h"
#include "slice.h"

/* How long a close waits for the reconciler to read hand-offs again before
 * it commits its file itself; once one has given up, the next ones do not
 * wait until the reconciler reads again. */
#define HANDOFF_ROOM_WAIT_MS 10000
/* A close waiting for room looks again at least this often, and at how
 * many fds are left (fds_scarce). */
#define HANDOFF_ROOM_SLICE_MS 10
/* Fewer free fds than this (or half of RLIMIT_NOFILE) is scarce. */
#define FD_RESERVE_MIN 64
#define FD_CHECK_MS 5

/* Caller holds md->rc_lock. */
static void inflight_unlink(struct inode *i)
{
	if (i->iprevp) {
		*i->iprevp = i->inext;
		if (i->inext)
			i->inext->iprevp = i->iprevp;
		i->inext = NULL;
		i->iprevp = NULL;
	}
}

/* The job of i in flight has ended. */
static void inflight_remove(struct mountd *md, struct inode *i)
{
	pthread_mutex_lock(&md->rc_lock);
	inflight_unlink(i);
	free(i->inflight_name);
	i->inflight_name = NULL;
	pthread_mutex_unlock(&md->rc_lock);
}

static bool timespec_eq(const struct timespec *a, const struct timespec *b)
{
	return a->tv_sec == b->tv_sec && a->tv_nsec == b->tv_nsec;
}

/*
 * Whether the connection can take a frame now, waiting up to timeout_ms
 * without rc_lock. The reconciler stops reading while it holds its most
 * jobs (or when it is stopped or stuck); a send that blocked under rc_lock
 * would then stall every other user of the connection (.stats, drains, the
 * reader thread's commits). POLLOUT on a Unix stream socket means at least
 * three quarters of the send buffer are free: a frame fits. An error says
 * yes: the send finds out what it is.
 */
static bool rclient_room_fd(int sock, int timeout_ms)
{
	struct pollfd p = { .fd = sock, .events = POLLOUT };
	int rc;

	if (sock < 0)
		return true;
	do
		rc = poll(&p, 1, timeout_ms);
	while (rc < 0 && errno == EINTR);
	return rc != 0;
}

/*
 * Whether ferry-mountd is short of fds. A close that waits for room keeps
 * its staging file open, and while the reconciler takes nothing each new
 * file holds one more: creates would fail with EMFILE although the writer
 * holds no file open. Looked up at most every FD_CHECK_MS (a listing of
 * /proc/self/fd), by closes that wait only.
 */
static bool fds_scarce(struct mountd *md)
{
	int64_t now = mono_now_ns();
	long room, reserve, limit;

	if (now - atomic_load(&md->fd_checked_ns) < (int64_t)FD_CHECK_MS * 1000000)
		return atomic_load(&md->fd_scarce);
	atomic_store(&md->fd_checked_ns, now);
	room = fd_limit_headroom();
	limit = fd_limit_soft();
	reserve = limit / 2 > FD_RESERVE_MIN ? limit / 2 : FD_RESERVE_MIN;
	atomic_store(&md->fd_scarce, room >= 0 && room < reserve);
	return room >= 0 && room < reserve;
}

/*
 * Takes rc_lock once the connection has room for a frame, waiting up to
 * timeout_ms without the lock. Room is checked again under the lock, which
 * every sender holds for a whole frame: other closes that saw room at the
 * same moment, or a reconciler restart that changed the socket, cannot
 * make the send block. 0 with the lock held; -EAGAIN if there was no room
 * in time; -EMFILE, at once, if there is none and fds are scarce.
 */
static int rclient_lock_with_room(struct mountd *md, int timeout_ms)
{
	struct timespec until;
	int64_t left_ns;
	int sock;

	mono_deadline_ms(&until, timeout_ms);
	for (;;) {
		pthread_mutex_lock(&md->rc_lock);
		if (rclient_room_fd(md->rc_sock, 0)) {
			atomic_store(&md->rc_stalled, false);
			return 0;
		}
		sock = md->rc_sock;
		pthread_mutex_unlock(&md->rc_lock);
		if (fds_scarce(md)) {
			if (atomic_fetch_add(&md->stats.handoff_fd_scarce, 1) == 0)
				log_warnx("ferry-reconciler takes no hand-off and this daemon is short "
					  "of fds: closes leave their files for the retry list, fd "
					  "closed, instead of waiting (.stats handoff_fd_scarce)");
			return -EMFILE;
		}
		left_ns = ((int64_t)until.tv_sec * 1000000000 + until.tv_nsec) - mono_now_ns();
		if (left_ns <= 0)
			break;
		if (left_ns > (int64_t)HANDOFF_ROOM_SLICE_MS * 1000000)
			left_ns = (int64_t)HANDOFF_ROOM_SLICE_MS * 1000000;
		(void)rclient_room_fd(sock, (int)((left_ns + 999999) / 1000000));
	}
	if (!atomic_exchange(&md->rc_stalled, true))
		log_warnx("ferry-reconciler has taken no hand-off for %d s (stopped, stuck, or "
			  "holding its most jobs); closes commit their files here until it does",
			  HANDOFF_ROOM_WAIT_MS / 1000);
	atomic_fetch_add(&md->stats.handoff_stalls, 1);
	return -EAGAIN;
}

/* The objects of a committed job the reconciler also wrote into the read
 * cache directory (see reconcile_job.h): into the cache before the
 * commit is known here, so that a reader of the committed file finds
 * them there instead of fetching them back. */
static void seeds_take(struct mountd *md, const struct reconcile_reply *r)
{
	char key[SLICE_KEY_MAX], tmp[RECONCILE_SEED_NAME_MAX];
	uint32_t bs = md->vol.block_size;

	for (uint32_t k = 0; k < r->nseeds; k++) {
		const struct reconcile_seed *s = &r->seeds[k];

		if (!reconcile_seed_names(s, bs, key, sizeof(key), tmp, sizeof(tmp))) {
			log_warnx("inode %llu: the reconciler names a cache seed of no object "
				  "(slice %llu of %u bytes, object %u); ignored",
				  (unsigned long long)r->ino, (unsigned long long)s->slice_id,
				  s->slice_size, s->index);
			continue;
		}
		if (read_cache_adopt(md->cache, key, tmp, slice_object_size(s->index, s->slice_size, bs)))
			atomic_fetch_add(&md->stats.cache_seeded, 1);
	}
}

/* seen: the reconciler said so; else a restart found the job's files gone
 * and takes it as finished, maybe without its commit. */
static void job_committed(struct mountd *md, const struct reconcile_reply *r, bool seen)
{
	struct inode *i = inode_ref_existing(md, r->ino);
	bool ours = false, keep = false;

	/* Dropped at our asking (rclient_drop): the file was deleted. */
	bool dropped = r->error == -ECANCELED;

	seeds_take(md, r);
	if (r->error && !dropped)
		log_warnx("inode %llu: the reconciler could not commit job %llu (%s): %s; its "
			  "staging file is kept as .orphan",
			  (unsigned long long)r->ino, (unsigned long long)r->seq, strerror(-r->error),
			  r->message);
	if (r->error && !dropped) {
		pthread_mutex_lock(&md->rc_lock);
		struct rc_failure *f = &md->rc_failures[md->rc_nfailures++ % RC_FAILURES_KEPT];
		f->seq = r->seq;
		f->ino = r->ino;
		f->error = r->error;
		snprintf(f->message, sizeof(f->message), "%.159s", r->message);
		pthread_mutex_unlock(&md->rc_lock);
	}
	if (!i)
		return;
	pthread_mutex_lock(&i->lock);
	/* Whoever's job it was, the file's committed data may have changed
	 * (the commit is in the database before the reply is sent). */
	layout_forget(md, i);
	if (i->inflight_seq == r->seq) {
		struct meta_attr after;

		/* The kernel's cache goes unless what it holds is the
		 * committed file or it will ask anyway: a commit changes only
		 * the size, times and blocks. Either the last attributes it was
		 * given are what the commit made (git status after a
		 * checkout), or the size differs from them: no reply said so,
		 * so a write, a truncating open, fallocate or copy_file_range
		 * made it, and each has the kernel drop its size, times and
		 * blocks (fuse_write_update_attr()), which the next stat asks
		 * for; its mode, owner and links, which a permission check
		 * needs, stay good (the open after a checkout; set-id bits a
		 * write clears are dropped at once, inval_attr()). A write
		 * through a shared mapping changes no size and the kernel
		 * drops nothing for it, so equal sizes want equal times. Not
		 * when the last reply may have reached the kernel after a
		 * write (told_record()), nor for a job that was lost rather
		 * than committed (!seen: the metadata kept the old size). The
		 * bytes it cached came through this daemon or the staging
		 * file; a passthrough open dropped the rest. A failed job
		 * changed nothing. */
		keep = !r->error && i->told_valid && !i->w &&
		       meta_getattr(md->meta, r->ino, &after) == 0 &&
		       ((after.size != i->told_size && seen && !i->told_racy) ||
			(timespec_eq(&after.mtime, &i->told_mtime) &&
			 timespec_eq(&after.ctime, &i->told_ctime)));
		i->inflight_seq = 0;
		if (!r->error && seen) {
			i->committed_seq = r->seq;
			pthread_mutex_lock(&i->layout_lock);
			i->committed_gen = i->layout_gen; /* layout_forget()'s, above */
			pthread_mutex_unlock(&i->layout_lock);
		}
		if (i->inflight_fd >= 0) {
			close(i->inflight_fd); /* readers read the committed file now */
			i->inflight_fd = -1;
		}
		ours = true;
		inflight_remove(md, i);
		if (r->error && !dropped)
			i->inflight_error = r->error;
		pthread_cond_broadcast(&i->committed);
	}
	pthread_mutex_unlock(&i->lock);
	if (ours && !r->error)
		atomic_store(&md->rc_committed, true);
	atomic_fetch_sub(&md->rc_inflight, ours ? 1 : 0);
	if (ours) {
		if (keep) {
			atomic_fetch_add(&md->stats.commit_invalidations_skipped, 1);
		} else {
			atomic_fetch_add(&md->stats.commit_invalidations, 1);
			inval_inode(md, r->ino); /* not once the loop is over (inval.c) */
		}
		inode_unref(md, i, 0, 1); /* the reservation's reference */
	}
	inode_unref(md, i, 0, 1);
	pthread_mutex_lock(&md->rc_lock);
	pthread_cond_broadcast(&md->rc_cond);
	pthread_mutex_unlock(&md->rc_lock);
}

/* An attempt at a job failed; the reconciler tries again. Waiters on it
 * hear of a full disk (rclient_wait). */
static void job_retrying(struct mountd *md, const struct reconcile_reply *r)
{
	struct inode *i = inode_ref_existing(md, r->ino);

	if (!i)
		return;
	pthread_mutex_lock(&i->lock);
	if (i->inflight_seq == r->seq) {
		i->inflight_retry_error = r->error;
		i->inflight_retry_gen++;
		pthread_cond_broadcast(&i->committed);
	}
	pthread_mutex_unlock(&i->lock);
	inode_unref(md, i, 0, 1);
}

static int reconciler_launch(struct mountd *md);
static int reconciler_connect(struct mountd *md, int *sock);

/*
 * The reconciler we started is gone: start another and hand it again every
 * job still in flight (their records and staging files are where they
 * were; a job the new one already finished from its journal has neither,
 * and counts as committed). Runs on the reader thread. Returns 0 when the
 * new reconciler serves.
 */
#define RESTART_PAUSE_FIRST_MS 100
#define RESTART_PAUSE_MAX_MS 30000

static int reconciler_restart(struct mountd *md)
{
	struct reconcile_reply *done = NULL; /* jobs found finished; owned */
	size_t ndone = 0, cap = 0;
	int sock = -1, rc, st;

	atomic_store(&md->rc_restarting, true);
	atomic_store(&md->rc_up, false);
	if (md->rc_child > 0) {
		kill(md->rc_child, SIGKILL); /* if it only closed the connection */
		waitpid(md->rc_child, &st, 0);
		md->rc_child = 0;
	}
	/* One that died before committing anything (a disk that fails every
	 * flush of the object store, where each reconciler gives up at its
	 * first commit) is followed by the next after a pause growing to
	 * RESTART_PAUSE_MAX_MS, so such a disk costs a restart every 30 s, not
	 * a busy loop. Its jobs stay journaled meanwhile. */
	if (atomic_exchange(&md->rc_committed, false))
		md->rc_restart_pause_ms = 0;
	else
		md->rc_restart_pause_ms = md->rc_restart_pause_ms ?
			(md->rc_restart_pause_ms * 2 > RESTART_PAUSE_MAX_MS ?
				 RESTART_PAUSE_MAX_MS : md->rc_restart_pause_ms * 2) :
			RESTART_PAUSE_FIRST_MS;
	for (unsigned waited = 0; waited < md->rc_restart_pause_ms &&
				  !atomic_load(&md->rc_stopping); waited += 50)
		usleep(50 * 1000);
	atomic_fetch_add(&md->stats.reconciler_restarts, 1);
	rc = reconciler_launch(md);
	if (rc == 0)
		rc = reconciler_connect(md, &sock);
	if (rc < 0)
		goto out;
	pthread_mutex_lock(&md->rc_lock);
	if (atomic_load(&md->rc_stopping)) {
		/* rclient_stop() shut the old socket down under this lock and
		 * waits for this thread: the new one must not outlive that. */
		pthread_mutex_unlock(&md->rc_lock);
		close(sock);
		rc = -ESHUTDOWN;
		goto out;
	}
	close(md->rc_sock);
	md->rc_sock = sock;
	md->rc_conn_gen++;
	for (struct inode *i = md->inflight; i && rc == 0; i = i->inext) {
		struct reconcile_job j;
		char err[128];
		bool in_xattr;
		int fd;

		fd = openat(md->staging_dirfd, i->inflight_name, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
		if (fd < 0 || reconcile_job_load(md->staging_dirfd, fd, i->inflight_name, &j,
						 &in_xattr, err, sizeof(err)) < 0) {
			if (fd >= 0)
				close(fd);
			if (ndone == cap) {
				size_t nc = cap ? 2 * cap : 64;
				struct reconcile_reply *n = realloc(done, nc * sizeof(*n));

				if (!n) {
					/* Its waiters time out (EIO); the next
					 * mount finds it finished. */
					log_warnx("inode %llu: no memory to end its finished job",
						  (unsigned long long)i->ino);
					continue;
				}
				done = n;
				cap = nc;
			}
			done[ndone++] = (struct reconcile_reply){
				.type = RECONCILE_REPLY_COMMITTED, .seq = i->inflight_seq,
				.ino = i->ino };
			continue;
		}
		rc = reconcile_handoff(md->rc_sock, &j, fd);
		close(fd);
		reconcile_job_clear(&j);
	}
	/* A drain waiting on the old connection asks the new one. */
	pthread_cond_broadcast(&md->rc_cond);
	pthread_mutex_unlock(&md->rc_lock);
out:
	/* Jobs the new reconciler finished before we could hand them over
	 * (its start-up scan took them up) end before it counts as up: a
	 * reader of .stats who sees it up with nothing staged must also see
	 * those jobs committed. */
	for (size_t k = 0; k < ndone; k++)
		job_committed(md, &done[k], false);
	free(done);
	if (rc == 0) {
		atomic_store(&md->rc_up, true);
		log_info("started a new ferry-reconciler and handed it the jobs in flight again");
	} else {
		log_errno(rc, "cannot start a new ferry-reconciler; jobs in flight stay journaled "
			  "for the next mount; new ones are committed by ferry-mountd");
	}
	atomic_store(&md->rc_restarting, false);
	return rc;
}

static void *reader_main(void *arg)
{
	struct mountd *md = arg;

	for (;;) {
		struct reconcile_reply r;
		int rc = reconcile_recv_reply(md->rc_sock, &r);

		if (rc < 0) {
			if (atomic_load(&md->rc_stopping))
				break;
			log_errno(rc, "lost the connection to ferry-reconciler");
			if (!md->cfg.reconciler && reconciler_restart(md) == 0)
				continue;
			break;
		}
		switch (r.type) {
		case RECONCILE_REPLY_COMMITTED:
			job_committed(md, &r, true);
			break;
		case RECONCILE_REPLY_RETRYING:
			job_retrying(md, &r);
			break;
		case RECONCILE_REPLY_STATS:
		case RECONCILE_REPLY_DRAINED:
			pthread_mutex_lock(&md->rc_lock);
			if (r.type == RECONCILE_REPLY_STATS) {
				md->rc_stats = r.stats;
				md->rc_stats_gen++;
			} else if (r.upto_seq > md->rc_drained) {
				md->rc_drained = r.upto_seq;
			}
			/* What an earlier run left is committed: layouts read
			 * from now on stay right until this daemon hears of a
			 * change (layout_cache.c). */
			if (md->rc_drained >= md->layout_upto)
				atomic_store(&md->layout_ready, true);
			pthread_cond_broadcast(&md->rc_cond);
			pthread_mutex_unlock(&md->rc_lock);
			break;
		case RECONCILE_REPLY_ERROR:
			log_warnx("ferry-reconciler refused a request: %s", r.message);
			break;
		}
	}
	atomic_store(&md->rc_up, false);
	pthread_mutex_lock(&md->rc_lock);
	pthread_cond_broadcast(&md->rc_cond);
	pthread_mutex_unlock(&md->rc_lock);
	return NULL;
}

static bool ends_with(const char *s, const char *suffix)
{
	size_t n = strlen(s), m = strlen(suffix);
	return n >= m && strcmp(s + n - m, suffix) == 0;
}

uint64_t rclient_seq_next(struct mountd *md)
{
	/* Atomic, without rc_lock: an open must not wait behind a hand-off
	 * that holds it while the reconciler is slow to read. */
	return atomic_fetch_add(&md->rc_next_seq, 1) + 1;
}

void staging_superseded(struct mountd *md, uint64_t ino)
{
	/* Every record this file has (a close() record, or the name seq
	 * staging_recover() would replay it with) is numbered below a seq
	 * taken now; later jobs of the inode are numbered above it. */
	int rc = meta_seq_floor(md->meta, ino, rclient_seq_next(md));

	if (rc < 0)
		log_errno(rc, "inode %llu: cannot record that its leftover staging file is spent; "
			  "the next start may commit it again", (unsigned long long)ino);
}

/*
 * Staging files an earlier run left behind. One with a journal record is
 * the reconciler's to finish. A passthrough one (".p") without a record
 * holds a whole file whose last close() may have returned (the record is
 * written at RELEASE, after close): it gets a record now and is committed.
 * Any other is a daemon-path file whose close() never returned: kept as
 * .orphan, never deleted. with_jobs 0: every leftover is kept as .orphan.
 */
/* Whether another open of staging file n exists (the lease probe of
 * wstate_mapped()). */
static bool staging_in_use(struct mountd *md, const char *n)
{
	int fd = openat(md->staging_dirfd, n, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
	bool busy = false;

	if (fd < 0)
		return false;
	if (fcntl(fd, F_SETLEASE, F_WRLCK) == 0)
		(void)fcntl(fd, F_SETLEASE, F_UNLCK);
	else
		busy = errno == EAGAIN || errno == EBUSY;
	close(fd);
	return busy;
}

/* 1 if staging file n carries its job record (an xattr). */
static bool staging_attached(struct mountd *md, const char *n)
{
	int fd = openat(md->staging_dirfd, n, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
	bool yes = fd >= 0 && reconcile_job_attached(fd) == 1;

	if (fd >= 0)
		close(fd);
	return yes;
}

/* Whether the staging directory holds copies (orphans included) that run
 * made. */
static bool run_has_copies(struct mountd *md, const char *run)
{
	DIR *d = fdopendir(dup(md->staging_dirfd));
	struct dirent *de;
	bool found = false;

	if (!d)
		return true; /* cannot tell: keep what protects them */
	rewinddir(d);
	while (!found && (de = readdir(d))) {
		char r[BOOT_RUN_LEN + 1];

		found = staging_copy_run(de->d_name, r) && strcmp(r, run) == 0;
	}
	closedir(d);
	return found;
}

size_t staging_recover(struct mountd *md, bool with_jobs)
{
	DIR *d = fdopendir(dup(md->staging_dirfd));
	size_t kept = 0, recovered = 0, handed = 0, torn = 0, unknown = 0;
	struct dirent *de;

	if (!d) {
		log_warn("cannot list the staging directory %s", md->cfg.staging_dir);
		return SIZE_MAX;
	}
	int lrc = boot_set_load(md->staging_dirfd, &md->flushed_boots);
	if (lrc < 0) {
		/* It may list this run (a pid used again): this run's copies
		 * must not look flushed, and the file must not be overwritten
		 * with less than it holds. */
		log_errno(lrc, "cannot read %s/%s: copies of another boot are left alone, and "
			  "this run's copies are flushed before their opens return",
			  md->cfg.staging_dir, BOOT_FLUSHED_NAME);
		md->flushed_unreadable = true;
		md->copies_flushed = true;
	}
	rewinddir(d); /* the dup shares staging_dirfd's offset */
	while ((de = readdir(d))) {
		const char *n = de->d_name;
		char job[NAME_MAX + 8], to[NAME_MAX + 1];
		struct stat st;

		if (n[0] == '.' || ends_with(n, RECONCILE_JOB_SUFFIX) ||
		    ends_with(n, STAGING_FLUSH_SUFFIX) || ends_with(n, ".sock") ||
		    strstr(n, RECONCILE_ORPHAN_SUFFIX) || ends_with(n, ".tmp") ||
		    fstatat(md->staging_dirfd, n, &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISREG(st.st_mode))
			continue;
		if (handover_names(md, n))
			continue; /* the daemon before handed it over with its opens */
		uint64_t name_seq;
		enum staging_kind kind = staging_kind(md, n, &name_seq);
		if (kind == STAGING_COPY_UNKNOWN) {
			/* Which boot made it cannot be told now: left as it is,
			 * for a start that can. */
			unknown++;
			continue;
		}
		if (kind == STAGING_COPY_TORN) {
			/* A copy made under another boot and never flushed: any
			 * page of it may be lost (zeros) since, and a commit of
			 * it would put them over the file's committed content.
			 * The file keeps that content; this one is kept aside,
			 * record and all, never committed. */
			if (reconcile_job_drop(md->staging_dirfd, n) < 0)
				log_warn("staging file %s: cannot remove its journal records", n);
			torn++;
			goto keep;
		}
		/* Still open through a FUSE connection this daemon takes over
		 * (its dead predecessor's passthrough opens): the opens write on
		 * into it, so it stays the file's, adopted once serving. */
		if (kind == STAGING_WHOLE && staging_in_use(md, n)) {
			char **na = realloc(md->adopt, (md->nadopt + 1) * sizeof(*na));
			if (na) {
				md->adopt = na;
				if ((na[md->nadopt] = strdup(n)))
					md->nadopt++;
				continue;
			}
		}
		snprintf(job, sizeof(job), "%s%s", n, RECONCILE_JOB_SUFFIX);
		if (with_jobs && (faccessat(md->staging_dirfd, job, F_OK, AT_SYMLINK_NOFOLLOW) == 0 ||
				  staging_attached(md, n))) {
			handed++;
			continue; /* handed off: the reconciler takes it up */
		}
		/* A record made at close() (daemon path): it becomes the job. */
		char fj[NAME_MAX + 8];
		snprintf(fj, sizeof(fj), "%s%s", n, STAGING_FLUSH_SUFFIX);
		if (with_jobs && renameat(md->staging_dirfd, fj, md->staging_dirfd, job) == 0) {
			recovered++;
			continue;
		}
		if (with_jobs && kind == STAGING_WHOLE && reconcile_name_check(n) == 0) {
			struct reconcile_job j = { .length = (uint64_t)st.st_size, .mtime = st.st_mtim };
			char *end;
			j.ino = strtoull(n, &end, 10);
			snprintf(j.name, sizeof(j.name), "%.*s", RECONCILE_NAME_MAX, n);
			/* The seq the file was made with, not a new one: a file whose
			 * bytes were committed but which could not be removed has
			 * its inode's seq raised past it (staging_superseded()),
			 * and must not overwrite what changed since. One that was
			 * never committed is above every seq its inode has. */
			j.seq = name_seq;
			if (!j.seq)
				j.seq = ++md->rc_next_seq;
			if (*end == '-' && j.ino && reconcile_job_write(md->staging_dirfd, &j, 0) == 0) {
				recovered++;
				continue;
			}
		}
		/* Named by the time, but never over an older one: after the
		 * clock stepped back, that name may be taken. */
keep:
		for (int k = 0; k < 1000; k++) {
			if (k == 0)
				snprintf(to, sizeof(to), "%.200s.%lld%s", n, (long long)time(NULL),
					 RECONCILE_ORPHAN_SUFFIX);
			else
				snprintf(to, sizeof(to), "%.200s.%lld-%d%s", n, (long long)time(NULL),
					 k, RECONCILE_ORPHAN_SUFFIX);
			if (renameat2(md->staging_dirfd, n, md->staging_dirfd, to,
				      RENAME_NOREPLACE) == 0) {
				kept++;
				break;
			}
			if (errno != EEXIST)
				break;
		}
	}
	closedir(d);
	if (recovered)
		log_info("recovered %zu staging files of an earlier run for commit",
			 recovered);
	/* Copies this run makes are unflushed until its orderly stop: this
	 * run (a pid an earlier run of this boot may have had) is not a
	 * flushed one from here, before any copy is made. */
	char run[BOOT_RUN_LEN + 1];
	boot_run(run, md->boot_tag, (long)getpid());
	if (md->boot_tag[0] && boot_set_has(&md->flushed_boots, run) && run_has_copies(md, run)) {
		/* An earlier run had this pid (a container's pid 1) and left
		 * flushed copies: its entry stays, and this run makes none that
		 * are not flushed. */
		md->copies_flushed = true;
	} else if (md->boot_tag[0] && boot_set_has(&md->flushed_boots, run)) {
		struct boot_set now = md->flushed_boots;

		boot_set_remove(&now, run);
		lrc = boot_set_store(md->staging_dirfd, &now);
		if (lrc < 0) {
			log_errno(lrc, "cannot update %s/%s: copies into staging files are "
				  "flushed before their opens return", md->cfg.staging_dir,
				  BOOT_FLUSHED_NAME);
			md->copies_flushed = true;
		} else {
			md->flushed_boots = now;
		}
	}
	if (unknown)
		log_warnx("%zu staging files hold copies of files' committed content that cannot "
			  "be judged now (no boot id, or no readable %s): left in %s, neither "
			  "committed nor removed", unknown, BOOT_FLUSHED_NAME, md->cfg.staging_dir);
	if (torn) {
		atomic_fetch_add(&md->stats.staging_copies_set_aside, torn);
		log_warnx("the machine restarted since %zu staging files were filled with copies of "
			  "files' committed content, and they were never flushed: those files keep "
			  "their committed content, and writes to them since their last fsync() before "
			  "the restart are not committed (kept in %s/*%s)",
			  torn, md->cfg.staging_dir, RECONCILE_ORPHAN_SUFFIX);
	}
	if (kept > torn)
		log_warnx("kept %zu staging files of an earlier run as %s/*%s (writes whose close() "
			  "never returned)", kept - torn, md->cfg.staging_dir, RECONCILE_ORPHAN_SUFFIX);
	return recovered + handed;
}

void staging_flushed_mark(struct mountd *md)
{
	struct boot_set keep = { .n = 0 };
	struct dirent *de;
	DIR *d;
	int rc;

	if (!md->boot_tag[0] || md->staging_dirfd < 0 || md->flushed_unreadable)
		return;
	if (syncfs(md->staging_dirfd) < 0) {
		log_warn("cannot flush the staging directory %s: its copies stay unflushed",
			 md->cfg.staging_dir);
		return;
	}
	/* Every copy of this boot here is flushed now, whichever run made it
	 * (a hand-over's predecessor, a crashed run's adopted or journaled
	 * ones); those of other runs stay as they were recorded. */
	d = fdopendir(dup(md->staging_dirfd));
	if (!d) {
		log_warn("cannot list the staging directory %s", md->cfg.staging_dir);
		return;
	}
	rewinddir(d);
	while ((de = readdir(d))) {
		char run[BOOT_RUN_LEN + 1];
		const char *tag = staging_copy_run(de->d_name, run);

		if (tag && (strncmp(tag, md->boot_tag, BOOT_TAG_LEN) == 0 ||
			    boot_set_has(&md->flushed_boots, run)))
			boot_set_add(&keep, run);
	}
	closedir(d);
	rc = boot_set_store(md->staging_dirfd, &keep);
	if (rc < 0)
		log_errno(rc, "cannot record in %s/%s that this boot's copies are flushed",
			  md->cfg.staging_dir, BOOT_FLUSHED_NAME);
}

const struct rc_opt_def rc_opt_defs[RC_NOPTS] = {
	[RC_OPT_COMMIT_WINDOW] = { "commit_window_ms", "--commit-window-ms", 3600000 },
	[RC_OPT_UPLOAD_QUIET] = { "upload_quiet_ms", "--upload-quiet-ms", 600000 },
	[RC_OPT_UPLOAD_DELAY_MAX] = { "upload_delay_max_ms", "--upload-delay-max-ms", 3600000 },
};

static int spawn_reconciler(struct mountd *md)
{
	char exe[PATH_MAX], *slash;
	ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 16);
	pid_t pid;

	if (n <= 0)
		return -errno;
	exe[n] = '\0';
	slash = strrchr(exe, '/');
	strcpy(slash + 1, "ferry-reconciler");
	pid = fork();
	if (pid < 0)
		return -errno;
	if (pid == 0) {
		/* If ferry-mountd dies, the reconciler stops too (finishing what
		 * it has, the rest stays journaled), so a restarted mount can
		 * start its own. */
		/* SIGHUP, not SIGTERM: the kernel sends it once per thread of
		 * ours that dies while the reconciler is reparented among them,
		 * and a second SIGTERM means "stop now". */
		prctl(PR_SET_PDEATHSIG, SIGHUP);
		if (getppid() != md->pid)
			_exit(1);
		/* stderr is the mount's log; the reconciler logs there too. Its
		 * stdin and stdout are not the caller's: a `$(ferry mount ...)`
		 * would otherwise wait for as long as the mount lives. */
		int null = open("/dev/null", O_RDWR | O_CLOEXEC);
		if (null >= 0) {
			dup2(null, STDIN_FILENO);
			dup2(null, STDOUT_FILENO);
			if (null > STDERR_FILENO)
				close(null);
		}
		char vol[PATH_MAX + 16];
		/* A PostgreSQL volume's node directory comes from the same
		 * FERRY_STATE_DIR, which the reconciler inherits. */
		snprintf(vol, sizeof(vol), "%s%s", meta_url_is_pg(md->cfg.db_path) ? "" : "sqlite://",
			 md->cfg.db_path);
		char val[RC_NOPTS][16], stop_s[16];
		const char *argv[20 + 2 * RC_NOPTS];
		int n = 0;

		argv[n++] = exe;
		argv[n++] = "--volume";
		argv[n++] = vol;
		argv[n++] = "--staging-dir";
		argv[n++] = md->cfg.staging_dir;
		argv[n++] = "--socket";
		argv[n++] = md->rc_path;
		char epoch[24];
		if (meta_lease_fenced_to(md->meta)) {
			snprintf(epoch, sizeof(epoch), "%llu",
				 (unsigned long long)meta_lease_fenced_to(md->meta));
			argv[n++] = "--lease-epoch";
			argv[n++] = epoch;
		}
		if (md->cfg.metrics) {
			argv[n++] = "--metrics";
			argv[n++] = md->cfg.metrics;
		}
		if (read_cache_dir(md->cache)) {
			argv[n++] = "--cache-dir";
			argv[n++] = read_cache_dir(md->cache);
		}
		for (int k = 0; k < RC_NOPTS; k++) {
			if (md->rc_opt[k] < 0)
				continue;
			snprintf(val[k], sizeof(val[k]), "%d", md->rc_opt[k]);
			argv[n++] = rc_opt_defs[k].flag;
			argv[n++] = val[k];
		}
		snprintf(stop_s, sizeof(stop_s), "%d", md->stop_timeout_s);
		argv[n++] = "--shutdown-timeout";
		argv[n++] = stop_s;
		argv[n++] = "-f";
		argv[n] = NULL;
		execv(exe, (char *const *)argv);
		fprintf(stderr, "ferry-mountd: cannot run %s: %s\n", exe, strerror(errno));
		_exit(127);
	}
	md->rc_child = pid;
	return 0;
}

/* Starts our reconciler once the staging directory is free of any other. */
static int reconciler_launch(struct mountd *md)
{
	/* The reconciler of a killed daemon (or a killed reconciler still
	 * exiting) may hold the staging directory's lock (an exclusive
	 * flock()): wait for it. A shared lock taken and dropped at once
	 * tells; our reconciler starts only after. Read-only, as the
	 * reconciler holds it: see reconciler/main.c. */
	int lfd = openat(md->staging_dirfd, RECONCILE_LOCK_NAME,
			 O_RDONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);

	for (int tries = 0; lfd >= 0 && tries < 2400; tries++) {
		if (flock(lfd, LOCK_SH | LOCK_NB) == 0 || errno != EWOULDBLOCK)
			break;
		if (tries == 0)
			log_info("waiting for an earlier reconciler to finish");
		usleep(50 * 1000);
	}
	if (lfd >= 0)
		close(lfd);
	unlink(md->rc_path); /* a socket left by a killed reconciler */
	return spawn_reconciler(md);
}

/* Connects to the reconciler; it needs a moment to listen (and finishes
 * journaled jobs first). */
static int reconciler_connect(struct mountd *md, int *sock)
{
	int rc;

	for (int tries = 0;; tries++) {
		rc = reconcile_connect(md->rc_path, sock);
		if (rc == 0)
			return 0;
		if (md->rc_child > 0 && waitpid(md->rc_child, NULL, WNOHANG) == md->rc_child) {
			md->rc_child = 0;
			return -ECHILD;
		}
		if (tries > 1200)
			return rc;
		usleep(50 * 1000);
	}
}

int rclient_start(struct mountd *md)
{
	uint64_t epoch = 0;
	size_t pending;
	int rc;

	rc = meta_seq_epoch(md->meta, &epoch);
	if (rc < 0)
		return rc;
	md->rc_next_seq = epoch << 32;
	md->pid = getpid();
	/* Before the reconciler starts: it finishes every record it finds. */
	pending = staging_recover(md, !md->cfg.reconciler);
	if (!md->cfg.reconciler) {
		if (asprintf(&md->rc_path, "%s/reconciler.sock", md->cfg.staging_dir) < 0)
			return -ENOMEM;
		rc = reconciler_launch(md);
		if (rc < 0)
			return rc;
	} else if (!(md->rc_path = strdup(md->cfg.reconciler))) {
		return -ENOMEM;
	}
	rc = reconciler_connect(md, &md->rc_sock);
	if (rc < 0)
		return rc;
	atomic_store(&md->rc_up, true);
	md->layout_upto = md->rc_next_seq; /* the jobs staging_recover() made */
	/* Nothing of an earlier run to commit (and no other daemon's
	 * reconciler, which could hold jobs this one never saw): layouts may
	 * be kept from the first READ, not only after the reconciler's
	 * first report. */
	if (pending == 0 && !md->cfg.reconciler)
		atomic_store(&md->layout_ready, true);
	rc = pthread_create(&md->rc_reader, NULL, reader_main, md);
	if (rc) {
		close(md->rc_sock);
		md->rc_sock = -1;
		atomic_store(&md->rc_up, false);
		return -rc;
	}
	md->rc_reader_live = true;
	return 0;
}

bool rclient_up(struct mountd *md)
{
	return atomic_load(&md->rc_up);
}

/* A daemon-path staging file is sparse and may end before the file does:
 * it gets the file's length, which the reconciler checks against the job's. */
static int staging_extend(struct wstate *w, uint64_t size)
{
	struct stat st;

	if (fstat(w->fd, &st) < 0)
		return -errno;
	if ((uint64_t)st.st_size < size && ftruncate(w->fd, (off_t)size) < 0)
		return -errno;
	return 0;
}

/* The data extents of fd within [0, size), as job->dirty. More than
 * RECONCILE_RANGES_MAX of them: none (the whole file). */
static int data_extents(int fd, uint64_t size, struct reconcile_job *job)
{
	size_t cap = 16;
	off_t at = 0;

	job->dirty = calloc(cap, sizeof(*job->dirty));
	if (!job->dirty)
		return -ENOMEM;
	job->ndirty = 0;
	while ((uint64_t)at < size) {
		off_t d = lseek(fd, at, SEEK_DATA), h;
		if (d < 0) {
			if (errno == ENXIO)
				break;
			return -errno;
		}
		if ((uint64_t)d >= size)
			break;
		h = lseek(fd, d, SEEK_HOLE);
		if (h < 0)
			return -errno;
		if ((uint64_t)h > size)
			h = (off_t)size;
		if (job->ndirty == RECONCILE_RANGES_MAX) {
			job->ndirty = 0; /* too fragmented: send it all */
			return 0;
		}
		if (job->ndirty == cap) {
			struct reconcile_range *n = realloc(job->dirty, 2 * cap * sizeof(*n));
			if (!n)
				return -ENOMEM;
			job->dirty = n;
			cap *= 2;
		}
		job->dirty[job->ndirty].start = (uint64_t)d;
		job->dirty[job->ndirty].end = (uint64_t)h;
		job->ndirty++;
		at = h;
	}
	return 0;
}

/* A passthrough staging file that nothing changed since it started: the
 * metadata's size was 0 then (w->size_changed unset), no utimens, and its
 * own mtime still the one it was made with (a write, a truncate, even to
 * the same size, stamps a new one). */
static bool untouched(struct wstate *w)
{
	struct stat st;

	return !w->size_changed && !w->mtime_set && fstat(w->fd, &st) == 0 && st.st_size == 0 &&
	       timespec_eq(&st.st_mtim, &w->started_mtime);
}

int rclient_handoff(struct mountd *md, struct inode *i)
{
	struct wstate *w = i->w;
	struct reconcile_job job = { 0 };
	const char *name = strrchr(w->path, '/') + 1;
	char *iname; /* i->inflight_name once handed over */
	bool attached = false;
	uint64_t size;
	int rc;

	if (!rclient_up(md))
		return -ENOTCONN;
	/* (Closed while it waited on the retry list.) */
	rc = wstate_reopen(w);
	if (rc < 0)
		return rc;
	rc = wstate_stat(w, &size, &job.mtime);
	if (rc < 0)
		return rc;
	job.ino = i->ino;
	job.length = size;
	snprintf(job.name, sizeof(job.name), "%s", name);
	if (w->passthrough && w->nprints == 0) {
		/* Nothing of this staging file was committed before (no fsync),
		 * and the file was empty at open: only its data extents need
		 * uploading; holes read as zeros without a slice (and stay holes
		 * for SEEK_HOLE). Past RECONCILE_RANGES_MAX extents, the whole file. */
		rc = data_extents(w->fd, size, &job);
		if (rc < 0) {
			reconcile_job_clear(&job);
			return rc;
		}
		if (job.ndirty == 0 && size > 0)
			job.size_only = 1;
		if (job.ndirty == 0 && size == 0 && untouched(w)) {
			/* Created (or found empty) and closed as it was: the
			 * metadata holds this file already. */
			reconcile_job_clear(&job);
			return -ENODATA;
		}
	} else if (w->passthrough) {
		/* Committed before (fsync) or copied in at open: only the units
		 * whose fingerprints changed since. */
		rc = wstate_changed_ranges(md, w, size, &job.dirty, &job.ndirty);
		if (rc < 0)
			return rc;
		if (job.ndirty == 0) {
			if (size == w->size && !w->size_changed &&
			    job.mtime.tv_sec == w->mtime.tv_sec &&
			    job.mtime.tv_nsec == w->mtime.tv_nsec) {
				reconcile_job_clear(&job);
				return -ENODATA; /* nothing to commit */
			}
			job.size_only = 1;
		}
	} else {
		/* The daemon path knows exactly what changed: past what one
		 * record holds, the caller commits the file itself. */
		if (w->ndirty > RECONCILE_RANGES_MAX)
			return -E2BIG;
		rc = staging_extend(w, size);
		if (rc < 0)
			return rc;
		size_t n = 0;
		job.dirty = calloc(w->ndirty ? w->ndirty : 1, sizeof(*job.dirty));
		if (!job.dirty)
			return -ENOMEM;
		for (size_t k = 0; k < w->ndirty; k++) {
			uint64_t s = w->dirty[k].start, e = w->dirty[k].end < size ? w->dirty[k].end : size;
			if (s >= e)
				continue;
			job.dirty[n].start = s;
			job.dirty[n].end = e;
			n++;
		}
		job.ndirty = n;
		if (n == 0) {
			if (!w->size_changed) {
				reconcile_job_clear(&job);
				return -ENODATA; /* nothing to commit */
			}
			job.size_only = 1;
		}
	}
	/* The namespace changes made before this (the file's creation, a
	 * truncate) must commit first, which they might not if this daemon
	 * died with them only in its metadata journal: the reconciler's commit
	 * waits for them (their batch is normally committed by then). */
	job.meta_seq = meta_journal_last(md->meta);
	/* Made before anything is handed over, which must then be on the
	 * in-flight list to be sent again to a new reconciler. */
	iname = malloc(RECONCILE_NAME_MAX + 1);
	if (!iname) {
		reconcile_job_clear(&job);
		return -ENOMEM;
	}
	rc = rclient_lock_with_room(md, atomic_load(&md->rc_stalled) ? 0 : HANDOFF_ROOM_WAIT_MS);
	if (rc < 0) {
		free(iname);
		reconcile_job_clear(&job);
		return rc;
	}
	job.seq = ++md->rc_next_seq;
	/* Journal first: from here on a SIGKILL of either side loses nothing. */
	rc = reconcile_job_attach(md->staging_dirfd, w->fd, &job, &attached);
	if (rc == 0)
		rc = reconcile_handoff(md->rc_sock, &job, w->fd);
	if (rc == 0) {
		/* For a resend, should the reconciler have to be restarted. */
		snprintf(iname, RECONCILE_NAME_MAX + 1, "%s", job.name);
		inflight_unlink(i); /* never on it twice */
		free(i->inflight_name);
		i->inflight_name = iname;
		iname = NULL;
		i->inext = md->inflight;
		if (i->inext)
			i->inext->iprevp = &i->inext;
		i->iprevp = &md->inflight;
		md->inflight = i;
		i->iseq = job.seq;
		i->isize = size;
	}
	pthread_mutex_unlock(&md->rc_lock);
	free(iname); /* NULL unless the hand-off failed */
	if (rc < 0) {
		/* The caller commits the file itself now; a record left behind
		 * could later replay these bytes over newer ones. */
		reconcile_job_detach(md->staging_dirfd, w->fd, job.name, attached);
		reconcile_job_clear(&job);
		return rc;
	}
	i->inflight_seq = job.seq;
	/* A passthrough staging file holds the whole file; one of the daemon
	 * path only the ranges written (the rest is in the store). */
	i->inflight_whole = w->passthrough;
	i->inflight_size = size;
	i->inflight_mtime = job.mtime;
	i->inflight_error = 0;
	i->inflight_retry_error = 0;
	atomic_fetch_add(&md->rc_inflight, 1);
	atomic_fetch_add(&md->stats.handoffs, 1);
	inode_ref(md, i->ino, 0, 1); /* held until the job is committed */
	/* The staging file is the reconciler's now. */
	wstate_forget(md, i);
	reconcile_job_clear(&job);
	return 0;
}

int rclient_journal(struct mountd *md, struct inode *i, unsigned flags)
{
	struct wstate *w = i->w;
	struct reconcile_job job = { .ino = i->ino };
	uint64_t size;
	size_t n = 0;
	int rc;

	if (!w || w->passthrough || (!w->ndirty && !w->size_changed))
		return 0;
	if (w->ndirty > RECONCILE_RANGES_MAX)
		return -E2BIG; /* more than a record holds: the caller commits now */
	rc = wstate_stat(w, &size, &job.mtime);
	if (rc < 0)
		return rc;
	job.length = size;
	snprintf(job.name, sizeof(job.name), "%s", strrchr(w->path, '/') + 1);
	rc = staging_extend(w, size);
	if (rc < 0)
		return rc;
	job.dirty = calloc(w->ndirty ? w->ndirty : 1, sizeof(*job.dirty));
	if (!job.dirty)
		return -ENOMEM;
	for (size_t k = 0; k < w->ndirty; k++) {
		uint64_t e = w->dirty[k].end < size ? w->dirty[k].end : size;
		if (w->dirty[k].start >= e)
			continue;
		job.dirty[n].start = w->dirty[k].start;
		job.dirty[n].end = e;
		n++;
	}
	job.ndirty = n;
	job.size_only = n == 0;
	pthread_mutex_lock(&md->rc_lock);
	job.seq = ++md->rc_next_seq;
	pthread_mutex_unlock(&md->rc_lock);
	/* Kept as <name>.fj, not .job: the reconciler takes up .job records it
	 * finds, and this file is still open and changing. staging_recover()
	 * turns it into a .job after a crash; the handoff at release supersedes
	 * it. */
	w->flush_recorded = true; /* from the first try on, one may be left */
	rc = reconcile_job_write(md->staging_dirfd, &job, flags);
	if (rc == 0) {
		char from[RECONCILE_NAME_MAX + 16], to[RECONCILE_NAME_MAX + 16];
		snprintf(from, sizeof(from), "%s%s", job.name, RECONCILE_JOB_SUFFIX);
		snprintf(to, sizeof(to), "%s%s", job.name, STAGING_FLUSH_SUFFIX);
		if (renameat(md->staging_dirfd, from, md->staging_dirfd, to) < 0)
			rc = -errno;
	}
	reconcile_job_clear(&job);
	return rc;
}

void rclient_inflight_name(struct mountd *md, struct inode *i, char *buf, size_t cap)
{
	pthread_mutex_lock(&md->rc_lock);
	snprintf(buf, cap, "%s", i->inflight_name ? i->inflight_name : "");
	pthread_mutex_unlock(&md->rc_lock);
}

int rclient_wait(struct mountd *md, struct inode *i, int timeout_ms)
{
	struct timespec until, slice;

	uint64_t asked_gen = UINT64_MAX, retry_gen = i->inflight_retry_gen;

	mono_deadline_ms(&until, timeout_ms);
	/* The reconciler's commit may be waiting for our open metadata batch,
	 * which would otherwise commit only at the flusher's next round. */
	if (i->inflight_seq)
		(void)meta_flush(md->meta);
	while (i->inflight_seq) {
		if (!rclient_up(md) && !atomic_load(&md->rc_restarting))
			return -ENOTCONN;
		/* A drain request makes the reconciler commit without waiting
		 * for company (its commit window); asked again of a reconciler
		 * started since. Its reply only raises rc_drained. Lock order:
		 * ino->lock, then rc_lock, as in rclient_handoff. */
		pthread_mutex_lock(&md->rc_lock);
		if (md->rc_conn_gen != asked_gen && rclient_up(md) &&
		    rclient_room_fd(md->rc_sock, 0)) {
			asked_gen = md->rc_conn_gen;
			(void)reconcile_drain(md->rc_sock, i->inflight_seq);
		}
		pthread_mutex_unlock(&md->rc_lock);
		/* A full disk is not a slow commit: say so rather than hold
		 * the caller until an operator frees space. Only an attempt
		 * that failed during this wait counts (the space may be back). */
		if (i->inflight_retry_gen != retry_gen &&
		    (i->inflight_retry_error == -ENOSPC || i->inflight_retry_error == -EDQUOT))
			return i->inflight_retry_error;
		/* Short slices: a reconciler restart does not signal this inode. */
		mono_deadline_ms(&slice, 250);
		if (mono_passed(&until))
			return -ETIMEDOUT;
		pthread_cond_timedwait(&i->committed, &i->lock, &slice);
	}
	return 0;
}

void rclient_drop(struct mountd *md, uint64_t ino)
{
	/* Every job of ino handed over so far: no new one can come. */
	uint64_t upto_seq = atomic_load(&md->rc_next_seq);
	int rc;

	if (!rclient_up(md) || md->cfg.reconciler || md->fsync_local || md->lookups_unknown ||
	    upto_seq == 0)
		return;
	pthread_mutex_lock(&md->rc_lock);
	rc = rclient_room_fd(md->rc_sock, 0) ? reconcile_drop(md->rc_sock, ino, upto_seq) : -EAGAIN;
	pthread_mutex_unlock(&md->rc_lock);
	if (rc == 0)
		atomic_fetch_add(&md->stats.uploads_drop_asked, 1);
}

int rclient_stats(struct mountd *md, struct reconcile_stats *out)
{
	struct timespec until;
	uint64_t gen;
	int rc = 0;

	if (!rclient_up(md))
		return -ENOTCONN;
	pthread_mutex_lock(&md->rc_lock);
	gen = md->rc_stats_gen;
	/* A reconciler that reads nothing answers nothing either. */
	rc = rclient_room_fd(md->rc_sock, 0) ? reconcile_stats_query(md->rc_sock) : -EAGAIN;
	mono_deadline_ms(&until, 2000);
	while (rc == 0 && md->rc_stats_gen == gen && rclient_up(md))
		if (pthread_cond_timedwait(&md->rc_cond, &md->rc_lock, &until) == ETIMEDOUT)
			rc = -ETIMEDOUT;
	if (rc == 0 && md->rc_stats_gen == gen)
		rc = -ENOTCONN;
	if (rc == 0)
		*out = md->rc_stats;
	pthread_mutex_unlock(&md->rc_lock);
	return rc;
}

/* Whether a reconciler serves, or is being started again and soon will. */
static bool rclient_coming(struct mountd *md)
{
	return rclient_up(md) || atomic_load(&md->rc_restarting);
}

int rclient_drain(struct mountd *md, int idle_timeout_ms)
{
	struct timespec until, slice;
	uint64_t upto, last_inflight, gen;
	bool asked;
	int rc;

	if (!rclient_coming(md))
		return -ENOTCONN;
	pthread_mutex_lock(&md->rc_lock);
	upto = md->rc_next_seq;
	gen = md->rc_conn_gen;
	/* A send that fails means the connection died: the reader thread sees
	 * it too, and the request goes again to the reconciler it starts. One
	 * that reads nothing now is asked again below once it does. */
	asked = rclient_room_fd(md->rc_sock, 0);
	if (asked)
		(void)reconcile_drain(md->rc_sock, upto);
	last_inflight = atomic_load(&md->rc_inflight);
	mono_deadline_ms(&until, idle_timeout_ms);
	/* The deadline moves while jobs still complete: a big upload that
	 * progresses is waited for, a stuck one is not. A reconciler that
	 * dies meanwhile is started again by the reader thread (which does
	 * not signal here when it only starts): the request goes to the new
	 * one, which has every job still in flight again. */
	while (md->rc_drained < upto && rclient_coming(md)) {
		if ((md->rc_conn_gen != gen || !asked) && rclient_up(md) &&
		    rclient_room_fd(md->rc_sock, 0)) {
			gen = md->rc_conn_gen;
			asked = true;
			(void)reconcile_drain(md->rc_sock, upto);
		}
		mono_deadline_ms(&slice, 250);
		pthread_cond_timedwait(&md->rc_cond, &md->rc_lock, &slice);
		if (mono_passed(&until)) {
			uint64_t n = atomic_load(&md->rc_inflight);
			if (n >= last_inflight) {
				pthread_mutex_unlock(&md->rc_lock);
				return -ETIMEDOUT;
			}
			last_inflight = n;
			mono_deadline_ms(&until, idle_timeout_ms);
		}
	}
	rc = md->rc_drained < upto ? -ENOTCONN : 0;
	pthread_mutex_unlock(&md->rc_lock);
	return rc;
}

void rclient_stop(struct mountd *md)
{
	int rc = 0;

	if (rclient_coming(md)) {
		rc = rclient_drain(md, md->stop_timeout_s * 1000);
		if (rc < 0)
			log_errno(rc, "ferry-reconciler did not finish every job (none finished for "
				  "%d s): %llu of this run left (they stay journaled in %s and are "
				  "finished at the next start)", md->stop_timeout_s,
				  (unsigned long long)atomic_load(&md->rc_inflight), md->cfg.staging_dir);
	}
	/* Under the lock: a restart on the reader thread either installed its
	 * socket already (shut down here) or sees rc_stopping and gives up. */
	pthread_mutex_lock(&md->rc_lock);
	atomic_store(&md->rc_stopping, true);
	if (md->rc_sock >= 0)
		shutdown(md->rc_sock, SHUT_RDWR);
	pthread_mutex_unlock(&md->rc_lock);
	if (md->rc_reader_live) {
		pthread_join(md->rc_reader, NULL);
		md->rc_reader_live = false;
	}
	if (md->rc_sock >= 0) {
		close(md->rc_sock);
		md->rc_sock = -1;
	}
	if (md->rc_child > 0) {
		int st;
		kill(md->rc_child, SIGTERM);
		/* Nothing finished for stop_timeout already: a second stop
		 * signal (SIGINT and SIGTERM both stop it) means stop now,
		 * logging what is left, instead of waiting that long again. */
		if (rc == -ETIMEDOUT)
			kill(md->rc_child, SIGINT);
		if (waitpid(md->rc_child, &st, 0) == md->rc_child && !(WIFEXITED(st) && WEXITSTATUS(st) == 0))
			log_warnx("ferry-reconciler ended with status 0x%x", st);
		md->rc_child = 0;
	}
	free(md->rc_path);
	md->rc_path = NULL;
}
