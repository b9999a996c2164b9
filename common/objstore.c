/*
 * objstore: dispatch to the file:// and s3:// backends, key validation and
 * the per-thread last-error line.
 */
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "objstore.h"
#include "objstore_internal.h"

static _Thread_local char last_error[512];
static _Thread_local bool (*cancel_fn)(void *);
static _Thread_local void *cancel_arg;

void
objstore_set_cancel(bool (*fn)(void *arg), void *arg)
{
	cancel_fn = fn;
	cancel_arg = arg;
}

bool
objstore_cancelled(void)
{
	return cancel_fn && cancel_fn(cancel_arg);
}

int
objstore_seterr(int err, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(last_error, sizeof(last_error), fmt, ap);
	va_end(ap);
	return err;
}

const char *
objstore_last_error(void)
{
	return last_error;
}

/* Checks the components of s (up to len bytes); the last one may be partial
 * (a prefix) when partial_last is set. */
static int
check_components(const char *what, const char *s, size_t len, int partial_last)
{
	const char *p = s, *end = s + len;

	if (len > OBJSTORE_KEY_MAX)
		return objstore_seterr(-EINVAL, "%s is longer than %d bytes", what, OBJSTORE_KEY_MAX);
	for (size_t i = 0; i < len; i++) {
		unsigned char c = (unsigned char)s[i];
		if (c < 0x20 || c == 0x7f)
			return objstore_seterr(-EINVAL, "%s has a control character at byte %zu", what, i);
	}
	if (len > 0 && s[0] == '/')
		return objstore_seterr(-EINVAL, "%s \"%.*s\" starts with '/'", what, (int)len, s);
	while (p < end) {
		const char *slash = memchr(p, '/', (size_t)(end - p));
		const char *cend = slash ? slash : end;
		size_t clen = (size_t)(cend - p);
		int last = slash == NULL;

		if (clen == 0 && !(last && partial_last))
			return objstore_seterr(-EINVAL, "%s \"%.*s\" has an empty component", what, (int)len, s);
		if (!(last && partial_last) && ((clen == 1 && p[0] == '.') ||
						(clen == 2 && p[0] == '.' && p[1] == '.')))
			return objstore_seterr(-EINVAL, "%s \"%.*s\" has a \".\" or \"..\" component", what, (int)len, s);
		if (last && partial_last && clen == 2 && p[0] == '.' && p[1] == '.')
			return objstore_seterr(-EINVAL, "%s \"%.*s\" has a \"..\" component", what, (int)len, s);
		if (clen >= strlen(OBJSTORE_TMP_PREFIX) && !(last && partial_last) &&
		    memcmp(p, OBJSTORE_TMP_PREFIX, strlen(OBJSTORE_TMP_PREFIX)) == 0)
			return objstore_seterr(-EINVAL, "%s \"%.*s\" uses the reserved name prefix " OBJSTORE_TMP_PREFIX,
					       what, (int)len, s);
		if (!slash)
			break;
		p = slash + 1;
		if (p == end && !partial_last)
			return objstore_seterr(-EINVAL, "%s \"%.*s\" ends with '/'", what, (int)len, s);
	}
	return 0;
}

int
objstore_key_check(const char *key)
{
	if (key == NULL || key[0] == '\0')
		return objstore_seterr(-EINVAL, "empty object key");
	return check_components("object key", key, strlen(key), 0);
}

int
objstore_prefix_check(const char *prefix)
{
	if (prefix == NULL)
		return objstore_seterr(-EINVAL, "NULL listing prefix");
	return check_components("listing prefix", prefix, strlen(prefix), 1);
}

int
objstore_open(const struct store_url *url, const struct objstore_opts *opts,
	      struct objstore **out, char *err, size_t errlen)
{
	struct objstore_opts defaults = { 0 };
	struct objstore *s = NULL;
	int r;

	*out = NULL;
	if (err && errlen)
		err[0] = '\0';
	if (opts == NULL)
		opts = &defaults;
	if (url == NULL) {
		r = -EINVAL;
		if (err && errlen)
			snprintf(err, errlen, "no storage URL");
		goto out;
	}
	s = calloc(1, sizeof(*s));
	if (s == NULL) {
		r = -ENOMEM;
		if (err && errlen)
			snprintf(err, errlen, "out of memory");
		goto out;
	}
	s->kind = url->kind;
	switch (url->kind) {
	case STORE_FILE:
		r = objstore_file_open(url, opts, s, err, errlen);
		break;
	case STORE_S3:
		r = objstore_s3_open(url, opts, s, err, errlen);
		break;
	default:
		r = -EINVAL;
		if (err && errlen)
			snprintf(err, errlen, "unknown storage kind %d", (int)url->kind);
		break;
	}
	if (r < 0)
		goto out;
	*out = s;
	s = NULL;
out:
	free(s);
	return r;
}

int
objstore_check(struct objstore *s, int create)
{
	return s->ops->check(s, create);
}

void
objstore_close(struct objstore *s)
{
	if (s == NULL)
		return;
	if (s->ops)
		s->ops->close(s);
	free(s);
}

int
objstore_put(struct objstore *s, const char *key, const void *buf, size_t len)
{
	int r = objstore_key_check(key);

	if (r < 0)
		return r;
	if (buf == NULL && len > 0)
		return objstore_seterr(-EINVAL, "PUT %s: NULL buffer", key);
	return s->ops->put(s, key, buf, len);
}

void
objstore_defer_durability(struct objstore *s)
{
	if (s->ops->defer)
		s->ops->defer(s);
}

int
objstore_sync(struct objstore *s)
{
	return s->ops->sync ? s->ops->sync(s) : 0;
}

ssize_t
objstore_get(struct objstore *s, const char *key, uint64_t off, void *buf, size_t len)
{
	int r = objstore_key_check(key);

	if (r < 0)
		return r;
	if (buf == NULL && len > 0)
		return objstore_seterr(-EINVAL, "GET %s: NULL buffer", key);
	if (len > SSIZE_MAX)
		len = SSIZE_MAX;
	if (off > INT64_MAX || len > INT64_MAX - off)
		return objstore_seterr(-EINVAL, "GET %s: range %llu+%zu out of bounds", key,
				       (unsigned long long)off, len);
	return s->ops->get(s, key, off, buf, len);
}

/* What a store without get_to reads at a time for objstore_get_to(). */
#define GET_TO_PIECE (1u << 20)

ssize_t
objstore_get_to(struct objstore *s, const char *key, uint64_t off, size_t len,
		objstore_sink sink, void *arg)
{
	int r = objstore_key_check(key);
	size_t done = 0;
	char *piece = NULL;  /* owned here */
	ssize_t n = 0;

	if (r < 0)
		return r;
	if (len > SSIZE_MAX)
		len = SSIZE_MAX;
	if (off > INT64_MAX || len > INT64_MAX - off)
		return objstore_seterr(-EINVAL, "GET %s: range %llu+%zu out of bounds", key,
				       (unsigned long long)off, len);
	if (s->ops->get_to)
		return s->ops->get_to(s, key, off, len, sink, arg);
	piece = malloc(len < GET_TO_PIECE ? (len ? len : 1) : GET_TO_PIECE);
	if (!piece)
		return objstore_seterr(-ENOMEM, "GET %s: out of memory", key);
	do {
		size_t want = len - done < GET_TO_PIECE ? len - done : GET_TO_PIECE;

		n = s->ops->get(s, key, off + done, piece, want);
		if (n < 0)
			goto out;
		if (n > 0 && (r = sink(arg, done, piece, (size_t)n)) < 0) {
			n = objstore_seterr(r, "GET %s: the receiver failed", key);
			goto out;
		}
		done += (size_t)n;
	} while ((size_t)n == GET_TO_PIECE && done < len);
	n = (ssize_t)done;
out:
	free(piece);
	return n;
}

int
objstore_delete(struct objstore *s, const char *key)
{
	int r = objstore_key_check(key);

	if (r < 0)
		return r;
	return s->ops->del(s, key);
}

int
objstore_head(struct objstore *s, const char *key, uint64_t *size)
{
	int r = objstore_key_check(key);

	if (r < 0)
		return r;
	return s->ops->head(s, key, size);
}

int
objstore_list(struct objstore *s, const char *prefix,
	      int (*cb)(const char *key, uint64_t size, void *arg), void *arg)
{
	int r;

	if (prefix == NULL)
		prefix = "";
	r = objstore_prefix_check(prefix);
	if (r < 0)
		return r;
	if (cb == NULL)
		return objstore_seterr(-EINVAL, "LIST %s: no callback", prefix);
	return s->ops->list(s, prefix, cb, arg);
}
