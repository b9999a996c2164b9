/* meta_names: the counting rules that keep its answers safe (meta_names.h). */
#include <criterion/criterion.h>

#include <stdio.h>
#include <string.h>

#include "meta_names.h"

static struct meta_names *s;

static void setup(void)
{
	cr_assert_eq(meta_names_new(100, &s), 0);
}

static void teardown(void)
{
	meta_names_free(s);
}

TestSuite(meta_names, .init = setup, .fini = teardown);

static int absent(uint64_t dir, const char *name)
{
	return meta_names_absent(s, dir, name, strlen(name));
}

Test(meta_names, only_directories_made_here_are_answered)
{
	cr_assert_eq(absent(7, "x"), 0, "an unknown directory is the database's to answer");
	meta_names_add(s, 7, "x", 1);
	cr_assert_eq(absent(7, "y"), 0);
	meta_names_dir_made(s, 7);
	cr_assert_eq(absent(7, "y"), 1);
	meta_names_add(s, 7, "y", 1);
	cr_assert_eq(absent(7, "y"), 0);
	cr_assert_eq(absent(8, "y"), 0);
	meta_names_dir_gone(s, 7);
	cr_assert_eq(absent(7, "z"), 0);
}

Test(meta_names, a_name_counted_twice_stays_until_removed_twice)
{
	meta_names_dir_made(s, 3);
	meta_names_add(s, 3, "a", 1);
	meta_names_add(s, 3, "a", 1); /* more than is there: safe */
	meta_names_del(s, 3, "a", 1);
	cr_assert_eq(absent(3, "a"), 0);
	meta_names_del(s, 3, "a", 1);
	cr_assert_eq(absent(3, "a"), 1);
}

Test(meta_names, a_name_the_set_missed_stops_its_answers)
{
	meta_names_dir_made(s, 3);
	meta_names_add(s, 3, "a", 1);
	/* removed from the database, never counted here: the set was wrong */
	meta_names_del(s, 3, "b", 1);
	cr_assert_eq(absent(3, "c"), 0);
	meta_names_dir_made(s, 4);
	meta_names_taken(s, 4, "t", 1); /* the database had it */
	cr_assert_eq(absent(4, "u"), 0);
	meta_names_dir_made(s, 5);
	meta_names_add(s, 5, "t", 1);
	meta_names_taken(s, 5, "t", 1); /* counted: still known */
	cr_assert_eq(absent(5, "u"), 1);
}

Test(meta_names, past_its_bound_it_forgets_everything)
{
	struct meta_names_stats st;
	char name[16];

	meta_names_dir_made(s, 9);
	for (int i = 0; i < 100; i++) {
		snprintf(name, sizeof(name), "n%d", i);
		meta_names_add(s, 9, name, strlen(name));
	}
	meta_names_stats_get(s, &st);
	cr_assert_eq(st.names, 100);
	cr_assert_eq(absent(9, "n100"), 1);
	for (int i = 0; i < 100; i++) {
		snprintf(name, sizeof(name), "n%d", i);
		cr_assert_eq(absent(9, name), 0, "%s", name);
	}
	meta_names_add(s, 9, "n100", 4);
	meta_names_stats_get(s, &st);
	cr_assert_eq(st.resets, 1);
	cr_assert_eq(st.names, 0);
	cr_assert_eq(absent(9, "n100"), 0, "after a reset nothing is known");
	meta_names_dir_made(s, 10);
	cr_assert_eq(absent(10, "n"), 1);
	meta_names_forget(s);
	cr_assert_eq(absent(10, "n"), 0);
}

Test(meta_names, removals_and_adds_keep_the_table_right_as_it_grows)
{
	char name[16];

	meta_names_free(s);
	cr_assert_eq(meta_names_new(100000, &s), 0);
	for (uint64_t d = 100; d < 110; d++)
		meta_names_dir_made(s, d);
	for (int round = 0; round < 3; round++) {
		for (int i = 0; i < 5000; i++) {
			snprintf(name, sizeof(name), "f%d", i);
			meta_names_add(s, 100 + (uint64_t)(i % 10), name, strlen(name));
		}
		for (int i = 0; i < 5000; i += 2) {
			snprintf(name, sizeof(name), "f%d", i);
			meta_names_del(s, 100 + (uint64_t)(i % 10), name, strlen(name));
		}
		for (int i = 0; i < 5000; i++) {
			snprintf(name, sizeof(name), "f%d", i);
			cr_assert_eq(absent(100 + (uint64_t)(i % 10), name), i % 2 == 0, "%s", name);
		}
		for (int i = 1; i < 5000; i += 2) {
			snprintf(name, sizeof(name), "f%d", i);
			meta_names_del(s, 100 + (uint64_t)(i % 10), name, strlen(name));
		}
	}
	struct meta_names_stats st;
	meta_names_stats_get(s, &st);
	cr_assert_eq(st.names, 0);
	cr_assert_eq(st.dirs, 10);
}

static void list(uint64_t dir, const char *const *names, int n, uint64_t first_cookie)
{
	meta_names_scan(s, dir, 0);
	for (int i = 0; i < n; i++)
		meta_names_scan_name(s, dir, names[i], strlen(names[i]), first_cookie + (uint64_t)i);
	meta_names_scan_end(s, dir, first_cookie + (uint64_t)n - 1);
}

Test(meta_names, a_whole_listing_with_nothing_changed_makes_a_directory_known)
{
	static const char *const names[] = { "a", "b", "c" };
	struct meta_names_stats st;

	list(20, names, 3, 5);
	cr_assert_eq(absent(20, "a"), 0);
	cr_assert_eq(absent(20, "c"), 0);
	cr_assert_eq(absent(20, "d"), 1);
	meta_names_stats_get(s, &st);
	cr_assert_eq(st.scans, 1);
	cr_assert_eq(st.names, 3);

	/* A name changed anywhere during the listing: it teaches nothing. */
	meta_names_scan(s, 21, 0);
	meta_names_scan_name(s, 21, "a", 1, 1);
	meta_names_add(s, 99, "x", 1);
	meta_names_scan_name(s, 21, "b", 1, 2);
	meta_names_scan_end(s, 21, 2);
	cr_assert_eq(absent(21, "z"), 0);

	/* Parts out of order, or one missing: nothing learnt. */
	meta_names_scan(s, 22, 0);
	meta_names_scan_name(s, 22, "a", 1, 1);
	meta_names_scan(s, 22, 7);
	meta_names_scan_name(s, 22, "b", 1, 8);
	meta_names_scan_end(s, 22, 8);
	cr_assert_eq(absent(22, "z"), 0);

	/* In parts, each starting where the last ended: learnt. */
	meta_names_scan(s, 23, 0);
	meta_names_scan_name(s, 23, "a", 1, 1);
	meta_names_scan(s, 23, 1);
	meta_names_scan_name(s, 23, "b", 1, 4);
	meta_names_scan(s, 23, 4);
	meta_names_scan_end(s, 23, 4);
	cr_assert_eq(absent(23, "b"), 0);
	cr_assert_eq(absent(23, "z"), 1);

	/* An empty directory listed whole. */
	meta_names_scan(s, 24, 0);
	meta_names_scan_end(s, 24, 0);
	cr_assert_eq(absent(24, "z"), 1);

	/* Larger than the bound: not learnt. */
	meta_names_scan(s, 25, 0);
	for (int i = 0; i < 200; i++)
		meta_names_scan_name(s, 25, "n", 1, (uint64_t)i + 1);
	meta_names_scan_end(s, 25, 200);
	cr_assert_eq(absent(25, "z"), 0);
}
