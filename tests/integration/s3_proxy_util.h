/*
 * s3_proxy: a fault-injecting HTTP/1.1 proxy on 127.0.0.1, in threads of the
 * test process, in front of the test's S3 server (scripts/s3-server). Every
 * request it passes on goes upstream on a connection of its own and both
 * responses say "Connection: close", so a fault hits exactly one request.
 *
 * A fault is armed for the next `count` requests whose method matches
 * (NULL: any; "GET" also matches HEAD) and whose path holds path_part
 * (NULL: any; "/chunks/" picks object data): the proxy answers 500 or 503
 * SlowDown (Retry-After: 1) itself, answers 404 NoSuchBucket, holds the
 * connection without answering until released, or passes the request on
 * and then spoils the response: cuts it with a reset half-way through the
 * body, ends it early (short body, clean close), or flips a byte of it.
 *
 * Strict credentials (s3_proxy_require_tokens()): the proxy plays S3's
 * check of temporary credentials. Every request must carry an
 * x-amz-security-token header naming a token of its table
 * (s3_proxy_token_add(), e.g. from a test's credentials server) that has
 * not expired when the request's head arrives; otherwise the proxy answers
 * itself, as S3 does, 400 ExpiredToken (a known token past its expiry) or
 * 403 InvalidToken (no token, or one it never heard of), with no body for
 * a HEAD, and counts it (s3_proxy_token_rejections()). The check comes
 * before any armed fault; a request that passes it goes upstream as usual
 * (signed with the upstream's own keys, which the proxy does not check).
 *
 * Ownership: the proxy owns its threads and sockets and copies of the
 * tokens it is given; s3_proxy_stop() ends them all (stalled connections
 * included) and frees it.
 */
#ifndef FERRY_IT_S3_PROXY_UTIL_H
#define FERRY_IT_S3_PROXY_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum s3_fault {
	S3F_NONE,
	S3F_500,           /* HTTP 500 InternalError */
	S3F_503,           /* HTTP 503 SlowDown, Retry-After: 1 */
	S3F_NO_BUCKET,     /* HTTP 404 NoSuchBucket */
	S3F_STALL,         /* no answer until s3_proxy_release() or stop */
	S3F_RESET,         /* upstream's answer, reset half-way through its body */
	S3F_SHORT,         /* upstream's answer, ended half-way through its body */
	S3F_GARBLE,        /* upstream's answer with one body byte flipped */
};

struct s3_proxy;

/* The usual fixture: a proxy in front of the test's S3 server (asserting
 * that scripts/test's environment is there), and a mounted volume on a
 * fresh prefix of its bucket named after tag, through the proxy. */
struct s3_proxy *s3_proxy_volume_setup(const char *tag);
/* Starts a proxy for upstream "HOST:PORT" (asserts on failure). */
struct s3_proxy *s3_proxy_start(const char *upstream);
/* "127.0.0.1:PORT" of the proxy. */
const char *s3_proxy_hostport(const struct s3_proxy *p);
/* Arms fault f for the next count requests with that method and path part. */
void s3_proxy_fault(struct s3_proxy *p, enum s3_fault f, int count, const char *method,
		    const char *path_part);
/* Requests seen, and faults done, since the start. */
unsigned s3_proxy_requests(const struct s3_proxy *p);
unsigned s3_proxy_faults_done(const struct s3_proxy *p);
/* Connections held by S3F_STALL right now. */
unsigned s3_proxy_stalled(const struct s3_proxy *p);
/* Lets the stalled connections go (closed without an answer). */
void s3_proxy_release(struct s3_proxy *p);
void s3_proxy_stop(struct s3_proxy *p);

/* Counts, from now on, the requests with that method (NULL: any; "GET"
 * also matches HEAD) and path part (NULL: any) that the proxy passes
 * upstream (not the ones it answers itself); returns the watch's number
 * for s3_proxy_watched(). At most 8 watches. */
int s3_proxy_watch(struct s3_proxy *p, const char *method, const char *path_part);
unsigned s3_proxy_watched(const struct s3_proxy *p, int watch);

/* Strict credentials on (or off again). */
void s3_proxy_require_tokens(struct s3_proxy *p, bool on);
/* Knows token, valid until expires (Unix seconds, exclusive: a request
 * arriving at that second or later is refused); again for a known token
 * sets its expiry. */
void s3_proxy_token_add(struct s3_proxy *p, const char *token, int64_t expires);
/* Every token known now is expired from now on (S3 revoked them early);
 * tokens added later are not. */
void s3_proxy_token_expire_all(struct s3_proxy *p);
/* Requests the strict mode refused, since the start. */
unsigned s3_proxy_token_rejections(const struct s3_proxy *p);
/* What the last refusal was ("400 ExpiredToken PUT /b/k (token tok-3)"),
 * "" if none, into buf. */
void s3_proxy_token_last_rejection(const struct s3_proxy *p, char *buf, size_t len);

#endif
