/*
 * Local copies across an unmount: a clean stop leaves the current copies
 * (local_copy.c) in the staging directory and lists them in
 * ".local-copies-<volume uuid>" there; the next start of the same volume
 * with that directory takes up each one whose file the volume still has
 * at the same size and change time, as a hand-over's new daemon does.
 *
 * Why a list and not the names alone: a copy is only worth keeping if it
 * is still the file byte for byte, and what says so (the change time it
 * was committed with) is known to the daemon that stops, not the one that
 * starts. The copies are flushed before the list that claims them is
 * written, so a power loss never leaves a listed copy with lost pages.
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
#include <unistd.h>

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
	char path[128], *text;
	size_t len;
	int n = -ENOMEM;

	saved_path(md, path, sizeof(path));
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
	if (unlinkat(md->staging_dirfd, path, 0) < 0 && errno != ENOENT)
		log_warn("cannot remove %s/%s", md->cfg.staging_dir, path);
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

	for (size_t k = 0; md->saved && k < md->saved->n; k++)
		n += md->saved->e[k].size;
	return n;
}

void local_copy_saved_adopt(struct mountd *md)
{
	struct local_copy_saved_list *l = md->saved;
	uint64_t kept0 = atomic_load(&md->stats.local_copies_restored);
	char path[128];

	if (!l)
		return;
	/* Oldest first (the list is newest first): the eviction order stays. */
	for (size_t k = l->n; k-- > 0;) {
		const struct local_copy_entry *e = &l->e[k];

		local_copy_adopt(md, e->ino, e->name, e->size,
				 (struct timespec){ .tv_sec = (time_t)e->ctime_sec,
						    .tv_nsec = (long)e->ctime_nsec },
				 e->built, true);
	}
	/* Taken up or removed, each under a name of this run now: a crash
	 * from here on leaves them to the next start's sweep. */
	saved_path(md, path, sizeof(path));
	if (unlinkat(md->staging_dirfd, path, 0) < 0 && errno != ENOENT)
		log_warn("cannot remove %s/%s", md->cfg.staging_dir, path);
	log_info("took up %llu of the %zu local copies the last run left",
		 (unsigned long long)(atomic_load(&md->stats.local_copies_restored) - kept0), l->n);
	list_free(l);
	md->saved = NULL;
}

void local_copy_saved_free(struct mountd *md)
{
	list_free(md->saved);
	md->saved = NULL;
}

void local_copy_save(struct mountd *md)
{
	struct local_copy_handed *c = calloc(LOCAL_COPY_LIST_MAX, sizeof(*c));
	struct local_copy_entry *e = calloc(LOCAL_COPY_LIST_MAX, sizeof(*e));
	char *text = malloc(LOCAL_COPY_LIST_TEXT_MAX), path[128];
	bool listed[LOCAL_COPY_LIST_MAX] = { false };
	size_t n = 0, nsaved = 0;
	int rc = -ENOMEM, len;

	if (!c || !e || !text)
		goto out;
	n = local_copy_hand_over(md, c, LOCAL_COPY_LIST_MAX);
	for (size_t k = 0; k < n; k++) {
		/* size 0: changed meanwhile; the rest cannot be listed. */
		if (c[k].size == 0 || !local_copy_name_ok(c[k].name) || c[k].ctime.tv_sec < 0)
			continue;
		e[nsaved] = (struct local_copy_entry){ .ino = c[k].ino, .size = c[k].size,
						       .ctime_sec = c[k].ctime.tv_sec,
						       .ctime_nsec = (uint32_t)c[k].ctime.tv_nsec,
						       .built = c[k].built };
		snprintf(e[nsaved].name, sizeof(e[nsaved].name), "%s", c[k].name);
		listed[k] = true;
		nsaved++;
	}
	rc = 0;
	if (nsaved == 0)
		goto out;
	len = local_copy_list_format(md->vol.uuid, e, nsaved, text, LOCAL_COPY_LIST_TEXT_MAX);
	/* The copies' bytes reach the disk before the list that vouches for
	 * them. */
	saved_path(md, path, sizeof(path));
	if (len < 0)
		rc = len;
	else if (syncfs(md->staging_dirfd) < 0)
		rc = -errno;
	else
		rc = dirs_replace_file_at(md->staging_dirfd, path, text, (size_t)len);
	if (rc < 0)
		log_errno(rc, "cannot keep the local copies for the next mount (%s/%s): removed",
			  md->cfg.staging_dir, path);
	else
		log_info("kept %zu local copies for the next mount", nsaved);
out:
	if (rc == -ENOMEM)
		log_warnx("out of memory: the local copies are removed, not kept for the next mount");
	for (size_t k = 0; k < n; k++) {
		if ((rc < 0 || !listed[k]) &&
		    unlinkat(md->staging_dirfd, c[k].name, 0) < 0 && errno != ENOENT)
			log_warn("cannot remove local copy %s", c[k].name);
		free(c[k].name);
	}
	free(text);
	free(e);
	free(c);
}
