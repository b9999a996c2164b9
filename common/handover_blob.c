#include "handover_blob.h"
#include "local_copy_list.h"
#include "errmsg.h"

#include <errno.h>
#include <linux/fuse.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "handle_table.h"
#include "reconcile_job.h"

#define fail errmsg_fail /* short, for the many calls below */

bool fuse_init_request_valid(const uint8_t *buf, size_t len)
{
	struct fuse_in_header h;

	/* The header, then at least init_in's major, minor, max_readahead
	 * and flags (protocol 7.6 on). */
	if (!buf || len < sizeof(h) + 16 || len > HANDOVER_INIT_MAX)
		return false;
	memcpy(&h, buf, sizeof(h));
	return h.opcode == FUSE_INIT && h.len == len;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return (x > y) - (x < y);
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Whether a sorted copy of v[0..n) has a value twice (*dup: which). */
static int has_dup_u64(uint64_t *v, size_t n, uint64_t *dup)
{
	qsort(v, n, sizeof(*v), cmp_u64);
	for (size_t k = 1; k < n; k++)
		if (v[k] == v[k - 1]) {
			*dup = v[k];
			return 1;
		}
	return 0;
}

/* Every check of a decoded message; tmp has room for n_handles values and
 * for n_staged + n_kept, names for as many. */
static int check(const Ferry__Handover__Handover *ho, uint64_t *tmp, const char **names,
		 char *err, size_t errlen)
{
	uint64_t dup;

	if (ho->version != HANDOVER_VERSION)
		return fail(-EPROTO, err, errlen, "hand-over version %u, this daemon knows %u",
			    ho->version, HANDOVER_VERSION);
	if (!fuse_init_request_valid(ho->init.data, ho->init.len))
		return fail(-EBADMSG, err, errlen, "the kernel's INIT (%zu bytes) is not a FUSE_INIT "
			    "request", ho->init.len);
	for (size_t k = 0; k < ho->n_handles; k++) {
		const Ferry__Handover__Handle *h = ho->handles[k];

		if (h->type < HANDLE_FILE || h->type > HANDLE_SPECIAL)
			return fail(-EBADMSG, err, errlen, "handle %zu: unknown type %u", k, h->type);
		if (h->fh == 0 || h->ino == 0)
			return fail(-EBADMSG, err, errlen, "handle %zu: fh %llu of inode %llu", k,
				    (unsigned long long)h->fh, (unsigned long long)h->ino);
		if (h->passthrough && h->type != HANDLE_FILE)
			return fail(-EBADMSG, err, errlen, "handle %zu: passthrough, but not a "
				    "file", k);
		tmp[k] = h->fh;
	}
	if (has_dup_u64(tmp, ho->n_handles, &dup))
		return fail(-EBADMSG, err, errlen, "fh %llu given twice", (unsigned long long)dup);
	for (size_t k = 0; k < ho->n_staged; k++) {
		const Ferry__Handover__Staged *s = ho->staged[k];

		if (s->ino == 0 || s->backing_id <= 0)
			return fail(-EBADMSG, err, errlen, "staging file %zu: inode %llu, backing id "
				    "%d", k, (unsigned long long)s->ino, (int)s->backing_id);
		if (reconcile_name_check(s->name) < 0)
			return fail(-EBADMSG, err, errlen, "staging file %zu: not a staging file's "
				    "name", k);
		if (s->has_prints && (s->prints.len % HANDOVER_PRINT_BYTES ||
				      s->prints.len / HANDOVER_PRINT_BYTES > HANDOVER_PRINTS_MAX))
			return fail(-EBADMSG, err, errlen, "staging file %zu: fingerprints of %zu "
				    "bytes", k, s->prints.len);
		if (s->has_mtime_nsec && s->mtime_nsec >= 1000000000u)
			return fail(-EBADMSG, err, errlen, "staging file %zu: mtime nanoseconds %u",
				    k, s->mtime_nsec);
		tmp[k] = s->ino;
		names[k] = s->name;
	}
	/* One write state per inode, one inode per staging file. */
	if (has_dup_u64(tmp, ho->n_staged, &dup))
		return fail(-EBADMSG, err, errlen, "two staging files for inode %llu",
			    (unsigned long long)dup);
	qsort(names, ho->n_staged, sizeof(*names), cmp_str);
	for (size_t k = 1; k < ho->n_staged; k++)
		if (strcmp(names[k], names[k - 1]) == 0)
			return fail(-EBADMSG, err, errlen, "staging file %s given twice", names[k]);
	/* A local copy: its own name, of an inode with no other copy and no
	 * write state (a staging file). tmp[0..n_staged) holds the staged
	 * inodes, sorted above; the copies' go after them. */
	if (ho->n_kept > HANDOVER_KEPT_MAX)
		return fail(-EBADMSG, err, errlen, "%zu local copies", ho->n_kept);
	for (size_t k = 0; k < ho->n_kept; k++) {
		const Ferry__Handover__Kept *c = ho->kept[k];

		if (c->ino == 0 || c->size == 0 || !handover_kept_name_valid(c->name))
			return fail(-EBADMSG, err, errlen, "local copy %zu: inode %llu, %llu bytes, "
				    "not a local copy's name", k, (unsigned long long)c->ino,
				    (unsigned long long)c->size);
		if (c->has_ctime_nsec && c->ctime_nsec >= 1000000000u)
			return fail(-EBADMSG, err, errlen, "local copy %zu: ctime nanoseconds %u", k,
				    c->ctime_nsec);
		if (bsearch(&c->ino, tmp, ho->n_staged, sizeof(*tmp), cmp_u64))
			return fail(-EBADMSG, err, errlen, "inode %llu has a staging file and "
				    "a local copy", (unsigned long long)c->ino);
		tmp[ho->n_staged + k] = c->ino;
		names[k] = c->name;
	}
	if (has_dup_u64(tmp + ho->n_staged, ho->n_kept, &dup))
		return fail(-EBADMSG, err, errlen, "two local copies of inode %llu",
			    (unsigned long long)dup);
	qsort(names, ho->n_kept, sizeof(*names), cmp_str);
	for (size_t k = 1; k < ho->n_kept; k++)
		if (strcmp(names[k], names[k - 1]) == 0)
			return fail(-EBADMSG, err, errlen, "local copy %s given twice", names[k]);
	return 0;
}

bool handover_kept_name_valid(const char *name)
{
	return name && local_copy_name_ok(name);
}

int handover_blob_decode(const uint8_t *buf, size_t len, Ferry__Handover__Handover **out,
			 char *err, size_t errlen)
{
	Ferry__Handover__Handover *ho = NULL;
	uint64_t *tmp = NULL;
	const char **names = NULL; /* borrowed from ho */
	size_t n;
	int rc;

	*out = NULL;
	if (len == 0 || len > HANDOVER_MAX)
		return fail(-EBADMSG, err, errlen, "hand-over of %zu bytes", len);
	ho = ferry__handover__handover__unpack(NULL, len, buf);
	if (!ho)
		return fail(-EBADMSG, err, errlen, "undecodable hand-over (%zu bytes)", len);
	/* Bounded before anything is sized by it. */
	if (ho->n_kept > HANDOVER_KEPT_MAX) {
		rc = fail(-EBADMSG, err, errlen, "%zu local copies", ho->n_kept);
		goto out;
	}
	n = ho->n_handles > ho->n_staged + ho->n_kept ? ho->n_handles : ho->n_staged + ho->n_kept;
	tmp = calloc(n + 1, sizeof(*tmp));
	names = calloc(n + 1, sizeof(*names));
	if (!tmp || !names) {
		rc = fail(-ENOMEM, err, errlen, "out of memory checking the hand-over");
		goto out;
	}
	rc = check(ho, tmp, names, err, errlen);
	if (rc == 0) {
		*out = ho;
		ho = NULL;
	}
out:
	free(tmp);
	free(names);
	handover_blob_free(ho);
	return rc;
}

void handover_blob_free(Ferry__Handover__Handover *ho)
{
	if (ho)
		ferry__handover__handover__free_unpacked(ho, NULL);
}
