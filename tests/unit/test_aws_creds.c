/*
 * aws_creds: the credentials chain against real sources, in the test
 * process: shared files in a mkdtemp HOME, shell scripts as
 * credential_process, and one loopback HTTP/1.1 server (a thread) that plays
 * IMDSv2, the container endpoint and STS and records what it was sent.
 *
 * Every test starts with no AWS_* variable, IMDS off and libcurl's proxy
 * variables pointed at a closed loopback port (for a client that honours
 * them, a request that should never be made then fails on this machine).
 * Every secret the fakes
 * hand out holds "SEKRET", so a leak into an error or aws_creds_info() is a
 * strstr away.
 */
#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <criterion/criterion.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "aws_creds.h"
#include "aws_creds_internal.h"
#include "sigv4_util.h"

#define SECRET_MARK "SEKRET"
#define ROLE_ARN "arn:aws:iam::123456789012:role/ferry-test"
#define IMDS_TOKEN "imds-session-token-42"
#define IMDS_ROLE "ferry-instance-role"

/* ---- the temporary HOME and the environment ---- */

static char tmp[64];

static int
rm_cb(const char *p, const struct stat *st, int flag, struct FTW *ftw)
{
	return remove(p);
}

/* Unsets every AWS_* variable: the suite's S3 server exports some. */
static void
clear_aws_env(void)
{
	extern char **environ;

	for (;;) {
		char name[256] = "";

		for (char **e = environ; *e; e++) {
			const char *eq = strchr(*e, '=');

			if (strncmp(*e, "AWS_", 4) == 0 && eq && (size_t)(eq - *e) < sizeof(name)) {
				memcpy(name, *e, (size_t)(eq - *e));
				name[eq - *e] = '\0';
				break;
			}
		}
		if (name[0] == '\0')
			return;
		cr_assert_eq(unsetenv(name), 0);
	}
}

static void
setup(void)
{
	static const char *const proxies[] = { "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY",
					       "all_proxy" };

	clear_aws_env();
	snprintf(tmp, sizeof(tmp), "/tmp/ferry-awscreds-XXXXXX");
	cr_assert_not_null(mkdtemp(tmp));
	setenv("HOME", tmp, 1);
	setenv("AWS_EC2_METADATA_DISABLED", "true", 1);
	/* Anything but the loopback fakes goes to a closed local port (9),
	 * should a client that honours these try it. */
	for (size_t i = 0; i < sizeof(proxies) / sizeof(proxies[0]); i++)
		unsetenv(proxies[i]);
	setenv("http_proxy", "http://127.0.0.1:9", 1);
	setenv("https_proxy", "http://127.0.0.1:9", 1);
	setenv("no_proxy", "127.0.0.1,localhost,0.0.0.0", 1);
}

/* What a test had open when a failed assertion ended it: closed by
 * teardown, so that LSan reports only leaks of the code under test. */
struct srv;
static void srv_stop(struct srv *s);
static struct aws_creds *live_creds[8];
static struct srv *live_srv[4];

static void
live_add(void **set, size_t n, void *p)
{
	for (size_t i = 0; i < n; i++)
		if (set[i] == NULL) {
			set[i] = p;
			return;
		}
}

static void
live_del(void **set, size_t n, void *p)
{
	for (size_t i = 0; i < n; i++)
		if (set[i] == p)
			set[i] = NULL;
}

static void
creds_close(struct aws_creds *c)
{
	live_del((void **)live_creds, 8, c);
	aws_creds_close(c);
}

static void
teardown(void)
{
	for (size_t i = 0; i < 8; i++)
		if (live_creds[i])
			creds_close(live_creds[i]);
	for (size_t i = 0; i < 4; i++)
		if (live_srv[i])
			srv_stop(live_srv[i]);
	if (tmp[0])
		nftw(tmp, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
}

TestSuite(aws_creds, .init = setup, .fini = teardown, .timeout = 120);
TestSuite(aws_parse, .timeout = 30);

/* tmp/name, into out. */
static const char *
tpath(char *out, size_t outlen, const char *name)
{
	cr_assert_lt((size_t)snprintf(out, outlen, "%s/%s", tmp, name), outlen);
	return out;
}

static void
write_file(const char *path, const char *text, mode_t mode)
{
	char t[512];
	FILE *f;

	/* Written aside and renamed: a reader never sees half a file. */
	snprintf(t, sizeof(t), "%s.new", path);
	f = fopen(t, "w");
	cr_assert_not_null(f, "%s: %s", t, strerror(errno));
	cr_assert_eq(fputs(text, f) >= 0, 1);
	cr_assert_eq(fclose(f), 0);
	cr_assert_eq(chmod(t, mode), 0);
	cr_assert_eq(rename(t, path), 0);
}

/* HOME/.aws/NAME */
static void
write_home_aws(const char *name, const char *text)
{
	char d[256], p[300];

	tpath(d, sizeof(d), ".aws");
	mkdir(d, 0700);
	snprintf(p, sizeof(p), "%s/%s", d, name);
	write_file(p, text, 0600);
}

static double
mono(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void
assert_clean(const char *what, const char *s)
{
	cr_assert_null(strstr(s, SECRET_MARK), "a secret in %s: %s", what, s);
}

static int
chain_open(const struct aws_creds_opts *o, struct aws_creds **c, char *err, size_t errlen)
{
	struct aws_creds_opts zero = { 0 };
	int r;

	*c = NULL;
	err[0] = '\0';
	r = aws_creds_open(o ? o : &zero, c, err, errlen);
	assert_clean("the error", err);
	if (r < 0) {
		cr_assert_null(*c, "a failed open returned a provider");
	} else {
		cr_assert_not_null(*c);
		live_add((void **)live_creds, 8, *c);
	}
	return r;
}

static struct aws_creds *
chain_open_ok(void)
{
	struct aws_creds *c;
	char err[512];
	int r = chain_open(NULL, &c, err, sizeof(err));

	cr_assert_eq(r, 0, "aws_creds_open: %d (%s)", r, err);
	return c;
}

static struct aws_creds_info
info_of(struct aws_creds *c)
{
	struct aws_creds_info i;

	memset(&i, 0x55, sizeof(i)); /* the call must set everything */
	aws_creds_info(c, &i);
	cr_assert_lt(strnlen(i.source, sizeof(i.source)), sizeof(i.source));
	cr_assert_lt(strnlen(i.last_error, sizeof(i.last_error)), sizeof(i.last_error));
	assert_clean("info.source", i.source);
	assert_clean("info.last_error", i.last_error);
	return i;
}

/* The current key; it must not have expired when the call was made. */
static const struct aws_key *
key_of(struct aws_creds *c)
{
	const struct aws_key *k = NULL;
	time_t before = time(NULL);
	int r = aws_creds_get(c, &k);

	cr_assert_eq(r, 0, "aws_creds_get: %d", r);
	cr_assert_not_null(k);
	cr_assert_not_null(k->access_key);
	cr_assert_not_null(k->secret_key);
	cr_assert(k->expires == 0 || k->expires > before,
		  "an expired key handed out: expires %lld, now %lld", (long long)k->expires,
		  (long long)before);
	cr_assert_geq(k->generation, 1);
	return k;
}

static void
assert_key(const struct aws_key *k, const char *ak, const char *sk, const char *token)
{
	cr_assert_str_eq(k->access_key, ak);
	cr_assert_str_eq(k->secret_key, sk);
	if (token)
		cr_assert(k->session_token && strcmp(k->session_token, token) == 0,
			  "session token: %s, expected %s", k->session_token ? k->session_token : "(none)",
			  token);
	else
		cr_assert_null(k->session_token, "session token %s, expected none", k->session_token);
}

/* ---- a loopback HTTP/1.1 server: IMDSv2, container endpoint and STS ---- */

#define SRV_MAXREQ 64
#define SRV_REQ_MAX (4 << 20)

struct req {
	char method[16];
	char *target;   /* path and query, as sent */
	char *head;     /* the header lines, each ending in \r\n */
	char *body;     /* NUL-terminated */
	size_t body_len;
};

/* Tests keep theirs static (each test is a process of its own): teardown
 * stops it after a failed assertion has left the test's frame. */
struct srv {
	int lfd, port;
	pthread_t thread;
	atomic_int stop;
	pthread_mutex_t mu;
	struct req reqs[SRV_MAXREQ]; /* the first SRV_MAXREQ requests */
	int nreq;                    /* all requests */
	/* How to answer: set before srv_start, or later under mu. */
	int hang;            /* read the request, never answer */
	int raw_status;      /* nonzero: answer everything with raw_body */
	const char *raw_body;
	size_t raw_len;
	int ttl;             /* Expiration: now + ttl seconds (0: an hour) */
	int no_expiration;   /* the container endpoint gives no Expiration */
	int sts_deny;        /* STS answers 403 AccessDenied */
	int nkeys[3];        /* keys handed out: container, IMDS, STS */
};

static int
req_header(const struct req *r, const char *name, char *out, size_t outlen)
{
	size_t nl = strlen(name);

	for (const char *l = r->head; *l;) {
		const char *e = strstr(l, "\r\n");

		if (e == NULL)
			e = l + strlen(l);
		if (strncasecmp(l, name, nl) == 0 && l[nl] == ':') {
			const char *v = l + nl + 1, *ve = e;

			while (*v == ' ' || *v == '\t')
				v++;
			while (ve > v && (ve[-1] == ' ' || ve[-1] == '\t'))
				ve--;
			snprintf(out, outlen, "%.*s", (int)(ve - v), v);
			return 0;
		}
		l = *e ? e + 2 : e;
	}
	return -1;
}

static int
hexval(int c)
{
	return isdigit(c) ? c - '0' : tolower(c) - 'a' + 10;
}

/* application/x-www-form-urlencoded (and query) decoding. */
static void
form_decode(const char *s, size_t n, char *out, size_t outlen)
{
	size_t o = 0;

	for (size_t i = 0; i < n && o + 1 < outlen; i++) {
		if (s[i] == '%' && i + 2 < n && isxdigit((unsigned char)s[i + 1]) &&
		    isxdigit((unsigned char)s[i + 2])) {
			out[o++] = (char)(hexval((unsigned char)s[i + 1]) * 16 +
					  hexval((unsigned char)s[i + 2]));
			i += 2;
		} else {
			out[o++] = s[i] == '+' ? ' ' : s[i];
		}
	}
	out[o] = '\0';
}

static int
find_param(const char *s, size_t n, const char *name, char *out, size_t outlen)
{
	const char *p = s, *end = s + n;
	size_t nl = strlen(name);

	while (p < end) {
		const char *amp = memchr(p, '&', (size_t)(end - p));

		if (amp == NULL)
			amp = end;
		if ((size_t)(amp - p) > nl && memcmp(p, name, nl) == 0 && p[nl] == '=') {
			form_decode(p + nl + 1, (size_t)(amp - p - (ptrdiff_t)nl - 1), out, outlen);
			return 0;
		}
		if (amp == end)
			break;
		p = amp + 1;
	}
	return -1;
}

/* A parameter of the query string, else of a form body. */
static int
req_param(const struct req *r, const char *name, char *out, size_t outlen)
{
	const char *q = strchr(r->target, '?');

	if (q && find_param(q + 1, strlen(q + 1), name, out, outlen) == 0)
		return 0;
	return find_param(r->body, r->body_len, name, out, outlen);
}

static void
req_free(struct req *r)
{
	free(r->target);
	free(r->head);
	free(r->body);
	memset(r, 0, sizeof(*r));
}

/* Some bytes from fd within 5 s; <= 0 when it closed, timed out or the
 * server stops. */
static ssize_t
recv_some(struct srv *s, int fd, char *buf, size_t n)
{
	for (int waited = 0; waited < 5000 && !atomic_load(&s->stop); waited += 100) {
		struct pollfd p = { .fd = fd, .events = POLLIN };

		if (poll(&p, 1, 100) > 0)
			return recv(fd, buf, n, 0);
	}
	return -1;
}

/* A chunked body's decoded length, or -1 while incomplete; decodes it in
 * place when move (only once it is complete). */
static long
unchunk(char *b, size_t n, int move)
{
	size_t in = 0, out = 0;

	for (;;) {
		char *eol = memmem(b + in, n - in, "\r\n", 2);
		unsigned long len;

		if (eol == NULL)
			return -1;
		len = strtoul(b + in, NULL, 16);
		in = (size_t)(eol - b) + 2;
		if (len == 0)
			return memmem(b + in, n - in, "\r\n", 2) ? (long)out : -1;
		if (n - in < len + 2)
			return -1;
		if (move)
			memmove(b + out, b + in, len);
		out += len;
		in += len + 2;
	}
}

static int
read_req(struct srv *s, int fd, struct req *r)
{
	size_t cap = 65536, have = 0, hlen;
	char *buf = malloc(cap), *end, *sp1, *sp2, *l;
	long clen = 0, blen;
	int chunked = 0;
	char v[64];

	cr_assert_not_null(buf);
	for (;;) {
		ssize_t n;

		if (have + 1 >= cap) {
			if (cap >= SRV_REQ_MAX)
				goto fail;
			cap *= 2;
			buf = realloc(buf, cap);
			cr_assert_not_null(buf);
		}
		n = recv_some(s, fd, buf + have, cap - 1 - have);
		if (n <= 0)
			goto fail;
		have += (size_t)n;
		buf[have] = '\0';
		if ((end = strstr(buf, "\r\n\r\n")) != NULL)
			break;
	}
	hlen = (size_t)(end - buf) + 4;
	sp1 = strchr(buf, ' ');
	sp2 = sp1 ? strchr(sp1 + 1, ' ') : NULL;
	l = strstr(buf, "\r\n");
	if (sp2 == NULL || sp2 > l || (size_t)(sp1 - buf) >= sizeof(r->method))
		goto fail;
	memcpy(r->method, buf, (size_t)(sp1 - buf));
	r->target = strndup(sp1 + 1, (size_t)(sp2 - sp1 - 1));
	r->head = strndup(l + 2, (size_t)(end + 2 - (l + 2)));
	cr_assert(r->target && r->head);
	if (req_header(r, "Content-Length", v, sizeof(v)) == 0)
		clen = strtol(v, NULL, 10);
	if (clen < 0 || clen > SRV_REQ_MAX)
		goto fail;
	if (req_header(r, "Transfer-Encoding", v, sizeof(v)) == 0 && strcasecmp(v, "chunked") == 0)
		chunked = 1;
	if (req_header(r, "Expect", v, sizeof(v)) == 0 && strcasecmp(v, "100-continue") == 0)
		send(fd, "HTTP/1.1 100 Continue\r\n\r\n", 25, MSG_NOSIGNAL);
	/* The body: Content-Length bytes, or chunks up to the last one. */
	for (;;) {
		ssize_t n;

		if (!chunked && have - hlen >= (size_t)clen)
			break;
		if (chunked && unchunk(buf + hlen, have - hlen, 0) >= 0) {
			blen = unchunk(buf + hlen, have - hlen, 1);
			have = hlen + (size_t)blen;
			break;
		}
		if (have + 1 >= cap) {
			if (cap >= SRV_REQ_MAX)
				goto fail;
			cap *= 2;
			buf = realloc(buf, cap);
			cr_assert_not_null(buf);
		}
		n = recv_some(s, fd, buf + have, cap - 1 - have);
		if (n <= 0)
			goto fail;
		have += (size_t)n;
	}
	r->body_len = chunked ? have - hlen : (size_t)clen;
	r->body = malloc(r->body_len + 1);
	cr_assert_not_null(r->body);
	memcpy(r->body, buf + hlen, r->body_len);
	r->body[r->body_len] = '\0';
	free(buf);
	return 0;
fail:
	free(buf);
	req_free(r);
	return -1;
}

static void
send_all(int fd, const char *p, size_t n)
{
	while (n > 0) {
		ssize_t w = send(fd, p, n, MSG_NOSIGNAL);

		if (w <= 0)
			return;
		p += w;
		n -= (size_t)w;
	}
}

static void
respond(int fd, int status, const char *ctype, const char *body, size_t len)
{
	char head[256];
	int n = snprintf(head, sizeof(head),
			 "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
			 "Connection: close\r\n\r\n",
			 status, status == 200 ? "OK" : "Nope", ctype, len);

	send_all(fd, head, (size_t)n);
	send_all(fd, body, len);
}

static void
iso_time(time_t t, char out[32])
{
	struct tm tm;

	gmtime_r(&t, &tm);
	strftime(out, 32, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

#define PFX_IMDS_CREDS "/latest/meta-data/iam/security-credentials"

static void
serve(struct srv *s, int fd, const struct req *r)
{
	char exp[32], body[4096], action[64], v[256];
	int n, ttl;

	pthread_mutex_lock(&s->mu);
	ttl = s->ttl ? s->ttl : 3600;
	iso_time(time(NULL) + ttl, exp);
	if (s->raw_status) {
		int st = s->raw_status;
		const char *b = s->raw_body;
		size_t bl = s->raw_len;

		pthread_mutex_unlock(&s->mu);
		respond(fd, st, "application/json", b, bl);
		return;
	}
	if (strcmp(r->target, "/latest/api/token") == 0) {
		pthread_mutex_unlock(&s->mu);
		if (strcmp(r->method, "PUT") != 0 ||
		    req_header(r, "X-aws-ec2-metadata-token-ttl-seconds", v, sizeof(v)) < 0)
			respond(fd, 400, "text/plain", "", 0);
		else
			respond(fd, 200, "text/plain", IMDS_TOKEN, strlen(IMDS_TOKEN));
		return;
	}
	if (strncmp(r->target, PFX_IMDS_CREDS, strlen(PFX_IMDS_CREDS)) == 0) {
		const char *rest = r->target + strlen(PFX_IMDS_CREDS);

		if (req_header(r, "X-aws-ec2-metadata-token", v, sizeof(v)) < 0 ||
		    strcmp(v, IMDS_TOKEN) != 0) {
			pthread_mutex_unlock(&s->mu);
			respond(fd, 401, "text/plain", "", 0);
		} else if (strcmp(rest, "") == 0 || strcmp(rest, "/") == 0) {
			pthread_mutex_unlock(&s->mu);
			respond(fd, 200, "text/plain", IMDS_ROLE, strlen(IMDS_ROLE));
		} else if (strcmp(rest, "/" IMDS_ROLE) == 0) {
			n = ++s->nkeys[1];
			pthread_mutex_unlock(&s->mu);
			n = snprintf(body, sizeof(body),
				     "{\n  \"Code\" : \"Success\",\n  \"LastUpdated\" : \"2026-01-01T00:00:00Z\",\n"
				     "  \"Type\" : \"AWS-HMAC\",\n  \"AccessKeyId\" : \"ASIAIMDS%d\",\n"
				     "  \"SecretAccessKey\" : \"imds" SECRET_MARK "%d\",\n"
				     "  \"Token\" : \"imdstok" SECRET_MARK "%d\",\n  \"Expiration\" : \"%s\"\n}",
				     n, n, n, exp);
			respond(fd, 200, "text/plain", body, (size_t)n);
		} else {
			pthread_mutex_unlock(&s->mu);
			respond(fd, 404, "text/plain", "", 0);
		}
		return;
	}
	if (req_param(r, "Action", action, sizeof(action)) == 0) {
		if (s->sts_deny) {
			pthread_mutex_unlock(&s->mu);
			n = snprintf(body, sizeof(body),
				     "<ErrorResponse xmlns=\"https://sts.amazonaws.com/doc/2011-06-15/\">"
				     "<Error><Type>Sender</Type><Code>AccessDenied</Code>"
				     "<Message>Not authorized to perform sts:%s</Message></Error>"
				     "<RequestId>c6104cbe-af31-11e0-8154-cbc7ccf896c7</RequestId></ErrorResponse>",
				     action);
			respond(fd, 403, "text/xml", body, (size_t)n);
			return;
		}
		n = ++s->nkeys[2];
		pthread_mutex_unlock(&s->mu);
		n = snprintf(body, sizeof(body),
			     "<%sResponse xmlns=\"https://sts.amazonaws.com/doc/2011-06-15/\">\n"
			     "  <%sResult>\n    <Credentials>\n"
			     "      <AccessKeyId>ASIASTS%d</AccessKeyId>\n"
			     "      <SecretAccessKey>sts" SECRET_MARK "%d</SecretAccessKey>\n"
			     "      <SessionToken>ststok" SECRET_MARK "%d</SessionToken>\n"
			     "      <Expiration>%s</Expiration>\n    </Credentials>\n"
			     "    <AssumedRoleUser><Arn>" ROLE_ARN "/s</Arn><AssumedRoleId>AROA:s</AssumedRoleId>"
			     "</AssumedRoleUser>\n  </%sResult>\n"
			     "  <ResponseMetadata><RequestId>x</RequestId></ResponseMetadata>\n</%sResponse>\n",
			     action, action, n, n, n, exp, action, action);
		respond(fd, 200, "text/xml", body, (size_t)n);
		return;
	}
	/* Anything else is the container endpoint. */
	n = ++s->nkeys[0];
	if (s->no_expiration)
		n = snprintf(body, sizeof(body),
			     "{\"AccessKeyId\":\"ASIACONT%d\",\"SecretAccessKey\":\"cont" SECRET_MARK "%d\","
			     "\"Token\":\"conttok" SECRET_MARK "%d\"}",
			     n, n, n);
	else
		n = snprintf(body, sizeof(body),
			     "{\"AccessKeyId\":\"ASIACONT%d\",\"SecretAccessKey\":\"cont" SECRET_MARK "%d\","
			     "\"Token\":\"conttok" SECRET_MARK "%d\",\"Expiration\":\"%s\"}",
			     n, n, n, exp);
	pthread_mutex_unlock(&s->mu);
	respond(fd, 200, "application/json", body, (size_t)n);
}

static void *
srv_main(void *arg)
{
	struct srv *s = arg;

	while (!atomic_load(&s->stop)) {
		struct pollfd p = { .fd = s->lfd, .events = POLLIN };
		struct req r = { 0 };
		int fd, hang, kept = 0;

		if (poll(&p, 1, 100) <= 0)
			continue;
		fd = accept4(s->lfd, NULL, NULL, SOCK_CLOEXEC);
		if (fd < 0)
			continue;
		if (read_req(s, fd, &r) < 0) {
			close(fd);
			continue;
		}
		pthread_mutex_lock(&s->mu);
		if (s->nreq < SRV_MAXREQ) {
			s->reqs[s->nreq] = r;
			kept = 1;
		}
		s->nreq++;
		hang = s->hang;
		pthread_mutex_unlock(&s->mu);
		if (hang) {
			/* Holds the connection open, answering nothing. */
			while (!atomic_load(&s->stop))
				usleep(20000);
		} else {
			serve(s, fd, &r);
		}
		if (!kept)
			req_free(&r);
		close(fd);
	}
	return NULL;
}

static void
srv_start(struct srv *s)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t sl = sizeof(sa);

	pthread_mutex_init(&s->mu, NULL);
	s->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	cr_assert_geq(s->lfd, 0);
	cr_assert_eq(bind(s->lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	cr_assert_eq(listen(s->lfd, 16), 0);
	cr_assert_eq(getsockname(s->lfd, (struct sockaddr *)&sa, &sl), 0);
	s->port = ntohs(sa.sin_port);
	cr_assert_eq(pthread_create(&s->thread, NULL, srv_main, s), 0);
	live_add((void **)live_srv, 4, s);
}

static void
srv_stop(struct srv *s)
{
	live_del((void **)live_srv, 4, s);
	atomic_store(&s->stop, 1);
	pthread_join(s->thread, NULL);
	close(s->lfd);
	for (int i = 0; i < s->nreq && i < SRV_MAXREQ; i++)
		req_free(&s->reqs[i]);
	pthread_mutex_destroy(&s->mu);
}

static int
srv_count(struct srv *s)
{
	int n;

	pthread_mutex_lock(&s->mu);
	n = s->nreq;
	pthread_mutex_unlock(&s->mu);
	return n;
}

/* Request i (0: the first); recorded requests never change. */
static const struct req *
srv_req(struct srv *s, int i)
{
	const struct req *r;

	pthread_mutex_lock(&s->mu);
	cr_assert_lt(i, s->nreq, "request %d of %d", i, s->nreq);
	cr_assert_lt(i, SRV_MAXREQ);
	r = &s->reqs[i];
	pthread_mutex_unlock(&s->mu);
	return r;
}

static const struct req *
srv_last(struct srv *s)
{
	int n = srv_count(s);

	cr_assert_gt(n, 0, "the server got no request");
	return srv_req(s, n - 1);
}

static void
srv_url(const struct srv *s, const char *path, char *out, size_t outlen)
{
	snprintf(out, outlen, "http://127.0.0.1:%d%s", s->port, path);
}

/* ---- SigV4 as the server checks it (from the specification) ---- */






static char sig_canon[65536];

/*
 * 1 if r's Authorization verifies with secret: the canonical request rebuilt
 * from what arrived (the path encoded twice, as for every service but S3;
 * the query decoded, encoded and sorted; the signed headers trimmed), the
 * body hashed, the key derived for the scope's date, region and service.
 */
static int
sigv4_verify(const struct req *r, const char *secret)
{
	static char tmpb[8192], path[16384], once[16384], query[16384], line[8192], sts[1024];
	char auth[1024], date[64], scope[256], signed_h[512], sig[65], mine[65], body_hash[65];
	char region[64], service[64], names[512], *n, *save = NULL, *params[64];
	const char *q = strchr(r->target, '?');
	unsigned char k[32], k2[32];
	size_t o = 0;
	int np = 0;

	if (req_header(r, "Authorization", auth, sizeof(auth)) < 0 ||
	    sscanf(auth, "AWS4-HMAC-SHA256 Credential=%*[^/]/%255[^,], SignedHeaders=%511[^,], Signature=%64s",
		   scope, signed_h, sig) != 3 ||
	    sscanf(scope, "%*8[0-9]/%63[^/]/%63[^/]/aws4_request", region, service) != 2 ||
	    req_header(r, "X-Amz-Date", date, sizeof(date)) < 0)
		return 0;
	form_decode(r->target, q ? (size_t)(q - r->target) : strlen(r->target), tmpb, sizeof(tmpb));
	uri_encode(tmpb, 1, once);
	if (strcmp(service, "s3") != 0)
		uri_encode(once, 1, path);
	else
		strcpy(path, once);
	query[0] = '\0';
	if (q) {
		char *qcopy = strdup(q + 1), *p;

		for (p = strtok_r(qcopy, "&", &save); p; p = strtok_r(NULL, "&", &save)) {
			char *eq = strchr(p, '='), nm[1024], val[4096], en[3072], ev[12288];

			form_decode(p, eq ? (size_t)(eq - p) : strlen(p), nm, sizeof(nm));
			form_decode(eq ? eq + 1 : "", eq ? strlen(eq + 1) : 0, val, sizeof(val));
			uri_encode(nm, 0, en);
			uri_encode(val, 0, ev);
			cr_assert_lt(np, 64);
			cr_assert_geq(asprintf(&params[np++], "%s=%s", en, ev), 0);
		}
		free(qcopy);
		qsort(params, (size_t)np, sizeof(params[0]), cmp_str);
		for (int i = 0; i < np; i++) {
			if (o < sizeof(query))
				o += (size_t)snprintf(query + o, sizeof(query) - o, "%s%s", i ? "&" : "",
						      params[i]);
			free(params[i]);
		}
	}
	o = (size_t)snprintf(sig_canon, sizeof(sig_canon), "%s\n%s\n%s\n", r->method, path, query);
	snprintf(names, sizeof(names), "%s", signed_h);
	save = NULL;
	for (n = strtok_r(names, ";", &save); n; n = strtok_r(NULL, ";", &save)) {
		size_t nl = strlen(n), vo = 0;
		int found = 0;

		for (const char *l = r->head; *l; l = strstr(l, "\r\n") + 2) {
			if (strncasecmp(l, n, nl) == 0 && l[nl] == ':') {
				const char *v = l + nl + 1, *e = strstr(l, "\r\n");

				/* Trimmed, inner runs of spaces as one. */
				while (*v == ' ' || *v == '\t')
					v++;
				while (e > v && (e[-1] == ' ' || e[-1] == '\t'))
					e--;
				if (found++)
					line[vo++] = ',';
				for (; v < e; v++)
					if (!(*v == ' ' && (v[1] == ' ' || v[1] == '\t')))
						line[vo++] = *v;
			}
		}
		line[vo] = '\0';
		if (!found)
			return 0; /* a signed header that was not sent */
		o += (size_t)snprintf(sig_canon + o, sizeof(sig_canon) - o, "%s:%s\n", n, line);
	}
	sha256_hex(r->body, r->body_len, body_hash);
	snprintf(sig_canon + o, sizeof(sig_canon) - o, "\n%s\n%s", signed_h, body_hash);
	sha256_hex(sig_canon, strlen(sig_canon), mine);
	snprintf(sts, sizeof(sts), "AWS4-HMAC-SHA256\n%s\n%s\n%s", date, scope, mine);
	snprintf(tmpb, sizeof(tmpb), "AWS4%s", secret);
	snprintf(line, sizeof(line), "%.8s", date);
	hmac(tmpb, strlen(tmpb), line, k);
	hmac(k, 32, region, k2);
	hmac(k2, 32, service, k);
	hmac(k, 32, "aws4_request", k2);
	hmac(k2, 32, sts, k);
	hex(k, 32, mine);
	return strcmp(mine, sig) == 0;
}

/* The verifier agrees with AWS's published get-vanilla example. */
Test(aws_parse, sigv4_verifier_accepts_aws_example)
{
	struct req r = {
		.method = "GET",
		.target = "/",
		.head = "Host: example.amazonaws.com\r\n"
			"X-Amz-Date: 20150830T123600Z\r\n"
			"Authorization: AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/"
			"aws4_request, SignedHeaders=host;x-amz-date, "
			"Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31\r\n",
		.body = "",
	};

	cr_assert(sigv4_verify(&r, "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"), "%s", sig_canon);
	cr_assert_not(sigv4_verify(&r, "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEz"));
}

/* ---- static keys: the options, the environment ---- */

Test(aws_creds, opts_static_keys)
{
	struct aws_creds_opts o = { .access_key = "AKIAOPTIONS", .secret_key = "opt" SECRET_MARK };
	struct aws_creds *c;
	const struct aws_key *k;
	struct aws_creds_info i;
	char err[256];

	/* The options win over everything, the environment included. */
	setenv("AWS_ACCESS_KEY_ID", "AKIAENV", 1);
	setenv("AWS_SECRET_ACCESS_KEY", "env" SECRET_MARK, 1);
	cr_assert_eq(chain_open(&o, &c, err, sizeof(err)), 0, "%s", err);
	k = key_of(c);
	assert_key(k, "AKIAOPTIONS", "opt" SECRET_MARK, NULL);
	cr_assert_eq(k->expires, 0);
	cr_assert_eq(k->generation, 1);
	aws_key_put(k);
	i = info_of(c);
	cr_assert_eq(i.expires, 0);
	cr_assert_eq(i.refreshes, 0);
	cr_assert_eq(i.refresh_failures, 0);
	cr_assert_str_eq(i.last_error, "");
	cr_assert_neq(i.source[0], '\0');
	creds_close(c);
	aws_creds_close(NULL);
	aws_key_put(NULL);
}

Test(aws_creds, environment_keys)
{
	struct aws_creds *c;
	const struct aws_key *k, *k2;
	struct aws_creds_info i;

	setenv("AWS_ACCESS_KEY_ID", "AKIAENVIRONMENT", 1);
	setenv("AWS_SECRET_ACCESS_KEY", "env" SECRET_MARK, 1);
	c = chain_open_ok();
	k = key_of(c);
	assert_key(k, "AKIAENVIRONMENT", "env" SECRET_MARK, NULL);
	cr_assert_eq(k->expires, 0);
	cr_assert_eq(k->generation, 1);
	/* A key is reference-counted: two holders see the same one. */
	k2 = key_of(c);
	cr_assert_str_eq(k2->access_key, k->access_key);
	aws_key_put(k2);
	aws_key_put(k);
	i = info_of(c);
	cr_assert_str_eq(i.source, "environment");
	cr_assert_eq(i.expires, 0);
	cr_assert_eq(i.refreshes, 0);
	creds_close(c);
}

Test(aws_creds, environment_keys_with_session_token)
{
	struct aws_creds *c;
	const struct aws_key *k;

	setenv("AWS_ACCESS_KEY_ID", "ASIAENVIRONMENT", 1);
	setenv("AWS_SECRET_ACCESS_KEY", "env" SECRET_MARK, 1);
	setenv("AWS_SESSION_TOKEN", "envtok" SECRET_MARK, 1);
	c = chain_open_ok();
	k = key_of(c);
	assert_key(k, "ASIAENVIRONMENT", "env" SECRET_MARK, "envtok" SECRET_MARK);
	aws_key_put(k);
	cr_assert_str_eq(info_of(c).source, "environment");
	creds_close(c);
}

Test(aws_creds, environment_wins_over_profile)
{
	struct aws_creds *c;
	const struct aws_key *k;

	write_home_aws("credentials", "[default]\naws_access_key_id = AKIAPROFILE\n"
				      "aws_secret_access_key = prof" SECRET_MARK "\n");
	setenv("AWS_ACCESS_KEY_ID", "AKIAENVIRONMENT", 1);
	setenv("AWS_SECRET_ACCESS_KEY", "env" SECRET_MARK, 1);
	c = chain_open_ok();
	k = key_of(c);
	assert_key(k, "AKIAENVIRONMENT", "env" SECRET_MARK, NULL);
	aws_key_put(k);
	cr_assert_str_eq(info_of(c).source, "environment");
	creds_close(c);
}

/* ---- the shared files ---- */

Test(aws_creds, profile_from_shared_credentials_file)
{
	struct aws_creds *c;
	const struct aws_key *k;
	char p[256];

	/* ~/.aws/credentials says otherwise: AWS_SHARED_CREDENTIALS_FILE wins. */
	write_home_aws("credentials", "[other]\naws_access_key_id = AKIAHOME\n"
				      "aws_secret_access_key = home" SECRET_MARK "\n");
	write_file(tpath(p, sizeof(p), "creds"),
		   "[default]\naws_access_key_id = AKIADEFAULT\naws_secret_access_key = def" SECRET_MARK "\n"
		   "\n[other]\naws_access_key_id = AKIAOTHER\naws_secret_access_key = other" SECRET_MARK
		   "\naws_session_token = othertok" SECRET_MARK "\n",
		   0600);
	setenv("AWS_SHARED_CREDENTIALS_FILE", p, 1);
	setenv("AWS_PROFILE", "other", 1);
	c = chain_open_ok();
	k = key_of(c);
	assert_key(k, "AKIAOTHER", "other" SECRET_MARK, "othertok" SECRET_MARK);
	cr_assert_eq(k->expires, 0);
	aws_key_put(k);
	cr_assert_str_eq(info_of(c).source, "profile other");
	creds_close(c);
}

Test(aws_creds, profile_from_config_file)
{
	struct aws_creds *c;
	const struct aws_key *k;
	char p[256], none[256];

	/* In the config file the profile is [profile x]; a bare [x] is not it. */
	write_file(tpath(p, sizeof(p), "config"),
		   "[x]\naws_access_key_id = AKIABARE\naws_secret_access_key = bare" SECRET_MARK "\n"
		   "[profile x]\nregion = eu-west-1\naws_access_key_id = AKIACONFIGX\n"
		   "aws_secret_access_key = cfg" SECRET_MARK "\n",
		   0600);
	setenv("AWS_CONFIG_FILE", p, 1);
	setenv("AWS_SHARED_CREDENTIALS_FILE", tpath(none, sizeof(none), "no-such-file"), 1);
	setenv("AWS_PROFILE", "x", 1);
	c = chain_open_ok();
	k = key_of(c);
	assert_key(k, "AKIACONFIGX", "cfg" SECRET_MARK, NULL);
	aws_key_put(k);
	cr_assert_str_eq(info_of(c).source, "profile x");
	creds_close(c);
}

Test(aws_creds, default_profile_from_home)
{
	struct aws_creds *c;
	const struct aws_key *k;

	write_home_aws("credentials", "# keys\n[other]\naws_access_key_id = AKIAOTHER\n"
				      "aws_secret_access_key = other" SECRET_MARK "\n"
				      "[default]\n  aws_access_key_id=AKIADEFAULT  \n"
				      "; the secret\naws_secret_access_key =def" SECRET_MARK "\n"
				      "aws_session_token = deftok" SECRET_MARK "\n");
	c = chain_open_ok();
	k = key_of(c);
	assert_key(k, "AKIADEFAULT", "def" SECRET_MARK, "deftok" SECRET_MARK);
	aws_key_put(k);
	cr_assert_str_eq(info_of(c).source, "profile default");
	creds_close(c);
}

/* ---- credential_process ---- */

/* TMP/NAME.sh with script_body, and a [profile NAME] in TMP/config that
 * runs it as its credential_process. */
static void
write_process_profile(const char *name, const char *script_body)
{
	char sp[256], cp[256], cfg[1024];

	tpath(sp, sizeof(sp), name);
	strncat(sp, ".sh", sizeof(sp) - strlen(sp) - 1);
	write_file(sp, script_body, 0755);
	snprintf(cfg, sizeof(cfg), "[profile %s]\ncredential_process = %s\n", name, sp);
	/* Several calls add profiles to one config file. */
	tpath(cp, sizeof(cp), "config");
	{
		FILE *f = fopen(cp, "a");

		cr_assert_not_null(f);
		fputs(cfg, f);
		fclose(f);
	}
	setenv("AWS_CONFIG_FILE", cp, 1);
}

/* A credential_process printing a new key at every run (numbered by a
 * counter file), expiring ttl seconds from then. */
static void
write_counting_process(const char *name, int ttl)
{
	char script[2048], counter[256];

	tpath(counter, sizeof(counter), "process-runs");
	snprintf(script, sizeof(script),
		 "#!/bin/sh\n"
		 "n=$(( $(cat %s 2>/dev/null || echo 0) + 1 ))\n"
		 "echo $n > %s\n"
		 "exp=$(date -u -d \"@$(( $(date +%%s) + %d ))\" +%%Y-%%m-%%dT%%H:%%M:%%SZ)\n"
		 "printf '{\"Version\": 1, \"AccessKeyId\": \"ASIAPROC%%d\", "
		 "\"SecretAccessKey\": \"proc" SECRET_MARK "%%d\", \"SessionToken\": \"proctok" SECRET_MARK
		 "%%d\", \"Expiration\": \"%%s\"}\\n' $n $n $n \"$exp\"\n",
		 counter, counter, ttl);
	write_process_profile(name, script);
}

Test(aws_creds, credential_process_refreshes_by_itself)
{
	struct aws_creds *c;
	const struct aws_key *k;
	struct aws_creds_info i;
	int64_t first_expires;
	uint64_t gen = 1;
	double deadline;

	/* Keys that live 8 s: the provider must fetch the next one, by itself,
	 * some seconds before the first expires. */
	write_counting_process("proc", 8);
	setenv("AWS_PROFILE", "proc", 1);
	c = chain_open_ok();
	k = key_of(c);
	assert_key(k, "ASIAPROC1", "proc" SECRET_MARK "1", "proctok" SECRET_MARK "1");
	cr_assert_eq(k->generation, 1);
	first_expires = k->expires;
	cr_assert_gt(first_expires, time(NULL), "%lld", (long long)first_expires);
	cr_assert_leq(first_expires, time(NULL) + 9);
	aws_key_put(k);
	i = info_of(c);
	/* "profile proc", perhaps with how the profile gets its keys. */
	cr_assert(strncmp(i.source, "profile proc", 12) == 0 && (!i.source[12] || i.source[12] == ' '),
		  "%s", i.source);
	cr_assert_eq(i.expires, first_expires);

	deadline = mono() + 60;
	while (gen < 2 && mono() < deadline) {
		k = key_of(c); /* never an expired one */
		gen = k->generation;
		if (gen >= 2) {
			cr_assert_lt(time(NULL), first_expires,
				     "the second key came only when the first had expired");
			cr_assert_str_eq(k->access_key, "ASIAPROC2");
			cr_assert_gt(k->expires, first_expires - 1);
		}
		aws_key_put(k);
		usleep(50 * 1000);
	}
	cr_assert_geq(gen, 2, "no refresh in 60 s");
	i = info_of(c);
	cr_assert_geq(i.refreshes, 1);
	cr_assert_eq(i.refresh_failures, 0, "%s", i.last_error);
	creds_close(c);
}

Test(aws_creds, credential_process_failures)
{
	static const struct {
		const char *profile;
		const char *script;
	} cases[] = {
		{ "exits1", "#!/bin/sh\necho 'cannot get keys' >&2\nexit 1\n" },
		{ "garbage", "#!/bin/sh\necho 'this is not { JSON'\n" },
		{ "version2", "#!/bin/sh\necho '{\"Version\": 2, \"AccessKeyId\": \"AKIAV2\", "
			      "\"SecretAccessKey\": \"v2" SECRET_MARK "\"}'\n" },
		{ "nosecret", "#!/bin/sh\necho '{\"Version\": 1, \"AccessKeyId\": \"AKIAV1\"}'\n" },
	};

	for (size_t n = 0; n < sizeof(cases) / sizeof(cases[0]); n++)
		write_process_profile(cases[n].profile, cases[n].script);
	for (size_t n = 0; n < sizeof(cases) / sizeof(cases[0]); n++) {
		struct aws_creds *c;
		char err[512];
		int r;

		setenv("AWS_PROFILE", cases[n].profile, 1);
		r = chain_open(NULL, &c, err, sizeof(err));
		cr_assert(r == -EIO || r == -EINVAL, "%s: %d (%s)", cases[n].profile, r, err);
		cr_assert_not_null(strstr(err, cases[n].profile), "the error does not name the profile: %s",
				   err);
	}
}

Test(aws_creds, credential_process_that_hangs)
{
	struct aws_creds_opts o = { .timeout_ms = 500 };
	struct aws_creds *c;
	char script[512], pidfile[256], err[512], buf[32] = "";
	double t0;
	pid_t pid;
	FILE *f;
	int r, alive;

	tpath(pidfile, sizeof(pidfile), "hang.pid");
	snprintf(script, sizeof(script), "#!/bin/sh\necho $$ > %s\nexec sleep 30\n", pidfile);
	write_process_profile("hang", script);
	setenv("AWS_PROFILE", "hang", 1);
	t0 = mono();
	r = chain_open(&o, &c, err, sizeof(err));
	cr_assert_lt(r, 0, "a hung command gave keys");
	cr_assert_lt(mono() - t0, 10.0, "open took %.1f s with a 500 ms timeout", mono() - t0);
	cr_assert_not_null(strstr(err, "hang"), "%s", err);
	/* The command was not left running. */
	f = fopen(pidfile, "r");
	cr_assert_not_null(f, "the command did not run");
	cr_assert_not_null(fgets(buf, sizeof(buf), f));
	fclose(f);
	pid = (pid_t)atoi(buf);
	cr_assert_gt(pid, 1);
	for (t0 = mono(); kill(pid, 0) == 0 && mono() - t0 < 5;)
		usleep(20 * 1000);
	alive = kill(pid, 0) == 0;
	if (alive)
		kill(pid, SIGKILL); /* the test leaves nothing running either way */
	cr_assert_not(alive, "the command (pid %d) still ran 5 s after open returned", (int)pid);
	/* A source that failed: -EIO (aws_creds.h lists no other errno for it). */
	cr_assert_eq(r, -EIO, "%d (%s)", r, err);
}

/* ---- STS: AssumeRole from a source profile, web identity ---- */

static void
set_sts(const struct srv *s)
{
	char url[128];

	srv_url(s, "", url, sizeof(url));
	setenv("AWS_ENDPOINT_URL_STS", url, 1);
}

static void
assert_param(const struct req *r, const char *name, const char *want)
{
	char v[4096];

	cr_assert_eq(req_param(r, name, v, sizeof(v)), 0, "%s %s: no %s in %s", r->method, r->target, name,
		     r->body);
	if (want)
		cr_assert_str_eq(v, want, "%s", name);
}

Test(aws_creds, assume_role_with_source_profile)
{
	static struct srv s;
	struct aws_creds *c;
	const struct aws_key *k;
	const struct req *r;
	char p[256], auth[1024];

	srv_start(&s);
	set_sts(&s);
	write_file(tpath(p, sizeof(p), "credentials"),
		   "[src]\naws_access_key_id = AKIASOURCE\naws_secret_access_key = src" SECRET_MARK "\n", 0600);
	setenv("AWS_SHARED_CREDENTIALS_FILE", p, 1);
	write_file(tpath(p, sizeof(p), "config"),
		   "[profile assumer]\nrole_arn = " ROLE_ARN "\nsource_profile = src\n"
		   "role_session_name = ferry-assumer\nregion = eu-west-3\n",
		   0600);
	setenv("AWS_CONFIG_FILE", p, 1);
	setenv("AWS_PROFILE", "assumer", 1);

	c = chain_open_ok();
	k = key_of(c);
	assert_key(k, "ASIASTS1", "sts" SECRET_MARK "1", "ststok" SECRET_MARK "1");
	cr_assert_gt(k->expires, time(NULL) + 3000);
	aws_key_put(k);
	cr_assert_eq(srv_count(&s), 1);
	r = srv_req(&s, 0);
	assert_param(r, "Action", "AssumeRole");
	assert_param(r, "Version", "2011-06-15");
	assert_param(r, "RoleArn", ROLE_ARN);
	assert_param(r, "RoleSessionName", "ferry-assumer");
	/* Signed with the source profile's key, for sts in the profile's region. */
	cr_assert_eq(req_header(r, "Authorization", auth, sizeof(auth)), 0, "not signed");
	cr_assert(strncmp(auth, "AWS4-HMAC-SHA256 Credential=AKIASOURCE/", 39) == 0, "%s", auth);
	cr_assert_not_null(strstr(auth, "/eu-west-3/sts/aws4_request"), "%s", auth);
	cr_assert(sigv4_verify(r, "src" SECRET_MARK), "the signature does not verify; canonical request:\n%s",
		  sig_canon);
	cr_assert_not_null(strstr(info_of(c).source, "assumer"), "%s", info_of(c).source);
	creds_close(c);
	srv_stop(&s);
}

static void
set_web_identity(const struct srv *s, const char *token)
{
	char p[256];

	set_sts(s);
	write_file(tpath(p, sizeof(p), "jwt"), token, 0600);
	setenv("AWS_WEB_IDENTITY_TOKEN_FILE", p, 1);
	setenv("AWS_ROLE_ARN", ROLE_ARN, 1);
}

Test(aws_creds, web_identity)
{
	static struct srv s;
	struct aws_creds *c;
	const struct aws_key *k;
	const struct req *r;
	struct aws_creds_info i;
	char v[64];

	srv_start(&s);
	set_web_identity(&s, "jwt-" SECRET_MARK "-one");
	setenv("AWS_ROLE_SESSION_NAME", "ferry-session", 1);
	c = chain_open_ok();
	k = key_of(c);
	assert_key(k, "ASIASTS1", "sts" SECRET_MARK "1", "ststok" SECRET_MARK "1");
	cr_assert_gt(k->expires, time(NULL) + 3000);
	cr_assert_lt(k->expires, time(NULL) + 3700);
	cr_assert_eq(k->generation, 1);
	aws_key_put(k);
	cr_assert_eq(srv_count(&s), 1);
	r = srv_req(&s, 0);
	assert_param(r, "Action", "AssumeRoleWithWebIdentity");
	assert_param(r, "Version", "2011-06-15");
	assert_param(r, "RoleArn", ROLE_ARN);
	assert_param(r, "RoleSessionName", "ferry-session");
	assert_param(r, "WebIdentityToken", "jwt-" SECRET_MARK "-one");
	/* The token is the credential: the request is not signed. */
	cr_assert_neq(req_header(r, "Authorization", v, sizeof(v)), 0);
	i = info_of(c);
	cr_assert_not_null(strstr(i.source, "web identity"), "%s", i.source);
	cr_assert_not_null(strstr(i.source, ROLE_ARN), "%s", i.source);
	cr_assert_eq(i.refreshes, 0);
	creds_close(c);
	srv_stop(&s);
}

Test(aws_creds, web_identity_from_profile)
{
	static struct srv s;
	struct aws_creds *c;
	const struct aws_key *k;
	char p[256], cfg[1024], jwt[256];

	srv_start(&s);
	set_sts(&s);
	write_file(tpath(jwt, sizeof(jwt), "profile-jwt"), "jwt-" SECRET_MARK "-profile", 0600);
	snprintf(cfg, sizeof(cfg), "[profile wi]\nrole_arn = %s\nweb_identity_token_file = %s\n",
		 ROLE_ARN, jwt);
	write_file(tpath(p, sizeof(p), "config"), cfg, 0600);
	setenv("AWS_CONFIG_FILE", p, 1);
	setenv("AWS_PROFILE", "wi", 1);
	c = chain_open_ok();
	k = key_of(c);
	assert_key(k, "ASIASTS1", "sts" SECRET_MARK "1", "ststok" SECRET_MARK "1");
	aws_key_put(k);
	assert_param(srv_last(&s), "Action", "AssumeRoleWithWebIdentity");
	assert_param(srv_last(&s), "WebIdentityToken", "jwt-" SECRET_MARK "-profile");
	assert_param(srv_last(&s), "RoleArn", ROLE_ARN);
	creds_close(c);
	srv_stop(&s);
}

Test(aws_creds, web_identity_token_is_read_again)
{
	static struct srv s;
	struct aws_creds *c;
	const struct aws_key *k;
	char p[256];

	srv_start(&s);
	set_web_identity(&s, "jwt-" SECRET_MARK "-one");
	c = chain_open_ok();
	k = key_of(c);
	cr_assert_eq(k->generation, 1);
	aws_key_put(k);
	assert_param(srv_last(&s), "WebIdentityToken", "jwt-" SECRET_MARK "-one");
	/* Without AWS_ROLE_SESSION_NAME, some name all the same. */
	assert_param(srv_last(&s), "RoleSessionName", NULL);

	/* The kubelet rotates the token: the next fetch sends the new one. */
	write_file(tpath(p, sizeof(p), "jwt"), "jwt-" SECRET_MARK "-two", 0600);
	cr_assert_eq(aws_creds_refresh(c, 1), 0, "%s", info_of(c).last_error);
	cr_assert_eq(srv_count(&s), 2);
	assert_param(srv_last(&s), "WebIdentityToken", "jwt-" SECRET_MARK "-two");
	k = key_of(c);
	cr_assert_eq(k->generation, 2);
	assert_key(k, "ASIASTS2", "sts" SECRET_MARK "2", "ststok" SECRET_MARK "2");
	aws_key_put(k);
	cr_assert_eq(info_of(c).refreshes, 1);
	creds_close(c);
	srv_stop(&s);
}

Test(aws_creds, web_identity_token_removed_keeps_the_valid_key)
{
	static struct srv s;
	struct aws_creds *c;
	const struct aws_key *k;
	struct aws_creds_info i;
	char p[256];
	int64_t expires;

	/* Keys for 16 s: the refresh starts about 8 s before they expire. */
	s.ttl = 16;
	srv_start(&s);
	set_web_identity(&s, "jwt-" SECRET_MARK "-one");
	c = chain_open_ok();
	k = key_of(c);
	expires = k->expires;
	aws_key_put(k);
	cr_assert_eq(unlink(tpath(p, sizeof(p), "jwt")), 0);

	/* The background refresh fails; the held key is still good. */
	do {
		usleep(100 * 1000);
		i = info_of(c);
	} while (i.refresh_failures == 0 && time(NULL) < expires - 1);
	cr_assert_gt(i.refresh_failures, 0, "no failed refresh before the key expired");
	cr_assert_not_null(strstr(i.last_error, p), "the error does not name %s: %s", p, i.last_error);
	cr_assert_eq(i.refreshes, 0);
	if (time(NULL) < expires - 1) {
		k = key_of(c);
		cr_assert_eq(k->generation, 1);
		cr_assert_str_eq(k->access_key, "ASIASTS1");
		aws_key_put(k);
	}
	/* A refresh asked for fails the same way, and changes nothing held. */
	cr_assert_lt(aws_creds_refresh(c, 1), 0);
	cr_assert_eq(srv_count(&s), 1, "STS asked without a token");
	creds_close(c);
	srv_stop(&s);
}

Test(aws_creds, web_identity_access_denied)
{
	static struct srv s;
	struct aws_creds *c;
	char err[512];
	int r;

	s.sts_deny = 1;
	srv_start(&s);
	set_web_identity(&s, "jwt-" SECRET_MARK "-denied");
	r = chain_open(NULL, &c, err, sizeof(err));
	cr_assert_eq(r, -EACCES, "%d (%s)", r, err);
	cr_assert_not_null(strstr(err, "AccessDenied"), "%s", err);
	cr_assert_eq(srv_count(&s), 1);
	srv_stop(&s);
}

/* ---- the container endpoint ---- */

static void
set_container(const struct srv *s, const char *path)
{
	char url[128];

	srv_url(s, path, url, sizeof(url));
	setenv("AWS_CONTAINER_CREDENTIALS_FULL_URI", url, 1);
}

Test(aws_creds, container_with_token_file)
{
	static struct srv s;
	struct aws_creds *c;
	const struct aws_key *k;
	const struct req *r;
	struct aws_creds_info i;
	char p[256], v[256];

	srv_start(&s);
	set_container(&s, "/v1/credentials");
	write_file(tpath(p, sizeof(p), "eks-pod-identity-token"), "auth-" SECRET_MARK "-1", 0600);
	setenv("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE", p, 1);
	/* The file wins over the variable. */
	setenv("AWS_CONTAINER_AUTHORIZATION_TOKEN", "auth-" SECRET_MARK "-env", 1);
	c = chain_open_ok();
	k = key_of(c);
	assert_key(k, "ASIACONT1", "cont" SECRET_MARK "1", "conttok" SECRET_MARK "1");
	cr_assert_gt(k->expires, time(NULL) + 3000);
	aws_key_put(k);
	cr_assert_eq(srv_count(&s), 1);
	r = srv_req(&s, 0);
	cr_assert_str_eq(r->method, "GET");
	cr_assert_str_eq(r->target, "/v1/credentials");
	cr_assert_eq(req_header(r, "Authorization", v, sizeof(v)), 0);
	cr_assert_str_eq(v, "auth-" SECRET_MARK "-1");
	i = info_of(c);
	cr_assert_not_null(strcasestr(i.source, "container"), "%s", i.source);
	cr_assert_gt(i.expires, time(NULL) + 3000);

	/* The file is read at every fetch (EKS rotates it). */
	write_file(p, "auth-" SECRET_MARK "-2", 0600);
	cr_assert_eq(aws_creds_refresh(c, 1), 0, "%s", info_of(c).last_error);
	cr_assert_eq(srv_count(&s), 2);
	cr_assert_eq(req_header(srv_last(&s), "Authorization", v, sizeof(v)), 0);
	cr_assert_str_eq(v, "auth-" SECRET_MARK "-2");
	creds_close(c);
	srv_stop(&s);
}

Test(aws_creds, container_with_token_variable)
{
	static struct srv s;
	struct aws_creds *c;
	const struct aws_key *k;
	char v[256];

	s.no_expiration = 1;
	srv_start(&s);
	set_container(&s, "/creds?id=7");
	setenv("AWS_CONTAINER_AUTHORIZATION_TOKEN", "Basic auth-" SECRET_MARK, 1);
	c = chain_open_ok();
	k = key_of(c);
	assert_key(k, "ASIACONT1", "cont" SECRET_MARK "1", "conttok" SECRET_MARK "1");
	cr_assert_eq(k->expires, 0);
	aws_key_put(k);
	cr_assert_str_eq(srv_last(&s)->target, "/creds?id=7");
	cr_assert_eq(req_header(srv_last(&s), "Authorization", v, sizeof(v)), 0);
	cr_assert_str_eq(v, "Basic auth-" SECRET_MARK);
	creds_close(c);
	srv_stop(&s);
}

Test(aws_creds, container_token_with_line_break_injects_nothing)
{
	static struct srv s;
	struct aws_creds *c;
	char p[256], err[512], v[64];
	int r;

	srv_start(&s);
	set_container(&s, "/creds");
	write_file(tpath(p, sizeof(p), "token"), "auth-" SECRET_MARK "\r\nX-Injected: yes", 0600);
	setenv("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE", p, 1);
	r = chain_open(NULL, &c, err, sizeof(err));
	/* Refused, or sent without a header of the file's making. */
	if (r == 0) {
		cr_assert_eq(req_header(srv_last(&s), "X-Injected", v, sizeof(v)), -1,
			     "the token file added a header");
		creds_close(c);
	} else {
		cr_assert(r == -EINVAL || r == -EIO, "%d (%s)", r, err);
		for (int i = 0; i < srv_count(&s); i++)
			cr_assert_eq(req_header(srv_req(&s, i), "X-Injected", v, sizeof(v)), -1);
	}
	srv_stop(&s);
}

Test(aws_creds, container_plain_http_must_be_loopback)
{
	static struct srv s;
	char url[128], err[512];
	struct aws_creds *c;
	double t0;
	int r;

	/* 0.0.0.0 and [::] reach this machine but are not loopback names: the
	 * fake would see the request if the check were missing. Names that
	 * never resolve (RFC 2606) stand for remote hosts, one of them shaped
	 * like a loopback address. No address off this machine is named. */
	srv_start(&s);
	const char *hosts[] = { "0.0.0.0", "[::]", "ferry-test.invalid", "127.ferry-test.invalid" };
	for (size_t i = 0; i < sizeof(hosts) / sizeof(hosts[0]); i++) {
		snprintf(url, sizeof(url), "http://%s:%d/creds", hosts[i], s.port);
		setenv("AWS_CONTAINER_CREDENTIALS_FULL_URI", url, 1);
		t0 = mono();
		r = chain_open(NULL, &c, err, sizeof(err));
		cr_assert_eq(r, -EINVAL, "%s: %d (%s)", url, r, err);
		cr_assert_neq(err[0], '\0');
		cr_assert_lt(mono() - t0, 5.0, "%s took %.1f s", url, mono() - t0);
	}
	cr_assert_eq(srv_count(&s), 0, "the endpoint was contacted");
	srv_stop(&s);
}

/* ---- IMDSv2 ---- */

Test(aws_creds, imds_v2)
{
	static struct srv s;
	struct aws_creds *c;
	const struct aws_key *k;
	const struct req *r;
	char url[128], v[256];
	int n, saw_list = 0, saw_role = 0;

	srv_start(&s);
	unsetenv("AWS_EC2_METADATA_DISABLED");
	srv_url(&s, "", url, sizeof(url));
	setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", url, 1);
	c = chain_open_ok();
	k = key_of(c);
	assert_key(k, "ASIAIMDS1", "imds" SECRET_MARK "1", "imdstok" SECRET_MARK "1");
	cr_assert_gt(k->expires, time(NULL) + 3000);
	aws_key_put(k);

	/* The session token first, then GETs that carry it. */
	n = srv_count(&s);
	cr_assert_geq(n, 3);
	r = srv_req(&s, 0);
	cr_assert_str_eq(r->method, "PUT");
	cr_assert_str_eq(r->target, "/latest/api/token");
	cr_assert_eq(req_header(r, "X-aws-ec2-metadata-token-ttl-seconds", v, sizeof(v)), 0);
	cr_assert_gt(atoi(v), 0, "ttl %s", v);
	for (int i = 1; i < n; i++) {
		r = srv_req(&s, i);
		cr_assert_str_eq(r->method, "GET", "request %d: %s %s", i, r->method, r->target);
		cr_assert_eq(req_header(r, "X-aws-ec2-metadata-token", v, sizeof(v)), 0);
		cr_assert_str_eq(v, IMDS_TOKEN);
		saw_list |= strcmp(r->target, PFX_IMDS_CREDS "/") == 0 || strcmp(r->target, PFX_IMDS_CREDS) == 0;
		saw_role |= strcmp(r->target, PFX_IMDS_CREDS "/" IMDS_ROLE) == 0;
	}
	cr_assert(saw_list, "the role was not discovered");
	cr_assert(saw_role, "the role's credentials were not asked for");
	cr_assert_neq(info_of(c).source[0], '\0');

	/* A refresh fetches again, with a session token. */
	cr_assert_eq(aws_creds_refresh(c, 1), 0, "%s", info_of(c).last_error);
	k = key_of(c);
	assert_key(k, "ASIAIMDS2", "imds" SECRET_MARK "2", "imdstok" SECRET_MARK "2");
	aws_key_put(k);
	r = srv_last(&s);
	cr_assert_str_eq(r->target, PFX_IMDS_CREDS "/" IMDS_ROLE);
	cr_assert_eq(req_header(r, "X-aws-ec2-metadata-token", v, sizeof(v)), 0);
	creds_close(c);
	srv_stop(&s);
}

/* ---- refreshes ---- */

Test(aws_creds, refresh_by_generation)
{
	static struct srv s;
	struct aws_creds *c;
	const struct aws_key *k1, *k2;
	struct aws_creds_info i;

	srv_start(&s);
	set_container(&s, "/creds");
	c = chain_open_ok();
	k1 = key_of(c);
	cr_assert_eq(k1->generation, 1);
	cr_assert_str_eq(k1->access_key, "ASIACONT1");

	/* S3 refused generation 1: a new key. */
	cr_assert_eq(aws_creds_refresh(c, 1), 0, "%s", info_of(c).last_error);
	cr_assert_eq(srv_count(&s), 2);
	k2 = key_of(c);
	cr_assert_eq(k2->generation, 2);
	cr_assert_str_eq(k2->access_key, "ASIACONT2");
	/* The old key stays whole for whoever still signs with it. */
	cr_assert_str_eq(k1->access_key, "ASIACONT1");
	cr_assert_str_eq(k1->secret_key, "cont" SECRET_MARK "1");
	aws_key_put(k1);

	/* Another request refused with generation 1: 2 is already held. */
	cr_assert_eq(aws_creds_refresh(c, 1), 0);
	cr_assert_eq(srv_count(&s), 2, "fetched again for an old generation");
	aws_key_put(k2);
	k2 = key_of(c);
	cr_assert_eq(k2->generation, 2);
	aws_key_put(k2);
	i = info_of(c);
	cr_assert_eq(i.refreshes, 1);
	cr_assert_eq(i.refresh_failures, 0);
	creds_close(c);
	srv_stop(&s);
}

struct refresher {
	struct aws_creds *c;
	uint64_t gen;
	int ret;
};

static void *
refresh_thread(void *arg)
{
	struct refresher *r = arg;

	r->ret = aws_creds_refresh(r->c, r->gen);
	return NULL;
}

Test(aws_creds, concurrent_refreshes_of_one_generation_fetch_once)
{
	static struct srv s;
	struct aws_creds *c;
	const struct aws_key *k;
	struct refresher r[4];
	pthread_t t[4];

	srv_start(&s);
	set_container(&s, "/creds");
	c = chain_open_ok();
	/* Four requests in flight all refused with generation 1. */
	for (int i = 0; i < 4; i++) {
		r[i] = (struct refresher){ .c = c, .gen = 1 };
		cr_assert_eq(pthread_create(&t[i], NULL, refresh_thread, &r[i]), 0);
	}
	for (int i = 0; i < 4; i++) {
		pthread_join(t[i], NULL);
		cr_assert_eq(r[i].ret, 0);
	}
	cr_assert_eq(srv_count(&s), 2, "%d fetches", srv_count(&s));
	k = key_of(c);
	cr_assert_eq(k->generation, 2);
	aws_key_put(k);
	creds_close(c);
	srv_stop(&s);
}

struct getter {
	struct aws_creds *c;
	atomic_int *stop;
	int calls, expired, failed;
};

static void *
get_thread(void *arg)
{
	struct getter *g = arg;

	while (!atomic_load(g->stop)) {
		const struct aws_key *k;
		time_t before = time(NULL);

		if (aws_creds_get(g->c, &k) != 0) {
			g->failed++;
		} else {
			g->expired += k->expires != 0 && k->expires <= before;
			aws_key_put(k);
		}
		g->calls++;
		usleep(2000);
	}
	return NULL;
}

Test(aws_creds, short_lived_keys_are_refreshed_before_they_expire)
{
	static struct srv s;
	struct aws_creds *c;
	const struct aws_key *k;
	struct aws_creds_info i;
	struct getter g[2];
	pthread_t t[2];
	atomic_int stop = 0;
	int64_t expires;
	uint64_t gen = 1;
	double deadline;

	/* Keys that live 6 s; readers in other threads meanwhile. */
	s.ttl = 6;
	srv_start(&s);
	set_container(&s, "/creds");
	c = chain_open_ok();
	k = key_of(c);
	expires = k->expires;
	aws_key_put(k);
	for (int n = 0; n < 2; n++) {
		g[n] = (struct getter){ .c = c, .stop = &stop };
		cr_assert_eq(pthread_create(&t[n], NULL, get_thread, &g[n]), 0);
	}
	/* Two refreshes, each before the key it replaces expired. */
	deadline = mono() + 60;
	while (gen < 3 && mono() < deadline) {
		k = key_of(c);
		if (k->generation > gen) {
			cr_assert_lt(time(NULL), expires, "generation %llu came after %lld",
				     (unsigned long long)k->generation, (long long)expires);
			gen = k->generation;
			expires = k->expires;
		}
		aws_key_put(k);
		usleep(20 * 1000);
	}
	atomic_store(&stop, 1);
	for (int n = 0; n < 2; n++) {
		pthread_join(t[n], NULL);
		cr_assert_gt(g[n].calls, 0);
		cr_assert_eq(g[n].failed, 0, "%d of %d gets failed", g[n].failed, g[n].calls);
		cr_assert_eq(g[n].expired, 0, "%d of %d gets were expired keys", g[n].expired, g[n].calls);
	}
	cr_assert_geq(gen, 3, "generation %llu after 60 s", (unsigned long long)gen);
	i = info_of(c);
	cr_assert_geq(i.refreshes, 2);
	cr_assert_eq(i.refresh_failures, 0, "%s", i.last_error);
	cr_assert_gt(i.expires, time(NULL));
	creds_close(c);
	srv_stop(&s);
}

/* ---- hostile and broken sources ---- */

Test(aws_creds, endpoint_that_never_answers)
{
	static struct srv s;
	struct aws_creds_opts o = { .timeout_ms = 500 };
	struct aws_creds *c;
	char err[512];
	double t0;
	int r;

	s.hang = 1;
	srv_start(&s);
	set_container(&s, "/creds");
	t0 = mono();
	r = chain_open(&o, &c, err, sizeof(err));
	cr_assert_lt(r, 0);
	cr_assert_lt(mono() - t0, 10.0, "open took %.1f s with a 500 ms timeout", mono() - t0);
	cr_assert_neq(err[0], '\0');
	cr_assert_geq(srv_count(&s), 1);
	/* A source that failed: -EIO (aws_creds.h lists no other errno for it). */
	cr_assert_eq(r, -EIO, "%d (%s)", r, err);
	srv_stop(&s);
}

/* Opens against a container endpoint answering status/body; the errno. */
static int
open_against(int status, const char *body, size_t len, char *err, size_t errlen)
{
	static struct srv s;
	struct aws_creds *c;
	int r;

	s.raw_status = status;
	s.raw_body = body;
	s.raw_len = len;
	srv_start(&s);
	set_container(&s, "/creds");
	r = chain_open(NULL, &c, err, errlen);
	cr_assert_geq(srv_count(&s), 1);
	srv_stop(&s);
	if (r == 0)
		creds_close(c);
	return r;
}

Test(aws_creds, endpoint_garbage_json)
{
	static const char body[] = "{\"AccessKeyId\": \"ASIA\", \"SecretAccessKey\": \"x" SECRET_MARK "\", <<<";
	char err[512];
	int r = open_against(200, body, strlen(body), err, sizeof(err));

	cr_assert(r == -EIO || r == -EINVAL, "%d (%s)", r, err);
	cr_assert_not_null(strstr(err, "JSON"), "%s", err);
}

Test(aws_creds, endpoint_json_without_secret)
{
	static const char body[] = "{\"AccessKeyId\": \"ASIANOSECRET\", \"Token\": \"tok" SECRET_MARK
				   "\", \"Expiration\": \"2099-01-01T00:00:00Z\"}";
	char err[512];
	int r = open_against(200, body, strlen(body), err, sizeof(err));

	cr_assert(r == -EIO || r == -EINVAL, "%d (%s)", r, err);
	cr_assert_not_null(strstr(err, "SecretAccessKey"), "%s", err);
}

Test(aws_creds, endpoint_huge_body)
{
	size_t len = 1 << 20;
	char *body = malloc(len), err[512];
	int r;

	cr_assert_not_null(body);
	memset(body, 'x', len);
	memcpy(body, "{\"AccessKeyId\": \"", 17);
	r = open_against(200, body, len, err, sizeof(err));
	free(body);
	cr_assert(r == -EIO || r == -EINVAL || r == -E2BIG || r == -EMSGSIZE, "%d (%s)", r, err);
	cr_assert_neq(err[0], '\0');
}

Test(aws_creds, endpoint_error_status)
{
	static const char body[] = "{\"message\": \"no role\"}";
	char err[512];
	int r = open_against(500, body, strlen(body), err, sizeof(err));

	cr_assert(r == -EIO || r == -EACCES, "%d (%s)", r, err);
	cr_assert_not_null(strstr(err, "500"), "the error does not give the status: %s", err);
}

Test(aws_creds, endpoint_expiration_in_the_past)
{
	char body[512], exp[32], err[512];
	int r;

	iso_time(time(NULL) - 3600, exp);
	snprintf(body, sizeof(body),
		 "{\"AccessKeyId\": \"ASIAOLD\", \"SecretAccessKey\": \"old" SECRET_MARK "\", "
		 "\"Token\": \"oldtok" SECRET_MARK "\", \"Expiration\": \"%s\"}",
		 exp);
	r = open_against(200, body, strlen(body), err, sizeof(err));
	cr_assert(r == -EIO || r == -EINVAL || r == -EKEYEXPIRED, "%d (%s)", r, err);
	cr_assert_not_null(strcasestr(err, "expir"), "%s", err);
}

Test(aws_creds, nothing_configured)
{
	struct aws_creds *c;
	char err[512];
	double t0 = mono();
	int r = chain_open(NULL, &c, err, sizeof(err));

	cr_assert_eq(r, -ENOENT, "%d (%s)", r, err);
	cr_assert_not_null(strcasestr(err, "credentials"), "%s", err);
	cr_assert_lt(mono() - t0, 5.0);
}

Test(aws_creds, nothing_configured_and_imds_unreachable)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t sl = sizeof(sa);
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), r;
	struct aws_creds *c;
	char url[64], err[512];

	/* Not on EC2: IMDS, tried last, cannot be reached (a port nobody
	 * listens on). That is still "no credentials". */
	cr_assert_eq(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	cr_assert_eq(getsockname(fd, (struct sockaddr *)&sa, &sl), 0);
	snprintf(url, sizeof(url), "http://127.0.0.1:%d", ntohs(sa.sin_port));
	unsetenv("AWS_EC2_METADATA_DISABLED");
	setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", url, 1);
	r = chain_open(NULL, &c, err, sizeof(err));
	cr_assert_eq(r, -ENOENT, "%d (%s)", r, err);
	cr_assert_not_null(strcasestr(err, "credentials"), "%s", err);
	close(fd);
}

Test(aws_creds, expired_key_and_failing_source)
{
	static struct srv s;
	struct aws_creds *c;
	const struct aws_key *k;
	struct aws_creds_info i;
	double deadline;
	int r;

	s.ttl = 5;
	srv_start(&s);
	set_container(&s, "/creds");
	c = chain_open_ok();
	k = key_of(c);
	aws_key_put(k);
	/* The endpoint breaks: the held key is handed out while it is good,
	 * then a get tries once more itself and says the key expired. */
	pthread_mutex_lock(&s.mu);
	s.raw_status = 500;
	s.raw_body = "{\"message\": \"down\"}";
	s.raw_len = strlen(s.raw_body);
	pthread_mutex_unlock(&s.mu);
	deadline = mono() + 30;
	do {
		time_t before = time(NULL);

		k = NULL;
		r = aws_creds_get(c, &k);
		if (r == 0) {
			cr_assert(k->expires > before, "an expired key handed out");
			aws_key_put(k);
			usleep(100 * 1000);
		}
	} while (r == 0 && mono() < deadline);
	cr_assert_eq(r, -EKEYEXPIRED, "%d", r);
	i = info_of(c);
	cr_assert_gt(i.refresh_failures, 0);
	cr_assert_not_null(strstr(i.last_error, "500"), "%s", i.last_error);
	/* It recovers: a get or the refresh thread fetches a key once the
	 * backoff (at most 30 s) allows. */
	pthread_mutex_lock(&s.mu);
	s.raw_status = 0;
	pthread_mutex_unlock(&s.mu);
	deadline = mono() + 60;
	do {
		k = NULL;
		r = aws_creds_get(c, &k);
		if (r != 0)
			usleep(100 * 1000);
	} while (r != 0 && mono() < deadline);
	cr_assert_eq(r, 0, "no key 60 s after the source recovered: %d", r);
	cr_assert_gt(k->generation, 1);
	cr_assert_gt(k->expires, time(NULL) - 1);
	aws_key_put(k);
	creds_close(c);
	srv_stop(&s);
}

/* ---- the parsers ---- */

Test(aws_parse, iso8601_times)
{
	int64_t t = -1;

	cr_assert_eq(aws_parse_time("2026-12-03T13:30:00Z", &t), 0);
	cr_assert_eq(t, 1796304600);
	t = -1;
	cr_assert_eq(aws_parse_time("2026-12-03T13:30:00.123Z", &t), 0);
	cr_assert_eq(t, 1796304600);
	t = -1;
	cr_assert_eq(aws_parse_time("2026-12-03T13:30:00.999999+00:00", &t), 0);
	cr_assert_eq(t, 1796304600);
	t = -1;
	cr_assert_eq(aws_parse_time("2026-12-03T13:30:00+00:00", &t), 0);
	cr_assert_eq(t, 1796304600);
	cr_assert_eq(aws_parse_time("2024-02-29T00:00:00Z", &t), 0);
	cr_assert_eq(t, 1709164800);
	cr_assert_eq(aws_parse_time("1970-01-01T00:00:00Z", &t), 0);
	cr_assert_eq(t, 0);

	static const char *const bad[] = {
		"", "yesterday", "2026-12-03", "2026-12-03T13:30Z", "2026-13-03T13:30:00Z",
		"2026-12-32T13:30:00Z", "2026-12-03T24:30:00Z", "2026-12-03T13:60:00Z",
		"2026-12-03T13:30:00Zjunk", "2026-12-03T13:30:00.Z", "2026-12-03 13:30:00 UTC",
		"20261203T133000", "-026-12-03T13:30:00Z", "2026-12-03T13:30:00+0",
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		t = 42;
		cr_assert_eq(aws_parse_time(bad[i], &t), -EINVAL, "accepted \"%s\"", bad[i]);
	}
}

static void
assert_ini(const char *text, const char *section, const char *key, const char *want)
{
	char *v = (char *)"unset";
	int r = aws_ini_get(text, section, key, &v);

	if (want == NULL) {
		cr_assert_eq(r, -ENOENT, "[%s] %s: %d", section, key, r);
		return;
	}
	cr_assert_eq(r, 0, "[%s] %s: %d", section, key, r);
	cr_assert_str_eq(v, want, "[%s] %s", section, key);
	free(v);
}

Test(aws_parse, ini)
{
	static const char text[] =
		"# a comment\n"
		"; another one\n"
		"[default]\n"
		"aws_access_key_id = AKIADEFAULT\n"
		"  # indented comment = not a key\n"
		"aws_secret_access_key=secret-no-spaces   \n"
		"region =\t us-east-2 \t\n"
		"\n"
		"[profile x]\r\n"
		"region = eu-west-1\r\n"
		"role_arn = arn:aws:iam::1:role/a=b\n"
		"[x]\n"
		"region = us-west-2\n"
		"[  profile   spaced  ]\n"
		"region = ap-south-1\n"
		"[empty]\n"
		"[last]\n"
		"key = at the end with no newline";

	assert_ini(text, "default", "aws_access_key_id", "AKIADEFAULT");
	assert_ini(text, "default", "aws_secret_access_key", "secret-no-spaces");
	assert_ini(text, "default", "region", "us-east-2");
	assert_ini(text, "default", "# indented comment", NULL);
	assert_ini(text, "profile x", "region", "eu-west-1");
	assert_ini(text, "profile x", "role_arn", "arn:aws:iam::1:role/a=b");
	assert_ini(text, "x", "region", "us-west-2");
	assert_ini(text, "x", "role_arn", NULL);
	assert_ini(text, "profile spaced", "region", "ap-south-1");
	assert_ini(text, "last", "key", "at the end with no newline");
	/* Missing sections and keys. */
	assert_ini(text, "nosuch", "region", NULL);
	assert_ini(text, "empty", "region", NULL);
	assert_ini(text, "default", "nosuch", NULL);
	assert_ini(text, "default", "aws_access_key", NULL);
	assert_ini(text, "profile default", "region", NULL);
	assert_ini("", "default", "region", NULL);
	assert_ini("region = orphan\n", "default", "region", NULL);
}

Test(aws_parse, creds_json)
{
	static const char container[] =
		"{\"AccessKeyId\":\"ASIA1\",\"SecretAccessKey\":\"s" SECRET_MARK "\",\"Token\":\"t" SECRET_MARK
		"\",\"Expiration\":\"2026-12-03T13:30:00Z\",\"RoleArn\":\"arn:x\"}";
	static const char imds_fail[] = "{\"Code\":\"AssumeRoleUnauthorizedAccess\",\"AccessKeyId\":\"A\","
					"\"SecretAccessKey\":\"s" SECRET_MARK "\"}";
	static const char process[] = "{\"Version\":1,\"AccessKeyId\":\"AKIA2\",\"SecretAccessKey\":\"p" SECRET_MARK
				      "\"}";
	struct aws_fields f;
	char err[256];

	cr_assert_eq(aws_parse_creds_json(container, strlen(container), &f, err, sizeof(err)), 0, "%s", err);
	cr_assert_str_eq(f.access_key, "ASIA1");
	cr_assert_str_eq(f.secret_key, "s" SECRET_MARK);
	cr_assert_str_eq(f.session_token, "t" SECRET_MARK);
	cr_assert_eq(f.expires, 1796304600);
	aws_fields_clear(&f);
	cr_assert_null(f.access_key);

	cr_assert_eq(aws_parse_creds_json(process, strlen(process), &f, err, sizeof(err)), 0, "%s", err);
	cr_assert_null(f.session_token);
	cr_assert_eq(f.expires, 0);
	aws_fields_clear(&f);

	/* Not the whole buffer: a prefix that is not JSON. */
	err[0] = '\0';
	cr_assert_eq(aws_parse_creds_json(container, 30, &f, err, sizeof(err)), -EINVAL);
	cr_assert_neq(err[0], '\0');
	cr_assert_eq(aws_parse_creds_json(imds_fail, strlen(imds_fail), &f, err, sizeof(err)), -EINVAL);
	cr_assert_not_null(strstr(err, "AssumeRoleUnauthorizedAccess"), "%s", err);
	assert_clean("the error", err);
	cr_assert_null(f.access_key);
}

Test(aws_parse, sts_xml)
{
	static const char ok[] =
		"<AssumeRoleWithWebIdentityResponse xmlns=\"https://sts.amazonaws.com/doc/2011-06-15/\">"
		"<AssumeRoleWithWebIdentityResult><Credentials>"
		"<AccessKeyId>ASIASTS</AccessKeyId><SecretAccessKey>x" SECRET_MARK "</SecretAccessKey>"
		"<SessionToken>t" SECRET_MARK "</SessionToken><Expiration>2026-12-03T13:30:00.000Z</Expiration>"
		"</Credentials></AssumeRoleWithWebIdentityResult></AssumeRoleWithWebIdentityResponse>";
	static const char denied[] = "<ErrorResponse><Error><Type>Sender</Type><Code>AccessDenied</Code>"
				     "<Message>Not authorized</Message></Error></ErrorResponse>";
	struct aws_fields f;
	char err[256];

	cr_assert_eq(aws_parse_sts_xml(ok, strlen(ok), &f, err, sizeof(err)), 0, "%s", err);
	cr_assert_str_eq(f.access_key, "ASIASTS");
	cr_assert_str_eq(f.secret_key, "x" SECRET_MARK);
	cr_assert_str_eq(f.session_token, "t" SECRET_MARK);
	cr_assert_eq(f.expires, 1796304600);
	aws_fields_clear(&f);

	cr_assert_eq(aws_parse_sts_xml(denied, strlen(denied), &f, err, sizeof(err)), -EACCES);
	cr_assert_not_null(strstr(err, "AccessDenied"), "%s", err);
	cr_assert_not_null(strstr(err, "Not authorized"), "%s", err);
	cr_assert_eq(aws_parse_sts_xml("<a><b>", 6, &f, err, sizeof(err)), -EINVAL);
	cr_assert_eq(aws_parse_sts_xml(ok, 60, &f, err, sizeof(err)), -EINVAL);
	cr_assert_null(f.access_key);
}

/* ---- review fixes ---- */

/* A command that printed keys, closed its output and went on is not waited for past the timeout. */
Test(aws_creds, credential_process_that_closes_its_output_and_lingers)
{
	struct aws_creds_opts o = { .timeout_ms = 1000 };
	struct aws_creds *c;
	char err[512];
	double t0;
	int r;

	write_process_profile("linger", "#!/bin/sh\n"
			      "printf '{\"Version\":1,\"AccessKeyId\":\"AKIDLINGER\","
			      "\"SecretAccessKey\":\"s" SECRET_MARK "\"}'\n"
			      "exec >&-\nexec sleep 30\n");
	setenv("AWS_PROFILE", "linger", 1);
	t0 = mono();
	r = chain_open(&o, &c, err, sizeof(err));
	cr_assert_lt(mono() - t0, 10.0, "open took %.1f s with a 1 s timeout", mono() - t0);
	cr_assert_eq(r, -EIO, "%d (%s)", r, err);
	/* Whether the shell between us held the pipe open or not, the deadline ends it. */
	cr_assert(strstr(err, "did not exit within") || strstr(err, "did not finish within"), "%s", err);
}

/* With the source failing, refusals within the backoff start no fetch of their own. */
Test(aws_creds, refreshes_asked_for_within_the_backoff_run_nothing)
{
	char counter[256], buf[32] = "";
	const struct aws_key *k;
	struct aws_creds *c;
	int runs_before, runs_after;
	FILE *f;

	write_counting_process("backoff", 3600);
	setenv("AWS_PROFILE", "backoff", 1);
	c = chain_open_ok();
	k = key_of(c);
	/* From now on the command fails, still counting its runs. */
	tpath(counter, sizeof(counter), "backoff.sh");
	write_file(counter, "#!/bin/sh\nn=$(( $(cat ${0%/*}/process-runs 2>/dev/null || echo 0) + 1 ))\n"
		   "echo $n > ${0%/*}/process-runs\nexit 3\n", 0755);
	tpath(counter, sizeof(counter), "process-runs");
	cr_assert_lt(aws_creds_refresh(c, k->generation), 0);
	f = fopen(counter, "r");
	cr_assert_not_null(f);
	cr_assert_not_null(fgets(buf, sizeof(buf), f));
	fclose(f);
	runs_before = atoi(buf);
	for (int i = 0; i < 8; i++) {
		cr_assert_lt(aws_creds_refresh(c, k->generation), 0);
		aws_creds_stale(c, k->generation);
	}
	f = fopen(counter, "r");
	cr_assert_not_null(f);
	cr_assert_not_null(fgets(buf, sizeof(buf), f));
	fclose(f);
	runs_after = atoi(buf);
	cr_assert_eq(runs_after, runs_before, "8 refusals within the backoff ran the command %d times",
		     runs_after - runs_before);
	/* The key in hand is still handed out. */
	aws_key_put(key_of(c));
	aws_key_put(k);
}

/* STS's stand-in gets plain http on loopback only: nothing is contacted otherwise. */
Test(aws_creds, sts_endpoint_in_clear_text_off_the_node_is_refused)
{
	struct aws_creds *c;
	char err[512], tok[256];
	int r;

	tpath(tok, sizeof(tok), "wit-token");
	write_file(tok, "eyJ" SECRET_MARK "\n", 0600);
	setenv("AWS_ROLE_ARN", "arn:aws:iam::111122223333:role/r", 1);
	setenv("AWS_WEB_IDENTITY_TOKEN_FILE", tok, 1);
	setenv("AWS_ENDPOINT_URL_STS", "http://sts.ferry-test.invalid/", 1);
	r = chain_open(NULL, &c, err, sizeof(err));
	cr_assert_eq(r, -EINVAL, "%d (%s)", r, err);
	cr_assert(strstr(err, "AWS_ENDPOINT_URL_STS") && strstr(err, "loopback"), "%s", err);
}

/* Static keys that would break a header line are refused where they are read. */
Test(aws_creds, static_keys_with_control_bytes_are_refused)
{
	struct aws_creds *c;
	char err[512];

	setenv("AWS_ACCESS_KEY_ID", "AKIDOK", 1);
	setenv("AWS_SECRET_ACCESS_KEY", "s" SECRET_MARK, 1);
	setenv("AWS_SESSION_TOKEN", "tok\r\nX-Evil: 1", 1);
	cr_assert_eq(chain_open(NULL, &c, err, sizeof(err)), -EINVAL, "%s", err);
	cr_assert(strstr(err, "environment"), "%s", err);
	cr_assert_null(strstr(err, "Evil"), "%s", err);
}

/* Closing while a refresh waits on an endpoint that never answers: no waiting out its timeout. */
Test(aws_creds, close_gives_up_a_refresh_in_flight)
{
	static struct srv s;
	struct aws_creds_opts o = { .timeout_ms = 30000 };
	struct aws_creds *c;
	char err[512];
	double t0;
	int n;

	s.ttl = 4; /* refreshed 2 s before it expires */
	srv_start(&s);
	set_container(&s, "/creds");
	cr_assert_eq(chain_open(&o, &c, err, sizeof(err)), 0, "%s", err);
	n = srv_count(&s);
	pthread_mutex_lock(&s.mu);
	s.hang = 1;
	pthread_mutex_unlock(&s.mu);
	/* Until the refresh is under way (its request arrived, unanswered). */
	for (t0 = mono(); srv_count(&s) == n; usleep(20 * 1000))
		cr_assert_lt(mono() - t0, 30.0, "no refresh was tried");
	t0 = mono();
	creds_close(c);
	cr_assert_lt(mono() - t0, 5.0, "close took %.1f s with a fetch in flight (timeout 30 s)",
		     mono() - t0);
	srv_stop(&s);
}
