/*
 * url: parsing of storage URLs (file://, s3://) and metadata locations
 * (a volume directory, sqlite:///abs/path or a PostgreSQL URL).
 */
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "url.h"

static int __attribute__((format(printf, 3, 4)))
seterr(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;

	if (err && errlen) {
		va_start(ap, fmt);
		vsnprintf(err, errlen, fmt, ap);
		va_end(ap);
	}
	return -EINVAL;
}

static int
has_ctl(const char *s)
{
	for (; *s; s++)
		if ((unsigned char)*s < 0x20 || *s == 0x7f)
			return 1;
	return 0;
}

/*
 * Lexically normalises the absolute path abs: collapses "//", drops "."
 * components and trailing slashes. ".." is resolved lexically when
 * allow_dotdot, rejected otherwise. Returns a malloc'ed string or NULL with
 * *why set.
 */
static char *
normalize_abs(const char *abs, int allow_dotdot, const char **why)
{
	size_t n = strlen(abs);
	char *out = NULL, *ret = NULL;
	size_t o = 0;
	const char *p = abs;

	*why = "out of memory";
	if (abs[0] != '/') {
		*why = "not an absolute path";
		return NULL;
	}
	out = malloc(n + 2);
	if (out == NULL)
		goto out;
	while (*p) {
		const char *c, *e;
		size_t clen;

		while (*p == '/')
			p++;
		if (*p == '\0')
			break;
		c = p;
		e = strchr(c, '/');
		if (e == NULL)
			e = c + strlen(c);
		clen = (size_t)(e - c);
		p = e;
		if (clen == 1 && c[0] == '.')
			continue;
		if (clen == 2 && c[0] == '.' && c[1] == '.') {
			if (!allow_dotdot) {
				*why = "\"..\" is not allowed in the path";
				goto out;
			}
			while (o > 0 && out[o - 1] != '/')
				o--;
			if (o > 0)
				o--;
			continue;
		}
		out[o++] = '/';
		memcpy(out + o, c, clen);
		o += clen;
	}
	if (o == 0)
		out[o++] = '/';
	out[o] = '\0';
	ret = out;
	out = NULL;
out:
	free(out);
	return ret;
}

static char *
xstrndup(const char *s, size_t n)
{
	char *r = malloc(n + 1);

	if (r) {
		memcpy(r, s, n);
		r[n] = '\0';
	}
	return r;
}

void
store_url_free(struct store_url *u)
{
	if (u == NULL)
		return;
	free(u->path);
	free(u->host);
	free(u->bucket);
	free(u->prefix);
	free(u->region);
	free(u->sse);
	free(u->sse_kms_key_id);
	free(u->storage_class);
	free(u->expected_owner);
	memset(u, 0, sizeof(*u));
}

static int
parse_file(const char *s, struct store_url *out, char *err, size_t errlen)
{
	const char *rest = s + strlen("file://");
	const char *why;

	if (rest[0] != '/')
		return seterr(err, errlen, "storage URL \"%s\": want file:///absolute/dir "
			      "(a host part or relative path is not supported)", s);
	out->path = normalize_abs(rest, 0, &why);
	if (out->path == NULL)
		return why[0] == 'o' ? -ENOMEM : seterr(err, errlen, "storage URL \"%s\": %s", s, why);
	if (strcmp(out->path, "/") == 0)
		return seterr(err, errlen, "storage URL \"%s\": the root directory cannot be a store", s);
	out->kind = STORE_FILE;
	return 0;
}

static int
valid_hostname(const char *h, size_t n)
{
	if (n == 0 || n > 253)
		return 0;
	if (h[0] == '[') {      /* IPv6 literal */
		if (n < 3 || h[n - 1] != ']')
			return 0;
		for (size_t i = 1; i + 1 < n; i++)
			if (!(strchr("0123456789abcdefABCDEF:.", h[i]) && h[i] != '\0'))
				return 0;
		return 1;
	}
	if (h[0] == '-' || h[0] == '.' || h[n - 1] == '-')
		return 0;
	for (size_t i = 0; i < n; i++) {
		char c = h[i];
		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
		      (c >= '0' && c <= '9') || c == '-' || c == '.'))
			return 0;
		if (c == '.' && i + 1 < n && h[i + 1] == '.')
			return 0;
	}
	return 1;
}

/* S3's bucket naming rules: 3-63 of [a-z0-9.-], starting and ending with a
 * letter or digit. */
static int
valid_bucket(const char *b, size_t n)
{
	if (n < 3 || n > 63)
		return 0;
	for (size_t i = 0; i < n; i++) {
		char c = b[i];
		if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '-'))
			return 0;
	}
	return b[0] != '.' && b[0] != '-' && b[n - 1] != '.' && b[n - 1] != '-';
}

static int
hexval(char c)
{
	return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 :
	       c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* The value of a query option, %XX decoded, in a charset and length. NULL on a bad one. */
static char *
opt_value(const char *v, size_t n, const char *charset, size_t max)
{
	char *out = malloc(n + 1), *o = out;

	if (out == NULL)
		return NULL;
	for (size_t i = 0; i < n; i++) {
		char c = v[i];

		if (c == '%') {
			if (i + 2 >= n)
				goto bad;
			if (hexval(v[i + 1]) < 0 || hexval(v[i + 2]) < 0)
				goto bad;
			c = (char)(hexval(v[i + 1]) * 16 + hexval(v[i + 2]));
			i += 2;
		}
		if (c == '\0' || !strchr(charset, c))
			goto bad;
		*o++ = c;
	}
	*o = '\0';
	if (o == out || (size_t)(o - out) > max)
		goto bad;
	return out;
bad:
	free(out);
	return NULL;
}

#define LOWER_DIGITS "abcdefghijklmnopqrstuvwxyz0123456789"
#define UPPER "ABCDEFGHIJKLMNOPQRSTUVWXYZ"

/*
 * The options after '?' into out; *endpoint (malloc'ed) for endpoint=.
 * Every option is one the store acts on: an unknown one is refused, not
 * ignored.
 */
static int
parse_s3_opts(const char *s, const char *q, struct store_url *out, char **endpoint, char *err,
	      size_t errlen)
{
	out->max_retries = -1;
	while (*q) {
		const char *amp = strchr(q, '&'), *eq;
		size_t n = amp ? (size_t)(amp - q) : strlen(q);
		char **dst = NULL, *v = NULL, *name;
		const char *charset = NULL;
		size_t max = 0;

		eq = memchr(q, '=', n);
		if (eq == NULL || eq == q)
			return seterr(err, errlen, "storage URL \"%s\": option \"%.*s\" is not NAME=VALUE", s,
				      (int)n, q);
		name = xstrndup(q, (size_t)(eq - q));
		if (name == NULL)
			return -ENOMEM;
		if (!strcmp(name, "region")) {
			dst = &out->region, charset = LOWER_DIGITS "-", max = 32;
		} else if (!strcmp(name, "endpoint")) {
			dst = endpoint, charset = LOWER_DIGITS UPPER ":/.-[]", max = 300;
		} else if (!strcmp(name, "sse")) {
			dst = &out->sse, charset = LOWER_DIGITS UPPER ":", max = 16;
		} else if (!strcmp(name, "sse_kms_key_id")) {
			dst = &out->sse_kms_key_id, charset = LOWER_DIGITS UPPER ":/_-", max = 2048;
		} else if (!strcmp(name, "storage_class")) {
			dst = &out->storage_class, charset = UPPER "_", max = 32;
		} else if (!strcmp(name, "expected_owner")) {
			dst = &out->expected_owner, charset = "0123456789", max = 12;
		} else if (!strcmp(name, "timeout_ms") || !strcmp(name, "max_retries")) {
			int t = name[0] == 't';
			long lo = t ? 100 : 0, hi = t ? 600000 : 20, x = -1;
			char *end = NULL;

			v = opt_value(eq + 1, (size_t)(q + n - eq - 1), "0123456789", 6);
			if (v) {
				errno = 0;
				x = strtol(v, &end, 10);
			}
			if (!v || *end || errno || x < lo || x > hi || (t ? out->timeout_ms != 0 : out->max_retries >= 0)) {
				seterr(err, errlen, "storage URL \"%s\": %s must be given once, %ld to %ld", s,
				       name, lo, hi);
				free(v);
				free(name);
				return -EINVAL;
			}
			free(v);
			if (t)
				out->timeout_ms = x;
			else
				out->max_retries = (int)x;
			free(name);
			q = amp ? amp + 1 : q + n;
			continue;
		} else {
			seterr(err, errlen, "storage URL \"%s\": unknown option \"%s\" (region, endpoint, "
			       "sse, sse_kms_key_id, storage_class, expected_owner, timeout_ms, max_retries)",
			       s, name);
			free(name);
			return -EINVAL;
		}
		if (*dst != NULL) {
			seterr(err, errlen, "storage URL \"%s\": option %s given twice", s, name);
			free(name);
			return -EINVAL;
		}
		v = opt_value(eq + 1, (size_t)(q + n - eq - 1), charset, max);
		if (v == NULL) {
			seterr(err, errlen, "storage URL \"%s\": invalid value for %s", s, name);
			free(name);
			return -EINVAL;
		}
		free(name);
		*dst = v;
		q = amp ? amp + 1 : q + n;
	}
	if (out->sse && strcmp(out->sse, "AES256") && strcmp(out->sse, "aws:kms") &&
	    strcmp(out->sse, "aws:kms:dsse"))
		return seterr(err, errlen, "storage URL \"%s\": sse is AES256, aws:kms or aws:kms:dsse", s);
	if (out->sse_kms_key_id && (!out->sse || strncmp(out->sse, "aws:kms", 7)))
		return seterr(err, errlen, "storage URL \"%s\": sse_kms_key_id needs sse=aws:kms", s);
	if (out->expected_owner && strlen(out->expected_owner) != 12)
		return seterr(err, errlen, "storage URL \"%s\": expected_owner is a 12-digit account id", s);
	return 0;
}

/*
 * s3://BUCKET[/PREFIX] with a region or an endpoint: AWS's own endpoint for
 * the region (virtual-hosted; path-style for a bucket with dots, which
 * AWS's wildcard certificate does not cover), or the endpoint given.
 */
static int
parse_s3_bucket_form(const char *s, const char *auth, const char *endpoint, int s3_http,
		     struct store_url *out, char *err, size_t errlen)
{
	const char *slash = strchr(auth, '/'), *host, *hend, *colon;
	size_t blen = slash ? (size_t)(slash - auth) : strlen(auth);
	char *h = NULL;

	if (!valid_bucket(auth, blen))
		return seterr(err, errlen, "storage URL \"%s\": invalid bucket name \"%.*s\" "
			      "(3-63 characters of a-z, 0-9, '.', '-')", s, (int)blen, auth);
	out->bucket = xstrndup(auth, blen);
	if (out->bucket == NULL)
		return -ENOMEM;
	if (endpoint == NULL) {
		int cn = strncmp(out->region, "cn-", 3) == 0;

		if (s3_http)
			return seterr(err, errlen, "storage URL \"%s\": AWS's endpoints are HTTPS only", s);
		/* A name with dots reads like a host: s3://minio.local/bkt?region=x
		 * must not quietly become AWS's bucket "minio.local" (bucket names
		 * are global: someone else's). AWS's own advice is no dots. */
		if (memchr(auth, '.', blen))
			return seterr(err, errlen, "storage URL \"%s\": \"%.*s\" has dots: for an S3 "
				      "service at that host give its port (s3://HOST:443/BUCKET) or "
				      "endpoint=; AWS buckets with dots are not supported", s,
				      (int)blen, auth);
		if (asprintf(&h, "%s.s3.%s.amazonaws.com%s", out->bucket, out->region, cn ? ".cn" : "") < 0)
			return -ENOMEM;
		out->host = h;
		out->port = 443;
		out->https = 1;
		out->virtual_hosted = 1;
		return 0;
	}
	if (s3_http)
		return seterr(err, errlen, "storage URL \"%s\": --s3-http with endpoint=: the "
			      "endpoint's scheme says which", s);
	if (!strncmp(endpoint, "https://", 8))
		out->https = 1, host = endpoint + 8;
	else if (!strncmp(endpoint, "http://", 7))
		out->https = 0, host = endpoint + 7;
	else
		return seterr(err, errlen, "storage URL \"%s\": endpoint is http(s)://HOST[:PORT]", s);
	hend = host + strcspn(host, "/");
	if (*hend && hend[1] != '\0')
		return seterr(err, errlen, "storage URL \"%s\": endpoint has a path", s);
	colon = host[0] == '[' ? memchr(host, ']', (size_t)(hend - host)) : host;
	colon = colon ? memchr(colon, ':', (size_t)(hend - colon)) : NULL;
	if (!valid_hostname(host, (size_t)((colon ? colon : hend) - host)))
		return seterr(err, errlen, "storage URL \"%s\": invalid endpoint host", s);
	out->port = out->https ? 443 : 80;
	if (colon) {
		char *end;
		long port = strtol(colon + 1, &end, 10);

		if (end != hend || port < 1 || port > 65535)
			return seterr(err, errlen, "storage URL \"%s\": invalid endpoint port", s);
		out->port = (int)port;
	}
	out->host = xstrndup(host, (size_t)((colon ? colon : hend) - host));
	return out->host ? 0 : -ENOMEM;
}

/* The key prefix after the bucket ("" or "a/b"): no empty, "." or ".." component. */
static int
parse_s3_prefix(const char *s, const char *pfx, struct store_url *out, char *err, size_t errlen)
{
	size_t plen = strlen(pfx);

	while (plen > 0 && pfx[plen - 1] == '/')
		plen--;
	for (const char *c = pfx, *e = pfx + plen; c < e;) {
		const char *ce = memchr(c, '/', (size_t)(e - c));
		size_t cl;
		if (ce == NULL)
			ce = e;
		cl = (size_t)(ce - c);
		if (cl == 0 || (cl == 1 && c[0] == '.') || (cl == 2 && c[0] == '.' && c[1] == '.'))
			return seterr(err, errlen, "storage URL \"%s\": empty, \".\" or \"..\" component in the prefix", s);
		c = ce + 1;
	}
	if (plen > 512)
		return seterr(err, errlen, "storage URL \"%s\": prefix longer than 512 bytes", s);
	out->prefix = xstrndup(pfx, plen);
	return out->prefix ? 0 : -ENOMEM;
}

/* main: the URL s without its query; out holds the query's options already. */
static int
parse_s3(const char *s, const char *main, const char *endpoint, int s3_http,
	 struct store_url *out, char *err, size_t errlen)
{
	const char *auth = main + strlen("s3://");
	const char *slash = strchr(auth, '/');
	const char *hostend, *colon = NULL, *bkt, *bend;
	long port;
	int r;

	if (strchr(auth, ' ') || has_ctl(auth))
		return seterr(err, errlen, "storage URL \"%s\": spaces and control characters are not allowed", s);
	if (slash == NULL)
		slash = auth + strlen(auth);
	if (memchr(auth, '@', (size_t)(slash - auth)))
		return seterr(err, errlen, "storage URL \"%s\": credentials in the URL are not supported "
			      "(README: S3 credentials)", s);
	hostend = slash;
	if (auth[0] == '[') {
		const char *rb = memchr(auth, ']', (size_t)(slash - auth));
		if (rb == NULL)
			return seterr(err, errlen, "storage URL \"%s\": unterminated IPv6 address", s);
		if (rb + 1 < slash) {
			if (rb[1] != ':')
				return seterr(err, errlen, "storage URL \"%s\": garbage after the IPv6 address", s);
			colon = rb + 1;
		}
	} else {
		colon = memchr(auth, ':', (size_t)(slash - auth));
	}
	if (colon == NULL && (out->region || endpoint)) {
		/* s3://BUCKET[/PREFIX]?region=... or ?endpoint=... */
		r = parse_s3_bucket_form(s, auth, endpoint, s3_http, out, err, errlen);
		if (r == 0)
			r = parse_s3_prefix(s, *slash ? slash + 1 : slash, out, err, errlen);
		if (r == 0)
			out->kind = STORE_S3;
		return r;
	}
	if (endpoint)
		return seterr(err, errlen, "storage URL \"%s\": endpoint= goes with s3://BUCKET[/PREFIX], "
			      "not with a host and port", s);
	if (colon)
		hostend = colon;
	if (hostend == auth)
		return seterr(err, errlen, "storage URL \"%s\": want s3://HOST[:PORT]/BUCKET[/PREFIX] (no host)", s);
	if (!valid_hostname(auth, (size_t)(hostend - auth)))
		return seterr(err, errlen, "storage URL \"%s\": invalid host \"%.*s\"", s,
			      (int)(hostend - auth), auth);
	if (colon) {
		const char *p = colon + 1;
		port = 0;
		if (p == slash)
			return seterr(err, errlen, "storage URL \"%s\": empty port", s);
		for (; p < slash; p++) {
			if (*p < '0' || *p > '9' || port > 65535)
				return seterr(err, errlen, "storage URL \"%s\": invalid port \"%.*s\"", s,
					      (int)(slash - colon - 1), colon + 1);
			port = port * 10 + (*p - '0');
		}
		if (port < 1 || port > 65535)
			return seterr(err, errlen, "storage URL \"%s\": port %ld out of range 1-65535", s, port);
	} else {
		port = s3_http ? 80 : 443;
	}
	if (*slash == '\0' || slash[1] == '\0' || slash[1] == '/')
		return seterr(err, errlen, "storage URL \"%s\": no bucket (want s3://HOST[:PORT]/BUCKET[/PREFIX])", s);
	bkt = slash + 1;
	bend = strchr(bkt, '/');
	if (bend == NULL)
		bend = bkt + strlen(bkt);
	if (!valid_bucket(bkt, (size_t)(bend - bkt)))
		return seterr(err, errlen, "storage URL \"%s\": invalid bucket name \"%.*s\" "
			      "(3-63 characters of a-z, 0-9, '.', '-')", s, (int)(bend - bkt), bkt);
	r = parse_s3_prefix(s, *bend ? bend + 1 : bend, out, err, errlen);
	if (r < 0)
		return r;
	out->host = xstrndup(auth, (size_t)(hostend - auth));
	out->bucket = xstrndup(bkt, (size_t)(bend - bkt));
	if (!out->host || !out->bucket)
		return -ENOMEM;
	out->port = (int)port;
	out->https = !s3_http;
	out->kind = STORE_S3;
	return 0;
}

/* s3:// with its options split off. */
static int
parse_s3_url(const char *s, int s3_http, struct store_url *out, char *err, size_t errlen)
{
	const char *q = strchr(s, '?');
	char *main = NULL, *endpoint = NULL;
	int r;

	out->max_retries = -1;
	if (strchr(s, '#'))
		return seterr(err, errlen, "storage URL \"%s\": fragments are not supported", s);
	main = q ? xstrndup(s, (size_t)(q - s)) : strdup(s);
	if (main == NULL)
		return -ENOMEM;
	r = q ? parse_s3_opts(s, q + 1, out, &endpoint, err, errlen) : 0;
	if (r == 0)
		r = parse_s3(s, main, endpoint, s3_http, out, err, errlen);
	free(endpoint);
	free(main);
	return r;
}

int
store_url_parse(const char *s, int s3_http, struct store_url *out, char *err, size_t errlen)
{
	struct store_url u = { 0 };
	int r;

	if (err && errlen)
		err[0] = '\0';
	memset(out, 0, sizeof(*out));
	if (s == NULL || s[0] == '\0') {
		r = seterr(err, errlen, "empty storage URL (want file:///dir or s3://HOST[:PORT]/BUCKET[/PREFIX])");
		goto out;
	}
	if (has_ctl(s)) {
		r = seterr(err, errlen, "storage URL has control characters");
		goto out;
	}
	if (strncmp(s, "file://", 7) == 0)
		r = parse_file(s, &u, err, errlen);
	else if (strncmp(s, "s3://", 5) == 0)
		r = parse_s3_url(s, s3_http, &u, err, errlen);
	else
		r = seterr(err, errlen, "storage URL \"%s\": unsupported (want file:///dir or "
			   "s3://HOST[:PORT]/BUCKET[/PREFIX])", s);
	if (r == -ENOMEM)
		seterr(err, errlen, "out of memory");
	if (r < 0)
		goto out;
	*out = u;
	memset(&u, 0, sizeof(u));
out:
	store_url_free(&u);
	return r;
}

/*
 * Resolves the longest existing ancestor of the normalised absolute path p
 * with realpath() and appends the rest, so that a directory that does not
 * exist yet still gets a canonical absolute name.
 */
static char *
resolve_existing_prefix(const char *p)
{
	char *cur = strdup(p), *ret = NULL, *real = NULL;
	size_t n;

	if (cur == NULL)
		return NULL;
	n = strlen(cur);
	for (;;) {
		char save = cur[n];
		cur[n] = '\0';
		real = realpath(n ? cur : "/", NULL);
		cur[n] = save;
		if (real != NULL || n == 0)
			break;
		if (errno != ENOENT && errno != ENOTDIR)
			break;
		while (n > 0 && cur[n - 1] != '/')
			n--;
		if (n > 0)
			n--;
	}
	if (real == NULL) {
		/* Unreadable ancestors: keep the lexical form. */
		ret = cur;
		cur = NULL;
		goto out;
	}
	/* p + n is "" or starts with '/'. */
	if (asprintf(&ret, "%s%s", strcmp(real, "/") == 0 ? "" : real, p + n) < 0) {
		ret = NULL;
		goto out;
	}
	if (ret[0] == '\0') {
		free(ret);
		ret = strdup("/");
	}
out:
	free(real);
	free(cur);
	return ret;
}

int meta_url_is_pg(const char *db_path)
{
	return strncmp(db_path, "postgresql://", 13) == 0 || strncmp(db_path, "postgres://", 11) == 0;
}

int meta_local_file(const char *db_path, const char *vol_dir, const char *suffix, char *buf,
		    size_t cap)
{
	int n = meta_url_is_pg(db_path) ? snprintf(buf, cap, "%s/meta%s", vol_dir, suffix) :
					  snprintf(buf, cap, "%s%s", db_path, suffix);

	return n < 0 || (size_t)n >= cap ? -ENAMETOOLONG : 0;
}

/*
 * A PostgreSQL volume's URL: checked for what the engine would refuse
 * (no volume=NAME of a-z 0-9 _, a password in it), kept as given; its
 * node directory is STATE/NAME.
 */
static int
pg_url_parse(const char *s, char **db_path, char **vol_dir, char *err, size_t errlen)
{
	const char *host = strstr(s, "://") + 3, *q = strchr(s, '?'), *at = strchr(host, '@');
	const char *state = getenv("FERRY_STATE_DIR"), *home = getenv("HOME"), *p;
	char name[64];
	size_t n = 0;
	int found = 0, rc;

	if ((at != NULL && (q == NULL || at < q) && memchr(host, ':', (size_t)(at - host))) ||
	    (at != NULL && q != NULL && q < strrchr(host, '@')) ||
	    (q != NULL && (strstr(q, "?password=") || strstr(q, "&password="))))
		return seterr(err, errlen, "metadata URL: give the password through PGPASSWORD, "
			      "~/.pgpass or passfile=, never in the URL");
	for (p = q; p != NULL; p = strchr(p + 1, '&')) {
		if (strncmp(p + 1, "volume=", 7) != 0)
			continue;
		n = strcspn(p + 8, "&");
		if (found || n == 0 || n > 48 ||
		    strspn(p + 8, "abcdefghijklmnopqrstuvwxyz0123456789_") < n)
			return seterr(err, errlen, "metadata URL: want one volume=NAME of 1 to 48 of "
				      "a-z, 0-9 and _");
		memcpy(name, p + 8, n);
		name[n] = '\0';
		found = 1;
	}
	if (!found)
		return seterr(err, errlen, "metadata URL: want one volume=NAME of 1 to 48 of "
			      "a-z, 0-9 and _");
	if (state != NULL && state[0] != '/')
		return seterr(err, errlen, "FERRY_STATE_DIR %s: want an absolute directory", state);
	if (state == NULL && getuid() != 0 && (home == NULL || home[0] != '/'))
		return seterr(err, errlen, "no node directory for the volume: set FERRY_STATE_DIR "
			      "(HOME is not set)");
	*db_path = strdup(s);
	if (state != NULL)
		rc = asprintf(vol_dir, "%s/%s", state, name);
	else if (getuid() == 0)
		rc = asprintf(vol_dir, "/var/lib/ferryfs/%s", name);
	else
		rc = asprintf(vol_dir, "%s/.local/state/ferryfs/%s", home, name);
	if (rc < 0)
		*vol_dir = NULL;
	if (*db_path == NULL || *vol_dir == NULL) {
		free(*db_path);
		free(*vol_dir);
		*db_path = *vol_dir = NULL;
		return -ENOMEM;
	}
	return 0;
}

int
meta_url_parse(const char *s, char **db_path, char **vol_dir, char *err, size_t errlen)
{
	char *abs = NULL, *norm = NULL, *dir = NULL, *db = NULL, *cwd = NULL;
	const char *why;
	int r = -ENOMEM;

	*db_path = NULL;
	*vol_dir = NULL;
	if (err && errlen)
		err[0] = '\0';
	if (s == NULL || s[0] == '\0') {
		r = seterr(err, errlen, "empty volume (want a directory or sqlite:///abs/path/meta.db)");
		goto out;
	}
	if (has_ctl(s)) {
		r = seterr(err, errlen, "volume name has control characters");
		goto out;
	}
	if (meta_url_is_pg(s)) {
		r = pg_url_parse(s, db_path, vol_dir, err, errlen);
		if (r == -ENOMEM)
			seterr(err, errlen, "out of memory");
		return r;
	}
	if (strncmp(s, "sqlite://", 9) == 0) {
		const char *p = s + 9;
		char *slash;

		if (p[0] != '/') {
			r = seterr(err, errlen, "metadata URL \"%s\": want sqlite:///absolute/path/meta.db", s);
			goto out;
		}
		if (p[strlen(p) - 1] == '/') {
			r = seterr(err, errlen, "metadata URL \"%s\": names a directory, not a database file", s);
			goto out;
		}
		db = normalize_abs(p, 0, &why);
		if (db == NULL) {
			if (why[0] != 'o')
				r = seterr(err, errlen, "metadata URL \"%s\": %s", s, why);
			goto out;
		}
		if (strcmp(db, "/") == 0) {
			r = seterr(err, errlen, "metadata URL \"%s\": no database file name", s);
			goto out;
		}
		slash = strrchr(db, '/');
		dir = slash == db ? strdup("/") : strndup(db, (size_t)(slash - db));
		if (dir == NULL)
			goto out;
	} else {
		if (strstr(s, "://")) {
			r = seterr(err, errlen, "metadata location \"%s\": unsupported scheme (want a directory, "
				   "sqlite:///abs/path/meta.db or postgresql://...?volume=NAME)", s);
			goto out;
		}
		if (s[0] == '/') {
			abs = strdup(s);
		} else {
			cwd = getcwd(NULL, 0);
			if (cwd == NULL) {
				r = seterr(err, errlen, "volume \"%s\": cannot get the current directory: %s",
					   s, strerror(errno));
				goto out;
			}
			if (asprintf(&abs, "%s/%s", cwd, s) < 0)
				abs = NULL;
		}
		if (abs == NULL)
			goto out;
		norm = normalize_abs(abs, 1, &why);
		if (norm == NULL) {
			if (why[0] != 'o')
				r = seterr(err, errlen, "volume \"%s\": %s", s, why);
			goto out;
		}
		dir = resolve_existing_prefix(norm);
		if (dir == NULL)
			goto out;
		if (asprintf(&db, "%s%smeta.db", dir, strcmp(dir, "/") == 0 ? "" : "/") < 0) {
			db = NULL;
			goto out;
		}
	}
	*db_path = db;
	*vol_dir = dir;
	db = dir = NULL;
	r = 0;
out:
	if (r == -ENOMEM)
		seterr(err, errlen, "out of memory");
	free(abs);
	free(norm);
	free(dir);
	free(db);
	free(cwd);
	return r;
}
