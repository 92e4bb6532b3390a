#!/usr/bin/env bash
# Runs peers.py (the peer-library benchmark) in a throwaway virtualenv holding
# the pinned requirements.txt; every argument is passed on to peers.py.
#
# The virtualenv is ${SESSIONSTORE_BENCH_VENV:-<repo>/target/bench-venv}. It is
# created on first use and the requirements installed into it; a stamp file
# there holds the hash of requirements.txt, so later runs skip the install
# until the file changes. stdout carries only peers.py's JSON document.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
venv="${SESSIONSTORE_BENCH_VENV:-$repo/target/bench-venv}"
requirements="$here/requirements.txt"
stamp="$venv/.requirements.sha256"

want="$(sha256sum "$requirements" | cut -d' ' -f1)"
if [[ ! -x "$venv/bin/python" || "$(cat "$stamp" 2>/dev/null)" != "$want" ]]; then
    echo "run.sh: installing the peer libraries into $venv" >&2
    mkdir -p "$(dirname "$venv")"
    python3 -m venv "$venv"
    # pip prints to stdout, which must carry nothing but the JSON document.
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
        --requirement "$requirements" >&2
    echo "$want" >"$stamp"
fi

exec "$venv/bin/python" "$here/peers.py" "$@"
