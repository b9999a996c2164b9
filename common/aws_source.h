/*
 * aws_source: the links of the credential chain aws_creds.h describes: which
 * source this process's environment and shared files name, and one fetch
 * from it. A source holds only where to ask (paths, URLs, a command), never
 * a secret, except a static source, which holds its keys. Owner: the
 * aws_creds provider owns its source (aws_source_free()).
 */
#ifndef FERRY_AWS_SOURCE_H
#define FERRY_AWS_SOURCE_H

#include <stdatomic.h>
#include <stddef.h>

#include "aws_creds.h"
#include "aws_creds_internal.h"

struct aws_source;

/*
 * The first source named, in the chain's order. Nothing is contacted here.
 * -ENOENT: nothing names a source (IMDS disabled, too); -EINVAL: a source
 * is named but wrongly (err says what and where).
 */
int aws_source_find(const struct aws_creds_opts *o, struct aws_source **out, char *err,
		    size_t errlen);
/* Fetches credentials once. 0, or a negative errno with the reason in err. */
int aws_source_fetch(struct aws_source *s, struct aws_fields *f, char *err, size_t errlen);
/* "environment", "profile prod (credential_process)", "container endpoint", ... */
const char *aws_source_name(const struct aws_source *s);
/* One word for it: options, environment, profile, credential-process,
 * assume-role, web-identity, container, imds. */
const char *aws_source_kind(const struct aws_source *s);
/* From now on a fetch gives up soon after *flag turns nonzero (curl's
 * progress callback, the command's poll): a provider closing must not wait
 * out a timeout. flag outlives the source. */
void aws_source_set_abort(struct aws_source *s, const atomic_int *flag);
/* 1 when the source is IMDS, tried last and only because nothing else is named. */
int aws_source_is_fallback(const struct aws_source *s);
void aws_source_free(struct aws_source *s); /* accepts NULL */

#endif
