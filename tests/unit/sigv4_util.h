/*
 * Shared by the unit tests that verify SigV4 signatures the way a server
 * does (test_sigv4.c for S3, test_aws_creds.c for STS): digests, HMAC and
 * the specification's URI encoding, written from the specification rather
 * than taken from the code under test.
 */
#ifndef FERRY_TEST_SIGV4_UTIL_H
#define FERRY_TEST_SIGV4_UTIL_H

#include <ctype.h>
#include <stdio.h>
#include <string.h>

#include <criterion/criterion.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

static inline void hex(const unsigned char *md, size_t n, char *out)
{
	for (size_t i = 0; i < n; i++)
		sprintf(out + 2 * i, "%02x", md[i]);
}

static inline void sha256_hex(const void *p, size_t n, char out[65])
{
	unsigned char md[32];
	unsigned int l = 32;

	cr_assert_eq(EVP_Digest(p, n, md, &l, EVP_sha256(), NULL), 1);
	hex(md, 32, out);
}

static inline void hmac(const void *key, size_t klen, const char *msg, unsigned char out[32])
{
	unsigned int l = 32;

	cr_assert_not_null(HMAC(EVP_sha256(), key, (int)klen, (const unsigned char *)msg,
				strlen(msg), out, &l));
}

/* RFC 3986 unreserved kept, the rest %XX; '/' kept when keep_slash. */
static inline void uri_encode(const char *s, int keep_slash, char *out)
{
	size_t o = 0;

	for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
		if (isalnum(*p) || strchr("-_.~", *p) || (keep_slash && *p == '/'))
			out[o++] = (char)*p;
		else
			o += (size_t)sprintf(out + o, "%%%02X", *p);
	}
	out[o] = '\0';
}

/* qsort's comparison of strings. */
static inline int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

#endif
