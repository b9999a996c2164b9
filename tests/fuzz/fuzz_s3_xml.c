/*
 * libFuzzer target: S3's XML answers as a hostile server could send them
 * (s3_xml.h). The first byte picks the parser: a ListObjectsV2 page, or an
 * error body. Checks: nothing crashes or leaks; a listing either succeeds
 * (every key a non-empty string, a truncated page with a token) or fails
 * with -EIO or -ENOMEM and a terminated reason; an error's code and region
 * are words.
 */
#include <ctype.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "s3_xml.h"

static int on_entry(const char *key, uint64_t size, void *arg)
{
	(void)size;
	if (key[0] == '\0')
		abort();
	/* Stop at the 1000th entry: a callback's own failure must come back. */
	return ++*(int *)arg == 1000 ? -ENOSPC : 0;
}

static void check_word(const char *s, size_t cap)
{
	if (memchr(s, '\0', cap) == NULL)
		abort();
	for (; *s; s++)
		if (!isalnum((unsigned char)*s) && *s != '-' && *s != '.' && *s != '_')
			abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const char *body = (const char *)data + 1;
	char err[256], code[64], region[32], *token = NULL;
	int n = 0, truncated = 0, r;

	if (size < 1)
		return 0;
	if (data[0] & 1) {
		s3_xml_error(body, size - 1, code, sizeof(code), region, sizeof(region));
		check_word(code, sizeof(code));
		check_word(region, sizeof(region));
		return 0;
	}
	r = s3_xml_list(body, size - 1, on_entry, &n, &truncated, &token, err, sizeof(err));
	if (r == 0) {
		if (truncated != (token != NULL) || (token && token[0] == '\0'))
			abort();
	} else if (r == -EIO || r == -ENOMEM) {
		if (memchr(err, '\0', sizeof(err)) == NULL || token || truncated)
			abort();
	} else if (r != -ENOSPC || n != 1000) {
		abort();
	}
	free(token);
	return 0;
}
