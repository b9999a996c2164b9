/*
 * A write workload for fault tests: a child process creates, rewrites and
 * patches files on the mount while the test does something to the daemons
 * (jumps their clock, fails their allocations), and reports each operation
 * once its close() (and fsync(), when it made one) returned. The test keeps
 * a model of every file from those reports alone, so at the end it knows
 * exactly what the mount must hold: wl_check() compares.
 *
 * Op n, a function of n and the seed: create c<k> whole through a new,
 * truncating open (passthrough, committed by the reconciler after close),
 * or, once every name exists, patch c<k> in place through a new open of the
 * non-empty file (the daemon path), with an fsync every fsync_every-th
 * patch (committed by ferry-mountd before fsync returns).
 */
#ifndef FERRY_IT_WORKLOAD_UTIL_H
#define FERRY_IT_WORKLOAD_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct wl_opts {
	int names;          /* files c0..c<names-1> in the mount's root */
	size_t file_max;    /* a create writes 1..file_max bytes */
	uint64_t seed;
	int fsync_every;    /* every this many patches fsync (0: never) */
};

struct wl;

/* Starts the writer on fm.mnt. */
struct wl *wl_start(const struct wl_opts *o);
/* Takes what the writer reported, waiting up to wait_ms for something;
 * asserts that no operation failed. */
void wl_poll(struct wl *w, int wait_ms);
/* Operations completed so far. */
uint64_t wl_done(const struct wl *w);
/* Polls until at least n operations completed (asserts the writer did not
 * stop; bounded: 5 minutes). */
void wl_wait_done(struct wl *w, uint64_t n);
/* Stops the writer between two operations and takes every report. */
void wl_stop(struct wl *w);
/* Every file holds what the model says (through the mount). */
void wl_check(const struct wl *w);
void wl_free(struct wl *w);
/* For a suite's .fini: kills a writer that a failed test left running (it
 * would keep the mount busy). */
void wl_cleanup(void);

#endif
