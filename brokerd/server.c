/*
 * server: ferry-brokerd's Unix socket. One connection per peer, its
 * identity recorded once at accept (peer.c). Each connection reads frames
 * in rpc_frame.h's format, bounded before anything is allocated
 * (BROKER_FRAME_MAX bytes, BROKER_FDS_MAX fds); unlike rpc_reader, it keeps
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
 * wait, and is dropped when they have not moved for BROKER_FRAME_TIMEOUT_S;
 * a peer that starts a frame and does not finish it within
 * BROKER_FRAME_TIMEOUT_S is dropped; one that serves no mount and sends
 * nothing for --idle-timeout is closed.
 *
 * No peer can make the loop wait, and nothing a peer sent is closed here
 * (closer.c): not the fds of its frames, not those the kernel would drop
 * for want of control-buffer room (there is room for SCM_MAX_FD, and a
 * truncated one is refused), and not those in flight in its socket's queue
 * when the connection ends. Where the kernel has SO_PASSRIGHTS, the
 * listening socket refuses fds and a connection accepts them only once its
 * peer is admitted by a rule, so a stranger's socket can be closed in
 * place; everything else goes to the closer of the peer's owner.
 *
 * Admission (accept): root for STATUS, and peers a rule matches; anyone
 * else is closed at once without holding a slot. An owner holds at most
 * BROKER_CONN_PER_UID connections; when all conn_max (BROKER_CONN_MAX, or
 * fewer if the fd limit is low) are taken, a
 * newcomer whose owner holds fewer than the biggest holder takes the least
 * recently active connection of that holder, so an admitted tenant always
 * gets through.
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

#ifndef SO_PASSRIGHTS
#define SO_PASSRIGHTS 83
#endif

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
	[BROKER_MSG_REATTACH] = { REQ_RULE, handle_reattach },
	[BROKER_MSG_BACKING_OPEN] = { REQ_RULE | REQ_QUIET, handle_backing_open },
	[BROKER_MSG_BACKING_CLOSE] = { REQ_RULE | REQ_QUIET, handle_backing_close },
	[BROKER_MSG_BACKING_OPEN_MANY] = { REQ_RULE | REQ_QUIET, handle_backing_open_many },
	[BROKER_MSG_BACKING_CLOSE_MANY] = { REQ_RULE | REQ_QUIET, handle_backing_close_many },
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

static time_t now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec;
}

/* Root sees the broker's figures; a tenant sees only its own owner's, so
 * one tenant learns nothing of another. */
int handle_status(struct broker *b, struct conn *c, const struct broker_req *q,
		  const int *fds, size_t nfds, struct broker_rep *rep)
{
	const struct owner *self = c->peer.owner;
	struct owner *o;
	uint64_t peers = 0;

	(void)q;
	(void)fds;
	(void)nfds;
	if (!self) {
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
	} else {
		rep->status = (struct broker_status){
			.connections = self->nconns,
			.peers = 1,
			.mounts = self->nmounts,
			.backing_ids = self->nbacking,
		};
	}
	rep->status.features = BROKER_FEATURE_MANY;
	/* Names are relative to it: a peer asks this first. */
	if (c->peer.rule && strlen(c->peer.rule->root) <= BROKER_ROOT_MAX)
		snprintf(rep->status.root, sizeof(rep->status.root), "%s", c->peer.rule->root);
	return 0;
}

/* The fds c holds in its frame changed by delta: the owner's and the
 * broker's counts follow (fd_headroom, conn_throttle). */
static void frame_fds_count(struct conn *c, int delta)
{
	c->b->frame_fds = (unsigned)((int)c->b->frame_fds + delta);
	if (c->peer.owner)
		c->peer.owner->frame_fds = (unsigned)((int)c->peer.owner->frame_fds + delta);
}

/* Drops a partial frame; its fds go the careful way. */
static void frame_reset(struct conn *c)
{
	struct frame_in *in = &c->in;

	peer_fds_drop(c->b, c->peer.owner, in->fds, in->nfds);
	frame_fds_count(c, -(int)in->nfds);
	in->nfds = 0;
	free(in->buf);
	in->buf = NULL;
	in->hdr_got = 0;
	in->len = in->got = 0;
}

/* The fds of one recvmsg: kept up to BROKER_FDS_MAX, else an error (the
 * surplus goes to the closer too). */
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
				frame_fds_count(c, 1);
			} else {
				peer_fd_drop(c->b, c->peer.owner, fd);
				if (rc == 0)
					rc = -ETOOMANYREFS;
			}
		}
	}
	if (rc == 0 && (msg->msg_flags & MSG_CTRUNC))
		rc = -ETOOMANYREFS; /* cannot happen with SCM_MAX_FD of room; refused */
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
		char buf[CMSG_SPACE(sizeof(int) * BROKER_RECV_FDS_ROOM)];
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

/* A peer's socket: its queue may hold fds in flight, let go of when it
 * is; then it goes to a closer. The peer sees the end at once. */
static void peer_sock_close(struct broker *b, struct owner *o, int sock, bool rights)
{
	if (b->rights_gated && !rights) {
		close(sock); /* the kernel kept every fd out of it */
		return;
	}
	shutdown(sock, SHUT_RDWR);
	peer_fd_drop(b, o, sock);
}

static void conn_close(struct conn *c)
{
	struct broker *b = c->b;
	struct out_frame *f;

	log_debug("peer pid %d uid %d: connection closed", (int)c->peer.pid, (int)c->peer.uid);
	/* Its mounts lose their server: a new ferry-mountd may reattach. */
	struct bmount *m;
	TAILQ_FOREACH(m, &b->mounts, link)
		if (m->server == c)
			m->server = NULL;
	TAILQ_REMOVE(&b->conns, c, link);
	b->nconns--;
	event_free(c->rev);
	event_free(c->wev);
	event_free(c->tmo);
	frame_reset(c);
	while ((f = TAILQ_FIRST(&c->out))) {
		TAILQ_REMOVE(&c->out, f, link);
		if (f->fd >= 0)
			close(f->fd); /* ours: a /dev/fuse dup */
		free(f);
	}
	peer_sock_close(b, c->peer.owner, c->sock, c->rights);
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
		c->last_moved = now_s();
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
	} else if (!event_pending(c->wev, EV_WRITE, NULL)) {
		event_add(c->wev, NULL);
		c->last_moved = now_s(); /* the wait for the peer to read starts */
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
	uint32_t fds_safe = 0;
	char why[BROKER_MSG_MAX];
	size_t i;
	int rc;

	b->requests++;
	c->last_active = now_s();
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
		rc = dispatch[i].handler(b, c, &q, fds, nfds, &rep);
	rep.error = rc;
	fds_safe = rep.fds_safe;
	if (rc == 0 && (q.type == BROKER_MSG_MOUNT || q.type == BROKER_MSG_ATTACH ||
			q.type == BROKER_MSG_REATTACH))
		c->session = true; /* ferry-mountd's own: it stays while the mount does */
	if (rc == -ENOENT && q.type == BROKER_MSG_REATTACH) {
		/* The usual answer: nothing to take over, the peer mounts. */
		log_debug("peer pid %d uid %d: REATTACH %s: no such mount", (int)c->peer.pid,
			  (int)c->peer.uid, q.name);
	} else if (rc < 0) {
		b->refusals++;
		log_warnx("peer pid %d uid %d: %s%s%s: refused: %s (%s)", (int)c->peer.pid,
			  (int)c->peer.uid, broker_msg_name(q.type), q.has_name ? " " : "",
			  q.has_name ? q.name : "", rep.message, strerror(-rc));
		if (rep.fd >= 0)
			close(rep.fd);
		rep.fd = -1;
	} else if (rep.nmany) {
		/* Each item of a _MANY request is a request of its own for the
		 * counters and the log. */
		for (size_t k = 0; k < rep.nmany; k++) {
			uint32_t bid = q.type == BROKER_MSG_BACKING_OPEN_MANY ? rep.many_ids[k]
									      : q.backing_ids[k];

			if (rep.many_errors[k] < 0) {
				b->refusals++;
				log_warnx("peer pid %d uid %d: %s item %zu%s%" PRIu32 ": refused: %s",
					  (int)c->peer.pid, (int)c->peer.uid,
					  broker_msg_name(q.type), k, bid ? ", backing id " : "",
					  bid, strerror(-rep.many_errors[k]));
			} else if (log_get_level() >= LOG_LVL_DEBUG) {
				log_debug("peer pid %d uid %d: %s mount %" PRIu64 " backing id %"
					  PRIu32 ": ok", (int)c->peer.pid, (int)c->peer.uid,
					  broker_msg_name(q.type), q.mount_id, bid);
			}
		}
		if (rep.message[0])
			log_warnx("peer pid %d uid %d: %s: the first refusal: %s", (int)c->peer.pid,
				  (int)c->peer.uid, broker_msg_name(q.type), rep.message);
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
	/* The request's fds are the handler's to use, never to keep. Those
	 * it showed cannot reach a FUSE server close here; the others go
	 * the careful way. */
	for (size_t k = 0; k < nfds; k++) {
		if (fds[k] < 0)
			continue;
		if (fds_safe & (1u << k))
			close(fds[k]);
		else
			peer_fds_drop(b, c->peer.owner, &fds[k], 1);
		fds[k] = -1;
	}
}

/* Room in our fd table for what one more frame may bring (up to SCM_MAX_FD
 * fds): short of it, the kernel would drop fds inside our recvmsg. Counted:
 * every connection's socket, the fds held in partial frames, those of the
 * frame being handled, the mounts' and the closers'. */
static bool fd_headroom(struct broker *b)
{
	unsigned used = closer_pending_total() + b->nconns + b->frame_fds + BROKER_FDS_MAX +
			2 * b->nmounts + BROKER_FDS_RESERVED;

	return used + BROKER_RECV_FDS_ROOM < b->nofile;
}

/* Its owner's fds in partial frames are over the bound. */
static bool owner_frames_full(const struct conn *c)
{
	return c->peer.owner && c->peer.owner->frame_fds > BROKER_OWNER_FRAME_FDS_MAX;
}

/* Should c wait for its owner's fds to be closed? */
static bool conn_throttle(struct conn *c)
{
	if (closer_pending(c->peer.owner ? c->peer.owner->closer : NULL) <
		    BROKER_CLOSE_PENDING_MAX &&
	    !owner_frames_full(c) && fd_headroom(c->b))
		return false;
	if (!c->throttled) {
		c->throttled = true;
		event_del(c->rev);
		log_warnx("peer pid %d uid %d: fds it sent are still closing (or the fd table is "
			  "short): not reading it for now", (int)c->peer.pid, (int)c->peer.uid);
	}
	return true;
}

/* The connection of o to give up: one that serves no mount before one that
 * does, then the least recently active. */
static struct conn *lru_conn_of(struct broker *b, const struct owner *o)
{
	struct conn *c, *best = NULL;

	TAILQ_FOREACH(c, &b->conns, link) {
		if (c->peer.owner != o || c->closing)
			continue;
		if (!best || (best->session && !c->session) ||
		    (best->session == c->session && c->last_active < best->last_active))
			best = c;
	}
	return best;
}

void server_cut_off(struct broker *b, struct owner *o)
{
	struct conn *c, *next;

	for (c = TAILQ_FIRST(&b->conns); c; c = next) {
		next = TAILQ_NEXT(c, link);
		if (c->peer.owner == o)
			conn_close(c);
	}
}

void server_tick(struct broker *b)
{
	struct conn *c, *next;
	time_t now = now_s();

	for (c = TAILQ_FIRST(&b->conns); c; c = next) {
		next = TAILQ_NEXT(c, link);
		if (!TAILQ_EMPTY(&c->out) && now - c->last_moved >= BROKER_FRAME_TIMEOUT_S) {
			log_warnx("peer pid %d uid %d: has not read its replies for %d s; closing",
				  (int)c->peer.pid, (int)c->peer.uid, BROKER_FRAME_TIMEOUT_S);
			conn_close(c);
			continue;
		}
		if (!c->session && b->idle_timeout_s && TAILQ_EMPTY(&c->out) &&
		    c->in.hdr_got == 0 && now - c->last_active >= (time_t)b->idle_timeout_s) {
			log_debug("peer pid %d uid %d: idle for %u s; closing", (int)c->peer.pid,
				  (int)c->peer.uid, b->idle_timeout_s);
			conn_close(c);
			continue;
		}
		if (!c->throttled || !fd_headroom(b) || owner_frames_full(c) ||
		    closer_pending(c->peer.owner ? c->peer.owner->closer : NULL) >=
			    BROKER_CLOSE_PENDING_MAX / 2)
			continue;
		c->throttled = false;
		if (!c->paused && !c->closing)
			event_add(c->rev, NULL);
	}
	if (b->accept_paused &&
	    closer_pending(b->stranger_closer) < BROKER_STRANGER_PENDING_MAX / 2) {
		b->accept_paused = false;
		event_add(b->listen_ev, NULL);
		log_info("refused peers' sockets are closed: accepting connections again");
	}
	if (b->refused_at_accept && now - b->refused_logged >= 10) {
		log_warnx("refused %" PRIu64 " connections of peers no rule admits (or of wedged "
			  "or over-limit owners) in the last %d s", b->refused_at_accept,
			  b->refused_logged ? (int)(now - b->refused_logged) : 10);
		b->refused_at_accept = 0;
		b->refused_logged = now;
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
				conn_fatal(c, 0, rc, "frame", "more than 16 fds with a frame");
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
		frame_fds_count(c, -(int)nfds);
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

static unsigned operator_conns(struct broker *b)
{
	struct conn *c;
	unsigned n = 0;

	TAILQ_FOREACH(c, &b->conns, link)
		if (!c->peer.owner)
			n++;
	return n;
}

/* Is there a slot for p? Takes one from the biggest holder if all are
 * taken and p's owner holds fewer. */
static bool conn_slot(struct broker *b, const struct peer *p)
{
	struct owner *o, *big = NULL;
	struct conn *victim;
	unsigned mine = p->owner ? p->owner->nconns - 1 : operator_conns(b);

	if (mine >= BROKER_CONN_PER_UID)
		return false;
	if (b->nconns < b->conn_max)
		return true;
	TAILQ_FOREACH(o, &b->owners, link)
		if (!big || o->nconns > big->nconns)
			big = o;
	if (!big || big == p->owner || big->nconns <= mine + 1)
		return false;
	victim = lru_conn_of(b, big);
	if (!victim)
		return false;
	log_info("peer pid %d uid %d: connection given up for uid %d, which holds fewer",
		 (int)victim->peer.pid, (int)victim->peer.uid, (int)p->uid);
	conn_close(victim);
	return true;
}

/* Where the kernel cannot keep fds out of refused peers' sockets, what
 * they park there waits in the strangers' closer; past
 * BROKER_STRANGER_PENDING_MAX of those, no more connections are accepted
 * until it drains (server_tick), so strangers cannot fill our fd table.
 * Connections already made go on. */
static void stranger_backlog(struct broker *b)
{
	if (b->accept_paused || !b->listen_ev ||
	    closer_pending(b->stranger_closer) < BROKER_STRANGER_PENDING_MAX)
		return;
	b->accept_paused = true;
	event_del(b->listen_ev);
	log_warnx("%u sockets of refused peers are still closing (they hold fds in flight?): "
		  "not accepting connections until they are closed", BROKER_STRANGER_PENDING_MAX);
}

void server_conn_add(struct broker *b, int fd)
{
	static const int one = 1;
	struct conn *c = calloc(1, sizeof(*c));
	int rc;

	if (!c) {
		log_warnx("out of memory for a connection");
		close(fd); /* rights are still off on it: nothing in flight */
		return;
	}
	c->b = b;
	c->sock = fd;
	TAILQ_INIT(&c->out);
	for (size_t k = 0; k < BROKER_FDS_MAX; k++)
		c->in.fds[k] = -1;
	rc = peer_identify(b, fd, &c->peer);
	if (rc == -EACCES || rc == -EBUSY) {
		b->refused_at_accept++;
		log_debug("peer pid %d uid %d: refused: %s", (int)c->peer.pid, (int)c->peer.uid,
			  rc == -EBUSY ? "its owner is wedged" : "no policy rule admits it");
		goto drop;
	}
	if (rc < 0) {
		log_errno(rc, "cannot identify a peer");
		goto drop;
	}
	if (!conn_slot(b, &c->peer)) {
		b->refused_at_accept++;
		log_debug("peer pid %d uid %d: refused: too many connections", (int)c->peer.pid,
			  (int)c->peer.uid);
		goto drop;
	}
	/* Only now may it send fds (peers send none before their first
	 * reply: broker_connect() asks STATUS first). */
	if (c->peer.rule && b->rights_gated) {
		if (setsockopt(fd, SOL_SOCKET, SO_PASSRIGHTS, &one, sizeof(one)) < 0) {
			log_warn("SO_PASSRIGHTS on a peer's connection");
			goto drop;
		}
	}
	c->rights = c->peer.rule != NULL;
	c->last_active = c->last_moved = now_s();
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
		log_debug("peer pid %d uid %d gid %d cgroup %s: connected; policy line %u, root %s",
			  (int)c->peer.pid, (int)c->peer.uid, (int)c->peer.gid,
			  c->peer.cgroup ? c->peer.cgroup : "(unknown)", c->peer.rule->line,
			  c->peer.rule->root);
	else
		log_debug("peer pid %d uid 0: connected: STATUS only", (int)c->peer.pid);
	return;
drop:
	if (c->rev)
		event_free(c->rev);
	if (c->wev)
		event_free(c->wev);
	if (c->tmo)
		event_free(c->tmo);
	/* Never admitted: not its owner's closer (which may be the stuck
	 * one), the strangers'. */
	peer_sock_close(b, NULL, fd, c->rights);
	peer_clear(b, &c->peer);
	free(c);
	stranger_backlog(b);
}

static void accept_cb(evutil_socket_t lfd, short what, void *arg)
{
	struct broker *b = arg;

	(void)what;
	for (;;) {
		int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);

		if (fd < 0) {
			if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED)
				log_warn("accept");
			return;
		}
		server_conn_add(b, fd);
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
	/* Connections inherit it from here: no fd can ride in before its
	 * peer is admitted. */
	{
		static const int zero = 0;

		b->rights_gated = setsockopt(fd, SOL_SOCKET, SO_PASSRIGHTS, &zero, sizeof(zero)) == 0;
	}
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
