/*
 * rpc_frame: length-prefixed frames with SCM_RIGHTS fds (rpc_frame.h).
 */
#include "rpc_frame.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

void rpc_fds_close(int *fds, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		if (fds[i] >= 0)
			close(fds[i]);
		fds[i] = -1;
	}
}

void rpc_frame_header(uint8_t hdr[RPC_FRAME_HDR], uint32_t len)
{
	hdr[0] = (uint8_t)(len >> 24);
	hdr[1] = (uint8_t)(len >> 16);
	hdr[2] = (uint8_t)(len >> 8);
	hdr[3] = (uint8_t)len;
}

int rpc_frame_send(int sock, const void *buf, size_t len, const int *fds, size_t nfds)
{
	union {
		struct cmsghdr align;
		char buf[CMSG_SPACE(sizeof(int) * RPC_FDS_MAX)];
	} ctl;
	uint8_t hdr[RPC_FRAME_HDR];
	struct iovec iov[2];
	struct msghdr msg;
	size_t total, sent = 0;
	int niov = 0;

	if (len > UINT32_MAX)
		return -EMSGSIZE;
	if (nfds > RPC_FDS_MAX || (nfds && !fds) || (len && !buf))
		return -EINVAL;
	rpc_frame_header(hdr, (uint32_t)len);
	total = RPC_FRAME_HDR + len;
	while (sent < total) {
		ssize_t n;

		/* Rebuild the iovecs from what is left. */
		niov = 0;
		if (sent < RPC_FRAME_HDR) {
			iov[niov].iov_base = hdr + sent;
			iov[niov++].iov_len = RPC_FRAME_HDR - sent;
			if (len) {
				iov[niov].iov_base = (void *)buf;
				iov[niov++].iov_len = len;
			}
		} else {
			iov[niov].iov_base = (uint8_t *)buf + (sent - RPC_FRAME_HDR);
			iov[niov++].iov_len = total - sent;
		}
		memset(&msg, 0, sizeof(msg));
		msg.msg_iov = iov;
		msg.msg_iovlen = (size_t)niov;
		/* The fds go with the frame's first byte, and only once. */
		if (sent == 0 && nfds) {
			struct cmsghdr *c;

			memset(&ctl, 0, sizeof(ctl));
			msg.msg_control = ctl.buf;
			msg.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
			c = CMSG_FIRSTHDR(&msg);
			c->cmsg_level = SOL_SOCKET;
			c->cmsg_type = SCM_RIGHTS;
			c->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
			memcpy(CMSG_DATA(c), fds, sizeof(int) * nfds);
		}
		n = sendmsg(sock, &msg, MSG_NOSIGNAL);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		sent += (size_t)n;
	}
	return 0;
}

void rpc_reader_init(struct rpc_reader *r, uint32_t max, uint32_t max_fds)
{
	memset(r, 0, sizeof(*r));
	r->max = max ? max : RPC_FRAME_MAX_DEFAULT;
	r->max_fds = max_fds < RPC_FDS_MAX ? max_fds : RPC_FDS_MAX;
	for (size_t i = 0; i < RPC_FDS_MAX; i++)
		r->fds[i] = -1;
}

void rpc_reader_reset(struct rpc_reader *r)
{
	if (!r)
		return;
	rpc_fds_close(r->fds, r->nfds);
	r->nfds = 0;
	free(r->buf);
	r->buf = NULL;
	r->hdr_got = 0;
	r->len = r->got = 0;
	r->done = 0;
}

/* Takes the fds of one recvmsg into the reader; on any problem closes every
 * fd that came (these and the frame's earlier ones) and returns the error. */
static int take_cmsgs(struct rpc_reader *r, struct msghdr *msg)
{
	int rc = 0;

	for (struct cmsghdr *c = CMSG_FIRSTHDR(msg); c; c = CMSG_NXTHDR(msg, c)) {
		if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
			size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
			int fd;

			for (size_t i = 0; i < n; i++) {
				memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
				if (rc == 0 && r->nfds < r->max_fds) {
					r->fds[r->nfds++] = fd;
					continue;
				}
				close(fd);
				if (rc == 0)
					rc = -ETOOMANYREFS;
			}
		} else if (rc == 0) {
			rc = -EBADMSG;
		}
	}
	if (rc == 0 && (msg->msg_flags & MSG_CTRUNC))
		rc = -ETOOMANYREFS; /* the kernel dropped fds that did not fit */
	return rc;
}

int rpc_reader_read(struct rpc_reader *r, int sock)
{
	/* Room for one fd more than allowed, so a surplus is seen as such. */
	union {
		struct cmsghdr align;
		char buf[CMSG_SPACE(sizeof(int) * (RPC_FDS_MAX + 1))];
	} ctl;
	int rc;

	if (r->done)
		return 1;
	/* The buffer an earlier call found no memory for. */
	if (r->hdr_got == RPC_FRAME_HDR && r->len && !r->buf && !(r->buf = malloc(r->len)))
		return -ENOMEM;
	for (;;) {
		struct iovec iov;
		struct msghdr msg;
		ssize_t n;
		int in_hdr = r->hdr_got < RPC_FRAME_HDR;

		if (in_hdr) {
			iov.iov_base = r->hdr + r->hdr_got;
			iov.iov_len = RPC_FRAME_HDR - r->hdr_got;
		} else {
			iov.iov_base = r->buf + r->got;
			iov.iov_len = r->len - r->got;
		}
		memset(&msg, 0, sizeof(msg));
		msg.msg_iov = &iov;
		msg.msg_iovlen = 1;
		msg.msg_control = ctl.buf;
		msg.msg_controllen = sizeof(ctl.buf);
		n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				return 0;
			rc = -errno;
			goto fail;
		}
		rc = take_cmsgs(r, &msg);
		if (rc < 0)
			goto fail;
		if (n == 0) {
			rc = (in_hdr && r->hdr_got == 0 && r->nfds == 0) ? -EPIPE : -EPROTO;
			goto fail;
		}
		if (in_hdr) {
			r->hdr_got += (size_t)n;
			if (r->hdr_got < RPC_FRAME_HDR)
				continue;
			r->len = (uint32_t)r->hdr[0] << 24 | (uint32_t)r->hdr[1] << 16 |
				 (uint32_t)r->hdr[2] << 8 | r->hdr[3];
			/* Checked before anything is allocated for it. */
			if (r->len > r->max) {
				rc = -EMSGSIZE;
				goto fail;
			}
			r->got = 0;
			/* No memory now: keep the header and fds, try again at
			 * the next call (the stream stays in step). */
			if (r->len && !(r->buf = malloc(r->len)))
				return -ENOMEM;
		} else {
			r->got += (uint32_t)n;
		}
		if (r->hdr_got == RPC_FRAME_HDR && r->got == r->len) {
			r->done = 1;
			return 1;
		}
	}
fail:
	rpc_reader_reset(r);
	return rc;
}

void rpc_reader_take(struct rpc_reader *r, uint8_t **buf, size_t *len, int *fds, size_t *nfds)
{
	*buf = r->buf;
	*len = r->len;
	for (size_t i = 0; i < r->nfds; i++)
		fds[i] = r->fds[i];
	*nfds = r->nfds;
	for (size_t i = 0; i < RPC_FDS_MAX; i++)
		r->fds[i] = -1;
	r->nfds = 0;
	r->buf = NULL;
	r->hdr_got = 0;
	r->len = r->got = 0;
	r->done = 0;
}

int rpc_frame_recv(int sock, uint32_t max, uint32_t max_fds, uint8_t **buf, size_t *len,
		   int *fds, size_t *nfds)
{
	struct rpc_reader r;
	int rc;

	*buf = NULL;
	*len = 0;
	*nfds = 0;
	rpc_reader_init(&r, max, max_fds);
	rc = rpc_reader_read(&r, sock);
	if (rc == 0) {
		/* Only a receive timeout stops a blocking read early. */
		rpc_reader_reset(&r);
		return -EAGAIN;
	}
	if (rc < 0) {
		rpc_reader_reset(&r); /* -ENOMEM keeps what it read: not here */
		return rc;
	}
	rpc_reader_take(&r, buf, len, fds, nfds);
	return 0;
}
