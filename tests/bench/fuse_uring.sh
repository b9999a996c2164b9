#!/usr/bin/env bash
# What FUSE-over-io_uring does to the cost of a FUSE request on this machine:
# ferryfs and libfuse's passthrough_hp, each served through /dev/fuse and
# through io_uring (-o io_uring), beside the staging filesystem itself, all
# on one fresh loop-mounted ext4 image (ferryfs's staging, metadata and
# file:// objects on it too). Rows, each the mean over its loop:
#   create    open(O_CREAT) + write 2 KiB + close, N new files in one directory
#   getxattr  getxattr of an absent attribute (one round trip each; the
#             kernel caches no answer)
#   open      open(O_RDONLY) + close of the files made above
# Rounds alternate the columns, so drift of the machine hits all of them.
#
#   tests/bench/fuse_uring.sh [--files N] [--rounds R] [--workdir DIR]
#                             [--build-dir DIR]
#
# Needs root, a kernel with the fuse module's enable_uring parameter (Linux
# >= 6.14; the parameter is set for the io_uring columns and put back after)
# and a libfuse built with io_uring (scripts/bootstrap's). passthrough_hp
# comes from scripts/passthrough-hp (its columns are left out if that cannot
# build it).
set -euo pipefail

top=$(cd "$(dirname "$0")/../.." && pwd)
files=5000 rounds=3 workdir=/var/tmp build=$top/build
while [[ $# -gt 0 ]]; do
  case $1 in
    --files) files=${2:?}; shift ;;
    --rounds) rounds=${2:?}; shift ;;
    --workdir) workdir=${2:?}; shift ;;
    --build-dir) build=${2:?}; shift ;;
    -h|--help) sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "fuse_uring.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
param=/sys/module/fuse/parameters/enable_uring
[[ $(id -u) -eq 0 ]] || { echo "fuse_uring.sh: needs root" >&2; exit 2; }
[[ -e $param ]] || { echo "fuse_uring.sh: no $param: this kernel has no FUSE-over-io_uring" >&2; exit 2; }
ferry=$build/bin/ferry
[[ -x $ferry ]] || { echo "fuse_uring.sh: no $ferry (build first)" >&2; exit 2; }
pthp=$("$top/scripts/passthrough-hp" 2>/dev/null || true)

param_was=$(cat "$param")
# shellcheck source=tests/bench/loop_image.sh
source "$top/tests/bench/loop_image.sh"
loop_image "$workdir" ferry-uring "$files"
pmnt=$root/pthp-mnt
mkdir -p "$pmnt"
# shellcheck disable=SC2317  # (run by the trap)
cleanup() {
  local rc=$?
  mountpoint -q "$pmnt" && umount "$pmnt"
  echo "$param_was" > "$param"
  (exit "$rc")
  loop_image_cleanup
}
trap cleanup EXIT

# The three loops in dir (made fresh); prints "create getxattr open" in us.
loops() {
  python3 - "$1" "$files" <<'PY'
import os, sys, time
d, n = sys.argv[1], int(sys.argv[2])
os.makedirs(d)
body = b"x" * 2048
t = time.perf_counter()
for i in range(n):
    fd = os.open(f"{d}/f{i:07d}", os.O_CREAT | os.O_WRONLY, 0o644)
    os.write(fd, body)
    os.close(fd)
create = (time.perf_counter() - t) / n * 1e6
f, k = f"{d}/f0000000", 4 * n
t = time.perf_counter()
for i in range(k):
    try:
        os.getxattr(f, "user.absent")
    except OSError:
        pass
getxattr = (time.perf_counter() - t) / k * 1e6
t = time.perf_counter()
for i in range(n):
    os.close(os.open(f"{d}/f{i:07d}", os.O_RDONLY))
opn = (time.perf_counter() - t) / n * 1e6
print("%.1f %.1f %.1f" % (create, getxattr, opn))
PY
}

# One column, one round: appends "create getxattr open" to $root/NAME.
column() { # name round
  local name=$1 r=$2 dir
  case $name in
    ext4) loops "$scratch/ext4-$r" >> "$root/$name" ;;
    ferryfs|ferryfs-uring)
      [[ $name == ferryfs-uring ]] && echo Y > "$param"
      rm -rf "$scratch/vol" "$scratch/staging" "$scratch/cache"
      mkdir -p "$scratch/staging" "$scratch/cache"
      "$ferry" format --storage "file://$scratch/objs-$name-$r" "$scratch/vol" >/dev/null
      "$ferry" mount --staging-dir "$scratch/staging" --cache-dir "$scratch/cache" \
        -o "io_uring=$([[ $name == ferryfs-uring ]] && echo on || echo off)" \
        "$scratch/vol" "$mnt" >/dev/null
      loops "$mnt/d" >> "$root/$name"
      grep -E '^io_uring(_requests)? ' "$mnt/.stats" | paste -sd' ' > "$root/$name.stats"
      "$ferry" umount "$mnt" >/dev/null
      echo "$param_was" > "$param" ;;
    passthrough_hp|passthrough_hp-uring)
      dir=$scratch/pthp-src-$name-$r
      mkdir -p "$dir"
      if [[ $name == passthrough_hp-uring ]]; then
        echo Y > "$param"
        "$pthp" -o io_uring "$dir" "$pmnt"
      else
        "$pthp" "$dir" "$pmnt"
      fi
      loops "$pmnt/d" >> "$root/$name"
      umount "$pmnt"
      echo "$param_was" > "$param" ;;
  esac
}

cols=(ext4 ferryfs ferryfs-uring)
[[ -n $pthp ]] && cols+=(passthrough_hp passthrough_hp-uring)
echo "FUSE requests through /dev/fuse and through io_uring: $files files, $rounds rounds (mean of the rounds; per round in brackets)"
echo "kernel $(uname -r), $(nproc) CPUs, commit $(git -C "$top" rev-parse --short HEAD 2>/dev/null || echo '?')"
[[ -n $pthp ]] || echo "passthrough_hp: left out (scripts/passthrough-hp could not build it)"
for r in $(seq 1 "$rounds"); do
  for c in "${cols[@]}"; do column "$c" "$r"; done
done
printf '%-22s %-34s %-34s %-34s\n' "" "create+write+close (us)" "getxattr (us)" "open+close (us)"
for c in "${cols[@]}"; do
  printf '%-22s' "$c"
  for k in 1 2 3; do
    awk -v k="$k" '{ s += $k; v = v (NR > 1 ? " " : "") $k } END { printf " %-33s", sprintf("%.1f [%s]", s / NR, v) }' "$root/$c"
  done
  echo
done
for c in ferryfs ferryfs-uring; do
  echo "$c .stats (last round): $(cat "$root/$c.stats")"
done
