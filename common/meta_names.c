/*
 * meta_names: see meta_names.h. Two open-addressing tables: the known
 * directories (their inode numbers) and the counted (directory, name)
 * hashes. A removed name leaves its slot with a count of 0 (a tombstone)
 * until the next rebuild.
 */
#include "meta_names.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define DIR_EMPTY 0
#define DIR_GONE UINT64_MAX /* a tombstone: inode numbers stay below 2^63 */
#define MIN_SLOTS 64

struct name_slot {
	uint64_t key; /* 0: never used */
	uint32_t count; /* 0 with a key: a tombstone */
};

struct meta_names {
	pthread_mutex_t lock;
	size_t max_names;
	uint64_t *dirs;
	size_t dir_slots, dir_used; /* used: live and tombstones */
	uint64_t ndirs;
	struct name_slot *names;
	size_t name_slots, name_used;
	uint64_t nnames;
	uint64_t absent, resets, scans;
	/* Bumped by every change of a name anywhere: a listing that saw one
	 * begin during it cannot tell whether it saw the name. */
	uint64_t epoch;
	/* The listing in progress (scan.dir 0: none). */
	struct {
		uint64_t dir, epoch, next_after;
		uint64_t *keys;
		size_t n, cap;
	} scan;
};

static uint64_t mix(uint64_t x)
{
	x ^= x >> 30;
	x *= 0xbf58476d1ce4e5b9ull;
	x ^= x >> 27;
	x *= 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

static uint64_t name_key(uint64_t parent, const char *name, size_t nlen)
{
	uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */

	for (size_t i = 0; i < nlen; i++) {
		h ^= (unsigned char)name[i];
		h *= 0x100000001b3ull;
	}
	h = mix(h ^ mix(parent + 0x9e3779b97f4a7c15ull));
	return h ? h : 1;
}

int meta_names_new(size_t max_names, struct meta_names **out)
{
	struct meta_names *s = calloc(1, sizeof(*s));

	if (s == NULL)
		return -ENOMEM;
	pthread_mutex_init(&s->lock, NULL);
	s->max_names = max_names ? max_names : 1;
	*out = s;
	return 0;
}

void meta_names_free(struct meta_names *s)
{
	if (s == NULL)
		return;
	pthread_mutex_destroy(&s->lock);
	free(s->scan.keys);
	free(s->dirs);
	free(s->names);
	free(s);
}

/* Forgets everything (lock held): every directory is unknown again. */
static void reset(struct meta_names *s)
{
	free(s->dirs);
	free(s->names);
	s->dirs = NULL;
	s->names = NULL;
	s->dir_slots = s->dir_used = s->name_slots = s->name_used = 0;
	s->ndirs = s->nnames = 0;
}

static size_t slots_for(uint64_t live)
{
	size_t n = MIN_SLOTS;

	while (n < live * 4)
		n *= 2;
	return n;
}

/* ---- directories (lock held) ---- */

static size_t dir_find(const struct meta_names *s, uint64_t dir, bool *found)
{
	size_t mask = s->dir_slots - 1, i = mix(dir) & mask, free_at = SIZE_MAX;

	for (;; i = (i + 1) & mask) {
		if (s->dirs[i] == dir) {
			*found = true;
			return i;
		}
		if (s->dirs[i] == DIR_GONE && free_at == SIZE_MAX)
			free_at = i;
		if (s->dirs[i] == DIR_EMPTY) {
			*found = false;
			return free_at != SIZE_MAX ? free_at : i;
		}
	}
}

/* dir is no longer known. Its counted names stay until the next reset:
 * counting more than is there is safe, and no inode number is given twice. */
static void dir_forget(struct meta_names *s, uint64_t dir)
{
	bool found = false;
	size_t i;

	if (s->dir_slots && (i = dir_find(s, dir, &found), found)) {
		s->dirs[i] = DIR_GONE;
		s->ndirs--;
	}
}

static bool dir_known(const struct meta_names *s, uint64_t dir)
{
	bool found = false;

	if (s->dir_slots)
		dir_find(s, dir, &found);
	return found;
}

/* 0, or -ENOMEM (the set is reset: nothing is known, which is safe). */
static int dirs_grow(struct meta_names *s)
{
	size_t n = slots_for(s->ndirs + 1), old_slots = s->dir_slots;
	uint64_t *old = s->dirs, *t = calloc(n, sizeof(*t));

	if (t == NULL)
		return -ENOMEM;
	s->dirs = t;
	s->dir_slots = n;
	s->dir_used = 0;
	for (size_t i = 0; i < old_slots; i++) {
		bool found;
		if (old[i] == DIR_EMPTY || old[i] == DIR_GONE)
			continue;
		t[dir_find(s, old[i], &found)] = old[i];
		s->dir_used++;
	}
	free(old);
	return 0;
}

/* ---- names (lock held) ---- */

static size_t name_find(const struct meta_names *s, uint64_t key, bool *found)
{
	size_t mask = s->name_slots - 1, i = mix(key) & mask, free_at = SIZE_MAX;

	for (;; i = (i + 1) & mask) {
		const struct name_slot *e = &s->names[i];
		if (e->key == key && e->count > 0) {
			*found = true;
			return i;
		}
		if (e->key != 0 && e->count == 0 && free_at == SIZE_MAX)
			free_at = i;
		if (e->key == 0) {
			*found = false;
			return free_at != SIZE_MAX ? free_at : i;
		}
	}
}

static int names_grow(struct meta_names *s)
{
	size_t n = slots_for(s->nnames + 1), old_slots = s->name_slots;
	struct name_slot *old = s->names, *t = calloc(n, sizeof(*t));

	if (t == NULL)
		return -ENOMEM;
	s->names = t;
	s->name_slots = n;
	s->name_used = 0;
	for (size_t i = 0; i < old_slots; i++) {
		bool found;
		if (old[i].count == 0)
			continue;
		t[name_find(s, old[i].key, &found)] = old[i];
		s->name_used++;
	}
	free(old);
	return 0;
}

/* ---- the calls ---- */

void meta_names_forget(struct meta_names *s)
{
	if (s == NULL)
		return;
	pthread_mutex_lock(&s->lock);
	s->epoch++;
	reset(s);
	pthread_mutex_unlock(&s->lock);
}

/* 0, or -ENOMEM (then the set was reset). */
static int dir_learn(struct meta_names *s, uint64_t dir)
{
	bool found;
	size_t i;

	if ((s->dir_used + 1) * 2 > s->dir_slots && dirs_grow(s) < 0) {
		reset(s);
		return -ENOMEM;
	}
	i = dir_find(s, dir, &found);
	if (!found) {
		if (s->dirs[i] == DIR_EMPTY)
			s->dir_used++;
		s->dirs[i] = dir;
		s->ndirs++;
	}
	return 0;
}

void meta_names_dir_made(struct meta_names *s, uint64_t dir)
{
	if (s == NULL || dir == DIR_EMPTY || dir == DIR_GONE)
		return;
	pthread_mutex_lock(&s->lock);
	(void)dir_learn(s, dir);
	pthread_mutex_unlock(&s->lock);
}

void meta_names_dir_gone(struct meta_names *s, uint64_t dir)
{
	if (s == NULL)
		return;
	pthread_mutex_lock(&s->lock);
	s->epoch++;
	dir_forget(s, dir);
	pthread_mutex_unlock(&s->lock);
}

/* Counts key, a name of the known directory parent (lock held). */
static void count_key(struct meta_names *s, uint64_t parent, uint64_t key)
{
	bool found;
	size_t i;

	if (s->nnames >= s->max_names) {
		reset(s);
		s->resets++;
		return;
	}
	if ((s->name_used + 1) * 2 > s->name_slots && names_grow(s) < 0) {
		reset(s);
		return;
	}
	i = name_find(s, key, &found);
	if (found) {
		if (s->names[i].count == UINT32_MAX) {
			dir_forget(s, parent); /* cannot count it: unknown from now */
			return;
		}
		s->names[i].count++;
	} else {
		if (s->names[i].key == 0)
			s->name_used++;
		s->names[i].key = key;
		s->names[i].count = 1;
	}
	s->nnames++;
}

void meta_names_add(struct meta_names *s, uint64_t parent, const char *name, size_t nlen)
{
	uint64_t key = name_key(parent, name, nlen);

	if (s == NULL)
		return;
	pthread_mutex_lock(&s->lock);
	s->epoch++;
	if (dir_known(s, parent))
		count_key(s, parent, key);
	pthread_mutex_unlock(&s->lock);
}

void meta_names_del(struct meta_names *s, uint64_t parent, const char *name, size_t nlen)
{
	uint64_t key = name_key(parent, name, nlen);
	bool found = false;
	size_t i;

	if (s == NULL)
		return;
	pthread_mutex_lock(&s->lock);
	s->epoch++;
	if (dir_known(s, parent)) {
		if (s->name_slots && (i = name_find(s, key, &found), found)) {
			s->names[i].count--;
			s->nnames--;
		} else {
			/* The database had a name this set did not count: it
			 * cannot answer for parent any more. */
			dir_forget(s, parent);
		}
	}
	pthread_mutex_unlock(&s->lock);
}

void meta_names_taken(struct meta_names *s, uint64_t parent, const char *name, size_t nlen)
{
	uint64_t key = name_key(parent, name, nlen);
	bool found = false;

	if (s == NULL)
		return;
	pthread_mutex_lock(&s->lock);
	if (dir_known(s, parent)) {
		if (s->name_slots)
			name_find(s, key, &found);
		if (!found)
			dir_forget(s, parent);
	}
	pthread_mutex_unlock(&s->lock);
}

int meta_names_absent(struct meta_names *s, uint64_t parent, const char *name, size_t nlen)
{
	uint64_t key = name_key(parent, name, nlen);
	bool found = false;
	int absent = 0;

	if (s == NULL)
		return 0;
	pthread_mutex_lock(&s->lock);
	if (dir_known(s, parent)) {
		if (s->name_slots)
			name_find(s, key, &found);
		absent = !found;
		s->absent += (uint64_t)absent;
	}
	pthread_mutex_unlock(&s->lock);
	return absent;
}

/* ---- listings ---- */

void meta_names_scan(struct meta_names *s, uint64_t dir, uint64_t after)
{
	if (s == NULL)
		return;
	pthread_mutex_lock(&s->lock);
	if (after == 0 && !dir_known(s, dir)) {
		s->scan.dir = dir;
		s->scan.epoch = s->epoch;
		s->scan.next_after = 0;
		s->scan.n = 0;
	} else if (s->scan.dir == dir && s->scan.next_after != after) {
		s->scan.dir = 0; /* not the listing's next part: it ends here */
	}
	pthread_mutex_unlock(&s->lock);
}

void meta_names_scan_name(struct meta_names *s, uint64_t dir, const char *name, size_t nlen,
			  uint64_t cookie)
{
	if (s == NULL)
		return;
	pthread_mutex_lock(&s->lock);
	if (s->scan.dir != dir)
		goto out;
	if (s->scan.n == s->scan.cap) {
		size_t cap = s->scan.cap ? s->scan.cap * 2 : 256;
		uint64_t *k = NULL;

		if (cap > s->max_names)
			cap = s->max_names;
		if (cap > s->scan.n)
			k = realloc(s->scan.keys, cap * sizeof(*k));
		if (k == NULL) {
			s->scan.dir = 0; /* too large to learn, or no memory */
			goto out;
		}
		s->scan.keys = k;
		s->scan.cap = cap;
	}
	s->scan.keys[s->scan.n++] = name_key(dir, name, nlen);
	s->scan.next_after = cookie;
out:
	pthread_mutex_unlock(&s->lock);
}

void meta_names_scan_end(struct meta_names *s, uint64_t dir, uint64_t after)
{
	if (s == NULL)
		return;
	pthread_mutex_lock(&s->lock);
	if (s->scan.dir != dir || s->scan.next_after != after || s->scan.epoch != s->epoch ||
	    dir_known(s, dir))
		goto done;
	if (s->nnames + s->scan.n > s->max_names || dir_learn(s, dir) < 0)
		goto done;
	for (size_t i = 0; i < s->scan.n && dir_known(s, dir); i++)
		count_key(s, dir, s->scan.keys[i]);
	s->scans += dir_known(s, dir);
done:
	s->scan.dir = 0;
	if (s->scan.cap > 4096) {
		free(s->scan.keys); /* a large listing's buffer is not kept */
		s->scan.keys = NULL;
		s->scan.cap = 0;
	}
	pthread_mutex_unlock(&s->lock);
}

void meta_names_stats_get(struct meta_names *s, struct meta_names_stats *out)
{
	memset(out, 0, sizeof(*out));
	if (s == NULL)
		return;
	pthread_mutex_lock(&s->lock);
	out->dirs = s->ndirs;
	out->names = s->nnames;
	out->absent = s->absent;
	out->resets = s->resets;
	out->scans = s->scans;
	pthread_mutex_unlock(&s->lock);
}
