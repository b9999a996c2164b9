# shellcheck shell=bash disable=SC2154  # top and ferry are the sourcing script's
# Sourced by the S3 benchmarks in tests/bench: a temporary directory of its
# own with a local S3 server (scripts/s3-server) running from it, both gone
# when the script exits, whatever happened (a ferryfs mount at $mnt is
# unmounted with $ferry first).
#
#   s3_scratch WORKDIR NAME
#
# makes WORKDIR/NAME.XXXXXX and sets root, mnt (an empty directory for a
# FUSE mount) and the server's FERRY_TEST_S3_* and AWS_* variables.

s3_scratch() {
  root=$(mktemp -d "$1/$2.XXXXXX")
  mnt=$root/mnt
  trap s3_scratch_cleanup EXIT
  mkdir -p "$mnt" "$root/s3"
  eval "$("$top/scripts/s3-server" start "$root/s3")"
}

s3_scratch_cleanup() {
  set +e
  mountpoint -q "$mnt" && "$ferry" umount "$mnt" >/dev/null 2>&1
  "$top/scripts/s3-server" stop "$root/s3" >/dev/null 2>&1
  rm -rf "$root"
}
