#include "heap_trim.h"

#include <malloc.h>
#include <stdlib.h>

#define HEAP_TRIM_THRESHOLD (1 << 20)

void heap_trim_threshold_raise(void)
{
	if (getenv("MALLOC_TRIM_THRESHOLD_") == NULL)
		(void)mallopt(M_TRIM_THRESHOLD, HEAP_TRIM_THRESHOLD);
}
