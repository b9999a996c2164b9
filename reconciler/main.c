/*
 * ferry-reconciler main: options -> (detach) -> volume, store, staging
 * directory and its lock -> workers, curl multi, journal scan -> socket and
 * metrics -> loop; SIGTERM/SIGINT stop taking handoffs and finish what is
 * known, with a deadline that restarts whenever something moves forward.
 * Torn down in reverse.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <event2/thread.h>

#include "aws_creds.h"
#include "fd_limit.h"
#include "heap_trim.h"
#include "log.h"
#include "objstore_async.h"
#include "reconciler.h"
#include "staging_owner.h"
#include "url.h"

#define LOCK_NAME RECONCILE_LOCK_NAME

static void usage(FILE *f)
{
	fprintf(f,
		"usage: ferry-reconciler --volume VOLUME --staging-dir DIR --socket PATH [options]\n"
		"\n"
		"Takes closed staging files from ferry-mountd over the Unix socket PATH, uploads\n"
		"their bytes into the volume's object store as slices (storage URL and block\n"
		"size come from the volume record) and commits the slices and the new length\n"
		"in one metadata transaction per file. Every job handed over is journaled in\n"
		"DIR as <name>.job by the sender; at start-up each journaled job is finished,\n"
		"in sequence order, and jobs given up before (<name>.orphan) are tried again.\n"
		"A job that keeps failing is kept as <name>.orphan, never deleted.\n"
		"\n"
		"  --volume VOLUME         a volume directory, sqlite:///abs/path/meta.db or\n"
		"                          postgresql://...?volume=NAME\n"
		"  --staging-dir DIR       the staging directory ferry-mountd hands files from\n"
		"  --socket PATH           listen here (mode 0600; peers must run as our uid or root)\n"
		"  --max-uploads N         objects being stored at once (default 8)\n"
		"  --buffer-mib N          memory for object buffers; uploads wait for room\n"
		"                          (default 64)\n"
		"  --metrics ADDR:PORT     Prometheus text at http://ADDR:PORT/metrics; ADDR is an\n"
		"                          IP address (e.g. 127.0.0.1:9464, [::1]:9464); port 0 picks\n"
		"                          one and logs it\n"
		"  --cache-dir DIR         ferry-mountd's read cache directory: the objects of files\n"
		"                          of 1 MiB or less are also written there as they are\n"
		"                          stored, for ferry-mountd to take at the commit\n"
		"  --retries N             attempts before a job is kept as .orphan (default 5)\n"
		"  --retry-delay MS        wait after the first failed attempt; each next wait is\n"
		"                          4 times longer, at most 300 s (default 1000)\n"
		"  --commit-window-ms MS   a finished upload waits up to MS for others to commit\n"
		"                          with it, unless a drain (fsync, unmount) waits\n"
		"                          (default 50; 0: commit at once)\n"
		"  --upload-quiet-ms MS    a handed-over file waits while others keep coming, until\n"
		"                          MS pass without one (default 100; 0: start at once);\n"
		"                          a drain (fsync, unmount, ferry drain) ends every wait\n"
		"  --upload-delay-max-ms MS  ... but no longer than MS after its own handoff\n"
		"                          (default 5000)\n"
		"  --lease-epoch N         commit only while the writer's lease of the volume is\n"
		"                          at epoch N (ferry-mountd's; a takeover fences us)\n"
		"  --shutdown-timeout SEC  on SIGTERM/SIGINT, give up after SEC seconds without\n"
		"                          progress; what is left stays journaled (default 60)\n"
		"  -f, --foreground        stay attached (otherwise return once serving)\n"
		"  -d, --debug             debug logging\n"
		"  -h, --help              this text\n"
		"  -V, --version           print the version\n"
		"\n"
		"Exit status: 0 after a clean stop, 1 if it could not start or gave up at a stop\n"
		"(the log lists the unfinished jobs), 2 for a usage error.\n");
}

static struct rec rec_;
static int ready_fd = -1;

/* Tells the parent (not in the foreground) how the start went, once. */
static void ready_report(const char *msg)
{
	if (ready_fd < 0)
		return;
	dprintf(ready_fd, "%s\n", msg);
	close(ready_fd);
	ready_fd = -1;
}

static _Noreturn void start_failed(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void start_failed(const char *fmt, ...)
{
	char msg[1024];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	log_warnx("error: %s", msg);
	ready_report(msg);
	exit(1);
}

static unsigned long parse_num(const char *opt, const char *s, unsigned long lo, unsigned long hi)
{
	char *end;
	unsigned long v;

	errno = 0;
	v = strtoul(s, &end, 10);
	if (errno || end == s || *end || *s == '-' || v < lo || v > hi) {
		fprintf(stderr, "ferry-reconciler: %s %s: give a number from %lu to %lu\n", opt, s,
			lo, hi);
		exit(2);
	}
	return v;
}

/* ADDR:PORT with ADDR an IPv4 literal, or [IPv6]:PORT. */
static void parse_metrics(struct rec_config *cfg, const char *s)
{
	char addr[64];
	const char *colon;
	unsigned char tmp[16];
	size_t n;

	if (s[0] == '[') {
		const char *rb = strchr(s, ']');
		if (!rb || rb[1] != ':')
			goto bad;
		n = (size_t)(rb - s - 1);
		if (n >= sizeof(addr))
			goto bad;
		memcpy(addr, s + 1, n);
		addr[n] = '\0';
		colon = rb + 1;
		if (inet_pton(AF_INET6, addr, tmp) != 1)
			goto bad;
	} else {
		colon = strrchr(s, ':');
		if (!colon || (size_t)(colon - s) >= sizeof(addr))
			goto bad;
		n = (size_t)(colon - s);
		memcpy(addr, s, n);
		addr[n] = '\0';
		if (inet_pton(AF_INET, addr, tmp) != 1)
			goto bad;
	}
	cfg->metrics_port = (int)parse_num("--metrics port", colon + 1, 0, 65535);
	cfg->metrics_addr = strdup(addr);
	return;
bad:
	fprintf(stderr, "ferry-reconciler: --metrics %s: give IPADDR:PORT (e.g. 127.0.0.1:9464)\n",
		s);
	exit(2);
}

static char *abs_path(const char *p)
{
	char *r = realpath(p, NULL);
	return r ? r : strdup(p);
}

/*
 * How many waiting jobs may keep their staging file's fd (see jobs_add):
 * the fd limit less what the jobs started at once may open (their staging
 * file, an object being written, the directory a batch syncs) and room for
 * the rest (the database, connections, the log, the cache).
 */
static void waiting_fds_fit(struct rec *r)
{
	size_t reserve = (size_t)r->cfg.max_active * 3 + 256;
	long limit = fd_limit_soft();

	r->waiting_fds_max = SIZE_MAX;
	if (limit < 0)
		return;
	r->waiting_fds_max = (size_t)limit > reserve ? (size_t)limit - reserve : 0;
	if (r->waiting_fds_max < r->cfg.max_jobs)
		log_info("RLIMIT_NOFILE is %llu: at most %zu waiting jobs keep their staging "
			 "file open, the others open it by name when they start",
			 (unsigned long long)limit, r->waiting_fds_max);
}

/* Forks; the parent returns the child's start-up verdict as its exit. */
static void detach(void)
{
	int p[2];
	pid_t pid;
	char buf[1100];
	ssize_t n, got = 0;

	if (pipe2(p, O_CLOEXEC) < 0)
		fatal("pipe");
	pid = fork();
	if (pid < 0)
		fatal("fork");
	if (pid > 0) {
		close(p[1]);
		while ((n = read(p[0], buf + got, sizeof(buf) - 1 - (size_t)got)) > 0 ||
		       (n < 0 && errno == EINTR))
			if (n > 0)
				got += n;
		buf[got] = '\0';
		if (strcmp(buf, "ok\n") == 0)
			_exit(0);
		fprintf(stderr, "ferry-reconciler: %s", got ? buf : "exited while starting\n");
		_exit(1);
	}
	close(p[0]);
	ready_fd = p[1];
	setsid();
}

void rec_progress(struct rec *r)
{
	clock_gettime(CLOCK_MONOTONIC, &r->last_progress);
}

bool rec_mount_gone(struct rec *r)
{
	/* Reparented: every thread of the process that started us ended (a
	 * SIGHUP alone says only that one did, the one that forked us). */
	if (!r->mount_gone && r->parent_pid > 1 && getppid() != r->parent_pid)
		r->mount_gone = true;
	return r->mount_gone;
}

void rec_check_done(struct rec *r)
{
	size_t stuck;

	if (!r->stopping || r->tasks_out != 0 || r->uploads_in_flight != 0)
		return;
	if (r->njobs == 0) {
		event_base_loopexit(r->base, NULL);
		return;
	}
	if (r->leaving || !rec_mount_gone(r) || (stuck = jobs_stuck_behind_parked(r)) < r->njobs)
		return;
	r->leaving = true;
	log_info("the %zu jobs left cannot commit here (they wait for the metadata journal of a "
		 "ferry-mountd that is gone, or its lease went to a newer mount): they stay "
		 "journaled for the next start", stuck);
	r->exit_code = 1;
	event_base_loopexit(r->base, NULL);
}

static void deadline_cb(evutil_socket_t fd, short what, void *arg)
{
	struct rec *r = arg;
	struct timespec now;

	clock_gettime(CLOCK_MONOTONIC, &now);
	if (now.tv_sec - r->last_progress.tv_sec < (time_t)r->cfg.shutdown_timeout_s)
		return;
	log_warnx("error: no progress for %u s while stopping: giving up with %zu jobs unfinished",
		  r->cfg.shutdown_timeout_s, r->njobs);
	jobs_log_left(r);
	r->exit_code = 1;
	event_base_loopexit(r->base, NULL);
}

static struct event *deadline_ev;

static void signal_cb(evutil_socket_t sig, short what, void *arg)
{
	struct rec *r = arg;
	struct timeval sec = { 1, 0 };

	if (r->stopping) {
		if (sig == SIGHUP) {
			/* Another thread of the mount's ended, maybe its last. */
			rec_check_done(r);
			return; /* stopping already */
		}
		log_warnx("error: signal %d again: stopping now with %zu jobs unfinished", (int)sig,
			  r->njobs);
		jobs_log_left(r);
		r->exit_code = 1;
		event_base_loopexit(r->base, NULL);
		return;
	}
	r->stopping = true;
	log_info("signal %d: no new handoffs; finishing %zu jobs (giving up after %u s without "
		 "progress)", (int)sig, r->njobs, r->cfg.shutdown_timeout_s);
	control_stop_listening(r);
	if (r->rescan_ev)
		event_del(r->rescan_ev);
	rec_progress(r);
	jobs_start_ready(r); /* deferred ones too: nobody writes any more */
	deadline_ev = event_new(r->base, -1, EV_PERSIST, deadline_cb, r);
	if (deadline_ev)
		event_add(deadline_ev, &sec);
	rec_check_done(r);
}

static void rescan_cb(evutil_socket_t fd, short what, void *arg)
{
	struct rec *r = arg;

	jobs_retry_lost_timers(r);
	if (r->scan_again_at_start) {
		/* What the start's scan found no memory for, orphans included. */
		r->scan_again_at_start = false;
		jobs_scan(r, true, 0);
		return;
	}
	/* Records a sender wrote but never handed over (it died in between);
	 * young ones are probably on their way. */
	jobs_scan(r, false, 10);
}

int main(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "volume", required_argument, NULL, 'v' },
		{ "staging-dir", required_argument, NULL, 's' },
		{ "socket", required_argument, NULL, 'S' },
		{ "max-uploads", required_argument, NULL, 'u' },
		{ "commit-window-ms", required_argument, NULL, 'w' },
		{ "upload-quiet-ms", required_argument, NULL, 'q' },
		{ "upload-delay-max-ms", required_argument, NULL, 'D' },
		{ "buffer-mib", required_argument, NULL, 'b' },
		{ "metrics", required_argument, NULL, 'm' },
		{ "retries", required_argument, NULL, 'r' },
		{ "retry-delay", required_argument, NULL, 'R' },
		{ "shutdown-timeout", required_argument, NULL, 't' },
		{ "lease-epoch", required_argument, NULL, 'E' },
		{ "cache-dir", required_argument, NULL, 'c' },
		{ "foreground", no_argument, NULL, 'f' },
		{ "debug", no_argument, NULL, 'd' },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },
		{ NULL, 0, NULL, 0 },
	};
	struct rec *r = &rec_;
	struct rec_config *cfg = &r->cfg;
	struct store_url surl = { 0 };
	struct event *sigterm = NULL, *sigint = NULL, *sighup = NULL;
	struct statfs sfs;
	char err[512], *volume = NULL;
	struct aws_creds_info creds;
	struct objstore_opts store_opts = { .creds_report = log_warnx_report };
	uint64_t lease_epoch = 0;
	int opt, rc, pid_fd;

	r->staging_fd = r->lock_fd = r->listen_fd = r->cache_fd = -1;
	TAILQ_INIT(&r->all);
	TAILQ_INIT(&r->ready);
	TAILQ_INIT(&r->feed);
	TAILQ_INIT(&r->commitq);
	TAILQ_INIT(&r->drains);
	TAILQ_INIT(&r->conns);
	cfg->max_uploads = 8;
	cfg->buffer_bytes = 64ull << 20;
	cfg->retries = 5;
	cfg->retry_delay_ms = 1000;
	cfg->shutdown_timeout_s = 60;
	cfg->max_jobs = 16384;
	cfg->rescan_s = 30;
	cfg->commit_window_ms = 50;
	cfg->upload_quiet_ms = 100;
	cfg->upload_delay_max_ms = 5000;
	log_init("ferry-reconciler", LOG_LVL_INFO);

	while ((opt = getopt_long(argc, argv, "fdhV", longopts, NULL)) != -1) {
		switch (opt) {
		case 'v': volume = optarg; break;
		case 's': free(cfg->staging_dir); cfg->staging_dir = abs_path(optarg); break;
		case 'S': free(cfg->socket_path); cfg->socket_path = abs_path(optarg); break;
		case 'u': cfg->max_uploads = (unsigned)parse_num("--max-uploads", optarg, 1, 1024); break;
		case 'b': cfg->buffer_bytes = (uint64_t)parse_num("--buffer-mib", optarg, 1, 1u << 20) << 20; break;
		case 'm': free(cfg->metrics_addr); parse_metrics(cfg, optarg); break;
		case 'r': cfg->retries = (unsigned)parse_num("--retries", optarg, 1, 1000); break;
		case 'R': cfg->retry_delay_ms = (unsigned)parse_num("--retry-delay", optarg, 1, 3600000); break;
		case 'w': cfg->commit_window_ms = (unsigned)parse_num("--commit-window-ms", optarg, 0, 3600000); break;
		case 'q': cfg->upload_quiet_ms = (unsigned)parse_num("--upload-quiet-ms", optarg, 0, 600000); break;
		case 'D': cfg->upload_delay_max_ms = (unsigned)parse_num("--upload-delay-max-ms", optarg, 0, 3600000); break;
		case 't': cfg->shutdown_timeout_s = (unsigned)parse_num("--shutdown-timeout", optarg, 1, 86400); break;
		case 'c': free(cfg->cache_dir); cfg->cache_dir = abs_path(optarg); break;
		case 'E': lease_epoch = (uint64_t)parse_num("--lease-epoch", optarg, 1, INT64_MAX); break;
		case 'f': cfg->foreground = true; break;
		case 'd': log_set_level(LOG_LVL_DEBUG); break;
		case 'h': usage(stdout); return 0;
		case 'V': printf("ferry-reconciler 0.1.0\n"); return 0;
		default: usage(stderr); return 2;
		}
	}
	if (optind != argc || !volume || !cfg->staging_dir || !cfg->socket_path) {
		fprintf(stderr, "ferry-reconciler: --volume, --staging-dir and --socket are needed%s\n",
			optind != argc ? " (and no other arguments)" : "");
		usage(stderr);
		return 2;
	}
	cfg->max_active = cfg->max_uploads * 4 < 64 ? 64 : cfg->max_uploads * 4;
	if (meta_url_parse(volume, &cfg->db_path, &cfg->vol_dir, err, sizeof(err)) < 0) {
		fprintf(stderr, "ferry-reconciler: volume %s: %s\n", volume, err);
		return 2;
	}
	if (!cfg->foreground)
		detach();
	signal(SIGPIPE, SIG_IGN);
	/* A detached one's parent exits at once: it has no mount to lose. */
	r->parent_pid = cfg->foreground ? getppid() : 0;
	fd_limit_raise();
	waiting_fds_fit(r);
	heap_trim_threshold_raise();

	/* The volume. */
	rc = meta_open(cfg->db_path, &r->meta);
	if (rc == -ENOENT)
		start_failed("no ferryfs volume at %s (run `ferry format` first)", volume);
	if (rc < 0)
		start_failed("cannot open volume %s: %s", cfg->db_path, strerror(-rc));
	/* Commits are synced by meta_sync() before a staging file goes, with no
	 * database lock held during the sync (ferry-mountd's creates go on). */
	if ((rc = meta_set_batched(r->meta, 1)) < 0)
		start_failed("cannot start the metadata checkpointer: %s", strerror(-rc));
	/* Commits only while the mount that started us holds the lease. */
	if (lease_epoch)
		meta_lease_fence(r->meta, lease_epoch);
	if ((rc = meta_volume_get(r->meta, &r->vol)) < 0)
		start_failed("cannot read the volume record of %s: %s", cfg->db_path, strerror(-rc));
	if (store_url_parse(r->vol.storage_url, r->vol.s3_http, &surl, err, sizeof(err)) < 0)
		start_failed("volume storage %s: %s", r->vol.storage_url, err);
	if ((rc = objstore_open(&surl, &store_opts, &r->store, err, sizeof(err))) < 0)
		start_failed("storage %s: %s", r->vol.storage_url, err);
	if (objstore_creds_info(r->store, &creds) == 0)
		log_info("s3 credentials from %s", creds.source);
	r->async_store = objstore_async_capable(r->store);
	/* Every commit batch syncs the objects it names first (commit_run). */
	objstore_defer_durability(r->store);
	/* An unreachable store is not fatal: jobs wait and retry. */
	if ((rc = objstore_check(r->store, surl.kind == STORE_FILE)) < 0)
		log_warnx("storage %s is not usable now: %s (%s); jobs will retry",
			  r->vol.storage_url, strerror(-rc), objstore_last_error());

	/* The staging directory, ours alone. */
	if (mkdir(cfg->staging_dir, 0700) < 0 && errno != EEXIST)
		start_failed("staging directory %s: %s", cfg->staging_dir, strerror(errno));
	r->staging_fd = open(cfg->staging_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (r->staging_fd < 0)
		start_failed("staging directory %s: %s", cfg->staging_dir, strerror(errno));
	if (fstatfs(r->staging_fd, &sfs) == 0 && sfs.f_type == 0x65735546 /* FUSE */)
		start_failed("staging directory %s is on a FUSE filesystem", cfg->staging_dir);
	/* Seeds are a help, not a duty: without the directory there are none. */
	if (cfg->cache_dir &&
	    (r->cache_fd = open(cfg->cache_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0)
		log_warnx("read cache directory %s: %s; small files are not put in the read cache "
			  "as they are uploaded", cfg->cache_dir, strerror(errno));
	/* Before any job in it is looked at: another volume's are not ours to
	 * commit (staging_owner.h). */
	char other[64];
	rc = staging_owner_claim(r->staging_fd, r->vol.uuid, other, sizeof(other));
	if (rc == -EEXIST)
		start_failed("staging directory %s belongs to volume %s, not to this one (%s): give "
			     "each volume its own staging directory (if that volume is gone for "
			     "good, empty the directory, %s/%s included)", cfg->staging_dir, other,
			     r->vol.uuid, cfg->staging_dir, STAGING_OWNER_NAME);
	if (staging_owner_unwritable(rc))
		log_warnx("cannot record volume %s as the owner of staging directory %s: %s",
			  r->vol.uuid, cfg->staging_dir, strerror(-rc));
	else if (rc < 0)
		start_failed("staging directory %s: %s/%s: %s%s", cfg->staging_dir,
			     cfg->staging_dir, STAGING_OWNER_NAME,
			     rc == -EBADMSG ? "names no volume: " : strerror(-rc),
			     rc == -EBADMSG ? other : "");
	/* Read once: a later failure to read it must not make this boot's
	 * copies look like another's (jobs_scan()). */
	if (!boot_tag(r->boot_tag))
		log_warnx("cannot read this boot's id (/proc/sys/kernel/random/boot_id): jobs of "
			  "copies into staging files (%s) are left for a start that can",
			  STAGING_COPY_SUFFIX);
	/* The lock is held on a read-only open: a file kept open for writing
	 * makes the kernel refuse to remount the staging file system
	 * read-only (EBUSY), and an idle reconciler has no reason to. flock(),
	 * unlike a POSIX write lock, needs no write access. The pid goes in
	 * through a short-lived write open, once the lock is ours. */
	r->lock_fd = openat(r->staging_fd, LOCK_NAME, O_RDONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW,
			    0600);
	if (r->lock_fd < 0)
		start_failed("cannot create %s/%s: %s", cfg->staging_dir, LOCK_NAME, strerror(errno));
	if (flock(r->lock_fd, LOCK_EX | LOCK_NB) < 0)
		start_failed("another ferry-reconciler serves %s", cfg->staging_dir);
	pid_fd = openat(r->staging_fd, LOCK_NAME, O_WRONLY | O_TRUNC | O_CLOEXEC | O_NOFOLLOW);
	if (pid_fd >= 0) {
		dprintf(pid_fd, "%d\n", (int)getpid());
		close(pid_fd);
	}
	/* Ours alone now (the lock): no seed an earlier reconciler left is
	 * anybody's. */
	seeds_sweep(r);

	/* The machinery. */
	if (evthread_use_pthreads() < 0)
		start_failed("libevent has no thread support");
	r->nbuckets = 4096;
	r->by_name = calloc(r->nbuckets, sizeof(*r->by_name));
	r->by_ino = calloc(r->nbuckets, sizeof(*r->by_ino));
	r->base = event_base_new();
	if (!r->base || !r->by_name || !r->by_ino)
		start_failed("out of memory");
	rc = work_start(r, cfg->max_uploads < 2 ? 2 : cfg->max_uploads > 16 ? 16 : cfg->max_uploads);
	if (rc < 0)
		start_failed("cannot start worker threads: %s", strerror(-rc));
	if ((rc = upload_init(r)) < 0)
		start_failed("cannot set up uploads: %s", strerror(-rc));

	/* What the journal lists comes first. */
	jobs_scan(r, true, 0);

	if ((rc = control_listen(r)) < 0)
		start_failed(rc == -EADDRINUSE ? "%s: another reconciler answers there"
					       : "cannot listen on %s: %s",
			     cfg->socket_path, strerror(-rc));
	if ((rc = metrics_start(r)) < 0)
		start_failed("cannot serve metrics on %s:%d: %s", cfg->metrics_addr,
			     cfg->metrics_port, strerror(-rc));
	sigterm = evsignal_new(r->base, SIGTERM, signal_cb, r);
	sigint = evsignal_new(r->base, SIGINT, signal_cb, r);
	/* The mount's daemon died (PR_SET_PDEATHSIG): as SIGTERM, once. */
	sighup = evsignal_new(r->base, SIGHUP, signal_cb, r);
	r->rescan_ev = event_new(r->base, -1, EV_PERSIST, rescan_cb, r);
	if (!sigterm || !sigint || !sighup || !r->rescan_ev || evsignal_add(sigterm, NULL) < 0 ||
	    evsignal_add(sigint, NULL) < 0 || evsignal_add(sighup, NULL) < 0 ||
	    event_add(r->rescan_ev, &(struct timeval){ cfg->rescan_s, 0 }) < 0)
		start_failed("cannot set up signals and timers");
	log_info("serving volume %s (%s, block size %u) on %s, staging %s, %u uploads, %llu MiB "
		 "of buffers", r->vol.uuid, r->vol.storage_url, r->vol.block_size, cfg->socket_path,
		 cfg->staging_dir, cfg->max_uploads, (unsigned long long)(cfg->buffer_bytes >> 20));
	if (!cfg->foreground) {
		int null = open("/dev/null", O_RDWR | O_CLOEXEC);
		if (null >= 0) {
			dup2(null, STDIN_FILENO);
			dup2(null, STDOUT_FILENO);
			close(null);
		}
	}
	ready_report("ok");

	event_base_dispatch(r->base);

	/* Teardown, in reverse. */
	control_stop_listening(r);
	work_stop(r);
	upload_fini(r);
	control_close_all(r);
	jobs_free_all(r);
	metrics_stop(r);
	if (deadline_ev)
		event_free(deadline_ev);
	if (r->rescan_ev)
		event_free(r->rescan_ev);
	if (sigterm)
		event_free(sigterm);
	if (sigint)
		event_free(sigint);
	if (sighup)
		event_free(sighup);
	event_base_free(r->base);
	free(r->by_name);
	free(r->by_ino);
	objstore_close(r->store);
	store_url_free(&surl);
	meta_volume_free(&r->vol);
	meta_close(r->meta);
	close(r->staging_fd);
	if (r->cache_fd >= 0)
		close(r->cache_fd);
	close(r->lock_fd);
	log_info("stopped%s", r->exit_code ? " with jobs unfinished (journaled)" : "");
	free(cfg->db_path);
	free(cfg->vol_dir);
	free(cfg->staging_dir);
	free(cfg->cache_dir);
	free(cfg->socket_path);
	free(cfg->metrics_addr);
	libevent_global_shutdown();
	return r->exit_code;
}
