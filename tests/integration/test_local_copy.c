/*
 * Local copies through a real mount: the staging file of a passthrough
 * writer's close (1 MiB or larger) is kept, once its job is committed, as
 * ".kept-<pid>-<serial>" in the staging directory; read-only opens get
 * FUSE passthrough on it (.stats local_copy_opens), a writer's open or a
 * truncate while readers share it takes it over as the staging file
 * (local_copy_takeovers) and the readers go on reading the new bytes,
 * -o local_copies bounds the bytes kept (local_copy_bytes, dropped,
 * skipped; 0 keeps none), a clean unmount leaves the current copies for
 * the next mount, which takes up those whose file has not changed, and
 * those a killed daemon left are removed by the next start. Every file is read back right, after
 * a remount with an empty read cache where it matters.
 */
#include "mount_util.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define KiB (1024L)
#define MiB (1024L * 1024)

/* The run's own FERRY_IT_MOUNT_OPTIONS, before this suite's. */
static char run_extra[256];

/* Every mount of this suite keeps copies under a limit of its own (1g, not
 * a quarter of whatever holds the test's directory), ahead of the options
 * a test or the run adds, which win. */
static void local_copy_setup(void)
{
	const char *extra = getenv("FERRY_IT_MOUNT_OPTIONS");
	char opts[512];

	snprintf(run_extra, sizeof(run_extra), "%s", extra ? extra : "");
	snprintf(opts, sizeof(opts), "local_copies=1g%s%s", extra && *extra ? "," : "",
		 extra ? extra : "");
	setenv("FERRY_IT_MOUNT_OPTIONS", opts, 1);
	fm_setup();
}

TestSuite(local_copy, .init = local_copy_setup, .fini = fm_teardown, .timeout = 120);

static void copies_go_over(void (*restart)(void), const char *taken_up);

static const char *staging_dir(void)
{
	return fm_staging_dir();
}

/* How many local copies (".kept-*") the staging directory holds. */
static int kept_files(void)
{
	DIR *d = opendir(staging_dir());
	struct dirent *e;
	int n = 0;

	cr_assert(d, "%s: %s", staging_dir(), strerror(errno));
	while ((e = readdir(d)))
		n += strncmp(e->d_name, ".kept-", 6) == 0;
	closedir(d);
	return n;
}

/* Passthrough must work here for local copies to exist; a run of the
 * suite with passthrough turned off (FERRY_IT_MOUNT_OPTIONS) skips. */
static void need_passthrough(void)
{
	const char *extra = getenv("FERRY_IT_MOUNT_OPTIONS");

	if (extra && strstr(extra, "passthrough=off"))
		cr_skip_test("passthrough is off for this mount (FERRY_IT_MOUNT_OPTIONS)");
	cr_assert_eq(fm_stat("passthrough_active"), 1, "passthrough is not active on this kernel");
}

static unsigned char *pattern(size_t len, uint64_t seed)
{
	unsigned char *d = malloc(len ? len : 1);

	cr_assert(d);
	fm_fill_random(&seed, d, len);
	return d;
}

/* ferry drain of the mount, once every close has reached the daemon
 * (held: files of the mount the caller still has open). */
static void drain(int held)
{
	const char *argv[] = { fm_bin("ferry"), "drain", "--timeout", "60", fm.mnt, NULL };
	int rc;

	fm_wait_released(held);
	rc = fm_run(argv, NULL, NULL, 90);
	cr_assert_eq(rc, 0, "ferry drain %s: exit %d (see %s)", fm.mnt, rc, fm.log);
}

/* Compares what fd reads at [0, len) with want, naming the first wrong
 * byte. */
static void expect_fd(int fd, const unsigned char *want, size_t len, const char *what)
{
	unsigned char *got = malloc(len + 1);
	ssize_t n;

	cr_assert(got);
	fm_pread_all(fd, got, len, 0);
	if (memcmp(got, want, len) != 0) {
		size_t k = 0;

		while (got[k] == want[k])
			k++;
		cr_assert_fail("%s: wrong byte at %zu: %#x, not %#x", what, k, got[k], want[k]);
	}
	n = pread(fd, got, 1, (off_t)len);
	cr_assert_eq(n, 0, "%s: read past %zu bytes returned %zd", what, len, n);
	free(got);
}

/* expect_fd() of a file open in passthrough mode on its copy: the kernel
 * reads the copy itself, so no READ reaches the daemon. Reads of .stats
 * are READs too: what one costs, then what the file's read costs besides. */
static void expect_fd_unread(int fd, const unsigned char *want, size_t len, const char *what)
{
	uint64_t reads0 = fm_stat("fuse_requests_read");
	uint64_t per_stats = fm_stat("fuse_requests_read") - reads0, reads;

	reads0 = fm_stat("fuse_requests_read");
	expect_fd(fd, want, len, what);
	reads = fm_stat("fuse_requests_read") - reads0;
	cr_assert_leq(reads, per_stats, "%s: %llu READs reached the daemon (a .stats read makes "
		      "%llu)", what, (unsigned long long)reads, (unsigned long long)per_stats);
}

/* Waits (at most 60 s) until local_copies_built reaches n. */
static void wait_built(uint64_t n)
{
	for (int t = 0; t < 1200 && fm_stat("local_copies_built") < n; t++)
		usleep(50 * 1000);
	cr_assert_geq(fm_stat("local_copies_built"), n, "local_copies_built %llu, not %llu, 60 s on",
		      (unsigned long long)fm_stat("local_copies_built"), (unsigned long long)n);
}

/* Writes a new file of len bytes through one passthrough open and closes
 * it. */
static void write_new(const char *name, const unsigned char *buf, size_t len)
{
	uint64_t w0 = fm_stat("fuse_requests_write");

	fm_write_file(mp("%s", name), buf, len);
	cr_assert_eq(fm_stat("fuse_requests_write"), w0, "%s: writes took the daemon path",
		     name);
}

/* Opens name read-only, which must get its local copy. */
static int open_copy(const char *name)
{
	uint64_t opens0 = fm_stat("local_copy_opens");
	int fd = OK(open(mp("%s", name), O_RDONLY));

	cr_assert_eq(fm_stat("local_copy_opens"), opens0 + 1, "%s: the reader got no local copy",
		     name);
	return fd;
}

Test(local_copy, a_committed_file_is_read_through_its_local_copy)
{
	const size_t len = 4 * MiB;
	unsigned char *data = pattern(len, 0x10ca1c0b1);
	uint64_t made0;
	int fd;

	need_passthrough();
	cr_assert_eq(kept_files(), 0);
	made0 = fm_stat("local_copies_made");
	write_new("f", data, len);
	drain(0);
	cr_assert_eq(fm_stat("local_copies_made"), made0 + 1, "no local copy was made");
	cr_assert_eq(kept_files(), 1, "%d .kept- files in %s, not 1", kept_files(), staging_dir());
	cr_assert_eq(fm_stat("local_copy_bytes"), len);

	fd = open_copy("f");
	expect_fd_unread(fd, data, len, "f through its local copy");
	OK(close(fd));
	fm_wait_released(0);
	cr_assert_eq(kept_files(), 1, "the copy went with its reader's close");

	/* The copy outlives the mount; a cold remount forgets it. */
	fm_umount();
	cr_assert_eq(kept_files(), 1, "the unmount removed the local copy");
	fm_remount_cold();
	cr_assert_eq(kept_files(), 0, "a cold remount kept the local copy");
	fm_expect_content(mp("f"), data, len);
	free(data);
}

/* The staging directory's list of the copies the last clean unmount left
 * (".local-copies-<uuid>"): its path, or NULL if there is none. */
static const char *saved_list(void)
{
	static char path[PATH_MAX];
	DIR *d = opendir(staging_dir());
	struct dirent *e;
	bool found = false;

	cr_assert(d, "%s: %s", staging_dir(), strerror(errno));
	while (!found && (e = readdir(d)))
		if (strncmp(e->d_name, ".local-copies-", 14) == 0 && !strstr(e->d_name, ".tmp")) {
			int n = snprintf(path, sizeof(path), "%s/%s", staging_dir(), e->d_name);

			cr_assert(n > 0 && (size_t)n < sizeof(path));
			found = true;
		}
	closedir(d);
	return found ? path : NULL;
}

/* Unmount and mount again: the current copies are kept across (listed),
 * and the list goes with the start that takes them up. */
static void unmount_and_mount(void)
{
	fm_umount();
	cr_assert_eq(kept_files(), 2, "%d copies after the unmount", kept_files());
	cr_assert(saved_list(), "no list of the copies in %s", staging_dir());
	fm_mount();
	cr_assert_null(saved_list(), "the list outlived the start that took it up");
}

Test(local_copy, copies_outlive_an_unmount)
{
	copies_go_over(unmount_and_mount, "local_copies_restored");
}

/* Changed while this staging directory's mount was down (here by a mount
 * with another staging directory, to the same size and mtime): the copy is
 * not the file any more, and the next mount here must not serve it. */
Test(local_copy, a_file_changed_between_mounts_loses_its_copy)
{
	const size_t len = 2 * MiB;
	unsigned char *old = pattern(len, 0x01d), *new = pattern(len, 0x2e3);
	char here[PATH_MAX];
	struct stat st, again;
	int fd;

	need_passthrough();
	write_new("f", old, len);
	drain(0);
	fm_umount();
	cr_assert_eq(kept_files(), 1);
	cr_assert(saved_list());

	snprintf(here, sizeof(here), "%s", fm.staging);
	snprintf(fm.staging, sizeof(fm.staging), "%s", sp("other-staging"));
	OK(mkdir(fm.staging, 0700));
	fm_mount();
	OK(stat(mp("f"), &st));
	fd = OK(open(mp("f"), O_WRONLY));
	fm_pwrite_all(fd, new, len, 0);
	/* As `cp -p` does: the old mtime back, so the commit's ctime (the
	 * job's mtime) is what the list has too; only the data differs. */
	OK(futimens(fd, (struct timespec[2]){ st.st_atim, st.st_mtim }));
	OK(close(fd));
	drain(0);
	OK(stat(mp("f"), &again));
	cr_assert(again.st_ctim.tv_sec == st.st_ctim.tv_sec &&
		  again.st_ctim.tv_nsec == st.st_ctim.tv_nsec && again.st_size == st.st_size,
		  "the change moved the file's ctime or size: the test would not test the data");
	fm_umount();
	snprintf(fm.staging, sizeof(fm.staging), "%s", here);

	fm_mount();
	cr_assert_eq(fm_stat("local_copies_restored"), 0, "a stale copy was taken up");
	cr_assert_eq(kept_files(), 0, "the stale copy was not removed");
	cr_assert_null(saved_list());
	fm_expect_content(mp("f"), new, len);
	free(old);
	free(new);
}

/* The list the last unmount left, read whole into a NUL-terminated buffer
 * (the caller's, at most cap bytes). */
static void saved_list_read(char *buf, size_t cap)
{
	const char *list = saved_list();
	FILE *f;
	size_t n;

	cr_assert(list, "no list of the copies in %s", staging_dir());
	f = fopen(list, "r");
	cr_assert(f, "%s: %s", list, strerror(errno));
	n = fread(buf, 1, cap - 1, f);
	buf[n] = '\0';
	fclose(f);
}

/* A list changed by edit (which rewrites text, the real list of one copy
 * of f, in place) is ignored as a whole at the next mount: the copy it
 * names goes, and the file reads right. The real list names the real copy,
 * so a list that were not ignored would have it taken up. */
static void changed_list(void (*edit)(char *text, size_t cap))
{
	const size_t len = 2 * MiB;
	unsigned char *data = pattern(len, 0xbad);
	char text[4096], victim[PATH_MAX];
	FILE *f;

	need_passthrough();
	write_new("f", data, len);
	drain(0);
	fm_umount();
	saved_list_read(text, sizeof(text));
	/* What a name that escaped the check would remove. */
	snprintf(victim, sizeof(victim), "%s/victim", fm.dir);
	fm_write_file(victim, (const unsigned char *)"v", 1);
	edit(text, sizeof(text));
	f = fopen(saved_list(), "w");
	cr_assert(f);
	cr_assert_eq(fputs(text, f) >= 0, true);
	fclose(f);

	fm_mount();
	cr_assert_eq(fm_stat("local_copies_restored"), 0, "a changed list was taken up");
	cr_assert_eq(kept_files(), 0, "the copies of an ignored list stayed");
	cr_assert_null(saved_list(), "the ignored list stayed");
	cr_assert_eq(access(victim, F_OK), 0, "a name in the list reached out of the staging "
		     "directory");
	fm_expect_content(mp("f"), data, len);
	free(data);
}

/* The list as written, unchanged: taken up (what the others differ from). */
static void edit_nothing(char *text, size_t cap)
{
	(void)text;
	(void)cap;
}

Test(local_copy, an_unchanged_list_is_taken_up, .description = "the baseline of the list tests")
{
	const size_t len = 2 * MiB;
	unsigned char *data = pattern(len, 0xbad);
	char text[4096];

	need_passthrough();
	write_new("f", data, len);
	drain(0);
	fm_umount();
	saved_list_read(text, sizeof(text));
	edit_nothing(text, sizeof(text));
	fm_mount();
	cr_assert_eq(fm_stat("local_copies_restored"), 1);
	fm_expect_content(mp("f"), data, len);
	free(data);
}

static void edit_other_volume(char *text, size_t cap)
{
	char *uuid = strstr(text, "ferry-local-copies 1 ");

	(void)cap;
	cr_assert(uuid);
	uuid += strlen("ferry-local-copies 1 ");
	uuid[0] = uuid[0] == '0' ? '1' : '0';
}

static void edit_name_outside(char *text, size_t cap)
{
	char *name = strstr(text, ".kept-");

	cr_assert(name);
	snprintf(name, cap - (size_t)(name - text), "../../victim\n");
}

static void edit_a_field(char *text, size_t cap)
{
	char *line = strchr(text, '\n');

	(void)cap;
	cr_assert(line);
	line[1] = 'x'; /* the inode number's first digit */
}

static void edit_cut_short(char *text, size_t cap)
{
	(void)cap;
	text[strlen(text) - 4] = '\0'; /* mid-name, no newline */
}

Test(local_copy, a_list_of_another_volume_is_ignored)
{
	changed_list(edit_other_volume);
}

Test(local_copy, a_list_naming_a_path_outside_is_ignored)
{
	changed_list(edit_name_outside);
}

Test(local_copy, a_damaged_list_of_copies_is_ignored)
{
	changed_list(edit_a_field);
}

Test(local_copy, a_truncated_list_of_copies_is_ignored)
{
	changed_list(edit_cut_short);
}

/* A copy changed behind the daemon's back while it was down (its file's
 * inode or mtime moved): not taken up. */
Test(local_copy, a_copy_changed_while_unmounted_is_not_taken_up)
{
	const size_t len = 2 * MiB;
	unsigned char *data = pattern(len, 0xc0c0);
	char text[4096], path[PATH_MAX], *name, *end;
	int fd;

	need_passthrough();
	write_new("f", data, len);
	drain(0);
	fm_umount();
	saved_list_read(text, sizeof(text));
	name = strstr(text, ".kept-");
	cr_assert(name);
	end = strchr(name, '\n');
	cr_assert(end);
	*end = '\0';
	cr_assert_lt((size_t)snprintf(path, sizeof(path), "%s/%s", staging_dir(), name),
		     sizeof(path));
	fd = OK(open(path, O_WRONLY));
	fm_pwrite_all(fd, "tampered", 8, 0);
	OK(close(fd));

	fm_mount();
	cr_assert_eq(fm_stat("local_copies_restored"), 0, "a copy changed meanwhile was taken up");
	cr_assert_eq(kept_files(), 0);
	fm_expect_content(mp("f"), data, len);
	free(data);
}

Test(local_copy, local_copies_0_removes_the_copies_the_last_mount_left)
{
	const size_t len = 2 * MiB;
	unsigned char *data = pattern(len, 0x1e0);

	need_passthrough();
	write_new("f", data, len);
	drain(0);
	fm_umount();
	cr_assert_eq(kept_files(), 1);
	fm_mount_with("local_copies=0");
	cr_assert_eq(fm_stat("local_copies_restored"), 0);
	cr_assert_eq(kept_files(), 0, "local_copies=0 kept the last mount's copy");
	cr_assert_null(saved_list());
	fm_expect_content(mp("f"), data, len);
	free(data);
}

Test(local_copy, a_writer_takes_over_the_copy_its_reader_shares)
{
	const size_t len = 4 * MiB, app = 123457;
	unsigned char *data = pattern(len, 0xa11), *more = pattern(app, 0xa12);
	unsigned char *all = malloc(len + app);
	uint64_t opens0, take0, copy0;
	struct stat st;
	int r, w;

	need_passthrough();
	cr_assert(all);
	memcpy(all, data, len);
	memcpy(all + len, more, app);
	write_new("f", data, len);
	drain(0);
	cr_assert_eq(kept_files(), 1);

	opens0 = fm_stat("local_copy_opens");
	take0 = fm_stat("local_copy_takeovers");
	copy0 = fm_stat("copy_ups");
	r = OK(open(mp("f"), O_RDONLY));
	cr_assert_eq(fm_stat("local_copy_opens"), opens0 + 1, "the reader got no local copy");
	expect_fd(r, data, len, "f before the append");

	w = OK(open(mp("f"), O_WRONLY | O_APPEND));
	cr_assert_eq(fm_stat("local_copy_takeovers"), take0 + 1,
		     "the writer did not take the copy over");
	cr_assert_eq(fm_stat("copy_ups"), copy0, "the writer's open copied the file in");
	cr_assert_eq(OK(write(w, more, app)), (ssize_t)app);
	/* The reader shares the staging file the copy became. */
	OK(fstat(r, &st));
	cr_assert_eq((size_t)st.st_size, len + app, "the reader's fstat shows %lld bytes",
		     (long long)st.st_size);
	expect_fd(r, all, len + app, "f through the reader's fd after the append");
	OK(close(w));
	expect_fd(r, all, len + app, "f through the reader's fd after the writer's close");
	OK(close(r));

	drain(0);
	fm_remount_cold();
	fm_expect_content(mp("f"), all, len + app);
	free(data);
	free(more);
	free(all);
}

Test(local_copy, a_truncate_while_a_reader_shares_the_copy)
{
	const size_t len = 4 * MiB, cut = 1500001;
	unsigned char *data = pattern(len, 0x7c7);
	uint64_t opens0, take0;
	struct stat st;
	int r;

	need_passthrough();
	write_new("f", data, len);
	drain(0);
	cr_assert_eq(kept_files(), 1);

	opens0 = fm_stat("local_copy_opens");
	take0 = fm_stat("local_copy_takeovers");
	r = OK(open(mp("f"), O_RDONLY));
	cr_assert_eq(fm_stat("local_copy_opens"), opens0 + 1, "the reader got no local copy");
	expect_fd(r, data, len, "f before the truncate");

	OK(truncate(mp("f"), (off_t)cut));
	cr_assert_eq(fm_stat("local_copy_takeovers"), take0 + 1,
		     "the truncate did not take the shared copy over");
	OK(fstat(r, &st));
	cr_assert_eq((size_t)st.st_size, cut, "the reader's fstat shows %lld bytes, not %zu",
		     (long long)st.st_size, cut);
	expect_fd(r, data, cut, "f through the reader's fd after the truncate");
	OK(stat(mp("f"), &st));
	cr_assert_eq((size_t)st.st_size, cut, "stat shows %lld bytes, not %zu",
		     (long long)st.st_size, cut);
	OK(close(r));

	drain(0);
	fm_remount_cold();
	fm_expect_content(mp("f"), data, cut);
	free(data);
}

Test(local_copy, local_copies_0_keeps_none)
{
	const size_t len = 4 * MiB;
	unsigned char *data = pattern(len, 0x0);
	int fd;

	need_passthrough();
	fm_umount();
	fm_mount_with("local_copies=0");
	write_new("f", data, len);
	drain(0);
	cr_assert_eq(kept_files(), 0, "local_copies=0 kept %d copies", kept_files());
	fd = OK(open(mp("f"), O_RDONLY));
	expect_fd(fd, data, len, "f with local_copies=0");
	OK(close(fd));
	fm_expect_content(mp("f"), data, len);
	cr_assert_eq(fm_stat("local_copy_opens"), 0);
	cr_assert_eq(fm_stat("local_copies_made"), 0);
	cr_assert_eq(fm_stat("local_copy_bytes"), 0);
	cr_assert_eq(kept_files(), 0);
	fm_remount_cold();
	fm_expect_content(mp("f"), data, len);
	free(data);
}

Test(local_copy, the_budget_holds_one_copy_of_two)
{
	const size_t len = 2 * MiB;
	unsigned char *a = pattern(len, 0xaaaa), *b = pattern(len, 0xbbbb);
	uint64_t gone0, bytes;
	int fd;

	need_passthrough();
	fm_umount();
	fm_mount_with("local_copies=3m");
	gone0 = fm_stat("local_copies_dropped") + fm_stat("local_copies_skipped");

	write_new("a", a, len);
	drain(0);
	cr_assert_eq(kept_files(), 1, "a: %d copies", kept_files());
	cr_assert_eq(fm_stat("local_copy_bytes"), len);

	write_new("b", b, len);
	drain(0);
	cr_assert_eq(kept_files(), 1, "%d copies under a 3 MiB budget of 2 MiB files",
		     kept_files());
	bytes = fm_stat("local_copy_bytes");
	cr_assert_leq(bytes, 3 * MiB, "local_copy_bytes %llu over the budget",
		      (unsigned long long)bytes);
	cr_assert_eq(bytes, len, "local_copy_bytes %llu with one 2 MiB copy",
		     (unsigned long long)bytes);
	cr_assert_gt(fm_stat("local_copies_dropped") + fm_stat("local_copies_skipped"), gone0,
		     "neither dropped nor skipped a copy");

	fd = OK(open(mp("a"), O_RDONLY));
	expect_fd(fd, a, len, "a");
	OK(close(fd));
	fd = OK(open(mp("b"), O_RDONLY));
	expect_fd(fd, b, len, "b");
	OK(close(fd));
	fm_wait_released(0);
	cr_assert_leq(fm_stat("local_copy_bytes"), 3 * MiB);
	cr_assert_leq(kept_files(), 1);
	fm_remount_cold();
	fm_expect_content(mp("a"), a, len);
	fm_expect_content(mp("b"), b, len);
	free(a);
	free(b);
}

/* A copy being read is not evicted for another: the new one is skipped. */
Test(local_copy, a_copy_being_read_is_not_evicted)
{
	const size_t len = 2 * MiB;
	unsigned char *a = pattern(len, 0xa0a0), *b = pattern(len, 0xb0b0);
	uint64_t opens0, skipped0, dropped0;
	int r, fd;

	need_passthrough();
	fm_umount();
	fm_mount_with("local_copies=3m");
	write_new("a", a, len);
	drain(0);
	cr_assert_eq(kept_files(), 1);
	r = open_copy("a");

	skipped0 = fm_stat("local_copies_skipped");
	dropped0 = fm_stat("local_copies_dropped");
	write_new("b", b, len);
	drain(1);
	cr_assert_eq(fm_stat("local_copies_skipped"), skipped0 + 1, "b's copy was not skipped");
	cr_assert_eq(fm_stat("local_copies_dropped"), dropped0, "a copy was dropped");
	cr_assert_eq(kept_files(), 1);
	cr_assert_eq(fm_stat("local_copy_bytes"), len);
	expect_fd(r, a, len, "a through its copy, after b's close");
	OK(close(r));

	/* b has no copy: its reader takes the usual path. */
	opens0 = fm_stat("local_copy_opens");
	fd = OK(open(mp("b"), O_RDONLY));
	cr_assert_eq(fm_stat("local_copy_opens"), opens0, "b's reader got a copy");
	expect_fd(fd, b, len, "b");
	OK(close(fd));
	fm_remount_cold();
	fm_expect_content(mp("a"), a, len);
	fm_expect_content(mp("b"), b, len);
	free(a);
	free(b);
}

/* Both daemons killed, the reconciler first (stopped, so ferry-mountd
 * cannot start another before it dies), as test_crash.c does. */
static void kill_both(void)
{
	pid_t rec = fm_reconciler_pid(), pids[4];

	kill(rec, SIGSTOP);
	fm_crash();
	kill(rec, SIGKILL);
	for (int t = 0; t < 500 && fm_daemon_pids("ferry-reconciler", pids, 4) > 0; t++)
		usleep(10000);
	cr_assert_eq(fm_daemon_pids("ferry-reconciler", pids, 4), 0, "a reconciler survived");
}

Test(local_copy, a_killed_daemons_copies_are_removed_at_start)
{
	const size_t len = 4 * MiB;
	unsigned char *data = pattern(len, 0xdead);
	uint64_t opens0;
	int fd;

	need_passthrough();
	write_new("f", data, len);
	drain(0);
	cr_assert_eq(kept_files(), 1);
	fd = open_copy("f");
	OK(close(fd));
	fm_wait_released(0);

	kill_both();
	cr_assert_eq(kept_files(), 1, "the killed daemon's copy is already gone");
	fm_mount();
	cr_assert_eq(kept_files(), 0, "the start left a dead daemon's local copy");
	/* No copy of an earlier run is used: this read takes the usual path
	 * (and, having read the file whole, has one built anew). */
	cr_assert_eq(fm_stat("local_copy_bytes"), 0);
	opens0 = fm_stat("local_copy_opens");
	fm_expect_content(mp("f"), data, len);
	cr_assert_eq(fm_stat("local_copy_opens"), opens0);
	fm_remount_cold();
	fm_expect_content(mp("f"), data, len);
	free(data);
}

/* A write into a copy taken over returned: it survives both daemons being
 * killed, and the rest of the file is what was committed, not zeros. */
Test(local_copy, a_write_into_a_taken_over_copy_survives_the_daemons)
{
	const size_t len = 2 * MiB;
	unsigned char *data = pattern(len, 0x7a7a);
	uint64_t took0;
	int fd;

	need_passthrough();
	write_new("f", data, len);
	drain(0);
	cr_assert_eq(kept_files(), 1);
	took0 = fm_stat("local_copy_takeovers");
	fd = OK(open(mp("f"), O_RDWR));
	cr_assert_eq(fm_stat("local_copy_takeovers"), took0 + 1, "the writer made no takeover");
	fm_pwrite_all(fd, "BBBB", 4, MiB + 3);
	memcpy(data + MiB + 3, "BBBB", 4);
	kill_both();
	close(fd);
	fm_mount();
	fm_wait_committed("the recovered staging file", 60);
	fm_expect_content(mp("f"), data, len);
	fm_remount_cold();
	fm_expect_content(mp("f"), data, len);
	free(data);
}

/* A shared mapping made through the copy outlives its reader's close (the
 * kernel maps the copy itself): a later change must still reach it, as on
 * a local file system, so it goes through the copy. how: 0 an O_TRUNC
 * writer, 1 truncate() by path and then a writer, 2 `ferry mount
 * --upgrade` (the copy goes over to the new daemon) and then an O_TRUNC
 * writer. */
static void mapping_sees_change(int how)
{
	const size_t len = 2 * MiB;
	unsigned char *data = pattern(len, 0x3131 + how), *next = pattern(len, 0x4242 + how);
	unsigned char *m;
	int fd;

	need_passthrough();
	write_new("f", data, len);
	drain(0);
	fd = open_copy("f");
	m = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0);
	cr_assert(m != MAP_FAILED, "mmap: %s", strerror(errno));
	OK(close(fd));
	fm_wait_released(0);
	cr_assert(memcmp(m, data, len) == 0, "the mapping does not show the file");
	if (how == 1)
		OK(truncate(mp("f"), 0));
	if (how == 2) {
		fm_upgrade();
		cr_assert_eq(fm_stat("local_copies_handed_over"), 1);
	}
	fd = OK(open(mp("f"), O_WRONLY | (how != 1 ? O_TRUNC : 0)));
	fm_pwrite_all(fd, next, len, 0);
	OK(close(fd));
	cr_assert(memcmp(m, next, len) == 0, "the mapping still shows the file before the change");
	OK(munmap(m, len));
	drain(0);
	fm_remount_cold();
	fm_expect_content(mp("f"), next, len);
	free(data);
	free(next);
}

Test(local_copy, a_mapping_of_the_copy_sees_an_o_trunc_writer)
{
	mapping_sees_change(0);
}

Test(local_copy, a_mapping_of_the_copy_sees_a_truncate_and_a_writer)
{
	mapping_sees_change(1);
}

Test(local_copy, a_mapping_of_the_copy_sees_a_writer_after_an_upgrade)
{
	mapping_sees_change(2);
}

/* Copies nobody reads go over a restart (restart: `ferry mount --upgrade`,
 * or an unmount and a mount; taken_up: the .stats figure that counts them
 * in the new daemon): its readers get them (no READ reaches it), its
 * writers take them over (no copy-in), and a copy made stale meanwhile is
 * not one of them. */
static void copies_go_over(void (*restart)(void), const char *taken_up)
{
	const size_t len = 3 * MiB;
	unsigned char *a = pattern(len, 0xa1), *b = pattern(len, 0xb1), *c = pattern(len, 0xc1);
	uint64_t ups;
	int fd;

	need_passthrough();
	write_new("a", a, len);
	write_new("b", b, len);
	write_new("c", c, len);
	drain(0);
	cr_assert_eq(kept_files(), 3, "%d copies", kept_files());
	OK(truncate(mp("c"), len / 2)); /* c's copy is not the file any more */
	fm_wait_released(0);
	restart();
	cr_assert_eq(fm_stat(taken_up), 2, "%s %llu, not 2", taken_up,
		     (unsigned long long)fm_stat(taken_up));
	cr_assert_eq(fm_stat("local_copy_bytes"), 2 * len);
	cr_assert_eq(kept_files(), 2, "%d copies after the restart", kept_files());

	fd = open_copy("a");
	expect_fd_unread(fd, a, len, "a after the restart");
	OK(close(fd));
	ups = fm_stat("copy_ups");
	fd = OK(open(mp("b"), O_WRONLY));
	fm_pwrite_all(fd, "changed", 7, len - 7);
	OK(close(fd));
	cr_assert_eq(fm_stat("copy_ups"), ups, "b was copied in, not taken over");
	cr_assert_eq(fm_stat("local_copy_takeovers"), 1);
	memcpy(b + len - 7, "changed", 7);
	fm_expect_content(mp("c"), c, len / 2);
	drain(0);
	fm_remount_cold();
	fm_expect_content(mp("a"), a, len);
	fm_expect_content(mp("b"), b, len);
	fm_expect_content(mp("c"), c, len / 2);
	free(a);
	free(b);
	free(c);
}

Test(local_copy, copies_go_over_an_upgrade)
{
	copies_go_over(fm_upgrade, "local_copies_handed_over");
}

/* An O_TRUNC writer takes over a copy a reader shares, then the file grows
 * again with holes: once committed, the holes read as zeros, never as what
 * the file held before the O_TRUNC. */
Test(local_copy, an_o_trunc_through_a_shared_copy_leaves_no_old_bytes_in_holes)
{
	const size_t len = 2 * MiB;
	unsigned char *data = pattern(len, 0x5151), *want = calloc(1, len);
	int rfd, wfd;

	cr_assert(want);
	need_passthrough();
	write_new("f", data, len);
	drain(0);
	rfd = OK(open(mp("f"), O_RDONLY));
	wfd = OK(open(mp("f"), O_WRONLY | O_TRUNC));
	OK(ftruncate(wfd, (off_t)len));
	fm_pwrite_all(wfd, "EEEE", 4, (off_t)len - 4);
	memcpy(want + len - 4, "EEEE", 4);
	OK(close(wfd));
	expect_fd(rfd, want, len, "the reader after the O_TRUNC and the growth");
	OK(close(rfd));
	drain(0);
	fm_remount_cold();
	fm_expect_content(mp("f"), want, len);
	free(data);
	free(want);
}

/* A file fsynced before its close has nothing left to hand off at the
 * close: its staging file holds what is committed and becomes the copy
 * there and then; a change after it is still committed right. */
Test(local_copy, a_file_fsynced_before_close_is_kept_at_close)
{
	const size_t len = 3 * MiB;
	unsigned char *data = pattern(len, 0x6161);
	uint64_t made0, handoffs0;
	int fd;

	need_passthrough();
	/* Until the reconciler first reports, a start cannot tell whether an
	 * earlier run's jobs still commit, and a staging file set up then is
	 * never kept this way: a drain waits for that report. */
	drain(0);
	made0 = fm_stat("local_copies_made");
	fd = OK(open(mp("f"), O_CREAT | O_WRONLY, 0644));
	fm_pwrite_all(fd, data, len, 0);
	OK(fsync(fd));
	handoffs0 = fm_stat("handoffs");
	OK(close(fd));
	fm_wait_released(0);
	/* A close whose lease probe the kernel refused for a moment is
	 * finished by the retry thread, a little later. */
	for (int t = 0; t < 200 && fm_stat("local_copies_made") == made0; t++)
		usleep(50 * 1000);
	cr_assert_eq(fm_stat("handoffs"), handoffs0, "the close handed off a committed file");
	cr_assert_eq(fm_stat("local_copies_made"), made0 + 1,
		     "the close kept no copy (skipped %llu, probes deferred %llu, room refusals %llu)",
		     (unsigned long long)fm_stat("local_copies_skipped"),
		     (unsigned long long)fm_stat("release_probes_deferred"),
		     (unsigned long long)fm_stat("passthrough_no_room"));
	cr_assert_eq(kept_files(), 1);
	fd = open_copy("f");
	expect_fd(fd, data, len, "f through its copy");
	OK(close(fd));
	fd = OK(open(mp("f"), O_WRONLY));
	fm_pwrite_all(fd, "ZZ", 2, 5);
	memcpy(data + 5, "ZZ", 2);
	OK(close(fd));
	drain(0);
	fm_remount_cold();
	fm_expect_content(mp("f"), data, len);
	free(data);
}

/* The kernel forgetting the inode (drop_caches evicts it) does not drop
 * the copy: the next open gets it again. */
Test(local_copy, a_copy_outlives_the_kernel_forgetting_the_inode)
{
	const size_t len = 2 * MiB;
	unsigned char *data = pattern(len, 0x7171);
	uint64_t forgets0;
	int fd, dc;

	need_passthrough();
	write_new("f", data, len);
	drain(0);
	forgets0 = fm_stat("fuse_requests_forget");
	sync();
	dc = OK(open("/proc/sys/vm/drop_caches", O_WRONLY));
	fm_pwrite_all(dc, "3", 1, 0);
	OK(close(dc));
	cr_assert_gt(fm_stat("fuse_requests_forget"),
		     forgets0, "drop_caches made the kernel forget nothing");
	cr_assert_eq(kept_files(), 1, "the FORGET dropped the copy");
	fd = open_copy("f");
	expect_fd(fd, data, len, "f after the FORGET");
	OK(close(fd));
	free(data);
}

Test(local_copy, files_under_1_mib_get_no_copy)
{
	const size_t small = (size_t)MiB - 1, big = (size_t)MiB;
	unsigned char *s = pattern(small, 0x5), *b = pattern(big, 0xb);
	uint64_t made0, opens0;
	int fd;

	need_passthrough();
	made0 = fm_stat("local_copies_made");
	write_new("small", s, small);
	drain(0);
	cr_assert_eq(kept_files(), 0, "a file of %zu bytes got a copy", small);
	cr_assert_eq(fm_stat("local_copies_made"), made0);
	opens0 = fm_stat("local_copy_opens");
	fd = OK(open(mp("small"), O_RDONLY));
	cr_assert_eq(fm_stat("local_copy_opens"), opens0);
	expect_fd(fd, s, small, "small");
	OK(close(fd));

	/* 1 MiB exactly is large enough. */
	write_new("big", b, big);
	drain(0);
	cr_assert_eq(kept_files(), 1, "a file of 1 MiB got no copy");
	cr_assert_eq(fm_stat("local_copies_made"), made0 + 1);
	fd = OK(open(mp("big"), O_RDONLY));
	cr_assert_eq(fm_stat("local_copy_opens"), opens0 + 1);
	expect_fd(fd, b, big, "big");
	OK(close(fd));
	fm_remount_cold();
	fm_expect_content(mp("small"), s, small);
	fm_expect_content(mp("big"), b, big);
	free(s);
	free(b);
}

/* Readers only: a second reader of a shared copy reads it too; nothing
 * changes the file, so nothing takes the copy over. */
Test(local_copy, two_readers_share_one_copy)
{
	const size_t len = 4 * MiB;
	unsigned char *data = pattern(len, 0x2222);
	uint64_t opens0, take0, copy0, opens, take, bytes;
	struct fm_stats s;
	int r1, r2;

	need_passthrough();
	write_new("f", data, len);
	drain(0);
	cr_assert_eq(kept_files(), 1);
	opens0 = fm_stat("local_copy_opens");
	take0 = fm_stat("local_copy_takeovers");
	copy0 = fm_stat("copy_ups");
	r1 = OK(open(mp("f"), O_RDONLY));
	r2 = OK(open(mp("f"), O_RDONLY));
	fm_stats_read(&s);
	opens = fm_stats_need(&s, "local_copy_opens");
	take = fm_stats_need(&s, "local_copy_takeovers");
	bytes = fm_stats_need(&s, "local_copy_bytes");
	cr_assert(opens == opens0 + 2 && take == take0,
		  "two read-only opens: local_copy_opens %llu -> %llu (want +2), "
		  "local_copy_takeovers %llu -> %llu (want +0), local_copy_bytes %llu, "
		  "%d .kept- files", (unsigned long long)opens0, (unsigned long long)opens,
		  (unsigned long long)take0, (unsigned long long)take, (unsigned long long)bytes,
		  kept_files());
	cr_assert_eq(fm_stat("copy_ups"), copy0);
	expect_fd(r1, data, len, "f, first reader");
	expect_fd(r2, data, len, "f, second reader");
	OK(close(r1));
	OK(close(r2));
	fm_wait_released(0);
	cr_assert_eq(kept_files(), 1, "%d copies after two readers", kept_files());
	fm_remount_cold();
	fm_expect_content(mp("f"), data, len);
	free(data);
}

/* A writer's open with no reader takes the copy over too: no copy-in. */
Test(local_copy, a_writer_without_readers_takes_the_copy_over)
{
	const size_t len = 4 * MiB, at = MiB + 4321, n = 10000;
	unsigned char *data = pattern(len, 0x3333), *patch = pattern(n, 0x3334);
	uint64_t take0, copy0;
	int w, r;

	need_passthrough();
	write_new("f", data, len);
	drain(0);
	cr_assert_eq(kept_files(), 1);
	take0 = fm_stat("local_copy_takeovers");
	copy0 = fm_stat("copy_ups");
	w = OK(open(mp("f"), O_WRONLY));
	cr_assert_eq(fm_stat("local_copy_takeovers"), take0 + 1,
		     "the writer's open did not take the copy over");
	cr_assert_eq(fm_stat("copy_ups"), copy0, "the writer's open copied the file in");
	cr_assert_eq(kept_files(), 0, "the copy taken over is still a copy");
	fm_pwrite_all(w, patch, n, (off_t)at);
	OK(close(w));
	memcpy(data + at, patch, n);
	drain(0);
	/* The writer's close keeps its staging file as the new copy. */
	cr_assert_eq(kept_files(), 1, "%d copies after the writer's close", kept_files());
	r = open_copy("f");
	expect_fd(r, data, len, "f through the new copy");
	OK(close(r));
	fm_remount_cold();
	fm_expect_content(mp("f"), data, len);
	free(data);
	free(patch);
}

/* A truncate with nobody reading the copy changes the committed file: the
 * copy is not the file any more, and no reader gets it. */
Test(local_copy, a_truncate_without_readers_makes_the_copy_stale)
{
	const size_t len = 4 * MiB, cut = 2 * MiB + 5;
	unsigned char *data = pattern(len, 0x4444);
	uint64_t opens0;
	int r;

	need_passthrough();
	write_new("f", data, len);
	drain(0);
	cr_assert_eq(kept_files(), 1);
	OK(truncate(mp("f"), (off_t)cut));
	opens0 = fm_stat("local_copy_opens");
	r = OK(open(mp("f"), O_RDONLY));
	cr_assert_eq(fm_stat("local_copy_opens"), opens0, "a reader got the stale copy");
	expect_fd(r, data, cut, "f after the truncate");
	OK(close(r));
	fm_wait_released(0);
	/* The stale copy went; the whole read has one of the cut file built
	 * (the only copy made since). */
	wait_built(1);
	cr_assert_eq(kept_files(), 1, "%d copies: the stale one is still there", kept_files());
	cr_assert_eq(fm_stat("local_copy_bytes"), cut);
	cr_assert_eq(fm_stat("local_copies_made"), 1);
	r = open_copy("f");
	expect_fd_unread(r, data, cut, "f through the copy built after the truncate");
	OK(close(r));
	fm_remount_cold();
	fm_expect_content(mp("f"), data, cut);
	free(data);
}

/* A file removed takes its copy with it (once the kernel forgets it). */
Test(local_copy, an_unlinked_files_copy_goes)
{
	const size_t len = 2 * MiB;
	unsigned char *data = pattern(len, 0x5555);
	uint64_t dropped0;

	need_passthrough();
	write_new("f", data, len);
	write_new("g", data, len);
	drain(0);
	cr_assert_eq(kept_files(), 2);
	dropped0 = fm_stat("local_copies_dropped");
	OK(unlink(mp("f")));
	/* (the file goes before the figure moves: wait for both) */
	for (int t = 0; t < 100 && (kept_files() > 1 ||
				    fm_stat("local_copies_dropped") == dropped0); t++)
		usleep(50 * 1000);
	cr_assert_eq(kept_files(), 1, "%d copies 5 s after an unlink", kept_files());
	cr_assert_eq(fm_stat("local_copies_dropped"), dropped0 + 1,
		     "local_copies_dropped %llu -> %llu after an unlink",
		     (unsigned long long)dropped0,
		     (unsigned long long)fm_stat("local_copies_dropped"));
	cr_assert_eq(fm_stat("local_copy_bytes"), len);
	FAILS(open(mp("f"), O_RDONLY), ENOENT);
	fm_expect_content(mp("g"), data, len);
	fm_remount_cold();
	FAILS(open(mp("f"), O_RDONLY), ENOENT);
	fm_expect_content(mp("g"), data, len);
	free(data);
}

/* Without -o local_copies, copies may take a quarter of the staging
 * filesystem; once that filesystem runs low (a writer outside ferryfs
 * here, a passthrough writer in life: neither asks the daemon), the next
 * gc round removes the unread copies, and the file still reads right. */
Test(local_copy, the_default_limit_is_a_quarter_of_staging_and_low_space_takes_copies)
{
	const size_t len = 4 * MiB;
	unsigned char *data = pattern(len, 0x1a57), *fill;
	char fs[512];
	int fd;

	need_passthrough();
	fm_umount();
	snprintf(fs, sizeof(fs), "%s", sp("small-staging")); /* sp()'s buffer is reused */
	cr_assert(mkdir(fs, 0700) == 0);
	cr_assert(mount("ferry-test-staging", fs, "tmpfs", MS_NOSUID | MS_NODEV,
			"size=64m,mode=0700") == 0, "tmpfs: %s", strerror(errno));
	snprintf(fm.staging, sizeof(fm.staging), "%s/staging", fs);
	fm.staging_min_free = "16";
	setenv("FERRY_IT_MOUNT_OPTIONS", run_extra, 1);
	fm_mount();
	cr_assert_eq(fm_stat("local_copy_limit"), 16 * MiB, "local_copy_limit %llu on 64 MiB",
		     (unsigned long long)fm_stat("local_copy_limit"));
	write_new("f", data, len);
	drain(0);
	cr_assert_eq(kept_files(), 1, "%d copies", kept_files());
	cr_assert_eq(fm_stat("local_copy_bytes"), len);
	fd = open_copy("f");
	expect_fd(fd, data, len, "f through its copy");
	OK(close(fd));
	fm_wait_released(0);

	/* 48 MiB more leaves about 12 MiB free, under the 16 MiB asked for. */
	fill = pattern(48 * MiB, 0xf111);
	fm_write_file(sp("small-staging/filler"), fill, 48 * MiB);
	free(fill);
	for (int k = 0; k < 300 && (kept_files() > 0 || fm_stat("local_copy_bytes") > 0); k++)
		usleep(100 * 1000);
	cr_assert_eq(kept_files(), 0, "a low staging filesystem kept %d copies", kept_files());
	cr_assert_eq(fm_stat("local_copy_bytes"), 0);
	fm_expect_content(mp("f"), data, len);
	OK(unlink(sp("small-staging/filler")));
	fm_umount();
	OK(umount2(fs, MNT_DETACH));
	fm.staging[0] = '\0';
	fm.staging_min_free = NULL;
	free(data);
}

/* A foreground daemon executes the new one itself at an upgrade, under the
 * same pid: its copies go over too, and the new image's sweep (which
 * removes its own pid's files, an earlier run's) leaves them. */
Test(local_copy, copies_go_over_a_foreground_upgrade)
{
	const size_t len = 2 * MiB;
	unsigned char *a = pattern(len, 0xf1f1);
	int status = 0, fd;
	pid_t child;

	need_passthrough();
	fm_umount();
	child = fork();
	cr_assert_geq(child, 0);
	if (child == 0) {
		int log = open(fm.log, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);

		if (log >= 0) {
			dup2(log, 1);
			dup2(log, 2);
		}
		execl(fm_bin("ferry"), "ferry", "mount", "-f", "--cache-dir", fm.cache, "-o",
		      fm_mount_options(), fm.vol, fm.mnt, (char *)NULL);
		_exit(127);
	}
	fm.mounted = true; /* the teardown unmounts it if this test fails */
	for (int k = 0; k < 200 && access(mp(".stats"), F_OK) != 0; k++) {
		cr_assert_eq(waitpid(child, &status, WNOHANG), 0,
			     "ferry mount -f exited (status %#x); see %s", status, fm.log);
		usleep(50000);
	}
	cr_assert(fm_is_mounted(fm.mnt), "ferry mount -f did not mount");
	cr_assert_eq((pid_t)fm_stat("pid"), child, "ferry mount -f executes ferry-mountd");
	write_new("a", a, len);
	drain(0);
	cr_assert_eq(kept_files(), 1, "%d copies", kept_files());
	fm_upgrade();
	cr_assert_eq((pid_t)fm_stat("pid"), child, "the same process serves");
	cr_assert_eq(fm_stat("local_copies_handed_over"), 1);
	cr_assert_eq(kept_files(), 1, "%d copies after the upgrade", kept_files());
	fd = open_copy("a");
	expect_fd(fd, a, len, "a after a foreground upgrade");
	OK(close(fd));
	fm_wait_released(0);
	fm_umount();
	pid_t got = 0;

	for (int k = 0; k < 600 && (got = waitpid(child, &status, WNOHANG)) == 0; k++)
		usleep(50000);
	cr_assert_eq(got, child, "ferry mount -f did not exit within 30 s of the unmount");
	cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "status %#x", status);
	cr_assert_eq(kept_files(), 1, "the copy did not outlive the unmount");
	fm_mount();
	cr_assert_eq(fm_stat("local_copies_restored"), 1, "the next mount did not take it up");
	fm_expect_content(mp("a"), a, len);
	free(a);
}

/* The copies go over in their eviction order: after the upgrade, the one
 * read least recently is still the first to go. */
Test(local_copy, an_upgrade_keeps_the_eviction_order)
{
	const size_t len = 2 * MiB;
	unsigned char *a = pattern(len, 0xa2), *b = pattern(len, 0xb2), *c = pattern(len, 0xc2);
	uint64_t opens;
	int fd;

	need_passthrough();
	fm_umount();
	fm_mount_with("local_copies=5m");
	write_new("a", a, len);
	write_new("b", b, len);
	drain(0);
	cr_assert_eq(kept_files(), 2, "%d copies", kept_files());
	fd = open_copy("a"); /* b is now the least recently read */
	OK(close(fd));
	fm_wait_released(0);
	fm_upgrade();
	cr_assert_eq(fm_stat("local_copies_handed_over"), 2);
	write_new("c", c, len);
	drain(0);
	cr_assert_eq(kept_files(), 2, "%d copies under a 5 MiB limit", kept_files());
	fd = open_copy("a");
	expect_fd(fd, a, len, "a");
	OK(close(fd));
	opens = fm_stat("local_copy_opens");
	fm_expect_content(mp("b"), b, len);
	cr_assert_eq(fm_stat("local_copy_opens"), opens, "b, the least recently read, kept its copy: the upgrade reversed the order");
	fm_expect_content(mp("c"), c, len);
	free(a);
	free(b);
	free(c);
}


/* A file only in the store (written, committed, then remounted with an
 * empty read cache) read whole by one handle gets a copy built after the
 * close; the next reader gets passthrough on it, and a writer takes it
 * over. Its middle megabyte is zeros: the copy reads them as such. */
Test(local_copy, a_file_read_whole_from_the_store_gets_a_copy)
{
	const size_t len = 4 * MiB;
	unsigned char *data = pattern(len, 0xb111d);
	const char patch[] = "changed after the build";
	int fd;

	need_passthrough();
	memset(data + MiB, 0, MiB);
	write_new("f", data, len);
	drain(0);
	fm_remount_cold();
	cr_assert_eq(kept_files(), 0);
	cr_assert_eq(fm_stat("local_copies_built"), 0);
	fm_expect_content(mp("f"), data, len); /* open, READs, close */
	wait_built(1);
	cr_assert_eq(kept_files(), 1, "%d .kept- files after a build, not 1", kept_files());
	cr_assert_eq(fm_stat("local_copy_bytes"), len);
	fd = open_copy("f");
	expect_fd_unread(fd, data, len, "f through the copy built from the store");
	OK(close(fd));

	/* The built copy is the file's as any other: a writer takes it over. */
	fd = OK(open(mp("f"), O_WRONLY));
	fm_pwrite_all(fd, patch, sizeof(patch), (off_t)(MiB + 77));
	OK(close(fd));
	memcpy(data + MiB + 77, patch, sizeof(patch));
	cr_assert_eq(fm_stat("local_copy_takeovers"), 1, "the writer did not take the copy over");
	drain(0);
	fm_expect_content(mp("f"), data, len);
	fm_remount_cold();
	fm_expect_content(mp("f"), data, len);
	free(data);
}

/* A handle that read only part of the file (a quarter), or jumped about in it, asks
 * for no copy; nor does a file under 1 MiB. The builds go one after the
 * other in the order asked: once the whole read of "last" is built, a
 * build of any of them asked for before would be too. */
Test(local_copy, only_a_whole_in_order_read_builds_a_copy)
{
	const size_t len = 8 * MiB, small = MiB - 1;
	unsigned char *data = pattern(len, 0xa11), *got = malloc(len);
	int fd;

	need_passthrough();
	cr_assert(got);
	write_new("part", data, len);
	write_new("jump", data, len);
	write_new("small", data, small);
	write_new("last", data, 2 * MiB);
	drain(0);
	fm_remount_cold();

	fd = OK(open(mp("part"), O_RDONLY));
	fm_pread_all(fd, got, len / 4, 0);
	OK(close(fd));
	/* The second half first, then the first: every byte, out of order. */
	fd = OK(open(mp("jump"), O_RDONLY));
	fm_pread_all(fd, got + len / 2, len / 2, (off_t)(len / 2));
	fm_pread_all(fd, got, len / 2, 0);
	OK(close(fd));
	cr_assert(memcmp(got, data, len) == 0, "jump: wrong bytes");
	fm_expect_content(mp("small"), data, small);
	fm_wait_released(0);
	fm_expect_content(mp("last"), data, 2 * MiB);
	wait_built(1);
	fm_wait_released(0);
	cr_assert_eq(fm_stat("local_copies_built"), 1);
	cr_assert_eq(fm_stat("local_copy_builds_given_up"), 0, "a build was asked for and given up");
	cr_assert_eq(kept_files(), 1, "%d .kept- files, not 1 (only last's)", kept_files());
	fd = open_copy("last");
	expect_fd_unread(fd, data, 2 * MiB, "last through its copy");
	OK(close(fd));
	free(got);
	free(data);
}

/* A writer right after a whole read: the build either finished (the
 * writer takes the copy over) or meets the change and gives up; either
 * way every later reader reads the writer's bytes. */
Test(local_copy, a_change_racing_the_build_is_never_lost)
{
	const size_t len = 16 * MiB;
	unsigned char *data = pattern(len, 0x4ace);
	int fd;

	need_passthrough();
	write_new("f", data, len);
	drain(0);
	for (int round = 0; round < 3; round++) {
		uint64_t ended;

		fm_remount_cold();
		fm_expect_content(mp("f"), data, len);
		fm_wait_released(0); /* the build is asked for */
		fd = OK(open(mp("f"), O_WRONLY));
		for (size_t at = (size_t)round * 4096; at < len; at += 3 * MiB) {
			data[at] ^= 0xff;
			fm_pwrite_all(fd, data + at, 1, (off_t)at);
		}
		OK(close(fd));
		fm_expect_content(mp("f"), data, len);
		drain(0);
		fm_wait_released(0);
		fm_expect_content(mp("f"), data, len);
		/* The build ran, one way or the other. */
		for (int t = 0; t < 1200; t++) {
			ended = fm_stat("local_copies_built") + fm_stat("local_copy_builds_given_up");
			if (ended >= 1)
				break;
			usleep(50 * 1000);
		}
		cr_assert_geq(ended, 1, "round %d: no build ended in 60 s", round);
		fm_expect_content(mp("f"), data, len);
	}
	fm_remount_cold();
	fm_expect_content(mp("f"), data, len);
	free(data);
}

/* Writes a and b (len bytes each), has both committed, and mounts again
 * (no copies, a cold read cache) with room for one copy only. */
static void two_files_room_for_one(const unsigned char *a, const unsigned char *b, size_t len)
{
	need_passthrough();
	write_new("a", a, len);
	write_new("b", b, len);
	drain(0);
	fm_umount();
	cr_assert_eq(fm_forget_saved_copies(), 1); /* the start removes the copies */
	fm_mount_with("local_copies=6m");
	cr_assert_eq(kept_files(), 0);
}

/* The staging directory holds one copy, name's, which a reader's open
 * gets (no READ reaches the daemon). */
static void expect_only_copy(const char *name, const unsigned char *want, size_t len)
{
	int fd;

	cr_assert_eq(kept_files(), 1, "%d copies, not 1", kept_files());
	fd = open_copy(name);
	expect_fd_unread(fd, want, len, name);
	OK(close(fd));
}

/* A build makes room only by evicting copies built the same way: a pass
 * that reads many files once does not take the copy a writer left. */
Test(local_copy, a_build_never_evicts_a_writers_copy)
{
	const size_t len = 4 * MiB;
	unsigned char *w = pattern(len, 0x3e1), *r = pattern(len, 0x3e2);
	uint64_t dropped0;

	two_files_room_for_one(r, w, len);
	/* w written again here: its copy is a writer's */
	w[0] ^= 1;
	write_new("b", w, len);
	drain(0);
	cr_assert_eq(kept_files(), 1, "the writer's file has no copy");
	dropped0 = fm_stat("local_copies_dropped");
	fm_expect_content(mp("a"), r, len);
	fm_wait_released(0);
	for (int t = 0; t < 1200 && fm_stat("local_copy_builds_given_up") == 0; t++)
		usleep(50 * 1000);
	cr_assert_eq(fm_stat("local_copy_builds_given_up"), 1, "the build was not given up");
	cr_assert_eq(fm_stat("local_copies_built"), 0);
	cr_assert_eq(fm_stat("local_copies_dropped"), dropped0, "a copy was evicted for the build");
	expect_only_copy("b", w, len);
	free(w);
	free(r);
}

/* ... and does evict an older copy built from a read, least recently
 * used first: the space holds one, the newest read's. */
Test(local_copy, a_build_evicts_an_older_built_copy)
{
	const size_t len = 4 * MiB;
	unsigned char *a = pattern(len, 0x3e3), *b = pattern(len, 0x3e4);

	two_files_room_for_one(a, b, len);
	fm_expect_content(mp("a"), a, len);
	wait_built(1);
	fm_expect_content(mp("b"), b, len);
	wait_built(2);
	cr_assert_eq(fm_stat("local_copies_dropped"), 1, "a's copy was not evicted for b's");
	cr_assert_eq(fm_stat("local_copy_bytes"), len);
	expect_only_copy("b", b, len);
	fm_expect_content(mp("a"), a, len); /* read again: a builds anew, evicting b's */
	free(a);
	free(b);
}

/* A built copy stays one across an upgrade: the new daemon's builds may
 * evict it, as the old one's could. */
Test(local_copy, a_built_copy_goes_over_an_upgrade_as_built)
{
	const size_t len = 4 * MiB;
	unsigned char *a = pattern(len, 0x3e5), *b = pattern(len, 0x3e6);

	two_files_room_for_one(a, b, len);
	fm_expect_content(mp("a"), a, len);
	wait_built(1);
	fm_upgrade();
	cr_assert_eq(fm_stat("local_copies_handed_over"), 1, "a's copy did not go over");
	fm_expect_content(mp("b"), b, len);
	wait_built(1);
	cr_assert_eq(fm_stat("local_copies_dropped"), 1, "a's copy was not evicted for b's");
	expect_only_copy("b", b, len);
	free(a);
	free(b);
}
