"""A default-backend live case passes only on a green result of the harness's run for it."""

from __future__ import annotations

import pytest

from conformance._cases import cases

from ._default_run import CaseRun, Result, verdict

CASE = cases("sandbox")[0]
FLAVOUR = sorted(CASE.flavours)[0]


def _run(*outcomes: str) -> CaseRun:
    results = tuple(Result(outcome, f"1.{i}", f"d{i}") for i, outcome in enumerate(outcomes))
    return CaseRun("crun", 0, None, {(CASE.name, FLAVOUR): results} if results else {})


@pytest.mark.parametrize("outcomes", [("pass",), ("fixed",), ("pass", "fixed")])
def test_green_results_pass(outcomes: tuple[str, ...]) -> None:
    verdict(_run(*outcomes), FLAVOUR, CASE)


@pytest.mark.parametrize("outcomes", [("fail",), ("pass", "fail"), ("known-fail",), ("skip",), ("unsupported",)])
def test_any_other_result_fails_with_its_detail(outcomes: tuple[str, ...]) -> None:
    with pytest.raises(pytest.fail.Exception, match=rf"{outcomes[-1]} \({FLAVOUR} 1\.{len(outcomes) - 1}\): d"):
        verdict(_run(*outcomes), FLAVOUR, CASE)


def test_a_case_the_run_lacks_fails() -> None:
    with pytest.raises(pytest.fail.Exception, match="has no result"):
        verdict(_run(), FLAVOUR, CASE)
