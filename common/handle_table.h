/*
 * handle_table: FUSE file handles. A handle (the fh the kernel echoes back)
 * encodes a slot index and a generation; lookups are lock-free (an atomic
 * load of the slot, then a check of type and generation), so the read/write
 * path takes no global mutex. A stale, forged or wrong-type fh is answered
 * -EBADF, never a crash.
 *
 * The table does not own the objects it points at: the caller frees what
 * handle_remove() hands back, after it is sure no concurrent request still
 * uses it (FUSE guarantees no request for an fh after its RELEASE returns,
 * except those already running: callers keep a reference count).
 */
#ifndef FERRY_HANDLE_TABLE_H
#define FERRY_HANDLE_TABLE_H

#include <stddef.h>
#include <stdint.h>

struct handle_table;

enum handle_type { HANDLE_FILE = 1, HANDLE_DIR = 2, HANDLE_SPECIAL = 3 };

/* max_handles is rounded up to a power of two; at most 1<<24. */
int handle_table_new(uint32_t max_handles, struct handle_table **out);
void handle_table_free(struct handle_table *t); /* accepts NULL */

/* Stores obj and returns its fh in *fh; -EMFILE when the table is full. */
int handle_add(struct handle_table *t, enum handle_type type, void *obj, uint64_t *fh);
/* The object of fh if it is live and of the given type, else NULL. */
void *handle_get(struct handle_table *t, uint64_t fh, enum handle_type type);
/* Removes fh and returns its object (NULL if fh was not live of that type). */
void *handle_remove(struct handle_table *t, uint64_t fh, enum handle_type type);
uint32_t handle_count(struct handle_table *t);
/* Removes every live handle, handing each object to cb (at shutdown, for
 * handles the kernel never released). Not to be run beside other calls. */
void handle_table_drain(struct handle_table *t,
			void (*cb)(enum handle_type type, void *obj, void *arg), void *arg);

/* Calls cb for every live handle, leaving it live (a daemon handing its
 * handles to the one that replaces it; nothing else runs meanwhile). */
void handle_table_each(struct handle_table *t,
		       void (*cb)(uint64_t fh, enum handle_type type, void *obj, void *arg), void *arg);
/* Makes fhs[k] live again with objs[k] (of types[k]) in a table that has
 * handed out nothing yet, as the daemon before gave them out: -EBUSY if it
 * has, -EINVAL for an fh outside the table, of generation 0, or given
 * twice; after an error the table is only fit for handle_table_free(). */
int handle_table_restore(struct handle_table *t, const uint64_t *fhs, const enum handle_type *types,
			 void *const *objs, size_t n);

#endif
