/* libFuzzer target: a checkpoint manifest read from the store (anyone who
 * can write the bucket writes it) is parsed without a crash or a leak, and
 * one that is accepted is self-consistent. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint_store.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct ckpt_manifest mf;
	char *s = malloc(size + 1), err[256];

	if (!s)
		return 0;
	memcpy(s, data, size);
	s[size] = '\0';
	if (ckpt_manifest_parse(s, "cp1", &mf, err, sizeof(err)) == 0) {
		if (strcmp(mf.cp.name, "cp1") != 0 || mf.cp.taken_ms < 0 ||
		    mf.parts != (mf.dump_bytes + CKPT_PART_BYTES - 1) / CKPT_PART_BYTES +
				    (mf.dump_bytes == 0) ||
		    memchr(mf.volume, '\0', sizeof(mf.volume)) == NULL)
			abort();
	} else if (!memchr(err, '\0', sizeof(err))) {
		abort();
	}
	free(s);
	return 0;
}
