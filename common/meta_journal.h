/*
 * meta_journal: the metadata journal's records and file. A daemon that
 * defers its metadata commits (meta_journal_open) appends one record per
 * namespace change to a local file before it answers the caller, so a
 * killed daemon loses none of them: the next open replays every record past
 * the last one the database took. This module only encodes, decodes and
 * scans records; what a record means is the engine's business.
 *
 * A record on disk: magic "FJr1", the body's length (u32), the body's
 * CRC-32 (zlib), then the body: seq (u64), op (u8), the time the change was
 * made (i64 seconds, u32 nanoseconds), MJ_INTS integers (u64 each) and
 * MJ_STRS byte strings (u32 length, bytes). Little-endian. A record that is
 * cut short or fails its CRC ends the journal (a torn tail after a power
 * loss: nothing after it was acknowledged durable).
 */
#ifndef FERRY_META_JOURNAL_H
#define FERRY_META_JOURNAL_H

#include <stddef.h>
#include <stdint.h>
#include <time.h>

#define MJ_INTS 12
#define MJ_STRS 2
/* A body's largest size: an xattr value (64 KiB) and its name, with room. */
#define MJ_BODY_MAX (80u << 10)
#define MJ_HEAD 12

enum mj_op {
	MJ_CREATE = 1,
	MJ_LINK,
	MJ_UNLINK,
	MJ_RMDIR,
	MJ_RENAME,
	MJ_SETATTR,
	MJ_SETXATTR,
	MJ_REMOVEXATTR,
	MJ_RELEASE,
	MJ_OP_MAX = MJ_RELEASE
};

/* One record. Strings point into the caller's memory (encode) or into the
 * buffer decoded (decode): never owned by the record. */
struct mj_rec {
	uint64_t seq;
	uint8_t op;
	struct timespec now;
	uint64_t v[MJ_INTS];
	const void *s[MJ_STRS];
	uint32_t slen[MJ_STRS];
};

/* Bytes mj_encode() needs for r. */
size_t mj_size(const struct mj_rec *r);
/* Writes r to buf (cap bytes, at least mj_size(r)); returns the length, or 0
 * if it does not fit or the body would pass MJ_BODY_MAX. */
size_t mj_encode(const struct mj_rec *r, void *buf, size_t cap);
/* Reads one record from buf[0..len): returns its length and fills r
 * (strings point into buf), 0 if buf ends inside a record, or -1 if the
 * bytes are not a valid record (bad magic, length, CRC or op). */
long mj_decode(const void *buf, size_t len, struct mj_rec *r);

#endif
