/* s3_xml: S3's XML answers through expat (s3_xml.h). */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <expat.h>

#include "expat_compat.h"
#include "s3_xml.h"

#define TEXT_MAX 4096 /* a key is at most 1,024 bytes; a token is opaque but short */

/* The text of the element being read, when it is one we want. */
struct text {
	char buf[TEXT_MAX + 1];
	size_t len;
	int on;
	int too_long;
};

static void
text_start(struct text *t)
{
	t->len = 0;
	t->buf[0] = '\0';
	t->on = 1;
	t->too_long = 0;
}

static void
text_add(struct text *t, const XML_Char *s, int n)
{
	if (!t->on)
		return;
	if (t->len + (size_t)n > TEXT_MAX) {
		t->too_long = 1;
		return;
	}
	memcpy(t->buf + t->len, s, (size_t)n);
	t->len += (size_t)n;
	t->buf[t->len] = '\0';
}

static const char *
local_name(const XML_Char *name)
{
	const char *sep = strrchr(name, '|');

	return sep ? sep + 1 : name;
}

/* ---- errors ---- */

struct err_parse {
	int depth;
	int in_error;
	int want;      /* 1: Code, 2: Region */
	struct text t;
	char *code, *region;
	size_t codelen, regionlen;
};

static void XMLCALL
err_start(void *ud, const XML_Char *name, const XML_Char **attrs)
{
	struct err_parse *p = ud;
	const char *n = local_name(name);

	(void)attrs;
	p->depth++;
	p->want = 0;
	p->t.on = 0;
	if (p->depth == 1) {
		p->in_error = strcmp(n, "Error") == 0;
		return;
	}
	if (p->in_error && p->depth == 2) {
		p->want = strcmp(n, "Code") == 0 ? 1 : strcmp(n, "Region") == 0 ? 2 : 0;
		if (p->want)
			text_start(&p->t);
	}
}

static void
copy_token(char *out, size_t outlen, const struct text *t)
{
	/* A code or a region is a word; anything else is not kept. */
	if (t->too_long || t->len == 0 || t->len >= outlen)
		return;
	for (size_t i = 0; i < t->len; i++)
		if (!isalnum((unsigned char)t->buf[i]) && t->buf[i] != '-' && t->buf[i] != '.' &&
		    t->buf[i] != '_')
			return;
	memcpy(out, t->buf, t->len + 1);
}

static void XMLCALL
err_end(void *ud, const XML_Char *name)
{
	struct err_parse *p = ud;

	(void)name;
	if (p->want == 1)
		copy_token(p->code, p->codelen, &p->t);
	else if (p->want == 2)
		copy_token(p->region, p->regionlen, &p->t);
	p->want = 0;
	p->t.on = 0;
	p->depth--;
}

static void XMLCALL
err_text(void *ud, const XML_Char *s, int n)
{
	text_add(&((struct err_parse *)ud)->t, s, n);
}

void
s3_xml_error(const char *body, size_t len, char *code, size_t codelen, char *region,
	     size_t regionlen)
{
	struct err_parse *p;
	XML_Parser xp;

	if (codelen)
		code[0] = '\0';
	if (regionlen)
		region[0] = '\0';
	if (len == 0 || len > INT32_MAX || (p = calloc(1, sizeof(*p))) == NULL)
		return;
	p->code = code;
	p->codelen = codelen;
	p->region = region;
	p->regionlen = regionlen;
	xp = XML_ParserCreateNS(NULL, '|');
	if (xp != NULL) {
		XML_SetUserData(xp, p);
		XML_SetElementHandler(xp, err_start, err_end);
		XML_SetCharacterDataHandler(xp, err_text);
		if (XML_Parse(xp, body, (int)len, 1) != XML_STATUS_OK) {
			/* A cut or broken body says nothing for sure. */
			if (codelen)
				code[0] = '\0';
			if (regionlen)
				region[0] = '\0';
		}
		XML_ParserFree(xp);
	}
	free(p);
}

/* ---- ListObjectsV2 ---- */

enum { L_NONE, L_KEY, L_SIZE, L_TRUNC, L_TOKEN };

struct list_parse {
	XML_Parser xp;
	int depth;
	int root_ok;
	int in_contents;
	int want;
	struct text t;
	char *key;        /* of the entry being read */
	int have_size;
	uint64_t size;
	int truncated;
	char *token;
	int (*entry)(const char *key, uint64_t size, void *arg);
	void *arg;
	int ret;          /* first failure; stops the parse */
	char *err;
	size_t errlen;
};

static void
list_fail(struct list_parse *p, int ret, const char *why)
{
	if (p->ret == 0) {
		p->ret = ret;
		if (why)
			snprintf(p->err, p->errlen, "%s", why);
	}
	XML_StopParser(p->xp, XML_FALSE);
}

static void XMLCALL
list_start(void *ud, const XML_Char *name, const XML_Char **attrs)
{
	struct list_parse *p = ud;
	const char *n = local_name(name);

	(void)attrs;
	p->depth++;
	p->want = L_NONE;
	p->t.on = 0;
	if (p->depth == 1) {
		p->root_ok = strcmp(n, "ListBucketResult") == 0;
		if (!p->root_ok)
			list_fail(p, -EIO, "the answer is not a ListBucketResult");
		return;
	}
	if (p->depth == 2 && strcmp(n, "Contents") == 0) {
		p->in_contents = 1;
		free(p->key);
		p->key = NULL;
		p->have_size = 0;
		return;
	}
	if (p->depth == 2)
		p->want = strcmp(n, "IsTruncated") == 0 ? L_TRUNC :
			  strcmp(n, "NextContinuationToken") == 0 ? L_TOKEN : L_NONE;
	else if (p->depth == 3 && p->in_contents)
		p->want = strcmp(n, "Key") == 0 ? L_KEY : strcmp(n, "Size") == 0 ? L_SIZE : L_NONE;
	if (p->want != L_NONE)
		text_start(&p->t);
}

static void XMLCALL
list_end(void *ud, const XML_Char *name)
{
	struct list_parse *p = ud;
	int want = p->want;

	(void)name;
	p->want = L_NONE;
	p->t.on = 0;
	if (want != L_NONE && p->t.too_long) {
		list_fail(p, -EIO, "an element's text is too long");
		goto out;
	}
	switch (want) {
	case L_KEY:
		free(p->key);
		p->key = strndup(p->t.buf, p->t.len);
		if (p->key == NULL)
			list_fail(p, -ENOMEM, "out of memory");
		else if (strlen(p->key) != p->t.len || p->t.len == 0)
			list_fail(p, -EIO, "malformed Key");
		break;
	case L_SIZE: {
		char *end;

		errno = 0;
		p->size = strtoull(p->t.buf, &end, 10);
		if (p->t.len == 0 || !isdigit((unsigned char)p->t.buf[0]) || *end || errno)
			list_fail(p, -EIO, "bad Size");
		p->have_size = 1;
		break;
	}
	case L_TRUNC:
		p->truncated = strcmp(p->t.buf, "true") == 0;
		break;
	case L_TOKEN:
		free(p->token);
		p->token = p->t.len ? strndup(p->t.buf, p->t.len) : NULL;
		break;
	default:
		break;
	}
	if (p->depth == 2 && p->in_contents && p->ret == 0) {
		int r;

		p->in_contents = 0;
		if (p->key == NULL || !p->have_size) {
			list_fail(p, -EIO, "an entry without Key or Size");
			goto out;
		}
		r = p->entry(p->key, p->size, p->arg);
		if (r != 0)
			list_fail(p, r, NULL);
	}
out:
	p->depth--;
}

static void XMLCALL
list_text(void *ud, const XML_Char *s, int n)
{
	text_add(&((struct list_parse *)ud)->t, s, n);
}

int
s3_xml_list(const char *body, size_t len,
	    int (*entry)(const char *key, uint64_t size, void *arg), void *arg, int *truncated,
	    char **next_token, char *err, size_t errlen)
{
	struct list_parse *p;
	int ret;

	*truncated = 0;
	*next_token = NULL;
	err[0] = '\0';
	if (len > INT32_MAX) {
		snprintf(err, errlen, "the answer is too long");
		return -EIO;
	}
	p = calloc(1, sizeof(*p));
	if (p == NULL)
		return -ENOMEM;
	p->entry = entry;
	p->arg = arg;
	p->err = err;
	p->errlen = errlen;
	p->xp = XML_ParserCreateNS(NULL, '|');
	if (p->xp == NULL) {
		free(p);
		return -ENOMEM;
	}
	XML_SetUserData(p->xp, p);
	XML_SetElementHandler(p->xp, list_start, list_end);
	XML_SetCharacterDataHandler(p->xp, list_text);
	if (XML_Parse(p->xp, body, (int)len, 1) != XML_STATUS_OK && p->ret == 0) {
		snprintf(err, errlen, "malformed XML (%s at line %llu)",
			 XML_ErrorString(XML_GetErrorCode(p->xp)), xml_line(p->xp));
		p->ret = -EIO;
	}
	if (p->ret == 0 && !p->root_ok) {
		snprintf(err, errlen, "the answer is not a ListBucketResult");
		p->ret = -EIO;
	}
	if (p->ret == 0 && p->truncated) {
		if (p->token == NULL) {
			snprintf(err, errlen, "truncated listing without a continuation token");
			p->ret = -EIO;
		} else {
			*truncated = 1;
			*next_token = p->token;
			p->token = NULL;
		}
	}
	ret = p->ret;
	XML_ParserFree(p->xp);
	free(p->key);
	free(p->token);
	free(p);
	return ret;
}
