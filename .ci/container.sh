#!/usr/bin/env bash
# Makes sure podman (and runc, the OCI runtime the container test uses) are
# installed, from Debian's packages, for tests/it/deploy.rs. No registry
# is needed: the image is built FROM scratch (deploy/container/).
set -euo pipefail
missing=()
command -v podman >/dev/null 2>&1 || missing+=(podman)
command -v runc >/dev/null 2>&1 || missing+=(runc)
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing ${missing[*]} (Debian's packages)" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq "${missing[@]}" >&2
fi
podman --version
