/*
 * ferry-mountd main: options → volume (lock, metadata, object store, cache,
 * staging) → FUSE session → mount → serve → unmount, unwound in reverse
 * through cleanup labels.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <linux/io_uring.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/statfs.h>
#include <time.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "aws_creds.h"
#include "broker_client.h"
#include "fd_limit.h"
#include "heap_trim.h"
#include "inval.h"
#include "log.h"
#include "mountd.h"
#include "proc_live.h"
#include "reconcile_plan.h"
#include "staging_owner.h"
#include "dirs.h"
#include "url.h"

#define DEFAULT_CACHE_MIB 1024

static void usage(FILE *f)
{
	fprintf(f,
		"usage: ferry-mountd [options] VOLUME MOUNTPOINT\n"
		"\n"
		"Serves a ferryfs volume at MOUNTPOINT (normally started by `ferry mount`).\n"
		"VOLUME is a volume directory, sqlite:///abs/path/meta.db, or\n"
		"postgresql://[USER@]HOST[:PORT]/DB?volume=NAME (its node directory:\n"
		"$FERRY_STATE_DIR/NAME; one read-write mount at a time holds its lease).\n"
		"\n"
		"  -f, --foreground        stay attached to the terminal\n"
		"  -o OPTS                 FUSE mount options (e.g. allow_other)\n"
		"      --cache-dir DIR     read cache (default: VOLUME-DIR/cache)\n"
		"      --cache-size MIB    read cache limit (default: %d)\n"
		"      --staging-dir DIR   staging files (default: VOLUME-DIR/staging)\n"
		"      --ready-fd N        write \"ok\" (or the error) to fd N once serving\n"
		"      --attr-timeout SEC  kernel attribute/entry cache time (default: 3600)\n"
		"      --staging-min-free MIB  below this much free space in the staging\n"
		"                          directory, new opens take the daemon path (default: 256)\n"
		"      --reconciler SOCKET use a ferry-reconciler started on its own (default:\n"
		"                          start one, on a socket in the staging directory)\n"
		"      --no-reconciler     upload and commit in ferry-mountd itself, at close\n"
		"      --metrics ADDR:PORT the reconciler it starts serves Prometheus text at\n"
		"                          http://ADDR:PORT/metrics\n"
		"      --reopen-timeout SEC  how long an open waits for the file's upload\n"
		"                          (default: 120)\n"
		"      --broker SOCKET     as an unprivileged user: ferry-brokerd at SOCKET mounts\n"
		"                          (MOUNTPOINT beneath the root its policy gives this uid)\n"
		"                          and registers passthrough backing files\n"
		"      --takeover          a PostgreSQL volume: take over a lease whose holder\n"
		"                          let it run out (its node died); the holder, if it\n"
		"                          comes back, is fenced\n"
		"\n"
		"ferry's own -o options: passthrough=auto|on|off (default auto: FUSE\n"
		"passthrough writes when the kernel and the registration allow it);\n"
		"fsync=remote|local (default remote: fsync returns once the data is in the\n"
		"object store; local: once it is on this node's disk, uploaded later);\n"
		"gc_grace=SEC (default 300: objects no file refers to any more are\n"
		"deleted that long after they became garbage);\n"
		"stop_timeout=SEC (default 60: at unmount or SIGTERM, give up on the\n"
		"uploads left after that long without one finishing; they stay\n"
		"journaled for the next start);\n"
		"writeback=auto|on|off (default auto: the kernel's writeback cache for\n"
		"writes on the daemon path when passthrough is off for the whole mount; on\n"
		"turns passthrough off);\n"
		"passthrough_copy_max=SIZE (default 1g: a write open of a non-empty file up\n"
		"to this size copies it into a staging file and gets passthrough; larger\n"
		"files, and 0, take the daemon path);\n"
		"local_copies=SIZE (default: a quarter of the staging filesystem, at most half\n"
		"of its free space at start; 0: none;\n"
		"staging space kept for the staging files of passthrough writers' closes once\n"
		"committed, 1 MiB or larger, as local copies that readers open in passthrough\n"
		"mode and writers take over);\n"
		"attr_timeout=SEC (default 3600: how long the kernel keeps names, absent\n"
		"names and attributes; this daemon is the volume's only writer and\n"
		"invalidates what the reconciler's commits change; 1 for a follower);\n"
		"ro (on a PostgreSQL volume: a read-only follower of the node that writes\n"
		"it, which sees its commits within attr_timeout and takes no lease);\n"
		"readahead=MIB (default 64: a sequential reader has the objects ahead of it\n"
		"fetched into the read cache, up to this many MiB queued or in flight and a\n"
		"quarter of --cache-size ahead; 0: none);\n"
		"readdirplus=always|auto (default always: every directory listing carries\n"
		"each entry's attributes, so a walker that then stats, opens or removes the\n"
		"entries (rm -rf, cp -r, du, ls -l) asks nothing more; auto: the kernel's\n"
		"guess, cheaper for listings of names alone, ls -f or find);\n"
		"readahead_streams=N (default 8, at most 64: read-ahead's GETs at once; one\n"
		"S3 connection carries far less than a node's network, so a distant store\n"
		"wants more, with readahead raised to N objects or more);\n"
		"lease_ms=MS (default 15000: a PostgreSQL volume's writer's lease lasts this\n"
		"long and is renewed every third of it; a mount cut off for longer can be\n"
		"taken over, and is then fenced);\n"
		"names_max=N (default 1000000: names of directories made by this mount\n"
		"that it keeps to answer lookups of absent names without the metadata\n"
		"database, 16-64 bytes each; past N it forgets them and starts over;\n"
		"0: none);\n"
		"meta_batch_ms=MS (default 50, 5 on PostgreSQL: namespace changes are\n"
		"journaled on local disk as they are made and committed to the metadata\n"
		"database in batches this far apart, at every fsync, fsyncdir and unmount,\n"
		"and on SQLite within a few ms when another process waits to write; 0\n"
		"commits each change on its own);\n"
		"commit_window_ms=MS (default 50: a file the reconciler finished\n"
		"uploading waits this long for others to commit with it, unless an\n"
		"fsync, truncate or unmount waits for it; 0 commits at once);\n"
		"upload_quiet_ms=MS (default 100: a closed file's upload waits while\n"
		"others keep being closed, until MS pass without one; 0 starts at once);\n"
		"upload_delay_max_ms=MS (default 5000: ... but no longer than MS after\n"
		"its close; an fsync, a drain or unmount ends every wait)\n"
		"  -d, --debug             debug logging\n"
		"  -h, --help              this text\n"
		"  -V, --version           print the version\n",
		DEFAULT_CACHE_MIB);
}

/* Tells whoever started us how the start went, once: from INIT (the mount
 * serves from then on) or from a failure before it. */
void mountd_ready(struct mountd *md, const char *msg)
{
	int fd = atomic_exchange(&md->cfg.ready_fd, -1);

	if (fd < 0)
		return;
	dprintf(fd, "%s\n", msg);
	close(fd);
}

/* Can this process set up a ring of the kind libfuse's FUSE rings are
 * (128-byte entries)? libfuse would only log its failure and serve on
 * through /dev/fuse. 0 or -errno. */
#ifdef FUSE_CAP_OVER_IO_URING
static int io_uring_usable(void)
{
#if defined(__NR_io_uring_setup) && defined(IORING_SETUP_SQE128)
	struct io_uring_params p = { .flags = IORING_SETUP_SQE128 | IORING_SETUP_CQE32 };
	long fd = syscall(__NR_io_uring_setup, 1, &p);

	if (fd < 0)
		return -errno;
	close((int)fd);
	return 0;
#else
	return -ENOSYS;
#endif
}
#endif

/* -o io_uring: whether to ask libfuse for the ring (true: add -oio_uring).
 * What rules it out before INIT is decided here; whether the kernel offers
 * it, in op_init. io_uring=on fails the start where auto falls back. */
static bool uring_choose(struct mountd *md)
{
	const char *token = NULL, *why = NULL;
#ifdef FUSE_CAP_OVER_IO_URING
	char msg[256];
	int rc;
#endif

	if (md->ur_mode == UR_OFF) {
		token = "mount_option_off";
		why = "off by mount option io_uring=off";
	}
#ifndef FUSE_CAP_OVER_IO_URING
	else {
		token = "libfuse_lacks_io_uring";
		why = "this build's libfuse has no FUSE-over-io_uring (3.18 or later, built "
		      "with liburing; scripts/bootstrap builds one)";
	}
#else
	else if (md->cfg.broker || md->ho) {
		token = md->ho ? "handed_over" : "brokered_mount";
		why = "a mount made through ferry-brokerd or handed over is served through "
		      "custom I/O (so that a new ferry-mountd can take it over), which libfuse "
		      "keeps off the ring";
	} else if ((rc = io_uring_usable()) < 0) {
		token = "io_uring_unavailable";
		snprintf(msg, sizeof(msg), "io_uring cannot be set up here (io_uring_setup: %s; "
			 "a seccomp profile, or the sysctl kernel.io_uring_disabled)", strerror(-rc));
		why = msg;
	}
#endif
	if (!token) {
		md->uring_asked = true;
		return true;
	}
	snprintf(md->ur_reason, sizeof(md->ur_reason), "%s", token);
	if (md->ur_mode == UR_ON)
		start_failed(md, "io_uring=on, but %s", why);
	if (md->ur_mode == UR_AUTO)
		log_info("io_uring: %s; serving through /dev/fuse", why);
	return false;
}

/* Takes ferry's own options (passthrough=, fsync=) out of a -o list; the rest
 * goes to libfuse, which refuses what it does not know. */
/* A reconciler option (NAME=MS, rc_opt_defs): 1 if o is one (*rc: 0, or
 * -EINVAL with err set), 0 if not. */
static int rc_opt_parse(struct mountd *md, const char *o, char *err, size_t errlen, int *rc)
{
	for (int k = 0; k < RC_NOPTS; k++) {
		const struct rc_opt_def *d = &rc_opt_defs[k];
		size_t len = strlen(d->name);
		char *end;
		long v;

		if (strncmp(o, d->name, len) != 0 || o[len] != '=')
			continue;
		errno = 0;
		v = strtol(o + len + 1, &end, 10);
		if (!o[len + 1] || *end || errno || v < 0 || v > d->max) {
			snprintf(err, errlen, "-o %s: %s takes milliseconds, 0 to %ld", o, d->name,
				 d->max);
			*rc = -EINVAL;
			return 1;
		}
		md->rc_opt[k] = (int)v;
		*rc = 0;
		return 1;
	}
	return 0;
}

/*
 * An on|off|auto option NAME=VALUE: 1 with *mode set (0 off, 1 auto, 2 on:
 * the order of every such enum in struct mountd), 0 if o is not NAME=...,
 * -EINVAL with err set for another value.
 */
_Static_assert(PT_OFF == 0 && PT_AUTO == 1 && PT_ON == 2 && WB_OFF == 0 && WB_AUTO == 1 &&
		       WB_ON == 2 && UR_OFF == 0 && UR_AUTO == 1 && UR_ON == 2,
	       "tristate_take's modes");

static int tristate_take(const char *o, const char *name, int *mode, char *err,
			 size_t errlen)
{
	static const char *const values[] = { "off", "auto", "on" };
	size_t n = strlen(name);

	if (strncmp(o, name, n) != 0 || o[n] != '=')
		return 0;
	for (int k = 0; k < 3; k++) {
		if (!strcmp(o + n + 1, values[k])) {
			*mode = k;
			return 1;
		}
	}
	snprintf(err, errlen, "-o %s: %s takes on, off or auto", o, name);
	return -EINVAL;
}

/* A size option's value: digits with an optional k, m or g, at most 16 TiB. */
static int size_opt(const char *v, uint64_t *out)
{
	char *end;
	unsigned long long n = strtoull(v, &end, 10);
	int shift = *end == 'k' || *end == 'K' ? 10 : *end == 'm' || *end == 'M' ? 20 :
		    *end == 'g' || *end == 'G' ? 30 : 0;

	if (shift)
		end++;
	if (!*v || *end || *v == '-' || n > (1ull << 44) >> shift)
		return -EINVAL;
	*out = n << shift;
	return 0;
}

static int ferry_opts_take(struct mountd *md, char *opts, char *err, size_t errlen)
{
	char *out = opts, *save = NULL;
	bool first = true;
	int rc;

	for (char *o = strtok_r(opts, ",", &save); o; o = strtok_r(NULL, ",", &save)) {
		int mode;

		if ((rc = tristate_take(o, "passthrough", &mode, err, errlen)) != 0) {
			if (rc < 0)
				return rc;
			md->pt_mode = mode;
			continue;
		}
		if ((rc = tristate_take(o, "writeback", &mode, err, errlen)) != 0) {
			if (rc < 0)
				return rc;
			md->wb_mode = mode;
			continue;
		}
		if ((rc = tristate_take(o, "io_uring", &mode, err, errlen)) != 0) {
			if (rc < 0)
				return rc;
			md->ur_mode = mode;
			continue;
		}
		if (strncmp(o, "gc_grace=", 9) == 0) {
			char *end;
			long long v = strtoll(o + 9, &end, 10);

			if (!o[9] || *end || v < 0 || v > 30LL * 86400) {
				snprintf(err, errlen, "-o %s: gc_grace takes seconds, 0 to 2592000", o);
				return -EINVAL;
			}
			md->gc_grace_s = v;
			continue;
		}
		if (strncmp(o, "stop_timeout=", 13) == 0) {
			char *end;
			long long v = strtoll(o + 13, &end, 10);

			if (!o[13] || *end || v < 1 || v > 86400) {
				snprintf(err, errlen, "-o %s: stop_timeout takes seconds, 1 to 86400", o);
				return -EINVAL;
			}
			md->stop_timeout_s = (int)v;
			continue;
		}
		if (strncmp(o, "passthrough_copy_max=", 21) == 0) {
			if (size_opt(o + 21, &md->pt_copy_max) < 0) {
				snprintf(err, errlen, "-o %s: passthrough_copy_max takes a size in bytes "
					 "(suffix k, m or g), at most 16t", o);
				return -EINVAL;
			}
			continue;
		}
		if (strncmp(o, "local_copies=", 13) == 0) {
			md->local_copy_auto = false;
			if (size_opt(o + 13, &md->local_copy_max) < 0) {
				snprintf(err, errlen, "-o %s: local_copies takes a size in bytes "
					 "(suffix k, m or g), at most 16t", o);
				return -EINVAL;
			}
			continue;
		}
		if (strncmp(o, "attr_timeout=", 13) == 0) {
			char *end;
			double v = strtod(o + 13, &end);

			if (!o[13] || *end || !(v >= 0 && v <= 86400)) {
				snprintf(err, errlen, "-o %s: attr_timeout takes seconds, 0 to 86400", o);
				return -EINVAL;
			}
			md->cfg.attr_timeout = md->cfg.entry_timeout = v;
			md->attr_timeout_set = true;
			continue;
		}
		if (strncmp(o, "names_max=", 10) == 0) {
			char *end;
			long long v = strtoll(o + 10, &end, 10);

			if (!o[10] || *end || v < 0 || v > 100000000) {
				snprintf(err, errlen, "-o %s: names_max takes a count, 0 to 100000000",
					 o);
				return -EINVAL;
			}
			md->names_max = (size_t)v;
			continue;
		}
		if (strncmp(o, "meta_batch_ms=", 14) == 0) {
			char *end;
			long v = strtol(o + 14, &end, 10);

			if (!o[14] || *end || v < 0 || v > 1000) {
				snprintf(err, errlen, "-o %s: meta_batch_ms takes milliseconds, 0 to 1000",
					 o);
				return -EINVAL;
			}
			md->meta_batch_ms = (int)v;
			continue;
		}
		if (strncmp(o, "lease_ms=", 9) == 0) {
			char *end;
			long v = strtol(o + 9, &end, 10);

			if (!o[9] || *end || v < 1000 || v > 600000) {
				snprintf(err, errlen, "-o %s: lease_ms takes milliseconds, 1000 to "
					 "600000", o);
				return -EINVAL;
			}
			md->lease_ms = v;
			continue;
		}
		if (strncmp(o, "readahead=", 10) == 0) {
			char *end;
			long v = strtol(o + 10, &end, 10);

			if (!o[10] || *end || v < 0 || v > 4096) {
				snprintf(err, errlen, "-o %s: readahead takes MiB, 0 to 4096", o);
				return -EINVAL;
			}
			md->readahead_budget = (uint64_t)v << 20;
			continue;
		}
		if (strncmp(o, "readdirplus=", 12) == 0) {
			if (!strcmp(o + 12, "always")) {
				md->readdirplus_auto = false;
			} else if (!strcmp(o + 12, "auto")) {
				md->readdirplus_auto = true;
			} else {
				snprintf(err, errlen, "-o %s: readdirplus takes always or auto", o);
				return -EINVAL;
			}
			continue;
		}
		if (strncmp(o, "readahead_streams=", 18) == 0) {
			char *end;
			long v = strtol(o + 18, &end, 10);

			if (!o[18] || *end || v < 1 || v > (long)READAHEAD_STREAMS_MAX) {
				snprintf(err, errlen, "-o %s: readahead_streams takes 1 to %u", o,
					 READAHEAD_STREAMS_MAX);
				return -EINVAL;
			}
			md->readahead_streams = (unsigned)v;
			continue;
		}
		if (rc_opt_parse(md, o, err, errlen, &rc) != 0) {
			if (rc < 0)
				return rc;
			continue;
		}
		if (strncmp(o, "fsync=", 6) == 0) {
			if (!strcmp(o + 6, "local"))
				md->fsync_local = true;
			else if (!strcmp(o + 6, "remote"))
				md->fsync_local = false;
			else {
				snprintf(err, errlen, "-o %s: fsync takes remote or local", o);
				return -EINVAL;
			}
			continue;
		}
		if (strcmp(o, "ro") == 0)
			md->ro_asked = true; /* and to the kernel, below */
		size_t n = strlen(o);
		if (!first)
			*out++ = ',';
		memmove(out, o, n);
		out += n;
		first = false;
	}
	*out = '\0';
	return 0;
}

void start_failed(struct mountd *md, const char *fmt, ...)
{
	char msg[1024];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	log_warnx("%s", msg);
	mountd_ready(md, msg);
	rclient_stop(md); /* a reconciler we started goes too */
	lease_stop(md);   /* the next mount needs no takeover */
	exit(1);
}

/* One ferry-mountd per volume: an OFD lock on <db>.lock, holding our pid. */
static int volume_lock(struct mountd *md)
{
	char path[PATH_MAX], pid[32] = "";
	struct flock fl = { .l_type = F_WRLCK, .l_whence = SEEK_SET };
	int fd;

	if (meta_local_file(md->cfg.db_path, md->cfg.vol_dir, ".lock", path, sizeof(path)) < 0)
		return -ENAMETOOLONG;
	fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (fd < 0)
		return -errno;
	for (int tries = 0; fcntl(fd, F_OFD_SETLK, &fl) < 0; tries++) {
		int err = errno;
		ssize_t n = pread(fd, pid, sizeof(pid) - 1, 0);
		pid[n > 0 ? n : 0] = '\0';
		pid[strcspn(pid, "\n")] = '\0';
		/* A daemon that was just killed holds the lock until its last
		 * thread is gone (its leader is a zombie sooner): wait a little
		 * for a holder that is no longer running. */
		if ((err == EAGAIN || err == EACCES) && tries < 100 && *pid &&
		    !proc_live(atol(pid))) {
			usleep(50 * 1000);
			continue;
		}
		close(fd);
		if (err == EAGAIN || err == EACCES)
			start_failed(md, "volume %s is already mounted by ferry-mountd pid %s",
				     md->cfg.db_path, *pid ? pid : "?");
		return -err;
	}
	if (ftruncate(fd, 0) == 0)
		dprintf(fd, "%d\n", (int)getpid());
	md->lock_fd = fd;
	return 0;
}

/*
 * The largest file ferryfs takes: every byte is staged first, so the
 * staging filesystem's own limit (ext4 with 4 KiB blocks: 16 TiB - 4 KiB),
 * found by growing an unnamed file there, and no more than a reconcile job
 * describes. The kernel's FUSE superblock has no limit of its own to
 * tell applications (MAX_LFS_FILESIZE), so truncates are checked here.
 */
static uint64_t staging_max_file_size(int dirfd)
{
	uint64_t lo = 0, hi = (uint64_t)1 << 62;
	int fd = openat(dirfd, ".", O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);

	if (fd < 0)
		return RECONCILE_LENGTH_MAX; /* no O_TMPFILE: the job's bound */
	while (hi - lo > 1) {
		uint64_t mid = lo + (hi - lo) / 2;
		if (ftruncate(fd, (off_t)mid) == 0)
			lo = mid;
		else
			hi = mid;
	}
	close(fd);
	return lo < RECONCILE_LENGTH_MAX ? lo : RECONCILE_LENGTH_MAX;
}

void staging_owner_refuse(struct mountd *md, int rc, const char *held, const char *uuid)
{
	if (rc == -EEXIST)
		start_failed(md, "staging directory %s belongs to volume %s, not to this one (%s): "
			     "give each volume its own --staging-dir (its files may hold that "
			     "volume's writes not uploaded yet; if that volume is gone for good, "
			     "empty the directory, %s/%s included)", md->cfg.staging_dir, held, uuid,
			     md->cfg.staging_dir, STAGING_OWNER_NAME);
	if (rc == -EBADMSG)
		start_failed(md, "staging directory %s: %s/%s names no volume (it holds '%s'); "
			     "is the directory ferryfs's?", md->cfg.staging_dir, md->cfg.staging_dir,
			     STAGING_OWNER_NAME, held);
}

/* Staging must be a real local filesystem: writes are staged there first. */
static int staging_open(struct mountd *md)
{
	struct statfs sfs;
	int fd;

	if (mkdir(md->cfg.staging_dir, 0700) < 0 && errno != EEXIST)
		return -errno;
	fd = open(md->cfg.staging_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	if (fstatfs(fd, &sfs) == 0 && (sfs.f_type == 0x65735546 /* FUSE */ ||
				       sfs.f_type == 0x794c7630 /* overlayfs */)) {
		close(fd);
		start_failed(md, "staging directory %s is on a stacked filesystem (FUSE or overlayfs); "
			     "give --staging-dir on a local filesystem", md->cfg.staging_dir);
	}
	/* Before anything in it is looked at: another volume's leftovers must
	 * not be taken for this one's (staging_owner.h). A read-only follower
	 * neither stages nor recovers anything: it claims nothing, and a
	 * directory the writer of this node has not claimed yet again (a
	 * volume formatted over, lease_take()) does not keep it out. */
	char other[64];
	int rc = md->follower ? 0 : staging_owner_claim(fd, md->vol.uuid, other, sizeof(other));
	staging_owner_refuse(md, rc, other, md->vol.uuid);
	if (staging_owner_unwritable(rc)) {
		/* As before there were records: claimed at a later start. */
		log_warnx("cannot record volume %s as the owner of staging directory %s: %s",
			  md->vol.uuid, md->cfg.staging_dir, strerror(-rc));
	} else if (rc < 0) {
		close(fd);
		return rc;
	}
	md->staging_dirfd = fd;
	md->max_file_size = staging_max_file_size(fd);
	local_copy_saved_load(md); /* a follower's sweep must leave them too */
	if (md->local_copy_auto) {
		/* A quarter of the filesystem, and no more than half of what
		 * is free now: it may be the host's own (the default volume
		 * directory is). */
		struct statvfs sv;
		uint64_t total, half_free;

		if (fstatvfs(fd, &sv) == 0) {
			/* The copies a hand-over brings or the last run left
			 * count as free: the limit must not shrink at every
			 * upgrade or remount. */
			total = (uint64_t)sv.f_blocks * sv.f_frsize / LOCAL_COPY_SHARE_DEFAULT;
			half_free = ((uint64_t)sv.f_bavail * sv.f_frsize + handover_kept_bytes(md) +
				     local_copy_saved_bytes(md)) / 2;
			md->local_copy_max = total < half_free ? total : half_free;
		}
	}
	return 0;
}

static int mountpoint_check(struct mountd *md)
{
	struct stat st, parent;
	char up[PATH_MAX];

	/* Existence only: an unprivileged daemon gets its /dev/fuse fd from
	 * fusermount3, not by opening it; through the broker it needs none. */
	if (!md->cfg.broker && (stat("/dev/fuse", &st) < 0 || !S_ISCHR(st.st_mode)))
		start_failed(md, "/dev/fuse is missing (load the fuse module or give the "
			     "container the device)");
	if (md->cfg.broker)
		return 0; /* the broker resolves and checks it (see main) */
	if (stat(md->cfg.mountpoint, &st) < 0)
		start_failed(md, "mountpoint %s: %s", md->cfg.mountpoint, strerror(errno));
	if (!S_ISDIR(st.st_mode))
		start_failed(md, "mountpoint %s is not a directory", md->cfg.mountpoint);
	snprintf(up, sizeof(up), "%s/..", md->cfg.mountpoint);
	if (stat(up, &parent) == 0 && parent.st_dev != st.st_dev)
		start_failed(md, "mountpoint %s is busy: something is already mounted there",
			     md->cfg.mountpoint);
	return 0;
}

/*
 * Splits the kernel mount options (libfuse's -o string, without "-o") into
 * the broker's list: bopts[0..] gets pointers into opts, which it cuts at
 * commas; NULL-terminated. -E2BIG if there are more than max.
 */
static int broker_options(char *opts, char **bopts, size_t max)
{
	size_t n = 0;
	char *save = NULL;

	for (char *o = strtok_r(opts, ",", &save); o; o = strtok_r(NULL, ",", &save)) {
		if (n == max)
			return -E2BIG;
		bopts[n++] = o;
	}
	bopts[n] = NULL;
	return 0;
}

static void wake_handler(int sig)
{
	(void)sig; /* only ends a wait (the FUSE loop's sem_wait) */
}

/* The end of a mount this daemon took over (handover.c) and did not make:
 * libfuse does not know it as mounted. Lazily, as fusermount3 -u would at
 * an exit; the kernel's own unmount (ferry umount) left nothing to do. */
static void mount_end_handed_over(struct mountd *md)
{
	if (umount2(md->cfg.mountpoint, MNT_DETACH) == 0 || errno == EINVAL || errno == ENOENT)
		return;
	pid_t pid = fork();
	if (pid == 0) {
		execlp("fusermount3", "fusermount3", "-u", "-z", "--", md->cfg.mountpoint,
		       (char *)NULL);
		_exit(127);
	}
	if (pid > 0)
		waitpid(pid, NULL, 0);
}

static char *abs_path(const char *p)
{
	char *r = realpath(p, NULL);
	return r ? r : strdup(p);
}

int main(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "foreground", no_argument, NULL, 'f' },
		{ "cache-dir", required_argument, NULL, 'C' },
		{ "cache-size", required_argument, NULL, 'S' },
		{ "staging-dir", required_argument, NULL, 'T' },
		{ "ready-fd", required_argument, NULL, 'R' },
		{ "attr-timeout", required_argument, NULL, 'A' },
		{ "staging-min-free", required_argument, NULL, 'M' },
		{ "reconciler", required_argument, NULL, 'Q' },
		{ "no-reconciler", no_argument, NULL, 'N' },
		{ "metrics", required_argument, NULL, 'P' },
		{ "reopen-timeout", required_argument, NULL, 'W' },
		{ "broker", required_argument, NULL, 'B' },
		{ "takeover", no_argument, NULL, 'K' },
		{ "handover", required_argument, NULL, 'H' },
		{ "debug", no_argument, NULL, 'd' },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },
		{ NULL, 0, NULL, 0 },
	};
	struct mountd md_, *md = &md_;
	struct fuse_args fargs = FUSE_ARGS_INIT(0, NULL);
	struct fuse_loop_config *loop_cfg = NULL;
	struct store_url surl = { 0 };
	char err[512], *user_opts = NULL, *fopts = NULL, *cache_vol = NULL, *journal = NULL;
	struct aws_creds_info creds;
	struct objstore_opts store_opts = { .creds_report = log_warnx_report };
	char *bopts[BROKER_OPTIONS_MAX + 1];
	uint64_t cache_mib = DEFAULT_CACHE_MIB, purged = 0;
	bool mounted = false, handlers = false;
	int opt, rc, exit_code = 1;
	const char *handover_arg = NULL;

	memset(md, 0, sizeof(*md));
	md->cfg.ready_fd = -1;
	md->lock_fd = -1;
	md->staging_dirfd = -1;
	/* The only writer of its volume, and told of what the reconciler
	 * changes (a commit invalidates the inode): the kernel may keep names,
	 * absent names and attributes for long. */
	md->cfg.attr_timeout = md->cfg.entry_timeout = ATTR_TIMEOUT_DEFAULT_S;
	md->pt_mode = PT_AUTO;
	md->pt_off = true; /* until INIT says the kernel has it */
	snprintf(md->pt_reason, sizeof(md->pt_reason), "not_negotiated");
	md->staging_min_free = 256ull << 20;
	md->gc_grace_s = GC_GRACE_DEFAULT_S;
	md->stop_timeout_s = 60;
	md->meta_batch_ms = -1; /* the engine's default, once the volume is known */
	md->names_max = NAMES_MAX_DEFAULT;
	md->readahead_budget = READAHEAD_DEFAULT_MIB << 20;
	md->readahead_streams = READAHEAD_STREAMS_DEFAULT;
	md->lease_ms = LEASE_MS_DEFAULT;
	for (int k = 0; k < RC_NOPTS; k++)
		md->rc_opt[k] = -1; /* the reconciler's own default */
	md->pt_copy_max = PT_COPY_MAX_DEFAULT;
	md->local_copy_auto = true;
	md->pid = getpid(); /* in names of its files (pool, copies) even without a reconciler */
	pthread_mutex_init(&md->kept_lock, NULL);
	md->wb_mode = WB_AUTO;
	md->cfg.reopen_timeout_ms = 120000;
	md->rc_sock = -1;
	pthread_mutex_init(&md->rc_lock, NULL);
	mono_cond_init(&md->rc_cond);
	{
		/* Writer-preferred: a checkpoint's fence is not starved by a
		 * stream of creates; they wait behind it instead. */
		pthread_rwlockattr_t ra;

		pthread_rwlockattr_init(&ra);
		pthread_rwlockattr_setkind_np(&ra, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
		pthread_rwlock_init(&md->ns_fence, &ra);
		pthread_rwlockattr_destroy(&ra);
	}
	pthread_mutex_init(&md->pt_reason_lock, NULL);
	pthread_mutex_init(&md->pending_lock, NULL);
	mono_cond_init(&md->pending_cond);
	pthread_mutex_init(&md->broker_lock, NULL);
	pthread_mutex_init(&md->handover_lock, NULL);
	md->ho_fuse_fd = -1;
	log_init("ferry-mountd", LOG_LVL_INFO);
	md->argc = argc;
	md->argv = argv;

	while ((opt = getopt_long(argc, argv, "fo:dhV", longopts, NULL)) != -1) {
		char *end;
		switch (opt) {
		case 'f': md->cfg.foreground = true; break;
		case 'o':
			if (user_opts) {
				char *j;
				if (asprintf(&j, "%s,%s", user_opts, optarg) < 0)
					fatalx("out of memory");
				free(user_opts);
				user_opts = j;
			} else {
				user_opts = strdup(optarg);
			}
			break;
		case 'C': md->cfg.cache_dir = abs_path(optarg); break;
		case 'S':
			errno = 0;
			cache_mib = strtoull(optarg, &end, 10);
			if (errno || *end || end == optarg)
				fatalx("--cache-size: not a number of MiB: %s", optarg);
			break;
		case 'T': md->cfg.staging_dir = abs_path(optarg); break;
		case 'H':
			handover_arg = optarg;
			break;
		case 'R':
			md->cfg.ready_fd = atoi(optarg);
			if (fcntl(md->cfg.ready_fd, F_SETFD, FD_CLOEXEC) < 0)
				fatal("--ready-fd %s", optarg);
			break;
		case 'A':
			md->cfg.attr_timeout = md->cfg.entry_timeout = strtod(optarg, &end);
			if (*end || md->cfg.attr_timeout < 0)
				fatalx("--attr-timeout: not a number of seconds: %s", optarg);
			md->attr_timeout_set = true;
			break;
		case 'M':
			errno = 0;
			md->staging_min_free = strtoull(optarg, &end, 10) << 20;
			if (errno || *end || end == optarg)
				fatalx("--staging-min-free: not a number of MiB: %s", optarg);
			break;
		case 'Q': md->cfg.reconciler = strdup(optarg); break;
		case 'N': md->cfg.no_reconciler = true; break;
		case 'P': md->cfg.metrics = strdup(optarg); break;
		case 'W':
			md->cfg.reopen_timeout_ms = (int)(strtod(optarg, &end) * 1000);
			if (*end || md->cfg.reopen_timeout_ms <= 0)
				fatalx("--reopen-timeout: not a number of seconds: %s", optarg);
			break;
		case 'B':
			if (!*optarg || strpbrk(optarg, " \t\r\n"))
				fatalx("--broker: not a socket path: %s", optarg);
			md->cfg.broker = strdup(optarg);
			break;
		case 'K': md->lease_takeover = true; break;
		case 'd': log_set_level(LOG_LVL_DEBUG); break;
		case 'h': usage(stdout); return 0;
		case 'V': printf("ferry-mountd 0.1.0 (libfuse %s)\n", fuse_pkgversion()); return 0;
		default: usage(stderr); return 2;
		}
	}
	if (argc - optind != 2) {
		usage(stderr);
		return 2;
	}
	if (user_opts && ferry_opts_take(md, user_opts, err, sizeof(err)) < 0)
		start_failed(md, "%s", err);
	md->started = time(NULL);
	md->started_mono_ns = mono_now_ns();
	md->cfg.cache_bytes = cache_mib << 20;
	if (meta_url_parse(argv[optind], &md->cfg.db_path, &md->cfg.vol_dir, err, sizeof(err)) < 0)
		start_failed(md, "volume %s: %s", argv[optind], err);
	/* A PostgreSQL volume's node directory: its lock, journal, staging
	 * and cache (a SQLite volume's is the directory its file is in). */
	if (meta_url_is_pg(md->cfg.db_path) && (rc = dirs_make(md->cfg.vol_dir, 0700)) < 0)
		start_failed(md, "volume directory %s: %s", md->cfg.vol_dir, strerror(-rc));
	/* A reconciler started on its own would commit whatever the lease:
	 * only the one this daemon starts is fenced to its epoch. */
	/* A read-only mount of a shared volume follows whichever node writes
	 * it: no lease, and the kernel asks again within the bound. */
	md->follower = meta_url_is_pg(md->cfg.db_path) && md->ro_asked;
	if (md->meta_batch_ms < 0)
		md->meta_batch_ms = meta_url_is_pg(md->cfg.db_path) ? META_BATCH_MS_PG_DEFAULT :
								       META_BATCH_MS_DEFAULT;
	if (md->follower && !md->attr_timeout_set)
		md->cfg.attr_timeout = md->cfg.entry_timeout = FOLLOW_TIMEOUT_S;
	if (md->follower && md->cfg.reconciler)
		start_failed(md, "--reconciler: a read-only mount uploads nothing");
	if (meta_url_is_pg(md->cfg.db_path) && md->cfg.reconciler)
		start_failed(md, "--reconciler cannot serve a PostgreSQL volume (it would not be "
			     "fenced by the mount's lease): let ferry-mountd start its own");
	/* Through the broker the mountpoint may hold our own mount whose
	 * daemon died, which would hang a stat(): only its parent is looked
	 * at, and the broker checks the directory itself. */
	md->cfg.mountpoint = md->cfg.broker || handover_arg ?
				     broker_mountpoint_path(argv[optind + 1]) : NULL;
	if (!md->cfg.mountpoint)
		md->cfg.mountpoint = abs_path(argv[optind + 1]);
	if (!md->cfg.cache_dir && asprintf(&md->cfg.cache_dir, "%s/cache", md->cfg.vol_dir) < 0)
		fatalx("out of memory");
	if (!md->cfg.staging_dir && asprintf(&md->cfg.staging_dir, "%s/staging", md->cfg.vol_dir) < 0)
		fatalx("out of memory");

	/* A mount handed over is served already: nobody answers a look at
	 * its root until this daemon does. */
	if (handover_arg && (rc = handover_load(md, handover_arg, err, sizeof(err))) < 0)
		start_failed(md, "%s", err);
	if (!handover_arg)
		mountpoint_check(md);
	/* Staging files of open writers, of uploads being read in flight,
	 * connections: far more than 1024 on a busy mount. */
	fd_limit_raise();
	heap_trim_threshold_raise();
	rc = meta_open(md->cfg.db_path, &md->meta);
	if (rc == -ENOENT)
		start_failed(md, "no ferryfs volume at %s (run `ferry format` first)", argv[optind]);
	if (rc == -ECONNREFUSED)
		start_failed(md, "cannot reach the database server of %s (not running, not "
			     "answering, or not where the URL says)", md->cfg.db_path);
	if (rc == -EACCES && meta_url_is_pg(md->cfg.db_path))
		start_failed(md, "the database server refused %s: a wrong or missing password (from "
			     "PGPASSWORD, ~/.pgpass or passfile=), role or database",
			     md->cfg.db_path);
	if (rc < 0)
		start_failed(md, "cannot open volume %s: %s", md->cfg.db_path, strerror(-rc));
	/* Namespace changes need not each wait for a disk sync: they are
	 * synced at fsync/fsyncdir (and every commit of file data is). */
	if ((rc = meta_set_batched(md->meta, 1)) < 0)
		start_failed(md, "cannot start the metadata checkpointer: %s", strerror(-rc));
	if ((rc = volume_lock(md)) < 0)
		start_failed(md, "cannot lock volume %s: %s", md->cfg.db_path, strerror(-rc));
	/* Before anything of this mount writes, the journal's replay included.
	 * A follower writes nothing: its handle is fenced to an epoch no lease
	 * reaches, so a write transaction that got this far would fail EROFS
	 * instead of changing a volume another node holds. */
	if (md->follower) {
		meta_lease_fence(md->meta, UINT64_MAX);
	} else {
		lease_take(md);
		if ((rc = lease_start(md)) < 0)
			start_failed(md, "cannot start renewing the lease: %s", strerror(-rc));
	}
	if (md->meta_batch_ms > 0 && !md->follower) {
		uint64_t replayed = 0;

		char jpath[PATH_MAX];

		if (meta_local_file(md->cfg.db_path, md->cfg.vol_dir, META_JOURNAL_SUFFIX, jpath,
				    sizeof(jpath)) < 0 ||
		    (journal = strdup(jpath)) == NULL)
			fatalx("out of memory");
		/* Before the reconciler starts: its jobs may name inodes whose
		 * creation only the journal holds. */
		rc = meta_journal_open(md->meta, journal, md->meta_batch_ms, &replayed);
		if (rc < 0)
			start_failed(md, "metadata journal %s: %s", journal, strerror(-rc));
		if (replayed)
			log_info("replayed %llu metadata changes from %s (an earlier run stopped "
				 "before committing them)", (unsigned long long)replayed, journal);
		struct meta_journal_stats js;
		meta_journal_stats_get(md->meta, &js);
		if (js.replay_errors)
			log_warnx("%llu changes in %s were refused by the database at replay (it "
				  "changed since they were made?); the rest were applied",
				  (unsigned long long)js.replay_errors, journal);
	}
	/* The volume is held (its lock, or the writer's lease) and replayed:
	 * no other process changes its names from here on. */
	if (!md->follower && md->names_max > 0 && (rc = meta_names_keep(md->meta, md->names_max)) < 0)
		start_failed(md, "cannot keep directory names: %s", strerror(-rc));
	if ((rc = meta_volume_get(md->meta, &md->vol)) < 0)
		start_failed(md, "cannot read the volume record of %s: %s", md->cfg.db_path,
			     strerror(-rc));
	if (store_url_parse(md->vol.storage_url, md->vol.s3_http, &surl, err, sizeof(err)) < 0)
		start_failed(md, "volume storage %s: %s", md->vol.storage_url, err);
	if ((rc = objstore_open(&surl, &store_opts, &md->store, err, sizeof(err))) < 0)
		start_failed(md, "storage %s: %s", md->vol.storage_url, err);
	if (objstore_creds_info(md->store, &creds) == 0)
		log_info("s3 credentials from %s", creds.source);
	if ((rc = objstore_check(md->store, surl.kind == STORE_FILE)) < 0)
		start_failed(md, "storage %s is not usable: %s%s%s", md->vol.storage_url,
			     strerror(-rc), *objstore_last_error() ? ": " : "", objstore_last_error());
	/* Object keys restart with a reformatted volume: cache by volume uuid. */
	if (mkdir(md->cfg.cache_dir, 0700) < 0 && errno != EEXIST)
		start_failed(md, "read cache %s: %s", md->cfg.cache_dir, strerror(errno));
	if (asprintf(&cache_vol, "%s/%s", md->cfg.cache_dir, md->vol.uuid) < 0)
		fatalx("out of memory");
	if ((rc = read_cache_open(cache_vol, md->cfg.cache_bytes, &md->cache)) < 0)
		start_failed(md, "read cache %s: %s", cache_vol, strerror(-rc));
	/* What a reader reads ahead stays cached until it gets there: a
	 * quarter of the cache at most, or read-ahead would evict its own. */
	md->readahead_window = md->readahead_budget < md->cfg.cache_bytes / 4 ?
				       md->readahead_budget :
				       md->cfg.cache_bytes / 4;
	if (md->readahead_window >= md->vol.block_size &&
	    (rc = prefetch_start(md, md->readahead_budget, md->readahead_streams, &md->prefetch)) < 0)
		start_failed(md, "read-ahead threads: %s", strerror(-rc));
	/* Before the staging directory's leftovers are looked at: which of
	 * them were written under this boot (staging_kind()). */
	if (!boot_tag(md->boot_tag)) {
		/* A copy could not say which boot made it: none is made. */
		md->pt_copy_max = 0;
		log_warnx("cannot read this boot's id (/proc/sys/kernel/random/boot_id): writers "
			  "of files with content take the daemon path (no copies into staging "
			  "files), and copies an earlier run left are neither committed nor removed");
	}
	if ((rc = staging_open(md)) < 0)
		start_failed(md, "staging directory %s: %s", md->cfg.staging_dir, strerror(-rc));
	staging_pool_sweep(md);
	if ((rc = staging_pool_new(md)) < 0)
		start_failed(md, "out of memory");
	if ((rc = inode_table_new(&md->inodes)) < 0 ||
	    (rc = handle_table_new(1u << 20, &md->handles)) < 0)
		start_failed(md, "out of memory");
	if (md->follower) {
		/* Nothing to upload; staging leftovers of an earlier read-write
		 * mount on this node wait for the next one (it holds the lease).
		 * No layout is cached: the writer's commits do not pass here. */
	} else if (md->cfg.no_reconciler) {
		staging_recover(md, false);
		atomic_store(&md->layout_ready, true); /* every commit is this daemon's */
	}
	else if ((rc = rclient_start(md)) < 0)
		start_failed(md, "cannot start ferry-reconciler: %s (see the log; --no-reconciler "
			     "commits in ferry-mountd)", strerror(-rc));
	/* Close-to-open across a crash: uploads an earlier run left (found
	 * by the reconciler at its start) commit before this run serves, so
	 * no file reads as it was before its last close. The wait moves while
	 * they progress; a store that does not answer is not waited for. */
	if (!md->cfg.no_reconciler && !md->follower && (rc = rclient_drain(md, 60000)) < 0)
		log_warnx("uploads left by an earlier run are not all committed (%s): files they "
			  "hold read as before them until they are", strerror(-rc));
	if (md->follower)
		; /* the writer's orphans are its own to free */
	else if (md->ho)
		; /* the daemon before may have had them open: freed at a later start */
	else if ((rc = meta_orphans_purge(md->meta, &purged)) < 0)
		log_errno(rc, "cannot free unlinked inodes left by an earlier run");
	else if (purged)
		log_info("freed %llu unlinked inodes left by an earlier run", (unsigned long long)purged);

	/* default_permissions: the kernel checks modes (as a local fs would);
	 * nodev: device nodes are metadata only. */
	if (asprintf(&fopts, "-odefault_permissions,nodev,fsname=ferryfs:%s,subtype=ferryfs%s%s",
		     md->vol.uuid, user_opts && *user_opts ? "," : "", user_opts ? user_opts : "") < 0)
		fatalx("out of memory");
	if (fuse_opt_add_arg(&fargs, argv[0]) < 0 || fuse_opt_add_arg(&fargs, fopts) < 0)
		fatalx("out of memory");
	/* libfuse turns the ring on from its environment too; only -o io_uring
	 * may here (a brokered mount on the ring could not be taken over). */
	unsetenv("FUSE_URING_ENABLE");
	if (uring_choose(md) && fuse_opt_add_arg(&fargs, "-oio_uring") < 0)
		fatalx("out of memory");
	md->se = fuse_session_new(&fargs, &mountd_ops, sizeof(mountd_ops), md);
	if (!md->se)
		start_failed(md, "cannot create the FUSE session (bad -o option?)");
	if (fuse_set_signal_handlers(md->se) != 0)
		start_failed(md, "cannot install signal handlers");
	handlers = true;
	if (md->ho) {
		/* The daemon before us handed the live connection over. */
		if (handover_serve(md, err, sizeof(err)) < 0)
			start_failed(md, "%s", err);
	} else if (md->cfg.broker) {
		/* The broker mounts, with the options the kernel would get from
		 * libfuse; we serve the fd it returns. */
		int fuse_fd = -1;

		if (broker_options(fopts + 2, bopts, BROKER_OPTIONS_MAX) < 0)
			start_failed(md, "too many mount options for ferry-brokerd (at most %u)",
				     BROKER_OPTIONS_MAX);
		if (broker_link_mount(md, (const char *const *)bopts, &fuse_fd, err, sizeof(err)) < 0)
			start_failed(md, "%s", err);
		uint8_t init[sizeof(md->fio.init)];
		size_t init_len = 0;
		rc = md->reattached ? fuse_io_saved_init(md, init, sizeof(init), &init_len) : 0;
		if (rc == 0)
			rc = fuse_io_start(md, fuse_fd, md->reattached ? init : NULL, init_len);
		if (rc < 0) {
			close(fuse_fd);
			if (!md->reattached)
				broker_link_umount(md);
			start_failed(md, "cannot serve the mount ferry-brokerd %s on %s: %s",
				     md->reattached ? "handed over" : "made", md->cfg.mountpoint,
				     rc == -ENOENT ? "the kernel's INIT of its first daemon is not in "
						     "the staging directory" : strerror(-rc));
		}
	} else if (fuse_session_mount(md->se, md->cfg.mountpoint) != 0) {
		start_failed(md, "cannot mount on %s (see the lines above)", md->cfg.mountpoint);
	} else if (md->uring_asked) {
		/* libfuse's own I/O: custom I/O would keep it off the ring. No
		 * INIT is kept, so this mount cannot be handed over. */
	} else if ((rc = fuse_io_start(md, fuse_session_fd(md->se), NULL, 0)) == -ENOTSUP) {
		/* A libfuse built without custom I/O (Debian's 3.18 packages):
		 * a direct mount is served all the same, without hand-over. */
		log_warnx("this libfuse has no custom I/O (fuse_session_custom_io): the mount "
			  "cannot be handed over (ferry mount --upgrade); build libfuse with "
			  "-Denable-custom-io=true (scripts/bootstrap does)");
	} else if (rc < 0) {
		/* Through fuse_io.c too: it keeps the INIT a hand-over needs. */
		fuse_session_unmount(md->se);
		start_failed(md, "cannot serve the mount: %s", strerror(-rc));
	}
	mounted = true;
	bool builds = !md->follower && md->local_copy_max && md->pt_mode != PT_OFF;
	if ((md->uring_asked || builds) && (rc = inval_start(md)) < 0)
		start_failed(md, "cannot start the invalidation thread: %s", strerror(-rc));
	if ((rc = write_back_start(md)) < 0) {
		log_errno(rc, "cannot start the write-back thread");
		goto out;
	}
	if ((rc = handover_restore(md)) < 0)
		start_failed(md, "cannot take up the open handles handed over: %s", strerror(-rc));
	staging_adopt(md);
	local_copy_saved_adopt(md);
	if (!md->follower && (rc = gc_start(md)) < 0) {
		log_errno(rc, "cannot start the gc thread");
		goto out;
	}
	if (builds && (rc = copy_build_start(md)) < 0) {
		log_errno(rc, "cannot start the local copy thread");
		goto out;
	}
	log_info("serving volume %s (%s) at %s", md->vol.uuid, md->vol.storage_url,
		 md->cfg.mountpoint);
	if (!md->cfg.foreground) {
		int null = open("/dev/null", O_RDWR | O_CLOEXEC);
		if (null >= 0) {
			dup2(null, STDIN_FILENO);
			dup2(null, STDOUT_FILENO);
			close(null);
		}
		setsid();
	}
	/* op_init reports "ok" once the kernel's INIT is answered. */
	loop_cfg = fuse_loop_cfg_create();
	if (!loop_cfg) {
		log_warnx("out of memory");
		goto out;
	}
	fuse_loop_cfg_set_clone_fd(loop_cfg, 0);
	fuse_loop_cfg_set_max_threads(loop_cfg, 16);
	/* A hand-over request ends the loop through SIGUSR2 (handover.c). */
	md->main_thread = pthread_self();
	{
		struct sigaction sa = { .sa_handler = wake_handler };
		sigemptyset(&sa.sa_mask);
		sigaction(SIGUSR2, &sa, NULL);
	}
	for (;;) {
		rc = fuse_session_loop_mt(md->se, loop_cfg);
		if (!md->handover_path)
			break;
		if (handover_send(md) == 0)
			_exit(0); /* the mount is the new daemon's: no unmount, no destroy */
		if (md->handing_over)
			_exit(1); /* failed half-way: left as after a crash (nothing lost) */
	}
	/* libfuse ends the loop with the number of the signal that stopped
	 * it (SIGTERM: `ferry umount` of a mount made through the broker). */
	exit_code = rc >= 0 ? 0 : 1;
	if (rc > 0)
		log_info("stopping on signal %d", rc);
	else if (rc != 0 && rc != -ENODEV)
		log_warnx("the FUSE loop ended with %d", rc);
out:
	atomic_store(&md->fuse_done, true);
	gc_stop(md);
	copy_build_stop(md); /* before the copies go */
	write_back_stop(md);
	staging_pool_free(md); /* no request runs now (their ids go with the connection) */
	if (mounted && !md->follower)
		local_copy_save(md); /* the current ones, for the next mount */
	local_copy_drop_all(md);
	if (mounted && md->unmount_self && !md->handing_over)
		mount_end_handed_over(md); /* libfuse never mounted it: */
	else if (mounted && !md->handing_over)
		fuse_session_unmount(md->se); /* nothing for a brokered mount: */
	broker_link_umount(md);               /* the broker unmounts that */
	if (handlers)
		fuse_remove_signal_handlers(md->se);
	if (md->se)
		fuse_session_destroy(md->se); /* runs destroy: commits what is still pending */
	rclient_stop(md); /* if destroy did not run (no INIT) */
	/* Copies left for an upload that could not finish (the store down)
	 * are whole after a clean reboot: flushed and recorded so. Not at a
	 * hand-over: the next daemon goes on writing them. */
	if (!md->handing_over && !md->follower)
		staging_flushed_mark(md);
	inval_stop(md);   /* after the reconciler's replies: they queue there */
	lease_stop(md);   /* everything is committed: the lease goes */
	fuse_loop_cfg_destroy(loop_cfg);
	fuse_opt_free_args(&fargs);
	if (md->handles)
		mountd_handles_drop(md);
	copy_build_free(md); /* after the last release (copy_build_later()) */
	handle_table_free(md->handles);
	if (!md->handing_over)
		local_copy_exit(md); /* a failed hand-over's copies are the next run's */
	local_copy_saved_free(md);
	inode_table_free(md->inodes);
	prefetch_stop(md->prefetch);
	read_cache_close(md->cache);
	objstore_close(md->store);
	store_url_free(&surl);
	meta_volume_free(&md->vol);
	meta_close(md->meta);
	if (md->staging_dirfd >= 0)
		close(md->staging_dirfd);
	if (md->lock_fd >= 0)
		close(md->lock_fd);
	log_info("stopped");
	free(fopts);
	free(cache_vol);
	free(journal);
	free(user_opts);
	free(md->cfg.db_path);
	free(md->cfg.vol_dir);
	free(md->cfg.mountpoint);
	free(md->cfg.cache_dir);
	free(md->cfg.staging_dir);
	free(md->cfg.reconciler);
	broker_link_close(md);
	free(md->cfg.broker);
	free(md->cfg.metrics);
	return exit_code;
}
