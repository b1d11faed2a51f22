"""Users and groups, read straight from the sandbox's ``/etc/passwd`` and ``/etc/group`` (no NSS)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class User:
    name: str
    uid: int
    gid: int
    home: str
    groups: tuple[int, ...]  # supplementary groups, primary included


class UnknownUserError(LookupError):
    """No such user in the passwd file."""


class UserDatabase:
    """Lookups against passwd/group files, re-read when they change (users may be added at run time)."""

    def __init__(self, passwd: Path = Path("/etc/passwd"), group: Path = Path("/etc/group")) -> None:
        self._passwd = passwd
        self._group = group
        self._stamp: tuple[float, float] | None = None
        self._users: dict[str, User] = {}
        self._uid_names: dict[int, str] = {}
        self._gid_names: dict[int, str] = {}

    def _mtime(self, path: Path) -> float:
        try:
            return path.stat().st_mtime
        except OSError:
            return -1.0

    def _load(self) -> None:
        stamp = (self._mtime(self._passwd), self._mtime(self._group))
        if stamp == self._stamp:
            return
        members: dict[str, set[int]] = {}
        gid_names: dict[int, str] = {}
        for fields in _records(self._group, 4):
            try:
                gid = int(fields[2])
            except ValueError:
                continue
            gid_names.setdefault(gid, fields[0])
            for member in filter(None, fields[3].split(",")):
                members.setdefault(member, set()).add(gid)
        users: dict[str, User] = {}
        uid_names: dict[int, str] = {}
        for fields in _records(self._passwd, 7):
            try:
                uid, gid = int(fields[2]), int(fields[3])
            except ValueError:
                continue
            name = fields[0]
            groups = tuple(sorted({gid} | members.get(name, set())))
            users.setdefault(name, User(name, uid, gid, fields[5], groups))
            uid_names.setdefault(uid, name)
        self._users, self._uid_names, self._gid_names, self._stamp = users, uid_names, gid_names, stamp

    def lookup(self, name: str) -> User:
        self._load()
        try:
            return self._users[name]
        except KeyError:
            raise UnknownUserError(name) from None

    def user_name(self, uid: int) -> str:
        self._load()
        return self._uid_names.get(uid, str(uid))

    def group_name(self, gid: int) -> str:
        self._load()
        return self._gid_names.get(gid, str(gid))


def _records(path: Path, width: int) -> list[list[str]]:
    try:
        text = path.read_text(encoding="utf-8", errors="surrogateescape")
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        fields = line.split(":")
        if len(fields) >= width:
            out.append(fields)
    return out
