#!/usr/bin/env bash
# Issue 11's read-path workload: fio (psync, one job) reading one file of
# --size-mib (default 1024) on ext4 itself, on libfuse's passthrough_hp over
# it, and on ferryfs, all on one fresh loop-mounted ext4 image (ferryfs's
# staging directory, metadata, read cache and file:// objects on it too).
#
#   seq cold     1 MiB sequential reads after drop_caches (ferryfs: after a
#                remount too; "store" is its first read, which fetches every
#                object into the read cache; "cache" the next one)
#   rand cold    4 KiB random reads for --seconds after drop_caches
#   seq warm     1 MiB sequential reads of a file read once before
#   rand warm    4 KiB random reads of it, for --seconds
#   resident     page cache the file takes after two full reads: the file's
#                own pages (fincore), plus ferryfs's read-cache files
#
# ferryfs writes the file through the mount (passthrough), waits until the
# reconciler has committed it, then remounts, so every read goes through the
# read path rather than the staging file. Prints MB/s or IOPS per target and
# ferryfs's ratio to each other column, then ferryfs's FUSE READ requests.
#
#   tests/bench/read_path.sh [--size-mib N] [--seconds S] [--workdir DIR]
#                            [--build-dir DIR]
#
# Needs root (loop mount, FUSE mount, drop_caches) and fio (scripts/bootstrap
# installs it).
set -euo pipefail

top=$(cd "$(dirname "$0")/../.." && pwd)
size_mib=1024 seconds=10 workdir=/var/tmp build=$top/build
while [[ $# -gt 0 ]]; do
  case $1 in
    --size-mib) size_mib=${2:?}; shift ;;
    --seconds) seconds=${2:?}; shift ;;
    --workdir) workdir=${2:?}; shift ;;
    --build-dir) build=${2:?}; shift ;;
    -h|--help) sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "read_path.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
[[ $(id -u) -eq 0 ]] || { echo "read_path.sh: needs root" >&2; exit 2; }
ferry=$build/bin/ferry
[[ -x $ferry ]] || { echo "read_path.sh: no $ferry (build first)" >&2; exit 2; }
command -v fio >/dev/null || { echo "read_path.sh: needs fio (scripts/bootstrap)" >&2; exit 2; }

# shellcheck source=tests/bench/loop_image.sh
. "$top/tests/bench/loop_image.sh"
loop_image "$workdir" ferry-readpath 1000

drop() { sync; echo 3 > /proc/sys/vm/drop_caches; }
declare -A R
# fio_job TARGET ROW FILE seq|rand: one psync job; records MB/s or IOPS.
fio_job() {
  local tgt=$1 row=$2 file=$3 kind=$4 out args
  if [[ $kind == seq ]]; then
    args=(--rw=read --bs=1M)
  else
    args=(--rw=randread --bs=4k --time_based --runtime="$seconds")
  fi
  out=$(fio --name=rp --filename="$file" --readonly --ioengine=psync --numjobs=1 \
        --size="${size_mib}M" --invalidate=0 --output-format=json "${args[@]}")
  R[$tgt.$row]=$(python3 -c '
import json, sys
r = json.load(sys.stdin)["jobs"][0]["read"]
print("%.0f" % (r["bw_bytes"] / 1e6 if sys.argv[1] == "seq" else r["iops"]))' "$kind" <<<"$out")
  printf '  %-8s %-12s %10s %s\n' "$tgt" "$row" "${R[$tgt.$row]}" \
    "$([[ $kind == seq ]] && echo MB/s || echo IOPS)"
}
# Pages of FILE... in the page cache, in MiB.
resident() {
  fincore --bytes --noheadings --output RES "$@" 2>/dev/null |
    awk '{ s += $1 } END { printf "%.0f", s / 1048576 }'
}
# The four jobs and the residency on FILE, cold meaning after COLD_CMD.
run_jobs() { # target file cold-cmd...
  local tgt=$1 file=$2
  shift 2
  "$@"; fio_job "$tgt" "seq cold" "$file" seq
  "$@"; fio_job "$tgt" "rand cold" "$file" rand
  cat "$file" > /dev/null
  fio_job "$tgt" "seq warm" "$file" seq
  fio_job "$tgt" "rand warm" "$file" rand
  "$@"
  cat "$file" > /dev/null; cat "$file" > /dev/null
}

echo "read path: one ${size_mib} MiB file, fio psync one job; ext4 on a fresh loop image ($img)"
echo "kernel $(uname -r), $(nproc) CPUs, fio $(fio --version), commit $(git -C "$top" rev-parse --short HEAD 2>/dev/null || echo '?')"

# ext4 itself.
mkdir -p "$scratch/plain"
dd if=/dev/urandom of="$scratch/plain/f" bs=1M count="$size_mib" conv=fsync status=none
run_jobs ext4 "$scratch/plain/f" drop
R[ext4.resident]=$(resident "$scratch/plain/f")
rm -f "$scratch/plain/f"

# libfuse's passthrough_hp over the same file system.
pthp=$("$top/scripts/passthrough-hp" 2>/dev/null || true)
if [[ -n $pthp ]]; then
  mkdir -p "$scratch/pthp-src"
  ("$pthp" --foreground "$scratch/pthp-src" "$mnt" >"$root/pthp.log" 2>&1) &
  for _ in $(seq 100); do mountpoint -q "$mnt" && break; sleep 0.05; done
  mountpoint -q "$mnt" || { echo "read_path.sh: passthrough_hp did not mount" >&2; exit 1; }
  dd if=/dev/urandom of="$mnt/f" bs=1M count="$size_mib" conv=fsync status=none
  run_jobs pthp "$mnt/f" drop
  R[pthp.resident]=$(( $(resident "$mnt/f") + $(resident "$scratch/pthp-src/f") ))
  umount "$mnt"
  wait
fi

# ferryfs.
mkdir -p "$scratch/objs" "$scratch/staging" "$scratch/cache"
"$ferry" format --storage "file://$scratch/objs" "$scratch/vol" >/dev/null
mnt_ferry() { "$ferry" mount --staging-dir "$scratch/staging" --cache-dir "$scratch/cache" \
  --cache-size $((size_mib * 2)) "$scratch/vol" "$mnt" >/dev/null; }
stat_of() { awk -v k="$1" '$1 == k { print $2 }' "$mnt/.stats"; }
# Counters start again at each mount: what the jobs cost is summed here.
declare -A S
stats_keep() {
  local k
  for k in fuse_requests_read spliced_reads cache_misses; do
    S[$k]=$(( ${S[$k]:-0} + $(stat_of "$k") ))
  done
}
remount() { stats_keep; "$ferry" umount "$mnt" >/dev/null; mnt_ferry; drop; }
mnt_ferry
dd if=/dev/urandom of="$mnt/f" bs=1M count="$size_mib" conv=fsync status=none
until [[ $(stat_of reconcile_inflight) == 0 && $(stat_of reconcile_handed_inflight) == 0 ]]; do
  sleep 0.1
done
remount
fio_job ferryfs "seq store" "$mnt/f" seq
remount
S=()
run_jobs ferryfs "$mnt/f" remount
stats_keep
cache_files=$(find "$scratch/cache" -type f)
# shellcheck disable=SC2086
R[ferryfs.resident]=$(( $(resident "$mnt/f") + $(resident $cache_files) ))
cache_mib=$(du -sm "$scratch/cache" | cut -f1)
"$ferry" umount "$mnt" >/dev/null

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2fx", a / b; else printf "-" }'; }
echo
printf '  %-12s %10s %10s %10s %11s %11s\n' row ext4 pthp ferryfs "ferry/ext4" "ferry/pthp"
for row in "seq cold" "rand cold" "seq warm" "rand warm"; do
  printf '  %-12s %10s %10s %10s %11s %11s\n' "$row" "${R[ext4.$row]}" "${R[pthp.$row]:--}" \
    "${R[ferryfs.$row]}" "$(ratio "${R[ferryfs.$row]}" "${R[ext4.$row]}")" \
    "$(ratio "${R[ferryfs.$row]}" "${R[pthp.$row]:-0}")"
done
printf '  %-12s %10s %10s %10s   (MiB of page cache after two full reads; lower is better)\n' \
  resident "${R[ext4.resident]}" "${R[pthp.resident]:--}" "${R[ferryfs.resident]}"
echo "  (seq rows MB/s, rand rows IOPS; ferryfs's first cold read, from the file:// store"
echo "  into an empty read cache: ${R[ferryfs.seq store]} MB/s; read cache afterwards ${cache_mib} MiB;"
echo "  during its other jobs: ${S[fuse_requests_read]} READ requests, ${S[spliced_reads]} of them spliced"
echo "  from the read cache, ${S[cache_misses]} objects fetched from the store)"
