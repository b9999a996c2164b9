/*
 * libFuzzer target: ferry-brokerd's whole request loop, in-process. Where
 * fuzz_broker.c feeds one payload to broker_request_parse(), this one
 * builds a struct broker as main.c does (a policy whose rules name our own
 * uid, 0, and uid 65534, with an empty temporary directory as root; a
 * state directory; SO_PASSRIGHTS gating), hands it one end of a socketpair
 * (or two) with server_conn_add() as accept_cb() would, and plays the peer
 * on the other end: frames and bytes of any shape, with 0 to 3 fds of many
 * kinds riding on them, while the libevent loop runs the server (frame
 * reading, fd custody, the dispatch table, the handlers, the output queue,
 * pausing and throttling, the closers, the timeouts).
 *
 * privs_drop() is never called: privs_become() then returns -EPERM, so
 * every handler refuses before it would resolve a name, mount, or issue a
 * backing ioctl. That is intended -- nothing real may happen on the
 * machine that runs the fuzzer -- and it is why no MOUNT, ATTACH or
 * BACKING_OPEN can succeed. To reach the handlers' table-driven paths
 * anyway (UMOUNT of a mount that is gone, BACKING_* on a known mount id,
 * another tenant's mount, the reap at max_mounts, a mount with backing
 * ids forgotten), the input may plant mount-table entries the way
 * mount_table_load() adopts records after a restart: a made-up unique id
 * (1..4), a mountinfo id no mount has, and optionally an unconnected
 * /dev/fuse fd (its ioctls fail with EPERM) and a few backing ids.
 *
 * The input: byte 0 is flags (FL_* below), then ops, each a control byte:
 *   op (ctl >> 5) 0-4: send a chunk, then pump the loop and read replies;
 *                 5:   send a chunk without pumping (frames pile up);
 *                 6:   plant a mount: one parameter byte (plant());
 *                 7:   a tick (what main.c's 1 s timer does), replies read;
 *                      with ctl bit 0, after time has passed (age()).
 *   A chunk goes to connection B if ctl bit 4 is set and B exists, else A.
 *   It is: ctl & 3 kind bytes (the fds, see enum fd_kind), a 2-byte
 *   big-endian length, that many bytes (fewer if the input ends), sent with
 *   one sendmsg (the fds ride on its first byte).
 * tests/fuzz/gen_broker_loop_corpus.py writes the seeds in this format.
 *
 * Checks, as they happen: every reply frame is at most BROKER_FRAME_MAX,
 * decodes, has version 1, says why when it refuses, carries no fd and no
 * success body of MOUNT/ATTACH/BACKING_OPEN; STATUS tells the policy root
 * to a peer with a rule and only to one; nothing follows a reply with
 * `closing`, and the connection is gone by the time that reply is read (as
 * it is when its socket reaches EOF, which never cuts a reply short unless
 * time passed); replies come one per request, in order, with its id, and
 * at the end every request on a connection still open has its reply; the
 * counts of connections, mounts and backing ids agree with the lists, per
 * owner and in all; the only mounts are planted ones. At the end of an
 * input (our ends closed): the connections go within 2 s;
 * once the planted mounts are forgotten, no mount and no backing id is
 * left; every closer drains within 1 s and then no owner is left
 * (closer_watch() frees idle ones); our fd count is what it was when
 * the input began; nothing is mounted on the policy root and the temporary
 * directories hold only what set-up made. Memory: libFuzzer's leak check
 * (ASan) per input.
 *
 * FUZZ_BROKER_LOG=1 in the environment logs the broker at debug level (to
 * see what a reproducer does); by default only errors. FUZZ_BROKER_NOFILE=N
 * makes b.nofile N (as main.c's RLIMIT_NOFILE) instead of our own limit.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

#include <linux/sockios.h>

#include "broker.pb-c.h"
#include "brokerd.h"
#include "log.h"

#ifndef SO_PASSRIGHTS
#define SO_PASSRIGHTS 83
#endif

/* Input flags (byte 0). */
#define FL_SMALL_BUF 0x01u    /* tiny socket buffers: both sides meet EAGAIN */
#define FL_LAZY 0x02u         /* replies are read only at a tick op */
#define FL_TIGHT_NOFILE 0x04u /* b.nofile small: fd_headroom() throttles soon */
#define FL_NO_RULE 0x08u      /* no rule for uid 0: root may ask STATUS only */
#define FL_UNGATED 0x10u      /* as on a kernel without SO_PASSRIGHTS (< 6.16) */
#define FL_TWO_CONNS 0x20u    /* a second connection, B */
#define FL_B_TENANT 0x40u     /* B is uid 65534's (else root's, like A) */
#define FL_IDLE_TIMEOUT 0x80u /* --idle-timeout 120 (else 0: never) */

enum { OP_SEND_NOPUMP = 5, OP_PLANT = 6, OP_TICK = 7 };
#define CTL_TO_B 0x10u
#define TICK_AGED 0x01u

#define TENANT_UID 65534u     /* the other rule's uid */
#define PLANT_SLOTS 4u        /* planted mount k: id k + 1, name "mk" */
#define TIGHT_NOFILE 400u     /* 64 + 253 + a little: throttles at ~20 pending */
#define IDLE_TIMEOUT_S 120u   /* main.c's default */
#define AGE_S 1000            /* how much time age() lets pass */
#define PUMP_MAX 64u          /* loop passes that move something, per pump */
#define PUMP_WAIT_MS 2000     /* how long a pump waits for a throttled peer */
#define SEND_TRIES 32u        /* sendmsg calls for one chunk before the rest is dropped */
#define CONN_GONE_MS 2000     /* a connection must go this soon after its peer's close */
#define CLOSERS_IDLE_MS 1000  /* every closer must drain this soon */
#define RBUF_SIZE (4u * (BROKER_FRAME_MAX + RPC_FRAME_HDR)) /* replies read, not yet whole */
#define IDS_MAX 4096u         /* requests tracked per connection (a 0-byte frame is 4) */

enum fd_kind {
	K_DEVNULL,
	K_PIPE_R,
	K_PIPE_W,
	K_SOCK,              /* a socketpair end whose peer is closed */
	K_SOCK_INFLIGHT,     /* ... holding a /dev/null in flight in its queue */
	K_SOCK_SELF,         /* ... holding itself: a cycle only unix_gc frees */
	K_SOCK_FUSE_INFLIGHT,/* ... holding a /dev/fuse fd in flight */
	K_SOCK_DGRAM,
	K_EVENTFD,
	K_MEMFD,
	K_MEMFD_APPEND,
	K_OPATH,             /* O_PATH of the regular file */
	K_DIR,
	K_FILE,              /* regular, O_RDWR, root's, one link: what BACKING_OPEN wants */
	K_FILE_RDONLY,
	K_FILE_APPEND,
	K_FILE_LINKED,       /* two links */
	K_FILE_NOBODY,       /* owned by uid 65534 */
	K_TMPFILE,           /* O_TMPFILE: no link */
	K_FUSE,              /* /dev/fuse O_RDWR (unconnected) */
	K_FUSE_RDONLY,
	K_PIDFD,
	K_COUNT
};

/* One connection: our end, the frames we sent on it and what we read. */
struct session {
	int sock;            /* our end; -1 once closed */
	int bsock;           /* the broker's end (its number: to find its conn) */
	bool has_rule;       /* a policy rule matches this peer */
	bool eof;            /* the broker closed its end */
	bool closing_seen;   /* a reply with `closing` came */
	/* Our byte stream cut into frames as the broker cuts it; each whole
	 * one awaits a reply with its id (0 if it does not decode). */
	uint8_t whdr[RPC_FRAME_HDR];
	size_t whdr_got;
	uint32_t wlen, wgot;
	uint8_t wbuf[BROKER_FRAME_MAX];
	bool wdone;          /* a frame too long for the broker: it stops there */
	uint64_t ids[IDS_MAX];
	size_t ids_head, ids_tail;
	bool ids_lost;       /* more than IDS_MAX: no longer matched */
	uint8_t rbuf[RBUF_SIZE];
	size_t rlen;
};

/* The broker and what set-up made live for the whole run; the rest is the
 * current input's. */
static struct {
	bool ready;
	struct broker b;
	struct policy *policy, *policy_norule;
	bool gated;          /* the kernel has SO_PASSRIGHTS */
	char root[64], state[64], files[64];
	char file[96], linked[96], linked2[96], nobody[96];
	unsigned nofile;
	uint64_t fds_base;   /* our fd count as an input begins */
	/* The input. */
	unsigned flags;
	bool aged;           /* time has passed (age()) */
	struct session *s[2];
	unsigned ns;
} F;

static void teardown(void);

/* What a leaked fd is, for the report: every fd and what it names. */
static void print_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	char path[64], target[256];
	ssize_t n;

	if (!d)
		return;
	while ((e = readdir(d))) {
		if (e->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "/proc/self/fd/%s", e->d_name);
		n = readlink(path, target, sizeof(target) - 1);
		target[n < 0 ? 0 : n] = '\0';
		fprintf(stderr, "fuzz_broker_loop: fd %s -> %s\n", e->d_name, target);

	}
	closedir(d);
}

static _Noreturn void __attribute__((format(printf, 1, 2))) die(const char *fmt, ...)
{
	va_list ap;

	fputs("fuzz_broker_loop: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	teardown(); /* abort() skips atexit(): the temporary directories go here */
	abort();
}

static int64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- set-up ---- */

static void make_file(const char *path, uid_t uid)
{
	int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);

	if (fd < 0 || write(fd, "ferry", 5) != 5 || (uid && fchown(fd, uid, uid) < 0))
		die("set-up: %s: %s", path, strerror(errno));
	close(fd);
}

static void teardown(void)
{
	/* At exit and in die(); empty paths (before set-up) name nothing. */
	unlink(F.file);
	unlink(F.linked);
	unlink(F.linked2);
	unlink(F.nobody);
	rmdir(F.files);
	rmdir(F.root);
	rmdir(F.state);
}

static void parse_policy(const char *text, struct policy **out)
{
	char err[512];

	if (policy_parse(text, strlen(text), "fuzz-policy", out, err, sizeof(err)) < 0)
		die("set-up: policy: %s", err);
}

static void setup(void)
{
	struct broker *b = &F.b;
	struct rlimit rl;
	char text[512];
	int probe;
	const int zero = 0;

	log_init("fuzz_broker_loop", getenv("FUZZ_BROKER_LOG") ? LOG_LVL_DEBUG : LOG_LVL_ERROR);
	signal(SIGPIPE, SIG_IGN); /* as main.c; every send here is MSG_NOSIGNAL anyway */
	snprintf(F.root, sizeof(F.root), "/tmp/fuzz-broker-root.XXXXXX");
	snprintf(F.state, sizeof(F.state), "/tmp/fuzz-broker-state.XXXXXX");
	snprintf(F.files, sizeof(F.files), "/tmp/fuzz-broker-files.XXXXXX");
	if (!mkdtemp(F.root) || !mkdtemp(F.state) || !mkdtemp(F.files))
		die("set-up: mkdtemp: %s", strerror(errno));
	atexit(teardown);
	/* The policy root: root's, 0755, empty -- no name resolves in it. */
	if (chmod(F.root, 0755) < 0 || chmod(F.files, 0755) < 0)
		die("set-up: chmod: %s", strerror(errno));
	snprintf(F.file, sizeof(F.file), "%s/file", F.files);
	snprintf(F.linked, sizeof(F.linked), "%s/linked", F.files);
	snprintf(F.linked2, sizeof(F.linked2), "%s/linked2", F.files);
	snprintf(F.nobody, sizeof(F.nobody), "%s/nobody", F.files);
	make_file(F.file, 0);
	make_file(F.linked, 0);
	if (link(F.linked, F.linked2) < 0)
		die("set-up: link: %s", strerror(errno));
	make_file(F.nobody, TENANT_UID);

	snprintf(text, sizeof(text),
		 "# fuzz_broker_loop\n"
		 "allow uid=0 root=%s max_mounts=2 max_backing=8\n"
		 "allow uid=%u root=%s max_mounts=2 max_backing=8\n", F.root, TENANT_UID, F.root);
	parse_policy(text, &F.policy);
	/* The tenant's rule only: root is then a peer no rule matches. */
	snprintf(text, sizeof(text), "allow uid=%u root=%s max_mounts=2 max_backing=8\n",
		 TENANT_UID, F.root);
	parse_policy(text, &F.policy_norule);
	b->policy = F.policy;
	b->base = event_base_new();
	b->stranger_closer = closer_new();
	if (!b->base || !b->stranger_closer)
		die("set-up: out of memory");
	b->socket_path = "(socketpair)";
	b->state_dir = F.state;
	b->state_fd = open(F.state, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
	if (b->state_fd < 0)
		die("set-up: %s: %s", F.state, strerror(errno));
	b->fusectl_fd = -1;
	b->listen_fd = -1;
	b->idle_timeout_s = 0;
	F.nofile = getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < (1u << 20) ?
			   (unsigned)rl.rlim_cur : 1u << 20;
	if (getenv("FUZZ_BROKER_NOFILE"))
		F.nofile = (unsigned)strtoul(getenv("FUZZ_BROKER_NOFILE"), NULL, 10);
	b->nofile = F.nofile;
	b->conn_max = BROKER_CONN_MAX;
	snprintf(b->boot_id, sizeof(b->boot_id), "fuzz");
	TAILQ_INIT(&b->conns);
	TAILQ_INIT(&b->owners);
	TAILQ_INIT(&b->mounts);
	/* As server_listen() finds out: on a kernel with SO_PASSRIGHTS (>=
	 * 6.16) a connection takes fds only once server_conn_add() admits
	 * its peer by a rule. */
	probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	F.gated = probe >= 0 &&
		  setsockopt(probe, SOL_SOCKET, SO_PASSRIGHTS, &zero, sizeof(zero)) == 0;
	if (probe >= 0)
		close(probe);
	F.fds_base = broker_count_fds();
	F.ready = true;
}

/* ---- fds of every kind ---- */

/* A socketpair end; inflight >= 0 is sent into its own queue first, so
 * that it holds that fd in flight; -2: itself. */
static int sock_end(int type, int inflight)
{
	union {
		struct cmsghdr align;
		char buf[CMSG_SPACE(sizeof(int))];
	} ctl;
	struct iovec iov = { .iov_base = "x", .iov_len = 1 };
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };
	struct cmsghdr *cm;
	int sv[2], fd;

	if (socketpair(AF_UNIX, type | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, sv) < 0)
		return -1;
	if (inflight != -1) {
		fd = inflight == -2 ? sv[0] : inflight;
		memset(&ctl, 0, sizeof(ctl));
		msg.msg_control = ctl.buf;
		msg.msg_controllen = sizeof(ctl.buf);
		cm = CMSG_FIRSTHDR(&msg);
		cm->cmsg_level = SOL_SOCKET;
		cm->cmsg_type = SCM_RIGHTS;
		cm->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(cm), &fd, sizeof(int));
		/* sv[1] writes into sv[0]'s queue. */
		(void)sendmsg(sv[1], &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
	}
	close(sv[1]);
	return sv[0];
}

static int sock_holding(const char *path, int flags)
{
	int in = open(path, flags | O_CLOEXEC), fd;

	if (in < 0)
		return -1;
	fd = sock_end(SOCK_STREAM, in);
	close(in); /* the queue holds its own reference */
	return fd;
}

static int make_fd(uint8_t sel)
{
	enum fd_kind k = (enum fd_kind)(sel % K_COUNT);
	int p[2], fd;

	switch (k) {
	case K_DEVNULL:
		return open("/dev/null", O_RDWR | O_CLOEXEC);
	case K_PIPE_R:
	case K_PIPE_W:
		if (pipe2(p, O_CLOEXEC | O_NONBLOCK) < 0)
			return -1;
		close(k == K_PIPE_R ? p[1] : p[0]);
		return k == K_PIPE_R ? p[0] : p[1];
	case K_SOCK:
		return sock_end(SOCK_STREAM, -1);
	case K_SOCK_INFLIGHT:
		return sock_holding("/dev/null", O_RDWR);
	case K_SOCK_SELF:
		return sock_end(SOCK_STREAM, -2);
	case K_SOCK_FUSE_INFLIGHT:
		return sock_holding("/dev/fuse", O_RDWR);
	case K_SOCK_DGRAM:
		return sock_end(SOCK_DGRAM, -1);
	case K_EVENTFD:
		return eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	case K_MEMFD:
	case K_MEMFD_APPEND:
		fd = memfd_create("fuzz-broker", MFD_CLOEXEC);
		if (fd >= 0 && k == K_MEMFD_APPEND)
			(void)fcntl(fd, F_SETFL, O_APPEND);
		return fd;
	case K_OPATH:
		return open(F.file, O_PATH | O_CLOEXEC);
	case K_DIR:
		return open(F.files, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	case K_FILE:
		return open(F.file, O_RDWR | O_CLOEXEC);
	case K_FILE_RDONLY:
		return open(F.file, O_RDONLY | O_CLOEXEC);
	case K_FILE_APPEND:
		return open(F.file, O_RDWR | O_APPEND | O_CLOEXEC);
	case K_FILE_LINKED:
		return open(F.linked, O_RDWR | O_CLOEXEC);
	case K_FILE_NOBODY:
		return open(F.nobody, O_RDWR | O_CLOEXEC);
	case K_TMPFILE:
		return open(F.files, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
	case K_FUSE:
		return open("/dev/fuse", O_RDWR | O_CLOEXEC);
	case K_FUSE_RDONLY:
		return open("/dev/fuse", O_RDONLY | O_CLOEXEC);
	case K_PIDFD:
		return (int)syscall(SYS_pidfd_open, getpid(), 0);
	case K_COUNT:
		break;
	}
	return -1;
}

/* ---- the broker's tables ---- */

/* The counts agree with the lists; the only mounts are planted ones. */
static void check_tables(void)
{
	const struct broker *b = &F.b;
	const struct owner *o;
	const struct bmount *m;
	const struct conn *c;
	unsigned nconns = 0, nmounts = 0;
	uint64_t nbacking = 0;

	TAILQ_FOREACH(c, &b->conns, link)
		nconns++;
	TAILQ_FOREACH(m, &b->mounts, link) {
		char name[16];

		snprintf(name, sizeof(name), "m%llu", (unsigned long long)(m->id - 1));
		if (m->id < 1 || m->id > PLANT_SLOTS || strcmp(m->name, name))
			die("mount %llu (%s) is in the table, but no mount can be made here",
			    (unsigned long long)m->id, m->name);
		if (mount_find_id((struct broker *)b, m->id) != m)
			die("mount %llu is not found by its id", (unsigned long long)m->id);
		nmounts++;
		nbacking += m->ids.n;
	}
	if (nconns != b->nconns || nmounts != b->nmounts || nbacking != b->nbacking)
		die("counts: nconns %u (list %u), nmounts %u (list %u), nbacking %llu (sets %llu)",
		    b->nconns, nconns, b->nmounts, nmounts, (unsigned long long)b->nbacking,
		    (unsigned long long)nbacking);
	TAILQ_FOREACH(o, &b->owners, link) {
		unsigned on = 0, oc = 0;
		uint64_t ob = 0;

		TAILQ_FOREACH(m, &o->mounts, olink) {
			if (m->owner != o)
				die("mount %llu is on the list of an owner not its own",
				    (unsigned long long)m->id);
			on++;
			ob += m->ids.n;
		}
		TAILQ_FOREACH(c, &b->conns, link)
			if (c->peer.owner == o)
				oc++;
		if (on != o->nmounts || ob != o->nbacking || oc != o->nconns)
			die("owner uid %d: nmounts %u (list %u), nbacking %u (sets %llu), nconns %u "
			    "(list %u)", (int)o->uid, o->nmounts, on, o->nbacking,
			    (unsigned long long)ob, o->nconns, oc);
	}
}

/*
 * Plants a mount-table entry as mount_table_load() adopts a record.
 * param: bits 0-1 slot, 2 made, 3 adopted, 4 holds a /dev/fuse fd, 5-6
 * backing ids 1..n registered, 7 the tenant's (uid 65534) rather than
 * root's.
 */
static void plant(uint8_t param)
{
	struct broker *b = &F.b;
	unsigned slot = param & 3u, nids = (param >> 5) & 3u;
	bool tenant = param & 0x80u;
	struct bmount *m;
	char name[8];

	if (mount_find_id(b, slot + 1))
		return;
	snprintf(name, sizeof(name), "m%u", slot);
	m = calloc(1, sizeof(*m));
	if (!m || !(m->name = strdup(name)))
		die("plant: out of memory");
	m->id = slot + 1;
	m->old_id = 0x7ffff000u + slot; /* in no mountinfo: never live */
	m->dev = makedev(0, 4000 + slot);
	m->gid = tenant ? TENANT_UID : 0;
	m->made = param & 0x04u;
	m->adopted = param & 0x08u;
	m->created = time(NULL);
	m->fuse_fd = (param & 0x10u) ? open("/dev/fuse", O_RDWR | O_CLOEXEC) : -1;
	m->owner = owner_get(b, tenant ? TENANT_UID : 0, F.root);
	if (!m->owner)
		die("plant: out of memory");
	for (uint32_t id = 1; id <= nids; id++)
		if (idset_add(&m->ids, id) < 0)
			die("plant: out of memory");
	/* As handle_backing_open() counts what it registered. */
	m->owner->nbacking += nids;
	b->nbacking += nids;
	mount_table_add(b, m);
}

/* The broker's connection of s, or NULL once it is closed. The broker's
 * ends of this input's connections are all open when it starts, so no
 * other connection can have its number. */
static struct conn *conn_of(const struct session *s)
{
	struct conn *c;

	TAILQ_FOREACH(c, &F.b.conns, link)
		if (c->sock == s->bsock)
			return c;
	return NULL;
}

/* Time passes: what a connection did last was AGE_S ago, and a frame it
 * started is overdue (its timer fires now). */
static void age(void)
{
	struct conn *c;

	F.aged = true;
	TAILQ_FOREACH(c, &F.b.conns, link) {
		c->last_active -= AGE_S;
		c->last_moved -= AGE_S;
	}
	server_tick(&F.b); /* the idle and the stalled go */
	TAILQ_FOREACH(c, &F.b.conns, link)
		if (evtimer_pending(c->tmo, NULL))
			event_active(c->tmo, EV_TIMEOUT, 1);
	event_base_loop(F.b.base, EVLOOP_NONBLOCK);
}

/* ---- our ends of the connections ---- */

static void expect(struct session *s, uint64_t id)
{
	if (s->ids_tail == IDS_MAX)
		s->ids_lost = true;
	else
		s->ids[s->ids_tail++] = id;
}

/* Bytes that went out on s: whole frames await their replies. */
static void sent(struct session *s, const uint8_t *p, size_t n)
{
	while (n && !s->wdone) {
		size_t take;

		if (s->whdr_got < RPC_FRAME_HDR) {
			s->whdr[s->whdr_got++] = *p++;
			n--;
			if (s->whdr_got < RPC_FRAME_HDR)
				continue;
			s->wlen = (uint32_t)s->whdr[0] << 24 | (uint32_t)s->whdr[1] << 16 |
				  (uint32_t)s->whdr[2] << 8 | s->whdr[3];
			s->wgot = 0;
			if (s->wlen > BROKER_FRAME_MAX) {
				expect(s, 0); /* refused from its header, and the end */
				s->wdone = true;
				return;
			}
		} else {
			take = s->wlen - s->wgot < n ? s->wlen - s->wgot : n;
			memcpy(s->wbuf + s->wgot, p, take);
			s->wgot += (uint32_t)take;
			p += take;
			n -= take;
		}
		if (s->whdr_got == RPC_FRAME_HDR && s->wgot == s->wlen) {
			Ferry__Broker__Request *q =
				ferry__broker__request__unpack(NULL, s->wlen, s->wbuf);

			expect(s, q ? q->id : 0);
			if (q)
				ferry__broker__request__free_unpacked(q, NULL);
			s->whdr_got = 0;
		}
	}
}

static void check_reply(struct session *s, const uint8_t *buf, size_t len)
{
	Ferry__Broker__Reply *r = ferry__broker__reply__unpack(NULL, len, buf);

	if (!r)
		die("a reply of %zu bytes does not decode", len);
	if (s->closing_seen)
		die("a reply came after one with `closing`");
	if (r->version != BROKER_PROTO_VERSION)
		die("reply version %u", r->version);
	if (r->error && (!r->message || !r->message[0]))
		die("a refusal (error %u, request %llu) says not why", r->error,
		    (unsigned long long)r->id);
	if (r->has_closing && r->closing && !r->error)
		die("a reply with `closing` and no error");
	/* One reply per request, in order, with its id -- but a frame refused
	 * for its fds or ancillary data is answered with id 0 as it arrives,
	 * maybe before it is whole. */
	if (s->ids_lost) {
		/* past IDS_MAX: not matched */
	} else if (s->ids_head < s->ids_tail && s->ids[s->ids_head] == r->id) {
		s->ids_head++;
	} else if (!(r->has_closing && r->closing && r->id == 0)) {
		die("reply with id %llu, %s", (unsigned long long)r->id,
		    s->ids_head < s->ids_tail ? "not the next request's" : "and no request waits");
	}
	/* Without privileges nothing can be mounted, attached or registered. */
	if (!r->error && (r->body_case == FERRY__BROKER__REPLY__BODY_MOUNTED ||
			  r->body_case == FERRY__BROKER__REPLY__BODY_ATTACHED ||
			  r->body_case == FERRY__BROKER__REPLY__BODY_BACKING_OPENED))
		die("request %llu succeeded (reply body %d) without privileges",
		    (unsigned long long)r->id, (int)r->body_case);
	/* A root is told to a peer a rule matches, and it is that rule's. */
	if (r->body_case == FERRY__BROKER__REPLY__BODY_STATUS &&
	    (s->has_rule ? !r->status->root || strcmp(r->status->root, F.root) :
			   r->status->root != NULL))
		die("STATUS says the root is %s (policy root %s, %s)",
		    r->status->root ? r->status->root : "(none)", F.root,
		    s->has_rule ? "its rule's" : "no rule for the peer");
	if (r->has_closing && r->closing)
		s->closing_seen = true;
	ferry__broker__reply__free_unpacked(r, NULL);
}

/* Reads what the broker sent on s; returns the bytes read. */
static size_t drain(struct session *s)
{
	union {
		struct cmsghdr align;
		char buf[CMSG_SPACE(sizeof(int) * 8)];
	} ctl;
	size_t total = 0;

	while (s->sock >= 0 && !s->eof) {
		struct iovec iov = { .iov_base = s->rbuf + s->rlen,
				     .iov_len = sizeof(s->rbuf) - s->rlen };
		struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf,
				      .msg_controllen = sizeof(ctl.buf) };
		ssize_t n = recvmsg(s->sock, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
		size_t off = 0;

		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno != EAGAIN && errno != EWOULDBLOCK && errno != ECONNRESET)
				die("recvmsg: %s", strerror(errno));
			break;
		}
		for (struct cmsghdr *cm = CMSG_FIRSTHDR(&msg); cm; cm = CMSG_NXTHDR(&msg, cm)) {
			if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS) {
				size_t k = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
				int fds[8];

				memcpy(fds, CMSG_DATA(cm), k * sizeof(int));
				rpc_fds_close(fds, k);
			}
			/* Only a MOUNT reply carries an fd, and none succeeds. */
			die("a reply came with ancillary data (%d/%d)", cm->cmsg_level,
			    cm->cmsg_type);
		}
		if (n == 0) {
			s->eof = true;
			break;
		}
		total += (size_t)n;
		s->rlen += (size_t)n;
		/* Whole frames out of rbuf. */
		while (s->rlen - off >= RPC_FRAME_HDR) {
			const uint8_t *h = s->rbuf + off;
			uint32_t len = (uint32_t)h[0] << 24 | (uint32_t)h[1] << 16 |
				       (uint32_t)h[2] << 8 | h[3];

			if (len > BROKER_FRAME_MAX)
				die("a reply frame of %u bytes", len);
			if (s->rlen - off < RPC_FRAME_HDR + len)
				break;
			check_reply(s, h + RPC_FRAME_HDR, len);
			off += RPC_FRAME_HDR + len;
		}
		memmove(s->rbuf, s->rbuf + off, s->rlen - off);
		s->rlen -= off;
	}
	/* The broker closes a connection in the same callback that writes its
	 * last reply (conn_settle), and EOF comes only from its close. */
	if ((s->closing_seen || s->eof) && conn_of(s))
		die("%s, but the connection is still there",
		    s->eof ? "our end saw EOF" : "a `closing` reply was read");
	/* Only a peer that did not read for too long loses a reply halfway. */
	if (s->eof && s->rlen && !F.aged)
		die("the connection ended in the middle of a reply (%zu bytes)", s->rlen);
	return total;
}

/* Bytes we sent that the broker has not read yet. */
static int unread(void)
{
	int total = 0;

	for (unsigned i = 0; i < F.ns; i++) {
		int n = 0;

		if (F.s[i]->sock >= 0 && ioctl(F.s[i]->sock, SIOCOUTQ, &n) == 0)
			total += n;
	}
	return total;
}

/* What main.c's one-second timer does. */
static void tick(void)
{
	closer_watch(&F.b);
	server_tick(&F.b);
}

static bool any_throttled(void)
{
	const struct conn *c;

	TAILQ_FOREACH(c, &F.b.conns, link)
		if (c->throttled)
			return true;
	return false;
}

/* Runs the loop until the broker has read what we sent and (unless lazy)
 * we have read what it answered, or nothing moves any more. */
static void pump(bool read_replies)
{
	int64_t deadline = now_ms() + PUMP_WAIT_MS;
	unsigned idle = 0, passes = 0;

	while (idle < 3 && passes < PUMP_MAX && F.b.nconns) {
		size_t got = 0;

		event_base_loop(F.b.base, EVLOOP_NONBLOCK);
		/* A peer throttled while its fds close is resumed by the tick. */
		server_tick(&F.b);
		for (unsigned k = 0; read_replies && k < F.ns; k++)
			got += drain(F.s[k]);
		check_tables();
		if (got) {
			idle = 0;
			passes++;
			continue;
		}
		/* Throttled with requests unread: its closer is at work (however
		 * slow the machine is), and the tick resumes it after. */
		if (unread() && any_throttled() && now_ms() < deadline) {
			usleep(50);
			continue;
		}
		idle++;
		passes++;
	}
}

/* One chunk with its fds; our copies of the fds are closed after. */
static void send_chunk(struct session *s, const uint8_t *p, size_t len, const uint8_t *kinds,
		       size_t nk)
{
	union {
		struct cmsghdr align;
		char buf[CMSG_SPACE(sizeof(int) * 3)];
	} ctl;
	int fds[3];
	size_t nfds = 0, off = 0;
	unsigned tries = 0;

	for (size_t i = 0; i < nk; i++) {
		int fd = make_fd(kinds[i]);

		if (fd >= 0)
			fds[nfds++] = fd;
	}
	while (off < len && s->sock >= 0 && !s->eof && tries++ < SEND_TRIES) {
		struct iovec iov = { .iov_base = (void *)(p + off), .iov_len = len - off };
		struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };
		ssize_t n;

		if (off == 0 && nfds) {
			struct cmsghdr *cm;

			memset(&ctl, 0, sizeof(ctl));
			msg.msg_control = ctl.buf;
			msg.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
			cm = CMSG_FIRSTHDR(&msg);
			cm->cmsg_level = SOL_SOCKET;
			cm->cmsg_type = SCM_RIGHTS;
			cm->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
			memcpy(CMSG_DATA(cm), fds, sizeof(int) * nfds);
		}
		n = sendmsg(s->sock, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
		if (n < 0 && errno == EPERM && msg.msg_controllen) {
			/* SO_PASSRIGHTS is off on the broker's end (a peer no
			 * rule admits): the kernel takes the bytes, not the fds. */
			rpc_fds_close(fds, nfds);
			nfds = 0;
			tries--;
			continue;
		}
		if (n > 0) {
			sent(s, p + off, (size_t)n);
			off += (size_t)n;
			continue;
		}
		if (n < 0 && (errno == EPIPE || errno == ECONNRESET))
			break; /* the broker closed the connection */
		if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
			die("sendmsg: %s", strerror(errno));
		/* Full: let the broker read (and, unless lazy, us read its replies). */
		pump(!(F.flags & FL_LAZY));
	}
	rpc_fds_close(fds, nfds);
}

static void run_ops(const uint8_t *p, const uint8_t *end)
{
	while (p < end) {
		unsigned ctl = *p++, op = ctl >> 5;
		struct session *s = F.s[(ctl & CTL_TO_B) && F.ns > 1];
		const uint8_t *kinds;
		size_t nk, len;

		if (op == OP_PLANT) {
			if (p < end)
				plant(*p++);
			check_tables();
			continue;
		}
		if (op == OP_TICK) {
			if (ctl & TICK_AGED)
				age();
			tick();
			pump(true);
			continue;
		}
		nk = ctl & 3u;
		if ((size_t)(end - p) < nk)
			nk = (size_t)(end - p);
		kinds = p;
		p += nk;
		len = 0;
		if (end - p >= 2) {
			len = (size_t)p[0] << 8 | p[1];
			p += 2;
		} else {
			p = end;
		}
		if (len > (size_t)(end - p))
			len = (size_t)(end - p);
		send_chunk(s, p, len, kinds, nk);
		p += len;
		if (op != OP_SEND_NOPUMP)
			pump(!(F.flags & FL_LAZY));
	}
}

/* ---- the start and the end of an input ---- */

/* A connection of uid's, as accept_cb() would hand it over. The socketpair
 * takes our effective ids as its peer's (SO_PEERCRED): for another uid
 * they are switched around it on this thread alone (the raw syscalls; the
 * closer threads keep theirs). */
static struct session *connect_as(uid_t uid, bool has_rule)
{
	struct session *s = calloc(1, sizeof(*s));
	int sv[2], rc;

	if (!s)
		die("out of memory");
	if (uid && (syscall(SYS_setresgid, -1, uid, -1) < 0 ||
		    syscall(SYS_setresuid, -1, uid, -1) < 0))
		die("cannot become uid %u: %s", (unsigned)uid, strerror(errno));
	rc = socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, sv);
	if (uid && (syscall(SYS_setresuid, -1, 0, -1) < 0 ||
		    syscall(SYS_setresgid, -1, 0, -1) < 0))
		die("cannot become root again: %s", strerror(errno));
	if (rc < 0)
		die("socketpair: %s", strerror(errno));
	if (F.b.rights_gated) {
		const int zero = 0;

		/* Inherited from a listening socket server_listen() gated: no
		 * fd rides in until server_conn_add() admits a rule's peer. */
		if (setsockopt(sv[0], SOL_SOCKET, SO_PASSRIGHTS, &zero, sizeof(zero)) < 0)
			die("SO_PASSRIGHTS: %s", strerror(errno));
	}
	if (F.flags & FL_SMALL_BUF) {
		const int small = 1; /* the kernel's minimum */

		/* Stream sockets: the sender's buffer bounds what is in flight. */
		setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &small, sizeof(small));
		setsockopt(sv[1], SOL_SOCKET, SO_SNDBUF, &small, sizeof(small));
	}
	s->sock = sv[1];
	s->bsock = sv[0];
	s->has_rule = has_rule;
	server_conn_add(&F.b, sv[0]); /* sv[0] is the broker's from here on */
	if (!conn_of(s))
		die("uid %u (%s) was not admitted", (unsigned)uid,
		    has_rule ? "with a rule" : "root, for STATUS");
	return s;
}

static unsigned dir_entries(const char *path)
{
	DIR *d = opendir(path);
	struct dirent *de;
	unsigned n = 0;

	if (!d)
		die("%s: %s", path, strerror(errno));
	while ((de = readdir(d)))
		if (strcmp(de->d_name, ".") && strcmp(de->d_name, ".."))
			n++;
	closedir(d);
	return n;
}

static void check_nothing_mounted(void)
{
	char line[4096];
	FILE *f = fopen("/proc/self/mountinfo", "re");

	if (!f)
		die("/proc/self/mountinfo: %s", strerror(errno));
	while (fgets(line, sizeof(line), f))
		if (strstr(line, F.root)) {
			fclose(f);
			die("something is mounted beneath the policy root: %s", line);
		}
	fclose(f);
}

/* closer_pending_total() drops as a close returns, a moment before that
 * closer's own closer_pending() does (its thread clears `current` after),
 * and owner_put() frees only an owner whose closer shows idle. */
static bool closers_busy(void)
{
	const struct owner *o;

	if (closer_pending_total())
		return true;
	TAILQ_FOREACH(o, &F.b.owners, link)
		if (closer_pending(o->closer))
			return true;
	return false;
}

static void finish(void)
{
	struct broker *b = &F.b;
	struct bmount *m;
	int64_t deadline;
	uint64_t nfds;

	/* Every whole request on a connection still open is answered (once we
	 * read, a lazy peer too). */
	pump(true);
	for (unsigned i = 0; i < F.ns; i++) {
		const struct session *s = F.s[i];

		if (conn_of(s) && !s->closing_seen && !s->ids_lost && s->ids_head != s->ids_tail)
			die("%zu requests unanswered on an open connection (the first: id %llu)",
			    s->ids_tail - s->ids_head, (unsigned long long)s->ids[s->ids_head]);
	}

	/* Our ends go: the connections must follow, whatever state they are
	 * in (a partial frame, replies queued, paused or throttled). */
	for (unsigned i = 0; i < F.ns; i++) {
		if (F.s[i]->sock >= 0)
			close(F.s[i]->sock);
		F.s[i]->sock = -1;
	}
	deadline = now_ms() + CONN_GONE_MS;
	while (b->nconns && now_ms() < deadline) {
		event_base_loop(b->base, EVLOOP_NONBLOCK);
		server_tick(b);
		if (b->nconns)
			usleep(50);
	}
	if (b->nconns)
		die("a connection outlived its peer's close by %d ms", CONN_GONE_MS);
	check_tables();

	/* What is left is planted; the broker forgets it as it does a mount
	 * that went away. Then nothing may be left. */
	while ((m = TAILQ_FIRST(&b->mounts)))
		mount_forget(b, m, "the fuzz input is over");
	if (b->nmounts || b->nbacking)
		die("nmounts %u, nbacking %llu with no mount left", b->nmounts,
		    (unsigned long long)b->nbacking);

	/* Every fd the peers sent is closed on a closer thread: wait for them,
	 * then the idle owners go. */
	deadline = now_ms() + CLOSERS_IDLE_MS;
	while (closers_busy() && now_ms() < deadline)
		usleep(50);
	if (closers_busy())
		die("%u fds still closing after %d ms", closer_pending_total(), CLOSERS_IDLE_MS);
	closer_watch(b);
	if (!TAILQ_EMPTY(&b->owners))
		die("owner uid %d (nconns %u, nmounts %u) left with nothing to hold it",
		    (int)TAILQ_FIRST(&b->owners)->uid, TAILQ_FIRST(&b->owners)->nconns,
		    TAILQ_FIRST(&b->owners)->nmounts);

	nfds = broker_count_fds();
	if (nfds != F.fds_base) {
		print_fds();
		die("%llu fds open, %llu as the input began: a leak", (unsigned long long)nfds,
		    (unsigned long long)F.fds_base);
	}
	if (dir_entries(F.root) || dir_entries(F.state) || dir_entries(F.files) != 4)
		die("files left in %s, %s or %s", F.root, F.state, F.files);
	check_nothing_mounted();
	for (unsigned i = 0; i < F.ns; i++)
		free(F.s[i]);
	F.ns = 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct broker *b = &F.b;

	if (!F.ready)
		setup();
	if (size < 1)
		return 0;
	F.flags = data[0];
	F.aged = false;
	/* Per input, not once at set-up: between inputs libFuzzer may start
	 * its symbolizer (a NEW_FUNC line), whose pipes are not ours. */
	F.fds_base = broker_count_fds();
	b->nofile = (F.flags & FL_TIGHT_NOFILE) ? TIGHT_NOFILE : F.nofile;
	b->policy = (F.flags & FL_NO_RULE) ? F.policy_norule : F.policy;
	b->rights_gated = F.gated && !(F.flags & FL_UNGATED);
	b->idle_timeout_s = (F.flags & FL_IDLE_TIMEOUT) ? IDLE_TIMEOUT_S : 0;
	F.s[F.ns++] = connect_as(0, !(F.flags & FL_NO_RULE));
	if (F.flags & FL_TWO_CONNS)
		F.s[F.ns++] = (F.flags & FL_B_TENANT) ? connect_as(TENANT_UID, true)
						      : connect_as(0, !(F.flags & FL_NO_RULE));
	check_tables();
	run_ops(data + 1, data + size);
	finish();
	return 0;
}
