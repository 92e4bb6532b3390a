"""Fixtures: the real ``sessionstore`` server binary (``SESSIONSTORE_BIN``) on
an ephemeral port, plain, with bearer tokens, behind TLS, or serving its
Prometheus metrics, whose call counts say what a piece of code cost in RPCs
(:class:`RpcMeter`)."""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import logging
import os
import re
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pytest

import sessionstore

REPO = Path(__file__).resolve().parents[2]
READY = re.compile(r"sessionstore serving address=(\S+):(\d+)")
METRICS = re.compile(r"metrics serving at /metrics address=(\S+):(\d+)")
#: The service whose calls :meth:`Server.rpcs` counts.
SERVICE = "sessionstore.v1.SessionStore"
_SAMPLE = re.compile(
    r'^(grpc_server_started_total|grpc_server_handled_total)\{grpc_service="([^"]*)",'
    r'grpc_method="([^"]*)"(?:,grpc_code="([^"]*)")?\} (\S+)$'
)


def server_binary() -> str:
    """``SESSIONSTORE_BIN``, else a cargo build's binary in the repository."""
    path = os.environ.get("SESSIONSTORE_BIN")
    if path:
        return path
    for candidate in (REPO / "target/debug/sessionstore", REPO / "target/release/sessionstore"):
        if candidate.exists():
            return str(candidate)
    pytest.fail(
        "no server binary: set SESSIONSTORE_BIN (cargo build -p sessionstore-server --bin sessionstore)"
    )


def free_port() -> int:
    """A port nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Tls:
    """A CA and a server certificate it signed, for localhost and 127.0.0.1."""

    ca_pem: bytes
    ca_path: Path
    cert_path: Path
    key_path: Path


def make_tls(directory: Path) -> Tls:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "sessionstore test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    import ipaddress

    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [
                    x509.DNSName("localhost"),
                    x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                ]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    ca_pem = ca.public_bytes(serialization.Encoding.PEM)
    tls = Tls(
        ca_pem=ca_pem,
        ca_path=directory / "ca.pem",
        cert_path=directory / "server.pem",
        key_path=directory / "server.key",
    )
    tls.ca_path.write_bytes(ca_pem)
    tls.cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    tls.key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return tls


class Server:
    """A ``sessionstore serve`` child process. ``start`` returns once the
    process logged the address it bound and its health service answers
    ``SERVING``. With ``metrics`` it serves Prometheus metrics on an
    ephemeral port too (``--metrics-listen``), read by :meth:`rpcs`."""

    def __init__(
        self,
        database_url: str = "sqlite::memory:",
        args: tuple[str, ...] = (),
        tls: Tls | None = None,
        metrics: bool = False,
    ) -> None:
        self.database_url = database_url
        self.args = args
        self.tls = tls
        self.metrics = metrics
        self.port: int | None = None
        self.metrics_port: int | None = None
        self.proc: subprocess.Popen[str] | None = None
        self.log: list[str] = []

    @property
    def url(self) -> str:
        scheme = "https" if self.tls else "http"
        return f"{scheme}://127.0.0.1:{self.port}"

    def client(self, **kwargs: Any) -> sessionstore.Client:
        if self.tls is not None:
            kwargs.setdefault("tls_ca_certificate", self.tls.ca_pem)
        return sessionstore.Client(self.url, **kwargs)

    def async_client(self, **kwargs: Any) -> sessionstore.AsyncClient:
        if self.tls is not None:
            kwargs.setdefault("tls_ca_certificate", self.tls.ca_pem)
        return sessionstore.AsyncClient(self.url, **kwargs)

    def start(self, port: int | None = None) -> Server:
        """Starts on ``port`` (the previous one after a restart; any free
        one the first time)."""
        port = port if port is not None else (self.port or 0)
        argv = [
            server_binary(),
            "serve",
            "--listen",
            f"127.0.0.1:{port}",
            "--database-url",
            self.database_url,
            *self.args,
        ]
        if self.tls is not None:
            argv += ["--tls-cert", str(self.tls.cert_path), "--tls-key", str(self.tls.key_path)]
        if self.metrics:
            argv += ["--metrics-listen", "127.0.0.1:0"]
        env = {**os.environ, "NO_COLOR": "1", "SESSIONSTORE_LOG": "info"}
        env.pop("SESSIONSTORE_AUTH_TOKENS", None)
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
            text=True,
        )
        bound: dict[str, int] = {}
        ready = threading.Event()
        proc = self.proc

        def read() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                self.log.append(line)
                metrics = METRICS.search(line)
                if metrics:  # logged before the gRPC address
                    bound["metrics"] = int(metrics.group(2))
                found = READY.search(line)
                if found and not ready.is_set():
                    bound["port"] = int(found.group(2))
                    ready.set()
            ready.set()  # the process ended: stop waiting

        threading.Thread(target=read, daemon=True).start()
        if not ready.wait(30) or "port" not in bound:
            self.kill()
            pytest.fail("sessionstore did not start:\n" + "".join(self.log))
        self.port = bound["port"]
        if self.metrics:
            assert "metrics" in bound, "no metrics address logged:\n" + "".join(self.log)
            self.metrics_port = bound["metrics"]
        with self.client(request_timeout=30) as client:
            assert client.health_check(wait_for_ready=True, timeout=30), "".join(self.log)
        return self

    def rpcs(self) -> Counter[str]:
        """The calls of ``sessionstore.v1.SessionStore`` the server has
        handled so far, from its ``grpc_server_handled_total``: by method
        (``"AppendExchange"``) for those that ended ``OK``, by method and
        code (``"AppendExchange NotFound"``) for the others. Read once no
        call is in flight (as many started as handled), so a call whose
        answer the client has seen is counted."""
        assert self.metrics_port is not None, "start the server with metrics=True"
        deadline = time.monotonic() + 10
        while True:
            url = f"http://127.0.0.1:{self.metrics_port}/metrics"
            with urllib.request.urlopen(url, timeout=10) as response:
                text = response.read().decode("utf-8")
            started = 0.0
            handled: Counter[str] = Counter()
            for line in text.splitlines():
                sample = _SAMPLE.match(line)
                if sample is None or sample.group(2) != SERVICE:
                    continue
                name, _, method, code, value = sample.groups()
                if name == "grpc_server_started_total":
                    started += float(value)
                else:
                    handled[method if code == "OK" else f"{method} {code}"] += int(float(value))
            if started == sum(handled.values()) or time.monotonic() > deadline:
                return handled
            time.sleep(0.01)

    def terminate(self) -> None:
        """SIGTERM (graceful shutdown), and wait for the exit."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(30)

    def kill(self) -> None:
        """SIGKILL, and wait for the process to be gone."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)


@pytest.fixture
def make_server(tmp_path: Path) -> Iterator[Callable[..., Server]]:
    """Starts servers (``make_server(database_url=..., args=..., tls=...)``),
    each killed at the end of the test."""
    servers: list[Server] = []

    def make(start: bool = True, **kwargs: Any) -> Server:
        server = Server(**kwargs)
        servers.append(server)
        return server.start() if start else server

    yield make
    for server in servers:
        server.kill()


@pytest.fixture
def server(make_server: Callable[..., Server]) -> Server:
    """A server on an in-memory SQLite database."""
    return make_server()


@pytest.fixture
def metered_server(make_server: Callable[..., Server]) -> Server:
    """A server on an in-memory SQLite database serving its metrics."""
    return make_server(metrics=True)


class RpcMeter:
    """What a block of code costs in RPCs, as the server counts them
    (:meth:`Server.rpcs`)::

        with meter() as cost:
            await session.add_items(items)
        assert cost == {"AppendExchange": 1}
    """

    def __init__(self, server: Server) -> None:
        self.server = server

    @contextlib.contextmanager
    def __call__(self) -> Iterator[Counter[str]]:
        before = self.server.rpcs()
        cost: Counter[str] = Counter()
        yield cost
        cost.update(self.server.rpcs() - before)


@pytest.fixture
def meter(metered_server: Server) -> RpcMeter:
    """Counts RPCs on ``metered_server``."""
    return RpcMeter(metered_server)


@pytest.fixture
def client(server: Server) -> Iterator[sessionstore.Client]:
    with server.client() as client:
        yield client


TOKENS = {"acme": "acme-token", "globex": "globex-token"}


@pytest.fixture
def auth_server(make_server: Callable[..., Server], tmp_path: Path) -> Server:
    """A server with ``--auth-tokens``: tenants ``acme`` and ``globex``
    (tokens in ``TOKENS``)."""
    lines = [
        f"{tenant} {hashlib.sha256(token.encode()).hexdigest()}" for tenant, token in TOKENS.items()
    ]
    tokens = tmp_path / "tokens"
    tokens.write_text("# tenants of the Python tests\n" + "\n".join(lines) + "\n")
    return make_server(args=("--auth-tokens", str(tokens)))


@pytest.fixture
def tls(tmp_path: Path) -> Tls:
    return make_tls(tmp_path)


class RetrySignal(logging.Handler):
    """Sets ``retried`` when the client logs its first retry."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.retried = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("retrying"):
            self.retried.set()


@pytest.fixture
def retry_signal() -> Iterator[RetrySignal]:
    logger = logging.getLogger("sessionstore")
    handler = RetrySignal()
    level = logger.level
    logger.setLevel(logging.DEBUG)
    logger.addHandler(handler)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(level)
