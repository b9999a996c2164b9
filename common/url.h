/*
 * url: parsing of the storage and metadata locations a volume is named by.
 *
 *   storage:  file:///abs/dir
 *             s3://HOST:PORT/BUCKET[/PREFIX]   (https unless s3_http is set)
 *   metadata: /abs/or/relative/VOLUME-DIR     (-> VOLUME-DIR/meta.db)
 *             sqlite:///abs/path/meta.db
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
};

/*
 * Returns 0, or -EINVAL with a one-line reason in err (never NULL-terminated
 * beyond errlen). s3_http selects plain HTTP for s3:// URLs.
 */
int store_url_parse(const char *s, int s3_http, struct store_url *out, char *err, size_t errlen);
void store_url_free(struct store_url *u);

/*
 * Resolves a VOLUME argument to the absolute path of its SQLite file and the
 * directory that holds it (the default home of objects/, cache/, staging/).
 * Returns 0 or -EINVAL (reason in err). *db_path and *vol_dir are malloc'ed
 * and owned by the caller.
 */
int meta_url_parse(const char *s, char **db_path, char **vol_dir, char *err, size_t errlen);

#endif
