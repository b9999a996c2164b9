/*
 * libFuzzer target: what a peer of ferry-reconciler can send. The input is
 * [nfds][flags] and then a byte stream written to a real socketpair with
 * nfds fds of /dev/null on its first byte. Frames are read back with the
 * non-blocking rpc_reader (as the reconciler reads them), decoded and
 * checked as requests (and as replies and bare Handoffs). Checks: nothing
 * crashes, a request that passes is well formed and survives an encode /
 * decode round trip, its plan is sane, and no fd is left open.
 */
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "reconcile_job.h"
#include "reconcile_plan.h"
#include "rpc_frame.h"

static void check_job(const struct reconcile_job *j)
{
	struct reconcile_job k;
	uint8_t *buf;
	size_t len;

	if (reconcile_job_check(j, NULL, 0) != 0 || reconcile_name_check(j->name) != 0)
		abort();
	if (reconcile_job_encode(j, &buf, &len) != 0)
		abort();
	if (reconcile_job_decode(buf, len, &k, NULL, 0) != 0)
		abort();
	if (k.seq != j->seq || k.ino != j->ino || k.length != j->length ||
	    k.ndirty != j->ndirty || k.size_only != j->size_only || strcmp(k.name, j->name) ||
	    k.mtime.tv_sec != j->mtime.tv_sec || k.mtime.tv_nsec != j->mtime.tv_nsec ||
	    (j->ndirty && memcmp(k.dirty, j->dirty, j->ndirty * sizeof(*j->dirty))))
		abort();
	free(buf);
	reconcile_job_clear(&k);
	if (j->length <= (1u << 30)) {
		struct reconcile_plan p;
		uint64_t bytes = 0;

		if (reconcile_plan_make(j->length, j->dirty, j->ndirty, 1u << 20, &p) != 0)
			abort();
		for (size_t i = 0; i < p.nslices; i++) {
			uint64_t at = (uint64_t)p.slices[i].chunk * META_CHUNK_SIZE + p.slices[i].s.pos;
			if (!p.slices[i].s.len || at + p.slices[i].s.len > j->length)
				abort();
			bytes += p.slices[i].s.len;
		}
		if (bytes > j->length)
			abort(); /* ranges are disjoint: no byte twice */
		reconcile_plan_free(&p);
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	int sv[2], devnull[8], fds[RPC_FDS_MAX], probe_before, probe_after;
	size_t nfds_in;
	uint8_t flags;
	struct rpc_reader rd;

	if (size < 2)
		return 0;
	nfds_in = data[0] % 7;
	flags = data[1];
	data += 2;
	size -= 2;
	if (size > 60000)
		return 0; /* the socket buffer holds it without a reader */
	probe_before = open("/dev/null", O_RDONLY | O_CLOEXEC);
	close(probe_before);
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, sv) < 0)
		return 0;
	{
		int one = 1 << 20;
		setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &one, sizeof(one));
	}
	for (size_t i = 0; i < nfds_in; i++)
		devnull[i] = open("/dev/null", O_RDONLY | O_CLOEXEC);
	if (size) {
		char ctl[CMSG_SPACE(sizeof(int) * 8)];
		struct iovec iov = { (void *)data, size };
		struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };
		if (nfds_in) {
			struct cmsghdr *c;
			memset(ctl, 0, sizeof(ctl));
			msg.msg_control = ctl;
			msg.msg_controllen = CMSG_SPACE(sizeof(int) * nfds_in);
			c = CMSG_FIRSTHDR(&msg);
			c->cmsg_level = SOL_SOCKET;
			c->cmsg_type = SCM_RIGHTS;
			c->cmsg_len = CMSG_LEN(sizeof(int) * nfds_in);
			memcpy(CMSG_DATA(c), devnull, sizeof(int) * nfds_in);
		}
		if (sendmsg(sv[0], &msg, MSG_NOSIGNAL) != (ssize_t)size)
			abort();
	}
	for (size_t i = 0; i < nfds_in; i++)
		close(devnull[i]);
	if (!(flags & 1))
		close(sv[0]); /* else the stream just stops: the reader must wait */

	rpc_reader_init(&rd, (flags & 2) ? 512 : RECONCILE_FRAME_MAX, 1);
	for (;;) {
		uint8_t *buf;
		size_t len, n;
		int rc = rpc_reader_read(&rd, sv[1]);

		if (rc <= 0)
			break;
		rpc_reader_take(&rd, &buf, &len, fds, &n);
		if (n > 1 || len > RECONCILE_FRAME_MAX)
			abort();
		struct reconcile_request q;
		if (reconcile_request_decode(buf, len, n, &q, NULL, 0) == 0) {
			if (q.type == RECONCILE_REQ_HANDOFF) {
				if (n != 1)
					abort();
				check_job(&q.job);
			} else if (n != 0) {
				abort();
			} else if (q.type == RECONCILE_REQ_DROP && (q.ino == 0 || q.upto_seq == 0)) {
				abort();
			}
			reconcile_request_clear(&q);
		}
		struct reconcile_reply rep;
		if (reconcile_reply_decode(buf, len, &rep, NULL, 0) == 0) {
			uint8_t *b2;
			size_t l2;
			if (reconcile_reply_encode(&rep, &b2, &l2) != 0)
				abort();
			free(b2);
		}
		struct reconcile_job j;
		if (reconcile_job_decode(buf, len, &j, NULL, 0) == 0) {
			check_job(&j);
			reconcile_job_clear(&j);
		}
		rpc_fds_close(fds, n);
		free(buf);
	}
	rpc_reader_reset(&rd);
	if (flags & 1)
		close(sv[0]);
	close(sv[1]);
	probe_after = open("/dev/null", O_RDONLY | O_CLOEXEC);
	close(probe_after);
	if (probe_after != probe_before)
		abort(); /* an fd leaked */
	return 0;
}
