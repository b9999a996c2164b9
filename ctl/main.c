/* ferry: command dispatch and the helpers the commands share. */
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ctl.h"

static const struct command {
	const char *name;
	int (*fn)(int argc, char **argv);
	const char *help;
} commands[] = {
	{ "format", cmd_format, "format [--storage URL] [--block-size BYTES] [--s3-http] [--s3-endpoint URL] [--s3-region REGION] [--force] VOLUME" },
	{ "mount", cmd_mount, "mount [-f] [--cache-dir DIR] [--cache-size MiB] [--staging-dir DIR] [--log FILE] [--reconciler SOCKET | --no-reconciler] [--metrics ADDR:PORT] [--broker SOCKET] [-o OPTS] VOLUME MOUNTPOINT" },
	{ "umount", cmd_umount, "umount [--lazy] [--timeout SEC] [--broker SOCKET] MOUNTPOINT" },
	{ "status", cmd_status, "status [--json] [--timeout SEC] MOUNTPOINT" },
	{ "drain", cmd_drain, "drain [--timeout SEC] [--json] MOUNTPOINT" },
	{ "warmup", cmd_warmup, "warmup [--quiet] PATH..." },
	{ "dump", cmd_dump, "dump VOLUME [FILE]" },
	{ "load", cmd_load, "load FILE VOLUME" },
	{ "checkpoint", cmd_checkpoint, "checkpoint [--timeout SEC] [--json] MOUNTPOINT NAME | --list VOLUME | --delete [--force] VOLUME NAME" },
	{ "restore", cmd_restore, "restore --from NAME --storage URL [--s3-http] NEW_VOLUME" },
	{ "gc", cmd_gc, "gc [--delete] [--grace SEC] VOLUME" },
};

void ctl_err(const char *fmt, ...)
{
	va_list ap;

	fputs("ferry: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
}

const char *ctl_bindir(void)
{
	static char dir[PATH_MAX];
	ssize_t n;

	if (*dir)
		return dir;
	n = readlink("/proc/self/exe", dir, sizeof(dir) - 1);
	if (n <= 0)
		return ".";
	dir[n] = '\0';
	*strrchr(dir, '/') = '\0';
	return dir;
}

int ctl_read_stats(const char *mountpoint, char **out)
{
	char path[PATH_MAX], *buf = NULL;
	size_t len = 0, cap = 0;
	int fd, rc = 0;

	snprintf(path, sizeof(path), "%s/.stats", mountpoint);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	for (;;) {
		ssize_t n;
		if (cap - len < 4096) {
			char *nb = realloc(buf, cap + 65536);
			if (!nb) {
				rc = -ENOMEM;
				goto out;
			}
			buf = nb;
			cap += 65536;
		}
		n = read(fd, buf + len, cap - len - 1);
		if (n < 0) {
			rc = -errno;
			goto out;
		}
		if (n == 0)
			break;
		len += (size_t)n;
	}
	buf[len] = '\0';
	*out = buf;
	buf = NULL;
out:
	free(buf);
	close(fd);
	return rc;
}

int ctl_read_stats_within(const char *mountpoint, int timeout_ms, char **out)
{
	int pfd[2], rc = 0;
	size_t len = 0, cap = 0;
	char *buf = NULL; /* owned until handed to *out */
	pid_t pid;
	struct timespec start, now;

	if (timeout_ms <= 0)
		return ctl_read_stats(mountpoint, out);
	if (pipe2(pfd, O_CLOEXEC) < 0)
		return -errno;
	pid = fork();
	if (pid < 0) {
		rc = -errno;
		close(pfd[0]);
		close(pfd[1]);
		return rc;
	}
	if (pid == 0) {
		/* The child may hang in the kernel on a wedged daemon; the
		 * parent does not, and kills it. */
		char *text = NULL;
		int r = ctl_read_stats(mountpoint, &text);
		if (r < 0) {
			unsigned char e = (unsigned char)-r;
			_exit(write(pfd[1], &e, 1) == 1 ? 1 : 2);
		}
		unsigned char ok = 0;
		size_t n = strlen(text), off = 0;
		if (write(pfd[1], &ok, 1) != 1)
			_exit(2);
		while (off < n) {
			ssize_t w = write(pfd[1], text + off, n - off);
			if (w <= 0)
				_exit(2);
			off += (size_t)w;
		}
		_exit(0);
	}
	close(pfd[1]);
	clock_gettime(CLOCK_MONOTONIC, &start);
	for (;;) {
		struct pollfd p = { .fd = pfd[0], .events = POLLIN };
		clock_gettime(CLOCK_MONOTONIC, &now);
		long left = timeout_ms - ((now.tv_sec - start.tv_sec) * 1000 +
					  (now.tv_nsec - start.tv_nsec) / 1000000);
		if (left <= 0) {
			rc = -ETIMEDOUT;
			break;
		}
		int pr = poll(&p, 1, (int)left);
		if (pr < 0 && errno == EINTR)
			continue;
		if (pr <= 0)
			continue;
		if (cap - len < 4096) {
			char *nb = realloc(buf, cap + 65536);
			if (!nb) {
				rc = -ENOMEM;
				break;
			}
			buf = nb;
			cap += 65536;
		}
		ssize_t n = read(pfd[0], buf + len, cap - len - 1);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		len += (size_t)n;
	}
	close(pfd[0]);
	if (rc == -ETIMEDOUT) {
		kill(pid, SIGKILL);
		/* Killed in a FUSE wait it goes at once; not reaped if it does
		 * not (the process exits soon anyway). */
		for (int k = 0; k < 100 && waitpid(pid, NULL, WNOHANG) == 0; k++)
			usleep(10000);
	} else {
		waitpid(pid, NULL, 0);
		if (rc == 0 && len == 0)
			rc = -EIO;
		else if (rc == 0 && (unsigned char)buf[0] != 0)
			rc = -(int)(unsigned char)buf[0];
	}
	if (rc < 0) {
		free(buf);
		return rc;
	}
	memmove(buf, buf + 1, len - 1);
	buf[len - 1] = '\0';
	*out = buf;
	return 0;
}

int ctl_stats_value(const char *stats, const char *name, char *buf, size_t len)
{
	size_t nl = strlen(name);

	for (const char *p = stats; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL) {
		if (strncmp(p, name, nl) == 0 && p[nl] == ' ') {
			size_t vl = strcspn(p + nl + 1, "\n");
			if (vl >= len)
				vl = len - 1;
			memcpy(buf, p + nl + 1, vl);
			buf[vl] = '\0';
			return 0;
		}
	}
	return -ENOENT;
}

static void usage(FILE *f)
{
	fprintf(f, "usage: ferry COMMAND [options]\n\ncommands:\n");
	for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
		fprintf(f, "  ferry %s\n", commands[i].help);
	fprintf(f, "\nVOLUME is a directory (its meta.db) or sqlite:///abs/path/meta.db.\n"
		   "Storage URLs: file:///abs/dir, s3://HOST:PORT/BUCKET[/PREFIX][?OPTS],\n"
		   "s3://BUCKET[/PREFIX]?region=REGION[&OPTS] (AWS; README: Storage URLs).\n");
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		usage(stderr);
		return 2;
	}
	if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
		usage(stdout);
		return 0;
	}
	if (!strcmp(argv[1], "-V") || !strcmp(argv[1], "--version")) {
		printf("ferry 0.1.0\n");
		return 0;
	}
	for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
		if (!strcmp(argv[1], commands[i].name))
			return commands[i].fn(argc - 1, argv + 1);
	ctl_err("unknown command '%s' (try ferry --help)", argv[1]);
	return 2;
}
