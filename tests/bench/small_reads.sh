#!/usr/bin/env bash
# Small-file reads, the case where passthrough on a read-cache file could
# help: --files files of --file-size bytes (each one object), each opened,
# read whole and closed, in one loop, on ext4 itself, on libfuse's
# passthrough_hp over it (which opens every file in passthrough) and on
# ferryfs (file:// objects, every file committed and in the read cache,
# remounted so each read goes through the read path), on one fresh loop
# ext4. "cold": after drop_caches (ferryfs: after a remount too); "warm":
# the same loop again. Prints microseconds per file and ferryfs's ratios.
#
#   tests/bench/small_reads.sh [--files N] [--file-size BYTES] [--workdir DIR]
#                              [--build-dir DIR]
#
# Needs root (loop mount, FUSE mounts, drop_caches).
set -euo pipefail

top=$(cd "$(dirname "$0")/../.." && pwd)
files=5000 size=2048 workdir=/var/tmp build=$top/build
while [[ $# -gt 0 ]]; do
  case $1 in
    --files) files=${2:?}; shift ;;
    --file-size) size=${2:?}; shift ;;
    --workdir) workdir=${2:?}; shift ;;
    --build-dir) build=${2:?}; shift ;;
    -h|--help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "small_reads.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
[[ $(id -u) -eq 0 ]] || { echo "small_reads.sh: needs root" >&2; exit 2; }
ferry=$build/bin/ferry
[[ -x $ferry ]] || { echo "small_reads.sh: no $ferry (build first)" >&2; exit 2; }

# shellcheck source=tests/bench/loop_image.sh
. "$top/tests/bench/loop_image.sh"
loop_image "$workdir" ferry-smallreads "$files"

drop() { sync; echo 3 > /proc/sys/vm/drop_caches; }
declare -A R
# make_files DIR: the files, 50 to a directory.
make_files() {
  python3 - "$1" "$files" "$size" <<'EOF'
import os, sys
root, n, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for i in range(n):
    d = os.path.join(root, "d%03d" % (i // 50))
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "f%05d" % i), "wb") as f:
        f.write(os.urandom(size))
EOF
}
# read_loop TARGET ROW DIR: open + read whole + close of every file, in
# microseconds per file.
read_loop() {
  R[$1.$2]=$(python3 - "$3" "$files" "$size" <<'EOF'
import os, sys, time
root, n, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
paths = [os.path.join(root, "d%03d" % (i // 50), "f%05d" % i) for i in range(n)]
for p in paths:            # names resolved first: the loop times the reads
    os.stat(p)
t = time.monotonic()
for p in paths:
    fd = os.open(p, os.O_RDONLY)
    if len(os.read(fd, size + 1)) != size:
        sys.exit("short read of " + p)
    os.close(fd)
print("%.1f" % ((time.monotonic() - t) * 1e6 / n))
EOF
)
  printf '  %-8s %-6s %8s us/file\n' "$1" "$2" "${R[$1.$2]}"
}

echo "small-file reads: $files files of $size bytes, open + read + close each; ext4 on a fresh loop image"
echo "kernel $(uname -r), $(nproc) CPUs, commit $(git -C "$top" rev-parse --short HEAD 2>/dev/null || echo '?')"

mkdir -p "$scratch/plain"
make_files "$scratch/plain"
drop; read_loop ext4 cold "$scratch/plain"
read_loop ext4 warm "$scratch/plain"

pthp=$("$top/scripts/passthrough-hp" 2>/dev/null || true)
if [[ -n $pthp ]]; then
  ("$pthp" --foreground "$scratch/plain" "$mnt" >"$root/pthp.log" 2>&1) &
  for _ in $(seq 100); do mountpoint -q "$mnt" && break; sleep 0.05; done
  mountpoint -q "$mnt" || { echo "small_reads.sh: passthrough_hp did not mount" >&2; exit 1; }
  drop; read_loop pthp cold "$mnt"
  read_loop pthp warm "$mnt"
  umount "$mnt"
  wait
fi

mkdir -p "$scratch/objs" "$scratch/staging" "$scratch/cache"
"$ferry" format --storage "file://$scratch/objs" "$scratch/vol" >/dev/null
mnt_ferry() { "$ferry" mount --staging-dir "$scratch/staging" --cache-dir "$scratch/cache" \
  "$scratch/vol" "$mnt" >/dev/null; }
stat_of() { awk -v k="$1" '$1 == k { print $2 }' "$mnt/.stats"; }
mnt_ferry
make_files "$mnt"
until [[ $(stat_of reconcile_inflight) == 0 && $(stat_of reconcile_handed_inflight) == 0 ]]; do
  sleep 0.1
done
# Every file read once through the read path, so every object is cached.
"$ferry" umount "$mnt" >/dev/null; mnt_ferry
cat "$mnt"/d*/f* > /dev/null
"$ferry" umount "$mnt" >/dev/null; mnt_ferry
drop; read_loop ferryfs cold "$mnt"
read_loop ferryfs warm "$mnt"
echo "  (ferryfs: $(stat_of cache_misses) objects fetched from the store, $(stat_of spliced_reads) READs spliced)"
"$ferry" umount "$mnt" >/dev/null

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2fx", a / b; else printf "-" }'; }
echo
printf '  %-6s %10s %10s %10s %11s %11s\n' row ext4 pthp ferryfs "ferry/ext4" "ferry/pthp"
for row in cold warm; do
  printf '  %-6s %10s %10s %10s %11s %11s\n' "$row" "${R[ext4.$row]}" "${R[pthp.$row]:--}" \
    "${R[ferryfs.$row]}" "$(ratio "${R[ferryfs.$row]}" "${R[ext4.$row]}")" \
    "$(ratio "${R[ferryfs.$row]}" "${R[pthp.$row]:-0}")"
done
echo "  (microseconds per file, lower is better; ratios above 1 are slower)"
