/*
 * fsprobe: what a file or a mount is, found out without ever reaching a
 * FUSE server. The broker is single-threaded and serves every peer; a FUSE
 * server (a peer's ferry-mountd) that does not answer a GETATTR or STATFS
 * would stall it for everyone. So:
 *   - statx() always with AT_STATX_DONT_SYNC (FUSE answers from its cache,
 *     or -EACCES without asking when the mount does not admit us);
 *   - a mount's ids come from statx()'s mnt_id with an empty mask (FUSE
 *     then fills only st_dev) and name_to_handle_at(AT_HANDLE_MNT_ID_UNIQUE)
 *     (FUSE encodes handles without a request);
 *   - whether a file is on FUSE or overlayfs: statmount()'s sb_magic for a
 *     mount in our namespace; else its st_dev among the connections of a
 *     private fusectl mount (a block-device file system not listed there is
 *     neither); else the peer process's mountinfo. Never fstatfs(): on an
 *     overlayfs whose upper layer is FUSE it would ask that FUSE server.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "brokerd.h"

#ifndef AT_HANDLE_MNT_ID_UNIQUE
#define AT_HANDLE_MNT_ID_UNIQUE 0x001
#endif
#ifndef SYS_statmount
#define SYS_statmount 457
#endif
#define STATMOUNT_SB_BASIC_ 0x00000001u
#define STATMOUNT_MNT_BASIC_ 0x00000002u
#define STATMOUNT_MNT_POINT_ 0x00000010u
#define STATMOUNT_HEAD_SIZE 512u        /* the fixed part before str[] */
#define STATMOUNT_MNT_POINT_OFF 108u   /* offset of __u32 mnt_point */

/* The head of the kernel's struct statmount (include/uapi/linux/mount.h). */
struct sm_head {
	uint32_t size;
	uint32_t mnt_opts;
	uint64_t mask;
	uint32_t sb_dev_major;
	uint32_t sb_dev_minor;
	uint64_t sb_magic;
	uint32_t sb_flags;
	uint32_t fs_type;
	uint64_t mnt_id;
	uint64_t mnt_parent_id;
	uint32_t mnt_id_old;
	uint32_t mnt_parent_id_old;
};

struct mnt_id_req_ {
	uint32_t size;
	uint32_t spare;
	uint64_t mnt_id;
	uint64_t param;
};

int fsprobe_init(struct broker *b)
{
	int fs, mnt, rc = 0;

	b->fusectl_fd = -1;
	fs = fsopen("fusectl", FSOPEN_CLOEXEC);
	if (fs < 0)
		return -errno;
	if (fsconfig(fs, FSCONFIG_CMD_CREATE, NULL, NULL, 0) < 0) {
		rc = -errno;
		goto out;
	}
	/* Detached: seen by no one but through this fd. */
	/* Writable: closer.c aborts a FUSE connection that stalls us. */
	mnt = fsmount(fs, FSMOUNT_CLOEXEC, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC);
	if (mnt < 0) {
		rc = -errno;
		goto out;
	}
	b->fusectl_fd = mnt;
out:
	close(fs);
	return rc;
}

void fsprobe_fini(struct broker *b)
{
	if (b->fusectl_fd >= 0)
		close(b->fusectl_fd);
	b->fusectl_fd = -1;
}

int fsprobe_mount_ident(int fd, struct mnt_ident *m)
{
	struct {
		struct file_handle h;
		unsigned char room[8];
	} fh;
	struct statx sx;
	uint64_t uid64 = 0;

	memset(m, 0, sizeof(*m));
	if (statx(fd, "", AT_EMPTY_PATH | AT_STATX_DONT_SYNC, 0, &sx) < 0)
		return -errno;
	if (!(sx.stx_mask & STATX_MNT_ID))
		return -EOPNOTSUPP;
	m->old_id = (uint32_t)sx.stx_mnt_id;
	m->dev = makedev(sx.stx_dev_major, sx.stx_dev_minor);
	m->is_root = (sx.stx_attributes_mask & STATX_ATTR_MOUNT_ROOT) &&
		     (sx.stx_attributes & STATX_ATTR_MOUNT_ROOT);
	/* No room for the handle: -EOVERFLOW, but the mount id is filled. */
	fh.h.handle_bytes = 0;
	if (name_to_handle_at(fd, "", &fh.h, (int *)&uid64,
			      AT_EMPTY_PATH | AT_HANDLE_MNT_ID_UNIQUE) == 0 ||
	    errno == EOVERFLOW)
		m->id = uid64;
	if (!m->id)
		m->id = (uint64_t)m->old_id; /* kernels before 6.12: the reusable id */
	return 0;
}

int fsprobe_mount_alive(uint64_t id, uint32_t old_id)
{
	union {
		struct sm_head h;
		unsigned char buf[1024];
	} sm;
	struct mnt_id_req_ req = { .size = 24, .mnt_id = id, .param = STATMOUNT_MNT_BASIC_ };

	if (id <= INT32_MAX)
		return -EOPNOTSUPP; /* not a unique id */
	if (syscall(SYS_statmount, &req, &sm, sizeof(sm), 0) < 0)
		return errno == ENOENT ? 0 : -errno;
	if (!(sm.h.mask & STATMOUNT_MNT_BASIC_))
		return -EOPNOTSUPP;
	return sm.h.mnt_id_old == old_id;
}

int fsprobe_mount_point(uint64_t id, char *buf, size_t len)
{
	union {
		struct sm_head h;
		unsigned char buf[STATMOUNT_HEAD_SIZE + 4096 + 64];
	} sm;
	struct mnt_id_req_ req = { .size = 24, .mnt_id = id, .param = STATMOUNT_MNT_POINT_ };
	uint32_t off;
	const char *point;

	if (id <= INT32_MAX)
		return -EOPNOTSUPP;
	if (syscall(SYS_statmount, &req, &sm, sizeof(sm), 0) < 0)
		return -errno;
	if (!(sm.h.mask & STATMOUNT_MNT_POINT_))
		return -EOPNOTSUPP;
	memcpy(&off, sm.buf + STATMOUNT_MNT_POINT_OFF, sizeof(off));
	if (off >= sm.h.size - STATMOUNT_HEAD_SIZE || sm.h.size > sizeof(sm))
		return -EOVERFLOW;
	point = (const char *)sm.buf + STATMOUNT_HEAD_SIZE + off;
	if (strnlen(point, sm.h.size - STATMOUNT_HEAD_SIZE - off) >= len)
		return -ENAMETOOLONG;
	snprintf(buf, len, "%s", point);
	return 0;
}

static const char *magic_name(uint64_t magic)
{
	return magic == FUSE_SUPER_MAGIC_ ? "FUSE" : "overlayfs";
}

/* What the file system of dev / mnt_id is, asked of nothing but the
 * kernel's tables: 0 not FUSE or overlayfs, -EXDEV one of them,
 * -EOPNOTSUPP cannot tell that way. */
static int fs_class(struct broker *b, uint64_t dev, uint64_t mnt_id, char *err, size_t errlen)
{
	union {
		struct sm_head h;
		unsigned char buf[1024];
	} sm;
	struct mnt_id_req_ req = { .size = 24, .mnt_id = mnt_id, .param = STATMOUNT_SB_BASIC_ };

	/* The super block's magic, if the mount is in our namespace. */
	if (mnt_id > INT32_MAX &&
	    syscall(SYS_statmount, &req, &sm, sizeof(sm), 0) == 0 &&
	    (sm.h.mask & STATMOUNT_SB_BASIC_)) {
		if (sm.h.sb_magic == FUSE_SUPER_MAGIC_ || sm.h.sb_magic == OVERLAYFS_SUPER_MAGIC_) {
			snprintf(err, errlen, "the file is on a %s file system",
				 magic_name(sm.h.sb_magic));
			return -EXDEV;
		}
		return 0;
	}
	if (b->fusectl_fd >= 0) {
		/* fusectl names each FUSE connection by the kernel's dev_t of
		 * its super block: major << 20 | minor. */
		char name[24];
		struct stat st;

		snprintf(name, sizeof(name), "%" PRIu64,
			 ((uint64_t)major(dev) << 20) | (uint64_t)minor(dev));
		if (fstatat(b->fusectl_fd, name, &st, AT_SYMLINK_NOFOLLOW) == 0) {
			snprintf(err, errlen, "the file is on a FUSE file system");
			return -EXDEV;
		}
	}
	/* A mount outside our namespace (or an old kernel). A file system on
	 * a block device that fusectl does not list is neither FUSE nor
	 * overlayfs (whose devices are anonymous). */
	if (b->fusectl_fd >= 0 && major(dev) != 0)
		return 0;
	return -EOPNOTSUPP;
}

int fsprobe_fs_known_safe(struct broker *b, uint64_t dev, uint64_t mnt_id, char *err,
			  size_t errlen)
{
	return fs_class(b, dev, mnt_id, err, errlen);
}

int fsprobe_fs_forbidden(struct broker *b, pid_t pid, uint64_t dev, uint64_t mnt_id,
			 uint32_t old_mnt_id, char *err, size_t errlen)
{
	struct mountinfo_ent *mi = NULL;
	const struct mountinfo_ent *e;
	size_t n;
	int rc = fs_class(b, dev, mnt_id, err, errlen);

	if (rc != -EOPNOTSUPP)
		return rc;
	/* A mount of another namespace on an anonymous device (tmpfs, say,
	 * or overlayfs). Mount ids are unique over the whole system, so the
	 * mountinfo of the peer's process names its type if the mount is in
	 * the peer's namespace, and whoever's it was if the pid was reused:
	 * the id and dev must both match. Reading mountinfo asks no file
	 * system anything that could wait on a FUSE server (unlike fstatfs
	 * of an overlayfs over FUSE). */
	if (pid > 0 && old_mnt_id && mountinfo_read_pid(pid, &mi, &n) == 0 &&
	    (e = mountinfo_find(mi, n, old_mnt_id, dev))) {
		if (!strcmp(e->fstype, "fuse") || !strncmp(e->fstype, "fuse.", 5) ||
		    !strncmp(e->fstype, "fuseblk", 7) || !strcmp(e->fstype, "overlay")) {
			snprintf(err, errlen, "the file is on a %s file system", e->fstype);
			rc = -EXDEV;
		} else {
			rc = 0;
		}
		free(mi);
		return rc;
	}
	free(mi);
	snprintf(err, errlen, "cannot tell the file's file system without asking it (a mount "
		 "outside the peer's namespace?)");
	return -EOPNOTSUPP;
}

/* ---- /proc/self/mountinfo ---- */

static int slurp_proc(const char *path, char **out, size_t *outlen)
{
	size_t cap = 16384, len = 0;
	char *buf = malloc(cap);
	int fd, rc = 0;

	if (!buf)
		return -ENOMEM;
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		rc = -errno;
		goto fail;
	}
	for (;;) {
		ssize_t n;

		if (len + 1 >= cap) {
			char *nb = cap > (64u << 20) ? NULL : realloc(buf, cap * 2);
			if (!nb) {
				rc = -ENOMEM;
				goto fail;
			}
			buf = nb;
			cap *= 2;
		}
		n = read(fd, buf + len, cap - 1 - len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			rc = -errno;
			goto fail;
		}
		if (n == 0)
			break;
		len += (size_t)n;
	}
	close(fd);
	buf[len] = '\0';
	*out = buf;
	*outlen = len;
	return 0;
fail:
	if (fd >= 0)
		close(fd);
	free(buf);
	return rc;
}

/* One line: "ID PARENT MAJ:MIN ROOT POINT OPTS [OPTIONAL...] - FSTYPE SOURCE SUPEROPTS". */
static bool parse_line(char *line, struct mountinfo_ent *e)
{
	unsigned id, parent, ma, mi;
	char *sep, *fstype, *src, *super, *save;

	memset(e, 0, sizeof(*e));
	if (sscanf(line, "%u %u %u:%u", &id, &parent, &ma, &mi) != 4)
		return false;
	sep = strstr(line, " - ");
	if (!sep)
		return false;
	fstype = strtok_r(sep + 3, " ", &save);
	src = fstype ? strtok_r(NULL, " ", &save) : NULL;
	super = src ? strtok_r(NULL, " ", &save) : NULL;
	if (!fstype)
		return false;
	e->id = id;
	e->dev = makedev(ma, mi);
	snprintf(e->fstype, sizeof(e->fstype), "%s", fstype);
	for (char *o = super ? strtok_r(super, ",", &save) : NULL; o; o = strtok_r(NULL, ",", &save)) {
		char *end;
		unsigned long v;

		if (strncmp(o, "user_id=", 8))
			continue;
		errno = 0;
		v = strtoul(o + 8, &end, 10);
		if (!errno && *end == '\0' && v < UINT32_MAX) {
			e->user_id_set = true;
			e->user_id = (uid_t)v;
		}
	}
	return true;
}

static int mountinfo_read_path(const char *path, struct mountinfo_ent **out, size_t *n)
{
	struct mountinfo_ent *v = NULL;
	size_t len, cnt = 0, cap = 0;
	char *buf, *line, *save;
	int rc;

	*out = NULL;
	*n = 0;
	rc = slurp_proc(path, &buf, &len);
	if (rc < 0)
		return rc;
	for (line = strtok_r(buf, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		struct mountinfo_ent e;

		if (!parse_line(line, &e))
			continue;
		if (cnt == cap) {
			size_t ncap = cap ? cap * 2 : 64;
			struct mountinfo_ent *nv = realloc(v, ncap * sizeof(*v));
			if (!nv) {
				free(v);
				free(buf);
				return -ENOMEM;
			}
			v = nv;
			cap = ncap;
		}
		v[cnt++] = e;
	}
	free(buf);
	*out = v;
	*n = cnt;
	return 0;
}

int mountinfo_read(struct mountinfo_ent **out, size_t *n)
{
	return mountinfo_read_path("/proc/self/mountinfo", out, n);
}

int mountinfo_read_pid(pid_t pid, struct mountinfo_ent **out, size_t *n)
{
	char path[64];

	snprintf(path, sizeof(path), "/proc/%d/mountinfo", (int)pid);
	return mountinfo_read_path(path, out, n);
}

const struct mountinfo_ent *mountinfo_find(const struct mountinfo_ent *v, size_t n, uint32_t id,
					   uint64_t dev)
{
	for (size_t i = 0; i < n; i++)
		if (v[i].id == id && v[i].dev == dev)
			return &v[i];
	return NULL;
}

int boot_id_read(char *buf, size_t len)
{
	char *text;
	size_t n;
	int rc = slurp_proc("/proc/sys/kernel/random/boot_id", &text, &n);

	if (rc < 0)
		return rc;
	while (n && (text[n - 1] == '\n' || text[n - 1] == ' '))
		text[--n] = '\0';
	snprintf(buf, len, "%s", text);
	free(text);
	return n ? 0 : -EINVAL;
}
