/*
 * jobs: the life of a reconcile job.
 *
 *   queued -> (start: open, plan, allocate slice ids) -> uploading
 *          -> ready (every object stored) -> committing -> finished
 *
 * Jobs start in seq order, at most max_active at once. Commits of one inode
 * go in seq order: a job commits only at the head of its inode's queue.
 * A failed attempt (upload or metadata) waits retry_delay * 4^(n-1) and
 * tries again, re-uploading only the objects not yet stored; after
 * `retries` attempts the job is kept as <name>.orphan (record
 * <name>.orphan.job), reported with -EIO, and tried again at the next
 * start. Replies go to the connection the handoff came on, if still open.
 *
 * An attempt that failed for want of memory (-ENOMEM, from our code,
 * SQLite, libcurl or the store) says nothing about the job: it does not
 * count towards `retries` (the job would be orphaned by a passing memory
 * shortage), and waits NOMEM_DELAY_MS doubling up to NOMEM_DELAY_MAX_MS,
 * so that a commit a reopen waits for comes soon after memory does.
 *
 * The same holds for a full disk (-ENOSPC, -EDQUOT: the metadata
 * database's, or a file:// store's): the job waits FULL_DELAY_MAX_MS at
 * most between attempts and is never orphaned for it, so it commits soon
 * after an operator frees space, without a restart. Each failed attempt
 * that will be retried is reported (Retrying), so that ferry-mountd can
 * answer ENOSPC to an operation waiting on the commit instead of holding
 * it until the space comes back.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "boot.h"
#include "clock.h"
#include "log.h"
#include "reconciler.h"

enum finish_kind { FIN_COMMITTED, FIN_DROPPED, FIN_ORPHANED };

#define NOMEM_DELAY_MS 100
#define NOMEM_DELAY_MAX_MS 5000
#define FULL_DELAY_MAX_MS 5000

static void job_start(struct rec *r, struct job *j);
static void job_maybe_commit(struct rec *r, struct job *j);
static void job_attempt_failed(struct rec *r, struct job *j);

/* ---- lookup tables ---- */

static size_t name_hash(const struct rec *r, const char *s)
{
	uint64_t h = 1469598103934665603ull;

	for (; *s; s++)
		h = (h ^ (unsigned char)*s) * 1099511628211ull;
	return (size_t)(h & (r->nbuckets - 1));
}

static size_t ino_hash(const struct rec *r, uint64_t ino)
{
	return (size_t)((ino * 0x9E3779B97F4A7C15ull) >> 20) & (r->nbuckets - 1);
}

struct job *jobs_find_name(struct rec *r, const char *name)
{
	for (struct job *j = r->by_name[name_hash(r, name)]; j; j = j->hnext)
		if (strcmp(j->rj.name, name) == 0)
			return j;
	return NULL;
}

static void name_remove(struct rec *r, struct job *j)
{
	struct job **pp = &r->by_name[name_hash(r, j->rj.name)];

	while (*pp && *pp != j)
		pp = &(*pp)->hnext;
	if (*pp)
		*pp = j->hnext;
}

static struct inode_q *iq_get(struct rec *r, uint64_t ino, bool create)
{
	struct inode_q **b = &r->by_ino[ino_hash(r, ino)], *q;

	for (q = *b; q; q = q->hnext)
		if (q->ino == ino)
			return q;
	if (!create)
		return NULL;
	q = calloc(1, sizeof(*q));
	if (!q)
		return NULL;
	q->ino = ino;
	TAILQ_INIT(&q->jobs);
	q->hnext = *b;
	*b = q;
	return q;
}

static void iq_drop(struct rec *r, struct inode_q *q)
{
	struct inode_q **pp = &r->by_ino[ino_hash(r, q->ino)];

	while (*pp && *pp != q)
		pp = &(*pp)->hnext;
	if (*pp)
		*pp = q->hnext;
	free(q);
}

/* Finished jobs, so a late handoff of one gets its result, not an error. */
bool jobs_recent(struct rec *r, const char *name, uint64_t seq, int *err)
{
	size_t n = r->nrecent < REC_RECENT ? r->nrecent : REC_RECENT;

	/* Only after a race between a journal scan and a handoff: rare. */
	for (size_t i = 0; i < n; i++) {
		const struct recent *e = &r->recent[i];
		if (e->seq == seq && strcmp(e->name, name) == 0) {
			*err = e->err;
			return true;
		}
	}
	return false;
}

static void recent_add(struct rec *r, const struct job *j, int err)
{
	struct recent *e = &r->recent[r->nrecent % REC_RECENT];

	snprintf(e->name, sizeof(e->name), "%s", j->rj.name);
	e->seq = j->rj.seq;
	e->err = err;
	r->nrecent++;
}

static const char *state_name(enum job_state s)
{
	static const char *const n[] = { "queued", "planning", "uploading", "ready",
					 "committing", "waiting to retry" };
	return n[s];
}

/* ---- drains ---- */

static void commit_kick(struct rec *r);

static uint64_t orphans_upto(struct rec *r, uint64_t upto)
{
	uint64_t n = 0;

	for (size_t i = 0; i < r->norphan_seqs; i++)
		n += r->orphan_seqs[i] <= upto;
	return n;
}

static bool drained(struct rec *r, uint64_t upto)
{
	/* r->all is in seq order: its head is the oldest unfinished job. */
	return TAILQ_EMPTY(&r->all) || TAILQ_FIRST(&r->all)->rj.seq > upto;
}

static void drain_reply(struct rec *r, struct conn *c, uint64_t upto)
{
	struct reconcile_reply rep = { .type = RECONCILE_REPLY_DRAINED, .upto_seq = upto,
				       .failed = orphans_upto(r, upto) };
	conn_reply(r, c, &rep);
}

static void drains_check(struct rec *r)
{
	struct drain_wait *d;

again:
	TAILQ_FOREACH(d, &r->drains, link) {
		if (!drained(r, d->upto))
			continue;
		/* Off the list first: a reply the peer cannot take closes its
		 * connection, which drops that connection's drains from the
		 * list (jobs_conn_gone); so look again from the start. */
		TAILQ_REMOVE(&r->drains, d, link);
		drain_reply(r, d->conn, d->upto);
		conn_unref(d->conn);
		free(d);
		goto again;
	}
}

int jobs_drain_add(struct rec *r, struct conn *c, uint64_t upto)
{
	struct drain_wait *d;

	if (drained(r, upto)) {
		drain_reply(r, c, upto);
		return 0;
	}
	d = calloc(1, sizeof(*d));
	if (!d)
		return -ENOMEM;
	d->conn = c;
	d->upto = upto;
	conn_ref(c);
	TAILQ_INSERT_TAIL(&r->drains, d, link);
	jobs_start_ready(r); /* someone waits: no deferral, */
	commit_kick(r);      /* and no window */
	return 0;
}

void jobs_conn_gone(struct rec *r, struct conn *c)
{
	struct drain_wait *d, *next;

	for (d = TAILQ_FIRST(&r->drains); d; d = next) {
		next = TAILQ_NEXT(d, link);
		if (d->conn != c)
			continue;
		TAILQ_REMOVE(&r->drains, d, link);
		conn_unref(c);
		free(d);
	}
}

/* ---- adding and finishing ---- */

static void job_free(struct job *j)
{
	if (!j)
		return;
	if (j->timer)
		event_free(j->timer);
	if (j->fd >= 0)
		close(j->fd);
	if (j->r)
		seeds_remove(j->r, j);
	reconcile_plan_free(&j->plan);
	reconcile_job_clear(&j->rj);
	free(j->done);
	if (j->conn)
		conn_unref(j->conn);
	free(j);
}

static void ready_remove(struct rec *r, struct job *j)
{
	TAILQ_REMOVE(&r->ready, j, ready_link);
	j->on_ready = false;
	r->nready--;
	r->ready_bytes -= j->rj.length;
}

/* ---- deferral: the foreground first ---- */

/*
 * A burst of small files (a checkout, an untar, a build) hands the
 * reconciler a job per file, and each job costs CPU, a metadata
 * transaction, an fsync of the object (file://) and a commit notice back
 * to ferry-mountd: on a small node, started at once they take about as
 * much from the writer as its own work does. So a handed-over job waits
 * while others keep coming, and starts once the handoffs pause for
 * upload_quiet_ms, or upload_delay_max_ms after its own handoff (a writer
 * that never pauses), or when the waiting jobs reach three quarters of
 * max_jobs or their bytes the upload buffer (the backlog and the time to
 * drain it stay bounded). Past that, uploads keep pace with the handoffs
 * (max_active at once against one writer), so the last quarter keeps the
 * writer from max_jobs, where handoffs stop. Half, as it was, started
 * uploading the last 1,800 files of a 10,000-file checkout as they came,
 * which cost the checkout 5-14% (tests/bench/compare_turns.sh).
 * Anyone waiting on a commit does not wait for the pause:
 * a drain (ferry drain, unmount, fsync=remote, an open that needs the
 * commit) starts every job at once, as does shutdown. Jobs found in the
 * journal before any handoff (at start) have nobody writing behind them
 * and start at once; those a later scan finds wait like the rest.
 *
 * The data is no less durable meanwhile: a handed-over file is on the
 * staging disk, with its record, whether or not its upload started.
 */
static bool start_due(struct rec *r, const struct job *j, int64_t now, int64_t *wait_ns)
{
	int64_t quiet = (int64_t)r->cfg.upload_quiet_ms * 1000000;
	int64_t most = (int64_t)r->cfg.upload_delay_max_ms * 1000000;
	int64_t to_quiet, to_most;

	if (quiet == 0 || r->stopping || r->last_handoff_ns == 0 || !TAILQ_EMPTY(&r->drains) ||
	    r->nready >= r->cfg.max_jobs - r->cfg.max_jobs / 4 ||
	    r->ready_bytes >= r->cfg.buffer_bytes)
		return true;
	to_quiet = r->last_handoff_ns + quiet - now;
	to_most = j->added_ns + most - now;
	if (to_quiet <= 0 || to_most <= 0)
		return true;
	*wait_ns = to_quiet < to_most ? to_quiet : to_most;
	return false;
}

static void defer_cb(evutil_socket_t fd, short what, void *arg)
{
	struct rec *r = arg;

	(void)fd;
	(void)what;
	r->defer_armed = false;
	jobs_start_ready(r);
}

/* Looks at the ready jobs again in wait_ns; false if no timer could be
 * set (the caller then starts them now rather than strand them). */
static bool defer_arm(struct rec *r, int64_t wait_ns)
{
	struct timeval tv;

	/* An armed timer fires no later than this one would: the head's own
	 * limit does not move, and the quiet end only moves later. */
	if (r->defer_armed)
		return true;
	if (!r->defer_timer && !(r->defer_timer = evtimer_new(r->base, defer_cb, r)))
		return false;
	tv.tv_sec = (time_t)(wait_ns / 1000000000);
	tv.tv_usec = (suseconds_t)(wait_ns % 1000000000 / 1000) + 1;
	if (evtimer_add(r->defer_timer, &tv) < 0)
		return false;
	r->defer_armed = true;
	return true;
}

void jobs_start_ready(struct rec *r)
{
	int64_t now = mono_now_ns(), wait_ns = 0;
	struct job *j;

	while (r->nactive < r->cfg.max_active && (j = TAILQ_FIRST(&r->ready))) {
		if (!start_due(r, j, now, &wait_ns) && defer_arm(r, wait_ns))
			return;
		job_start(r, j);
	}
}

static void backoff_cb(evutil_socket_t fd, short what, void *arg);

int jobs_add(struct rec *r, struct reconcile_job *rj, int fd, const char *file, bool orphan,
	     bool rec_xattr, struct conn *conn)
{
	struct job *j = calloc(1, sizeof(*j)), *p;
	bool urgent = false;

	if (!j)
		return -ENOMEM;
	j->iq = iq_get(r, rj->ino, true);
	j->timer = evtimer_new(r->base, backoff_cb, j);
	if (!j->iq || !j->timer) {
		if (j->iq && TAILQ_EMPTY(&j->iq->jobs))
			iq_drop(r, j->iq);
		j->fd = -1;
		job_free(j);
		return -ENOMEM;
	}
	j->r = r;
	/* file may point into rj: copy it before rj is taken. */
	snprintf(j->file, sizeof(j->file), "%s", file);
	snprintf(j->jobfile, sizeof(j->jobfile), "%s%s", file, RECONCILE_JOB_SUFFIX);
	j->rj = *rj;
	memset(rj, 0, sizeof(*rj));
	/* A waiting job keeps the fd its handoff brought only while the fd
	 * limit leaves room for what uploads open: past that, its start
	 * opens the staging file by name, as for a job found in the journal
	 * (the name is the job's for as long as the job lives). At a limit
	 * of 512, keeping every one ran the reconciler out of fds in the
	 * middle of a commit batch; it exited, and each successor again. */
	if (fd >= 0 && r->waiting_fds >= r->waiting_fds_max) {
		close(fd);
		fd = -1;
	} else if (fd >= 0) {
		j->fd_waiting = true;
		r->waiting_fds++;
	}
	j->fd = fd;
	j->added_ns = mono_now_ns();
	if (conn)
		r->last_handoff_ns = j->added_ns;
	j->orphan = orphan;
	j->rec_xattr = rec_xattr;
	j->conn = conn;
	if (conn)
		conn_ref(conn);
	j->blocks = (j->rj.length + REC_GAUGE_BLOCK - 1) / REC_GAUGE_BLOCK;
	j->bytes = j->rj.length;
	r->c.staging_blocks += j->blocks;
	r->c.staging_bytes += j->bytes;

	/* Everything below is kept in seq order; seqs mostly grow, so look
	 * from the tail. */
	for (p = TAILQ_LAST(&r->all, job_list); p && p->rj.seq > j->rj.seq;
	     p = TAILQ_PREV(p, job_list, all_link))
		;
	if (p)
		TAILQ_INSERT_AFTER(&r->all, p, j, all_link);
	else
		TAILQ_INSERT_HEAD(&r->all, j, all_link);
	for (p = TAILQ_LAST(&j->iq->jobs, job_list); p && p->rj.seq > j->rj.seq;
	     p = TAILQ_PREV(p, job_list, iq_link))
		urgent |= p->started;
	if (p)
		TAILQ_INSERT_AFTER(&j->iq->jobs, p, j, iq_link);
	else
		TAILQ_INSERT_HEAD(&j->iq->jobs, j, iq_link);
	j->hnext = r->by_name[name_hash(r, j->rj.name)];
	r->by_name[name_hash(r, j->rj.name)] = j;
	r->njobs++;
	if (r->njobs >= r->cfg.max_jobs)
		control_throttle(r, true);
	log_debug("job %s: inode %" PRIu64 ", seq %" PRIu64 ", %" PRIu64 " bytes, %zu ranges%s",
		  j->file, j->rj.ino, j->rj.seq, j->rj.length, j->rj.ndirty,
		  conn ? "" : " (from the journal)");
	if (urgent) {
		/* A later job of this inode already started and will wait for this
		 * one to commit: start it now, or they could wait on each other. */
		job_start(r, j);
		return 0;
	}
	for (p = TAILQ_LAST(&r->ready, job_list); p && p->rj.seq > j->rj.seq;
	     p = TAILQ_PREV(p, job_list, ready_link))
		;
	if (p)
		TAILQ_INSERT_AFTER(&r->ready, p, j, ready_link);
	else
		TAILQ_INSERT_HEAD(&r->ready, j, ready_link);
	j->on_ready = true;
	r->nready++;
	r->ready_bytes += j->rj.length;
	jobs_start_ready(r);
	return 0;
}

static void job_finish(struct rec *r, struct job *j, int err, const char *msg, enum finish_kind k)
{
	struct inode_q *q = j->iq;
	bool was_head = TAILQ_FIRST(&q->jobs) == j;

	if (j->conn) {
		struct reconcile_reply rep = { .type = RECONCILE_REPLY_COMMITTED, .seq = j->rj.seq,
					       .ino = j->rj.ino, .error = err };
		snprintf(rep.message, sizeof(rep.message), "%s", msg ? msg : "");
		bool hand = k == FIN_COMMITTED && err == 0 && j->seeded;

		if (hand)
			seeds_list(j, &rep);
		/* Named in a reply on its way, the seeds are the receiver's;
		 * otherwise job_free removes them. */
		if (conn_reply(r, j->conn, &rep) && hand)
			j->seeded = 0;
	}
	if (k == FIN_ORPHANED) {
		/* Still only on local disk: it stays in the staging gauges. */
		uint64_t *n = realloc(r->orphan_seqs, (r->norphan_seqs + 1) * sizeof(*n));
		if (n) {
			n[r->norphan_seqs++] = j->rj.seq;
			r->orphan_seqs = n;
		}
		r->c.orphans++;
	} else {
		r->c.staging_blocks -= j->blocks;
		r->c.staging_bytes -= j->bytes;
		if (k == FIN_COMMITTED)
			r->c.committed_total++;
	}
	TAILQ_REMOVE(&r->all, j, all_link);
	TAILQ_REMOVE(&q->jobs, j, iq_link);
	name_remove(r, j);
	if (j->on_ready)
		ready_remove(r, j);
	if (j->started)
		r->nactive--;
	if (j->fd_waiting)
		r->waiting_fds--;
	if (j->feeding)
		TAILQ_REMOVE(&r->feed, j, feed_link);
	recent_add(r, j, err);
	r->njobs--;
	job_free(j);
	rec_progress(r);
	if (r->throttled && r->njobs < r->cfg.max_jobs - r->cfg.max_jobs / 4)
		control_throttle(r, false);
	if (TAILQ_EMPTY(&q->jobs))
		iq_drop(r, q);
	else if (was_head)
		job_maybe_commit(r, TAILQ_FIRST(&q->jobs));
	drains_check(r);
	jobs_start_ready(r);
	rec_check_done(r);
}

/* ---- drops ---- */

/* A job may be dropped while nothing of it has gone anywhere: not started
 * (no object stored, no seed written, no task holds it). Only by the peer
 * that handed it over. */
static struct job *droppable(struct rec *r, struct conn *c, uint64_t ino, uint64_t upto_seq)
{
	struct inode_q *q = iq_get(r, ino, false);
	struct job *j;

	if (!q)
		return NULL;
	TAILQ_FOREACH(j, &q->jobs, iq_link)
		if (j->rj.seq <= upto_seq && !j->started && j->on_ready && j->conn == c)
			return j;
	return NULL;
}

void jobs_drop(struct rec *r, struct conn *c, uint64_t ino, uint64_t upto_seq)
{
	struct job *j;

	/* job_finish() may free the inode's queue: looked up again each time. */
	while ((j = droppable(r, c, ino, upto_seq))) {
		/* The staging file first (its xattr record goes with it), as
		 * after a commit: a record left alone is dropped at the next
		 * start for want of its file. */
		if (unlinkat(r->staging_fd, j->file, 0) < 0 && errno != ENOENT) {
			log_errno(errno, "job %s: cannot remove the staging file of deleted inode "
				  "%" PRIu64 "; it is uploaded as usual", j->file, ino);
			return;
		}
		if (!j->rec_xattr && unlinkat(r->staging_fd, j->jobfile, 0) < 0 && errno != ENOENT)
			log_errno(errno, "job %s: cannot remove its record %s", j->file, j->jobfile);
		log_debug("job %s (inode %" PRIu64 ", seq %" PRIu64 "): dropped, its inode is "
			  "deleted", j->file, ino, j->rj.seq);
		r->c.dropped_total++;
		/* -ECANCELED in a Committed reply means this, and only this. */
		job_finish(r, j, -ECANCELED, "dropped before its upload: the file was deleted",
			   FIN_DROPPED);
	}
}

/* ---- orphans ---- */

/*
 * A job whose staging file is a copy made under another boot and never
 * flushed (STAGING_COPY_SUFFIX): committing it could put zeros over the
 * file's committed content. Its records go and the file is kept aside as
 * <file>.<time>.orphan, which nothing takes up again.
 */
static void job_set_aside_copy(struct rec *r, const char *file)
{
	char to[RECONCILE_NAME_MAX + 64];

	/* The records: an xattr, or <file>.job (the .job the scan found). */
	if (reconcile_job_drop(r->staging_fd, file) < 0)
		log_warn("staging file %s: cannot remove its journal records", file);
	snprintf(to, sizeof(to), "%s.%lld%s", file, (long long)time(NULL), RECONCILE_ORPHAN_SUFFIX);
	if (renameat2(r->staging_fd, file, r->staging_fd, to, RENAME_NOREPLACE) < 0) {
		log_warn("cannot keep staging file %s aside as %s (not committed)", file, to);
		return;
	}
	log_warnx("staging file %s/%s holds a copy of a file's committed content made before the "
		  "machine restarted and never flushed: not committed (the file keeps its "
		  "committed content), kept as %s", r->cfg.staging_dir, file, to);
}

static void job_orphan(struct rec *r, struct job *j)
{
	char msg[RECONCILE_MSG_MAX];

	if (!j->orphan) {
		char file[sizeof(j->file)], rec[sizeof(j->jobfile)];

		/* Record first: a crash between the renames leaves
		 * <name>.orphan.job next to <name>, which the start-up scan
		 * completes. */
		snprintf(file, sizeof(file), "%s%s", j->rj.name, RECONCILE_ORPHAN_SUFFIX);
		snprintf(rec, sizeof(rec), "%s%s", file, RECONCILE_JOB_SUFFIX);
		/* An orphan's record is always a file of its own, which the
		 * start-up scan looks for. */
		if (j->rec_xattr && reconcile_job_write(r->staging_fd, &j->rj, 0) == 0)
			j->rec_xattr = false;
		if (j->rec_xattr ||
		    renameat(r->staging_fd, j->jobfile, r->staging_fd, rec) < 0 ||
		    renameat(r->staging_fd, j->file, r->staging_fd, file) < 0)
			log_warn("job %s: cannot rename it to %s", j->file, file);
		snprintf(j->file, sizeof(j->file), "%s", file);
	}
	log_warnx("error: job %s (inode %" PRIu64 ", seq %" PRIu64 ") failed %u times, last: %s; "
		  "kept as %s/%s, to be tried again at the next start",
		  j->rj.name, j->rj.ino, j->rj.seq, j->attempt, j->errmsg, r->cfg.staging_dir, j->file);
	snprintf(msg, sizeof(msg), "failed %u times (last: %s); kept as %s", j->attempt, j->errmsg,
		 j->file);
	job_finish(r, j, -EIO, msg, FIN_ORPHANED);
}

/* ---- attempts ---- */

static void set_err(struct job *j, int err, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static void set_err(struct job *j, int err, const char *fmt, ...)
{
	va_list ap;

	if (j->err)
		return;
	j->err = err < 0 ? err : -EIO;
	va_start(ap, fmt);
	vsnprintf(j->errmsg, sizeof(j->errmsg), fmt, ap);
	va_end(ap);
}

/* first * factor^(n-1), at most max: the wait before attempt n+1. */
static uint64_t backoff_ms(uint64_t first, unsigned factor, unsigned n, uint64_t max)
{
	uint64_t d = first;

	for (unsigned i = 1; i < n && d < max; i++)
		d *= factor;
	return d < max ? d : max;
}

static void job_attempt_failed(struct rec *r, struct job *j)
{
	uint64_t delay = r->cfg.retry_delay_ms;
	bool nomem = j->err == -ENOMEM;
	bool behind = j->err == -EINPROGRESS;
	/* The volume's lease went to a newer mount (meta_lease_fence): no
	 * commit of this process can ever land again. */
	bool fenced = j->err == -EROFS;
	bool full = j->err == -ENOSPC || j->err == -EDQUOT;
	struct timeval tv;

	r->c.failures_total++;
	if (j->feeding) {
		TAILQ_REMOVE(&r->feed, j, feed_link);
		j->feeding = false;
	}
	if ((behind || fenced) && r->stopping && rec_mount_gone(r)) {
		/* That next start waits for this reconciler to exit: the job
		 * stays journaled for the reconciler it starts. */
		log_debug("job %s (inode %" PRIu64 ", seq %" PRIu64 "): %s; left for the next start",
			  j->file, j->rj.ino, j->rj.seq,
			  behind ? "waits for metadata changes of a ferry-mountd that is gone" :
				   "the volume's lease went to a newer mount");
		j->parked = true;
		j->state = JOB_BACKOFF;
		if (j->started) { /* its slot goes to a job that can still move */
			j->started = false;
			r->nactive--;
		}
		jobs_start_ready(r);
		rec_check_done(r);
		return;
	}
	if (behind) {
		/* Not the job's fault either: the changes it depends on are in
		 * ferry-mountd's metadata journal, which its next start replays.
		 * Wait for that as long as it takes (nothing is lost meanwhile). */
		delay = j->nomem < 5 ? 200u << j->nomem : 5000;
		j->nomem++;
		if (j->nomem == 1 || j->nomem % 100 == 0)
			log_info("job %s (inode %" PRIu64 ", seq %" PRIu64 "): waits for the metadata "
				 "changes it depends on (%s); trying again in %.1f s", j->file,
				 j->rj.ino, j->rj.seq, j->errmsg, (double)delay / 1000);
	} else if (nomem || full) {
		/* Not the job's fault (see the top): it waits, never orphaned
		 * for it. One line for the first few, then one in a hundred. */
		unsigned *n = nomem ? &j->nomem : &j->full;

		(*n)++;
		delay = nomem ? backoff_ms(NOMEM_DELAY_MS, 2, *n, NOMEM_DELAY_MAX_MS) :
				backoff_ms(delay, 2, *n, FULL_DELAY_MAX_MS);
		if (*n <= 3 || *n % 100 == 0)
			log_warnx("job %s (inode %" PRIu64 ", seq %" PRIu64 "): %s (%u times): %s; "
				  "trying again in %.1f s", j->file, j->rj.ino, j->rj.seq,
				  nomem ? "out of memory" : "no space", *n, j->errmsg,
				  (double)delay / 1000);
	} else {
		j->attempt++;
		if (j->attempt >= r->cfg.retries) {
			job_orphan(r, j);
			return;
		}
		delay = backoff_ms(delay, 4, j->attempt, 300000);
		log_warnx("job %s (inode %" PRIu64 ", seq %" PRIu64 "): attempt %u of %u failed: %s; "
			  "trying again in %.1f s",
			  j->file, j->rj.ino, j->rj.seq, j->attempt, r->cfg.retries, j->errmsg,
			  (double)delay / 1000);
	}
	if (j->conn && !behind && !nomem) {
		struct reconcile_reply rep = { .type = RECONCILE_REPLY_RETRYING, .seq = j->rj.seq,
					       .ino = j->rj.ino, .error = j->err };
		snprintf(rep.message, sizeof(rep.message), "%s", j->errmsg);
		conn_reply(r, j->conn, &rep);
	}
	j->state = JOB_BACKOFF;
	tv.tv_sec = (time_t)(delay / 1000);
	tv.tv_usec = (suseconds_t)(delay % 1000) * 1000;
	/* Adding a timer can need memory too (libevent's heap grows): a job
	 * whose timer could not be set is picked up by the rescan. */
	j->timer_lost = evtimer_add(j->timer, &tv) < 0;
	if (j->timer_lost)
		r->timers_lost++;
}

size_t jobs_stuck_behind_parked(struct rec *r)
{
	size_t n = 0;
	struct job *j;

	TAILQ_FOREACH(j, &r->all, all_link) {
		struct job *first = TAILQ_FIRST(&j->iq->jobs);

		if (j->parked || (j->state == JOB_READY && first != j && first->parked))
			n++;
	}
	return n;
}

void jobs_retry_lost_timers(struct rec *r)
{
	struct job *j;

	if (r->timers_lost == 0)
		return;
	TAILQ_FOREACH(j, &r->all, all_link) {
		struct timeval now = { 0, 0 };

		if (!j->timer_lost)
			continue;
		if (evtimer_add(j->timer, &now) < 0)
			return;
		j->timer_lost = false;
		r->timers_lost--;
	}
}

struct alloc_task {
	struct task t;
	struct rec *r;
	struct job *j;
	uint32_t count;
	uint64_t first;
	int rc;
};

static void alloc_run(struct task *t)
{
	struct alloc_task *a = (struct alloc_task *)t;
	a->rc = meta_slice_id_alloc(a->r->meta, a->count, &a->first);
}

static void feed_job(struct rec *r, struct job *j)
{
	j->state = JOB_UPLOADING;
	j->next_obj = 0;
	if (j->ndone == j->plan.nobjects) {
		j->state = JOB_READY;
		job_maybe_commit(r, j);
		return;
	}
	if (!j->feeding) {
		TAILQ_INSERT_TAIL(&r->feed, j, feed_link);
		j->feeding = true;
	}
	upload_feed(r);
}

static void alloc_done(struct task *t)
{
	struct alloc_task *a = (struct alloc_task *)t;
	struct rec *r = a->r;
	struct job *j = a->j;

	if (t->cancelled) {
		free(a);
		return;
	}
	if (a->rc < 0) {
		set_err(j, a->rc, "cannot allocate slice ids: %s", strerror(-a->rc));
		free(a);
		job_attempt_failed(r, j);
		return;
	}
	for (size_t k = 0; k < j->plan.nslices; k++)
		j->plan.slices[k].s.id = a->first + k;
	/* The rest of the range is the pool for the next jobs. */
	r->slice_ids_next = a->first + j->plan.nslices;
	r->slice_ids_end = a->first + a->count;
	free(a);
	feed_job(r, j);
}

/*
 * Slice ids come from the volume's counter in ranges of SLICE_ID_BATCH, so
 * that most jobs take theirs from the pool here instead of a metadata
 * transaction each. Ids a stopped reconciler never used are only a gap.
 */
#define SLICE_ID_BATCH 1024u

static void job_plan_ids(struct rec *r, struct job *j)
{
	struct alloc_task *a;
	uint64_t n = j->plan.nslices;

	if (n <= r->slice_ids_end - r->slice_ids_next) {
		for (uint64_t k = 0; k < n; k++)
			j->plan.slices[k].s.id = r->slice_ids_next + k;
		r->slice_ids_next += n;
		feed_job(r, j);
		return;
	}
	a = calloc(1, sizeof(*a));
	if (!a) {
		set_err(j, -ENOMEM, "out of memory");
		job_attempt_failed(r, j);
		return;
	}
	j->state = JOB_PLANNING;
	a->t.run = alloc_run;
	a->t.done = alloc_done;
	a->r = r;
	a->j = j;
	a->count = (uint32_t)(n > SLICE_ID_BATCH ? n : SLICE_ID_BATCH);
	work_submit(r, &a->t);
}

static bool ids_assigned(const struct job *j)
{
	return j->plan.nslices == 0 || j->plan.slices[0].s.id != 0;
}

static void backoff_cb(evutil_socket_t fd, short what, void *arg)
{
	struct job *j = arg;
	struct rec *r = j->r;

	j->err = 0;
	j->errmsg[0] = '\0';
	if (j->fd < 0 || (!j->rj.size_only && (!j->plan.obj_base || !j->done))) {
		job_start(r, j);
		return;
	}
	if (!ids_assigned(j)) {
		job_plan_ids(r, j);
		return;
	}
	feed_job(r, j);
}

/* Opens (if from the journal), checks and plans a job, then gets its ids. */
static void job_start(struct rec *r, struct job *j)
{
	struct stat st;
	int rc;

	if (j->on_ready) {
		ready_remove(r, j);
	}
	if (!j->started) {
		j->started = true;
		r->nactive++;
	}
	if (j->fd_waiting) {
		j->fd_waiting = false;
		r->waiting_fds--;
	}
	if (j->fd < 0) {
		j->fd = openat(r->staging_fd, j->file, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
		if (j->fd < 0 && errno == ENOENT) {
			log_warnx("job %s (inode %" PRIu64 ", seq %" PRIu64 "): the staging file is "
				  "gone; dropping its record", j->file, j->rj.ino, j->rj.seq);
			reconcile_job_remove(r->staging_fd, j->file);
			job_finish(r, j, -ENOENT, "the staging file is gone", FIN_DROPPED);
			return;
		}
		if (j->fd < 0) {
			set_err(j, -errno, "cannot open the staging file: %s", strerror(errno));
			job_attempt_failed(r, j);
			return;
		}
	}
	if (fstat(j->fd, &st) < 0 || !S_ISREG(st.st_mode)) {
		set_err(j, -EIO, "the staging file is not a regular file");
		job_attempt_failed(r, j);
		return;
	}
	if ((uint64_t)st.st_size < j->rj.length) {
		set_err(j, -EIO, "the staging file has %lld bytes, the job says %" PRIu64,
			(long long)st.st_size, j->rj.length);
		job_attempt_failed(r, j);
		return;
	}
	if (!j->plan.obj_base && !j->rj.size_only) {
		rc = reconcile_plan_make(j->rj.length, j->rj.dirty, j->rj.ndirty, r->vol.block_size,
					 &j->plan);
		if (rc == -ENOMEM) {
			set_err(j, rc, "out of memory planning it");
			job_attempt_failed(r, j);
			return;
		}
		if (rc < 0) {
			/* The same inputs give the same answer: no point retrying. */
			j->attempt = r->cfg.retries;
			set_err(j, rc, "cannot plan it: %s", strerror(-rc));
			job_orphan(r, j);
			return;
		}
	}
	if (!j->done && !j->rj.size_only) {
		/* (A retry: the plan may be there from an attempt that found
		 * no memory for this.) */
		j->done = calloc((size_t)(j->plan.nobjects + 63) / 64 + 1, sizeof(uint64_t));
		if (!j->done) {
			set_err(j, -ENOMEM, "out of memory");
			job_attempt_failed(r, j);
			return;
		}
	}
	if (j->plan.nslices == 0) {
		j->state = JOB_READY;
		job_maybe_commit(r, j);
		return;
	}
	job_plan_ids(r, j);
}

void jobs_object_done(struct rec *r, struct job *j, uint64_t obj, int rc, const char *why)
{
	j->in_flight--;
	if (rc == 0) {
		j->done[obj / 64] |= 1ull << (obj % 64);
		j->ndone++;
		rec_progress(r);
	} else {
		set_err(j, rc, "%s", why && *why ? why : strerror(-rc));
		if (j->feeding) {
			TAILQ_REMOVE(&r->feed, j, feed_link);
			j->feeding = false;
		}
	}
	if (j->in_flight)
		return;
	if (j->err) {
		job_attempt_failed(r, j);
	} else if (j->ndone == j->plan.nobjects) {
		j->state = JOB_READY;
		job_maybe_commit(r, j);
	}
}

/* ---- commit ---- */

/*
 * Commits go in batches, one at a time: while a batch is at a worker, jobs
 * that finish uploading queue on r->commitq, and the next batch takes them
 * all (up to COMMIT_BATCH_MAX) in one metadata transaction and one
 * meta_sync(). A burst of small files then costs a few syncs, not one each.
 * A batch that found no memory halves the next one (down to one job), and
 * each batch that commits doubles it back: one failed allocation undoes
 * the whole transaction, and a big one needs many more of them.
 *
 * A batch also waits for company: up to --commit-window-ms after the first
 * job joined an empty queue, unless the batch is full, someone waits for a
 * drain (ferry-mountd asks for one whenever an fsync, a truncate or an
 * unmount waits for a commit), or the reconciler is stopping. Each commit
 * ends ferry-mountd's open metadata batch (another writer wants the
 * database), so commits one or two files apart doubled the cost of every
 * small file written meanwhile; nobody waits for a commit that nobody asked
 * for.
 */
#define COMMIT_BATCH_MAX 64

struct commit_task {
	struct task t;
	struct rec *r;
	size_t n;
	struct job *jobs[COMMIT_BATCH_MAX];
	struct meta_commit_item items[COMMIT_BATCH_MAX];
	int unlink_err[COMMIT_BATCH_MAX];
	int store_sync_err;             /* objstore_sync() failed: nothing was committed */
};

static void commit_kick(struct rec *r);

static void commit_run(struct task *t)
{
	struct commit_task *c = (struct commit_task *)t;
	struct rec *r = c->r;
	bool any = false;
	int rc;

	for (size_t i = 0; i < c->n; i++) {
		struct job *j = c->jobs[i];

		c->items[i] = (struct meta_commit_item){ .ino = j->rj.ino, .seq = j->rj.seq,
							 .slices = j->plan.slices,
							 .n = j->plan.nslices,
							 .new_size = j->rj.length,
							 .mtime = &j->rj.mtime,
							 .meta_seq = j->rj.meta_seq };
	}
	/* Puts return before their objects are durable (the store defers):
	 * none may be named by a commit before this. */
	if ((rc = objstore_sync(r->store)) == -ENOMEM) {
		for (size_t i = 0; i < c->n; i++)
			c->items[i].rc = rc; /* retried as any commit short of memory */
		return;
	}
	if (rc < 0) {
		log_warnx("error: the object store cannot make uploaded objects durable: %s",
			  objstore_last_error());
		c->store_sync_err = rc;
		return;
	}
	meta_write_commit_batch(r->meta, c->items, c->n);
	for (size_t i = 0; i < c->n; i++)
		any |= c->items[i].rc == 0;
	/* A staging file may go only once its commit is on stable storage. */
	if (any && (rc = meta_sync(r->meta)) != 0)
		for (size_t i = 0; i < c->n; i++)
			if (c->items[i].rc == 0)
				c->items[i].rc = rc;
	/* Committed (now or before a crash), or its inode is gone: the staging
	 * file, then its record, go. */
	for (size_t i = 0; i < c->n; i++) {
		struct job *j = c->jobs[i];
		int irc = c->items[i].rc;

		if (irc != 0 && irc != -EALREADY && irc != -ENOENT)
			continue;
		if (unlinkat(r->staging_fd, j->file, 0) < 0 && errno != ENOENT)
			c->unlink_err[i] = errno;
		if (!j->rec_xattr && unlinkat(r->staging_fd, j->jobfile, 0) < 0 && errno != ENOENT &&
		    !c->unlink_err[i])
			c->unlink_err[i] = errno;
	}
}

static void commit_one_done(struct rec *r, struct job *j, int rc, int uerr)
{
	if (uerr)
		log_errno(uerr, "job %s: committed, but its files stay in %s", j->file,
			  r->cfg.staging_dir);
	if (rc == 0) {
		log_debug("job %s: committed (inode %" PRIu64 ", seq %" PRIu64 ")", j->file,
			  j->rj.ino, j->rj.seq);
		job_finish(r, j, 0, NULL, FIN_COMMITTED);
	} else if (rc == -EALREADY) {
		log_info("job %s (inode %" PRIu64 ", seq %" PRIu64 "): already committed (a replay, "
			 "or a newer job of the inode came first)", j->file, j->rj.ino, j->rj.seq);
		/* Not an error for the data's safety, but the sender should know
		 * (its seqs may have gone backwards). */
		job_finish(r, j, -EALREADY, "a job of this inode with this or a higher seq was "
			   "committed already; nothing changed", FIN_COMMITTED);
	} else if (rc == -ENOENT) {
		log_warnx("job %s: inode %" PRIu64 " no longer exists; its data is dropped", j->file,
			  j->rj.ino);
		job_finish(r, j, -ENOENT, "the inode no longer exists", FIN_DROPPED);
	} else {
		set_err(j, rc, "metadata commit failed: %s", strerror(-rc));
		job_attempt_failed(r, j);
	}
}

static void commit_done(struct task *t)
{
	struct commit_task *c = (struct commit_task *)t;
	struct rec *r = c->r;

	if (!t->cancelled && c->store_sync_err) {
		/* Which uploads the failed flush lost is not known (the page
		 * cache may no longer say), so none is trusted: a new start
		 * uploads every journaled job again (ferry-mountd starts one
		 * and hands its jobs over again). Nothing was committed. */
		log_warnx("error: exiting so that a new ferry-reconciler uploads the %zu jobs "
			  "in hand again; they stay journaled", r->njobs);
		r->exit_code = 1;
		event_base_loopexit(r->base, NULL);
		free(c);
		return;
	}
	if (!t->cancelled) {
		bool nomem = false;

		for (size_t i = 0; i < c->n; i++)
			nomem |= c->items[i].rc == -ENOMEM;
		if (nomem)
			r->commit_batch = r->commit_batch > 1 ? r->commit_batch / 2 : 1;
		else if (r->commit_batch < COMMIT_BATCH_MAX)
			r->commit_batch *= 2;
		/* Jobs these make ready join r->commitq for the next batch. */
		for (size_t i = 0; i < c->n; i++)
			commit_one_done(r, c->jobs[i], c->items[i].rc, c->unlink_err[i]);
		r->committing = false;
		commit_kick(r);
	}
	free(c);
}

static void commit_window_cb(evutil_socket_t fd, short what, void *arg)
{
	struct rec *r = arg;

	(void)fd;
	(void)what;
	r->commit_window_armed = false;
	r->commit_window_over = true;
	commit_kick(r);
}

/* Whether the jobs on r->commitq go now; if not, the window's end is set. */
static bool commit_due(struct rec *r)
{
	struct timeval tv;

	if (r->commit_window_over || r->cfg.commit_window_ms == 0 || r->stopping ||
	    !TAILQ_EMPTY(&r->drains) || r->ncommitq >= COMMIT_BATCH_MAX)
		return true;
	if (r->commit_window_armed)
		return false;
	if (!r->commit_timer && !(r->commit_timer = evtimer_new(r->base, commit_window_cb, r)))
		return true; /* no memory for a timer: no window */
	tv.tv_sec = r->cfg.commit_window_ms / 1000;
	tv.tv_usec = (suseconds_t)(r->cfg.commit_window_ms % 1000) * 1000;
	if (evtimer_add(r->commit_timer, &tv) < 0)
		return true;
	r->commit_window_armed = true;
	return false;
}

static void commit_kick(struct rec *r)
{
	struct commit_task *c;
	struct job *j;

	if (r->committing || TAILQ_EMPTY(&r->commitq) || !commit_due(r))
		return;
	if (r->commit_window_armed) {
		evtimer_del(r->commit_timer);
		r->commit_window_armed = false;
	}
	c = calloc(1, sizeof(*c));
	if (!c) {
		while ((j = TAILQ_FIRST(&r->commitq))) {
			TAILQ_REMOVE(&r->commitq, j, commit_link);
			r->ncommitq--;
			set_err(j, -ENOMEM, "out of memory");
			job_attempt_failed(r, j);
		}
		return;
	}
	if (r->commit_batch == 0 || r->commit_batch > COMMIT_BATCH_MAX)
		r->commit_batch = COMMIT_BATCH_MAX;
	while (c->n < r->commit_batch && (j = TAILQ_FIRST(&r->commitq))) {
		TAILQ_REMOVE(&r->commitq, j, commit_link);
		r->ncommitq--;
		c->jobs[c->n++] = j;
	}
	/* Jobs left behind (the batch was full) go with the next one. */
	r->commit_window_over = r->ncommitq > 0;
	c->t.run = commit_run;
	c->t.done = commit_done;
	c->r = r;
	r->committing = true;
	work_submit(r, &c->t);
}

static void job_maybe_commit(struct rec *r, struct job *j)
{
	if (j->state != JOB_READY || TAILQ_FIRST(&j->iq->jobs) != j)
		return;
	j->state = JOB_COMMITTING;
	TAILQ_INSERT_TAIL(&r->commitq, j, commit_link);
	r->ncommitq++;
	commit_kick(r);
}

/* ---- the journal scan ---- */

static int cmp_seq(const void *a, const void *b)
{
	const struct reconcile_job *x = a, *y = b;

	if (x->seq != y->seq)
		return x->seq < y->seq ? -1 : 1;
	return strcmp(x->name, y->name);
}

struct found {
	struct reconcile_job rj;
	bool orphan, rec_xattr;
};

static int cmp_found(const void *a, const void *b)
{
	return cmp_seq(&((const struct found *)a)->rj, &((const struct found *)b)->rj);
}

static bool ends_with(const char *s, const char *suffix)
{
	size_t n = strlen(s), k = strlen(suffix);
	return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* The staging directory's flushed runs (boot.h), read at the first call
 * of a scan; NULL if they cannot be read. */
static const struct boot_set *flushed_boots(struct rec *r, struct boot_set *s, int *read)
{
	static bool told;

	if (!*read) {
		int rc = boot_set_load(r->staging_fd, s);

		if (rc < 0 && !told) {
			log_errno(rc, "cannot read %s/%s: jobs of copies of another boot are left "
				  "for a scan that can", r->cfg.staging_dir, BOOT_FLUSHED_NAME);
			told = true;
		}
		*read = rc < 0 ? 2 : 1;
	}
	return *read == 2 ? NULL : s;
}

size_t jobs_scan(struct rec *r, bool at_start, time_t min_age)
{
	struct boot_set flushed;
	int flushed_read = 0; /* 1 read, 2 unreadable */
	struct found *f = NULL;
	size_t n = 0, cap = 0, added = 0, orphans = 0;
	struct dirent *de;
	time_t now = time(NULL);
	int dfd = dup(r->staging_fd);
	DIR *d = dfd >= 0 ? fdopendir(dfd) : NULL;
	char err[256];

	if (!d) {
		if (dfd >= 0)
			close(dfd);
		log_warn("cannot list the staging directory %s", r->cfg.staging_dir);
		/* The next rescan does it all again (a start's scan included). */
		if (at_start)
			r->scan_again_at_start = true;
		return 0;
	}
	rewinddir(d);
	while ((de = readdir(d))) {
		struct reconcile_job rj;
		bool orphan, rec_xattr = false, plain;
		char file[RECONCILE_NAME_MAX + 16];
		struct stat st;
		time_t stamp;
		int e;

		if (de->d_name[0] == '.')
			continue;
		/* A staging file whose record is its xattr, or a record file. */
		plain = reconcile_name_check(de->d_name) == 0 && !ends_with(de->d_name, ".sock");
		if (!plain && !ends_with(de->d_name, RECONCILE_JOB_SUFFIX))
			continue;
		orphan = !plain && ends_with(de->d_name, RECONCILE_ORPHAN_SUFFIX RECONCILE_JOB_SUFFIX);
		if (orphan && !at_start)
			continue;
		/* Known already? (the name is in the record's file name) */
		if (plain)
			snprintf(file, sizeof(file), "%.*s", RECONCILE_NAME_MAX, de->d_name);
		else
			snprintf(file, sizeof(file), "%.*s",
				 (int)(strlen(de->d_name) - strlen(RECONCILE_JOB_SUFFIX) -
				       (orphan ? strlen(RECONCILE_ORPHAN_SUFFIX) : 0)),
				 de->d_name);
		if (jobs_find_name(r, file))
			continue;
		if (fstatat(r->staging_fd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0 ||
		    !S_ISREG(st.st_mode))
			continue;
		/* A record stamped ahead of our clock is not young: the wall
		 * clock stepped back since (by up to a day, or more), and
		 * waiting for it to catch up would leave the job unfinished.
		 * An xattr's stamp is its file's ctime. */
		stamp = plain && st.st_ctime > st.st_mtime ? st.st_ctime : st.st_mtime;
		if (min_age && stamp <= now && now - stamp < min_age)
			continue;
		if (orphan) {
			e = reconcile_job_read(r->staging_fd, de->d_name, &rj, err, sizeof(err));
		} else {
			/* The xattr, if the staging file has one, is the newer
			 * record (made at the handoff, after any .job). */
			e = reconcile_job_load(r->staging_fd, -1, file, &rj, &rec_xattr, err,
					       sizeof(err));
			if (e == 0 && plain != rec_xattr) {
				/* Each record is taken up once: an xattr from its
				 * staging file's entry, a .job from its own. */
				reconcile_job_clear(&rj);
				continue;
			}
			if (e == -ENOENT && plain)
				continue; /* a staging file still written, or not recorded */
			if (e == -ENOENT && !plain) {
				/* The .job went meanwhile (committed): as before. */
				e = reconcile_job_read(r->staging_fd, de->d_name, &rj, err,
						       sizeof(err));
			}
		}
		if (e == -ENOMEM) {
			/* Not the record's fault: it is read again at the next
			 * rescan (orphans too, if this was the start's scan). */
			if (at_start)
				r->scan_again_at_start = true;
			continue;
		}
		if (e < 0) {
			if (at_start)
				log_warnx("error: journal record %s/%s cannot be used (%s); it is left "
					  "in place", r->cfg.staging_dir, de->d_name, err);
			continue;
		}
		char run[BOOT_RUN_LEN + 1];
		const char *tag = staging_copy_run(rj.name, run);
		enum boot_name copy = tag ? boot_name_state(tag, run, r->boot_tag,
							    flushed_boots(r, &flushed, &flushed_read)) :
					    BOOT_NAME_UNTAGGED;
		if (copy == BOOT_NAME_TORN) {
			snprintf(file, sizeof(file), "%s%s", rj.name,
				 orphan ? RECONCILE_ORPHAN_SUFFIX : "");
			job_set_aside_copy(r, file);
			reconcile_job_clear(&rj);
			continue;
		}
		if (copy == BOOT_NAME_UNKNOWN) {
			reconcile_job_clear(&rj); /* left as it is (see main.c) */
			continue;
		}
		if (jobs_find_name(r, rj.name) || jobs_recent(r, rj.name, rj.seq, &e)) {
			reconcile_job_clear(&rj);
			continue;
		}
		snprintf(file, sizeof(file), "%s%s", rj.name, orphan ? RECONCILE_ORPHAN_SUFFIX : "");
		if (fstatat(r->staging_fd, file, &st, AT_SYMLINK_NOFOLLOW) < 0 && orphan &&
		    renameat(r->staging_fd, rj.name, r->staging_fd, file) == 0) {
			/* A crash between the two renames of job_orphan(). */
			log_info("completed the orphaning of %s", file);
		}
		if (fstatat(r->staging_fd, file, &st, AT_SYMLINK_NOFOLLOW) < 0) {
			log_info("journal record %s: its staging file is gone (the job finished "
				 "before a restart); removing the record", de->d_name);
			unlinkat(r->staging_fd, de->d_name, 0);
			reconcile_job_clear(&rj);
			continue;
		}
		if (n == cap) {
			size_t nc = cap ? cap * 2 : 64;
			struct found *nf = realloc(f, nc * sizeof(*nf));
			if (!nf) {
				reconcile_job_clear(&rj);
				log_warnx("out of memory listing the journal (the next rescan goes on)");
				if (at_start)
					r->scan_again_at_start = true;
				break;
			}
			f = nf;
			cap = nc;
		}
		f[n].rj = rj;
		f[n].orphan = orphan;
		f[n].rec_xattr = rec_xattr;
		n++;
	}
	closedir(d);
	if (n)
		qsort(f, n, sizeof(*f), cmp_found);
	for (size_t i = 0; i < n; i++) {
		char file[RECONCILE_NAME_MAX + 16];
		bool orphan = f[i].orphan;

		snprintf(file, sizeof(file), "%s%s", f[i].rj.name, orphan ? RECONCILE_ORPHAN_SUFFIX : "");
		if (jobs_add(r, &f[i].rj, -1, file, orphan, f[i].rec_xattr, NULL) == 0) {
			added++;
			orphans += orphan;
		} else {
			/* Out of memory: its record is found again by the next
			 * rescan. */
			if (at_start && orphan)
				r->scan_again_at_start = true;
			reconcile_job_clear(&f[i].rj);
		}
	}
	free(f);
	if (added)
		log_info("journal: %zu job%s to finish from %s%s", added, added == 1 ? "" : "s",
			 r->cfg.staging_dir, orphans ? " (some kept as .orphan before)" : "");
	return added;
}

/* ---- exit ---- */

void jobs_log_left(struct rec *r)
{
	struct job *j;

	TAILQ_FOREACH(j, &r->all, all_link)
		log_warnx("unfinished: job %s (inode %" PRIu64 ", seq %" PRIu64 ", %s, %" PRIu64
			  " of %" PRIu64 " objects stored) stays journaled in %s",
			  j->file, j->rj.ino, j->rj.seq, state_name(j->state), j->ndone,
			  j->plan.nobjects, r->cfg.staging_dir);
}

void jobs_free_all(struct rec *r)
{
	struct job *j;
	struct drain_wait *d;

	while ((j = TAILQ_FIRST(&r->all))) {
		TAILQ_REMOVE(&r->all, j, all_link);
		TAILQ_REMOVE(&j->iq->jobs, j, iq_link);
		if (TAILQ_EMPTY(&j->iq->jobs))
			iq_drop(r, j->iq);
		job_free(j);
	}
	TAILQ_INIT(&r->ready);
	r->nready = 0;
	r->ready_bytes = 0;
	TAILQ_INIT(&r->feed);
	TAILQ_INIT(&r->commitq);
	r->ncommitq = 0;
	if (r->defer_timer) {
		event_free(r->defer_timer);
		r->defer_timer = NULL;
		r->defer_armed = false;
	}
	if (r->commit_timer) {
		event_free(r->commit_timer);
		r->commit_timer = NULL;
		r->commit_window_armed = false;
	}
	while ((d = TAILQ_FIRST(&r->drains))) {
		TAILQ_REMOVE(&r->drains, d, link);
		conn_unref(d->conn);
		free(d);
	}
	free(r->orphan_seqs);
	r->orphan_seqs = NULL;
	r->norphan_seqs = 0;
	r->njobs = r->nactive = 0;
}
