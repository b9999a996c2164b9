/* s3_xml: S3's listing pages and error bodies, as AWS and s3rver write them and as a broken server might. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "s3_xml.h"

struct seen {
	char keys[8][64];
	uint64_t sizes[8];
	int n;
	int stop_at; /* return -ENOSPC at this entry (1-based); 0: never */
};

static int on_entry(const char *key, uint64_t size, void *arg)
{
	struct seen *s = arg;

	cr_assert_lt(s->n, 8);
	snprintf(s->keys[s->n], sizeof(s->keys[0]), "%s", key);
	s->sizes[s->n] = size;
	return ++s->n == s->stop_at ? -ENOSPC : 0;
}

static int list(const char *xml, struct seen *s, int *truncated, char **token, char *err)
{
	return s3_xml_list(xml, strlen(xml), on_entry, s, truncated, token, err, 256);
}

#define HEAD "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
#define NS "<ListBucketResult xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">"

Test(s3_xml, a_page_with_entities_namespaces_and_a_token)
{
	struct seen s = { 0 };
	char err[256], *token = NULL;
	int truncated = -1;

	cr_assert_eq(list(HEAD NS "<Name>b</Name><IsTruncated>true</IsTruncated>"
			  "<Contents><Key>p/a&amp;b&lt;&#x41;&#233;</Key><Size>12</Size>"
			  "<ETag>&quot;x&quot;</ETag></Contents>"
			  "<Contents><Size>0</Size><Key><![CDATA[p/c d]]></Key></Contents>"
			  "<NextContinuationToken>t/=+</NextContinuationToken></ListBucketResult>",
			  &s, &truncated, &token, err), 0, "%s", err);
	cr_assert_eq(s.n, 2);
	cr_assert_str_eq(s.keys[0], "p/a&b<A\xc3\xa9");
	cr_assert_eq(s.sizes[0], 12);
	cr_assert_str_eq(s.keys[1], "p/c d");
	cr_assert_eq(s.sizes[1], 0);
	cr_assert_eq(truncated, 1);
	cr_assert_str_eq(token, "t/=+");
	free(token);
}

Test(s3_xml, the_last_page_and_an_empty_one)
{
	struct seen s = { 0 };
	char err[256], *token = NULL;
	int truncated = -1;

	cr_assert_eq(list(NS "<IsTruncated>false</IsTruncated><Contents><Key>k</Key><Size>18446744073709551615"
			  "</Size></Contents></ListBucketResult>", &s, &truncated, &token, err), 0);
	cr_assert_eq(s.sizes[0], UINT64_MAX);
	cr_assert_eq(truncated, 0);
	cr_assert_null(token);
	s.n = 0;
	cr_assert_eq(list("<ListBucketResult/>", &s, &truncated, &token, err), 0);
	cr_assert_eq(s.n, 0);
}

Test(s3_xml, malformed_pages_are_eio_with_a_reason)
{
	static const struct {
		const char *xml, *why;
	} bad[] = {
		{ "<Error><Code>X</Code></Error>", "not a ListBucketResult" },
		{ NS "<Contents><Key>k</Key></Contents></ListBucketResult>", "without Key or Size" },
		{ NS "<Contents><Size>1</Size></Contents></ListBucketResult>", "without Key or Size" },
		{ NS "<Contents><Key>k</Key><Size>-1</Size></Contents></ListBucketResult>", "bad Size" },
		{ NS "<Contents><Key>k</Key><Size>1x</Size></Contents></ListBucketResult>", "bad Size" },
		{ NS "<Contents><Key>k</Key><Size>18446744073709551616</Size></Contents></ListBucketResult>", "bad Size" },
		{ NS "<Contents><Key></Key><Size>1</Size></Contents></ListBucketResult>", "malformed Key" },
		{ NS "<Contents><Key>a&#0;b</Key><Size>1</Size></Contents></ListBucketResult>", "malformed XML" },
		{ NS "<IsTruncated>true</IsTruncated></ListBucketResult>", "without a continuation token" },
		{ NS "<Contents><Key>k</Key><Size>1</Size>", "malformed XML" },
		{ NS "<Contents><Key>k&bogus;</Key><Size>1</Size></Contents></ListBucketResult>", "malformed XML" },
		{ "", "malformed XML" },
	};

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		struct seen s = { 0 };
		char err[256], *token = NULL;
		int truncated = 0;

		cr_assert_eq(list(bad[i].xml, &s, &truncated, &token, err), -EIO, "case %zu: %s", i,
			     bad[i].xml);
		cr_assert(strstr(err, bad[i].why), "case %zu: \"%s\", want \"%s\"", i, err, bad[i].why);
		cr_assert_null(token);
		cr_assert_eq(truncated, 0);
	}
}

Test(s3_xml, a_key_past_the_limit_is_refused_not_cut)
{
	size_t n = 5000;
	char *xml = malloc(n + 200), err[256], *token = NULL;
	struct seen s = { 0 };
	int truncated;

	strcpy(xml, NS "<Contents><Key>");
	memset(xml + strlen(xml), 'a', n);
	strcpy(xml + strlen(NS "<Contents><Key>") + n, "</Key><Size>1</Size></Contents></ListBucketResult>");
	cr_assert_eq(list(xml, &s, &truncated, &token, err), -EIO);
	cr_assert(strstr(err, "too long"), "%s", err);
	cr_assert_eq(s.n, 0);
	free(xml);
}

Test(s3_xml, the_callback_stops_the_page)
{
	struct seen s = { .stop_at = 1 };
	char err[256], *token = NULL;
	int truncated;

	cr_assert_eq(list(NS "<IsTruncated>true</IsTruncated><NextContinuationToken>t</NextContinuationToken>"
			  "<Contents><Key>a</Key><Size>1</Size></Contents>"
			  "<Contents><Key>b</Key><Size>1</Size></Contents></ListBucketResult>",
			  &s, &truncated, &token, err), -ENOSPC);
	cr_assert_eq(s.n, 1);
	cr_assert_null(token);
}

Test(s3_xml, error_bodies)
{
	char code[64], region[32];
	const char *e = HEAD "<Error><Code>AuthorizationHeaderMalformed</Code><Message>the region "
			"'us-east-1' is wrong; expecting 'eu-west-1'</Message><Region>eu-west-1</Region>"
			"</Error>";

	s3_xml_error(e, strlen(e), code, sizeof(code), region, sizeof(region));
	cr_assert_str_eq(code, "AuthorizationHeaderMalformed");
	cr_assert_str_eq(region, "eu-west-1");
	e = "<Error><Code>NoSuchKey</Code></Error>";
	s3_xml_error(e, strlen(e), code, sizeof(code), region, sizeof(region));
	cr_assert_str_eq(code, "NoSuchKey");
	cr_assert_str_eq(region, "");
	/* Cut short, not XML, a code that is not a word, one nested elsewhere: nothing. */
	static const char *const junk[] = {
		"<Error><Code>NoSuchKey</Code>", "NoSuchKey", "<Error><Code>a b</Code></Error>",
		"<Other><Code>X</Code></Other>", "<Error><X><Code>Y</Code></X></Error>",
	};
	for (size_t i = 0; i < sizeof(junk) / sizeof(junk[0]); i++) {
		s3_xml_error(junk[i], strlen(junk[i]), code, sizeof(code), region, sizeof(region));
		cr_assert_str_eq(code, "", "%s", junk[i]);
	}
}
