#!/usr/bin/env bash
# Runs python/framework_suites/openai_agents/bench.py (add-then-get round
# trips through the OpenAI Agents SDK's SQLiteSession and through
# sessionstore's SessionstoreSession) in a throwaway virtualenv holding the
# Python package with its openai-agents extra, at the framework suite's pin.
# Every argument is passed on; stdout carries only the script's JSON.
#
# The virtualenv is ${SESSIONSTORE_BENCH_AGENTS_VENV:-<repo>/target/bench-agents-venv};
# a stamp there holds the hash of what was installed, so later runs skip
# the install until the package or the pin changes.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
venv="${SESSIONSTORE_BENCH_AGENTS_VENV:-$repo/target/bench-agents-venv}"
suite="$repo/python/framework_suites/openai_agents"
stamp="$venv/.installed.sha256"

want="$(cat "$repo/python/pyproject.toml" "$suite/requirements.txt" \
    $(find "$repo/python/sessionstore" -name '*.py' | sort) | sha256sum | cut -d' ' -f1)"
if [[ ! -x "$venv/bin/python" || "$(cat "$stamp" 2>/dev/null)" != "$want" ]]; then
    echo "agents/run.sh: installing the package and openai-agents into $venv" >&2
    mkdir -p "$(dirname "$venv")"
    python3 -m venv "$venv"
    # A copy: pip builds inside the tree it is given.
    source="$(mktemp -d)"
    trap 'rm -rf "$source"' EXIT
    cp -r "$repo/python/pyproject.toml" "$repo/python/README.md" "$repo/python/sessionstore" "$source/"
    # pip prints to stdout, which must carry nothing but the JSON document.
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
        "$source[openai-agents]" --requirement "$suite/requirements.txt" >&2
    echo "$want" >"$stamp"
fi

exec "$venv/bin/python" "$suite/bench.py" "$@"
