/*
 * SigV4: the S3 backend's requests carry the signatures AWS publishes for
 * its example requests, and every request it sends verifies the way S3
 * verifies it (a server-side check written here from the specification,
 * run on the bytes that arrived on the wire).
 *
 * The examples (docs.aws.amazon.com/AmazonS3/latest/API/
 * sig-v4-header-based-auth.html, "Example signature calculations") use
 * AKIAIOSFODNN7EXAMPLE / wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY,
 * us-east-1, 20130524T000000Z and virtual-hosted examplebucket.
 */
#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <criterion/criterion.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "objstore.h"
#include "objstore_async.h"
#include "objstore_s3_internal.h"
#include "url.h"
#include "sigv4_util.h"

#define AK "AKIAIOSFODNN7EXAMPLE"
#define SK "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
#define EMPTY_SHA "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"

/* ---- a listener that records one request per connection ---- */

struct capture {
	int lfd, port;
	pthread_t thread;
	int nreq;               /* requests to serve */
	const char *reply;      /* the whole HTTP response */
	const char *const *replies; /* or one per request */
	char req[8][16384];     /* head + body of each request */
	size_t req_len[8];
};

static void *
capture_main(void *arg)
{
	struct capture *c = arg;

	for (int i = 0; i < c->nreq; i++) {
		int fd = accept4(c->lfd, NULL, NULL, SOCK_CLOEXEC);
		char *buf = c->req[i], *end = NULL;
		size_t have = 0;
		long clen = 0;

		if (fd < 0)
			return NULL;
		while (end == NULL && have < sizeof(c->req[0]) - 1) {
			ssize_t n = recv(fd, buf + have, sizeof(c->req[0]) - 1 - have, 0);
			if (n <= 0)
				break;
			have += (size_t)n;
			buf[have] = '\0';
			end = strstr(buf, "\r\n\r\n");
		}
		if (end) {
			for (char *l = buf; l < end; l = strstr(l, "\r\n") + 2) {
				if (strncasecmp(l, "Content-Length:", 15) == 0)
					clen = strtol(l + 15, NULL, 10);
				if (strncasecmp(l, "Expect:", 7) == 0)
					send(fd, "HTTP/1.1 100 Continue\r\n\r\n", 25, MSG_NOSIGNAL);
			}
			while ((long)(have - (size_t)(end + 4 - buf)) < clen && have < sizeof(c->req[0]) - 1) {
				ssize_t n = recv(fd, buf + have, sizeof(c->req[0]) - 1 - have, 0);
				if (n <= 0)
					break;
				have += (size_t)n;
				buf[have] = '\0';
			}
		}
		c->req_len[i] = have;
		{
			const char *rep = c->replies ? c->replies[i] : c->reply;
			send(fd, rep, strlen(rep), MSG_NOSIGNAL);
		}
		close(fd);
	}
	return NULL;
}

static void
capture_start_n(struct capture *c, int nreq, const char *reply, const char *const *replies)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t sl = sizeof(sa);

	memset(c, 0, sizeof(*c));
	c->nreq = nreq;
	c->reply = reply;
	c->replies = replies;
	c->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	cr_assert_geq(c->lfd, 0);
	cr_assert_eq(bind(c->lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	cr_assert_eq(listen(c->lfd, 8), 0);
	cr_assert_eq(getsockname(c->lfd, (struct sockaddr *)&sa, &sl), 0);
	c->port = ntohs(sa.sin_port);
	cr_assert_eq(pthread_create(&c->thread, NULL, capture_main, c), 0);
}

static void
capture_start(struct capture *c, int nreq, const char *reply)
{
	capture_start_n(c, nreq, reply, NULL);
}

static void
capture_wait(struct capture *c)
{
	pthread_join(c->thread, NULL);
	close(c->lfd);
}

/* Value of header name in the request head (first occurrence), or NULL. */
static char *
header(const char *req, const char *name, char *out, size_t outlen)
{
	const char *end = strstr(req, "\r\n\r\n");
	size_t nl = strlen(name);

	for (const char *l = strstr(req, "\r\n") + 2; l && l < end; l = strstr(l, "\r\n") + 2) {
		if (strncasecmp(l, name, nl) == 0 && l[nl] == ':') {
			const char *v = l + nl + 1, *e = strstr(l, "\r\n");
			while (*v == ' ')
				v++;
			snprintf(out, outlen, "%.*s", (int)(e - v), v);
			return out;
		}
	}
	return NULL;
}

static int
starts_with(const char *s, const char *prefix)
{
	return strncmp(s, prefix, strlen(prefix)) == 0;
}

static struct objstore *
open_example_store(int port, const char *bucket)
{
	struct objstore_opts o = { .access_key = AK, .secret_key = SK, .region = "us-east-1",
				   .max_retries = 1, .timeout_ms = 5000 };
	struct store_url u;
	struct objstore *s = NULL;
	char url[128], err[256];

	snprintf(url, sizeof(url), "s3://127.0.0.1:%d/%s", port, bucket);
	cr_assert_eq(store_url_parse(url, 1, &u, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(objstore_open(&u, &o, &s, err, sizeof(err)), 0, "%s", err);
	store_url_free(&u);
	return s;
}

static void
set_example_hooks(struct objstore *s, const char *const *extra)
{
	struct s3_test_hooks h = {
		.host_header = "examplebucket.s3.amazonaws.com",
		.amz_date = "20130524T000000Z",
		.virtual_hosted = 1,
		.extra_headers = extra,
	};

	cr_assert_eq(s3_test_set_hooks(s, &h), 0);
}

static void
assert_auth(const char *req, const char *signed_headers, const char *signature)
{
	char auth[512], want[512];

	cr_assert_not_null(header(req, "Authorization", auth, sizeof(auth)), "no Authorization in\n%s", req);
	snprintf(want, sizeof(want), "SignedHeaders=%s,", signed_headers);
	cr_assert(strstr(auth, want), "want %s in\n%s", want, auth);
	snprintf(want, sizeof(want), "Signature=%s", signature);
	cr_assert(strstr(auth, want), "want %s in\n%s", want, auth);
	cr_assert(strstr(auth, "Credential=" AK "/20130524/us-east-1/s3/aws4_request"), "%s", auth);
	cr_assert(strncmp(auth, "AWS4-HMAC-SHA256 ", 17) == 0, "%s", auth);
}

/* ---- AWS's published examples, sent by the backend ---- */

Test(sigv4, aws_example_get_object_range)
{
	struct capture c;
	struct objstore *s;
	char buf[10], v[128];

	capture_start(&c, 1, "HTTP/1.1 206 Partial Content\r\nContent-Range: bytes 0-9/20\r\n"
		      "Content-Length: 10\r\nConnection: close\r\n\r\n0123456789");
	s = open_example_store(c.port, "examplebucket");
	set_example_hooks(s, NULL);
	cr_assert_eq(objstore_get(s, "test.txt", 0, buf, 10), 10, "%s", objstore_last_error());
	capture_wait(&c);
	cr_assert(starts_with(c.req[0], "GET /test.txt HTTP/1.1\r\n"), "%s", c.req[0]);
	cr_assert_str_eq(header(c.req[0], "Range", v, sizeof(v)), "bytes=0-9");
	cr_assert_str_eq(header(c.req[0], "x-amz-content-sha256", v, sizeof(v)), EMPTY_SHA);
	assert_auth(c.req[0], "host;range;x-amz-content-sha256;x-amz-date",
		    "f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41");
	objstore_close(s);
}

Test(sigv4, aws_example_put_object)
{
	static const char *const extra[] = {
		"Date: Fri, 24 May 2013 00:00:00 GMT", "x-amz-storage-class: REDUCED_REDUNDANCY", NULL,
	};
	struct capture c;
	struct objstore *s;
	char v[128];

	capture_start(&c, 1, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
	s = open_example_store(c.port, "examplebucket");
	set_example_hooks(s, extra);
	cr_assert_eq(objstore_put(s, "test$file.text", "Welcome to Amazon S3.", 21), 0, "%s",
		     objstore_last_error());
	capture_wait(&c);
	cr_assert(starts_with(c.req[0], "PUT /test%24file.text HTTP/1.1\r\n"), "%s", c.req[0]);
	cr_assert_str_eq(header(c.req[0], "x-amz-content-sha256", v, sizeof(v)),
			 "44ce7dd67c959e0d3524ffac1771dfbba87d2b6b4b4e99e42034a8b803f8b072");
	cr_assert(strstr(c.req[0], "\r\n\r\nWelcome to Amazon S3."), "%s", c.req[0]);
	assert_auth(c.req[0], "date;host;x-amz-content-sha256;x-amz-date;x-amz-storage-class",
		    "98ad721746da40c64f1a55b78f14c238d841ea1380cd77a1b5971af0ece108bd");
	objstore_close(s);
}

Test(sigv4, aws_example_list_objects)
{
	struct capture c;
	struct objstore *s;
	struct s3_req r = { .method = "GET", .query = "max-keys=2&prefix=J" };

	capture_start(&c, 1, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
	s = open_example_store(c.port, "examplebucket");
	set_example_hooks(s, NULL);
	cr_assert_eq(s3_request(s, &r), 0, "%s", objstore_last_error());
	free(r.resp);
	capture_wait(&c);
	cr_assert(starts_with(c.req[0], "GET /?max-keys=2&prefix=J HTTP/1.1\r\n"), "%s", c.req[0]);
	assert_auth(c.req[0], "host;x-amz-content-sha256;x-amz-date",
		    "34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7");
	objstore_close(s);
}

Test(sigv4, aws_example_get_lifecycle)
{
	struct capture c;
	struct objstore *s;
	struct s3_req r = { .method = "GET", .query = "lifecycle=" };

	capture_start(&c, 1, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
	s = open_example_store(c.port, "examplebucket");
	set_example_hooks(s, NULL);
	cr_assert_eq(s3_request(s, &r), 0, "%s", objstore_last_error());
	free(r.resp);
	capture_wait(&c);
	assert_auth(c.req[0], "host;x-amz-content-sha256;x-amz-date",
		    "fea454ca298b7da1c68078a5d1bdbfbbe0d65c699e0f91ac7a200a0136783543");
	objstore_close(s);
}

/* ---- a server-side verifier, from the specification ---- */




static void
uri_decode(const char *s, size_t n, char *out)
{
	size_t o = 0;

	for (size_t i = 0; i < n; i++) {
		if (s[i] == '%' && i + 2 < n + 1 && isxdigit((unsigned char)s[i + 1]) &&
		    isxdigit((unsigned char)s[i + 2])) {
			char h[3] = { s[i + 1], s[i + 2], 0 };
			out[o++] = (char)strtol(h, NULL, 16);
			i += 2;
		} else {
			out[o++] = s[i];
		}
	}
	out[o] = '\0';
}



/*
 * Verifies the request the way S3 does: rebuilds the canonical request from
 * what arrived (path and query decoded and re-encoded, parameters sorted,
 * repeated headers joined with ','), checks the payload hash against the
 * body, and recomputes the signature with the secret key.
 */
static char last_canon[32768];

static int
verify_like_s3(const char *req, size_t req_len, const char *secret)
{
	static char canon[32768], sts[1024], tmp[8192], path[4096], query[8192], line[4096];
	char auth[1024], date[64], scope[256], signed_h[512], sig[65], mine[65], payload[128], body_hash[65];
	char *params[64], *qcopy, *save = NULL, *p;
	const char *head_end = strstr(req, "\r\n\r\n"), *sp1, *sp2, *q;
	unsigned char k[32], k2[32];
	int np = 0;
	size_t o;

	cr_assert_not_null(head_end);
	sp1 = strchr(req, ' ');
	sp2 = strchr(sp1 + 1, ' ');
	q = memchr(sp1 + 1, '?', (size_t)(sp2 - sp1 - 1));
	uri_decode(sp1 + 1, (size_t)((q ? q : sp2) - sp1 - 1), tmp);
	uri_encode(tmp, 1, path);
	query[0] = '\0';
	if (q) {
		qcopy = strndup(q + 1, (size_t)(sp2 - q - 1));
		for (p = strtok_r(qcopy, "&", &save); p; p = strtok_r(NULL, "&", &save)) {
			char *eq = strchr(p, '='), name[1024], val[4096], en[3072], ev[8192];
			uri_decode(p, eq ? (size_t)(eq - p) : strlen(p), name);
			uri_decode(eq ? eq + 1 : "", eq ? strlen(eq + 1) : 0, val);
			uri_encode(name, 0, en);
			uri_encode(val, 0, ev);
			cr_assert_lt(np, 64);
			cr_assert_geq(asprintf(&params[np++], "%s=%s", en, ev), 0);
		}
		free(qcopy);
		qsort(params, (size_t)np, sizeof(params[0]), cmp_str);
		o = 0;
		for (int i = 0; i < np; i++) {
			o += (size_t)sprintf(query + o, "%s%s", i ? "&" : "", params[i]);
			free(params[i]);
		}
	}
	cr_assert_not_null(header(req, "Authorization", auth, sizeof(auth)));
	cr_assert_eq(sscanf(auth, "AWS4-HMAC-SHA256 Credential=%*[^/]/%255[^,], SignedHeaders=%511[^,], Signature=%64s",
			    scope, signed_h, sig), 3, "%s", auth);
	cr_assert_not_null(header(req, "x-amz-date", date, sizeof(date)));
	cr_assert_not_null(header(req, "x-amz-content-sha256", payload, sizeof(payload)));
	sha256_hex(head_end + 4, req_len - (size_t)(head_end + 4 - req), body_hash);
	cr_assert_str_eq(payload, body_hash, "x-amz-content-sha256 does not match the body");

	o = (size_t)sprintf(canon, "%.*s\n%s\n%s\n", (int)(sp1 - req), req, path, query);
	{
		char names[512], *n, *s2 = NULL;
		snprintf(names, sizeof(names), "%s", signed_h);
		for (n = strtok_r(names, ";", &s2); n; n = strtok_r(NULL, ";", &s2)) {
			/* All occurrences, joined with ','. */
			size_t vo = 0;
			size_t nl = strlen(n);
			line[0] = '\0';
			for (const char *l = strstr(req, "\r\n") + 2; l < head_end; l = strstr(l, "\r\n") + 2) {
				if (strncasecmp(l, n, nl) == 0 && l[nl] == ':') {
					const char *v = l + nl + 1, *e = strstr(l, "\r\n");
					while (*v == ' ')
						v++;
					while (e > v && e[-1] == ' ')
						e--;
					vo += (size_t)sprintf(line + vo, "%s%.*s", vo ? "," : "", (int)(e - v), v);
				}
			}
			cr_assert_neq(vo, 0, "signed header %s was not sent", n);
			o += (size_t)sprintf(canon + o, "%s:%s\n", n, line);
		}
	}
	sprintf(canon + o, "\n%s\n%s", signed_h, payload);
	sha256_hex(canon, strlen(canon), mine);
	snprintf(sts, sizeof(sts), "AWS4-HMAC-SHA256\n%s\n%s\n%s", date, scope, mine);

	snprintf(tmp, sizeof(tmp), "AWS4%s", secret);
	snprintf(line, sizeof(line), "%.8s", date);
	hmac(tmp, strlen(tmp), line, k);
	{
		char region[64];
		cr_assert_eq(sscanf(scope, "%*8s/%63[^/]/s3/aws4_request", region), 1, "%s", scope);
		hmac(k, 32, region, k2);
	}
	hmac(k2, 32, "s3", k);
	hmac(k, 32, "aws4_request", k2);
	hmac(k2, 32, sts, k);
	hex(k, 32, mine);
	snprintf(last_canon, sizeof(last_canon), "%s", canon);
	return strcmp(mine, sig) == 0;
}

#define assert_verifies(req, len) \
	cr_assert(verify_like_s3((req), (len), SK), "signature does not verify; canonical request:\n%s\n" \
		  "request:\n%s", last_canon, (req))

/* The verifier itself agrees with AWS's example. */
Test(sigv4, verifier_accepts_aws_example)
{
	static const char req[] =
		"GET /test.txt HTTP/1.1\r\n"
		"Host: examplebucket.s3.amazonaws.com\r\n"
		"Authorization: AWS4-HMAC-SHA256 Credential=" AK "/20130524/us-east-1/s3/aws4_request, "
		"SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, "
		"Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41\r\n"
		"Range: bytes=0-9\r\n"
		"x-amz-content-sha256: " EMPTY_SHA "\r\n"
		"x-amz-date: 20130524T000000Z\r\n\r\n";

	assert_verifies(req, strlen(req));
	cr_assert_not(verify_like_s3(req, strlen(req), "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEz"));
}

/* Production requests (path-style, a port, the real clock) verify, keys
 * and list parameters with characters that need encoding included. */
Test(sigv4, backend_requests_verify_like_s3)
{
	struct capture c;
	struct objstore *s;
	struct s3_req r = { .method = "GET", .query = "continuation-token=a%2Fb%2Bc%3D%3D&list-type=2&prefix=x%20y%2Fz" };
	char buf[4];
	uint64_t size;

	capture_start(&c, 5, "HTTP/1.1 200 OK\r\nContent-Length: 4\r\nConnection: close\r\n\r\nabcd");
	s = open_example_store(c.port, "bucket-1");
	cr_assert_eq(objstore_put(s, "dir/a b+c=d&e%f~g\xc3\xa9", "payload!", 8), 0, "%s", objstore_last_error());
	cr_assert_eq(objstore_get(s, "chunks/0/1/1234_0_4", 0, buf, 4), 4, "%s", objstore_last_error());
	cr_assert_eq(objstore_head(s, "chunks/0/1/1234_0_4", &size), 0, "%s", objstore_last_error());
	cr_assert_eq(objstore_delete(s, "chunks/0/1/1234_0_4"), 0, "%s", objstore_last_error());
	cr_assert_eq(s3_request(s, &r), 0, "%s", objstore_last_error());
	free(r.resp);
	capture_wait(&c);
	cr_assert(starts_with(c.req[0], "PUT /bucket-1/dir/a%20b%2Bc%3Dd%26e%25f~g%C3%A9 HTTP/1.1"),
		  "%s", c.req[0]);
	for (int i = 0; i < 5; i++)
		assert_verifies(c.req[i], c.req_len[i]);
	objstore_close(s);
}

static int
count_cb(const char *key, uint64_t size, void *arg)
{
	(*(int *)arg)++;
	return 0;
}

/* A paged listing: the continuation token goes back encoded, in canonical
 * parameter order, and both pages verify. */
Test(sigv4, list_paging_requests_verify_like_s3)
{
	static const char *const bodies[] = {
		"<ListBucketResult><IsTruncated>true</IsTruncated>"
		"<NextContinuationToken>a/b+c==&amp;x</NextContinuationToken>"
		"<Contents><Key>p q/1</Key><Size>1</Size></Contents>"
		"<Contents><Key>p q/2</Key><Size>2</Size></Contents></ListBucketResult>",
		"<ListBucketResult><IsTruncated>false</IsTruncated>"
		"<Contents><Key>p q/3</Key><Size>3</Size></Contents></ListBucketResult>",
	};
	char *replies[2];
	struct capture c;
	struct objstore *s;
	int n = 0;

	for (int i = 0; i < 2; i++)
		cr_assert_geq(asprintf(&replies[i], "HTTP/1.1 200 OK\r\nContent-Length: %zu\r\n"
				       "Connection: close\r\n\r\n%s", strlen(bodies[i]), bodies[i]), 0);
	capture_start_n(&c, 2, NULL, (const char *const *)replies);
	s = open_example_store(c.port, "bucket-1");
	cr_assert_eq(objstore_list(s, "p q/", count_cb, &n), 0, "%s", objstore_last_error());
	capture_wait(&c);
	cr_assert_eq(n, 3);
	cr_assert(starts_with(c.req[0], "GET /bucket-1?list-type=2&prefix=p%20q%2F HTTP/1.1"), "%s", c.req[0]);
	cr_assert(starts_with(c.req[1], "GET /bucket-1?continuation-token=a%2Fb%2Bc%3D%3D%26x&list-type=2&prefix=p%20q%2F "
			  "HTTP/1.1"), "%s", c.req[1]);
	assert_verifies(c.req[0], c.req_len[0]);
	assert_verifies(c.req[1], c.req_len[1]);
	objstore_close(s);
	free(replies[0]);
	free(replies[1]);
}

Test(sigv4, uri_encoding)
{
	char *e = s3_uri_encode("a/b c+d=é~._-", 1);

	cr_assert_str_eq(e, "a/b%20c%2Bd%3D%C3%A9~._-");
	free(e);
	e = s3_uri_encode("a/b", 0);
	cr_assert_str_eq(e, "a%2Fb");
	free(e);
}

/* ---- a clock off the server's ---- */

static int
count_headers(const char *req, const char *name)
{
	const char *end = strstr(req, "\r\n\r\n");
	size_t nl = strlen(name);
	int n = 0;

	for (const char *l = strstr(req, "\r\n") + 2; l && l < end; l = strstr(l, "\r\n") + 2)
		n += strncasecmp(l, name, nl) == 0 && l[nl] == ':';
	return n;
}

/* Seconds between a request's x-amz-date and t. */
static long
date_off(const char *req, time_t t)
{
	char d[64];
	struct tm tm = { 0 };

	cr_assert_not_null(header(req, "x-amz-date", d, sizeof(d)));
	cr_assert_not_null(strptime(d, "%Y%m%dT%H%M%SZ", &tm), "%s", d);
	return (long)(timegm(&tm) - t);
}

/* A reply refusing the request's date, from a server two hours ahead. */
static char *
too_skewed_reply(void)
{
	static const char body[] = "<Error><Code>RequestTimeTooSkewed</Code></Error>";
	time_t t = time(NULL) + 7200;
	char date[64], *rep;
	struct tm tm;

	gmtime_r(&t, &tm);
	strftime(date, sizeof(date), "%a, %d %b %Y %H:%M:%S GMT", &tm);
	cr_assert_geq(asprintf(&rep, "HTTP/1.1 403 Forbidden\r\nDate: %s\r\nContent-Length: %zu\r\n"
			       "Connection: close\r\n\r\n%s", date, strlen(body), body), 0);
	return rep;
}

/*
 * The server refuses our date (RequestTimeTooSkewed) and says its own: the
 * request goes again at once dated by the server's clock, and so do the
 * next ones; each is signed once, with one x-amz-date, and verifies.
 */
Test(sigv4, a_refused_date_is_corrected_from_the_servers_clock)
{
	static const char ok[] = "HTTP/1.1 200 OK\r\nContent-Length: 4\r\nConnection: close\r\n\r\nabcd";
	char *skewed = too_skewed_reply();
	const char *replies[] = { skewed, ok, ok, ok };
	struct objstore_aput *ap = NULL;
	struct capture c;
	struct objstore *s;
	char buf[4];
	int transient = 0;
	time_t t0 = time(NULL);

	capture_start_n(&c, 4, NULL, replies);
	s = open_example_store(c.port, "bucket-1");
	cr_assert_eq(objstore_put(s, "dir/a", "payload!", 8), 0, "%s", objstore_last_error());
	cr_assert_eq(objstore_get(s, "chunks/0/1/1234_0_4", 0, buf, 4), 4, "%s",
		     objstore_last_error());
	/* The reconciler's puts (run on its own multi handle) too. */
	cr_assert_eq(objstore_aput_new(s, "dir/b", "other!", 6, &ap), 0, "%s", objstore_last_error());
	cr_assert_eq(objstore_aput_result(ap, curl_easy_perform(objstore_aput_easy(ap)), &transient),
		     0, "%s", objstore_last_error());
	objstore_aput_free(ap);
	capture_wait(&c);
	cr_assert_lt(labs(date_off(c.req[0], t0)), 60, "the first request is dated by our clock");
	for (int i = 1; i < 4; i++) {
		cr_assert_eq(count_headers(c.req[i], "x-amz-date"), 1, "%s", c.req[i]);
		cr_assert_eq(count_headers(c.req[i], "authorization"), 1, "%s", c.req[i]);
		cr_assert_lt(labs(date_off(c.req[i], t0 + 7200)), 60,
			     "request %d is not dated by the server's clock:\n%s", i, c.req[i]);
		assert_verifies(c.req[i], c.req_len[i]);
	}
	cr_assert(starts_with(c.req[1], "PUT /bucket-1/dir/a HTTP/1.1"), "%s", c.req[1]);
	cr_assert(starts_with(c.req[2], "GET /bucket-1/chunks/0/1/1234_0_4 HTTP/1.1"), "%s", c.req[2]);
	cr_assert(starts_with(c.req[3], "PUT /bucket-1/dir/b HTTP/1.1"), "%s", c.req[3]);
	objstore_close(s);
	free(skewed);
}

/* The reconciler's own puts learn it too: a refused one is transient, and
 * the next one is dated right. */
Test(sigv4, an_async_put_refused_for_its_date_is_retried_dated_right)
{
	static const char ok[] = "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
	char *skewed = too_skewed_reply();
	const char *replies[] = { skewed, ok };
	struct objstore_aput *ap = NULL;
	struct capture c;
	struct objstore *s;
	int transient = 0;

	capture_start_n(&c, 2, NULL, replies);
	s = open_example_store(c.port, "bucket-1");
	cr_assert_eq(objstore_aput_new(s, "dir/b", "other!", 6, &ap), 0, "%s", objstore_last_error());
	cr_assert_eq(objstore_aput_result(ap, curl_easy_perform(objstore_aput_easy(ap)), &transient),
		     -EACCES);
	cr_assert_eq(transient, 1);
	objstore_aput_free(ap);
	cr_assert_eq(objstore_aput_new(s, "dir/b", "other!", 6, &ap), 0, "%s", objstore_last_error());
	cr_assert_eq(objstore_aput_result(ap, curl_easy_perform(objstore_aput_easy(ap)), &transient),
		     0, "%s", objstore_last_error());
	objstore_aput_free(ap);
	capture_wait(&c);
	cr_assert_eq(count_headers(c.req[1], "x-amz-date"), 1, "%s", c.req[1]);
	cr_assert_lt(labs(date_off(c.req[1], time(NULL) + 7200)), 60, "%s", c.req[1]);
	assert_verifies(c.req[1], c.req_len[1]);
	objstore_close(s);
	free(skewed);
}

/* ---- issue 13: what the storage URL asks for, session tokens, refused keys, regions ---- */

static struct objstore *
open_url_store(const char *url, const struct objstore_opts *o)
{
	struct store_url u;
	struct objstore *s = NULL;
	char err[512];

	cr_assert_eq(store_url_parse(url, 1, &u, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(objstore_open(&u, o, &s, err, sizeof(err)), 0, "%s", err);
	store_url_free(&u);
	return s;
}

static int
signed_header(const char *req, const char *name)
{
	char auth[1024], *sh, *end;

	if (!header(req, "Authorization", auth, sizeof(auth)) || !(sh = strstr(auth, "SignedHeaders=")))
		return 0;
	sh += 14;
	end = strchr(sh, ',');
	if (end)
		*end = '\0';
	for (char *t = strtok(sh, ";"); t; t = strtok(NULL, ";"))
		if (strcasecmp(t, name) == 0)
			return 1;
	return 0;
}

Test(sigv4, url_options_are_sent_and_signed)
{
	struct objstore_opts o = { .access_key = AK, .secret_key = SK, .region = "us-east-1" };
	struct capture c;
	struct objstore *s;
	char url[300], v[256], buf[4];

	capture_start(&c, 2, "HTTP/1.1 200 OK\r\nContent-Length: 4\r\nConnection: close\r\n\r\nabcd");
	snprintf(url, sizeof(url), "s3://127.0.0.1:%d/bucket-1/p?sse=aws:kms&sse_kms_key_id=key-1&"
		 "storage_class=STANDARD_IA&expected_owner=111122223333&max_retries=0", c.port);
	s = open_url_store(url, &o);
	cr_assert_eq(objstore_put(s, "k", "payload!", 8), 0, "%s", objstore_last_error());
	cr_assert_eq(objstore_get(s, "k", 0, buf, 4), 4, "%s", objstore_last_error());
	capture_wait(&c);
	cr_assert_str_eq(header(c.req[0], "x-amz-server-side-encryption", v, sizeof(v)), "aws:kms");
	cr_assert_str_eq(header(c.req[0], "x-amz-server-side-encryption-aws-kms-key-id", v, sizeof(v)),
			 "key-1");
	cr_assert_str_eq(header(c.req[0], "x-amz-storage-class", v, sizeof(v)), "STANDARD_IA");
	for (int i = 0; i < 2; i++) {
		cr_assert_str_eq(header(c.req[i], "x-amz-expected-bucket-owner", v, sizeof(v)),
				 "111122223333");
		cr_assert(signed_header(c.req[i], "x-amz-expected-bucket-owner"), "%s", c.req[i]);
		assert_verifies(c.req[i], c.req_len[i]);
	}
	cr_assert(signed_header(c.req[0], "x-amz-storage-class"), "%s", c.req[0]);
	/* A GET is not a PUT: no encryption or class headers. */
	cr_assert_null(header(c.req[1], "x-amz-server-side-encryption", v, sizeof(v)));
	cr_assert_null(header(c.req[1], "x-amz-storage-class", v, sizeof(v)));
	objstore_close(s);
}

Test(sigv4, a_session_token_is_sent_and_signed)
{
	struct objstore_opts o = { .region = "us-east-1", .max_retries = 1 };
	struct capture c;
	struct objstore *s;
	char url[128], v[256];

	setenv("AWS_ACCESS_KEY_ID", AK, 1);
	setenv("AWS_SECRET_ACCESS_KEY", SK, 1);
	setenv("AWS_SESSION_TOKEN", "FwoGZXIvYXdzEXAMPLE//token+/=", 1);
	capture_start(&c, 1, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
	snprintf(url, sizeof(url), "s3://127.0.0.1:%d/bucket-1", c.port);
	s = open_url_store(url, &o);
	cr_assert_eq(objstore_put(s, "k", "x", 1), 0, "%s", objstore_last_error());
	capture_wait(&c);
	cr_assert_str_eq(header(c.req[0], "x-amz-security-token", v, sizeof(v)),
			 "FwoGZXIvYXdzEXAMPLE//token+/=");
	cr_assert(signed_header(c.req[0], "x-amz-security-token"), "%s", c.req[0]);
	assert_verifies(c.req[0], c.req_len[0]);
	objstore_close(s);
}

/*
 * S3 refuses the key as expired: the store fetches a new one (here from a
 * credential_process that hands out a new token each run) and the request
 * goes again, once, with it.
 */
Test(sigv4, an_expired_token_answer_fetches_a_new_key_and_retries_once)
{
	static const char *const replies[] = {
		"HTTP/1.1 400 Bad Request\r\nContent-Length: 90\r\nConnection: close\r\n\r\n"
		"<Error><Code>ExpiredToken</Code><Message>The provided token has expired.</Message></Error>",
		"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
	};
	struct objstore_opts o = { .region = "us-east-1", .max_retries = 0 };
	char dir[] = "/tmp/ferry-sigv4-XXXXXX", path[128], url[128], v1[256], v2[256];
	struct capture c;
	struct objstore *s;
	FILE *f;

	cr_assert_not_null(mkdtemp(dir));
	snprintf(path, sizeof(path), "%s/config", dir);
	f = fopen(path, "w");
	cr_assert_not_null(f);
	/* Each run counts itself in a file and names its token after the count. */
	fprintf(f, "[default]\ncredential_process = sh -c 'n=$(($(cat %s/n 2>/dev/null || echo 0)+1)); "
		"echo $n > %s/n; printf \"{\\\"Version\\\":1,\\\"AccessKeyId\\\":\\\"%s\\\","
		"\\\"SecretAccessKey\\\":\\\"%s\\\",\\\"SessionToken\\\":\\\"tok-$n\\\"}\"'\n",
		dir, dir, AK, SK);
	fclose(f);
	unsetenv("AWS_ACCESS_KEY_ID");
	unsetenv("AWS_SECRET_ACCESS_KEY");
	unsetenv("AWS_SESSION_TOKEN");
	unsetenv("AWS_PROFILE");
	setenv("AWS_CONFIG_FILE", path, 1);
	snprintf(path, sizeof(path), "%s/none", dir);
	setenv("AWS_SHARED_CREDENTIALS_FILE", path, 1);
	capture_start_n(&c, 2, NULL, replies);
	snprintf(url, sizeof(url), "s3://127.0.0.1:%d/bucket-1", c.port);
	s = open_url_store(url, &o);
	cr_assert_eq(objstore_put(s, "k", "x", 1), 0, "%s", objstore_last_error());
	capture_wait(&c);
	cr_assert_str_eq(header(c.req[0], "x-amz-security-token", v1, sizeof(v1)), "tok-1");
	cr_assert_str_eq(header(c.req[1], "x-amz-security-token", v2, sizeof(v2)), "tok-2");
	assert_verifies(c.req[1], c.req_len[1]);
	objstore_close(s);
	snprintf(path, sizeof(path), "rm -rf %s", dir);
	cr_assert_eq(system(path), 0);
}

/* A bucket of another region: not followed, named. */
Test(sigv4, a_bucket_of_another_region_is_named)
{
	struct objstore_opts o = { .access_key = AK, .secret_key = SK, .region = "us-east-1",
				   .max_retries = 1 };
	struct capture c;
	struct objstore *s;
	char url[128], buf[4];

	capture_start(&c, 1, "HTTP/1.1 301 Moved Permanently\r\nx-amz-bucket-region: eu-west-1\r\n"
		      "Content-Length: 65\r\nConnection: close\r\n\r\n"
		      "<Error><Code>PermanentRedirect</Code><Message>x</Message></Error>");
	snprintf(url, sizeof(url), "s3://127.0.0.1:%d/bucket-1", c.port);
	s = open_url_store(url, &o);
	cr_assert_lt(objstore_get(s, "k", 0, buf, 4), 0);
	capture_wait(&c);
	cr_assert(strstr(objstore_last_error(), "region eu-west-1") &&
		  strstr(objstore_last_error(), "PermanentRedirect"), "%s", objstore_last_error());
	objstore_close(s);
}

/* S3 names the bucket's region on other refusals too (HeadBucket's 403): no hint when it is ours. */
Test(sigv4, a_refusal_naming_our_own_region_is_no_region_hint)
{
	struct objstore_opts o = { .access_key = AK, .secret_key = SK, .region = "us-east-1",
				   .max_retries = 1 };
	struct capture c;
	struct objstore *s;
	char url[128], buf[4];

	capture_start(&c, 1, "HTTP/1.1 403 Forbidden\r\nx-amz-bucket-region: us-east-1\r\n"
		      "Content-Length: 60\r\nConnection: close\r\n\r\n"
		      "<Error><Code>AccessDenied</Code><Message>x</Message></Error>");
	snprintf(url, sizeof(url), "s3://127.0.0.1:%d/bucket-1", c.port);
	s = open_url_store(url, &o);
	cr_assert_eq(objstore_get(s, "k", 0, buf, 4), -EACCES);
	capture_wait(&c);
	cr_assert(strstr(objstore_last_error(), "AccessDenied") &&
		  !strstr(objstore_last_error(), "region"), "%s", objstore_last_error());
	objstore_close(s);
}
