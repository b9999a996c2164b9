#include "block.h"

#include <errno.h>
#include <stdbool.h>
#include <string.h>
#include <libdeflate.h>
#include <xxhash.h>

static const unsigned char block_magic[4] = { 'F', 'Y', 'b', '1' };

/* zlib's CRC-32, continued from start (0 at first); libdeflate's takes
 * size_t lengths and uses the CPU's carry-less multiply. */
static uint32_t block_crc_more(uint32_t start, const void *buf, size_t len)
{
	return libdeflate_crc32(start, buf, len);
}

static uint32_t block_crc(const void *buf, size_t len)
{
	return block_crc_more(0, buf, len);
}

/* The CRC stored in trailer t, or false when its magic is wrong. */
static bool trailer_crc(const unsigned char *t, uint32_t *crc)
{
	if (memcmp(t, block_magic, 4) != 0)
		return false;
	*crc = 0;
	for (int i = 0; i < 4; i++)
		*crc |= (uint32_t)t[4 + i] << (8 * i);
	return true;
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
	uint32_t crc;

	if (stored_len != data_len + BLOCK_TRAILER ||
	    !trailer_crc((const unsigned char *)buf + data_len, &crc))
		return -EIO;
	return crc == block_crc(buf, data_len) ? 0 : -EIO;
}

void block_check_init(struct block_check *k, size_t data_len)
{
	memset(k, 0, sizeof(*k));
	k->data_len = data_len;
	k->crc = 0;
}

void block_check_feed(struct block_check *k, const void *buf, size_t len)
{
	const unsigned char *p = buf;

	if (k->seen < k->data_len) {
		size_t n = k->data_len - k->seen < len ? k->data_len - k->seen : len;

		k->crc = block_crc_more(k->crc, p, n);
		k->seen += n;
		p += n;
		len -= n;
	}
	/* The trailer; past it only the count grows (a longer object is as
	 * damaged as a shorter one). */
	while (len > 0 && k->seen < k->data_len + BLOCK_TRAILER) {
		k->t[k->seen - k->data_len] = *p++;
		k->seen++;
		len--;
	}
	k->seen += len;
}

int block_check_end(const struct block_check *k)
{
	uint32_t crc;

	if (k->seen != k->data_len + BLOCK_TRAILER || !trailer_crc(k->t, &crc))
		return -EIO;
	return crc == k->crc ? 0 : -EIO;
}

uint64_t block_fingerprint(const void *buf, size_t len)
{
	return XXH3_64bits(buf, len);
}
