/*
 * libFuzzer target: what a credentials source can hand to aws_creds (a
 * container endpoint's or IMDS's JSON, STS's XML, an Expiration, a shared
 * file a pod's owner wrote). The first byte picks the parser, the rest is
 * its input. Checks: nothing crashes or leaks, a parse that succeeds gives
 * both keys, a failure returns a documented errno and a terminated reason,
 * an ini value comes back trimmed and on one line.
 */
#include <ctype.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "aws_creds_internal.h"

static void check_fields(int r, struct aws_fields *f, const char *err, size_t errlen)
{
	if (r == 0) {
		if (!f->access_key || !f->secret_key)
			abort();
	} else {
		if (r != -EINVAL && r != -EACCES && r != -ENOMEM)
			abort();
		if (memchr(err, '\0', errlen) == NULL)
			abort(); /* the reason must be a string within err */
	}
	aws_fields_clear(f);
	if (f->access_key || f->secret_key || f->session_token)
		abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const char *const pairs[][2] = {
		{ "default", "aws_access_key_id" },
		{ "profile x", "credential_process" },
		{ "x", "role_arn" },
		{ "profile default", "region" },
		{ "", "" },
	};
	struct aws_fields f = { 0 };
	char err[128], *s, *v;
	int64_t t;
	int r;

	if (size < 1)
		return 0;
	/* Exact-size copies (the bytes, or a string with its NUL): a read past
	 * the end is ASan's to see. */
	s = malloc(data[0] % 4 < 2 && size > 1 ? size - 1 : size);
	if (s == NULL)
		return 0;
	memcpy(s, data + 1, size - 1);
	switch (data[0] % 4) {
	case 0:
		memset(err, 'x', sizeof(err));
		r = aws_parse_creds_json(s, size - 1, &f, err, sizeof(err));
		check_fields(r, &f, err, sizeof(err));
		if (r == -EACCES)
			abort(); /* only STS refuses */
		break;
	case 1:
		memset(err, 'x', sizeof(err));
		r = aws_parse_sts_xml(s, size - 1, &f, err, sizeof(err));
		check_fields(r, &f, err, sizeof(err));
		break;
	case 2:
		s[size - 1] = '\0';
		t = 0;
		r = aws_parse_time(s, &t);
		if (r != 0 && r != -EINVAL)
			abort();
		break;
	case 3:
		s[size - 1] = '\0';
		for (size_t i = 0; i < sizeof(pairs) / sizeof(pairs[0]); i++) {
			v = (char *)"unset";
			r = aws_ini_get(s, pairs[i][0], pairs[i][1], &v);
			if (r == 0) {
				size_t n;

				/* A value is trimmed and one line. */
				if (v == NULL || strchr(v, '\n'))
					abort();
				n = strlen(v);
				if (n && (isspace((unsigned char)v[0]) || isspace((unsigned char)v[n - 1])))
					abort();
				free(v);
			} else if (r != -ENOENT && r != -ENOMEM) {
				abort();
			}
		}
		break;
	}
	free(s);
	return 0;
}
