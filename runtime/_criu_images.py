"""A checkpoint's images made another sandbox's: its id range and its hostname.

CRIU keeps every owner, credential and file id in an image as the sandbox sees it (0-based),
with one exception: the user namespace image holds the id map, whose host side is the range of
the sandbox that was checkpointed. The UTS namespace image holds its hostname. A restore into a
new sandbox (a create from a memory snapshot, a fork) rewrites those two images, and everything
else in the checkpoint stays as it was.

An image file is two little-endian u32 magics (CRIU's common one, then the image's own), then
entries, each a u32 length and that many bytes of one protobuf message. The two messages read
here are declared below in this project's words, with CRIU's field numbers:

    userns entry:  1 uid map (repeated extent), 2 gid map (repeated extent)
    extent:        1 first (inside), 2 lower first (host), 3 count
    utsns entry:   1 nodename (the hostname), 2 domainname
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

__all__ = ["ImageError", "host_first", "hostname", "retarget"]

_COMMON_MAGIC = 0x54564319
_USERNS_MAGIC = 0x55474906
_UTSNS_MAGIC = 0x54473203
_HEADER = struct.Struct("<II")
_LENGTH = struct.Struct("<I")


class ImageError(Exception):
    """An image is not the one expected (another CRIU version's layout, a damaged file)."""


def _message_classes() -> tuple[type[Any], type[Any]]:
    optional = descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL
    repeated = descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED
    uint32 = descriptor_pb2.FieldDescriptorProto.TYPE_UINT32
    string = descriptor_pb2.FieldDescriptorProto.TYPE_STRING
    message = descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE
    file = descriptor_pb2.FileDescriptorProto(name="e2b_compat_criu_namespaces.proto", package="e2b_compat.criu")
    extent = file.message_type.add(name="Extent")
    for number, name in enumerate(("first", "lower_first", "count"), start=1):
        extent.field.add(name=name, number=number, label=optional, type=uint32)
    userns = file.message_type.add(name="Userns")
    for number, name in enumerate(("uid_map", "gid_map"), start=1):
        userns.field.add(name=name, number=number, label=repeated, type=message, type_name=".e2b_compat.criu.Extent")
    uts = file.message_type.add(name="Utsns")
    for number, name in enumerate(("nodename", "domainname"), start=1):
        uts.field.add(name=name, number=number, label=optional, type=string)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return (
        message_factory.GetMessageClass(pool.FindMessageTypeByName("e2b_compat.criu.Userns")),
        message_factory.GetMessageClass(pool.FindMessageTypeByName("e2b_compat.criu.Utsns")),
    )


_Userns, _Utsns = _message_classes()


def _read(path: Path, magic: int) -> Any:
    data = path.read_bytes()
    if len(data) < _HEADER.size + _LENGTH.size or _HEADER.unpack_from(data) != (_COMMON_MAGIC, magic):
        raise ImageError(f"{path.name}: not the image expected")
    (length,) = _LENGTH.unpack_from(data, _HEADER.size)
    start = _HEADER.size + _LENGTH.size
    if start + length != len(data):
        raise ImageError(f"{path.name}: one entry expected, the file holds {len(data) - start} bytes for {length}")
    return _Userns if magic == _USERNS_MAGIC else _Utsns, data[start:]


def _rewrite(path: Path, magic: int, change: Any) -> None:
    kind, body = _read(path, magic)
    entry = kind.FromString(body)
    change(entry)
    out = entry.SerializeToString()
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(_HEADER.pack(_COMMON_MAGIC, magic) + _LENGTH.pack(len(out)) + out)
    tmp.replace(path)


def _only(images: Path, prefix: str) -> Path:
    found = sorted(images.glob(f"{prefix}-*.img"))
    if len(found) != 1:  # a sandbox has one of each; more would be namespaces of its own processes
        raise ImageError(f"{len(found)} {prefix} images in the checkpoint, one expected")
    return found[0]


def retarget(images: Path, *, host_first: int | None, hostname: str) -> None:
    """Make the checkpoint in ``images`` restore as the sandbox whose range starts at ``host_first``.

    Each extent keeps its offset and size inside the range; its host side moves from the old
    range's start to ``host_first``. None: the sandbox has no user namespace (root is the host's).
    """

    def move(entry: Any) -> None:
        extents = [*entry.uid_map, *entry.gid_map]
        if not extents:
            raise ImageError("the user namespace image holds no id map")
        base = min(extent.lower_first for extent in extents)
        for extent in extents:
            extent.lower_first = host_first + (extent.lower_first - base)

    def rename(entry: Any) -> None:
        entry.nodename = hostname

    if host_first is not None:
        _rewrite(_only(images, "userns"), _USERNS_MAGIC, move)
    _rewrite(_only(images, "utsns"), _UTSNS_MAGIC, rename)


def host_first(images: Path) -> int:
    """The host side of the id map the checkpoint holds (its lowest ``lower first``)."""
    kind, body = _read(_only(images, "userns"), _USERNS_MAGIC)
    entry = kind.FromString(body)
    return int(min(extent.lower_first for extent in [*entry.uid_map, *entry.gid_map]))


def hostname(images: Path) -> str:
    kind, body = _read(_only(images, "utsns"), _UTSNS_MAGIC)
    return str(kind.FromString(body).nodename)
