#!/usr/bin/env bash
# Issue 11's in-flight read case: `git status` right after a checkout of
# --files files (2 KiB each) onto a ferryfs volume on a local S3 server
# (scripts/s3-server), while the uploads of that checkout are still going
# on, beside the same on a plain directory, in one run. git status reads
# the index and stats every file (and reads the ones whose stat changed):
# on ferryfs those reads must come from the staging files, never wait for
# an upload. Prints both times and how many uploads were still in flight
# when git status started and ended.
#
#   tests/bench/s3_git_status.sh [--files N] [--build-dir DIR]
#
# Needs root (FUSE mount), git and the bootstrap's s3rver.
set -euo pipefail

top=$(cd "$(dirname "$0")/../.." && pwd)
files=2000 build=$top/build
while [[ $# -gt 0 ]]; do
  case $1 in
    --files) files=${2:?}; shift ;;
    --build-dir) build=${2:?}; shift ;;
    -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "s3_git_status.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
[[ $(id -u) -eq 0 ]] || { echo "s3_git_status.sh: needs root" >&2; exit 2; }
ferry=$build/bin/ferry
[[ -x $ferry ]] || { echo "s3_git_status.sh: no $ferry (build first)" >&2; exit 2; }
command -v git >/dev/null || { echo "s3_git_status.sh: needs git" >&2; exit 2; }

# shellcheck source=tests/bench/s3_scratch.sh
. "$top/tests/bench/s3_scratch.sh"
s3_scratch /var/tmp ferry-s3git
mkdir -p "$root/repo" "$root/plain"

# The repository: --files files of 2 KiB, 50 to a directory, one commit.
python3 - "$root/repo" "$files" <<'EOF'
import os, sys
root, n = sys.argv[1], int(sys.argv[2])
for i in range(n):
    d = os.path.join(root, "d%03d" % (i // 50))
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "f%05d.txt" % i), "wb") as f:
        f.write(os.urandom(1024).hex().encode())
EOF
git -C "$root/repo" init -q
git -C "$root/repo" add -A
git -C "$root/repo" -c user.name=bench -c user.email=bench@localhost commit -qm files

now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", b - a }'; }
stat_of() { awk -v k="$1" '$1 == k { print $2 }' "$mnt/.stats"; }

echo "git status right after a checkout of $files files of 2 KiB; kernel $(uname -r), $(nproc) CPUs, commit $(git -C "$top" rev-parse --short HEAD 2>/dev/null || echo '?')"

t0=$(now); git clone -q "$root/repo" "$root/plain/w"; t1=$(now)
out=$(git -C "$root/plain/w" status --porcelain); t2=$(now)
[[ -z $out ]] || { echo "s3_git_status.sh: plain checkout not clean" >&2; exit 1; }
printf '  %-8s clone %6s s   status %6s s\n' plain "$(secs "$t0" "$t1")" "$(secs "$t1" "$t2")"

"$ferry" format --storage "s3://$FERRY_TEST_S3_HOSTPORT/$FERRY_TEST_S3_BUCKET/git" --s3-http \
  "$root/vol" >/dev/null
"$ferry" mount --staging-dir "$root/staging" --cache-dir "$root/cache" "$root/vol" "$mnt" >/dev/null
t0=$(now); git clone -q "$root/repo" "$mnt/w"; t1=$(now)
before=$(stat_of reconcile_inflight)
out=$(git -C "$mnt/w" status --porcelain); t2=$(now)
after=$(stat_of reconcile_inflight)
[[ -z $out ]] || { echo "s3_git_status.sh: ferryfs checkout not clean: $out" >&2; exit 1; }
printf '  %-8s clone %6s s   status %6s s   (uploads in flight: %s at the start of status, %s at its end; %s reads from staging files)\n' \
  ferryfs "$(secs "$t0" "$t1")" "$(secs "$t1" "$t2")" "$before" "$after" "$(stat_of inflight_reads)"
