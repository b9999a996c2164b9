/*
 * s3_proxy: see s3_proxy_util.h. One thread accepts; each connection gets a
 * detached thread that reads one request whole (answering Expect:
 * 100-continue itself), checks its token in the strict mode, decides its
 * fault, and either answers itself or passes the request upstream
 * (Connection: close), reads the whole answer and sends it on, spoiled as
 * armed. Whole messages in memory are fine for a test: objects are at most
 * a few MiB. The token table is a plain array under the lock: a test knows
 * a few hundred tokens at most.
 */
#include "s3_proxy_util.h"
#include "mount_util.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <criterion/criterion.h>

#define HEAD_MAX (64u << 10)
#define MSG_MAX (64u << 20)
#define CONNS_MAX 256
#define WATCH_MAX 8

struct token {
	char *name;
	int64_t expires;
};

struct watch {
	char method[8];
	char path[64];
	atomic_uint count;
};

struct s3_proxy {
	int lfd;
	char hostport[32];
	struct sockaddr_in upstream;
	pthread_t acceptor;
	pthread_mutex_t lock;
	pthread_cond_t changed;
	enum s3_fault fault;          /* armed, under lock */
	int fault_count;
	char fault_method[8];
	char fault_path[64];
	int conns[CONNS_MAX];         /* live client sockets, -1: free slot */
	unsigned nworkers;
	/* The worker thread each slot last had (the acceptor's alone): joined
	 * before the slot's next one starts, and all at the stop, so no
	 * thread is still exiting when the test process exits (LeakSanitizer
	 * stops every thread at exit and reports one it cannot). */
	pthread_t threads[CONNS_MAX];
	bool joinable[CONNS_MAX];
	unsigned stalled;
	bool release;                 /* stalled connections may go */
	bool stop;
	atomic_uint requests, faults_done;
	struct watch watches[WATCH_MAX];
	atomic_int nwatches;
	/* Strict credentials, under lock. */
	bool require_tokens;
	struct token *tokens;
	size_t ntokens, tokens_cap;
	char last_rejection[320];
	atomic_uint rejections;
};

struct msg {
	char *buf;
	size_t len, cap;
};

static bool msg_reserve(struct msg *m, size_t more)
{
	char *nb;
	size_t cap = m->cap ? m->cap : 65536;

	if (m->len + more + 1 <= m->cap)
		return true;
	while (cap < m->len + more + 1)
		cap *= 2;
	if (cap > MSG_MAX || !(nb = realloc(m->buf, cap)))
		return false;
	m->buf = nb;
	m->cap = cap;
	return true;
}

static bool send_all(int fd, const void *buf, size_t len)
{
	const char *p = buf;

	while (len) {
		ssize_t n = send(fd, p, len, MSG_NOSIGNAL);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return false;
		p += n;
		len -= (size_t)n;
	}
	return true;
}

/* Where the line "Name: value" of header name starts in head[0..len), or
 * NULL. */
static const char *header_line(const char *head, size_t len, const char *name)
{
	size_t nl = strlen(name);

	for (const char *l = head; l && l < head + len; l = memchr(l, '\n', head + len - l)) {
		if (*l == '\n')
			l++;
		if ((size_t)(head + len - l) > nl + 1 && !strncasecmp(l, name, nl) && l[nl] == ':')
			return l;
	}
	return NULL;
}

/* The numeric value of header name, or -1. */
static long header_num(const char *head, size_t len, const char *name)
{
	const char *l = header_line(head, len, name);

	return l ? strtol(l + strlen(name) + 1, NULL, 10) : -1;
}

/* Reads a head (through "\r\n\r\n") into m; *head_len its length. */
static bool read_head(int fd, struct msg *m, size_t *head_len)
{
	for (;;) {
		char *end;
		ssize_t n;

		if (m->len && (end = memmem(m->buf, m->len, "\r\n\r\n", 4))) {
			*head_len = (size_t)(end + 4 - m->buf);
			return true;
		}
		if (m->len >= HEAD_MAX || !msg_reserve(m, 65536))
			return false;
		n = recv(fd, m->buf + m->len, m->cap - m->len - 1, 0);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return false;
		m->len += (size_t)n;
	}
}

static bool read_body(int fd, struct msg *m, size_t want)
{
	while (m->len < want) {
		ssize_t n;

		if (!msg_reserve(m, want - m->len))
			return false;
		n = recv(fd, m->buf + m->len, want - m->len, 0);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return false;
		m->len += (size_t)n;
	}
	return true;
}

static bool read_to_eof(int fd, struct msg *m)
{
	for (;;) {
		ssize_t n;

		if (!msg_reserve(m, 65536))
			return false;
		n = recv(fd, m->buf + m->len, m->cap - m->len - 1, 0);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return false;
		if (n == 0)
			return true;
		m->len += (size_t)n;
	}
}

/* A copy of head[0..len) without Connection and Expect lines, with
 * "Connection: close" after the first line. */
static char *rewrite_head(const char *head, size_t len, size_t *out_len)
{
	char *out = malloc(len + 32), *o = out;
	const char *l = head, *end = head + len;
	bool first = true;

	if (!out)
		return NULL;
	while (l < end) {
		const char *nl = memchr(l, '\n', end - l);
		size_t n = nl ? (size_t)(nl + 1 - l) : (size_t)(end - l);

		if (first || (strncasecmp(l, "Connection:", 11) && strncasecmp(l, "Expect:", 7))) {
			memcpy(o, l, n);
			o += n;
		}
		if (first) {
			memcpy(o, "Connection: close\r\n", 19);
			o += 19;
			first = false;
		}
		l += n;
	}
	*out_len = (size_t)(o - out);
	return out;
}

/* An S3 error answer of the proxy's own; a HEAD's has no body (as S3's). */
static void answer_msg(int fd, int status, const char *reason, const char *extra,
		       const char *code, const char *message, bool head)
{
	char body[384], out[1024];
	int bl = snprintf(body, sizeof(body),
			  "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>%s</Code>"
			  "<Message>%s</Message></Error>", code, message);
	int n = snprintf(out, sizeof(out),
			 "HTTP/1.1 %d %s\r\nContent-Type: application/xml\r\n%sContent-Length: %d\r\n"
			 "Connection: close\r\n\r\n%s", status, reason, extra, bl, head ? "" : body);

	send_all(fd, out, (size_t)n);
}

static void answer(int fd, int status, const char *reason, const char *extra, const char *code)
{
	answer_msg(fd, status, reason, extra, code, "injected by the test proxy", false);
}

/* The strict mode's check of a request whose head arrived at `at`: true if
 * it may go on; false after answering it (and counting the refusal). */
static bool token_check(struct s3_proxy *p, int fd, const struct msg *req, size_t head_len,
			const char *method, const char *path, const struct timespec *at)
{
	const char *l = header_line(req->buf, head_len, "x-amz-security-token"), *v, *e;
	char tok[256] = "";
	bool known = false, ok = true;
	int64_t expires = 0;

	if (l) {
		v = l + strlen("x-amz-security-token") + 1;
		while (*v == ' ' || *v == '\t')
			v++;
		e = v;
		while (e < req->buf + head_len && *e != '\r' && *e != '\n')
			e++;
		while (e > v && (e[-1] == ' ' || e[-1] == '\t'))
			e--;
		snprintf(tok, sizeof(tok), "%.*s", (int)(e - v), v);
	}
	pthread_mutex_lock(&p->lock);
	if (p->require_tokens) {
		for (size_t i = 0; i < p->ntokens && !known; i++)
			if (!strcmp(p->tokens[i].name, tok)) {
				known = true;
				expires = p->tokens[i].expires;
			}
		ok = known && (int64_t)at->tv_sec < expires;
		if (!ok)
			snprintf(p->last_rejection, sizeof(p->last_rejection),
				 "%s %s %.16s %.96s (token %.32s%s, at %lld.%03ld)",
				 known ? "400" : "403", known ? "ExpiredToken" : "InvalidToken", method,
				 path, tok[0] ? tok : "none", known ? ", expired" : "",
				 (long long)at->tv_sec, at->tv_nsec / 1000000);
	}
	pthread_mutex_unlock(&p->lock);
	if (ok)
		return true;
	atomic_fetch_add(&p->rejections, 1);
	if (getenv("S3_PROXY_DEBUG"))
		fprintf(stderr, "proxy: refused %s %s (token %s)\n", method, path, tok);
	if (known)
		answer_msg(fd, 400, "Bad Request", "", "ExpiredToken",
			   "The provided token has expired.", !strcmp(method, "HEAD"));
	else
		answer_msg(fd, 403, "Forbidden", "", "InvalidToken",
			   "The provided token is malformed or otherwise invalid.",
			   !strcmp(method, "HEAD"));
	return false;
}

static bool method_matches(const char *want, const char *method)
{
	return !want[0] || !strcmp(want, method) || (!strcmp(want, "GET") && !strcmp(method, "HEAD"));
}

/* Counts a request that goes upstream in every watch it matches. */
static void count_watches(struct s3_proxy *p, const char *method, const char *path)
{
	int n = atomic_load(&p->nwatches);

	for (int i = 0; i < n; i++)
		if (method_matches(p->watches[i].method, method) &&
		    (!p->watches[i].path[0] || strstr(path, p->watches[i].path)))
			atomic_fetch_add(&p->watches[i].count, 1);
}

/* Which fault this request gets (and counts it). */
static enum s3_fault take_fault(struct s3_proxy *p, const char *method, const char *path)
{
	enum s3_fault f = S3F_NONE;

	pthread_mutex_lock(&p->lock);
	if (p->fault != S3F_NONE && p->fault_count > 0 && method_matches(p->fault_method, method) &&
	    (!p->fault_path[0] || strstr(path, p->fault_path))) {
		f = p->fault;
		if (--p->fault_count == 0)
			p->fault = S3F_NONE;
	}
	pthread_mutex_unlock(&p->lock);
	if (f != S3F_NONE)
		atomic_fetch_add(&p->faults_done, 1);
	return f;
}

/* Holds fd unanswered until released, stopped, or the client goes away
 * (looked at every 50 ms: a client that gave up is not held). */
static void stall(struct s3_proxy *p, int fd)
{
	pthread_mutex_lock(&p->lock);
	p->stalled++;
	pthread_cond_broadcast(&p->changed);
	while (!p->stop && !p->release) {
		struct timespec until;
		char c;

		clock_gettime(CLOCK_REALTIME, &until);
		until.tv_nsec += 50 * 1000000L;
		if (until.tv_nsec >= 1000000000L) {
			until.tv_sec++;
			until.tv_nsec -= 1000000000L;
		}
		pthread_cond_timedwait(&p->changed, &p->lock, &until);
		if (recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT) == 0)
			break; /* the client closed its end */
	}
	p->stalled--;
	pthread_cond_broadcast(&p->changed);
	pthread_mutex_unlock(&p->lock);
}

/* Passes req upstream; the whole answer lands in resp. */
static bool upstream(struct s3_proxy *p, const struct msg *req, size_t head_len, struct msg *resp)
{
	size_t hl;
	char *head = rewrite_head(req->buf, head_len, &hl);
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	bool ok = head && fd >= 0 &&
		  connect(fd, (const struct sockaddr *)&p->upstream, sizeof(p->upstream)) == 0 &&
		  send_all(fd, head, hl) && send_all(fd, req->buf + head_len, req->len - head_len) &&
		  read_to_eof(fd, resp);

	free(head);
	if (fd >= 0)
		close(fd);
	return ok;
}

static void serve(struct s3_proxy *p, int fd)
{
	struct msg req = { 0 }, resp = { 0 };
	char method[8] = "", path[1024] = "";
	size_t head_len, rhead_len = 0;
	struct timespec arrived;
	long clen;
	enum s3_fault f;

	if (!read_head(fd, &req, &head_len))
		goto out;
	clock_gettime(CLOCK_REALTIME, &arrived); /* tokens expire in wall-clock time */
	sscanf(req.buf, "%7s %1023s", method, path);
	clen = header_num(req.buf, head_len, "Content-Length");
	if (clen > 0 && header_line(req.buf, head_len, "Expect") && req.len == head_len &&
	    !send_all(fd, "HTTP/1.1 100 Continue\r\n\r\n", 25))
		goto out;
	if (clen > 0 && !read_body(fd, &req, head_len + (size_t)clen))
		goto out;
	atomic_fetch_add(&p->requests, 1);
	if (getenv("S3_PROXY_DEBUG")) fprintf(stderr, "proxy: %s %s\n", method, path);
	if (!token_check(p, fd, &req, head_len, method, path, &arrived))
		goto out;
	f = take_fault(p, method, path);
	switch (f) {
	case S3F_500:
		answer(fd, 500, "Internal Server Error", "", "InternalError");
		goto out;
	case S3F_503:
		answer(fd, 503, "Slow Down", "Retry-After: 1\r\n", "SlowDown");
		goto out;
	case S3F_NO_BUCKET:
		answer(fd, 404, "Not Found", "", "NoSuchBucket");
		goto out;
	case S3F_STALL:
		stall(p, fd);
		goto out;
	default:
		break;
	}
	count_watches(p, method, path);
	if (!upstream(p, &req, head_len, &resp)) {
		answer(fd, 502, "Bad Gateway", "", "InternalError"); /* the test sees a 5xx */
		goto out;
	}
	{
		char *end = resp.len ? memmem(resp.buf, resp.len, "\r\n\r\n", 4) : NULL;
		size_t hl, body;
		char *head;

		if (!end)
			goto out;
		rhead_len = (size_t)(end + 4 - resp.buf);
		body = resp.len - rhead_len;
		head = rewrite_head(resp.buf, rhead_len, &hl);
		if (!head)
			goto out;
		if (f == S3F_GARBLE && body)
			resp.buf[rhead_len + body / 2] ^= 0x5a;
		if (f == S3F_RESET || f == S3F_SHORT)
			body /= 2;
		if (send_all(fd, head, hl))
			send_all(fd, resp.buf + rhead_len, body);
		free(head);
		if (f == S3F_RESET) {
			struct linger lg = { .l_onoff = 1, .l_linger = 0 };

			setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg)); /* close sends RST */
		}
	}
out:
	free(req.buf);
	free(resp.buf);
}

struct worker_arg {
	struct s3_proxy *p;
	int slot;
};

static void *worker(void *arg)
{
	struct worker_arg *w = arg;
	struct s3_proxy *p = w->p;
	int slot = w->slot, fd;

	free(w);
	pthread_mutex_lock(&p->lock);
	fd = p->conns[slot];
	pthread_mutex_unlock(&p->lock);
	serve(p, fd);
	pthread_mutex_lock(&p->lock);
	close(fd);
	p->conns[slot] = -1;
	p->nworkers--;
	pthread_cond_broadcast(&p->changed);
	pthread_mutex_unlock(&p->lock);
	return NULL;
}

static void *acceptor(void *arg)
{
	struct s3_proxy *p = arg;

	for (;;) {
		int fd = accept4(p->lfd, NULL, NULL, SOCK_CLOEXEC), slot = -1;
		struct worker_arg *w;
		pthread_t t;

		if (fd < 0) {
			if (errno == EINTR)
				continue;
			return NULL; /* shut down */
		}
		pthread_mutex_lock(&p->lock);
		for (int i = 0; i < CONNS_MAX && !p->stop; i++)
			if (p->conns[i] < 0) {
				slot = i;
				break;
			}
		if (slot >= 0) {
			p->conns[slot] = fd;
			p->nworkers++;
		}
		pthread_mutex_unlock(&p->lock);
		if (slot >= 0 && p->joinable[slot]) {
			/* It gave the slot up: it is ending, if not gone. */
			pthread_join(p->threads[slot], NULL);
			p->joinable[slot] = false;
		}
		w = slot >= 0 ? malloc(sizeof(*w)) : NULL;
		if (!w) {
			if (slot >= 0) {
				pthread_mutex_lock(&p->lock);
				p->conns[slot] = -1;
				p->nworkers--;
				pthread_mutex_unlock(&p->lock);
			}
			close(fd);
			continue;
		}
		*w = (struct worker_arg){ .p = p, .slot = slot };
		if (pthread_create(&t, NULL, worker, w) != 0) {
			free(w);
			pthread_mutex_lock(&p->lock);
			p->conns[slot] = -1;
			p->nworkers--;
			pthread_mutex_unlock(&p->lock);
			close(fd);
			continue;
		}
		p->threads[slot] = t;
		p->joinable[slot] = true;
	}
}

struct s3_proxy *s3_proxy_start(const char *up)
{
	struct s3_proxy *p = calloc(1, sizeof(*p));
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t sl = sizeof(sa);
	char host[64];
	unsigned port;

	cr_assert(p);
	cr_assert(sscanf(up, "%63[^:]:%u", host, &port) == 2, "upstream %s", up);
	p->upstream.sin_family = AF_INET;
	p->upstream.sin_port = htons((uint16_t)port);
	cr_assert(inet_pton(AF_INET, !strcmp(host, "localhost") ? "127.0.0.1" : host,
			    &p->upstream.sin_addr) == 1, "upstream host %s", host);
	for (int i = 0; i < CONNS_MAX; i++)
		p->conns[i] = -1;
	pthread_mutex_init(&p->lock, NULL);
	pthread_cond_init(&p->changed, NULL);
	p->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	cr_assert(p->lfd >= 0);
	cr_assert(bind(p->lfd, (struct sockaddr *)&sa, sizeof(sa)) == 0);
	cr_assert(listen(p->lfd, 64) == 0);
	cr_assert(getsockname(p->lfd, (struct sockaddr *)&sa, &sl) == 0);
	snprintf(p->hostport, sizeof(p->hostport), "127.0.0.1:%u", ntohs(sa.sin_port));
	cr_assert(pthread_create(&p->acceptor, NULL, acceptor, p) == 0);
	return p;
}

const char *s3_proxy_hostport(const struct s3_proxy *p)
{
	return p->hostport;
}

void s3_proxy_fault(struct s3_proxy *p, enum s3_fault f, int count, const char *method,
		    const char *path_part)
{
	pthread_mutex_lock(&p->lock);
	p->fault = f;
	p->fault_count = count;
	snprintf(p->fault_method, sizeof(p->fault_method), "%s", method ? method : "");
	snprintf(p->fault_path, sizeof(p->fault_path), "%s", path_part ? path_part : "");
	p->release = false;
	pthread_mutex_unlock(&p->lock);
}

unsigned s3_proxy_requests(const struct s3_proxy *p)
{
	return atomic_load(&p->requests);
}

unsigned s3_proxy_faults_done(const struct s3_proxy *p)
{
	return atomic_load(&p->faults_done);
}

unsigned s3_proxy_stalled(const struct s3_proxy *p)
{
	unsigned n;

	pthread_mutex_lock((pthread_mutex_t *)&p->lock);
	n = p->stalled;
	pthread_mutex_unlock((pthread_mutex_t *)&p->lock);
	return n;
}

void s3_proxy_release(struct s3_proxy *p)
{
	pthread_mutex_lock(&p->lock);
	p->release = true;
	pthread_cond_broadcast(&p->changed);
	pthread_mutex_unlock(&p->lock);
}

void s3_proxy_stop(struct s3_proxy *p)
{
	if (!p)
		return;
	shutdown(p->lfd, SHUT_RDWR);
	pthread_join(p->acceptor, NULL);
	close(p->lfd);
	pthread_mutex_lock(&p->lock);
	p->stop = true;
	pthread_cond_broadcast(&p->changed);
	for (int i = 0; i < CONNS_MAX; i++)
		if (p->conns[i] >= 0)
			shutdown(p->conns[i], SHUT_RDWR); /* wakes a worker in recv/send */
	while (p->nworkers)
		pthread_cond_wait(&p->changed, &p->lock);
	pthread_mutex_unlock(&p->lock);
	for (int i = 0; i < CONNS_MAX; i++)
		if (p->joinable[i])
			pthread_join(p->threads[i], NULL);
	pthread_mutex_destroy(&p->lock);
	pthread_cond_destroy(&p->changed);
	for (size_t i = 0; i < p->ntokens; i++)
		free(p->tokens[i].name);
	free(p->tokens);
	free(p);
}

int s3_proxy_watch(struct s3_proxy *p, const char *method, const char *path_part)
{
	int i;

	pthread_mutex_lock(&p->lock);
	i = atomic_load(&p->nwatches);
	cr_assert(i < WATCH_MAX, "more than %d proxy watches", WATCH_MAX);
	snprintf(p->watches[i].method, sizeof(p->watches[i].method), "%s", method ? method : "");
	snprintf(p->watches[i].path, sizeof(p->watches[i].path), "%s", path_part ? path_part : "");
	atomic_init(&p->watches[i].count, 0);
	atomic_store(&p->nwatches, i + 1); /* after its fields: workers read them lock-free */
	pthread_mutex_unlock(&p->lock);
	return i;
}

unsigned s3_proxy_watched(const struct s3_proxy *p, int watch)
{
	cr_assert(watch >= 0 && watch < atomic_load(&p->nwatches), "no proxy watch %d", watch);
	return atomic_load(&p->watches[watch].count);
}

void s3_proxy_require_tokens(struct s3_proxy *p, bool on)
{
	pthread_mutex_lock(&p->lock);
	p->require_tokens = on;
	pthread_mutex_unlock(&p->lock);
}

void s3_proxy_token_add(struct s3_proxy *p, const char *token, int64_t expires)
{
	size_t i;

	pthread_mutex_lock(&p->lock);
	for (i = 0; i < p->ntokens && strcmp(p->tokens[i].name, token); i++)
		;
	if (i == p->ntokens) {
		if (p->ntokens == p->tokens_cap) {
			size_t cap = p->tokens_cap ? 2 * p->tokens_cap : 16;
			struct token *t = realloc(p->tokens, cap * sizeof(*t));

			cr_assert(t, "out of memory for the proxy's tokens");
			p->tokens = t;
			p->tokens_cap = cap;
		}
		p->tokens[i].name = strdup(token);
		cr_assert(p->tokens[i].name, "out of memory for the proxy's tokens");
		p->ntokens++;
	}
	p->tokens[i].expires = expires;
	pthread_mutex_unlock(&p->lock);
}

void s3_proxy_token_expire_all(struct s3_proxy *p)
{
	int64_t now = (int64_t)time(NULL);

	pthread_mutex_lock(&p->lock);
	for (size_t i = 0; i < p->ntokens; i++)
		if (p->tokens[i].expires > now)
			p->tokens[i].expires = now;
	pthread_mutex_unlock(&p->lock);
}

unsigned s3_proxy_token_rejections(const struct s3_proxy *p)
{
	return atomic_load(&p->rejections);
}

void s3_proxy_token_last_rejection(const struct s3_proxy *p, char *buf, size_t len)
{
	pthread_mutex_lock((pthread_mutex_t *)&p->lock);
	snprintf(buf, len, "%s", p->last_rejection);
	pthread_mutex_unlock((pthread_mutex_t *)&p->lock);
}

struct s3_proxy *s3_proxy_volume_setup(const char *tag)
{
	const char *up = getenv("FERRY_TEST_S3_HOSTPORT"), *bucket = getenv("FERRY_TEST_S3_BUCKET");
	char url[PATH_MAX];
	struct s3_proxy *p;
	struct timespec now;

	cr_assert(up && bucket && getenv("AWS_ACCESS_KEY_ID"),
		  "no S3 test environment: run scripts/test, or eval \"$(scripts/s3-server start "
		  "DIR)\" first");
	p = s3_proxy_start(up);
	clock_gettime(CLOCK_REALTIME, &now);
	snprintf(url, sizeof(url), "s3://%s/%s/ferry-%s-%d-%lld%09ld", s3_proxy_hostport(p), bucket,
		 tag, (int)getpid(), (long long)now.tv_sec, now.tv_nsec);
	fm_setup_opts(&(struct fm_opts){ .storage = url, .s3_http = true });
	return p;
}
