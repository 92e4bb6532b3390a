#!/usr/bin/env bash
# Builds the sessionstore image: a release build, its root staged by
# stage.sh, then `docker build` (or `podman build`: ENGINE=podman).
#   deploy/container/build.sh [TAG]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
tag="${1:-sessionstore}"
engine="${ENGINE:-docker}"
cargo build --release --locked -p sessionstore-server --bin sessionstore \
  --manifest-path "$here/../../Cargo.toml"
context="$(mktemp -d)"
trap 'rm -rf "$context"' EXIT
"$here/stage.sh" "$here/../../target/release/sessionstore" "$context/root" >/dev/null
cp "$here/Containerfile" "$context/Containerfile"
# docker format: OCI images cannot carry the HEALTHCHECK.
if [ "$engine" = podman ]; then
  podman build --format docker -t "$tag" -f "$context/Containerfile" "$context"
else
  docker build -t "$tag" -f "$context/Containerfile" "$context"
fi
