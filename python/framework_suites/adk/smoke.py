"""Smoke test of sessionstore as Google ADK's session service, against the
google-adk installed here and a sessionstore server.

    python smoke.py --server-binary PATH     # starts its own server
    python smoke.py --url http://HOST:PORT   # uses a running one

Creates a session with state under every prefix, appends an event with a
state delta, then gets and lists, comparing each result with what ADK's own
InMemorySessionService returns for the same calls. Exits 1 on any mismatch.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import socket
import subprocess
import sys
import time
from typing import Any

from google.adk import version as adk_version
from google.adk.events.event import Event
from google.adk.events.event_actions import EventActions
from google.adk.sessions import InMemorySessionService
from google.adk.sessions.base_session_service import BaseSessionService
from google.genai import types

from sessionstore import AsyncClient
from sessionstore.integrations.adk import SessionstoreSessionService

APP, USER, SID = "smoke_app", "smoke_user", "smoke-session"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_server(binary: str) -> tuple[subprocess.Popen[str], str]:
    port = free_port()
    proc = subprocess.Popen(
        [binary, "serve", "--database-url", "sqlite::memory:", "--listen", f"127.0.0.1:{port}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + 30
    for line in proc.stdout:
        if re.search(r"sessionstore serving address=", line):
            return proc, f"http://127.0.0.1:{port}"
        if time.monotonic() > deadline:
            break
    proc.kill()
    sys.exit("the server did not start")


async def scenario(service: BaseSessionService) -> dict[str, Any]:
    """The same calls on any session service; what they returned."""
    session = await service.create_session(
        app_name=APP,
        user_id=USER,
        session_id=SID,
        state={"topic": "weather", "app:units": "metric", "user:name": "Ada", "temp:t": 1},
    )
    created_state = dict(session.state)
    event = Event(
        invocation_id="inv-1",
        author="user",
        timestamp=session.last_update_time + 1,
        content=types.Content(role="user", parts=[types.Part(text="Weather in Oslo?")]),
        actions=EventActions(state_delta={"topic": "oslo", "app:hits": 1, "temp:scratch": "x"}),
    )
    await service.append_event(session, event)
    got = await service.get_session(app_name=APP, user_id=USER, session_id=SID)
    assert got is not None, "get_session returned None"
    listed = await service.list_sessions(app_name=APP, user_id=USER)
    listed_all = await service.list_sessions(app_name=APP)
    return {
        "created state": created_state,
        "state after append (in memory)": dict(session.state),
        "got state": got.state,
        "got events": [e.model_dump(mode="json", exclude={"id", "timestamp"}) for e in got.events],
        "event round trip": got.events == [event],
        "got last_update_time": got.last_update_time == event.timestamp,
        "listed": [(s.app_name, s.user_id, s.id, s.state) for s in listed.sessions],
        "listed (all users)": [(s.user_id, s.id) for s in listed_all.sessions],
        "user state": await service.get_user_state(app_name=APP, user_id=USER),
    }


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--url", help="a running sessionstore server")
    where.add_argument(
        "--server-binary",
        default=os.environ.get("SESSIONSTORE_BIN"),
        help="start this sessionstore binary (default: $SESSIONSTORE_BIN)",
    )
    args = parser.parse_args()
    if not args.url and not args.server_binary:
        parser.error("give --url or --server-binary (or set SESSIONSTORE_BIN)")
    proc = None
    url = args.url
    if not url:
        proc, url = start_server(args.server_binary)
    try:
        async with AsyncClient(url) as client:
            await client.health_check(wait_for_ready=True, timeout=30)
            ours = await scenario(SessionstoreSessionService(client=client))
        reference = await scenario(InMemorySessionService())
    finally:
        if proc is not None:
            proc.kill()
            proc.wait()
    failures = [
        f"{name}:\n  sessionstore: {ours[name]!r}\n  in-memory:    {reference[name]!r}"
        for name in reference
        if ours[name] != reference[name]
    ]
    print(f"google-adk {adk_version.__version__}")
    for name in reference:
        print(f"{'ok  ' if ours[name] == reference[name] else 'FAIL'} {name}")
    if failures:
        print("\n".join(failures), file=sys.stderr)
        return 1
    print(f"{len(reference)} passed, 0 failed")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
