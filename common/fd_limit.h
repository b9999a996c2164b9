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

#endif
