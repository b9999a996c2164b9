/*
 * creds_server: the credentials services a pod or an instance talks to, on
 * 127.0.0.1, in a thread of the test process, for tests of ferry's
 * credentials chain (common/aws_creds.h). One server plays every role; each
 * issues keys that live the lifetime given to creds_server_start(), all
 * with access key and secret S3RVER (what the test's s3rver takes) and a
 * new session token tok-N (N from 1, shared by the roles), which is given
 * to the issue callback (to register it with s3_proxy_token_add(), say)
 * before the answer leaves. The pod token given at the start stands for
 * what a kubelet writes to a pod (the tests write it to a file):
 *
 * CREDS_CONTAINER, "http://127.0.0.1:PORT/creds": a container credentials
 *   endpoint (EKS Pod Identity, ECS). A GET whose Authorization header is
 *   the pod token is answered 200
 *   {"AccessKeyId":"S3RVER","SecretAccessKey":"S3RVER","Token":"tok-N",
 *    "Expiration":"<now + lifetime, ISO 8601 UTC>"}
 *   A wrong or missing Authorization gets 401.
 * CREDS_PROCESS, "http://127.0.0.1:PORT/process": the same for a
 *   credential_process script that asks over curl, answered as such a
 *   process prints it ("Version":1, "SessionToken").
 * CREDS_STS, "http://127.0.0.1:PORT" (AWS_ENDPOINT_URL_STS): STS
 *   AssumeRoleWithWebIdentity. A POST of / whose form body has
 *   Action=AssumeRoleWithWebIdentity, a RoleArn, a RoleSessionName and a
 *   WebIdentityToken is answered with STS's XML
 *   <AssumeRoleWithWebIdentityResponse>...<Credentials> (AccessKeyId,
 *   SecretAccessKey, SessionToken, Expiration) if the token is the pod
 *   token; 403 AccessDenied (STS's ErrorResponse) if it is not, 400
 *   MissingParameter or InvalidAction for a form without them.
 * CREDS_IMDS, "http://127.0.0.1:PORT" (AWS_EC2_METADATA_SERVICE_ENDPOINT):
 *   IMDSv2. PUT /latest/api/token with X-aws-ec2-metadata-token-ttl-seconds
 *   (1 to 21600) gets a session token (400 without it); a GET of
 *   /latest/meta-data/iam/security-credentials/ gets the role name
 *   CREDS_IMDS_ROLE, and of .../CREDS_IMDS_ROLE the key as JSON (Code
 *   Success, Type AWS-HMAC, AccessKeyId, SecretAccessKey, Token,
 *   Expiration); both GETs want a session token the server issued and that
 *   has not expired in X-aws-ec2-metadata-token, else 401.
 * Anything else gets 404. Answers to a request with the wrong credentials
 * (401, 403, 400) are refusals (creds_server_refusals()).
 *
 * One request per connection (Connection: close), served one at a time:
 * fetches are rare and small.
 *
 * Ownership: the server owns its thread and sockets; creds_server_stop()
 * ends them and frees it. The callback runs on the server's thread.
 */
#ifndef FERRY_IT_CREDS_SERVER_UTIL_H
#define FERRY_IT_CREDS_SERVER_UTIL_H

#include <stddef.h>
#include <stdint.h>

#define CREDS_IMDS_ROLE "ferry-test-instance-role"

enum creds_role { CREDS_CONTAINER, CREDS_PROCESS, CREDS_STS, CREDS_IMDS };

struct creds_server;

/* Called for each key issued: its session token and expiry (Unix s). */
typedef void (*creds_issue_fn)(void *arg, const char *token, int64_t expires);

/* Starts a server answering keys that live lifetime_s seconds (asserts on
 * failure). pod_token: the container endpoint's Authorization and the web
 * identity token STS wants. */
struct creds_server *creds_server_start(const char *pod_token, int lifetime_s,
					creds_issue_fn on_issue, void *arg);
/* The URL a client of that role is given (see above). */
const char *creds_server_url(const struct creds_server *c, enum creds_role role);
/* Keys issued, by any role, and requests refused, since the start. */
unsigned creds_server_fetches(const struct creds_server *c);
unsigned creds_server_refusals(const struct creds_server *c);
/* What the last refusal was ("401 GET /creds: wrong Authorization"), ""
 * if none, into buf. */
void creds_server_last_refusal(const struct creds_server *c, char *buf, size_t len);
/* Unix time of the last key issued (0: none yet). */
int64_t creds_server_last_fetch(const struct creds_server *c);
void creds_server_stop(struct creds_server *c);

#endif
