/*
 * errmsg: the one way a decoder or checker returns a failure -- a negative
 * errno, with a line for the user written into the caller's buffer (which
 * may be NULL). The buffer is the caller's.
 */
#ifndef FERRY_ERRMSG_H
#define FERRY_ERRMSG_H

#include <stddef.h>

/* Writes the message into err[0..errlen) (if err) and returns rc. */
int errmsg_fail(int rc, char *err, size_t errlen, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

#endif
