/*
 * backing: BACKING_OPEN and BACKING_CLOSE (one file or id each, or up to
 * BROKER_FDS_MAX files / BROKER_CLOSE_MANY_MAX ids with _MANY), the
 * confused-deputy end of the broker.
 *
 * The kernel keeps the credentials of whoever issues
 * FUSE_DEV_IOC_BACKING_OPEN and, for every passthrough open, opens the
 * backing file again with the FUSE file's open flags and does its I/O with
 * those credentials (fs/fuse/passthrough.c, backing_file_open). Registered
 * by a root broker, a file the peer could only read would become writable
 * with root's rights. So a backing fd must be: a regular file, owned by the
 * peer, with one link, open read-write (not O_PATH, not O_APPEND), neither
 * append-only nor immutable (statx attributes; a file system that cannot
 * say is refused), not on FUSE or overlayfs; and the ioctl runs with
 * fsuid/fsgid switched to the peer's and no supplementary groups (privs.c),
 * so the I/O is the peer's. The checks never reach a FUSE server
 * (fsprobe.c).
 *
 * Bookkeeping: each mount holds the set of ids registered through it (an
 * idset), counted against the owner's max_backing. BACKING_CLOSE takes only
 * an id in that set -- except on a mount adopted after a broker restart,
 * whose earlier ids the broker cannot know: there an id of that mount's own
 * connection may be closed too, so a reconnected ferry-mountd can release
 * what it registered before (it is the owner's connection either way).
 * When a peer disconnects nothing is forgotten: the ids stay registered in
 * the kernel and in the mount's set (mountd may reconnect and close them);
 * they go when the mount goes.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include "brokerd.h"
#include "fuse_backing.h"
#include "log.h"

/* broker_rep.fds_safe has a bit per fd of a request. */
_Static_assert(BROKER_FDS_MAX <= 32, "fds_safe is a 32-bit mask");


#ifndef STATX_MNT_ID_UNIQUE
#define STATX_MNT_ID_UNIQUE 0x00004000U
#endif

static const char *kind(mode_t mode)
{
	switch (mode & S_IFMT) {
	case S_IFDIR: return "a directory";
	case S_IFCHR: return "a character device";
	case S_IFBLK: return "a block device";
	case S_IFSOCK: return "a socket";
	case S_IFIFO: return "a pipe";
	case S_IFLNK: return "a symlink";
	default: return "a special file (an anonymous inode such as an eventfd or pidfd?)";
	}
}

/* Is fd a file the peer may have registered? 0, or a refusal with why. */
static int backing_fd_check(struct broker *b, const struct peer *p, int fd, char *err,
			    size_t errlen)
{
	struct statx sx;
	uint64_t mnt_id;
	int fl, rc;

	uint32_t old_mnt_id;

	/* The reusable mount id first (mountinfo's), then the unique one. */
	if (statx(fd, "", AT_EMPTY_PATH | AT_STATX_DONT_SYNC, STATX_MNT_ID, &sx) < 0 ||
	    !(sx.stx_mask & STATX_MNT_ID))
		sx.stx_mnt_id = 0;
	old_mnt_id = (uint32_t)sx.stx_mnt_id;
	if (statx(fd, "", AT_EMPTY_PATH | AT_STATX_DONT_SYNC,
		  STATX_TYPE | STATX_UID | STATX_NLINK | STATX_MNT_ID_UNIQUE, &sx) < 0) {
		int rc = -errno;
		/* A FUSE mount that does not admit us says so without asking. */
		snprintf(err, errlen, "cannot examine the file: %s%s", strerror(-rc),
			 rc == -EACCES ? " (a file on a FUSE mount?)" : "");
		return rc;
	}
	if (!S_ISREG(sx.stx_mode)) {
		snprintf(err, errlen, "the fd is %s, not a regular file", kind(sx.stx_mode));
		return -EINVAL;
	}
	if (sx.stx_uid != p->uid) {
		snprintf(err, errlen, "the file is owned by uid %u, not by the peer's uid %d",
			 sx.stx_uid, (int)p->uid);
		return -EPERM;
	}
	if (sx.stx_nlink != 1) {
		snprintf(err, errlen, "the file has %u links, not 1", sx.stx_nlink);
		return -EMLINK;
	}
	fl = fcntl(fd, F_GETFL);
	if (fl < 0 || (fl & O_PATH) || (fl & O_ACCMODE) != O_RDWR) {
		snprintf(err, errlen, "the fd is not open read-write");
		return -EBADF;
	}
	/* Passthrough I/O goes to a file of the kernel's own, opened again
	 * with the FUSE file's flags: an fd's O_APPEND would not carry over,
	 * nor would an append-only file's rule, which the kernel enforces at
	 * open (and the peer's fd may predate the attribute). */
	if (fl & O_APPEND) {
		snprintf(err, errlen, "the fd is open with O_APPEND, which passthrough writes "
			 "would not keep");
		return -EINVAL;
	}
	mnt_id = (sx.stx_mask & STATX_MNT_ID_UNIQUE) ? sx.stx_mnt_id : 0;
	rc = fsprobe_fs_forbidden(b, p->pid, makedev(sx.stx_dev_major, sx.stx_dev_minor), mnt_id,
				  old_mnt_id, err, errlen);
	if (rc < 0)
		return rc;
	if ((sx.stx_attributes_mask & (STATX_ATTR_APPEND | STATX_ATTR_IMMUTABLE)) !=
	    (STATX_ATTR_APPEND | STATX_ATTR_IMMUTABLE)) {
		snprintf(err, errlen, "the file system does not say whether the file is "
			 "append-only or immutable");
		return -EOPNOTSUPP;
	}
	if (sx.stx_attributes & (STATX_ATTR_APPEND | STATX_ATTR_IMMUTABLE)) {
		snprintf(err, errlen, "the file is %s (chattr +%c): passthrough writes would "
			 "bypass that", (sx.stx_attributes & STATX_ATTR_IMMUTABLE) ? "immutable" :
			 "append-only", (sx.stx_attributes & STATX_ATTR_IMMUTABLE) ? 'i' : 'a');
		return -EPERM;
	}
	return 0;
}

/* The peer's mount id: the mount, or a refusal. */
static int peer_mount(struct broker *b, const struct peer *p, uint64_t id, struct bmount **out,
		      char *err, size_t errlen)
{
	struct bmount *m = mount_find_id(b, id);

	*out = NULL;
	/* Another tenant's mount is, to this peer, no mount at all. */
	if (!m || m->owner != p->owner) {
		snprintf(err, errlen, "no mount %" PRIu64 " of this peer's", id);
		return -ENOENT;
	}
	if (m->fuse_fd < 0) {
		snprintf(err, errlen, "the broker holds no /dev/fuse fd for mount %" PRIu64 " (it "
			 "restarted): ATTACH the mount's fd first", id);
		return -EBADFD;
	}
	*out = m;
	return 0;
}

/* Counts a backing id the kernel gave for m, or closes it again if it
 * cannot be kept track of: 0 or a refusal with why. */
static int backing_keep(struct broker *b, const struct peer *p, struct bmount *m, int id,
			char *err, size_t errlen)
{
	int rc;

	if (id <= 0) {
		rc = id == 0 ? -EIO : id;
		snprintf(err, errlen, "FUSE_DEV_IOC_BACKING_OPEN: %s%s", strerror(-rc),
			 rc == -EPERM ? " (did the FUSE server enable passthrough at INIT?)" : "");
		return rc;
	}
	rc = idset_add(&m->ids, (uint32_t)id);
	if (rc < 0) {
		uint32_t bid = (uint32_t)id;

		/* Not kept track of: not kept at all. */
		if (ioctl(m->fuse_fd, FERRY_DEV_IOC_BACKING_CLOSE, &bid) < 0)
			log_warn("mount %" PRIu64 ": cannot close backing id %d again", m->id, id);
		snprintf(err, errlen, "%s", rc == -EEXIST ? "the kernel returned a live id twice"
							  : strerror(-rc));
		return rc == -EEXIST ? -EIO : rc;
	}
	p->owner->nbacking++;
	b->nbacking++;
	return 0;
}

/* The ioctl, with the peer's file-system identity: its id, or -errno. */
static int backing_ioctl(const struct bmount *m, int fd)
{
	struct ferry_backing_map map = { .fd = fd };
	int id = ioctl(m->fuse_fd, FERRY_DEV_IOC_BACKING_OPEN, &map);

	return id < 0 ? -errno : id;
}

static int quota_check(const struct peer *p, unsigned more, char *err, size_t errlen)
{
	if (p->owner->nbacking + more >= p->rule->max_backing) {
		snprintf(err, errlen, "uid %d has %u live backing ids, its limit (policy line %u)",
			 (int)p->uid, p->owner->nbacking + more, p->rule->line);
		return -EDQUOT;
	}
	return 0;
}

int handle_backing_open(struct broker *b, struct conn *c, const struct broker_req *q,
			const int *fds, size_t nfds, struct broker_rep *rep)
{
	const struct peer *p = conn_peer(c);
	char *err = rep->message;
	const size_t errlen = sizeof(rep->message);
	struct bmount *m;
	int id, rc;

	(void)nfds; /* 1: broker_request_parse() */
	rc = peer_mount(b, p, q->mount_id, &m, err, errlen);
	if (rc < 0)
		return rc;
	rc = quota_check(p, 0, err, errlen);
	if (rc < 0)
		return rc;
	rc = backing_fd_check(b, p, fds[0], err, errlen);
	if (rc < 0)
		return rc;
	rep->fds_safe = 1; /* a regular file on neither FUSE nor overlayfs */
	rc = privs_become(p->uid, p->gid);
	if (rc < 0) {
		snprintf(err, errlen, "cannot take the peer's file-system identity: %s",
			 strerror(-rc));
		return rc;
	}
	id = backing_ioctl(m, fds[0]);
	privs_restore();
	rc = backing_keep(b, p, m, id, err, errlen);
	if (rc < 0)
		return rc;
	rep->backing_id = (uint32_t)id;
	return 0;
}

/*
 * BACKING_OPEN_MANY: every fd checked by itself, as BACKING_OPEN does, and
 * a refusal of one is its own result, not the others'. The checks run
 * first, then one switch of identity covers the ioctls of all that passed:
 * the switch (two capsets, four setfs*id calls) and the frame round trip
 * are what one file at a time paid for each.
 */
int handle_backing_open_many(struct broker *b, struct conn *c, const struct broker_req *q,
			     const int *fds, size_t nfds, struct broker_rep *rep)
{
	const struct peer *p = conn_peer(c);
	char why[BROKER_MSG_MAX];
	int ids[BROKER_FDS_MAX] = { 0 };
	unsigned passed = 0;
	struct bmount *m;
	int rc;

	rc = peer_mount(b, p, q->mount_id, &m, rep->message, sizeof(rep->message));
	if (rc < 0)
		return rc;
	rep->nmany = nfds;
	for (size_t k = 0; k < nfds; k++) {
		rc = quota_check(p, passed, why, sizeof(why));
		if (rc == 0)
			rc = backing_fd_check(b, p, fds[k], why, sizeof(why));
		if (rc == 0) {
			rep->fds_safe |= 1u << k;
			passed++;
		} else if (!rep->message[0]) {
			snprintf(rep->message, sizeof(rep->message), "fd %zu: %.200s", k, why);
		}
		rep->many_errors[k] = rc;
	}
	if (passed == 0)
		return 0;
	rc = privs_become(p->uid, p->gid);
	for (size_t k = 0; k < nfds; k++)
		if (rep->many_errors[k] == 0)
			ids[k] = rc < 0 ? rc : backing_ioctl(m, fds[k]);
	if (rc == 0)
		privs_restore();
	else
		snprintf(why, sizeof(why), "cannot take the peer's file-system identity: %s",
			 strerror(-rc));
	for (size_t k = 0; k < nfds; k++) {
		if (rep->many_errors[k] < 0)
			continue;
		if (rc == 0)
			rep->many_errors[k] = backing_keep(b, p, m, ids[k], why, sizeof(why));
		else
			rep->many_errors[k] = rc;
		if (rep->many_errors[k] == 0)
			rep->many_ids[k] = (uint32_t)ids[k];
		else if (!rep->message[0])
			snprintf(rep->message, sizeof(rep->message), "fd %zu: %.200s", k, why);
	}
	return 0;
}

/* Closes bid of m for the peer: 0 or a refusal with why. */
static int backing_unregister(struct broker *b, struct bmount *m, uint32_t bid, char *err,
			      size_t errlen)
{
	bool known = idset_has(&m->ids, bid);
	int rc = 0;

	if (!known && !m->adopted) {
		snprintf(err, errlen, "backing id %" PRIu32 " was not registered by this peer on "
			 "mount %" PRIu64, bid, m->id);
		return -ENOENT;
	}
	if (ioctl(m->fuse_fd, FERRY_DEV_IOC_BACKING_CLOSE, &bid) < 0) {
		rc = -errno;
		snprintf(err, errlen, "FUSE_DEV_IOC_BACKING_CLOSE %" PRIu32 ": %s", bid,
			 strerror(-rc));
		if (rc != -ENOENT || !known)
			return rc;
		/* The kernel no longer has it: neither do we, and that is what
		 * the peer asked for. */
		rc = 0;
		err[0] = '\0';
	}
	if (known) {
		idset_del(&m->ids, bid);
		m->owner->nbacking--;
		b->nbacking--;
	}
	return rc;
}

int handle_backing_close(struct broker *b, struct conn *c, const struct broker_req *q,
			 const int *fds, size_t nfds, struct broker_rep *rep)
{
	struct bmount *m;
	int rc;

	(void)fds;
	(void)nfds;
	rc = peer_mount(b, conn_peer(c), q->mount_id, &m, rep->message, sizeof(rep->message));
	if (rc < 0)
		return rc;
	return backing_unregister(b, m, q->backing_id, rep->message, sizeof(rep->message));
}

int handle_backing_close_many(struct broker *b, struct conn *c, const struct broker_req *q,
			      const int *fds, size_t nfds, struct broker_rep *rep)
{
	char why[BROKER_MSG_MAX];
	struct bmount *m;
	int rc;

	(void)fds;
	(void)nfds;
	rc = peer_mount(b, conn_peer(c), q->mount_id, &m, rep->message, sizeof(rep->message));
	if (rc < 0)
		return rc;
	rep->nmany = q->nids;
	for (size_t k = 0; k < q->nids; k++) {
		rep->many_errors[k] = backing_unregister(b, m, q->backing_ids[k], why, sizeof(why));
		if (rep->many_errors[k] < 0 && !rep->message[0])
			snprintf(rep->message, sizeof(rep->message), "id %zu: %.200s", k, why);
	}
	return 0;
}
