/*
 * url: parsing of the storage and metadata locations a volume is named by.
 *
 *   storage:  file:///abs/dir
 *             s3://HOST[:PORT]/BUCKET[/PREFIX][?OPTS]  (https unless s3_http is set)
 *             s3://BUCKET[/PREFIX]?region=R[&OPTS]     (AWS: virtual-hosted HTTPS;
 *                                                       a bucket with dots is refused)
 *             s3://BUCKET[/PREFIX]?endpoint=http(s)://HOST[:PORT][&OPTS]
 *             OPTS: region, endpoint, sse (AES256, aws:kms, aws:kms:dsse),
 *             sse_kms_key_id, storage_class, expected_owner (12 digits),
 *             timeout_ms, max_retries; anything else is refused
 *   metadata: /abs/or/relative/VOLUME-DIR     (-> VOLUME-DIR/meta.db)
 *             sqlite:///abs/path/meta.db
 *             postgresql://[USER@]HOST[:PORT]/DB?volume=NAME[&libpq params]
 *             (postgres:// too; the node's own files of the volume go in
 *             $FERRY_STATE_DIR/NAME, by default /var/lib/ferryfs/NAME for
 *             root and ~/.local/state/ferryfs/NAME for others)
 *
 * The parsed structs own their strings; free them with the matching _free(),
 * which accepts a zeroed or already-freed struct.
 */
#ifndef FERRY_URL_H
#define FERRY_URL_H

#include <stddef.h>

enum store_kind { STORE_FILE = 1, STORE_S3 = 2 };

struct store_url {
	enum store_kind kind;
	char *path;      /* file: absolute directory, no trailing slash */
	char *host;      /* s3: host name or address */
	int port;        /* s3: TCP port (443/80 when not given) */
	char *bucket;    /* s3: bucket name */
	char *prefix;    /* s3: key prefix without leading/trailing '/', "" if none */
	int https;       /* s3: 1 unless s3_http was asked for */
	int virtual_hosted; /* s3: objects at https://BUCKET.HOST/KEY (AWS) */
	char *region;    /* s3: ?region=; NULL: the environment's */
	char *sse;       /* s3: x-amz-server-side-encryption of each PUT; NULL: none */
	char *sse_kms_key_id;
	char *storage_class;
	char *expected_owner; /* s3: x-amz-expected-bucket-owner of every request */
	long timeout_ms;      /* s3: 0: the store's default */
	int max_retries;      /* s3: -1: the store's default */
};

/*
 * Returns 0, or -EINVAL with a one-line reason in err (never NULL-terminated
 * beyond errlen). s3_http selects plain HTTP for s3:// URLs.
 */
int store_url_parse(const char *s, int s3_http, struct store_url *out, char *err, size_t errlen);
void store_url_free(struct store_url *u);

/*
 * Resolves a VOLUME argument to the metadata's location (the absolute path
 * of its SQLite file, or the PostgreSQL URL as given) and the node's
 * directory of the volume (the default home of objects/ for SQLite,
 * cache/, staging/, the log, the lock and the metadata journal). Returns 0
 * or -EINVAL (reason in err). *db_path and *vol_dir are malloc'ed and owned
 * by the caller.
 */
int meta_url_parse(const char *s, char **db_path, char **vol_dir, char *err, size_t errlen);
/* The location is a PostgreSQL URL (else a SQLite file). */
int meta_url_is_pg(const char *db_path);
/* A file of the node's own beside the metadata (suffix ".lock",
 * META_JOURNAL_SUFFIX...): db_path + suffix for SQLite, vol_dir/meta +
 * suffix for PostgreSQL. -ENAMETOOLONG if it does not fit in buf. */
int meta_local_file(const char *db_path, const char *vol_dir, const char *suffix, char *buf,
		    size_t cap);

#endif
