"""Name resolution under the domain: real lookups, the pure nsswitch.conf plan, and ``ensure`` through seams.

Nothing here changes /etc: ``ensure`` is run against a temporary nsswitch.conf, a resolver that
reads it, and a recorded ``apt-get``.
"""

from __future__ import annotations

import os
import re
import socket
import stat
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from reference_server._nameres import (
    CannotFix,
    NameLookup,
    NameResolutionError,
    NoChange,
    Rewrite,
    check,
    ensure,
    fix_plan,
    lookup,
    probe_names,
)

DEBIAN_DEFAULT = """\
# /etc/nsswitch.conf
#
# Example configuration of GNU Name Service Switch functionality.
# If you have the `glibc-doc-reference' and `info' packages installed, try:
# `info libc "Name Service Switch"' for information about this file.

passwd:         files systemd
group:          files systemd
shadow:         files systemd
gshadow:        files systemd

hosts:          files dns
networks:       files

protocols:      db files
services:       db files
ethers:         db files
rpc:            db files

netgroup:       nis
"""


def rewritten(plan: object) -> str:
    assert isinstance(plan, Rewrite), plan
    return plan.text


# --- the plan -----------------------------------------------------------------------------------


def test_debian_default_gets_myhostname_after_files_and_nothing_else_changes() -> None:
    plan = fix_plan("e2b.localhost", DEBIAN_DEFAULT)
    assert rewritten(plan) == DEBIAN_DEFAULT.replace(
        "hosts:          files dns\n", "hosts:          files myhostname dns\n"
    )
    assert isinstance(plan, Rewrite)
    assert "'hosts:          files dns' -> 'hosts:          files myhostname dns'" in plan.summary


@pytest.mark.parametrize(
    ("before", "after"),
    [
        # white space kept exactly, tabs included
        ("hosts:\tfiles\tdns\n", "hosts:\tfiles myhostname\tdns\n"),
        ("   hosts  :  files dns  \n", "   hosts  :  files myhostname dns  \n"),
        ("hosts files dns\n", "hosts files myhostname dns\n"),  # glibc does not need the colon
        ("hosts:files\n", "hosts:files myhostname\n"),
        # action groups stay where they are
        (
            "hosts: files mdns4_minimal [NOTFOUND=return] dns\n",
            "hosts: files myhostname mdns4_minimal [NOTFOUND=return] dns\n",
        ),
        ("hosts: files [NOTFOUND=return] dns\n", "hosts: files myhostname [NOTFOUND=return] dns\n"),
        ("hosts: files[!UNAVAIL=return] dns\n", "hosts: files myhostname[!UNAVAIL=return] dns\n"),
        ("hosts: dns [ NOTFOUND = return ] files\n", "hosts: dns [ NOTFOUND = return ] files myhostname\n"),
        # comments: kept, and a word in them is not a service
        ("hosts: files dns # local names\n", "hosts: files myhostname dns # local names\n"),
        ("hosts: files dns # myhostname later\n", "hosts: files myhostname dns # myhostname later\n"),
        ("hosts: dns#files\n", "hosts: myhostname dns#files\n"),
        # no files: myhostname goes first
        ("hosts: dns\n", "hosts: myhostname dns\n"),
        ("hosts: resolve [!UNAVAIL=return] dns\n", "hosts: myhostname resolve [!UNAVAIL=return] dns\n"),
        # no services at all
        ("hosts:\n", "hosts: myhostname\n"),
        ("hosts:   \n", "hosts:   myhostname\n"),
        ("hosts:#none\n", "hosts: myhostname #none\n"),
        ("hosts\n", "hosts myhostname\n"),
        ("hosts: [NOTFOUND=return] files\n", "hosts: myhostname [NOTFOUND=return] files\n"),
        # line endings
        ("hosts: files dns\r\n", "hosts: files myhostname dns\r\n"),
        ("passwd: files\nhosts: files dns", "passwd: files\nhosts: files myhostname dns\n"),
        # a service whose name only contains "files" is not files
        ("hosts: altfiles dns\n", "hosts: myhostname altfiles dns\n"),
    ],
)
def test_hosts_line_variants(before: str, after: str) -> None:
    assert rewritten(fix_plan("e2b.localhost", before)) == after


def test_every_hosts_line_is_changed_because_glibc_versions_differ_on_which_counts() -> None:
    text = "hosts: files\npasswd: files\nhosts: files dns\n"
    assert rewritten(fix_plan("e2b.localhost", text)) == (
        "hosts: files myhostname\npasswd: files\nhosts: files myhostname dns\n"
    )


def test_lines_are_split_at_newlines_only() -> None:
    # \f and \v are line breaks to str.splitlines but not to glibc; the comment must stay one line.
    text = "# a\fb\vc\x1cd\nhosts: files\n"
    assert rewritten(fix_plan("e2b.localhost", text)) == "# a\fb\vc\x1cd\nhosts: files myhostname\n"


@pytest.mark.parametrize(
    "text",
    [
        "hosts: files myhostname dns\n",
        "hosts: files mdns4_minimal [NOTFOUND=return] dns myhostname\n",
        "hosts: myhostname\n",
        "hosts: files myhostname\nhosts: myhostname dns\n",
    ],
)
def test_no_change_when_myhostname_is_there(text: str) -> None:
    assert isinstance(fix_plan("e2b.localhost", text), NoChange)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "passwd: files\n",
        "passwd: files",
        "# hosts: files myhostname\n",
        "Hosts: files\n",  # glibc compares database names case-sensitively
        "hostsx: files\n",
        "  #hosts: files\n",
    ],
)
def test_a_missing_hosts_line_is_added(text: str) -> None:
    plan = fix_plan("e2b.localhost", text)
    assert isinstance(plan, Rewrite)
    expected_prefix = text if not text or text.endswith("\n") else text + "\n"
    assert plan.text == expected_prefix + "hosts:          files myhostname dns\n"
    assert "no hosts line" in plan.summary


@pytest.mark.parametrize("domain", ["e2b.localhost", "a.b.localhost", "localhost", "e2b.localhost:8443"])
def test_domains_under_localhost_are_fixable(domain: str) -> None:
    assert isinstance(fix_plan(domain, "hosts: files\n"), Rewrite)


@pytest.mark.parametrize("domain", ["example.com", "e2b.test", "localhost.example.com", "notlocalhost"])
def test_other_domains_need_wildcard_dns(domain: str) -> None:
    plan = fix_plan(domain, "hosts: files\n")
    assert isinstance(plan, CannotFix)
    assert f"*.{domain}" in plan.explanation
    assert "wildcard DNS" in plan.explanation
    assert f"address=/{domain}/127.0.0.1" in plan.explanation


def test_invalid_domains_are_refused() -> None:
    with pytest.raises(ValueError, match="DNS label"):
        fix_plan("bad_domain.localhost", "")
    with pytest.raises(ValueError, match="DNS label"):
        check("bad_domain.localhost")


# --- checking with the real resolver ------------------------------------------------------------


def test_localhost_resolves_to_loopback() -> None:
    found = lookup("localhost")
    assert found.ok, found
    assert found.addresses
    assert found.error is None


def test_an_invalid_name_does_not_resolve() -> None:
    found = lookup("e2b-compat-test.invalid")  # RFC 6761: .invalid never resolves
    assert not found.ok
    assert found.addresses == ()
    assert found.error
    assert "does not resolve" in found.describe()
    result = check("e2b.invalid")
    assert not result.ok
    assert [lookup.name.split(".", 1)[1] for lookup in result.lookups] == ["e2b.invalid", "e2b.invalid"]


def test_probe_names_are_api_and_a_fresh_random_sandbox_port() -> None:
    api, sandbox = probe_names("e2b.localhost:8443")
    assert api == "api.e2b.localhost"
    assert re.fullmatch(r"49983-[a-z0-9]{20}\.e2b\.localhost", sandbox)
    assert probe_names("e2b.localhost")[1] != sandbox


# --- checking with a resolver that answers as told ----------------------------------------------


def resolver(answers: dict[str, list[str]]) -> Any:
    def resolve(name: str, port: int, **_: Any) -> list[tuple[Any, ...]]:
        suffix = name.split(".", 1)[1] if name.startswith("49983-") else name
        key = "sandbox" if name.startswith("49983-") else name
        addresses = answers.get(key, answers.get(suffix))
        if addresses is None:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [
            (socket.AF_INET6 if ":" in a else socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, port)) for a in addresses
        ]

    return resolve


@pytest.mark.parametrize(
    ("addresses", "ok"),
    [
        (["127.0.0.1", "::1"], True),
        (["127.1.2.3"], True),
        (["::ffff:127.0.0.1"], True),
        (["fe80::1%lo"], False),
        (["127.0.0.1", "10.0.0.7"], False),
        (["192.168.1.1"], False),
        ([], False),
    ],
)
def test_ok_only_when_every_address_is_loopback(addresses: list[str], ok: bool) -> None:
    result = check("e2b.localhost", resolve=resolver({"api.e2b.localhost": addresses, "sandbox": addresses}))
    assert result.ok is ok
    assert all(lookup.addresses == tuple(dict.fromkeys(addresses)) for lookup in result.lookups)


def test_a_missing_wildcard_is_noticed_even_when_api_resolves() -> None:
    result = check("e2b.example", resolve=resolver({"api.e2b.example": ["127.0.0.1"]}))
    assert not result.ok
    assert result.lookups[0].ok
    assert not result.lookups[1].ok
    assert "does not resolve" in result.describe()


def test_describe_names_the_addresses_that_are_not_loopback() -> None:
    found = NameLookup("api.x.localhost", ("127.0.0.1", "10.0.0.7"))
    assert found.describe() == "api.x.localhost resolves to 127.0.0.1, 10.0.0.7, and 10.0.0.7 is not loopback"


# --- ensure -------------------------------------------------------------------------------------


class FakeHost:
    """A resolver that resolves *.localhost once myhostname is on the hosts line and the package is in."""

    def __init__(self, nsswitch: Path, *, installed: bool = False, apt_has_list: bool = True) -> None:
        self.nsswitch = nsswitch
        self.installed = installed
        self.apt_has_list = apt_has_list
        self.commands: list[list[str]] = []
        self.envs: list[dict[str, str] | None] = []
        self.fail_install_with: str | None = None

    def resolve(self, name: str, port: int, **_: Any) -> list[tuple[Any, ...]]:
        text = self.nsswitch.read_text() if self.nsswitch.exists() else ""
        on_line = any(line.startswith("hosts:") and "myhostname" in line for line in text.splitlines())
        if self.installed and on_line and name.endswith(".localhost"):
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port))]
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    def run(self, command: Sequence[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        self.commands.append(list(command))
        self.envs.append(kwargs.get("env"))
        if command[0] == "dpkg-query":
            return subprocess.CompletedProcess(
                command, 0 if self.installed else 1, "installed" if self.installed else "", ""
            )
        if command[:2] == ["apt-get", "update"]:
            self.apt_has_list = True
            return subprocess.CompletedProcess(command, 0, "", "")
        if command[:2] == ["apt-get", "install"]:
            if self.fail_install_with is not None:
                return subprocess.CompletedProcess(command, 100, "", self.fail_install_with)
            if not self.apt_has_list:
                return subprocess.CompletedProcess(command, 100, "", "E: Unable to locate package libnss-myhostname\n")
            self.installed = True
            return subprocess.CompletedProcess(command, 0, "", "")
        raise AssertionError(f"unexpected command {command}")


@pytest.fixture
def root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 0)


INSTALL = ["apt-get", "install", "-y", "--no-install-recommends", "libnss-myhostname"]


def test_ensure_installs_the_package_and_edits_nsswitch(tmp_path: Path, root: None) -> None:
    nsswitch = tmp_path / "nsswitch.conf"
    nsswitch.write_text(DEBIAN_DEFAULT)
    nsswitch.chmod(0o640)
    host = FakeHost(nsswitch, apt_has_list=False)
    said: list[str] = []
    result = ensure("e2b.localhost", apply=True, say=said.append, nsswitch=nsswitch, resolve=host.resolve, run=host.run)
    assert result.ok
    # No package list yet: install fails, the lists are fetched once, install again.
    assert host.commands[1:] == [INSTALL, ["apt-get", "update"], INSTALL]
    assert host.commands[0][0] == "dpkg-query"
    assert all(env is not None and env["DEBIAN_FRONTEND"] == "noninteractive" for env in host.envs[1:])
    assert nsswitch.read_text() == DEBIAN_DEFAULT.replace("files dns\n", "files myhostname dns\n")
    assert stat.S_IMODE(nsswitch.stat().st_mode) == 0o640
    assert nsswitch.stat().st_uid == os.getuid()
    assert any("apt-get install -y --no-install-recommends libnss-myhostname" in line for line in said)
    assert any(str(nsswitch) in line and "myhostname" in line for line in said)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["nsswitch.conf"]  # no temporary left


def test_ensure_skips_what_is_already_done(tmp_path: Path, root: None) -> None:
    nsswitch = tmp_path / "nsswitch.conf"
    nsswitch.write_text("hosts: files dns\n")
    host = FakeHost(nsswitch, installed=True)
    ensure("e2b.localhost", apply=True, say=lambda _: None, nsswitch=nsswitch, resolve=host.resolve, run=host.run)
    assert [command[0] for command in host.commands] == ["dpkg-query"]  # installed: no apt-get
    said: list[str] = []
    result = ensure("e2b.localhost", apply=True, say=said.append, nsswitch=nsswitch, resolve=host.resolve, run=host.run)
    assert result.ok
    assert said == []  # already resolving: nothing to do, nothing said
    assert len(host.commands) == 1


def test_ensure_keeps_a_symlinked_nsswitch(tmp_path: Path, root: None) -> None:
    real = tmp_path / "real.conf"
    real.write_text("hosts: files dns\n")
    link = tmp_path / "nsswitch.conf"
    link.symlink_to(real)
    host = FakeHost(link, installed=True)
    ensure("e2b.localhost", apply=True, say=lambda _: None, nsswitch=link, resolve=host.resolve, run=host.run)
    assert link.is_symlink()
    assert real.read_text() == "hosts: files myhostname dns\n"


def test_ensure_without_apply_explains_and_changes_nothing(tmp_path: Path) -> None:
    nsswitch = tmp_path / "nsswitch.conf"
    nsswitch.write_text("hosts: files dns\n")
    host = FakeHost(nsswitch)
    with pytest.raises(NameResolutionError, match=r"does not resolve.*apt-get install libnss-myhostname"):
        ensure("e2b.localhost", apply=False, say=lambda _: None, nsswitch=nsswitch, resolve=host.resolve, run=host.run)
    assert host.commands == []
    assert nsswitch.read_text() == "hosts: files dns\n"


def test_ensure_needs_root_to_apply(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    nsswitch = tmp_path / "nsswitch.conf"
    nsswitch.write_text("hosts: files dns\n")
    host = FakeHost(nsswitch)
    with pytest.raises(NameResolutionError, match="needs root"):
        ensure("e2b.localhost", apply=True, say=lambda _: None, nsswitch=nsswitch, resolve=host.resolve, run=host.run)
    assert host.commands == []


def test_ensure_explains_wildcard_dns_for_other_domains(tmp_path: Path, root: None) -> None:
    nsswitch = tmp_path / "nsswitch.conf"
    nsswitch.write_text("hosts: files dns\n")
    host = FakeHost(nsswitch)
    with pytest.raises(NameResolutionError, match=r"\*\.e2b\.example.*wildcard|wildcard.*\*\.e2b\.example"):
        ensure("e2b.example", apply=True, say=lambda _: None, nsswitch=nsswitch, resolve=host.resolve, run=host.run)
    assert host.commands == []
    assert nsswitch.read_text() == "hosts: files dns\n"


def test_ensure_reports_a_failed_install_without_retrying_other_errors(tmp_path: Path, root: None) -> None:
    nsswitch = tmp_path / "nsswitch.conf"
    nsswitch.write_text("hosts: files dns\n")
    host = FakeHost(nsswitch)
    host.fail_install_with = "E: Could not get lock /var/lib/dpkg/lock-frontend\n"
    with pytest.raises(NameResolutionError, match="installing libnss-myhostname failed: E: Could not get lock"):
        ensure("e2b.localhost", apply=True, say=lambda _: None, nsswitch=nsswitch, resolve=host.resolve, run=host.run)
    assert ["apt-get", "update"] not in host.commands
    assert nsswitch.read_text() == "hosts: files dns\n"


def test_ensure_raises_when_the_fix_did_not_help(tmp_path: Path, root: None) -> None:
    nsswitch = tmp_path / "nsswitch.conf"
    nsswitch.write_text("hosts: files dns\n")
    host = FakeHost(nsswitch, installed=True)

    def never(name: str, port: int, **_: Any) -> list[tuple[Any, ...]]:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    with pytest.raises(NameResolutionError, match="even with libnss-myhostname installed"):
        ensure("e2b.localhost", apply=True, say=lambda _: None, nsswitch=nsswitch, resolve=never, run=host.run)
    assert nsswitch.read_text() == "hosts: files myhostname dns\n"


def test_ensure_explains_a_system_without_dpkg(tmp_path: Path, root: None) -> None:
    nsswitch = tmp_path / "nsswitch.conf"
    nsswitch.write_text("hosts: files dns\n")

    def no_dpkg(command: Sequence[str], **_: Any) -> subprocess.CompletedProcess[str]:
        raise FileNotFoundError(command[0])

    with pytest.raises(NameResolutionError, match="not a Debian-based system"):
        ensure(
            "e2b.localhost",
            apply=True,
            say=lambda _: None,
            nsswitch=nsswitch,
            resolve=FakeHost(nsswitch).resolve,
            run=no_dpkg,
        )
