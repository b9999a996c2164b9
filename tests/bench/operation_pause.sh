#!/usr/bin/env bash
# The pause an operator's command costs applications: `ferry mount
# --upgrade`, `ferry drain` and `ferry checkpoint` on a live mount. Three
# threads run on a fresh mount: one doing 4 KiB pwrite+pread on a file it
# holds open (passthrough: the kernel does the I/O on the staging file),
# one creating, writing, closing and stat-ing small files (every step a
# FUSE request), and one writing 1 MiB files (uploads for a drain or a
# checkpoint to wait for). After 1 s the command runs, and 1 s after it
# returns all stop. Per thread it prints the slowest operation before the
# command (the baseline, same run) and overall, and the command's own
# figures. Each operation runs --rounds times (default 3).
#
#   tests/bench/operation_pause.sh [--op upgrade|drain|checkpoint|all]
#                                  [--rounds N] [--workdir DIR] [--build-dir DIR]
#
# Needs root (a plain mount).
set -euo pipefail

top=$(cd "$(dirname "$0")/../.." && pwd)
build=$top/build
rounds=3
ops="upgrade drain checkpoint"
work=
while [ $# -gt 0 ]; do
  case $1 in
    --op) [ "$2" = all ] || ops=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --workdir) work=$2; shift 2 ;;
    --build-dir) build=$2; shift 2 ;;
    *) echo "usage: $0 [--op upgrade|drain|checkpoint|all] [--rounds N] [--workdir DIR] [--build-dir DIR]" >&2
       exit 2 ;;
  esac
done
ferry=$build/bin/ferry
work=${work:-$(mktemp -d /tmp/ferry-pause-bench.XXXXXX)}
mkdir -p "$work/mnt"
cleanup() {
  timeout 60 "$ferry" umount "$work/mnt" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
"$ferry" format --force "$work/vol" >/dev/null
"$ferry" mount "$work/vol" "$work/mnt" >/dev/null
for op in $ops; do
  for round in $(seq "$rounds"); do
    case $op in
      upgrade) cmd=("$ferry" mount --upgrade "$work/mnt") ;;
      drain) cmd=("$ferry" drain "$work/mnt") ;;
      checkpoint) cmd=("$ferry" checkpoint "$work/mnt" "bench-$round") ;;
      *) echo "$0: unknown --op $op" >&2; exit 2 ;;
    esac
    timeout 300 python3 - "$work/mnt" "$op" "${cmd[@]}" <<'PY'
import os, sys, time, threading, subprocess
m, op, cmd = sys.argv[1], sys.argv[2], sys.argv[3:]
stop = False
names = ("io", "meta", "big")
worst = dict.fromkeys(names, 0.0)
counts = dict.fromkeys(names, 0)
def timed(name, fn):
    t = time.monotonic(); fn()
    worst[name] = max(worst[name], time.monotonic() - t); counts[name] += 1
def io():
    fd = os.open(m + "/loop.bin", os.O_CREAT | os.O_RDWR, 0o644)
    buf = b"x" * 4096
    k = 0
    while not stop:
        timed("io", lambda: (os.pwrite(fd, buf, (k % 256) * 4096), os.pread(fd, 4096, 0)))
        k += 1
    os.close(fd)
def meta():
    k = 0
    while not stop:
        p = "%s/f%d" % (m, k % 100)
        def one():
            with open(p, "w") as f: f.write("y")
            os.stat(p)
        timed("meta", one); k += 1
def big():
    k = 0
    data = os.urandom(1 << 20)
    while not stop:
        p = "%s/big%d" % (m, k % 64)
        def one():
            with open(p, "wb") as f: f.write(data)
        timed("big", one); k += 1
ts = [threading.Thread(target=f) for f in (io, meta, big)]
[t.start() for t in ts]
time.sleep(1)
before = dict(worst)
t0 = time.monotonic()
r = subprocess.run(cmd, capture_output=True, text=True)
took = time.monotonic() - t0
time.sleep(1)
stop = True
[t.join() for t in ts]
out = (r.stdout.strip() or r.stderr.strip()).splitlines()
print("%s (exit %d, %.0f ms): %s" % (op, r.returncode, took * 1e3, out[-1] if out else ""))
print("  slowest op before it / overall: io %.1f / %.1f ms (passthrough pwrite+pread), "
      "meta %.1f / %.1f ms (create+write+close+stat), big %.1f / %.1f ms (1 MiB file); ops %s"
      % (before["io"] * 1e3, worst["io"] * 1e3, before["meta"] * 1e3, worst["meta"] * 1e3,
         before["big"] * 1e3, worst["big"] * 1e3, counts))
sys.exit(r.returncode)
PY
  done
done
