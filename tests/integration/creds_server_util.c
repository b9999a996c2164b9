/*
 * creds_server: see creds_server_util.h. One thread accepts a connection,
 * reads one request (head and body, 5 s at most), answers and closes, then
 * accepts the next. Stopping shuts the listening socket and the connection
 * being served, so the thread ends at once.
 */
#include "creds_server_util.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <criterion/criterion.h>

#define CS_REQ_MAX 32768
#define CS_IMDS_PATH "/latest/meta-data/iam/security-credentials/"
#define CS_IMDS_TTL_MAX 21600
#define CS_STS_NS "https://sts.amazonaws.com/doc/2011-06-15/"

/* An IMDS session token the server gave out. */
struct imds_session {
	char token[64];
	int64_t expires;
};

struct creds_server {
	int lfd;
	char base[48];                /* http://127.0.0.1:PORT */
	char container_url[64], process_url[64];
	char *pod_token;
	int lifetime_s;
	creds_issue_fn on_issue;
	void *arg;
	pthread_t thread;
	pthread_mutex_t lock;
	int conn;                     /* being served, -1: none; under lock */
	bool stop;                    /* under lock */
	char last_refusal[256];       /* under lock */
	/* The server's thread only. */
	unsigned next_token;
	struct imds_session *sessions;
	size_t nsessions;
	uint32_t nonce;               /* in IMDS session tokens: not guessable from N */
	atomic_uint fetches, refusals;
	_Atomic int64_t last_fetch;
};

/* One request as read. */
struct cs_req {
	char buf[CS_REQ_MAX + 1];
	size_t head_len, len;
	char method[16], path[256];
	const char *body;             /* NUL-terminated, "" without one */
};

static bool cs_send_all(int fd, const char *p, size_t len)
{
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

static void cs_answer(int fd, int status, const char *reason, const char *type, const char *body)
{
	char out[4096];
	int n = snprintf(out, sizeof(out),
			 "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
			 "Connection: close\r\n\r\n%s", status, reason, type, strlen(body), body);

	cr_assert(n > 0 && (size_t)n < sizeof(out), "creds_server: answer too long");
	cs_send_all(fd, out, (size_t)n);
}

/* Counts a refusal and says why (for the test's messages), then answers. */
static void cs_refuse(struct creds_server *c, int fd, const struct cs_req *r, int status,
		      const char *reason, const char *type, const char *body, const char *why)
{
	atomic_fetch_add(&c->refusals, 1);
	pthread_mutex_lock(&c->lock);
	snprintf(c->last_refusal, sizeof(c->last_refusal), "%d %s %.96s: %s", status, r->method,
		 r->path, why);
	pthread_mutex_unlock(&c->lock);
	cs_answer(fd, status, reason, type, body);
}

/* The value of header name in the request's head (trimmed) into out;
 * false if absent. */
static bool cs_header(const struct cs_req *r, const char *name, char *out, size_t outlen)
{
	size_t nl = strlen(name);

	for (const char *l = strstr(r->buf, "\r\n"); l && l < r->buf + r->head_len;
	     l = strstr(l, "\r\n")) {
		const char *v, *e;

		l += 2;
		if (strncasecmp(l, name, nl) || l[nl] != ':')
			continue;
		v = l + nl + 1;
		while (*v == ' ' || *v == '\t')
			v++;
		e = strstr(v, "\r\n");
		if (!e)
			e = v + strlen(v);
		while (e > v && (e[-1] == ' ' || e[-1] == '\t'))
			e--;
		snprintf(out, outlen, "%.*s", (int)(e - v), v);
		return true;
	}
	return false;
}

/* Reads one request, its body included; false if the client went away,
 * took too long or sent too much. */
static bool cs_read(int fd, struct cs_req *r)
{
	char v[32], *end;
	long clen = 0;
	bool continued = false;

	r->len = 0;
	r->head_len = 0;
	for (;;) {
		ssize_t n;
		char *eoh;

		if (r->head_len) {
			if (r->len >= r->head_len + (size_t)clen)
				break;
			/* curl waits for this before it sends a larger body. */
			if (!continued && cs_header(r, "Expect", v, sizeof(v)) &&
			    !strcasecmp(v, "100-continue")) {
				continued = true;
				if (!cs_send_all(fd, "HTTP/1.1 100 Continue\r\n\r\n", 25))
					return false;
			}
		}
		if (r->len >= CS_REQ_MAX)
			return false;
		n = recv(fd, r->buf + r->len, CS_REQ_MAX - r->len, 0);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return false;
		r->len += (size_t)n;
		r->buf[r->len] = '\0';
		if (!r->head_len && (eoh = strstr(r->buf, "\r\n\r\n"))) {
			r->head_len = (size_t)(eoh - r->buf) + 4;
			if (cs_header(r, "Content-Length", v, sizeof(v))) {
				errno = 0;
				clen = strtol(v, &end, 10);
				if (errno || end == v || *end || clen < 0 ||
				    clen > CS_REQ_MAX - (long)r->head_len)
					return false;
			}
		}
	}
	r->buf[r->head_len + (size_t)clen] = '\0'; /* nothing past the body */
	r->body = r->buf + r->head_len;
	sscanf(r->buf, "%15s %255s", r->method, r->path);
	return true;
}

/* The URL-decoded value of name in an application/x-www-form-urlencoded
 * body into out; false if absent (or not decodable). */
static bool cs_form(const char *body, const char *name, char *out, size_t outlen)
{
	size_t nl = strlen(name);

	for (const char *p = body; p && *p; p = strchr(p, '&') ? strchr(p, '&') + 1 : NULL) {
		size_t o = 0;

		if (strncmp(p, name, nl) || p[nl] != '=')
			continue;
		for (p += nl + 1; *p && *p != '&'; p++) {
			char c = *p;

			if (c == '+') {
				c = ' ';
			} else if (c == '%') {
				char hex[3] = { p[1], p[1] ? p[2] : '\0', '\0' };

				if (!isxdigit((unsigned char)hex[0]) || !isxdigit((unsigned char)hex[1]))
					return false;
				c = (char)strtol(hex, NULL, 16);
				p += 2;
			}
			if (o + 1 >= outlen)
				return false;
			out[o++] = c;
		}
		out[o] = '\0';
		return true;
	}
	return false;
}

/* A new key: tok-N, made known through the callback before it leaves. */
static void cs_issue(struct creds_server *c, char *token, size_t toklen, char *when, size_t wlen)
{
	time_t now = time(NULL), exp = now + c->lifetime_s;
	struct tm tm;

	snprintf(token, toklen, "tok-%u", ++c->next_token);
	gmtime_r(&exp, &tm);
	strftime(when, wlen, "%Y-%m-%dT%H:%M:%SZ", &tm);
	if (c->on_issue)
		c->on_issue(c->arg, token, (int64_t)exp);
	atomic_fetch_add(&c->fetches, 1);
	atomic_store(&c->last_fetch, (int64_t)now);
}

/* GET /creds (container endpoint) and GET /process (credential_process
 * over curl): the pod token in Authorization. */
static void cs_container(struct creds_server *c, int fd, const struct cs_req *r, bool process)
{
	char auth[512], token[32], when[32], body[512];

	if (!cs_header(r, "Authorization", auth, sizeof(auth)) || strcmp(auth, c->pod_token)) {
		cs_refuse(c, fd, r, 401, "Unauthorized", "application/json",
			  "{\"Code\":\"Unauthorized\",\"Message\":\"wrong authorization token\"}",
			  "wrong or no Authorization");
		return;
	}
	cs_issue(c, token, sizeof(token), when, sizeof(when));
	if (process)
		snprintf(body, sizeof(body),
			 "{\"Version\":1,\"AccessKeyId\":\"S3RVER\",\"SecretAccessKey\":\"S3RVER\","
			 "\"SessionToken\":\"%s\",\"Expiration\":\"%s\"}", token, when);
	else
		snprintf(body, sizeof(body),
			 "{\"AccessKeyId\":\"S3RVER\",\"SecretAccessKey\":\"S3RVER\","
			 "\"Token\":\"%s\",\"Expiration\":\"%s\"}", token, when);
	cs_answer(fd, 200, "OK", "application/json", body);
}

static void cs_sts_error(struct creds_server *c, int fd, const struct cs_req *r, int status,
			 const char *code, const char *message)
{
	char body[768];

	snprintf(body, sizeof(body),
		 "<ErrorResponse xmlns=\"" CS_STS_NS "\">\n  <Error>\n    <Type>Sender</Type>\n"
		 "    <Code>%s</Code>\n    <Message>%s</Message>\n  </Error>\n"
		 "  <RequestId>00000000-0000-4000-8000-000000000000</RequestId>\n</ErrorResponse>\n",
		 code, message);
	cs_refuse(c, fd, r, status, status == 403 ? "Forbidden" : "Bad Request", "text/xml", body,
		  code);
}

/* POST / (STS): AssumeRoleWithWebIdentity with the pod token. */
static void cs_sts(struct creds_server *c, int fd, const struct cs_req *r)
{
	char action[64], role[256], session[128], wit[2048], token[32], when[32], body[2048];

	if (!cs_form(r->body, "Action", action, sizeof(action)) ||
	    strcmp(action, "AssumeRoleWithWebIdentity")) {
		cs_sts_error(c, fd, r, 400, "InvalidAction", "Only AssumeRoleWithWebIdentity here.");
		return;
	}
	if (!cs_form(r->body, "RoleArn", role, sizeof(role)) || !role[0] ||
	    !cs_form(r->body, "RoleSessionName", session, sizeof(session)) || !session[0] ||
	    !cs_form(r->body, "WebIdentityToken", wit, sizeof(wit))) {
		cs_sts_error(c, fd, r, 400, "MissingParameter",
			     "RoleArn, RoleSessionName and WebIdentityToken are required.");
		return;
	}
	if (strcmp(wit, c->pod_token)) {
		cs_sts_error(c, fd, r, 403, "AccessDenied",
			     "Not authorized to perform sts:AssumeRoleWithWebIdentity");
		return;
	}
	cs_issue(c, token, sizeof(token), when, sizeof(when));
	snprintf(body, sizeof(body),
		 "<AssumeRoleWithWebIdentityResponse xmlns=\"" CS_STS_NS "\">\n"
		 "  <AssumeRoleWithWebIdentityResult>\n"
		 "    <SubjectFromWebIdentityToken>system:serviceaccount:ferry:ferry"
		 "</SubjectFromWebIdentityToken>\n"
		 "    <AssumedRoleUser>\n      <Arn>%.200s/%.64s</Arn>\n"
		 "      <AssumedRoleId>AROATESTTESTTESTTEST:%.64s</AssumedRoleId>\n"
		 "    </AssumedRoleUser>\n"
		 "    <Credentials>\n"
		 "      <AccessKeyId>S3RVER</AccessKeyId>\n"
		 "      <SecretAccessKey>S3RVER</SecretAccessKey>\n"
		 "      <SessionToken>%s</SessionToken>\n"
		 "      <Expiration>%s</Expiration>\n"
		 "    </Credentials>\n"
		 "  </AssumeRoleWithWebIdentityResult>\n"
		 "  <ResponseMetadata>\n"
		 "    <RequestId>00000000-0000-4000-8000-000000000001</RequestId>\n"
		 "  </ResponseMetadata>\n"
		 "</AssumeRoleWithWebIdentityResponse>\n",
		 role, session, session, token, when);
	cs_answer(fd, 200, "OK", "text/xml", body);
}

/* PUT /latest/api/token: an IMDSv2 session token for the TTL asked. */
static void cs_imds_token(struct creds_server *c, int fd, const struct cs_req *r)
{
	char ttl[32], *end;
	struct imds_session *s;
	long t = 0;

	errno = 0;
	if (!cs_header(r, "X-aws-ec2-metadata-token-ttl-seconds", ttl, sizeof(ttl)) ||
	    (t = strtol(ttl, &end, 10), errno || end == ttl || *end) || t < 1 ||
	    t > CS_IMDS_TTL_MAX) {
		cs_refuse(c, fd, r, 400, "Bad Request", "text/plain", "",
			  "no valid X-aws-ec2-metadata-token-ttl-seconds");
		return;
	}
	s = realloc(c->sessions, (c->nsessions + 1) * sizeof(*s));
	cr_assert(s, "creds_server: out of memory");
	c->sessions = s;
	s += c->nsessions++;
	snprintf(s->token, sizeof(s->token), "imds-session-%zu-%08x", c->nsessions, c->nonce);
	s->expires = (int64_t)time(NULL) + t;
	cs_answer(fd, 200, "OK", "text/plain", s->token);
}

/* The IMDS GETs: a live session token, then the role or its key. */
static void cs_imds_get(struct creds_server *c, int fd, const struct cs_req *r)
{
	const char *role = r->path + strlen(CS_IMDS_PATH);
	char tok[128], token[32], when[32], updated[32], body[512];
	bool live = false;
	time_t now = time(NULL);
	struct tm tm;

	if (cs_header(r, "X-aws-ec2-metadata-token", tok, sizeof(tok)))
		for (size_t i = 0; i < c->nsessions && !live; i++)
			live = !strcmp(tok, c->sessions[i].token) && now < c->sessions[i].expires;
	if (!live) {
		cs_refuse(c, fd, r, 401, "Unauthorized", "text/plain", "",
			  "no live IMDSv2 session token");
		return;
	}
	if (!role[0]) {
		cs_answer(fd, 200, "OK", "text/plain", CREDS_IMDS_ROLE);
		return;
	}
	if (strcmp(role, CREDS_IMDS_ROLE)) {
		cs_answer(fd, 404, "Not Found", "text/plain", "");
		return;
	}
	cs_issue(c, token, sizeof(token), when, sizeof(when));
	gmtime_r(&now, &tm);
	strftime(updated, sizeof(updated), "%Y-%m-%dT%H:%M:%SZ", &tm);
	snprintf(body, sizeof(body),
		 "{\n  \"Code\" : \"Success\",\n  \"LastUpdated\" : \"%s\",\n"
		 "  \"Type\" : \"AWS-HMAC\",\n  \"AccessKeyId\" : \"S3RVER\",\n"
		 "  \"SecretAccessKey\" : \"S3RVER\",\n  \"Token\" : \"%s\",\n"
		 "  \"Expiration\" : \"%s\"\n}", updated, token, when);
	cs_answer(fd, 200, "OK", "text/plain", body);
}

static void cs_serve(struct creds_server *c, int fd)
{
	struct cs_req *r = calloc(1, sizeof(*r));

	cr_assert(r, "creds_server: out of memory");
	if (!cs_read(fd, r))
		goto out;
	if (!strcmp(r->method, "GET") && !strcmp(r->path, "/creds"))
		cs_container(c, fd, r, false);
	else if (!strcmp(r->method, "GET") && !strcmp(r->path, "/process"))
		cs_container(c, fd, r, true);
	else if (!strcmp(r->method, "POST") && !strcmp(r->path, "/"))
		cs_sts(c, fd, r);
	else if (!strcmp(r->method, "PUT") && !strcmp(r->path, "/latest/api/token"))
		cs_imds_token(c, fd, r);
	else if (!strcmp(r->method, "GET") && !strncmp(r->path, CS_IMDS_PATH, strlen(CS_IMDS_PATH)))
		cs_imds_get(c, fd, r);
	else
		cs_answer(fd, 404, "Not Found", "text/plain", "no such thing\n");
out:
	/* Tokens went through it. */
	explicit_bzero(r, sizeof(*r));
	free(r);
}

static void *cs_main(void *arg)
{
	struct creds_server *c = arg;

	for (;;) {
		struct timeval tv = { .tv_sec = 5 };
		int fd = accept4(c->lfd, NULL, NULL, SOCK_CLOEXEC);
		bool stop;

		if (fd < 0) {
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			return NULL; /* shut down */
		}
		pthread_mutex_lock(&c->lock);
		stop = c->stop;
		if (!stop)
			c->conn = fd;
		pthread_mutex_unlock(&c->lock);
		if (stop) {
			close(fd);
			return NULL;
		}
		setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
		cs_serve(c, fd);
		pthread_mutex_lock(&c->lock);
		c->conn = -1;
		pthread_mutex_unlock(&c->lock);
		close(fd);
	}
}

struct creds_server *creds_server_start(const char *pod_token, int lifetime_s,
					creds_issue_fn on_issue, void *arg)
{
	struct creds_server *c = calloc(1, sizeof(*c));
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t sl = sizeof(sa);

	cr_assert(c);
	c->pod_token = strdup(pod_token);
	cr_assert(c->pod_token);
	c->lifetime_s = lifetime_s;
	c->on_issue = on_issue;
	c->arg = arg;
	c->conn = -1;
	cr_assert(getrandom(&c->nonce, sizeof(c->nonce), 0) == (ssize_t)sizeof(c->nonce));
	pthread_mutex_init(&c->lock, NULL);
	c->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	cr_assert(c->lfd >= 0);
	cr_assert(bind(c->lfd, (struct sockaddr *)&sa, sizeof(sa)) == 0);
	cr_assert(listen(c->lfd, 64) == 0);
	cr_assert(getsockname(c->lfd, (struct sockaddr *)&sa, &sl) == 0);
	snprintf(c->base, sizeof(c->base), "http://127.0.0.1:%u", ntohs(sa.sin_port));
	snprintf(c->container_url, sizeof(c->container_url), "%s/creds", c->base);
	snprintf(c->process_url, sizeof(c->process_url), "%s/process", c->base);
	cr_assert(pthread_create(&c->thread, NULL, cs_main, c) == 0);
	return c;
}

const char *creds_server_url(const struct creds_server *c, enum creds_role role)
{
	switch (role) {
	case CREDS_CONTAINER:
		return c->container_url;
	case CREDS_PROCESS:
		return c->process_url;
	case CREDS_STS:
	case CREDS_IMDS:
		break;
	}
	return c->base;
}

unsigned creds_server_fetches(const struct creds_server *c)
{
	return atomic_load(&c->fetches);
}

unsigned creds_server_refusals(const struct creds_server *c)
{
	return atomic_load(&c->refusals);
}

void creds_server_last_refusal(const struct creds_server *c, char *buf, size_t len)
{
	pthread_mutex_lock((pthread_mutex_t *)&c->lock);
	snprintf(buf, len, "%s", c->last_refusal);
	pthread_mutex_unlock((pthread_mutex_t *)&c->lock);
}

int64_t creds_server_last_fetch(const struct creds_server *c)
{
	return atomic_load(&c->last_fetch);
}

void creds_server_stop(struct creds_server *c)
{
	if (!c)
		return;
	pthread_mutex_lock(&c->lock);
	c->stop = true;
	if (c->conn >= 0)
		shutdown(c->conn, SHUT_RDWR); /* wakes the thread in recv */
	pthread_mutex_unlock(&c->lock);
	shutdown(c->lfd, SHUT_RDWR);
	pthread_join(c->thread, NULL);
	close(c->lfd);
	pthread_mutex_destroy(&c->lock);
	free(c->sessions);
	free(c->pod_token);
	free(c);
}
