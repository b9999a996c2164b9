/*
 * peer: who is on the other end of a connection, recorded once when it
 * connects (after tmux's proc_add_peer): SO_PEERCRED's pid, uid and gid
 * (as of connect(2)), and the cgroup the pid is in. On Kubernetes the cgroup
 * path carries the pod's UID, so pods that share a uid are told apart by
 * the policy's cgroup= key.
 *
 * The cgroup comes from /proc/PID/cgroup, read through a pidfd taken from
 * the socket (SO_PEERPIDFD): the read is trusted only if the pidfd still
 * shows the process alive afterwards, so a recycled pid cannot lend us
 * another process's cgroup. If that cannot be shown the cgroup is unknown,
 * and then only rules without cgroup= can match.
 *
 * An owner is what the policy tells apart: a uid and the root of the rule
 * that matched. Mounts, limits, backing ids and the closer of what its
 * peers sent (closer.c) belong to owners, so they outlive a connection and
 * a reconnecting ferry-mountd finds them again.
 *
 * Who is admitted: a peer a rule matches, and root (uid 0) for STATUS. A
 * uid no rule names is refused before its cgroup is even read, so a flood
 * of strangers costs a getsockopt each and holds no connection slot.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "brokerd.h"
#include "log.h"

#ifndef SO_PEERPIDFD
#define SO_PEERPIDFD 77
#endif

static bool pidfd_alive(int pidfd)
{
	/* Signal 0 only checks; EPERM (we hold no CAP_KILL) still means alive. */
	return syscall(SYS_pidfd_send_signal, pidfd, 0, NULL, 0) == 0 || errno == EPERM;
}

/* The cgroup v2 path of pid ("0::PATH" in /proc/PID/cgroup), malloc'ed. */
static int read_cgroup(pid_t pid, char **out)
{
	char path[64], buf[8192], *line, *end;
	ssize_t n;
	size_t got = 0;
	int fd, rc = -ENOENT;

	*out = NULL;
	snprintf(path, sizeof(path), "/proc/%d/cgroup", (int)pid);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	while (got < sizeof(buf) - 1 && (n = read(fd, buf + got, sizeof(buf) - 1 - got)) != 0) {
		if (n < 0) {
			if (errno == EINTR)
				continue;
			rc = -errno;
			goto out;
		}
		got += (size_t)n;
	}
	buf[got] = '\0';
	for (line = buf; line && *line; line = end ? end + 1 : NULL) {
		end = strchr(line, '\n');
		if (end)
			*end = '\0';
		if (!strncmp(line, "0::", 3) && line[3] == '/') {
			*out = strdup(line + 3);
			rc = *out ? 0 : -ENOMEM;
			break;
		}
	}
out:
	close(fd);
	return rc;
}

bool peer_may_be_admitted(const struct broker *b, uid_t uid, gid_t gid)
{
	const struct policy *pol = b->policy;

	if (uid == 0)
		return true; /* operators: STATUS (--ping) */
	for (size_t i = 0; pol && i < pol->n; i++)
		if (pol->rules[i].uid == uid && (!pol->rules[i].has_gid || pol->rules[i].gid == gid))
			return true;
	return false;
}

int peer_identify(struct broker *b, int sock, struct peer *p)
{
	struct ucred cred;
	socklen_t len = sizeof(cred);
	int pidfd = -1;

	memset(p, 0, sizeof(*p));
	if (getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0)
		return -errno;
	p->pid = cred.pid;
	p->uid = cred.uid;
	p->gid = cred.gid;
	/* A stranger costs us no more than this. */
	if (!peer_may_be_admitted(b, p->uid, p->gid))
		return -EACCES;
	len = sizeof(pidfd);
	if (cred.pid > 0 && getsockopt(sock, SOL_SOCKET, SO_PEERPIDFD, &pidfd, &len) == 0 &&
	    pidfd >= 0) {
		char *cg = NULL;

		if (read_cgroup(cred.pid, &cg) == 0 && pidfd_alive(pidfd))
			p->cgroup = cg;
		else
			free(cg);
		close(pidfd);
	}
	p->rule = policy_match(b->policy, p->uid, p->gid, p->cgroup);
	if (!p->rule)
		return p->uid == 0 ? 0 : -EACCES;
	p->owner = owner_get(b, p->uid, p->rule->root);
	if (!p->owner)
		return -ENOMEM;
	p->owner->nconns++;
	return p->owner->wedged ? -EBUSY : 0;
}

void peer_clear(struct broker *b, struct peer *p)
{
	if (p->owner) {
		p->owner->nconns--;
		owner_put(b, p->owner);
	}
	free(p->cgroup);
	memset(p, 0, sizeof(*p));
}

struct owner *owner_get(struct broker *b, uid_t uid, const char *root)
{
	struct owner *o;

	TAILQ_FOREACH(o, &b->owners, link)
		if (o->uid == uid && !strcmp(o->root, root))
			return o;
	o = calloc(1, sizeof(*o));
	if (!o)
		return NULL;
	o->root = strdup(root);
	o->closer = closer_new();
	if (!o->root || !o->closer) {
		free(o->root);
		closer_free(o->closer, false);
		free(o);
		return NULL;
	}
	o->uid = uid;
	TAILQ_INIT(&o->mounts);
	TAILQ_INSERT_TAIL(&b->owners, o, link);
	return o;
}

void owner_put(struct broker *b, struct owner *o)
{
	if (!o || o->nconns || o->nmounts || closer_pending(o->closer))
		return;
	TAILQ_REMOVE(&b->owners, o, link);
	closer_free(o->closer, false); /* idle: joins at once */
	free(o->root);
	free(o);
}

void owners_free_all(struct broker *b)
{
	struct owner *o;

	while ((o = TAILQ_FIRST(&b->owners))) {
		TAILQ_REMOVE(&b->owners, o, link);
		if (!closer_free(o->closer, true))
			log_warnx("uid %d: a close of an fd it sent is still stuck at exit",
				  (int)o->uid);
		free(o->root);
		free(o);
	}
}
