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
/* Whether such a name was made under another boot than this one (or this
 * boot cannot be told): false for a name without a tag. */
bool boot_name_of_other_boot(const char *name, const char *mark);

#endif
