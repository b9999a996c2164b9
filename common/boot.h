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
 * The runs (a boot and a daemon's pid: "<tag>-<pid>") all of whose files
 * with a tag in their name were flushed since their last write: a
 * daemon's orderly stop syncs its directory and adds the run of every
 * such file of its boot there, and a daemon's start takes its own run out
 * before it writes another such file. Kept as BOOT_FLUSHED_NAME in the
 * directory, one run a line.
 */
#define BOOT_FLUSHED_NAME ".flushed-runs"
#define BOOT_SET_MAX 64
#define BOOT_RUN_LEN (BOOT_TAG_LEN + 1 + 10) /* "<tag>-<pid>", pid < 2^32 */
struct boot_set {
	char run[BOOT_SET_MAX][BOOT_RUN_LEN + 1];
	size_t n;
};

/* Reads dirfd's BOOT_FLUSHED_NAME into s (none: empty, 0). -errno on an
 * error or a file too large (-EFBIG): s is empty then, and must not be
 * stored back over the file. Lines that are no run are skipped. */
int boot_set_load(int dirfd, struct boot_set *s);
/* Writes s as dirfd's BOOT_FLUSHED_NAME durably (a temporary file, fsync,
 * rename, fsync of the directory). 0 or -errno. */
int boot_set_store(int dirfd, const struct boot_set *s);
bool boot_set_has(const struct boot_set *s, const char *run);
/* Adds run (if absent; when full, the first one goes). */
void boot_set_add(struct boot_set *s, const char *run);
/* Removes run; true if it was there. */
bool boot_set_remove(struct boot_set *s, const char *run);
/* "<tag>-<pid>" into run (BOOT_RUN_LEN + 1 bytes). */
void boot_run(char *run, const char *tag, long pid);

enum boot_name {
	BOOT_NAME_UNTAGGED, /* no tag: nothing to say */
	BOOT_NAME_WHOLE,    /* this boot's, or a flushed run's: its pages are all there */
	BOOT_NAME_TORN,     /* another boot's, not flushed: any page may be lost */
	BOOT_NAME_UNKNOWN,  /* this boot cannot be told (now is "") */
};
/* What a file of tag `tag` (NULL: untagged) made by run `run` ("" if not
 * known) says of its pages, under boot `now` (a boot_tag(), "" if unknown)
 * and the runs `flushed` (NULL: they could not be read, so another boot's
 * file is BOOT_NAME_UNKNOWN). */
enum boot_name boot_name_state(const char *tag, const char *run, const char *now,
			       const struct boot_set *flushed);

#endif
