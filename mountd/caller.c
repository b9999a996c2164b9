/*
 * caller: what ferry-mountd lets a signal do (FUSE_INTERRUPT).
 *
 * A local file system does not fail a call on a regular file because its
 * caller took a signal, and programs count on that: Go takes SIGURG every
 * 10 ms, and git does not retry an open that failed with EINTR. FUSE
 * returns the daemon's EINTR as is (SA_RESTART cannot restart it), and a
 * retried create then fails with EEXIST. So a non-fatal signal changes
 * nothing here: every request completes and reports its real result.
 *
 * The one exception is a caller being killed (SIGKILL, or a signal whose
 * default action ends the process: the kernel marks every thread with a
 * pending SIGKILL then), or already gone. Its reply is never seen, so a
 * read still waiting for the object store may stop early with EINTR and
 * free its thread. Nothing that changes the file system stops early:
 * mutations complete either way.
 *
 * FUSE_INTERRUPT alone cannot tell us: the kernel sends none for the reads
 * a process usually waits on (readahead, and O_DIRECT with async_dio are
 * background requests), and a killed process stays in D state until the
 * daemon answers. So a read waiting for the store asks about its caller
 * now and then (caller_watch) as well as when interrupted.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "mountd.h"

#define SIGKILL_BIT (1ull << (9 - 1))

/* Is SIGKILL pending for thread tid (from /proc/TID/status)? Gone: true. */
static bool kill_pending(pid_t tid)
{
	char path[64], buf[4096], *p;
	ssize_t n;
	int fd;

	snprintf(path, sizeof(path), "/proc/%d/status", (int)tid);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return errno == ENOENT || errno == ESRCH;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return false;
	buf[n] = '\0';
	for (p = buf; (p = strstr(p, "Pnd:")); p += 4) {
		unsigned long long mask = strtoull(p + 4, NULL, 16);

		if (mask & SIGKILL_BIT)
			return true; /* SigPnd (the thread's) or ShdPnd */
	}
	return strstr(buf, "State:\tZ") || strstr(buf, "State:\tX");
}

bool caller_dying(fuse_req_t req)
{
	const struct fuse_ctx *ctx;

	if (!req)
		return false;
	ctx = fuse_req_ctx(req);
	/* pid 0: the caller is in a pid namespace we cannot see into, so we
	 * cannot tell: wait on, as for any signal. */
	return ctx->pid > 0 && kill_pending(ctx->pid);
}

bool caller_watch(struct caller_watch *w)
{
	struct timespec now;

	if (!w->req)
		return false;
	clock_gettime(CLOCK_MONOTONIC, &now);
	/* At once when interrupted; else every CALLER_WATCH_MS (a look at
	 * /proc costs ~10 us, and curl asks many times a second). */
	if (!fuse_req_interrupted(w->req) &&
	    (now.tv_sec < w->next.tv_sec ||
	     (now.tv_sec == w->next.tv_sec && now.tv_nsec < w->next.tv_nsec)))
		return false;
	w->next = now;
	w->next.tv_nsec += CALLER_WATCH_MS * 1000000L;
	if (w->next.tv_nsec >= 1000000000L) {
		w->next.tv_sec++;
		w->next.tv_nsec -= 1000000000L;
	}
	return caller_dying(w->req);
}
