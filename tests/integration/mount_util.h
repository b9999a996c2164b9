/*
 * Fixture for integration tests that run against a real ferryfs mount.
 *
 * Every test gets its own scratch directory /tmp/ferry-it.XXXXXX (under
 * $FERRY_IT_TMPDIR if set) holding
 *   vol/    the volume (meta.db, objects/)
 *   mnt/    the mountpoint
 *   cache/  --cache-dir of the mount
 *   ferry.log  stdout/stderr of every ferry command the fixture ran
 * Setup formats and mounts (-o allow_other), teardown unmounts, kills any
 * ferry-mountd it started that is still alive and removes the directory.
 * A reaper process cleans up as well if the test process dies without
 * running its teardown (crash, timeout), so nothing stays mounted.
 * FERRY_IT_KEEP=1 keeps the directory (unmounted) for a post-mortem.
 */
#ifndef FERRY_IT_MOUNT_UTIL_H
#define FERRY_IT_MOUNT_UTIL_H

#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/types.h>

#include <criterion/criterion.h>

#define FM_NOBODY_UID 65534
#define FM_NOBODY_GID 65534
#define FM_DAEMON_ENV_MAX 8

struct fm {
	char dir[160];          /* $FERRY_IT_TMPDIR/ferry-it.XXXXXX (default /tmp) */
	char vol[PATH_MAX];     /* dir/vol, the sqlite:// URL given, or a postgresql:// URL */
	char mnt[PATH_MAX];     /* dir/mnt */
	char cache[PATH_MAX];   /* dir/cache */
	char log[PATH_MAX];     /* dir/ferry.log */
	char storage[PATH_MAX]; /* --storage URL, empty for the default */
	bool s3_http;
	bool mounted;
	bool created;
	int reaper_fd;          /* write end: closing it lets the reaper go */
	pid_t reaper;
	pid_t mountd[8];        /* ferry-mountd pids seen for this fixture */
	int n_mountd;
	int n_cache;            /* caches made by fm_remount_cold() */
	bool no_reconciler;     /* mount with --no-reconciler (commit in ferry-mountd) */
	char staging[PATH_MAX]; /* --staging-dir, if not empty */
	const char *staging_min_free; /* --staging-min-free MiB, if not NULL */
	/* Extra environment of `ferry mount`, so of the ferry-mountd and the
	 * ferry-reconciler it starts: "NAME=value" (fm_daemon_env). */
	char daemon_env[FM_DAEMON_ENV_MAX][1024];
	int n_daemon_env;
	/* FERRY_IT_META=pg: the volume's metadata is a schema of the test
	 * PostgreSQL server ($FERRY_TEST_PG_URL) and vol its URL; voldir is
	 * its node directory ($FERRY_STATE_DIR/NAME), pg_schema its schema. */
	char voldir[PATH_MAX];
	char pg_schema[64];
};

/* Removes a volume's schema from the test PostgreSQL server
 * ($FERRY_TEST_PG_URL; nothing without it). */
void fm_pg_schema_drop(const char *schema);

/* The one fixture of this test process. */
extern struct fm fm;

/* Options for fm_setup_opts(); NULL/false fields take the defaults. */
struct fm_opts {
	const char *storage;    /* --storage URL */
	bool s3_http;           /* --s3-http */
	const char *block_size; /* --block-size */
	bool no_mount;          /* format only */
};

/* Criterion .init/.fini for suites that want a formatted, mounted volume. */
void fm_setup(void);
void fm_teardown(void);
/* Same, with options (used by the S3 suite). Asserts on failure, after
 * cleaning up whatever it had already set up. */
void fm_setup_opts(const struct fm_opts *o);

/* Where the fixture's objects live on disk, to count or damage them: the
 * file:// store's directory, or for FERRY_IT_STORE=s3 (the volume on the
 * test s3rver, $FERRY_TEST_S3_*) the server's directory of the volume's
 * prefix, whose objects are files named KEY._S3rver_object. Static. */
const char *fm_store_dir(void);
/* The staging directory the mount uses: --staging-dir, else the volume's
 * default (VOLUME/staging; a PostgreSQL volume's node directory/staging).
 * A static buffer, overwritten by the next call. */
const char *fm_staging_dir(void);
/* ferry-mountd's log: VOLUME/ferry-mountd.log, or a PostgreSQL volume's
 * node directory's. A static buffer, overwritten by the next call. */
const char *fm_mountd_log_path(void);
/* Whether a file under fm_store_dir() is an object (not s3rver's own). */
bool fm_store_is_object(const char *path);
/* Puts an object straight into the store's directory, as the store would
 * (an upload nobody committed, say), and whether one is there. */
void fm_store_put(const char *key, const void *data, size_t len);
bool fm_store_has(const char *key);

/* The -o list the fixture mounts with: allow_other plus
 * $FERRY_IT_MOUNT_OPTIONS. Static storage. */
const char *fm_mount_options(void);

/* ferry mount / ferry umount / both; each asserts success. */
void fm_mount(void);
/* fm_mount() with extra -o options after those of $FERRY_IT_MOUNT_OPTIONS
 * (which later mounts keep using alone). */
void fm_mount_with(const char *opts);
void fm_umount(void);
void fm_remount(void);
/* Unmount (unless fm_crash() left it unmounted), then mount with a new,
 * empty --cache-dir and without the local copies the unmount left (their
 * list goes, so the start removes them): every byte read afterwards comes
 * from the object store and the metadata DB. */
void fm_remount_cold(void);
/* Removes the lists of local copies a clean unmount left in the staging
 * directory (".local-copies-*"); returns how many there were. */
int fm_forget_saved_copies(void);
/* ferry mount --upgrade of the mount, which must report the hand-over. */
void fm_upgrade(void);
/* SIGKILL the fixture's ferry-mountd, wait until it is gone and lazily
 * unmount the dead mount (for crash-durability tests). */
void fm_crash(void);

/* Sets (value NULL: removes) a variable in the environment of the daemons
 * that the next fm_mount() starts. fm_setup_opts() starts with none: set
 * them after a setup with .no_mount, then fm_mount(). */
void fm_daemon_env(const char *name, const char *value);
/* Has the next fm_mount()'s daemons load the test shim ferry_shim_NAME.so
 * (tests/integration/shim_NAME.c) with LD_PRELOAD. Under ASan the shim
 * comes before ASan's runtime (ASAN_OPTIONS gets verify_asan_link_order=0):
 * each shim forwards to the next definition, so ASan keeps its place. */
void fm_daemon_preload(const char *name);
/* Path of ferry_shim_NAME.so ($FERRY_SHIM_DIR overrides the build's). */
const char *fm_shim(const char *name);
/* Is this test program built with AddressSanitizer (and so, in
 * scripts/test, the daemons it runs)? */
bool fm_asan(void);

/* Pids of the live processes named prog (ferry-mountd, ferry-reconciler)
 * whose command line names the fixture's directory: how many, up to max. */
int fm_daemon_pids(const char *prog, pid_t *out, int max);
/* The same for daemons with an argument holding s (a mountpoint, a node
 * directory) rather than the fixture's directory. */
int fm_daemon_pids_with(const char *prog, const char *s, pid_t *out, int max);

/* Waits until ferry-mountd holds exactly `held` open handles (.stats
 * open_handles), asserting after 2 minutes. The kernel sends RELEASE after
 * close() returned (a passthrough writer's close sends nothing else), so
 * until then ferry-mountd has not seen the close: no handoff yet, the
 * staging file still shared by the next open, a reader still holding the
 * inode in cached mode. A RELEASE that finds the kernel still holding the
 * staging file puts the file on the retry list (.stats pending_commits),
 * which hands it over later: that list must be empty too (so not for a
 * test whose commits are meant to fail). held: the files and directories
 * of the mount the caller still has open (or mapped). */
void fm_wait_released(int held);

/* Is anything mounted at path (per /proc/self/mountinfo)? */
bool fm_is_mounted(const char *path);
/* How many staging files of inode ino (named <ino>-...) the fixture's
 * staging directory holds. */
int fm_staging_files_of(uint64_t ino);
/* The same, calling fn (if not NULL) with each one's path. */
int fm_staging_each(uint64_t ino, void (*fn)(const char *path, void *arg), void *arg);

/* Path inside the mount / inside the scratch directory. Results live in a
 * ring of 16 static buffers, so a few can be used in one expression. */
const char *mp(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
const char *sp(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Run argv (argv[0] a path) with stdin from /dev/null. stdout goes to
 * out_path (truncated) or, if NULL, is appended to fm.log; stderr goes to
 * err_path (truncated) or, if NULL, to fm.log. Returns the exit status,
 * 128+signal if killed, -1 if it could not run. Kills it after timeout_s. */
int fm_run(const char *const argv[], const char *out_path, const char *err_path,
	   int timeout_s);
/* Path of a ferry binary: FERRY_BIN_DIR/name (env FERRY_BIN_DIR overrides). */
const char *fm_bin(const char *name);
/* Contents of a (small) file as a NUL-terminated malloc'd string, or NULL. */
char *fm_slurp(const char *path);
/* Number of lines of a file's text. */
int fm_count_lines(const char *text);

/* .stats of the mount as a map. */
struct fm_stat_entry {
	char name[96];
	char value[256];
};
struct fm_stats {
	int n;
	struct fm_stat_entry e[512];
};
/* Reads MOUNTPOINT/.stats; asserts on failure and on a malformed line. */
void fm_stats_read(struct fm_stats *s);
/* Looks up name; returns false if absent. */
bool fm_stats_get(const struct fm_stats *s, const char *name, uint64_t *value);
/* Value of name, asserting that it is present. */
uint64_t fm_stats_need(const struct fm_stats *s, const char *name);
/* fm_stats_need() of a fresh read of .stats. */
uint64_t fm_stat(const char *name);
/* The pid of the mount's one ferry-reconciler, waiting (10 s at most) for
 * one to run alone (after a restart, the old one may still be going). */
pid_t fm_reconciler_pid(void);
/* Waits (timeout_s at most, asserting) until nothing closed is only on
 * local disk: every close's RELEASE handled, then the staging gauge 0. */
void fm_wait_committed(const char *when, int timeout_s);

/*
 * Run fn(arg) in a forked child that dropped to uid/gid (setgroups(0),
 * setresgid, setresuid). fn returns like a syscall (-1 with errno on
 * failure). The child's return value and errno come back through a pipe:
 * returns fn's value and sets errno to the child's errno. Asserts that the
 * child ran to the end.
 */
long fm_as_user(uid_t uid, gid_t gid, long (*fn)(void *arg), void *arg);
static inline long fm_as_nobody(long (*fn)(void *arg), void *arg)
{
	return fm_as_user(FM_NOBODY_UID, FM_NOBODY_GID, fn, arg);
}

/* Whole-file helpers; assert on any failure. */
void fm_write_file(const char *path, const void *buf, size_t len);
/* Reads a whole file into a malloc'd buffer; *len gets its size. */
void *fm_read_file(const char *path, size_t *len);
/* pread/pwrite loops that assert on a short transfer or error. */
void fm_pwrite_all(int fd, const void *buf, size_t len, off_t off);
void fm_pread_all(int fd, void *buf, size_t len, off_t off);
/* Compares two files byte for byte; on a difference, asserts with the
 * first differing offset. */
void fm_assert_same_content(const char *a, const char *b);
/* Asserts that path holds exactly want[0..len). */
void fm_expect_content(const char *path, const void *want, size_t len);

/* Deterministic PRNG (xorshift64*) for reproducible data. */
uint64_t fm_rand(uint64_t *state);
void fm_fill_random(uint64_t *state, void *buf, size_t len);

/* A private s3rver (scripts/s3-server) with its data in dir, for tests
 * that stop the store and start it again on the same port. */
struct fm_s3 {
	char dir[PATH_MAX];
	char hostport[64];      /* 127.0.0.1:PORT once started */
};
/* Starts it (on port, if not NULL); asserts on failure with its stderr. */
void fm_s3_start(struct fm_s3 *v, const char *port);
/* Stops it; asserts on failure. */
void fm_s3_stop(struct fm_s3 *v);

/* errno name for messages ("ENOENT"). */
const char *fm_errname(int e);

/*
 * Syscall checks in the style of libfuse's test_syscalls.c.
 * OK(expr): expr must not return a negative value; yields its value.
 * FAILS(expr, err): expr must return -1 with errno == err.
 * FAILS2(expr, e1, e2): -1 with errno e1 or e2.
 */
#define OK(expr)                                                              \
	({                                                                    \
		errno = 0;                                                    \
		__typeof__(expr) ok_r_ = (expr);                              \
		int ok_e_ = errno;                                            \
		cr_assert(ok_r_ >= 0, "%s:%d: %s: returned %lld, errno %s (%s)", \
			  __FILE__, __LINE__, #expr, (long long)ok_r_,        \
			  fm_errname(ok_e_), strerror(ok_e_));                \
		ok_r_;                                                        \
	})

#define FAILS(expr, err)                                                      \
	do {                                                                  \
		errno = 0;                                                    \
		long long f_r_ = (long long)(expr);                           \
		int f_e_ = errno;                                             \
		cr_assert(f_r_ == -1 && f_e_ == (err),                        \
			  "%s:%d: %s: expected -1/%s, got %lld/%s", __FILE__,   \
			  __LINE__, #expr, fm_errname(err), f_r_,             \
			  f_r_ == -1 ? fm_errname(f_e_) : "-");               \
	} while (0)

#define FAILS2(expr, err1, err2)                                              \
	do {                                                                  \
		errno = 0;                                                    \
		long long f_r_ = (long long)(expr);                           \
		int f_e_ = errno;                                             \
		cr_assert(f_r_ == -1 && (f_e_ == (err1) || f_e_ == (err2)),   \
			  "%s:%d: %s: expected -1/%s or %s, got %lld/%s",       \
			  __FILE__, __LINE__, #expr, fm_errname(err1),        \
			  fm_errname(err2), f_r_,                             \
			  f_r_ == -1 ? fm_errname(f_e_) : "-");               \
	} while (0)

#endif
