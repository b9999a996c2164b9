/*
 * The virtual files in the root of every mount, never database inodes:
 *
 *  .stats    read-only (0444): the statistics, rendered at open.
 *  .control  the owner's (0600: the uid ferry-mountd runs as; root too):
 *            requests any tool can send without the CLI. The protocol
 *            (README "The .control file"): open it read-write, write one
 *            request line, read the reply. A read at offset 0 renders the
 *            request's state afresh ("key value" lines); reads further on
 *            continue that same rendering, so `cat` and pread(fd, 0) both
 *            work. Requests:
 *
 *              drain [timeout=SEC] [wait]
 *
 *            takes a mark and commits everything written up to it
 *            (drain.c). Without `wait` the write returns once the mark is
 *            taken; with it, when the drain ends: success, or ETIMEDOUT
 *            (timed out), EIO (a file failed), EINTR (interrupted: the
 *            drain is cancelled). One request per open; EBUSY for a second.
 *            Closing the file cancels a drain still running (what was
 *            committed stays committed).
 *
 *              handover SOCKET
 *
 *            (ferry mount --upgrade) hands the mount to a new ferry-mountd
 *            through the Unix socket SOCKET (handover.c).
 *
 * Ownership: a struct special_file is owned by its HANDLE_SPECIAL slot; it
 * owns its rendered text and its drain.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"
#include "meta_dump.h"
#include "mountd.h"

#define CONTROL_REQUEST_MAX 256

struct special_file {
	uint64_t ino;            /* STATS_INO or CONTROL_INO */
	pthread_mutex_t lock;    /* .control: data and drain change under it */
	char *data;              /* owned: the last rendering */
	size_t len;
	struct drain *drain;     /* owned: .control's request, or NULL */
};

bool special_ino(uint64_t ino)
{
	return ino == STATS_INO || ino == CONTROL_INO;
}

uint64_t special_named(uint64_t parent, const char *name)
{
	if (parent != META_ROOT_INO)
		return 0;
	if (strcmp(name, STATS_NAME) == 0)
		return STATS_INO;
	if (strcmp(name, CONTROL_NAME) == 0)
		return CONTROL_INO;
	return 0;
}

void special_stat(struct mountd *md, uint64_t ino, struct stat *st)
{
	memset(st, 0, sizeof(*st));
	st->st_ino = ino;
	if (ino == CONTROL_INO) {
		st->st_mode = S_IFREG | 0600;
		st->st_uid = geteuid();
		st->st_gid = getegid();
	} else {
		st->st_mode = S_IFREG | 0444;
	}
	st->st_nlink = 1;
	st->st_size = 0; /* opened with direct_io: the size is not used */
	st->st_blksize = 4096;
	st->st_atim.tv_sec = st->st_mtim.tv_sec = st->st_ctim.tv_sec = md->started;
}

static void special_free(struct special_file *sf)
{
	if (!sf)
		return;
	drain_free(sf->drain);
	pthread_mutex_destroy(&sf->lock);
	free(sf->data);
	free(sf);
}

void special_handle_free(void *obj)
{
	special_free(obj);
}

int special_open(struct mountd *md, uint64_t ino, struct fuse_file_info *fi)
{
	struct special_file *sf;
	uint64_t fh;
	int rc = 0;

	if (ino == STATS_INO && (fi->flags & O_ACCMODE) != O_RDONLY)
		return -EACCES;
	sf = calloc(1, sizeof(*sf));
	if (!sf)
		return -ENOMEM;
	sf->ino = ino;
	pthread_mutex_init(&sf->lock, NULL);
	if (ino == STATS_INO)
		rc = stats_render(md, &sf->data, &sf->len);
	if (rc == 0)
		rc = handle_add(md->handles, HANDLE_SPECIAL, sf, &fh);
	if (rc < 0) {
		special_free(sf);
		return rc;
	}
	fi->fh = fh;
	fi->direct_io = 1; /* the content is made at open or read; size 0 in getattr */
	fi->noflush = 1;
	return 0;
}

void special_release(struct mountd *md, uint64_t fh)
{
	special_free(handle_remove(md->handles, fh, HANDLE_SPECIAL));
}

/* .control's reply text for its state now, into sf->data (sf->lock held). */
static int control_render(struct special_file *sf)
{
	struct drain_progress p;
	char *report = NULL, *text = NULL;
	int n;

	if (!sf->drain) {
		n = asprintf(&text, "state idle\nrequests drain [timeout=SEC] [wait]\n"
				    "requests checkpoint NAME [timeout=SEC] [wait]\n");
	} else {
		char ckpt[256] = "";

		report = drain_progress(sf->drain, &p);
		if (p.checkpoint)
			snprintf(ckpt, sizeof(ckpt),
				 "checkpoint_taken %d\npause_ms %.1f\nslice_pause_ms %.1f\n"
				 "checkpoint_records %llu\n"
				 "checkpoint_dump_bytes %llu\ncheckpoint_slices %llu\n"
				 "checkpoint_slice_bytes %llu\n",
				 p.checkpoint_taken, p.pause_ms, p.slice_pause_ms,
				 (unsigned long long)p.ckpt_records,
				 (unsigned long long)p.ckpt_dump_bytes,
				 (unsigned long long)p.ckpt_slices,
				 (unsigned long long)p.ckpt_slice_bytes);
		n = asprintf(&text,
			     "request %s\nstate %s\nmark %llu\nelapsed_ms %llu\nfiles_left %llu\n"
			     "bytes_left %llu\nblocks_left %llu\nopen_left %llu\nfiles_at_mark %llu\n"
			     "bytes_at_mark %llu\nfiles_failed %llu\n%s%s",
			     p.checkpoint ? "checkpoint" : "drain",
			     drain_state_name(p.state), (unsigned long long)p.mark,
			     (unsigned long long)p.elapsed_ms, (unsigned long long)p.files_left,
			     (unsigned long long)p.bytes_left, (unsigned long long)p.blocks_left,
			     (unsigned long long)p.open_left, (unsigned long long)p.files_at_mark,
			     (unsigned long long)p.bytes_at_mark, (unsigned long long)p.failed, ckpt,
			     report ? report : "");
		free(report);
	}
	if (n < 0)
		return -ENOMEM;
	free(sf->data);
	sf->data = text;
	sf->len = (size_t)n;
	return 0;
}

void special_read(fuse_req_t req, struct mountd *md, size_t size, off_t off,
		  struct fuse_file_info *fi)
{
	struct special_file *sf = handle_get(md->handles, fi->fh, HANDLE_SPECIAL);
	char *buf = NULL;
	size_t n = 0;
	int rc = 0;

	if (!sf) {
		fuse_reply_err(req, EBADF);
		return;
	}
	/* A copy: a RELEASE of this handle may run on another thread as soon
	 * as the kernel has the reply. */
	pthread_mutex_lock(&sf->lock);
	if (sf->ino == CONTROL_INO && (off == 0 || !sf->data))
		rc = control_render(sf);
	if (rc == 0 && off >= 0 && (size_t)off < sf->len) {
		n = size < sf->len - (size_t)off ? size : sf->len - (size_t)off;
		buf = malloc(n);
		if (buf)
			memcpy(buf, sf->data + off, n);
		else
			rc = -ENOMEM;
	}
	pthread_mutex_unlock(&sf->lock);
	if (rc < 0)
		fuse_reply_err(req, -rc);
	else
		fuse_reply_buf(req, buf, n);
	free(buf);
}

/* Parses "drain [timeout=SEC] [wait]" or "checkpoint NAME [timeout=SEC]
 * [wait]" (name: NULL for a drain, else a copy into name). 0 or -EINVAL. */
static int control_parse(const char *line, int64_t *timeout_ms, bool *wait, char *name,
			 bool *is_checkpoint)
{
	char copy[CONTROL_REQUEST_MAX + 1], *save = NULL, *tok;
	bool first = true, want_name = false;

	snprintf(copy, sizeof(copy), "%s", line);
	*timeout_ms = 0;
	*wait = false;
	*is_checkpoint = false;
	for (tok = strtok_r(copy, " \t", &save); tok; tok = strtok_r(NULL, " \t", &save)) {
		if (first) {
			if (strcmp(tok, "checkpoint") == 0)
				*is_checkpoint = want_name = true;
			else if (strcmp(tok, "drain") != 0)
				return -EINVAL;
			first = false;
		} else if (want_name) {
			if (!meta_checkpoint_name_ok(tok))
				return -EINVAL;
			snprintf(name, META_CHECKPOINT_NAME_MAX + 1, "%s", tok);
			want_name = false;
		} else if (strcmp(tok, "wait") == 0) {
			*wait = true;
		} else if (strncmp(tok, "timeout=", 8) == 0) {
			char *end;
			errno = 0;
			double s = strtod(tok + 8, &end);
			if (errno || end == tok + 8 || *end || !(s >= 0) || s > 86400.0 * 365)
				return -EINVAL;
			*timeout_ms = (int64_t)(s * 1000.0);
			if (s > 0 && *timeout_ms == 0)
				*timeout_ms = 1;
		} else {
			return -EINVAL;
		}
	}
	return first || want_name ? -EINVAL : 0;
}

void special_write(fuse_req_t req, struct mountd *md, const char *buf, size_t size,
		   struct fuse_file_info *fi)
{
	struct special_file *sf = handle_get(md->handles, fi->fh, HANDLE_SPECIAL);
	char line[CONTROL_REQUEST_MAX + 1];
	size_t asked = size; /* what the reply says was written */
	char ckpt[META_CHECKPOINT_NAME_MAX + 1];
	int64_t timeout_ms;
	struct drain *d;
	bool wait, is_checkpoint;
	int rc;

	if (!sf || sf->ino != CONTROL_INO) {
		fuse_reply_err(req, EBADF);
		return;
	}
	/* One line, its newline optional. */
	while (size > 0 && (buf[size - 1] == '\n' || buf[size - 1] == '\r'))
		size--;
	if (size == 0 || size > CONTROL_REQUEST_MAX || memchr(buf, '\n', size) ||
	    memchr(buf, '\0', size)) {
		fuse_reply_err(req, EINVAL);
		return;
	}
	memcpy(line, buf, size);
	line[size] = '\0';
	if (strncmp(line, "handover ", 9) == 0) {
		/* ferry mount --upgrade: the CLI listens at the path. */
		rc = handover_request(md, line + 9);
		if (rc < 0)
			fuse_reply_err(req, -rc);
		else
			fuse_reply_write(req, asked);
		return;
	}
	rc = control_parse(line, &timeout_ms, &wait, ckpt, &is_checkpoint);
	if (rc < 0) {
		log_warnx(".control: refused the request '%.80s' (see README: The .control file)", line);
		fuse_reply_err(req, -rc);
		return;
	}
	pthread_mutex_lock(&sf->lock);
	if (sf->drain) {
		pthread_mutex_unlock(&sf->lock);
		fuse_reply_err(req, EBUSY);
		return;
	}
	rc = drain_start(md, timeout_ms, is_checkpoint ? ckpt : NULL, &sf->drain);
	d = sf->drain;
	free(sf->data); /* the next read renders the drain */
	sf->data = NULL;
	sf->len = 0;
	pthread_mutex_unlock(&sf->lock);
	if (rc < 0) {
		fuse_reply_err(req, -rc);
		return;
	}
	if (!wait) {
		fuse_reply_write(req, asked);
		return;
	}
	/* The handle (and so d) lives until its RELEASE, which the kernel
	 * sends only after this WRITE is answered. */
	for (;;) {
		enum drain_state s = drain_wait(d, 200);
		if (s == DRAIN_RUNNING) {
			if (fuse_req_interrupted(req) || (req_on_ring(req) && caller_dying(req))) {
				pthread_mutex_lock(&sf->lock);
				sf->drain = NULL;
				pthread_mutex_unlock(&sf->lock);
				drain_free(d);
				fuse_reply_err(req, EINTR);
				return;
			}
			continue;
		}
		if (s == DRAIN_DONE)
			fuse_reply_write(req, asked);
		else
			fuse_reply_err(req, s == DRAIN_TIMED_OUT ? ETIMEDOUT :
					    s == DRAIN_CANCELLED ? EINTR : EIO);
		return;
	}
}

uint64_t special_handle_ino(void *obj)
{
	return ((struct special_file *)obj)->ino;
}

void *special_handle_rebuild(struct mountd *md, uint64_t ino)
{
	struct special_file *sf;

	if (!special_ino(ino) || !(sf = calloc(1, sizeof(*sf))))
		return NULL;
	sf->ino = ino;
	pthread_mutex_init(&sf->lock, NULL);
	/* .stats as of now; a .control request of the daemon before is its
	 * own (a drain it ran is not carried over: the file reads idle). */
	if (ino == STATS_INO && stats_render(md, &sf->data, &sf->len) < 0) {
		special_free(sf);
		return NULL;
	}
	return sf;
}
