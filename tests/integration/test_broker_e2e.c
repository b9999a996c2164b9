/*
 * End to end through ferry-brokerd: the broker runs as root; `ferry format`,
 * `ferry mount --broker`, ferry-mountd, ferry-reconciler and every file
 * operation run as uid 65534 (setpriv, or a forked child that dropped to
 * it). The mount works, passthrough is engaged (no WRITE requests), files
 * survive unmount and remount, and a broker restart under a live mount
 * breaks nothing.
 *
 * Each test has its own directory /tmp/ferry-bke.XXXXXX:
 *   pods/      the policy root (root's), pods/m the mountpoint (nobody's)
 *   home/      nobody's: the volume, its staging and cache directories
 *   state/     the broker's mount table
 *   broker.sock, broker.policy, brokerd.log, ferry.log
 */
#include <criterion/criterion.h>

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <grp.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "broker_client.h"
#include "mount_util.h"

static char top[64];
static pid_t brokerd = -1;
static char pg_schema[64]; /* a PostgreSQL volume's, dropped at teardown */

static const char *tp(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static const char *tp(const char *fmt, ...)
{
	static char ring[8][PATH_MAX];
	static int k;
	char *b = ring[k++ % 8];
	va_list ap;
	int n = snprintf(b, PATH_MAX, "%s/", top);

	va_start(ap, fmt);
	vsnprintf(b + n, PATH_MAX - (size_t)n, fmt, ap);
	va_end(ap);
	return b;
}

/* Runs a command as nobody (setpriv), output to ferry.log. Exit status. */
static int run_nobody(const char *const *cmd)
{
	const char *argv[24] = { "/usr/bin/setpriv", "--reuid=65534", "--regid=65534",
				 "--clear-groups", "--" };
	int n = 5;

	for (int i = 0; cmd[i] && n < 23; i++)
		argv[n++] = cmd[i];
	argv[n] = NULL;
	return fm_run(argv, tp("ferry.log"), tp("ferry.log.err"), 120);
}

static void log_tail(const char *what, const char *path)
{
	char *s = fm_slurp(path);

	cr_log_error("---- %s (%s) ----\n%s", what, path, s ? s : "(none)");
	free(s);
}

static void brokerd_start(void)
{
	int fd;

	brokerd = fork();
	cr_assert(brokerd >= 0);
	if (brokerd == 0) {
		fd = open(tp("brokerd.log"), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
		if (fd >= 0)
			dup2(fd, 2);
		execl(fm_bin("ferry-brokerd"), "ferry-brokerd", "--socket", tp("broker.sock"),
		      "--socket-mode", "0666", "--policy", tp("broker.policy"), "--state-dir",
		      tp("state"), (char *)NULL);
		_exit(127);
	}
	for (int i = 0; i < 200; i++) {
		const char *ping[] = { fm_bin("ferry-brokerd"), "--ping", "--socket",
				       tp("broker.sock"), NULL };
		if (fm_run(ping, "/dev/null", "/dev/null", 10) == 0)
			return;
		if (waitpid(brokerd, NULL, WNOHANG) == brokerd) {
			brokerd = -1;
			log_tail("brokerd", tp("brokerd.log"));
			cr_assert_fail("ferry-brokerd exited at start");
		}
		usleep(25 * 1000);
	}
	log_tail("brokerd", tp("brokerd.log"));
	cr_assert_fail("ferry-brokerd did not answer --ping");
}

static void brokerd_kill(int sig)
{
	if (brokerd <= 0)
		return;
	kill(brokerd, sig);
	waitpid(brokerd, NULL, 0);
	brokerd = -1;
}

static void mkdir_owned(const char *path, uid_t uid, mode_t mode)
{
	cr_assert(mkdir(path, mode) == 0, "mkdir %s: %s", path, strerror(errno));
	cr_assert(chown(path, uid, uid) == 0);
	cr_assert(chmod(path, mode) == 0);
}

static void setup(void)
{
	FILE *f;

	strcpy(top, "/tmp/ferry-bke.XXXXXX");
	cr_assert_not_null(mkdtemp(top));
	cr_assert(chmod(top, 0755) == 0);
	mkdir_owned(tp("pods"), 0, 0755);
	mkdir_owned(tp("pods/m"), FM_NOBODY_UID, 0755);
	mkdir_owned(tp("home"), FM_NOBODY_UID, 0755);
	mkdir_owned(tp("state"), 0, 0700);
	f = fopen(tp("broker.policy"), "we");
	cr_assert_not_null(f);
	fprintf(f, "# test policy\nallow uid=%d root=%s max_mounts=4 max_backing=4096\n",
		FM_NOBODY_UID, tp("pods"));
	fclose(f);
	brokerd_start();
	const char *fmt[] = { fm_bin("ferry"), "format", tp("home/vol"), NULL };
	cr_assert_eq(run_nobody(fmt), 0, "ferry format as nobody failed");
}

static bool mounted(void)
{
	return fm_is_mounted(tp("pods/m"));
}

static void mount_checked(const char *const *cmd, const char *mountd_log)
{
	int rc = run_nobody(cmd);

	if (rc != 0) {
		log_tail("ferry", tp("ferry.log.err"));
		log_tail("ferry-mountd", mountd_log);
		log_tail("brokerd", tp("brokerd.log"));
	}
	cr_assert_eq(rc, 0, "ferry mount --broker as nobody failed");
	cr_assert(mounted());
}

static void do_mount(void)
{
	const char *cmd[] = { fm_bin("ferry"), "mount", "--broker", tp("broker.sock"),
			      "--staging-dir", tp("home/staging"), "--cache-dir", tp("home/cache"),
			      tp("home/vol"), tp("pods/m"), NULL };

	mount_checked(cmd, tp("home/vol/ferry-mountd.log"));
}

static void do_umount(void)
{
	const char *cmd[] = { fm_bin("ferry"), "umount", tp("pods/m"), NULL };
	int rc = run_nobody(cmd);

	if (rc != 0) {
		log_tail("ferry", tp("ferry.log.err"));
		log_tail("ferry-mountd", tp("home/vol/ferry-mountd.log"));
	}
	cr_assert_eq(rc, 0, "ferry umount as nobody failed");
	cr_assert(!mounted(), "still mounted after ferry umount");
}

/* A process of nobody's that holds path open until killed. */
static pid_t hold_open(const char *path)
{
	int p[2];
	char c = 0;
	pid_t pid;

	cr_assert(pipe(p) == 0);
	pid = fork();
	cr_assert(pid >= 0);
	if (pid == 0) {
		close(p[0]);
		if (setgroups(0, NULL) || setresgid(FM_NOBODY_GID, FM_NOBODY_GID, FM_NOBODY_GID) ||
		    setresuid(FM_NOBODY_UID, FM_NOBODY_UID, FM_NOBODY_UID) ||
		    open(path, O_RDONLY) < 0)
			_exit(1);
		if (write(p[1], "x", 1) != 1)
			_exit(1);
		pause();
		_exit(0);
	}
	close(p[1]);
	cr_assert_eq(read(p[0], &c, 1), 1, "could not open %s as nobody", path);
	close(p[0]);
	return pid;
}

static void rm_rf(const char *path)
{
	const char *argv[] = { "/bin/rm", "-rf", "--one-file-system", path, NULL };

	fm_run(argv, "/dev/null", "/dev/null", 60);
}

static void teardown(void)
{
	/* Whatever a failed test left: the mount, the daemons, the broker. */
	if (*top && mounted()) {
		umount2(tp("pods/m"), MNT_DETACH);
	}
	const char *pk[] = { "/usr/bin/pkill", "-KILL", "-f", top, NULL };
	if (*top)
		fm_run(pk, "/dev/null", "/dev/null", 10);
	brokerd_kill(SIGTERM);
	if (*pg_schema)
		fm_pg_schema_drop(pg_schema);
	unsetenv("FERRY_STATE_DIR");
	if (*top && !getenv("FERRY_IT_KEEP")) /* keep it to read the logs */
		rm_rf(top);
}

TestSuite(broker_e2e, .init = setup, .fini = teardown, .timeout = 300);

/* ---- file work as nobody ---- */

struct job {
	char dir[PATH_MAX];
	int nfiles;
	size_t big;
	uint64_t seed;
};

static long write_files(void *arg)
{
	struct job *j = arg;
	char path[PATH_MAX + 16];
	uint64_t st = j->seed;
	char *buf = malloc(j->big ? j->big : 1);

	if (!buf)
		return -1;
	for (int i = 0; i < j->nfiles; i++) {
		size_t len = i == 0 ? j->big : 2048 + (size_t)i;
		snprintf(path, sizeof(path), "%s/f%03d", j->dir, i);
		fm_fill_random(&st, buf, len);
		int fd = open(path, O_CREAT | O_EXCL | O_WRONLY, 0644);
		if (fd < 0 || write(fd, buf, len) != (ssize_t)len || close(fd) < 0) {
			free(buf);
			return -1;
		}
	}
	free(buf);
	return 0;
}

static long check_files(void *arg)
{
	struct job *j = arg;
	char path[PATH_MAX + 16];
	uint64_t st = j->seed;
	char *want = malloc(j->big ? j->big : 1), *got = malloc(j->big ? j->big + 1 : 2);

	if (!want || !got)
		return -1;
	for (int i = 0; i < j->nfiles; i++) {
		size_t len = i == 0 ? j->big : 2048 + (size_t)i;
		snprintf(path, sizeof(path), "%s/f%03d", j->dir, i);
		fm_fill_random(&st, want, len);
		int fd = open(path, O_RDONLY);
		ssize_t n = 0, r = 0;
		while (fd >= 0 && (size_t)n <= len && (r = read(fd, got + n, len + 1 - (size_t)n)) > 0)
			n += r;
		if (fd < 0 || r < 0)
			n = -1;
		if (fd >= 0)
			close(fd);
		if (n != (ssize_t)len || memcmp(want, got, len) != 0) {
			/* For the assertion message (the parent reads it). */
			FILE *f = fopen(tp("home/check.err"), "we");
			size_t d = 0;
			while (n > 0 && d < (size_t)n && d < len && want[d] == got[d])
				d++;
			if (f) {
				fprintf(f, "%s: read %zd bytes, want %zu; first difference at %zu",
					path, n, len, d);
				fclose(f);
			}
			errno = EIO;
			free(want);
			free(got);
			return -1;
		}
	}
	free(want);
	free(got);
	return 0;
}

static long mk_dir(void *path)
{
	return mkdir(path, 0755);
}

/* The mount is nobody's (no allow_other): even root may not read it, so a
 * child as nobody copies .stats to a file for us. */
static long copy_stats(void *arg)
{
	char *s = fm_slurp(tp("pods/m/.stats"));
	FILE *f;

	(void)arg;
	if (!s)
		return -1;
	f = fopen(tp("home/stats.copy"), "we");
	if (!f || fputs(s, f) < 0 || fclose(f) != 0) {
		free(s);
		return -1;
	}
	free(s);
	return 0;
}

static uint64_t stat_of(const char *name)
{
	char *s, key[128];
	const char *p;
	uint64_t v;

	cr_assert_eq(fm_as_nobody(copy_stats, NULL), 0, ".stats unreadable as nobody: %s",
		     strerror(errno));
	s = fm_slurp(tp("home/stats.copy"));
	cr_assert_not_null(s);
	snprintf(key, sizeof(key), "\n%s ", name);
	p = strstr(s, key);
	cr_assert_not_null(p, "no %s in .stats", name);
	v = strtoull(p + strlen(key), NULL, 10);
	free(s);
	return v;
}

static const char *check_err(void)
{
	static char msg[PATH_MAX + 128];
	char *s = fm_slurp(tp("home/check.err"));

	snprintf(msg, sizeof(msg), "%s", s ? s : "");
	free(s);
	return msg;
}

#define AS_NOBODY(fn, arg, what)                                                        \
	cr_assert_eq(fm_as_nobody(fn, arg), 0, "%s as nobody: %s %s", what, strerror(errno), \
		     check_err())

Test(broker_e2e, unprivileged_mount_with_passthrough_survives_remount)
{
	struct job j = { .nfiles = 40, .big = 8u << 20, .seed = 42 };
	uint64_t w0, opens0;

	snprintf(j.dir, sizeof(j.dir), "%s", tp("pods/m"));
	do_mount();
	cr_assert_eq(stat_of("passthrough_active"), 1, "passthrough is off under the broker");
	cr_assert_eq(stat_of("broker_up"), 1);
	w0 = stat_of("fuse_requests_write");
	opens0 = stat_of("backing_open");
	AS_NOBODY(write_files, &j, "writing");
	cr_assert_eq(stat_of("fuse_requests_write") - w0, 0,
		     "WRITE requests reached ferry-mountd: passthrough is not engaged");
	cr_assert_geq(stat_of("backing_open") - opens0, (uint64_t)j.nfiles,
		      "each new file should have been registered through the broker");
	AS_NOBODY(check_files, &j, "reading back before unmount");
	/* A file open there: ferry umount says busy and leaves the mount. */
	pid_t holder = hold_open(tp("pods/m/f001"));
	const char *um[] = { fm_bin("ferry"), "umount", tp("pods/m"), NULL };
	cr_assert_neq(run_nobody(um), 0, "ferry umount succeeded with a file open");
	cr_assert(mounted());
	kill(holder, SIGKILL);
	waitpid(holder, NULL, 0);
	do_umount();
	do_mount();
	AS_NOBODY(check_files, &j, "reading back after remount");
	do_umount();
}

/* The broker's own figures (root sees them all). */
static void broker_totals(struct broker_status *st)
{
	struct broker_conn *c;

	cr_assert_eq(broker_connect(tp("broker.sock"), &c), 0);
	cr_assert_eq(broker_status(c, st), 0);
	broker_close(c);
}

/*
 * ferry-mountd registers its staging pool's files in batches
 * (BACKING_OPEN_MANY) and sends the closes of RELEASE in batches
 * (BACKING_CLOSE_MANY): far fewer requests than two per file, every id
 * still closed (the broker holds only the pool's afterwards, none after
 * the unmount), and every file intact.
 */
Test(broker_e2e, registrations_and_closes_go_in_batches)
{
	struct job j = { .nfiles = 400, .big = 4096, .seed = 5 }; /* big > 2048 + nfiles */
	struct broker_status s0, s1;
	uint64_t opens0, closes0, opens, closes, requests;

	snprintf(j.dir, sizeof(j.dir), "%s", tp("pods/m"));
	do_mount();
	broker_totals(&s0);
	opens0 = stat_of("backing_open");
	closes0 = stat_of("backing_close");
	AS_NOBODY(write_files, &j, "writing");
	/* A queued close goes within a few ms; under a loaded ASan run, give
	 * it seconds. */
	for (int i = 0; i < 100 && stat_of("backing_close") - closes0 < (uint64_t)j.nfiles; i++)
		usleep(50 * 1000);
	opens = stat_of("backing_open") - opens0;
	closes = stat_of("backing_close") - closes0;
	broker_totals(&s1);
	requests = s1.requests - s0.requests - 1; /* less our own STATUS */
	cr_assert_geq(opens, (uint64_t)j.nfiles, "registrations: %" PRIu64, opens);
	cr_assert_geq(closes, (uint64_t)j.nfiles, "closes sent: %" PRIu64, closes);
	cr_assert_lt(requests, (opens + closes) / 2, "%" PRIu64 " requests reached the broker "
		     "for %" PRIu64 " registrations and %" PRIu64 " closes: not batched",
		     requests, opens, closes);
	/* What is left registered is the pool's (BROKER_FDS_MAX-sized
	 * rounds up to 32 files), no file's. */
	cr_assert_leq(s1.backing_ids, 48, "%" PRIu64 " backing ids live after every file closed",
		      s1.backing_ids);
	AS_NOBODY(check_files, &j, "reading back");
	do_umount();
	broker_totals(&s1);
	cr_assert_eq(s1.backing_ids, 0, "%" PRIu64 " backing ids live after the unmount",
		     s1.backing_ids);
}

/*
 * `ferry mount --upgrade` of a brokered mount: the new daemon serves it,
 * every file is there, and nothing the old daemon registered stays
 * registered (the closes it had queued, and its staging pool's, are sent
 * before it hands the mount over: the connection to the broker goes with
 * the old daemon, the mount does not).
 */
Test(broker_e2e, an_upgrade_leaves_no_backing_id_behind)
{
	struct job j = { .nfiles = 200, .big = 4096, .seed = 11 }; /* big > 2048 + nfiles */
	struct broker_status st;
	uint64_t pid0;
	int rc;

	snprintf(j.dir, sizeof(j.dir), "%s", tp("pods/m"));
	do_mount();
	AS_NOBODY(write_files, &j, "writing");
	pid0 = stat_of("pid");
	{
		/* tp()'s buffers are a ring: the path is taken right here. */
		const char *up[] = { fm_bin("ferry"), "mount", "--upgrade", j.dir, NULL };

		rc = run_nobody(up);
	}
	if (rc != 0) {
		log_tail("ferry", tp("ferry.log.err"));
		log_tail("ferry-mountd", tp("home/vol/ferry-mountd.log"));
	}
	cr_assert_eq(rc, 0, "ferry mount --upgrade as nobody failed");
	cr_assert_neq(stat_of("pid"), pid0, "the old daemon still serves the mount");
	/* The closes went out before the hand-over; their replies may still
	 * be on the way. */
	for (int i = 0; i < 100; i++) {
		broker_totals(&st);
		if (st.backing_ids == 0)
			break;
		usleep(50 * 1000);
	}
	cr_assert_eq(st.backing_ids, 0, "%" PRIu64 " backing ids of the old daemon are still "
		     "registered after the upgrade", st.backing_ids);
	AS_NOBODY(check_files, &j, "reading back after the upgrade");
	do_umount();
}

Test(broker_e2e, broker_restart_under_a_live_mount)
{
	struct job a = { .nfiles = 5, .big = 1u << 20, .seed = 7 };
	struct job b = { .nfiles = 5, .big = 1u << 20, .seed = 8 };

	snprintf(a.dir, sizeof(a.dir), "%s", tp("pods/m"));
	snprintf(b.dir, sizeof(b.dir), "%s", tp("pods/m/after"));

	do_mount();
	AS_NOBODY(write_files, &a, "writing");
	brokerd_kill(SIGKILL);
	cr_assert(mounted(), "the mount went with the broker");
	/* While the broker is away, new files take the daemon path. */
	AS_NOBODY(mk_dir, (void *)tp("pods/m/after"), "mkdir with the broker away");
	brokerd_start();
	AS_NOBODY(write_files, &b, "writing after the broker came back");
	AS_NOBODY(check_files, &a, "reading");
	AS_NOBODY(check_files, &b, "reading");
	/* A passthrough open relinks -- at most once a second, so a mount
	 * whose first try came while the broker was away waits for the next
	 * second: the broker knows the mount again, and passthrough is back. */
	uint64_t w0 = 0;
	bool relinked = false;
	for (int i = 0; i < 40 && !relinked; i++) {
		struct job c = { .nfiles = 1, .big = 4096, .seed = 9 };

		snprintf(c.dir, sizeof(c.dir), "%s/c%d", tp("pods/m"), i);
		AS_NOBODY(mk_dir, c.dir, "mkdir");
		w0 = stat_of("fuse_requests_write");
		AS_NOBODY(write_files, &c, "writing");
		relinked = stat_of("broker_relinks") >= 1;
		if (!relinked)
			usleep(100 * 1000);
	}
	cr_assert(relinked, "ferry-mountd never relinked to the restarted broker");
	cr_assert_eq(stat_of("broker_up"), 1);
	cr_assert_eq(stat_of("fuse_requests_write") - w0, 0, "passthrough did not come back");
	do_umount();
	do_mount();
	AS_NOBODY(check_files, &a, "reading");
	AS_NOBODY(check_files, &b, "reading");
	do_umount();
}

/* A PostgreSQL volume mounted through the broker, as a pod mounts one: the
 * node directory is nobody's ($FERRY_STATE_DIR), the mount holds the
 * writer's lease, passthrough is engaged, and every file is there after
 * the volume was unmounted and mounted again. */
Test(broker_e2e, a_postgresql_volume_mounts_through_the_broker)
{
	const char *base = getenv("FERRY_TEST_PG_URL");
	char url[700], storage[PATH_MAX + 8], log[PATH_MAX], sock[PATH_MAX], mp[PATH_MAX];
	struct job j = { .nfiles = 20, .big = 3u << 20, .seed = 7 };
	uint64_t w0;

	cr_assert(base && *base, "FERRY_TEST_PG_URL is not set: start a server with scripts/pg-server");
	snprintf(pg_schema, sizeof(pg_schema), "ferry_bke%d", (int)getpid());
	snprintf(url, sizeof(url), "%s&volume=%s", base, pg_schema + 6);
	snprintf(storage, sizeof(storage), "file://%s", tp("home/objects"));
	snprintf(log, sizeof(log), "%s/%s/ferry-mountd.log", tp("home/state"), pg_schema + 6);
	snprintf(j.dir, sizeof(j.dir), "%s", tp("pods/m"));
	mkdir_owned(tp("home/objects"), FM_NOBODY_UID, 0755);
	setenv("FERRY_STATE_DIR", tp("home/state"), 1);
	const char *fmt[] = { fm_bin("ferry"), "format", "--storage", storage, url, NULL };
	cr_assert_eq(run_nobody(fmt), 0, "ferry format of %s as nobody failed", url);
	/* Copies: tp()'s ring of names is reused by the calls below. */
	snprintf(sock, sizeof(sock), "%s", tp("broker.sock"));
	snprintf(mp, sizeof(mp), "%s", tp("pods/m"));
	const char *mnt[] = { fm_bin("ferry"), "mount", "--broker", sock, url, mp, NULL };
	mount_checked(mnt, log);
	cr_assert_eq(stat_of("passthrough_active"), 1, "passthrough is off under the broker");
	cr_assert_eq(stat_of("lease_epoch"), 1);
	cr_assert_eq(stat_of("follower"), 0);
	w0 = stat_of("fuse_requests_write");
	AS_NOBODY(write_files, &j, "writing");
	cr_assert_eq(stat_of("fuse_requests_write") - w0, 0,
		     "WRITE requests reached ferry-mountd: passthrough is not engaged");
	do_umount();
	mount_checked(mnt, log);
	cr_assert_eq(stat_of("lease_epoch"), 2, "the lease was not released at unmount");
	AS_NOBODY(check_files, &j, "reading back after remount");
	do_umount();
}

/* A writer of nobody's: opens path, writes len bytes of seed's pattern at
 * 0, says so on the pipe, waits for a byte, writes len more at len,
 * closes, and exits 0 (or 1 at the first failure). */
static pid_t held_writer(const char *path, size_t len, uint64_t seed, int *go_fd, int *ready_fd)
{
	int go[2], ready[2];
	pid_t pid;

	cr_assert(pipe(go) == 0 && pipe(ready) == 0);
	pid = fork();
	cr_assert(pid >= 0);
	if (pid == 0) {
		char c;
		uint64_t st = seed;
		unsigned char *buf = malloc(2 * len);
		close(go[1]);
		close(ready[0]);
		if (!buf || setgroups(0, NULL) ||
		    setresgid(FM_NOBODY_GID, FM_NOBODY_GID, FM_NOBODY_GID) ||
		    setresuid(FM_NOBODY_UID, FM_NOBODY_UID, FM_NOBODY_UID))
			_exit(1);
		fm_fill_random(&st, buf, 2 * len);
		int fd = open(path, O_CREAT | O_WRONLY, 0644);
		if (fd < 0 || pwrite(fd, buf, len, 0) != (ssize_t)len || write(ready[1], "x", 1) != 1)
			_exit(1);
		if (read(go[0], &c, 1) != 1)
			_exit(1);
		if (pwrite(fd, buf + len, len, (off_t)len) != (ssize_t)len)
			_exit(2);
		if (close(fd) < 0)
			_exit(3);
		_exit(0);
	}
	close(go[0]);
	close(ready[1]);
	*go_fd = go[1];
	*ready_fd = ready[0];
	return pid;
}

/* held_writer()'s file (seed 13) is whole: both halves. */
static long check_held(void *arg)
{
	size_t len = 2 * *(size_t *)arg, n = 0;
	uint64_t seed = 13;
	unsigned char *want = malloc(len), *got = malloc(len + 1);
	ssize_t r = 0;
	int fd = open(tp("pods/m/held"), O_RDONLY);

	if (!want || !got || fd < 0)
		return -1;
	fm_fill_random(&seed, want, len);
	while (n <= len && (r = read(fd, got + n, len + 1 - n)) > 0)
		n += (size_t)r;
	close(fd);
	long rc = r < 0 || n != len || memcmp(want, got, len) ? -1 : 0;
	if (rc) {
		FILE *f = fopen(tp("home/check.err"), "we");
		if (f) {
			fprintf(f, "held: read %zu bytes, want %zu", n, len);
			fclose(f);
		}
		errno = EIO;
	}
	free(want);
	free(got);
	return rc;
}

/* A reader of nobody's that reads path whole and compares it with job
 * seed's first file, exiting 0 when it matches. */
static pid_t reader_of(struct job *j)
{
	pid_t pid = fork();

	cr_assert(pid >= 0);
	if (pid == 0) {
		if (setgroups(0, NULL) || setresgid(FM_NOBODY_GID, FM_NOBODY_GID, FM_NOBODY_GID) ||
		    setresuid(FM_NOBODY_UID, FM_NOBODY_UID, FM_NOBODY_UID))
			_exit(1);
		_exit(check_files(j) == 0 ? 0 : 4);
	}
	return pid;
}

/* ferry-mountd dies (SIGKILL) under a live broker mount, with a reader
 * waiting in the mount and a writer holding a passthrough file open. The
 * broker still holds the FUSE connection; `ferry mount` again takes it
 * over: the reader gets its answer, the writer writes on and closes
 * without an error, and every byte is there after an unmount and mount. */
Test(broker_e2e, mountd_crash_then_a_new_daemon_takes_the_mount_over)
{
	struct job a = { .nfiles = 6, .big = 1u << 20, .seed = 11 };
	struct job b = { .nfiles = 4, .big = 4096, .seed = 12 };
	size_t hlen = 1u << 20;
	pid_t pids[4], rec[4];
	int go, ready, st;
	char c;

	snprintf(a.dir, sizeof(a.dir), "%s", tp("pods/m"));
	snprintf(b.dir, sizeof(b.dir), "%s", tp("pods/m/after"));
	do_mount();
	AS_NOBODY(write_files, &a, "writing");
	/* While its daemon lives, a second one may not take the mount. */
	{
		/* Another volume: the same one would stop at its lock. */
		char sock[PATH_MAX], stg[PATH_MAX], cache[PATH_MAX], vol[PATH_MAX], mnt[PATH_MAX];
		snprintf(sock, sizeof(sock), "%s", tp("broker.sock"));
		snprintf(stg, sizeof(stg), "%s", tp("home/staging2"));
		snprintf(cache, sizeof(cache), "%s", tp("home/cache2"));
		snprintf(vol, sizeof(vol), "%s", tp("home/vol2"));
		snprintf(mnt, sizeof(mnt), "%s", tp("pods/m"));
		const char *fmt[] = { fm_bin("ferry"), "format", vol, NULL };
		const char *again[] = { fm_bin("ferry"), "mount", "--broker", sock, "--staging-dir",
					stg, "--cache-dir", cache, vol, mnt, NULL };
		cr_assert_eq(run_nobody(fmt), 0);
		cr_assert_neq(run_nobody(again), 0, "a second ferry-mountd took a served mount");
		char *err = fm_slurp(tp("ferry.log.err"));
		cr_assert(err && strstr(err, "served by a live ferry-mountd"), "%s", err ? err : "");
		free(err);
	}
	pid_t writer = held_writer(tp("pods/m/held"), hlen, 13, &go, &ready);
	cr_assert_eq(read(ready, &c, 1), 1, "the held writer failed before the crash");

	cr_assert_eq(fm_daemon_pids_with("ferry-mountd", tp("pods/m"), pids, 4), 1);
	int nrec = fm_daemon_pids_with("ferry-reconciler", tp("home/staging"), rec, 4);
	/* Stopped first, so the reader's requests wait in the kernel. */
	cr_assert_eq(kill(pids[0], SIGSTOP), 0);
	pid_t reader = reader_of(&a);
	usleep(300 * 1000);
	cr_assert_eq(waitpid(reader, &st, WNOHANG), 0, "the reader did not wait for the daemon");
	kill(pids[0], SIGKILL);
	for (int k = 0; k < nrec; k++)
		kill(rec[k], SIGKILL);
	for (int t = 0; t < 500 && fm_daemon_pids_with("ferry-mountd", tp("pods/m"), pids, 4); t++)
		usleep(10000);
	cr_assert(mounted(), "the mount went with its daemon");

	do_mount(); /* takes the connection over */
	cr_assert_eq(stat_of("broker_reattached"), 1);
	cr_assert_eq(waitpid(reader, &st, 0), reader);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the waiting reader: status 0x%x %s", st,
		  check_err());
	cr_assert_eq(stat_of("staging_adopted"), 1, "the held file's staging file was not adopted");
	/* The writer's handle is the dead daemon's: its passthrough writes
	 * go on, into the staging file the new daemon adopted. */
	cr_assert_eq(write(go, "x", 1), 1);
	cr_assert_eq(waitpid(writer, &st, 0), writer);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the held writer: status 0x%x", st);
	close(go);
	close(ready);
	AS_NOBODY(mk_dir, (void *)tp("pods/m/after"), "mkdir after the takeover");
	AS_NOBODY(write_files, &b, "writing after the takeover");
	AS_NOBODY(check_files, &a, "reading after the takeover");

	/* Everything is in the volume: the held file once its last close let
	 * the adopted staging file go. */
	do_umount();
	do_mount();
	AS_NOBODY(check_files, &a, "reading after a remount");
	AS_NOBODY(check_files, &b, "reading after a remount");
	AS_NOBODY(check_held, &hlen, "reading the held file after a remount");
	do_umount();
}

/* ferry-mountd dies, and then ferry-brokerd restarts: nothing holds the
 * FUSE connection any more, so the kernel ended it and the mount is dead
 * (ENOTCONN). `ferry mount` again has the broker unmount it and mounts
 * anew, with no `ferry umount --broker` by hand; what the dead daemon
 * staged is recovered as after any crash. */
Test(broker_e2e, daemon_and_broker_gone_then_ferry_mount_mounts_again)
{
	struct job a = { .nfiles = 6, .big = 1u << 20, .seed = 21 };
	pid_t pids[4], rec[4];

	snprintf(a.dir, sizeof(a.dir), "%s", tp("pods/m"));
	do_mount();
	AS_NOBODY(write_files, &a, "writing");
	cr_assert_eq(fm_daemon_pids_with("ferry-mountd", tp("pods/m"), pids, 4), 1);
	int nrec = fm_daemon_pids_with("ferry-reconciler", tp("home/staging"), rec, 4);
	kill(pids[0], SIGKILL);
	for (int k = 0; k < nrec; k++)
		kill(rec[k], SIGKILL);
	for (int t = 0; t < 500 && fm_daemon_pids_with("ferry-mountd", tp("pods/m"), pids, 4); t++)
		usleep(10000);
	brokerd_kill(SIGKILL);
	brokerd_start();
	cr_assert(mounted(), "the dead mount went by itself");
	do_mount();
	cr_assert_eq(stat_of("broker_reattached"), 0);
	AS_NOBODY(check_files, &a, "reading after mounting again");
	do_umount();
}
