/*
 * lease: one read-write mount of a volume whose metadata any node reaches
 * (PostgreSQL), at a time. The lease is taken before anything of this
 * mount writes (journal replay included), renewed by a thread every third
 * of its length, and released at a clean stop. A mount whose lease another
 * took over (it was cut off long enough for the lease to run out) is
 * fenced by the engine: every write transaction it makes fails with EROFS
 * and changes nothing; its staged files and journal stay where they are,
 * said once in the log and in .stats (lease_fenced), never merged. The
 * node's directory records the epoch it last held, with the volume's uuid
 * and an id of its own (meta.epoch): a node that comes back after another
 * mount held the lease moves what it left uncommitted aside
 * (*.fenced-EPOCH) instead of replaying it. A mount that stops with
 * anything uncommitted keeps the lease (it runs out) rather than free it.
 *
 * The thread and its lock belong to struct mountd (lease_*).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "log.h"
#include "staging_owner.h"
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

/*
 * What the node directory knows of the volume (meta.epoch): the epoch it
 * last held, the volume's uuid then (a volume formatted again under the
 * same name is another volume), and a random id of the directory that its
 * holder strings carry, so that a lease taken by this directory is known
 * for its own even if the take's reply or the record was lost.
 */
struct node_rec {
	uint64_t epoch; /* 0: none yet */
	char uuid[37];
	char id[17];
};

static void node_read(const char *path, struct node_rec *r)
{
	unsigned long long e = 0;
	char uuid[64] = "", id[64] = "";
	FILE *f = fopen(path, "re");

	memset(r, 0, sizeof(*r));
	if (f == NULL)
		return;
	if (fscanf(f, "%llu %63s %63s", &e, uuid, id) == 3 && strlen(uuid) == 36 &&
	    strlen(id) == 16) {
		r->epoch = e;
		memcpy(r->uuid, uuid, 37);
		memcpy(r->id, id, 17);
	}
	fclose(f);
}

static int node_write(const char *path, const struct node_rec *r)
{
	char tmp[PATH_MAX];
	FILE *f;
	int rc = 0;

	if (snprintf(tmp, sizeof(tmp), "%s.new", path) >= (int)sizeof(tmp))
		return -ENAMETOOLONG;
	f = fopen(tmp, "we");
	if (f == NULL)
		return -errno;
	if (fprintf(f, "%llu %s %s\n", (unsigned long long)r->epoch, r->uuid, r->id) < 0 ||
	    fflush(f) != 0 || fsync(fileno(f)) != 0)
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
static void leftovers_aside(struct mountd *md, uint64_t last, const char *old_uuid)
{
	char journal[PATH_MAX], aside[PATH_MAX + 32], dot[32], to[NAME_MAX + 40];
	struct dirent *de;
	uint64_t files = 0, kept = 0;
	DIR *d;

	/* Staging files go into a dot directory inside the staging directory
	 * (which may be a mount point of its own): the reconciler and the
	 * start-up scan pass over dot entries. */
	snprintf(dot, sizeof(dot), ".fenced-%llu", (unsigned long long)last);
	d = holds_something(md->cfg.staging_dir) ? opendir(md->cfg.staging_dir) : NULL;
	if (d != NULL) {
		if (mkdirat(dirfd(d), dot, 0700) != 0 && errno != EEXIST)
			start_failed(md, "cannot make %s/%s: %s", md->cfg.staging_dir, dot,
				     strerror(errno));
		while ((de = readdir(d)) != NULL) {
			if (de->d_name[0] == '.')
				continue;
			snprintf(to, sizeof(to), "%s/%s", dot, de->d_name);
			if (renameat(dirfd(d), de->d_name, dirfd(d), to) != 0)
				start_failed(md, "cannot move %s/%s aside to %s/%s: %s",
					     md->cfg.staging_dir, de->d_name, md->cfg.staging_dir, to,
					     strerror(errno));
			files++;
		}
		closedir(d);
		log_warnx("%s held %llu files this node staged under lease epoch %llu, before "
			  "another mount took the volume over; kept in %s/%s, not uploaded",
			  md->cfg.staging_dir, (unsigned long long)files, (unsigned long long)last,
			  md->cfg.staging_dir, dot);
		kept += files;
	}
	/* What the directory held is aside: a record naming the volume of
	 * this name formatted over (this node's last, old_uuid) goes too, so
	 * this one can claim the directory (staging_owner.h). */
	int sfd = open(md->cfg.staging_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (sfd >= 0) {
		char owner[64];
		int rc = 0;

		if (staging_owner_get(sfd, owner, sizeof(owner)) == 0 && *old_uuid &&
		    strcmp(owner, old_uuid) == 0)
			rc = staging_owner_drop(sfd);
		close(sfd);
		if (rc < 0)
			start_failed(md, "cannot remove %s/%s: %s", md->cfg.staging_dir,
				     STAGING_OWNER_NAME, strerror(-rc));
	}
	if (meta_local_file(md->cfg.db_path, md->cfg.vol_dir, META_JOURNAL_SUFFIX, journal,
			    sizeof(journal)) == 0 && holds_something(journal)) {
		snprintf(aside, sizeof(aside), "%s.fenced-%llu", journal, (unsigned long long)last);
		if (rename(journal, aside) != 0)
			start_failed(md, "cannot move %s aside to %s: %s", journal, aside,
				     strerror(errno));
		log_warnx("%s holds changes this node journaled under lease epoch %llu, before "
			  "another mount took the volume over; kept as %s, not replayed", journal,
			  (unsigned long long)last, aside);
		kept++;
	}
	atomic_store(&md->lease_leftovers, kept);
}

/* Before the lease: a staging directory of a volume of another name is
 * not this one's to fence or to take. The record of this node's last
 * volume of this name (node_uuid, formatted over) is no refusal: its
 * leftovers are fenced and the record with them (leftovers_aside()). */
static void staging_owner_check(struct mountd *md, const char *uuid, const char *node_uuid)
{
	char owner[64];
	int fd = open(md->cfg.staging_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	int rc;

	if (fd < 0)
		return; /* none yet, or unusable: staging_open() says which */
	rc = staging_owner_get(fd, owner, sizeof(owner));
	close(fd);
	if (rc == 0 && strcmp(owner, uuid) != 0 && strcmp(owner, node_uuid) != 0)
		rc = -EEXIST;
	else if (rc == 0 || rc == -ENOENT)
		return;
	staging_owner_refuse(md, rc, owner, uuid);
	start_failed(md, "staging directory %s: cannot read %s/%s: %s", md->cfg.staging_dir,
		     md->cfg.staging_dir, STAGING_OWNER_NAME, strerror(-rc));
}

void lease_take(struct mountd *md)
{
	struct meta_lease cur = { 0 };
	struct meta_volume vol = { 0 };
	char host[HOST_NAME_MAX + 1] = "?", holder[META_LEASE_HOLDER_MAX + 1], tag[32];
	char path[PATH_MAX];
	struct node_rec node;
	uint64_t mine = 0, last;
	int rc;

	if (!meta_url_is_pg(md->cfg.db_path))
		return;
	if (meta_local_file(md->cfg.db_path, md->cfg.vol_dir, ".epoch", path, sizeof(path)) < 0)
		start_failed(md, "volume directory %s: name too long", md->cfg.vol_dir);
	if ((rc = meta_volume_get(md->meta, &vol)) < 0)
		start_failed(md, "cannot read the volume record of %s: %s", md->cfg.db_path,
			     strerror(-rc));
	node_read(path, &node);
	if (node.id[0] == '\0') {
		uint64_t r = 0;

		if (getrandom(&r, sizeof(r), 0) != (ssize_t)sizeof(r))
			start_failed(md, "getrandom: %s", strerror(errno));
		snprintf(node.id, sizeof(node.id), "%016llx", (unsigned long long)r);
	}
	/* Another volume of the same name (formatted again, or on another
	 * server): nothing this directory holds is of this one. */
	last = strcmp(node.uuid, vol.uuid) == 0 ? node.epoch : 0;
	staging_owner_check(md, vol.uuid, node.uuid); /* staging_open() checks it again */
	snprintf(tag, sizeof(tag), "node %s", node.id);
	gethostname(host, sizeof(host));
	host[sizeof(host) - 1] = '\0';
	/* A long mountpoint is cut short: the line names, it does not identify
	 * (the node id does). */
	if (snprintf(holder, sizeof(holder), "%.64s pid %d %s at %.120s", host, (int)getpid(), tag,
		     md->cfg.mountpoint) >= (int)sizeof(holder))
		holder[sizeof(holder) - 1] = '\0';
	/*
	 * A lease whose holder is this directory (a daemon of this node that
	 * died: we hold the directory's lock now) is this node's: taken at
	 * once, and what that daemon left is replayed, even when it died
	 * before it wrote down the epoch it took.
	 */
	if (meta_lease_get(md->meta, &cur) == 0 && strstr(cur.holder, tag) != NULL &&
	    last != 0 && cur.epoch >= last) {
		mine = cur.epoch;
		last = cur.epoch;
	}
	rc = meta_lease_take(md->meta, holder, md->lease_ms, md->lease_takeover, mine, &cur);
	if (rc == -EBUSY)
		say_holder(md, &cur);
	if (rc < 0)
		start_failed(md, "cannot take the writer's lease of %s: %s", md->cfg.db_path,
			     strerror(-rc));
	md->lease_held = true;
	/* Anything left here from before another mount held the volume (or
	 * from another volume of this name) is not replayed. */
	if (node.epoch != 0 && (last == 0 || meta_lease_fenced_to(md->meta) != last + 1))
		leftovers_aside(md, node.epoch, strcmp(node.uuid, vol.uuid) != 0 ? node.uuid : "");
	node.epoch = meta_lease_fenced_to(md->meta);
	memcpy(node.uuid, vol.uuid, sizeof(node.uuid));
	if ((rc = node_write(path, &node)) < 0)
		start_failed(md, "cannot record the lease epoch in %s: %s", path, strerror(-rc));
	meta_volume_free(&vol);
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
	struct meta_journal_stats js;
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
	/* Something of this mount is not committed (a staging file the
	 * reconciler could not finish, journaled changes): the lease stays
	 * this node's until it runs out, so no other node mounts over what
	 * the next mount here will commit. */
	meta_journal_stats_get(md->meta, &js);
	if (js.pending > 0 || holds_something(md->cfg.staging_dir)) {
		log_warnx("keeping the writer's lease of %s: this node has changes not committed "
			  "yet (%s); the next mount here commits them, another node needs "
			  "--takeover once the lease runs out (%lld ms)",
			  md->cfg.db_path, js.pending ? "journaled changes" : "staging files",
			  (long long)md->lease_ms);
		return;
	}
	/* Everything of this mount is committed (meta_flush came first): the
	 * next mount, on any node, takes the lease without a takeover. */
	if ((rc = meta_lease_release(md->meta)) < 0)
		log_errno(rc, "cannot release the writer's lease of %s (it runs out in %lld ms; "
			  "the next mount then needs --takeover)", md->cfg.db_path,
			  (long long)md->lease_ms);
}
