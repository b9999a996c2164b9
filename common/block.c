#include "block.h"

#include <errno.h>
#include <string.h>
#include <xxhash.h>
#include <zlib.h>

static const unsigned char block_magic[4] = { 'F', 'Y', 'b', '1' };

static uint32_t block_crc(const void *buf, size_t len)
{
	uLong crc = crc32(0L, Z_NULL, 0);
	const unsigned char *p = buf;

	/* zlib takes uInt lengths: feed it in pieces below 4 GiB. */
	while (len) {
		uInt n = len > (1u << 30) ? (1u << 30) : (uInt)len;
		crc = crc32(crc, p, n);
		p += n;
		len -= n;
	}
	return (uint32_t)crc;
}

size_t block_seal(void *buf, size_t len)
{
	unsigned char *t = (unsigned char *)buf + len;
	uint32_t crc = block_crc(buf, len);

	memcpy(t, block_magic, 4);
	for (int i = 0; i < 4; i++)
		t[4 + i] = (unsigned char)(crc >> (8 * i));
	return len + BLOCK_TRAILER;
}

int block_verify(const void *buf, size_t stored_len, size_t data_len)
{
	const unsigned char *t;
	uint32_t crc = 0;

	if (stored_len != data_len + BLOCK_TRAILER)
		return -EIO;
	t = (const unsigned char *)buf + data_len;
	if (memcmp(t, block_magic, 4) != 0)
		return -EIO;
	for (int i = 0; i < 4; i++)
		crc |= (uint32_t)t[4 + i] << (8 * i);
	return crc == block_crc(buf, data_len) ? 0 : -EIO;
}

uint64_t block_fingerprint(const void *buf, size_t len)
{
	return XXH3_64bits(buf, len);
}
