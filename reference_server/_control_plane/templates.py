"""Template operations. Today only ``DELETE /templates/{id}``, which removes an owner's snapshot.

Template builds (create, build status, files, aliases, tags) are declared unsupported
(``conformance/features.json``): their routes do not exist here, so they answer 404 like any
unknown route. They belong in this module when they come, with their service methods.
"""

from __future__ import annotations

from starlette.convertors import Convertor, register_url_convertor
from starlette.requests import Request
from starlette.responses import Response

from reference_server._requests import check_query

from ._common import Caller, Endpoint, no_content

__all__ = ["ENDPOINTS", "delete_template"]


class AnythingConvertor(Convertor[str]):
    """Like Starlette's ``path``, but newlines too: an id that is not even a name must still reach
    the handler, which authenticates first (401) and then answers that no such template exists."""

    regex = "(?s:.*)"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


register_url_convertor("anything", AnythingConvertor())


async def delete_template(request: Request, caller: Caller) -> Response:
    check_query(request, ())
    # The JS client percent-encodes "/" and ":" in the id, Python sends them raw: the route
    # captures the rest of the path, and Starlette has already decoded it once.
    await caller.service.delete_template(caller.owner, request.path_params["template_id"])
    return no_content()


ENDPOINTS = (Endpoint("DELETE", "/templates/{template_id:anything}", delete_template),)
