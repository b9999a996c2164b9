#!/usr/bin/env bash
# The metadata engines side by side (issue 12's benchmark): the same
# small-file and namespace workload on a volume whose metadata is SQLite and
# on one whose metadata is a PostgreSQL server on the same machine
# (scripts/pg-server: a Unix socket, the server's own defaults), in one run.
# Objects go to a file:// store in the work directory for both.
#
#   create   N files of 2 KiB in one directory (open, write, close), in
#            ROUNDS rounds taking turns between the engines, each after
#            the uploads of the one before were drained (both mounted at
#            once, so that a slow moment of the machine falls on either);
#            the median round counts
#   stat     each of them, after a remount (the kernel forgets every entry)
#   readdir  of the directory, after a remount
#   rename   each of them within the directory
#   unlink   each of them
#
# Prints each phase's time per engine and the ratio PostgreSQL / SQLite,
# and per FUSE request of each phase the SQL statements the engine ran and
# (PostgreSQL) the exchanges with the server. Issue 12's target: PostgreSQL
# within 1.5x of SQLite on the create loop.
#
#   tests/bench/pg_meta.sh [--files N] [--rounds R] [--workdir DIR] [--build-dir DIR]
#
# Needs root (FUSE mounts; the server runs as the postgres user).
set -euo pipefail

top=$(cd "$(dirname "$0")/../.." && pwd)
files=10000 rounds=3 workdir=/var/tmp build=$top/build
while [[ $# -gt 0 ]]; do
  case $1 in
    --files) files=${2:?}; shift ;;
    --rounds) rounds=${2:?}; shift ;;
    --workdir) workdir=${2:?}; shift ;;
    --build-dir) build=${2:?}; shift ;;
    -h|--help) sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "pg_meta.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
[[ $(id -u) -eq 0 ]] || { echo "pg_meta.sh: needs root" >&2; exit 2; }
ferry=$build/bin/ferry
[[ -x $ferry ]] || { echo "pg_meta.sh: no $ferry (build first)" >&2; exit 2; }

work=$(mktemp -d "$workdir/ferry-pgbench.XXXXXX")
pg_started=0
cleanup() {
  for m in "$work"/mnt-*; do
    mountpoint -q "$m" 2>/dev/null && { "$ferry" umount "$m" >/dev/null 2>&1 || umount -l "$m"; }
  done
  [[ $pg_started = 1 ]] && "$top/scripts/pg-server" stop "$work" >/dev/null 2>&1
  rm -rf "$work"
}
trap cleanup EXIT
eval "$("$top/scripts/pg-server" start "$work")"
pg_started=1
export FERRY_STATE_DIR=$work/state

declare -A vol
vol[sqlite]=$work/vol-sqlite
vol[postgresql]="$FERRY_TEST_PG_URL&volume=bench"
mkdir -p "$work/objects-sqlite" "$work/objects-postgresql"
"$ferry" format --storage "file://$work/objects-sqlite" "${vol[sqlite]}" >/dev/null
"$ferry" format --storage "file://$work/objects-postgresql" "${vol[postgresql]}" >/dev/null

# The sum of every fuse_requests_* figure, and one figure, of a mount.
requests() { awk '/^fuse_requests_/ {n += $2} END {print n + 0}' "$1/.stats"; }
figure() { awk -v k="$2" '$1 == k {print $2}' "$1/.stats"; }

phase() { # phase ENGINE MNT NAME PYTHON-BODY [DIR]: runs and records time and counts
  local engine=$1 mnt=$2 name=$3 body=$4 dir=${5:-d} r0 s0 t0 r1 s1 t1 secs
  r0=$(requests "$mnt") s0=$(figure "$mnt" meta_statements) t0=$(figure "$mnt" meta_round_trips)
  secs=$(python3 - "$mnt/$dir" "$files" <<EOF
import os, sys, time
d, n = sys.argv[1], int(sys.argv[2])
t = time.monotonic()
$body
print("%.3f" % (time.monotonic() - t))
EOF
)
  r1=$(requests "$mnt") s1=$(figure "$mnt" meta_statements) t1=$(figure "$mnt" meta_round_trips)
  res_time[$engine,$name]=$secs
  res_sql[$engine,$name]=$(awk -v a=$((s1 - s0)) -v b=$((r1 - r0)) 'BEGIN {printf "%.2f", b ? a / b : 0}')
  res_rt[$engine,$name]=$(awk -v a=$((t1 - t0)) -v b=$((r1 - r0)) 'BEGIN {printf "%.2f", b ? a / b : 0}')
}

declare -A res_time res_sql res_rt
phases=(create stat readdir rename unlink)
engines=(sqlite postgresql)
for engine in "${engines[@]}"; do
  mkdir -p "$work/mnt-$engine"
  "$ferry" mount "${vol[$engine]}" "$work/mnt-$engine" >/dev/null
done
# The create rounds: d is the first round's directory, the one the other
# phases use; the statements and round trips are the first round's.
declare -A round_times first_sql first_rt
for ((r = 1; r <= rounds; r++)); do
  for engine in "${engines[@]}"; do
    mnt=$work/mnt-$engine dir=d
    [[ $r -gt 1 ]] && dir=d$r
    mkdir "$mnt/$dir"
    phase $engine "$mnt" create '
buf = b"x" * 2048
for i in range(n):
    fd = os.open("%s/f%06d" % (d, i), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    os.write(fd, buf)
    os.close(fd)' "$dir"
    round_times[$engine]+="${res_time[$engine,create]} "
    [[ $r = 1 ]] && first_sql[$engine]=${res_sql[$engine,create]} first_rt[$engine]=${res_rt[$engine,create]}
    "$ferry" drain "$mnt" >/dev/null
  done
done
for engine in "${engines[@]}"; do
  res_time[$engine,create]=$(printf '%s\n' ${round_times[$engine]} | sort -n | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}')
  res_sql[$engine,create]=${first_sql[$engine]} res_rt[$engine,create]=${first_rt[$engine]}
done
for engine in "${engines[@]}"; do
  mnt=$work/mnt-$engine
  "$ferry" umount "$mnt" >/dev/null && "$ferry" mount "${vol[$engine]}" "$mnt" >/dev/null
  phase $engine "$mnt" stat '
for i in range(n):
    os.stat("%s/f%06d" % (d, i))'
  "$ferry" umount "$mnt" >/dev/null && "$ferry" mount "${vol[$engine]}" "$mnt" >/dev/null
  phase $engine "$mnt" readdir '
k = sum(1 for _ in os.scandir(d))
assert k == n, k'
  phase $engine "$mnt" rename '
for i in range(n):
    os.rename("%s/f%06d" % (d, i), "%s/g%06d" % (d, i))'
  phase $engine "$mnt" unlink '
for i in range(n):
    os.unlink("%s/g%06d" % (d, i))'
  "$ferry" umount "$mnt" >/dev/null
done

printf '\ncreate rounds (s): SQLite %s / PostgreSQL %s\n' "${round_times[sqlite]}" "${round_times[postgresql]}"
printf '\n%d files, one directory; metadata: SQLite (a file in %s) and PostgreSQL %s (Unix socket)\n\n' \
  "$files" "$workdir" "$(find /usr/lib/postgresql -mindepth 1 -maxdepth 1 -printf '%f\n' | sort -V | tail -n 1)"
printf '%-8s %10s %10s %7s   %-22s %-22s\n' phase "SQLite s" "PG s" "PG/SQL" \
  "SQL stmts/request" "PG round trips/request"
for p in "${phases[@]}"; do
  printf '%-8s %10s %10s %7s   %-22s %-22s\n' "$p" "${res_time[sqlite,$p]}" "${res_time[postgresql,$p]}" \
    "$(awk -v a="${res_time[postgresql,$p]}" -v b="${res_time[sqlite,$p]}" 'BEGIN {printf "%.2fx", (b > 0 ? a / b : 0)}')" \
    "${res_sql[sqlite,$p]} / ${res_sql[postgresql,$p]}" "${res_rt[postgresql,$p]}"
done
