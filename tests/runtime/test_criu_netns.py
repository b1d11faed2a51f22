"""Comparing a checkpoint's network namespace with a new one's (``runtime._criu_netns``), on made-up images.

Real checkpoints are compared in test_crun_boot_images.
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from runtime._criu_netns import network_images, same_as_new

_ADDR_MAGIC = b"\x22\x12\x36\x47"


def _message(kind: int, body: bytes, *, sequence: int, port: int) -> bytes:
    message = struct.pack("<IHHII", 16 + len(body), kind, 2, sequence, port) + body
    return message + bytes(-len(message) % 4)


def _address(ip: bytes, *, sequence: int, port: int, created: int) -> bytes:
    ifaddrmsg = struct.pack("<BBBBI", 2, 8, 0x80, 254, 1)
    local = struct.pack("<HH", 8, 2) + ip
    cacheinfo = struct.pack("<HH", 20, 6) + struct.pack("<IIII", 0xFFFFFFFF, 0xFFFFFFFF, created, created)
    return _message(20, ifaddrmsg + local + cacheinfo, sequence=sequence, port=port)


def _checkpoint(folder: Path, ns_id: int, *, sequence: int, port: int, created: int, extra: bytes = b"") -> Path:
    folder.mkdir()
    (folder / f"netns-{ns_id}.img").write_bytes(b"sysctls")
    (folder / f"netdev-{ns_id}.img").write_bytes(b"lo")
    (folder / f"iptables-{ns_id}.img").write_bytes(b"")
    loopback = _address(b"\x7f\x00\x00\x01", sequence=sequence, port=port, created=created)
    (folder / f"ifaddr-{ns_id}.img").write_bytes(_ADDR_MAGIC + loopback + extra)
    (folder / "pages-1.img").write_bytes(b"not the network's")  # other images are not compared
    return folder


def test_two_new_namespaces_compare_equal_whatever_socket_dumped_them_and_when(tmp_path: Path) -> None:
    new = _checkpoint(tmp_path / "new", 10, sequence=1, port=111, created=5)
    other = _checkpoint(tmp_path / "other", 12, sequence=2, port=222, created=9)
    assert set(network_images(other) or {}) == {"netns", "netdev", "iptables", "ifaddr"}
    assert same_as_new(other, new)


@pytest.mark.parametrize(
    "change",
    ["an address", "a device", "a rule set", "an image more", "a truncated dump", "no namespace image"],
)
def test_any_other_difference_is_a_changed_namespace(tmp_path: Path, change: str) -> None:
    new = _checkpoint(tmp_path / "new", 10, sequence=1, port=111, created=5)
    extra = _address(b"\x0a\x09\x09\x09", sequence=1, port=111, created=5) if change == "an address" else b""
    changed = _checkpoint(tmp_path / "changed", 10, sequence=1, port=111, created=5, extra=extra)
    if change == "a device":
        (changed / "netdev-10.img").write_bytes(b"lo and dummy0")
    elif change == "a rule set":
        (changed / "iptables-10.img").write_bytes(b"-A OUTPUT -j DROP")
    elif change == "an image more":
        (changed / "rule-10.img").write_bytes(b"\x86\x69\x70\x71")
    elif change == "a truncated dump":
        (changed / "ifaddr-10.img").write_bytes((changed / "ifaddr-10.img").read_bytes()[:-6])
        (new / "ifaddr-10.img").write_bytes((new / "ifaddr-10.img").read_bytes()[:-6])
    elif change == "no namespace image":
        (changed / "netns-10.img").unlink()
    assert not same_as_new(changed, new)
