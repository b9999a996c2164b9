/* libFuzzer target: the metadata journal's record decoder (what a restart
 * reads back from local disk, torn or damaged) never crashes, reads only
 * inside its buffer, and a record it accepts encodes back to the same bytes. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "meta_journal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	size_t off = 0;

	while (off < size) {
		struct mj_rec r;
		long n = mj_decode(data + off, size - off, &r);

		if (n <= 0)
			break;
		if ((size_t)n > size - off || mj_size(&r) != (size_t)n)
			abort();
		uint8_t *buf = malloc((size_t)n);
		if (buf == NULL)
			return 0;
		if (mj_encode(&r, buf, (size_t)n) != (size_t)n || memcmp(buf, data + off, (size_t)n))
			abort();
		free(buf);
		off += (size_t)n;
	}
	return 0;
}
