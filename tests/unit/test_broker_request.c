/*
 * brokerd/request.c: the pure checks every frame goes through before a
 * handler sees it -- mount names, the mount option allowlist, request
 * decoding (version, type, fds) and the policy permission check -- and the
 * reply encoding, read back by the client's decoder's rules.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "broker.pb-c.h"
#include "brokerd.h"

/* ---- names ---- */

Test(broker_name, accepts_relative_names)
{
	static const char *const good[] = {
		"m", "pod-1/vol", "a/b/c/d", "x.y", "..a", "a..", ".hidden", "a/.b", "v_1:2@3+4=5,6~",
	};

	for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++)
		cr_assert_eq(broker_name_check(good[i], NULL, 0), 0, "%s refused", good[i]);
}

Test(broker_name, refuses_escapes_and_oddities)
{
	static const char *const bad[] = {
		"", "/", "/abs", "/tmp/x", "..", ".", "../x", "a/../b", "a/..", "a/./b", "./a", "a/",
		"a//b", "a b", "a\tb", "a\\b", "a\nb", "caf\xc3\xa9", "a\x7f",
	};
	char err[256];

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		err[0] = '\0';
		cr_assert_eq(broker_name_check(bad[i], err, sizeof(err)), -EINVAL, "\"%s\" accepted",
			     bad[i]);
		cr_assert(err[0], "no reason for \"%s\"", bad[i]);
	}
	cr_assert_eq(broker_name_check(NULL, err, sizeof(err)), -EINVAL);
}

Test(broker_name, bounds)
{
	char name[BROKER_NAME_MAX + 2], comp[300];

	memset(comp, 'a', 255);
	comp[255] = '\0';
	cr_assert_eq(broker_name_check(comp, NULL, 0), 0);
	comp[255] = 'a';
	comp[256] = '\0';
	cr_assert_eq(broker_name_check(comp, NULL, 0), -EINVAL, "component of 256 bytes");
	/* 32 components pass, 33 do not. */
	name[0] = '\0';
	for (int i = 0; i < 32; i++)
		strcat(name, i ? "/a" : "a");
	cr_assert_eq(broker_name_check(name, NULL, 0), 0);
	strcat(name, "/a");
	cr_assert_eq(broker_name_check(name, NULL, 0), -EINVAL);
	memset(name, 'a', BROKER_NAME_MAX + 1);
	for (unsigned i = 200; i < BROKER_NAME_MAX; i += 200)
		name[i] = '/';
	name[BROKER_NAME_MAX + 1] = '\0';
	cr_assert_eq(broker_name_check(name, NULL, 0), -EINVAL, "longer than the maximum");
	name[BROKER_NAME_MAX] = '\0';
	cr_assert_eq(broker_name_check(name, NULL, 0), 0);
}

/* ---- options ---- */

static int opts(const char *const *list, struct mount_opts *o, char *err, size_t errlen)
{
	unsigned seen = 0;
	int rc = 0;

	memset(o, 0, sizeof(*o));
	for (size_t i = 0; list[i] && rc == 0; i++)
		rc = broker_option_parse(list[i], o, &seen, err, errlen);
	return rc;
}

Test(broker_options, allowlist)
{
	const char *all[] = { "allow_other", "default_permissions", "max_read=131072",
			      "fsname=ferry:vol-1", "subtype=ferryfs", "ro", "noexec", "noatime",
			      "nodiratime", "nosuid", "nodev", NULL };
	struct mount_opts o;
	char err[256];

	cr_assert_eq(opts(all, &o, err, sizeof(err)), 0, "%s", err);
	cr_assert(o.allow_other && o.default_permissions && o.ro && o.noexec && o.noatime &&
		  o.nodiratime);
	cr_assert_eq(o.max_read, 131072);
	cr_assert_str_eq(o.fsname, "ferry:vol-1");
	cr_assert_str_eq(o.subtype, "ferryfs");
	{
		const char *rw[] = { "rw", "exec", NULL };
		cr_assert_eq(opts(rw, &o, err, sizeof(err)), 0, "%s", err);
		cr_assert(!o.ro && !o.noexec);
	}
}

Test(broker_options, refused)
{
	static const char *const bad[] = {
		"suid", "dev", "fd=3", "fd", "rootmode=40000", "user_id=0", "group_id=0", "blkdev",
		"blksize=512", "foo", "foo=bar", "", "=", "allow_other=1", "ro=1", "max_read",
		"max_read=", "max_read=0", "max_read=-1", "max_read=0x10", "max_read=1073741825",
		"max_read=99999999999", "fsname=", "fsname=a,b", "fsname=a b", "fsname=a\\b",
		"fsname=a\"b", "subtype=", "subtype=a.b", "subtype=a/b",
		"subtype=aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "context=system_u", "x-gvfs-show",
		"allow_root", "auto_unmount", "nonempty",
	};
	char err[256];

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		const char *list[] = { bad[i], NULL };
		struct mount_opts o;

		err[0] = '\0';
		cr_assert_eq(opts(list, &o, err, sizeof(err)), -EINVAL, "\"%s\" accepted", bad[i]);
		cr_assert(err[0], "no reason for \"%s\"", bad[i]);
	}
}

Test(broker_options, repeated_and_contradicting)
{
	const char *twice[] = { "max_read=4096", "max_read=8192", NULL };
	const char *clash1[] = { "ro", "rw", NULL };
	const char *clash2[] = { "exec", "noexec", NULL };
	const char *dup[] = { "nosuid", "nosuid", NULL };
	struct mount_opts o;
	char err[256];

	cr_assert_eq(opts(twice, &o, err, sizeof(err)), -EINVAL);
	cr_assert(strstr(err, "twice"), "%s", err);
	cr_assert_eq(opts(clash1, &o, err, sizeof(err)), -EINVAL);
	cr_assert_eq(opts(clash2, &o, err, sizeof(err)), -EINVAL);
	cr_assert_eq(opts(dup, &o, err, sizeof(err)), -EINVAL);
}

Test(broker_options, reasons_name_the_broker_generated_ones)
{
	const char *list[] = { "user_id=0", NULL };
	struct mount_opts o;
	char err[256];

	cr_assert_eq(opts(list, &o, err, sizeof(err)), -EINVAL);
	cr_assert(strstr(err, "peer's uid"), "%s", err);
}

/* ---- requests ---- */

static size_t pack(Ferry__Broker__Request *q, uint8_t *buf)
{
	cr_assert(ferry__broker__request__get_packed_size(q) <= BROKER_FRAME_MAX);
	return ferry__broker__request__pack(q, buf);
}

Test(broker_request, decodes_each_type)
{
	uint8_t buf[BROKER_FRAME_MAX];
	Ferry__Broker__Request q = FERRY__BROKER__REQUEST__INIT;
	Ferry__Broker__Mount m = FERRY__BROKER__MOUNT__INIT;
	Ferry__Broker__Umount u = FERRY__BROKER__UMOUNT__INIT;
	Ferry__Broker__Attach a = FERRY__BROKER__ATTACH__INIT;
	Ferry__Broker__BackingOpen bo = FERRY__BROKER__BACKING_OPEN__INIT;
	Ferry__Broker__BackingClose bc = FERRY__BROKER__BACKING_CLOSE__INIT;
	Ferry__Broker__StatusQuery sq = FERRY__BROKER__STATUS_QUERY__INIT;
	char *options[] = { "default_permissions", "max_read=65536" };
	struct broker_req r;
	char err[256];
	size_t len;

	q.version = BROKER_PROTO_VERSION;
	q.id = 77;
	m.name = "pod/vol";
	m.n_options = 2;
	m.options = options;
	q.body_case = FERRY__BROKER__REQUEST__BODY_MOUNT;
	q.mount = &m;
	len = pack(&q, buf);
	cr_assert_eq(broker_request_parse(buf, len, 0, &r, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(r.type, BROKER_MSG_MOUNT);
	cr_assert_eq(r.id, 77);
	cr_assert_str_eq(r.name, "pod/vol");
	cr_assert(r.opts.default_permissions && r.opts.max_read == 65536);

	u.name = "pod/vol";
	q.body_case = FERRY__BROKER__REQUEST__BODY_UMOUNT;
	q.umount = &u;
	len = pack(&q, buf);
	cr_assert_eq(broker_request_parse(buf, len, 0, &r, err, sizeof(err)), 0, "%s", err);
	cr_assert(r.type == BROKER_MSG_UMOUNT && r.has_name);
	u.name = NULL;
	u.has_mount_id = 1;
	u.mount_id = 5;
	len = pack(&q, buf);
	cr_assert_eq(broker_request_parse(buf, len, 0, &r, err, sizeof(err)), 0, "%s", err);
	cr_assert(!r.has_name && r.mount_id == 5);

	a.name = "vol";
	q.body_case = FERRY__BROKER__REQUEST__BODY_ATTACH;
	q.attach = &a;
	len = pack(&q, buf);
	cr_assert_eq(broker_request_parse(buf, len, 1, &r, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(r.type, BROKER_MSG_ATTACH);

	bo.mount_id = 9;
	q.body_case = FERRY__BROKER__REQUEST__BODY_BACKING_OPEN;
	q.backing_open = &bo;
	len = pack(&q, buf);
	cr_assert_eq(broker_request_parse(buf, len, 1, &r, err, sizeof(err)), 0, "%s", err);
	cr_assert(r.type == BROKER_MSG_BACKING_OPEN && r.mount_id == 9);

	bc.mount_id = 9;
	bc.backing_id = 3;
	q.body_case = FERRY__BROKER__REQUEST__BODY_BACKING_CLOSE;
	q.backing_close = &bc;
	len = pack(&q, buf);
	cr_assert_eq(broker_request_parse(buf, len, 0, &r, err, sizeof(err)), 0, "%s", err);
	cr_assert(r.type == BROKER_MSG_BACKING_CLOSE && r.backing_id == 3);

	q.body_case = FERRY__BROKER__REQUEST__BODY_STATUS;
	q.status = &sq;
	len = pack(&q, buf);
	cr_assert_eq(broker_request_parse(buf, len, 0, &r, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(r.type, BROKER_MSG_STATUS);
}

Test(broker_request, refusals)
{
	uint8_t buf[BROKER_FRAME_MAX + 16];
	Ferry__Broker__Request q = FERRY__BROKER__REQUEST__INIT;
	Ferry__Broker__StatusQuery sq = FERRY__BROKER__STATUS_QUERY__INIT;
	Ferry__Broker__BackingOpen bo = FERRY__BROKER__BACKING_OPEN__INIT;
	Ferry__Broker__BackingClose bc = FERRY__BROKER__BACKING_CLOSE__INIT;
	Ferry__Broker__Umount u = FERRY__BROKER__UMOUNT__INIT;
	Ferry__Broker__Mount m = FERRY__BROKER__MOUNT__INIT;
	struct broker_req r;
	char err[256];
	size_t len;

	/* Garbage, empty, too long. */
	memset(buf, 0xff, 64);
	cr_assert_eq(broker_request_parse(buf, 64, 0, &r, err, sizeof(err)), -EBADMSG);
	cr_assert_eq(broker_request_parse(buf, 0, 0, &r, err, sizeof(err)), -EBADMSG);
	cr_assert_eq(broker_request_parse(buf, BROKER_FRAME_MAX + 1, 0, &r, err, sizeof(err)),
		     -EMSGSIZE);
	/* Version. */
	q.version = 2;
	q.id = 4;
	q.body_case = FERRY__BROKER__REQUEST__BODY_STATUS;
	q.status = &sq;
	len = pack(&q, buf);
	cr_assert_eq(broker_request_parse(buf, len, 0, &r, err, sizeof(err)), -EPROTONOSUPPORT);
	cr_assert_eq(r.id, 4, "the id is kept for the error reply");
	/* No body (or one this broker does not know). */
	q.version = BROKER_PROTO_VERSION;
	q.body_case = FERRY__BROKER__REQUEST__BODY__NOT_SET;
	len = pack(&q, buf);
	cr_assert_eq(broker_request_parse(buf, len, 0, &r, err, sizeof(err)), -EOPNOTSUPP);
	/* fds: exactly one for ATTACH and BACKING_OPEN, none otherwise. */
	q.body_case = FERRY__BROKER__REQUEST__BODY_STATUS;
	len = pack(&q, buf);
	cr_assert_eq(broker_request_parse(buf, len, 1, &r, err, sizeof(err)), -EBADF);
	bo.mount_id = 1;
	q.body_case = FERRY__BROKER__REQUEST__BODY_BACKING_OPEN;
	q.backing_open = &bo;
	len = pack(&q, buf);
	cr_assert_eq(broker_request_parse(buf, len, 0, &r, err, sizeof(err)), -EBADF);
	cr_assert_eq(broker_request_parse(buf, len, 2, &r, err, sizeof(err)), -EBADF);
	bo.mount_id = 0;
	len = pack(&q, buf);
	cr_assert_eq(broker_request_parse(buf, len, 1, &r, err, sizeof(err)), -EINVAL);
	/* Backing ids are positive ints. */
	bc.mount_id = 1;
	bc.backing_id = 0;
	q.body_case = FERRY__BROKER__REQUEST__BODY_BACKING_CLOSE;
	q.backing_close = &bc;
	len = pack(&q, buf);
	cr_assert_eq(broker_request_parse(buf, len, 0, &r, err, sizeof(err)), -EINVAL);
	bc.backing_id = 0x80000000u;
	len = pack(&q, buf);
	cr_assert_eq(broker_request_parse(buf, len, 0, &r, err, sizeof(err)), -EINVAL);
	/* Umount: name or id, not both, not neither. */
	q.body_case = FERRY__BROKER__REQUEST__BODY_UMOUNT;
	q.umount = &u;
	len = pack(&q, buf);
	cr_assert_eq(broker_request_parse(buf, len, 0, &r, err, sizeof(err)), -EINVAL);
	u.name = "a";
	u.has_mount_id = 1;
	u.mount_id = 3;
	len = pack(&q, buf);
	cr_assert_eq(broker_request_parse(buf, len, 0, &r, err, sizeof(err)), -EINVAL);
	/* A bad name or option inside a well-formed MOUNT. */
	m.name = "../x";
	q.body_case = FERRY__BROKER__REQUEST__BODY_MOUNT;
	q.mount = &m;
	len = pack(&q, buf);
	cr_assert_eq(broker_request_parse(buf, len, 0, &r, err, sizeof(err)), -EINVAL);
	{
		char *o17[17];

		for (int i = 0; i < 17; i++)
			o17[i] = "nosuid";
		m.name = "x";
		m.n_options = 17;
		m.options = o17;
		len = pack(&q, buf);
		cr_assert_eq(broker_request_parse(buf, len, 0, &r, err, sizeof(err)), -EINVAL);
		cr_assert(strstr(err, "at most"), "%s", err);
	}
}

/* The _MANY requests: BACKING_OPEN_MANY takes 1 to BROKER_FDS_MAX fds,
 * BACKING_CLOSE_MANY 1 to BROKER_CLOSE_MANY_MAX ids, each in range; their
 * replies carry one result per item and fit a frame at their largest. */
Test(broker_request, many)
{
	uint8_t buf[BROKER_FRAME_MAX];
	Ferry__Broker__Request q = FERRY__BROKER__REQUEST__INIT;
	Ferry__Broker__BackingOpenMany bo = FERRY__BROKER__BACKING_OPEN_MANY__INIT;
	Ferry__Broker__BackingCloseMany bc = FERRY__BROKER__BACKING_CLOSE_MANY__INIT;
	uint32_t ids[BROKER_CLOSE_MANY_MAX + 1];
	struct broker_req r;
	struct broker_rep rep;
	Ferry__Broker__Reply *dec;
	char err[BROKER_MSG_MAX];
	size_t len;

	q.version = BROKER_PROTO_VERSION;
	q.id = 5;
	bo.mount_id = 9;
	q.body_case = FERRY__BROKER__REQUEST__BODY_BACKING_OPEN_MANY;
	q.backing_open_many = &bo;
	len = pack(&q, buf);
	for (size_t n = 1; n <= BROKER_FDS_MAX; n++) {
		cr_assert_eq(broker_request_parse(buf, len, n, &r, err, sizeof(err)), 0, "%s", err);
		cr_assert(r.type == BROKER_MSG_BACKING_OPEN_MANY && r.mount_id == 9);
	}
	cr_assert_eq(broker_request_parse(buf, len, 0, &r, err, sizeof(err)), -EBADF);
	cr_assert_eq(broker_request_parse(buf, len, BROKER_FDS_MAX + 1, &r, err, sizeof(err)),
		     -EBADF);
	cr_assert_eq(r.id, 5, "the refusal answers the request's id");
	bo.mount_id = 0;
	len = pack(&q, buf);
	cr_assert_eq(broker_request_parse(buf, len, 1, &r, err, sizeof(err)), -EINVAL);

	for (size_t k = 0; k <= BROKER_CLOSE_MANY_MAX; k++)
		ids[k] = (uint32_t)k + 1;
	bc.mount_id = 9;
	bc.backing_ids = ids;
	bc.n_backing_ids = BROKER_CLOSE_MANY_MAX;
	q.body_case = FERRY__BROKER__REQUEST__BODY_BACKING_CLOSE_MANY;
	q.backing_close_many = &bc;
	len = pack(&q, buf);
	cr_assert_eq(broker_request_parse(buf, len, 0, &r, err, sizeof(err)), 0, "%s", err);
	cr_assert(r.type == BROKER_MSG_BACKING_CLOSE_MANY && r.nids == BROKER_CLOSE_MANY_MAX);
	cr_assert(r.backing_ids[0] == 1 && r.backing_ids[BROKER_CLOSE_MANY_MAX - 1] ==
		  BROKER_CLOSE_MANY_MAX);
	cr_assert_eq(broker_request_parse(buf, len, 1, &r, err, sizeof(err)), -EBADF,
		     "an fd with BACKING_CLOSE_MANY");
	bc.n_backing_ids = BROKER_CLOSE_MANY_MAX + 1;
	len = pack(&q, buf);
	cr_assert_eq(broker_request_parse(buf, len, 0, &r, err, sizeof(err)), -EINVAL);
	bc.n_backing_ids = 0;
	len = pack(&q, buf);
	cr_assert_eq(broker_request_parse(buf, len, 0, &r, err, sizeof(err)), -EINVAL);
	bc.n_backing_ids = 3;
	ids[2] = (uint32_t)INT32_MAX + 1;
	len = pack(&q, buf);
	cr_assert_eq(broker_request_parse(buf, len, 0, &r, err, sizeof(err)), -EINVAL);
	cr_assert(strstr(err, "out of range"), "%s", err);

	/* The replies, at their largest. */
	rep = (struct broker_rep){ .id = 7, .type = BROKER_MSG_BACKING_OPEN_MANY, .fd = -1,
				   .nmany = BROKER_FDS_MAX };
	for (size_t k = 0; k < BROKER_FDS_MAX; k++) {
		rep.many_ids[k] = INT32_MAX;
		rep.many_errors[k] = k == 3 ? -EPERM : 0;
	}
	memset(rep.message, 'm', BROKER_MSG_MAX - 1);
	cr_assert_eq(broker_reply_encode(&rep, buf, &len), 0);
	dec = ferry__broker__reply__unpack(NULL, len, buf);
	cr_assert(dec && dec->body_case == FERRY__BROKER__REPLY__BODY_BACKING_OPENED_MANY);
	cr_assert(dec->backing_opened_many->n_backing_ids == BROKER_FDS_MAX &&
		  dec->backing_opened_many->n_errors == BROKER_FDS_MAX);
	cr_assert(dec->backing_opened_many->errors[3] == EPERM &&
		  dec->backing_opened_many->backing_ids[3] == 0, "a refused fd has no id");
	cr_assert_eq(dec->backing_opened_many->backing_ids[0], INT32_MAX);
	ferry__broker__reply__free_unpacked(dec, NULL);
	rep.type = BROKER_MSG_BACKING_CLOSE_MANY;
	rep.nmany = BROKER_CLOSE_MANY_MAX;
	for (size_t k = 0; k < BROKER_CLOSE_MANY_MAX; k++)
		rep.many_errors[k] = -ENOENT;
	cr_assert_eq(broker_reply_encode(&rep, buf, &len), 0);
	cr_assert(len <= BROKER_FRAME_MAX);
	dec = ferry__broker__reply__unpack(NULL, len, buf);
	cr_assert(dec && dec->body_case == FERRY__BROKER__REPLY__BODY_BACKING_CLOSED_MANY);
	cr_assert(dec->backing_closed_many->n_errors == BROKER_CLOSE_MANY_MAX &&
		  dec->backing_closed_many->errors[BROKER_CLOSE_MANY_MAX - 1] == ENOENT);
	ferry__broker__reply__free_unpacked(dec, NULL);
	rep.nmany = BROKER_CLOSE_MANY_MAX + 1;
	cr_assert_eq(broker_reply_encode(&rep, buf, &len), -EINVAL);
}

Test(broker_request, permission)
{
	struct policy_rule rule = { .uid = 1, .root = "/r", .max_mounts = 1, .line = 3 };
	struct broker_req q = { .type = BROKER_MSG_MOUNT };
	char err[256];

	cr_assert_eq(broker_request_permitted(&rule, &q, err, sizeof(err)), 0);
	q.opts.allow_other = true;
	cr_assert_eq(broker_request_permitted(&rule, &q, err, sizeof(err)), -EPERM);
	cr_assert(strstr(err, "line 3"), "%s", err);
	rule.allow_other = 1;
	cr_assert_eq(broker_request_permitted(&rule, &q, err, sizeof(err)), 0);
	cr_assert_eq(broker_request_permitted(NULL, &q, err, sizeof(err)), -EPERM);
	q.type = BROKER_MSG_STATUS;
	cr_assert_eq(broker_request_permitted(NULL, &q, err, sizeof(err)), 0);
}

/* ---- replies ---- */

Test(broker_reply, encodes_every_body_and_errors)
{
	uint8_t buf[BROKER_FRAME_MAX];
	struct broker_rep rep = { .id = 12, .type = BROKER_MSG_BACKING_OPEN, .backing_id = 7,
				  .fd = -1 };
	Ferry__Broker__Reply *r;
	size_t len;

	cr_assert_eq(broker_reply_encode(&rep, buf, &len), 0);
	r = ferry__broker__reply__unpack(NULL, len, buf);
	cr_assert(r && r->version == BROKER_PROTO_VERSION && r->id == 12 && r->error == 0);
	cr_assert_eq(r->body_case, FERRY__BROKER__REPLY__BODY_BACKING_OPENED);
	cr_assert_eq(r->backing_opened->backing_id, 7);
	ferry__broker__reply__free_unpacked(r, NULL);

	rep = (struct broker_rep){ .id = 13, .error = -EPERM, .closing = true, .fd = -1,
				   .type = BROKER_MSG_MOUNT };
	snprintf(rep.message, sizeof(rep.message), "no");
	cr_assert_eq(broker_reply_encode(&rep, buf, &len), 0);
	r = ferry__broker__reply__unpack(NULL, len, buf);
	cr_assert(r && r->error == EPERM && r->has_closing && r->closing);
	cr_assert_str_eq(r->message, "no");
	cr_assert_eq(r->body_case, FERRY__BROKER__REPLY__BODY__NOT_SET, "no body with an error");
	ferry__broker__reply__free_unpacked(r, NULL);

	/* The largest Status fits a frame. */
	rep = (struct broker_rep){ .id = UINT64_MAX, .type = BROKER_MSG_STATUS, .fd = -1 };
	rep.status = (struct broker_status){ UINT64_MAX, UINT64_MAX, UINT64_MAX, UINT64_MAX,
					     UINT64_MAX, UINT64_MAX, UINT64_MAX, UINT32_MAX,
					     "" };
	memset(rep.status.root, 'r', BROKER_ROOT_MAX);
	rep.status.root[0] = '/';
	memset(rep.message, 'm', BROKER_MSG_MAX - 1);
	cr_assert_eq(broker_reply_encode(&rep, buf, &len), 0);
	cr_assert(len <= BROKER_FRAME_MAX);
}
