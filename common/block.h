/*
 * block: the stored form of one object of a slice. An object holds the data
 * followed by an 8-byte trailer: the magic "FYb1" and the CRC-32 (zlib) of
 * the data, little-endian. A reader checks the trailer before it trusts a
 * byte, so a damaged or truncated object is an error (-EIO), never wrong
 * data. The object's name carries the data length (slice.h).
 */
#ifndef FERRY_BLOCK_H
#define FERRY_BLOCK_H

#include <stddef.h>
#include <stdint.h>

#define BLOCK_TRAILER 8u

/* Appends the trailer after buf[0..len); buf must have BLOCK_TRAILER more
 * bytes of room. Returns the stored length (len + BLOCK_TRAILER). */
size_t block_seal(void *buf, size_t len);
/* A 64-bit fingerprint of data (XXH3, from libxxhash: ~10x faster than
 * zlib's CRC-32, and an fsync of a passthrough file fingerprints all of
 * it): tells whether a piece changed since it was last stored. Not stored
 * anywhere, so it may change between versions. */
uint64_t block_fingerprint(const void *buf, size_t len);
/* Checks a stored object of stored_len bytes that should hold data_len
 * bytes of data. Returns 0, or -EIO if the length, magic or CRC is wrong. */
int block_verify(const void *buf, size_t stored_len, size_t data_len);

/* block_verify() of a stored object whose bytes arrive in pieces, in order
 * (a GET streamed to a file): init with the data length it should hold,
 * feed every piece, then end says 0 or -EIO. No allocation; the caller
 * owns the struct. */
struct block_check {
	size_t data_len;
	size_t seen;                       /* bytes fed so far */
	uint32_t crc;                      /* of the data bytes fed */
	unsigned char t[BLOCK_TRAILER];    /* the trailer bytes fed */
};
void block_check_init(struct block_check *k, size_t data_len);
void block_check_feed(struct block_check *k, const void *buf, size_t len);
int block_check_end(const struct block_check *k);

#endif
