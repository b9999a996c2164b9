/*
 * libFuzzer target: what a peer of ferry-brokerd can put in a frame. The
 * input is one frame's payload; it goes through broker_request_parse() --
 * the function the server runs on every frame before any handler, with no
 * fds, with one, with two and with the most a frame carries (as if they
 * had come with it) -- and, for a request that
 * passes, broker_request_permitted() against a rule with and without
 * allow_other and against no rule (a peer the policy does not know), then
 * the encoding of its reply. Nothing here mounts, opens or ioctls: the
 * effects live in the handlers, which this never calls.
 *
 * Checks: nothing crashes or leaks; a request that passes has a type, a
 * name that passes broker_name_check() where it has one, the right number
 * of fds, options within their bounds; a refusal says why; replies fit a
 * frame.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "brokerd.h"

static void check_passed(const struct broker_req *q, size_t nfds)
{
	struct policy_rule rule = { .uid = 65534, .root = "/srv/pods", .max_mounts = 16,
				    .max_backing = 4096, .line = 1 };
	struct broker_rep rep = { .id = q->id, .type = q->type, .fd = -1 };
	uint8_t out[BROKER_FRAME_MAX];
	char err[BROKER_MSG_MAX];
	size_t len;
	int rc;

	if (q->type < BROKER_MSG_MOUNT || q->type >= BROKER_MSG_COUNT)
		abort();
	if (q->type == BROKER_MSG_BACKING_OPEN_MANY) {
		if (nfds < 1 || nfds > BROKER_FDS_MAX)
			abort();
	} else if ((q->type == BROKER_MSG_ATTACH || q->type == BROKER_MSG_BACKING_OPEN) !=
		   (nfds == 1)) {
		abort();
	}
	if (q->type == BROKER_MSG_BACKING_CLOSE_MANY) {
		if (q->nids < 1 || q->nids > BROKER_CLOSE_MANY_MAX)
			abort();
		for (size_t k = 0; k < q->nids; k++)
			if (q->backing_ids[k] == 0 || q->backing_ids[k] > INT32_MAX)
				abort();
	}
	if (q->has_name && broker_name_check(q->name, NULL, 0) != 0)
		abort();
	if ((q->type == BROKER_MSG_MOUNT || q->type == BROKER_MSG_ATTACH) && !q->has_name)
		abort();
	if (q->type == BROKER_MSG_UMOUNT && !q->has_name && q->mount_id == 0)
		abort();
	if (q->type == BROKER_MSG_BACKING_CLOSE && (q->backing_id == 0 || q->backing_id > INT32_MAX))
		abort();
	if (q->opts.max_read > (1u << 30) || strlen(q->opts.fsname) >= sizeof(q->opts.fsname) ||
	    strlen(q->opts.subtype) >= sizeof(q->opts.subtype))
		abort();

	/* The policy's word, for a peer with and without allow_other, and for
	 * one no rule matches. */
	err[0] = '\0';
	rc = broker_request_permitted(&rule, q, err, sizeof(err));
	if (rc != (q->opts.allow_other ? -EPERM : 0) || (rc && !err[0]))
		abort();
	rule.allow_other = 1;
	if (broker_request_permitted(&rule, q, err, sizeof(err)) != 0)
		abort();
	rc = broker_request_permitted(NULL, q, err, sizeof(err));
	if (rc != (q->type == BROKER_MSG_STATUS ? 0 : -EPERM))
		abort();

	/* Its replies: success and refusal both fit a frame. */
	rep.mount_id = q->mount_id;
	rep.backing_id = q->backing_id ? q->backing_id : 1;
	/* The largest _MANY reply: every item a refusal or an id near the top. */
	if (q->type == BROKER_MSG_BACKING_OPEN_MANY || q->type == BROKER_MSG_BACKING_CLOSE_MANY) {
		rep.nmany = q->type == BROKER_MSG_BACKING_OPEN_MANY ? nfds : q->nids;
		for (size_t k = 0; k < rep.nmany; k++) {
			rep.many_ids[k] = INT32_MAX;
			rep.many_errors[k] = k % 2 ? -EDQUOT : 0;
		}
		memset(rep.message, 'y', sizeof(rep.message) - 1);
	}
	if (broker_reply_encode(&rep, out, &len) != 0 || len > BROKER_FRAME_MAX)
		abort();
	rep.error = -EPERM;
	rep.closing = true;
	memset(rep.message, 'x', sizeof(rep.message) - 1);
	if (broker_reply_encode(&rep, out, &len) != 0 || len > BROKER_FRAME_MAX)
		abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const size_t counts[] = { 0, 1, 2, BROKER_FDS_MAX, BROKER_FDS_MAX + 1 };

	for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++) {
		size_t nfds = counts[c];
		struct broker_req q;
		char err[BROKER_MSG_MAX];
		int rc;

		err[0] = '\0';
		rc = broker_request_parse(data, size, nfds, &q, err, sizeof(err));
		if (rc == 0) {
			check_passed(&q, nfds);
		} else {
			/* A refusal names its reason and ends the connection with
			 * one of the documented errors. */
			if (!err[0])
				abort();
			if (rc != -EBADMSG && rc != -EPROTONOSUPPORT && rc != -EOPNOTSUPP &&
			    rc != -EBADF && rc != -EINVAL && rc != -EMSGSIZE)
				abort();
		}
	}
	return 0;
}
