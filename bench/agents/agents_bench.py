#!/usr/bin/env python3
"""Agent frameworks' session stores: sessionstore's adapters against the stores users pick instead.

For each framework, one client makes round trips, one call after another, on
a fresh session whose history grows from empty: it adds ONE item, then reads
the whole history back, as an agent turn does.

* OpenAI Agents SDK (``add_items([item])``, then ``get_items()``):
  ``SessionstoreSession`` against ``SQLAlchemySession`` (asyncpg, on
  PostgreSQL), ``RedisSession`` (on a Redis server this script starts on a
  free 127.0.0.1 port, with append-only file and ``appendfsync everysec``,
  in a temporary directory, and stops after) and ``SQLiteSession`` (a file).
* Google ADK (``append_event(session, event)``, then ``get_session()``):
  ``SessionstoreSessionService`` against ``DatabaseSessionService``
  (asyncpg, on PostgreSQL).
* LangChain (``add_messages([message])``, then ``messages``):
  ``SessionstoreChatMessageHistory`` against langchain-postgres'
  ``PostgresChatMessageHistory`` (psycopg 3), both through their sync API.

sessionstore's adapters run against every server given with ``--server``
(the bench starts one on SQLite and one on PostgreSQL); the PostgreSQL peers
in the database ``--peer-postgres-url`` names (the bench makes it beside the
server's and drops it after). Every subject is used through its public API
only, with the same items (alternately a user and an assistant message of
about 1,000 characters) and one client each.

Before measuring, each subject's store is pre-filled with sessions through
the same API and every database is ANALYZEd, so that no run starts on empty
tables or statistics. Then each subject makes ``--round-trips`` round trips
on a fresh session, untimed once to warm up and ``--repeat`` times measured,
the subjects interleaved run by run. Reported per subject: round trips per
second (median, min, max of the runs), the p50, p99 and max of one round
trip (pooled over the runs), and the p50 of its add and of its read.

Progress goes to stderr; stdout carries exactly one JSON document. What
cannot run (no PostgreSQL URL, no ``redis-server``) is listed in ``skipped``
with the reason. Run it through run.sh, which provides the virtualenv.
"""

from __future__ import annotations

import abc
import argparse
import asyncio
import json
import math
import platform
import shutil
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit, urlunsplit

import psycopg
import redis
import redis.asyncio
from agents import SQLiteSession
from agents.extensions.memory.redis_session import RedisSession
from agents.extensions.memory.sqlalchemy_session import SQLAlchemySession
from google.adk.events.event import Event
from google.adk.sessions import DatabaseSessionService
from google.genai import types
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_postgres import PostgresChatMessageHistory
from sqlalchemy.ext.asyncio import create_async_engine

from sessionstore import AsyncClient, Client
from sessionstore.integrations.adk import SessionstoreSessionService
from sessionstore.integrations.langchain import SessionstoreChatMessageHistory
from sessionstore.integrations.openai_agents import SessionstoreSession

# --- Items ------------------------------------------------------------------

MESSAGE_CHARS = 1000
APP = "bench"
USER = "bench-user"


def _text(speaker: str) -> str:
    """A prose-like text of MESSAGE_CHARS characters (the peers bench's)."""
    sentence = (
        f"The {speaker} writes a sentence about storing chat sessions durably, "
        "in order, and reading them back quickly. "
    )
    return (sentence * (MESSAGE_CHARS // len(sentence) + 1))[:MESSAGE_CHARS]


USER_TEXT = _text("user")
ASSISTANT_TEXT = _text("assistant")


def text(index: int) -> tuple[bool, str]:
    """Item ``index`` of a conversation: whether the user says it, and its
    text (numbered, so no two items of a session are equal)."""
    from_user = index % 2 == 0
    body = USER_TEXT if from_user else ASSISTANT_TEXT
    prefix = f"[{index}] "
    return from_user, prefix + body[: MESSAGE_CHARS - len(prefix)]


def agents_item(index: int) -> dict[str, Any]:
    from_user, content = text(index)
    return {"role": "user" if from_user else "assistant", "content": content}


def adk_event(index: int) -> Event:
    from_user, content = text(index)
    return Event(
        invocation_id=f"invocation-{index // 2}",
        author="user" if from_user else "assistant",
        content=types.Content(
            role="user" if from_user else "model", parts=[types.Part(text=content)]
        ),
    )


def langchain_message(index: int) -> BaseMessage:
    from_user, content = text(index)
    return HumanMessage(content=content) if from_user else AIMessage(content=content)


def log(message: str) -> None:
    print(f"[agents] {message}", file=sys.stderr, flush=True)


# --- Subjects ----------------------------------------------------------------
#
# A subject opens conversations; a conversation adds one item (one call of
# the framework's API) and reads the whole history (one call). fill() adds
# many items untimed, in as few calls as the API allows.


class Conversation(abc.ABC):
    @abc.abstractmethod
    async def add(self, index: int) -> None: ...

    @abc.abstractmethod
    async def read(self) -> int:
        """Reads the whole history; returns how many items it holds."""

    async def fill(self, count: int) -> None:
        for index in range(count):
            await self.add(index)

    async def close(self) -> None:
        pass


class Subject(abc.ABC):
    framework: str  # openai-agents, google-adk, langchain
    name: str
    # "sessionstore" for the adapters, else "peer".
    role: str = "peer"
    # Where it keeps its data: the server's backend for sessionstore.
    backend: str
    distribution: str
    round_trip: str  # the two calls of a round trip
    notes: str = ""

    async def start(self) -> None:
        """Creates the schema and connects (nothing by default)."""

    async def stop(self) -> None:
        """Releases what start() took (nothing by default)."""

    @abc.abstractmethod
    async def open(self, session_id: str) -> Conversation: ...

    @property
    def label(self) -> str:
        return f"{self.name} ({self.backend})"


AGENTS_ROUND_TRIP = "add_items([one item]), then get_items()"
ADK_ROUND_TRIP = "append_event(one event), then get_session()"
LANGCHAIN_ROUND_TRIP = "add_messages([one message]), then messages"


class _AgentsConversation(Conversation):
    def __init__(self, session: Any, close: bool = False):
        self.session = session
        self._close = close

    async def add(self, index: int) -> None:
        await self.session.add_items([agents_item(index)])

    async def read(self) -> int:
        return len(await self.session.get_items())

    async def fill(self, count: int) -> None:
        await self.session.add_items([agents_item(i) for i in range(count)])

    async def close(self) -> None:
        if self._close:
            self.session.close()


class StoreAgents(Subject):
    framework = "openai-agents"
    name = "SessionstoreSession"
    role = "sessionstore"
    distribution = "openai-agents"
    round_trip = AGENTS_ROUND_TRIP

    def __init__(self, backend: str, endpoint: str):
        self.backend = backend
        self.endpoint = endpoint
        self.notes = f"sessionstore server on {backend}, over gRPC ({endpoint})"

    async def start(self) -> None:
        self.client = AsyncClient(self.endpoint)

    async def open(self, session_id: str) -> Conversation:
        return _AgentsConversation(SessionstoreSession(session_id, client=self.client))

    async def stop(self) -> None:
        await self.client.close()


class SQLAlchemyAgents(Subject):
    framework = "openai-agents"
    name = "SQLAlchemySession"
    backend = "postgres"
    distribution = "openai-agents"
    round_trip = AGENTS_ROUND_TRIP

    def __init__(self, database: PeerDatabase):
        self.engine = create_async_engine(
            database.sqlalchemy_url, pool_size=2, max_overflow=0, connect_args=database.asyncpg_args
        )
        self.notes = (
            f"SQLAlchemy {version('sqlalchemy')} with asyncpg {version('asyncpg')}, "
            "one AsyncEngine for every session, connected before timing"
        )

    async def start(self) -> None:
        # create_tables=True creates the tables on a first call; the sessions
        # measured are opened without it, as in production.
        await SQLAlchemySession("schema", engine=self.engine, create_tables=True).get_items()

    async def open(self, session_id: str) -> Conversation:
        return _AgentsConversation(SQLAlchemySession(session_id, engine=self.engine))

    async def stop(self) -> None:
        await self.engine.dispose()


class RedisAgents(Subject):
    framework = "openai-agents"
    name = "RedisSession"
    backend = "redis"
    distribution = "openai-agents"
    round_trip = AGENTS_ROUND_TRIP

    def __init__(self, server: RedisServer):
        self.server = server
        self.notes = (
            f"redis-py {version('redis')}, one client for every session; Redis "
            f"{server.version} started for the run with appendonly yes, appendfsync "
            "everysec: it acknowledges a write before the write reaches disk (up to "
            "about a second of acknowledged writes lost in a crash), where "
            "sessionstore acknowledges after its commit is on disk"
        )

    async def start(self) -> None:
        self.client = redis.asyncio.Redis.from_url(self.server.url)
        await self.client.ping()

    async def open(self, session_id: str) -> Conversation:
        return _AgentsConversation(RedisSession(session_id, redis_client=self.client))

    async def stop(self) -> None:
        await self.client.aclose()


class SQLiteAgents(Subject):
    framework = "openai-agents"
    name = "SQLiteSession"
    backend = "sqlite"
    distribution = "openai-agents"
    round_trip = AGENTS_ROUND_TRIP

    def __init__(self, directory: Path):
        self.path = directory / "agents-sqlite-session.db"
        self.notes = (
            f"a file of SQLite {sqlite3.sqlite_version} in the process, WAL, "
            "synchronous=FULL (sqlite3's default); a reference without a goal"
        )

    async def open(self, session_id: str) -> Conversation:
        return _AgentsConversation(SQLiteSession(session_id, db_path=self.path), close=True)

    def analyze(self) -> None:
        with sqlite3.connect(self.path) as conn:
            conn.execute("ANALYZE")


class _AdkConversation(Conversation):
    def __init__(self, service: Any, session: Any):
        self.service = service
        self.session = session

    async def add(self, index: int) -> None:
        await self.service.append_event(self.session, adk_event(index))

    async def read(self) -> int:
        session = await self.service.get_session(
            app_name=APP, user_id=USER, session_id=self.session.id
        )
        assert session is not None
        # The next append goes to the session as read, as a runner's does.
        self.session = session
        return len(session.events)


class _AdkSubject(Subject):
    framework = "google-adk"
    distribution = "google-adk"
    round_trip = ADK_ROUND_TRIP
    service: Any

    async def open(self, session_id: str) -> Conversation:
        session = await self.service.create_session(
            app_name=APP, user_id=USER, session_id=session_id
        )
        return _AdkConversation(self.service, session)


class StoreAdk(_AdkSubject):
    name = "SessionstoreSessionService"
    role = "sessionstore"

    def __init__(self, backend: str, endpoint: str):
        self.backend = backend
        self.endpoint = endpoint
        self.notes = f"sessionstore server on {backend}, over gRPC ({endpoint})"

    async def start(self) -> None:
        self.client = AsyncClient(self.endpoint)
        self.service = SessionstoreSessionService(client=self.client)

    async def stop(self) -> None:
        await self.client.close()


class DatabaseAdk(_AdkSubject):
    name = "DatabaseSessionService"
    backend = "postgres"

    def __init__(self, database: PeerDatabase):
        self.service = DatabaseSessionService(
            database.sqlalchemy_url,
            connect_args=database.asyncpg_args,
            # Not ADK's default for a server database: a pre-ping is one
            # more round trip to PostgreSQL per checkout, left out so that
            # the peer is measured at its fastest.
            pool_pre_ping=False,
        )
        self.notes = (
            f"SQLAlchemy {version('sqlalchemy')} with asyncpg {version('asyncpg')}, "
            "db_url with pool_pre_ping=False (faster than ADK's default)"
        )

    async def start(self) -> None:
        await self.service.prepare_tables()

    async def stop(self) -> None:
        await self.service.close()


class _LangchainConversation(Conversation):
    def __init__(self, history: Any):
        self.history = history

    async def add(self, index: int) -> None:
        self.history.add_messages([langchain_message(index)])

    async def read(self) -> int:
        return len(self.history.messages)

    async def fill(self, count: int) -> None:
        self.history.add_messages([langchain_message(i) for i in range(count)])


class StoreLangchain(Subject):
    framework = "langchain"
    name = "SessionstoreChatMessageHistory"
    role = "sessionstore"
    distribution = "langchain-core"
    round_trip = LANGCHAIN_ROUND_TRIP

    def __init__(self, backend: str, endpoint: str):
        self.backend = backend
        self.endpoint = endpoint
        self.notes = f"sessionstore server on {backend}, over gRPC ({endpoint}); sync API"

    async def start(self) -> None:
        self.client = Client(self.endpoint)

    async def open(self, session_id: str) -> Conversation:
        return _LangchainConversation(SessionstoreChatMessageHistory(session_id, client=self.client))

    async def stop(self) -> None:
        self.client.close()


class PostgresLangchain(Subject):
    framework = "langchain"
    name = "PostgresChatMessageHistory"
    backend = "postgres"
    distribution = "langchain-postgres"
    round_trip = LANGCHAIN_ROUND_TRIP
    TABLE = "chat_history"

    def __init__(self, database: PeerDatabase):
        self.url = database.url
        self.notes = (
            f"langchain-postgres with psycopg {version('psycopg')} (binary); sync API, "
            "one connection opened before timing"
        )

    async def start(self) -> None:
        self.connection = psycopg.connect(self.url)
        PostgresChatMessageHistory.create_tables(self.connection, self.TABLE)

    async def open(self, session_id: str) -> Conversation:
        return _LangchainConversation(
            PostgresChatMessageHistory(self.TABLE, session_id, sync_connection=self.connection)
        )

    async def stop(self) -> None:
        self.connection.close()


# --- Places ------------------------------------------------------------------


class PeerDatabase:
    """The PostgreSQL database the peers use (made and dropped by the bench)."""

    def __init__(self, url: str):
        # Without TLS unless the URL asks for it, as sessionstore's driver
        # (built without TLS) talks to the same server; libpq and asyncpg
        # would otherwise use TLS with a server that offers it.
        parts = urlsplit(url)
        query = {"sslmode": ["disable"], **parse_qs(parts.query)}
        self.url = urlunsplit(parts._replace(query=urlencode(query, doseq=True)))
        sslmode = query.pop("sslmode")[0]
        # asyncpg takes the TLS mode as its `ssl` argument, not in the URL.
        self.sqlalchemy_url = urlunsplit(
            parts._replace(scheme="postgresql+asyncpg", query=urlencode(query, doseq=True))
        )
        self.asyncpg_args = {"ssl": sslmode}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class RedisServer:
    """A redis-server of our own on a free 127.0.0.1 port, with its files
    in a temporary directory; stopped and removed on exit."""

    def __init__(self, binary: str):
        self.binary = binary
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> RedisServer:
        self._dir = tempfile.TemporaryDirectory(prefix="sessionstore-bench-redis-")
        directory = Path(self._dir.name)
        for _ in range(5):
            port = free_port()
            self.process = subprocess.Popen(
                [
                    self.binary,
                    "--port", str(port),
                    "--bind", "127.0.0.1",
                    "--dir", str(directory),
                    "--logfile", str(directory / "redis.log"),
                    "--daemonize", "no",
                    "--save", "",
                    "--appendonly", "yes",
                    "--appendfsync", "everysec",
                ],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )  # fmt: skip
            client = redis.Redis(host="127.0.0.1", port=port)
            deadline = time.monotonic() + 10
            while self.process.poll() is None and time.monotonic() < deadline:
                try:
                    client.ping()
                except redis.ConnectionError:
                    time.sleep(0.05)
                    continue
                self.url = f"redis://127.0.0.1:{port}/0"
                self.version = str(client.info("server")["redis_version"])
                client.close()
                log(f"redis-server {self.version} on 127.0.0.1:{port}, files in {directory}")
                return self
            client.close()
            self._stop()  # the port was taken meanwhile, or it did not start
        self._dir.cleanup()
        raise RuntimeError(f"{self.binary} did not start; see its log in a rerun")

    def _stop(self) -> None:
        if self.process is None:
            return
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process = None

    def __exit__(self, *exc_info: object) -> None:
        self._stop()
        self._dir.cleanup()
        log("redis-server stopped")


def analyze(url: str) -> None:
    """ANALYZE the database at a sqlx-style URL (SQLite file or PostgreSQL)."""
    if url.startswith("sqlite://"):
        path = url.removeprefix("sqlite://").split("?")[0]
        with sqlite3.connect(path) as conn:
            conn.execute("ANALYZE")
        return
    parts = urlsplit(url)
    query = {"sslmode": ["disable"], **parse_qs(parts.query)}
    url = urlunsplit(parts._replace(query=urlencode(query, doseq=True)))
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("ANALYZE")


# --- Measurement --------------------------------------------------------------


@dataclass
class Results:
    rates: list[float] = field(default_factory=list)
    round_trips: list[float] = field(default_factory=list)  # seconds
    adds: list[float] = field(default_factory=list)
    reads: list[float] = field(default_factory=list)


def new_session_id() -> str:
    # A UUID: langchain-postgres needs one, and it suits the others.
    return str(uuid.uuid4())


async def one_run(subject: Subject, round_trips: int, results: Results | None) -> float:
    """``round_trips`` round trips on a fresh session; returns the rate."""
    conversation = await subject.open(new_session_id())
    try:
        rts, adds, reads = [], [], []
        began = time.perf_counter()
        for index in range(round_trips):
            t0 = time.perf_counter()
            await conversation.add(index)
            t1 = time.perf_counter()
            got = await conversation.read()
            t2 = time.perf_counter()
            if got != index + 1:
                raise RuntimeError(f"{subject.label}: read {got} items, expected {index + 1}")
            rts.append(t2 - t0)
            adds.append(t1 - t0)
            reads.append(t2 - t1)
        rate = round_trips / (time.perf_counter() - began)
    finally:
        await conversation.close()
    if results is not None:
        results.rates.append(rate)
        results.round_trips.extend(rts)
        results.adds.extend(adds)
        results.reads.extend(reads)
    return rate


def percentile(values: list[float], fraction: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[max(1, math.ceil(len(ordered) * fraction)) - 1]


def row(subject: Subject, results: Results) -> dict[str, Any]:
    ms = 1e3
    return {
        "framework": subject.framework,
        "subject": subject.name,
        "role": subject.role,
        "backend": subject.backend,
        "distribution": subject.distribution,
        "version": version(subject.distribution),
        "round_trip": subject.round_trip,
        "notes": subject.notes,
        "per_sec": {
            "median": round(statistics.median(results.rates), 2),
            "min": round(min(results.rates), 2),
            "max": round(max(results.rates), 2),
        },
        "runs": len(results.rates),
        "p50_ms": round(percentile(results.round_trips, 0.5) * ms, 3),
        "p99_ms": round(percentile(results.round_trips, 0.99) * ms, 3),
        "max_ms": round(max(results.round_trips) * ms, 3),
        "samples": len(results.round_trips),
        "add_p50_ms": round(percentile(results.adds, 0.5) * ms, 3),
        "read_p50_ms": round(percentile(results.reads, 0.5) * ms, 3),
    }


async def measure(subjects: list[Subject], args: argparse.Namespace) -> list[dict[str, Any]]:
    started: list[Subject] = []
    try:
        for subject in subjects:
            await subject.start()
            started.append(subject)
            log(
                f"{subject.label}: pre-filling {args.prefill_sessions} sessions of "
                f"{args.prefill_items} items"
            )
            for _ in range(args.prefill_sessions):
                conversation = await subject.open(new_session_id())
                try:
                    await conversation.fill(args.prefill_items)
                finally:
                    await conversation.close()
        for url in args.analyze:
            analyze(url)
        for subject in subjects:
            if isinstance(subject, SQLiteAgents):
                subject.analyze()
        for subject in subjects:
            rate = await one_run(subject, args.round_trips, None)
            log(f"{subject.label}: warm-up {rate:.1f} round trips/s")
        results = {id(subject): Results() for subject in subjects}
        for run in range(args.repeat):
            # Each run in another order, so no subject always follows the same one.
            shift = run % len(subjects)
            for subject in subjects[shift:] + subjects[:shift]:
                rate = await one_run(subject, args.round_trips, results[id(subject)])
                log(f"{subject.label}: run {run + 1}/{args.repeat}: {rate:.1f} round trips/s")
    finally:
        for subject in reversed(started):
            await subject.stop()
    return [row(subject, results[id(subject)]) for subject in subjects]


# --- Command line ---------------------------------------------------------------


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--server",
        nargs=3,
        action="append",
        default=[],
        metavar=("BACKEND", "ENDPOINT", "DATABASE_URL"),
        help="a running sessionstore server: its backend (sqlite, postgres), its "
        "gRPC endpoint, and its database's URL (ANALYZEd after the pre-fill); repeatable",
    )
    parser.add_argument(
        "--peer-postgres-url",
        help="an empty PostgreSQL database for the PostgreSQL peers; without it "
        "they are skipped",
    )
    parser.add_argument(
        "--redis-server",
        default=shutil.which("redis-server"),
        help="the redis-server binary RedisSession's server is started from "
        "(default: the one on PATH; without one, RedisSession is skipped)",
    )
    parser.add_argument("--round-trips", type=int, default=200, help="per session (default 200)")
    parser.add_argument("--repeat", type=int, default=3, help="measured runs (default 3)")
    parser.add_argument("--prefill-sessions", type=int, default=20)
    parser.add_argument("--prefill-items", type=int, default=100)
    args = parser.parse_args(argv)
    if args.round_trips < 1 or args.repeat < 1:
        parser.error("--round-trips and --repeat must be at least 1")
    args.analyze = [database_url for _, _, database_url in args.server]
    if args.peer_postgres_url:
        args.analyze.append(args.peer_postgres_url)
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    # SIGTERM unwinds like Ctrl-C, so Redis is stopped and its files removed.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    skipped: list[str] = []
    with tempfile.TemporaryDirectory(prefix="sessionstore-bench-agents-") as name:
        redis_server: RedisServer | None = None
        if not args.redis_server:
            skipped.append(
                "openai-agents RedisSession: no redis-server on PATH (Debian: apt-get "
                "install redis-server)"
            )
        else:
            redis_server = RedisServer(args.redis_server).__enter__()
        try:
            database = PeerDatabase(args.peer_postgres_url) if args.peer_postgres_url else None
            if database is None:
                skipped.extend(
                    f"{peer}: no PostgreSQL (--postgres-url)"
                    for peer in (
                        "openai-agents SQLAlchemySession",
                        "google-adk DatabaseSessionService",
                        "langchain-postgres PostgresChatMessageHistory",
                    )
                )
            subjects: list[Subject] = []
            # Framework by framework, peers first, then sessionstore on each server.
            if database is not None:
                subjects.append(SQLAlchemyAgents(database))
            if redis_server is not None:
                subjects.append(RedisAgents(redis_server))
            subjects.append(SQLiteAgents(Path(name)))
            subjects += [StoreAgents(backend, endpoint) for backend, endpoint, _ in args.server]
            if database is not None:
                subjects.append(DatabaseAdk(database))
            subjects += [StoreAdk(backend, endpoint) for backend, endpoint, _ in args.server]
            if database is not None:
                subjects.append(PostgresLangchain(database))
            subjects += [StoreLangchain(backend, endpoint) for backend, endpoint, _ in args.server]
            rows = asyncio.run(measure(subjects, args))
        finally:
            if redis_server is not None:
                redis_server.__exit__(None, None, None)
    document = {
        "rows": rows,
        "skipped": skipped,
        "round_trips": args.round_trips,
        "repeat": args.repeat,
        "prefill": {"sessions": args.prefill_sessions, "items": args.prefill_items},
        "message_chars": MESSAGE_CHARS,
        "python": platform.python_version(),
        "versions": {
            name: version(name)
            for name in (
                "openai-agents",
                "google-adk",
                "langchain-core",
                "langchain-postgres",
                "sqlalchemy",
                "asyncpg",
                "psycopg",
                "redis",
            )
        }
        | ({"redis-server": redis_server.version} if redis_server is not None else {}),
    }
    print(json.dumps(document, indent=2))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except KeyboardInterrupt:
        log("interrupted")
        sys.exit(130)
