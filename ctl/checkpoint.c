/*
 * ferry checkpoint, ferry restore, ferry gc: a volume's checkpoints
 * (taken by its mounted daemon through .control; listed and deleted
 * here), a new volume made from one, and the offline collector of objects
 * nothing refers to. Layout in the store: common/checkpoint_store.h.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "checkpoint_store.h"
#include "ctl.h"
#include "dirs.h"
#include "meta.h"
#include "meta_dump.h"
#include "objstore.h"
#include "url.h"

#define GC_GRACE_DEFAULT_S 300

/* The store m's volume names. */
static int volume_store_open(struct meta *m, struct objstore **s, char *err, size_t errlen)
{
	struct meta_volume vol = { 0 };
	struct store_url u = { 0 };
	int rc = meta_volume_get(m, &vol);

	if (rc < 0) {
		snprintf(err, errlen, "cannot read the volume record: %s", strerror(-rc));
		return rc;
	}
	rc = store_url_parse(vol.storage_url, vol.s3_http, &u, err, errlen);
	if (rc == 0)
		rc = objstore_open(&u, NULL, s, err, errlen);
	store_url_free(&u);
	meta_volume_free(&vol);
	return rc;
}

static void time_text(int64_t ms, char *buf, size_t len)
{
	time_t t = (time_t)(ms / 1000);
	struct tm tm;

	gmtime_r(&t, &tm);
	strftime(buf, len, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

static int list_one(const struct meta_checkpoint *cp, void *arg)
{
	char when[32];

	(void)arg;
	time_text(cp->taken_ms, when, sizeof(when));
	printf("%-24s %s %10" PRIu64 " slices %14" PRIu64 " bytes\n", cp->name, when, cp->slices,
	       cp->bytes);
	return 0;
}

static int checkpoint_list(const char *volume)
{
	char *db = NULL, *dir = NULL, err[512] = "";
	struct meta *m = NULL;
	int rc, code = 1;

	if (meta_url_parse(volume, &db, &dir, err, sizeof(err)) < 0) {
		ctl_err("volume %s: %s", volume, err);
		goto out;
	}
	rc = meta_open(db, &m);
	if (rc < 0) {
		ctl_err("cannot open %s: %s", db, strerror(-rc));
		goto out;
	}
	rc = meta_checkpoint_list(m, NULL, list_one, NULL, err, sizeof(err));
	if (rc < 0) {
		ctl_err("%s", err);
		goto out;
	}
	code = 0;
out:
	meta_close(m);
	free(db);
	free(dir);
	return code;
}

static int checkpoint_delete(const char *volume, const char *name, bool force)
{
	char *db = NULL, *dir = NULL, err[512] = "", first[80];
	struct objstore *s = NULL;
	struct meta *m = NULL;
	unsigned restored = 0;
	int rc, code = 1;

	if (meta_url_parse(volume, &db, &dir, err, sizeof(err)) < 0) {
		ctl_err("volume %s: %s", volume, err);
		goto out;
	}
	if ((rc = meta_open(db, &m)) < 0) {
		ctl_err("cannot open %s: %s", db, strerror(-rc));
		goto out;
	}
	if (volume_store_open(m, &s, err, sizeof(err)) < 0) {
		ctl_err("the volume's store: %s", err);
		goto out;
	}
	rc = ckpt_store_restored(s, name, &restored, first, sizeof(first));
	if (rc < 0) {
		ctl_err("cannot list the volumes restored from %s: %s (%s)", name, strerror(-rc),
			objstore_last_error());
		goto out;
	}
	if (restored && !force) {
		ctl_err("%u volume(s) were restored from checkpoint %s (%s first): they read its "
			"objects, which gc may take once it is gone; give --force when none of them "
			"is in use", restored, name, first);
		goto out;
	}
	/* The rows first: a checkpoint whose rows are gone but whose dump is
	 * still stored is garbage in the store, never a restore of missing
	 * objects that ferry checkpoint --list would still show. */
	rc = meta_checkpoint_drop(m, name, err, sizeof(err));
	if (rc == -ENOENT) {
		struct ckpt_manifest mf;
		char e2[256];

		if (ckpt_store_manifest(s, name, &mf, e2, sizeof(e2)) == -ENOENT) {
			ctl_err("no checkpoint named %s", name);
			goto out;
		}
	} else if (rc < 0) {
		ctl_err("%s", err);
		goto out;
	}
	if (ckpt_store_delete(s, name, err, sizeof(err)) < 0) {
		ctl_err("%s", err);
		goto out;
	}
	printf("deleted checkpoint %s%s; its slices are garbage now unless a file or another "
	       "checkpoint has them\n", name, rc == -ENOENT ? " (only its stored dump was left)" : "");
	code = 0;
out:
	objstore_close(s);
	meta_close(m);
	free(db);
	free(dir);
	return code;
}

int cmd_checkpoint(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "timeout", required_argument, NULL, 't' },
		{ "json", no_argument, NULL, 'j' },
		{ "list", no_argument, NULL, 'l' },
		{ "delete", no_argument, NULL, 'd' },
		{ "force", no_argument, NULL, 'f' },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	static const char usage[] =
		"usage: ferry checkpoint [--timeout SEC] [--json] MOUNTPOINT NAME\n"
		"       ferry checkpoint --list VOLUME\n"
		"       ferry checkpoint --delete [--force] VOLUME NAME";
	double timeout_s = 0;
	bool list = false, del = false, force = false;
	int opt, json = 0;

	optind = 1;
	while ((opt = getopt_long(argc, argv, "t:jh", opts, NULL)) != -1) {
		switch (opt) {
		case 't':
			if (ctl_timeout_arg("checkpoint", optarg, &timeout_s) < 0)
				return 2;
			break;
		case 'j': json = 1; break;
		case 'l': list = true; break;
		case 'd': del = true; break;
		case 'f': force = true; break;
		case 'h': printf("%s\n", usage); return 0;
		default: return 2;
		}
	}
	if (list && !del && optind == argc - 1)
		return checkpoint_list(argv[optind]);
	if (del && !list && optind == argc - 2) {
		if (!meta_checkpoint_name_ok(argv[optind + 1])) {
			ctl_err("checkpoint: bad name '%s'", argv[optind + 1]);
			return 2;
		}
		return checkpoint_delete(argv[optind], argv[optind + 1], force);
	}
	if (list || del || force || optind != argc - 2) {
		ctl_err("%s", usage);
		return 2;
	}
	if (!meta_checkpoint_name_ok(argv[optind + 1])) {
		ctl_err("checkpoint: bad name '%s' (1 to %d of A-Z a-z 0-9 . _ -, not starting "
			"with . or -)", argv[optind + 1], META_CHECKPOINT_NAME_MAX);
		return 2;
	}
	return ctl_control_run(argv[optind], argv[optind + 1], timeout_s, json);
}

static void uuid_new(char out[37])
{
	uint8_t b[16] = { 0 };

	if (getrandom(b, sizeof(b), 0) != sizeof(b))
		for (size_t i = 0; i < sizeof(b); i++)
			b[i] = (uint8_t)rand();
	b[6] = (uint8_t)((b[6] & 0x0f) | 0x40);
	b[8] = (uint8_t)((b[8] & 0x3f) | 0x80);
	snprintf(out, 37,
		 "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
		 b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
		 b[14], b[15]);
}

int cmd_restore(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "from", required_argument, NULL, 'F' },
		{ "storage", required_argument, NULL, 's' },
		{ "s3-http", no_argument, NULL, 'H' },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	static const char usage[] = "usage: ferry restore --from NAME --storage URL [--s3-http] "
				    "NEW_VOLUME";
	const char *from = NULL, *storage = NULL;
	char *db = NULL, *dir = NULL, err[512] = "", uuid[37];
	struct store_url u = { 0 };
	struct objstore *s = NULL;
	struct ckpt_manifest mf;
	uint64_t base = 0, n = 0;
	FILE *tmp = NULL;
	int opt, rc, code = 1, s3_http = 0;
	bool made_dir = false, loaded = false;

	optind = 1;
	while ((opt = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (opt) {
		case 'F': from = optarg; break;
		case 's': storage = optarg; break;
		case 'H': s3_http = 1; break;
		case 'h': printf("%s\n", usage); return 0;
		default: return 2;
		}
	}
	if (!from || !storage || optind != argc - 1) {
		ctl_err("%s", usage);
		return 2;
	}
	if (!meta_checkpoint_name_ok(from)) {
		ctl_err("restore: bad checkpoint name '%s'", from);
		return 2;
	}
	if (meta_url_parse(argv[optind], &db, &dir, err, sizeof(err)) < 0) {
		ctl_err("volume %s: %s", argv[optind], err);
		goto out;
	}
	if (store_url_parse(storage, s3_http, &u, err, sizeof(err)) < 0 ||
	    objstore_open(&u, NULL, &s, err, sizeof(err)) < 0) {
		ctl_err("storage %s: %s", storage, err);
		goto out;
	}
	tmp = tmpfile();
	if (!tmp) {
		ctl_err("cannot make a temporary file: %s", strerror(errno));
		goto out;
	}
	if (ckpt_store_get(s, from, tmp, &mf, err, sizeof(err)) < 0) {
		ctl_err("%s", err);
		goto out;
	}
	rewind(tmp);
	if (ckpt_store_range_claim(s, &base, err, sizeof(err)) < 0) {
		ctl_err("%s", err);
		goto out;
	}
	made_dir = access(dir, F_OK) != 0;
	if ((rc = dirs_make(dir, 0755)) < 0) {
		ctl_err("cannot create %s: %s", dir, strerror(-rc));
		goto out;
	}
	rc = meta_load(tmp, db, &n, err, sizeof(err));
	if (rc < 0) {
		ctl_err("cannot load checkpoint %s into %s: %s", from, db, err);
		if (made_dir)
			(void)rmdir(dir);
		goto out;
	}
	loaded = true;
	uuid_new(uuid);
	if (meta_restore_adopt(db, uuid, base, err, sizeof(err)) < 0) {
		ctl_err("%s", err);
		goto out;
	}
	/* Before it is used: the origin's checkpoint cannot go unnoticed. */
	rc = ckpt_store_mark_restored(s, from, uuid);
	if (rc < 0) {
		ctl_err("cannot record the restore in the store: %s (%s)", strerror(-rc),
			objstore_last_error());
		goto out;
	}
	printf("restored checkpoint %s (volume %s, %llu records) as %s, volume %s: it reads the "
	       "checkpoint's objects, so keep the checkpoint while it is in use\n",
	       from, mf.volume, (unsigned long long)n, db, uuid);
	code = 0;
out:
	if (code && loaded)
		fprintf(stderr, "ferry: %s was loaded but is not usable; remove it\n", db);
	if (tmp)
		fclose(tmp);
	objstore_close(s);
	store_url_free(&u);
	free(db);
	free(dir);
	return code;
}

/* ---- ferry gc ---- */

struct gc_walk {
	struct objstore *s;
	const struct meta_kept *k;
	bool del;
	uint64_t live, live_bytes, foreign, garbage, garbage_bytes, deleted, skipped;
	int first_err;
};

/* chunks/A/B/ID_INDEX_SIZE: the slice id, or false for another key. */
static bool key_slice_id(const char *key, uint64_t *id)
{
	const char *base = strrchr(key, '/');
	char *end;

	if (strncmp(key, "chunks/", 7) != 0 || !base)
		return false;
	errno = 0;
	*id = strtoull(base + 1, &end, 10);
	return !errno && end != base + 1 && *end == '_';
}

static int gc_key(const char *key, uint64_t size, void *arg)
{
	struct gc_walk *w = arg;
	uint64_t id;
	int rc;

	if (!key_slice_id(key, &id)) {
		w->skipped++;
		return 0;
	}
	if (!meta_slice_id_ours(w->k->base, id)) {
		w->foreign++; /* another volume's (an origin's, or a restored one's) */
		return 0;
	}
	if (meta_kept_has(w->k, id)) {
		w->live++;
		w->live_bytes += size;
		return 0;
	}
	w->garbage++;
	w->garbage_bytes += size;
	if (!w->del) {
		printf("garbage %s (%" PRIu64 " bytes)\n", key, size);
		return 0;
	}
	rc = objstore_delete(w->s, key);
	if (rc < 0) {
		if (!w->first_err)
			w->first_err = rc;
		fprintf(stderr, "ferry: cannot delete %s: %s (%s)\n", key, strerror(-rc),
			objstore_last_error());
		return 0;
	}
	w->deleted++;
	return 0;
}

int cmd_gc(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "delete", no_argument, NULL, 'd' },
		{ "grace", required_argument, NULL, 'g' },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	static const char usage[] = "usage: ferry gc [--delete] [--grace SEC] VOLUME";
	char *db = NULL, *dir = NULL, err[512] = "", *end;
	struct meta_hold *h = NULL;
	struct meta_kept k = { 0 };
	struct objstore *s = NULL;
	struct meta *m = NULL;
	struct gc_walk w = { 0 };
	long long grace = GC_GRACE_DEFAULT_S;
	int64_t cutoff;
	bool del = false;
	int opt, rc, code = 1;

	optind = 1;
	while ((opt = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (opt) {
		case 'd': del = true; break;
		case 'g':
			errno = 0;
			grace = strtoll(optarg, &end, 10);
			if (errno || end == optarg || *end || grace < 0) {
				ctl_err("gc: --grace wants seconds, not '%s'", optarg);
				return 2;
			}
			break;
		case 'h': printf("%s\n", usage); return 0;
		default: return 2;
		}
	}
	if (optind != argc - 1) {
		ctl_err("%s", usage);
		return 2;
	}
	if (meta_url_parse(argv[optind], &db, &dir, err, sizeof(err)) < 0) {
		ctl_err("volume %s: %s", argv[optind], err);
		goto out;
	}
	/* Held as a dump holds it: no daemon uploads a slice it has not
	 * committed yet while the store is walked. */
	rc = meta_hold_open(db, &m, &h, err, sizeof(err));
	if (rc < 0) {
		ctl_err("gc: %s", err);
		goto out;
	}
	if (volume_store_open(m, &s, err, sizeof(err)) < 0) {
		ctl_err("the volume's store: %s", err);
		goto out;
	}
	cutoff = (int64_t)time(NULL) - grace;
	if (meta_slices_kept(m, cutoff, &k, err, sizeof(err)) < 0) {
		ctl_err("gc: %s", err);
		goto out;
	}
	w.s = s;
	w.k = &k;
	w.del = del;
	rc = objstore_list(s, "chunks/", gc_key, &w);
	if (rc < 0) {
		ctl_err("gc: cannot list the store: %s (%s)", strerror(-rc), objstore_last_error());
		goto out;
	}
	if (del && !w.first_err && (rc = meta_gc_forget_freed(m, cutoff)) < 0) {
		ctl_err("gc: cannot forget the collected slices: %s", strerror(-rc));
		goto out;
	}
	printf("%s %" PRIu64 " objects (%" PRIu64 " bytes) no file or checkpoint refers to; kept "
	       "%" PRIu64 " objects (%" PRIu64 " bytes) that one does; %" PRIu64 " of other "
	       "volumes sharing the store left alone\n",
	       del ? "deleted" : "would delete (dry run: give --delete)", del ? w.deleted : w.garbage,
	       w.garbage_bytes, w.live, w.live_bytes, w.foreign);
	code = w.first_err ? 1 : 0;
out:
	free(k.ids);
	objstore_close(s);
	if (m)
		meta_hold_close(m, h);
	free(db);
	free(dir);
	return code;
}
