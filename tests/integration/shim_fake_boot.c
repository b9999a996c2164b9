/*
 * A test shim (LD_PRELOAD): the process reads $FERRY_FAKE_BOOT_ID as the
 * machine's boot id (/proc/sys/kernel/random/boot_id), as it would after a
 * reboot, without one. With the variable unset or empty, the real file is
 * read. Only open() and openat() of that exact path are changed (how
 * common/boot.c reads it); the answer is a memfd holding the id and a
 * newline, as the kernel's file reads.
 *
 * Works beside ASan: the real functions are the next ones in the lookup
 * order (ASan's interceptors or libc's).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define BOOT_ID_PATH "/proc/sys/kernel/random/boot_id"

typedef int (*open_fn)(const char *, int, ...);
typedef int (*openat_fn)(int, const char *, int, ...);

/* The fake id as a file to read, or -1 to read the real one. */
static int fake_boot_fd(const char *path, int flags)
{
	const char *id = getenv("FERRY_FAKE_BOOT_ID");
	int fd;

	if (!path || strcmp(path, BOOT_ID_PATH) != 0 || !id || !*id)
		return -1;
	fd = memfd_create("fake_boot_id", (flags & O_CLOEXEC) ? MFD_CLOEXEC : 0);
	if (fd < 0)
		return -1;
	size_t n = strlen(id);
	if (write(fd, id, n) != (ssize_t)n || write(fd, "\n", 1) != 1 ||
	    lseek(fd, 0, SEEK_SET) != 0) {
		close(fd);
		return -1;
	}
	return fd;
}

/* The next definition of sym (ASan's or libc's), looked up once. */
static void *next_fn(_Atomic(void *) *cache, const char *sym)
{
	void *f = atomic_load(cache);

	if (!f) {
		f = dlsym(RTLD_NEXT, sym);
		atomic_store(cache, f);
	}
	return f;
}

static _Atomic(void *) real_open, real_open64, real_openat;

/* open() or open64() (which glibc may call by either name). */
static int open_as(_Atomic(void *) *cache, const char *sym, const char *path, int flags,
		   mode_t mode)
{
	open_fn real = (open_fn)next_fn(cache, sym);
	int fd = fake_boot_fd(path, flags);

	if (fd >= 0)
		return fd;
	if (!real) {
		errno = ENOSYS;
		return -1;
	}
	return real(path, flags, mode);
}

/* The mode argument exists only with O_CREAT or O_TMPFILE. */
#define MODE_ARG(flags, mode)                                      \
	do {                                                       \
		va_list ap;                                        \
		va_start(ap, flags);                               \
		mode = (flags & (O_CREAT | O_TMPFILE)) ? (mode_t)va_arg(ap, int) : 0; \
		va_end(ap);                                        \
	} while (0)

int open(const char *path, int flags, ...)
{
	mode_t mode;

	MODE_ARG(flags, mode);
	return open_as(&real_open, "open", path, flags, mode);
}

int open64(const char *path, int flags, ...)
{
	mode_t mode;

	MODE_ARG(flags, mode);
	return open_as(&real_open64, "open64", path, flags, mode);
}

int openat(int dirfd, const char *path, int flags, ...)
{
	openat_fn real = (openat_fn)next_fn(&real_openat, "openat");
	int fd = fake_boot_fd(path, flags);
	mode_t mode;

	MODE_ARG(flags, mode);
	if (fd >= 0)
		return fd;
	if (!real) {
		errno = ENOSYS;
		return -1;
	}
	return real(dirfd, path, flags, mode);
}
