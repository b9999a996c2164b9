/*
 * policy: the parser of ferry-brokerd's policy file and the match of a peer
 * against it. The format is described in policy.h. Parsing is strict: the
 * file decides who may mount as whom, so anything not understood is an error
 * that names the file and line, never a guess.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "policy.h"

#define POLICY_MAX_BYTES (1024u * 1024u) /* the whole file */
#define POLICY_MAX_LINES 65536u
#define POLICY_MAX_LINE 8192u            /* bytes, without the newline */
#define POLICY_MAX_RULES 4096u
#define POLICY_MAX_PATH (PATH_MAX - 1)   /* root and cgroup values */
#define POLICY_MAX_LIMIT ((unsigned long long)INT_MAX) /* max_mounts, max_backing */
#define QUOTE_MAX 64                     /* bytes of a bad token quoted in an error */

/* A quoted, bounded piece of the input for "%s": QFMT, QARG(p, n). */
#define QFMT "\"%.*s%s\""
#define QARG(p, n) (int)((n) > QUOTE_MAX ? QUOTE_MAX : (n)), (p), ((n) > QUOTE_MAX ? "..." : "")

struct parser {
	const char *name;
	unsigned line; /* 0: not in a line (whole-file errors) */
	char *err;
	size_t errlen;
};

static int __attribute__((format(printf, 2, 3)))
perr(const struct parser *ps, const char *fmt, ...)
{
	va_list ap;
	int n;

	if (ps->err == NULL || ps->errlen == 0)
		return -EINVAL;
	if (ps->line)
		n = snprintf(ps->err, ps->errlen, "%s:%u: ", ps->name, ps->line);
	else
		n = snprintf(ps->err, ps->errlen, "%s: ", ps->name);
	if (n >= 0 && (size_t)n < ps->errlen) {
		va_start(ap, fmt);
		vsnprintf(ps->err + n, ps->errlen - (size_t)n, fmt, ap);
		va_end(ap);
	}
	return -EINVAL;
}

static int
is_space(char c)
{
	return c == ' ' || c == '\t';
}

static void
rule_clear(struct policy_rule *r)
{
	free(r->cgroup);
	free(r->root);
	memset(r, 0, sizeof(*r));
}

void
policy_free(struct policy *p)
{
	if (p == NULL)
		return;
	for (size_t i = 0; i < p->n; i++)
		rule_clear(&p->rules[i]);
	free(p->rules);
	free(p);
}

/*
 * A decimal number in v[0..n) no larger than max. Returns NULL or why not.
 * No sign, no spaces, no base prefix: "-1" and "0x10" are not numbers here.
 */
static const char *
parse_num(const char *v, size_t n, unsigned long long max, unsigned long long *out)
{
	unsigned long long x = 0;

	for (size_t i = 0; i < n; i++)
		if (v[i] < '0' || v[i] > '9')
			return "is not a decimal number";
	for (size_t i = 0; i < n; i++) {
		unsigned d = (unsigned)(v[i] - '0');

		if (x > (max - d) / 10)
			return "is out of range";
		x = x * 10 + d;
	}
	*out = x;
	return NULL;
}

/*
 * Why the absolute path v[0..n) is not in normal form, or NULL if it is:
 * starts with '/', no empty, "." or ".." component, no trailing slash. "/"
 * alone is normal; whether it is acceptable is the caller's call.
 */
static const char *
path_problem(const char *v, size_t n)
{
	size_t i = 1;

	if (n == 0 || v[0] != '/')
		return "is not an absolute path";
	if (n > POLICY_MAX_PATH)
		return "is too long";
	if (n == 1)
		return NULL;
	if (v[n - 1] == '/' && v[n - 2] != '/') /* "//" at the end is reported as such */
		return "has a trailing slash";
	while (i <= n) {
		size_t c = i;

		while (i < n && v[i] != '/')
			i++;
		if (i == c)
			return "contains \"//\"";
		if (i - c == 1 && v[c] == '.')
			return "has a \".\" component";
		if (i - c == 2 && v[c] == '.' && v[c + 1] == '.')
			return "has a \"..\" component";
		i++; /* past the '/' (or the end) */
	}
	return NULL;
}

static char *
dup_n(const char *s, size_t n)
{
	char *r = malloc(n + 1);

	if (r) {
		memcpy(r, s, n);
		r[n] = '\0';
	}
	return r;
}

enum key {
	K_UID,
	K_GID,
	K_CGROUP,
	K_ROOT,
	K_MAX_MOUNTS,
	K_MAX_BACKING,
	K_ALLOW_OTHER,
	K_COUNT
};

static const char *const key_names[K_COUNT] = {
	[K_UID] = "uid",
	[K_GID] = "gid",
	[K_CGROUP] = "cgroup",
	[K_ROOT] = "root",
	[K_MAX_MOUNTS] = "max_mounts",
	[K_MAX_BACKING] = "max_backing",
	[K_ALLOW_OTHER] = "allow_other",
};

static int
key_lookup(const char *k, size_t n)
{
	for (int i = 0; i < K_COUNT; i++)
		if (strlen(key_names[i]) == n && memcmp(key_names[i], k, n) == 0)
			return i;
	return -1;
}

/* uid and gid: 0 .. (id_t)-1 - 1; (uid_t)-1 means "no change" to the kernel. */
static int
parse_id(const struct parser *ps, const char *key, const char *v, size_t n, unsigned *out)
{
	const unsigned long long none = (unsigned long long)(uid_t)-1;
	unsigned long long x;
	const char *why;

	_Static_assert(sizeof(uid_t) == sizeof(unsigned) && sizeof(gid_t) == sizeof(unsigned) &&
			       (uid_t)-1 > 0 && (gid_t)-1 > 0,
		       "uid_t and gid_t are unsigned int");
	why = parse_num(v, n, none, &x);
	if (why)
		return perr(ps, "%s " QFMT " %s (want 0 to %llu)", key, QARG(v, n), why, none - 1);
	if (x == none)
		return perr(ps, "%s %llu is (%s_t)-1, which names no one", key, x, key);
	*out = (unsigned)x;
	return 0;
}

/* One token key=value of an allow line into r; seen is the set of keys so far. */
static int
parse_pair(const struct parser *ps, const char *t, size_t n, struct policy_rule *r,
	   unsigned *seen)
{
	const char *eq = memchr(t, '=', n), *v, *why;
	unsigned long long x;
	size_t kn, vn;
	int k;

	if (eq == NULL)
		return perr(ps, QFMT ": expected key=value (no spaces around \"=\")", QARG(t, n));
	kn = (size_t)(eq - t);
	v = eq + 1;
	vn = n - kn - 1;
	if (kn == 0)
		return perr(ps, QFMT ": expected key=value, the key is missing", QARG(t, n));
	k = key_lookup(t, kn);
	if (k < 0)
		return perr(ps, "unknown key " QFMT, QARG(t, kn));
	if (*seen & (1u << k))
		return perr(ps, "key \"%s\" given twice", key_names[k]);
	*seen |= 1u << k;
	if (vn == 0)
		return perr(ps, "key \"%s\" has an empty value", key_names[k]);

	switch ((enum key)k) {
	case K_UID:
		return parse_id(ps, "uid", v, vn, &r->uid);
	case K_GID:
		r->has_gid = 1;
		return parse_id(ps, "gid", v, vn, &r->gid);
	case K_CGROUP:
		why = path_problem(v, vn);
		if (why)
			return perr(ps, "cgroup " QFMT " %s", QARG(v, vn), why);
		r->cgroup = dup_n(v, vn);
		return r->cgroup ? 0 : -ENOMEM;
	case K_ROOT:
		why = path_problem(v, vn);
		if (why)
			return perr(ps, "root " QFMT " %s", QARG(v, vn), why);
		if (vn == 1)
			return perr(ps, "root \"/\" is too broad: name the directory mounts go beneath");
		r->root = dup_n(v, vn);
		return r->root ? 0 : -ENOMEM;
	case K_MAX_MOUNTS:
	case K_MAX_BACKING:
		why = parse_num(v, vn, POLICY_MAX_LIMIT, &x);
		if (why)
			return perr(ps, "%s " QFMT " %s (want 0 to %llu)", key_names[k], QARG(v, vn),
				    why, POLICY_MAX_LIMIT);
		if (k == K_MAX_MOUNTS)
			r->max_mounts = (unsigned)x;
		else
			r->max_backing = (unsigned)x;
		return 0;
	case K_ALLOW_OTHER:
		if (vn != 1 || (v[0] != '0' && v[0] != '1'))
			return perr(ps, "allow_other " QFMT " is not 0 or 1", QARG(v, vn));
		r->allow_other = v[0] == '1';
		return 0;
	case K_COUNT:
		break;
	}
	return perr(ps, "internal error: key %d", k);
}

static int
append_rule(struct policy *p, size_t *cap, struct policy_rule *r)
{
	if (p->n == *cap) {
		size_t ncap = *cap ? *cap * 2 : 8;
		struct policy_rule *nr = realloc(p->rules, ncap * sizeof(*nr));

		if (nr == NULL)
			return -ENOMEM;
		p->rules = nr;
		*cap = ncap;
	}
	p->rules[p->n++] = *r; /* the policy owns r's strings now */
	memset(r, 0, sizeof(*r));
	return 0;
}

/* One line s[0..n), without its newline (or CRLF). */
static int
parse_line(const struct parser *ps, const char *s, size_t n, struct policy *p, size_t *cap)
{
	struct policy_rule r = { 0 };
	unsigned seen = 0;
	size_t i = 0, t;
	int ret;

	for (size_t j = 0; j < n; j++) {
		unsigned char c = (unsigned char)s[j];

		if (c == '\0')
			return perr(ps, "NUL byte in column %zu (a policy is plain text)", j + 1);
		if ((c < 0x20 && c != '\t') || c == 0x7f)
			return perr(ps, "control character 0x%02x in column %zu", c, j + 1);
	}
	while (i < n && is_space(s[i]))
		i++;
	if (i == n || s[i] == '#')
		return 0;
	if (ps->line == 1 && n >= 3 && memcmp(s, "\xef\xbb\xbf", 3) == 0)
		return perr(ps, "the file starts with a UTF-8 byte order mark; save it without");
	t = i;
	while (i < n && !is_space(s[i]))
		i++;
	if (i - t != 5 || memcmp(s + t, "allow", 5) != 0)
		return perr(ps, "unknown directive " QFMT " (a rule starts with \"allow\")",
			    QARG(s + t, i - t));
	if (p->n >= POLICY_MAX_RULES)
		return perr(ps, "more than %u rules", POLICY_MAX_RULES);

	r.max_mounts = POLICY_DEFAULT_MAX_MOUNTS;
	r.max_backing = POLICY_DEFAULT_MAX_BACKING;
	r.line = ps->line;
	for (;;) {
		while (i < n && is_space(s[i]))
			i++;
		if (i == n || s[i] == '#') /* a comment runs to the end of the line */
			break;
		t = i;
		while (i < n && !is_space(s[i]))
			i++;
		ret = parse_pair(ps, s + t, i - t, &r, &seen);
		if (ret < 0)
			goto out;
	}
	if (!(seen & (1u << K_UID))) {
		ret = perr(ps, "missing required key \"uid\"");
		goto out;
	}
	if (!(seen & (1u << K_ROOT))) {
		ret = perr(ps, "missing required key \"root\"");
		goto out;
	}
	ret = append_rule(p, cap, &r);
out:
	rule_clear(&r);
	return ret;
}

int
policy_parse(const char *text, size_t len, const char *name, struct policy **out, char *err,
	     size_t errlen)
{
	struct parser ps = { name ? name : "(policy)", 0, err, errlen };
	struct policy *p = NULL;
	size_t cap = 0, pos = 0;
	int ret;

	if (err && errlen)
		err[0] = '\0';
	if (out == NULL)
		return perr(&ps, "no place for the result");
	*out = NULL;
	if (text == NULL && len > 0)
		return perr(&ps, "no text");
	if (len > POLICY_MAX_BYTES)
		return perr(&ps, "larger than %u bytes", POLICY_MAX_BYTES);
	p = calloc(1, sizeof(*p));
	if (p == NULL) {
		ret = -ENOMEM;
		goto out;
	}
	while (pos < len) {
		const char *s = text + pos, *nl = memchr(s, '\n', len - pos);
		size_t n = nl ? (size_t)(nl - s) : len - pos;

		pos += n + (nl != NULL);
		ps.line++;
		if (ps.line > POLICY_MAX_LINES) {
			ret = perr(&ps, "more than %u lines", POLICY_MAX_LINES);
			goto out;
		}
		if (n > 0 && s[n - 1] == '\r') /* CRLF */
			n--;
		if (n > POLICY_MAX_LINE) {
			ret = perr(&ps, "line longer than %u bytes", POLICY_MAX_LINE);
			goto out;
		}
		ret = parse_line(&ps, s, n, p, &cap);
		if (ret < 0)
			goto out;
	}
	*out = p;
	p = NULL;
	ret = 0;
out:
	if (ret == -ENOMEM)
		perr(&ps, "out of memory");
	policy_free(p);
	return ret;
}

int
policy_load(const char *path, struct policy **out, char *err, size_t errlen)
{
	struct parser ps = { path ? path : "(policy)", 0, err, errlen };
	char *buf = NULL;
	size_t len = 0;
	struct stat st;
	int fd = -1, ret;

	if (err && errlen)
		err[0] = '\0';
	if (out == NULL || path == NULL)
		return perr(&ps, "no path or no place for the result");
	*out = NULL;
	/* O_NONBLOCK: a FIFO put in the policy's place must not hang the broker. */
	fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
	if (fd < 0 || fstat(fd, &st) < 0) {
		ret = -errno;
		goto fail;
	}
	if (S_ISDIR(st.st_mode)) {
		ret = -EISDIR;
		goto fail;
	}
	if (!S_ISREG(st.st_mode)) {
		ret = perr(&ps, "not a regular file");
		goto out;
	}
	if (st.st_size > (off_t)POLICY_MAX_BYTES) {
		ret = perr(&ps, "larger than %u bytes", POLICY_MAX_BYTES);
		goto out;
	}
	/* One byte more than allowed, so a file that grew is still caught. */
	buf = malloc(POLICY_MAX_BYTES + 1);
	if (buf == NULL) {
		ret = -ENOMEM;
		goto fail;
	}
	while (len < POLICY_MAX_BYTES + 1) {
		ssize_t r = read(fd, buf + len, POLICY_MAX_BYTES + 1 - len);

		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			ret = -errno;
			goto fail;
		}
		if (r == 0)
			break;
		len += (size_t)r;
	}
	ret = policy_parse(buf, len, path, out, err, errlen);
	goto out;
fail:
	perr(&ps, "%s", strerror(-ret));
out:
	free(buf);
	if (fd >= 0)
		close(fd);
	return ret;
}

/*
 * Whether the peer's cgroup is rule_cg or beneath it, on whole components.
 * A peer cgroup that is not absolute or has "." or ".." components (how
 * /proc/PID/cgroup shows a cgroup outside the reader's cgroup namespace)
 * is under nothing.
 */
static int
cgroup_under(const char *peer, const char *rule_cg)
{
	size_t n = strlen(rule_cg);

	if (rule_cg[0] == '/' && rule_cg[1] == '\0')
		return 1;
	return strncmp(peer, rule_cg, n) == 0 && (peer[n] == '\0' || peer[n] == '/');
}

static int
cgroup_plain(const char *cg)
{
	const char *c = cg;

	if (cg == NULL || cg[0] != '/')
		return 0;
	while (*c) {
		size_t len;

		while (*c == '/')
			c++;
		len = strcspn(c, "/");
		if ((len == 1 && c[0] == '.') || (len == 2 && c[0] == '.' && c[1] == '.'))
			return 0;
		c += len;
	}
	return 1;
}

const struct policy_rule *
policy_match(const struct policy *p, uid_t uid, gid_t gid, const char *cgroup)
{
	int cg_ok = cgroup_plain(cgroup);

	if (p == NULL)
		return NULL;
	for (size_t i = 0; i < p->n; i++) {
		const struct policy_rule *r = &p->rules[i];

		if (r->uid != uid)
			continue;
		if (r->has_gid && r->gid != gid)
			continue;
		if (r->cgroup && !(cg_ok && cgroup_under(cgroup, r->cgroup)))
			continue;
		return r;
	}
	return NULL;
}
