"""The agent's pure rules, one function at a time (no agent process)."""

from __future__ import annotations

import base64
import os
import shutil
import signal
import stat
import tempfile
import threading
from pathlib import Path

import pytest

from runtime.agent import _credentials
from runtime.agent._credentials import run_as
from runtime.agent._errors import AgentError, ErrorKind
from runtime.agent._files import _content_disposition, accepts_identity, choose_encoding, parse_metadata, signature
from runtime.agent._filesystem import make_dir, permissions, wire_text
from runtime.agent._paths import PathError, ensure_parents, resolve
from runtime.agent._processes import build_env, describe_exit
from runtime.agent._state import INTERNAL_NAMES, AgentState, UserError, basic_user, internal_env
from runtime.agent._users import User, UserDatabase

USER = User("user", 1000, 1000, "/home/user", (1000,))


@pytest.mark.parametrize(
    ("raw", "workdir", "expected"),
    [
        ("", None, "/home/user"),
        ("", "/work", "/work"),
        ("a.txt", "/work", "/home/user/a.txt"),  # relative paths use the home, not the workdir
        ("a/../b/./c", None, "/home/user/b/c"),
        ("~", None, "/home/user"),
        ("~/x/../y", None, "/home/user/y"),
        ("/abs/../kept", None, "/abs/../kept"),  # absolute paths are used as given
    ],
)
def test_resolve(raw: str, workdir: str | None, expected: str) -> None:
    assert resolve(raw, USER, workdir) == expected


def test_resolve_refuses_other_users_home() -> None:
    with pytest.raises(PathError, match="cannot expand user-specific home dir"):
        resolve("~root/x", USER, None)


def test_ensure_parents(tmp_path: Path) -> None:
    ensure_parents(str(tmp_path / "a" / "b" / "c.txt"))
    assert (tmp_path / "a" / "b").is_dir()
    (tmp_path / "file").write_text("")
    with pytest.raises(NotADirectoryError, match="path is a file"):
        ensure_parents(str(tmp_path / "file" / "x" / "y"))


def test_make_dir_below_a_file_names_the_file(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(AgentError) as raised:
        make_dir(str(tmp_path / "file" / "sub"), UserDatabase())
    assert raised.value.kind is ErrorKind.INTERNAL
    assert str(raised.value) == f"path is a file: {tmp_path / 'file'}"


@pytest.mark.parametrize(
    ("header", "user"),
    [
        ("Basic " + base64.b64encode(b"user:").decode(), "user"),
        ("basic " + base64.b64encode(b"root:ignored").decode(), "root"),
        ("Basic !!!", None),
        ("Bearer abc", None),
        ("Basic " + base64.b64encode(b"no-colon").decode(), None),
        (None, None),
    ],
)
def test_basic_user(header: str | None, user: str | None) -> None:
    assert basic_user(header) == user


def test_state_users_and_token(tmp_path: Path) -> None:
    passwd = tmp_path / "passwd"
    passwd.write_text("root:x:0:0:root:/root:/bin/bash\nuser:x:1000:1000::/home/user:/bin/bash\n")
    group = tmp_path / "group"
    group.write_text("root:x:0:\nuser:x:1000:\nwheel:x:10:user\n")
    state = AgentState(users=UserDatabase(passwd, group))
    assert state.user_by_name("user").groups == (10, 1000)
    state.default_user = "ghost"
    with pytest.raises(UserError, match="invalid default user: 'ghost'"):
        state.user_from_basic(None)
    assert state.token_matches(None)
    state.access_token = "t"
    assert state.token_matches("t")
    assert not state.token_matches("u")
    assert not state.token_matches(None)
    state.env_vars = {"E2B_SANDBOX": "no", "A": "1"}
    assert state.global_env()["E2B_SANDBOX"] == "true"
    assert state.global_env()["A"] == "1"


def test_the_runtime_gives_the_sandbox_and_template_ids_to_every_process() -> None:
    """As envd's do, the sandbox's processes see E2B_SANDBOX_ID and E2B_TEMPLATE_ID (not settable by /init)."""
    environ = {"E2B_SANDBOX_ID": "sb1", "E2B_TEMPLATE_ID": "base", "E2B_SANDBOX": "x", "OTHER": "y"}
    assert internal_env(environ) == {"E2B_SANDBOX": "true", "E2B_SANDBOX_ID": "sb1", "E2B_TEMPLATE_ID": "base"}
    assert internal_env({}) == {"E2B_SANDBOX": "true"}  # a bare agent (debug mode) has no ids
    state = AgentState(internal=internal_env(environ))
    state.env_vars = {"E2B_SANDBOX_ID": "forged"}
    assert state.global_env()["E2B_SANDBOX_ID"] == "sb1"
    assert {"E2B_SANDBOX_ID", "E2B_TEMPLATE_ID", "E2B_SANDBOX"} <= INTERNAL_NAMES


@pytest.mark.parametrize(
    ("accept", "chosen"),
    [
        (None, "identity"),
        ("gzip, deflate", "gzip"),
        ("identity", "identity"),
        ("br", "identity"),
        ("*", "identity"),
        ("identity;q=0, *", "gzip"),
        ("identity;q=0", None),
        ("*;q=0", None),
        ("gzip;q=0.5, identity;q=0.9", "identity"),
    ],
)
def test_choose_encoding(accept: str | None, chosen: str | None) -> None:
    assert choose_encoding(accept) == chosen


@pytest.mark.parametrize(
    ("accept", "acceptable"),
    [
        (None, True),
        ("", True),
        ("gzip, deflate", True),
        ("gzip;q=1, identity;q=0.1", True),
        ("identity;q=0, gzip", False),
        ("IDENTITY;Q=0, gzip", False),
        ("*;q=0, gzip", False),
        ("*;q=0, identity;q=0.5, gzip", True),
        ("gzip, identity;q=bad", False),  # a q that does not parse counts as 0, as in choose_encoding
    ],
)
def test_accepts_identity(accept: str | None, acceptable: bool) -> None:
    """Whether a gzip-accepting client may still be answered with the plain body (RFC 9110 12.5.3)."""
    assert accepts_identity(accept) is acceptable


def test_signature_format() -> None:
    sig = signature("/home/user/a.txt", "read", "user", "token", 1700000000)
    assert sig.startswith("v1_")
    assert "=" not in sig
    assert sig != signature("/home/user/a.txt", "write", "user", "token", 1700000000)
    assert sig != signature("/home/user/a.txt", "read", "user", "token", None)


def test_metadata_headers() -> None:
    headers = [
        (b"X-Metadata-Owner", b"team"),
        (b"x-metadata-owner", b"second"),
        (b"x-metadata-", b"empty"),
        (b"content-type", b"x"),
    ]
    assert parse_metadata(headers) == {"owner": "team"}
    with pytest.raises(AgentError, match="printable ASCII") as refused:
        parse_metadata([(b"x-metadata-k", "é".encode("latin-1"))])
    assert refused.value.kind is ErrorKind.INVALID_ARGUMENT
    with pytest.raises(AgentError, match="longer than 246"):
        parse_metadata([(b"x-metadata-" + b"k" * 247, b"v")])
    with pytest.raises(AgentError, match="total size"):
        parse_metadata([(f"x-metadata-k{i}".encode(), b"v" * 200) for i in range(30)])


@pytest.mark.parametrize(
    ("name", "header"),
    [
        ("a.txt", "inline; filename=a.txt"),
        ("a b.txt", 'inline; filename="a b.txt"'),
        ("é.txt", "inline; filename*=utf-8''%C3%A9.txt"),
    ],
)
def test_content_disposition(name: str, header: str) -> None:
    assert _content_disposition(name) == header


@pytest.mark.parametrize(
    ("mode", "text"),
    [
        (stat.S_IFREG | 0o644, "-rw-r--r--"),
        (stat.S_IFDIR | 0o755, "drwxr-xr-x"),
        (stat.S_IFLNK | 0o777, "Lrwxrwxrwx"),
        (stat.S_IFDIR | stat.S_ISVTX | 0o777, "dtrwxrwxrwx"),
        (stat.S_IFREG | stat.S_ISUID | 0o755, "urwxr-xr-x"),
        (stat.S_IFCHR | 0o666, "Dcrw-rw-rw-"),
        (stat.S_IFIFO | 0o644, "prw-r--r--"),
    ],
)
def test_permissions(mode: int, text: str) -> None:
    assert permissions(mode) == text


def test_wire_text() -> None:
    assert wire_text("plain") == "plain"
    assert wire_text(b"\xff.txt".decode("utf-8", "surrogateescape")) == "\ufffd.txt"


def test_exit_descriptions() -> None:
    assert describe_exit(0).error is None
    assert (describe_exit(3).exit_code, describe_exit(3).status) == (3, "exit status 3")
    killed = describe_exit(-signal.SIGKILL)
    assert (killed.exit_code, killed.exited, killed.status, killed.error) == (
        -1,
        False,
        "signal: killed",
        "signal: killed",
    )
    assert describe_exit(-signal.SIGTERM).status == "signal: terminated"


def test_environment_precedence() -> None:
    env = build_env(USER, {"PATH": "/global", "G": "g"}, {"G": "request", "HOME": "/elsewhere"})
    assert env == {"PATH": "/global", "HOME": "/elsewhere", "USER": "user", "LOGNAME": "user", "G": "request"}


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to take another user's credentials")
def test_run_as_switches_and_restores_credentials() -> None:
    folder = Path(tempfile.mkdtemp(prefix="agent-cred-"))
    try:
        folder.chmod(0o777)
        nobody = UserDatabase().lookup("nobody")
        run_as(nobody, lambda: (folder / "made").write_text("x"))
        assert (folder / "made").stat().st_uid == nobody.uid
        with pytest.raises(PermissionError):
            run_as(nobody, lambda: Path("/root/.agent-test-denied").write_text("x"))
        (folder / "root-made").write_text("x")  # back to our own credentials
        assert (folder / "root-made").stat().st_uid == 0
    finally:
        shutil.rmtree(folder)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to take another user's credentials")
def test_run_as_works_without_setfsuid(monkeypatch: pytest.MonkeyPatch) -> None:
    """gVisor's kernel has no setfsuid: the worker thread's effective ids switch instead, and back."""
    monkeypatch.setattr(_credentials, "_HAS_FSUID", False)
    folder = Path(tempfile.mkdtemp(prefix="agent-cred-"))
    try:
        folder.chmod(0o777)
        nobody = UserDatabase().lookup("nobody")
        seen: list[int] = []

        def work() -> None:
            run_as(nobody, lambda: (folder / "made").write_text("x"))
            seen.append(os.geteuid())  # this thread is root again

        worker = threading.Thread(target=work)
        worker.start()
        worker.join()
        assert (folder / "made").stat().st_uid == nobody.uid
        assert seen == [0]
        assert os.geteuid() == 0, "other threads never changed"
        with pytest.raises(PermissionError):
            run_as(nobody, lambda: Path("/root/.agent-test-denied").write_text("x"))
        (folder / "root-made").write_text("x")
        assert (folder / "root-made").stat().st_uid == 0
    finally:
        shutil.rmtree(folder)
