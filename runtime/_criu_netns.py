"""Whether a checkpoint's network namespace is as new, so that its restore may make it empty.

CRIU restores a network namespace by replaying what it saved: the devices and the namespace's
sysctls, ``ip``'s dumps of addresses, routes and rules, the iptables and nftables rule sets. It
spawns ``ip`` and ``iptables`` several times for it, about 20-25 ms of each restore here. The
veth pair is unplugged before every checkpoint (``runtime._oci_backend``), so the namespace of
a sandbox whose tenant changed nothing in it holds its loopback only, which a new namespace and
the plug give as well: such a checkpoint is restored with CRIU's ``empty-ns net``.

"As new" is decided by comparing the checkpoint's network images with those of a namespace known
to be new (a boot image's, ``runtime._boot_images``), after blanking what differs between two
namespaces that are alike:

- in each netlink message of ``ip``'s dumps (``ifaddr``, ``route``, ``route6``, ``rule``: a
  4-byte magic, then the messages), the sequence number and port id of the header, which say
  which socket dumped it;
- in an address's ``IFA_CACHEINFO``, its creation and update times.

The network images are those named after the namespace's image id (``netns-<id>.img`` and every
``*-<id>.img`` beside it). Anything else that differs, an image one side has and the other
lacks, or one that cannot be read as expected, means the namespace is not as new: the restore
replays it, as it always did.
"""

from __future__ import annotations

import re
import struct
from pathlib import Path

__all__ = ["AS_NEW_MARK", "network_images", "same_as_new"]

AS_NEW_MARK = ".netns-as-new"  # in a checkpoint's folder: its network namespace compared equal to a new one

_NETNS_IMAGE = re.compile(r"netns-([0-9]+)\.img")
_IP_DUMPS = frozenset({"ifaddr", "route", "route6", "rule"})
_NLMSG = struct.Struct("<IHHII")  # length, type, flags, sequence number, port id
_RTATTR = struct.Struct("<HH")  # length, type
_RTM_NEWADDR = 20
_IFADDRMSG_SIZE = 8
_IFA_CACHEINFO = 6
_CACHEINFO_TIMES = slice(8, 16)  # ifa_cacheinfo: preferred, valid, then cstamp and tstamp


class _UnreadableError(Exception):
    """An image is not laid out as expected: no comparison is trusted."""


def network_images(images: Path) -> dict[str, bytes] | None:
    """The checkpoint's network images by kind (``ifaddr``, ``netdev``...), or None when it has no namespace image."""
    found = [m for m in (_NETNS_IMAGE.fullmatch(p.name) for p in images.iterdir()) if m is not None]
    if len(found) != 1:
        return None
    suffix = f"-{found[0].group(1)}.img"
    return {p.name.removesuffix(suffix): p.read_bytes() for p in images.iterdir() if p.name.endswith(suffix)}


def same_as_new(images: Path, new: Path) -> bool:
    """Whether the network namespace in ``images`` is the one in ``new`` (a new namespace's checkpoint)."""
    try:
        ours, reference = network_images(images), network_images(new)
        if ours is None or reference is None or ours.keys() != reference.keys():
            return False
        return all(_normalised(kind, ours[kind]) == _normalised(kind, reference[kind]) for kind in ours)
    except (OSError, _UnreadableError):
        return False


def _normalised(kind: str, data: bytes) -> bytes:
    if kind not in _IP_DUMPS:
        return data
    if len(data) < 4:
        raise _UnreadableError(kind)
    out = bytearray(data)
    offset = 4  # ip's magic
    while offset < len(out):
        if offset + _NLMSG.size > len(out):
            raise _UnreadableError(kind)
        length, kind_of_message, flags, _sequence, _port = _NLMSG.unpack_from(out, offset)
        if length < _NLMSG.size or offset + length > len(out):
            raise _UnreadableError(kind)
        _NLMSG.pack_into(out, offset, length, kind_of_message, flags, 0, 0)
        if kind_of_message == _RTM_NEWADDR:
            _blank_address_times(out, offset + _NLMSG.size + _IFADDRMSG_SIZE, offset + length)
        offset += (length + 3) & ~3
    return bytes(out)


def _blank_address_times(out: bytearray, start: int, end: int) -> None:
    offset = start
    while offset + _RTATTR.size <= end:
        length, attribute = _RTATTR.unpack_from(out, offset)
        if length < _RTATTR.size or offset + length > end:
            raise _UnreadableError("ifaddr")
        if attribute == _IFA_CACHEINFO:
            value = offset + _RTATTR.size
            if length - _RTATTR.size < _CACHEINFO_TIMES.stop:
                raise _UnreadableError("ifaddr")
            out[value + _CACHEINFO_TIMES.start : value + _CACHEINFO_TIMES.stop] = bytes(8)
        offset += (length + 3) & ~3
