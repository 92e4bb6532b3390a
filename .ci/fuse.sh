#!/usr/bin/env bash
# Makes sure fusermount3 (Debian's fuse3 package) is installed, for the
# power-loss test (tests/it/power_loss.rs): it mounts a FUSE filesystem that
# runs inside the test binary (no libfuse is linked, so no headers are
# needed) and unmounts it through fusermount3 if the test dies. The kernel's
# /dev/fuse must be there too.
set -euo pipefail
if ! command -v fusermount3 >/dev/null 2>&1; then
  echo "installing fuse3 (Debian's package)" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq fuse3 >&2
fi
if [ ! -c /dev/fuse ]; then
  echo "/dev/fuse is missing: load the kernel's fuse module (modprobe fuse)" >&2
  exit 1
fi
fusermount3 --version
