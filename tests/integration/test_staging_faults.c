/*
 * The staging file system misbehaving, through a real mount whose
 * --staging-dir is a file system of the test's own:
 *  - full (ENOSPC) in the middle of a write (a small tmpfs);
 *  - remounted read-only (`mount -o remount,ro` of a tmpfs) while writers
 *    keep creating, writing, fsyncing and closing files, then read-write
 *    again. The kernel refuses the remount while any file on it is open for
 *    writing, so it lands between files (writes in flight at that moment
 *    are impossible by the kernel's rule; the workload is in flight around
 *    it);
 *  - turned read-only under open files by an error (ext4 on a loop device
 *    with errors=remount-ro, an error injected through its sysfs
 *    trigger_fs_error): the way a staging disk goes read-only in life,
 *    with passthrough writes in flight. ext4 cannot be made read-write
 *    again after that without an unmount and a check, so the test ends the
 *    mount, checks the file system, and mounts again.
 * What close() reported as done must be intact afterwards (read back after
 * a remount with an empty cache); the application sees ENOSPC, EROFS or EIO
 * -- honest errors -- and never wrong bytes (a file whose writes failed holds
 * a prefix of them, or zeros where they failed); and the mount works again
 * once the staging file system has room or is writable. scripts/test runs it
 * with passthrough on and off (the daemon path then has the writeback
 * cache, whose write-backs fail after write() returned: close() tells).
 */
#include "mount_util.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mount.h>
#include <sys/statvfs.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#define MiB (1024 * 1024)

/* These tests count the staging filesystem's space (full, and empty once
 * drained): no local copies keep any of it. */
static void staging_mount(void)
{
	fm_mount_with("local_copies=0");
}

static void staging_setup(void)
{
	fm_setup_opts(&(struct fm_opts){ .no_mount = true });
	snprintf(fm.staging, sizeof(fm.staging), "%s", sp("staging"));
	cr_assert(mkdir(fm.staging, 0700) == 0);
	cr_assert(mount("ferry-test-staging", fm.staging, "tmpfs", MS_NOSUID | MS_NODEV,
			"size=8m,mode=0700") == 0, "tmpfs: %s", strerror(errno));
	/* Passthrough even on a nearly full staging file system: the point
	 * is to fill it in the middle of a write. */
	fm.staging_min_free = "0";
	staging_mount();
}

static void writers_stop(void);

static void staging_teardown(void)
{
	/* A failed assertion leaves the writers going, their files open. */
	writers_stop();
	/* ferryfs first (it stages there), then the tmpfs, lazily, even if
	 * that failed -- and both before fm_teardown() removes the tree. */
	if (fm.mounted) {
		const char *argv[] = { fm_bin("ferry"), "umount", fm.mnt, NULL };

		if (fm_run(argv, NULL, NULL, 60) == 0)
			fm.mounted = false;
	}
	if (fm.staging[0])
		umount2(fm.staging, MNT_DETACH);
	fm_teardown();
}

TestSuite(staging_faults, .init = staging_setup, .fini = staging_teardown, .timeout = 180);

/* A passthrough close() returns before the kernel's RELEASE reaches
 * ferry-mountd (no FLUSH upcall): waits until every handle is released. */
static void released(void)
{
	struct fm_stats s;

	for (int i = 0; i < 300; i++) {
		fm_stats_read(&s);
		if (fm_stats_need(&s, "open_handles") == 0)
			return;
		usleep(100 * 1000);
	}
	cr_assert_fail("files closed long ago are still open in ferry-mountd");
}

/* Until the reconciler has nothing staged and the staging file system is
 * nearly empty again (a file that could not be handed over, its journal
 * record finding no room, is committed by ferry-mountd in its RELEASE,
 * after close() returned). */
static void drained(void)
{
	struct fm_stats s;
	struct statvfs sv;

	/* Until its RELEASE, a closed file is not handed over and the gauge
	 * has nothing to count yet. */
	released();
	for (int i = 0; i < 300; i++) {
		fm_stats_read(&s);
		if (fm_stats_need(&s, "passthrough_staging_blocks") == 0 &&
		    statvfs(fm.staging, &sv) == 0 &&
		    (uint64_t)(sv.f_blocks - sv.f_bfree) * sv.f_frsize < 1024 * 1024)
			return;
		usleep(100 * 1000);
	}
	cr_assert_fail("staged blocks never drained");
}

Test(staging_faults, full_staging_is_enospc_and_closed_files_stay)
{
	size_t big_len = 16 * MiB, done = 0;
	unsigned char *small = malloc(64 * 1024), *big = malloc(big_len);
	uint64_t seed = 21;
	int fd, err = 0, close_rc;

	cr_assert(small && big);
	fm_fill_random(&seed, small, 64 * 1024);
	fm_fill_random(&seed, big, big_len);
	fm_write_file(mp("small"), small, 64 * 1024);

	/* More than the staging file system holds. */
	fd = OK(open(mp("big"), O_CREAT | O_WRONLY | O_CLOEXEC, 0644));
	while (done < big_len) {
		ssize_t n = write(fd, big + done, MiB < big_len - done ? MiB : big_len - done);

		if (n < 0) {
			err = errno;
			break;
		}
		done += (size_t)n;
	}
	close_rc = close(fd);
	int close_err = close_rc < 0 ? errno : 0;
	struct fm_stats st;
	uint64_t wb = 0;
	fm_stats_read(&st);
	fm_stats_get(&st, "writeback_cache", &wb);
	/* With the writeback cache (the daemon path by default) the kernel
	 * takes the writes and the write-back fails: close() says ENOSPC,
	 * as on NFS. Otherwise write() does. */
	if (wb && !err)
		cr_assert_eq(close_err, ENOSPC, "writes into a full staging file system through "
			     "the writeback cache: close() said %s",
			     close_err ? fm_errname(close_err) : "ok");
	else
		cr_assert_eq(err, ENOSPC, "a write into a full staging file system: %s, after %zu "
			     "bytes", err ? fm_errname(err) : "no error", done);
	cr_log_info("wrote %zu of %zu bytes before ENOSPC; close %s", done, big_len,
		    close_rc == 0 ? "ok" : strerror(close_err));

	/* Once the reconciler has taken what was staged, there is room again. */
	drained();
	fm_write_file(mp("after"), small, 64 * 1024);
	drained();
	fm_remount_cold();
	fm_expect_content(mp("small"), small, 64 * 1024);
	fm_expect_content(mp("after"), small, 64 * 1024);
	if (close_rc == 0) {
		/* close() said the file is as written: every byte a write()
		 * reported is there, nothing else. */
		fm_expect_content(mp("big"), big, done);
	} else {
		/* Not promised; still never wrong bytes where it has any. */
		size_t got = 0;
		unsigned char *back = fm_read_file(mp("big"), &got);

		cr_assert(back || errno == EIO);
		if (back)
			cr_assert(got <= done && memcmp(back, big, got) == 0,
				  "wrong bytes in a file whose close failed");
		free(back);
	}
	free(small);
	free(big);
}

/* ---- a read-only staging file system ---- */

#define WRITERS 3
#define WFILES_MAX 4096 /* per writer */
#define WLEN_MAX (512 * 1024)
#define CHUNK (64 * 1024)
#define PRE_LEN (256 * 1024)

/* One file a writer wrote, as the application saw it. */
struct wfile {
	int gen;          /* the phase its open() started in */
	size_t len;       /* meant to write */
	size_t written;   /* write() said so */
	int err;          /* the first call that failed: its errno, or 0 */
	bool closed;      /* close() returned 0 */
};

struct writer {
	int id;
	pthread_t thread;
	_Atomic int n;            /* files started */
	_Atomic int done[3];      /* files finished, by the phase they started in */
	struct wfile f[WFILES_MAX];
};

/* 0: writable; 1: read-only; 2: writable again (or, for ext4, the end). */
static _Atomic int ro_gen;
static _Atomic bool ro_stop, ro_hold;
static int writers_live; /* threads started */
static struct writer writers[WRITERS];
static char loop_img[PATH_MAX];

static size_t wfile_data(int w, int k, unsigned char *buf)
{
	uint64_t st = 0x57a6 + (uint64_t)w * 100003 + (uint64_t)k;
	size_t len = 4096 + (size_t)(fm_rand(&st) % (WLEN_MAX - 4096));

	if (buf)
		fm_fill_random(&st, buf, len);
	return len;
}

/* Not mp(): its ring of buffers is not for threads. */
static void wfile_path(int w, int k, char *out, size_t size)
{
	snprintf(out, size, "%s/ro/w%d-%04d", fm.mnt, w, k);
}

static bool honest_errno(int e)
{
	return e == EROFS || e == EIO || e == ENOSPC;
}

static void *writer_main(void *arg)
{
	struct writer *wr = arg;
	unsigned char *buf = malloc(WLEN_MAX);
	char path[PATH_MAX + 32];

	while (buf && !atomic_load(&ro_stop) && wr->n < WFILES_MAX) {
		int k = atomic_load(&wr->n), fd;
		struct wfile *f = &wr->f[k];

		atomic_store(&wr->n, k + 1);
		while (atomic_load(&ro_hold) && !atomic_load(&ro_stop))
			usleep(1000);
		f->gen = atomic_load(&ro_gen);
		f->len = wfile_data(wr->id, k, buf);
		wfile_path(wr->id, k, path, sizeof(path));
		fd = open(path, O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0644);
		if (fd < 0) {
			f->err = errno;
		} else {
			while (f->written < f->len) {
				size_t left = f->len - f->written;
				ssize_t n;

				n = write(fd, buf + f->written, left < CHUNK ? left : CHUNK);

				if (n < 0) {
					f->err = errno;
					break;
				}
				f->written += (size_t)n;
			}
			if (!f->err && k % 3 == 2 && fsync(fd) != 0)
				f->err = errno;
			if (close(fd) == 0)
				f->closed = true;
			else if (!f->err)
				f->err = errno;
		}
		atomic_fetch_add(&wr->done[f->gen], 1);
	}
	free(buf);
	return NULL;
}

static void writers_start(void)
{
	atomic_store(&ro_gen, 0);
	atomic_store(&ro_stop, false);
	atomic_store(&ro_hold, false);
	OK(mkdir(mp("ro"), 0755));
	for (int w = 0; w < WRITERS; w++) {
		memset(&writers[w], 0, sizeof(writers[w]));
		writers[w].id = w;
		cr_assert_eq(pthread_create(&writers[w].thread, NULL, writer_main, &writers[w]), 0);
		writers_live++;
	}
}

static void writers_stop(void)
{
	atomic_store(&ro_stop, true);
	for (int w = 0; w < writers_live; w++)
		pthread_join(writers[w].thread, NULL);
	writers_live = 0;
}

/* Waits until every writer has finished n files started in phase gen (no
 * bound here: the suite's timeout ends a writer that hangs). */
static void writers_wait(int gen, int n)
{
	for (int w = 0; w < WRITERS; w++)
		while (atomic_load(&writers[w].done[gen]) < n) {
			cr_assert_lt(atomic_load(&writers[w].n), WFILES_MAX,
				     "writer %d used up its %d files", w, WFILES_MAX);
			usleep(2000);
		}
}

/* Every error the writers saw is an honest one, and every file started
 * while the staging file system was writable went through whole -- but
 * the one each writer had in hand when it turned read-only (the phase is
 * read before the open: it may have started a moment before the fault). */
static void writers_check_errors(void)
{
	int failed = 0;

	for (int w = 0; w < WRITERS; w++)
		for (int k = 0; k < writers[w].n; k++) {
			const struct wfile *f = &writers[w].f[k];

			if (!f->err)
				continue;
			failed++;
			cr_assert(honest_errno(f->err), "w%d-%04d (phase %d): %s, not "
				  "EROFS/EIO/ENOSPC", w, k, f->gen, fm_errname(f->err));
			bool at_fault = f->gen == 0 &&
					(k + 1 == writers[w].n || writers[w].f[k + 1].gen > 0);
			cr_assert(f->gen == 1 || at_fault, "w%d-%04d, started while the staging "
				  "file system was writable (phase %d), failed: %s", w, k, f->gen,
				  fm_errname(f->err));
		}
	cr_log_info("%d files of the writers failed while the staging file system was read-only",
		    failed);
}

/* Every file whose writes and close() returned is intact; any other is
 * absent or holds a prefix of what was meant, never other bytes. */
static void writers_verify(const char *when)
{
	unsigned char *want = malloc(WLEN_MAX);
	char path[PATH_MAX + 32];

	cr_assert(want);
	for (int w = 0; w < WRITERS; w++)
		for (int k = 0; k < writers[w].n; k++) {
			const struct wfile *f = &writers[w].f[k];
			bool promised = f->closed && f->written == f->len;
			struct stat st;
			size_t got_len = 0;
			unsigned char *got;

			wfile_data(w, k, want);
			wfile_path(w, k, path, sizeof(path));
			if (promised) {
				got = fm_read_file(path, &got_len);
				cr_assert(got_len == f->len && memcmp(got, want, f->len) == 0,
					  "%s: %s, whose writes and close() returned (opened in "
					  "phase %d), holds %zu bytes, not the %zu written%s", when,
					  path, f->gen, got_len, f->len,
					  got_len == f->len ? " (other bytes)" : "");
				free(got);
				continue;
			}
			if (stat(path, &st) != 0) {
				cr_assert_eq(errno, ENOENT, "%s: %s: stat: %s", when, path,
					     strerror(errno));
				continue;
			}
			/* A prefix of what was meant, where a write that failed
			 * may read as zeros (the writeback cache keeps the size
			 * the application wrote); never other bytes. */
			got = fm_read_file(path, &got_len);
			size_t bad = 0;
			while (bad < got_len && bad < f->len && (got[bad] == want[bad] || !got[bad]))
				bad++;
			cr_assert(got_len <= f->len && bad == got_len,
				  "%s: %s (its write failed: %s) holds %zu bytes, not a prefix of "
				  "the %zu meant: byte %zu differs", when, path, fm_errname(f->err),
				  got_len, f->len, bad);
			free(got);
		}
	free(want);
}

/* Files of the test's own, made before the fault, changed during it. */
static unsigned char pre_data[PRE_LEN];

static void pre_files_make(void)
{
	uint64_t st = 99;

	fm_fill_random(&st, pre_data, sizeof(pre_data));
	fm_write_file(mp("pre-a"), pre_data, sizeof(pre_data));
	fm_write_file(mp("pre-b"), pre_data, sizeof(pre_data));
	fm_write_file(mp("pre-c"), pre_data, sizeof(pre_data));
	/* Handed over before the fault: no live staging file of theirs is
	 * left for a later open to share. (An open for writing that shares
	 * one on a disk that failed read-only gets EIO from the kernel, which
	 * cannot open the backing file for writing.) */
	released();
}

/* Namespace and metadata changes need no staging file: they work while it
 * is read-only. A write into a new file fails honestly; the create stays. */
static void pre_files_change_while_read_only(void)
{
	int fd;

	OK(mkdir(mp("ro-dir"), 0755));
	OK(rename(mp("pre-a"), mp("post-a")));
	OK(truncate(mp("pre-b"), 1000));
	fd = OK(open(mp("pre-c"), O_RDWR | O_CLOEXEC));
	OK(fsync(fd));
	OK(close(fd));
	fd = OK(open(mp("ro-new"), O_CREAT | O_WRONLY | O_CLOEXEC, 0644));
	errno = 0;
	ssize_t n = write(fd, pre_data, 4096);
	int werr = n < 0 ? errno : 0;
	cr_assert(n == 4096 || (n < 0 && honest_errno(werr)),
		  "a write into a new file on a read-only staging file system: %zd, %s", n,
		  fm_errname(werr));
	/* Through the writeback cache (the daemon path) write() takes the
	 * bytes and the write-back is refused: close() tells, as on NFS. */
	errno = 0;
	int crc = close(fd);
	int cerr = crc < 0 ? errno : 0;
	cr_assert(crc == 0 || honest_errno(cerr), "close() of it: %s", fm_errname(cerr));
	cr_log_info("a write into a new file with the staging file system read-only: %s, "
		    "close: %s", werr ? fm_errname(werr) : "went through",
		    cerr ? fm_errname(cerr) : "0");
}

static void pre_files_verify(void)
{
	struct stat st;

	FAILS(stat(mp("pre-a"), &st), ENOENT);
	fm_expect_content(mp("post-a"), pre_data, sizeof(pre_data));
	fm_expect_content(mp("pre-b"), pre_data, 1000);
	fm_expect_content(mp("pre-c"), pre_data, sizeof(pre_data));
	OK(stat(mp("ro-dir"), &st));
	cr_assert(S_ISDIR(st.st_mode));
	OK(stat(mp("ro-new"), &st));
	cr_assert(st.st_size == 0 || st.st_size == 4096, "ro-new has %lld bytes",
		  (long long)st.st_size);
}

static uint64_t stat_value(const char *name)
{
	struct fm_stats s;

	fm_stats_read(&s);
	return fm_stats_need(&s, name);
}

/* -- `mount -o remount,ro` of a tmpfs -- */

static void staging_tmpfs_setup(void)
{
	fm_setup_opts(&(struct fm_opts){ .no_mount = true });
	snprintf(fm.staging, sizeof(fm.staging), "%s", sp("staging"));
	cr_assert(mkdir(fm.staging, 0700) == 0);
	cr_assert(mount("ferry-test-staging", fm.staging, "tmpfs", MS_NOSUID | MS_NODEV,
			"size=256m,mode=0700") == 0, "tmpfs: %s", strerror(errno));
	fm.staging_min_free = "0";
	staging_mount();
}

TestSuite(staging_remount_ro, .init = staging_tmpfs_setup, .fini = staging_teardown,
	  .timeout = 300);

Test(staging_remount_ro, remount_ro_under_writers_is_honest_and_recovers)
{
	unsigned long flags = MS_REMOUNT | MS_NOSUID | MS_NODEV;
	uint64_t pt_opens;
	int tries = 0;

	pre_files_make();
	writers_start();
	writers_wait(0, 5);
	/* The kernel takes the remount only when nothing on the file system
	 * is open for writing: between the writers' files, and between the
	 * reconciler's jobs. Keep asking; if the writers never leave a gap,
	 * let them pause at their next file boundary. */
	/* The phase turns before each try: a file started after it may fail. */
	for (;;) {
		atomic_store(&ro_gen, 1);
		if (mount(NULL, fm.staging, NULL, flags | MS_RDONLY, NULL) == 0)
			break;
		atomic_store(&ro_gen, 0);
		cr_assert_eq(errno, EBUSY, "remount,ro: %s", strerror(errno));
		cr_assert_lt(++tries, 60000, "the staging file system never became idle enough "
			     "for a read-only remount (EBUSY): something holds a file open there");
		if (tries == 1000)
			atomic_store(&ro_hold, true);
		usleep(1000);
	}
	atomic_store(&ro_hold, false);
	cr_log_info("remounted read-only after %d tries%s", tries + 1,
		    tries >= 1000 ? " (the writers paused for it)" : "");
	pre_files_change_while_read_only();
	writers_wait(1, 4);
	/* Writable again: the same daemons take writes again, no restart. */
	pt_opens = stat_value("passthrough_opens");
	OK(mount(NULL, fm.staging, NULL, flags, NULL));
	atomic_store(&ro_gen, 2);
	writers_wait(2, 6);
	writers_stop();
	writers_check_errors();
	if (stat_value("passthrough_active"))
		cr_assert_gt(stat_value("passthrough_opens"), pt_opens,
			     "passthrough never came back after the staging file system was "
			     "writable again");
	writers_verify("live");
	pre_files_verify();
	drained();
	fm_remount_cold();
	writers_verify("after a remount");
	pre_files_verify();
}

/* -- ext4 going read-only on an error, under open files -- */

static void staging_ext4_setup(void)
{
	const char *mkfs[] = { "/sbin/mkfs.ext4", "-q", "-F", loop_img, NULL };
	int fd;

	fm_setup_opts(&(struct fm_opts){ .no_mount = true });
	snprintf(loop_img, sizeof(loop_img), "%s", sp("staging.img"));
	fd = open(loop_img, O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
	cr_assert(fd >= 0 && ftruncate(fd, 256 << 20) == 0, "%s: %s", loop_img, strerror(errno));
	close(fd);
	cr_assert_eq(fm_run(mkfs, NULL, NULL, 60), 0, "mkfs.ext4 %s", loop_img);
	snprintf(fm.staging, sizeof(fm.staging), "%s", sp("staging"));
	cr_assert(mkdir(fm.staging, 0700) == 0);
	const char *mnt[] = { "/bin/mount", "-o", "loop,errors=remount-ro,nosuid,nodev", loop_img,
			      fm.staging, NULL };
	cr_assert_eq(fm_run(mnt, NULL, NULL, 60), 0, "mount -o loop %s", loop_img);
	cr_assert(chmod(fm.staging, 0700) == 0);
	fm.staging_min_free = "0";
	staging_mount();
}

/* /sys/fs/ext4/<dev>/trigger_fs_error of the file system at path. */
static const char *ext4_error_knob(const char *path)
{
	static char knob[PATH_MAX + 64];
	char link[64], target[PATH_MAX];
	struct stat st;
	ssize_t n;

	cr_assert(stat(path, &st) == 0);
	snprintf(link, sizeof(link), "/sys/dev/block/%u:%u", major(st.st_dev), minor(st.st_dev));
	n = readlink(link, target, sizeof(target) - 1);
	cr_assert(n > 0, "readlink %s: %s", link, strerror(errno));
	target[n] = '\0';
	snprintf(knob, sizeof(knob), "/sys/fs/ext4/%s/trigger_fs_error", strrchr(target, '/') + 1);
	return knob;
}

/* An ext4 error: with errors=remount-ro, the file system turns read-only
 * at once, under whatever is open. */
static void ext4_error(const char *path)
{
	const char *knob = ext4_error_knob(path);
	int fd = open(knob, O_WRONLY | O_CLOEXEC);

	cr_assert(fd >= 0, "%s: %s", knob, strerror(errno));
	cr_assert(write(fd, "ferry test\n", 11) == 11, "%s: %s", knob, strerror(errno));
	close(fd);
}

/* Mounts (unmounted now) with a new, empty read cache. */
static void mount_cold(void)
{
	fm.n_cache++;
	snprintf(fm.cache, sizeof(fm.cache), "%s/cache-%d", fm.dir, fm.n_cache);
	cr_assert(mkdir(fm.cache, 0700) == 0, "mkdir %s: %s", fm.cache, strerror(errno));
	staging_mount();
}

TestSuite(staging_error_ro, .init = staging_ext4_setup, .fini = staging_teardown,
	  .timeout = 300);

Test(staging_error_ro, staging_disk_going_read_only_loses_nothing_closed)
{
	const char *fsck[] = { "/sbin/e2fsck", "-f", "-y", loop_img, NULL };
	const char *mnt[] = { "/bin/mount", "-o", "loop,errors=remount-ro,nosuid,nodev", loop_img,
			      fm.staging, NULL };
	unsigned char probe[PRE_LEN];
	uint64_t seed = 5;
	struct stat st;
	int probe_fd, rc;

	if (access(ext4_error_knob(fm.staging), W_OK) != 0) {
		staging_teardown();
		cr_skip_test("this kernel's ext4 has no trigger_fs_error to inject an error with");
	}
	pre_files_make();
	/* Open across the fault, its bytes written before it: close() then
	 * cannot journal the hand-off, so ferry-mountd commits the file
	 * itself, and its staging file cannot be removed. Truncated after,
	 * it must stay truncated whatever is found in the staging directory
	 * later. */
	fm_fill_random(&seed, probe, sizeof(probe));
	probe_fd = OK(open(mp("probe"), O_CREAT | O_WRONLY | O_CLOEXEC, 0644));
	fm_pwrite_all(probe_fd, probe, sizeof(probe), 0);
	/* As ext4's journal would within seconds: the staging file and its
	 * bytes are on the disk before the fault. */
	int dfd = OK(open(fm.staging, O_RDONLY | O_DIRECTORY | O_CLOEXEC));
	OK(syncfs(dfd));
	close(dfd);
	writers_start();
	writers_wait(0, 5);
	/* The phase turns first: a file started after it may fail. */
	atomic_store(&ro_gen, 1);
	ext4_error(fm.staging);
	rc = close(probe_fd);
	cr_log_info("close() of a file written before the staging disk went read-only: %s",
		    rc == 0 ? "0" : fm_errname(errno));
	cr_assert(rc == 0 || honest_errno(errno));
	pre_files_change_while_read_only();
	writers_wait(1, 4);
	writers_stop();
	writers_check_errors();
	/* Everything closed is readable now, from the object store or from
	 * staging files the kernel still caches. */
	writers_verify("live, the staging disk read-only");
	pre_files_verify();
	if (rc == 0)
		fm_expect_content(mp("probe"), probe, sizeof(probe));
	/* Once its RELEASE is through (a passthrough close() does not wait for
	 * it), the file has no live staging file: truncating it changes only
	 * the metadata. (Before, the truncate would be mirrored onto the
	 * staging file and fail with EROFS, honestly.) */
	released();
	OK(truncate(mp("probe"), 0));
	/* ferry umount commits what is staged (reading works), then the disk
	 * is checked and mounted again, as an operator would. */
	fm_umount();
	cr_assert(umount2(fm.staging, 0) == 0, "umount %s: %s", fm.staging, strerror(errno));
	rc = fm_run(fsck, NULL, NULL, 120);
	cr_assert(rc == 0 || rc == 1, "e2fsck exit %d", rc);
	cr_assert_eq(fm_run(mnt, NULL, NULL, 60), 0, "mount -o loop %s", loop_img);
	mount_cold();
	writers_verify("after the staging disk was checked and mounted again");
	pre_files_verify();
	OK(stat(mp("probe"), &st));
	cr_assert_eq(st.st_size, 0, "probe was truncated after its close, and has %lld bytes "
		     "again after a restart", (long long)st.st_size);
	/* And the mount takes writes again. */
	fm_write_file(mp("after"), probe, sizeof(probe));
	fm_remount_cold();
	fm_expect_content(mp("after"), probe, sizeof(probe));
}
