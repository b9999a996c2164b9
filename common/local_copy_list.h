/*
 * local_copy_list: the text of STAGING/.local-copies-<volume uuid>, the
 * local copies a clean stop of ferry-mountd leaves for the next mount of
 * the volume (mountd/local_copy_saved.c), and the names such copies have.
 *
 * The next daemon reads what the last one wrote, maybe damaged, maybe
 * written by hand: the parser takes nothing on trust, and one line it does
 * not understand rejects the whole list (its copies are then removed as
 * any dead daemon's are). Entries are plain values, owned by the caller's
 * array.
 *
 *   ferry-local-copies 1 <uuid>
 *   <ino> <size> <ctime sec> <ctime nsec> <layout print> <copy's st_ino>
 *     <copy's mtime sec> <copy's mtime nsec> <built 0|1> <name>
 *   ...
 * (one line each, fields separated by one space, all decimal).
 */
#ifndef FERRY_LOCAL_COPY_LIST_H
#define FERRY_LOCAL_COPY_LIST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define LOCAL_COPY_LIST_MAX 1024u /* entries: as many as a hand-over takes */
#define LOCAL_COPY_NAME_MAX 64    /* with its NUL (HANDOVER_KEPT_NAME_MAX) */
/* Room for the longest list local_copy_list_format() writes. */
#define LOCAL_COPY_LIST_TEXT_MAX (LOCAL_COPY_LIST_MAX * 256u + 128u)

struct local_copy_entry {
	uint64_t ino;
	uint64_t size;
	int64_t ctime_sec;   /* the change time the file was committed with */
	uint32_t ctime_nsec;
	/* A fingerprint of the file's committed slices: every change of its
	 * data commits slices of new ids (a writer can set mtime, and so the
	 * committed ctime, to what it was). */
	uint64_t layout_print;
	/* The copy file itself, once flushed: changed since, it is not kept. */
	uint64_t copy_ino;
	int64_t copy_mtime_sec;
	uint32_t copy_mtime_nsec;
	bool built;          /* built from a read, not a writer's staging file */
	char name[LOCAL_COPY_NAME_MAX];
};

/* Whether name is a local copy's (".kept-" then digits, lower-case letters
 * and '-'): nothing that could leave the staging directory or name
 * another kind of file there. */
bool local_copy_name_ok(const char *name);

/* Parses the len bytes at text as the list of volume uuid into out (at
 * most max entries). Returns how many, or -EINVAL if any of it is not
 * what local_copy_list_format() writes for that volume (another volume's,
 * a NUL, a bad line, more than max). */
int local_copy_list_parse(const char *uuid, const char *text, size_t len,
			  struct local_copy_entry *out, size_t max);

/* Writes the list of n entries (names checked: -EINVAL) for volume uuid
 * into buf (cap bytes, NUL-terminated). Returns its length, or -ENOSPC. */
int local_copy_list_format(const char *uuid, const struct local_copy_entry *e, size_t n,
			   char *buf, size_t cap);

#endif
