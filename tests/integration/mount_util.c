/*
 * Fixture helpers for the integration tests: see mount_util.h.
 */
#include "mount_util.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <libpq-fe.h>
#include <openssl/evp.h>
#include <ftw.h>
#include <grp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define FUSE_SUPER_MAGIC 0x65735546

struct fm fm = { .reaper_fd = -1 };

const char *fm_errname(int e)
{
	static _Thread_local char buf[4][24];
	static _Thread_local int slot;
	const char *n = e ? strerrorname_np(e) : "0";

	if (n)
		return n;
	slot = (slot + 1) % 4;
	snprintf(buf[slot], sizeof(buf[slot]), "errno %d", e);
	return buf[slot];
}

/* Per thread: tests that create from several threads at once build paths
 * concurrently, and a shared ring handed two of them the same buffer (one
 * thread then made the other's file). */
static _Thread_local char ring[16][PATH_MAX];
static _Thread_local int ring_slot;

static const char *vpath(const char *base, const char *fmt, va_list ap)
{
	char rel[PATH_MAX];
	char *out = ring[ring_slot];
	int n;

	ring_slot = (ring_slot + 1) % 16;
	vsnprintf(rel, sizeof(rel), fmt, ap);
	if (rel[0] == '\0')
		n = snprintf(out, PATH_MAX, "%s", base);
	else
		n = snprintf(out, PATH_MAX, "%s/%s", base, rel);
	cr_assert(n < PATH_MAX, "path too long: %s/%s", base, rel);
	return out;
}

const char *mp(const char *fmt, ...)
{
	va_list ap;
	const char *r;

	va_start(ap, fmt);
	r = vpath(fm.mnt, fmt, ap);
	va_end(ap);
	return r;
}

const char *sp(const char *fmt, ...)
{
	va_list ap;
	const char *r;

	va_start(ap, fmt);
	r = vpath(fm.dir, fmt, ap);
	va_end(ap);
	return r;
}

const char *fm_bin(const char *name)
{
	static _Thread_local char buf[4][PATH_MAX];
	static _Thread_local int slot;
	const char *dir = getenv("FERRY_BIN_DIR");

	if (!dir || !*dir)
		dir = FERRY_BIN_DIR;
	slot = (slot + 1) % 4;
	snprintf(buf[slot], sizeof(buf[slot]), "%s/%s", dir, name);
	return buf[slot];
}

char *fm_slurp(const char *path)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	size_t cap = 4096, len = 0;
	char *buf;

	if (fd < 0)
		return NULL;
	buf = malloc(cap + 1);
	for (;;) {
		ssize_t n;

		if (len == cap) {
			cap *= 2;
			buf = realloc(buf, cap + 1);
		}
		n = read(fd, buf + len, cap - len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		len += (size_t)n;
	}
	close(fd);
	buf[len] = '\0';
	return buf;
}

int fm_count_lines(const char *text)
{
	int n = 0;
	const char *p;

	if (!text)
		return 0;
	for (p = text; *p; p++)
		if (*p == '\n')
			n++;
	if (p > text && p[-1] != '\n')
		n++;
	return n;
}

/* The last few KiB of a file, for failure messages. */
static const char *file_tail(const char *path, char *buf, size_t size)
{
	char *all = fm_slurp(path);
	size_t len;

	if (!all) {
		/* The path, cut to what fits: gcc -O3 cannot see the bound of a
		 * precision against size, so build it in two steps. */
		size_t room = size > 6 ? size - 6 : 0;

		snprintf(buf, size, "(no %.*s)", (int)(strlen(path) < room ? strlen(path) : room),
			 path);
		return buf;
	}
	len = strlen(all);
	snprintf(buf, size, "%s", len >= size ? all + len - (size - 1) : all);
	free(all);
	return buf;
}

/* The fixture's log of ferry commands and, when the volume is a directory,
 * the end of ferry-mountd's log in it. */
static const char *log_tail(void)
{
	static char buf[8192];
	char a[4096], b[3072], path[PATH_MAX];

	file_tail(fm.log, a, sizeof(a));
	(void)!snprintf(path, sizeof(path), "%.4000s", fm_mountd_log_path());
	if (access(path, R_OK) == 0) {
		file_tail(path, b, sizeof(b));
		snprintf(buf, sizeof(buf), "%.4095s\n--- %.900s (end) ---\n%.3071s", a, path, b);
	} else {
		memcpy(buf, a, sizeof(a));
	}
	return buf;
}

extern char **environ;

/* The environment with fm.daemon_env over it (malloc'd array; its strings
 * are environ's and fm's). */
static char **daemon_environ(void)
{
	size_t n = 0, k = 0;
	char **env;

	while (environ[n])
		n++;
	env = calloc(n + (size_t)fm.n_daemon_env + 1, sizeof(*env));
	cr_assert(env != NULL);
	for (size_t i = 0; i < n; i++) {
		bool over = false;

		for (int j = 0; j < fm.n_daemon_env && !over; j++) {
			size_t l = strcspn(fm.daemon_env[j], "=");
			over = strncmp(environ[i], fm.daemon_env[j], l + 1) == 0;
		}
		if (!over)
			env[k++] = environ[i];
	}
	for (int j = 0; j < fm.n_daemon_env; j++)
		env[k++] = fm.daemon_env[j];
	env[k] = NULL;
	return env;
}

static int run_env(const char *const argv[], const char *out_path, const char *err_path,
		   int timeout_s, bool with_daemon_env);

int fm_run(const char *const argv[], const char *out_path, const char *err_path,
	   int timeout_s)
{
	return run_env(argv, out_path, err_path, timeout_s, false);
}

static int run_env(const char *const argv[], const char *out_path, const char *err_path,
		   int timeout_s, bool with_daemon_env)
{
	pid_t pid;
	int status;
	struct timespec start, now;
	char **env = with_daemon_env ? daemon_environ() : environ;

	pid = fork();
	if (pid < 0) {
		if (env != environ)
			free(env);
		return -1;
	}
	if (pid == 0) {
		int in = open("/dev/null", O_RDONLY);
		int out = out_path ? open(out_path, O_WRONLY | O_CREAT | O_TRUNC, 0644)
				   : open(fm.log, O_WRONLY | O_CREAT | O_APPEND, 0644);
		int err = err_path ? open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0644)
				   : open(fm.log, O_WRONLY | O_CREAT | O_APPEND, 0644);

		if (in < 0 || out < 0 || err < 0)
			_exit(126);
		dup2(in, 0);
		dup2(out, 1);
		dup2(err, 2);
		if (!out_path && !err_path) {
			/* a header in the log names the command */
			dprintf(2, "+");
			for (int i = 0; argv[i]; i++)
				dprintf(2, " %s", argv[i]);
			dprintf(2, "\n");
		}
		execve(argv[0], (char *const *)argv, env);
		dprintf(2, "exec %s: %s\n", argv[0], strerror(errno));
		_exit(127);
	}
	if (env != environ)
		free(env);
	clock_gettime(CLOCK_MONOTONIC, &start);
	for (;;) {
		pid_t r = waitpid(pid, &status, WNOHANG);

		if (r == pid)
			break;
		if (r < 0 && errno != EINTR)
			return -1;
		clock_gettime(CLOCK_MONOTONIC, &now);
		if (now.tv_sec - start.tv_sec >= timeout_s) {
			kill(pid, SIGKILL);
			waitpid(pid, &status, 0);
			cr_log_error("%s: killed after %d s", argv[0], timeout_s);
			break;
		}
		usleep(5000);
	}
	if (WIFEXITED(status))
		return WEXITSTATUS(status);
	if (WIFSIGNALED(status))
		return 128 + WTERMSIG(status);
	return -1;
}

static int unescape_mountinfo(const char *in, char *out, size_t outlen)
{
	size_t o = 0;

	for (const char *p = in; *p && o + 1 < outlen; p++) {
		if (p[0] == '\\' && p[1] >= '0' && p[1] <= '7' && p[2] && p[3]) {
			out[o++] = (char)(((p[1] - '0') << 6) | ((p[2] - '0') << 3) | (p[3] - '0'));
			p += 3;
		} else {
			out[o++] = *p;
		}
	}
	out[o] = '\0';
	return 0;
}

void fm_daemon_env(const char *name, const char *value)
{
	size_t l = strlen(name);
	int i;

	for (i = 0; i < fm.n_daemon_env; i++)
		if (strncmp(fm.daemon_env[i], name, l) == 0 && fm.daemon_env[i][l] == '=')
			break;
	if (!value) {
		if (i < fm.n_daemon_env) {
			memmove(fm.daemon_env[i], fm.daemon_env[i + 1],
				(size_t)(fm.n_daemon_env - i - 1) * sizeof(fm.daemon_env[0]));
			fm.n_daemon_env--;
		}
		return;
	}
	cr_assert(i < FM_DAEMON_ENV_MAX, "more than %d daemon environment variables",
		  FM_DAEMON_ENV_MAX);
	int n = snprintf(fm.daemon_env[i], sizeof(fm.daemon_env[i]), "%s=%s", name, value);
	cr_assert(n > 0 && (size_t)n < sizeof(fm.daemon_env[i]), "%s: value too long", name);
	if (i == fm.n_daemon_env)
		fm.n_daemon_env++;
}

bool fm_asan(void)
{
#if defined(__SANITIZE_ADDRESS__)
	return true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
	return true;
#else
	return false;
#endif
#else
	return false;
#endif
}

const char *fm_shim(const char *name)
{
	static _Thread_local char buf[4][PATH_MAX];
	static _Thread_local int slot;
	const char *dir = getenv("FERRY_SHIM_DIR");

	if (!dir || !*dir)
		dir = FERRY_SHIM_DIR;
	slot = (slot + 1) % 4;
	snprintf(buf[slot], sizeof(buf[slot]), "%s/ferry_shim_%s.so", dir, name);
	return buf[slot];
}

void fm_daemon_preload(const char *name)
{
	const char *lib = fm_shim(name);
	const char *asan = getenv("ASAN_OPTIONS"), *had = getenv("LD_PRELOAD");
	char opts[900], preload[PATH_MAX * 2];

	cr_assert(access(lib, R_OK) == 0, "test shim %s: %s (is it built?)", lib, strerror(errno));
	/* First, before whatever the tests run with. */
	snprintf(preload, sizeof(preload), "%s%s%.*s", lib, had && *had ? " " : "",
		 PATH_MAX, had ? had : "");
	fm_daemon_env("LD_PRELOAD", preload);
	/* Harmless without ASan; with it, ASan's runtime may stand second. */
	snprintf(opts, sizeof(opts), "%.800s%sverify_asan_link_order=0", asan ? asan : "",
		 asan && *asan ? ":" : "");
	fm_daemon_env("ASAN_OPTIONS", opts);
}

bool fm_is_mounted(const char *path)
{
	FILE *f = fopen("/proc/self/mountinfo", "re");
	char line[8192];
	bool found = false;

	if (!f)
		return false;
	while (fgets(line, sizeof(line), f)) {
		char mpt[PATH_MAX], un[PATH_MAX];

		/* id parent major:minor root mountpoint ... */
		if (sscanf(line, "%*s %*s %*s %*s %4095s", mpt) != 1)
			continue;
		unescape_mountinfo(mpt, un, sizeof(un));
		if (strcmp(un, path) == 0) {
			found = true;
			break;
		}
	}
	fclose(f);
	return found;
}

/*
 * ferry-mountd processes that belong to this fixture: their command line
 * names something under fm.dir (volume, mountpoint or cache directory),
 * which mkdtemp made unique.
 */
static int find_daemon(const char *prog, const char *dir, pid_t *out, int max);

/* ferry-mountd processes whose command line names dir. */
static int find_mountd(const char *dir, pid_t *out, int max)
{
	return find_daemon("ferry-mountd", dir, out, max);
}

static int find_daemon(const char *prog, const char *dir, pid_t *out, int max)
{
	DIR *d = opendir("/proc");
	struct dirent *de;
	int n = 0;

	if (!d)
		return 0;
	while ((de = readdir(d)) && n < max) {
		char path[64], cmd[8192];
		pid_t pid = (pid_t)atoi(de->d_name);
		ssize_t len;
		int fd;
		bool is_mountd = false, ours = false;

		if (pid <= 0 || pid == getpid())
			continue;
		snprintf(path, sizeof(path), "/proc/%d/cmdline", pid);
		fd = open(path, O_RDONLY | O_CLOEXEC);
		if (fd < 0)
			continue;
		len = read(fd, cmd, sizeof(cmd) - 1);
		close(fd);
		if (len <= 0)
			continue;
		cmd[len] = '\0';
		for (ssize_t i = 0; i < len; i += (ssize_t)strlen(cmd + i) + 1) {
			const char *arg = cmd + i;
			const char *base = strrchr(arg, '/');

			base = base ? base + 1 : arg;
			if (i == 0 && strcmp(base, prog) == 0)
				is_mountd = true;
			if (strstr(arg, dir))
				ours = true;
		}
		if (is_mountd && ours)
			out[n++] = pid;
	}
	closedir(d);
	return n;
}

static bool alive(pid_t pid);

int fm_daemon_pids(const char *prog, pid_t *out, int max)
{
	return fm_daemon_pids_with(prog, fm.dir, out, max);
}

int fm_daemon_pids_with(const char *prog, const char *s, pid_t *out, int max)
{
	pid_t all[64];
	int n = find_daemon(prog, s, all, max < 64 ? max : 64), k = 0;

	for (int i = 0; i < n; i++)
		if (alive(all[i]))
			out[k++] = all[i];
	return k;
}

static void remember_mountd(void)
{
	pid_t pids[8];
	int n = find_mountd(fm.dir, pids, 8);

	for (int i = 0; i < n; i++) {
		bool seen = false;

		for (int j = 0; j < fm.n_mountd; j++)
			seen |= fm.mountd[j] == pids[i];
		if (!seen && fm.n_mountd < 8)
			fm.mountd[fm.n_mountd++] = pids[i];
	}
}

static bool alive(pid_t pid)
{
	char path[64], buf[512];
	int fd;
	ssize_t n;

	/* a zombie is as good as gone */
	snprintf(path, sizeof(path), "/proc/%d/stat", pid);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return false;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return false;
	buf[n] = '\0';
	const char *p = strrchr(buf, ')');
	if (p && p[1] == ' ' && p[2] == 'Z')
		return false;
	/* The pid may belong to someone else by now: a ferry daemon of this
	 * fixture's directory, or gone. */
	snprintf(path, sizeof(path), "/proc/%d/cmdline", pid);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return false;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return false;
	for (ssize_t k = 0; k < n; k++)
		if (!buf[k])
			buf[k] = ' ';
	buf[n] = '\0';
	return strstr(buf, "ferry-") && (!fm.dir[0] || strstr(buf, fm.dir));
}

/* Kills the fixture's ferry-mountd processes that are still alive.
 * Returns how many there were. */
static int kill_leftover_mountd(const char *dir)
{
	pid_t pids[16];
	int n = find_mountd(dir, pids, 16);
	int live = 0;

	/* A reconciler outlives its mount only through a bug (or a crash test
	 * still winding down): it goes too. */
	n += find_daemon("ferry-reconciler", dir, pids + n, 16 - n);

	for (int i = 0; i < n; i++) {
		if (!alive(pids[i]))
			continue;
		live++;
		kill(pids[i], SIGTERM);
	}
	for (int t = 0; t < 200 && live; t++) {
		bool any = false;

		for (int i = 0; i < n; i++)
			any |= alive(pids[i]);
		if (!any)
			break;
		usleep(10000);
	}
	for (int i = 0; i < n; i++)
		if (alive(pids[i]))
			kill(pids[i], SIGKILL);
	return live;
}

static int rm_cb(const char *path, const struct stat *st, int type, struct FTW *ftw)
{
	(void)st;
	(void)ftw;
	if (type == FTW_DP)
		rmdir(path);
	else
		unlink(path);
	return 0;
}

static void remove_tree(const char *dir)
{
	if (dir[0])
		nftw(dir, rm_cb, 32, FTW_DEPTH | FTW_PHYS | FTW_MOUNT);
}

/* Lazily unmounts whatever is still mounted beneath dir (a tmpfs or loop
 * file system a test put under its scratch directory), deepest first, so
 * a test that died before its own cleanup leaves no mount behind and the
 * tree can be removed. Returns how many there were. */
static int detach_beneath(const char *dir)
{
	size_t dl = strlen(dir);
	int total = 0;

	if (!dl)
		return 0;
	/* One pass detaches the deepest mount it finds; mounts stacked on one
	 * path show up again until all are gone. */
	for (int round = 0; round < 64; round++) {
		FILE *f = fopen("/proc/self/mountinfo", "re");
		char line[8192], best[PATH_MAX] = "";

		if (!f)
			break;
		while (fgets(line, sizeof(line), f)) {
			char mpt[PATH_MAX], un[PATH_MAX];

			if (sscanf(line, "%*s %*s %*s %*s %4095s", mpt) != 1)
				continue;
			unescape_mountinfo(mpt, un, sizeof(un));
			if (strncmp(un, dir, dl) == 0 && un[dl] == '/' && strlen(un) > strlen(best))
				snprintf(best, sizeof(best), "%s", un);
		}
		fclose(f);
		if (!best[0] || umount2(best, MNT_DETACH) != 0)
			break;
		total++;
	}
	return total;
}

/* Last-resort cleanup shared by the reaper and failing setups. */
static void hard_cleanup(const char *dir, const char *mnt)
{
	if (mnt[0] && fm_is_mounted(mnt))
		umount2(mnt, MNT_DETACH);
	kill_leftover_mountd(dir);
	if (mnt[0] && fm_is_mounted(mnt))
		umount2(mnt, MNT_DETACH);
	detach_beneath(dir);
	remove_tree(dir);
}

/*
 * The reaper: a detached child that waits on a pipe. A byte means the
 * teardown ran and it can go; EOF means the test process died without it,
 * so it unmounts, kills and removes what the fixture made.
 */
static void start_reaper(void)
{
	int p[2];
	pid_t pid;

	if (pipe2(p, O_CLOEXEC) < 0)
		cr_assert_fail("pipe2: %s", strerror(errno));
	pid = fork();
	if (pid < 0)
		cr_assert_fail("fork: %s", strerror(errno));
	if (pid == 0) {
		char c;
		ssize_t n;

		setsid();
		signal(SIGTERM, SIG_IGN);
		signal(SIGINT, SIG_IGN);
		signal(SIGHUP, SIG_IGN);
		signal(SIGPIPE, SIG_IGN);
		if (p[0] != 3) {
			dup2(p[0], 3);
			close(p[0]);
		}
		close_range(4, ~0U, 0);
		do
			n = read(3, &c, 1);
		while (n < 0 && errno == EINTR);
		if (n == 1)
			_exit(0);
		if (fm_is_mounted(fm.mnt) || find_mountd(fm.dir, (pid_t[1]){0}, 1))
			fprintf(stderr, "ferry-it reaper: test process died without teardown; "
				"cleaning up %s\n", fm.dir);
		hard_cleanup(fm.dir, fm.mnt);
		_exit(0);
	}
	close(p[0]);
	fm.reaper = pid;
	fm.reaper_fd = p[1];
}

static void stop_reaper(void)
{
	if (fm.reaper_fd >= 0) {
		(void)!write(fm.reaper_fd, "d", 1);
		close(fm.reaper_fd);
		fm.reaper_fd = -1;
	}
	if (fm.reaper > 0) {
		waitpid(fm.reaper, NULL, 0);
		fm.reaper = 0;
	}
}

/* Setup failed: clean up now (no teardown will run) and fail. */
#define SETUP_FAIL(...)                                                       \
	do {                                                                  \
		cr_log_error("ferry log:\n%s", log_tail());                   \
		hard_cleanup(fm.dir, fm.mnt);                                 \
		fm.created = false;                                           \
		fm.mounted = false;                                           \
		stop_reaper();                                                \
		cr_assert_fail(__VA_ARGS__);                                  \
	} while (0)

const char *fm_mount_options(void)
{
	/* FERRY_IT_MOUNT_OPTIONS adds to the fixture's -o (scripts/test runs
	 * the suites once more with passthrough=off for the daemon path). */
	static char opts[256];
	const char *extra = getenv("FERRY_IT_MOUNT_OPTIONS");

	snprintf(opts, sizeof(opts), "allow_other%s%s", extra && *extra ? "," : "",
		 extra ? extra : "");
	return opts;
}

static void do_mount(bool in_setup)
{
	const char *argv[16] = { fm_bin("ferry"), "mount", "--cache-dir", fm.cache,
				 "-o", fm_mount_options() };
	int n = 6;

	if (fm.no_reconciler)
		argv[n++] = "--no-reconciler";
	if (fm.staging[0]) {
		argv[n++] = "--staging-dir";
		argv[n++] = fm.staging;
	}
	if (fm.staging_min_free) {
		argv[n++] = "--staging-min-free";
		argv[n++] = fm.staging_min_free;
	}
	argv[n++] = fm.vol;
	argv[n++] = fm.mnt;
	argv[n] = NULL;
	int rc = run_env(argv, NULL, NULL, 60, true);
	struct statfs sf;

	if (rc == 0)
		remember_mountd();
	if (rc != 0) {
		if (in_setup)
			SETUP_FAIL("ferry mount %s %s: exit %d (log above)", fm.vol, fm.mnt, rc);
		cr_assert_fail("ferry mount %s %s: exit %d\n%s", fm.vol, fm.mnt, rc, log_tail());
	}
	fm.mounted = true;
	if (!fm_is_mounted(fm.mnt)) {
		if (in_setup)
			SETUP_FAIL("ferry mount exited 0 but nothing is mounted at %s", fm.mnt);
		cr_assert_fail("ferry mount exited 0 but nothing is mounted at %s", fm.mnt);
	}
	if (statfs(fm.mnt, &sf) != 0 || sf.f_type != FUSE_SUPER_MAGIC) {
		if (in_setup)
			SETUP_FAIL("%s is not a FUSE mount after ferry mount", fm.mnt);
		cr_assert_fail("%s is not a FUSE mount after ferry mount", fm.mnt);
	}
}

void fm_mount(void)
{
	do_mount(false);
}

void fm_mount_with(const char *opts)
{
	static char all[512];
	char *env = getenv("FERRY_IT_MOUNT_OPTIONS");
	char *saved = env ? strdup(env) : NULL;

	snprintf(all, sizeof(all), "%s%s%s", saved && *saved ? saved : "",
		 saved && *saved ? "," : "", opts);
	setenv("FERRY_IT_MOUNT_OPTIONS", all, 1);
	fm_mount();
	if (saved)
		setenv("FERRY_IT_MOUNT_OPTIONS", saved, 1);
	else
		unsetenv("FERRY_IT_MOUNT_OPTIONS");
	free(saved);
}

void fm_umount(void)
{
	const char *argv[] = { fm_bin("ferry"), "umount", fm.mnt, NULL };
	int rc = fm_run(argv, NULL, NULL, 60);

	if (rc != 0)
		cr_assert_fail("ferry umount %s: exit %d\n%s", fm.mnt, rc, log_tail());
	fm.mounted = false;
	cr_assert(!fm_is_mounted(fm.mnt), "%s still mounted after ferry umount", fm.mnt);
	for (int i = 0; i < fm.n_mountd; i++)
		cr_assert(!alive(fm.mountd[i]),
			  "ferry-mountd %d still running after ferry umount returned",
			  fm.mountd[i]);
}

void fm_remount(void)
{
	fm_umount();
	fm_mount();
}

const char *fm_mountd_log_path(void)
{
	static char path[PATH_MAX];

	(void)!snprintf(path, sizeof(path), "%.4000s/ferry-mountd.log",
			fm.voldir[0] ? fm.voldir : fm.vol);
	return path;
}

const char *fm_staging_dir(void)
{
	static char dir[PATH_MAX];

	if (fm.staging[0])
		snprintf(dir, sizeof(dir), "%s", fm.staging);
	else if (fm.voldir[0]) /* a PostgreSQL volume's node directory */
		snprintf(dir, sizeof(dir), "%.4000s/staging", fm.voldir);
	else
		snprintf(dir, sizeof(dir), "%.4000s/vol/staging", fm.dir);
	return dir;
}

int fm_forget_saved_copies(void)
{
	const char *dir = fm_staging_dir();
	DIR *d = opendir(dir);
	struct dirent *e;
	int n = 0;

	if (!d)
		return 0; /* never mounted yet */
	while ((e = readdir(d))) {
		if (strncmp(e->d_name, ".local-copies-", 14) != 0)
			continue;
		cr_assert(unlinkat(dirfd(d), e->d_name, 0) == 0, "rm %s/%s: %s", dir, e->d_name,
			  strerror(errno));
		n++;
	}
	closedir(d);
	return n;
}

void fm_remount_cold(void)
{
	if (fm.mounted) /* not after fm_crash() */
		fm_umount();
	fm_forget_saved_copies();
	fm.n_cache++;
	snprintf(fm.cache, sizeof(fm.cache), "%s/cache-%d", fm.dir, fm.n_cache);
	cr_assert(mkdir(fm.cache, 0700) == 0, "mkdir %s: %s", fm.cache, strerror(errno));
	fm_mount();
}

void fm_crash(void)
{
	pid_t pids[8];
	int n = find_mountd(fm.dir, pids, 8);

	cr_assert(n > 0, "no ferry-mountd found for %s", fm.dir);
	for (int i = 0; i < n; i++)
		kill(pids[i], SIGKILL);
	for (int t = 0; t < 500; t++) {
		bool any = false;

		for (int i = 0; i < n; i++)
			any |= alive(pids[i]);
		if (!any)
			break;
		usleep(10000);
	}
	for (int i = 0; i < n; i++)
		cr_assert(!alive(pids[i]), "ferry-mountd %d survived SIGKILL", pids[i]);
	if (fm_is_mounted(fm.mnt))
		cr_assert(umount2(fm.mnt, MNT_DETACH) == 0, "umount -l %s: %s", fm.mnt,
			  strerror(errno));
	fm.mounted = false;
}

static bool pg_volume_drop_later;

/*
 * FERRY_IT_META=pg (scripts/test runs the posix and data suites so): the
 * volume's metadata goes to a schema of its own in the test PostgreSQL
 * server, its node directory beneath the scratch directory, its objects
 * in scratch/objects unless the suite names a store.
 */
static void pg_volume_setup(void)
{
	const char *meta = getenv("FERRY_IT_META"), *url = getenv("FERRY_TEST_PG_URL");
	char state[PATH_MAX];
	unsigned r = 0;

	fm.voldir[0] = fm.pg_schema[0] = '\0';
	if (meta == NULL || strcmp(meta, "pg") != 0)
		return;
	if (url == NULL || *url == '\0')
		SETUP_FAIL("FERRY_IT_META=pg, but FERRY_TEST_PG_URL is not set (scripts/pg-server)");
	if (getrandom(&r, sizeof(r), 0) != (ssize_t)sizeof(r))
		SETUP_FAIL("getrandom: %s", strerror(errno));
	snprintf(fm.pg_schema, sizeof(fm.pg_schema), "ferry_it%d_%08x", (int)getpid(), r);
	if (snprintf(fm.vol, sizeof(fm.vol), "%s&volume=%s", url, fm.pg_schema + 6) >=
	    (int)sizeof(fm.vol))
		SETUP_FAIL("FERRY_TEST_PG_URL is too long");
	snprintf(state, sizeof(state), "%s/state", fm.dir);
	if (snprintf(fm.voldir, sizeof(fm.voldir), "%s/%s", state, fm.pg_schema + 6) >=
	    (int)sizeof(fm.voldir))
		SETUP_FAIL("scratch directory %s is too long", fm.dir);
	/* ferry and the daemons it starts find the node directory here. */
	setenv("FERRY_STATE_DIR", state, 1);
	if (!fm.storage[0]) {
		snprintf(fm.storage, sizeof(fm.storage), "file://%s/objects", fm.dir);
		if (mkdir(fm.storage + 7, 0755) != 0)
			SETUP_FAIL("mkdir %s: %s", fm.storage + 7, strerror(errno));
	}
}

/*
 * FERRY_IT_STORE=s3: a suite that names no store gets its objects on the
 * test s3rver ($FERRY_TEST_S3_HOSTPORT, $FERRY_TEST_S3_BUCKET) under a
 * prefix of its own, so that its checks run against S3 as well.
 */
static void s3_volume_setup(void)
{
	const char *store = getenv("FERRY_IT_STORE"), *hp = getenv("FERRY_TEST_S3_HOSTPORT"),
		   *bucket = getenv("FERRY_TEST_S3_BUCKET"), *base = strrchr(fm.dir, '/');

	if (fm.storage[0] || store == NULL || strcmp(store, "s3") != 0)
		return;
	if (!hp || !bucket)
		SETUP_FAIL("FERRY_IT_STORE=s3, but no test s3rver (scripts/s3-server)");
	/* The endpoint in the URL says http: restore and gc need no flag. */
	snprintf(fm.storage, sizeof(fm.storage), "s3://%s/%s?region=us-east-1&endpoint=http://%s",
		 bucket, base + 1, hp);
}

const char *fm_store_dir(void)
{
	static char dir[PATH_MAX];
	const char *s3dir = getenv("FERRY_TEST_S3_DIR"), *hp = getenv("FERRY_TEST_S3_HOSTPORT");

	if (!strncmp(fm.storage, "file://", 7))
		snprintf(dir, sizeof(dir), "%.4000s", fm.storage + 7);
	else if (!strncmp(fm.storage, "s3://", 5) && s3dir && hp && strstr(fm.storage, hp))
		snprintf(dir, sizeof(dir), "%.2000s/data/%.*s", s3dir,
			 (int)strcspn(fm.storage + 5, "?"), fm.storage + 5);
	else if (!fm.storage[0])
		snprintf(dir, sizeof(dir), "%.160s/vol/objects", fm.dir);
	else
		cr_assert_fail("no directory for the store %s", fm.storage);
	return dir;
}

bool fm_store_is_object(const char *path)
{
	size_t n = strlen(path), k = strlen("._S3rver_object");

	if (strncmp(fm.storage, "s3://", 5) != 0)
		return true;
	return n > k && strcmp(path + n - k, "._S3rver_object") == 0;
}

/* mkdir -p of path's directory. */
static void mkdirs_for(const char *path)
{
	char d[PATH_MAX + 64];

	snprintf(d, sizeof(d), "%s", path);
	for (char *p = d + 1; (p = strchr(p, '/')); p++) {
		*p = '\0';
		cr_assert(mkdir(d, 0755) == 0 || errno == EEXIST, "mkdir %s: %s", d, strerror(errno));
		*p = '/';
	}
}

void fm_store_put(const char *key, const void *data, size_t len)
{
	char path[PATH_MAX + 64], hex[2 * EVP_MAX_MD_SIZE + 1];
	unsigned char md[EVP_MAX_MD_SIZE];
	unsigned mdlen = 0;
	bool s3 = strncmp(fm.storage, "s3://", 5) == 0;

	snprintf(path, sizeof(path), "%s/%s%s", fm_store_dir(), key, s3 ? "._S3rver_object" : "");
	mkdirs_for(path);
	fm_write_file(path, data, len);
	if (!s3)
		return;
	/* s3rver keeps an object's MD5 and metadata beside it. */
	cr_assert(EVP_Digest(data, len, md, &mdlen, EVP_md5(), NULL));
	for (unsigned i = 0; i < mdlen; i++)
		snprintf(hex + 2 * i, 3, "%02x", md[i]);
	snprintf(path, sizeof(path), "%s/%s._S3rver_object.md5", fm_store_dir(), key);
	fm_write_file(path, hex, strlen(hex));
	snprintf(path, sizeof(path), "%s/%s._S3rver_metadata.json", fm_store_dir(), key);
	static const char meta[] = "{\n  \"content-type\": \"binary/octet-stream\"\n}";
	fm_write_file(path, meta, strlen(meta));
}

bool fm_store_has(const char *key)
{
	char path[PATH_MAX + 64];
	struct stat st;

	snprintf(path, sizeof(path), "%s/%s%s", fm_store_dir(), key,
		 strncmp(fm.storage, "s3://", 5) == 0 ? "._S3rver_object" : "");
	return stat(path, &st) == 0;
}

void fm_pg_schema_drop(const char *schema)
{
	const char *url = getenv("FERRY_TEST_PG_URL");
	char sql[160];
	PGconn *h;

	if (url == NULL || *url == '\0')
		return;
	h = PQconnectdb(url);
	snprintf(sql, sizeof(sql), "SET client_min_messages = warning;"
		 " DROP SCHEMA IF EXISTS %s CASCADE", schema);
	if (PQstatus(h) == CONNECTION_OK)
		PQclear(PQexec(h, sql));
	PQfinish(h);
}

static void pg_volume_drop(void)
{
	fm_pg_schema_drop(fm.pg_schema);
	fm.pg_schema[0] = '\0';
}

void fm_setup_opts(const struct fm_opts *o)
{
	const char *argv[16];
	int a = 0, rc;

	umask(022);
	memset(&fm, 0, sizeof(fm));
	fm.reaper_fd = -1;
	/* FERRY_IT_TMPDIR (default /tmp): scripts/test gives each run its own,
	 * so that its clean-up touches no other run's mounts. */
	const char *base = getenv("FERRY_IT_TMPDIR");
	if (snprintf(fm.dir, sizeof(fm.dir), "%s/ferry-it.XXXXXX", base && *base ? base : "/tmp") >=
	    (int)sizeof(fm.dir))
		cr_assert_fail("FERRY_IT_TMPDIR %s is too long", base);
	if (!mkdtemp(fm.dir))
		cr_assert_fail("mkdtemp: %s", strerror(errno));
	fm.created = true;
	/* uid 65534 must reach the mountpoint */
	chmod(fm.dir, 0755);
	snprintf(fm.vol, sizeof(fm.vol), "%s/vol", fm.dir);
	snprintf(fm.mnt, sizeof(fm.mnt), "%s/mnt", fm.dir);
	snprintf(fm.cache, sizeof(fm.cache), "%s/cache", fm.dir);
	snprintf(fm.log, sizeof(fm.log), "%s/ferry.log", fm.dir);
	start_reaper();
	if (mkdir(fm.vol, 0700) || mkdir(fm.mnt, 0755) || mkdir(fm.cache, 0700))
		SETUP_FAIL("mkdir under %s: %s", fm.dir, strerror(errno));
	if (o && o->storage)
		snprintf(fm.storage, sizeof(fm.storage), "%s", o->storage);
	fm.s3_http = o && o->s3_http;
	s3_volume_setup();
	pg_volume_setup();

	argv[a++] = fm_bin("ferry");
	argv[a++] = "format";
	if (fm.storage[0]) {
		argv[a++] = "--storage";
		argv[a++] = fm.storage;
	}
	if (fm.s3_http)
		argv[a++] = "--s3-http";
	if (o && o->block_size) {
		argv[a++] = "--block-size";
		argv[a++] = o->block_size;
	}
	argv[a++] = fm.vol;
	argv[a] = NULL;
	rc = fm_run(argv, NULL, NULL, 60);
	if (rc != 0)
		SETUP_FAIL("ferry format %s: exit %d (log above)", fm.vol, rc);
	if (o && o->no_mount)
		return;
	do_mount(true);
}

void fm_setup(void)
{
	fm_setup_opts(NULL);
}

/*
 * A test that failed half-way may still hold fds or mappings on the mount,
 * which would make the unmount fail with EBUSY: let go of them first.
 */
static void release_mount_refs(void)
{
	size_t ml = strlen(fm.mnt);
	DIR *d = opendir("/proc/self/fd");
	struct dirent *de;
	FILE *maps;
	char line[PATH_MAX + 256];

	if (d) {
		while ((de = readdir(d))) {
			char link[64], target[PATH_MAX];
			int fd = atoi(de->d_name);
			ssize_t n;

			if (fd < 3 || fd == dirfd(d))
				continue;
			snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
			n = readlink(link, target, sizeof(target) - 1);
			if (n <= 0)
				continue;
			target[n] = '\0';
			if (strncmp(target, fm.mnt, ml) == 0 && (target[ml] == '/' || !target[ml]))
				close(fd);
		}
		closedir(d);
	}
	maps = fopen("/proc/self/maps", "re");
	if (!maps)
		return;
	while (fgets(line, sizeof(line), maps)) {
		unsigned long lo, hi;
		char *path = strchr(line, '/');

		if (!path || sscanf(line, "%lx-%lx", &lo, &hi) != 2)
			continue;
		if (strncmp(path, fm.mnt, ml) == 0 && path[ml] == '/')
			munmap((void *)lo, hi - lo);
	}
	fclose(maps);
}

void fm_teardown(void)
{
	if (!fm.created)
		return;
	pg_volume_drop_later = fm.pg_schema[0] != '\0';
	release_mount_refs();
	if (fm.mounted || fm_is_mounted(fm.mnt)) {
		const char *argv[] = { fm_bin("ferry"), "umount", fm.mnt, NULL };
		int rc = fm_run(argv, NULL, NULL, 60);

		cr_expect(rc == 0, "teardown: ferry umount %s: exit %d\n%s", fm.mnt, rc,
			  log_tail());
		fm.mounted = false;
	}
	if (fm_is_mounted(fm.mnt)) {
		umount2(fm.mnt, MNT_DETACH);
		cr_expect(false, "teardown: %s was still mounted after ferry umount "
			  "(lazily unmounted)", fm.mnt);
	}
	remember_mountd();
	for (int i = 0; i < fm.n_mountd; i++)
		cr_expect(!alive(fm.mountd[i]),
			  "teardown: ferry-mountd %d still running after ferry umount",
			  fm.mountd[i]);
	kill_leftover_mountd(fm.dir);
	/* A test's own file systems beneath the directory (its cleanup may not
	 * have run: a skip, a failed assertion in its .init). */
	if (detach_beneath(fm.dir))
		cr_log_info("teardown: detached file systems left mounted beneath %s", fm.dir);
	/* FERRY_IT_KEEP=1 keeps the volume, staging files and log of each test
	 * for a post-mortem (the caller removes them). */
	if (getenv("FERRY_IT_KEEP"))
		cr_log_info("FERRY_IT_KEEP: kept %s", fm.dir);
	else
		remove_tree(fm.dir);
	fm.created = false;
	stop_reaper();
	if (pg_volume_drop_later)
		pg_volume_drop();
}

void fm_stats_read(struct fm_stats *s)
{
	char *text = fm_slurp(mp(".stats"));
	char *save = NULL, *line;
	int lineno = 0;

	cr_assert(text != NULL, "open %s: %s", mp(".stats"), strerror(errno));
	s->n = 0;
	for (line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		char *sp1 = strchr(line, ' ');
		size_t nl;

		lineno++;
		cr_assert(sp1 && sp1 > line && sp1[1] && !strpbrk(sp1 + 1, " \t"),
			  ".stats line %d is not `name value`: '%s'", lineno, line);
		nl = (size_t)(sp1 - line);
		cr_assert(nl < sizeof(s->e[0].name) && strlen(sp1 + 1) < sizeof(s->e[0].value),
			  ".stats line %d is too long: '%s'", lineno, line);
		cr_assert(s->n < (int)(sizeof(s->e) / sizeof(s->e[0])), ".stats: too many lines");
		memcpy(s->e[s->n].name, line, nl);
		s->e[s->n].name[nl] = '\0';
		strcpy(s->e[s->n].value, sp1 + 1);
		s->n++;
	}
	free(text);
}

bool fm_stats_get(const struct fm_stats *s, const char *name, uint64_t *value)
{
	for (int i = 0; i < s->n; i++) {
		if (strcmp(s->e[i].name, name) == 0) {
			*value = strtoull(s->e[i].value, NULL, 10);
			return true;
		}
	}
	return false;
}

uint64_t fm_stats_need(const struct fm_stats *s, const char *name)
{
	uint64_t v = 0;

	cr_assert(fm_stats_get(s, name, &v), ".stats has no line '%s'", name);
	return v;
}

uint64_t fm_stat(const char *name)
{
	struct fm_stats s;

	fm_stats_read(&s);
	return fm_stats_need(&s, name);
}

pid_t fm_reconciler_pid(void)
{
	pid_t p[4];
	int n = 0;

	for (int i = 0; i < 200 && (n = fm_daemon_pids("ferry-reconciler", p, 4)) != 1; i++)
		usleep(50 * 1000);
	cr_assert_eq(n, 1, "%d ferry-reconcilers for this mount", n);
	return p[0];
}

void fm_wait_committed(const char *when, int timeout_s)
{
	struct timespec t0, now;
	uint64_t v;

	fm_wait_released(0); /* the gauge is 0 before a close's handoff too */
	clock_gettime(CLOCK_MONOTONIC, &t0);
	/* (and while no reconciler is up to report it). Both from one read of
	 * .stats: a reconciler that is down reports 0 blocks, and one that
	 * came up by the next read may still have them. */
	for (;;) {
		struct fm_stats s;

		fm_stats_read(&s);
		v = fm_stats_need(&s, "passthrough_staging_blocks");
		if (v == 0 && fm_stats_need(&s, "reconciler_up"))
			break;
		clock_gettime(CLOCK_MONOTONIC, &now);
		cr_assert_lt(now.tv_sec - t0.tv_sec, timeout_s, "%s: %llu blocks still staged after "
			     "%d s", when, (unsigned long long)v, timeout_s);
		usleep(50 * 1000);
	}
}

struct as_user_result {
	long ret;
	int err;
	int stage; /* 0 ran fn, 1 setgroups, 2 setresgid, 3 setresuid */
};

long fm_as_user(uid_t uid, gid_t gid, long (*fn)(void *arg), void *arg)
{
	int p[2], status;
	pid_t pid;
	struct as_user_result res = { 0 };
	ssize_t n;

	cr_assert(pipe2(p, O_CLOEXEC) == 0, "pipe2: %s", strerror(errno));
	pid = fork();
	cr_assert(pid >= 0, "fork: %s", strerror(errno));
	if (pid == 0) {
		struct as_user_result r = { 0 };

		close(p[0]);
		if (setgroups(0, NULL) != 0) {
			r.stage = 1;
		} else if (setresgid(gid, gid, gid) != 0) {
			r.stage = 2;
		} else if (setresuid(uid, uid, uid) != 0) {
			r.stage = 3;
		} else {
			errno = 0;
			r.ret = fn(arg);
			r.err = errno;
		}
		if (r.stage)
			r.err = errno;
		(void)!write(p[1], &r, sizeof(r));
		_exit(0);
	}
	close(p[1]);
	do
		n = read(p[0], &res, sizeof(res));
	while (n < 0 && errno == EINTR);
	close(p[0]);
	waitpid(pid, &status, 0);
	cr_assert(n == (ssize_t)sizeof(res), "unprivileged child (uid %d) died: status 0x%x",
		  (int)uid, status);
	cr_assert(res.stage == 0, "dropping to uid %d gid %d failed at step %d: %s", (int)uid,
		  (int)gid, res.stage, strerror(res.err));
	errno = res.err;
	return res.ret;
}

void fm_pwrite_all(int fd, const void *buf, size_t len, off_t off)
{
	size_t done = 0;

	while (done < len) {
		ssize_t n = pwrite(fd, (const char *)buf + done, len - done, off + (off_t)done);

		if (n < 0 && errno == EINTR)
			continue;
		cr_assert(n > 0, "pwrite(%zu bytes at %lld): %s", len - done,
			  (long long)(off + (off_t)done), n < 0 ? strerror(errno) : "returned 0");
		done += (size_t)n;
	}
}

void fm_pread_all(int fd, void *buf, size_t len, off_t off)
{
	size_t done = 0;

	while (done < len) {
		ssize_t n = pread(fd, (char *)buf + done, len - done, off + (off_t)done);

		if (n < 0 && errno == EINTR)
			continue;
		cr_assert(n > 0, "pread(%zu bytes at %lld): %s", len - done,
			  (long long)(off + (off_t)done),
			  n < 0 ? strerror(errno) : "short read (EOF)");
		done += (size_t)n;
	}
}

void fm_write_file(const char *path, const void *buf, size_t len)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);

	cr_assert(fd >= 0, "open %s: %s", path, strerror(errno));
	fm_pwrite_all(fd, buf, len, 0);
	cr_assert(close(fd) == 0, "close %s: %s", path, strerror(errno));
}

void *fm_read_file(const char *path, size_t *len)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	struct stat st;
	char *buf;
	ssize_t n;

	cr_assert(fd >= 0, "open %s: %s", path, strerror(errno));
	cr_assert(fstat(fd, &st) == 0, "fstat %s: %s", path, strerror(errno));
	buf = malloc((size_t)st.st_size + 1);
	cr_assert(buf != NULL);
	if (st.st_size)
		fm_pread_all(fd, buf, (size_t)st.st_size, 0);
	/* and nothing past the size */
	n = pread(fd, buf + st.st_size, 1, st.st_size);
	cr_assert(n == 0, "%s: read past st_size %lld returned %zd", path,
		  (long long)st.st_size, n);
	close(fd);
	*len = (size_t)st.st_size;
	return buf;
}

void fm_assert_same_content(const char *a, const char *b)
{
	int fa = open(a, O_RDONLY | O_CLOEXEC), fb = open(b, O_RDONLY | O_CLOEXEC);
	struct stat sa, sb;
	const size_t bs = 1 << 20;
	char *ba = malloc(bs), *bb = malloc(bs);

	cr_assert(fa >= 0, "open %s: %s", a, strerror(errno));
	cr_assert(fb >= 0, "open %s: %s", b, strerror(errno));
	cr_assert(fstat(fa, &sa) == 0 && fstat(fb, &sb) == 0);
	cr_assert(sa.st_size == sb.st_size, "size of %s is %lld, expected %lld", a,
		  (long long)sa.st_size, (long long)sb.st_size);
	for (off_t off = 0; off < sa.st_size; off += (off_t)bs) {
		size_t len = (size_t)(sa.st_size - off) < bs ? (size_t)(sa.st_size - off) : bs;

		fm_pread_all(fa, ba, len, off);
		fm_pread_all(fb, bb, len, off);
		if (memcmp(ba, bb, len) != 0) {
			size_t i = 0;

			while (ba[i] == bb[i])
				i++;
			cr_assert_fail("%s differs from %s at offset %lld: 0x%02x, expected 0x%02x", a,
				       b, (long long)(off + (off_t)i), (unsigned char)ba[i],
				       (unsigned char)bb[i]);
		}
	}
	free(ba);
	free(bb);
	close(fa);
	close(fb);
}

uint64_t fm_rand(uint64_t *state)
{
	uint64_t x = *state;

	x ^= x >> 12;
	x ^= x << 25;
	x ^= x >> 27;
	*state = x;
	return x * 0x2545F4914F6CDD1DULL;
}

void fm_fill_random(uint64_t *state, void *buf, size_t len)
{
	unsigned char *p = buf;
	size_t i = 0;

	for (; i + 8 <= len; i += 8) {
		uint64_t v = fm_rand(state);

		memcpy(p + i, &v, 8);
	}
	if (i < len) {
		uint64_t v = fm_rand(state);

		memcpy(p + i, &v, len - i);
	}
}

void fm_s3_start(struct fm_s3 *v, const char *port)
{
	char out[PATH_MAX + 16], errp[PATH_MAX + 16], *text, *hp;
	const char *argv[] = { FERRY_SOURCE_DIR "/scripts/s3-server", "start", v->dir, NULL };
	int rc;

	if (port)
		setenv("FERRY_TEST_S3_PORT", port, 1);
	snprintf(out, sizeof(out), "%s/start.out", v->dir);
	snprintf(errp, sizeof(errp), "%s/start.err", v->dir);
	rc = fm_run(argv, out, errp, 60);
	unsetenv("FERRY_TEST_S3_PORT");
	if (rc != 0) {
		char *e = fm_slurp(errp);
		cr_assert_fail("scripts/s3-server start: exit %d: %s", rc, e ? e : "");
	}
	text = fm_slurp(out);
	cr_assert(text && (hp = strstr(text, "FERRY_TEST_S3_HOSTPORT=")),
		  "scripts/s3-server start printed no address");
	hp += strlen("FERRY_TEST_S3_HOSTPORT=");
	hp[strcspn(hp, "\n")] = '\0';
	snprintf(v->hostport, sizeof(v->hostport), "%s", hp);
	free(text);
}

void fm_s3_stop(struct fm_s3 *v)
{
	const char *argv[] = { FERRY_SOURCE_DIR "/scripts/s3-server", "stop", v->dir, NULL };

	/* fm.log may be gone with the fixture: output goes nowhere. */
	cr_assert_eq(fm_run(argv, "/dev/null", "/dev/null", 60), 0, "scripts/s3-server stop failed");
}

void fm_expect_content(const char *path, const void *want, size_t len)
{
	size_t got = 0;
	void *back = fm_read_file(path, &got);

	cr_assert(back, "%s: cannot read it back: %s", path, strerror(errno));
	cr_assert_eq(got, len, "%s: %zu bytes, not %zu", path, got, len);
	cr_assert(memcmp(back, want, len) == 0, "%s: wrong bytes", path);
	free(back);
}

void fm_wait_released(int held)
{
	struct fm_stats s;
	struct timespec t0, now;
	uint64_t n, pending;

	/* A .stats read's own handle is not counted in what it shows; an
	 * earlier read's may be, until its RELEASE: it goes too. */
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (;;) {
		fm_stats_read(&s);
		n = fm_stats_need(&s, "open_handles");
		pending = fm_stats_need(&s, "pending_commits");
		if (n == (uint64_t)held && pending == 0)
			return;
		clock_gettime(CLOCK_MONOTONIC, &now);
		if (now.tv_sec - t0.tv_sec >= 120)
			break;
		usleep(10 * 1000);
	}
	cr_assert_fail("ferry-mountd holds %llu open handles 2 minutes after the closes, not %d "
		       "(%llu closed files on its retry list)", (unsigned long long)n, held,
		       (unsigned long long)pending);
}

int fm_staging_each(uint64_t ino, void (*fn)(const char *path, void *arg), void *arg)
{
	char dir[PATH_MAX], prefix[32], path[PATH_MAX + 256];
	struct dirent *e;
	int n = 0;
	DIR *d;

	snprintf(dir, sizeof(dir), "%s", fm_staging_dir());
	snprintf(prefix, sizeof(prefix), "%llu-", (unsigned long long)ino);
	d = opendir(dir);
	cr_assert(d, "%s: %s", dir, strerror(errno));
	while ((e = readdir(d))) {
		if (strncmp(e->d_name, prefix, strlen(prefix)) != 0)
			continue;
		n++;
		if (fn) {
			snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
			fn(path, arg);
		}
	}
	closedir(d);
	return n;
}

int fm_staging_files_of(uint64_t ino)
{
	return fm_staging_each(ino, NULL, NULL);
}

void fm_upgrade(void)
{
	const char *argv[] = { fm_bin("ferry"), "mount", "--upgrade", fm.mnt, NULL };
	int rc = fm_run(argv, sp("upgrade.out"), sp("upgrade.err"), 120);
	char *err = fm_slurp(sp("upgrade.err")), *out = fm_slurp(sp("upgrade.out"));

	cr_assert_eq(rc, 0, "ferry mount --upgrade: exit %d: %s", rc, err ? err : "");
	cr_assert(out && strstr(out, "handed over to pid"), "no report: %s", out ? out : "");
	cr_log_info("%s", out);
	free(err);
	free(out);
}
