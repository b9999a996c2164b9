/*
 * mount: MOUNT, UMOUNT and ATTACH.
 *
 * A name is resolved beneath the peer's policy root with openat2()
 * (RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS, and
 * RESOLVE_NO_XDEV up to the target), as the peer (fsuid/fsgid), so it can
 * reach no more than the peer could. The mount goes onto the resolved fd
 * with the new mount API -- fsopen("fuse"), fsconfig(), fsmount() with
 * nosuid,nodev forced as mount attributes, move_mount() with
 * MOVE_MOUNT_T_EMPTY_PATH -- so a symlink swapped in after the resolution
 * cannot redirect it: no path is looked up again. fd=, rootmode=, user_id=
 * and group_id= are the broker's.
 *
 * The directory fd is the peer's, and a rename can carry it anywhere on its
 * file system between resolution and move_mount(); so the new mount is
 * looked for again at its name beneath the root (mount_verify) and undone
 * if it is not there. The reap (mount_table.c) follows mounts whose
 * directories are renamed later, and undoes those carried out of the root.
 *
 * UMOUNT takes only a mount this broker made for the same owner, resolves
 * its name again (stepping onto the mount at the last component), checks
 * that the mount there is still that one (unique mount id, mountinfo id,
 * st_dev, mount root) and detaches it through /proc/self/fd/N of that fd.
 *
 * Nothing here looks inside a FUSE mount (see fsprobe.c).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <linux/openat2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

#include "brokerd.h"
#include "log.h"

#ifndef SYS_openat2
#define SYS_openat2 437
#endif
#define FUSE_DEV_MAJOR 10
#define FUSE_DEV_MINOR 229
#define RESOLVE_TRIES 8

static int openat2_(int dirfd, const char *path, uint64_t flags, uint64_t resolve)
{
	struct open_how how = { .flags = flags, .resolve = resolve };
	int fd, tries = 0;

	do
		fd = (int)syscall(SYS_openat2, dirfd, path, &how, sizeof(how));
	while (fd < 0 && errno == EAGAIN && ++tries < RESOLVE_TRIES); /* a rename raced */
	return fd < 0 ? -errno : fd;
}

static int resolve_error(int rc, const char *name, char *err, size_t errlen)
{
	switch (rc) {
	case -ELOOP:
		snprintf(err, errlen, "%.128s: a symlink is in the way (none are followed)", name);
		break;
	case -EXDEV:
		snprintf(err, errlen, "%.128s: leaves the policy root or crosses a mount", name);
		break;
	case -ENOENT:
		snprintf(err, errlen, "%.128s: no such directory beneath the policy root", name);
		break;
	case -ENOTDIR:
		snprintf(err, errlen, "%.128s: not a directory", name);
		break;
	case -EACCES:
		snprintf(err, errlen, "%.128s: the peer itself cannot reach it", name);
		break;
	case -EAGAIN:
		snprintf(err, errlen, "%.128s: kept changing while being resolved", name);
		break;
	default:
		snprintf(err, errlen, "%.128s: %s", name, strerror(-rc));
		break;
	}
	return rc;
}

int resolve_beneath(const char *root, uid_t uid, gid_t gid, const char *name, bool mount_root,
		    int *out, char *err, size_t errlen)
{
	/* No O_NOFOLLOW: with RESOLVE_NO_SYMLINKS a symlink as the last
	 * component is refused (ELOOP) instead of opened as itself. */
	const uint64_t flags = O_PATH | O_DIRECTORY | O_CLOEXEC;
	const uint64_t beneath = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
	const char *slash = strrchr(name, '/');
	int rootfd = -1, parent = -1, fd = -1, rc;

	*out = -1;
	rc = privs_become(uid, gid);
	if (rc < 0) {
		snprintf(err, errlen, "cannot take uid %d's file-system identity: %s", (int)uid,
			 strerror(-rc));
		return rc;
	}
	rootfd = open(root, O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (rootfd < 0) {
		rc = -errno;
		snprintf(err, errlen, "policy root %s: %s", root, strerror(-rc));
		goto out;
	}
	if (!mount_root) {
		fd = openat2_(rootfd, name, flags, beneath | RESOLVE_NO_XDEV);
	} else {
		if (slash) {
			char dir[BROKER_NAME_MAX + 1];

			snprintf(dir, sizeof(dir), "%.*s", (int)(slash - name), name);
			parent = openat2_(rootfd, dir, flags, beneath | RESOLVE_NO_XDEV);
			if (parent < 0) {
				rc = resolve_error(parent, name, err, errlen);
				goto out;
			}
		}
		/* The last step alone may step onto a mount. */
		fd = openat2_(parent >= 0 ? parent : rootfd, slash ? slash + 1 : name, flags,
			      beneath);
	}
	if (fd < 0) {
		rc = resolve_error(fd, name, err, errlen);
		goto out;
	}
	*out = fd;
	rc = 0;
out:
	if (parent >= 0)
		close(parent);
	if (rootfd >= 0)
		close(rootfd);
	privs_restore();
	return rc;
}

int mount_verify(const struct bmount *m, gid_t gid, int *out, char *err, size_t errlen)
{
	struct mnt_ident id;
	int fd, rc;

	*out = -1;
	rc = resolve_beneath(m->owner->root, m->owner->uid, gid, m->name, true, &fd, err, errlen);
	if (rc < 0)
		return rc;
	rc = fsprobe_mount_ident(fd, &id);
	if (rc < 0) {
		snprintf(err, errlen, "%.128s: cannot identify its mount: %s", m->name, strerror(-rc));
		close(fd);
		return rc;
	}
	if (!id.is_root || id.id != m->id || id.old_id != m->old_id || id.dev != m->dev) {
		snprintf(err, errlen, "%.128s is not mount %" PRIu64 " any more", m->name, m->id);
		close(fd);
		return -ESTALE;
	}
	*out = fd;
	return 0;
}

/* Room for one more mount of this owner? Forgets vanished mounts first. */
static int mount_room(struct broker *b, const struct peer *p, char *err, size_t errlen)
{
	if (p->owner->nmounts >= p->rule->max_mounts)
		mount_reap(b);
	if (p->owner->nmounts >= p->rule->max_mounts) {
		snprintf(err, errlen, "uid %d has %u mounts, its limit (policy line %u)", (int)p->uid,
			 p->owner->nmounts, p->rule->line);
		return -EDQUOT;
	}
	return 0;
}

/* fsconfig() with the file-system context's own words on failure. */
static int cfg(int fs, unsigned cmd, const char *key, const char *val, char *err, size_t errlen)
{
	char log[128];
	ssize_t n;
	int rc;

	if (fsconfig(fs, cmd, key, val, 0) == 0)
		return 0;
	rc = -errno;
	n = read(fs, log, sizeof(log) - 1);
	if (n > 0) {
		log[n] = '\0';
		log[strcspn(log, "\n")] = '\0';
	}
	snprintf(err, errlen, "fsconfig %s: %s%s%s", key ? key : "create", strerror(-rc),
		 n > 0 ? ": " : "", n > 0 ? log : "");
	return rc;
}

/* Makes the FUSE mount on target (an O_PATH fd): *mfd is the new mount's
 * fd (attached), *ident its identity. */
static int do_mount(const struct peer *p, const struct mount_opts *o, int target,
		    mode_t rootmode, int fuse_fd, int *mfd, struct mnt_ident *ident, char *err,
		    size_t errlen)
{
	char num[32];
	unsigned attr = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
	int fs, mnt = -1, rc;

	*mfd = -1;
	fs = fsopen("fuse", FSOPEN_CLOEXEC);
	if (fs < 0) {
		rc = -errno;
		snprintf(err, errlen, "fsopen fuse: %s", strerror(-rc));
		return rc;
	}
	snprintf(num, sizeof(num), "%d", fuse_fd);
	rc = cfg(fs, FSCONFIG_SET_STRING, "source", o->fsname[0] ? o->fsname : "ferry", err, errlen);
	if (rc == 0 && o->subtype[0])
		rc = cfg(fs, FSCONFIG_SET_STRING, "subtype", o->subtype, err, errlen);
	if (rc == 0)
		rc = cfg(fs, FSCONFIG_SET_STRING, "fd", num, err, errlen);
	if (rc == 0) {
		snprintf(num, sizeof(num), "%o", (unsigned)(rootmode & S_IFMT));
		rc = cfg(fs, FSCONFIG_SET_STRING, "rootmode", num, err, errlen);
	}
	if (rc == 0) {
		snprintf(num, sizeof(num), "%u", (unsigned)p->uid);
		rc = cfg(fs, FSCONFIG_SET_STRING, "user_id", num, err, errlen);
	}
	if (rc == 0) {
		snprintf(num, sizeof(num), "%u", (unsigned)p->gid);
		rc = cfg(fs, FSCONFIG_SET_STRING, "group_id", num, err, errlen);
	}
	if (rc == 0 && o->default_permissions)
		rc = cfg(fs, FSCONFIG_SET_FLAG, "default_permissions", NULL, err, errlen);
	if (rc == 0 && o->allow_other)
		rc = cfg(fs, FSCONFIG_SET_FLAG, "allow_other", NULL, err, errlen);
	if (rc == 0 && o->max_read) {
		snprintf(num, sizeof(num), "%u", o->max_read);
		rc = cfg(fs, FSCONFIG_SET_STRING, "max_read", num, err, errlen);
	}
	if (rc == 0)
		rc = cfg(fs, FSCONFIG_CMD_CREATE, NULL, NULL, err, errlen);
	if (rc < 0)
		goto out;
	if (o->ro)
		attr |= MOUNT_ATTR_RDONLY;
	if (o->noexec)
		attr |= MOUNT_ATTR_NOEXEC;
	if (o->noatime)
		attr |= MOUNT_ATTR_NOATIME;
	if (o->nodiratime)
		attr |= MOUNT_ATTR_NODIRATIME;
	mnt = fsmount(fs, FSMOUNT_CLOEXEC, attr);
	if (mnt < 0) {
		rc = -errno;
		snprintf(err, errlen, "fsmount: %s", strerror(-rc));
		goto out;
	}
	rc = fsprobe_mount_ident(mnt, ident);
	if (rc < 0) {
		snprintf(err, errlen, "cannot identify the new mount: %s", strerror(-rc));
		goto out;
	}
	if (move_mount(mnt, "", target, "", MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH) < 0) {
		rc = -errno;
		snprintf(err, errlen, "move_mount: %s", strerror(-rc));
		goto out;
	}
	*mfd = mnt;
	mnt = -1;
out:
	if (mnt >= 0)
		close(mnt); /* never attached: the super block goes with it */
	close(fs);
	return rc;
}

/* Detaches the mount whose root fd is (an O_PATH fd of ours). */
static int detach(int fd)
{
	char path[64];

	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	return umount2(path, MNT_DETACH) < 0 ? -errno : 0;
}

int handle_mount(struct broker *b, struct conn *c, const struct broker_req *q,
		 const int *fds, size_t nfds, struct broker_rep *rep)
{
	const struct peer *p = conn_peer(c);
	char *err = rep->message;
	const size_t errlen = sizeof(rep->message);
	struct bmount *m = NULL;
	struct mnt_ident ident;
	struct statx sx;
	int target = -1, fuse_fd = -1, reply_fd = -1, mfd = -1, root = -1, rc;

	(void)fds;
	(void)nfds;
	if ((m = mount_find_name(p->owner, q->name))) {
		if (mount_is_live(m) != 0) {
			snprintf(err, errlen, "%.128s is mount %" PRIu64 " of this broker already",
				 q->name, m->id);
			return -EBUSY;
		}
		mount_forget(b, m, "unmounted by someone else");
		m = NULL;
	}
	rc = mount_room(b, p, err, errlen);
	if (rc < 0)
		return rc;
	rc = resolve_beneath(p->rule->root, p->uid, p->gid, q->name, false, &target, err, errlen);
	if (rc < 0)
		return rc;
	if (statx(target, "", AT_EMPTY_PATH | AT_STATX_DONT_SYNC, STATX_TYPE | STATX_UID, &sx) < 0) {
		rc = -errno;
		snprintf(err, errlen, "%.128s: %s", q->name, strerror(-rc));
		goto out;
	}
	if (!S_ISDIR(sx.stx_mode)) {
		rc = -ENOTDIR;
		snprintf(err, errlen, "%.128s: not a directory", q->name);
		goto out;
	}
	if (sx.stx_uid != p->uid) {
		rc = -EPERM;
		snprintf(err, errlen, "%.128s is owned by uid %u, not by the peer's uid %d", q->name,
			 sx.stx_uid, (int)p->uid);
		goto out;
	}
	fuse_fd = open("/dev/fuse", O_RDWR | O_CLOEXEC);
	if (fuse_fd < 0) {
		rc = -errno;
		snprintf(err, errlen, "/dev/fuse: %s", strerror(-rc));
		goto out;
	}
	reply_fd = fcntl(fuse_fd, F_DUPFD_CLOEXEC, 3);
	m = calloc(1, sizeof(*m));
	if (reply_fd < 0 || !m || !(m->name = strdup(q->name)) ||
	    (p->cgroup && !(m->cgroup = strdup(p->cgroup)))) {
		rc = reply_fd < 0 ? -errno : -ENOMEM;
		snprintf(err, errlen, "%s", strerror(-rc));
		goto out;
	}
	rc = do_mount(p, &q->opts, target, sx.stx_mode, fuse_fd, &mfd, &ident, err, errlen);
	if (rc < 0)
		goto out;
	m->id = ident.id;
	m->old_id = ident.old_id;
	m->dev = ident.dev;
	m->owner = p->owner;
	m->gid = p->gid;
	m->fuse_fd = fuse_fd;
	m->made = true;
	m->created = time(NULL);
	/* The target was a directory fd, and the peer may have renamed that
	 * directory anywhere before move_mount() took it: is the mount where
	 * the name says, beneath the root? If not, it is undone. */
	rc = mount_verify(m, p->gid, &root, err, errlen);
	if (rc < 0) {
		int drc = detach(mfd);

		m->fuse_fd = -1;
		if (drc < 0) {
			log_errno(drc, "uid %d: cannot detach mount %" PRIu64 ", which moved while "
				  "it was being made", (int)p->uid, m->id);
			snprintf(err, errlen, "%.128s moved while it was being mounted, and the "
				 "mount cannot be undone: %s", q->name, strerror(-drc));
		} else {
			log_warnx("uid %d: %s moved while it was being mounted (%s): mount undone",
				  (int)p->uid, q->name, err);
			snprintf(err, errlen, "%.128s moved while it was being mounted; not mounted",
				 q->name);
		}
		rc = -EXDEV;
		goto out;
	}
	close(root);
	root = -1;
	rc = mount_table_write(b, m);
	if (rc < 0) {
		snprintf(err, errlen, "cannot record the mount in %s: %s; not mounted", b->state_dir,
			 strerror(-rc));
		if (detach(mfd) < 0)
			log_warn("cannot detach the unrecorded mount %" PRIu64, m->id);
		m->fuse_fd = -1;
		goto out;
	}
	fuse_fd = -1;
	m->server = c;
	mount_table_add(b, m);
	rep->mount_id = m->id;
	rep->fd = reply_fd;
	reply_fd = -1;
	m = NULL;
out:
	if (m) {
		free(m->name);
		free(m->cgroup);
		free(m);
	}
	if (mfd >= 0)
		close(mfd);
	if (root >= 0)
		close(root);
	if (reply_fd >= 0)
		close(reply_fd);
	if (fuse_fd >= 0)
		close(fuse_fd);
	if (target >= 0)
		close(target);
	return rc;
}

int handle_umount(struct broker *b, struct conn *c, const struct broker_req *q,
		  const int *fds, size_t nfds, struct broker_rep *rep)
{
	const struct peer *p = conn_peer(c);
	char *err = rep->message;
	const size_t errlen = sizeof(rep->message);
	struct bmount *m;
	int root = -1, rc;

	(void)fds;
	(void)nfds;
	m = q->has_name ? mount_find_name(p->owner, q->name) : mount_find_id(b, q->mount_id);
	/* Another tenant's mount is, to this peer, no mount at all. */
	if (!m || m->owner != p->owner) {
		if (q->has_name)
			snprintf(err, errlen, "no mount of this peer's at %.128s", q->name);
		else
			snprintf(err, errlen, "no mount %" PRIu64 " of this peer's", q->mount_id);
		return -ENOENT;
	}
	if (!m->made) {
		snprintf(err, errlen, "mount %" PRIu64 " was not made by this broker: unmount it "
			 "the way it was mounted", m->id);
		return -EPERM;
	}
	rc = mount_verify(m, p->gid, &root, err, errlen);
	if (rc < 0) {
		/* Gone already (someone else unmounted it)? Then it is done. */
		if (mount_is_live(m) == 0) {
			snprintf(err, errlen, "mount %" PRIu64 " was unmounted already", m->id);
			mount_forget(b, m, "unmounted already");
			return 0;
		}
		return rc;
	}
	rc = detach(root);
	close(root);
	if (rc < 0) {
		snprintf(err, errlen, "umount %.128s: %s", m->name, strerror(-rc));
		return rc;
	}
	rep->mount_id = m->id;
	mount_forget(b, m, "unmounted at the peer's request");
	return 0;
}

int handle_reattach(struct broker *b, struct conn *c, const struct broker_req *q,
		    const int *fds, size_t nfds, struct broker_rep *rep)
{
	const struct peer *p = conn_peer(c);
	char *err = rep->message;
	const size_t errlen = sizeof(rep->message);
	struct bmount *m = mount_find_name(p->owner, q->name);
	int root = -1, dup_fd, rc;

	(void)b;
	(void)fds;
	(void)nfds;
	if (!m) {
		snprintf(err, errlen, "no mount of this peer's at %.128s", q->name);
		return -ENOENT;
	}
	if (m->server) {
		/* Two daemons reading one FUSE connection would split its
		 * requests between them. */
		snprintf(err, errlen, "%.128s is served by a live ferry-mountd (pid %d)", q->name,
			 (int)conn_peer(m->server)->pid);
		return -EBUSY;
	}
	if (m->fuse_fd < 0) {
		snprintf(err, errlen, "the broker has no FUSE fd for %.128s (it restarted after the "
			 "daemon was gone): unmount it (ferry umount --broker) and mount again", q->name);
		return -ENOTCONN;
	}
	rc = mount_verify(m, p->gid, &root, err, errlen);
	if (rc < 0)
		return rc;
	close(root);
	dup_fd = fcntl(m->fuse_fd, F_DUPFD_CLOEXEC, 3);
	if (dup_fd < 0) {
		rc = -errno;
		snprintf(err, errlen, "dup: %s", strerror(-rc));
		return rc;
	}
	m->server = c;
	rep->mount_id = m->id;
	rep->fd = dup_fd;
	return 0;
}

int handle_attach(struct broker *b, struct conn *c, const struct broker_req *q,
		  const int *fds, size_t nfds, struct broker_rep *rep)
{
	const struct peer *p = conn_peer(c);
	char *err = rep->message;
	const size_t errlen = sizeof(rep->message);
	struct mountinfo_ent *mi = NULL;
	const struct mountinfo_ent *e;
	struct mnt_ident ident;
	struct bmount *m;
	struct statx sx;
	size_t nmi;
	int root = -1, dup_fd = -1, fl, rc, fd = fds[0];

	(void)nfds; /* 1: broker_request_parse() */
	if (statx(fd, "", AT_EMPTY_PATH | AT_STATX_DONT_SYNC, STATX_TYPE, &sx) < 0 ||
	    !S_ISCHR(sx.stx_mode) || sx.stx_rdev_major != FUSE_DEV_MAJOR ||
	    sx.stx_rdev_minor != FUSE_DEV_MINOR) {
		snprintf(err, errlen, "the fd sent is not the FUSE device /dev/fuse");
		return -EINVAL;
	}
	fl = fcntl(fd, F_GETFL);
	if (fl < 0 || (fl & O_ACCMODE) != O_RDWR) {
		snprintf(err, errlen, "the /dev/fuse fd sent is not open read-write");
		return -EINVAL;
	}
	rep->fds_safe = 1; /* the FUSE device: no flush to wait for */
	m = mount_find_name(p->owner, q->name);
	if (m) {
		/* Ours (made before a restart, or attached before): is it still
		 * the mount at that name? */
		rc = mount_verify(m, p->gid, &root, err, errlen);
		if (rc < 0)
			return rc;
		close(root);
		if (m->fuse_fd < 0) {
			m->fuse_fd = fcntl(fd, F_DUPFD_CLOEXEC, 3);
			if (m->fuse_fd < 0) {
				rc = -errno;
				snprintf(err, errlen, "dup: %s", strerror(-rc));
				return rc;
			}
		}
		m->server = c;
		rep->mount_id = m->id;
		return 0;
	}
	/* A FUSE mount the peer made by other means. */
	rc = mount_room(b, p, err, errlen);
	if (rc < 0)
		return rc;
	rc = resolve_beneath(p->rule->root, p->uid, p->gid, q->name, true, &root, err, errlen);
	if (rc < 0)
		return rc;
	rc = fsprobe_mount_ident(root, &ident);
	if (rc < 0 || !ident.is_root) {
		snprintf(err, errlen, "%.128s: nothing is mounted there", q->name);
		rc = -EINVAL;
		goto out;
	}
	rc = mountinfo_read(&mi, &nmi);
	if (rc < 0) {
		snprintf(err, errlen, "cannot read mountinfo: %s", strerror(-rc));
		goto out;
	}
	e = mountinfo_find(mi, nmi, ident.old_id, ident.dev);
	if (!e || (strcmp(e->fstype, "fuse") && strncmp(e->fstype, "fuse.", 5))) {
		snprintf(err, errlen, "%.128s: the mount there is not a FUSE mount", q->name);
		rc = -EINVAL;
		goto out;
	}
	if (!e->user_id_set || e->user_id != p->uid) {
		snprintf(err, errlen, "%.128s: the FUSE mount there is not uid %d's", q->name, (int)p->uid);
		rc = -EPERM;
		goto out;
	}
	if ((m = mount_find_id(b, ident.id))) {
		snprintf(err, errlen, "%.128s: that mount is known under another name or peer",
			 q->name);
		rc = -EEXIST;
		goto out;
	}
	dup_fd = fcntl(fd, F_DUPFD_CLOEXEC, 3);
	m = calloc(1, sizeof(*m));
	if (dup_fd < 0 || !m || !(m->name = strdup(q->name)) ||
	    (p->cgroup && !(m->cgroup = strdup(p->cgroup)))) {
		rc = dup_fd < 0 ? -errno : -ENOMEM;
		snprintf(err, errlen, "%s", strerror(-rc));
		if (m) {
			free(m->name);
			free(m->cgroup);
			free(m);
		}
		goto out;
	}
	m->id = ident.id;
	m->old_id = ident.old_id;
	m->dev = ident.dev;
	m->owner = p->owner;
	m->gid = p->gid;
	m->fuse_fd = dup_fd;
	dup_fd = -1;
	m->created = time(NULL);
	m->server = c;
	mount_table_add(b, m);
	rep->mount_id = m->id;
	rc = 0;
out:
	free(mi);
	if (dup_fd >= 0)
		close(dup_fd);
	if (root >= 0)
		close(root);
	return rc;
}

/* Where m is now, found by its path in our namespace (statmount), and
 * shown to be m (opened without following links; its identity). */
static int open_where_it_is(const struct bmount *m, const char *point, int *out)
{
	struct mnt_ident id;
	int fd, rc;

	*out = -1;
	fd = openat2_(AT_FDCWD, point, O_PATH | O_DIRECTORY | O_CLOEXEC,
		      RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS);
	if (fd < 0)
		return fd;
	rc = fsprobe_mount_ident(fd, &id);
	if (rc == 0 && (!id.is_root || id.id != m->id))
		rc = -ESTALE;
	if (rc < 0) {
		close(fd);
		return rc;
	}
	*out = fd;
	return 0;
}

int mount_follow(struct broker *b, struct bmount *m)
{
	char err[BROKER_MSG_MAX], point[PATH_MAX], *root = NULL, *old = m->name, *now = NULL;
	size_t rl;
	int fd = -1, rc;

	rc = mount_verify(m, m->gid, &fd, err, sizeof(err));
	if (rc == 0)
		goto out; /* where its name says */
	rc = fsprobe_mount_point(m->id, point, sizeof(point));
	if (rc < 0)
		goto out; /* gone, or the kernel cannot say: the reap decides */
	root = realpath(m->owner->root, NULL);
	if (!root) {
		rc = -errno;
		goto out;
	}
	rl = strlen(root);
	if (!strncmp(point, root, rl) && point[rl] == '/' &&
	    broker_name_check(point + rl + 1, NULL, 0) == 0) {
		/* Renamed within the root: the table follows. */
		now = strdup(point + rl + 1);
		if (!now) {
			rc = -ENOMEM;
			goto out;
		}
		m->name = now;
		rc = mount_verify(m, m->gid, &fd, err, sizeof(err));
		if (rc < 0) {
			m->name = old; /* it moves still: next time */
			free(now);
			goto out;
		}
		log_info("mount %" PRIu64 " (uid %d): %s/%s was renamed to %s", m->id,
			 (int)m->owner->uid, m->owner->root, old, now);
		free(old);
		rc = mount_table_write(b, m);
		if (rc < 0)
			log_errno(rc, "cannot record mount %" PRIu64 "'s new name", m->id);
		goto out;
	}
	/* Carried out of the root by a rename of a directory above it. */
	rc = open_where_it_is(m, point, &fd);
	if (rc == 0)
		rc = detach(fd);
	if (rc < 0) {
		log_errno(rc, "mount %" PRIu64 " (uid %d) was moved out of its policy root (to "
			  "%s) and cannot be unmounted yet", m->id, (int)m->owner->uid, point);
		goto out;
	}
	log_warnx("mount %" PRIu64 " (uid %d) was moved out of its policy root %s (to %s): "
		  "unmounted", m->id, (int)m->owner->uid, m->owner->root, point);
	mount_forget(b, m, "moved out of its policy root");
	rc = -EXDEV;
out:
	if (fd >= 0)
		close(fd);
	free(root);
	return rc;
}
