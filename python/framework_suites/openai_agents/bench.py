#!/usr/bin/env python3
"""Add-then-get round trips per second: SessionstoreSession vs SQLiteSession.

One round trip is ``add_items([one user item])`` then ``get_items()`` (the
whole, growing history), as a runner turn does. Both backends run in the
same process, one after the other, for ``--seconds`` each, on one session
each: the SDK's ``SQLiteSession`` on a file in a temporary directory, and
``SessionstoreSession`` on a sessionstore server started from
``SESSIONSTORE_BIN`` (by default on a SQLite file in the same temporary
directory; ``--database-url sqlite::memory:`` for an in-memory store) or
an already running one (``--url``).

    SESSIONSTORE_BIN=/path/to/sessionstore python python/framework_suites/openai_agents/bench.py
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import importlib.util
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from agents import SQLiteSession, TResponseInputItem
from agents.memory import Session

from sessionstore import AsyncClient
from sessionstore.integrations.openai_agents import SessionstoreSession

PYTHON_DIR = Path(__file__).resolve().parents[2]


def server_fixtures() -> Any:
    """``python/tests/conftest.py``, for its ``Server`` (start, wait for health, kill)."""
    path = PYTHON_DIR / "tests" / "conftest.py"
    spec = importlib.util.spec_from_file_location("sessionstore_server_fixtures", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


async def round_trips(session: Session, seconds: float) -> tuple[float, int]:
    """Round trips per second over ``seconds``, and how many were made."""
    count = 0
    start = time.perf_counter()
    deadline = start + seconds
    while time.perf_counter() < deadline:
        item: TResponseInputItem = {"role": "user", "content": f"message {count}"}
        await session.add_items([item])
        items = await session.get_items()
        count += 1
        assert len(items) == count
    return count / (time.perf_counter() - start), count


async def run(url: str, seconds: float, directory: Path, as_json: bool) -> None:
    sqlite = SQLiteSession("bench", directory / "sqlite-session.db")
    try:
        await round_trips(sqlite, 0.2)  # warm up
        await sqlite.clear_session()
        sqlite_rate, sqlite_count = await round_trips(sqlite, seconds)
    finally:
        sqlite.close()
    async with AsyncClient(url) as client:
        warm = SessionstoreSession(f"bench-warm-{time.time_ns()}", client=client)
        await round_trips(warm, 0.2)
        store = SessionstoreSession(f"bench-{time.time_ns()}", client=client)
        store_rate, store_count = await round_trips(store, seconds)
    if as_json:
        document = {
            "seconds": seconds,
            "agents_version": importlib.metadata.version("openai-agents"),
            "sqlite_session": {"per_sec": sqlite_rate, "round_trips": sqlite_count},
            "sessionstore_session": {"per_sec": store_rate, "round_trips": store_count},
        }
        print(json.dumps(document))
        return
    print(f"add-then-get round trips per second ({seconds:g} s each, history growing):")
    print(f"  SQLiteSession (file)  {sqlite_rate:10.1f}/s  ({sqlite_count} round trips)")
    print(f"  SessionstoreSession   {store_rate:10.1f}/s  ({store_count} round trips, {url})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="per backend (default 3)")
    parser.add_argument("--url", help="a running server; else one is started from SESSIONSTORE_BIN")
    parser.add_argument("--database-url", help="for the started server (default: a SQLite file)")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON document")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="openai-agents-bench-") as name:
        directory = Path(name)
        if args.url:
            asyncio.run(run(args.url, args.seconds, directory, args.json))
            return 0
        database_url = args.database_url or f"sqlite://{directory / 'sessionstore.db'}"
        server = server_fixtures().Server(database_url=database_url)
        server.start()
        try:
            print(f"server: {server.url}, --database-url {database_url}", file=sys.stderr)
            asyncio.run(run(server.url, args.seconds, directory, args.json))
        finally:
            server.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
