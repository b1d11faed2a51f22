"""The build plan: what a build-start body may say, the step cache keys, and each step's shell.

The shell of COPY, WORKDIR and ENV runs here in a real bash on a scratch tree, so the rules
(Docker's COPY destinations, owners and modes, links kept as links, expansion like ENV) are
checked by what the commands do, not by their text.
"""

from __future__ import annotations

import grp
import io
import os
import pwd
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest

from reference_server._build_plan import (
    BASE_IMAGES,
    Step,
    base_key,
    copy_script,
    copy_source,
    env_script,
    finalize_key,
    parse_plan,
    step_key,
    step_name,
    user_script,
    workdir_script,
)
from reference_server._errors import ApiError
from reference_server._templates import BuildConfig

HASH = "a" * 64


def plan(**body: Any) -> Any:
    return parse_plan({"fromImage": "e2bdev/base", **body})


def test_the_clients_default_base_image_is_accepted_in_each_spelling() -> None:
    for image in ("e2bdev/base", "e2bdev/base:latest", "docker.io/e2bdev/base"):
        assert image in BASE_IMAGES
        assert plan(fromImage=image).from_image == image


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"fromTemplate": "x"}, "exactly one of fromImage and fromTemplate"),
        ({"fromImage": None}, "exactly one of fromImage and fromTemplate"),
        ({"fromImage": "Python 3"}, "is not an image reference"),
        ({"fromImage": "python:3@sha256:abc"}, "the digest must be sha256:"),
        ({"fromImage": "registry.example/UPPER/case"}, "lower-case components"),
        ({"fromImage": "python:bad/tag"}, "is not a registry host"),
        ({"fromImage": "python:" + "t" * 200}, "is not a tag"),
        ({"fromImageRegistry": {"type": "aws"}}, "AWS registry credentials are a cloud service"),
        ({"fromImageRegistry": {"type": "gcp"}}, "GCP registry credentials are a cloud service"),
        ({"fromImageRegistry": {"type": "basic"}}, "type must be registry, aws or gcp"),
        ({"fromImageRegistry": {"type": "registry", "username": "u"}}, "needs a username and a password"),
        ({"fromImageRegistry": {"type": "registry", "username": "a:b", "password": "p"}}, "may not hold ':'"),
        (
            {
                "fromImage": None,
                "fromTemplate": "t",
                "fromImageRegistry": {"type": "registry", "username": "u", "password": "p"},
            },
            "fromImageRegistry goes with fromImage",
        ),
        ({"steps": [{"type": "FROB", "args": []}]}, "step 1 has an unknown type 'FROB'"),
        ({"steps": [{"type": "RUN", "args": []}]}, "RUN takes a command"),
        ({"steps": [{"type": "RUN", "args": ["ls", "Bad User"]}]}, "is not a user name"),
        ({"steps": [{"type": "COPY", "args": ["a", "/b"]}]}, "COPY needs the filesHash"),
        ({"steps": [{"type": "COPY", "args": ["a", "/b", "", "999"], "filesHash": HASH}]}, "is not an octal mode"),
        ({"steps": [{"type": "COPY", "args": ["a", "/b", "x;rm", ""], "filesHash": HASH}]}, "is not user[:group]"),
        ({"steps": [{"type": "ENV", "args": ["A"]}]}, "ENV takes key and value pairs"),
        ({"steps": [{"type": "ENV", "args": ["A=B", "c"]}]}, "is not an environment variable name"),
        ({"steps": [{"type": "USER", "args": ["../x"]}]}, "USER takes a user name"),
        ({"steps": [{"type": "WORKDIR", "args": []}]}, "WORKDIR takes one path"),
        ({"steps": "RUN ls"}, "steps must be a list"),
        ({"steps": [{"type": "RUN", "args": ["x" * 70_000]}]}, "is longer than"),
    ],
)
def test_a_body_a_build_could_not_carry_out_is_a_400(body: dict[str, Any], message: str) -> None:
    with pytest.raises(ApiError) as caught:
        plan(**body)
    assert caught.value.status == 400
    assert message in caught.value.message


def test_registry_images_are_accepted_with_their_credentials_kept_out_of_sight() -> None:
    registry = {"type": "registry", "username": "robot", "password": "hunter2-secret"}
    read = parse_plan({"fromImage": "127.0.0.1:5000/team/app:1", "fromImageRegistry": registry})
    assert read.from_image == "127.0.0.1:5000/team/app:1"
    assert not read.from_base
    assert read.credentials is not None
    assert (read.credentials.username, read.credentials.password) == ("robot", "hunter2-secret")
    assert "hunter2-secret" not in repr(read)
    assert parse_plan({"fromImage": "python:3"}).credentials is None
    assert plan().from_base


def test_steps_are_read_with_their_arguments() -> None:
    read = plan(
        steps=[
            {"type": "run", "args": ["echo hi", "root"], "force": True},
            {"type": "COPY", "args": ["src", "/app/", "user", "0755"], "filesHash": HASH},
            {"type": "ENV", "args": ["A", "1", "B", "$A"]},
        ],
        startCmd="serve",
        readyCmd="",
        force=True,
    )
    assert read.steps[0] == Step("RUN", ("echo hi", "root"), None, True)
    assert read.steps[1].files_hash == HASH
    assert read.start_cmd == "serve"
    assert read.ready_cmd is None  # empty means none
    assert read.force


def test_cache_keys_chain_and_follow_the_files() -> None:
    config = BuildConfig()
    base = base_key("base", config)
    assert base != base_key("other", config)
    run = Step("RUN", ("echo",))
    copy = Step("COPY", ("a", "/b"), HASH)
    first = step_key(base, run)
    assert step_key(base, run) == first  # deterministic
    assert step_key(base, Step("RUN", ("echo",), force=True)) == first  # force is not content
    assert step_key(first, copy) != step_key(first, Step("COPY", ("a", "/b"), "b" * 64))
    assert step_key(first, copy) != step_key(base, copy)  # a step's key depends on all before it
    assert finalize_key(first, "a", None) != finalize_key(first, None, "a")
    assert step_name(0) == "1"


def test_copy_source_stops_at_the_first_glob() -> None:
    assert copy_source("app.py") == "app.py"
    assert copy_source("./src/index.js") == "src/index.js"
    assert copy_source("src/*.py") == "src"
    assert copy_source("**/*.txt") == ""
    assert copy_source("dir/") == "dir"


def _bash(script: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", script],
        cwd=cwd,
        env=env or {"PATH": os.environ["PATH"]},
        capture_output=True,
        text=True,
        check=False,
    )


def _archive(path: Path, entries: dict[str, bytes | str | None]) -> None:
    """A tar like the clients': bytes are files, str are symbolic links, None folders."""
    with tarfile.open(path, "w:gz") as tar:
        for name, content in entries.items():
            info = tarfile.TarInfo(name)
            if content is None:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            elif isinstance(content, str):
                info.type, info.linkname = tarfile.SYMTYPE, content
                tar.addfile(info)
            else:
                info.size, info.mode = len(content), 0o644
                tar.addfile(info, io.BytesIO(content))


def _me() -> str:
    return f"{pwd.getpwuid(os.getuid()).pw_name}:{grp.getgrgid(os.getgid()).gr_name}"


@pytest.mark.parametrize(
    ("src", "entries", "target", "expected"),
    [
        ("a.txt", {"a.txt": b"A"}, "dir/", {"dir/a.txt": b"A"}),
        ("a.txt", {"a.txt": b"A"}, "exact.txt", {"exact.txt": b"A"}),
        ("sub/b.txt", {"sub": None, "sub/b.txt": b"B"}, "into/", {"into/b.txt": b"B"}),
        ("d", {"d": None, "d/x": b"X", "d/e": None, "d/e/y": b"Y"}, "out", {"out/x": b"X", "out/e/y": b"Y"}),
        ("*.md", {"one.md": b"1", "two.md": b"2"}, "docs", {"docs/one.md": b"1", "docs/two.md": b"2"}),
        ("link", {"link": "a.txt"}, "here/", {"here/link": "a.txt"}),
    ],
)
def test_copy_follows_dockers_rules(
    tmp_path: Path, src: str, entries: dict[str, bytes | str | None], target: str, expected: dict[str, bytes | str]
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    archive = tmp_path / "files.tar"
    _archive(archive, entries)
    unpack = tmp_path / "unpack"
    source = copy_source(src)
    script = copy_script(
        archive=str(archive),
        unpack=str(unpack),
        source=f"{unpack}/{source}" if source else str(unpack),
        target=target,
        owner=_me(),
        mode=None,
    )
    result = _bash(script, work)
    assert result.returncode == 0, result.stderr
    for name, content in expected.items():
        path = work / name
        if isinstance(content, str):
            assert path.is_symlink()
            assert os.readlink(path) == content
        else:
            assert path.read_bytes() == content
    assert not unpack.exists()
    assert not archive.exists()


def test_copy_into_an_existing_folder_and_with_a_mode(tmp_path: Path) -> None:
    (tmp_path / "work" / "existing").mkdir(parents=True)
    archive = tmp_path / "files.tar"
    _archive(archive, {"run.sh": b"#!/bin/sh\n"})
    script = copy_script(
        archive=str(archive), unpack=str(tmp_path / "u"), source=f"{tmp_path}/u/run.sh", target="existing",
        owner=_me(), mode="0750",
    )  # fmt: skip
    assert _bash(script, tmp_path / "work").returncode == 0
    copied = tmp_path / "work" / "existing" / "run.sh"
    assert copied.stat().st_mode & 0o777 == 0o750


def test_copy_of_what_the_archive_lacks_fails_and_says_so(tmp_path: Path) -> None:
    archive = tmp_path / "files.tar"
    _archive(archive, {"a": b"A"})
    script = copy_script(
        archive=str(archive), unpack=str(tmp_path / "u"), source=f"{tmp_path}/u/missing", target="x", owner=_me(),
        mode=None,
    )  # fmt: skip
    result = _bash(script, tmp_path)
    assert result.returncode == 1
    assert "nothing to copy" in result.stderr


def test_workdir_prints_the_absolute_folder(tmp_path: Path) -> None:
    result = _bash(workdir_script("a b/c"), tmp_path)
    assert result.stdout.strip() == str(tmp_path / "a b" / "c")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("plain", "plain"),
        ("$HOME/bin", "/h/bin"),
        ('say "hi"', 'say "hi"'),
        ("back\\slash", "back\\slash"),
        ("$(echo sub)", "sub"),
        ("", ""),
    ],
)
def test_env_values_expand_like_a_dockerfiles(tmp_path: Path, value: str, expected: str) -> None:
    result = _bash(env_script(value), tmp_path, {"PATH": os.environ["PATH"], "HOME": "/h"})
    assert result.returncode == 0, result.stderr
    assert result.stdout == expected


def test_user_script_creates_only_a_missing_user() -> None:
    assert "useradd -m -s /bin/bash guest" in user_script("guest", False)
    assert "id -u guest" in user_script("guest", False)
    with_sudo = user_script("guest", True)
    assert "/etc/sudoers.d/guest" in with_sudo
    assert "NOPASSWD" in with_sudo
