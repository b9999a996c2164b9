/*
 * FUSE passthrough writes through a real mount: the kernel writes the
 * staging file with no upcall, and everything written is read back, after
 * close and after a remount with an empty read cache. Also: sharing of one
 * backing file by every open of an inode, truncate, mmap, fsync of only the
 * changed blocks, passthrough=off, and the EPERM latch of an unprivileged
 * daemon.
 */
#include "mount_util.h"

#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MiB (1024L * 1024)

TestSuite(passthrough, .init = fm_setup, .fini = fm_teardown, .timeout = 300);

/* The byte at offset off of pattern seed: checkable without a model. */
static inline unsigned char pat(uint64_t seed, uint64_t off)
{
	uint64_t x = (off >> 3) * 0x9E3779B97F4A7C15ULL ^ seed;
	x ^= x >> 29;
	x *= 0xBF58476D1CE4E5B9ULL;
	x ^= x >> 32;
	return (unsigned char)(x >> (8 * (off & 7)));
}

static void fill(uint64_t seed, unsigned char *buf, size_t len, uint64_t off)
{
	for (size_t i = 0; i < len; i++)
		buf[i] = pat(seed, off + i);
}

static void write_pattern(const char *path, uint64_t seed, uint64_t size, size_t bs)
{
	unsigned char *buf = malloc(bs);
	int fd = OK(open(path, O_CREAT | O_TRUNC | O_WRONLY, 0644));

	cr_assert(buf);
	for (uint64_t at = 0; at < size; at += bs) {
		size_t n = size - at < bs ? (size_t)(size - at) : bs;
		fill(seed, buf, n, at);
		fm_pwrite_all(fd, buf, n, (off_t)at);
	}
	OK(close(fd));
	free(buf);
}

static void check_pattern(const char *path, uint64_t seed, uint64_t size)
{
	const size_t bs = 4 * MiB;
	unsigned char *buf = malloc(bs), *want = malloc(bs);
	int fd = OK(open(path, O_RDONLY));
	struct stat st;

	cr_assert(buf && want);
	OK(fstat(fd, &st));
	cr_assert_eq((uint64_t)st.st_size, size, "%s: size %lld, want %llu", path,
		     (long long)st.st_size, (unsigned long long)size);
	for (uint64_t at = 0; at < size; at += bs) {
		size_t n = size - at < bs ? (size_t)(size - at) : bs;
		fm_pread_all(fd, buf, n, (off_t)at);
		fill(seed, want, n, at);
		if (memcmp(buf, want, n) != 0) {
			size_t k = 0;
			while (buf[k] == want[k])
				k++;
			cr_assert_fail("%s: wrong byte at %llu", path, (unsigned long long)(at + k));
		}
	}
	close(fd);
	free(buf);
	free(want);
}

static uint64_t stat_of(const char *name)
{
	struct fm_stats s;

	fm_stats_read(&s);
	return fm_stats_need(&s, name);
}

Test(passthrough, writes_cost_no_upcall)
{
	unsigned char blk[4096];
	uint64_t w0, x0, o0;
	int fd;

	cr_assert_eq(stat_of("passthrough_active"), 1, "passthrough is not active on this kernel");
	w0 = stat_of("fuse_requests_write");
	x0 = stat_of("fuse_requests_getxattr");
	o0 = stat_of("passthrough_opens");
	fd = OK(open(mp("pt"), O_CREAT | O_WRONLY, 0644));
	for (int i = 0; i < 4096; i++) { /* 16 MiB in 4 KiB writes, scattered */
		off_t off = (off_t)((i * 2654435761u) % 4096) * 4096;
		fill(1, blk, sizeof(blk), (uint64_t)off);
		fm_pwrite_all(fd, blk, sizeof(blk), off);
	}
	cr_assert_eq(stat_of("fuse_requests_write"), w0, "passthrough writes reached the daemon");
	/* The kernel checks security.capability once per inode, then marks it
	 * S_NOSEC (HANDLE_KILLPRIV_V2 set SB_NOSEC): not once per write. */
	cr_assert_leq(stat_of("fuse_requests_getxattr"), x0 + 1,
		      "a GETXATTR per write: HANDLE_KILLPRIV_V2 is not in effect");
	cr_assert_eq(stat_of("passthrough_opens"), o0 + 1);
	OK(close(fd));
	check_pattern(mp("pt"), 1, 16 * MiB);
}

/* Mounts again with extra -o options (after those of the environment). */
static void remount_with(const char *opts)
{
	fm_umount();
	fm_mount_with(opts);
}

Test(passthrough, daemon_path_writes_cost_no_getxattr)
{
	unsigned char blk[4096] = { 1 };
	uint64_t x0, w0;
	int fd;

	/* An existing, non-empty file larger than passthrough_copy_max takes
	 * the daemon path. Written before the remount: right after its close
	 * an open may still share the passthrough staging file its RELEASE
	 * has not let go of. */
	fm_write_file(mp("d"), blk, sizeof(blk));
	remount_with("passthrough_copy_max=0");
	x0 = stat_of("fuse_requests_getxattr");
	w0 = stat_of("fuse_requests_write");
	fd = OK(open(mp("d"), O_WRONLY));
	for (int i = 0; i < 64; i++)
		fm_pwrite_all(fd, blk, sizeof(blk), (off_t)i * 4096);
	OK(close(fd));
	cr_assert_geq(stat_of("fuse_requests_write"), w0 + 64);
	/* The kernel asks security.capability once per inode it has not seen
	 * written in this mount, then marks it S_NOSEC: not once per write. */
	cr_assert_leq(stat_of("fuse_requests_getxattr"), x0 + 1,
		      "GETXATTR before daemon-path writes");
}

Test(passthrough, read_your_writes_at_many_sizes_and_after_remount)
{
	static const uint64_t sizes[] = { 1000000, 17000000, 64 * MiB, 200000000, 333000000 };
	char name[32];

	for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
		snprintf(name, sizeof(name), "f%zu", i);
		write_pattern(mp("%s", name), 100 + i, sizes[i], MiB);
		check_pattern(mp("%s", name), 100 + i, sizes[i]);
	}
	cr_assert_eq(stat_of("fuse_requests_write"), 0);
	fm_remount_cold();
	for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
		snprintf(name, sizeof(name), "f%zu", i);
		check_pattern(mp("%s", name), 100 + i, sizes[i]);
		OK(unlink(mp("%s", name)));
	}
}

Test(passthrough, readers_and_writers_share_the_staging_file)
{
	unsigned char a[8192], b[8192], got[8192];
	int w1, w2, r;

	fill(7, a, sizeof(a), 0);
	fill(8, b, sizeof(b), 8192);
	w1 = OK(open(mp("s"), O_CREAT | O_RDWR, 0644));
	fm_pwrite_all(w1, a, sizeof(a), 0);
	/* A reader opened during the write sees the writer's bytes at once. */
	r = OK(open(mp("s"), O_RDONLY));
	fm_pread_all(r, got, sizeof(a), 0);
	cr_assert(memcmp(got, a, sizeof(a)) == 0);
	/* A second writer on the same inode: same backing file. */
	w2 = OK(open(mp("s"), O_WRONLY));
	fm_pwrite_all(w2, b, sizeof(b), 8192);
	fm_pread_all(r, got, sizeof(b), 8192);
	cr_assert(memcmp(got, b, sizeof(b)) == 0);
	cr_assert_eq(stat_of("fuse_requests_write"), 0);
	OK(close(w2));
	OK(close(w1));
	fm_pread_all(r, got, sizeof(a), 0);
	cr_assert(memcmp(got, a, sizeof(a)) == 0);
	OK(close(r));
	fm_remount_cold();
	size_t len;
	unsigned char *all = fm_read_file(mp("s"), &len);
	cr_assert_eq(len, 16384);
	cr_assert(memcmp(all, a, 8192) == 0 && memcmp(all + 8192, b, 8192) == 0);
	free(all);
}

Test(passthrough, truncate_during_write)
{
	unsigned char buf[MiB];
	struct stat st;
	int fd;

	fd = OK(open(mp("t"), O_CREAT | O_WRONLY, 0644));
	for (int i = 0; i < 8; i++) {
		fill(3, buf, sizeof(buf), (uint64_t)i * MiB);
		fm_pwrite_all(fd, buf, sizeof(buf), (off_t)i * MiB);
	}
	OK(truncate(mp("t"), 3 * MiB + 5));
	OK(stat(mp("t"), &st));
	cr_assert_eq(st.st_size, 3 * MiB + 5);
	/* Writing on past the new end leaves a hole that reads as zeros. */
	fill(3, buf, 4096, 6 * MiB);
	fm_pwrite_all(fd, buf, 4096, 6 * MiB);
	OK(fsync(fd));
	OK(close(fd));
	fm_remount_cold();
	fd = OK(open(mp("t"), O_RDONLY));
	OK(fstat(fd, &st));
	cr_assert_eq(st.st_size, 6 * MiB + 4096);
	unsigned char *all = malloc((size_t)st.st_size), *want = malloc((size_t)st.st_size);
	fm_pread_all(fd, all, (size_t)st.st_size, 0);
	fill(3, want, (size_t)st.st_size, 0);
	memset(want + 3 * MiB + 5, 0, 3 * MiB - 5);
	cr_assert(memcmp(all, want, (size_t)st.st_size) == 0, "content after truncate differs");
	close(fd);
	free(all);
	free(want);
}

/* The reconciler's upload byte count, once every job handed to it so far
 * is committed (a new open waits for the last close's upload). */
/* fsync() returns once the file's last close is uploaded and committed
 * (a reader's open does not wait for that). */
/* Waits until the RELEASE of a close has handed its staging file to the
 * reconciler: the kernel sends RELEASE without waiting for it, so a later
 * request (an fsync) may reach ferry-mountd first. */
static void handed_over_since(uint64_t handoffs0)
{
	for (int i = 0; i < 60000 && stat_of("handoffs") <= handoffs0; i++)
		usleep(1000);
	cr_assert_gt(stat_of("handoffs"), handoffs0, "no handoff after a close");
}

static uint64_t uploaded_after(const char *path)
{
	int fd = OK(open(path, O_RDONLY));

	OK(fsync(fd));
	OK(close(fd));
	return stat_of("reconcile_upload_bytes_total") + stat_of("bytes_uploaded");
}

Test(passthrough, mmap_write_then_close)
{
	size_t len = 3 * MiB;
	int fd = OK(open(mp("m"), O_CREAT | O_RDWR, 0644));
	unsigned char *p;

	OK(ftruncate(fd, (off_t)len));
	p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	cr_assert(p != MAP_FAILED, "mmap: %s", strerror(errno));
	fill(11, p, len, 0);
	OK(msync(p, len, MS_SYNC));
	OK(munmap(p, len));
	OK(close(fd));
	fm_remount_cold();
	check_pattern(mp("m"), 11, len);
}

/*
 * A shared mapping made through a passthrough open lives on the staging
 * file itself after the last close (the kernel maps the backing file), so
 * the staging file must stay the file's until the mapping goes: what is
 * stored after close() is committed when the mapping is dropped, by the
 * daemon on its own (no unmount, no new open), and survives a crash.
 */
Test(passthrough, a_mapping_outliving_close_is_committed_when_dropped)
{
	size_t len = 3 * MiB;
	int fd = OK(open(mp("m"), O_CREAT | O_RDWR, 0644));
	uint64_t before = stat_of("mapped_after_close");
	unsigned char *p;
	struct stat st;
	int tries;

	OK(fstat(fd, &st));
	OK(ftruncate(fd, (off_t)len));
	p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	cr_assert(p != MAP_FAILED, "mmap: %s", strerror(errno));
	OK(close(fd));
	/* RELEASE is asynchronous: wait until the daemon has seen the close */
	for (tries = 0; tries < 100 && stat_of("mapped_after_close") == before; tries++)
		usleep(50 * 1000);
	cr_assert_eq(stat_of("mapped_after_close"), before + 1,
		     "the close of a mapped passthrough file was not held back for its mapping");
	fill(23, p, len, 0); /* after close, and never msync'ed */
	cr_assert_eq(fm_staging_files_of(st.st_ino), 1, "the mapped staging file went away");
	OK(munmap(p, len));
	for (tries = 0; tries < 200 && fm_staging_files_of(st.st_ino) > 0; tries++)
		usleep(100 * 1000);
	cr_assert_eq(fm_staging_files_of(st.st_ino), 0,
		     "20 s after munmap the staging file is still there (not committed)");
	fm_crash(); /* nothing more from this daemon: the commit happened */
	fm_mount();
	check_pattern(mp("m"), 23, len);
}

Test(passthrough, fsync_uploads_only_changed_blocks)
{
	unsigned char buf[MiB];
	uint64_t put0, put1, same0, up0;
	int fd = OK(open(mp("c"), O_CREAT | O_RDWR, 0644));

	for (int i = 0; i < 16; i++) { /* 16 MiB: four 4 MiB blocks */
		fill(5, buf, sizeof(buf), (uint64_t)i * MiB);
		fm_pwrite_all(fd, buf, sizeof(buf), (off_t)i * MiB);
	}
	put0 = stat_of("objects_put");
	OK(fsync(fd));
	put1 = stat_of("objects_put");
	cr_assert_eq(put1 - put0, 4, "first fsync put %llu objects, want 4",
		     (unsigned long long)(put1 - put0));
	same0 = stat_of("blocks_unchanged");
	up0 = stat_of("bytes_uploaded");
	fm_pwrite_all(fd, "X", 1, 9 * MiB); /* in block 2 */
	OK(fsync(fd));
	cr_assert_eq(stat_of("objects_put") - put1, 1, "a one-byte change re-uploaded more than its block");
	cr_assert_eq(stat_of("blocks_unchanged") - same0, 3);
	/* Only the 64 KiB fingerprint unit around it, not its 4 MiB block. */
	cr_assert_eq(stat_of("bytes_uploaded") - up0, 64 << 10);
	/* Two changes in one unit and one in the next: one 128 KiB run. */
	put1 = stat_of("objects_put");
	up0 = stat_of("bytes_uploaded");
	fm_pwrite_all(fd, "YY", 2, 5 * MiB + 10);
	fm_pwrite_all(fd, "Z", 1, 5 * MiB + (64 << 10) + 7);
	OK(fsync(fd));
	cr_assert_eq(stat_of("objects_put") - put1, 1);
	cr_assert_eq(stat_of("bytes_uploaded") - up0, 128 << 10);
	/* close() after fsync: everything is stored already, nothing goes again */
	up0 = uploaded_after(mp("c"));
	OK(close(fd));
	/* The close's RELEASE first, or the fsync below commits in its place
	 * and the close's own upload is never looked at. */
	fm_wait_released(0);
	cr_assert_eq(uploaded_after(mp("c")), up0, "the close re-uploaded what fsync stored");
	/* The fsync'ed content survives a daemon killed before any more commit. */
	fm_crash();
	fm_mount();
	fd = OK(open(mp("c"), O_RDONLY));
	unsigned char c;
	fm_pread_all(fd, &c, 1, 9 * MiB);
	cr_assert_eq(c, 'X');
	unsigned char yz[3];
	fm_pread_all(fd, yz, 2, 5 * MiB + 10);
	fm_pread_all(fd, yz + 2, 1, 5 * MiB + (64 << 10) + 7);
	cr_assert(memcmp(yz, "YYZ", 3) == 0);
	fm_pread_all(fd, buf, sizeof(buf), 12 * MiB);
	unsigned char want[MiB];
	fill(5, want, sizeof(want), 12 * MiB);
	cr_assert(memcmp(buf, want, sizeof(want)) == 0);
	close(fd);
}

/* GETATTR requests one stat() of path costs: the .stats reads around it
 * cost the same each, measured by a read with nothing in between. */
static int64_t getattrs_of_stat(const char *path, struct stat *st)
{
	struct fm_stats s;
	uint64_t g1, g2, g3;

	fm_stats_read(&s);
	g1 = fm_stats_need(&s, "fuse_requests_getattr");
	OK(stat(path, st));
	fm_stats_read(&s);
	g2 = fm_stats_need(&s, "fuse_requests_getattr");
	fm_stats_read(&s);
	g3 = fm_stats_need(&s, "fuse_requests_getattr");
	return (int64_t)(g2 - g1) - (int64_t)(g3 - g2);
}

static void same_attrs(const struct stat *a, const struct stat *b, const char *what)
{
	cr_assert(a->st_size == b->st_size && a->st_mtim.tv_sec == b->st_mtim.tv_sec &&
		  a->st_mtim.tv_nsec == b->st_mtim.tv_nsec && a->st_ctim.tv_sec == b->st_ctim.tv_sec &&
		  a->st_ctim.tv_nsec == b->st_ctim.tv_nsec,
		  "%s: size %lld mtime %lld.%09ld ctime %lld.%09ld, before %lld %lld.%09ld "
		  "%lld.%09ld", what, (long long)b->st_size, (long long)b->st_mtim.tv_sec,
		  b->st_mtim.tv_nsec, (long long)b->st_ctim.tv_sec, b->st_ctim.tv_nsec,
		  (long long)a->st_size, (long long)a->st_mtim.tv_sec, a->st_mtim.tv_nsec,
		  (long long)a->st_ctim.tv_sec, a->st_ctim.tv_nsec);
}

/* The reconciler's commit of a closed file leaves the kernel's cache alone
 * when the kernel already holds what the commit makes (it asked while the
 * upload was in flight): a stat after the commit (git status after a
 * checkout) needs no GETATTR, and shows what the metadata holds. */
Test(passthrough, a_commit_that_changes_nothing_cached_keeps_the_kernel_cache)
{
	static const char body[] = "the kernel saw this size and mtime already\n";
	struct stat before, after, cold, u;
	uint64_t skipped0, h0;

	/* Commits only when asked (fsync): the stat below always comes while
	 * the upload is in flight, however slow this machine is. */
	remount_with("commit_window_ms=600000");
	skipped0 = stat_of("commit_invalidations_skipped");
	h0 = stat_of("handoffs");
	fm_write_file(mp("k"), body, strlen(body));
	handed_over_since(h0);
	OK(stat(mp("k"), &before));
	uploaded_after(mp("k"));
	cr_assert_eq(getattrs_of_stat(mp("k"), &after), 0,
		     "a stat after a commit that changed nothing asked the daemon");
	same_attrs(&before, &after, "after the commit");
	cr_assert_gt(stat_of("commit_invalidations_skipped"), skipped0);

	/* The count is real: a file the kernel never asked about while it was
	 * in flight is asked for (its cached size is the create's). */
	h0 = stat_of("handoffs");
	fm_write_file(mp("u"), body, strlen(body));
	handed_over_since(h0);
	uploaded_after(mp("u"));
	cr_assert_eq(getattrs_of_stat(mp("u"), &u), 1);
	cr_assert_eq(u.st_size, (off_t)strlen(body));

	fm_remount_cold();
	OK(stat(mp("k"), &cold));
	same_attrs(&before, &cold, "after a remount");
	fm_expect_content(mp("k"), body, strlen(body));
}

static uint64_t commits_seen(void)
{
	return stat_of("commit_invalidations") + stat_of("commit_invalidations_skipped");
}

static void committed_since(uint64_t seen0)
{
	for (int i = 0; i < 60000 && commits_seen() <= seen0; i++)
		usleep(1000);
	cr_assert_gt(commits_seen(), seen0, "no commit came back");
}

/* GETATTR requests an open(O_RDONLY) and close of path cost (as
 * getattrs_of_stat()). */
static int64_t getattrs_of_open(const char *path)
{
	struct fm_stats s;
	uint64_t g1, g2, g3;

	fm_stats_read(&s);
	g1 = fm_stats_need(&s, "fuse_requests_getattr");
	OK(close(OK(open(path, O_RDONLY))));
	fm_stats_read(&s);
	g2 = fm_stats_need(&s, "fuse_requests_getattr");
	fm_stats_read(&s);
	g3 = fm_stats_need(&s, "fuse_requests_getattr");
	return (int64_t)(g2 - g1) - (int64_t)(g3 - g2);
}

/*
 * The commit of a file written and closed without a stat (a checkout)
 * leaves the kernel the mode, owner and links it holds: the writes already
 * made it drop the size and times, so the next open's permission check asks
 * nothing and the next stat asks for the committed ones. A write through a
 * shared mapping leaves the size alone and makes the kernel drop nothing:
 * its commit must drop the cache, or stat shows the old mtime for a day.
 */
Test(passthrough, a_commit_keeps_what_the_kernel_did_not_drop_itself)
{
	static const char body[] = "written and closed, never stat'ed\n";
	struct stat st, cold, before, after;
	uint64_t seen0, inval0;
	char *p;
	int fd;

	seen0 = commits_seen();
	inval0 = stat_of("commit_invalidations");
	fm_write_file(mp("w"), body, strlen(body));
	committed_since(seen0);
	cr_assert_eq(stat_of("commit_invalidations"), inval0,
		     "the commit of a new file dropped the kernel's attributes");
	cr_assert_eq(getattrs_of_open(mp("w")), 0,
		     "an open after the commit asked for attributes the kernel had");
	cr_assert_eq(getattrs_of_stat(mp("w"), &st), 1,
		     "a stat after the writes did not ask for the committed size");
	cr_assert_eq(st.st_size, (off_t)strlen(body));

	fm_write_file(mp("m"), body, strlen(body));
	uploaded_after(mp("m"));
	OK(stat(mp("m"), &before));
	cr_assert_eq(getattrs_of_stat(mp("m"), &before), 0);
	usleep(20000); /* a later mtime, whatever the clock's grain */
	seen0 = commits_seen();
	inval0 = stat_of("commit_invalidations");
	fd = OK(open(mp("m"), O_RDWR));
	p = mmap(NULL, strlen(body), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	cr_assert(p != MAP_FAILED, "mmap: %s", strerror(errno));
	p[0] = 'W';
	OK(msync(p, strlen(body), MS_SYNC));
	OK(munmap(p, strlen(body)));
	OK(close(fd));
	committed_since(seen0);
	cr_assert_gt(stat_of("commit_invalidations"), inval0,
		     "the commit of a mapped write kept the kernel's old times");
	OK(stat(mp("m"), &after));
	cr_assert(after.st_mtim.tv_sec > before.st_mtim.tv_sec ||
		  (after.st_mtim.tv_sec == before.st_mtim.tv_sec &&
		   after.st_mtim.tv_nsec > before.st_mtim.tv_nsec),
		  "a write through a mapping left the mtime where it was");

	fm_remount_cold();
	OK(stat(mp("w"), &cold));
	same_attrs(&st, &cold, "the written file after a remount");
	OK(stat(mp("m"), &cold));
	same_attrs(&after, &cold, "the mapped file after a remount");
	fm_expect_content(mp("w"), body, strlen(body));
	char want[sizeof(body)];
	memcpy(want, body, sizeof(body));
	want[0] = 'W';
	fm_expect_content(mp("m"), want, strlen(body));
}

/* Uploads wait while files keep being closed (-o upload_quiet_ms); here
 * the wait outlasts the test, so only someone who needs the commit can end
 * it: an fsync, an open that must see the commit, an unmount. */
Test(passthrough, deferred_uploads_end_when_someone_waits)
{
	static const char a[] = "fsynced\n", b[] = "reopened", c[] = "at unmount\n";
	struct stat st;
	uint64_t h0;
	int fd;

	remount_with("upload_quiet_ms=600000,upload_delay_max_ms=600000");
	h0 = stat_of("handoffs");
	fm_write_file(mp("a"), a, strlen(a));
	handed_over_since(h0);
	cr_assert_eq(stat_of("reconcile_waiting"), 1);
	cr_assert_eq(stat_of("reconcile_committed_total"), 0);
	uploaded_after(mp("a"));
	cr_assert_eq(stat_of("reconcile_committed_total"), 1, "fsync did not end the wait");
	cr_assert_eq(stat_of("reconcile_waiting"), 0);

	h0 = stat_of("handoffs");
	fm_write_file(mp("b"), b, strlen(b));
	handed_over_since(h0);
	fd = OK(open(mp("b"), O_WRONLY | O_APPEND));
	fm_pwrite_all(fd, "!", 1, (off_t)strlen(b));
	OK(close(fd));

	h0 = stat_of("handoffs");
	fm_write_file(mp("c"), c, strlen(c));
	handed_over_since(h0);
	cr_assert_geq(stat_of("reconcile_waiting"), 1);
	OK(stat(mp("c"), &st));
	fm_umount();
	cr_assert_eq(fm_staging_files_of(st.st_ino), 0, "unmount left c's upload waiting");
	fm_mount();
	fm_expect_content(mp("a"), a, strlen(a));
	fm_expect_content(mp("b"), "reopened!", 9);
	fm_expect_content(mp("c"), c, strlen(c));
}

/* A file deleted before its upload began is not uploaded: once the kernel
 * forgets the unlinked inode, ferry-mountd asks the reconciler to drop
 * the job (its staging file and record go, nothing is stored or
 * committed). A file with another link left is uploaded as ever, and one
 * unlinked while open is never handed over (d4 reads its bytes after the
 * unlink, until its close). Nor is one whose writer asked for O_DSYNC.
 * Uploads are held back here
 * (-o upload_quiet_ms) so that none begins on its own. */
Test(passthrough, deleted_files_are_not_uploaded)
{
	static const char body[] = "deleted before its upload began\n";
	const char *drain[] = { fm_bin("ferry"), "drain", fm.mnt, NULL };
	char name[16], got[sizeof(body)];
	struct stat st[7];
	uint64_t h0, up0, d0, ask0;
	int held;

	remount_with("upload_quiet_ms=600000,upload_delay_max_ms=600000");
	h0 = stat_of("handoffs");
	d0 = stat_of("reconcile_dropped_total");
	ask0 = stat_of("uploads_drop_asked");
	up0 = stat_of("reconcile_uploads_total");
	/* d4 stays open (a reader opened now would wait for its commit on
	 * the daemon path, and that wait starts every upload). */
	held = OK(open(mp("d4"), O_CREAT | O_RDWR, 0644));
	fm_pwrite_all(held, body, strlen(body), 0);
	for (int k = 0; k < 7; k++) {
		if (k == 4)
			continue;
		snprintf(name, sizeof(name), "d%d", k);
		fm_write_file(mp("%s", name), body, strlen(body));
		OK(stat(mp("%s", name), &st[k]));
	}
	for (int i = 0; i < 60000 && stat_of("handoffs") < h0 + 6; i++)
		usleep(1000);
	cr_assert_eq(stat_of("handoffs"), h0 + 6);
	/* d7: written through O_DSYNC, its bytes promised durable: kept. (On
	 * the daemon path each such write commits before it returns: no
	 * handoff.) */
	uint64_t pt = stat_of("passthrough_active");
	int sync_fd = OK(open(mp("d7"), O_CREAT | O_WRONLY | O_DSYNC, 0644));
	fm_pwrite_all(sync_fd, body, strlen(body), 0);
	OK(close(sync_fd));
	for (int i = 0; i < 60000 && stat_of("handoffs") < h0 + 6 + pt; i++)
		usleep(1000);
	cr_assert_eq(stat_of("handoffs"), h0 + 6 + pt);
	cr_assert_eq(stat_of("reconcile_waiting"), 6 + pt);

	OK(unlink(mp("d0")));
	OK(unlink(mp("d1")));
	OK(rename(mp("d3"), mp("d2"))); /* the old d2 goes */
	OK(unlink(mp("d4")));
	OK(link(mp("d5"), mp("d5.link")));
	OK(unlink(mp("d5")));
	OK(link(mp("d6"), mp("d6.link"))); /* d6: both links go */
	OK(unlink(mp("d6")));
	OK(unlink(mp("d6.link")));
	OK(unlink(mp("d7")));

	/* The drops follow the kernel's FORGETs, which it sends on its own
	 * time; the stats query follows them on the same connection. */
	for (int i = 0; i < 10000 && stat_of("reconcile_dropped_total") < d0 + 4; i++)
		usleep(1000);
	cr_assert_eq(stat_of("uploads_drop_asked"), ask0 + 4);
	cr_assert_eq(stat_of("reconcile_dropped_total"), d0 + 4);
	cr_assert_eq(stat_of("reconcile_uploads_total"), up0);
	for (int k = 0; k < 7; k++)
		if (k <= 2 || k == 6)
			cr_assert_eq(fm_staging_files_of(st[k].st_ino), 0,
				     "the staging file of deleted d%d is still there", k);
	cr_assert_eq(stat_of("reconcile_waiting"), 2 + pt);
	cr_assert_eq(pread(held, got, sizeof(got), 0), (ssize_t)strlen(body));
	OK(close(held));

	cr_assert_eq(fm_run(drain, NULL, NULL, 120), 0);
	/* d3, d5 and (handed over) d7; d4's last close came after its
	 * unlink: nothing to keep. */
	cr_assert_eq(stat_of("reconcile_uploads_total"), up0 + 2 + pt);
	cr_assert_eq(stat_of("reconcile_dropped_total"), d0 + 4);
	cr_assert_eq(stat_of("reconcile_orphans"), 0);
	cr_assert(memcmp(got, body, strlen(body)) == 0, "the open, unlinked d4 lost its bytes");
	fm_expect_content(mp("d2"), body, strlen(body));
	fm_expect_content(mp("d5.link"), body, strlen(body));

	fm_remount_cold();
	fm_expect_content(mp("d2"), body, strlen(body));
	fm_expect_content(mp("d5.link"), body, strlen(body));
	cr_assert(access(mp("d6.link"), F_OK) < 0 && errno == ENOENT);
	for (int k = 0; k < 7; k++) {
		snprintf(name, sizeof(name), "d%d", k);
		bool there = access(mp("%s", name), F_OK) == 0;

		cr_assert_eq(there, k == 2, "%s", name);
		cr_assert(there || errno == ENOENT, "%s: %s", name, strerror(errno));
	}
}

/* A reader holding a file open when its last link goes keeps the file's
 * upload: it reads what was written, before and after the commit. So does
 * a descriptor that holds the inode without opening it (O_PATH), through
 * which the file can be opened again after the unlink. */
Test(passthrough, a_deleted_file_held_open_keeps_its_upload)
{
	static const char body[] = "read after the unlink\n";
	const char *drain[] = { fm_bin("ferry"), "drain", fm.mnt, NULL };
	char got[sizeof(body)];
	uint64_t h0, ask0, d0;
	int r;

	remount_with("upload_quiet_ms=600000,upload_delay_max_ms=600000");
	h0 = stat_of("handoffs");
	ask0 = stat_of("uploads_drop_asked");
	d0 = stat_of("reconcile_dropped_total");
	fm_write_file(mp("h"), body, strlen(body));
	for (int i = 0; i < 60000 && stat_of("handoffs") <= h0; i++)
		usleep(1000);
	cr_assert_eq(stat_of("handoffs"), h0 + 1);
	r = OK(open(mp("h"), O_RDONLY));
	OK(unlink(mp("h")));
	cr_assert_eq(pread(r, got, sizeof(got), 0), (ssize_t)strlen(body));
	cr_assert(memcmp(got, body, strlen(body)) == 0);

	h0 = stat_of("handoffs");
	fm_write_file(mp("p"), body, strlen(body));
	for (int i = 0; i < 60000 && stat_of("handoffs") <= h0; i++)
		usleep(1000);
	int path = OK(open(mp("p"), O_PATH));
	OK(unlink(mp("p")));
	char proc[64];
	snprintf(proc, sizeof(proc), "/proc/self/fd/%d", path);
	int again = OK(open(proc, O_RDONLY));
	memset(got, 0, sizeof(got));
	cr_assert_eq(pread(again, got, sizeof(got), 0), (ssize_t)strlen(body));
	cr_assert(memcmp(got, body, strlen(body)) == 0, "reopened through O_PATH");
	OK(close(again));
	cr_assert_eq(stat_of("uploads_drop_asked"), ask0);
	OK(close(path)); /* now p may go: forgotten, nothing can reach it */
	cr_assert_eq(fm_run(drain, NULL, NULL, 120), 0);
	cr_assert_leq(stat_of("reconcile_dropped_total"), d0 + 1, "only p's upload may go");
	cr_assert_eq(stat_of("reconcile_orphans"), 0);
	memset(got, 0, sizeof(got));
	cr_assert_eq(pread(r, got, sizeof(got), 0), (ssize_t)strlen(body));
	cr_assert(memcmp(got, body, strlen(body)) == 0, "the committed bytes differ");
	OK(close(r));
}

/* A file created (or opened for writing while empty) and closed without a
 * change has nothing to upload or commit: no handoff, no staging file
 * left; what the metadata says (size 0, the creation's times) stays. A
 * truncate or a write of such a file is still committed. */
Test(passthrough, an_untouched_empty_file_is_not_handed_over)
{
	struct stat before, after;
	uint64_t handoffs0 = stat_of("handoffs");
	int fd;

	fd = OK(open(mp("e"), O_CREAT | O_WRONLY, 0644));
	OK(close(fd));
	fd = OK(open(mp("e"), O_WRONLY));
	OK(close(fd));
	/* Only a close ferry-mountd has seen can have been handed over. */
	fm_wait_released(0);
	OK(stat(mp("e"), &before));
	cr_assert_eq(stat_of("handoffs"), handoffs0, "an untouched empty file was handed over");

	/* A truncate to the size it has is a change (mtime). */
	fd = OK(open(mp("t"), O_CREAT | O_WRONLY, 0644));
	struct timespec old[2] = { { 1000, 0 }, { 1000, 0 } };
	OK(futimens(fd, old));
	OK(ftruncate(fd, 0));
	OK(close(fd));
	/* and a write of nothing but an extent of zeros is content */
	fd = OK(open(mp("z"), O_CREAT | O_WRONLY, 0644));
	OK(fallocate(fd, 0, 0, 4096));
	OK(close(fd));
	/* Both RELEASEs first: an fsync that overtook one would commit the
	 * file itself, and its RELEASE would find nothing to hand over. */
	fm_wait_released(0);
	uploaded_after(mp("z"));
	cr_assert_geq(stat_of("handoffs"), handoffs0 + 2);

	fm_remount_cold();
	OK(stat(mp("e"), &after));
	cr_assert_eq(after.st_size, 0);
	cr_assert(after.st_mtim.tv_sec == before.st_mtim.tv_sec &&
		  after.st_mtim.tv_nsec == before.st_mtim.tv_nsec, "mtime changed");
	OK(stat(mp("t"), &after));
	cr_assert_eq(after.st_size, 0);
	cr_assert_gt(after.st_mtim.tv_sec, 1000, "the truncate's mtime was not kept");
	OK(stat(mp("z"), &after));
	cr_assert_eq(after.st_size, 4096);
	fm_expect_content(mp("z"), (char[4096]){ 0 }, 4096);
}

/* The mtime an open file shows is the one it keeps after close when nobody
 * wrote it: a staging file's own creation stamp is not a write. Another
 * process writing and asking for times meanwhile makes the staging file
 * system stamp files finely (multigrain timestamps), so that stamp would be
 * later than the create's; attributes are asked for every time. */
Test(passthrough, an_unwritten_file_shows_one_mtime_open_and_closed)
{
	enum { FILES = 600 };
	static struct timespec seen[FILES];
	struct stat st;
	pid_t busy;
	int fd, changed = 0;

	remount_with("attr_timeout=0");
	busy = fork();
	cr_assert(busy >= 0);
	if (busy == 0) {
		int bfd = open(mp("busy"), O_CREAT | O_RDWR, 0644);

		for (;;) {
			if (bfd < 0 || pwrite(bfd, "x", 1, 0) != 1 || fstat(bfd, &st) < 0)
				_exit(1);
		}
	}
	for (int k = 0; k < FILES; k++) {
		fd = OK(open(mp("u%d", k), O_CREAT | O_WRONLY, 0644));
		OK(fstat(fd, &st));
		seen[k] = st.st_mtim;
		OK(close(fd));
	}
	kill(busy, SIGKILL);
	waitpid(busy, NULL, 0);
	fm_wait_released(0);
	for (int k = 0; k < FILES; k++) {
		OK(stat(mp("u%d", k), &st));
		changed += st.st_mtim.tv_sec != seen[k].tv_sec || st.st_mtim.tv_nsec != seen[k].tv_nsec;
	}
	cr_assert_eq(changed, 0, "%d of %d unwritten files show another mtime after close",
		     changed, FILES);
}

/* A write right after a passthrough open (in the clock tick its staging
 * file was made in) still moves mtime: an empty file appended to, and a
 * copied-up file overwritten at the same size, both with an old mtime.
 * (Kernels with multigrain timestamps, 6.13 on, stamp a write after a stat
 * finely, so there it holds even without the staging file's start stamp
 * being the file's own; older ones stamp in coarse ticks.) */
Test(passthrough, a_write_right_after_open_moves_mtime)
{
	static const struct timespec old[2] = { { 1000, 0 }, { 1000, 0 } };
	struct timespec before;
	struct stat st;
	int fd;

	fm_write_file(mp("empty"), "", 0);
	fm_write_file(mp("full"), "0123456789", 10);
	OK(utimensat(AT_FDCWD, mp("empty"), old, 0));
	OK(utimensat(AT_FDCWD, mp("full"), old, 0));
	fm_wait_released(0);
	clock_gettime(CLOCK_REALTIME, &before);
	for (int round = 0; round < 20; round++) {
		fd = OK(open(mp("empty"), O_WRONLY | O_APPEND));
		fm_pwrite_all(fd, "a", 1, 0);
		OK(close(fd));
		fd = OK(open(mp("full"), O_RDWR));
		fm_pwrite_all(fd, "abcdefghij", 10, 0);
		OK(close(fd));
		fm_wait_released(0);
		OK(stat(mp("empty"), &st));
		cr_assert_geq(st.st_mtim.tv_sec, before.tv_sec - 1, "round %d: append kept mtime %lld",
			      round, (long long)st.st_mtim.tv_sec);
		OK(stat(mp("full"), &st));
		cr_assert_geq(st.st_mtim.tv_sec, before.tv_sec - 1, "round %d: overwrite kept mtime %lld",
			      round, (long long)st.st_mtim.tv_sec);
		OK(utimensat(AT_FDCWD, mp("empty"), old, 0));
		OK(utimensat(AT_FDCWD, mp("full"), old, 0));
	}
	cr_assert_eq(stat_of("copy_ups") > 0, true, "the overwrite was not copied up");
}

Test(passthrough, a_cached_open_keeps_writers_on_the_daemon_path)
{
	unsigned char buf[4096];
	uint64_t o0, w0;
	int r, w;

	fm_write_file(mp("e"), "", 0);
	/* Until its RELEASE the create's staging file is the inode's, and the
	 * opens below would share it. */
	fm_wait_released(0);
	o0 = stat_of("passthrough_opens");
	r = OK(open(mp("e"), O_RDONLY)); /* cached mode: the kernel allows no passthrough now */
	w0 = stat_of("fuse_requests_write");
	w = OK(open(mp("e"), O_WRONLY));
	fill(9, buf, sizeof(buf), 0);
	fm_pwrite_all(w, buf, sizeof(buf), 0);
	cr_assert_gt(stat_of("fuse_requests_write"), w0);
	cr_assert_eq(stat_of("passthrough_opens"), o0);
	OK(close(w));
	unsigned char got[4096];
	fm_pread_all(r, got, sizeof(got), 0);
	cr_assert(memcmp(got, buf, sizeof(buf)) == 0);
	OK(close(r));
}

/* ---- passthrough=off ---- */

static void setup_off(void)
{
	setenv("FERRY_IT_MOUNT_OPTIONS", "passthrough=off", 1);
	fm_setup();
}

static void teardown_off(void)
{
	unsetenv("FERRY_IT_MOUNT_OPTIONS");
	fm_teardown();
}

TestSuite(passthrough_off, .init = setup_off, .fini = teardown_off, .timeout = 300);

Test(passthrough_off, every_write_takes_the_daemon_path)
{
	struct fm_stats s;

	write_pattern(mp("o"), 2, 4 * MiB, MiB);
	check_pattern(mp("o"), 2, 4 * MiB);
	fm_stats_read(&s);
	cr_assert_eq(fm_stats_need(&s, "passthrough_active"), 0);
	cr_assert_eq(fm_stats_need(&s, "passthrough_opens"), 0);
	cr_assert_geq(fm_stats_need(&s, "fuse_requests_write"), 4);
	char *text = fm_slurp(mp(".stats"));
	cr_assert(text && strstr(text, "passthrough_off_reason mount_option_off\n"),
		  "no reason line for passthrough=off");
	free(text);
}

/* Small writes on the daemon path reach ferry-mountd in batches through
 * the kernel's writeback cache (on by default without passthrough), and
 * what close() returned for survives a killed daemon; with writeback=off
 * every write is an upcall. */
static uint64_t small_writes(const char *name, int n)
{
	unsigned char blk[4096];
	uint64_t w0 = stat_of("fuse_requests_write");
	int fd = OK(open(mp("%s", name), O_CREAT | O_WRONLY | O_TRUNC, 0644));

	for (int i = 0; i < n; i++) {
		fill(40 + (uint64_t)n, blk, sizeof(blk), (uint64_t)i * sizeof(blk));
		fm_pwrite_all(fd, blk, sizeof(blk), (off_t)i * (off_t)sizeof(blk));
	}
	OK(close(fd));
	return stat_of("fuse_requests_write") - w0;
}

Test(passthrough_off, writeback_cache_batches_small_writes)
{
	uint64_t nwrites;

	cr_assert_eq(stat_of("writeback_cache"), 1, "no writeback cache without passthrough");
	nwrites = small_writes("wb", 512);
	cr_assert_leq(nwrites, 512 / 8, "512 writes of 4 KiB took %llu WRITE upcalls",
		      (unsigned long long)nwrites);
	fm_crash();
	fm_mount();
	check_pattern(mp("wb"), 40 + 512, 512 * 4096);
	remount_with("writeback=off");
	cr_assert_eq(stat_of("writeback_cache"), 0);
	cr_assert_eq(small_writes("nowb", 64), 64);
}

/* ---- an unprivileged daemon: EPERM latches passthrough off ---- */

static mode_t fuse_dev_mode;

/* An unprivileged mount opens /dev/fuse itself (then fusermount3 mounts
 * it): give the device the mode Debian's udev rule gives it (0666) for the
 * test, and put back what the machine had. */
static void setup_unpriv(void)
{
	struct stat st;

	cr_assert_eq(stat("/dev/fuse", &st), 0, "no /dev/fuse");
	fuse_dev_mode = st.st_mode & 07777;
	cr_assert_eq(chmod("/dev/fuse", 0666), 0, "chmod /dev/fuse: %s", strerror(errno));
	fm_setup_opts(&(struct fm_opts){ .no_mount = true });
}

static int run_as_nobody(const char *const *cmd);

static void teardown_unpriv(void)
{
	/* Root cannot read a mount without allow_other: unmount as its owner. */
	if (fm.created && fm_is_mounted(fm.mnt)) {
		const char *umount_cmd[] = { fm_bin("ferry"), "umount", fm.mnt, NULL };
		if (run_as_nobody(umount_cmd) == 0)
			fm.mounted = false;
	}
	fm_teardown();
	chmod("/dev/fuse", fuse_dev_mode);
}

TestSuite(passthrough_eperm, .init = setup_unpriv, .fini = teardown_unpriv, .timeout = 300);

static const char *nobody_argv[] = { "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
				     "--", NULL };

static int run_as_nobody(const char *const *cmd)
{
	const char *argv[24];
	int a = 0;

	for (int i = 0; nobody_argv[i]; i++)
		argv[a++] = nobody_argv[i];
	for (int i = 0; cmd[i] && a < 23; i++)
		argv[a++] = cmd[i];
	argv[a] = NULL;
	argv[0] = "/usr/bin/setpriv";
	return fm_run(argv, NULL, NULL, 120);
}

static long nobody_write(void *arg)
{
	const char *path = arg;
	unsigned char buf[65536];
	int fd = open(path, O_CREAT | O_WRONLY | O_TRUNC, 0644);

	if (fd < 0)
		return -1;
	for (int i = 0; i < 16; i++) {
		fill(21, buf, sizeof(buf), (uint64_t)i * sizeof(buf));
		if (pwrite(fd, buf, sizeof(buf), (off_t)i * sizeof(buf)) != sizeof(buf))
			return -1;
	}
	return close(fd);
}

static long nobody_check(void *arg)
{
	const char *path = arg;
	unsigned char buf[65536], want[65536];
	int fd = open(path, O_RDONLY);

	if (fd < 0)
		return -1;
	for (int i = 0; i < 16; i++) {
		fill(21, want, sizeof(want), (uint64_t)i * sizeof(want));
		if (pread(fd, buf, sizeof(buf), (off_t)i * sizeof(buf)) != sizeof(buf) ||
		    memcmp(buf, want, sizeof(buf)) != 0) {
			errno = EILSEQ;
			return -1;
		}
	}
	return close(fd);
}

static char stats_copy[65536];

static long nobody_stats(void *arg)
{
	int fd = open(mp(".stats"), O_RDONLY);
	ssize_t n;

	if (fd < 0)
		return -1;
	n = read(fd, stats_copy, sizeof(stats_copy) - 1);
	close(fd);
	return n;
}

Test(passthrough_eperm, an_unprivileged_daemon_latches_passthrough_off)
{
	if (fm.voldir[0])
		cr_skip_test("it formats a directory volume as uid 65534; this volume is on PostgreSQL");
	const char *chown_argv[] = { "/bin/chown", "-R", "65534:65534", fm.vol, fm.mnt, fm.cache, NULL };
	const char *mount_cmd[] = { fm_bin("ferry"), "mount", "--cache-dir", fm.cache, fm.vol, fm.mnt, NULL };
	const char *umount_cmd[] = { fm_bin("ferry"), "umount", fm.mnt, NULL };
	char path[PATH_MAX];
	int p[2];

	if (access("/usr/bin/fusermount3", X_OK) != 0)
		cr_assert_fail("fusermount3 is missing (scripts/bootstrap installs fuse3)");
	const char *format_cmd[] = { fm_bin("ferry"), "format", "--force", fm.vol, NULL };

	cr_assert_eq(fm_run(chown_argv, NULL, NULL, 30), 0);
	/* Formatted by its owner, so the root directory is nobody's. */
	cr_assert_eq(run_as_nobody(format_cmd), 0, "ferry format as uid 65534 failed");
	cr_assert_eq(run_as_nobody(mount_cmd), 0, "ferry mount as uid 65534 failed");
	fm.mounted = true;

	snprintf(path, sizeof(path), "%s", mp("u"));
	cr_assert_eq(fm_as_nobody(nobody_write, path), 0, "write as nobody: %s", strerror(errno));
	char path2[PATH_MAX];
	snprintf(path2, sizeof(path2), "%s", mp("u2"));
	cr_assert_eq(fm_as_nobody(nobody_write, path2), 0, "second write: %s", strerror(errno));
	cr_assert_eq(fm_as_nobody(nobody_check, path), 0, "read back as nobody: %s", strerror(errno));

	/* The child's copy of .stats comes back through a pipe. */
	cr_assert_eq(pipe(p), 0);
	pid_t pid = fork();
	if (pid == 0) {
		if (setgroups(0, NULL) || setresgid(65534, 65534, 65534) || setresuid(65534, 65534, 65534))
			_exit(1);
		long n = nobody_stats(NULL);
		if (n > 0)
			(void)!write(p[1], stats_copy, (size_t)n);
		_exit(n > 0 ? 0 : 2);
	}
	close(p[1]);
	ssize_t got = 0, n;
	while ((n = read(p[0], stats_copy + got, sizeof(stats_copy) - 1 - (size_t)got)) > 0)
		got += n;
	close(p[0]);
	waitpid(pid, NULL, 0);
	stats_copy[got > 0 ? got : 0] = '\0';
	cr_assert(strstr(stats_copy, "passthrough_active 0\n"), "passthrough still active:\n%s", stats_copy);
	cr_assert(strstr(stats_copy, "passthrough_off_reason eperm_needs_CAP_SYS_ADMIN\n"),
		  "no reason naming CAP_SYS_ADMIN:\n%s", stats_copy);
	cr_assert(strstr(stats_copy, "fuse_requests_write 0\n") == NULL, "writes did not reach the daemon");

	cr_assert_eq(run_as_nobody(umount_cmd), 0, "ferry umount as uid 65534 failed");
	fm.mounted = false;
	/* One warning for the whole mount, not one per open. */
	char *log = fm_slurp(sp("vol/ferry-mountd.log"));
	cr_assert(log);
	int warnings = 0;
	for (char *q = log; (q = strstr(q, "passthrough is off for this mount")); q++)
		warnings++;
	cr_assert_eq(warnings, 1, "%d latch warnings in the log", warnings);
	free(log);
}

/*
 * A write open of a file with content gets passthrough too: the file is
 * copied into a staging file at open (from the store here: the cache is
 * cold), the kernel writes it directly, and the upload at close stores
 * only the 64 KiB units that changed.
 */
Test(passthrough, existing_file_gets_passthrough_and_uploads_only_changes)
{
	const uint64_t size = 16 * MiB + 12345;
	uint64_t pt0, cu0, up0, wr0;
	unsigned char *want = malloc(size);
	int fd;

	cr_assert(want);
	write_pattern(mp("e"), 31, size, MiB);
	fm_remount_cold();
	fill(31, want, size, 0);
	pt0 = stat_of("passthrough_opens");
	cu0 = stat_of("copy_ups");
	wr0 = stat_of("fuse_requests_write");
	up0 = uploaded_after(mp("e"));
	/* Until the RELEASE of that reader's fd the inode is open in cached
	 * mode, and a writer takes the daemon path. */
	fm_wait_released(0);
	fd = OK(open(mp("e"), O_RDWR));
	cr_assert_eq(stat_of("passthrough_opens"), pt0 + 1, "no passthrough for an existing file");
	cr_assert_eq(stat_of("copy_ups"), cu0 + 1);
	/* Three 4 KiB writes in three different units, one across two. */
	const off_t at[3] = { 4096, 7 * MiB + 100, 12 * MiB + (64 << 10) - 2048 };
	for (int k = 0; k < 3; k++) {
		memset(want + at[k], 'A' + k, 4096);
		fm_pwrite_all(fd, want + at[k], 4096, at[k]);
	}
	/* Reads through the passthrough fd see the copy and the writes. */
	unsigned char got[8192];
	fm_pread_all(fd, got, sizeof(got), 7 * MiB);
	cr_assert(memcmp(got, want + 7 * MiB, sizeof(got)) == 0);
	OK(close(fd));
	cr_assert_eq(stat_of("fuse_requests_write"), wr0, "writes went through the daemon");
	/* The close's RELEASE hands the changes over: the upload measured. */
	fm_wait_released(0);
	/* four 64 KiB units changed: 4096..8191 in unit 0, one in unit 112,
	 * two for the write across the boundary of units 192 and 193 */
	uint64_t up1 = uploaded_after(mp("e"));
	cr_assert_eq(up1 - up0, 4 * (64 << 10),
		     "the upload stored %llu bytes, not the changed units' %u",
		     (unsigned long long)(up1 - up0), 4u * (64 << 10));
	fm_remount_cold();
	fd = OK(open(mp("e"), O_RDONLY));
	unsigned char *all = malloc(size);
	cr_assert(all);
	fm_pread_all(fd, all, size, 0);
	OK(close(fd));
	for (uint64_t k = 0; k < size; k++)
		if (all[k] != want[k])
			cr_assert_fail("byte %llu: %02x, want %02x", (unsigned long long)k, all[k],
				       want[k]);
	free(all);
	free(want);
}

/*
 * A file reopened for writing while its last close's upload is in flight
 * is copied, once the commit is made, from that upload's staging file, not
 * fetched back from the store; the writes of the reopen land on that copy
 * and its commit stores only the units they changed.
 */
Test(passthrough, a_reopen_during_the_upload_copies_from_its_staging_file)
{
	const uint64_t size = 9 * MiB + 777;
	unsigned char *want = malloc(size);
	uint64_t h0, cu0, cs0, miss0, up0;
	int fd;

	cr_assert(want);
	/* Uploads wait until someone needs them: the reopen below always
	 * comes while the first close's upload is in flight. */
	/* Without local copies, which would be taken over instead
	 * (integration-local_copy). */
	remount_with("upload_quiet_ms=600000,upload_delay_max_ms=600000,local_copies=0");
	h0 = stat_of("handoffs");
	write_pattern(mp("r"), 47, size, MiB);
	fill(47, want, size, 0);
	handed_over_since(h0);
	cr_assert_eq(stat_of("reconcile_committed_total"), 0);
	cu0 = stat_of("copy_ups");
	cs0 = stat_of("copy_ups_from_staging");
	miss0 = stat_of("cache_misses");
	up0 = stat_of("reconcile_upload_bytes_total") + stat_of("bytes_uploaded");
	fd = OK(open(mp("r"), O_RDWR));
	cr_assert_eq(stat_of("reconcile_committed_total"), 1, "the reopen did not wait for the commit");
	cr_assert_eq(stat_of("copy_ups"), cu0 + 1);
	cr_assert_eq(stat_of("copy_ups_from_staging"), cs0 + 1, "not copied from the staging file");
	cr_assert_eq(stat_of("cache_misses"), miss0, "the copy fetched objects from the store");
	/* What the first close uploaded: the whole file. */
	cr_assert_geq(stat_of("reconcile_upload_bytes_total") + stat_of("bytes_uploaded") - up0, size);
	/* The copy itself, every byte, through the passthrough fd. */
	unsigned char *got = malloc(size);
	cr_assert(got);
	fm_pread_all(fd, got, size, 0);
	for (uint64_t k = 0; k < size; k++)
		if (got[k] != want[k])
			cr_assert_fail("copy, byte %llu: %02x, want %02x", (unsigned long long)k,
				       got[k], want[k]);
	free(got);
	memset(want + 3 * MiB + 5, 'x', 5000);
	fm_pwrite_all(fd, want + 3 * MiB + 5, 5000, 3 * MiB + 5);
	memset(want + size - 10, 'y', 10);
	fm_pwrite_all(fd, want + size - 10, 10, (off_t)(size - 10));
	OK(close(fd));
	up0 = stat_of("reconcile_upload_bytes_total") + stat_of("bytes_uploaded");
	/* Two 64 KiB units changed, the last one short. */
	cr_assert_leq(uploaded_after(mp("r")) - up0, 2 * (64 << 10));
	fm_remount_cold();
	fm_expect_content(mp("r"), want, size);
	free(want);
}

/* Opening for write and closing without writing changes nothing: no upload,
 * the same mtime (as ext4). */
Test(passthrough, write_open_without_writes_changes_nothing)
{
	struct stat a, b;
	uint64_t up0;

	write_pattern(mp("q"), 7, 3 * MiB, MiB);
	up0 = uploaded_after(mp("q"));
	/* Not open in cached mode any more (that reader's RELEASE): the
	 * write opens below get passthrough with a copy-up. */
	fm_wait_released(0);
	OK(stat(mp("q"), &a));
	usleep(20 * 1000);
	OK(close(OK(open(mp("q"), O_WRONLY))));
	OK(close(OK(open(mp("q"), O_RDWR))));
	/* What the RELEASEs do is what is checked: wait for them. */
	fm_wait_released(0);
	cr_assert_eq(uploaded_after(mp("q")), up0);
	OK(stat(mp("q"), &b));
	cr_assert(a.st_mtim.tv_sec == b.st_mtim.tv_sec && a.st_mtim.tv_nsec == b.st_mtim.tv_nsec,
		  "mtime moved from %lld.%09ld to %lld.%09ld", (long long)a.st_mtim.tv_sec,
		  a.st_mtim.tv_nsec, (long long)b.st_mtim.tv_sec, b.st_mtim.tv_nsec);
	fm_remount_cold();
	check_pattern(mp("q"), 7, 3 * MiB);
}

/* O_APPEND, ftruncate down and up, and a shared mapping, on files with
 * content, all through passthrough staging files. */
Test(passthrough, existing_file_append_truncate_mmap)
{
	unsigned char *want = malloc(4 * MiB), *p;
	uint64_t w0;
	struct stat st;
	int fd;

	cr_assert(want);
	write_pattern(mp("a"), 3, 2 * MiB, MiB);
	fill(3, want, 2 * MiB, 0);
	/* Passthrough throughout: no WRITE reaches the daemon. (An open may
	 * share the staging file of the last, not yet released one, so the
	 * count of new passthrough files says nothing here.) */
	w0 = stat_of("fuse_requests_write");
	fd = OK(open(mp("a"), O_WRONLY | O_APPEND));
	cr_assert_eq(write(fd, "tail", 4), 4);
	memcpy(want + 2 * MiB, "tail", 4);
	OK(close(fd));
	OK(stat(mp("a"), &st));
	cr_assert_eq(st.st_size, 2 * MiB + 4);

	fd = OK(open(mp("a"), O_RDWR));
	OK(ftruncate(fd, MiB));
	OK(ftruncate(fd, 3 * MiB)); /* MiB..3 MiB reads as zeros now */
	memset(want + MiB, 0, 2 * MiB);
	p = mmap(NULL, 3 * MiB, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	cr_assert(p != MAP_FAILED, "mmap: %s", strerror(errno));
	cr_assert(memcmp(p, want, 3 * MiB) == 0, "the mapping does not show the file");
	memset(p + 100, 'm', 5000);
	memset(want + 100, 'm', 5000);
	OK(msync(p, 3 * MiB, MS_SYNC));
	OK(munmap(p, 3 * MiB));
	OK(close(fd));
	cr_assert_eq(stat_of("fuse_requests_write"), w0, "writes took the daemon path");
	fm_remount_cold();
	fd = OK(open(mp("a"), O_RDONLY));
	OK(fstat(fd, &st));
	cr_assert_eq(st.st_size, 3 * MiB);
	p = malloc(3 * MiB);
	cr_assert(p);
	fm_pread_all(fd, p, 3 * MiB, 0);
	OK(close(fd));
	cr_assert(memcmp(p, want, 3 * MiB) == 0, "content after remount");
	free(p);
	free(want);
}

/* Past passthrough_copy_max, a write open takes the daemon path. */
Test(passthrough, files_past_the_copy_limit_take_the_daemon_path)
{
	unsigned char blk[4096] = { 9 };
	uint64_t big0, w0;
	int fd;

	/* Written before the remount: an open right after a close may share
	 * the staging file the close's RELEASE has not let go of yet. */
	write_pattern(mp("big"), 4, 2 * MiB, MiB);
	write_pattern(mp("small"), 5, MiB / 2, MiB);
	remount_with("passthrough_copy_max=1m");
	big0 = stat_of("copy_up_too_big");
	w0 = stat_of("fuse_requests_write");
	fd = OK(open(mp("big"), O_WRONLY));
	fm_pwrite_all(fd, blk, sizeof(blk), 0);
	OK(close(fd));
	cr_assert_eq(stat_of("copy_up_too_big"), big0 + 1);
	cr_assert_geq(stat_of("fuse_requests_write"), w0 + 1, "the big file's write skipped the daemon");
	w0 = stat_of("fuse_requests_write");
	fd = OK(open(mp("small"), O_WRONLY));
	fm_pwrite_all(fd, blk, sizeof(blk), 0);
	OK(close(fd));
	cr_assert_eq(stat_of("fuse_requests_write"), w0, "the small file's write took the daemon path");
}

/*
 * A sparse passthrough file of a tebibyte costs what its data costs: an
 * fsync stores the units written since the last one, not the holes (which
 * are not even read), and the close after it stores nothing again.
 */
Test(passthrough, sparse_tebibyte_file_stores_only_its_data)
{
	const off_t T = (off_t)1 << 40;
	const off_t at[4] = { 0, T / 2, T - 4096, 3 * (T / 4) };
	uint64_t put0, up0;
	char got[6] = { 0 };
	int fd = OK(open(mp("sparse"), O_CREAT | O_RDWR | O_TRUNC, 0644));

	for (int k = 0; k < 3; k++)
		fm_pwrite_all(fd, "hello", 5, at[k]);
	put0 = stat_of("objects_put");
	OK(fsync(fd));
	cr_assert_eq(stat_of("objects_put") - put0, 3, "the first fsync stored %llu objects",
		     (unsigned long long)(stat_of("objects_put") - put0));
	fm_pwrite_all(fd, "three", 5, at[3]);
	put0 = stat_of("objects_put");
	OK(fsync(fd));
	cr_assert_eq(stat_of("objects_put") - put0, 1);
	up0 = uploaded_after(mp("sparse"));
	OK(close(fd));
	fm_wait_released(0); /* as in fsync_uploads_only_changed_blocks */
	cr_assert_eq(uploaded_after(mp("sparse")), up0, "the close stored again what fsync had");
	fm_remount_cold();
	fd = OK(open(mp("sparse"), O_RDONLY));
	for (int k = 0; k < 4; k++) {
		fm_pread_all(fd, got, 5, at[k]);
		cr_assert_str_eq(got, k == 3 ? "three" : "hello", "at %lld", (long long)at[k]);
	}
	fm_pread_all(fd, got, 5, 4096);
	cr_assert(memcmp(got, "\0\0\0\0\0", 5) == 0, "a hole does not read as zeros");
	/* (the 64 KiB unit around a write is stored whole: data, as SEEK_DATA
	 * may count zeros) */
	cr_assert_geq(lseek(fd, 128 << 10, SEEK_DATA), T / 4, "SEEK_DATA found data in the first hole");
	OK(close(fd));
}

/* Bytes written over with the same bytes change nothing to upload, but the
 * write moves mtime (as on ext4): through an fsync's commit and through a
 * close's hand-off alike, and it is still there after a remount. */
static void rewrite_same_bytes(const char *name, bool fsync_first)
{
	const struct timespec old[2] = { { .tv_sec = 1000000000 }, { .tv_sec = 1000000000 } };
	unsigned char buf[64 * 1024];
	struct stat st, again;
	int fd;

	write_pattern(mp("%s", name), 11, 2 * MiB, MiB);
	OK(utimensat(AT_FDCWD, mp("%s", name), old, 0));
	fm_wait_committed("the old mtime", 60);
	fm_wait_released(0);
	fd = OK(open(mp("%s", name), O_RDWR));
	fm_pread_all(fd, buf, sizeof(buf), 0);
	fm_pwrite_all(fd, buf, sizeof(buf), 0);
	if (fsync_first)
		OK(fsync(fd));
	OK(close(fd));
	fm_wait_committed("the rewrite", 60);
	OK(stat(mp("%s", name), &st));
	cr_assert_gt(st.st_mtim.tv_sec, old[1].tv_sec, "%s: mtime stayed %lld after a write",
		     name, (long long)st.st_mtim.tv_sec);
	fm_remount_cold();
	OK(stat(mp("%s", name), &again));
	cr_assert(again.st_mtim.tv_sec == st.st_mtim.tv_sec &&
		  again.st_mtim.tv_nsec == st.st_mtim.tv_nsec,
		  "%s (fsync %d): mtime %lld.%09ld before the remount, %lld.%09ld after", name,
		  fsync_first, (long long)st.st_mtim.tv_sec, st.st_mtim.tv_nsec,
		  (long long)again.st_mtim.tv_sec, again.st_mtim.tv_nsec);
	check_pattern(mp("%s", name), 11, 2 * MiB);
}

Test(passthrough, rewriting_the_same_bytes_moves_mtime)
{
	rewrite_same_bytes("fsynced", true);
	rewrite_same_bytes("closed", false);
}
