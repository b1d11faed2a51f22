"""The control plane driven by the pinned official clients, unchanged, against real sandboxes.

The cases are the conformance harness's own (``conformance._cases``, family ``sandbox``): a
scenario name, the flavours that run it, the operations it covers and one check per result.
"""

from __future__ import annotations

import pytest

from conformance._cases import Case, cases
from conformance._scenarios import ScenarioRunner

from .conftest import check_case

pytestmark = [pytest.mark.artifacts]


@pytest.mark.parametrize(
    ("flavour", "case"),
    [pytest.param(f, case, id=f"{f}:{case.name}") for case in cases("sandbox") for f in case.flavours],
)
def test_lifecycle_scenario(
    request: pytest.FixtureRequest, lifecycle: ScenarioRunner, flavour: str, case: Case
) -> None:
    check_case(request, lifecycle, flavour, case)
