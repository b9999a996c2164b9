#!/usr/bin/env bash
# Issue 9's limits at full size, ferryfs beside a plain local directory:
#
#   open  N files open at once (default 100000; every K-th created and
#         written, default every 2nd, the others made beforehand and read
#         while open), then closed and the written ones read back
#   dir   a directory of N entries (default 1000000) made with mknod, then
#         listed twice, each name exactly once
#
# For each workload and target: the time of each phase, ferry-mountd's and
# ferry-reconciler's VmRSS/VmHWM (peak) and open fds at each phase (for the
# plain directory: the workload's own), the kernel's slab, and the calls
# that failed, by errno. Each ferryfs workload gets a freshly formatted
# volume (so VmHWM is that workload's peak) and `ferry umount` waits for its
# uploads; the plain directory is on the same filesystem (--workdir).
#
# It reports; the integration test tests/integration/test_limits.c asserts
# (at CI sizes). Exit status 1 if a byte read back differed or a listing
# missed or doubled a name, 0 otherwise, whatever failed with an errno.
#
#   tests/bench/limits_scale.sh [--open-files N] [--write-every K]
#        [--dir-entries N] [--only open|dir] [--targets "ferryfs local"]
#        [--workdir DIR] [--build-dir DIR] [--no-build] [--keep]
#
# Needs root (FUSE mounts with allow_other). The workload raises its soft
# RLIMIT_NOFILE to the hard limit and spreads the open files over as many
# processes as that needs; ferry-mountd keeps the limit it inherits from
# this script (it does not raise its own). On a machine whose hard limit
# is 20000 (this one's), 50000 written files are more than ferry-mountd
# can hold: that is measured, not avoided (--write-every 10 fits).
set -euo pipefail

top=$(cd "$(dirname "$0")/../.." && pwd)
open_files=100000 write_every=2 dir_entries=1000000 only= targets="ferryfs local"
workdir=/var/tmp build=$top/build do_build=1 keep=0

die() { echo "limits_scale.sh: $*" >&2; exit 2; }
while [[ $# -gt 0 ]]; do
  case $1 in
    --open-files) open_files=${2:?}; shift ;;
    --write-every) write_every=${2:?}; shift ;;
    --dir-entries) dir_entries=${2:?}; shift ;;
    --only) only=${2:?}; shift ;;
    --targets) targets=${2:?}; shift ;;
    --workdir) workdir=${2:?}; shift ;;
    --build-dir) build=${2:?}; shift ;;
    --no-build) do_build=0 ;;
    --keep) keep=1 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed -e '/^set -euo/d' -e 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument $1" ;;
  esac
  shift
done
[[ $(id -u) = 0 ]] || die "needs root"
if [[ $do_build = 1 ]]; then
  cmake --build "$build" -j"$(nproc)" --target ferry ferry-mountd ferry-reconciler limits_scale \
    >/dev/null || die "build failed in $build"
fi
bin=$build/bin
for b in ferry ferry-mountd ferry-reconciler limits_scale; do
  [[ -x $bin/$b ]] || die "$bin/$b missing (build it, or --build-dir)"
done

scratch=$(mktemp -d "$workdir/ferry-limits.XXXXXX")
mnt=
cleanup() {
  if [[ -n $mnt ]] && grep -q " $mnt fuse" /proc/mounts; then
    "$bin/ferry" umount --timeout 600 "$mnt" >/dev/null 2>&1 || umount -l "$mnt" 2>/dev/null || true
  fi
  # a daemon of ours still running (a wedged one does not unmount)
  for p in $(pgrep -f "ferry-(mountd|reconciler) .*$scratch" || true); do kill -KILL "$p" 2>/dev/null || true; done
  if [[ $keep = 0 ]]; then rm -rf "$scratch"; else echo "kept $scratch"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "# limits_scale: $(date -u +%FT%TZ), $(uname -r), $(nproc) cpus, RLIMIT_NOFILE $(ulimit -Sn)/$(ulimit -Hn), fs.nr_open $(cat /proc/sys/fs/nr_open), workdir $workdir ($(findmnt -no FSTYPE -T "$workdir"))"

# run_one WORKLOAD TARGET N [args...]: prints the workload's lines, prefixed
run_one() {
  local what=$1 target=$2 n=$3; shift 3
  local dir out rc=0 pids=() t0 t1
  out=$scratch/$what-$target.out
  if [[ $target = ferryfs ]]; then
    local vol=$scratch/vol-$what cache=$scratch/cache-$what
    mnt=$scratch/mnt-$what
    mkdir -p "$vol" "$cache" "$mnt"
    "$bin/ferry" format "$vol" >/dev/null
    "$bin/ferry" mount --cache-dir "$cache" -o allow_other "$vol" "$mnt" >/dev/null
    local md rc_pid
    md=$(awk '$1 == "pid" {print $2}' "$mnt/.stats")
    rc_pid=$(pgrep -P "$md" -f ferry-reconciler | head -1 || true)
    pids=(--watch "$md")
    [[ -n $rc_pid ]] && pids+=(--watch "$rc_pid")
    dir=$mnt/w
    mkdir "$dir"
    local extra=()
    [[ $what = open ]] && extra=(--ok-file "$scratch/open-ok")
    "$bin/limits_scale" "$what" "$dir" "$n" "$@" "${pids[@]}" --stats "$mnt/.stats" "${extra[@]}" >"$out" 2>&1 || rc=$?
    t0=$(date +%s%N)
    if "$bin/ferry" umount --timeout 900 "$mnt" >>"$out" 2>&1; then
      t1=$(date +%s%N)
      echo "phase umount seconds $(( (t1 - t0) / 1000000000 )).$(printf %03d $(( (t1 - t0) / 1000000 % 1000 )))" >>"$out"
    else
      echo "umount failed: ferry-mountd $md $(grep -E 'VmRSS|Threads' /proc/$md/status 2>/dev/null | tr -s ' \t\n' ' ')fds $(ls /proc/$md/fd 2>/dev/null | wc -l)" >>"$out"
      # a daemon that cannot unmount itself: killed, mount detached; its
      # staging files are taken up at the next mount (checked below)
      kill -KILL "$md" 2>/dev/null || true
      sleep 1
      umount -l "$mnt" 2>/dev/null || true
      echo "after a restart: $("$bin/ferry" mount --cache-dir "$cache" -o allow_other "$vol" "$mnt" 2>&1 | tail -1)" >>"$out"
      if [[ $what = open ]]; then
        "$bin/limits_scale" check "$dir" "$n" --ok-file "$scratch/open-ok" >>"$out" 2>&1 || rc=1
      fi
      "$bin/ferry" umount --timeout 900 "$mnt" >>"$out" 2>&1 || umount -l "$mnt"
    fi
    grep -v ' info: ' "$vol/ferry-mountd.log" | sed -E 's/^[^ ]+ //; s/inode [0-9]+/inode N/g; s/\[[0-9]+\]//; s#[0-9]+-[0-9]+-[0-9]+-[0-9]+(\.p)?#STAGING#g; s#chunks/[^ :]*#CHUNK#g' |
      sort | uniq -c | sort -rn | head -8 | sed 's/^/daemon_log /' >>"$out" || true
    mnt=
  else
    dir=$scratch/local-$what
    mkdir "$dir"
    "$bin/limits_scale" "$what" "$dir" "$n" "$@" >"$out" 2>&1 || rc=$?
  fi
  sed "s/^/$what $target: /" "$out"
  echo "$what $target: exit $rc"
  return $rc
}

status=0
for t in $targets; do
  if [[ -z $only || $only = open ]]; then
    run_one open "$t" "$open_files" --write-every "$write_every" || status=1
    rm -rf "$scratch"/local-open "$scratch"/vol-open "$scratch"/cache-open
  fi
  if [[ -z $only || $only = dir ]]; then
    run_one dir "$t" "$dir_entries" || status=1
    rm -rf "$scratch"/local-dir "$scratch"/vol-dir "$scratch"/cache-dir
  fi
done

# Side by side: the figures that matter.
echo
echo "# summary"
for what in open dir; do
  for t in $targets; do
    f=$scratch/$what-$t.out
    [[ -f $f ]] || continue
    awk -v w="$what" -v t="$t" '
      $1 == "phase" { ph = ph sprintf(" %s %ss", $2, $4) }
      $1 == "sample" && $3 ~ /^ferry-mountd$/ { if ($9 > mfd) mfd = $9; mh = $7 }
      $1 == "sample" && $3 ~ /^ferry-reconcil/ { if ($9 > rfd) rfd = $9; rh = $7 }
      $1 == "sample" && $3 == "kernel" { if (s0 == "") s0 = $5; s1 = $5; if ($5 > smax) smax = $5 }
      $1 == "sample" && $3 == "workload" { wfd = $5 }
      $1 == "self" { self = $3 } $1 == "children" { kids = $3 }
      $1 == "failed" { $1 = ""; fl = fl " |" $0 }
      $1 == "check" { $1 = ""; ck = ck $0 }
      END {
        printf "%-4s %-8s%s\n", w, t, ph
        if (mh != "") printf "              ferry-mountd peak RSS %d MiB, most fds %d; ferry-reconciler peak RSS %d MiB, most fds %d\n", mh / 1024, mfd, rh / 1024, rfd
        printf "              workload peak RSS %d MiB (worker processes %d MiB)%s; kernel slab +%d MiB at most\n", self / 1024, kids / 1024, wfd != "" ? sprintf(", %d fds open in the workload", wfd) : "", (smax - s0) / 1024
        if (fl != "") printf "              failed:%s\n", fl
        if (ck != "") printf "              check:%s\n", ck
      }' "$f"
  done
done
[[ $keep = 1 ]] && echo "raw output in $scratch/*.out"
exit $status
