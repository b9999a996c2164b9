/*
 * lease: one read-write mount of a volume whose metadata any node reaches
 * (PostgreSQL), at a time. The lease is taken before anything of this
 * mount writes (journal replay included), renewed by a thread every third
 * of its length, and released at a clean stop. A mount whose lease another
 * took over (it was cut off long enough for the lease to run out) is
 * fenced by the engine: every write transaction it makes fails with EROFS
 * and changes nothing; its staged files and journal stay where they are,
 * said once in the log and in .stats (lease_fenced), never merged. The
 * node's directory records the epoch it last held (meta.epoch): a node that
 * comes back after another mount held the lease moves what it left
 * uncommitted aside (*.fenced-EPOCH) instead of replaying it.
 *
 * The thread and its lock belong to struct mountd (lease_*).
 */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "log.h"
#include "meta.h"
#include "mountd.h"
#include "url.h"

/* Says who holds it, in a line an operator can act on. */
static void say_holder(struct mountd *md, const struct meta_lease *cur)
{
	double left = (double)(cur->expires_ms - cur->now_ms) / 1000.0;

	if (left > 0)
		start_failed(md, "volume %s is mounted read-write by %s; its lease ends in %.1f s "
			     "unless renewed", md->cfg.db_path, cur->holder, left);
	start_failed(md, "volume %s is still held by %s, whose lease ended %.1f s ago without a "
		     "release (its node died?); `ferry mount --takeover` takes it over, and "
		     "fences that holder if it comes back", md->cfg.db_path, cur->holder, -left);
}

/* The epoch this node's directory of the volume last held (0: none yet). */
static uint64_t epoch_read(const char *path)
{
	unsigned long long v = 0;
	FILE *f = fopen(path, "re");

	if (f == NULL)
		return 0;
	if (fscanf(f, "%llu", &v) != 1)
		v = 0;
	fclose(f);
	return v;
}

static int epoch_write(const char *path, uint64_t epoch)
{
	char tmp[PATH_MAX];
	FILE *f;
	int rc = 0;

	if (snprintf(tmp, sizeof(tmp), "%s.new", path) >= (int)sizeof(tmp))
		return -ENAMETOOLONG;
	f = fopen(tmp, "we");
	if (f == NULL)
		return -errno;
	if (fprintf(f, "%llu\n", (unsigned long long)epoch) < 0 || fflush(f) != 0 ||
	    fsync(fileno(f)) != 0)
		rc = -EIO;
	if (fclose(f) != 0 && rc == 0)
		rc = -EIO;
	if (rc == 0 && rename(tmp, path) != 0)
		rc = -errno;
	return rc;
}

/* path exists and holds something: a non-empty file, a directory with
 * entries other than dot files (staging files and their job records are
 * never dot files; the reconciler's lock and the pool's empty files are). */
static bool holds_something(const char *path)
{
	struct stat st;
	DIR *d;
	struct dirent *de;
	bool any = false;

	if (stat(path, &st) != 0)
		return false;
	if (!S_ISDIR(st.st_mode))
		return st.st_size > 0;
	d = opendir(path);
	if (d == NULL)
		return true; /* cannot look: keep it */
	while (!any && (de = readdir(d)) != NULL)
		any = de->d_name[0] != '.'; /* the reconciler's lock, pool files: no data */
	closedir(d);
	return any;
}

/*
 * Another mount held the lease between this node's last one (epoch last)
 * and now: what this node left uncommitted then (its metadata journal, its
 * staging files) was made under a lease it lost, and another writer has
 * changed the volume since. It is moved aside, kept and reported, never
 * replayed or uploaded over the other writer's changes.
 */
static void leftovers_aside(struct mountd *md, uint64_t last)
{
	const char *what[2] = { md->cfg.staging_dir, NULL };
	char journal[PATH_MAX], aside[PATH_MAX + 32];
	int kept = 0;

	if (meta_local_file(md->cfg.db_path, md->cfg.vol_dir, META_JOURNAL_SUFFIX, journal,
			    sizeof(journal)) == 0)
		what[1] = journal;
	for (int i = 0; i < 2; i++) {
		if (what[i] == NULL || !holds_something(what[i]))
			continue;
		snprintf(aside, sizeof(aside), "%s.fenced-%llu", what[i], (unsigned long long)last);
		if (rename(what[i], aside) != 0)
			start_failed(md, "cannot move %s (left by this node under lease epoch %llu, "
				     "which another mount took over) aside to %s: %s",
				     what[i], (unsigned long long)last, aside, strerror(errno));
		log_warnx("%s holds what this node left uncommitted under lease epoch %llu, before "
			  "another mount took the volume over; kept as %s, not merged",
			  what[i], (unsigned long long)last, aside);
		kept++;
	}
	atomic_store(&md->lease_leftovers, (uint64_t)kept);
}

void lease_take(struct mountd *md)
{
	struct meta_lease cur = { 0 };
	char host[HOST_NAME_MAX + 1] = "?", holder[META_LEASE_HOLDER_MAX + 1];
	char epoch_path[PATH_MAX];
	uint64_t last;
	int rc;

	if (!meta_url_is_pg(md->cfg.db_path))
		return;
	gethostname(host, sizeof(host));
	host[sizeof(host) - 1] = '\0';
	snprintf(holder, sizeof(holder), "%s pid %d at %.*s", host, (int)getpid(), 160,
		 md->cfg.mountpoint);
	if (meta_local_file(md->cfg.db_path, md->cfg.vol_dir, ".epoch", epoch_path,
			    sizeof(epoch_path)) < 0)
		start_failed(md, "volume directory %s: name too long", md->cfg.vol_dir);
	last = epoch_read(epoch_path);
	/* An epoch this node directory holds is this node's: its daemon is
	 * dead (we hold the directory's lock), so the lease is taken at once,
	 * and what that daemon left is replayed. */
	rc = meta_lease_take(md->meta, holder, md->lease_ms, md->lease_takeover, last, &cur);
	if (rc == -EBUSY)
		say_holder(md, &cur);
	if (rc < 0)
		start_failed(md, "cannot take the writer's lease of %s: %s", md->cfg.db_path,
			     strerror(-rc));
	md->lease_held = true;
	if (last != 0 && meta_lease_fenced_to(md->meta) != last + 1)
		leftovers_aside(md, last);
	if ((rc = epoch_write(epoch_path, meta_lease_fenced_to(md->meta))) < 0)
		start_failed(md, "cannot record the lease epoch in %s: %s", epoch_path, strerror(-rc));
	atomic_store(&md->meta_up, true);
	if (md->lease_takeover && cur.holder[0])
		log_warnx("took over the lease of %s from %s (epoch %llu): that holder is fenced",
			  md->cfg.db_path, cur.holder,
			  (unsigned long long)meta_lease_fenced_to(md->meta));
	else
		log_info("holding the writer's lease of %s (epoch %llu, %lld ms, renewed every "
			 "%lld ms)", md->cfg.db_path,
			 (unsigned long long)meta_lease_fenced_to(md->meta), (long long)md->lease_ms,
			 (long long)md->lease_ms / 3);
}

static void *lease_main(void *arg)
{
	struct mountd *md = arg;
	int failures = 0;

	pthread_mutex_lock(&md->lease_lock);
	while (!md->lease_stopping && !atomic_load(&md->lease_fenced)) {
		struct timespec until;
		int rc;

		mono_deadline_ms(&until, md->lease_ms / 3);
		while (!md->lease_stopping && pthread_cond_timedwait(&md->lease_cond, &md->lease_lock,
								     &until) != ETIMEDOUT)
			;
		if (md->lease_stopping)
			break;
		pthread_mutex_unlock(&md->lease_lock);
		rc = meta_lease_renew(md->meta, md->lease_ms);
		pthread_mutex_lock(&md->lease_lock);
		if (rc == 0) {
			if (failures)
				log_info("the metadata database answers again; lease renewed");
			failures = 0;
			atomic_store(&md->meta_up, true);
		} else if (rc == -EROFS) {
			atomic_store(&md->lease_fenced, true);
			log_warnx("the writer's lease of %s was taken over by another mount: this "
				  "mount is read-only from now on (writes fail with EROFS); what it "
				  "had staged and not committed stays in %s and its journal, and is "
				  "not merged",
				  md->cfg.db_path, md->cfg.staging_dir);
		} else {
			atomic_store(&md->meta_up, false);
			if (failures++ == 0)
				log_errno(rc, "cannot renew the writer's lease of %s (trying again "
					  "every %lld ms)", md->cfg.db_path, (long long)md->lease_ms / 3);
		}
	}
	pthread_mutex_unlock(&md->lease_lock);
	return NULL;
}

int lease_start(struct mountd *md)
{
	int rc;

	if (!md->lease_held)
		return 0;
	pthread_mutex_init(&md->lease_lock, NULL);
	mono_cond_init(&md->lease_cond);
	md->lease_stopping = false;
	rc = pthread_create(&md->lease_thread, NULL, lease_main, md);
	md->lease_live = rc == 0;
	return -rc;
}

void lease_stop(struct mountd *md)
{
	int rc;

	if (md->lease_live) {
		pthread_mutex_lock(&md->lease_lock);
		md->lease_stopping = true;
		pthread_cond_signal(&md->lease_cond);
		pthread_mutex_unlock(&md->lease_lock);
		pthread_join(md->lease_thread, NULL);
		md->lease_live = false;
		pthread_mutex_destroy(&md->lease_lock);
		pthread_cond_destroy(&md->lease_cond);
	}
	if (!md->lease_held || atomic_load(&md->lease_fenced))
		return;
	md->lease_held = false;
	/* Everything of this mount is committed (meta_flush came first): the
	 * next mount, on any node, takes the lease without a takeover. */
	if ((rc = meta_lease_release(md->meta)) < 0)
		log_errno(rc, "cannot release the writer's lease of %s (it runs out in %lld ms; "
			  "the next mount then needs --takeover)", md->cfg.db_path,
			  (long long)md->lease_ms);
}
