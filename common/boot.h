/*
 * boot: which boot of the machine this is (the kernel's random boot_id).
 * A file written without fsync is whole on disk only while the boot that
 * wrote it runs: a crash of the daemons keeps the page cache, a power loss
 * or a reboot does not. Files that would be wrong if torn (the read cache,
 * a copy of committed data) carry the boot they were written under, and
 * are trusted after a restart only under that same boot.
 */
#ifndef FERRY_BOOT_H
#define FERRY_BOOT_H

#include <stdbool.h>
#include <stddef.h>

#define BOOT_TAG_LEN 8

/* The boot id (36 characters and a NUL) into buf; "" where it cannot be
 * read (no /proc). */
void boot_id(char *buf, size_t len);
/* The boot id's first BOOT_TAG_LEN hex digits and a NUL into tag: false
 * (tag "") where the id cannot be read. */
bool boot_tag(char tag[BOOT_TAG_LEN + 1]);

/* For names that end in `mark` and a boot tag (".c0c9e3a70"): the tag, or
 * NULL if name does not end so. */
const char *boot_tag_of_name(const char *name, const char *mark);

/*
 * The boots all of whose files with a tag in their name were flushed since
 * their last write: a daemon's orderly stop syncs its directory and adds
 * its boot, and its next start under the same boot takes that boot out
 * again before it writes another such file. Kept as BOOT_FLUSHED_NAME in
 * the directory, one tag a line.
 */
#define BOOT_FLUSHED_NAME ".flushed-boots"
#define BOOT_SET_MAX 64
struct boot_set {
	char tag[BOOT_SET_MAX][BOOT_TAG_LEN + 1];
	size_t n;
};

/* Reads dirfd's BOOT_FLUSHED_NAME into s (none: empty). 0 or -errno (s is
 * then empty: no boot is taken as flushed). Lines that are no tag are
 * skipped. */
int boot_set_load(int dirfd, struct boot_set *s);
/* Writes s as dirfd's BOOT_FLUSHED_NAME durably (a temporary file, fsync,
 * rename, fsync of the directory). 0 or -errno. */
int boot_set_store(int dirfd, const struct boot_set *s);
bool boot_set_has(const struct boot_set *s, const char *tag);
/* Adds tag (if absent; when full, the first one goes). */
void boot_set_add(struct boot_set *s, const char *tag);
/* Removes tag; true if it was there. */
bool boot_set_remove(struct boot_set *s, const char *tag);

enum boot_name {
	BOOT_NAME_UNTAGGED, /* no tag: nothing to say */
	BOOT_NAME_WHOLE,    /* this boot's, or a flushed boot's: its pages are all there */
	BOOT_NAME_TORN,     /* another boot's, not flushed: any page may be lost */
	BOOT_NAME_UNKNOWN,  /* this boot cannot be told (now is "") */
};
/* What a name tagged after `mark` says of its file, under boot `now` (a
 * boot_tag(), "" if unknown) with the boots `flushed`. */
enum boot_name boot_name_state(const char *name, const char *mark, const char *now,
			       const struct boot_set *flushed);

#endif
