"""How a mutant's process checks that the mutation is what runs: in the server's imports, in the templates."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from conformance._mutant_child import SITE_PACKAGES, check_import, check_templates, templates_made

LOG = """--- start 1 (pid 420) ---
step: template base-f3d11b39c455e46e ready in 15.1 s
e2b-compat: template base: f3d11b39c455e46e
e2b-compat: template code-interpreter-v1: 0123456789abcdef
e2b-compat server ready
"""


def test_the_templates_are_read_from_what_the_server_said() -> None:
    assert templates_made(LOG) == {"base": "f3d11b39c455e46e", "code-interpreter-v1": "0123456789abcdef"}
    assert templates_made("e2b-compat server ready\n") == {}


def _template(cache: Path, name: str, file: str, text: str) -> None:
    path = cache / "templates" / name / "rootfs" / SITE_PACKAGES / "python3.11" / "site-packages" / file
    path.parent.mkdir(parents=True)
    path.write_text(text)


FILE = "runtime/agent/_http.py"


def test_every_template_must_hold_the_mutated_file(tmp_path: Path) -> None:
    copy, cache = tmp_path / "copy", tmp_path / "cache"
    (copy / FILE).parent.mkdir(parents=True)
    (copy / FILE).write_text("mutated\n")
    made = {"base": "f3d11b39c455e46e", "code-interpreter-v1": "0123456789abcdef"}
    _template(cache, "base-f3d11b39c455e46e", FILE, "mutated\n")
    _template(cache, "code-interpreter-v1-0123456789abcdef", FILE, "mutated\n")
    assert "base-f3d11b39c455e46e, code-interpreter-v1-0123456789abcdef" in check_templates(cache, made, copy, FILE)
    installed = cache / "templates" / "code-interpreter-v1-0123456789abcdef" / "rootfs" / SITE_PACKAGES
    (installed / "python3.11" / "site-packages" / FILE).write_text("original\n")
    with pytest.raises(RuntimeError, match=r"holds another runtime/agent/_http\.py"):
        check_templates(cache, made, copy, FILE)


def test_a_template_without_the_file_or_no_template_at_all_is_refused(tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    (copy / FILE).parent.mkdir(parents=True)
    (copy / FILE).write_text("mutated\n")
    with pytest.raises(RuntimeError, match="has 0 copies"):
        check_templates(tmp_path / "cache", {"base": "f3d11b39c455e46e"}, copy, FILE)
    with pytest.raises(RuntimeError, match="named no template"):
        check_templates(tmp_path / "cache", {}, copy, FILE)


def test_the_mutated_module_must_be_imported_from_the_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    copy = tmp_path / "copy"
    (copy / "mutpkg").mkdir(parents=True)
    (copy / "mutpkg" / "__init__.py").write_text("")
    (copy / "mutpkg" / "mod.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(copy))
    assert check_import(copy, "mutpkg/mod.py") == "mutpkg/mod.py imported from the mutated copy"
    with pytest.raises(RuntimeError, match="not from the mutated copy"):
        check_import(tmp_path / "elsewhere", "mutpkg/mod.py")
    monkeypatch.delitem(sys.modules, "mutpkg", raising=False)
