#!/usr/bin/env bash
# Issue 10's namespace scale workload, ferryfs beside ext4 on one fresh
# loop-mounted ext4 image (the plain directory, and ferryfs's staging
# directory, metadata and file:// objects, all on it):
#
#   create  N empty files in one directory (open(O_CREAT|O_WRONLY) + close)
#   ls -l   of that directory, cold: ext4 after drop_caches; ferryfs after
#           an unmount and mount (the kernel forgets every entry) and
#           drop_caches (the metadata database's pages too)
#   rm -rf  of the directory
#
# Prints the time of each phase per target, the ratio to ext4, and
# ferry-mountd's VmRSS/VmHWM after each phase. libfuse's passthrough_hp over
# the same image (scripts/passthrough-hp) is a third column where the fd
# lets it run (it keeps an fd per inode): what FUSE itself costs here.
#
#   tests/bench/namespace_scale.sh [--files N] [--workdir DIR] [--build-dir DIR]
#                                  [--io-uring]
#
# --io-uring serves ferryfs (-o io_uring=on) and passthrough_hp (-o io_uring)
# over FUSE-over-io_uring: the fuse module's enable_uring parameter is set
# for the run and put back after.
#
# Needs root (loop mount, FUSE mount, drop_caches).
set -euo pipefail

top=$(cd "$(dirname "$0")/../.." && pwd)
files=100000 workdir=/var/tmp build=$top/build uring=0
while [[ $# -gt 0 ]]; do
  case $1 in
    --files) files=${2:?}; shift ;;
    --workdir) workdir=${2:?}; shift ;;
    --build-dir) build=${2:?}; shift ;;
    --io-uring) uring=1 ;;
    -h|--help) sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "namespace_scale.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
[[ $(id -u) -eq 0 ]] || { echo "namespace_scale.sh: needs root" >&2; exit 2; }
ferry=$build/bin/ferry
[[ -x $ferry ]] || { echo "namespace_scale.sh: no $ferry (build first)" >&2; exit 2; }

param=/sys/module/fuse/parameters/enable_uring
ferry_opts=() pthp_opts=() over="/dev/fuse"
if (( uring )); then
  [[ -w $param ]] || { echo "namespace_scale.sh: no $param: this kernel has no FUSE-over-io_uring" >&2; exit 2; }
  ferry_opts=(-o io_uring=on) pthp_opts=(-o io_uring) over="io_uring"
fi

# shellcheck source=tests/bench/loop_image.sh
. "$top/tests/bench/loop_image.sh"
loop_image "$workdir" ferry-nsscale "$files"
if (( uring )); then
  param_was=$(cat "$param")
  trap 'rc=$?; echo "$param_was" > "$param"; (exit $rc); loop_image_cleanup' EXIT
  echo Y > "$param"
fi

now() { date +%s.%N; }
drop() { sync; echo 3 > /proc/sys/vm/drop_caches; }
create() { # dir n
  python3 - "$1" "$2" <<'PY'
import os, sys
d, n = sys.argv[1], int(sys.argv[2])
os.makedirs(d, exist_ok=True)
for i in range(n):
    os.close(os.open(f"{d}/f{i:07d}", os.O_CREAT | os.O_WRONLY, 0o644))
PY
}
mountd_mem() {
  local pid
  pid=$(pgrep -f "ferry-mountd.*$mnt" | head -1 || true)
  [[ -n $pid ]] || { echo "-"; return; }
  awk '/VmRSS|VmHWM/ {printf "%s %s MiB  ", $1, int($2/1024)}' "/proc/$pid/status"
}
declare -A T
phase() { # target name command...
  local t0 t1 tgt=$1 name=$2
  shift 2
  t0=$(now); "$@"; t1=$(now)
  T[$tgt.$name]=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }')
  printf '  %-7s %-7s %8.2f s   %s\n' "$tgt" "$name" "${T[$tgt.$name]}" \
    "$([[ $tgt == ferryfs ]] && mountd_mem)"
}
ls_l() { ls -l "$1" > /dev/null; }

echo "namespace scale: $files empty files in one directory; ext4 on a fresh loop image ($img); FUSE over $over"
echo "kernel $(uname -r), $(nproc) CPUs, commit $(git -C "$top" rev-parse --short HEAD 2>/dev/null || echo '?')"

drop
phase ext4 create create "$scratch/plain/d" "$files"
drop
phase ext4 "ls -l" ls_l "$scratch/plain/d"
phase ext4 "rm -rf" rm -rf "$scratch/plain/d"

mkdir -p "$scratch/objs" "$scratch/staging" "$scratch/cache"
# libfuse's passthrough_hp over the same file system: the cost of FUSE
# itself on this machine. It keeps an fd per inode it knows, so it gets an
# fd limit of files + 1,000, where this process may raise its hard limit
# that far (CAP_SYS_RESOURCE, up to fs.nr_open).
pthp=$("$top/scripts/passthrough-hp" 2>/dev/null || true)
pthp_why= pthp_fds=$((files + 1000))
(( pthp_fds > $(ulimit -Hn) )) || pthp_fds=$(ulimit -Hn)
if [[ -z $pthp ]]; then
  pthp_why="scripts/passthrough-hp could not build it"
elif ! (ulimit -Hn "$pthp_fds") 2>/dev/null; then
  pthp_why="it keeps an fd per inode: $files files need $pthp_fds fds, over the hard limit $(ulimit -Hn), which this process cannot raise (no CAP_SYS_RESOURCE, or over fs.nr_open)"
fi
mnt_pthp() {
  mkdir -p "$scratch/pthp-src"
  (ulimit -Hn "$pthp_fds" && ulimit -n "$pthp_fds"
   exec "$pthp" --foreground "${pthp_opts[@]}" "$scratch/pthp-src" "$mnt" >"$root/pthp.log" 2>&1) &
  for _ in $(seq 100); do mountpoint -q "$mnt" && return 0; sleep 0.05; done
  echo "namespace_scale.sh: passthrough_hp did not mount (see $root/pthp.log)" >&2
  return 1
}
umnt_pthp() { umount "$mnt"; wait; }
if [[ -z $pthp_why ]]; then
  mnt_pthp
  drop
  phase pthp create create "$mnt/d" "$files"
  umnt_pthp
  drop
  mnt_pthp
  phase pthp "ls -l" ls_l "$mnt/d"
  phase pthp "rm -rf" rm -rf "$mnt/d"
  umnt_pthp
fi

"$ferry" format --storage "file://$scratch/objs" "$scratch/vol" >/dev/null
mnt_ferry() { "$ferry" mount --staging-dir "$scratch/staging" --cache-dir "$scratch/cache" \
  "${ferry_opts[@]}" "$scratch/vol" "$mnt" >/dev/null; }
mnt_ferry
drop
phase ferryfs create create "$mnt/d" "$files"
"$ferry" umount "$mnt" >/dev/null
drop
mnt_ferry
phase ferryfs "ls -l" ls_l "$mnt/d"
phase ferryfs "rm -rf" rm -rf "$mnt/d"
"$ferry" umount "$mnt" >/dev/null

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2fx", a / b }'; }
echo
printf '  %-8s %10s %10s %10s %8s %8s\n' phase ext4 pthp ferryfs "ferry/ext4" "ferry/pthp"
for p in create "ls -l" "rm -rf"; do
  pt=${T[pthp.$p]:-}
  printf '  %-8s %9.2fs %10s %9.2fs %10s %10s\n' "$p" "${T[ext4.$p]}" \
    "${pt:+${pt}s}" "${T[ferryfs.$p]}" "$(ratio "${T[ferryfs.$p]}" "${T[ext4.$p]}")" \
    "$([[ -n $pt ]] && ratio "${T[ferryfs.$p]}" "$pt" || echo -)"
done
echo "  (target: each within 3x of ext4 at 100,000 files)"
[[ -z $pthp_why ]] || echo "  (no passthrough_hp column: $pthp_why)"
