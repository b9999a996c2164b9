/*
 * common/broker_client.c, without a broker: the mount name of a mountpoint
 * beneath the policy root, argument checks, and a peer that is not a
 * broker (it answers garbage, or a reply for nobody, or closes): the
 * client fails the call with -EPIPE, later calls with -ENOTCONN, and never
 * raises SIGPIPE.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "broker.pb-c.h"
#include "broker_client.h"
#include "rpc_frame.h"

static void name_is(const char *root, const char *mp, const char *want)
{
	char *name = NULL;
	int rc = broker_mount_name(root, mp, &name);

	cr_assert_eq(rc, 0, "%s beneath %s: %d", mp, root, rc);
	cr_assert_str_eq(name, want);
	free(name);
}

static void name_fails(const char *root, const char *mp, int err)
{
	char *name = NULL;

	cr_assert_eq(broker_mount_name(root, mp, &name), err, "%s beneath %s", mp, root);
	cr_assert_null(name);
}

Test(broker_client, mount_name)
{
	name_is("/srv/pods", "/srv/pods/a", "a");
	name_is("/srv/pods", "/srv/pods/a/b/", "a/b");
	name_is("/srv/pods/", "/srv/pods/a", "a");
	name_is("/", "/mnt/x", "mnt/x");
	name_fails("/srv/pods", "/srv/pods", -EXDEV);
	name_fails("/srv/pods", "/srv/pods/", -EXDEV);
	name_fails("/srv/pods", "/srv/podsx/a", -EXDEV);
	name_fails("/srv/pods", "/srv", -EXDEV);
	name_fails("/srv/pods", "relative/a", -EXDEV);
	name_fails("/srv/pods", "/srv/pods/../etc", -EINVAL);
	name_fails("/srv/pods", "/srv/pods/a//b", -EINVAL);
	name_fails("/srv/pods", "/srv/pods/./a", -EINVAL);
}

/* A fake broker on a socketpair: answers each request with what reply()
 * makes of it. */
struct fake {
	int sock;
	int mode; /* 0: garbage, 1: wrong id, 2: close, 3: echo STATUS correctly */
};

static void *fake_run(void *arg)
{
	struct fake *f = arg;
	uint8_t *buf, out[BROKER_FRAME_MAX];
	size_t len, nfds;
	int fds[RPC_FDS_MAX];

	while (rpc_frame_recv(f->sock, BROKER_FRAME_MAX, 1, &buf, &len, fds, &nfds) == 0) {
		Ferry__Broker__Request *q = ferry__broker__request__unpack(NULL, len, buf);
		Ferry__Broker__Reply r = FERRY__BROKER__REPLY__INIT;
		Ferry__Broker__Status s = FERRY__BROKER__STATUS__INIT;
		size_t n;

		free(buf);
		rpc_fds_close(fds, nfds);
		cr_assert(q);
		r.version = BROKER_PROTO_VERSION;
		r.id = q->id;
		ferry__broker__request__free_unpacked(q, NULL);
		if (f->mode == 0) {
			memset(out, 0xff, 32);
			rpc_frame_send(f->sock, out, 32, NULL, 0);
			continue;
		}
		if (f->mode == 2)
			break;
		if (f->mode == 1)
			r.id += 1000;
		s.mounts = 3;
		s.root = "/srv/pods";
		r.body_case = FERRY__BROKER__REPLY__BODY_STATUS;
		r.status = &s;
		n = ferry__broker__reply__pack(&r, out);
		rpc_frame_send(f->sock, out, n, NULL, 0);
	}
	close(f->sock);
	return NULL;
}

static int try_mode(int mode, struct broker_status *st)
{
	int sv[2], rc, rc2;
	struct fake f;
	pthread_t t;
	struct broker_conn *c;

	cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
	f = (struct fake){ .sock = sv[1], .mode = mode };
	cr_assert_eq(pthread_create(&t, NULL, fake_run, &f), 0);
	cr_assert_eq(broker_adopt(sv[0], &c), 0);
	rc = broker_status(c, st);
	if (rc < 0) {
		rc2 = broker_status(c, st);
		cr_assert_eq(rc2, -ENOTCONN, "a failed connection must stay failed: %d", rc2);
		cr_assert_eq(broker_reconnect(c), -ENOTCONN, "adopted: no reconnect");
	}
	broker_close(c);
	pthread_join(t, NULL);
	return rc;
}

Test(broker_client, protocol_errors)
{
	struct broker_status st;

	signal(SIGPIPE, SIG_DFL); /* a SIGPIPE would end the test */
	cr_assert_eq(try_mode(3, &st), 0);
	cr_assert_eq(st.mounts, 3);
	cr_assert_str_eq(st.root, "/srv/pods");
	cr_assert_eq(try_mode(0, &st), -EPIPE, "garbage");
	cr_assert_eq(try_mode(1, &st), -EPIPE, "a reply for nobody");
	cr_assert_eq(try_mode(2, &st), -EPIPE, "closed");
}

Test(broker_client, arguments)
{
	struct broker_conn *c;
	int fd;
	uint64_t id;

	cr_assert_eq(broker_connect("/nonexistent/broker.sock", &c), -ENOENT);
	cr_assert_null(c);
	cr_assert_eq(broker_adopt(-1, &c), -EBADF);
	{
		int sv[2];

		cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
		cr_assert_eq(broker_adopt(sv[0], &c), 0);
		cr_assert_eq(broker_backing_open(c, 1, -1), -EBADF);
		cr_assert_eq(broker_backing_close(c, 1, 0), -EINVAL);
		cr_assert_eq(broker_mount(c, NULL, NULL, &fd, &id), -EINVAL);
		cr_assert_eq(fd, -1);
		cr_assert_eq(broker_attach(c, "x", -1, &id), -EINVAL);
		cr_assert_eq(broker_set_timeout(c, 0), -EINVAL);
		broker_close(c);
		close(sv[1]);
	}
	broker_close(NULL);
}
