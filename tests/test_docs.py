"""The repository explains itself: every document the code and docs cite is inside it.

A citation is a Markdown file name (``ARCHITECTURE.md``, ``docs/PROTOCOL-NOTES.md``); a section
cited as ``PROTOCOL-NOTES.md, <section>`` must be a heading of that file.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("contract", "runtime", "reference_server", "conformance", "e2b_compat", "benchmarks", "tests", "docs")
_CITED = re.compile(r"(?<![\w/.-])((?:docs/)?[A-Z][A-Z0-9_-]*\.md)\b")
_SECTION = re.compile(r"PROTOCOL-NOTES\.md,\s+\"?([A-Za-z][A-Za-z0-9 ]+?)\"?(?=[);.:]|$)", re.M)


def _files() -> list[Path]:
    found = [ROOT / "README.md"]
    for part in SOURCES:
        found += [path for path in (ROOT / part).rglob("*") if path.suffix in (".py", ".md", ".cjs") and path.is_file()]
    return [path for path in found if "generated" not in path.parts and path.name != "test_docs.py"]


def _exists(name: str) -> bool:
    return (ROOT / name).is_file() or (ROOT / "docs" / name).is_file()


def test_every_cited_document_is_in_the_repository() -> None:
    missing = []
    for path in _files():
        # A line naming ``shared`` reads the optional reading material beside the checkout (a cross-check).
        text = "\n".join(line for line in path.read_text(encoding="utf-8").splitlines() if "shared" not in line)
        for name in set(_CITED.findall(text)):
            if not _exists(name):
                missing.append(f"{path.relative_to(ROOT)} cites {name}")
    assert missing == []


def test_cited_protocol_sections_exist() -> None:
    headings = {
        line.lstrip("#").strip()
        for line in (ROOT / "docs" / "PROTOCOL-NOTES.md").read_text().splitlines()
        if line.startswith("## ")
    }
    missing = []
    for path in _files():
        for section in _SECTION.findall(path.read_text(encoding="utf-8")):
            first = section.split(";")[0].strip()
            if first not in headings:
                missing.append(f"{path.relative_to(ROOT)}: {first!r}")
    assert missing == [], f"headings are {sorted(headings)}"
