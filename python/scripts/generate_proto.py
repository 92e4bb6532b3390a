"""Generates the gRPC code in ``sessionstore/_proto`` from the repository's
``proto/`` with grpcio-tools, or checks that the committed code is fresh.

    python scripts/generate_proto.py            # regenerate in place
    python scripts/generate_proto.py --check    # exit 1 if stale

protoc writes ``from sessionstore.v1 import messages_pb2``; inside this
package that would import the client package itself, so the imports are
rewritten to relative ones (``from . import messages_pb2``).
"""

from __future__ import annotations

import argparse
import difflib
import re
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PACKAGE = HERE.parent / "sessionstore"
DEFAULT_PROTO = HERE.parent.parent / "proto"
PROTO_FILES = ("sessionstore/v1/messages.proto", "sessionstore/v1/sessionstore.proto")
# The generator version the committed code comes from (see pyproject.toml).
GRPCIO_TOOLS_VERSION = "1.85.1"

INIT_DOC = '"""Generated from proto/ by scripts/generate_proto.py. Do not edit."""\n'


def generate(proto_dir: Path, package_dir: Path) -> None:
    """Writes ``_proto/`` (the generated modules and their package files)
    under ``package_dir``."""
    out = package_dir / "_proto"
    with tempfile.TemporaryDirectory() as raw:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "grpc_tools.protoc",
                f"-I{proto_dir}",
                f"--python_out={raw}",
                f"--pyi_out={raw}",
                f"--grpc_python_out={raw}",
                *PROTO_FILES,
            ],
            check=True,
        )
        for path in sorted(Path(raw).rglob("*")):
            if not path.is_file():
                continue
            text = path.read_text(encoding="utf-8")
            text = re.sub(r"^from sessionstore\.v1 import ", "from . import ", text, flags=re.M)
            target = out / path.relative_to(raw)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")
    for init in (out, out / "sessionstore", out / "sessionstore" / "v1"):
        (init / "__init__.py").write_text(INIT_DOC, encoding="utf-8")


def stale_files(proto_dir: Path, package_dir: Path) -> list[str]:
    """Regenerates into a temporary directory and returns a unified diff per
    file that differs from (or is missing in) ``package_dir/_proto``."""
    committed = package_dir / "_proto"
    with tempfile.TemporaryDirectory() as fresh:
        generate(proto_dir, Path(fresh))
        fresh_root = Path(fresh) / "_proto"
        names = {p.relative_to(fresh_root) for p in fresh_root.rglob("*") if p.is_file()}
        names |= {
            p.relative_to(committed)
            for p in committed.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts
        }
        diffs = []
        for name in sorted(names):
            new = fresh_root / name
            old = committed / name
            new_text = new.read_text(encoding="utf-8") if new.exists() else ""
            old_text = old.read_text(encoding="utf-8") if old.exists() else ""
            if new_text != old_text:
                diffs.append(
                    "".join(
                        difflib.unified_diff(
                            old_text.splitlines(keepends=True),
                            new_text.splitlines(keepends=True),
                            f"committed/{name}",
                            f"generated/{name}",
                            n=1,
                        )
                    )
                    or f"{name}: differs\n"
                )
        return diffs


def installed_tools_version() -> str:
    from importlib.metadata import version

    return version("grpcio-tools")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--proto", type=Path, default=DEFAULT_PROTO, help="the proto/ directory")
    parser.add_argument("--check", action="store_true", help="fail if the committed code is stale")
    args = parser.parse_args()
    tools = installed_tools_version()
    if tools != GRPCIO_TOOLS_VERSION:
        print(
            f"grpcio-tools {tools} is installed; the committed code comes from "
            f"{GRPCIO_TOOLS_VERSION}: pip install grpcio-tools=={GRPCIO_TOOLS_VERSION}",
            file=sys.stderr,
        )
        return 2
    if args.check:
        diffs = stale_files(args.proto, PACKAGE)
        if diffs:
            sys.stdout.write("".join(diffs))
            print("stale: run python scripts/generate_proto.py", file=sys.stderr)
            return 1
        print("sessionstore/_proto is up to date")
        return 0
    generate(args.proto, PACKAGE)
    print(f"generated {PACKAGE / '_proto'} from {args.proto}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
