/*
 * reconcile_job: staging names, job checks, Handoff round trips, journal
 * records on disk, request decoding (fd counts, unknown types, versions,
 * missing fields) and replies, over real sockets.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "reconcile_job.h"
#include "reconcile.pb-c.h"
#include "rpc_frame.h"
#include "slice.h"

static void job_init(struct reconcile_job *j, const char *name)
{
	memset(j, 0, sizeof(*j));
	j->seq = 7;
	j->ino = 42;
	j->length = 100000;
	j->mtime.tv_sec = 1700000000;
	j->mtime.tv_nsec = 123456789;
	snprintf(j->name, sizeof(j->name), "%s", name);
}

static void set_ranges(struct reconcile_job *j, size_t n, const struct reconcile_range *r)
{
	free(j->dirty);
	j->dirty = malloc(n * sizeof(*r));
	memcpy(j->dirty, r, n * sizeof(*r));
	j->ndirty = n;
}

Test(reconcile_job, names)
{
	const char *good[] = { "42-7", "a", "x.y", "12-3.part", "A_b-c+d=e,f@g:h~i" };
	const char *bad[] = { "", ".", "..", ".hidden", "a/b", "a\\b", "a b", "x.job", "x.orphan",
			      "x.tmp", "tab\tname", "\x7f", "caf\xc3\xa9" };
	char lng[RECONCILE_NAME_MAX + 2];

	for (size_t i = 0; i < sizeof(good) / sizeof(*good); i++)
		cr_assert_eq(reconcile_name_check(good[i]), 0, "%s", good[i]);
	for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++)
		cr_assert_eq(reconcile_name_check(bad[i]), -EINVAL, "%s", bad[i]);
	cr_assert_eq(reconcile_name_check(NULL), -EINVAL);
	memset(lng, 'a', sizeof(lng));
	lng[RECONCILE_NAME_MAX] = '\0';
	cr_assert_eq(reconcile_name_check(lng), 0);
	lng[RECONCILE_NAME_MAX] = 'a';
	lng[RECONCILE_NAME_MAX + 1] = '\0';
	cr_assert_eq(reconcile_name_check(lng), -EINVAL);
}

Test(reconcile_job, checks)
{
	struct reconcile_job j;
	char err[256];
	struct reconcile_range ok[] = { { 0, 10 }, { 10, 20 }, { 500, 100000 } };
	struct reconcile_range overlap[] = { { 0, 10 }, { 5, 20 } };
	struct reconcile_range order[] = { { 50, 60 }, { 0, 10 } };
	struct reconcile_range empty[] = { { 5, 5 } };
	struct reconcile_range past[] = { { 5, 100001 } };

	job_init(&j, "1-1");
	cr_assert_eq(reconcile_job_check(&j, err, sizeof(err)), 0);
	set_ranges(&j, 3, ok);
	cr_assert_eq(reconcile_job_check(&j, err, sizeof(err)), 0, "%s", err);
	j.size_only = 1;
	cr_assert_eq(reconcile_job_check(&j, err, sizeof(err)), -EINVAL);
	j.size_only = 0;
	set_ranges(&j, 2, overlap);
	cr_assert_eq(reconcile_job_check(&j, err, sizeof(err)), -EINVAL);
	set_ranges(&j, 2, order);
	cr_assert_eq(reconcile_job_check(&j, err, sizeof(err)), -EINVAL);
	set_ranges(&j, 1, empty);
	cr_assert_eq(reconcile_job_check(&j, err, sizeof(err)), -EINVAL);
	set_ranges(&j, 1, past);
	cr_assert_eq(reconcile_job_check(&j, err, sizeof(err)), -EINVAL);
	cr_assert(strstr(err, "past length"), "%s", err);
	reconcile_job_clear(&j);

	job_init(&j, "1-1");
	j.seq = 0;
	cr_assert_eq(reconcile_job_check(&j, err, sizeof(err)), -EINVAL);
	j.seq = (uint64_t)INT64_MAX + 1;
	cr_assert_eq(reconcile_job_check(&j, err, sizeof(err)), -EINVAL);
	job_init(&j, "1-1");
	j.ino = 0;
	cr_assert_eq(reconcile_job_check(&j, err, sizeof(err)), -EINVAL);
	job_init(&j, "1-1");
	j.length = RECONCILE_LENGTH_MAX + 1;
	cr_assert_eq(reconcile_job_check(&j, err, sizeof(err)), -EINVAL);
	job_init(&j, "1-1");
	j.mtime.tv_nsec = 1000000000;
	cr_assert_eq(reconcile_job_check(&j, err, sizeof(err)), -EINVAL);
	job_init(&j, "../x");
	cr_assert_eq(reconcile_job_check(&j, err, sizeof(err)), -EINVAL);
	job_init(&j, "1-1");
	j.ndirty = RECONCILE_RANGES_MAX + 1;
	cr_assert_eq(reconcile_job_check(&j, err, sizeof(err)), -EINVAL);
	reconcile_job_clear(NULL);
}

Test(reconcile_job, handoff_round_trip)
{
	struct reconcile_job j, k;
	struct reconcile_range r[RECONCILE_RANGES_MAX];
	uint8_t *buf;
	size_t len;
	char err[256];

	job_init(&j, "9-1");
	cr_assert_eq(reconcile_job_encode(&j, &buf, &len), 0);
	cr_assert_eq(reconcile_job_decode(buf, len, &k, err, sizeof(err)), 0, "%s", err);
	cr_assert(k.seq == 7 && k.ino == 42 && k.length == 100000 && k.ndirty == 0 && !k.size_only &&
		  k.mtime.tv_sec == 1700000000 && k.mtime.tv_nsec == 123456789 &&
		  !strcmp(k.name, "9-1"));
	free(buf);
	reconcile_job_clear(&k);

	/* The most ranges allowed still fit a frame. */
	j.length = 10ull * RECONCILE_RANGES_MAX * 1000000000ull;
	for (size_t i = 0; i < RECONCILE_RANGES_MAX; i++) {
		r[i].start = i * 8000000000ull;
		r[i].end = r[i].start + 7999999999ull;
	}
	j.length = RECONCILE_LENGTH_MAX;
	set_ranges(&j, RECONCILE_RANGES_MAX, r);
	cr_assert_eq(reconcile_job_encode(&j, &buf, &len), 0);
	cr_assert_leq(len + 64, RECONCILE_FRAME_MAX, "%zu bytes", len);
	cr_assert_eq(reconcile_job_decode(buf, len, &k, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(k.ndirty, RECONCILE_RANGES_MAX);
	cr_assert_eq(memcmp(k.dirty, r, sizeof(r)), 0);
	free(buf);
	reconcile_job_clear(&k);
	reconcile_job_clear(&j);

	job_init(&j, "9-2");
	j.size_only = 1;
	cr_assert_eq(reconcile_job_encode(&j, &buf, &len), 0);
	cr_assert_eq(reconcile_job_decode(buf, len, &k, err, sizeof(err)), 0);
	cr_assert(k.size_only);
	free(buf);
	reconcile_job_clear(&k);

	/* An invalid job is not encoded. */
	job_init(&j, "bad/name");
	cr_assert_eq(reconcile_job_encode(&j, &buf, &len), -EINVAL);
}

/* A request of raw protobuf bytes, framed by hand. */
Test(reconcile_job, request_decoding)
{
	struct reconcile_request q;
	char err[256];
	/* version = 1, then field 9 (length-delimited, empty): a type we do not know. */
	const uint8_t unknown[] = { 0x08, 0x01, 0x4a, 0x00 };
	/* version = 1 and nothing else: no body. */
	const uint8_t nobody[] = { 0x08, 0x01 };
	/* version = 2, drain { version 2, upto 5 } */
	const uint8_t v2[] = { 0x08, 0x02, 0x1a, 0x04, 0x08, 0x02, 0x10, 0x05 };
	/* version = 1, drain { upto 5 } without its version: a missing required field. */
	const uint8_t missing[] = { 0x08, 0x01, 0x1a, 0x02, 0x10, 0x05 };
	const uint8_t drain[] = { 0x08, 0x01, 0x1a, 0x04, 0x08, 0x01, 0x10, 0x05 };
	const uint8_t garbage[] = { 0xff, 0xff, 0xff, 0xff, 0xff, 0x01 };

	cr_assert_eq(reconcile_request_decode(unknown, sizeof(unknown), 0, &q, err, sizeof(err)),
		     -EOPNOTSUPP);
	cr_assert_eq(reconcile_request_decode(nobody, sizeof(nobody), 0, &q, err, sizeof(err)),
		     -EOPNOTSUPP);
	cr_assert_eq(reconcile_request_decode(v2, sizeof(v2), 0, &q, err, sizeof(err)),
		     -EPROTONOSUPPORT);
	cr_assert_eq(reconcile_request_decode(missing, sizeof(missing), 0, &q, err, sizeof(err)),
		     -EBADMSG);
	cr_assert_eq(reconcile_request_decode(garbage, sizeof(garbage), 0, &q, err, sizeof(err)),
		     -EBADMSG);
	cr_assert_eq(reconcile_request_decode(NULL, 0, 0, &q, err, sizeof(err)), -EBADMSG);
	cr_assert_eq(reconcile_request_decode(drain, sizeof(drain), 1, &q, err, sizeof(err)), -EBADF);
	cr_assert_eq(reconcile_request_decode(drain, sizeof(drain), 0, &q, err, sizeof(err)), 0);
	cr_assert(q.type == RECONCILE_REQ_DRAIN && q.upto_seq == 5);
	reconcile_request_clear(&q);
	reconcile_request_clear(NULL);
}

Test(reconcile_job, client_calls_over_a_socket)
{
	int sv[2], fds[RPC_FDS_MAX], f;
	struct reconcile_job j;
	struct reconcile_request q;
	struct reconcile_reply r, got;
	struct reconcile_range rr[] = { { 0, 5 }, { 7, 9 } };
	uint8_t *buf;
	size_t len, n;
	char err[256];
	struct stat a, b;

	cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
	f = open("/proc/self/exe", O_RDONLY | O_CLOEXEC);
	job_init(&j, "5-5");
	set_ranges(&j, 2, rr);
	cr_assert_eq(reconcile_handoff(sv[0], &j, f), 0);
	cr_assert_eq(reconcile_drain(sv[0], 99), 0);
	cr_assert_eq(reconcile_stats_query(sv[0]), 0);
	cr_assert_eq(reconcile_drop(sv[0], 77, 98), 0);
	cr_assert_eq(reconcile_drop(sv[0], 0, 98), 0); /* sent; refused at decode */
	cr_assert_eq(reconcile_handoff(sv[0], &j, -1), -EBADF);

	cr_assert_eq(rpc_frame_recv(sv[1], RECONCILE_FRAME_MAX, 1, &buf, &len, fds, &n), 0);
	cr_assert_eq(n, 1);
	cr_assert_eq(reconcile_request_decode(buf, len, n, &q, err, sizeof(err)), 0, "%s", err);
	cr_assert(q.type == RECONCILE_REQ_HANDOFF && q.job.ndirty == 2 && q.job.dirty[1].end == 9 &&
		  !strcmp(q.job.name, "5-5"));
	fstat(f, &a);
	fstat(fds[0], &b);
	cr_assert(a.st_ino == b.st_ino);
	/* The same bytes without the fd are refused. */
	cr_assert_eq(reconcile_request_decode(buf, len, 0, &q, err, sizeof(err)), -EBADF);
	rpc_fds_close(fds, n);
	free(buf);
	cr_assert_eq(rpc_frame_recv(sv[1], RECONCILE_FRAME_MAX, 1, &buf, &len, fds, &n), 0);
	cr_assert_eq(reconcile_request_decode(buf, len, n, &q, err, sizeof(err)), 0);
	cr_assert(q.type == RECONCILE_REQ_DRAIN && q.upto_seq == 99);
	free(buf);
	cr_assert_eq(rpc_frame_recv(sv[1], RECONCILE_FRAME_MAX, 1, &buf, &len, fds, &n), 0);
	cr_assert_eq(reconcile_request_decode(buf, len, n, &q, err, sizeof(err)), 0);
	cr_assert(q.type == RECONCILE_REQ_STATS);
	free(buf);
	cr_assert_eq(rpc_frame_recv(sv[1], RECONCILE_FRAME_MAX, 1, &buf, &len, fds, &n), 0);
	cr_assert_eq(reconcile_request_decode(buf, len, n, &q, err, sizeof(err)), 0, "%s", err);
	cr_assert(q.type == RECONCILE_REQ_DROP && q.ino == 77 && q.upto_seq == 98);
	/* A drop carries no fd. */
	cr_assert_eq(reconcile_request_decode(buf, len, 1, &q, err, sizeof(err)), -EBADF);
	free(buf);
	cr_assert_eq(rpc_frame_recv(sv[1], RECONCILE_FRAME_MAX, 1, &buf, &len, fds, &n), 0);
	cr_assert_eq(reconcile_request_decode(buf, len, n, &q, err, sizeof(err)), -EINVAL);
	cr_assert(strstr(err, "inode 0"), "%s", err);
	free(buf);

	/* Every reply type comes back as sent. */
	for (int t = RECONCILE_REPLY_COMMITTED; t <= RECONCILE_REPLY_RETRYING; t++) {
		memset(&r, 0, sizeof(r));
		r.type = (enum reconcile_reply_type)t;
		r.seq = 11;
		r.ino = 12;
		r.error = t == RECONCILE_REPLY_COMMITTED ? -EIO :
			  t == RECONCILE_REPLY_RETRYING ? -ENOSPC : -EINVAL;
		snprintf(r.message, sizeof(r.message), "message %d", t);
		r.upto_seq = 13;
		r.failed = 2;
		r.stats.staging_blocks = 14;
		r.stats.buffer_bytes = 15;
		r.stats.upload_latency_max_us = 16;
		cr_assert_eq(reconcile_reply_encode(&r, &buf, &len), 0);
		cr_assert_eq(rpc_frame_send(sv[1], buf, len, NULL, 0), 0);
		free(buf);
		cr_assert_eq(reconcile_recv_reply(sv[0], &got), 0);
		cr_assert_eq(got.type, r.type);
		switch (t) {
		case RECONCILE_REPLY_COMMITTED:
			cr_assert(got.seq == 11 && got.ino == 12 && got.error == -EIO &&
				  !strcmp(got.message, "message 1"));
			break;
		case RECONCILE_REPLY_DRAINED:
			cr_assert(got.upto_seq == 13 && got.failed == 2);
			break;
		case RECONCILE_REPLY_STATS:
			cr_assert(got.stats.staging_blocks == 14 && got.stats.buffer_bytes == 15 &&
				  got.stats.upload_latency_max_us == 16);
			break;
		case RECONCILE_REPLY_RETRYING:
			cr_assert(got.seq == 11 && got.ino == 12 && got.error == -ENOSPC &&
				  !strcmp(got.message, "message 5"));
			break;
		default:
			cr_assert(got.error == -EINVAL && !strcmp(got.message, "message 4"));
		}
	}
	/* A retry reports a failure: an error of 0 is not one. */
	memset(&r, 0, sizeof(r));
	r.type = RECONCILE_REPLY_RETRYING;
	cr_assert_eq(reconcile_reply_encode(&r, &buf, &len), 0);
	cr_assert_eq(reconcile_reply_decode(buf, len, &got, err, sizeof(err)), -EBADMSG);
	free(buf);
	/* A reply that is not one. */
	cr_assert_eq(rpc_frame_send(sv[1], "\xff\xff", 2, NULL, 0), 0);
	cr_assert_eq(reconcile_recv_reply(sv[0], &got), -EBADMSG);
	close(sv[1]);
	cr_assert_eq(reconcile_recv_reply(sv[0], &got), -EPIPE);
	close(sv[0]);
	close(f);
	reconcile_job_clear(&j);
}

static int count_entries(int dirfd)
{
	DIR *d = fdopendir(dup(dirfd));
	struct dirent *de;
	int n = 0;

	rewinddir(d);
	while ((de = readdir(d)))
		if (strcmp(de->d_name, ".") && strcmp(de->d_name, ".."))
			n++;
	closedir(d);
	return n;
}

Test(reconcile_job, journal_records)
{
	char dir[] = "/tmp/ferry-ut-job.XXXXXX", err[256];
	struct reconcile_job j, k;
	struct reconcile_range rr[] = { { 1, 2 } };
	int dfd, fd;

	cr_assert(mkdtemp(dir));
	dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	job_init(&j, "77-1");
	set_ranges(&j, 1, rr);
	cr_assert_eq(reconcile_job_write(dfd, &j, RECONCILE_JOB_SYNC), 0);
	cr_assert_eq(reconcile_job_write(dfd, &j, 0), 0); /* again: replaced */
	cr_assert_eq(count_entries(dfd), 1, "no temp file left");
	cr_assert_eq(reconcile_job_read(dfd, "77-1.job", &k, err, sizeof(err)), 0, "%s", err);
	cr_assert(k.seq == 7 && k.ndirty == 1 && k.dirty[0].end == 2 && !strcmp(k.name, "77-1"));
	reconcile_job_clear(&k);

	/* Kept as an orphan, the record still reads. */
	cr_assert_eq(renameat(dfd, "77-1.job", dfd, "77-1.orphan.job"), 0);
	cr_assert_eq(reconcile_job_read(dfd, "77-1.orphan.job", &k, err, sizeof(err)), 0, "%s", err);
	reconcile_job_clear(&k);
	/* A record under another file's name is refused. */
	cr_assert_eq(renameat(dfd, "77-1.orphan.job", dfd, "78-1.job"), 0);
	cr_assert_eq(reconcile_job_read(dfd, "78-1.job", &k, err, sizeof(err)), -EINVAL);
	cr_assert(strstr(err, "77-1"), "%s", err);
	cr_assert_eq(reconcile_job_read(dfd, "nope.job", &k, err, sizeof(err)), -ENOENT);
	cr_assert_eq(reconcile_job_read(dfd, "78-1", &k, err, sizeof(err)), -EINVAL);
	cr_assert_eq(reconcile_job_read(dfd, "../78-1.job", &k, err, sizeof(err)), -EINVAL);
	/* Damaged and oversized records. */
	fd = openat(dfd, "bad.job", O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
	cr_assert_eq(write(fd, "\xff\xff\xff", 3), 3);
	close(fd);
	cr_assert_eq(reconcile_job_read(dfd, "bad.job", &k, err, sizeof(err)), -EBADMSG);
	fd = openat(dfd, "big.job", O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
	cr_assert_eq(ftruncate(fd, RECONCILE_FRAME_MAX + 1), 0);
	close(fd);
	cr_assert_eq(reconcile_job_read(dfd, "big.job", &k, err, sizeof(err)), -EFBIG);
	cr_assert_eq(mkdirat(dfd, "dir.job", 0700), 0);
	cr_assert_eq(reconcile_job_read(dfd, "dir.job", &k, err, sizeof(err)), -EINVAL);
	cr_assert_eq(symlinkat("78-1.job", dfd, "link.job"), 0);
	cr_assert_eq(reconcile_job_read(dfd, "link.job", &k, err, sizeof(err)), -ELOOP);

	cr_assert_eq(reconcile_job_remove(dfd, "78-1"), 0);
	cr_assert_eq(reconcile_job_remove(dfd, "78-1"), 0); /* gone already: fine */
	cr_assert_eq(reconcile_job_remove(dfd, "a/b"), -EINVAL);
	unlinkat(dfd, "bad.job", 0);
	unlinkat(dfd, "big.job", 0);
	unlinkat(dfd, "link.job", 0);
	unlinkat(dfd, "dir.job", AT_REMOVEDIR);
	cr_assert_eq(count_entries(dfd), 0);
	/* An invalid job is not written. */
	job_init(&k, ".x");
	cr_assert_eq(reconcile_job_write(dfd, &k, 0), -EINVAL);
	close(dfd);
	rmdir(dir);
	reconcile_job_clear(&j);
}

/* The record as the staging file's xattr: attached, loaded (before any
 * .job), refused when it names another file or is damaged, detached. On a
 * file system without user xattrs it would be a .job: load reads either. */
Test(reconcile_job, xattr_records)
{
	char dir[] = "/var/tmp/ferry-ut-xjob.XXXXXX", err[256];
	struct reconcile_job j, k;
	struct reconcile_range rr[] = { { 3, 9 } };
	bool in_xattr;
	int dfd, fd;

	cr_assert(mkdtemp(dir));
	dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	fd = openat(dfd, "77-1", O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	cr_assert_geq(fd, 0);
	job_init(&j, "77-1");
	set_ranges(&j, 1, rr);
	cr_assert_eq(reconcile_job_attached(fd), 0);
	cr_assert_eq(reconcile_job_load(dfd, fd, "77-1", &k, &in_xattr, err, sizeof(err)), -ENOENT);
	cr_assert_eq(reconcile_job_attach(dfd, fd, &j, &in_xattr), 0);
	cr_assert(in_xattr, "this file system keeps user xattrs: the record must be one");
	cr_assert_eq(count_entries(dfd), 1, "no .job file");
	cr_assert_eq(reconcile_job_attached(fd), 1);
	/* Read through the fd, and by name. */
	cr_assert_eq(reconcile_job_load(dfd, fd, "77-1", &k, &in_xattr, err, sizeof(err)), 0, "%s",
		     err);
	cr_assert(in_xattr && k.seq == 7 && k.ndirty == 1 && k.dirty[0].start == 3 &&
		  !strcmp(k.name, "77-1"));
	reconcile_job_clear(&k);
	cr_assert_eq(reconcile_job_load(dfd, -1, "77-1", &k, &in_xattr, err, sizeof(err)), 0, "%s",
		     err);
	reconcile_job_clear(&k);
	/* The xattr is the newer record: it wins over a .job beside it. */
	j.seq = 5;
	cr_assert_eq(reconcile_job_write(dfd, &j, 0), 0);
	cr_assert_eq(reconcile_job_load(dfd, -1, "77-1", &k, &in_xattr, err, sizeof(err)), 0);
	cr_assert(in_xattr && k.seq == 7);
	reconcile_job_clear(&k);
	/* Renamed to an orphan, the file's record still reads as its own. */
	cr_assert_eq(renameat(dfd, "77-1", dfd, "77-1.orphan"), 0);
	cr_assert_eq(reconcile_job_load(dfd, -1, "77-1.orphan", &k, &in_xattr, err, sizeof(err)),
		     0, "%s", err);
	reconcile_job_clear(&k);
	/* The record names no file (it is about the file it is on), so it
	 * stays small: ext4 keeps a value of up to some 60 bytes in a 256-byte
	 * inode instead of a block of its own. */
	{
		uint8_t raw[512];
		ssize_t n = fgetxattr(fd, RECONCILE_JOB_XATTR, raw, sizeof(raw));
		cr_assert(n > 0 && n <= 56, "the record takes %zd bytes", n);
		cr_assert(!memmem(raw, (size_t)n, "77-1", 4), "the record names its file");
	}
	/* So under another name, it is that file's record... */
	cr_assert_eq(renameat(dfd, "77-1.orphan", dfd, "78-1"), 0);
	cr_assert_eq(reconcile_job_load(dfd, -1, "78-1", &k, &in_xattr, err, sizeof(err)), 0, "%s",
		     err);
	cr_assert(!strcmp(k.name, "78-1") && k.seq == 7);
	reconcile_job_clear(&k);
	/* ...while a record that names a file (as records did before) is
	 * refused under another name, naming the file it records. */
	{
		uint8_t *raw = NULL;
		size_t n = 0;
		cr_assert_eq(reconcile_job_encode(&j, &raw, &n), 0);
		cr_assert_eq(fsetxattr(fd, RECONCILE_JOB_XATTR, raw, n, 0), 0);
		free(raw);
	}
	cr_assert_eq(reconcile_job_load(dfd, -1, "78-1", &k, &in_xattr, err, sizeof(err)), -EINVAL);
	cr_assert(strstr(err, "77-1"), "%s", err);
	cr_assert_eq(reconcile_job_load(dfd, -1, "../78-1", &k, &in_xattr, err, sizeof(err)),
		     -EINVAL);
	/* Damaged. */
	cr_assert_eq(fsetxattr(fd, RECONCILE_JOB_XATTR, "\xff\xff\xff", 3, 0), 0);
	cr_assert_eq(reconcile_job_load(dfd, fd, "78-1", &k, &in_xattr, err, sizeof(err)),
		     -EBADMSG);
	/* Detached: gone; the .job beside it (made above) is what loads now. */
	cr_assert_eq(reconcile_job_detach(dfd, fd, "78-1", true), 0);
	cr_assert_eq(reconcile_job_detach(dfd, fd, "78-1", true), 0); /* gone already: fine */
	cr_assert_eq(reconcile_job_attached(fd), 0);
	cr_assert_eq(renameat(dfd, "78-1", dfd, "77-1"), 0);
	cr_assert_eq(reconcile_job_load(dfd, -1, "77-1", &k, &in_xattr, err, sizeof(err)), 0, "%s",
		     err);
	cr_assert(!in_xattr && k.seq == 5);
	reconcile_job_clear(&k);
	cr_assert_eq(reconcile_job_detach(dfd, fd, "77-1", false), 0);
	cr_assert_eq(reconcile_job_load(dfd, -1, "77-1", &k, &in_xattr, err, sizeof(err)), -ENOENT);
	close(fd);
	unlinkat(dfd, "77-1", 0);
	cr_assert_eq(count_entries(dfd), 0);
	close(dfd);
	rmdir(dir);
	reconcile_job_clear(&j);
}

/* A Committed reply carries the objects whose cache seeds the reconciler
 * wrote; the decoder takes at most RECONCILE_SEEDS_MAX of them, none with
 * an error, none naming no slice. */
static int decode_committed(size_t nseeds, int error, uint64_t slice_id, struct reconcile_reply *got)
{
	Ferry__Reconcile__Reply rep;
	Ferry__Reconcile__Committed c;
	Ferry__Reconcile__CacheSeed seed[RECONCILE_SEEDS_MAX + 2], *seedp[RECONCILE_SEEDS_MAX + 2];
	uint8_t buf[4096];
	char err[256];

	cr_assert_leq(nseeds, RECONCILE_SEEDS_MAX + 2);
	ferry__reconcile__reply__init(&rep);
	ferry__reconcile__committed__init(&c);
	rep.version = c.version = 1;
	c.seq = 3;
	c.ino = 4;
	c.error = error;
	for (size_t k = 0; k < nseeds; k++) {
		ferry__reconcile__cache_seed__init(&seed[k]);
		seed[k].slice_id = slice_id + k;
		seed[k].index = 0;
		seed[k].slice_size = 2048;
		seedp[k] = &seed[k];
	}
	c.n_seeds = nseeds;
	c.seeds = seedp;
	rep.body_case = FERRY__RECONCILE__REPLY__BODY_COMMITTED;
	rep.committed = &c;
	cr_assert_leq(ferry__reconcile__reply__get_packed_size(&rep), sizeof(buf));
	size_t len = ferry__reconcile__reply__pack(&rep, buf);
	return reconcile_reply_decode(buf, len, got, err, sizeof(err));
}

Test(reconcile_job, committed_replies_carry_cache_seeds_within_bounds)
{
	struct reconcile_reply r = { .type = RECONCILE_REPLY_COMMITTED, .seq = 7, .ino = 8 }, got;
	char key[SLICE_KEY_MAX], tmp[RECONCILE_SEED_NAME_MAX];
	uint8_t *buf;
	size_t len;

	r.nseeds = 2;
	r.seeds[0] = (struct reconcile_seed){ .slice_id = 41, .index = 0, .slice_size = 3000 };
	r.seeds[1] = (struct reconcile_seed){ .slice_id = 42, .index = 1, .slice_size = 300000 };
	cr_assert_eq(reconcile_reply_encode(&r, &buf, &len), 0);
	cr_assert_eq(reconcile_reply_decode(buf, len, &got, tmp, sizeof(tmp)), 0);
	free(buf);
	cr_assert_eq(got.nseeds, 2);
	cr_assert(got.seeds[1].slice_id == 42 && got.seeds[1].index == 1 &&
		  got.seeds[1].slice_size == 300000);
	/* The encoder refuses what the decoder would. */
	r.error = -EIO;
	cr_assert_eq(reconcile_reply_encode(&r, &buf, &len), -EINVAL);
	r.error = 0;
	r.nseeds = RECONCILE_SEEDS_MAX + 1;
	cr_assert_eq(reconcile_reply_encode(&r, &buf, &len), -EINVAL);

	cr_assert_eq(decode_committed(RECONCILE_SEEDS_MAX, 0, 1, &got), 0);
	cr_assert_eq(got.nseeds, RECONCILE_SEEDS_MAX);
	cr_assert_eq(decode_committed(RECONCILE_SEEDS_MAX + 1, 0, 1, &got), -EBADMSG);
	cr_assert_eq(decode_committed(1, -EIO, 1, &got), -EBADMSG);
	cr_assert_eq(decode_committed(1, 0, 0, &got), -EBADMSG);

	/* Names: the object's key, and a temporary name the cache's scan at
	 * start removes; none for an object past the slice's last. */
	struct reconcile_seed s = { .slice_id = 42, .index = 1, .slice_size = 300000 };
	cr_assert(reconcile_seed_names(&s, 262144, key, sizeof(key), tmp, sizeof(tmp)));
	cr_assert_str_eq(key, "chunks/0/0/42_1_37856");
	cr_assert(strstr(tmp, key) == tmp && strstr(tmp, ".tmp."));
	s.index = 2;
	cr_assert_not(reconcile_seed_names(&s, 262144, key, sizeof(key), tmp, sizeof(tmp)));
	s.index = 0;
	cr_assert_not(reconcile_seed_names(&s, 0, key, sizeof(key), tmp, sizeof(tmp)));
	cr_assert_not(reconcile_seed_names(&s, 262144, key, 8, tmp, sizeof(tmp)));
}
