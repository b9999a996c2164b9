/*
 * request: the broker's decoding and checking of a request frame, and the
 * encoding of its replies. Pure functions: no fds, no syscalls, no logging,
 * so the fuzzer (tests/fuzz/fuzz_broker.c) drives exactly what the server
 * runs on every frame before any handler sees it.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "broker.pb-c.h"
#include "errmsg.h"
#include "brokerd.h"

#define V BROKER_PROTO_VERSION
#define NAME_COMPONENTS_MAX 32u
#define MAX_READ_MAX (1u << 30)

#define fail errmsg_fail /* short, for the many calls below */

const char *broker_msg_name(enum broker_msg t)
{
	switch (t) {
	case BROKER_MSG_MOUNT: return "MOUNT";
	case BROKER_MSG_UMOUNT: return "UMOUNT";
	case BROKER_MSG_ATTACH: return "ATTACH";
	case BROKER_MSG_REATTACH: return "REATTACH";
	case BROKER_MSG_BACKING_OPEN: return "BACKING_OPEN";
	case BROKER_MSG_BACKING_CLOSE: return "BACKING_CLOSE";
	case BROKER_MSG_STATUS: return "STATUS";
	case BROKER_MSG_BACKING_OPEN_MANY: return "BACKING_OPEN_MANY";
	case BROKER_MSG_BACKING_CLOSE_MANY: return "BACKING_CLOSE_MANY";
	default: return "?";
	}
}

/* Printable ASCII but space and backslash (mountinfo would escape them). */
static bool name_byte_ok(unsigned char ch)
{
	return ch > 0x20 && ch < 0x7f && ch != '\\';
}

int broker_name_check(const char *name, char *err, size_t errlen)
{
	size_t len, comps = 0;
	const char *p;

	if (!name || !*name)
		return fail(-EINVAL, err, errlen, "empty mount name");
	len = strlen(name);
	if (len > BROKER_NAME_MAX)
		return fail(-EINVAL, err, errlen, "mount name longer than %u bytes", BROKER_NAME_MAX);
	if (name[0] == '/')
		return fail(-EINVAL, err, errlen, "mount name \"%.64s\" is absolute: it must be "
			    "relative to the policy root", name);
	for (p = name; *p; p++)
		if (!name_byte_ok((unsigned char)*p))
			return fail(-EINVAL, err, errlen, "mount name has byte 0x%02x at %zu: only "
				    "printable ASCII without space or backslash",
				    (unsigned char)*p, (size_t)(p - name));
	for (p = name;;) {
		const char *slash = strchr(p, '/');
		size_t n = slash ? (size_t)(slash - p) : strlen(p);

		if (n == 0)
			return fail(-EINVAL, err, errlen, "mount name \"%.64s\" has an empty "
				    "component", name);
		if ((n == 1 && p[0] == '.') || (n == 2 && p[0] == '.' && p[1] == '.'))
			return fail(-EINVAL, err, errlen, "mount name \"%.64s\" has a \"%.*s\" "
				    "component", name, (int)n, p);
		if (n > 255)
			return fail(-EINVAL, err, errlen, "mount name has a component longer than "
				    "255 bytes");
		if (++comps > NAME_COMPONENTS_MAX)
			return fail(-EINVAL, err, errlen, "mount name has more than %u components",
				    NAME_COMPONENTS_MAX);
		if (!slash)
			break;
		p = slash + 1;
	}
	return 0;
}

/* The allowlist. Everything not here is refused, as fusermount3 does. */
enum opt_id {
	OPT_ALLOW_OTHER, OPT_DEFAULT_PERMISSIONS, OPT_MAX_READ, OPT_FSNAME, OPT_SUBTYPE,
	OPT_RO, OPT_RW, OPT_NOEXEC, OPT_EXEC, OPT_NOATIME, OPT_NODIRATIME, OPT_NOSUID,
	OPT_NODEV, OPT_COUNT
};

static const struct {
	const char *name;
	bool value;              /* takes =VALUE */
	unsigned clash;          /* bit of the option it contradicts */
} opts[OPT_COUNT] = {
	[OPT_ALLOW_OTHER] = { "allow_other", false, 0 },
	[OPT_DEFAULT_PERMISSIONS] = { "default_permissions", false, 0 },
	[OPT_MAX_READ] = { "max_read", true, 0 },
	[OPT_FSNAME] = { "fsname", true, 0 },
	[OPT_SUBTYPE] = { "subtype", true, 0 },
	[OPT_RO] = { "ro", false, 1u << OPT_RW },
	[OPT_RW] = { "rw", false, 1u << OPT_RO },
	[OPT_NOEXEC] = { "noexec", false, 1u << OPT_EXEC },
	[OPT_EXEC] = { "exec", false, 1u << OPT_NOEXEC },
	[OPT_NOATIME] = { "noatime", false, 0 },
	[OPT_NODIRATIME] = { "nodiratime", false, 0 },
	[OPT_NOSUID] = { "nosuid", false, 0 },
	[OPT_NODEV] = { "nodev", false, 0 },
};

/* Options the broker sets itself or never allows, with the reason. */
static const struct {
	const char *name;
	const char *why;
} refused[] = {
	{ "fd", "the broker opens /dev/fuse itself" },
	{ "rootmode", "the broker sets it from the target directory" },
	{ "user_id", "the broker sets it to the peer's uid" },
	{ "group_id", "the broker sets it to the peer's gid" },
	{ "suid", "mounts are always nosuid" },
	{ "dev", "mounts are always nodev" },
	{ "blkdev", "block-device FUSE is not brokered" },
	{ "blksize", "block-device FUSE is not brokered" },
};

static bool value_ok(const char *v, size_t max, bool strict)
{
	size_t n = strlen(v);

	if (n == 0 || n > max)
		return false;
	for (; *v; v++) {
		unsigned char ch = (unsigned char)*v;

		if (strict) {
			if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
			      (ch >= '0' && ch <= '9') || ch == '_' || ch == '-'))
				return false;
		} else if (!name_byte_ok(ch) || ch == ',' || ch == '"' || ch == '\'') {
			return false;
		}
	}
	return true;
}

int broker_option_parse(const char *opt, struct mount_opts *o, unsigned *seen, char *err,
			size_t errlen)
{
	const char *eq = strchr(opt, '=');
	size_t klen = eq ? (size_t)(eq - opt) : strlen(opt);
	const char *val = eq ? eq + 1 : NULL;
	int i;

	if (strlen(opt) > BROKER_OPTION_MAX)
		return fail(-EINVAL, err, errlen, "mount option longer than %u bytes",
			    BROKER_OPTION_MAX);
	for (size_t r = 0; r < sizeof(refused) / sizeof(refused[0]); r++)
		if (strlen(refused[r].name) == klen && !memcmp(opt, refused[r].name, klen))
			return fail(-EINVAL, err, errlen, "mount option \"%.*s\" is refused: %s",
				    (int)klen, opt, refused[r].why);
	for (i = 0; i < OPT_COUNT; i++)
		if (strlen(opts[i].name) == klen && !memcmp(opt, opts[i].name, klen))
			break;
	if (i == OPT_COUNT) {
		size_t n = strlen(opt);
		bool printable = true;

		for (size_t k = 0; k < n && k < 64; k++)
			if (!name_byte_ok((unsigned char)opt[k]))
				printable = false;
		if (!printable)
			return fail(-EINVAL, err, errlen, "unknown mount option");
		return fail(-EINVAL, err, errlen, "unknown mount option \"%.64s\"", opt);
	}
	if (opts[i].value != (val != NULL))
		return fail(-EINVAL, err, errlen, opts[i].value ? "mount option %s needs a value"
								 : "mount option %s takes no value",
			    opts[i].name);
	if (*seen & (1u << i))
		return fail(-EINVAL, err, errlen, "mount option %s given twice", opts[i].name);
	if (*seen & opts[i].clash)
		return fail(-EINVAL, err, errlen, "mount option %s contradicts an earlier one",
			    opts[i].name);
	*seen |= 1u << i;
	switch (i) {
	case OPT_ALLOW_OTHER: o->allow_other = true; break;
	case OPT_DEFAULT_PERMISSIONS: o->default_permissions = true; break;
	case OPT_RO: o->ro = true; break;
	case OPT_NOEXEC: o->noexec = true; break;
	case OPT_NOATIME: o->noatime = true; break;
	case OPT_NODIRATIME: o->nodiratime = true; break;
	case OPT_RW: case OPT_EXEC: case OPT_NOSUID: case OPT_NODEV: break;
	case OPT_MAX_READ: {
		unsigned long v = 0;

		if (!*val || strlen(val) > 10)
			goto bad_num;
		for (const char *p = val; *p; p++) {
			if (*p < '0' || *p > '9')
				goto bad_num;
			v = v * 10 + (unsigned long)(*p - '0');
		}
		if (v == 0 || v > MAX_READ_MAX)
			goto bad_num;
		o->max_read = (uint32_t)v;
		break;
bad_num:
		return fail(-EINVAL, err, errlen, "max_read wants a number of bytes from 1 to %u",
			    MAX_READ_MAX);
	}
	case OPT_FSNAME:
		if (!value_ok(val, sizeof(o->fsname) - 1, false))
			return fail(-EINVAL, err, errlen, "fsname wants 1 to %zu printable bytes, "
				    "no space, comma, quote or backslash", sizeof(o->fsname) - 1);
		snprintf(o->fsname, sizeof(o->fsname), "%s", val);
		break;
	case OPT_SUBTYPE:
		if (!value_ok(val, sizeof(o->subtype) - 1, true))
			return fail(-EINVAL, err, errlen, "subtype wants 1 to %zu of [A-Za-z0-9_-]",
				    sizeof(o->subtype) - 1);
		snprintf(o->subtype, sizeof(o->subtype), "%s", val);
		break;
	}
	return 0;
}

static int take_name(const char *src, char *dst, char *err, size_t errlen)
{
	int rc = broker_name_check(src, err, errlen);

	if (rc == 0)
		snprintf(dst, BROKER_NAME_MAX + 1, "%s", src);
	return rc;
}

int broker_request_parse(const uint8_t *buf, size_t len, size_t nfds, struct broker_req *out,
			 char *err, size_t errlen)
{
	Ferry__Broker__Request *q;
	size_t want_fds = 0;
	int rc = 0;

	memset(out, 0, sizeof(*out));
	if (len > BROKER_FRAME_MAX)
		return fail(-EMSGSIZE, err, errlen, "request of %zu bytes", len);
	q = ferry__broker__request__unpack(NULL, len, buf);
	if (!q)
		return fail(-EBADMSG, err, errlen, "undecodable request (%zu bytes)", len);
	out->id = q->id;
	if (q->version != V) {
		rc = fail(-EPROTONOSUPPORT, err, errlen, "request version %u, this broker speaks %u",
			  q->version, V);
		goto out;
	}
	switch (q->body_case) {
	case FERRY__BROKER__REQUEST__BODY_MOUNT: {
		unsigned seen = 0;

		out->type = BROKER_MSG_MOUNT;
		rc = take_name(q->mount->name, out->name, err, errlen);
		if (rc < 0)
			break;
		out->has_name = true;
		if (q->mount->n_options > BROKER_OPTIONS_MAX) {
			rc = fail(-EINVAL, err, errlen, "%zu mount options, at most %u",
				  q->mount->n_options, BROKER_OPTIONS_MAX);
			break;
		}
		for (size_t i = 0; i < q->mount->n_options && rc == 0; i++)
			rc = broker_option_parse(q->mount->options[i], &out->opts, &seen, err,
						 errlen);
		break;
	}
	case FERRY__BROKER__REQUEST__BODY_UMOUNT:
		out->type = BROKER_MSG_UMOUNT;
		if (q->umount->name && q->umount->has_mount_id) {
			rc = fail(-EINVAL, err, errlen, "umount by name or by id, not both");
		} else if (q->umount->name) {
			rc = take_name(q->umount->name, out->name, err, errlen);
			out->has_name = true;
		} else if (q->umount->has_mount_id && q->umount->mount_id) {
			out->mount_id = q->umount->mount_id;
		} else {
			rc = fail(-EINVAL, err, errlen, "umount needs a name or a mount id");
		}
		break;
	case FERRY__BROKER__REQUEST__BODY_ATTACH:
		out->type = BROKER_MSG_ATTACH;
		want_fds = 1;
		rc = take_name(q->attach->name, out->name, err, errlen);
		out->has_name = true;
		break;
	case FERRY__BROKER__REQUEST__BODY_REATTACH:
		out->type = BROKER_MSG_REATTACH;
		rc = take_name(q->reattach->name, out->name, err, errlen);
		out->has_name = true;
		break;
	case FERRY__BROKER__REQUEST__BODY_BACKING_OPEN:
		out->type = BROKER_MSG_BACKING_OPEN;
		want_fds = 1;
		out->mount_id = q->backing_open->mount_id;
		if (!out->mount_id)
			rc = fail(-EINVAL, err, errlen, "mount id 0");
		break;
	case FERRY__BROKER__REQUEST__BODY_BACKING_CLOSE:
		out->type = BROKER_MSG_BACKING_CLOSE;
		out->mount_id = q->backing_close->mount_id;
		out->backing_id = q->backing_close->backing_id;
		if (!out->mount_id)
			rc = fail(-EINVAL, err, errlen, "mount id 0");
		else if (out->backing_id == 0 || out->backing_id > INT32_MAX)
			rc = fail(-EINVAL, err, errlen, "backing id %" PRIu32 " out of range",
				  out->backing_id);
		break;
	case FERRY__BROKER__REQUEST__BODY_BACKING_OPEN_MANY:
		out->type = BROKER_MSG_BACKING_OPEN_MANY;
		out->mount_id = q->backing_open_many->mount_id;
		want_fds = nfds;
		if (!out->mount_id)
			rc = fail(-EINVAL, err, errlen, "mount id 0");
		else if (nfds == 0 || nfds > BROKER_FDS_MAX)
			rc = fail(-EBADF, err, errlen, "BACKING_OPEN_MANY takes 1 to %u fds, %zu came "
				  "with it", BROKER_FDS_MAX, nfds);
		break;
	case FERRY__BROKER__REQUEST__BODY_BACKING_CLOSE_MANY: {
		const Ferry__Broker__BackingCloseMany *m = q->backing_close_many;

		out->type = BROKER_MSG_BACKING_CLOSE_MANY;
		out->mount_id = m->mount_id;
		if (!out->mount_id) {
			rc = fail(-EINVAL, err, errlen, "mount id 0");
			break;
		}
		if (m->n_backing_ids == 0 || m->n_backing_ids > BROKER_CLOSE_MANY_MAX) {
			rc = fail(-EINVAL, err, errlen, "%zu backing ids, not 1 to %u",
				  m->n_backing_ids, BROKER_CLOSE_MANY_MAX);
			break;
		}
		for (size_t k = 0; k < m->n_backing_ids; k++) {
			if (m->backing_ids[k] == 0 || m->backing_ids[k] > INT32_MAX) {
				rc = fail(-EINVAL, err, errlen, "backing id %" PRIu32 " out of range",
					  m->backing_ids[k]);
				break;
			}
			out->backing_ids[k] = m->backing_ids[k];
		}
		out->nids = m->n_backing_ids;
		break;
	}
	case FERRY__BROKER__REQUEST__BODY_STATUS:
		out->type = BROKER_MSG_STATUS;
		break;
	default:
		rc = fail(-EOPNOTSUPP, err, errlen, "unknown request type");
		goto out;
	}
	if (rc == 0 && nfds != want_fds)
		rc = fail(-EBADF, err, errlen, "%s takes %zu fd%s, %zu came with it",
			  broker_msg_name(out->type), want_fds, want_fds == 1 ? "" : "s", nfds);
out:
	ferry__broker__request__free_unpacked(q, NULL);
	if (rc < 0) {
		uint64_t id = out->id;
		memset(out, 0, sizeof(*out));
		out->id = id;
	}
	return rc;
}

int broker_request_permitted(const struct policy_rule *rule, const struct broker_req *q,
			     char *err, size_t errlen)
{
	if (q->type == BROKER_MSG_STATUS)
		return 0;
	if (!rule)
		return fail(-EPERM, err, errlen, "%s refused: no policy rule allows this peer",
			    broker_msg_name(q->type));
	if (q->type == BROKER_MSG_MOUNT && q->opts.allow_other && !rule->allow_other)
		return fail(-EPERM, err, errlen, "allow_other is not allowed for this peer (policy "
			    "line %u has no allow_other=1)", rule->line);
	return 0;
}

int broker_reply_encode(const struct broker_rep *rep, uint8_t *buf, size_t *len)
{
	Ferry__Broker__Reply r = FERRY__BROKER__REPLY__INIT;
	Ferry__Broker__Mounted m = FERRY__BROKER__MOUNTED__INIT;
	Ferry__Broker__Attached a = FERRY__BROKER__ATTACHED__INIT;
	Ferry__Broker__BackingOpened bo = FERRY__BROKER__BACKING_OPENED__INIT;
	Ferry__Broker__Status s = FERRY__BROKER__STATUS__INIT;
	Ferry__Broker__BackingOpenedMany bom = FERRY__BROKER__BACKING_OPENED_MANY__INIT;
	Ferry__Broker__BackingClosedMany bcm = FERRY__BROKER__BACKING_CLOSED_MANY__INIT;
	uint32_t errs[BROKER_CLOSE_MANY_MAX];
	uint32_t ids[BROKER_CLOSE_MANY_MAX];
	size_t n;

	if (rep->nmany > BROKER_CLOSE_MANY_MAX)
		return -EINVAL;
	for (size_t k = 0; k < rep->nmany; k++) {
		errs[k] = (uint32_t)(rep->many_errors[k] < 0 ? -rep->many_errors[k] : 0);
		ids[k] = errs[k] ? 0 : rep->many_ids[k];
	}

	r.version = V;
	r.id = rep->id;
	r.error = (uint32_t)(rep->error < 0 ? -rep->error : rep->error);
	if (rep->message[0])
		r.message = (char *)rep->message;
	if (rep->closing) {
		r.has_closing = 1;
		r.closing = 1;
	}
	if (rep->error == 0) {
		switch (rep->type) {
		case BROKER_MSG_MOUNT:
			m.mount_id = rep->mount_id;
			r.body_case = FERRY__BROKER__REPLY__BODY_MOUNTED;
			r.mounted = &m;
			break;
		case BROKER_MSG_ATTACH:
		case BROKER_MSG_REATTACH:
			a.mount_id = rep->mount_id;
			r.body_case = FERRY__BROKER__REPLY__BODY_ATTACHED;
			r.attached = &a;
			break;
		case BROKER_MSG_BACKING_OPEN:
			bo.backing_id = rep->backing_id;
			r.body_case = FERRY__BROKER__REPLY__BODY_BACKING_OPENED;
			r.backing_opened = &bo;
			break;
		case BROKER_MSG_BACKING_OPEN_MANY:
			bom.n_backing_ids = bom.n_errors = rep->nmany;
			bom.backing_ids = ids;
			bom.errors = errs;
			r.body_case = FERRY__BROKER__REPLY__BODY_BACKING_OPENED_MANY;
			r.backing_opened_many = &bom;
			break;
		case BROKER_MSG_BACKING_CLOSE_MANY:
			bcm.n_errors = rep->nmany;
			bcm.errors = errs;
			r.body_case = FERRY__BROKER__REPLY__BODY_BACKING_CLOSED_MANY;
			r.backing_closed_many = &bcm;
			break;
		case BROKER_MSG_STATUS:
			s.connections = rep->status.connections;
			s.peers = rep->status.peers;
			s.mounts = rep->status.mounts;
			s.backing_ids = rep->status.backing_ids;
			s.fds = rep->status.fds;
			s.requests = rep->status.requests;
			s.refusals = rep->status.refusals;
			if (rep->status.root[0])
				s.root = (char *)rep->status.root;
			if (rep->status.features) {
				s.has_features = 1;
				s.features = rep->status.features;
			}
			r.body_case = FERRY__BROKER__REPLY__BODY_STATUS;
			r.status = &s;
			break;
		default:
			break;
		}
	}
	n = ferry__broker__reply__get_packed_size(&r);
	if (n > BROKER_FRAME_MAX)
		return -EMSGSIZE;
	*len = ferry__broker__reply__pack(&r, buf);
	return 0;
}
