"""``contract`` exposes a curated surface; everything in ``__all__`` exists and nothing private leaks."""

from __future__ import annotations

import contract


def test_all_is_sorted_complete_and_importable() -> None:
    # Constants, then classes, then functions, each alphabetical (the order ruff's RUF022 keeps).
    def kind(name: str) -> tuple[int, str]:
        return (0 if name.isupper() else 1 if name[0].isupper() else 2, name)

    assert contract.__all__ == sorted(contract.__all__, key=kind)
    for name in contract.__all__:
        assert hasattr(contract, name), name
    public = {
        n for n in vars(contract) if not n.startswith("_") and not isinstance(getattr(contract, n), type(contract))
    }
    assert public - {"annotations"} == set(contract.__all__)


def test_exception_tree() -> None:
    assert issubclass(contract.ArtifactDigestError, contract.ArtifactError)
    assert issubclass(contract.ArtifactFetchError, contract.ArtifactError)
    for exc in (contract.ArtifactError, contract.LockFileError, contract.ExtractionError, contract.DriftError):
        assert issubclass(exc, contract.ContractError)
