#!/usr/bin/env bash
# Makes sure the browser test (tests/it/browser.rs) has what it needs:
# Debian's Chromium at /usr/bin/chromium (never a browser downloaded at run
# time), Node.js with npm, and the web example (examples/web-chat) installed
# from its lockfile and built. On a bare Debian machine installs the
# packages (as root). Quick when everything is already there.
set -euo pipefail
cd "$(dirname "$0")/.."
missing=()
[ -x /usr/bin/chromium ] || missing+=(chromium)
if ! command -v node >/dev/null 2>&1; then
  missing+=(nodejs npm)
elif ! command -v npm >/dev/null 2>&1; then
  missing+=(npm)
fi
if [ ${#missing[@]} -gt 0 ]; then
  echo "missing: installing Debian's ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq "${missing[@]}" >&2
fi
echo "$(/usr/bin/chromium --version 2>/dev/null), node $(node --version), npm $(npm --version)" >&2

cd examples/web-chat
# npm ci again only when the lockfile changed since the last install.
if ! cmp -s package-lock.json node_modules/.installed-from-lockfile 2>/dev/null; then
  npm ci --no-audit --no-fund >&2
  cp package-lock.json node_modules/.installed-from-lockfile
fi
npm run --silent build >&2
