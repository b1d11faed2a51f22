"""Image references and registry settings: the rules, as the Docker engine reads references."""

from __future__ import annotations

import tomllib

import pytest

from runtime.templates import ImageError, ImageReference, RegistrySettings, parse_mirror, parse_reference

DIGEST = "sha256:" + "ab" * 32


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("python", ImageReference("docker.io", "library/python", "latest", None)),
        ("python:3.12-slim", ImageReference("docker.io", "library/python", "3.12-slim", None)),
        ("e2bdev/base", ImageReference("docker.io", "e2bdev/base", "latest", None)),
        ("localhost/app", ImageReference("localhost", "app", "latest", None)),
        ("127.0.0.1:5000/team/app:1", ImageReference("127.0.0.1:5000", "team/app", "1", None)),
        ("ghcr.io/org/tool@" + DIGEST, ImageReference("ghcr.io", "org/tool", None, DIGEST)),
        ("ghcr.io/org/tool:v1@" + DIGEST, ImageReference("ghcr.io", "org/tool", "v1", DIGEST)),
        ("registry.example:443/a/b/c", ImageReference("registry.example:443", "a/b/c", "latest", None)),
    ],
)
def test_references_are_read_as_the_docker_engine_reads_them(text: str, expected: ImageReference) -> None:
    assert parse_reference(text) == expected
    assert parse_reference(str(expected)) == expected  # the written form reads back the same


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("", "not an image reference"),
        (" python", "not an image reference"),
        ("py thon", "not an image reference"),
        ("python@sha256:short", "the digest must be"),
        ("python@md5:" + "a" * 32, "the digest must be"),
        ("Team/App", "lower-case components"),
        ("team//app", "lower-case components"),
        ("team/app:", "is not a tag"),
        ("team/app:-x", "is not a tag"),
        ("bad_host.example:port/app", "is not a registry host"),
        ("r.example/" + "a" * 260, "longer than 255"),
    ],
)
def test_malformed_references_are_refused_saying_why(text: str, problem: str) -> None:
    with pytest.raises(ImageError) as caught:
        parse_reference(text)
    assert problem in str(caught.value)


def test_a_reference_pinned_to_a_digest_drops_its_tag() -> None:
    assert parse_reference("127.0.0.1:5000/team/app:1").pinned(DIGEST) == f"127.0.0.1:5000/team/app@{DIGEST}"


def test_registries_conf_names_the_registry_its_mirrors_and_which_go_over_plain_http() -> None:
    settings = RegistrySettings(
        mirrors={"docker.io": ("mirror.internal:5000", "127.0.0.1:5001/cache")}, insecure=("mirror.internal:5000",)
    )
    conf = tomllib.loads(settings.registries_conf(parse_reference("python:3")))
    assert conf["unqualified-search-registries"] == []
    (registry,) = conf["registry"]
    assert registry["location"] == "docker.io"
    assert registry["insecure"] is False
    assert [(m["location"], m["insecure"]) for m in registry["mirror"]] == [
        ("mirror.internal:5000", True),
        ("127.0.0.1:5001/cache", True),
    ]
    assert settings.hosts(parse_reference("python:3")) == ("docker.io", "mirror.internal:5000", "127.0.0.1:5001")
    other = tomllib.loads(settings.registries_conf(parse_reference("ghcr.io/a/b")))
    assert "mirror" not in other["registry"][0]  # mirrors belong to their registry only


@pytest.mark.parametrize("host", ["localhost:5000", "127.0.0.1:5000", "127.8.9.1", "localhost"])
def test_loopback_registries_are_always_plain_http(host: str) -> None:
    assert RegistrySettings().plain_http(host)


def test_other_registries_need_tls_unless_listed() -> None:
    assert not RegistrySettings().plain_http("registry.example:5000")
    assert not RegistrySettings().plain_http("10.0.0.1:5000")
    assert RegistrySettings(insecure=("10.0.0.1:5000",)).plain_http("10.0.0.1:5000")


def test_mirror_settings_are_checked() -> None:
    assert parse_mirror(" docker.io = mirror.internal:5000/cache ") == ("docker.io", "mirror.internal:5000/cache")
    for bad in ("docker.io", "=mirror", "docker.io=", "docker.io=bad host", "docker.io=m.example/UPPER"):
        with pytest.raises(ValueError, match=r"expected registry=mirror|the mirror must be"):
            parse_mirror(bad)
