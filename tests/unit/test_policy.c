/*
 * policy: brokerd's policy file, in the style of OpenBSD's
 * regress/usr.sbin/bgpd/config: every tests/unit/policy/NAME.in is parsed
 * as "NAME.in" and what comes out, the rules dumped one a line or the error
 * line, must equal NAME.ok byte for byte. POLICY_GOLDEN_UPDATE=1 in the
 * environment rewrites the .ok files instead (read the diff before keeping
 * it). Limits, policy_load and policy_match are tested in code below.
 */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "policy.h"

#define GOLDEN_DIR FERRY_SOURCE_DIR "/tests/unit/policy"

/* The whole of path, malloc'ed, its length in *len (a NUL follows). */
static char *
slurp(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	char *buf = NULL;
	long n;

	if (f == NULL)
		return NULL;
	cr_assert_eq(fseek(f, 0, SEEK_END), 0);
	n = ftell(f);
	cr_assert(n >= 0);
	rewind(f);
	buf = malloc((size_t)n + 1);
	cr_assert(buf);
	cr_assert_eq(fread(buf, 1, (size_t)n, f), (size_t)n, "%s: short read", path);
	buf[n] = '\0';
	*len = (size_t)n;
	fclose(f);
	return buf;
}

/* One line per rule, every field; "-" for an absent gid or cgroup. */
static void
dump(FILE *f, const struct policy *p)
{
	for (size_t i = 0; i < p->n; i++) {
		const struct policy_rule *r = &p->rules[i];

		fprintf(f, "line=%u uid=%u ", r->line, (unsigned)r->uid);
		if (r->has_gid)
			fprintf(f, "gid=%u ", (unsigned)r->gid);
		else
			fprintf(f, "gid=- ");
		fprintf(f, "cgroup=%s root=%s max_mounts=%u max_backing=%u allow_other=%d\n",
			r->cgroup ? r->cgroup : "-", r->root, r->max_mounts, r->max_backing,
			r->allow_other);
	}
}

/* What NAME.in gives: the dump, or the error line; checks the error contract. */
static char *
run_golden(const char *name, const char *text, size_t len)
{
	struct policy *p = (struct policy *)&p; /* not NULL: must be reset */
	char err[512], *out = NULL;
	size_t outlen = 0;
	FILE *f = open_memstream(&out, &outlen);
	int r;

	cr_assert(f);
	memset(err, 'x', sizeof(err));
	r = policy_parse(text, len, name, &p, err, sizeof(err));
	if (r == 0) {
		cr_expect_not_null(p, "%s", name);
		cr_expect_str_empty(err, "%s", name);
		dump(f, p);
		policy_free(p);
	} else {
		cr_expect_eq(r, -EINVAL, "%s: %d", name, r);
		cr_expect_null(p, "%s: half a policy left behind", name);
		cr_expect(strncmp(err, name, strlen(name)) == 0 && err[strlen(name)] == ':',
			  "%s: error does not start with the name: %s", name, err);
		fprintf(f, "%s\n", err);
	}
	fclose(f);
	return out;
}

static int
cmp_names(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

Test(policy, golden_files)
{
	DIR *d = opendir(GOLDEN_DIR);
	struct dirent *de;
	char **names = NULL;
	size_t n = 0, nok = 0, nerr = 0;
	int update = getenv("POLICY_GOLDEN_UPDATE") != NULL;

	cr_assert(d, "%s: %s", GOLDEN_DIR, strerror(errno));
	while ((de = readdir(d))) {
		size_t l = strlen(de->d_name);

		if (l > 3 && strcmp(de->d_name + l - 3, ".in") == 0) {
			names = realloc(names, (n + 1) * sizeof(*names));
			cr_assert(names);
			names[n++] = strdup(de->d_name);
		}
	}
	closedir(d);
	qsort(names, n, sizeof(*names), cmp_names);
	for (size_t i = 0; i < n; i++) {
		char in[PATH_MAX], ok[PATH_MAX], *text, *want, *got;
		size_t len, wlen;

		snprintf(in, sizeof(in), "%s/%s", GOLDEN_DIR, names[i]);
		snprintf(ok, sizeof(ok), "%.*s.ok", (int)strlen(in) - 3, in);
		text = slurp(in, &len);
		cr_assert(text, "%s: %s", in, strerror(errno));
		got = run_golden(names[i], text, len);
		if (update) {
			FILE *f = fopen(ok, "wb");

			cr_assert(f, "%s: %s", ok, strerror(errno));
			fputs(got, f);
			cr_assert_eq(fclose(f), 0);
		}
		want = slurp(ok, &wlen);
		cr_expect(want, "%s: missing (POLICY_GOLDEN_UPDATE=1 writes it)", ok);
		if (want) {
			cr_expect_str_eq(got, want, "%s:\n--- got\n%s--- want\n%s", names[i], got, want);
			if (strncmp(want, "line=", 5) == 0 || want[0] == '\0')
				nok++;
			else
				nerr++;
		}
		free(text);
		free(want);
		free(got);
		free(names[i]);
	}
	free(names);
	/* A golden directory that went missing or half empty is a failure too. */
	cr_expect_geq(nok, 10, "only %zu valid golden files", nok);
	cr_expect_geq(nerr, 40, "only %zu invalid golden files", nerr);
}

static struct policy *
parse_ok(const char *text)
{
	struct policy *p = NULL;
	char err[256];
	int r = policy_parse(text, strlen(text), "t", &p, err, sizeof(err));

	cr_assert_eq(r, 0, "%s", err);
	cr_assert_not_null(p);
	return p;
}

/* Parses text[0..len) expecting an error; returns it. */
static const char *
parse_bad(const char *text, size_t len)
{
	static char err[512];
	struct policy *p = NULL;
	int r = policy_parse(text, len, "t", &p, err, sizeof(err));

	cr_assert_eq(r, -EINVAL, "accepted (%d)", r);
	cr_assert_null(p);
	return err;
}

Test(policy, defaults)
{
	struct policy *p = parse_ok("allow uid=7 root=/srv");

	cr_assert_eq(p->n, 1);
	cr_assert_eq(p->rules[0].uid, 7);
	cr_assert_eq(p->rules[0].has_gid, 0);
	cr_assert_null(p->rules[0].cgroup);
	cr_assert_str_eq(p->rules[0].root, "/srv");
	cr_assert_eq(p->rules[0].max_mounts, POLICY_DEFAULT_MAX_MOUNTS);
	cr_assert_eq(p->rules[0].max_backing, POLICY_DEFAULT_MAX_BACKING);
	cr_assert_eq(p->rules[0].allow_other, 0);
	cr_assert_eq(p->rules[0].line, 1);
	policy_free(p);
}

Test(policy, empty_and_null)
{
	struct policy *p = NULL;
	char err[128] = "junk";

	cr_assert_eq(policy_parse(NULL, 0, "t", &p, err, sizeof(err)), 0);
	cr_assert_eq(p->n, 0);
	cr_assert_null(p->rules);
	cr_assert_str_empty(err);
	cr_assert_null(policy_match(p, 0, 0, NULL));
	policy_free(p);
	policy_free(NULL);
	cr_assert_null(policy_match(NULL, 0, 0, "/"));
	/* No error buffer at all: still refused, nothing written. */
	cr_assert_eq(policy_parse("bogus", 5, "t", &p, NULL, 0), -EINVAL);
	cr_assert_null(p);
	cr_assert_eq(policy_parse("bogus", 5, NULL, &p, err, sizeof(err)), -EINVAL);
	cr_assert_str_eq(err, "(policy):1: unknown directive \"bogus\" (a rule starts with \"allow\")");
}

Test(policy, error_truncated_to_errlen)
{
	struct policy *p = NULL;
	char err[12];

	memset(err, 'x', sizeof(err));
	cr_assert_eq(policy_parse("allow x=1", 9, "policy.conf", &p, err, sizeof(err)), -EINVAL);
	cr_assert_str_eq(err, "policy.conf");
	memset(err, 'x', sizeof(err));
	cr_assert_eq(policy_parse("allow x=1", 9, "p", &p, err, 1), -EINVAL);
	cr_assert_eq(err[0], '\0');
	cr_assert_eq(err[1], 'x');
}

Test(policy, not_nul_terminated)
{
	/* The parser reads len bytes and no more: ASan catches a read past them. */
	const char src[] = "allow uid=1 root=/a";
	char *t = malloc(sizeof(src) - 1);
	struct policy *p = NULL;
	char err[128];

	memcpy(t, src, sizeof(src) - 1);
	cr_assert_eq(policy_parse(t, sizeof(src) - 1, "t", &p, err, sizeof(err)), 0, "%s", err);
	cr_assert_str_eq(p->rules[0].root, "/a");
	policy_free(p);
	/* Cut short inside the value: it is what was given. */
	cr_assert_eq(policy_parse(t, sizeof(src) - 2, "t", &p, err, sizeof(err)), -EINVAL);
	cr_assert_str_eq(err, "t:1: root \"/\" is too broad: name the directory mounts go beneath");
	free(t);
}

/* A buffer of n copies of the NUL-terminated piece. */
static char *
repeat(const char *piece, size_t n, size_t *len)
{
	size_t pl = strlen(piece);
	char *b = malloc(pl * n + 1);

	cr_assert(b);
	for (size_t i = 0; i < n; i++)
		memcpy(b + i * pl, piece, pl);
	b[pl * n] = '\0';
	*len = pl * n;
	return b;
}

Test(policy, size_limit)
{
	char line[129], *b;
	size_t len;
	struct policy *p = NULL;
	char err[256];

	/* Exactly 1 MiB of comments is fine; one byte more is not. */
	memset(line, ' ', sizeof(line));
	line[0] = '#';
	line[127] = '\n';
	line[128] = '\0';
	b = repeat(line, 8192, &len);
	cr_assert_eq(len, 1024 * 1024);
	cr_assert_eq(policy_parse(b, len, "t", &p, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(p->n, 0);
	policy_free(p);
	b = realloc(b, len + 1);
	b[len] = '\n';
	cr_assert_str_eq(parse_bad(b, len + 1), "t: larger than 1048576 bytes");
	free(b);
}

Test(policy, line_limits)
{
	char *b;
	size_t len;

	b = repeat("\n", 65536, &len);
	policy_free(parse_ok(b));
	free(b);
	b = repeat("\r\n", 65537, &len);
	cr_assert_str_eq(parse_bad(b, len), "t:65537: more than 65536 lines");
	free(b);
	/* No newline at the end: the last line still counts. */
	b = repeat("\n", 65536, &len);
	b = realloc(b, len + 2);
	memcpy(b + len, "#", 2);
	cr_assert_str_eq(parse_bad(b, len + 1), "t:65537: more than 65536 lines");
	free(b);

	/* 8192 bytes is a line; 8193 is too long, CR or not. */
	b = repeat(" ", 8193, &len);
	b[0] = '#';
	cr_assert_str_eq(parse_bad(b, len), "t:1: line longer than 8192 bytes");
	b[8192] = '\r';
	policy_free(parse_ok(b));
	free(b);
}

Test(policy, path_limit)
{
	char *b, *line;
	size_t len;

	b = repeat("a", PATH_MAX - 2, &len); /* "/" + this: PATH_MAX - 1 bytes */
	cr_assert_eq(asprintf(&line, "allow uid=1 root=/%s\nallow uid=1 root=/a cgroup=/%s", b, b),
		     (int)strlen(line));
	policy_free(parse_ok(line));
	free(line);
	cr_assert_eq(asprintf(&line, "allow uid=1 root=/a cgroup=/%sa", b), (int)strlen(line));
	cr_assert(strstr(parse_bad(line, strlen(line)), "...\" is too long"));
	free(line);
	cr_assert_eq(asprintf(&line, "allow uid=1 root=/%sa", b), (int)strlen(line));
	cr_assert(strstr(parse_bad(line, strlen(line)), "...\" is too long"), "%s",
		  parse_bad(line, strlen(line)));
	free(line);
	free(b);
}

Test(policy, rule_limit)
{
	char *b, *e;
	size_t len;
	struct policy *p;

	b = repeat("allow uid=1 root=/a\n", 4096, &len);
	p = parse_ok(b);
	cr_assert_eq(p->n, 4096);
	cr_assert_eq(p->rules[4095].line, 4096);
	policy_free(p);
	b = realloc(b, len + 32);
	strcpy(b + len, "# fine\nallow uid=2 root=/b\n");
	e = (char *)parse_bad(b, strlen(b));
	cr_assert_str_eq(e, "t:4098: more than 4096 rules");
	free(b);
}

Test(policy, every_byte_on_a_line)
{
	/* Every byte value inside a value: only controls and a word break are refused. */
	for (int c = 0; c < 256; c++) {
		char t[] = "allow uid=1 root=/aXb";
		struct policy *p = NULL;
		char err[256];
		int r;

		t[sizeof(t) - 3] = (char)c;
		r = policy_parse(t, sizeof(t) - 1, "t", &p, err, sizeof(err));
		if (c < 0x20 || c == 0x7f || c == ' ')
			cr_expect_eq(r, -EINVAL, "byte 0x%02x accepted", c);
		else
			cr_expect_eq(r, 0, "byte 0x%02x: %s", c, err);
		policy_free(p);
	}
}

/* Writes text to a new file in a new temporary directory; returns its path. */
static char *
tmpfile_with(const char *text, size_t len, char *dir)
{
	char *path;
	FILE *f;

	strcpy(dir, "/tmp/ferry-policy-XXXXXX");
	cr_assert(mkdtemp(dir));
	cr_assert_gt(asprintf(&path, "%s/policy.conf", dir), 0);
	f = fopen(path, "wb");
	cr_assert(f);
	cr_assert_eq(fwrite(text, 1, len, f), len);
	cr_assert_eq(fclose(f), 0);
	return path;
}

Test(policy, load_golden_matches_parse)
{
	struct policy *p = NULL;
	char err[256] = "junk";

	cr_assert_eq(policy_load(GOLDEN_DIR "/example.in", &p, err, sizeof(err)), 0, "%s", err);
	cr_assert_str_empty(err);
	cr_assert_eq(p->n, 2);
	cr_assert_str_eq(p->rules[1].cgroup, "/kubepods/pod1234");
	policy_free(p);
	cr_assert_eq(policy_load(GOLDEN_DIR "/unknown_key.in", &p, err, sizeof(err)), -EINVAL);
	cr_assert_null(p);
	cr_assert_str_eq(err, GOLDEN_DIR "/unknown_key.in:3: unknown key \"maxmounts\"");
}

Test(policy, load_missing_file)
{
	struct policy *p = (struct policy *)&p;
	char err[256], want[256];

	cr_assert_eq(policy_load("/nonexistent/ferry/policy.conf", &p, err, sizeof(err)), -ENOENT);
	cr_assert_null(p);
	snprintf(want, sizeof(want), "/nonexistent/ferry/policy.conf: %s", strerror(ENOENT));
	cr_assert_str_eq(err, want);
}

Test(policy, load_directory)
{
	struct policy *p = (struct policy *)&p;
	char err[256], want[256];

	cr_assert_eq(policy_load(GOLDEN_DIR, &p, err, sizeof(err)), -EISDIR);
	cr_assert_null(p);
	snprintf(want, sizeof(want), "%s: %s", GOLDEN_DIR, strerror(EISDIR));
	cr_assert_str_eq(err, want);
}

Test(policy, load_not_regular)
{
	struct policy *p = (struct policy *)&p;
	char err[256];

	/* A character device, and (not opened for long) nothing hangs on it. */
	cr_assert_eq(policy_load("/dev/null", &p, err, sizeof(err)), -EINVAL);
	cr_assert_null(p);
	cr_assert_str_eq(err, "/dev/null: not a regular file");
}

Test(policy, load_fifo_does_not_hang)
{
	char dir[64], *path;
	struct policy *p = NULL;
	char err[256];

	path = tmpfile_with("", 0, dir);
	cr_assert_eq(unlink(path), 0);
	cr_assert_eq(mkfifo(path, 0600), 0);
	cr_assert_eq(policy_load(path, &p, err, sizeof(err)), -EINVAL);
	cr_assert(strstr(err, ": not a regular file"), "%s", err);
	unlink(path);
	rmdir(dir);
	free(path);
}

Test(policy, load_too_big_and_no_newline)
{
	char dir[64], *path, *big, want[PATH_MAX + 64];
	size_t len;
	struct policy *p = NULL;
	char err[PATH_MAX + 64];

	path = tmpfile_with("allow uid=3 root=/x\r\nallow uid=4 root=/y", 40, dir);
	cr_assert_eq(policy_load(path, &p, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(p->n, 2);
	cr_assert_str_eq(p->rules[0].root, "/x");
	cr_assert_str_eq(p->rules[1].root, "/y");
	cr_assert_eq(p->rules[1].line, 2);
	policy_free(p);
	unlink(path);
	rmdir(dir);
	free(path);

	big = repeat("#\n", 512 * 1024 + 1, &len);
	path = tmpfile_with(big, len, dir);
	cr_assert_eq(policy_load(path, &p, err, sizeof(err)), -EINVAL);
	cr_assert_null(p);
	snprintf(want, sizeof(want), "%s: larger than 1048576 bytes", path);
	cr_assert_str_eq(err, want);
	unlink(path);
	rmdir(dir);
	free(path);
	free(big);
}

static const char match_policy[] =
	"allow uid=1000 gid=100 root=/srv/g100 max_mounts=1\n"  /* 0 */
	"allow uid=1000 cgroup=/kubepods/pod12 root=/srv/pod12\n" /* 1 */
	"allow uid=1000 root=/srv/any\n"                         /* 2 */
	"allow uid=2000 cgroup=/kubepods/pod12 gid=5 root=/srv/b\n" /* 3 */
	"allow uid=3000 cgroup=/ root=/srv/c\n"                  /* 4 */
	"allow uid=0 root=/srv/root\n";                          /* 5 */

static long
match(const struct policy *p, uid_t uid, gid_t gid, const char *cg)
{
	const struct policy_rule *r = policy_match(p, uid, gid, cg);

	return r ? r - p->rules : -1;
}

Test(policy, match_first_wins)
{
	struct policy *p = parse_ok(match_policy);

	cr_assert_eq(p->n, 6);
	/* gid 100 is caught by rule 0 whatever the cgroup. */
	cr_assert_eq(match(p, 1000, 100, "/kubepods/pod12"), 0);
	cr_assert_eq(match(p, 1000, 100, NULL), 0);
	/* Another gid falls to the cgroup rule, then to the catch-all. */
	cr_assert_eq(match(p, 1000, 101, "/kubepods/pod12"), 1);
	cr_assert_eq(match(p, 1000, 101, "/kubepods/pod12/ctr/x"), 1);
	cr_assert_eq(match(p, 1000, 101, "/kubepods/pod12/"), 1);
	cr_assert_eq(match(p, 1000, 101, "/kubepods/pod123"), 2);
	cr_assert_eq(match(p, 1000, 101, "/kubepods/pod1"), 2);
	cr_assert_eq(match(p, 1000, 101, "/kubepods"), 2);
	cr_assert_eq(match(p, 1000, 101, "/"), 2);
	cr_assert_eq(match(p, 1000, 101, ""), 2);
	cr_assert_eq(match(p, 1000, 101, NULL), 2);
	cr_assert_eq(match(p, 0, 0, NULL), 5);
	policy_free(p);
}

Test(policy, match_gid_and_cgroup_filters)
{
	struct policy *p = parse_ok(match_policy);

	/* Both filters of rule 3 must hold. */
	cr_assert_eq(match(p, 2000, 5, "/kubepods/pod12/c"), 3);
	cr_assert_eq(match(p, 2000, 6, "/kubepods/pod12/c"), -1);
	cr_assert_eq(match(p, 2000, 5, "/kubepods/pod13"), -1);
	cr_assert_eq(match(p, 2000, 5, NULL), -1);
	/* cgroup=/ takes every known cgroup, not an unknown one. */
	cr_assert_eq(match(p, 3000, 0, "/"), 4);
	cr_assert_eq(match(p, 3000, 0, "/a/b"), 4);
	cr_assert_eq(match(p, 3000, 0, NULL), -1);
	cr_assert_eq(match(p, 3000, 0, "relative/x"), -1);
	policy_free(p);
}

Test(policy, match_refuses_odd_peer_cgroups)
{
	struct policy *p = parse_ok(match_policy);

	/* Not under the rule's cgroup however it is spelt; the catch-all still applies. */
	cr_assert_eq(match(p, 1000, 1, "/kubepods/pod12/../pod13"), 2);
	cr_assert_eq(match(p, 1000, 1, "/kubepods/pod12/./x"), 2);
	cr_assert_eq(match(p, 1000, 1, "/kubepods/pod12/.."), 2);
	cr_assert_eq(match(p, 1000, 1, "kubepods/pod12"), 2);
	cr_assert_eq(match(p, 3000, 0, "/../../x"), -1);
	cr_assert_eq(match(p, 2000, 5, "/kubepods/pod12/.hidden/..x"), 3);
	policy_free(p);
}

Test(policy, match_nothing)
{
	struct policy *p = parse_ok(match_policy);

	cr_assert_eq(match(p, 1, 1, NULL), -1);
	cr_assert_eq(match(p, (uid_t)-1, (gid_t)-1, "/"), -1);
	cr_assert_eq(match(p, 65534, 65534, "/kubepods/pod12"), -1);
	policy_free(p);
}
