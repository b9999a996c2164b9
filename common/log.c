#include "log.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char *log_ident = "ferry";
static enum log_level log_level = LOG_LVL_INFO;

/* log_hold_begin(): this thread's warnings past the first few are counted. */
static _Thread_local struct {
	bool on;
	unsigned shown; /* still to be written as usual */
	unsigned held;
} hold;

void log_init(const char *ident, enum log_level level)
{
	log_ident = ident;
	log_level = level;
}

void log_set_level(enum log_level level) { log_level = level; }
enum log_level log_get_level(void) { return log_level; }

static void log_emit(enum log_level lvl, int err, const char *fmt, va_list ap)
{
	static const char *names[] = { "error", "warning", "info", "debug" };
	char msg[1024];
	struct timespec ts;
	struct tm tm;

	if (lvl > log_level)
		return;
	if (hold.on && lvl == LOG_LVL_WARN) {
		if (hold.shown == 0) {
			hold.held++;
			return;
		}
		hold.shown--;
	}
	vsnprintf(msg, sizeof(msg), fmt, ap);
	clock_gettime(CLOCK_REALTIME, &ts);
	gmtime_r(&ts.tv_sec, &tm);
	/* One fprintf per line so concurrent threads do not interleave. */
	if (err)
		fprintf(stderr, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %s[%d] %s: %s: %s\n",
			tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
			tm.tm_sec, ts.tv_nsec / 1000000, log_ident, (int)getpid(), names[lvl],
			msg, strerror(err));
	else
		fprintf(stderr, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %s[%d] %s: %s\n",
			tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
			tm.tm_sec, ts.tv_nsec / 1000000, log_ident, (int)getpid(), names[lvl],
			msg);
}

#define LOG_BODY(lvl, err)              \
	do {                            \
		va_list ap;             \
		va_start(ap, fmt);      \
		log_emit(lvl, err, fmt, ap); \
		va_end(ap);             \
	} while (0)

void log_warn(const char *fmt, ...) { int e = errno; LOG_BODY(LOG_LVL_WARN, e); }
void log_warnx(const char *fmt, ...) { LOG_BODY(LOG_LVL_WARN, 0); }
void log_info(const char *fmt, ...) { LOG_BODY(LOG_LVL_INFO, 0); }
void log_debug(const char *fmt, ...) { LOG_BODY(LOG_LVL_DEBUG, 0); }
void log_errno(int err, const char *fmt, ...) { LOG_BODY(LOG_LVL_WARN, err < 0 ? -err : err); }

void fatal(const char *fmt, ...)
{
	int e = errno;
	LOG_BODY(LOG_LVL_ERROR, e);
	exit(1);
}

void fatalx(const char *fmt, ...)
{
	LOG_BODY(LOG_LVL_ERROR, 0);
	exit(1);
}

void log_hold_begin(unsigned shown)
{
	hold.on = true;
	hold.shown = shown;
	hold.held = 0;
}

void log_hold_end(const char *why)
{
	unsigned held = hold.held;

	hold.on = false;
	hold.held = 0;
	if (held)
		log_warnx("%u more warning%s like those held back %s", held, held == 1 ? "" : "s", why);
}

void log_warnx_report(void *arg, const char *msg)
{
	(void)arg;
	log_warnx("%s", msg);
}
