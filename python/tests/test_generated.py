"""The committed gRPC code is what grpcio-tools makes from proto/ now."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

PYTHON_DIR = Path(__file__).resolve().parents[1]


def test_generated_code_is_fresh() -> None:
    checked = subprocess.run(
        [sys.executable, str(PYTHON_DIR / "scripts" / "generate_proto.py"), "--check"],
        capture_output=True,
        text=True,
    )
    assert checked.returncode == 0, (
        "sessionstore/_proto is stale or the generator differs: "
        "run `python scripts/generate_proto.py` in python/\n" + checked.stdout + checked.stderr
    )


def test_generated_modules_import_inside_the_package() -> None:
    from sessionstore import v1
    from sessionstore._proto.sessionstore.v1 import sessionstore_pb2_grpc

    assert v1.AppendExchangeRequest.DESCRIPTOR.full_name == "sessionstore.v1.AppendExchangeRequest"
    assert hasattr(sessionstore_pb2_grpc, "SessionStoreStub")
