/*
 * checkpoint: `ferry checkpoint MOUNTPOINT NAME` once its drain is done
 * (drain.c). The metadata engine takes the checkpoint under a short fence
 * (meta_checkpoint_take: the slices are fenced while a snapshot begins and
 * its slices are recorded as kept), the snapshot is dumped to an unnamed
 * file in the staging directory while writers go on, and the dump is stored
 * with the objects (checkpoint_store.h). A store that fails drops the
 * checkpoint again: it is kept whole or not at all.
 *
 * Runs on the drain's thread; owns only its temporary file.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint_store.h"
#include "log.h"
#include "meta_dump.h"
#include "mountd.h"

/* An unnamed file in the staging directory (its file system has room
 * for what is staged; /tmp may not). */
static int dump_file(struct mountd *md)
{
	char name[64];
	int fd = openat(md->staging_dirfd, ".", O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);

	if (fd >= 0 || (errno != EOPNOTSUPP && errno != EISDIR && errno != EINVAL))
		return fd < 0 ? -errno : fd;
	snprintf(name, sizeof(name), ".checkpoint.%d", (int)getpid());
	fd = openat(md->staging_dirfd, name, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
	if (fd < 0)
		return -errno;
	unlinkat(md->staging_dirfd, name, 0);
	return fd;
}

/* The snapshot is taken: the namespace may change again (drain.c took
 * the fence; this is its thread). */
static void fence_lift(void *arg)
{
	struct mountd *md = arg;

	if (!atomic_load(&md->ns_fenced))
		return;
	md->ns_fence_lifted_ns = mono_now_ns();
	atomic_store(&md->ns_fenced, false);
	pthread_rwlock_unlock(&md->ns_fence);
}

int checkpoint_take(struct mountd *md, const char *name, struct drain_progress *p, char *err,
		    size_t errlen)
{
	struct ckpt_manifest mf = { 0 };
	struct stat st;
	FILE *f = NULL;
	int fd, fd2 = -1, rc;

	fd = dump_file(md);
	if (fd < 0) {
		snprintf(err, errlen, "cannot make a file for the dump in the staging directory: %s",
			 strerror(-fd));
		return fd;
	}
	fd2 = dup(fd);
	if (fd2 < 0 || !(f = fdopen(fd2, "w"))) {
		rc = -errno;
		snprintf(err, errlen, "cannot write the dump: %s", strerror(-rc));
		if (fd2 >= 0)
			close(fd2);
		goto out;
	}
	rc = meta_checkpoint_take(md->meta, name, f, &mf.cp, &mf.records, &mf.pause_ms,
				  fence_lift, md, err, errlen);
	p->slice_pause_ms = mf.pause_ms;
	if (fclose(f) != 0 && rc == 0) {
		rc = -errno;
		snprintf(err, errlen, "cannot write the dump: %s", strerror(-rc));
	}
	if (rc < 0)
		goto drop;
	if (fstat(fd, &st) < 0) {
		rc = -errno;
		snprintf(err, errlen, "cannot stat the dump: %s", strerror(-rc));
		goto drop;
	}
	snprintf(mf.volume, sizeof(mf.volume), "%s", md->vol.uuid);
	rc = ckpt_store_put(md->store, fd, (uint64_t)st.st_size, &mf, err, errlen);
	if (rc < 0)
		goto drop;
	p->ckpt_records = mf.records;
	p->ckpt_dump_bytes = mf.dump_bytes;
	p->ckpt_slices = mf.cp.slices;
	p->ckpt_slice_bytes = mf.cp.bytes;
	log_info("checkpoint %s: %llu records (%llu bytes in %llu parts), %llu slices of %llu "
		 "bytes kept; slice commits were fenced for %.1f ms",
		 name, (unsigned long long)mf.records, (unsigned long long)mf.dump_bytes,
		 (unsigned long long)mf.parts, (unsigned long long)mf.cp.slices,
		 (unsigned long long)mf.cp.bytes, mf.pause_ms);
	goto out;
drop:
	if (rc != -EEXIST && mf.cp.name[0]) {
		char e2[256];
		meta_checkpoint_drop(md->meta, name, e2, sizeof(e2));
	}
	log_warnx("checkpoint %s: %s", name, err);
out:
	close(fd);
	return rc;
}
