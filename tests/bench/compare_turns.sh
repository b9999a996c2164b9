#!/usr/bin/env bash
# Issue 10's two closest rows, in turns: `scripts/bench --suite compare`
# runs each column once, one after the other, and on this 2-core VM one git
# clone of the same repository swung by 10-15% from run to run, as did one
# fdatasync row, so a single run cannot tell parity from a lead. Here
# libfuse's passthrough_hp and ferryfs take turns for --rounds rounds on one
# fresh loop-mounted ext4 image (passthrough_hp's source directory, and
# ferryfs's staging, metadata and file:// objects, all on it), and the
# table gives every round and the medians:
#
#   git clone: `git clone -q --no-hardlinks` of a generated repository of
#     --files files (~2 KiB each, 50 to a directory, one pack), checkout
#     included, into a fresh mount of each (ferryfs with its defaults, its
#     uploads drained before the clone starts, not timed after it);
#   fdatasync: --sync-ops pairs of a 4 KiB pwrite() at a random offset and
#     fdatasync() into an existing 64 MiB file, opened again after it was
#     written and fdatasync'ed, and a sync() (ferryfs mounted -o fsync=local: durable on
#     the node, as passthrough_hp's; the default, fsync=remote, uploads at
#     each fdatasync and is not this row), median time per pair.
#
# Before each job, as in scripts/bench, sync(): the loop device flushes
# its whole backing file at each fdatasync, so a job would otherwise also
# pay for the writes of the one before it (ferryfs's clone writes each
# file twice, staging and file:// store, and its fdatasync pairs right
# after one ran 200-220 us against 155-175 after a sync).
#
#   tests/bench/compare_turns.sh [--files N] [--rounds R] [--sync-ops N]
#                                [--workdir DIR] [--build-dir DIR]
#
# Needs root, git, python3 and scripts/passthrough-hp's build of the example.
set -euo pipefail

top=$(cd "$(dirname "$0")/../.." && pwd)
files=10000 rounds=5 sync_ops=200 workdir=/var/tmp build=$top/build
while [[ $# -gt 0 ]]; do
  case $1 in
    --files) files=${2:?}; shift ;;
    --rounds) rounds=${2:?}; shift ;;
    --sync-ops) sync_ops=${2:?}; shift ;;
    --workdir) workdir=${2:?}; shift ;;
    --build-dir) build=${2:?}; shift ;;
    -h|--help) sed -n '2,30p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "compare_turns.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
[[ $(id -u) -eq 0 ]] || { echo "compare_turns.sh: needs root" >&2; exit 2; }
command -v git >/dev/null || { echo "compare_turns.sh: needs git" >&2; exit 2; }
ferry=$build/bin/ferry
[[ -x $ferry ]] || { echo "compare_turns.sh: no $ferry (build first)" >&2; exit 2; }
pthp=$("$top/scripts/passthrough-hp") || { echo "compare_turns.sh: no passthrough_hp" >&2; exit 1; }

# shellcheck source=tests/bench/loop_image.sh
. "$top/tests/bench/loop_image.sh"
loop_image "$workdir" ferry-turns "$((files * 2 * rounds))" 16
pmnt=$root/pthp-mnt pthp_pid=
mkdir -p "$pmnt"
pthp_stop() {
  if mountpoint -q "$pmnt"; then
    fusermount3 -u "$pmnt" 2>/dev/null || umount -l "$pmnt"
  fi
  [[ -n $pthp_pid ]] && wait "$pthp_pid" 2>/dev/null
  pthp_pid=
}
trap 'pthp_stop; loop_image_cleanup' EXIT
# A fresh source directory and mount per turn: passthrough_hp keeps an fd
# open for every inode the kernel knows, and two clones of 10,000 files
# pass the fd limit here (20,000).
pthp_start() { # src
  mkdir -p "$1"
  "$pthp" --foreground "$1" "$pmnt" >"$root/pthp.log" 2>&1 &
  pthp_pid=$!
  for _ in $(seq 100); do mountpoint -q "$pmnt" && return 0; sleep 0.05; done
  echo "compare_turns.sh: passthrough_hp did not mount" >&2
  exit 1
}
ferry_start() { # volume [-o ...]
  local vol=$1
  shift
  [[ -d $vol ]] || "$ferry" format "$vol" >/dev/null
  "$ferry" mount "$@" "$vol" "$mnt" >/dev/null
}
ferry_stop() { "$ferry" umount "$mnt" >/dev/null; }
now() { date +%s.%N; }

src=$scratch/repo
python3 - "$src" "$files" <<'EOF'
import os, random, sys
root, n = sys.argv[1], int(sys.argv[2])
r = random.Random(1)
for k in range(n):
    d = f"{root}/d{k // 50:04d}"
    os.makedirs(d, exist_ok=True)
    with open(f"{d}/f{k % 50:02d}.txt", "w") as f:
        f.write(r.randbytes(1024).hex())
EOF
git -C "$src" init -q
git -C "$src" add -A
git -C "$src" -c gc.auto=0 -c user.name=bench -c user.email=bench@localhost commit -qm files
git -C "$src" repack -adq

# The fdatasync job: opens the file again (no O_TRUNC) and times each pair;
# prints the median in microseconds.
sync_job() { # file
  python3 - "$1" "$sync_ops" <<'EOF'
import os, random, statistics, sys, time
path, n = sys.argv[1], int(sys.argv[2])
size = 64 << 20
fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
if os.fstat(fd).st_size != size:
    for off in range(0, size, 1 << 20):
        os.pwrite(fd, os.urandom(1 << 20), off)
    os.fdatasync(fd)
os.close(fd)
fd = os.open(path, os.O_WRONLY)
# (ferryfs's open copies the file into a passthrough staging file after
# its upload: written back now, not during the first timed pairs)
os.sync()
r = random.Random(2)
buf = os.urandom(4096)
t = []
for _ in range(n):
    off = r.randrange(size // 4096) * 4096
    t0 = time.perf_counter()
    os.pwrite(fd, buf, off)
    os.fdatasync(fd)
    t.append(time.perf_counter() - t0)
os.close(fd)
print(f"{statistics.median(t) * 1e6:.0f}")
EOF
}

median() { tr ' ' '\n' <<<"$1" | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
declare -A R
add() { R[$1]="${R[$1]:+${R[$1]} }$2"; }
echo "compare_turns: $files-file git clone and $sync_ops x (4 KiB pwrite + fdatasync), $rounds rounds in turns"
echo "kernel $(uname -r), $(nproc) CPUs, commit $(git -C "$top" rev-parse --short HEAD 2>/dev/null || echo '?'), passthrough_hp $pthp"
for ((r = 1; r <= rounds; r++)); do
  # Who goes first alternates: the second of a pair runs on a disk the
  # first just wrote to.
  for who in $( ((r % 2)) && echo "pthp ferry" || echo "ferry pthp"); do
    sync
    if [[ $who == pthp ]]; then
      pthp_start "$scratch/pthp-src-$r"
      t0=$(now); git clone -q --no-hardlinks "$src" "$pmnt/clone"; t1=$(now)
      add clone.pthp "$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }')"
      sync
      add sync.pthp "$(sync_job "$pmnt/sync")"
      pthp_stop
    else
      ferry_start "$scratch/vol-$r"
      "$ferry" drain "$mnt" >/dev/null
      t0=$(now); git clone -q --no-hardlinks "$src" "$mnt/clone"; t1=$(now)
      add clone.ferry "$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }')"
      ferry_stop
      ferry_start "$scratch/vol-$r" -o fsync=local
      sync
      add sync.ferry "$(sync_job "$mnt/sync")"
      ferry_stop
    fi
  done
  echo "  round $r: git clone ${R[clone.pthp]##* } s / ${R[clone.ferry]##* } s," \
    "fdatasync ${R[sync.pthp]##* } us / ${R[sync.ferry]##* } us (passthrough_hp / ferryfs)"
done
cp=$(median "${R[clone.pthp]}") cf=$(median "${R[clone.ferry]}")
sp=$(median "${R[sync.pthp]}") sf=$(median "${R[sync.ferry]}")
printf '  %-48s %14s %10s %16s\n' "median of $rounds rounds" passthrough_hp ferryfs "ferryfs/pthp"
printf '  %-48s %14s %10s %16s\n' "git clone + checkout, $files files (s)" "$cp" "$cf" \
  "$(awk -v a="$cf" -v b="$cp" 'BEGIN { printf "%.2f", a / b }')"
printf '  %-48s %14s %10s %16s\n' "4 KiB pwrite + fdatasync, fsync=local (us)" "$sp" "$sf" \
  "$(awk -v a="$sf" -v b="$sp" 'BEGIN { printf "%.2f", a / b }')"
echo "  (times: lower is better; a ratio below 1.00 is ferryfs ahead)"
echo "  rounds: clone ${R[clone.pthp]} / ${R[clone.ferry]}; fdatasync ${R[sync.pthp]} / ${R[sync.ferry]}"
