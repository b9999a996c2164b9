/*
 * objstore: the object-store interface (put / ranged get / delete / head /
 * list) and its backends, file:// (a directory) and s3:// (libcurl, SigV4).
 *
 * Objects are immutable blobs named by keys such as "chunks/0/1/1234_0_4096".
 * Every call is safe to make from many threads at once on one objstore.
 * Calls return 0 (or a byte count) on success and a negative errno:
 *   -ENOENT     the object does not exist
 *   -EACCES     the store refused the credentials or signature
 *   -EIO        the store failed (after retries for transient errors), or the
 *               object is damaged (short, wrong size)
 *   -EHOSTUNREACH / -ECONNREFUSED / -ETIMEDOUT  the store cannot be reached
 *   -EINTR      given up early (objstore_set_cancel)
 * Nothing here logs; objstore_last_error() gives a one-line description of
 * the calling thread's last failure for the caller's log line.
 */
#ifndef FERRY_OBJSTORE_H
#define FERRY_OBJSTORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "url.h"

struct objstore;

struct objstore_opts {
	/* S3 only. NULL fields are read from AWS_ACCESS_KEY_ID,
	 * AWS_SECRET_ACCESS_KEY, AWS_REGION (default us-east-1). */
	const char *access_key;
	const char *secret_key;
	const char *region;
	int max_retries;        /* transient failures (5xx, timeouts); 0 = default (5) */
	long timeout_ms;        /* per request; 0 = default (30 s) */
	/* S3 only: told when refreshing the credentials fails and when it works
	 * again (aws_creds_opts.report); NULL: nobody. */
	void (*creds_report)(void *arg, const char *msg);
	void *creds_report_arg;
};

/*
 * A blocking call of this thread may be given up early: while it waits (a
 * transfer, a backoff between tries), fn(arg) is asked every so often, and
 * true ends the call with -EINTR (never retried, nothing half-applied is
 * left: objects are written whole or not at all). NULL: never. For a read
 * whose caller is being killed (ferry-mountd's caller.c).
 */
void objstore_set_cancel(bool (*fn)(void *arg), void *arg);
/* Is this thread's call to be given up now? */
bool objstore_cancelled(void);

/* Opens a store. Returns 0 or a negative errno with the reason in err. For
 * s3:// it does not contact the server; objstore_check() does. */
int objstore_open(const struct store_url *url, const struct objstore_opts *opts,
		  struct objstore **out, char *err, size_t errlen);
/* Verifies the store is reachable and usable (file: directory exists and is
 * writable; s3: bucket answers). Creates the file:// directory if create. */
int objstore_check(struct objstore *s, int create);
struct aws_creds_info;
/* Where an s3:// store's credentials come from, and how their refreshes go
 * (aws_creds.h). 0, or -EOPNOTSUPP for a store that has none (file://). */
int objstore_creds_info(struct objstore *s, struct aws_creds_info *i);
/* An s3:// store's blocking requests since it opened, and the connections
 * they had to open (the rest reused one). 0, or -EOPNOTSUPP (file://). */
int objstore_conn_info(struct objstore *s, uint64_t *requests, uint64_t *connects);
void objstore_close(struct objstore *s); /* accepts NULL */

/* Stores len bytes under key, atomically: a reader sees all or nothing.
 * Durable (on stable storage) when it returns, unless the store defers. */
int objstore_put(struct objstore *s, const char *key, const void *buf, size_t len);
/*
 * From now on, puts on s may return before their objects are on stable
 * storage; objstore_sync() makes every put that returned before it durable.
 * For a caller that puts many objects and then commits metadata naming
 * them (ferry-reconciler's batches): one flush per batch instead of one per
 * object. file:// only (an S3 put is durable when the server answers);
 * elsewhere a no-op. Call before the store is shared between threads.
 */
void objstore_defer_durability(struct objstore *s);
/* Makes every put that returned before this call durable: 0; -ENOMEM
 * (nothing changed: try again); or -EIO, which is sticky (every later call
 * fails too): which objects reached the disk is not known, so none of
 * those puts may be named, and the store must be reopened and the objects
 * put again. */
int objstore_sync(struct objstore *s);
/* Reads up to len bytes from offset off. Returns the byte count (short only
 * at the end of the object) or a negative errno. */
ssize_t objstore_get(struct objstore *s, const char *key, uint64_t off, void *buf, size_t len);
/* Takes a GET's bytes in order as they arrive: pos is where data lies in
 * the range asked for. A request that is tried again starts again at pos
 * 0. Returns 0 to go on, or a negative errno, which ends the GET with it. */
typedef int (*objstore_sink)(void *arg, uint64_t pos, const void *data, size_t len);
/* objstore_get() of up to len bytes at off into sink instead of a buffer
 * (no copy of the whole range in memory). Returns the byte count the last
 * attempt delivered, or a negative errno. */
ssize_t objstore_get_to(struct objstore *s, const char *key, uint64_t off, size_t len,
			objstore_sink sink, void *arg);
/* Deletes key; deleting a missing key is success. */
int objstore_delete(struct objstore *s, const char *key);
int objstore_head(struct objstore *s, const char *key, uint64_t *size);
/* Calls cb for every key starting with prefix (in key order for s3, any order
 * for file). cb returning non-zero stops the listing and is returned. */
int objstore_list(struct objstore *s, const char *prefix,
		  int (*cb)(const char *key, uint64_t size, void *arg), void *arg);

const char *objstore_last_error(void);

#endif
