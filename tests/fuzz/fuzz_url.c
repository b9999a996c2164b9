/* libFuzzer target: storage and metadata URL parsing never crash or leak. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "url.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char *s = malloc(size + 1), err[256];
	struct store_url u = { 0 };
	char *db = NULL, *dir = NULL;

	if (!s)
		return 0;
	memcpy(s, data, size);
	s[size] = '\0';
	if (store_url_parse(s, size & 1, &u, err, sizeof(err)) == 0) {
		/* A parsed URL is well formed: the fields its kind needs are set. */
		if (u.kind == STORE_FILE && (!u.path || u.path[0] != '/'))
			abort();
		if (u.kind == STORE_S3 && (!u.host || !u.bucket || !*u.bucket || u.port <= 0 ||
					   u.port > 65535))
			abort();
	}
	store_url_free(&u);
	/* A parsed location is a SQLite file's absolute path, or a PostgreSQL
	 * URL kept as given; either way with an absolute node directory. */
	if (meta_url_parse(s, &db, &dir, err, sizeof(err)) == 0 &&
	    (!db || !dir || dir[0] != '/' || (db[0] != '/' && !meta_url_is_pg(db)) ||
	     (meta_url_is_pg(db) && strcmp(db, s) != 0)))
		abort();
	free(db);
	free(dir);
	free(s);
	return 0;
}
