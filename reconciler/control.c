/*
 * control: the Unix socket ferry-mountd talks to. Each connection reads
 * frames with an rpc_reader (non-blocking, fds via SCM_RIGHTS) and answers
 * through an output buffer. A request that does not decode or check gets
 * one Error reply, one log line, and the connection is closed after the
 * reply is written; every other peer is served on. Peers must run as our
 * uid (or root), checked with SO_PEERCRED when they connect.
 *
 * Short of memory, a connection is kept, never dropped (ferry-mountd would
 * have to kill us and start another, which needs memory too): a request
 * that cannot be handled yet is held, with its fds, and reading stops until
 * it is; a reply that cannot be queued waits in a ring of the connection's
 * own. A timer tries again, 50 ms later and up to a second apart.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <event2/buffer.h>

#include "log.h"
#include "reconciler.h"

#define CONN_MAX 256
#define CONN_OUT_MAX (4u << 20)  /* replies a peer does not read: drop it */
#define CONN_WAITING_MAX 32      /* replies waiting for memory to be queued */
#define SHORT_RETRY_FIRST_MS 50
#define SHORT_RETRY_MAX_MS 1000
/* After a read that took handoffs, the next waits this long (see
 * conn_pace). */
#define READ_PACE_MS 5

struct conn {
	struct rec *r;
	int fd;
	pid_t pid;
	uid_t uid;
	struct event *rev, *wev;
	struct rpc_reader rd;
	struct evbuffer *out;
	int refs;
	bool dead;      /* closed; the struct lives while jobs or drains hold it */
	bool closing;   /* close once the output is written */
	/* Short of memory (see the top): */
	bool read_short;        /* reading stopped: a frame is held, or had no buffer */
	bool held;              /* a frame that could not be handled yet */
	uint8_t *held_buf;
	size_t held_len, held_nfds;
	int held_fds[RPC_FDS_MAX];
	struct reconcile_reply waiting[CONN_WAITING_MAX]; /* a ring, oldest first */
	unsigned nwaiting, waiting_first;
	struct event *retry_ev;
	long retry_ms;
	struct event *pace_ev;  /* ends a pause in reading (conn_pace) */
	bool paced;
	uint64_t handoffs;      /* handoffs taken on this connection */
	TAILQ_ENTRY(conn) link;
};

static unsigned nconns;

void conn_ref(struct conn *c)
{
	c->refs++;
}

void conn_unref(struct conn *c)
{
	if (c && --c->refs == 0)
		free(c);
}

static void conn_close(struct conn *c)
{
	struct rec *r = c->r;

	if (c->dead)
		return;
	c->dead = true;
	event_free(c->rev);
	event_free(c->wev);
	event_free(c->retry_ev);
	event_free(c->pace_ev);
	if (c->held) {
		free(c->held_buf);
		rpc_fds_close(c->held_fds, c->held_nfds);
		c->held = false;
	}
	rpc_reader_reset(&c->rd);
	evbuffer_free(c->out);
	c->out = NULL;
	close(c->fd);
	c->fd = -1;
	TAILQ_REMOVE(&r->conns, c, link);
	nconns--;
	jobs_conn_gone(r, c);
	conn_unref(c);
}

static void write_cb(evutil_socket_t fd, short what, void *arg)
{
	struct conn *c = arg;

	if (evbuffer_write(c->out, c->fd) < 0 && errno != EAGAIN && errno != EINTR) {
		log_debug("peer pid %d: %s; closing its connection", (int)c->pid, strerror(errno));
		conn_close(c);
		return;
	}
	if (evbuffer_get_length(c->out) == 0) {
		event_del(c->wev);
		if (c->closing)
			conn_close(c);
	}
}

static void conn_short(struct conn *c);

/* Queues one reply frame (one evbuffer_add: all of it or nothing).
 * -ENOMEM leaves nothing queued. */
static int reply_queue(struct conn *c, const struct reconcile_reply *rep)
{
	uint8_t frame[RPC_FRAME_HDR + RECONCILE_REPLY_MAX];
	size_t len = 0;
	int rc = reconcile_reply_encode_to(rep, frame + RPC_FRAME_HDR, RECONCILE_REPLY_MAX, &len);

	if (rc < 0)
		return rc;
	rpc_frame_header(frame, (uint32_t)len);
	if (evbuffer_add(c->out, frame, RPC_FRAME_HDR + len) < 0)
		return -ENOMEM;
	return 0;
}

/* Queues the replies that waited for memory, oldest first. true: none left. */
static bool waiting_flush(struct conn *c)
{
	while (c->nwaiting) {
		if (reply_queue(c, &c->waiting[c->waiting_first]) < 0)
			return false;
		c->waiting_first = (c->waiting_first + 1) % CONN_WAITING_MAX;
		c->nwaiting--;
	}
	return true;
}

bool conn_reply(struct rec *r, struct conn *c, const struct reconcile_reply *rep)
{
	int rc = 0;

	if (!c || c->dead)
		return false;
	/* Behind replies that wait for memory, in order. */
	if (!waiting_flush(c) || (rc = reply_queue(c, rep)) == -ENOMEM) {
		if (c->nwaiting == CONN_WAITING_MAX) {
			log_warnx("out of memory for replies to pid %d (%u waiting); closing its "
				  "connection", (int)c->pid, c->nwaiting);
			conn_close(c);
			return false;
		}
		c->waiting[(c->waiting_first + c->nwaiting) % CONN_WAITING_MAX] = *rep;
		c->nwaiting++;
		conn_short(c);
		return true;
	}
	if (rc < 0) {
		log_warnx("cannot encode a reply to pid %d: %s; closing its connection", (int)c->pid,
			  strerror(-rc));
		conn_close(c);
		return false;
	}
	if (evbuffer_get_length(c->out) > CONN_OUT_MAX) {
		log_warnx("peer pid %d does not read its replies; closing its connection", (int)c->pid);
		conn_close(c);
		return false;
	}
	/* Most replies fit the socket right away. A failed write closes the
	 * connection, which drops the references its drains held: hold one
	 * until the end here. */
	conn_ref(c);
	write_cb(c->fd, EV_WRITE, c);
	if (!c->dead && evbuffer_get_length(c->out))
		event_add(c->wev, NULL);
	bool queued = !c->dead;
	conn_unref(c);
	return queued;
}

/* A request we refuse: one Error, one log line, then the connection ends. */
static void conn_error(struct conn *c, int err, const char *msg)
{
	struct reconcile_reply rep = { .type = RECONCILE_REPLY_ERROR, .error = err };

	log_warnx("peer pid %d: refused a request: %s (%s); closing its connection", (int)c->pid,
		  msg, strerror(err < 0 ? -err : err));
	snprintf(rep.message, sizeof(rep.message), "%s", msg);
	event_del(c->rev);
	c->closing = true;
	conn_reply(c->r, c, &rep);
	if (!c->dead && evbuffer_get_length(c->out) == 0)
		conn_close(c);
}

/* Checks that fd is the staging file the job names, and that it is journaled. */
static int handoff_check(struct rec *r, const struct reconcile_job *rj, int fd, bool *rec_xattr,
			 char *msg, size_t msglen)
{
	struct stat a, b;
	char rec[RECONCILE_NAME_MAX + 16];

	if (fstat(fd, &a) < 0 || !S_ISREG(a.st_mode)) {
		snprintf(msg, msglen, "the fd sent with %s is not a regular file", rj->name);
		return -EINVAL;
	}
	if (fstatat(r->staging_fd, rj->name, &b, AT_SYMLINK_NOFOLLOW) < 0) {
		snprintf(msg, msglen, "no staging file %s in %s", rj->name, r->cfg.staging_dir);
		return -ENOENT;
	}
	if (a.st_dev != b.st_dev || a.st_ino != b.st_ino) {
		snprintf(msg, msglen, "the fd sent is not the staging file %s", rj->name);
		return -EINVAL;
	}
	if ((uint64_t)a.st_size < rj->length) {
		snprintf(msg, msglen, "staging file %s has %lld bytes, the handoff says %" PRIu64,
			 rj->name, (long long)a.st_size, rj->length);
		return -EINVAL;
	}
	*rec_xattr = reconcile_job_attached(fd) == 1;
	snprintf(rec, sizeof(rec), "%s%s", rj->name, RECONCILE_JOB_SUFFIX);
	if (!*rec_xattr && faccessat(r->staging_fd, rec, F_OK, AT_SYMLINK_NOFOLLOW) < 0) {
		snprintf(msg, msglen, "no journal record for %.*s (xattr or .job): record it "
			 "(reconcile_job_attach) before the handoff", RECONCILE_NAME_MAX, rj->name);
		return -ENOENT;
	}
	return 0;
}

/* 0, or -ENOMEM with nothing done (fd still open): try again later. */
static int handle_handoff(struct rec *r, struct conn *c, struct reconcile_job *rj, int fd)
{
	struct reconcile_reply rep = { .type = RECONCILE_REPLY_COMMITTED, .seq = rj->seq,
				       .ino = rj->ino };
	struct job *known;
	char msg[RECONCILE_MSG_MAX];
	bool rec_xattr = false;
	int rc, err;

	c->handoffs++;
	if (r->stopping) {
		rep.error = -ESHUTDOWN;
		snprintf(rep.message, sizeof(rep.message), "the reconciler is stopping: the job "
			 "stays journaled and is finished at its next start");
		conn_reply(r, c, &rep);
		close(fd);
		return 0;
	}
	known = jobs_find_name(r, rj->name);
	if (known && known->rj.seq == rj->seq) {
		/* Found by a journal scan first (or handed over again after a
		 * reconnect): the reply goes to this connection, once the fd
		 * proves to be that job's file (which may be gone from the
		 * directory already, being committed). */
		struct stat a, b;
		if (fstat(fd, &a) < 0 || !S_ISREG(a.st_mode) ||
		    (known->fd >= 0 ? fstat(known->fd, &b)
				    : fstatat(r->staging_fd, known->file, &b, AT_SYMLINK_NOFOLLOW)) < 0 ||
		    a.st_dev != b.st_dev || a.st_ino != b.st_ino) {
			snprintf(msg, sizeof(msg), "the fd sent is not the staging file %s", rj->name);
			close(fd);
			conn_error(c, -EINVAL, msg);
			return 0;
		}
		conn_ref(c);
		if (known->conn)
			conn_unref(known->conn);
		known->conn = c;
		close(fd);
		return 0;
	}
	if (known) {
		snprintf(msg, sizeof(msg), "staging name %s is already job seq %" PRIu64, rj->name,
			 known->rj.seq);
		close(fd);
		conn_error(c, -EEXIST, msg);
		return 0;
	}
	if (jobs_recent(r, rj->name, rj->seq, &err)) {
		rep.error = err;
		snprintf(rep.message, sizeof(rep.message), "finished already");
		conn_reply(r, c, &rep);
		close(fd);
		return 0;
	}
	rc = handoff_check(r, rj, fd, &rec_xattr, msg, sizeof(msg));
	if (rc < 0) {
		close(fd);
		conn_error(c, rc, msg);
		return 0;
	}
	rc = jobs_add(r, rj, fd, rj->name, false, rec_xattr, c);
	if (rc == -ENOMEM)
		return rc;
	if (rc < 0) {
		close(fd);
		conn_error(c, rc, strerror(-rc));
	}
	return 0;
}

/*
 * Handles one request. -ENOMEM: nothing was done and the fds are still
 * open; the caller holds the frame and hands it here again later.
 */
static int handle_frame(struct rec *r, struct conn *c, const uint8_t *buf, size_t len, int *fds,
			size_t nfds)
{
	struct reconcile_request q;
	struct reconcile_reply rep = { 0 };
	char err[256];
	int rc;

	rc = reconcile_request_decode(buf, len, nfds, &q, err, sizeof(err));
	if (rc == -ENOMEM)
		return rc;
	if (rc < 0) {
		rpc_fds_close(fds, nfds);
		conn_error(c, rc, err);
		return 0;
	}
	switch (q.type) {
	case RECONCILE_REQ_HANDOFF:
		rc = handle_handoff(r, c, &q.job, fds[0]);
		break;
	case RECONCILE_REQ_DRAIN:
		rc = jobs_drain_add(r, c, q.upto_seq);
		break;
	case RECONCILE_REQ_DROP:
		jobs_drop(r, c, q.ino, q.upto_seq);
		break;
	case RECONCILE_REQ_STATS:
		rep.type = RECONCILE_REPLY_STATS;
		metrics_snapshot(r, &rep.stats);
		conn_reply(r, c, &rep);
		break;
	}
	reconcile_request_clear(&q);
	return rc;
}

/* Memory ran short on c: stop reading (if a frame is held or had no room)
 * and try again soon. */
static void conn_short(struct conn *c)
{
	if (c->held || c->read_short)
		event_del(c->rev);
	if (!evtimer_pending(c->retry_ev, NULL)) {
		if (c->retry_ms == 0) {
			c->retry_ms = SHORT_RETRY_FIRST_MS;
			log_info("peer pid %d: out of memory; its requests and replies wait (%s, %u "
				 "replies)", (int)c->pid, c->held ? "a request held" : "none held",
				 c->nwaiting);
		}
		struct timeval tv = { c->retry_ms / 1000, (c->retry_ms % 1000) * 1000 };

		evtimer_add(c->retry_ev, &tv);
		c->retry_ms = c->retry_ms * 2 > SHORT_RETRY_MAX_MS ? SHORT_RETRY_MAX_MS :
								       c->retry_ms * 2;
	}
}

static void read_cb(evutil_socket_t fd, short what, void *arg);

static void retry_cb(evutil_socket_t fd, short what, void *arg)
{
	struct conn *c = arg;
	struct rec *r = c->r;
	int rc;

	conn_ref(c); /* handlers may close it */
	if (!waiting_flush(c))
		goto again;
	if (evbuffer_get_length(c->out)) {
		write_cb(c->fd, EV_WRITE, c);
		if (c->dead)
			goto out;
		if (evbuffer_get_length(c->out))
			event_add(c->wev, NULL);
	}
	if (c->held) {
		/* Taken off the connection first: once handled, its fds are
		 * the handler's (a job's, or closed), not conn_close()'s. */
		uint8_t *buf = c->held_buf;
		size_t len = c->held_len, nfds = c->held_nfds;
		int fds[RPC_FDS_MAX];

		memcpy(fds, c->held_fds, nfds * sizeof(fds[0]));
		c->held = false;
		c->held_buf = NULL;
		rc = handle_frame(r, c, buf, len, fds, nfds);
		if (rc == -ENOMEM && !c->dead) {
			c->held = true;
			c->held_buf = buf;
			goto again;
		}
		if (rc == -ENOMEM)
			rpc_fds_close(fds, nfds);
		free(buf);
		if (c->dead)
			goto out;
	}
	c->retry_ms = 0;
	log_info("peer pid %d: memory back; serving it again", (int)c->pid);
	if (c->read_short) {
		c->read_short = false;
		if (!r->throttled && !c->closing)
			event_add(c->rev, NULL);
		/* What was read already waits in its reader, not in the socket. */
		read_cb(c->fd, EV_READ, c);
	}
	goto out;
again:
	if (!c->dead)
		conn_short(c);
out:
	conn_unref(c);
	rec_check_done(r);
}

static void read_cb(evutil_socket_t fd, short what, void *arg);

static void pace_cb(evutil_socket_t fd, short what, void *arg)
{
	struct conn *c = arg;
	struct rec *r = c->r;

	(void)fd;
	(void)what;
	c->paced = false;
	if (c->dead || c->closing || c->read_short || r->throttled)
		return;
	event_add(c->rev, NULL);
	read_cb(c->fd, EV_READ, c);
}

/*
 * A burst of closes sends a handoff per file, and waking up for each one
 * costs this daemon and the sender a context switch and an IPI per file
 * (most of what a handoff costs on a small VM). Uploads wait for the burst
 * to end anyway (upload_quiet_ms), so after a read that took handoffs the
 * connection is left alone for READ_PACE_MS, and the next read takes what
 * came meanwhile in one go. The socket holds a few hundred handoffs, far
 * more than come in that time. With upload_quiet_ms 0 (start at once),
 * every handoff is read as it comes.
 */
static void conn_pace(struct conn *c)
{
	struct rec *r = c->r;
	struct timeval tv = { 0, READ_PACE_MS * 1000 };

	if (!r->cfg.upload_quiet_ms || c->dead || c->closing || c->read_short || r->throttled ||
	    r->stopping)
		return;
	if (evtimer_add(c->pace_ev, &tv) < 0)
		return;
	event_del(c->rev);
	c->paced = true;
}

static void read_cb(evutil_socket_t fd, short what, void *arg)
{
	struct conn *c = arg;
	struct rec *r = c->r;
	uint64_t handoffs = c->handoffs;

	conn_ref(c); /* handlers may close it */
	while (!c->dead && !c->closing && !r->throttled && !c->read_short) {
		int fds[RPC_FDS_MAX];
		uint8_t *buf;
		size_t len, nfds;
		int rc = rpc_reader_read(&c->rd, c->fd);

		if (rc == 0)
			break;
		if (rc == -ENOMEM) {
			/* The reader keeps what it has; go on when memory is back. */
			c->read_short = true;
			conn_short(c);
			break;
		}
		if (rc < 0) {
			if (rc == -EPIPE)
				log_debug("peer pid %d closed its connection", (int)c->pid);
			else if (rc == -EMSGSIZE || rc == -ETOOMANYREFS || rc == -EBADMSG)
				conn_error(c, rc, rc == -EMSGSIZE ? "frame too large" :
						  rc == -ETOOMANYREFS ? "too many fds with a frame" :
									"unexpected ancillary data");
			else
				log_warnx("peer pid %d: %s; closing its connection", (int)c->pid,
					  rc == -EPROTO ? "connection closed in the middle of a frame" :
							  strerror(-rc));
			if (!c->closing)
				conn_close(c);
			break;
		}
		rpc_reader_take(&c->rd, &buf, &len, fds, &nfds);
		if (handle_frame(r, c, buf, len, fds, nfds) == -ENOMEM) {
			/* Held, fds and all; nothing after it is read first. */
			c->held = true;
			c->held_buf = buf;
			c->held_len = len;
			memcpy(c->held_fds, fds, nfds * sizeof(fds[0]));
			c->held_nfds = nfds;
			c->read_short = true;
			conn_short(c);
			break;
		}
		free(buf);
	}
	if (c->handoffs != handoffs)
		conn_pace(c);
	conn_unref(c);
	rec_check_done(r);
}

static void accept_cb(evutil_socket_t lfd, short what, void *arg)
{
	struct rec *r = arg;

	for (;;) {
		struct ucred cred;
		socklen_t clen = sizeof(cred);
		struct conn *c;
		int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);

		if (fd < 0) {
			if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED)
				log_warn("accept");
			return;
		}
		if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &clen) < 0 ||
		    (cred.uid != geteuid() && cred.uid != 0)) {
			log_warnx("refused a connection from uid %d (pid %d): not our uid",
				  (int)cred.uid, (int)cred.pid);
			close(fd);
			continue;
		}
		if (nconns >= CONN_MAX) {
			log_warnx("refused a connection from pid %d: %d connections already",
				  (int)cred.pid, CONN_MAX);
			close(fd);
			continue;
		}
		c = calloc(1, sizeof(*c));
		if (c) {
			c->r = r;
			c->fd = fd;
			c->pid = cred.pid;
			c->uid = cred.uid;
			c->refs = 1;
			rpc_reader_init(&c->rd, RECONCILE_FRAME_MAX, 1);
			c->out = evbuffer_new();
			c->rev = event_new(r->base, fd, EV_READ | EV_PERSIST, read_cb, c);
			c->wev = event_new(r->base, fd, EV_WRITE | EV_PERSIST, write_cb, c);
			c->retry_ev = evtimer_new(r->base, retry_cb, c);
			c->pace_ev = evtimer_new(r->base, pace_cb, c);
		}
		if (!c || !c->out || !c->rev || !c->wev || !c->retry_ev || !c->pace_ev) {
			log_warnx("out of memory for a connection");
			if (c) {
				if (c->out)
					evbuffer_free(c->out);
				if (c->rev)
					event_free(c->rev);
				if (c->wev)
					event_free(c->wev);
				if (c->retry_ev)
					event_free(c->retry_ev);
				if (c->pace_ev)
					event_free(c->pace_ev);
				free(c);
			}
			close(fd);
			continue;
		}
		TAILQ_INSERT_TAIL(&r->conns, c, link);
		nconns++;
		if (!r->throttled)
			event_add(c->rev, NULL);
		log_debug("connection from pid %d", (int)c->pid);
		/* A ferry-mountd that died between writing a record and sending
		 * its handoff reconnects after its restart: pick such jobs up. */
		jobs_scan(r, false, 0);
	}
}

int control_listen(struct rec *r)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	mode_t old;
	int fd, probe, rc;

	if (strlen(r->cfg.socket_path) >= sizeof(sa.sun_path))
		return -ENAMETOOLONG;
	strcpy(sa.sun_path, r->cfg.socket_path);
	/* A socket file left by a dead reconciler: nobody answers on it. */
	probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (probe >= 0 && connect(probe, (struct sockaddr *)&sa, sizeof(sa)) == 0) {
		close(probe);
		return -EADDRINUSE;
	}
	if (probe >= 0)
		close(probe);
	if (unlink(r->cfg.socket_path) < 0 && errno != ENOENT)
		return -errno;
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	old = umask(0077);
	rc = bind(fd, (struct sockaddr *)&sa, sizeof(sa));
	umask(old);
	if (rc < 0 || listen(fd, 64) < 0) {
		rc = -errno;
		close(fd);
		return rc;
	}
	r->listen_fd = fd;
	r->listen_ev = event_new(r->base, fd, EV_READ | EV_PERSIST, accept_cb, r);
	if (!r->listen_ev || event_add(r->listen_ev, NULL) < 0)
		return -ENOMEM;
	return 0;
}

void control_stop_listening(struct rec *r)
{
	if (r->listen_ev)
		event_free(r->listen_ev);
	r->listen_ev = NULL;
	if (r->listen_fd >= 0) {
		close(r->listen_fd);
		unlink(r->cfg.socket_path);
	}
	r->listen_fd = -1;
}

void control_throttle(struct rec *r, bool on)
{
	struct conn *c;

	if (r->throttled == on)
		return;
	r->throttled = on;
	if (on)
		log_warnx("%zu jobs known: not reading requests until some finish", r->njobs);
	TAILQ_FOREACH(c, &r->conns, link) {
		if (c->closing || c->read_short || c->paced)
			continue;
		if (on)
			event_del(c->rev);
		else
			event_add(c->rev, NULL);
	}
}

void control_close_all(struct rec *r)
{
	struct conn *c;

	while ((c = TAILQ_FIRST(&r->conns))) {
		/* Last replies, best effort. */
		waiting_flush(c);
		if (evbuffer_get_length(c->out))
			evbuffer_write(c->out, c->fd);
		conn_close(c);
	}
}
