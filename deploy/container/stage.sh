#!/usr/bin/env bash
# Stages the image's root for Containerfile: the sessionstore binary given
# (default target/release/sessionstore), the shared libraries it links (as
# ldd lists them), a passwd/group naming the unprivileged user 65532, and an
# empty /data it owns. Usage: stage.sh [BINARY] [ROOT]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
binary="${1:-$here/../../target/release/sessionstore}"
root="${2:-$here/root}"

rm -rf "$root"
mkdir -p "$root/usr/local/bin" "$root/etc" "$root/data" "$root/tmp"
install -m 0755 "$binary" "$root/usr/local/bin/sessionstore"
# Each library at the path the loader looks for it, and the loader itself.
ldd "$binary" | awk '/=>/ { print $3 } !/=>/ && $1 ~ /^\// { print $1 }' | while read -r lib; do
  [ -n "$lib" ] || continue
  mkdir -p "$root$(dirname "$lib")"
  cp -L "$lib" "$root$lib"
done
echo 'nonroot:x:65532:65532:sessionstore:/data:/sbin/nologin' > "$root/etc/passwd"
echo 'nonroot:x:65532:' > "$root/etc/group"
chmod 1777 "$root/tmp"
# The volume's mount point, owned by the user the server runs as.
chown 65532:65532 "$root/data" 2>/dev/null || chmod 0777 "$root/data"
echo "$root"
