/*
 * ferry-reconciler: takes closed staging files from ferry-mountd over a Unix
 * socket (proto/reconcile.proto), uploads their bytes as immutable slice
 * objects and commits the slices and the new length in one metadata
 * transaction per job, then removes the staging file and its journal record.
 *
 * One libevent loop owns every structure below; worker threads (work.c) run
 * the blocking parts (staging reads, sealing, file:// puts, metadata
 * transactions) and hand results back to the loop. s3:// puts run on a
 * libcurl multi handle driven by the loop (upload.c, after curl's
 * hiperfifo.c). Files:
 *   main.c     options, start-up (journal scan), signals, shutdown
 *   jobs.c     jobs: per-inode order, attempts and backoff, commit, orphans,
 *              drains, the journal scan
 *   upload.c   the upload queue: buffer budget, --max-uploads, curl multi
 *   work.c     the worker thread pool
 *   control.c  the socket: connections, requests, replies
 *   metrics.c  figures: Stats replies and Prometheus text over evhttp
 */
#ifndef FERRY_RECONCILER_H
#define FERRY_RECONCILER_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/queue.h>
#include <sys/types.h>
#include <time.h>

#include <curl/curl.h>
#include <event2/event.h>

#include "boot.h"
#include "meta.h"
#include "objstore.h"
#include "reconcile_job.h"
#include "reconcile_plan.h"
#include "rpc_frame.h"

#define REC_GAUGE_BLOCK (4ull << 20)  /* passthrough_staging_blocks counts 4 MiB blocks */
#define REC_LAT_BUCKETS 12

struct rec;
struct conn;
struct job;

/* ---- work.c: a pool of threads running tasks for the loop ---- */

struct task {
	void (*run)(struct task *t);   /* on a worker thread */
	void (*done)(struct task *t);  /* back on the loop thread */
	bool cancelled;                /* at exit: done only frees, run may not have run */
	TAILQ_ENTRY(task) link;
};
TAILQ_HEAD(task_list, task);

int work_start(struct rec *r, unsigned nthreads);
void work_submit(struct rec *r, struct task *t);
/* Stops the threads once the running tasks end; queued tasks get their
 * done callback without having run (cancelled is then set). */
void work_stop(struct rec *r);

/* ---- jobs.c ---- */

enum job_state {
	JOB_QUEUED,     /* known, waiting for a start slot */
	JOB_PLANNING,   /* slice ids being allocated */
	JOB_UPLOADING,  /* objects queued or in flight */
	JOB_READY,      /* every object stored: waits for its turn on the inode */
	JOB_COMMITTING, /* metadata transaction running */
	JOB_BACKOFF,    /* an attempt failed; waiting to try again */
};

struct inode_q {
	uint64_t ino;
	TAILQ_HEAD(, job) jobs;        /* unfinished jobs of ino, by seq */
	struct inode_q *hnext;
};

struct job {
	struct rec *r;
	struct reconcile_job rj;       /* the record: seq, ino, length, ranges, mtime, name */
	char file[RECONCILE_NAME_MAX + 16];    /* staging file on disk: name or name.orphan */
	char jobfile[RECONCILE_NAME_MAX + 24]; /* its record: file.job */
	bool rec_xattr;                /* no file.job: the record is the file's xattr */
	bool orphan;                   /* retried from <name>.orphan.job */
	int fd;                        /* staging file, -1 until opened */
	struct conn *conn;             /* gets the Committed reply; NULL: from the journal */
	enum job_state state;
	bool started;                  /* counted in r->nactive */
	bool fd_waiting;               /* counted in r->waiting_fds */
	bool on_ready;                 /* on r->ready */
	int64_t added_ns;              /* CLOCK_MONOTONIC when it was added */
	struct reconcile_plan plan;
	uint64_t *done;                /* bitmap of stored objects */
	uint64_t ndone;
	uint64_t next_obj;             /* next object to queue in this attempt */
	unsigned in_flight;            /* objects of this job queued at workers or curl */
	unsigned attempt;              /* failed attempts so far (lack of memory aside) */
	unsigned nomem;                /* attempts that failed for want of memory */
	unsigned full;                 /* attempts that failed for want of disk space */
	bool timer_lost;               /* in backoff, but its timer could not be set */
	int err;                       /* first error of the current attempt */
	char errmsg[256];
	struct event *timer;           /* backoff */
	uint64_t blocks, bytes;        /* what it adds to the staging gauges */
	bool feeding;                  /* on r->feed */
	bool parked;                   /* behind a dead mount's journal: left for the next run */
	/* Objects (by plan index, all below RECONCILE_SEEDS_MAX) whose seed
	 * file is in the cache directory and still ours: the Committed reply
	 * hands them to ferry-mountd, job_free removes the rest. */
	uint8_t seeded;
	struct inode_q *iq;
	TAILQ_ENTRY(job) iq_link;
	TAILQ_ENTRY(job) all_link;     /* r->all: every unfinished job, by seq */
	TAILQ_ENTRY(job) ready_link;   /* r->ready: waiting to start, by seq */
	TAILQ_ENTRY(job) feed_link;    /* r->feed: has objects left to queue */
	TAILQ_ENTRY(job) commit_link;  /* r->commitq: uploaded, waiting for a commit batch */
	struct job *hnext;             /* r->by_name chain */
};
TAILQ_HEAD(job_list, job);

/* ---- seeds.c: cache seeds (reconcile_job.h) ---- */
/* Removes the seeds an earlier reconciler left (at start, before any job). */
void seeds_sweep(struct rec *r);
/* Object obj of j (key: its key) gets a seed: j is small, has a sender to
 * tell, and the object has none yet. Fills tmp with the seed's name. */
bool seeds_wanted(const struct rec *r, const struct job *j, uint64_t obj, const char *key,
		  char *tmp, size_t tmpcap);
/* On a worker: writes the sealed bytes (data and trailer) of the object
 * key as its seed tmp. false: no seed (a failure costs only the seed). */
bool seeds_write(struct rec *r, const char *key, const char *tmp, const void *sealed, size_t len);
/* Lists j's seeds in rep (a Committed reply with error 0). */
void seeds_list(const struct job *j, struct reconcile_reply *rep);
/* Removes the seed files still j's. */
void seeds_remove(struct rec *r, struct job *j);

/* Adds a job (from a handoff, conn set, or from the journal). Takes rj's
 * contents and fd. rec_xattr: its record is the staging file's xattr, not
 * file.job. Returns 0 or -ENOMEM. */
int jobs_add(struct rec *r, struct reconcile_job *rj, int fd, const char *file, bool orphan,
	     bool rec_xattr, struct conn *conn);
struct job *jobs_find_name(struct rec *r, const char *name);
/* ino was deleted (RECONCILE_REQ_DROP from c): its jobs with seq <=
 * upto_seq that c handed over and that have not started end now,
 * -ECANCELED, their files removed; the others go on (the deletion frees
 * what they store once they commit). */
void jobs_drop(struct rec *r, struct conn *c, uint64_t ino, uint64_t upto_seq);
/* A job that finished recently (name and seq): its result, or false. */
bool jobs_recent(struct rec *r, const char *name, uint64_t seq, int *err);
/* Scans the staging directory for records not yet known; at_start: also
 * orphans, and no age limit. Returns how many jobs it added. */
size_t jobs_scan(struct rec *r, bool at_start, time_t min_age);
/* Starts ready jobs that are due (see start_due in jobs.c): after a
 * deferral ends, a drain, or at shutdown. */
void jobs_start_ready(struct rec *r);
/* Called by upload.c when one object of j is done (rc 0: stored). */
void jobs_object_done(struct rec *r, struct job *j, uint64_t obj, int rc, const char *why);
/* Drain requests: the reply comes once every job up to upto finished;
 * meanwhile commits go without waiting for company. */
int jobs_drain_add(struct rec *r, struct conn *c, uint64_t upto);
void jobs_conn_gone(struct rec *r, struct conn *c);
/* At exit: frees every job (their records stay on disk). */
void jobs_free_all(struct rec *r);
/* Logs each unfinished job (shutdown gave up). */
void jobs_log_left(struct rec *r);
/* Starts the backoff timers that could not be set for want of memory. */
void jobs_retry_lost_timers(struct rec *r);

/* ---- upload.c ---- */

int upload_init(struct rec *r);
void upload_fini(struct rec *r);
/* Queues objects of jobs on r->feed while slots and buffer room last. */
void upload_feed(struct rec *r);

/* ---- control.c ---- */

int control_listen(struct rec *r);
void control_stop_listening(struct rec *r);
void control_close_all(struct rec *r);
void conn_ref(struct conn *c);
void conn_unref(struct conn *c);
/* Sends a reply if the connection is still open. true: it is queued (or
 * waits for memory to be), false: it is dropped. */
bool conn_reply(struct rec *r, struct conn *c, const struct reconcile_reply *rep);
/* Stops/resumes reading requests (too many jobs known). */
void control_throttle(struct rec *r, bool on);

/* ---- metrics.c ---- */

int metrics_start(struct rec *r);
void metrics_stop(struct rec *r);
void metrics_snapshot(struct rec *r, struct reconcile_stats *s);
void metrics_upload_latency(struct rec *r, uint64_t us);

/* ---- the daemon ---- */

struct rec_config {
	char *db_path;
	char *vol_dir;
	char *staging_dir;
	char *socket_path;
	unsigned max_uploads;
	uint64_t buffer_bytes;
	char *metrics_addr;          /* NULL: no metrics */
	int metrics_port;
	bool foreground;
	unsigned retries;            /* attempts before a job is kept as .orphan */
	unsigned retry_delay_ms;     /* first delay; each next one is 4 times longer */
	unsigned shutdown_timeout_s; /* without progress, before giving up at exit */
	unsigned max_jobs;           /* stop reading requests above this many */
	unsigned max_active;         /* jobs started at once */
	unsigned rescan_s;           /* journal rescan period */
	unsigned commit_window_ms;   /* a commit waits this long for company */
	/* A handed-over job waits while ferry-mountd keeps handing others
	 * over (a burst of writes), until upload_quiet_ms pass without one,
	 * or upload_delay_max_ms after its own handoff; 0: no waiting. */
	unsigned upload_quiet_ms;
	unsigned upload_delay_max_ms;
	char *cache_dir;             /* ferry-mountd's read cache (seeds); NULL: none */
};

struct rec_counters {
	uint64_t staging_blocks, staging_bytes;
	uint64_t failures_total;
	uint64_t uploads_total, upload_bytes_total;
	uint64_t committed_total;
	uint64_t dropped_total;        /* jobs_drop() */
	uint64_t orphans;
	uint64_t lat_count, lat_sum_us, lat_max_us;
	uint64_t lat_bucket[REC_LAT_BUCKETS + 1];
};

struct recent {
	char name[RECONCILE_NAME_MAX + 1];
	uint64_t seq;
	int err;
};
#define REC_RECENT 1024

struct drain_wait {
	struct conn *conn;
	uint64_t upto;
	TAILQ_ENTRY(drain_wait) link;
};

struct rec {
	struct rec_config cfg;
	struct event_base *base;
	struct meta *meta;
	struct meta_volume vol;
	struct objstore *store;
	bool async_store;            /* s3: puts on the curl multi */
	int staging_fd;
	int cache_fd;                /* cfg.cache_dir, -1: no seeds */
	char boot_tag[BOOT_TAG_LEN + 1]; /* this boot's, read at start; "" unknown */
	int lock_fd;

	/* jobs */
	struct job_list all, ready, feed;
	size_t nready;               /* jobs on ready, and their bytes */
	uint64_t ready_bytes;
	int64_t last_handoff_ns;     /* CLOCK_MONOTONIC of the latest handoff */
	struct event *defer_timer;   /* looks at ready again when a deferral ends */
	bool defer_armed;
	struct job_list commitq;     /* JOB_COMMITTING, not yet in a batch */
	size_t ncommitq;
	bool committing;             /* a commit batch is at a worker */
	struct event *commit_timer;  /* ends the commit window (NULL: none yet) */
	bool commit_window_armed;    /* commit_timer is pending */
	bool commit_window_over;     /* the oldest job on commitq waited long enough */
	size_t commit_batch;         /* jobs per commit batch now (0: the most) */
	uint64_t slice_ids_next, slice_ids_end; /* allocated, not yet used: [next, end) */
	struct job **by_name;        /* hash: name -> job */
	struct inode_q **by_ino;     /* hash: ino -> queue */
	size_t nbuckets;
	size_t njobs, nactive;
	/* Jobs not started yet that keep the fd their handoff brought, and
	 * the most that may (from RLIMIT_NOFILE, at start; see jobs_add). */
	size_t waiting_fds, waiting_fds_max;
	struct recent recent[REC_RECENT];
	size_t nrecent;
	uint64_t *orphan_seqs;       /* seqs of jobs given up this run */
	size_t timers_lost;          /* jobs with timer_lost set */
	bool scan_again_at_start;    /* the start's journal scan ran short of memory */
	size_t norphan_seqs;
	TAILQ_HEAD(, drain_wait) drains;

	/* uploads */
	unsigned uploads_in_flight;
	uint64_t buffer_used;
	CURLM *multi;
	struct event *curl_timer;
	unsigned curl_running;

	/* workers */
	pthread_t *threads;
	unsigned nthreads;
	pthread_mutex_t work_lock;
	pthread_cond_t work_cond;
	struct task_list work_q, done_q;
	bool work_stopping;
	struct event *work_done_ev;
	unsigned tasks_out;          /* submitted, done callback not run yet */

	/* control */
	int listen_fd;
	struct event *listen_ev;
	TAILQ_HEAD(, conn) conns;
	bool throttled;

	/* metrics */
	struct evhttp *http;
	struct rec_counters c;

	/* shutdown */
	bool stopping;
	/* The ferry-mountd that started us is dead (rec_mount_gone): a
	 * commit that waits for its metadata journal can only go through
	 * after its next start replays that journal, and that start waits
	 * for us to exit. Such jobs are parked (left journaled) at once. */
	bool mount_gone;
	pid_t parent_pid;            /* getppid() at start */
	bool leaving;                /* rec_check_done() ended the loop for parked jobs */
	struct timespec last_progress;
	struct event *rescan_ev;
	int exit_code;
};

/* Something moved forward (the shutdown deadline restarts from now). */
void rec_progress(struct rec *r);
/* The process that started us is gone (sticky). */
bool rec_mount_gone(struct rec *r);
/* Checks whether a stopping daemon is done (then leaves the loop). */
void rec_check_done(struct rec *r);
/* Jobs that cannot move until the next ferry-mountd starts: parked, or
 * waiting for their turn behind a parked one (jobs.c). */
size_t jobs_stuck_behind_parked(struct rec *r);

#endif
