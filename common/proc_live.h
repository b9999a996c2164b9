/*
 * proc_live: whether a pid some file names (a lock's holder, a pool's
 * owner) is a process that still runs. A zombie does not: it holds
 * nothing any more, though its pid still answers kill().
 */
#ifndef FERRY_PROC_LIVE_H
#define FERRY_PROC_LIVE_H

#include <stdbool.h>

/* False for pid <= 0, a pid no process has, and a zombie. Where /proc
 * cannot say, kill(pid, 0) decides. */
bool proc_live(long pid);

#endif
