/*
 * clock: intervals and timeouts measured on CLOCK_MONOTONIC, which the
 * wall clock's jumps (NTP steps, an operator's `date -s`, a VM resumed)
 * do not move. The wall clock (CLOCK_REALTIME) is for what is stored or
 * shown as a date: file times, log lines, gc_slice.since, request signing.
 *
 * pthread_cond_timedwait() measures its deadline on CLOCK_REALTIME unless
 * the condition variable was made otherwise: a deadline taken just before
 * the clock steps back an hour then waits an hour more. Every condition
 * variable that is waited on with a timeout is made by mono_cond_init()
 * and its deadlines come from mono_deadline_ms().
 */
#ifndef FERRY_CLOCK_H
#define FERRY_CLOCK_H

#include <pthread.h>
#include <stdint.h>
#include <time.h>

/* pthread_cond_init() with timed waits on CLOCK_MONOTONIC: 0 or -errno. */
int mono_cond_init(pthread_cond_t *cond);
/* Now plus ms on CLOCK_MONOTONIC, for pthread_cond_timedwait() on a
 * condition variable made by mono_cond_init(). */
void mono_deadline_ms(struct timespec *ts, long ms);
/* CLOCK_MONOTONIC in nanoseconds. */
int64_t mono_now_ns(void);
/* Has the monotonic clock reached ts (a mono_deadline_ms() result)? */
int mono_passed(const struct timespec *ts);

#endif
