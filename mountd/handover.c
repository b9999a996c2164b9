/*
 * handover: a live mount handed from one ferry-mountd to the next
 * (`ferry mount --upgrade`), without unmounting and without an error for
 * the applications that hold files open.
 *
 * libfuse has no call to resume a session without INIT. The FUSE
 * connection is one /dev/fuse fd; the kernel keeps queuing requests in it
 * while no daemon reads, so what a new daemon needs is that fd, the INIT
 * the kernel sent the first daemon (replayed to libfuse through custom I/O
 * with its reply swallowed: fuse_io.c), the open handles under the fh
 * numbers the kernel knows them by, and the write state of passthrough
 * opens (their staging files and fingerprints, and their backing ids,
 * which live in the kernel's connection and stay registered).
 *
 * Old side (this daemon):
 *  1. `handover SOCKET` is written to .control (special.c) by the CLI,
 *     which listens at SOCKET: handover_request() ends the FUSE loop
 *     (requests being handled finish first; new ones wait in the kernel).
 *  2. handover_send(): writes of the daemon path (not passthrough) of open
 *     handles are committed; if that fails the loop runs again and the
 *     CLI is told no. Then the background threads and the reconciler stop
 *     (jobs in flight commit), the Handover message goes to the CLI with
 *     the fd, the lease and the metadata are let go, and the daemon exits
 *     without unmounting.
 * New side (started by the CLI with --handover FUSEFD:BLOBFD, after the
 *  old one exited, so the volume's lock and lease are free):
 *  3. handover_load() decodes the blob; staging_recover() leaves the named
 *     staging files alone; the daemon opens everything as at any start.
 *  4. handover_serve() serves the fd (and ATTACHes it to ferry-brokerd for
 *     a brokered mount); handover_restore() makes the write states and the
 *     handles again before the first request is read.
 *
 * Anything not handed over explicitly (closed staging files, jobs, the
 * journal, mappings that outlived their opens) is found as after a crash
 * of the old daemon, which loses nothing.
 *
 * Ownership: md->handover_path (old side) and md->ho (new side, freed by
 * handover_restore()) are md's.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <limits.h>
#include <unistd.h>

#include "handover_blob.h"
#include "log.h"
#include "mountd.h"
#include "rpc_frame.h"

int handover_request(struct mountd *md, const char *socket_path)
{
	struct sockaddr_un sa;
	char *p;
	int rc = 0;

	if (socket_path[0] != '/' || strlen(socket_path) >= sizeof(sa.sun_path))
		return -EINVAL;
	if (!md->se)
		return -EAGAIN;
	if (md->uring_asked || atomic_load(&md->stats.uring_requests) > 0) {
		/* Ending the loop would end the ring threads for good, and no
		 * INIT was kept for a new daemon to answer from. */
		log_warnx("handover refused: this mount asked for io_uring (-o io_uring), whose "
			  "connection a new ferry-mountd cannot take over; unmount and mount again");
		return -EOPNOTSUPP;
	}
	p = strdup(socket_path);
	if (!p)
		return -ENOMEM;
	p[strcspn(p, "\n")] = '\0';
	pthread_mutex_lock(&md->handover_lock);
	if (md->handover_path)
		rc = -EBUSY;
	else
		md->handover_path = p;
	pthread_mutex_unlock(&md->handover_lock);
	if (rc < 0) {
		free(p);
		return rc;
	}
	log_info("handing the mount over to a new ferry-mountd (asked through %s)", CONTROL_NAME);
	fuse_session_exit(md->se);
	/* The loop's thread waits in sem_wait, which the exit flag alone does
	 * not end. */
	pthread_kill(md->main_thread, SIGUSR2);
	return 0;
}

/* The CLI's socket, checked to be served by root or this daemon's user. */
static int cli_connect(const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct ucred cred;
	socklen_t clen = sizeof(cred);
	int s, rc;

	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (s < 0)
		return -errno;
	if (connect(s, (struct sockaddr *)&sa, sizeof(sa)) < 0 ||
	    getsockopt(s, SOL_SOCKET, SO_PEERCRED, &cred, &clen) < 0) {
		rc = -errno;
		close(s);
		return rc;
	}
	if (cred.uid != 0 && cred.uid != getuid()) {
		log_warnx("handover: %s is served by uid %d, not by root or this daemon's user",
			  path, (int)cred.uid);
		close(s);
		return -EPERM;
	}
	return s;
}

struct settle_ctx {
	struct mountd *md;
	int rc;
};

/* Writes of the daemon path live in this daemon's memory (dirty ranges):
 * committed before the hand-over, so the new daemon starts them afresh. */
static void settle_one(uint64_t fh, enum handle_type type, void *obj, void *arg)
{
	struct settle_ctx *c = arg;
	uint64_t ino;
	bool writer, pt, setid;
	struct inode *i;
	int rc;

	if (type != HANDLE_FILE || c->rc < 0)
		return;
	handle_describe(type, obj, &ino, &writer, &pt, &setid);
	i = inode_ref_existing(c->md, ino);
	if (!i)
		return;
	pthread_mutex_lock(&i->lock);
	/* Readers of a local copy: it goes over as a passthrough staging file,
	 * which the new daemon knows how to serve. */
	if (pt && !i->w && i->nkept > 0) {
		rc = local_copy_before_change(c->md, i, fh,
					      c->md->fsync_local || c->md->copies_flushed, false,
					      false);
		if (rc < 0)
			c->rc = rc;
	}
	if (i->w && !i->w->passthrough && !i->pending) {
		rc = wstate_commit(c->md, i);
		if (rc == 0)
			wstate_drop(c->md, i);
		else
			c->rc = rc;
	}
	pthread_mutex_unlock(&i->lock);
	inode_unref(c->md, i, 0, 1);
}

struct collect_ctx {
	struct mountd *md;
	Ferry__Handover__Handle *h; /* handles, arrays owned by handover_send() */
	size_t nh;
	Ferry__Handover__Staged *s;
	char **names;        /* s[k].name, owned here */
	uint8_t **prints;    /* s[k].prints.data, owned here */
	size_t ns;
};

static void collect_one(uint64_t fh, enum handle_type type, void *obj, void *arg)
{
	struct collect_ctx *c = arg;
	Ferry__Handover__Handle *h = &c->h[c->nh++];
	bool writer, pt, setid;
	uint64_t ino;

	handle_describe(type, obj, &ino, &writer, &pt, &setid);
	ferry__handover__handle__init(h);
	h->fh = fh;
	h->type = (uint32_t)type;
	h->ino = ino;
	h->has_writer = h->has_passthrough = h->has_setid_clear = true;
	h->writer = writer;
	h->passthrough = pt;
	h->setid_clear = setid;
	if (type != HANDLE_FILE || !pt)
		return;
	for (size_t k = 0; k < c->ns; k++)
		if (c->s[k].ino == ino)
			return;
	/* Nothing runs but this thread: the inode's lock is not needed, and
	 * a passthrough handle's inode has its write state. */
	struct inode *i = inode_find(c->md, ino);
	struct wstate *w = i ? i->w : NULL;
	const char *slash = w && w->path ? strrchr(w->path, '/') : NULL;
	if (!w || !w->passthrough || !slash)
		return;
	Ferry__Handover__Staged *s = &c->s[c->ns];
	ferry__handover__staged__init(s);
	s->ino = ino;
	c->names[c->ns] = strdup(slash + 1);
	s->name = c->names[c->ns];
	if (!s->name)
		return; /* the handles then fail over to cached ones */
	s->backing_id = w->backing_id;
	s->has_mtime_set = s->has_mtime_sec = s->has_mtime_nsec = true;
	s->mtime_set = w->mtime_set;
	s->mtime_sec = w->mtime.tv_sec;
	s->mtime_nsec = (uint32_t)w->mtime.tv_nsec;
	if (w->nprints > 0 && w->nprints <= HANDOVER_PRINTS_MAX &&
	    (c->prints[c->ns] = malloc(w->nprints * HANDOVER_PRINT_BYTES))) {
		uint8_t *at = c->prints[c->ns];

		for (size_t k = 0; k < w->nprints; k++, at += HANDOVER_PRINT_BYTES) {
			memcpy(at, &w->prints[k].print, 8);
			memcpy(at + 8, &w->prints[k].len, 4);
		}
		s->has_prints = true;
		s->prints.data = c->prints[c->ns];
		s->prints.len = w->nprints * HANDOVER_PRINT_BYTES;
	} /* else the next commit stores the whole file */
	c->ns++;
}

/*
 * A foreground daemon is some process's child (a container's main
 * process): the CLI answers with the binary to run, the state in a memfd
 * and its ready pipe, and this process executes the new daemon itself, so
 * its pid, parent and FUSE fd stay. Returns only on failure.
 */
static int reexec_wait(struct mountd *md, int sock)
{
	struct timeval tv = { .tv_sec = 30 };
	char exe[PATH_MAX], ho[48], rf[16];
	const char **argv;
	uint8_t *buf = NULL;
	size_t len = 0, nfds = 0;
	int fds[RPC_FDS_MAX], rc, n = 0;

	setsockopt(sock, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	rc = rpc_frame_recv(sock, PATH_MAX, 2, &buf, &len, fds, &nfds);
	if (rc == 0 && (nfds != 2 || len == 0 || len >= sizeof(exe) || buf[0] != '/'))
		rc = -EPROTO;
	if (rc < 0) {
		rpc_fds_close(fds, nfds);
		free(buf);
		return rc;
	}
	memcpy(exe, buf, len);
	exe[len] = '\0';
	free(buf);
	argv = calloc((size_t)md->argc + 6, sizeof(*argv));
	if (!argv) {
		rpc_fds_close(fds, nfds);
		return -ENOMEM;
	}
	lease_stop(md);
	meta_close(md->meta);
	md->meta = NULL;
	snprintf(ho, sizeof(ho), "%d:%d", md->fio.fd, fds[0]);
	snprintf(rf, sizeof(rf), "%d", fds[1]);
	argv[n++] = exe;
	argv[n++] = "--handover";
	argv[n++] = ho;
	argv[n++] = "--ready-fd";
	argv[n++] = rf;
	for (int k = 1; k < md->argc; k++) {
		if (!strcmp(md->argv[k], "--handover") || !strcmp(md->argv[k], "--ready-fd")) {
			k++;
			continue;
		}
		argv[n++] = md->argv[k];
	}
	argv[n] = NULL;
	if (fcntl(md->fio.fd, F_SETFD, 0) < 0 || fcntl(fds[0], F_SETFD, 0) < 0 ||
	    fcntl(fds[1], F_SETFD, 0) < 0)
		return -errno;
	log_info("executing %s in place (a foreground daemon keeps its pid)", exe);
	execv(exe, (char *const *)argv);
	rc = -errno;
	dprintf(fds[1], "cannot run %s: %s\n", exe, strerror(errno));
	/* Past the point of no return: the caller exits as after a crash. */
	return rc;
}

int handover_send(struct mountd *md)
{
	Ferry__Handover__Handover msg = FERRY__HANDOVER__HANDOVER__INIT;
	struct settle_ctx settle = { .md = md };
	struct collect_ctx col = { .md = md };
	Ferry__Handover__Handle **hp = NULL;
	Ferry__Handover__Staged **sp = NULL;
	struct local_copy_handed *kept = NULL; /* names owned here */
	Ferry__Handover__Kept *kmsg = NULL, **kp = NULL;
	size_t nkept = 0;
	char *path;
	uint8_t *buf = NULL;
	size_t len, n = handle_count(md->handles);
	int sock, rc, fd = md->fio.fd;

	pthread_mutex_lock(&md->handover_lock);
	path = md->handover_path;
	md->handover_path = NULL;
	pthread_mutex_unlock(&md->handover_lock);
	if (!path)
		return -EINVAL;
	sock = cli_connect(path);
	if (sock < 0) {
		log_errno(sock, "handover: cannot reach the CLI at %s; serving on", path);
		free(path);
		return sock;
	}
	if (md->fio.init_len == 0) {
		rc = -ENODATA;
		log_warnx("handover: the kernel's INIT was not kept; serving on");
		goto refuse;
	}
	handle_table_each(md->handles, settle_one, &settle);
	if (settle.rc < 0) {
		rc = settle.rc;
		log_errno(rc, "handover: writes of open files could not be committed; serving on");
		goto refuse;
	}
	/* From here on the mount is the new daemon's, whatever happens. */
	md->handing_over = true;
	atomic_store(&md->fuse_done, true);
	gc_stop(md);
	copy_build_stop(md); /* before the copies are counted */
	write_back_stop(md);
	rclient_stop(md); /* jobs in flight commit first */
	staging_pool_free(md);
	broker_link_flush_closes(md); /* sent by us: a re-exec would lose them */
	/* The copies readers share went over as staging files (settle_one);
	 * the current ones go over by name, the rest go. */
	kept = calloc(HANDOVER_KEPT_MAX, sizeof(*kept));
	nkept = kept ? local_copy_hand_over(md, kept, HANDOVER_KEPT_MAX) : 0;
	local_copy_drop_all(md);
	kp = calloc(nkept + 1, sizeof(*kp));
	kmsg = calloc(nkept + 1, sizeof(*kmsg));
	col.h = calloc(n + 1, sizeof(*col.h));
	col.s = calloc(n + 1, sizeof(*col.s));
	col.names = calloc(n + 1, sizeof(*col.names));
	col.prints = calloc(n + 1, sizeof(*col.prints));
	hp = calloc(n + 1, sizeof(*hp));
	sp = calloc(n + 1, sizeof(*sp));
	rc = -ENOMEM;
	if (!col.h || !col.s || !col.names || !col.prints || !hp || !sp || !kp || !kmsg)
		goto out;
	size_t nsent = 0;

	for (size_t k = 0; k < nkept; k++) {
		if (kept[k].size == 0)
			continue;
		ferry__handover__kept__init(&kmsg[nsent]);
		kmsg[nsent].ino = kept[k].ino;
		kmsg[nsent].name = kept[k].name;
		kmsg[nsent].size = kept[k].size;
		kmsg[nsent].has_ctime_sec = kmsg[nsent].has_ctime_nsec = true;
		kmsg[nsent].ctime_sec = kept[k].ctime.tv_sec;
		kmsg[nsent].ctime_nsec = (uint32_t)kept[k].ctime.tv_nsec;
		kmsg[nsent].has_built = true;
		kmsg[nsent].built = kept[k].built;
		kmsg[nsent].has_layout_print = true;
		kmsg[nsent].layout_print = kept[k].layout_print;
		kp[nsent] = &kmsg[nsent];
		nsent++;
	}
	msg.n_kept = nsent;
	msg.kept = kp;
	handle_table_each(md->handles, collect_one, &col);
	for (size_t k = 0; k < col.nh; k++)
		hp[k] = &col.h[k];
	for (size_t k = 0; k < col.ns; k++)
		sp[k] = &col.s[k];
	msg.version = HANDOVER_VERSION;
	msg.init.data = md->fio.init;
	msg.init.len = md->fio.init_len;
	msg.n_handles = col.nh;
	msg.handles = hp;
	msg.n_staged = col.ns;
	msg.staged = sp;
	msg.has_broker_mount_id = md->cfg.broker != NULL;
	msg.broker_mount_id = atomic_load(&md->broker_mount_id);
	len = ferry__handover__handover__get_packed_size(&msg);
	buf = len <= HANDOVER_MAX ? malloc(len) : NULL;
	if (!buf)
		goto out;
	ferry__handover__handover__pack(&msg, buf);
	rc = rpc_frame_send(sock, buf, len, &fd, 1);
	if (rc < 0)
		goto out;
	log_info("handed the mount over: %zu open handles, %zu passthrough staging files, %zu "
		 "local copies", col.nh, col.ns, msg.n_kept);
	if (md->cfg.foreground) {
		rc = reexec_wait(md, sock);
		goto out; /* failed: reexec() returns only then */
	}
	/* The volume is the new daemon's: its lease and lock go with us. */
	lease_stop(md);
	meta_close(md->meta);
	md->meta = NULL;
	rc = 0;
out:
	if (rc < 0)
		log_errno(rc, "handover: could not send the mount's state; the mount waits for a "
			  "daemon (a brokered one: ferry mount --broker takes it over)");
	for (size_t k = 0; col.names && k < col.ns; k++)
		free(col.names[k]);
	for (size_t k = 0; col.prints && k < col.ns; k++)
		free(col.prints[k]);
	free(col.names);
	free(col.prints);
	free(col.h);
	free(col.s);
	free(hp);
	free(sp);
	/* A copy the new daemon did not get is removed by its sweep (the
	 * pid in its name is dead, or its own after a re-exec). */
	for (size_t k = 0; k < nkept; k++)
		free(kept[k].name);
	free(kept);
	free(kp);
	free(kmsg);
	free(buf);
	close(sock);
	free(path);
	return rc;
refuse:
	/* The CLI sees the connection end with no frame: it reports it. */
	close(sock);
	free(path);
	return rc;
}

int handover_load(struct mountd *md, const char *arg, char *err, size_t errlen)
{
	int fuse_fd = -1, blob = -1, rc;
	uint8_t *buf = NULL;
	struct stat st;
	char *end;
	long v;

	v = strtol(arg, &end, 10);
	if (end == arg || *end != ':' || v < 3 || v > INT32_MAX)
		goto usage;
	fuse_fd = (int)v;
	v = strtol(end + 1, &end, 10);
	if (*end || v < 3 || v > INT32_MAX || v == fuse_fd)
		goto usage;
	blob = (int)v;
	if (fcntl(fuse_fd, F_SETFD, FD_CLOEXEC) < 0 || fcntl(blob, F_SETFD, FD_CLOEXEC) < 0 ||
	    fstat(blob, &st) < 0) {
		rc = -errno;
		snprintf(err, errlen, "--handover %s: %s", arg, strerror(errno));
		return rc;
	}
	if (st.st_size <= 0 || st.st_size > HANDOVER_MAX) {
		rc = -EBADMSG;
		snprintf(err, errlen, "--handover: a state of %lld bytes", (long long)st.st_size);
		goto out;
	}
	buf = malloc((size_t)st.st_size);
	if (!buf) {
		rc = -ENOMEM;
		snprintf(err, errlen, "--handover: out of memory");
		goto out;
	}
	if (pread(blob, buf, (size_t)st.st_size, 0) != st.st_size) {
		rc = -EIO;
		snprintf(err, errlen, "--handover: cannot read the state");
		goto out;
	}
	rc = handover_blob_decode(buf, (size_t)st.st_size, &md->ho, err, errlen);
	if (rc == 0) {
		md->ho_fuse_fd = fuse_fd;
		md->lookups_unknown = true;
	}
out:
	free(buf);
	close(blob);
	return rc;
usage:
	snprintf(err, errlen, "--handover takes FUSEFD:STATEFD, not %s", arg);
	return -EINVAL;
}

uint64_t handover_kept_bytes(struct mountd *md)
{
	uint64_t n = 0;

	for (size_t k = 0; md->ho && k < md->ho->n_kept; k++)
		n += md->ho->kept[k]->size;
	return n;
}

bool handover_kept_names(struct mountd *md, const char *name)
{
	for (size_t k = 0; md->ho && k < md->ho->n_kept; k++)
		if (strcmp(md->ho->kept[k]->name, name) == 0)
			return true;
	return false;
}

bool handover_names(struct mountd *md, const char *name)
{
	for (size_t k = 0; md->ho && k < md->ho->n_staged; k++)
		if (strcmp(md->ho->staged[k]->name, name) == 0)
			return true;
	return handover_kept_names(md, name);
}

int handover_serve(struct mountd *md, char *err, size_t errlen)
{
	int fd = md->ho_fuse_fd, rc;

	if (md->cfg.broker && (rc = broker_link_attach(md, fd, err, errlen)) < 0)
		return rc;
	rc = fuse_io_start(md, fd, md->ho->init.data, md->ho->init.len);
	if (rc < 0) {
		snprintf(err, errlen, "cannot serve the connection handed over: %s", strerror(-rc));
		return rc;
	}
	md->ho_fuse_fd = -1; /* libfuse's now */
	/* libfuse did not mount it: at exit this daemon unmounts itself. */
	md->unmount_self = md->cfg.broker == NULL;
	return 0;
}

/* The write state of a passthrough staging file handed over, as its inode
 * had it: the backing id is still registered in the connection. */
static int staged_restore(struct mountd *md, const Ferry__Handover__Staged *s, struct inode **held)
{
	struct wstate *w = NULL;
	struct inode *i;
	struct stat st;
	int rc = 0;

	*held = NULL;
	i = inode_ref(md, s->ino, 0, 1);
	w = calloc(1, sizeof(*w));
	if (w)
		w->fd = -1;
	if (!i || !w || asprintf(&w->path, "%s/%s", md->cfg.staging_dir, s->name) < 0) {
		if (w)
			w->path = NULL;
		rc = -ENOMEM;
		goto fail;
	}
	w->fd = openat(md->staging_dirfd, s->name, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
	if (w->fd < 0 || fstat(w->fd, &st) < 0) {
		rc = -errno;
		goto fail;
	}
	pthread_mutex_lock(&i->lock);
	if (i->w) {
		pthread_mutex_unlock(&i->lock);
		rc = -EEXIST;
		goto fail;
	}
	w->passthrough = true;
	w->copy_unsynced = staging_is_copy(s->name);
	w->backing_id = s->backing_id;
	w->size = (uint64_t)st.st_size;
	/* What the old daemon's last commit stored, so that the next one
	 * stores only what changed since (none came: the whole file). Its
	 * size and mtime are not known here: the next commit records them. */
	if (s->has_prints && s->prints.len) {
		const uint8_t *at = s->prints.data;

		w->nprints = s->prints.len / HANDOVER_PRINT_BYTES;
		w->prints = calloc(w->nprints, sizeof(*w->prints));
		if (!w->prints) {
			pthread_mutex_unlock(&i->lock);
			rc = -ENOMEM;
			goto fail;
		}
		for (size_t k = 0; k < w->nprints; k++, at += HANDOVER_PRINT_BYTES) {
			memcpy(&w->prints[k].print, at, 8);
			memcpy(&w->prints[k].len, at + 8, 4);
		}
	}
	w->size_changed = true;
	w->mtime_set = s->mtime_set;
	w->mtime.tv_sec = s->mtime_sec;
	w->mtime.tv_nsec = s->mtime_nsec < 1000000000u ? s->mtime_nsec : 0;
	w->started_mtime = st.st_mtim;
	w->dir_synced = true;
	i->w = w;
	pthread_mutex_unlock(&i->lock);
	*held = i;
	return 0;
fail:
	if (w) {
		if (w->fd >= 0)
			close(w->fd);
		free(w->path);
		free(w);
	}
	if (i)
		inode_unref(md, i, 0, 1);
	return rc;
}

int handover_restore(struct mountd *md)
{
	Ferry__Handover__Handover *ho = md->ho;
	struct inode **held = NULL;
	uint64_t *fhs = NULL;
	enum handle_type *types = NULL;
	void **objs = NULL;
	size_t n = 0;
	int rc = 0;

	if (!ho)
		return 0;
	held = calloc(ho->n_staged + 1, sizeof(*held));
	fhs = calloc(ho->n_handles + 1, sizeof(*fhs));
	types = calloc(ho->n_handles + 1, sizeof(*types));
	objs = calloc(ho->n_handles + 1, sizeof(*objs));
	if (!held || !fhs || !types || !objs) {
		rc = -ENOMEM;
		goto out;
	}
	for (size_t k = 0; k < ho->n_staged; k++) {
		int e = staged_restore(md, ho->staged[k], &held[k]);
		if (e < 0)
			/* Its handles become cached ones: the kernel still
			 * writes the file through the backing file, and the
			 * next start finds it (as after a crash). */
			log_errno(e, "handover: cannot take up the staging file %s of inode %llu",
				  ho->staged[k]->name, (unsigned long long)ho->staged[k]->ino);
	}
	for (size_t k = 0; k < ho->n_handles; k++) {
		const Ferry__Handover__Handle *h = ho->handles[k];
		void *obj;

		obj = handle_rebuild(md, (enum handle_type)h->type, h->fh, h->ino, h->writer,
				     h->passthrough, h->setid_clear);
		if (!obj) {
			rc = -ENOMEM;
			goto out;
		}
		fhs[n] = h->fh;
		types[n] = (enum handle_type)h->type;
		objs[n++] = obj;
	}
	rc = handle_table_restore(md->handles, fhs, types, objs, n);
	if (rc == 0)
		n = 0; /* the table's now */
	else
		log_errno(rc, "handover: the handles do not fit this daemon's table");
	/* Files unlinked while open: freed at their last close, as the old
	 * daemon would have. */
	for (size_t k = 0; rc == 0 && k < ho->n_handles; k++) {
		struct meta_attr a;

		if (ho->handles[k]->type == HANDLE_FILE &&
		    meta_getattr(md->meta, ho->handles[k]->ino, &a) == 0 && a.nlink == 0)
			inode_mark_unlinked(md, ho->handles[k]->ino);
	}
	/* After the handles: a copy whose inode has a write state now (a
	 * reader's open that went over as one) is not kept. Oldest first
	 * (they came newest first), so that the eviction order stays. */
	for (size_t k = ho->n_kept; rc == 0 && k-- > 0;) {
		const Ferry__Handover__Kept *c = ho->kept[k];

		local_copy_adopt(md, c->ino, c->name, c->has_ctime_sec ? c->size : 0,
				 (struct timespec){ .tv_sec = c->ctime_sec,
						    .tv_nsec = c->ctime_nsec },
				 c->has_layout_print ? &c->layout_print : NULL,
				 c->has_built && c->built, false);
	}
	if (rc == 0)
		log_info("took the mount over: %zu open handles, %zu passthrough staging files, %zu "
			 "local copies", ho->n_handles, ho->n_staged, ho->n_kept);
out:
	for (size_t k = 0; k < n; k++)
		mountd_handle_free(md, types[k], objs[k]);
	for (size_t k = 0; held && k < ho->n_staged; k++) {
		struct inode *i = held[k];

		if (!i)
			continue;
		/* A staging file no handle came for: written on by nobody,
		 * handed to the reconciler from the retry list. */
		pthread_mutex_lock(&i->lock);
		if (i->w && i->w->npt == 0 && !i->pending) {
			i->w->mapped = true;
			write_back_defer(md, i);
		}
		pthread_mutex_unlock(&i->lock);
		inode_unref(md, i, 0, 1);
	}
	free(held);
	free(fhs);
	free(types);
	free(objs);
	handover_blob_free(ho);
	md->ho = NULL;
	return rc;
}
