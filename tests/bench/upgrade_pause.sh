#!/usr/bin/env bash
# The pause `ferry mount --upgrade` costs applications: two threads run on
# a fresh mount, one doing 4 KiB pwrite+pread on a file it holds open
# (passthrough: the kernel does the I/O on the staging file), one creating,
# writing, closing and stat-ing small files (every step a FUSE request);
# after 1 s the mount is upgraded, and 1 s later both stop. It prints the
# CLI's own figure and, per thread, the slowest operation before the upgrade
# (the baseline, same run) and overall. Runs --rounds times (default 3).
#
#   tests/bench/upgrade_pause.sh [--rounds N] [--workdir DIR] [--build-dir DIR]
#
# Needs root (a plain mount).
set -euo pipefail

top=$(cd "$(dirname "$0")/../.." && pwd)
build=$top/build
rounds=3
work=
while [ $# -gt 0 ]; do
  case $1 in
    --rounds) rounds=$2; shift 2 ;;
    --workdir) work=$2; shift 2 ;;
    --build-dir) build=$2; shift 2 ;;
    *) echo "usage: $0 [--rounds N] [--workdir DIR] [--build-dir DIR]" >&2; exit 2 ;;
  esac
done
ferry=$build/bin/ferry
work=${work:-$(mktemp -d /tmp/ferry-upgrade-bench.XXXXXX)}
mkdir -p "$work/mnt"
cleanup() {
  timeout 60 "$ferry" umount "$work/mnt" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
"$ferry" format --force "$work/vol" >/dev/null
"$ferry" mount "$work/vol" "$work/mnt" >/dev/null
for _ in $(seq "$rounds"); do
  timeout 300 python3 - "$work/mnt" "$ferry" <<'PY'
import os, sys, time, threading, subprocess
m = sys.argv[1]
stop = False
worst = {"io": 0.0, "meta": 0.0}
counts = {"io": 0, "meta": 0}
def io():
    fd = os.open(m + "/loop.bin", os.O_CREAT | os.O_RDWR, 0o644)
    buf = b"x" * 4096
    k = 0
    while not stop:
        t = time.monotonic(); os.pwrite(fd, buf, (k % 256) * 4096); os.pread(fd, 4096, 0)
        worst["io"] = max(worst["io"], time.monotonic() - t); counts["io"] += 1; k += 1
    os.close(fd)
def meta():
    k = 0
    while not stop:
        t = time.monotonic(); p = "%s/f%d" % (m, k % 100)
        with open(p, "w") as f: f.write("y")
        os.stat(p)
        worst["meta"] = max(worst["meta"], time.monotonic() - t); counts["meta"] += 1; k += 1
ts = [threading.Thread(target=io), threading.Thread(target=meta)]
[t.start() for t in ts]
time.sleep(1)
before = dict(worst)
r = subprocess.run([sys.argv[2], "mount", "--upgrade", m], capture_output=True, text=True)
time.sleep(1)
stop = True
[t.join() for t in ts]
print(r.stdout.strip() or r.stderr.strip())
print("worst op before the upgrade: io %.1f ms, meta %.1f ms; worst overall: io %.1f ms (passthrough pwrite+pread), meta %.1f ms (create+write+close+stat); ops %s" % (before["io"]*1e3, before["meta"]*1e3, worst["io"]*1e3, worst["meta"]*1e3, counts))
sys.exit(r.returncode)
PY
done
