"""The ``e2b-compat`` command line."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest

from contract import ArtifactStore
from e2b_compat._cli import main
from runtime.backends import BACKENDS, BackendEntry
from runtime.fake import FakeBackend


def test_help_lists_only_working_groups(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert "contract" in out


def test_inventory_filters_by_surface(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["contract", "inventory", "--surface", "envd-rpc"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 17
    assert any(line.startswith("envd.process.Start ") and "server-stream" in line for line in lines)


@pytest.mark.artifacts
def test_check_reports_no_drift(store: ArtifactStore, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["contract", "--cache", str(store.root), "check"]) == 0
    assert "no drift" in capsys.readouterr().out


@pytest.mark.artifacts
def test_fetch_prints_each_verified_artifact(store: ArtifactStore, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["contract", "--cache", str(store.root), "fetch"]) == 0
    out = capsys.readouterr().out
    assert "e2b==2.32.0" in out
    assert "@e2b/code-interpreter@2.6.1" in out


def test_contract_errors_exit_2_with_a_message(
    tmp_path: object, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from contract import LockFileError

    def broken(*_args: object, **_kwargs: object) -> None:
        raise LockFileError("the lock is broken")

    monkeypatch.setattr("e2b_compat._cli.load_lock", broken)
    assert main(["contract", "fetch"]) == 2
    assert "e2b-compat: the lock is broken" in capsys.readouterr().err


# --- host prepare -----------------------------------------------------------------------------


def _recording_entry(name: str, calls: list[str], error: Exception | None = None) -> BackendEntry:

    def prepare_host(say: Callable[[str], None]) -> None:
        calls.append(name)
        say("checked everything")
        if error is not None:
            raise error

    return BackendEntry(name, lambda options: FakeBackend(), prepare_host, "a test backend")


@pytest.fixture(autouse=True)
def names(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The domains host prepare asked to resolve (the real check edits /etc/nsswitch.conf)."""
    import reference_server

    asked: list[str] = []
    monkeypatch.setattr(reference_server, "ensure_name_resolution", lambda domain, say: asked.append(domain))
    return asked


def test_host_prepare_makes_the_servers_names_resolve(
    capsys: pytest.CaptureFixture[str], names: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("E2B_COMPAT_SERVER_DOMAIN", "sbx.localhost")
    assert main(["host", "prepare", "--backend", "fake"]) == 0
    assert names == ["sbx.localhost"]
    assert "names under sbx.localhost" in capsys.readouterr().out


def test_host_prepare_reports_names_that_cannot_resolve(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import reference_server
    from reference_server import NameResolutionError

    def unresolvable(domain: str, say: Callable[[str], None]) -> None:
        raise NameResolutionError(f"{domain} does not resolve")

    monkeypatch.setattr(reference_server, "ensure_name_resolution", unresolvable)
    assert main(["host", "prepare", "--backend", "fake"]) == 1
    assert "host not ready: e2b.localhost does not resolve" in capsys.readouterr().err


def test_host_prepare_defaults_to_crun(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setitem(BACKENDS, "crun", _recording_entry("crun", calls))
    assert main(["host", "prepare"]) == 0
    assert calls == ["crun"]
    out = capsys.readouterr().out
    assert "host set-up: checked everything" in out
    assert "host ready for crun sandboxes" in out


def test_host_prepare_runs_the_named_backends_set_up(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    monkeypatch.setitem(BACKENDS, "other", _recording_entry("other", calls))
    assert main(["host", "prepare", "--backend", "other"]) == 0
    assert calls == ["other"]
    assert "host ready for other sandboxes" in capsys.readouterr().out


def test_host_prepare_all_prepares_every_serving_backend_and_not_the_others(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    for name in list(BACKENDS):
        recording = _recording_entry(name, calls).prepare_host
        monkeypatch.setitem(BACKENDS, name, dataclasses.replace(BACKENDS[name], prepare_host=recording))
    assert main(["host", "prepare", "--backend", "all"]) == 0
    serving = [name for name, entry in BACKENDS.items() if entry.serves]
    assert calls == serving
    assert "fake" not in calls
    assert f"host ready for {', '.join(serving)} sandboxes" in capsys.readouterr().out


def test_host_prepare_for_the_fake_needs_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["host", "prepare", "--backend", "fake"]) == 0
    assert "host ready for fake sandboxes" in capsys.readouterr().out


def test_host_prepare_of_an_unknown_backend_names_the_known_ones(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["host", "prepare", "--backend", "nope"]) == 2
    err = capsys.readouterr().err
    assert "unknown backend 'nope'" in err
    assert ", ".join(BACKENDS) in err


def test_host_prepare_reports_a_host_that_is_not_ready(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from runtime.host import HostNotReadyError

    calls: list[str] = []
    monkeypatch.setitem(BACKENDS, "crun", _recording_entry("crun", calls, HostNotReadyError("crun is not installed")))
    assert main(["host", "prepare"]) == 1
    assert "e2b-compat: host not ready: crun is not installed" in capsys.readouterr().err
