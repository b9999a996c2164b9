/* ferry status: the mount's .stats as "key: value" lines or JSON. */
#include <ctype.h>
#include <stdbool.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctl.h"

static bool is_number(const char *s)
{
	if (!*s)
		return false;
	for (; *s; s++)
		if (!isdigit((unsigned char)*s))
			return false;
	return true;
}

static void json_string(const char *s, size_t n)
{
	putchar('"');
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)s[i];
		if (c == '"' || c == '\\')
			printf("\\%c", c);
		else if (c < 0x20)
			printf("\\u%04x", c);
		else
			putchar(c);
	}
	putchar('"');
}

int cmd_status(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "json", no_argument, NULL, 'j' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	char *stats = NULL;
	int opt, rc, json = 0;
	bool first = true;

	optind = 1;
	while ((opt = getopt_long(argc, argv, "jh", longopts, NULL)) != -1) {
		if (opt == 'j')
			json = 1;
		else if (opt == 'h') {
			printf("usage: ferry status [--json] MOUNTPOINT\n");
			return 0;
		} else
			return 2;
	}
	if (argc - optind != 1) {
		ctl_err("status takes one MOUNTPOINT");
		return 2;
	}
	rc = ctl_read_stats(argv[optind], &stats);
	if (rc < 0) {
		ctl_err("%s is not a ferryfs mount (cannot read its .stats: %s)", argv[optind],
			strerror(-rc));
		return 1;
	}
	if (json)
		printf("{");
	if (!json)
		printf("mountpoint: %s\n", argv[optind]);
	for (char *line = strtok(stats, "\n"); line; line = strtok(NULL, "\n")) {
		char *sp = strchr(line, ' ');
		if (!sp)
			continue;
		*sp = '\0';
		if (!json) {
			printf("%s: %s\n", line, sp + 1);
			continue;
		}
		printf("%s", first ? "" : ",");
		first = false;
		json_string(line, strlen(line));
		putchar(':');
		if (is_number(sp + 1))
			printf("%s", sp + 1);
		else
			json_string(sp + 1, strlen(sp + 1));
	}
	if (json)
		printf("}\n");
	free(stats);
	return 0;
}
