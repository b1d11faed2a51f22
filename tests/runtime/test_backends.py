"""``runtime.backends``: the table of backend names, looking names up, and the runtime's public front."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

import runtime
from runtime import backends
from runtime.backend import BackendError, SandboxRuntimeError, SandboxSpec, State
from runtime.backends import (
    BACKENDS,
    DEFAULT_BACKEND,
    BackendEntry,
    BackendOptions,
    UnknownBackendError,
    backend_entry,
    open_backend,
)
from runtime.fake import FakeBackend
from runtime.templates import Template


def test_the_table_has_crun_by_default_and_the_fake() -> None:
    assert DEFAULT_BACKEND == "crun"
    assert list(BACKENDS) == ["crun", "docker", "gvisor", "fake"]
    for name, entry in BACKENDS.items():
        assert entry.name == name
        assert entry.description
        assert backend_entry(name) is entry


def test_an_unknown_name_is_refused_naming_the_known_ones(tmp_path: Path) -> None:
    with pytest.raises(UnknownBackendError) as info:
        open_backend("nope", BackendOptions(state_dir=tmp_path))
    assert str(info.value) == "unknown backend 'nope' (known: crun, docker, gvisor, fake)"
    assert isinstance(info.value, BackendError)
    assert isinstance(info.value, ValueError)
    with pytest.raises(UnknownBackendError, match=r"known: crun, docker, gvisor, fake"):
        backend_entry("")


def test_an_entry_added_to_the_table_is_known(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[BackendOptions] = []

    def open_it(options: BackendOptions) -> FakeBackend:
        made.append(options)
        return FakeBackend()

    monkeypatch.setitem(BACKENDS, "other", BackendEntry("other", open_it, lambda say: None, "another"))
    options = BackendOptions(state_dir=tmp_path)
    assert isinstance(open_backend("other", options), FakeBackend)
    assert made == [options]
    with pytest.raises(UnknownBackendError, match=r"known: crun, docker, gvisor, fake, other\)"):
        open_backend("nope", options)


def test_the_fake_offers_the_templates_it_is_given(tmp_path: Path) -> None:
    assert isinstance(open_backend("fake", BackendOptions(state_dir=tmp_path)), FakeBackend)
    templates = [
        Template(name, "k" * 64, tmp_path / name, tmp_path / name / "rootfs", ("agent",))
        for name in ("base", "code-interpreter-v1")
    ]
    backend = open_backend("fake", BackendOptions(state_dir=tmp_path, templates=templates))
    assert isinstance(backend, FakeBackend)
    assert set(backend.templates) == {"base", "code-interpreter-v1"}

    async def create() -> State:
        return (await backend.create(SandboxSpec("s1", "code-interpreter-v1"))).state

    assert asyncio.run(create()) is State.CREATED


def test_preparing_the_host_for_the_fake_does_nothing() -> None:
    said: list[str] = []
    BACKENDS["fake"].prepare_host(said.append)
    assert said == []


def test_crun_prepares_the_host_with_runtime_host(monkeypatch: pytest.MonkeyPatch) -> None:
    from runtime import host

    calls: list[object] = []

    def prepare(*, say: object) -> None:
        calls.append(say)

    monkeypatch.setattr(host, "prepare", prepare)
    say = print
    BACKENDS["crun"].prepare_host(say)
    assert calls == [say]


def test_crun_opens_a_crun_backend_with_the_options(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from runtime import _checkpoint_tools, crun

    seen: dict[str, object] = {}

    class Recording:
        def __init__(self, state_dir: Path, **kwargs: object) -> None:
            seen.update(state_dir=state_dir, **kwargs)

    monkeypatch.setattr(crun, "CrunBackend", Recording)
    tools = _checkpoint_tools.CheckpointTools(tmp_path / "tools")
    monkeypatch.setattr(_checkpoint_tools, "find", lambda cache_root=None: tools)
    options = BackendOptions(
        state_dir=tmp_path, templates_root=tmp_path / "cache", share_agent_memory=True, boot_images=True
    )
    assert isinstance(open_backend("crun", options), Recording)
    assert seen == {
        "state_dir": tmp_path,
        "templates_root": tmp_path / "cache",
        "templates": (),
        "share_agent_memory": True,
        "checkpoint_tools": tools,  # the host's build, when there is one
        "boot_images": True,
    }


def test_importing_the_table_loads_no_backend() -> None:
    probe = (
        "import sys, runtime, runtime.backends\n"
        "runtime.backends.backend_entry('crun')\n"
        "heavy = ('runtime.crun', 'runtime._oci_backend', 'runtime._network', 'runtime.fake', 'runtime.templates', "
        "'httpx')\n"
        "print(sorted(name for name in heavy if name in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_runtime_front_is_sorted_and_resolves() -> None:
    def kind(name: str) -> tuple[int, str]:
        return (0 if name.isupper() else 1 if name[0].isupper() else 2, name)

    assert runtime.__all__ == sorted(runtime.__all__, key=kind)
    for name in runtime.__all__:
        assert getattr(runtime, name) is not None, name
    assert runtime.open_backend is backends.open_backend
    with pytest.raises(AttributeError):
        _ = runtime.nothing_of_that_name


def test_every_backend_error_is_in_the_runtime_tree() -> None:
    from runtime import _network, host

    for error in (
        _network.NetworkError,
        _network.PoolExhaustedError,
        _network.NamesTakenError,
        host.HostNotReadyError,
        UnknownBackendError,
    ):
        assert issubclass(error, BackendError), error
    assert issubclass(BackendError, SandboxRuntimeError)
