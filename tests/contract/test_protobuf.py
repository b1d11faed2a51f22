"""envd descriptors: extracted from the wheel without executing it; generated code agrees with them."""

from __future__ import annotations

import pytest
from google.protobuf import descriptor_pb2, json_format

from contract import CONTRACT_DIR, ExtractionError
from contract._protobuf import procedures, serialized_descriptor


def _committed_set() -> descriptor_pb2.FileDescriptorSet:
    fds = descriptor_pb2.FileDescriptorSet()
    fds.ParseFromString((CONTRACT_DIR / "derived" / "envd.descriptor-set.binpb").read_bytes())
    return fds


def test_serialized_descriptor_is_read_from_the_literal() -> None:
    proto = descriptor_pb2.FileDescriptorProto(name="demo/demo.proto", package="demo")
    source = (
        "from google.protobuf import descriptor_pool as _descriptor_pool\n"
        f"DESCRIPTOR = _descriptor_pool.Default().AddSerializedFile({proto.SerializeToString()!r})\n"
    )
    assert serialized_descriptor(source, "demo_pb2.py") == proto.SerializeToString()


def test_serialized_descriptor_is_read_from_the_newer_plugin_s_file_desc_call() -> None:
    """Wheels from 2.35 on generate ``<name>_pb.py``, passing the same bytes to ``file_desc``."""
    proto = descriptor_pb2.FileDescriptorProto(name="demo/demo.proto", package="demo")
    source = (
        "from protobuf._codegen import file_desc\n"
        f"_DESC = file_desc(\n    {proto.SerializeToString()!r},\n    [],\n    {{}},\n)\n"
    )
    assert serialized_descriptor(source, "demo_pb.py") == proto.SerializeToString()


def test_module_without_a_descriptor_is_an_error() -> None:
    with pytest.raises(ExtractionError, match="expected one serialized descriptor, found 0"):
        serialized_descriptor("x = 1\n", "empty_pb2.py")


def test_descriptor_set_is_self_contained_and_ordered() -> None:
    fds = _committed_set()
    names = [f.name for f in fds.file]
    assert names == ["google/protobuf/timestamp.proto", "filesystem/filesystem.proto", "process/process.proto"]
    seen: set[str] = set()
    for proto in fds.file:
        assert set(proto.dependency) <= seen, f"{proto.name} comes before its imports"
        seen.add(proto.name)


def test_procedures() -> None:
    procs = procedures(_committed_set())
    assert len([p for p in procs if p.service == "process.Process"]) == 8
    assert len([p for p in procs if p.service == "filesystem.Filesystem"]) == 9
    start = next(p for p in procs if p.method == "Start")
    assert (start.path, start.kind, start.input_type) == (
        "/process.Process/Start",
        "server-stream",
        "process.StartRequest",
    )


def test_generated_messages_match_the_newest_descriptor_set() -> None:
    """The code the server runs is the newest tuple's superset (``contract._newest``)."""
    from contract.generated.filesystem import filesystem_pb2
    from contract.generated.process import process_pb2

    newest = descriptor_pb2.FileDescriptorSet()
    newest.ParseFromString((CONTRACT_DIR / "newest" / "derived" / "envd.descriptor-set.binpb").read_bytes())
    committed = {f.name: f for f in newest.file}
    for module in (process_pb2, filesystem_pb2):
        proto = descriptor_pb2.FileDescriptorProto()
        module.DESCRIPTOR.CopyToProto(proto)
        assert proto == committed[proto.name]


def test_generated_messages_speak_proto3_json_as_the_clients_do() -> None:
    from contract.generated.process import process_pb2

    request = json_format.Parse(
        '{"process": {"cmd": "/bin/bash", "args": ["-l", "-c", "echo hi"], "envs": {"A": "1"}}, "stdin": false}',
        process_pb2.StartRequest(),
    )
    assert request.process.args == ["-l", "-c", "echo hi"]
    event = process_pb2.StartResponse(
        event=process_pb2.ProcessEvent(data=process_pb2.ProcessEvent.DataEvent(stdout=b"\xff\x00hi"))
    )
    encoded = json_format.MessageToDict(event)
    assert encoded == {"event": {"data": {"stdout": "/wBoaQ=="}}}, "bytes are base64 in proto3 JSON"


def test_connect_stubs_cover_every_procedure() -> None:
    from contract.generated.filesystem import filesystem_connect
    from contract.generated.process import process_connect

    for service, module in (("Process", process_connect), ("Filesystem", filesystem_connect)):
        assert hasattr(module, f"{service}ASGIApplication")
        assert hasattr(module, f"{service}Client")
    methods = {p.method for p in procedures(_committed_set())}
    stub_methods = {
        name
        for name in [*dir(process_connect.Process), *dir(filesystem_connect.Filesystem)]
        if not name.startswith("_")
    }
    snake = {"".join("_" + c.lower() if c.isupper() else c for c in m).lstrip("_") for m in methods}
    assert snake <= stub_methods
