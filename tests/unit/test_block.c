/* Unit tests for common/block.c: sealed objects verify, damaged ones do
 * not, and the streamed check (block_check_*) agrees with block_verify()
 * however the bytes are cut into pieces. */
#include <criterion/criterion.h>

#include <stdlib.h>
#include <string.h>

#include <zlib.h>

#include "block.h"

/* xorshift: the same bytes and cuts at every run. */
static uint64_t next(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

/* Streams buf[0..len) in pieces of random lengths (some empty, some
 * longer than what is left) into a check for data_len. */
static int streamed(const unsigned char *buf, size_t len, size_t data_len, uint64_t *seed)
{
	struct block_check k;
	size_t at = 0;

	block_check_init(&k, data_len);
	while (at < len) {
		size_t n = next(seed) % 5000;

		if (n > len - at)
			n = len - at;
		block_check_feed(&k, buf + at, n);
		at += n;
	}
	return block_check_end(&k);
}

Test(block, streamed_check_agrees_with_verify)
{
	static const size_t sizes[] = { 0, 1, 7, 8, 9, 4095, 4096, 70001 };
	uint64_t seed = 0x9e3779b97f4a7c15ull;

	for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
		size_t len = sizes[s];
		unsigned char *buf = malloc(len + BLOCK_TRAILER + 1);

		for (size_t i = 0; i < len; i++)
			buf[i] = (unsigned char)next(&seed);
		cr_assert_eq(block_seal(buf, len), len + BLOCK_TRAILER);
		cr_assert_eq(block_verify(buf, len + BLOCK_TRAILER, len), 0);
		for (int cut = 0; cut < 20; cut++)
			cr_assert_eq(streamed(buf, len + BLOCK_TRAILER, len, &seed), 0,
				     "%zu bytes: a whole object failed the streamed check", len);
		/* One byte flipped anywhere, data or trailer. */
		for (size_t i = 0; i < len + BLOCK_TRAILER; i += 1 + len / 16) {
			buf[i] ^= 0x20;
			cr_assert_neq(block_verify(buf, len + BLOCK_TRAILER, len), 0);
			cr_assert_neq(streamed(buf, len + BLOCK_TRAILER, len, &seed), 0,
				      "%zu bytes: byte %zu flipped passed", len, i);
			buf[i] ^= 0x20;
		}
		/* Shorter or longer than the length the name gives. */
		cr_assert_neq(streamed(buf, len + BLOCK_TRAILER - 1, len, &seed), 0);
		buf[len + BLOCK_TRAILER] = 0;
		cr_assert_neq(streamed(buf, len + BLOCK_TRAILER + 1, len, &seed), 0);
		if (len > 0)
			cr_assert_neq(streamed(buf, len + BLOCK_TRAILER, len - 1, &seed), 0);
		free(buf);
	}
}

Test(block, a_check_fed_nothing_fails)
{
	struct block_check k;

	block_check_init(&k, 0);
	cr_assert_neq(block_check_end(&k), 0);
}

/* The trailer's CRC is zlib's CRC-32, little-endian after "FYb1": objects
 * stored by any version (and any other tool) read back. */
Test(block, the_trailer_is_zlib_crc32)
{
	static const size_t sizes[] = { 0, 1, 3, 64, 1000, 1 << 20 };
	uint64_t seed = 42;

	for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
		size_t len = sizes[s];
		unsigned char *buf = malloc(len + BLOCK_TRAILER);
		uint32_t want, got = 0;

		for (size_t i = 0; i < len; i++)
			buf[i] = (unsigned char)next(&seed);
		want = (uint32_t)crc32(crc32(0L, Z_NULL, 0), buf, (uInt)len);
		block_seal(buf, len);
		cr_assert(memcmp(buf + len, "FYb1", 4) == 0);
		for (int i = 0; i < 4; i++)
			got |= (uint32_t)buf[len + 4 + i] << (8 * i);
		cr_assert_eq(got, want, "%zu bytes: trailer CRC %08x, zlib says %08x", len, got, want);
		free(buf);
	}
}
