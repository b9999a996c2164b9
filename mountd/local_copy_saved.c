/*
 * Local copies across an unmount: a clean stop leaves the current copies
 * (local_copy.c) in the staging directory and lists them in
 * ".local-copies-<volume uuid>" there; the next start of the same volume
 * with that directory takes up each one whose file the volume still has
 * at the same size and change time, as a hand-over's new daemon does.
 *
 * Why a list and not the names alone: a copy is only worth keeping if it
 * is still the file byte for byte, and what says so is known to the daemon
 * that stops, not the one that starts: the size and change time the file
 * was committed with, and a fingerprint of its committed slices (a writer
 * can set the mtime, which a commit makes the ctime too, back to what it
 * was; it cannot make a change without new slice ids). The copy file's own
 * inode and mtime are listed too: a copy changed behind the daemon's back
 * is not kept. The copies are flushed before the list that claims them is
 * written, so a power loss never leaves a listed copy with lost pages; the
 * start makes its removal of the list durable before it serves.
 *
 * Ownership: md->saved (the list read at start) is md's, from
 * local_copy_saved_load() to local_copy_saved_adopt(); the text format is
 * common/local_copy_list.c's.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "block.h"
#include "dirs.h"
#include "local_copy_list.h"
#include "log.h"
#include "mountd.h"

#define SAVED_PREFIX ".local-copies-"

struct local_copy_saved_list {
	struct local_copy_entry *e;
	size_t n;
};

static void saved_path(struct mountd *md, char *out, size_t len)
{
	snprintf(out, len, SAVED_PREFIX "%s", md->vol.uuid);
}

/* Removes the list, if there is one; 0 or -errno (logged). */
static int list_remove(struct mountd *md)
{
	char path[128];

	saved_path(md, path, sizeof(path));
	if (unlinkat(md->staging_dirfd, path, 0) < 0 && errno != ENOENT) {
		int rc = -errno;

		log_warn("cannot remove %s/%s", md->cfg.staging_dir, path);
		return rc;
	}
	return 0;
}

int local_copy_layout_print(struct mountd *md, uint64_t ino, uint64_t size, uint64_t *out)
{
	uint64_t h[2] = { ino, 0 };
	uint32_t chunks = (uint32_t)((size + META_CHUNK_SIZE - 1) / META_CHUNK_SIZE);

	for (uint32_t c = 0; c < chunks; c++) {
		struct meta_slice *sl = NULL;
		uint64_t *v;
		size_t n = 0;
		int rc = meta_chunk_slices(md->meta, ino, c, &sl, &n);

		if (rc < 0)
			return rc;
		v = calloc(n * 5 + 1, sizeof(*v));
		if (!v) {
			free(sl);
			return -ENOMEM;
		}
		v[0] = c;
		for (size_t k = 0; k < n; k++) {
			v[1 + 5 * k] = sl[k].id;
			v[2 + 5 * k] = sl[k].size;
			v[3 + 5 * k] = sl[k].off;
			v[4 + 5 * k] = ((uint64_t)sl[k].pos << 32) | sl[k].len;
			v[5 + 5 * k] = k;
		}
		h[1] = block_fingerprint(v, (n * 5 + 1) * sizeof(*v));
		h[0] = block_fingerprint(h, sizeof(h));
		free(v);
		free(sl);
	}
	*out = h[0];
	return 0;
}

static void list_free(struct local_copy_saved_list *l)
{
	if (l)
		free(l->e);
	free(l);
}

/* The list in the staging directory, read whole: NULL and *len 0 if there
 * is none; NULL and *len 1 if it cannot be read or is too long to be one. */
static char *list_read(struct mountd *md, const char *path, size_t *len)
{
	size_t cap = LOCAL_COPY_LIST_TEXT_MAX, got = 0;
	char *text = NULL;
	ssize_t r = 1;
	int fd;

	*len = 1;
	fd = openat(md->staging_dirfd, path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0) {
		if (errno == ENOENT)
			*len = 0;
		return NULL;
	}
	/* One byte more than a list can have: a longer file is not one. */
	text = malloc(cap + 1);
	while (text && got <= cap && (r = read(fd, text + got, cap + 1 - got)) != 0) {
		if (r < 0 && errno != EINTR)
			break;
		if (r > 0)
			got += (size_t)r;
	}
	close(fd);
	if (!text || r != 0 || got > cap) {
		free(text);
		return NULL;
	}
	*len = got;
	return text;
}

void local_copy_saved_load(struct mountd *md)
{
	struct local_copy_saved_list *l = NULL;
	char path[128], tmp[160], *text;
	size_t len;
	int n = -ENOMEM;

	saved_path(md, path, sizeof(path));
	/* What a stop that died writing the list left (dirs_replace_file_at). */
	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	if (!md->follower)
		(void)unlinkat(md->staging_dirfd, tmp, 0);
	text = list_read(md, path, &len);
	if (!text && len == 0)
		return; /* none: the last stop kept nothing, or was a crash */
	if (text && (l = calloc(1, sizeof(*l))) &&
	    (l->e = calloc(LOCAL_COPY_LIST_MAX, sizeof(*l->e))))
		n = local_copy_list_parse(md->vol.uuid, text, len, l->e, LOCAL_COPY_LIST_MAX);
	free(text);
	if (n >= 0) {
		l->n = (size_t)n;
		md->saved = l;
		return;
	}
	list_free(l);
	/* Its copies are swept as an earlier run's. */
	log_warnx("%s/%s is not a list of local copies of this volume (%s): ignored",
		  md->cfg.staging_dir, path, n == -ENOMEM ? "out of memory" : "unreadable or damaged");
	if (!md->follower)
		(void)list_remove(md);
}

bool local_copy_saved_names(struct mountd *md, const char *name)
{
	for (size_t k = 0; md->saved && k < md->saved->n; k++)
		if (strcmp(md->saved->e[k].name, name) == 0)
			return true;
	return false;
}

uint64_t local_copy_saved_bytes(struct mountd *md)
{
	uint64_t n = 0;

	/* Saturated: the sizes are the list's word, not checked yet. */
	for (size_t k = 0; md->saved && k < md->saved->n; k++)
		n = md->saved->e[k].size > UINT64_MAX - n ? UINT64_MAX : n + md->saved->e[k].size;
	return n;
}

/* Whether entry e still names the copy file that was listed (whether it
 * is the file the volume has now is local_copy_adopt()'s to tell). */
static bool entry_current(struct mountd *md, const struct local_copy_entry *e)
{
	struct stat st;

	return fstatat(md->staging_dirfd, e->name, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
	       (uint64_t)st.st_ino == e->copy_ino && (int64_t)st.st_mtim.tv_sec == e->copy_mtime_sec &&
	       (uint32_t)st.st_mtim.tv_nsec == e->copy_mtime_nsec;
}

void local_copy_saved_adopt(struct mountd *md)
{
	struct local_copy_saved_list *l = md->saved;
	uint64_t kept0 = atomic_load(&md->stats.local_copies_restored);

	if (!l)
		return;
	if (md->follower) {
		/* The writer's: left as they are for its next start. */
		local_copy_saved_free(md);
		return;
	}
	/* Oldest first (the list is newest first): the eviction order stays. */
	for (size_t k = l->n; k-- > 0;) {
		const struct local_copy_entry *e = &l->e[k];

		/* size 0: removed, not kept. */
		local_copy_adopt(md, e->ino, e->name, entry_current(md, e) ? e->size : 0,
				 (struct timespec){ .tv_sec = (time_t)e->ctime_sec,
						    .tv_nsec = (long)e->ctime_nsec },
				 &e->layout_print, e->built, true);
	}
	/* Taken up or removed, each under a name of this run now, and the
	 * list gone for good before the first request: a writer may change
	 * a copy from then on, and no later start may take the list up
	 * again (a crash from here leaves the copies to its sweep). */
	if (list_remove(md) < 0 || fsync(md->staging_dirfd) < 0) {
		log_warn("the list of the last run's local copies is not gone for good: the "
			  "copies it listed are dropped");
		local_copy_drop_all(md);
	}
	log_info("took up %llu of the %zu local copies the last run left",
		 (unsigned long long)(atomic_load(&md->stats.local_copies_restored) - kept0), l->n);
	local_copy_saved_free(md);
}

void local_copy_saved_free(struct mountd *md)
{
	list_free(md->saved);
	md->saved = NULL;
}

/* The list for the n copies at c (listed[k] set for those it holds), once
 * they are flushed; 0, or a negative errno (nothing is listed then). */
static int list_write(struct mountd *md, struct local_copy_handed *c, size_t n, bool *listed,
		      size_t *nsaved)
{
	struct local_copy_entry *e = calloc(LOCAL_COPY_LIST_MAX, sizeof(*e));
	char *text = malloc(LOCAL_COPY_LIST_TEXT_MAX), path[128];
	int rc = -ENOMEM, len;

	*nsaved = 0;
	if (!e || !text)
		goto out;
	/* The copies' bytes reach the disk before the list that vouches for
	 * them; their files' stamps are taken after. */
	rc = syncfs(md->staging_dirfd) < 0 ? -errno : 0;
	for (size_t k = 0; rc == 0 && k < n; k++) {
		struct local_copy_entry *x = &e[*nsaved];
		struct stat st;

		/* size 0: changed meanwhile; the rest cannot be listed. */
		if (c[k].size == 0 || !local_copy_name_ok(c[k].name) || c[k].ctime.tv_sec < 0 ||
		    fstatat(md->staging_dirfd, c[k].name, &st, AT_SYMLINK_NOFOLLOW) < 0)
			continue;
		x->ino = c[k].ino;
		x->layout_print = c[k].layout_print;
		x->size = c[k].size;
		x->ctime_sec = c[k].ctime.tv_sec;
		x->ctime_nsec = (uint32_t)c[k].ctime.tv_nsec;
		x->copy_ino = st.st_ino;
		x->copy_mtime_sec = st.st_mtim.tv_sec;
		x->copy_mtime_nsec = (uint32_t)st.st_mtim.tv_nsec;
		x->built = c[k].built;
		snprintf(x->name, sizeof(x->name), "%s", c[k].name);
		listed[k] = true;
		(*nsaved)++;
	}
	saved_path(md, path, sizeof(path));
	if (rc == 0 && *nsaved) {
		len = local_copy_list_format(md->vol.uuid, e, *nsaved, text, LOCAL_COPY_LIST_TEXT_MAX);
		rc = len < 0 ? len : dirs_replace_file_at(md->staging_dirfd, path, text, (size_t)len);
	}
out:
	free(text);
	free(e);
	return rc;
}

void local_copy_save(struct mountd *md)
{
	struct local_copy_handed *c = calloc(LOCAL_COPY_LIST_MAX, sizeof(*c));
	bool listed[LOCAL_COPY_LIST_MAX] = { false };
	size_t n = 0, nsaved = 0;
	int rc = -ENOMEM;

	if (c) {
		n = local_copy_hand_over(md, c, LOCAL_COPY_LIST_MAX);
		rc = n ? list_write(md, c, n, listed, &nsaved) : 0;
	}
	/* Nothing listed, or a list not known to be durable: none at all (one
	 * a failed start left would name copies that go now). */
	if (rc < 0 || nsaved == 0)
		(void)list_remove(md);
	if (rc < 0)
		log_errno(rc, "cannot keep the local copies for the next mount (%s/%s%s): removed",
			  md->cfg.staging_dir, SAVED_PREFIX, md->vol.uuid);
	else if (nsaved)
		log_info("kept %zu local copies for the next mount", nsaved);
	for (size_t k = 0; k < n; k++) {
		if ((rc < 0 || !listed[k]) &&
		    unlinkat(md->staging_dirfd, c[k].name, 0) < 0 && errno != ENOENT)
			log_warn("cannot remove local copy %s", c[k].name);
		free(c[k].name);
	}
	free(c);
}
