#!/usr/bin/env python3
"""Runs the OpenAI Agents SDK's own session tests against SessionstoreSession.

The tests are not kept in this repository: this script downloads the
pinned sdist of ``openai-agents`` from PyPI (``pip download``), checks its
SHA-256, extracts only the session test files and the helpers they import
into a temporary directory, adds ``swap_conftest.py`` there as the root
``conftest.py`` (a real sessionstore server, and ``SessionstoreSession`` in
place of ``SQLiteSession``), and runs pytest on them unmodified. Tests that
inspect ``SQLiteSession``'s own internals are deselected, each with its
reason below.

Usage (from the repository root, in a virtualenv with
``pip install -e './python[test,openai-agents]'``)::

    SESSIONSTORE_BIN=/path/to/sessionstore python python/framework_suites/openai_agents/run.py

Options: ``--sdist PATH`` uses an already downloaded sdist (still checked
against the pinned hash); ``--keep`` leaves the temporary directory; any
arguments after ``--`` go to pytest. Exits with pytest's status: non-zero
when any test fails.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

PACKAGE = "openai-agents"
VERSION = "0.24.0"
SDIST = f"openai_agents-{VERSION}.tar.gz"
SDIST_SHA256 = "4b4b285f4fed81fdf1b4ac426a9101658d9cd29b4fb1aaeee18f639b77e704e3"
ROOT = f"openai_agents-{VERSION}"

#: The session test files: every test in them that constructs ``SQLiteSession``.
TEST_FILES = [
    "tests/memory/test_session.py",
    "tests/memory/test_session_limit.py",
]
#: What they import: the SDK's test package, its conftest and helpers.
HELPER_FILES = [
    "tests/__init__.py",
    "tests/conftest.py",
    "tests/testing_processor.py",
    "tests/test_responses.py",
]

_SQLITE_CONNECTIONS = (
    "inspects SQLiteSession's per-thread sqlite3 connections (session._connections)"
)
_SQLITE_ROWS = (
    "writes a corrupt row straight into SQLiteSession's sqlite table "
    "(session._locked_connection); the adapter's skipping of messages it cannot "
    "read is tested in tests/integrations/test_openai_agents.py"
)
_SQLITE_FAILURE = (
    "makes SQLiteSession's sqlite statements fail (drops its tables or swaps its "
    "sqlite3 connection) and checks the sqlite write lock and transaction afterwards"
)

#: Deselected tests (pytest node ids under tests/memory/) and why.
DESELECTED: dict[str, str] = {
    "test_session.py::test_sqlite_session_close_closes_worker_thread_connections": _SQLITE_CONNECTIONS,
    "test_session.py::test_sqlite_session_reaps_connections_from_exited_worker_threads": _SQLITE_CONNECTIONS,
    "test_session.py::test_sqlite_session_closes_retired_connections_before_the_next_allocation": (
        _SQLITE_CONNECTIONS + " and patches sqlite3.connect"
    ),
    "test_session.py::test_sqlite_session_keeps_connections_of_live_worker_threads": _SQLITE_CONNECTIONS,
    "test_session.py::test_sqlite_session_closed_rejects_empty_add_items": (
        "checks SQLiteSession.close() shutting its sqlite connections "
        "('SQLiteSession is closed'); SessionstoreSession holds no connection "
        "(the AsyncClient belongs to the caller)"
    ),
    "test_session.py::test_sqlite_session_pop_item_skips_corrupt_most_recent": _SQLITE_ROWS,
    "test_session.py::test_sqlite_session_pop_item_returns_none_after_dropping_only_corrupt_rows": _SQLITE_ROWS,
    "test_session.py::test_sqlite_session_get_items_limit_skips_corrupt_newest_rows": _SQLITE_ROWS,
    "test_session.py::test_sqlite_session_get_items_session_settings_limit_skips_corrupt_rows": _SQLITE_ROWS,
    "test_session.py::test_sqlite_session_file_lock_is_shared_across_instances": (
        "inspects SQLiteSession's process-local per-file lock registry "
        "(session._lock, SQLiteSession._file_lock_counts)"
    ),
    "test_session.py::test_sqlite_session_failed_add_items_releases_write_lock": (
        "after the failed add (which the adapter also refuses, before any RPC) it "
        "opens the sqlite file itself to probe SQLiteSession's tables and write lock"
    ),
    "test_session.py::test_sqlite_session_failed_clear_session_rolls_back": _SQLITE_FAILURE,
    "test_session.py::test_sqlite_session_failed_pop_item_releases_write_lock": _SQLITE_FAILURE,
    "test_session.py::test_sqlite_session_rollback_failure_evicts_connection": _SQLITE_FAILURE,
    "test_session.py::test_sqlite_session_close_retries_quarantined_connection": _SQLITE_FAILURE,
    "test_session.py::test_sqlite_session_post_commit_cancellation_propagates_after_known_outcome": (
        "pauses inside SQLiteSession's sqlite3 commit (a connection subclass in place "
        "of session._get_connection); the adapter's cancellation outcome is tested "
        "in tests/integrations/test_openai_agents.py"
    ),
}

PYTEST_INI = """\
[pytest]
asyncio_mode = auto
asyncio_default_fixture_loop_scope = session
testpaths = tests
markers =
    allow_call_model_methods: mark test as allowing calls to real model implementations
    requires_native_macos_sandbox: mark test as requiring its own macOS sandbox-exec process
    review_optional: mark a slow subsystem-specific test
    serial: mark test as requiring exclusive execution
"""

HERE = Path(__file__).resolve().parent
PYTHON_DIR = HERE.parents[1]


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for chunk in iter(lambda: file.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def download(directory: Path) -> Path:
    """``pip download`` of the pinned sdist into ``directory``."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--no-binary",
            ":all:",
            f"{PACKAGE}=={VERSION}",
            "--dest",
            str(directory),
        ],
        check=True,
    )
    return directory / SDIST


def extract(sdist: Path, directory: Path) -> None:
    """Extracts only ``TEST_FILES`` and ``HELPER_FILES`` into ``directory``."""
    wanted = {f"{ROOT}/{name}": name for name in TEST_FILES + HELPER_FILES}
    with tarfile.open(sdist, "r:gz") as archive:
        found = set()
        for member in archive.getmembers():
            name = wanted.get(member.name)
            if name is None or not member.isfile():
                continue
            source = archive.extractfile(member)
            assert source is not None
            target = directory / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(source.read())
            found.add(member.name)
    missing = sorted(set(wanted) - found)
    if missing:
        raise SystemExit(f"the sdist lacks {missing}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sdist", type=Path, help="an already downloaded " + SDIST)
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    parser.add_argument("pytest_args", nargs="*", help="after --: arguments for pytest")
    args = parser.parse_args()

    binary = os.environ.get("SESSIONSTORE_BIN")
    if not binary or not Path(binary).is_file():
        print("set SESSIONSTORE_BIN to the sessionstore server binary", file=sys.stderr)
        return 2
    installed = importlib.metadata.version(PACKAGE)
    if installed != VERSION:
        print(
            f"{PACKAGE} {installed} is installed; these are the tests of {VERSION}: "
            f"pip install {PACKAGE}=={VERSION}",
            file=sys.stderr,
        )
        return 2

    work = Path(tempfile.mkdtemp(prefix="openai-agents-suite-"))
    try:
        sdist = args.sdist if args.sdist is not None else download(work / "download")
        actual = sha256_of(sdist)
        if actual != SDIST_SHA256:
            print(f"{sdist}: sha256 {actual}, expected {SDIST_SHA256}", file=sys.stderr)
            return 2
        suite = work / "suite"
        suite.mkdir()
        extract(sdist, suite)
        shutil.copyfile(HERE / "swap_conftest.py", suite / "conftest.py")
        (suite / "pytest.ini").write_text(PYTEST_INI)

        command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rfE", "-q"]
        for node, _reason in DESELECTED.items():
            command += ["--deselect", f"tests/memory/{node}"]
        command += TEST_FILES + list(args.pytest_args)
        env = {
            **os.environ,
            "SESSIONSTORE_SERVER_FIXTURES": str(PYTHON_DIR / "tests" / "conftest.py"),
        }
        print(
            f"{PACKAGE} {VERSION} session tests on SessionstoreSession "
            f"({len(DESELECTED)} deselected by name, see run.py)",
            flush=True,
        )
        return subprocess.run(command, cwd=suite, env=env).returncode
    finally:
        if args.keep:
            print(f"kept {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
