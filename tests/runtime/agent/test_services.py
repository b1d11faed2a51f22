"""Template services start before the agent serves, as the service user, and stop with it."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import sys
import time
from pathlib import Path

import pytest

from runtime.agent._services import Service, ServiceSet, parse_service


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("49999=/bin/x -m y", Service(49999, ("/bin/x", "-m", "y"))),
        ("1='/a b' c", Service(1, ("/a b", "c"))),
    ],
)
def test_parse_service(text: str, expected: Service) -> None:
    assert parse_service(text) == expected


@pytest.mark.parametrize("text", ["x=/bin/true", "0=/bin/true", "65536=/bin/true", "80", "80=", "80=  "])
def test_parse_service_refuses(text: str) -> None:
    with pytest.raises(ValueError, match=r"PORT=COMMAND|has no command"):
        parse_service(text)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _listener(port: int, delay: float, marker: Path, python: str = sys.executable) -> Service:
    # Listens only after ``delay``: start() must wait for it, not for the process to exist.
    code = (
        "import os, socket, sys, time; time.sleep(float(sys.argv[2])); s = socket.socket(); "
        "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(('127.0.0.1', int(sys.argv[1]))); "
        "s.listen(); open(sys.argv[3], 'w').write(f'{os.getuid()} {time.monotonic()}'); time.sleep(600)"
    )
    return Service(port, (python, "-c", code, str(port), str(delay), str(marker)))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_start_waits_until_the_port_listens_and_stop_ends_the_session(tmp_path: Path) -> None:
    marker = tmp_path / "listening"
    services = ServiceSet((_listener(_free_port(), 0.5, marker),), user=None)

    async def scenario() -> int:
        await services.start(timeout=30)
        assert marker.is_file()  # listening before start() returned
        (proc,) = services._procs
        assert proc.returncode is None
        pid = proc.pid
        await services.stop()
        return pid

    pid = asyncio.run(scenario())
    assert not _alive(pid)


@pytest.mark.skipif(os.geteuid() != 0, reason="changing user needs root")
def test_the_service_runs_as_the_service_user() -> None:
    import shutil
    import tempfile

    # pytest's tmp_path sits below a 0700 folder of root's; the service user writes here.
    folder = Path(tempfile.mkdtemp(prefix="e2b-compat-service-"))
    folder.chmod(0o777)
    marker = folder / "listening"
    # The system python: this interpreter may live where 'nobody' cannot reach it.
    services = ServiceSet((_listener(_free_port(), 0.0, marker, "/usr/bin/python3"),), user="nobody")

    async def scenario() -> None:
        await services.start(timeout=30)
        await services.stop()

    try:
        asyncio.run(scenario())
        import pwd

        assert marker.read_text().split()[0] == str(pwd.getpwnam("nobody").pw_uid)
    finally:
        shutil.rmtree(folder)


def test_a_service_that_exits_does_not_hold_up_the_agent(caplog: pytest.LogCaptureFixture) -> None:
    services = ServiceSet((Service(_free_port(), (sys.executable, "-c", "raise SystemExit(3)")),), user=None)
    started = time.monotonic()
    with caplog.at_level(logging.ERROR, logger="e2b_compat.agent.services"):
        asyncio.run(services.start(timeout=60))
    assert time.monotonic() - started < 30  # not the whole timeout: it noticed the exit
    assert "exited with status 3 before it listened" in caplog.text


def test_a_service_that_never_listens_is_given_up_on(caplog: pytest.LogCaptureFixture) -> None:
    services = ServiceSet((Service(_free_port(), (sys.executable, "-c", "import time; time.sleep(600)")),), user=None)

    async def scenario() -> None:
        await services.start(timeout=0.3)
        await services.stop()

    with caplog.at_level(logging.ERROR, logger="e2b_compat.agent.services"):
        asyncio.run(scenario())
    assert "did not listen in time" in caplog.text


def test_an_unknown_service_user_is_an_error() -> None:
    if os.geteuid() != 0:
        pytest.skip("the user is looked up only when the agent can change to it (root)")
    services = ServiceSet((Service(1, ("/bin/true",)),), user="no-such-user-here")
    with pytest.raises(ValueError, match="no-such-user-here"):
        asyncio.run(services.start())
