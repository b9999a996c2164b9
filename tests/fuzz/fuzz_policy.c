/*
 * libFuzzer target: brokerd's policy parser never crashes, leaks or reads
 * past its input; what it accepts is well formed, and every rule it returns
 * is found by policy_match for its own peer (or an earlier rule is).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "policy.h"

static void
check_rule(const struct policy *p, size_t i)
{
	const struct policy_rule *r = &p->rules[i], *m;
	size_t rl;

	if (r->uid == (uid_t)-1 || (r->has_gid && r->gid == (gid_t)-1))
		abort();
	if (!r->root || r->root[0] != '/' || r->root[1] == '\0' || strstr(r->root, "//"))
		abort();
	rl = strlen(r->root);
	if (r->root[rl - 1] == '/')
		abort();
	if (r->cgroup && (r->cgroup[0] != '/' || strstr(r->cgroup, "//")))
		abort();
	if (r->allow_other != 0 && r->allow_other != 1)
		abort();
	if (i > 0 && r->line <= p->rules[i - 1].line)
		abort();
	/* The rule's own peer is matched, by it or by an earlier rule. */
	m = policy_match(p, r->uid, r->has_gid ? r->gid : 0, r->cgroup);
	if (m == NULL || m > r)
		abort();
	if (r->cgroup) {
		char sub[4200];

		if (strlen(r->cgroup) + 3 < sizeof(sub)) {
			strcpy(sub, r->cgroup);
			strcat(sub, strcmp(r->cgroup, "/") ? "/x" : "x");
			m = policy_match(p, r->uid, r->has_gid ? r->gid : 0, sub);
			if (m == NULL || m > r)
				abort();
		}
	}
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct policy *p = NULL;
	char err[256];
	int r;

	r = policy_parse((const char *)data, size, "fuzz.conf", &p, err, sizeof(err));
	if (r == 0) {
		uid_t uid = 0;

		if (p == NULL || err[0] != '\0')
			abort();
		for (size_t i = 0; i < p->n && i < 64; i++)
			check_rule(p, i);
		if (size >= sizeof(uid))
			memcpy(&uid, data, sizeof(uid));
		(void)policy_match(p, uid, (gid_t)uid, NULL);
		(void)policy_match(p, uid, 0, "/kubepods/pod12/ctr");
		(void)policy_match(p, 0, 0, "/../x/./y");
		(void)policy_match(p, (uid_t)-1, (gid_t)-1, "");
	} else if (p != NULL || strncmp(err, "fuzz.conf:", 10) != 0) {
		abort();
	}
	policy_free(p);
	return 0;
}
