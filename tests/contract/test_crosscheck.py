"""The derived contract agrees with the upstream specification files at the pinned commit.

The specification files are reading material beside the checkout (``../shared/upstream``),
never part of the repository. Every difference must be listed, with its reason, in
``contract/spec-differences.json``; a listed difference that no longer exists fails too.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from google.protobuf import descriptor_pb2

from contract import CONTRACT_DIR
from tests.conftest import shared_dir

SPEC = shared_dir() / "upstream" / "e2b" / "spec"
METHODS = ("get", "put", "post", "delete", "patch", "head", "options", "trace")

pytestmark = pytest.mark.skipif(not SPEC.is_dir(), reason=f"no upstream specification files at {SPEC}")

SURFACES = {
    "control-plane": ("openapi.yml", "control-plane.openapi.json"),
    "envd-http": ("envd/envd.yaml", "envd.openapi.json"),
    "volume-content": ("openapi-volumecontent.yml", "volume-content.openapi.json"),
}


def _allowed() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((CONTRACT_DIR / "spec-differences.json").read_text())
    return data


def _operations(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f"{m.upper()} {p}": op for p, item in doc["paths"].items() for m, op in item.items() if m in METHODS}


def _load(surface: str) -> tuple[dict[str, Any], dict[str, Any]]:
    upstream_file, derived_file = SURFACES[surface]
    upstream = yaml.safe_load((SPEC / upstream_file).read_text())
    derived = json.loads((CONTRACT_DIR / "derived" / derived_file).read_text())
    return upstream, derived


@pytest.mark.parametrize("surface", sorted(SURFACES))
def test_every_path_and_method(surface: str) -> None:
    upstream, derived = _load(surface)
    up, ours = set(_operations(upstream)), set(_operations(derived))
    allowed = _allowed()[surface]
    assert up - ours == set(allowed["upstream_only"]), "operations only upstream must be listed with a reason"
    assert ours - up == set(allowed["derived_only"]), "operations only derived must be listed with a reason"
    assert all(allowed["upstream_only"].values()), "every listed difference needs a reason"


@pytest.mark.parametrize("surface", sorted(SURFACES))
def test_status_codes_of_shared_operations(surface: str) -> None:
    upstream, derived = _load(surface)
    up, ours = _operations(upstream), _operations(derived)
    for key in sorted(set(up) & set(ours)):
        assert {str(c) for c in up[key]["responses"]} == set(ours[key]["responses"]), key


@pytest.mark.parametrize("surface", sorted(SURFACES))
def test_parameters_of_shared_operations(surface: str) -> None:
    upstream, derived = _load(surface)
    components = upstream.get("components", {}).get("parameters", {})
    up, ours = _operations(upstream), _operations(derived)
    for key in sorted(set(up) & set(ours)):
        want = set()
        for raw in up[key].get("parameters", []):
            param = components[raw["$ref"].rsplit("/", 1)[-1]] if "$ref" in raw else raw
            if param["in"] in ("query", "path"):
                want.add((param["name"], param["in"], bool(param.get("required", False))))
        have = {(p["name"], p["in"], p["required"]) for p in ours[key].get("parameters", [])}
        assert have == want, key


def _compile_upstream_protos(out: Path) -> descriptor_pb2.FileDescriptorSet:
    import grpc_tools

    include = Path(grpc_tools.__file__).parent / "_proto"
    target = out / "upstream.binpb"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{SPEC / 'envd'}",
            f"-I{include}",
            "--include_imports",
            f"--descriptor_set_out={target}",
            "process/process.proto",
            "filesystem/filesystem.proto",
        ],
        check=True,
    )
    fds = descriptor_pb2.FileDescriptorSet()
    fds.ParseFromString(target.read_bytes())
    return fds


def test_descriptors_equal_the_upstream_protos(tmp_path: Path) -> None:
    upstream = {f.name: f for f in _compile_upstream_protos(tmp_path).file}
    ours = descriptor_pb2.FileDescriptorSet()
    ours.ParseFromString((CONTRACT_DIR / "derived" / "envd.descriptor-set.binpb").read_bytes())
    assert {f.name for f in ours.file} == set(upstream)
    options_differ = False
    for proto in ours.file:
        theirs = descriptor_pb2.FileDescriptorProto()
        theirs.CopyFrom(upstream[proto.name])
        mine = descriptor_pb2.FileDescriptorProto()
        mine.CopyFrom(proto)
        options_differ |= mine.options != theirs.options
        mine.ClearField("options")
        theirs.ClearField("options")
        assert mine == theirs, proto.name
        for service in proto.service:
            for method in service.method:
                up_service = next(s for s in upstream[proto.name].service if s.name == service.name)
                up_method = next(m for m in up_service.method if m.name == method.name)
                assert (method.client_streaming, method.server_streaming) == (
                    up_method.client_streaming,
                    up_method.server_streaming,
                ), f"{service.name}/{method.name}"
    assert options_differ == bool(_allowed()["descriptors"].get("file_options")), (
        "file options differ only when spec-differences.json says why (and the entry goes when they agree)"
    )
