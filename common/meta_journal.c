#include "meta_journal.h"

#include <string.h>
#include <zlib.h>

static const unsigned char magic[4] = { 'F', 'J', 'r', '1' };

static void put_u32(unsigned char *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (unsigned char)(v >> (8 * i));
}

static void put_u64(unsigned char *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (unsigned char)(v >> (8 * i));
}

static uint32_t get_u32(const unsigned char *p)
{
	uint32_t v = 0;

	for (int i = 3; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

static uint64_t get_u64(const unsigned char *p)
{
	uint64_t v = 0;

	for (int i = 7; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

static size_t body_size(const struct mj_rec *r)
{
	size_t n = 8 + 1 + 8 + 4 + 8 * MJ_INTS;

	for (int i = 0; i < MJ_STRS; i++)
		n += 4 + r->slen[i];
	return n;
}

size_t mj_size(const struct mj_rec *r)
{
	return MJ_HEAD + body_size(r);
}

size_t mj_encode(const struct mj_rec *r, void *buf, size_t cap)
{
	size_t body = body_size(r), n = MJ_HEAD + body;
	unsigned char *p = buf, *b;

	if (body > MJ_BODY_MAX || n > cap)
		return 0;
	b = p + MJ_HEAD;
	put_u64(b, r->seq);
	b[8] = r->op;
	put_u64(b + 9, (uint64_t)r->now.tv_sec);
	put_u32(b + 17, (uint32_t)r->now.tv_nsec);
	b += 21;
	for (int i = 0; i < MJ_INTS; i++, b += 8)
		put_u64(b, r->v[i]);
	for (int i = 0; i < MJ_STRS; i++) {
		put_u32(b, r->slen[i]);
		if (r->slen[i])
			memcpy(b + 4, r->s[i], r->slen[i]);
		b += 4 + r->slen[i];
	}
	memcpy(p, magic, 4);
	put_u32(p + 4, (uint32_t)body);
	put_u32(p + 8, (uint32_t)crc32(0L, p + MJ_HEAD, (uInt)body));
	return n;
}

long mj_decode(const void *buf, size_t len, struct mj_rec *r)
{
	const unsigned char *p = buf, *b, *end;
	uint32_t body;
	uint64_t nsec;

	if (len < MJ_HEAD)
		return 0;
	if (memcmp(p, magic, 4) != 0)
		return -1;
	body = get_u32(p + 4);
	if (body < 21 + 8 * MJ_INTS + 4 * MJ_STRS || body > MJ_BODY_MAX)
		return -1;
	if (len - MJ_HEAD < body)
		return 0;
	if ((uint32_t)crc32(0L, p + MJ_HEAD, body) != get_u32(p + 8))
		return -1;
	b = p + MJ_HEAD;
	end = b + body;
	memset(r, 0, sizeof(*r));
	r->seq = get_u64(b);
	r->op = b[8];
	r->now.tv_sec = (time_t)get_u64(b + 9);
	nsec = get_u32(b + 17);
	if (r->op < MJ_CREATE || r->op > MJ_OP_MAX || nsec >= 1000000000u || r->seq == 0)
		return -1;
	r->now.tv_nsec = (long)nsec;
	b += 21;
	for (int i = 0; i < MJ_INTS; i++, b += 8)
		r->v[i] = get_u64(b);
	for (int i = 0; i < MJ_STRS; i++) {
		if ((size_t)(end - b) < 4)
			return -1;
		r->slen[i] = get_u32(b);
		b += 4;
		if (r->slen[i] > (size_t)(end - b))
			return -1;
		r->s[i] = b;
		b += r->slen[i];
	}
	if (b != end)
		return -1;
	return (long)(MJ_HEAD + body);
}
