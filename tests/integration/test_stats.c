/*
 * The mount's .stats file and per-opcode request counts, `ferry status`,
 * and the CLI's contract (format/mount refusals with one line on stderr,
 * URL forms, --block-size).
 */
#include "mount_util.h"

#include <dirent.h>
#include <fcntl.h>
#include <ftw.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <json-c/json.h>

#define MiB (1024LL * 1024)

TestSuite(stats, .init = fm_setup, .fini = fm_teardown, .timeout = 180);

static uint64_t delta(const struct fm_stats *a, const struct fm_stats *b, const char *name)
{
	return fm_stats_need(b, name) - fm_stats_need(a, name);
}

Test(stats, format_and_opcode_names)
{
	static struct fm_stats s;
	static const char *required[] = {
		"lookup", "forget",  "getattr",  "setattr",     "mknod",       "mkdir",
		"rmdir",  "unlink",  "symlink",  "readlink",    "link",        "open",
		"create", "read",    "write",    "flush",       "release",     "fsync",
		"opendir", "readdir", "readdirplus", "releasedir", "fsyncdir", "statfs",
		"setxattr", "getxattr", "listxattr", "removexattr", "fallocate", "lseek",
	};
	char missing[2048] = "";
	uint64_t v;

	fm_stats_read(&s);
	cr_assert_gt(s.n, 0, ".stats is empty");
	for (int i = 0; i < s.n; i++) {
		const char *p;

		for (p = s.e[i].name; *p; p++)
			cr_assert(((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '_'),
				  ".stats name '%s' is not lower-case [a-z0-9_]", s.e[i].name);
		if (strncmp(s.e[i].name, "fuse_requests_", 14) == 0)
			for (p = s.e[i].value; *p; p++)
				cr_assert(*p >= '0' && *p <= '9',
					  ".stats counter %s is not an integer: '%s'", s.e[i].name,
					  s.e[i].value);
		for (int j = 0; j < i; j++)
			cr_assert_str_neq(s.e[i].name, s.e[j].name, ".stats lists '%s' twice",
					  s.e[i].name);
	}
	for (size_t i = 0; i < sizeof(required) / sizeof(required[0]); i++) {
		char name[96];

		snprintf(name, sizeof(name), "fuse_requests_%s", required[i]);
		if (!fm_stats_get(&s, name, &v)) {
			strcat(missing, " ");
			strcat(missing, name);
		}
	}
	if (!fm_stats_get(&s, "fuse_requests_rename", &v) &&
	    !fm_stats_get(&s, "fuse_requests_rename2", &v))
		strcat(missing, " fuse_requests_rename(2)");
	cr_assert(missing[0] == '\0', ".stats lacks:%s", missing);
	/* mounting looked up and stat'ed at least the root */
	cr_assert_gt(fm_stats_need(&s, "fuse_requests_getattr") +
			     fm_stats_need(&s, "fuse_requests_lookup"),
		     0);
}

/* 64 MiB in 1 MiB write() calls: at most 70 FUSE WRITE requests, both for a
 * new file and for an overwrite of an existing (non-empty) file, which
 * takes the daemon write path. */
Test(stats, write_64MiB_costs_at_most_70_write_requests)
{
	static struct fm_stats before, after;
	static char block[MiB], got[MiB];
	uint64_t w;
	int fd;

	fm_stats_read(&before);
	fd = OK(open(mp("big"), O_CREAT | O_WRONLY | O_TRUNC, 0644));
	for (int i = 0; i < 64; i++) {
		memset(block, 'A' + i % 26, sizeof(block));
		cr_assert_eq(OK(write(fd, block, sizeof(block))), (ssize_t)sizeof(block));
	}
	OK(close(fd));
	fm_stats_read(&after);
	w = delta(&before, &after, "fuse_requests_write");
	cr_log_info("new file: 64 x 1 MiB write() cost %llu FUSE WRITE requests",
		    (unsigned long long)w);
	cr_assert_leq(w, 70, "new file: 64 x 1 MiB write() cost %llu FUSE WRITE requests",
		      (unsigned long long)w);

	fm_stats_read(&before);
	fd = OK(open(mp("big"), O_WRONLY));
	for (int i = 0; i < 64; i++) {
		memset(block, 'a' + i % 26, sizeof(block));
		fm_pwrite_all(fd, block, sizeof(block), (off_t)i * MiB);
	}
	OK(close(fd));
	fm_stats_read(&after);
	w = delta(&before, &after, "fuse_requests_write");
	cr_log_info("overwrite: 64 x 1 MiB pwrite() cost %llu FUSE WRITE requests",
		    (unsigned long long)w);
	cr_assert_leq(w, 70, "overwrite: 64 x 1 MiB pwrite() cost %llu FUSE WRITE requests",
		      (unsigned long long)w);

	/* and the bytes are right */
	fm_remount_cold();
	fd = OK(open(mp("big"), O_RDONLY));
	{
		struct stat st;

		OK(fstat(fd, &st));
		cr_assert_eq(st.st_size, 64 * MiB);
	}
	for (int i = 0; i < 64; i++) {
		fm_pread_all(fd, got, sizeof(got), (off_t)i * MiB);
		memset(block, 'a' + i % 26, sizeof(block));
		cr_assert(memcmp(got, block, sizeof(got)) == 0, "MiB %d differs", i);
	}
	OK(close(fd));
}

Test(stats, request_counts_follow_operations)
{
	static struct fm_stats before, after;
	char buf[16];
	struct stat st;
	int fd;

	fm_write_file(mp("f"), "content", 7);
	fm_stats_read(&before);
	for (int i = 0; i < 3; i++)
		FAILS(getxattr(mp("f"), "user.none", buf, sizeof(buf)), ENODATA);
	for (int i = 0; i < 5; i++)
		FAILS(stat(mp("nothing-%d", i), &st), ENOENT);
	for (int i = 0; i < 2; i++) {
		fd = OK(open(mp("new-%d", i), O_CREAT | O_EXCL | O_WRONLY, 0644));
		OK(close(fd));
	}
	OK(mkdir(mp("d"), 0755));
	OK(setxattr(mp("f"), "user.a", "1", 1, 0));
	fm_stats_read(&after);
	cr_assert_geq(delta(&before, &after, "fuse_requests_getxattr"), 3,
		      "3 getxattr calls, fuse_requests_getxattr +%llu",
		      (unsigned long long)delta(&before, &after, "fuse_requests_getxattr"));
	cr_assert_geq(delta(&before, &after, "fuse_requests_lookup"), 5,
		      "5 lookups of new names, fuse_requests_lookup +%llu",
		      (unsigned long long)delta(&before, &after, "fuse_requests_lookup"));
	cr_assert_geq(delta(&before, &after, "fuse_requests_create"), 2,
		      "2 creates, fuse_requests_create +%llu",
		      (unsigned long long)delta(&before, &after, "fuse_requests_create"));
	cr_assert_geq(delta(&before, &after, "fuse_requests_mkdir"), 1);
	cr_assert_geq(delta(&before, &after, "fuse_requests_setxattr"), 1);

	/* reads of committed data reach mountd */
	fd = OK(open(mp("f"), O_RDONLY));
	OK(posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED));
	fm_stats_read(&before);
	cr_assert_eq(OK(pread(fd, buf, sizeof(buf), 0)), 7);
	fm_stats_read(&after);
	OK(close(fd));
	cr_assert_geq(delta(&before, &after, "fuse_requests_read"), 1,
		      "an uncached read did not count a READ request");
	/* counters only grow */
	for (int i = 0; i < before.n; i++) {
		uint64_t a = strtoull(before.e[i].value, NULL, 10), b;

		if (strncmp(before.e[i].name, "fuse_requests_", 14) == 0 &&
		    fm_stats_get(&after, before.e[i].name, &b))
			cr_assert_geq(b, a, "%s went down: %llu -> %llu", before.e[i].name,
				      (unsigned long long)a, (unsigned long long)b);
	}
}

static bool refused(long rc, int e)
{
	return rc == -1 && (e == EPERM || e == EACCES || e == EROFS || e == EBUSY ||
			    e == EEXIST || e == EINVAL || e == EISDIR || e == ENOTDIR);
}

#define REFUSED(expr)                                                         \
	do {                                                                  \
		errno = 0;                                                    \
		long r_ = (long)(expr);                                       \
		int e_ = errno;                                               \
		cr_assert(refused(r_, e_), "%s on .stats: got %ld/%s, expected a refusal", \
			  #expr, r_, r_ == -1 ? fm_errname(e_) : "-");        \
		if (r_ >= 0 && strstr(#expr, "open"))                         \
			close((int)r_);                                       \
	} while (0)

struct linux_dirent64 {
	uint64_t d_ino;
	int64_t d_off;
	unsigned short d_reclen;
	unsigned char d_type;
	char d_name[];
};

Test(stats, stats_file_hidden_and_read_only)
{
	struct stat st;
	char buf[8192], *before;
	struct timespec ts[2] = { { 1, 0 }, { 1, 0 } };
	DIR *d;
	struct dirent *de;
	int fd, n = 0;
	long len;

	fm_write_file(mp("visible"), "x", 1);
	OK(stat(mp(".stats"), &st));
	cr_assert(S_ISREG(st.st_mode), ".stats mode %o", st.st_mode);
	cr_assert_eq(st.st_mode & 0222, 0, ".stats has write bits: %o", st.st_mode & 07777);

	/* hidden from readdir(3) and from raw getdents64 */
	d = opendir(fm.mnt);
	cr_assert_not_null(d);
	while ((de = readdir(d))) {
		cr_assert_str_neq(de->d_name, ".stats", ".stats is listed by readdir");
		n += strcmp(de->d_name, "visible") == 0;
	}
	closedir(d);
	cr_assert_eq(n, 1);
	fd = OK(open(fm.mnt, O_RDONLY | O_DIRECTORY));
	while ((len = syscall(SYS_getdents64, fd, buf, sizeof(buf))) > 0) {
		for (long pos = 0; pos < len;) {
			struct linux_dirent64 *e = (void *)(buf + pos);

			cr_assert_str_neq(e->d_name, ".stats", ".stats is listed by getdents64");
			pos += e->d_reclen;
		}
	}
	OK(close(fd));

	before = fm_slurp(mp(".stats"));
	cr_assert_not_null(before);
	REFUSED(open(mp(".stats"), O_WRONLY));
	REFUSED(open(mp(".stats"), O_RDWR));
	REFUSED(open(mp(".stats"), O_WRONLY | O_TRUNC));
	REFUSED(open(mp(".stats"), O_WRONLY | O_APPEND));
	REFUSED(open(mp(".stats"), O_CREAT | O_EXCL | O_WRONLY, 0644));
	REFUSED(truncate(mp(".stats"), 0));
	REFUSED(unlink(mp(".stats")));
	REFUSED(rename(mp(".stats"), mp("moved")));
	REFUSED(rename(mp("visible"), mp(".stats")));
	REFUSED(link(mp(".stats"), mp("hard")));
	REFUSED(link(mp("visible"), mp(".stats")));
	REFUSED(symlink("x", mp(".stats")));
	REFUSED(mkdir(mp(".stats"), 0755));
	REFUSED(mknod(mp(".stats"), S_IFIFO | 0644, 0));
	REFUSED(rmdir(mp(".stats")));
	REFUSED(chmod(mp(".stats"), 0666));
	REFUSED(chown(mp(".stats"), 1, 1));
	REFUSED(utimensat(AT_FDCWD, mp(".stats"), ts, 0));
	REFUSED(setxattr(mp(".stats"), "user.x", "1", 1, 0));
	OK(stat(mp(".stats"), &st));
	cr_assert(S_ISREG(st.st_mode));
	OK(stat(mp("visible"), &st));
	FAILS(stat(mp("moved"), &st), ENOENT);
	FAILS(stat(mp("hard"), &st), ENOENT);
	{
		char *again = fm_slurp(mp(".stats"));

		cr_assert_not_null(again);
		cr_assert_gt(strlen(again), 0);
		free(again);
	}
	free(before);

	/* only the root has one: elsewhere the name is an ordinary name */
	OK(mkdir(mp("sub"), 0755));
	FAILS(stat(mp("sub/.stats"), &st), ENOENT);
	fm_write_file(mp("sub/.stats"), "mine", 4);
	OK(stat(mp("sub/.stats"), &st));
	cr_assert_eq(st.st_size, 4);
}

Test(stats, ferry_status_text_and_json)
{
	const char *argv[] = { fm_bin("ferry"), "status", fm.mnt, NULL };
	const char *jargv[] = { fm_bin("ferry"), "status", "--json", fm.mnt, NULL };
	const char *bad[] = { fm_bin("ferry"), "status", fm.dir, NULL };
	char *out, *err, *save = NULL, *line;
	int rc, lines = 0;

	static struct fm_stats st;
	char needle[160];

	fm_stats_read(&st);
	rc = fm_run(argv, sp("out"), sp("err"), 30);
	out = fm_slurp(sp("out"));
	err = fm_slurp(sp("err"));
	cr_assert_eq(rc, 0, "ferry status: exit %d, stderr: %s", rc, err);
	for (int i = 0; i < st.n; i++) {
		snprintf(needle, sizeof(needle), "%s: ", st.e[i].name);
		cr_assert_not_null(strstr(out, needle), "ferry status lacks '%s' of .stats",
				   st.e[i].name);
	}
	for (line = strtok_r(out, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		char *colon = strstr(line, ": ");

		cr_assert(colon && colon > line, "ferry status line is not `key: value`: '%s'", line);
		lines++;
	}
	cr_assert_geq(lines, st.n, "ferry status printed %d lines, .stats has %d", lines, st.n);
	free(out);
	free(err);

	rc = fm_run(jargv, sp("out"), sp("err"), 30);
	out = fm_slurp(sp("out"));
	err = fm_slurp(sp("err"));
	cr_assert_eq(rc, 0, "ferry status --json: exit %d, stderr: %s", rc, err);
	{
		char *s = out, *e = out + strlen(out);

		while (*s == ' ' || *s == '\n' || *s == '\t')
			s++;
		while (e > s && (e[-1] == ' ' || e[-1] == '\n' || e[-1] == '\t'))
			e--;
		cr_assert(*s == '{' && e > s && e[-1] == '}', "ferry status --json is not an "
			  "object: '%s'", out);
		struct json_object *o = json_tokener_parse(out), *v;

		cr_assert(o && json_object_is_type(o, json_type_object), "not JSON: '%s'", out);
		for (int i = 0; i < st.n; i++) {
			const char *want = st.e[i].value;

			cr_assert(json_object_object_get_ex(o, st.e[i].name, &v), "--json lacks %s of .stats",
				  st.e[i].name);
			/* Counters move between the two reads: their type, and strings whole. */
			if (want[0] && strspn(want, "0123456789") == strlen(want))
				cr_assert(json_object_is_type(v, json_type_int), "%s is not a number in --json",
					  st.e[i].name);
			else
				cr_assert(json_object_is_type(v, json_type_string) &&
						  !strcmp(json_object_get_string(v), want),
					  "%s: --json has '%s', .stats '%s'", st.e[i].name,
					  json_object_get_string(v), want);
		}
		json_object_put(o);
	}
	free(out);
	free(err);

	/* not a ferry mount: one line on stderr, non-zero */
	rc = fm_run(bad, sp("out"), sp("err"), 30);
	err = fm_slurp(sp("err"));
	cr_assert_neq(rc, 0, "ferry status on a plain directory exited 0");
	cr_assert_eq(fm_count_lines(err), 1, "stderr should be one line: '%s'", err);
	free(err);
}

/* ---- CLI contract --------------------------------------------------------- */

static void setup_unmounted(void)
{
	fm_setup_opts(&(struct fm_opts){ .no_mount = true });
}

TestSuite(cli, .init = setup_unmounted, .fini = fm_teardown, .timeout = 120);

/* Runs argv; asserts a non-zero exit with exactly one line on stderr. */
static void expect_refusal(const char *const argv[], const char *what)
{
	int rc = fm_run(argv, sp("out"), sp("err"), 60);
	char *err = fm_slurp(sp("err"));

	cr_assert(rc != 0 && rc < 128, "%s: exit %d, expected a clean non-zero exit; stderr: %s",
		  what, rc, err ? err : "");
	cr_assert_eq(fm_count_lines(err), 1, "%s: stderr has %d lines, expected one: '%s'", what,
		     fm_count_lines(err), err ? err : "");
	cr_assert_gt(strlen(err), 5, "%s: stderr is empty", what);
	free(err);
}

static void expect_success(const char *const argv[], const char *what)
{
	int rc = fm_run(argv, sp("out"), sp("err"), 60);
	char *err = fm_slurp(sp("err"));

	cr_assert_eq(rc, 0, "%s: exit %d; stderr: %s", what, rc, err ? err : "");
	free(err);
}

Test(cli, format_refuses_existing_volume_unless_forced)
{
	if (fm.voldir[0])
		cr_skip_test("ferry format of a directory volume; this volume is on PostgreSQL");
	const char *again[] = { fm_bin("ferry"), "format", fm.vol, NULL };
	const char *force[] = { fm_bin("ferry"), "format", "--force", fm.vol, NULL };
	struct stat st;

	expect_refusal(again, "ferry format over an existing volume");
	fm_mount();
	fm_write_file(mp("old"), "old", 3);
	fm_umount();
	expect_success(force, "ferry format --force");
	/* The replaced volume's staging directory went with it: the new
	 * volume takes it (staging_owner.h). */
	fm_mount();
	FAILS(stat(mp("old"), &st), ENOENT);
	fm_write_file(mp("new"), "new", 3);
	fm_remount_cold();
	OK(stat(mp("new"), &st));
}

/* Formatting again under a live mount would pull its metadata and its
 * staging files from under it. */
Test(cli, format_refuses_a_mounted_volume)
{
	if (fm.voldir[0])
		cr_skip_test("ferry format of a directory volume; this volume is on PostgreSQL");
	const char *force[] = { fm_bin("ferry"), "format", "--force", fm.vol, NULL };

	fm_mount();
	fm_write_file(mp("kept"), "kept", 4);
	expect_refusal(force, "ferry format --force of a mounted volume");
	char *err = fm_slurp(sp("err"));
	cr_assert(err && strstr(err, "is mounted on this node"), "why: %s", err ? err : "");
	free(err);
	fm_expect_content(mp("kept"), "kept", 4);
	fm_remount_cold();
	fm_expect_content(mp("kept"), "kept", 4);
}

/* SQLite files in one directory share its staging/: formatting one of
 * them again leaves the others' staging files (and record) alone. */
Test(cli, format_force_leaves_another_volumes_staging_directory)
{
	if (fm.voldir[0])
		cr_skip_test("ferry format of a directory volume; this volume is on PostgreSQL");
	char *url = NULL, *record = strdup(sp("vol/staging/.volume"));

	cr_assert(record && asprintf(&url, "sqlite://%s/other.db", fm.vol) > 0);
	const char *format[] = { fm_bin("ferry"), "format", url, NULL };
	const char *force[] = { fm_bin("ferry"), "format", "--force", url, NULL };

	fm_mount(); /* the fixture's volume claims vol/staging */
	fm_write_file(mp("kept"), "kept", 4);
	fm_umount();
	char *owner = fm_slurp(record);
	cr_assert(owner && strlen(owner) == 37, "record: %s", owner ? owner : "(none)");
	expect_success(format, "ferry format of a second volume in the directory");
	expect_success(force, "ferry format --force of the second volume");
	char *after = fm_slurp(record);
	cr_assert(after && strcmp(after, owner) == 0, "the first volume's record became '%s'",
		  after ? after : "(none)");
	fm_mount();
	fm_expect_content(mp("kept"), "kept", 4);
	free(owner);
	free(after);
	free(record);
	free(url);
}

Test(cli, mount_errors_are_one_line)
{
	/* own copies: mp()/sp() results are reused after 16 calls */
	char *nodir = strdup(sp("no-such-dir")), *notvol = strdup(sp("not-a-volume"));
	char *volbad = strdup(sp("vol-bad")), *mnt2 = strdup(sp("mnt2"));
	char *cache2 = strdup(sp("cache2")), *cache3 = strdup(sp("cache3"));
	char *vol2 = strdup(sp("vol2"));
	const char *nomnt[] = { fm_bin("ferry"), "mount", "--cache-dir", fm.cache, fm.vol,
				nodir, NULL };
	const char *novol[] = { fm_bin("ferry"), "mount", "--cache-dir", fm.cache, notvol,
				fm.mnt, NULL };
	const char *badurl[] = { fm_bin("ferry"), "format", "--storage", "bogus://x/y", volbad,
				 NULL };
	const char *twice[] = { fm_bin("ferry"), "mount", "--cache-dir", cache2, fm.vol, mnt2,
				NULL };
	const char *fmt2[] = { fm_bin("ferry"), "format", vol2, NULL };
	const char *busy[] = { fm_bin("ferry"), "mount", "--cache-dir", cache3, vol2, fm.mnt,
			       NULL };

	OK(mkdir(notvol, 0755));
	OK(mkdir(volbad, 0755));
	OK(mkdir(mnt2, 0755));
	OK(mkdir(cache2, 0700));
	OK(mkdir(cache3, 0700));
	OK(mkdir(vol2, 0700));

	expect_refusal(nomnt, "ferry mount on a missing mountpoint");
	cr_assert(!fm_is_mounted(nodir));
	expect_refusal(novol, "ferry mount of a directory that is no volume");
	cr_assert(!fm_is_mounted(fm.mnt), "something got mounted from a non-volume");
	expect_refusal(badurl, "ferry format --storage bogus://");

	fm_mount();
	fm_write_file(mp("f"), "x", 1);
	expect_refusal(twice, "a second ferry mount of a mounted volume");
	cr_assert(!fm_is_mounted(mnt2), "the volume got mounted twice");
	expect_success(fmt2, "ferry format vol2");
	expect_refusal(busy, "ferry mount onto a busy mountpoint");
	{
		size_t len;
		char *c = fm_read_file(mp("f"), &len);

		cr_assert(len == 1 && c[0] == 'x', "the first mount no longer serves its volume");
		free(c);
	}
	free(nodir);
	free(notvol);
	free(volbad);
	free(mnt2);
	free(cache2);
	free(cache3);
	free(vol2);
}

/* The on|off|auto options refuse any other value by name, before anything
 * is mounted, and a valid one is taken (the mount serves). */
Test(cli, mount_refuses_a_bad_on_off_auto_value)
{
	static const char *const bad[] = { "passthrough=maybe", "writeback=", "io_uring=ON",
					   "passthrough=onn" };
	char o[64];
	const char *argv[] = { fm_bin("ferry"), "mount", "--cache-dir", fm.cache, "-o", o,
			       fm.vol, fm.mnt, NULL };

	for (size_t k = 0; k < sizeof(bad) / sizeof(bad[0]); k++) {
		snprintf(o, sizeof(o), "%s", bad[k]);
		expect_refusal(argv, bad[k]);
		char *err = fm_slurp(sp("err"));
		cr_assert(err && strstr(err, bad[k]) && strstr(err, "takes on, off or auto"),
			  "-o %s: the refusal does not name the option: %s", bad[k], err ? err : "");
		free(err);
		cr_assert(!fm_is_mounted(fm.mnt), "-o %s mounted", bad[k]);
	}
	snprintf(o, sizeof(o), "passthrough=off,writeback=on,io_uring=off");
	expect_success(argv, o);
	cr_assert(fm_is_mounted(fm.mnt));
	fm_write_file(mp("f"), "x", 1);
	cr_assert_eq(fm_stat("passthrough_active"), 0, "passthrough=off was not taken");
	cr_assert_eq(fm_stat("writeback_cache"), 1, "writeback=on was not taken");
	char *t = fm_slurp(mp(".stats"));
	cr_assert(t && strstr(t, "\nio_uring_off_reason mount_option_off\n"),
		  "io_uring=off was not taken");
	free(t);
}

static int n_obj;
static long long max_obj_size, max_obj_named;

/* Objects are chunks/<id/1e6>/<id/1e3>/<id>_<index>_<size> (DESIGN.md). */
static int count_obj(const char *path, const struct stat *st, int type, struct FTW *ftw)
{
	const char *base = path + ftw->base, *us = strrchr(base, '_');

	if (type == FTW_F) {
		n_obj++;
		if (st->st_size > max_obj_size)
			max_obj_size = st->st_size;
		if (us && strtoll(us + 1, NULL, 10) > max_obj_named)
			max_obj_named = strtoll(us + 1, NULL, 10);
	}
	return 0;
}

Test(cli, sqlite_url_file_storage_and_block_size)
{
	char meta[PATH_MAX], storage[PATH_MAX];
	const char *fmt[8];
	static char data[5 * MiB + 3];
	uint64_t rs = 99;

	/* a second volume given as URLs, with 1 MiB blocks */
	OK(mkdir(sp("meta"), 0700));
	OK(mkdir(sp("objs"), 0700));
	snprintf(meta, sizeof(meta), "sqlite://%s/meta/meta.db", fm.dir);
	snprintf(storage, sizeof(storage), "file://%s/objs", fm.dir);
	fmt[0] = fm_bin("ferry");
	fmt[1] = "format";
	fmt[2] = "--storage";
	fmt[3] = storage;
	fmt[4] = "--block-size";
	fmt[5] = "1048576";
	fmt[6] = meta;
	fmt[7] = NULL;
	expect_success(fmt, "ferry format sqlite:// --storage file:// --block-size 1048576");
	{
		struct stat st;

		OK(stat(sp("meta/meta.db"), &st));
	}
	snprintf(fm.vol, sizeof(fm.vol), "%s", meta);
	fm_mount();
	fm_fill_random(&rs, data, sizeof(data));
	fm_write_file(mp("f"), data, sizeof(data));
	fm_write_file(sp("model"), data, sizeof(data));
	fm_remount_cold();
	fm_assert_same_content(mp("f"), sp("model"));
	fm_umount();
	n_obj = 0;
	max_obj_size = 0;
	max_obj_named = 0;
	nftw(sp("objs"), count_obj, 16, FTW_PHYS);
	cr_assert_geq(n_obj, 6, "5 MiB in 1 MiB blocks made %d objects", n_obj);
	cr_assert_leq(max_obj_named, MiB, "an object named with %lld bytes with --block-size "
		      "1048576", max_obj_named);
	/* a checksum trailer may add a few bytes */
	cr_assert_leq(max_obj_size, MiB + 64, "an object of %lld bytes with --block-size 1048576",
		      max_obj_size);
}

/* `out=$(ferry mount ...)` returns: once ferry mount has, nothing it
 * started (ferry-mountd, ferry-reconciler) still holds its stdout. */
Test(stats, mount_leaves_the_callers_stdout_alone)
{
	struct pollfd pf;
	char buf[512];
	int p[2], st = 0;
	pid_t pid;

	fm_umount();
	cr_assert_eq(pipe(p), 0);
	pid = fork();
	cr_assert(pid >= 0);
	if (pid == 0) {
		dup2(p[1], STDOUT_FILENO);
		close(p[0]);
		close(p[1]);
		execl(fm_bin("ferry"), "ferry", "mount", "--cache-dir", fm.cache, "-o",
		      fm_mount_options(), fm.vol, fm.mnt, (char *)NULL);
		_exit(127);
	}
	close(p[1]);
	cr_assert_eq(waitpid(pid, &st, 0), pid);
	fm.mounted = fm_is_mounted(fm.mnt);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "ferry mount failed");
	pf = (struct pollfd){ .fd = p[0], .events = POLLIN };
	for (;;) {
		int r = poll(&pf, 1, 10000);
		cr_assert_gt(r, 0, "the daemons still hold ferry mount's stdout 10 s after it "
			     "returned");
		ssize_t n = read(p[0], buf, sizeof(buf));
		cr_assert_geq(n, 0);
		if (n == 0)
			break; /* EOF: every writer is gone */
	}
	close(p[0]);
	cr_assert(fm.mounted);
	fm_umount();
}

/* The liveness probe (deploy/k8s): `ferry status --timeout` answers 0 for a
 * serving daemon and 3, on time, for one that does not answer (stopped
 * here; wedged in production), and 0 again once it serves. */
Test(stats, status_timeout_notices_a_daemon_that_does_not_answer)
{
	const char *argv[] = { fm_bin("ferry"), "status", "--timeout", "1", fm.mnt, NULL };
	pid_t pids[8];
	struct timespec a, b;

	cr_assert_eq(fm_run(argv, NULL, NULL, 30), 0);
	cr_assert_eq(fm_daemon_pids("ferry-mountd", pids, 8), 1);
	cr_assert_eq(kill(pids[0], SIGSTOP), 0);
	clock_gettime(CLOCK_MONOTONIC, &a);
	int st = fm_run(argv, NULL, sp("status.err"), 30);
	clock_gettime(CLOCK_MONOTONIC, &b);
	kill(pids[0], SIGCONT);
	cr_assert_eq(st, 3, "ferry status on a stopped daemon: %d", st);
	char *err = fm_slurp(sp("status.err"));
	cr_assert(err && strstr(err, "gave no answer"), "%s", err ? err : "");
	free(err);
	/* Generous: it is the probe's own clock that matters, not a benchmark. */
	cr_assert_lt(b.tv_sec - a.tv_sec, 15, "took %ld s", (long)(b.tv_sec - a.tv_sec));
	for (int t = 0; t < 100 && fm_run(argv, NULL, NULL, 30) != 0; t++)
		usleep(100000);
	cr_assert_eq(fm_run(argv, NULL, NULL, 30), 0);
}

/* Lists d whole, as rm -rf and du do, then stats every entry; returns the
 * LOOKUP requests that cost. */
static uint64_t lookups_of_a_walk(const char *d, int nfiles)
{
	struct fm_stats before, after;
	struct dirent *de;
	int seen = 0, dfd;
	DIR *dir;

	fm_stats_read(&before);
	dir = opendir(d);
	cr_assert_not_null(dir, "opendir %s: %s", d, strerror(errno));
	char(*names)[NAME_MAX + 1] = calloc((size_t)nfiles, sizeof(*names));
	cr_assert_not_null(names);
	while ((de = readdir(dir)) != NULL) {
		if (de->d_name[0] == '.')
			continue;
		cr_assert_lt(seen, nfiles);
		snprintf(names[seen++], sizeof(names[0]), "%s", de->d_name);
	}
	cr_assert_eq(seen, nfiles);
	dfd = dirfd(dir);
	for (int i = 0; i < seen; i++) {
		struct stat st;

		cr_assert_eq(fstatat(dfd, names[i], &st, AT_SYMLINK_NOFOLLOW), 0, "stat %s: %s",
			     names[i], strerror(errno));
		cr_assert(S_ISREG(st.st_mode) && st.st_size == 1);
	}
	closedir(dir);
	free(names);
	fm_stats_read(&after);
	return delta(&before, &after, "fuse_requests_lookup");
}

/* -o readdirplus: "always" (the default) lists each entry with its
 * attributes, so a walk that reads a directory whole and then stats every
 * entry asks no LOOKUP; "auto" leaves it to the kernel, which lists with
 * attributes only at the start; anything else is refused. */
Test(cli, a_listing_carries_the_attributes_a_walk_needs)
{
	const int n = 1000;
	char o[64], d[PATH_MAX];
	const char *argv[] = { fm_bin("ferry"), "mount", "--cache-dir", fm.cache, "-o", o,
			       fm.vol, fm.mnt, NULL };
	uint64_t always, guessed;

	snprintf(o, sizeof(o), "readdirplus=sometimes");
	expect_refusal(argv, o);
	char *err = fm_slurp(sp("err"));
	cr_assert(err && strstr(err, "readdirplus takes always or auto"), "%s", err ? err : "");
	free(err);
	cr_assert(!fm_is_mounted(fm.mnt));

	fm_mount();
	cr_assert_lt(snprintf(d, sizeof(d), "%s/walk", fm.mnt), (int)sizeof(d));
	cr_assert_eq(mkdir(d, 0755), 0);
	for (int i = 0; i < n; i++) {
		char p[PATH_MAX];

		cr_assert_lt(snprintf(p, sizeof(p), "%s/f%05d", d, i), (int)sizeof(p));
		fm_write_file(p, "x", 1);
	}
	/* A new mount: the kernel knows no name under walk/. */
	fm_remount();
	always = lookups_of_a_walk(d, n);
	fm_umount();
	snprintf(o, sizeof(o), "readdirplus=auto");
	expect_success(argv, o);
	fm.mounted = true;
	guessed = lookups_of_a_walk(d, n);
	cr_assert_leq(always, 2, "readdirplus=always: %llu LOOKUPs for %d listed names",
		      (unsigned long long)always, n);
	cr_assert_geq(guessed, (uint64_t)n / 2, "readdirplus=auto: only %llu LOOKUPs for %d names",
		      (unsigned long long)guessed, n);
}

/* The names in d, sorted into *out (malloc'ed, the caller's): how many. */
static int names_of(const char *d, char (**out)[NAME_MAX + 1])
{
	char(*names)[NAME_MAX + 1] = NULL;
	int n = 0, cap = 0;
	struct dirent *de;
	DIR *dir = opendir(d);

	cr_assert_not_null(dir, "opendir %s: %s", d, strerror(errno));
	while ((de = readdir(dir)) != NULL) {
		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		if (n == cap) {
			cap = cap ? cap * 2 : 64;
			names = realloc(names, (size_t)cap * sizeof(*names));
			cr_assert_not_null(names);
		}
		snprintf(names[n++], sizeof(names[0]), "%s", de->d_name);
	}
	closedir(dir);
	if (n > 0)
		qsort(names, (size_t)n, sizeof(*names), (int (*)(const void *, const void *))strcmp);
	*out = names;
	return n;
}

static bool has_name(char (*names)[NAME_MAX + 1], int n, const char *name)
{
	return n > 0 && bsearch(name, names, (size_t)n, sizeof(*names),
				(int (*)(const void *, const void *))strcmp) != NULL;
}

/* LISTING requests (READDIR and READDIRPLUS) since before. */
static uint64_t listings_since(const struct fm_stats *before)
{
	struct fm_stats now;

	fm_stats_read(&now);
	return delta(before, &now, "fuse_requests_readdir") +
	       delta(before, &now, "fuse_requests_readdirplus");
}

/* dir/name into p (PATH_MAX bytes). */
static void path_in(char *p, const char *dir, const char *name)
{
	cr_assert_lt(snprintf(p, PATH_MAX, "%s/%s", dir, name), PATH_MAX);
}

/* A directory listed once is listed again from the kernel's cache, with no
 * request, and every change made to it shows in the next listing: a
 * create, an unlink, a rename within it and into it from elsewhere, a
 * hard link, a mkdir. */
Test(stats, a_listing_is_kept_until_the_directory_changes)
{
	char d[PATH_MAX], other[PATH_MAX], p[PATH_MAX], q[PATH_MAX];
	char(*names)[NAME_MAX + 1];
	struct fm_stats before;
	int n;

	cr_assert_lt(snprintf(d, sizeof(d), "%s/listed", fm.mnt), (int)sizeof(d));
	cr_assert_lt(snprintf(other, sizeof(other), "%s/other", fm.mnt), (int)sizeof(other));
	cr_assert_eq(mkdir(d, 0755), 0);
	cr_assert_eq(mkdir(other, 0755), 0);
	for (int i = 0; i < 100; i++) {
		cr_assert_lt(snprintf(p, sizeof(p), "%s/f%03d", d, i), (int)sizeof(p));
		fm_write_file(p, "x", 1);
	}
	cr_assert_lt(snprintf(p, sizeof(p), "%s/moved", other), (int)sizeof(p));
	fm_write_file(p, "y", 1);
	n = names_of(d, &names);
	cr_assert_eq(n, 100);
	free(names);

	fm_stats_read(&before);
	n = names_of(d, &names);
	cr_assert_eq(n, 100);
	free(names);
	cr_assert_eq(listings_since(&before), 0, "an unchanged directory was listed again");

	/* Each change, then a listing that shows it. */
	struct {
		const char *what;
		int n;
		const char *present, *absent;
	} step[] = {
		{ "create", 101, "new", NULL },  { "unlink", 100, "new", "f000" },
		{ "rename", 100, "g001", "f001" }, { "rename in", 101, "moved", NULL },
		{ "link", 102, "hard", NULL },   { "mkdir", 103, "sub", NULL },
	};
	for (size_t k = 0; k < sizeof(step) / sizeof(step[0]); k++) {
		switch (k) {
		case 0:
			path_in(p, d, "new");
			fm_write_file(p, "z", 1);
			break;
		case 1:
			path_in(p, d, "f000");
			cr_assert_eq(unlink(p), 0);
			break;
		case 2:
			path_in(p, d, "f001");
			path_in(q, d, "g001");
			cr_assert_eq(rename(p, q), 0);
			break;
		case 3:
			path_in(p, other, "moved");
			path_in(q, d, "moved");
			cr_assert_eq(rename(p, q), 0);
			break;
		case 4:
			path_in(p, d, "f002");
			path_in(q, d, "hard");
			cr_assert_eq(link(p, q), 0);
			break;
		case 5:
			path_in(p, d, "sub");
			cr_assert_eq(mkdir(p, 0755), 0);
			break;
		}
		n = names_of(d, &names);
		cr_assert_eq(n, step[k].n, "after the %s: %d names, expected %d", step[k].what, n,
			     step[k].n);
		cr_assert(has_name(names, n, step[k].present), "after the %s: no %s", step[k].what,
			  step[k].present);
		cr_assert(!step[k].absent || !has_name(names, n, step[k].absent),
			  "after the %s: %s still listed", step[k].what, step[k].absent);
		free(names);
	}
	/* The directory it moved out of, too. */
	n = names_of(other, &names);
	cr_assert_eq(n, 0, "%d names left in other/", n);
	free(names);
}
