"""Reading generated Python operation modules and models, on sources written for these tests."""

from __future__ import annotations

import pytest

from contract import Artifact, ArtifactFiles, ExtractionError
from contract._pyclient import ModelReader, PyResponse, operations

ARTIFACT = Artifact("py-demo", "pypi", "demo", "1", "demo.whl", "0" * 64, None, "demo")

OPERATION = b"""
from typing import Any, Union, cast
from ...types import UNSET, Unset

def _get_kwargs(pet_id: str, *, body: PetUpdate, limit: Union[Unset, int] = UNSET, tags: list[str],
                state: Union[Unset, list[PetState]] = UNSET) -> dict[str, Any]:
    headers: dict[str, Any] = {}
    params: dict[str, Any] = {}
    params["limit"] = limit
    json_tags = tags
    params["tags"] = json_tags
    json_state: Union[Unset, list[str]] = UNSET
    params["state"] = ",".join(str(item) for item in json_state)
    _kwargs: dict[str, Any] = {"method": "patch", "url": f"/pets/{pet_id}/update", "params": params}
    _kwargs["json"] = body.to_dict()
    headers["Content-Type"] = "application/json"
    _kwargs["headers"] = headers
    return _kwargs

def _parse_response(*, client, response):
    if response.status_code == 200:
        response_200 = Pet.from_dict(response.json())
        return response_200
    if response.status_code == 204:
        response_204 = cast(Any, None)
        return response_204
    if response.status_code == 206:
        response_206 = []
        for item in response.json():
            response_206.append(Pet.from_dict(item))
        return response_206
    if response.status_code == 404:
        response_404 = Error.from_dict(response.json())
        return response_404
    return None
"""

MODEL = b"""
from attrs import define as _attrs_define
from ..types import UNSET, Unset

@_attrs_define
class Pet:
    pet_id: str
    age: Union[Unset, int] = UNSET
    nickname: Union[None, Unset, str] = UNSET
    kind: Union[Unset, PetKind] = UNSET
    owner: Union[Unset, "Owner"] = UNSET
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    @classmethod
    def from_dict(cls, src_dict):
        d = dict(src_dict)
        pet_id = d.pop("petID")
        age = d.pop("age", UNSET)
        nickname = d.pop("nickname", UNSET)
        _kind = d.pop("kind", UNSET)
        _owner = d.pop("owner", UNSET)
        return cls(pet_id=pet_id)

class PetKind(str, Enum):
    CAT = "cat"
    DOG = "dog"

class Owner:
    pass

class Labels:
    additional_properties: dict[str, str] = _attrs_field(init=False, factory=dict)

    @classmethod
    def from_dict(cls, src_dict):
        d = dict(src_dict)
        return cls()
"""


def _files() -> ArtifactFiles:
    return ArtifactFiles(
        ARTIFACT,
        {
            "demo/api/pets/patch_pets_pet_id_update.py": OPERATION,
            "demo/api/pets/__init__.py": b"",
            "demo/models/pet.py": MODEL,
        },
    )


def test_operation_is_read_from_source() -> None:
    (op,) = operations(_files(), "demo/api/")
    assert op.module == "demo.api.pets.patch_pets_pet_id_update"
    assert (op.method, op.path) == ("patch", "/pets/{pet_id}/update")
    assert op.shape() == ("patch", "/pets/{}/update")
    params = {p.name: (p.location, p.required) for p in op.params}
    assert params == {
        "pet_id": ("path", True),
        "limit": ("query", False),
        "tags": ("query", True),
        "state": ("query", False),
    }
    assert (op.body_kind, op.body_model, op.content_type) == ("json", "PetUpdate", "application/json")
    assert op.responses == (
        PyResponse(200, "model", "Pet"),
        PyResponse(204, "none"),
        PyResponse(206, "list", "Pet"),
        PyResponse(404, "model", "Error"),
    )


def test_no_operations_is_an_error() -> None:
    with pytest.raises(ExtractionError, match="no generated operations"):
        operations(_files(), "demo/nothing/")


def test_model_schema() -> None:
    models = ModelReader(_files(), "demo/models/")
    schema = models.schema("Pet")
    assert schema["required"] == ["petID"]
    assert schema["properties"] == {
        "petID": {"type": "string"},
        "age": {"type": "integer"},
        "nickname": {"anyOf": [{"type": "string"}, {"type": "null"}]},
        "kind": {"type": "string", "enum": ["cat", "dog"]},
        "owner": {"$ref": "#/components/schemas/Owner"},
    }
    assert models.schema("Labels") == {"type": "object", "additionalProperties": {"type": "string"}}
    with pytest.raises(ExtractionError, match="unsupported model annotation"):
        models.annotation_schema("frozenset[int]")
