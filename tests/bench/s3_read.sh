#!/usr/bin/env bash
# Issue 11's S3 sequential-read target: a cold sequential read of one file
# through ferryfs (an empty read cache) beside a raw parallel GET of the
# same objects from the same local S3 server (scripts/s3-server), in one
# run. Raw GETs are one curl process with --parallel-max 1, 4 and 8 (SigV4,
# bodies to /dev/null: the most a client could take from this server; the
# ratio is against the faster of 4 and 8 at a time), and 8 at a time with
# each body written to a file (what a client that keeps the bytes gets);
# ferryfs reads with dd bs=1M to /dev/null from a fresh mount with an empty
# read cache, with -o readahead=0 and with its default (the bytes are
# checked after, untimed). Both with the server's files cold (dropped from
# the page cache first) and warm (just read). The parallel GETs and
# ferryfs's default take turns for --rounds rounds (default 3), and the
# table shows medians: the server is one node process on a 2-core machine
# that ferry-mountd shares, and one read of each swung by 20-30% from run
# to run.
#
#   tests/bench/s3_read.sh [--size-mib N] [--rounds R] [--build-dir DIR]
#
# Needs root (FUSE mount), curl and the bootstrap's s3rver.
set -euo pipefail

top=$(cd "$(dirname "$0")/../.." && pwd)
size_mib=256 rounds=3 build=$top/build
while [[ $# -gt 0 ]]; do
  case $1 in
    --size-mib) size_mib=${2:?}; shift ;;
    --rounds) rounds=${2:?}; shift ;;
    --build-dir) build=${2:?}; shift ;;
    -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "s3_read.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
[[ $(id -u) -eq 0 ]] || { echo "s3_read.sh: needs root" >&2; exit 2; }
ferry=$build/bin/ferry
[[ -x $ferry ]] || { echo "s3_read.sh: no $ferry (build first)" >&2; exit 2; }

# shellcheck source=tests/bench/s3_scratch.sh
. "$top/tests/bench/s3_scratch.sh"
s3_scratch /tmp ferry-s3read
url="s3://$FERRY_TEST_S3_HOSTPORT/$FERRY_TEST_S3_BUCKET/bench"
base="http://$FERRY_TEST_S3_HOSTPORT/$FERRY_TEST_S3_BUCKET"
s3curl() {
  curl -sS -H "x-amz-content-sha256: UNSIGNED-PAYLOAD" --aws-sigv4 "aws:amz:$AWS_REGION:s3" \
    --user "$AWS_ACCESS_KEY_ID:$AWS_SECRET_ACCESS_KEY" "$@"
}
now() { date +%s.%N; }
mbs() { awk -v a="$1" -v b="$2" -v m="$size_mib" 'BEGIN { printf "%.0f", m * 1.048576 / (b - a) }'; }

"$ferry" format --storage "$url" --s3-http "$root/vol" >/dev/null
# No local copies: the file written here, and each whole read, would leave
# one that the next mount reads instead of the store.
mnt_ferry() { # cache-dir [-o options]
  local cache=$1
  shift
  "$ferry" mount --staging-dir "$root/staging" --cache-dir "$cache" -o local_copies=0 "$@" \
    "$root/vol" "$mnt" >/dev/null
}
mnt_ferry "$root/cache0"
dd if=/dev/urandom of="$mnt/f" bs=1M count="$size_mib" conv=fsync status=none
want=$(sha256sum < "$mnt/f")
"$ferry" umount "$mnt" >/dev/null

# The objects the file is made of (listing pages of up to 1,000 keys).
keys=()
token=
while :; do
  page=$(s3curl "$base?list-type=2&prefix=bench/chunks/${token:+&continuation-token=$token}")
  mapfile -t -O "${#keys[@]}" keys < <(grep -o '<Key>[^<]*</Key>' <<<"$page" | sed 's/<[^>]*>//g')
  token=$(grep -o '<NextContinuationToken>[^<]*' <<<"$page" | sed 's/.*>//' || true)
  [[ -n $token ]] || break
done
(( ${#keys[@]} > 0 )) || { echo "s3_read.sh: no objects listed" >&2; exit 1; }

echo "S3 sequential read: one ${size_mib} MiB file, ${#keys[@]} objects, s3rver on 127.0.0.1"
echo "kernel $(uname -r), $(nproc) CPUs, commit $(git -C "$top" rev-parse --short HEAD 2>/dev/null || echo '?')"
declare -A R
drop() { sync; echo 3 > /proc/sys/vm/drop_caches; }
# raw P: one curl, P GETs at a time, bodies to /dev/null.
raw() {
  local args=() k t0 t1
  for k in "${keys[@]}"; do args+=(-o /dev/null "$base/$k"); done
  t0=$(now)
  s3curl -Z --parallel-max "$1" "${args[@]}" 2>/dev/null
  t1=$(now)
  mbs "$t0" "$t1"
}
# rawfiles P: the same, but each body to a file of its own beside the read
# caches (not synced, as a cache file is not): what a client that keeps the
# bytes, as ferryfs must, gets from the same server on the same cores.
rawfiles() {
  local args=() i t0 t1
  mkdir "$root/rawfiles"
  for i in "${!keys[@]}"; do args+=(-o "$root/rawfiles/$i" "$base/${keys[$i]}"); done
  t0=$(now)
  s3curl -Z --parallel-max "$1" "${args[@]}" 2>/dev/null
  t1=$(now)
  rm -rf "$root/rawfiles"
  mbs "$t0" "$t1"
}
# ferry RA CACHE: a cold read through ferryfs (a fresh mount, an empty read
# cache) to /dev/null, as the raw GETs; its bytes are checked afterwards,
# untimed, from the page cache.
ferry() {
  local opts=() t0 t1 got
  [[ $1 == 0 ]] && opts=(-o readahead=0)
  mnt_ferry "$root/cache-$2" "${opts[@]}"
  t0=$(now)
  dd if="$mnt/f" of=/dev/null bs=1M status=none
  t1=$(now)
  got=$(sha256sum < "$mnt/f")
  [[ $got == "$want" ]] || { echo "s3_read.sh: ferryfs read wrong bytes" >&2; exit 1; }
  mbs "$t0" "$t1"
  awk '$1 == "prefetch_fetched" { print $2 }' "$mnt/.stats" >> "$root/prefetched"
  awk '$1 == "prefetch_streams_busy_max" { print $2 }' "$mnt/.stats" >> "$root/busy"
  grep '^prefetch_streams ' "$mnt/.stats" > "$root/streams"
  "$ferry" umount "$mnt" >/dev/null
  rm -rf "$root/cache-$2"
}
median() { tr ' ' '\n' <<<"$1" | sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
add() { R[$1]="${R[$1]:+${R[$1]} }$2"; }
# Server cold: its object files dropped from the page cache before each
# job; server warm: each job right after another read them all.
drop; R[cold.raw1]=$(raw 1)
drop; R[cold.ferry0]=$(ferry 0 c0)
: > "$root/prefetched"
: > "$root/busy"
for ((r = 1; r <= rounds; r++)); do
  # (assignments first: a failed read stops the script, set -e)
  drop; v=$(raw 4); add cold.raw4 "$v"
  drop; v=$(raw 8); add cold.raw8 "$v"
  drop; v=$(rawfiles 8); add cold.rawf8 "$v"
  drop; v=$(ferry default "c$r"); add cold.ferry "$v"
  v=$(raw 4); add warm.raw4 "$v"
  v=$(raw 8); add warm.raw8 "$v"
  v=$(rawfiles 8); add warm.rawf8 "$v"
  v=$(ferry default "w$r"); add warm.ferry "$v"
done
declare -A M
for k in cold.raw4 cold.raw8 cold.rawf8 cold.ferry warm.raw4 warm.raw8 warm.rawf8 warm.ferry; do
  M[$k]=$(median "${R[$k]}")
done
faster() { if (( $1 > $2 )); then echo "$1"; else echo "$2"; fi; }
printf '  %-44s %8s %8s\n' "MB/s" "server" "server"
printf '  %-44s %8s %8s\n' "" cold warm
printf '  %-44s %8s %8s\n' "raw GET, 1 at a time" "${R[cold.raw1]}" -
printf '  %-44s %8s %8s\n' "raw GET, 4 at a time (median)" "${M[cold.raw4]}" "${M[warm.raw4]}"
printf '  %-44s %8s %8s\n' "raw GET, 8 at a time (median)" "${M[cold.raw8]}" "${M[warm.raw8]}"
printf '  %-44s %8s %8s\n' "raw GET, 8 at a time, to files (median)" "${M[cold.rawf8]}" "${M[warm.rawf8]}"
printf '  %-44s %8s %8s\n' "ferryfs, empty read cache, readahead=0" "${R[cold.ferry0]}" -
printf '  %-44s %8s %8s\n' "ferryfs, empty read cache (median)" "${M[cold.ferry]}" "${M[warm.ferry]}"
awk -v fc="${M[cold.ferry]}" -v rc="$(faster "${M[cold.raw4]}" "${M[cold.raw8]}")" \
  -v fw="${M[warm.ferry]}" -v rw="$(faster "${M[warm.raw4]}" "${M[warm.raw8]}")" \
  'BEGIN { printf "  ferryfs / the faster raw GET: %.2f server cold, %.2f server warm (target: at least 0.80)\n", fc / rc, fw / rw }'
awk -v fc="${M[cold.ferry]}" -v rc="${M[cold.rawf8]}" -v fw="${M[warm.ferry]}" -v rw="${M[warm.rawf8]}" \
  'BEGIN { printf "  ferryfs / raw GET to files: %.2f server cold, %.2f server warm\n", fc / rc, fw / rw }'
echo "  (rounds: raw4 ${R[cold.raw4]} / raw8 ${R[cold.raw8]} / to files ${R[cold.rawf8]} / ferryfs ${R[cold.ferry]} server cold,"
echo "  raw4 ${R[warm.raw4]} / raw8 ${R[warm.raw8]} / to files ${R[warm.rawf8]} / ferryfs ${R[warm.ferry]} server warm;"
echo "  objects read ahead per ferryfs read: $(tr '\n' ' ' < "$root/prefetched")of ${#keys[@]};"
echo "  most GETs of read-ahead at once: $(tr '\n' ' ' < "$root/busy")of $(awk '$1 == "prefetch_streams" { print $2 }' "$root/streams") streams)"
