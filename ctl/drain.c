/*
 * ferry drain: commits everything written to a mount up to now (a mark)
 * and returns, through the mount's .control file (mountd/special.c has the
 * protocol). Progress on a terminal; one summary line otherwise, or JSON.
 *
 * Exit codes: 0 drained; 1 the request could not be made (not a ferryfs
 * mount, not its owner); 2 usage; 3 timed out; 4 a file failed for good.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <json-c/json.h>

#include "ctl.h"

#define DRAIN_EXIT_TIMED_OUT 3
#define DRAIN_EXIT_FAILED 4
#define POLL_MS 200

static volatile sig_atomic_t interrupted;

static void on_signal(int sig)
{
	(void)sig;
	interrupted = 1;
}

/* The reply text of the request on fd, read from offset 0 (malloc'ed). */
static int control_read(int fd, char **out)
{
	size_t cap = 4096, len = 0;
	char *buf = malloc(cap);

	if (!buf)
		return -ENOMEM;
	for (;;) {
		ssize_t n = pread(fd, buf + len, cap - len - 1, (off_t)len);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			free(buf);
			return -errno;
		}
		if (n == 0)
			break;
		len += (size_t)n;
		if (cap - len < 1024) {
			char *nb = realloc(buf, cap * 2);
			if (!nb) {
				free(buf);
				return -ENOMEM;
			}
			buf = nb;
			cap *= 2;
		}
	}
	buf[len] = '\0';
	*out = buf;
	return 0;
}

static uint64_t value_u64(const char *text, const char *name)
{
	char v[64];

	if (ctl_stats_value(text, name, v, sizeof(v)) < 0)
		return 0;
	return strtoull(v, NULL, 10);
}

static void human_bytes(uint64_t b, char *buf, size_t len)
{
	const char *unit[] = { "B", "KiB", "MiB", "GiB", "TiB" };
	double v = (double)b;
	int u = 0;

	while (v >= 1024 && u < 4) {
		v /= 1024;
		u++;
	}
	snprintf(buf, len, u ? "%.1f %s" : "%.0f %s", v, unit[u]);
}

/* The report lines ("failed ..." / "left ...") of the reply. */
static void for_each_problem(const char *text, void (*fn)(const char *line, size_t len, void *arg),
			     void *arg)
{
	for (const char *p = text; p && *p;) {
		const char *nl = strchr(p, '\n');
		size_t n = nl ? (size_t)(nl - p) : strlen(p);
		if ((n > 7 && !strncmp(p, "failed ", 7)) || (n > 5 && !strncmp(p, "left ", 5)))
			fn(p, n, arg);
		p = nl ? nl + 1 : NULL;
	}
}

static void problem_print(const char *line, size_t len, void *arg)
{
	(void)arg;
	fprintf(stderr, "ferry: %.*s\n", (int)len, line);
}

static void problem_json(const char *line, size_t len, void *arg)
{
	json_object_array_add(arg, json_object_new_string_len(line, (int)len));
}

static int64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int ctl_timeout_arg(const char *cmd, const char *arg, double *seconds)
{
	char *end;

	errno = 0;
	*seconds = strtod(arg, &end);
	if (errno || end == arg || *end || !(*seconds >= 0) || *seconds > 31536000) {
		ctl_err("%s: --timeout wants seconds (0: none), not '%s'", cmd, arg);
		return -EINVAL;
	}
	return 0;
}

int cmd_drain(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "timeout", required_argument, NULL, 't' },
		{ "json", no_argument, NULL, 'j' },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	double timeout_s = 0;
	int opt, json = 0;

	optind = 1;
	while ((opt = getopt_long(argc, argv, "t:jh", opts, NULL)) != -1) {
		switch (opt) {
		case 't':
			if (ctl_timeout_arg("drain", optarg, &timeout_s) < 0)
				return 2;
			break;
		case 'j':
			json = 1;
			break;
		case 'h':
			printf("usage: ferry drain [--timeout SEC] [--json] MOUNTPOINT\n");
			return 0;
		default:
			return 2;
		}
	}
	if (optind != argc - 1) {
		ctl_err("usage: ferry drain [--timeout SEC] [--json] MOUNTPOINT");
		return 2;
	}
	return ctl_control_run(argv[optind], NULL, timeout_s, json);
}

int ctl_control_run(const char *mountpoint, const char *checkpoint, double timeout_s, int json)
{
	const char *what = checkpoint ? "checkpoint" : "drain";
	char path[PATH_MAX], req[160], state[32] = "", *text = NULL;
	int fd = -1, rc = 1;
	bool tty = isatty(STDERR_FILENO);
	uint64_t last_bytes = 0;
	int64_t last_ms = 0;
	double rate = 0; /* bytes/s, smoothed */

	snprintf(path, sizeof(path), "%s/.control", mountpoint);
	fd = open(path, O_RDWR | O_CLOEXEC);
	if (fd < 0) {
		int e = errno;
		ctl_err("%s: cannot open %s: %s%s", what, path, strerror(e),
			e == ENOENT ? " (not a ferryfs mount?)" :
			e == EACCES ? " (only the mount's owner or root may drain it)" : "");
		return 1;
	}
	/* Ctrl-C: closing .control cancels the drain; what it committed stays. */
	struct sigaction sa = { .sa_handler = on_signal };
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	if (checkpoint)
		snprintf(req, sizeof(req), "checkpoint %s timeout=%.3f\n", checkpoint, timeout_s);
	else
		snprintf(req, sizeof(req), "drain timeout=%.3f\n", timeout_s);
	if (write(fd, req, strlen(req)) < 0) {
		ctl_err("%s: %s refused the request: %s", what, path, strerror(errno));
		goto out;
	}
	for (;;) {
		int r;

		free(text);
		text = NULL;
		r = control_read(fd, &text);
		if (r < 0) {
			ctl_err("%s: cannot read %s: %s", what, path, strerror(-r));
			goto out;
		}
		if (ctl_stats_value(text, "state", state, sizeof(state)) < 0) {
			ctl_err("%s: %s gave no state", what, path);
			goto out;
		}
		if (strcmp(state, "running") != 0)
			break;
		if (interrupted) {
			if (tty && !json)
				fputc('\n', stderr);
			ctl_err("%s: interrupted; the drain is cancelled (what it committed stays)", what);
			rc = 130;
			goto out;
		}
		if (tty && !json) {
			uint64_t left = value_u64(text, "bytes_left");
			int64_t t = now_ms();
			char b[32], eta[48] = "";
			if (last_ms && t > last_ms && last_bytes >= left) {
				double r1 = (double)(last_bytes - left) * 1000.0 / (double)(t - last_ms);
				rate = rate ? 0.7 * rate + 0.3 * r1 : r1;
			}
			last_ms = t;
			last_bytes = left;
			human_bytes(left, b, sizeof(b));
			if (rate > 1)
				snprintf(eta, sizeof(eta), ", %.1f MiB/s, about %.0f s left",
					 rate / 1048576.0, (double)left / rate);
			fprintf(stderr, "\rdraining to mark %llu: %llu files, %llu blocks, %s left%s   ",
				(unsigned long long)value_u64(text, "mark"),
				(unsigned long long)value_u64(text, "files_left"),
				(unsigned long long)value_u64(text, "blocks_left"), b, eta);
		}
		struct timespec nap = { 0, POLL_MS * 1000000L };
		nanosleep(&nap, NULL);
	}
	if (tty && !json)
		fprintf(stderr, "\r\033[K");
	rc = !strcmp(state, "done") ? 0 : !strcmp(state, "timed_out") ? DRAIN_EXIT_TIMED_OUT :
								     DRAIN_EXIT_FAILED;
	if (json) {
		struct json_object *o = json_object_new_object(), *p = json_object_new_array();
		if (!o || !p) {
			json_object_put(o);
			json_object_put(p);
			ctl_err("%s: out of memory", what);
			rc = 1;
			goto out;
		}
		json_object_object_add(o, "state", json_object_new_string(state));
		static const char *const fields[] = { "mark", "elapsed_ms", "files_at_mark",
						      "bytes_at_mark", "files_left", "bytes_left",
						      "blocks_left", "files_failed" };
		for (size_t k = 0; k < sizeof(fields) / sizeof(fields[0]); k++)
			json_object_object_add(o, fields[k],
					       json_object_new_uint64(value_u64(text, fields[k])));
		if (checkpoint) {
			static const char *const cfields[] = { "checkpoint_records",
							       "checkpoint_dump_bytes",
							       "checkpoint_slices",
							       "checkpoint_slice_bytes" };
			char v[32] = "0";
			json_object_object_add(o, "checkpoint", json_object_new_string(checkpoint));
			for (size_t k = 0; k < sizeof(cfields) / sizeof(cfields[0]); k++)
				json_object_object_add(o, cfields[k],
						       json_object_new_uint64(value_u64(text, cfields[k])));
			ctl_stats_value(text, "pause_ms", v, sizeof(v));
			json_object_object_add(o, "pause_ms",
					       json_object_new_double_s(strtod(v, NULL), v));
			snprintf(v, sizeof(v), "0");
			ctl_stats_value(text, "slice_pause_ms", v, sizeof(v));
			json_object_object_add(o, "slice_pause_ms",
					       json_object_new_double_s(strtod(v, NULL), v));
		}
		for_each_problem(text, problem_json, p);
		json_object_object_add(o, "problems", p);
		printf("%s\n", json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN |
								     JSON_C_TO_STRING_NOSLASHESCAPE));
		json_object_put(o);
	} else {
		char b[32];
		uint64_t ms = value_u64(text, "elapsed_ms");
		human_bytes(value_u64(text, rc == 0 ? "bytes_at_mark" : "bytes_left"), b, sizeof(b));
		if (rc == 0 && checkpoint) {
			char v[32] = "?", sb[32];
			ctl_stats_value(text, "pause_ms", v, sizeof(v));
			human_bytes(value_u64(text, "checkpoint_slice_bytes"), sb, sizeof(sb));
			printf("checkpoint %s taken in %.1f s (drained %llu files, %s): %llu "
			       "slices (%s) kept; changes to the namespace paused %s ms\n",
			       checkpoint, ms / 1000.0,
			       (unsigned long long)value_u64(text, "files_at_mark"), b,
			       (unsigned long long)value_u64(text, "checkpoint_slices"), sb, v);
		} else if (rc == 0)
			printf("drained to mark %llu: %llu files, %s in %.1f s\n",
			       (unsigned long long)value_u64(text, "mark"),
			       (unsigned long long)value_u64(text, "files_at_mark"), b, ms / 1000.0);
		else if (rc == DRAIN_EXIT_TIMED_OUT)
			printf("timed out after %.1f s draining to mark %llu: %llu files, %s left "
			       "(staged and journaled: nothing is lost)\n",
			       ms / 1000.0, (unsigned long long)value_u64(text, "mark"),
			       (unsigned long long)value_u64(text, "files_left"), b);
		else
			printf("drain to mark %llu %s after %.1f s: %llu files failed\n",
			       (unsigned long long)value_u64(text, "mark"), state, ms / 1000.0,
			       (unsigned long long)value_u64(text, "files_failed"));
		for_each_problem(text, problem_print, NULL);
	}
out:
	free(text);
	if (fd >= 0)
		close(fd);
	return rc;
}
