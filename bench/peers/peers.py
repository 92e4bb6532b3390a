"""Benchmarks the peer libraries a user might pick instead of sessionstore.

Each peer is a Python library that keeps chat history in a database, used
in-process, on the same machine and databases as the sessionstore benchmark,
with the same workload:

* append: one exchange (a user message and an assistant answer) written in
  ONE library call, in each shape of --shapes: `small` (64 and 512
  characters) and `1kb` (1,000 each), the sizes sessionstore's benchmark
  sends (bench/src/workload.rs, Shape). Each worker writes to its own
  session; throughput (exchanges/s) and per-call latency (p50, p99) are
  measured for a fixed duration after a warm-up, at each --concurrency (the
  client counts sessionstore is measured at).
* read: the time to read every message of a session holding N messages
  (of 1,000 characters).

Every measurement is repeated --repeat times; the median, min and max are
reported. Progress goes to stderr; stdout gets exactly one JSON document.

PostgreSQL peers run in a database this script creates for the run (named
sessionstore_bench_peers_<pid>) and drops at the end, also on error or
SIGTERM. Without a PostgreSQL URL they are skipped, and the JSON says so.

Run it through run.sh, which provides a virtualenv with the pinned libraries.
"""

from __future__ import annotations

import abc
import argparse
import asyncio
import json
import math
import os
import platform
import signal
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path
from urllib.parse import parse_qs, urlencode, urlsplit, urlunsplit

import psycopg
from agents import SQLiteSession
from agents.extensions.memory.sqlalchemy_session import SQLAlchemySession
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_postgres import PostgresChatMessageHistory
from psycopg import sql
from sqlalchemy.ext.asyncio import create_async_engine

# --- Workload ---------------------------------------------------------------

MESSAGE_CHARS = 1000
# Each exchange shape's user message and answer, in characters (all ASCII,
# so also bytes): the same names and sizes as sessionstore's benchmark.
SHAPES = {"small": (64, 512), "1kb": (MESSAGE_CHARS, MESSAGE_CHARS)}
# Before any measurement each store gets PREFILL_SESSIONS sessions of
# PREFILL_MESSAGES_PER_SESSION messages, so that no run starts on empty tables.
PREFILL_SESSIONS = 100
PREFILL_MESSAGES_PER_SESSION = 100
# Messages per library call when filling a session (pre-fill and the read
# sessions); fill time is never measured.
FILL_BATCH = 1000
# Connections available to concurrent writers where the library uses a pool:
# sessionstore's default pool size (--max-connections).
POOL_SIZE = 16


def _text(speaker: str, chars: int = MESSAGE_CHARS) -> str:
    """A deterministic, prose-like text of exactly `chars` characters."""
    sentence = (
        f"The {speaker} writes a sentence about storing chat sessions durably, "
        "in order, and reading them back quickly. "
    )
    return (sentence * (chars // len(sentence) + 1))[:chars]


USER_TEXT = _text("user")
ASSISTANT_TEXT = _text("assistant")


def shape_texts(shape: str) -> tuple[str, str]:
    """The user message and the answer of one exchange of `shape`."""
    user_chars, answer_chars = SHAPES[shape]
    return _text("user", user_chars), _text("assistant", answer_chars)


def _alternating(count: int, user, assistant) -> list:
    """`count` items alternating user, assistant, user, ... (whole exchanges)."""
    return [user if i % 2 == 0 else assistant for i in range(count)]


def log(message: str) -> None:
    print(f"[peers] {message}", file=sys.stderr, flush=True)


# --- Peers ------------------------------------------------------------------
#
# A peer opens sessions; a session can append one exchange, be filled with
# many messages, and read all its messages back. Every call a benchmark times
# is exactly one call of the library's public API.


class Session(abc.ABC):
    """One conversation in a peer's store."""

    @abc.abstractmethod
    def append_exchange(self, exchange):
        """Writes one user + assistant exchange in one library call;
        `exchange` is what the peer's exchange() made for its shape.

        A coroutine function, except for a peer used through its sync API
        (Peer.threaded), where it is a plain function called from threads."""

    @abc.abstractmethod
    async def fill(self, messages: int) -> None:
        """Adds `messages` messages in large batches (not timed).

        fill, read_all and close run on the event loop even for a sync
        library: its calls then block the loop, which has nothing else to do."""

    @abc.abstractmethod
    async def read_all(self) -> int:
        """Reads every message of the session; returns how many there were."""

    async def close(self) -> None:
        """Releases what the session holds (nothing by default)."""


class Peer(abc.ABC):
    name: str
    database: str  # "sqlite" or "postgres"
    distribution: str  # the PyPI package whose version is reported
    notes: str  # how the library is set up, for whoever reads the figures
    # Concurrent writers are threads (sync API) rather than asyncio tasks.
    threaded = False

    async def start(self) -> None:
        """Creates the schema (nothing by default)."""

    async def stop(self) -> None:
        """Releases what start() took (nothing by default)."""

    @abc.abstractmethod
    async def open_session(self, session_id: str) -> Session: ...

    @abc.abstractmethod
    def exchange(self, shape: str):
        """One exchange of `shape` in the form the library's append takes,
        built once: the benchmark times the store, not the objects."""

    async def analyze(self) -> None:
        """Refreshes planner statistics after the pre-fill (nothing by default)."""


def _agents_items(user: str, assistant: str) -> list[dict]:
    """An exchange as OpenAI Agents SDK items (Responses-API input dicts)."""
    return [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]


class _AgentsSession(Session):
    """An OpenAI Agents SDK session: items are Responses-API input dicts."""

    USER, ASSISTANT = _agents_items(USER_TEXT, ASSISTANT_TEXT)

    def __init__(self, session):
        self.session = session

    async def append_exchange(self, exchange: list[dict]) -> None:
        await self.session.add_items(exchange)

    async def fill(self, messages: int) -> None:
        items = _alternating(messages, self.USER, self.ASSISTANT)
        for start in range(0, len(items), FILL_BATCH):
            await self.session.add_items(items[start : start + FILL_BATCH])

    async def read_all(self) -> int:
        return len(await self.session.get_items())


class _SQLiteSessionHandle(_AgentsSession):
    async def close(self) -> None:
        # Closes the per-thread sqlite3 connections this session opened.
        self.session.close()


class AgentsSQLitePeer(Peer):
    name = "openai-agents SQLiteSession"
    database = "sqlite"
    distribution = "openai-agents"

    def __init__(self):
        probe = sqlite3.connect(":memory:")
        synchronous = probe.execute("PRAGMA synchronous").fetchone()[0]
        probe.close()
        self.notes = (
            f"file-backed SQLite {sqlite3.sqlite_version} in a temp dir; the SDK "
            f"sets journal_mode=WAL and leaves synchronous={synchronous} "
            "(2 = FULL, the sqlite3 default). Each call runs in a worker thread "
            "(asyncio.to_thread) under one process-wide lock per database file, "
            "so writes to different sessions are serialised within the process."
        )

    async def start(self) -> None:
        # The SDK creates the tables when a session is opened.
        self._dir = tempfile.TemporaryDirectory(prefix="sessionstore-bench-peers-")
        self.path = Path(self._dir.name) / "agents.db"

    async def open_session(self, session_id: str) -> Session:
        return _SQLiteSessionHandle(SQLiteSession(session_id, db_path=self.path))

    def exchange(self, shape: str) -> list[dict]:
        return _agents_items(*shape_texts(shape))

    async def stop(self) -> None:
        self._dir.cleanup()


class AgentsSQLAlchemyPeer(Peer):
    name = "openai-agents SQLAlchemySession"
    database = "postgres"
    distribution = "openai-agents"

    def __init__(self, conninfo: str):
        # One engine (and so one connection pool) shared by every session, as an
        # application serving many conversations would do; from_url() would
        # build a new engine and pool for each session. asyncpg takes the TLS
        # mode as its `ssl` argument, not as `sslmode` in the URL.
        url = urlsplit(conninfo)
        query = parse_qs(url.query)
        sslmode = query.pop("sslmode")[0]
        url = url._replace(scheme="postgresql+asyncpg", query=urlencode(query, doseq=True))
        self.engine = create_async_engine(
            urlunsplit(url),
            pool_size=POOL_SIZE,
            max_overflow=0,
            connect_args={"ssl": sslmode},
        )
        self.notes = (
            f"SQLAlchemy {version('sqlalchemy')} with asyncpg {version('asyncpg')}, "
            f"sslmode={sslmode}; one AsyncEngine shared by all sessions, "
            f"pool_size={POOL_SIZE}, all connected before timing. add_items is "
            "one transaction: select and lock the session row, insert the "
            "messages, touch updated_at."
        )

    async def start(self) -> None:
        # Connect the whole pool now: connecting is not what is measured.
        connections = [self.engine.connect() for _ in range(POOL_SIZE)]
        await asyncio.gather(*(c.start() for c in connections))
        await asyncio.gather(*(c.close() for c in connections))
        # create_tables=True creates the tables on the session's first call;
        # the sessions benchmarked are then opened without it, as in production.
        await SQLAlchemySession("schema-probe", engine=self.engine, create_tables=True).get_items()

    async def open_session(self, session_id: str) -> Session:
        return _AgentsSession(SQLAlchemySession(session_id, engine=self.engine))

    def exchange(self, shape: str) -> list[dict]:
        return _agents_items(*shape_texts(shape))

    async def analyze(self) -> None:
        async with self.engine.connect() as conn:
            await conn.exec_driver_sql("ANALYZE")

    async def stop(self) -> None:
        await self.engine.dispose()


class _LangchainSession(Session):
    # The messages fills write (1,000 characters each), built once.
    EXCHANGE = [HumanMessage(content=USER_TEXT), AIMessage(content=ASSISTANT_TEXT)]

    def __init__(self, connection: psycopg.Connection, session_id: str):
        self.connection = connection
        self.history = PostgresChatMessageHistory(
            LangchainPostgresPeer.TABLE, session_id, sync_connection=connection
        )

    def append_exchange(self, exchange: list[BaseMessage]) -> None:
        self.history.add_messages(exchange)

    async def fill(self, messages: int) -> None:
        batch: list[BaseMessage] = _alternating(messages, *self.EXCHANGE)
        for start in range(0, len(batch), FILL_BATCH):
            self.history.add_messages(batch[start : start + FILL_BATCH])

    async def read_all(self) -> int:
        return len(self.history.get_messages())

    async def close(self) -> None:
        self.connection.close()


class LangchainPostgresPeer(Peer):
    name = "langchain-postgres PostgresChatMessageHistory"
    database = "postgres"
    distribution = "langchain-postgres"
    TABLE = "chat_history"
    # Its sync API on threads outruns its async API on one event loop (about
    # 1,270 against 750 exchanges/s with 16 writers here), so it is measured
    # at its best.
    threaded = True

    def __init__(self, conninfo: str):
        self.conninfo = conninfo
        self.notes = (
            f"psycopg {version('psycopg')} (binary), "
            f"sslmode={parse_qs(urlsplit(conninfo).query)['sslmode'][0]}; "
            "sync API (add_messages, get_messages), one thread per writer; a "
            "history is bound to one connection, so each session gets its own, "
            "opened before timing. add_messages is one transaction: executemany "
            "of one INSERT per message, then commit."
        )

    async def start(self) -> None:
        with psycopg.connect(self.conninfo) as conn:
            PostgresChatMessageHistory.create_tables(conn, self.TABLE)

    async def open_session(self, session_id: str) -> Session:
        return _LangchainSession(psycopg.connect(self.conninfo), session_id)

    def exchange(self, shape: str) -> list[BaseMessage]:
        user, assistant = shape_texts(shape)
        return [HumanMessage(content=user), AIMessage(content=assistant)]

    async def analyze(self) -> None:
        with psycopg.connect(self.conninfo, autocommit=True) as conn:
            conn.execute("ANALYZE")


PEER_NAMES = [
    AgentsSQLitePeer.name,
    AgentsSQLAlchemyPeer.name,
    LangchainPostgresPeer.name,
]


# --- Measurements -----------------------------------------------------------


def _new_session_id() -> str:
    # A UUID: langchain-postgres requires one, and it suits the others.
    return str(uuid.uuid4())


@dataclass
class AppendRun:
    exchanges_per_sec: float
    latencies: list[float] = field(repr=False)  # seconds, sorted


async def measure_append(
    peer: Peer, concurrency: int, shape: str, warmup: float, duration: float
) -> AppendRun:
    """`concurrency` writers (asyncio tasks, or threads for a sync peer), each
    appending exchanges of `shape` to its own new session as fast as it can.
    Calls completing in the first `warmup` seconds are not counted; those
    completing in the next `duration` seconds are."""
    sessions = [await peer.open_session(_new_session_id()) for _ in range(concurrency)]
    exchange = peer.exchange(shape)
    latencies: list[float] = []  # list.append is atomic, also across threads
    window_start = time.perf_counter() + warmup
    window_end = window_start + duration

    def record(began: float, ended: float) -> None:
        if window_start <= ended <= window_end:
            latencies.append(ended - began)

    async def task_writer(session: Session) -> None:
        while (began := time.perf_counter()) < window_end:
            await session.append_exchange(exchange)
            record(began, time.perf_counter())

    def thread_writer(session: Session) -> None:
        while (began := time.perf_counter()) < window_end:
            session.append_exchange(exchange)
            record(began, time.perf_counter())

    try:
        if peer.threaded:
            # A pool of exactly one thread per writer (asyncio.to_thread's
            # shared pool has only min(32, cores + 4) threads).
            loop = asyncio.get_running_loop()
            with ThreadPoolExecutor(concurrency) as pool:
                await asyncio.gather(
                    *(loop.run_in_executor(pool, thread_writer, s) for s in sessions)
                )
        else:
            await asyncio.gather(*(task_writer(s) for s in sessions))
    finally:
        for session in sessions:
            await session.close()
    latencies.sort()
    return AppendRun(len(latencies) / duration, latencies)


def _percentile(sorted_values: list[float], fraction: float) -> float:
    """Nearest-rank percentile of an ascending list."""
    rank = max(1, math.ceil(len(sorted_values) * fraction))
    return sorted_values[rank - 1]


def _spread(values: list[float], digits: int) -> dict:
    return {
        "median": round(statistics.median(values), digits),
        "min": round(min(values), digits),
        "max": round(max(values), digits),
    }


async def bench_append(peer: Peer, concurrency: int, shape: str, repeat: int, args) -> dict:
    runs = []
    for i in range(repeat):
        run = await measure_append(peer, concurrency, shape, args.warmup, args.duration)
        if not run.latencies:
            raise RuntimeError(
                f"{peer.name}: no call completed in {args.duration}s; raise --duration"
            )
        log(
            f"{peer.name}: append {shape} c={concurrency} run {i + 1}/{repeat}: "
            f"{run.exchanges_per_sec:.1f} exchanges/s, "
            f"p50 {_percentile(run.latencies, 0.5) * 1e3:.2f} ms, "
            f"p99 {_percentile(run.latencies, 0.99) * 1e3:.2f} ms"
        )
        runs.append(run)
    # Latency percentiles come from the run with the median throughput (the
    # lower middle one for an even --repeat).
    median_run = sorted(runs, key=lambda r: r.exchanges_per_sec)[(len(runs) - 1) // 2]
    return {
        "concurrency": concurrency,
        "shape": shape,
        "runs": len(runs),
        "exchanges_per_sec": _spread([r.exchanges_per_sec for r in runs], 1),
        "p50_ms": round(_percentile(median_run.latencies, 0.5) * 1e3, 3),
        "p99_ms": round(_percentile(median_run.latencies, 0.99) * 1e3, 3),
    }


async def bench_read(peer: Peer, messages: int, args) -> dict:
    session = await peer.open_session(_new_session_id())
    try:
        await session.fill(messages)
        # One untimed read warms caches and checks the session is whole.
        if (got := await session.read_all()) != messages:
            raise RuntimeError(f"{peer.name}: read {got} messages, expected {messages}")
        timings = []
        for i in range(args.repeat):
            began = time.perf_counter()
            await session.read_all()
            timings.append((time.perf_counter() - began) * 1e3)
            log(
                f"{peer.name}: read {messages} messages run {i + 1}/{args.repeat}: "
                f"{timings[-1]:.2f} ms"
            )
    finally:
        await session.close()
    return {"messages": messages, "ms": _spread(timings, 3)}


async def bench_peer(peer: Peer, args) -> dict:
    await peer.start()
    try:
        log(
            f"{peer.name}: pre-filling {PREFILL_SESSIONS} sessions of "
            f"{PREFILL_MESSAGES_PER_SESSION} messages"
        )
        for _ in range(PREFILL_SESSIONS):
            session = await peer.open_session(_new_session_id())
            try:
                await session.fill(PREFILL_MESSAGES_PER_SESSION)
            finally:
                await session.close()
        await peer.analyze()
        # Both shapes at one count, then the next count: drift over the run
        # falls on the shapes alike.
        append = [
            await bench_append(peer, c, shape, args.repeat if n == 0 else args.repeat_later, args)
            for c in args.concurrency
            for n, shape in enumerate(args.shapes)
        ]
        read = [await bench_read(peer, n, args) for n in args.read_sizes]
    finally:
        await peer.stop()
    return {
        "name": peer.name,
        "database": peer.database,
        "version": version(peer.distribution),
        "notes": peer.notes,
        "append": append,
        "read": read,
    }


# --- PostgreSQL database for the run ----------------------------------------


class ScratchDatabase:
    """A database created for this run from an admin URL, dropped on exit.

    Only a database this object created is ever dropped."""

    def __init__(self, admin_url: str):
        self.admin_url = admin_url
        self.name = f"sessionstore_bench_peers_{os.getpid()}"
        self.created = False
        # The admin URL with this database's name as its path, and without TLS
        # unless the URL asks for it: sessionstore's driver (sqlx, built without
        # a TLS feature) talks plain TCP, whereas libpq and asyncpg default to
        # sslmode=prefer and so to TLS with a server that offers it.
        url = urlsplit(admin_url)
        query = {"sslmode": ["disable"], **parse_qs(url.query)}
        self.url = urlunsplit(
            url._replace(path="/" + self.name, query=urlencode(query, doseq=True))
        )

    def _admin(self, statement: sql.Composable) -> None:
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(statement)

    def __enter__(self) -> ScratchDatabase:
        self._admin(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(self.name)))
        self.created = True
        log(f"created database {self.name}")
        return self

    def __exit__(self, *exc_info) -> None:
        if not self.created:
            return
        # FORCE ends connections an interrupted run may have left open.
        self._admin(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(self.name))
        )
        log(f"dropped database {self.name}")

    def server_version(self) -> str:
        with psycopg.connect(self.url) as conn:
            return conn.execute("SHOW server_version").fetchone()[0]


# --- Command line -----------------------------------------------------------


def _int_list(text: str) -> list[int]:
    values = [int(part) for part in text.split(",") if part.strip()]
    if any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"positive integers expected: {text!r}")
    return values


def _shape_list(text: str) -> list[str]:
    shapes = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [s for s in shapes if s not in SHAPES]
    if unknown or not shapes:
        raise argparse.ArgumentTypeError(f"shapes of {', '.join(SHAPES)} expected: {text!r}")
    return shapes


def _positive_float(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"a positive number expected: {text!r}")
    return value


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--postgres-url",
        default=os.environ.get("SESSIONSTORE_BENCH_POSTGRES_URL"),
        help="admin URL of a PostgreSQL server, e.g. postgres://postgres@127.0.0.1:5432/postgres "
        "(default: $SESSIONSTORE_BENCH_POSTGRES_URL; without one the PostgreSQL peers are skipped)",
    )
    parser.add_argument(
        "--duration",
        type=_positive_float,
        default=3.0,
        help="seconds measured per append run (default 3)",
    )
    parser.add_argument(
        "--warmup",
        type=float,
        default=0.5,
        help="seconds of appends before each run's measurement (default 0.5)",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=3,
        help="runs per measurement; median, min and max are reported (default 3)",
    )
    parser.add_argument(
        "--repeat-later",
        type=int,
        help="runs per measurement of every shape after the first in --shapes (default: --repeat)",
    )
    parser.add_argument(
        "--concurrency",
        type=_int_list,
        default=[1, 16, 64],
        help="comma-separated writer counts (default 1,16,64)",
    )
    parser.add_argument(
        "--shapes",
        type=_shape_list,
        default=list(SHAPES),
        help=f"comma-separated exchange shapes to append, of {', '.join(SHAPES)} "
        f"(default all; user and answer characters: "
        f"{', '.join(f'{k} {u} + {a}' for k, (u, a) in SHAPES.items())})",
    )
    parser.add_argument(
        "--read-sizes",
        type=_int_list,
        default=[1000, 10000],
        help="comma-separated session sizes, in messages, to read back "
        "(default 1000,10000; empty for none)",
    )
    parser.add_argument(
        "--only",
        help="comma-separated peers to run, each a case-insensitive part of a "
        f"name: {'; '.join(PEER_NAMES)}",
    )
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    if args.repeat_later is None:
        args.repeat_later = args.repeat
    if args.repeat_later < 1:
        parser.error("--repeat-later must be at least 1")
    if args.warmup < 0:
        parser.error("--warmup must not be negative")
    if not args.concurrency:
        parser.error("--concurrency needs at least one value")
    args.peers = PEER_NAMES
    if args.only:
        wanted = [w.strip().lower() for w in args.only.split(",") if w.strip()]
        for w in wanted:
            if not any(w in name.lower() for name in PEER_NAMES):
                parser.error(f"--only: {w!r} matches no peer of: {'; '.join(PEER_NAMES)}")
        args.peers = [n for n in PEER_NAMES if any(w in n.lower() for w in wanted)]
    return args


async def run_peers(args, database: ScratchDatabase | None) -> tuple[list, list]:
    results, skipped = [], []
    for name in args.peers:
        if name == AgentsSQLitePeer.name:
            peer = AgentsSQLitePeer()
        elif database is None:
            reason = (
                f"{name}: no PostgreSQL URL (--postgres-url or SESSIONSTORE_BENCH_POSTGRES_URL)"
            )
            log(f"skipped {reason}")
            skipped.append(reason)
            continue
        elif name == AgentsSQLAlchemyPeer.name:
            peer = AgentsSQLAlchemyPeer(database.url)
        else:
            peer = LangchainPostgresPeer(database.url)
        log(f"{name}: start")
        results.append(await bench_peer(peer, args))
    return results, skipped


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    # SIGTERM unwinds like Ctrl-C, so the scratch database is still dropped.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    needs_postgres = any(
        n in args.peers for n in (AgentsSQLAlchemyPeer.name, LangchainPostgresPeer.name)
    )
    postgres_version = None
    if needs_postgres and args.postgres_url:
        with ScratchDatabase(args.postgres_url) as database:
            postgres_version = database.server_version()
            peers, skipped = asyncio.run(run_peers(args, database))
    else:
        peers, skipped = asyncio.run(run_peers(args, None))
    document = {
        "peers": peers,
        "skipped": skipped,
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "postgres": postgres_version,
        "workload": {
            "message_chars": MESSAGE_CHARS,
            "shapes": {shape: SHAPES[shape] for shape in args.shapes},
            "prefill_messages": PREFILL_SESSIONS * PREFILL_MESSAGES_PER_SESSION,
            "duration_s": args.duration,
            "warmup_s": args.warmup,
            "repeat": args.repeat,
        },
    }
    print(json.dumps(document, indent=2))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except KeyboardInterrupt:
        log("interrupted")
        sys.exit(130)
