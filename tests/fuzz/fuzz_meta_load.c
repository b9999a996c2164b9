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

/* Everything a loaded volume holds reads back without an error: the
 * engine checks each row as it reads it (-EIO for a damaged one). */
struct walk_arg {
	struct meta *m;
	uint64_t dir;
	int depth;
};

static void walk(struct meta *m, uint64_t ino, int depth);

static int walk_entry(void *arg, const char *name, const struct meta_attr *a, uint64_t cookie)
{
	struct walk_arg *w = arg;
	struct meta_attr b;

	(void)cookie;
	if (meta_lookup(w->m, w->dir, name, &b) != 0 || b.ino != a->ino)
		abort(); /* listed, but not found by its name */
	walk(w->m, a->ino, w->depth + 1);
	return 0;
}

static void walk(struct meta *m, uint64_t ino, int depth)
{
	struct meta_attr a;
	struct walk_arg w = { m, ino, depth };

	if (depth > 64 || meta_getattr(m, ino, &a) != 0)
		abort(); /* the loader let a cycle or a dangling entry through */
	if (S_ISDIR(a.mode)) {
		if (meta_readdir(m, ino, 0, 1, walk_entry, &w) != 0)
			abort();
	} else if (S_ISLNK(a.mode)) {
		char *t = NULL;

		if (meta_readlink(m, ino, &t) != 0)
			abort();
		free(t);
	} else if (S_ISREG(a.mode)) {
		for (uint32_t c = 0; (uint64_t)c * META_CHUNK_SIZE < a.size && c < 4; c++) {
			struct meta_slice *s = NULL;
			size_t n = 0;

			if (meta_chunk_slices(m, ino, c, &s, &n) != 0)
				abort();
			free(s);
		}
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
		walk(m, META_ROOT_INO, 0);
		meta_close(m);
	}
	remove_volume();
	return 0;
}
