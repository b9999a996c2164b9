/*
 * Bad input through a real mount: damaged and missing objects, a damaged
 * metadata row, an object store that goes away. Each must give EIO on the
 * file concerned, with a log line naming it, never a crash and never a
 * wrong byte; the rest of the mount keeps working.
 */
#include "mount_util.h"

#include <dirent.h>
#include <fcntl.h>
#include <ftw.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

TestSuite(faults, .init = fm_setup, .fini = fm_teardown, .timeout = 180);

#define MiB (1024 * 1024)

static char found[PATH_MAX];
static const char *want_part;

static int find_object(const char *path, const struct stat *st, int type, struct FTW *f)
{
	size_t n = strlen(path), m = strlen(want_part);

	if (type == FTW_F && n >= m && strcmp(path + n - m, want_part) == 0) {
		snprintf(found, sizeof(found), "%s", path);
		return 1;
	}
	return 0;
}

/* Path of the object whose name ends with part (e.g. "_2097152": its
 * data length, unique within a test). */
static const char *object_path(const char *part)
{
	found[0] = '\0';
	want_part = part;
	nftw(fm_store_dir(), find_object, 8, FTW_PHYS);
	cr_assert(found[0], "no object matching %s under %s", part, fm_store_dir());
	return found;
}

/* Mounts again (after the test changed the volume while unmounted) with a
 * new, empty read cache, so every byte comes from the object store. */
static void mount_cold(void)
{
	fm.n_cache++;
	snprintf(fm.cache, sizeof(fm.cache), "%s/cache-%d", fm.dir, fm.n_cache);
	cr_assert(mkdir(fm.cache, 0700) == 0, "mkdir %s: %s", fm.cache, strerror(errno));
	fm_mount();
}

static void write_pattern(const char *path, size_t len, unsigned char *buf)
{
	uint64_t st = 42;

	fm_fill_random(&st, buf, len);
	fm_write_file(path, buf, len);
}

static bool log_has(const char *needle)
{
	char *log = fm_slurp(fm_mountd_log_path());
	bool has = log && strstr(log, needle);

	free(log);
	return has;
}

/* Reads the whole file; returns 0 or the errno of the failing read. Every
 * byte that was read must match want. */
static int read_checked(const char *path, const unsigned char *want, size_t len)
{
	unsigned char *buf = malloc(MiB);
	size_t at = 0;
	int fd = OK(open(path, O_RDONLY)), err = 0;

	cr_assert(buf);
	while (at < len) {
		ssize_t n = pread(fd, buf, MiB, (off_t)at);
		if (n < 0) {
			err = errno;
			break;
		}
		if (n == 0)
			break;
		cr_assert(memcmp(buf, want + at, (size_t)n) == 0, "wrong bytes at %zu", at);
		at += (size_t)n;
	}
	close(fd);
	free(buf);
	return err;
}

Test(faults, damaged_object_is_eio_and_named)
{
	size_t len = 6 * MiB; /* objects 1_0_4194304 and 1_1_2097152 */
	unsigned char *data = malloc(len);
	const char *obj;
	FILE *f;

	write_pattern(mp("f"), len, data);
	fm_write_file(mp("other"), "still fine", 10);
	fm_umount();
	obj = object_path("_2097152");
	/* Flip one byte in the middle: same length, wrong content. */
	f = fopen(obj, "r+");
	cr_assert(f);
	fseek(f, 1000, SEEK_SET);
	int c = fgetc(f);
	fseek(f, 1000, SEEK_SET);
	fputc(c ^ 0x55, f);
	fclose(f);
	mount_cold();

	cr_assert_eq(read_checked(mp("f"), data, len), EIO);
	/* The intact first object still reads right. */
	int fd = OK(open(mp("f"), O_RDONLY));
	unsigned char *buf = malloc(MiB);
	cr_assert_eq(OK(pread(fd, buf, MiB, 0)), MiB);
	cr_assert(memcmp(buf, data, MiB) == 0);
	close(fd);
	char line[PATH_MAX + 32];
	snprintf(line, sizeof(line), "%s is damaged", strstr(obj, "chunks/"));
	cr_assert(log_has(line), "no log line names the object: %s", line);
	size_t olen;
	char *other = fm_read_file(mp("other"), &olen);
	cr_assert(olen == 10 && memcmp(other, "still fine", 10) == 0);
	free(other);
	free(buf);
	free(data);
}

Test(faults, truncated_and_missing_objects_are_eio)
{
	size_t len = 5 * MiB;
	unsigned char *data = malloc(len);

	write_pattern(mp("t"), len, data);
	fm_umount();
	char damaged[PATH_MAX + 32], missing[PATH_MAX + 32];
	snprintf(damaged, sizeof(damaged), "%s is damaged", strstr(object_path("_1048576"), "chunks/"));
	cr_assert_eq(truncate(found, 100), 0);
	snprintf(missing, sizeof(missing), "%s is missing", strstr(object_path("_4194304"), "chunks/"));
	cr_assert_eq(unlink(found), 0);
	mount_cold();
	cr_assert_eq(read_checked(mp("t"), data, len), EIO);
	cr_assert(log_has(missing), "no log line: %s", missing);
	/* Reading only the truncated second object: EIO as well. */
	int fd = OK(open(mp("t"), O_RDONLY));
	char b[16];
	FAILS(pread(fd, b, sizeof(b), 4 * MiB + 10), EIO);
	close(fd);
	cr_assert(log_has(damaged), "no log line: %s", damaged);
	free(data);
}

Test(faults, damaged_metadata_row_is_eio)
{
	if (fm.voldir[0])
		cr_skip_test("it damages or locks meta.db; this volume's metadata is on PostgreSQL");
	sqlite3 *db;
	char *err = NULL;
	struct stat st;

	fm_write_file(mp("victim"), "x", 1);
	fm_write_file(mp("bystander"), "y", 1);
	fm_umount();
	cr_assert_eq(sqlite3_open(sp("vol/meta.db"), &db), SQLITE_OK);
	/* A mode with no valid file type. */
	int rc = sqlite3_exec(db,
			      "UPDATE inode SET mode = 0 WHERE ino = (SELECT ino FROM dentry "
			      "WHERE name = CAST('victim' AS BLOB) OR name = 'victim')",
			      NULL, NULL, &err);
	cr_assert_eq(rc, SQLITE_OK, "sqlite: %s", err ? err : "?");
	cr_assert_eq(sqlite3_changes(db), 1, "the damaging UPDATE matched no row");
	sqlite3_close(db);
	fm_mount();
	FAILS(stat(mp("victim"), &st), EIO);
	FAILS(open(mp("victim"), O_RDONLY), EIO);
	OK(stat(mp("bystander"), &st));
	cr_assert_eq(st.st_size, 1);
	/* Listing the directory must not crash the daemon either. */
	DIR *d = opendir(fm.mnt);
	cr_assert(d);
	while (readdir(d))
		;
	closedir(d);
	OK(stat(mp("bystander"), &st));
}

/* Another process holds the metadata database's write lock for seconds
 * (a backup, a long query): operations wait for it, as a local file system
 * waits for its journal, and then succeed; nothing is lost or half done. */
static void *hold_write_lock(void *arg)
{
	sqlite3 *db = arg;

	sleep(4);
	sqlite3_exec(db, "COMMIT", NULL, NULL, NULL);
	return NULL;
}

Test(faults, metadata_locked_for_seconds_waits)
{
	if (fm.voldir[0])
		cr_skip_test("it damages or locks meta.db; this volume's metadata is on PostgreSQL");
	sqlite3 *db;
	pthread_t t;
	struct stat st;

	fm_write_file(mp("before"), "b", 1);
	cr_assert_eq(sqlite3_open(sp("vol/meta.db"), &db), SQLITE_OK);
	sqlite3_busy_timeout(db, 30000);
	cr_assert_eq(sqlite3_exec(db, "BEGIN IMMEDIATE", NULL, NULL, NULL), SQLITE_OK,
		     "%s", sqlite3_errmsg(db));
	cr_assert_eq(pthread_create(&t, NULL, hold_write_lock, db), 0);
	fm_write_file(mp("during"), "d", 1);
	OK(mkdir(mp("dir"), 0755));
	OK(rename(mp("before"), mp("renamed")));
	pthread_join(t, NULL);
	sqlite3_close(db);
	fm_remount();
	OK(stat(mp("during"), &st));
	cr_assert_eq(st.st_size, 1);
	OK(stat(mp("dir"), &st));
	OK(stat(mp("renamed"), &st));
	FAILS(stat(mp("before"), &st), ENOENT);
}

/* A private S3 server, so it can be stopped and started again. */
static struct fm_s3 srv;

static void s3_fixture_init(void)
{
	char url[256];
	struct fm_opts o = { .s3_http = true };

	snprintf(srv.dir, sizeof(srv.dir), "/tmp/ferry-it-s3.%d", (int)getpid());
	cr_assert(mkdir(srv.dir, 0700) == 0 || errno == EEXIST);
	setenv("AWS_ACCESS_KEY_ID", "S3RVER", 1);
	setenv("AWS_SECRET_ACCESS_KEY", "S3RVER", 1);
	setenv("AWS_REGION", "us-east-1", 1);
	fm_s3_start(&srv, NULL);
	snprintf(url, sizeof(url), "s3://%s/ferry-test/faults", srv.hostport);
	o.storage = url;
	fm_setup_opts(&o);
}

static void s3_fixture_fini(void)
{
	fm_teardown();
	/* fm.log went with the fixture's directory: send output elsewhere. */
	const char *stop[] = { FERRY_SOURCE_DIR "/scripts/s3-server", "stop", srv.dir, NULL };
	cr_expect_eq(fm_run(stop, "/dev/null", "/dev/null", 60), 0, "s3-server stop failed");
	const char *rm[] = { "/bin/rm", "-rf", srv.dir, NULL };
	fm_run(rm, "/dev/null", "/dev/null", 60);
}

/* Its own suite: a test's .init runs after its suite's, not instead. */
TestSuite(faults_s3, .init = s3_fixture_init, .fini = s3_fixture_fini, .timeout = 180);

Test(faults_s3, store_gone_fsync_is_eio_and_data_stays_staged)
{
	size_t len = 3 * MiB;
	unsigned char *data = malloc(len);
	uint64_t st = 7;
	struct fm_stats s;
	char port[16];
	int fd;

	fm_fill_random(&st, data, len);
	fm_write_file(mp("before"), "committed", 9);
	snprintf(port, sizeof(port), "%s", strchr(srv.hostport, ':') + 1);
	fm_s3_stop(&srv);

	fd = OK(open(mp("pending"), O_CREAT | O_WRONLY, 0644));
	fm_pwrite_all(fd, data, len, 0);
	/* fsync promises the object store: it cannot be reached, so EIO. */
	FAILS(fsync(fd), EIO);
	/* close() promises the node: the bytes are staged and journaled, and
	 * the reconciler uploads them once it can. */
	OK(close(fd));
	/* RELEASE, which hands the file over, runs after close() returns. */
	for (int i = 0; i < 100; i++) {
		fm_stats_read(&s);
		if (fm_stats_need(&s, "passthrough_staging_blocks") > 0)
			break;
		usleep(100 * 1000);
	}
	cr_assert_geq(fm_stats_need(&s, "commit_failures"), 1);
	cr_assert_geq(fm_stats_need(&s, "passthrough_staging_blocks"), 1,
		      "nothing is staged while the store is away (hand-offs held back for a "
		      "mapping: %llu)", (unsigned long long)fm_stats_need(&s, "mapped_after_close"));

	/* The store comes back: the reconciler's retry commits the data. */
	fm_s3_start(&srv, port);
	for (int i = 0; i < 600; i++) {
		fm_stats_read(&s);
		if (fm_stats_need(&s, "passthrough_staging_blocks") == 0)
			break;
		usleep(100 * 1000);
	}
	cr_assert_eq(fm_stats_need(&s, "passthrough_staging_blocks"), 0, "the retry never committed");
	cr_assert_geq(fm_stats_need(&s, "reconcile_failures_total"), 1);
	fm_remount_cold();
	cr_assert_eq(read_checked(mp("pending"), data, len), 0);
	struct stat sb;
	OK(stat(mp("pending"), &sb));
	cr_assert_eq(sb.st_size, (off_t)len);
	free(data);
}
