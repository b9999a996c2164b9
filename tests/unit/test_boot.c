/* Unit tests for common/boot.c: this boot's tag, and the tags names carry
 * (a staging copy's ".c<tag>", see STAGING_COPY_SUFFIX). */
#include <criterion/criterion.h>

#include <ctype.h>
#include <fcntl.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "boot.h"
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

Test(boot, a_name_is_whole_under_its_boot_or_a_flushed_one)
{
	struct boot_set flushed = { .n = 0 };
	char name[64];

	snprintf(name, sizeof(name), "7-s1.c%s", "0123abcd");
	cr_assert_eq(boot_name_state(name, ".c", "0123abcd", &flushed), BOOT_NAME_WHOLE);
	cr_assert_eq(boot_name_state(name, ".c", "ffffffff", &flushed), BOOT_NAME_TORN);
	boot_set_add(&flushed, "0123abcd");
	cr_assert_eq(boot_name_state(name, ".c", "ffffffff", &flushed), BOOT_NAME_WHOLE);
	cr_assert_eq(boot_name_state(name, ".c", "", &flushed), BOOT_NAME_UNKNOWN,
		     "an unknown boot decides nothing");
	cr_assert_eq(boot_name_state("7-s1.p", ".c", "ffffffff", &flushed), BOOT_NAME_UNTAGGED);
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
	boot_set_add(&s, "00000001");
	boot_set_add(&s, "00000002");
	boot_set_add(&s, "00000001"); /* once */
	cr_assert_eq(s.n, 2);
	cr_assert_eq(boot_set_store(dfd, &s), 0);
	cr_assert_eq(boot_set_load(dfd, &back), 0);
	cr_assert_eq(back.n, 2);
	cr_assert(boot_set_has(&back, "00000001") && boot_set_has(&back, "00000002"));
	cr_assert(boot_set_remove(&back, "00000001"));
	cr_assert_not(boot_set_remove(&back, "00000001"));
	cr_assert_eq(boot_set_store(dfd, &back), 0);
	cr_assert_eq(boot_set_load(dfd, &s), 0);
	cr_assert(s.n == 1 && !boot_set_has(&s, "00000001") && boot_set_has(&s, "00000002"));
	/* Full: the oldest goes. */
	for (int k = 0; k < BOOT_SET_MAX + 3; k++) {
		char t[BOOT_TAG_LEN + 1];
		snprintf(t, sizeof(t), "%08x", 0x100 + k);
		boot_set_add(&s, t);
	}
	cr_assert_eq(s.n, BOOT_SET_MAX);
	cr_assert_not(boot_set_has(&s, "00000002"));
	cr_assert(boot_set_has(&s, "00000142"));
	/* A damaged file: what is no tag is skipped. */
	int fd = openat(dfd, BOOT_FLUSHED_NAME, O_WRONLY | O_TRUNC);
	cr_assert(fd >= 0);
	cr_assert_eq(write(fd, "zzzz\n0000000a\n123\n", 19), 19);
	close(fd);
	cr_assert_eq(boot_set_load(dfd, &s), 0);
	cr_assert(s.n == 1 && boot_set_has(&s, "0000000a"));
	close(dfd);
	rm_dir(dir);
}
