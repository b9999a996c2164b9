/*
 * handover_blob: the state one ferry-mountd hands the next at `ferry mount
 * --upgrade` (proto/handover.proto), decoded and checked before any of it
 * is used. It reaches the new daemon through the CLI in a memfd: the same
 * user wrote it, but a daemon still refuses what it cannot have sent
 * (an INIT that is not one, handles of an unknown type or given twice,
 * staging or local copies' names outside the staging directory, a backing
 * id of 0) with a message, rather than acting on it. mountd/handover.c sends and uses it.
 *
 * Ownership: a decoded message is the caller's, freed with
 * handover_blob_free().
 */
#ifndef FERRY_HANDOVER_BLOB_H
#define FERRY_HANDOVER_BLOB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "handover.pb-c.h"

#define HANDOVER_VERSION 1u
#define HANDOVER_MAX (64u << 20)
/* The kernel's FUSE_INIT request as read from /dev/fuse: its header and
 * the init_in of any protocol version up to the newest. */
#define HANDOVER_INIT_MAX 512u
/* One fingerprint in Staged.prints, and at most how many (1 TiB of
 * 64 KiB units). */
#define HANDOVER_PRINT_BYTES 12u
#define HANDOVER_PRINTS_MAX (1u << 24)

/* A local copy's name (Kept.name): local_copy_name_ok()'s, shorter than
 * this. */
#define HANDOVER_KEPT_NAME_MAX 64u
/* At most this many local copies go over (the rest are removed): each
 * costs a metadata read on both sides while the mount is paused. */
#define HANDOVER_KEPT_MAX 1024u
bool handover_kept_name_valid(const char *name);

/* Whether buf[0..len) is a FUSE_INIT request whose header says len. */
bool fuse_init_request_valid(const uint8_t *buf, size_t len);

/* 0 and *out, or -EBADMSG (not a Handover, or fails a check), -EPROTO (a
 * version this daemon does not know), -ENOMEM; err says which. */
int handover_blob_decode(const uint8_t *buf, size_t len, Ferry__Handover__Handover **out,
			 char *err, size_t errlen);
void handover_blob_free(Ferry__Handover__Handover *ho); /* accepts NULL */

#endif
