"""Root conftest of the OpenAI Agents SDK session suite (``run.py`` copies
it next to the SDK's ``tests/`` as ``conftest.py``).

It starts one real sessionstore server (``SESSIONSTORE_BIN``, on an
in-memory database) for the run, the way ``python/tests/conftest.py`` does,
and puts :class:`SessionstoreBackedSQLiteSession` where the SDK's tests
import ``SQLiteSession`` from (``agents.SQLiteSession`` and
``agents.memory.SQLiteSession``), before they are collected. The tests run
unmodified.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import agents
import agents.memory
from sessionstore import AsyncClient
from sessionstore.integrations.openai_agents import SessionstoreSession


def _load_server_fixtures() -> Any:
    """``python/tests/conftest.py`` of the repository, for its ``Server``."""
    path = os.environ["SESSIONSTORE_SERVER_FIXTURES"]
    spec = importlib.util.spec_from_file_location("sessionstore_server_fixtures", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


_server: Any = None
_client: AsyncClient | None = None
_stored_sessions: int | None = None


def _the_client() -> AsyncClient:
    if _client is None:
        raise RuntimeError("the sessionstore server of the suite is not running")
    return _client


class SessionstoreBackedSQLiteSession(SessionstoreSession):
    """What the SDK's tests get when they construct ``SQLiteSession``: a
    :class:`SessionstoreSession` with ``SQLiteSession``'s signature.

    ``SQLiteSession`` keeps one store per database: every ``:memory:``
    instance its own, a file shared by the instances opened on it. So the
    stored session's id is mapped from the SDK id prefixed with that store's
    name (a fresh UUID for ``:memory:``, else the resolved path and table
    names); ``session_id`` stays the id the test gave.
    """

    def __init__(
        self,
        session_id: str,
        db_path: str | Path = ":memory:",
        sessions_table: str = "agent_sessions",
        messages_table: str = "agent_messages",
        session_settings: Any = None,
    ) -> None:
        if str(db_path) == ":memory:":
            store = f"memory:{uuid.uuid4()}"
        else:
            store = f"file:{Path(db_path).expanduser().resolve()}:{sessions_table}:{messages_table}"
        super().__init__(
            f"{store}\n{session_id}",
            client=_the_client(),
            session_settings=session_settings,
        )
        self.session_id = session_id
        self.db_path = db_path

    def close(self) -> None:
        """``SQLiteSession.close``: nothing to release (the client belongs to the suite)."""


agents.SQLiteSession = SessionstoreBackedSQLiteSession  # type: ignore[assignment,misc]
agents.memory.SQLiteSession = SessionstoreBackedSQLiteSession  # type: ignore[assignment,misc]


def pytest_configure(config: pytest.Config) -> None:
    global _server, _client
    fixtures = _load_server_fixtures()
    _server = fixtures.Server()
    try:
        _server.start()
    except BaseException:
        _server.kill()
        raise
    # One client for the whole run, made here, outside any event loop, as
    # a program makes it once at module level: the tests drive it from
    # pytest-asyncio's loops, Runner.run_sync's loops and asyncio.run in
    # worker threads.
    _client = AsyncClient(_server.url)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Counts the sessions the tests stored on the server: none at all
    would mean the swap did not take."""
    global _stored_sessions
    if _server is None or session.testscollected == 0:
        return
    with _server.client() as client:
        _stored_sessions = sum(1 for _ in client.iter_sessions(page_size=1000))
    if _stored_sessions == 0 and exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _stored_sessions is not None:
        terminalreporter.write_line(
            f"sessionstore: the tests stored {_stored_sessions} sessions on the server"
        )


def pytest_unconfigure(config: pytest.Config) -> None:
    if _client is not None:
        asyncio.run(_client.close())
    if _server is not None:
        _server.kill()


@pytest.fixture(autouse=True)
def _sessionstore_swapped() -> Iterator[None]:
    """Fails a test that somehow reached the real ``SQLiteSession``."""
    assert agents.SQLiteSession is SessionstoreBackedSQLiteSession  # type: ignore[comparison-overlap]
    yield
