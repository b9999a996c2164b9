# Sourced by the benchmarks in tests/bench: a fresh ext4 image, loop-mounted
# under a temporary directory of its own, that holds everything a run
# writes (the plain copy, ferryfs's staging, metadata and file:// objects),
# and is unmounted and removed when the script exits, whatever happened.
#
#   loop_image WORKDIR NAME FILES [GIB]
#
# makes WORKDIR/NAME.XXXXXX (a GIB GiB image, default 8, sparse; inodes for
# 3 x FILES and room:
# the default, one per 16 KiB, runs out near 500,000 files) and sets root,
# img, scratch (the mounted file system) and mnt (an empty directory for a
# FUSE mount, unmounted with $ferry at exit).

loop_image() {
  root=$(mktemp -d "$1/$2.XXXXXX")
  img=$root/scratch.img scratch=$root/scratch mnt=$root/mnt
  trap loop_image_cleanup EXIT
  truncate -s "${4:-8}G" "$img"
  mkfs.ext4 -q -F -N $(($3 * 3 + 65536)) "$img"
  mkdir -p "$scratch" "$mnt"
  mount -o loop "$img" "$scratch"
}

loop_image_cleanup() {
  local rc=$? log
  set +e
  mountpoint -q "$mnt" && "$ferry" umount "$mnt" >/dev/null 2>&1
  mountpoint -q "$mnt" && umount -l "$mnt"
  # A run that failed shows the daemons' warnings and errors before their
  # logs go with the image (FERRY_BENCH_KEEP_LOG=PREFIX keeps a copy of
  # each as PREFIX.<name>).
  if [[ $rc -ne 0 ]]; then
    for log in "$scratch"/vol/ferry-*.log; do
      [[ -f $log ]] || continue
      echo "--- warnings and errors in $log ---" >&2
      grep -v ' info: ' "$log" | tail -n 30 >&2
      [[ -n ${FERRY_BENCH_KEEP_LOG:-} ]] && cp "$log" "$FERRY_BENCH_KEEP_LOG.$(basename "$log")"
    done
  fi
  mountpoint -q "$scratch" && umount "$scratch"
  rm -rf "$root"
}
