"""Generate tidelog's Python gRPC/protobuf code from the .proto files under proto/.

Usage (from anywhere; paths are resolved against the repository root):

    python scripts/gen_proto.py              # regenerate src/tidelog/_proto in place
    python scripts/gen_proto.py --out DIR    # write the same tree into DIR instead

`make proto` runs the first form. tests/test_proto.py runs the second into a temporary
directory and compares the result byte for byte with the committed files.

For every proto/<dir>/.../<name>.proto this writes, under the output directory:

    <dir>/.../<name>_pb2.py         messages (protoc --python_out)
    <dir>/.../<name>_pb2.pyi        typed stubs for them (mypy-protobuf)
    <dir>/.../<name>_pb2_grpc.py    service stub and servicer base (grpcio-tools)
    <dir>/.../<name>_pb2_grpc.pyi   typed stubs for those (mypy-protobuf)
    __init__.py                     in the output directory and in every package below it

protoc names Python modules after the proto's path relative to proto/, so generated code
imports siblings as `from liftbridge import api_pb2`. The output lives inside the
`tidelog._proto` package, so one post-processing step rewrites such imports (and the module
name protoc records for the message classes) to `tidelog._proto.liftbridge.api_pb2`. Only
top-level directories of proto/ are rewritten; `google.protobuf` imports are left alone.

The output is deterministic: the same .proto files and the same pinned generator versions
(grpcio-tools, mypy-protobuf; see pyproject.toml) give byte-identical files. Files are written
only when their content changes, and generated files that are no longer produced are removed.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "proto"
DEFAULT_OUT = ROOT / "src" / "tidelog" / "_proto"
PACKAGE = "tidelog._proto"

# Suffixes this script owns inside the output directory; anything else there is left alone.
GENERATED_SUFFIXES = (".py", ".pyi")

INIT_TEXT = '"""Generated protobuf/gRPC code. Do not edit: change proto/ and run `make proto`."""\n'


def find_protos() -> list[Path]:
    """All .proto files under proto/, relative to it, in a stable order."""
    return sorted(p.relative_to(PROTO_DIR) for p in PROTO_DIR.rglob("*.proto"))


def plugin(name: str) -> Path:
    """Locate a protoc plugin installed next to this interpreter (or on PATH)."""
    beside = Path(sys.executable).parent / name
    if beside.exists():
        return beside
    found = shutil.which(name)
    if found is None:
        raise SystemExit(
            f"gen_proto: the protoc plugin {name!r} is not installed; "
            "run `make install` (it comes with the dev dependencies)."
        )
    return Path(found)


def run_protoc(protos: list[Path], dest: Path) -> None:
    """Run grpcio-tools' bundled protoc with the Python, gRPC and mypy generators."""
    cmd = [
        sys.executable,
        "-m",
        "grpc_tools.protoc",
        f"--proto_path={PROTO_DIR}",
        f"--plugin=protoc-gen-mypy={plugin('protoc-gen-mypy')}",
        f"--plugin=protoc-gen-mypy_grpc={plugin('protoc-gen-mypy_grpc')}",
        f"--python_out={dest}",
        f"--grpc_python_out={dest}",
        f"--mypy_out={dest}",
        f"--mypy_grpc_out={dest}",
        *(p.as_posix() for p in protos),
    ]
    result = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise SystemExit(f"gen_proto: protoc failed:\n{result.stderr}")


def rewrite_imports(text: str, roots: list[str]) -> str:
    """Point imports of generated sibling modules at their place inside tidelog._proto.

    Idempotent: a name that already starts with the package prefix is never prefixed again.
    """
    mod = rf"(?!{re.escape(PACKAGE)}\.)((?:{'|'.join(re.escape(r) for r in roots)})(?:\.\w+)*)"
    # `from liftbridge import api_pb2 as x` / `from tidelog.v1 import seek_pb2` (.py and .pyi)
    text = re.sub(
        rf"^from {mod} import (\w+_pb2(?:_grpc)?)\b",
        rf"from {PACKAGE}.\1 import \2",
        text,
        flags=re.MULTILINE,
    )
    # `import liftbridge.api_pb2` and the dotted references that go with that spelling.
    text = re.sub(rf"^import {mod}\.(\w+_pb2)$", rf"import {PACKAGE}.\1.\2", text, flags=re.M)
    text = re.sub(rf"(?<![\w.]){mod}\.(\w+_pb2)\.(?=\w)", rf"{PACKAGE}.\1.\2.", text)
    # The module name protoc records for message classes (their __module__, used by pickle).
    return re.sub(
        rf"(_builder\.BuildTopDescriptorsAndMessages\(DESCRIPTOR, '){mod}\.(\w+_pb2)(')",
        rf"\g<1>{PACKAGE}.\g<2>.\g<3>\g<4>",
        text,
    )


PRIVATE_POOL_ROOTS = ("liftbridge",)
"""Protos whose package (`proto`, Liftbridge's) other libraries register too: a Liftbridge client
such as gufo-liftbridge in the same process would collide in protobuf's default descriptor pool,
so their descriptors go into a pool of their own. The wire bytes are unchanged."""


def private_pool(text: str) -> str:
    return text.replace(
        "DESCRIPTOR = _descriptor_pool.Default().AddSerializedFile(",
        "_POOL = _descriptor_pool.DescriptorPool()  # private: see scripts/gen_proto.py\n"
        "DESCRIPTOR = _POOL.AddSerializedFile(",
    )


def generate() -> dict[str, bytes]:
    """Generate everything in a scratch directory; return {relative posix path: content}."""
    protos = find_protos()
    if not protos:
        raise SystemExit(f"gen_proto: no .proto files under {PROTO_DIR}")
    roots = sorted({p.parts[0] for p in protos if len(p.parts) > 1})
    files: dict[str, bytes] = {"__init__.py": INIT_TEXT.encode()}
    with tempfile.TemporaryDirectory(prefix="tidelog-gen-proto-") as tmp:
        scratch = Path(tmp)
        run_protoc(protos, scratch)
        for path in sorted(scratch.rglob("*")):
            if not path.is_file():
                continue
            rel = path.relative_to(scratch)
            text = rewrite_imports(path.read_text(encoding="utf-8"), roots)
            if rel.parts[0] in PRIVATE_POOL_ROOTS and rel.name.endswith("_pb2.py"):
                text = private_pool(text)
            files[rel.as_posix()] = text.encode("utf-8")
            for parent in rel.parents:
                if parent != Path("."):
                    files.setdefault((parent / "__init__.py").as_posix(), INIT_TEXT.encode())
    return dict(sorted(files.items()))


def write_tree(files: dict[str, bytes], out: Path) -> list[str]:
    """Make `out` hold exactly `files` (among generated suffixes); return what changed."""
    changed: list[str] = []
    out.mkdir(parents=True, exist_ok=True)
    for rel, content in files.items():
        target = out / rel
        if target.is_file() and target.read_bytes() == content:
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)
        changed.append(f"wrote {rel}")
    for path in sorted(out.rglob("*"), reverse=True):
        if "__pycache__" in path.parts:
            continue
        rel = path.relative_to(out).as_posix()
        if path.is_file() and path.suffix in GENERATED_SUFFIXES and rel not in files:
            path.unlink()
            changed.append(f"removed {rel}")
        elif path.is_dir() and not any(p for p in path.iterdir() if p.name != "__pycache__"):
            shutil.rmtree(path)
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out",
        type=Path,
        default=DEFAULT_OUT,
        help=f"output directory (default: {DEFAULT_OUT.relative_to(ROOT)})",
    )
    args = parser.parse_args(argv)
    out: Path = args.out.resolve()
    changed = write_tree(generate(), out)
    for line in changed:
        print(f"gen_proto: {line}")
    if not changed:
        print(f"gen_proto: {out} is up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
