/*
 * rawfuse: a minimal FUSE server on the raw kernel protocol (rawfuse_util.h).
 * The structures are those of include/uapi/linux/fuse.h, protocol 7.40;
 * Debian 12's headers predate passthrough.
 */
#include "rawfuse_util.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <criterion/criterion.h>

enum {
	OP_LOOKUP = 1, OP_FORGET = 2, OP_GETATTR = 3, OP_SETATTR = 4, OP_OPEN = 14,
	OP_READ = 15, OP_WRITE = 16, OP_STATFS = 17, OP_RELEASE = 18, OP_FSYNC = 20,
	OP_FLUSH = 25, OP_INIT = 26, OP_INTERRUPT = 36, OP_DESTROY = 38, OP_BATCH_FORGET = 42,
};

#define INIT_EXT (1u << 30)
#define FLAGS2_PASSTHROUGH (1u << (37 - 32))
#define FOPEN_PASSTHROUGH_ (1u << 7)
#define BUF_SIZE (1u << 20)
#define MAX_WRITE (128u << 10)
#define NODE_ROOT 1
#define NODE_F 2

struct in_hdr {
	uint32_t len, opcode;
	uint64_t unique, nodeid;
	uint32_t uid, gid, pid;
	uint16_t total_extlen, padding;
};

struct out_hdr {
	uint32_t len;
	int32_t error;
	uint64_t unique;
};

struct init_in {
	uint32_t major, minor, max_readahead, flags, flags2, unused[11];
};

struct init_out {
	uint32_t major, minor, max_readahead, flags;
	uint16_t max_background, congestion_threshold;
	uint32_t max_write, time_gran;
	uint16_t max_pages, map_alignment;
	uint32_t flags2, max_stack_depth;
	uint32_t unused[6];
};

struct attr {
	uint64_t ino, size, blocks, atime, mtime, ctime;
	uint32_t atimensec, mtimensec, ctimensec;
	uint32_t mode, nlink, uid, gid, rdev, blksize, flags;
};

struct entry_out {
	uint64_t nodeid, generation, entry_valid, attr_valid;
	uint32_t entry_valid_nsec, attr_valid_nsec;
	struct attr attr;
};

struct attr_out {
	uint64_t attr_valid;
	uint32_t attr_valid_nsec, dummy;
	struct attr attr;
};

struct open_out {
	uint64_t fh;
	uint32_t open_flags;
	int32_t backing_id;
};

struct write_in {
	uint64_t fh, offset;
	uint32_t size, write_flags;
	uint64_t lock_owner;
	uint32_t flags, padding;
};

struct write_out {
	uint32_t size, padding;
};

struct statfs_out {
	uint64_t blocks, bfree, bavail, files, ffree;
	uint32_t bsize, namelen, frsize, padding, spare[6];
};

static void reply(struct rawfuse *rf, uint64_t unique, int error, const void *arg, size_t len)
{
	struct {
		struct out_hdr h;
		unsigned char body[256];
	} out;

	out.h.len = (uint32_t)(sizeof(out.h) + (error ? 0 : len));
	out.h.error = error;
	out.h.unique = unique;
	if (!error && len)
		memcpy(out.body, arg, len);
	/* ENOENT: the request was interrupted or the connection is going. */
	(void)!write(rf->fd, &out, out.h.len);
}

static void fill_attr(struct rawfuse *rf, uint64_t node, struct attr *a)
{
	memset(a, 0, sizeof(*a));
	a->ino = node;
	a->mode = node == NODE_ROOT ? (S_IFDIR | 0755) : (S_IFREG | 0644);
	a->nlink = node == NODE_ROOT ? 2 : 1;
	a->uid = rf->uid;
	a->gid = rf->gid;
	a->blksize = 4096;
	a->mtime = a->ctime = a->atime = (uint64_t)time(NULL);
}

static void serve_one(struct rawfuse *rf, const unsigned char *buf, size_t len)
{
	const struct in_hdr *h = (const void *)buf;
	const void *arg = buf + sizeof(*h);

	if (len < sizeof(*h))
		return;
	atomic_fetch_add(&rf->n_requests, 1);
	if (h->pid && (int)h->pid == atomic_load(&rf->watch_pid))
		atomic_fetch_add(&rf->n_from_watched, 1);
	switch (h->opcode) {
	case OP_INIT: {
		const struct init_in *in = arg;
		struct init_out o = { .major = 7, .minor = 40, .max_readahead = in->max_readahead,
				      .flags = INIT_EXT, .max_background = 16,
				      .congestion_threshold = 12, .max_write = MAX_WRITE,
				      .time_gran = 1, .max_pages = 32 };

		if ((in->flags & INIT_EXT) && (in->flags2 & FLAGS2_PASSTHROUGH)) {
			o.flags2 = FLAGS2_PASSTHROUGH;
			o.max_stack_depth = 1;
			atomic_store(&rf->passthrough, true);
		}
		atomic_fetch_add(&rf->n_init, 1);
		reply(rf, h->unique, 0, &o, sizeof(o));
		atomic_store(&rf->inited, true);
		break;
	}
	case OP_LOOKUP: {
		struct entry_out e = { .nodeid = NODE_F, .generation = 1 };

		if (h->nodeid != NODE_ROOT || strcmp((const char *)arg, "f")) {
			reply(rf, h->unique, -ENOENT, NULL, 0);
			break;
		}
		fill_attr(rf, NODE_F, &e.attr);
		reply(rf, h->unique, 0, &e, sizeof(e));
		break;
	}
	case OP_GETATTR:
	case OP_SETATTR: {
		struct attr_out a = { 0 };

		fill_attr(rf, h->nodeid, &a.attr);
		reply(rf, h->unique, 0, &a, sizeof(a));
		break;
	}
	case OP_OPEN: {
		struct open_out o = { .fh = 1 };
		int id = atomic_load(&rf->backing_id);

		atomic_fetch_add(&rf->n_open, 1);
		if (h->nodeid != NODE_F) {
			reply(rf, h->unique, -EISDIR, NULL, 0);
			break;
		}
		if (id > 0) {
			o.open_flags = FOPEN_PASSTHROUGH_;
			o.backing_id = id;
		}
		reply(rf, h->unique, 0, &o, sizeof(o));
		break;
	}
	case OP_READ:
		reply(rf, h->unique, 0, NULL, 0); /* empty: at EOF */
		break;
	case OP_WRITE: {
		const struct write_in *w = arg;
		struct write_out o = { .size = w->size };

		atomic_fetch_add(&rf->n_write, 1);
		reply(rf, h->unique, 0, &o, sizeof(o)); /* taken, and dropped */
		break;
	}
	case OP_STATFS: {
		struct statfs_out s = { .bsize = 4096, .namelen = 255, .frsize = 4096 };

		atomic_fetch_add(&rf->n_statfs, 1);
		if (atomic_load(&rf->stall_statfs))
			break; /* never answered; the connection's end aborts it */
		reply(rf, h->unique, 0, &s, sizeof(s));
		break;
	}
	case OP_FLUSH:
		atomic_fetch_add(&rf->n_flush, 1);
		if (atomic_load(&rf->stall_flush))
			break; /* never answered: the closer waits until the abort */
		reply(rf, h->unique, 0, NULL, 0);
		break;
	case OP_RELEASE:
	case OP_FSYNC:
	case OP_DESTROY:
		reply(rf, h->unique, 0, NULL, 0);
		break;
	case OP_FORGET:
	case OP_BATCH_FORGET:
	case OP_INTERRUPT:
		break; /* no reply */
	default:
		reply(rf, h->unique, -ENOSYS, NULL, 0);
		break;
	}
}

static void *serve(void *arg)
{
	struct rawfuse *rf = arg;
	unsigned char *buf = malloc(BUF_SIZE);

	if (!buf)
		return NULL;
	for (;;) {
		struct pollfd p[2] = { { .fd = rf->fd, .events = POLLIN },
				       { .fd = rf->stop_fd, .events = POLLIN } };
		ssize_t n;

		if (poll(p, 2, -1) < 0) {
			if (errno == EINTR)
				continue;
			break;
		}
		if (p[1].revents)
			break;
		if (p[0].revents & (POLLERR | POLLHUP | POLLNVAL))
			break; /* the connection is gone (unmounted, aborted) */
		n = read(rf->fd, buf, BUF_SIZE);
		if (n < 0) {
			if (errno == EINTR || errno == EAGAIN || errno == ENOENT)
				continue;
			break; /* ENODEV: unmounted */
		}
		serve_one(rf, buf, (size_t)n);
	}
	free(buf);
	return NULL;
}

void rawfuse_start(struct rawfuse *rf, int fuse_fd, uid_t uid, gid_t gid)
{
	memset(rf, 0, sizeof(*rf));
	rf->uid = uid;
	rf->gid = gid;
	rf->fd = fcntl(fuse_fd, F_DUPFD_CLOEXEC, 3);
	cr_assert(rf->fd >= 0, "dup: %s", strerror(errno));
	rf->stop_fd = eventfd(0, EFD_CLOEXEC);
	cr_assert(rf->stop_fd >= 0);
	cr_assert(pthread_create(&rf->thread, NULL, serve, rf) == 0);
	rf->running = true;
}

bool rawfuse_wait_init(struct rawfuse *rf, int timeout_ms)
{
	for (int i = 0; i < timeout_ms; i++) {
		if (atomic_load(&rf->inited))
			return true;
		usleep(1000);
	}
	return atomic_load(&rf->inited);
}

void rawfuse_stop(struct rawfuse *rf)
{
	uint64_t one = 1;

	if (!rf->running)
		return;
	(void)!write(rf->stop_fd, &one, sizeof(one));
	pthread_join(rf->thread, NULL);
	close(rf->stop_fd);
	close(rf->fd);
	rf->running = false;
}
