/* ferry format: writes a new volume record and checks its object store. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ctl.h"
#include "dirs.h"
#include "meta.h"
#include "objstore.h"
#include "proc_live.h"
#include "reconcile_job.h"
#include "staging_owner.h"
#include "url.h"

/*
 * The volume's lock on this node (<db>.lock: the OFD lock a ferry-mountd
 * holds for as long as it serves, volume_lock() in mountd/main.c), held
 * for as long as format runs: a mount starting meanwhile fails instead of
 * having its metadata and staging files replaced under it. A daemon just
 * killed lets go within moments: waited for, up to 5 s, unless the pid
 * the file names runs. The fd, or -1 (said why).
 */
static int volume_lock_take(const char *db, const char *dir)
{
	char path[PATH_MAX], pid[32];
	struct flock fl = { .l_type = F_WRLCK, .l_whence = SEEK_SET };
	bool locked = false;
	int fd;

	if (meta_local_file(db, dir, ".lock", path, sizeof(path)) < 0) {
		ctl_err("volume directory %s: name too long", dir);
		return -1;
	}
	fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (fd < 0) {
		ctl_err("cannot open %s: %s", path, strerror(errno));
		return -1;
	}
	for (int tries = 0;; tries++) {
		if (fcntl(fd, F_OFD_SETLK, &fl) == 0) {
			locked = true;
			break;
		}
		if (errno != EAGAIN && errno != EACCES) {
			ctl_err("cannot lock %s: %s", path, strerror(errno));
			break;
		}
		ssize_t n = pread(fd, pid, sizeof(pid) - 1, 0);
		pid[n > 0 ? n : 0] = '\0';
		pid[strcspn(pid, "\n")] = '\0';
		if (proc_live(atol(pid))) {
			ctl_err("%s is mounted on this node (ferry-mountd pid %s): unmount it before "
				"formatting it again", db, pid);
			break;
		}
		if (tries < 100) {
			usleep(50 * 1000);
			continue;
		}
		ctl_err("%s is in use on this node (its lock %s is held: a ferry dump or load, or a "
			"daemon stopping): try again once it is done", db, path);
		break;
	}
	if (locked)
		return fd;
	close(fd);
	return -1;
}

/* The uuid of the volume db holds now, if it can be read. */
static bool volume_uuid(const char *db, char uuid[37])
{
	struct meta *m = NULL;
	struct meta_volume v = { 0 };
	bool ok = false;

	if (meta_open(db, &m) == 0 && meta_volume_get(m, &v) == 0) {
		memcpy(uuid, v.uuid, 37);
		ok = uuid[0] != '\0';
	}
	meta_volume_free(&v);
	meta_close(m);
	return ok;
}

/*
 * The default staging directory of a volume formatted again: what the old
 * volume left there is of no use now (the metadata that named it is
 * gone), and the new volume's daemons would refuse the directory as
 * another volume's (staging_owner.h). It is emptied only where its record
 * names the volume replaced (SQLite files in one directory share it:
 * never another volume's), and no ferry-reconciler serves it: its lock is
 * taken first (waited for up to 5 s, as a daemon stopping), before
 * anything is formatted, and held until the directory is empty. Any other
 * record, or files no record claims, get a warning instead (plain format
 * too): the new volume's mount would be refused the directory, or take
 * the files for its own. A --staging-dir given elsewhere is not known
 * here: the mount names it.
 */
struct staging_clear {
	int fd;  /* the directory, or -1: nothing to empty */
	int lfd; /* its reconciler lock, held */
	char path[PATH_MAX];
};

/* Whether the directory holds staging files (or records): names without
 * a dot in front, the reconciler's socket aside. */
static bool holds_files(int fd)
{
	int dup_fd = dup(fd);
	DIR *d = dup_fd >= 0 ? fdopendir(dup_fd) : NULL;
	struct dirent *de;
	bool any = false;

	if (!d) {
		if (dup_fd >= 0)
			close(dup_fd);
		return false;
	}
	rewinddir(d); /* the dup shares fd's offset */
	while (!any && (de = readdir(d)))
		any = de->d_name[0] != '.' && strcmp(de->d_name, "reconciler.sock") != 0;
	closedir(d);
	return any;
}

/* 0 (sc->fd >= 0: empty it after the format), or -1 (said why): do not
 * format. */
static int staging_clear_prepare(struct staging_clear *sc, const char *dir, const char *old_uuid)
{
	char owner[64];
	int rc;

	sc->fd = sc->lfd = -1;
	if ((size_t)snprintf(sc->path, sizeof(sc->path), "%s/staging", dir) >= sizeof(sc->path))
		return 0;
	sc->fd = open(sc->path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (sc->fd < 0)
		return 0; /* none */
	rc = staging_owner_get(sc->fd, owner, sizeof(owner));
	if (rc == 0 && (!old_uuid || strcmp(owner, old_uuid) != 0)) {
		/* Another volume's (or one whose metadata is gone): the new
		 * volume will be refused it. Said now, not at its mount. */
		fprintf(stderr, "ferry: warning: %s is volume %s's staging directory: the new volume "
			"will not mount with it; give it another --staging-dir, or empty the directory "
			"(%s included) if that volume is gone for good\n", sc->path, owner,
			STAGING_OWNER_NAME);
		goto leave;
	}
	if ((rc == -ENOENT || !old_uuid) && holds_files(sc->fd)) {
		/* Whose files these are cannot be told: left to the user. */
		fprintf(stderr, "ferry: warning: %s %s; it is left as it is: empty it before the new "
			"volume mounts if what it holds is the replaced volume's\n", sc->path,
			rc == -ENOENT ? "records no volume as its owner" :
					"may be the replaced volume's, whose uuid cannot be read");
		goto leave;
	}
	if (rc < 0 || !old_uuid || strcmp(owner, old_uuid) != 0)
		goto leave; /* another volume's, or none's */
	sc->lfd = openat(sc->fd, RECONCILE_LOCK_NAME, O_RDONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW,
			 0600);
	if (sc->lfd < 0) {
		ctl_err("cannot open %s/%s: %s", sc->path, RECONCILE_LOCK_NAME, strerror(errno));
		goto refuse;
	}
	for (int tries = 0; flock(sc->lfd, LOCK_EX | LOCK_NB) < 0; tries++) {
		if (errno != EWOULDBLOCK) {
			ctl_err("cannot lock %s/%s: %s", sc->path, RECONCILE_LOCK_NAME, strerror(errno));
			goto refuse;
		}
		if (tries >= 100) {
			ctl_err("%s is served by a ferry-reconciler: stop it before formatting the "
				"volume again", sc->path);
			goto refuse;
		}
		usleep(50 * 1000);
	}
	return 0;
refuse:
	close(sc->fd);
	sc->fd = -1;
	if (sc->lfd >= 0)
		close(sc->lfd);
	sc->lfd = -1;
	return -1;
leave:
	close(sc->fd);
	sc->fd = -1;
	return 0;
}

/* Empties it, the record last: a directory left half emptied still names
 * its volume, so no other takes what is left for its own. */
static int staging_clear_finish(struct staging_clear *sc)
{
	int rc = 0;

	if (sc->fd >= 0) {
		rc = dirs_empty_at(sc->fd, STAGING_OWNER_NAME);
		if (rc == 0)
			rc = staging_owner_drop(sc->fd);
		if (rc < 0)
			ctl_err("cannot empty %s, the staging directory of the volume replaced: %s (the "
				"new volume will not mount with it until it is empty)", sc->path,
				strerror(-rc));
		close(sc->fd);
		sc->fd = -1;
	}
	if (sc->lfd >= 0)
		close(sc->lfd);
	sc->lfd = -1;
	return rc;
}

int cmd_format(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "storage", required_argument, NULL, 's' },
		{ "block-size", required_argument, NULL, 'b' },
		{ "s3-http", no_argument, NULL, 'H' },
		{ "s3-endpoint", required_argument, NULL, 'E' },
		{ "s3-region", required_argument, NULL, 'R' },
		{ "force", no_argument, NULL, 'F' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	struct meta_volume vol = { 0 };
	struct store_url surl = { 0 };
	struct objstore *store = NULL;
	char *db = NULL, *dir = NULL, *storage = NULL, err[512];
	const char *endpoint = NULL, *region = NULL;
	unsigned long long bs = META_DEFAULT_BLOCK_SIZE;
	int opt, rc, force = 0, s3_http = 0, code = 1, pg;
	char old_uuid[37] = "";
	struct staging_clear sc = { .fd = -1, .lfd = -1 };
	int lock_fd = -1; /* the volume's lock on this node, held to the end */
	struct stat st;

	optind = 1;
	while ((opt = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
		char *end;
		switch (opt) {
		case 's':
			free(storage);
			storage = strdup(optarg);
			break;
		case 'b':
			errno = 0;
			bs = strtoull(optarg, &end, 10);
			if (errno || *end || bs < 4096 || bs > (16u << 20) || bs % 4096) {
				ctl_err("--block-size %s: give a multiple of 4096 from 4096 to 16777216",
					optarg);
				goto out;
			}
			break;
		case 'H': s3_http = 1; break;
		case 'E': endpoint = optarg; break;
		case 'R': region = optarg; break;
		case 'F': force = 1; break;
		case 'h':
			printf("usage: ferry format [--storage URL] [--block-size BYTES] [--s3-http] "
			       "[--s3-endpoint URL] [--s3-region REGION] [--force] VOLUME\n");
			code = 0;
			goto out;
		default:
			code = 2;
			goto out;
		}
	}
	if (argc - optind != 1) {
		ctl_err("format takes one VOLUME (a directory, sqlite:///abs/path/meta.db or "
			"postgresql://[USER@]HOST[:PORT]/DB?volume=NAME)");
		code = 2;
		goto out;
	}
	if (meta_url_parse(argv[optind], &db, &dir, err, sizeof(err)) < 0) {
		ctl_err("volume %s: %s", argv[optind], err);
		goto out;
	}
	pg = meta_url_is_pg(db);
	if (!pg && !force && stat(db, &st) == 0) {
		ctl_err("%s already holds a volume; give --force to replace it", db);
		goto out;
	}

	/* A volume whose metadata any node reaches keeps its data where any
	 * node does too: no default under this node's directory. */
	if (pg && !storage) {
		ctl_err("a PostgreSQL volume needs --storage (an object store every node reaches)");
		code = 2;
		goto out;
	}
	if ((rc = dirs_make(dir, 0755)) < 0) {
		ctl_err("cannot create %s: %s", dir, strerror(-rc));
		goto out;
	}
	if ((lock_fd = volume_lock_take(db, dir)) < 0)
		goto out;
	{
		bool have_old = force && volume_uuid(db, old_uuid);

		if (staging_clear_prepare(&sc, dir, have_old ? old_uuid : NULL) < 0)
			goto out;
	}
	if (!storage && asprintf(&storage, "file://%s/objects", dir) < 0) {
		ctl_err("out of memory");
		goto out;
	}
	if (endpoint || region) {
		/* The URL's own options (url.h), so the volume keeps them. */
		char *full = NULL;

		if (strncmp(storage, "s3://", 5) != 0) {
			ctl_err("--s3-endpoint and --s3-region go with s3:// storage");
			code = 2;
			goto out;
		}
		if (asprintf(&full, "%s%s%s%s%s%s%s", storage, strchr(storage, '?') ? "&" : "?",
			     endpoint ? "endpoint=" : "", endpoint ? endpoint : "",
			     endpoint && region ? "&" : "", region ? "region=" : "",
			     region ? region : "") < 0) {
			ctl_err("out of memory");
			goto out;
		}
		free(storage);
		storage = full;
	}
	if (store_url_parse(storage, s3_http, &surl, err, sizeof(err)) < 0) {
		ctl_err("storage %s: %s", storage, err);
		goto out;
	}
	if (objstore_open(&surl, NULL, &store, err, sizeof(err)) < 0) {
		ctl_err("storage %s: %s", storage, err);
		goto out;
	}
	if ((rc = objstore_check(store, surl.kind == STORE_FILE)) < 0) {
		ctl_err("storage %s is not usable: %s%s%s", storage, strerror(-rc),
			*objstore_last_error() ? ": " : "", objstore_last_error());
		goto out;
	}
	vol.block_size = (uint32_t)bs;
	vol.storage_url = storage;
	vol.created_at = time(NULL);
	vol.s3_http = s3_http;
	rc = meta_format(db, &vol, getuid(), getgid(), force);
	if (rc == -EEXIST) {
		ctl_err("%s already holds a volume; give --force to replace it", db);
		goto out;
	}
	if (rc == -EBUSY) {
		struct meta *m = NULL;
		struct meta_lease l = { 0 };

		if (meta_open(db, &m) == 0 && meta_lease_get(m, &l) == 0 && l.holder[0])
			ctl_err("%s is mounted read-write by %s (its lease ends in %.1f s): unmount it "
				"before formatting it again", db, l.holder,
				(double)(l.expires_ms - l.now_ms) / 1000.0);
		else
			ctl_err("%s is mounted read-write elsewhere: unmount it before formatting it "
				"again", db);
		meta_close(m);
		goto out;
	}
	if (rc < 0) {
		ctl_err("cannot format %s: %s%s", db, strerror(-rc),
			rc == -EACCES ? " (the server refused the role, its password or the "
					"database: see PGPASSWORD, ~/.pgpass, passfile=)" :
					"");
		goto out;
	}
	printf("formatted volume at %s (storage %s, block size %llu)\n", db, storage, bs);
	code = 0;
	if (staging_clear_finish(&sc) < 0)
		code = 1;
out:
	if (sc.fd >= 0)
		close(sc.fd); /* formatting failed: left as it was */
	if (sc.lfd >= 0)
		close(sc.lfd);
	if (lock_fd >= 0)
		close(lock_fd);
	objstore_close(store);
	store_url_free(&surl);
	free(storage);
	free(db);
	free(dir);
	return code;
}
