/*
 * seeds: the objects of small jobs, written into ferry-mountd's read cache
 * directory as they are stored, so that a read of a file soon after its
 * commit finds its bytes there (reconcile_job.h says why and how). A seed
 * file is this process's (its bit in job.seeded) until a Committed reply
 * that names it is queued; from then on it is ferry-mountd's, which puts it
 * in its cache or removes it. Seeds of a job that ends any other way are
 * removed with the job, and those a killed reconciler left by the next
 * one at its start.
 */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <string.h>
#include <unistd.h>

#include "dirs.h"
#include "log.h"
#include "reconciler.h"
#include "slice.h"

static int sweep_one(const char *path, const struct stat *st, int type, struct FTW *ftw)
{
	size_t n = strlen(path), sn = strlen(RECONCILE_SEED_SUFFIX);

	(void)st;
	(void)ftw;
	if (type == FTW_F && n > sn && strcmp(path + n - sn, RECONCILE_SEED_SUFFIX) == 0)
		unlink(path);
	return 0;
}

void seeds_sweep(struct rec *r)
{
	if (r->cache_fd >= 0 && nftw(r->cfg.cache_dir, sweep_one, 16, FTW_PHYS) != 0)
		log_warnx("read cache directory %s: cannot look for old seeds", r->cfg.cache_dir);
}

/* The seed of object obj of j: false if obj is past what seeds cover. */
static bool seed_of(const struct job *j, uint64_t obj, struct reconcile_seed *out)
{
	struct reconcile_object o;

	if (obj >= RECONCILE_SEEDS_MAX || reconcile_plan_object(&j->plan, obj, &o) < 0)
		return false;
	out->slice_id = j->plan.slices[o.slice].s.id;
	out->index = o.index;
	out->slice_size = j->plan.slices[o.slice].s.size;
	return true;
}

bool seeds_wanted(const struct rec *r, const struct job *j, uint64_t obj, const char *key,
		  char *tmp, size_t tmpcap)
{
	/* A job from the journal has nobody to hand its seeds to; an object
	 * seeded in an earlier attempt has the same bytes in its seed. */
	if (r->cache_fd < 0 || r->stopping || !j->conn || j->rj.length > RECONCILE_SEED_JOB_MAX ||
	    j->plan.nobjects > RECONCILE_SEEDS_MAX || obj >= RECONCILE_SEEDS_MAX ||
	    (j->seeded & (1u << obj)))
		return false;
	return reconcile_seed_tmp_name(key, tmp, tmpcap);
}

bool seeds_write(struct rec *r, const char *key, const char *tmp, const void *sealed, size_t len)
{
	bool ok;
	int fd;

	if (dirs_make_parents_at(r->cache_fd, key, 0700) < 0)
		return false;
	/* No fsync: ferry-mountd checks the trailer of a seed at its first
	 * use. */
	fd = openat(r->cache_fd, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd < 0)
		return false;
	ok = write(fd, sealed, len) == (ssize_t)len;
	close(fd);
	if (!ok)
		unlinkat(r->cache_fd, tmp, 0);
	return ok;
}

void seeds_list(const struct job *j, struct reconcile_reply *rep)
{
	rep->nseeds = 0;
	for (uint64_t k = 0; k < RECONCILE_SEEDS_MAX; k++) {
		if ((j->seeded & (1u << k)) && seed_of(j, k, &rep->seeds[rep->nseeds]))
			rep->nseeds++;
	}
}

void seeds_remove(struct rec *r, struct job *j)
{
	struct reconcile_seed s;
	char key[SLICE_KEY_MAX], tmp[RECONCILE_SEED_NAME_MAX];

	for (uint64_t k = 0; j->seeded && k < RECONCILE_SEEDS_MAX; k++) {
		if ((j->seeded & (1u << k)) && seed_of(j, k, &s) &&
		    reconcile_seed_names(&s, j->plan.block_size, key, sizeof(key), tmp, sizeof(tmp)))
			unlinkat(r->cache_fd, tmp, 0);
	}
	j->seeded = 0;
}
