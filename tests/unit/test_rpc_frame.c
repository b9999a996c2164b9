/*
 * rpc_frame: round trips with and without fds over real socketpairs,
 * blocking and non-blocking; oversize, truncated and garbage frames; fd
 * limits and MSG_CTRUNC; no fd is ever leaked.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "rpc_frame.h"

static int nfds_open(void)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *de;
	int n = 0;

	cr_assert(d);
	while ((de = readdir(d)))
		if (de->d_name[0] != '.')
			n++;
	closedir(d);
	return n - 1; /* the DIR's own fd */
}

static void pair(int sv[2], int nonblock)
{
	cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | (nonblock ? SOCK_NONBLOCK : 0),
				0, sv), 0);
}

static void same_file(int a, int b)
{
	struct stat sa, sb;

	cr_assert_eq(fstat(a, &sa), 0);
	cr_assert_eq(fstat(b, &sb), 0);
	cr_assert(sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino);
}

/* Sends raw bytes with n fds of /dev/null attached (any n). */
static void send_raw(int sock, const void *buf, size_t len, int nfd)
{
	char ctl[CMSG_SPACE(sizeof(int) * 64)];
	struct iovec iov = { (void *)buf, len };
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };
	int fds[64];

	cr_assert(nfd <= 64);
	for (int i = 0; i < nfd; i++)
		fds[i] = open("/dev/null", O_RDONLY | O_CLOEXEC);
	if (nfd) {
		struct cmsghdr *c;
		memset(ctl, 0, sizeof(ctl));
		msg.msg_control = ctl;
		msg.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfd);
		c = CMSG_FIRSTHDR(&msg);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfd);
		memcpy(CMSG_DATA(c), fds, sizeof(int) * (size_t)nfd);
	}
	cr_assert_eq(sendmsg(sock, &msg, MSG_NOSIGNAL), (ssize_t)len);
	for (int i = 0; i < nfd; i++)
		close(fds[i]);
}

Test(rpc_frame, header_is_big_endian)
{
	uint8_t h[4];

	rpc_frame_header(h, 0x01020304u);
	cr_assert(h[0] == 1 && h[1] == 2 && h[2] == 3 && h[3] == 4);
}

Test(rpc_frame, round_trip_without_fds)
{
	int sv[2], fds[RPC_FDS_MAX];
	uint8_t *buf;
	size_t len, n;

	pair(sv, 0);
	cr_assert_eq(rpc_frame_send(sv[0], "hello", 5, NULL, 0), 0);
	cr_assert_eq(rpc_frame_send(sv[0], NULL, 0, NULL, 0), 0);
	cr_assert_eq(rpc_frame_recv(sv[1], 0, RPC_FDS_MAX, &buf, &len, fds, &n), 0);
	cr_assert_eq(len, 5);
	cr_assert_eq(n, 0);
	cr_assert_eq(memcmp(buf, "hello", 5), 0);
	free(buf);
	/* A 0-byte frame is a frame. */
	cr_assert_eq(rpc_frame_recv(sv[1], 0, RPC_FDS_MAX, &buf, &len, fds, &n), 0);
	cr_assert_eq(len, 0);
	cr_assert_null(buf);
	close(sv[0]);
	cr_assert_eq(rpc_frame_recv(sv[1], 0, RPC_FDS_MAX, &buf, &len, fds, &n), -EPIPE);
	close(sv[1]);
}

Test(rpc_frame, round_trip_with_fds_cloexec)
{
	int sv[2], fds[RPC_FDS_MAX], mine[RPC_FDS_MAX];
	uint8_t *buf;
	size_t len, n;
	int before = nfds_open();

	pair(sv, 0);
	for (unsigned i = 0; i < RPC_FDS_MAX; i++)
		mine[i] = open(i % 2 ? "/dev/null" : "/proc/self/exe", O_RDONLY | O_CLOEXEC);
	for (size_t k = 1; k <= RPC_FDS_MAX; k++) {
		cr_assert_eq(rpc_frame_send(sv[0], "x", 1, mine, k), 0);
		cr_assert_eq(rpc_frame_recv(sv[1], 0, RPC_FDS_MAX, &buf, &len, fds, &n), 0);
		cr_assert_eq(n, k);
		for (size_t i = 0; i < n; i++) {
			same_file(fds[i], mine[i]);
			cr_assert(fcntl(fds[i], F_GETFD) & FD_CLOEXEC, "received fd not O_CLOEXEC");
		}
		rpc_fds_close(fds, n);
		free(buf);
	}
	rpc_fds_close(mine, RPC_FDS_MAX);
	close(sv[0]);
	close(sv[1]);
	cr_assert_eq(nfds_open(), before);
}

Test(rpc_frame, fds_belong_to_their_frame)
{
	int sv[2], fds[RPC_FDS_MAX], f = open("/dev/null", O_RDONLY | O_CLOEXEC);
	uint8_t *buf;
	size_t len, n;

	pair(sv, 0);
	cr_assert_eq(rpc_frame_send(sv[0], "one", 3, NULL, 0), 0);
	cr_assert_eq(rpc_frame_send(sv[0], "two", 3, &f, 1), 0);
	cr_assert_eq(rpc_frame_send(sv[0], "three", 5, NULL, 0), 0);
	cr_assert_eq(rpc_frame_recv(sv[1], 0, 1, &buf, &len, fds, &n), 0);
	cr_assert(len == 3 && n == 0 && !memcmp(buf, "one", 3));
	free(buf);
	cr_assert_eq(rpc_frame_recv(sv[1], 0, 1, &buf, &len, fds, &n), 0);
	cr_assert(len == 3 && n == 1 && !memcmp(buf, "two", 3));
	same_file(fds[0], f);
	rpc_fds_close(fds, n);
	free(buf);
	cr_assert_eq(rpc_frame_recv(sv[1], 0, 1, &buf, &len, fds, &n), 0);
	cr_assert(len == 5 && n == 0);
	free(buf);
	close(f);
	close(sv[0]);
	close(sv[1]);
}

Test(rpc_frame, oversize_rejected_before_reading)
{
	int sv[2], fds[RPC_FDS_MAX];
	uint8_t hdr[4], *buf;
	size_t len, n;
	int before = nfds_open();

	pair(sv, 0);
	/* Exactly the maximum is fine. */
	buf = calloc(1, 100);
	cr_assert_eq(rpc_frame_send(sv[0], buf, 100, NULL, 0), 0);
	free(buf);
	cr_assert_eq(rpc_frame_recv(sv[1], 100, 0, &buf, &len, fds, &n), 0);
	cr_assert_eq(len, 100);
	free(buf);
	/* One more is not, and the header alone is enough to say so (a 4 GiB
	 * claim must not be allocated), even with an fd riding along. */
	rpc_frame_header(hdr, 0xffffffffu);
	send_raw(sv[0], hdr, 4, 1);
	cr_assert_eq(rpc_frame_recv(sv[1], 100, 1, &buf, &len, fds, &n), -EMSGSIZE);
	cr_assert_null(buf);
	rpc_frame_header(hdr, 101);
	send_raw(sv[0], hdr, 4, 0);
	cr_assert_eq(rpc_frame_recv(sv[1], 100, 1, &buf, &len, fds, &n), -EMSGSIZE);
	close(sv[0]);
	close(sv[1]);
	cr_assert_eq(nfds_open(), before);
}

Test(rpc_frame, truncated_frames)
{
	int sv[2], fds[RPC_FDS_MAX];
	uint8_t hdr[4], *buf;
	size_t len, n;
	int before = nfds_open();

	/* Half a header. */
	pair(sv, 0);
	send_raw(sv[0], "\0\0", 2, 0);
	close(sv[0]);
	cr_assert_eq(rpc_frame_recv(sv[1], 0, 1, &buf, &len, fds, &n), -EPROTO);
	close(sv[1]);
	/* A header promising 10 bytes, 3 sent, with an fd: the fd is closed. */
	pair(sv, 0);
	rpc_frame_header(hdr, 10);
	send_raw(sv[0], hdr, 4, 1);
	send_raw(sv[0], "abc", 3, 0);
	close(sv[0]);
	cr_assert_eq(rpc_frame_recv(sv[1], 0, 1, &buf, &len, fds, &n), -EPROTO);
	cr_assert_null(buf);
	cr_assert_eq(n, 0);
	close(sv[1]);
	cr_assert_eq(nfds_open(), before);
}

Test(rpc_frame, fd_limits_and_ctrunc)
{
	int sv[2], fds[RPC_FDS_MAX], f = open("/dev/null", O_RDONLY | O_CLOEXEC);
	int two[2] = { f, f };
	uint8_t hdr[4], *buf;
	size_t len, n;
	int before;

	pair(sv, 0);
	before = nfds_open();
	/* Fds where none are allowed. */
	cr_assert_eq(rpc_frame_send(sv[0], "x", 1, &f, 1), 0);
	cr_assert_eq(rpc_frame_recv(sv[1], 0, 0, &buf, &len, fds, &n), -ETOOMANYREFS);
	cr_assert_eq(nfds_open(), before);
	/* Two where one is allowed. */
	cr_assert_eq(rpc_frame_send(sv[0], "x", 1, two, 2), 0);
	cr_assert_eq(rpc_frame_recv(sv[1], 0, 1, &buf, &len, fds, &n), -ETOOMANYREFS);
	cr_assert_eq(nfds_open(), before);
	close(sv[0]);
	close(sv[1]);

	/* 40 fds: more than the control buffer holds (MSG_CTRUNC). */
	pair(sv, 0);
	before = nfds_open();
	rpc_frame_header(hdr, 1);
	send_raw(sv[0], hdr, 4, 40);
	send_raw(sv[0], "y", 1, 0);
	cr_assert_eq(rpc_frame_recv(sv[1], 0, RPC_FDS_MAX, &buf, &len, fds, &n), -ETOOMANYREFS);
	cr_assert_eq(nfds_open(), before);
	/* The sender may not pass more than RPC_FDS_MAX. */
	int many[RPC_FDS_MAX + 1];
	for (unsigned i = 0; i <= RPC_FDS_MAX; i++)
		many[i] = f;
	cr_assert_eq(rpc_frame_send(sv[0], "x", 1, many, RPC_FDS_MAX + 1), -EINVAL);
	close(sv[0]);
	close(sv[1]);
	close(f);
}

Test(rpc_frame, other_ancillary_data_is_refused)
{
	int sv[2], fds[RPC_FDS_MAX], one = 1, f = open("/dev/null", O_RDONLY | O_CLOEXEC);
	uint8_t *buf;
	size_t len, n;
	int before;

	pair(sv, 0);
	/* With SO_PASSCRED every message carries SCM_CREDENTIALS. */
	cr_assert_eq(setsockopt(sv[1], SOL_SOCKET, SO_PASSCRED, &one, sizeof(one)), 0);
	before = nfds_open();
	cr_assert_eq(rpc_frame_send(sv[0], "x", 1, &f, 1), 0);
	cr_assert_eq(rpc_frame_recv(sv[1], 0, 1, &buf, &len, fds, &n), -EBADMSG);
	cr_assert_eq(nfds_open(), before);
	close(f);
	close(sv[0]);
	close(sv[1]);
}

Test(rpc_frame, nonblocking_byte_by_byte)
{
	int sv[2], fds[RPC_FDS_MAX], f = open("/dev/null", O_RDONLY | O_CLOEXEC);
	uint8_t frame[4 + 300], *buf;
	size_t len, n;
	struct rpc_reader r;

	pair(sv, 1);
	rpc_frame_header(frame, 300);
	for (int i = 0; i < 300; i++)
		frame[4 + i] = (uint8_t)i;
	rpc_reader_init(&r, 1000, 1);
	cr_assert_eq(rpc_reader_read(&r, sv[1]), 0); /* nothing yet */
	for (size_t i = 0; i < sizeof(frame); i++) {
		/* The fd rides on the frame's first byte. */
		if (i == 0) {
			cr_assert_eq(write(sv[0], frame, 0), 0);
			char ctl[CMSG_SPACE(sizeof(int))];
			struct iovec iov = { frame, 1 };
			struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl,
					      .msg_controllen = sizeof(ctl) };
			struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
			c->cmsg_level = SOL_SOCKET;
			c->cmsg_type = SCM_RIGHTS;
			c->cmsg_len = CMSG_LEN(sizeof(int));
			memcpy(CMSG_DATA(c), &f, sizeof(int));
			cr_assert_eq(sendmsg(sv[0], &msg, 0), 1);
		} else {
			cr_assert_eq(write(sv[0], frame + i, 1), 1);
		}
		int rc = rpc_reader_read(&r, sv[1]);
		cr_assert_eq(rc, i + 1 == sizeof(frame) ? 1 : 0, "byte %zu: %d", i, rc);
	}
	rpc_reader_take(&r, &buf, &len, fds, &n);
	cr_assert_eq(len, 300);
	cr_assert_eq(n, 1);
	cr_assert_eq(memcmp(buf, frame + 4, 300), 0);
	same_file(fds[0], f);
	rpc_fds_close(fds, n);
	free(buf);
	/* A partial frame dropped by the caller: its fd is closed. */
	int before = nfds_open();
	cr_assert_eq(rpc_frame_send(sv[0], NULL, 0, NULL, 0), 0);
	cr_assert_eq(rpc_reader_read(&r, sv[1]), 1);
	rpc_reader_take(&r, &buf, &len, fds, &n);
	cr_assert(len == 0 && n == 0);
	rpc_frame_header(frame, 10);
	send_raw(sv[0], frame, 6, 1);
	cr_assert_eq(rpc_reader_read(&r, sv[1]), 0);
	cr_assert_eq(nfds_open(), before + 1);
	rpc_reader_reset(&r);
	cr_assert_eq(nfds_open(), before);
	rpc_reader_reset(NULL);
	close(f);
	close(sv[0]);
	close(sv[1]);
}

Test(rpc_frame, garbage_stream_never_overreads)
{
	int sv[2], fds[RPC_FDS_MAX];
	uint8_t junk[4096], *buf;
	size_t len, n;
	uint64_t s = 88172645463325252ull;
	int before = nfds_open();

	/* Random bytes: every frame either decodes within its length or is
	 * refused as oversize; either way nothing leaks and nothing hangs. */
	for (int round = 0; round < 50; round++) {
		pair(sv, 0);
		for (size_t i = 0; i < sizeof(junk); i++) {
			s ^= s << 13;
			s ^= s >> 7;
			s ^= s << 17;
			junk[i] = (uint8_t)s;
		}
		send_raw(sv[0], junk, sizeof(junk), round % 3);
		close(sv[0]);
		for (;;) {
			int rc = rpc_frame_recv(sv[1], 512, 1, &buf, &len, fds, &n);
			if (rc < 0) {
				cr_assert(rc == -EMSGSIZE || rc == -EPROTO || rc == -EPIPE ||
					  rc == -ETOOMANYREFS, "rc %d", rc);
				break;
			}
			rpc_fds_close(fds, n);
			free(buf);
		}
		close(sv[1]);
	}
	cr_assert_eq(nfds_open(), before);
}
