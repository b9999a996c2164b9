/*
 * S3 credentials that expire, through a real mount (common/aws_creds.h):
 * ferry-mountd and ferry-reconciler each take their keys from a
 * credentials service of the test (creds_server_util.h) whose keys live a
 * few seconds, and reach the test's S3 server through a proxy that
 * refuses, as S3 does, a request whose session token expired or that it
 * never issued (s3_proxy_util.h, strict credentials).
 *
 * Most tests use the container endpoint (EKS Pod Identity). Checked: a
 * stream of writes, fsyncs and cold reads across several expiries fails no
 * call and has no request refused (both daemons refresh ahead of time); a
 * token S3 revokes early costs one refused request and a fetch, not the
 * operation; an authorization token file that goes missing for a while
 * shows as refresh failures, in .stats and in the daemons' log, and
 * nothing else. The other sources that refresh (web identity through STS,
 * IMDSv2, a profile's credential_process) each get a shorter stream
 * across a refresh. No daemon logs a session token or the pod's token.
 *
 * Needs the S3 server scripts/test starts (FERRY_TEST_S3_HOSTPORT,
 * FERRY_TEST_S3_BUCKET and the AWS_* variables): without it the tests
 * fail, they never skip. The credential_process test needs curl.
 *
 * The volume is formatted with the environment's static keys (the proxy
 * not yet strict); the daemons that fm_mount() starts inherit the test
 * process's environment, from which the setup has removed every other
 * source of the chain.
 */
#include "creds_server_util.h"
#include "mount_util.h"
#include "s3_proxy_util.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define KiB 1024
#define MAX_FILES 4096
#define POD_TOKEN "pod-identity-token-of-ferry"
#define ROLE_ARN "arn:aws:iam::123456789012:role/ferry-it"

static struct s3_proxy *proxy;
static struct creds_server *creds;
static char token_file[PATH_MAX];
/* Chunk GETs and PUTs the proxy passed upstream. */
static int gets_watch, puts_watch;

static const char *const s3_env[] = {
	"FERRY_TEST_S3_HOSTPORT", "FERRY_TEST_S3_BUCKET", "AWS_ACCESS_KEY_ID",
	"AWS_SECRET_ACCESS_KEY",  "AWS_REGION",
};

/* Everything of the chain (aws_creds.h) that could pick another source
 * than the test's, or send it elsewhere. */
static const char *const chain_env[] = {
	"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
	"AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE", "AWS_ROLE_ARN",
	"AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_SESSION_NAME", "AWS_ENDPOINT_URL",
	"AWS_ENDPOINT_URL_STS", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
	"AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_CONTAINER_AUTHORIZATION_TOKEN",
	"AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE", "AWS_EC2_METADATA_SERVICE_ENDPOINT",
	"AWS_EC2_METADATA_DISABLED",
};

static void on_issue(void *arg, const char *token, int64_t expires)
{
	s3_proxy_token_add(arg, token, expires);
}

static double mono_s(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* Writes path whole, by a rename, the way a kubelet writes a token. */
static void file_put(const char *path, const char *text, mode_t mode)
{
	char tmp[PATH_MAX + 8];
	size_t len = strlen(text);
	int fd;

	snprintf(tmp, sizeof(tmp), "%s.new", path);
	fd = OK(open(tmp, O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, mode));
	cr_assert_eq(OK(write(fd, text, len)), (ssize_t)len);
	OK(close(fd));
	OK(rename(tmp, path));
}

static void token_file_write(void)
{
	file_put(token_file, POD_TOKEN "\n", 0600);
}

/*
 * A profile "default" in an AWS_CONFIG_FILE of the test's whose
 * credential_process asks the credentials server for a key over curl,
 * with the pod token (as a site's own helper would ask its vault).
 */
static void process_profile_write(void)
{
	const char *const curl[] = { "/bin/sh", "-c", "command -v curl", NULL };
	char text[3 * PATH_MAX];

	cr_assert_eq(fm_run(curl, "/dev/null", "/dev/null", 10), 0,
		     "the credential_process test needs curl in PATH");
	snprintf(text, sizeof(text),
		 "#!/bin/sh\n"
		 "# The test's credential_process: a key from its credentials server.\n"
		 "exec curl -sSf --noproxy '*' --max-time 5 -H \"Authorization: $(cat '%s')\" '%s'\n",
		 token_file, creds_server_url(creds, CREDS_PROCESS));
	file_put(sp("creds-process.sh"), text, 0700);
	snprintf(text, sizeof(text), "[default]\ncredential_process = /bin/sh %s\n",
		 sp("creds-process.sh"));
	file_put(sp("aws-config"), text, 0600);
	setenv("AWS_CONFIG_FILE", sp("aws-config"), 1);
}

/*
 * A volume on a fresh prefix of the test bucket, through the proxy; then
 * the chain pointed at the credentials server's role src, whose keys live
 * lifetime_s, the proxy made strict, and the volume mounted.
 */
static void creds_setup(enum creds_role src, int lifetime_s)
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
	proxy = s3_proxy_start(getenv("FERRY_TEST_S3_HOSTPORT"));
	clock_gettime(CLOCK_REALTIME, &now);
	snprintf(url, sizeof(url), "s3://%s/%s/ferry-creds-%d-%lld%09ld", s3_proxy_hostport(proxy),
		 getenv("FERRY_TEST_S3_BUCKET"), (int)getpid(), (long long)now.tv_sec, now.tv_nsec);
	cr_log_info("storage %s", url);
	fm_setup_opts(&(struct fm_opts){ .storage = url, .s3_http = true, .no_mount = true });

	creds = creds_server_start(POD_TOKEN, lifetime_s, on_issue, proxy);
	snprintf(token_file, sizeof(token_file), "%s", sp("pod-token"));
	token_file_write();
	OK(mkdir(sp("home"), 0700));
	for (size_t i = 0; i < sizeof(chain_env) / sizeof(chain_env[0]); i++)
		unsetenv(chain_env[i]);
	setenv("HOME", sp("home"), 1); /* no ~/.aws of the machine's */
	/* Not to wait on a real IMDS should the source configured be
	 * refused; the IMDS test asks for its own. */
	setenv("AWS_EC2_METADATA_DISABLED", "true", 1);
	switch (src) {
	case CREDS_CONTAINER:
		setenv("AWS_CONTAINER_CREDENTIALS_FULL_URI", creds_server_url(creds, src), 1);
		setenv("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE", token_file, 1);
		break;
	case CREDS_PROCESS:
		process_profile_write();
		break;
	case CREDS_STS:
		setenv("AWS_ROLE_ARN", ROLE_ARN, 1);
		setenv("AWS_WEB_IDENTITY_TOKEN_FILE", token_file, 1);
		setenv("AWS_ENDPOINT_URL_STS", creds_server_url(creds, src), 1);
		break;
	case CREDS_IMDS:
		/* The end of the chain: nothing else configured. */
		unsetenv("AWS_EC2_METADATA_DISABLED");
		setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", creds_server_url(creds, src), 1);
		break;
	}
	gets_watch = s3_proxy_watch(proxy, "GET", "/chunks/");
	puts_watch = s3_proxy_watch(proxy, "PUT", "/chunks/");
	s3_proxy_require_tokens(proxy, true);
	fm_mount();
}

static void creds_teardown(void)
{
	/* The daemons may still talk to the store on their way out. */
	fm_teardown();
	creds_server_stop(creds);
	creds = NULL;
	s3_proxy_stop(proxy);
	proxy = NULL;
}

TestSuite(aws_creds, .fini = creds_teardown, .timeout = 400);

/* .stats s3_credentials: the source's kind, one word. */
static void expect_source(const char *kind)
{
	struct fm_stats s;

	fm_stats_read(&s);
	for (int i = 0; i < s.n; i++)
		if (!strcmp(s.e[i].name, "s3_credentials")) {
			cr_assert_str_eq(s.e[i].value, kind, ".stats: s3_credentials %s, not %s",
					 s.e[i].value, kind);
			return;
		}
	cr_assert_fail(".stats has no s3_credentials line");
}

/* No request of the daemons was refused by the proxy, nor a fetch by the
 * credentials server. */
static void expect_no_refusal(const char *when)
{
	char why[256], cwhy[256];

	s3_proxy_token_last_rejection(proxy, why, sizeof(why));
	creds_server_last_refusal(creds, cwhy, sizeof(cwhy));
	cr_assert_eq(s3_proxy_token_rejections(proxy), 0, "%s: %u requests refused, the last: %s",
		     when, s3_proxy_token_rejections(proxy), why);
	cr_assert_eq(creds_server_refusals(creds), 0, "%s: %u credential fetches refused, the "
		     "last: %s", when, creds_server_refusals(creds), cwhy);
}

/* ferry-mountd's log, which ferry-reconciler writes to as well. */
static char *daemon_log(void)
{
	char *log = fm_slurp(sp("vol/ferry-mountd.log"));

	cr_assert(log, "cannot read %s: %s", sp("vol/ferry-mountd.log"), strerror(errno));
	return log;
}

/* How many lines of log prog ("ferry-mountd", "ferry-reconciler"; NULL:
 * any) wrote that hold what (and also2, if not NULL). */
static int log_lines(const char *log, const char *prog, const char *what, const char *also2)
{
	char who[64];
	int n = 0;

	snprintf(who, sizeof(who), " %s[", prog ? prog : "");
	for (const char *l = log; *l;) {
		size_t len = strcspn(l, "\n");
		char *line = strndup(l, len);

		cr_assert(line);
		n += (!prog || strstr(line, who)) && strstr(line, what) &&
		     (!also2 || strstr(line, also2));
		free(line);
		l += len + (l[len] == '\n');
	}
	return n;
}

/* Neither the daemons' log nor the fixture's log of ferry commands holds
 * a session token the server issued or the pod's token. */
static void expect_log_keeps_secrets(const char *when)
{
	const char *paths[] = { sp("vol/ferry-mountd.log"), fm.log };

	for (size_t i = 0; i < sizeof(paths) / sizeof(paths[0]); i++) {
		char *log = fm_slurp(paths[i]);

		if (!log)
			continue; /* nothing written, nothing told */
		cr_assert(!strstr(log, "tok-"), "%s: %s holds a session token:\n%s", when, paths[i],
			  strstr(log, "tok-"));
		cr_assert(!strstr(log, POD_TOKEN), "%s: %s holds the pod token", when, paths[i]);
		free(log);
	}
}

/* The workload's files: f<i>, of a size and content that i decides. */
static size_t file_size(int i)
{
	uint64_t s = 0x9e3779b97f4a7c15ull * (uint64_t)(i + 1);

	if (i % 17 == 5)
		return 1536 * KiB + (size_t)(fm_rand(&s) % (256 * KiB)); /* the odd larger one */
	return 1 + (size_t)(fm_rand(&s) % (384 * KiB));
}

static unsigned char *file_data(int i)
{
	size_t len = file_size(i);
	unsigned char *d = malloc(len);
	uint64_t seed = 0xf00dull + (uint64_t)i * 7919;

	cr_assert(d);
	fm_fill_random(&seed, d, len);
	return d;
}

/* Writes f<i>; the even ones with an fsync (fsync=remote: the store has
 * it on return), the odd ones only closed (ferry-reconciler uploads them
 * once closes pause). */
static void write_file(int i)
{
	unsigned char *d = file_data(i);
	size_t len = file_size(i);
	int fd = OK(open(mp("f%d", i), O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0644));

	fm_pwrite_all(fd, d, len, 0);
	if (i % 2 == 0)
		OK(fsync(fd));
	OK(close(fd));
	free(d);
}

static void check_file(int i)
{
	unsigned char *d = file_data(i);

	fm_expect_content(mp("f%d", i), d, file_size(i));
	free(d);
}

/* Work a stream does each round besides its own files; given whether the
 * mount's first key has expired, returns whether it has work left. */
typedef bool (*stream_extra_fn)(void *arg, bool first_key_gone);

struct stream_result {
	uint64_t refreshes;      /* ferry-mountd's, at the end */
	/* The least time left (s) of ferry-mountd's key at any sample.
	 * Refreshed half-way through its life, the key it holds always has
	 * about half its life left; 2 s before its end the provider no longer
	 * hands it out, and a caller then waits for a fetch (aws_creds.h:
	 * "callers are not held up unless what the provider holds has
	 * expired"). */
	int64_t least_left;
	/* Chunk requests the proxy passed after the mount's first key expired. */
	unsigned gets_after, puts_after;
};

/*
 * The stream on the mount as it is: each round writes file *n (and moves
 * *n on), does extra's work, reads back the file written three rounds
 * earlier; until ferry-mountd refreshed min_refreshes times, min_s have
 * passed and extra has nothing left. keys_life: the keys' lifetime (s),
 * for when the mount's first key has surely expired.
 */
static void stream(const char *when, int keys_life, uint64_t min_refreshes, double min_s, int *n,
		   stream_extra_fn extra, void *arg, struct stream_result *r)
{
	const int first = *n;
	double t0 = mono_s(), deadline = t0 + 150;
	unsigned gets0 = 0, puts0 = 0;
	bool gone = false, more = extra != NULL;

	memset(r, 0, sizeof(*r));
	r->least_left = INT64_MAX;
	for (;;) {
		double t = mono_s() - t0;
		struct fm_stats s;
		int64_t left;

		fm_stats_read(&s);
		r->refreshes = fm_stats_need(&s, "s3_credentials_refreshes");
		left = (int64_t)fm_stats_need(&s, "s3_credentials_expire") - (int64_t)time(NULL);
		if (left < r->least_left)
			r->least_left = left;
		/* The mount's first key was fetched before t0. */
		if (!gone && t >= keys_life + 1) {
			gone = true;
			gets0 = s3_proxy_watched(proxy, gets_watch);
			puts0 = s3_proxy_watched(proxy, puts_watch);
		}
		if (r->refreshes >= min_refreshes && t >= min_s && !more)
			break;
		cr_assert(mono_s() < deadline, "%s: ferry-mountd refreshed %llu times in %.0f s", when,
			  (unsigned long long)r->refreshes, t);
		cr_assert(*n < MAX_FILES);
		write_file((*n)++);
		if (extra)
			more = extra(arg, gone);
		if (*n - first > 3)
			check_file(*n - 4);
		usleep(100 * 1000);
	}
	if (gone) {
		r->gets_after = s3_proxy_watched(proxy, gets_watch) - gets0;
		r->puts_after = s3_proxy_watched(proxy, puts_watch) - puts0;
	}
}

/* Mount B's extra work: the files of mount A read cold, the even ones
 * before B's first key expires, the odd ones after. */
struct cold_reads {
	int na, even, odd;
};

static bool cold_read_one(void *arg, bool first_key_gone)
{
	struct cold_reads *c = arg;

	if (!first_key_gone && c->even < c->na) {
		check_file(c->even);
		c->even += 2;
	} else if (first_key_gone && c->odd < c->na) {
		check_file(c->odd);
		c->odd += 2;
	}
	return c->odd < c->na;
}

/*
 * Keys that live 15 s, and 40 s of work on two mounts one after the
 * other: files written, half of them fsynced, half only closed (uploads
 * by both daemons), read back soon after, and read cold on the second
 * mount (GETs), some of them after its first key expired. Every call succeeds, the
 * proxy refuses nothing, both daemons fetched keys ahead of expiry, and
 * every byte is there after a last cold remount.
 */
Test(aws_creds, expiring_credentials_mid_stream)
{
	const int life = 15;
	struct cold_reads cold = { .odd = 1 };
	struct stream_result a, b;
	unsigned fetches_before_b, fetches_b;
	int n = 0;

	creds_setup(CREDS_CONTAINER, life);

	/* Mount A: for 20 s and until mountd has refreshed twice (at about
	 * 8 and 16 s). */
	stream("mount A", life, 2, 20, &n, NULL, NULL, &a);
	expect_source("container");
	cr_assert_eq(fm_stat("s3_credentials_refresh_failures"), 0);
	cr_assert_gt(a.puts_after, 0, "no upload after the first key of mount A expired");
	/* About 7 s left at worst; 2 allows a refresh 4 s late (a loaded
	 * machine), not one that waits for the key's end. */
	cr_assert_gt(a.least_left, 2, "mount A: ferry-mountd held a key %lld s from its end: not "
		     "refreshed ahead of its expiry", (long long)a.least_left);
	expect_no_refusal("mount A");
	cr_log_info("mount A: %d files, %llu refreshes, %u fetches, %u chunk PUTs, %u chunk GETs, "
		    "key's least time left %lld s", n, (unsigned long long)a.refreshes,
		    creds_server_fetches(creds), s3_proxy_watched(proxy, puts_watch),
		    s3_proxy_watched(proxy, gets_watch), (long long)a.least_left);

	/* Mount B, cache empty: more writes, and mount A's files read cold. */
	cold.na = n;
	fetches_before_b = creds_server_fetches(creds);
	fm_remount_cold();
	stream("mount B", life, 2, 22, &n, cold_read_one, &cold, &b);
	fm_wait_committed("mount B", 120);
	expect_source("container");
	cr_assert_eq(fm_stat("s3_credentials_refresh_failures"), 0);
	fetches_b = creds_server_fetches(creds) - fetches_before_b;
	cr_log_info("mount B: %d files, %llu refreshes, %u fetches (%u in all), %u chunk PUTs, "
		    "%u chunk GETs (%u after %d s), key's least time left %lld s", n - cold.na,
		    (unsigned long long)b.refreshes, fetches_b, creds_server_fetches(creds),
		    s3_proxy_watched(proxy, puts_watch), s3_proxy_watched(proxy, gets_watch),
		    b.gets_after, life + 1, (long long)b.least_left);
	cr_assert_gt(b.gets_after, 0,
		     "no object read from the store after the first key of mount B expired");
	cr_assert_gt(b.puts_after, 0, "no upload after the first key of mount B expired");
	cr_assert_gt(b.least_left, 2, "mount B: ferry-mountd held a key %lld s from its end: not "
		     "refreshed ahead of its expiry", (long long)b.least_left);
	expect_no_refusal("mount B");
	/* mountd's first key and its refreshes, the reconciler's first key
	 * and at least one refresh of its own. */
	cr_assert_geq(fetches_b, b.refreshes + 3,
		      "mount B: %u fetches, ferry-mountd's first and %llu refreshes: did "
		      "ferry-reconciler refresh its key?", fetches_b,
		      (unsigned long long)b.refreshes);

	fm_remount_cold();
	for (int i = 0; i < n; i++)
		check_file(i);
	expect_no_refusal("the last cold remount");
	expect_log_keeps_secrets("after three mounts");
}

/*
 * S3 takes the daemons' keys for expired long before their Expiration
 * (revoked, or a clock far off): the next request of each is refused with
 * ExpiredToken, which makes it fetch a new key and go again with it; the
 * cold read (ferry-mountd's GET), the fsync and the upload of a file only
 * closed (ferry-reconciler's) that met the refusals succeed.
 */
Test(aws_creds, expired_token_is_refetched)
{
	unsigned char *a = malloc(700 * KiB), *b = malloc(900 * KiB), *c = malloc(300 * KiB);
	uint64_t seed = 0xe7;
	unsigned fetches, gets0, puts0;
	char why[256];
	int fd;

	cr_assert(a && b && c);
	fm_fill_random(&seed, a, 700 * KiB);
	fm_fill_random(&seed, b, 900 * KiB);
	fm_fill_random(&seed, c, 300 * KiB);
	creds_setup(CREDS_CONTAINER, 3600); /* no refresh of their own in this test */
	fd = OK(open(mp("a"), O_CREAT | O_WRONLY | O_CLOEXEC, 0644));
	fm_pwrite_all(fd, a, 700 * KiB, 0);
	OK(fsync(fd));
	OK(close(fd));
	fm_remount_cold();
	expect_source("container");
	expect_no_refusal("before the revocation");
	fetches = creds_server_fetches(creds);
	gets0 = s3_proxy_watched(proxy, gets_watch);

	s3_proxy_token_expire_all(proxy);
	/* A read of what only the store has (ferry-mountd's GET)... */
	fm_expect_content(mp("a"), a, 700 * KiB);
	cr_assert_gt(s3_proxy_watched(proxy, gets_watch), gets0, "the read never reached the store");
	/* ...and an upload. */
	fd = OK(open(mp("b"), O_CREAT | O_WRONLY | O_CLOEXEC, 0644));
	fm_pwrite_all(fd, b, 900 * KiB, 0);
	OK(fsync(fd));
	OK(close(fd));
	/* ...and an upload nothing waits for. */
	puts0 = s3_proxy_watched(proxy, puts_watch);
	fm_write_file(mp("c"), c, 300 * KiB);
	fm_wait_committed("c", 120);
	cr_assert_gt(s3_proxy_watched(proxy, puts_watch), puts0, "c was not uploaded");

	s3_proxy_token_last_rejection(proxy, why, sizeof(why));
	cr_log_info("%u requests refused (the last: %s), %u keys fetched since",
		    s3_proxy_token_rejections(proxy), why, creds_server_fetches(creds) - fetches);
	cr_assert_geq(s3_proxy_token_rejections(proxy), 1, "no request met the revoked token");
	cr_assert(strstr(why, "ExpiredToken"), "the last refusal: %s", why);
	/* ferry-mountd's GET and ferry-reconciler's first upload each met it. */
	cr_assert_geq(s3_proxy_token_rejections(proxy), 2,
		      "only one daemon met the revoked token");
	cr_assert_geq(creds_server_fetches(creds), fetches + 2,
		      "not both daemons fetched a new key");
	cr_assert_geq(fm_stat("s3_credentials_refreshes"), 1,
		      "ferry-mountd read with a revoked key, yet did not refresh");
	cr_assert_eq(fm_stat("s3_credentials_refresh_failures"), 0);
	cr_assert_eq(creds_server_refusals(creds), 0);

	fm_remount_cold();
	fm_expect_content(mp("a"), a, 700 * KiB);
	fm_expect_content(mp("b"), b, 900 * KiB);
	fm_expect_content(mp("c"), c, 300 * KiB);
	expect_log_keeps_secrets("after the revocation");
	free(a);
	free(b);
	free(c);
}

#define REFRESH_FAILED "s3 credentials: refresh failed"
#define ANSWERS_AGAIN "answers again"

/*
 * The authorization token file goes away just after the mount: writes go
 * on with the keys held, the refreshes due fail (.stats, and a log line of
 * each daemon that says why), and once the file is back the next attempt
 * succeeds (a log line of each daemon) and later ones keep succeeding
 * (without a line), all before the keys held ran out: no call fails, no
 * request is refused. Keys live 16 s: refreshed 8 s after they were
 * fetched, unusable after 14 s (aws_creds.c hands out none within 2 s of
 * its end), so the test has 6 s to see both daemons fail and put the file
 * back.
 */
Test(aws_creds, token_file_disappears)
{
	const int life = 16;
	static const char *const daemons[] = { "ferry-mountd", "ferry-reconciler" };
	int n = 0, failed_lines[2] = { 0 };
	uint64_t failures, refreshes;
	double t0, deadline;
	bool all_failed;
	char *log;

	creds_setup(CREDS_CONTAINER, life);
	OK(unlink(token_file));
	t0 = mono_s();

	/* Writes go on until a refresh of each daemon has failed (and none
	 * succeeded): ferry-mountd's in .stats, both in the log. */
	deadline = t0 + 60;
	for (;;) {
		struct fm_stats s;

		fm_stats_read(&s);
		failures = fm_stats_need(&s, "s3_credentials_refresh_failures");
		refreshes = fm_stats_need(&s, "s3_credentials_refreshes");
		cr_assert_eq(refreshes, 0, "a refresh without the token file");
		log = daemon_log();
		cr_assert_eq(log_lines(log, NULL, ANSWERS_AGAIN, NULL), 0,
			     "a daemon logged its source answering again without the token file");
		all_failed = failures > 0;
		for (int d = 0; d < 2; d++) {
			failed_lines[d] = log_lines(log, daemons[d], REFRESH_FAILED, NULL);
			all_failed &= failed_lines[d] > 0;
		}
		free(log);
		if (all_failed)
			break;
		cr_assert(mono_s() < deadline, "%.0f s after the token file went: %llu refresh "
			  "failures in .stats, %d and %d lines of ferry-mountd and ferry-reconciler "
			  "saying so", mono_s() - t0, (unsigned long long)failures, failed_lines[0],
			  failed_lines[1]);
		cr_assert(n < MAX_FILES);
		write_file(n++);
		usleep(100 * 1000);
	}
	token_file_write();
	cr_log_info("%llu refresh failures after %.1f s; token file back",
		    (unsigned long long)failures, mono_s() - t0);
	/* Each says why: the file it could not read. */
	log = daemon_log();
	for (int d = 0; d < 2; d++)
		cr_assert_geq(log_lines(log, daemons[d], REFRESH_FAILED, "pod-token"), 1,
			      "%s's refresh failure does not name the token file:\n%s", daemons[d],
			      log);
	free(log);

	/* The retry succeeds, and each daemon says so once... */
	deadline = mono_s() + 90;
	for (;;) {
		bool all_back = (refreshes = fm_stat("s3_credentials_refreshes")) > 0;

		log = daemon_log();
		for (int d = 0; d < 2; d++)
			all_back &= log_lines(log, daemons[d], ANSWERS_AGAIN, NULL) > 0;
		free(log);
		if (all_back)
			break;
		cr_assert(mono_s() < deadline, "no refresh succeeded after the token file came back "
			  "(%llu failures, %llu refreshes of ferry-mountd)",
			  (unsigned long long)fm_stat("s3_credentials_refresh_failures"),
			  (unsigned long long)refreshes);
		cr_assert(n < MAX_FILES);
		write_file(n++);
		usleep(100 * 1000);
	}
	failures = fm_stat("s3_credentials_refresh_failures");
	log = daemon_log();
	for (int d = 0; d < 2; d++)
		failed_lines[d] = log_lines(log, daemons[d], REFRESH_FAILED, NULL);
	free(log);
	/* ...and so does the next one, due half a lifetime later. */
	deadline = mono_s() + 90;
	while (fm_stat("s3_credentials_refreshes") < refreshes + 1) {
		cr_assert(mono_s() < deadline, "no second refresh after the token file came back");
		cr_assert(n < MAX_FILES);
		write_file(n++);
		usleep(100 * 1000);
	}
	cr_assert_eq(fm_stat("s3_credentials_refresh_failures"), failures,
		     "refreshes failed after the token file came back");
	log = daemon_log();
	for (int d = 0; d < 2; d++) {
		cr_assert_eq(log_lines(log, daemons[d], REFRESH_FAILED, NULL), failed_lines[d],
			     "%s logged refresh failures after its source answered again:\n%s",
			     daemons[d], log);
		/* Only the first good refresh after failures is news. */
		cr_assert_eq(log_lines(log, daemons[d], ANSWERS_AGAIN, NULL), 1,
			     "%s: not one line of its source answering again:\n%s", daemons[d], log);
	}
	free(log);
	expect_source("container");
	expect_no_refusal("with the token file gone and back");
	expect_log_keeps_secrets("with the token file gone and back");
	cr_log_info("%d files, %llu refreshes, %llu failures, %u fetches in %.1f s", n,
		    (unsigned long long)fm_stat("s3_credentials_refreshes"),
		    (unsigned long long)failures, creds_server_fetches(creds), mono_s() - t0);

	fm_remount_cold();
	for (int i = 0; i < n; i++)
		check_file(i);
	expect_no_refusal("the last cold remount");
}

/*
 * One source that refreshes, on its own: keys that live `life` s, a
 * stream across ferry-mountd's first refresh and past its first key's
 * end; no call fails, the proxy and the credentials server refuse
 * nothing, .stats names the source's kind and counts the refresh, both
 * daemons logged which source they use (naming it: name_part) and no
 * secret, and every byte is there after a cold remount.
 */
static void source_streams(enum creds_role src, const char *kind, const char *name_part,
			   int life)
{
	struct stream_result r;
	unsigned fetches;
	char *log;
	int n = 0;

	creds_setup(src, life);
	stream(kind, life, 1, life + 2, &n, NULL, NULL, &r);
	fm_wait_committed(kind, 120);
	expect_source(kind);
	cr_assert_eq(fm_stat("s3_credentials_refresh_failures"), 0);
	fetches = creds_server_fetches(creds);
	cr_log_info("%s: %d files, %llu refreshes, %u fetches, %u chunk PUTs (%u after %d s), "
		    "key's least time left %lld s", kind, n, (unsigned long long)r.refreshes,
		    fetches, s3_proxy_watched(proxy, puts_watch), r.puts_after, life + 1,
		    (long long)r.least_left);
	cr_assert_gt(r.puts_after, 0, "%s: no upload after the first key expired", kind);
	/* Refreshed half-way: some 4 s of slack before a key runs out. */
	cr_assert_gt(r.least_left, 0, "%s: ferry-mountd held a key at its end", kind);
	expect_no_refusal(kind);
	/* The first key of each daemon, and a refresh of each. */
	cr_assert_geq(fetches, r.refreshes + 3, "%s: %u fetches, ferry-mountd's first and %llu "
		      "refreshes: did ferry-reconciler refresh its key?", kind, fetches,
		      (unsigned long long)r.refreshes);
	log = daemon_log();
	cr_assert_geq(log_lines(log, "ferry-mountd", "s3 credentials from ", name_part), 1,
		      "%s: ferry-mountd did not log its source:\n%s", kind, log);
	cr_assert_geq(log_lines(log, "ferry-reconciler", "s3 credentials from ", name_part), 1,
		      "%s: ferry-reconciler did not log its source:\n%s", kind, log);
	cr_assert_eq(log_lines(log, NULL, REFRESH_FAILED, NULL), 0, "%s:\n%s", kind, log);
	free(log);

	fm_remount_cold();
	for (int i = 0; i < n; i++)
		check_file(i);
	expect_no_refusal("the cold remount");
	expect_log_keeps_secrets(kind);
}

/* EKS IRSA: AWS_ROLE_ARN and a token file, STS's AssumeRoleWithWebIdentity. */
Test(aws_creds, web_identity_refreshes)
{
	source_streams(CREDS_STS, "web-identity", ROLE_ARN, 10);
}

/* EC2: nothing configured, IMDSv2 (a session token, then the role's key). */
Test(aws_creds, imds_refreshes)
{
	source_streams(CREDS_IMDS, "imds", "IMDS", 10);
}

/* A profile's credential_process, run again for each refresh. */
Test(aws_creds, credential_process_refreshes)
{
	source_streams(CREDS_PROCESS, "credential-process", "credential_process", 10);
}
