"""Server configuration: defaults, the file and the variables in order, refusals that name key and source."""

from __future__ import annotations

import dataclasses
import re
import tomllib
from pathlib import Path

import pytest

import runtime.backends as runtime_backends
from reference_server._config import (
    BACKENDS,
    CONFIG_VARIABLE,
    FIELDS,
    ConfigError,
    ServerConfig,
    default_data_dir,
    env_variable,
    load_config,
    render_toml,
)

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    path = tmp_path / "data"
    path.mkdir()
    return path


@pytest.fixture
def env(data_dir: Path) -> dict[str, str]:
    """An environment that keeps the tests off this machine's real data folder."""
    return {"HOME": "/home/nobody", env_variable("data_dir"): str(data_dir)}


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


# --- defaults -----------------------------------------------------------------------------------


def test_defaults_are_the_documented_ones(env: dict[str, str], data_dir: Path) -> None:
    config = load_config(None, env)
    assert config == ServerConfig(data_dir=data_dir)
    assert dataclasses.asdict(config) == {
        "data_dir": data_dir,
        "domain": "e2b.localhost",
        "port": 8443,
        "hosts": ("127.0.0.1", "::1"),
        "backend": "crun",
        "default_template": "base",
        "templates": ("base", "code-interpreter-v1", "mcp-gateway"),
        "owner": "default",
        "cpu_count": 2,
        "memory_mb": 512,
        "disk_mb": 2048,
        "max_timeout_seconds": 86400,
        "reaper_interval_seconds": 1.0,
        "metrics_interval_seconds": 5.0,
        "egress_enabled": False,
        "log_level": "info",
        "event_loop": "uvloop",
        "request_head_timeout_seconds": 10.0,
        "max_connections": 0,
        "max_websockets": 2048,
        "sandbox_max_requests": 256,
        "sandbox_max_websockets": 128,
        "owner_max_running": 100,
        "owner_create_rate": 5.0,
        "owner_create_burst": 100,
        "max_sandboxes": 1000,
        "memory_overcommit": 4.0,
        "registry_mirrors": (),
        "insecure_registries": (),
        "max_parallel_builds": 2,
        "warm_pool": ("base=2", "code-interpreter-v1=1"),
        "warm_pool_memory_mb": 4096,
        "share_agent_memory": True,
        "boot_images": True,
        "volume_mb": 1024,
    }
    assert runtime_backends.serving_backends() == BACKENDS
    assert "crun" in BACKENDS
    assert "fake" not in BACKENDS  # nothing runs in it: no agent would answer /init


def test_default_data_dir() -> None:
    assert default_data_dir({"HOME": "/home/u"}, euid=0) == Path("/var/lib/e2b-compat")
    assert default_data_dir({"HOME": "/home/u", "XDG_DATA_HOME": "/xdg"}, euid=1000) == Path("/xdg/e2b-compat")
    assert default_data_dir({"HOME": "/home/u"}, euid=1000) == Path("/home/u/.local/share/e2b-compat")
    # The XDG spec: a relative XDG_DATA_HOME is invalid and ignored.
    assert default_data_dir({"HOME": "/home/u", "XDG_DATA_HOME": "rel"}, euid=1000) == Path(
        "/home/u/.local/share/e2b-compat"
    )


def test_the_config_is_frozen_and_checked_on_construction(data_dir: Path) -> None:
    config = ServerConfig(data_dir=data_dir)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.port = 1  # type: ignore[misc]
    with pytest.raises(ConfigError, match="port"):
        ServerConfig(data_dir=data_dir, port=0)


# --- precedence ---------------------------------------------------------------------------------


def test_file_overrides_defaults_and_variables_override_the_file(tmp_path: Path, env: dict[str, str]) -> None:
    file = write(tmp_path / "c.toml", 'port = 9000\ndomain = "sb.localhost"\nhosts = ["0.0.0.0"]\n')
    config = load_config(file, {**env, env_variable("port"): "9001"})
    assert (config.port, config.domain, config.hosts) == (9001, "sb.localhost", ("0.0.0.0",))


def test_the_file_is_the_argument_then_the_variable_then_the_data_dir(
    tmp_path: Path, env: dict[str, str], data_dir: Path
) -> None:
    argument = write(tmp_path / "argument.toml", "port = 1001\n")
    variable = write(tmp_path / "variable.toml", "port = 1002\n")
    write(data_dir / "server.toml", "port = 1003\n")
    assert load_config(argument, {**env, CONFIG_VARIABLE: str(variable)}).port == 1001
    assert load_config(None, {**env, CONFIG_VARIABLE: str(variable)}).port == 1002
    assert load_config(None, env).port == 1003


def test_every_variable_is_read(tmp_path: Path, env: dict[str, str]) -> None:
    other = tmp_path / "other"
    values = {
        "data_dir": str(other),
        "domain": "a.b.localhost",
        "port": "443",
        "hosts": " 127.0.0.1 , ::1,0.0.0.0",
        "backend": "crun",
        "default_template": "os",
        "templates": "base, code-interpreter-v1",
        "owner": "team.a",
        "cpu_count": "4",
        "memory_mb": "2048",
        "disk_mb": "512",
        "max_timeout_seconds": "3600",
        "reaper_interval_seconds": "0.5",
        "metrics_interval_seconds": "10",
        "egress_enabled": "yes",
        "log_level": "DEBUG",
        "event_loop": "asyncio",
        "request_head_timeout_seconds": "2.5",
        "max_connections": "500",
        "max_websockets": "40",
        "sandbox_max_requests": "30",
        "sandbox_max_websockets": "20",
        "owner_max_running": "7",
        "owner_create_rate": "0.5",
        "owner_create_burst": "3",
        "max_sandboxes": "9",
        "memory_overcommit": "1.5",
        "registry_mirrors": "docker.io=mirror.internal:5000, docker.io=127.0.0.1:5001/cache",
        "insecure_registries": "mirror.internal:5000",
        "max_parallel_builds": "4",
        "warm_pool": "base=1, code-interpreter-v1=0",
        "warm_pool_memory_mb": "1024",
        "share_agent_memory": "false",
        "boot_images": "false",
        "volume_mb": "64",
    }
    assert set(values) == set(FIELDS)
    config = load_config(None, {**env, **{env_variable(key): value for key, value in values.items()}})
    assert dataclasses.asdict(config) == {
        "data_dir": other,
        "domain": "a.b.localhost",
        "port": 443,
        "hosts": ("127.0.0.1", "::1", "0.0.0.0"),
        "backend": "crun",
        "default_template": "os",
        "templates": ("base", "code-interpreter-v1"),
        "owner": "team.a",
        "cpu_count": 4,
        "memory_mb": 2048,
        "disk_mb": 512,
        "max_timeout_seconds": 3600,
        "reaper_interval_seconds": 0.5,
        "metrics_interval_seconds": 10.0,
        "egress_enabled": True,
        "log_level": "debug",
        "event_loop": "asyncio",
        "request_head_timeout_seconds": 2.5,
        "max_connections": 500,
        "max_websockets": 40,
        "sandbox_max_requests": 30,
        "sandbox_max_websockets": 20,
        "owner_max_running": 7,
        "owner_create_rate": 0.5,
        "owner_create_burst": 3,
        "max_sandboxes": 9,
        "memory_overcommit": 1.5,
        "registry_mirrors": ("docker.io=mirror.internal:5000", "docker.io=127.0.0.1:5001/cache"),
        "insecure_registries": ("mirror.internal:5000",),
        "max_parallel_builds": 4,
        "warm_pool": ("base=1", "code-interpreter-v1=0"),
        "warm_pool_memory_mb": 1024,
        "share_agent_memory": False,
        "boot_images": False,
        "volume_mb": 64,
    }
    assert config.warm_pool_sizes() == {"base": 1, "code-interpreter-v1": 0}
    settings = config.registry_settings()
    assert settings.mirrors == {"docker.io": ("mirror.internal:5000", "127.0.0.1:5001/cache")}
    assert settings.plain_http("mirror.internal:5000")
    assert settings.plain_http("127.0.0.1:5001")  # loopback, listed or not
    assert not settings.plain_http("registry.example:443")


@pytest.mark.parametrize(
    ("text", "expected"),
    [("true", True), ("TRUE", True), ("1", True), ("yes", True), ("false", False), ("0", False), ("No", False)],
)
def test_boolean_variables(env: dict[str, str], text: str, expected: bool) -> None:
    assert load_config(None, {**env, env_variable("egress_enabled"): text}).egress_enabled is expected


def test_file_values_of_every_type(tmp_path: Path, env: dict[str, str]) -> None:
    file = write(
        tmp_path / "c.toml",
        "egress_enabled = true\nreaper_interval_seconds = 2\nmetrics_interval_seconds = 0.25\n"
        'data_dir = "~/state"\nlog_level = "Warning"\n',
    )
    config = load_config(file, {"HOME": env["HOME"]})  # no data_dir variable: the file's counts
    assert config.egress_enabled is True
    assert config.reaper_interval_seconds == 2.0
    assert isinstance(config.reaper_interval_seconds, float)
    assert config.metrics_interval_seconds == 0.25
    assert config.data_dir == Path("~/state").expanduser()
    assert config.log_level == "warning"


# --- refusals -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("toml", "key", "problem"),
    [
        ("prot = 1\n", "prot", "unknown key"),
        ("[server]\nport = 1\n", "server", "unknown key"),
        ('port = "8443"\n', "port", "expected an integer"),
        ("port = true\n", "port", "got a boolean"),
        ("port = 0\n", "port", "1..65535"),
        ("port = 65536\n", "port", "1..65535"),
        ("port = 1.5\n", "port", "expected an integer"),
        ('hosts = "127.0.0.1"\n', "hosts", "list of IP addresses"),
        ("hosts = []\n", "hosts", "at least one"),
        ('hosts = ["localhost"]\n', "hosts", "not an IP address"),
        ('hosts = ["::1", "0:0::1"]\n', "hosts", "twice"),
        ('domain = "localhost"\n', "domain", "single label"),
        ('domain = "e2b.localhost:8443"\n', "domain", "includes a port"),
        ('domain = "E2B.localhost"\n', "domain", "lowercase"),
        ('domain = "10.0.0.1"\n', "domain", "IP address"),
        ('backend = "firecracker"\n', "backend", "one of crun"),
        ('default_template = "../x"\n', "default_template", "not a template name"),
        ('templates = ["base", "base"]\n', "templates", "twice"),
        ('templates = ["a/b"]\n', "templates", "not a template name"),
        ('templates = "base"\n', "templates", "list of template names"),
        ('owner = "a b"\n', "owner", "1-64 characters"),
        ("cpu_count = 0\n", "cpu_count", "1..1024"),
        ("memory_mb = 1\n", "memory_mb", "64.."),
        ("max_timeout_seconds = 0\n", "max_timeout_seconds", "1.."),
        ("reaper_interval_seconds = 0\n", "reaper_interval_seconds", "seconds"),
        ("metrics_interval_seconds = inf\n", "metrics_interval_seconds", "seconds"),
        ("metrics_interval_seconds = nan\n", "metrics_interval_seconds", "seconds"),
        ('egress_enabled = "true"\n', "egress_enabled", "expected a boolean"),
        ('log_level = "verbose"\n', "log_level", "one of"),
        ('event_loop = "trio"\n', "event_loop", "must be one of uvloop, asyncio, got 'trio'"),
        ('event_loop = "UVLOOP"\n', "event_loop", "must be one of uvloop, asyncio"),
        ("event_loop = 1\n", "event_loop", "expected a string"),
        ('data_dir = "relative/path"\n', "data_dir", "absolute"),
        ("data_dir = 5\n", "data_dir", "expected a string"),
        ("owner_max_running = 0\n", "owner_max_running", "1..1000000"),
        ("owner_create_rate = 0\n", "owner_create_rate", "0.001.."),
        ("owner_create_rate = nan\n", "owner_create_rate", "0.001.."),
        ("owner_create_burst = 1.5\n", "owner_create_burst", "expected an integer"),
        ("max_sandboxes = -1\n", "max_sandboxes", "1..1000000"),
        ("memory_overcommit = inf\n", "memory_overcommit", "0.01..1000"),
        ('memory_overcommit = "2"\n', "memory_overcommit", "expected an integer or a number"),
    ],
)
def test_file_errors_name_the_file_and_the_key(
    tmp_path: Path, env: dict[str, str], toml: str, key: str, problem: str
) -> None:
    file = write(tmp_path / "bad.toml", toml)
    with pytest.raises(ConfigError) as info:
        load_config(file, {"HOME": env["HOME"]})
    message = str(info.value)
    assert message.startswith(f"{file}: {key}: "), message
    assert problem in message


def test_an_unknown_backend_is_refused_naming_the_known_ones(tmp_path: Path, env: dict[str, str]) -> None:
    file = write(tmp_path / "c.toml", 'backend = "nope"\n')
    with pytest.raises(ConfigError) as info:
        load_config(file, {"HOME": env["HOME"]})
    assert str(info.value) == f"{file}: backend: must be one of {', '.join(BACKENDS)}, got 'nope'"


def test_the_in_memory_backend_is_not_a_server_backend(env: dict[str, str]) -> None:
    with pytest.raises(ConfigError, match="backend: must be one of crun"):
        load_config(None, {**env, "E2B_COMPAT_SERVER_BACKEND": "fake"})


@pytest.mark.parametrize("name", runtime_backends.serving_backends())
def test_every_serving_backend_of_the_runtime_table_is_accepted(env: dict[str, str], name: str) -> None:
    assert load_config(None, {**env, "E2B_COMPAT_SERVER_BACKEND": name}).backend == name


def test_single_label_domain_is_refused_with_the_reason(tmp_path: Path, env: dict[str, str]) -> None:
    file = write(tmp_path / "c.toml", 'domain = "localhost"\n')
    with pytest.raises(ConfigError, match=r"wildcard certificate .* \(\*\.localhost\).*e2b\.localhost"):
        load_config(file, env)


@pytest.mark.parametrize(
    ("key", "value", "problem"),
    [
        ("port", "80a", "expected an integer"),
        ("port", "", "is empty"),
        ("port", "1_000", "expected an integer"),
        ("port", "٣", "expected an integer"),
        ("port", "70000", "1..65535"),
        ("egress_enabled", "maybe", "expected one of"),
        ("share_agent_memory", "maybe", "expected one of"),
        ("boot_images", "yes please", "expected one of"),
        ("event_loop", "libuv", "must be one of uvloop, asyncio"),
        ("reaper_interval_seconds", "nan", "expected a number"),
        ("reaper_interval_seconds", "inf", "expected a number"),
        ("hosts", "127.0.0.1,", "not an IP address"),
        ("domain", "localhost", "single label"),
        ("registry_mirrors", "docker.io", "expected registry=mirror"),
        ("registry_mirrors", "docker.io=bad host", "the mirror must be host[:port][/path]"),
        ("insecure_registries", "not a host", "expected registry=mirror"),
        ("max_parallel_builds", "0", "1..64"),
        ("warm_pool", "base", "expected template=count"),
        ("warm_pool", "base=two", "expected template=count"),
        ("warm_pool", "base=65", "the count must be 0..64"),
        ("warm_pool", "base=1,base=2", "'base' is listed twice"),
        ("warm_pool", "../x=1", "is not a template name"),
        ("warm_pool_memory_mb", "-1", "0..4194304"),
    ],
)
def test_variable_errors_name_the_variable(env: dict[str, str], key: str, value: str, problem: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, {**env, env_variable(key): value})
    message = str(info.value)
    assert message.startswith(f"environment variable {env_variable(key)}: {key}: "), message
    assert problem in message


def test_warm_pool_holds_only_served_templates(env: dict[str, str]) -> None:
    """A warm pool of a template the server does not serve would start sandboxes nobody can create."""
    with pytest.raises(ConfigError, match=r"warm_pool: 'other' is not one of the served templates \(base, "):
        load_config(None, {**env, env_variable("warm_pool"): "base=1,other=1"})
    only_base = {env_variable("templates"): "base", env_variable("warm_pool"): "code-interpreter-v1=1"}
    with pytest.raises(ConfigError, match="'code-interpreter-v1' is not one of the served templates"):
        load_config(None, {**env, **only_base})
    # The default keeps only what is served: narrowing the templates needs no pool setting.
    assert load_config(None, {**env, env_variable("templates"): "base"}).warm_pool == ("base=2",)


@pytest.mark.parametrize("variable", ["E2B_COMPAT_SERVER_PROT", "E2B_COMPAT_SERVER_port", "E2B_COMPAT_SERVER_"])
def test_unknown_server_variables_are_refused(env: dict[str, str], variable: str) -> None:
    with pytest.raises(ConfigError, match=f"environment variable {variable}: not a server setting"):
        load_config(None, {**env, variable: "1"})


def test_other_variables_are_ignored(env: dict[str, str]) -> None:
    assert load_config(None, {**env, "E2B_COMPAT_CACHE": "/x", "E2B_DOMAIN": "whatever"}).port == 8443


def test_missing_or_broken_files_are_refused(tmp_path: Path, env: dict[str, str]) -> None:
    with pytest.raises(ConfigError, match=r"--config .*missing\.toml: no such file"):
        load_config(tmp_path / "missing.toml", env)
    with pytest.raises(ConfigError, match=f"environment variable {CONFIG_VARIABLE}: .*is not a file"):
        load_config(None, {**env, CONFIG_VARIABLE: str(tmp_path / "missing.toml")})
    broken = write(tmp_path / "broken.toml", "port = \n")
    with pytest.raises(ConfigError, match=f"{broken}: not valid TOML"):
        load_config(broken, env)


def test_a_bad_data_dir_variable_is_reported_before_looking_for_its_file(env: dict[str, str]) -> None:
    with pytest.raises(ConfigError, match=r"E2B_COMPAT_SERVER_DATA_DIR: data_dir: .*absolute"):
        load_config(None, {**env, env_variable("data_dir"): "relative"})


# --- rendering ----------------------------------------------------------------------------------


def test_render_round_trips(tmp_path: Path, env: dict[str, str]) -> None:
    # The odd characters are the point: quotes, a backslash and a control character survive TOML quoting.
    config = ServerConfig(
        data_dir=tmp_path / 'odd "dir" \\ with\ttab',
        domain="a.b.localhost",
        port=443,
        hosts=("::", "0.0.0.0"),
        egress_enabled=True,
        reaper_interval_seconds=0.125,
        log_level="debug",
    )
    text = render_toml(config)
    file = write(tmp_path / "rendered.toml", text)
    assert load_config(file, {"HOME": env["HOME"]}) == config


def test_render_has_every_key_with_its_description(data_dir: Path) -> None:
    text = render_toml(ServerConfig(data_dir=data_dir))
    assert set(tomllib.loads(text)) == set(FIELDS)
    for item in dataclasses.fields(ServerConfig):
        assert f"# {item.metadata['doc']}\n{item.name} = " in text


def test_server_md_documents_every_key_its_default_and_variable(data_dir: Path) -> None:
    doc = (REPO / "docs" / "SERVER.md").read_text()
    rows = {
        match.group(1): match.group(0) for match in re.finditer(r"^\| `([a-z_]+)` \|.*\|$", doc, flags=re.MULTILINE)
    }
    assert set(rows) == set(FIELDS)
    defaults = ServerConfig(data_dir=data_dir)
    for key in FIELDS:
        assert f"`{env_variable(key)}`" in rows[key], key
        if key != "data_dir":
            rendered = render_toml(defaults).split(f"\n{key} = ", 1)[1].split("\n", 1)[0]
            assert f"`{rendered.strip(chr(34))}`" in rows[key], (key, rendered)
