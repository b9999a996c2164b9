#!/usr/bin/env bash
# Where a writer's time goes, per FUSE request: the small-file loop
# (open(O_CREAT) + write 2 KiB + close, N files) on ferryfs and on libfuse's
# passthrough_hp, both over one fresh loop-mounted ext4 image (ferryfs's
# staging directory, metadata and file:// objects on it too, or the objects
# on tmpfs with --objects-tmpfs), while `perf sched record` watches the whole
# machine. For each target it prints, per kind of request the writer waited
# for (the kernel function that sent it: fuse_create_open, fuse_lookup_name,
# fuse_do_getattr, fuse_getxattr...), how many, the average time the writer
# was off the CPU for one, and how much of that it spent runnable but not
# running (scheduling delay); then the writer's own CPU time per file.
#
#   tests/bench/request_wait.sh [--files N] [--objects-tmpfs] [--workdir DIR]
#                               [--build-dir DIR]
#
# Needs root and perf (Debian: linux-perf). passthrough_hp comes from
# scripts/passthrough-hp (its column is left out if that cannot build it).
set -euo pipefail

top=$(cd "$(dirname "$0")/../.." && pwd)
files=4000 workdir=/var/tmp build=$top/build objs_tmpfs=0
while [[ $# -gt 0 ]]; do
  case $1 in
    --files) files=${2:?}; shift ;;
    --objects-tmpfs) objs_tmpfs=1 ;;
    --workdir) workdir=${2:?}; shift ;;
    --build-dir) build=${2:?}; shift ;;
    -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "request_wait.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
[[ $(id -u) -eq 0 ]] || { echo "request_wait.sh: needs root" >&2; exit 2; }
command -v perf >/dev/null || { echo "request_wait.sh: needs perf (apt-get install linux-perf)" >&2; exit 2; }
ferry=$build/bin/ferry
[[ -x $ferry ]] || { echo "request_wait.sh: no $ferry (build first)" >&2; exit 2; }
pthp=$("$top/scripts/passthrough-hp" 2>/dev/null || true)

root=$(mktemp -d "$workdir/ferry-reqwait.XXXXXX")
img=$root/scratch.img scratch=$root/scratch mnt=$root/mnt pmnt=$root/pthp-mnt
objs=$scratch/objs
cleanup() {
  set +e
  mountpoint -q "$mnt" && "$ferry" umount "$mnt" >/dev/null 2>&1
  mountpoint -q "$mnt" && umount -l "$mnt"
  mountpoint -q "$pmnt" && umount "$pmnt"
  mountpoint -q "$root/objs-tmpfs" && umount "$root/objs-tmpfs"
  mountpoint -q "$scratch" && umount "$scratch"
  rm -rf "$root"
}
trap cleanup EXIT
truncate -s 8G "$img"
mkfs.ext4 -q -F "$img"
mkdir -p "$scratch" "$mnt" "$pmnt"
mount -o loop "$img" "$scratch"
if [[ $objs_tmpfs -eq 1 ]]; then
  mkdir -p "$root/objs-tmpfs"
  mount -t tmpfs -o size=2g tmpfs "$root/objs-tmpfs"
  objs=$root/objs-tmpfs/objs
fi
mkdir -p "$objs" "$scratch/staging" "$scratch/cache" "$scratch/pthp-src"

# The loop, as a process whose pid goes to $2 before it starts timing.
loop() { # dir pidfile
  python3 - "$1" "$files" "$2" <<'PY'
import os, sys, time
d, n, pidfile = sys.argv[1], int(sys.argv[2]), sys.argv[3]
os.makedirs(d, exist_ok=True)
open(pidfile, "w").write(str(os.getpid()))
time.sleep(1)  # perf starts meanwhile
body = b"x" * 2048
t = time.time()
for i in range(n):
    fd = os.open(f"{d}/f{i:07d}", os.O_CREAT | os.O_WRONLY, 0o644)
    os.write(fd, body)
    os.close(fd)
print("%.1f" % ((time.time() - t) / n * 1e6))
PY
}

# Runs the loop in dir under perf; prints the table for target name.
measure() { # name dir
  local name=$1 dir=$2 pidf=$root/loop.pid out=$root/loop.out lp us
  rm -f "$pidf"
  loop "$dir" "$pidf" > "$out" &
  lp=$!
  while [[ ! -s $pidf ]]; do sleep 0.1; done
  # Long enough for the whole loop at 2 ms per file, the first second idle.
  perf sched record -g -o "$root/perf.data" -- sleep "$(( files / 500 + 2 ))" >/dev/null 2>&1 &
  wait "$lp"
  us=$(cat "$out")
  wait
  echo "== $name: ${us} us per file (create + write 2 KiB + close)"
  perf sched timehist -i "$root/perf.data" -g --state -p "$(cat "$pidf")" 2>/dev/null |
    python3 -c '
import re, sys, collections
files = int(sys.argv[1])
last = None
wait, n, delay = collections.Counter(), collections.Counter(), collections.Counter()
run = 0.0
for line in sys.stdin:
    m = re.match(r"\s*[\d.]+\s+\[\d+\]\s+\S+\[\d+(?:/\d+)?\]\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+\S+\s*(.*)", line)
    if not m:
        continue
    w, s, r, chain = float(m.group(1)), float(m.group(2)), float(m.group(3)), m.group(4)
    run += r
    # The wait before this run belongs to where the last run ended.
    if last:
        wait[last] += w; n[last] += 1; delay[last] += s
    frames = [f for f in chain.split(" <- ") if f.startswith("fuse_")
              and not f.startswith("fuse_simple") and f != "fuse_request_send"]
    last = frames[0] if frames else "(not a FUSE request: " + chain.split(" <- ")[0] + ")"
print("  %-40s %8s %12s %14s" % ("waited in", "count", "us each", "of it runnable"))
for k, v in wait.most_common(6):
    print("  %-40s %8d %12.1f %14.1f" % (k, n[k], v * 1000 / n[k], delay[k] * 1000 / n[k]))
print("  the writer on the CPU: %.1f us per file (python, system calls, passthrough writes)" % (run * 1000 / files))
' "$files"
}

echo "request wait: $files files; ext4 on a fresh loop image; objects $([[ $objs_tmpfs -eq 1 ]] && echo "on tmpfs" || echo "on the image")"
echo "kernel $(uname -r), $(nproc) CPUs, commit $(git -C "$top" rev-parse --short HEAD 2>/dev/null || echo '?')"
"$ferry" format --storage "file://$objs" "$scratch/vol" >/dev/null
"$ferry" mount --staging-dir "$scratch/staging" --cache-dir "$scratch/cache" "$scratch/vol" "$mnt" >/dev/null
measure ferryfs "$mnt/d"
"$ferry" umount "$mnt" >/dev/null
if [[ -n $pthp ]]; then
  "$pthp" "$scratch/pthp-src" "$pmnt"
  measure passthrough_hp "$pmnt/d"
  umount "$pmnt"
else
  echo "== passthrough_hp: left out (scripts/passthrough-hp could not build it)"
fi
