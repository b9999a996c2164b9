/*
 * ferry checkpoint, ferry restore and ferry gc through a real mount and
 * the real store: a volume restored from a checkpoint holds exactly what
 * the mount held when the checkpoint was taken (files closed and still
 * open for write, a directory, a symlink, an xattr), whatever the origin
 * did after; ferry gc removes what nothing refers to (a deleted file's
 * objects once the grace has passed, an upload that was never committed)
 * and keeps what a live file or a kept checkpoint does; deleting a
 * checkpoint that a volume was restored from wants --force, and only then
 * are its objects collected. Runs on a SQLite volume and (scripts/test) on
 * a PostgreSQL one; the restored volume is always a SQLite one beside it.
 */
#include "mount_util.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>

#define KiB 1024
#define MiB (1024 * 1024)

static bool mnt2_mounted;

static void teardown(void)
{
	if (mnt2_mounted) {
		const char *argv[] = { fm_bin("ferry"), "umount", sp("mnt2"), NULL };
		if (fm_run(argv, NULL, NULL, 60) != 0)
			umount2(sp("mnt2"), MNT_DETACH);
		mnt2_mounted = false;
	}
	fm_teardown();
}

TestSuite(checkpoint, .init = fm_setup, .fini = teardown, .timeout = 240);

static unsigned char *pattern(size_t len, uint64_t seed)
{
	unsigned char *d = malloc(len);

	cr_assert(d);
	fm_fill_random(&seed, d, len);
	return d;
}

/* ferry ARGS...: its exit status; stdout and stderr in sp("run.out"),
 * sp("run.err"). */
static int ferry(const char *a1, const char *a2, const char *a3, const char *a4, const char *a5,
		 const char *a6)
{
	const char *argv[] = { fm_bin("ferry"), a1, a2, a3, a4, a5, a6, NULL };

	return fm_run(argv, sp("run.out"), sp("run.err"), 120);
}

static char *out_text(void)
{
	char *o = fm_slurp(sp("run.out"));
	cr_assert(o);
	return o;
}

static char *err_text(void)
{
	char *e = fm_slurp(sp("run.err"));
	cr_assert(e);
	return e;
}

/* The store of the volume under test: file://, the fixture's own for a
 * PostgreSQL volume, the default vol/objects for a SQLite one. */
static const char *store_url(void)
{
	static char url[PATH_MAX + 16];

	if (fm.storage[0])
		snprintf(url, sizeof(url), "%s", fm.storage);
	else
		snprintf(url, sizeof(url), "file://%s", sp("vol/objects"));
	return url;
}


static void mount_restored(void)
{
	OK(mkdir(sp("mnt2"), 0755) == 0 || errno == EEXIST ? 0 : -1);
	int st = ferry("mount", sp("vol2"), sp("mnt2"), NULL, NULL, NULL);
	cr_assert_eq(st, 0, "ferry mount of the restored volume: %d\n%s", st, err_text());
	mnt2_mounted = true;
}

static void umount_restored(void)
{
	int st = ferry("umount", sp("mnt2"), NULL, NULL, NULL, NULL);
	cr_assert_eq(st, 0, "ferry umount: %d\n%s", st, err_text());
	mnt2_mounted = false;
}

static uint64_t objects, object_bytes;

static int count_object(const char *path, const struct stat *st, int type, struct FTW *ftw)
{
	(void)ftw;
	if (type == FTW_F && strstr(path, "/chunks/") && fm_store_is_object(path)) {
		objects++;
		object_bytes += (uint64_t)st->st_size;
	}
	return 0;
}

static uint64_t chunk_objects(void)
{
	objects = object_bytes = 0;
	cr_assert_eq(nftw(fm_store_dir(), count_object, 16, FTW_PHYS), 0, "%s", fm_store_dir());
	return objects;
}

Test(checkpoint, restore_gives_the_contents_at_the_checkpoint)
{
	size_t big = 3 * MiB + 17, small = 70 * KiB + 3, open_len = 200 * KiB;
	unsigned char *a = pattern(big, 1), *b = pattern(small, 2), *c = pattern(open_len, 3);
	unsigned char *later = pattern(small, 4);
	char *out;

	OK(mkdir(mp("dir"), 0750));
	fm_write_file(mp("dir/a"), a, big);
	fm_write_file(mp("b"), b, small);
	OK(symlink("dir/a", mp("link")));
	OK(setxattr(mp("b"), "user.kept", "yes", 3, 0));
	int fd = OK(open(mp("open"), O_CREAT | O_WRONLY | O_CLOEXEC, 0644));
	fm_pwrite_all(fd, c, open_len, 0);

	int st = ferry("checkpoint", "--json", fm.mnt, "cp1", NULL, NULL);
	out = out_text();
	cr_assert_eq(st, 0, "ferry checkpoint: %d\n%s\n%s", st, out, err_text());
	cr_assert(strstr(out, "\"state\":\"done\"") && strstr(out, "\"checkpoint\":\"cp1\""), "%s",
		  out);
	cr_assert(strstr(out, "\"pause_ms\":"), "%s", out);
	cr_log_info("ferry checkpoint: %s", out);
	free(out);

	/* The origin goes on: none of this is in the checkpoint. */
	fm_pwrite_all(fd, later, small, (off_t)open_len);
	OK(close(fd));
	OK(unlink(mp("dir/a")));
	fm_write_file(mp("b"), later, small);
	fm_write_file(mp("new"), later, small);
	fm_umount();

	st = ferry("restore", "--from", "cp1", "--storage", store_url(), sp("vol2"));
	cr_assert_eq(st, 0, "ferry restore: %d\n%s", st, err_text());
	mount_restored();
	fm_expect_content(sp("mnt2/dir/a"), a, big);
	fm_expect_content(sp("mnt2/b"), b, small);
	fm_expect_content(sp("mnt2/open"), c, open_len);
	char target[64] = "";
	cr_assert_eq(readlink(sp("mnt2/link"), target, sizeof(target) - 1), 5);
	cr_assert_str_eq(target, "dir/a");
	char x[8] = "";
	cr_assert_eq(getxattr(sp("mnt2/b"), "user.kept", x, sizeof(x)), 3);
	cr_assert_eq(memcmp(x, "yes", 3), 0);
	struct stat sb;
	cr_assert_eq(stat(sp("mnt2/new"), &sb), -1, "a file made after the checkpoint is there");
	cr_assert_eq(stat(sp("mnt2/dir"), &sb), 0);
	cr_assert_eq(sb.st_mode & 07777, 0750);
	/* The restored volume is a volume of its own: it writes new slices. */
	fm_write_file(sp("mnt2/mine"), later, small);
	umount_restored();
	mount_restored();
	fm_expect_content(sp("mnt2/mine"), later, small);
	umount_restored();

	/* And the origin still holds what it did after. */
	fm_remount_cold();
	fm_expect_content(mp("b"), later, small);
	fm_expect_content(mp("new"), later, small);
	cr_assert_eq(stat(mp("dir/a"), &sb), -1);
	size_t n;
	unsigned char *got = fm_read_file(mp("open"), &n);
	cr_assert_eq(n, open_len + small);
	cr_assert_eq(memcmp(got, c, open_len), 0);
	cr_assert_eq(memcmp(got + open_len, later, small), 0);
	free(got);

	st = ferry("checkpoint", "--list", fm.vol, NULL, NULL, NULL);
	out = out_text();
	cr_assert_eq(st, 0, "%s", err_text());
	cr_assert(strstr(out, "cp1 "), "%s", out);
	free(out);
	free(a);
	free(b);
	free(c);
	free(later);
}

Test(checkpoint, gc_keeps_what_files_and_checkpoints_name_and_removes_the_rest)
{
	size_t len = 300 * KiB + 1;
	unsigned char *f1 = pattern(len, 11), *f2 = pattern(len, 12), *g = pattern(len, 13);
	char *out;
	int st;

	fm_write_file(mp("f1"), f1, len);
	fm_write_file(mp("f2"), f2, len);
	st = ferry("checkpoint", fm.mnt, "keep", NULL, NULL, NULL);
	cr_assert_eq(st, 0, "ferry checkpoint: %d\n%s", st, err_text());
	/* f1 goes, but the checkpoint has it; g comes and goes after it. */
	OK(unlink(mp("f1")));
	fm_write_file(mp("g"), g, len);
	fm_wait_committed("g", 60);
	OK(unlink(mp("g")));
	st = ferry("gc", fm.vol, NULL, NULL, NULL, NULL);
	cr_assert_eq(st, 1, "ferry gc on a mounted volume: %d", st);
	cr_assert(strstr(err_text(), "mounted") || strstr(err_text(), "lease is held"), "%s",
		  err_text());
	fm_umount();

	/* An upload that was never committed: an object of an id in the
	 * volume's range that no slice names. */
	fm_store_put("chunks/0/999/999999_0_5", "hello", 5);
	uint64_t before = chunk_objects();

	/* The grace: g was freed a moment ago, the orphan was never named. */
	st = ferry("gc", "--grace", "3600", fm.vol, NULL, NULL);
	out = out_text();
	cr_assert_eq(st, 0, "ferry gc: %d\n%s", st, err_text());
	cr_assert(strstr(out, "999999_0_5"), "the orphan is not listed:\n%s", out);
	cr_assert(strstr(out, "would delete (dry run: give --delete) 1 objects"), "%s", out);
	free(out);
	cr_assert_eq(chunk_objects(), before, "a dry run deleted objects");

	st = ferry("gc", "--grace", "0", "--delete", fm.vol, NULL);
	out = out_text();
	cr_assert_eq(st, 0, "ferry gc --delete: %d\n%s\n%s", st, out, err_text());
	cr_assert(strstr(out, "deleted 2 objects"), "g's object and the orphan:\n%s", out);
	free(out);
	cr_assert_eq(chunk_objects(), before - 2);
	cr_assert(!fm_store_has("chunks/0/999/999999_0_5"), "the orphan is still there");
	struct stat sb;

	/* A second pass finds nothing: what is left is referred to. */
	st = ferry("gc", "--grace", "0", fm.vol, NULL, NULL);
	out = out_text();
	cr_assert(strstr(out, "would delete (dry run: give --delete) 0 objects"), "%s", out);
	free(out);

	/* The checkpoint still restores f1, every byte from the store. */
	st = ferry("restore", "--from", "keep", "--storage", store_url(), sp("vol2"));
	cr_assert_eq(st, 0, "ferry restore: %d\n%s", st, err_text());
	mount_restored();
	fm_expect_content(sp("mnt2/f1"), f1, len);
	fm_expect_content(sp("mnt2/f2"), f2, len);
	umount_restored();

	/* A restored volume reads the checkpoint's objects: no deleting it
	 * without --force. */
	st = ferry("checkpoint", "--delete", fm.vol, "keep", NULL, NULL);
	cr_assert_eq(st, 1, "delete of a checkpoint a volume was restored from: %d", st);
	cr_assert(strstr(err_text(), "restored from checkpoint keep"), "%s", err_text());
	st = ferry("checkpoint", "--delete", "--force", fm.vol, "keep", NULL);
	cr_assert_eq(st, 0, "%s", err_text());
	st = ferry("checkpoint", "--list", fm.vol, NULL, NULL, NULL);
	out = out_text();
	cr_assert(!strstr(out, "keep "), "%s", out);
	free(out);

	/* Now f1's object is garbage; f2's is live. */
	st = ferry("gc", "--grace", "0", "--delete", fm.vol, NULL);
	out = out_text();
	cr_assert_eq(st, 0, "%s", err_text());
	cr_assert(strstr(out, "deleted 1 objects"), "f1's object:\n%s", out);
	free(out);
	fm_remount_cold();
	fm_expect_content(mp("f2"), f2, len);
	cr_assert_eq(stat(mp("f1"), &sb), -1);
	free(f1);
	free(f2);
	free(g);
}

static long control_write(const char *req)
{
	int fd = open(mp(".control"), O_RDWR | O_CLOEXEC);
	long rc;

	if (fd < 0)
		return -errno;
	rc = write(fd, req, strlen(req)) < 0 ? -errno : 0;
	close(fd);
	return rc;
}

Test(checkpoint, names_and_errors)
{
	int st;

	fm_write_file(mp("a"), "abc", 3);
	st = ferry("checkpoint", fm.mnt, "../x", NULL, NULL, NULL);
	cr_assert_eq(st, 2, "a bad name: %d", st);
	st = ferry("checkpoint", fm.mnt, NULL, NULL, NULL, NULL);
	cr_assert_eq(st, 2);
	cr_assert_eq(control_write("checkpoint"), -EINVAL);
	cr_assert_eq(control_write("checkpoint a/b wait"), -EINVAL);
	cr_assert_eq(control_write("checkpoint .hidden wait"), -EINVAL);
	cr_assert_eq(control_write("checkpoint one wait"), 0);
	/* The name is taken: exit 4 names why, and nothing changes. */
	st = ferry("checkpoint", fm.mnt, "one", NULL, NULL, NULL);
	cr_assert_eq(st, 4, "a second checkpoint of one name: %d", st);
	cr_assert(strstr(err_text(), "a checkpoint named one exists"), "%s", err_text());
	st = ferry("checkpoint", "--delete", fm.vol, "none", NULL, NULL);
	cr_assert_eq(st, 1);
	st = ferry("restore", "--from", "none", "--storage", store_url(), sp("v3"));
	cr_assert_eq(st, 1);
	cr_assert(strstr(err_text(), "no checkpoint named none"), "%s", err_text());
	st = ferry("restore", "--from", "one", "--storage", "file:///nonexistent-ferry", sp("v3"));
	cr_assert_eq(st, 1, "a store that is not there: %d", st);
	struct stat sb;
	cr_assert_eq(stat(sp("v3/meta.db"), &sb), -1, "a failed restore left a volume");
	/* The one that was taken restores. */
	st = ferry("restore", "--from", "one", "--storage", store_url(), sp("v3"));
	cr_assert_eq(st, 0, "%s", err_text());
	cr_assert_eq(stat(sp("v3/meta.db"), &sb), 0);
}

/* ---- a checkpoint under a stream of writes ---- */

#define W_FILES 16
#define W_LEN (48 * KiB)

/* Version k of a writer's file: a header, then bytes of seed k. */
static void version_fill(unsigned char *buf, int k)
{
	uint64_t seed = 1000 + (uint64_t)k;
	int n = snprintf((char *)buf, 32, "k=%d\n", k);

	fm_fill_random(&seed, buf + n, W_LEN - (size_t)n);
}

static int put_atomically(const char *dir, const char *name, const void *buf, size_t len)
{
	char tmp[PATH_MAX], dst[PATH_MAX];
	int fd;

	snprintf(tmp, sizeof(tmp), "%s/.tmp", dir);
	snprintf(dst, sizeof(dst), "%s/%s", dir, name);
	fd = open(tmp, O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0644);
	if (fd < 0)
		return -1;
	if (write(fd, buf, len) != (ssize_t)len || close(fd) != 0)
		return -1;
	return rename(tmp, dst);
}

/* A child: version k of file k % W_FILES, put in place by rename, then
 * "latest" says k; until killed. Exits 1 at the first error. */
static pid_t writer_start(const char *dir)
{
	pid_t pid = fork();

	cr_assert(pid >= 0);
	if (pid > 0)
		return pid;
	unsigned char *buf = malloc(W_LEN);
	char name[32], k_text[32];
	for (int k = 1;; k++) {
		version_fill(buf, k);
		snprintf(name, sizeof(name), "f%d", k % W_FILES);
		if (put_atomically(dir, name, buf, W_LEN) != 0)
			_exit(1);
		int n = snprintf(k_text, sizeof(k_text), "%d", k);
		if (put_atomically(dir, "latest", k_text, (size_t)n) != 0)
			_exit(1);
	}
}

/* What a restored writer's directory must show: "latest" is L, the file
 * it names is version L, and every file is some whole version. */
static void writer_check(const char *dir)
{
	char path[PATH_MAX];
	unsigned char *want = malloc(W_LEN);
	size_t n;
	char *latest;
	int L;

	snprintf(path, sizeof(path), "%s/latest", dir);
	latest = fm_slurp(path);
	cr_assert(latest, "no %s", path);
	L = atoi(latest);
	cr_assert(L > 0, "latest is '%s'", latest);
	for (int j = 0; j < W_FILES && j <= L; j++) {
		snprintf(path, sizeof(path), "%s/f%d", dir, j);
		unsigned char *got = fm_read_file(path, &n);
		int k = -1;
		cr_assert_eq(n, W_LEN, "%s: %zu bytes, not a whole version (latest %d)", path, n, L);
		cr_assert_eq(sscanf((char *)got, "k=%d", &k), 1, "%s: no header (latest %d)", path, L);
		cr_assert(k % W_FILES == j && k <= L + 1, "%s is version %d, latest %d", path, k, L);
		if (j == L % W_FILES)
			cr_assert_eq(k, L, "%s is version %d, but latest says %d", path, k, L);
		version_fill(want, k);
		cr_assert_eq(memcmp(got, want, W_LEN), 0, "%s: version %d's bytes differ", path, k);
		free(got);
	}
	free(latest);
	free(want);
}

static int sh(const char *script, int timeout_s)
{
	const char *argv[] = { "/bin/sh", "-c", script, NULL };

	return fm_run(argv, sp("sh.out"), sp("sh.err"), timeout_s);
}

Test(checkpoint, under_a_stream_of_writes_it_is_one_instant)
{
	char script[2 * PATH_MAX], *out;
	int st, wst;

	OK(mkdir(mp("w"), 0755));
	snprintf(script, sizeof(script),
		 "set -e; cd '%s'; git init -q repo; cd repo; git config user.email t@t;"
		 " git config user.name t; echo 0 > f; git add f; git commit -qm c0",
		 fm.mnt);
	cr_assert_eq(sh(script, 60), 0, "%s", fm_slurp(sp("sh.err")));
	/* A repository being committed to: a commit a few tens of ms. */
	pid_t git = fork();
	cr_assert(git >= 0);
	if (git == 0) {
		setpgid(0, 0); /* git's own children go with it */
		snprintf(script, sizeof(script),
			 "cd '%s/repo' || exit 1; i=0; while :; do i=$((i+1));"
			 " echo $i > f$((i %% 8)); git add -A || exit 1;"
			 " git commit -qm c$i || exit 1; done",
			 fm.mnt);
		execl("/bin/sh", "sh", "-c", script, (char *)NULL);
		_exit(127);
	}
	pid_t writer = writer_start(mp("w"));
	usleep(1500 * 1000);

	st = ferry("checkpoint", "--json", fm.mnt, "live", NULL, NULL);
	out = out_text();
	usleep(500 * 1000);
	cr_assert_eq(waitpid(writer, &wst, WNOHANG), 0, "the writer stopped: %d", wst);
	cr_assert_eq(waitpid(git, &wst, WNOHANG), 0, "the git loop stopped: %d", wst);
	kill(writer, SIGKILL);
	kill(-git, SIGKILL);
	waitpid(writer, &wst, 0);
	waitpid(git, &wst, 0);
	/* Its last git may still be going: the mount must be let go of. */
	for (int t = 0; t < 500 && kill(-git, 0) == 0; t++)
		usleep(10000);
	cr_assert_eq(st, 0, "ferry checkpoint under writers: %d\n%s\n%s", st, out, err_text());
	cr_log_info("ferry checkpoint under a writer and a git loop: %s", out);
	free(out);
	/* A git process killed mid-commit leaves its lock: not a checkpoint's
	 * business, but the remount must still work. */
	fm_umount();

	st = ferry("restore", "--from", "live", "--storage", store_url(), sp("vol2"));
	cr_assert_eq(st, 0, "ferry restore: %d\n%s", st, err_text());
	mount_restored();
	writer_check(sp("mnt2/w"));
	snprintf(script, sizeof(script),
		 "cd '%s/repo' && git fsck --full --no-progress && test $(git rev-list --count HEAD) -ge 1",
		 sp("mnt2"));
	st = sh(script, 120);
	cr_assert_eq(st, 0, "git fsck of the restored repository: %d\n%s%s", st,
		     fm_slurp(sp("sh.out")), fm_slurp(sp("sh.err")));
	umount_restored();
}
