/*
 * objstore: both backends against real servers. file:// in a mkdtemp
 * directory; s3:// against the s3rver of scripts/s3-server, named by
 * FERRY_TEST_S3_HOSTPORT and FERRY_TEST_S3_BUCKET (AWS_* credentials from the
 * environment). Failure paths of the S3 backend use a loopback fake server.
 *
 *   eval "$(scripts/s3-server start /tmp/ferry-s3)"
 *   build/tests/unit-objstore
 *   scripts/s3-server stop /tmp/ferry-s3
 */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <sys/resource.h>

#include <criterion/criterion.h>

#include "objstore.h"
#include "objstore_s3_internal.h"
#include "url.h"

/* ---- helpers ---- */

static char tmpdir[64];

static int
rm_cb(const char *p, const struct stat *st, int flag, struct FTW *ftw)
{
	return remove(p);
}

static void
rm_rf(const char *dir)
{
	nftw(dir, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
}

static double
now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static struct objstore *
open_url(const char *url, int s3_http, const struct objstore_opts *opts)
{
	struct store_url u;
	struct objstore *s = NULL;
	char err[256];
	int r;

	r = store_url_parse(url, s3_http, &u, err, sizeof(err));
	cr_assert_eq(r, 0, "%s: %s", url, err);
	r = objstore_open(&u, opts, &s, err, sizeof(err));
	cr_assert_eq(r, 0, "%s: %s", url, err);
	store_url_free(&u);
	return s;
}

static struct objstore *
open_file_store(void)
{
	char url[128];
	struct objstore *s;

	snprintf(tmpdir, sizeof(tmpdir), "/tmp/ferry-objstore-XXXXXX");
	cr_assert_not_null(mkdtemp(tmpdir));
	snprintf(url, sizeof(url), "file://%s/objects", tmpdir);
	s = open_url(url, 0, NULL);
	cr_assert_eq(objstore_check(s, 0), -ENOENT, "check without create on a missing dir");
	cr_assert_eq(objstore_check(s, 1), 0, "%s", objstore_last_error());
	return s;
}

static const char *
s3_env(const char *name)
{
	const char *v = getenv(name);

	if (v == NULL || v[0] == '\0')
		cr_assert_fail("%s is not set: start the test S3 server first with\n"
			 "  eval \"$(scripts/s3-server start /tmp/ferry-s3)\"\n"
			 "(and scripts/s3-server stop /tmp/ferry-s3 afterwards)", name);
	return v;
}

/* A store under a prefix of its own, so that runs never see each other. */
static struct objstore *
open_s3_store(const struct objstore_opts *opts)
{
	char url[512];
	struct objstore *s;

	s3_env("AWS_ACCESS_KEY_ID");
	snprintf(url, sizeof(url), "s3://%s/%s/run-%d-%ld", s3_env("FERRY_TEST_S3_HOSTPORT"),
		 s3_env("FERRY_TEST_S3_BUCKET"), (int)getpid(), (long)time(NULL));
	s = open_url(url, 1, opts);
	cr_assert_eq(objstore_check(s, 0), 0, "S3 server at %s: %s", getenv("FERRY_TEST_S3_HOSTPORT"),
		     objstore_last_error());
	return s;
}

static void
fill(unsigned char *buf, size_t len, unsigned seed)
{
	for (size_t i = 0; i < len; i++)
		buf[i] = (unsigned char)((i * 2654435761u + seed) >> 13);
}

/* ---- the same checks for both backends ---- */

static void
check_basic(struct objstore *s)
{
	enum { N = 100000 };
	unsigned char *data = malloc(N), *buf = malloc(N + 100);
	uint64_t size = 0;

	cr_assert(data && buf);
	fill(data, N, 1);
	cr_assert_eq(objstore_put(s, "chunks/0/0/1_0_100000", data, N), 0, "%s", objstore_last_error());
	cr_assert_eq(objstore_head(s, "chunks/0/0/1_0_100000", &size), 0, "%s", objstore_last_error());
	cr_assert_eq(size, N);

	/* Whole, a middle range, a range running past the end, past the end. */
	cr_assert_eq(objstore_get(s, "chunks/0/0/1_0_100000", 0, buf, N + 100), N, "%s", objstore_last_error());
	cr_assert_arr_eq(buf, data, N);
	cr_assert_eq(objstore_get(s, "chunks/0/0/1_0_100000", 4096, buf, 8192), 8192);
	cr_assert_arr_eq(buf, data + 4096, 8192);
	cr_assert_eq(objstore_get(s, "chunks/0/0/1_0_100000", N - 10, buf, 4096), 10);
	cr_assert_arr_eq(buf, data + N - 10, 10);
	cr_assert_eq(objstore_get(s, "chunks/0/0/1_0_100000", N - 1, buf, 1), 1);
	cr_assert_eq(buf[0], data[N - 1]);
	cr_assert_eq(objstore_get(s, "chunks/0/0/1_0_100000", N, buf, 10), 0);
	cr_assert_eq(objstore_get(s, "chunks/0/0/1_0_100000", N + 5000, buf, 10), 0);
	cr_assert_eq(objstore_get(s, "chunks/0/0/1_0_100000", 5, buf, 0), 0);

	/* Missing objects. */
	cr_assert_eq(objstore_get(s, "chunks/0/0/missing", 0, buf, 10), -ENOENT);
	cr_assert_eq(objstore_get(s, "nodir/missing", 0, buf, 10), -ENOENT);
	cr_assert_eq(objstore_get(s, "chunks/0/0/missing", 0, buf, 0), -ENOENT);
	cr_assert_eq(objstore_head(s, "chunks/0/0/missing", &size), -ENOENT);
	cr_assert_str_neq(objstore_last_error(), "");

	/* Empty object. */
	cr_assert_eq(objstore_put(s, "empty", "", 0), 0, "%s", objstore_last_error());
	cr_assert_eq(objstore_head(s, "empty", &size), 0);
	cr_assert_eq(size, 0);
	cr_assert_eq(objstore_get(s, "empty", 0, buf, 10), 0, "%s", objstore_last_error());

	/* Overwrite replaces the whole object. */
	cr_assert_eq(objstore_put(s, "over", "0123456789", 10), 0);
	cr_assert_eq(objstore_put(s, "over", "abc", 3), 0);
	cr_assert_eq(objstore_get(s, "over", 0, buf, 10), 3);
	cr_assert_arr_eq(buf, "abc", 3);

	/* Delete, twice. */
	cr_assert_eq(objstore_delete(s, "chunks/0/0/1_0_100000"), 0, "%s", objstore_last_error());
	cr_assert_eq(objstore_delete(s, "chunks/0/0/1_0_100000"), 0, "%s", objstore_last_error());
	cr_assert_eq(objstore_delete(s, "never/was"), 0, "%s", objstore_last_error());
	cr_assert_eq(objstore_get(s, "chunks/0/0/1_0_100000", 0, buf, 10), -ENOENT);

	/* Invalid keys are refused by both backends. */
	cr_assert_eq(objstore_put(s, "", "x", 1), -EINVAL);
	cr_assert_eq(objstore_put(s, "a/../b", "x", 1), -EINVAL);
	cr_assert_eq(objstore_get(s, "/abs", 0, buf, 1), -EINVAL);
	free(data);
	free(buf);
}

struct list_acc {
	int n, bad, stop_after;
	uint64_t bytes;
	char last[256];
	int sorted;
};

static int
list_cb(const char *key, uint64_t size, void *arg)
{
	struct list_acc *a = arg;
	unsigned idx;
	char tail;

	if (sscanf(key, "list/k%5u%c", &idx, &tail) != 1 || size != idx % 7)
		a->bad++;
	if (strcmp(key, a->last) <= 0)
		a->sorted = 0;
	snprintf(a->last, sizeof(a->last), "%s", key);
	a->n++;
	a->bytes += size;
	if (a->stop_after && a->n == a->stop_after)
		return 42;
	return 0;
}

static void
check_list(struct objstore *s, int in_order)
{
	enum { NKEYS = 1100 };
	struct list_acc a = { .sorted = 1 };
	char key[64];
	uint64_t want_bytes = 0;

	for (unsigned i = 0; i < NKEYS; i++) {
		snprintf(key, sizeof(key), "list/k%05u", i);
		cr_assert_eq(objstore_put(s, key, "0123456", i % 7), 0, "%s: %s", key, objstore_last_error());
		want_bytes += i % 7;
	}
	cr_assert_eq(objstore_put(s, "listx", "x", 1), 0);
	cr_assert_eq(objstore_put(s, "other/list/k00001", "x", 1), 0);

	cr_assert_eq(objstore_list(s, "list/", list_cb, &a), 0, "%s", objstore_last_error());
	cr_assert_eq(a.n, NKEYS);
	cr_assert_eq(a.bad, 0);
	cr_assert_eq(a.bytes, want_bytes);
	if (in_order)
		cr_assert(a.sorted, "S3 lists in key order");

	/* A partial last component. */
	memset(&a, 0, sizeof(a));
	cr_assert_eq(objstore_list(s, "list/k010", list_cb, &a), 0);
	cr_assert_eq(a.n, 100); /* k01000..k01099 */
	cr_assert_eq(a.bad, 0);

	/* The whole store, and nothing. */
	memset(&a, 0, sizeof(a));
	cr_assert_eq(objstore_list(s, "", list_cb, &a), 0);
	cr_assert_eq(a.n, NKEYS + 2);
	memset(&a, 0, sizeof(a));
	cr_assert_eq(objstore_list(s, "nothing/here/", list_cb, &a), 0);
	cr_assert_eq(a.n, 0);

	/* The callback stops the listing. */
	memset(&a, 0, sizeof(a));
	a.stop_after = 5;
	cr_assert_eq(objstore_list(s, "list/", list_cb, &a), 42);
	cr_assert_eq(a.n, 5);

	cr_assert_eq(objstore_list(s, "../", list_cb, &a), -EINVAL);
	cr_assert_eq(objstore_list(s, "/x", list_cb, &a), -EINVAL);
}

struct worker {
	struct objstore *s;
	int id;
	int failures;
	char why[256];
};

static void *
worker_main(void *arg)
{
	struct worker *w = arg;
	unsigned char *data = malloc(300000), *buf = malloc(300000);
	char key[64];

	for (int i = 0; i < 40 && data && buf; i++) {
		size_t len = (size_t)(i * 7919 + w->id * 104729) % 300000;
		ssize_t n;

		snprintf(key, sizeof(key), "conc/%d/%d", w->id, i);
		fill(data, len, (unsigned)(w->id * 1000 + i));
		if (objstore_put(w->s, key, data, len) != 0) {
			snprintf(w->why, sizeof(w->why), "put %s: %s", key, objstore_last_error());
			w->failures++;
			continue;
		}
		n = objstore_get(w->s, key, 0, buf, 300000);
		if (n != (ssize_t)len || memcmp(buf, data, len) != 0) {
			snprintf(w->why, sizeof(w->why), "get %s: %zd of %zu: %s", key, n, len,
				 objstore_last_error());
			w->failures++;
		}
		if (i % 2 && objstore_delete(w->s, key) != 0)
			w->failures++;
	}
	free(data);
	free(buf);
	return NULL;
}

static void
check_concurrency(struct objstore *s)
{
	pthread_t t[4];
	struct worker w[4];

	for (int i = 0; i < 4; i++) {
		w[i] = (struct worker){ .s = s, .id = i };
		cr_assert_eq(pthread_create(&t[i], NULL, worker_main, &w[i]), 0);
	}
	for (int i = 0; i < 4; i++) {
		pthread_join(t[i], NULL);
		cr_assert_eq(w[i].failures, 0, "thread %d: %s", i, w[i].why);
	}
}

/* ---- file:// ---- */

/* One timeout for every test: Criterion 2.4's runner leaks (LeakSanitizer
 * fails the run) when tests carry different timeouts. */
TestSuite(file, .timeout = 300);
TestSuite(s3, .timeout = 300);
TestSuite(s3_errors, .timeout = 300);

/* A sink that collects what a GET delivers, in order, and can refuse
 * after a number of calls. */
struct collect {
	unsigned char *buf;
	size_t cap, len;
	int calls, fail_at;   /* fail_at > 0: that call returns -ENOSPC */
};

static int
collect_put(void *arg, uint64_t pos, const void *data, size_t len)
{
	struct collect *c = arg;

	if (++c->calls == c->fail_at)
		return -ENOSPC;
	cr_assert_eq(pos, c->len, "pieces out of order: %llu after %zu", (unsigned long long)pos,
		     c->len);
	cr_assert_leq(pos + len, c->cap, "more than was asked for");
	memcpy(c->buf + pos, data, len);
	c->len = pos + len;
	return 0;
}

/* objstore_get_to gives what objstore_get does, piece by piece; a sink's
 * error ends the GET with that error. */
static void
check_get_to(struct objstore *s)
{
	enum { N = 2 * 1024 * 1024 + 12345 };
	unsigned char *data = malloc(N);
	struct collect c = { .buf = malloc(N + 10), .cap = N + 10 };

	fill(data, N, 7);
	cr_assert_eq(objstore_put(s, "get-to", data, N), 0, "%s", objstore_last_error());
	cr_assert_eq(objstore_get_to(s, "get-to", 0, N + 10, collect_put, &c), N, "%s",
		     objstore_last_error());
	cr_assert_eq(c.len, N);
	cr_assert(memcmp(c.buf, data, N) == 0, "wrong bytes");
	/* A range inside. */
	c = (struct collect){ .buf = c.buf, .cap = 1000 };
	cr_assert_eq(objstore_get_to(s, "get-to", 1024 * 1024 - 10, 1000, collect_put, &c), 1000);
	cr_assert(memcmp(c.buf, data + 1024 * 1024 - 10, 1000) == 0);
	/* Refused by the sink, missing object. */
	c = (struct collect){ .buf = c.buf, .cap = N + 10, .fail_at = 1 };
	cr_assert_eq(objstore_get_to(s, "get-to", 0, N, collect_put, &c), -ENOSPC);
	c = (struct collect){ .buf = c.buf, .cap = N + 10 };
	cr_assert_eq(objstore_get_to(s, "get-to-missing", 0, N, collect_put, &c), -ENOENT);
	cr_assert_eq(c.len, 0);
	free(c.buf);
	free(data);
}

Test(file, get_to)
{
	struct objstore *s = open_file_store();

	check_get_to(s);
	objstore_close(s);
	rm_rf(tmpdir);
}

Test(file, basic)
{
	struct objstore *s = open_file_store();

	check_basic(s);
	objstore_close(s);
	rm_rf(tmpdir);
}

Test(file, list)
{
	struct objstore *s = open_file_store();
	char p[128];
	int fd;
	struct list_acc a = { 0 };

	/* Stray temp files are not objects. */
	snprintf(p, sizeof(p), "%s/objects/.ferrytmp.123", tmpdir);
	fd = open(p, O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
	cr_assert_geq(fd, 0);
	close(fd);
	check_list(s, 0);
	cr_assert_eq(objstore_list(s, "", list_cb, &a), 0);
	cr_assert_eq(a.n, 1102, "%d", a.n);
	objstore_close(s);
	rm_rf(tmpdir);
}

Test(file, concurrency)
{
	struct objstore *s = open_file_store();

	check_concurrency(s);
	objstore_close(s);
	rm_rf(tmpdir);
}

static int
open_fds(void)
{
	int n = 0;
	DIR *d = opendir("/proc/self/fd");
	struct dirent *de;

	cr_assert_not_null(d);
	while ((de = readdir(d)))
		n += de->d_name[0] != '.';
	closedir(d);
	return n;
}

/* Deferred durability: puts are readable at once and keep their files open
 * for the sync, which fsyncs and closes them; past the cap (an eighth of
 * the open-file limit here) a put syncs itself. */
Test(file, deferred_durability)
{
	struct objstore *s = open_file_store();
	struct rlimit old, low;
	char key[64], buf[16];
	int base;

	cr_assert_eq(objstore_sync(s), 0, "a store that does not defer syncs nothing");
	cr_assert_eq(getrlimit(RLIMIT_NOFILE, &old), 0);
	low = old;
	low.rlim_cur = 160; /* cap: 20 puts */
	cr_assert_eq(setrlimit(RLIMIT_NOFILE, &low), 0);
	objstore_defer_durability(s);
	cr_assert_eq(setrlimit(RLIMIT_NOFILE, &old), 0);
	cr_assert_eq(objstore_put(s, "warm/up", "w", 1), 0); /* opens the root once */
	cr_assert_eq(objstore_sync(s), 0, "%s", objstore_last_error());
	base = open_fds();
	for (int i = 0; i < 50; i++) {
		snprintf(key, sizeof(key), "d%d/obj%d", i % 3, i);
		snprintf(buf, sizeof(buf), "v%d", i);
		cr_assert_eq(objstore_put(s, key, buf, strlen(buf)), 0, "%s", objstore_last_error());
		cr_assert_eq(objstore_get(s, key, 0, buf, sizeof(buf)), (ssize_t)strlen(buf));
		cr_assert_eq(open_fds(), base + (i < 20 ? i + 1 : 20),
			     "after put %d: %d fds open, %d before", i, open_fds(), base);
	}
	cr_assert_eq(objstore_sync(s), 0, "%s", objstore_last_error());
	cr_assert_eq(open_fds(), base, "the sync closes what it synced");
	cr_assert_eq(objstore_sync(s), 0, "nothing pending");
	for (int i = 0; i < 50; i++) {
		snprintf(key, sizeof(key), "d%d/obj%d", i % 3, i);
		cr_assert_eq(objstore_get(s, key, 0, buf, sizeof(buf)), i < 10 ? 2 : 3);
	}
	/* Closing with puts never synced releases their files too. */
	cr_assert_eq(objstore_put(s, "late/one", "x", 1), 0);
	objstore_close(s);
	cr_assert_eq(open_fds(), base - 1, "closed with the root fd");
	rm_rf(tmpdir);
}

static int
count_cb(const char *key, uint64_t size, void *arg)
{
	(*(int *)arg)++;
	return 0;
}

Test(file, hostile_keys)
{
	static const char *bad[] = {
		"..", "../x", "a/../../x", "/etc/passwd", "a//b", "a/./b", ".", "./a", "a/",
		"a/..", "a\nb", "a\x01", ".ferrytmp.x", "a/.ferrytmp.1",
	};
	struct objstore *s = open_file_store();
	char p[256], big[1100], buf[16];
	struct stat st;
	int n = 0;

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		cr_assert_eq(objstore_put(s, bad[i], "x", 1), -EINVAL, "put \"%s\"", bad[i]);
		cr_assert_eq(objstore_get(s, bad[i], 0, buf, 1), -EINVAL, "get \"%s\"", bad[i]);
		cr_assert_eq(objstore_head(s, bad[i], NULL), -EINVAL, "head \"%s\"", bad[i]);
		cr_assert_eq(objstore_delete(s, bad[i]), -EINVAL, "delete \"%s\"", bad[i]);
		cr_assert_str_neq(objstore_last_error(), "");
	}
	memset(big, 'a', sizeof(big) - 1);
	big[sizeof(big) - 1] = '\0';
	cr_assert_eq(objstore_put(s, big, "x", 1), -EINVAL);
	memset(big, 'a', 300);
	big[300] = '\0';
	cr_assert_eq(objstore_put(s, big, "x", 1), -EINVAL, "a component longer than NAME_MAX");

	/* A symlink planted in the store is never followed out of it. */
	snprintf(p, sizeof(p), "%s/outside", tmpdir);
	cr_assert_eq(mkdir(p, 0755), 0);
	snprintf(p, sizeof(p), "%s/objects/evil", tmpdir);
	cr_assert_eq(symlink("../outside", p), 0);
	cr_assert_neq(objstore_put(s, "evil/x", "x", 1), 0);
	snprintf(p, sizeof(p), "%s/outside/x", tmpdir);
	cr_assert_neq(stat(p, &st), 0, "put wrote through a symlink");
	cr_assert_eq(errno, ENOENT);
	cr_assert_eq(objstore_put(s, "fine/x", "x", 1), 0);
	snprintf(p, sizeof(p), "%s/outside/y", tmpdir);
	cr_assert_eq(close(open(p, O_CREAT | O_WRONLY | O_CLOEXEC, 0644)), 0);
	cr_assert_eq(objstore_get(s, "evil/y", 0, buf, 1), -ENOENT);
	cr_assert_eq(objstore_delete(s, "evil/y"), 0);
	cr_assert_eq(stat(p, &st), 0, "delete went through a symlink");
	snprintf(p, sizeof(p), "%s/objects/fine/link", tmpdir);
	cr_assert_eq(symlink("../../outside/y", p), 0);
	cr_assert_eq(objstore_get(s, "fine/link", 0, buf, 1), -EIO);
	cr_assert_eq(objstore_list(s, "", count_cb, &n), 0);
	cr_assert_eq(n, 1, "only fine/x is an object");

	/* A file where a directory should be. */
	cr_assert_eq(objstore_get(s, "fine/x/y", 0, buf, 1), -ENOENT);
	cr_assert_lt(objstore_put(s, "fine/x/y", "x", 1), 0);

	objstore_close(s);
	rm_rf(tmpdir);
}

Test(file, put_is_atomic_and_tidy)
{
	struct objstore *s = open_file_store();
	char p[256];
	int n = 0;

	for (int i = 0; i < 50; i++)
		cr_assert_eq(objstore_put(s, "a/b/c", "data", 4), 0);
	/* No temp file is left behind, and the object is complete. */
	snprintf(p, sizeof(p), "%s/objects/a/b", tmpdir);
	{
		char cmd[300];
		snprintf(cmd, sizeof(cmd), "test $(ls -A %s | wc -l) -eq 1", p);
		cr_assert_eq(system(cmd), 0, "temporary files left in %s", p);
	}
	cr_assert_eq(objstore_list(s, "", count_cb, &n), 0);
	cr_assert_eq(n, 1);
	objstore_close(s);
	rm_rf(tmpdir);
}

Test(file, check_fails_cleanly)
{
	struct objstore *s;
	char url[128], p[128];

	/* The store directory would have to live under a regular file. */
	snprintf(tmpdir, sizeof(tmpdir), "/tmp/ferry-objstore-XXXXXX");
	cr_assert_not_null(mkdtemp(tmpdir));
	snprintf(p, sizeof(p), "%s/afile", tmpdir);
	cr_assert_eq(close(open(p, O_CREAT | O_WRONLY | O_CLOEXEC, 0644)), 0);
	snprintf(url, sizeof(url), "file://%s/afile/objects", tmpdir);
	s = open_url(url, 0, NULL);
	cr_assert_eq(objstore_check(s, 1), -ENOTDIR, "%s", objstore_last_error());
	cr_assert(strstr(objstore_last_error(), "afile"), "%s", objstore_last_error());
	cr_assert_lt(objstore_put(s, "k", "x", 1), 0);
	objstore_close(s);
	rm_rf(tmpdir);
}

/* ---- s3:// against s3rver ---- */

Test(s3, basic)
{
	struct objstore *s = open_s3_store(NULL);

	check_basic(s);
	objstore_close(s);
}

Test(s3, get_to)
{
	struct objstore *s = open_s3_store(NULL);

	check_get_to(s);
	objstore_close(s);
}

Test(s3, list_paging)
{
	struct objstore *s = open_s3_store(NULL);

	check_list(s, 1);
	objstore_close(s);
}

Test(s3, concurrency)
{
	struct objstore *s = open_s3_store(NULL);

	check_concurrency(s);
	objstore_close(s);
}

struct names {
	int n;
	char keys[4][128];
};

static int
names_cb(const char *key, uint64_t size, void *arg)
{
	struct names *nm = arg;

	if (nm->n < 4)
		snprintf(nm->keys[nm->n], sizeof(nm->keys[0]), "%s", key);
	nm->n++;
	return 0;
}

Test(s3, odd_keys)
{
	/* Characters that need URI encoding in the path and XML escaping in
	 * the listing. */
	static const char *keys[] = {
		"odd/a b&c<d>e\"f'g", "odd/plus+eq=pct%q?h#", "odd/\xc3\xa9t\xc3\xa9~_-.x",
	};
	struct objstore *s = open_s3_store(NULL);
	struct names nm = { 0 };
	char buf[64];

	for (int i = 0; i < 3; i++) {
		cr_assert_eq(objstore_put(s, keys[i], keys[i], strlen(keys[i])), 0, "%s: %s", keys[i],
			     objstore_last_error());
		cr_assert_eq(objstore_get(s, keys[i], 0, buf, sizeof(buf)), (ssize_t)strlen(keys[i]),
			     "%s: %s", keys[i], objstore_last_error());
		cr_assert_arr_eq(buf, keys[i], strlen(keys[i]));
	}
	cr_assert_eq(objstore_list(s, "odd/", names_cb, &nm), 0, "%s", objstore_last_error());
	cr_assert_eq(nm.n, 3);
	for (int i = 0; i < 3; i++) {
		int found = 0;
		for (int j = 0; j < 3; j++)
			found |= strcmp(nm.keys[j], keys[i]) == 0;
		cr_assert(found, "%s not listed", keys[i]);
	}
	objstore_close(s);
}

Test(s3, prefixes_are_separate)
{
	char url[512];
	struct objstore *a, *b;
	char buf[8];
	int n = 0;

	s3_env("AWS_ACCESS_KEY_ID");
	snprintf(url, sizeof(url), "s3://%s/%s/sep-%d/one", s3_env("FERRY_TEST_S3_HOSTPORT"),
		 s3_env("FERRY_TEST_S3_BUCKET"), (int)getpid());
	a = open_url(url, 1, NULL);
	snprintf(url, sizeof(url), "s3://%s/%s/sep-%d/one-two", s3_env("FERRY_TEST_S3_HOSTPORT"),
		 s3_env("FERRY_TEST_S3_BUCKET"), (int)getpid());
	b = open_url(url, 1, NULL);
	cr_assert_eq(objstore_put(a, "k", "A", 1), 0);
	cr_assert_eq(objstore_put(b, "k", "B", 1), 0);
	cr_assert_eq(objstore_get(a, "k", 0, buf, 8), 1);
	cr_assert_eq(buf[0], 'A');
	cr_assert_eq(objstore_list(a, "", count_cb, &n), 0);
	cr_assert_eq(n, 1, "a sibling prefix leaked into the listing");
	objstore_close(a);
	objstore_close(b);
}

Test(s3, bad_credentials_and_bucket)
{
	struct objstore_opts o = { .access_key = "NOT-S3RVER", .secret_key = "x" };
	char url[512];
	struct objstore *s;

	snprintf(url, sizeof(url), "s3://%s/%s", s3_env("FERRY_TEST_S3_HOSTPORT"), s3_env("FERRY_TEST_S3_BUCKET"));
	s = open_url(url, 1, &o);
	cr_assert_eq(objstore_check(s, 0), -EACCES, "%s", objstore_last_error());
	cr_assert_eq(objstore_put(s, "k", "x", 1), -EACCES);
	cr_assert(strstr(objstore_last_error(), "403"), "%s", objstore_last_error());
	objstore_close(s);

	s3_env("AWS_ACCESS_KEY_ID");
	snprintf(url, sizeof(url), "s3://%s/no-such-bucket-ferry", s3_env("FERRY_TEST_S3_HOSTPORT"));
	s = open_url(url, 1, NULL);
	cr_assert_eq(objstore_check(s, 0), -ENOENT, "%s", objstore_last_error());
	objstore_close(s);
}

Test(s3, no_credentials)
{
	struct store_url u;
	struct objstore *s = NULL;
	char err[256];

	/* Nothing in the chain: no keys, no profile (HOME has no .aws), no
	 * web identity or container endpoint, IMDS off. */
	unsetenv("AWS_ACCESS_KEY_ID");
	unsetenv("AWS_SECRET_ACCESS_KEY");
	unsetenv("AWS_PROFILE");
	unsetenv("AWS_ROLE_ARN");
	unsetenv("AWS_WEB_IDENTITY_TOKEN_FILE");
	unsetenv("AWS_CONTAINER_CREDENTIALS_FULL_URI");
	unsetenv("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI");
	unsetenv("AWS_SHARED_CREDENTIALS_FILE");
	unsetenv("AWS_CONFIG_FILE");
	setenv("HOME", "/nonexistent", 1);
	setenv("AWS_EC2_METADATA_DISABLED", "true", 1);
	cr_assert_eq(store_url_parse("s3://127.0.0.1:1/bkt", 1, &u, err, sizeof(err)), 0);
	cr_assert_eq(objstore_open(&u, NULL, &s, err, sizeof(err)), -ENOKEY);
	cr_assert_null(s);
	cr_assert(strstr(err, "no credentials") && strstr(err, "AWS_ACCESS_KEY_ID") &&
		  strstr(err, "IMDS disabled"), "%s", err);
	store_url_free(&u);
}

/* ---- s3:// failure paths against a loopback fake ---- */

struct fake_resp {
	int status;             /* 0: accept, read the request, never answer */
	const char *headers;    /* extra header lines, each ending in \r\n */
	const char *body;
};

struct fake {
	int lfd;
	int port;
	pthread_t thread;
	atomic_int requests;
	atomic_int stop;
	const struct fake_resp *script;
	int nscript;            /* the last entry repeats */
};

static int
read_request(int fd)
{
	char buf[65536];
	size_t have = 0;
	char *end;
	long clen = 0;
	int expect = 0;

	for (;;) {
		ssize_t n = recv(fd, buf + have, sizeof(buf) - 1 - have, 0);
		if (n <= 0)
			return -1;
		have += (size_t)n;
		buf[have] = '\0';
		end = strstr(buf, "\r\n\r\n");
		if (end)
			break;
		if (have == sizeof(buf) - 1)
			return -1;
	}
	for (char *l = buf; l < end; l = strstr(l, "\r\n") + 2) {
		if (strncasecmp(l, "Content-Length:", 15) == 0)
			clen = strtol(l + 15, NULL, 10);
		if (strncasecmp(l, "Expect:", 7) == 0)
			expect = 1;
	}
	clen -= (long)(have - (size_t)(end + 4 - buf));
	if (expect && clen > 0 && send(fd, "HTTP/1.1 100 Continue\r\n\r\n", 25, MSG_NOSIGNAL) < 0)
		return -1;
	while (clen > 0) {
		ssize_t n = recv(fd, buf, sizeof(buf), 0);
		if (n <= 0)
			return -1;
		clen -= n;
	}
	return strncmp(buf, "HEAD ", 5) == 0;
}

static void *
fake_main(void *arg)
{
	struct fake *f = arg;

	while (!f->stop) {
		int fd = accept4(f->lfd, NULL, NULL, SOCK_CLOEXEC);
		int i, head;
		const struct fake_resp *r;
		char out[4096], clen[64];

		if (fd < 0)
			break;
		head = read_request(fd);
		if (head < 0) {
			close(fd);
			continue;
		}
		i = atomic_fetch_add(&f->requests, 1);
		r = &f->script[i < f->nscript ? i : f->nscript - 1];
		if (r->status == 0) {
			while (!f->stop)
				usleep(20000);
			close(fd);
			break;
		}
		if (r->headers && strstr(r->headers, "Content-Length:"))
			snprintf(clen, sizeof(clen), "%s", "");
		else
			snprintf(clen, sizeof(clen), "Content-Length: %zu\r\n", r->body ? strlen(r->body) : 0);
		snprintf(out, sizeof(out), "HTTP/1.1 %d X\r\n%s%sConnection: close\r\n\r\n%s",
			 r->status, r->headers ? r->headers : "", clen, head || !r->body ? "" : r->body);
		send(fd, out, strlen(out), MSG_NOSIGNAL);
		close(fd);
	}
	return NULL;
}

static void
fake_start(struct fake *f, const struct fake_resp *script, int n)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t sl = sizeof(sa);

	memset(f, 0, sizeof(*f));
	f->script = script;
	f->nscript = n;
	f->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	cr_assert_geq(f->lfd, 0);
	cr_assert_eq(bind(f->lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	cr_assert_eq(listen(f->lfd, 16), 0);
	cr_assert_eq(getsockname(f->lfd, (struct sockaddr *)&sa, &sl), 0);
	f->port = ntohs(sa.sin_port);
	cr_assert_eq(pthread_create(&f->thread, NULL, fake_main, f), 0);
}

static void
fake_stop(struct fake *f)
{
	f->stop = 1;
	shutdown(f->lfd, SHUT_RDWR);
	pthread_join(f->thread, NULL);
	close(f->lfd);
}

static struct objstore *
open_fake_store(int port, int retries, long timeout_ms)
{
	struct objstore_opts o = { .access_key = "AK", .secret_key = "SK", .max_retries = retries,
				   .timeout_ms = timeout_ms };
	char url[128];

	snprintf(url, sizeof(url), "s3://127.0.0.1:%d/bucket/pfx", port);
	return open_url(url, 1, &o);
}

Test(s3_errors, connection_refused_is_quick)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t sl = sizeof(sa);
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), port;
	struct objstore *s;
	char buf[4];
	double t0;

	/* A port nobody listens on. */
	cr_assert_eq(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	cr_assert_eq(getsockname(fd, (struct sockaddr *)&sa, &sl), 0);
	port = ntohs(sa.sin_port);
	s = open_fake_store(port, 5, 5000);
	t0 = now_s();
	cr_assert_eq(objstore_check(s, 0), -ECONNREFUSED, "%s", objstore_last_error());
	cr_assert_eq(objstore_put(s, "k", "x", 1), -ECONNREFUSED);
	cr_assert_eq(objstore_get(s, "k", 0, buf, 4), -ECONNREFUSED);
	cr_assert_lt(now_s() - t0, 1.0, "connection refused took %.2f s", now_s() - t0);
	cr_assert(strstr(objstore_last_error(), "GET k"), "%s", objstore_last_error());
	objstore_close(s);
	close(fd);
}

Test(s3_errors, retries_5xx_then_success)
{
	static const struct fake_resp script[] = {
		{ 500, NULL, "<Error><Code>InternalError</Code></Error>" },
		{ 503, NULL, "<Error><Code>SlowDown</Code></Error>" },
		{ 429, NULL, NULL },
		{ 200, "ETag: \"x\"\r\n", NULL },
	};
	struct fake f;
	struct objstore *s;

	fake_start(&f, script, 4);
	s = open_fake_store(f.port, 5, 5000);
	cr_assert_eq(objstore_put(s, "chunks/1", "hello", 5), 0, "%s", objstore_last_error());
	cr_assert_eq(atomic_load(&f.requests), 4);
	objstore_close(s);
	fake_stop(&f);
}

Test(s3_errors, always_500_is_eio)
{
	static const struct fake_resp script[] = {
		{ 500, NULL, "<Error><Code>InternalError</Code></Error>" },
	};
	struct fake f;
	struct objstore *s;
	double t0;

	fake_start(&f, script, 1);
	s = open_fake_store(f.port, 3, 5000);
	t0 = now_s();
	cr_assert_eq(objstore_put(s, "chunks/1", "hello", 5), -EIO);
	cr_assert_eq(atomic_load(&f.requests), 4, "1 try + 3 retries");
	cr_assert(strstr(objstore_last_error(), "PUT chunks/1: HTTP 500 (InternalError) after 4 tries"),
		  "%s", objstore_last_error());
	/* Backoff 100 + 200 + 400 ms. */
	cr_assert_geq(now_s() - t0, 0.65);
	cr_assert_lt(now_s() - t0, 3.0);
	objstore_close(s);
	fake_stop(&f);
}

Test(s3_errors, client_errors_are_not_retried)
{
	static const struct fake_resp script[] = {
		{ 400, NULL, "<Error><Code>BadDigest</Code></Error>" },
	};
	struct fake f;
	struct objstore *s;

	fake_start(&f, script, 1);
	s = open_fake_store(f.port, 3, 5000);
	cr_assert_eq(objstore_put(s, "k", "x", 1), -EIO);
	cr_assert_eq(atomic_load(&f.requests), 1);
	cr_assert(strstr(objstore_last_error(), "BadDigest"), "%s", objstore_last_error());
	objstore_close(s);
	fake_stop(&f);
}

Test(s3_errors, damaged_ranges_are_eio)
{
	static const struct fake_resp script[] = {
		/* Wrong start. */
		{ 206, "Content-Range: bytes 1-4/100\r\n", "abcd" },
		/* Fewer bytes than the headers promise (curl: partial file),
		 * retried once. */
		{ 206, "Content-Range: bytes 0-9/100\r\nContent-Length: 10\r\n", "abcd" },
		{ 206, "Content-Range: bytes 0-9/100\r\nContent-Length: 10\r\n", "abcd" },
		/* Short in the middle of the object. */
		{ 206, "Content-Range: bytes 0-3/100\r\n", "abcd" },
		/* More than asked for. */
		{ 206, "Content-Range: bytes 0-19/100\r\n", "abcdefghijklmnopqrst" },
		/* Content-Range and body disagree. */
		{ 206, "Content-Range: bytes 0-5/100\r\n", "abcd" },
		/* Fine: short at the end of the object. */
		{ 206, "Content-Range: bytes 0-3/4\r\n", "abcd" },
	};
	struct fake f;
	struct objstore *s;
	char buf[10];

	fake_start(&f, script, 7);
	s = open_fake_store(f.port, 1, 5000);
	cr_assert_eq(objstore_get(s, "k", 0, buf, 10), -EIO, "%s", objstore_last_error());
	cr_assert_eq(objstore_get(s, "k", 0, buf, 10), -EIO, "%s", objstore_last_error());
	cr_assert_eq(atomic_load(&f.requests), 3);
	cr_assert_eq(objstore_get(s, "k", 0, buf, 10), -EIO, "%s", objstore_last_error());
	cr_assert_eq(objstore_get(s, "k", 0, buf, 10), -EIO, "%s", objstore_last_error());
	cr_assert_eq(objstore_get(s, "k", 0, buf, 10), -EIO, "%s", objstore_last_error());
	cr_assert_eq(objstore_get(s, "k", 0, buf, 10), 4, "%s", objstore_last_error());
	cr_assert_arr_eq(buf, "abcd", 4);
	objstore_close(s);
	fake_stop(&f);
}

Test(s3_errors, timeout)
{
	static const struct fake_resp script[] = { { 0, NULL, NULL } };
	struct fake f;
	struct objstore *s;
	double t0;

	fake_start(&f, script, 1);
	s = open_fake_store(f.port, 1, 300);
	t0 = now_s();
	cr_assert_eq(objstore_head(s, "k", NULL), -ETIMEDOUT, "%s", objstore_last_error());
	cr_assert_lt(now_s() - t0, 3.0);
	objstore_close(s);
	fake_stop(&f);
}

Test(s3_errors, garbled_listing_is_eio)
{
	static const struct fake_resp script[] = {
		{ 200, NULL, "<html>not a listing</html>" },
		{ 200, NULL, "<ListBucketResult><IsTruncated>true</IsTruncated>"
			     "<Contents><Key>pfx/a</Key><Size>1</Size></Contents></ListBucketResult>" },
		{ 200, NULL, "<ListBucketResult><Contents><Key>elsewhere/a</Key><Size>1</Size>"
			     "</Contents></ListBucketResult>" },
		{ 200, NULL, "<ListBucketResult><Contents><Key>pfx/a&bogus;</Key><Size>1</Size>"
			     "</Contents></ListBucketResult>" },
		{ 200, NULL, "<ListBucketResult><Contents><Key>pfx/a&amp;b&#x41;</Key><Size>12</Size>"
			     "</Contents></ListBucketResult>" },
	};
	struct fake f;
	struct objstore *s;
	struct names nm = { 0 };

	fake_start(&f, script, 5);
	s = open_fake_store(f.port, 1, 5000);
	cr_assert_eq(objstore_list(s, "", names_cb, &nm), -EIO);
	cr_assert_eq(objstore_list(s, "", names_cb, &nm), -EIO, "truncated without a token");
	nm.n = 0;
	cr_assert_eq(objstore_list(s, "", names_cb, &nm), -EIO, "key outside the prefix");
	cr_assert_eq(objstore_list(s, "", names_cb, &nm), -EIO, "unknown entity");
	nm.n = 0;
	cr_assert_eq(objstore_list(s, "", names_cb, &nm), 0, "%s", objstore_last_error());
	cr_assert_eq(nm.n, 1);
	cr_assert_str_eq(nm.keys[0], "a&bA");
	objstore_close(s);
	fake_stop(&f);
}

/* 503 SlowDown with Retry-After: the retry waits what the server asked (1 s
 * here), not just the 100 ms backoff. */
Test(s3_errors, retry_after_is_heeded)
{
	static const struct fake_resp script[] = {
		{ 503, "Retry-After: 1\r\n", "<Error><Code>SlowDown</Code></Error>" },
		{ 200, "ETag: \"x\"\r\n", NULL },
	};
	struct fake f;
	struct objstore *s;
	double t0;

	fake_start(&f, script, 2);
	s = open_fake_store(f.port, 3, 5000);
	t0 = now_s();
	cr_assert_eq(objstore_put(s, "chunks/1", "hello", 5), 0, "%s", objstore_last_error());
	cr_assert_eq(atomic_load(&f.requests), 2);
	cr_assert_geq(now_s() - t0, 0.95, "retried after %.2f s", now_s() - t0);
	objstore_close(s);
	fake_stop(&f);
}

static atomic_int cancel_after_calls;

static bool cancel_soon(void *arg)
{
	(void)arg;
	return atomic_fetch_add(&cancel_after_calls, 1) >= 2;
}

/* A call waiting on a server that never answers is given up when its
 * caller's cancel check says so (ferry-mountd: a read whose caller is being
 * killed), long before the request's own timeout, with -EINTR; and so is
 * one waiting to retry. */
Test(s3_errors, cancel_ends_a_stalled_call)
{
	static const struct fake_resp stall[] = { { 0, NULL, NULL } };
	static const struct fake_resp slow[] = {
		{ 503, "Retry-After: 10\r\n", "<Error><Code>SlowDown</Code></Error>" },
	};
	struct fake f;
	struct objstore *s;
	char buf[8];
	double t0;

	fake_start(&f, stall, 1);
	s = open_fake_store(f.port, 5, 20000);
	atomic_store(&cancel_after_calls, 0);
	objstore_set_cancel(cancel_soon, NULL);
	t0 = now_s();
	cr_assert_eq(objstore_get(s, "k", 0, buf, sizeof(buf)), -EINTR, "%s", objstore_last_error());
	cr_assert_lt(now_s() - t0, 5.0, "gave up after %.2f s", now_s() - t0);
	objstore_set_cancel(NULL, NULL);
	objstore_close(s);
	fake_stop(&f);

	fake_start(&f, slow, 1);
	s = open_fake_store(f.port, 5, 20000);
	atomic_store(&cancel_after_calls, 0);
	objstore_set_cancel(cancel_soon, NULL);
	t0 = now_s();
	cr_assert_eq(objstore_put(s, "k", "x", 1), -EINTR, "%s", objstore_last_error());
	cr_assert_lt(now_s() - t0, 5.0, "gave up after %.2f s", now_s() - t0);
	cr_assert_leq(atomic_load(&f.requests), 1, "retried although given up");
	objstore_set_cancel(NULL, NULL);
	objstore_close(s);
	fake_stop(&f);
}
