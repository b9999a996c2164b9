/*
 * checkpoint_store: a checkpoint's metadata dump kept with the volume's
 * objects, under checkpoints/NAME/ in its store:
 *
 *   part-000000, part-000001, ...  the dump (meta_dump's JSON lines), cut
 *                                  into CKPT_PART_BYTES objects
 *   manifest                       one JSON object, written last: a
 *                                  checkpoint without one is not whole
 *   restored/UUID                  one per volume restored from it, which
 *                                  reads the origin's objects
 *
 * and ranges/N: the slice id ranges taken by restored volumes (meta_dump.h:
 * META_SLICE_RANGE_BITS), one object each, so two restores never allocate
 * the same ids in one store.
 *
 * Every function works on the caller's objstore and fd or FILE; nothing
 * here keeps state.
 */
#ifndef FERRY_CHECKPOINT_STORE_H
#define FERRY_CHECKPOINT_STORE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "meta_dump.h"

struct objstore;

#define CKPT_PART_BYTES (8u << 20)

struct ckpt_manifest {
	struct meta_checkpoint cp; /* name, taken_ms, slices, bytes */
	char volume[64];           /* the origin's uuid */
	uint64_t dump_bytes, records, parts;
	double pause_ms;
};

/* Stores the dump (len bytes of fd from offset 0) and then the manifest.
 * 0, or -errno with the reason in err (what was stored is deleted). */
int ckpt_store_put(struct objstore *s, int fd, uint64_t len, struct ckpt_manifest *mf,
		   char *err, size_t errlen);
/* A manifest's text (NUL-terminated) for checkpoint name into *mf: 0, or
 * -EIO with the reason in err (anything but a manifest of that name whose
 * part count fits its size). */
int ckpt_manifest_parse(const char *text, const char *name, struct ckpt_manifest *mf, char *err,
			size_t errlen);
/* Reads checkpoint name's manifest into *mf. -ENOENT if there is none. */
int ckpt_store_manifest(struct objstore *s, const char *name, struct ckpt_manifest *mf,
			char *err, size_t errlen);
/* Writes checkpoint name's dump to out (its manifest into *mf); a part
 * missing or of the wrong size is -EIO. */
int ckpt_store_get(struct objstore *s, const char *name, FILE *out, struct ckpt_manifest *mf,
		   char *err, size_t errlen);
/* Deletes the manifest first (the checkpoint is gone), then the parts and
 * the restored markers. */
int ckpt_store_delete(struct objstore *s, const char *name, char *err, size_t errlen);
/* The volumes restored from name: a count, and the first uuid in first. */
int ckpt_store_restored(struct objstore *s, const char *name, unsigned *n, char *first,
			size_t firstlen);
int ckpt_store_mark_restored(struct objstore *s, const char *name, const char *uuid);
/* Takes a slice id range no other volume of this store has: its base. */
int ckpt_store_range_claim(struct objstore *s, uint64_t *base, char *err, size_t errlen);

#endif
