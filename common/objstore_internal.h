/*
 * objstore_internal: what objstore.c (the dispatcher) and the backends
 * (objstore_file.c, objstore_s3.c) share. Not for callers of objstore.h.
 */
#ifndef FERRY_OBJSTORE_INTERNAL_H
#define FERRY_OBJSTORE_INTERNAL_H

#include "objstore.h"

struct objstore_ops {
	int (*check)(struct objstore *s, int create);
	void (*close)(struct objstore *s);
	int (*put)(struct objstore *s, const char *key, const void *buf, size_t len);
	ssize_t (*get)(struct objstore *s, const char *key, uint64_t off, void *buf, size_t len);
	/* Optional: objstore_get_to() in one request (without it, ranged
	 * gets of a piece at a time). */
	ssize_t (*get_to)(struct objstore *s, const char *key, uint64_t off, size_t len,
			  objstore_sink sink, void *arg);
	int (*del)(struct objstore *s, const char *key);
	int (*head)(struct objstore *s, const char *key, uint64_t *size);
	int (*list)(struct objstore *s, const char *prefix,
		    int (*cb)(const char *key, uint64_t size, void *arg), void *arg);
	void (*defer)(struct objstore *s);  /* NULL: puts are durable anyway */
	int (*sync)(struct objstore *s);
};

struct objstore {
	const struct objstore_ops *ops;
	enum store_kind kind;
	void *priv;             /* the backend's state, freed by ops->close */
};

/* Longest key accepted (S3's limit). */
#define OBJSTORE_KEY_MAX 1024
/* Prefix of the file backend's temporary files; no key component may start
 * with it, so a listing can skip them. */
#define OBJSTORE_TMP_PREFIX ".ferrytmp."

/* Records the calling thread's last error (printf-style) and returns err. */
int objstore_seterr(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* 0 if key is a valid object key, else -EINVAL with the reason recorded:
 * non-empty, at most OBJSTORE_KEY_MAX bytes, no leading or trailing '/', no
 * empty, "." or ".." component, no control characters, no component starting
 * with OBJSTORE_TMP_PREFIX. */
int objstore_key_check(const char *key);
/* Same for a listing prefix: "" is valid, a trailing '/' and a partial last
 * component are allowed. */
int objstore_prefix_check(const char *prefix);

int objstore_file_open(const struct store_url *url, const struct objstore_opts *opts,
		       struct objstore *s, char *err, size_t errlen);
int objstore_s3_open(const struct store_url *url, const struct objstore_opts *opts,
		     struct objstore *s, char *err, size_t errlen);

#endif
