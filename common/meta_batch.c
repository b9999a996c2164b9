/*
 * meta_batch: the metadata engine's connections, transactions and deferred
 * commits, over any driver (meta_db.h): txn_now() runs a change in a
 * transaction of its own; a deferring daemon's changes go into one open
 * transaction, the batch, journaled to a local file and committed every
 * flush_ms (see meta_journal_open in meta.h); meta_open/meta_close/
 * meta_sync for every engine.
 *
 * Ownership: see meta_engine.h. The journal buffer of a replay is its own.
 */
#include "clock.h"
#include "log.h"
#include "meta_engine.h"
#include "meta_names.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

_Thread_local const struct timespec *meta_tl_now;
_Thread_local int meta_tl_replaying;
_Thread_local uint64_t meta_tl_statements;
_Thread_local uint64_t meta_tl_seq;

/* ---- connections ---------------------------------------------------------- */

static void conn_free(struct conn *c)
{
	if (c != NULL)
		c->drv->conn_free(c);
}

void meta_conn_unlink(struct meta *m, struct conn *c)
{
	pthread_mutex_lock(&m->lock);
	if (c->prev)
		c->prev->next = c->next;
	else
		m->conns = c->next;
	if (c->next)
		c->next->prev = c->prev;
	pthread_mutex_unlock(&m->lock);
}

/* The key's destructor: the thread is exiting. */
void meta_conn_thread_exit(void *p)
{
	struct conn *c = p;

	meta_conn_unlink(c->m, c);
	conn_free(c);
}

void meta_conn_replaced(struct meta *m)
{
	atomic_fetch_add(&m->reconnects, 1);
	if (atomic_load(&m->batched) &&
	    atomic_load(&m->commits_made) != atomic_load(&m->commits_synced))
		atomic_store(&m->sync_lost, 1);
}

/* A new connection for m. Once m is open, a server that cannot be
 * reached or refuses us is an I/O error to the caller (an application's
 * create must not see ECONNREFUSED); meta_open() tells them apart. */
static int conn_new(struct meta *m, struct conn **out)
{
	int rc = m->drv->conn_open(m, out);

	return rc && m->opened && rc != -ENOMEM ? -EIO : rc;
}

int meta_conn_get(struct meta *m, struct conn **out)
{
	struct conn *c = pthread_getspecific(m->key);
	int rc;

	if (c != NULL && c->drv->conn_ok(c)) {
		*out = c;
		return 0;
	}
	if (c != NULL) {
		/* The server hung up: what it held is gone; a new one. */
		pthread_setspecific(m->key, NULL);
		meta_conn_unlink(m, c);
		conn_free(c);
		meta_conn_replaced(m);
	}
	rc = conn_new(m, &c);
	if (rc)
		return rc;
	pthread_mutex_lock(&m->lock);
	c->next = m->conns;
	if (m->conns)
		m->conns->prev = c;
	m->conns = c;
	pthread_mutex_unlock(&m->lock);
	if (pthread_setspecific(m->key, c) != 0) {
		meta_conn_unlink(m, c);
		conn_free(c);
		return -ENOMEM;
	}
	*out = c;
	return 0;
}

/* ---- transactions ------------------------------------------------------ */

/*
 * Ends a transaction that failed. A transaction left open would keep the
 * database's write lock from every other thread and process, for good, so
 * if even ROLLBACK fails (short of memory, say) the connection goes: closing
 * it rolls back, and this thread opens another when it next needs one.
 * Returns false if c was closed.
 */
static bool txn_abort(struct meta *m, struct conn *c)
{
	if (!c->drv->txn_open(c))
		return true;
	exec_st(c, ST_ROLLBACK);
	if (!c->drv->txn_open(c))
		return true;
	pthread_setspecific(m->key, NULL);
	meta_conn_unlink(m, c);
	conn_free(c);
	return false;
}

/*
 * The intent file holds two OFD locks, one byte each:
 *  INTENT_BYTE, the intent lock: held exclusively by a non-deferring writer
 *    around its transaction, shared for a moment by a deferring daemon
 *    opening its batch (see batch_begin);
 *  BATCH_BYTE, held exclusively by a deferring daemon while its batch is
 *    open. A writer that holds the intent lock waits on it (batch_wait)
 *    instead of polling SQLite's lock (busy_wait sleeps up to 1 ms a try):
 *    the kernel wakes it the moment the batch commits.
 * Every lock request waits for its turn unless said otherwise.
 */
#define INTENT_BYTE 0
#define BATCH_BYTE 1

static int intent_range(struct meta *m, int cmd, short type, off_t byte)
{
	struct flock fl = { .l_type = type, .l_whence = SEEK_SET, .l_start = byte, .l_len = 1 };
	int rc;

	if (m->intent_fd < 0)
		return 0;
	while ((rc = fcntl(m->intent_fd, cmd, &fl)) < 0 && errno == EINTR)
		;
	if (rc == 0 && cmd == F_OFD_GETLK)
		return fl.l_type != F_UNLCK;
	return rc;
}

static void intent_lock(struct meta *m, short type)
{
	intent_range(m, F_OFD_SETLKW, type, INTENT_BYTE);
}

/* Another writer waits for the database (holds the intent lock). Asked at
 * most once per INTENT_ASK_NS (write_lock held): asking is a system call,
 * and a burst of creates would ask once per file; the writer waits at most
 * that much longer (and never past the flusher's next round). */
#define INTENT_ASK_NS 1000000LL
static bool intent_wanted(struct meta *m)
{
	struct timespec now;
	int64_t ns;

	clock_gettime(CLOCK_MONOTONIC, &now);
	ns = (int64_t)now.tv_sec * 1000000000LL + now.tv_nsec;
	if (ns - m->intent_asked_ns < INTENT_ASK_NS)
		return false;
	m->intent_asked_ns = ns;
	return intent_range(m, F_OFD_GETLK, F_RDLCK, INTENT_BYTE) > 0;
}

/* The batch is open (F_WRLCK, which nobody else takes: a second deferring
 * daemon is refused) or closed (F_UNLCK). */
static void batch_lock(struct meta *m, short type)
{
	intent_range(m, F_OFD_SETLK, type, BATCH_BYTE);
}

/* Waits until no batch is open (the intent lock held: none opens next). */
static void batch_wait(struct meta *m)
{
	if (intent_range(m, F_OFD_SETLKW, F_RDLCK, BATCH_BYTE) == 0)
		intent_range(m, F_OFD_SETLK, F_UNLCK, BATCH_BYTE);
}

/* A fenced meta (meta_lease_fence) writes only while the lease is still
 * its epoch: checked inside the transaction just begun, so a takeover
 * (itself a write transaction, which waits for this one) cannot come
 * between the check and the commit. */
static int fence_check(struct meta *m, struct conn *c)
{
	uint64_t want = atomic_load(&m->fence);
	int64_t epoch;
	int rc;

	if (want == 0)
		return 0;
	rc = query_int(c, ST_LEASE_EPOCH, 0, NULL, 0, INT64_MAX, 0, &epoch);
	if (rc)
		return rc == -ENOENT ? -EIO : rc;
	return (uint64_t)epoch == want ? 0 : -EROFS;
}

/* Runs fn inside BEGIN IMMEDIATE ... COMMIT, retrying when busy. fn returns
 * 0 to commit or a negative errno to roll back; it must be safe to run again
 * (it may be, after -EAGAIN). */
static int txn_locked(struct meta *m, txn_fn fn, void *arg);

static int txn_now(struct meta *m, txn_fn fn, void *arg)
{
	int rc;

	pthread_mutex_lock(&m->write_lock);
	rc = txn_locked(m, fn, arg);
	pthread_mutex_unlock(&m->write_lock);
	return rc;
}

/* txn_now with write_lock held by the caller. */
static int txn_locked(struct meta *m, txn_fn fn, void *arg)
{
	struct conn *c;
	int rc, tries;

	rc = meta_conn_get(m, &c);
	if (rc)
		return rc;
	rc = c->drv->conn_write_prepare(c);
	if (rc)
		return rc;
	intent_lock(m, F_WRLCK);
	batch_wait(m);
	for (tries = 1;; tries++) {
		rc = exec_st(c, ST_BEGIN);
		if (rc == 0) {
			rc = fence_check(m, c);
			if (rc == 0)
				rc = fn(c, arg);
			if (rc == 0 && (rc = exec_st(c, ST_COMMIT)) == 0)
				atomic_fetch_add(&m->commits_made, 1);
			if (rc != 0 && !txn_abort(m, c)) {
				/* Its connection is gone: no retry on it. */
				if (rc == -EAGAIN)
					rc = -EIO;
				break;
			}
			if (rc == 0)
				break;
		}
		if (rc != -EAGAIN || tries >= TXN_TRIES)
			break;
		/* busy_wait() already waited; back off a little more. */
		nanosleep(&(struct timespec){ 0, 1000000L << (tries < 6 ? tries : 6) }, NULL);
	}
	intent_lock(m, F_UNLCK);
	return rc == -EAGAIN ? -EIO : rc;
}

/*
 * ---- deferred commits (meta_journal_open) ----
 *
 * The batch is one BEGIN IMMEDIATE transaction on m->bc, open from the
 * first change after a commit until the flusher (or a caller that needs
 * the changes committed) commits it. Each change runs in a savepoint, so a
 * refused one (EEXIST, ENOTEMPTY, ...) leaves the rest; a change that went
 * through is appended to the journal before write_lock is let go, so the
 * journal's order is the order the changes were made in. The commit also
 * records the last seq it holds (table journal), and then the journal is
 * cut back to nothing: what it held is in the database.
 *
 * SQLite lets one writer in at a time and another process's writer polls
 * for its turn (busy_wait); batches opened back to back would starve it. So
 * such writers hold the intent lock exclusively around their transaction
 * (txn_now), and a batch opens only with the lock taken shared for a moment:
 * a waiting writer goes first.
 */
#define BATCH_RECORDS_MAX 4096
#define JOURNAL_CUT_BYTES (4u << 20)
#define J_RESULT 11 /* the record's slot for the change's result (a new ino) */


static void batch_closed(struct meta *m)
{
	if (m->batch_open)
		batch_lock(m, F_UNLCK);
	m->batch_open = 0;
	atomic_store(&m->batch_dirty, 0);
	m->batch_records = 0;
	m->nhot = 0; /* written by a commit, or rolled back with the batch */
	m->ctr = (struct ctr){ 0 };
}

static int batch_restore(struct meta *m);

static void batch_lost(struct meta *m);

/* The database gave the open batch up on its own (SQLite after a read
 * failed with SQLITE_NOMEM or SQLITE_IOERR, PostgreSQL after any failed
 * statement): make it again before anything uses it. */
static void batch_check(struct meta *m)
{
	if (m->batch_open && !meta_tl_replaying && !m->bc->drv->in_txn(m->bc))
		batch_lost(m);
}

static int batch_begin(struct meta *m)
{
	int rc, tries;

	batch_check(m);
	if (m->batch_open)
		return 0;
	if (m->stuck && !meta_tl_replaying) {
		rc = batch_restore(m);
		if (rc || m->batch_open)
			return rc;
	}
	if (m->bc != NULL && !m->bc->drv->conn_ok(m->bc)) {
		conn_free(m->bc); /* the server hung up; no batch is open on it */
		m->bc = NULL;
		meta_conn_replaced(m);
	}
	if (m->bc == NULL) {
		rc = conn_new(m, &m->bc);
		if (rc)
			return rc;
	}
	rc = m->bc->drv->conn_write_prepare(m->bc);
	if (rc)
		return rc;
	intent_lock(m, F_RDLCK);
	for (tries = 1;; tries++) {
		rc = exec_st(m->bc, ST_BEGIN);
		if (rc != -EAGAIN || tries >= TXN_TRIES)
			break;
		nanosleep(&(struct timespec){ 0, 1000000L << (tries < 6 ? tries : 6) }, NULL);
	}
	if (rc == 0 && (rc = fence_check(m, m->bc)) != 0) {
		exec_st(m->bc, ST_ROLLBACK);
		if (m->bc->drv->txn_open(m->bc)) {
			conn_free(m->bc); /* closing it rolls back */
			m->bc = NULL;
		}
	}
	if (rc == 0)
		batch_lock(m, F_WRLCK);
	intent_lock(m, F_UNLCK);
	if (rc)
		return rc == -EAGAIN ? -EIO : rc;
	m->batch_open = 1;
	atomic_store(&m->batch_dirty, 1);
	clock_gettime(CLOCK_MONOTONIC, &m->batch_since);
	pthread_cond_signal(&m->flush_cond);
	return 0;
}

/* Appends r (its seq and time filled) at the journal's end; a short or
 * failed write is cut off again, so no torn record hides later ones. */
static int journal_append(struct meta *m, struct mj_rec *r)
{
	unsigned char small[1024], *buf = small;
	size_t n = mj_size(r);
	ssize_t w;
	int rc = 0;

	if (n > sizeof(small) && (buf = malloc(n)) == NULL)
		return -ENOMEM;
	if (mj_encode(r, buf, n) != n) {
		rc = -EINVAL;
		goto out;
	}
	do
		w = pwrite(m->jfd, buf, n, m->jsize);
	while (w < 0 && errno == EINTR);
	if (w == (ssize_t)n) {
		m->jsize += (off_t)n;
		goto out;
	}
	rc = w < 0 ? -errno : -ENOSPC;
	if (ftruncate(m->jfd, m->jsize) < 0 && rc == -ENOSPC)
		rc = -EIO;
out:
	if (buf != small)
		free(buf);
	return rc;
}

static int journal_replay(struct meta *m, uint64_t *count);

/*
 * Puts what the journal holds past the last commit back into a new batch
 * (write_lock held, no batch open). If that fails (the disk under the
 * database is full, say), m is stuck: each change first tries this again
 * and fails with its error while it does, so nothing acknowledged is
 * dropped by a commit that would skip it.
 */
static int batch_restore(struct meta *m)
{
	uint64_t n;
	int rc;

	m->stuck = 0;
	if (m->jseq <= m->applied)
		return 0;
	rc = journal_replay(m, &n);
	/* Its last writes answered too: a failure there is the replay's. */
	if (rc == 0 && m->bc != NULL && m->bc->drv->txn_open(m->bc))
		rc = m->bc->drv->settle(m->bc);
	if (rc) {
		if (m->bc != NULL && m->bc->drv->txn_open(m->bc))
			exec_st(m->bc, ST_ROLLBACK);
		if (m->bc != NULL && m->bc->drv->txn_open(m->bc)) {
			conn_free(m->bc);
			m->bc = NULL;
		}
		batch_closed(m);
		m->stuck = 1;
	}
	return rc;
}

/* The batch was rolled back whole (a failed commit, or SQLite gave up the
 * transaction): what the journal holds past the last commit goes back in. */
static void batch_lost(struct meta *m)
{
	if (m->bc != NULL && m->bc->drv->txn_open(m->bc)) {
		exec_st(m->bc, ST_ROLLBACK);
		if (m->bc->drv->txn_open(m->bc)) {
			/* Closing it rolls back; batch_begin() opens another. */
			conn_free(m->bc);
			m->bc = NULL;
		}
	}
	batch_closed(m);
	batch_restore(m);
}

static bool releases_pending(struct meta *m)
{
	bool any;

	pthread_mutex_lock(&m->rel_lock);
	any = m->nrel > 0;
	pthread_mutex_unlock(&m->rel_lock);
	return any;
}

/* The inodes meta_inode_release_later() queued, taken out of the queue:
 * the caller owns *v (free it). */
static size_t releases_take(struct meta *m, uint64_t **v)
{
	size_t n;

	pthread_mutex_lock(&m->rel_lock);
	*v = m->rel;
	n = m->nrel;
	m->rel = NULL;
	m->nrel = m->relcap = 0;
	pthread_mutex_unlock(&m->rel_lock);
	return n;
}

static int releases_run(struct meta *m, const uint64_t *v, size_t n)
{
	int rc = 0;

	for (size_t i = 0; i < n && rc == 0; i++)
		rc = meta_release_in_batch(m, v[i]);
	return rc;
}

/* Commits the open batch (write_lock held), with the inodes queued for
 * freeing, which open one if none is. On failure the batch is made again
 * from the journal and stays open: the flusher tries again. */
static int batch_commit(struct meta *m)
{
	bool retried = false;
	uint64_t *rel = NULL; /* owned here: freed inodes, once committed */
	size_t nrel = releases_take(m, &rel);
	int rc = 0;

again:
	batch_check(m);
	if (!m->batch_open && nrel > 0 && (rc = batch_begin(m)) != 0)
		goto releases_lost;
	if (!m->batch_open)
		return 0;
	rc = releases_run(m, rel, nrel);
	if (rc == 0)
		rc = meta_hot_flush(m);
	if (rc == 0 && m->jseq > m->applied)
		rc = run_ints(m->bc, ST_JOURNAL_PUT, 1, (const int64_t[]){ (int64_t)m->jseq });
	if (rc == 0)
		rc = exec_st(m->bc, ST_COMMIT);
	if (rc) {
		m->js.commit_failures++;
		batch_lost(m);
		/* Made again without what failed (a write answered late that
		 * the database refused), or on a new connection: once more. */
		if (!retried && !m->stuck && m->batch_open) {
			retried = true;
			goto again;
		}
		if (nrel > 0)
			goto releases_lost;
		/* A rule's errno (a doomed write's EEXIST) is not the caller's. */
		return rc == -EAGAIN || rc == -EEXIST ? -EIO : rc;
	}
	batch_closed(m);
	atomic_fetch_add(&m->commits_made, 1);
	m->applied = m->jseq;
	m->js.batches++;
	m->js.released += nrel;
	free(rel);
	/* Everything in it is in the database now: the next record goes at
	 * the start again, over the old ones. No truncate (on ext4 it can wait
	 * for the file system's journal, which other processes' syncs keep
	 * busy): a replay reads the new records and stops at the first bytes
	 * that are not a whole record, or skips old ones (their seqs are all
	 * committed). The file is cut back only when it has grown large. */
	if (m->jsize > JOURNAL_CUT_BYTES && ftruncate(m->jfd, 0) < 0)
		return 0; /* keeps appending: replay skips what is committed */
	m->jsize = 0;
	return 0;

releases_lost:
	/* Nobody was told these are freed, and each has its orphan row:
	 * a later start frees them. The batch's own changes are still
	 * journaled, and the flusher tries them again. */
	log_errno(rc, "cannot free %zu unlinked inodes now (left as orphans until the next start)",
		  nrel);
	m->js.release_failures += nrel;
	free(rel);
	return rc == -EAGAIN || rc == -EEXIST ? -EIO : rc;
}

/*
 * Runs fn in the batch (write_lock held): opens the batch if needed, a
 * savepoint around fn in a replay, and r (if any) appended to the journal
 * once fn went through (result: a value fn made that the record must
 * carry). Without r the change is one that replay cannot make again, so
 * the batch commits before this returns.
 *
 * A live change is acknowledged with its writes maybe unanswered (an
 * engine may queue them: meta_db.h settle). One that fails later fails
 * whatever statement reads its answer, maybe in the next change, and the
 * batch with it: the journal makes the batch again, and that next change,
 * which did not fail itself, runs once more in the new batch.
 */
int meta_batch_run(struct meta *m, struct mj_rec *r, const uint64_t *result, txn_fn fn,
		     void *arg)
{
	struct timespec now;
	bool journaled = false, retried = false, theirs;
	/* A change that fails after writing part of itself must leave nothing
	 * behind. A savepoint around each costs two statements more than the
	 * change itself, so only a replay takes one (a record it cannot make
	 * again is skipped, the rest goes on); a live change that fails part
	 * way instead loses the whole batch, which the journal makes again
	 * without it (batch_lost). Changes fail that way only when the
	 * database does (full disk, I/O): their checks come before their
	 * writes. */
	bool savepoint = meta_tl_replaying;
	int64_t changes = 0, inherited;
	struct ctr ctr0;
	int rc;

again:
	rc = batch_begin(m);
	if (rc)
		return rc;
	/* Writes of earlier changes still unanswered: a failure among them
	 * may surface in this one. */
	inherited = m->bc->drv->change_start(m->bc);
	if (savepoint) {
		rc = exec_st(m->bc, ST_SAVEPOINT);
		if (rc)
			goto broken;
	} else {
		changes = m->bc->drv->total_changes(m->bc) + (int64_t)m->hot_puts;
	}
	ctr0 = m->ctr; /* a change that fails takes no number */
	if (meta_tl_replaying) {
		rc = fn(m->bc, arg);
		if (rc == 0)
			rc = m->bc->drv->settle(m->bc);
	} else {
		clock_gettime(CLOCK_REALTIME, &now);
		meta_tl_now = &now;
		meta_tl_seq = r != NULL ? m->jseq + 1 : 0;
		rc = fn(m->bc, arg);
		/* Not journaled, so not made again: answered before it is
		 * acknowledged. */
		if (rc == 0 && r == NULL)
			rc = m->bc->drv->settle(m->bc);
		meta_tl_seq = 0;
		meta_tl_now = NULL;
		if (rc == 0 && r != NULL) {
			r->seq = m->jseq + 1;
			r->now = now;
			if (result)
				r->v[J_RESULT] = *result;
			rc = journal_append(m, r);
			if (rc == 0) {
				m->jseq = r->seq;
				m->js.records++;
				m->batch_records++;
				journaled = true;
			}
		}
	}
	/* The database gave up the whole batch itself (SQLite after some
	 * errors; PostgreSQL's transaction after any error can only roll back,
	 * unless to the savepoint). */
	if (savepoint ? !m->bc->drv->txn_open(m->bc) : !m->bc->drv->in_txn(m->bc))
		goto broken;
	if (rc) {
		/* A replayed change's numbers were given out when it was
		 * acknowledged (the kernel may hold its inode): a change the
		 * database refuses now keeps them from being given again. */
		if (!savepoint) {
			m->ctr = ctr0;
			if (m->bc->drv->total_changes(m->bc) + (int64_t)m->hot_puts != changes)
				batch_lost(m); /* made again from the journal, without this one */
			return rc;
		}
		if (exec_st(m->bc, ST_SAVEPOINT_ROLLBACK) || exec_st(m->bc, ST_SAVEPOINT_RELEASE))
			goto broken;
		return rc;
	}
	if (savepoint && exec_st(m->bc, ST_SAVEPOINT_RELEASE))
		goto broken;
	if (r == NULL && !meta_tl_replaying)
		return batch_commit(m); /* not journaled: committed, or not made */
	/* A writer of another process waits for the database: let it in now
	 * rather than at the flusher's next round. The change is journaled,
	 * so a failed commit is not its failure: the batch is made again from
	 * the journal (batch_lost) and the change commits with it later. */
	if (!meta_tl_replaying && (m->batch_records >= BATCH_RECORDS_MAX || intent_wanted(m)))
		(void)batch_commit(m);
	return 0;
broken:
	if (rc == 0)
		rc = -EIO;
	/* An earlier change's write failed, and this change read it. */
	theirs = !meta_tl_replaying && inherited > 0 && m->bc != NULL &&
		 m->bc->drv->failed_earlier(m->bc);
	if (!meta_tl_replaying)
		batch_lost(m); /* makes the batch again from the journal */
	if (journaled)
		return 0; /* so this change is made (or will be: see m->stuck) */
	if (theirs && !retried && !m->stuck) {
		/* The batch is made again without what failed: this change
		 * gets a turn of its own. */
		retried = true;
		m->js.changes_retried++;
		goto again;
	}
	return rc == -EAGAIN ? -EIO : rc;
}

/* A change made through m: in the batch when m defers (journaled when r is
 * given), else in a transaction of its own. */
int meta_txn_rec(struct meta *m, struct mj_rec *r, const uint64_t *result, txn_fn fn,
		   void *arg)
{
	int rc;

	if (m->jfd < 0)
		return txn_now(m, fn, arg);
	pthread_mutex_lock(&m->write_lock);
	rc = meta_batch_run(m, r, result, fn, arg);
	pthread_mutex_unlock(&m->write_lock);
	return rc;
}

int meta_txn(struct meta *m, txn_fn fn, void *arg)
{
	return meta_txn_rec(m, NULL, NULL, fn, arg);
}

int meta_txn_settled(struct meta *m, txn_fn fn, void *arg)
{
	int rc = 0;

	pthread_mutex_lock(&m->write_lock);
	if (m->jfd >= 0)
		rc = batch_commit(m);
	if (rc == 0)
		rc = txn_locked(m, fn, arg);
	pthread_mutex_unlock(&m->write_lock);
	return rc;
}

/*
 * The connection a read uses. While a batch is open its changes are seen
 * only on m->bc, so reads go there, under write_lock; otherwise the
 * thread's own (no lock: a change that returned before this read began has
 * either set batch_dirty or been committed). Declared with READ_CONN, so
 * write_lock goes when the variable does.
 */
int meta_read_conn(struct meta *m, struct conn **out)
{
	if (atomic_load(&m->batch_dirty) || atomic_load(&m->stuck)) {
		pthread_mutex_lock(&m->write_lock);
		batch_check(m);
		/* Acknowledged changes that no batch holds (the database could
		 * not take them): try again, so this read sees them. */
		if (m->stuck && !m->batch_open)
			batch_restore(m);
		/* Writes of acknowledged changes may be unanswered: a read
		 * that carries them and meets a failure among them fails
		 * with EIO, not with that change's error, and the next
		 * batch_check() makes the batch again. Reading the answers
		 * first would cost most reads an exchange they do not
		 * otherwise need (the held rows answer them). */
		if (m->batch_open) {
			(void)m->bc->drv->change_start(m->bc);
			*out = m->bc;
			return 0;
		}
		pthread_mutex_unlock(&m->write_lock);
	}
	return meta_conn_get(m, out);
}

/* Called as the variable made by READ_CONN goes out of scope. */
void meta_read_done(struct conn **pc)
{
	struct conn *c = *pc;

	if (c != NULL && c == c->m->bc)
		pthread_mutex_unlock(&c->m->write_lock);
}


/*
 * Makes every journal record past m->applied again, in order, into the
 * batch (write_lock held). A record that ends the file early or fails its
 * check ends the journal. A record the database refuses now is counted and
 * skipped: the others do not depend on the database agreeing with it.
 */
static int journal_replay(struct meta *m, uint64_t *count)
{
	unsigned char *buf = NULL;
	struct stat sb;
	size_t off = 0, len;
	int rc = 0;

	*count = 0;
	if (fstat(m->jfd, &sb) < 0)
		return -errno;
	len = (size_t)sb.st_size;
	if (len == 0)
		goto out;
	buf = malloc(len);
	if (buf == NULL)
		return -ENOMEM;
	for (size_t got = 0; got < len;) {
		ssize_t n = pread(m->jfd, buf + got, len - got, (off_t)got);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			rc = n < 0 ? -errno : -EIO;
			goto out;
		}
		got += (size_t)n;
	}
	meta_tl_replaying = 1;
	while (off < len) {
		struct mj_rec r;
		long n = mj_decode(buf + off, len - off, &r);

		if (n <= 0)
			break;
		if (r.seq > m->applied) {
			meta_tl_now = &r.now;
			meta_tl_seq = r.seq;
			rc = meta_replay_one(m, &r);
			meta_tl_seq = 0;
			meta_tl_now = NULL;
			if (rc == -ENOSPC || rc == -EIO || rc == -ENOMEM || rc == -EAGAIN ||
			    m->bc == NULL || !m->bc->drv->in_txn(m->bc)) {
				/* The database failed, not the record. */
				meta_tl_replaying = 0;
				if (rc == 0)
					rc = -EIO;
				goto out;
			}
			if (rc == 0)
				(*count)++;
			else {
				/* The change was acknowledged and is not in the
				 * database: what the names set counts no longer
				 * follows from what was acknowledged. */
				m->js.replay_errors++;
				meta_names_forget(m->names);
			}
			rc = 0;
			if (r.seq > m->jseq)
				m->jseq = r.seq;
		}
		off += (size_t)n;
	}
	meta_tl_replaying = 0;
	m->js.replayed += *count;
	/* Later records go after the last good one. */
	m->jsize = (off_t)off;
out:
	free(buf);
	return rc;
}

static int64_t ts_ns(const struct timespec *t)
{
	return (int64_t)t->tv_sec * 1000000000LL + t->tv_nsec;
}

/*
 * The flusher: commits a batch flush_ms after it opened, or sooner when
 * another process waits to write (the reconciler's commit, a CLI). While
 * changes come, meta_batch_run() looks for such a writer; between them
 * this thread looks every INTENT_TICK_MS, so a long flush_ms (fewer
 * commits: each writes every page the batch touched, and every read and
 * change waits for it) does not make that writer wait longer.
 */
#define INTENT_TICK_MS 5
static void *flush_main(void *arg)
{
	struct meta *m = arg;

	pthread_mutex_lock(&m->write_lock);
	while (!m->flush_stop) {
		struct timespec now, wake;
		int64_t due, tick;

		if (!m->batch_open && !releases_pending(m)) {
			pthread_cond_wait(&m->flush_cond, &m->write_lock);
			continue;
		}
		/* Inodes to free and no batch: one opens for them. */
		if (!m->batch_open && batch_begin(m) != 0) {
			(void)batch_commit(m); /* cannot open one either: they are given up */
			continue;
		}
		due = ts_ns(&m->batch_since) + (int64_t)m->flush_ms * 1000000LL;
		clock_gettime(CLOCK_MONOTONIC, &now);
		if (ts_ns(&now) < due && !intent_wanted(m)) {
			tick = ts_ns(&now) + INTENT_TICK_MS * 1000000LL;
			if (tick > due)
				tick = due;
			wake.tv_sec = (time_t)(tick / 1000000000LL);
			wake.tv_nsec = (long)(tick % 1000000000LL);
			pthread_cond_timedwait(&m->flush_cond, &m->write_lock, &wake);
			continue;
		}
		if (batch_commit(m) != 0) {
			/* The batch is open again (replayed): wait a round. */
			clock_gettime(CLOCK_MONOTONIC, &m->batch_since);
		}
	}
	pthread_mutex_unlock(&m->write_lock);
	return NULL;
}

int meta_journal_open(struct meta *m, const char *journal_path, int flush_ms,
		      uint64_t *replayed)
{
	uint64_t n = 0;
	int64_t applied = 0;
	int fd = -1, rc;

	if (m == NULL || journal_path == NULL || flush_ms <= 0)
		return -EINVAL;
	if (m->jfd >= 0)
		return -EALREADY;
	rc = meta_set_batched(m, 1);
	if (rc)
		return rc;
	fd = open(journal_path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (fd < 0)
		return -errno;
	if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
		rc = errno == EWOULDBLOCK ? -EBUSY : -errno;
		goto fail;
	}
	rc = m->drv->conn_open(m, &m->bc);
	if (rc)
		goto fail;
	rc = query_int(m->bc, ST_JOURNAL_GET, 0, NULL, 0, INT64_MAX, 0, &applied);
	if (rc)
		goto fail;
	pthread_mutex_lock(&m->write_lock);
	m->applied = m->jseq = (uint64_t)applied;
	m->flush_ms = flush_ms;
	m->jfd = fd;
	rc = journal_replay(m, &n);
	if (rc == 0)
		rc = batch_commit(m);
	if (rc == 0 && ftruncate(fd, 0) == 0)
		m->jsize = 0;
	if (rc) {
		batch_lost(m);
		m->jfd = -1;
	}
	pthread_mutex_unlock(&m->write_lock);
	if (rc)
		goto fail;
	rc = -pthread_create(&m->flush_thread, NULL, flush_main, m);
	if (rc) {
		meta_flush(m);
		m->jfd = -1;
		goto fail;
	}
	m->flush_started = 1;
	if (replayed)
		*replayed = n;
	return 0;
fail:
	if (m->bc) {
		conn_free(m->bc);
		m->bc = NULL;
	}
	close(fd);
	return rc;
}

uint64_t meta_journal_last(struct meta *m)
{
	uint64_t seq;

	if (m == NULL || m->jfd < 0)
		return 0;
	pthread_mutex_lock(&m->write_lock);
	seq = m->jseq;
	pthread_mutex_unlock(&m->write_lock);
	return seq;
}

/* Commits the open batch; with restore, first makes acknowledged changes
 * that no batch holds (m->stuck: the database refused them again) into one
 * again. Those still not committed are not a success: they stay journaled,
 * and each later change or read tries them again. */
static int flush(struct meta *m, bool restore)
{
	int rc;

	if (m == NULL)
		return -EINVAL;
	if (m->jfd < 0)
		return 0;
	pthread_mutex_lock(&m->write_lock);
	if (restore && m->stuck && !m->batch_open)
		batch_restore(m);
	rc = batch_commit(m);
	if (rc == 0 && m->stuck)
		rc = -EIO;
	pthread_mutex_unlock(&m->write_lock);
	return rc;
}

int meta_inode_release_later(struct meta *m, uint64_t ino)
{
	bool first;

	if (m == NULL)
		return -EINVAL;
	if (m->jfd < 0)
		return meta_inode_release(m, ino);
	pthread_mutex_lock(&m->rel_lock);
	if (m->nrel == m->relcap) {
		size_t cap = m->relcap ? m->relcap * 2 : 256;
		uint64_t *v = realloc(m->rel, cap * sizeof(*v));

		if (v == NULL) {
			pthread_mutex_unlock(&m->rel_lock);
			return meta_inode_release(m, ino);
		}
		m->rel = v;
		m->relcap = cap;
	}
	m->rel[m->nrel++] = ino;
	first = m->nrel == 1;
	pthread_mutex_unlock(&m->rel_lock);
	/* A flusher with no batch open sleeps until one opens: wake it
	 * (under write_lock, so it cannot be between its look and its wait). */
	if (first && !atomic_load(&m->batch_dirty)) {
		pthread_mutex_lock(&m->write_lock);
		pthread_cond_signal(&m->flush_cond);
		pthread_mutex_unlock(&m->write_lock);
	}
	return 0;
}

uint64_t meta_releases_pending(struct meta *m)
{
	uint64_t n;

	if (m == NULL)
		return 0;
	pthread_mutex_lock(&m->rel_lock);
	n = m->nrel;
	pthread_mutex_unlock(&m->rel_lock);
	return n;
}

int meta_flush(struct meta *m)
{
	return flush(m, false);
}

void meta_journal_stats_get(struct meta *m, struct meta_journal_stats *out)
{
	memset(out, 0, sizeof(*out));
	if (m == NULL || m->jfd < 0)
		return;
	pthread_mutex_lock(&m->write_lock);
	*out = m->js;
	out->pending = m->jseq - m->applied;
	pthread_mutex_unlock(&m->write_lock);
}


/* ---- opening and closing ----------------------------------------------- */

/* The engine a location names: a postgres:// URL or a file path. */
static int engine_of(const char *loc, const struct db_driver **drv,
		     const struct db_volume_ops **vol)
{
	if (strncmp(loc, "postgres://", 11) == 0 || strncmp(loc, "postgresql://", 13) == 0) {
		*drv = &meta_pg_driver;
		*vol = &meta_pg_volume;
		return 0;
	}
	*drv = &meta_sqlite_driver;
	*vol = &meta_sqlite_volume;
	return 0;
}

/* A struct meta for loc with no connection yet. */
int meta_alloc(const char *loc, struct meta **out)
{
	struct meta *m;
	int rc;

	*out = NULL;
	m = calloc(1, sizeof(*m));
	if (m == NULL)
		return -ENOMEM;
	rc = engine_of(loc, &m->drv, &m->vol);
	if (rc) {
		free(m);
		return rc;
	}
	m->path = strdup(loc);
	if (m->path == NULL) {
		free(m);
		return -ENOMEM;
	}
	if (pthread_key_create(&m->key, meta_conn_thread_exit) != 0) {
		free(m->path);
		free(m);
		return -ENOMEM;
	}
	pthread_mutex_init(&m->lock, NULL);
	pthread_mutex_init(&m->ids_lock, NULL);
	pthread_mutex_init(&m->write_lock, NULL);
	pthread_mutex_init(&m->rel_lock, NULL);
	mono_cond_init(&m->flush_cond);
	m->jfd = -1;
	m->intent_fd = -1;
	*out = m;
	return 0;
}

int meta_open(const char *db_path, struct meta **out)
{
	struct meta *m;
	int rc;

	if (db_path == NULL || out == NULL)
		return -EINVAL;
	*out = NULL;
	rc = meta_alloc(db_path, &m);
	if (rc)
		return rc;
	rc = m->vol->open(m);
	if (rc == 0) {
		struct meta_volume v = { 0 };

		rc = meta_volume_get(m, &v); /* the volume row is there and sound */
		meta_volume_free(&v);
	}
	if (rc == 0)
		m->opened = 1;
	if (rc) {
		meta_close(m);
		switch (rc) {
		case -ENOMEM:
		case -ENOENT:
		case -EINVAL:       /* a location that names no volume */
		case -EACCES:       /* the server refused who we are */
		case -ECONNREFUSED: /* no server there */
			return rc;
		default:
			return -EIO;
		}
	}
	*out = m;
	return 0;
}

void meta_close(struct meta *m)
{
	struct conn *c, *next;

	if (m == NULL)
		return;
	m->vol->close(m, 0);
	if (m->jfd >= 0) {
		pthread_mutex_lock(&m->write_lock);
		m->flush_stop = 1;
		pthread_cond_signal(&m->flush_cond);
		pthread_mutex_unlock(&m->write_lock);
		if (m->flush_started)
			pthread_join(m->flush_thread, NULL);
		/* What does not commit now is replayed at the next open; once
		 * everything did, the journal is left empty (a node handing
		 * the volume over then leaves nothing that looks pending). */
		if (meta_flush(m) == 0 && m->jseq == m->applied && !m->stuck)
			(void)!ftruncate(m->jfd, 0);
		close(m->jfd);
		m->jfd = -1;
	}
	conn_free(m->bc);
	if (m->intent_fd >= 0)
		close(m->intent_fd);
	/* The caller's workers are gone (or never touch m again); no key
	 * destructor runs for this key after this. */
	pthread_key_delete(m->key);
	pthread_mutex_lock(&m->lock);
	c = m->conns;
	m->conns = NULL;
	pthread_mutex_unlock(&m->lock);
	for (; c != NULL; c = next) {
		next = c->next;
		conn_free(c);
	}
	m->vol->close(m, 1);
	meta_names_free(m->names);
	pthread_mutex_destroy(&m->lock);
	pthread_mutex_destroy(&m->ids_lock);
	pthread_mutex_destroy(&m->write_lock);
	pthread_mutex_destroy(&m->rel_lock);
	free(m->rel); /* queued with no journal left to free them in: orphans */
	pthread_cond_destroy(&m->flush_cond);
	free(m->path);
	free(m);
}

int meta_set_batched(struct meta *m, int batched)
{
	atomic_store(&m->batched, batched);
	return m->vol->set_batched(m, batched);
}

int meta_sync(struct meta *m)
{
	uint64_t made, synced;
	int rc;

	if (m == NULL)
		return -EINVAL;
	if (m->jfd >= 0) {
		rc = flush(m, true);
		if (rc)
			return rc;
	}
	if (!atomic_load(&m->batched))
		return 0; /* every commit was synced already */
	/* Read before the sync: a commit that lands during it may miss it. */
	made = atomic_load(&m->commits_made);
	if (atomic_exchange(&m->sync_lost, 0)) {
		/* Reported once, as a disk reports a lost write at fsync. */
		atomic_store(&m->commits_synced, made);
		return -EIO;
	}
	if (made == atomic_load(&m->commits_synced))
		return 0; /* nothing of ours since the last sync */
	rc = m->vol->sync(m);
	/* Raised, never lowered: syncs run on several threads at once. */
	synced = atomic_load(&m->commits_synced);
	while (rc == 0 && synced < made &&
	       !atomic_compare_exchange_weak(&m->commits_synced, &synced, made))
		;
	return rc;
}
