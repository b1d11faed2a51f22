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


def test_generated_code_does_not_load_the_toolchain() -> None:
    """The agent imports ``contract.generated``; the derivation modules must stay unloaded."""
    import subprocess
    import sys

    probe = (
        "import sys, contract.generated.process.process_pb2\n"
        "print(sorted(m for m in sys.modules if m.startswith(('contract._', 'tree_sitter'))))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
