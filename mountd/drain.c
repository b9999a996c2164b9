/*
 * drain: commits everything written up to a mark, for `ferry drain` and
 * the .control file (control.c), while new writes go on.
 *
 * The mark is the reconcile seq at the instant the drain starts: every
 * staging file handed over before it has a seq at or below it, every one
 * after above it, so a drain waits for a fixed set of jobs and never for a
 * writer that keeps closing files. Three kinds of data are older than the
 * mark and not yet in the object store:
 *
 *  - jobs at the reconciler with a seq <= mark: asked to commit without
 *    waiting for company (a drain request), and waited for;
 *  - files open for write with staged data: committed here as fsync would
 *    (wstate_commit), once, in this thread. A passthrough writer keeps
 *    writing meanwhile (its writes never reach the daemon); one on the
 *    daemon path waits while its file's commit holds the inode. A file
 *    closed between the mark and its turn has handed its data over in a
 *    job after the mark: that job is waited for instead;
 *  - files on the write-back retry list (a commit at close failed): the
 *    retry thread commits them; waited for.
 *
 * Then the metadata journal's batch is forced to the engine (meta_sync),
 * so the namespace changes before the mark are durable too. A commit that
 * fails is tried again every DRAIN_RETRY_MS until the deadline: with the
 * store down a drain times out, naming the files and the last error, and
 * loses nothing (the data stays staged and journaled).
 *
 * Ownership: a struct drain is owned by whoever started it (a .control
 * handle); drain_free() cancels and joins its thread. The thread holds a
 * reference on each inode it waits for and drops them before it ends.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "mountd.h"

#define DRAIN_RETRY_MS 1000
#define DRAIN_SLICE_MS 100
/* Counted like the reconciler's passthrough_staging_blocks gauge. */
#define DRAIN_BLOCK (4ull << 20)

enum target_kind {
	T_OPEN,      /* open for write with staged data: commit it here */
	T_JOB,       /* handed over after the mark with our bytes: wait for job seq */
	T_DONE,
};

struct target {
	struct inode *ino;       /* one reference, dropped when the drain ends */
	enum target_kind kind;
	uint64_t seq;            /* T_JOB */
	uint64_t size;           /* the file's size when last looked at */
	int error;               /* the last failed commit, negative errno */
	int64_t next_try_ns;     /* T_OPEN on the retry list or after a failure */
};

struct drain {
	struct mountd *md;
	pthread_t thread;
	pthread_mutex_t lock;    /* guards the fields below */
	pthread_cond_t cond;     /* state left DRAIN_RUNNING */
	bool cancel;
	struct drain_progress p;
	char *report;            /* owned: one line per failed or unfinished file */
	int64_t deadline_ns;     /* 0: none */
	int64_t started_ns;
	char *checkpoint;        /* owned: the checkpoint to take once drained, or NULL */
};

static int64_t now_ns(void)
{
	return mono_now_ns();
}

/* Appends a line to d->report (under d->lock). Memory short: dropped. */
static void report_add(struct drain *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void report_add(struct drain *d, const char *fmt, ...)
{
	char line[512];
	size_t have = d->report ? strlen(d->report) : 0;
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	if (n < 0 || have > (64u << 10))
		return;
	char *nr = realloc(d->report, have + strlen(line) + 2);
	if (!nr)
		return;
	d->report = nr;
	memcpy(nr + have, line, strlen(line));
	nr[have + strlen(line)] = '\n';
	nr[have + strlen(line) + 1] = '\0';
}

/* The inodes with data staged before the mark, open or on the retry list. */
static int targets_collect(struct mountd *md, struct target **out, size_t *nout)
{
	struct inode **held = NULL; /* references: each kept in a target or dropped */
	struct target *t = NULL;
	size_t n = 0, nt = 0;
	int rc;

	rc = inode_table_held_open(md, &held, &n);
	if (rc < 0)
		return rc;
	t = calloc(n ? n : 1, sizeof(*t));
	if (!t) {
		for (size_t k = 0; k < n; k++)
			inode_unref(md, held[k], 0, 1);
		free(held);
		return -ENOMEM;
	}
	for (size_t k = 0; k < n; k++) {
		struct inode *i = held[k];
		bool staged;

		struct timespec mt;
		pthread_mutex_lock(&i->lock);
		staged = i->w != NULL;
		if (staged && wstate_stat(i->w, &t[nt].size, &mt) < 0)
			t[nt].size = 0;
		pthread_mutex_unlock(&i->lock);
		if (!staged) {
			inode_unref(md, i, 0, 1);
			continue;
		}
		t[nt].ino = i;
		t[nt].kind = T_OPEN;
		nt++;
	}
	free(held);
	*out = t;
	*nout = nt;
	return 0;
}

/*
 * One look at target t: commits it if it is due, or sees whether what it
 * waits for is done. Returns true when t needs nothing more.
 */
static bool target_step(struct drain *d, struct target *t)
{
	struct mountd *md = d->md;
	struct inode *i = t->ino;
	bool done = false;

	pthread_mutex_lock(&i->lock);
	if (t->kind == T_OPEN && !i->w) {
		/* Closed since the mark: its data went out in a job (or was
		 * committed at close, or from the retry list); a job after the
		 * mark holds it. What a try of it met before is over (a
		 * failed commit leaves the staging file, i->w). */
		t->error = 0;
		if (i->inflight_seq > d->p.mark) {
			t->kind = T_JOB;
			t->seq = i->inflight_seq;
		} else {
			done = true;
		}
	}
	if (t->kind == T_OPEN && !done) {
		uint64_t size = 0;
		struct timespec mt;

		if (wstate_stat(i->w, &size, &mt) == 0)
			t->size = size;
		if (i->pending) {
			/* The retry thread owns its commits: wait for it. */
			t->error = i->w->last_error;
		} else if (now_ns() >= t->next_try_ns) {
			int rc = wstate_commit(md, i);
			if (rc == 0) {
				done = true;
				t->error = 0;
			} else {
				t->error = rc;
				t->next_try_ns = now_ns() + (int64_t)DRAIN_RETRY_MS * 1000000;
			}
		}
	} else if (t->kind == T_JOB) {
		t->size = i->inflight_size;
		if (i->inflight_seq != t->seq) {
			done = true;
			t->error = i->inflight_error;
		}
	}
	pthread_mutex_unlock(&i->lock);
	if (done)
		t->kind = T_DONE;
	return done;
}

/* Jobs at or below the mark still at the reconciler: count and bytes. */
static void jobs_left(struct mountd *md, uint64_t mark, uint64_t *files, uint64_t *bytes,
		      uint64_t *blocks)
{
	pthread_mutex_lock(&md->rc_lock);
	for (struct inode *i = md->inflight; i; i = i->inext) {
		if (i->iseq > mark)
			continue;
		(*files)++;
		*bytes += i->isize;
		*blocks += (i->isize + DRAIN_BLOCK - 1) / DRAIN_BLOCK;
	}
	pthread_mutex_unlock(&md->rc_lock);
}

/* Jobs the reconciler gave up on since the drain began, at or below the
 * mark: failures of this drain. from: md->rc_nfailures at the start. */
static uint64_t failures_collect(struct drain *d, uint64_t *from)
{
	struct mountd *md = d->md;
	uint64_t n = 0;

	pthread_mutex_lock(&md->rc_lock);
	if (md->rc_nfailures - *from > RC_FAILURES_KEPT)
		*from = md->rc_nfailures - RC_FAILURES_KEPT;
	for (; *from < md->rc_nfailures; (*from)++) {
		const struct rc_failure *f = &md->rc_failures[*from % RC_FAILURES_KEPT];
		if (f->seq > d->p.mark)
			continue;
		pthread_mutex_lock(&d->lock);
		report_add(d, "failed inode %llu: the upload failed for good (%s)%s%s; kept in the "
			   "staging directory as .orphan",
			   (unsigned long long)f->ino, strerror(-f->error), f->message[0] ? ": " : "",
			   f->message);
		pthread_mutex_unlock(&d->lock);
		n++;
	}
	pthread_mutex_unlock(&md->rc_lock);
	return n;
}

/* Asks the reconciler to commit up to mark without waiting for company,
 * once per connection; true when it has. */
static bool reconciler_drained(struct mountd *md, uint64_t mark, uint64_t *asked_gen)
{
	bool done;

	pthread_mutex_lock(&md->rc_lock);
	done = md->rc_drained >= mark;
	if (!done && md->rc_conn_gen != *asked_gen && rclient_up(md) &&
	    reconcile_drain(md->rc_sock, mark) == 0)
		*asked_gen = md->rc_conn_gen;
	pthread_mutex_unlock(&md->rc_lock);
	return done;
}

/* One drain to a mark taken now: its end state. */
static enum drain_state drain_once(struct drain *d)
{
	struct mountd *md = d->md;
	struct target *t = NULL; /* owned, with a reference per inode */
	size_t nt = 0;
	uint64_t fail_from, asked_gen = UINT64_MAX, nfailed = 0;
	bool meta_done = false, rc_present;
	int meta_err = 0, rc;
	enum drain_state end = DRAIN_DONE;

	pthread_mutex_lock(&md->rc_lock);
	d->p.mark = md->rc_next_seq;
	fail_from = md->rc_nfailures;
	pthread_mutex_unlock(&md->rc_lock);
	rc_present = md->rc_sock >= 0 || rclient_up(md);
	rc = targets_collect(md, &t, &nt);
	if (rc < 0) {
		pthread_mutex_lock(&d->lock);
		report_add(d, "failed: cannot list the open files (%s)", strerror(-rc));
		pthread_mutex_unlock(&d->lock);
		end = DRAIN_FAILED;
		goto out;
	}
	{
		uint64_t files = nt, bytes = 0, blocks = 0;
		for (size_t k = 0; k < nt; k++)
			bytes += t[k].size;
		jobs_left(md, d->p.mark, &files, &bytes, &blocks);
		pthread_mutex_lock(&d->lock);
		d->p.files_at_mark = files;
		d->p.bytes_at_mark = bytes;
		pthread_mutex_unlock(&d->lock);
	}
	for (;;) {
		uint64_t files = 0, bytes = 0, blocks = 0, open_left = 0;
		bool all_targets = true, jobs_done;

		for (size_t k = 0; k < nt; k++) {
			if (t[k].kind == T_DONE)
				continue;
			if (target_step(d, &t[k])) {
				if (t[k].error < 0) {
					nfailed++;
					pthread_mutex_lock(&d->lock);
					report_add(d, "failed inode %llu: its upload (job %llu, after the "
						   "close that followed the mark) failed for good (%s)",
						   (unsigned long long)t[k].ino->ino,
						   (unsigned long long)t[k].seq, strerror(-t[k].error));
					pthread_mutex_unlock(&d->lock);
				}
				continue;
			}
			all_targets = false;
			files++;
			open_left += t[k].kind == T_OPEN;
			bytes += t[k].size;
			blocks += (t[k].size + DRAIN_BLOCK - 1) / DRAIN_BLOCK;
		}
		jobs_left(md, d->p.mark, &files, &bytes, &blocks);
		jobs_done = !rc_present || reconciler_drained(md, d->p.mark, &asked_gen);
		if (all_targets && !meta_done) {
			/* The namespace as of the mark, and the commits above. */
			meta_err = meta_sync(md->meta);
			meta_done = meta_err == 0;
		}
		nfailed += failures_collect(d, &fail_from);

		pthread_mutex_lock(&d->lock);
		d->p.files_left = files;
		d->p.bytes_left = bytes;
		d->p.blocks_left = blocks;
		d->p.open_left = open_left;
		d->p.failed = nfailed;
		d->p.elapsed_ms = (uint64_t)(now_ns() - d->started_ns) / 1000000;
		bool cancel = d->cancel;
		pthread_mutex_unlock(&d->lock);

		if (all_targets && jobs_done && meta_done && files == 0) {
			end = nfailed ? DRAIN_FAILED : DRAIN_DONE;
			break;
		}
		if (cancel) {
			end = DRAIN_CANCELLED;
			break;
		}
		if (rc_present && !rclient_up(md) && !atomic_load(&md->rc_restarting) && !jobs_done) {
			pthread_mutex_lock(&d->lock);
			report_add(d, "failed: ferry-reconciler is not running; %llu jobs stay journaled "
				   "in the staging directory for the next start",
				   (unsigned long long)files);
			pthread_mutex_unlock(&d->lock);
			end = DRAIN_FAILED;
			break;
		}
		if (d->deadline_ns && now_ns() >= d->deadline_ns) {
			end = DRAIN_TIMED_OUT;
			pthread_mutex_lock(&d->lock);
			for (size_t k = 0; k < nt; k++) {
				if (t[k].kind == T_OPEN)
					report_add(d, "left inode %llu: open for write, %s", (unsigned long long)t[k].ino->ino,
						   t[k].error ? strerror(-t[k].error) : "commit not finished");
				else if (t[k].kind == T_JOB)
					report_add(d, "left inode %llu: closed during the drain, its upload "
						   "(job %llu) not committed yet",
						   (unsigned long long)t[k].ino->ino, (unsigned long long)t[k].seq);
			}
			pthread_mutex_lock(&md->rc_lock);
			for (struct inode *i = md->inflight; i; i = i->inext)
				if (i->iseq <= d->p.mark)
					report_add(d, "left inode %llu: upload (job %llu, staging file %s) "
						   "not committed yet; see ferry-reconciler's log",
						   (unsigned long long)i->ino, (unsigned long long)i->iseq,
						   i->inflight_name);
			pthread_mutex_unlock(&md->rc_lock);
			if (!meta_done && all_targets)
				report_add(d, "left: the metadata commit failed (%s)", strerror(-meta_err));
			pthread_mutex_unlock(&d->lock);
			break;
		}
		/* Job commits wake rc_cond; open files are tried again on time. */
		struct timespec slice;
		mono_deadline_ms(&slice, DRAIN_SLICE_MS);
		pthread_mutex_lock(&md->rc_lock);
		pthread_cond_timedwait(&md->rc_cond, &md->rc_lock, &slice);
		pthread_mutex_unlock(&md->rc_lock);
	}
out:
	for (size_t k = 0; k < nt; k++)
		inode_unref(md, t[k].ino, 0, 1);
	free(t);
	return end;
}

/* A checkpoint wants one instant at which every file closed before it has
 * its data committed: the first drain does the bulk with writers going on;
 * then the namespace is fenced (md->ns_fence: creates, renames, unlinks,
 * attribute changes and closes of writers wait), a second drain commits
 * what came meanwhile, and the snapshot is begun under the fence, which
 * checkpoint_take lifts as soon as it is. */
static enum drain_state checkpoint_phase(struct drain *d)
{
	struct mountd *md = d->md;
	struct drain_progress cp = { 0 };
	struct timespec until;
	char err[512] = "";
	enum drain_state end;
	int64_t t0;
	int rc;

	clock_gettime(CLOCK_REALTIME, &until);
	if (d->deadline_ns) {
		int64_t left = d->deadline_ns - now_ns();
		if (left < 0)
			left = 0;
		until.tv_sec += left / 1000000000;
		until.tv_nsec += left % 1000000000;
	} else {
		until.tv_sec += 3600;
	}
	if (until.tv_nsec >= 1000000000) {
		until.tv_sec++;
		until.tv_nsec -= 1000000000;
	}
	rc = -pthread_rwlock_timedwrlock(&md->ns_fence, &until);
	if (rc < 0) {
		pthread_mutex_lock(&d->lock);
		report_add(d, "left checkpoint %s: the namespace could not be fenced in time (%s)",
			   d->checkpoint, strerror(-rc));
		pthread_mutex_unlock(&d->lock);
		return DRAIN_TIMED_OUT;
	}
	t0 = now_ns();
	atomic_store(&md->ns_fenced, true);
	end = drain_once(d);
	if (end != DRAIN_DONE) {
		atomic_store(&md->ns_fenced, false);
		pthread_rwlock_unlock(&md->ns_fence);
		return end;
	}
	rc = checkpoint_take(md, d->checkpoint, &cp, err, sizeof(err));
	if (atomic_load(&md->ns_fenced)) {
		/* Failed before the snapshot began. */
		atomic_store(&md->ns_fenced, false);
		pthread_rwlock_unlock(&md->ns_fence);
	}
	pthread_mutex_lock(&d->lock);
	d->p.checkpoint_taken = rc == 0;
	d->p.pause_ms = (double)(md->ns_fence_lifted_ns - t0) / 1e6;
	if (rc < 0 || d->p.pause_ms < 0)
		d->p.pause_ms = (double)(now_ns() - t0) / 1e6;
	d->p.slice_pause_ms = cp.slice_pause_ms;
	d->p.ckpt_records = cp.ckpt_records;
	d->p.ckpt_dump_bytes = cp.ckpt_dump_bytes;
	d->p.ckpt_slices = cp.ckpt_slices;
	d->p.ckpt_slice_bytes = cp.ckpt_slice_bytes;
	if (rc < 0)
		report_add(d, "failed checkpoint %s: %s", d->checkpoint, err);
	pthread_mutex_unlock(&d->lock);
	return rc < 0 ? DRAIN_FAILED : DRAIN_DONE;
}

static void *drain_main(void *arg)
{
	struct drain *d = arg;
	struct mountd *md = d->md;
	enum drain_state end = drain_once(d);

	if (end == DRAIN_DONE && d->checkpoint)
		end = checkpoint_phase(d);
	pthread_mutex_lock(&d->lock);
	d->p.state = end;
	d->p.elapsed_ms = (uint64_t)(now_ns() - d->started_ns) / 1000000;
	pthread_cond_broadcast(&d->cond);
	pthread_mutex_unlock(&d->lock);
	atomic_fetch_sub(&md->drains_running, 1);
	log_info("drain to mark %llu %s after %llu ms (%llu files, %llu bytes at the mark; %llu "
		 "failed)",
		 (unsigned long long)d->p.mark, drain_state_name(end),
		 (unsigned long long)d->p.elapsed_ms, (unsigned long long)d->p.files_at_mark,
		 (unsigned long long)d->p.bytes_at_mark, (unsigned long long)d->p.failed);
	return NULL;
}

const char *drain_state_name(enum drain_state s)
{
	static const char *const n[] = { "running", "done", "timed_out", "failed", "cancelled" };
	return (unsigned)s < sizeof(n) / sizeof(n[0]) ? n[s] : "unknown";
}

int drain_start(struct mountd *md, int64_t timeout_ms, const char *checkpoint,
		struct drain **out)
{
	struct drain *d = calloc(1, sizeof(*d));
	int rc;

	if (!d)
		return -ENOMEM;
	if (checkpoint && !(d->checkpoint = strdup(checkpoint))) {
		free(d);
		return -ENOMEM;
	}
	d->p.checkpoint = checkpoint != NULL;
	d->md = md;
	pthread_mutex_init(&d->lock, NULL);
	rc = mono_cond_init(&d->cond);
	if (rc < 0) {
		pthread_mutex_destroy(&d->lock);
		free(d->checkpoint);
		free(d);
		return rc;
	}
	d->started_ns = now_ns();
	d->deadline_ns = timeout_ms > 0 ? d->started_ns + timeout_ms * 1000000 : 0;
	d->p.state = DRAIN_RUNNING;
	atomic_fetch_add(&md->drains_running, 1);
	rc = -pthread_create(&d->thread, NULL, drain_main, d);
	if (rc < 0) {
		atomic_fetch_sub(&md->drains_running, 1);
		pthread_cond_destroy(&d->cond);
		pthread_mutex_destroy(&d->lock);
		free(d->checkpoint);
		free(d);
		return rc;
	}
	*out = d;
	return 0;
}

char *drain_progress(struct drain *d, struct drain_progress *p)
{
	char *report;

	pthread_mutex_lock(&d->lock);
	*p = d->p;
	if (p->state == DRAIN_RUNNING)
		p->elapsed_ms = (uint64_t)(now_ns() - d->started_ns) / 1000000;
	report = strdup(d->report ? d->report : "");
	pthread_mutex_unlock(&d->lock);
	return report;
}

enum drain_state drain_wait(struct drain *d, int ms)
{
	struct timespec until;
	enum drain_state s;

	mono_deadline_ms(&until, ms);
	pthread_mutex_lock(&d->lock);
	while (d->p.state == DRAIN_RUNNING &&
	       pthread_cond_timedwait(&d->cond, &d->lock, &until) != ETIMEDOUT)
		;
	s = d->p.state;
	pthread_mutex_unlock(&d->lock);
	return s;
}

void drain_free(struct drain *d)
{
	if (!d)
		return;
	pthread_mutex_lock(&d->lock);
	d->cancel = true;
	pthread_mutex_unlock(&d->lock);
	pthread_join(d->thread, NULL);
	pthread_cond_destroy(&d->cond);
	pthread_mutex_destroy(&d->lock);
	free(d->report);
	free(d->checkpoint);
	free(d);
}
