#!/usr/bin/env bash
# What deleting files whose uploads have not begun costs: N files (SIZE
# bytes each, 50 to a directory) written and closed, then `rm -rf` of them
# at once, on ext4 itself, on libfuse's passthrough_hp over it, and on
# ferryfs twice: with its defaults (uploads start once closes pause, so
# some have begun when the rm comes), and with uploads held back
# (-o upload_quiet_ms=600000, so none has). All on one fresh loop-mounted
# ext4 image (ferryfs's staging directory, metadata and file:// objects on
# it too).
#
# Prints per target the rm's wall time, and for ferryfs the CPU time
# ferry-mountd and ferry-reconciler spent while it ran, then per file:
# objects uploaded while it ran, jobs dropped (a deleted file's upload that
# never began: reconcile_dropped_total) and the FUSE requests of the rm;
# then, after a drain, the objects the whole run uploaded per file.
#
#   tests/bench/delete_burst.sh [--files N] [--size BYTES] [--workdir DIR]
#                               [--build-dir DIR]
#
# Needs root (loop mount, FUSE mount). passthrough_hp comes from
# scripts/passthrough-hp (its row is left out if that cannot build it).
set -euo pipefail

top=$(cd "$(dirname "$0")/../.." && pwd)
files=10000 size=2048 workdir=/var/tmp build=$top/build
while [[ $# -gt 0 ]]; do
  case $1 in
    --files) files=${2:?}; shift ;;
    --size) size=${2:?}; shift ;;
    --workdir) workdir=${2:?}; shift ;;
    --build-dir) build=${2:?}; shift ;;
    -h|--help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "delete_burst.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
[[ $(id -u) -eq 0 ]] || { echo "delete_burst.sh: needs root" >&2; exit 2; }
ferry=$build/bin/ferry
[[ -x $ferry ]] || { echo "delete_burst.sh: no $ferry (build first)" >&2; exit 2; }
pthp=$("$top/scripts/passthrough-hp" 2>/dev/null || true)

# shellcheck source=tests/bench/loop_image.sh
. "$top/tests/bench/loop_image.sh"
loop_image "$workdir" ferry-delete "$files"
pmnt=$root/pthp-mnt
mkdir -p "$pmnt"
trap 'mountpoint -q "$pmnt" && umount -l "$pmnt"; loop_image_cleanup' EXIT

tck=$(getconf CLK_TCK)
proc_cpu() { awk '{print $14 + $15}' "/proc/$1/stat"; }   # ticks of pid $1
ms_since() { echo $(( ($(date +%s%N) - $1) / 1000000 )); }
stat_of() { awk -v k="$1" '$1 == k { print $2 }' "$mnt/.stats"; }
per_file() { awk -v a="$1" -v n="$files" 'BEGIN { printf "%.2f", a / n }'; }

make_files() {
  python3 - "$1" "$files" "$size" <<'PY'
import os, sys
d, n, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
buf = b"x" * size
for i in range(n):
    sub = f"{d}/d{i // 50:05d}"
    if i % 50 == 0:
        os.makedirs(sub)
    fd = os.open(f"{sub}/f{i:07d}", os.O_CREAT | os.O_WRONLY, 0o644)
    os.write(fd, buf)
    os.close(fd)
PY
}

echo "delete burst: $files files of $size bytes (50 to a directory) written, then rm -rf at once;"
echo "ext4 on a fresh loop image ($img); kernel $(uname -r), $(nproc) CPUs, commit $(git -C "$top" rev-parse --short HEAD 2>/dev/null || echo unknown)"
printf '  %-22s %9s %12s %16s %10s %9s %14s %12s\n' target "rm ms" "ferry-mountd" "ferry-reconciler" "uploaded" dropped "FUSE requests" "all uploads"

make_files "$scratch/plain"
sync
t0=$(date +%s%N)
rm -rf "$scratch/plain"
printf '  %-22s %9d\n' ext4 "$(ms_since "$t0")"

if [[ -n $pthp ]]; then
  mkdir -p "$scratch/pthp-src"
  "$pthp" "$scratch/pthp-src" "$pmnt"
  make_files "$pmnt/r"
  sync
  t0=$(date +%s%N)
  rm -rf "$pmnt/r"
  printf '  %-22s %9d\n' passthrough_hp "$(ms_since "$t0")"
  umount "$pmnt"
else
  echo "  passthrough_hp: left out (scripts/passthrough-hp could not build it)"
fi

for mode in defaults held; do
  vol=$scratch/vol-$mode opts=()
  [[ $mode == held ]] && opts=(-o "upload_quiet_ms=600000,upload_delay_max_ms=600000")
  "$ferry" format --storage "file://$scratch/objects-$mode" "$vol" >/dev/null
  "$ferry" mount "${opts[@]}" --staging-dir "$scratch/staging-$mode" \
    --cache-dir "$scratch/cache-$mode" "$vol" "$mnt" >/dev/null
  mpid=$(pgrep -f "ferry-mountd.*$vol" | head -n1)
  rpid=$(pgrep -f "ferry-reconciler.*$vol" | head -n1)
  [[ -n $mpid && -n $rpid ]] || { echo "delete_burst.sh: no ferry-mountd or ferry-reconciler found" >&2; exit 1; }
  make_files "$mnt/r"
  up0=$(stat_of reconcile_uploads_total) dr0=$(stat_of reconcile_dropped_total)
  rq0=$(awk '$1 ~ /^fuse_requests_/ { n += $2 } END { print n }' "$mnt/.stats")
  m0=$(proc_cpu "$mpid") q0=$(proc_cpu "$rpid")
  t0=$(date +%s%N)
  rm -rf "$mnt/r"
  ms=$(ms_since "$t0")
  m1=$(proc_cpu "$mpid") q1=$(proc_cpu "$rpid")
  up1=$(stat_of reconcile_uploads_total) dr1=$(stat_of reconcile_dropped_total)
  # Less this read of .stats (a LOOKUP and a few more), not per file.
  rq1=$(awk '$1 ~ /^fuse_requests_/ { n += $2 } END { print n }' "$mnt/.stats")
  "$ferry" drain "$mnt" >/dev/null
  up2=$(stat_of reconcile_uploads_total)
  printf '  %-22s %9d %9d ms %13d ms %10s %9s %14s %12s\n' "ferryfs $mode" "$ms" \
    $(( (m1 - m0) * 1000 / tck )) $(( (q1 - q0) * 1000 / tck )) "$(per_file $((up1 - up0)))" \
    "$(per_file $((dr1 - dr0)))" "$(per_file $((rq1 - rq0)))" "$(per_file "$up2")"
  "$ferry" umount "$mnt" >/dev/null
done
echo "  (uploaded, dropped and FUSE requests: per file, while the rm ran; all uploads: objects"
echo "  the run stored in all, per file, after a drain. held: -o upload_quiet_ms=600000."
echo "  CPU in clock ticks of $((1000 / tck)) ms.)"
