/*
 * ferry warmup PATH...: reads every regular file under the PATHs once, so
 * that ferry-mountd fetches their objects into its read cache ahead of
 * use (its read-ahead fetches several at a time). The pages this read puts
 * in the kernel's page cache are dropped as it goes: the point is the read
 * cache on disk, not memory. On a terminal a progress bar shows bytes,
 * files and the rate; otherwise one summary line at the end. A file that
 * cannot be read is named on stderr and the rest go on; the exit code is 1
 * if any failed.
 */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <getopt.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <time.h>
#include <unistd.h>

#include "ctl.h"

#define FUSE_SUPER_MAGIC 0x65735546
#define CHUNK (1u << 20)

/* nftw has no user pointer: one warmup per process, state here. */
static struct {
	bool counting;      /* first walk: sizes only */
	bool bar;           /* progress on a terminal */
	uint64_t total, done;
	unsigned long files, nfiles, warmed, failed;
	char *buf;          /* owned: CHUNK bytes */
	double start, last_bar;
} w;

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void bar(bool final)
{
	double t = now_s(), el = t - w.start;
	int width = 30, fill = w.total ? (int)((double)w.done / (double)w.total * width) : width;

	if (!w.bar || (!final && t - w.last_bar < 0.1))
		return;
	w.last_bar = t;
	fprintf(stderr, "\rwarmup [%.*s%.*s] %3d%%  %llu/%llu MiB  %.0f MB/s  %lu/%lu files",
		fill, "##############################", width - fill,
		"..............................",
		w.total ? (int)(w.done * 100 / w.total) : 100, (unsigned long long)(w.done >> 20),
		(unsigned long long)(w.total >> 20), el > 0 ? (double)w.done / el / 1e6 : 0.0,
		w.files, w.nfiles);
	if (final)
		fputc('\n', stderr);
}

static int warm_file(const char *path)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	off_t off = 0;
	int err = 0;

	if (fd < 0)
		return errno;
	(void)posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
	for (;;) {
		ssize_t n = read(fd, w.buf, CHUNK);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			err = errno;
			break;
		}
		if (n == 0)
			break;
		(void)posix_fadvise(fd, off, n, POSIX_FADV_DONTNEED);
		off += n;
		w.done += (uint64_t)n;
		bar(false);
	}
	close(fd);
	return err;
}

static int visit(const char *path, const struct stat *st, int type, struct FTW *ftw)
{
	int err;

	(void)ftw;
	if (type == FTW_DNR || type == FTW_NS) {
		if (!w.counting) {
			ctl_err("warmup: %s: cannot %s it", path, type == FTW_DNR ? "list" : "stat");
			w.failed++;
		}
		return 0;
	}
	if (type != FTW_F || !S_ISREG(st->st_mode))
		return 0;
	if (w.counting) {
		w.total += (uint64_t)st->st_size;
		w.nfiles++;
		return 0;
	}
	err = warm_file(path);
	w.files++;
	if (!err)
		w.warmed++;
	if (err) {
		if (w.bar)
			fputc('\n', stderr);
		ctl_err("warmup: %s: %s", path, strerror(err));
		w.failed++;
	}
	return 0;
}

int cmd_warmup(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "quiet", no_argument, NULL, 'q' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	bool quiet = false;
	int c, rc = 0;

	while ((c = getopt_long(argc, argv, "qh", longopts, NULL)) != -1) {
		switch (c) {
		case 'q': quiet = true; break;
		case 'h':
			printf("usage: ferry warmup [--quiet] PATH...\n");
			return 0;
		default: return 2;
		}
	}
	if (optind >= argc) {
		ctl_err("usage: ferry warmup [--quiet] PATH...");
		return 2;
	}
	for (int i = optind; i < argc; i++) {
		struct statfs sf;

		if (statfs(argv[i], &sf) < 0) {
			ctl_err("warmup: %s: %s", argv[i], strerror(errno));
			return 1;
		}
		if (sf.f_type != FUSE_SUPER_MAGIC) {
			ctl_err("warmup: %s is not on a ferryfs (FUSE) mount", argv[i]);
			return 1;
		}
	}
	w.buf = malloc(CHUNK);
	if (!w.buf) {
		ctl_err("warmup: out of memory");
		return 1;
	}
	w.bar = !quiet && isatty(STDERR_FILENO);
	w.counting = true;
	for (int i = optind; i < argc; i++)
		(void)nftw(argv[i], visit, 16, FTW_PHYS | FTW_MOUNT);
	w.counting = false;
	w.start = w.last_bar = now_s();
	for (int i = optind; i < argc; i++)
		(void)nftw(argv[i], visit, 16, FTW_PHYS | FTW_MOUNT);
	bar(true);
	if (!quiet) {
		double el = now_s() - w.start;

		printf("warmed %lu files, %llu MiB in %.1f s (%.0f MB/s)%s\n", w.warmed,
		       (unsigned long long)(w.done >> 20), el,
		       el > 0 ? (double)w.done / el / 1e6 : 0.0, w.failed ? "; some failed" : "");
	}
	if (w.failed) {
		ctl_err("warmup: %lu file%s could not be read", w.failed, w.failed == 1 ? "" : "s");
		rc = 1;
	}
	free(w.buf);
	return rc;
}
