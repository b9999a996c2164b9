/*
 * ferry mount / umount. mount starts ferry-mountd and returns once it says
 * the mount is serving (through a pipe it writes "ok" or the error to).
 * umount unmounts, then waits for ferry-mountd to finish committing and exit.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/close_range.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "broker_client.h"
#include "ctl.h"
#include "dirs.h"
#include "rpc_frame.h"
#include "url.h"

#define MAX_ARGS 32

static int mount_upgrade(const char *mountpoint);
static int mountpoint_path(const char *arg, char *out);
static bool process_running(pid_t pid);
static bool is_mountd_of(pid_t pid, const char *mp);

/* The daemon's first line on its ready fd ("ok", or why it failed), without
 * its newline; "" if it exited without one. */
static void read_ready(int fd, char *msg, size_t cap)
{
	size_t got = 0;

	for (;;) {
		ssize_t n = read(fd, msg + got, cap - 1 - got);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		got += (size_t)n;
		if (memchr(msg, '\n', got) || got == cap - 1)
			break;
	}
	msg[got] = '\0';
	msg[strcspn(msg, "\n")] = '\0';
}

int cmd_mount(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "foreground", no_argument, NULL, 'f' },
		{ "cache-dir", required_argument, NULL, 'C' },
		{ "cache-size", required_argument, NULL, 'S' },
		{ "staging-dir", required_argument, NULL, 'T' },
		{ "staging-min-free", required_argument, NULL, 'M' },
		{ "log", required_argument, NULL, 'L' },
		{ "reconciler", required_argument, NULL, 'Q' },
		{ "no-reconciler", no_argument, NULL, 'N' },
		{ "metrics", required_argument, NULL, 'P' },
		{ "broker", required_argument, NULL, 'B' },
		{ "takeover", no_argument, NULL, 'K' },
		{ "upgrade", no_argument, NULL, 'U' },
		{ "debug", no_argument, NULL, 'd' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	char *args[MAX_ARGS], daemon[PATH_MAX], fdarg[16], msg[1024] = "", mpabs[PATH_MAX];
	char *db = NULL, *dir = NULL, *log = NULL, err[512];
	int nargs = 0, opt, foreground = 0, broker = 0, upgrade = 0, pipefd[2] = { -1, -1 };
	int code = 1, rc;
	pid_t pid;

	snprintf(daemon, sizeof(daemon), "%s/ferry-mountd", ctl_bindir());
	args[nargs++] = daemon;
	optind = 1;
	while ((opt = getopt_long(argc, argv, "fo:dh", longopts, NULL)) != -1) {
		if (nargs > MAX_ARGS - 8) {
			ctl_err("too many options");
			return 2;
		}
		switch (opt) {
		case 'f': foreground = 1; break;
		case 'o': args[nargs++] = "-o"; args[nargs++] = optarg; break;
		case 'C': args[nargs++] = "--cache-dir"; args[nargs++] = optarg; break;
		case 'S': args[nargs++] = "--cache-size"; args[nargs++] = optarg; break;
		case 'T': args[nargs++] = "--staging-dir"; args[nargs++] = optarg; break;
		case 'M': args[nargs++] = "--staging-min-free"; args[nargs++] = optarg; break;
		case 'd': args[nargs++] = "--debug"; break;
		case 'Q': args[nargs++] = "--reconciler"; args[nargs++] = optarg; break;
		case 'N': args[nargs++] = "--no-reconciler"; break;
		case 'P': args[nargs++] = "--metrics"; args[nargs++] = optarg; break;
		case 'B': args[nargs++] = "--broker"; args[nargs++] = optarg; broker = 1; break;
		case 'K': args[nargs++] = "--takeover"; break;
		case 'U': upgrade = 1; break;
		case 'L': log = strdup(optarg); break;
		case 'h':
			printf("usage: ferry mount [-f] [--cache-dir DIR] [--cache-size MiB] "
			       "[--staging-dir DIR] [--staging-min-free MiB] [--log FILE] [--reconciler SOCKET | --no-reconciler] "
			       "[--metrics ADDR:PORT] [--broker SOCKET] [--takeover] "
			       "[-o OPTS] VOLUME MOUNTPOINT\n"
			       "       ferry mount --upgrade MOUNTPOINT\n");
			return 0;
		default:
			return 2;
		}
	}
	if (upgrade) {
		free(log);
		if (argc - optind != 1) {
			ctl_err("mount --upgrade takes the MOUNTPOINT only (the daemon keeps its options)");
			return 2;
		}
		return mount_upgrade(argv[optind]);
	}
	if (argc - optind != 2) {
		ctl_err("mount takes VOLUME and MOUNTPOINT");
		free(log);
		return 2;
	}
	if (meta_url_parse(argv[optind], &db, &dir, err, sizeof(err)) < 0) {
		ctl_err("volume %s: %s", argv[optind], err);
		goto out;
	}
	if (!meta_url_is_pg(db) && access(db, F_OK) < 0) {
		ctl_err("no ferryfs volume at %s (run `ferry format` first)", argv[optind]);
		goto out;
	}
	/* A PostgreSQL volume's node directory (its log, staging, cache). */
	if (meta_url_is_pg(db) && (rc = dirs_make(dir, 0700)) < 0) {
		ctl_err("cannot create %s: %s", dir, strerror(-rc));
		goto out;
	}
	/* The daemon gets the mountpoint absolute: `ferry umount` finds it by
	 * its command line. (An unresolvable one is left for it to report.) */
	if (broker) {
		/* Its mount may be one whose daemon died (and is taken over):
		 * no look inside it. */
		char *p = broker_mountpoint_path(argv[optind + 1]);
		if (p && strlen(p) < sizeof(mpabs)) {
			snprintf(mpabs, sizeof(mpabs), "%s", p);
			argv[optind + 1] = mpabs;
		}
		free(p);
	} else if (realpath(argv[optind + 1], mpabs)) {
		argv[optind + 1] = mpabs;
	}
	if (foreground) {
		args[nargs++] = "-f";
		args[nargs++] = argv[optind];
		args[nargs++] = argv[optind + 1];
		args[nargs] = NULL;
		execv(daemon, args);
		ctl_err("cannot run %s: %s", daemon, strerror(errno));
		goto out;
	}
	if (!log && asprintf(&log, "%s/ferry-mountd.log", dir) < 0) {
		ctl_err("out of memory");
		goto out;
	}
	if (pipe2(pipefd, O_CLOEXEC) < 0) {
		ctl_err("pipe: %s", strerror(errno));
		goto out;
	}
	snprintf(fdarg, sizeof(fdarg), "%d", pipefd[1]);
	args[nargs++] = "--ready-fd";
	args[nargs++] = fdarg;
	args[nargs++] = argv[optind];
	args[nargs++] = argv[optind + 1];
	args[nargs] = NULL;
	pid = fork();
	if (pid < 0) {
		ctl_err("fork: %s", strerror(errno));
		goto out;
	}
	if (pid == 0) {
		int lfd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
		if (lfd >= 0) {
			dup2(lfd, STDERR_FILENO);
		}
		/* The one fd the daemon inherits: one the caller holds on a FUSE
		 * file (of another mount, or of this one being taken over) would
		 * live on in the daemon, and its RELEASE never come. */
		close_range(3, ~0u, CLOSE_RANGE_CLOEXEC);
		fcntl(pipefd[1], F_SETFD, 0);
		execv(daemon, args);
		dprintf(pipefd[1], "cannot run %s: %s\n", daemon, strerror(errno));
		_exit(127);
	}
	close(pipefd[1]);
	pipefd[1] = -1;
	read_ready(pipefd[0], msg, sizeof(msg));
	if (strcmp(msg, "ok") == 0) {
		printf("mounted %s at %s (ferry-mountd pid %d, log %s)\n", argv[optind],
		       argv[optind + 1], (int)pid, log);
		code = 0;
		goto out;
	}
	if (*msg) {
		ctl_err("%s", msg);
		waitpid(pid, NULL, 0);
	} else {
		int st = 0;
		waitpid(pid, &st, 0);
		ctl_err("ferry-mountd exited (%s %d) before serving; see %s",
			WIFEXITED(st) ? "status" : "signal",
			WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st), log);
	}
out:
	if (pipefd[0] >= 0)
		close(pipefd[0]);
	if (pipefd[1] >= 0)
		close(pipefd[1]);
	free(log);
	free(db);
	free(dir);
	return code;
}

/* Alive and not a zombie: a reaped-late daemon has finished all the same. */
static bool process_running(pid_t pid)
{
	char path[64], buf[512], *p;
	FILE *f;
	bool running = false;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	f = fopen(path, "re");
	if (!f)
		return kill(pid, 0) == 0;
	if (fgets(buf, sizeof(buf), f) && (p = strrchr(buf, ')')))
		running = p[1] == ' ' && p[2] != 'Z' && p[2] != 'X';
	fclose(f);
	return running;
}

/* Is pid the ferry-mountd serving mp, as seen from here? (.stats gives the
 * pid in the daemon's own pid namespace, which need not be ours.) */
static bool is_mountd_of(pid_t pid, const char *mp)
{
	char path[64], buf[8192];
	ssize_t n;
	int fd;
	bool exe = false, arg = false;

	snprintf(path, sizeof(path), "/proc/%d/cmdline", (int)pid);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return false;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return false;
	buf[n] = '\0';
	for (char *a = buf; a < buf + n; a += strlen(a) + 1) {
		const char *slash = strrchr(a, '/');
		if (a == buf)
			exe = !strcmp(slash ? slash + 1 : a, "ferry-mountd");
		else if (!strcmp(a, mp))
			arg = true;
	}
	return exe && arg;
}

static int run_fusermount(const char *mp, int lazy)
{
	pid_t pid = fork();
	int st;

	if (pid < 0)
		return -errno;
	if (pid == 0) {
		execlp("fusermount3", "fusermount3", lazy ? "-uz" : "-u", "--", mp, (char *)NULL);
		_exit(127);
	}
	if (waitpid(pid, &st, 0) < 0)
		return -errno;
	return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -EBUSY;
}

/*
 * The mountpoint as an absolute path. A dead FUSE mount (its daemon gone)
 * fails every lookup with ENOTCONN: then the parent is resolved and the
 * last name kept, so such a mount can still be named and ended.
 */
static int mountpoint_path(const char *arg, char *out)
{
	char *copy, *slash, parent[PATH_MAX];
	const char *base;
	int n;

	if (realpath(arg, out))
		return 0;
	if (errno != ENOTCONN)
		return -errno;
	copy = strdup(arg);
	if (!copy)
		return -ENOMEM;
	slash = strrchr(copy, '/');
	if (slash) {
		*slash = '\0';
		base = slash + 1;
	} else {
		base = copy;
	}
	if (!realpath(slash ? (*copy ? copy : "/") : ".", parent)) {
		free(copy);
		return -errno;
	}
	n = snprintf(out, PATH_MAX, "%s/%s", strcmp(parent, "/") ? parent : "", base);
	free(copy);
	return n < PATH_MAX ? 0 : -ENAMETOOLONG;
}

/* Asks ferry-brokerd to unmount mp, a mount it made for this uid. */
static int broker_unmount(const char *sock, const char *mp)
{
	struct broker_conn *c = NULL;
	struct broker_status st;
	char *name = NULL;
	int rc;

	rc = broker_connect(sock, &c);
	if (rc < 0) {
		ctl_err("cannot reach ferry-brokerd at %s: %s", sock, strerror(-rc));
		return rc;
	}
	rc = broker_status(c, &st);
	if (rc == 0 && !*st.root)
		rc = -EPERM;
	if (rc == 0)
		rc = broker_mount_name(st.root, mp, &name);
	if (rc == 0)
		rc = broker_umount(c, name, 0);
	if (rc < 0)
		ctl_err("ferry-brokerd at %s could not unmount %s: %s%s%s", sock, mp, strerror(-rc),
			*broker_last_message() ? ": " : "", broker_last_message());
	free(name);
	broker_close(c);
	return rc;
}

int cmd_umount(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "lazy", no_argument, NULL, 'l' },
		{ "timeout", required_argument, NULL, 't' },
		{ "broker", required_argument, NULL, 'B' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	char *stats = NULL, pidbuf[32], sock[PATH_MAX] = "", handles[32] = "";
	const char *broker = NULL;
	int opt, lazy = 0, rc;
	long timeout = 600;
	pid_t pid = 0;
	char mp[PATH_MAX];

	optind = 1;
	while ((opt = getopt_long(argc, argv, "lh", longopts, NULL)) != -1) {
		switch (opt) {
		case 'l': lazy = 1; break;
		case 't': timeout = atol(optarg); break;
		case 'B': broker = optarg; break;
		case 'h':
			printf("usage: ferry umount [--lazy] [--timeout SEC] [--broker SOCKET] "
			       "MOUNTPOINT\n");
			return 0;
		default:
			return 2;
		}
	}
	if (argc - optind != 1) {
		ctl_err("umount takes one MOUNTPOINT");
		return 2;
	}
	if ((rc = mountpoint_path(argv[optind], mp)) < 0) {
		ctl_err("%s: %s", argv[optind], strerror(-rc));
		return 1;
	}
	if (ctl_read_stats(mp, &stats) == 0) {
		if (ctl_stats_value(stats, "pid", pidbuf, sizeof(pidbuf)) == 0)
			pid = (pid_t)atoi(pidbuf);
		ctl_stats_value(stats, "broker_socket", sock, sizeof(sock));
		ctl_stats_value(stats, "open_handles", handles, sizeof(handles));
		free(stats);
	} else if (!broker) {
		ctl_err("%s is not a ferryfs mount (a dead mount made through ferry-brokerd: "
			"--broker SOCKET)", mp);
		return 1;
	}
	if (*sock && pid > 0) {
		/* Made through the broker: ferry-mountd commits what is
		 * staged, then has the broker unmount (lazily), and exits.
		 * Open files make that EBUSY, as umount(2) would, unless
		 * --lazy (a process's working directory does not count). */
		/* The kernel releases a closed file asynchronously: give a
		 * close() that just returned a moment to reach ferry-mountd. */
		for (int i = 0; !lazy && atoi(handles) > 0 && i < 20; i++) {
			usleep(50 * 1000);
			if (ctl_read_stats(mp, &stats) == 0) {
				ctl_stats_value(stats, "open_handles", handles, sizeof(handles));
				free(stats);
			}
		}
		if (!lazy && atoi(handles) > 0) {
			ctl_err("%s is busy: %s files are open there (close them, or use --lazy)",
				mp, handles);
			return 1;
		}
		if (!is_mountd_of(pid, mp)) {
			/* Another pid namespace (another container of the pod):
			 * the broker can unmount, but the drain that follows
			 * cannot be awaited from here. */
			if (broker_unmount(sock, mp) < 0)
				return 1;
			fprintf(stderr, "ferry: unmounted %s through ferry-brokerd; its ferry-mountd "
				"(pid %d in another pid namespace) commits what is staged and exits "
				"on its own: wait for it where it runs\n", mp, (int)pid);
			return 0;
		}
		if (kill(pid, SIGTERM) < 0) {
			ctl_err("cannot stop ferry-mountd pid %d: %s", (int)pid, strerror(errno));
			return 1;
		}
		goto wait;
	}
	if (broker) {
		if (broker_unmount(broker, mp) < 0)
			return 1;
		goto wait;
	}
	if (umount2(mp, lazy ? MNT_DETACH : 0) < 0) {
		int err = errno;
		if (err == EPERM && run_fusermount(mp, lazy) == 0)
			goto wait;
		if (err == EBUSY)
			ctl_err("%s is busy: files are open there (close them, or use --lazy)", mp);
		else
			ctl_err("cannot unmount %s: %s", mp, strerror(err));
		return 1;
	}
wait:
	/* ferry-mountd commits what is still staged before it exits. */
	if (pid > 0) {
		struct timespec start, now;
		clock_gettime(CLOCK_MONOTONIC, &start);
		while (process_running(pid)) {
			clock_gettime(CLOCK_MONOTONIC, &now);
			if (now.tv_sec - start.tv_sec > timeout) {
				ctl_err("ferry-mountd pid %d is still committing after %ld s; it goes on "
					"in the background", (int)pid, timeout);
				return 1;
			}
			/* reap it if it is our child (ferry mount -f in the same shell is not) */
			waitpid(pid, NULL, WNOHANG);
			usleep(20000);
		}
	}
	return 0;
}

/* The helper mount_upgrade() forks before it opens any file of the mount:
 * waits for the log path and command line of the new daemon with its FUSE
 * fd, state memfd and ready pipe, and executes it. Told nothing (the
 * socket closed), it exits. */
static void spawn_daemon(int s)
{
	char *argv[MAX_ARGS + 8], ho[48], rf[16], *p, *end, *logpath;
	uint8_t *buf = NULL;
	size_t len = 0, nfds = 0;
	int fds[RPC_FDS_MAX], n = 0, lfd;

	if (rpc_frame_recv(s, 1u << 20, 3, &buf, &len, fds, &nfds) < 0 || nfds != 3 || len < 2 ||
	    buf[len - 1] != '\0')
		_exit(0);
	p = (char *)buf;
	end = p + len;
	logpath = p;
	p += strlen(p) + 1;
	if (p >= end)
		_exit(1);
	argv[n++] = p;
	p += strlen(p) + 1;
	snprintf(ho, sizeof(ho), "%d:%d", fds[0], fds[1]);
	snprintf(rf, sizeof(rf), "%d", fds[2]);
	argv[n++] = "--handover";
	argv[n++] = ho;
	argv[n++] = "--ready-fd";
	argv[n++] = rf;
	while (p < end && n < MAX_ARGS + 7) {
		argv[n++] = p;
		p += strlen(p) + 1;
	}
	argv[n] = NULL;
	lfd = *logpath ? open(logpath, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600) : -1;
	if (lfd >= 0)
		dup2(lfd, STDERR_FILENO);
	for (int k = 0; k < 3; k++)
		fcntl(fds[k], F_SETFD, 0);
	execv(argv[0], argv);
	dprintf(fds[2], "cannot run %s: %s\n", argv[0], strerror(errno));
	_exit(127);
}

/* Whether the binary at path runs here (`path --version` exits 0 within
 * 10 s); if not, why, in why. Before a hand-over: a binary that cannot run
 * (a missing library, another architecture) is found while the old daemon
 * still serves, and nothing changes. */
static bool binary_runs(const char *path, char *why, size_t cap)
{
	int out[2], status = 0;
	char buf[256] = "";
	ssize_t n = 0;
	pid_t pid;

	if (pipe2(out, O_CLOEXEC) < 0) {
		snprintf(why, cap, "pipe: %s", strerror(errno));
		return false;
	}
	pid = fork();
	if (pid < 0) {
		snprintf(why, cap, "fork: %s", strerror(errno));
		close(out[0]);
		close(out[1]);
		return false;
	}
	if (pid == 0) {
		dup2(out[1], STDOUT_FILENO);
		dup2(out[1], STDERR_FILENO);
		alarm(10);
		execl(path, path, "--version", (char *)NULL);
		dprintf(STDERR_FILENO, "%s", strerror(errno));
		_exit(127);
	}
	close(out[1]);
	for (ssize_t r; n < (ssize_t)sizeof(buf) - 1 &&
			(r = read(out[0], buf + n, sizeof(buf) - 1 - (size_t)n)) != 0;) {
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			break;
		n += r;
	}
	close(out[0]);
	buf[n] = '\0';
	buf[strcspn(buf, "\n")] = '\0';
	while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
		;
	if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
		return true;
	if (WIFSIGNALED(status))
		snprintf(why, cap, "killed by signal %d%s%s", WTERMSIG(status), *buf ? ": " : "", buf);
	else
		snprintf(why, cap, "exit %d%s%s", WEXITSTATUS(status), *buf ? ": " : "", buf);
	return false;
}

/* 1 + the first of fds 0-2 open on a file of the mount at mp, or 0. */
static int stdio_on_mount(const char *mp)
{
	struct stat m, st;

	if (stat(mp, &m) < 0)
		return 0;
	for (int fd = 0; fd <= 2; fd++)
		if (fstat(fd, &st) == 0 && st.st_dev == m.st_dev)
			return fd + 1;
	return 0;
}

static int64_t mono_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/*
 * ferry mount --upgrade MOUNTPOINT: the ferry-mountd serving the mount
 * hands it (the FUSE connection, its open handles) to a new one started
 * from this ferry's directory with the same options (mountd/handover.c).
 * The mount pauses meanwhile; nothing is unmounted.
 */
static int mount_upgrade(const char *mountpoint)
{
	char mp[PATH_MAX], path[PATH_MAX + 16], pidbuf[32], cmd[16384], logpath[PATH_MAX];
	char dir[] = "/tmp/ferry-upgrade.XXXXXX", sockpath[64], msg[1024] = "";
	char *stats = NULL, *args[MAX_ARGS], daemon[PATH_MAX];
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int lsock = -1, conn = -1, ctl = -1, blob = -1, fuse_fd = -1, pipefd[2] = { -1, -1 };
	int code = 1, nargs = 0, rc, lockfd = -1, spawn[2] = { -1, -1 };
	pid_t spawner = -1;
	uint8_t *buf = NULL;
	size_t len = 0, nfds = 0;
	int fds[RPC_FDS_MAX];
	pid_t old, pid = -1;
	ssize_t n;
	int64_t t0, t_sent, t_ready;
	bool dir_made = false, inplace = false;

	if ((rc = mountpoint_path(mountpoint, mp)) < 0) {
		ctl_err("%s: %s", mountpoint, strerror(-rc));
		return 1;
	}
	if ((rc = ctl_read_stats_within(mp, 10000, &stats)) < 0 ||
	    ctl_stats_value(stats, "pid", pidbuf, sizeof(pidbuf)) < 0) {
		ctl_err("%s is not a ferryfs mount served here (%s)", mp, strerror(rc < 0 ? -rc : ENOENT));
		free(stats);
		return 1;
	}
	free(stats);
	old = (pid_t)atoi(pidbuf);
	if (!is_mountd_of(old, mp)) {
		ctl_err("the ferry-mountd of %s (pid %d) is not in this pid namespace; upgrade it "
			"where it runs", mp, (int)old);
		return 1;
	}
	/* Every close of a file of this mount asks its daemon for a FLUSH,
	 * the implicit ones at exec and exit too: fds on it that we inherited
	 * go now, while the old daemon answers, and none is left for the new
	 * daemon's exec (the daemon that would answer it) to close. */
	if ((rc = stdio_on_mount(mp)) != 0) {
		ctl_err("fd %d of this command is a file on %s: its close would wait for the "
			"daemon being replaced; redirect it elsewhere", rc - 1, mp);
		return 1;
	}
	close_range(3, ~0u, 0);
	/* The new binaries must run before the old daemon lets go. */
	for (int k = 0; k < 2; k++) {
		snprintf(path, sizeof(path), "%s/%s", ctl_bindir(),
			 k ? "ferry-reconciler" : "ferry-mountd");
		if (!binary_runs(path, msg, sizeof(msg))) {
			ctl_err("%s does not run here (%s); the mount is left to pid %d, "
				"unchanged", path, msg, (int)old);
			return 1;
		}
	}
	snprintf(daemon, sizeof(daemon), "%s/ferry-mountd", ctl_bindir());
	/* The new daemon is started by a helper forked now, while this
	 * process holds no file of the mount: one inherited by the new daemon
	 * would be closed at its exec, and with the writeback cache on (the
	 * kernel then sends FLUSH even for FOPEN_NOFLUSH files like .control)
	 * that close waits for an answer only the new daemon could give. */
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, spawn) < 0 ||
	    (spawner = fork()) < 0) {
		ctl_err("cannot fork: %s", strerror(errno));
		return 1;
	}
	if (spawner == 0) {
		close(spawn[0]);
		spawn_daemon(spawn[1]);
	}
	close(spawn[1]);
	spawn[1] = -1;
	/* One upgrade of a mount at a time: the kernel keeps a flock on a
	 * FUSE file itself (ferry-mountd leaves flock to it), across the
	 * hand-over too. */
	snprintf(path, sizeof(path), "%s/.control", mp);
	lockfd = open(path, O_RDWR | O_CLOEXEC);
	if (lockfd < 0 || flock(lockfd, LOCK_EX | LOCK_NB) < 0) {
		if (errno == EWOULDBLOCK)
			ctl_err("another `ferry mount --upgrade` of %s is running", mp);
		else
			ctl_err("cannot open %s: %s", path, strerror(errno));
		if (lockfd >= 0)
			close(lockfd);
		return 1;
	}
	/* Its command line, to start the new one the same way. */
	snprintf(path, sizeof(path), "/proc/%d/cmdline", (int)old);
	ctl = open(path, O_RDONLY | O_CLOEXEC);
	n = ctl < 0 ? -1 : read(ctl, cmd, sizeof(cmd) - 1);
	if (ctl >= 0)
		close(ctl);
	ctl = -1;
	if (n <= 0) {
		ctl_err("cannot read %s", path);
		goto out;
	}
	cmd[n] = '\0';
	size_t cmdlen = (size_t)n;
	snprintf(path, sizeof(path), "/proc/%d/fd/2", (int)old);
	n = readlink(path, logpath, sizeof(logpath) - 1);
	logpath[n > 0 ? n : 0] = '\0';
	args[nargs++] = daemon;
	for (char *a = cmd + strlen(cmd) + 1; a < cmd + cmdlen; a += strlen(a) + 1) {
		if (!strcmp(a, "--ready-fd") || !strcmp(a, "--handover")) {
			a += strlen(a) + 1; /* and its value */
			continue;
		}
		if (!strcmp(a, "-f") || !strcmp(a, "--foreground")) {
			/* Some process waits on this pid (a container's main
			 * process): the daemon re-executes itself, same pid. */
			inplace = true;
			continue;
		}
		if (nargs >= MAX_ARGS - 6) {
			ctl_err("the daemon's command line is too long");
			goto out;
		}
		args[nargs++] = a;
	}
	if (!mkdtemp(dir)) {
		ctl_err("mkdtemp: %s", strerror(errno));
		goto out;
	}
	dir_made = true;
	snprintf(sockpath, sizeof(sockpath), "%s/s", dir);
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", sockpath);
	lsock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (lsock < 0 || bind(lsock, (struct sockaddr *)&sa, sizeof(sa)) < 0 ||
	    listen(lsock, 1) < 0) {
		ctl_err("cannot listen at %s: %s", sockpath, strerror(errno));
		goto out;
	}
	snprintf(path, sizeof(path), "%s/.control", mp);
	/* A drain first, while the mount serves: the uploads in flight then
	 * need not be finished by the new daemon before it serves. */
	ctl = open(path, O_RDWR | O_CLOEXEC);
	if (ctl < 0) {
		ctl_err("cannot open %s: %s", path, strerror(errno));
		goto out;
	}
	if (write(ctl, "drain wait timeout=120\n", 23) < 0)
		ctl_err("warning: the drain before the hand-over did not finish (%s); the new "
			"daemon commits the rest before it serves", strerror(errno));
	close(ctl);
	ctl = open(path, O_RDWR | O_CLOEXEC);
	if (ctl < 0) {
		ctl_err("cannot open %s: %s", path, strerror(errno));
		goto out;
	}
	t0 = mono_ms();
	snprintf(msg, sizeof(msg), "handover %s\n", sockpath);
	if (write(ctl, msg, strlen(msg)) < 0) {
		ctl_err("ferry-mountd (pid %d) refused the hand-over: %s", (int)old, strerror(errno));
		goto out;
	}
	/* ctl stays open until the new daemon serves: its close would wait
	 * for an answer from a daemon (it is handed over with the rest). */
	struct pollfd pfd = { .fd = lsock, .events = POLLIN };
	if (poll(&pfd, 1, 120000) != 1 || (conn = accept4(lsock, NULL, NULL, SOCK_CLOEXEC)) < 0) {
		ctl_err("ferry-mountd (pid %d) did not hand the mount over (see its log, %s)",
			(int)old, logpath);
		goto out;
	}
	rc = rpc_frame_recv(conn, 64u << 20, 1, &buf, &len, fds, &nfds);
	if (rc < 0 || nfds != 1) {
		ctl_err("the hand-over from pid %d failed: %s (see %s)", (int)old,
			rc < 0 ? strerror(-rc) : "no FUSE fd came", logpath);
		rpc_fds_close(fds, nfds);
		goto out;
	}
	fuse_fd = fds[0];
	t_sent = mono_ms();
	if (inplace) {
		/* The state goes back with the binary to execute and the
		 * ready pipe; the daemon keeps its own FUSE fd. */
		blob = memfd_create("ferry-handover", MFD_CLOEXEC);
		if (blob < 0 || write(blob, buf, len) != (ssize_t)len ||
		    pipe2(pipefd, O_CLOEXEC) < 0 ||
		    (rc = rpc_frame_send(conn, daemon, strlen(daemon),
					 (const int[]){ blob, pipefd[1] }, 2)) < 0) {
			ctl_err("cannot hand the state back to pid %d: %s", (int)old,
				strerror(errno));
			goto out;
		}
		close(pipefd[1]);
		pipefd[1] = -1;
		pid = old;
		goto started;
	}
	for (int k = 0; k < 6000 && process_running(old); k++)
		usleep(10000);
	if (process_running(old)) {
		ctl_err("ferry-mountd pid %d handed the mount over but did not exit", (int)old);
		goto out;
	}
	blob = memfd_create("ferry-handover", MFD_CLOEXEC);
	if (blob < 0 || write(blob, buf, len) != (ssize_t)len || pipe2(pipefd, O_CLOEXEC) < 0) {
		ctl_err("cannot pass the hand-over on: %s", strerror(errno));
		goto out;
	}
	/* To the helper: the log, then the command line, with the fds. */
	{
		size_t plen = strlen(logpath) + 1, off = 0;
		char *payload;

		for (int k = 0; k < nargs; k++)
			plen += strlen(args[k]) + 1;
		payload = malloc(plen);
		if (!payload) {
			ctl_err("out of memory");
			goto out;
		}
		memcpy(payload, logpath, strlen(logpath) + 1);
		off = strlen(logpath) + 1;
		for (int k = 0; k < nargs; k++) {
			memcpy(payload + off, args[k], strlen(args[k]) + 1);
			off += strlen(args[k]) + 1;
		}
		rc = rpc_frame_send(spawn[0], payload, plen,
				    (const int[]){ fuse_fd, blob, pipefd[1] }, 3);
		free(payload);
		if (rc < 0) {
			ctl_err("cannot start the new ferry-mountd: %s", strerror(-rc));
			goto out;
		}
	}
	pid = spawner;
	close(pipefd[1]);
	pipefd[1] = -1;
started:
	read_ready(pipefd[0], msg, sizeof(msg));
	t_ready = mono_ms();
	if (strcmp(msg, "ok") != 0) {
		ctl_err("the new ferry-mountd did not start: %s (see %s); the mount waits for a "
			"daemon: `ferry mount --broker` takes a brokered one over", *msg ? msg : "it exited",
			logpath);
		goto out;
	}
	printf("upgraded %s: ferry-mountd pid %d handed over to pid %d; the mount paused %lld ms "
	       "(%lld ms handing over, %lld ms starting)\n",
	       mp, (int)old, (int)pid, (long long)(t_ready - t0), (long long)(t_sent - t0),
	       (long long)(t_ready - t_sent));
	code = 0;
out:
	free(buf);
	/* The FUSE fd before any file of the mount: if the hand-over failed,
	 * it may be the connection's last, and its close ends the requests
	 * (a FLUSH of .control) the closes below would wait for. */
	if (fuse_fd >= 0) {
		close(fuse_fd);
		fuse_fd = -1;
	}
	if (spawn[0] >= 0)
		close(spawn[0]); /* a helper told nothing exits */
	if (spawner > 0 && spawner != pid)
		waitpid(spawner, NULL, 0);
	if (ctl >= 0)
		close(ctl);
	if (conn >= 0)
		close(conn);
	if (lsock >= 0)
		close(lsock);
	if (blob >= 0)
		close(blob);
	if (fuse_fd >= 0)
		close(fuse_fd);
	if (pipefd[0] >= 0)
		close(pipefd[0]);
	if (pipefd[1] >= 0)
		close(pipefd[1]);
	if (dir_made) {
		unlink(sockpath);
		rmdir(dir);
	}
	close(lockfd);
	return code;
}
