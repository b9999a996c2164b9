/*
 * objstore_file: the file:// backend. An object is a regular file under the
 * root directory, its key's components being directories. Paths are walked
 * one component at a time with O_NOFOLLOW relative to the root's fd, so a
 * key (validated by objstore.c) or a planted symlink never leads outside the
 * root. put writes a temporary file in the target directory, renames it
 * over the key, then fsyncs the file and the directory: the name may show
 * before the bytes are durable, but nothing refers to an object before its
 * put returns (and a reader checks what it reads), and a journaling file
 * system then makes both durable in one commit instead of two.
 *
 * With durability deferred (objstore_defer_durability), a put starts the
 * file's write-out and keeps the file open instead, and a directory it
 * makes is not fsynced either; the next objstore_sync() fsyncs those files,
 * then every directory from the root down to each of them (a directory
 * made by another put, whose own fsync may not have run yet, included).
 * ext4 allocates the blocks of every such file in the running journal
 * transaction, so the first fsync commits them all and the rest find
 * little left to do: one journal commit per batch instead of one per
 * object, and far fewer stalls for the writers that share the disk. A
 * failed sync is sticky: after a failed fsync the page cache no longer says
 * what is on disk, so every later sync fails too (until the store is
 * reopened, when a restart uploads everything again).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fd_limit.h"
#include "objstore.h"
#include "objstore_internal.h"

/* A put whose durability waits for objstore_sync(). */
struct pending_put {
	int fd;                 /* the object's file */
	char *dir;              /* its key's directory part ("" at the root); owned */
};

/* Past this many puts waiting for a sync (or an eighth of the open-file
 * limit), a put syncs itself. */
#define PENDING_MAX 256

struct file_store {
	char *root;
	pthread_mutex_t lock;   /* guards rootfd's first open */
	atomic_int rootfd;      /* -1 until the root exists */
	bool defer;             /* set before the store is shared */
	size_t pending_cap;     /* <= PENDING_MAX, set with defer */
	pthread_mutex_t pending_lock;   /* guards pending, npending, sync_failed */
	struct pending_put pending[PENDING_MAX];        /* owns their fds */
	size_t npending;
	bool sync_failed;       /* sticky, see the top */
	pthread_mutex_t sync_lock;      /* one objstore_sync() at a time; guards syncing */
	struct pending_put syncing[PENDING_MAX];
};

static atomic_ulong tmp_counter;

static struct file_store *
fs_of(struct objstore *s)
{
	return s->priv;
}

/* An fd of the root directory (opened once, then reopened from that). */
static int
root_open(struct file_store *fs, const char *op, const char *key)
{
	int rfd = atomic_load(&fs->rootfd), fd, r;

	if (rfd < 0) {
		pthread_mutex_lock(&fs->lock);
		rfd = atomic_load(&fs->rootfd);
		if (rfd < 0) {
			rfd = open(fs->root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
			if (rfd < 0) {
				r = -errno;
				pthread_mutex_unlock(&fs->lock);
				return objstore_seterr(r == -ENOENT ? -EIO : r, "%s %s: store directory %s: %s",
						       op, key, fs->root, strerror(-r));
			}
			atomic_store(&fs->rootfd, rfd);
		}
		pthread_mutex_unlock(&fs->lock);
	}
	/* A new open file description, not a dup: a listing's readdir
	 * position must not be shared with other calls. */
	fd = openat(rfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return objstore_seterr(-errno, "%s %s: store directory %s: %s", op, key, fs->root,
				       strerror(errno));
	return fd;
}

/*
 * Walks the directory components of key (all but the last) from the root and
 * returns an fd of the directory holding the last one, which *leaf points
 * into. With create, missing directories are made (and their parents
 * fsynced). Errors: -ENOENT when a directory is missing (or is not one).
 */
static int
walk_dirs(struct file_store *fs, const char *op, const char *key, int create, const char **leaf)
{
	char comp[NAME_MAX + 1];
	const char *p = key, *slash;
	int dfd, next, r;

	dfd = root_open(fs, op, key);
	if (dfd < 0)
		return dfd;
	while ((slash = strchr(p, '/')) != NULL) {
		size_t n = (size_t)(slash - p);

		if (n > NAME_MAX) {
			r = objstore_seterr(-EINVAL, "%s %s: component longer than %d bytes", op, key, NAME_MAX);
			goto fail;
		}
		memcpy(comp, p, n);
		comp[n] = '\0';
		next = openat(dfd, comp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (next < 0 && errno == ENOENT && create) {
			if (mkdirat(dfd, comp, 0755) < 0 && errno != EEXIST) {
				r = -errno;
				objstore_seterr(r, "%s %s: mkdir %.*s: %s", op, key, (int)(slash - key), key,
						strerror(-r));
				goto fail;
			}
			/* (Deferred: the sync fsyncs every directory above
			 * each object it makes durable.) */
			if (!fs->defer && fsync(dfd) < 0) {
				r = -errno;
				objstore_seterr(r, "%s %s: fsync directory: %s", op, key, strerror(-r));
				goto fail;
			}
			next = openat(dfd, comp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		}
		if (next < 0) {
			int e = errno;

			if (e == ENOENT || e == ENOTDIR || e == ELOOP) {
				/* Missing, or something else is in the way: no such
				 * object, and no place to put one. */
				r = objstore_seterr(create ? -EIO : -ENOENT, "%s %s: %.*s is %s", op, key,
						    (int)(slash - key), key,
						    e == ENOENT ? "missing" : "not a directory");
			} else {
				r = objstore_seterr(-e, "%s %s: directory %.*s: %s", op, key,
						    (int)(slash - key), key, strerror(e));
			}
			goto fail;
		}
		close(dfd);
		dfd = next;
		p = slash + 1;
	}
	if (strlen(p) > NAME_MAX) {
		r = objstore_seterr(-EINVAL, "%s %s: component longer than %d bytes", op, key, NAME_MAX);
		goto fail;
	}
	*leaf = p;
	return dfd;
fail:
	close(dfd);
	return r;
}

static int
write_all(int fd, const void *buf, size_t len)
{
	const char *p = buf;

	while (len > 0) {
		ssize_t n = write(fd, p, len);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

/* Hands the put's file fd to the pending list (and sets it to -1), after
 * starting its write-out; false when the list is full or there is no
 * memory (the caller syncs the put itself). */
static bool
pending_add(struct file_store *fs, const char *key, const char *leaf, int *fd)
{
	char *dir = strndup(key, leaf > key ? (size_t)(leaf - key - 1) : 0);
	bool added = false;

	if (dir == NULL)
		return false;
	/* Failure here is only a lost head start: the sync writes it. */
	(void)sync_file_range(*fd, 0, 0, SYNC_FILE_RANGE_WRITE);
	pthread_mutex_lock(&fs->pending_lock);
	if (fs->npending < fs->pending_cap) {
		fs->pending[fs->npending].fd = *fd;
		fs->pending[fs->npending].dir = dir;
		fs->npending++;
		*fd = -1;
		dir = NULL;
		added = true;
	}
	pthread_mutex_unlock(&fs->pending_lock);
	free(dir);
	return added;
}

static int
file_put(struct objstore *s, const char *key, const void *buf, size_t len)
{
	struct file_store *fs = fs_of(s);
	char tmp[64];
	const char *leaf;
	int dfd, fd = -1, r, have_tmp = 0;

	dfd = walk_dirs(fs, "PUT", key, 1, &leaf);
	if (dfd < 0)
		return dfd;
	for (int i = 0; i < 100; i++) {
		snprintf(tmp, sizeof(tmp), OBJSTORE_TMP_PREFIX "%ld.%lu.%x", (long)getpid(),
			 atomic_fetch_add(&tmp_counter, 1), (unsigned)random());
		fd = openat(dfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644);
		if (fd >= 0 || errno != EEXIST)
			break;
	}
	if (fd < 0) {
		r = objstore_seterr(-errno, "PUT %s: create temporary file: %s", key, strerror(errno));
		goto out;
	}
	have_tmp = 1;
	r = write_all(fd, buf, len);
	if (r < 0) {
		objstore_seterr(r, "PUT %s: write: %s", key, strerror(-r));
		goto out;
	}
	if (renameat(dfd, tmp, dfd, leaf) < 0) {
		r = -errno;
		objstore_seterr(r == -EISDIR ? -EIO : r, "PUT %s: rename: %s", key, strerror(-r));
		if (r == -EISDIR)
			r = -EIO;
		goto out;
	}
	have_tmp = 0;
	if (fs->defer && pending_add(fs, key, leaf, &fd)) {
		r = 0;
		goto out;
	}
	if (fsync(fd) < 0) {
		r = objstore_seterr(-EIO, "PUT %s: fsync: %s", key, strerror(errno));
		goto out;
	}
	if (close(fd) < 0) {
		fd = -1;
		r = objstore_seterr(-EIO, "PUT %s: close: %s", key, strerror(errno));
		goto out;
	}
	fd = -1;
	if (fsync(dfd) < 0) {
		r = objstore_seterr(-EIO, "PUT %s: fsync directory: %s", key, strerror(errno));
		goto out;
	}
	r = 0;
out:
	if (fd >= 0)
		close(fd);
	if (have_tmp)
		unlinkat(dfd, tmp, 0);
	if (dfd >= 0)
		close(dfd);
	return r;
}

static void
file_defer(struct objstore *s)
{
	struct file_store *fs = fs_of(s);
	long limit = fd_limit_soft();

	fs->pending_cap = PENDING_MAX;
	if (limit >= 0 && (size_t)limit / 8 < PENDING_MAX)
		fs->pending_cap = (size_t)limit / 8;
	fs->defer = true;
}

/* A directory to fsync in a sync: a prefix of a pending put's dir. */
struct sync_dir {
	const char *path;       /* points into a pending_put's dir */
	size_t len;
};

/* Adds dir[0..len) to the set d[0..*n) unless it is there (a batch names
 * a few directories: a linear scan is enough). */
static void
sync_dir_add(struct sync_dir *d, size_t *n, const char *dir, size_t len)
{
	for (size_t i = 0; i < *n; i++)
		if (d[i].len == len && memcmp(d[i].path, dir, len) == 0)
			return;
	d[*n].path = dir;
	d[*n].len = len;
	(*n)++;
}

/* fsyncs the store's directory path[0..len) ("" is the root). */
static int
sync_dir_one(struct file_store *fs, const char *path, size_t len)
{
	char key[OBJSTORE_KEY_MAX + 3];
	const char *leaf;
	int dfd, r = 0;

	if (len == 0) {
		dfd = root_open(fs, "SYNC", "");
	} else {
		/* walk_dirs opens the directory holding a key's last part. */
		snprintf(key, sizeof(key), "%.*s/x", (int)len, path);
		dfd = walk_dirs(fs, "SYNC", key, 0, &leaf);
	}
	if (dfd < 0)
		return objstore_seterr(-EIO, "SYNC: directory %.*s: %s", (int)len, path,
				       strerror(-dfd));
	if (fsync(dfd) < 0)
		r = objstore_seterr(-EIO, "SYNC: fsync of directory /%.*s: %s", (int)len, path,
				    strerror(errno));
	close(dfd);
	return r;
}

static int
file_sync(struct objstore *s)
{
	struct file_store *fs = fs_of(s);
	struct pending_put *batch = fs->syncing; /* what this sync takes out */
	struct sync_dir *dirs = NULL;   /* the directories to fsync; owned */
	size_t n, ndirs = 0, maxdirs = 1;
	int r = 0;

	if (!fs->defer)
		return 0;
	pthread_mutex_lock(&fs->sync_lock);
	/* The directories' room first: no memory for it fails this sync
	 * alone (-ENOMEM), with every put still pending. */
	pthread_mutex_lock(&fs->pending_lock);
	n = fs->npending;
	for (size_t i = 0; i < n; i++) {
		maxdirs += 1;
		for (const char *p = fs->pending[i].dir; *p; p++)
			maxdirs += *p == '/';
	}
	pthread_mutex_unlock(&fs->pending_lock);
	if (n > 0 && (dirs = calloc(maxdirs, sizeof(*dirs))) == NULL) {
		pthread_mutex_unlock(&fs->sync_lock);
		return objstore_seterr(-ENOMEM, "SYNC: out of memory");
	}
	/* Only what was counted: puts added since stay for the next sync
	 * (only this function takes entries out). */
	pthread_mutex_lock(&fs->pending_lock);
	memcpy(batch, fs->pending, n * sizeof(*batch));
	memmove(fs->pending, fs->pending + n, (fs->npending - n) * sizeof(*batch));
	fs->npending -= n;
	pthread_mutex_unlock(&fs->pending_lock);
	for (size_t i = 0; i < n; i++) {
		if (r == 0 && fsync(batch[i].fd) < 0)
			r = objstore_seterr(-EIO, "SYNC: fsync of an object: %s", strerror(errno));
		close(batch[i].fd);
	}
	/* Every directory from the root down to each object, once. */
	if (r == 0 && n > 0) {
		sync_dir_add(dirs, &ndirs, "", 0);
		for (size_t i = 0; i < n; i++) {
			const char *d = batch[i].dir;

			for (const char *p = d; *p; p++)
				if (*p == '/')
					sync_dir_add(dirs, &ndirs, d, (size_t)(p - d));
			if (*d)
				sync_dir_add(dirs, &ndirs, d, strlen(d));
		}
		for (size_t i = 0; i < ndirs && r == 0; i++)
			r = sync_dir_one(fs, dirs[i].path, dirs[i].len);
	}
	for (size_t i = 0; i < n; i++)
		free(batch[i].dir);
	free(dirs);
	pthread_mutex_lock(&fs->pending_lock);
	if (r < 0)
		fs->sync_failed = true;
	else if (fs->sync_failed)
		r = objstore_seterr(-EIO, "SYNC: an earlier sync of this store failed; what it "
				    "held is not known to be on disk");
	pthread_mutex_unlock(&fs->pending_lock);
	pthread_mutex_unlock(&fs->sync_lock);
	return r;
}

/* Opens key for reading; -ENOENT when it is missing or not a regular file. */
static int
open_object(struct file_store *fs, const char *op, const char *key, struct stat *st)
{
	const char *leaf;
	int dfd, fd = -1, r;

	dfd = walk_dirs(fs, op, key, 0, &leaf);
	if (dfd < 0)
		return dfd;
	fd = openat(dfd, leaf, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
	if (fd < 0) {
		r = -errno;
		if (r == -ELOOP)
			r = objstore_seterr(-EIO, "%s %s: is a symbolic link", op, key);
		else
			objstore_seterr(r, "%s %s: %s", op, key, strerror(-r));
		goto out;
	}
	if (fstat(fd, st) < 0) {
		r = objstore_seterr(-errno, "%s %s: fstat: %s", op, key, strerror(errno));
		goto out;
	}
	if (S_ISDIR(st->st_mode)) {
		r = objstore_seterr(-ENOENT, "%s %s: is a directory, not an object", op, key);
		goto out;
	}
	if (!S_ISREG(st->st_mode)) {
		r = objstore_seterr(-EIO, "%s %s: not a regular file", op, key);
		goto out;
	}
	r = fd;
	fd = -1;
out:
	if (fd >= 0)
		close(fd);
	close(dfd);
	return r;
}

static ssize_t
file_get(struct objstore *s, const char *key, uint64_t off, void *buf, size_t len)
{
	struct stat st;
	size_t done = 0;
	ssize_t r;
	int fd;

	fd = open_object(fs_of(s), "GET", key, &st);
	if (fd < 0)
		return fd;
	while (done < len) {
		ssize_t n = pread(fd, (char *)buf + done, len - done, (off_t)(off + done));
		if (n < 0) {
			if (errno == EINTR)
				continue;
			r = objstore_seterr(-EIO, "GET %s: read: %s", key, strerror(errno));
			goto out;
		}
		if (n == 0)
			break;
		done += (size_t)n;
	}
	r = (ssize_t)done;
out:
	close(fd);
	return r;
}

static int
file_head(struct objstore *s, const char *key, uint64_t *size)
{
	struct stat st;
	int fd = open_object(fs_of(s), "HEAD", key, &st);

	if (fd < 0)
		return fd;
	close(fd);
	if (size)
		*size = (uint64_t)st.st_size;
	return 0;
}

static int
file_del(struct objstore *s, const char *key)
{
	const char *leaf;
	int dfd, r = 0;

	dfd = walk_dirs(fs_of(s), "DELETE", key, 0, &leaf);
	if (dfd == -ENOENT)
		return 0;
	if (dfd < 0)
		return dfd;
	if (unlinkat(dfd, leaf, 0) < 0 && errno != ENOENT) {
		r = -errno;
		objstore_seterr(r == -EISDIR ? -EIO : r, "DELETE %s: %s", key, strerror(-r));
		if (r == -EISDIR)
			r = -EIO;
	}
	close(dfd);
	return r;
}

struct list_ctx {
	const char *prefix;
	size_t prefix_len;
	int (*cb)(const char *key, uint64_t size, void *arg);
	void *arg;
	char path[OBJSTORE_KEY_MAX + NAME_MAX + 2];
};

/* Lists directory dfd (consumed), whose key path is ctx->path[0..plen). */
static int
list_dir(struct list_ctx *ctx, int dfd, size_t plen)
{
	DIR *d = fdopendir(dfd);
	struct dirent *de;
	int r = 0;

	if (d == NULL) {
		r = objstore_seterr(-errno, "LIST %s: %s", ctx->prefix, strerror(errno));
		close(dfd);
		return r;
	}
	for (;;) {
		struct stat st;
		size_t nlen, klen;

		errno = 0;
		de = readdir(d);
		if (de == NULL) {
			if (errno)
				r = objstore_seterr(-EIO, "LIST %s: readdir: %s", ctx->prefix, strerror(errno));
			break;
		}
		if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0 ||
		    strncmp(de->d_name, OBJSTORE_TMP_PREFIX, strlen(OBJSTORE_TMP_PREFIX)) == 0)
			continue;
		nlen = strlen(de->d_name);
		klen = plen + nlen;
		if (klen > OBJSTORE_KEY_MAX)
			continue;       /* cannot be a key */
		memcpy(ctx->path + plen, de->d_name, nlen + 1);
		/* Prune: the key so far must be compatible with the prefix. */
		if (strncmp(ctx->path, ctx->prefix, klen < ctx->prefix_len ? klen : ctx->prefix_len) != 0)
			continue;
		if (fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
			if (errno == ENOENT)
				continue;
			r = objstore_seterr(-EIO, "LIST %s: stat %s: %s", ctx->prefix, ctx->path, strerror(errno));
			break;
		}
		if (S_ISDIR(st.st_mode)) {
			int sub;

			if (klen + 1 > OBJSTORE_KEY_MAX)
				continue;
			sub = openat(dirfd(d), de->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
			if (sub < 0) {
				if (errno == ENOENT)
					continue;
				r = objstore_seterr(-EIO, "LIST %s: open %s: %s", ctx->prefix, ctx->path,
						    strerror(errno));
				break;
			}
			ctx->path[klen] = '/';
			ctx->path[klen + 1] = '\0';
			r = list_dir(ctx, sub, klen + 1);
			if (r != 0)
				break;
		} else if (S_ISREG(st.st_mode) && klen >= ctx->prefix_len) {
			r = ctx->cb(ctx->path, (uint64_t)st.st_size, ctx->arg);
			if (r != 0)
				break;
		}
	}
	closedir(d);
	return r;
}

static int
file_list(struct objstore *s, const char *prefix,
	  int (*cb)(const char *key, uint64_t size, void *arg), void *arg)
{
	struct file_store *fs = fs_of(s);
	struct list_ctx *ctx = NULL;
	const char *slash = strrchr(prefix, '/');
	size_t dlen = slash ? (size_t)(slash - prefix) + 1 : 0;
	const char *leaf;
	int dfd = -1, r;

	ctx = calloc(1, sizeof(*ctx));
	if (ctx == NULL)
		return objstore_seterr(-ENOMEM, "LIST %s: out of memory", prefix);
	ctx->prefix = prefix;
	ctx->prefix_len = strlen(prefix);
	ctx->cb = cb;
	ctx->arg = arg;
	/* Start at the deepest directory the prefix names in full. */
	memcpy(ctx->path, prefix, dlen);
	ctx->path[dlen] = '\0';
	if (dlen > 0) {
		/* walk_dirs wants a leaf after the last '/': give it "x". */
		char *k = NULL;
		if (asprintf(&k, "%sx", ctx->path) < 0) {
			r = objstore_seterr(-ENOMEM, "LIST %s: out of memory", prefix);
			goto out;
		}
		dfd = walk_dirs(fs, "LIST", k, 0, &leaf);
		free(k);
	} else {
		dfd = root_open(fs, "LIST", prefix);
	}
	if (dfd == -ENOENT) {
		r = 0;
		goto out;
	}
	if (dfd < 0) {
		r = dfd;
		goto out;
	}
	r = list_dir(ctx, dfd, dlen);
	dfd = -1;
out:
	free(ctx);
	return r;
}

static int
mkdir_p(const char *path)
{
	char *p = strdup(path);
	int r = 0;

	if (p == NULL)
		return -ENOMEM;
	for (char *c = p + 1;; c++) {
		if (*c == '/' || *c == '\0') {
			char save = *c;
			*c = '\0';
			if (mkdir(p, 0755) < 0 && errno != EEXIST) {
				r = -errno;
				break;
			}
			*c = save;
			if (save == '\0')
				break;
		}
	}
	free(p);
	return r;
}

static int
file_check(struct objstore *s, int create)
{
	struct file_store *fs = fs_of(s);
	struct stat st;
	int r;

	if (create) {
		r = mkdir_p(fs->root);
		if (r < 0)
			return objstore_seterr(r, "create store directory %s: %s", fs->root, strerror(-r));
	}
	if (stat(fs->root, &st) < 0)
		return objstore_seterr(-errno, "store directory %s: %s", fs->root, strerror(errno));
	if (!S_ISDIR(st.st_mode))
		return objstore_seterr(-ENOTDIR, "store directory %s: not a directory", fs->root);
	if (faccessat(AT_FDCWD, fs->root, W_OK | X_OK, AT_EACCESS) < 0)
		return objstore_seterr(-errno, "store directory %s: not writable: %s", fs->root, strerror(errno));
	r = root_open(fs, "CHECK", fs->root);
	if (r < 0)
		return r;
	close(r);
	return 0;
}

static void
file_close(struct objstore *s)
{
	struct file_store *fs = fs_of(s);

	if (fs == NULL)
		return;
	if (atomic_load(&fs->rootfd) >= 0)
		close(atomic_load(&fs->rootfd));
	/* Puts never synced: nothing may refer to them yet. */
	for (size_t i = 0; i < fs->npending; i++) {
		close(fs->pending[i].fd);
		free(fs->pending[i].dir);
	}
	pthread_mutex_destroy(&fs->pending_lock);
	pthread_mutex_destroy(&fs->sync_lock);
	pthread_mutex_destroy(&fs->lock);
	free(fs->root);
	free(fs);
	s->priv = NULL;
}

static const struct objstore_ops file_ops = {
	.check = file_check,
	.close = file_close,
	.put = file_put,
	.get = file_get,
	.del = file_del,
	.head = file_head,
	.list = file_list,
	.defer = file_defer,
	.sync = file_sync,
};

int
objstore_file_open(const struct store_url *url, const struct objstore_opts *opts,
		   struct objstore *s, char *err, size_t errlen)
{
	struct file_store *fs;

	if (url->path == NULL || url->path[0] != '/') {
		if (err && errlen)
			snprintf(err, errlen, "file store: path must be absolute");
		return -EINVAL;
	}
	fs = calloc(1, sizeof(*fs));
	if (fs == NULL || (fs->root = strdup(url->path)) == NULL) {
		free(fs);
		if (err && errlen)
			snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	pthread_mutex_init(&fs->lock, NULL);
	pthread_mutex_init(&fs->sync_lock, NULL);
	pthread_mutex_init(&fs->pending_lock, NULL);
	atomic_init(&fs->rootfd, -1);
	s->priv = fs;
	s->ops = &file_ops;
	return 0;
}
