"""Template operations: builds through the clients' ``Template`` builder, names, tags, files, deletion.

The flow the clients drive is in ``_template_service``'s docstring. ``DELETE /templates/{id}``
removes a built template, or else an owner's snapshot (a snapshot is a template for its owner).
The legacy Dockerfile routes (v1 create, rebuild and build start), which only the retired CLI
uses, are refused with 400 naming the builder that replaces them; the clients' own
``from_dockerfile`` turns a Dockerfile into builder steps. The archive upload (``PUT`` to the
link a files request answered) is the one route without an API key: the link is its authority
(``_build_files``); it is served beside these (``UPLOAD_PATH``), not being a contract operation.
"""

from __future__ import annotations

from starlette.convertors import Convertor, register_url_convertor
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from reference_server import _errors as text
from reference_server import _template_views as views
from reference_server._build_files import UploadRefusedError, UploadTooLargeError
from reference_server._errors import ApiError
from reference_server._events import LEVELS
from reference_server._requests import check_query, integer_query, read_json, single
from reference_server._template_service import TemplateService

from ._common import Caller, Endpoint, no_content

__all__ = [
    "ENDPOINTS",
    "UPLOAD_PATH",
    "alias_exists",
    "assign_tags",
    "build_logs",
    "build_status",
    "create_template",
    "create_template_v2",
    "delete_template",
    "get_template",
    "legacy_dockerfile_build",
    "list_tags",
    "list_templates",
    "remove_tags",
    "start_build",
    "update_template",
    "update_template_v2",
    "upload_archive",
    "upload_link",
]

UPLOAD_PATH = "/template-files/{template_id}/{files_hash}"
LEGACY = (
    "Dockerfile builds through the legacy template API are not served: build with the clients' Template "
    "builder (Template().from_dockerfile(...) turns a Dockerfile into its steps)"
)


class AnythingConvertor(Convertor[str]):
    """Like Starlette's ``path``, but newlines too: an id that is not even a name must still reach
    the handler, which authenticates first (401) and then answers that no such template exists."""

    regex = "(?s:.*)"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


register_url_convertor("anything", AnythingConvertor())


def _service(caller: Caller) -> TemplateService:
    if caller.templates is None:  # a plane made without builds (some tests): the routes do not exist
        raise ApiError(404, text.ROUTE_NOT_FOUND)
    return caller.templates


def _level(request: Request) -> str | None:
    level = single(request.query_params.getlist("level"), "level")
    if level is not None and level not in LEVELS:
        raise ApiError(400, f"Query parameter level must be one of {', '.join(LEVELS)}")
    return level


async def create_template(request: Request, caller: Caller) -> Response:
    check_query(request, ())
    body = await read_json(request, "TemplateBuildRequestV3")
    template, build = await _service(caller).request_build(caller.owner, body)
    return JSONResponse(views.request_response(template, build), status_code=202)


async def create_template_v2(request: Request, caller: Caller) -> Response:
    check_query(request, ())
    body = await read_json(request, "TemplateBuildRequestV2")
    service = _service(caller)
    template, _build = await service.request_build(caller.owner, body)
    record, builds = await service.template(caller.owner, template.template_id)
    return JSONResponse(views.template_legacy(record, builds, caller.service.settings.envd_version), status_code=202)


async def legacy_dockerfile_build(request: Request, caller: Caller) -> Response:
    check_query(request, ())
    _service(caller)
    raise ApiError(400, LEGACY)


async def start_build(request: Request, caller: Caller) -> Response:
    check_query(request, ())
    body = await read_json(request, "TemplateBuildStartV2")
    params = request.path_params
    await _service(caller).start_build(caller.owner, params["templateID"], params["buildID"], body)
    return Response(status_code=202)


async def build_status(request: Request, caller: Caller) -> Response:
    check_query(request, ("logsOffset", "limit", "level"))
    offset = integer_query(request, "logsOffset", default=0, low=0, high=2**31 - 1) or 0
    limit = integer_query(request, "limit", default=100, low=0, high=100)
    params = request.path_params
    build, entries = await _service(caller).build_status(
        caller.owner,
        params["templateID"],
        params["buildID"],
        offset=offset,
        limit=100 if limit is None else limit,
        level=_level(request),
    )
    return JSONResponse(views.build_info(build, entries))


async def build_logs(request: Request, caller: Caller) -> Response:
    check_query(request, ("cursor", "limit", "direction", "level", "source"))
    cursor = integer_query(request, "cursor", default=None, low=0, high=2**63 - 1)
    limit = integer_query(request, "limit", default=100, low=0, high=100)
    direction = single(request.query_params.getlist("direction"), "direction") or "forward"
    if direction not in ("forward", "backward"):
        raise ApiError(400, "Query parameter direction must be forward or backward")
    source = single(request.query_params.getlist("source"), "source")
    if source is not None and source not in ("temporary", "persistent"):
        raise ApiError(400, "Query parameter source must be temporary or persistent")
    params = request.path_params
    entries = await _service(caller).build_logs(
        caller.owner,
        params["templateID"],
        params["buildID"],
        cursor_ms=cursor,
        limit=100 if limit is None else limit,
        forward=direction == "forward",
        level=_level(request),
    )
    return JSONResponse(views.build_logs(entries))


async def upload_link(request: Request, caller: Caller) -> Response:
    check_query(request, ())
    params = request.path_params
    service = _service(caller)
    present, template_id, token = await service.upload_link(caller.owner, params["templateID"], params["hash"])
    path = UPLOAD_PATH.format(template_id=template_id, files_hash=params["hash"])
    url = str(request.base_url).rstrip("/") + path + "?token=" + token
    return JSONResponse(views.file_upload(present, url), status_code=201)


async def upload_archive(request: Request, templates: TemplateService) -> Response:
    """``PUT`` of a build's archive to its link; no API key (see the module docstring)."""
    params = request.path_params
    token = request.query_params.get("token") or ""
    try:
        owner = templates.files.check(token, params["template_id"], params["files_hash"])
        await templates.files.receive(owner, params["files_hash"], request.stream())
    except UploadRefusedError as exc:
        raise ApiError(403, str(exc)) from None
    except UploadTooLargeError as exc:
        raise ApiError(413, str(exc)) from None
    return Response(status_code=200)


async def list_templates(request: Request, caller: Caller) -> Response:
    check_query(request, ("teamID",))
    version = caller.service.settings.envd_version
    found = await _service(caller).templates(caller.owner)
    return JSONResponse([views.template(record, builds, version) for record, builds in found])


async def get_template(request: Request, caller: Caller) -> Response:
    check_query(request, ("nextToken", "limit"))
    record, builds = await _service(caller).template(caller.owner, request.path_params["templateID"])
    return JSONResponse(views.template_with_builds(record, builds, caller.service.settings.envd_version))


async def _update(request: Request, caller: Caller) -> list[str]:
    check_query(request, ())
    body = await read_json(request, "TemplateUpdateRequest")
    public = body.get("public")
    record = await _service(caller).owned(caller.owner, request.path_params["templateID"])
    if public is not None:
        record = await _service(caller).set_public(caller.owner, record.template_id, bool(public))
    return [record.name]


async def update_template(request: Request, caller: Caller) -> Response:
    await _update(request, caller)
    return Response(status_code=200)


async def update_template_v2(request: Request, caller: Caller) -> Response:
    return JSONResponse({"names": await _update(request, caller)})


async def delete_template(request: Request, caller: Caller) -> Response:
    check_query(request, ())
    # The JS client percent-encodes "/" and ":" in the id, Python sends them raw: the route
    # captures the rest of the path, and Starlette has already decoded it once.
    await caller.service.delete_template(caller.owner, request.path_params["template_id"])
    return no_content()


async def alias_exists(request: Request, caller: Caller) -> Response:
    check_query(request, ())
    template_id, public = await _service(caller).alias(caller.owner, request.path_params["alias"])
    return JSONResponse(views.alias(template_id, public))


async def assign_tags(request: Request, caller: Caller) -> Response:
    check_query(request, ())
    body = await read_json(request, "AssignTemplateTagsRequest")
    tags, build_id = await _service(caller).assign_tags(caller.owner, body["target"], body["tags"])
    return JSONResponse(views.assigned_tags(tags, build_id), status_code=201)


async def remove_tags(request: Request, caller: Caller) -> Response:
    check_query(request, ())
    body = await read_json(request, "DeleteTemplateTagsRequest")
    await _service(caller).remove_tags(caller.owner, body["name"], body["tags"])
    return no_content()


async def list_tags(request: Request, caller: Caller) -> Response:
    check_query(request, ())
    found = await _service(caller).tags(caller.owner, request.path_params["templateID"])
    return JSONResponse([views.tag(record) for record in found])


# Order matters where paths overlap: the tag routes before DELETE /templates/{anything}.
ENDPOINTS = (
    Endpoint("POST", "/templates/tags", assign_tags),
    Endpoint("DELETE", "/templates/tags", remove_tags),
    Endpoint("GET", "/templates/aliases/{alias}", alias_exists),
    Endpoint("POST", "/v3/templates", create_template),
    Endpoint("POST", "/v2/templates", create_template_v2),
    Endpoint("POST", "/templates", legacy_dockerfile_build),
    Endpoint("GET", "/templates", list_templates),
    Endpoint("POST", "/templates/{templateID}", legacy_dockerfile_build),
    Endpoint("POST", "/templates/{templateID}/builds/{buildID}", legacy_dockerfile_build),
    Endpoint("GET", "/templates/{templateID}/files/{hash}", upload_link),
    Endpoint("POST", "/v2/templates/{templateID}/builds/{buildID}", start_build),
    Endpoint("GET", "/templates/{templateID}/builds/{buildID}/status", build_status),
    Endpoint("GET", "/templates/{templateID}/builds/{buildID}/logs", build_logs),
    Endpoint("GET", "/templates/{templateID}/tags", list_tags),
    Endpoint("GET", "/templates/{templateID}", get_template),
    Endpoint("PATCH", "/templates/{templateID}", update_template),
    Endpoint("PATCH", "/v2/templates/{templateID}", update_template_v2),
    Endpoint("DELETE", "/templates/{template_id:anything}", delete_template),
)
