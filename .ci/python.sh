#!/usr/bin/env bash
# Makes sure python3 with venv is there for the generated-Python-client
# test; on a bare Debian machine installs it (as root).
set -euo pipefail
if python3 -c 'import venv, ensurepip' >/dev/null 2>&1; then
  exit 0
fi
echo "python3 with venv is missing: installing Debian's python3-venv" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >&2
apt-get install -y -qq python3 python3-venv >&2
