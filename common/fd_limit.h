/*
 * fd_limit: a daemon's open-file limit. The soft RLIMIT_NOFILE (1024 by
 * default) is far below what a busy mount holds (a staging file per file
 * open for write or in flight, a socket per peer); the hard limit is what
 * the administrator allows.
 */
#ifndef FERRY_FD_LIMIT_H
#define FERRY_FD_LIMIT_H

/* Raises the soft RLIMIT_NOFILE to the hard one. Best effort. */
void fd_limit_raise(void);
/* The soft RLIMIT_NOFILE: how many fds this process may hold; -1 when
 * unlimited or unknown. The callers that size a pool of fds by it read
 * it when they need it, so a limit lowered at run time (prlimit) counts. */
long fd_limit_soft(void);
/* How many more fds this process may open now: its soft RLIMIT_NOFILE
 * less the fds open (a listing of /proc/self/fd, which costs a directory
 * read: for slow paths only). 0 when not even that listing could be
 * opened; -1 when it cannot be told (no /proc). */
long fd_limit_headroom(void);

#endif
