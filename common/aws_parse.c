/*
 * aws_parse: the answers of AWS credential sources (JSON through json-c, STS's
 * XML through expat) and the shared config files. See aws_creds_internal.h.
 */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <expat.h>
#include <json-c/json.h>

#include "aws_creds_internal.h"
#include "expat_compat.h"

#define FIELD_MAX 8192 /* longer than any real key, secret or session token */

static void
wipe_free(char *s)
{
	if (s == NULL)
		return;
	explicit_bzero(s, strlen(s));
	free(s);
}

void
aws_fields_clear(struct aws_fields *f)
{
	wipe_free(f->access_key);
	wipe_free(f->secret_key);
	wipe_free(f->session_token);
	memset(f, 0, sizeof(*f));
}

/* Days from 1970-01-01 to y-m-d (proleptic Gregorian), no libc time zone state. */
static int64_t
days_from_civil(int64_t y, int m, int d)
{
	y -= m <= 2;
	int64_t era = (y >= 0 ? y : y - 399) / 400;
	int64_t yoe = y - era * 400;
	int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
	int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;

	return era * 146097 + doe - 719468;
}

static int
digits(const char **p, int n, int *out)
{
	int v = 0;

	for (int i = 0; i < n; i++) {
		if (!isdigit((unsigned char)(*p)[i]))
			return -1;
		v = v * 10 + ((*p)[i] - '0');
	}
	*p += n;
	*out = v;
	return 0;
}

int
aws_parse_time(const char *s, int64_t *out)
{
	static const int mdays[] = { 31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31 };
	int y, mo, d, h, mi, sec, oh = 0, om = 0, sign = 0;
	const char *p = s;

	if (digits(&p, 4, &y) || *p++ != '-' || digits(&p, 2, &mo) || *p++ != '-' ||
	    digits(&p, 2, &d) || (*p != 'T' && *p != 't' && *p != ' '))
		return -EINVAL;
	p++;
	if (digits(&p, 2, &h) || *p++ != ':' || digits(&p, 2, &mi) || *p++ != ':' ||
	    digits(&p, 2, &sec))
		return -EINVAL;
	if (*p == '.') {
		p++;
		if (!isdigit((unsigned char)*p))
			return -EINVAL;
		while (isdigit((unsigned char)*p))
			p++;
	}
	if (*p == 'Z' || *p == 'z') {
		p++;
	} else if (*p == '+' || *p == '-') {
		sign = *p++ == '-' ? -1 : 1;
		if (digits(&p, 2, &oh))
			return -EINVAL;
		if (*p == ':')
			p++;
		if (digits(&p, 2, &om))
			return -EINVAL;
	} else {
		return -EINVAL;
	}
	if (*p != '\0' || mo < 1 || mo > 12 || d < 1 || d > mdays[mo - 1] || h > 23 || mi > 59 ||
	    sec > 60 || oh > 23 || om > 59)
		return -EINVAL;
	*out = days_from_civil(y, mo, d) * 86400 + h * 3600 + mi * 60 + sec -
	       sign * (oh * 3600 + om * 60);
	return 0;
}

/* A field's text: printable ASCII, no spaces, at most FIELD_MAX bytes. */
static int
field_ok(const char *s, size_t n)
{
	if (n == 0 || n > FIELD_MAX)
		return 0;
	for (size_t i = 0; i < n; i++)
		if ((unsigned char)s[i] <= ' ' || (unsigned char)s[i] >= 127)
			return 0;
	return 1;
}

int
aws_field_ok(const char *s)
{
	return field_ok(s, strlen(s));
}

static int
fields_check(struct aws_fields *f, const char *what, char *err, size_t errlen)
{
	const char *missing = !f->access_key ? "AccessKeyId" : !f->secret_key ? "SecretAccessKey" : NULL;

	if (missing) {
		snprintf(err, errlen, "%s: no %s", what, missing);
		aws_fields_clear(f);
		return -EINVAL;
	}
	return 0;
}

static int
json_field(struct json_object *o, const char *name, char **out, const char *what, char *err,
	   size_t errlen)
{
	struct json_object *v;
	const char *s;

	if (!json_object_object_get_ex(o, name, &v) || json_object_is_type(v, json_type_null))
		return 0;
	if (!json_object_is_type(v, json_type_string)) {
		snprintf(err, errlen, "%s: %s is not a string", what, name);
		return -EINVAL;
	}
	s = json_object_get_string(v);
	if (!field_ok(s, (size_t)json_object_get_string_len(v))) {
		snprintf(err, errlen, "%s: %s is empty, too long or holds spaces or control bytes",
			 what, name);
		return -EINVAL;
	}
	wipe_free(*out); /* Token and SessionToken both given: the second wins */
	*out = strdup(s);
	return *out ? 0 : -ENOMEM;
}

int
aws_parse_creds_json(const char *body, size_t len, struct aws_fields *f, char *err, size_t errlen)
{
	static const char what[] = "credentials answer";
	struct json_tokener *tok = NULL;
	struct json_object *o = NULL, *v;
	char *exp = NULL;
	int ret = -EINVAL;

	memset(f, 0, sizeof(*f));
	if (len > INT32_MAX) {
		snprintf(err, errlen, "%s: too long", what);
		return -EINVAL;
	}
	tok = json_tokener_new();
	if (tok == NULL)
		return -ENOMEM;
	json_tokener_set_flags(tok, JSON_TOKENER_STRICT);
	o = json_tokener_parse_ex(tok, body, (int)len);
	if (o == NULL || json_tokener_get_parse_end(tok) != len ||
	    !json_object_is_type(o, json_type_object)) {
		snprintf(err, errlen, "%s: not one JSON object", what);
		goto out;
	}
	if (json_object_object_get_ex(o, "Code", &v) &&
	    (!json_object_is_type(v, json_type_string) ||
	     strcmp(json_object_get_string(v), "Success") != 0)) {
		snprintf(err, errlen, "%s: Code is \"%.64s\", not Success", what,
			 json_object_is_type(v, json_type_string) ? json_object_get_string(v) : "?");
		goto out;
	}
	if (json_object_object_get_ex(o, "Version", &v) &&
	    (!json_object_is_type(v, json_type_int) || json_object_get_int64(v) != 1)) {
		snprintf(err, errlen, "%s: Version is not 1", what);
		goto out;
	}
	if ((ret = json_field(o, "AccessKeyId", &f->access_key, what, err, errlen)) < 0 ||
	    (ret = json_field(o, "SecretAccessKey", &f->secret_key, what, err, errlen)) < 0 ||
	    (ret = json_field(o, "Token", &f->session_token, what, err, errlen)) < 0 ||
	    (ret = json_field(o, "SessionToken", &f->session_token, what, err, errlen)) < 0 ||
	    (ret = json_field(o, "Expiration", &exp, what, err, errlen)) < 0)
		goto out;
	if (exp && aws_parse_time(exp, &f->expires) < 0) {
		snprintf(err, errlen, "%s: Expiration \"%.40s\" is not an ISO 8601 time", what, exp);
		ret = -EINVAL;
		goto out;
	}
	ret = fields_check(f, what, err, errlen);
out:
	if (ret < 0)
		aws_fields_clear(f);
	free(exp);
	json_object_put(o);
	json_tokener_free(tok);
	return ret;
}

/* ---- STS's XML ---- */

enum { X_AK, X_SK, X_TOKEN, X_EXP, X_CODE, X_MSG, X_N };
static const char *const xml_names[X_N] = { "AccessKeyId", "SecretAccessKey", "SessionToken",
					    "Expiration", "Code", "Message" };

struct sts_parse {
	int depth;
	int in_creds;   /* depth of <Credentials>, 0 outside */
	int in_error;   /* depth of <Error>, 0 outside */
	int cur;        /* X_* being read, -1 none */
	char *text[X_N];
	size_t len[X_N];
	int oom;
	int too_long;
};

static const char *
local_name(const XML_Char *name)
{
	const char *sep = strrchr(name, '|'); /* namespace separator */

	return sep ? sep + 1 : name;
}

static void XMLCALL
on_start(void *ud, const XML_Char *name, const XML_Char **attrs)
{
	struct sts_parse *p = ud;
	const char *n = local_name(name);

	(void)attrs;
	p->depth++;
	p->cur = -1;
	if (strcmp(n, "Credentials") == 0 && !p->in_creds) {
		p->in_creds = p->depth;
		return;
	}
	if (strcmp(n, "Error") == 0 && !p->in_error) {
		p->in_error = p->depth;
		return;
	}
	for (int i = 0; i < X_N; i++) {
		int want = i <= X_EXP ? p->in_creds : p->in_error;

		if (want && p->depth == want + 1 && strcmp(n, xml_names[i]) == 0 && !p->text[i]) {
			p->cur = i;
			p->text[i] = calloc(1, 1);
			p->oom |= p->text[i] == NULL;
			return;
		}
	}
}

static void XMLCALL
on_end(void *ud, const XML_Char *name)
{
	struct sts_parse *p = ud;

	(void)name;
	if (p->in_creds == p->depth)
		p->in_creds = 0;
	if (p->in_error == p->depth)
		p->in_error = 0;
	p->depth--;
	p->cur = -1;
}

static void XMLCALL
on_text(void *ud, const XML_Char *s, int n)
{
	struct sts_parse *p = ud;
	char *t;
	int i = p->cur;

	if (i < 0 || p->text[i] == NULL)
		return;
	if (p->len[i] + (size_t)n > FIELD_MAX) {
		p->too_long = 1;
		return;
	}
	t = realloc(p->text[i], p->len[i] + (size_t)n + 1);
	if (t == NULL) {
		p->oom = 1;
		return;
	}
	memcpy(t + p->len[i], s, (size_t)n);
	p->len[i] += (size_t)n;
	t[p->len[i]] = '\0';
	p->text[i] = t;
}

/* Trims XML's surrounding white space in place. */
static void
trim(char *s)
{
	size_t n = strlen(s), i = 0;

	while (n && isspace((unsigned char)s[n - 1]))
		s[--n] = '\0';
	while (isspace((unsigned char)s[i]))
		i++;
	memmove(s, s + i, n - i + 1);
}

int
aws_parse_sts_xml(const char *body, size_t len, struct aws_fields *f, char *err, size_t errlen)
{
	static const char what[] = "STS answer";
	struct sts_parse p = { .cur = -1 };
	XML_Parser xp = NULL;
	int ret = -EINVAL;

	memset(f, 0, sizeof(*f));
	if (len > INT32_MAX) {
		snprintf(err, errlen, "%s: too long", what);
		return -EINVAL;
	}
	xp = XML_ParserCreateNS(NULL, '|');
	if (xp == NULL)
		return -ENOMEM;
	XML_SetUserData(xp, &p);
	XML_SetElementHandler(xp, on_start, on_end);
	XML_SetCharacterDataHandler(xp, on_text);
	if (XML_Parse(xp, body, (int)len, 1) != XML_STATUS_OK) {
		snprintf(err, errlen, "%s: not XML (%s at line %llu)", what,
			 XML_ErrorString(XML_GetErrorCode(xp)), xml_line(xp));
		ret = p.oom ? -ENOMEM : -EINVAL;
		goto out;
	}
	if (p.oom) {
		ret = -ENOMEM;
		goto out;
	}
	for (int i = 0; i < X_N; i++)
		if (p.text[i])
			trim(p.text[i]);
	if (p.text[X_CODE]) {
		/* Code and Message are STS's words about our request: quoted, cut short. */
		snprintf(err, errlen, "STS refused: %.64s: %.160s", p.text[X_CODE],
			 p.text[X_MSG] ? p.text[X_MSG] : "");
		for (char *c = err; *c; c++)
			if ((unsigned char)*c < ' ' || (unsigned char)*c >= 127)
				*c = '?';
		ret = -EACCES;
		goto out;
	}
	if (p.too_long) {
		snprintf(err, errlen, "%s: a field is too long", what);
		goto out;
	}
	for (int i = X_AK; i <= X_TOKEN; i++) {
		if (p.text[i] && !field_ok(p.text[i], strlen(p.text[i]))) {
			snprintf(err, errlen, "%s: %s is empty or holds spaces or control bytes", what,
				 xml_names[i]);
			goto out;
		}
	}
	f->access_key = p.text[X_AK];
	f->secret_key = p.text[X_SK];
	f->session_token = p.text[X_TOKEN];
	p.text[X_AK] = p.text[X_SK] = p.text[X_TOKEN] = NULL;
	if (p.text[X_EXP] && aws_parse_time(p.text[X_EXP], &f->expires) < 0) {
		snprintf(err, errlen, "%s: Expiration \"%.40s\" is not an ISO 8601 time", what,
			 p.text[X_EXP]);
		aws_fields_clear(f);
		goto out;
	}
	ret = fields_check(f, what, err, errlen);
out:
	for (int i = 0; i < X_N; i++)
		wipe_free(p.text[i]);
	XML_ParserFree(xp);
	return ret;
}

/* ---- the shared config and credentials files ---- */

int
aws_ini_get(const char *text, const char *section, const char *key, char **out)
{
	const char *p = text;
	int in = 0;

	*out = NULL;
	while (*p) {
		const char *eol = strchr(p, '\n'), *a = p, *b;

		if (eol == NULL)
			eol = p + strlen(p);
		b = eol;
		while (a < b && isspace((unsigned char)*a))
			a++;
		while (b > a && isspace((unsigned char)b[-1]))
			b--;
		if (a < b && *a == '[') {
			const char *c = b - 1, *s = a + 1;

			in = 0;
			if (*c == ']') {
				while (s < c && isspace((unsigned char)*s))
					s++;
				while (c > s && isspace((unsigned char)c[-1]))
					c--;
				/* "[profile  x]" names x; whitespace inside is the SDKs' too. */
				in = strlen(section) == (size_t)(c - s) && memcmp(s, section, (size_t)(c - s)) == 0;
				if (!in && strncmp(section, "profile ", 8) == 0 && c - s > 8 &&
				    strncmp(s, "profile", 7) == 0 && isspace((unsigned char)s[7])) {
					const char *n = s + 7;

					while (n < c && isspace((unsigned char)*n))
						n++;
					in = strlen(section + 8) == (size_t)(c - n) &&
					     memcmp(n, section + 8, (size_t)(c - n)) == 0;
				}
			}
		} else if (in && a < b && *a != '#' && *a != ';') {
			const char *eq = memchr(a, '=', (size_t)(b - a)), *k = eq;

			if (eq != NULL) {
				while (k > a && isspace((unsigned char)k[-1]))
					k--;
				if (strlen(key) == (size_t)(k - a) && memcmp(a, key, (size_t)(k - a)) == 0) {
					const char *v = eq + 1;

					while (v < b && isspace((unsigned char)*v))
						v++;
					*out = strndup(v, (size_t)(b - v));
					return *out ? 0 : -ENOMEM;
				}
			}
		}
		p = *eol ? eol + 1 : eol;
	}
	return -ENOENT;
}
