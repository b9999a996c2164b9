/*
 * -o io_uring (mountd/main.c uring_choose, mountd/fuse_ops.c
 * uring_offered): requests served over FUSE-over-io_uring on a direct
 * mount, the fallback to /dev/fuse where the kernel does not offer it
 * (auto) or the refusal to mount (on), and what a mount on the ring
 * cannot do (be handed over).
 *
 * The kernel offers the ring only while the fuse module's enable_uring
 * parameter is set, a setting of the whole machine: each test holds an
 * exclusive lock on it while it runs and puts back what it found.
 */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mount_util.h"

#define URING_PARAM "/sys/module/fuse/parameters/enable_uring"
#define URING_LOCK "/tmp/ferry-it-enable-uring.lock"

static int param_lock = -1;
static char param_was = 0;

/* Takes the lock and sets the parameter to on (1) or off (0). */
static void param_set(int on)
{
	char c;
	int fd;

	if (access(URING_PARAM, F_OK) != 0)
		cr_skip_test("this kernel has no FUSE-over-io_uring (%s is missing; Linux >= 6.14)",
			     URING_PARAM);
	if (param_lock < 0) {
		param_lock = open(URING_LOCK, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
		cr_assert(param_lock >= 0, "%s: %s", URING_LOCK, strerror(errno));
		cr_assert(flock(param_lock, LOCK_EX) == 0);
		fd = open(URING_PARAM, O_RDONLY | O_CLOEXEC);
		cr_assert(fd >= 0 && read(fd, &param_was, 1) == 1, "%s: %s", URING_PARAM,
			  strerror(errno));
		close(fd);
	}
	fd = open(URING_PARAM, O_WRONLY | O_CLOEXEC);
	cr_assert(fd >= 0, "%s: %s", URING_PARAM, strerror(errno));
	cr_assert(write(fd, on ? "Y" : "N", 1) == 1, "writing %s: %s", URING_PARAM,
		  strerror(errno));
	close(fd);
	fd = open(URING_PARAM, O_RDONLY | O_CLOEXEC);
	cr_assert(fd >= 0 && read(fd, &c, 1) == 1);
	close(fd);
	cr_assert_eq(c, on ? 'Y' : 'N', "%s reads %c after writing it", URING_PARAM, c);
}

static void uring_teardown(void)
{
	fm_teardown();
	unsetenv("FERRY_IT_MOUNT_OPTIONS");
	if (param_lock >= 0) {
		int fd = open(URING_PARAM, O_WRONLY | O_CLOEXEC);

		if (fd >= 0) {
			if (write(fd, &param_was, 1) != 1)
				cr_log_warn("cannot put %s back to %c", URING_PARAM, param_was);
			close(fd);
		}
		close(param_lock); /* the lock with it */
		param_lock = -1;
	}
}

TestSuite(io_uring, .fini = uring_teardown, .timeout = 240);

static char *stats_text(void)
{
	char *t = fm_slurp(mp(".stats"));

	cr_assert(t, "cannot read .stats");
	return t;
}

static void expect_line(const char *text, const char *line)
{
	cr_assert(strstr(text, line), "no line '%.*s' in .stats:\n%s", (int)strcspn(line, "\n"),
		  line, text);
}

/* A mount with only `opts` (besides the fixture's own): ferry mount's exit
 * status, its stderr in *err (malloc'd). */
static int mount_with(const char *opts, char **err)
{
	char o[256];
	const char *argv[] = { fm_bin("ferry"), "mount", "--cache-dir", fm.cache, "-o", o,
			       fm.vol, fm.mnt, NULL };
	int rc;

	snprintf(o, sizeof(o), "allow_other,%s", opts);
	rc = fm_run(argv, NULL, sp("mount.err"), 60);
	*err = fm_slurp(sp("mount.err"));
	return rc;
}

static void write_some(const char *dir, int n)
{
	char name[64], body[64];

	cr_assert(mkdir(mp("%s", dir), 0755) == 0, "mkdir %s: %s", dir, strerror(errno));
	for (int i = 0; i < n; i++) {
		snprintf(name, sizeof(name), "%s/f%03d", dir, i);
		snprintf(body, sizeof(body), "file %d of %s\n", i, dir);
		fm_write_file(mp("%s", name), body, strlen(body));
	}
	/* a rename and an unlink, then an fsync that forces the batch out */
	cr_assert(rename(mp("%s/f000", dir), mp("%s/renamed", dir)) == 0);
	cr_assert(unlink(mp("%s/f001", dir)) == 0);
	int fd = open(mp("%s/f002", dir), O_RDWR);
	cr_assert(fd >= 0);
	cr_assert(fsync(fd) == 0, "fsync: %s", strerror(errno));
	close(fd);
}

static void check_some(const char *dir, int n)
{
	char name[64], body[64];
	struct stat st;

	for (int i = 2; i < n; i++) {
		snprintf(name, sizeof(name), "%s/f%03d", dir, i);
		snprintf(body, sizeof(body), "file %d of %s\n", i, dir);
		fm_expect_content(mp("%s", name), body, strlen(body));
	}
	snprintf(body, sizeof(body), "file 0 of %s\n", dir);
	fm_expect_content(mp("%s/renamed", dir), body, strlen(body));
	cr_assert(stat(mp("%s/f001", dir), &st) < 0 && errno == ENOENT, "%s/f001 is back", dir);
}

Test(io_uring, requests_are_served_over_the_ring)
{
	char *t;
	uint64_t creates, ring;

	param_set(1);
	/* Not asked for: off, whatever the kernel offers. */
	fm_setup();
	t = stats_text();
	expect_line(t, "io_uring 0\n");
	expect_line(t, "io_uring_off_reason mount_option_off\n");
	free(t);
	fm_umount();

	setenv("FERRY_IT_MOUNT_OPTIONS", "io_uring=on", 1);
	fm_mount();
	write_some("d", 100);
	check_some("d", 100);
	t = stats_text();
	expect_line(t, "io_uring 1\n");
	expect_line(t, "io_uring_off_reason -\n");
	free(t);
	creates = fm_stat("fuse_requests_create");
	ring = fm_stat("io_uring_requests");
	cr_assert_geq(creates, 100);
	/* Every request but INIT, FORGET and INTERRUPT comes over the ring. */
	cr_assert_geq(ring, creates, "%llu requests over the ring, %llu creates alone",
		      (unsigned long long)ring, (unsigned long long)creates);
	cr_log_info("%llu requests over io_uring", (unsigned long long)ring);

	/* What it wrote is there after a remount, and a cold read is served
	 * over the ring too. */
	fm_remount_cold();
	check_some("d", 100);
	cr_assert_gt(fm_stat("io_uring_requests"), 0);
}

Test(io_uring, auto_falls_back_where_the_kernel_does_not_offer_it)
{
	char *t, *err = NULL;

	param_set(0);
	fm_setup_opts(&(struct fm_opts){ .no_mount = true });
	cr_assert_neq(mount_with("io_uring=on", &err), 0, "io_uring=on mounted without the ring");
	cr_assert(err && strstr(err, "does not offer FUSE-over-io_uring"),
		  "no reason given: %s", err ? err : "");
	cr_assert(!fm_is_mounted(fm.mnt), "left mounted after a refused start");
	free(err);

	setenv("FERRY_IT_MOUNT_OPTIONS", "io_uring=auto", 1);
	fm_mount();
	write_some("d", 20);
	check_some("d", 20);
	t = stats_text();
	expect_line(t, "io_uring 0\n");
	expect_line(t, "io_uring_off_reason kernel_lacks_io_uring\n");
	expect_line(t, "io_uring_requests 0\n");
	free(t);
}

Test(io_uring, a_mount_on_the_ring_is_not_handed_over)
{
	static const char data[] = "written before the refused upgrade";
	const char *argv[] = { fm_bin("ferry"), "mount", "--upgrade", fm.mnt, NULL };
	char buf[sizeof(data)];
	char *err;
	pid_t pid;
	int fd, rc;

	param_set(1);
	setenv("FERRY_IT_MOUNT_OPTIONS", "io_uring=on", 1);
	fm_setup();
	pid = (pid_t)fm_stat("pid");
	fd = open(mp("held"), O_CREAT | O_RDWR, 0644);
	cr_assert(fd >= 0);
	fm_pwrite_all(fd, data, sizeof(data), 0);

	rc = fm_run(argv, NULL, sp("upgrade.err"), 60);
	err = fm_slurp(sp("upgrade.err"));
	cr_assert(rc != 0 && err && strstr(err, "refused the hand-over"),
		  "ferry mount --upgrade of a mount on the ring: exit %d: %s", rc, err ? err : "");
	cr_log_info("ferry mount --upgrade: exit %d: %s", rc, err ? err : "");
	free(err);

	/* Same daemon, still serving: the open file and new ones. */
	cr_assert_eq((pid_t)fm_stat("pid"), pid);
	fm_pread_all(fd, buf, sizeof(buf), 0);
	cr_assert(memcmp(buf, data, sizeof(data)) == 0);
	cr_assert(close(fd) == 0);
	fm_write_file(mp("after"), data, sizeof(data));
	fm_expect_content(mp("after"), data, sizeof(data));
	cr_assert_eq(fm_stat("io_uring"), 1);
}
