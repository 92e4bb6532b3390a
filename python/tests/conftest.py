"""Fixtures: the real ``sessionstore`` server binary (``SESSIONSTORE_BIN``) on
an ephemeral port, plain, with bearer tokens, or behind TLS."""

from __future__ import annotations

import datetime
import hashlib
import logging
import os
import re
import signal
import socket
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pytest

import sessionstore

REPO = Path(__file__).resolve().parents[2]
READY = re.compile(r"sessionstore serving address=(\S+):(\d+)")


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
    ``SERVING``."""

    def __init__(
        self,
        database_url: str = "sqlite::memory:",
        args: tuple[str, ...] = (),
        tls: Tls | None = None,
    ) -> None:
        self.database_url = database_url
        self.args = args
        self.tls = tls
        self.port: int | None = None
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
        with self.client(request_timeout=30) as client:
            assert client.health_check(wait_for_ready=True, timeout=30), "".join(self.log)
        return self

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
