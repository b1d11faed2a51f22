"""Property-based contract suites for any E2B-style control plane (``https://api.<domain>``).

Two pieces, both driven by the derived control-plane document (``contract/derived``):

- ``ContractValidator`` (openapi-core): does one response conform? Its status must be declared
  for the operation and its body must match that status's schema. Undeclared response headers
  are not problems: the clients read ``x-next-token`` although the document does not declare it.
- ``run_schemathesis``: schemathesis generates requests from the same document (valid ones and,
  with the key, invalid ones), sends them to the endpoint and checks every answer: never a 5xx,
  a declared status (a few statuses real servers use but upstream never declared are warnings,
  ``TOLERATED_UNDECLARED``), a body and content type matching the schema. With
  ``wrong_credentials`` every operation must answer 401 with an ``Error`` body instead.

What is sent is limited because the target may be a real, billed service: operations in
``EXCLUDED`` are never called, operations that create sandboxes run only a few examples, and
every sandbox, snapshot or volume a response reports as created is deleted in a ``finally``.
Findings name the operation, the check and the request (method, path, query and the shape of
the body with every string value redacted); the API key and response values are never quoted.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
import json
import os
import re
import time
import urllib.parse
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any

import hypothesis
import jsonschema
import referencing
import requests
import schemathesis
import schemathesis.checks
from hypothesis import strategies as st
from openapi_core import OpenAPI
from openapi_core.datatypes import RequestParameters
from openapi_core.deserializing.exceptions import DeserializeError
from openapi_core.templating.media_types.exceptions import MediaTypeNotFound
from openapi_core.templating.responses.exceptions import ResponseNotFound
from openapi_core.validation.response.exceptions import HeaderValidationError, MissingData
from openapi_core.validation.schemas.exceptions import InvalidSchemaValue
from referencing.jsonschema import DRAFT202012
from schemathesis import Case, GenerationMode
from schemathesis import Response as StResponse
from schemathesis.checks import CheckFunction
from schemathesis.core import NotSet
from schemathesis.errors import FailureGroup, SchemathesisError
from schemathesis.schemas import APIOperation
from werkzeug.datastructures import Headers

from contract import load_inventory
from contract.protocol import API_KEY_HEADER

_Operation = APIOperation[Any, Any, Any, Any]
_Case = Case[Any]

__all__ = [
    "EXCLUDED",
    "SANDBOX_CREATORS",
    "TOLERATED_UNDECLARED",
    "VOLUME_CREATORS",
    "ContractValidator",
    "Exclusion",
    "Finding",
    "RequestSummary",
    "SuiteResult",
    "Tolerance",
    "control_plane_url",
    "run_schemathesis",
]

_DOCUMENT = ("derived", "control-plane.openapi.json")  # package data of ``contract``
_SCHEMA_URI = "urn:e2b-compat:conformance:control-plane"


@dataclass(frozen=True)
class Exclusion:
    """Operations never called: ``pattern`` is an fnmatch pattern over the path template."""

    pattern: str
    reason: str
    methods: frozenset[str] = frozenset()  # upper case; empty means every method

    def matches(self, method: str, path: str) -> bool:
        return fnmatch.fnmatchcase(path, self.pattern) and (not self.methods or method.upper() in self.methods)


EXCLUDED: tuple[Exclusion, ...] = (
    Exclusion("/v3/templates*", "template builds: build images, expensive; not offered by a sandbox server"),
    Exclusion("/v2/templates*", "template builds and updates: expensive; not offered by a sandbox server"),
    Exclusion(
        "/templates/tags",
        "template tags: not offered by a sandbox server; fuzzing it against a real service could remove tags",
    ),
    Exclusion(
        "/templates*",
        "template management and builds: expensive or not offered by a sandbox server"
        " (DELETE /templates/{templateID} is kept: clients delete snapshots with it)",
        frozenset({"GET", "POST", "PATCH", "PUT"}),
    ),
    Exclusion("/teams*", "team administration and metrics: account level, not offered by a sandbox server"),
)


@dataclass(frozen=True)
class Tolerance:
    """An undeclared status real servers answer: reported as a warning, not a failure."""

    status: int
    reason: str
    operations: frozenset[str] = frozenset()  # "METHOD /template"; empty means every operation


TOLERATED_UNDECLARED: tuple[Tolerance, ...] = (
    Tolerance(
        400,
        "invalid parameters or bodies: upstream's router validates every request (and the derived document lost"
        " ranges such as limit 1..100), but the document declares 400 only on some operations",
    ),
    Tolerance(
        404,
        "an unknown template or snapshot named by the request; clients read it as 'not found'",
        frozenset({"POST /sandboxes", "POST /v2/sandboxes", "DELETE /templates/{templateID}"}),
    ),
    Tolerance(405, "the router's answer to a method the path does not have"),
    Tolerance(409, "lifecycle conflicts (e.g. pausing a paused sandbox) on operations that do not declare 409"),
    Tolerance(413, "a body over the server's size limit"),
    Tolerance(429, "rate limiting; the clients map it to RateLimitException"),
)

# Operations whose success creates a sandbox: few examples, and every id they report is killed.
SANDBOX_CREATORS = frozenset({"POST /sandboxes", "POST /v2/sandboxes"})
# Operations whose success creates a volume (storage on the target): as few examples, each id destroyed.
VOLUME_CREATORS = frozenset({"POST /volumes"})

_CHECKS = ("not_a_server_error", "status_code_conformance", "content_type_conformance", "response_schema_conformance")
_WRONG_KEYS: tuple[tuple[str, str | None], ...] = (
    ("missing", None),
    ("malformed", "not-an-api-key"),
    ("unknown", "e2b_" + "0" * 40),  # well-formed, so a server that only checks the format is caught too
)
_PLAIN_STRING_KEYS = frozenset({"templateID"})  # body strings safe and useful to show verbatim
_KILL = ("DELETE", "/sandboxes/{sandboxID}")
_DELETE_SNAPSHOT = ("DELETE", "/templates/{templateID}")
_DESTROY_VOLUME = ("DELETE", "/volumes/{volumeID}")


@cache
def _document() -> dict[str, Any]:
    text = resources.files("contract").joinpath(*_DOCUMENT).read_text(encoding="utf-8")
    document: dict[str, Any] = json.loads(text)
    return document


def _fresh_document() -> dict[str, Any]:
    document: dict[str, Any] = json.loads(json.dumps(_document()))  # loaders annotate the dict they get
    return document


# -- one response against the contract ----------------------------------------------------------


@dataclass
class _Request:
    """The request side openapi-core needs to find the operation (``path_pattern`` pins the template)."""

    host_url: str
    path: str
    method: str
    path_pattern: str
    parameters: RequestParameters = field(default_factory=RequestParameters)
    body: bytes | None = None
    content_type: str = ""


@dataclass
class _Response:
    status_code: int
    headers: Headers
    data: bytes | None
    content_type: str


class ContractValidator:
    """Checks single responses against the derived control-plane document with openapi-core."""

    def __init__(self, document: Mapping[str, Any] | None = None) -> None:
        self._document: dict[str, Any] = json.loads(json.dumps(document)) if document else _fresh_document()
        self._api = OpenAPI.from_dict(self._document)
        templates = [
            (path, method.upper())
            for path, item in self._document["paths"].items()
            for method in item
            if method in ("get", "put", "post", "delete", "patch", "head", "options")
        ]
        # Literal segments win over parameters ("/sandboxes/metrics" before "/sandboxes/{sandboxID}").
        templates.sort(key=lambda pair: (-sum(not s.startswith("{") for s in pair[0].split("/")), pair[0]))
        self._templates = [(re.compile(_template_regex(path)), path, method) for path, method in templates]
        registry: referencing.Registry[Any] = referencing.Registry().with_resource(
            _SCHEMA_URI, referencing.Resource.from_contents(self._document, default_specification=DRAFT202012)
        )
        self._registry = registry

    def operation(self, method: str, path: str) -> str | None:
        """``"METHOD /template"`` of the operation ``path`` (a template or a concrete path) belongs to."""
        method = method.upper()
        path = urllib.parse.urlsplit(path).path
        for pattern, template, declared in self._templates:
            if declared == method and (path == template or pattern.fullmatch(path)):
                return f"{method} {template}"
        return None

    def declared_statuses(self, method: str, path: str) -> tuple[int, ...]:
        """The statuses the document declares for the operation (empty when there is no such operation)."""
        label = self.operation(method, path)
        if label is None:
            return ()
        method, template = label.split(" ", 1)
        responses = self._document["paths"][template][method.lower()]["responses"]
        return tuple(sorted(int(code) for code in responses if code.isdigit()))

    def validate_response(
        self, method: str, path: str, status: int, headers: Mapping[str, str], body: bytes | str | None
    ) -> list[str]:
        """Problems of one response (empty when it conforms); an undeclared status is one of them.

        ``path`` is a template (``/sandboxes/{sandboxID}``) or a concrete path; ``body`` is the raw
        body as received. Messages never quote values from the body.
        """
        label = self.operation(method, path)
        if label is None:
            return [f"{method.upper()} {path}: no such operation in the contract"]
        template = label.split(" ", 1)[1]
        raw = body.encode() if isinstance(body, str) else body
        header_map = Headers(list(headers.items()))
        request = _Request("https://api.contract.invalid", path, method.lower(), template)
        response = _Response(status, header_map, raw or None, header_map.get("content-type", "").lower())
        problems: list[str] = []
        for error in self._api.iter_response_errors(request, response):
            problems.extend(self._describe(error, label, status, response.content_type))
        return problems

    def error_body_problems(self, status: int, body: bytes | str | None) -> list[str]:
        """Problems of an error body: must be the ``Error`` schema, with ``code`` equal to the status.

        The JS client tells "not found" from "conflict" by ``code``, not by the HTTP status.
        """
        try:
            value = json.loads(body or b"")
        except ValueError:
            return ["body: not JSON (an Error object was expected)"]
        validator = jsonschema.Draft202012Validator(
            {"$ref": f"{_SCHEMA_URI}#/components/schemas/Error"}, registry=self._registry
        )
        problems = [f"body: {_describe_schema_error(error)}" for error in validator.iter_errors(value)]
        if not problems and value.get("code") != status:
            problems.append(f"body: code is not the HTTP status {status}")
        return problems

    def _describe(self, error: Exception, label: str, status: int, content_type: str) -> Iterator[str]:
        if isinstance(error, ResponseNotFound):
            declared = ", ".join(map(str, self.declared_statuses(*label.split(" ", 1))))
            yield f"status {status} is not declared for {label} (declared: {declared})"
            return
        cause = error.__cause__ or error  # openapi-core wraps the finding in a DataValidationError
        if isinstance(cause, InvalidSchemaValue):
            errors = [e for e in cause.schema_errors if isinstance(e, jsonschema.ValidationError)]
            yield from (f"body: {_describe_schema_error(e)}" for e in errors) if errors else ["body: does not match"]
        elif isinstance(cause, MediaTypeNotFound):
            declared = ", ".join(cause.availableMimetypes)
            yield f"content type '{cause.mimetype}' is not declared for status {status} (declared: {declared})"
        elif isinstance(cause, MissingData):
            yield f"body: missing (status {status} declares content)"
        elif isinstance(cause, DeserializeError):
            yield f"body: cannot be read as {content_type or 'the declared media type'}"
        elif isinstance(cause, HeaderValidationError):
            yield f"header {cause.name}: {type(cause).__name__}"
        else:
            yield f"{type(cause).__name__}: {str(cause)[:200]}"


@cache
def _default_validator() -> ContractValidator:
    return ContractValidator()


def _template_regex(template: str) -> str:
    return "".join(
        "[^/]+" if part.startswith("{") else re.escape(part) for part in re.split(r"(\{[^}]+\})", template) if part
    )


def _describe_schema_error(error: jsonschema.ValidationError) -> str:
    """Where and which keyword failed; never the value (bodies carry tokens and environment variables)."""
    where = "/".join(str(part) for part in error.absolute_path) or "(root)"
    if error.validator == "type":
        return f"{where}: must be of type {error.validator_value}"
    if error.validator in ("required", "additionalProperties"):
        return f"{where}: {error.message}"  # names properties, never values
    return f"{where}: does not satisfy {error.validator}"


# -- results ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RequestSummary:
    """What was sent, safe to print: no headers, string values in the body replaced by their length."""

    method: str
    path: str
    query: str = ""
    body: str = ""

    def __str__(self) -> str:
        target = f"{self.path}?{self.query}" if self.query else self.path
        return f"{self.method} {target}" + (f" body {self.body}" if self.body else "")


@dataclass(frozen=True)
class Finding:
    operation: str  # "POST /sandboxes"
    operation_id: str | None  # the inventory id, when the inventory names it
    check: str  # "not_a_server_error", "status_code_conformance", ... "wrong_credentials"
    message: str
    request: RequestSummary
    status: int | None = None
    occurrences: int = 1

    def __str__(self) -> str:
        times = f" (x{self.occurrences})" if self.occurrences > 1 else ""
        return f"{self.operation} [{self.check}] {self.message}{times}\n    request: {self.request}"


@dataclass(frozen=True)
class SuiteResult:
    suite: str  # "schemathesis" or "schemathesis-wrong-credentials"
    base_url: str
    operations: tuple[str, ...]  # labels of the operations exercised
    excluded: tuple[tuple[str, str], ...]  # (label, reason)
    failures: tuple[Finding, ...]
    warnings: tuple[Finding, ...]
    requests: int
    duration_s: float
    sandboxes_created: int  # ids reported by responses (the shared sandbox included), all deleted afterwards
    snapshots_created: int
    volumes_created: int
    cleanup_problems: tuple[str, ...] = ()

    @property
    def passed(self) -> bool:
        return not self.failures and not self.cleanup_problems

    @property
    def failing_operations(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(finding.operation for finding in self.failures))

    def report(self) -> str:
        verdict = "passed" if self.passed else "FAILED"
        lines = [
            f"{self.suite} against {self.base_url}: {verdict}; {len(self.operations)} operations, "
            f"{self.requests} requests, {self.duration_s:.1f} s, {self.sandboxes_created} sandboxes and "
            f"{self.snapshots_created} snapshots and {self.volumes_created} volumes created (and deleted)"
        ]
        lines += [f"FAIL {finding}" for finding in self.failures]
        lines += [f"CLEANUP {problem}" for problem in self.cleanup_problems]
        lines += [f"warn {finding}" for finding in self.warnings]
        return "\n".join(lines)


# -- the schemathesis run -----------------------------------------------------------------------


def control_plane_url(domain: str) -> str:
    """The control plane's base URL for an endpoint's ``E2B_DOMAIN`` (which may carry a port)."""
    return f"https://api.{domain}"


def run_schemathesis(
    base_url: str,
    api_key: str,
    *,
    ca_file: str | os.PathLike[str] | None,
    max_examples: int,
    operations: Collection[str] | None = None,
    wrong_credentials: bool = False,
    template: str = "base",
    sandbox_examples: int = 2,
    seed: int = 0,
    request_timeout_s: float = 60.0,
    app: Any = None,
) -> SuiteResult:
    """Generate requests from the contract, send them to ``base_url`` and check every answer.

    ``base_url`` is the control plane, ``https://api.<domain>``; ``ca_file`` the CA bundle to
    trust (None: the system's). ``operations`` limits the run to inventory ids or
    ``"METHOD /template"`` labels. ``max_examples`` is per operation and generation mode (valid,
    invalid); sandbox-creating operations get ``sandbox_examples`` instead, and their valid
    examples name ``template`` so that creation really happens. Requests for one
    sandbox use, half of the time, a sandbox created for the run. ``app``, an ASGI application,
    replaces the network (for testing the harness itself).
    """
    started = time.monotonic()
    run = _Run(
        base_url=base_url.rstrip("/"),
        api_key=api_key,
        verify=os.fspath(ca_file) if ca_file is not None else True,
        timeout_s=request_timeout_s,
        seed=seed,
        app=app,
    )
    selected, excluded = _select(run.schema, operations)
    # Destructive operations last, so the shared sandbox lives through the rest.
    selected.sort(key=lambda op: (op.method.upper() == "DELETE", op.path))
    try:
        if any("{sandboxID}" in op.path for op in selected):
            run.live = run.create_fixture_sandbox(template)
        for op in selected:
            label = _label(op)
            creator = label in SANDBOX_CREATORS
            few = creator or label in VOLUME_CREATORS
            examples = min(max_examples, sandbox_examples) if few else max_examples
            if wrong_credentials:
                run.exercise(op, GenerationMode.POSITIVE, examples, template=None, wrong_credentials=True)
                continue
            run.exercise(op, GenerationMode.POSITIVE, examples, template=template if creator else None)
            if _negatable(op):
                run.exercise(op, GenerationMode.NEGATIVE, examples, template=None)
    finally:
        cleanup = run.clean_up()
    return SuiteResult(
        suite="schemathesis-wrong-credentials" if wrong_credentials else "schemathesis",
        base_url=run.base_url,
        operations=tuple(_label(op) for op in selected),
        excluded=tuple(excluded),
        failures=tuple(run.findings(failures=True)),
        warnings=tuple(run.findings(failures=False)),
        requests=run.requests,
        duration_s=time.monotonic() - started,
        sandboxes_created=len(run.sandboxes),
        snapshots_created=len(run.snapshots),
        volumes_created=len(run.volumes),
        cleanup_problems=tuple(cleanup),
    )


def _label(op: _Operation) -> str:
    return f"{op.method.upper()} {op.path}"


def _negatable(op: _Operation) -> bool:
    """Whether an invalid request exists; asking Hypothesis for one where none does costs hundreds of tries.

    Invalid means a body, a query, header or cookie parameter, or a constrained path parameter: any
    string is a valid plain path parameter.
    """
    if len(op.body) or len(op.query) or len(op.headers) or len(op.cookies):
        return True
    return any(parameter.definition.get("schema") != {"type": "string"} for parameter in op.path_parameters)


@cache
def operation_ids() -> dict[str, str]:
    return {
        f"{operation.method} {operation.path}": operation.id
        for operation in load_inventory()
        if operation.surface == "control-plane" and operation.method
    }


def _select(schema: Any, names: Collection[str] | None) -> tuple[list[_Operation], list[tuple[str, str]]]:
    ids = operation_ids()
    every = [result.ok() for result in schema.get_all_operations()]
    known = {_label(op) for op in every} | {ids[_label(op)] for op in every if _label(op) in ids}
    unknown = sorted(set(names or ()) - known)
    if unknown:
        raise ValueError(f"unknown operations: {', '.join(unknown)} (use inventory ids or 'METHOD /path')")
    selected: list[_Operation] = []
    excluded: list[tuple[str, str]] = []
    for op in every:
        label = _label(op)
        if names is not None and label not in names and ids.get(label) not in names:
            continue
        exclusion = next((e for e in EXCLUDED if e.matches(op.method, op.path)), None)
        if exclusion is not None:
            excluded.append((label, exclusion.reason))
        else:
            selected.append(op)
    return selected, excluded


@dataclass
class _Seen:
    finding: Finding
    failure: bool


@dataclass
class _Run:
    base_url: str
    api_key: str
    verify: str | bool
    timeout_s: float
    seed: int
    app: Any
    live: str | None = None
    requests: int = 0
    sandboxes: dict[str, None] = field(default_factory=dict)  # ordered set of every id seen created
    snapshots: dict[str, None] = field(default_factory=dict)
    volumes: dict[str, None] = field(default_factory=dict)
    seen: dict[tuple[str, str, str], _Seen] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # An explicit default configuration: a schemathesis.toml in the working folder must not change the run.
        self.schema = schemathesis.openapi.from_dict(_fresh_document(), config=schemathesis.Config())
        self.checks: list[tuple[str, CheckFunction]] = [(name, getattr(schemathesis.checks, name)) for name in _CHECKS]
        self.session: requests.Session | None = None
        if self.app is None:
            self.session = requests.Session()
            self.session.trust_env = False  # the run depends on its arguments only (no proxies, no .netrc)

    # -- sending --

    def send(self, case: _Case, key: str | None) -> StResponse:
        headers = {} if key is None else {API_KEY_HEADER: key}
        self.requests += 1
        if self.app is not None:
            return case.call(base_url=self.base_url, headers=headers, app=self.app)
        return case.call(
            base_url=self.base_url, session=self.session, headers=headers, verify=self.verify, timeout=self.timeout_s
        )

    def attempt(self, op: _Operation, case: _Case, key: str | None, summary: RequestSummary) -> StResponse | None:
        """Send, recording a request that could not be made or answered (None then)."""
        try:
            return self.send(case, key)
        except SchemathesisError as exc:  # the generated case cannot be sent (e.g. serialized): ours, not theirs
            self.record(op, "generation", _exception_text(exc), request=summary, status=None, failure=False)
        except Exception as exc:  # noqa: BLE001 -- an exception escaping the app or the transport is a finding
            self.record(op, "request_failed", _exception_text(exc), request=summary, status=None, failure=True)
        return None

    def create_fixture_sandbox(self, template: str) -> str | None:
        op = self.schema["/sandboxes"]["POST"]
        case = op.Case(body={"templateID": template, "timeout": 300}, media_type="application/json")
        summary = _summarize(case)
        try:
            response = self.send(case, self.api_key)
        except Exception as exc:  # noqa: BLE001 -- any transport failure is a finding, not a crash of the suite
            self.record(
                op,
                "setup",
                f"creating the shared sandbox failed: {type(exc).__name__}",
                request=summary,
                status=None,
                failure=True,
            )
            return None
        self.track(op, response)
        body = _json(response)
        if response.status_code != 201 or not isinstance(body, dict) or not isinstance(body.get("sandboxID"), str):
            self.record(
                op,
                "setup",
                f"a valid create answered {response.status_code}",
                request=summary,
                status=response.status_code,
                failure=True,
            )
            return None
        return str(body["sandboxID"])

    # -- generating --

    def exercise(
        self,
        op: _Operation,
        mode: GenerationMode,
        examples: int,
        *,
        template: str | None,
        wrong_credentials: bool = False,
    ) -> None:
        strategy = st.tuples(op.as_strategy(mode), st.booleans(), st.sampled_from(_WRONG_KEYS))
        # A volume create's valid examples carry a name every server takes: creations that happen (the
        # negative examples still send names of every other type).
        names = _label(op) in VOLUME_CREATORS and mode == GenerationMode.POSITIVE and not wrong_credentials

        @hypothesis.settings(
            max_examples=examples,
            deadline=None,
            database=None,
            phases=(hypothesis.Phase.generate,),
            suppress_health_check=list(hypothesis.HealthCheck),
            verbosity=hypothesis.Verbosity.quiet,
            print_blob=False,
        )
        @hypothesis.seed(self.seed)
        @hypothesis.given(strategy)
        def explore(drawn: tuple[_Case, bool, tuple[str, str | None]]) -> None:
            case, flip, (kind, wrong_key) = drawn
            if flip and self.live is not None and "sandboxID" in (case.path_parameters or {}):
                assert case.path_parameters is not None
                case.path_parameters["sandboxID"] = self.live
            if template is not None and isinstance(case.body, dict):
                case.body["templateID"] = template  # a creation that really happens, with generated options
            if names and isinstance(case.body, dict):
                case.body["name"] = f"schema-{os.urandom(5).hex()}"
            if wrong_credentials:
                self.check_rejected(op, case, kind, wrong_key)
            else:
                self.check_answer(op, case)

        # Unsatisfiable: nothing in this operation can be made invalid after all (``_negatable`` is a guess).
        with contextlib.suppress(hypothesis.errors.Unsatisfiable):
            explore()

    # -- checking --

    def check_answer(self, op: _Operation, case: _Case) -> None:
        summary = _summarize(case)
        response = self.attempt(op, case, self.api_key, summary)
        if response is None:
            return
        self.track(op, response)
        status = response.status_code
        for name, check in self.checks:
            try:
                case.validate_response(response, checks=[check])
            except FailureGroup as group:
                for failure in group.exceptions:
                    message = _failure_text(failure, status)
                    if name == "response_schema_conformance":
                        message = self.explain_body(op, response) or message
                    tolerance = self.tolerated(op, status) if name == "status_code_conformance" else None
                    if tolerance is not None:
                        self.record(
                            op,
                            name,
                            f"{message}; tolerated: {tolerance.reason}",
                            request=summary,
                            status=status,
                            failure=False,
                        )
                    else:
                        self.record(op, name, message, request=summary, status=status, failure=True)

    def explain_body(self, op: _Operation, response: StResponse) -> str:
        """The value-free problems openapi-core names in a body schemathesis found wrong (may be empty)."""
        headers = {name: values[0] for name, values in response.headers.items() if values}
        problems = _default_validator().validate_response(
            op.method, op.path, response.status_code, headers, response.content
        )
        body = [problem for problem in problems if problem.startswith("body:")]
        return f"Response violates schema: status {response.status_code} {'; '.join(body[:3])}" if body else ""

    def check_rejected(self, op: _Operation, case: _Case, kind: str, key: str | None) -> None:
        summary = _summarize(case)
        response = self.attempt(op, case, key, summary)
        if response is None:
            return
        self.track(op, response)
        status = response.status_code
        if status != 401:
            self.record(
                op,
                "wrong_credentials",
                f"{kind} API key answered {status}, not 401",
                request=summary,
                status=status,
                failure=True,
            )
            return
        for problem in _default_validator().error_body_problems(401, response.content):
            self.record(op, "error_body", f"{kind} API key: {problem}", request=summary, status=status, failure=True)

    def tolerated(self, op: _Operation, status: int) -> Tolerance | None:
        label = _label(op)
        return next(
            (t for t in TOLERATED_UNDECLARED if t.status == status and (not t.operations or label in t.operations)),
            None,
        )

    def record(
        self,
        op: _Operation,
        check: str,
        message: str,
        *,
        request: RequestSummary,
        status: int | None,
        failure: bool,
    ) -> None:
        """Keep the first request showing each (operation, check, message), and count the others."""
        label = _label(op)
        key = (label, check, message)
        seen = self.seen.get(key)
        if seen is None:
            self.seen[key] = _Seen(Finding(label, operation_ids().get(label), check, message, request, status), failure)
        else:
            seen.finding = dataclasses.replace(seen.finding, occurrences=seen.finding.occurrences + 1)

    def findings(self, *, failures: bool) -> list[Finding]:
        return [seen.finding for seen in self.seen.values() if seen.failure == failures]

    # -- cleaning up --

    def track(self, op: _Operation, response: StResponse) -> None:
        """Remember every sandbox and snapshot a successful answer reports, whatever its exact status."""
        if not 200 <= response.status_code < 300:
            return
        body = _json(response)
        if not isinstance(body, dict):
            return
        if isinstance(body.get("sandboxID"), str) and (_label(op) in SANDBOX_CREATORS or response.status_code == 201):
            self.sandboxes[body["sandboxID"]] = None
        if isinstance(body.get("snapshotID"), str):
            self.snapshots[body["snapshotID"]] = None
        if isinstance(body.get("volumeID"), str) and _label(op) in VOLUME_CREATORS:
            self.volumes[body["volumeID"]] = None

    def clean_up(self) -> list[str]:
        if self.live is not None:
            self.sandboxes[self.live] = None
        problems = [self.delete(_KILL, "sandboxID", sandbox_id) for sandbox_id in self.sandboxes]
        # Snapshots after sandboxes: a snapshot is in use while a sandbox started from it lives.
        problems += [self.delete(_DELETE_SNAPSHOT, "templateID", snapshot) for snapshot in self.snapshots]
        # Volumes last: one is in use while a sandbox that mounts it lives.
        problems += [self.delete(_DESTROY_VOLUME, "volumeID", volume) for volume in self.volumes]
        if self.session is not None:
            self.session.close()
        return [problem for problem in problems if problem]

    def delete(self, route: tuple[str, str], parameter: str, value: str) -> str:
        method, path = route
        case = self.schema[path][method].Case(path_parameters={parameter: value})
        try:
            response = self.send(case, self.api_key)
        except Exception as exc:  # noqa: BLE001 -- report and go on deleting the rest
            return f"{method} {path.replace('{' + parameter + '}', value)}: {_exception_text(exc)}"
        if response.status_code in (200, 202, 204, 404):  # 404: already gone (killed by the run itself)
            return ""
        return f"{method} {path.replace('{' + parameter + '}', value)} answered {response.status_code}"


def _json(response: StResponse) -> Any:
    try:
        return json.loads(response.content or b"null")
    except ValueError:
        return None


def _exception_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}".rstrip(": ")


def _failure_text(failure: Exception, status: int) -> str:
    """A value-free description of a schemathesis failure (response bodies may carry tokens)."""
    title = getattr(failure, "title", type(failure).__name__)
    instance_path = getattr(failure, "instance_path", None)
    schema_path = getattr(failure, "schema_path", None)
    if instance_path is not None and schema_path is not None:
        where = "/".join(map(str, instance_path)) or "(root)"
        keyword = str(schema_path[-1]) if schema_path else "schema"
        return f"{title}: status {status} body at {where} does not satisfy {keyword}"
    defined = getattr(failure, "defined_status_codes", None)
    if defined is not None:
        return f"{title}: status {status} is not declared (declared: {', '.join(map(str, defined))})"
    if title == "Server error":
        return f"{title}: status {status}"
    message = " ".join(str(getattr(failure, "message", "")).split())[:200]
    return f"{title}: status {status}" + (f": {message}" if message else "")


def _summarize(case: _Case) -> RequestSummary:
    query = urllib.parse.urlencode(case.query or {}, doseq=True)
    body = "" if isinstance(case.body, NotSet) else _shape(case.body)
    return RequestSummary(case.method.upper(), case.formatted_path, query[:200], body[:300])


def _shape(value: object, key: str | None = None, depth: int = 0) -> str:
    """The body's structure with every string replaced by its length (env vars and metadata may be secrets)."""
    if depth > 4:
        return "…"
    if isinstance(value, dict):
        items = list(value.items())
        inner = ", ".join(f"{str(k)[:40]}: {_shape(v, str(k), depth + 1)}" for k, v in items[:8])
        return "{" + inner + (", …" if len(items) > 8 else "") + "}"
    if isinstance(value, list):
        inner = ", ".join(_shape(v, None, depth + 1) for v in value[:4])
        return "[" + inner + (", …" if len(value) > 4 else "") + "]"
    if isinstance(value, str):
        return json.dumps(value[:40]) if key in _PLAIN_STRING_KEYS else f"<string, {len(value)} chars>"
    if isinstance(value, bytes):
        return f"<{len(value)} bytes>"
    return json.dumps(value) if isinstance(value, int | float | bool) or value is None else f"<{type(value).__name__}>"
