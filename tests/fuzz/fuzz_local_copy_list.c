/* libFuzzer target: the list of local copies a clean stop leaves for the
 * next mount (STAGING/.local-copies-<uuid>) is parsed without a crash; one
 * that is accepted names only copies, and written again it reads back as
 * the same entries. */
#include <stdlib.h>
#include <string.h>

#include "local_copy_list.h"

#define UUID "7557e18c-4978-4254-b161-c33e54e2b388"

static struct local_copy_entry got[LOCAL_COPY_LIST_MAX], again[LOCAL_COPY_LIST_MAX];
static char text[LOCAL_COPY_LIST_TEXT_MAX];

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	int n = local_copy_list_parse(UUID, (const char *)data, size, got, LOCAL_COPY_LIST_MAX);
	int len, m;

	if (n < 0)
		return 0;
	if ((size_t)n > LOCAL_COPY_LIST_MAX)
		abort();
	for (int k = 0; k < n; k++)
		if (!local_copy_name_ok(got[k].name) || got[k].ctime_nsec > 999999999 ||
		    got[k].ctime_sec < 0 || got[k].copy_mtime_nsec > 999999999 ||
		    got[k].copy_mtime_sec < 0 || strchr(got[k].name, '/'))
			abort();
	len = local_copy_list_format(UUID, got, (size_t)n, text, sizeof(text));
	if (len < 0)
		abort();
	m = local_copy_list_parse(UUID, text, (size_t)len, again, LOCAL_COPY_LIST_MAX);
	if (m != n)
		abort();
	for (int k = 0; k < n; k++)
		if (got[k].ino != again[k].ino || got[k].size != again[k].size ||
		    got[k].layout_print != again[k].layout_print ||
		    got[k].copy_ino != again[k].copy_ino ||
		    got[k].copy_mtime_sec != again[k].copy_mtime_sec ||
		    got[k].copy_mtime_nsec != again[k].copy_mtime_nsec ||
		    got[k].ctime_sec != again[k].ctime_sec ||
		    got[k].ctime_nsec != again[k].ctime_nsec || got[k].built != again[k].built ||
		    strcmp(got[k].name, again[k].name) != 0)
			abort();
	return 0;
}
