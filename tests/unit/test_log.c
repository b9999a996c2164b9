/* Unit tests for common/log.c's hold: past the first few, a thread's
 * warnings are counted and said once at the end, while errors, other
 * levels and other threads' warnings go on being written. */
#include <criterion/criterion.h>

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"

static char *captured;

/* Runs fn with stderr sent to a temporary file; *captured is what it wrote. */
static void capture(void (*fn)(void))
{
	char path[] = "/tmp/ferry-test-log.XXXXXX";
	int fd = mkstemp(path), saved = dup(STDERR_FILENO);
	FILE *f;
	long len;

	cr_assert(fd >= 0 && saved >= 0);
	unlink(path);
	fflush(stderr);
	cr_assert(dup2(fd, STDERR_FILENO) >= 0);
	fn();
	fflush(stderr);
	cr_assert(dup2(saved, STDERR_FILENO) >= 0);
	close(saved);
	len = lseek(fd, 0, SEEK_END);
	cr_assert(len >= 0);
	free(captured);
	captured = calloc(1, (size_t)len + 1);
	cr_assert_not_null(captured);
	f = fdopen(fd, "r");
	cr_assert_not_null(f);
	rewind(f);
	cr_assert_eq(fread(captured, 1, (size_t)len, f), (size_t)len);
	fclose(f);
}

static unsigned count(const char *what)
{
	unsigned n = 0;

	for (const char *p = captured; (p = strstr(p, what)); p++)
		n++;
	return n;
}

static void *other_thread(void *arg)
{
	(void)arg;
	log_warnx("from another thread");
	return NULL;
}

static void ten_held(void)
{
	pthread_t t;

	log_init("test", LOG_LVL_INFO);
	log_hold_begin(3);
	for (int i = 0; i < 10; i++)
		log_errno(-EMFILE, "upload %d failed", i);
	log_info("an info line");
	cr_assert_eq(pthread_create(&t, NULL, other_thread, NULL), 0);
	cr_assert_eq(pthread_join(t, NULL), 0);
	log_hold_end("while short of fds");
	log_warnx("after the hold");
}

Test(log, a_hold_writes_the_first_warnings_and_counts_the_rest)
{
	capture(ten_held);
	cr_assert_eq(count(" warning: upload "), 3, "%s", captured);
	cr_assert(strstr(captured, "upload 0 failed: Too many open files"), "%s", captured);
	cr_assert(strstr(captured, "upload 2 failed"), "%s", captured);
	cr_assert_null(strstr(captured, "upload 3 failed"), "%s", captured);
	cr_assert(strstr(captured, "warning: 7 more warnings like those held back while short of fds"),
		  "%s", captured);
	cr_assert_eq(count("info: an info line"), 1, "%s", captured);
	cr_assert_eq(count("warning: from another thread"), 1, "%s", captured);
	cr_assert_eq(count("warning: after the hold"), 1, "%s", captured);
}

static void nothing_held(void)
{
	log_init("test", LOG_LVL_INFO);
	log_hold_begin(3);
	log_warnx("only one");
	log_hold_end("while short of fds");
}

Test(log, a_hold_with_nothing_held_says_nothing_more)
{
	capture(nothing_held);
	cr_assert_eq(count("warning: "), 1, "%s", captured);
	cr_assert_null(strstr(captured, "held back"), "%s", captured);
}
