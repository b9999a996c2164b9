#!/usr/bin/env bash
# Issue 11's S3 sequential-read target: a cold sequential read of one file
# through ferryfs (an empty read cache) beside a raw parallel GET of the
# same objects from the same local S3 server (scripts/s3-server), in one
# run. Raw GETs are one curl process with --parallel-max 1 and 4 (SigV4,
# bodies to /dev/null: the most a client could take from this server);
# ferryfs reads with dd bs=1M, with -o readahead=0 and with its default.
#
#   tests/bench/s3_read.sh [--size-mib N] [--build-dir DIR]
#
# Needs root (FUSE mount), curl and the bootstrap's s3rver.
set -euo pipefail

top=$(cd "$(dirname "$0")/../.." && pwd)
size_mib=256 build=$top/build
while [[ $# -gt 0 ]]; do
  case $1 in
    --size-mib) size_mib=${2:?}; shift ;;
    --build-dir) build=${2:?}; shift ;;
    -h|--help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "s3_read.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
[[ $(id -u) -eq 0 ]] || { echo "s3_read.sh: needs root" >&2; exit 2; }
ferry=$build/bin/ferry
[[ -x $ferry ]] || { echo "s3_read.sh: no $ferry (build first)" >&2; exit 2; }

root=$(mktemp -d /tmp/ferry-s3read.XXXXXX)
mnt=$root/mnt
cleanup() {
  set +e
  mountpoint -q "$mnt" && "$ferry" umount "$mnt" >/dev/null 2>&1
  "$top/scripts/s3-server" stop "$root/s3" >/dev/null 2>&1
  rm -rf "$root"
}
trap cleanup EXIT
mkdir -p "$mnt" "$root/s3"
eval "$("$top/scripts/s3-server" start "$root/s3")"
url="s3://$FERRY_TEST_S3_HOSTPORT/$FERRY_TEST_S3_BUCKET/bench"
base="http://$FERRY_TEST_S3_HOSTPORT/$FERRY_TEST_S3_BUCKET"
s3curl() {
  curl -sS -H "x-amz-content-sha256: UNSIGNED-PAYLOAD" --aws-sigv4 "aws:amz:$AWS_REGION:s3" \
    --user "$AWS_ACCESS_KEY_ID:$AWS_SECRET_ACCESS_KEY" "$@"
}
now() { date +%s.%N; }
mbs() { awk -v a="$1" -v b="$2" -v m="$size_mib" 'BEGIN { printf "%.0f", m * 1.048576 / (b - a) }'; }

"$ferry" format --storage "$url" --s3-http "$root/vol" >/dev/null
mnt_ferry() { # cache-dir [-o options]
  local cache=$1
  shift
  "$ferry" mount --staging-dir "$root/staging" --cache-dir "$cache" "$@" "$root/vol" "$mnt" \
    >/dev/null
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
for p in 1 4; do
  args=()
  for k in "${keys[@]}"; do args+=(-o /dev/null "$base/$k"); done
  t0=$(now)
  s3curl -Z --parallel-max "$p" "${args[@]}" 2>/dev/null
  t1=$(now)
  R[raw$p]=$(mbs "$t0" "$t1")
  printf '  %-34s %6s MB/s\n' "raw GET, $p at a time" "${R[raw$p]}"
done
for ra in 0 default; do
  opts=()
  [[ $ra == 0 ]] && opts=(-o readahead=0)
  mnt_ferry "$root/cache-$ra" "${opts[@]}"
  sync; echo 3 > /proc/sys/vm/drop_caches
  t0=$(now)
  got=$(dd if="$mnt/f" bs=1M status=none | sha256sum)
  t1=$(now)
  [[ $got == "$want" ]] || { echo "s3_read.sh: ferryfs read wrong bytes" >&2; exit 1; }
  R[ferry$ra]=$(mbs "$t0" "$t1")
  pre=$(awk '$1 == "prefetch_fetched" { print $2 }' "$mnt/.stats")
  printf '  %-34s %6s MB/s  (%s objects read ahead)\n' "ferryfs cold, readahead=$ra" \
    "${R[ferry$ra]}" "$pre"
  "$ferry" umount "$mnt" >/dev/null
done
awk -v f="${R[ferrydefault]}" -v r="${R[raw4]}" \
  'BEGIN { printf "  ferryfs / raw GET 4 at a time: %.2f (target: at least 0.80)\n", f / r }'
