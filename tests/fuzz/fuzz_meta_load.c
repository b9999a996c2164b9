/* libFuzzer target: `ferry load` of any stream (a dump cut short, edited or
 * not a dump at all) never crashes, and either makes a volume the engine
 * opens or leaves nothing behind. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "meta.h"
#include "meta_dump.h"

static char dir[64], db[128];

static void remove_volume(void)
{
	static const char *const sfx[] = { "", "-wal", "-shm", "-journal", META_JOURNAL_SUFFIX,
					   "-intent", ".lock" };
	char p[192];

	for (size_t i = 0; i < sizeof(sfx) / sizeof(sfx[0]); i++) {
		snprintf(p, sizeof(p), "%s%s", db, sfx[i]);
		unlink(p);
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char err[256];
	struct stat st;
	struct meta *m = NULL;
	FILE *f;
	int rc;

	if (!dir[0]) {
		strcpy(dir, "/tmp/ferry-fuzz-load-XXXXXX");
		if (!mkdtemp(dir))
			abort();
		snprintf(db, sizeof(db), "%s/meta.db", dir);
	}
	if (size == 0)
		return 0;
	f = fmemopen((void *)data, size, "r");
	if (!f)
		return 0;
	rc = meta_load(f, db, NULL, err, sizeof(err));
	fclose(f);
	if (rc < 0 && stat(db, &st) == 0)
		abort(); /* a refused stream left a volume behind */
	if (rc == 0) {
		if (meta_open(db, &m) != 0)
			abort(); /* loaded, but not a volume the engine opens */
		meta_close(m);
	}
	remove_volume();
	return 0;
}
