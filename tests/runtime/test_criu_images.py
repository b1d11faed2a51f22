"""The two images a restore into another sandbox rewrites, checked against bytes encoded here by hand.

The layout (two magics, a length, one protobuf message) is written out independently of the
module, so a change in the module's encoding fails here. The real restore is in
test_crun_memory_snapshots.py.
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from runtime import _criu_images

COMMON, USERNS, UTSNS = 0x54564319, 0x55474906, 0x54473203


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _image(magic: int, message: bytes) -> bytes:
    return struct.pack("<III", COMMON, magic, len(message)) + message


def _extent(first: int, lower: int, count: int) -> bytes:
    return b"\x08" + _varint(first) + b"\x10" + _varint(lower) + b"\x18" + _varint(count)


def _userns(lower: int, size: int = 65536) -> bytes:
    extent = _extent(0, lower, size)
    field = _varint(len(extent)) + extent
    return _image(USERNS, b"\x0a" + field + b"\x12" + field)


def _utsns(name: str) -> bytes:
    encoded = name.encode()
    return _image(UTSNS, b"\x0a" + _varint(len(encoded)) + encoded + b"\x12\x06(none)")


def _checkpoint(folder: Path, lower: int, name: str) -> Path:
    (folder / "userns-14.img").write_bytes(_userns(lower))
    (folder / "utsns-12.img").write_bytes(_utsns(name))
    (folder / "pages-1.img").write_bytes(b"untouched")
    return folder


def test_retarget_moves_the_id_map_and_renames_the_host(tmp_path: Path) -> None:
    images = _checkpoint(tmp_path, 227_868_672, "source-id")
    assert (_criu_images.host_first(images), _criu_images.hostname(images)) == (227_868_672, "source-id")
    _criu_images.retarget(images, host_first=227_999_744, hostname="fork-id")
    assert (images / "userns-14.img").read_bytes() == _userns(227_999_744)
    assert (images / "utsns-12.img").read_bytes() == _utsns("fork-id")
    assert (images / "pages-1.img").read_bytes() == b"untouched"
    assert sorted(p.name for p in images.iterdir()) == ["pages-1.img", "userns-14.img", "utsns-12.img"]


def test_without_a_user_namespace_only_the_hostname_changes(tmp_path: Path) -> None:
    images = _checkpoint(tmp_path, 100_000, "a")
    _criu_images.retarget(images, host_first=None, hostname="b")
    assert (images / "userns-14.img").read_bytes() == _userns(100_000)
    assert _criu_images.hostname(images) == "b"


@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("userns-14.img", _image(UTSNS, b"")),  # another image's magic
        ("userns-14.img", _userns(5)[:-1]),  # cut short
        ("userns-14.img", _userns(5) + b"\x00"),  # a second entry
    ],
    ids=["wrong-magic", "cut-short", "trailing-bytes"],
)
def test_an_image_not_the_one_expected_is_refused_and_left_alone(tmp_path: Path, name: str, content: bytes) -> None:
    images = _checkpoint(tmp_path, 5, "a")
    (images / name).write_bytes(content)
    with pytest.raises(_criu_images.ImageError):
        _criu_images.retarget(images, host_first=9, hostname="b")
    assert (images / name).read_bytes() == content


def test_two_user_namespaces_are_not_guessed_between(tmp_path: Path) -> None:
    images = _checkpoint(tmp_path, 5, "a")
    (images / "userns-15.img").write_bytes(_userns(7))
    with pytest.raises(_criu_images.ImageError, match="2 userns images"):
        _criu_images.retarget(images, host_first=9, hostname="b")
