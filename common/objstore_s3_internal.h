/*
 * objstore_s3_internal: the S3 backend's request layer, exposed for its tests
 * (tests/unit/test_sigv4.c, test_objstore.c). Not for other callers.
 */
#ifndef FERRY_OBJSTORE_S3_INTERNAL_H
#define FERRY_OBJSTORE_S3_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "objstore.h"

struct objstore;

/*
 * Test hooks, to make the backend send AWS's published example requests:
 * every later request of s carries this Host header and x-amz-date (both are
 * signed; NULL: the endpoint and the clock, as in production), addresses
 * objects virtual-hosted style (no bucket in the path) when virtual_hosted,
 * and carries extra_headers ("Name: value", NULL-terminated). Copies what it
 * needs; call before the store is shared between threads.
 */
struct s3_test_hooks {
	const char *host_header;
	const char *amz_date;
	int virtual_hosted;
	const char *const *extra_headers;
};
int s3_test_set_hooks(struct objstore *s, const struct s3_test_hooks *h);

/* One S3 request, with retries of transient failures. */
struct s3_req {
	const char *method;     /* "GET", "PUT", "HEAD", "DELETE" */
	const char *key;        /* object key under the store's prefix; NULL: the bucket */
	const char *query;      /* canonical query string (sorted, encoded) or NULL */
	const void *body;       /* PUT payload */
	size_t body_len;
	int ranged;             /* GET: ask for bytes off..off+len-1 */
	uint64_t off;
	size_t len;
	void *out;              /* GET: the body lands here (at most out_cap bytes) */
	size_t out_cap;
	objstore_sink sink;     /* GET without out: the body goes here (out_cap bytes at most) */
	void *sink_arg;
	/* Results. */
	long status;            /* final HTTP status */
	size_t out_len;         /* bytes stored in out */
	char *resp;             /* body when out is NULL: malloc'ed, NUL-terminated; the caller
	                         * frees it (even on a status it did not expect) */
	size_t resp_len;
	int64_t content_length; /* -1 if unknown */
	int64_t cr_start, cr_end, cr_total; /* Content-Range, -1 if absent */
	char err_code[64];      /* <Code> of an S3 error body, "" if none */
	char err_region[32];    /* its <Region> (a bucket in another region), "" if none */
};

/*
 * Performs r. Returns 0 once a final HTTP response arrived (r->status tells
 * which; 5xx and 429 are retried first), or a negative errno when the
 * server could not be reached or kept failing (reason in
 * objstore_last_error()).
 */
int s3_request(struct objstore *s, struct s3_req *r);

/* S3's URI encoding (RFC 3986 unreserved kept, the rest %XX), keeping '/'
 * when keep_slash. malloc'ed; NULL on ENOMEM. */
char *s3_uri_encode(const char *s, int keep_slash);

#endif
