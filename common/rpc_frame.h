/*
 * rpc_frame: the framing of every ferryfs RPC on a Unix stream socket (the
 * reconciler's now, the broker's later): a 4-byte big-endian length, then
 * that many bytes of message, with up to RPC_FDS_MAX file descriptors riding
 * as SCM_RIGHTS on the sendmsg that carries the frame's first byte.
 *
 * The length is checked against the reader's maximum before any allocation,
 * so a peer cannot make us allocate or decode more than that. Received fds
 * come O_CLOEXEC (MSG_CMSG_CLOEXEC); on every error they are closed here, so
 * a caller never owns an fd of a frame it did not get whole.
 *
 * Blocking callers use rpc_frame_send()/rpc_frame_recv(). Event-driven
 * callers keep a struct rpc_reader per connection and call rpc_reader_read()
 * whenever the socket is readable; replies go out through their own buffer
 * after rpc_frame_header().
 *
 * Errors (negative errno):
 *   -EPIPE       the peer closed the connection between two frames
 *   -EPROTO      the peer closed it in the middle of a frame (truncated)
 *   -EMSGSIZE    the frame is longer than the reader's maximum
 *   -ETOOMANYREFS more fds than allowed came with a frame (or the kernel had
 *                to drop some: MSG_CTRUNC)
 *   -EBADMSG     ancillary data other than SCM_RIGHTS
 *   -EAGAIN      (rpc_frame_recv on a socket with SO_RCVTIMEO) timed out
 *   other        the socket call's errno
 * Nothing here logs.
 */
#ifndef FERRY_RPC_FRAME_H
#define FERRY_RPC_FRAME_H

#include <stddef.h>
#include <stdint.h>

#define RPC_FRAME_HDR 4u
#define RPC_FRAME_MAX_DEFAULT (64u << 10)
#define RPC_FDS_MAX 16u /* ferry-brokerd's BACKING_OPEN_MANY */

/* Writes the 4-byte header for a message of len bytes. */
void rpc_frame_header(uint8_t hdr[RPC_FRAME_HDR], uint32_t len);

/*
 * Sends one frame (header, buf[0..len)) with fds[0..nfds) (nfds <=
 * RPC_FDS_MAX) on a blocking socket, retrying on EINTR and partial writes;
 * the fds stay the caller's. MSG_NOSIGNAL: a closed peer is -EPIPE, not a
 * signal. -EMSGSIZE if len exceeds UINT32_MAX, -EINVAL for too many fds.
 */
int rpc_frame_send(int sock, const void *buf, size_t len, const int *fds, size_t nfds);

/* The receive state of one connection. Zero it with rpc_reader_init(). */
struct rpc_reader {
	uint32_t max;                 /* largest frame accepted */
	uint32_t max_fds;             /* most fds accepted with one frame */
	uint8_t hdr[RPC_FRAME_HDR];
	size_t hdr_got;
	uint8_t *buf;                 /* the frame being read, malloc'ed once its length passed */
	uint32_t len;
	uint32_t got;
	int fds[RPC_FDS_MAX];
	size_t nfds;
	int done;                     /* a whole frame is in buf/fds */
};

/* max 0: RPC_FRAME_MAX_DEFAULT; max_fds is capped at RPC_FDS_MAX. */
void rpc_reader_init(struct rpc_reader *r, uint32_t max, uint32_t max_fds);
/*
 * Reads what the socket has towards the next frame. Returns 1 when a whole
 * frame is there (take it with rpc_reader_take()), 0 when the socket has no
 * more for now (EAGAIN on a non-blocking socket; never on a blocking one
 * unless SO_RCVTIMEO ran out) or a negative errno (see the top), after which
 * the reader holds nothing and the connection should be dropped -- except
 * -ENOMEM: no room for the frame's buffer yet; the reader keeps what it
 * read (header and fds) and a later call, with memory back, goes on. It
 * never reads past the end of the current frame, so fds of the next frame
 * stay in the socket.
 */
int rpc_reader_read(struct rpc_reader *r, int sock);
/*
 * Hands over the complete frame: *buf (malloc'ed, caller frees; NULL for a
 * 0-byte frame), *len, and the fds (caller closes them) into fds[0..*nfds),
 * fds having room for RPC_FDS_MAX. The reader is then ready for the next one.
 */
void rpc_reader_take(struct rpc_reader *r, uint8_t **buf, size_t *len, int *fds, size_t *nfds);
/* Drops a partial frame and closes its fds. Accepts NULL. */
void rpc_reader_reset(struct rpc_reader *r);

/*
 * Blocking receive of one whole frame: a reader of its own with max and
 * max_fds; results as rpc_reader_take(). A timeout (SO_RCVTIMEO) part-way
 * through a frame leaves the stream unusable: close the socket then.
 */
int rpc_frame_recv(int sock, uint32_t max, uint32_t max_fds, uint8_t **buf, size_t *len,
		   int *fds, size_t *nfds);

/* Closes fds[0..n) and sets them to -1. */
void rpc_fds_close(int *fds, size_t n);

#endif
