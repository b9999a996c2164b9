/*
 * ferryfs on an s3:// volume end to end: write, read, remount with an empty
 * cache, read back. Needs an S3-compatible server; scripts/test starts one
 * (scripts/s3-server) and exports FERRY_TEST_S3_HOSTPORT,
 * FERRY_TEST_S3_BUCKET, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and
 * AWS_REGION. Without them the tests fail: they never skip.
 */
#include "mount_util.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <ftw.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#define MiB (1024LL * 1024)

TestSuite(s3, .fini = fm_teardown, .timeout = 240);

static const char *const s3_env[] = {
	"FERRY_TEST_S3_HOSTPORT", "FERRY_TEST_S3_BUCKET", "AWS_ACCESS_KEY_ID",
	"AWS_SECRET_ACCESS_KEY",  "AWS_REGION",
};

/* Formats and mounts a volume on a fresh prefix of the test bucket. */
static void s3_setup(void)
{
	char missing[256] = "", url[PATH_MAX];
	struct timespec now;

	for (size_t i = 0; i < sizeof(s3_env) / sizeof(s3_env[0]); i++) {
		const char *v = getenv(s3_env[i]);

		if (!v || !*v) {
			strcat(missing, " ");
			strcat(missing, s3_env[i]);
		}
	}
	cr_assert(missing[0] == '\0',
		  "S3 test environment missing:%s. Start a server with "
		  "`eval \"$(scripts/s3-server start DIR)\"` or run scripts/test.",
		  missing);
	clock_gettime(CLOCK_REALTIME, &now);
	snprintf(url, sizeof(url), "s3://%s/%s/ferry-it-%d-%lld%09ld",
		 getenv("FERRY_TEST_S3_HOSTPORT"), getenv("FERRY_TEST_S3_BUCKET"), (int)getpid(),
		 (long long)now.tv_sec, now.tv_nsec);
	cr_log_info("storage %s", url);
	fm_setup_opts(&(struct fm_opts){ .storage = url, .s3_http = true });
}

static int local_objects;

static int count_files(const char *path, const struct stat *st, int type, struct FTW *ftw)
{
	(void)path;
	(void)st;
	(void)ftw;
	if (type == FTW_F)
		local_objects++;
	return 0;
}

Test(s3, write_read_remount)
{
	const size_t big = 9 * MiB + 5;
	char *data = malloc(big);
	uint64_t rs = 0x53;
	struct stat st;
	int fd;

	s3_setup();
	/* small, multi-block, sparse, many small files */
	fm_write_file(mp("hello"), "hello, s3\n", 10);
	fm_fill_random(&rs, data, big);
	fm_write_file(mp("big"), data, big);
	fm_write_file(sp("model-big"), data, big);
	fd = OK(open(mp("sparse"), O_CREAT | O_WRONLY, 0644));
	fm_pwrite_all(fd, "start", 5, 0);
	fm_pwrite_all(fd, "end", 3, 5 * MiB);
	OK(fsync(fd));
	OK(close(fd));
	OK(mkdir(mp("dir"), 0755));
	for (int i = 0; i < 30; i++) {
		char buf[3000];
		size_t len = 1 + fm_rand(&rs) % sizeof(buf);

		fm_fill_random(&rs, buf, len);
		fm_write_file(mp("dir/f%02d", i), buf, len);
		fm_write_file(sp("model-f%02d", i), buf, len);
	}
	/* an overwrite in a second open, a truncate, a rename, an unlink */
	fd = OK(open(mp("big"), O_WRONLY));
	fm_pwrite_all(fd, "PATCH", 5, 4 * MiB - 2);
	OK(close(fd));
	memcpy(data + 4 * MiB - 2, "PATCH", 5);
	fm_write_file(sp("model-big"), data, big);
	fm_write_file(mp("gone"), "x", 1);
	OK(unlink(mp("gone")));
	OK(rename(mp("dir/f00"), mp("dir/renamed")));
	OK(setxattr(mp("hello"), "user.s3", "yes", 3, 0));
	fm_assert_same_content(mp("big"), sp("model-big"));

	for (int pass = 0; pass < 2; pass++) {
		char buf[16];
		size_t len;
		char *c;

		fm_remount_cold();
		c = fm_read_file(mp("hello"), &len);
		cr_assert(len == 10 && memcmp(c, "hello, s3\n", 10) == 0, "pass %d: hello", pass);
		free(c);
		cr_assert_eq(OK(getxattr(mp("hello"), "user.s3", buf, sizeof(buf))), 3);
		fm_assert_same_content(mp("big"), sp("model-big"));
		fd = OK(open(mp("sparse"), O_RDONLY));
		OK(fstat(fd, &st));
		cr_assert_eq(st.st_size, 5 * MiB + 3);
		fm_pread_all(fd, buf, 5, 0);
		cr_assert(memcmp(buf, "start", 5) == 0);
		fm_pread_all(fd, buf, 3, 5 * MiB);
		cr_assert(memcmp(buf, "end", 3) == 0);
		fm_pread_all(fd, buf, 8, 2 * MiB);
		cr_assert(memcmp(buf, "\0\0\0\0\0\0\0\0", 8) == 0, "hole is not zero");
		OK(close(fd));
		fm_assert_same_content(mp("dir/renamed"), sp("model-f00"));
		for (int i = 1; i < 30; i++)
			fm_assert_same_content(mp("dir/f%02d", i), sp("model-f%02d", i));
		FAILS(stat(mp("gone"), &st), ENOENT);
		FAILS(stat(mp("dir/f00"), &st), ENOENT);
	}

	/* the data went to S3, not to the volume directory */
	local_objects = 0;
	nftw(sp("vol/objects"), count_files, 16, FTW_PHYS);
	cr_assert_eq(local_objects, 0, "%d files under VOLUME/objects on an s3:// volume",
		     local_objects);
	free(data);
}

Test(s3, fsync_and_stats)
{
	static struct fm_stats s;
	const size_t size = 6 * MiB;
	char *data = malloc(size);
	uint64_t rs = 0x54;
	int fd;

	s3_setup();
	fm_fill_random(&rs, data, size);
	fd = OK(open(mp("f"), O_CREAT | O_RDWR, 0644));
	fm_pwrite_all(fd, data, size, 0);
	OK(fsync(fd));
	/* a second slice over the end, then fdatasync */
	fm_fill_random(&rs, data + 5 * MiB + 1, MiB - 1);
	fm_pwrite_all(fd, data + 5 * MiB + 1, MiB - 1, 5 * MiB + 1);
	OK(fdatasync(fd));
	OK(close(fd));
	fm_write_file(sp("model"), data, size);
	fm_stats_read(&s);
	cr_assert_gt(fm_stats_need(&s, "fuse_requests_fsync"), 0);
	fm_crash();
	fm_mount();
	fm_assert_same_content(mp("f"), sp("model"));
	free(data);
}

/* A sequential read from a cold cache runs 8 read-ahead GETs at once
 * (readahead_streams' default). Each one's end used to close the oldest idle
 * connection (libcurl keeps 5 by default), so 56 of 64 GETs of a 256 MiB read
 * opened a connection of their own: against S3 each is a TLS handshake and
 * a TCP slow start again. Now they go back to the pool and are reused. */
Test(s3, a_sequential_read_reuses_its_connections)
{
	const size_t size = 96 * MiB; /* 24 objects of 4 MiB */
	char *data = malloc(size);
	uint64_t rs = 0x55, req0, con0, req, con;

	cr_assert_not_null(data);
	s3_setup();
	fm_fill_random(&rs, data, size);
	fm_write_file(mp("f"), data, size);
	fm_write_file(sp("model"), data, size);
	fm_remount_cold();
	req0 = fm_stat("s3_requests");
	con0 = fm_stat("s3_connections_opened");
	fm_assert_same_content(mp("f"), sp("model"));
	req = fm_stat("s3_requests") - req0;
	con = fm_stat("s3_connections_opened") - con0;
	cr_log_info("cold read of 96 MiB: %llu requests, %llu connections opened, "
		    "%llu objects read ahead", (unsigned long long)req, (unsigned long long)con,
		    (unsigned long long)fm_stat("prefetch_fetched"));
	cr_assert_geq(req, 24, "%llu requests for 24 objects", (unsigned long long)req);
	cr_assert_gt(fm_stat("prefetch_fetched"), 8, "the read was not read ahead");
	/* At most one per GET at once (8 streams, the reader's own) and a
	 * spare: a connection is opened again only if the server closed it. */
	cr_assert_leq(con, 10, "%llu connections opened for %llu requests",
		      (unsigned long long)con, (unsigned long long)req);
	free(data);
}

Test(s3, unreachable_endpoint_fails_cleanly, .timeout = 180)
{
	struct sockaddr_in sa = { .sin_family = AF_INET };
	socklen_t sl = sizeof(sa);
	char url[128];
	const char *fmt[7], *mnt[7];
	int s, rc_fmt, rc_mnt = 0;
	char *err;

	/* a port nothing listens on */
	inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
	s = OK(socket(AF_INET, SOCK_STREAM, 0));
	OK(bind(s, (struct sockaddr *)&sa, sizeof(sa)));
	OK(getsockname(s, (struct sockaddr *)&sa, &sl));
	close(s);
	snprintf(url, sizeof(url), "s3://127.0.0.1:%d/bucket/prefix", ntohs(sa.sin_port));

	fm_setup_opts(&(struct fm_opts){ .no_mount = true });
	OK(mkdir(sp("vol2"), 0700));
	fmt[0] = fm_bin("ferry");
	fmt[1] = "format";
	fmt[2] = "--storage";
	fmt[3] = url;
	fmt[4] = "--s3-http";
	fmt[5] = sp("vol2");
	fmt[6] = NULL;
	rc_fmt = fm_run(fmt, sp("out"), sp("err"), 120);
	if (rc_fmt == 0) {
		/* format may not touch the store; then mount must refuse */
		mnt[0] = fm_bin("ferry");
		mnt[1] = "mount";
		mnt[2] = "--cache-dir";
		mnt[3] = fm.cache;
		mnt[4] = sp("vol2");
		mnt[5] = fm.mnt;
		mnt[6] = NULL;
		rc_mnt = fm_run(mnt, sp("out"), sp("err"), 120);
		cr_assert_neq(rc_mnt, 0, "ferry mount of a volume on an unreachable S3 endpoint "
			      "exited 0");
	}
	cr_assert(rc_fmt < 128 && rc_mnt < 128, "ferry was killed (format %d, mount %d)", rc_fmt,
		  rc_mnt);
	err = fm_slurp(sp("err"));
	cr_assert_eq(fm_count_lines(err), 1, "stderr should be one line: '%s'", err ? err : "");
	free(err);
	cr_assert(!fm_is_mounted(fm.mnt));
}
