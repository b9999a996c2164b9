#!/usr/bin/env bash
# ferry dump and ferry load at scale: a volume of --inodes files (default
# 1,000,000; 1,000 directories under the root, each file with one slice)
# is made straight in its SQLite file, dumped, loaded into a new volume and
# dumped again; prints the time and peak RSS of each step and checks that
# the two dumps are the same.
#
#   tests/bench/dump_scale.sh [--inodes N] [--workdir DIR] [--build-dir DIR]
set -euo pipefail

top=$(cd "$(dirname "$0")/../.." && pwd)
inodes=1000000 workdir=/var/tmp build=$top/build
while [[ $# -gt 0 ]]; do
  case $1 in
    --inodes) inodes=${2:?}; shift ;;
    --workdir) workdir=${2:?}; shift ;;
    --build-dir) build=${2:?}; shift ;;
    -h|--help) sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "dump_scale.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
ferry=$build/bin/ferry
[[ -x $ferry ]] || { echo "dump_scale.sh: no $ferry (build first)" >&2; exit 2; }
command -v sqlite3 >/dev/null || { echo "dump_scale.sh: needs sqlite3 (scripts/bootstrap)" >&2; exit 2; }
root=$(mktemp -d "$workdir/ferry-dumpscale.XXXXXX")
trap 'rm -rf "$root"' EXIT

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
