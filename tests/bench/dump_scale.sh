#!/usr/bin/env bash
# ferry dump and ferry load at scale: a volume of --inodes files (default
# 1,000,000; 1,000 directories under the root, each file with one slice)
# is made straight in its SQLite file, dumped, loaded into a new volume and
# dumped again; prints the time and peak RSS of each step and checks that
# the two dumps are the same. With --pg the first dump also goes into a
# PostgreSQL volume (the server of $FERRY_TEST_PG_URL, or a private one of
# scripts/pg-server), is dumped from there, and that dump is loaded back
# into SQLite and dumped: all the same past their headers.
#
#   tests/bench/dump_scale.sh [--inodes N] [--pg] [--workdir DIR] [--build-dir DIR]
set -euo pipefail

top=$(cd "$(dirname "$0")/../.." && pwd)
inodes=1000000 workdir=/var/tmp build=$top/build pg=0
while [[ $# -gt 0 ]]; do
  case $1 in
    --inodes) inodes=${2:?}; shift ;;
    --pg) pg=1 ;;
    --workdir) workdir=${2:?}; shift ;;
    --build-dir) build=${2:?}; shift ;;
    -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "dump_scale.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
ferry=$build/bin/ferry
[[ -x $ferry ]] || { echo "dump_scale.sh: no $ferry (build first)" >&2; exit 2; }
command -v sqlite3 >/dev/null || { echo "dump_scale.sh: needs sqlite3 (scripts/bootstrap)" >&2; exit 2; }
root=$(mktemp -d "$workdir/ferry-dumpscale.XXXXXX")
pg_own=
cleanup() {
  [[ -n $pg_own ]] && "$top/scripts/pg-server" stop "$pg_own" >/dev/null 2>&1
  rm -rf "$root"
}
trap cleanup EXIT
if [[ $pg = 1 && -z ${FERRY_TEST_PG_URL:-} ]]; then
  pg_own=$root/pg
  chmod o+x "$root" # the server runs as postgres
  mkdir "$pg_own"
  eval "$("$top/scripts/pg-server" start "$pg_own")"
fi

"$ferry" format "$root/vol" >/dev/null
last=$((inodes + 1))
dirs=$(( inodes < 1000 ? inodes : 1000 ))
sqlite3 "$root/vol/meta.db" "BEGIN;
WITH RECURSIVE n(i) AS (SELECT 2 UNION ALL SELECT i + 1 FROM n WHERE i < $last)
  INSERT INTO inode SELECT i, 33188, 0, 0, 0, 1, 4096, 1, 0, 1, 0, 1, 0 FROM n;
UPDATE inode SET mode = 16877, nlink = 2, size = 0 WHERE ino BETWEEN 2 AND $((dirs + 1));
UPDATE inode SET nlink = $((dirs + 2)) WHERE ino = 1;
INSERT INTO dentry SELECT CASE WHEN ino <= $((dirs + 1)) THEN 1 ELSE 2 + ino % $dirs END,
  CAST('f' || ino AS BLOB), ino, ino FROM inode WHERE ino > 1;
INSERT INTO slice(ino, chunk, id, size, off, pos, len)
  SELECT ino, 0, ino, 4096, 0, 0, 4096 FROM inode WHERE ino > $((dirs + 1));
UPDATE counters SET next_ino = $((last + 1)), next_slice = $((last + 1)), next_cookie = $((last + 1));
COMMIT;"

step() { # label command...
  local label=$1 t
  shift
  /usr/bin/time -o "$root/time" -f '%e %M' "$@" >/dev/null 2>"$root/err" ||
    { cat "$root/err" >&2; echo "dump_scale.sh: $label failed" >&2; exit 1; }
  t=$(tail -n 1 "$root/time")
  printf '  %-22s %8s s  %8s MiB peak RSS\n' "$label" "${t% *}" "$(( ${t#* } / 1024 ))"
}
echo "ferry dump/load: $inodes inodes in $dirs directories, one slice per file; commit $(git -C "$top" rev-parse --short HEAD 2>/dev/null || echo '?')"
step "dump" "$ferry" dump "$root/vol" "$root/d1.jsonl"
step "load" "$ferry" load "$root/d1.jsonl" "$root/vol2"
step "dump of the loaded" "$ferry" dump "$root/vol2" "$root/d2.jsonl"
echo "  stream: $(wc -l < "$root/d1.jsonl") lines, $(( $(stat -c %s "$root/d1.jsonl") / 1048576 )) MiB"
cmp -s "$root/d1.jsonl" "$root/d2.jsonl" || { echo "dump_scale.sh: the loaded volume dumps differently" >&2; exit 1; }
echo "  the two dumps are the same"
if [[ $pg = 1 ]]; then
  vol="dumpscale_$$"
  url="$FERRY_TEST_PG_URL&volume=$vol"
  export FERRY_STATE_DIR=$root/state
  step "load into PostgreSQL" "$ferry" load "$root/d1.jsonl" "$url"
  step "dump of PostgreSQL" "$ferry" dump "$url" "$root/d3.jsonl"
  step "load back into SQLite" "$ferry" load "$root/d3.jsonl" "$root/vol3"
  step "dump of that" "$ferry" dump "$root/vol3" "$root/d4.jsonl"
  psql "$FERRY_TEST_PG_URL" -qc "SET client_min_messages = warning; DROP SCHEMA ferry_$vol CASCADE" >/dev/null || true
  cmp -s <(tail -n +2 "$root/d1.jsonl") <(tail -n +2 "$root/d3.jsonl") ||
    { echo "dump_scale.sh: the PostgreSQL volume dumps differently" >&2; exit 1; }
  cmp -s "$root/d1.jsonl" "$root/d4.jsonl" ||
    { echo "dump_scale.sh: SQLite -> PostgreSQL -> SQLite dumps differently" >&2; exit 1; }
  echo "  SQLite -> PostgreSQL -> SQLite: the dumps are the same (past the engine's header)"
fi
