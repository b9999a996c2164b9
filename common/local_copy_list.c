#include "local_copy_list.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#define LIST_MAGIC "ferry-local-copies 1 "

bool local_copy_name_ok(const char *name)
{
	size_t len = strnlen(name, LOCAL_COPY_NAME_MAX);

	if (len < 8 || len >= LOCAL_COPY_NAME_MAX || strncmp(name, ".kept-", 6) != 0)
		return false;
	for (size_t k = 6; k < len; k++)
		if (!((name[k] >= '0' && name[k] <= '9') || (name[k] >= 'a' && name[k] <= 'z') ||
		      name[k] == '-'))
			return false;
	return true;
}

/* A decimal number of digits only (no sign, no space), at most max, then
 * one space: *p moves past both. */
static bool field_u64(const char **p, const char *end, uint64_t max, uint64_t *v)
{
	const char *s = *p;
	uint64_t n = 0;

	if (s == end || *s < '0' || *s > '9')
		return false;
	for (; s < end && *s >= '0' && *s <= '9'; s++) {
		uint64_t d = (uint64_t)(*s - '0');

		if (n > max / 10 || d > max - n * 10)
			return false;
		n = n * 10 + d;
	}
	if (s == end || *s != ' ')
		return false;
	*v = n;
	*p = s + 1;
	return true;
}

/* One entry line, [p, end) without its newline. */
static bool line_parse(const char *p, const char *end, struct local_copy_entry *e)
{
	uint64_t sec, nsec, msec, mnsec, built;
	size_t len;

	memset(e, 0, sizeof(*e));
	if (!field_u64(&p, end, UINT64_MAX, &e->ino) || !field_u64(&p, end, UINT64_MAX, &e->size) ||
	    !field_u64(&p, end, INT64_MAX, &sec) || !field_u64(&p, end, 999999999, &nsec) ||
	    !field_u64(&p, end, UINT64_MAX, &e->layout_print) ||
	    !field_u64(&p, end, UINT64_MAX, &e->copy_ino) ||
	    !field_u64(&p, end, INT64_MAX, &msec) || !field_u64(&p, end, 999999999, &mnsec) ||
	    !field_u64(&p, end, 1, &built))
		return false;
	len = (size_t)(end - p);
	if (len >= sizeof(e->name))
		return false;
	memcpy(e->name, p, len);
	e->name[len] = '\0';
	e->ctime_sec = (int64_t)sec;
	e->ctime_nsec = (uint32_t)nsec;
	e->copy_mtime_sec = (int64_t)msec;
	e->copy_mtime_nsec = (uint32_t)mnsec;
	e->built = built == 1;
	return local_copy_name_ok(e->name);
}

int local_copy_list_parse(const char *uuid, const char *text, size_t len,
			  struct local_copy_entry *out, size_t max)
{
	const char *p = text, *end = text + len, *nl;
	size_t n = 0, ulen = strlen(uuid);

	if (memchr(text, '\0', len))
		return -EINVAL;
	/* The head: magic, this volume's uuid, a newline. */
	if (len < sizeof(LIST_MAGIC) - 1 + ulen + 1 ||
	    memcmp(p, LIST_MAGIC, sizeof(LIST_MAGIC) - 1) != 0 ||
	    memcmp(p + sizeof(LIST_MAGIC) - 1, uuid, ulen) != 0 ||
	    p[sizeof(LIST_MAGIC) - 1 + ulen] != '\n')
		return -EINVAL;
	p += sizeof(LIST_MAGIC) - 1 + ulen + 1;
	/* Every line ends with a newline: a list cut short is not one. */
	for (; p < end; p = nl + 1) {
		nl = memchr(p, '\n', (size_t)(end - p));
		if (!nl || n == max || n == LOCAL_COPY_LIST_MAX || !line_parse(p, nl, &out[n]))
			return -EINVAL;
		n++;
	}
	return (int)n;
}

int local_copy_list_format(const char *uuid, const struct local_copy_entry *e, size_t n,
			   char *buf, size_t cap)
{
	size_t len;
	int put;

	if (n > LOCAL_COPY_LIST_MAX)
		return -EINVAL;
	put = snprintf(buf, cap, LIST_MAGIC "%s\n", uuid);
	if (put < 0 || (size_t)put >= cap)
		return -ENOSPC;
	len = (size_t)put;
	for (size_t k = 0; k < n; k++) {
		if (!local_copy_name_ok(e[k].name) || e[k].ctime_sec < 0 ||
		    e[k].ctime_nsec > 999999999 || e[k].copy_mtime_sec < 0 ||
		    e[k].copy_mtime_nsec > 999999999)
			return -EINVAL;
		put = snprintf(buf + len, cap - len,
			       "%" PRIu64 " %" PRIu64 " %" PRId64 " %" PRIu32 " %" PRIu64 " %" PRIu64
			       " %" PRId64 " %" PRIu32 " %d %s\n",
			       e[k].ino, e[k].size, e[k].ctime_sec, e[k].ctime_nsec, e[k].layout_print,
			       e[k].copy_ino, e[k].copy_mtime_sec, e[k].copy_mtime_nsec,
			       e[k].built ? 1 : 0, e[k].name);
		if (put < 0 || (size_t)put >= cap - len)
			return -ENOSPC;
		len += (size_t)put;
	}
	return (int)len;
}
