/*
 * Two nodes on one machine sharing one PostgreSQL volume: two ferry-mountd
 * with their own node directories ($FERRY_STATE_DIR: staging, cache,
 * journal, lock), one PostgreSQL server (scripts/pg-server,
 * $FERRY_TEST_PG_URL), one object store (a file:// directory both reach).
 * A volume written on node A and unmounted reads back whole on node B; a
 * writer killed while holding the lease is refused to B until the lease
 * ends and B asks to take over, then B sees every file A fsynced; A, back
 * with its old node directory, is refused while B holds the volume, and
 * later moves what it left uncommitted aside instead of merging it.
 */
#include <criterion/criterion.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/mount.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "mount_util.h"

static char url[700];  /* the volume's URL */
static char base[512]; /* $FERRY_TEST_PG_URL */
static char vname[40];

static void setup(void)
{
	const struct fm_opts o = { .no_mount = true };
	const char *u = getenv("FERRY_TEST_PG_URL");
	unsigned r;

	cr_assert(u != NULL && *u && strlen(u) < sizeof(base),
		  "FERRY_TEST_PG_URL is not set: start a server with scripts/pg-server");
	strcpy(base, u);
	fm_setup_opts(&o); /* the scratch directory, its log and clean-up */
	cr_assert_eq(getrandom(&r, sizeof(r), 0), (ssize_t)sizeof(r));
	snprintf(vname, sizeof(vname), "it%d_%08x", (int)getpid(), r);
	snprintf(url, sizeof(url), "%s&volume=%s", base, vname);
	cr_assert_eq(mkdir(sp("objects"), 0755), 0);
	cr_assert_eq(mkdir(sp("mA"), 0755), 0);
	cr_assert_eq(mkdir(sp("mB"), 0755), 0);
}

static void teardown(void)
{
	const char *mnts[3] = { sp("mA"), sp("mB"), sp("mC") };

	for (int i = 0; i < 3; i++) {
		if (fm_is_mounted(mnts[i])) {
			const char *argv[] = { fm_bin("ferry"), "umount", mnts[i], NULL };
			if (fm_run(argv, NULL, NULL, 60) != 0)
				umount2(mnts[i], MNT_DETACH);
		}
	}
	fm_teardown(); /* kills what is left running beneath the scratch dir */
	{
		char schema[64];

		snprintf(schema, sizeof(schema), "ferry_%s", vname);
		fm_pg_schema_drop(schema);
	}
}

TestSuite(pg_nodes, .init = setup, .fini = teardown, .timeout = 240);

/* Runs ferry as node (A or B): its node directory is scratch/node<NODE>.
 * The command's stderr goes to err_path when given. */
static int ferry_on(char node, const char *err_path, const char *const *args)
{
	const char *argv[16];
	char state[PATH_MAX];
	int n = 0, rc;

	snprintf(state, sizeof(state), "%s", sp("node%c", node));
	argv[n++] = fm_bin("ferry");
	for (int i = 0; args[i] && n < 15; i++)
		argv[n++] = args[i];
	argv[n] = NULL;
	setenv("FERRY_STATE_DIR", state, 1);
	rc = fm_run(argv, NULL, err_path, 120);
	unsetenv("FERRY_STATE_DIR");
	return rc;
}

static void format_volume(void)
{
	char storage[PATH_MAX + 8];

	snprintf(storage, sizeof(storage), "file://%s", sp("objects"));
	const char *args[] = { "format", "--storage", storage, url, NULL };
	cr_assert_eq(ferry_on('A', NULL, args), 0, "ferry format %s", url);
}

static int mount_on(char node, const char *opts, bool takeover, const char *err_path)
{
	const char *args[8];
	int n = 0;

	args[n++] = "mount";
	if (takeover)
		args[n++] = "--takeover";
	if (opts) {
		args[n++] = "-o";
		args[n++] = opts;
	}
	args[n++] = url;
	args[n++] = node == 'A' ? sp("mA") : sp("mB");
	args[n] = NULL;
	return ferry_on(node, err_path, args);
}

static void umount_on(char node)
{
	const char *args[] = { "umount", node == 'A' ? sp("mA") : sp("mB"), NULL };

	cr_assert_eq(ferry_on(node, NULL, args), 0, "ferry umount on node %c", node);
}

/* The bytes of test file i: a size of its own (some span objects). */
static size_t file_bytes(int i, unsigned char **buf)
{
	uint64_t seed = 0x9e3779b97f4a7c15ull * (uint64_t)(i + 1);
	size_t len = i % 5 == 0 ? (size_t)(5u << 20) + 123 * (size_t)i : 1000 + 4097 * (size_t)i;

	*buf = malloc(len);
	cr_assert_not_null(*buf);
	fm_fill_random(&seed, *buf, len);
	return len;
}

static void write_files(const char *dir, int from, int to, bool fsync_each)
{
	char path[PATH_MAX];

	for (int i = from; i < to; i++) {
		unsigned char *b;
		size_t len = file_bytes(i, &b);
		int fd;

		snprintf(path, sizeof(path), "%s/f%03d", dir, i);
		fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
		cr_assert_geq(fd, 0, "create %s: %s", path, strerror(errno));
		fm_pwrite_all(fd, b, len, 0);
		if (fsync_each)
			cr_assert_eq(fsync(fd), 0, "fsync %s: %s", path, strerror(errno));
		cr_assert_eq(close(fd), 0);
		free(b);
	}
}

static void expect_files(const char *dir, int from, int to)
{
	char path[PATH_MAX];

	for (int i = from; i < to; i++) {
		unsigned char *b;
		size_t len = file_bytes(i, &b);

		snprintf(path, sizeof(path), "%s/f%03d", dir, i);
		fm_expect_content(path, b, len);
		free(b);
	}
}

/* A figure of the mount at mnt's .stats. */
static uint64_t stat_of(const char *mnt, const char *name)
{
	char path[PATH_MAX], *text, *p;
	size_t nl = strlen(name);
	uint64_t v = 0;

	snprintf(path, sizeof(path), "%s/.stats", mnt);
	text = fm_slurp(path);
	cr_assert_not_null(text, "read %s", path);
	for (p = text; p != NULL && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL) {
		if (strncmp(p, name, nl) == 0 && p[nl] == ' ') {
			v = strtoull(p + nl + 1, NULL, 10);
			free(text);
			return v;
		}
	}
	free(text);
	cr_assert_fail("%s has no %s", path, name);
	return 0;
}

Test(pg_nodes, a_volume_written_on_one_node_reads_whole_on_another)
{
	char target[64] = "";

	format_volume();
	cr_assert_eq(mount_on('A', NULL, false, NULL), 0, "mount on A");
	write_files(sp("mA"), 0, 12, false);
	cr_assert_eq(mkdir(sp("mA/dir"), 0750), 0);
	cr_assert_eq(symlink("../f001", sp("mA/dir/link")), 0);
	umount_on('A');

	cr_assert_eq(mount_on('B', NULL, false, NULL), 0, "mount on B");
	expect_files(sp("mB"), 0, 12);
	cr_assert_eq(readlink(sp("mB/dir/link"), target, sizeof(target) - 1), 7);
	cr_assert_str_eq(target, "../f001");
	/* B's own node directory: A's is not needed to read the volume. */
	cr_assert_eq(access(sp("nodeB/%s/staging", vname), F_OK), 0);
	umount_on('B');
}

/* A volume formatted again (on node A) mounts on node B, whose staging
 * directory the old volume of that name claimed (staging_owner.h): B's
 * leftovers of the old volume are moved aside and the record with them. */
Test(pg_nodes, a_volume_formatted_again_mounts_where_the_old_one_staged)
{
	char storage[PATH_MAX + 8], record[PATH_MAX], *old = NULL, *now = NULL;

	format_volume();
	cr_assert_eq(mount_on('B', NULL, false, NULL), 0, "mount on node B");
	write_files(sp("mB"), 0, 2, false);
	umount_on('B');
	snprintf(record, sizeof(record), "%s", sp("nodeB/%s/staging/.volume", vname));
	old = fm_slurp(record);
	cr_assert(old && strlen(old) == 37, "node B's staging record %s: %s", record,
		  old ? old : "(none)");

	snprintf(storage, sizeof(storage), "file://%s", sp("objects"));
	const char *again[] = { "format", "--force", "--storage", storage, url, NULL };
	cr_assert_eq(ferry_on('A', NULL, again), 0, "ferry format --force on node A");
	/* A read-only follower first: it claims nothing and is not kept out. */
	cr_assert_eq(mount_on('B', "ro", false, sp("errB")), 0,
		     "node B refused a follower of the volume formatted again: %s",
		     fm_slurp(sp("errB")));
	umount_on('B');
	cr_assert_eq(mount_on('B', NULL, false, sp("errB")), 0,
		     "node B refused the volume formatted again: %s", fm_slurp(sp("errB")));
	now = fm_slurp(record);
	cr_assert(now && strlen(now) == 37 && strcmp(now, old) != 0,
		  "node B's staging record is '%s' (the old volume's: %s)", now ? now : "(none)",
		  old);
	write_files(sp("mB"), 2, 3, false);
	umount_on('B');
	free(old);
	free(now);
}

Test(pg_nodes, a_dead_writer_is_taken_over_and_comes_back_fenced)
{
	char err[PATH_MAX], *msg;
	pid_t pids[8];
	int n;

	format_volume();
	/* A keeps what is not fsynced staged for a minute: it is still there
	 * when A dies. */
	cr_assert_eq(mount_on('A', "lease_ms=2000,upload_quiet_ms=60000,upload_delay_max_ms=60000",
			      false, NULL),
		     0, "mount on A");
	write_files(sp("mA"), 0, 6, true);
	write_files(sp("mA"), 100, 101, false); /* closed, not fsynced */
	cr_assert_eq(stat_of(sp("mA"), "lease_epoch"), 1);

	/* A's node dies: its daemons with it. */
	n = fm_daemon_pids_with("ferry-mountd", sp("mA"), pids, 8);
	n += fm_daemon_pids_with("ferry-reconciler", sp("nodeA"), pids + n, 8 - n);
	cr_assert_eq(n, 2, "ferry-mountd and ferry-reconciler of A: %d", n);
	for (int i = 0; i < n; i++)
		kill(pids[i], SIGKILL);
	for (int t = 0; t < 200 && fm_daemon_pids_with("ferry-mountd", sp("mA"), pids, 8) +
					   fm_daemon_pids_with("ferry-reconciler", sp("nodeA"),
							       pids, 8);
	     t++)
		usleep(20000);
	umount2(sp("mA"), MNT_DETACH);

	/* B is refused while A's lease runs, and after, until it asks. */
	snprintf(err, sizeof(err), "%s", sp("b.err"));
	cr_assert_neq(mount_on('B', NULL, false, err), 0, "B mounted while A held the lease");
	msg = fm_slurp(err);
	cr_assert(msg && strstr(msg, "mounted read-write by") && strstr(msg, sp("mA")),
		  "B's refusal names the holder: %s", msg ? msg : "");
	free(msg);
	usleep(2500 * 1000);
	cr_assert_neq(mount_on('B', NULL, false, err), 0, "B mounted without --takeover");
	msg = fm_slurp(err);
	cr_assert(msg && strstr(msg, "--takeover"), "the refusal says how: %s", msg ? msg : "");
	free(msg);
	cr_assert_eq(mount_on('B', NULL, true, NULL), 0, "B takes over");
	expect_files(sp("mB"), 0, 6);
	write_files(sp("mB"), 200, 201, true);

	/* A comes back with its old node directory: refused while B holds
	 * the volume, and what it left is still there, untouched. */
	snprintf(err, sizeof(err), "%s", sp("a.err"));
	cr_assert_neq(mount_on('A', NULL, false, err), 0, "A mounted while B held the lease");
	cr_assert_neq(mount_on('A', NULL, true, err), 0, "A took a running lease over");
	cr_assert_eq(access(sp("nodeA/%s/meta.epoch", vname), F_OK), 0);
	umount_on('B');

	/* B let go: A mounts, and moves its leftovers aside, not merged. */
	cr_assert_eq(mount_on('A', NULL, false, NULL), 0, "A after B let go");
	cr_assert_eq(stat_of(sp("mA"), "lease_epoch"), 3);
	cr_assert_gt(stat_of(sp("mA"), "lease_leftovers_kept"), 0);
	{
		struct stat st;
		struct dirent *de;
		DIR *d = opendir(sp("nodeA/%s/staging/.fenced-1", vname));
		int staged = 0;

		/* f100's staging file (its job waited a minute) went aside... */
		cr_assert_not_null(d, "A's staging directory was not kept aside");
		while ((de = readdir(d)) != NULL)
			staged += de->d_name[0] != '.';
		closedir(d);
		cr_assert_gt(staged, 0, "nothing of A's staged data was kept aside");
		/* ...and is not merged into the volume B wrote since. */
		cr_assert_eq(stat(sp("mA/f100"), &st) == 0 && st.st_size > 0, false,
			     "A's unsynced file from before the takeover was merged (%lld bytes)",
			     (long long)st.st_size);
	}
	expect_files(sp("mA"), 0, 6);
	expect_files(sp("mA"), 200, 201);
	umount_on('A');
}

/* The bytes of file i, version v: what a follower must come to see. */
static size_t version_bytes(int i, int v, unsigned char **buf)
{
	uint64_t seed = 0x51ed27a3ull * (uint64_t)(i + 1) + (uint64_t)v;
	size_t len = 3000 + 1000 * (size_t)v + 17 * (size_t)i;

	*buf = malloc(len);
	cr_assert_not_null(*buf);
	fm_fill_random(&seed, *buf, len);
	return len;
}

static void write_version(const char *path, int i, int v)
{
	unsigned char *b;
	size_t len = version_bytes(i, v, &b);
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);

	cr_assert_geq(fd, 0, "%s: %s", path, strerror(errno));
	fm_pwrite_all(fd, b, len, 0);
	cr_assert_eq(fsync(fd), 0, "fsync %s: %s", path, strerror(errno));
	cr_assert_eq(close(fd), 0);
	free(b);
}

/* path holds version v of file i (opened afresh, or read through fd). */
static bool has_version(const char *path, int fd, int i, int v)
{
	unsigned char *want, *got;
	size_t len = version_bytes(i, v, &want);
	struct stat st;
	bool same = false;
	int f = fd >= 0 ? fd : open(path, O_RDONLY);

	if (f >= 0 && fstat(f, &st) == 0 && (size_t)st.st_size == len) {
		got = malloc(len + 1);
		cr_assert_not_null(got);
		same = pread(f, got, len + 1, 0) == (ssize_t)len && memcmp(got, want, len) == 0;
		free(got);
	}
	if (f >= 0 && fd < 0)
		close(f);
	free(want);
	return same;
}

static double now_s(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + t.tv_nsec / 1e9;
}

/*
 * A read-only mount on another node follows the writer: it takes no lease
 * (the writer keeps writing, a third read-write mount is still refused),
 * refuses writes (EROFS), and sees each of the writer's committed changes
 * -- new content of a file it read before, even through a descriptor it
 * kept open; a new file; an unlink; a rename; a new directory -- within
 * its bound (attr_timeout, 1 s by default), here waited for up to 10 s.
 */
Test(pg_nodes, a_read_only_follower_sees_the_writers_changes_within_its_bound)
{
	char err[PATH_MAX];
	struct stat st;
	double t0, waited = 0;
	int held;

	format_volume();
	cr_assert_eq(mount_on('A', NULL, false, NULL), 0, "mount on A");
	for (int i = 0; i < 4; i++)
		write_version(sp("mA/v%d", i), i, 0);
	cr_assert_eq(mount_on('B', "ro", false, NULL), 0, "read-only mount on B");
	cr_assert_eq(stat_of(sp("mB"), "follower"), 1);
	for (int i = 0; i < 4; i++)
		cr_assert(has_version(sp("mB/v%d", i), -1, i, 0), "B reads v%d", i);
	held = open(sp("mB/v3"), O_RDONLY);
	cr_assert_geq(held, 0);
	errno = 0;
	cr_assert(open(sp("mB/new"), O_WRONLY | O_CREAT, 0644) < 0 && errno == EROFS,
		  "create on the follower: %s", strerror(errno));
	cr_assert(unlink(sp("mB/v0")) < 0 && errno == EROFS);

	/* The writer goes on, its lease its own. */
	cr_assert_eq(stat_of(sp("mA"), "lease_epoch"), 1);
	snprintf(err, sizeof(err), "%s", sp("c.err"));
	{
		const char *args[] = { "mount", url, sp("mC"), NULL };

		cr_assert_eq(mkdir(sp("mC"), 0755), 0);
		cr_assert_neq(ferry_on('C', err, args), 0, "a second writer next to A and B");
	}
	write_version(sp("mA/v0"), 0, 1);
	write_version(sp("mA/v3"), 3, 1);
	write_version(sp("mA/added"), 9, 0);
	cr_assert_eq(unlink(sp("mA/v1")), 0);
	cr_assert_eq(rename(sp("mA/v2"), sp("mA/moved")), 0);
	cr_assert_eq(mkdir(sp("mA/dir"), 0755), 0);
	{
		int dfd = open(sp("mA"), O_RDONLY | O_DIRECTORY);

		cr_assert_eq(fsync(dfd), 0);
		close(dfd);
	}
	t0 = now_s();
	for (;;) {
		bool seen = has_version(sp("mB/v0"), -1, 0, 1) && has_version(sp("mB/v3"), held, 3, 1) &&
			    has_version(sp("mB/added"), -1, 9, 0) && stat(sp("mB/v1"), &st) < 0 &&
			    errno == ENOENT && has_version(sp("mB/moved"), -1, 2, 0) &&
			    stat(sp("mB/v2"), &st) < 0 && stat(sp("mB/dir"), &st) == 0 &&
			    S_ISDIR(st.st_mode);

		waited = now_s() - t0;
		if (seen)
			break;
		cr_assert_lt(waited, 10.0, "the follower still shows the old volume after %.1f s",
			     waited);
		usleep(50 * 1000);
	}
	cr_log_info("the follower saw the writer's changes %.2f s after they were synced", waited);
	close(held);
	umount_on('B');
	umount_on('A');
}

/* A writer cut off long enough for its lease to run out (here: stopped)
 * finds, when it comes back, that another mount took the volume over: it
 * turns read-only (EROFS), says so in .stats, and nothing it does lands. */
Test(pg_nodes, a_writer_cut_off_and_taken_over_turns_read_only)
{
	pid_t pids[4];
	struct stat st;
	int fd;

	format_volume();
	cr_assert_eq(mount_on('A', "lease_ms=2000", false, NULL), 0, "mount on A");
	write_files(sp("mA"), 0, 2, true);
	cr_assert_eq(fm_daemon_pids_with("ferry-mountd", sp("mA"), pids, 4), 1);
	kill(pids[0], SIGSTOP);
	usleep(2500 * 1000);
	cr_assert_eq(mount_on('B', NULL, true, NULL), 0, "B takes over");
	write_files(sp("mB"), 10, 11, true);
	kill(pids[0], SIGCONT);
	/* A's next renewal (a third of its lease) finds the epoch moved on. */
	for (int t = 0; t < 300 && stat_of(sp("mA"), "lease_fenced") == 0; t++)
		usleep(10000);
	cr_assert_eq(stat_of(sp("mA"), "lease_fenced"), 1);
	errno = 0;
	fd = open(sp("mA/late"), O_WRONLY | O_CREAT, 0644);
	cr_assert(fd < 0 && errno == EROFS, "create on a fenced mount: %d %s", fd, strerror(errno));
	errno = 0;
	fd = open(sp("mA/f000"), O_WRONLY);
	cr_assert(fd < 0 && errno == EROFS, "open for write: %d %s", fd, strerror(errno));
	cr_assert(mkdir(sp("mA/dir"), 0755) < 0 && errno == EROFS);
	cr_assert(unlink(sp("mA/f001")) < 0 && errno == EROFS);
	expect_files(sp("mA"), 0, 2); /* reads go on */
	umount_on('A');
	cr_assert_eq(stat(sp("mB/late"), &st), -1);
	cr_assert_eq(stat(sp("mB/dir"), &st), -1);
	expect_files(sp("mB"), 0, 2);
	expect_files(sp("mB"), 10, 11);
	umount_on('B');
}

/* ---- a server that goes away, or is not there ---------------------------- */

/*
 * These stop and start their server, so it is one of their own
 * (scripts/pg-server in the scratch directory), not the shared one other
 * tests use meanwhile.
 */
static void outage_setup(void)
{
	const struct fm_opts o = { .no_mount = true };
	const char *argv[] = { FERRY_SOURCE_DIR "/scripts/pg-server", "start", NULL, NULL };
	char *out, *p, *q;

	fm_setup_opts(&o);
	argv[2] = sp("pgsrv");
	cr_assert_eq(fm_run(argv, sp("pgsrv.env"), sp("pgsrv.err"), 120), 0,
		     "scripts/pg-server start failed: see %s", sp("pgsrv.err"));
	out = fm_slurp(sp("pgsrv.env"));
	cr_assert_not_null(out);
	/* export FERRY_TEST_PG_URL=postgresql:///ferry_test\?host=...\&user=ferry */
	p = strstr(out, "FERRY_TEST_PG_URL=");
	cr_assert_not_null(p, "%s", out);
	p += strlen("FERRY_TEST_PG_URL=");
	q = base;
	for (; *p && *p != '\n' && q < base + sizeof(base) - 1; p++)
		if (*p != '\\') /* %q's escapes */
			*q++ = *p;
	*q = '\0';
	free(out);
	snprintf(vname, sizeof(vname), "outage");
	snprintf(url, sizeof(url), "%s&volume=%s", base, vname);
	cr_assert_eq(mkdir(sp("objects"), 0755), 0);
	cr_assert_eq(mkdir(sp("mA"), 0755), 0);
	cr_assert_eq(mkdir(sp("mB"), 0755), 0);
}

static void pg_server(const char *cmd)
{
	const char *argv[] = { FERRY_SOURCE_DIR "/scripts/pg-server", cmd, sp("pgsrv"), NULL };

	cr_assert_eq(fm_run(argv, NULL, NULL, 120), 0, "scripts/pg-server %s", cmd);
}

static void outage_teardown(void)
{
	const char *mnts[2] = { sp("mA"), sp("mB") };
	const char *argv[] = { FERRY_SOURCE_DIR "/scripts/pg-server", "stop", sp("pgsrv"), NULL };

	for (int i = 0; i < 2; i++) {
		if (fm_is_mounted(mnts[i])) {
			const char *um[] = { fm_bin("ferry"), "umount", mnts[i], NULL };

			/* A stopped server would hold the unmount: start it. */
			const char *res[] = { argv[0], "resume", sp("pgsrv"), NULL };
			fm_run(res, "/dev/null", "/dev/null", 60);
			if (fm_run(um, NULL, NULL, 60) != 0)
				umount2(mnts[i], MNT_DETACH);
		}
	}
	/* Stopped before the scratch directory goes: with its data directory
	 * gone, pg-server could no longer stop it, and it ran on. */
	fm_run(argv, "/dev/null", "/dev/null", 60);
	fm_teardown();
}

TestSuite(pg_outage, .init = outage_setup, .fini = outage_teardown, .timeout = 240);

/* Creates scratch-relative file i of the stream; true if every call of it
 * returned success (the application was told it is there). */
static bool create_one(const char *dir, int i, int *err)
{
	char path[PATH_MAX], text[64];
	int fd, len = snprintf(text, sizeof(text), "file %d of the stream\n", i);

	snprintf(path, sizeof(path), "%s/s%04d", dir, i);
	fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0644);
	if (fd < 0) {
		*err = errno;
		return false;
	}
	if (write(fd, text, (size_t)len) != len) {
		*err = errno;
		close(fd);
		return false;
	}
	if (close(fd) != 0) {
		*err = errno;
		return false;
	}
	return true;
}

/*
 * The server stops (a fast shutdown: every session ended) in the middle of
 * a stream of creates and starts again seconds later. No daemon dies;
 * calls made while it is away either succeed or fail with EIO; the daemon
 * connects again by itself; every create that returned, before, during
 * and after, is in the volume another node mounts afterwards.
 */
Test(pg_outage, a_server_stopped_in_a_stream_of_creates_loses_nothing_acknowledged)
{
	enum { N = 240, STOP_AT = 60, START_AT = 150 };
	bool ok[N] = { false };
	int failed = 0, other = 0, err = 0, dfd;
	char text[64];

	format_volume();
	cr_assert_eq(mount_on('A', NULL, false, NULL), 0, "mount on A");
	for (int i = 0; i < N; i++) {
		if (i == STOP_AT)
			pg_server("pause");
		if (i == START_AT)
			pg_server("resume");
		err = 0;
		ok[i] = create_one(sp("mA"), i, &err);
		if (!ok[i]) {
			failed++;
			other += err != EIO;
			cr_assert(i >= STOP_AT, "create %d failed before the server stopped: %s", i,
				  strerror(err));
			cr_assert_eq(err, EIO, "create %d: %s, not EIO", i, strerror(err));
		}
		if (i >= STOP_AT && i < START_AT)
			usleep(20 * 1000); /* the outage lasts a few seconds */
	}
	cr_assert_eq(other, 0);
	cr_assert(ok[0] && ok[STOP_AT - 1], "creates with the server up went through");
	/* Back, and connected again: a sync goes through (it may first say,
	 * once, that commits made without waiting for the server's flush
	 * could be lost; a fast shutdown flushed them). */
	dfd = open(sp("mA"), O_RDONLY | O_DIRECTORY);
	cr_assert_geq(dfd, 0);
	if (fsync(dfd) != 0)
		cr_assert_eq(fsync(dfd), 0, "fsyncdir after the server came back: %s", strerror(errno));
	close(dfd);
	cr_assert_gt(stat_of(sp("mA"), "meta_reconnects"), 0);
	cr_assert(ok[N - 1], "creates after the server came back went through");
	umount_on('A');

	cr_assert_eq(mount_on('B', NULL, false, NULL), 0, "mount on B");
	for (int i = 0; i < N; i++) {
		char path[PATH_MAX];
		int len = snprintf(text, sizeof(text), "file %d of the stream\n", i);

		snprintf(path, sizeof(path), "%s/s%04d", sp("mB"), i);
		if (ok[i])
			fm_expect_content(path, text, (size_t)len);
	}
	umount_on('B');
	cr_log_info("creates while the server was away: %d of %d failed with EIO", failed,
		    START_AT - STOP_AT);
}

/* A server that is not there, or does not answer: the mount fails soon,
 * with a line that says so, and leaves nothing mounted or running. */
Test(pg_outage, an_unreachable_or_silent_server_fails_the_mount_clearly)
{
	char err[PATH_MAX], bad[900], *msg;
	int lfd, port;
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t alen = sizeof(a);
	time_t t0;
	pid_t pids[4];

	format_volume();
	pg_server("pause");
	snprintf(err, sizeof(err), "%s", sp("a.err"));
	cr_assert_neq(mount_on('A', NULL, false, err), 0, "mounted with the server stopped");
	msg = fm_slurp(err);
	cr_assert(msg && strstr(msg, "reach"), "the refusal says the server is unreachable: %s",
		  msg ? msg : "");
	free(msg);
	cr_assert(!fm_is_mounted(sp("mA")));
	pg_server("resume");

	/* A server that accepts the connection and says nothing. */
	lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	cr_assert_geq(lfd, 0);
	cr_assert_eq(bind(lfd, (struct sockaddr *)&a, sizeof(a)), 0);
	cr_assert_eq(listen(lfd, 16), 0);
	cr_assert_eq(getsockname(lfd, (struct sockaddr *)&a, &alen), 0);
	port = ntohs(a.sin_port);
	snprintf(bad, sizeof(bad), "postgresql://ferry@127.0.0.1:%d/ferry_test?connect_timeout=2&volume=%s",
		 port, vname);
	{
		const char *args[] = { "mount", bad, sp("mA"), NULL };

		t0 = time(NULL);
		cr_assert_neq(ferry_on('A', err, args), 0, "mounted a silent server");
	}
	cr_assert_lt(time(NULL) - t0, 30, "the mount waited %ld s", (long)(time(NULL) - t0));
	msg = fm_slurp(err);
	cr_assert(msg && strstr(msg, "reach"), "the refusal says the server is unreachable: %s",
		  msg ? msg : "");
	free(msg);
	close(lfd);
	cr_assert(!fm_is_mounted(sp("mA")));
	cr_assert_eq(fm_daemon_pids_with("ferry-mountd", sp("mA"), pids, 4), 0);
}
