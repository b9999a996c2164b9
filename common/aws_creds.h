/*
 * aws_creds: AWS credentials through the SDKs' standard chain, kept fresh.
 *
 * aws_creds_open() walks the chain once, in the SDKs' order, and keeps the
 * first source that has credentials:
 *   1. the environment: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and
 *      AWS_SESSION_TOKEN (never refreshed, as in the SDKs);
 *   2. the shared files' profile (AWS_PROFILE, else "default", in
 *      AWS_SHARED_CREDENTIALS_FILE and AWS_CONFIG_FILE, else ~/.aws/credentials
 *      and ~/.aws/config): static keys, credential_process, role_arn with
 *      source_profile (STS AssumeRole signed with the source's keys) or with
 *      web_identity_token_file;
 *   3. web identity (EKS IRSA): AWS_ROLE_ARN and AWS_WEB_IDENTITY_TOKEN_FILE,
 *      through STS AssumeRoleWithWebIdentity (the token file is read again at
 *      every refresh: the kubelet rotates it);
 *   4. the container endpoint (EKS Pod Identity, ECS):
 *      AWS_CONTAINER_CREDENTIALS_FULL_URI with the token of
 *      AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE (read at every fetch) or
 *      AWS_CONTAINER_AUTHORIZATION_TOKEN, or _RELATIVE_URI on 169.254.170.2;
 *   5. IMDSv2 on EC2 (a session token first), unless
 *      AWS_EC2_METADATA_DISABLED=true.
 * STS is https://sts.REGION.amazonaws.com unless AWS_ENDPOINT_URL_STS (or
 * AWS_ENDPOINT_URL) names another; IMDS is http://169.254.169.254 unless
 * AWS_EC2_METADATA_SERVICE_ENDPOINT names another.
 *
 * Credentials that expire are fetched again by a thread of the provider's
 * own, min(5 min, half their lifetime) before they expire, and retried with
 * backoff (1 s doubling to 30 s) while that fails: callers are not held up
 * unless what the provider holds has expired. Secrets are never in an error
 * message or in aws_creds_info().
 *
 * Ownership: the caller owns the provider (aws_creds_close()) and each key
 * it takes (aws_key_put()); a key is immutable and reference-counted, so a
 * request signs with one key from start to end while a refresh replaces the
 * provider's.
 */
#ifndef FERRY_AWS_CREDS_H
#define FERRY_AWS_CREDS_H

#include <stddef.h>
#include <stdint.h>

struct aws_creds;

struct aws_creds_opts {
	/* Both set: these static keys, and no chain (ferry's own options). */
	const char *access_key;
	const char *secret_key;
	/* STS's region; NULL: AWS_REGION, AWS_DEFAULT_REGION, the profile's
	 * region, us-east-1. */
	const char *region;
	/* Per HTTP exchange with a credentials service; 0: 5 s (IMDS: 1 s). */
	long timeout_ms;
	/* Told, from the refresh thread, when a refresh fails and when one
	 * works again after failing (common/ never logs; the daemon does).
	 * NULL: nobody. msg names the source and the reason, never a secret. */
	void (*report)(void *arg, const char *msg);
	void *report_arg;
};

struct aws_key {
	const char *access_key;
	const char *secret_key;
	const char *session_token; /* NULL: none */
	int64_t expires;           /* Unix seconds; 0: never */
	uint64_t generation;       /* 1 for the first key, +1 per refresh */
};

/*
 * Finds a source and fetches its credentials. 0, or a negative errno with
 * the reason in err: -ENOENT when no source has credentials (err names
 * what was tried), -EACCES when a source refused, -EINVAL when one is
 * configured wrongly or answered something that is not credentials, -EIO
 * when one failed (timeouts included), -ENOMEM.
 */
int aws_creds_open(const struct aws_creds_opts *o, struct aws_creds **out, char *err,
		   size_t errlen);
void aws_creds_close(struct aws_creds *c); /* accepts NULL */

/*
 * The current key, with a reference the caller gives back with
 * aws_key_put(). Never waits for a refresh unless the key has expired;
 * then it waits for one attempt (none while a failed one's backoff runs)
 * and returns -EKEYEXPIRED if there is still no valid key.
 */
int aws_creds_get(struct aws_creds *c, const struct aws_key **out);
void aws_key_put(const struct aws_key *k); /* accepts NULL */

/*
 * The server refused key generation gen as expired or invalid (S3's
 * ExpiredToken): fetch a new one now unless a newer one is already held.
 * Waits for that one attempt. 0, or the attempt's negative errno.
 */
int aws_creds_refresh(struct aws_creds *c, uint64_t gen);
/* The same without waiting: the provider's thread fetches (an event loop's call). */
void aws_creds_stale(struct aws_creds *c, uint64_t gen);

struct aws_creds_info {
	char source[160];         /* "environment", "profile NAME", "web identity ROLE_ARN", ... */
	char kind[24];            /* one word: aws_source_kind() */
	int64_t expires;          /* of the current key; 0: never */
	uint64_t refreshes;       /* keys fetched after the first */
	uint64_t refresh_failures;
	char last_error[256];     /* of the last failed fetch; "" if none */
};
void aws_creds_info(struct aws_creds *c, struct aws_creds_info *i);

#endif
