#!/usr/bin/env bash
# Issue 10's small-file loop, with the CPU each process spends on it: N
# files created, written (SIZE bytes; --size 0: none) and closed in one
# directory, by one Python writer, on ferryfs and on the plain directory
# beside it, on one fresh loop-mounted ext4 image (ferryfs's staging
# directory, metadata and file:// objects on it too).
#
# Prints per file: the writer's wall time; the CPU time (user + system, from
# /proc) of the writer, ferry-mountd and ferry-reconciler while the loop
# ran; and the whole machine's busy and idle time. The reconciler's uploads
# that go on during the loop take their share from the writer's CPUs; what
# it holds back (-o upload_quiet_ms) or has left at the end is timed apart:
# the wall time and reconciler CPU until every file is committed.
#
#   tests/bench/small_files_cpu.sh [--files N] [--size BYTES] [--runs K]
#                                  [--workdir DIR] [--build-dir DIR]
#
# Needs root (loop mount, FUSE mount).
set -euo pipefail

top=$(cd "$(dirname "$0")/../.." && pwd)
files=5000 size=2048 runs=3 workdir=/var/tmp build=$top/build
while [[ $# -gt 0 ]]; do
  case $1 in
    --files) files=${2:?}; shift ;;
    --size) size=${2:?}; shift ;;
    --runs) runs=${2:?}; shift ;;
    --workdir) workdir=${2:?}; shift ;;
    --build-dir) build=${2:?}; shift ;;
    -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "small_files_cpu.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
[[ $(id -u) -eq 0 ]] || { echo "small_files_cpu.sh: needs root" >&2; exit 2; }
ferry=$build/bin/ferry
[[ -x $ferry ]] || { echo "small_files_cpu.sh: no $ferry (build first)" >&2; exit 2; }

# shellcheck source=tests/bench/loop_image.sh
. "$top/tests/bench/loop_image.sh"
loop_image "$workdir" ferry-sfcpu "$files"

tck=$(getconf CLK_TCK)
proc_cpu() { awk '{print $14 + $15}' "/proc/$1/stat"; }     # ticks of pid $1
machine() { awk '/^cpu / {print $2 + $3 + $4 + $7 + $8, $5 + $6}' /proc/stat; }
per_file() { echo $(( ($1) * 1000000 / tck / files )); }     # ticks -> us per file

# Runs the loop in dir $1; prints "wall_us writer_cpu_us" per file.
loop() {
  python3 - "$1" "$files" "$size" <<'PY'
import os, sys, time
d, n, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
buf = b"x" * size
os.makedirs(d, exist_ok=True)
t, c = time.time(), os.times()
for i in range(n):
    fd = os.open(f"{d}/f{i:07d}", os.O_CREAT | os.O_WRONLY, 0o644)
    if buf:
        os.write(fd, buf)
    os.close(fd)
e = os.times()
print("%.1f %.1f" % ((time.time() - t) / n * 1e6,
                     ((e.user - c.user) + (e.system - c.system)) / n * 1e6))
PY
}

echo "small files: $files x (create + write($size) + close) in one directory, $runs runs each;"
echo "ext4 on a fresh loop image ($img); kernel $(uname -r), $(nproc) CPUs, commit $(git -C "$top" rev-parse --short HEAD 2>/dev/null || echo unknown)"
printf '  %-8s %4s %10s %10s %12s %16s %12s %12s %10s %10s\n' target run "wall us" "writer" "ferry-mountd" "ferry-reconciler" "machine busy" "machine idle" "then: wall" "reconciler"
for r in $(seq 1 "$runs"); do
  plain=$scratch/plain-$r
  read -r c0 i0 < <(machine)
  read -r wall wcpu < <(loop "$plain")
  read -r c1 i1 < <(machine)
  printf '  %-8s %4d %10s %10s %12s %16s %12d %12d\n' ext4 "$r" "$wall" "$wcpu" - - \
    "$(per_file "c1 - c0")" "$(per_file "i1 - i0")"
  rm -rf "$plain"

  vol=$scratch/vol-$r
  "$ferry" format --storage "file://$scratch/objects-$r" "$vol" >/dev/null
  "$ferry" mount --staging-dir "$scratch/staging-$r" --cache-dir "$scratch/cache-$r" \
    "$vol" "$mnt" >/dev/null
  mpid=$(pgrep -f "ferry-mountd.*$root" | head -n1)
  rpid=$(pgrep -f "ferry-reconciler.*$root" | head -n1)
  [[ -n $mpid && -n $rpid ]] || { echo "small_files_cpu.sh: no ferry-mountd or ferry-reconciler found" >&2; exit 1; }
  m0=$(proc_cpu "$mpid") q0=$(proc_cpu "$rpid")
  read -r c0 i0 < <(machine)
  read -r wall wcpu < <(loop "$mnt/d")
  read -r c1 i1 < <(machine)
  m1=$(proc_cpu "$mpid") q1=$(proc_cpu "$rpid")
  # Then until every file is committed (uploads the reconciler held back
  # while the loop ran, or had not finished).
  d0=$(date +%s%N)
  until grep -qx 'reconcile_inflight 0' "$mnt/.stats" &&
        grep -qx 'reconcile_handed_inflight 0' "$mnt/.stats"; do sleep 0.05; done
  d1=$(date +%s%N) q2=$(proc_cpu "$rpid")
  printf '  %-8s %4d %10s %10s %12d %16d %12d %12d %10d %10d\n' ferryfs "$r" "$wall" "$wcpu" \
    "$(per_file "m1 - m0")" "$(per_file "q1 - q0")" "$(per_file "c1 - c0")" "$(per_file "i1 - i0")" \
    $(( (d1 - d0) / 1000 / files )) "$(per_file "q2 - q1")"
  "$ferry" umount "$mnt" >/dev/null
done
echo "  (CPU columns: microseconds per file while the loop ran, counted in clock ticks"
echo "  of $((1000 / tck)) ms: ext4's loop is too short for them; busy + idle = CPUs x wall."
echo "  then: after the loop, until every file is committed: wall and reconciler CPU per file)"
