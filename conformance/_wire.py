"""Wire-level cases: exact requests and exact expected answers, without any client library.

The official clients hide the wire: a create answered 200 instead of 201 surfaces as "Body of the
request is None", a dropped stream event as a shorter stdout. These cases send the requests the
clients send (docs/PROTOCOL-NOTES.md, Headers; Transport and Connect) with httpx and compare
the answers field by field, so a failure names the request that differed and what came back.
They use the same four variables as the clients, so they run against any endpoint.

The ``wire/interpreter/…`` cases talk to the code interpreter of a ``code-interpreter-v1`` sandbox
(port 49999, docs/PROTOCOL-NOTES.md, Code Interpreter) with the headers the interpreter clients
send: its health route (no client calls it), the NDJSON framing of ``/execute`` that the clients parse line by
line, and the status codes the clients turn into their exceptions.
"""

from __future__ import annotations

import base64
import json
import ssl
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import httpx

from contract.generated.filesystem import filesystem_pb2
from contract.generated.process import process_pb2
from contract.protocol import (
    ACCESS_TOKEN_HEADER,
    API_KEY_HEADER,
    CONNECT_JSON,
    CONNECT_PROTO,
    CONNECT_PROTOCOL_VERSION,
    CONNECT_PROTOCOL_VERSION_HEADER,
    CONNECT_STREAM_JSON,
    CONNECT_STREAM_PROTO,
    ENVD_PORT,
    FLAG_END_STREAM,
    INTERPRETER_PORT,
    SANDBOX_ID_HEADER,
    SANDBOX_PORT_HEADER,
    TRAFFIC_TOKEN_HEADER,
    EnvelopeError,
    decode_envelopes,
    encode_envelope,
    split_envelope,
)

from ._model import CaseResult, ClientInfo, Outcome

__all__ = ["WIRE_CASES", "WireCase", "WireMismatchError", "run_wire_cases"]

CLIENT = ClientInfo("wire", "httpx", httpx.__version__)
INTERPRETER_TEMPLATE = "code-interpreter-v1"


class WireMismatchError(AssertionError):
    """An answer differed from the contract; the message names the request."""


@dataclass
class Wire:
    http: httpx.Client
    domain: str
    api_key: str

    def api(self, path: str) -> str:
        return f"https://api.{self.domain}{path}"

    def envd(self, sandbox_id: str, path: str) -> str:
        return f"https://{ENVD_PORT}-{sandbox_id}.{self.domain}{path}"

    def interpreter(self, sandbox_id: str, path: str) -> str:
        return f"https://{INTERPRETER_PORT}-{sandbox_id}.{self.domain}{path}"

    @property
    def key(self) -> dict[str, str]:
        return {API_KEY_HEADER: self.api_key}

    def expect(self, response: httpx.Response, status: int, what: str = "") -> Any:
        request = response.request
        if response.status_code != status:
            raise WireMismatchError(
                f"{request.method} {request.url} answered {response.status_code}, the contract says {status}"
                f"{' (' + what + ')' if what else ''}: {response.text[:300]}"
            )
        if not response.content:
            return None
        try:
            return response.json()
        except ValueError:
            return response.content

    @contextmanager
    def sandbox(self, **body: Any) -> Iterator[dict[str, Any]]:
        created = self.expect(
            self.http.post(
                self.api("/sandboxes"), json={"templateID": "base", "timeout": 120, **body}, headers=self.key
            ),
            201,
        )
        try:
            yield created
        finally:
            self.http.delete(self.api(f"/sandboxes/{created['sandboxID']}"), headers=self.key)


def _envelope(message: dict[str, Any]) -> bytes:
    return encode_envelope(json.dumps(message).encode())


def _envelopes(body: bytes) -> list[tuple[int, Any]]:
    try:
        envelopes = decode_envelopes(body)
    except EnvelopeError as exc:
        raise WireMismatchError(str(exc)) from None
    return [(envelope.flags, json.loads(envelope.payload or b"{}")) for envelope in envelopes]


def _event_kinds(frames: list[tuple[int, Any]]) -> list[str]:
    kinds = []
    for flags, message in frames:
        if flags & FLAG_END_STREAM:
            kinds.append("end-of-stream" if not message.get("error") else f"error:{message['error'].get('code')}")
            continue
        event = message.get("event", {})
        for kind in ("start", "data", "end", "keepalive"):
            if kind in event:
                if kind == "data":
                    raw = event["data"].get("stdout") or event["data"].get("stderr") or ""
                    kinds.append(f"data:{base64.b64decode(raw).decode(errors='replace').strip()}")
                else:
                    kinds.append(kind)
    return kinds


def create_status(wire: Wire) -> None:
    with wire.sandbox(secure=True) as created:
        for field in ("sandboxID", "templateID", "clientID", "envdVersion", "envdAccessToken"):
            if field not in created:
                raise WireMismatchError(
                    f"POST {wire.api('/sandboxes')}: the answer has no {field!r}: {sorted(created)}"
                )


def error_shape(wire: Wire) -> None:
    body = wire.expect(wire.http.get(wire.api("/sandboxes/doesnotexist0"), headers=wire.key), 404)
    if not (isinstance(body, dict) and body.get("code") == 404 and isinstance(body.get("message"), str)):
        raise WireMismatchError(
            f"GET {wire.api('/sandboxes/doesnotexist0')}: the error body is {body!r}, not {{code, message}}"
        )
    wire.expect(wire.http.get(wire.api("/v2/sandboxes")), 401, "no API key")


def pause_twice(wire: Wire) -> None:
    with wire.sandbox() as created:
        url = wire.api(f"/sandboxes/{created['sandboxID']}/pause")
        wire.expect(wire.http.post(url, json={"memory": True}, headers=wire.key), 204)
        wire.expect(wire.http.post(url, json={"memory": True}, headers=wire.key), 409, "a second pause")


def connect_statuses(wire: Wire) -> None:
    """Connect answers 201 when it resumed a paused sandbox and 200 when the sandbox was already running."""
    with wire.sandbox() as created:
        sandbox_id = created["sandboxID"]
        pause = wire.api(f"/sandboxes/{sandbox_id}/pause")
        wire.expect(wire.http.post(pause, json={"memory": True}, headers=wire.key), 204)
        connect = wire.api(f"/sandboxes/{sandbox_id}/connect")
        resumed = wire.expect(
            wire.http.post(connect, json={"timeout": 60}, headers=wire.key), 201, "connect resumed a paused sandbox"
        )
        if not isinstance(resumed, dict) or resumed.get("sandboxID") != sandbox_id:
            raise WireMismatchError(f"POST {connect} (resuming): answered {resumed!r}, not the sandbox {sandbox_id}")
        running = wire.expect(
            wire.http.post(connect, json={"timeout": 60}, headers=wire.key), 200, "connect to a running sandbox"
        )
        if not isinstance(running, dict) or running.get("sandboxID") != sandbox_id:
            raise WireMismatchError(f"POST {connect} (running): answered {running!r}, not the sandbox {sandbox_id}")


def process_stream(wire: Wire) -> None:
    with wire.sandbox(secure=True) as created:
        url = wire.envd(created["sandboxID"], "/process.Process/Start")
        start = {
            "process": {"cmd": "/bin/bash", "args": ["-c", "echo one; sleep 0.2; echo two; sleep 0.2; echo three"]}
        }
        response = wire.http.post(url, content=_envelope(start), headers=_stream_headers(created))
        wire.expect(response, 200)
        kinds = _event_kinds(_envelopes(response.content))
        expected = ["start", "data:one", "data:two", "data:three", "end", "end-of-stream"]
        if [kind for kind in kinds if kind != "keepalive"] != expected:
            raise WireMismatchError(f"POST {url}: the stream's events were {kinds}, expected {expected}")


def _stream_headers(created: dict[str, Any], content_type: str = CONNECT_STREAM_JSON) -> dict[str, str]:
    return {
        "Content-Type": content_type,
        CONNECT_PROTOCOL_VERSION_HEADER: CONNECT_PROTOCOL_VERSION,
        ACCESS_TOKEN_HEADER: created["envdAccessToken"],
        SANDBOX_ID_HEADER: created["sandboxID"],
        SANDBOX_PORT_HEADER: str(ENVD_PORT),
    }


def _read_frames(
    chunks: Iterator[bytes], buffer: bytearray, until: Callable[[list[tuple[int, Any]]], bool]
) -> list[tuple[int, Any]]:
    """Read a response stream's envelopes as they come, until ``until(frames so far)`` holds."""
    frames: list[tuple[int, Any]] = []
    while not until(frames):
        envelope, rest = split_envelope(bytes(buffer))
        while envelope is None:
            buffer.extend(next(chunks))
            envelope, rest = split_envelope(bytes(buffer))
        frames.append((envelope.flags, json.loads(envelope.payload or b"{}")))
        buffer[:] = rest
    return frames


def _has(kind: str) -> Callable[[list[tuple[int, Any]]], bool]:
    return lambda frames: any(kind in message.get("event", {}) or flags & FLAG_END_STREAM for flags, message in frames)


def stream_input(wire: Wire) -> None:
    """Client-streaming input (``Process.StreamInput``), which neither pinned SDK sends but envd serves."""
    with wire.sandbox(secure=True) as created:
        start_url = wire.envd(created["sandboxID"], "/process.Process/Start")
        start = _envelope({"process": {"cmd": "/bin/cat"}, "stdin": True})
        with wire.http.stream("POST", start_url, content=start, headers=_stream_headers(created)) as output:
            if output.status_code != 200:
                raise WireMismatchError(f"POST {start_url} answered {output.status_code}, the contract says 200")
            chunks, buffer = output.iter_raw(), bytearray()
            first = _read_frames(chunks, buffer, _has("start"))
            pids = [message["event"]["start"].get("pid") for _, message in first if "start" in message.get("event", {})]
            if not pids or not isinstance(pids[0], int):
                raise WireMismatchError(f"POST {start_url}: the stream began with {_event_kinds(first)}, no pid")
            url = wire.envd(created["sandboxID"], "/process.Process/StreamInput")
            text = base64.b64encode(b"over the stream\n").decode()
            body = _envelope({"start": {"process": {"pid": pids[0]}}}) + _envelope({"data": {"input": {"stdin": text}}})
            answer = wire.http.post(url, content=body, headers=_stream_headers(created))
            wire.expect(answer, 200)
            frames = _envelopes(answer.content)
            if not frames or not frames[-1][0] & FLAG_END_STREAM or frames[-1][1].get("error"):
                raise WireMismatchError(f"POST {url}: the stream ended with {frames[-1:]!r}, not a clean end of stream")
            close = wire.envd(created["sandboxID"], "/process.Process/CloseStdin")
            unary = _stream_headers(created, CONNECT_JSON)
            wire.expect(wire.http.post(close, json={"process": {"pid": pids[0]}}, headers=unary), 200)
            rest = _event_kinds(_read_frames(chunks, buffer, _has("end")))
        if "data:over the stream" not in rest:
            raise WireMismatchError(f"POST {url}: the input never reached the process; its output was {rest}")


def protobuf_codec(wire: Wire) -> None:
    """Connect's binary codec, which other Connect clients use although the pinned SDKs send JSON.

    Unary: ``application/proto`` in and out; an error stays JSON whatever the codec (Connect's
    rule). Streaming: ``application/connect+proto`` envelopes of protobuf messages, and the end of
    the stream is a JSON envelope.
    """
    with wire.sandbox(secure=True) as created:
        sandbox = created["sandboxID"]
        stat = wire.envd(sandbox, "/filesystem.Filesystem/Stat")
        unary = _stream_headers(created, CONNECT_PROTO)
        request = filesystem_pb2.StatRequest(path="/etc/hostname").SerializeToString()
        answer = wire.http.post(stat, content=request, headers=unary)
        if answer.status_code != 200 or not answer.headers.get("content-type", "").startswith(CONNECT_PROTO):
            raise WireMismatchError(
                f"POST {stat} ({CONNECT_PROTO}) answered {answer.status_code} "
                f"{answer.headers.get('content-type')!r}, not 200 {CONNECT_PROTO}: {answer.content[:200]!r}"
            )
        entry = filesystem_pb2.StatResponse.FromString(answer.content).entry
        if (entry.name, entry.type) != ("hostname", filesystem_pb2.FILE_TYPE_FILE):
            raise WireMismatchError(f"POST {stat} ({CONNECT_PROTO}): the entry was {entry.name!r} of type {entry.type}")
        missing = filesystem_pb2.StatRequest(path="/does/not/exist").SerializeToString()
        refused = wire.http.post(stat, content=missing, headers=unary)
        body = wire.expect(refused, 404, "a missing path, protobuf codec")
        if not (isinstance(body, dict) and body.get("code") == "not_found"):
            raise WireMismatchError(f"POST {stat} ({CONNECT_PROTO}, a missing path): the error was {body!r}")

        start_url = wire.envd(sandbox, "/process.Process/Start")
        start = process_pb2.StartRequest(process=process_pb2.ProcessConfig(cmd="/bin/echo", args=["proto"]))
        streamed = wire.http.post(
            start_url,
            content=encode_envelope(start.SerializeToString()),
            headers=_stream_headers(created, CONNECT_STREAM_PROTO),
        )
        wire.expect(streamed, 200)
        if not streamed.headers.get("content-type", "").startswith(CONNECT_STREAM_PROTO):
            raise WireMismatchError(f"POST {start_url}: answered {streamed.headers.get('content-type')!r}")
        try:
            envelopes = decode_envelopes(streamed.content)
        except EnvelopeError as exc:
            raise WireMismatchError(f"POST {start_url} ({CONNECT_STREAM_PROTO}): {exc}") from None
        kinds = []
        for envelope in envelopes:
            if envelope.end_stream:
                end = json.loads(envelope.payload or b"{}")
                kinds.append("end-of-stream" if not end.get("error") else f"error:{end['error'].get('code')}")
                continue
            event = process_pb2.StartResponse.FromString(envelope.payload).event
            kind = event.WhichOneof("event")
            kinds.append(f"data:{event.data.stdout.decode().strip()}" if kind == "data" else str(kind))
        expected = ["start", "data:proto", "end", "end-of-stream"]
        if [kind for kind in kinds if kind != "keepalive"] != expected:
            raise WireMismatchError(
                f"POST {start_url} ({CONNECT_STREAM_PROTO}): the events were {kinds}, not {expected}"
            )


def killed_is_502(wire: Wire) -> None:
    with wire.sandbox() as created:
        health = wire.envd(created["sandboxID"], "/health")
        wire.expect(wire.http.get(health), 204, "a running sandbox's envd")
    wire.expect(wire.http.get(health), 502, "after kill the clients' is_running expects 502")


def shared_host(wire: Wire) -> None:
    with wire.sandbox() as created:
        headers = {SANDBOX_ID_HEADER: created["sandboxID"], SANDBOX_PORT_HEADER: str(ENVD_PORT)}
        wire.expect(wire.http.get(f"https://sandbox.{wire.domain}/health", headers=headers), 204, "shared host")


def control_extras(wire: Wire) -> None:
    """Operations the control plane offers that the pinned SDKs do not call (the CLI and dashboards do)."""
    with wire.sandbox(metadata={"wire": "extras"}) as created:
        sandbox_id = created["sandboxID"]
        listed = wire.expect(wire.http.get(wire.api("/sandboxes"), headers=wire.key), 200)
        if sandbox_id not in [item.get("sandboxID") for item in listed]:
            raise WireMismatchError(f"GET {wire.api('/sandboxes')}: {sandbox_id} is not listed")
        refresh = wire.api(f"/sandboxes/{sandbox_id}/refreshes")
        wire.expect(wire.http.post(refresh, json={"duration": 30}, headers=wire.key), 204)
        network = wire.api(f"/sandboxes/{sandbox_id}/network")
        wire.expect(wire.http.put(network, json={"denyOut": ["0.0.0.0/0"]}, headers=wire.key), 204)
        batch = wire.api(f"/sandboxes/metrics?sandbox_ids={sandbox_id}")
        body = wire.expect(wire.http.get(batch, headers=wire.key), 200)
        if not isinstance(body, dict) or not isinstance(body.get("sandboxes"), dict):
            raise WireMismatchError(f"GET {batch}: {body!r} is not {{sandboxes: {{...}}}}")
        logs = wire.expect(wire.http.get(wire.api(f"/sandboxes/{sandbox_id}/logs"), headers=wire.key), 200)
        if not isinstance(logs, dict) or not {"logs", "logEntries"} <= set(logs):
            raise WireMismatchError(f"GET /sandboxes/{sandbox_id}/logs: {sorted(logs or {})} lacks logs/logEntries")
        logs_v2 = wire.expect(wire.http.get(wire.api(f"/v2/sandboxes/{sandbox_id}/logs"), headers=wire.key), 200)
        if not isinstance(logs_v2, dict) or "logs" not in logs_v2:
            raise WireMismatchError(f"GET /v2/sandboxes/{sandbox_id}/logs: {logs_v2!r} lacks logs")
        pause = wire.api(f"/sandboxes/{sandbox_id}/pause")
        wire.expect(wire.http.post(pause, json={"memory": True}, headers=wire.key), 204)
        resume = wire.api(f"/sandboxes/{sandbox_id}/resume")
        resumed = wire.expect(wire.http.post(resume, json={"timeout": 60}, headers=wire.key), 201)
        if resumed.get("sandboxID") != sandbox_id:
            raise WireMismatchError(f"POST {resume}: answered for {resumed.get('sandboxID')!r}")
        wire.expect(wire.http.post(resume, json={"timeout": 60}, headers=wire.key), 409, "resuming a running sandbox")


def envd_http(wire: Wire) -> None:
    """envd's own HTTP routes besides files: environment, metrics, and /init's token rule."""
    with wire.sandbox(secure=True, envVars={"WIRE_VAR": "present"}) as created:
        sandbox_id, token = created["sandboxID"], created["envdAccessToken"]
        headers = {ACCESS_TOKEN_HEADER: token}
        envs = wire.expect(wire.http.get(wire.envd(sandbox_id, "/envs"), headers=headers), 200)
        if not isinstance(envs, dict) or envs.get("WIRE_VAR") != "present":
            raise WireMismatchError(f"GET {wire.envd(sandbox_id, '/envs')}: WIRE_VAR is {envs!r}")
        metrics = wire.expect(wire.http.get(wire.envd(sandbox_id, "/metrics"), headers=headers), 200)
        if not isinstance(metrics, dict):
            raise WireMismatchError(f"GET {wire.envd(sandbox_id, '/metrics')}: {metrics!r} is not an object")
        wire.expect(wire.http.get(wire.envd(sandbox_id, "/envs")), 401, "no access token")
        init = wire.envd(sandbox_id, "/init")
        wire.expect(wire.http.post(init, json={"accessToken": "someone-else"}), 401, "taking the sandbox over")
        wire.expect(wire.http.post(init, json={"accessToken": token}, headers=headers), 204, "the same token again")


def _interpreter_headers(created: dict[str, Any]) -> dict[str, str]:
    """What the Python interpreter client sends besides the body: the envd token when the sandbox
    has one (upstream's server forwards it to envd) and the traffic token when the edge needs it."""
    headers = {"Content-Type": "application/json"}
    if created.get("envdAccessToken"):
        headers[ACCESS_TOKEN_HEADER] = created["envdAccessToken"]
    if created.get("trafficAccessToken"):
        headers[TRAFFIC_TOKEN_HEADER] = created["trafficAccessToken"]
    return headers


def interpreter_health(wire: Wire) -> None:
    with wire.sandbox(templateID=INTERPRETER_TEMPLATE, secure=True) as created:
        url = wire.interpreter(created["sandboxID"], "/health")
        body = wire.expect(wire.http.get(url, headers=_interpreter_headers(created)), 200)
        if body != "OK":
            raise WireMismatchError(f'GET {url}: the body is {body!r}, not the JSON string "OK"')


# Result and output lines come after the kernel accepted the input (number_of_executions).
_AFTER_ACCEPTANCE = ("stdout", "stderr", "result", "error")


def _ndjson_lines(url: str, body: bytes) -> list[dict[str, Any]]:
    """Every line of an ``/execute`` answer as an object: ``\n``-terminated, no blank lines, each a JSON object."""
    if not body.endswith(b"\n"):
        raise WireMismatchError(f"POST {url}: the answer does not end with a newline: {body[-80:]!r}")
    messages = []
    for number, line in enumerate(body[:-1].split(b"\n"), start=1):
        try:
            message = json.loads(line)
        except ValueError:
            raise WireMismatchError(f"POST {url}: line {number} is not JSON: {line[:200]!r}") from None
        if not isinstance(message, dict) or not isinstance(message.get("type"), str):
            raise WireMismatchError(f"POST {url}: line {number} is not an object with a type: {line[:200]!r}")
        messages.append(message)
    return messages


def interpreter_execute_ndjson(wire: Wire) -> None:
    with wire.sandbox(templateID=INTERPRETER_TEMPLATE, secure=True) as created:
        url = wire.interpreter(created["sandboxID"], "/execute")
        body = {"code": 'print("out")\n1+1', "context_id": None, "language": None, "env_vars": None}
        response = wire.http.post(url, json=body, headers=_interpreter_headers(created))
        wire.expect(response, 200)
        messages = _ndjson_lines(url, response.content)
        types = [message["type"] for message in messages]
        if types[-1:] != ["end_of_execution"] or types.count("end_of_execution") != 1:
            raise WireMismatchError(f"POST {url}: end_of_execution is not the one last line: {types}")
        counted = [i for i, kind in enumerate(types) if kind == "number_of_executions"]
        produced = [i for i, kind in enumerate(types) if kind in _AFTER_ACCEPTANCE]
        if len(counted) != 1 or not isinstance(messages[counted[0]].get("execution_count"), int):
            raise WireMismatchError(f"POST {url}: not one number_of_executions with an execution_count: {messages}")
        if produced and produced[0] < counted[0]:
            raise WireMismatchError(f"POST {url}: output came before number_of_executions: {types}")
        stdout = [m for m in messages if m["type"] == "stdout"]
        # The Python client reads both text and timestamp of every stdout/stderr line.
        if [m.get("text") for m in stdout] != ["out\n"] or not all(isinstance(m.get("timestamp"), str) for m in stdout):
            raise WireMismatchError(f"POST {url}: stdout lines {stdout}, expected one 'out\\n' with a timestamp")
        results = [m for m in messages if m["type"] == "result"]
        if [(m.get("text"), m.get("is_main_result")) for m in results] != [("2", True)]:
            raise WireMismatchError(f"POST {url}: results {results}, expected one main result '2'")


def interpreter_statuses(wire: Wire) -> None:
    """The refusals the clients map to their exceptions: 400 for context and language together, 404 unknown."""
    with wire.sandbox(templateID=INTERPRETER_TEMPLATE, secure=True) as created:
        sandbox_id, headers = created["sandboxID"], _interpreter_headers(created)
        contexts = wire.expect(wire.http.get(wire.interpreter(sandbox_id, "/contexts"), headers=headers), 200)
        if not isinstance(contexts, list) or not all(
            isinstance(c, dict) and {"id", "language", "cwd"} <= set(c) for c in contexts
        ):
            raise WireMismatchError(f"GET {wire.interpreter(sandbox_id, '/contexts')}: {contexts!r}")
        python = [c["id"] for c in contexts if c["language"] == "python"]
        if not python:
            raise WireMismatchError(f"GET {wire.interpreter(sandbox_id, '/contexts')}: no python context: {contexts}")
        execute = wire.interpreter(sandbox_id, "/execute")
        both = {"code": "1", "context_id": python[0], "language": "python"}
        wire.expect(wire.http.post(execute, json=both, headers=headers), 400, "context_id and language together")
        unknown = {"code": "1", "context_id": "no-such-context"}
        wire.expect(wire.http.post(execute, json=unknown, headers=headers), 404, "an unknown context")
        remove = wire.interpreter(sandbox_id, "/contexts/no-such-context")
        wire.expect(wire.http.delete(remove, headers=headers), 404, "removing an unknown context")
        restart = wire.interpreter(sandbox_id, "/contexts/no-such-context/restart")
        wire.expect(wire.http.post(restart, headers=headers), 404, "restarting an unknown context")


@dataclass(frozen=True)
class WireCase:
    name: str
    operations: tuple[str, ...]
    run: Callable[[Wire], None]


LIFE = ("control.sandboxes.create", "control.sandboxes.kill")
WIRE_CASES: tuple[WireCase, ...] = (
    WireCase("wire/control/create-status", LIFE, create_status),
    WireCase("wire/control/error-shape", ("control.sandboxes.get", "control.sandboxes.list"), error_shape),
    WireCase("wire/control/pause-twice", (*LIFE, "control.sandboxes.pause"), pause_twice),
    WireCase(
        "wire/control/connect-statuses",
        (*LIFE, "control.sandboxes.pause", "control.sandboxes.connect"),
        connect_statuses,
    ),
    WireCase("wire/envd/process-stream", (*LIFE, "envd.process.Start"), process_stream),
    WireCase("wire/envd/killed-is-502", (*LIFE, "envd.http.health"), killed_is_502),
    WireCase("wire/envd/protobuf-codec", (*LIFE, "envd.filesystem.Stat", "envd.process.Start"), protobuf_codec),
    WireCase(
        "wire/envd/stream-input",
        (*LIFE, "envd.process.Start", "envd.process.StreamInput", "envd.process.CloseStdin"),
        stream_input,
    ),
    WireCase("wire/routing/shared-host", (*LIFE, "envd.http.health"), shared_host),
    WireCase(
        "wire/control/extras",
        (
            *LIFE,
            "control.sandboxes.list_v1",
            "control.sandboxes.refresh",
            "control.sandboxes.update_network",
            "control.sandboxes.metrics_batch",
            "control.sandboxes.logs_v1",
            "control.sandboxes.logs",
            "control.sandboxes.pause",
            "control.sandboxes.resume",
        ),
        control_extras,
    ),
    WireCase("wire/envd/http-routes", (*LIFE, "envd.http.envs", "envd.http.metrics", "envd.http.init"), envd_http),
    WireCase("wire/interpreter/health", (*LIFE, "interpreter.health"), interpreter_health),
    WireCase("wire/interpreter/execute-ndjson", (*LIFE, "interpreter.execute"), interpreter_execute_ndjson),
    WireCase(
        "wire/interpreter/statuses",
        (
            *LIFE,
            "interpreter.contexts.list",
            "interpreter.execute",
            "interpreter.contexts.remove",
            "interpreter.contexts.restart",
        ),
        interpreter_statuses,
    ),
)


def run_wire_cases(client_env: dict[str, str], match: str = "") -> list[CaseResult]:
    context = ssl.create_default_context(cafile=client_env.get("SSL_CERT_FILE"))
    results = []
    with httpx.Client(verify=context, timeout=60, trust_env=False) as http:
        wire = Wire(http, client_env["E2B_DOMAIN"], client_env["E2B_API_KEY"])
        for case in WIRE_CASES:
            if match not in case.name:
                continue
            start = time.monotonic()
            try:
                case.run(wire)
            except (WireMismatchError, httpx.HTTPError, ValueError, KeyError) as exc:
                results.append(
                    CaseResult(case.name, CLIENT, Outcome.FAIL, time.monotonic() - start, case.operations, str(exc))
                )
                continue
            results.append(CaseResult(case.name, CLIENT, Outcome.PASS, time.monotonic() - start, case.operations))
    return results
