/* checkpoint_store: see checkpoint_store.h for the layout. */
#include "checkpoint_store.h"

#include <errno.h>
#include <inttypes.h>
#include <json-c/json.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "objstore.h"

#define MANIFEST_MAX (64u << 10)
#define RANGE_TRIES 16

static void say(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void say(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
}

static void part_key(char *buf, size_t len, const char *name, uint64_t i)
{
	snprintf(buf, len, "checkpoints/%s/part-%06" PRIu64, name, i);
}

static void manifest_key(char *buf, size_t len, const char *name)
{
	snprintf(buf, len, "checkpoints/%s/manifest", name);
}

static int parts_delete(struct objstore *s, const char *name, uint64_t n)
{
	char key[160];
	int rc = 0;

	for (uint64_t i = 0; i < n; i++) {
		part_key(key, sizeof(key), name, i);
		int r = objstore_delete(s, key);
		if (r < 0 && rc == 0)
			rc = r;
	}
	return rc;
}

int ckpt_store_put(struct objstore *s, int fd, uint64_t len, struct ckpt_manifest *mf,
		   char *err, size_t errlen)
{
	json_object *o = NULL;
	const char *text;
	char key[160];
	uint8_t *buf = malloc(CKPT_PART_BYTES); /* ours */
	uint64_t off = 0, i = 0;
	int rc = 0;

	if (!buf)
		return -ENOMEM;
	for (; off < len || i == 0; i++) {
		size_t want = len - off < CKPT_PART_BYTES ? (size_t)(len - off) : CKPT_PART_BYTES;
		size_t got = 0;

		while (got < want) {
			ssize_t n = pread(fd, buf + got, want - got, (off_t)(off + got));
			if (n <= 0) {
				rc = n < 0 ? -errno : -EIO;
				say(err, errlen, "cannot read the dump: %s", strerror(-rc));
				goto fail;
			}
			got += (size_t)n;
		}
		part_key(key, sizeof(key), mf->cp.name, i);
		rc = objstore_put(s, key, buf, want);
		if (rc < 0) {
			say(err, errlen, "cannot store %s: %s (%s)", key, strerror(-rc),
			    objstore_last_error());
			i++; /* may be there in part */
			goto fail;
		}
		off += want;
	}
	mf->parts = i;
	mf->dump_bytes = len;
	o = json_object_new_object();
	if (!o) {
		rc = -ENOMEM;
		goto fail;
	}
	json_object_object_add(o, "ferry_checkpoint", json_object_new_int(1));
	json_object_object_add(o, "name", json_object_new_string(mf->cp.name));
	json_object_object_add(o, "volume", json_object_new_string(mf->volume));
	json_object_object_add(o, "taken_ms", json_object_new_int64(mf->cp.taken_ms));
	json_object_object_add(o, "slices", json_object_new_uint64(mf->cp.slices));
	json_object_object_add(o, "slice_bytes", json_object_new_uint64(mf->cp.bytes));
	json_object_object_add(o, "records", json_object_new_uint64(mf->records));
	json_object_object_add(o, "dump_bytes", json_object_new_uint64(mf->dump_bytes));
	json_object_object_add(o, "parts", json_object_new_uint64(mf->parts));
	json_object_object_add(o, "pause_ms", json_object_new_double(mf->pause_ms));
	text = json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN);
	manifest_key(key, sizeof(key), mf->cp.name);
	rc = objstore_put(s, key, text, strlen(text));
	json_object_put(o);
	if (rc < 0) {
		say(err, errlen, "cannot store %s: %s (%s)", key, strerror(-rc), objstore_last_error());
		goto fail;
	}
	free(buf);
	return 0;
fail:
	parts_delete(s, mf->cp.name, i);
	free(buf);
	return rc;
}

static bool get_u64(json_object *o, const char *k, uint64_t *v)
{
	json_object *x;

	if (!json_object_object_get_ex(o, k, &x) || !json_object_is_type(x, json_type_int))
		return false;
	*v = (uint64_t)json_object_get_int64(x);
	return json_object_get_int64(x) >= 0;
}

int ckpt_manifest_parse(const char *text, const char *name, struct ckpt_manifest *mf, char *err,
			size_t errlen)
{
	json_object *o = json_tokener_parse(text), *x;
	uint64_t taken = 0;
	int rc = -EIO;

	memset(mf, 0, sizeof(*mf));
	if (!o || !json_object_is_type(o, json_type_object) ||
	    !json_object_object_get_ex(o, "name", &x) || !json_object_is_type(x, json_type_string) ||
	    strcmp(json_object_get_string(x), name) || !get_u64(o, "taken_ms", &taken) ||
	    taken > INT64_MAX || !get_u64(o, "slices", &mf->cp.slices) ||
	    !get_u64(o, "slice_bytes", &mf->cp.bytes) || !get_u64(o, "records", &mf->records) ||
	    !get_u64(o, "dump_bytes", &mf->dump_bytes) || !get_u64(o, "parts", &mf->parts) ||
	    mf->dump_bytes > UINT64_MAX - CKPT_PART_BYTES ||
	    mf->parts != (mf->dump_bytes + CKPT_PART_BYTES - 1) / CKPT_PART_BYTES +
			     (mf->dump_bytes == 0) ||
	    !json_object_object_get_ex(o, "volume", &x) || !json_object_is_type(x, json_type_string)) {
		say(err, errlen, "checkpoint %.80s: its manifest is not one this ferry knows", name);
		goto out;
	}
	snprintf(mf->volume, sizeof(mf->volume), "%s", json_object_get_string(x));
	snprintf(mf->cp.name, sizeof(mf->cp.name), "%s", name);
	mf->cp.taken_ms = (int64_t)taken;
	if (json_object_object_get_ex(o, "pause_ms", &x))
		mf->pause_ms = json_object_get_double(x);
	rc = 0;
out:
	json_object_put(o);
	return rc;
}

int ckpt_store_manifest(struct objstore *s, const char *name, struct ckpt_manifest *mf,
			char *err, size_t errlen)
{
	char key[160], *buf = malloc(MANIFEST_MAX + 1); /* ours */
	ssize_t n;
	int rc;

	if (!buf)
		return -ENOMEM;
	memset(mf, 0, sizeof(*mf));
	if (!meta_checkpoint_name_ok(name)) {
		say(err, errlen, "bad checkpoint name '%.80s'", name);
		rc = -EINVAL;
		goto out;
	}
	manifest_key(key, sizeof(key), name);
	n = objstore_get(s, key, 0, buf, MANIFEST_MAX);
	if (n < 0) {
		rc = (int)n;
		say(err, errlen, rc == -ENOENT ? "no checkpoint named %s in the store" :
						 "cannot read %s: %s", rc == -ENOENT ? name : key,
		    strerror(-rc));
		goto out;
	}
	buf[n] = '\0';
	rc = ckpt_manifest_parse(buf, name, mf, err, errlen);
out:
	free(buf);
	return rc;
}

struct part_sink {
	FILE *out;
	uint64_t written;
};

static int part_write(void *arg, uint64_t pos, const void *data, size_t len)
{
	struct part_sink *p = arg;

	if (pos != p->written) /* a try again: cannot take back what went out */
		return -EIO;
	if (fwrite(data, 1, len, p->out) != len)
		return errno ? -errno : -EIO;
	p->written += len;
	return 0;
}

int ckpt_store_get(struct objstore *s, const char *name, FILE *out, struct ckpt_manifest *mf,
		   char *err, size_t errlen)
{
	char key[160];
	uint64_t total = 0;
	int rc = ckpt_store_manifest(s, name, mf, err, errlen);

	if (rc < 0)
		return rc;
	for (uint64_t i = 0; i < mf->parts; i++) {
		uint64_t want = mf->dump_bytes - total < CKPT_PART_BYTES ? mf->dump_bytes - total :
									   CKPT_PART_BYTES;
		struct part_sink ps = { .out = out };
		ssize_t n;

		part_key(key, sizeof(key), name, i);
		n = objstore_get_to(s, key, 0, CKPT_PART_BYTES, part_write, &ps);
		if (n < 0 || ps.written != want) {
			rc = n < 0 ? (int)n : -EIO;
			say(err, errlen, "checkpoint %s: part %s: %s", name, key,
			    n < 0 ? strerror(-rc) : "not the size its manifest says");
			return rc;
		}
		total += want;
	}
	if (fflush(out) != 0) {
		rc = errno ? -errno : -EIO;
		say(err, errlen, "cannot write the dump: %s", strerror(-rc));
		return rc;
	}
	return 0;
}

struct key_list {
	char **keys;
	size_t n, cap;
};

static int key_collect(const char *key, uint64_t size, void *arg)
{
	struct key_list *l = arg;

	(void)size;
	if (l->n == l->cap) {
		size_t ncap = l->cap ? l->cap * 2 : 16;
		char **nk = realloc(l->keys, ncap * sizeof(*nk));
		if (!nk)
			return -ENOMEM;
		l->keys = nk;
		l->cap = ncap;
	}
	if (!(l->keys[l->n] = strdup(key)))
		return -ENOMEM;
	l->n++;
	return 0;
}

static void key_list_free(struct key_list *l)
{
	for (size_t i = 0; i < l->n; i++)
		free(l->keys[i]);
	free(l->keys);
}

int ckpt_store_delete(struct objstore *s, const char *name, char *err, size_t errlen)
{
	struct key_list l = { 0 };
	char key[160];
	int rc;

	if (!meta_checkpoint_name_ok(name))
		return -EINVAL;
	manifest_key(key, sizeof(key), name);
	rc = objstore_delete(s, key);
	snprintf(key, sizeof(key), "checkpoints/%s/", name);
	if (rc == 0)
		rc = objstore_list(s, key, key_collect, &l);
	for (size_t i = 0; rc == 0 && i < l.n; i++)
		rc = objstore_delete(s, l.keys[i]);
	if (rc < 0)
		say(err, errlen, "cannot delete checkpoint %s from the store: %s (%s)", name,
		    strerror(-rc), objstore_last_error());
	key_list_free(&l);
	return rc;
}

int ckpt_store_restored(struct objstore *s, const char *name, unsigned *n, char *first,
			size_t firstlen)
{
	struct key_list l = { 0 };
	char prefix[160];
	int rc;

	snprintf(prefix, sizeof(prefix), "checkpoints/%s/restored/", name);
	rc = objstore_list(s, prefix, key_collect, &l);
	*n = rc == 0 ? (unsigned)l.n : 0;
	if (firstlen)
		snprintf(first, firstlen, "%s", rc == 0 && l.n ? l.keys[0] + strlen(prefix) : "");
	key_list_free(&l);
	return rc;
}

int ckpt_store_mark_restored(struct objstore *s, const char *name, const char *uuid)
{
	char key[200];

	snprintf(key, sizeof(key), "checkpoints/%s/restored/%s", name, uuid);
	return objstore_put(s, key, uuid, strlen(uuid));
}

int ckpt_store_range_claim(struct objstore *s, uint64_t *base, char *err, size_t errlen)
{
	/* 2^63 / 2^40 ranges; 0 is the formatted volumes'. */
	const uint64_t nranges = 1ull << (63 - META_SLICE_RANGE_BITS);
	char key[64];
	int rc = -EEXIST;

	for (int tries = 0; tries < RANGE_TRIES; tries++) {
		uint64_t r = 0, size;

		if (getrandom(&r, sizeof(r), 0) != sizeof(r))
			return -errno;
		r = 1 + r % (nranges - 1);
		snprintf(key, sizeof(key), "ranges/%" PRIu64, r);
		rc = objstore_head(s, key, &size);
		if (rc == 0)
			continue; /* taken */
		if (rc != -ENOENT)
			break;
		rc = objstore_put(s, key, key, strlen(key));
		if (rc == 0) {
			*base = r << META_SLICE_RANGE_BITS;
			return 0;
		}
		break;
	}
	say(err, errlen, "cannot claim a slice id range in the store: %s (%s)", strerror(-rc),
	    objstore_last_error());
	return rc;
}
