"""The committed inventory covers every operation the pinned clients can call, with stable ids."""

from __future__ import annotations

import re
from collections import Counter

from contract import CONTRACT_DIR, load_inventory

# The control-plane operations the pinned SDKs call, read off the clients (method, path).
SDK_CONTROL_OPERATIONS = {
    ("POST", "/sandboxes"),
    ("POST", "/sandboxes/{sandboxID}/connect"),
    ("GET", "/sandboxes/{sandboxID}"),
    ("DELETE", "/sandboxes/{sandboxID}"),
    ("POST", "/sandboxes/{sandboxID}/timeout"),
    ("PUT", "/sandboxes/{sandboxID}/network"),
    ("POST", "/sandboxes/{sandboxID}/pause"),
    ("GET", "/sandboxes/{sandboxID}/metrics"),
    ("POST", "/sandboxes/{sandboxID}/snapshots"),
    ("GET", "/v2/sandboxes"),
    ("GET", "/snapshots"),
    ("DELETE", "/templates/{templateID}"),
    ("POST", "/v3/templates"),
    ("GET", "/templates/{templateID}/files/{hash}"),
    ("POST", "/v2/templates/{templateID}/builds/{buildID}"),
    ("GET", "/templates/{templateID}/builds/{buildID}/status"),
    ("GET", "/templates/aliases/{alias}"),
    ("POST", "/templates/tags"),
    ("DELETE", "/templates/tags"),
    ("GET", "/templates/{templateID}/tags"),
    ("POST", "/volumes"),
    ("GET", "/volumes"),
    ("GET", "/volumes/{volumeID}"),
    ("DELETE", "/volumes/{volumeID}"),
}


def test_ids_are_unique_and_hierarchical() -> None:
    ops = load_inventory()
    ids = [op.id for op in ops]
    assert len(ids) == len(set(ids))
    for op_id in ids:
        assert re.fullmatch(r"[a-z]+(\.[a-z_]+)*\.[A-Za-z_0-9]+", op_id), op_id
        assert op_id.split(".")[0] in {"control", "envd", "volume", "interpreter"}


def test_envd_procedures_with_streaming_kinds() -> None:
    rpc = {op.procedure: op.streaming for op in load_inventory() if op.surface == "envd-rpc"}
    assert rpc == {
        "process.Process/List": "unary",
        "process.Process/Connect": "server-stream",
        "process.Process/Start": "server-stream",
        "process.Process/Update": "unary",
        "process.Process/StreamInput": "client-stream",
        "process.Process/SendInput": "unary",
        "process.Process/SendSignal": "unary",
        "process.Process/CloseStdin": "unary",
        "filesystem.Filesystem/Stat": "unary",
        "filesystem.Filesystem/MakeDir": "unary",
        "filesystem.Filesystem/Move": "unary",
        "filesystem.Filesystem/ListDir": "unary",
        "filesystem.Filesystem/Remove": "unary",
        "filesystem.Filesystem/WatchDir": "server-stream",
        "filesystem.Filesystem/CreateWatcher": "unary",
        "filesystem.Filesystem/GetWatcherEvents": "unary",
        "filesystem.Filesystem/RemoveWatcher": "unary",
    }


def test_surface_counts() -> None:
    counts = Counter(op.surface for op in load_inventory())
    assert counts["envd-http"] == 6
    assert counts["volume-content"] == 7
    assert counts["interpreter"] == 6
    http = {(op.method, op.path) for op in load_inventory() if op.surface == "envd-http"}
    assert http == {
        ("GET", "/health"),
        ("GET", "/metrics"),
        ("GET", "/envs"),
        ("POST", "/init"),
        ("GET", "/files"),
        ("POST", "/files"),
    }
    interpreter = {(op.method, op.path) for op in load_inventory() if op.surface == "interpreter"}
    assert interpreter == {
        ("GET", "/health"),
        ("POST", "/execute"),
        ("GET", "/contexts"),
        ("POST", "/contexts"),
        ("DELETE", "/contexts/{context_id}"),
        ("POST", "/contexts/{context_id}/restart"),
    }


def test_every_sdk_control_operation_is_present_and_reached_from_both_sdks() -> None:
    control = {(op.method, op.path): op for op in load_inventory() if op.surface == "control-plane"}
    assert set(control) >= SDK_CONTROL_OPERATIONS
    for key in SDK_CONTROL_OPERATIONS:
        op = control[key]
        assert op.called_by_sdk, key
        assert op.python_entry_points, f"{key}: no Python entry point found"
        assert op.js_entry_points, f"{key}: no JS entry point found"


def test_known_entry_points() -> None:
    by_id = {op.id: op for op in load_inventory()}
    assert "e2b.sandbox_sync.main.Sandbox.create" in by_id["control.sandboxes.create"].python_entry_points
    assert "e2b.sandbox_async.main.AsyncSandbox.create" in by_id["control.sandboxes.create"].python_entry_points
    assert "Sandbox.create" in by_id["control.sandboxes.create"].js_entry_points
    assert "e2b.sandbox_sync.commands.command.Commands.run" in by_id["envd.process.Start"].python_entry_points
    assert "Commands.run" in by_id["envd.process.Start"].js_entry_points
    assert (
        "e2b.sandbox_sync.filesystem.filesystem.Filesystem.read"
        in by_id["envd.http.files_download"].python_entry_points
    )
    assert by_id["interpreter.execute"].streaming == "ndjson-stream"
    assert "Sandbox.runCode" in by_id["interpreter.execute"].js_entry_points
    # Python sync watches by polling, async and JS by streaming (docs/PROTOCOL-NOTES.md, envd filesystem).
    watch = by_id["envd.filesystem.WatchDir"]
    assert all("sandbox_async" in name for name in watch.python_entry_points)
    assert "Filesystem.watchDir" in watch.js_entry_points
    assert all("sandbox_sync" in name for name in by_id["envd.filesystem.CreateWatcher"].python_entry_points)
    # No client-streaming support in either SDK: StreamInput is never called.
    assert not by_id["envd.process.StreamInput"].called_by_sdk


def test_supplemented_operations_say_why() -> None:
    import json

    raw = json.loads((CONTRACT_DIR / "derived" / "inventory.json").read_text())
    for entry in raw["operations"]:
        if entry["source"] == "supplement":
            assert entry["reason"], entry["id"]
            assert not entry["called_by_sdk"]
