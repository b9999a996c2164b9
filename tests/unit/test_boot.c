/* Unit tests for common/boot.c: this boot's tag, and the tags names carry
 * (a staging copy's ".c<tag>", see STAGING_COPY_SUFFIX). */
#include <criterion/criterion.h>

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "boot.h"
#include "reconcile_job.h"
#include "tmp_dir.h"

Test(boot, the_tag_is_the_ids_first_hex_digits)
{
	char id[64], tag[BOOT_TAG_LEN + 1];

	boot_id(id, sizeof(id));
	cr_assert_eq(strlen(id), 36, "boot id '%s'", id);
	cr_assert(boot_tag(tag));
	cr_assert_eq(strlen(tag), BOOT_TAG_LEN);
	cr_assert(strncmp(tag, id, BOOT_TAG_LEN) == 0 || strchr(id, '-') < id + BOOT_TAG_LEN,
		  "tag %s of id %s", tag, id);
	for (int k = 0; k < BOOT_TAG_LEN; k++)
		cr_assert(isxdigit((unsigned char)tag[k]) && !isupper((unsigned char)tag[k]));
}

Test(boot, names_carry_tags)
{
	const char *name = "12-3-4-5-s6.c0123abcd";

	cr_assert_str_eq(boot_tag_of_name(name, ".c"), "0123abcd");
	cr_assert_null(boot_tag_of_name("12-3-4-5-s6.p", ".c"));
	cr_assert_null(boot_tag_of_name("12-3-4-5-s6.c0123abc", ".c"), "a tag too short");
	cr_assert_null(boot_tag_of_name("12-3-4-5-s6.c0123abcd0", ".c"), "a tag too long");
	cr_assert_null(boot_tag_of_name("12-3-4-5-s6.c0123abcx", ".c"), "not hex");
	cr_assert_null(boot_tag_of_name("12-3-4-5-s6.x0123abcd", ".c"), "another mark");
	cr_assert_null(boot_tag_of_name("c0123ab", ".c"));
	cr_assert_null(boot_tag_of_name("", ".c"));
}

Test(boot, a_copy_is_whole_under_its_boot_or_a_flushed_run)
{
	struct boot_set flushed = { .n = 0 };
	const char *name = "7-99-4242-3-s1.c0123abcd";
	char run[BOOT_RUN_LEN + 1];
	const char *tag = staging_copy_run(name, run);

	cr_assert(tag && strcmp(tag, "0123abcd") == 0);
	cr_assert_str_eq(run, "0123abcd-4242");
	cr_assert_eq(boot_name_state(tag, run, "0123abcd", &flushed), BOOT_NAME_WHOLE);
	cr_assert_eq(boot_name_state(tag, run, "ffffffff", &flushed), BOOT_NAME_TORN);
	boot_set_add(&flushed, "0123abcd-4243"); /* another run of that boot */
	cr_assert_eq(boot_name_state(tag, run, "ffffffff", &flushed), BOOT_NAME_TORN);
	boot_set_add(&flushed, "0123abcd-4242");
	cr_assert_eq(boot_name_state(tag, run, "ffffffff", &flushed), BOOT_NAME_WHOLE);
	cr_assert_eq(boot_name_state(tag, run, "", &flushed), BOOT_NAME_UNKNOWN,
		     "an unknown boot decides nothing");
	cr_assert_eq(boot_name_state(NULL, NULL, "ffffffff", &flushed), BOOT_NAME_UNTAGGED);
	/* An orphan's name still says its run; other names none. */
	cr_assert(staging_copy_run("7-99-4242-3-s1.c0123abcd.orphan", run));
	cr_assert_str_eq(run, "0123abcd-4242");
	cr_assert_null(staging_copy_run("7-99-4242-3-s1.p", run));
	cr_assert_null(staging_copy_run("7-99-4242-3", run));
	cr_assert(staging_copy_run("7-99-x-3-s1.c0123abcd", run), "no pid: still a copy");
	cr_assert_str_eq(run, "", "of no known run");
	cr_assert_eq(boot_name_state("0123abcd", run, "ffffffff", &flushed), BOOT_NAME_TORN);
	cr_assert_eq(boot_name_state("0123abcd", "0123abcd-4242", "ffffffff", NULL),
		     BOOT_NAME_UNKNOWN, "runs that could not be read decide nothing");
	cr_assert_eq(boot_name_state("0123abcd", "0123abcd-4242", "0123abcd", NULL),
		     BOOT_NAME_WHOLE, "this boot's, whatever the runs");
	cr_assert(staging_copy_run("7.c0123abcd", run) && run[0] == '\0');
	cr_assert_null(staging_copy_run("7-99-4242-3-s1.c0123abcd.1796434672.orphan", run),
		       "one kept aside");
}

Test(boot, the_flushed_set_is_kept_across_a_store_and_a_load)
{
	char dir[] = "/tmp/ferry-boot-XXXXXX";
	struct boot_set s = { .n = 0 }, back;
	int dfd;

	cr_assert(mkdtemp(dir));
	dfd = open(dir, O_RDONLY | O_DIRECTORY);
	cr_assert(dfd >= 0);
	cr_assert_eq(boot_set_load(dfd, &back), 0, "no file: an empty set");
	cr_assert_eq(back.n, 0);
	boot_set_add(&s, "00000001-1");
	boot_set_add(&s, "00000002-4194304");
	boot_set_add(&s, "00000001-1"); /* once */
	cr_assert_eq(s.n, 2);
	cr_assert_eq(boot_set_store(dfd, &s), 0);
	cr_assert_eq(boot_set_load(dfd, &back), 0);
	cr_assert_eq(back.n, 2);
	cr_assert(boot_set_has(&back, "00000001-1") && boot_set_has(&back, "00000002-4194304"));
	cr_assert(boot_set_remove(&back, "00000001-1"));
	cr_assert_not(boot_set_remove(&back, "00000001-1"));
	cr_assert_eq(boot_set_store(dfd, &back), 0);
	cr_assert_eq(boot_set_load(dfd, &s), 0);
	cr_assert(s.n == 1 && boot_set_has(&s, "00000002-4194304"));
	/* Full, with the longest runs: all kept, the oldest going first. */
	for (int k = 0; k < BOOT_SET_MAX + 3; k++) {
		char t[BOOT_RUN_LEN + 1];
		snprintf(t, sizeof(t), "%08x-%u", 0x100 + k, 4000000000u + (unsigned)k);
		boot_set_add(&s, t);
	}
	cr_assert_eq(s.n, BOOT_SET_MAX);
	cr_assert_not(boot_set_has(&s, "00000002-4194304"));
	cr_assert_eq(boot_set_store(dfd, &s), 0);
	cr_assert_eq(boot_set_load(dfd, &back), 0);
	cr_assert_eq(back.n, BOOT_SET_MAX);
	for (size_t k = 0; k < s.n; k++)
		cr_assert(boot_set_has(&back, s.run[k]), "%s lost", s.run[k]);
	/* A damaged file: what is no run is skipped. */
	int fd = openat(dfd, BOOT_FLUSHED_NAME, O_WRONLY | O_TRUNC);
	cr_assert(fd >= 0);
	const char *text = "zzzz\n0000000a-7\n0000000a\n0000000b-x\n";
	cr_assert_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
	close(fd);
	cr_assert_eq(boot_set_load(dfd, &s), 0);
	cr_assert(s.n == 1 && boot_set_has(&s, "0000000a-7"));
	/* A file larger than any set: an error, never half read. */
	fd = openat(dfd, BOOT_FLUSHED_NAME, O_WRONLY | O_TRUNC);
	for (int k = 0; k < 200; k++)
		cr_assert_eq(write(fd, "0000000a-1234567\n", 17), 17);
	close(fd);
	cr_assert_eq(boot_set_load(dfd, &s), -EFBIG);
	cr_assert_eq(s.n, 0);
	close(dfd);
	rm_dir(dir);
}
