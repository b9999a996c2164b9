/* ferry status: the mount's .stats as "key: value" lines or JSON. */
#include <ctype.h>
#include <errno.h>
#include <stdbool.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <json-c/json.h>

#include "ctl.h"

/* A .stats value as JSON: an integer when it is one (json-c's own range checks), else a string. */
static struct json_object *json_value(const char *v)
{
	char *end;
	unsigned long long u;

	if (isdigit((unsigned char)v[0])) {
		errno = 0;
		u = strtoull(v, &end, 10);
		if (*end == '\0' && errno == 0)
			return json_object_new_uint64(u);
	}
	return json_object_new_string(v);
}

int cmd_status(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "json", no_argument, NULL, 'j' },
		{ "timeout", required_argument, NULL, 't' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	struct json_object *obj = NULL;
	char *stats = NULL;
	int opt, rc, json = 0, timeout_ms = 0;
	double secs;
	char *end;

	optind = 1;
	while ((opt = getopt_long(argc, argv, "jt:h", longopts, NULL)) != -1) {
		if (opt == 'j') {
			json = 1;
		} else if (opt == 't') {
			errno = 0;
			secs = strtod(optarg, &end);
			if (errno || end == optarg || *end || !(secs > 0) || secs > 3600) {
				ctl_err("status: --timeout wants seconds (up to 3600), not '%s'", optarg);
				return 2;
			}
			timeout_ms = (int)(secs * 1000);
			if (timeout_ms == 0)
				timeout_ms = 1;
		} else if (opt == 'h') {
			printf("usage: ferry status [--json] [--timeout SEC] MOUNTPOINT\n");
			return 0;
		} else {
			return 2;
		}
	}
	if (argc - optind != 1) {
		ctl_err("status takes one MOUNTPOINT");
		return 2;
	}
	rc = ctl_read_stats_within(argv[optind], timeout_ms, &stats);
	if (rc == -ETIMEDOUT) {
		ctl_err("%s: ferry-mountd gave no answer in %.1f s (wedged, or stopped)", argv[optind],
			timeout_ms / 1000.0);
		return 3;
	}
	if (rc < 0) {
		ctl_err("%s is not a ferryfs mount (cannot read its .stats: %s)", argv[optind],
			strerror(-rc));
		return 1;
	}
	if (json && (obj = json_object_new_object()) == NULL) {
		ctl_err("out of memory");
		free(stats);
		return 1;
	}
	if (!json)
		printf("mountpoint: %s\n", argv[optind]);
	for (char *line = strtok(stats, "\n"); line; line = strtok(NULL, "\n")) {
		char *sp = strchr(line, ' ');
		if (!sp)
			continue;
		*sp = '\0';
		if (!json)
			printf("%s: %s\n", line, sp + 1);
		else
			json_object_object_add(obj, line, json_value(sp + 1));
	}
	if (json) {
		printf("%s\n", json_object_to_json_string_ext(obj, JSON_C_TO_STRING_PLAIN |
								   JSON_C_TO_STRING_NOSLASHESCAPE));
		json_object_put(obj);
	}
	free(stats);
	return 0;
}
