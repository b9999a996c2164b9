/*
 * broker_client: ferry-brokerd's client stubs (broker_client.h). One
 * connection is shared by many threads; replies are matched to requests by
 * id, and the thread that finds nobody reading reads for everyone
 * (leader/follower).
 */
#include "broker_client.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include "broker.pb-c.h"
#include "rpc_frame.h"

#define V BROKER_PROTO_VERSION

/* What came back for one request. */
struct reply {
	int error;                  /* 0 or -errno (the broker's) */
	int closing;
	uint64_t mount_id;
	uint32_t backing_id;
	struct broker_status status;
	/* BACKING_OPENED_MANY: ids and errors (0 or -errno), one per fd;
	 * BACKING_CLOSED_MANY: errors, one per id. */
	uint32_t many_ids[BROKER_CLOSE_MANY_MAX];
	int many_errors[BROKER_CLOSE_MANY_MAX];
	size_t nmany;
	int body;                   /* Ferry__Broker__Reply__BodyCase */
	char message[BROKER_MSG_MAX];
};

struct waiter {
	uint64_t id;
	bool done;
	bool detached;              /* nobody waits: the reader frees it */
	int close_ids[BROKER_CLOSE_MANY_MAX]; /* a BACKING_CLOSE(_MANY)'s backing ids */
	size_t nclose;
	int err;                    /* transport error, or 0 when rep is there */
	struct reply rep;
	int fd;                     /* an fd that came with the reply, or -1 */
	pthread_cond_t cv;
	struct waiter *next;
};

struct broker_conn {
	pthread_mutex_t lock;       /* everything below but sock's writes */
	pthread_mutex_t send_lock;  /* one frame at a time on the socket */
	pthread_cond_t idle;        /* users dropped to 0 */
	int sock;
	char *path;                 /* NULL: adopted, cannot reconnect */
	uint64_t next_id;
	struct waiter *waiters;
	bool reading;               /* a thread is in recvmsg for everyone */
	int dead;                   /* 0, or why the connection is unusable */
	unsigned users;             /* threads inside a call */
	unsigned ndetached;         /* requests sent whose replies nobody waits for */
	uint64_t async_failures;    /* of those, refused or lost */
	int *lost_closes;           /* of those, BACKING_CLOSEs lost with the connection */
	size_t nlost, caplost;
	int timeout_ms;
	uint32_t features;          /* BROKER_FEATURE_*, from the broker's last Status */
	struct rpc_reader rd;
};

static _Thread_local char last_msg[BROKER_MSG_MAX];

const char *broker_last_message(void)
{
	return last_msg;
}

static void set_msg(const char *m)
{
	snprintf(last_msg, sizeof(last_msg), "%s", m ? m : "");
}

static int apply_timeout(int sock, int ms)
{
	struct timeval tv = { .tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000 };

	if (setsockopt(sock, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) < 0 ||
	    setsockopt(sock, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) < 0)
		return -errno;
	return 0;
}

/*
 * The first round trip of a connection, before anything else is sent: a
 * STATUS whose reply shows the broker has admitted us. Only then does it
 * accept fds on the connection (SO_PASSRIGHTS), so a request with an fd
 * must not go out earlier. A broker that refuses us closes the socket.
 */
static int reply_decode(const uint8_t *buf, size_t len, uint64_t *id, struct reply *out);

static int hello(int sock, uint32_t *features)
{
	Ferry__Broker__Request q = FERRY__BROKER__REQUEST__INIT;
	Ferry__Broker__StatusQuery s = FERRY__BROKER__STATUS_QUERY__INIT;
	uint8_t buf[BROKER_FRAME_MAX], *rbuf = NULL;
	int fds[RPC_FDS_MAX];
	size_t len, nfds = 0;
	struct reply *rep = NULL; /* big: not on the stack */
	uint64_t id;
	int rc;

	*features = 0;
	q.version = V;
	q.id = 0; /* before any id of the connection's calls (they start at 1) */
	q.body_case = FERRY__BROKER__REQUEST__BODY_STATUS;
	q.status = &s;
	len = ferry__broker__request__get_packed_size(&q);
	if (len > sizeof(buf))
		return -EMSGSIZE;
	ferry__broker__request__pack(&q, buf);
	rc = rpc_frame_send(sock, buf, len, NULL, 0);
	if (rc == 0)
		rc = rpc_frame_recv(sock, BROKER_FRAME_MAX, BROKER_REPLY_FDS_MAX, &rbuf, &len, fds,
				    &nfds);
	rpc_fds_close(fds, nfds);
	/* What it can do; a reply that does not say (or does not decode:
	 * the calls will find out) leaves the first requests only. */
	if (rc == 0 && (rep = malloc(sizeof(*rep))) && reply_decode(rbuf, len, &id, rep) == 0 &&
	    rep->error == 0 && rep->body == FERRY__BROKER__REPLY__BODY_STATUS)
		*features = rep->status.features;
	free(rep);
	free(rbuf);
	if (rc == -EPIPE || rc == -EPROTO || rc == -ECONNRESET) {
		set_msg("the broker closed the connection at once: no policy rule admits this "
			"uid (or it is over its connection limit, or wedged)");
		return -ECONNREFUSED;
	}
	return rc;
}

static int open_socket(const char *path, int timeout_ms, int *out, uint32_t *features)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd, rc;

	if (strlen(path) >= sizeof(sa.sun_path))
		return -ENAMETOOLONG;
	strcpy(sa.sun_path, path);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		rc = -errno;
		goto fail;
	}
	rc = apply_timeout(fd, timeout_ms);
	if (rc < 0)
		goto fail;
	rc = hello(fd, features);
	if (rc < 0)
		goto fail;
	*out = fd;
	return 0;
fail:
	close(fd);
	return rc;
}

static int conn_new(int sock, const char *path, uint32_t features, struct broker_conn **out)
{
	struct broker_conn *c = calloc(1, sizeof(*c));

	if (!c)
		return -ENOMEM;
	if (path && !(c->path = strdup(path))) {
		free(c);
		return -ENOMEM;
	}
	pthread_mutex_init(&c->lock, NULL);
	pthread_mutex_init(&c->send_lock, NULL);
	pthread_cond_init(&c->idle, NULL);
	c->sock = sock;
	c->timeout_ms = BROKER_TIMEOUT_MS_DEFAULT;
	c->features = features;
	rpc_reader_init(&c->rd, BROKER_FRAME_MAX, BROKER_REPLY_FDS_MAX);
	*out = c;
	return 0;
}

int broker_connect(const char *path, struct broker_conn **out)
{
	uint32_t features;
	int sock, rc;

	*out = NULL;
	if (!path)
		return -EINVAL;
	rc = open_socket(path, BROKER_TIMEOUT_MS_DEFAULT, &sock, &features);
	if (rc < 0)
		return rc;
	rc = conn_new(sock, path, features, out);
	if (rc < 0)
		close(sock);
	return rc;
}

int broker_adopt(int sock, struct broker_conn **out)
{
	int rc;

	*out = NULL;
	if (sock < 0)
		return -EBADF;
	rc = apply_timeout(sock, BROKER_TIMEOUT_MS_DEFAULT);
	if (rc < 0)
		return rc;
	return conn_new(sock, NULL, 0, out); /* features: from its first broker_status() */
}

static void waiter_unlink(struct broker_conn *c, struct waiter *w)
{
	struct waiter **pp;

	for (pp = &c->waiters; *pp != w; pp = &(*pp)->next)
		;
	*pp = w->next;
}

/* With c->lock held: a reply nobody waits for came (w->done: with
 * failures refusals in it) or never will (!w->done). */
static void detached_done(struct broker_conn *c, struct waiter *w, unsigned failures)
{
	bool failed = failures > 0;

	waiter_unlink(c, w);
	c->async_failures += failures;
	for (size_t k = 0; failed && !w->done && k < w->nclose; k++) {
		/* No reply will come: the broker may have died before it
		 * closed the id. Kept for broker_lost_closes(); out of memory,
		 * it stays registered until the unmount. */
		if (c->nlost == c->caplost) {
			size_t cap = c->caplost ? c->caplost * 2 : 16;
			int *n = realloc(c->lost_closes, cap * sizeof(*n));

			if (n) {
				c->lost_closes = n;
				c->caplost = cap;
			}
		}
		if (c->nlost < c->caplost)
			c->lost_closes[c->nlost++] = w->close_ids[k];
	}
	if (w->fd >= 0)
		close(w->fd);
	pthread_cond_destroy(&w->cv);
	free(w);
	c->ndetached--;
}

void broker_close(struct broker_conn *c)
{
	struct waiter *w, *next;

	if (!c)
		return;
	for (w = c->waiters; w; w = next) {
		next = w->next;
		if (w->detached)
			detached_done(c, w, false);
	}
	rpc_reader_reset(&c->rd);
	if (c->sock >= 0)
		close(c->sock);
	free(c->lost_closes);
	pthread_mutex_destroy(&c->lock);
	pthread_mutex_destroy(&c->send_lock);
	pthread_cond_destroy(&c->idle);
	free(c->path);
	free(c);
}

int broker_set_timeout(struct broker_conn *c, int ms)
{
	int rc = 0;

	if (ms <= 0)
		return -EINVAL;
	pthread_mutex_lock(&c->lock);
	c->timeout_ms = ms;
	if (!c->dead)
		rc = apply_timeout(c->sock, ms);
	pthread_mutex_unlock(&c->lock);
	return rc;
}

/* With c->lock held: the connection is unusable from now on; every waiter
 * gets err, and a thread blocked on the socket gets out of it. */
static void conn_fail(struct broker_conn *c, int err)
{
	struct waiter *w, *next;

	if (!c->dead) {
		c->dead = err;
		shutdown(c->sock, SHUT_RDWR);
	}
	for (w = c->waiters; w; w = next) {
		next = w->next;
		if (w->detached) {
			detached_done(c, w, w->nclose ? (unsigned)w->nclose : 1);
			continue;
		}
		if (w->done)
			continue;
		w->done = true;
		w->err = err;
		pthread_cond_signal(&w->cv);
	}
}

int broker_reconnect(struct broker_conn *c)
{
	uint32_t features;
	int sock, rc = 0;

	pthread_mutex_lock(&c->lock);
	if (!c->dead)
		goto out;
	if (!c->path) {
		rc = -ENOTCONN;
		goto out;
	}
	/* Calls still inside fail promptly: the socket is shut down. */
	while (c->users)
		pthread_cond_wait(&c->idle, &c->lock);
	if (!c->dead)
		goto out; /* another thread reconnected meanwhile */
	rc = open_socket(c->path, c->timeout_ms, &sock, &features);
	if (rc < 0)
		goto out;
	close(c->sock);
	c->sock = sock;
	c->features = features; /* it may be another broker now */
	rpc_reader_reset(&c->rd);
	c->dead = 0;
out:
	pthread_mutex_unlock(&c->lock);
	return rc;
}

/* Decodes one reply frame (checked: version, error range, body). */
static int reply_decode(const uint8_t *buf, size_t len, uint64_t *id, struct reply *out)
{
	Ferry__Broker__Reply *r;
	int rc = 0;

	memset(out, 0, sizeof(*out));
	r = ferry__broker__reply__unpack(NULL, len, buf);
	if (!r)
		return -EBADMSG;
	if (r->version != V || r->error > 4095) {
		rc = -EBADMSG;
		goto out;
	}
	*id = r->id;
	out->error = -(int)r->error;
	out->closing = r->has_closing && r->closing;
	out->body = r->body_case;
	if (r->message)
		snprintf(out->message, sizeof(out->message), "%s", r->message);
	switch (r->body_case) {
	case FERRY__BROKER__REPLY__BODY_MOUNTED:
		out->mount_id = r->mounted->mount_id;
		break;
	case FERRY__BROKER__REPLY__BODY_ATTACHED:
		out->mount_id = r->attached->mount_id;
		break;
	case FERRY__BROKER__REPLY__BODY_BACKING_OPENED:
		out->backing_id = r->backing_opened->backing_id;
		if (out->backing_id == 0 || out->backing_id > INT32_MAX)
			rc = -EBADMSG;
		break;
	case FERRY__BROKER__REPLY__BODY_BACKING_OPENED_MANY: {
		const Ferry__Broker__BackingOpenedMany *m = r->backing_opened_many;

		if (m->n_backing_ids != m->n_errors || m->n_errors > BROKER_FDS_MAX) {
			rc = -EBADMSG;
			break;
		}
		for (size_t k = 0; k < m->n_errors && rc == 0; k++) {
			if (m->errors[k] > 4095 ||
			    (!m->errors[k] && (!m->backing_ids[k] || m->backing_ids[k] > INT32_MAX)))
				rc = -EBADMSG;
			out->many_ids[k] = m->errors[k] ? 0 : m->backing_ids[k];
			out->many_errors[k] = -(int)m->errors[k];
		}
		out->nmany = m->n_errors;
		break;
	}
	case FERRY__BROKER__REPLY__BODY_BACKING_CLOSED_MANY: {
		const Ferry__Broker__BackingClosedMany *m = r->backing_closed_many;

		if (m->n_errors > BROKER_CLOSE_MANY_MAX) {
			rc = -EBADMSG;
			break;
		}
		for (size_t k = 0; k < m->n_errors && rc == 0; k++) {
			if (m->errors[k] > 4095)
				rc = -EBADMSG;
			out->many_errors[k] = -(int)m->errors[k];
		}
		out->nmany = m->n_errors;
		break;
	}
	case FERRY__BROKER__REPLY__BODY_STATUS: {
		const Ferry__Broker__Status *s = r->status;
		out->status = (struct broker_status){
			.connections = s->connections, .peers = s->peers, .mounts = s->mounts,
			.backing_ids = s->backing_ids, .fds = s->fds, .requests = s->requests,
			.refusals = s->refusals, .features = s->has_features ? s->features : 0,
		};
		if (s->root) {
			if (strlen(s->root) > BROKER_ROOT_MAX || s->root[0] != '/')
				rc = -EBADMSG;
			else
				snprintf(out->status.root, sizeof(out->status.root), "%s", s->root);
		}
		break;
	}
	default:
		break;
	}
out:
	ferry__broker__reply__free_unpacked(r, NULL);
	return rc;
}

/* With c->lock held by the caller, who is the reader: reads one frame (the
 * lock is dropped meanwhile) and hands it to its waiter. */
static void read_one(struct broker_conn *c)
{
	uint8_t *buf = NULL;
	size_t len = 0, nfds = 0;
	int fds[RPC_FDS_MAX], rc;
	uint64_t id = 0;
	struct reply rep;
	struct waiter *w;

	c->reading = true;
	pthread_mutex_unlock(&c->lock);
	rc = rpc_reader_read(&c->rd, c->sock);
	if (rc == 0)
		rc = -ETIMEDOUT; /* SO_RCVTIMEO ran out: the stream is unusable now */
	if (rc > 0) {
		rpc_reader_take(&c->rd, &buf, &len, fds, &nfds);
		rc = reply_decode(buf, len, &id, &rep);
		free(buf);
	} else {
		rpc_reader_reset(&c->rd);
	}
	pthread_mutex_lock(&c->lock);
	c->reading = false;
	if (rc < 0) {
		/* A closed or broken connection is -EPIPE for whoever waits. */
		conn_fail(c, rc == -ETIMEDOUT ? rc : -EPIPE);
		rpc_fds_close(fds, nfds);
		return;
	}
	for (w = c->waiters; w; w = w->next)
		if (w->id == id && !w->done)
			break;
	if (w && w->detached) {
		unsigned failures = rep.error != 0;

		for (size_t k = 0; !rep.error && k < rep.nmany; k++)
			failures += rep.many_errors[k] < 0;
		w->done = true; /* answered: refused or not, not lost */
		detached_done(c, w, failures);
	} else if (w) {
		w->rep = rep;
		w->done = true;
		w->err = 0;
		if (nfds) {
			w->fd = fds[0];
			fds[0] = -1;
		}
		pthread_cond_signal(&w->cv);
	}
	rpc_fds_close(fds, nfds);
	if (!w || rep.closing)
		conn_fail(c, -EPIPE); /* a reply for nobody, or the broker is closing */
}

/*
 * One request/reply: q is filled but for its id. send_fds[0..nsend) ride
 * along and stay the caller's; *recv_fd (if not NULL) gets the reply's fd
 * or -1. Returns 0 with *rep, or a negative errno (transport or refusal).
 * nowait: return once the frame is sent (0, *rep untouched), leaving the
 * reply to whichever thread reads next -- unless BROKER_NOWAIT_MAX replies
 * are unread already; then it waits after all.
 */
static int call(struct broker_conn *c, Ferry__Broker__Request *q, const int *send_fds,
		size_t nsend, bool nowait, struct reply *rep, int *recv_fd)
{
	uint8_t buf[BROKER_FRAME_MAX];
	struct waiter stack_w = { .fd = -1 }, *w = &stack_w;
	size_t len;
	int rc;

	last_msg[0] = '\0';
	if (recv_fd)
		*recv_fd = -1;
	pthread_mutex_lock(&c->lock);
	if (c->dead) {
		pthread_mutex_unlock(&c->lock);
		set_msg("the connection to the broker is closed");
		return -ENOTCONN;
	}
	if (nowait && c->ndetached < BROKER_NOWAIT_MAX && (w = calloc(1, sizeof(*w))))
		w->fd = -1;
	else
		w = &stack_w, nowait = false;
	w->id = ++c->next_id;
	if (q->body_case == FERRY__BROKER__REQUEST__BODY_BACKING_CLOSE) {
		w->close_ids[0] = (int)q->backing_close->backing_id;
		w->nclose = 1;
	} else if (q->body_case == FERRY__BROKER__REQUEST__BODY_BACKING_CLOSE_MANY) {
		for (size_t k = 0; k < q->backing_close_many->n_backing_ids &&
				   k < BROKER_CLOSE_MANY_MAX; k++)
			w->close_ids[k] = (int)q->backing_close_many->backing_ids[k];
		w->nclose = q->backing_close_many->n_backing_ids < BROKER_CLOSE_MANY_MAX
				    ? q->backing_close_many->n_backing_ids : BROKER_CLOSE_MANY_MAX;
	}
	pthread_cond_init(&w->cv, NULL);
	w->next = c->waiters;
	c->waiters = w;
	c->users++;
	pthread_mutex_unlock(&c->lock);

	q->version = V;
	q->id = w->id;
	len = ferry__broker__request__get_packed_size(q);
	if (len > sizeof(buf)) {
		rc = -EMSGSIZE;
	} else {
		ferry__broker__request__pack(q, buf);
		pthread_mutex_lock(&c->send_lock);
		rc = rpc_frame_send(c->sock, buf, len, send_fds, nsend);
		pthread_mutex_unlock(&c->send_lock);
		if (rc == -EAGAIN)
			rc = -ETIMEDOUT;
		else if (rc == -ECONNRESET || rc == -ENOTCONN || rc == -EBADF)
			rc = -EPIPE;
	}

	pthread_mutex_lock(&c->lock);
	if (rc == -EMSGSIZE) {
		w->done = true;
		w->err = rc;
	} else if (rc < 0) {
		conn_fail(c, rc); /* a partial frame may have gone out */
	}
	if (nowait && !w->done) {
		/* Sent: its reply is the next reader's to take and drop. */
		w->detached = true;
		c->ndetached++;
		if (--c->users == 0)
			pthread_cond_broadcast(&c->idle);
		pthread_mutex_unlock(&c->lock);
		return 0;
	}
	while (!w->done) {
		if (!c->reading)
			read_one(c);
		else
			pthread_cond_wait(&w->cv, &c->lock);
	}
	waiter_unlink(c, w);
	/* If others wait and nobody reads, wake one to take over. */
	if (!c->reading)
		for (struct waiter *o = c->waiters; o; o = o->next)
			if (!o->done && !o->detached) {
				pthread_cond_signal(&o->cv);
				break;
			}
	if (--c->users == 0)
		pthread_cond_broadcast(&c->idle);
	pthread_mutex_unlock(&c->lock);
	pthread_cond_destroy(&w->cv);

	rc = w->err ? w->err : w->rep.error;
	if (w->err)
		set_msg(w->err == -ETIMEDOUT ? "no reply from the broker in time"
			: w->err == -EMSGSIZE ? "request too large"
					      : "the broker closed the connection");
	else if (w->rep.error)
		set_msg(w->rep.message);
	else
		*rep = w->rep;
	if (rc == 0 && recv_fd) {
		*recv_fd = w->fd;
		w->fd = -1;
	}
	if (w->fd >= 0)
		close(w->fd);
	if (w != &stack_w)
		free(w);
	return rc;
}

int broker_mount(struct broker_conn *c, const char *name, const char *const *options,
		 int *fuse_fd, uint64_t *mount_id)
{
	Ferry__Broker__Request q = FERRY__BROKER__REQUEST__INIT;
	Ferry__Broker__Mount m = FERRY__BROKER__MOUNT__INIT;
	struct reply rep;
	size_t n = 0;
	int rc, fd;

	*fuse_fd = -1;
	if (!name)
		return -EINVAL;
	while (options && options[n])
		n++;
	if (n > BROKER_OPTIONS_MAX)
		return -E2BIG;
	m.name = (char *)name;
	m.n_options = n;
	m.options = (char **)options;
	q.body_case = FERRY__BROKER__REQUEST__BODY_MOUNT;
	q.mount = &m;
	rc = call(c, &q, NULL, 0, false, &rep, &fd);
	if (rc < 0)
		return rc;
	if (rep.body != FERRY__BROKER__REPLY__BODY_MOUNTED || fd < 0) {
		if (fd >= 0)
			close(fd);
		set_msg("the broker's reply to a mount carried no fd");
		return -EBADMSG;
	}
	*fuse_fd = fd;
	if (mount_id)
		*mount_id = rep.mount_id;
	return 0;
}

int broker_reattach(struct broker_conn *c, const char *name, int *fuse_fd, uint64_t *mount_id)
{
	Ferry__Broker__Request q = FERRY__BROKER__REQUEST__INIT;
	Ferry__Broker__Reattach a = FERRY__BROKER__REATTACH__INIT;
	struct reply rep;
	int rc, fd;

	*fuse_fd = -1;
	if (!name)
		return -EINVAL;
	a.name = (char *)name;
	q.body_case = FERRY__BROKER__REQUEST__BODY_REATTACH;
	q.reattach = &a;
	rc = call(c, &q, NULL, 0, false, &rep, &fd);
	if (rc < 0)
		return rc;
	if (rep.body != FERRY__BROKER__REPLY__BODY_ATTACHED || fd < 0) {
		if (fd >= 0)
			close(fd);
		set_msg("the broker's reply to a reattach carried no fd");
		return -EBADMSG;
	}
	*fuse_fd = fd;
	if (mount_id)
		*mount_id = rep.mount_id;
	return 0;
}

int broker_attach(struct broker_conn *c, const char *name, int fuse_fd, uint64_t *mount_id)
{
	Ferry__Broker__Request q = FERRY__BROKER__REQUEST__INIT;
	Ferry__Broker__Attach a = FERRY__BROKER__ATTACH__INIT;
	struct reply rep;
	int rc;

	if (!name || fuse_fd < 0)
		return -EINVAL;
	a.name = (char *)name;
	q.body_case = FERRY__BROKER__REQUEST__BODY_ATTACH;
	q.attach = &a;
	rc = call(c, &q, &fuse_fd, 1, false, &rep, NULL);
	if (rc < 0)
		return rc;
	if (rep.body != FERRY__BROKER__REPLY__BODY_ATTACHED)
		return -EBADMSG;
	if (mount_id)
		*mount_id = rep.mount_id;
	return 0;
}

int broker_umount(struct broker_conn *c, const char *name, uint64_t mount_id)
{
	Ferry__Broker__Request q = FERRY__BROKER__REQUEST__INIT;
	Ferry__Broker__Umount u = FERRY__BROKER__UMOUNT__INIT;
	struct reply rep;

	if (name) {
		u.name = (char *)name;
	} else {
		u.has_mount_id = 1;
		u.mount_id = mount_id;
	}
	q.body_case = FERRY__BROKER__REQUEST__BODY_UMOUNT;
	q.umount = &u;
	return call(c, &q, NULL, 0, false, &rep, NULL);
}

int broker_backing_open(struct broker_conn *c, uint64_t mount_id, int fd)
{
	Ferry__Broker__Request q = FERRY__BROKER__REQUEST__INIT;
	Ferry__Broker__BackingOpen b = FERRY__BROKER__BACKING_OPEN__INIT;
	struct reply rep;
	int rc;

	if (fd < 0)
		return -EBADF;
	b.mount_id = mount_id;
	q.body_case = FERRY__BROKER__REQUEST__BODY_BACKING_OPEN;
	q.backing_open = &b;
	rc = call(c, &q, &fd, 1, false, &rep, NULL);
	if (rc < 0)
		return rc;
	if (rep.body != FERRY__BROKER__REPLY__BODY_BACKING_OPENED)
		return -EBADMSG;
	return (int)rep.backing_id;
}

static int backing_close(struct broker_conn *c, uint64_t mount_id, int backing_id, bool nowait)
{
	Ferry__Broker__Request q = FERRY__BROKER__REQUEST__INIT;
	Ferry__Broker__BackingClose b = FERRY__BROKER__BACKING_CLOSE__INIT;
	struct reply rep;

	if (backing_id <= 0)
		return -EINVAL;
	b.mount_id = mount_id;
	b.backing_id = (uint32_t)backing_id;
	q.body_case = FERRY__BROKER__REQUEST__BODY_BACKING_CLOSE;
	q.backing_close = &b;
	return call(c, &q, NULL, 0, nowait, &rep, NULL);
}

int broker_backing_close(struct broker_conn *c, uint64_t mount_id, int backing_id)
{
	return backing_close(c, mount_id, backing_id, false);
}

int broker_backing_close_nowait(struct broker_conn *c, uint64_t mount_id, int backing_id)
{
	return backing_close(c, mount_id, backing_id, true);
}

int broker_backing_open_many(struct broker_conn *c, uint64_t mount_id, const int *fds, size_t n,
			     int *ids)
{
	Ferry__Broker__Request q = FERRY__BROKER__REQUEST__INIT;
	Ferry__Broker__BackingOpenMany b = FERRY__BROKER__BACKING_OPEN_MANY__INIT;
	struct reply *rep = malloc(sizeof(*rep)); /* big: not on a FUSE worker's stack */
	int rc;

	if (!rep)
		return -ENOMEM;
	rc = n == 0 || n > BROKER_FDS_MAX ? -EINVAL : 0;
	for (size_t k = 0; k < n && rc == 0; k++)
		if (fds[k] < 0)
			rc = -EBADF;
	if (rc == 0 && !(broker_features(c) & BROKER_FEATURE_MANY)) {
		set_msg("this broker has no BACKING_OPEN_MANY");
		rc = -EOPNOTSUPP;
	}
	if (rc < 0)
		goto out;
	b.mount_id = mount_id;
	q.body_case = FERRY__BROKER__REQUEST__BODY_BACKING_OPEN_MANY;
	q.backing_open_many = &b;
	rc = call(c, &q, fds, n, false, rep, NULL);
	if (rc < 0)
		goto out;
	if (rep->body != FERRY__BROKER__REPLY__BODY_BACKING_OPENED_MANY || rep->nmany != n) {
		rc = -EBADMSG;
		goto out;
	}
	for (size_t k = 0; k < n; k++)
		ids[k] = rep->many_errors[k] < 0 ? rep->many_errors[k] : (int)rep->many_ids[k];
	if (rep->message[0])
		set_msg(rep->message);
out:
	free(rep);
	return rc;
}

static int backing_close_many(struct broker_conn *c, uint64_t mount_id, const int *ids, size_t n,
			      bool nowait, int *errs)
{
	Ferry__Broker__Request q = FERRY__BROKER__REQUEST__INIT;
	Ferry__Broker__BackingCloseMany b = FERRY__BROKER__BACKING_CLOSE_MANY__INIT;
	uint32_t bids[BROKER_CLOSE_MANY_MAX];
	struct reply *rep;
	int rc;

	if (n == 0 || n > BROKER_CLOSE_MANY_MAX)
		return -EINVAL;
	for (size_t k = 0; k < n; k++) {
		if (ids[k] <= 0)
			return -EINVAL;
		bids[k] = (uint32_t)ids[k];
	}
	if (!(broker_features(c) & BROKER_FEATURE_MANY)) {
		set_msg("this broker has no BACKING_CLOSE_MANY");
		return -EOPNOTSUPP;
	}
	rep = malloc(sizeof(*rep));
	if (!rep)
		return -ENOMEM;
	b.mount_id = mount_id;
	b.n_backing_ids = n;
	b.backing_ids = bids;
	q.body_case = FERRY__BROKER__REQUEST__BODY_BACKING_CLOSE_MANY;
	q.backing_close_many = &b;
	rc = call(c, &q, NULL, 0, nowait, rep, NULL);
	/* nowait: sent (and rep untouched), or waited after all (then rep
	 * has the reply, checked the same way). */
	if (rc == 0 && errs) {
		if (rep->body != FERRY__BROKER__REPLY__BODY_BACKING_CLOSED_MANY || rep->nmany != n)
			rc = -EBADMSG;
		else
			memcpy(errs, rep->many_errors, n * sizeof(*errs));
	}
	free(rep);
	return rc;
}

int broker_backing_close_many(struct broker_conn *c, uint64_t mount_id, const int *ids, size_t n,
			      int *errs)
{
	return backing_close_many(c, mount_id, ids, n, false, errs);
}

int broker_backing_close_many_nowait(struct broker_conn *c, uint64_t mount_id, const int *ids,
				     size_t n)
{
	return backing_close_many(c, mount_id, ids, n, true, NULL);
}

uint32_t broker_features(struct broker_conn *c)
{
	uint32_t f;

	pthread_mutex_lock(&c->lock);
	f = c->features;
	pthread_mutex_unlock(&c->lock);
	return f;
}

size_t broker_lost_closes(struct broker_conn *c, int *ids, size_t max)
{
	size_t n;

	pthread_mutex_lock(&c->lock);
	n = c->nlost < max ? c->nlost : max;
	if (n) { /* lost_closes may be NULL: never allocated */
		memcpy(ids, c->lost_closes, n * sizeof(*ids));
		memmove(c->lost_closes, c->lost_closes + n, (c->nlost - n) * sizeof(*ids));
		c->nlost -= n;
	}
	pthread_mutex_unlock(&c->lock);
	return n;
}

uint64_t broker_async_failures(struct broker_conn *c)
{
	uint64_t n;

	pthread_mutex_lock(&c->lock);
	n = c->async_failures;
	pthread_mutex_unlock(&c->lock);
	return n;
}

/* If path is strictly beneath root (lexically), the part after root's '/'. */
static const char *beneath(const char *root, const char *path)
{
	size_t n = strlen(root);

	while (n > 1 && root[n - 1] == '/')
		n--;
	if (n == 1 && root[0] == '/')
		n = 0; /* root "/" */
	if (strncmp(path, root, n) || path[n] != '/' || !path[n + 1])
		return NULL;
	return path + n + 1;
}

int broker_mount_name(const char *root, const char *mountpoint, char **name)
{
	char real[PATH_MAX];
	const char *rel;
	size_t len;

	*name = NULL;
	if (!root || !mountpoint || root[0] != '/' || mountpoint[0] != '/')
		return -EXDEV;
	rel = beneath(root, mountpoint);
	if (!rel && realpath(root, real))
		rel = beneath(real, mountpoint);
	if (!rel)
		return -EXDEV;
	len = strlen(rel);
	while (len && rel[len - 1] == '/')
		len--;
	if (!len || len > BROKER_NAME_MAX)
		return len ? -EINVAL : -EXDEV;
	*name = strndup(rel, len);
	if (!*name)
		return -ENOMEM;
	/* The broker checks names too; say it here, before the round trip. */
	for (const char *p = *name, *q; *p; p = *q ? q + 1 : q) {
		q = strchr(p, '/');
		if (!q)
			q = p + strlen(p);
		if (q == p || (q - p == 1 && p[0] == '.') ||
		    (q - p == 2 && p[0] == '.' && p[1] == '.')) {
			free(*name);
			*name = NULL;
			return -EINVAL;
		}
	}
	return 0;
}

int broker_status(struct broker_conn *c, struct broker_status *st)
{
	Ferry__Broker__Request q = FERRY__BROKER__REQUEST__INIT;
	Ferry__Broker__StatusQuery s = FERRY__BROKER__STATUS_QUERY__INIT;
	struct reply rep;
	int rc;

	q.body_case = FERRY__BROKER__REQUEST__BODY_STATUS;
	q.status = &s;
	rc = call(c, &q, NULL, 0, false, &rep, NULL);
	if (rc < 0)
		return rc;
	if (rep.body != FERRY__BROKER__REPLY__BODY_STATUS)
		return -EBADMSG;
	*st = rep.status;
	pthread_mutex_lock(&c->lock);
	c->features = rep.status.features; /* an adopted connection learns it here */
	pthread_mutex_unlock(&c->lock);
	return 0;
}

char *broker_mountpoint_path(const char *mountpoint)
{
	char parent[PATH_MAX], *copy = strdup(mountpoint), *slash, *out = NULL;
	const char *base;
	size_t n;

	if (!copy)
		return NULL;
	/* Trailing slashes name the same directory. */
	for (n = strlen(copy); n > 1 && copy[n - 1] == '/'; n--)
		copy[n - 1] = '\0';
	slash = strrchr(copy, '/');
	base = slash ? slash + 1 : copy;
	if (slash)
		*slash = '\0';
	if (!*base || !strcmp(base, ".") || !strcmp(base, "..")) {
		/* Nothing to keep apart: resolve it whole. */
		free(copy);
		return realpath(mountpoint, NULL);
	}
	if (!realpath(slash ? (*copy ? copy : "/") : ".", parent)) {
		free(copy);
		return NULL;
	}
	if (asprintf(&out, "%s/%s", strcmp(parent, "/") ? parent : "", base) < 0)
		out = NULL;
	free(copy);
	return out;
}
