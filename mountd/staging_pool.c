/*
 * Passthrough staging files made and registered ahead of the opens that
 * take them. A create's reply needs a backing id, and making one costs a
 * file creation on the staging file system, a BACKING_OPEN (an RPC to
 * ferry-brokerd on a broker mount) and a stamp: done here by a thread of
 * its own, in rounds, while the FUSE workers answer requests. A round
 * registers its files together (backing_open_many): one request to
 * ferry-brokerd per POOL_BATCH files. An open
 * takes a file with one rename that gives it its real name.
 *
 * Pool files are named ".pool-<pid>-<serial>": the leading dot keeps them
 * out of every scan of the staging directory (the reconciler's, this
 * daemon's recovery), and a later start removes those of a daemon that is
 * gone (staging_pool_sweep). The pool owns each file's fd and backing id
 * until staging_pool_take() hands both to the caller. A file created and
 * closed untouched comes back (staging_pool_give), still registered,
 * instead of being removed: an empty file costs the staging file system two
 * renames, not a file, and no registration.
 */
#include <errno.h>
#include <fcntl.h>
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "mountd.h"
#include "proc_live.h"

/* How many files wait ready, and the level that wakes the filler. A burst
 * of creates takes them faster than one thread makes them, and then the
 * opens make their own (as without a pool): the pool spares the critical
 * path as much as the filler keeps up, never more than this many fds. */
#define POOL_TARGET 32u
#define POOL_LOW (POOL_TARGET / 2)
/* Files made, then registered together, per step of a round. */
#define POOL_BATCH (BROKER_FDS_MAX < POOL_TARGET - POOL_LOW ? BROKER_FDS_MAX \
							      : POOL_TARGET - POOL_LOW)
/* After a failure (no space, no fds, a broker away), the filler rests. */
#define POOL_REST_MS 1000
/* A pool nobody took from for this long is emptied, until the next open. */
#define POOL_IDLE_MS 2000

struct pool_file {
	int fd;
	int backing_id;
	uint64_t serial;
	/* The staging file system keeps a stamp to the nanosecond as given
	 * (a futimens() then needs no fstat() to learn what it stored). */
	bool exact;
};

struct staging_pool {
	pthread_mutex_t lock;
	pthread_cond_t want;           /* the filler waits on it */
	struct pool_file f[POOL_TARGET]; /* f[0..n) are ready */
	unsigned n;
	bool stop, live;
	pthread_t thread;
	uint64_t serial;
	pid_t pid; /* ours, in the names */
	bool exact; /* the last file made kept its stamp as given */
	bool used;  /* a take or give since the filler last looked */
	bool idle;  /* emptied for want of use: refilled at the next take */
};

static void pool_name(const struct mountd *md, uint64_t serial, char *buf, size_t len)
{
	snprintf(buf, len, ".pool-%d-%llu", (int)md->pool->pid, (unsigned long long)serial);
}

/* unregister: close the backing id too (no need when the connection is
 * going away with the daemon: its ids go with it). */
static void pool_file_drop(struct mountd *md, struct pool_file *pf, bool unregister)
{
	char name[64];

	if (unregister)
		backing_close(md, pf->backing_id);
	close(pf->fd);
	pool_name(md, pf->serial, name, sizeof(name));
	if (unlinkat(md->staging_dirfd, name, 0) < 0 && errno != ENOENT)
		log_warn("cannot remove pool staging file %s", name);
}

/* Makes one pool file, not registered yet; 0 or a negative errno. */
static int pool_file_make(struct mountd *md, uint64_t serial, struct pool_file *pf)
{
	struct timespec ts[2] = { { .tv_nsec = UTIME_OMIT }, { 0 } };
	char name[64];
	struct stat st;
	int rc;

	pool_name(md, serial, name, sizeof(name));
	pf->serial = serial;
	pf->fd = openat(md->staging_dirfd, name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (pf->fd < 0)
		return -errno;
	clock_gettime(CLOCK_REALTIME, &ts[1]);
	if (futimens(pf->fd, ts) < 0 || fstat(pf->fd, &st) < 0) {
		rc = -errno;
		goto fail;
	}
	pf->exact = st.st_mtim.tv_sec == ts[1].tv_sec && st.st_mtim.tv_nsec == ts[1].tv_nsec;
	pf->backing_id = 0;
	return 0;
fail:
	close(pf->fd);
	unlinkat(md->staging_dirfd, name, 0);
	return rc;
}

/*
 * Makes n pool files with serials from first on and registers them
 * together: out[0..*made) are ready. 0, or the first failure (out still
 * holds what was made before it, or registered apart from it).
 */
static int pool_files_make(struct mountd *md, uint64_t first, size_t n, struct pool_file *out,
			   size_t *made)
{
	int fds[POOL_BATCH], ids[POOL_BATCH];
	size_t k, got = 0;
	int rc = 0;

	for (k = 0; k < n && rc == 0; k++) {
		rc = pool_file_make(md, first + k, &out[k]);
		if (rc == 0)
			fds[got++] = out[k].fd;
	}
	if (got)
		backing_open_many(md, fds, got, ids);
	*made = 0;
	for (k = 0; k < got; k++) {
		if (ids[k] < 0) {
			if (rc == 0)
				rc = ids[k];
			pool_file_drop(md, &out[k], false);
			continue;
		}
		out[k].backing_id = ids[k];
		out[(*made)++] = out[k];
	}
	return rc;
}

static struct timespec mono_after_ms(int64_t ms)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	t.tv_sec += ms / 1000;
	t.tv_nsec += (ms % 1000) * 1000000L;
	if (t.tv_nsec >= 1000000000L) {
		t.tv_sec++;
		t.tv_nsec -= 1000000000L;
	}
	return t;
}

/* Drops every ready file (lock held; released while they go). */
static void pool_empty_locked(struct mountd *md, struct staging_pool *p)
{
	while (p->n > 0) {
		struct pool_file pf = p->f[--p->n];

		pthread_mutex_unlock(&p->lock);
		pool_file_drop(md, &pf, true);
		pthread_mutex_lock(&p->lock);
	}
}

static void *pool_main(void *arg)
{
	struct mountd *md = arg;
	struct staging_pool *p = md->pool;

	pthread_mutex_lock(&p->lock);
	while (!p->stop) {
		uint64_t serial;
		int rc;

		if (p->idle || p->n > POOL_LOW || atomic_load(&md->pt_off)) {
			struct timespec until;

			if (p->n == 0 || p->idle) {
				pthread_cond_wait(&p->want, &p->lock);
				continue;
			}
			/* Nobody took one for POOL_IDLE_MS: the files go, so an
			 * idle mount holds no file open on the staging file
			 * system (a read-only remount of it needs that). */
			p->used = false;
			until = mono_after_ms(POOL_IDLE_MS);
			while (!p->stop && !p->used)
				if (pthread_cond_timedwait(&p->want, &p->lock, &until) == ETIMEDOUT)
					break;
			if (!p->stop && !p->used) {
				p->idle = true;
				pool_empty_locked(md, p);
			}
			continue;
		}
		/* Fills up to the target in one round: one wake-up per
		 * POOL_TARGET - POOL_LOW opens, not one per open. */
		while (!p->stop && p->n < POOL_TARGET && !atomic_load(&md->pt_off)) {
			struct pool_file batch[POOL_BATCH];
			size_t want = POOL_TARGET - p->n, made = 0;

			if (want > POOL_BATCH)
				want = POOL_BATCH;
			serial = p->serial + 1;
			p->serial += want;
			pthread_mutex_unlock(&p->lock);
			rc = pool_files_make(md, serial, want, batch, &made);
			pthread_mutex_lock(&p->lock);
			for (size_t k = 0; k < made; k++) {
				if (p->stop || p->n >= POOL_TARGET) {
					/* Stopping, or closes gave files back
					 * meanwhile and the pool is full: not
					 * needed. Its id goes with the
					 * connection at a stop, but not at a
					 * hand-over (staging_pool_free). */
					bool unregister = !p->stop || md->handing_over;

					pthread_mutex_unlock(&p->lock);
					pool_file_drop(md, &batch[k], unregister);
					pthread_mutex_lock(&p->lock);
					continue;
				}
				p->exact = batch[k].exact;
				p->f[p->n++] = batch[k];
			}
			if (rc < 0) {
				struct timespec until = mono_after_ms(POOL_REST_MS);

				atomic_fetch_add(&md->stats.staging_pool_failures, 1);
				p->used = false;
				while (!p->stop)
					if (pthread_cond_timedwait(&p->want, &p->lock, &until) ==
					    ETIMEDOUT)
						break;
				/* Nobody came meanwhile: rest until someone does
				 * (an idle mount holds no pool file open), rather
				 * than failing again every second. */
				if (!p->stop && !p->used) {
					p->idle = true;
					pool_empty_locked(md, p);
				}
				break;
			}
		}
	}
	pthread_mutex_unlock(&p->lock);
	return NULL;
}

int staging_pool_new(struct mountd *md)
{
	struct staging_pool *p = calloc(1, sizeof(*p));
	pthread_condattr_t ca;

	if (!p)
		return -ENOMEM;
	pthread_mutex_init(&p->lock, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&p->want, &ca);
	pthread_condattr_destroy(&ca);
	p->pid = getpid();
	md->pool = p;
	return 0;
}

int staging_pool_take(struct mountd *md, const char *name, int *fd, int *backing_id,
		      bool *exact_stamps)
{
	struct staging_pool *p = md->pool;
	struct pool_file pf;
	char from[64];
	bool wake;

	if (!p)
		return -EAGAIN;
	pthread_mutex_lock(&p->lock);
	if (!p->live && !p->stop) {
		/* Started by the first passthrough open: a mount without
		 * passthrough never makes a pool file. */
		p->live = pthread_create(&p->thread, NULL, pool_main, md) == 0;
		if (!p->live)
			p->stop = true; /* no pool: every open makes its own */
	}
	p->used = true;
	p->idle = false;
	if (p->n == 0) {
		wake = p->live;
		pthread_mutex_unlock(&p->lock);
		if (wake)
			pthread_cond_signal(&p->want);
		atomic_fetch_add(&md->stats.staging_pool_misses, 1);
		return -EAGAIN;
	}
	pf = p->f[--p->n];
	wake = p->n == POOL_LOW;
	pthread_mutex_unlock(&p->lock);
	if (wake)
		pthread_cond_signal(&p->want);
	pool_name(md, pf.serial, from, sizeof(from));
	/* Never over a file that has the name (a name repeats only if seqs
	 * restarted: --no-reconciler, the same pid in a new container). */
	if (renameat2(md->staging_dirfd, from, md->staging_dirfd, name, RENAME_NOREPLACE) < 0) {
		int rc = -errno;

		pool_file_drop(md, &pf, true);
		return rc;
	}
	if (pf.backing_id == 0) {
		/* Given back unregistered (staging_pool_give): registered now,
		 * one ioctl (or RPC) instead of a file made and removed. */
		pf.backing_id = backing_open(md, pf.fd);
		if (pf.backing_id < 0) {
			int rc = pf.backing_id;

			pf.backing_id = 0;
			pool_file_drop(md, &pf, false);
			if (unlinkat(md->staging_dirfd, name, 0) < 0 && errno != ENOENT)
				log_warn("cannot remove staging file %s", name);
			return rc;
		}
	}
	atomic_fetch_add(&md->stats.staging_pool_hits, 1);
	*fd = pf.fd;
	*backing_id = pf.backing_id;
	*exact_stamps = pf.exact;
	return 0;
}

int staging_pool_give(struct mountd *md, int fd, const char *name, int backing_id)
{
	struct staging_pool *p = md->pool;
	struct pool_file pf = { .fd = fd, .backing_id = backing_id > 0 ? backing_id : 0 };
	char to[64];

	if (!p)
		return -EAGAIN;
	pthread_mutex_lock(&p->lock);
	if (p->stop || p->idle || p->n >= POOL_TARGET) {
		pthread_mutex_unlock(&p->lock);
		return -EAGAIN;
	}
	p->used = true;
	pf.serial = ++p->serial;
	pf.exact = p->exact;
	pthread_mutex_unlock(&p->lock);
	pool_name(md, pf.serial, to, sizeof(to));
	if (renameat2(md->staging_dirfd, name, md->staging_dirfd, to, RENAME_NOREPLACE) < 0)
		return -errno;
	pthread_mutex_lock(&p->lock);
	if (!p->stop && !p->idle && p->n < POOL_TARGET) {
		p->f[p->n++] = pf;
		pthread_mutex_unlock(&p->lock);
		atomic_fetch_add(&md->stats.staging_pool_returns, 1);
		return 0;
	}
	pthread_mutex_unlock(&p->lock);
	pool_file_drop(md, &pf, true);
	return 0;
}

void staging_pool_free(struct mountd *md)
{
	struct staging_pool *p = md->pool;

	if (!p)
		return;
	pthread_mutex_lock(&p->lock);
	p->stop = true;
	pthread_mutex_unlock(&p->lock);
	pthread_cond_signal(&p->want);
	if (p->live)
		pthread_join(p->thread, NULL);
	/* A hand-over leaves the connection alive: its ids must go now. */
	while (p->n > 0)
		pool_file_drop(md, &p->f[--p->n], md->handing_over);
	pthread_cond_destroy(&p->want);
	pthread_mutex_destroy(&p->lock);
	free(p);
	md->pool = NULL;
}

void staging_pool_sweep(struct mountd *md)
{
	DIR *d = fdopendir(dup(md->staging_dirfd));
	long self = (long)getpid();
	struct dirent *de;
	size_t removed = 0;

	if (!d)
		return;
	/* The dup shares the directory's offset with staging_dirfd and every
	 * other dup of it: start at the top, and leave it there. */
	rewinddir(d);
	while ((de = readdir(d))) {
		char *end;
		long pid;

		/* Local copies (local_copy.c) are kept across runs only
		 * through a hand-over (handover_restore() takes them up) or
		 * the list a clean stop left (local_copy_saved_adopt()). */
		if (strncmp(de->d_name, ".pool-", 6) != 0 && strncmp(de->d_name, ".kept-", 6) != 0)
			continue;
		if (handover_kept_names(md, de->d_name) || local_copy_saved_names(md, de->d_name))
			continue;
		pid = strtol(de->d_name + 6, &end, 10);
		if (*end != '-' || pid <= 0)
			continue;
		/* Another live daemon's (a staging directory given to two
		 * volumes) is left alone; one with our pid is an earlier run's
		 * (a container's daemon often has the same pid each time). */
		if (pid != self && proc_live(pid))
			continue;
		if (unlinkat(md->staging_dirfd, de->d_name, 0) == 0)
			removed++;
	}
	rewinddir(d);
	closedir(d);
	if (removed)
		log_info("removed %zu unused pool staging files and local copies of an earlier run",
			 removed);
}
