"""envd's protobuf contract: descriptors out of a client wheel, code out of protoc.

The wheel's ``*_pb2.py`` modules (``*_pb.py`` from 2.35) carry each ``.proto`` file as a
serialized ``FileDescriptorProto`` passed to ``AddSerializedFile`` (``file_desc``). The
literal is read with :mod:`ast` (the module is never executed) and collected, with the
well-known types it imports, into one ``FileDescriptorSet``. Message modules and Connect stubs are then
generated from that set by protoc (grpcio-tools) and the Connect plugin; the output
is never edited.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from google.protobuf import descriptor_pb2, timestamp_pb2

from ._archive import ArtifactFiles
from ._errors import ExtractionError

# The envd protocol files inside the Python client, and the well-known types they import. Newer
# wheels (2.35 on) generate them with another plugin, as ``<name>_pb.py`` passing the same
# serialized descriptor to ``file_desc``; whichever of the two a wheel has is read.
ENVD_DESCRIPTOR_MODULES = ("e2b/envd/process/process_pb2.py", "e2b/envd/filesystem/filesystem_pb2.py")
_DESCRIPTOR_CALLS = ("AddSerializedFile", "file_desc")
_WELL_KNOWN = {"google/protobuf/timestamp.proto": timestamp_pb2.DESCRIPTOR.serialized_pb}

STREAMING_KINDS = {
    (False, False): "unary",
    (False, True): "server-stream",
    (True, False): "client-stream",
    (True, True): "bidi-stream",
}


@dataclass(frozen=True)
class Procedure:
    service: str  # fully qualified, e.g. process.Process
    method: str  # e.g. Start
    kind: str  # unary / server-stream / client-stream / bidi-stream
    input_type: str
    output_type: str

    @property
    def path(self) -> str:
        return f"/{self.service}/{self.method}"


def _called(node: ast.Call) -> str | None:
    if isinstance(node.func, ast.Attribute):
        return node.func.attr
    return node.func.id if isinstance(node.func, ast.Name) else None


def serialized_descriptor(source: str, filename: str) -> bytes:
    """The bytes literal a generated module passes to ``AddSerializedFile`` (``_pb2``) or ``file_desc`` (``_pb``)."""
    tree = ast.parse(source, filename=filename)
    found = [
        node.args[0].value
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and _called(node) in _DESCRIPTOR_CALLS
        and node.args
        and isinstance(node.args[0], ast.Constant)
        and isinstance(node.args[0].value, bytes)
    ]
    if len(found) != 1:
        raise ExtractionError(f"{filename}: expected one serialized descriptor, found {len(found)}")
    return found[0]


def descriptor_set(files: ArtifactFiles) -> descriptor_pb2.FileDescriptorSet:
    """Every envd ``.proto`` file of the wheel, dependencies first."""
    protos = []
    for pb2 in ENVD_DESCRIPTOR_MODULES:
        module = pb2 if files.has(pb2) else pb2.removesuffix("_pb2.py") + "_pb.py"
        proto = descriptor_pb2.FileDescriptorProto()
        proto.ParseFromString(serialized_descriptor(files.text(module), module))
        protos.append(proto)
    out = descriptor_pb2.FileDescriptorSet()
    own = {p.name for p in protos}
    for dependency in sorted({d for p in protos for d in p.dependency} - own):
        if dependency not in _WELL_KNOWN:
            raise ExtractionError(f"envd descriptors import {dependency!r}, which is not a known well-known type")
        out.file.add().ParseFromString(_WELL_KNOWN[dependency])
    for proto in sorted(protos, key=lambda p: p.name):
        out.file.append(proto)
    return out


def procedures(fds: descriptor_pb2.FileDescriptorSet) -> list[Procedure]:
    out = []
    for proto in fds.file:
        for service in proto.service:
            for method in service.method:
                out.append(
                    Procedure(
                        service=f"{proto.package}.{service.name}" if proto.package else service.name,
                        method=method.name,
                        kind=STREAMING_KINDS[(method.client_streaming, method.server_streaming)],
                        input_type=method.input_type.lstrip("."),
                        output_type=method.output_type.lstrip("."),
                    )
                )
    return out


def _plugin() -> str:
    beside = Path(sys.executable).with_name("protoc-gen-connect-python")
    found = str(beside) if beside.exists() else shutil.which("protoc-gen-connect-python")
    if found is None:
        raise ExtractionError("protoc-gen-connect-python is not installed (pip install the 'contract' extra)")
    return found


def generate_code(descriptor_file: Path, fds: descriptor_pb2.FileDescriptorSet, out: Path) -> list[Path]:
    """Run protoc over the descriptor set: messages, type stubs and Connect stubs into ``out``."""
    targets = [p.name for p in fds.file if p.service]
    out.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "grpc_tools.protoc",
        f"--descriptor_set_in={descriptor_file}",
        f"--python_out={out}",
        f"--pyi_out={out}",
        f"--plugin=protoc-gen-connect-python={_plugin()}",
        f"--connect-python_out={out}",
        "--connect-python_opt=imports=relative",
        *targets,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise ExtractionError(f"protoc failed ({proc.returncode}): {proc.stderr.strip()}")
    produced = sorted(p for p in out.rglob("*") if p.is_file())
    # protoc writes modules, not packages; mark each folder as one so imports work.
    for folder in sorted({p.parent for p in produced} | {out}):
        init = folder / "__init__.py"
        if not init.exists():
            init.write_text('"""Generated by the contract pipeline from the newest envd descriptors."""\n')
    return sorted(p for p in out.rglob("*") if p.is_file())
