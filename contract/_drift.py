"""Regenerate the contract and compare it with what is committed.

Drift is reported file by file: a unified diff for text, and for the binary
descriptor set a diff of its protobuf text form, so a reviewer sees which field of
which message changed rather than two digests.
"""

from __future__ import annotations

import difflib
import shutil
import tempfile
from pathlib import Path

from google.protobuf import descriptor_pb2, text_format

from . import _newest
from ._derive import CONTRACT_DIR, DERIVED, GENERATED, MANIFEST, generate
from ._errors import DriftError
from ._fetch import ArtifactStore

OUTPUTS = (DERIVED, GENERATED, MANIFEST, f"{_newest.NEWEST}/derived", _newest.MANIFEST)
_MAX_DIFF_LINES = 80


def output_files(root: Path) -> dict[str, Path]:
    """Every generated file below ``root`` (derived/, generated/, manifest.json, newest/'s), by relative path."""
    found: dict[str, Path] = {}
    for name in OUTPUTS:
        target = root / name
        if target.is_file():
            found[name] = target
        elif target.is_dir():
            for path in sorted(target.rglob("*")):
                if path.is_file() and "__pycache__" not in path.parts:
                    found[path.relative_to(root).as_posix()] = path
    return found


def _readable(rel: str, data: bytes) -> list[str]:
    if rel.endswith(".binpb"):
        fds = descriptor_pb2.FileDescriptorSet()
        try:
            fds.ParseFromString(data)
            return text_format.MessageToString(fds).splitlines(keepends=True)
        except Exception:  # noqa: BLE001 - a corrupt file is itself the drift to show
            return [f"<{len(data)} bytes that do not parse as a FileDescriptorSet>\n"]
    try:
        return data.decode("utf-8").splitlines(keepends=True)
    except UnicodeDecodeError:
        return [f"<{len(data)} bytes of binary data>\n"]


def compare(expected_root: Path, actual_root: Path) -> str:
    """Human-readable differences between two contract trees ('' when identical)."""
    expected, actual = output_files(expected_root), output_files(actual_root)
    sections: list[str] = []
    for rel in sorted(set(expected) - set(actual)):
        sections.append(f"missing: {rel} (regeneration produces it, the committed tree lacks it)\n")
    for rel in sorted(set(actual) - set(expected)):
        sections.append(f"unexpected: {rel} (committed, but regeneration does not produce it)\n")
    for rel in sorted(set(expected) & set(actual)):
        want, have = expected[rel].read_bytes(), actual[rel].read_bytes()
        if want == have:
            continue
        diff = list(
            difflib.unified_diff(
                _readable(rel, have), _readable(rel, want), f"committed/{rel}", f"regenerated/{rel}", n=2
            )
        )
        shown = diff[:_MAX_DIFF_LINES]
        if len(diff) > _MAX_DIFF_LINES:
            shown.append(f"... {len(diff) - _MAX_DIFF_LINES} more diff lines\n")
        sections.append(f"changed: {rel}\n" + "".join(line if line.endswith("\n") else line + "\n" for line in shown))
    return "\n".join(sections)


def check(contract_dir: Path = CONTRACT_DIR, store: ArtifactStore | None = None) -> None:
    """Regenerate into a scratch folder; raise ``DriftError`` if anything differs."""
    with tempfile.TemporaryDirectory(prefix="contract-check-") as tmp:
        generate(Path(tmp), store=store, contract_dir=contract_dir)
        report = compare(Path(tmp), contract_dir)
    if report:
        raise DriftError(
            "the committed contract differs from what the pinned artifacts produce "
            "(run `e2b-compat contract generate` if the change is intended):\n\n" + report
        )


def write(contract_dir: Path = CONTRACT_DIR, store: ArtifactStore | None = None) -> list[str]:
    """Regenerate and replace the committed outputs; return the relative paths that changed."""
    with tempfile.TemporaryDirectory(prefix="contract-gen-") as tmp:
        fresh = Path(tmp)
        generate(fresh, store=store, contract_dir=contract_dir)
        before = {rel: p.read_bytes() for rel, p in output_files(contract_dir).items()}
        for name in OUTPUTS:
            target = contract_dir / name
            if target.is_dir():
                shutil.rmtree(target)
            elif target.exists():
                target.unlink()
            source = fresh / name
            if source.is_dir():
                shutil.copytree(source, target)
            else:
                shutil.copy2(source, target)
        after = {rel: p.read_bytes() for rel, p in output_files(contract_dir).items()}
    return sorted(rel for rel in set(before) | set(after) if before.get(rel) != after.get(rel))
