#!/usr/bin/env bash
# Prints the path of a `sessionstore` binary built from the previous release
# (the commit below), for the rolling-upgrade tests: the old binary serving
# beside the new one on one database. Built once and cached:
#   ${SESSIONSTORE_PREVIOUS_RELEASE_CACHE:-$HOME/.cache/sessionstore/previous-release}/<commit>/sessionstore
# The source is `git archive` of that commit from this repository, so a
# shallow clone that lacks it fails here, saying so. Progress goes to stderr;
# stdout holds the path alone.
set -euo pipefail

commit=647c5088366accfeec1ce6918cf32728ff8586ea

repo="$(cd "$(dirname "$0")/.." && pwd)"
cache_root="${SESSIONSTORE_PREVIOUS_RELEASE_CACHE:-$HOME/.cache/sessionstore/previous-release}"
cache="$cache_root/$commit"
binary="$cache/sessionstore"

say() { echo "previous-release: $*" >&2; }

if [ -x "$binary" ]; then
  echo "$binary"
  exit 0
fi

if ! git -C "$repo" cat-file -e "$commit^{commit}" 2>/dev/null; then
  say "commit $commit (the previous release) is not in $repo."
  say "A shallow clone lacks it: run 'git fetch --unshallow' (or fetch that commit) and try again."
  exit 1
fi

mkdir -p "$cache"
# One build at a time: a second caller waits here, then finds the binary.
exec 9>"$cache/.lock"
flock 9
if [ -x "$binary" ]; then
  echo "$binary"
  exit 0
fi

src="$(mktemp -d "$cache/src.XXXXXX")"
build="$cache/target"
cleanup() { rm -rf "$src"; }
trap cleanup EXIT

say "building sessionstore at $commit into $build (once; cached afterwards)"
started=$(date +%s)
git -C "$repo" archive --format=tar "$commit" | tar -x -C "$src"
# The build script stamps the version from git: keep it from finding a
# repository above the extracted source (a cache inside a checkout would
# otherwise stamp that checkout's HEAD).
(
  cd "$src"
  GIT_CEILING_DIRECTORIES="$cache" CARGO_TARGET_DIR="$build" \
    cargo build --locked -p sessionstore-server --bin sessionstore
) >&2

tmp="$cache/sessionstore.tmp.$$"
cp "$build/debug/sessionstore" "$tmp"
chmod 0755 "$tmp"
mv -f "$tmp" "$binary"
rm -rf "$build"
say "built $binary in $(($(date +%s) - started)) s"
echo "$binary"
