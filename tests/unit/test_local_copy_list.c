/*
 * local_copy_list.c: the list of local copies a clean stop leaves for the
 * next mount, written and read back, and every way a damaged or hostile
 * one is refused as a whole.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "local_copy_list.h"

#define UUID "7557e18c-4978-4254-b161-c33e54e2b388"
#define HEAD "ferry-local-copies 1 " UUID "\n"

static int parse(const char *text, struct local_copy_entry *out, size_t max)
{
	return local_copy_list_parse(UUID, text, strlen(text), out, max);
}

static void expect_same(const struct local_copy_entry *a, const struct local_copy_entry *b)
{
	cr_assert_eq(a->ino, b->ino);
	cr_assert_eq(a->size, b->size);
	cr_assert_eq(a->ctime_sec, b->ctime_sec);
	cr_assert_eq(a->ctime_nsec, b->ctime_nsec);
	cr_assert_eq(a->layout_print, b->layout_print);
	cr_assert_eq(a->copy_ino, b->copy_ino);
	cr_assert_eq(a->copy_mtime_sec, b->copy_mtime_sec);
	cr_assert_eq(a->copy_mtime_nsec, b->copy_mtime_nsec);
	cr_assert_eq(a->built, b->built);
	cr_assert_str_eq(a->name, b->name);
}

static void refused(const char *text)
{
	struct local_copy_entry e[4];

	cr_assert_eq(parse(text, e, 4), -EINVAL, "accepted: \"%s\"", text);
}

Test(local_copy_list, written_and_read_back)
{
	struct local_copy_entry in[3] = {
		{ .ino = 2, .size = 4194304, .ctime_sec = 1796556444, .ctime_nsec = 114027623,
		  .layout_print = 0x9e3779b97f4a7c15u, .copy_ino = 1234, .copy_mtime_sec = 1796556445,
		  .copy_mtime_nsec = 7, .name = ".kept-6309-2-0" },
		{ .ino = UINT64_MAX, .size = UINT64_MAX, .ctime_sec = INT64_MAX,
		  .ctime_nsec = 999999999, .layout_print = UINT64_MAX, .copy_ino = UINT64_MAX,
		  .copy_mtime_sec = INT64_MAX, .copy_mtime_nsec = 999999999, .built = true,
		  .name = ".kept-1-18446744073709551615-b7" },
		{ .ino = 77, .size = 1048576, .ctime_sec = 0, .ctime_nsec = 0,
		  .name = ".kept-4194304-77-h12" },
	}, out[3];
	char text[LOCAL_COPY_LIST_TEXT_MAX];
	int len = local_copy_list_format(UUID, in, 3, text, sizeof(text));

	cr_assert_gt(len, 0);
	cr_assert_eq(strlen(text), (size_t)len);
	cr_assert(strncmp(text, HEAD, strlen(HEAD)) == 0, "%s", text);
	cr_assert_eq(parse(text, out, 3), 3);
	for (int k = 0; k < 3; k++)
		expect_same(&in[k], &out[k]);
	/* No room for one more: refused, not cut. */
	cr_assert_eq(parse(text, out, 2), -EINVAL);
	/* Another volume's. */
	cr_assert_eq(local_copy_list_parse("00000000-0000-0000-0000-000000000000", text,
					   (size_t)len, out, 3), -EINVAL);
	/* Cut short anywhere: refused (or, at a line's end, fewer entries). */
	for (int cut = 0; cut < len; cut++) {
		int n = local_copy_list_parse(UUID, text, (size_t)cut, out, 3);

		cr_assert(n == -EINVAL || (cut > 0 && text[cut - 1] == '\n' && n >= 0 && n < 3),
			  "cut at %d: %d", cut, n);
	}
	/* No room to write it. */
	cr_assert_eq(local_copy_list_format(UUID, in, 3, text, 40), -ENOSPC);
	cr_assert_eq(local_copy_list_format(UUID, in, 3, text, (size_t)len), -ENOSPC);
	cr_assert_eq(local_copy_list_format(UUID, in, 3, text, (size_t)len + 1), len);
}

Test(local_copy_list, an_empty_list)
{
	struct local_copy_entry e[1] = { { 0 } };
	char text[128];

	cr_assert_eq(local_copy_list_format(UUID, e, 0, text, sizeof(text)), (int)strlen(HEAD));
	cr_assert_eq(parse(text, e, 1), 0);
}

Test(local_copy_list, only_copies_names_are_written)
{
	struct local_copy_entry e = { .ino = 2, .size = 1, .name = "../../etc/passwd" };
	char text[512];

	cr_assert_eq(local_copy_list_format(UUID, &e, 1, text, sizeof(text)), -EINVAL);
	snprintf(e.name, sizeof(e.name), ".kept-1-2-3");
	e.ctime_sec = -1;
	cr_assert_eq(local_copy_list_format(UUID, &e, 1, text, sizeof(text)), -EINVAL);
	e.ctime_sec = 1;
	e.copy_mtime_nsec = 1000000000;
	cr_assert_eq(local_copy_list_format(UUID, &e, 1, text, sizeof(text)), -EINVAL);
	e.copy_mtime_nsec = 0;
	cr_assert_gt(local_copy_list_format(UUID, &e, 1, text, sizeof(text)), 0);
}

Test(local_copy_list, names)
{
	cr_assert(local_copy_name_ok(".kept-1-2-3"));
	cr_assert(local_copy_name_ok(".kept-65534-77-b12"));
	cr_assert_not(local_copy_name_ok(".kept-"));
	cr_assert_not(local_copy_name_ok(".kept-1"));
	cr_assert_not(local_copy_name_ok(".pool-1-2"));
	cr_assert_not(local_copy_name_ok(".kept-1/../x"));
	cr_assert_not(local_copy_name_ok(".kept-1-2-3.tmp"));
	cr_assert_not(local_copy_name_ok(".kept-1-2-3 "));
	cr_assert_not(local_copy_name_ok(".kept-1-2-A"));
	cr_assert_not(local_copy_name_ok(".kept-1-2-3\n"));
	cr_assert_not(local_copy_name_ok(
		".kept-111111111111111111111111111111111111111111111111111111111111"));
}

Test(local_copy_list, damaged_lists_are_refused_whole)
{
	refused("");
	refused("ferry-local-copies 1 " UUID);                 /* no newline */
	refused("ferry-local-copies 2 " UUID "\n");            /* a later version */
	refused("ferry-local-copies 1 " UUID "x\n");           /* another uuid */
	refused("ferry-local-copies 1  " UUID "\n");
	/* A good line is "2 4194304 1 2 3 4 5 6 0 .kept-1-2-3". */
	refused(HEAD "2 4194304 1 2 3 4 5 6 0 .kept-1-2-3");           /* cut short */
	refused(HEAD "2 4194304 1 2 3 4 5 6 0 .kept-1-2-3\n\n");       /* an empty line */
	refused(HEAD "2 4194304 1 2 3 4 5 6 0 ../../victim\n");        /* out of the directory */
	refused(HEAD "2 4194304 1 2 3 4 5 6 0 .kept-1-2-3/x\n");
	refused(HEAD "2 4194304 1 2 3 4 5 6 0 .kept-1-2-3 x\n");       /* one field too many */
	refused(HEAD "2 4194304 1 2 3 4 5 0 .kept-1-2-3\n");           /* one too few */
	refused(HEAD "2 4194304 1 2 0 .kept-1-2-3\n");                 /* the older form */
	refused(HEAD "-2 4194304 1 2 3 4 5 6 0 .kept-1-2-3\n");        /* a sign */
	refused(HEAD "+2 4194304 1 2 3 4 5 6 0 .kept-1-2-3\n");
	refused(HEAD " 2 4194304 1 2 3 4 5 6 0 .kept-1-2-3\n");        /* a space too many */
	refused(HEAD "2  4194304 1 2 3 4 5 6 0 .kept-1-2-3\n");
	refused(HEAD "2 4194304 1 1000000000 3 4 5 6 0 .kept-1-2-3\n"); /* nsec out of range */
	refused(HEAD "2 4194304 1 2 3 4 5 1000000000 0 .kept-1-2-3\n");
	refused(HEAD "2 4194304 9223372036854775808 2 3 4 5 6 0 .kept-1-2-3\n");
	refused(HEAD "2 4194304 1 2 3 4 9223372036854775808 6 0 .kept-1-2-3\n");
	refused(HEAD "18446744073709551616 4194304 1 2 3 4 5 6 0 .kept-1-2-3\n");
	refused(HEAD "2 4194304 1 2 18446744073709551616 4 5 6 0 .kept-1-2-3\n");
	refused(HEAD "2 4194304 1 2 3 4 5 6 2 .kept-1-2-3\n");         /* built is 0 or 1 */
	refused(HEAD "2 0x10 1 2 3 4 5 6 0 .kept-1-2-3\n");
	refused(HEAD "2 4194304 1 2 3 4 5 6 0 .kept-1-2-3\r\n");
	refused(HEAD "2 4194304 1 2 3 4 5 6 0 \n");

	/* A NUL anywhere. */
	char text[] = HEAD "2 4194304 1 2 3 4 5 6 0 .kept-1-2-3\n";
	struct local_copy_entry e[2];

	cr_assert_eq(local_copy_list_parse(UUID, text, sizeof(text) - 1, e, 2), 1);
	text[sizeof(HEAD) + 3] = '\0';
	cr_assert_eq(local_copy_list_parse(UUID, text, sizeof(text) - 1, e, 2), -EINVAL);
}

Test(local_copy_list, at_most_the_limit)
{
	static struct local_copy_entry in[LOCAL_COPY_LIST_MAX + 1], out[LOCAL_COPY_LIST_MAX + 1];
	static char text[LOCAL_COPY_LIST_TEXT_MAX + 200];
	int len;

	for (size_t k = 0; k <= LOCAL_COPY_LIST_MAX; k++) {
		in[k] = (struct local_copy_entry){ .ino = UINT64_MAX - k, .size = UINT64_MAX,
						   .ctime_sec = INT64_MAX, .ctime_nsec = 999999999,
						   .layout_print = UINT64_MAX, .copy_ino = UINT64_MAX,
						   .copy_mtime_sec = INT64_MAX,
						   .copy_mtime_nsec = 999999999, .built = true };
		/* The longest name there is. */
		snprintf(in[k].name, sizeof(in[k].name), ".kept-%020zu-%036zu", k, k);
	}
	cr_assert_eq(local_copy_list_format(UUID, in, LOCAL_COPY_LIST_MAX + 1, text, sizeof(text)),
		     -EINVAL);
	len = local_copy_list_format(UUID, in, LOCAL_COPY_LIST_MAX, text,
				     LOCAL_COPY_LIST_TEXT_MAX);
	cr_assert_gt(len, 0, "the longest list does not fit LOCAL_COPY_LIST_TEXT_MAX");
	cr_assert_eq(parse(text, out, LOCAL_COPY_LIST_MAX + 1), (int)LOCAL_COPY_LIST_MAX);
	/* One line more than the limit: refused, whatever room the caller has. */
	snprintf(text + len, sizeof(text) - (size_t)len, "1 1 1 1 1 1 1 1 0 .kept-1-1-1\n");
	cr_assert_eq(parse(text, out, LOCAL_COPY_LIST_MAX + 1), -EINVAL);
}
