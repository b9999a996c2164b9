/*
 * POSIX namespace, attributes and errno through a real ferryfs mount, in the
 * style of libfuse's test/test_syscalls.c: plain syscalls, each result and
 * errno checked. Every test gets a freshly formatted volume mounted with
 * -o allow_other (see mount_util.h); permission tests drop to uid 65534 in
 * a forked child.
 */
#include "mount_util.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/falloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/file.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <sys/un.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#define FUSE_SUPER_MAGIC 0x65735546

TestSuite(posix, .init = fm_setup, .fini = fm_teardown, .timeout = 120);

/* ---- helpers ------------------------------------------------------------ */

static void put(const char *path, const char *s)
{
	fm_write_file(path, s, strlen(s));
}

static void expect_content(const char *path, const void *want, size_t want_len)
{
	size_t len;
	char *got = fm_read_file(path, &len);

	cr_assert_eq(len, want_len, "%s: size %zu, expected %zu", path, len, want_len);
	cr_assert(memcmp(got, want, len) == 0, "%s: content differs", path);
	free(got);
}

static void expect_str(const char *path, const char *s)
{
	expect_content(path, s, strlen(s));
}

static struct stat lst(const char *path)
{
	struct stat st;

	OK(lstat(path, &st));
	return st;
}

static struct stat fst(int fd)
{
	struct stat st;

	OK(fstat(fd, &st));
	return st;
}

/* Lets the clock move past the last timestamp the filesystem stored. */
static void tick(void)
{
	usleep(20 * 1000);
}

static int ts_cmp(struct timespec a, struct timespec b)
{
	if (a.tv_sec != b.tv_sec)
		return a.tv_sec < b.tv_sec ? -1 : 1;
	if (a.tv_nsec != b.tv_nsec)
		return a.tv_nsec < b.tv_nsec ? -1 : 1;
	return 0;
}

#define TS_FMT "%lld.%09ld"
#define TS_ARG(t) (long long)(t).tv_sec, (long)(t).tv_nsec

#define ASSERT_TS_LATER(after, before, what)                                  \
	cr_assert(ts_cmp((after), (before)) > 0, "%s did not move: " TS_FMT      \
		  " -> " TS_FMT, what, TS_ARG(before), TS_ARG(after))
#define ASSERT_TS_SAME(after, before, what)                                   \
	cr_assert(ts_cmp((after), (before)) == 0, "%s changed: " TS_FMT " -> "   \
		  TS_FMT, what, TS_ARG(before), TS_ARG(after))

static int xrenameat2(const char *from, const char *to, unsigned int flags)
{
	return (int)syscall(SYS_renameat2, AT_FDCWD, from, AT_FDCWD, to, flags);
}

#ifndef RENAME_NOREPLACE
#define RENAME_NOREPLACE (1 << 0)
#endif
#ifndef RENAME_EXCHANGE
#define RENAME_EXCHANGE (1 << 1)
#endif

/* Operations run as uid 65534 in a forked child (no Criterion calls there). */
enum op_kind {
	OP_OPEN,       /* open(path, flags, 0644) and close */
	OP_OPENDIR,
	OP_STAT,
	OP_UNLINK,
	OP_RMDIR,
	OP_MKDIR,      /* mkdir(path, mode) */
	OP_RENAME,     /* rename(path, path2) */
	OP_CHMOD,      /* chmod(path, mode) */
	OP_CHOWN,      /* chown(path, uid, gid) */
	OP_TRUNCATE,   /* truncate(path, size) */
	OP_UTIMES_NOW, /* utimensat(path, NULL) */
	OP_UTIMES_SET, /* utimensat(path, explicit times) */
	OP_SETXATTR,   /* setxattr(path, "user.t", "v") */
	OP_ACCESS,     /* access(path, flags) */
	OP_APPEND,     /* open(path, O_WRONLY|flags), write 1 byte at the end */
	OP_CREATE,     /* open(path, O_CREAT|O_EXCL|O_WRONLY, mode) and close */
	OP_LINK,       /* link(path, path2) */
};

struct op {
	enum op_kind kind;
	const char *path, *path2;
	int flags;
	mode_t mode;
	uid_t uid;
	gid_t gid;
	off_t size;
};

static long run_op(void *arg)
{
	const struct op *o = arg;
	int fd;
	DIR *d;

	switch (o->kind) {
	case OP_OPEN:
		fd = open(o->path, o->flags, 0644);
		if (fd < 0)
			return -1;
		close(fd);
		return 0;
	case OP_OPENDIR:
		d = opendir(o->path);
		if (!d)
			return -1;
		closedir(d);
		return 0;
	case OP_STAT: {
		struct stat st;
		return stat(o->path, &st);
	}
	case OP_UNLINK:
		return unlink(o->path);
	case OP_RMDIR:
		return rmdir(o->path);
	case OP_MKDIR:
		return mkdir(o->path, o->mode);
	case OP_RENAME:
		return rename(o->path, o->path2);
	case OP_CHMOD:
		return chmod(o->path, o->mode);
	case OP_CHOWN:
		return chown(o->path, o->uid, o->gid);
	case OP_TRUNCATE:
		return truncate(o->path, o->size);
	case OP_UTIMES_NOW:
		return utimensat(AT_FDCWD, o->path, NULL, 0);
	case OP_UTIMES_SET: {
		struct timespec ts[2] = { { 1000, 0 }, { 2000, 0 } };
		return utimensat(AT_FDCWD, o->path, ts, 0);
	}
	case OP_SETXATTR:
		return setxattr(o->path, "user.t", "v", 1, 0);
	case OP_ACCESS:
		return access(o->path, o->flags);
	case OP_APPEND: {
		ssize_t n;

		fd = open(o->path, O_WRONLY | o->flags);
		if (fd < 0)
			return -1;
		n = pwrite(fd, "!", 1, lseek(fd, 0, SEEK_END));
		if (n != 1) {
			int e = errno;
			close(fd);
			errno = n < 0 ? e : EIO;
			return -1;
		}
		return close(fd);
	}
	case OP_CREATE:
		fd = open(o->path, O_CREAT | O_EXCL | O_WRONLY, o->mode);
		if (fd < 0)
			return -1;
		return close(fd);
	case OP_LINK:
		return link(o->path, o->path2);
	}
	errno = EINVAL;
	return -1;
}

#define NOBODY(...) fm_as_nobody(run_op, &(struct op){ __VA_ARGS__ })

/* ---- lookup / getattr ----------------------------------------------------- */

Test(posix, lookup_getattr)
{
	struct stat st, st2, root;
	int fd;

	root = lst(fm.mnt);
	cr_assert(S_ISDIR(root.st_mode), "root is not a directory: mode %o", root.st_mode);
	cr_assert_geq(root.st_nlink, 2);

	put(mp("f"), "hello");
	st = lst(mp("f"));
	cr_assert(S_ISREG(st.st_mode), "mode %o", st.st_mode);
	cr_assert_eq(st.st_mode & 07777, 0644, "mode %o, expected 0644 (umask 022)",
		     st.st_mode & 07777);
	cr_assert_eq(st.st_uid, 0);
	cr_assert_eq(st.st_gid, 0);
	cr_assert_eq(st.st_nlink, 1);
	cr_assert_eq(st.st_size, 5);
	cr_assert_gt(st.st_blksize, 0);
	cr_assert_neq(st.st_ino, root.st_ino);

	fd = OK(open(mp("f"), O_RDONLY));
	st2 = fst(fd);
	cr_assert_eq(st2.st_ino, st.st_ino);
	cr_assert_eq(st2.st_size, 5);
	OK(close(fd));

	OK(mkdir(mp("d"), 0755));
	st2 = lst(mp("d/../f"));
	cr_assert_eq(st2.st_ino, st.st_ino, "d/../f resolves to another inode");

	FAILS(stat(mp("missing"), &st2), ENOENT);
	FAILS(lstat(mp("missing"), &st2), ENOENT);
	FAILS(stat(mp("missing/x"), &st2), ENOENT);
	FAILS(stat(mp("f/x"), &st2), ENOTDIR);
	FAILS(stat(mp("f/"), &st2), ENOTDIR);

	/* a name that was looked up missing appears once created */
	put(mp("missing"), "now");
	st2 = lst(mp("missing"));
	cr_assert_eq(st2.st_size, 3);
	OK(unlink(mp("missing")));
	FAILS(stat(mp("missing"), &st2), ENOENT);
}

/* ---- setattr -------------------------------------------------------------- */

Test(posix, chmod_modes_and_ctime)
{
	struct stat st, before;
	int fd;

	put(mp("f"), "x");
	before = lst(mp("f"));
	tick();
	OK(chmod(mp("f"), 0600));
	st = lst(mp("f"));
	cr_assert(S_ISREG(st.st_mode));
	cr_assert_eq(st.st_mode & 07777, 0600, "mode %o", st.st_mode & 07777);
	ASSERT_TS_LATER(st.st_ctim, before.st_ctim, "ctime after chmod");
	ASSERT_TS_SAME(st.st_mtim, before.st_mtim, "mtime after chmod");

	fd = OK(open(mp("f"), O_RDONLY));
	OK(fchmod(fd, 04755));
	cr_assert_eq(fst(fd).st_mode & 07777, 04755, "mode %o", fst(fd).st_mode & 07777);
	OK(close(fd));
	cr_assert_eq(lst(mp("f")).st_mode & 07777, 04755);

	OK(chmod(mp("f"), 0));
	cr_assert_eq(lst(mp("f")).st_mode & 07777, 0);
	OK(chmod(mp("f"), 01777));
	cr_assert_eq(lst(mp("f")).st_mode & 07777, 01777);

	OK(mkdir(mp("d"), 0755));
	OK(chmod(mp("d"), 0700));
	st = lst(mp("d"));
	cr_assert(S_ISDIR(st.st_mode));
	cr_assert_eq(st.st_mode & 07777, 0700);

	FAILS(chmod(mp("missing"), 0644), ENOENT);
}

Test(posix, chown_as_root)
{
	struct stat st, before;
	int fd;

	put(mp("f"), "x");
	before = lst(mp("f"));
	tick();
	OK(chown(mp("f"), FM_NOBODY_UID, FM_NOBODY_GID));
	st = lst(mp("f"));
	cr_assert_eq(st.st_uid, FM_NOBODY_UID);
	cr_assert_eq(st.st_gid, FM_NOBODY_GID);
	ASSERT_TS_LATER(st.st_ctim, before.st_ctim, "ctime after chown");

	OK(chown(mp("f"), (uid_t)-1, 1234));
	st = lst(mp("f"));
	cr_assert_eq(st.st_uid, FM_NOBODY_UID, "uid changed by chown(-1, gid)");
	cr_assert_eq(st.st_gid, 1234);

	OK(chown(mp("f"), 4321, (gid_t)-1));
	st = lst(mp("f"));
	cr_assert_eq(st.st_uid, 4321);
	cr_assert_eq(st.st_gid, 1234, "gid changed by chown(uid, -1)");

	fd = OK(open(mp("f"), O_RDONLY));
	OK(fchown(fd, 0, 0));
	st = fst(fd);
	cr_assert_eq(st.st_uid, 0);
	cr_assert_eq(st.st_gid, 0);
	OK(close(fd));

	/* lchown changes the link, not its target */
	OK(symlink("f", mp("l")));
	OK(lchown(mp("l"), 777, 888));
	st = lst(mp("l"));
	cr_assert(S_ISLNK(st.st_mode));
	cr_assert_eq(st.st_uid, 777);
	cr_assert_eq(st.st_gid, 888);
	st = lst(mp("f"));
	cr_assert_eq(st.st_uid, 0, "lchown changed the target");

	FAILS(chown(mp("missing"), 1, 1), ENOENT);
}

Test(posix, truncate_up_and_down)
{
	char buf[8192];
	struct stat st, before;
	int fd;

	put(mp("f"), "hello world");
	before = lst(mp("f"));
	tick();
	OK(truncate(mp("f"), 5));
	st = lst(mp("f"));
	cr_assert_eq(st.st_size, 5);
	ASSERT_TS_LATER(st.st_mtim, before.st_mtim, "mtime after truncate");
	ASSERT_TS_LATER(st.st_ctim, before.st_ctim, "ctime after truncate");
	expect_str(mp("f"), "hello");

	OK(truncate(mp("f"), 100));
	memset(buf, 0, sizeof(buf));
	memcpy(buf, "hello", 5);
	expect_content(mp("f"), buf, 100);

	fd = OK(open(mp("f"), O_RDWR));
	OK(ftruncate(fd, 3));
	cr_assert_eq(fst(fd).st_size, 3);
	cr_assert_eq(OK(pread(fd, buf, sizeof(buf), 0)), 3);
	cr_assert(memcmp(buf, "hel", 3) == 0);
	OK(ftruncate(fd, 0));
	cr_assert_eq(fst(fd).st_size, 0);
	cr_assert_eq(OK(pread(fd, buf, sizeof(buf), 0)), 0);
	OK(close(fd));
	cr_assert_eq(lst(mp("f")).st_size, 0);

	/* data cut off by a truncate must not come back when the file grows */
	memset(buf, 'x', sizeof(buf));
	fm_write_file(mp("g"), buf, sizeof(buf));
	OK(truncate(mp("g"), 100));
	OK(truncate(mp("g"), sizeof(buf)));
	memset(buf + 100, 0, sizeof(buf) - 100);
	expect_content(mp("g"), buf, sizeof(buf));

	/* the same within one open file */
	fd = OK(open(mp("h"), O_RDWR | O_CREAT, 0644));
	memset(buf, 'y', sizeof(buf));
	fm_pwrite_all(fd, buf, sizeof(buf), 0);
	OK(ftruncate(fd, 10));
	OK(ftruncate(fd, sizeof(buf)));
	memset(buf + 10, 0, sizeof(buf) - 10);
	{
		char got[8192];

		fm_pread_all(fd, got, sizeof(got), 0);
		cr_assert(memcmp(got, buf, sizeof(got)) == 0,
			  "bytes cut by ftruncate came back after growing");
	}
	OK(close(fd));
	expect_content(mp("h"), buf, sizeof(buf));

	OK(mkdir(mp("d"), 0755));
	FAILS(truncate(mp("d"), 0), EISDIR);
	FAILS(truncate(mp("f"), -1), EINVAL);
	FAILS(truncate(mp("missing"), 0), ENOENT);
	fd = OK(open(mp("f"), O_RDONLY));
	FAILS2(ftruncate(fd, 0), EINVAL, EBADF);
	OK(close(fd));
}

Test(posix, utimensat_ns_now_omit)
{
	struct timespec ts[2], before, after;
	struct stat st, st0;
	int fd;

	put(mp("f"), "x");
	ts[0] = (struct timespec){ 1000000000, 123456789 };
	ts[1] = (struct timespec){ 1500000000, 987654321 };
	st0 = lst(mp("f"));
	tick();
	OK(utimensat(AT_FDCWD, mp("f"), ts, 0));
	st = lst(mp("f"));
	cr_assert(ts_cmp(st.st_atim, ts[0]) == 0, "atime " TS_FMT ", expected " TS_FMT,
		  TS_ARG(st.st_atim), TS_ARG(ts[0]));
	cr_assert(ts_cmp(st.st_mtim, ts[1]) == 0, "mtime " TS_FMT ", expected " TS_FMT,
		  TS_ARG(st.st_mtim), TS_ARG(ts[1]));
	ASSERT_TS_LATER(st.st_ctim, st0.st_ctim, "ctime after utimensat");

	/* UTIME_OMIT keeps atime, mtime gets ns precision */
	ts[0] = (struct timespec){ 0, UTIME_OMIT };
	ts[1] = (struct timespec){ 1600000000, 1 };
	OK(utimensat(AT_FDCWD, mp("f"), ts, 0));
	st = lst(mp("f"));
	cr_assert(st.st_atim.tv_sec == 1000000000 && st.st_atim.tv_nsec == 123456789,
		  "UTIME_OMIT changed atime to " TS_FMT, TS_ARG(st.st_atim));
	cr_assert(st.st_mtim.tv_sec == 1600000000 && st.st_mtim.tv_nsec == 1,
		  "mtime " TS_FMT ", expected 1600000000.000000001", TS_ARG(st.st_mtim));

	/* UTIME_NOW sets mtime to about now, UTIME_OMIT keeps atime */
	clock_gettime(CLOCK_REALTIME, &before);
	ts[0] = (struct timespec){ 0, UTIME_OMIT };
	ts[1] = (struct timespec){ 0, UTIME_NOW };
	OK(utimensat(AT_FDCWD, mp("f"), ts, 0));
	clock_gettime(CLOCK_REALTIME, &after);
	st = lst(mp("f"));
	cr_assert(st.st_atim.tv_sec == 1000000000 && st.st_atim.tv_nsec == 123456789,
		  "UTIME_OMIT changed atime to " TS_FMT, TS_ARG(st.st_atim));
	cr_assert(st.st_mtim.tv_sec >= before.tv_sec - 1 && st.st_mtim.tv_sec <= after.tv_sec + 1,
		  "UTIME_NOW gave mtime " TS_FMT ", now is " TS_FMT, TS_ARG(st.st_mtim),
		  TS_ARG(after));

	/* UTIME_NOW for atime, OMIT for mtime */
	ts[0] = (struct timespec){ 0, UTIME_NOW };
	ts[1] = (struct timespec){ 0, UTIME_OMIT };
	st0 = lst(mp("f"));
	OK(utimensat(AT_FDCWD, mp("f"), ts, 0));
	st = lst(mp("f"));
	cr_assert(st.st_atim.tv_sec >= before.tv_sec - 1, "atime " TS_FMT " not set to now",
		  TS_ARG(st.st_atim));
	ASSERT_TS_SAME(st.st_mtim, st0.st_mtim, "mtime with UTIME_OMIT");

	/* NULL times: both now */
	ts[0] = (struct timespec){ 5, 5 };
	ts[1] = (struct timespec){ 6, 6 };
	OK(utimensat(AT_FDCWD, mp("f"), ts, 0));
	OK(utimensat(AT_FDCWD, mp("f"), NULL, 0));
	st = lst(mp("f"));
	cr_assert(st.st_atim.tv_sec >= before.tv_sec - 1 && st.st_mtim.tv_sec >= before.tv_sec - 1,
		  "utimensat(NULL) gave atime " TS_FMT " mtime " TS_FMT, TS_ARG(st.st_atim),
		  TS_ARG(st.st_mtim));

	/* futimens on an open file */
	fd = OK(open(mp("f"), O_RDWR));
	ts[0] = (struct timespec){ 1234567890, 999999999 };
	ts[1] = (struct timespec){ 1234567891, 0 };
	OK(futimens(fd, ts));
	st = fst(fd);
	cr_assert(ts_cmp(st.st_atim, ts[0]) == 0 && ts_cmp(st.st_mtim, ts[1]) == 0,
		  "futimens: atime " TS_FMT " mtime " TS_FMT, TS_ARG(st.st_atim),
		  TS_ARG(st.st_mtim));
	OK(close(fd));

	/* on a symlink itself */
	OK(symlink("f", mp("l")));
	ts[0] = (struct timespec){ 1100000000, 11 };
	ts[1] = (struct timespec){ 1100000001, 22 };
	OK(utimensat(AT_FDCWD, mp("l"), ts, AT_SYMLINK_NOFOLLOW));
	st = lst(mp("l"));
	cr_assert(ts_cmp(st.st_mtim, ts[1]) == 0, "symlink mtime " TS_FMT, TS_ARG(st.st_mtim));
	st = lst(mp("f"));
	cr_assert_eq(st.st_mtim.tv_sec, 1234567891, "AT_SYMLINK_NOFOLLOW changed the target");

	ts[1] = (struct timespec){ 0, 1000000000 };
	FAILS(utimensat(AT_FDCWD, mp("f"), ts, 0), EINVAL);
	FAILS(utimensat(AT_FDCWD, mp("missing"), NULL, 0), ENOENT);
}

/* ---- mknod ---------------------------------------------------------------- */

Test(posix, mknod_regular_fifo_socket_devices)
{
	struct stat st;
	char buf[8];
	int fd;

	OK(mknod(mp("reg"), S_IFREG | 0640, 0));
	st = lst(mp("reg"));
	cr_assert(S_ISREG(st.st_mode), "mode %o", st.st_mode);
	cr_assert_eq(st.st_mode & 07777, 0640);
	cr_assert_eq(st.st_size, 0);
	cr_assert_eq(st.st_nlink, 1);
	fd = OK(open(mp("reg"), O_RDONLY));
	cr_assert_eq(OK(read(fd, buf, sizeof(buf))), 0);
	OK(close(fd));

	OK(mkfifo(mp("fifo"), 0600));
	st = lst(mp("fifo"));
	cr_assert(S_ISFIFO(st.st_mode), "mode %o", st.st_mode);
	cr_assert_eq(st.st_mode & 07777, 0600);
	fd = OK(open(mp("fifo"), O_RDWR | O_NONBLOCK));
	cr_assert_eq(OK(write(fd, "abc", 3)), 3);
	cr_assert_eq(OK(read(fd, buf, sizeof(buf))), 3);
	cr_assert(memcmp(buf, "abc", 3) == 0);
	OK(close(fd));

	OK(mknod(mp("sock"), S_IFSOCK | 0644, 0));
	st = lst(mp("sock"));
	cr_assert(S_ISSOCK(st.st_mode), "mode %o", st.st_mode);

	OK(mknod(mp("null"), S_IFCHR | 0666, makedev(1, 3)));
	st = lst(mp("null"));
	cr_assert(S_ISCHR(st.st_mode), "mode %o", st.st_mode);
	cr_assert_eq(st.st_rdev, makedev(1, 3), "rdev %u:%u", major(st.st_rdev),
		     minor(st.st_rdev));
	cr_assert_eq(st.st_mode & 07777, 0644, "mode %o (umask 022)", st.st_mode & 07777);
	/* the mount is nodev: the node is metadata only */
	FAILS(open(mp("null"), O_RDONLY), EACCES);
	FAILS(open(mp("null"), O_WRONLY), EACCES);

	OK(mknod(mp("blk"), S_IFBLK | 0600, makedev(7, 42)));
	st = lst(mp("blk"));
	cr_assert(S_ISBLK(st.st_mode), "mode %o", st.st_mode);
	cr_assert_eq(st.st_rdev, makedev(7, 42));
	FAILS(open(mp("blk"), O_RDONLY), EACCES);

	FAILS(mknod(mp("reg"), S_IFREG | 0644, 0), EEXIST);
	FAILS(mkfifo(mp("null"), 0644), EEXIST);
	FAILS(mknod(mp("missing/x"), S_IFIFO | 0644, 0), ENOENT);
	FAILS(mknod(mp("reg/x"), S_IFIFO | 0644, 0), ENOTDIR);
}

Test(posix, unix_socket_bind_connect)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int srv, cli, acc;
	char buf[8];

	cr_assert_lt(strlen(mp("s")), sizeof(sa.sun_path));
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", mp("s"));
	srv = OK(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
	OK(bind(srv, (struct sockaddr *)&sa, sizeof(sa)));
	OK(listen(srv, 1));
	cr_assert(S_ISSOCK(lst(mp("s")).st_mode));
	cli = OK(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
	OK(connect(cli, (struct sockaddr *)&sa, sizeof(sa)));
	acc = OK(accept(srv, NULL, NULL));
	cr_assert_eq(OK(write(cli, "ping", 4)), 4);
	cr_assert_eq(OK(read(acc, buf, sizeof(buf))), 4);
	cr_assert(memcmp(buf, "ping", 4) == 0);
	close(acc);
	close(cli);
	close(srv);
	FAILS(bind(OK(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0)), (struct sockaddr *)&sa,
		   sizeof(sa)),
	      EADDRINUSE);
	OK(unlink(mp("s")));
}

/* ---- mkdir / rmdir / unlink ---------------------------------------------- */

Test(posix, mkdir_rmdir)
{
	struct stat st;
	nlink_t root_nlink = lst(fm.mnt).st_nlink;

	OK(mkdir(mp("d"), 0777));
	st = lst(mp("d"));
	cr_assert(S_ISDIR(st.st_mode));
	cr_assert_eq(st.st_mode & 07777, 0755, "mode %o (umask 022)", st.st_mode & 07777);
	cr_assert_eq(st.st_nlink, 2, "new dir nlink %lu", (unsigned long)st.st_nlink);
	cr_assert_eq(st.st_uid, 0);
	cr_assert_eq(st.st_gid, 0);
	cr_assert_eq(lst(fm.mnt).st_nlink, root_nlink + 1, "parent nlink after mkdir");

	FAILS(mkdir(mp("d"), 0755), EEXIST);
	put(mp("file"), "x");
	FAILS(mkdir(mp("file"), 0755), EEXIST);
	FAILS(mkdir(mp("file/x"), 0755), ENOTDIR);
	FAILS(mkdir(mp("missing/x"), 0755), ENOENT);

	OK(mkdir(mp("d/sub"), 0700));
	cr_assert_eq(lst(mp("d")).st_nlink, 3);
	put(mp("d/sub/f"), "x");
	cr_assert_eq(lst(mp("d/sub")).st_nlink, 2, "a file changed the dir's nlink");

	FAILS(rmdir(mp("d")), ENOTEMPTY);
	FAILS(rmdir(mp("d/sub")), ENOTEMPTY);
	FAILS(rmdir(mp("d/sub/f")), ENOTDIR);
	FAILS(rmdir(mp("file")), ENOTDIR);
	FAILS(rmdir(mp("missing")), ENOENT);
	FAILS(rmdir(mp("d/.")), EINVAL);

	OK(unlink(mp("d/sub/f")));
	OK(rmdir(mp("d/sub")));
	FAILS(stat(mp("d/sub"), &st), ENOENT);
	cr_assert_eq(lst(mp("d")).st_nlink, 2, "nlink after rmdir of subdir");
	OK(rmdir(mp("d")));
	FAILS(stat(mp("d"), &st), ENOENT);
	cr_assert_eq(lst(fm.mnt).st_nlink, root_nlink, "root nlink after rmdir");

	/* the name is free again */
	OK(mkdir(mp("d"), 0755));
	cr_assert_eq(lst(mp("d")).st_nlink, 2);
}

Test(posix, unlink_errors)
{
	struct stat st;

	OK(mkdir(mp("d"), 0755));
	put(mp("f"), "x");
	FAILS(unlink(mp("d")), EISDIR);
	FAILS(unlink(mp("missing")), ENOENT);
	FAILS(unlink(mp("f/x")), ENOTDIR);
	FAILS(unlink(mp("missing/x")), ENOENT);
	OK(unlink(mp("f")));
	FAILS(stat(mp("f"), &st), ENOENT);
	FAILS(unlink(mp("f")), ENOENT);
	/* rmdir works on an emptied directory */
	put(mp("d/a"), "x");
	OK(unlink(mp("d/a")));
	OK(rmdir(mp("d")));
}

Test(posix, dir_mtime_ctime_on_entry_changes)
{
	struct stat before, after;

	OK(mkdir(mp("d"), 0755));
	before = lst(mp("d"));
	tick();
	put(mp("d/f"), "x");
	after = lst(mp("d"));
	ASSERT_TS_LATER(after.st_mtim, before.st_mtim, "dir mtime after create");
	ASSERT_TS_LATER(after.st_ctim, before.st_ctim, "dir ctime after create");

	before = after;
	tick();
	OK(rename(mp("d/f"), mp("d/g")));
	after = lst(mp("d"));
	ASSERT_TS_LATER(after.st_mtim, before.st_mtim, "dir mtime after rename");

	before = after;
	tick();
	OK(unlink(mp("d/g")));
	after = lst(mp("d"));
	ASSERT_TS_LATER(after.st_mtim, before.st_mtim, "dir mtime after unlink");
	ASSERT_TS_LATER(after.st_ctim, before.st_ctim, "dir ctime after unlink");
}

/* ---- symlink / readlink -------------------------------------------------- */

Test(posix, symlink_readlink)
{
	char buf[PATH_MAX], longt[1001];
	struct stat st;
	int fd;

	OK(symlink("target/path", mp("l")));
	st = lst(mp("l"));
	cr_assert(S_ISLNK(st.st_mode), "mode %o", st.st_mode);
	cr_assert_eq(st.st_size, 11, "symlink size %lld", (long long)st.st_size);
	memset(buf, '#', sizeof(buf));
	cr_assert_eq(OK(readlink(mp("l"), buf, sizeof(buf))), 11);
	cr_assert(memcmp(buf, "target/path", 11) == 0);
	cr_assert_eq(buf[11], '#', "readlink wrote past the target");
	cr_assert_eq(OK(readlink(mp("l"), buf, 4)), 4);
	cr_assert(memcmp(buf, "targ", 4) == 0);

	/* dangling */
	FAILS(stat(mp("l"), &st), ENOENT);
	FAILS(open(mp("l"), O_RDONLY | O_NOFOLLOW), ELOOP);

	memset(longt, 'a', 1000);
	longt[1000] = '\0';
	for (int i = 50; i < 1000; i += 50)
		longt[i] = '/';
	OK(symlink(longt, mp("long")));
	cr_assert_eq(lst(mp("long")).st_size, 1000);
	cr_assert_eq(OK(readlink(mp("long"), buf, sizeof(buf))), 1000);
	cr_assert(memcmp(buf, longt, 1000) == 0);

	/* following: to a file, and through a link to a directory */
	put(mp("f"), "content");
	OK(symlink("f", mp("lf")));
	cr_assert_eq(lst(mp("lf")).st_size, 1);
	st = lst(mp("f"));
	struct stat st2;
	OK(stat(mp("lf"), &st2));
	cr_assert_eq(st2.st_ino, st.st_ino);
	expect_str(mp("lf"), "content");
	OK(mkdir(mp("d"), 0755));
	put(mp("d/inner"), "in");
	OK(symlink("d", mp("ld")));
	expect_str(mp("ld/inner"), "in");
	OK(symlink(fm.mnt, mp("abs")));
	expect_str(mp("abs/f"), "content");

	FAILS(symlink("x", mp("l")), EEXIST);
	FAILS(symlink("x", mp("f")), EEXIST);
	FAILS(symlink("x", mp("missing/l")), ENOENT);
	FAILS(readlink(mp("f"), buf, sizeof(buf)), EINVAL);
	FAILS(readlink(mp("missing"), buf, sizeof(buf)), ENOENT);

	/* unlink removes the link only */
	OK(unlink(mp("lf")));
	expect_str(mp("f"), "content");
	fd = OK(open(mp("f"), O_RDONLY));
	OK(close(fd));
}

/* ---- link ----------------------------------------------------------------- */

Test(posix, hard_links_nlink_ctime)
{
	struct stat a, b, before;
	int fd;

	put(mp("a"), "data");
	before = lst(mp("a"));
	cr_assert_eq(before.st_nlink, 1);
	tick();
	OK(link(mp("a"), mp("b")));
	a = lst(mp("a"));
	b = lst(mp("b"));
	cr_assert_eq(a.st_ino, b.st_ino);
	cr_assert_eq(a.st_nlink, 2, "nlink %lu after link", (unsigned long)a.st_nlink);
	cr_assert_eq(b.st_nlink, 2);
	ASSERT_TS_LATER(a.st_ctim, before.st_ctim, "ctime after link");

	fd = OK(open(mp("b"), O_WRONLY | O_APPEND));
	cr_assert_eq(OK(write(fd, "+more", 5)), 5);
	OK(close(fd));
	expect_str(mp("a"), "data+more");

	OK(mkdir(mp("d"), 0755));
	OK(link(mp("a"), mp("d/c")));
	cr_assert_eq(lst(mp("b")).st_nlink, 3);
	cr_assert_eq(lst(mp("d")).st_nlink, 2, "a hard link changed the dir's nlink");

	before = lst(mp("b"));
	tick();
	OK(unlink(mp("a")));
	b = lst(mp("b"));
	cr_assert_eq(b.st_nlink, 2, "nlink %lu after unlink", (unsigned long)b.st_nlink);
	ASSERT_TS_LATER(b.st_ctim, before.st_ctim, "ctime after unlink of another link");
	expect_str(mp("d/c"), "data+more");
	OK(unlink(mp("d/c")));
	cr_assert_eq(lst(mp("b")).st_nlink, 1);
	expect_str(mp("b"), "data+more");

	FAILS(link(mp("d"), mp("dlink")), EPERM);
	put(mp("e"), "e");
	FAILS(link(mp("b"), mp("e")), EEXIST);
	FAILS(link(mp("b"), mp("d")), EEXIST);
	FAILS(link(mp("missing"), mp("x")), ENOENT);
	FAILS(link(mp("b"), mp("missing/x")), ENOENT);

	/* links of a symlink are links of the symlink */
	OK(symlink("b", mp("s")));
	OK(link(mp("s"), mp("s2")));
	cr_assert(S_ISLNK(lst(mp("s2")).st_mode));
	cr_assert_eq(lst(mp("s")).st_nlink, 2);
}

/* ---- rename --------------------------------------------------------------- */

Test(posix, rename_over_files)
{
	struct stat a, st;
	char buf[8];
	int fd;

	put(mp("a"), "AAA");
	put(mp("b"), "BBB");
	a = lst(mp("a"));
	fd = OK(open(mp("b"), O_RDONLY));
	OK(rename(mp("a"), mp("b")));
	FAILS(stat(mp("a"), &st), ENOENT);
	st = lst(mp("b"));
	cr_assert_eq(st.st_ino, a.st_ino, "renamed file has another inode");
	cr_assert_eq(st.st_nlink, 1);
	expect_str(mp("b"), "AAA");
	/* the replaced file lives on while open */
	cr_assert_eq(OK(pread(fd, buf, sizeof(buf), 0)), 3);
	cr_assert(memcmp(buf, "BBB", 3) == 0, "replaced file's content changed");
	cr_assert_eq(fst(fd).st_nlink, 0, "replaced file's nlink %lu",
		     (unsigned long)fst(fd).st_nlink);
	OK(close(fd));

	/* to itself, and between two links of one inode: no-ops */
	OK(rename(mp("b"), mp("b")));
	expect_str(mp("b"), "AAA");
	OK(link(mp("b"), mp("c")));
	OK(rename(mp("b"), mp("c")));
	cr_assert_eq(lst(mp("b")).st_nlink, 2);
	cr_assert_eq(lst(mp("c")).st_nlink, 2);

	/* across directories */
	OK(mkdir(mp("d"), 0755));
	OK(rename(mp("c"), mp("d/moved")));
	expect_str(mp("d/moved"), "AAA");
	FAILS(stat(mp("c"), &st), ENOENT);

	/* symlinks move as links */
	OK(symlink("d/moved", mp("sl")));
	OK(rename(mp("sl"), mp("sl2")));
	expect_str(mp("sl2"), "AAA");

	FAILS(rename(mp("missing"), mp("x")), ENOENT);
	FAILS(rename(mp("b"), mp("missing/x")), ENOENT);
	FAILS(rename(mp("b/x"), mp("y")), ENOTDIR);
	FAILS(rename(mp("b"), mp("b/x")), ENOTDIR);
}

Test(posix, rename_dirs)
{
	struct stat st, p1, p2;
	nlink_t root_nlink;

	OK(mkdir(mp("src"), 0755));
	put(mp("src/f"), "f");
	OK(mkdir(mp("empty"), 0755));
	root_nlink = lst(fm.mnt).st_nlink;
	/* over an empty directory */
	OK(rename(mp("src"), mp("empty")));
	FAILS(stat(mp("src"), &st), ENOENT);
	expect_str(mp("empty/f"), "f");
	cr_assert_eq(lst(fm.mnt).st_nlink, root_nlink - 1, "root nlink after dir over dir");

	/* over a non-empty directory */
	OK(mkdir(mp("full"), 0755));
	put(mp("full/g"), "g");
	FAILS(rename(mp("empty"), mp("full")), ENOTEMPTY);
	expect_str(mp("empty/f"), "f");
	expect_str(mp("full/g"), "g");

	/* kinds that do not match */
	put(mp("file"), "x");
	FAILS(rename(mp("empty"), mp("file")), ENOTDIR);
	FAILS(rename(mp("file"), mp("full")), EISDIR);

	/* into its own subtree */
	OK(mkdir(mp("full/sub"), 0755));
	FAILS(rename(mp("full"), mp("full/sub/x")), EINVAL);
	FAILS(rename(mp("full"), mp("full/sub")), EINVAL);
	FAILS(rename(mp("full"), mp("full/new")), EINVAL);

	/* between parents: nlink of both parents and ".." follow */
	OK(mkdir(mp("p1"), 0755));
	OK(mkdir(mp("p2"), 0755));
	OK(mkdir(mp("p1/x"), 0755));
	put(mp("p1/x/data"), "data");
	cr_assert_eq(lst(mp("p1")).st_nlink, 3);
	OK(rename(mp("p1/x"), mp("p2/x")));
	p1 = lst(mp("p1"));
	p2 = lst(mp("p2"));
	cr_assert_eq(p1.st_nlink, 2, "old parent nlink %lu", (unsigned long)p1.st_nlink);
	cr_assert_eq(p2.st_nlink, 3, "new parent nlink %lu", (unsigned long)p2.st_nlink);
	cr_assert_eq(lst(mp("p2/x/..")).st_ino, p2.st_ino, "'..' of a moved dir");
	expect_str(mp("p2/x/data"), "data");
	FAILS(stat(mp("p1/x"), &st), ENOENT);
}

Test(posix, rename_noreplace_exchange)
{
	struct stat f0, d0, st;
	nlink_t root_nlink;

	put(mp("a"), "A");
	put(mp("b"), "B");
	FAILS(xrenameat2(mp("a"), mp("b"), RENAME_NOREPLACE), EEXIST);
	expect_str(mp("a"), "A");
	expect_str(mp("b"), "B");
	OK(xrenameat2(mp("a"), mp("c"), RENAME_NOREPLACE));
	expect_str(mp("c"), "A");
	FAILS(stat(mp("a"), &st), ENOENT);

	/* exchange two files */
	OK(xrenameat2(mp("b"), mp("c"), RENAME_EXCHANGE));
	expect_str(mp("b"), "A");
	expect_str(mp("c"), "B");

	/* exchange a file with a directory */
	OK(mkdir(mp("dir"), 0755));
	put(mp("dir/inner"), "inner");
	put(mp("file"), "file-content");
	f0 = lst(mp("file"));
	d0 = lst(mp("dir"));
	root_nlink = lst(fm.mnt).st_nlink;
	OK(xrenameat2(mp("file"), mp("dir"), RENAME_EXCHANGE));
	st = lst(mp("file"));
	cr_assert(S_ISDIR(st.st_mode), "'file' is not the directory after exchange");
	cr_assert_eq(st.st_ino, d0.st_ino);
	st = lst(mp("dir"));
	cr_assert(S_ISREG(st.st_mode), "'dir' is not the file after exchange");
	cr_assert_eq(st.st_ino, f0.st_ino);
	expect_str(mp("file/inner"), "inner");
	expect_str(mp("dir"), "file-content");
	cr_assert_eq(lst(fm.mnt).st_nlink, root_nlink);

	/* exchange across directories moves '..' */
	OK(mkdir(mp("p"), 0755));
	put(mp("p/x"), "x");
	OK(xrenameat2(mp("file"), mp("p/x"), RENAME_EXCHANGE));
	cr_assert(S_ISDIR(lst(mp("p/x")).st_mode));
	cr_assert_eq(lst(mp("p/x/..")).st_ino, lst(mp("p")).st_ino);
	cr_assert_eq(lst(mp("p")).st_nlink, 3, "nlink of the dir that gained a subdir");
	cr_assert_eq(lst(fm.mnt).st_nlink, root_nlink, "root nlink");
	expect_str(mp("file"), "x");

	FAILS(xrenameat2(mp("b"), mp("missing"), RENAME_EXCHANGE), ENOENT);
	FAILS(xrenameat2(mp("missing"), mp("b"), RENAME_EXCHANGE), ENOENT);
	FAILS(xrenameat2(mp("b"), mp("c"), RENAME_EXCHANGE | RENAME_NOREPLACE), EINVAL);
	/* exchanging a directory into its own subtree */
	OK(mkdir(mp("p/x/deep"), 0755));
	FAILS(xrenameat2(mp("p"), mp("p/x/deep"), RENAME_EXCHANGE), EINVAL);
}

/* ---- open / create / read / write --------------------------------------- */

Test(posix, open_create_excl_trunc)
{
	struct stat st, before;
	char buf[16];
	int fd;

	fd = OK(open(mp("new"), O_CREAT | O_EXCL | O_WRONLY, 0640));
	st = fst(fd);
	cr_assert(S_ISREG(st.st_mode));
	cr_assert_eq(st.st_mode & 07777, 0640);
	cr_assert_eq(st.st_uid, 0);
	cr_assert_eq(st.st_gid, 0);
	cr_assert_eq(OK(write(fd, "hello", 5)), 5);
	OK(close(fd));

	FAILS(open(mp("new"), O_CREAT | O_EXCL | O_WRONLY, 0640), EEXIST);
	OK(symlink("dangling", mp("sl")));
	FAILS(open(mp("sl"), O_CREAT | O_EXCL | O_WRONLY, 0640), EEXIST);

	/* O_CREAT without O_EXCL opens and keeps the content */
	fd = OK(open(mp("new"), O_CREAT | O_RDWR, 0600));
	cr_assert_eq(OK(read(fd, buf, sizeof(buf))), 5);
	cr_assert_eq(fst(fd).st_mode & 07777, 0640, "O_CREAT on an existing file changed its mode");
	OK(close(fd));

	/* O_TRUNC */
	before = lst(mp("new"));
	tick();
	fd = OK(open(mp("new"), O_WRONLY | O_TRUNC));
	cr_assert_eq(fst(fd).st_size, 0);
	OK(close(fd));
	st = lst(mp("new"));
	cr_assert_eq(st.st_size, 0);
	ASSERT_TS_LATER(st.st_mtim, before.st_mtim, "mtime after O_TRUNC");
	fd = OK(open(mp("new"), O_RDONLY));
	cr_assert_eq(OK(read(fd, buf, sizeof(buf))), 0);
	OK(close(fd));

	/* umask applies to create */
	fd = OK(open(mp("m"), O_CREAT | O_WRONLY, 0777));
	cr_assert_eq(fst(fd).st_mode & 07777, 0755);
	OK(close(fd));
	/* creat() and a read-only mode: the creating fd may still write */
	fd = OK(creat(mp("ro"), 0444));
	cr_assert_eq(OK(write(fd, "x", 1)), 1);
	OK(close(fd));
	cr_assert_eq(lst(mp("ro")).st_mode & 07777, 0444);
	expect_str(mp("ro"), "x");

	OK(mkdir(mp("d"), 0755));
	FAILS(open(mp("missing"), O_RDONLY), ENOENT);
	FAILS(open(mp("d"), O_WRONLY), EISDIR);
	FAILS(open(mp("d"), O_RDWR), EISDIR);
	FAILS(open(mp("new"), O_RDONLY | O_DIRECTORY), ENOTDIR);
	FAILS(open(mp("new/"), O_RDONLY), ENOTDIR);
	FAILS(open(mp("missing/x"), O_CREAT | O_WRONLY, 0644), ENOENT);
	FAILS(open(mp("new/x"), O_CREAT | O_WRONLY, 0644), ENOTDIR);
	FAILS(open(mp("d"), O_CREAT | O_WRONLY, 0644), EISDIR);
	fd = OK(open(mp("d"), O_RDONLY | O_DIRECTORY));
	OK(close(fd));
}

Test(posix, read_write_pread_pwrite)
{
	char buf[64];
	struct iovec iov[3];
	int fd, ro, wo;

	fd = OK(open(mp("f"), O_CREAT | O_RDWR, 0644));
	cr_assert_eq(OK(write(fd, "0123456789", 10)), 10);
	cr_assert_eq(OK(lseek(fd, 0, SEEK_CUR)), 10);
	cr_assert_eq(OK(read(fd, buf, sizeof(buf))), 0, "read at EOF");
	cr_assert_eq(OK(lseek(fd, 0, SEEK_SET)), 0);
	cr_assert_eq(OK(read(fd, buf, 4)), 4);
	cr_assert(memcmp(buf, "0123", 4) == 0);
	cr_assert_eq(OK(pread(fd, buf, 3, 5)), 3);
	cr_assert(memcmp(buf, "567", 3) == 0);
	cr_assert_eq(OK(lseek(fd, 0, SEEK_CUR)), 4, "pread moved the file offset");
	cr_assert_eq(OK(pwrite(fd, "AB", 2, 8)), 2);
	cr_assert_eq(OK(lseek(fd, 0, SEEK_CUR)), 4, "pwrite moved the file offset");
	cr_assert_eq(OK(pread(fd, buf, sizeof(buf), 0)), 10);
	cr_assert(memcmp(buf, "01234567AB", 10) == 0);
	/* a write past EOF leaves a zero-filled gap */
	cr_assert_eq(OK(pwrite(fd, "Z", 1, 20)), 1);
	cr_assert_eq(fst(fd).st_size, 21);
	cr_assert_eq(OK(pread(fd, buf, sizeof(buf), 0)), 21);
	cr_assert(memcmp(buf, "01234567AB\0\0\0\0\0\0\0\0\0\0Z", 21) == 0);
	cr_assert_eq(OK(pread(fd, buf, sizeof(buf), 21)), 0);
	cr_assert_eq(OK(pread(fd, buf, sizeof(buf), 1000)), 0);
	/* vectors */
	iov[0] = (struct iovec){ "ab", 2 };
	iov[1] = (struct iovec){ "cde", 3 };
	iov[2] = (struct iovec){ "f", 1 };
	cr_assert_eq(OK(pwritev(fd, iov, 3, 2)), 6);
	memset(buf, 0, sizeof(buf));
	iov[0] = (struct iovec){ buf, 5 };
	iov[1] = (struct iovec){ buf + 10, 5 };
	cr_assert_eq(OK(preadv(fd, iov, 2, 0)), 10);
	cr_assert(memcmp(buf, "01abc", 5) == 0 && memcmp(buf + 10, "defAB", 5) == 0,
		  "preadv after pwritev: '%.5s' '%.5s'", buf, buf + 10);
	OK(close(fd));
	expect_content(mp("f"), "01abcdefAB\0\0\0\0\0\0\0\0\0\0Z", 21);

	ro = OK(open(mp("f"), O_RDONLY));
	wo = OK(open(mp("f"), O_WRONLY));
	FAILS(write(ro, "x", 1), EBADF);
	FAILS(pwrite(ro, "x", 1, 0), EBADF);
	FAILS(read(wo, buf, 1), EBADF);
	FAILS(pread(wo, buf, 1, 0), EBADF);
	OK(close(ro));
	OK(close(wo));
	/* a directory fd cannot be read() */
	ro = OK(open(fm.mnt, O_RDONLY | O_DIRECTORY));
	FAILS(read(ro, buf, 1), EISDIR);
	OK(close(ro));
}

Test(posix, fsync_fdatasync_fsyncdir)
{
	int fd, dfd;

	fd = OK(open(mp("f"), O_CREAT | O_RDWR, 0644));
	cr_assert_eq(OK(write(fd, "data", 4)), 4);
	OK(fsync(fd));
	cr_assert_eq(OK(pwrite(fd, "more", 4, 4)), 4);
	OK(fdatasync(fd));
	OK(fsync(fd)); /* nothing dirty */
	OK(syncfs(fd));
	OK(close(fd));
	expect_str(mp("f"), "datamore");

	fd = OK(open(mp("f"), O_RDONLY));
	OK(fsync(fd));
	OK(close(fd));

	OK(mkdir(mp("d"), 0755));
	put(mp("d/x"), "x");
	dfd = OK(open(mp("d"), O_RDONLY | O_DIRECTORY));
	OK(fsync(dfd));
	OK(fdatasync(dfd));
	OK(close(dfd));
	dfd = OK(open(fm.mnt, O_RDONLY | O_DIRECTORY));
	OK(fsync(dfd));
	OK(close(dfd));
}

/* ---- readdir -------------------------------------------------------------- */

struct linux_dirent64 {
	uint64_t d_ino;
	int64_t d_off;
	unsigned short d_reclen;
	unsigned char d_type;
	char d_name[];
};

/* Calls fn(name, type, ino, off, arg) for each entry one getdents64 call
 * returns; returns the number of bytes it read (0 at the end). */
static long getdents_once(int fd, char *buf, size_t size,
			  void (*fn)(const struct linux_dirent64 *, void *), void *arg)
{
	long n = syscall(SYS_getdents64, fd, buf, size);

	cr_assert(n >= 0, "getdents64: %s", strerror(errno));
	for (long pos = 0; pos < n;) {
		const struct linux_dirent64 *de = (const void *)(buf + pos);

		fn(de, arg);
		pos += de->d_reclen;
	}
	return n;
}

#define MANY 2000

struct seen {
	int count[MANY];
	int dirs[3];
	int dot, dotdot, other;
	int bad_type;
	char other_name[256];
};

static void note_entry(const struct linux_dirent64 *de, void *arg)
{
	struct seen *s = arg;
	int i;

	if (strcmp(de->d_name, ".") == 0) {
		s->dot++;
	} else if (strcmp(de->d_name, "..") == 0) {
		s->dotdot++;
	} else if (sscanf(de->d_name, "file-%d", &i) == 1 && i >= 0 && i < MANY) {
		s->count[i]++;
		if (de->d_type != DT_REG)
			s->bad_type++;
	} else if (sscanf(de->d_name, "dir-%d", &i) == 1 && i >= 0 && i < 3) {
		s->dirs[i]++;
		if (de->d_type != DT_DIR)
			s->bad_type++;
	} else {
		s->other++;
		snprintf(s->other_name, sizeof(s->other_name), "%s", de->d_name);
	}
}

Test(posix, readdir_2000_entries, .timeout = 180)
{
	static struct seen s;
	char buf[4096];
	int fd;
	DIR *d;
	struct dirent *de;
	int n;

	OK(mkdir(mp("big"), 0755));
	for (int i = 0; i < MANY; i++) {
		fd = OK(open(mp("big/file-%d", i), O_CREAT | O_EXCL | O_WRONLY, 0644));
		OK(close(fd));
	}
	for (int i = 0; i < 3; i++)
		OK(mkdir(mp("big/dir-%d", i), 0755));

	fd = OK(open(mp("big"), O_RDONLY | O_DIRECTORY));
	while (getdents_once(fd, buf, sizeof(buf), note_entry, &s) > 0)
		;
	OK(close(fd));
	cr_assert_eq(s.dot, 1, "'.' seen %d times", s.dot);
	cr_assert_eq(s.dotdot, 1, "'..' seen %d times", s.dotdot);
	cr_assert_eq(s.other, 0, "unexpected entry '%s'", s.other_name);
	cr_assert_eq(s.bad_type, 0, "%d entries with a wrong d_type", s.bad_type);
	for (int i = 0; i < MANY; i++)
		cr_assert_eq(s.count[i], 1, "file-%d seen %d times", i, s.count[i]);
	for (int i = 0; i < 3; i++)
		cr_assert_eq(s.dirs[i], 1, "dir-%d seen %d times", i, s.dirs[i]);

	/* readdir(3), and d_ino agrees with stat */
	d = opendir(mp("big"));
	cr_assert(d != NULL, "opendir: %s", strerror(errno));
	n = 0;
	while ((errno = 0, de = readdir(d))) {
		n++;
		if (strncmp(de->d_name, "file-", 5) == 0 && atoi(de->d_name + 5) % 97 == 0) {
			struct stat st = lst(mp("big/%s", de->d_name));

			cr_assert_eq(de->d_ino, st.st_ino, "%s: d_ino %lu, st_ino %lu", de->d_name,
				     (unsigned long)de->d_ino, (unsigned long)st.st_ino);
		}
	}
	cr_assert_eq(errno, 0, "readdir: %s", strerror(errno));
	cr_assert_eq(n, MANY + 3 + 2);
	/* rewinddir starts over */
	rewinddir(d);
	n = 0;
	while (readdir(d))
		n++;
	cr_assert_eq(n, MANY + 3 + 2, "after rewinddir: %d entries", n);
	closedir(d);

	/* the directory's link count ignores files */
	cr_assert_eq(lst(mp("big")).st_nlink, 2 + 3);
}

struct offs {
	int n;
	char name[400][32];
	int64_t off[400];
};

static void note_off(const struct linux_dirent64 *de, void *arg)
{
	struct offs *o = arg;

	if (o->n < 400) {
		snprintf(o->name[o->n], sizeof(o->name[0]), "%s", de->d_name);
		o->off[o->n] = de->d_off;
		o->n++;
	}
}

Test(posix, readdir_offsets_seek)
{
	static struct offs all, again;
	char buf[512];
	int fd;

	OK(mkdir(mp("d"), 0755));
	for (int i = 0; i < 300; i++) {
		fd = OK(open(mp("d/entry-%03d", i), O_CREAT | O_WRONLY, 0644));
		OK(close(fd));
	}
	fd = OK(open(mp("d"), O_RDONLY | O_DIRECTORY));
	while (getdents_once(fd, buf, sizeof(buf), note_off, &all) > 0)
		;
	cr_assert_eq(all.n, 302, "%d entries", all.n);
	/* seeking to an entry's d_off continues with the next entry */
	for (int k = 0; k < all.n - 1; k += 37) {
		again.n = 0;
		OK(lseek(fd, all.off[k], SEEK_SET));
		getdents_once(fd, buf, sizeof(buf), note_off, &again);
		cr_assert_geq(again.n, 1, "nothing after seeking to d_off of entry %d", k);
		cr_assert_str_eq(again.name[0], all.name[k + 1],
				 "after seek to d_off of entry %d ('%s'): '%s', expected '%s'", k,
				 all.name[k], again.name[0], all.name[k + 1]);
	}
	/* back to the start */
	again.n = 0;
	OK(lseek(fd, 0, SEEK_SET));
	getdents_once(fd, buf, sizeof(buf), note_off, &again);
	cr_assert_str_eq(again.name[0], all.name[0]);
	/* past the last entry */
	again.n = 0;
	OK(lseek(fd, all.off[all.n - 1], SEEK_SET));
	cr_assert_eq(getdents_once(fd, buf, sizeof(buf), note_off, &again), 0,
		     "entries after the last d_off");
	OK(close(fd));
}

#define KEEP 1000
#define GONE 500
#define NEWN 600

struct churn {
	int keep[KEEP], gone[GONE], added[NEWN];
	int other;
	char other_name[256];
};

static void note_churn(const struct linux_dirent64 *de, void *arg)
{
	struct churn *c = arg;
	int i;

	if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
		return;
	if (sscanf(de->d_name, "keep-%d", &i) == 1 && i >= 0 && i < KEEP)
		c->keep[i]++;
	else if (sscanf(de->d_name, "gone-%d", &i) == 1 && i >= 0 && i < GONE)
		c->gone[i]++;
	else if (sscanf(de->d_name, "new-%d", &i) == 1 && i >= 0 && i < NEWN)
		c->added[i]++;
	else {
		c->other++;
		snprintf(c->other_name, sizeof(c->other_name), "%s", de->d_name);
	}
}

Test(posix, readdir_stable_under_concurrent_changes, .timeout = 180)
{
	static struct churn c;
	char buf[1024];
	int fd, dfd, gone_next = 0, new_next = 0, calls = 0;

	OK(mkdir(mp("d"), 0755));
	/* interleave the names so the changes land all over the listing */
	for (int i = 0; i < KEEP; i++) {
		fd = OK(open(mp("d/keep-%d", i), O_CREAT | O_WRONLY, 0644));
		OK(close(fd));
		if (i % 2 == 0) {
			fd = OK(open(mp("d/gone-%d", i / 2), O_CREAT | O_WRONLY, 0644));
			OK(close(fd));
		}
	}
	dfd = OK(open(mp("d"), O_RDONLY | O_DIRECTORY));
	while (getdents_once(dfd, buf, sizeof(buf), note_churn, &c) > 0) {
		calls++;
		/* after each batch: delete some, create some */
		for (int k = 0; k < 25 && gone_next < GONE; k++)
			OK(unlink(mp("d/gone-%d", gone_next++)));
		for (int k = 0; k < 30 && new_next < NEWN; k++) {
			fd = OK(open(mp("d/new-%d", new_next++), O_CREAT | O_WRONLY, 0644));
			OK(close(fd));
		}
	}
	OK(close(dfd));
	cr_assert_gt(calls, 10, "the listing took only %d getdents calls", calls);
	cr_assert_eq(c.other, 0, "unexpected entry '%s'", c.other_name);
	for (int i = 0; i < KEEP; i++)
		cr_assert_eq(c.keep[i], 1, "keep-%d (never touched) seen %d times", i, c.keep[i]);
	for (int i = 0; i < GONE; i++)
		cr_assert_leq(c.gone[i], 1, "gone-%d seen %d times", i, c.gone[i]);
	for (int i = 0; i < NEWN; i++)
		cr_assert_leq(c.added[i], 1, "new-%d seen %d times", i, c.added[i]);

	/* a fresh listing shows exactly the current content */
	memset(&c, 0, sizeof(c));
	dfd = OK(open(mp("d"), O_RDONLY | O_DIRECTORY));
	while (getdents_once(dfd, buf, sizeof(buf), note_churn, &c) > 0)
		;
	OK(close(dfd));
	for (int i = 0; i < KEEP; i++)
		cr_assert_eq(c.keep[i], 1, "fresh listing: keep-%d seen %d times", i, c.keep[i]);
	for (int i = 0; i < gone_next; i++)
		cr_assert_eq(c.gone[i], 0, "fresh listing: deleted gone-%d still listed", i);
	for (int i = 0; i < new_next; i++)
		cr_assert_eq(c.added[i], 1, "fresh listing: new-%d seen %d times", i, c.added[i]);
}

Test(posix, opendir_errors)
{
	put(mp("f"), "x");
	cr_assert_null(opendir(mp("f")));
	cr_assert_eq(errno, ENOTDIR, "opendir(file): %s", fm_errname(errno));
	cr_assert_null(opendir(mp("missing")));
	cr_assert_eq(errno, ENOENT, "opendir(missing): %s", fm_errname(errno));
}

/* ---- statfs --------------------------------------------------------------- */

Test(posix, statfs_values)
{
	struct statvfs sv, fsv;
	struct statfs sf;
	int fd;

	OK(statvfs(fm.mnt, &sv));
	cr_assert_gt(sv.f_bsize, 0);
	cr_assert_gt(sv.f_frsize, 0);
	cr_assert_gt(sv.f_blocks, 0, "f_blocks is 0");
	cr_assert_geq(sv.f_blocks, sv.f_bfree);
	cr_assert_geq(sv.f_bfree, sv.f_bavail);
	cr_assert_geq(sv.f_files, sv.f_ffree);
	cr_assert_eq(sv.f_namemax, 255, "f_namemax %lu", sv.f_namemax);
	cr_assert(sv.f_flag & ST_NODEV, "mount is not nodev (f_flag 0x%lx)", sv.f_flag);
	OK(statfs(fm.mnt, &sf));
	cr_assert_eq(sf.f_type, FUSE_SUPER_MAGIC);

	put(mp("f"), "x");
	fd = OK(open(mp("f"), O_RDONLY));
	OK(fstatvfs(fd, &fsv));
	cr_assert_eq(fsv.f_bsize, sv.f_bsize);
	cr_assert_eq(fsv.f_namemax, 255);
	OK(close(fd));
	FAILS(statvfs(mp("missing"), &sv), ENOENT);
}

/* ---- xattrs --------------------------------------------------------------- */

static bool list_has(const char *list, ssize_t len, const char *name)
{
	for (ssize_t i = 0; i < len; i += (ssize_t)strlen(list + i) + 1)
		if (strcmp(list + i, name) == 0)
			return true;
	return false;
}

static uint64_t stat_getxattr(void)
{
	struct fm_stats s;

	fm_stats_read(&s);
	return fm_stats_need(&s, "fuse_requests_getxattr");
}

/* POSIX ACLs would not be enforced (no FUSE_POSIX_ACL): refused as on a
 * file system mounted noacl, never stored and ignored. ls then stops asking
 * for them after the first file of the mount. */
Test(posix, posix_acls_are_refused_not_ignored)
{
	/* version 2; user::rw- user:65534:r-- group::--- mask::r-- other::--- */
	static const uint32_t acl[] = { 2, 0x00060001, 0xffffffff, 0x00040002, 65534,
					0x00000004, 0xffffffff, 0x00040010, 0xffffffff,
					0x00000020, 0xffffffff };
	char buf[256], cmd[PATH_MAX + 64];
	ssize_t n;
	uint64_t x0;

	put(mp("f"), "x");
	OK(chmod(mp("f"), 0600));
	FAILS(setxattr(mp("f"), "system.posix_acl_access", acl, sizeof(acl), 0), EOPNOTSUPP);
	FAILS(getxattr(mp("f"), "system.posix_acl_access", buf, sizeof(buf)), EOPNOTSUPP);
	FAILS(removexattr(mp("f"), "system.posix_acl_access"), EOPNOTSUPP);
	OK(mkdir(mp("d"), 0755));
	FAILS(setxattr(mp("d"), "system.posix_acl_default", acl, sizeof(acl), 0), EOPNOTSUPP);
	FAILS(getxattr(mp("d"), "system.posix_acl_default", buf, sizeof(buf)), EOPNOTSUPP);
	/* what uid 65534 may do is what the mode says */
	FAILS(NOBODY(.kind = OP_OPEN, .path = mp("f"), .flags = O_RDONLY), EACCES);
	OK(setxattr(mp("f"), "user.kept", "v", 1, 0));
	n = OK(listxattr(mp("f"), buf, sizeof(buf)));
	cr_assert(list_has(buf, n, "user.kept"));
	cr_assert(!list_has(buf, n, "system.posix_acl_access"));

	for (int k = 0; k < 40; k++) {
		snprintf(cmd, sizeof(cmd), "%s/f%d", mp("d"), k);
		put(cmd, "x");
	}
	x0 = stat_getxattr();
	snprintf(cmd, sizeof(cmd), "ls -l '%s' > /dev/null", mp("d"));
	cr_assert_eq(system(cmd), 0);
	/* one (security.selinux) per file, and the first file's ACL question */
	cr_assert_leq(stat_getxattr() - x0, 40 + 3, "ls -l of 40 files asked %llu GETXATTRs",
		      (unsigned long long)(stat_getxattr() - x0));
}

Test(posix, xattrs_set_get_list_remove)
{
	char buf[8192], bin[4000];
	ssize_t n, len;
	int fd, user_names = 0;
	uint64_t seed = 42;

	put(mp("f"), "x");
	OK(setxattr(mp("f"), "user.a", "value-a", 7, XATTR_CREATE));
	cr_assert_eq(OK(getxattr(mp("f"), "user.a", NULL, 0)), 7, "size query");
	memset(buf, 0, sizeof(buf));
	cr_assert_eq(OK(getxattr(mp("f"), "user.a", buf, 7)), 7);
	cr_assert(memcmp(buf, "value-a", 7) == 0);
	FAILS(getxattr(mp("f"), "user.a", buf, 3), ERANGE);

	FAILS(setxattr(mp("f"), "user.a", "x", 1, XATTR_CREATE), EEXIST);
	FAILS(setxattr(mp("f"), "user.none", "x", 1, XATTR_REPLACE), ENODATA);
	FAILS(getxattr(mp("f"), "user.none", buf, sizeof(buf)), ENODATA);
	OK(setxattr(mp("f"), "user.a", "v2", 2, XATTR_REPLACE));
	cr_assert_eq(OK(getxattr(mp("f"), "user.a", buf, sizeof(buf))), 2);
	cr_assert(memcmp(buf, "v2", 2) == 0);
	OK(setxattr(mp("f"), "user.a", "third", 5, 0));
	cr_assert_eq(OK(getxattr(mp("f"), "user.a", buf, sizeof(buf))), 5);

	/* empty and binary values */
	OK(setxattr(mp("f"), "user.empty", "", 0, 0));
	cr_assert_eq(OK(getxattr(mp("f"), "user.empty", buf, sizeof(buf))), 0);
	fm_fill_random(&seed, bin, sizeof(bin));
	bin[0] = 0;
	bin[100] = 0;
	OK(setxattr(mp("f"), "user.bin", bin, sizeof(bin), 0));
	cr_assert_eq(OK(getxattr(mp("f"), "user.bin", buf, sizeof(buf))), (ssize_t)sizeof(bin));
	cr_assert(memcmp(buf, bin, sizeof(bin)) == 0, "binary xattr value differs");

	/* list */
	len = OK(listxattr(mp("f"), NULL, 0));
	cr_assert_gt(len, 0);
	n = OK(listxattr(mp("f"), buf, sizeof(buf)));
	cr_assert_eq(n, len, "listxattr size %zd, size query said %zd", n, len);
	cr_assert(list_has(buf, n, "user.a"));
	cr_assert(list_has(buf, n, "user.empty"));
	cr_assert(list_has(buf, n, "user.bin"));
	for (ssize_t i = 0; i < n; i += (ssize_t)strlen(buf + i) + 1)
		user_names += strncmp(buf + i, "user.", 5) == 0;
	cr_assert_eq(user_names, 3, "listxattr lists %d user.* names", user_names);
	FAILS(listxattr(mp("f"), buf, (size_t)len - 1), ERANGE);

	/* remove */
	OK(removexattr(mp("f"), "user.empty"));
	FAILS(getxattr(mp("f"), "user.empty", buf, sizeof(buf)), ENODATA);
	FAILS(removexattr(mp("f"), "user.empty"), ENODATA);
	n = OK(listxattr(mp("f"), buf, sizeof(buf)));
	cr_assert(!list_has(buf, n, "user.empty"), "removed name still listed");
	cr_assert(list_has(buf, n, "user.a"));

	/* through an fd, on a directory */
	fd = OK(open(mp("f"), O_RDONLY));
	OK(fsetxattr(fd, "user.fd", "1", 1, 0));
	cr_assert_eq(OK(fgetxattr(fd, "user.fd", buf, sizeof(buf))), 1);
	OK(fremovexattr(fd, "user.fd"));
	OK(close(fd));
	OK(mkdir(mp("d"), 0755));
	OK(setxattr(mp("d"), "user.dir", "dv", 2, 0));
	cr_assert_eq(OK(getxattr(mp("d"), "user.dir", buf, sizeof(buf))), 2);

	/* a file without xattrs lists nothing */
	put(mp("plain"), "x");
	cr_assert_eq(OK(listxattr(mp("plain"), buf, sizeof(buf))), 0);
	FAILS(getxattr(mp("missing"), "user.a", buf, sizeof(buf)), ENOENT);
	/* user.* on a symlink is refused */
	OK(symlink("f", mp("l")));
	FAILS(lsetxattr(mp("l"), "user.x", "v", 1, 0), EPERM);
	/* xattrs survive a rename and follow hard links */
	OK(rename(mp("f"), mp("g")));
	cr_assert_eq(OK(getxattr(mp("g"), "user.a", buf, sizeof(buf))), 5);
	OK(link(mp("g"), mp("h")));
	OK(setxattr(mp("h"), "user.h", "h", 1, 0));
	cr_assert_eq(OK(getxattr(mp("g"), "user.h", buf, sizeof(buf))), 1);
}

/* ---- access --------------------------------------------------------------- */

Test(posix, access_root_and_nobody)
{
	put(mp("rw"), "x");      /* 0644 */
	put(mp("priv"), "x");
	OK(chmod(mp("priv"), 0600));
	put(mp("exe"), "x");
	OK(chmod(mp("exe"), 0755));

	OK(access(mp("rw"), R_OK | W_OK));
	OK(access(mp("rw"), F_OK));
	FAILS(access(mp("rw"), X_OK), EACCES);
	OK(access(mp("exe"), X_OK));
	OK(access(fm.mnt, X_OK));
	FAILS(access(mp("missing"), F_OK), ENOENT);

	OK(NOBODY(.kind = OP_ACCESS, .path = mp("rw"), .flags = R_OK));
	FAILS(NOBODY(.kind = OP_ACCESS, .path = mp("rw"), .flags = W_OK), EACCES);
	FAILS(NOBODY(.kind = OP_ACCESS, .path = mp("priv"), .flags = R_OK), EACCES);
	OK(NOBODY(.kind = OP_ACCESS, .path = mp("priv"), .flags = F_OK));
	OK(NOBODY(.kind = OP_ACCESS, .path = mp("exe"), .flags = R_OK | X_OK));
	FAILS(NOBODY(.kind = OP_ACCESS, .path = mp("exe"), .flags = W_OK), EACCES);
}

/* ---- fallocate / lseek ---------------------------------------------------- */

Test(posix, fallocate_mode0_and_punch_hole)
{
	static char buf[192 * 1024], want[192 * 1024];
	int fd;

	fd = OK(open(mp("f"), O_CREAT | O_RDWR, 0644));
	OK(fallocate(fd, 0, 0, 1 << 20));
	cr_assert_eq(fst(fd).st_size, 1 << 20, "size after fallocate %lld",
		     (long long)fst(fd).st_size);
	fm_pread_all(fd, buf, sizeof(buf), 0);
	memset(want, 0, sizeof(want));
	cr_assert(memcmp(buf, want, sizeof(buf)) == 0, "fallocated range is not zero");
	/* beyond EOF extends */
	OK(fallocate(fd, 0, 2 << 20, 4096));
	cr_assert_eq(fst(fd).st_size, (2 << 20) + 4096);
	/* inside the file keeps the size and the data */
	fm_pwrite_all(fd, "keep", 4, 100);
	OK(fallocate(fd, 0, 0, 4096));
	cr_assert_eq(fst(fd).st_size, (2 << 20) + 4096);
	cr_assert_eq(OK(pread(fd, buf, 4, 100)), 4);
	cr_assert(memcmp(buf, "keep", 4) == 0, "fallocate changed existing data");
	OK(close(fd));

	/* punch a hole in the middle of written data */
	memset(want, 'x', sizeof(want));
	fm_write_file(mp("p"), want, sizeof(want));
	fd = OK(open(mp("p"), O_RDWR));
	OK(fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 64 * 1024 + 100, 64 * 1024));
	memset(want + 64 * 1024 + 100, 0, 64 * 1024);
	cr_assert_eq(fst(fd).st_size, (off_t)sizeof(want), "punch hole changed the size");
	fm_pread_all(fd, buf, sizeof(buf), 0);
	cr_assert(memcmp(buf, want, sizeof(buf)) == 0, "content after punch hole (open file)");
	/* past EOF: nothing changes */
	OK(fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, sizeof(want) - 10, 4096));
	memset(want + sizeof(want) - 10, 0, 10);
	cr_assert_eq(fst(fd).st_size, (off_t)sizeof(want));
	OK(close(fd));
	expect_content(mp("p"), want, sizeof(want));

	fd = OK(open(mp("p"), O_RDWR));
	FAILS(fallocate(fd, FALLOC_FL_PUNCH_HOLE, 0, 4096), EOPNOTSUPP);
	FAILS(fallocate(fd, 0, 0, 0), EINVAL);
	FAILS(fallocate(fd, 0, -1, 10), EINVAL);
	FAILS(fallocate(fd, FALLOC_FL_COLLAPSE_RANGE, 0, 4096), EOPNOTSUPP);
	OK(close(fd));
	fd = OK(open(mp("p"), O_RDONLY));
	FAILS(fallocate(fd, 0, 0, 4096), EBADF);
	OK(close(fd));
}

Test(posix, lseek_data_hole_sparse)
{
	const off_t mib = 1 << 20, size = 8 * mib + 4096;
	char blk[4096];
	off_t h, d;
	int fd;

	memset(blk, 'D', sizeof(blk));
	fd = OK(open(mp("sparse"), O_CREAT | O_WRONLY, 0644));
	fm_pwrite_all(fd, blk, sizeof(blk), 0);
	fm_pwrite_all(fd, blk, sizeof(blk), 8 * mib);
	OK(close(fd));

	fd = OK(open(mp("sparse"), O_RDONLY));
	cr_assert_eq(fst(fd).st_size, size);
	cr_assert_eq(OK(lseek(fd, 0, SEEK_DATA)), 0);
	{
		/* A mount with the writeback cache leaves SEEK_DATA/SEEK_HOLE
		 * to the kernel: the whole file is data (README). */
		struct fm_stats s;
		uint64_t wb = 0;
		fm_stats_read(&s);
		fm_stats_get(&s, "writeback_cache", &wb);
		if (wb) {
			cr_assert_eq(OK(lseek(fd, 0, SEEK_HOLE)), size);
			cr_assert_eq(OK(lseek(fd, 3 * mib, SEEK_DATA)), 3 * mib);
			FAILS(lseek(fd, size, SEEK_DATA), ENXIO);
			OK(close(fd));
			return;
		}
	}
	h = OK(lseek(fd, 0, SEEK_HOLE));
	cr_assert(h >= 4096 && h <= 8 * mib, "SEEK_HOLE from 0 gave %lld: the 8 MiB gap "
		  "is not reported as a hole", (long long)h);
	d = OK(lseek(fd, h, SEEK_DATA));
	cr_assert(d > h && d <= 8 * mib, "SEEK_DATA from the hole at %lld gave %lld",
		  (long long)h, (long long)d);
	d = OK(lseek(fd, 3 * mib, SEEK_DATA));
	cr_assert(d >= 3 * mib && d <= 8 * mib, "SEEK_DATA from 3 MiB gave %lld", (long long)d);
	cr_assert_eq(OK(lseek(fd, 8 * mib, SEEK_DATA)), 8 * mib);
	cr_assert_eq(OK(lseek(fd, 8 * mib, SEEK_HOLE)), size, "EOF is the last hole");
	cr_assert_eq(OK(lseek(fd, size - 1, SEEK_HOLE)), size);
	FAILS(lseek(fd, size, SEEK_DATA), ENXIO);
	FAILS(lseek(fd, size, SEEK_HOLE), ENXIO);
	FAILS(lseek(fd, size + 100, SEEK_DATA), ENXIO);
	/* the hole reads as zeros */
	{
		char z[4096], zero[4096] = { 0 };

		fm_pread_all(fd, z, sizeof(z), 4 * mib);
		cr_assert(memcmp(z, zero, sizeof(z)) == 0);
	}
	OK(close(fd));

	/* a hole at the end after growing */
	OK(truncate(mp("sparse"), 16 * mib));
	fd = OK(open(mp("sparse"), O_RDONLY));
	errno = 0;
	d = lseek(fd, 9 * mib, SEEK_DATA);
	cr_assert((d == -1 && errno == ENXIO) || (d >= 9 * mib && d < 16 * mib),
		  "SEEK_DATA in the trailing hole gave %lld/%s", (long long)d, fm_errname(errno));
	cr_assert_eq(OK(lseek(fd, 9 * mib, SEEK_HOLE)), 9 * mib);
	OK(close(fd));
}

/* ---- times ---------------------------------------------------------------- */

Test(posix, write_updates_mtime_ctime)
{
	struct stat before, after;
	char buf[4];
	int fd;

	put(mp("f"), "abc");
	before = lst(mp("f"));
	tick();
	fd = OK(open(mp("f"), O_WRONLY));
	cr_assert_eq(OK(pwrite(fd, "x", 1, 1)), 1);
	OK(close(fd));
	after = lst(mp("f"));
	ASSERT_TS_LATER(after.st_mtim, before.st_mtim, "mtime after write");
	ASSERT_TS_LATER(after.st_ctim, before.st_ctim, "ctime after write");

	/* reading does not change mtime or ctime */
	before = after;
	tick();
	fd = OK(open(mp("f"), O_RDONLY));
	cr_assert_eq(OK(read(fd, buf, sizeof(buf))), 3);
	OK(close(fd));
	after = lst(mp("f"));
	ASSERT_TS_SAME(after.st_mtim, before.st_mtim, "mtime after read");
	ASSERT_TS_SAME(after.st_ctim, before.st_ctim, "ctime after read");

	/* xattr changes move ctime */
	before = after;
	tick();
	OK(setxattr(mp("f"), "user.x", "1", 1, 0));
	after = lst(mp("f"));
	ASSERT_TS_LATER(after.st_ctim, before.st_ctim, "ctime after setxattr");
	ASSERT_TS_SAME(after.st_mtim, before.st_mtim, "mtime after setxattr");
}

/* ---- permissions as uid 65534 -------------------------------------------- */

Test(posix, perm_private_dir_and_files)
{
	struct timespec ts[2] = { { 1, 0 }, { 2, 0 } };

	OK(mkdir(mp("priv"), 0700));
	put(mp("priv/f"), "x");
	FAILS(NOBODY(.kind = OP_OPENDIR, .path = mp("priv")), EACCES);
	FAILS(NOBODY(.kind = OP_STAT, .path = mp("priv/f")), EACCES);
	FAILS(NOBODY(.kind = OP_OPEN, .path = mp("priv/f"), .flags = O_RDONLY), EACCES);
	FAILS(NOBODY(.kind = OP_CREATE, .path = mp("priv/new"), .mode = 0644), EACCES);
	FAILS(NOBODY(.kind = OP_UNLINK, .path = mp("priv/f")), EACCES);
	FAILS(NOBODY(.kind = OP_MKDIR, .path = mp("priv/sub"), .mode = 0755), EACCES);
	OK(NOBODY(.kind = OP_STAT, .path = mp("priv")));

	/* a root-owned 0755 directory: readable, not writable */
	OK(mkdir(mp("pub"), 0755));
	put(mp("pub/f"), "x"); /* 0644 */
	OK(NOBODY(.kind = OP_OPENDIR, .path = mp("pub")));
	OK(NOBODY(.kind = OP_OPEN, .path = mp("pub/f"), .flags = O_RDONLY));
	FAILS(NOBODY(.kind = OP_CREATE, .path = mp("pub/new"), .mode = 0644), EACCES);
	FAILS(NOBODY(.kind = OP_UNLINK, .path = mp("pub/f")), EACCES);
	FAILS(NOBODY(.kind = OP_RENAME, .path = mp("pub/f"), .path2 = mp("pub/g")), EACCES);
	FAILS(NOBODY(.kind = OP_OPEN, .path = mp("pub/f"), .flags = O_WRONLY), EACCES);
	FAILS(NOBODY(.kind = OP_OPEN, .path = mp("pub/f"), .flags = O_RDWR | O_TRUNC), EACCES);
	FAILS(NOBODY(.kind = OP_TRUNCATE, .path = mp("pub/f"), .size = 0), EACCES);
	FAILS(NOBODY(.kind = OP_SETXATTR, .path = mp("pub/f")), EACCES);
	FAILS(NOBODY(.kind = OP_CHMOD, .path = mp("pub/f"), .mode = 0777), EPERM);
	FAILS(NOBODY(.kind = OP_CHOWN, .path = mp("pub/f"), .uid = FM_NOBODY_UID,
		     .gid = (gid_t)-1),
	      EPERM);
	FAILS(NOBODY(.kind = OP_UTIMES_NOW, .path = mp("pub/f")), EACCES);
	FAILS(NOBODY(.kind = OP_UTIMES_SET, .path = mp("pub/f")), EPERM);
	/* EPERM where fs.protected_hardlinks refuses before the directory check */
	FAILS2(NOBODY(.kind = OP_LINK, .path = mp("pub/f"), .path2 = mp("pub/l")), EACCES, EPERM);
	expect_str(mp("pub/f"), "x");

	/* 0600 root file */
	put(mp("secret"), "s");
	OK(chmod(mp("secret"), 0600));
	FAILS(NOBODY(.kind = OP_OPEN, .path = mp("secret"), .flags = O_RDONLY), EACCES);

	/* 0666 root file: writable, times may be set to now but not to a value */
	put(mp("shared"), "x");
	OK(chmod(mp("shared"), 0666));
	OK(NOBODY(.kind = OP_APPEND, .path = mp("shared")));
	expect_str(mp("shared"), "x!");
	OK(NOBODY(.kind = OP_UTIMES_NOW, .path = mp("shared")));
	FAILS(NOBODY(.kind = OP_UTIMES_SET, .path = mp("shared")), EPERM);
	OK(utimensat(AT_FDCWD, mp("shared"), ts, 0));
}

Test(posix, perm_new_files_owned_by_caller)
{
	struct stat st;

	OK(mkdir(mp("open"), 0777));
	OK(chmod(mp("open"), 0777));
	OK(NOBODY(.kind = OP_CREATE, .path = mp("open/mine"), .mode = 0640));
	st = lst(mp("open/mine"));
	cr_assert_eq(st.st_uid, FM_NOBODY_UID, "new file uid %u", st.st_uid);
	cr_assert_eq(st.st_gid, FM_NOBODY_GID, "new file gid %u", st.st_gid);
	cr_assert_eq(st.st_mode & 07777, 0640);
	OK(NOBODY(.kind = OP_MKDIR, .path = mp("open/mydir"), .mode = 0750));
	st = lst(mp("open/mydir"));
	cr_assert_eq(st.st_uid, FM_NOBODY_UID);
	cr_assert_eq(st.st_gid, FM_NOBODY_GID);
	cr_assert_eq(st.st_mode & 07777, 0750);
	/* the owner may chmod and set times on its own file */
	OK(NOBODY(.kind = OP_CHMOD, .path = mp("open/mine"), .mode = 0600));
	cr_assert_eq(lst(mp("open/mine")).st_mode & 07777, 0600);
	OK(NOBODY(.kind = OP_UTIMES_SET, .path = mp("open/mine")));
	cr_assert_eq(lst(mp("open/mine")).st_mtim.tv_sec, 2000);
	/* but not give it away */
	FAILS(NOBODY(.kind = OP_CHOWN, .path = mp("open/mine"), .uid = 0, .gid = (gid_t)-1),
	      EPERM);
	OK(NOBODY(.kind = OP_UNLINK, .path = mp("open/mine")));
	OK(NOBODY(.kind = OP_RMDIR, .path = mp("open/mydir")));
}

Test(posix, perm_sticky_dir)
{
	struct stat st;

	OK(mkdir(mp("tmp"), 0777));
	OK(chmod(mp("tmp"), 01777));
	cr_assert_eq(lst(mp("tmp")).st_mode & 07777, 01777);
	put(mp("tmp/rootfile"), "r");
	OK(chmod(mp("tmp/rootfile"), 0666));
	OK(mkdir(mp("tmp/rootdir"), 0777));
	OK(chmod(mp("tmp/rootdir"), 0777));

	OK(NOBODY(.kind = OP_CREATE, .path = mp("tmp/mine"), .mode = 0644));
	st = lst(mp("tmp/mine"));
	cr_assert_eq(st.st_uid, FM_NOBODY_UID);
	/* another user's entries cannot be removed or renamed */
	FAILS2(NOBODY(.kind = OP_UNLINK, .path = mp("tmp/rootfile")), EPERM, EACCES);
	FAILS2(NOBODY(.kind = OP_RENAME, .path = mp("tmp/rootfile"), .path2 = mp("tmp/stolen")),
	       EPERM, EACCES);
	FAILS2(NOBODY(.kind = OP_RMDIR, .path = mp("tmp/rootdir")), EPERM, EACCES);
	FAILS2(NOBODY(.kind = OP_RENAME, .path = mp("tmp/mine"), .path2 = mp("tmp/rootfile")),
	       EPERM, EACCES);
	expect_str(mp("tmp/rootfile"), "r");
	/* but written, since the mode allows it */
	OK(NOBODY(.kind = OP_APPEND, .path = mp("tmp/rootfile")));
	/* own entries can */
	OK(NOBODY(.kind = OP_RENAME, .path = mp("tmp/mine"), .path2 = mp("tmp/mine2")));
	OK(NOBODY(.kind = OP_UNLINK, .path = mp("tmp/mine2")));
	/* the owner of the directory (root) can remove anything */
	OK(NOBODY(.kind = OP_CREATE, .path = mp("tmp/theirs"), .mode = 0644));
	OK(unlink(mp("tmp/theirs")));
}

Test(posix, perm_setgid_dir_inheritance)
{
	struct stat st;

	OK(mkdir(mp("sg"), 0775));
	OK(chown(mp("sg"), 0, 1234));
	OK(chmod(mp("sg"), 02777));
	cr_assert_eq(lst(mp("sg")).st_mode & 07777, 02777);

	put(mp("sg/f"), "x");
	st = lst(mp("sg/f"));
	cr_assert_eq(st.st_gid, 1234, "file in setgid dir has gid %u", st.st_gid);
	cr_assert_eq(st.st_uid, 0);
	OK(mkdir(mp("sg/sub"), 0755));
	st = lst(mp("sg/sub"));
	cr_assert_eq(st.st_gid, 1234, "dir in setgid dir has gid %u", st.st_gid);
	cr_assert(st.st_mode & S_ISGID, "subdir of a setgid dir lacks setgid: %o", st.st_mode);
	OK(mkfifo(mp("sg/fifo"), 0644));
	cr_assert_eq(lst(mp("sg/fifo")).st_gid, 1234);
	OK(symlink("f", mp("sg/link")));
	cr_assert_eq(lst(mp("sg/link")).st_gid, 1234);
	/* two levels down */
	put(mp("sg/sub/g"), "x");
	cr_assert_eq(lst(mp("sg/sub/g")).st_gid, 1234);

	/* as uid 65534: owner is the caller, group the directory's */
	OK(NOBODY(.kind = OP_CREATE, .path = mp("sg/nob"), .mode = 0644));
	st = lst(mp("sg/nob"));
	cr_assert_eq(st.st_uid, FM_NOBODY_UID);
	cr_assert_eq(st.st_gid, 1234, "nobody's file in setgid dir has gid %u", st.st_gid);
	/* a non-member cannot create a setgid file there */
	OK(NOBODY(.kind = OP_CREATE, .path = mp("sg/nobsg"), .mode = 02755));
	st = lst(mp("sg/nobsg"));
	cr_assert_eq(st.st_gid, 1234);
	cr_assert(!(st.st_mode & S_ISGID), "setgid kept on a file of a non-member: %o",
		  st.st_mode & 07777);
	OK(NOBODY(.kind = OP_MKDIR, .path = mp("sg/nobdir"), .mode = 0755));
	st = lst(mp("sg/nobdir"));
	cr_assert_eq(st.st_gid, 1234);
	cr_assert(st.st_mode & S_ISGID, "nobody's subdir of a setgid dir lacks setgid");
}

Test(posix, perm_suid_sgid_cleared)
{
	struct stat st;

	/* write by a non-owner clears suid and sgid (daemon write path: the
	 * file has content when opened) */
	put(mp("w"), "content");
	OK(chmod(mp("w"), 06777));
	OK(NOBODY(.kind = OP_APPEND, .path = mp("w")));
	st = lst(mp("w"));
	cr_assert_eq(st.st_mode & 07777, 0777, "after a write by uid 65534: mode %o",
		     st.st_mode & 07777);
	expect_str(mp("w"), "content!");

	/* the same on an empty file (the passthrough candidate) */
	OK(mknod(mp("e"), S_IFREG | 0644, 0));
	OK(chmod(mp("e"), 06777));
	OK(NOBODY(.kind = OP_APPEND, .path = mp("e")));
	st = lst(mp("e"));
	cr_assert_eq(st.st_mode & 07777, 0777, "after a write to an empty file by uid 65534: "
		     "mode %o", st.st_mode & 07777);
	expect_str(mp("e"), "!");

	/* the same while another open for write keeps the file's staging
	 * file (passthrough): the append shares it, bypassing the daemon */
	put(mp("ws"), "content");
	int hold = OK(open(mp("ws"), O_WRONLY));
	OK(chmod(mp("ws"), 06777));
	OK(NOBODY(.kind = OP_APPEND, .path = mp("ws")));
	st = lst(mp("ws"));
	OK(close(hold));
	cr_assert_eq(st.st_mode & 07777, 0777, "after a write by uid 65534 beside a writer: "
		     "mode %o", st.st_mode & 07777);
	expect_str(mp("ws"), "content!");

	/* truncate by a non-owner */
	put(mp("t"), "content");
	OK(chmod(mp("t"), 06777));
	OK(NOBODY(.kind = OP_TRUNCATE, .path = mp("t"), .size = 2));
	st = lst(mp("t"));
	cr_assert_eq(st.st_size, 2);
	cr_assert_eq(st.st_mode & 07777, 0777, "after truncate by uid 65534: mode %o",
		     st.st_mode & 07777);

	/* open(O_TRUNC) by a non-owner */
	put(mp("ot"), "content");
	OK(chmod(mp("ot"), 06777));
	OK(NOBODY(.kind = OP_OPEN, .path = mp("ot"), .flags = O_WRONLY | O_TRUNC));
	st = lst(mp("ot"));
	cr_assert_eq(st.st_size, 0);
	cr_assert_eq(st.st_mode & 07777, 0777, "after O_TRUNC by uid 65534: mode %o",
		     st.st_mode & 07777);

	/* the same while another open for write shares the file's staging
	 * file (passthrough) */
	put(mp("os"), "content");
	OK(chmod(mp("os"), 06777));
	int wfd = OK(open(mp("os"), O_WRONLY));
	OK(NOBODY(.kind = OP_OPEN, .path = mp("os"), .flags = O_WRONLY | O_TRUNC));
	st = lst(mp("os"));
	OK(close(wfd));
	cr_assert_eq(st.st_size, 0);
	cr_assert_eq(st.st_mode & 07777, 0777, "after O_TRUNC by uid 65534 beside a writer: "
		     "mode %o", st.st_mode & 07777);

	/* chown clears them, even by root */
	put(mp("c"), "x");
	OK(chmod(mp("c"), 06755));
	OK(chown(mp("c"), FM_NOBODY_UID, (gid_t)-1));
	st = lst(mp("c"));
	cr_assert_eq(st.st_mode & 07777, 0755, "after chown: mode %o", st.st_mode & 07777);
	put(mp("c2"), "x");
	OK(chmod(mp("c2"), 04755));
	OK(chown(mp("c2"), (uid_t)-1, 1234));
	cr_assert_eq(lst(mp("c2")).st_mode & 07777, 0755, "after chgrp: mode %o",
		     lst(mp("c2")).st_mode & 07777);

	/* root (CAP_FSETID) writing keeps them, as on a local filesystem */
	put(mp("r"), "x");
	OK(chmod(mp("r"), 06755));
	{
		int fd = OK(open(mp("r"), O_WRONLY | O_APPEND));

		cr_assert_eq(OK(write(fd, "y", 1)), 1);
		OK(close(fd));
	}
	cr_assert_eq(lst(mp("r")).st_mode & 07777, 06755, "root's write cleared the bits: %o",
		     lst(mp("r")).st_mode & 07777);
}

/* The mode the kernel holds for path, asked for alone: statx() with only
 * STATX_MODE asks the daemon only if the kernel dropped the mode (a write
 * drops the size and times, not the mode). */
static unsigned cached_mode(const char *path)
{
	struct statx sx;

	OK(statx(AT_FDCWD, path, AT_SYMLINK_NOFOLLOW, STATX_MODE, &sx));
	return sx.stx_mode & 07777;
}

/*
 * The kernel is told at once when a write clears set-id bits: the daemon
 * clears them (HANDLE_KILLPRIV_V2), and a kernel still holding them shows
 * them to stat and to whatever copies modes (the mount is nosuid, so exec
 * gains nothing) until something refreshes it: the commit, or with a
 * commit that keeps the kernel's attributes, the attribute timeout.
 */
Test(posix, cleared_set_id_bits_reach_the_kernel_at_once)
{
	static const struct {
		const char *name;
		int kind, flags;
		bool daemon_path;
	} ways[] = {
		/* a passthrough write: the kernel clears them itself (SETATTR) */
		{ "append", OP_APPEND, 0, false },
		{ "trunc", OP_OPEN, O_WRONLY | O_TRUNC, false },
		/* the daemon's WRITE: the kernel leaves it to the daemon */
		{ "append-daemon", OP_APPEND, 0, true },
	};

	for (size_t k = 0; k < sizeof(ways) / sizeof(ways[0]); k++) {
		char p[PATH_MAX];

		snprintf(p, sizeof(p), "%s", mp("%s", ways[k].name));
		if (ways[k].daemon_path) {
			/* files with content are written through the daemon */
			fm_umount();
			fm_mount_with("passthrough_copy_max=0");
		}

		put(p, "content");
		OK(chmod(p, 04777));
		cr_assert_eq(cached_mode(p), 04777);
		OK(NOBODY(.kind = ways[k].kind, .path = p, .flags = ways[k].flags));
		cr_assert_eq(cached_mode(p), 0777, "%s by uid 65534: the kernel holds mode %o",
			     ways[k].name, cached_mode(p));
		/* and after the upload's commit too */
		int fd = OK(open(p, O_RDONLY));
		OK(fsync(fd));
		OK(close(fd));
		cr_assert_eq(cached_mode(p), 0777, "%s, committed: mode %o", ways[k].name,
			     cached_mode(p));
	}
}

/* ---- names and descriptors ----------------------------------------------- */

Test(posix, name_too_long)
{
	char n255[256], n256[257];
	struct stat st;
	int fd;

	memset(n255, 'n', 255);
	n255[255] = '\0';
	memset(n256, 'm', 256);
	n256[256] = '\0';
	put(mp("f"), "x");

	FAILS(open(mp("%s", n256), O_CREAT | O_WRONLY, 0644), ENAMETOOLONG);
	FAILS(mkdir(mp("%s", n256), 0755), ENAMETOOLONG);
	FAILS(stat(mp("%s", n256), &st), ENAMETOOLONG);
	FAILS(mknod(mp("%s", n256), S_IFIFO | 0644, 0), ENAMETOOLONG);
	FAILS(symlink("f", mp("%s", n256)), ENAMETOOLONG);
	FAILS(link(mp("f"), mp("%s", n256)), ENAMETOOLONG);
	FAILS(rename(mp("f"), mp("%s", n256)), ENAMETOOLONG);
	FAILS(unlink(mp("%s", n256)), ENAMETOOLONG);

	fd = OK(open(mp("%s", n255), O_CREAT | O_WRONLY, 0644));
	OK(close(fd));
	OK(stat(mp("%s", n255), &st));
	{
		DIR *d = opendir(fm.mnt);
		struct dirent *de;
		bool found = false;

		cr_assert_not_null(d);
		while ((de = readdir(d)))
			found |= strcmp(de->d_name, n255) == 0;
		closedir(d);
		cr_assert(found, "255-byte name missing from readdir");
	}
	OK(rename(mp("%s", n255), mp("f2")));
	OK(mkdir(mp("%s", n255), 0755));
	OK(rmdir(mp("%s", n255)));
}

Test(posix, ebadf_on_closed_fd)
{
	char buf[4];
	struct stat st;
	int fd = OK(open(mp("f"), O_CREAT | O_RDWR, 0644));

	OK(close(fd));
	FAILS(read(fd, buf, 1), EBADF);
	FAILS(write(fd, "x", 1), EBADF);
	FAILS(pread(fd, buf, 1, 0), EBADF);
	FAILS(fstat(fd, &st), EBADF);
	FAILS(fsync(fd), EBADF);
	FAILS(ftruncate(fd, 0), EBADF);
	FAILS(lseek(fd, 0, SEEK_SET), EBADF);
	FAILS(fgetxattr(fd, "user.a", buf, sizeof(buf)), EBADF);
	FAILS(close(fd), EBADF);
}

Test(posix, o_append)
{
	char buf[256];
	int a, b;

	put(mp("f"), "abc");
	a = OK(open(mp("f"), O_WRONLY | O_APPEND));
	cr_assert_eq(OK(write(a, "def", 3)), 3);
	OK(lseek(a, 0, SEEK_SET));
	cr_assert_eq(OK(write(a, "ghi", 3)), 3);
	cr_assert_eq(OK(lseek(a, 0, SEEK_CUR)), 9);
	OK(close(a));
	expect_str(mp("f"), "abcdefghi");

	/* two appenders interleave, nothing is overwritten */
	OK(mknod(mp("g"), S_IFREG | 0644, 0));
	a = OK(open(mp("g"), O_WRONLY | O_APPEND));
	b = OK(open(mp("g"), O_RDWR | O_APPEND));
	for (int i = 0; i < 50; i++) {
		cr_assert_eq(OK(write(a, "1", 1)), 1);
		cr_assert_eq(OK(write(b, "2", 1)), 1);
	}
	cr_assert_eq(OK(pread(b, buf, sizeof(buf), 0)), 100);
	for (int i = 0; i < 100; i++)
		cr_assert_eq(buf[i], i % 2 ? '2' : '1', "byte %d is '%c'", i, buf[i]);
	OK(close(a));
	OK(close(b));
	cr_assert_eq(lst(mp("g")).st_size, 100);
}

Test(posix, exdev_across_mounts)
{
	put(mp("f"), "x");
	FAILS(rename(mp("f"), sp("outside")), EXDEV);
	FAILS(link(mp("f"), sp("outside")), EXDEV);
	expect_str(mp("f"), "x");
}

Test(posix, fcntl_and_flock_locks)
{
	struct flock fl = { .l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 10 };
	int fd = OK(open(mp("lock"), O_CREAT | O_RDWR, 0644));
	int fd2 = OK(open(mp("lock"), O_RDWR));
	pid_t pid;
	int status;

	OK(fcntl(fd, F_SETLK, &fl));
	OK(flock(fd2, LOCK_EX | LOCK_NB));
	/* another process sees the record lock */
	pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		struct flock probe = { .l_type = F_WRLCK, .l_whence = SEEK_SET, .l_len = 10 };
		int f = open(mp("lock"), O_RDWR);

		if (f < 0 || fcntl(f, F_SETLK, &probe) == 0)
			_exit(1);
		_exit(errno == EAGAIN || errno == EACCES ? 0 : 2);
	}
	waitpid(pid, &status, 0);
	cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0,
		  "a second process got a conflicting fcntl lock (status 0x%x)", status);
	FAILS(flock(fd, LOCK_EX | LOCK_NB), EWOULDBLOCK);
	OK(close(fd));
	OK(close(fd2));
}

/*
 * The contents of a file stay until its last reference is closed, however
 * its names went (unlink, or a rename over it) and whichever fd wrote: a
 * reader opened before the writer sees every byte the writer wrote after
 * the unlink closes it. (Random operation sequences against ext4 found
 * ferryfs dropping them at the writer's close, in both write modes.)
 */
static void check_survives(const char *how)
{
	char data[575], got[600];
	struct stat st;
	int fd1, fd2;

	memset(data, 'x', sizeof(data));
	data[0] = 'a';
	data[sizeof(data) - 1] = 'z';
	fd1 = OK(open(mp("a"), O_RDONLY | O_CREAT, 0644));
	fd2 = OK(open(mp("a"), O_WRONLY));
	cr_assert_eq(OK(write(fd2, data, sizeof(data))), (ssize_t)sizeof(data));
	if (!strcmp(how, "unlink")) {
		OK(unlink(mp("a")));
	} else {
		put(mp("b"), "other");
		OK(rename(mp("b"), mp("a")));
	}
	OK(close(fd2));
	OK(fstat(fd1, &st));
	cr_assert_eq(st.st_size, (off_t)sizeof(data), "%s: fstat after the writer's close: %lld",
		     how, (long long)st.st_size);
	cr_assert_eq(OK(pread(fd1, got, sizeof(got), 0)), (ssize_t)sizeof(data), "%s", how);
	cr_assert(memcmp(got, data, sizeof(data)) == 0, "%s: wrong bytes", how);
	/* SEEK_DATA/SEEK_HOLE never report a hole over those bytes. */
	cr_assert_eq(OK(lseek(fd1, 0, SEEK_DATA)), 0, "%s", how);
	cr_assert_eq(OK(lseek(fd1, 0, SEEK_HOLE)), (off_t)sizeof(data), "%s", how);
	OK(close(fd1));
	if (strcmp(how, "unlink"))
		expect_str(mp("a"), "other");
	unlink(mp("a"));
}

Test(posix, unlinked_while_open_keeps_data)
{
	check_survives("unlink");
	check_survives("rename over it");
}

static long open_trunc(void *path)
{
	int fd = open(path, O_RDONLY | O_TRUNC);

	if (fd < 0)
		return -1;
	close(fd);
	return 0;
}

/* open(O_RDONLY|O_TRUNC): undefined by POSIX, truncates on Linux's own file
 * systems; so here. */
Test(posix, rdonly_trunc_truncates)
{
	struct stat st;
	int fd;

	put(mp("t"), "some bytes");
	fd = OK(open(mp("t"), O_RDONLY | O_TRUNC));
	OK(fstat(fd, &st));
	cr_assert_eq(st.st_size, 0);
	OK(close(fd));
	cr_assert_eq(lst(mp("t")).st_size, 0);
	/* Without write permission it is refused, as on ext4. */
	put(mp("t2"), "kept");
	OK(chmod(mp("t2"), 0644));
	cr_assert_eq(fm_as_nobody(open_trunc, (void *)mp("t2")), -1);
	cr_assert_eq(errno, EACCES, "%s", strerror(errno));
	expect_str(mp("t2"), "kept");
}
