/*
 * Helpers for tests that drive a real ferry-reconciler the way ferry-mountd
 * will: start and stop the daemon (it dies with the test process:
 * PR_SET_PDEATHSIG), write staging files and their journal records, send
 * handoffs with the staging fd, and read the replies.
 */
#ifndef FERRY_IT_RECONCILER_CLIENT_UTIL_H
#define FERRY_IT_RECONCILER_CLIENT_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "reconcile_job.h"

struct rcu {
	pid_t pid;
	char volume[4096];
	char staging[4096];
	char sock[4096];
	char log[4096];
	int staging_fd;
	const char *extra[16];  /* more arguments, NULL-terminated */
	unsigned nofile;        /* not 0: the daemon's RLIMIT_NOFILE, soft and hard */
};

/* Sets the paths (staging dir is created) without starting anything. */
void rcu_init(struct rcu *r, const char *volume, const char *staging, const char *sock,
	      const char *log);
/* Starts ferry-reconciler -f and waits until its socket answers. */
void rcu_start(struct rcu *r);
/* Sends sig and waits for the exit; returns the exit status (128+signal if killed). */
int rcu_stop(struct rcu *r, int sig);
bool rcu_alive(const struct rcu *r);
void rcu_fini(struct rcu *r);

int rcu_connect(const struct rcu *r);
/* Writes a staging file name with data[0..len) at offset 0 (data NULL: a
 * sparse file of len bytes). */
void rcu_stage(const struct rcu *r, const char *name, const void *data, size_t len);
/* Journal record, then the handoff with the staging file's fd. The record
 * is the file's xattr for an even seq and a .job for an odd one, so both
 * kinds ferry-mountd makes (the second where user xattrs are missing) are
 * taken up, recovered and removed. */
void rcu_handoff(const struct rcu *r, int sock, const struct reconcile_job *j);
/* The record alone, as rcu_handoff() makes it. */
void rcu_record(const struct rcu *r, const struct reconcile_job *j);
/* A whole-file job. */
void rcu_job(struct reconcile_job *j, uint64_t seq, uint64_t ino, uint64_t length, const char *name);
/* Reads replies until a Committed for seq (others are skipped); returns
 * its error. Asserts on an Error reply or a closed connection. */
int rcu_wait_committed(int sock, uint64_t seq);
/* Reads Committed replies (they come in completion order) until one for
 * every seq in [first, first + n) arrived; errs[i] gets seq first+i's error
 * (errs may be NULL: then each must be 0). */
void rcu_wait_range(int sock, uint64_t first, int n, int *errs);
/* Stats over a new connection. */
void rcu_stats(const struct rcu *r, struct reconcile_stats *s);
/* Number of names in the staging dir ending with suffix. */
int rcu_count(const struct rcu *r, const char *suffix);
/* Number of staging files carrying a record xattr. */
int rcu_count_attached(const struct rcu *r);
/* Open fds of the daemon, but for its database connections. */
int rcu_nfds(const struct rcu *r);
/* rcu_nfds() once it has not changed for 150 ms (at most 10 s): a
 * connection just closed may still be open at the daemon's end. */
int rcu_nfds_settled(const struct rcu *r);
/* What the last rcu_nfds() counted, one target a line. */
extern char rcu_fd_list[8192];

#endif
