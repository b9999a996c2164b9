/*
 * aws_source: finding the chain's source and fetching from it (aws_source.h).
 * Credential services are asked over libcurl; credential_process runs
 * through /bin/sh, as the Go and Java SDKs run it.
 */
#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>

#include "aws_source.h"
#include "clock.h"

#define ANSWER_MAX (64u << 10)      /* a credentials answer is ~2 KiB */
#define TOKEN_FILE_MAX (16u << 10)  /* a Kubernetes service account token is ~1 KiB */
#define SHARED_FILE_MAX (1u << 20)
#define PROFILE_DEPTH_MAX 5         /* source_profile hops */
#define FETCH_TIMEOUT_MS 5000L
#define IMDS_TIMEOUT_MS 1000L
#define PROCESS_TIMEOUT_MS 60000L
#define IMDS_TOKEN_TTL "21600"

extern char **environ;

enum src_kind { SRC_STATIC, SRC_PROCESS, SRC_ASSUME_ROLE, SRC_WEB_IDENTITY, SRC_CONTAINER, SRC_IMDS };

struct aws_source {
	enum src_kind kind;
	char name[160];
	struct aws_fields fixed;     /* SRC_STATIC */
	char *command;               /* SRC_PROCESS */
	char *role_arn;              /* roles */
	char *session_name;
	char *external_id;           /* SRC_ASSUME_ROLE, optional */
	char *token_file;            /* SRC_WEB_IDENTITY; SRC_CONTAINER's authorization token */
	char *token;                 /* SRC_CONTAINER's token from the environment */
	struct aws_source *parent;   /* SRC_ASSUME_ROLE: whose keys sign the request */
	char *url;                   /* STS, the container endpoint, or IMDS's base */
	char *region;                /* STS's */
	long timeout_ms;
	const atomic_int *abort;     /* nonzero: give up a fetch (the provider is closing) */
};

static const char *
env(const char *name)
{
	const char *v = getenv(name);

	return v && v[0] ? v : NULL;
}

static void
source_free(struct aws_source *s)
{
	if (s == NULL)
		return;
	aws_fields_clear(&s->fixed);
	free(s->command);
	free(s->role_arn);
	free(s->session_name);
	free(s->external_id);
	free(s->token_file);
	if (s->token)
		explicit_bzero(s->token, strlen(s->token));
	free(s->token);
	source_free(s->parent);
	free(s->url);
	free(s->region);
	free(s);
}

void
aws_source_free(struct aws_source *s)
{
	source_free(s);
}

const char *
aws_source_name(const struct aws_source *s)
{
	return s->name;
}

const char *
aws_source_kind(const struct aws_source *s)
{
	switch (s->kind) {
	case SRC_STATIC:
		return s->name[0] == 'o' ? "options" : s->name[0] == 'e' ? "environment" : "profile";
	case SRC_PROCESS:
		return "credential-process";
	case SRC_ASSUME_ROLE:
		return "assume-role";
	case SRC_WEB_IDENTITY:
		return "web-identity";
	case SRC_CONTAINER:
		return "container";
	case SRC_IMDS:
		return "imds";
	}
	return "unknown";
}

void
aws_source_set_abort(struct aws_source *s, const atomic_int *flag)
{
	for (; s; s = s->parent)
		s->abort = flag;
}

static int
aborted(const struct aws_source *s)
{
	return s->abort && atomic_load(s->abort);
}

/* curl asks this every so often: nonzero ends the transfer. */
static int
on_progress(void *ud, curl_off_t dt, curl_off_t dn, curl_off_t ut, curl_off_t un)
{
	(void)dt, (void)dn, (void)ut, (void)un;
	return aborted(ud);
}

int
aws_source_is_fallback(const struct aws_source *s)
{
	return s->kind == SRC_IMDS;
}

static struct aws_source *
source_new(enum src_kind kind, const struct aws_creds_opts *o, long default_timeout_ms)
{
	struct aws_source *s = calloc(1, sizeof(*s));

	if (s == NULL)
		return NULL;
	s->kind = kind;
	s->timeout_ms = o->timeout_ms > 0 ? o->timeout_ms : default_timeout_ms;
	return s;
}

/* Puts the source's name in front of a parser's reason. */
static void
name_err(const struct aws_source *s, char *err, size_t errlen)
{
	char why[200];

	snprintf(why, sizeof(why), "%s", err);
	snprintf(err, errlen, "%s: %s", s->name, why);
}

/* Reads a small file whole (NUL-terminated). 0, -ENOENT, -EFBIG, or another negative errno. */
static int
read_small(const char *path, size_t max, char **out, size_t *lenp)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC), ret;
	size_t len = 0;
	char *buf = NULL;
	ssize_t n;

	*out = NULL;
	if (fd < 0)
		return -errno;
	buf = malloc(max + 1);
	if (buf == NULL) {
		ret = -ENOMEM;
		goto out;
	}
	while ((n = read(fd, buf + len, max + 1 - len)) > 0) {
		len += (size_t)n;
		if (len > max) {
			ret = -EFBIG;
			goto out;
		}
	}
	if (n < 0) {
		ret = -errno;
		goto out;
	}
	buf[len] = '\0';
	*out = buf;
	buf = NULL;
	if (lenp)
		*lenp = len;
	ret = 0;
out:
	if (buf) {
		explicit_bzero(buf, max + 1);
		free(buf);
	}
	close(fd);
	return ret;
}

/* "~/x" and a relative "x" as the SDKs read them: from $HOME and the working directory. */
static char *
expand_home(const char *path)
{
	char *out = NULL;
	const char *home = env("HOME");

	if (path[0] == '~' && path[1] == '/' && home) {
		if (asprintf(&out, "%s%s", home, path + 1) < 0)
			return NULL;
		return out;
	}
	return strdup(path);
}

/* A token read from a file: the file's text without the white space around it. */
static int
read_token(const char *path, char **out, char *err, size_t errlen, const char *what)
{
	size_t len = 0, a = 0;
	char *t = NULL;
	int ret = read_small(path, TOKEN_FILE_MAX, &t, &len);

	*out = NULL;
	if (ret < 0) {
		snprintf(err, errlen, "%s: cannot read %s: %s", what, path,
			 ret == -EFBIG ? "longer than 16 KiB" : strerror(-ret));
		return ret == -ENOMEM ? ret : -EIO;
	}
	while (len && isspace((unsigned char)t[len - 1]))
		t[--len] = '\0';
	while (a < len && isspace((unsigned char)t[a]))
		a++;
	for (size_t i = a; i < len; i++) {
		if ((unsigned char)t[i] < ' ' || (unsigned char)t[i] >= 127) {
			snprintf(err, errlen, "%s: %s holds a control byte", what, path);
			explicit_bzero(t, len);
			free(t);
			return -EINVAL;
		}
	}
	if (a == len) {
		snprintf(err, errlen, "%s: %s is empty", what, path);
		free(t);
		return -EINVAL;
	}
	memmove(t, t + a, len - a + 1);
	*out = t;
	return 0;
}

/* ---- HTTP ---- */

/* Frees a header list whose lines may hold a token, wiping them first. */
static void
slist_wipe_free(struct curl_slist *l)
{
	for (struct curl_slist *e = l; e; e = e->next)
		explicit_bzero(e->data, strlen(e->data));
	curl_slist_free_all(l);
}

struct answer {
	char *body;  /* NUL-terminated; owner: the caller */
	size_t len;
	int too_long;
	long status;
};

static size_t
on_answer(char *buf, size_t size, size_t nmemb, void *ud)
{
	struct answer *a = ud;
	size_t n = size * nmemb;

	if (a->len + n > ANSWER_MAX) {
		a->too_long = 1;
		return 0;
	}
	/* One buffer of the cap, never realloc'ed: no copy of a secret left behind. */
	if (a->body == NULL && (a->body = malloc(ANSWER_MAX + 1)) == NULL)
		return 0;
	memcpy(a->body + a->len, buf, n);
	a->len += n;
	a->body[a->len] = '\0';
	return n;
}

static void
answer_clear(struct answer *a)
{
	if (a->body) {
		explicit_bzero(a->body, a->len);
		free(a->body);
	}
	memset(a, 0, sizeof(*a));
}

/*
 * One exchange. post: a form body (POST), else a GET, or a PUT when put.
 * signer: SigV4 for service "sts" with these keys. The answer's body is
 * capped (a service that sends more is broken or hostile).
 */
static int
http_exchange(struct aws_source *s, const char *url, int put, const char *post,
	      struct curl_slist *hdrs, const struct aws_fields *signer, struct answer *a,
	      char *err, size_t errlen, const char *what)
{
	char sigv4[96];
	CURLcode rc;
	CURL *h;
	int ret = 0;

	memset(a, 0, sizeof(*a));
	h = curl_easy_init();
	if (h == NULL)
		return -ENOMEM;
	curl_easy_setopt(h, CURLOPT_URL, url);
	curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
	curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, s->timeout_ms);
	curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, s->timeout_ms);
	curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_answer);
	curl_easy_setopt(h, CURLOPT_WRITEDATA, a);
	curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);
	curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, on_progress);
	curl_easy_setopt(h, CURLOPT_XFERINFODATA, s);
	curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
	/* The container endpoint and IMDS are on this node (link-local or
	 * loopback): never through a proxy the environment names. STS is on the
	 * internet and goes the way the environment says (https_proxy). */
	if (s->kind == SRC_CONTAINER || s->kind == SRC_IMDS)
		curl_easy_setopt(h, CURLOPT_NOPROXY, "*");
	if (env("AWS_CA_BUNDLE"))
		curl_easy_setopt(h, CURLOPT_CAINFO, env("AWS_CA_BUNDLE"));
	if (put) {
		curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, "PUT");
		curl_easy_setopt(h, CURLOPT_POSTFIELDS, "");
	} else if (post) {
		curl_easy_setopt(h, CURLOPT_POSTFIELDS, post);
	}
	if (signer) {
		snprintf(sigv4, sizeof(sigv4), "aws:amz:%s:sts", s->region);
		curl_easy_setopt(h, CURLOPT_AWS_SIGV4, sigv4);
		curl_easy_setopt(h, CURLOPT_USERNAME, signer->access_key);
		curl_easy_setopt(h, CURLOPT_PASSWORD, signer->secret_key);
	}
	rc = curl_easy_perform(h);
	if (rc != CURLE_OK) {
		if (a->too_long)
			snprintf(err, errlen, "%s: %s answered more than 64 KiB", what, url);
		else if (rc == CURLE_ABORTED_BY_CALLBACK)
			snprintf(err, errlen, "%s: given up (closing)", what);
		else
			snprintf(err, errlen, "%s: %s: %s", what, url, curl_easy_strerror(rc));
		ret = a->too_long ? -EIO : rc == CURLE_WRITE_ERROR ? -ENOMEM : -EIO;
		if (rc == CURLE_OPERATION_TIMEDOUT)
			ret = -ETIMEDOUT;
		answer_clear(a);
		goto out;
	}
	curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &a->status);
	if (a->body == NULL && (a->body = strdup("")) == NULL)
		ret = -ENOMEM;
out:
	curl_easy_cleanup(h);
	return ret;
}

/* "&name=value" with value URL-encoded, appended to *form. */
static int
form_add(char **form, const char *name, const char *value)
{
	char *enc = curl_easy_escape(NULL, value, 0), *n = NULL;
	int ret = -ENOMEM;

	if (enc == NULL)
		return -ENOMEM;
	if (asprintf(&n, "%s%s%s=%s", *form ? *form : "", *form ? "&" : "", name, enc) >= 0) {
		if (*form)
			explicit_bzero(*form, strlen(*form));
		free(*form);
		*form = n;
		ret = 0;
	}
	explicit_bzero(enc, strlen(enc));
	curl_free(enc);
	return ret;
}

static int
sts_call(struct aws_source *s, const char *form, const struct aws_fields *signer,
	 struct aws_fields *f, char *err, size_t errlen)
{
	struct curl_slist *hdrs = NULL, *n;
	struct answer a;
	char *tok = NULL;
	int ret;

	if (signer && signer->session_token) {
		if (asprintf(&tok, "x-amz-security-token: %s", signer->session_token) < 0)
			return -ENOMEM;
		n = curl_slist_append(hdrs, tok);
		explicit_bzero(tok, strlen(tok));
		free(tok);
		if (n == NULL)
			return -ENOMEM;
		hdrs = n;
	}
	ret = http_exchange(s, s->url, 0, form, hdrs, signer, &a, err, errlen, s->name);
	slist_wipe_free(hdrs);
	if (ret < 0)
		return ret;
	ret = aws_parse_sts_xml(a.body, a.len, f, err, errlen);
	if (ret == 0 && a.status != 200) {
		aws_fields_clear(f);
		ret = -EIO;
	}
	if (ret == -EINVAL && a.status != 200) {
		snprintf(err, errlen, "%s: %s answered HTTP %ld", s->name, s->url, a.status);
		ret = a.status == 403 ? -EACCES : -EIO;
	} else if (ret == -EACCES) {
		/* err holds STS's code; say who asked. */
		name_err(s, err, errlen);
	} else if (ret == -EINVAL) {
		name_err(s, err, errlen);
		ret = -EIO;
	}
	answer_clear(&a);
	return ret;
}

static int
web_identity_fetch(struct aws_source *s, struct aws_fields *f, char *err, size_t errlen)
{
	char *token = NULL, *form = NULL;
	int ret;

	ret = read_token(s->token_file, &token, err, errlen, s->name);
	if (ret < 0)
		return ret;
	ret = form_add(&form, "Action", "AssumeRoleWithWebIdentity");
	if (ret == 0)
		ret = form_add(&form, "Version", "2011-06-15");
	if (ret == 0)
		ret = form_add(&form, "RoleArn", s->role_arn);
	if (ret == 0)
		ret = form_add(&form, "RoleSessionName", s->session_name);
	if (ret == 0)
		ret = form_add(&form, "WebIdentityToken", token);
	if (ret == 0)
		ret = sts_call(s, form, NULL, f, err, errlen);
	explicit_bzero(token, strlen(token));
	free(token);
	if (form)
		explicit_bzero(form, strlen(form));
	free(form);
	return ret;
}

static int
assume_role_fetch(struct aws_source *s, struct aws_fields *f, char *err, size_t errlen)
{
	struct aws_fields src = { 0 };
	char *form = NULL;
	int ret;

	ret = aws_source_fetch(s->parent, &src, err, errlen);
	if (ret < 0)
		return ret;
	ret = form_add(&form, "Action", "AssumeRole");
	if (ret == 0)
		ret = form_add(&form, "Version", "2011-06-15");
	if (ret == 0)
		ret = form_add(&form, "RoleArn", s->role_arn);
	if (ret == 0)
		ret = form_add(&form, "RoleSessionName", s->session_name);
	if (ret == 0 && s->external_id)
		ret = form_add(&form, "ExternalId", s->external_id);
	if (ret == 0)
		ret = sts_call(s, form, &src, f, err, errlen);
	free(form);
	aws_fields_clear(&src);
	return ret;
}

static int
container_fetch(struct aws_source *s, struct aws_fields *f, char *err, size_t errlen)
{
	struct curl_slist *hdrs = NULL, *n;
	char *token = NULL, *line = NULL;
	struct answer a = { 0 };
	int ret = 0;

	if (s->token_file)
		ret = read_token(s->token_file, &token, err, errlen, s->name);
	else if (s->token && (token = strdup(s->token)) == NULL)
		ret = -ENOMEM;
	if (ret < 0)
		return ret;
	if (token) {
		if (strpbrk(token, "\r\n")) {
			snprintf(err, errlen, "%s: the authorization token holds a line break", s->name);
			ret = -EINVAL;
			goto out;
		}
		if (asprintf(&line, "Authorization: %s", token) < 0) {
			line = NULL;
			ret = -ENOMEM;
			goto out;
		}
		n = curl_slist_append(NULL, line);
		if (n == NULL) {
			ret = -ENOMEM;
			goto out;
		}
		hdrs = n;
	}
	ret = http_exchange(s, s->url, 0, NULL, hdrs, NULL, &a, err, errlen, s->name);
	if (ret < 0)
		goto out;
	if (a.status != 200) {
		snprintf(err, errlen, "%s: %s answered HTTP %ld", s->name, s->url, a.status);
		ret = a.status == 401 || a.status == 403 ? -EACCES : -EIO;
		goto out;
	}
	ret = aws_parse_creds_json(a.body, a.len, f, err, errlen);
	if (ret == -EINVAL) {
		name_err(s, err, errlen);
		ret = -EIO;
	}
out:
	answer_clear(&a);
	slist_wipe_free(hdrs);
	if (line)
		explicit_bzero(line, strlen(line));
	free(line);
	if (token)
		explicit_bzero(token, strlen(token));
	free(token);
	return ret;
}

static int
imds_fetch(struct aws_source *s, struct aws_fields *f, char *err, size_t errlen)
{
	struct curl_slist *hdrs = NULL, *n;
	struct answer a = { 0 };
	char *url = NULL, *line = NULL, *role = NULL;
	int ret;

	if (asprintf(&url, "%s/latest/api/token", s->url) < 0)
		return -ENOMEM;
	n = curl_slist_append(NULL, "X-aws-ec2-metadata-token-ttl-seconds: " IMDS_TOKEN_TTL);
	if (n == NULL) {
		ret = -ENOMEM;
		goto out;
	}
	hdrs = n;
	ret = http_exchange(s, url, 1, NULL, hdrs, NULL, &a, err, errlen, s->name);
	slist_wipe_free(hdrs);
	hdrs = NULL;
	if (ret == -ETIMEDOUT) {
		snprintf(err, errlen, "%s: no answer to the token request within %ld ms (not on EC2, "
			 "or a hop limit of 1 seen from a container)", s->name, s->timeout_ms);
		ret = -EIO;
	}
	if (ret < 0)
		goto out;
	if (a.status != 200 || a.len == 0 || a.len > 1024 || strpbrk(a.body, "\r\n")) {
		snprintf(err, errlen, "%s: the token request was answered HTTP %ld%s", s->name,
			 a.status, a.status == 200 ? " with no usable token" : "");
		ret = -EIO;
		goto out;
	}
	if (asprintf(&line, "X-aws-ec2-metadata-token: %s", a.body) < 0) {
		line = NULL;
		ret = -ENOMEM;
		goto out;
	}
	answer_clear(&a);
	hdrs = curl_slist_append(NULL, line);
	if (hdrs == NULL) {
		ret = -ENOMEM;
		goto out;
	}
	free(url);
	if (asprintf(&url, "%s/latest/meta-data/iam/security-credentials/", s->url) < 0) {
		url = NULL;
		ret = -ENOMEM;
		goto out;
	}
	ret = http_exchange(s, url, 0, NULL, hdrs, NULL, &a, err, errlen, s->name);
	if (ret < 0)
		goto out;
	a.body[strcspn(a.body, "\r\n")] = '\0';
	if (a.status != 200 || a.body[0] == '\0' || strlen(a.body) > 128 ||
	    strspn(a.body, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+=,.@_-") !=
		    strlen(a.body)) {
		snprintf(err, errlen, "%s: no instance profile role (HTTP %ld)", s->name, a.status);
		ret = a.status == 404 || a.status == 200 ? -ENOENT : -EIO;
		goto out;
	}
	role = strdup(a.body);
	answer_clear(&a);
	free(url);
	url = NULL;
	if (role == NULL || asprintf(&url, "%s/latest/meta-data/iam/security-credentials/%s", s->url,
				     role) < 0) {
		url = NULL;
		ret = -ENOMEM;
		goto out;
	}
	ret = http_exchange(s, url, 0, NULL, hdrs, NULL, &a, err, errlen, s->name);
	if (ret < 0)
		goto out;
	if (a.status != 200) {
		snprintf(err, errlen, "%s: role %s answered HTTP %ld", s->name, role, a.status);
		ret = -EIO;
		goto out;
	}
	ret = aws_parse_creds_json(a.body, a.len, f, err, errlen);
	if (ret == -EINVAL) {
		name_err(s, err, errlen);
		ret = -EIO;
	}
out:
	answer_clear(&a);
	slist_wipe_free(hdrs);
	if (line)
		explicit_bzero(line, strlen(line));
	free(line);
	free(role);
	free(url);
	return ret;
}

/* Runs the profile's credential_process and reads its JSON from its standard output. */
static int
process_fetch(struct aws_source *s, struct aws_fields *f, char *err, size_t errlen)
{
	char *argv[] = { "sh", "-c", s->command, NULL };
	posix_spawn_file_actions_t fa;
	posix_spawnattr_t attr;
	sigset_t mask, deflt;
	int fds[2] = { -1, -1 }, ret, status = 0, fa_ok = 0, attr_ok = 0;
	int64_t deadline = mono_now_ns() / 1000000 + s->timeout_ms;
	char *out = NULL;
	size_t len = 0;
	pid_t pid = -1;

	if (pipe2(fds, O_CLOEXEC) < 0)
		return -errno;
	if ((ret = posix_spawn_file_actions_init(&fa)) != 0) {
		ret = -ret;
		goto out;
	}
	fa_ok = 1;
	if ((ret = posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0)) != 0 ||
	    (ret = posix_spawn_file_actions_adddup2(&fa, fds[1], 1)) != 0) {
		ret = -ret;
		goto out;
	}
	/* Its own process group: sh may fork the command rather than exec it,
	 * and a command that hangs is killed with everything it started. */
	if ((ret = posix_spawnattr_init(&attr)) != 0) {
		ret = -ret;
		goto out;
	}
	attr_ok = 1;
	/* And the signal state of a shell started from a terminal: a FUSE
	 * worker blocks signals, the daemons ignore SIGPIPE. */
	sigemptyset(&mask);
	sigfillset(&deflt);
	sigdelset(&deflt, SIGKILL);
	sigdelset(&deflt, SIGSTOP);
	if ((ret = posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK |
						   POSIX_SPAWN_SETSIGDEF)) != 0 ||
	    (ret = posix_spawnattr_setpgroup(&attr, 0)) != 0 ||
	    (ret = posix_spawnattr_setsigmask(&attr, &mask)) != 0 ||
	    (ret = posix_spawnattr_setsigdefault(&attr, &deflt)) != 0) {
		ret = -ret;
		goto out;
	}
	ret = posix_spawn(&pid, "/bin/sh", &fa, &attr, argv, environ);
	if (ret != 0) {
		snprintf(err, errlen, "%s: cannot run /bin/sh: %s", s->name, strerror(ret));
		pid = -1;
		ret = -EIO;
		goto out;
	}
	close(fds[1]);
	fds[1] = -1;
	out = malloc(ANSWER_MAX + 1);
	if (out == NULL) {
		ret = -ENOMEM;
		goto out;
	}
	for (;;) {
		struct pollfd p = { .fd = fds[0], .events = POLLIN };
		int64_t left = deadline - mono_now_ns() / 1000000;
		ssize_t n;

		if (left <= 0) {
			snprintf(err, errlen, "%s: the command did not finish within %ld ms", s->name,
				 s->timeout_ms);
			ret = -ETIMEDOUT;
			goto out;
		}
		if (aborted(s)) {
			snprintf(err, errlen, "%s: given up (closing)", s->name);
			ret = -EINTR;
			goto out;
		}
		if (poll(&p, 1, (int)(left > 100 ? 100 : left)) < 0 && errno != EINTR) {
			ret = -errno;
			goto out;
		}
		if (!(p.revents & (POLLIN | POLLHUP | POLLERR)))
			continue;
		n = read(fds[0], out + len, ANSWER_MAX + 1 - len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			ret = -errno;
			goto out;
		}
		if (n == 0)
			break;
		len += (size_t)n;
		if (len > ANSWER_MAX) {
			snprintf(err, errlen, "%s: the command printed more than 64 KiB", s->name);
			ret = -EIO;
			goto out;
		}
	}
	out[len] = '\0';
	/* Its output ended; it still has until the deadline to exit (a command
	 * that closed its stdout and went on would hold us for good). */
	for (;;) {
		pid_t w = waitpid(pid, &status, WNOHANG);

		if (w == pid)
			break;
		if (w < 0 && errno != EINTR) {
			ret = -errno;
			goto out;
		}
		if (mono_now_ns() / 1000000 >= deadline || aborted(s)) {
			snprintf(err, errlen, "%s: the command did not exit within %ld ms", s->name,
				 s->timeout_ms);
			ret = -ETIMEDOUT;
			goto out;
		}
		usleep(10 * 1000);
	}
	/* What it left running on purpose (a credential cache, say) lives on,
	 * as the SDKs leave it; only a command that failed us is killed,
	 * group and all, below. */
	pid = -1;
	if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
		if (WIFEXITED(status))
			snprintf(err, errlen, "%s: the command exited with status %d", s->name,
				 WEXITSTATUS(status));
		else
			snprintf(err, errlen, "%s: the command was killed by signal %d", s->name,
				 WTERMSIG(status));
		ret = -EIO;
		goto out;
	}
	while (len && isspace((unsigned char)out[len - 1]))
		out[--len] = '\0';
	ret = aws_parse_creds_json(out, len, f, err, errlen);
	if (ret == -EINVAL) {
		name_err(s, err, errlen);
	}
out:
	if (pid > 0) {
		kill(-pid, SIGKILL);
		while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
			;
	}
	if (fa_ok)
		posix_spawn_file_actions_destroy(&fa);
	if (attr_ok)
		posix_spawnattr_destroy(&attr);
	if (fds[0] >= 0)
		close(fds[0]);
	if (fds[1] >= 0)
		close(fds[1]);
	if (out) {
		explicit_bzero(out, ANSWER_MAX + 1);
		free(out);
	}
	return ret;
}

int
aws_source_fetch(struct aws_source *s, struct aws_fields *f, char *err, size_t errlen)
{
	memset(f, 0, sizeof(*f));
	switch (s->kind) {
	case SRC_STATIC:
		f->access_key = strdup(s->fixed.access_key);
		f->secret_key = strdup(s->fixed.secret_key);
		f->session_token = s->fixed.session_token ? strdup(s->fixed.session_token) : NULL;
		if (!f->access_key || !f->secret_key || (s->fixed.session_token && !f->session_token)) {
			aws_fields_clear(f);
			return -ENOMEM;
		}
		return 0;
	case SRC_PROCESS:
		return process_fetch(s, f, err, errlen);
	case SRC_ASSUME_ROLE:
		return assume_role_fetch(s, f, err, errlen);
	case SRC_WEB_IDENTITY:
		return web_identity_fetch(s, f, err, errlen);
	case SRC_CONTAINER:
		return container_fetch(s, f, err, errlen);
	case SRC_IMDS:
		return imds_fetch(s, f, err, errlen);
	}
	return -EINVAL;
}

/* ---- finding the source ---- */

struct shared_files {
	char *cred_path, *conf_path; /* expanded */
	char *cred, *conf;           /* their text; "" when missing */
};

static void
shared_files_free(struct shared_files *sf)
{
	free(sf->cred_path);
	free(sf->conf_path);
	if (sf->cred)
		explicit_bzero(sf->cred, strlen(sf->cred));
	if (sf->conf)
		explicit_bzero(sf->conf, strlen(sf->conf));
	free(sf->cred);
	free(sf->conf);
}

static int
shared_file_load(const char *env_name, const char *home_rel, char **path, char **text, char *err,
		 size_t errlen)
{
	const char *p = env(env_name), *home = env("HOME");
	int ret;

	*text = NULL;
	if (p)
		*path = expand_home(p);
	else if (home && asprintf(path, "%s/%s", home, home_rel) < 0)
		*path = NULL;
	else if (!home)
		*path = strdup("");
	if (*path == NULL)
		return -ENOMEM;
	ret = (*path)[0] ? read_small(*path, SHARED_FILE_MAX, text, NULL) : -ENOENT;
	if (ret == -ENOENT || ret == -ENOTDIR) {
		*text = strdup("");
		return *text ? 0 : -ENOMEM;
	}
	if (ret < 0)
		snprintf(err, errlen, "cannot read %s: %s", *path,
			 ret == -EFBIG ? "longer than 1 MiB" : strerror(-ret));
	return ret == -ENOMEM ? ret : ret < 0 ? -EINVAL : 0;
}

/* key of profile: the credentials file first, as the SDKs read it, then the config file. */
static int
profile_get(const struct shared_files *sf, const char *profile, const char *key, char **out)
{
	char section[160];
	int ret = aws_ini_get(sf->cred, profile, key, out);

	if (ret != -ENOENT)
		return ret;
	if (strcmp(profile, "default") == 0) {
		ret = aws_ini_get(sf->conf, "default", key, out);
		if (ret != -ENOENT)
			return ret;
	}
	snprintf(section, sizeof(section), "profile %s", profile);
	return aws_ini_get(sf->conf, section, key, out);
}

static int
profile_exists(const struct shared_files *sf, const char *profile)
{
	char section[160];

	snprintf(section, sizeof(section), "profile %s", profile);
	/* A section with nothing in it is still a profile: look for its header. */
	for (int i = 0; i < 3; i++) {
		const char *text = i == 0 ? sf->cred : sf->conf;
		const char *sec = i == 0 ? profile : i == 1 ? section : "default";
		size_t n = strlen(sec);

		if (i == 2 && strcmp(profile, "default") != 0)
			break;
		for (const char *p = text; (p = strchr(p, '[')) != NULL; p++) {
			const char *q = p + 1;

			while (*q == ' ' || *q == '\t')
				q++;
			if (strncmp(q, sec, n) == 0) {
				q += n;
				while (*q == ' ' || *q == '\t')
					q++;
				if (*q == ']')
					return 1;
			}
		}
	}
	return 0;
}

static const char *
region_of(const struct aws_creds_opts *o, const struct shared_files *sf, const char *profile,
	  char **owned)
{
	const char *r = o->region ? o->region : env("AWS_REGION") ? env("AWS_REGION")
								  : env("AWS_DEFAULT_REGION");

	*owned = NULL;
	if (r)
		return r;
	if (sf && profile && profile_get(sf, profile, "region", owned) == 0)
		return *owned;
	return "us-east-1";
}

/* STS's endpoint for region, or the environment's override. */
static char *
sts_url(const char *region)
{
	/* Only the STS-specific variable: a pod's AWS_ENDPOINT_URL may name a
	 * MinIO or a localstack for other tools, which must not be handed the
	 * pod's web identity token. */
	const char *e = env("AWS_ENDPOINT_URL_STS");
	char *u = NULL;

	if (e)
		return strdup(e);
	if (asprintf(&u, "https://sts.%s.amazonaws.com%s/", region,
		     strncmp(region, "cn-", 3) == 0 ? ".cn" : "") < 0)
		return NULL;
	return u;
}

static int
region_ok(const char *r)
{
	if (!r[0] || strlen(r) > 32)
		return 0;
	for (; *r; r++)
		if (!isalnum((unsigned char)*r) && *r != '-')
			return 0;
	return 1;
}

static char *
session_name_default(void)
{
	char *n = NULL;

	if (asprintf(&n, "ferryfs-%ld-%ld", (long)getpid(), (long)time(NULL)) < 0)
		return NULL;
	return n;
}

/*
 * The SDKs accept a plain-HTTP container endpoint only on the loopback
 * interface or ECS's and EKS Pod Identity's link-local addresses: anything
 * else would send the pod's authorization token in clear text. STS (a web
 * identity token going out, keys coming back) gets plain HTTP on loopback
 * only, for a test's or a node's local stand-in.
 */
static int
local_url_ok(const char *url, const char *var, int link_local, char *err, size_t errlen)
{
	CURLU *u = curl_url();
	char *scheme = NULL, *host = NULL;
	int ok = 0;

	if (u == NULL)
		return -ENOMEM;
	if (curl_url_set(u, CURLUPART_URL, url, 0) != CURLUE_OK ||
	    curl_url_get(u, CURLUPART_SCHEME, &scheme, 0) != CURLUE_OK ||
	    curl_url_get(u, CURLUPART_HOST, &host, 0) != CURLUE_OK) {
		snprintf(err, errlen, "%s is not a URL", var);
		goto out;
	}
	if (strcmp(scheme, "https") == 0) {
		ok = 1;
	} else if (strcmp(scheme, "http") == 0) {
		struct in_addr a4;

		/* A numeric loopback address: "127.attacker.example" is a name. */
		ok = (inet_pton(AF_INET, host, &a4) == 1 && (ntohl(a4.s_addr) >> 24) == 127) ||
		     strcmp(host, "localhost") == 0 || strcmp(host, "[::1]") == 0 ||
		     (link_local && (strcmp(host, "169.254.170.2") == 0 ||
				     strcmp(host, "169.254.170.23") == 0 ||
				     strcmp(host, "[fd00:ec2::23]") == 0));
		if (!ok)
			snprintf(err, errlen, "%s: plain http only to the loopback interface%s, not %s",
				 var, link_local ? ", 169.254.170.2, 169.254.170.23 or fd00:ec2::23" : "",
				 host);
	} else {
		snprintf(err, errlen, "%s: scheme %s is not http or https", var, scheme);
	}
out:
	curl_free(scheme);
	curl_free(host);
	curl_url_cleanup(u);
	return ok ? 0 : -EINVAL;
}

static int
role_source(struct aws_source *s, const char *role_arn, const char *session, const char *region)
{
	s->role_arn = strdup(role_arn);
	s->session_name = session ? strdup(session) : session_name_default();
	s->region = strdup(region);
	s->url = sts_url(region);
	return s->role_arn && s->session_name && s->region && s->url ? 0 : -ENOMEM;
}

static int
profile_source(const struct aws_creds_opts *o, const struct shared_files *sf, const char *profile,
	       int depth, struct aws_source **out, char *err, size_t errlen)
{
	char *role = NULL, *srcp = NULL, *wit = NULL, *sess = NULL, *ext = NULL, *proc = NULL;
	char *ak = NULL, *sk = NULL, *st = NULL, *credsrc = NULL, *region_owned = NULL;
	struct aws_source *s = NULL;
	const char *region;
	int ret;

	*out = NULL;
	if (depth > PROFILE_DEPTH_MAX) {
		snprintf(err, errlen, "profile %s: source_profile goes more than %d deep (a loop?)",
			 profile, PROFILE_DEPTH_MAX);
		return -EINVAL;
	}
	if (!profile_exists(sf, profile)) {
		snprintf(err, errlen, "profile %s is not in %s or %s", profile, sf->cred_path,
			 sf->conf_path);
		return -ENOENT;
	}
#define GET(k, v)                                                            \
	do {                                                                 \
		ret = profile_get(sf, profile, k, &v);                       \
		if (ret == -ENOMEM)                                          \
			goto out;                                            \
	} while (0)
	GET("role_arn", role);
	GET("source_profile", srcp);
	GET("credential_source", credsrc);
	GET("web_identity_token_file", wit);
	GET("role_session_name", sess);
	GET("external_id", ext);
	GET("credential_process", proc);
	GET("aws_access_key_id", ak);
	GET("aws_secret_access_key", sk);
	GET("aws_session_token", st);
#undef GET
	region = region_of(o, sf, profile, &region_owned);
	if (!region_ok(region)) {
		snprintf(err, errlen, "profile %s: invalid region \"%.40s\"", profile, region);
		ret = -EINVAL;
		goto out;
	}
	ret = -ENOMEM;
	if (role && wit) {
		s = source_new(SRC_WEB_IDENTITY, o, FETCH_TIMEOUT_MS);
		if (s == NULL || role_source(s, role, sess, region) < 0 ||
		    (s->token_file = expand_home(wit)) == NULL)
			goto out;
		snprintf(s->name, sizeof(s->name), "profile %.40s (web identity)", profile);
	} else if (role && srcp) {
		s = source_new(SRC_ASSUME_ROLE, o, FETCH_TIMEOUT_MS);
		if (s == NULL || role_source(s, role, sess, region) < 0 ||
		    (ext && (s->external_id = strdup(ext)) == NULL))
			goto out;
		if (strcmp(srcp, profile) == 0) {
			/* A profile that is its own source signs with its static keys. */
			if (!ak || !sk) {
				snprintf(err, errlen, "profile %s: source_profile is itself but it has no "
					 "aws_access_key_id and aws_secret_access_key", profile);
				ret = -EINVAL;
				goto out;
			}
			s->parent = source_new(SRC_STATIC, o, FETCH_TIMEOUT_MS);
			if (s->parent == NULL || (s->parent->fixed.access_key = strdup(ak)) == NULL ||
			    (s->parent->fixed.secret_key = strdup(sk)) == NULL ||
			    (st && (s->parent->fixed.session_token = strdup(st)) == NULL))
				goto out;
			snprintf(s->parent->name, sizeof(s->parent->name), "profile %.40s", profile);
		} else {
			/* The source may assume a role of its own first (a chain of roles). */
			ret = profile_source(o, sf, srcp, depth + 1, &s->parent, err, errlen);
			if (ret < 0) {
				if (ret == -ENOENT)
					ret = -EINVAL;
				goto out;
			}
		}
		snprintf(s->name, sizeof(s->name), "profile %.40s (assume role)", profile);
	} else if (role) {
		snprintf(err, errlen, "profile %s: role_arn needs source_profile or "
			 "web_identity_token_file%s", profile,
			 credsrc ? " (credential_source is not supported)" : "");
		ret = -EINVAL;
		goto out;
	} else if (proc) {
		s = source_new(SRC_PROCESS, o, PROCESS_TIMEOUT_MS);
		if (s == NULL || (s->command = strdup(proc)) == NULL)
			goto out;
		snprintf(s->name, sizeof(s->name), "profile %.40s (credential_process)", profile);
	} else if (ak || sk) {
		if (!ak || !sk) {
			snprintf(err, errlen, "profile %s: %s without %s", profile,
				 ak ? "aws_access_key_id" : "aws_secret_access_key",
				 ak ? "aws_secret_access_key" : "aws_access_key_id");
			ret = -EINVAL;
			goto out;
		}
		s = source_new(SRC_STATIC, o, FETCH_TIMEOUT_MS);
		if (s == NULL || (s->fixed.access_key = strdup(ak)) == NULL ||
		    (s->fixed.secret_key = strdup(sk)) == NULL ||
		    (st && (s->fixed.session_token = strdup(st)) == NULL))
			goto out;
		snprintf(s->name, sizeof(s->name), "profile %.40s", profile);
	} else {
		snprintf(err, errlen, "profile %s has no credentials", profile);
		ret = -ENOENT;
		goto out;
	}
	*out = s;
	s = NULL;
	ret = 0;
out:
	source_free(s);
	free(role);
	free(srcp);
	free(credsrc);
	free(wit);
	free(sess);
	free(ext);
	free(proc);
	free(region_owned);
	if (ak)
		explicit_bzero(ak, strlen(ak));
	if (sk)
		explicit_bzero(sk, strlen(sk));
	if (st)
		explicit_bzero(st, strlen(st));
	free(ak);
	free(sk);
	free(st);
	return ret;
}

/* Static keys go into headers as they are: refuse what would break one. */
static int
static_ok(const struct aws_source *s, char *err, size_t errlen)
{
	const struct aws_fields *f = &s->fixed;

	if (!aws_field_ok(f->access_key) || !aws_field_ok(f->secret_key) ||
	    (f->session_token && !aws_field_ok(f->session_token))) {
		snprintf(err, errlen, "%s: a key, secret or session token is empty, longer than 8 KiB "
			 "or holds spaces or control bytes", s->name);
		return -EINVAL;
	}
	return 0;
}

int
aws_source_find(const struct aws_creds_opts *o, struct aws_source **out, char *err, size_t errlen)
{
	struct shared_files sf = { 0 };
	const char *profile = env("AWS_PROFILE"), *v;
	struct aws_source *s = NULL;
	char *region_owned = NULL;
	int ret = -ENOMEM;

	*out = NULL;
	err[0] = '\0';
	if (o->access_key && o->secret_key) {
		s = source_new(SRC_STATIC, o, FETCH_TIMEOUT_MS);
		if (s == NULL || (s->fixed.access_key = strdup(o->access_key)) == NULL ||
		    (s->fixed.secret_key = strdup(o->secret_key)) == NULL)
			goto out;
		snprintf(s->name, sizeof(s->name), "options");
		goto found;
	}
	/* STS's stand-in, checked whichever source will use it. */
	if ((v = env("AWS_ENDPOINT_URL_STS")) &&
	    (ret = local_url_ok(v, "AWS_ENDPOINT_URL_STS", 0, err, errlen)) < 0)
		goto out;
	ret = -ENOMEM;
	/* 1. The environment. */
	if (env("AWS_ACCESS_KEY_ID") || env("AWS_SECRET_ACCESS_KEY")) {
		if (!env("AWS_ACCESS_KEY_ID") || !env("AWS_SECRET_ACCESS_KEY")) {
			snprintf(err, errlen, "%s is set but %s is not",
				 env("AWS_ACCESS_KEY_ID") ? "AWS_ACCESS_KEY_ID" : "AWS_SECRET_ACCESS_KEY",
				 env("AWS_ACCESS_KEY_ID") ? "AWS_SECRET_ACCESS_KEY" : "AWS_ACCESS_KEY_ID");
			ret = -EINVAL;
			goto out;
		}
		s = source_new(SRC_STATIC, o, FETCH_TIMEOUT_MS);
		if (s == NULL || (s->fixed.access_key = strdup(env("AWS_ACCESS_KEY_ID"))) == NULL ||
		    (s->fixed.secret_key = strdup(env("AWS_SECRET_ACCESS_KEY"))) == NULL ||
		    (env("AWS_SESSION_TOKEN") &&
		     (s->fixed.session_token = strdup(env("AWS_SESSION_TOKEN"))) == NULL))
			goto out;
		snprintf(s->name, sizeof(s->name), "environment");
		goto found;
	}
	/* 2. The shared files' profile. */
	ret = shared_file_load("AWS_SHARED_CREDENTIALS_FILE", ".aws/credentials", &sf.cred_path,
			       &sf.cred, err, errlen);
	if (ret == 0)
		ret = shared_file_load("AWS_CONFIG_FILE", ".aws/config", &sf.conf_path, &sf.conf, err,
				       errlen);
	if (ret < 0)
		goto out;
	ret = profile_source(o, &sf, profile ? profile : "default", 0, &s, err, errlen);
	if (ret == 0)
		goto found;
	/* A profile asked for by name must be there; the default one may be missing. */
	if (ret != -ENOENT || profile)
		goto out;
	err[0] = '\0';
	/* 3. Web identity. */
	if (env("AWS_ROLE_ARN") || env("AWS_WEB_IDENTITY_TOKEN_FILE")) {
		const char *region = region_of(o, NULL, NULL, &region_owned);

		if (!env("AWS_ROLE_ARN") || !env("AWS_WEB_IDENTITY_TOKEN_FILE")) {
			snprintf(err, errlen, "%s is set but %s is not",
				 env("AWS_ROLE_ARN") ? "AWS_ROLE_ARN" : "AWS_WEB_IDENTITY_TOKEN_FILE",
				 env("AWS_ROLE_ARN") ? "AWS_WEB_IDENTITY_TOKEN_FILE" : "AWS_ROLE_ARN");
			ret = -EINVAL;
			goto out;
		}
		if (!region_ok(region)) {
			snprintf(err, errlen, "invalid region \"%.40s\"", region);
			ret = -EINVAL;
			goto out;
		}
		ret = -ENOMEM;
		s = source_new(SRC_WEB_IDENTITY, o, FETCH_TIMEOUT_MS);
		if (s == NULL || role_source(s, env("AWS_ROLE_ARN"), env("AWS_ROLE_SESSION_NAME"), region) < 0 ||
		    (s->token_file = expand_home(env("AWS_WEB_IDENTITY_TOKEN_FILE"))) == NULL)
			goto out;
		snprintf(s->name, sizeof(s->name), "web identity %s", env("AWS_ROLE_ARN"));
		goto found;
	}
	/* 4. The container endpoint. */
	if ((v = env("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI")) || env("AWS_CONTAINER_CREDENTIALS_FULL_URI")) {
		ret = -ENOMEM;
		s = source_new(SRC_CONTAINER, o, FETCH_TIMEOUT_MS);
		if (s == NULL)
			goto out;
		if (v) {
			if (v[0] != '/') {
				snprintf(err, errlen, "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI does not start "
					 "with /");
				ret = -EINVAL;
				goto out;
			}
			if (asprintf(&s->url, "http://169.254.170.2%s", v) < 0) {
				s->url = NULL;
				goto out;
			}
		} else {
			ret = local_url_ok(env("AWS_CONTAINER_CREDENTIALS_FULL_URI"),
					   "AWS_CONTAINER_CREDENTIALS_FULL_URI", 1, err, errlen);
			if (ret < 0)
				goto out;
			ret = -ENOMEM;
			if ((s->url = strdup(env("AWS_CONTAINER_CREDENTIALS_FULL_URI"))) == NULL)
				goto out;
			if ((v = env("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE")) &&
			    (s->token_file = expand_home(v)) == NULL)
				goto out;
			if (!s->token_file && (v = env("AWS_CONTAINER_AUTHORIZATION_TOKEN")) &&
			    (s->token = strdup(v)) == NULL)
				goto out;
		}
		snprintf(s->name, sizeof(s->name), "container endpoint");
		goto found;
	}
	/* 5. IMDSv2. */
	v = env("AWS_EC2_METADATA_DISABLED");
	if (v && strcasecmp(v, "true") == 0) {
		snprintf(err, errlen, "no credentials: no AWS_ACCESS_KEY_ID, no AWS_ROLE_ARN, no "
			 "AWS_CONTAINER_CREDENTIALS_*, IMDS disabled, and no profile %s in %s or %s",
			 profile ? profile : "default", sf.cred_path, sf.conf_path);
		ret = -ENOENT;
		goto out;
	}
	ret = -ENOMEM;
	s = source_new(SRC_IMDS, o, IMDS_TIMEOUT_MS);
	if (s == NULL)
		goto out;
	v = env("AWS_EC2_METADATA_SERVICE_ENDPOINT");
	if ((s->url = strdup(v ? v : "http://169.254.169.254")) == NULL)
		goto out;
	if (s->url[0] && s->url[strlen(s->url) - 1] == '/')
		s->url[strlen(s->url) - 1] = '\0';
	snprintf(s->name, sizeof(s->name), "EC2 instance metadata (IMDSv2)");
found:
	if (s->kind == SRC_STATIC && (ret = static_ok(s, err, errlen)) < 0)
		goto out;
	if (s->kind == SRC_ASSUME_ROLE) {
		const struct aws_source *p = s->parent;

		while (p->kind == SRC_ASSUME_ROLE)
			p = p->parent;
		if (p->kind == SRC_STATIC && (ret = static_ok(p, err, errlen)) < 0)
			goto out;
	}
	*out = s;
	s = NULL;
	ret = 0;
out:
	if (ret == -ENOMEM && !err[0])
		snprintf(err, errlen, "out of memory");
	free(region_owned);
	source_free(s);
	shared_files_free(&sf);
	return ret;
}
