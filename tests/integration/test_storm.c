/*
 * SIGKILL at a random point of a storm of creates, overwrites, renames,
 * unlinks, mkdirs and rmdirs, seed by seed. A child runs the storm on a
 * handful of names (so renames replace and unlinks hit) and reports each
 * operation to the test before it starts and once it returned; the test
 * kills ferry-mountd, or ferry-reconciler, after a random number of them,
 * then mounts again (with an empty cache) and checks the outcome against a
 * model: everything whose call returned is there, as it was left -- file
 * contents included -- and the one operation in flight at the kill is
 * either done or not done, never half. FERRY_STORM_SEEDS=N runs N seeds per
 * test instead of the default few.
 */
#include "mount_util.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

TestSuite(storm, .init = fm_setup, .fini = fm_teardown, .timeout = 300);

#define NAMES 12
#define DIRS 4
#define LEN_MAX 90000

enum { OP_WRITE, OP_RENAME, OP_UNLINK, OP_MKDIR, OP_RMDIR, OP_N };

struct rec {
	int phase;      /* 0 begun, 1 returned 0, 2 failed, 3 refused; 4 the kill */
	int op, a, b;
	int err;        /* phase 2 and 3: errno */
	uint32_t seed;  /* OP_WRITE: the content */
};

/* What the test knows of one name. */
struct state {
	bool present, uncertain;
	bool may_be_empty;  /* an open(O_CREAT|O_TRUNC) in flight: it may have
	                       returned, and its write not (close() promises) */
	uint32_t seed;  /* files: the content's */
	bool alt_present;
	uint32_t alt_seed; /* the other outcome of the uncertain operation */
};

static size_t content(uint32_t seed, unsigned char *buf)
{
	uint64_t st = 0x9e37 + seed;
	size_t len = (size_t)(fm_rand(&st) % LEN_MAX);

	fm_fill_random(&st, buf, len);
	return len;
}

static void say(int fd, struct rec r)
{
	if (write(fd, &r, sizeof(r)) != (ssize_t)sizeof(r))
		_exit(0);
}

/* The child: ops until one fails (the mount died) or max of them. */
static void storm(uint64_t seed, int max, int out)
{
	static unsigned char buf[LEN_MAX];

	for (int i = 0; i < max; i++) {
		struct rec r = { .op = (int)(fm_rand(&seed) % OP_N),
				 .a = (int)(fm_rand(&seed) % NAMES),
				 .b = (int)(fm_rand(&seed) % NAMES),
				 .seed = (uint32_t)fm_rand(&seed) };
		char a[PATH_MAX + 32], b[PATH_MAX + 32];
		int rc = 0, fd;
		size_t len;

		if (r.op == OP_MKDIR || r.op == OP_RMDIR)
			snprintf(a, sizeof(a), "%s/s/d%d", fm.mnt, r.a % DIRS);
		else
			snprintf(a, sizeof(a), "%s/s/n%d", fm.mnt, r.a);
		snprintf(b, sizeof(b), "%s/s/n%d", fm.mnt, r.b);
		say(out, r);
		switch (r.op) {
		case OP_WRITE:
			len = content(r.seed, buf);
			fd = open(a, O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0644);
			rc = fd < 0 ? -1 : 0;
			if (rc == 0 && write(fd, buf, len) != (ssize_t)len)
				rc = -1;
			if (fd >= 0 && close(fd) != 0)
				rc = -1;
			break;
		case OP_RENAME: rc = rename(a, b); break;
		case OP_UNLINK: rc = unlink(a); break;
		case OP_MKDIR: rc = mkdir(a, 0755); break;
		case OP_RMDIR: rc = rmdir(a); break;
		}
		/* ENOENT and EEXIST are answers, not a dead mount. */
		if (rc < 0 && errno != ENOENT && errno != EEXIST && errno != ENOTEMPTY) {
			r.phase = 2;
			r.err = errno;
			say(out, r);
			_exit(0);
		}
		r.phase = rc == 0 ? 1 : 3; /* 3: refused on its merits: no change */
		r.err = rc == 0 ? 0 : errno;
		say(out, r);
	}
	_exit(0);
}

/* Applies a returned operation to the model (a refused one changes
 * nothing); an unfinished one makes the names it touches uncertain. */
static void apply(struct state *f, struct state *d, const struct rec *r, bool done)
{
	struct state *x = r->op >= OP_MKDIR ? &d[r->a % DIRS] : &f[r->a], *y = &f[r->b];
	struct state before_x = *x, before_y = *y;

	switch (r->op) {
	case OP_WRITE: x->present = true; x->seed = r->seed; break;
	case OP_RENAME:
		if (r->a == r->b || !x->present)
			return;
		*y = *x;
		x->present = false;
		break;
	case OP_UNLINK: x->present = false; break;
	case OP_MKDIR: x->present = true; break;
	case OP_RMDIR: x->present = false; break;
	}
	if (!done) {
		/* Either outcome: remember the one not taken. */
		x->uncertain = true;
		x->may_be_empty = r->op == OP_WRITE;
		x->alt_present = before_x.present;
		x->alt_seed = before_x.seed;
		if (r->op == OP_RENAME) {
			y->uncertain = true;
			y->alt_present = before_y.present;
			y->alt_seed = before_y.seed;
		}
	}
}

static bool file_is(const char *path, bool present, uint32_t seed, char *why, size_t wl)
{
	static unsigned char want[LEN_MAX];
	struct stat st;
	size_t len, got_len = 0;
	unsigned char *got;
	bool ok;

	if (!present) {
		ok = lstat(path, &st) < 0 && errno == ENOENT;
		if (!ok)
			snprintf(why, wl, "exists, should not");
		return ok;
	}
	if (lstat(path, &st) < 0) {
		snprintf(why, wl, "missing (%s)", strerror(errno));
		return false;
	}
	len = content(seed, want);
	got = fm_read_file(path, &got_len);
	ok = got && got_len == len && memcmp(got, want, len) == 0;
	if (!ok)
		snprintf(why, wl, "%s (%zu bytes, want %zu)", got ? "wrong content" : strerror(errno),
			 got_len, len);
	free(got);
	return ok;
}

static struct rec hist[64];
static int nhist;

static void history(char *buf, size_t len)
{
	static const char *const names[OP_N] = { "write", "rename", "unlink", "mkdir", "rmdir" };
	size_t n = 0;

	for (int i = nhist > 40 ? nhist - 40 : 0; i < nhist && n < len; i++) {
		const struct rec *r = &hist[i % 64];

		if (r->phase == 4) {
			n += (size_t)snprintf(buf + n, len - n, " KILL");
			continue;
		}
		n += (size_t)snprintf(buf + n, len - n, " %s(%d%s%d)%s%s", names[r->op], r->a,
				      r->op == OP_RENAME ? "->" : ",", r->op == OP_RENAME ? r->b :
				      (int)(r->seed % 1000), r->phase == 1 ? "" :
				      r->phase == 3 ? "=refused:" : "=in-flight:",
				      r->phase == 1 ? "" : fm_errname(r->err));
	}
}

static void verify(uint64_t seed, const struct state *f, const struct state *d)
{
	char hbuf[4096];

	history(hbuf, sizeof(hbuf));
	char why[256], why2[256];
	struct stat st;

	for (int i = 0; i < NAMES; i++) {
		const char *p = mp("s/n%d", i);

		if (file_is(p, f[i].present, f[i].seed, why, sizeof(why)))
			continue;
		if (f[i].may_be_empty && stat(p, &st) == 0 && S_ISREG(st.st_mode) && st.st_size == 0)
			continue;
		cr_assert(f[i].uncertain &&
			  file_is(p, f[i].alt_present, f[i].alt_seed, why2, sizeof(why2)),
			  "seed %llu: s/n%d: %s%s%s; the last operations:%s", (unsigned long long)seed,
			  i, why, f[i].uncertain ? "; nor as before the operation in flight: " : "",
			  f[i].uncertain ? why2 : "", hbuf);
	}
	for (int i = 0; i < DIRS; i++) {
		bool there = stat(mp("s/d%d", i), &st) == 0 && S_ISDIR(st.st_mode);

		cr_assert(there == d[i].present || (d[i].uncertain && there == d[i].alt_present),
			  "seed %llu: s/d%d %s", (unsigned long long)seed, i,
			  there ? "exists, should not" : "is missing");
	}
}

static pid_t reconciler_pid(void)
{
	struct fm_stats s;
	uint64_t up = 0;
	char path[64], cmd[256];

	/* The reconciler mountd started: the child of ferry-mountd that
	 * serves the staging socket. */
	fm_stats_read(&s);
	fm_stats_get(&s, "reconciler_up", &up);
	cr_assert(up, "no reconciler");
	for (pid_t p = 2; p < 4194304; p++) {
		FILE *f;
		size_t n;

		snprintf(path, sizeof(path), "/proc/%d/cmdline", (int)p);
		if (!(f = fopen(path, "r")))
			continue;
		n = fread(cmd, 1, sizeof(cmd) - 1, f);
		fclose(f);
		cmd[n] = '\0';
		for (size_t k = 0; k < n; k++)
			if (!cmd[k])
				cmd[k] = ' ';
		if (strstr(cmd, "ferry-reconciler") && strstr(cmd, fm.dir))
			return p;
	}
	return 0;
}

/* One seed: a storm, a kill after a random number of operations, a
 * remount, the check. kill_mountd: which process dies. */
static void one_seed(uint64_t seed, bool kill_mountd)
{
	struct state f[NAMES] = { 0 }, d[DIRS] = { 0 };
	uint64_t rs = seed * 0x9e3779b97f4a7c15ull + 1;
	int when = 20 + (int)(fm_rand(&rs) % 150), done = 0, p[2], status;
	struct rec r, pending = { .phase = -1 };
	pid_t pid;

	/* Every seed starts from an empty s/, so the model starts empty. */
	nhist = 0;
	OK(mkdir(mp("s"), 0755));
	cr_assert(pipe2(p, O_CLOEXEC) == 0);
	pid = fork();
	cr_assert(pid >= 0);
	if (pid == 0) {
		close(p[0]);
		storm(seed, kill_mountd ? 100000 : when + 150, p[1]);
	}
	close(p[1]);
	/* The child runs ahead of this reader: when the kill is made, the pipe
	 * may still hold the records of any number of operations that returned
	 * before it, so every record is read, to the end. After a kill of
	 * ferry-mountd the child is killed too; its calls after the kill failed
	 * (ENOTCONN) or, once the dead mount was detached, reached the empty
	 * directory beneath (ENOENT: no change anywhere). */
	while (read(p[0], &r, sizeof(r)) == (ssize_t)sizeof(r)) {
		if (r.phase == 0) {
			pending = r;
			continue;
		}
		pending.phase = -1;
		if (r.phase != 2)
			hist[nhist++ % 64] = r;
		if (r.phase == 1)
			apply(f, d, &r, true);
		if (r.phase == 2) {
			pending = r; /* failed when the mount died: may or may not be done */
			pending.phase = 0;
			break;
		}
		if (++done == when) {
			hist[nhist++ % 64] = (struct rec){ .phase = 4 };
			if (kill_mountd) {
				fm_crash();
				kill(pid, SIGKILL);
			} else {
				pid_t rp = reconciler_pid();

				cr_assert(rp > 0, "cannot find the reconciler");
				kill(rp, SIGKILL);
			}
		}
	}
	if (pending.phase == 0) {
		apply(f, d, &pending, false);
		hist[nhist++ % 64] = pending;
	}
	close(p[0]);
	cr_assert(waitpid(pid, &status, 0) == pid);
	if (kill_mountd)
		fm_mount();
	fm_remount_cold();
	verify(seed, f, d);
	/* Clean for the next seed. */
	for (int i = 0; i < NAMES; i++)
		unlink(mp("s/n%d", i));
	for (int i = 0; i < DIRS; i++)
		rmdir(mp("s/d%d", i));
	OK(rmdir(mp("s")));
}

static int seeds(int dflt)
{
	const char *e = getenv("FERRY_STORM_SEEDS");

	return e && atoi(e) > 0 ? atoi(e) : dflt;
}

Test(storm, sigkill_of_mountd_loses_nothing_returned)
{
	for (int s = 1; s <= seeds(4); s++)
		one_seed((uint64_t)s, true);
}

Test(storm, sigkill_of_reconciler_loses_nothing_returned)
{
	for (int s = 1; s <= seeds(4); s++)
		one_seed((uint64_t)s + 1000, false);
}
