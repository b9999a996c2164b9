/* libFuzzer target: the state a ferry-mountd hands the next (`ferry mount
 * --upgrade`) is decoded and checked without a crash or a leak; one that
 * is accepted keeps every promise the daemon relies on, and the same
 * state packed as a daemon would send it (known fields only: protobuf-c
 * keeps unknown ones, field number 0 included, which it then cannot read
 * back) decodes again. */
#include <stdlib.h>
#include <string.h>

#include "handle_table.h"
#include "handover_blob.h"
#include "reconcile_job.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	Ferry__Handover__Handover *ho = NULL, *again = NULL;
	Ferry__Handover__Handover msg = FERRY__HANDOVER__HANDOVER__INIT;
	Ferry__Handover__Handle *h;
	Ferry__Handover__Staged *st;
	uint8_t *buf = NULL;
	char err[256];
	size_t len;

	err[0] = '\0';
	if (handover_blob_decode(data, size, &ho, err, sizeof(err)) < 0) {
		if (ho || !err[0] || !memchr(err, '\0', sizeof(err)))
			abort();
		return 0;
	}
	if (!fuse_init_request_valid(ho->init.data, ho->init.len))
		abort();
	for (size_t k = 0; k < ho->n_handles; k++)
		if (ho->handles[k]->fh == 0 || ho->handles[k]->type < HANDLE_FILE ||
		    ho->handles[k]->type > HANDLE_SPECIAL)
			abort();
	for (size_t k = 0; k < ho->n_staged; k++)
		if (reconcile_name_check(ho->staged[k]->name) < 0 || ho->staged[k]->backing_id <= 0 ||
		    ho->staged[k]->prints.len % HANDOVER_PRINT_BYTES)
			abort();
	msg.version = ho->version;
	msg.init = ho->init;
	msg.has_broker_mount_id = ho->has_broker_mount_id;
	msg.broker_mount_id = ho->broker_mount_id;
	msg.n_handles = ho->n_handles;
	msg.n_staged = ho->n_staged;
	msg.handles = calloc(ho->n_handles + 1, sizeof(*msg.handles));
	msg.staged = calloc(ho->n_staged + 1, sizeof(*msg.staged));
	h = calloc(ho->n_handles + 1, sizeof(*h));
	st = calloc(ho->n_staged + 1, sizeof(*st));
	if (!msg.handles || !msg.staged || !h || !st)
		abort();
	for (size_t k = 0; k < ho->n_handles; k++) {
		const Ferry__Handover__Handle *from = ho->handles[k];

		ferry__handover__handle__init(&h[k]);
		h[k].fh = from->fh;
		h[k].type = from->type;
		h[k].ino = from->ino;
		h[k].has_writer = h[k].has_passthrough = h[k].has_setid_clear = true;
		h[k].writer = from->writer;
		h[k].passthrough = from->passthrough;
		h[k].setid_clear = from->setid_clear;
		msg.handles[k] = &h[k];
	}
	for (size_t k = 0; k < ho->n_staged; k++) {
		const Ferry__Handover__Staged *from = ho->staged[k];

		ferry__handover__staged__init(&st[k]);
		st[k].ino = from->ino;
		st[k].name = from->name;
		st[k].backing_id = from->backing_id;
		st[k].has_mtime_set = st[k].has_mtime_sec = st[k].has_mtime_nsec = true;
		st[k].mtime_set = from->mtime_set;
		st[k].mtime_sec = from->mtime_sec;
		st[k].mtime_nsec = from->mtime_nsec;
		st[k].has_prints = from->has_prints;
		st[k].prints = from->prints;
		msg.staged[k] = &st[k];
	}
	len = ferry__handover__handover__get_packed_size(&msg);
	buf = malloc(len ? len : 1);
	if (!buf)
		abort();
	ferry__handover__handover__pack(&msg, buf);
	if (handover_blob_decode(buf, len, &again, err, sizeof(err)) < 0 ||
	    again->n_handles != ho->n_handles || again->n_staged != ho->n_staged)
		abort();
	free(h);
	free(st);
	free(msg.handles);
	free(msg.staged);
	free(buf);
	handover_blob_free(again);
	handover_blob_free(ho);
	return 0;
}
