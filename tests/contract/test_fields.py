"""The request-field enumeration (``contract._fields``) over the committed derived contract."""

from __future__ import annotations

import re

import pytest

from conformance._clients import ensure_node_clients, ensure_python_clients
from contract import flavour_reaches, load_fields, load_inventory, not_sent


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


def test_fields_no_client_sends_are_contract_fields_left_out() -> None:
    listed = {field.id for field in load_fields()}
    every = {field.id for field in load_fields(include_not_sent=True)}
    unsent = not_sent()
    assert unsent, "the table is not empty"
    assert set(unsent) <= every, "each names a field the contract has"
    assert not set(unsent) & listed
    assert every - listed == set(unsent)


# What sending a process tag would take in each pinned client's sources: a selector built from a
# tag (Python ``ProcessSelector(tag=...)``, JS ``{case: "tag"}``) or a StartRequest given one.
_PYTHON_TAG_SENT = re.compile(r"\btag\s*=(?!\s*p\.tag\b)")  # ``tag=p.tag`` only copies List answers
_JS_TAG_SELECTOR = re.compile(r"case:\s*[\"']tag[\"']")


@pytest.mark.artifacts
def test_the_pinned_clients_never_send_a_process_tag() -> None:
    python = ensure_python_clients().site_packages / "e2b"
    # The sandbox classes are what talks to envd (template builds have tags of their own, unrelated).
    sources = [p for d in ("sandbox", "sandbox_sync", "sandbox_async") for p in (python / d).rglob("*.py")]
    assert any("ProcessSelector(pid=" in p.read_text(encoding="utf-8") for p in sources), "selectors are by pid"
    sending = [str(p) for p in sources if _PYTHON_TAG_SENT.search(p.read_text(encoding="utf-8"))]
    assert not sending, f"these set a process tag: {sending}"
    bundle = (ensure_node_clients().root / "node_modules" / "e2b" / "dist" / "index.js").read_text(encoding="utf-8")
    assert re.search(r"case:\s*[\"']pid[\"']", bundle), "selectors are by pid"
    assert not _JS_TAG_SELECTOR.search(bundle)


def test_a_field_one_flavour_never_sends_is_enumerated_but_not_sent_by_it() -> None:
    listed = {field.id for field in load_fields()}
    js_only = set(not_sent("js")) - set(not_sent())
    assert "interpreter.contexts.create:header.X-Access-Token" in js_only
    assert js_only <= listed, "the other flavours send them"
    assert not set(not_sent("py-sync")) - set(not_sent())


@pytest.mark.artifacts
def test_the_js_interpreter_client_sends_the_envd_token_on_execute_only() -> None:
    bundle = ensure_node_clients().root / "node_modules" / "@e2b" / "code-interpreter" / "dist" / "index.js"
    text = bundle.read_text(encoding="utf-8")
    # Each request is a fetch of a route with the headers built just before it.
    requests = re.split(r"(?=const headers = \{)", text)[1:]
    sending = {route for part in requests for route in re.findall(r"jupyterUrl\}/(\w+)", part[:1500])}
    assert {"execute", "contexts"} <= sending
    tokened = {
        route
        for part in requests
        if 'headers["X-Access-Token"]' in part[: part.find("fetch(")]
        for route in re.findall(r"jupyterUrl\}/(\w+)", part[:1500])[:1]
    }
    assert tokened == {"execute"}
