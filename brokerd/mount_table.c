/*
 * mount_table: the mounts the broker knows, in memory and on disk.
 *
 * In memory: every mount is on b->mounts, on its owner's list and in a hash
 * by id (the protocol's mount id: the kernel's unique mount id).
 *
 * On disk: each mount the broker made has one record <id>.mount in the state
 * directory (proto MountRecord), written atomically: a temporary
 * .<id>.mount.tmp, fsync, rename, fsync of the directory. At start the
 * records are checked against /proc/self/mountinfo (and statmount() of the
 * unique id where the kernel has it): a record of another boot, or whose
 * mount is gone, is dropped; a live one is kept, so a broker restart breaks
 * no mount. Such a mount has no /dev/fuse fd until its ferry-mountd attaches
 * it again, and backing ids registered before the restart are unknown here
 * (see backing.c).
 *
 * A mount leaves the table when it is unmounted through the broker, or when
 * mount_reap() (at start, every BROKER_REAP_INTERVAL_S, and when an owner is
 * at its limit) finds it gone from mountinfo -- or carried out of its policy
 * root by a rename, which the reap undoes (mount_follow); one renamed within
 * the root keeps its place in the table under its new name.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "broker.pb-c.h"
#include "brokerd.h"
#include "log.h"

#define RECORD_SUFFIX ".mount"
#define RECORD_MAX 8192

static size_t hash_of(uint64_t id)
{
	return (size_t)((id * 0x9E3779B97F4A7C15ull) >> 58) % BROKER_MOUNT_HASH;
}

void mount_table_add(struct broker *b, struct bmount *m)
{
	size_t h = hash_of(m->id);

	m->hnext = b->by_id[h];
	b->by_id[h] = m;
	TAILQ_INSERT_TAIL(&b->mounts, m, link);
	TAILQ_INSERT_TAIL(&m->owner->mounts, m, olink);
	m->owner->nmounts++;
	b->nmounts++;
}

struct bmount *mount_find_id(struct broker *b, uint64_t id)
{
	for (struct bmount *m = b->by_id[hash_of(id)]; m; m = m->hnext)
		if (m->id == id)
			return m;
	return NULL;
}

struct bmount *mount_find_name(struct owner *o, const char *name)
{
	struct bmount *m;

	if (!o)
		return NULL;
	TAILQ_FOREACH(m, &o->mounts, olink)
		if (!strcmp(m->name, name))
			return m;
	return NULL;
}

static void record_name(const struct bmount *m, char *buf, size_t len, bool tmp)
{
	snprintf(buf, len, "%s%" PRIu64 "%s%s", tmp ? "." : "", m->id, RECORD_SUFFIX,
		 tmp ? ".tmp" : "");
}

int mount_table_write(struct broker *b, const struct bmount *m)
{
	Ferry__Broker__MountRecord r = FERRY__BROKER__MOUNT_RECORD__INIT;
	char tmp[64], final[64];
	uint8_t *buf = NULL;
	size_t len, off = 0;
	int fd = -1, rc = 0;

	r.version = BROKER_PROTO_VERSION;
	r.mount_id = m->id;
	r.mnt_id_old = m->old_id;
	r.dev = m->dev;
	r.uid = m->owner->uid;
	r.gid = m->gid;
	r.cgroup = m->cgroup;
	r.root = m->owner->root;
	r.name = m->name;
	r.boot_id = b->boot_id;
	r.created = (int64_t)m->created;
	len = ferry__broker__mount_record__get_packed_size(&r);
	buf = malloc(len ? len : 1);
	if (!buf)
		return -ENOMEM;
	ferry__broker__mount_record__pack(&r, buf);
	record_name(m, tmp, sizeof(tmp), true);
	record_name(m, final, sizeof(final), false);
	fd = openat(b->state_fd, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (fd < 0) {
		rc = -errno;
		goto out;
	}
	while (off < len) {
		ssize_t n = write(fd, buf + off, len - off);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			rc = -errno;
			goto out;
		}
		off += (size_t)n;
	}
	if (fsync(fd) < 0 || renameat(b->state_fd, tmp, b->state_fd, final) < 0 ||
	    fsync(b->state_fd) < 0)
		rc = -errno;
out:
	if (fd >= 0)
		close(fd);
	if (rc < 0)
		unlinkat(b->state_fd, tmp, 0);
	free(buf);
	return rc;
}

static void record_remove(struct broker *b, const struct bmount *m)
{
	char name[64];

	record_name(m, name, sizeof(name), false);
	if ((unlinkat(b->state_fd, name, 0) < 0 && errno != ENOENT) || fsync(b->state_fd) < 0)
		log_warn("cannot remove the record %s/%s of mount %" PRIu64, b->state_dir, name,
			 m->id);
}

static void mount_free(struct broker *b, struct bmount *m)
{
	struct bmount **pp;
	struct owner *o = m->owner;

	for (pp = &b->by_id[hash_of(m->id)]; *pp && *pp != m; pp = &(*pp)->hnext)
		;
	if (*pp)
		*pp = m->hnext;
	TAILQ_REMOVE(&b->mounts, m, link);
	TAILQ_REMOVE(&o->mounts, m, olink);
	o->nmounts--;
	o->nbacking -= (unsigned)m->ids.n;
	b->nbacking -= m->ids.n;
	b->nmounts--;
	if (m->fuse_fd >= 0)
		close(m->fuse_fd);
	idset_free(&m->ids);
	free(m->name);
	free(m->cgroup);
	free(m);
	owner_put(b, o);
}

void mount_forget(struct broker *b, struct bmount *m, const char *why)
{
	log_info("mount %" PRIu64 " (uid %d, %s/%s): %s; forgotten with its %zu backing ids", m->id,
		 (int)m->owner->uid, m->owner->root, m->name, why, m->ids.n);
	if (m->made)
		record_remove(b, m);
	mount_free(b, m);
}

void mount_table_free(struct broker *b)
{
	struct bmount *m;

	/* Records stay on disk: the mounts outlive us. */
	while ((m = TAILQ_FIRST(&b->mounts)))
		mount_free(b, m);
}

/* Is m's mount still there? mountinfo (id, dev, a FUSE type) and, where the
 * kernel can say, its unique id. */
static bool still_mounted(const struct bmount *m, const struct mountinfo_ent *mi, size_t n)
{
	const struct mountinfo_ent *e = mountinfo_find(mi, n, m->old_id, m->dev);
	int alive;

	if (!e || (strcmp(e->fstype, "fuse") && strncmp(e->fstype, "fuse.", 5)))
		return false;
	alive = fsprobe_mount_alive(m->id, m->old_id);
	return alive != 0; /* -EOPNOTSUPP: mountinfo's word stands */
}

int mount_is_live(const struct bmount *m)
{
	struct mountinfo_ent *mi;
	size_t n;
	bool live;
	int rc = mountinfo_read(&mi, &n);

	if (rc < 0)
		return rc;
	live = still_mounted(m, mi, n);
	free(mi);
	return live;
}

void mount_reap(struct broker *b)
{
	struct mountinfo_ent *mi;
	struct bmount *m, *next;
	size_t n;
	int rc = mountinfo_read(&mi, &n);

	if (rc < 0) {
		log_errno(rc, "cannot read /proc/self/mountinfo to check the mounts");
		return;
	}
	for (m = TAILQ_FIRST(&b->mounts); m; m = next) {
		next = TAILQ_NEXT(m, link);
		if (!still_mounted(m, mi, n))
			mount_forget(b, m, "no longer mounted");
		else if (m->made)
			mount_follow(b, m); /* may forget m */
	}
	free(mi);
}

static int read_record(int dirfd, const char *name, Ferry__Broker__MountRecord **out)
{
	uint8_t buf[RECORD_MAX];
	size_t got = 0;
	ssize_t n;
	int fd = openat(dirfd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);

	*out = NULL;
	if (fd < 0)
		return -errno;
	while (got < sizeof(buf) && (n = read(fd, buf + got, sizeof(buf) - got)) != 0) {
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			int rc = -errno;
			close(fd);
			return rc;
		}
		got += (size_t)n;
	}
	close(fd);
	if (got == sizeof(buf))
		return -EFBIG;
	*out = ferry__broker__mount_record__unpack(NULL, got, buf);
	return *out ? 0 : -EBADMSG;
}

/*
 * m's ids are not in mountinfo, but its super block may be mounted at its
 * name still: after a restart in a new mount namespace (a new container),
 * the mounts there are propagated copies, with ids of their own. Found so,
 * m takes the new ids.
 */
static bool find_again(struct broker *b, struct bmount *m, uid_t uid, const char *root,
		       const struct mountinfo_ent *mi, size_t nmi)
{
	const struct mountinfo_ent *e;
	struct mnt_ident id;
	char err[256];
	int fd, rc;

	if (resolve_beneath(root, uid, m->gid, m->name, true, &fd, err, sizeof(err)) < 0)
		return false;
	rc = fsprobe_mount_ident(fd, &id);
	close(fd);
	if (rc < 0 || !id.is_root || id.dev != m->dev || mount_find_id(b, id.id))
		return false;
	e = mountinfo_find(mi, nmi, id.old_id, id.dev);
	if (!e || (strcmp(e->fstype, "fuse") && strncmp(e->fstype, "fuse.", 5)))
		return false;
	m->id = id.id;
	m->old_id = id.old_id;
	return true;
}

/* One record: kept (added to the table) or dropped (its file removed). */
static void load_one(struct broker *b, const char *file, const struct mountinfo_ent *mi,
		     size_t nmi)
{
	Ferry__Broker__MountRecord *r = NULL;
	struct bmount *m = NULL;
	char want[64], err[256];
	const char *drop = NULL;
	bool moved = false;
	int rc, fd;

	rc = read_record(b->state_fd, file, &r);
	if (rc < 0) {
		log_errno(rc, "mount record %s/%s unreadable: removed", b->state_dir, file);
		goto drop_file;
	}
	snprintf(want, sizeof(want), "%" PRIu64 "%s", r->mount_id, RECORD_SUFFIX);
	if (r->version != BROKER_PROTO_VERSION || strcmp(want, file) ||
	    broker_name_check(r->name, NULL, 0) < 0 || r->root[0] != '/') {
		log_warnx("mount record %s/%s is not valid: removed", b->state_dir, file);
		goto drop_file;
	}
	if (mount_find_id(b, r->mount_id)) {
		/* Written a moment ago by find_again() below, as the directory
		 * was being read: it is in the table already. */
		ferry__broker__mount_record__free_unpacked(r, NULL);
		return;
	}
	if (strcmp(r->boot_id, b->boot_id))
		drop = "recorded before the last boot";
	m = calloc(1, sizeof(*m));
	if (!m)
		goto nomem;
	m->id = r->mount_id;
	m->old_id = r->mnt_id_old;
	m->dev = r->dev;
	m->gid = r->gid;
	m->fuse_fd = -1;
	m->made = true;
	m->adopted = true;
	m->created = (time_t)r->created;
	m->name = strdup(r->name);
	m->cgroup = r->cgroup ? strdup(r->cgroup) : NULL;
	if (!m->name || (r->cgroup && !m->cgroup))
		goto nomem;
	if (!drop && !still_mounted(m, mi, nmi)) {
		moved = find_again(b, m, r->uid, r->root, mi, nmi);
		if (!moved)
			drop = "no longer mounted";
	}
	if (drop) {
		log_info("mount %" PRIu64 " (uid %u, %s/%s): %s; record removed", m->id, r->uid,
			 r->root, r->name, drop);
		goto drop_file;
	}
	m->owner = owner_get(b, r->uid, r->root);
	if (!m->owner)
		goto nomem;
	mount_table_add(b, m);
	if (moved) {
		log_info("mount %" PRIu64 " (uid %u, %s/%s) is mounted there as mount %" PRIu64
			 " now (a new mount namespace?)", r->mount_id, r->uid, r->root, r->name,
			 m->id);
		rc = mount_table_write(b, m);
		if (rc < 0)
			log_errno(rc, "cannot record mount %" PRIu64, m->id);
		else if (unlinkat(b->state_fd, file, 0) < 0)
			log_warn("cannot remove %s/%s", b->state_dir, file);
	}
	/* Its name should still lead to it; if not, it stays known (it is
	 * mounted) and UMOUNT will say what is wrong. */
	rc = mount_verify(m, m->gid, &fd, err, sizeof(err));
	if (rc == 0)
		close(fd);
	else
		log_warnx("mount %" PRIu64 " (uid %u, %s/%s) is mounted but %s", m->id, r->uid,
			  r->root, r->name, err);
	log_info("mount %" PRIu64 " (uid %u, %s/%s) is still mounted: kept; waiting for its "
		 "ferry-mountd to attach", m->id, r->uid, r->root, r->name);
	ferry__broker__mount_record__free_unpacked(r, NULL);
	return;
nomem:
	log_warnx("out of memory loading mount record %s/%s: kept on disk", b->state_dir, file);
	goto out;
drop_file:
	if (unlinkat(b->state_fd, file, 0) < 0 && errno != ENOENT)
		log_warn("cannot remove %s/%s", b->state_dir, file);
out:
	if (m) {
		free(m->name);
		free(m->cgroup);
		free(m);
	}
	if (r)
		ferry__broker__mount_record__free_unpacked(r, NULL);
}

int mount_table_load(struct broker *b)
{
	struct mountinfo_ent *mi = NULL;
	struct dirent *de;
	size_t nmi;
	DIR *d;
	int fd, rc;

	rc = mountinfo_read(&mi, &nmi);
	if (rc < 0)
		return rc;
	fd = openat(b->state_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0 || !(d = fdopendir(fd))) {
		rc = -errno;
		if (fd >= 0)
			close(fd);
		free(mi);
		return rc;
	}
	while ((de = readdir(d))) {
		size_t len = strlen(de->d_name);

		if (de->d_name[0] == '.') {
			if (len > 4 && !strcmp(de->d_name + len - 4, ".tmp"))
				unlinkat(b->state_fd, de->d_name, 0); /* a write cut short */
			continue;
		}
		if (len > strlen(RECORD_SUFFIX) &&
		    !strcmp(de->d_name + len - strlen(RECORD_SUFFIX), RECORD_SUFFIX))
			load_one(b, de->d_name, mi, nmi);
	}
	closedir(d);
	free(mi);
	fsync(b->state_fd);
	return 0;
}
