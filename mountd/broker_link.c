/*
 * broker_link: ferry-mountd's side of ferry-brokerd, for a mount run by an
 * unprivileged user (`ferry mount --broker SOCKET`). The broker mounts the
 * FUSE file system for us (we serve the fd it returns through libfuse's
 * "/dev/fd/N" mountpoint form), registers our staging files as passthrough
 * backing files, and unmounts at the end.
 *
 * The connection (md->broker) is shared by every FUSE worker: the client
 * pipelines their calls. If the broker goes away (a restart), a failed call
 * reconnects, at most once a second, and attaches our /dev/fuse fd again so
 * the broker can register backing files for the mount it no longer holds an
 * fd of; until that works, new opens take the daemon path. Backing ids
 * registered before stay valid in the kernel; one whose close could not be
 * sent meanwhile is closed after the relink (else the kernel would hold its
 * staging file, and its disk space, until the unmount).
 *
 * A broker that lists BROKER_FEATURE_MANY takes the staging pool's rounds
 * of registrations in one request (broker_link_backing_open_many), and the
 * closes of RELEASE in batches: each close is queued, and a thread of its
 * own sends what came within CLOSE_BATCH_WAIT_MS as one BACKING_CLOSE_MANY
 * (a full batch goes at once). A registration lives that much longer, no
 * more; the unmount and a hand-over flush the queue first.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "broker_client.h"
#include "log.h"
#include "mountd.h"

/* How long a queued close waits for others to go with it. */
#define CLOSE_BATCH_WAIT_MS 5

/* What the broker says when it cannot be reached or lost our connection. */
static bool broker_gone(int rc)
{
	return rc == -EPIPE || rc == -ENOTCONN || rc == -ETIMEDOUT || rc == -ECONNRESET;
}

static const char *refusal(void)
{
	return broker_last_message();
}

/* Connects to the broker and finds our mount's name beneath our root
 * (*name malloc'ed, the caller's). */
static int broker_link_connect(struct mountd *md, char **name, char *err, size_t errlen)
{
	struct broker_status st;
	int rc;

	rc = broker_connect(md->cfg.broker, &md->broker);
	if (rc < 0) {
		snprintf(err, errlen, "cannot reach ferry-brokerd at %s: %s", md->cfg.broker,
			 strerror(-rc));
		return rc;
	}
	rc = broker_status(md->broker, &st);
	if (rc < 0) {
		snprintf(err, errlen, "ferry-brokerd at %s: %s%s%s", md->cfg.broker, strerror(-rc),
			 *refusal() ? ": " : "", refusal());
		return rc;
	}
	if (!*st.root) {
		snprintf(err, errlen, "ferry-brokerd at %s has no policy rule for uid %d (the node's "
			 "operator adds an `allow uid=%d root=...` line)", md->cfg.broker,
			 (int)getuid(), (int)getuid());
		return -EPERM;
	}
	rc = broker_mount_name(st.root, md->cfg.mountpoint, name);
	if (rc < 0) {
		if (rc == -EXDEV)
			snprintf(err, errlen, "mountpoint %s is not beneath %s, where ferry-brokerd "
				 "mounts for uid %d", md->cfg.mountpoint, st.root, (int)getuid());
		else
			snprintf(err, errlen, "out of memory");
		return rc;
	}
	return 0;
}

static void *close_main(void *arg);

/* The broker answered for our mount: md keeps name and the mount id. */
static void linked(struct mountd *md, char *name, uint64_t id)
{
	pthread_condattr_t ca;

	md->broker_name = name; /* owned by md, freed in broker_link_close() */
	atomic_store(&md->broker_mount_id, id);
	atomic_store(&md->broker_up, true);
	if (md->broker_close_live)
		return;
	pthread_mutex_init(&md->broker_close_lock, NULL);
	/* The batch's wait is timed on the monotonic clock: a step of the
	 * wall clock must not hold closes (and their files' space) back. */
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&md->broker_close_cv, &ca);
	pthread_condattr_destroy(&ca);
	pthread_cond_init(&md->broker_close_sent, NULL);
	/* Without the thread every close goes by itself, as to a broker
	 * without BACKING_CLOSE_MANY. */
	md->broker_close_live = pthread_create(&md->broker_close_thread, NULL, close_main, md) == 0;
}

int broker_link_attach(struct mountd *md, int fuse_fd, char *err, size_t errlen)
{
	uint64_t id = 0;
	char *name = NULL;
	int rc = broker_link_connect(md, &name, err, errlen);

	if (rc < 0)
		return rc;
	rc = broker_attach(md->broker, name, fuse_fd, &id);
	if (rc < 0) {
		snprintf(err, errlen, "ferry-brokerd would not take %s over for this daemon: %s%s%s",
			 md->cfg.mountpoint, strerror(-rc), *refusal() ? ": " : "", refusal());
		free(name);
		return rc;
	}
	linked(md, name, id);
	return 0;
}

/* Whether the mountpoint is a FUSE mount whose connection has ended. */
static bool mountpoint_dead(const char *mountpoint)
{
	struct stat st;

	return stat(mountpoint, &st) < 0 && errno == ENOTCONN;
}

int broker_link_mount(struct mountd *md, const char *const *options, int *fuse_fd, char *err,
		      size_t errlen)
{
	uint64_t id = 0;
	char *name = NULL;
	int rc = broker_link_connect(md, &name, err, errlen);

	if (rc < 0)
		return rc;
	/* A mount of ours whose daemon died (the broker still holds its
	 * connection): take it over rather than mount anew. */
	rc = broker_reattach(md->broker, name, fuse_fd, &id);
	if (rc == 0) {
		linked(md, name, id);
		md->reattached = true;
		md->lookups_unknown = true;
		log_info("ferry-brokerd at %s handed over the FUSE connection of %s (mount id "
			 "%llu), whose ferry-mountd is gone", md->cfg.broker, md->cfg.mountpoint,
			 (unsigned long long)id);
		return 0;
	}
	if (rc == -ENOTCONN && mountpoint_dead(md->cfg.mountpoint)) {
		/* Our mount, but no process holds its FUSE connection any more
		 * (the broker restarted after its daemon died): the kernel ended
		 * it. What its daemon staged is on disk and recovered as after
		 * any crash; the dead mount goes, and a new one is made. */
		log_warnx("%s is a dead mount of ours (%s); having ferry-brokerd unmount it, then "
			  "mounting again", md->cfg.mountpoint, refusal());
		rc = broker_umount(md->broker, name, 0);
		if (rc < 0) {
			snprintf(err, errlen, "ferry-brokerd would not unmount the dead mount on %s: "
				 "%s%s%s", md->cfg.mountpoint, strerror(-rc), *refusal() ? ": " : "",
				 refusal());
			free(name);
			return rc;
		}
		rc = -ENOENT;
	}
	if (rc != -ENOENT) {
		snprintf(err, errlen, "ferry-brokerd would not hand over the mount on %s: %s%s%s",
			 md->cfg.mountpoint, strerror(-rc), *refusal() ? ": " : "", refusal());
		free(name);
		return rc;
	}
	rc = broker_mount(md->broker, name, options, fuse_fd, &id);
	if (rc < 0) {
		snprintf(err, errlen, "ferry-brokerd refused to mount %s: %s%s%s",
			 md->cfg.mountpoint, strerror(-rc), *refusal() ? ": " : "", refusal());
		free(name);
		return rc;
	}
	linked(md, name, id);
	log_info("ferry-brokerd at %s mounted %s (mount id %llu)", md->cfg.broker,
		 md->cfg.mountpoint, (unsigned long long)id);
	return 0;
}

/* Remembers a backing id whose close was not sent. Caller holds
 * broker_lock. */
static void unclosed_add(struct mountd *md, int id)
{
	if (md->broker_nunclosed == md->broker_unclosed_cap) {
		size_t cap = md->broker_unclosed_cap ? md->broker_unclosed_cap * 2 : 16;
		int *n = realloc(md->broker_unclosed, cap * sizeof(*n));

		if (!n) {
			log_warnx("out of memory: backing id %d stays registered until the unmount",
				  id);
			return;
		}
		md->broker_unclosed = n;
		md->broker_unclosed_cap = cap;
	}
	md->broker_unclosed[md->broker_nunclosed++] = id;
}

/* Closes the backing ids left over while the broker was away, through the
 * link that works again. Caller holds broker_lock. */
static void unclosed_flush(struct mountd *md)
{
	size_t done = 0, n;
	int lost[64];

	/* And those sent just before it died, unanswered: maybe not done. */
	while ((n = broker_lost_closes(md->broker, lost, sizeof(lost) / sizeof(lost[0]))) > 0)
		for (size_t k = 0; k < n; k++)
			unclosed_add(md, lost[k]);

	for (; done < md->broker_nunclosed; done++) {
		int rc = broker_backing_close_nowait(md->broker, atomic_load(&md->broker_mount_id),
						     md->broker_unclosed[done]);
		if (broker_gone(rc))
			break; /* gone again: the next relink goes on */
		if (rc < 0)
			log_errno(rc, "cannot close backing id %d through ferry-brokerd",
				  md->broker_unclosed[done]);
		else
			atomic_fetch_add(&md->stats.backing_close, 1);
	}
	if (done) { /* broker_unclosed may be NULL: never allocated */
		memmove(md->broker_unclosed, md->broker_unclosed + done,
			(md->broker_nunclosed - done) * sizeof(*md->broker_unclosed));
		md->broker_nunclosed -= done;
	}
}

/* After a failed call: reconnect and attach our fd again, at most once a
 * second whoever asks. Returns 0 if the link works now. */
static int relink(struct mountd *md)
{
	struct timespec now;
	uint64_t id = 0;
	int rc;

	clock_gettime(CLOCK_MONOTONIC, &now);
	pthread_mutex_lock(&md->broker_lock);
	if (atomic_load(&md->broker_up)) {
		pthread_mutex_unlock(&md->broker_lock);
		return 0; /* another thread relinked meanwhile */
	}
	if (now.tv_sec - md->broker_retry_at < 1) {
		pthread_mutex_unlock(&md->broker_lock);
		return -ENOTCONN;
	}
	md->broker_retry_at = now.tv_sec;
	rc = broker_reconnect(md->broker);
	if (rc == 0)
		rc = broker_attach(md->broker, md->broker_name, fuse_session_fd(md->se), &id);
	if (rc == 0) {
		if (id != atomic_load(&md->broker_mount_id))
			log_info("ferry-brokerd knows the mount as id %llu now (was %llu)",
				 (unsigned long long)id,
				 (unsigned long long)atomic_load(&md->broker_mount_id));
		atomic_store(&md->broker_mount_id, id);
		atomic_store(&md->broker_up, true);
		atomic_fetch_add(&md->stats.broker_relinks, 1);
		log_info("ferry-brokerd at %s is back: passthrough opens go on", md->cfg.broker);
		unclosed_flush(md);
	}
	pthread_mutex_unlock(&md->broker_lock);
	return rc;
}

static void link_lost(struct mountd *md, int rc)
{
	if (atomic_exchange(&md->broker_up, false))
		log_warnx("lost ferry-brokerd at %s (%s): new opens take the daemon path until it "
			  "is back", md->cfg.broker, strerror(-rc));
}

int broker_link_backing_open(struct mountd *md, int fd)
{
	int rc;

	if (!atomic_load(&md->broker_up) && relink(md) < 0)
		return -ENOTCONN;
	rc = broker_backing_open(md->broker, atomic_load(&md->broker_mount_id), fd);
	if (rc > 0 || !broker_gone(rc))
		return rc;
	link_lost(md, rc);
	if (relink(md) < 0)
		return -ENOTCONN;
	rc = broker_backing_open(md->broker, atomic_load(&md->broker_mount_id), fd);
	if (broker_gone(rc)) {
		link_lost(md, rc);
		return -ENOTCONN;
	}
	return rc;
}

int broker_link_backing_open_many(struct mountd *md, const int *fds, size_t n, int *ids)
{
	int rc;

	if (!atomic_load(&md->broker_up) && relink(md) < 0)
		return -ENOTCONN;
	rc = broker_backing_open_many(md->broker, atomic_load(&md->broker_mount_id), fds, n, ids);
	if (broker_gone(rc)) {
		link_lost(md, rc);
		if (relink(md) < 0)
			return -ENOTCONN;
		rc = broker_backing_open_many(md->broker, atomic_load(&md->broker_mount_id), fds,
					      n, ids);
	}
	if (rc == -EOPNOTSUPP) {
		/* A broker without it (or one restarted into an older one). */
		for (size_t k = 0; k < n; k++)
			ids[k] = broker_link_backing_open(md, fds[k]);
		return 0;
	}
	if (broker_gone(rc)) {
		link_lost(md, rc);
		return -ENOTCONN;
	}
	return rc;
}

static int close_one(struct mountd *md, int id);

/* Sends ids[0..n) as one BACKING_CLOSE_MANY, without waiting for the reply
 * (refusals are the broker's to log); what cannot be sent waits for the
 * relink. Counted in stats.backing_close once sent. */
static void closes_send(struct mountd *md, const int *ids, size_t n)
{
	int rc;

	if (atomic_load(&md->broker_mount_id) == 0)
		return; /* unmounted: its ids went with it */
	rc = broker_backing_close_many_nowait(md->broker, atomic_load(&md->broker_mount_id), ids,
					      n);

	if (broker_gone(rc)) {
		link_lost(md, rc);
		if (relink(md) == 0)
			rc = broker_backing_close_many_nowait(md->broker,
							      atomic_load(&md->broker_mount_id),
							      ids, n);
	}
	if (rc == -EOPNOTSUPP) {
		for (size_t k = 0; k < n; k++) {
			rc = close_one(md, ids[k]);
			if (rc < 0)
				log_errno(rc, "cannot close backing id %d through ferry-brokerd",
					  ids[k]);
			else if (rc == 0)
				atomic_fetch_add(&md->stats.backing_close, 1);
		}
		return;
	}
	if (broker_gone(rc)) {
		pthread_mutex_lock(&md->broker_lock);
		for (size_t k = 0; k < n; k++)
			unclosed_add(md, ids[k]);
		pthread_mutex_unlock(&md->broker_lock);
	} else if (rc < 0) {
		log_errno(rc, "cannot close %zu backing ids through ferry-brokerd", n);
	} else {
		atomic_fetch_add(&md->stats.backing_close, n);
	}
}

/* Takes the queue (broker_close_lock held) and sends it unlocked; a flush
 * waits for every batch taken so (broker_close_sending). */
static void closes_take_and_send(struct mountd *md)
{
	int ids[BROKER_CLOSE_MANY_MAX];
	size_t n = md->broker_nclosing;

	if (n == 0)
		return;
	memcpy(ids, md->broker_closing, n * sizeof(*ids));
	md->broker_nclosing = 0;
	md->broker_close_sending++;
	pthread_mutex_unlock(&md->broker_close_lock);
	closes_send(md, ids, n);
	pthread_mutex_lock(&md->broker_close_lock);
	if (--md->broker_close_sending == 0)
		pthread_cond_broadcast(&md->broker_close_sent);
}

static void *close_main(void *arg)
{
	struct mountd *md = arg;

	pthread_mutex_lock(&md->broker_close_lock);
	while (!md->broker_close_stop) {
		struct timespec until;

		if (md->broker_nclosing == 0) {
			pthread_cond_wait(&md->broker_close_cv, &md->broker_close_lock);
			continue;
		}
		/* A batch began: others of the same burst join it. */
		clock_gettime(CLOCK_MONOTONIC, &until);
		until.tv_nsec += CLOSE_BATCH_WAIT_MS * 1000000L;
		if (until.tv_nsec >= 1000000000L) {
			until.tv_sec++;
			until.tv_nsec -= 1000000000L;
		}
		while (!md->broker_close_stop && md->broker_nclosing < BROKER_CLOSE_MANY_MAX &&
		       md->broker_nclosing > 0)
			if (pthread_cond_timedwait(&md->broker_close_cv, &md->broker_close_lock,
						   &until) == ETIMEDOUT)
				break;
		closes_take_and_send(md);
	}
	closes_take_and_send(md);
	pthread_mutex_unlock(&md->broker_close_lock);
	return NULL;
}

void broker_link_flush_closes(struct mountd *md)
{
	if (!md->broker || !md->broker_close_live)
		return;
	pthread_mutex_lock(&md->broker_close_lock);
	closes_take_and_send(md);
	/* And what another thread took before us: sent (or kept for the
	 * relink) when this returns. */
	while (md->broker_close_sending > 0)
		pthread_cond_wait(&md->broker_close_sent, &md->broker_close_lock);
	pthread_mutex_unlock(&md->broker_close_lock);
}

/* Queues id for the next BACKING_CLOSE_MANY: 1. With a broker that has no
 * such request, or no thread to send it, closes it now (close_one). */
int broker_link_backing_close(struct mountd *md, int id)
{
	if (!md->broker_close_live || !(broker_features(md->broker) & BROKER_FEATURE_MANY))
		return close_one(md, id);
	pthread_mutex_lock(&md->broker_close_lock);
	/* Full: the thread has not taken it yet. Others may fill it again
	 * while this one is sent unlocked, hence the loop. */
	while (md->broker_nclosing == BROKER_CLOSE_MANY_MAX)
		closes_take_and_send(md);
	md->broker_closing[md->broker_nclosing++] = id;
	if (md->broker_nclosing == 1 || md->broker_nclosing == BROKER_CLOSE_MANY_MAX)
		pthread_cond_signal(&md->broker_close_cv);
	pthread_mutex_unlock(&md->broker_close_lock);
	return 1;
}

/* Sent without waiting for the reply (a refusal is only logged by the
 * broker): a passthrough file then costs one round trip, at its open. A
 * close that cannot be sent (the broker is away) waits for the relink:
 * returns 1 then. */
static int close_one(struct mountd *md, int id)
{
	int rc = broker_backing_close_nowait(md->broker, atomic_load(&md->broker_mount_id), id);

	if (broker_gone(rc)) {
		link_lost(md, rc);
		if (relink(md) == 0)
			rc = broker_backing_close_nowait(md->broker,
							 atomic_load(&md->broker_mount_id), id);
	}
	if (broker_gone(rc)) {
		/* Not sent: the id is still registered, and stays ours to
		 * close (no one else can be given it meanwhile). */
		pthread_mutex_lock(&md->broker_lock);
		unclosed_add(md, id);
		pthread_mutex_unlock(&md->broker_lock);
		rc = 1;
	}
	return rc;
}

void broker_link_umount(struct mountd *md)
{
	int rc;

	if (!md->broker || !atomic_load(&md->broker_mount_id))
		return;
	broker_link_flush_closes(md); /* ids that go with the mount anyway, but now */
	rc = broker_umount(md->broker, NULL, atomic_load(&md->broker_mount_id));
	if (broker_gone(rc) && relink(md) == 0)
		rc = broker_umount(md->broker, NULL, atomic_load(&md->broker_mount_id));
	/* Already gone: `ferry umount` asked the broker first. */
	if (rc < 0 && rc != -ENOENT)
		log_errno(rc, "ferry-brokerd could not unmount %s%s%s", md->cfg.mountpoint,
			  *refusal() ? ": " : "", refusal());
	atomic_store(&md->broker_mount_id, 0);
}

void broker_link_close(struct mountd *md)
{
	if (md->broker_close_live) {
		pthread_mutex_lock(&md->broker_close_lock);
		md->broker_close_stop = true; /* it sends what is queued, then ends */
		pthread_cond_signal(&md->broker_close_cv);
		pthread_mutex_unlock(&md->broker_close_lock);
		pthread_join(md->broker_close_thread, NULL);
		md->broker_close_live = false;
		pthread_mutex_destroy(&md->broker_close_lock);
		pthread_cond_destroy(&md->broker_close_cv);
		pthread_cond_destroy(&md->broker_close_sent);
	}
	broker_close(md->broker);
	md->broker = NULL;
	free(md->broker_unclosed); /* the unmount let go of every id */
	md->broker_unclosed = NULL;
	md->broker_nunclosed = md->broker_unclosed_cap = 0;
	free(md->broker_name);
	md->broker_name = NULL;
}
