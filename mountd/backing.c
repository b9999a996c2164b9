/*
 * Backing-file registration for FUSE passthrough: the one place that turns
 * a staging fd into a kernel backing id and back. Without --broker it
 * issues the ioctls on the session's /dev/fuse fd itself (which needs
 * CAP_SYS_ADMIN); with it, ferry-brokerd does (broker_link.c).
 *
 * The first EPERM latches passthrough off for the mount, logged once with
 * what to do; any other error (a broker that is away, a limit) fails only
 * the open that asked, which then takes the daemon path.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>

#include "fuse_backing.h"
#include "log.h"
#include "mountd.h"


void passthrough_latch_off(struct mountd *md, const char *code, const char *why)
{
	bool was = atomic_exchange(&md->pt_off, true);

	if (was)
		return;
	pthread_mutex_lock(&md->pt_reason_lock);
	snprintf(md->pt_reason, sizeof(md->pt_reason), "%s", code);
	pthread_mutex_unlock(&md->pt_reason_lock);
	log_warnx("passthrough is off for this mount: %s; writes take the daemon path", why);
}

void passthrough_set_reason(struct mountd *md, const char *code, const char *why)
{
	atomic_store(&md->pt_off, true);
	pthread_mutex_lock(&md->pt_reason_lock);
	snprintf(md->pt_reason, sizeof(md->pt_reason), "%s", code);
	pthread_mutex_unlock(&md->pt_reason_lock);
	log_info("passthrough: %s", why);
}

void passthrough_unavailable(struct mountd *md, uint64_t ino, int err)
{
	/* EPERM latched passthrough off, logged once there; ENOTCONN is a
	 * broker that is away, logged once by broker_link.c. Any other cause
	 * (a read-only or failing staging disk) would otherwise log every
	 * open for as long as it lasts. */
	if (err == -EPERM || err == -ENOTCONN)
		return;
	if (atomic_exchange(&md->pt_unavailable, err) != err)
		log_errno(err, "inode %llu: no passthrough for this open (nor for later ones, "
			  "while this lasts: they take the daemon path)", (unsigned long long)ino);
}

static int backing_ioctl(struct mountd *md, int fd)
{
	struct ferry_backing_map map = { .fd = fd };
	int id = ioctl(fuse_session_fd(md->se), FERRY_DEV_IOC_BACKING_OPEN, &map);

	return id < 0 ? -errno : id == 0 ? -EIO : id;
}

/* Counts what a registration gave, and latches passthrough off on EPERM. */
static int backing_result(struct mountd *md, int id)
{
	if (id > 0) {
		atomic_fetch_add(&md->stats.backing_open, 1);
		/* Passthrough works again: the next failure is news. */
		if (atomic_load(&md->pt_unavailable))
			atomic_store(&md->pt_unavailable, 0);
		return id;
	}
	if (id == -EPERM) {
		if (md->cfg.broker)
			passthrough_latch_off(md, "eperm_from_broker",
					      "ferry-brokerd refused to register a backing file "
					      "(see its log; its policy decides)");
		else
			passthrough_latch_off(md, "eperm_needs_CAP_SYS_ADMIN",
					      "registering a backing file needs CAP_SYS_ADMIN "
					      "(give ferry-mountd the capability, or mount through "
					      "ferry-brokerd)");
	}
	return id;
}

int backing_open(struct mountd *md, int fd)
{
	return backing_result(md, md->cfg.broker ? broker_link_backing_open(md, fd)
						  : backing_ioctl(md, fd));
}

void backing_open_many(struct mountd *md, const int *fds, size_t n, int *ids)
{
	int rc = 0;

	if (md->cfg.broker)
		rc = broker_link_backing_open_many(md, fds, n, ids);
	else
		for (size_t k = 0; k < n; k++)
			ids[k] = backing_ioctl(md, fds[k]);
	for (size_t k = 0; k < n; k++)
		ids[k] = backing_result(md, rc < 0 ? rc : ids[k]);
}

void backing_close(struct mountd *md, int id)
{
	uint32_t bid = (uint32_t)id;

	if (id <= 0)
		return;
	if (md->cfg.broker) {
		int rc = broker_link_backing_close(md, id);
		if (rc < 0)
			log_errno(rc, "cannot close backing id %d through ferry-brokerd", id);
		else if (rc == 0) /* 1: closed after the relink, counted then */
			atomic_fetch_add(&md->stats.backing_close, 1);
		return;
	}
	if (ioctl(fuse_session_fd(md->se), FERRY_DEV_IOC_BACKING_CLOSE, &bid) < 0)
		log_warn("cannot close backing id %d", id);
	else
		atomic_fetch_add(&md->stats.backing_close, 1);
}
