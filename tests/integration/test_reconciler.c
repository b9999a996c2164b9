/*
 * ferry-reconciler end to end: a real volume (ferry format), a real
 * ferry-reconciler on a temporary socket, staging files, journal records
 * and handoffs sent the way ferry-mountd will send them; results checked
 * through a real mount with an empty read cache. The inodes are made
 * through the mount first (mountd and the reconciler never write the
 * database at the same time here).
 */
#include "mount_util.h"
#include "reconciler_client_util.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "boot.h"
#include "rpc_frame.h"

#define MiB (1024 * 1024)

static struct rcu rc;

static void setup_common(const struct fm_opts *o)
{
	fm_setup_opts(o);
	/* This suite runs its own reconciler: the mount commits by itself, so
	 * the two never number jobs of one inode. */
	fm.no_reconciler = true;
	rcu_init(&rc, fm.vol, sp("staging"), sp("rec.sock"), sp("reconciler.log"));
}

static void setup(void)
{
	struct fm_opts o = { .no_mount = true };
	setup_common(&o);
}

static void teardown(void)
{
	/* RCU_KEEP_LOG=PATH keeps the daemon's log of the last test (debugging). */
	if (getenv("RCU_KEEP_LOG")) {
		const char *cp[] = { "/bin/cp", rc.log, getenv("RCU_KEEP_LOG"), NULL };
		fm_run(cp, "/dev/null", "/dev/null", 10);
	}
	rcu_fini(&rc);
	fm_teardown();
}

TestSuite(reconciler, .init = setup, .fini = teardown, .timeout = 300);

/* Creates empty files through a mount; returns their inode numbers. */
static void make_files(int n, const char *fmt, uint64_t *inos)
{
	fm_mount();
	for (int i = 0; i < n; i++) {
		char name[64];
		struct stat st;
		int fd;

		snprintf(name, sizeof(name), fmt, i);
		fd = OK(open(mp("%s", name), O_CREAT | O_WRONLY, 0644));
		close(fd);
		OK(stat(mp("%s", name), &st));
		inos[i] = st.st_ino;
	}
	fm_umount();
}

/* Mounts with a new, empty read cache: every byte from the store. */
static void mount_cold(void)
{
	fm.n_cache++;
	snprintf(fm.cache, sizeof(fm.cache), "%s/cache-%d", fm.dir, fm.n_cache);
	cr_assert(mkdir(fm.cache, 0700) == 0);
	fm_mount();
}

static void check_file(const char *name, const void *want, size_t len)
{
	size_t got_len;
	unsigned char *got = fm_read_file(mp("%s", name), &got_len);

	cr_assert_eq(got_len, len, "%s: %zu bytes, want %zu", name, got_len, len);
	for (size_t i = 0; i < len; i++)
		if (got[i] != ((const unsigned char *)want)[i])
			cr_assert_fail("%s: first difference at byte %zu", name, i);
	free(got);
}

static char *log_text(void)
{
	char *t = fm_slurp(rc.log);
	return t ? t : strdup("");
}

Test(reconciler, many_small_files)
{
	enum { N = 150 };
	uint64_t inos[N], st = 1;
	unsigned char *data[N];
	size_t len[N];
	struct reconcile_stats s;
	int sock;

	make_files(N, "small-%d", inos);
	rcu_start(&rc);
	sock = rcu_connect(&rc);
	for (int i = 0; i < N; i++) {
		struct reconcile_job j;
		char name[64];

		len[i] = i == 0 ? 0 : (size_t)(fm_rand(&st) % (300 * 1024));
		data[i] = malloc(len[i] + 1);
		fm_fill_random(&st, data[i], len[i]);
		snprintf(name, sizeof(name), "%llu-%d", (unsigned long long)inos[i], i);
		rcu_stage(&rc, name, data[i], len[i]);
		rcu_job(&j, 100 + (uint64_t)i, inos[i], len[i], name);
		rcu_handoff(&rc, sock, &j);
	}
	rcu_wait_range(sock, 100, N, NULL);
	close(sock);
	rcu_stats(&rc, &s);
	cr_assert_eq(s.committed_total, N);
	cr_assert_eq(s.staging_blocks, 0);
	cr_assert_eq(s.staging_bytes, 0);
	cr_assert_eq(s.inflight, 0);
	cr_assert_eq(s.failures_total, 0);
	cr_assert_geq(s.uploads_total, N - 1);
	/* Staging files and records are gone. */
	cr_assert_eq(rcu_count(&rc, ""), 0);
	cr_assert_eq(rcu_stop(&rc, SIGTERM), 0);

	mount_cold();
	for (int i = 0; i < N; i++) {
		char name[64];
		snprintf(name, sizeof(name), "small-%d", i);
		check_file(name, data[i], len[i]);
		free(data[i]);
	}
	fm_umount();
}

/* A free TCP port on 127.0.0.1 (bound, then released). */
static int free_port(void)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t sl = sizeof(sa);
	int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	cr_assert(bind(s, (struct sockaddr *)&sa, sizeof(sa)) == 0);
	cr_assert(getsockname(s, (struct sockaddr *)&sa, &sl) == 0);
	close(s);
	return ntohs(sa.sin_port);
}

/* curl's output for a URL; *status gets the HTTP code. */
static char *http_get(const char *url, int *status)
{
	const char *argv[] = { "/usr/bin/curl", "-s", "-o", sp("http.body"), "-w", "%{http_code}",
			       url, NULL };
	char *code;

	cr_assert_eq(fm_run(argv, sp("http.code"), "/dev/null", 30), 0, "curl %s", url);
	code = fm_slurp(sp("http.code"));
	*status = atoi(code);
	free(code);
	return fm_slurp(sp("http.body"));
}

static uint64_t prom_value(const char *text, const char *name)
{
	char pat[128];
	const char *p;

	snprintf(pat, sizeof(pat), "\n%s ", name);
	p = strstr(text, pat);
	cr_assert(p, "no %s in:\n%s", name, text);
	return strtoull(p + strlen(pat), NULL, 10);
}

Test(reconciler, big_file_stats_and_metrics)
{
	size_t len = 200000000;
	unsigned char *data = malloc(len);
	uint64_t ino, st = 99;
	struct reconcile_job j;
	struct reconcile_reply rep;
	char port[16], addr[64], url[128];
	int sock, code;
	char *text;

	fm_fill_random(&st, data, len);
	make_files(1, "big", &ino);
	snprintf(port, sizeof(port), "%d", free_port());
	snprintf(addr, sizeof(addr), "127.0.0.1:%s", port);
	rc.extra[0] = "--metrics";
	rc.extra[1] = addr;
	rc.extra[2] = "--buffer-mib";
	rc.extra[3] = "16";
	rcu_start(&rc);

	rcu_stage(&rc, "big-1", data, len);
	rcu_job(&j, 1, ino, len, "big-1");
	sock = rcu_connect(&rc);
	rcu_handoff(&rc, sock, &j);
	/* While it uploads: 48 blocks of 4 MiB are staged. */
	cr_assert_eq(reconcile_stats_query(sock), 0);
	cr_assert_eq(reconcile_recv_reply(sock, &rep), 0);
	cr_assert_eq(rep.type, RECONCILE_REPLY_STATS);
	cr_assert_eq(rep.stats.staging_blocks, 48);
	cr_assert_eq(rep.stats.staging_bytes, len);
	cr_assert_eq(rep.stats.inflight, 1);
	cr_assert_leq(rep.stats.buffer_bytes, 16u * MiB + 8, "buffers past the budget");
	snprintf(url, sizeof(url), "http://127.0.0.1:%s/metrics", port);
	text = http_get(url, &code);
	cr_assert_eq(code, 200);
	cr_assert_eq(prom_value(text, "passthrough_staging_blocks"), 48, "%s", text);
	free(text);
	cr_assert_eq(rcu_wait_committed(sock, 1), 0);

	text = http_get(url, &code);
	cr_assert_eq(code, 200);
	cr_assert_eq(prom_value(text, "passthrough_staging_blocks"), 0);
	cr_assert_eq(prom_value(text, "passthrough_staging_bytes"), 0);
	cr_assert_eq(prom_value(text, "reconcile_inflight"), 0);
	cr_assert_eq(prom_value(text, "reconcile_failures_total"), 0);
	cr_assert_eq(prom_value(text, "uploads_total"), 48); /* 16 + 16 + 16 objects in 3 chunks */
	cr_assert_eq(prom_value(text, "upload_latency_seconds_count"), 48);
	cr_assert(strstr(text, "upload_latency_seconds_bucket{le=\"+Inf\"} 48"), "%s", text);
	/* A file:// store has no credentials to show. */
	cr_assert_null(strstr(text, "s3_credentials"), "%s", text);
	free(text);
	snprintf(url, sizeof(url), "http://127.0.0.1:%s/other", port);
	text = http_get(url, &code);
	cr_assert_eq(code, 404);
	free(text);
	close(sock);
	cr_assert_eq(rcu_stop(&rc, SIGINT), 0);

	mount_cold();
	check_file("big", data, len);
	fm_umount();
	free(data);
}

Test(reconciler, dirty_ranges_and_size_only)
{
	size_t len = 10 * MiB, nlen = 12 * MiB + 333;
	unsigned char *a = malloc(nlen), *b = malloc(nlen), *want = calloc(1, nlen);
	uint64_t st = 5, ino_d, ino_t;
	struct reconcile_job j;
	struct reconcile_range r[] = { { 0, 100 }, { 4 * MiB - 10, 4 * MiB + 10 },
				       { 9 * MiB, 11 * MiB }, { 12 * MiB, 12 * MiB + 333 } };
	struct stat sb;
	int sock, fd;

	fm_fill_random(&st, a, nlen);
	fm_fill_random(&st, b, nlen);
	/* Committed content A (through the mount, as mountd does today). */
	fm_mount();
	fm_write_file(mp("d"), a, len);
	fm_write_file(mp("t"), a, len);
	OK(stat(mp("d"), &sb));
	ino_d = sb.st_ino;
	OK(stat(mp("t"), &sb));
	ino_t = sb.st_ino;
	fm_umount();

	/* A sparse staging file holding B only in the dirty ranges. */
	rcu_stage(&rc, "d-1", NULL, nlen);
	fd = openat(rc.staging_fd, "d-1", O_WRONLY | O_CLOEXEC);
	memcpy(want, a, len);
	for (size_t i = 0; i < sizeof(r) / sizeof(r[0]); i++) {
		fm_pwrite_all(fd, b + r[i].start, r[i].end - r[i].start, (off_t)r[i].start);
		memcpy(want + r[i].start, b + r[i].start, r[i].end - r[i].start);
	}
	close(fd);
	rcu_job(&j, 1, ino_d, nlen, "d-1");
	j.dirty = r;
	j.ndirty = sizeof(r) / sizeof(r[0]);
	rcu_start(&rc);
	sock = rcu_connect(&rc);
	rcu_handoff(&rc, sock, &j);
	cr_assert_eq(rcu_wait_committed(sock, 1), 0);
	/* A truncate only: nothing uploaded, the length changes. */
	rcu_stage(&rc, "t-1", NULL, 1000);
	rcu_job(&j, 2, ino_t, 1000, "t-1");
	j.size_only = 1;
	rcu_handoff(&rc, sock, &j);
	cr_assert_eq(rcu_wait_committed(sock, 2), 0);
	close(sock);
	cr_assert_eq(rcu_stop(&rc, SIGTERM), 0);

	mount_cold();
	check_file("d", want, nlen);
	check_file("t", a, 1000);
	fm_umount();
	free(a);
	free(b);
	free(want);
}

/* Stages len bytes of buf as "<prefix>-<i>" and hands it over as job seq
 * i + 1 of inode ino. */
static void hand_over(int sock, const char *prefix, int i, uint64_t ino, const void *buf,
		      size_t len)
{
	struct reconcile_job j;
	char name[32];

	snprintf(name, sizeof(name), "%s-%d", prefix, i);
	rcu_stage(&rc, name, buf, len);
	rcu_job(&j, 1 + (uint64_t)i, ino, len, name);
	rcu_handoff(&rc, sock, &j);
}

/* Reads replies up to Drained (in *rep then), each before it a Committed
 * without error; its seq is marked in seen (if not NULL). Returns how
 * many came. */
static int read_until_drained(int sock, struct reconcile_reply *rep, bool *seen)
{
	int n = 0;

	for (;;) {
		cr_assert_eq(reconcile_recv_reply(sock, rep), 0);
		if (rep->type == RECONCILE_REPLY_DRAINED)
			return n;
		cr_assert_eq(rep->type, RECONCILE_REPLY_COMMITTED);
		cr_assert_eq(rep->error, 0);
		if (seen)
			seen[rep->seq - 1] = true;
		n++;
	}
}

Test(reconciler, drain_is_not_endless)
{
	enum { N = 60 };
	uint64_t inos[N], st = 3;
	unsigned char buf[64 * 1024];
	struct reconcile_reply rep;
	bool seen[N] = { 0 };
	int sock, committed_before;

	make_files(N, "dr-%d", inos);
	rcu_start(&rc);
	sock = rcu_connect(&rc);
	for (int i = 0; i < N / 2; i++) {
		fm_fill_random(&st, buf, sizeof(buf));
		hand_over(sock, "dr", i, inos[i], buf, sizeof(buf));
	}
	cr_assert_eq(reconcile_drain(sock, N / 2), 0);
	/* A busy writer keeps handing over: the drain must not wait for it. */
	for (int i = N / 2; i < N; i++)
		hand_over(sock, "dr", i, inos[i], buf, sizeof(buf));
	committed_before = read_until_drained(sock, &rep, seen);
	cr_assert_eq(rep.upto_seq, N / 2);
	cr_assert_eq(rep.failed, 0);
	for (int i = 0; i < N / 2; i++)
		cr_assert(seen[i], "Drained came before the Committed of seq %d", i + 1);
	while (committed_before < N) {
		cr_assert_eq(reconcile_recv_reply(sock, &rep), 0);
		cr_assert_eq(rep.type, RECONCILE_REPLY_COMMITTED);
		cr_assert_eq(rep.error, 0);
		cr_assert(!seen[rep.seq - 1]);
		seen[rep.seq - 1] = true;
		committed_before++;
	}
	/* A drain with nothing pending answers at once. */
	cr_assert_eq(reconcile_drain(sock, 1000000), 0);
	do
		cr_assert_eq(reconcile_recv_reply(sock, &rep), 0);
	while (rep.type != RECONCILE_REPLY_DRAINED);
	close(sock);
	cr_assert_eq(rcu_stop(&rc, SIGTERM), 0);
}

/* Finished uploads wait for company up to --commit-window-ms; a drain
 * request commits them at once. The window here outlasts the test's own
 * time limit, so only the drain can have committed them. */
Test(reconciler, commit_window_waits_until_a_drain_asks, .timeout = 120)
{
	enum { N = 4 };
	uint64_t inos[N], st = 11;
	unsigned char buf[4096];
	struct reconcile_stats s;
	struct reconcile_reply rep;
	int sock;

	make_files(N, "cw-%d", inos);
	rc.extra[0] = "--commit-window-ms";
	rc.extra[1] = "600000";
	rc.extra[2] = NULL;
	rcu_start(&rc);
	sock = rcu_connect(&rc);
	for (int i = 0; i < N; i++) {
		fm_fill_random(&st, buf, sizeof(buf));
		hand_over(sock, "cw", i, inos[i], buf, sizeof(buf));
	}
	/* Every object is stored, and still nothing is committed. */
	for (int t = 0; t < 3000; t++) {
		rcu_stats(&rc, &s);
		if (s.uploads_total >= N)
			break;
		usleep(10 * 1000);
	}
	cr_assert_eq(s.uploads_total, N, "the uploads did not finish");
	usleep(200 * 1000);
	rcu_stats(&rc, &s);
	cr_assert_eq(s.committed_total, 0, "commits went before the window or a drain");
	cr_assert_eq(s.inflight, N);

	cr_assert_eq(reconcile_drain(sock, N), 0);
	cr_assert_eq(read_until_drained(sock, &rep, NULL), N);
	cr_assert_eq(rep.failed, 0);
	close(sock);
	cr_assert_eq(rcu_stop(&rc, SIGTERM), 0);
}

/* ---- deferral: uploads wait for a burst of handoffs to end ---- */

static int64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Stats over sock, which must have no other reply coming first: a new
 * connection (rcu_stats) would make the reconciler scan the journal, and
 * take up the records of handoffs it has not read yet as jobs that need
 * not wait. */
static void stats_on(int sock, struct reconcile_stats *s)
{
	struct reconcile_reply rep;

	cr_assert_eq(reconcile_stats_query(sock), 0);
	cr_assert_eq(reconcile_recv_reply(sock, &rep), 0);
	cr_assert_eq(rep.type, RECONCILE_REPLY_STATS, "reply %d before the stats", (int)rep.type);
	*s = rep.stats;
}

/* Starts the reconciler with --upload-quiet-ms quiet and
 * --upload-delay-max-ms most (and more arguments after, NULL-ended). */
static void start_deferring(const char *quiet, const char *most, const char *more[])
{
	int n = 0;

	rc.extra[n++] = "--upload-quiet-ms";
	rc.extra[n++] = quiet;
	rc.extra[n++] = "--upload-delay-max-ms";
	rc.extra[n++] = most;
	for (int i = 0; more && more[i]; i++)
		rc.extra[n++] = more[i];
	rc.extra[n] = NULL;
	rcu_start(&rc);
}

/* A connection the reconciler has accepted: a reply proves it. (Its
 * accept scans the journal for records a dead sender never handed over;
 * before the first handoff, what it finds need not wait, and records of
 * handoffs sent ahead of the accept would be among them.) */
static int connect_accepted(void)
{
	struct reconcile_stats s;
	int sock = rcu_connect(&rc);

	stats_on(sock, &s);
	return sock;
}

/* While handoffs keep coming nothing starts; once they pause for the
 * quiet time, everything goes. Only a lower bound on time is asserted: a
 * slow machine makes every step longer, never shorter. */
Test(reconciler, uploads_wait_while_handoffs_keep_coming, .timeout = 120)
{
	enum { N = 20 };
	uint64_t inos[N], st = 21;
	unsigned char buf[8192];
	struct reconcile_stats s;
	int64_t last;
	int sock;

	make_files(N, "q-%d", inos);
	start_deferring("1500", "600000", NULL);
	sock = connect_accepted();
	for (int i = 0; i < N; i++) {
		fm_fill_random(&st, buf, sizeof(buf));
		hand_over(sock, "q", i, inos[i], buf, sizeof(buf));
	}
	last = now_ms();
	stats_on(sock, &s);
	if (now_ms() - last < 1000) {
		/* (A machine so slow that a second went by proves nothing here.) */
		cr_assert_eq(s.uploads_total, 0, "uploads started while handoffs kept coming");
		cr_assert_eq(s.waiting, N, "%llu jobs waiting, want %d",
			     (unsigned long long)s.waiting, N);
	}
	rcu_wait_range(sock, 1, N, NULL);
	cr_assert_geq(now_ms() - last, 1400, "committed %lld ms after the last handoff, before "
		      "the quiet time", (long long)(now_ms() - last));
	rcu_stats(&rc, &s);
	cr_assert_eq(s.waiting, 0);
	cr_assert_eq(s.committed_total, N);
	close(sock);
	cr_assert_eq(rcu_stop(&rc, SIGTERM), 0);
	mount_cold();
	for (int i = 0; i < N; i++) {
		char name[32];
		snprintf(name, sizeof(name), "q-%d", i);
		st = 21;
		for (int k = 0; k <= i; k++)
			fm_fill_random(&st, buf, sizeof(buf));
		check_file(name, buf, sizeof(buf));
	}
	fm_umount();
}

/* Someone waiting on a commit does not wait for the pause: a drain starts
 * every waiting job, and so does shutdown. Both waits here outlast the
 * test's time limit. */
Test(reconciler, a_drain_or_a_stop_ends_the_wait, .timeout = 120)
{
	enum { N = 6 };
	uint64_t inos[N], st = 22;
	unsigned char buf[4096];
	struct reconcile_stats s;
	struct reconcile_reply rep;
	int sock, left;
	bool seen[N] = { 0 };

	make_files(N, "w-%d", inos);
	start_deferring("600000", "600000", NULL);
	sock = connect_accepted();
	for (int i = 0; i < N / 2; i++) {
		fm_fill_random(&st, buf, sizeof(buf));
		hand_over(sock, "w", i, inos[i], buf, sizeof(buf));
	}
	usleep(300 * 1000);
	stats_on(sock, &s);
	cr_assert_eq(s.uploads_total, 0);
	cr_assert_eq(s.waiting, N / 2);
	cr_assert_eq(reconcile_drain(sock, N / 2), 0);
	cr_assert_eq(read_until_drained(sock, &rep, seen), N / 2);
	cr_assert_eq(rep.failed, 0);

	/* More, then SIGTERM: each is committed and answered before the exit. */
	for (int i = N / 2; i < N; i++) {
		fm_fill_random(&st, buf, sizeof(buf));
		hand_over(sock, "w", i, inos[i], buf, sizeof(buf));
	}
	cr_assert_eq(reconcile_stats_query(sock), 0);
	do
		cr_assert_eq(reconcile_recv_reply(sock, &rep), 0);
	while (rep.type != RECONCILE_REPLY_STATS);
	cr_assert_eq(rep.stats.waiting, N - N / 2, "the later jobs did not wait");
	cr_assert_eq(rcu_stop(&rc, SIGTERM), 0);
	for (left = N - N / 2; left > 0; left--) {
		cr_assert_eq(reconcile_recv_reply(sock, &rep), 0, "%d replies missing", left);
		cr_assert(rep.type == RECONCILE_REPLY_COMMITTED && rep.error == 0);
		cr_assert(!seen[rep.seq - 1]);
		seen[rep.seq - 1] = true;
	}
	close(sock);
	cr_assert_eq(rcu_count(&rc, ""), 0);
}

/* A peer that asked for a drain and cannot take the reply: the reply's
 * failed write closes that connection, which drops the drains it waited
 * on, the one being answered included; the reconciler goes on (it used to
 * free the drain and the connection under its own feet). The drain comes
 * on a second connection whose read side is shut first, so the Drained
 * reply is the first write to fail there. */
Test(reconciler, a_peer_gone_before_its_drain_reply, .timeout = 120)
{
	enum { N = 8 };
	uint64_t inos[N], st = 26;
	unsigned char buf[16384];
	struct reconcile_stats s;
	int sock, gone;

	make_files(N, "g-%d", inos);
	start_deferring("600000", "600000", NULL);
	sock = connect_accepted();
	for (int i = 0; i < N; i++) {
		fm_fill_random(&st, buf, sizeof(buf));
		hand_over(sock, "g", i, inos[i], buf, sizeof(buf));
	}
	stats_on(sock, &s); /* every handoff read */
	cr_assert_eq(s.waiting, N);
	gone = connect_accepted();
	OK(shutdown(gone, SHUT_RD));
	cr_assert_eq(reconcile_drain(gone, N), 0);
	cr_assert_eq(reconcile_drain(gone, N / 2), 0);
	rcu_wait_range(sock, 1, N, NULL);
	usleep(100 * 1000);
	cr_assert(rcu_alive(&rc), "the reconciler died");
	close(gone);
	close(sock);
	cr_assert_eq(rcu_stop(&rc, SIGTERM), 0);
}

/* A writer that never pauses: a job waits no longer than
 * --upload-delay-max-ms after its own handoff. */
Test(reconciler, the_wait_has_a_limit, .timeout = 120)
{
	enum { N = 3 };
	uint64_t inos[N], st = 23;
	unsigned char buf[4096];
	int64_t t0;
	int sock;

	make_files(N, "l-%d", inos);
	start_deferring("600000", "700", NULL);
	sock = connect_accepted();
	t0 = now_ms();
	for (int i = 0; i < N; i++) {
		fm_fill_random(&st, buf, sizeof(buf));
		hand_over(sock, "l", i, inos[i], buf, sizeof(buf));
	}
	rcu_wait_range(sock, 1, N, NULL);
	cr_assert_geq(now_ms() - t0, 650, "committed after %lld ms, before the limit",
		      (long long)(now_ms() - t0));
	close(sock);
	cr_assert_eq(rcu_stop(&rc, SIGTERM), 0);
}

/* Each job handed over brings its staging file's fd. Under a low
 * RLIMIT_NOFILE the waiting jobs keep only as many as leave room for what
 * the uploads open; the others open their file by name when they start.
 * Keeping them all, the reconciler ran out of fds and dropped the
 * connection (the kernel cut the fds a handoff brought) or exited in the
 * middle of a commit batch. */
Test(reconciler, a_low_fd_limit_is_not_outrun, .timeout = 120)
{
	enum { N = 300, LIMIT = 256 };
	uint64_t inos[N], st = 41;
	unsigned char buf[512];
	pid_t pid;
	int sock;

	make_files(N, "fd-%d", inos);
	rc.nofile = LIMIT;
	start_deferring("1000", "600000", NULL);
	pid = rc.pid;
	sock = connect_accepted();
	for (int i = 0; i < N; i++) {
		fm_fill_random(&st, buf, sizeof(buf));
		hand_over(sock, "fd", i, inos[i], buf, sizeof(buf));
	}
	rcu_wait_range(sock, 1, N, NULL);
	cr_assert_eq(rc.pid, pid);
	cr_assert_eq(kill(pid, 0), 0, "the reconciler is gone");
	char *log = log_text();
	cr_assert(strstr(log, "RLIMIT_NOFILE is 256"), "no word of the limit in:\n%s", log);
	cr_assert(!strstr(log, "Too many open files"), "the reconciler ran out of fds:\n%s", log);
	free(log);
	close(sock);
	cr_assert_eq(rcu_stop(&rc, SIGTERM), 0);
	mount_cold();
	st = 41;
	for (int i = 0; i < N; i++) {
		char name[32];
		fm_fill_random(&st, buf, sizeof(buf));
		snprintf(name, sizeof(name), "fd-%d", i);
		check_file(name, buf, sizeof(buf));
	}
	fm_umount();
}

/* The waiting backlog is bounded: jobs whose bytes reach the upload buffer
 * (--buffer-mib) start without the pause. */
Test(reconciler, a_backlog_past_the_buffer_starts_at_once, .timeout = 120)
{
	enum { N = 3 };
	const size_t len = 600 * 1024;
	const char *more[] = { "--buffer-mib", "1", NULL };
	unsigned char *buf = malloc(len);
	uint64_t inos[N], st = 24;
	int sock;

	cr_assert(buf);
	make_files(N, "b-%d", inos);
	start_deferring("600000", "600000", more);
	sock = connect_accepted();
	for (int i = 0; i < N; i++) {
		fm_fill_random(&st, buf, len);
		hand_over(sock, "b", i, inos[i], buf, len);
	}
	/* The first two pass 1 MiB; the third waits alone. */
	rcu_wait_range(sock, 1, 2, NULL);
	cr_assert_eq(reconcile_drain(sock, N), 0);
	rcu_wait_range(sock, 3, 1, NULL);
	close(sock);
	cr_assert_eq(rcu_stop(&rc, SIGTERM), 0);
	free(buf);
}

/* Jobs found in the journal at start have no writer behind them: they
 * start at once, however long the quiet time. */
Test(reconciler, journal_jobs_at_start_do_not_wait, .timeout = 120)
{
	enum { N = 4 };
	uint64_t inos[N], st = 25;
	unsigned char buf[4096];
	struct reconcile_stats s;

	make_files(N, "j-%d", inos);
	for (int i = 0; i < N; i++) {
		struct reconcile_job j;
		char name[32];

		snprintf(name, sizeof(name), "j-%d", i);
		fm_fill_random(&st, buf, sizeof(buf));
		rcu_stage(&rc, name, buf, sizeof(buf));
		rcu_job(&j, 1 + (uint64_t)i, inos[i], sizeof(buf), name);
		rcu_record(&rc, &j);
		reconcile_job_clear(&j);
	}
	start_deferring("600000", "600000", NULL);
	for (int t = 0; t < 6000; t++) {
		rcu_stats(&rc, &s);
		if (s.committed_total == N)
			break;
		usleep(10 * 1000);
	}
	cr_assert_eq(s.committed_total, N, "jobs of the journal waited");
	cr_assert_eq(rcu_stop(&rc, SIGTERM), 0);
}

/*
 * A job whose staging file is a copy made under another boot and never
 * flushed (STAGING_COPY_SUFFIX and another boot's tag: after a power loss
 * its pages may read as zeros) is not committed: its records go, the file
 * is kept as <name>.<time>.orphan, and the file keeps its committed
 * content. The same copy named for this boot commits.
 */
Test(reconciler, a_copy_of_another_boot_is_kept_aside, .timeout = 120)
{
	enum { LEN = 200000 };
	static unsigned char committed[LEN], copy[LEN];
	char tag[BOOT_TAG_LEN + 1], other[BOOT_TAG_LEN + 1], torn[96], whole[96];
	uint64_t inos[2];
	struct reconcile_stats s;

	cr_assert(boot_tag(tag), "cannot read this boot's id");
	snprintf(other, sizeof(other), "%c%s", tag[0] == '0' ? '1' : '0', tag + 1);
	memset(committed, 'A', LEN);
	memset(copy, 'B', LEN);
	fm_mount();
	fm_write_file(mp("torn"), committed, LEN); /* committed by the mount itself */
	fm_write_file(mp("whole"), committed, LEN);
	for (int i = 0; i < 2; i++) {
		struct stat st;
		OK(stat(mp("%s", i ? "whole" : "torn"), &st));
		inos[i] = st.st_ino;
	}
	fm_umount();
	snprintf(torn, sizeof(torn), "%llu-1-1-1-s5%s%s", (unsigned long long)inos[0],
		 STAGING_COPY_SUFFIX, other);
	snprintf(whole, sizeof(whole), "%llu-1-1-2-s6%s%s", (unsigned long long)inos[1],
		 STAGING_COPY_SUFFIX, tag);
	/* The torn copy as a power loss leaves it: its length, no data. */
	rcu_stage(&rc, torn, NULL, LEN);
	rcu_stage(&rc, whole, copy, LEN);
	for (int i = 0; i < 2; i++) {
		struct reconcile_job j;
		rcu_job(&j, 5 + (uint64_t)i, inos[i], LEN, i ? whole : torn);
		rcu_record(&rc, &j);
		reconcile_job_clear(&j);
	}
	rcu_start(&rc);
	for (int t = 0; t < 6000; t++) {
		rcu_stats(&rc, &s);
		if (s.committed_total >= 1)
			break;
		usleep(10 * 1000);
	}
	cr_assert_eq(s.committed_total, 1, "the copy of this boot was not committed");
	cr_assert_eq(s.failures_total, 0);
	cr_assert_eq(rcu_stop(&rc, SIGTERM), 0);
	/* Kept aside, without a record; the committed one is gone. */
	cr_assert_eq(rcu_count(&rc, RECONCILE_ORPHAN_SUFFIX), 1);
	cr_assert_eq(rcu_count(&rc, RECONCILE_JOB_SUFFIX), 0);
	cr_assert_eq(rcu_count_attached(&rc), 0);
	cr_assert_eq(rcu_count(&rc, ""), 1);
	mount_cold();
	check_file("torn", committed, LEN);
	check_file("whole", copy, LEN);
	fm_umount();
}

/* Frames a peer should not send; the reconciler answers Error or closes,
 * leaks no fd, and serves the next peer. */
static void expect_refused(int sock, const char *what)
{
	struct reconcile_reply rep;
	int r = reconcile_recv_reply(sock, &rep);

	if (r == 0)
		cr_assert_eq(rep.type, RECONCILE_REPLY_ERROR, "%s: not refused", what);
	/* and then the connection ends */
	if (r == 0)
		r = reconcile_recv_reply(sock, &rep);
	cr_assert(r == -EPIPE || r == -ECONNRESET, "%s: connection not closed (%d)", what, r);
	close(sock);
}

Test(reconciler, bad_peers_do_not_hurt_it)
{
	struct reconcile_job j;
	struct reconcile_stats s;
	uint8_t hdr[4];
	uint64_t ino;
	int sock, fds_before, p[2], f;
	unsigned char data[1000] = { 1, 2, 3 };

	make_files(1, "good", &ino);
	rcu_start(&rc);
	rcu_stats(&rc, &s);
	/* Until it saw that connection end: the same count four times over. */
	fds_before = rcu_nfds_settled(&rc);
	char fds_list[8192];
	snprintf(fds_list, sizeof(fds_list), "%s", rcu_fd_list);
	rcu_stage(&rc, "good-1", data, sizeof(data));
	/* No record yet: a journal scan (at each new connection) must not
	 * take the job before the bad handoffs of it are refused. */
	rcu_job(&j, 1, ino, sizeof(data), "good-1");

	/* Garbage. */
	sock = rcu_connect(&rc);
	cr_assert_eq(rpc_frame_send(sock, "\x08\x01\xff\xff\xff", 5, NULL, 0), 0);
	expect_refused(sock, "garbage");
	/* An unknown request type (field 9). */
	sock = rcu_connect(&rc);
	cr_assert_eq(rpc_frame_send(sock, "\x08\x01\x4a\x00", 4, NULL, 0), 0);
	expect_refused(sock, "unknown type");
	/* Oversized. */
	sock = rcu_connect(&rc);
	rpc_frame_header(hdr, 1u << 30);
	cr_assert_eq(write(sock, hdr, 4), 4);
	expect_refused(sock, "oversized");
	/* A handoff without its fd. */
	sock = rcu_connect(&rc);
	{
		uint8_t *buf, *req;
		size_t len;
		cr_assert_eq(reconcile_job_encode(&j, &buf, &len), 0);
		/* Request{version 1, handoff = buf}, len < 128 */
		cr_assert_lt(len, 128);
		req = malloc(len + 4);
		memcpy(req, "\x08\x01\x12", 3);
		req[3] = (uint8_t)len;
		memcpy(req + 4, buf, len);
		cr_assert_eq(rpc_frame_send(sock, req, len + 4, NULL, 0), 0);
		free(req);
		free(buf);
	}
	expect_refused(sock, "no fd");
	/* A pipe instead of a file. */
	sock = rcu_connect(&rc);
	cr_assert_eq(pipe2(p, O_CLOEXEC), 0);
	cr_assert_eq(reconcile_handoff(sock, &j, p[0]), 0);
	expect_refused(sock, "pipe fd");
	close(p[0]);
	close(p[1]);
	/* A directory fd. */
	sock = rcu_connect(&rc);
	cr_assert_eq(reconcile_handoff(sock, &j, rc.staging_fd), 0);
	expect_refused(sock, "directory fd");
	/* Another regular file than the one named. */
	f = open("/proc/self/exe", O_RDONLY | O_CLOEXEC);
	sock = rcu_connect(&rc);
	cr_assert_eq(reconcile_handoff(sock, &j, f), 0);
	expect_refused(sock, "wrong file");
	close(f);
	/* No journal record. */
	rcu_stage(&rc, "nojob-1", data, sizeof(data));
	{
		struct reconcile_job k;
		rcu_job(&k, 2, ino, sizeof(data), "nojob-1");
		f = openat(rc.staging_fd, "nojob-1", O_RDONLY | O_CLOEXEC);
		sock = rcu_connect(&rc);
		cr_assert_eq(reconcile_handoff(sock, &k, f), 0);
		expect_refused(sock, "no record");
		close(f);
		unlinkat(rc.staging_fd, "nojob-1", 0);
	}
	/* A bad name, encoded by hand (the client refuses to). */
	{
		/* Request{version 1, handoff{version 1, seq 1, ino 2, length 0,
		 * mtime 0/0, staging_name "../x"}} */
		const uint8_t bad[] = { 0x08, 0x01, 0x12, 0x12, 0x08, 0x01, 0x10, 0x01, 0x18, 0x02,
					0x20, 0x00, 0x30, 0x00, 0x38, 0x00, 0x42, 0x04, '.', '.',
					'/', 'x' };
		f = openat(rc.staging_fd, "good-1", O_RDONLY | O_CLOEXEC);
		sock = rcu_connect(&rc);
		cr_assert_eq(rpc_frame_send(sock, bad, sizeof(bad), &f, 1), 0);
		expect_refused(sock, "bad name");
		close(f);
	}
	/* Too many fds, and fds with a drain. */
	sock = rcu_connect(&rc);
	{
		int two[2] = { rc.staging_fd, rc.staging_fd };
		cr_assert_eq(rpc_frame_send(sock, "\x08\x01", 2, two, 2), 0);
	}
	expect_refused(sock, "two fds");
	/* Half a frame, then gone. */
	sock = rcu_connect(&rc);
	rpc_frame_header(hdr, 100);
	cr_assert_eq(write(sock, hdr, 4), 4);
	cr_assert_eq(write(sock, "abc", 3), 3);
	close(sock);

	/* Still serving, nothing leaked, and a good handoff works. That last
	 * connection may not even be accepted yet: its end is logged. */
	for (int i = 0; i < 100; i++) {
		char *t = log_text();
		bool seen = strstr(t, "connection closed in the middle of a frame") != NULL;

		free(t);
		if (seen)
			break;
		usleep(100000);
	}
	for (int i = 0; i < 50 && rcu_nfds(&rc) != fds_before; i++)
		usleep(100000);
	cr_assert(rcu_alive(&rc));
	cr_assert_eq(rcu_nfds(&rc), fds_before, "the reconciler leaked fds: before\n%safter\n%s",
		     fds_list, rcu_fd_list);
	sock = rcu_connect(&rc);
	rcu_handoff(&rc, sock, &j);
	cr_assert_eq(rcu_wait_committed(sock, 1), 0);
	close(sock);
	char *log = log_text();
	cr_assert(strstr(log, "refused a request"), "%s", log);
	free(log);
	cr_assert_eq(rcu_stop(&rc, SIGTERM), 0);
	mount_cold();
	check_file("good", data, sizeof(data));
	fm_umount();
}

Test(reconciler, sigkill_mid_stream_then_restart)
{
	enum { N = 80 };
	uint64_t inos[N], st = 11;
	unsigned char *data[N];
	size_t len = 2 * MiB + 17;
	struct reconcile_stats s;
	int sock, committed = 0;

	make_files(N, "k-%d", inos);
	rc.extra[0] = "--max-uploads";
	rc.extra[1] = "2";
	rcu_start(&rc);
	sock = rcu_connect(&rc);
	for (int i = 0; i < N; i++) {
		struct reconcile_job j;
		char name[32];

		data[i] = malloc(len);
		fm_fill_random(&st, data[i], len);
		snprintf(name, sizeof(name), "k-%d", i);
		rcu_stage(&rc, name, data[i], len);
		rcu_job(&j, 1 + (uint64_t)i, inos[i], len, name);
		rcu_handoff(&rc, sock, &j);
	}
	/* Kill it part-way. */
	while (committed < N / 4) {
		struct reconcile_reply rep;
		cr_assert_eq(reconcile_recv_reply(sock, &rep), 0);
		if (rep.type == RECONCILE_REPLY_COMMITTED)
			committed++;
	}
	cr_assert_eq(rcu_stop(&rc, SIGKILL), 128 + SIGKILL);
	close(sock);
	/* Both kinds of record are left to finish. */
	cr_assert_gt(rcu_count(&rc, ".job"), 0, "everything finished before the kill");
	cr_assert_gt(rcu_count_attached(&rc), 0, "every xattr record finished before the kill");
	/* And two more records a sender made but never handed over. */
	{
		struct reconcile_job j;
		rcu_job(&j, 1001, inos[0], len, "k-0b");
		rcu_stage(&rc, "k-0b", data[0], len);
		cr_assert_eq(reconcile_job_write(rc.staging_fd, &j, RECONCILE_JOB_SYNC), 0);
		rcu_job(&j, 1002, inos[0], len, "k-0c");
		rcu_stage(&rc, "k-0c", data[0], len);
		rcu_record(&rc, &j);
	}

	/* The restart finishes every record. */
	rcu_start(&rc);
	for (int i = 0; i < 600; i++) {
		rcu_stats(&rc, &s);
		if (s.inflight == 0)
			break;
		usleep(100000);
	}
	cr_assert_eq(s.inflight, 0);
	cr_assert_eq(s.staging_blocks, 0);
	cr_assert_eq(rcu_count(&rc, ""), 0, "staging files or records left");
	cr_assert_eq(rcu_stop(&rc, SIGTERM), 0);
	char *log = log_text();
	cr_assert(strstr(log, "journal: "), "%s", log);
	free(log);

	mount_cold();
	for (int i = 0; i < N; i++) {
		char name[32];
		snprintf(name, sizeof(name), "k-%d", i);
		check_file(name, data[i], len);
		free(data[i]);
	}
	fm_umount();
}

Test(reconciler, commits_in_seq_order_and_replays_are_harmless)
{
	unsigned char a[5000], b[7000];
	uint64_t ino, st = 8;
	struct reconcile_job j;
	int sock;

	fm_fill_random(&st, a, sizeof(a));
	fm_fill_random(&st, b, sizeof(b));
	make_files(1, "o", &ino);
	rcu_start(&rc);
	sock = rcu_connect(&rc);
	/* seq 10 (b) first, then seq 5 (a): 10 is newer and wins. */
	rcu_stage(&rc, "o-10", b, sizeof(b));
	rcu_job(&j, 10, ino, sizeof(b), "o-10");
	rcu_handoff(&rc, sock, &j);
	cr_assert_eq(rcu_wait_committed(sock, 10), 0);
	rcu_stage(&rc, "o-5", a, sizeof(a));
	rcu_job(&j, 5, ino, sizeof(a), "o-5");
	rcu_handoff(&rc, sock, &j);
	cr_assert_eq(rcu_wait_committed(sock, 5), -EALREADY); /* older: not applied */
	close(sock);
	cr_assert_eq(rcu_stop(&rc, SIGTERM), 0);
	/* A crash between commit and unlink: the record comes back at start. */
	rcu_stage(&rc, "o-10", a, sizeof(a));
	rcu_job(&j, 10, ino, sizeof(a), "o-10");
	cr_assert_eq(reconcile_job_write(rc.staging_fd, &j, 0), 0);
	rcu_start(&rc);
	for (int i = 0; i < 100 && rcu_count(&rc, ""); i++)
		usleep(50000);
	cr_assert_eq(rcu_count(&rc, ""), 0);
	cr_assert_eq(rcu_stop(&rc, SIGTERM), 0);
	char *log = log_text();
	cr_assert(strstr(log, "already committed"), "%s", log);
	free(log);
	mount_cold();
	check_file("o", b, sizeof(b));
	fm_umount();
}

Test(reconciler, failing_job_is_kept_as_orphan_and_retried_at_start)
{
	static unsigned char data[2][300000];
	uint64_t ino[2], st = 21;
	struct reconcile_job j;
	struct reconcile_stats s;
	int sock;

	/* Two files: one job recorded as a .job (odd seq), one as an xattr. */
	fm_fill_random(&st, data, sizeof(data));
	make_files(2, "orph%d", ino);
	/* Objects cannot be stored: the store's directory is a file now. */
	cr_assert_eq(rename(sp("vol/objects"), sp("vol/objects.away")), 0);
	fm_write_file(sp("vol/objects"), "x", 1);
	rc.extra[0] = "--retries";
	rc.extra[1] = "3";
	rc.extra[2] = "--retry-delay";
	rc.extra[3] = "50";
	rcu_start(&rc);
	sock = rcu_connect(&rc);
	for (int k = 0; k < 2; k++) {
		char name[16];
		snprintf(name, sizeof(name), "orph-%d", k + 1);
		rcu_stage(&rc, name, data[k], sizeof(data[k]));
		rcu_job(&j, (uint64_t)k + 1, ino[k], sizeof(data[k]), name);
		rcu_handoff(&rc, sock, &j);
	}
	{
		int errs[2];
		rcu_wait_range(sock, 1, 2, errs); /* replies come in completion order */
		cr_assert(errs[0] == -EIO && errs[1] == -EIO, "%d %d", errs[0], errs[1]);
	}
	cr_assert_eq(reconcile_drain(sock, 2), 0);
	{
		struct reconcile_reply rep;
		cr_assert_eq(reconcile_recv_reply(sock, &rep), 0);
		cr_assert(rep.type == RECONCILE_REPLY_DRAINED && rep.failed == 2);
	}
	close(sock);
	rcu_stats(&rc, &s);
	cr_assert_eq(s.failures_total, 6);
	cr_assert_eq(s.orphans, 2);
	cr_assert_eq(s.staging_blocks, 2, "an orphan is still only on local disk");
	cr_assert_eq(rcu_count(&rc, ".orphan"), 2);
	cr_assert_eq(rcu_count(&rc, ".orphan.job"), 2, "an orphan's record is always a file");
	cr_assert_eq(rcu_stop(&rc, SIGTERM), 0);
	char *log = log_text();
	cr_assert(strstr(log, "kept as"), "%s", log);
	free(log);

	/* The store is back; the next start retries them. */
	cr_assert_eq(unlink(sp("vol/objects")), 0);
	cr_assert_eq(rename(sp("vol/objects.away"), sp("vol/objects")), 0);
	rcu_start(&rc);
	for (int i = 0; i < 200 && rcu_count(&rc, ""); i++)
		usleep(50000);
	cr_assert_eq(rcu_count(&rc, ""), 0);
	cr_assert_eq(rcu_stop(&rc, SIGTERM), 0);
	mount_cold();
	check_file("orph0", data[0], sizeof(data[0]));
	check_file("orph1", data[1], sizeof(data[1]));
	fm_umount();
}

Test(reconciler, sigterm_finishes_what_it_has)
{
	enum { N = 10 };
	uint64_t inos[N], st = 4;
	unsigned char *data = malloc(5 * MiB);
	int sock;

	fm_fill_random(&st, data, 5 * MiB);
	make_files(N, "t-%d", inos);
	rc.extra[0] = "--max-uploads";
	rc.extra[1] = "1";
	rcu_start(&rc);
	sock = rcu_connect(&rc);
	for (int i = 0; i < N; i++) {
		struct reconcile_job j;
		char name[32];

		snprintf(name, sizeof(name), "t-%d", i);
		rcu_stage(&rc, name, data, 5 * MiB);
		rcu_job(&j, 1 + (uint64_t)i, inos[i], 5 * MiB, name);
		rcu_handoff(&rc, sock, &j);
	}
	/* Let it take them all in (it answers in order of reading), then
	 * stop it: every job is finished and answered before it exits. */
	bool seen[N] = { 0 };
	int left = N;
	struct reconcile_reply rep;
	cr_assert_eq(reconcile_stats_query(sock), 0);
	for (;;) {
		cr_assert_eq(reconcile_recv_reply(sock, &rep), 0);
		if (rep.type == RECONCILE_REPLY_STATS)
			break;
		cr_assert(rep.type == RECONCILE_REPLY_COMMITTED && rep.error == 0);
		seen[rep.seq - 1] = true;
		left--;
	}
	cr_assert_eq(rcu_stop(&rc, SIGTERM), 0);
	while (left > 0) {
		cr_assert_eq(reconcile_recv_reply(sock, &rep), 0, "%d replies missing", left);
		cr_assert(rep.type == RECONCILE_REPLY_COMMITTED && rep.error == 0);
		cr_assert(!seen[rep.seq - 1]);
		seen[rep.seq - 1] = true;
		left--;
	}
	close(sock);
	cr_assert_eq(rcu_count(&rc, ""), 0);
	mount_cold();
	for (int i = 0; i < N; i++) {
		char name[32];
		snprintf(name, sizeof(name), "t-%d", i);
		check_file(name, data, 5 * MiB);
	}
	fm_umount();
	free(data);
}

/* ---- an S3 store that goes away and comes back ---- */

static struct fm_s3 srv;

static void s3_setup(void)
{
	char url[256];
	struct fm_opts o = { .s3_http = true, .no_mount = true };

	snprintf(srv.dir, sizeof(srv.dir), "/tmp/ferry-it-rs3.%d", (int)getpid());
	cr_assert(mkdir(srv.dir, 0700) == 0 || errno == EEXIST);
	setenv("AWS_ACCESS_KEY_ID", "S3RVER", 1);
	setenv("AWS_SECRET_ACCESS_KEY", "S3RVER", 1);
	setenv("AWS_REGION", "us-east-1", 1);
	fm_s3_start(&srv, NULL);
	snprintf(url, sizeof(url), "s3://%s/ferry-test/rec%d", srv.hostport, (int)getpid());
	o.storage = url;
	setup_common(&o);
}

static void s3_teardown(void)
{
	const char *stop[] = { FERRY_SOURCE_DIR "/scripts/s3-server", "stop", srv.dir, NULL };
	const char *rm[] = { "/bin/rm", "-rf", srv.dir, NULL };

	rcu_fini(&rc);
	fm_teardown();
	/* Stopped already if the test failed while the server was down. */
	fm_run(stop, "/dev/null", "/dev/null", 60);
	fm_run(rm, "/dev/null", "/dev/null", 60);
}

TestSuite(reconciler_s3, .init = s3_setup, .fini = s3_teardown, .timeout = 300);

Test(reconciler_s3, store_down_jobs_retry_and_commit)
{
	enum { N = 5 };
	uint64_t inos[N], st = 77;
	size_t len = MiB + 4321;
	unsigned char *data[N];
	struct reconcile_stats s;
	char port[16];
	int sock;

	make_files(N, "s-%d", inos);
	rc.extra[0] = "--retry-delay";
	rc.extra[1] = "500";
	rc.extra[2] = "--retries";
	rc.extra[3] = "6";
	rcu_start(&rc);
	snprintf(port, sizeof(port), "%s", strchr(srv.hostport, ':') + 1);
	fm_s3_stop(&srv);

	sock = rcu_connect(&rc);
	for (int i = 0; i < N; i++) {
		struct reconcile_job j;
		char name[32];

		data[i] = malloc(len);
		fm_fill_random(&st, data[i], len);
		snprintf(name, sizeof(name), "s-%d", i);
		rcu_stage(&rc, name, data[i], len);
		rcu_job(&j, 1 + (uint64_t)i, inos[i], len, name);
		rcu_handoff(&rc, sock, &j);
	}
	/* Failures are seen and retried... */
	for (int i = 0; i < 200; i++) {
		rcu_stats(&rc, &s);
		if (s.failures_total >= N)
			break;
		usleep(50000);
	}
	cr_assert_geq(s.failures_total, N, "no failed attempts while the store is down");
	cr_assert_eq(s.committed_total, 0);
	cr_assert_eq(s.staging_blocks, N);
	cr_assert_eq(s.orphans, 0);
	/* ...and commit once the store is back on its port. */
	fm_s3_start(&srv, port);
	rcu_wait_range(sock, 1, N, NULL);
	close(sock);
	rcu_stats(&rc, &s);
	cr_assert_eq(s.committed_total, N);
	cr_assert_eq(s.staging_blocks, 0);
	cr_assert_eq(s.uploads_total, N);
	cr_assert_eq(rcu_count(&rc, ""), 0);
	cr_assert_eq(rcu_stop(&rc, SIGTERM), 0);
	char *log = log_text();
	cr_assert(strstr(log, "trying again"), "%s", log);
	free(log);

	mount_cold();
	for (int i = 0; i < N; i++) {
		char name[32];
		snprintf(name, sizeof(name), "s-%d", i);
		check_file(name, data[i], len);
		free(data[i]);
	}
	fm_umount();
}

/* The keys the uploads are signed with, as an operator's scraper sees them. */
Test(reconciler_s3, credentials_in_metrics)
{
	char addr[64], url[128];
	int code;
	char *text;

	snprintf(addr, sizeof(addr), "127.0.0.1:%d", free_port());
	rc.extra[0] = "--metrics";
	rc.extra[1] = addr;
	rcu_start(&rc);
	snprintf(url, sizeof(url), "http://%s/metrics", addr);
	text = http_get(url, &code);
	cr_assert_eq(code, 200);
	cr_assert(strstr(text, "s3_credentials_info{source=\"environment\"} 1\n"), "%s", text);
	/* Keys from the environment never expire and are never fetched again. */
	cr_assert_eq(prom_value(text, "s3_credentials_expire_timestamp_seconds"), 0, "%s", text);
	cr_assert_eq(prom_value(text, "s3_credentials_refreshes_total"), 0, "%s", text);
	cr_assert_eq(prom_value(text, "s3_credentials_refresh_failures_total"), 0, "%s", text);
	cr_assert_null(strstr(text, "S3RVER"), "a key in the metrics: %s", text);
	/* Every metric has help text and a row in the README's table. */
	char *readme = fm_slurp(FERRY_SOURCE_DIR "/README.md");
	cr_assert(readme);
	int n = 0;
	for (const char *p = strstr(text, "# TYPE "); p; p = strstr(p + 1, "# TYPE ")) {
		char name[128], row[140], help[140];
		cr_assert_eq(sscanf(p + 7, "%127s", name), 1);
		snprintf(row, sizeof(row), "| `%s", name);
		snprintf(help, sizeof(help), "# HELP %s ", name);
		cr_assert(strstr(readme, row), "%s is not in README's metrics table", name);
		cr_assert(strstr(text, help), "%s has no help text", name);
		n++;
	}
	cr_assert_geq(n, 14, "%s", text);
	free(readme);
	free(text);
	cr_assert_eq(rcu_stop(&rc, SIGTERM), 0);
}

Test(reconciler, sigterm_gives_up_without_progress)
{
	unsigned char data[10000] = { 9 };
	uint64_t ino;
	struct reconcile_job j;
	int sock;

	make_files(1, "stuck", &ino);
	/* The store cannot take objects, and retries are far apart. */
	cr_assert_eq(rename(sp("vol/objects"), sp("vol/objects.away")), 0);
	fm_write_file(sp("vol/objects"), "x", 1);
	rc.extra[0] = "--retry-delay";
	rc.extra[1] = "60000";
	rc.extra[2] = "--shutdown-timeout";
	rc.extra[3] = "2";
	rcu_start(&rc);
	rcu_stage(&rc, "stuck-1", data, sizeof(data));
	rcu_job(&j, 1, ino, sizeof(data), "stuck-1");
	sock = rcu_connect(&rc);
	rcu_handoff(&rc, sock, &j);
	for (int i = 0; i < 100; i++) {
		struct reconcile_stats s;
		rcu_stats(&rc, &s);
		if (s.failures_total)
			break;
		usleep(50000);
	}
	/* It gives up, says what is left, and the job stays journaled. */
	cr_assert_eq(rcu_stop(&rc, SIGTERM), 1);
	close(sock);
	char *log = log_text();
	cr_assert(strstr(log, "unfinished: job stuck-1"), "%s", log);
	free(log);
	cr_assert_eq(rcu_count(&rc, "stuck-1"), 1);
	cr_assert_eq(rcu_count(&rc, "stuck-1.job"), 1);
	/* A new handoff while stopping is not taken (and not lost). */
	cr_assert_eq(unlink(sp("vol/objects")), 0);
	cr_assert_eq(rename(sp("vol/objects.away"), sp("vol/objects")), 0);
	rcu_start(&rc);
	for (int i = 0; i < 100 && rcu_count(&rc, ""); i++)
		usleep(50000);
	cr_assert_eq(rcu_count(&rc, ""), 0);
	cr_assert_eq(rcu_stop(&rc, SIGTERM), 0);
	mount_cold();
	check_file("stuck", data, sizeof(data));
	fm_umount();
}

Test(reconciler, detaches_without_f_and_help_is_honest)
{
	const char *help[] = { fm_bin("ferry-reconciler"), "--help", NULL };
	const char *bad[] = { fm_bin("ferry-reconciler"), "--volume", fm.vol, NULL };
	const char *start[] = { fm_bin("ferry-reconciler"), "--volume", fm.vol, "--staging-dir",
				rc.staging, "--socket", rc.sock, NULL };
	char *text, *pidtext;
	struct reconcile_stats s;
	int pid;

	cr_assert_eq(fm_run(help, sp("help.out"), "/dev/null", 10), 0);
	text = fm_slurp(sp("help.out"));
	cr_assert(strstr(text, "--max-uploads") && strstr(text, "--buffer-mib") &&
		  strstr(text, "--metrics") && strstr(text, ".orphan"), "%s", text);
	free(text);
	cr_assert_eq(fm_run(bad, "/dev/null", "/dev/null", 10), 2);
	/* Without -f it returns once serving; a second one refuses. */
	cr_assert_eq(fm_run(start, "/dev/null", sp("start.err"), 30), 0);
	rcu_stats(&rc, &s);
	cr_assert_eq(fm_run(start, "/dev/null", sp("start2.err"), 30), 1);
	text = fm_slurp(sp("start2.err"));
	cr_assert(strstr(text, "another ferry-reconciler"), "%s", text);
	free(text);
	pidtext = fm_slurp(sp("staging/.ferry-reconciler.lock"));
	pid = atoi(pidtext);
	free(pidtext);
	cr_assert_gt(pid, 0);
	cr_assert_eq(kill(pid, SIGTERM), 0);
	for (int i = 0; i < 100 && kill(pid, 0) == 0; i++)
		usleep(50000);
	cr_assert_neq(kill(pid, 0), 0, "the detached reconciler did not stop");
	cr_assert_neq(access(rc.sock, F_OK), 0, "its socket was left behind");
}
