/*
 * s3_xml: S3's XML answers (a ListObjectsV2 page, an error body), parsed
 * with expat. The bodies come from a server over the network: anything
 * malformed is an error with a reason, never a guess. Used by
 * objstore_s3.c; the parsers own nothing past their return except the
 * continuation token, which the caller frees.
 */
#ifndef FERRY_S3_XML_H
#define FERRY_S3_XML_H

#include <stddef.h>
#include <stdint.h>

/*
 * The <Code> of an <Error> body into code (""), and its <Region> (S3's
 * answer to a request for a bucket of another region) into region ("").
 * Quietly leaves both empty for a body that is not one.
 */
void s3_xml_error(const char *body, size_t len, char *code, size_t codelen, char *region,
		  size_t regionlen);

/*
 * One ListObjectsV2 page: entry(key, size, arg) for each <Contents> in
 * order (a nonzero return stops the parse and is returned), then
 * *truncated and, when truncated, *next_token (malloc'ed, the caller's).
 * -EIO with the reason in err for anything that is not a well-formed
 * ListBucketResult (an entry without Key or Size, a bad Size, a truncated
 * page without a token), -ENOMEM.
 */
int s3_xml_list(const char *body, size_t len,
		int (*entry)(const char *key, uint64_t size, void *arg), void *arg, int *truncated,
		char **next_token, char *err, size_t errlen);

#endif
