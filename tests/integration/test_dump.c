/*
 * `ferry dump` and `ferry load` through the real parts: a tree written
 * through a ferryfs mount is dumped, loaded into a new volume and dumped
 * again (the two streams must be the same), and the new volume, mounted,
 * must show every byte, name, mode, link, symlink and xattr the first one
 * had. A mounted volume is not dumped.
 */
#include "mount_util.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

TestSuite(dump, .init = fm_setup, .fini = fm_teardown, .timeout = 180);

#define MiB (1024 * 1024)

static const char weird[] = "name \xff\xfe with bytes";

static void write_tree(unsigned char *big, size_t big_len)
{
	uint64_t seed = 42;

	fm_fill_random(&seed, big, big_len);
	OK(mkdir(mp("d"), 0750));
	OK(mkdir(mp("d/e"), 0700));
	OK(chmod(mp("d/e"), 02775));
	fm_write_file(mp("d/big"), big, big_len);
	fm_write_file(mp("small"), "hello\n", 6);
	fm_write_file(mp("%s", weird), "w", 1);
	OK(symlink("d/big", mp("sym")));
	OK(link(mp("small"), mp("d/hard")));
	OK(chmod(mp("small"), 0604));
	OK(setxattr(mp("small"), "user.bin", "\0\xff\x01", 3, 0));
	OK(mkfifo(mp("fifo"), 0600));
	fm_write_file(mp("gone"), "x", 1);
	OK(unlink(mp("gone")));
}

static int ferry(const char *a, const char *b, const char *c, const char *err_path)
{
	const char *argv[] = { fm_bin("ferry"), a, b, c, NULL };

	return fm_run(argv, NULL, err_path, 60);
}

Test(dump, a_loaded_volume_mounts_with_everything_the_dumped_one_had)
{
	size_t big_len = 9 * MiB + 123;
	unsigned char *big = malloc(big_len);
	char d1[PATH_MAX], d2[PATH_MAX], vol2[PATH_MAX], errf[PATH_MAX], target[64], xv[8];
	char *e, *a, *b;
	struct stat st;
	ssize_t n;

	write_tree(big, big_len);
	snprintf(d1, sizeof(d1), "%s/d1.jsonl", fm.dir);
	snprintf(d2, sizeof(d2), "%s/d2.jsonl", fm.dir);
	snprintf(vol2, sizeof(vol2), "%s/vol2", fm.dir);
	snprintf(errf, sizeof(errf), "%s/dump.err", fm.dir);

	/* Mounted: refused, and no dump file is left. */
	cr_assert_eq(ferry("dump", fm.vol, d1, errf), 1);
	e = fm_slurp(errf);
	cr_assert(e && strstr(e, "mounted"), "ferry dump of a mounted volume said: %s", e);
	free(e);
	cr_assert_neq(stat(d1, &st), 0);

	fm_umount(); /* commits every close */
	cr_assert_eq(ferry("dump", fm.vol, d1, errf), 0, "%s", fm_slurp(errf));
	cr_assert_eq(ferry("load", d1, vol2, errf), 0, "%s", fm_slurp(errf));
	cr_assert_eq(ferry("dump", vol2, d2, errf), 0, "%s", fm_slurp(errf));
	a = fm_slurp(d1);
	b = fm_slurp(d2);
	cr_assert(a && b);
	cr_assert_str_eq(a, b, "the loaded volume dumps differently");
	free(a);
	free(b);
	cr_assert_neq(ferry("load", d1, vol2, errf), 0, "loaded over an existing volume");

	snprintf(fm.vol, sizeof(fm.vol), "%s", vol2);
	fm_mount();
	fm_expect_content(mp("d/big"), big, big_len);
	fm_expect_content(mp("small"), "hello\n", 6);
	fm_expect_content(mp("d/hard"), "hello\n", 6);
	fm_expect_content(mp("%s", weird), "w", 1);
	OK(lstat(mp("small"), &st));
	cr_assert_eq(st.st_mode, S_IFREG | 0604);
	cr_assert_eq(st.st_nlink, 2);
	OK(lstat(mp("d/e"), &st));
	cr_assert_eq(st.st_mode, S_IFDIR | 02775);
	OK(lstat(mp("fifo"), &st));
	cr_assert(S_ISFIFO(st.st_mode));
	n = readlink(mp("sym"), target, sizeof(target));
	cr_assert_eq(n, 5);
	cr_assert(memcmp(target, "d/big", 5) == 0);
	n = getxattr(mp("small"), "user.bin", xv, sizeof(xv));
	cr_assert_eq(n, 3);
	cr_assert(memcmp(xv, "\0\xff\x01", 3) == 0);
	cr_assert_neq(lstat(mp("gone"), &st), 0);
	/* It takes new files as a volume of its own would. */
	fm_write_file(mp("new"), "n", 1);
	fm_remount();
	fm_expect_content(mp("new"), "n", 1);
	free(big);
}
