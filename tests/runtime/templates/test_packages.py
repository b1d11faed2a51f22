"""The Debian package lock of the kernels layer: its format, apt's answers it is made from, the committed lock."""

from __future__ import annotations

import pytest

from runtime.templates import TemplateError, _keys, _packages

SIMULATION = """NOTE: This is only a simulation!
Inst libfoo1 (1.2-3 Debian:12.12/stable [amd64])
Inst r-base-core [4.2.1-1] (4.2.2.20221110-2 Debian:12.12/stable [amd64])
Inst libbar:amd64 (2:1.0-1 Debian:12.12/stable [amd64])
Conf libfoo1 (1.2-3 Debian:12.12/stable [amd64])
"""

STANZAS = """Package: libfoo1
Version: 1.2-3
Description: a library
 continued on a second line: not a field
SHA256: aaaa

Package: libfoo1
Version: 1.2-2
SHA256: bbbb
"""


def test_the_simulation_gives_every_package_apt_would_install_or_upgrade() -> None:
    assert _packages.parse_simulation(SIMULATION) == [
        ("libfoo1", "1.2-3"),
        ("r-base-core", "4.2.2.20221110-2"),
        ("libbar", "2:1.0-1"),
    ]


def test_stanzas_keep_fields_not_continuations() -> None:
    first, second = _packages.parse_stanzas(STANZAS)
    assert (first["Package"], first["Version"], first["SHA256"]) == ("libfoo1", "1.2-3", "aaaa")
    assert "continued" not in "".join(first.values())
    assert second["Version"] == "1.2-2"


def test_a_lock_line_is_name_version_and_hash() -> None:
    digest = "0" * 64
    lock = f"# header\n\nlibfoo1=2:1.2-3 sha256:{digest}\n".encode()
    assert _packages.parse_lock(lock) == {"libfoo1": ("2:1.2-3", digest)}
    with pytest.raises(TemplateError, match="line 1"):
        _packages.parse_lock(b"libfoo1 1.2-3\n")
    with pytest.raises(TemplateError, match="sha256"):
        _packages.parse_lock(b"libfoo1=1.2-3 sha256:short\n")


def test_the_committed_lock_covers_what_is_asked_for() -> None:
    lock = _packages.read_lock(_packages.lock_path(_keys.SUITE, "amd64"))
    entries = _packages.parse_lock(lock)
    assert set(_packages.requested()) <= set(entries)
    assert len(entries) > len(_packages.requested()), "their dependencies are locked too"


def test_a_machine_without_a_lock_is_told_how_to_make_one() -> None:
    with pytest.raises(TemplateError, match="lock-packages"):
        _packages.read_lock(_packages.lock_path(_keys.SUITE, "sparc"))
