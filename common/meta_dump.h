/*
 * meta_dump: a volume's whole metadata as a portable stream, and a new
 * volume made from one (`ferry dump`, `ferry load`). The stream is JSON
 * lines, one record per row, described in README.md ("Moving a volume's
 * metadata"): a header, then each table's rows in a fixed order, then an
 * end record that counts them, so a stream cut short is refused.
 *
 * Both work row by row (memory does not grow with the volume). The caller
 * owns the FILE; these own nothing they do not free.
 */
#ifndef FERRY_META_DUMP_H
#define FERRY_META_DUMP_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* The stream's own version (the header's "ferry_dump"). */
#define META_DUMP_VERSION 1

/*
 * Writes the volume at loc (a SQLite path or a PostgreSQL URL) to out.
 * Refuses a volume a ferry-mountd has mounted (-EBUSY, naming it in err):
 * on SQLite, its lock, and the journal is replayed first (a daemon killed
 * before it committed), so the dump has every change that returned; on
 * PostgreSQL, its lease, which the dump holds for its length (a lease that
 * ran out without a release is refused too: its node's journal may hold
 * changes). *records: how many records were written (may be NULL).
 * Returns 0 or -errno, with the reason in err.
 */
int meta_dump(const char *loc, FILE *out, uint64_t *records, char *err, size_t errlen);

/*
 * Makes a new volume at loc (which must not exist) from the stream in.
 * Every record is checked (known table, known columns, types) and the
 * result must be a file system (the root a directory, every entry's parent
 * a directory and its inode present); anything else is refused with the
 * line number in err, and nothing is left at loc. Returns 0 or -errno.
 */
int meta_load(FILE *in, const char *loc, uint64_t *records, char *err, size_t errlen);

#endif
