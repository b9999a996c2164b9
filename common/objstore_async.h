/*
 * objstore_async: object-store uploads that the caller drives itself, for
 * event loops. ferry-reconciler adds the easy handle of each PUT to its own
 * libcurl multi handle under libevent (curl's hiperfifo.c structure) instead
 * of blocking a thread per request. s3:// only: file:// puts are local file
 * writes, done with objstore_put() on a worker thread.
 *
 * Not part of objstore.h; retries are the caller's (this makes one attempt
 * per objstore_aput_rearm()). An aput is used by one thread at a time; it
 * may be made on one thread and run on another. Nothing here logs.
 */
#ifndef FERRY_OBJSTORE_ASYNC_H
#define FERRY_OBJSTORE_ASYNC_H

#include <stddef.h>

#include <curl/curl.h>

#include "objstore.h"

struct objstore_aput;

/* 1 if s is a store whose puts can run on a caller's multi handle. */
int objstore_async_capable(struct objstore *s);
/*
 * Prepares a PUT of buf[0..len) under key (checked like objstore_put) as a
 * curl easy handle, signed (SHA-256 of the body: CPU work worth keeping off
 * an event loop). buf must stay valid until objstore_aput_free(). Returns 0
 * or a negative errno with the reason in objstore_last_error().
 */
int objstore_aput_new(struct objstore *s, const char *key, const void *buf, size_t len,
		      struct objstore_aput **out);
/* The easy handle to add to a multi handle (owned by the aput). */
CURL *objstore_aput_easy(struct objstore_aput *p);
/*
 * The outcome once the multi reported the transfer done with result rc:
 * 0 when the object is stored, else a negative errno (objstore.h) with the
 * reason in objstore_last_error(); *transient tells whether trying again may
 * help (5xx, 429, timeouts, resets, refused connections).
 */
int objstore_aput_result(struct objstore_aput *p, CURLcode rc, int *transient);
/* Makes the aput ready for another attempt (after removing it from the multi). */
void objstore_aput_rearm(struct objstore_aput *p);
/* Frees it; remove the easy handle from its multi first. Accepts NULL. */
void objstore_aput_free(struct objstore_aput *p);

#endif
