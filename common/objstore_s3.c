/*
 * objstore_s3: the s3:// backend, libcurl with its AWS SigV4 signer.
 *
 * Requests are path-style (http(s)://HOST:PORT/BUCKET/PREFIX/KEY) and signed
 * by curl (CURLOPT_AWS_SIGV4 "aws:amz:REGION:s3"). curl 7.88's signer signs
 * the path and the query string exactly as sent and every header given in
 * CURLOPT_HTTPHEADER (even one given empty to suppress it, which is then not
 * sent: never do that here), and it does not add x-amz-content-sha256. So we
 * send the path URI-encoded the way S3 canonicalises it, the query already
 * in canonical order and encoding, the Range as a header (CURLOPT_RANGE is
 * not signed), and x-amz-content-sha256 ourselves; curl takes that header's
 * value as the payload hash. tests/unit/test_sigv4.c checks the result
 * against AWS's published example signatures.
 *
 * One easy handle per call; connections, DNS and TLS sessions are shared
 * between calls through a CURLSH guarded by mutexes.
 *
 * A signature carries the date (curl takes it from time()), and S3 refuses
 * one more than 15 minutes off its own clock (403 RequestTimeTooSkewed):
 * a node whose wall clock stepped an hour would stop reading and writing.
 * As AWS's SDKs do, such an answer's Date header tells how far off we are;
 * the request is signed again at once with our clock corrected by that
 * much, and so is every later one; the next refusal (our clock set right,
 * say) corrects it again. Those requests are signed here (sigv4_sign):
 * curl 7.88 takes a date given in an X-Amz-Date header, but then sends
 * that header twice, and S3 reads the pair as no date at all.
 *
 * Credentials come from aws_creds (the SDKs' chain, refreshed ahead of
 * expiry): each attempt is signed with the provider's current key, so a
 * retry after a refresh carries the new one. A 400/403 ExpiredToken (or
 * TokenRefreshRequired) makes the provider fetch a new key and the request
 * is tried again with it, once.
 */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <curl/curl.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "aws_creds.h"
#include "fd_limit.h"
#include "objstore.h"
#include "objstore_async.h"
#include "objstore_internal.h"
#include "objstore_s3_internal.h"
#include "s3_xml.h"

#define S3_DEFAULT_RETRIES 5
#define S3_DEFAULT_TIMEOUT_MS 30000L
#define S3_BACKOFF_FIRST_MS 100L
#define S3_BACKOFF_MAX_MS 5000L
#define S3_RETRY_AFTER_MAX_MS 20000L /* a server's Retry-After is heeded up to this */
#define S3_CANCEL_POLL_MS 50L
#define S3_ERRBODY_MAX 1024
#define GET_BUFFER (512L << 10) /* libcurl receive buffer for large GETs */
#define GET_BUFFER_MIN (64u << 10) /* ranged GETs shorter than this keep the default */
#define S3_RESP_MAX (64u << 20)   /* listing pages are ~300 KiB */
/* Idle connections the shared cache keeps, at most (and no more than a
 * sixteenth of RLIMIT_NOFILE). libcurl's default for easy handles is 5:
 * with 8 read-ahead GETs at once, each one's end closed the oldest idle
 * connection, and 56 of 64 GETs of a sequential read opened a new one:
 * against S3, a TLS handshake and a TCP slow start each. Read-ahead runs
 * up to 64 streams. */
#define S3_CONNS_KEPT 64
#define S3_CONNS_KEPT_MIN 8
#define EMPTY_SHA256 "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"

struct s3_store {
	char *endpoint;         /* "http(s)://HOST:PORT" */
	char *bucket;
	char *prefix;           /* "" or "a/b" */
	struct aws_creds *creds;
	char *sigv4;            /* "aws:amz:REGION:s3" */
	char *region;
	int max_retries;
	long timeout_ms;
	CURLSH *share;
	long conns_kept;        /* CURLOPT_MAXCONNECTS of every handle on share */
	_Atomic uint64_t requests, connects; /* on share: sent, and connections opened */
	pthread_mutex_t locks[CURL_LOCK_DATA_LAST];
	_Atomic long long clock_skew_s; /* the server's clock minus ours, once it refused a
					   date (RequestTimeTooSkewed); 0 until then */
	struct curl_slist *every_headers; /* x-amz-expected-bucket-owner */
	struct curl_slist *put_headers;   /* server-side encryption, storage class */
	char *ca_bundle;                  /* AWS_CA_BUNDLE; NULL: the system's CA store */
	/* Test hooks. */
	struct curl_slist *test_headers;
	int virtual_hosted;
};

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_init_rc;

static void
curl_init_once(void)
{
	curl_init_rc = curl_global_init(CURL_GLOBAL_DEFAULT);
}

static struct s3_store *
s3_of(struct objstore *s)
{
	return s->priv;
}

static void
share_lock(CURL *h, curl_lock_data data, curl_lock_access access, void *ud)
{
	struct s3_store *st = ud;

	if ((unsigned)data < CURL_LOCK_DATA_LAST)
		pthread_mutex_lock(&st->locks[data]);
}

static void
share_unlock(CURL *h, curl_lock_data data, void *ud)
{
	struct s3_store *st = ud;

	if ((unsigned)data < CURL_LOCK_DATA_LAST)
		pthread_mutex_unlock(&st->locks[data]);
}

char *
s3_uri_encode(const char *s, int keep_slash)
{
	static const char hex[] = "0123456789ABCDEF";
	size_t n = strlen(s);
	char *out = malloc(3 * n + 1), *o = out;

	if (out == NULL)
		return NULL;
	for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
		if (isalnum(*p) || *p == '-' || *p == '_' || *p == '.' || *p == '~' ||
		    (keep_slash && *p == '/')) {
			*o++ = (char)*p;
		} else {
			*o++ = '%';
			*o++ = hex[*p >> 4];
			*o++ = hex[*p & 15];
		}
	}
	*o = '\0';
	return out;
}

static int
sha256_hex(const void *buf, size_t len, char out[65])
{
	unsigned char md[EVP_MAX_MD_SIZE];
	unsigned int mdlen = 0;

	if (EVP_Digest(buf, len, md, &mdlen, EVP_sha256(), NULL) != 1 || mdlen != 32)
		return -EIO;
	for (unsigned i = 0; i < 32; i++)
		snprintf(out + 2 * i, 3, "%02x", md[i]);
	return 0;
}

/* Per-attempt transfer state. */
struct xfer {
	struct s3_req *r;
	size_t sent;            /* PUT: bytes of body handed to curl */
	size_t skip;            /* GET answered 200 to a Range: bytes to drop first */
	size_t seen;            /* body bytes received */
	size_t resp_cap;
	int overflow;
	int sink_err;           /* what the GET's sink said when it stopped it */
	int ranged_full;        /* the 200 answer to a ranged GET */
	char errbody[S3_ERRBODY_MAX + 1];
	size_t errlen;
	long retry_after_ms;    /* the last response's Retry-After, or -1 */
	time_t server_date;     /* the last response's Date, or 0 */
};

static size_t
on_read(char *buf, size_t size, size_t nmemb, void *ud)
{
	struct xfer *x = ud;
	size_t left = x->r->body_len - x->sent, n = size * nmemb;

	if (n > left)
		n = left;
	if (n)
		memcpy(buf, (const char *)x->r->body + x->sent, n);
	x->sent += n;
	return n;
}

static int
on_seek(void *ud, curl_off_t off, int origin)
{
	struct xfer *x = ud;

	if (origin != SEEK_SET || off < 0 || (uint64_t)off > x->r->body_len)
		return CURL_SEEKFUNC_CANTSEEK;
	x->sent = (size_t)off;
	return CURL_SEEKFUNC_OK;
}

static size_t
on_header(char *buf, size_t size, size_t nmemb, void *ud)
{
	struct xfer *x = ud;
	struct s3_req *r = x->r;
	size_t n = size * nmemb;
	char line[256];
	size_t l = n < sizeof(line) - 1 ? n : sizeof(line) - 1;

	memcpy(line, buf, l);
	line[l] = '\0';
	if (strncmp(line, "HTTP/", 5) == 0) {
		/* A new response (after 100 Continue, or a retry). */
		const char *sp = strchr(line, ' ');
		r->status = sp ? strtol(sp + 1, NULL, 10) : 0;
		r->cr_start = r->cr_end = r->cr_total = -1;
		r->content_length = -1;
		x->seen = 0;
		x->errlen = 0;
		r->err_region[0] = '\0';
		x->ranged_full = 0;
		x->retry_after_ms = -1;
		x->server_date = 0;
	} else if (strncasecmp(line, "date:", 5) == 0) {
		/* RFC 9110 IMF-fixdate, always GMT: "Sun, 06 Nov 1994 08:49:37 GMT" */
		struct tm tm = { 0 };
		const char *v = line + 5;
		while (*v == ' ' || *v == '\t')
			v++;
		if (strptime(v, "%a, %d %b %Y %H:%M:%S", &tm))
			x->server_date = timegm(&tm);
	} else if (strncasecmp(line, "retry-after:", 12) == 0) {
		/* Seconds (an HTTP date is not worth parsing: then the backoff
		 * alone). */
		char *end;
		unsigned long v = strtoul(line + 12, &end, 10);
		if (end != line + 12)
			x->retry_after_ms = v > (unsigned long)S3_RETRY_AFTER_MAX_MS / 1000 ?
						    S3_RETRY_AFTER_MAX_MS : (long)v * 1000;
	} else if (strncasecmp(line, "content-range:", 14) == 0) {
		unsigned long long a, b, t;
		char slash[2];
		if (sscanf(line + 14, " bytes %llu-%llu/%llu", &a, &b, &t) == 3) {
			r->cr_start = (int64_t)a;
			r->cr_end = (int64_t)b;
			r->cr_total = (int64_t)t;
		} else if (sscanf(line + 14, " bytes %llu-%llu/%1[*]", &a, &b, slash) == 3) {
			r->cr_start = (int64_t)a;
			r->cr_end = (int64_t)b;
		}
	} else if (strncasecmp(line, "x-amz-bucket-region:", 20) == 0) {
		/* Where the bucket lives, on an answer to a request for the wrong region. */
		const char *v = line + 20;
		size_t n;

		while (*v == ' ' || *v == '\t')
			v++;
		n = strspn(v, "abcdefghijklmnopqrstuvwxyz0123456789-");
		if (n > 0 && n < sizeof(r->err_region)) {
			memcpy(r->err_region, v, n);
			r->err_region[n] = '\0';
		}
	} else if (strncasecmp(line, "content-length:", 15) == 0) {
		char *end;
		unsigned long long v = strtoull(line + 15, &end, 10);
		if (end != line + 15)
			r->content_length = (int64_t)v;
	}
	return n;
}

static size_t
on_body(char *buf, size_t size, size_t nmemb, void *ud)
{
	struct xfer *x = ud;
	struct s3_req *r = x->r;
	size_t n = size * nmemb;

	if (r->status < 200 || r->status >= 300) {
		size_t room = S3_ERRBODY_MAX - x->errlen;
		size_t c = n < room ? n : room;
		memcpy(x->errbody + x->errlen, buf, c);
		x->errlen += c;
		x->errbody[x->errlen] = '\0';
		return n;
	}
	if (r->out || r->sink) {
		const char *p = buf;
		size_t len = n;

		if (r->ranged && r->status == 200) {
			/* The server ignored the Range: take our part of the whole. */
			x->ranged_full = 1;
			if (x->seen < r->off) {
				size_t drop = r->off - x->seen < len ? (size_t)(r->off - x->seen) : len;
				p += drop;
				len -= drop;
			}
			x->seen += n;
			if (len > r->out_cap - r->out_len)
				len = r->out_cap - r->out_len;
		} else {
			x->seen += n;
			if (len > r->out_cap - r->out_len) {
				x->overflow = 1;
				return 0;
			}
		}
		if (r->sink && len > 0) {
			int rc = r->sink(r->sink_arg, r->out_len, p, len);

			if (rc < 0) {
				x->sink_err = rc;
				return 0;
			}
		} else if (len > 0) {
			memcpy((char *)r->out + r->out_len, p, len);
		}
		r->out_len += len;
		return n;
	}
	if (r->resp_len + n > S3_RESP_MAX) {
		x->overflow = 1;
		return 0;
	}
	if (r->resp_len + n + 1 > x->resp_cap) {
		size_t cap = x->resp_cap ? x->resp_cap : 16384;
		char *nr;
		while (cap < r->resp_len + n + 1)
			cap *= 2;
		nr = realloc(r->resp, cap);
		if (nr == NULL) {
			x->overflow = 1;
			return 0;
		}
		r->resp = nr;
		x->resp_cap = cap;
	}
	memcpy(r->resp + r->resp_len, buf, n);
	r->resp_len += n;
	r->resp[r->resp_len] = '\0';
	return n;
}

/* The Code (and Region, unless a header said it) of an error answer's body. */
static void
error_body(const struct xfer *x, struct s3_req *r)
{
	char region[sizeof(r->err_region)];

	s3_xml_error(x->errbody, x->errlen, r->err_code, sizeof(r->err_code), region, sizeof(region));
	if (region[0] && !r->err_region[0])
		memcpy(r->err_region, region, sizeof(region));
}

static const char *
req_what(const struct s3_req *r)
{
	return r->key ? r->key : "(bucket)";
}

static int
build_url(struct s3_store *st, const struct s3_req *r, char **url)
{
	char *full = NULL, *enc = NULL;
	int ret = -ENOMEM;
	const char *q = r->query && r->query[0] ? r->query : NULL;

	*url = NULL;
	if (r->key) {
		if (asprintf(&full, "%s%s%s", st->prefix, st->prefix[0] ? "/" : "", r->key) < 0) {
			full = NULL;
			goto out;
		}
		enc = s3_uri_encode(full, 1);
		if (enc == NULL)
			goto out;
	}
	if (st->virtual_hosted) {
		if (asprintf(url, "%s/%s%s%s", st->endpoint, enc ? enc : "", q ? "?" : "", q ? q : "") < 0)
			*url = NULL;
	} else {
		if (asprintf(url, "%s/%s%s%s%s%s", st->endpoint, st->bucket, enc ? "/" : "", enc ? enc : "",
			     q ? "?" : "", q ? q : "") < 0)
			*url = NULL;
	}
	if (*url)
		ret = 0;
out:
	free(full);
	free(enc);
	return ret;
}

/* Frees a header list that may hold a session token, wiping it first. */
static void
slist_wipe_free(struct curl_slist *l)
{
	for (struct curl_slist *e = l; e; e = e->next)
		explicit_bzero(e->data, strlen(e->data));
	curl_slist_free_all(l);
}

static int
append_header(struct curl_slist **l, const char *h)
{
	struct curl_slist *n = curl_slist_append(*l, h);

	if (n == NULL)
		return -ENOMEM;
	*l = n;
	return 0;
}

/*
 * After a RequestTimeTooSkewed answer with a Date: remembers how far our
 * clock is from the server's. Returns 1 if that answer was one.
 */
static int
clock_skew_learn(struct s3_store *st, const struct s3_req *r, const struct xfer *x)
{
	if (r->status != 403 || strcmp(r->err_code, "RequestTimeTooSkewed") != 0 ||
	    x->server_date <= 0)
		return 0;
	atomic_store(&st->clock_skew_s, (long long)(x->server_date - time(NULL)));
	return 1;
}

static void
hmac_sha256(const void *key, size_t keylen, const char *msg, unsigned char out[32])
{
	unsigned int n = 32;

	HMAC(EVP_sha256(), key, (int)keylen, (const unsigned char *)msg, strlen(msg), out, &n);
}

static int
header_cmp(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

#define SIGV4_HEADERS_MAX 32

/*
 * The Authorization header of AWS Signature V4 for a request to url with
 * the headers hdrs (whose X-Amz-Date, amz_date, is the date signed),
 * into *out (malloc'ed). Signs what curl sends: the host (the Host header
 * if hdrs has one, else the URL's), every header of the list, the path and
 * query exactly as in the URL (already in S3's canonical form), and the
 * payload hash given in x-amz-content-sha256.
 */
static int
sigv4_sign(const struct s3_store *st, const struct aws_key *k, const char *method,
	   const char *url, const struct curl_slist *hdrs, const char *amz_date, char **out)
{
	char *names[SIGV4_HEADERS_MAX], *canon = NULL, *sts = NULL, *signed_h = NULL;
	const char *host, *path, *query, *payload = NULL;
	char hash[65], sig[65], scope[128], key[256];
	unsigned char k1[32], k2[32];
	size_t n = 0, len;
	FILE *f = NULL;
	int ret = -ENOMEM, have_host = 0;

	*out = NULL;
	host = strstr(url, "://");
	host = host ? host + 3 : url;
	path = strchr(host, '/');
	if (path == NULL)
		return -EINVAL;
	query = strchr(path, '?');
	/* "name:value" per header, name lower-cased, value trimmed. */
	for (const struct curl_slist *e = hdrs; e; e = e->next) {
		const char *colon = strchr(e->data, ':'), *v, *end;
		char *h;

		if (colon == NULL || n + 1 >= SIGV4_HEADERS_MAX) {
			ret = -EINVAL;
			goto out;
		}
		for (v = colon + 1; *v == ' ' || *v == '\t'; v++)
			;
		for (end = v + strlen(v); end > v && (end[-1] == ' ' || end[-1] == '\t'); end--)
			;
		if (asprintf(&h, "%.*s:%.*s", (int)(colon - e->data), e->data, (int)(end - v), v) < 0)
			goto out;
		for (char *c = h; *c != ':'; c++)
			*c = (char)tolower((unsigned char)*c);
		if (strncmp(h, "host:", 5) == 0)
			have_host = 1;
		if (strncmp(h, "x-amz-content-sha256:", 21) == 0)
			payload = strchr(h, ':') + 1;
		names[n++] = h;
	}
	if (!have_host &&
	    asprintf(&names[n++], "host:%.*s", (int)(path - host), host) < 0) {
		n--;
		goto out;
	}
	if (payload == NULL) {
		ret = -EINVAL;
		goto out;
	}
	qsort(names, n, sizeof(names[0]), header_cmp);

	f = open_memstream(&signed_h, &len);
	if (f == NULL)
		goto out;
	for (size_t i = 0; i < n; i++)
		fprintf(f, "%s%.*s", i ? ";" : "", (int)(strchr(names[i], ':') - names[i]), names[i]);
	if (fclose(f) != 0) {
		f = NULL;
		goto out;
	}
	f = open_memstream(&canon, &len);
	if (f == NULL)
		goto out;
	fprintf(f, "%s\n%.*s\n%s\n", method, (int)(query ? query - path : (ptrdiff_t)strlen(path)),
		path, query ? query + 1 : "");
	for (size_t i = 0; i < n; i++)
		fprintf(f, "%s\n", names[i]);
	fprintf(f, "\n%s\n%s", signed_h, payload);
	if (fclose(f) != 0) {
		f = NULL;
		goto out;
	}
	f = NULL;
	ret = sha256_hex(canon, strlen(canon), hash);
	if (ret < 0)
		goto out;
	ret = -ENOMEM;
	snprintf(scope, sizeof(scope), "%.8s/%s/s3/aws4_request", amz_date, st->region);
	if (asprintf(&sts, "AWS4-HMAC-SHA256\n%s\n%s\n%s", amz_date, scope, hash) < 0) {
		sts = NULL;
		goto out;
	}
	snprintf(key, sizeof(key), "AWS4%s", k->secret_key);
	snprintf(hash, sizeof(hash), "%.8s", amz_date);
	hmac_sha256(key, strlen(key), hash, k1);
	hmac_sha256(k1, 32, st->region, k2);
	hmac_sha256(k2, 32, "s3", k1);
	hmac_sha256(k1, 32, "aws4_request", k2);
	hmac_sha256(k2, 32, sts, k1);
	for (unsigned i = 0; i < 32; i++)
		snprintf(sig + 2 * i, 3, "%02x", k1[i]);
	if (asprintf(out, "Authorization: AWS4-HMAC-SHA256 Credential=%s/%s, SignedHeaders=%s, "
		     "Signature=%s", k->access_key, scope, signed_h, sig) < 0) {
		*out = NULL;
		goto out;
	}
	ret = 0;
out:
	if (f != NULL)
		fclose(f);
	/* The canonical request holds the session token on this path. */
	for (size_t i = 0; i < n; i++) {
		explicit_bzero(names[i], strlen(names[i]));
		free(names[i]);
	}
	free(signed_h);
	if (canon)
		explicit_bzero(canon, strlen(canon));
	free(canon);
	free(sts);
	explicit_bzero(key, sizeof(key));
	return ret;
}

/*
 * Signs the next attempt of a request on h with key k: by curl with our
 * clock, or, once the server told us how far off that is, here with the
 * corrected one. What an attempt adds to *l (the session token; X-Amz-Date
 * and Authorization) starts at *tail and is cut off again on the next call,
 * so a retry is signed afresh, with whatever key is current then.
 */
static int
sign_attempt(struct s3_store *st, const struct aws_key *k, CURL *h, const char *method,
	     const char *url, struct curl_slist **l, struct curl_slist **tail)
{
	long long skew = atomic_load(&st->clock_skew_s);
	time_t t = time(NULL) + (time_t)skew;
	struct curl_slist *prev, *last;
	char line[64], *auth = NULL, *tok = NULL;
	struct tm tm;
	int ret = 0;

	if (*tail != NULL) {
		for (prev = *l; prev != NULL && prev->next != *tail; prev = prev->next)
			;
		if (prev != NULL)
			prev->next = NULL;
		else
			*l = NULL;
		slist_wipe_free(*tail);
		*tail = NULL;
	}
	for (last = *l; last != NULL && last->next != NULL; last = last->next)
		;
	if (k->session_token) {
		if (asprintf(&tok, "x-amz-security-token: %s", k->session_token) < 0)
			return -ENOMEM;
		ret = append_header(l, tok);
		explicit_bzero(tok, strlen(tok));
		free(tok);
	}
	if (ret == 0 && skew != 0) {
		gmtime_r(&t, &tm);
		strftime(line, sizeof(line), "X-Amz-Date: %Y%m%dT%H%M%SZ", &tm);
		ret = append_header(l, line);
		if (ret == 0)
			ret = sigv4_sign(st, k, method, url, *l, line + 12, &auth);
		if (ret == 0)
			ret = append_header(l, auth);
		free(auth);
	}
	/* Whatever was appended goes with this attempt only, even on failure. */
	*tail = last ? last->next : *l;
	if (ret < 0)
		return ret;
	if (skew == 0) {
		curl_easy_setopt(h, CURLOPT_AWS_SIGV4, st->sigv4);
		curl_easy_setopt(h, CURLOPT_USERNAME, k->access_key);
		curl_easy_setopt(h, CURLOPT_PASSWORD, k->secret_key);
	} else {
		/* No credentials for curl: it would add an Authorization of its own. */
		curl_easy_setopt(h, CURLOPT_AWS_SIGV4, NULL);
		curl_easy_setopt(h, CURLOPT_USERNAME, NULL);
		curl_easy_setopt(h, CURLOPT_PASSWORD, NULL);
	}
	curl_easy_setopt(h, CURLOPT_HTTPHEADER, *l);
	return 0;
}

/*
 * Did the server refuse the key as expired (the provider should fetch
 * another)? An answer to HEAD has no body to say why: a refusal of a
 * session key within its last 5 minutes is taken as one.
 */
static int
key_refused(const struct s3_req *r, const struct aws_key *k)
{
	if (r->status != 400 && r->status != 403)
		return 0;
	/* Only for a key near its end: a HEAD refused for want of permission
	 * (or a bucket owner mismatch) must not cost an STS call each. */
	if (strcmp(r->method, "HEAD") == 0 && r->err_code[0] == '\0')
		return k && k->session_token && k->expires != 0 &&
		       k->expires - (int64_t)time(NULL) < 300;
	return strcmp(r->err_code, "ExpiredToken") == 0 ||
	       strcmp(r->err_code, "TokenRefreshRequired") == 0;
}

/* The negative errno for a curl failure, and whether to retry it. */
static int
map_curl_error(CURL *h, CURLcode rc, int *transient)
{
	long oserr = 0;

	*transient = 0;
	switch (rc) {
	case CURLE_COULDNT_RESOLVE_HOST:
	case CURLE_COULDNT_RESOLVE_PROXY:
		return -EHOSTUNREACH;
	case CURLE_COULDNT_CONNECT:
		curl_easy_getinfo(h, CURLINFO_OS_ERRNO, &oserr);
		if (oserr == ETIMEDOUT) {
			*transient = 1;
			return -ETIMEDOUT;
		}
		if (oserr == EHOSTUNREACH || oserr == ENETUNREACH || oserr == EADDRNOTAVAIL)
			return -EHOSTUNREACH;
		return -ECONNREFUSED;
	case CURLE_OPERATION_TIMEDOUT:
		*transient = 1;
		return -ETIMEDOUT;
	case CURLE_ABORTED_BY_CALLBACK:
		return -EINTR; /* objstore_set_cancel: given up, not failed */
	case CURLE_SEND_ERROR:
	case CURLE_RECV_ERROR:
	case CURLE_GOT_NOTHING:
	case CURLE_PARTIAL_FILE:
	case CURLE_HTTP2:
	case CURLE_HTTP2_STREAM:
	case CURLE_SSL_CONNECT_ERROR:
		*transient = 1;
		return -EIO;
	default:
		return -EIO;
	}
}

/* Waits before try attempt + 1: exponential, or what the server asked
 * (Retry-After, capped), whichever is longer. false: given up
 * (objstore_cancelled) meanwhile. */
static bool
backoff(int attempt, long retry_after_ms)
{
	long ms = S3_BACKOFF_FIRST_MS;
	struct timespec ts;

	for (int i = 1; i < attempt && ms < S3_BACKOFF_MAX_MS; i++)
		ms *= 2;
	if (ms > S3_BACKOFF_MAX_MS)
		ms = S3_BACKOFF_MAX_MS;
	if (retry_after_ms > ms)
		ms = retry_after_ms;
	while (ms > 0) {
		long step = ms < S3_CANCEL_POLL_MS ? ms : S3_CANCEL_POLL_MS;

		if (objstore_cancelled())
			return false;
		ts.tv_sec = 0;
		ts.tv_nsec = step * 1000000L;
		while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
			;
		ms -= step;
	}
	return true;
}

/* curl's progress callback, asked at least once a second during a
 * transfer: non-zero aborts it (CURLE_ABORTED_BY_CALLBACK). */
static int
on_progress(void *ud, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal, curl_off_t ulnow)
{
	(void)ud;
	(void)dltotal;
	(void)dlnow;
	(void)ultotal;
	(void)ulnow;
	return objstore_cancelled() ? 1 : 0;
}

/*
 * Builds the easy handle for r: URL, signed headers, callbacks writing into
 * x. share: use the store's shared connections (blocking calls; handles on
 * a caller's multi keep the multi's own). On failure everything made here
 * is freed and the reason recorded.
 */
static int
s3_prepare(struct s3_store *st, struct s3_req *r, struct xfer *x, int share, CURL **hp,
	   struct curl_slist **hdrsp, char **urlp)
{
	struct curl_slist *hdrs = NULL;
	CURL *h = NULL;
	char *url = NULL, line[256], hash[65];
	int ret;

	*hp = NULL;
	*hdrsp = NULL;
	*urlp = NULL;
	x->r = r;
	ret = build_url(st, r, &url);
	if (ret < 0) {
		objstore_seterr(ret, "%s %s: out of memory", r->method, req_what(r));
		goto out;
	}
	if (r->body && r->body_len) {
		ret = sha256_hex(r->body, r->body_len, hash);
		if (ret < 0) {
			objstore_seterr(ret, "%s %s: SHA-256 failed", r->method, req_what(r));
			goto out;
		}
	} else {
		memcpy(hash, EMPTY_SHA256, sizeof(hash));
	}
	snprintf(line, sizeof(line), "x-amz-content-sha256: %s", hash);
	ret = append_header(&hdrs, line);
	if (ret == 0 && r->ranged) {
		snprintf(line, sizeof(line), "Range: bytes=%" PRIu64 "-%" PRIu64, r->off,
			 r->off + (uint64_t)r->len - 1);
		ret = append_header(&hdrs, line);
	}
	for (struct curl_slist *e = st->every_headers; ret == 0 && e; e = e->next)
		ret = append_header(&hdrs, e->data);
	for (struct curl_slist *e = st->put_headers; ret == 0 && e && !strcmp(r->method, "PUT");
	     e = e->next)
		ret = append_header(&hdrs, e->data);
	for (struct curl_slist *e = st->test_headers; ret == 0 && e; e = e->next)
		ret = append_header(&hdrs, e->data);
	if (ret < 0) {
		objstore_seterr(ret, "%s %s: out of memory", r->method, req_what(r));
		goto out;
	}

	h = curl_easy_init();
	if (h == NULL) {
		ret = objstore_seterr(-ENOMEM, "%s %s: cannot create a curl handle", r->method, req_what(r));
		goto out;
	}
	curl_easy_setopt(h, CURLOPT_URL, url);
	curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
	curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
	/* Not CURLOPT_PATH_AS_IS: libcurl 8.14 (Debian 13) refuses it with
	 * SigV4 ("Cannot use sigv4 authentication with path-as-is flag"), and
	 * nothing needs it: no key has a "." or ".." component for curl to
	 * resolve (the prefix parser refuses them; object and checkpoint
	 * names never begin with a dot). */
	if (st->ca_bundle)
		curl_easy_setopt(h, CURLOPT_CAINFO, st->ca_bundle);
	if (share) {
		curl_easy_setopt(h, CURLOPT_SHARE, st->share);
		curl_easy_setopt(h, CURLOPT_MAXCONNECTS, st->conns_kept);
	}
	curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);
	curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, st->timeout_ms);
	curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, st->timeout_ms < 10000 ? st->timeout_ms : 10000L);
	curl_easy_setopt(h, CURLOPT_TCP_KEEPALIVE, 1L);
	curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
	curl_easy_setopt(h, CURLOPT_HEADERDATA, x);
	curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
	curl_easy_setopt(h, CURLOPT_WRITEDATA, x);
	if (strcmp(r->method, "PUT") == 0) {
		curl_easy_setopt(h, CURLOPT_UPLOAD, 1L);
		curl_easy_setopt(h, CURLOPT_READFUNCTION, on_read);
		curl_easy_setopt(h, CURLOPT_READDATA, x);
		curl_easy_setopt(h, CURLOPT_SEEKFUNCTION, on_seek);
		curl_easy_setopt(h, CURLOPT_SEEKDATA, x);
		curl_easy_setopt(h, CURLOPT_INFILESIZE_LARGE, (curl_off_t)r->body_len);
	} else if (strcmp(r->method, "HEAD") == 0) {
		curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
	} else if (strcmp(r->method, "GET") == 0 && (!r->ranged || r->len > GET_BUFFER_MIN)) {
		/* libcurl's 16 KiB receive buffer costs a poll, a recv and a
		 * callback per 16 KiB: for objects of megabytes that was more
		 * time than the transfer itself. */
		curl_easy_setopt(h, CURLOPT_BUFFERSIZE, GET_BUFFER);
	} else if (strcmp(r->method, "GET") != 0) {
		curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, r->method);
	}
	*hp = h;
	*hdrsp = hdrs;
	*urlp = url;
	return 0;
out:
	curl_easy_cleanup(h);
	curl_slist_free_all(hdrs);
	free(url);
	return ret;
}

int
s3_request(struct objstore *s, struct s3_req *r)
{
	struct s3_store *st = s3_of(s);
	struct curl_slist *hdrs = NULL, *signed_tail = NULL;
	const struct aws_key *k = NULL;
	int skew_fixed = 0, key_fixed = 0;
	struct xfer *x = NULL;
	CURL *h = NULL;
	char *url = NULL;
	int ret, tries, transient;

	r->status = 0;
	r->out_len = 0;
	r->resp = NULL;
	r->resp_len = 0;
	r->content_length = r->cr_start = r->cr_end = r->cr_total = -1;
	r->err_code[0] = '\0';
	r->err_region[0] = '\0';

	x = calloc(1, sizeof(*x));
	if (x == NULL) {
		ret = objstore_seterr(-ENOMEM, "%s %s: out of memory", r->method, req_what(r));
		goto out;
	}
	ret = s3_prepare(st, r, x, 1, &h, &hdrs, &url);
	if (ret < 0)
		goto out;
	curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, on_progress);
	curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L);

	for (tries = 1;; tries++) {
		CURLcode rc;

		aws_key_put(k);
		k = NULL;
		ret = aws_creds_get(st->creds, &k);
		if (ret < 0) {
			struct aws_creds_info ci;

			aws_creds_info(st->creds, &ci);
			objstore_seterr(-EACCES, "%s %s: no valid credentials from %s (%s)", r->method,
					req_what(r), ci.source, ci.last_error);
			ret = -EACCES;
			goto out;
		}
		ret = sign_attempt(st, k, h, r->method, url, &hdrs, &signed_tail);
		if (ret < 0) {
			objstore_seterr(ret, "%s %s: cannot sign it", r->method, req_what(r));
			goto out;
		}
		x->sent = x->seen = x->errlen = 0;
		x->overflow = x->ranged_full = x->sink_err = 0;
		x->retry_after_ms = -1;
		x->errbody[0] = '\0';
		r->status = 0;
		r->out_len = r->resp_len = 0;
		r->content_length = r->cr_start = r->cr_end = r->cr_total = -1;
		rc = curl_easy_perform(h);
		{
			long opened = 0;

			if (curl_easy_getinfo(h, CURLINFO_NUM_CONNECTS, &opened) == CURLE_OK &&
			    opened > 0)
				atomic_fetch_add(&st->connects, (uint64_t)opened);
			atomic_fetch_add(&st->requests, 1);
		}
		if (rc == CURLE_PARTIAL_FILE && r->status == 206 && r->cr_total == 0 && x->seen == 0) {
			/* s3rver answers a Range on an empty object with
			 * "Content-Range: bytes 0-0/0" and a Content-Length of
			 * 1 it never sends. The object is empty: no bytes. */
			rc = CURLE_OK;
		}
		if (rc == CURLE_OK) {
			curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &r->status);
			error_body(x, r);
			if (!skew_fixed && clock_skew_learn(st, r, x)) {
				/* Nothing wrong but our date: again, at once, once. */
				skew_fixed = 1;
				tries--;
				continue;
			}
			if (!key_fixed && key_refused(r, k) &&
			    aws_creds_refresh(st->creds, k->generation) == 0) {
				/* A key that expired under us (a clock far off the
				 * source's, or a refresh that kept failing): again with
				 * the new one, once. */
				key_fixed = 1;
				tries--;
				continue;
			}
			if (r->status < 500 && r->status != 429) {
				ret = 0;
				break;
			}
			ret = -EIO;
			transient = 1;
		} else if (x->sink_err) {
			ret = objstore_seterr(x->sink_err, "%s %s: the receiver failed (%s)", r->method,
					      req_what(r), strerror(-x->sink_err));
			goto out;
		} else if (x->overflow) {
			ret = objstore_seterr(-EIO, "%s %s: the server sent more data than asked for",
					      r->method, req_what(r));
			goto out;
		} else {
			ret = map_curl_error(h, rc, &transient);
		}
		if (ret == -EINTR) {
			objstore_seterr(ret, "%s %s: given up (the caller is gone)", r->method,
					req_what(r));
			goto out;
		}
		if (!transient || tries > st->max_retries) {
			if (rc == CURLE_OK)
				objstore_seterr(ret, "%s %s: HTTP %ld%s%s%s after %d tries", r->method, req_what(r),
						r->status, r->err_code[0] ? " (" : "", r->err_code,
						r->err_code[0] ? ")" : "", tries);
			else if (transient)
				objstore_seterr(ret, "%s %s: %s (%s) after %d tries", r->method, req_what(r),
						curl_easy_strerror(rc), st->endpoint, tries);
			else
				objstore_seterr(ret, "%s %s: %s (%s)", r->method, req_what(r),
						curl_easy_strerror(rc), st->endpoint);
			goto out;
		}
		if (!backoff(tries, x->retry_after_ms)) {
			ret = objstore_seterr(-EINTR, "%s %s: given up (the caller is gone) while "
					      "waiting to retry", r->method, req_what(r));
			goto out;
		}
	}
out:
	/* S3 names the bucket's region on other refusals too (HeadBucket's
	 * 403): a hint only when it is not the region we signed for. */
	if (strcmp(r->err_region, st->region) == 0)
		r->err_region[0] = '\0';
	if (ret < 0 || r->out) {
		free(r->resp);
		r->resp = NULL;
		r->resp_len = 0;
	}
	aws_key_put(k);
	curl_easy_cleanup(h);
	slist_wipe_free(hdrs);
	free(url);
	free(x);
	return ret;
}

/* The errno for a final HTTP status that is not a success. */
static int
status_err(const struct s3_req *r)
{
	int e;

	switch (r->status) {
	case 404:
		e = -ENOENT;
		break;
	case 401:
	case 403:
		e = -EACCES;
		break;
	default:
		e = -EIO;
		break;
	}
	if (r->err_region[0] && r->status != 404)
		/* We do not follow a bucket to its region: the volume's URL names
		 * one, and it should name the right one. */
		return objstore_seterr(e, "%s %s: HTTP %ld%s%s%s: the bucket is in region %s; name it "
				       "in the storage URL (?region=%s) or in AWS_REGION", r->method,
				       req_what(r), r->status, r->err_code[0] ? " (" : "", r->err_code,
				       r->err_code[0] ? ")" : "", r->err_region, r->err_region);
	return objstore_seterr(e, "%s %s: HTTP %ld%s%s%s", r->method, req_what(r), r->status,
			       r->err_code[0] ? " (" : "", r->err_code, r->err_code[0] ? ")" : "");
}

static int
s3_put(struct objstore *s, const char *key, const void *buf, size_t len)
{
	struct s3_req r = { .method = "PUT", .key = key, .body = buf, .body_len = len };
	int ret = s3_request(s, &r);

	free(r.resp);   /* a body we have no use for */
	if (ret < 0)
		return ret;
	if (r.status != 200 && r.status != 201 && r.status != 204)
		return status_err(&r);
	return 0;
}

static int
s3_head(struct objstore *s, const char *key, uint64_t *size)
{
	struct s3_req r = { .method = "HEAD", .key = key };
	int ret = s3_request(s, &r);

	free(r.resp);   /* a body we have no use for */
	if (ret < 0)
		return ret;
	if (r.status != 200)
		return status_err(&r);
	if (r.content_length < 0)
		return objstore_seterr(-EIO, "HEAD %s: no Content-Length in the answer", key);
	if (size)
		*size = (uint64_t)r.content_length;
	return 0;
}

/* A GET of [off, off+len) into buf, or into sink when buf is NULL. */
static ssize_t
s3_get_into(struct objstore *s, const char *key, uint64_t off, void *buf, size_t len,
	    objstore_sink sink, void *arg)
{
	struct s3_req r = { .method = "GET", .key = key, .ranged = 1, .off = off, .len = len,
			    .out = buf, .out_cap = len, .sink = buf ? NULL : sink,
			    .sink_arg = arg };
	uint64_t got, want_end = off + len - 1;
	int ret;

	if (len == 0) {
		/* Nothing to read, but a missing object is still an error. */
		ret = s3_head(s, key, NULL);
		return ret < 0 ? ret : 0;
	}
	ret = s3_request(s, &r);
	if (ret < 0)
		return ret;
	if (r.status == 416)
		return 0;       /* off is at or past the end */
	if (r.status == 206 && r.cr_total == 0 && r.out_len == 0)
		return 0;       /* an empty object (s3rver's answer) */
	if (r.status == 206) {
		if (r.cr_start < 0 || (uint64_t)r.cr_start != off || r.cr_end < r.cr_start ||
		    (uint64_t)r.cr_end > want_end)
			return objstore_seterr(-EIO, "GET %s: asked for bytes %" PRIu64 "-%" PRIu64
					       ", got Content-Range %" PRId64 "-%" PRId64,
					       key, off, want_end, r.cr_start, r.cr_end);
		got = (uint64_t)(r.cr_end - r.cr_start + 1);
		if (r.out_len != got)
			return objstore_seterr(-EIO, "GET %s: Content-Range promised %" PRIu64
					       " bytes, got %zu", key, got, r.out_len);
		/* Short only at the end of the object. */
		if ((uint64_t)r.cr_end < want_end && (r.cr_total < 0 || r.cr_end + 1 != r.cr_total))
			return objstore_seterr(-EIO, "GET %s: short range %" PRId64 "-%" PRId64 " of %" PRId64,
					       key, r.cr_start, r.cr_end, r.cr_total);
		return (ssize_t)r.out_len;
	}
	if (r.status == 200) {
		/* Whole object (Range ignored, or an empty object). */
		uint64_t total = r.content_length >= 0 ? (uint64_t)r.content_length : 0;
		uint64_t expect = total > off ? total - off : 0;
		if (r.content_length < 0)
			return objstore_seterr(-EIO, "GET %s: no Content-Length in the answer", key);
		if (expect > len)
			expect = len;
		if (r.out_len != expect)
			return objstore_seterr(-EIO, "GET %s: expected %" PRIu64 " bytes, got %zu",
					       key, expect, r.out_len);
		return (ssize_t)r.out_len;
	}
	return status_err(&r);
}

static ssize_t
s3_get(struct objstore *s, const char *key, uint64_t off, void *buf, size_t len)
{
	return s3_get_into(s, key, off, buf, len, NULL, NULL);
}

static ssize_t
s3_get_to(struct objstore *s, const char *key, uint64_t off, size_t len, objstore_sink sink,
	  void *arg)
{
	return s3_get_into(s, key, off, NULL, len, sink, arg);
}

static int
s3_del(struct objstore *s, const char *key)
{
	struct s3_req r = { .method = "DELETE", .key = key };
	int ret = s3_request(s, &r);

	free(r.resp);   /* a body we have no use for */
	if (ret < 0)
		return ret;
	if (r.status == 200 || r.status == 204 || r.status == 404)
		return 0;
	return status_err(&r);
}

/* Decodes XML character data [a, b) into a new string; NULL if malformed. */
struct list_page {
	int truncated;
	char *next_token;
};

struct list_entry_ctx {
	const char *prefix;     /* the store's */
	size_t plen;
	const char *what;
	int (*cb)(const char *key, uint64_t size, void *arg);
	void *arg;
};

/* One listed key: the store's prefix off, or an error when it lacks it. */
static int
list_entry(const char *key, uint64_t size, void *arg)
{
	struct list_entry_ctx *c = arg;

	if (c->plen) {
		if (strncmp(key, c->prefix, c->plen) != 0 || key[c->plen] != '/')
			return objstore_seterr(-EIO, "LIST %s: key \"%s\" outside the store prefix",
					       c->what, key);
		key += c->plen + 1;
	}
	return c->cb(key, size, c->arg);
}

/* Parses one ListObjectsV2 page and calls cb for each key. */
static int
parse_list_page(struct s3_store *st, const char *what, const char *body, size_t len,
		int (*cb)(const char *key, uint64_t size, void *arg), void *arg,
		struct list_page *pg)
{
	struct list_entry_ctx c = { .prefix = st->prefix, .plen = strlen(st->prefix), .what = what,
				    .cb = cb, .arg = arg };
	char why[256];
	int r;

	r = s3_xml_list(body, len, list_entry, &c, &pg->truncated, &pg->next_token, why, sizeof(why));
	/* An entry's own failure has its reason set already. */
	if (r < 0 && why[0])
		r = objstore_seterr(r, "LIST %s: %s", what, why);
	return r;
}

static int
s3_list(struct objstore *s, const char *prefix,
	int (*cb)(const char *key, uint64_t size, void *arg), void *arg)
{
	struct s3_store *st = s3_of(s);
	struct list_page pg = { 0 };
	char *full = NULL, *enc_prefix = NULL, *enc_token = NULL, *query = NULL, *token = NULL;
	int ret;

	if (asprintf(&full, "%s%s%s", st->prefix, st->prefix[0] ? "/" : "", prefix) < 0) {
		full = NULL;
		ret = objstore_seterr(-ENOMEM, "LIST %s: out of memory", prefix);
		goto out;
	}
	enc_prefix = s3_uri_encode(full, 0);
	if (enc_prefix == NULL) {
		ret = objstore_seterr(-ENOMEM, "LIST %s: out of memory", prefix);
		goto out;
	}
	for (;;) {
		struct s3_req r = { .method = "GET" };

		free(query);
		query = NULL;
		/* Canonical order: parameters sorted by name. */
		if (token) {
			free(enc_token);
			enc_token = s3_uri_encode(token, 0);
			if (enc_token == NULL ||
			    asprintf(&query, "continuation-token=%s&list-type=2&prefix=%s", enc_token, enc_prefix) < 0)
				query = NULL;
		} else if (asprintf(&query, "list-type=2&prefix=%s", enc_prefix) < 0) {
			query = NULL;
		}
		if (query == NULL) {
			ret = objstore_seterr(-ENOMEM, "LIST %s: out of memory", prefix);
			goto out;
		}
		r.query = query;
		ret = s3_request(s, &r);
		if (ret < 0)
			goto out;
		if (r.status != 200) {
			r.key = NULL;
			ret = status_err(&r);
			free(r.resp);
			goto out;
		}
		ret = parse_list_page(st, prefix, r.resp ? r.resp : "", r.resp_len, cb, arg, &pg);
		free(r.resp);
		if (ret != 0 || !pg.truncated)
			goto out;
		if (token && strcmp(token, pg.next_token) == 0) {
			ret = objstore_seterr(-EIO, "LIST %s: the server repeats a continuation token", prefix);
			goto out;
		}
		free(token);
		token = pg.next_token;
		pg.next_token = NULL;
	}
out:
	free(pg.next_token);
	free(token);
	free(query);
	free(enc_token);
	free(enc_prefix);
	free(full);
	return ret;
}

static int
s3_check(struct objstore *s, int create)
{
	struct s3_req r = { .method = "GET", .query = "list-type=2&max-keys=1" };
	int ret = s3_request(s, &r);

	free(r.resp);
	if (ret < 0)
		return ret;
	if (r.status != 200)
		return status_err(&r);
	return 0;
}

static void
s3_close(struct objstore *s)
{
	struct s3_store *st = s3_of(s);

	if (st == NULL)
		return;
	if (st->share)
		curl_share_cleanup(st->share);
	for (int i = 0; i < CURL_LOCK_DATA_LAST; i++)
		pthread_mutex_destroy(&st->locks[i]);
	curl_slist_free_all(st->test_headers);
	curl_slist_free_all(st->every_headers);
	curl_slist_free_all(st->put_headers);
	free(st->ca_bundle);
	free(st->endpoint);
	free(st->bucket);
	free(st->prefix);
	aws_creds_close(st->creds);
	free(st->sigv4);
	free(st->region);
	free(st);
	s->priv = NULL;
}

static const struct objstore_ops s3_ops = {
	.check = s3_check,
	.close = s3_close,
	.put = s3_put,
	.get = s3_get,
	.get_to = s3_get_to,
	.del = s3_del,
	.head = s3_head,
	.list = s3_list,
};

int
s3_test_set_hooks(struct objstore *s, const struct s3_test_hooks *h)
{
	struct s3_store *st = s3_of(s);
	struct curl_slist *l = NULL;
	char line[512];
	int r = 0;

	if (s->kind != STORE_S3)
		return -EINVAL;
	if (h->host_header) {
		snprintf(line, sizeof(line), "Host: %s", h->host_header);
		r = append_header(&l, line);
	}
	if (r == 0 && h->amz_date) {
		snprintf(line, sizeof(line), "X-Amz-Date: %s", h->amz_date);
		r = append_header(&l, line);
	}
	for (const char *const *e = h->extra_headers; r == 0 && e && *e; e++)
		r = append_header(&l, *e);
	if (r < 0) {
		curl_slist_free_all(l);
		return r;
	}
	curl_slist_free_all(st->test_headers);
	st->test_headers = l;
	st->virtual_hosted = h->virtual_hosted;
	return 0;
}

/* The headers the URL's options ask for (url.h): each is signed with the rest. */
static int
store_headers(struct s3_store *st, const struct store_url *url)
{
	char line[2200];
	int r = 0;

	if (url->expected_owner) {
		snprintf(line, sizeof(line), "x-amz-expected-bucket-owner: %s", url->expected_owner);
		r = append_header(&st->every_headers, line);
	}
	if (r == 0 && url->sse) {
		snprintf(line, sizeof(line), "x-amz-server-side-encryption: %s", url->sse);
		r = append_header(&st->put_headers, line);
	}
	if (r == 0 && url->sse_kms_key_id) {
		snprintf(line, sizeof(line), "x-amz-server-side-encryption-aws-kms-key-id: %s",
			 url->sse_kms_key_id);
		r = append_header(&st->put_headers, line);
	}
	if (r == 0 && url->storage_class) {
		snprintf(line, sizeof(line), "x-amz-storage-class: %s", url->storage_class);
		r = append_header(&st->put_headers, line);
	}
	return r;
}

static const char *
pick(const char *opt, const char *env, const char *def)
{
	const char *v = opt ? opt : getenv(env);

	return v && v[0] ? v : def;
}

int
objstore_s3_open(const struct store_url *url, const struct objstore_opts *opts,
		 struct objstore *s, char *err, size_t errlen)
{
	struct s3_store *st = NULL;
	const char *region = opts->region ? opts->region : url->region ? url->region :
			     pick(NULL, "AWS_REGION", pick(NULL, "AWS_DEFAULT_REGION", "us-east-1"));
	struct aws_creds_opts co = { .access_key = opts->access_key, .secret_key = opts->secret_key,
				     .region = region, .report = opts->creds_report,
				     .report_arg = opts->creds_report_arg };
	char why[512];
	int ret = -ENOMEM, nlocks = 0;

	if (!url->host || !url->bucket || !url->prefix || url->port <= 0) {
		ret = -EINVAL;
		if (err && errlen)
			snprintf(err, errlen, "s3 store: incomplete URL");
		goto out;
	}
	for (const char *c = region; *c; c++) {
		if (!isalnum((unsigned char)*c) && *c != '-') {
			ret = -EINVAL;
			if (err && errlen)
				snprintf(err, errlen, "s3 store: invalid region \"%s\"", region);
			goto out;
		}
	}
	pthread_once(&curl_once, curl_init_once);
	if (curl_init_rc != CURLE_OK) {
		ret = -EIO;
		if (err && errlen)
			snprintf(err, errlen, "s3 store: curl_global_init: %s", curl_easy_strerror(curl_init_rc));
		goto out;
	}
	st = calloc(1, sizeof(*st));
	if (st == NULL)
		goto out;
	for (; nlocks < CURL_LOCK_DATA_LAST; nlocks++)
		pthread_mutex_init(&st->locks[nlocks], NULL);
	st->max_retries = opts->max_retries > 0 ? opts->max_retries :
			  url->max_retries >= 0 ? url->max_retries : S3_DEFAULT_RETRIES;
	st->timeout_ms = opts->timeout_ms > 0 ? opts->timeout_ms :
			 url->timeout_ms > 0 ? url->timeout_ms : S3_DEFAULT_TIMEOUT_MS;
	st->virtual_hosted = url->virtual_hosted;
	if (pick(NULL, "AWS_CA_BUNDLE", NULL) && (st->ca_bundle = strdup(getenv("AWS_CA_BUNDLE"))) == NULL)
		goto out;
	if (store_headers(st, url) < 0)
		goto out;
	/* No default port in the URL: curl sends "Host: h" then, and the
	 * signature made here on a clock-skew retry signs what it sends. */
	if ((url->port == (url->https ? 443 : 80) ?
		     asprintf(&st->endpoint, "%s://%s", url->https ? "https" : "http", url->host) :
		     asprintf(&st->endpoint, "%s://%s:%d", url->https ? "https" : "http", url->host,
			      url->port)) < 0) {
		st->endpoint = NULL;
		goto out;
	}
	if (asprintf(&st->sigv4, "aws:amz:%s:s3", region) < 0) {
		st->sigv4 = NULL;
		goto out;
	}
	st->region = strdup(region);
	st->bucket = strdup(url->bucket);
	st->prefix = strdup(url->prefix);
	if (!st->region || !st->bucket || !st->prefix)
		goto out;
	ret = aws_creds_open(&co, &st->creds, why, sizeof(why));
	if (ret < 0) {
		if (err && errlen)
			snprintf(err, errlen, "s3 store: %s", why);
		/* ENOENT would read as a missing bucket or object. */
		if (ret == -ENOENT)
			ret = -ENOKEY;
		goto out_reason;
	}
	ret = -ENOMEM;
	st->share = curl_share_init();
	if (st->share == NULL)
		goto out;
	curl_share_setopt(st->share, CURLSHOPT_LOCKFUNC, share_lock);
	curl_share_setopt(st->share, CURLSHOPT_UNLOCKFUNC, share_unlock);
	curl_share_setopt(st->share, CURLSHOPT_USERDATA, st);
	curl_share_setopt(st->share, CURLSHOPT_SHARE, CURL_LOCK_DATA_DNS);
	curl_share_setopt(st->share, CURLSHOPT_SHARE, CURL_LOCK_DATA_SSL_SESSION);
	curl_share_setopt(st->share, CURLSHOPT_SHARE, CURL_LOCK_DATA_CONNECT);
	st->conns_kept = S3_CONNS_KEPT;
	long fds = fd_limit_soft();
	if (fds >= 0 && fds / 16 < S3_CONNS_KEPT)
		st->conns_kept = fds / 16 > S3_CONNS_KEPT_MIN ? fds / 16 : S3_CONNS_KEPT_MIN;
	s->priv = st;
	s->ops = &s3_ops;
	st = NULL;
	ret = 0;
out:
	if (ret == -ENOMEM && err && errlen)
		snprintf(err, errlen, "out of memory");
out_reason:
	if (st) {
		struct objstore tmp = { .priv = st };
		s3_close(&tmp);
	}
	return ret;
}

/* ---- uploads on the caller's multi handle (objstore_async.h) ---- */

struct objstore_aput {
	struct s3_store *st;
	struct s3_req r;
	struct xfer x;
	CURL *h;
	struct curl_slist *hdrs;
	char *url;
	char *key;
	uint64_t key_gen;       /* the generation of the key it was signed with */
};

int
objstore_creds_info(struct objstore *s, struct aws_creds_info *i)
{
	if (s == NULL || s->kind != STORE_S3)
		return -EOPNOTSUPP;
	aws_creds_info(s3_of(s)->creds, i);
	return 0;
}

int
objstore_conn_info(struct objstore *s, uint64_t *requests, uint64_t *connects)
{
	if (s == NULL || s->kind != STORE_S3)
		return -EOPNOTSUPP;
	*requests = atomic_load(&s3_of(s)->requests);
	*connects = atomic_load(&s3_of(s)->connects);
	return 0;
}

int
objstore_async_capable(struct objstore *s)
{
	return s != NULL && s->kind == STORE_S3;
}

void
objstore_aput_free(struct objstore_aput *p)
{
	if (p == NULL)
		return;
	curl_easy_cleanup(p->h);
	slist_wipe_free(p->hdrs);
	free(p->url);
	free(p->r.resp);
	free(p->key);
	free(p);
}

void
objstore_aput_rearm(struct objstore_aput *p)
{
	struct s3_req *r = &p->r;

	memset(&p->x, 0, sizeof(p->x));
	p->x.r = r;
	free(r->resp);
	r->resp = NULL;
	r->resp_len = 0;
	r->status = 0;
	r->out_len = 0;
	r->content_length = r->cr_start = r->cr_end = r->cr_total = -1;
	r->err_code[0] = '\0';
	r->err_region[0] = '\0';
}

int
objstore_aput_new(struct objstore *s, const char *key, const void *buf, size_t len,
		  struct objstore_aput **out)
{
	const struct aws_key *k = NULL;
	struct objstore_aput *p;
	int ret;

	*out = NULL;
	if (!objstore_async_capable(s))
		return objstore_seterr(-EOPNOTSUPP, "PUT %s: this store has no asynchronous puts",
				       key ? key : "");
	ret = objstore_key_check(key);
	if (ret < 0)
		return ret;
	p = calloc(1, sizeof(*p));
	if (p == NULL || (p->key = strdup(key)) == NULL) {
		free(p);
		return objstore_seterr(-ENOMEM, "PUT %s: out of memory", key);
	}
	p->st = s3_of(s);
	p->r.method = "PUT";
	p->r.key = p->key;
	p->r.body = buf;
	p->r.body_len = len;
	objstore_aput_rearm(p);
	ret = s3_prepare(s3_of(s), &p->r, &p->x, 0, &p->h, &p->hdrs, &p->url);
	if (ret == 0 && (ret = aws_creds_get(p->st->creds, &k)) < 0) {
		struct aws_creds_info ci;

		aws_creds_info(p->st->creds, &ci);
		ret = objstore_seterr(-EACCES, "PUT %s: no valid credentials from %s (%s)", key,
				      ci.source, ci.last_error);
	}
	if (ret == 0) {
		p->key_gen = k->generation;
		ret = sign_attempt(p->st, k, p->h, "PUT", p->url, &p->hdrs,
				   &(struct curl_slist *){ NULL });
		if (ret < 0)
			objstore_seterr(ret, "PUT %s: cannot sign it", key);
	}
	aws_key_put(k);
	if (ret < 0) {
		objstore_aput_free(p);
		return ret;
	}
	curl_easy_setopt(p->h, CURLOPT_PRIVATE, p);
	*out = p;
	return 0;
}

CURL *
objstore_aput_easy(struct objstore_aput *p)
{
	return p->h;
}

int
objstore_aput_result(struct objstore_aput *p, CURLcode rc, int *transient)
{
	struct s3_req *r = &p->r;
	int ret;

	*transient = 0;
	if (rc != CURLE_OK) {
		ret = map_curl_error(p->h, rc, transient);
		/* A store that is down now may be back soon. */
		if (ret == -ECONNREFUSED || ret == -EHOSTUNREACH)
			*transient = 1;
		return objstore_seterr(ret, "PUT %s: %s", p->key, curl_easy_strerror(rc));
	}
	curl_easy_getinfo(p->h, CURLINFO_RESPONSE_CODE, &r->status);
	error_body(&p->x, r);
	if (r->status == 200 || r->status == 201 || r->status == 204)
		return 0;
	if (clock_skew_learn(p->st, r, &p->x)) {
		/* The next attempt is signed with the server's time. */
		*transient = 1;
		return objstore_seterr(-EACCES, "PUT %s: HTTP 403 (RequestTimeTooSkewed): our clock "
				       "is %lld s off the server's; correcting", p->key,
				       -atomic_load(&p->st->clock_skew_s));
	}
	if (key_refused(r, NULL)) {
		/* The next attempt (a new aput) is signed with the key fetched now;
		 * the event loop that runs this is not held up by the fetch. */
		aws_creds_stale(p->st->creds, p->key_gen);
		*transient = 1;
		return objstore_seterr(-EACCES, "PUT %s: HTTP %ld (%s): fetching new credentials",
				       p->key, r->status, r->err_code);
	}
	if (strcmp(r->err_region, p->st->region) == 0)
		r->err_region[0] = '\0';
	if (r->status >= 500 || r->status == 429) {
		*transient = 1;
		return objstore_seterr(-EIO, "PUT %s: HTTP %ld%s%s%s", p->key, r->status,
				       r->err_code[0] ? " (" : "", r->err_code, r->err_code[0] ? ")" : "");
	}
	return status_err(r);
}
