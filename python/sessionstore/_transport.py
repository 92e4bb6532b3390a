"""What both clients share: the URL, TLS settings, channel options, call
metadata and the small health-check codec."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Union
from urllib.parse import urlsplit

import grpc

from . import __version__

#: A CA certificate (or client certificate/key): a path, or the PEM itself.
PemSource = Union[str, "os.PathLike[str]", bytes]

HEALTH_CHECK = "/grpc.health.v1.Health/Check"


@dataclass(frozen=True)
class Target:
    """A parsed server URL."""

    address: str
    secure: bool


def parse_url(url: str) -> Target:
    """``http://HOST:PORT`` (plaintext), ``https://HOST:PORT`` (TLS), or a
    bare ``HOST:PORT`` (plaintext, as the server's ``--listen`` takes)."""
    if "://" not in url:
        return Target(url, False)
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"unsupported URL scheme {parts.scheme!r} in {url!r}: use http or https")
    if not parts.hostname:
        raise ValueError(f"no host in {url!r}")
    secure = parts.scheme == "https"
    port = parts.port or (443 if secure else 80)
    host = parts.hostname
    if ":" in host:  # IPv6 literal
        host = f"[{host}]"
    return Target(f"{host}:{port}", secure)


def read_pem(source: PemSource) -> bytes:
    """The PEM bytes of ``source``: bytes as they are, a string starting with
    ``-----BEGIN`` as PEM text, anything else as a file path."""
    if isinstance(source, bytes):
        return source
    if isinstance(source, str) and source.lstrip().startswith("-----BEGIN"):
        return source.encode()
    with open(source, "rb") as file:
        return file.read()


def channel_options(tls_domain_name: str | None) -> list[tuple[str, object]]:
    """Channel options: unbounded sends (the server enforces its own limit),
    large receives, keepalive pings so a dead connection under a watch is
    noticed, and a short reconnect backoff so a restarted server is found
    again quickly (the client's own retries decide how long to keep trying)."""
    options: list[tuple[str, object]] = [
        ("grpc.primary_user_agent", f"sessionstore-python/{__version__}"),
        ("grpc.max_send_message_length", -1),
        ("grpc.max_receive_message_length", 256 * 1024 * 1024),
        ("grpc.keepalive_time_ms", 30_000),
        ("grpc.keepalive_timeout_ms", 10_000),
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.min_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", 2_000),
        ("grpc.enable_retries", 0),
    ]
    if tls_domain_name:
        options.append(("grpc.ssl_target_name_override", tls_domain_name))
    return options


def credentials(
    tls_ca_certificate: PemSource | None,
    tls_client_certificate: PemSource | None,
    tls_client_key: PemSource | None,
) -> grpc.ChannelCredentials:
    """TLS credentials trusting ``tls_ca_certificate`` (the system's roots if
    ``None``), with a client identity for mutual TLS if both halves are given."""
    if (tls_client_certificate is None) != (tls_client_key is None):
        raise ValueError("tls_client_certificate and tls_client_key go together")
    return grpc.ssl_channel_credentials(
        root_certificates=read_pem(tls_ca_certificate) if tls_ca_certificate is not None else None,
        private_key=read_pem(tls_client_key) if tls_client_key is not None else None,
        certificate_chain=(
            read_pem(tls_client_certificate) if tls_client_certificate is not None else None
        ),
    )


def call_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    """The metadata sent with every call: the bearer token, if any."""
    if token is None:
        return ()
    if not token or any(c in token for c in "\r\n"):
        raise ValueError("the bearer token must be a non-empty single line")
    return (("authorization", f"Bearer {token}"),)


def encode_health_request(service: str) -> bytes:
    """``grpc.health.v1.HealthCheckRequest{service}``, encoded by hand (no
    extra dependency for one string field)."""
    data = service.encode()
    if not data:
        return b""
    length = len(data)
    varint = bytearray()
    while True:
        byte = length & 0x7F
        length >>= 7
        if length:
            varint.append(byte | 0x80)
        else:
            varint.append(byte)
            break
    return b"\x0a" + bytes(varint) + data


def decode_health_status(data: bytes) -> int:
    """``HealthCheckResponse.status`` (1 is ``SERVING``) from its encoding."""
    if len(data) >= 2 and data[0] == 0x08:
        return data[1]
    return 0
