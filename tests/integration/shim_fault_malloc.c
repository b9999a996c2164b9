/*
 * A test shim (LD_PRELOAD): allocation failures on demand, in one program.
 *
 * Loaded into every process of a mount (through the environment of
 * `ferry mount`), it acts only in the one whose executable's name is
 * $FERRY_FAULT_MALLOC_PROG (default ferry-reconciler), so that ferry-mountd
 * beside it allocates normally. While the control file
 * $FERRY_FAULT_MALLOC_CTL exists, malloc, calloc, realloc, reallocarray,
 * posix_memalign, aligned_alloc and memalign fail (NULL / ENOMEM) as its
 * one line says:
 *
 *   every N        every Nth call
 *   ppm N [SEED]   each call with probability N / 1,000,000
 *   min BYTES      (a second line) only calls asking for at least BYTES
 *
 * The file is looked at again at most every CTL_RECHECK_NS: the test
 * creates it to start the failures and removes it to stop them. Library
 * code (SQLite, libcurl, libevent, OpenSSL, libc's own strdup, opendir,
 * fopen...) allocates through these functions and fails with everything
 * else: that is the point, as under real memory pressure.
 *
 * $FERRY_FAULT_MALLOC_COUNT names a file of at least 4 KiB that every
 * acting process maps shared and counts in (atomically, 64-bit words):
 *   [0] allocation calls while failures were on
 *   [1] failures made
 *   [2] processes that acted (a restarted daemon counts again)
 *
 * Beside ASan: ASan's allocator must stay the one that frees what it gave,
 * so this shim never allocates itself; it returns NULL or forwards to the
 * next definition (ASan's, or libc's). It must come before ASan's runtime
 * in the lookup order, which ASan checks unless ASAN_OPTIONS has
 * verify_asan_link_order=0 (the test fixture sets it). With a sanitizer
 * runtime linked statically into the executable (clang's default) the
 * executable's malloc wins and this shim never sees a call: the counters
 * stay 0 and the test says so.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define CTL_RECHECK_NS 20000000LL /* 20 ms */

typedef void *(*malloc_fn)(size_t);
typedef void *(*calloc_fn)(size_t, size_t);
typedef void *(*realloc_fn)(void *, size_t);
typedef void *(*reallocarray_fn)(void *, size_t, size_t);
typedef int (*posix_memalign_fn)(void **, size_t, size_t);
typedef void *(*aligned_alloc_fn)(size_t, size_t);
typedef void (*free_fn)(void *);

static malloc_fn real_malloc;
static calloc_fn real_calloc;
static realloc_fn real_realloc;
static reallocarray_fn real_reallocarray;
static posix_memalign_fn real_posix_memalign;
static aligned_alloc_fn real_aligned_alloc, real_memalign;
static free_fn real_free;

/*
 * dlsym() may allocate (a dlerror buffer) while the real functions are
 * being looked up: those few bytes come from here and are never freed
 * to the real allocator.
 */
static _Alignas(16) unsigned char boot_heap[16384];
static _Atomic size_t boot_used;
static _Thread_local int resolving __attribute__((tls_model("initial-exec")));

static void *boot_alloc(size_t n)
{
	size_t at = atomic_fetch_add(&boot_used, (n + 15) & ~(size_t)15);

	if (at + n > sizeof(boot_heap))
		return NULL;
	return boot_heap + at;
}

static int from_boot(const void *p)
{
	return (const unsigned char *)p >= boot_heap &&
	       (const unsigned char *)p < boot_heap + sizeof(boot_heap);
}

static _Atomic int resolved;

static void resolve(void)
{
	/* (resolving: dlsym allocating on the way, here again) */
	if (atomic_load(&resolved) || resolving)
		return;
	resolving = 1;
	real_malloc = (malloc_fn)dlsym(RTLD_NEXT, "malloc");
	real_calloc = (calloc_fn)dlsym(RTLD_NEXT, "calloc");
	real_realloc = (realloc_fn)dlsym(RTLD_NEXT, "realloc");
	real_reallocarray = (reallocarray_fn)dlsym(RTLD_NEXT, "reallocarray");
	real_posix_memalign = (posix_memalign_fn)dlsym(RTLD_NEXT, "posix_memalign");
	real_aligned_alloc = (aligned_alloc_fn)dlsym(RTLD_NEXT, "aligned_alloc");
	real_memalign = (aligned_alloc_fn)dlsym(RTLD_NEXT, "memalign");
	real_free = (free_fn)dlsym(RTLD_NEXT, "free");
	resolving = 0;
	atomic_store(&resolved, 1);
}

/* ---- when to fail ---- */

enum { ST_UNKNOWN, ST_OFF_HERE, ST_ACTIVE };
static _Atomic int state = ST_UNKNOWN;
static char ctl_path[4096];
static _Atomic int armed;            /* the control file exists */
static _Atomic long long checked_at_ns = -1;
static _Atomic unsigned long every;  /* from the control file; 0: use ppm */
static _Atomic unsigned long ppm;
static _Atomic size_t min_bytes;
static _Atomic unsigned long long calls;
static _Atomic unsigned long long rng;
/* The shared counter file, or NULL. Set before `state` says ST_ACTIVE
 * (an atomic store), and read only after that. */
static _Atomic unsigned long long *counts;

static void copy_env(char *dst, size_t cap, const char *name)
{
	const char *v = getenv(name);
	size_t n = 0;

	if (v)
		while (v[n] && n < cap - 1) {
			dst[n] = v[n];
			n++;
		}
	dst[n] = '\0';
}

static void map_counts(void)
{
	char p[4096];
	int fd;
	void *m;

	copy_env(p, sizeof(p), "FERRY_FAULT_MALLOC_COUNT");
	if (!p[0] || (fd = open(p, O_RDWR | O_CLOEXEC)) < 0)
		return;
	m = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	/* Only the constructor maps it, before any thread of the process. */
	if (m != MAP_FAILED)
		counts = (_Atomic unsigned long long *)m;
}

/*
 * Set by our constructor. Until then nothing is decided: libraries that
 * start before us allocate too (ASan's runtime, while its interceptors of
 * strcmp, readlink... are not set up yet, so calling them would jump to 0).
 */
static _Atomic int started;

__attribute__((constructor)) static void shim_start(void)
{
	atomic_store(&started, 1);
}

/* Is this the program to act in? Decided once, after our constructor. */
static int acting(void)
{
	int st = atomic_load(&state);
	char exe[4096], want[256];
	ssize_t n;
	const char *base;

	if (st != ST_UNKNOWN)
		return st == ST_ACTIVE;
	if (!atomic_load(&started))
		return 0;
	copy_env(want, sizeof(want), "FERRY_FAULT_MALLOC_PROG");
	if (!want[0])
		strcpy(want, "ferry-reconciler");
	copy_env(ctl_path, sizeof(ctl_path), "FERRY_FAULT_MALLOC_CTL");
	n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	exe[n > 0 ? n : 0] = '\0';
	base = strrchr(exe, '/');
	base = base ? base + 1 : exe;
	st = ctl_path[0] && strcmp(base, want) == 0 ? ST_ACTIVE : ST_OFF_HERE;
	if (st == ST_ACTIVE) {
		map_counts();
		atomic_store(&rng, 0x9E3779B97F4A7C15ull ^ (unsigned long long)getpid());
	}
	atomic_store(&state, st);
	return st == ST_ACTIVE;
}

static unsigned long parse_ul(const char **s)
{
	unsigned long v = 0;

	while (**s == ' ' || **s == '\t')
		(*s)++;
	for (; **s >= '0' && **s <= '9'; (*s)++)
		v = v * 10 + (unsigned long)(**s - '0');
	return v;
}

/* Looks at the control file (no allocation: we may be inside malloc). */
static void recheck(void)
{
	struct timespec m;
	long long now, last;
	char buf[256];
	ssize_t n;
	int fd;

	if (clock_gettime(CLOCK_MONOTONIC, &m) != 0)
		return;
	now = (long long)m.tv_sec * 1000000000LL + m.tv_nsec;
	last = atomic_load(&checked_at_ns);
	if (last >= 0 && now - last < CTL_RECHECK_NS)
		return;
	atomic_store(&checked_at_ns, now);
	fd = open(ctl_path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		atomic_store(&armed, 0);
		return;
	}
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	buf[n > 0 ? n : 0] = '\0';
	unsigned long ev = 0, p = 0;
	size_t mb = 0;
	for (const char *s = buf; *s;) {
		if (strncmp(s, "every", 5) == 0) {
			s += 5;
			ev = parse_ul(&s);
		} else if (strncmp(s, "ppm", 3) == 0) {
			s += 3;
			p = parse_ul(&s);
			unsigned long seed = parse_ul(&s);
			if (seed)
				atomic_store(&rng, seed ^ (unsigned long long)getpid() << 32);
		} else if (strncmp(s, "min", 3) == 0) {
			s += 3;
			mb = parse_ul(&s);
		}
		while (*s && *s != '\n')
			s++;
		while (*s == '\n')
			s++;
	}
	atomic_store(&every, ev);
	atomic_store(&ppm, p);
	atomic_store(&min_bytes, mb);
	if (!atomic_exchange(&armed, 1) && counts)
		atomic_fetch_add(&counts[2], 1);
}

static unsigned long long next_rand(void)
{
	unsigned long long x = atomic_load(&rng), y;

	do {
		y = x;
		y ^= y >> 12;
		y ^= y << 25;
		y ^= y >> 27;
	} while (!atomic_compare_exchange_weak(&rng, &x, y));
	return y * 0x2545F4914F6CDD1DULL;
}

/* Should this allocation of n bytes fail? */
static int fail_now(size_t n)
{
	unsigned long long c;
	unsigned long ev, p;

	if (resolving || !acting())
		return 0;
	recheck();
	if (!atomic_load(&armed) || n < atomic_load(&min_bytes))
		return 0;
	c = atomic_fetch_add(&calls, 1) + 1;
	if (counts)
		atomic_fetch_add(&counts[0], 1);
	ev = atomic_load(&every);
	p = atomic_load(&ppm);
	if (ev ? c % ev != 0 : (!p || next_rand() % 1000000u >= p))
		return 0;
	if (counts)
		atomic_fetch_add(&counts[1], 1);
	errno = ENOMEM;
	return 1;
}

/* ---- the interposed functions ---- */

void *malloc(size_t n)
{
	resolve();
	if (!real_malloc)
		return boot_alloc(n);
	if (fail_now(n))
		return NULL;
	return real_malloc(n);
}

void *calloc(size_t k, size_t n)
{
	size_t total;

	resolve();
	if (!real_calloc) {
		/* dlsym's own calloc, while resolve() runs: zeroed static memory */
		if (__builtin_mul_overflow(k, n, &total))
			return NULL;
		return boot_alloc(total);
	}
	if (fail_now(__builtin_mul_overflow(k, n, &total) ? SIZE_MAX : total))
		return NULL;
	return real_calloc(k, n);
}

void *realloc(void *p, size_t n)
{
	resolve();
	if (from_boot(p) || !real_realloc) {
		/* A boot block's size is not kept: copy what it may hold. */
		size_t room = (size_t)(boot_heap + sizeof(boot_heap) - (unsigned char *)p);
		void *q = malloc(n);
		if (q)
			memcpy(q, p, n < room ? n : room);
		return q;
	}
	if (fail_now(n))
		return NULL;
	return real_realloc(p, n);
}

void *reallocarray(void *p, size_t k, size_t n)
{
	size_t total;

	resolve();
	if (__builtin_mul_overflow(k, n, &total)) {
		errno = ENOMEM;
		return NULL;
	}
	if (from_boot(p) || !real_reallocarray)
		return realloc(p, total);
	if (fail_now(total))
		return NULL;
	return real_reallocarray(p, k, n);
}

/* An aligned boot block, while the real functions are being looked up. */
static void *boot_aligned(size_t align, size_t n)
{
	unsigned char *p = boot_alloc(n + align);

	if (!p || align <= 16)
		return p;
	return p + (align - (uintptr_t)p % align) % align;
}

int posix_memalign(void **out, size_t align, size_t n)
{
	resolve();
	if (!real_posix_memalign) {
		*out = boot_aligned(align, n);
		return *out ? 0 : ENOMEM;
	}
	if (fail_now(n))
		return ENOMEM;
	return real_posix_memalign(out, align, n);
}

void *aligned_alloc(size_t align, size_t n)
{
	resolve();
	if (!real_aligned_alloc)
		return boot_aligned(align, n);
	if (fail_now(n))
		return NULL;
	return real_aligned_alloc(align, n);
}

void *memalign(size_t align, size_t n)
{
	resolve();
	if (!real_memalign)
		return boot_aligned(align, n);
	if (fail_now(n))
		return NULL;
	return real_memalign(align, n);
}

void free(void *p)
{
	if (!p || from_boot(p))
		return;
	resolve();
	if (real_free)
		real_free(p);
}
