/* ferry format: writes a new volume record and checks its object store. */
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
#include "staging_owner.h"
#include "url.h"

/*
 * The volume's lock on this node (<db>.lock: the OFD lock a ferry-mountd
 * holds for as long as it serves, volume_lock() in mountd/main.c; ferry
 * dump and load take it too), held for as long as format runs: a mount
 * starting meanwhile fails instead of having its metadata and staging
 * files replaced under it. A daemon just killed lets go within moments:
 * waited for, up to 5 s. The fd, or -1 (said why).
 */
static int volume_lock_take(const char *db, const char *dir)
{
	char path[PATH_MAX], pid[32];
	struct flock fl = { .l_type = F_WRLCK, .l_whence = SEEK_SET };
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
	bool locked = false;

	for (int tries = 0;; tries++) {
		if (fcntl(fd, F_OFD_SETLK, &fl) == 0) {
			locked = true;
			break;
		}
		if (errno != EAGAIN && errno != EACCES) {
			ctl_err("cannot lock %s: %s", path, strerror(errno));
			break;
		}
		if (tries < 100) {
			usleep(50 * 1000);
			continue;
		}
		ssize_t n = pread(fd, pid, sizeof(pid) - 1, 0);
		pid[n > 0 ? n : 0] = '\0';
		pid[strcspn(pid, "\n")] = '\0';
		ctl_err("%s is in use on this node (mounted, ferry-mountd pid %s; or a ferry dump or "
			"load): unmount it before formatting it again", db, *pid ? pid : "?");
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
 * another volume's (staging_owner.h). Emptied only where its record names
 * the volume replaced (a directory holding several SQLite files shares
 * one staging directory among them: never another volume's) and no
 * ferry-reconciler serves it. A --staging-dir given elsewhere is not known
 * here: the mount names it.
 */
static int staging_clear(const char *dir, const char *old_uuid)
{
	char *staging = NULL, owner[64];
	int fd = -1, lfd = -1, rc = 0;

	if (asprintf(&staging, "%s/staging", dir) < 0) {
		ctl_err("out of memory");
		return -ENOMEM;
	}
	fd = open(staging, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0 || staging_owner_get(fd, owner, sizeof(owner)) < 0 ||
	    strcmp(owner, old_uuid) != 0)
		goto out; /* none, or not the replaced volume's */
	/* The lock a ferry-reconciler holds on the directory (reconciler/main.c). */
	lfd = openat(fd, ".ferry-reconciler.lock", O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	if (lfd >= 0 && flock(lfd, LOCK_EX | LOCK_NB) < 0) {
		ctl_err("%s is served by a ferry-reconciler: left as it is (stop it, then empty the "
			"directory: the new volume will not mount with it until then)", staging);
		rc = -EBUSY;
		goto out;
	}
	rc = dirs_empty_at(fd);
	if (rc < 0)
		ctl_err("cannot empty %s, the staging directory of the volume replaced: %s (the new "
			"volume will not mount with it until it is empty)", staging, strerror(-rc));
out:
	if (lfd >= 0)
		close(lfd);
	if (fd >= 0)
		close(fd);
	free(staging);
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
	bool have_old = false;
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
	have_old = force && volume_uuid(db, old_uuid);
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
	if (have_old && staging_clear(dir, old_uuid) < 0)
		code = 1;
out:
	if (lock_fd >= 0)
		close(lock_fd);
	objstore_close(store);
	store_url_free(&surl);
	free(storage);
	free(db);
	free(dir);
	return code;
}
