/* The hand-over state of `ferry mount --upgrade` (common/handover_blob.c):
 * what a daemon sends is accepted as sent, and every check that keeps a
 * new daemon from acting on a state no daemon could have sent refuses it
 * with a message. */
#include "handover_blob.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <linux/fuse.h>
#include <stdlib.h>
#include <string.h>

#include "handle_table.h"

struct sample {
	uint8_t init[sizeof(struct fuse_in_header) + 64];
	Ferry__Handover__Handle h[3], *hp[3];
	Ferry__Handover__Staged s[2], *sp[2];
	Ferry__Handover__Kept c[2], *cp[2];
	uint8_t prints[2 * HANDOVER_PRINT_BYTES];
	Ferry__Handover__Handover msg;
};

/* A mount with a directory handle, a .control handle, two passthrough
 * writers of two files and local copies of two others. */
static void sample(struct sample *x)
{
	struct fuse_in_header hdr = { .len = sizeof(x->init), .opcode = FUSE_INIT, .unique = 2 };
	static const uint64_t fhs[3] = { 0x1000001, 0x2000002, 0x1000003 };
	static const uint32_t types[3] = { HANDLE_DIR, HANDLE_SPECIAL, HANDLE_FILE };

	memset(x, 0, sizeof(*x));
	memcpy(x->init, &hdr, sizeof(hdr));
	for (int k = 0; k < 3; k++) {
		ferry__handover__handle__init(&x->h[k]);
		x->h[k].fh = fhs[k];
		x->h[k].type = types[k];
		x->h[k].ino = 1 + (uint64_t)k;
		x->h[k].has_passthrough = x->h[k].has_writer = k == 2;
		x->h[k].passthrough = x->h[k].writer = k == 2;
		x->hp[k] = &x->h[k];
	}
	for (int k = 0; k < 2; k++) {
		ferry__handover__staged__init(&x->s[k]);
		x->s[k].ino = 3 + (uint64_t)k;
		x->s[k].name = k ? "4-77-88-1-s9.p" : "3-77-88-1-s8.p";
		x->s[k].backing_id = 1 + k;
		x->s[k].has_mtime_nsec = true;
		x->s[k].mtime_nsec = 999999999;
		x->s[k].has_prints = k == 1;
		x->s[k].prints.data = x->prints;
		x->s[k].prints.len = k == 1 ? sizeof(x->prints) : 0;
		x->sp[k] = &x->s[k];
	}
	for (int k = 0; k < 2; k++) {
		ferry__handover__kept__init(&x->c[k]);
		x->c[k].ino = 5 + (uint64_t)k;
		x->c[k].name = k ? ".kept-41-6-u3" : ".kept-41-5-2";
		x->c[k].size = 1 << 20;
		x->c[k].has_ctime_sec = x->c[k].has_ctime_nsec = true;
		x->c[k].ctime_sec = 1796478563;
		x->c[k].ctime_nsec = 32355176;
		x->cp[k] = &x->c[k];
	}
	ferry__handover__handover__init(&x->msg);
	x->msg.version = HANDOVER_VERSION;
	x->msg.init.data = x->init;
	x->msg.init.len = sizeof(x->init);
	x->msg.n_handles = 3;
	x->msg.handles = x->hp;
	x->msg.n_staged = 2;
	x->msg.staged = x->sp;
	x->msg.n_kept = 2;
	x->msg.kept = x->cp;
}

/* Packs x and decodes it: the decoder's result, its message in err. */
static int decode(struct sample *x, Ferry__Handover__Handover **out, char *err, size_t errlen)
{
	size_t len = ferry__handover__handover__get_packed_size(&x->msg);
	uint8_t *buf = malloc(len);
	int rc;

	cr_assert_not_null(buf);
	ferry__handover__handover__pack(&x->msg, buf);
	err[0] = '\0';
	rc = handover_blob_decode(buf, len, out, err, errlen);
	free(buf);
	return rc;
}

Test(handover_blob, what_a_daemon_sends_comes_back)
{
	struct sample x;
	Ferry__Handover__Handover *ho;
	char err[256];

	sample(&x);
	cr_assert_eq(decode(&x, &ho, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(ho->n_handles, 3);
	cr_assert_eq(ho->n_staged, 2);
	cr_assert_eq(ho->handles[2]->fh, 0x1000003);
	cr_assert(ho->handles[2]->passthrough);
	cr_assert_str_eq(ho->staged[1]->name, "4-77-88-1-s9.p");
	cr_assert_eq(ho->staged[1]->prints.len, 2 * HANDOVER_PRINT_BYTES);
	cr_assert_eq(ho->init.len, sizeof(x.init));
	cr_assert_eq(ho->n_kept, 2);
	cr_assert_str_eq(ho->kept[1]->name, ".kept-41-6-u3");
	cr_assert_eq(ho->kept[1]->ino, 6);
	cr_assert_eq(ho->kept[1]->size, 1 << 20);
	cr_assert_eq(ho->kept[1]->ctime_nsec, 32355176);
	handover_blob_free(ho);
}

/* One change to the sample per case, and a word the message must hold. */
static void refused(void (*spoil)(struct sample *), int want, const char *word)
{
	struct sample x;
	Ferry__Handover__Handover *ho = (void *)1;
	char err[256];
	int rc;

	sample(&x);
	spoil(&x);
	rc = decode(&x, &ho, err, sizeof(err));
	cr_assert_eq(rc, want, "got %d (%s), want %d", rc, err, want);
	cr_assert_null(ho);
	cr_assert(strstr(err, word), "message \"%s\" lacks \"%s\"", err, word);
}

static void newer(struct sample *x) { x->msg.version = 2; }
static void init_short(struct sample *x) { x->msg.init.len = 20; }
static void init_not_init(struct sample *x)
{
	struct fuse_in_header h;

	memcpy(&h, x->init, sizeof(h));
	h.opcode = FUSE_LOOKUP;
	memcpy(x->init, &h, sizeof(h));
}
static void init_len_lies(struct sample *x) { x->msg.init.len -= 8; }
static void fh_twice(struct sample *x) { x->h[1].fh = x->h[0].fh; }
static void fh_zero(struct sample *x) { x->h[0].fh = 0; }
static void type_unknown(struct sample *x) { x->h[0].type = 9; }
static void pt_dir(struct sample *x) { x->h[0].has_passthrough = x->h[0].passthrough = true; }
static void name_escapes(struct sample *x) { x->s[0].name = "../meta.db"; }
static void name_job(struct sample *x) { x->s[0].name = "3-77-88-1-s8.p.job"; }
static void name_twice(struct sample *x) { x->s[1].name = x->s[0].name; }
static void ino_twice(struct sample *x) { x->s[1].ino = x->s[0].ino; }
static void backing_zero(struct sample *x) { x->s[1].backing_id = 0; }
static void nsec_big(struct sample *x) { x->s[0].mtime_nsec = 1000000000u; }
static void kept_escapes(struct sample *x) { x->c[0].name = ".kept-/../../meta.db"; }
static void kept_not_kept(struct sample *x) { x->c[0].name = "3-77-88-1-s8.p"; }
static void kept_long(struct sample *x)
{
	x->c[0].name = ".kept-4100000000000000000000000000000000000000000000000000000000000000";
}
static void kept_twice(struct sample *x) { x->c[1].ino = x->c[0].ino; }
static void kept_name_twice(struct sample *x) { x->c[1].name = x->c[0].name; }
static void kept_and_staged(struct sample *x) { x->c[0].ino = x->s[1].ino; }
static void kept_empty(struct sample *x) { x->c[1].size = 0; }
static void kept_nsec_big(struct sample *x) { x->c[1].ctime_nsec = 1000000000u; }
static void prints_ragged(struct sample *x)
{
	static const uint8_t p[HANDOVER_PRINT_BYTES + 5];

	x->s[0].has_prints = true;
	x->s[0].prints.data = (uint8_t *)p;
	x->s[0].prints.len = sizeof(p);
}

Test(handover_blob, what_no_daemon_sends_is_refused)
{
	refused(newer, -EPROTO, "version 2");
	refused(init_short, -EBADMSG, "INIT");
	refused(init_not_init, -EBADMSG, "INIT");
	refused(init_len_lies, -EBADMSG, "INIT");
	refused(fh_twice, -EBADMSG, "twice");
	refused(fh_zero, -EBADMSG, "fh 0");
	refused(type_unknown, -EBADMSG, "unknown type");
	refused(pt_dir, -EBADMSG, "passthrough");
	refused(name_escapes, -EBADMSG, "name");
	refused(name_job, -EBADMSG, "name");
	refused(name_twice, -EBADMSG, "twice");
	refused(ino_twice, -EBADMSG, "two staging files");
	refused(backing_zero, -EBADMSG, "backing id 0");
	refused(nsec_big, -EBADMSG, "nanoseconds");
	refused(prints_ragged, -EBADMSG, "fingerprints");
	refused(kept_escapes, -EBADMSG, "local copy's name");
	refused(kept_not_kept, -EBADMSG, "local copy's name");
	refused(kept_long, -EBADMSG, "local copy's name");
	refused(kept_twice, -EBADMSG, "two local copies");
	refused(kept_name_twice, -EBADMSG, "given twice");
	refused(kept_and_staged, -EBADMSG, "a staging file and a local copy");
	refused(kept_empty, -EBADMSG, "0 bytes");
	refused(kept_nsec_big, -EBADMSG, "ctime nanoseconds");
}

Test(handover_blob, bytes_that_are_no_state_are_refused)
{
	static const uint8_t junk[] = { 0xff, 0xff, 0xff, 0x01 };
	Ferry__Handover__Handover *ho = (void *)1;
	char err[128];

	cr_assert_eq(handover_blob_decode(junk, sizeof(junk), &ho, err, sizeof(err)), -EBADMSG);
	cr_assert_null(ho);
	cr_assert_eq(handover_blob_decode(junk, 0, &ho, err, sizeof(err)), -EBADMSG);
	cr_assert(fuse_init_request_valid(NULL, 0) == false);
}
