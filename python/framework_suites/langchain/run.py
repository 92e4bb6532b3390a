#!/usr/bin/env python3
"""Runs langchain-core's own chat-history tests against sessionstore.

Downloads the pinned langchain-core sdist from PyPI (``pip download``),
checks its SHA-256, extracts only the test files below (with the
``__init__``/conftest/helper files they need) into a temporary directory,
adds a root ``conftest.py`` that starts a real sessionstore server
(``SESSIONSTORE_BIN``) and makes the tests' ``InMemoryChatMessageHistory``
a :class:`SessionstoreChatMessageHistory` on that server, and runs pytest on
them. The test files are not changed. Exits with pytest's status (non-zero
on any failure), or 2 when something needed is missing.

Usage::

    SESSIONSTORE_BIN=/path/to/sessionstore python python/framework_suites/langchain/run.py [PYTEST ARGS...]

Needs, in the running Python: langchain-core at the pinned version,
sessionstore-client with its ``[test,langchain]`` extras, and the two test
dependencies langchain-core's ``tests/unit_tests/conftest.py`` imports,
``blockbuster`` and ``pytest-mock``. ``--keep`` keeps the temporary directory.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import textwrap
from pathlib import Path

PACKAGE = "langchain-core"
VERSION = "1.8.3"
SDIST = f"langchain_core-{VERSION}.tar.gz"
SHA256 = "ce448f055dd2cf1db7def27d2b6c2902519369642e8b89d08255c7ca7abd6b36"

#: The test modules run, as paths inside the sdist's top directory.
TEST_FILES = [
    "tests/unit_tests/chat_history/test_chat_history.py",
    "tests/unit_tests/runnables/test_history.py",
]
#: What they need beside them: packages, conftests and the helper
#: ``test_history.py`` imports (``tests.unit_tests.pydantic_utils``).
SUPPORT_FILES = [
    "tests/__init__.py",
    "tests/unit_tests/__init__.py",
    "tests/unit_tests/conftest.py",
    "tests/unit_tests/pydantic_utils.py",
    "tests/unit_tests/chat_history/__init__.py",
    "tests/unit_tests/runnables/__init__.py",
    "tests/unit_tests/runnables/conftest.py",
]
#: Modules whose ``InMemoryChatMessageHistory`` is swapped for the
#: sessionstore history during each test.
SWAPPED_MODULES = [
    "tests.unit_tests.chat_history.test_chat_history",
    "tests.unit_tests.runnables.test_history",
]
#: Tests left out, each with the reason. None: every test applies.
DESELECTED: dict[str, str] = {}

#: Importable modules the extracted tests and conftests need.
REQUIRED = {
    "langchain_core": "langchain-core",
    "sessionstore.integrations.langchain": "sessionstore-client[langchain]",
    "pytest": "pytest",
    "pytest_asyncio": "pytest-asyncio",
    "pytest_mock": "pytest-mock",
    "blockbuster": "blockbuster",
    "langsmith": "langsmith",
}

PYTEST_INI = """\
[pytest]
# langchain-core's own settings for these tests (its pyproject.toml), less
# the plugins they do not use.
asyncio_mode = auto
asyncio_default_fixture_loop_scope = function
markers =
    requires: mark tests as requiring a specific library
    compile: mark placeholder test used to compile integration tests without running them
filterwarnings =
    ignore::langchain_core._api.beta_decorator.LangChainBetaWarning
"""

CONFTEST = '''\
"""Added by the sessionstore runner (not part of langchain-core): a real
sessionstore server for the session, and, during each test, the test
modules' ``InMemoryChatMessageHistory`` replaced by a sessionstore-backed
history on it."""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import threading
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

import pytest
from langchain_core.messages import BaseMessage

import sessionstore
from sessionstore.integrations.langchain import SessionstoreChatMessageHistory

SWAPPED_MODULES = {swapped!r}
READY = re.compile(r"sessionstore serving address=(\\S+):(\\d+)")


class _Server:
    client: sessionstore.Client | None = None
    async_client: sessionstore.AsyncClient | None = None
    url = ""


SERVER = _Server()


@pytest.fixture(scope="session", autouse=True)
def sessionstore_server() -> Iterator[_Server]:
    """``SESSIONSTORE_BIN serve`` on an ephemeral port and an in-memory
    database, killed at the end of the session."""
    binary = os.environ.get("SESSIONSTORE_BIN")
    if not binary:
        pytest.fail("set SESSIONSTORE_BIN to the sessionstore server binary", pytrace=False)
    env = {{**os.environ, "NO_COLOR": "1", "SESSIONSTORE_LOG": "info"}}
    env.pop("SESSIONSTORE_AUTH_TOKENS", None)
    proc = subprocess.Popen(
        [binary, "serve", "--listen", "127.0.0.1:0", "--database-url", "sqlite::memory:"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        text=True,
    )
    log: list[str] = []
    bound: dict[str, int] = {{}}
    ready = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            log.append(line)
            found = READY.search(line)
            if found and not ready.is_set():
                bound["port"] = int(found.group(2))
                ready.set()
        ready.set()

    threading.Thread(target=read, daemon=True).start()
    try:
        if not ready.wait(30) or "port" not in bound:
            pytest.fail("sessionstore did not start:\\n" + "".join(log), pytrace=False)
        SERVER.url = f"http://127.0.0.1:{{bound['port']}}"
        with sessionstore.Client(SERVER.url) as client:
            assert client.health_check(wait_for_ready=True, timeout=30), "".join(log)
            SERVER.client = client
            yield SERVER
            SERVER.client = None
    finally:
        proc.kill()
        proc.wait(30)


@pytest.fixture(autouse=True)
async def sessionstore_async_client(sessionstore_server: _Server) -> AsyncIterator[None]:
    """An asyncio client on the test's own event loop."""
    async with sessionstore.AsyncClient(sessionstore_server.url) as client:
        SERVER.async_client = client
        yield
        SERVER.async_client = None


class SessionstoreHistoryUnderTest(SessionstoreChatMessageHistory):
    """Stands where the tests construct ``InMemoryChatMessageHistory``: each
    instance is a new session on the real server (an in-memory history
    starts empty and is not shared either), seeded with ``messages`` in one
    ``add_messages`` as ``InMemoryChatMessageHistory(messages=...)`` is.

    The tests compare histories with ``==`` (``store == {{"1":
    InMemoryChatMessageHistory(messages=[...])}}``), which for the pydantic
    in-memory class compares the messages: here too, as read back from the
    server.
    """

    def __init__(self, messages: Sequence[BaseMessage] | None = None) -> None:
        super().__init__(
            f"framework-suite/{{uuid.uuid4()}}",
            client=SERVER.client,
            async_client=SERVER.async_client,
        )
        if messages:
            self.add_messages(messages)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, SessionstoreChatMessageHistory):
            return self.messages == other.messages
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]


@pytest.fixture(autouse=True)
def swap_history_class(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[list[SessionstoreHistoryUnderTest]]:
    """During the test, the module's ``InMemoryChatMessageHistory`` name is
    the sessionstore history; every instance made is recorded."""
    made: list[SessionstoreHistoryUnderTest] = []

    class Recorded(SessionstoreHistoryUnderTest):
        def __init__(self, messages: Sequence[BaseMessage] | None = None) -> None:
            super().__init__(messages)
            made.append(self)

    Recorded.__name__ = Recorded.__qualname__ = "SessionstoreHistoryUnderTest"
    module = request.module.__name__
    if module in SWAPPED_MODULES:
        monkeypatch.setattr(importlib.import_module(module), "InMemoryChatMessageHistory", Recorded)
    yield made
    if made:
        USED[request.node.nodeid] = len(made)


#: Tests that made sessionstore histories, with how many.
USED: dict[str, int] = {{}}


def pytest_terminal_summary(terminalreporter: Any) -> None:
    terminalreporter.section("sessionstore")
    terminalreporter.write_line(
        f"{{len(USED)}} tests ran on SessionstoreChatMessageHistory (server {{SERVER.url}}), "
        "as InMemoryChatMessageHistory of " + ", ".join(SWAPPED_MODULES) + ":"
    )
    for nodeid, count in USED.items():
        terminalreporter.write_line(f"  {{nodeid}} ({{count}} histories)")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if exitstatus == 0 and session.testscollected and not USED:
        # The swap did nothing: the tests would only have tested the in-memory class.
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
'''


def fail(message: str) -> None:
    print(f"run.py: {message}", file=sys.stderr)
    raise SystemExit(2)


def check_environment() -> None:
    missing = []
    for module, requirement in REQUIRED.items():
        try:
            __import__(module)
        except ImportError:
            missing.append(requirement)
    if missing:
        fail("missing in this Python: pip install " + " ".join(repr(r) for r in missing))
    installed = importlib.metadata.version(PACKAGE)
    if installed != VERSION:
        fail(
            f"{PACKAGE} {installed} is installed but the tests are pinned to {VERSION}: "
            f"pip install {PACKAGE}=={VERSION} (or update VERSION and SHA256 here)"
        )
    binary = os.environ.get("SESSIONSTORE_BIN")
    if not binary or not os.access(binary, os.X_OK):
        fail("set SESSIONSTORE_BIN to an executable sessionstore server binary")


def download(directory: Path) -> Path:
    """The pinned sdist, downloaded with pip and checked against SHA256."""
    subprocess.run(
        [
            sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
            "--no-binary", ":all:", "--dest", str(directory), f"{PACKAGE}=={VERSION}",
        ],
        check=True,
    )
    sdist = directory / SDIST
    if not sdist.exists():
        fail(f"pip did not download {SDIST} (got {sorted(p.name for p in directory.iterdir())})")
    digest = hashlib.sha256(sdist.read_bytes()).hexdigest()
    if digest != SHA256:
        fail(f"{SDIST} has sha256 {digest}, expected {SHA256}: refusing to run it")
    return sdist


def extract(sdist: Path, target: Path) -> None:
    """Only TEST_FILES and SUPPORT_FILES, byte for byte, under ``target``."""
    top = f"langchain_core-{VERSION}/"
    wanted = {top + path: path for path in TEST_FILES + SUPPORT_FILES}
    with tarfile.open(sdist, "r:gz") as archive:
        for member in archive.getmembers():
            path = wanted.pop(member.name, None)
            if path is None:
                continue
            if not member.isfile():
                fail(f"{member.name} in {SDIST} is not a regular file")
            source = archive.extractfile(member)
            assert source is not None
            destination = target / path
            destination.parent.mkdir(parents=True, exist_ok=True)
            destination.write_bytes(source.read())
    if wanted:
        fail(f"{SDIST} lacks {sorted(wanted.values())}")


def main(argv: list[str]) -> int:
    keep = "--keep" in argv
    pytest_args = [arg for arg in argv if arg != "--keep"]
    check_environment()
    workdir = Path(tempfile.mkdtemp(prefix="sessionstore-langchain-suite-"))
    try:
        extract(download(workdir / "download"), workdir / "suite")
        suite = workdir / "suite"
        (suite / "pytest.ini").write_text(PYTEST_INI)
        (suite / "conftest.py").write_text(CONFTEST.format(swapped=SWAPPED_MODULES))
        command = [
            sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA",
            *(f"--deselect={test}" for test in DESELECTED),
            *TEST_FILES, *pytest_args,
        ]
        if DESELECTED:
            print("deselected (cannot apply to a remote store):")
            for test, reason in DESELECTED.items():
                print(f"  {test}: {reason}")
        print(f"{PACKAGE} {VERSION} ({SDIST}, sha256 {SHA256}) in {suite}", flush=True)
        env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
        return subprocess.run(command, cwd=suite, env=env).returncode
    finally:
        if keep:
            print(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
