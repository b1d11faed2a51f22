"""The client environment: the exact four variables, a file a POSIX shell sources, and no key in reprs."""

from __future__ import annotations

import stat
import subprocess
from pathlib import Path

import pytest

from reference_server._client_env import ClientEnvironment, domain_with_port
from reference_server._credentials import new_api_key, redact

KEY = new_api_key()


def parse_env(output: str) -> dict[str, str]:
    """``env`` output into a dict (values here have no newlines)."""
    return dict(line.split("=", 1) for line in output.splitlines() if "=" in line)


def source(path: Path) -> dict[str, str]:
    done = subprocess.run(
        ["/bin/sh", "-c", '. "$0"; env', str(path)],
        env={"PATH": "/usr/bin:/bin"},  # a clean slate: only what the file sets can appear
        capture_output=True,
        text=True,
        check=True,
    )
    return parse_env(done.stdout)


@pytest.mark.parametrize(
    ("port", "expected"), [(443, "e2b.localhost"), (8443, "e2b.localhost:8443"), (80, "e2b.localhost:80")]
)
def test_domain_with_port_omits_only_443(port: int, expected: str) -> None:
    assert domain_with_port("e2b.localhost", port) == expected
    assert ClientEnvironment.for_server(KEY, "e2b.localhost", port, Path("/ca.pem")).domain_with_port == expected


def test_as_dict_is_exactly_the_four_variables() -> None:
    environment = ClientEnvironment.for_server(KEY, "e2b.localhost", 8443, Path("/var/lib/e2b-compat/tls/ca.pem"))
    assert environment.as_dict() == {
        "E2B_API_KEY": KEY,
        "E2B_DOMAIN": "e2b.localhost:8443",
        "SSL_CERT_FILE": "/var/lib/e2b-compat/tls/ca.pem",
        "NODE_EXTRA_CA_CERTS": "/var/lib/e2b-compat/tls/ca.pem",
    }


def test_render_shell_exports_each_variable_once() -> None:
    environment = ClientEnvironment(KEY, "e2b.localhost:8443", Path("/ca.pem"))
    lines = environment.render_shell().splitlines()
    assert lines == [
        f"export E2B_API_KEY={KEY}",
        "export E2B_DOMAIN=e2b.localhost:8443",
        "export SSL_CERT_FILE=/ca.pem",
        "export NODE_EXTRA_CA_CERTS=/ca.pem",
    ]


@pytest.mark.parametrize("folder", ["plain", "with space", 'it\'s $HOME `x` "q" \\ ;'])
def test_the_written_file_sources_in_a_posix_shell(tmp_path: Path, folder: str) -> None:
    ca_file = tmp_path / folder / "ca.pem"
    environment = ClientEnvironment.for_server(KEY, "e2b.localhost", 8443, ca_file)
    path = tmp_path / "client.env"
    environment.write(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600  # it holds the key
    found = source(path)
    assert {name: found.get(name) for name in environment.as_dict()} == {
        "E2B_API_KEY": KEY,
        "E2B_DOMAIN": "e2b.localhost:8443",
        "SSL_CERT_FILE": str(ca_file),
        "NODE_EXTRA_CA_CERTS": str(ca_file),
    }


def test_write_replaces_an_older_file(tmp_path: Path) -> None:
    path = tmp_path / "client.env"
    ClientEnvironment(new_api_key(), "old.localhost:1", Path("/old.pem")).write(path)
    ClientEnvironment(KEY, "e2b.localhost:8443", Path("/ca.pem")).write(path)
    assert source(path)["E2B_API_KEY"] == KEY
    assert sorted(p.name for p in tmp_path.iterdir()) == ["client.env"]


def test_banner_shows_the_exports_and_how_to_source_the_file(tmp_path: Path) -> None:
    environment = ClientEnvironment(KEY, "e2b.localhost:8443", Path("/ca.pem"))
    banner = environment.banner(tmp_path / "my env" / "client.env")
    for line in environment.render_shell().splitlines():
        assert line in banner
    assert f"source '{tmp_path}/my env/client.env'" in banner


def test_repr_redacts_the_key() -> None:
    environment = ClientEnvironment(KEY, "e2b.localhost:8443", Path("/ca.pem"))
    assert KEY not in repr(environment)
    assert KEY not in str(environment)
    assert redact(KEY) in repr(environment)


@pytest.mark.parametrize("key", ["", "secret", "e2b_XYZ"])
def test_only_api_keys_are_accepted(key: str) -> None:
    with pytest.raises(ValueError, match="not an API key"):
        ClientEnvironment(key, "e2b.localhost:8443", Path("/ca.pem"))
