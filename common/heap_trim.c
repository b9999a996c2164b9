#include "heap_trim.h"

#include <malloc.h>
#include <stdlib.h>

/* A freed reply buffer of the largest READ (1 MiB) must not make the arena
 * give its top back at once: the trim threshold stays above it. */
#define HEAP_MMAP_THRESHOLD ((1 << 20) + 4096)
#define HEAP_TRIM_THRESHOLD (2 << 20)

void heap_trim_threshold_raise(void)
{
	if (getenv("MALLOC_TRIM_THRESHOLD_") == NULL)
		(void)mallopt(M_TRIM_THRESHOLD, HEAP_TRIM_THRESHOLD);
	if (getenv("MALLOC_MMAP_THRESHOLD_") == NULL)
		(void)mallopt(M_MMAP_THRESHOLD, HEAP_MMAP_THRESHOLD);
}
