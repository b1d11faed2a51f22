"""Name resolution for the configured domain: every name under it must reach this machine's loopback.

The official clients are given ``E2B_DOMAIN=<domain>:<port>`` and glue host names together from
it: ``api.<domain>`` for the control plane and ``<port>-<sandboxID>.<domain>`` for each sandbox
port. They resolve those names through the system resolver, so one name is not enough: the whole
wildcard ``*.<domain>`` has to resolve, and to loopback (the edge listens there).

- ``check`` resolves ``api.<domain>`` and a random sandbox-port name and reports what each gave.
- ``fix_plan`` (pure) says how to fix it. For a domain under ``.localhost`` on Debian, glibc's
  ``myhostname`` NSS module (package ``libnss-myhostname``) resolves ``localhost`` and every
  ``*.localhost`` name to 127.0.0.1 and ::1 once it is on the ``hosts:`` line of
  /etc/nsswitch.conf; the plan is that file's new text, with ``myhostname`` inserted right after
  ``files`` and every other byte kept. ``/etc/hosts`` cannot hold a wildcard, so any other domain
  needs wildcard DNS, which only its operator can set up: the plan then explains what to add.
- ``ensure`` checks, applies the plan when asked to (root), says what it changes, and checks again.

The nsswitch parsing follows glibc: leading white space is skipped, the database name is
case-sensitive and ends at white space or ``:``, a ``#`` starts a comment, services are words,
each optionally followed by an ``[STATUS=action ...]`` group. glibc 2.33 and later take the last
line of a database, earlier versions the first, so every ``hosts`` line is changed.
glibc re-reads nsswitch.conf when it changes, so the running server sees the fix at once.

Exceptions::

    NameResolutionError   the names do not resolve to loopback and were not (or could not be) fixed
"""

from __future__ import annotations

import ipaddress
import os
import re
import secrets
import socket
import stat
import string
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeAlias

from contract.protocol import ENVD_PORT

from ._files import replace_file
from ._routing import parse_domain

__all__ = [
    "NSSWITCH",
    "PACKAGE",
    "CannotFix",
    "FixPlan",
    "NameLookup",
    "NameResolution",
    "NameResolutionError",
    "NoChange",
    "Rewrite",
    "check",
    "ensure",
    "ensure_name_resolution",
    "fix_plan",
    "lookup",
]

NSSWITCH = Path("/etc/nsswitch.conf")
PACKAGE = "libnss-myhostname"
SERVICE = "myhostname"
PROBE_PORT = ENVD_PORT  # the name every sandbox has
_SANDBOX_ID_CHARS = string.ascii_lowercase + string.digits
_SANDBOX_ID_LENGTH = 20
# What Debian's own nsswitch.conf says, with myhostname, for a file that has no hosts line at all.
_NEW_HOSTS_LINE = "hosts:          files myhostname dns\n"
_SPACE = " \t\n\v\f\r"  # C isspace in the C locale: what glibc skips
# A hosts line: leading white space, the name (ended by white space, a colon or the end), then the
# run of white space and colons that glibc skips before the first service.
_HOSTS_HEAD = re.compile(rf"[{_SPACE}]*hosts(?=[{_SPACE}:]|\Z)(?P<separator>[{_SPACE}:]*)")
_SERVICE_NAME = re.compile(rf"[^{_SPACE}\[]+")
_APT_NO_LIST = ("Unable to locate package", "has no installation candidate")

Resolver: TypeAlias = Callable[..., Sequence[tuple[Any, ...]]]
Runner: TypeAlias = Callable[..., "subprocess.CompletedProcess[str]"]


class NameResolutionError(Exception):
    """Names under the domain do not resolve to loopback; the message says what was found and what to do."""


# -- checking -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class NameLookup:
    """What one name resolved to: its addresses (in the resolver's order) or the resolver's error."""

    name: str
    addresses: tuple[str, ...]
    error: str | None = None

    @property
    def ok(self) -> bool:
        return bool(self.addresses) and all(_is_loopback(address) for address in self.addresses)

    def describe(self) -> str:
        if self.error is not None:
            return f"{self.name} does not resolve ({self.error})"
        others = [address for address in self.addresses if not _is_loopback(address)]
        listed = ", ".join(self.addresses)
        if others:
            return f"{self.name} resolves to {listed}, and {', '.join(others)} is not loopback"
        return f"{self.name} resolves to {listed}"


@dataclass(frozen=True)
class NameResolution:
    """The lookups made for one domain; ``ok`` when every one gave loopback addresses only."""

    domain: str
    lookups: tuple[NameLookup, ...]

    @property
    def ok(self) -> bool:
        return all(lookup.ok for lookup in self.lookups)

    def describe(self) -> str:
        return "; ".join(lookup.describe() for lookup in self.lookups)


def _is_loopback(address: str) -> bool:
    try:
        ip = ipaddress.ip_address(address.partition("%")[0])  # an IPv6 scope id is no part of the address
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped.is_loopback
    return ip.is_loopback  # 127.0.0.0/8 and ::1


def lookup(name: str, *, resolve: Resolver = socket.getaddrinfo) -> NameLookup:
    """Resolve ``name`` through the system resolver (getaddrinfo: /etc/hosts, NSS modules, DNS)."""
    try:
        infos = resolve(name, 443, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError) as exc:  # socket.gaierror is an OSError
        return NameLookup(name, (), str(exc) or type(exc).__name__)
    addresses: list[str] = []
    for info in infos:
        address = str(info[4][0])
        if address not in addresses:
            addresses.append(address)
    if not addresses:
        return NameLookup(name, (), "no addresses")
    return NameLookup(name, tuple(addresses))


def probe_names(domain_name: str) -> tuple[str, str]:
    """``api.<name>`` and a sandbox-port name with a fresh random id (a wildcard, not one entry, must answer)."""
    name = _domain_name(domain_name)
    sandbox_id = "".join(secrets.choice(_SANDBOX_ID_CHARS) for _ in range(_SANDBOX_ID_LENGTH))
    return f"api.{name}", f"{PROBE_PORT}-{sandbox_id}.{name}"


def check(domain_name: str, *, resolve: Resolver = socket.getaddrinfo) -> NameResolution:
    """Resolve the control-plane name and a random sandbox name under ``domain_name`` (a ``:port`` is ignored)."""
    name = _domain_name(domain_name)
    return NameResolution(name, tuple(lookup(probe, resolve=resolve) for probe in probe_names(name)))


def _domain_name(domain_name: str) -> str:
    return parse_domain(domain_name).name  # ValueError for anything that is not a domain


def under_localhost(domain_name: str) -> bool:
    name = _domain_name(domain_name)
    return name == "localhost" or name.endswith(".localhost")


# -- the plan (pure) ----------------------------------------------------------------------------


@dataclass(frozen=True)
class NoChange:
    """nsswitch.conf already consults myhostname for host names."""

    reason: str


@dataclass(frozen=True)
class Rewrite:
    """Replace nsswitch.conf with ``text``; ``summary`` says what changes, for the operator."""

    text: str
    summary: str


@dataclass(frozen=True)
class CannotFix:
    """The domain is not under .localhost: only wildcard DNS, set up by the operator, can fix it."""

    explanation: str


FixPlan: TypeAlias = NoChange | Rewrite | CannotFix


def wildcard_dns_advice(name: str) -> str:
    return (
        f"{name} is not under .localhost, so this machine cannot be made to resolve it by itself: "
        f"/etc/hosts has no wildcards, and glibc's myhostname module answers only localhost and *.localhost. "
        f"Add wildcard DNS so that {name} and *.{name} resolve to 127.0.0.1 (and ::1), for example with "
        f"dnsmasq: address=/{name}/127.0.0.1 and address=/{name}/::1; or use a domain under .localhost "
        f"such as e2b.localhost, which e2b-compat can set up itself."
    )


def fix_plan(domain_name: str, nsswitch_text: str) -> FixPlan:
    """How to make every name under ``domain_name`` resolve to loopback, given nsswitch.conf's text."""
    name = _domain_name(domain_name)
    if not under_localhost(name):
        return CannotFix(wildcard_dns_advice(name))
    lines = _split_lines(nsswitch_text)
    changed: list[str] = []
    found = False
    for index, line in enumerate(lines):
        edited = _edit_hosts_line(line, is_last=index == len(lines) - 1)
        if edited is None:
            continue
        found = True
        if edited != line:
            changed.append(f"{line.rstrip()!r} -> {edited.rstrip()!r}")
            lines[index] = edited
    if not found:
        separator = "" if not nsswitch_text or nsswitch_text.endswith("\n") else "\n"
        return Rewrite(
            nsswitch_text + separator + _NEW_HOSTS_LINE,
            f"add the line {_NEW_HOSTS_LINE.strip()!r} (there was no hosts line, so glibc used its built-in "
            "'dns [!UNAVAIL=return] files', which never consults myhostname)",
        )
    if not changed:
        return NoChange(f"the hosts line of nsswitch.conf already has {SERVICE}")
    return Rewrite("".join(lines), "change " + "; ".join(changed))


def _split_lines(text: str) -> list[str]:
    """Lines with their newlines, split at \\n only (``str.splitlines`` would also split at \\f, \\v, …)."""
    parts = text.split("\n")
    return [part + "\n" for part in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


def _services(content: str, start: int) -> list[tuple[str, int, int]]:
    """(name, start, end) of each service from ``start``, read as glibc reads them; action groups skipped."""
    found: list[tuple[str, int, int]] = []
    at = start
    while True:
        at = _skip_space(content, at)
        word = _SERVICE_NAME.match(content, at)
        if word is None:  # the end, or an action group with no service before it: glibc stops here too
            return found
        found.append((word.group(), word.start(), word.end()))
        at = _skip_space(content, word.end())
        if content.startswith("[", at):
            close = content.find("]", at)
            if close < 0:
                return found
            at = close + 1


def _skip_space(content: str, at: int) -> int:
    while at < len(content) and content[at] in _SPACE:
        at += 1
    return at


def _edit_hosts_line(line: str, *, is_last: bool) -> str | None:
    """``line`` with myhostname inserted if it is a hosts line without it; None if it is no hosts line."""
    body = line.rstrip("\r\n")
    ending = line[len(body) :]
    content, hash_mark, comment = body.partition("#")
    head = _HOSTS_HEAD.match(content)
    # glibc needs something after the name: white space, a colon, or at least the line's newline.
    if head is None or not (head.group("separator") or ending):
        return None
    services = _services(content, head.end())
    if any(service == SERVICE for service, _, _ in services):
        return line
    files = next((end for service, _, end in services if service == "files"), None)
    if files is not None:
        at, insert = files, f" {SERVICE}"
    elif services:
        at, insert = services[0][1], f"{SERVICE} "  # no files: myhostname first, before anything that might return
    else:
        at = head.end()
        separator = head.group("separator")
        insert = SERVICE if separator and separator[-1] in _SPACE else f" {SERVICE}"
        following = content[at : at + 1] or hash_mark
        if following and following not in _SPACE:
            insert += " "  # keep what follows (an action group, a comment) apart from the name
    new_content = content[:at] + insert + content[at:]
    # Some glibc versions drop a last line that has no newline; the line being fixed must count.
    if is_last and not ending:
        ending = "\n"
    return new_content + hash_mark + comment + ending


# -- applying -----------------------------------------------------------------------------------


def ensure(
    domain_name: str,
    *,
    apply: bool,
    say: Callable[[str], None],
    nsswitch: Path = NSSWITCH,
    resolve: Resolver = socket.getaddrinfo,
    run: Runner = subprocess.run,
) -> NameResolution:
    """Names under ``domain_name`` resolve to loopback, fixing the host first when ``apply`` (needs root).

    Raises ``NameResolutionError`` with what was found and what to do when they still do not.
    ``nsswitch``, ``resolve`` and ``run`` are seams for tests; the server keeps the defaults.
    """
    name = _domain_name(domain_name)
    result = check(name, resolve=resolve)
    if result.ok:
        return result
    if not under_localhost(name):
        raise NameResolutionError(f"{result.describe()}. {wildcard_dns_advice(name)}")
    if not apply:
        raise NameResolutionError(
            f"{result.describe()}. To fix it as root: apt-get install {PACKAGE}, then put {SERVICE} right "
            f"after files on the hosts: line of {nsswitch} (e2b-compat does both when allowed to change the host)."
        )
    if os.geteuid() != 0:
        raise NameResolutionError(f"{result.describe()}. Fixing it needs root (installs {PACKAGE}, edits {nsswitch}).")
    _install_package(say, run)
    text = nsswitch.read_text(encoding="utf-8", errors="surrogateescape") if nsswitch.exists() else ""
    plan = fix_plan(name, text)
    if isinstance(plan, Rewrite):
        say(f"editing {nsswitch} so that glibc's {SERVICE} module resolves *.localhost to loopback: {plan.summary}")
        _replace_keeping_owner(nsswitch, plan.text.encode("utf-8", "surrogateescape"))
    result = check(name, resolve=resolve)
    if not result.ok:
        raise NameResolutionError(
            f"{result.describe()}, even with {PACKAGE} installed and {SERVICE} on the hosts line of {nsswitch}. "
            f"Check that no service before {SERVICE} on that line answers or returns for *.localhost names "
            "(an action such as [NOTFOUND=return] stops the lookup), and that nscd is not caching the old answer."
        )
    say(f"{name} and *.{name} now resolve to loopback")
    return result


def ensure_name_resolution(domain_name: str, say: Callable[[str], None]) -> NameResolution:
    """``ensure`` with the host fixed when running as root: what ``serve`` and ``host prepare`` do."""
    return ensure(domain_name, apply=os.geteuid() == 0, say=say)


def _install_package(say: Callable[[str], None], run: Runner) -> None:
    try:
        status = run(
            ["dpkg-query", "--show", "--showformat=${db:Status-Status}", PACKAGE],
            capture_output=True,
            text=True,
            check=False,
        )
    except FileNotFoundError:
        raise NameResolutionError(
            f"this is not a Debian-based system (no dpkg-query); install glibc's nss-myhostname module "
            f"by hand and put {SERVICE} after files on the hosts: line of /etc/nsswitch.conf"
        ) from None
    if status.returncode == 0 and status.stdout.strip() == "installed":
        return
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "--no-install-recommends", PACKAGE]
    say(f"installing the Debian package {PACKAGE} ({' '.join(install)})")
    done = run(install, capture_output=True, text=True, check=False, env=env)
    if done.returncode != 0 and any(marker in done.stderr for marker in _APT_NO_LIST):
        # A fresh machine (or container) often has no package lists yet: fetch them once and retry.
        say(f"apt-get has no package list with {PACKAGE}: running apt-get update, then installing again")
        update = run(["apt-get", "update"], capture_output=True, text=True, check=False, env=env)
        if update.returncode != 0:
            raise NameResolutionError(f"apt-get update failed: {_tail(update.stderr)}")
        done = run(install, capture_output=True, text=True, check=False, env=env)
    if done.returncode != 0:
        raise NameResolutionError(f"installing {PACKAGE} failed: {_tail(done.stderr)}")


def _tail(text: str, lines: int = 5) -> str:
    return " | ".join(text.strip().splitlines()[-lines:]) or "(no output)"


def _replace_keeping_owner(path: Path, data: bytes) -> None:
    """Replace ``path`` atomically with ``data``, keeping its mode and owner (0644 root for a new file).

    A symlink (some systems link nsswitch.conf elsewhere) is kept: its target is replaced.
    """
    target = Path(os.path.realpath(path))
    try:
        info = os.stat(target)
        mode, uid, gid = stat.S_IMODE(info.st_mode), info.st_uid, info.st_gid
    except FileNotFoundError:
        mode, uid, gid = 0o644, 0, 0
    replace_file(target, data, mode=mode, owner=(uid, gid))
