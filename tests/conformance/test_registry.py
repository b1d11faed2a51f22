"""The harness's image: a small userland of this host's own, with nothing of its secrets."""

from __future__ import annotations

import io
import tarfile

from conformance._registry import RegistryOffer, changes_layer, userland_layer


def _members(layer: bytes) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(layer)) as tar:
        return {member.name: member for member in tar.getmembers()}


def _read(layer: bytes, name: str) -> bytes:
    with tarfile.open(fileobj=io.BytesIO(layer)) as tar:
        found = tar.extractfile(name)
        assert found is not None
        return found.read()


def test_the_userland_has_a_shell_and_its_libraries_but_no_python_and_no_host_accounts() -> None:
    layer = userland_layer()
    members = _members(layer)
    assert "usr/bin/bash" in members
    assert members["bin"].issym()  # merged /usr, as Debian lays it out
    assert any(name.startswith("usr/lib/x86_64-linux-gnu/libc.so") for name in members)
    assert not any("python" in name for name in members)
    assert _read(layer, "etc/shadow") == b"root:*:19000:0:99999:7:::\n"  # never the host's hashes
    assert _read(layer, "etc/passwd") == b"root:x:0:0:root:/root:/bin/bash\n"
    assert all(member.uid == 0 for member in members.values())


def test_the_second_layer_carries_a_whiteout_and_an_opaque_folder() -> None:
    members = _members(changes_layer())
    assert "etc/.wh.motd" in members
    assert "opt/old/.wh..wh..opq" in members
    assert (members["srv/greeting.txt"].uid, members["srv/greeting.txt"].mode) == (1234, 0o640)


def test_an_offer_hides_its_password() -> None:
    offer = RegistryOffer("127.0.0.1:5000/conformance/userland:1", "conformance", "s3cret-value")
    assert "s3cret-value" not in repr(offer)
    assert offer.env()["IMAGE_PASSWORD"] == "s3cret-value"
