/*
 * meta_sql: the metadata engine's statements, each once, in SQL that SQLite
 * and PostgreSQL both run (see meta_db.h). Parameters are ?N; the second
 * string gives their types.
 */
#include "meta_db.h"

#include <stdlib.h>
#include <string.h>

#define INODE_COLS                                                                                 \
	"ino, mode, uid, gid, rdev, nlink, size, atime_sec, atime_nsec, mtime_sec, "               \
	"mtime_nsec,"                                                                              \
	" ctime_sec, ctime_nsec"
#define INODE_COLS_I                                                                               \
	"i.ino, i.mode, i.uid, i.gid, i.rdev, i.nlink, i.size, i.atime_sec, "                      \
	"i.atime_nsec,"                                                                            \
	" i.mtime_sec, i.mtime_nsec, i.ctime_sec, i.ctime_nsec"

const struct meta_sql meta_sql[ST_COUNT] = {
	[ST_BEGIN] = { "BEGIN", "" },
	[ST_COMMIT] = { "COMMIT", "" },
	[ST_ROLLBACK] = { "ROLLBACK", "" },
	[ST_SAVEPOINT] = { "SAVEPOINT j", "" },
	[ST_SAVEPOINT_RELEASE] = { "RELEASE j", "" },
	[ST_SAVEPOINT_ROLLBACK] = { "ROLLBACK TO j", "" },
	[ST_JOURNAL_GET] = { "SELECT seq FROM journal WHERE id = 1", "" },
	[ST_JOURNAL_PUT] = { "UPDATE journal SET seq = ?1 WHERE id = 1", "i" },
	[ST_GETATTR] = { "SELECT " INODE_COLS " FROM inode WHERE ino = ?1", "i" },
	[ST_LOOKUP] = { "SELECT d.ino, " INODE_COLS_I " FROM dentry d LEFT JOIN inode i"
			" ON i.ino = d.ino WHERE d.parent = ?1 AND d.name = ?2",
			"ib" },
	[ST_INODE_INSERT] = { "INSERT INTO inode(" INODE_COLS ") VALUES"
			      " (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)",
			      "iiiiiiiiiiiii" },
	[ST_INODE_UPDATE] = { "UPDATE inode SET mode = ?2, uid = ?3, gid = ?4, rdev = ?5,"
			      " nlink = ?6, size = ?7, atime_sec = ?8, atime_nsec = ?9,"
			      " mtime_sec = ?10, mtime_nsec = ?11, ctime_sec = ?12,"
			      " ctime_nsec = ?13 WHERE ino = ?1",
			      "iiiiiiiiiiiii" },
	[ST_INODE_DELETE] = { "DELETE FROM inode WHERE ino = ?1", "i" },
	[ST_DENTRY_GET] = { "SELECT ino FROM dentry WHERE parent = ?1 AND name = ?2", "ib" },
	/* Taken (parent, name): no row changed (an error would abort a
	 * PostgreSQL transaction). */
	[ST_DENTRY_INSERT] = { "INSERT INTO dentry(parent, name, ino, cookie)"
			       " VALUES (?1, ?2, ?3, ?4) ON CONFLICT(parent, name) DO NOTHING",
			       "ibii" },
	[ST_DENTRY_DELETE] = { "DELETE FROM dentry WHERE parent = ?1 AND name = ?2", "ib" },
	[ST_DENTRY_MOVE] = { "UPDATE dentry SET parent = ?3, name = ?4"
			     " WHERE parent = ?1 AND name = ?2",
			     "ibib" },
	[ST_DENTRY_SETINO] = { "UPDATE dentry SET ino = ?3 WHERE parent = ?1 AND name = ?2",
			       "ibi" },
	[ST_DENTRY_PARENT] = { "SELECT parent FROM dentry WHERE ino = ?1 LIMIT 1", "i" },
	[ST_DIR_HAS_CHILD] = { "SELECT 1 FROM dentry WHERE parent = ?1 LIMIT 1", "i" },
	[ST_READDIR] = { "SELECT d.name, d.cookie, d.ino, " INODE_COLS_I " FROM dentry d"
			 " LEFT JOIN inode i ON i.ino = d.ino WHERE d.parent = ?1"
			 " AND d.cookie > ?2 ORDER BY d.cookie LIMIT ?3",
			 "iii" },
	[ST_NEXT_INO] = { "UPDATE counters SET next_ino = next_ino + 1,"
			  " next_cookie = next_cookie + 1 WHERE id = 1"
			  " RETURNING next_ino - 1, next_cookie - 1",
			  "" },
	[ST_NEXT_COOKIE] = { "UPDATE counters SET next_cookie = next_cookie + 1 WHERE id = 1"
			     " RETURNING next_cookie - 1",
			     "" },
	[ST_COUNTERS_GET] = { "SELECT next_ino, next_cookie FROM counters WHERE id = 1", "" },
	[ST_COUNTERS_PUT] = { "UPDATE counters SET next_ino = ?1, next_cookie = ?2 WHERE id = 1",
			      "ii" },
	[ST_NEXT_SLICE] = { "UPDATE counters SET next_slice = next_slice + ?1 WHERE id = 1"
			    " AND next_slice >= 1 AND next_slice <= 9223372036854775807 - ?1"
			    " RETURNING next_slice - ?1",
			    "i" },
	[ST_SYMLINK_INSERT] = { "INSERT INTO symlink(ino, target) VALUES (?1, ?2)", "ib" },
	[ST_SYMLINK_GET] = { "SELECT target FROM symlink WHERE ino = ?1", "i" },
	[ST_SYMLINK_DELETE] = { "DELETE FROM symlink WHERE ino = ?1", "i" },
	[ST_ORPHAN_ADD] = { "INSERT INTO orphan(ino) VALUES (?1) ON CONFLICT(ino) DO NOTHING",
			    "i" },
	[ST_ORPHAN_DELETE] = { "DELETE FROM orphan WHERE ino = ?1", "i" },
	[ST_ORPHAN_LIST] = { "SELECT ino FROM orphan WHERE ino > ?1 ORDER BY ino LIMIT ?2", "ii" },
	[ST_XATTR_GET] = { "SELECT value FROM xattr WHERE ino = ?1 AND name = ?2", "ib" },
	[ST_XATTR_PUT] = { "INSERT INTO xattr(ino, name, value) VALUES (?1, ?2, ?3)"
			   " ON CONFLICT(ino, name) DO UPDATE SET value = excluded.value",
			   "ibb" },
	[ST_XATTR_DELETE] = { "DELETE FROM xattr WHERE ino = ?1 AND name = ?2", "ib" },
	[ST_XATTR_LIST] = { "SELECT name FROM xattr WHERE ino = ?1 ORDER BY name", "i" },
	[ST_XATTR_DELETE_ALL] = { "DELETE FROM xattr WHERE ino = ?1", "i" },
	[ST_SLICE_LIST] = { "SELECT id, size, off, pos, len FROM slice"
			    " WHERE ino = ?1 AND chunk = ?2 ORDER BY seq",
			    "ii" },
	[ST_SLICE_INSERT] = { "INSERT INTO slice(ino, chunk, id, size, off, pos, len)"
			      " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
			      "iiiiiii" },
	/* Slices of chunks [?2, ?3] of ?1 that no other row references, freed
	 * at ?4 (unix s). */
	[ST_SLICE_GC] = { "INSERT INTO gc_slice(id, size, since)"
			  " SELECT s.id, MAX(s.size), ?4"
			  " FROM slice s WHERE s.ino = ?1 AND s.chunk BETWEEN ?2 AND ?3"
			  " AND s.id <> 0 AND NOT EXISTS (SELECT 1 FROM slice t WHERE t.id = "
			  "s.id"
			  " AND NOT (t.ino = ?1 AND t.chunk BETWEEN ?2 AND ?3)) GROUP BY s.id"
			  " ON CONFLICT(id) DO NOTHING",
			  "iiii" },
	[ST_SLICE_DROP] = { "DELETE FROM slice WHERE ino = ?1 AND chunk BETWEEN ?2 AND ?3", "iii" },
	[ST_STATFS] = { "SELECT (SELECT CAST(COALESCE(SUM(size), 0) AS BIGINT) FROM inode"
			" WHERE (mode & 61440) = 32768), (SELECT COUNT(*) FROM inode)",
			"" },
	[ST_VOLUME_GET] = { "SELECT uuid, block_size, storage_url, created_at, s3_http"
			    " FROM volume WHERE id = 1",
			    "" },
	[ST_VOLUME_INSERT] = { "INSERT INTO volume(id, uuid, block_size, storage_url, created_at,"
			       " s3_http) VALUES (1, ?1, ?2, ?3, ?4, ?5)",
			       "titii" },
	[ST_COUNTERS_INSERT] = { "INSERT INTO counters(id, next_ino, next_slice, next_cookie)"
				 " VALUES (1, 2, 1, 1)",
				 "" },
	/* A data commit's two checks in one exchange (NULL: no row). */
	[ST_SEQS_GET] = { "SELECT (SELECT seq FROM commit_seq WHERE ino = ?1),"
			  " (SELECT seq FROM times_seq WHERE ino = ?1)", "i" },
	[ST_TIMES_SEQ_PUT] = { "INSERT INTO times_seq(ino, seq) VALUES (?1, ?2)"
			       " ON CONFLICT(ino) DO UPDATE SET seq = excluded.seq",
			       "ii" },
	[ST_TIMES_SEQ_DELETE] = { "DELETE FROM times_seq WHERE ino = ?1", "i" },
	[ST_SEQ_PUT] = { "INSERT INTO commit_seq(ino, seq) VALUES (?1, ?2)"
			 " ON CONFLICT(ino) DO UPDATE SET seq = excluded.seq",
			 "ii" },
	[ST_SEQ_FLOOR] = { "INSERT INTO commit_seq(ino, seq) VALUES (?1, ?2) ON CONFLICT(ino)"
			   " DO UPDATE SET seq = excluded.seq WHERE excluded.seq > "
			   "commit_seq.seq",
			   "ii" },
	[ST_EPOCH_NEXT] = { "INSERT INTO seq_epoch(id, epoch) VALUES (1, 1) ON CONFLICT(id)"
			    " DO UPDATE SET epoch = seq_epoch.epoch + 1 RETURNING epoch",
			    "" },
	[ST_SLICE_LIST_SEQ] = { "SELECT seq, id, size, off, pos, len FROM slice"
				" WHERE ino = ?1 AND chunk = ?2 ORDER BY seq",
				"ii" },
	[ST_SLICE_DELETE_SEQ] = { "DELETE FROM slice WHERE seq = ?1", "i" },
	/* Slice ?1 (of ?2 bytes) if no row references it any more, freed at
	 * ?3 (unix s). */
	[ST_GC_ADD_UNREF] = { "INSERT INTO gc_slice(id, size, since) SELECT ?1, ?2, ?3"
			      " WHERE ?1 <> 0 AND NOT EXISTS (SELECT 1 FROM slice WHERE id = ?1)"
			      " ON CONFLICT(id) DO NOTHING",
			      "iii" },
	/* A slice a kept checkpoint names is not garbage yet. */
	[ST_GC_LIST] = { "SELECT id, size FROM gc_slice WHERE seen <= ?1 AND since <= ?2"
			 " AND NOT EXISTS (SELECT 1 FROM checkpoint_slice c WHERE c.id = gc_slice.id)"
			 " ORDER BY seen, id LIMIT ?3",
			 "iii" },
	[ST_GC_FORGET] = { "DELETE FROM gc_slice WHERE id = ?1", "i" },
	[ST_GC_PENDING] = { "SELECT COUNT(*), CAST(COALESCE(SUM(size), 0) AS "
			    "BIGINT) FROM gc_slice",
			    "" },
	[ST_GC_MARK] = { "UPDATE gc_slice SET seen = ?1 WHERE seen IS NULL", "i" },
	[ST_GC_LAST_MARK] = { "SELECT COALESCE(MAX(seen), 0) FROM gc_slice", "" },
	/* The writer's lease: times on the database's own clock, so that the
	 * nodes' clocks need not agree. */
	[ST_LEASE_GET] = { "SELECT holder, expires_ms, epoch, " META_SQL_NOW_MS
			   " FROM lease WHERE id = 1",
			   "" },
	[ST_LEASE_TAKE] = { "UPDATE lease SET holder = ?1, expires_ms = " META_SQL_NOW_MS " + ?2,"
			    " epoch = epoch + 1 WHERE id = 1 AND epoch = ?3 RETURNING epoch",
			    "tii" },
	[ST_LEASE_RENEW] = { "UPDATE lease SET expires_ms = " META_SQL_NOW_MS " + ?2"
			     " WHERE id = 1 AND epoch = ?1",
			     "ii" },
	[ST_LEASE_RELEASE] = { "UPDATE lease SET holder = '', expires_ms = 0"
			       " WHERE id = 1 AND epoch = ?1",
			       "i" },
	[ST_LEASE_EPOCH] = { "SELECT epoch FROM lease WHERE id = 1", "" },
};

char *meta_sql_expand(const char *sql, const char *now_ms, char param_mark)
{
	size_t tok = strlen(META_SQL_NOW_MS), n = 1;
	char *out, *o;

	for (const char *p = sql; *p; p++, n++)
		if (strncmp(p, META_SQL_NOW_MS, tok) == 0)
			n += strlen(now_ms);
	out = malloc(n);
	if (out == NULL)
		return NULL;
	o = out;
	for (const char *p = sql; *p;) {
		if (strncmp(p, META_SQL_NOW_MS, tok) == 0) {
			o = stpcpy(o, now_ms);
			p += tok;
		} else {
			*o++ = *p == '?' ? param_mark : *p;
			p++;
		}
	}
	*o = '\0';
	return out;
}
