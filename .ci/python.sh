#!/usr/bin/env bash
# Makes sure python3 with venv (the generated-Python-client test, and the
# README's Python and grpcurl commands) and jq (the README pipes grpcurl's
# output to it) are there; on a bare Debian machine installs them (as root).
set -euo pipefail
missing=()
python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || missing+=(python3 python3-venv)
command -v jq >/dev/null 2>&1 || missing+=(jq)
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "missing: installing Debian's ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >&2
apt-get install -y -qq "${missing[@]}" >&2
