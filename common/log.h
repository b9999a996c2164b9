/*
 * log: the daemons' logging, after OpenBSD's log.c. log_warn() appends
 * strerror(errno); log_warnx() does not. Library code in common/ returns
 * negative errnos and never logs; the daemon that handles an error logs it,
 * once, with its context.
 */
#ifndef FERRY_LOG_H
#define FERRY_LOG_H

#include <stdarg.h>

enum log_level { LOG_LVL_ERROR, LOG_LVL_WARN, LOG_LVL_INFO, LOG_LVL_DEBUG };

/* ident is kept by pointer (a string literal). level: messages above it are dropped. */
void log_init(const char *ident, enum log_level level);
void log_set_level(enum log_level level);
enum log_level log_get_level(void);

void log_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void log_warnx(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void log_info(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void log_debug(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* log_errno: like log_warn but with an explicit (positive or negative) errno. */
void log_errno(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Until log_hold_end(), the calling thread's warnings past the first
 * `shown` are counted instead of written: a loop that retries many things
 * for one cause (a daemon out of fds) says so a few times, not once per
 * thing. log_hold_end() writes how many were held and why (a phrase,
 * "while ..."). */
void log_hold_begin(unsigned shown);
void log_hold_end(const char *why);
/* log_warnx("%s", msg) for a library that reports through a callback
 * (aws_creds_opts.report); arg is unused. */
void log_warnx_report(void *arg, const char *msg);
_Noreturn void fatal(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
_Noreturn void fatalx(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
