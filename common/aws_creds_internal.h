/*
 * aws_creds_internal: the parsers behind aws_creds, exposed for their tests
 * and fuzzers (tests/unit/test_aws_creds.c, tests/fuzz/fuzz_aws_*.c). Not
 * for other callers. Every parser takes untrusted bytes (a credentials
 * service's answer, a file a pod's owner wrote) and fails with -EINVAL and
 * a reason that never quotes a secret.
 */
#ifndef FERRY_AWS_CREDS_INTERNAL_H
#define FERRY_AWS_CREDS_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

/* What a source answered. Owner: the caller (aws_fields_clear()). */
struct aws_fields {
	char *access_key;
	char *secret_key;
	char *session_token; /* NULL: none */
	int64_t expires;     /* Unix seconds; 0: never */
};
void aws_fields_clear(struct aws_fields *f); /* wipes the secrets too */

/*
 * The JSON of credential_process (Version 1), of the container endpoint and
 * of IMDS: AccessKeyId, SecretAccessKey, Token or SessionToken, Expiration.
 * IMDS's "Code" other than "Success" is an error. 0, -EINVAL or -ENOMEM.
 */
int aws_parse_creds_json(const char *body, size_t len, struct aws_fields *f, char *err,
			 size_t errlen);
/*
 * STS's AssumeRole and AssumeRoleWithWebIdentity answers
 * (<Credentials><AccessKeyId>...), or its <Error><Code> and <Message>,
 * which land in err. 0, -EACCES (an STS error), -EINVAL or -ENOMEM.
 */
int aws_parse_sts_xml(const char *body, size_t len, struct aws_fields *f, char *err,
		      size_t errlen);
/* A key, secret or token fit for a header: printable ASCII, no spaces, at
 * most 8 KiB. 1 or 0. */
int aws_field_ok(const char *s);
/* ISO 8601 UTC ("2026-12-03T13:30:00Z", fractions and "+00:00" too). 0 or -EINVAL. */
int aws_parse_time(const char *s, int64_t *out);
/*
 * The value of key in [section] of an AWS shared file's text (the config
 * file names profiles "[profile NAME]", except "[default]"; the credentials
 * file "[NAME]"). Trimmed, malloc'ed into *out. 0, -ENOENT or -ENOMEM.
 */
int aws_ini_get(const char *text, const char *section, const char *key, char **out);

#endif
