/*
 * ferry-brokerd main: options -> (-n: check the policy; --ping: ask a
 * running broker) -> stray fds closed -> policy, state directory, socket ->
 * privileges dropped to CAP_SYS_ADMIN -> fusectl, mount table rebuilt ->
 * loop; SIGTERM/SIGINT end it. Mounts outlive the broker: their records
 * stay in the state directory and a restarted broker takes them up again.
 * Torn down in reverse.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <grp.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "brokerd.h"
#include "dirs.h"
#include "log.h"

struct options {
	const char *socket;
	const char *policy;
	const char *state_dir;
	mode_t socket_mode;
	const char *socket_group;
	unsigned idle_timeout;
	unsigned check_interval;
	bool check;
	bool ping;
	bool verbose;
};

static void usage(FILE *f)
{
	fprintf(f,
		"usage: ferry-brokerd --policy FILE [--socket PATH] [--state-dir DIR] [options]\n"
		"       ferry-brokerd -n --policy FILE\n"
		"       ferry-brokerd --ping [--socket PATH]\n"
		"\n"
		"Mounts FUSE file systems for unprivileged peers (ferry-mountd, ferry) and\n"
		"registers their FUSE passthrough backing files, as a policy file allows.\n"
		"It keeps CAP_SYS_ADMIN (with CAP_SETUID/CAP_SETGID held back to act with\n"
		"a peer's fsuid) and drops every other privilege; run it as root.\n"
		"\n"
		"  --socket PATH        listen here (default %s)\n"
		"  --socket-mode MODE   octal mode of the socket (default 0666: the policy\n"
		"                       decides who may do what; narrow it with a group)\n"
		"  --socket-group GROUP group of the socket (name or number)\n"
		"  --policy FILE        the policy: lines like\n"
		"                       allow uid=65534 root=/srv/ferry/pods max_mounts=16\n"
		"  --state-dir DIR      where the mount table is kept, so a restarted broker\n"
		"                       knows its live mounts (default %s)\n"
		"  --check-interval SEC how often mounts are checked (default %d): gone from\n"
		"                       mountinfo, renamed within their root (the table\n"
		"                       follows), or carried out of it (unmounted)\n"
		"  --idle-timeout SEC   close a connection that serves no mount and has sent\n"
		"                       nothing for SEC seconds (default %d; 0: never)\n"
		"  -n                   check the policy file (and that each root is a\n"
		"                       directory), print ok or the bad line, exit 0 or 1\n"
		"  --ping               ask the broker at --socket for its status; exit 0 if\n"
		"                       it answers (a liveness probe)\n"
		"  -v, --verbose        debug logging (every request)\n"
		"  -h, --help           this text\n",
		BROKER_DEFAULT_SOCKET, BROKER_STATE_DIR_DEFAULT, BROKER_REAP_INTERVAL_S,
		BROKER_IDLE_TIMEOUT_S);
}

static int parse_args(int argc, char **argv, struct options *o)
{
	enum { OPT_SOCKET = 256, OPT_MODE, OPT_GROUP, OPT_POLICY, OPT_STATE, OPT_PING, OPT_IDLE,
	       OPT_CHECK };
	static const struct option longopts[] = {
		{ "socket", required_argument, NULL, OPT_SOCKET },
		{ "socket-mode", required_argument, NULL, OPT_MODE },
		{ "socket-group", required_argument, NULL, OPT_GROUP },
		{ "policy", required_argument, NULL, OPT_POLICY },
		{ "state-dir", required_argument, NULL, OPT_STATE },
		{ "ping", no_argument, NULL, OPT_PING },
		{ "idle-timeout", required_argument, NULL, OPT_IDLE },
		{ "check-interval", required_argument, NULL, OPT_CHECK },
		{ "verbose", no_argument, NULL, 'v' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	int ch;

	*o = (struct options){
		.socket = BROKER_DEFAULT_SOCKET,
		.state_dir = BROKER_STATE_DIR_DEFAULT,
		.socket_mode = 0666,
		.idle_timeout = BROKER_IDLE_TIMEOUT_S,
		.check_interval = BROKER_REAP_INTERVAL_S,
	};
	while ((ch = getopt_long(argc, argv, "nvh", longopts, NULL)) != -1) {
		switch (ch) {
		case OPT_SOCKET: o->socket = optarg; break;
		case OPT_POLICY: o->policy = optarg; break;
		case OPT_STATE: o->state_dir = optarg; break;
		case OPT_GROUP: o->socket_group = optarg; break;
		case OPT_PING: o->ping = true; break;
		case 'n': o->check = true; break;
		case OPT_CHECK: {
			char *end;
			unsigned long v = strtoul(optarg, &end, 10);

			if (!*optarg || *end || v < 1 || v > 3600) {
				fprintf(stderr, "ferry-brokerd: --check-interval %s: not a number of "
					"seconds from 1 to 3600\n", optarg);
				return 2;
			}
			o->check_interval = (unsigned)v;
			break;
		}
		case OPT_IDLE: {
			char *end;
			unsigned long v = strtoul(optarg, &end, 10);

			if (!*optarg || *end || v > 86400) {
				fprintf(stderr, "ferry-brokerd: --idle-timeout %s: not a number of "
					"seconds from 0 to 86400\n", optarg);
				return 2;
			}
			o->idle_timeout = (unsigned)v;
			break;
		}
		case 'v': o->verbose = true; break;
		case OPT_MODE: {
			char *end;
			unsigned long m = strtoul(optarg, &end, 8);

			if (!*optarg || *end || m > 0777) {
				fprintf(stderr, "ferry-brokerd: --socket-mode %s: not an octal mode\n",
					optarg);
				return 2;
			}
			o->socket_mode = (mode_t)m;
			break;
		}
		case 'h':
			usage(stdout);
			exit(0);
		default:
			usage(stderr);
			return 2;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "ferry-brokerd: unexpected argument %s\n", argv[optind]);
		return 2;
	}
	if (!o->ping && !o->policy) {
		fprintf(stderr, "ferry-brokerd: --policy FILE is required\n");
		return 2;
	}
	return 0;
}

/* -n: the policy parses, and each root is an existing directory. */
static int check_policy(const char *path)
{
	struct policy *p = NULL;
	char err[512];
	int rc = policy_load(path, &p, err, sizeof(err));

	if (rc < 0) {
		printf("%s\n", err);
		return 1;
	}
	for (size_t i = 0; i < p->n; i++) {
		struct stat st;

		if (stat(p->rules[i].root, &st) < 0) {
			printf("%s:%u: root %s: %s\n", path, p->rules[i].line, p->rules[i].root,
			       strerror(errno));
			policy_free(p);
			return 1;
		}
		if (!S_ISDIR(st.st_mode)) {
			printf("%s:%u: root %s: not a directory\n", path, p->rules[i].line,
			       p->rules[i].root);
			policy_free(p);
			return 1;
		}
	}
	printf("%s: ok (%zu rule%s)\n", path, p->n, p->n == 1 ? "" : "s");
	policy_free(p);
	return 0;
}

static int ping(const char *socket)
{
	struct broker_conn *c;
	struct broker_status st;
	int rc = broker_connect(socket, &c);

	if (rc == 0) {
		broker_set_timeout(c, 5000);
		rc = broker_status(c, &st);
		broker_close(c);
	}
	if (rc < 0) {
		fprintf(stderr, "ferry-brokerd: %s: %s\n", socket, strerror(-rc));
		return 1;
	}
	printf("ok: connections %llu peers %llu mounts %llu backing_ids %llu fds %llu "
	       "requests %llu refusals %llu\n",
	       (unsigned long long)st.connections, (unsigned long long)st.peers,
	       (unsigned long long)st.mounts, (unsigned long long)st.backing_ids,
	       (unsigned long long)st.fds, (unsigned long long)st.requests,
	       (unsigned long long)st.refusals);
	return 0;
}

static int open_state_dir(const char *dir)
{
	char probe[PATH_MAX];
	struct stat st;
	int fd, rc;

	snprintf(probe, sizeof(probe), "%s/", dir);
	rc = dirs_make_parents_at(AT_FDCWD, probe, 0700);
	if (rc < 0)
		return rc;
	fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0)
		return -errno;
	/* Only root may write records that decide what we unmount. */
	if (fstat(fd, &st) < 0 || st.st_uid != geteuid() || (st.st_mode & 022)) {
		close(fd);
		return -EPERM;
	}
	return fd;
}

/* Peers' fds pass through our fd table: as much room as we may have. */
static unsigned nofile_raise(void)
{
	struct rlimit rl;

	if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
		return 1024;
	if (rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		if (setrlimit(RLIMIT_NOFILE, &rl) < 0)
			getrlimit(RLIMIT_NOFILE, &rl);
	}
	return rl.rlim_cur > UINT_MAX / 2 ? UINT_MAX / 2 : (unsigned)rl.rlim_cur;
}

static void on_signal(evutil_socket_t sig, short what, void *arg)
{
	struct broker *b = arg;

	(void)what;
	log_info("signal %d: stopping; mounts stay, with their records", (int)sig);
	event_base_loopbreak(b->base);
}

static void on_reap(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	mount_reap(arg);
}

static void on_tick(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	closer_watch(arg);
	server_tick(arg);
}

int main(int argc, char **argv)
{
	struct broker b = { .state_fd = -1, .fusectl_fd = -1, .listen_fd = -1 };
	struct event *ev_term = NULL, *ev_int = NULL, *ev_reap = NULL, *ev_tick = NULL;
	struct timeval reap_tv = { .tv_sec = BROKER_REAP_INTERVAL_S }, tick_tv = { .tv_sec = 1 };
	struct options o;
	gid_t group = (gid_t)-1;
	char err[512];
	int rc, status = 1;

	rc = parse_args(argc, argv, &o);
	if (rc)
		return rc;
	if (o.check)
		return check_policy(o.policy);
	if (o.ping)
		return ping(o.socket);
	reap_tv.tv_sec = o.check_interval;

	privs_close_stray_fds();
	log_init("ferry-brokerd", o.verbose ? LOG_LVL_DEBUG : LOG_LVL_INFO);
	signal(SIGPIPE, SIG_IGN);
	if (privs_check(err, sizeof(err)) < 0)
		fatalx("%s", err);
	rc = policy_load(o.policy, &b.policy, err, sizeof(err));
	if (rc < 0)
		fatalx("%s", err);
	if (o.socket_group) {
		struct group *gr = getgrnam(o.socket_group);
		char *end;
		unsigned long g = strtoul(o.socket_group, &end, 10);

		if (gr)
			group = gr->gr_gid;
		else if (*o.socket_group && !*end && g < UINT_MAX)
			group = (gid_t)g;
		else
			fatalx("--socket-group %s: no such group", o.socket_group);
	}
	rc = boot_id_read(b.boot_id, sizeof(b.boot_id));
	if (rc < 0)
		fatalx("cannot read the boot id: %s", strerror(-rc));
	b.socket_path = o.socket;
	b.state_dir = o.state_dir;
	b.idle_timeout_s = o.idle_timeout;
	b.nofile = nofile_raise();
	/* Sized for three fds a connection (its socket, a frame's fds) and
	 * BROKER_RECV_FDS_ROOM for a frame being read: what the limit leaves.
	 * The fds actually held are counted as they come (server.c's
	 * fd_headroom), and reading pauses before the table runs short. */
	b.conn_max = BROKER_CONN_MAX;
	if (b.nofile < BROKER_FDS_RESERVED + 2 * BROKER_RECV_FDS_ROOM + 3 * BROKER_CONN_MAX) {
		unsigned room = b.nofile > BROKER_FDS_RESERVED + 2 * BROKER_RECV_FDS_ROOM ?
					(b.nofile - BROKER_FDS_RESERVED - 2 * BROKER_RECV_FDS_ROOM) / 3 : 0;

		if (room < 16)
			fatalx("the fd limit (RLIMIT_NOFILE %u) is too low to serve anyone: raise it "
			       "to at least %u", b.nofile,
			       BROKER_FDS_RESERVED + 2 * BROKER_RECV_FDS_ROOM + 48);
		b.conn_max = room;
		log_warnx("the fd limit (RLIMIT_NOFILE %u) leaves room for %u connections, not %u: "
			  "raise it (LimitNOFILE=) for more", b.nofile, room, BROKER_CONN_MAX);
	}
	b.stranger_closer = closer_new();
	if (!b.stranger_closer)
		fatalx("out of memory");
	TAILQ_INIT(&b.conns);
	TAILQ_INIT(&b.owners);
	TAILQ_INIT(&b.mounts);
	b.state_fd = open_state_dir(o.state_dir);
	if (b.state_fd < 0) {
		log_errno(b.state_fd, "state directory %s (it must be root's and not writable by "
			  "others)", o.state_dir);
		goto out;
	}
	b.base = event_base_new();
	if (!b.base) {
		log_warnx("cannot make the event loop");
		goto out;
	}
	rc = dirs_make_parents_at(AT_FDCWD, o.socket, 0755);
	if (rc == 0)
		rc = server_listen(&b, o.socket, o.socket_mode, group);
	if (rc < 0) {
		log_errno(rc, "cannot listen on %s%s", o.socket,
			  rc == -EADDRINUSE ? " (another broker answers there)" : "");
		goto out;
	}
	rc = privs_drop(err, sizeof(err));
	if (rc < 0) {
		log_warnx("%s", err);
		goto out;
	}
	privs_describe(err, sizeof(err));
	log_info("capabilities now: %s; no_new_privs set", err);
	rc = fsprobe_init(&b);
	if (rc < 0)
		log_errno(rc, "cannot mount a private fusectl: files in other mount namespaces "
			  "will be refused as backing files");
	rc = mount_table_load(&b);
	if (rc < 0) {
		log_errno(rc, "cannot load the mount table from %s", o.state_dir);
		goto out;
	}
	ev_term = evsignal_new(b.base, SIGTERM, on_signal, &b);
	ev_int = evsignal_new(b.base, SIGINT, on_signal, &b);
	ev_reap = event_new(b.base, -1, EV_PERSIST, on_reap, &b);
	ev_tick = event_new(b.base, -1, EV_PERSIST, on_tick, &b);
	if (!ev_term || !ev_int || !ev_reap || !ev_tick || event_add(ev_term, NULL) < 0 ||
	    event_add(ev_int, NULL) < 0 || event_add(ev_reap, &reap_tv) < 0 ||
	    event_add(ev_tick, &tick_tv) < 0) {
		log_warnx("cannot set up signals and timers");
		goto out;
	}
	if (!b.rights_gated)
		log_warnx("the kernel has no SO_PASSRIGHTS (Linux < 6.16): peers may send fds "
			  "before they are admitted; those of refused peers are closed on a closer "
			  "thread of their own");
	log_info("serving on %s: %zu policy rules, %u mounts known, state in %s, fd limit %u, "
		 "%u connections at most", o.socket, b.policy->n, b.nmounts, o.state_dir, b.nofile,
		 b.conn_max);
	if (event_base_dispatch(b.base) < 0)
		log_warnx("event loop failed");
	else
		status = 0;
out:
	server_close_all(&b);
	if (ev_term)
		event_free(ev_term);
	if (ev_int)
		event_free(ev_int);
	if (ev_reap)
		event_free(ev_reap);
	if (ev_tick)
		event_free(ev_tick);
	mount_table_free(&b);
	owners_free_all(&b);
	if (!closer_free(b.stranger_closer, true))
		log_warnx("a refused peer's connection is still closing at exit");
	fsprobe_fini(&b);
	if (b.state_fd >= 0)
		close(b.state_fd);
	policy_free(b.policy);
	if (b.base)
		event_base_free(b.base);
	privs_fini();
	return status;
}
