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
 * Ownership: the proxy owns its threads and sockets; s3_proxy_stop() ends
 * them all (stalled connections included) and frees it.
 */
#ifndef FERRY_IT_S3_PROXY_UTIL_H
#define FERRY_IT_S3_PROXY_UTIL_H

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

#endif
