/*
 * policy: who may ask ferry-brokerd for what. A policy file is a list of
 * `allow` lines; a peer (SO_PEERCRED uid/gid plus its cgroup path) gets the
 * first rule that matches it, and a peer no rule matches is refused.
 *
 *   # comment
 *   allow uid=65534 root=/srv/ferry/pods max_mounts=16 max_backing=4096
 *   allow uid=1000 gid=1000 cgroup=/kubepods/pod1234 root=/srv/a allow_other=1
 *
 * Keys: uid (required), root (required, absolute, no "." or ".." parts),
 * gid, cgroup (a path prefix matched on whole components), max_mounts
 * (default 16), max_backing (default 4096), allow_other (0|1, default 0).
 * An unknown key, a repeated key, a bad number or a missing required key is
 * an error that names the file and line.
 *
 * In detail:
 * - Words are separated by spaces and tabs; a pair is key=value with no
 *   space around '='. A '#' at the start of a line or of a word begins a
 *   comment that runs to the end of the line ("root=/a#b" is a path).
 *   Lines end in LF or CRLF; the last one needs no newline. Any other
 *   control character, or a NUL byte, is an error.
 * - uid and gid are decimal, 0 to 4294967294: no sign, no "0x";
 *   4294967295 is (uid_t)-1 and refused. gid filters on the peer's primary
 *   gid (the one SO_PEERCRED gives). max_mounts and max_backing are decimal,
 *   0 to INT_MAX; 0 makes a rule that matches and then grants nothing, so a
 *   peer it catches is not tried against later rules.
 * - root and cgroup are written normalised: they start with '/' and have no
 *   empty ("//"), "." or ".." component and no trailing slash. root=/ is
 *   refused as too broad; cgroup=/ matches every known cgroup. cgroup is
 *   a prefix on whole components: /kubepods/pod12 matches itself and
 *   /kubepods/pod12/ctr, not /kubepods/pod123.
 * - Limits: 1 MiB per file, 65536 lines, 8192 bytes per line, 4096 rules,
 *   PATH_MAX - 1 bytes per path. An empty policy is valid and allows no one.
 *
 * struct policy owns every string in its rules; policy_free() frees it all.
 * Parsing does not touch the filesystem: whether each root exists is the
 * caller's check (ferry-brokerd -n does it and says which).
 */
#ifndef FERRY_BROKERD_POLICY_H
#define FERRY_BROKERD_POLICY_H

#include <stddef.h>
#include <sys/types.h>

#define POLICY_DEFAULT_MAX_MOUNTS 16u
#define POLICY_DEFAULT_MAX_BACKING 4096u

struct policy_rule {
	uid_t uid;
	int has_gid;
	gid_t gid;
	char *cgroup;         /* NULL: any cgroup */
	char *root;           /* absolute path of the directory mounts go beneath */
	unsigned max_mounts;
	unsigned max_backing; /* live backing ids, over all of the peer's mounts */
	int allow_other;
	unsigned line;        /* where it came from, for log lines */
};

struct policy {
	struct policy_rule *rules;
	size_t n;
};

/*
 * Parses text[0..len) (need not be NUL-terminated); name is used in error
 * messages. On success returns 0 and *out (free with policy_free), and err
 * is "". On error returns -EINVAL, sets *out to NULL and writes
 * "NAME:LINE: what is wrong" into err ("NAME: what is wrong" when it is the
 * whole file, e.g. too large), truncated to errlen; -ENOMEM says "out of
 * memory" the same way. err may be NULL if errlen is 0.
 */
int policy_parse(const char *text, size_t len, const char *name, struct policy **out,
		 char *err, size_t errlen);
/*
 * Reads and parses path (symlinks are followed); as policy_parse, with path
 * as NAME. If the file cannot be read returns -errno and err is
 * "PATH: strerror(errno)" (-EISDIR for a directory); anything else that is
 * not a regular file, or one over 1 MiB, is -EINVAL.
 */
int policy_load(const char *path, struct policy **out, char *err, size_t errlen);
void policy_free(struct policy *p); /* accepts NULL */

/*
 * The first rule, in file order, that matches the peer, or NULL: same uid,
 * same gid if the rule has one, cgroup under the rule's if it has one.
 * cgroup may be NULL (unknown): it then matches only rules without a cgroup
 * key. So does a cgroup that is not absolute or has a "." or ".." component
 * (how /proc/PID/cgroup shows a cgroup outside the reader's namespace).
 * p may be NULL.
 */
const struct policy_rule *policy_match(const struct policy *p, uid_t uid, gid_t gid,
				       const char *cgroup);

#endif
