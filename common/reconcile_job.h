/*
 * reconcile_job: a reconcile job (one closed staging file to ferry into the
 * object store) as ferry-mountd hands it to ferry-reconciler, and the rest of
 * their protocol (proto/reconcile.proto): checked decoding of every request
 * and reply, the journal record of a job in the staging directory, and the
 * blocking client calls ferry-mountd uses.
 *
 * The journal: before it sends a Handoff, the sender records the same
 * message with the staging file: as its extended attribute user.ferry.job
 * (reconcile_job_attach(): one call, and the record goes when the file
 * does), or, where the file system has no user xattrs, as the file
 * <staging_name>.job in the staging directory (reconcile_job_write(): a
 * temporary ".<name>.job.tmp", then rename). The reconciler removes the
 * staging file (and then a .job) once the job is committed, or renames
 * them to <name>.orphan and <name>.orphan.job (always a file) when it gives
 * up; at start-up it finishes every job it finds recorded either way. So a
 * job survives SIGKILL of either process.
 *
 * Ownership: a struct reconcile_job owns its dirty array; clear it with
 * reconcile_job_clear(). Buffers returned by the encoders are malloc'ed and
 * the caller's. Fds stay the caller's. Nothing here logs; the err buffers
 * get a one-line reason.
 */
#ifndef FERRY_RECONCILE_JOB_H
#define FERRY_RECONCILE_JOB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "reconcile_plan.h"
#include "slice.h"

#define RECONCILE_PROTO_VERSION 1u
/* Longest staging name: leaves room for ".orphan.job" and the temp prefix. */
#define RECONCILE_NAME_MAX 200
#define RECONCILE_RANGES_MAX 2048  /* the most a 64 KiB frame holds, with room */
#define RECONCILE_MSG_MAX 512
/* Largest frame either side sends or accepts. */
#define RECONCILE_FRAME_MAX (64u << 10)

#define RECONCILE_JOB_SUFFIX ".job"
/* In the staging directory: held (an exclusive flock(), on a read-only
 * open) by the one reconciler serving it. */
#define RECONCILE_LOCK_NAME ".ferry-reconciler.lock"
#define RECONCILE_ORPHAN_SUFFIX ".orphan"
/* A staging file whose name ends in this and the boot tag (boot.h) it was
 * made under holds a copy of committed data (a write open of a file with
 * content) not yet on stable storage: after a power loss any page of the
 * copy may read as zeros, so the file is whole only under the boot that
 * made it. Under another, neither process commits it: it is kept aside as
 * <name>.<time>.orphan without a record, and the file keeps its committed
 * content. */
#define STAGING_COPY_SUFFIX ".c"
/* For such a name ("<ino>-<fh>-<pid>-<serial>-s<seq>.c<tag>", maybe with
 * RECONCILE_ORPHAN_SUFFIX after it): its tag (a pointer into name) and in
 * run (BOOT_RUN_LEN + 1 bytes, boot.h) the run that made it, "<tag>-<pid>"
 * ("" if the name has no pid where staging names have it). NULL for a name
 * without a tag. */
const char *staging_copy_run(const char *name, char *run);

struct reconcile_job {
	uint64_t seq;                   /* per volume, increasing, 1 .. INT64_MAX */
	uint64_t ino;                   /* 1 .. INT64_MAX */
	uint64_t length;                /* the file's new length, <= RECONCILE_LENGTH_MAX */
	struct reconcile_range *dirty;  /* sorted, disjoint, non-empty, inside length; owned */
	size_t ndirty;                  /* 0: the whole file (unless size_only) */
	struct timespec mtime;
	int size_only;                  /* nothing to upload: only length and mtime */
	uint64_t meta_seq;              /* commit after the metadata journal's seq (0: none) */
	char name[RECONCILE_NAME_MAX + 1]; /* the staging file's name in the staging dir */
};

/* Frees the dirty array and zeroes the job. Accepts NULL. */
void reconcile_job_clear(struct reconcile_job *j);
/* 0 if name is a plain staging file name: 1..RECONCILE_NAME_MAX printable
 * ASCII bytes, no '/' or '\\', not starting with '.', not ending in ".job",
 * ".orphan" or ".tmp". -EINVAL otherwise. */
int reconcile_name_check(const char *name);
/* Checks every field (see struct reconcile_job). 0 or -EINVAL with why. */
int reconcile_job_check(const struct reconcile_job *j, char *err, size_t errlen);
/* The job as a Handoff message (checked first). */
int reconcile_job_encode(const struct reconcile_job *j, uint8_t **buf, size_t *len);
/* Decodes and checks a Handoff. -EBADMSG (undecodable, missing fields),
 * -EPROTONOSUPPORT (version), -EINVAL (bad values), -ENOMEM. */
int reconcile_job_decode(const uint8_t *buf, size_t len, struct reconcile_job *out, char *err,
			 size_t errlen);

/* ---- the journal ---- */

#define RECONCILE_JOB_SYNC 1u  /* fdatasync the record and fsync the directory */
/* Writes <j->name>.job in the directory dirfd, atomically (temp + rename). */
int reconcile_job_write(int dirfd, const struct reconcile_job *j, unsigned flags);
/* Reads the record job_file (a name in dirfd ending in ".job"): it must
 * decode, check, and name the staging file job_file is named after, i.e. be
 * "<name>.job" or "<name>.orphan.job". -ENOENT, -EINVAL, -EBADMSG, -EFBIG. */
int reconcile_job_read(int dirfd, const char *job_file, struct reconcile_job *out, char *err,
		       size_t errlen);
/* Removes <name>.job (a missing one is fine). */
int reconcile_job_remove(int dirfd, const char *name);

#define RECONCILE_JOB_XATTR "user.ferry.job"
/* Records j on its staging file fd (RECONCILE_JOB_XATTR); where that
 * cannot be done (no user xattrs on this file system, a record too large
 * for it), as reconcile_job_write(dirfd, j, 0). *in_xattr says which. */
int reconcile_job_attach(int dirfd, int fd, const struct reconcile_job *j, bool *in_xattr);
/* Removes the record attach made (a missing one is fine). */
int reconcile_job_detach(int dirfd, int fd, const char *name, bool in_xattr);
/* Removes every record of staging file `name` in dirfd, wherever it is
 * (its xattr, <name>.job); missing ones are fine. 0 or the first -errno. */
int reconcile_job_drop(int dirfd, const char *name);
/* Reads the record of staging file `name` in dirfd: its xattr (from fd if
 * fd >= 0, else from the file opened by name), else <name>.job. It must
 * name `name` (or, for "<x>.orphan", x). *in_xattr says where it was.
 * -ENOENT when there is neither; else as reconcile_job_read(). */
int reconcile_job_load(int dirfd, int fd, const char *name, struct reconcile_job *out,
		       bool *in_xattr, char *err, size_t errlen);
/* 1 if fd carries a record xattr, 0 if not, or -errno. */
int reconcile_job_attached(int fd);

/* ---- requests: ferry-mountd -> ferry-reconciler ---- */

enum reconcile_req_type {
	RECONCILE_REQ_HANDOFF = 1,  /* job; exactly one fd (the staging file) rides with it */
	RECONCILE_REQ_DRAIN,        /* upto_seq */
	RECONCILE_REQ_STATS,
	RECONCILE_REQ_DROP,         /* ino, upto_seq: the inode is gone (reconcile.proto's Drop) */
};

struct reconcile_request {
	enum reconcile_req_type type;
	struct reconcile_job job;
	uint64_t upto_seq;
	uint64_t ino;               /* RECONCILE_REQ_DROP */
};

/*
 * Decodes and checks one request that came with nfds fds: a Handoff needs
 * exactly one, the others none (-EBADF otherwise). Unknown request types are
 * -EOPNOTSUPP; other errors as reconcile_job_decode(). On failure *out holds
 * nothing to free.
 */
int reconcile_request_decode(const uint8_t *buf, size_t len, size_t nfds,
			     struct reconcile_request *out, char *err, size_t errlen);
void reconcile_request_clear(struct reconcile_request *r); /* accepts NULL */

/* ---- replies: ferry-reconciler -> ferry-mountd ---- */

enum reconcile_reply_type {
	RECONCILE_REPLY_COMMITTED = 1,
	RECONCILE_REPLY_DRAINED,
	RECONCILE_REPLY_STATS,
	RECONCILE_REPLY_ERROR,
	RECONCILE_REPLY_RETRYING,
};

struct reconcile_stats {
	uint64_t staging_blocks;   /* passthrough_staging_blocks */
	uint64_t staging_bytes;
	uint64_t inflight;
	uint64_t failures_total;
	uint64_t uploads_total;
	uint64_t upload_latency_count;
	uint64_t upload_latency_sum_us;
	uint64_t upload_latency_max_us;
	uint64_t orphans;
	uint64_t committed_total;
	uint64_t upload_bytes_total;
	uint64_t buffer_bytes;
	uint64_t waiting;          /* jobs not started yet (deferred or no slot) */
	uint64_t dropped_total;    /* jobs dropped unstarted (RECONCILE_REQ_DROP) */
};

/*
 * Cache seeds. A file written here is often read again soon (git status
 * re-reads files whose mtime is as new as its index, a build reads what
 * the step before wrote), and once its upload is committed its staging
 * file is gone: the read would fetch the object back from the store. So
 * for a small job (RECONCILE_SEED_JOB_MAX bytes or less, at most
 * RECONCILE_SEEDS_MAX objects) the reconciler also writes each stored
 * object's sealed bytes into ferry-mountd's read cache directory under
 * reconcile_seed_names()'s temporary name, and its Committed reply lists
 * them; ferry-mountd then moves each into its cache (counted against its
 * limit) or removes it. Temporary names contain ".tmp.", which the cache's
 * scan at start removes, so a seed whose reply was lost goes at the next
 * start. Larger files are read through their local copy instead.
 */
#define RECONCILE_SEEDS_MAX 8
#define RECONCILE_SEED_JOB_MAX (1u << 20)

struct reconcile_seed {
	uint64_t slice_id;
	uint32_t index, slice_size;
};

#define RECONCILE_SEED_SUFFIX ".tmp.seed"
#define RECONCILE_SEED_NAME_MAX (SLICE_KEY_MAX + sizeof(RECONCILE_SEED_SUFFIX))

/* The name the seed of object key has until ferry-mountd takes it: key
 * and RECONCILE_SEED_SUFFIX. false if tmp is too small. */
bool reconcile_seed_tmp_name(const char *key, char *tmp, size_t tmpcap);
/* The cache key of s (volume block size block_size) and its seed's name.
 * false if s names no object of a slice (index past its last object, id
 * or size 0) or a buffer is too small. */
bool reconcile_seed_names(const struct reconcile_seed *s, uint32_t block_size, char *key,
			  size_t keycap, char *tmp, size_t tmpcap);

struct reconcile_reply {
	enum reconcile_reply_type type;
	uint64_t seq, ino;            /* COMMITTED, RETRYING */
	int error;                    /* COMMITTED: 0 or -errno; ERROR, RETRYING: -errno */
	char message[RECONCILE_MSG_MAX]; /* COMMITTED, RETRYING (may be ""), ERROR */
	struct reconcile_seed seeds[RECONCILE_SEEDS_MAX]; /* COMMITTED with error 0 */
	uint32_t nseeds;
	uint64_t upto_seq, failed;    /* DRAINED */
	struct reconcile_stats stats; /* STATS */
};

int reconcile_reply_encode(const struct reconcile_reply *r, uint8_t **buf, size_t *len);
/* Into buf[0..cap) without allocating (RECONCILE_REPLY_MAX always does):
 * for a sender short of memory. -EMSGSIZE if it does not fit. */
#define RECONCILE_REPLY_MAX (RECONCILE_MSG_MAX + 512 + RECONCILE_SEEDS_MAX * 32)
int reconcile_reply_encode_to(const struct reconcile_reply *r, uint8_t *buf, size_t cap,
			      size_t *len);
int reconcile_reply_decode(const uint8_t *buf, size_t len, struct reconcile_reply *out,
			   char *err, size_t errlen);

/* ---- blocking client calls (ferry-mountd) ---- */

/* Connects to the reconciler's socket (SOCK_CLOEXEC). */
int reconcile_connect(const char *path, int *sock);
/* Sends a Handoff of j with the staging file's fd. The caller wrote the
 * journal record first (reconcile_job_write). */
int reconcile_handoff(int sock, const struct reconcile_job *j, int fd);
int reconcile_drain(int sock, uint64_t upto_seq);
/* Asks that ino's jobs up to upto_seq not yet started be dropped: its last
 * link is gone and nothing holds it open (reconcile.proto's Drop). */
int reconcile_drop(int sock, uint64_t ino, uint64_t upto_seq);
int reconcile_stats_query(int sock);
/* Receives the next reply (any kind: replies come in completion order).
 * -EPIPE when the reconciler closed the connection, -EBADMSG for a reply
 * that does not decode; then drop the connection. */
int reconcile_recv_reply(int sock, struct reconcile_reply *out);

#endif
