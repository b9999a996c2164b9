/*
 * slice: how a chunk's slices map onto bytes and objects.
 *
 * A slice of size S is stored as objects of at most block_size bytes, named
 * chunks/<id/1e6>/<id/1e3>/<id>_<index>_<objsize>. Within a chunk, later
 * slices cover earlier ones; slice_resolve() turns the ordered list into the
 * visible extents of a byte range.
 */
#ifndef FERRY_SLICE_H
#define FERRY_SLICE_H

#include <stddef.h>
#include <stdint.h>

#include "meta.h"

#define SLICE_KEY_MAX 96

/* Writes the key of object index of slice id (whole slice size size) into
 * buf (at least SLICE_KEY_MAX bytes). */
void slice_object_key(uint64_t id, uint32_t index, uint32_t size, uint32_t block_size,
		      char *buf, size_t buflen);
/* Bytes in object index of a slice of size size. */
uint32_t slice_object_size(uint32_t index, uint32_t size, uint32_t block_size);

/* A visible piece of a chunk: chunk bytes [pos, pos+len) come from slice id
 * at offset slice_off (id 0: zeros, either a hole or a zero slice). */
struct slice_extent {
	uint32_t pos;
	uint32_t len;
	uint64_t id;
	uint32_t slice_off;
	uint32_t slice_size;
};

/* Resolves [pos, pos+len) of a chunk whose slices are s[0..n) (oldest
 * first). Fills *out (malloc'ed, caller frees) with extents in position order
 * that exactly tile the range, holes as id 0. Returns 0 or -ENOMEM/-EINVAL
 * (the range overflows or ends past META_CHUNK_SIZE, or s is NULL with n > 0).
 * len 0 gives no extents (*out NULL, *nout 0). A slice that cannot be valid
 * (len 0, past the chunk's end, or a non-zero id read past its size) is
 * skipped. */
int slice_resolve(const struct meta_slice *s, size_t n, uint32_t pos, uint32_t len,
		  struct slice_extent **out, size_t *nout);

#endif
