"""The request-field enumeration (``contract._fields``) over the committed derived contract."""

from __future__ import annotations

from contract import flavour_reaches, load_fields, load_inventory


def test_the_create_body_is_enumerated_to_its_nested_leaves() -> None:
    ids = {field.id for field in load_fields()}
    for key in (
        "body.templateID",
        "body.envVars",
        "body.network.maskRequestHost",
        "body.network.allowOut",
        "body.autoResume.enabled",
        "body.volumeMounts[].path",
        "header.X-API-Key",
    ):
        assert f"control.sandboxes.create:{key}" in ids, key
    # Containers are covered through their leaves.
    assert "control.sandboxes.create:body.network" not in ids
    assert "control.sandboxes.create:body.autoResume" not in ids


def test_connect_messages_queries_and_interpreter_keys_are_enumerated() -> None:
    ids = {field.id for field in load_fields()}
    assert "envd.process.Start:message.process.cwd" in ids
    assert "envd.process.Start:message.pty.size.cols" in ids
    assert "envd.process.Start:message.process.envs" in ids  # a map is one leaf
    assert "envd.http.files_upload:query.username" in ids
    assert "control.sandboxes.list:query.nextToken" in ids
    assert "interpreter.execute:body.env_vars" in ids
    assert not any(f.key.startswith("path.") for f in load_fields()), "path parameters are not fields"


def test_headers_go_only_where_the_clients_send_them() -> None:
    ids = {field.id for field in load_fields()}
    assert "envd.process.Start:header.Authorization" in ids
    assert "envd.process.List:header.Authorization" not in ids  # List takes no user
    assert "envd.process.Start:header.Keepalive-Ping-Interval" in ids  # a server stream
    assert "envd.process.List:header.Keepalive-Ping-Interval" not in ids  # unary


def test_only_operations_the_sdks_call_have_fields() -> None:
    called = {op.id for op in load_inventory() if op.called_by_sdk}
    assert {field.operation for field in load_fields()} <= called


def test_flavours_reach_operations_through_their_entry_points() -> None:
    ops = {op.id: op for op in load_inventory()}
    watcher = ops["envd.filesystem.CreateWatcher"]  # the sync Python client's polling watcher only
    assert flavour_reaches(watcher, "py-sync")
    assert not flavour_reaches(watcher, "py-async")
    assert not flavour_reaches(watcher, "js")
    stream = ops["envd.filesystem.WatchDir"]
    assert not flavour_reaches(stream, "py-sync")
    assert flavour_reaches(stream, "py-async")
    assert flavour_reaches(stream, "js")
