/*
 * A test shim (LD_PRELOAD): a disk that fails to flush, in one program.
 *
 * Loaded into every process of a mount, it acts only in the one whose
 * executable's name is $FERRY_FAULT_FSYNC_PROG (default ferry-reconciler).
 * While the control file $FERRY_FAULT_FSYNC_CTL exists, fsync() and
 * fdatasync() of a file whose path starts with $FERRY_FAULT_FSYNC_UNDER
 * fail with EIO, as a disk's write error reaches them (the data stays in
 * the page cache, no longer dirty). Everything else, the metadata database
 * included, flushes normally. Each failure adds one to the first 64-bit
 * word of the file $FERRY_FAULT_FSYNC_COUNT (mapped shared), if set.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

typedef int (*sync_fn)(int);

enum { ST_UNKNOWN, ST_OFF_HERE, ST_ACTIVE };
static _Atomic int state = ST_UNKNOWN;
static char ctl_path[4096], under[4096];
static _Atomic unsigned long long *_Atomic counts; /* mapped once, never unmapped */

static void copy_env(char *dst, size_t cap, const char *name)
{
	const char *v = getenv(name);

	snprintf(dst, cap, "%s", v ? v : "");
}

/* Is this the program to act in? Decided at the first flush. Two threads
 * deciding at once decide the same. */
static int acting(void)
{
	int st = atomic_load(&state);
	char exe[4096], want[256], cnt[4096];
	ssize_t n;
	const char *base;

	if (st != ST_UNKNOWN)
		return st == ST_ACTIVE;
	copy_env(want, sizeof(want), "FERRY_FAULT_FSYNC_PROG");
	if (!want[0])
		strcpy(want, "ferry-reconciler");
	copy_env(ctl_path, sizeof(ctl_path), "FERRY_FAULT_FSYNC_CTL");
	copy_env(under, sizeof(under), "FERRY_FAULT_FSYNC_UNDER");
	n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	exe[n > 0 ? n : 0] = '\0';
	base = strrchr(exe, '/');
	base = base ? base + 1 : exe;
	st = ctl_path[0] && under[0] && strcmp(base, want) == 0 ? ST_ACTIVE : ST_OFF_HERE;
	if (st == ST_ACTIVE && atomic_load(&counts) == NULL) {
		int fd;

		copy_env(cnt, sizeof(cnt), "FERRY_FAULT_FSYNC_COUNT");
		if (cnt[0] && (fd = open(cnt, O_RDWR | O_CLOEXEC)) >= 0) {
			void *m = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
			_Atomic unsigned long long *none = NULL;

			close(fd);
			if (m != MAP_FAILED &&
			    !atomic_compare_exchange_strong(&counts, &none,
							    (_Atomic unsigned long long *)m))
				munmap(m, 4096);
		}
	}
	atomic_store(&state, st);
	return st == ST_ACTIVE;
}

static int should_fail(int fd)
{
	char link[64], path[4096];
	ssize_t n;

	if (!acting() || access(ctl_path, F_OK) != 0)
		return 0;
	snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
	n = readlink(link, path, sizeof(path) - 1);
	if (n <= 0)
		return 0;
	path[n] = '\0';
	if (strncmp(path, under, strlen(under)) != 0)
		return 0;
	_Atomic unsigned long long *c = atomic_load(&counts);

	if (c)
		atomic_fetch_add(&c[0], 1);
	return 1;
}

static int call_next(const char *name, int fd)
{
	sync_fn next = (sync_fn)dlsym(RTLD_NEXT, name);

	if (!next) {
		errno = ENOSYS;
		return -1;
	}
	return next(fd);
}

int fsync(int fd)
{
	if (should_fail(fd)) {
		errno = EIO;
		return -1;
	}
	return call_next("fsync", fd);
}

int fdatasync(int fd)
{
	if (should_fail(fd)) {
		errno = EIO;
		return -1;
	}
	return call_next("fdatasync", fd);
}
