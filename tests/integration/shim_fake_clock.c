/*
 * A test shim (LD_PRELOAD): the wall clock of the process runs off the real
 * one by the number of seconds written in the file $FERRY_FAKE_CLOCK_FILE
 * (signed; no file, or no number in it, is 0). A test rewrites the file
 * (a new one renamed over it) while the process runs, and the process's
 * wall clock jumps, forwards or backwards, as after an NTP step or a
 * `date -s`, without touching the machine's clock.
 *
 * Shifted: clock_gettime() of CLOCK_REALTIME, CLOCK_REALTIME_COARSE and
 * CLOCK_TAI, gettimeofday(), time(), timespec_get(). CLOCK_MONOTONIC and
 * CLOCK_BOOTTIME are not, as a real jump leaves them alone. Neither is the
 * kernel's clock, which stamps file times and times out waits on
 * CLOCK_REALTIME (pthread_cond_timedwait with default attributes): a
 * process that takes a deadline from its shifted clock and waits on the
 * kernel's sees what a jump between the two would show it, which is what
 * the tests look for.
 *
 * The file is read again at most every FILE_RECHECK_NS, so a jump takes
 * effect within that time. Works beside ASan: the real functions are the
 * next ones in the lookup order (ASan's interceptors or libc's).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#define FILE_RECHECK_NS 10000000LL /* 10 ms */

typedef int (*clock_gettime_fn)(clockid_t, struct timespec *);

static _Atomic(clock_gettime_fn) real_clock_gettime;
static _Atomic long long offset_s;
static _Atomic long long checked_at_ns = -1; /* monotonic; -1: never */
static char path[4096];
static _Atomic int path_state; /* 0 not looked up, 1 set, 2 none */

static clock_gettime_fn real(void)
{
	clock_gettime_fn f = atomic_load(&real_clock_gettime);

	if (!f) {
		f = (clock_gettime_fn)dlsym(RTLD_NEXT, "clock_gettime");
		atomic_store(&real_clock_gettime, f);
	}
	return f;
}

static const char *clock_file(void)
{
	int st = atomic_load(&path_state);

	if (st == 0) {
		const char *p = getenv("FERRY_FAKE_CLOCK_FILE");
		size_t n = 0;

		if (p)
			while (p[n] && n < sizeof(path) - 1) {
				path[n] = p[n];
				n++;
			}
		path[n] = '\0';
		st = n ? 1 : 2;
		atomic_store(&path_state, st);
	}
	return st == 1 ? path : NULL;
}

/* Reads the offset from the file: only syscalls, no allocation (the
 * process may be inside malloc, or not yet initialised). */
static long long read_offset(const char *p)
{
	char buf[64];
	ssize_t n;
	long long v = 0;
	int neg = 0, i = 0, fd = open(p, O_RDONLY | O_CLOEXEC);

	if (fd < 0)
		return 0;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return 0;
	buf[n] = '\0';
	while (buf[i] == ' ' || buf[i] == '\t')
		i++;
	if (buf[i] == '-' || buf[i] == '+')
		neg = buf[i++] == '-';
	for (; buf[i] >= '0' && buf[i] <= '9'; i++)
		v = v * 10 + (buf[i] - '0');
	return neg ? -v : v;
}

/* Set by our constructor: until then (libraries that start before us, such
 * as ASan's runtime, whose interceptors of open and read are not set up yet)
 * the clock is not shifted. */
static _Atomic int started;

__attribute__((constructor)) static void shim_start(void)
{
	atomic_store(&started, 1);
}

static long long offset(void)
{
	clock_gettime_fn f;
	struct timespec m;
	long long now, last;
	const char *p;

	if (!atomic_load(&started))
		return 0;
	p = clock_file();
	f = real();
	if (!p || !f || f(CLOCK_MONOTONIC, &m) != 0)
		return 0;
	now = (long long)m.tv_sec * 1000000000LL + m.tv_nsec;
	last = atomic_load(&checked_at_ns);
	if (last < 0 || now - last >= FILE_RECHECK_NS) {
		atomic_store(&checked_at_ns, now);
		atomic_store(&offset_s, read_offset(p));
	}
	return atomic_load(&offset_s);
}

static int shifted(clockid_t id)
{
	return id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE || id == CLOCK_TAI;
}

int clock_gettime(clockid_t id, struct timespec *ts)
{
	clock_gettime_fn f = real();
	int rc;

	if (!f) {
		errno = ENOSYS;
		return -1;
	}
	rc = f(id, ts);
	if (rc == 0 && shifted(id))
		ts->tv_sec += (time_t)offset();
	return rc;
}

int gettimeofday(struct timeval *restrict tv, void *restrict tz)
{
	struct timespec ts;

	(void)tz; /* obsolete; glibc fills nothing either */
	if (clock_gettime(CLOCK_REALTIME, &ts) != 0)
		return -1;
	tv->tv_sec = ts.tv_sec;
	tv->tv_usec = ts.tv_nsec / 1000;
	return 0;
}

time_t time(time_t *t)
{
	struct timespec ts;
	time_t v;

	if (clock_gettime(CLOCK_REALTIME, &ts) != 0)
		return (time_t)-1;
	v = ts.tv_sec;
	if (t)
		*t = v;
	return v;
}

int timespec_get(struct timespec *ts, int base)
{
	if (base != TIME_UTC || clock_gettime(CLOCK_REALTIME, ts) != 0)
		return 0;
	return base;
}
