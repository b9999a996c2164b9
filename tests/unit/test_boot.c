/* Unit tests for common/boot.c: this boot's tag, and the tags names carry
 * (a staging copy's ".c<tag>", see STAGING_COPY_SUFFIX). */
#include <criterion/criterion.h>

#include <ctype.h>
#include <stdio.h>
#include <string.h>

#include "boot.h"

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

Test(boot, only_another_boots_names_are_of_another_boot)
{
	char tag[BOOT_TAG_LEN + 1], name[64];

	cr_assert(boot_tag(tag));
	snprintf(name, sizeof(name), "7-s1.c%s", tag);
	cr_assert_not(boot_name_of_other_boot(name, ".c"));
	name[strlen(name) - 1] = tag[BOOT_TAG_LEN - 1] == '0' ? '1' : '0';
	cr_assert(boot_name_of_other_boot(name, ".c"));
	cr_assert_not(boot_name_of_other_boot("7-s1.p", ".c"), "a name without a tag");
}
