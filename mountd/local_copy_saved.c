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
 * Ownership: md->saved (the list read at start, with its names) is md's,
 * from local_copy_saved_load() to local_copy_saved_adopt().
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dirs.h"
#include "handover_blob.h"
#include "log.h"
#include "mountd.h"

#define SAVED_PREFIX ".local-copies-"
#define SAVED_MAGIC "ferry-local-copies 1"
/* A line: ino size ctime_sec ctime_nsec built name, the name < 64. */
#define SAVED_LINE_MAX 160

struct local_copy_saved_list {
	struct local_copy_handed *c; /* names owned here */
	size_t n;
};

static void saved_path(struct mountd *md, char *out, size_t len)
{
	snprintf(out, len, SAVED_PREFIX "%s", md->vol.uuid);
}

/* A copy's name as local_copy.c and copy_build.c make them: nothing that
 * could leave the staging directory or name something else in it. */
static bool name_ok(const char *name)
{
	size_t len = strlen(name);

	if (strncmp(name, ".kept-", 6) != 0 || len < 8 || len >= 64)
		return false;
	for (size_t k = 6; k < len; k++)
		if (!((name[k] >= '0' && name[k] <= '9') || (name[k] >= 'a' && name[k] <= 'z') ||
		      name[k] == '-'))
			return false;
	return true;
}

static void list_free(struct local_copy_saved_list *l)
{
	if (!l)
		return;
	for (size_t k = 0; k < l->n; k++)
		free(l->c[k].name);
	free(l->c);
	free(l);
}

/* Parses text (NUL-terminated) into a new list; NULL if any of it is not
 * what local_copy_save() writes for this volume. */
static struct local_copy_saved_list *list_parse(struct mountd *md, char *text)
{
	struct local_copy_saved_list *l = calloc(1, sizeof(*l));
	char *save = NULL, *line, head[128];

	if (!l || !(l->c = calloc(HANDOVER_KEPT_MAX, sizeof(*l->c))))
		goto bad;
	snprintf(head, sizeof(head), SAVED_MAGIC " %s", md->vol.uuid);
	line = strtok_r(text, "\n", &save);
	if (!line || strcmp(line, head) != 0)
		goto bad;
	while ((line = strtok_r(NULL, "\n", &save))) {
		struct local_copy_handed *c = &l->c[l->n];
		uint64_t sec, nsec;
		unsigned built;
		char name[64];
		int end = 0;

		if (l->n == HANDOVER_KEPT_MAX)
			goto bad;
		if (sscanf(line, "%" SCNu64 " %" SCNu64 " %" SCNu64 " %" SCNu64 " %u %63s%n",
			   &c->ino, &c->size, &sec, &nsec, &built, name, &end) != 6 ||
		    line[end] != '\0' || built > 1 || nsec >= 1000000000u || sec > INT64_MAX ||
		    !name_ok(name) || !(c->name = strdup(name)))
			goto bad;
		c->ctime = (struct timespec){ .tv_sec = (time_t)sec, .tv_nsec = (long)nsec };
		c->built = built;
		l->n++;
	}
	return l;
bad:
	list_free(l);
	return NULL;
}

void local_copy_saved_load(struct mountd *md)
{
	char path[128], *text = NULL;
	size_t cap = (size_t)HANDOVER_KEPT_MAX * SAVED_LINE_MAX + 128, len = 0;
	ssize_t got;
	int fd;

	saved_path(md, path, sizeof(path));
	fd = openat(md->staging_dirfd, path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0) {
		if (errno != ENOENT)
			log_warn("cannot read the local copies of the last run (%s/%s)",
				 md->cfg.staging_dir, path);
		return;
	}
	text = malloc(cap + 1);
	while (text && len < cap && (got = read(fd, text + len, cap - len)) != 0) {
		if (got < 0 && errno == EINTR)
			continue;
		if (got < 0) {
			len = cap; /* unreadable: as too long */
			break;
		}
		len += (size_t)got;
	}
	close(fd);
	if (text && len < cap) {
		text[len] = '\0';
		md->saved = list_parse(md, text);
	}
	free(text);
	if (!md->saved) {
		/* Its copies are swept as an earlier run's. */
		log_warnx("%s/%s is not a list of local copies this daemon wrote: ignored",
			  md->cfg.staging_dir, path);
		if (unlinkat(md->staging_dirfd, path, 0) < 0 && errno != ENOENT)
			log_warn("cannot remove %s/%s", md->cfg.staging_dir, path);
	}
}

bool local_copy_saved_names(struct mountd *md, const char *name)
{
	for (size_t k = 0; md->saved && k < md->saved->n; k++)
		if (strcmp(md->saved->c[k].name, name) == 0)
			return true;
	return false;
}

uint64_t local_copy_saved_bytes(struct mountd *md)
{
	uint64_t n = 0;

	for (size_t k = 0; md->saved && k < md->saved->n; k++)
		n += md->saved->c[k].size;
	return n;
}

void local_copy_saved_adopt(struct mountd *md)
{
	struct local_copy_saved_list *l = md->saved;
	char path[128];
	uint64_t kept0 = atomic_load(&md->stats.local_copies_restored);

	if (!l)
		return;
	/* Oldest first (the list is newest first): the eviction order stays. */
	for (size_t k = l->n; k-- > 0;)
		local_copy_adopt(md, l->c[k].ino, l->c[k].name, l->c[k].size, l->c[k].ctime,
				 l->c[k].built, true);
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
	struct local_copy_handed *c = calloc(HANDOVER_KEPT_MAX, sizeof(*c));
	char path[128], *text = NULL;
	size_t n = 0, len = 0, cap = (size_t)HANDOVER_KEPT_MAX * SAVED_LINE_MAX + 128;
	int rc = -ENOMEM;

	if (!c)
		goto out;
	n = local_copy_hand_over(md, c, HANDOVER_KEPT_MAX);
	if (n == 0) {
		rc = 0;
		goto out;
	}
	if (!(text = malloc(cap)))
		goto out;
	len = (size_t)snprintf(text, cap, SAVED_MAGIC " %s\n", md->vol.uuid);
	for (size_t k = 0; k < n; k++) {
		if (c[k].size == 0 || !name_ok(c[k].name))
			continue; /* changed meanwhile: removed below */
		len += (size_t)snprintf(text + len, cap - len, "%" PRIu64 " %" PRIu64 " %lld %ld %u %s\n",
					c[k].ino, c[k].size, (long long)c[k].ctime.tv_sec,
					c[k].ctime.tv_nsec, c[k].built ? 1u : 0u, c[k].name);
	}
	/* The copies' bytes reach the disk before the list that vouches for
	 * them. */
	saved_path(md, path, sizeof(path));
	if (syncfs(md->staging_dirfd) < 0)
		rc = -errno;
	else
		rc = dirs_replace_file_at(md->staging_dirfd, path, text, len);
out:
	if (rc < 0)
		log_errno(rc, "cannot keep the local copies for the next mount (%s/%s): removed",
			  md->cfg.staging_dir, SAVED_PREFIX "*");
	for (size_t k = 0; k < n; k++) {
		if ((rc < 0 || c[k].size == 0 || !name_ok(c[k].name)) &&
		    unlinkat(md->staging_dirfd, c[k].name, 0) < 0 && errno != ENOENT)
			log_warn("cannot remove local copy %s", c[k].name);
		free(c[k].name);
	}
	if (rc == 0 && n)
		log_info("kept %zu local copies for the next mount", n);
	free(text);
	free(c);
}
