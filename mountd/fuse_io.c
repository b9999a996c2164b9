/*
 * fuse_io: the FUSE connection of every mount, read and written through
 * libfuse's custom I/O (fuse_session_custom_io) so that a new ferry-mountd
 * can take over a connection whose daemon died (a brokered mount) or that
 * was handed to it (ferry mount --upgrade, handover.c).
 *
 * The broker keeps a dup of every /dev/fuse fd it mounts with, so the
 * kernel's connection outlives a crashed daemon: requests wait in it, and
 * the broker hands a new daemon a dup (REATTACH). The kernel sends INIT only
 * once per connection, and libfuse answers every other request with EIO
 * until it has seen one; it has no call to resume a session. So:
 *
 *  - the first daemon keeps a copy of the kernel's INIT request (its flags,
 *    protocol version, readahead) in the staging directory, .fuse-init;
 *  - a daemon that reattaches hands libfuse that copy as its first read.
 *    libfuse and op_init negotiate as they did the first time (same
 *    options, same kernel offer, so the same answer the kernel already
 *    holds); the reply is swallowed here (the kernel is not waiting for
 *    it, and would refuse an answer to a request it has not got), and
 *    then FUSE_NOTIFY_RESEND (Linux 6.9) asks the kernel to queue again
 *    every request the dead daemon had read and not answered, whose
 *    callers would otherwise wait forever. Reads from then on come from
 *    the kernel.
 *
 * Replies are spliced (splice_send) as libfuse would on its own fd; reads
 * are not (libfuse then offers no splice read, which ferry-mountd does not
 * ask for). Owned by struct mountd (md->fio); the fd is libfuse's once the
 * session has it.
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/fuse.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "handover_blob.h"
#include "log.h"
#include "mountd.h"

#ifndef FUSE_NOTIFY_RESEND
#define FUSE_NOTIFY_RESEND 7
#endif
#define INIT_FILE ".fuse-init"
#define INIT_TMP ".fuse-init.tmp"
#define INIT_MAX 512

static void init_save(struct mountd *md, const void *buf, size_t len)
{
	const char *tmp = INIT_TMP;
	int fd, rc = 0;

	fd = openat(md->staging_dirfd, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW,
		    0600);
	if (fd < 0 || write(fd, buf, len) != (ssize_t)len || fsync(fd) < 0)
		rc = -errno;
	if (fd >= 0)
		close(fd);
	if (rc == 0 && renameat(md->staging_dirfd, tmp, md->staging_dirfd, INIT_FILE) < 0)
		rc = -errno;
	if (rc < 0)
		log_errno(rc, "cannot keep the kernel's INIT in the staging directory: a daemon "
			  "started after a crash of this one cannot take the mount over");
}

static ssize_t io_read(int fd, void *buf, size_t len, void *userdata)
{
	struct mountd *md = userdata;
	struct fuse_io *io = &md->fio;
	ssize_t n;

	pthread_mutex_lock(&io->lock);
	if (io->replay_len) {
		if (len < io->replay_len) {
			pthread_mutex_unlock(&io->lock);
			errno = EINVAL;
			return -1;
		}
		memcpy(buf, io->replay, io->replay_len);
		n = (ssize_t)io->replay_len;
		io->replay_len = 0;
		pthread_mutex_unlock(&io->lock);
		return n;
	}
	/* Until the replayed INIT is answered libfuse would answer EIO to
	 * anything else, and requests are waiting in the kernel already:
	 * other workers read only after it. */
	while (io->swallow_unique)
		pthread_cond_wait(&io->cond, &io->lock);
	pthread_mutex_unlock(&io->lock);
	n = read(fd, buf, len);
	if (n >= (ssize_t)sizeof(struct fuse_in_header) && !io->captured) {
		const struct fuse_in_header *h = buf;
		if (h->opcode == FUSE_INIT && (size_t)n <= sizeof(io->init)) {
			int e = errno;
			memcpy(io->init, buf, (size_t)n);
			io->init_len = (size_t)n;
			init_save(md, buf, (size_t)n);
			io->captured = true;
			errno = e;
		}
	}
	return n;
}

static ssize_t io_writev(int fd, struct iovec *iov, int count, void *userdata)
{
	struct mountd *md = userdata;
	struct fuse_io *io = &md->fio;

	if (atomic_load(&io->swallowing) && count > 0 &&
	    iov[0].iov_len >= sizeof(struct fuse_out_header)) {
		const struct fuse_out_header *h = iov[0].iov_base;
		if (h->unique == io->swallow_unique) {
			struct fuse_out_header resend = { .len = sizeof(resend),
							  .error = FUSE_NOTIFY_RESEND, .unique = 0 };
			size_t total = 0;

			for (int k = 0; k < count; k++)
				total += iov[k].iov_len;
			if (h->error)
				log_warnx("taking over the FUSE connection: the replayed INIT was "
					  "refused (%s)", strerror(-h->error));
			if (write(fd, &resend, sizeof(resend)) < 0)
				log_warn("the kernel did not queue again the requests the dead "
					 "daemon had taken (FUSE_NOTIFY_RESEND needs Linux 6.9): "
					 "their callers wait until the mount goes");
			else
				log_info("took over the FUSE connection; the kernel queues again what "
					 "the dead daemon had not answered");
			atomic_store(&io->swallowing, false);
			pthread_mutex_lock(&io->lock);
			io->swallow_unique = 0;
			pthread_cond_broadcast(&io->cond);
			pthread_mutex_unlock(&io->lock);
			return (ssize_t)total;
		}
	}
	return writev(fd, iov, count);
}

static ssize_t io_splice_send(int fdin, off_t *offin, int fdout, off_t *offout, size_t len,
			      unsigned int flags, void *userdata)
{
	(void)userdata;
	return splice(fdin, offin, fdout, offout, len, flags);
}

static const struct fuse_custom_io custom_io = {
	.writev = io_writev,
	.read = io_read,
	.splice_send = io_splice_send,
};

int fuse_io_saved_init(struct mountd *md, uint8_t *buf, size_t cap, size_t *len)
{
	int fd = openat(md->staging_dirfd, INIT_FILE, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	ssize_t n;
	int rc;

	if (fd < 0)
		return -errno;
	n = read(fd, buf, cap);
	rc = n < 0 ? -errno : 0;
	close(fd);
	if (rc < 0)
		return rc;
	*len = (size_t)n;
	return 0;
}

int fuse_io_start(struct mountd *md, int fuse_fd, const uint8_t *replay, size_t replay_len)
{
	int rc;

	pthread_mutex_init(&md->fio.lock, NULL);
	pthread_cond_init(&md->fio.cond, NULL);
	if (replay) {
		const struct fuse_in_header *h = (const struct fuse_in_header *)replay;

		if (!fuse_init_request_valid(replay, replay_len) ||
		    replay_len > sizeof(md->fio.replay))
			return -EBADMSG;
		memcpy(md->fio.replay, replay, replay_len);
		memcpy(md->fio.init, replay, replay_len); /* for a handover after this one */
		md->fio.init_len = replay_len;
		md->fio.replay_len = replay_len;
		md->fio.swallow_unique = h->unique;
		atomic_store(&md->fio.swallowing, true);
		md->fio.captured = true;
	}
	rc = fuse_session_custom_io(md->se, &custom_io, sizeof(custom_io), fuse_fd);
	if (rc < 0)
		return rc;
	md->fio.fd = fuse_fd;
	return 0;
}
