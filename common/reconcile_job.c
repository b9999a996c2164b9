/*
 * reconcile_job: jobs, their journal records and the reconcile protocol's
 * messages (reconcile_job.h).
 */
#include "reconcile_job.h"

#include "boot.h"
#include "errmsg.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "reconcile.pb-c.h"
#include "rpc_frame.h"
#include "slice.h"

#define V RECONCILE_PROTO_VERSION

#define fail errmsg_fail /* short, for the many calls below */

static int ends_with(const char *s, size_t n, const char *suffix)
{
	size_t k = strlen(suffix);
	return n >= k && memcmp(s + n - k, suffix, k) == 0;
}

void reconcile_job_clear(struct reconcile_job *j)
{
	if (!j)
		return;
	free(j->dirty);
	memset(j, 0, sizeof(*j));
}

int reconcile_name_check(const char *name)
{
	size_t n;

	if (!name)
		return -EINVAL;
	n = strnlen(name, RECONCILE_NAME_MAX + 1);
	if (n == 0 || n > RECONCILE_NAME_MAX || name[0] == '.')
		return -EINVAL;
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)name[i];
		if (c <= 0x20 || c >= 0x7f || c == '/' || c == '\\')
			return -EINVAL;
	}
	if (ends_with(name, n, RECONCILE_JOB_SUFFIX) || ends_with(name, n, RECONCILE_ORPHAN_SUFFIX) ||
	    ends_with(name, n, ".tmp"))
		return -EINVAL;
	return 0;
}

const char *staging_copy_run(const char *name, char *run)
{
	char buf[RECONCILE_NAME_MAX + 16];
	size_t n = strnlen(name, sizeof(buf));
	const char *tag, *p = name;
	char *end;
	long pid;

	if (n == sizeof(buf))
		return NULL;
	memcpy(buf, name, n + 1);
	if (ends_with(buf, n, RECONCILE_ORPHAN_SUFFIX))
		buf[n - strlen(RECONCILE_ORPHAN_SUFFIX)] = '\0';
	tag = boot_tag_of_name(buf, STAGING_COPY_SUFFIX);
	if (!tag)
		return NULL;
	/* The pid is the third field. A tagged name without one is still a
	 * copy (of no known run: never a flushed one). */
	run[0] = '\0';
	for (int dashes = 0; dashes < 2; p++) {
		if (!*p)
			return name + (tag - buf);
		dashes += *p == '-';
	}
	errno = 0;
	pid = isdigit((unsigned char)*p) ? strtol(p, &end, 10) : 0;
	if (!errno && pid > 0 && *end == '-')
		boot_run(run, tag, pid);
	return name + (tag - buf);
}

int reconcile_job_check(const struct reconcile_job *j, char *err, size_t errlen)
{
	if (j->seq == 0 || j->seq > INT64_MAX)
		return fail(-EINVAL, err, errlen, "seq %llu out of range", (unsigned long long)j->seq);
	if (j->ino == 0 || j->ino > INT64_MAX)
		return fail(-EINVAL, err, errlen, "inode %llu out of range", (unsigned long long)j->ino);
	if (j->length > RECONCILE_LENGTH_MAX)
		return fail(-EINVAL, err, errlen, "length %llu too large", (unsigned long long)j->length);
	if (j->mtime.tv_nsec < 0 || j->mtime.tv_nsec >= 1000000000L)
		return fail(-EINVAL, err, errlen, "mtime nanoseconds %ld out of range",
			    (long)j->mtime.tv_nsec);
	if (reconcile_name_check(j->name) < 0)
		return fail(-EINVAL, err, errlen, "bad staging name \"%.64s\"", j->name);
	if (j->ndirty > RECONCILE_RANGES_MAX)
		return fail(-EINVAL, err, errlen, "%zu dirty ranges: at most %d", j->ndirty,
			    RECONCILE_RANGES_MAX);
	if (j->ndirty && !j->dirty)
		return fail(-EINVAL, err, errlen, "no dirty array");
	if (j->size_only && j->ndirty)
		return fail(-EINVAL, err, errlen, "size_only with dirty ranges");
	for (size_t i = 0; i < j->ndirty; i++) {
		const struct reconcile_range *r = &j->dirty[i];
		if (r->start >= r->end || r->end > j->length)
			return fail(-EINVAL, err, errlen,
				    "dirty range %zu [%llu, %llu) is empty or past length %llu", i,
				    (unsigned long long)r->start, (unsigned long long)r->end,
				    (unsigned long long)j->length);
		if (i && r->start < j->dirty[i - 1].end)
			return fail(-EINVAL, err, errlen, "dirty range %zu overlaps or is out of order", i);
	}
	return 0;
}

/* ---- Handoff <-> struct reconcile_job ---- */

/* Fills h (and ranges, which the caller provides, ndirty long) from j. */
static void handoff_fill(Ferry__Reconcile__Handoff *h, Ferry__Reconcile__Range *ranges,
			 Ferry__Reconcile__Range **rp, const struct reconcile_job *j)
{
	ferry__reconcile__handoff__init(h);
	h->version = V;
	h->seq = j->seq;
	h->ino = j->ino;
	h->length = j->length;
	h->mtime_sec = j->mtime.tv_sec;
	h->mtime_nsec = (uint32_t)j->mtime.tv_nsec;
	h->staging_name = (char *)j->name;
	h->has_size_only = j->size_only != 0;
	h->size_only = j->size_only != 0;
	h->has_meta_seq = j->meta_seq != 0;
	h->meta_seq = j->meta_seq;
	for (size_t i = 0; i < j->ndirty; i++) {
		ferry__reconcile__range__init(&ranges[i]);
		ranges[i].start = j->dirty[i].start;
		ranges[i].end = j->dirty[i].end;
		rp[i] = &ranges[i];
	}
	h->n_dirty = j->ndirty;
	h->dirty = j->ndirty ? rp : NULL;
}

/* Packs a message of any type into a new buffer. */
/*
 * protobuf-c's unpack answers NULL both for bytes that do not decode and
 * for an allocation that failed: this allocator tells the two apart, so a
 * good message met by a moment's memory shortage is -ENOMEM (try again
 * later), not -EBADMSG (drop the peer).
 */
struct alloc_watch {
	ProtobufCAllocator a;
	int failed;
};

static void *watch_alloc(void *data, size_t n)
{
	void *p = malloc(n);

	if (!p)
		((struct alloc_watch *)data)->failed = 1;
	return p;
}

static void watch_free(void *data, void *p)
{
	(void)data;
	free(p);
}

static void alloc_watch_init(struct alloc_watch *w)
{
	w->a.alloc = watch_alloc;
	w->a.free = watch_free;
	w->a.allocator_data = w;
	w->failed = 0;
}

static int pack(const ProtobufCMessage *m, uint8_t **buf, size_t *len)
{
	size_t n = protobuf_c_message_get_packed_size(m);

	*buf = malloc(n ? n : 1);
	if (!*buf)
		return -ENOMEM;
	*len = protobuf_c_message_pack(m, *buf);
	return 0;
}

/* Runs fn with h filled from j (arrays on the heap: up to 4096 ranges). */
static int with_handoff(const struct reconcile_job *j,
			int (*fn)(Ferry__Reconcile__Handoff *h, void *arg), void *arg)
{
	Ferry__Reconcile__Handoff h;
	Ferry__Reconcile__Range *ranges = NULL;
	Ferry__Reconcile__Range **rp = NULL;
	int rc;

	rc = reconcile_job_check(j, NULL, 0);
	if (rc < 0)
		return rc;
	if (j->ndirty) {
		ranges = calloc(j->ndirty, sizeof(*ranges));
		rp = calloc(j->ndirty, sizeof(*rp));
		if (!ranges || !rp) {
			rc = -ENOMEM;
			goto out;
		}
	}
	handoff_fill(&h, ranges, rp, j);
	rc = fn(&h, arg);
out:
	free(ranges);
	free(rp);
	return rc;
}

struct packed {
	uint8_t **buf;
	size_t *len;
};

static int pack_handoff(Ferry__Reconcile__Handoff *h, void *arg)
{
	struct packed *p = arg;
	return pack(&h->base, p->buf, p->len);
}

int reconcile_job_encode(const struct reconcile_job *j, uint8_t **buf, size_t *len)
{
	struct packed p = { buf, len };
	return with_handoff(j, pack_handoff, &p);
}

/* The record kept on the staging file itself names no file: the file is
 * the one it is on. Then it is about 40 bytes, and ext4 keeps it in the
 * inode (a 256-byte inode has room for some 60 bytes of value) instead of
 * allocating, journaling and later freeing a block for it per file. */
static int pack_unnamed(Ferry__Reconcile__Handoff *h, void *arg)
{
	h->staging_name = (char *)"";
	return pack_handoff(h, arg);
}

/* Takes a decoded Handoff into out and checks it. implied: the staging
 * name of a record that names none (one kept on the file itself), or NULL. */
static int handoff_take(const Ferry__Reconcile__Handoff *h, const char *implied,
			struct reconcile_job *out, char *err, size_t errlen)
{
	int rc;

	memset(out, 0, sizeof(*out));
	if (h->version != V)
		return fail(-EPROTONOSUPPORT, err, errlen, "handoff version %u, want %u", h->version, V);
	if (h->n_dirty > RECONCILE_RANGES_MAX)
		return fail(-EINVAL, err, errlen, "%zu dirty ranges: at most %d", h->n_dirty,
			    RECONCILE_RANGES_MAX);
	if (strlen(h->staging_name) > RECONCILE_NAME_MAX)
		return fail(-EINVAL, err, errlen, "staging name longer than %d bytes",
			    RECONCILE_NAME_MAX);
	if (h->mtime_nsec >= 1000000000u)
		return fail(-EINVAL, err, errlen, "mtime nanoseconds %u out of range", h->mtime_nsec);
	out->seq = h->seq;
	out->ino = h->ino;
	out->length = h->length;
	out->mtime.tv_sec = (time_t)h->mtime_sec;
	out->mtime.tv_nsec = (long)h->mtime_nsec;
	out->size_only = h->has_size_only && h->size_only;
	out->meta_seq = h->has_meta_seq ? h->meta_seq : 0;
	if (!h->staging_name[0] && implied && strlen(implied) <= RECONCILE_NAME_MAX)
		strcpy(out->name, implied);
	else
		strcpy(out->name, h->staging_name);
	if (h->n_dirty) {
		out->dirty = malloc(h->n_dirty * sizeof(*out->dirty));
		if (!out->dirty)
			return fail(-ENOMEM, err, errlen, "out of memory");
		for (size_t i = 0; i < h->n_dirty; i++) {
			out->dirty[i].start = h->dirty[i]->start;
			out->dirty[i].end = h->dirty[i]->end;
		}
		out->ndirty = h->n_dirty;
	}
	rc = reconcile_job_check(out, err, errlen);
	if (rc < 0)
		reconcile_job_clear(out);
	return rc;
}

static int job_decode(const uint8_t *buf, size_t len, const char *implied,
		      struct reconcile_job *out, char *err, size_t errlen)
{
	Ferry__Reconcile__Handoff *h;
	struct alloc_watch w;
	int rc;

	memset(out, 0, sizeof(*out));
	alloc_watch_init(&w);
	h = ferry__reconcile__handoff__unpack(&w.a, len, buf);
	if (!h && w.failed)
		return fail(-ENOMEM, err, errlen, "out of memory decoding a handoff");
	if (!h)
		return fail(-EBADMSG, err, errlen, "undecodable handoff (%zu bytes)", len);
	rc = handoff_take(h, implied, out, err, errlen);
	ferry__reconcile__handoff__free_unpacked(h, &w.a);
	return rc;
}

int reconcile_job_decode(const uint8_t *buf, size_t len, struct reconcile_job *out, char *err,
			 size_t errlen)
{
	return job_decode(buf, len, NULL, out, err, errlen);
}

/* ---- the journal ---- */

static int write_all(int fd, const uint8_t *p, size_t n)
{
	while (n) {
		ssize_t w = write(fd, p, n);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		p += w;
		n -= (size_t)w;
	}
	return 0;
}

int reconcile_job_write(int dirfd, const struct reconcile_job *j, unsigned flags)
{
	char tmp[RECONCILE_NAME_MAX + 16], dst[RECONCILE_NAME_MAX + 16];
	uint8_t *buf = NULL;
	size_t len = 0;
	int fd = -1, rc;

	rc = reconcile_job_encode(j, &buf, &len);
	if (rc < 0)
		goto out;
	snprintf(tmp, sizeof(tmp), ".%s%s.tmp", j->name, RECONCILE_JOB_SUFFIX);
	snprintf(dst, sizeof(dst), "%s%s", j->name, RECONCILE_JOB_SUFFIX);
	fd = openat(dirfd, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (fd < 0) {
		rc = -errno;
		goto out;
	}
	rc = write_all(fd, buf, len);
	if (rc == 0 && (flags & RECONCILE_JOB_SYNC) && fdatasync(fd) < 0)
		rc = -errno;
	if (close(fd) < 0 && rc == 0)
		rc = -errno;
	fd = -1;
	if (rc == 0 && renameat(dirfd, tmp, dirfd, dst) < 0)
		rc = -errno;
	if (rc < 0)
		unlinkat(dirfd, tmp, 0);
	if (rc == 0 && (flags & RECONCILE_JOB_SYNC) && fsync(dirfd) < 0)
		rc = -errno;
out:
	free(buf);
	return rc;
}

int reconcile_job_read(int dirfd, const char *job_file, struct reconcile_job *out, char *err,
		       size_t errlen)
{
	uint8_t buf[RECONCILE_FRAME_MAX];
	size_t n = 0, fl;
	struct stat st;
	int fd = -1, rc;
	char want[RECONCILE_NAME_MAX + 32];

	memset(out, 0, sizeof(*out));
	fl = job_file ? strlen(job_file) : 0;
	if (!fl || strchr(job_file, '/') || !ends_with(job_file, fl, RECONCILE_JOB_SUFFIX))
		return fail(-EINVAL, err, errlen, "not a job file name");
	fd = openat(dirfd, job_file, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
	if (fd < 0)
		return fail(-errno, err, errlen, "%s: %s", job_file, strerror(errno));
	if (fstat(fd, &st) < 0) {
		rc = fail(-errno, err, errlen, "%s: %s", job_file, strerror(errno));
		goto out;
	}
	if (!S_ISREG(st.st_mode)) {
		rc = fail(-EINVAL, err, errlen, "%s is not a regular file", job_file);
		goto out;
	}
	if (st.st_size > (off_t)sizeof(buf)) {
		rc = fail(-EFBIG, err, errlen, "%s is too large", job_file);
		goto out;
	}
	while (n < sizeof(buf)) {
		ssize_t r = read(fd, buf + n, sizeof(buf) - n);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			rc = fail(-errno, err, errlen, "%s: %s", job_file, strerror(errno));
			goto out;
		}
		if (r == 0)
			break;
		n += (size_t)r;
	}
	rc = reconcile_job_decode(buf, n, out, err, errlen);
	if (rc < 0)
		goto out;
	snprintf(want, sizeof(want), "%s%s", out->name, RECONCILE_JOB_SUFFIX);
	if (strcmp(want, job_file) != 0) {
		snprintf(want, sizeof(want), "%s%s%s", out->name, RECONCILE_ORPHAN_SUFFIX,
			 RECONCILE_JOB_SUFFIX);
		if (strcmp(want, job_file) != 0) {
			rc = fail(-EINVAL, err, errlen, "%s records staging file %s", job_file,
				  out->name);
			reconcile_job_clear(out);
		}
	}
out:
	close(fd);
	return rc;
}

int reconcile_job_remove(int dirfd, const char *name)
{
	char path[RECONCILE_NAME_MAX + 32];

	if (!name || strchr(name, '/') || strlen(name) > RECONCILE_NAME_MAX + 16)
		return -EINVAL;
	snprintf(path, sizeof(path), "%s%s", name, RECONCILE_JOB_SUFFIX);
	if (unlinkat(dirfd, path, 0) < 0 && errno != ENOENT)
		return -errno;
	return 0;
}

int reconcile_job_attach(int dirfd, int fd, const struct reconcile_job *j, bool *in_xattr)
{
	uint8_t *buf = NULL;
	size_t len = 0;
	int rc;

	*in_xattr = false;
	rc = with_handoff(j, pack_unnamed, &(struct packed){ &buf, &len });
	if (rc < 0)
		return rc;
	if (fsetxattr(fd, RECONCILE_JOB_XATTR, buf, len, 0) == 0) {
		*in_xattr = true;
		rc = 0;
	} else if (errno == EOPNOTSUPP || errno == E2BIG || errno == ENOSPC || errno == ERANGE ||
		   errno == EPERM || errno == EACCES) {
		/* No user xattrs here, or none this large (ext4 keeps a value
		 * within one block): the record goes in a file of its own. */
		rc = reconcile_job_write(dirfd, j, 0);
	} else {
		rc = -errno;
	}
	free(buf);
	return rc;
}

int reconcile_job_detach(int dirfd, int fd, const char *name, bool in_xattr)
{
	if (!in_xattr)
		return reconcile_job_remove(dirfd, name);
	if (fremovexattr(fd, RECONCILE_JOB_XATTR) < 0 && errno != ENODATA)
		return -errno;
	return 0;
}

int reconcile_job_drop(int dirfd, const char *name)
{
	int fd = openat(dirfd, name, O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
	int rc = 0;

	if (fd >= 0) {
		rc = reconcile_job_detach(dirfd, fd, name, true);
		if (rc == -ENOTSUP)
			rc = 0; /* no user xattrs here: no record there either */
		close(fd);
	}
	int rrc = reconcile_job_remove(dirfd, name);
	return rc < 0 ? rc : rrc;
}

int reconcile_job_attached(int fd)
{
	if (fgetxattr(fd, RECONCILE_JOB_XATTR, NULL, 0) >= 0)
		return 1;
	return errno == ENODATA || errno == EOPNOTSUPP ? 0 : -errno;
}

/* Whether /proc/self/fd/N/name reaches a file in directory fd N. */
static bool proc_fds(void)
{
	static _Atomic int known; /* 0: not asked yet, 1: yes, 2: no */
	int k = atomic_load(&known);

	if (k == 0) {
		k = access("/proc/self/fd", X_OK) == 0 ? 1 : 2;
		atomic_store(&known, k);
	}
	return k == 1;
}

int reconcile_job_load(int dirfd, int fd, const char *name, struct reconcile_job *out,
		       bool *in_xattr, char *err, size_t errlen)
{
	uint8_t buf[RECONCILE_FRAME_MAX];
	char jobfile[RECONCILE_NAME_MAX + 32];
	size_t nl = name ? strlen(name) : 0, ol = strlen(RECONCILE_ORPHAN_SUFFIX);
	int own = -1, rc;
	ssize_t n;

	memset(out, 0, sizeof(*out));
	*in_xattr = false;
	if (!nl || nl > RECONCILE_NAME_MAX + ol || strchr(name, '/'))
		return fail(-EINVAL, err, errlen, "not a staging file name");
	if (fd < 0 && proc_fds()) {
		/* By name, without an open: an open of a staging file still
		 * written would make ferry-mountd's check for a mapping that
		 * outlives the close (a write lease) fail. */
		char path[64 + RECONCILE_NAME_MAX + 16];

		snprintf(path, sizeof(path), "/proc/self/fd/%d/%s", dirfd, name);
		n = lgetxattr(path, RECONCILE_JOB_XATTR, buf, sizeof(buf));
		if (n < 0 && errno == ENOENT)
			errno = ENODATA; /* no file: then no record but a .job */
	} else {
		if (fd < 0) {
			own = openat(dirfd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
			if (own < 0 && errno != ENOENT)
				return fail(-errno, err, errlen, "%s: %s", name, strerror(errno));
			fd = own;
		}
		n = fd >= 0 ? fgetxattr(fd, RECONCILE_JOB_XATTR, buf, sizeof(buf)) : -1;
		if (n < 0 && fd < 0)
			errno = ENODATA;
	}
	if (n < 0 && errno != ENODATA && errno != EOPNOTSUPP) {
		rc = fail(errno == ERANGE ? -EFBIG : -errno, err, errlen, "%s: record: %s", name,
			  strerror(errno));
		goto out;
	}
	if (n < 0) {
		/* No xattr: a record of its own, if any. */
		snprintf(jobfile, sizeof(jobfile), "%s%s", name, RECONCILE_JOB_SUFFIX);
		rc = reconcile_job_read(dirfd, jobfile, out, err, errlen);
		goto out;
	}
	/* A record that names no file is about this one (an orphan keeps
	 * the record its file had before it was renamed). */
	{
		char implied[RECONCILE_NAME_MAX + 1];
		bool orphan = nl > ol && strcmp(name + nl - ol, RECONCILE_ORPHAN_SUFFIX) == 0;

		snprintf(implied, sizeof(implied), "%.*s", (int)(orphan ? nl - ol : nl), name);
		rc = job_decode(buf, (size_t)n, implied, out, err, errlen);
	}
	if (rc < 0)
		goto out;
	if (strcmp(out->name, name) != 0 &&
	    !(nl == strlen(out->name) + ol && strncmp(name, out->name, nl - ol) == 0 &&
	      strcmp(name + nl - ol, RECONCILE_ORPHAN_SUFFIX) == 0)) {
		rc = fail(-EINVAL, err, errlen, "the record on %s names staging file %s", name,
			  out->name);
		reconcile_job_clear(out);
		goto out;
	}
	*in_xattr = true;
out:
	if (own >= 0)
		close(own);
	return rc;
}

/* ---- requests ---- */

void reconcile_request_clear(struct reconcile_request *r)
{
	if (!r)
		return;
	reconcile_job_clear(&r->job);
	memset(r, 0, sizeof(*r));
}

int reconcile_request_decode(const uint8_t *buf, size_t len, size_t nfds,
			     struct reconcile_request *out, char *err, size_t errlen)
{
	Ferry__Reconcile__Request *q;
	struct alloc_watch w;
	int rc = 0;

	memset(out, 0, sizeof(*out));
	alloc_watch_init(&w);
	q = ferry__reconcile__request__unpack(&w.a, len, buf);
	if (!q && w.failed)
		return fail(-ENOMEM, err, errlen, "out of memory decoding a request");
	if (!q)
		return fail(-EBADMSG, err, errlen, "undecodable request (%zu bytes)", len);
	if (q->version != V) {
		rc = fail(-EPROTONOSUPPORT, err, errlen, "request version %u, want %u", q->version, V);
		goto out;
	}
	switch (q->body_case) {
	case FERRY__RECONCILE__REQUEST__BODY_HANDOFF:
		out->type = RECONCILE_REQ_HANDOFF;
		if (nfds != 1) {
			rc = fail(-EBADF, err, errlen, "a handoff needs exactly one fd, got %zu", nfds);
			goto out;
		}
		rc = handoff_take(q->handoff, NULL, &out->job, err, errlen);
		break;
	case FERRY__RECONCILE__REQUEST__BODY_DRAIN:
		out->type = RECONCILE_REQ_DRAIN;
		if (q->drain->version != V)
			rc = fail(-EPROTONOSUPPORT, err, errlen, "drain version %u", q->drain->version);
		out->upto_seq = q->drain->upto_seq;
		break;
	case FERRY__RECONCILE__REQUEST__BODY_STATS_QUERY:
		out->type = RECONCILE_REQ_STATS;
		if (q->stats_query->version != V)
			rc = fail(-EPROTONOSUPPORT, err, errlen, "stats query version %u",
				  q->stats_query->version);
		break;
	case FERRY__RECONCILE__REQUEST__BODY_DROP:
		out->type = RECONCILE_REQ_DROP;
		if (q->drop->version != V)
			rc = fail(-EPROTONOSUPPORT, err, errlen, "drop version %u", q->drop->version);
		else if (q->drop->ino == 0 || q->drop->upto_seq == 0)
			rc = fail(-EINVAL, err, errlen, "a drop names inode %" PRIu64 " up to seq %" PRIu64
				  " (neither may be 0)", q->drop->ino, q->drop->upto_seq);
		out->ino = q->drop->ino;
		out->upto_seq = q->drop->upto_seq;
		break;
	default:
		rc = fail(-EOPNOTSUPP, err, errlen, "unknown request type");
		goto out;
	}
	if (rc == 0 && out->type != RECONCILE_REQ_HANDOFF && nfds != 0)
		rc = fail(-EBADF, err, errlen, "%zu unexpected fds with a request", nfds);
out:
	ferry__reconcile__request__free_unpacked(q, &w.a);
	if (rc < 0)
		reconcile_request_clear(out);
	return rc;
}

/* ---- replies ---- */

/* Packs r into *heap (malloc'ed) or, if heap is NULL, into fixed[0..cap). */
static int reply_pack(const struct reconcile_reply *r, uint8_t **heap, uint8_t *fixed,
		      size_t cap, size_t *len)
{
	Ferry__Reconcile__Reply rep;
	Ferry__Reconcile__Committed c;
	Ferry__Reconcile__Drained d;
	Ferry__Reconcile__Stats s;
	Ferry__Reconcile__Error e;
	Ferry__Reconcile__Retrying t;
	Ferry__Reconcile__CacheSeed seed[RECONCILE_SEEDS_MAX], *seedp[RECONCILE_SEEDS_MAX];

	ferry__reconcile__reply__init(&rep);
	rep.version = V;
	switch (r->type) {
	case RECONCILE_REPLY_COMMITTED:
		ferry__reconcile__committed__init(&c);
		c.version = V;
		c.seq = r->seq;
		c.ino = r->ino;
		c.error = r->error;
		c.message = r->message[0] ? (char *)r->message : NULL;
		if (r->nseeds > RECONCILE_SEEDS_MAX || (r->nseeds && r->error))
			return -EINVAL;
		for (uint32_t k = 0; k < r->nseeds; k++) {
			ferry__reconcile__cache_seed__init(&seed[k]);
			seed[k].slice_id = r->seeds[k].slice_id;
			seed[k].index = r->seeds[k].index;
			seed[k].slice_size = r->seeds[k].slice_size;
			seedp[k] = &seed[k];
		}
		c.n_seeds = r->nseeds;
		c.seeds = r->nseeds ? seedp : NULL;
		rep.body_case = FERRY__RECONCILE__REPLY__BODY_COMMITTED;
		rep.committed = &c;
		break;
	case RECONCILE_REPLY_DRAINED:
		ferry__reconcile__drained__init(&d);
		d.version = V;
		d.upto_seq = r->upto_seq;
		d.failed = r->failed;
		rep.body_case = FERRY__RECONCILE__REPLY__BODY_DRAINED;
		rep.drained = &d;
		break;
	case RECONCILE_REPLY_STATS:
		ferry__reconcile__stats__init(&s);
		s.version = V;
		s.staging_blocks = r->stats.staging_blocks;
		s.staging_bytes = r->stats.staging_bytes;
		s.inflight = r->stats.inflight;
		s.failures_total = r->stats.failures_total;
		s.uploads_total = r->stats.uploads_total;
		s.upload_latency_count = r->stats.upload_latency_count;
		s.upload_latency_sum_us = r->stats.upload_latency_sum_us;
		s.upload_latency_max_us = r->stats.upload_latency_max_us;
		s.orphans = r->stats.orphans;
		s.committed_total = r->stats.committed_total;
		s.upload_bytes_total = r->stats.upload_bytes_total;
		s.buffer_bytes = r->stats.buffer_bytes;
		s.has_waiting = true;
		s.waiting = r->stats.waiting;
		s.has_dropped_total = true;
		s.dropped_total = r->stats.dropped_total;
		rep.body_case = FERRY__RECONCILE__REPLY__BODY_STATS;
		rep.stats = &s;
		break;
	case RECONCILE_REPLY_ERROR:
		ferry__reconcile__error__init(&e);
		e.version = V;
		e.err = r->error < 0 ? -r->error : r->error;
		e.message = (char *)r->message;
		rep.body_case = FERRY__RECONCILE__REPLY__BODY_ERROR;
		rep.error = &e;
		break;
	case RECONCILE_REPLY_RETRYING:
		ferry__reconcile__retrying__init(&t);
		t.version = V;
		t.seq = r->seq;
		t.ino = r->ino;
		t.error = r->error;
		t.message = r->message[0] ? (char *)r->message : NULL;
		rep.body_case = FERRY__RECONCILE__REPLY__BODY_RETRYING;
		rep.retrying = &t;
		break;
	default:
		return -EINVAL;
	}
	if (heap)
		return pack(&rep.base, heap, len);
	if (protobuf_c_message_get_packed_size(&rep.base) > cap)
		return -EMSGSIZE;
	*len = protobuf_c_message_pack(&rep.base, fixed);
	return 0;
}

bool reconcile_seed_names(const struct reconcile_seed *s, uint32_t block_size, char *key,
			  size_t keycap, char *tmp, size_t tmpcap)
{
	if (s->slice_id == 0 || s->slice_size == 0 || block_size == 0 ||
	    (uint64_t)s->index * block_size >= s->slice_size || keycap < SLICE_KEY_MAX)
		return false;
	slice_object_key(s->slice_id, s->index, s->slice_size, block_size, key, keycap);
	return reconcile_seed_tmp_name(key, tmp, tmpcap);
}

bool reconcile_seed_tmp_name(const char *key, char *tmp, size_t tmpcap)
{
	int n = snprintf(tmp, tmpcap, "%s%s", key, RECONCILE_SEED_SUFFIX);

	return n > 0 && (size_t)n < tmpcap;
}

int reconcile_reply_encode(const struct reconcile_reply *r, uint8_t **buf, size_t *len)
{
	return reply_pack(r, buf, NULL, 0, len);
}

int reconcile_reply_encode_to(const struct reconcile_reply *r, uint8_t *buf, size_t cap,
			      size_t *len)
{
	return reply_pack(r, NULL, buf, cap, len);
}

static void copy_msg(char *dst, const char *src)
{
	snprintf(dst, RECONCILE_MSG_MAX, "%s", src ? src : "");
}

int reconcile_reply_decode(const uint8_t *buf, size_t len, struct reconcile_reply *out,
			   char *err, size_t errlen)
{
	Ferry__Reconcile__Reply *rep;
	struct alloc_watch w;
	int rc = 0;

	memset(out, 0, sizeof(*out));
	alloc_watch_init(&w);
	rep = ferry__reconcile__reply__unpack(&w.a, len, buf);
	if (!rep && w.failed)
		return fail(-ENOMEM, err, errlen, "out of memory decoding a reply");
	if (!rep)
		return fail(-EBADMSG, err, errlen, "undecodable reply (%zu bytes)", len);
	if (rep->version != V) {
		rc = fail(-EPROTONOSUPPORT, err, errlen, "reply version %u, want %u", rep->version, V);
		goto out;
	}
	switch (rep->body_case) {
	case FERRY__RECONCILE__REPLY__BODY_COMMITTED:
		out->type = RECONCILE_REPLY_COMMITTED;
		out->seq = rep->committed->seq;
		out->ino = rep->committed->ino;
		out->error = rep->committed->error;
		if (out->error > 0 || out->error < -4095)
			rc = fail(-EBADMSG, err, errlen, "committed error %d", out->error);
		copy_msg(out->message, rep->committed->message);
		if (rc == 0 && (rep->committed->n_seeds > RECONCILE_SEEDS_MAX ||
				(rep->committed->n_seeds && out->error))) {
			rc = fail(-EBADMSG, err, errlen, "%zu cache seeds with error %d",
				  rep->committed->n_seeds, out->error);
			break;
		}
		for (size_t k = 0; rc == 0 && k < rep->committed->n_seeds; k++) {
			const Ferry__Reconcile__CacheSeed *cs = rep->committed->seeds[k];
			if (cs->slice_id == 0 || cs->slice_size == 0) {
				rc = fail(-EBADMSG, err, errlen, "cache seed %zu names no slice", k);
				break;
			}
			out->seeds[k] = (struct reconcile_seed){ .slice_id = cs->slice_id,
								 .index = cs->index,
								 .slice_size = cs->slice_size };
			out->nseeds = (uint32_t)k + 1;
		}
		break;
	case FERRY__RECONCILE__REPLY__BODY_DRAINED:
		out->type = RECONCILE_REPLY_DRAINED;
		out->upto_seq = rep->drained->upto_seq;
		out->failed = rep->drained->failed;
		break;
	case FERRY__RECONCILE__REPLY__BODY_STATS: {
		const Ferry__Reconcile__Stats *s = rep->stats;
		out->type = RECONCILE_REPLY_STATS;
		out->stats = (struct reconcile_stats){
			.staging_blocks = s->staging_blocks,
			.staging_bytes = s->staging_bytes,
			.inflight = s->inflight,
			.failures_total = s->failures_total,
			.uploads_total = s->uploads_total,
			.upload_latency_count = s->upload_latency_count,
			.upload_latency_sum_us = s->upload_latency_sum_us,
			.upload_latency_max_us = s->upload_latency_max_us,
			.orphans = s->orphans,
			.committed_total = s->committed_total,
			.upload_bytes_total = s->upload_bytes_total,
			.buffer_bytes = s->buffer_bytes,
			.waiting = s->has_waiting ? s->waiting : 0,
			.dropped_total = s->has_dropped_total ? s->dropped_total : 0,
		};
		break;
	}
	case FERRY__RECONCILE__REPLY__BODY_ERROR:
		out->type = RECONCILE_REPLY_ERROR;
		if (rep->error->err <= 0 || rep->error->err > 4095)
			rc = fail(-EBADMSG, err, errlen, "error reply with errno %d", rep->error->err);
		out->error = -rep->error->err;
		copy_msg(out->message, rep->error->message);
		break;
	case FERRY__RECONCILE__REPLY__BODY_RETRYING:
		out->type = RECONCILE_REPLY_RETRYING;
		out->seq = rep->retrying->seq;
		out->ino = rep->retrying->ino;
		out->error = rep->retrying->error;
		if (out->error >= 0 || out->error < -4095)
			rc = fail(-EBADMSG, err, errlen, "retrying error %d", out->error);
		copy_msg(out->message, rep->retrying->message);
		break;
	default:
		rc = fail(-EBADMSG, err, errlen, "unknown reply type");
		break;
	}
out:
	ferry__reconcile__reply__free_unpacked(rep, &w.a);
	if (rc < 0)
		memset(out, 0, sizeof(*out));
	return rc;
}

/* ---- blocking client calls ---- */

int reconcile_connect(const char *path, int *sock)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd, rc;

	*sock = -1;
	if (!path || strlen(path) >= sizeof(sa.sun_path))
		return -ENAMETOOLONG;
	strcpy(sa.sun_path, path);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	while ((rc = connect(fd, (struct sockaddr *)&sa, sizeof(sa))) < 0 && errno == EINTR)
		;
	if (rc < 0) {
		rc = -errno;
		close(fd);
		return rc;
	}
	*sock = fd;
	return 0;
}

struct handoff_send {
	int sock, fd;
};

static int send_handoff(Ferry__Reconcile__Handoff *h, void *arg)
{
	struct handoff_send *hs = arg;
	Ferry__Reconcile__Request q;
	uint8_t *buf = NULL;
	size_t len = 0;
	int rc;

	ferry__reconcile__request__init(&q);
	q.version = V;
	q.body_case = FERRY__RECONCILE__REQUEST__BODY_HANDOFF;
	q.handoff = h;
	rc = pack(&q.base, &buf, &len);
	if (rc == 0)
		rc = len > RECONCILE_FRAME_MAX ? -EMSGSIZE : rpc_frame_send(hs->sock, buf, len, &hs->fd, 1);
	free(buf);
	return rc;
}

int reconcile_handoff(int sock, const struct reconcile_job *j, int fd)
{
	struct handoff_send hs = { sock, fd };

	if (fd < 0)
		return -EBADF;
	return with_handoff(j, send_handoff, &hs);
}

static int send_request(int sock, Ferry__Reconcile__Request *q)
{
	uint8_t *buf = NULL;
	size_t len = 0;
	int rc = pack(&q->base, &buf, &len);

	if (rc == 0)
		rc = rpc_frame_send(sock, buf, len, NULL, 0);
	free(buf);
	return rc;
}

int reconcile_drain(int sock, uint64_t upto_seq)
{
	Ferry__Reconcile__Request q;
	Ferry__Reconcile__Drain d;

	ferry__reconcile__request__init(&q);
	ferry__reconcile__drain__init(&d);
	d.version = V;
	d.upto_seq = upto_seq;
	q.version = V;
	q.body_case = FERRY__RECONCILE__REQUEST__BODY_DRAIN;
	q.drain = &d;
	return send_request(sock, &q);
}

int reconcile_drop(int sock, uint64_t ino, uint64_t upto_seq)
{
	Ferry__Reconcile__Request q;
	Ferry__Reconcile__Drop d;

	ferry__reconcile__request__init(&q);
	ferry__reconcile__drop__init(&d);
	d.version = V;
	d.ino = ino;
	d.upto_seq = upto_seq;
	q.version = V;
	q.body_case = FERRY__RECONCILE__REQUEST__BODY_DROP;
	q.drop = &d;
	return send_request(sock, &q);
}

int reconcile_stats_query(int sock)
{
	Ferry__Reconcile__Request q;
	Ferry__Reconcile__StatsQuery s;

	ferry__reconcile__request__init(&q);
	ferry__reconcile__stats_query__init(&s);
	s.version = V;
	q.version = V;
	q.body_case = FERRY__RECONCILE__REQUEST__BODY_STATS_QUERY;
	q.stats_query = &s;
	return send_request(sock, &q);
}

int reconcile_recv_reply(int sock, struct reconcile_reply *out)
{
	int fds[RPC_FDS_MAX];
	uint8_t *buf = NULL;
	size_t len = 0, nfds = 0;
	int rc;

	memset(out, 0, sizeof(*out));
	rc = rpc_frame_recv(sock, RECONCILE_FRAME_MAX, 0, &buf, &len, fds, &nfds);
	if (rc == 0)
		rc = reconcile_reply_decode(buf, len, out, NULL, 0);
	free(buf);
	return rc;
}
