/* Unit tests for common/staging_owner.c (which volume a staging directory
 * is) and dirs_empty() (what ferry format --force does to the replaced
 * volume's staging directory). */
#include <criterion/criterion.h>

#include <dirent.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dirs.h"
#include "staging_owner.h"
#include "tmp_dir.h"

#define VOL_A "0a68999b-b469-4ee1-ac92-1d6bf696f40f"
#define VOL_B "7a017e79-cfa8-455e-b70a-ad26ac303f2e"

static char dir[64];
static int dfd = -1;

static void setup(void)
{
	snprintf(dir, sizeof(dir), "/tmp/ferry-owner.XXXXXX");
	cr_assert_not_null(mkdtemp(dir));
	dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	cr_assert_geq(dfd, 0);
}

static void teardown(void)
{
	if (dfd >= 0)
		close(dfd);
	rm_dir(dir);
}

TestSuite(staging_owner, .init = setup, .fini = teardown);

static void put_record(const char *text)
{
	int fd = openat(dfd, STAGING_OWNER_NAME, O_WRONLY | O_CREAT | O_TRUNC, 0600);

	cr_assert_geq(fd, 0);
	cr_assert_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
	close(fd);
}

static int entries(void)
{
	DIR *d = opendir(dir);
	struct dirent *de;
	int n = 0;

	cr_assert_not_null(d);
	while ((de = readdir(d)))
		n += strcmp(de->d_name, ".") != 0 && strcmp(de->d_name, "..") != 0;
	closedir(d);
	return n;
}

Test(staging_owner, the_first_volume_claims_the_directory_and_only_it_may_use_it)
{
	char other[64], text[128] = "";

	cr_assert_eq(staging_owner_claim(dfd, VOL_A, other, sizeof(other)), 0);
	int fd = openat(dfd, STAGING_OWNER_NAME, O_RDONLY);
	cr_assert_geq(fd, 0);
	cr_assert_gt(read(fd, text, sizeof(text) - 1), 0);
	close(fd);
	cr_assert_str_eq(text, VOL_A "\n");
	cr_assert_eq(entries(), 1, "the record's temporary file is left behind");

	cr_assert_eq(staging_owner_claim(dfd, VOL_A, other, sizeof(other)), 0, "its own again");
	cr_assert_eq(staging_owner_claim(dfd, VOL_B, other, sizeof(other)), -EEXIST);
	cr_assert_str_eq(other, VOL_A, "the owner named");
}

Test(staging_owner, a_record_that_names_no_volume_is_refused)
{
	char other[64];

	put_record("");
	cr_assert_eq(staging_owner_claim(dfd, VOL_A, other, sizeof(other)), -EBADMSG, "empty");
	put_record(VOL_A); /* no newline: cut short */
	cr_assert_eq(staging_owner_claim(dfd, VOL_A, other, sizeof(other)), -EBADMSG);
	put_record("not a\tvolume\n");
	cr_assert_eq(staging_owner_claim(dfd, VOL_A, other, sizeof(other)), -EBADMSG);
	cr_assert_str_eq(other, "not a?volume", "what it holds, printable");
	cr_assert_eq(staging_owner_claim(dfd, "", other, sizeof(other)), -EINVAL);
}

Test(staging_owner, a_record_that_is_no_file_is_refused)
{
	char other[64];

	cr_assert_eq(symlinkat("/etc/hostname", dfd, STAGING_OWNER_NAME), 0);
	cr_assert_eq(staging_owner_claim(dfd, VOL_A, other, sizeof(other)), -ELOOP);
}

Test(staging_owner, of_two_claims_at_once_one_wins)
{
	/* Forked claimants, each another volume, all at once: one wins and
	 * every other is told whose the directory is. */
	enum { N = 8 };
	pid_t pids[N];
	int won = 0, lost = 0;
	char other[64];

	for (int i = 0; i < N; i++) {
		pids[i] = fork();
		cr_assert_geq(pids[i], 0);
		if (pids[i] == 0) {
			char uuid[40];

			snprintf(uuid, sizeof(uuid), "00000000-0000-4000-8000-%012d", i);
			int rc = staging_owner_claim(dfd, uuid, other, sizeof(other));
			_exit(rc == 0 ? 0 : rc == -EEXIST ? 1 : 2);
		}
	}
	for (int i = 0; i < N; i++) {
		int st;

		cr_assert_eq(waitpid(pids[i], &st, 0), pids[i]);
		cr_assert(WIFEXITED(st) && WEXITSTATUS(st) < 2, "claimant %d: status %#x", i, st);
		won += WEXITSTATUS(st) == 0;
		lost += WEXITSTATUS(st) == 1;
	}
	cr_assert_eq(won, 1, "%d claimants won", won);
	cr_assert_eq(lost, N - 1);
	cr_assert_eq(entries(), 1, "temporary files are left behind");
}

Test(staging_owner, emptying_a_directory_removes_all_under_it_and_follows_nothing)
{
	char sub[128], file[160], outside[64], kept[96], link[160];

	snprintf(outside, sizeof(outside), "/tmp/ferry-owner-out.XXXXXX");
	cr_assert_not_null(mkdtemp(outside));
	snprintf(kept, sizeof(kept), "%s/kept", outside);
	close(open(kept, O_WRONLY | O_CREAT, 0600));
	snprintf(sub, sizeof(sub), "%s/sub", dir);
	cr_assert_eq(mkdir(sub, 0700), 0);
	snprintf(file, sizeof(file), "%s/f", sub);
	close(open(file, O_WRONLY | O_CREAT, 0600));
	snprintf(link, sizeof(link), "%s/link", dir);
	cr_assert_eq(symlink(outside, link), 0);
	put_record(VOL_A "\n");

	cr_assert_eq(dirs_empty_at(dfd, NULL), 0);
	cr_assert_eq(entries(), 0);
	cr_assert_eq(access(dir, F_OK), 0, "the directory itself went");
	cr_assert_eq(access(kept, F_OK), 0, "a file a symlink pointed at went");
	int f = open(kept, O_RDONLY);
	cr_assert_geq(f, 0);
	cr_assert_eq(dirs_empty_at(f, NULL), -ENOTDIR);
	close(f);
	rm_dir(outside);
}

Test(staging_owner, emptying_a_directory_can_keep_one_entry)
{
	char file[160];

	snprintf(file, sizeof(file), "%s/f", dir);
	close(open(file, O_WRONLY | O_CREAT, 0600));
	put_record(VOL_A "\n");
	cr_assert_eq(dirs_empty_at(dfd, STAGING_OWNER_NAME), 0);
	cr_assert_eq(entries(), 1);
	cr_assert_eq(faccessat(dfd, STAGING_OWNER_NAME, F_OK, 0), 0, "the entry kept went");
	cr_assert_eq(staging_owner_drop(dfd), 0);
	cr_assert_eq(entries(), 0);
	cr_assert_eq(staging_owner_drop(dfd), 0, "a record already gone");
}
