/*
 * ferry-brokerd, the real binary (FERRY_BIN_DIR), driven over its socket:
 * what it does for peers that play by the rules, and what it refuses. The
 * fixture (the tree, the policy, the broker, peers) is broker_fixture_util.h;
 * the attacks of a malicious peer on the others are test_broker_attack.c.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <grp.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "broker.pb-c.h"
#include "broker_client.h"
#include "broker_fixture_util.h"
#include "fuse_backing.h"
#include "mount_util.h"
#include "rawfuse_util.h"
#include "rpc_frame.h"

TestSuite(broker, .init = bk_setup, .fini = bk_teardown, .timeout = 120);

/* ---- MOUNT / UMOUNT ---- */

Test(broker, mount_and_umount)
{
	struct broker_conn *c = connect_as(PEER, PEER);
	const char *opts[] = { "default_permissions", "max_read=131072", "fsname=ferry:t",
			       "subtype=ferryfs", "nosuid", NULL };
	struct broker_status st;
	struct stat sb;
	uint64_t id, id2;
	char *mi;
	int fd;

	id = mount_ok(c, "m1", opts, &fd);
	cr_assert(fstat(fd, &sb) == 0);
	cr_assert(S_ISCHR(sb.st_mode) && major(sb.st_rdev) == 10 && minor(sb.st_rdev) == 229,
		  "the fd is not /dev/fuse");
	cr_assert(fcntl(fd, F_GETFD) & FD_CLOEXEC);
	mi = mountinfo_of(bp("root/m1"));
	cr_assert(mi, "nothing mounted at root/m1");
	cr_assert(strstr(mi, " - fuse.ferryfs ferry:t "), "type/source: %s", mi);
	cr_assert(strstr(mi, "nosuid") && strstr(mi, "nodev"), "not nosuid,nodev: %s", mi);
	cr_assert(strstr(mi, "user_id=65534,group_id=65534"), "user_id: %s", mi);
	cr_assert(strstr(mi, "default_permissions") && strstr(mi, "max_read=131072"), "%s", mi);
	cr_assert(!strstr(mi, "allow_other"), "%s", mi);
	free(mi);
	bk_status(&st);
	cr_assert_eq(st.mounts, 1);
	cr_assert_eq(st.peers, 1);
	/* The same name again: busy. */
	REFUSED(broker_mount(c, "m1", NULL, &fd, &id2), EBUSY);

	/* By name. */
	cr_assert_eq(broker_umount(c, "m1", 0), 0, "%s", broker_last_message());
	cr_assert(!fm_is_mounted(bp("root/m1")));
	close(fd);
	/* By id, and a nested name. */
	id = mount_ok(c, "real/x", NULL, NULL);
	cr_assert(fm_is_mounted(bp("root/real/x")));
	cr_assert_eq(broker_umount(c, NULL, id), 0, "%s", broker_last_message());
	cr_assert(!fm_is_mounted(bp("root/real/x")));
	REFUSED(broker_umount(c, NULL, id), ENOENT);
	bk_status(&st);
	cr_assert_eq(st.mounts, 0);
	cr_assert(st.refusals >= 2);
	broker_close(c);
	assert_no_leaks(0);
}

/*
 * A peer no policy rule matches is turned away at accept: the broker closes
 * its connection at once, reading and answering nothing (so strangers
 * cannot hold connections the policy's peers need). Root is in no rule
 * either, but is let in for STATUS (operators, --ping) and nothing else.
 */
Test(broker, refuses_peer_not_in_policy)
{
	struct broker_conn *c;
	struct broker_status st;
	int s, fd;
	uint64_t id;

	s = connect_only(STRANGER, STRANGER);
	cr_assert(eof_within(s, 2000), "a stranger's connection stayed open");
	close(s);
	/* Nor does a request get it anything, even sent at once. */
	cr_assert_eq(broker_adopt(connect_only(STRANGER, STRANGER), &c), 0);
	broker_set_timeout(c, 5000);
	cr_assert(is_dead(c), "a stranger's STATUS was answered");
	broker_close(c);
	cr_assert(!fm_is_mounted(bp("root/m1")));
	/* Root: STATUS, and a MOUNT ends the connection. */
	c = connect_as(0, 0);
	cr_assert_eq(broker_status(c, &st), 0);
	REFUSED(broker_mount(c, "m1", NULL, &fd, &id), EPERM);
	cr_assert(is_dead(c), "the connection stayed open");
	cr_assert(!fm_is_mounted(bp("root/m1")));
	broker_close(c);
	assert_no_leaks(0);
}

/* Each of these names is malformed: an error and a closed connection. */
Test(broker, refuses_names_outside_the_root)
{
	static const char *const bad[] = {
		"..", "../outside", "m1/../../outside", "./m1", "m1/", "m1//x", "",
		"/tmp", "/", "m 1", "m1\\x",
	};

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		struct broker_conn *c = connect_as(PEER, PEER);
		int fd;
		uint64_t id;

		REFUSED(broker_mount(c, bad[i], NULL, &fd, &id), EINVAL);
		cr_assert(is_dead(c), "connection open after name \"%s\"", bad[i]);
		broker_close(c);
	}
	cr_assert(!fm_is_mounted(bk.outside));
	cr_assert(!fm_is_mounted(bk.root));
	assert_no_leaks(0);
}

Test(broker, refuses_symlinks)
{
	struct broker_conn *c = connect_as(PEER, PEER);
	int fd;
	uint64_t id;

	/* At the last component, in the middle, and even one that stays inside. */
	REFUSED(broker_mount(c, "link", NULL, &fd, &id), ELOOP);
	REFUSED(broker_mount(c, "mid/x", NULL, &fd, &id), ELOOP);
	REFUSED(broker_mount(c, "abslink", NULL, &fd, &id), ELOOP);
	REFUSED(broker_mount(c, "link/sub", NULL, &fd, &id), ELOOP);
	/* Refusals on the merits keep the connection. */
	cr_assert(!is_dead(c));
	cr_assert(!fm_is_mounted(bk.outside));
	cr_assert(!fm_is_mounted(bp("root/real/x")));
	/* The real path works. */
	id = mount_ok(c, "real/x", NULL, NULL);
	cr_assert_eq(broker_umount(c, NULL, id), 0);
	broker_close(c);
	assert_no_leaks(0);
}

static volatile sig_atomic_t swap_stop;

/* Swaps root/race/x (a directory) and root/race/y (a symlink out of the
 * root) with RENAME_EXCHANGE, as fast as it can. */
static void swapper(void)
{
	while (!swap_stop)
		renameat2(AT_FDCWD, bp("root/race/x"), AT_FDCWD, bp("root/race/y"),
			  RENAME_EXCHANGE);
	_exit(0);
}

static void on_term(int sig)
{
	(void)sig;
	swap_stop = 1;
}

Test(broker, symlink_swapped_in_after_resolution)
{
	struct broker_conn *c = connect_as(PEER, PEER);
	int ok = 0, loop = 0, other = 0, moved = 0, wstatus;
	pid_t pid;

	mkdir_owned(bp("root/race"), PEER, 0755);
	mkdir_owned(bp("root/race/x"), PEER, 0755);
	cr_assert(symlink(bk.outside, bp("root/race/y")) == 0);
	/* First, unraced: it resolves and mounts. */
	cr_assert_eq(broker_umount(c, NULL, mount_ok(c, "race/x", NULL, NULL)), 0);

	pid = fork();
	cr_assert(pid >= 0);
	if (pid == 0) {
		signal(SIGTERM, on_term);
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		alarm(60);
		swapper();
	}
	bk_child(pid); /* stopped at teardown if an assert cuts the test short */
	for (int i = 0; i < 400; i++) {
		uint64_t id;
		int fd, rc = broker_mount(c, "race/x", NULL, &fd, &id);

		if (rc == 0) {
			char *at_x, *at_y;

			ok++;
			close(fd);
			/* On the directory, wherever the swap has moved it by now
			 * (a mountpoint cannot be renamed any more): beneath the
			 * root, never where the symlink points. */
			cr_assert(!fm_is_mounted(bk.outside), "the swapped symlink was followed");
			at_x = mountinfo_of(bp("root/race/x"));
			at_y = mountinfo_of(bp("root/race/y"));
			cr_assert(at_x || at_y, "mount %d landed somewhere else", i);
			rc = broker_umount(c, NULL, id);
			if (rc == -ELOOP) {
				/* Its name now leads to the symlink: the broker
				 * refuses to unmount by it; take it down here.
				 * Even a mount seen at x may still move: an
				 * exchange within one directory that passed its
				 * mountpoint check before the mount came does not
				 * lock the directory it moves. */
				moved++;
				cr_assert(umount2(bp("root/race/y"), MNT_DETACH) == 0,
					  "mount %d is neither at x nor at y", i);
			} else {
				cr_assert_eq(rc, 0, "%s", broker_last_message());
			}
			free(at_x);
			free(at_y);
		} else if (rc == -ELOOP || rc == -ENOENT) {
			loop++;
		} else {
			/* EXDEV: the directory moved between resolution and
			 * mount, and the broker took the mount down again. */
			other++;
			cr_assert(rc == -ENOTDIR || rc == -EAGAIN || rc == -EXDEV,
				  "MOUNT race/x: %s: %s", strerror(-rc), broker_last_message());
		}
		cr_assert(!fm_is_mounted(bk.outside), "the swapped symlink was followed");
	}
	kill(pid, SIGTERM);
	waitpid(pid, &wstatus, 0);
	cr_log_info("race: %d mounted on the directory (%d of them moved with it), %d refused "
		    "as a symlink, %d other", ok, moved, loop, other);
	cr_assert(loop > 0, "the swap never won the race: the test proves nothing");
	cr_assert(!fm_is_mounted(bk.outside));
	/* A mount taken down by hand above stays known until the broker looks:
	 * mounting the name again makes it look, and forget it. */
	{
		struct stat st;
		struct broker_status bs;

		if (lstat(bp("root/race/x"), &st) == 0 && S_ISLNK(st.st_mode))
			cr_assert(renameat2(AT_FDCWD, bp("root/race/x"), AT_FDCWD, bp("root/race/y"),
					    RENAME_EXCHANGE) == 0);
		cr_assert_eq(broker_umount(c, NULL, mount_ok(c, "race/x", NULL, NULL)), 0);
		bk_status(&bs);
		cr_assert_eq(bs.mounts, 0);
	}
	broker_close(c);
	assert_no_leaks(0);
}

Test(broker, refuses_target_not_the_peers)
{
	struct broker_conn *c = connect_as(PEER, PEER);
	int fd;
	uint64_t id;

	REFUSED(broker_mount(c, "rootowned", NULL, &fd, &id), EPERM);
	REFUSED(broker_mount(c, "other", NULL, &fd, &id), EPERM);
	REFUSED(broker_mount(c, "nonexistent", NULL, &fd, &id), ENOENT);
	cr_assert(!fm_is_mounted(bp("root/rootowned")));
	cr_assert(!fm_is_mounted(bp("root/other")));
	/* Mounting onto a mount: not through the broker. */
	id = mount_ok(c, "m1", NULL, NULL);
	cr_assert(!is_dead(c));
	cr_assert_eq(broker_umount(c, NULL, id), 0);
	broker_close(c);
	assert_no_leaks(0);
}

Test(broker, refuses_options)
{
	static const char *const bad[] = {
		"suid", "dev", "fd=3", "rootmode=40000", "user_id=0", "group_id=0", "foo",
		"foo=bar", "max_read=0", "max_read=x", "max_read", "subtype=a.b", "fsname=a,b",
		"default_permissions=1", "blksize=4096",
	};

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		struct broker_conn *c = connect_as(PEER, PEER);
		const char *opts[] = { bad[i], NULL };
		int fd;
		uint64_t id;

		REFUSED(broker_mount(c, "m1", opts, &fd, &id), EINVAL);
		cr_assert(is_dead(c), "connection open after option \"%s\"", bad[i]);
		broker_close(c);
	}
	{
		struct broker_conn *c = connect_as(PEER, PEER);
		const char *twice[] = { "noexec", "noexec", NULL };
		const char *clash[] = { "ro", "rw", NULL };
		int fd;
		uint64_t id;

		REFUSED(broker_mount(c, "m1", twice, &fd, &id), EINVAL);
		broker_close(c);
		c = connect_as(PEER, PEER);
		REFUSED(broker_mount(c, "m1", clash, &fd, &id), EINVAL);
		broker_close(c);
	}
	cr_assert(!fm_is_mounted(bp("root/m1")));
	assert_no_leaks(0);
}

Test(broker, allow_other_only_where_the_policy_allows)
{
	struct broker_conn *c = connect_as(PEER, PEER), *c2 = connect_as(PEER2, PEER2);
	const char *opts[] = { "allow_other", "ro", "noexec", NULL };
	uint64_t id;
	char *mi;
	int fd;

	REFUSED(broker_mount(c, "m1", opts, &fd, &id), EPERM);
	cr_assert(strstr(broker_last_message(), "allow_other"), "%s", broker_last_message());
	cr_assert(!fm_is_mounted(bp("root/m1")));
	cr_assert(!is_dead(c));
	id = mount_ok(c2, "n1", opts, NULL);
	mi = mountinfo_of(bp("root2/n1"));
	cr_assert(mi && strstr(mi, "allow_other") && strstr(mi, "user_id=65533"), "%s", mi);
	cr_assert(strstr(mi, " ro,") && strstr(mi, "noexec"), "%s", mi);
	free(mi);
	cr_assert_eq(broker_umount(c2, NULL, id), 0);
	broker_close(c);
	broker_close(c2);
	assert_no_leaks(0);
}

Test(broker, max_mounts)
{
	struct broker_conn *c = connect_as(PEER, PEER);
	uint64_t a, b, d;
	int fd;

	a = mount_ok(c, "m1", NULL, NULL);
	b = mount_ok(c, "m2", NULL, NULL);
	d = mount_ok(c, "m3", NULL, NULL);
	REFUSED(broker_mount(c, "m4", NULL, &fd, &a), EDQUOT);
	cr_assert(!fm_is_mounted(bp("root/m4")));
	cr_assert_eq(broker_umount(c, NULL, b), 0);
	b = mount_ok(c, "m4", NULL, NULL);
	/* A mount someone else took away does not count any more. */
	cr_assert(umount2(bp("root/m4"), MNT_DETACH) == 0);
	b = mount_ok(c, "m2", NULL, NULL);
	(void)d;
	broker_close(c);
	c = connect_as(PEER, PEER);
	/* Limits are the peer's, not the connection's. */
	REFUSED(broker_mount(c, "m4", NULL, &fd, &a), EDQUOT);
	cr_assert_eq(broker_umount(c, "m1", 0), 0);
	cr_assert_eq(broker_umount(c, "m2", 0), 0);
	cr_assert_eq(broker_umount(c, "m3", 0), 0);
	broker_close(c);
	assert_no_leaks(0);
}

Test(broker, umount_of_another_peers_mount)
{
	struct broker_conn *a = connect_as(PEER, PEER), *b = connect_as(PEER2, PEER2);
	uint64_t id = mount_ok(a, "m1", NULL, NULL);

	/* Another tenant's mount id is no mount at all to b (nothing said
	 * about whose it is). */
	REFUSED(broker_umount(b, NULL, id), ENOENT);
	REFUSED(broker_umount(b, "m1", 0), ENOENT); /* b's m1 would be beneath root2 */
	cr_assert(fm_is_mounted(bp("root/m1")));
	/* Not even as root (STATUS only). */
	broker_close(b);
	b = connect_as(0, 0);
	REFUSED(broker_umount(b, NULL, id), EPERM);
	broker_close(b);
	cr_assert(fm_is_mounted(bp("root/m1")));
	cr_assert_eq(broker_umount(a, NULL, id), 0);
	broker_close(a);
	assert_no_leaks(0);
}

/* ---- BACKING_OPEN / BACKING_CLOSE ---- */

static struct broker_conn *g_conn;
static uint64_t g_mount;
static const char *g_path;
static int g_flags;

/* As the peer: open g_path with g_flags and ask for a backing id. */
static long peer_backing_open(void *arg)
{
	int fd, rc;

	(void)arg;
	fd = open(g_path, g_flags | O_CLOEXEC);
	if (fd < 0)
		return -1;
	rc = broker_backing_open(g_conn, g_mount, fd);
	close(fd);
	if (rc < 0) {
		errno = -rc;
		return -1;
	}
	return rc;
}

static long peer_write(void *arg)
{
	int fd = open(g_path, O_RDWR | O_CLOEXEC);
	ssize_t n;

	if (fd < 0)
		return -1;
	n = write(fd, arg, strlen(arg));
	close(fd);
	return n;
}

Test(broker, backing_open_and_close)
{
	struct broker_conn *c = connect_as(PEER, PEER);
	struct broker_status st;
	struct rawfuse rf;
	uint64_t mid = served_mount(c, "m1", PEER, NULL, &rf, NULL);
	int fd, id, id2;

	write_text(bp("data"), "", PEER, 0600);
	fd = open(bp("data"), O_RDWR | O_CLOEXEC);
	cr_assert(fd >= 0);
	id = broker_backing_open(c, mid, fd);
	cr_assert(id > 0, "BACKING_OPEN: %s: %s", strerror(-id), broker_last_message());
	id2 = broker_backing_open(c, mid, fd);
	cr_assert(id2 > 0 && id2 != id);
	close(fd);
	bk_status(&st);
	cr_assert_eq(st.backing_ids, 2);
	cr_assert_eq(broker_backing_close(c, mid, id), 0, "%s", broker_last_message());
	REFUSED(broker_backing_close(c, mid, id), ENOENT);
	REFUSED(broker_backing_close(c, mid, 9999), ENOENT);
	REFUSED(broker_backing_close(c, mid + 1, id2), ENOENT);
	/* A peer that goes away leaves its ids: a reconnecting mountd closes them. */
	broker_close(c);
	c = connect_as(PEER, PEER);
	bk_status(&st);
	cr_assert_eq(st.backing_ids, 1);
	cr_assert_eq(broker_backing_close(c, mid, id2), 0, "%s", broker_last_message());

	/* Closing without waiting: more than BROKER_NOWAIT_MAX at once, and one
	 * refused; the next call takes the replies. */
	{
		int ids[BROKER_NOWAIT_MAX + 8];

		fd = open(bp("data"), O_RDWR | O_CLOEXEC);
		for (size_t i = 0; i < BROKER_NOWAIT_MAX + 8; i++) {
			ids[i] = broker_backing_open(c, mid, fd);
			cr_assert(ids[i] > 0, "%s", broker_last_message());
		}
		close(fd);
		for (size_t i = 0; i < BROKER_NOWAIT_MAX + 8; i++)
			cr_assert_eq(broker_backing_close_nowait(c, mid, ids[i]), 0);
		cr_assert_eq(broker_backing_close_nowait(c, mid, ids[0]), 0); /* refused later */
		cr_assert_eq(broker_status(c, &st), 0);
		cr_assert_eq(st.backing_ids, 0);
		cr_assert_eq(broker_async_failures(c), 1);
	}
	cr_assert_eq(broker_umount(c, NULL, mid), 0);
	rawfuse_stop(&rf);
	broker_close(c);
	assert_no_leaks(0);
}

/*
 * BACKING_OPEN_MANY checks every fd by itself: the good ones get ids, each
 * bad one its own refusal (and the reply names the first), and the
 * connection goes on. BACKING_CLOSE_MANY closes each id by itself too.
 */
Test(broker, backing_open_many_checks_each_fd)
{
	struct broker_conn *c = connect_as(PEER, PEER);
	struct broker_status st;
	struct rawfuse rf;
	uint64_t mid = served_mount(c, "m1", PEER, NULL, &rf, NULL);
	int fds[6], ids[6], errs[4], more[2], fd;

	/* An adopted connection learns what the broker can do from its first
	 * STATUS; one that connects by path, at once (the connect asks). */
	cr_assert_eq(broker_features(c), 0);
	cr_assert_eq(broker_status(c, &st), 0);
	cr_assert(broker_features(c) & BROKER_FEATURE_MANY, "features %#x",
		  broker_features(c));
	{
		struct broker_conn *byname;

		cr_assert_eq(broker_connect(bk.sock, &byname), 0);
		cr_assert(broker_features(byname) & BROKER_FEATURE_MANY);
		broker_close(byname);
	}
	write_text(bp("peerfile"), "x", PEER, 0600);
	write_text(bp("rootfile"), "x", 0, 0600);
	fds[0] = open(bp("peerfile"), O_RDWR | O_CLOEXEC);
	fds[1] = open(bp("rootfile"), O_RDWR | O_CLOEXEC);
	fds[2] = open("/dev/null", O_RDWR | O_CLOEXEC);
	fds[3] = open(bp("peerfile"), O_RDONLY | O_CLOEXEC);
	fds[4] = open(bk.outside, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	fds[5] = open(bp("peerfile"), O_RDWR | O_CLOEXEC);
	for (int k = 0; k < 6; k++)
		cr_assert(fds[k] >= 0);
	cr_assert_eq(broker_backing_open_many(c, mid, fds, 6, ids), 0, "%s",
		     broker_last_message());
	cr_assert(ids[0] > 0 && ids[5] > 0 && ids[0] != ids[5], "ids %d, %d", ids[0], ids[5]);
	cr_assert_eq(ids[1], -EPERM, "root's file: %d", ids[1]);
	cr_assert_eq(ids[2], -EINVAL, "/dev/null: %d", ids[2]);
	cr_assert_eq(ids[3], -EBADF, "a read-only fd: %d", ids[3]);
	cr_assert_eq(ids[4], -EINVAL, "a directory: %d", ids[4]);
	cr_assert(strstr(broker_last_message(), "fd 1: ") &&
		  strstr(broker_last_message(), "owned by uid 0"), "%s", broker_last_message());
	bk_status(&st);
	cr_assert_eq(st.backing_ids, 2);

	{
		const int cl[4] = { ids[0], ids[5], ids[0], 9999 };

		cr_assert_eq(broker_backing_close_many(c, mid, cl, 4, errs), 0, "%s",
			     broker_last_message());
		cr_assert(errs[0] == 0 && errs[1] == 0, "closes: %d %d", errs[0], errs[1]);
		cr_assert_eq(errs[2], -ENOENT, "a second close of one id: %d", errs[2]);
		cr_assert_eq(errs[3], -ENOENT, "an id never given: %d", errs[3]);
		bk_status(&st);
		cr_assert_eq(st.backing_ids, 0);
		/* Refused whole: a mount that is not the peer's. */
		REFUSED(broker_backing_open_many(c, mid + 1000, fds, 1, ids), ENOENT);
		REFUSED(broker_backing_close_many(c, mid + 1000, cl, 1, errs), ENOENT);
		/* Refused by the client before anything is sent. */
		REFUSED(broker_backing_open_many(c, mid, fds, 0, ids), EINVAL);
		REFUSED(broker_backing_open_many(c, mid, fds, BROKER_FDS_MAX + 1, ids), EINVAL);
		REFUSED(broker_backing_close_many(c, mid, cl, BROKER_CLOSE_MANY_MAX + 1, errs),
			EINVAL);
	}
	for (int k = 0; k < 6; k++)
		close(fds[k]);

	/* Without waiting: the refusal of one id is counted, the rest close. */
	fd = open(bp("peerfile"), O_RDWR | O_CLOEXEC);
	more[0] = more[1] = fd;
	cr_assert_eq(broker_backing_open_many(c, mid, more, 2, ids), 0);
	close(fd);
	cr_assert(ids[0] > 0 && ids[1] > 0);
	{
		const int cl[3] = { ids[0], ids[1], ids[0] };

		cr_assert_eq(broker_backing_close_many_nowait(c, mid, cl, 3), 0);
	}
	cr_assert_eq(broker_status(c, &st), 0);
	cr_assert_eq(st.backing_ids, 0);
	cr_assert_eq(broker_async_failures(c), 1);
	cr_assert(!is_dead(c));

	cr_assert_eq(broker_umount(c, NULL, mid), 0);
	rawfuse_stop(&rf);
	broker_close(c);
	assert_no_leaks(0);
}

/* The peer's limit counts inside one batch: what is over it is refused,
 * what is under it registered. */
Test(broker, backing_open_many_keeps_the_limit)
{
	struct broker_conn *c = connect_as(PEER2, PEER2);
	struct broker_status st;
	struct rawfuse rf;
	uint64_t mid = served_mount(c, "n1", PEER2, NULL, &rf, NULL);
	int fds[3], ids[3];

	cr_assert_eq(broker_status(c, &st), 0); /* what it can do: BROKER_FEATURE_MANY */
	write_text(bp("p2file"), "", PEER2, 0600);
	fds[0] = fds[1] = fds[2] = open(bp("p2file"), O_RDWR | O_CLOEXEC);
	cr_assert(fds[0] >= 0);
	cr_assert_eq(broker_backing_open_many(c, mid, fds, 3, ids), 0, "%s",
		     broker_last_message());
	close(fds[0]);
	cr_assert(ids[0] > 0 && ids[1] > 0, "%d %d: %s", ids[0], ids[1], broker_last_message());
	cr_assert_eq(ids[2], -EDQUOT, "the third of a limit of 2: %d", ids[2]);
	bk_status(&st);
	cr_assert_eq(st.backing_ids, 2);
	/* Unmounting takes the mount's ids with it. */
	cr_assert_eq(broker_umount(c, NULL, mid), 0);
	rawfuse_stop(&rf);
	broker_close(c);
	assert_no_leaks(0);
}

Test(broker, refuses_backing_fds_of_the_wrong_kind)
{
	struct broker_conn *c = connect_as(PEER, PEER);
	struct rawfuse rf;
	uint64_t mid = served_mount(c, "m1", PEER, NULL, &rf, NULL);
	int sv[2], fd;

	write_text(bp("peerfile"), "x", PEER, 0600);
	write_text(bp("rootfile"), "x", 0, 0600);
	write_text(bp("twolinks"), "x", PEER, 0600);
	cr_assert(link(bp("twolinks"), bp("twolinks2")) == 0);

	fd = open(bk.outside, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	REFUSED(broker_backing_open(c, mid, fd), EINVAL);
	close(fd);
	fd = open("/dev/null", O_RDWR | O_CLOEXEC);
	REFUSED(broker_backing_open(c, mid, fd), EINVAL);
	cr_assert(strstr(broker_last_message(), "character device"), "%s", broker_last_message());
	close(fd);
	cr_assert(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
	REFUSED(broker_backing_open(c, mid, sv[0]), EINVAL);
	close(sv[0]);
	close(sv[1]);
	fd = open(bp("peerfile"), O_RDONLY | O_CLOEXEC);
	REFUSED(broker_backing_open(c, mid, fd), EBADF);
	close(fd);
	fd = open(bp("peerfile"), O_WRONLY | O_CLOEXEC);
	REFUSED(broker_backing_open(c, mid, fd), EBADF);
	close(fd);
	fd = open(bp("peerfile"), O_PATH | O_CLOEXEC);
	REFUSED(broker_backing_open(c, mid, fd), EBADF);
	close(fd);
	fd = open(bp("rootfile"), O_RDWR | O_CLOEXEC);
	REFUSED(broker_backing_open(c, mid, fd), EPERM);
	close(fd);
	fd = open(bp("twolinks"), O_RDWR | O_CLOEXEC);
	REFUSED(broker_backing_open(c, mid, fd), EMLINK);
	close(fd);
	/* A mount id that is not there. */
	fd = open(bp("peerfile"), O_RDWR | O_CLOEXEC);
	REFUSED(broker_backing_open(c, mid + 1000, fd), ENOENT);
	close(fd);
	/* Refused on the merits: the connection goes on. */
	cr_assert(!is_dead(c));

	/* A file on a FUSE mount (this very one), opened by the peer. It is
	 * refused without the broker asking the FUSE server anything. */
	atomic_store(&rf.watch_pid, bk.pid);
	g_conn = c;
	g_mount = mid;
	g_path = bp("root/m1/f");
	g_flags = O_RDWR;
	errno = 0;
	cr_assert_eq(fm_as_user(PEER, PEER, peer_backing_open, NULL), -1);
	cr_assert(errno == EACCES || errno == EXDEV, "FUSE file: %s", strerror(errno));
	cr_assert_eq(atomic_load(&rf.n_from_watched), 0, "the broker sent the FUSE server %u "
		     "requests", atomic_load(&rf.n_from_watched));

	cr_assert_eq(broker_umount(c, NULL, mid), 0);
	rawfuse_stop(&rf);
	broker_close(c);
	assert_no_leaks(0);
}

/* A FUSE mount that admits the broker (allow_other) and never answers
 * STATFS: a broker that asked would hang; it must refuse at once. */
Test(broker, refuses_a_fuse_file_without_asking_its_server)
{
	struct broker_conn *c = connect_as(PEER2, PEER2);
	const char *opts[] = { "allow_other", NULL };
	struct rawfuse rf;
	uint64_t mid = served_mount(c, "n1", PEER2, opts, &rf, NULL);
	struct timespec t0, t1;

	atomic_store(&rf.stall_statfs, true);
	atomic_store(&rf.watch_pid, bk.pid);
	g_conn = c;
	g_mount = mid;
	g_path = bp("root2/n1/f");
	g_flags = O_RDWR;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	cr_assert_eq(fm_as_user(PEER2, PEER2, peer_backing_open, NULL), -1);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	cr_assert_eq(errno, EXDEV, "FUSE file: %s", strerror(errno));
	cr_assert(t1.tv_sec - t0.tv_sec < 5);
	cr_assert_eq(atomic_load(&rf.n_from_watched), 0);
	cr_assert_eq(atomic_load(&rf.n_statfs), 0);
	cr_assert_eq(broker_umount(c, NULL, mid), 0);
	rawfuse_stop(&rf);
	broker_close(c);
	assert_no_leaks(0);
}

/*
 * close() of a FUSE file's fd sends FLUSH and waits for it, uninterruptibly.
 * A peer whose server never answers sends the broker such an fd (here with
 * a refused BACKING_OPEN): the broker must go on serving everyone, and after
 * a while abort that FUSE connection to get its closer back.
 */
Test(broker, fuse_fd_whose_server_never_answers_flush)
{
	struct broker_conn *c = connect_as(PEER, PEER);
	struct broker_status st;
	struct rawfuse rf;
	uint64_t mid = served_mount(c, "m1", PEER, NULL, &rf, NULL);
	struct timespec t0, t1;
	int p[2], wstatus, err = 0;
	bool aborted = false;
	pid_t pid;

	atomic_store(&rf.stall_flush, true);
	cr_assert(pipe2(p, O_CLOEXEC) == 0);
	pid = fork();
	cr_assert(pid >= 0);
	if (pid == 0) {
		int fd, rc = -1;

		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (setgroups(0, NULL) == 0 && setresgid(PEER, PEER, PEER) == 0 &&
		    setresuid(PEER, PEER, PEER) == 0 &&
		    (fd = open(bp("root/m1/f"), O_RDWR | O_CLOEXEC)) >= 0)
			rc = broker_backing_open(c, mid, fd);
		(void)!write(p[1], &rc, sizeof(rc));
		_exit(0); /* its own close waits for FLUSH too, until the abort */
	}
	close(p[1]);
	cr_assert_eq(read(p[0], &err, sizeof(err)), (ssize_t)sizeof(err));
	close(p[0]);
	cr_assert(err < 0, "a FUSE file was registered");
	/* The broker's close of its copy is stuck; it serves on. */
	clock_gettime(CLOCK_MONOTONIC, &t0);
	bk_status(&st);
	cr_assert_eq(broker_status(c, &st), 0);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	cr_assert(t1.tv_sec - t0.tv_sec < 2, "the broker waited for the FUSE server");
	/* Within a few seconds it aborts that connection. */
	for (int i = 0; i < 200 && !aborted; i++) {
		char *log = fm_slurp(bk.log);

		aborted = log && strstr(log, "aborted that FUSE connection");
		free(log);
		if (!aborted)
			usleep(100000);
	}
	if (!aborted)
		log_tail();
	cr_assert(aborted, "the stuck FUSE connection was not aborted");
	cr_assert(atomic_load(&rf.n_flush) >= 1);
	cr_assert(waitpid(pid, &wstatus, 0) == pid);
	/* A peer whose close stayed stuck that long was cut off meanwhile;
	 * once the close is over it is let in again. */
	broker_close(c);
	c = connect_as_within(PEER, PEER, 5000);
	cr_assert(c, "uid %d is still refused after its close ended", PEER);
	cr_assert_eq(broker_umount(c, NULL, mid), 0, "%s", broker_last_message());
	rawfuse_stop(&rf);
	broker_close(c);
	assert_no_leaks(0);
}

Test(broker, max_backing)
{
	struct broker_conn *c = connect_as(PEER2, PEER2);
	struct rawfuse rf;
	uint64_t mid = served_mount(c, "n1", PEER2, NULL, &rf, NULL);
	int fd, a, b;

	write_text(bp("p2file"), "", PEER2, 0600);
	fd = open(bp("p2file"), O_RDWR | O_CLOEXEC);
	a = broker_backing_open(c, mid, fd);
	b = broker_backing_open(c, mid, fd);
	cr_assert(a > 0 && b > 0, "%s", broker_last_message());
	REFUSED(broker_backing_open(c, mid, fd), EDQUOT);
	cr_assert_eq(broker_backing_close(c, mid, a), 0);
	a = broker_backing_open(c, mid, fd);
	cr_assert(a > 0);
	close(fd);
	/* Unmounting takes the mount's ids with it. */
	cr_assert_eq(broker_umount(c, NULL, mid), 0);
	rawfuse_stop(&rf);
	broker_close(c);
	assert_no_leaks(0);
	(void)b;
}

/*
 * The confused deputy. Root's file, mode 0644, known content; the peer can
 * only read it. If the broker registered the peer's read-only fd, the peer's
 * FUSE server could answer an O_RDWR open of its own file with passthrough
 * to it, and the kernel would write with the broker's (root's) credentials.
 * First a control: a file of the peer's own, registered, does take a write
 * through the FUSE mount without the server seeing it. Then the attack: the
 * registration is refused, and every way the peer's server could still try
 * (no backing id, or guessing ids) leaves the file untouched.
 */
Test(broker, confused_deputy)
{
	static const char content[] = "root's file: nobody else may write here\n";
	struct broker_conn *c = connect_as(PEER, PEER);
	struct rawfuse rf;
	uint64_t mid = served_mount(c, "m1", PEER, NULL, &rf, NULL);
	struct stat before, after;
	char *text;
	long id;
	int fd;

	write_text(bp("secret"), content, 0, 0644);
	cr_assert(stat(bp("secret"), &before) == 0);
	write_text(bp("mine"), "", PEER, 0600);
	g_conn = c;
	g_mount = mid;

	/* Control: the path works for a file the peer owns. */
	g_path = bp("mine");
	g_flags = O_RDWR;
	id = fm_as_user(PEER, PEER, peer_backing_open, NULL);
	cr_assert(id > 0, "registering the peer's own file: %s", strerror(errno));
	atomic_store(&rf.backing_id, (int)id);
	g_path = bp("root/m1/f");
	cr_assert_eq(fm_as_user(PEER, PEER, peer_write, "through passthrough"), 19,
		     "write through the mount: %s", strerror(errno));
	text = fm_slurp(bp("mine"));
	cr_assert_str_eq(text, "through passthrough");
	free(text);
	cr_assert_eq(atomic_load(&rf.n_write), 0, "the write went to the server, not passthrough");
	atomic_store(&rf.backing_id, 0);
	cr_assert_eq(broker_backing_close(c, mid, (int)id), 0);

	/* The attack: the peer's read-only fd of root's file. */
	g_path = bp("secret");
	g_flags = O_RDONLY;
	cr_assert(fm_as_user(PEER, PEER, peer_backing_open, NULL) == -1 && errno == EPERM,
		  "registering root's file from a read-only fd: %ld/%s", id, strerror(errno));
	/* Nor with a read-write fd of it (root's, handed to the peer). */
	fd = open(bp("secret"), O_RDWR | O_CLOEXEC);
	REFUSED(broker_backing_open(c, mid, fd), EPERM);
	close(fd);
	/* Without an id the server has no passthrough to give: the write comes
	 * up as a WRITE request and goes nowhere. */
	g_path = bp("root/m1/f");
	cr_assert_eq(fm_as_user(PEER, PEER, peer_write, "pwned"), 5);
	cr_assert(atomic_load(&rf.n_write) >= 1);
	/* Guessing ids: nothing is registered on this connection. */
	for (int guess = 1; guess <= 16; guess++) {
		atomic_store(&rf.backing_id, guess);
		fm_as_user(PEER, PEER, peer_write, "pwned");
	}
	atomic_store(&rf.backing_id, 0);
	text = fm_slurp(bp("secret"));
	cr_assert_str_eq(text, content, "root's file changed");
	free(text);
	cr_assert(stat(bp("secret"), &after) == 0);
	cr_assert(after.st_size == before.st_size &&
		  after.st_mtim.tv_sec == before.st_mtim.tv_sec &&
		  after.st_mtim.tv_nsec == before.st_mtim.tv_nsec, "root's file was written");
	cr_assert_eq(broker_umount(c, NULL, mid), 0);
	rawfuse_stop(&rf);
	broker_close(c);
	assert_no_leaks(0);
}

Test(broker, backing_close_of_another_peers_id)
{
	struct broker_conn *a = connect_as(PEER, PEER), *b = connect_as(PEER2, PEER2);
	struct rawfuse rfa, rfb;
	uint64_t ma = served_mount(a, "m1", PEER, NULL, &rfa, NULL);
	uint64_t mb = served_mount(b, "n1", PEER2, NULL, &rfb, NULL);
	int fd, ida, idb;

	write_text(bp("fa"), "", PEER, 0600);
	write_text(bp("fb"), "", PEER2, 0600);
	fd = open(bp("fa"), O_RDWR | O_CLOEXEC);
	ida = broker_backing_open(a, ma, fd);
	cr_assert(ida > 0, "%s", broker_last_message());
	/* b cannot use a's file on its own mount, nor a's mount (to b no
	 * mount at all) with its own file. */
	REFUSED(broker_backing_open(b, mb, fd), EPERM);
	close(fd);
	fd = open(bp("fb"), O_RDWR | O_CLOEXEC);
	REFUSED(broker_backing_open(b, ma, fd), ENOENT);
	idb = broker_backing_open(b, mb, fd);
	cr_assert(idb > 0, "%s", broker_last_message());
	close(fd);
	/* a's id, on a's mount or on b's own. */
	REFUSED(broker_backing_close(b, ma, ida), ENOENT);
	REFUSED(broker_backing_close(b, mb, ida == idb ? ida + 1 : ida), ENOENT);
	REFUSED(broker_backing_close(a, mb, idb), ENOENT);
	cr_assert_eq(broker_backing_close(a, ma, ida), 0);
	cr_assert_eq(broker_backing_close(b, mb, idb), 0);
	cr_assert_eq(broker_umount(a, NULL, ma), 0);
	cr_assert_eq(broker_umount(b, NULL, mb), 0);
	rawfuse_stop(&rfa);
	rawfuse_stop(&rfb);
	broker_close(a);
	broker_close(b);
	assert_no_leaks(0);
}

/* ---- ATTACH ---- */

Test(broker, attach)
{
	struct broker_conn *c = connect_as(PEER, PEER);
	uint64_t id, again = 0;
	int fuse_fd, fd;

	id = mount_ok(c, "m1", NULL, &fuse_fd);
	/* Not the FUSE device. */
	fd = open("/dev/null", O_RDWR | O_CLOEXEC);
	REFUSED(broker_attach(c, "m1", fd, &again), EINVAL);
	close(fd);
	write_text(bp("plain"), "", PEER, 0600);
	fd = open(bp("plain"), O_RDWR | O_CLOEXEC);
	REFUSED(broker_attach(c, "m1", fd, &again), EINVAL);
	close(fd);
	/* /dev/fuse, but nothing mounted at the name. */
	fd = open("/dev/fuse", O_RDWR | O_CLOEXEC);
	REFUSED(broker_attach(c, "m2", fd, &again), EINVAL);
	close(fd);
	/* The real one: the same mount. */
	cr_assert_eq(broker_attach(c, "m1", fuse_fd, &again), 0, "%s", broker_last_message());
	cr_assert_eq(again, id);
	cr_assert_eq(broker_umount(c, NULL, id), 0);
	close(fuse_fd);
	broker_close(c);
	assert_no_leaks(0);
}

/* A FUSE mount the peer made by other means (here: root mounts it for the
 * peer, as fusermount3 would) can be attached, but not unmounted. */
Test(broker, attach_a_mount_made_elsewhere)
{
	struct broker_conn *c = connect_as(PEER, PEER), *c2;
	char opts[128];
	uint64_t id = 0;
	int fd = open("/dev/fuse", O_RDWR | O_CLOEXEC);

	cr_assert(fd >= 0);
	snprintf(opts, sizeof(opts), "fd=%d,rootmode=40000,user_id=%d,group_id=%d", fd, PEER,
		 PEER);
	cr_assert(mount("elsewhere", bp("root/m2"), "fuse", MS_NOSUID | MS_NODEV, opts) == 0,
		  "mount: %s", strerror(errno));
	cr_assert_eq(broker_attach(c, "m2", fd, &id), 0, "%s", broker_last_message());
	cr_assert(id != 0);
	REFUSED(broker_umount(c, NULL, id), EPERM);
	cr_assert(strstr(broker_last_message(), "not made by this broker"), "%s",
		  broker_last_message());
	/* Another peer cannot attach it: it is not beneath that peer's root. */
	c2 = connect_as(PEER2, PEER2);
	REFUSED(broker_attach(c2, "n1", fd, &id), EINVAL);
	broker_close(c2);
	cr_assert(fm_is_mounted(bp("root/m2")));
	cr_assert(umount2(bp("root/m2"), MNT_DETACH) == 0);
	close(fd);
	/* A FUSE mount beneath the peer's root that is not the peer's (root's
	 * here): not attachable. */
	fd = open("/dev/fuse", O_RDWR | O_CLOEXEC);
	snprintf(opts, sizeof(opts), "fd=%d,rootmode=40000,user_id=0,group_id=0", fd);
	cr_assert(mount("notyours", bp("root/m3"), "fuse", MS_NOSUID | MS_NODEV, opts) == 0);
	REFUSED(broker_attach(c, "m3", fd, &id), EPERM);
	cr_assert(umount2(bp("root/m3"), MNT_DETACH) == 0);
	close(fd);
	broker_close(c);
	/* The broker notices the mount went when it checks (limit or timer);
	 * counted mounts must not block: m1..m3 still fit. */
	c = connect_as(PEER, PEER);
	cr_assert_eq(broker_umount(c, NULL, mount_ok(c, "m1", NULL, NULL)), 0);
	broker_close(c);
}

/* ---- malformed frames ---- */

static void send_raw(int sock, const void *buf, size_t len)
{
	cr_assert(send(sock, buf, len, MSG_NOSIGNAL) == (ssize_t)len);
}

static void send_with_fd(int sock, const void *data, size_t len, int fd)
{
	union {
		struct cmsghdr align;
		char buf[CMSG_SPACE(sizeof(int))];
	} ctl;
	struct iovec iov = { .iov_base = (void *)data, .iov_len = len };
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf,
			      .msg_controllen = sizeof(ctl.buf) };
	struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);

	memset(&ctl, 0, sizeof(ctl));
	cm = CMSG_FIRSTHDR(&msg);
	cm->cmsg_level = SOL_SOCKET;
	cm->cmsg_type = SCM_RIGHTS;
	cm->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(cm), &fd, sizeof(int));
	cr_assert(sendmsg(sock, &msg, MSG_NOSIGNAL) == (ssize_t)len);
}

static size_t pack_request(Ferry__Broker__Request *q, uint8_t *buf)
{
	return ferry__broker__request__pack(q, buf);
}

static void expect_fatal(int sock, uint32_t err, uint64_t id)
{
	uint32_t e;
	bool closing;
	uint64_t rid;

	read_reply(sock, &e, &closing, &rid);
	cr_assert_eq(e, err, "error %u (%s), expected %u (%s)", e, strerror((int)e), err,
		     strerror((int)err));
	cr_assert(closing, "reply without closing");
	cr_assert_eq(rid, id);
	expect_eof(sock);
	close(sock);
}

Test(broker, malformed_frames)
{
	uint8_t buf[BROKER_FRAME_MAX + 64], hdr[4];
	Ferry__Broker__Request q = FERRY__BROKER__REQUEST__INIT;
	Ferry__Broker__StatusQuery sq = FERRY__BROKER__STATUS_QUERY__INIT;
	Ferry__Broker__BackingOpen bo = FERRY__BROKER__BACKING_OPEN__INIT;
	uint64_t seed = 42;
	size_t len;
	int s, fds[2];

	/* Random bytes, three times. */
	for (int i = 0; i < 3; i++) {
		uint32_t e;
		bool closing;
		uint64_t id;

		s = connect_raw(PEER, PEER);
		fm_fill_random(&seed, buf, 200);
		cr_assert_eq(rpc_frame_send(s, buf, 200, NULL, 0), 0);
		read_reply(s, &e, &closing, &id);
		cr_assert(e != 0 && closing, "random bytes: error %u closing %d", e, closing);
		expect_eof(s);
		close(s);
	}
	/* A length past the limit: refused before anything is read. */
	s = connect_raw(PEER, PEER);
	rpc_frame_header(hdr, 1u << 30);
	send_raw(s, hdr, 4);
	expect_fatal(s, EMSGSIZE, 0);
	s = connect_raw(PEER, PEER);
	rpc_frame_header(hdr, BROKER_FRAME_MAX + 1);
	send_raw(s, hdr, 4);
	expect_fatal(s, EMSGSIZE, 0);
	/* Empty frame. */
	s = connect_raw(PEER, PEER);
	cr_assert_eq(rpc_frame_send(s, NULL, 0, NULL, 0), 0);
	expect_fatal(s, EBADMSG, 0);
	/* Wrong version. */
	q.version = 2;
	q.id = 7;
	q.body_case = FERRY__BROKER__REQUEST__BODY_STATUS;
	q.status = &sq;
	len = pack_request(&q, buf);
	s = connect_raw(PEER, PEER);
	cr_assert_eq(rpc_frame_send(s, buf, len, NULL, 0), 0);
	expect_fatal(s, EPROTONOSUPPORT, 7);
	/* Unknown type: a body field this broker does not know (99). */
	q.version = BROKER_PROTO_VERSION;
	q.id = 8;
	q.body_case = FERRY__BROKER__REQUEST__BODY__NOT_SET;
	len = pack_request(&q, buf);
	buf[len++] = 0x98; /* field 99, varint */
	buf[len++] = 0x06;
	buf[len++] = 0x01;
	s = connect_raw(PEER, PEER);
	cr_assert_eq(rpc_frame_send(s, buf, len, NULL, 0), 0);
	expect_fatal(s, EOPNOTSUPP, 8);
	/* Missing fd. */
	q.id = 9;
	bo.mount_id = 1;
	q.body_case = FERRY__BROKER__REQUEST__BODY_BACKING_OPEN;
	q.backing_open = &bo;
	len = pack_request(&q, buf);
	s = connect_raw(PEER, PEER);
	cr_assert_eq(rpc_frame_send(s, buf, len, NULL, 0), 0);
	expect_fatal(s, EBADF, 9);
	/* An fd where none belongs. */
	q.id = 10;
	q.body_case = FERRY__BROKER__REQUEST__BODY_STATUS;
	q.status = &sq;
	len = pack_request(&q, buf);
	fds[0] = open("/dev/null", O_RDONLY | O_CLOEXEC);
	fds[1] = open("/dev/null", O_RDONLY | O_CLOEXEC);
	s = connect_raw(PEER, PEER);
	cr_assert_eq(rpc_frame_send(s, buf, len, fds, 1), 0);
	expect_fatal(s, EBADF, 10);
	/* Two fds with a BACKING_OPEN: one too many for it. */
	q.id = 11;
	q.body_case = FERRY__BROKER__REQUEST__BODY_BACKING_OPEN;
	q.backing_open = &bo;
	len = pack_request(&q, buf);
	s = connect_raw(PEER, PEER);
	cr_assert_eq(rpc_frame_send(s, buf, len, fds, 2), 0);
	expect_fatal(s, EBADF, 11);
	/* BACKING_OPEN_MANY with no fd, and with more than a frame may carry
	 * (the surplus is never read into the frame). */
	{
		Ferry__Broker__BackingOpenMany bm = FERRY__BROKER__BACKING_OPEN_MANY__INIT;
		int many[BROKER_FDS_MAX + 1];

		bm.mount_id = 1;
		q.id = 12;
		q.body_case = FERRY__BROKER__REQUEST__BODY_BACKING_OPEN_MANY;
		q.backing_open_many = &bm;
		len = pack_request(&q, buf);
		s = connect_raw(PEER, PEER);
		cr_assert_eq(rpc_frame_send(s, buf, len, NULL, 0), 0);
		expect_fatal(s, EBADF, 12);
		for (size_t k = 0; k < BROKER_FDS_MAX + 1; k++)
			many[k] = fds[k % 2];
		s = connect_raw(PEER, PEER);
		cr_assert_eq(send_frame_fds(s, buf, len, many, BROKER_FDS_MAX + 1), 0);
		expect_fatal(s, ETOOMANYREFS, 0);
	}
	/* BACKING_CLOSE_MANY with no id, with too many, and with id 0. */
	{
		Ferry__Broker__BackingCloseMany cm = FERRY__BROKER__BACKING_CLOSE_MANY__INIT;
		uint32_t ids[BROKER_CLOSE_MANY_MAX + 1];

		for (size_t k = 0; k < BROKER_CLOSE_MANY_MAX + 1; k++)
			ids[k] = (uint32_t)k + 1;
		cm.mount_id = 1;
		cm.backing_ids = ids;
		q.body_case = FERRY__BROKER__REQUEST__BODY_BACKING_CLOSE_MANY;
		q.backing_close_many = &cm;
		for (int t = 0; t < 3; t++) {
			cm.n_backing_ids = t == 0 ? 0 : t == 1 ? BROKER_CLOSE_MANY_MAX + 1 : 3;
			if (t == 2)
				ids[1] = 0;
			q.id = 13 + (uint64_t)t;
			len = pack_request(&q, buf);
			s = connect_raw(PEER, PEER);
			cr_assert_eq(rpc_frame_send(s, buf, len, NULL, 0), 0);
			expect_fatal(s, EINVAL, 13 + (uint64_t)t);
		}
	}
	/* Root's well-formed MOUNT: not permitted at all (root is in no rule;
	 * a stranger would not even be read, refuses_peer_not_in_policy). */
	{
		Ferry__Broker__Mount m = FERRY__BROKER__MOUNT__INIT;

		m.name = "m1";
		q.id = 12;
		q.body_case = FERRY__BROKER__REQUEST__BODY_MOUNT;
		q.mount = &m;
		len = pack_request(&q, buf);
		s = connect_raw(0, 0);
		cr_assert_eq(rpc_frame_send(s, buf, len, NULL, 0), 0);
		expect_fatal(s, EPERM, 12);
	}
	/* Vanishing in the middle of a frame, with an fd already sent: the
	 * header says 100 bytes, 10 come, then the peer is gone. */
	s = connect_raw(PEER, PEER);
	rpc_frame_header(buf, 100);
	send_with_fd(s, buf, 14, fds[0]);
	close(s);
	close(fds[0]);
	close(fds[1]);
	/* The broker goes on serving, and kept nothing. */
	assert_no_leaks(0);
	{
		struct broker_conn *c = connect_as(PEER, PEER);
		cr_assert_eq(broker_umount(c, NULL, mount_ok(c, "m1", NULL, NULL)), 0);
		broker_close(c);
	}
	assert_no_leaks(0);
}

/* A peer that sends and never reads holds up no one else. */
Test(broker, slow_reader_blocks_no_one)
{
	Ferry__Broker__Request q = FERRY__BROKER__REQUEST__INIT;
	Ferry__Broker__StatusQuery sq = FERRY__BROKER__STATUS_QUERY__INIT;
	uint8_t buf[64], frame[68];
	struct broker_status st;
	struct timespec t0, t1;
	size_t len, sent = 0;
	int s = connect_raw(PEER, PEER);

	q.version = BROKER_PROTO_VERSION;
	q.body_case = FERRY__BROKER__REQUEST__BODY_STATUS;
	q.status = &sq;
	q.id = 1;
	len = pack_request(&q, buf);
	rpc_frame_header(frame, (uint32_t)len);
	memcpy(frame + 4, buf, len);
	/* Send until the socket takes no more: the broker stopped reading us. */
	for (int i = 0; i < 200000; i++) {
		ssize_t n = send(s, frame, len + 4, MSG_DONTWAIT | MSG_NOSIGNAL);
		if (n < 0) {
			cr_assert(errno == EAGAIN, "send: %s", strerror(errno));
			break;
		}
		cr_assert_eq(n, (ssize_t)(len + 4));
		sent++;
	}
	cr_assert(sent > 64);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	bk_status(&st);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	cr_assert(t1.tv_sec - t0.tv_sec < 2, "a slow reader delayed another peer");
	close(s);
	assert_no_leaks(0);
}

/* ---- many threads, one connection ---- */

#define THREADS 8
#define HELD 16
#define ROUNDS 100

struct worker {
	struct broker_conn *c;
	uint64_t mid;
	int fd;
	int ids[HELD];
	int failures;
	char msg[BROKER_MSG_MAX];
};

static pthread_barrier_t barrier;

static void *worker_run(void *arg)
{
	struct worker *w = arg;

	for (int i = 0; i < HELD; i++) {
		w->ids[i] = broker_backing_open(w->c, w->mid, w->fd);
		if (w->ids[i] <= 0) {
			w->failures++;
			snprintf(w->msg, sizeof(w->msg), "%s", broker_last_message());
		}
	}
	pthread_barrier_wait(&barrier); /* all held at once: checked for duplicates */
	pthread_barrier_wait(&barrier);
	for (int i = 0; i < HELD; i++)
		if (w->ids[i] > 0 && broker_backing_close(w->c, w->mid, w->ids[i]) < 0)
			w->failures++;
	for (int r = 0; r < ROUNDS; r++) {
		int id = broker_backing_open(w->c, w->mid, w->fd);

		if (id <= 0 || broker_backing_close(w->c, w->mid, id) < 0)
			w->failures++;
	}
	return NULL;
}

static double now_us(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

Test(broker, threads_share_one_connection)
{
	struct broker_conn *c = connect_as(PEER, PEER);
	struct worker w[THREADS];
	pthread_t th[THREADS];
	struct rawfuse rf;
	int fuse_fd;
	uint64_t mid = served_mount(c, "m1", PEER, NULL, &rf, &fuse_fd);
	double t0, direct, brokered;
	const int n = 2000;

	cr_assert_eq(pthread_barrier_init(&barrier, NULL, THREADS + 1), 0);
	for (int i = 0; i < THREADS; i++) {
		char name[32];

		snprintf(name, sizeof(name), "t%d", i);
		write_text(bp("%s", name), "", PEER, 0600);
		w[i] = (struct worker){ .c = c, .mid = mid,
					.fd = open(bp("%s", name), O_RDWR | O_CLOEXEC) };
		cr_assert(pthread_create(&th[i], NULL, worker_run, &w[i]) == 0);
	}
	pthread_barrier_wait(&barrier);
	for (int i = 0; i < THREADS; i++)
		for (int j = 0; j < HELD; j++)
			for (int k = 0; k < THREADS; k++)
				for (int l = 0; l < HELD; l++)
					cr_assert(!(w[i].ids[j] > 0 && (i != k || j != l) &&
						    w[i].ids[j] == w[k].ids[l]),
						  "backing id %d handed out twice", w[i].ids[j]);
	pthread_barrier_wait(&barrier);
	for (int i = 0; i < THREADS; i++) {
		pthread_join(th[i], NULL);
		cr_assert_eq(w[i].failures, 0, "thread %d: %d failures: %s", i, w[i].failures,
			     w[i].msg);
	}

	/* The cost of a registration: the ioctl itself vs through the broker
	 * (the close not waited for, as ferry-mountd's RELEASE does). */
	t0 = now_us();
	for (int i = 0; i < n; i++) {
		struct ferry_backing_map map = { .fd = w[0].fd };
		int id = ioctl(fuse_fd, FERRY_DEV_IOC_BACKING_OPEN, &map);
		uint32_t bid = (uint32_t)id;

		cr_assert(id > 0, "direct ioctl: %s", strerror(errno));
		cr_assert(ioctl(fuse_fd, FERRY_DEV_IOC_BACKING_CLOSE, &bid) == 0);
	}
	direct = (now_us() - t0) / n;
	t0 = now_us();
	for (int i = 0; i < n; i++) {
		int id = broker_backing_open(c, mid, w[0].fd);

		cr_assert(id > 0);
		cr_assert_eq(broker_backing_close_nowait(c, mid, id), 0);
	}
	brokered = (now_us() - t0) / n;
	{
		struct broker_status st;
		cr_assert_eq(broker_status(c, &st), 0);
		cr_assert_eq(st.backing_ids, 0);
		cr_assert_eq(broker_async_failures(c), 0);
	}
	cr_log_info("backing open+close: direct ioctl %.1f us, through the broker %.1f us",
		    direct, brokered);
	fprintf(stderr, "backing open+close: direct ioctl %.1f us, through the broker %.1f us "
		"(one round trip)\n", direct, brokered);

	for (int i = 0; i < THREADS; i++)
		close(w[i].fd);
	pthread_barrier_destroy(&barrier);
	cr_assert_eq(broker_umount(c, NULL, mid), 0);
	close(fuse_fd);
	rawfuse_stop(&rf);
	broker_close(c);
	assert_no_leaks(0);
}

/* ---- restart ---- */

Test(broker, restart_keeps_live_mounts)
{
	struct broker_conn *c = connect_as(PEER, PEER);
	struct broker_status st;
	struct rawfuse rf;
	int fuse_fd, fd, old_id, id;
	uint64_t mid = served_mount(c, "m1", PEER, NULL, &rf, &fuse_fd), again = 0;
	uint64_t gone = mount_ok(c, "m2", NULL, NULL);
	char rec[64];

	write_text(bp("data"), "", PEER, 0600);
	fd = open(bp("data"), O_RDWR | O_CLOEXEC);
	old_id = broker_backing_open(c, mid, fd);
	cr_assert(old_id > 0);
	snprintf(rec, sizeof(rec), "state/%" PRIu64 ".mount", mid);
	cr_assert(access(bp("%s", rec), F_OK) == 0, "no record %s", rec);

	broker_kill(SIGKILL);
	broker_close(c);
	/* While it is away: m1 lives on (our fd), m2 is taken down by hand. */
	cr_assert(fm_is_mounted(bp("root/m1")));
	cr_assert(umount2(bp("root/m2"), MNT_DETACH) == 0);
	broker_start();

	bk_status(&st);
	cr_assert_eq(st.mounts, 1, "mounts after the restart: %" PRIu64, st.mounts);
	snprintf(rec, sizeof(rec), "state/%" PRIu64 ".mount", gone);
	cr_assert(access(bp("%s", rec), F_OK) != 0, "the record of the vanished mount stayed");
	c = connect_as(PEER, PEER);
	/* It has no /dev/fuse fd for m1 until mountd attaches it again. */
	REFUSED(broker_backing_open(c, mid, fd), EBADFD);
	cr_assert_eq(broker_attach(c, "m1", fuse_fd, &again), 0, "%s", broker_last_message());
	cr_assert_eq(again, mid);
	id = broker_backing_open(c, mid, fd);
	cr_assert(id > 0, "%s", broker_last_message());
	cr_assert_eq(broker_backing_close(c, mid, id), 0);
	/* The id from before the restart is still valid and can be closed. */
	cr_assert_eq(broker_backing_close(c, mid, old_id), 0, "%s", broker_last_message());
	REFUSED(broker_backing_close(c, mid, old_id), ENOENT);
	/* Another peer cannot attach or unmount it. */
	{
		struct broker_conn *o = connect_as(PEER2, PEER2);
		REFUSED(broker_umount(o, NULL, mid), ENOENT);
		broker_close(o);
	}
	cr_assert_eq(broker_umount(c, "m1", 0), 0, "%s", broker_last_message());
	cr_assert(!fm_is_mounted(bp("root/m1")));
	bk_status(&st);
	cr_assert_eq(st.mounts, 0);
	snprintf(rec, sizeof(rec), "state/%" PRIu64 ".mount", mid);
	cr_assert(access(bp("%s", rec), F_OK) != 0, "the record stayed after UMOUNT");
	close(fd);
	close(fuse_fd);
	rawfuse_stop(&rf);
	broker_close(c);
}

/* Restarted without the peer's fd at all: UMOUNT still works. */
Test(broker, restart_then_umount_without_attach)
{
	struct broker_conn *c = connect_as(PEER, PEER);
	int fuse_fd, fd2;
	uint64_t mid = mount_ok(c, "m1", NULL, &fuse_fd), id2;

	broker_close(c);
	broker_kill(SIGKILL);
	broker_start();
	c = connect_as(PEER, PEER);
	REFUSED(broker_mount(c, "m1", NULL, &fd2, &id2), EBUSY);
	cr_assert_eq(broker_umount(c, NULL, mid), 0, "%s", broker_last_message());
	cr_assert(!fm_is_mounted(bp("root/m1")));
	close(fuse_fd);
	broker_close(c);
}

/* Restarted in a new mount namespace (a new container): its mounts are
 * copies there, with new ids. The broker finds them at their names (same
 * super block) and goes on with the new ids. */
Test(broker, restart_in_a_new_mount_namespace)
{
	struct broker_conn *c = connect_as(PEER, PEER);
	struct broker_status st;
	int fuse_fd;
	uint64_t mid = mount_ok(c, "m1", NULL, &fuse_fd), again = 0;

	broker_close(c);
	broker_kill(SIGKILL);
	bk.new_mount_ns = true;
	broker_start();
	bk_status(&st);
	cr_assert_eq(st.mounts, 1, "the mount was not found in the new namespace");
	c = connect_as(PEER, PEER);
	cr_assert_eq(broker_attach(c, "m1", fuse_fd, &again), 0, "%s", broker_last_message());
	cr_assert_neq(again, mid, "a copy in another namespace has an id of its own");
	cr_assert(access(bp("state/%" PRIu64 ".mount", again), F_OK) == 0);
	cr_assert(access(bp("state/%" PRIu64 ".mount", mid), F_OK) != 0);
	cr_assert_eq(broker_umount(c, NULL, again), 0, "%s", broker_last_message());
	bk_status(&st);
	cr_assert_eq(st.mounts, 0);
	broker_close(c);
	/* Ours (no propagation between the two) is for us to take down. */
	cr_assert(umount2(bp("root/m1"), MNT_DETACH) == 0);
	close(fuse_fd);
}

/* ---- the client when the broker goes ---- */

Test(broker, client_sees_a_vanished_broker)
{
	struct broker_conn *c;
	struct broker_status st;
	int rc;

	cr_assert_eq(broker_connect(bk.sock, &c), 0);
	cr_assert_eq(broker_status(c, &st), 0);
	broker_kill(SIGKILL);
	/* No SIGPIPE (default action would end this process), an error. */
	signal(SIGPIPE, SIG_DFL);
	rc = broker_status(c, &st);
	cr_assert(rc == -EPIPE || rc == -ENOTCONN, "%d", rc);
	cr_assert_eq(broker_status(c, &st), -ENOTCONN);
	cr_assert(broker_reconnect(c) < 0);
	broker_start();
	cr_assert_eq(broker_reconnect(c), 0);
	cr_assert_eq(broker_status(c, &st), 0);
	broker_close(c);
}

/* ---- identity ---- */

/* Moves the calling process into the cgroup v2 group dir. */
static bool cgroup_join(const char *dir)
{
	char path[PATH_MAX];
	int fd;

	snprintf(path, sizeof(path), "%s/cgroup.procs", dir);
	fd = open(path, O_WRONLY | O_CLOEXEC);
	if (fd < 0)
		return false;
	if (write(fd, "0", 1) != 1) {
		close(fd);
		return false;
	}
	close(fd);
	return true;
}

static const char *cgroup2_mount(void)
{
	static const char *const where[] = { "/sys/fs/cgroup/unified", "/sys/fs/cgroup" };
	char *mi = fm_slurp("/proc/self/mountinfo");
	const char *found = NULL;

	for (size_t i = 0; mi && i < 2 && !found; i++) {
		char pat[128];

		snprintf(pat, sizeof(pat), " %s rw", where[i]);
		if (strstr(mi, pat) && strstr(strstr(mi, pat), " - cgroup2 "))
			found = where[i];
	}
	free(mi);
	return found;
}

static int connect_in_cgroup(uid_t uid, const char *cg_dir)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0), status;
	pid_t pid;

	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", bk.sock);
	pid = fork();
	if (pid == 0) {
		struct broker_conn *c;
		struct broker_status st;

		if (!cgroup_join(cg_dir))
			_exit(5);
		if (setgroups(0, NULL) || setresgid(uid, uid, uid) || setresuid(uid, uid, uid))
			_exit(2);
		if (connect(sock, (struct sockaddr *)&sa, sizeof(sa)) < 0)
			_exit(3);
		if (broker_adopt(dup(sock), &c) < 0 || broker_status(c, &st) < 0)
			_exit(4);
		broker_close(c);
		_exit(0);
	}
	waitpid(pid, &status, 0);
	cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child: 0x%x", status);
	return sock;
}

/* Two pods with one uid, told apart by their cgroups. */
Test(broker, cgroup_tells_peers_apart)
{
	const char *cg = cgroup2_mount();
	char a[PATH_MAX], b[PATH_MAX], text[4096];
	struct broker_conn *ca, *cb, *cn;
	uint64_t ida, idb;
	int fd;

	if (!cg)
		cr_skip_test("no writable cgroup2 hierarchy");
	snprintf(a, sizeof(a), "%s/ferry-bt-%d-a", cg, (int)getpid());
	snprintf(b, sizeof(b), "%s/ferry-bt-%d-b", cg, (int)getpid());
	if (mkdir(a, 0755) < 0 || mkdir(b, 0755) < 0) {
		rmdir(a);
		cr_skip_test("cannot make cgroups: %s", strerror(errno));
	}
	mkdir_owned(bp("podA"), 0, 0755);
	mkdir_owned(bp("podB"), 0, 0755);
	mkdir_owned(bp("podA/vol"), PEER, 0755);
	mkdir_owned(bp("podB/vol"), PEER, 0755);
	snprintf(text, sizeof(text),
		 "allow uid=%d cgroup=%s root=%s\nallow uid=%d cgroup=%s root=%s\n", PEER,
		 a + strlen(cg), bp("podA"), PEER, b + strlen(cg), bp("podB"));
	write_policy(text);
	broker_kill(SIGTERM);
	broker_start();

	cr_assert_eq(broker_adopt(connect_in_cgroup(PEER, a), &ca), 0);
	cr_assert_eq(broker_adopt(connect_in_cgroup(PEER, b), &cb), 0);
	ida = mount_ok(ca, "vol", NULL, NULL);
	idb = mount_ok(cb, "vol", NULL, NULL);
	cr_assert(fm_is_mounted(bp("podA/vol")) && fm_is_mounted(bp("podB/vol")));
	/* The other pod's mount id is no mount at all to it. */
	REFUSED(broker_umount(cb, NULL, ida), ENOENT);
	REFUSED(broker_umount(ca, NULL, idb), ENOENT);
	/* The same uid outside both cgroups matches no rule: turned away at
	 * accept. */
	cr_assert_eq(broker_adopt(connect_only(PEER, PEER), &cn), 0);
	broker_set_timeout(cn, 5000);
	REFUSED(broker_mount(cn, "vol", NULL, &fd, &ida), EPIPE);
	broker_close(cn);
	cr_assert_eq(broker_umount(ca, "vol", 0), 0);
	cr_assert_eq(broker_umount(cb, "vol", 0), 0);
	broker_close(ca);
	broker_close(cb);
	rmdir(a);
	rmdir(b);
}

/* ---- privileges and the command line ---- */

static uint64_t status_field(pid_t pid, const char *key)
{
	char path[64], *text, *at;
	uint64_t v = UINT64_MAX;

	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	text = fm_slurp(path);
	cr_assert(text);
	at = strstr(text, key);
	cr_assert(at, "no %s", key);
	sscanf(at + strlen(key), " %" SCNx64, &v);
	free(text);
	return v;
}

Test(broker, keeps_only_cap_sys_admin)
{
	const uint64_t sys_admin = 1ull << 21, setid = (1ull << 6) | (1ull << 7);
	char path[64];

	cr_assert_eq(status_field(bk.pid, "CapEff:"), sys_admin);
	cr_assert_eq(status_field(bk.pid, "CapPrm:"), sys_admin | setid);
	cr_assert_eq(status_field(bk.pid, "CapBnd:"), sys_admin | setid);
	cr_assert_eq(status_field(bk.pid, "CapInh:"), 0);
	cr_assert_eq(status_field(bk.pid, "CapAmb:"), 0);
	cr_assert_eq(status_field(bk.pid, "NoNewPrivs:"), 1);
	/* The stray fd 50 the test left open across exec was closed. */
	snprintf(path, sizeof(path), "/proc/%d/fd/50", (int)bk.pid);
	cr_assert(access(path, F_OK) != 0, "fd 50 stayed open in the broker");
}

Test(broker, refuses_to_run_without_cap_sys_admin)
{
	const char *argv[] = { "/usr/bin/setpriv", "--inh-caps=-all", "--bounding-set=-sys_admin",
			       fm_bin("ferry-brokerd"), "--socket", bp("other.sock"), "--policy",
			       bk.policy, "--state-dir", bp("state2"), NULL };
	char *err;

	cr_assert_eq(fm_run(argv, bp("out"), bp("err"), 30), 1);
	err = fm_slurp(bp("err"));
	cr_assert(err && strstr(err, "CAP_SYS_ADMIN"), "%s", err ? err : "");
	free(err);
}

Test(broker, check_mode_and_ping)
{
	const char *ok[] = { fm_bin("ferry-brokerd"), "-n", "--policy", bk.policy, NULL };
	const char *bad[] = { fm_bin("ferry-brokerd"), "-n", "--policy", bp("bad"), NULL };
	const char *noroot[] = { fm_bin("ferry-brokerd"), "-n", "--policy", bp("noroot"), NULL };
	const char *ping[] = { fm_bin("ferry-brokerd"), "--ping", "--socket", bk.sock, NULL };
	const char *noping[] = { fm_bin("ferry-brokerd"), "--ping", "--socket", bp("nope"), NULL };
	char *out;

	cr_assert_eq(fm_run(ok, bp("out"), bp("err"), 30), 0);
	out = fm_slurp(bp("out"));
	cr_assert(out && strstr(out, "ok"), "%s", out);
	free(out);
	write_text(bp("bad"), "allow uid=1 root=/tmp\nallow uid=x root=/tmp\n", 0, 0644);
	cr_assert_eq(fm_run(bad, bp("out"), bp("err"), 30), 1);
	out = fm_slurp(bp("out"));
	cr_assert(out && strstr(out, ":2:"), "%s", out);
	free(out);
	write_text(bp("noroot"), "allow uid=1 root=/nonexistent/ferry\n", 0, 0644);
	cr_assert_eq(fm_run(noroot, bp("out"), bp("err"), 30), 1);
	out = fm_slurp(bp("out"));
	cr_assert(out && strstr(out, ":1:") && strstr(out, "/nonexistent/ferry"), "%s", out);
	free(out);
	cr_assert_eq(fm_run(ping, bp("out"), bp("err"), 30), 0);
	cr_assert_neq(fm_run(noping, bp("out"), bp("err"), 30), 0);
}
