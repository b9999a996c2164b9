/*
 * The fault tests' write workload: see workload_util.h.
 */
#include "workload_util.h"

#include "mount_util.h"

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/select.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define PATCH_MAX (8 * 1024)

struct wl {
	struct wl_opts o;
	int rfd;
	pid_t pid;
	uint64_t done;
	bool ended;
	unsigned char **data; /* the model: each file's bytes */
	size_t *len;
	bool *exists;
};

static pid_t live_writer;

/* Patches start once every name was created: the first 2 * names ops
 * that are not patches cover them (names is kept off multiples of 4). */
static uint64_t patch_from(const struct wl *w)
{
	return 2 * (uint64_t)w->o.names;
}

static bool op_is_patch(const struct wl *w, uint64_t n)
{
	return n >= patch_from(w) && n % 4 == 3;
}

static int op_name(const struct wl *w, uint64_t n)
{
	return (int)(op_is_patch(w, n) ? (7 * n) % (uint64_t)w->o.names : n % (uint64_t)w->o.names);
}

static size_t create_content(const struct wl *w, uint64_t n, unsigned char *buf)
{
	uint64_t st = w->o.seed * 0x9E3779B97F4A7C15ull + 0xC0DE0000 + n;
	size_t len = 1 + (size_t)(fm_rand(&st) % w->o.file_max);

	fm_fill_random(&st, buf, len);
	return len;
}

/* Where a patch of a file of flen bytes goes, and its bytes. */
static size_t patch_content(const struct wl *w, uint64_t n, size_t flen, size_t *off,
			    unsigned char *buf)
{
	uint64_t st = w->o.seed * 0x9E3779B97F4A7C15ull + 0xBA7C0000 + n;
	size_t len;

	*off = (size_t)(fm_rand(&st) % flen);
	len = 1 + (size_t)(fm_rand(&st) % PATCH_MAX);
	if (len > flen - *off)
		len = flen - *off;
	fm_fill_random(&st, buf, len);
	return len;
}

static bool op_fsyncs(const struct wl *w, uint64_t n)
{
	return w->o.fsync_every && (n / 4) % (uint64_t)w->o.fsync_every == 0;
}

struct done_rec {
	uint64_t n;
	int err; /* 0: close() returned 0; else the errno that stopped it */
	char what[32];
};

static volatile sig_atomic_t writer_stop;

static void on_term(int sig)
{
	(void)sig;
	writer_stop = 1;
}

/* The child: ops until SIGTERM (seen between two ops). */
static _Noreturn void writer(const struct wl *w, int out)
{
	unsigned char *buf = malloc(w->o.file_max);
	char path[PATH_MAX + 32];
	struct sigaction sa = { .sa_handler = on_term, .sa_flags = SA_RESTART };

	if (!buf)
		_exit(1);
	sigaction(SIGTERM, &sa, NULL);
	for (uint64_t n = 0; !writer_stop; n++) {
		struct done_rec r = { .n = n };
		int fd = -1, ok = 0;
		struct stat st;

		snprintf(path, sizeof(path), "%s/c%d", fm.mnt, op_name(w, n));
		errno = 0;
		if (!op_is_patch(w, n)) {
			size_t len = create_content(w, n, buf);

			fd = open(path, O_CREAT | O_WRONLY | O_TRUNC | O_CLOEXEC, 0644);
			if (fd < 0)
				snprintf(r.what, sizeof(r.what), "open");
			else if (write(fd, buf, len) != (ssize_t)len)
				snprintf(r.what, sizeof(r.what), "write");
			else
				ok = 1;
		} else {
			size_t off = 0, len;

			fd = open(path, O_WRONLY | O_CLOEXEC);
			if (fd < 0 || fstat(fd, &st) < 0 || st.st_size == 0) {
				snprintf(r.what, sizeof(r.what), "open/fstat");
			} else {
				len = patch_content(w, n, (size_t)st.st_size, &off, buf);
				if (pwrite(fd, buf, len, (off_t)off) != (ssize_t)len)
					snprintf(r.what, sizeof(r.what), "pwrite");
				else if (op_fsyncs(w, n) && fsync(fd) != 0)
					snprintf(r.what, sizeof(r.what), "fsync");
				else
					ok = 1;
			}
		}
		if (ok && close(fd) != 0) {
			snprintf(r.what, sizeof(r.what), "close");
			ok = 0;
			fd = -1;
		}
		if (!ok) {
			r.err = errno ? errno : EIO;
			if (fd >= 0)
				close(fd);
		}
		if (write(out, &r, sizeof(r)) != (ssize_t)sizeof(r) || r.err)
			_exit(0);
	}
	_exit(0);
}

static void model_apply(struct wl *w, uint64_t n)
{
	int k = op_name(w, n);

	if (!op_is_patch(w, n)) {
		w->len[k] = create_content(w, n, w->data[k]);
		w->exists[k] = true;
	} else {
		unsigned char buf[PATCH_MAX];
		size_t off, len;

		cr_assert(w->exists[k] && w->len[k], "op %llu patches c%d before it exists",
			  (unsigned long long)n, k);
		len = patch_content(w, n, w->len[k], &off, buf);
		memcpy(w->data[k] + off, buf, len);
	}
}

struct wl *wl_start(const struct wl_opts *o)
{
	struct wl *w = calloc(1, sizeof(*w));
	int p[2];

	cr_assert(w);
	w->o = *o;
	cr_assert(o->names > 0 && o->names % 4 != 0, "names must not be a multiple of 4");
	w->data = calloc((size_t)o->names, sizeof(*w->data));
	w->len = calloc((size_t)o->names, sizeof(*w->len));
	w->exists = calloc((size_t)o->names, sizeof(*w->exists));
	cr_assert(w->data && w->len && w->exists);
	for (int k = 0; k < o->names; k++)
		cr_assert((w->data[k] = malloc(o->file_max)));
	cr_assert_eq(pipe2(p, O_CLOEXEC), 0);
	w->pid = fork();
	cr_assert_geq(w->pid, 0);
	if (w->pid == 0) {
		close(p[0]);
		writer(w, p[1]);
	}
	close(p[1]);
	w->rfd = p[0];
	live_writer = w->pid;
	return w;
}

void wl_poll(struct wl *w, int wait_ms)
{
	struct done_rec r;
	fd_set fds;
	struct timeval tv = { wait_ms / 1000, (wait_ms % 1000) * 1000 };

	if (w->ended) {
		usleep((useconds_t)wait_ms * 1000);
		return;
	}
	FD_ZERO(&fds);
	FD_SET(w->rfd, &fds);
	if (select(w->rfd + 1, &fds, NULL, NULL, &tv) <= 0)
		return;
	for (;;) {
		ssize_t n = read(w->rfd, &r, sizeof(r));

		if (n == 0) {
			w->ended = true;
			return;
		}
		if (n < 0)
			return;
		cr_assert_eq(n, (ssize_t)sizeof(r));
		cr_assert(r.err == 0, "writer: op %llu (%s of c%d) failed: %s",
			  (unsigned long long)r.n, r.what, op_name(w, r.n), strerror(r.err));
		cr_assert_eq(r.n, w->done, "writer: op %llu reported after %llu",
			     (unsigned long long)r.n, (unsigned long long)w->done);
		model_apply(w, r.n);
		w->done++;
		FD_ZERO(&fds);
		FD_SET(w->rfd, &fds);
		tv = (struct timeval){ 0, 0 };
		if (select(w->rfd + 1, &fds, NULL, NULL, &tv) <= 0)
			return;
	}
}

uint64_t wl_done(const struct wl *w)
{
	return w->done;
}

void wl_wait_done(struct wl *w, uint64_t n)
{
	struct timespec t0, now;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	while (w->done < n) {
		cr_assert(!w->ended, "the writer stopped after %llu ops", (unsigned long long)w->done);
		wl_poll(w, 1000);
		clock_gettime(CLOCK_MONOTONIC, &now);
		cr_assert_lt(now.tv_sec - t0.tv_sec, 300, "the writer made only %llu of %llu ops in "
			     "5 minutes", (unsigned long long)w->done, (unsigned long long)n);
	}
}

void wl_stop(struct wl *w)
{
	int status;

	kill(w->pid, SIGTERM);
	while (!w->ended)
		wl_poll(w, 1000);
	waitpid(w->pid, &status, 0);
	live_writer = 0;
	close(w->rfd);
	w->rfd = -1;
}

void wl_check(const struct wl *w)
{
	for (int k = 0; k < w->o.names; k++)
		if (w->exists[k])
			fm_expect_content(mp("c%d", k), w->data[k], w->len[k]);
}

void wl_free(struct wl *w)
{
	if (!w)
		return;
	for (int k = 0; k < w->o.names; k++)
		free(w->data[k]);
	free(w->data);
	free(w->len);
	free(w->exists);
	if (w->rfd >= 0)
		close(w->rfd);
	free(w);
}

void wl_cleanup(void)
{
	if (live_writer > 0) {
		kill(live_writer, SIGKILL);
		waitpid(live_writer, NULL, 0);
		live_writer = 0;
	}
}
