"""The curated mutants fit the code and the cases as they are: a change to either that breaks one fails here."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from conformance._mutant_catalog import MUTANTS
from conformance._mutant_run import known_cases
from conformance._mutants import Mutant, apply_mutation, expand_selectors

ROOT = Path(__file__).resolve().parents[2]


def test_ids_are_unique_and_there_are_enough_of_each_part() -> None:
    assert len({mutant.id for mutant in MUTANTS}) == len(MUTANTS)
    parts = Counter(mutant.id.split("/", 1)[0] for mutant in MUTANTS)
    assert parts["server"] >= 10
    assert parts["agent"] >= 10
    assert sum(parts.values()) >= 30


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda mutant: mutant.id)
def test_each_mutant_applies_exactly_once_and_still_compiles(mutant: Mutant) -> None:
    mutated = apply_mutation((ROOT / mutant.file).read_text(encoding="utf-8"), mutant)
    compile(mutated, mutant.file, "exec")  # a mutant that does not import tests nothing but the import


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda mutant: mutant.id)
def test_each_mutant_names_cases_that_exist(mutant: Mutant) -> None:
    assert expand_selectors(mutant.cases, known_cases())


def test_the_id_says_where_the_mutated_code_runs() -> None:
    for mutant in MUTANTS:
        part = mutant.id.split("/", 1)[0]
        if part == "server":
            assert mutant.file.startswith("reference_server/"), mutant.id
        elif part == "agent":
            assert mutant.file.startswith("runtime/agent/"), mutant.id
        elif part == "interpreter":
            assert mutant.file.startswith("runtime/interpreter/"), mutant.id
        else:
            assert part == "runtime", mutant.id
            assert mutant.file.startswith("runtime/"), mutant.id
            assert not mutant.in_sandbox, mutant.id
