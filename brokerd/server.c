/*
 * server: ferry-brokerd's Unix socket. One connection per peer, its
 * identity recorded once at accept (peer.c). Each connection reads frames
 * in rpc_frame.h's format, bounded before anything is allocated
 * (BROKER_FRAME_MAX bytes, BROKER_FDS_MAX fd); unlike rpc_reader, it keeps
 * custody of every fd that comes, so that none is ever closed on the loop
 * unless it cannot reach a FUSE server (closer.c). Each request runs through
 * broker_request_parse() and then the dispatch table below, after OpenSSH's
 * monitor.c: {type, flags, handler}. A frame that is malformed, unknown or
 * not permitted to this peer at all gets one error reply with `closing` set
 * and ends that connection; a request refused on its merits gets an error
 * reply and the connection goes on.
 *
 * Replies go through a per-connection queue written with non-blocking
 * sendmsg() (the MOUNT reply's fd rides with its first byte). A peer that
 * does not read its replies is not read from once BROKER_CONN_OUT_MAX of them
 * wait; a peer that starts a frame and does not finish it within
 * BROKER_FRAME_TIMEOUT_S is dropped. No peer can make the loop wait.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include "brokerd.h"
#include "log.h"

#define REQ_RULE 0x1u   /* only for a peer a policy rule matches */
#define REQ_QUIET 0x2u  /* success is logged at debug level (hot path) */
#define IOV_BATCH 16

/* Every request type, its permission and its handler (monitor.c's table). */
static const struct {
	unsigned flags;
	broker_handler handler;
} dispatch[BROKER_MSG_COUNT] = {
	[BROKER_MSG_MOUNT] = { REQ_RULE, handle_mount },
	[BROKER_MSG_UMOUNT] = { REQ_RULE, handle_umount },
	[BROKER_MSG_ATTACH] = { REQ_RULE, handle_attach },
	[BROKER_MSG_BACKING_OPEN] = { REQ_RULE | REQ_QUIET, handle_backing_open },
	[BROKER_MSG_BACKING_CLOSE] = { REQ_RULE | REQ_QUIET, handle_backing_close },
	[BROKER_MSG_STATUS] = { REQ_QUIET, handle_status },
};

const struct peer *conn_peer(const struct conn *c)
{
	return &c->peer;
}

uint64_t broker_count_fds(void)
{
	uint64_t n = 0;
	struct dirent *de;
	DIR *d = opendir("/proc/self/fd");

	if (!d)
		return 0;
	while ((de = readdir(d)))
		if (de->d_name[0] != '.')
			n++;
	closedir(d);
	return n ? n - 1 : 0; /* not the directory's own fd */
}

int handle_status(struct broker *b, struct conn *c, const struct broker_req *q, int fd,
		  struct broker_rep *rep)
{
	struct owner *o;
	uint64_t peers = 0;

	(void)q;
	(void)fd;
	TAILQ_FOREACH(o, &b->owners, link)
		if (o->nconns)
			peers++;
	rep->status = (struct broker_status){
		.connections = b->nconns,
		.peers = peers,
		.mounts = b->nmounts,
		.backing_ids = b->nbacking,
		.fds = broker_count_fds(),
		.requests = b->requests,
		.refusals = b->refusals,
	};
	/* Names are relative to it: a peer asks this first. */
	if (c->peer.rule && strlen(c->peer.rule->root) <= BROKER_ROOT_MAX)
		snprintf(rep->status.root, sizeof(rep->status.root), "%s", c->peer.rule->root);
	return 0;
}

/* Drops a partial frame; its fds go the careful way. */
static void frame_reset(struct conn *c)
{
	struct frame_in *in = &c->in;

	peer_fds_drop(c->b, c->peer.uid, in->fds, in->nfds);
	in->nfds = 0;
	free(in->buf);
	in->buf = NULL;
	in->hdr_got = 0;
	in->len = in->got = 0;
}

/* The fds of one recvmsg: kept up to BROKER_FDS_MAX, else an error (the
 * surplus is dropped the careful way too). */
static int take_fds(struct conn *c, struct msghdr *msg)
{
	struct frame_in *in = &c->in;
	int rc = 0;

	for (struct cmsghdr *cm = CMSG_FIRSTHDR(msg); cm; cm = CMSG_NXTHDR(msg, cm)) {
		if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS) {
			rc = -EBADMSG;
			continue;
		}
		for (size_t i = 0; i < (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int); i++) {
			int fd;

			memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
			if (rc == 0 && in->nfds < BROKER_FDS_MAX) {
				in->fds[in->nfds++] = fd;
			} else {
				peer_fd_drop(c->b, c->peer.uid, fd);
				if (rc == 0)
					rc = -ETOOMANYREFS;
			}
		}
	}
	if (rc == 0 && (msg->msg_flags & MSG_CTRUNC))
		rc = -ETOOMANYREFS; /* the kernel dropped fds that did not fit */
	return rc;
}

/*
 * Reads towards the current frame, never past its end (the next frame's
 * fds stay in the socket). 1: a whole frame is in c->in; 0: nothing more
 * for now; negative errno as rpc_reader_read(): -EPIPE (closed between
 * frames), -EPROTO (closed inside one), -EMSGSIZE, -ETOOMANYREFS, -EBADMSG.
 * On an error the partial frame is dropped.
 */
static int frame_read(struct conn *c)
{
	union {
		struct cmsghdr align;
		char buf[CMSG_SPACE(sizeof(int) * (BROKER_FDS_MAX + 1))];
	} ctl;
	struct frame_in *in = &c->in;
	int rc;

	for (;;) {
		bool in_hdr = in->hdr_got < RPC_FRAME_HDR;
		struct iovec iov;
		struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf,
				      .msg_controllen = sizeof(ctl.buf) };
		ssize_t n;

		if (in_hdr) {
			iov.iov_base = in->hdr + in->hdr_got;
			iov.iov_len = RPC_FRAME_HDR - in->hdr_got;
		} else {
			iov.iov_base = in->buf + in->got;
			iov.iov_len = in->len - in->got;
		}
		n = recvmsg(c->sock, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				return 0;
			rc = -errno;
			goto fail;
		}
		rc = take_fds(c, &msg);
		if (rc < 0)
			goto fail;
		if (n == 0) {
			rc = (in_hdr && in->hdr_got == 0 && in->nfds == 0) ? -EPIPE : -EPROTO;
			goto fail;
		}
		if (in_hdr) {
			in->hdr_got += (size_t)n;
			if (in->hdr_got < RPC_FRAME_HDR)
				continue;
			in->len = (uint32_t)in->hdr[0] << 24 | (uint32_t)in->hdr[1] << 16 |
				  (uint32_t)in->hdr[2] << 8 | in->hdr[3];
			if (in->len > BROKER_FRAME_MAX) {
				rc = -EMSGSIZE; /* before anything is allocated */
				goto fail;
			}
			in->got = 0;
			if (in->len && !(in->buf = malloc(in->len))) {
				rc = -ENOMEM;
				goto fail;
			}
		} else {
			in->got += (uint32_t)n;
		}
		if (in->got == in->len)
			return 1;
	}
fail:
	frame_reset(c);
	return rc;
}

static void conn_close(struct conn *c)
{
	struct broker *b = c->b;
	struct out_frame *f;

	log_debug("peer pid %d uid %d: connection closed", (int)c->peer.pid, (int)c->peer.uid);
	TAILQ_REMOVE(&b->conns, c, link);
	b->nconns--;
	event_free(c->rev);
	event_free(c->wev);
	event_free(c->tmo);
	frame_reset(c);
	while ((f = TAILQ_FIRST(&c->out))) {
		TAILQ_REMOVE(&c->out, f, link);
		if (f->fd >= 0)
			close(f->fd);
		free(f);
	}
	close(c->sock);
	peer_clear(b, &c->peer);
	free(c);
}

/* Writes what the socket takes. 0, or a negative errno (drop the peer). */
static int conn_flush(struct conn *c)
{
	union {
		struct cmsghdr align;
		char buf[CMSG_SPACE(sizeof(int))];
	} ctl;

	while (!TAILQ_EMPTY(&c->out)) {
		struct out_frame *f = TAILQ_FIRST(&c->out), *g;
		struct iovec iov[IOV_BATCH];
		struct msghdr msg = { .msg_iov = iov };
		int n = 0;
		ssize_t sent;

		/* Frames go out together, but one that carries an fd starts a
		 * sendmsg of its own. */
		for (g = f; g && n < IOV_BATCH; g = TAILQ_NEXT(g, link)) {
			if (g != f && g->fd >= 0)
				break;
			iov[n].iov_base = g->data + g->off;
			iov[n++].iov_len = g->len - g->off;
		}
		msg.msg_iovlen = (size_t)n;
		if (f->fd >= 0) {
			struct cmsghdr *cm;

			memset(&ctl, 0, sizeof(ctl));
			msg.msg_control = ctl.buf;
			msg.msg_controllen = sizeof(ctl.buf);
			cm = CMSG_FIRSTHDR(&msg);
			cm->cmsg_level = SOL_SOCKET;
			cm->cmsg_type = SCM_RIGHTS;
			cm->cmsg_len = CMSG_LEN(sizeof(int));
			memcpy(CMSG_DATA(cm), &f->fd, sizeof(int));
		}
		sent = sendmsg(c->sock, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
		if (sent < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				return 0;
			return -errno;
		}
		if (f->fd >= 0) {
			close(f->fd); /* the peer has its own now */
			f->fd = -1;
		}
		while (sent > 0) {
			size_t take;

			g = TAILQ_FIRST(&c->out);
			take = g->len - g->off < (size_t)sent ? g->len - g->off : (size_t)sent;
			g->off += take;
			sent -= (ssize_t)take;
			if (g->off == g->len) {
				TAILQ_REMOVE(&c->out, g, link);
				free(g);
				c->nout--;
			}
		}
	}
	return 0;
}

/* After queueing or writing: events follow the state. Returns false if the
 * connection was closed. */
static bool conn_settle(struct conn *c)
{
	int rc = conn_flush(c);

	if (rc < 0) {
		log_debug("peer pid %d: %s; dropping its connection", (int)c->peer.pid,
			  strerror(-rc));
		conn_close(c);
		return false;
	}
	if (TAILQ_EMPTY(&c->out)) {
		event_del(c->wev);
		if (c->closing) {
			conn_close(c);
			return false;
		}
	} else {
		event_add(c->wev, NULL);
	}
	if (c->closing) {
		event_del(c->rev);
		event_del(c->tmo);
	} else if (c->paused && c->nout <= BROKER_CONN_OUT_MAX / 2) {
		c->paused = false;
		if (!c->throttled)
			event_add(c->rev, NULL);
	}
	return true;
}

static void conn_reply(struct conn *c, struct broker_rep *rep)
{
	uint8_t buf[BROKER_FRAME_MAX];
	struct out_frame *f;
	size_t len = 0;

	if (broker_reply_encode(rep, buf, &len) < 0) {
		/* Cannot happen (replies are small); never send half a reply. */
		log_warnx("peer pid %d: reply too large; closing", (int)c->peer.pid);
		c->closing = true;
		goto drop_fd;
	}
	f = malloc(sizeof(*f) + RPC_FRAME_HDR + len);
	if (!f) {
		log_warnx("peer pid %d: out of memory for a reply; closing", (int)c->peer.pid);
		c->closing = true;
		goto drop_fd;
	}
	rpc_frame_header(f->data, (uint32_t)len);
	memcpy(f->data + RPC_FRAME_HDR, buf, len);
	f->len = RPC_FRAME_HDR + len;
	f->off = 0;
	f->fd = rep->fd;
	rep->fd = -1;
	TAILQ_INSERT_TAIL(&c->out, f, link);
	if (++c->nout >= BROKER_CONN_OUT_MAX && !c->paused) {
		c->paused = true;
		event_del(c->rev);
		log_debug("peer pid %d does not read its replies: paused", (int)c->peer.pid);
	}
	return;
drop_fd:
	if (rep->fd >= 0)
		close(rep->fd);
	rep->fd = -1;
}

/* An error reply that ends the connection. */
static void conn_fatal(struct conn *c, uint64_t id, int err, const char *what, const char *why)
{
	struct broker_rep rep = { .id = id, .error = err, .closing = true, .fd = -1 };

	c->b->refusals++;
	log_warnx("peer pid %d uid %d: %s: refused and disconnected: %s (%s)", (int)c->peer.pid,
		  (int)c->peer.uid, what, why, strerror(err < 0 ? -err : err));
	snprintf(rep.message, sizeof(rep.message), "%s", why);
	c->closing = true;
	conn_reply(c, &rep);
}

static void handle_frame(struct conn *c, const uint8_t *buf, size_t len, int *fds, size_t nfds)
{
	struct broker *b = c->b;
	struct broker_req q;
	struct broker_rep rep = { .fd = -1 };
	bool fd_safe = false;
	char why[BROKER_MSG_MAX];
	size_t i;
	int rc;

	b->requests++;
	rc = broker_request_parse(buf, len, nfds, &q, why, sizeof(why));
	if (rc < 0) {
		conn_fatal(c, q.id, rc, "malformed request", why);
		goto out;
	}
	i = (size_t)q.type;
	if (i >= BROKER_MSG_COUNT || !dispatch[i].handler) {
		conn_fatal(c, q.id, -EOPNOTSUPP, broker_msg_name(q.type), "no handler");
		goto out;
	}
	if ((dispatch[i].flags & REQ_RULE) && !c->peer.rule) {
		snprintf(why, sizeof(why), "%s refused: no policy rule allows uid %d",
			 broker_msg_name(q.type), (int)c->peer.uid);
		conn_fatal(c, q.id, -EPERM, broker_msg_name(q.type), why);
		goto out;
	}
	rep.id = q.id;
	rep.type = q.type;
	rc = broker_request_permitted(c->peer.rule, &q, rep.message, sizeof(rep.message));
	if (rc == 0)
		rc = dispatch[i].handler(b, c, &q, nfds ? fds[0] : -1, &rep);
	rep.error = rc;
	fd_safe = rep.fd_safe;
	if (rc < 0) {
		b->refusals++;
		log_warnx("peer pid %d uid %d: %s%s%s: refused: %s (%s)", (int)c->peer.pid,
			  (int)c->peer.uid, broker_msg_name(q.type), q.has_name ? " " : "",
			  q.has_name ? q.name : "", rep.message, strerror(-rc));
		if (rep.fd >= 0)
			close(rep.fd);
		rep.fd = -1;
	} else if (dispatch[i].flags & REQ_QUIET) {
		uint32_t bid = rep.backing_id ? rep.backing_id : q.backing_id;

		if (log_get_level() >= LOG_LVL_DEBUG)
			log_debug("peer pid %d uid %d: %s mount %" PRIu64 " backing id %" PRIu32
				  ": ok", (int)c->peer.pid, (int)c->peer.uid,
				  broker_msg_name(q.type), q.mount_id, bid);
		rep.message[0] = '\0';
	} else {
		log_info("peer pid %d uid %d: %s %s: ok, mount %" PRIu64 "%s%s", (int)c->peer.pid,
			 (int)c->peer.uid, broker_msg_name(q.type),
			 q.has_name ? q.name : "(by id)", rep.mount_id ? rep.mount_id : q.mount_id,
			 rep.message[0] ? ": " : "", rep.message);
	}
	conn_reply(c, &rep);
out:
	/* The request's fds are the handler's to use, never to keep. */
	if (fd_safe)
		rpc_fds_close(fds, nfds);
	else
		peer_fds_drop(b, c->peer.uid, fds, nfds);
}

/* Should c wait for its uid's fds to be closed aside? */
static bool conn_throttle(struct conn *c)
{
	if (closer_pending(c->b, c->peer.uid) < BROKER_CLOSE_PENDING_MAX)
		return false;
	if (!c->throttled) {
		c->throttled = true;
		event_del(c->rev);
		log_warnx("peer pid %d uid %d: %u of its uid's fds are closing aside (on FUSE?): "
			  "not reading it for now", (int)c->peer.pid, (int)c->peer.uid,
			  BROKER_CLOSE_PENDING_MAX);
	}
	return true;
}

void server_tick(struct broker *b)
{
	struct conn *c;

	TAILQ_FOREACH(c, &b->conns, link) {
		if (!c->throttled ||
		    closer_pending(b, c->peer.uid) >= BROKER_CLOSE_PENDING_MAX / 2)
			continue;
		c->throttled = false;
		if (!c->paused && !c->closing)
			event_add(c->rev, NULL);
	}
}

static void read_cb(evutil_socket_t fd, short what, void *arg)
{
	struct conn *c = arg;
	unsigned i;

	(void)fd;
	(void)what;
	for (i = 0; i < BROKER_FRAMES_PER_WAKE && !c->closing && !c->paused; i++) {
		uint8_t *buf;
		size_t len, nfds;
		int fds[BROKER_FDS_MAX];
		int rc;

		if (conn_throttle(c))
			break;
		rc = frame_read(c);
		if (rc == 0)
			break;
		if (rc < 0) {
			if (rc == -EMSGSIZE)
				conn_fatal(c, 0, rc, "frame", "frame larger than 4096 bytes");
			else if (rc == -ETOOMANYREFS)
				conn_fatal(c, 0, rc, "frame", "more than one fd with a frame");
			else if (rc == -EBADMSG)
				conn_fatal(c, 0, rc, "frame", "ancillary data other than fds");
			else if (rc == -EPROTO)
				log_warnx("peer pid %d uid %d: connection closed in the middle of a "
					  "frame", (int)c->peer.pid, (int)c->peer.uid);
			else if (rc != -EPIPE)
				log_warnx("peer pid %d uid %d: %s; closing", (int)c->peer.pid,
					  (int)c->peer.uid, strerror(-rc));
			c->closing = true;
			break;
		}
		/* Take the frame out of c->in. */
		buf = c->in.buf;
		len = c->in.len;
		nfds = c->in.nfds;
		memcpy(fds, c->in.fds, sizeof(fds));
		c->in.buf = NULL;
		c->in.nfds = 0;
		c->in.hdr_got = 0;
		c->in.len = c->in.got = 0;
		handle_frame(c, buf, len, fds, nfds);
		free(buf);
	}
	if (!conn_settle(c))
		return;
	/* A frame begun must be finished in time. */
	if (!c->closing && (c->in.hdr_got > 0 || c->in.nfds > 0)) {
		if (!evtimer_pending(c->tmo, NULL)) {
			struct timeval tv = { .tv_sec = BROKER_FRAME_TIMEOUT_S };
			evtimer_add(c->tmo, &tv);
		}
	} else {
		evtimer_del(c->tmo);
	}
}

static void write_cb(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	conn_settle(arg);
}

static void timeout_cb(evutil_socket_t fd, short what, void *arg)
{
	struct conn *c = arg;

	(void)fd;
	(void)what;
	log_warnx("peer pid %d uid %d: a frame unfinished for %d s; closing", (int)c->peer.pid,
		  (int)c->peer.uid, BROKER_FRAME_TIMEOUT_S);
	conn_close(c);
}

static unsigned conns_of_uid(struct broker *b, uid_t uid)
{
	struct conn *c;
	unsigned n = 0;

	TAILQ_FOREACH(c, &b->conns, link)
		if (c->peer.uid == uid)
			n++;
	return n;
}

static void accept_cb(evutil_socket_t lfd, short what, void *arg)
{
	struct broker *b = arg;

	(void)what;
	for (;;) {
		struct conn *c;
		int rc, fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);

		if (fd < 0) {
			if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED)
				log_warn("accept");
			return;
		}
		c = calloc(1, sizeof(*c));
		if (!c) {
			log_warnx("out of memory for a connection");
			close(fd);
			continue;
		}
		c->b = b;
		c->sock = fd;
		TAILQ_INIT(&c->out);
		rc = peer_identify(b, fd, &c->peer);
		if (rc < 0) {
			log_errno(rc, "cannot identify a peer");
			goto drop;
		}
		if (b->nconns >= BROKER_CONN_MAX || conns_of_uid(b, c->peer.uid) >= BROKER_CONN_PER_UID) {
			log_warnx("peer pid %d uid %d: refused: too many connections", (int)c->peer.pid,
				  (int)c->peer.uid);
			goto drop;
		}
		for (size_t k = 0; k < BROKER_FDS_MAX; k++)
			c->in.fds[k] = -1;
		c->rev = event_new(b->base, fd, EV_READ | EV_PERSIST, read_cb, c);
		c->wev = event_new(b->base, fd, EV_WRITE | EV_PERSIST, write_cb, c);
		c->tmo = evtimer_new(b->base, timeout_cb, c);
		if (!c->rev || !c->wev || !c->tmo || event_add(c->rev, NULL) < 0) {
			log_warnx("out of memory for a connection");
			goto drop;
		}
		TAILQ_INSERT_TAIL(&b->conns, c, link);
		b->nconns++;
		if (c->peer.rule)
			log_info("peer pid %d uid %d gid %d cgroup %s: connected; policy line %u, "
				 "root %s", (int)c->peer.pid, (int)c->peer.uid, (int)c->peer.gid,
				 c->peer.cgroup ? c->peer.cgroup : "(unknown)", c->peer.rule->line,
				 c->peer.rule->root);
		else
			log_info("peer pid %d uid %d gid %d cgroup %s: connected; no policy rule "
				 "matches: STATUS only", (int)c->peer.pid, (int)c->peer.uid,
				 (int)c->peer.gid, c->peer.cgroup ? c->peer.cgroup : "(unknown)");
		continue;
drop:
		if (c->rev)
			event_free(c->rev);
		if (c->wev)
			event_free(c->wev);
		if (c->tmo)
			event_free(c->tmo);
		peer_clear(b, &c->peer);
		free(c);
		close(fd);
	}
}

int server_listen(struct broker *b, const char *path, mode_t mode, gid_t gid)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	mode_t old;
	int fd, probe, rc;

	if (strlen(path) >= sizeof(sa.sun_path))
		return -ENAMETOOLONG;
	strcpy(sa.sun_path, path);
	/* A socket left by a dead broker answers no one: replace it. A live
	 * one stays. */
	probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (probe >= 0 && connect(probe, (struct sockaddr *)&sa, sizeof(sa)) == 0) {
		close(probe);
		return -EADDRINUSE;
	}
	if (probe >= 0)
		close(probe);
	if (unlink(path) < 0 && errno != ENOENT)
		return -errno;
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	old = umask(0077);
	rc = bind(fd, (struct sockaddr *)&sa, sizeof(sa));
	umask(old);
	if (rc < 0 || (gid != (gid_t)-1 && chown(path, (uid_t)-1, gid) < 0) ||
	    chmod(path, mode) < 0 || listen(fd, 128) < 0) {
		rc = -errno;
		close(fd);
		unlink(path);
		return rc;
	}
	b->listen_fd = fd;
	b->listen_ev = event_new(b->base, fd, EV_READ | EV_PERSIST, accept_cb, b);
	if (!b->listen_ev || event_add(b->listen_ev, NULL) < 0)
		return -ENOMEM;
	return 0;
}

void server_close_all(struct broker *b)
{
	struct conn *c;

	if (b->listen_ev)
		event_free(b->listen_ev);
	b->listen_ev = NULL;
	if (b->listen_fd >= 0) {
		close(b->listen_fd);
		unlink(b->socket_path);
	}
	b->listen_fd = -1;
	while ((c = TAILQ_FIRST(&b->conns))) {
		conn_flush(c); /* last replies, best effort */
		conn_close(c);
	}
}
