#!/usr/bin/env bash
# Runs agents_bench.py (add-then-read round trips through sessionstore's
# OpenAI Agents SDK, Google ADK and LangChain adapters, and through the
# session stores those frameworks ship: SQLAlchemySession, RedisSession,
# SQLiteSession, DatabaseSessionService, langchain-postgres) in a throwaway
# virtualenv holding the Python package with its openai-agents, adk and
# langchain extras and the pinned requirements.txt beside this script.
# Every argument is passed on; stdout carries only the script's JSON.
#
# The virtualenv is ${SESSIONSTORE_BENCH_AGENTS_VENV:-<repo>/target/bench-agents-venv};
# a stamp there holds the hash of what was installed, so later runs skip
# the install until the package or the pins change.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
venv="${SESSIONSTORE_BENCH_AGENTS_VENV:-$repo/target/bench-agents-venv}"
requirements="$here/requirements.txt"
stamp="$venv/.installed.sha256"

want="$(cat "$repo/python/pyproject.toml" "$requirements" \
    $(find "$repo/python/sessionstore" -name '*.py' | sort) | sha256sum | cut -d' ' -f1)"
if [[ ! -x "$venv/bin/python" || "$(cat "$stamp" 2>/dev/null)" != "$want" ]]; then
    echo "agents/run.sh: installing the package, the frameworks and their stores into $venv" >&2
    mkdir -p "$(dirname "$venv")"
    python3 -m venv "$venv"
    # A copy: pip builds inside the tree it is given.
    source="$(mktemp -d)"
    trap 'rm -rf "$source"' EXIT
    cp -r "$repo/python/pyproject.toml" "$repo/python/README.md" "$repo/python/sessionstore" "$source/"
    # pip prints to stdout, which must carry nothing but the JSON document.
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
        "$source[openai-agents,adk,langchain]" --requirement "$requirements" >&2
    echo "$want" >"$stamp"
fi

exec "$venv/bin/python" "$here/agents_bench.py" "$@"
