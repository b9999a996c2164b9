/*
 * meta_rules: the file system's rules over the metadata engine (meta.h),
 * written once for every engine: what create, link, unlink, rename, setattr,
 * xattrs and data commits do to the rows, link counts, setgid inheritance,
 * orphans, commit ordering, and the checks of every row read (a damaged one
 * gives -EIO). Statements come from the catalogue (meta_sql.c) and run on a
 * driver (meta_db.h); transactions and deferred commits are meta_batch.c's.
 *
 * Invariant kept by every size change: no slice shows data past the file's
 * size, so bytes past the end read as zeros after any extension.
 *
 * Ownership: out-parameters that are pointers are malloc'ed for the caller
 * (meta.h); everything else here lives on the stack or in struct meta.
 */
#include "meta_engine.h"
#include "meta_names.h"
#include "slice.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define READDIR_PAGE 128
#define PURGE_BATCH 64
#define MAX_DEPTH (1 << 20) /* a longer parent walk means a loop */

/* ---- small helpers ---------------------------------------------------- */

static struct timespec now_ts(void)
{
	struct timespec ts;

	if (meta_tl_now != NULL)
		return *meta_tl_now;
	clock_gettime(CLOCK_REALTIME, &ts);
	return ts;
}

static int ts_valid(const struct timespec *ts)
{
	return ts->tv_nsec >= 0 && ts->tv_nsec < 1000000000L;
}

static int mode_type_valid(uint32_t mode)
{
	switch (mode & S_IFMT) {
	case S_IFREG:
	case S_IFDIR:
	case S_IFLNK:
	case S_IFIFO:
	case S_IFSOCK:
	case S_IFCHR:
	case S_IFBLK:
		return 1;
	default:
		return 0;
	}
}

static int name_check(const char *name, size_t *len)
{
	size_t n;

	if (name == NULL)
		return -EINVAL;
	n = strnlen(name, META_NAME_MAX + 1);
	if (n > META_NAME_MAX)
		return -ENAMETOOLONG;
	if (n == 0 || memchr(name, '/', n) != NULL || strcmp(name, ".") == 0 ||
	    strcmp(name, "..") == 0)
		return -EINVAL;
	*len = n;
	return 0;
}

/* An inode number that can be in the table (SQLite integers are signed). */
static int ino_ok(uint64_t ino)
{
	return ino != 0 && ino <= INT64_MAX;
}


/* Reads the 13 inode columns starting at column i0, checking each. */
static int row_attr(struct db_stmt *st, int i0, struct meta_attr *a)
{
	int64_t v[13];
	static const int64_t lo[13] = { 1, 0, 0, 0, 0, 0, 0, INT64_MIN, 0, INT64_MIN, 0,
					INT64_MIN, 0 };
	static const int64_t hi[13] = { INT64_MAX, S_IFMT | 07777, UINT32_MAX, UINT32_MAX,
					INT64_MAX, UINT32_MAX, (int64_t)MAX_FILE_SIZE,
					INT64_MAX, 999999999, INT64_MAX, 999999999,
					INT64_MAX, 999999999 };
	int i;

	for (i = 0; i < 13; i++)
		if (col_int(st, i0 + i, lo[i], hi[i], &v[i]))
			return -EIO;
	if (!mode_type_valid((uint32_t)v[1]))
		return -EIO;
	memset(a, 0, sizeof(*a));
	a->ino = (uint64_t)v[0];
	a->mode = (uint32_t)v[1];
	a->uid = (uint32_t)v[2];
	a->gid = (uint32_t)v[3];
	a->rdev = (uint64_t)v[4];
	a->nlink = (uint32_t)v[5];
	a->size = (uint64_t)v[6];
	a->atime.tv_sec = v[7];
	a->atime.tv_nsec = v[8];
	a->mtime.tv_sec = v[9];
	a->mtime.tv_nsec = v[10];
	a->ctime.tv_sec = v[11];
	a->ctime.tv_nsec = v[12];
	if (S_ISDIR(a->mode) && a->size != 0)
		return -EIO;
	return 0;
}

static int bind_attr(struct db_stmt *st, const struct meta_attr *a)
{
	const int64_t v[13] = { (int64_t)a->ino,	  a->mode,	     a->uid,
				a->gid,			  (int64_t)a->rdev,  a->nlink,
				(int64_t)a->size,	  a->atime.tv_sec,   a->atime.tv_nsec,
				a->mtime.tv_sec,	  a->mtime.tv_nsec,  a->ctime.tv_sec,
				a->ctime.tv_nsec };

	return bind_ints(st, 13, v);
}

/* Reads a name-like blob column (1..META_NAME_MAX bytes, no NUL or '/'). */
static int col_name(struct db_stmt *st, int i, char *buf, size_t max)
{
	enum db_type t = col_type(st, i);
	const void *p;
	size_t n;

	if (t != DB_BLOB && t != DB_TEXT)
		return -EIO;
	p = col_blob(st, i, &n);
	if (p == NULL || n == 0 || n > max || memchr(p, '\0', n) != NULL)
		return -EIO;
	memcpy(buf, p, n);
	buf[n] = '\0';
	return 0;
}

/* ---- rows --------------------------------------------------------------- */

static int inode_write(struct conn *c, enum st id, const struct meta_attr *a);

/* The batch's own copy of directory ino's row, or NULL. */
static const struct meta_attr *hot_find(struct conn *c, uint64_t ino)
{
	struct meta *m = c->m;

	if (m == NULL || c != m->bc)
		return NULL;
	for (unsigned i = 0; i < m->nhot; i++)
		if (m->hot[i].ino == ino)
			return &m->hot[i].a;
	return NULL;
}

/* Writes the rows held in m->hot and empties it. */
int meta_hot_flush(struct meta *m)
{
	int rc = 0;

	for (unsigned i = 0; i < m->nhot && rc == 0; i++)
		rc = inode_write(m->bc, ST_INODE_UPDATE, &m->hot[i].a);
	if (rc == 0 && m->ctr.held && m->ctr.dirty) {
		rc = run_ints(m->bc, ST_COUNTERS_PUT, 2,
			      (const int64_t[]){ (int64_t)m->ctr.ino, (int64_t)m->ctr.cookie });
		if (rc == 0)
			rc = expect_one(m->bc);
	}
	m->nhot = 0; /* a failure loses the batch (batch_lost), these with it */
	m->ctr.held = m->ctr.dirty = 0;
	return rc;
}

/* Holds a directory's changed row in m->hot: 1 if held, 0 if it must be
 * written now (not the batch's connection, a replay, not a directory). */
static int hot_put(struct conn *c, const struct meta_attr *a)
{
	struct meta *m = c->m;
	unsigned i;
	int rc;

	if (m == NULL || c != m->bc || !m->batch_open || meta_tl_replaying || !S_ISDIR(a->mode))
		return 0;
	for (i = 0; i < m->nhot && m->hot[i].ino != a->ino; i++)
		;
	if (i == HOT_DIRS) {
		/* Full: the oldest goes to the database. */
		rc = inode_write(c, ST_INODE_UPDATE, &m->hot[0].a);
		if (rc)
			return rc;
		memmove(&m->hot[0], &m->hot[1], sizeof(m->hot[0]) * (HOT_DIRS - 1));
		i = --m->nhot;
	}
	if (i == m->nhot)
		m->nhot++;
	m->hot[i].ino = a->ino;
	m->hot[i].a = *a;
	m->hot_puts++;
	return 1;
}

/* Row ino is being deleted: no copy of it may be written back. */
static void hot_forget(struct conn *c, uint64_t ino)
{
	struct meta *m = c->m;

	if (m == NULL || c != m->bc)
		return;
	for (unsigned i = 0; i < m->nhot; i++) {
		if (m->hot[i].ino == ino) {
			memmove(&m->hot[i], &m->hot[i + 1], sizeof(m->hot[0]) * (m->nhot - i - 1));
			m->nhot--;
			return;
		}
	}
}

static int inode_get(struct conn *c, uint64_t ino, struct meta_attr *a)
{
	const struct meta_attr *h;
	struct db_stmt *st = NULL;
	int rc;

	if (!ino_ok(ino))
		return -ENOENT;
	h = hot_find(c, ino);
	if (h != NULL) {
		*a = *h;
		return 0;
	}
	rc = stmt(c, ST_GETATTR, &st);
	if (rc)
		return rc;
	rc = bind_i64(st, 1, (int64_t)ino);
	if (rc == 0)
		rc = step(st);
	if (rc == 0)
		rc = -ENOENT;
	else if (rc > 0)
		rc = row_attr(st, 0, a);
	if (rc == 0 && a->ino != ino)
		rc = -EIO;
	stmt_done(st);
	return rc;
}

static int inode_write(struct conn *c, enum st id, const struct meta_attr *a)
{
	struct db_stmt *st = NULL;
	int rc;

	rc = stmt(c, id, &st);
	if (rc)
		return rc;
	rc = bind_attr(st, a);
	if (rc == 0)
		rc = step(st);
	if (rc > 0)
		rc = 0;
	if (rc == 0)
		rc = expect_one(c);
	stmt_done(st);
	return rc;
}

static int inode_put(struct conn *c, const struct meta_attr *a)
{
	int rc = hot_put(c, a);

	if (rc)
		return rc > 0 ? 0 : rc;
	return inode_write(c, ST_INODE_UPDATE, a);
}

static int dir_get(struct conn *c, uint64_t ino, struct meta_attr *a)
{
	int rc = inode_get(c, ino, a);

	if (rc == 0 && !S_ISDIR(a->mode))
		rc = -ENOTDIR;
	return rc;
}

/* A directory that can take new entries (not removed). */
static int dir_get_live(struct conn *c, uint64_t ino, struct meta_attr *a)
{
	int rc = dir_get(c, ino, a);

	if (rc == 0 && a->nlink == 0)
		rc = -ENOENT;
	return rc;
}

static int dentry_get(struct conn *c, uint64_t parent, const char *name, size_t nlen,
		      uint64_t *ino)
{
	struct db_stmt *st = NULL;
	int64_t v;
	int rc;

	rc = stmt(c, ST_DENTRY_GET, &st);
	if (rc)
		return rc;
	rc = bind_i64(st, 1, (int64_t)parent);
	if (rc == 0)
		rc = bind_blob(st, 2, name, nlen);
	if (rc == 0)
		rc = step(st);
	if (rc == 0)
		rc = -ENOENT;
	else if (rc > 0) {
		rc = col_int(st, 0, 1, INT64_MAX, &v);
		if (rc == 0)
			*ino = (uint64_t)v;
	}
	stmt_done(st);
	return rc;
}

/* Entry parent/name -> its inode; a dangling entry is damage. */
static int entry_get(struct conn *c, uint64_t parent, const char *name, size_t nlen,
		     struct meta_attr *a)
{
	uint64_t ino;
	int rc = dentry_get(c, parent, name, nlen, &ino);

	if (rc)
		return rc;
	rc = inode_get(c, ino, a);
	return rc == -ENOENT ? -EIO : rc;
}

/* Statements keyed by (parent, name) with more parameters after them. */
static int dentry_run(struct conn *c, enum st id, uint64_t parent, const char *name, size_t nlen,
		      int64_t p3, const char *name4, size_t nlen4, int nparams)
{
	struct db_stmt *st = NULL;
	int rc;

	rc = stmt(c, id, &st);
	if (rc)
		return rc;
	rc = bind_i64(st, 1, (int64_t)parent);
	if (rc == 0)
		rc = bind_blob(st, 2, name, nlen);
	if (rc == 0 && nparams >= 3)
		rc = bind_i64(st, 3, p3);
	if (rc == 0 && nparams >= 4)
		rc = bind_blob(st, 4, name4, nlen4);
	if (rc == 0)
		rc = step(st);
	if (rc > 0)
		rc = 0;
	if (rc == 0)
		rc = expect_one(c);
	stmt_done(st);
	return rc;
}

static int dentry_insert(struct conn *c, uint64_t parent, const char *name, size_t nlen,
			 uint64_t ino, uint64_t cookie)
{
	struct db_stmt *st = NULL;
	int rc;

	rc = stmt(c, ST_DENTRY_INSERT, &st);
	if (rc)
		return rc;
	rc = bind_i64(st, 1, (int64_t)parent);
	if (rc == 0)
		rc = bind_blob(st, 2, name, nlen);
	if (rc == 0)
		rc = bind_i64(st, 3, (int64_t)ino);
	if (rc == 0)
		rc = bind_i64(st, 4, (int64_t)cookie);
	if (rc == 0)
		rc = step(st);
	/* Answered now, even where writes are queued (meta_pg.c): a change
	 * that went on writing past a taken name would have to be undone by a
	 * savepoint, and a savepoint per change of a batch costs PostgreSQL a
	 * subtransaction each (past 64 in a transaction, every snapshot on
	 * the server pays for them). Unless the names set knows the name is
	 * free (never in a replay, which runs before or behind it): then the
	 * answer may come later, and a taken name after all fails the batch
	 * (the replay refuses the record, and the set forgets what it knew). */
	if (rc == 0 && !meta_tl_replaying && c->m != NULL &&
	    meta_names_absent(c->m->names, parent, name, nlen))
		rc = c->drv->expect_changes(c, 1, -EEXIST);
	else if (rc == 0 && db_changes(c) != 1)
		rc = -EEXIST; /* (parent, name) is taken; nothing was written */
	else if (rc > 0)
		rc = -EIO;
	stmt_done(st);
	return rc;
}

/* The batch's counters (see struct ctr), loaded at their first use in it:
 * NULL if c is not the batch's connection (then the row is updated at
 * once). */
static struct ctr *ctr_held(struct conn *c, int *rc)
{
	struct meta *m = c->m;
	struct db_stmt *st = NULL;
	int64_t a = 0, b = 0;

	*rc = 0;
	if (m == NULL || c != m->bc || !m->batch_open)
		return NULL;
	if (m->ctr.held)
		return &m->ctr;
	*rc = stmt(c, ST_COUNTERS_GET, &st);
	if (*rc)
		return NULL;
	*rc = step(st);
	if (*rc > 0) {
		*rc = col_int(st, 0, 2, INT64_MAX - 1, &a);
		if (*rc == 0)
			*rc = col_int(st, 1, 1, INT64_MAX - 1, &b);
	} else if (*rc == 0) {
		*rc = -EIO; /* no counters row */
	}
	stmt_done(st);
	if (*rc)
		return NULL;
	m->ctr = (struct ctr){ .held = 1, .ino = (uint64_t)a, .cookie = (uint64_t)b };
	return &m->ctr;
}

static int next_cookie(struct conn *c, uint64_t *cookie)
{
	int rc;
	struct ctr *h = ctr_held(c, &rc);
	int64_t v;

	if (rc)
		return rc;
	if (h != NULL) {
		if (h->cookie >= INT64_MAX - 1)
			return -EIO; /* ran out */
		*cookie = h->cookie++;
		h->dirty = 1;
		return 0;
	}
	rc = query_int(c, ST_NEXT_COOKIE, 0, NULL, 1, INT64_MAX - 1, 0, &v);

	if (rc == 0)
		*cookie = (uint64_t)v;
	return rc == -ENOENT ? -EIO : rc;
}

static int next_ino(struct conn *c, uint64_t *ino, uint64_t *cookie)
{
	struct db_stmt *st = NULL;
	int64_t a = 0, b = 0;
	int rc;
	struct ctr *h = ctr_held(c, &rc);

	if (rc)
		return rc;
	if (h != NULL) {
		if (h->ino >= INT64_MAX - 1 || h->cookie >= INT64_MAX - 1)
			return -EIO; /* ran out */
		*ino = h->ino++;
		*cookie = h->cookie++;
		h->dirty = 1;
		return 0;
	}
	rc = stmt(c, ST_NEXT_INO, &st);
	if (rc)
		return rc;
	rc = step(st);
	if (rc == 0)
		rc = -EIO;
	if (rc > 0) {
		rc = col_int(st, 0, 2, INT64_MAX - 1, &a);
		if (rc == 0)
			rc = col_int(st, 1, 1, INT64_MAX - 1, &b);
	}
	/* A RETURNING statement finishes its work only when run to the end. */
	if (rc == 0 && (rc = step(st)) > 0)
		rc = -EIO;
	stmt_done(st);
	if (rc == 0) {
		*ino = (uint64_t)a;
		*cookie = (uint64_t)b;
	}
	return rc;
}

/* A replayed create makes the inode it made live, whatever the counter
 * says: a record refused before it (its change could not be made again)
 * must not move every later create to another number than the one the
 * kernel and later records know. The counter goes past it. */
static int replay_ino(struct conn *c, uint64_t want, uint64_t *ino, uint64_t *cookie)
{
	struct meta_attr a;
	struct ctr *h;
	int rc;

	if (!ino_ok(want) || want >= INT64_MAX - 1)
		return -EIO;
	rc = inode_get(c, want, &a);
	if (rc == 0)
		return -ESTALE; /* taken: by another writer while the journal waited */
	if (rc != -ENOENT)
		return rc;
	h = ctr_held(c, &rc);
	if (rc)
		return rc;
	if (h == NULL)
		return -EIO; /* replays run in the batch */
	rc = next_cookie(c, cookie);
	if (rc)
		return rc;
	if (h->ino <= want)
		h->ino = want + 1;
	h->dirty = 1;
	*ino = want;
	return 0;
}

static int dir_has_child(struct conn *c, uint64_t ino)
{
	int64_t v;
	int rc = query_int(c, ST_DIR_HAS_CHILD, 1, (int64_t[]){ (int64_t)ino }, 1, 1, 0, &v);

	if (rc == -ENOENT)
		return 0;
	return rc == 0 ? 1 : rc;
}

static int orphan_add(struct conn *c, uint64_t ino)
{
	return run_ints(c, ST_ORPHAN_ADD, 1, (int64_t[]){ (int64_t)ino });
}

/* Is dir anc itself or one of its ancestors? 1/0 or <0. */
static int dir_within(struct conn *c, uint64_t dir, uint64_t anc)
{
	uint64_t cur = dir;
	int64_t parent;
	long depth;
	int rc;

	for (depth = 0; depth < MAX_DEPTH; depth++) {
		if (cur == anc)
			return 1;
		if (cur == META_ROOT_INO)
			return 0;
		rc = query_int(c, ST_DENTRY_PARENT, 1, (int64_t[]){ (int64_t)cur }, 1, INT64_MAX,
			       0, &parent);
		if (rc == -ENOENT)
			return 0; /* a removed directory hangs nowhere */
		if (rc)
			return rc;
		cur = (uint64_t)parent;
	}
	return -EIO;
}

/* ---- slices ------------------------------------------------------------- */

/* Removes the slices of chunks [lo, hi] of ino, recording for gc those no
 * other row references. */
static int slices_drop(struct conn *c, uint64_t ino, int64_t lo, int64_t hi)
{
	const int64_t v[4] = { (int64_t)ino, lo, hi, now_ts().tv_sec };
	int rc;

	if (lo > hi)
		return 0;
	rc = run_ints(c, ST_SLICE_GC, 4, v);
	if (rc == 0)
		rc = run_ints(c, ST_SLICE_DROP, 3, v);
	return rc;
}

struct seq_slice {
	int64_t seq;
	struct meta_slice s;
};

/* Is [pos, end) wholly inside the union of the sorted, disjoint intervals
 * iv[0..n)? */
static bool covered(const uint32_t (*iv)[2], size_t n, uint32_t pos, uint32_t end)
{
	for (size_t i = 0; i < n && pos < end; i++) {
		if (iv[i][1] <= pos)
			continue;
		if (iv[i][0] > pos)
			return false;
		pos = iv[i][1];
	}
	return pos >= end;
}

/* Adds [pos, end) to the sorted, disjoint intervals iv[0..*n) (room for
 * one more), merging. */
static void cover(uint32_t (*iv)[2], size_t *n, uint32_t pos, uint32_t end)
{
	size_t i = 0, j, k;

	while (i < *n && iv[i][1] < pos)
		i++;
	for (j = i; j < *n && iv[j][0] <= end; j++) {
		if (iv[j][0] < pos)
			pos = iv[j][0];
		if (iv[j][1] > end)
			end = iv[j][1];
	}
	/* iv[i..j) merge into one at i. */
	if (j == i) {
		memmove(iv + i + 1, iv + i, (*n - i) * sizeof(iv[0]));
		(*n)++;
	} else {
		for (k = j; k < *n; k++)
			memcpy(iv[i + 1 + k - j], iv[k], sizeof(iv[0]));
		*n -= j - i - 1;
	}
	iv[i][0] = pos;
	iv[i][1] = end;
}

/*
 * Drops the rows of a chunk that later rows hide wholly (an overwrite, a
 * truncation's zeros), and hands their slices to gc if nothing else refers
 * to them: without it every overwrite would keep its old objects forever.
 * Readers that resolved the chunk before keep what they read: objects go
 * only after meta_gc_list()'s grace period.
 */
static int chunk_compact(struct conn *c, uint64_t ino, uint32_t chunk)
{
	struct db_stmt *st = NULL;
	struct seq_slice *v = NULL, *nv;
	uint32_t (*iv)[2] = NULL;
	size_t n = 0, cap = 0, niv = 0;
	int rc;

	rc = stmt(c, ST_SLICE_LIST_SEQ, &st);
	if (rc)
		return rc;
	rc = bind_i64(st, 1, (int64_t)ino);
	if (rc == 0)
		rc = bind_i64(st, 2, chunk);
	while (rc == 0 && (rc = step(st)) > 0) {
		if (n == cap) {
			cap = cap ? 2 * cap : 16;
			nv = realloc(v, cap * sizeof(*v));
			if (!nv) {
				rc = -ENOMEM;
				break;
			}
			v = nv;
		}
		rc = col_int(st, 0, 1, INT64_MAX, &v[n].seq);
		if (rc == 0) {
			struct db_stmt *one = st;
			/* Columns 1..5 are ST_SLICE_LIST's 0..4. */
			int64_t f[5];
			for (int k = 0; k < 5 && rc == 0; k++)
				rc = col_int(one, k + 1, 0, INT64_MAX, &f[k]);
			if (rc == 0 && (f[3] >= META_CHUNK_SIZE || f[4] < 1 ||
					f[3] + f[4] > META_CHUNK_SIZE || f[1] > UINT32_MAX ||
					f[2] > UINT32_MAX))
				rc = -EIO;
			if (rc == 0)
				v[n++].s = (struct meta_slice){ .id = (uint64_t)f[0],
								.size = (uint32_t)f[1],
								.off = (uint32_t)f[2],
								.pos = (uint32_t)f[3],
								.len = (uint32_t)f[4] };
		}
	}
	stmt_done(st);
	if (rc < 0 || n < 2)
		goto out;
	iv = malloc((n + 1) * sizeof(*iv));
	if (!iv) {
		rc = -ENOMEM;
		goto out;
	}
	/* Newest first: a row is dead if the rows after it cover it. */
	for (size_t i = n; i-- > 0 && rc == 0;) {
		uint32_t pos = v[i].s.pos, end = pos + v[i].s.len;

		if (!covered((const uint32_t (*)[2])iv, niv, pos, end)) {
			cover(iv, &niv, pos, end);
			continue;
		}
		rc = run_ints(c, ST_SLICE_DELETE_SEQ, 1, (int64_t[]){ v[i].seq });
		if (rc == 0)
			rc = run_ints(c, ST_GC_ADD_UNREF, 3,
				      (int64_t[]){ (int64_t)v[i].s.id, v[i].s.size,
						   now_ts().tv_sec });
	}
out:
	free(iv);
	free(v);
	return rc < 0 ? rc : 0;
}

static int slice_insert(struct conn *c, uint64_t ino, uint32_t chunk, const struct meta_slice *s)
{
	const int64_t v[7] = { (int64_t)ino, chunk, (int64_t)s->id, s->size, s->off, s->pos,
			       s->len };
	int rc = run_ints(c, ST_SLICE_INSERT, 7, v);

	return rc ? rc : chunk_compact(c, ino, chunk);
}

static int zero_insert(struct conn *c, uint64_t ino, uint32_t chunk, uint32_t from, uint32_t to)
{
	struct meta_slice z = { .id = 0, .size = to - from, .off = 0, .pos = from,
				.len = to - from };

	return from < to ? slice_insert(c, ino, chunk, &z) : 0;
}

static int row_slice(struct db_stmt *st, struct meta_slice *s);

/* The slices of a chunk, oldest first (*out NULL when there are none). */
static int chunk_load(struct conn *c, uint64_t ino, uint32_t chunk, struct meta_slice **out,
		      size_t *n)
{
	struct db_stmt *st = NULL;
	struct meta_slice *v = NULL, *nv;
	size_t len = 0, cap = 0;
	int rc;

	*out = NULL;
	*n = 0;
	rc = stmt(c, ST_SLICE_LIST, &st);
	if (rc)
		return rc;
	if (bind_i64(st, 1, (int64_t)ino) || bind_i64(st, 2, chunk)) {
		rc = -EIO;
		goto out;
	}
	while ((rc = step(st)) > 0) {
		if (len == cap) {
			size_t ncap = cap ? cap * 2 : 16;

			nv = realloc(v, ncap * sizeof(*v));
			if (nv == NULL) {
				rc = -ENOMEM;
				goto out;
			}
			v = nv;
			cap = ncap;
		}
		rc = row_slice(st, &v[len]);
		if (rc)
			goto out;
		len++;
	}
out:
	stmt_done(st);
	if (rc == 0) {
		*out = v;
		*n = len;
		v = NULL;
	}
	free(v);
	return rc;
}

/* Makes chunk bytes [from, to) read as zeros: appends one zero slice over
 * the part of it where data still shows, if any does. */
static int zero_range(struct conn *c, uint64_t ino, uint32_t chunk, uint32_t from, uint32_t to)
{
	struct meta_slice *s = NULL;
	struct slice_extent *e = NULL;
	size_t n, ne, i, first = SIZE_MAX, last = 0;
	int rc;

	rc = chunk_load(c, ino, chunk, &s, &n);
	if (rc || n == 0)
		goto out;
	rc = slice_resolve(s, n, from, to - from, &e, &ne);
	if (rc)
		goto out;
	for (i = 0; i < ne; i++) {
		if (e[i].id == 0)
			continue;
		if (first == SIZE_MAX)
			first = i;
		last = i;
	}
	if (first != SIZE_MAX)
		rc = zero_insert(c, ino, chunk, e[first].pos, e[last].pos + e[last].len);
out:
	free(e);
	free(s);
	return rc;
}

/* The size changes from old to new: whatever lies past the smaller of the
 * two is cleared, so the file's new bytes read as zeros. */
static int resize_slices(struct conn *c, uint64_t ino, uint64_t old, uint64_t new)
{
	uint64_t keep = old < new ? old : new;
	int64_t first_gone = (int64_t)(keep / META_CHUNK_SIZE + (keep % META_CHUNK_SIZE != 0));
	int rc;

	if (old == new)
		return 0;
	rc = slices_drop(c, ino, first_gone, INT64_MAX);
	if (rc == 0 && keep % META_CHUNK_SIZE != 0)
		rc = zero_range(c, ino, (uint32_t)(keep / META_CHUNK_SIZE),
				(uint32_t)(keep % META_CHUNK_SIZE), META_CHUNK_SIZE);
	return rc;
}

static int row_slice(struct db_stmt *st, struct meta_slice *s)
{
	int64_t v[5];

	if (col_int(st, 0, 0, INT64_MAX, &v[0]) || col_int(st, 1, 0, UINT32_MAX, &v[1]) ||
	    col_int(st, 2, 0, UINT32_MAX, &v[2]) || col_int(st, 3, 0, META_CHUNK_SIZE - 1, &v[3]) ||
	    col_int(st, 4, 1, META_CHUNK_SIZE, &v[4]))
		return -EIO;
	if (v[3] + v[4] > META_CHUNK_SIZE || (v[0] != 0 && v[2] + v[4] > v[1]))
		return -EIO;
	s->id = (uint64_t)v[0];
	s->size = (uint32_t)v[1];
	s->off = (uint32_t)v[2];
	s->pos = (uint32_t)v[3];
	s->len = (uint32_t)v[4];
	return 0;
}

/* ---- volume ------------------------------------------------------------- */

void meta_volume_free(struct meta_volume *v)
{
	if (v == NULL)
		return;
	free(v->storage_url);
	v->storage_url = NULL;
}

static int uuid_valid(const char *u)
{
	size_t i;

	if (strnlen(u, 37) != 36)
		return 0;
	for (i = 0; i < 36; i++) {
		if (i == 8 || i == 13 || i == 18 || i == 23) {
			if (u[i] != '-')
				return 0;
		} else if (!((u[i] >= '0' && u[i] <= '9') || (u[i] >= 'a' && u[i] <= 'f') ||
			     (u[i] >= 'A' && u[i] <= 'F'))) {
			return 0;
		}
	}
	return 1;
}

static int uuid_generate(char out[37])
{
	unsigned char b[16];
	size_t got = 0;

	while (got < sizeof(b)) {
		ssize_t r = getrandom(b + got, sizeof(b) - got, 0);
		if (r < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		got += (size_t)r;
	}
	b[6] = (unsigned char)((b[6] & 0x0f) | 0x40);
	b[8] = (unsigned char)((b[8] & 0x3f) | 0x80);
	snprintf(out, 37,
		 "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
		 b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
		 b[14], b[15]);
	return 0;
}

static int volume_read(struct conn *c, struct meta_volume *out)
{
	struct db_stmt *st = NULL;
	const void *u, *url;
	size_t ulen = 0, urllen = 0;
	char uuid[37];
	int64_t bs, created, http;
	int rc;

	rc = stmt(c, ST_VOLUME_GET, &st);
	if (rc)
		return rc;
	rc = step(st);
	if (rc == 0)
		rc = -EIO;
	if (rc < 0)
		goto out;
	u = col_blob(st, 0, &ulen);
	url = col_blob(st, 2, &urllen);
	if (col_type(st, 0) != DB_TEXT || u == NULL || ulen != 36 || col_type(st, 2) != DB_TEXT ||
	    (urllen && memchr(url, '\0', urllen) != NULL) ||
	    col_int(st, 1, 1, META_CHUNK_SIZE, &bs) || col_int(st, 3, INT64_MIN, INT64_MAX, &created) ||
	    col_int(st, 4, 0, 1, &http)) {
		rc = -EIO;
		goto out;
	}
	memcpy(uuid, u, 36);
	uuid[36] = '\0';
	if (!uuid_valid(uuid)) {
		rc = -EIO;
		goto out;
	}
	rc = 0;
	if (out != NULL) {
		memset(out, 0, sizeof(*out));
		memcpy(out->uuid, uuid, sizeof(uuid));
		out->block_size = (uint32_t)bs;
		out->created_at = created;
		out->s3_http = (int)http;
		out->storage_url = strndup(urllen ? url : "", urllen);
		if (out->storage_url == NULL)
			rc = -ENOMEM;
	}
out:
	stmt_done(st);
	return rc;
}

int meta_volume_get(struct meta *m, struct meta_volume *out)
{
	READ_CONN(c);
	int rc;

	if (m == NULL || out == NULL)
		return -EINVAL;
	rc = meta_read_conn(m, &c);
	if (rc)
		return rc;
	rc = volume_read(c, out);
	return rc == -EAGAIN ? -EIO : rc;
}

struct format_args {
	const struct meta_volume *v;
	const char *uuid;
	uint32_t uid, gid;
};

/* The first rows of a new volume: the volume record, the counters, the
 * root directory. */
static int format_fill(struct conn *c, void *p)
{
	const struct format_args *a = p;
	struct timespec now = now_ts();
	struct meta_attr root = { .ino = META_ROOT_INO, .mode = S_IFDIR | 0755, .uid = a->uid,
				  .gid = a->gid, .nlink = 2, .atime = now, .mtime = now,
				  .ctime = now };
	struct db_stmt *st = NULL;
	int rc;

	rc = stmt(c, ST_VOLUME_INSERT, &st);
	if (rc)
		return rc;
	rc = st->drv->bind_text(st, 1, a->uuid);
	if (rc == 0)
		rc = bind_i64(st, 2, a->v->block_size ? a->v->block_size : META_DEFAULT_BLOCK_SIZE);
	if (rc == 0)
		rc = st->drv->bind_text(st, 3, a->v->storage_url);
	if (rc == 0)
		rc = bind_i64(st, 4, a->v->created_at ? a->v->created_at : (int64_t)now.tv_sec);
	if (rc == 0)
		rc = bind_i64(st, 5, a->v->s3_http ? 1 : 0);
	if (rc == 0)
		rc = step(st);
	stmt_done(st);
	if (rc > 0)
		rc = -EIO;
	if (rc == 0)
		rc = exec_st(c, ST_COUNTERS_INSERT);
	if (rc == 0)
		rc = inode_write(c, ST_INODE_INSERT, &root);
	return rc;
}

int meta_format(const char *db_path, const struct meta_volume *v, uint32_t root_uid,
		uint32_t root_gid, int force)
{
	struct format_args a = { .v = v, .uid = root_uid, .gid = root_gid };
	char uuid[37];
	int rc;

	if (db_path == NULL || v == NULL || v->storage_url == NULL ||
	    v->block_size > META_CHUNK_SIZE)
		return -EINVAL;
	if (v->uuid[0] == '\0') {
		rc = uuid_generate(uuid);
		if (rc)
			return rc;
	} else {
		if (!uuid_valid(v->uuid))
			return -EINVAL;
		memcpy(uuid, v->uuid, sizeof(uuid));
	}
	a.uuid = uuid;
	return meta_format_with(db_path, force, format_fill, &a);
}

int meta_format_with(const char *loc, int force, int (*fill)(struct conn *c, void *arg),
		     void *arg)
{
	struct meta *m = NULL;
	int rc = meta_alloc(loc, &m);

	if (rc)
		return rc;
	rc = m->vol->format(m, force, fill, arg);
	meta_close(m);
	return rc;
}
/* ---- attributes and lookup ---------------------------------------------- */

/* Read-only calls outside meta_txn(): a busy database is an I/O error for them. */
static int ro(int rc)
{
	return rc == -EAGAIN ? -EIO : rc;
}

int meta_getattr(struct meta *m, uint64_t ino, struct meta_attr *out)
{
	struct meta_attr a;
	READ_CONN(c);
	int rc;

	if (m == NULL)
		return -EINVAL;
	rc = meta_read_conn(m, &c);
	if (rc == 0)
		rc = inode_get(c, ino, &a);
	if (rc == 0 && out != NULL)
		*out = a;
	return ro(rc);
}

int meta_lookup(struct meta *m, uint64_t parent, const char *name, struct meta_attr *out)
{
	const struct meta_attr *h;
	struct db_stmt *st = NULL;
	struct meta_attr a, p;
	READ_CONN(c);
	size_t nlen;
	int rc;

	if (m == NULL)
		return -EINVAL;
	rc = name_check(name, &nlen);
	if (rc)
		return rc;
	if (!ino_ok(parent))
		return -ENOENT;
	if (meta_names_absent(m->names, parent, name, nlen))
		return -ENOENT;
	rc = meta_read_conn(m, &c);
	if (rc)
		return rc;
	rc = stmt(c, ST_LOOKUP, &st);
	if (rc)
		return ro(rc);
	rc = bind_i64(st, 1, (int64_t)parent);
	if (rc == 0)
		rc = bind_blob(st, 2, name, nlen);
	if (rc == 0)
		rc = step(st);
	if (rc > 0)
		rc = col_type(st, 1) == DB_NULL ? -EIO : row_attr(st, 1, &a);
	else if (rc == 0)
		rc = -ENOENT;
	stmt_done(st);
	if (rc == 0 && (h = hot_find(c, a.ino)) != NULL)
		a = *h;
	if (rc == -ENOENT) {
		/* Say why: no parent, or not a directory. */
		int prc = dir_get(c, parent, &p);
		if (prc)
			rc = prc;
	}
	if (rc == 0 && out != NULL)
		*out = a;
	return ro(rc);
}

/* A change that makes the entry parent/name ended with rc (meta_names.h):
 * the name is counted if made; one the set took for absent that the
 * database has (-EEXIST) stops the set answering for parent. */
static void names_made(struct meta *m, int rc, uint64_t parent, const char *name, size_t nlen)
{
	if (rc == 0)
		meta_names_add(m->names, parent, name, nlen);
	else if (rc == -EEXIST)
		meta_names_taken(m->names, parent, name, nlen);
}

int meta_names_keep(struct meta *m, size_t max_names)
{
	if (m == NULL || m->names != NULL)
		return -EINVAL;
	return meta_names_new(max_names, &m->names);
}

void meta_names_stats(struct meta *m, struct meta_names_stats *out)
{
	meta_names_stats_get(m ? m->names : NULL, out);
}

/* ---- setattr -------------------------------------------------------------- */

#define META_SET_ALL                                                                         \
	(META_SET_MODE | META_SET_UID | META_SET_GID | META_SET_SIZE | META_SET_ATIME |        \
	 META_SET_MTIME | META_SET_ATIME_NOW | META_SET_MTIME_NOW | META_SET_CTIME)

struct setattr_args {
	uint64_t ino;
	unsigned valid;
	const struct meta_attr *in;
	struct meta_attr out;
};

static int do_setattr(struct conn *c, void *p)
{
	struct setattr_args *a = p;
	const struct meta_attr *in = a->in;
	struct timespec now = now_ts();
	struct meta_attr at;
	int rc;

	rc = inode_get(c, a->ino, &at);
	if (rc)
		return rc;
	if (a->valid & META_SET_SIZE) {
		if (S_ISDIR(at.mode))
			return -EISDIR;
		if (!S_ISREG(at.mode))
			return -EINVAL;
		if (in->size > MAX_FILE_SIZE)
			return -EFBIG;
		rc = resize_slices(c, at.ino, at.size, in->size);
		if (rc)
			return rc;
		at.size = in->size;
	}
	if (a->valid & META_SET_MODE)
		at.mode = (at.mode & S_IFMT) | (in->mode & 07777);
	if (a->valid & META_SET_UID)
		at.uid = in->uid;
	if (a->valid & META_SET_GID)
		at.gid = in->gid;
	if (a->valid & META_SET_ATIME_NOW)
		at.atime = now;
	else if (a->valid & META_SET_ATIME)
		at.atime = in->atime;
	if (a->valid & META_SET_MTIME_NOW) {
		/* A size change stamps "now" of its own accord (truncate,
		 * O_TRUNC): after a step back of the wall clock that must not
		 * make the file look older than it was, as a commit may not. A
		 * time asked for (utimensat UTIME_NOW, no size) is set as asked. */
		bool back = now.tv_sec < at.mtime.tv_sec ||
			    (now.tv_sec == at.mtime.tv_sec && now.tv_nsec < at.mtime.tv_nsec);
		if (!((a->valid & META_SET_SIZE) && back))
			at.mtime = now;
	} else if (a->valid & META_SET_MTIME) {
		at.mtime = in->mtime;
	}
	at.ctime = (a->valid & META_SET_CTIME) ? in->ctime : now;
	rc = inode_put(c, &at);
	if (rc == 0 && meta_tl_seq && (a->valid & (META_SET_MTIME | META_SET_MTIME_NOW)) &&
	    S_ISREG(at.mode))
		rc = run_ints(c, ST_TIMES_SEQ_PUT, 2,
			      (const int64_t[]){ (int64_t)at.ino, (int64_t)meta_tl_seq });
	if (rc == 0)
		a->out = at;
	return rc;
}

int meta_setattr(struct meta *m, uint64_t ino, unsigned valid, const struct meta_attr *in,
		 struct meta_attr *out)
{
	struct setattr_args a = { .ino = ino, .valid = valid, .in = in };
	int rc;

	if (m == NULL || (valid & ~META_SET_ALL) || (valid && in == NULL))
		return -EINVAL;
	if (in != NULL && (((valid & META_SET_ATIME) && !ts_valid(&in->atime)) ||
			   ((valid & META_SET_MTIME) && !ts_valid(&in->mtime)) ||
			   ((valid & META_SET_CTIME) && !ts_valid(&in->ctime))))
		return -EINVAL;
	struct mj_rec r = { .op = MJ_SETATTR, .v = { ino, valid } };
	if (in != NULL) {
		r.v[2] = in->mode;
		r.v[3] = in->uid;
		r.v[4] = in->gid;
		r.v[5] = in->size;
		r.v[6] = (uint64_t)in->atime.tv_sec;
		r.v[7] = (uint64_t)in->atime.tv_nsec;
		r.v[8] = (uint64_t)in->mtime.tv_sec;
		r.v[9] = (uint64_t)in->mtime.tv_nsec;
		r.v[10] = (uint64_t)in->ctime.tv_sec;
		r.v[11] = (uint64_t)in->ctime.tv_nsec;
	}
	rc = meta_txn_rec(m, &r, NULL, do_setattr, &a);
	if (rc == 0 && out != NULL)
		*out = a.out;
	return rc;
}

/* ---- namespace ------------------------------------------------------------ */

struct create_args {
	uint64_t parent;
	const char *name;
	size_t nlen;
	uint32_t mode, uid, gid;
	uint64_t rdev;
	const char *target;
	size_t tlen;
	uint64_t want_ino; /* a replay: the inode number the change made live */
	struct meta_attr out;
};

static int do_create(struct conn *c, void *p)
{
	struct create_args *a = p;
	struct timespec now = now_ts();
	struct meta_attr par, at;
	uint64_t ino, cookie;
	int rc, isdir = S_ISDIR(a->mode);

	rc = dir_get_live(c, a->parent, &par);
	if (rc)
		return rc;
	if (isdir && par.nlink == UINT32_MAX)
		return -EMLINK;
	if (a->want_ino)
		rc = replay_ino(c, a->want_ino, &ino, &cookie);
	else
		rc = next_ino(c, &ino, &cookie);
	if (rc)
		return rc;
	/* The entry first: a name taken fails its insert (-EEXIST) before
	 * anything is written, so no lookup of the name is needed first. */
	rc = dentry_insert(c, a->parent, a->name, a->nlen, ino, cookie);
	if (rc)
		return rc;

	memset(&at, 0, sizeof(at));
	at.ino = ino;
	at.mode = a->mode;
	at.uid = a->uid;
	at.gid = a->gid;
	at.rdev = (S_ISCHR(a->mode) || S_ISBLK(a->mode)) ? a->rdev : 0;
	at.nlink = isdir ? 2 : 1;
	at.size = S_ISLNK(a->mode) ? a->tlen : 0;
	at.atime = at.mtime = at.ctime = now;
	if (par.mode & S_ISGID) {
		at.gid = par.gid;
		if (isdir)
			at.mode |= S_ISGID;
	}
	rc = inode_write(c, ST_INODE_INSERT, &at);
	if (rc == 0 && S_ISLNK(a->mode)) {
		struct db_stmt *st = NULL;

		rc = stmt(c, ST_SYMLINK_INSERT, &st);
		if (rc == 0) {
			rc = bind_i64(st, 1, (int64_t)ino);
			if (rc == 0)
				rc = bind_blob(st, 2, a->target, a->tlen);
			if (rc == 0)
				rc = step(st);
			if (rc > 0)
				rc = 0;
			stmt_done(st);
		}
	}
	if (rc)
		return rc;
	par.mtime = par.ctime = now;
	if (isdir)
		par.nlink++;
	rc = inode_put(c, &par);
	if (rc == 0)
		a->out = at;
	return rc;
}

int meta_create(struct meta *m, uint64_t parent, const char *name, uint32_t mode, uint32_t uid,
		uint32_t gid, uint64_t rdev, const char *target, struct meta_attr *out)
{
	struct create_args a = { .parent = parent, .name = name, .mode = mode, .uid = uid,
				 .gid = gid, .rdev = rdev, .target = target };
	int rc;

	if (m == NULL)
		return -EINVAL;
	rc = name_check(name, &a.nlen);
	if (rc)
		return rc;
	if ((mode & ~(uint32_t)(S_IFMT | 07777)) || !mode_type_valid(mode) || rdev > INT64_MAX)
		return -EINVAL;
	if (S_ISLNK(mode)) {
		if (target == NULL)
			return -EINVAL;
		a.tlen = strnlen(target, SYMLINK_MAX + 1);
		if (a.tlen > SYMLINK_MAX)
			return -ENAMETOOLONG;
		if (a.tlen == 0)
			return -ENOENT; /* as symlink(2) */
	}
	if (!ino_ok(parent))
		return -ENOENT;
	struct mj_rec r = { .op = MJ_CREATE, .v = { parent, mode, uid, gid, rdev },
			    .s = { name, target }, .slen = { (uint32_t)a.nlen, (uint32_t)a.tlen } };
	rc = meta_txn_rec(m, &r, &a.out.ino, do_create, &a);
	names_made(m, rc, parent, name, a.nlen);
	if (rc == 0 && S_ISDIR(mode))
		meta_names_dir_made(m->names, a.out.ino);
	if (rc == 0 && out != NULL)
		*out = a.out;
	return rc;
}

struct link_args {
	uint64_t ino, parent;
	const char *name;
	size_t nlen;
	struct meta_attr out;
};

static int do_link(struct conn *c, void *p)
{
	struct link_args *a = p;
	struct timespec now = now_ts();
	struct meta_attr at, par;
	uint64_t x, cookie;
	int rc;

	rc = inode_get(c, a->ino, &at);
	if (rc)
		return rc;
	if (S_ISDIR(at.mode))
		return -EPERM;
	if (at.nlink == 0)
		return -ENOENT; /* as linkat(2) on an unlinked file */
	if (at.nlink == UINT32_MAX)
		return -EMLINK;
	rc = dir_get_live(c, a->parent, &par);
	if (rc)
		return rc;
	rc = dentry_get(c, a->parent, a->name, a->nlen, &x);
	if (rc == 0)
		return -EEXIST;
	if (rc != -ENOENT)
		return rc;
	rc = next_cookie(c, &cookie);
	if (rc == 0)
		rc = dentry_insert(c, a->parent, a->name, a->nlen, at.ino, cookie);
	if (rc)
		return rc;
	at.nlink++;
	at.ctime = now;
	par.mtime = par.ctime = now;
	rc = inode_put(c, &at);
	if (rc == 0)
		rc = inode_put(c, &par);
	if (rc == 0)
		a->out = at;
	return rc;
}

int meta_link(struct meta *m, uint64_t ino, uint64_t newparent, const char *newname,
	      struct meta_attr *out)
{
	struct link_args a = { .ino = ino, .parent = newparent, .name = newname };
	int rc;

	if (m == NULL)
		return -EINVAL;
	rc = name_check(newname, &a.nlen);
	if (rc)
		return rc;
	if (!ino_ok(ino) || !ino_ok(newparent))
		return -ENOENT;
	struct mj_rec r = { .op = MJ_LINK, .v = { ino, newparent }, .s = { newname },
			    .slen = { (uint32_t)a.nlen } };
	rc = meta_txn_rec(m, &r, NULL, do_link, &a);
	names_made(m, rc, newparent, newname, a.nlen);
	if (rc == 0 && out != NULL)
		*out = a.out;
	return rc;
}

struct remove_args {
	uint64_t parent;
	const char *name;
	size_t nlen;
	int dir;
	struct meta_attr out;
};

static int do_remove(struct conn *c, void *p)
{
	struct remove_args *a = p;
	struct timespec now = now_ts();
	struct meta_attr par, vic;
	int rc;

	rc = dir_get(c, a->parent, &par);
	if (rc)
		return rc;
	rc = entry_get(c, a->parent, a->name, a->nlen, &vic);
	if (rc)
		return rc;
	if (vic.ino == par.ino)
		return -EIO;
	if (a->dir) {
		if (!S_ISDIR(vic.mode))
			return -ENOTDIR;
		rc = dir_has_child(c, vic.ino);
		if (rc)
			return rc > 0 ? -ENOTEMPTY : rc;
		vic.nlink = 0;
		if (par.nlink > 2)
			par.nlink--;
	} else {
		if (S_ISDIR(vic.mode))
			return -EISDIR;
		if (vic.nlink > 0)
			vic.nlink--;
	}
	rc = dentry_run(c, ST_DENTRY_DELETE, a->parent, a->name, a->nlen, 0, NULL, 0, 2);
	if (rc)
		return rc;
	vic.ctime = now;
	par.mtime = par.ctime = now;
	if (vic.nlink == 0)
		rc = orphan_add(c, vic.ino);
	if (rc == 0)
		rc = inode_put(c, &vic);
	if (rc == 0)
		rc = inode_put(c, &par);
	if (rc == 0)
		a->out = vic;
	return rc;
}

static int remove_entry(struct meta *m, uint64_t parent, const char *name, int dir,
			struct meta_attr *victim)
{
	struct remove_args a = { .parent = parent, .name = name, .dir = dir };
	int rc;

	if (m == NULL)
		return -EINVAL;
	rc = name_check(name, &a.nlen);
	if (rc)
		return rc;
	if (!ino_ok(parent))
		return -ENOENT;
	struct mj_rec r = { .op = dir ? MJ_RMDIR : MJ_UNLINK, .v = { parent }, .s = { name },
			    .slen = { (uint32_t)a.nlen } };
	rc = meta_txn_rec(m, &r, NULL, do_remove, &a);
	if (rc == 0) {
		meta_names_del(m->names, parent, name, a.nlen);
		if (dir)
			meta_names_dir_gone(m->names, a.out.ino);
	}
	if (rc == 0 && victim != NULL)
		*victim = a.out;
	return rc;
}

int meta_unlink(struct meta *m, uint64_t parent, const char *name, struct meta_attr *victim)
{
	return remove_entry(m, parent, name, 0, victim);
}

int meta_rmdir(struct meta *m, uint64_t parent, const char *name, struct meta_attr *victim)
{
	return remove_entry(m, parent, name, 1, victim);
}

struct rename_args {
	uint64_t parent, newparent;
	const char *name, *newname;
	size_t nlen, newnlen;
	unsigned flags;
	struct meta_attr replaced;
	int moved; /* the entry moved (not an exchange, not the same inode) */
};

static int do_rename(struct conn *c, void *p)
{
	struct rename_args *a = p;
	struct timespec now = now_ts();
	struct meta_attr pa, pb, src, tgt;
	struct meta_attr *P = &pa, *Q;
	int rc, have_tgt, sdir, tdir;

	memset(&a->replaced, 0, sizeof(a->replaced));
	a->moved = 0;
	rc = dir_get(c, a->parent, &pa);
	if (rc)
		return rc;
	if (a->newparent != a->parent) {
		rc = dir_get_live(c, a->newparent, &pb);
		if (rc)
			return rc;
		Q = &pb;
	} else {
		Q = &pa;
	}
	rc = entry_get(c, a->parent, a->name, a->nlen, &src);
	if (rc)
		return rc;
	/* A replay runs before or behind what the names set holds: only a
	 * change made now may take its answer. */
	if (!meta_tl_replaying && c->m != NULL &&
	    meta_names_absent(c->m->names, a->newparent, a->newname, a->newnlen))
		rc = -ENOENT;
	else
		rc = entry_get(c, a->newparent, a->newname, a->newnlen, &tgt);
	if (rc && rc != -ENOENT)
		return rc;
	have_tgt = rc == 0;
	sdir = S_ISDIR(src.mode);
	tdir = have_tgt && S_ISDIR(tgt.mode);

	if (have_tgt && (a->flags & META_RENAME_NOREPLACE))
		return -EEXIST;
	if (!have_tgt && (a->flags & META_RENAME_EXCHANGE))
		return -ENOENT;
	if (have_tgt && tgt.ino == src.ino)
		return 0; /* the same inode (same entry or hard links): nothing to do */
	if (Q->nlink == 0)
		return -ENOENT;

	/* A directory cannot move into its own subtree. */
	if (sdir && a->newparent != a->parent) {
		rc = dir_within(c, a->newparent, src.ino);
		if (rc)
			return rc > 0 ? -EINVAL : rc;
	}
	if (tdir && (a->flags & META_RENAME_EXCHANGE) && a->newparent != a->parent) {
		rc = dir_within(c, a->parent, tgt.ino);
		if (rc)
			return rc > 0 ? -EINVAL : rc;
	}
	if (have_tgt && !(a->flags & META_RENAME_EXCHANGE)) {
		if (sdir && !tdir)
			return -ENOTDIR;
		if (!sdir && tdir)
			return -EISDIR;
		if (tdir) {
			rc = dir_has_child(c, tgt.ino);
			if (rc)
				return rc > 0 ? -ENOTEMPTY : rc;
		}
	}
	/* Whatever aliases survived the checks above is damage. */
	if (src.ino == pa.ino || src.ino == Q->ino ||
	    (have_tgt && (tgt.ino == pa.ino || tgt.ino == Q->ino)))
		return -EIO;

	if (a->flags & META_RENAME_EXCHANGE) {
		rc = dentry_run(c, ST_DENTRY_SETINO, a->parent, a->name, a->nlen,
				(int64_t)tgt.ino, NULL, 0, 3);
		if (rc == 0)
			rc = dentry_run(c, ST_DENTRY_SETINO, a->newparent, a->newname,
					a->newnlen, (int64_t)src.ino, NULL, 0, 3);
		if (rc)
			return rc;
		if (P != Q && sdir != tdir) {
			if (sdir) {
				P->nlink--;
				Q->nlink++;
			} else {
				Q->nlink--;
				P->nlink++;
			}
		}
		tgt.ctime = now;
	} else {
		if (have_tgt) {
			rc = dentry_run(c, ST_DENTRY_DELETE, a->newparent, a->newname,
					a->newnlen, 0, NULL, 0, 2);
			if (rc)
				return rc;
			if (tdir) {
				tgt.nlink = 0;
				Q->nlink--;
			} else if (tgt.nlink > 0) {
				tgt.nlink--;
			}
			tgt.ctime = now;
			if (tgt.nlink == 0)
				rc = orphan_add(c, tgt.ino);
			if (rc)
				return rc;
		}
		rc = dentry_run(c, ST_DENTRY_MOVE, a->parent, a->name, a->nlen,
				(int64_t)a->newparent, a->newname, a->newnlen, 4);
		if (rc)
			return rc;
		a->moved = 1;
		if (sdir && P != Q) {
			P->nlink--;
			Q->nlink++;
		}
	}
	src.ctime = now;
	P->mtime = P->ctime = now;
	Q->mtime = Q->ctime = now;
	rc = inode_put(c, &src);
	if (rc == 0 && have_tgt)
		rc = inode_put(c, &tgt);
	if (rc == 0)
		rc = inode_put(c, P);
	if (rc == 0 && Q != P)
		rc = inode_put(c, Q);
	if (rc == 0 && have_tgt && !(a->flags & META_RENAME_EXCHANGE))
		a->replaced = tgt;
	return rc;
}

int meta_rename(struct meta *m, uint64_t parent, const char *name, uint64_t newparent,
		const char *newname, unsigned flags, struct meta_attr *replaced)
{
	struct rename_args a = { .parent = parent, .newparent = newparent, .name = name,
				 .newname = newname, .flags = flags };
	int rc;

	if (m == NULL)
		return -EINVAL;
	rc = name_check(name, &a.nlen);
	if (rc == 0)
		rc = name_check(newname, &a.newnlen);
	if (rc)
		return rc;
	if ((flags & ~(META_RENAME_NOREPLACE | META_RENAME_EXCHANGE)) ||
	    (flags == (META_RENAME_NOREPLACE | META_RENAME_EXCHANGE)))
		return -EINVAL;
	if (!ino_ok(parent) || !ino_ok(newparent))
		return -ENOENT;
	struct mj_rec r = { .op = MJ_RENAME, .v = { parent, newparent, flags },
			    .s = { name, newname },
			    .slen = { (uint32_t)a.nlen, (uint32_t)a.newnlen } };
	rc = meta_txn_rec(m, &r, NULL, do_rename, &a);
	if (rc == 0 && a.moved) {
		meta_names_del(m->names, parent, name, a.nlen);
		if (a.replaced.ino == 0)
			meta_names_add(m->names, newparent, newname, a.newnlen);
		else if (S_ISDIR(a.replaced.mode))
			meta_names_dir_gone(m->names, a.replaced.ino);
	} else if (rc == -EEXIST) {
		meta_names_taken(m->names, newparent, newname, a.newnlen);
	}
	if (rc == 0 && replaced != NULL)
		*replaced = a.replaced;
	return rc;
}

int meta_readlink(struct meta *m, uint64_t ino, char **target)
{
	struct db_stmt *st = NULL;
	struct meta_attr at;
	READ_CONN(c);
	const void *p;
	char *t;
	size_t n;
	int rc;

	if (m == NULL || target == NULL)
		return -EINVAL;
	*target = NULL;
	rc = meta_read_conn(m, &c);
	if (rc)
		return rc;
	rc = inode_get(c, ino, &at);
	if (rc)
		return ro(rc);
	if (!S_ISLNK(at.mode))
		return -EINVAL;
	rc = stmt(c, ST_SYMLINK_GET, &st);
	if (rc)
		return ro(rc);
	rc = bind_i64(st, 1, (int64_t)ino);
	if (rc == 0)
		rc = step(st);
	if (rc == 0)
		rc = -EIO; /* a symlink inode with no target */
	if (rc < 0)
		goto out;
	p = col_blob(st, 0, &n);
	if ((col_type(st, 0) != DB_BLOB && col_type(st, 0) != DB_TEXT) || p == NULL || n == 0 ||
	    n > SYMLINK_MAX || memchr(p, '\0', n) != NULL) {
		rc = -EIO;
		goto out;
	}
	t = malloc(n + 1);
	if (t == NULL) {
		rc = -ENOMEM;
		goto out;
	}
	memcpy(t, p, n);
	t[n] = '\0';
	*target = t;
	rc = 0;
out:
	stmt_done(st);
	return ro(rc);
}

/* ---- readdir ---------------------------------------------------------------- */

struct rd_ent {
	char name[META_NAME_MAX + 1];
	struct meta_attr attr;
	uint64_t cookie;
};

/* Reads up to READDIR_PAGE entries after cookie after into page. */
static int readdir_page(struct conn *c, uint64_t ino, uint64_t after, int plus,
			struct rd_ent *page, size_t *n)
{
	struct db_stmt *st = NULL;
	int64_t cookie, dino;
	int rc;

	*n = 0;
	rc = stmt(c, ST_READDIR, &st);
	if (rc)
		return rc;
	if (bind_i64(st, 1, (int64_t)ino) || bind_i64(st, 2, (int64_t)after) ||
	    bind_i64(st, 3, READDIR_PAGE)) {
		rc = -EIO;
		goto out;
	}
	while ((rc = step(st)) > 0) {
		struct rd_ent *e = &page[*n];

		if (*n >= READDIR_PAGE || col_name(st, 0, e->name, META_NAME_MAX) ||
		    col_int(st, 1, 1, INT64_MAX, &cookie) || col_int(st, 2, 1, INT64_MAX, &dino) ||
		    row_attr(st, 3, &e->attr) || e->attr.ino != (uint64_t)dino) {
			rc = -EIO;
			goto out;
		}
		const struct meta_attr *h = hot_find(c, e->attr.ino);

		if (h != NULL)
			e->attr = *h;
		if (!plus) {
			uint32_t mode = e->attr.mode;

			memset(&e->attr, 0, sizeof(e->attr));
			e->attr.ino = (uint64_t)dino;
			e->attr.mode = mode;
		}
		e->cookie = (uint64_t)cookie;
		(*n)++;
	}
out:
	stmt_done(st);
	return rc;
}

int meta_readdir(struct meta *m, uint64_t ino, uint64_t after, int plus, meta_readdir_cb cb,
		 void *arg)
{
	struct rd_ent *page = NULL;
	struct meta_attr d;
	READ_CONN(c);
	size_t n, i;
	int rc;

	if (m == NULL || cb == NULL)
		return -EINVAL;
	rc = meta_read_conn(m, &c);
	if (rc)
		return rc;
	rc = dir_get(c, ino, &d);
	meta_read_done(&c);
	c = NULL;
	if (rc)
		return ro(rc);
	if (after >= INT64_MAX)
		return 0;
	page = malloc(READDIR_PAGE * sizeof(*page));
	if (page == NULL)
		return -ENOMEM;
	meta_names_scan(m->names, ino, after);
	/* Callbacks run with no statement open and no lock held (a batch's
	 * reads hold write_lock), so they may call back in. */
	for (;;) {
		rc = meta_read_conn(m, &c);
		if (rc == 0)
			rc = readdir_page(c, ino, after, plus, page, &n);
		meta_read_done(&c);
		c = NULL;
		if (rc)
			goto out;
		for (i = 0; i < n; i++) {
			if (page[i].cookie <= after) {
				rc = -EIO;
				goto out;
			}
			after = page[i].cookie;
			if (cb(arg, page[i].name, &page[i].attr, page[i].cookie) != 0)
				goto out;
			meta_names_scan_name(m->names, ino, page[i].name, strlen(page[i].name),
					     page[i].cookie);
		}
		if (n < READDIR_PAGE) {
			meta_names_scan_end(m->names, ino, after);
			break;
		}
	}
out:
	free(page);
	return ro(rc);
}

/* ---- xattrs ------------------------------------------------------------------ */

static int xattr_name_check(const char *name, size_t *len)
{
	size_t n;

	if (name == NULL)
		return -EINVAL;
	n = strnlen(name, META_XATTR_NAME_MAX + 1);
	if (n == 0 || n > META_XATTR_NAME_MAX)
		return -ERANGE;
	*len = n;
	return 0;
}

/* 1 if ino has xattr name, 0 if not. */
static int xattr_exists(struct conn *c, uint64_t ino, const char *name, size_t nlen)
{
	struct db_stmt *st = NULL;
	int rc;

	rc = stmt(c, ST_XATTR_GET, &st);
	if (rc)
		return rc;
	rc = bind_i64(st, 1, (int64_t)ino);
	if (rc == 0)
		rc = bind_blob(st, 2, name, nlen);
	if (rc == 0)
		rc = step(st);
	stmt_done(st);
	return rc;
}

struct xattr_args {
	uint64_t ino;
	const char *name;
	size_t nlen;
	const void *value;
	size_t size;
	int flags;
	int remove;
};

static int do_xattr(struct conn *c, void *p)
{
	struct xattr_args *a = p;
	struct meta_attr at;
	struct db_stmt *st = NULL;
	int rc, exists;

	rc = inode_get(c, a->ino, &at);
	if (rc)
		return rc;
	exists = xattr_exists(c, a->ino, a->name, a->nlen);
	if (exists < 0)
		return exists;
	if (a->remove || (a->flags & META_XATTR_REPLACE)) {
		if (!exists)
			return -ENODATA;
	} else if ((a->flags & META_XATTR_CREATE) && exists) {
		return -EEXIST;
	}
	rc = stmt(c, a->remove ? ST_XATTR_DELETE : ST_XATTR_PUT, &st);
	if (rc)
		return rc;
	rc = bind_i64(st, 1, (int64_t)a->ino);
	if (rc == 0)
		rc = bind_blob(st, 2, a->name, a->nlen);
	if (rc == 0 && !a->remove)
		rc = bind_blob(st, 3, a->value, a->size);
	if (rc == 0)
		rc = step(st);
	if (rc > 0)
		rc = 0;
	stmt_done(st);
	if (rc)
		return rc;
	at.ctime = now_ts();
	return inode_put(c, &at);
}

int meta_setxattr(struct meta *m, uint64_t ino, const char *name, const void *value,
		  size_t size, int flags)
{
	struct xattr_args a = { .ino = ino, .name = name, .value = value, .size = size,
				.flags = flags };
	int rc;

	if (m == NULL || (value == NULL && size > 0) ||
	    (flags & ~(META_XATTR_CREATE | META_XATTR_REPLACE)) ||
	    flags == (META_XATTR_CREATE | META_XATTR_REPLACE))
		return -EINVAL;
	rc = xattr_name_check(name, &a.nlen);
	if (rc)
		return rc;
	if (size > META_XATTR_SIZE_MAX)
		return -E2BIG;
	if (!ino_ok(ino))
		return -ENOENT;
	struct mj_rec r = { .op = MJ_SETXATTR, .v = { ino, (uint64_t)flags }, .s = { name, value },
			    .slen = { (uint32_t)a.nlen, (uint32_t)size } };
	return meta_txn_rec(m, &r, NULL, do_xattr, &a);
}

int meta_removexattr(struct meta *m, uint64_t ino, const char *name)
{
	struct xattr_args a = { .ino = ino, .name = name, .remove = 1 };
	int rc;

	if (m == NULL)
		return -EINVAL;
	rc = xattr_name_check(name, &a.nlen);
	if (rc)
		return rc;
	if (!ino_ok(ino))
		return -ENOENT;
	struct mj_rec r = { .op = MJ_REMOVEXATTR, .v = { ino }, .s = { name },
			    .slen = { (uint32_t)a.nlen } };
	return meta_txn_rec(m, &r, NULL, do_xattr, &a);
}

int meta_getxattr(struct meta *m, uint64_t ino, const char *name, void **value, size_t *size)
{
	struct db_stmt *st = NULL;
	struct meta_attr at;
	READ_CONN(c);
	const void *p;
	size_t nlen, n;
	void *v;
	int rc;

	if (m == NULL || value == NULL || size == NULL)
		return -EINVAL;
	*value = NULL;
	*size = 0;
	rc = xattr_name_check(name, &nlen);
	if (rc)
		return rc;
	rc = meta_read_conn(m, &c);
	if (rc)
		return rc;
	rc = inode_get(c, ino, &at);
	if (rc)
		return ro(rc);
	rc = stmt(c, ST_XATTR_GET, &st);
	if (rc)
		return ro(rc);
	rc = bind_i64(st, 1, (int64_t)ino);
	if (rc == 0)
		rc = bind_blob(st, 2, name, nlen);
	if (rc == 0)
		rc = step(st);
	if (rc == 0)
		rc = -ENODATA;
	if (rc < 0)
		goto out;
	p = col_blob(st, 0, &n);
	if ((col_type(st, 0) != DB_BLOB && col_type(st, 0) != DB_TEXT) ||
	    n > META_XATTR_SIZE_MAX || (n > 0 && p == NULL)) {
		rc = -EIO;
		goto out;
	}
	v = malloc(n > 0 ? n : 1);
	if (v == NULL) {
		rc = -ENOMEM;
		goto out;
	}
	if (n > 0)
		memcpy(v, p, n);
	*value = v;
	*size = n;
	rc = 0;
out:
	stmt_done(st);
	return ro(rc);
}

int meta_listxattr(struct meta *m, uint64_t ino, char **list, size_t *size)
{
	struct db_stmt *st = NULL;
	struct meta_attr at;
	READ_CONN(c);
	char *buf = NULL, *nb;
	size_t len = 0, cap = 0;
	char name[META_XATTR_NAME_MAX + 1];
	int rc;

	if (m == NULL || list == NULL || size == NULL)
		return -EINVAL;
	*list = NULL;
	*size = 0;
	rc = meta_read_conn(m, &c);
	if (rc)
		return rc;
	rc = inode_get(c, ino, &at);
	if (rc)
		return ro(rc);
	rc = stmt(c, ST_XATTR_LIST, &st);
	if (rc)
		return ro(rc);
	rc = bind_i64(st, 1, (int64_t)ino);
	if (rc)
		goto out;
	while ((rc = step(st)) > 0) {
		size_t n;

		if (col_name(st, 0, name, META_XATTR_NAME_MAX)) {
			rc = -EIO;
			goto out;
		}
		n = strlen(name) + 1;
		if (len + n > cap) {
			size_t ncap = cap ? cap * 2 : 256;
			while (ncap < len + n)
				ncap *= 2;
			nb = realloc(buf, ncap);
			if (nb == NULL) {
				rc = -ENOMEM;
				goto out;
			}
			buf = nb;
			cap = ncap;
		}
		memcpy(buf + len, name, n);
		len += n;
	}
	if (rc == 0) {
		*list = buf;
		*size = len;
		buf = NULL;
	}
out:
	stmt_done(st);
	free(buf);
	return ro(rc);
}

/* ---- statfs and slices ------------------------------------------------------ */

int meta_statfs(struct meta *m, uint64_t *used_bytes, uint64_t *used_inodes)
{
	struct db_stmt *st = NULL;
	READ_CONN(c);
	int64_t b, n;
	int rc;

	if (m == NULL)
		return -EINVAL;
	rc = meta_read_conn(m, &c);
	if (rc)
		return rc;
	rc = stmt(c, ST_STATFS, &st);
	if (rc)
		return ro(rc);
	rc = step(st);
	if (rc == 0)
		rc = -EIO;
	if (rc > 0)
		rc = (col_int(st, 0, 0, INT64_MAX, &b) || col_int(st, 1, 0, INT64_MAX, &n)) ? -EIO :
											      0;
	stmt_done(st);
	if (rc == 0) {
		if (used_bytes)
			*used_bytes = (uint64_t)b;
		if (used_inodes)
			*used_inodes = (uint64_t)n;
	}
	return ro(rc);
}

/* ---- gc ------------------------------------------------------------------ */

static int do_gc_mark(struct conn *c, void *p)
{
	return run_ints(c, ST_GC_MARK, 1, p);
}

int meta_gc_mark(struct meta *m, int64_t mark)
{
	if (m == NULL || mark <= 0)
		return -EINVAL;
	return meta_txn(m, do_gc_mark, &mark);
}

int meta_gc_last_mark(struct meta *m, int64_t *mark)
{
	READ_CONN(c);
	int rc;

	if (m == NULL || mark == NULL)
		return -EINVAL;
	rc = meta_read_conn(m, &c);
	if (rc == 0)
		rc = query_int(c, ST_GC_LAST_MARK, 0, NULL, 0, INT64_MAX, 0, mark);
	return ro(rc);
}

int meta_gc_list(struct meta *m, int64_t mark, int64_t before, size_t max,
		 struct meta_gc_item **out, size_t *n)
{
	struct db_stmt *st = NULL;
	struct meta_gc_item *v = NULL;
	READ_CONN(c);
	int rc;

	if (m == NULL || out == NULL || n == NULL || max == 0 || max > INT32_MAX)
		return -EINVAL;
	*out = NULL;
	*n = 0;
	rc = meta_read_conn(m, &c);
	if (rc)
		return rc;
	v = calloc(max, sizeof(*v));
	if (!v)
		return -ENOMEM;
	rc = stmt(c, ST_GC_LIST, &st);
	if (rc == 0)
		rc = bind_i64(st, 1, mark);
	if (rc == 0)
		rc = bind_i64(st, 2, before);
	if (rc == 0)
		rc = bind_i64(st, 3, (int64_t)max);
	while (rc == 0 && *n < max && (rc = step(st)) > 0) {
		int64_t id, size;

		rc = (col_int(st, 0, 1, INT64_MAX, &id) || col_int(st, 1, 0, UINT32_MAX, &size)) ?
			     -EIO : 0;
		if (rc == 0)
			v[(*n)++] = (struct meta_gc_item){ .id = (uint64_t)id, .size = (uint32_t)size };
	}
	stmt_done(st);
	if (rc < 0) {
		free(v);
		*n = 0;
		return ro(rc);
	}
	*out = v;
	return 0;
}

struct gc_forget_args {
	const struct meta_gc_item *items;
	size_t n;
};

static int do_gc_forget(struct conn *c, void *p)
{
	struct gc_forget_args *a = p;
	int rc = 0;

	for (size_t i = 0; i < a->n && rc == 0; i++)
		rc = run_ints(c, ST_GC_FORGET, 1, (int64_t[]){ (int64_t)a->items[i].id });
	return rc;
}

int meta_gc_forget(struct meta *m, const struct meta_gc_item *items, size_t n)
{
	struct gc_forget_args a = { items, n };

	if (m == NULL || (items == NULL && n > 0))
		return -EINVAL;
	return n ? meta_txn(m, do_gc_forget, &a) : 0;
}

int meta_gc_pending(struct meta *m, uint64_t *slices, uint64_t *bytes)
{
	struct db_stmt *st = NULL;
	READ_CONN(c);
	int64_t cnt = 0, sum = 0;
	int rc;

	if (m == NULL)
		return -EINVAL;
	rc = meta_read_conn(m, &c);
	if (rc)
		return rc;
	rc = stmt(c, ST_GC_PENDING, &st);
	if (rc == 0)
		rc = step(st);
	if (rc == 0)
		rc = -EIO;
	if (rc > 0)
		rc = (col_int(st, 0, 0, INT64_MAX, &cnt) || col_int(st, 1, 0, INT64_MAX, &sum)) ?
			     -EIO : 0;
	stmt_done(st);
	if (rc == 0) {
		if (slices)
			*slices = (uint64_t)cnt;
		if (bytes)
			*bytes = (uint64_t)sum;
	}
	return ro(rc);
}

int meta_chunk_slices(struct meta *m, uint64_t ino, uint32_t chunk, struct meta_slice **out,
		      size_t *n)
{
	struct meta_attr at;
	READ_CONN(c);
	int rc;

	if (m == NULL || out == NULL || n == NULL)
		return -EINVAL;
	*out = NULL;
	*n = 0;
	if (!ino_ok(ino))
		return -ENOENT;
	rc = meta_read_conn(m, &c);
	if (rc)
		return rc;
	rc = chunk_load(c, ino, chunk, out, n);
	if (rc == 0 && *n == 0)
		rc = inode_get(c, ino, &at); /* nothing written, or no such file? */
	return ro(rc);
}

struct slice_alloc_args {
	uint32_t count;
	uint64_t first;
};

static int do_slice_alloc(struct conn *c, void *p)
{
	struct slice_alloc_args *a = p;
	struct db_stmt *st = NULL;
	int64_t v;
	int rc;

	rc = stmt(c, ST_NEXT_SLICE, &st);
	if (rc)
		return rc;
	rc = bind_i64(st, 1, a->count);
	if (rc == 0)
		rc = step(st);
	if (rc == 0)
		rc = -EIO; /* no counters row, or the ids ran out */
	if (rc > 0)
		rc = col_int(st, 0, 1, INT64_MAX, &v);
	if (rc == 0 && (rc = step(st)) > 0)
		rc = -EIO;
	stmt_done(st);
	if (rc == 0)
		a->first = (uint64_t)v;
	return rc;
}

/* Ids are names and nothing more, so a range taken and never handed out
 * (this handle closed first) is a harmless gap; taking SLICE_ID_RESERVE at
 * a time spares each staging file a write transaction of its own, which
 * in another process would end a deferring daemon's batch. */
#define SLICE_ID_RESERVE 1024

int meta_slice_id_alloc(struct meta *m, uint32_t count, uint64_t *first)
{
	struct slice_alloc_args a;
	int rc = 0;

	if (m == NULL || first == NULL || count == 0)
		return -EINVAL;
	pthread_mutex_lock(&m->ids_lock);
	if (m->ids_end - m->ids_next < count) {
		a = (struct slice_alloc_args){ .count = count < SLICE_ID_RESERVE ? SLICE_ID_RESERVE
										 : count };
		rc = meta_txn(m, do_slice_alloc, &a);
		if (rc == 0) {
			m->ids_next = a.first;
			m->ids_end = a.first + a.count;
		}
	}
	if (rc == 0) {
		*first = m->ids_next;
		m->ids_next += count;
	}
	pthread_mutex_unlock(&m->ids_lock);
	return rc;
}

struct commit_args {
	uint64_t ino;
	const struct meta_chunk_slice *slices;
	size_t n;
	uint64_t new_size;
	const struct timespec *mtime;
	bool keep_times;        /* leave mtime and ctime as they are */
	struct meta_attr out;
};

static int do_write_commit(struct conn *c, void *p)
{
	struct commit_args *a = p;
	struct meta_attr at;
	size_t i;
	int rc;

	rc = inode_get(c, a->ino, &at);
	if (rc)
		return rc;
	if (S_ISDIR(at.mode))
		return -EISDIR;
	if (!S_ISREG(at.mode))
		return -EINVAL;
	rc = resize_slices(c, at.ino, at.size, a->new_size);
	for (i = 0; i < a->n && rc == 0; i++)
		rc = slice_insert(c, at.ino, a->slices[i].chunk, &a->slices[i].s);
	if (rc)
		return rc;
	at.size = a->new_size;
	if (!a->keep_times)
		at.mtime = at.ctime = a->mtime ? *a->mtime : now_ts();
	rc = inode_put(c, &at);
	if (rc == 0)
		a->out = at;
	return rc;
}

static int slice_valid(const struct meta_slice *s)
{
	if (s->len == 0 || s->pos >= META_CHUNK_SIZE || s->len > META_CHUNK_SIZE - s->pos ||
	    s->id > INT64_MAX)
		return 0;
	return s->id == 0 || (s->off <= s->size && s->len <= s->size - s->off);
}

/* Checks a commit's arguments before any transaction. */
static int commit_args_check(struct meta *m, const struct commit_args *a)
{
	if (m == NULL || (a->slices == NULL && a->n > 0) || (a->mtime != NULL && !ts_valid(a->mtime)))
		return -EINVAL;
	if (a->new_size > MAX_FILE_SIZE)
		return -EFBIG;
	for (size_t i = 0; i < a->n; i++)
		if (!slice_valid(&a->slices[i].s))
			return -EINVAL;
	if (!ino_ok(a->ino))
		return -ENOENT;
	return 0;
}

int meta_write_commit(struct meta *m, uint64_t ino, const struct meta_chunk_slice *slices,
		      size_t n, uint64_t new_size, const struct timespec *mtime,
		      struct meta_attr *out)
{
	struct commit_args a = { .ino = ino, .slices = slices, .n = n, .new_size = new_size,
				 .mtime = mtime };
	int rc = commit_args_check(m, &a);

	if (rc == 0)
		rc = meta_txn(m, do_write_commit, &a);
	if (rc == 0 && out != NULL)
		*out = a.out;
	return rc;
}

struct commit_seq_args {
	struct commit_args commit;
	uint64_t seq;
	uint64_t meta_seq;
};

static int do_write_commit_seq(struct conn *c, void *p)
{
	struct commit_seq_args *a = p;
	int64_t ino = (int64_t)a->commit.ino, last = -1, tseq = -1;
	struct db_stmt *st = NULL;
	int rc;

	/* The last job committed for the inode, and the last explicit change
	 * of its times: NULL when there is none. */
	rc = stmt(c, ST_SEQS_GET, &st);
	if (rc == 0)
		rc = bind_i64(st, 1, ino);
	if (rc == 0)
		rc = step(st);
	if (rc == 0)
		rc = -EIO; /* a SELECT without FROM has its row */
	if (rc > 0) {
		rc = 0;
		if (col_type(st, 0) != DB_NULL)
			rc = col_int(st, 0, 0, INT64_MAX, &last);
		if (rc == 0 && col_type(st, 1) != DB_NULL)
			rc = col_int(st, 1, 0, INT64_MAX, &tseq);
	}
	stmt_done(st);
	if (rc == 0 && last >= 0 && (uint64_t)last >= a->seq)
		rc = -EALREADY;
	/* Times set explicitly after the handoff stay. */
	if (rc == 0 && a->meta_seq > 0 && tseq >= 0 && (uint64_t)tseq > a->meta_seq)
		a->commit.keep_times = true;
	if (rc == 0)
		rc = do_write_commit(c, &a->commit);
	if (rc == 0)
		rc = run_ints(c, ST_SEQ_PUT, 2, (const int64_t[]){ ino, (int64_t)a->seq });
	return rc;
}

/* Refusals that do_write_commit_seq() makes before it changes a row: the
 * item fails alone and the batch's transaction goes on. */
static int commit_refused_early(int rc)
{
	return rc == -EALREADY || rc == -ENOENT || rc == -EISDIR || rc == -EINVAL ||
	       rc == -EINPROGRESS;
}

struct commit_batch_args {
	struct meta_commit_item *items;
	size_t n;
	int journal_rc; /* of the journal's seq, read once per transaction: */
	int64_t journal; /* no other writer commits while it is open */
	bool journal_read;
};

/* The database holds less of the journal than seq (see meta.h). */
static bool journal_behind(struct conn *c, struct commit_batch_args *b, uint64_t seq)
{
	if (!b->journal_read) {
		b->journal_rc = query_int(c, ST_JOURNAL_GET, 0, NULL, 0, INT64_MAX, 0, &b->journal);
		b->journal_read = true;
	}
	/* No table: no journal was ever opened here; that seq is not ours. */
	return b->journal_rc == 0 ? (uint64_t)b->journal < seq : b->journal_rc != -EIO;
}

static int do_write_commit_batch(struct conn *c, void *p)
{
	struct commit_batch_args *b = p;

	b->journal_read = false; /* a retried transaction reads it again */
	for (size_t i = 0; i < b->n; i++) {
		struct meta_commit_item *it = &b->items[i];
		struct commit_seq_args a = { .commit = { .ino = it->ino, .slices = it->slices,
							 .n = it->n, .new_size = it->new_size,
							 .mtime = it->mtime },
					     .seq = it->seq, .meta_seq = it->meta_seq };
		int rc;

		if (it->seq == 0 || it->seq > INT64_MAX || it->meta_seq > INT64_MAX)
			rc = -EINVAL;
		else if (it->meta_seq > 0 && journal_behind(c, b, it->meta_seq))
			rc = -EINPROGRESS;
		else if ((rc = commit_args_check(c->m, &a.commit)) == 0)
			rc = do_write_commit_seq(c, &a);
		if (rc != 0 && !commit_refused_early(rc))
			return rc; /* the whole transaction goes */
		it->rc = rc;
		if (rc == 0)
			it->out = a.commit.out;
	}
	return 0;
}

int meta_write_commit_batch(struct meta *m, struct meta_commit_item *items, size_t n)
{
	struct commit_batch_args b = { .items = items, .n = n };
	int rc;

	if (m == NULL || (items == NULL && n > 0))
		return -EINVAL;
	if (n == 0)
		return 0;
	rc = meta_txn(m, do_write_commit_batch, &b);
	if (rc != 0)
		for (size_t i = 0; i < n; i++)
			items[i].rc = rc;
	return rc;
}

int meta_write_commit_seq(struct meta *m, uint64_t ino, uint64_t seq,
			  const struct meta_chunk_slice *slices, size_t n, uint64_t new_size,
			  const struct timespec *mtime, struct meta_attr *out)
{
	struct meta_commit_item it = { .ino = ino, .seq = seq, .slices = slices, .n = n,
				       .new_size = new_size, .mtime = mtime };
	int rc = meta_write_commit_batch(m, &it, 1);

	if (rc == 0)
		rc = it.rc;
	if (rc == 0 && out != NULL)
		*out = it.out;
	return rc;
}

static int do_seq_epoch(struct conn *c, void *p)
{
	int64_t *epoch = p;

	return query_int(c, ST_EPOCH_NEXT, 0, NULL, 1, INT32_MAX, 0, epoch);
}

static int do_seq_floor(struct conn *c, void *p)
{
	const int64_t *v = p;

	return run_ints(c, ST_SEQ_FLOOR, 2, v);
}

int meta_seq_floor(struct meta *m, uint64_t ino, uint64_t seq)
{
	int64_t v[2] = { (int64_t)ino, (int64_t)seq };

	if (m == NULL || seq == 0 || seq > INT64_MAX || !ino_ok(ino))
		return -EINVAL;
	return meta_txn(m, do_seq_floor, v);
}

int meta_seq_epoch(struct meta *m, uint64_t *epoch)
{
	int64_t e = 0;
	int rc;

	if (m == NULL || epoch == NULL)
		return -EINVAL;
	rc = meta_txn(m, do_seq_epoch, &e);
	if (rc == 0)
		*epoch = (uint64_t)e;
	return rc;
}

/* ---- the writer's lease ------------------------------------------------------ */

static int lease_read(struct conn *c, struct meta_lease *out)
{
	struct db_stmt *st = NULL;
	const void *h;
	size_t hn = 0;
	int64_t exp, epoch, now;
	int rc;

	rc = stmt(c, ST_LEASE_GET, &st);
	if (rc)
		return rc;
	rc = step(st);
	if (rc == 0)
		rc = -EIO; /* no lease row */
	if (rc < 0)
		goto out;
	h = col_blob(st, 0, &hn);
	if ((col_type(st, 0) != DB_TEXT && col_type(st, 0) != DB_BLOB) ||
	    hn > META_LEASE_HOLDER_MAX || (hn && memchr(h, '\0', hn)) ||
	    col_int(st, 1, INT64_MIN, INT64_MAX, &exp) || col_int(st, 2, 0, INT64_MAX, &epoch) ||
	    col_int(st, 3, INT64_MIN, INT64_MAX, &now)) {
		rc = -EIO;
		goto out;
	}
	memset(out, 0, sizeof(*out));
	if (hn)
		memcpy(out->holder, h, hn);
	out->expires_ms = exp;
	out->epoch = (uint64_t)epoch;
	out->now_ms = now;
	rc = 0;
out:
	stmt_done(st);
	return rc;
}

int meta_lease_get(struct meta *m, struct meta_lease *out)
{
	READ_CONN(c);
	int rc;

	if (m == NULL || out == NULL)
		return -EINVAL;
	rc = meta_read_conn(m, &c);
	if (rc == 0)
		rc = lease_read(c, out);
	return ro(rc);
}

struct lease_args {
	const char *holder;
	int64_t ttl_ms;
	int takeover;
	uint64_t mine;
	struct meta_lease cur;
	int64_t epoch;
};

static int do_lease_take(struct conn *c, void *p)
{
	struct lease_args *a = p;
	struct db_stmt *st = NULL;
	int rc = lease_read(c, &a->cur);

	if (rc)
		return rc;
	/* A holder whose lease has not ended is alive, or may be; one that
	 * ended without a release died, or was cut off, and is taken over
	 * only when asked (it may come back: then it is fenced). */
	if (a->cur.holder[0] != '\0' && !(a->mine != 0 && a->cur.epoch == a->mine) &&
	    (a->cur.expires_ms > a->cur.now_ms || !a->takeover))
		return -EBUSY;
	rc = stmt(c, ST_LEASE_TAKE, &st);
	if (rc)
		return rc;
	rc = st->drv->bind_text(st, 1, a->holder);
	if (rc == 0)
		rc = bind_i64(st, 2, a->ttl_ms);
	if (rc == 0)
		rc = bind_i64(st, 3, (int64_t)a->cur.epoch);
	if (rc == 0)
		rc = step(st);
	if (rc == 0)
		rc = -EIO; /* the row went away under the write lock */
	if (rc > 0)
		rc = col_int(st, 0, 1, INT64_MAX, &a->epoch);
	/* A RETURNING statement finishes its work only when run to the end. */
	if (rc == 0 && (rc = step(st)) > 0)
		rc = -EIO;
	stmt_done(st);
	return rc;
}

int meta_lease_take(struct meta *m, const char *holder, int64_t ttl_ms, int takeover,
		    uint64_t mine, struct meta_lease *cur)
{
	struct lease_args a = { .holder = holder, .ttl_ms = ttl_ms, .takeover = takeover,
				.mine = mine };
	int rc;

	if (m == NULL || holder == NULL || holder[0] == '\0' ||
	    strlen(holder) > META_LEASE_HOLDER_MAX || ttl_ms <= 0)
		return -EINVAL;
	atomic_store(&m->fence, 0); /* the take itself checks no older epoch */
	rc = meta_txn(m, do_lease_take, &a);
	if (cur != NULL)
		*cur = a.cur;
	if (rc)
		return rc;
	atomic_store(&m->fence, (uint64_t)a.epoch);
	/* Durable before the caller writes anything under it. */
	return meta_sync(m);
}

static int do_lease_renew(struct conn *c, void *p)
{
	const int64_t *v = p;
	int rc = run_ints(c, ST_LEASE_RENEW, 2, v);

	return rc == 0 && db_changes(c) != 1 ? -EROFS : rc;
}

int meta_lease_renew(struct meta *m, int64_t ttl_ms)
{
	int64_t v[2];

	if (m == NULL || ttl_ms <= 0 || atomic_load(&m->fence) == 0)
		return -EINVAL;
	v[0] = (int64_t)atomic_load(&m->fence);
	v[1] = ttl_ms;
	return meta_txn(m, do_lease_renew, v);
}

static int do_lease_release(struct conn *c, void *p)
{
	const int64_t *v = p;

	return run_ints(c, ST_LEASE_RELEASE, 1, v);
}

int meta_lease_release(struct meta *m)
{
	int64_t v;
	int rc;

	if (m == NULL || atomic_load(&m->fence) == 0)
		return -EINVAL;
	v = (int64_t)atomic_load(&m->fence);
	rc = meta_txn(m, do_lease_release, &v);
	if (rc == 0)
		rc = meta_sync(m);
	return rc == -EROFS ? 0 : rc; /* taken over: nothing of ours to free */
}

void meta_lease_fence(struct meta *m, uint64_t epoch)
{
	atomic_store(&m->fence, epoch);
}

uint64_t meta_lease_fenced_to(struct meta *m)
{
	return atomic_load(&m->fence);
}

uint64_t meta_reconnects(struct meta *m)
{
	return atomic_load(&m->reconnects);
}

void meta_counters(struct meta *m, uint64_t *statements, uint64_t *round_trips)
{
	*statements = atomic_load(&m->statements);
	*round_trips = atomic_load(&m->round_trips);
}

uint64_t meta_thread_statements(void)
{
	return meta_tl_statements;
}

struct punch_args {
	uint64_t ino, off, len;
	struct meta_attr out;
};

/* Zeroes chunk bytes [s, e) of chunk; whole = nothing of the chunk stays. */
static int punch_chunk(struct conn *c, uint64_t ino, uint32_t chunk, uint32_t s, uint32_t e,
		       int whole)
{
	if (whole)
		return slices_drop(c, ino, chunk, chunk);
	return zero_range(c, ino, chunk, s, e);
}

static int do_punch(struct conn *c, void *p)
{
	struct punch_args *a = p;
	struct meta_attr at;
	uint64_t end, c0, c1, k;
	int rc = 0;

	rc = inode_get(c, a->ino, &at);
	if (rc)
		return rc;
	if (S_ISDIR(at.mode))
		return -EISDIR;
	if (!S_ISREG(at.mode))
		return -EINVAL;
	end = a->off + a->len < at.size ? a->off + a->len : at.size;
	if (a->off < end) {
		c0 = a->off / META_CHUNK_SIZE;
		c1 = (end - 1) / META_CHUNK_SIZE;
		/* A chunk is dropped whole when the punch covers it from its start
		 * to its end or to the end of the file. */
		for (k = c0; k <= c1 && rc == 0; k = (k == c0 && c1 > c0 + 1) ? c1 : k + 1) {
			uint64_t base = k * META_CHUNK_SIZE;
			uint32_t s = (uint32_t)((a->off > base ? a->off : base) - base);
			uint64_t ce = end < base + META_CHUNK_SIZE ? end : base + META_CHUNK_SIZE;
			uint32_t e = (uint32_t)(ce - base);
			int whole = s == 0 && (e == META_CHUNK_SIZE || ce >= at.size);

			rc = punch_chunk(c, at.ino, (uint32_t)k, s, e, whole);
		}
		if (rc == 0 && c1 > c0 + 1)
			rc = slices_drop(c, at.ino, (int64_t)c0 + 1, (int64_t)c1 - 1);
		if (rc)
			return rc;
	}
	at.mtime = at.ctime = now_ts();
	rc = inode_put(c, &at);
	if (rc == 0)
		a->out = at;
	return rc;
}

int meta_punch_hole(struct meta *m, uint64_t ino, uint64_t off, uint64_t len,
		    struct meta_attr *out)
{
	struct punch_args a = { .ino = ino, .off = off, .len = len };
	int rc;

	if (m == NULL || len == 0 || off > UINT64_MAX - len)
		return -EINVAL;
	if (!ino_ok(ino))
		return -ENOENT;
	rc = meta_txn(m, do_punch, &a);
	if (rc == 0 && out != NULL)
		*out = a.out;
	return rc;
}

/* ---- unlinked inodes ---------------------------------------------------------- */

/* Frees ino if its link count is 0. 1: freed, 0: still linked. */
static int inode_free(struct conn *c, uint64_t ino)
{
	const int64_t v[1] = { (int64_t)ino };
	struct meta_attr at;
	int rc;

	rc = inode_get(c, ino, &at);
	if (rc)
		return rc;
	if (at.nlink > 0)
		return 0;
	/* Only a regular file has data and commit seqs, only a symlink a
	 * target: each statement that cannot match is spared (rm -rf runs
	 * this once per file). */
	if (S_ISREG(at.mode))
		rc = slices_drop(c, ino, 0, INT64_MAX);
	if (rc == 0)
		rc = run_ints(c, ST_XATTR_DELETE_ALL, 1, v);
	if (rc == 0 && S_ISLNK(at.mode))
		rc = run_ints(c, ST_SYMLINK_DELETE, 1, v);
	if (rc == 0)
		rc = run_ints(c, ST_INODE_DELETE, 1, v);
	if (rc == 0)
		hot_forget(c, ino); /* only once the row is gone */
	if (rc == 0)
		rc = run_ints(c, ST_ORPHAN_DELETE, 1, v);
	if (rc == 0 && S_ISREG(at.mode))
		rc = run_ints(c, ST_TIMES_SEQ_DELETE, 1, v);
	return rc ? rc : 1;
}

static int do_release(struct conn *c, void *p)
{
	int rc = inode_free(c, *(uint64_t *)p);

	return rc > 0 ? 0 : rc;
}

int meta_release_in_batch(struct meta *m, uint64_t ino)
{
	int rc = inode_free(m->bc, ino);

	return rc > 0 ? 0 : rc == -ENOENT ? 0 : rc;
}

int meta_inode_release(struct meta *m, uint64_t ino)
{
	if (m == NULL)
		return -EINVAL;
	if (!ino_ok(ino))
		return -ENOENT;
	struct mj_rec r = { .op = MJ_RELEASE, .v = { ino } };
	return meta_txn_rec(m, &r, NULL, do_release, &ino);
}

struct purge_args {
	uint64_t ino[PURGE_BATCH];
	size_t n;
	uint64_t freed;
};

static int do_purge(struct conn *c, void *p)
{
	struct purge_args *a = p;
	size_t i;
	int rc;

	a->freed = 0;
	for (i = 0; i < a->n; i++) {
		rc = inode_free(c, a->ino[i]);
		if (rc == 1) {
			a->freed++;
			continue;
		}
		/* Linked again or gone: the orphan row is stale. */
		if (rc == 0 || rc == -ENOENT)
			rc = run_ints(c, ST_ORPHAN_DELETE, 1, (int64_t[]){ (int64_t)a->ino[i] });
		if (rc)
			return rc;
	}
	return 0;
}

int meta_orphans_purge(struct meta *m, uint64_t *count)
{
	struct purge_args a;
	struct db_stmt *st = NULL;
	uint64_t total = 0, after = 0;
	struct conn *c;
	int64_t v;
	int rc;

	if (m == NULL)
		return -EINVAL;
	rc = meta_conn_get(m, &c);
	if (rc)
		return rc;
	for (;;) {
		a.n = 0;
		rc = stmt(c, ST_ORPHAN_LIST, &st);
		if (rc)
			break;
		if (bind_i64(st, 1, (int64_t)after) || bind_i64(st, 2, PURGE_BATCH)) {
			rc = -EIO;
			stmt_done(st);
			break;
		}
		while ((rc = step(st)) > 0) {
			if (col_int(st, 0, 1, INT64_MAX, &v) || a.n >= PURGE_BATCH) {
				rc = -EIO;
				break;
			}
			a.ino[a.n++] = (uint64_t)v;
		}
		stmt_done(st);
		if (rc || a.n == 0)
			break;
		after = a.ino[a.n - 1];
		rc = meta_txn(m, do_purge, &a);
		if (rc)
			break;
		total += a.freed;
	}
	if (count != NULL)
		*count = total;
	return ro(rc);
}

/* ---- the journal: replay, open, flush ------------------------------------ */

/* A record's string as a C string (names and targets hold no NUL). */
static int rec_str(const struct mj_rec *r, int i, char *buf, size_t cap)
{
	if (r->slen[i] >= cap || (r->slen[i] && memchr(r->s[i], '\0', r->slen[i]) != NULL))
		return -EINVAL;
	if (r->slen[i])
		memcpy(buf, r->s[i], r->slen[i]);
	buf[r->slen[i]] = '\0';
	return 0;
}

/* Makes r's change again in the batch (write_lock held, meta_tl_replaying set). */
int meta_replay_one(struct meta *m, const struct mj_rec *r)
{
	char name[SYMLINK_MAX + 1], name2[SYMLINK_MAX + 1];
	int rc;

	rc = rec_str(r, 0, name, META_NAME_MAX + 1);
	if (rc == 0 && r->op != MJ_SETXATTR)
		rc = rec_str(r, 1, name2, sizeof(name2));
	if (rc)
		return rc;
	switch (r->op) {
	case MJ_CREATE: {
		struct create_args a = { .parent = r->v[0], .name = name, .nlen = r->slen[0],
					 .mode = (uint32_t)r->v[1], .uid = (uint32_t)r->v[2],
					 .gid = (uint32_t)r->v[3], .rdev = r->v[4],
					 .target = r->slen[1] ? name2 : NULL, .tlen = r->slen[1],
					 .want_ino = r->v[J_RESULT] };
		rc = meta_batch_run(m, NULL, NULL, do_create, &a);
		/* The same state and the same changes give the same inode; if
		 * not, later records name the wrong one. */
		if (rc == 0 && a.out.ino != r->v[J_RESULT])
			rc = -ESTALE;
		return rc;
	}
	case MJ_LINK: {
		struct link_args a = { .ino = r->v[0], .parent = r->v[1], .name = name,
				       .nlen = r->slen[0] };
		return meta_batch_run(m, NULL, NULL, do_link, &a);
	}
	case MJ_UNLINK:
	case MJ_RMDIR: {
		struct remove_args a = { .parent = r->v[0], .name = name, .nlen = r->slen[0],
					 .dir = r->op == MJ_RMDIR };
		return meta_batch_run(m, NULL, NULL, do_remove, &a);
	}
	case MJ_RENAME: {
		struct rename_args a = { .parent = r->v[0], .newparent = r->v[1], .name = name,
					 .newname = name2, .nlen = r->slen[0],
					 .newnlen = r->slen[1], .flags = (unsigned)r->v[2] };
		return meta_batch_run(m, NULL, NULL, do_rename, &a);
	}
	case MJ_SETATTR: {
		struct meta_attr in = { .mode = (uint32_t)r->v[2], .uid = (uint32_t)r->v[3],
					.gid = (uint32_t)r->v[4], .size = r->v[5],
					.atime = { (time_t)r->v[6], (long)r->v[7] },
					.mtime = { (time_t)r->v[8], (long)r->v[9] },
					.ctime = { (time_t)r->v[10], (long)r->v[11] } };
		struct setattr_args a = { .ino = r->v[0], .valid = (unsigned)r->v[1], .in = &in };
		if ((a.valid & ~META_SET_ALL) || !ts_valid(&in.atime) || !ts_valid(&in.mtime) ||
		    !ts_valid(&in.ctime))
			return -EINVAL;
		return meta_batch_run(m, NULL, NULL, do_setattr, &a);
	}
	case MJ_SETXATTR:
	case MJ_REMOVEXATTR: {
		struct xattr_args a = { .ino = r->v[0], .name = name, .nlen = r->slen[0],
					.flags = (int)r->v[1], .remove = r->op == MJ_REMOVEXATTR };
		if (r->op == MJ_SETXATTR) {
			if (r->slen[1] > META_XATTR_SIZE_MAX)
				return -EINVAL;
			a.value = r->s[1];
			a.size = r->slen[1];
		}
		return meta_batch_run(m, NULL, NULL, do_xattr, &a);
	}
	case MJ_RELEASE: {
		uint64_t ino = r->v[0];
		return meta_batch_run(m, NULL, NULL, do_release, &ino);
	}
	}
	return -EINVAL;
}

