"""The edge's routing parser: one table per rule, and Hypothesis properties over arbitrary input."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reference_server._routing import (
    ControlPlane,
    Domain,
    Route,
    RouteError,
    SandboxRoute,
    authority_matches_host,
    parse_domain,
    route,
)

Headers = tuple[tuple[str, str], ...]

PLAIN = "e2b.localhost"
WITH_PORT = "e2b.localhost:8443"
ID_48 = "a" + "0" * 46 + "z"
ID_49 = "a" + "0" * 47 + "z"
UUID_ID = "sandbox-6f1c2d3e-4b5a-4c6d-8e7f-9a0b1c2d3e4f"  # the server's own id format, 44 characters
BOTH: Headers = (("e2b-sandbox-id", "abc"), ("e2b-sandbox-port", "49983"))


def _refusal(host: str, domain: str, headers: Headers = ()) -> RouteError:
    with pytest.raises(RouteError) as caught:
        route(host, parse_domain(domain), headers)
    return caught.value


# --- what routes ----------------------------------------------------------------------------

ROUTED = [
    pytest.param("api.e2b.localhost", PLAIN, (), ControlPlane(), id="control-plane"),
    pytest.param("API.E2B.LocalHost", PLAIN, (), ControlPlane(), id="control-plane-any-case"),
    pytest.param("api.e2b.localhost:8443", WITH_PORT, (), ControlPlane(), id="control-plane-with-port"),
    pytest.param("api.e2b.localhost", WITH_PORT, (), ControlPlane(), id="control-plane-port-omitted"),
    pytest.param(
        "api.e2b.localhost", PLAIN, (*BOTH, *BOTH), ControlPlane(), id="control-plane-ignores-routing-headers"
    ),
    pytest.param("49983-abc.e2b.localhost", PLAIN, (), SandboxRoute("abc", 49983, "host"), id="direct"),
    pytest.param("49999-abc.e2b.localhost:8443", WITH_PORT, (), SandboxRoute("abc", 49999, "host"), id="direct-port"),
    pytest.param("50005-abc.e2b.localhost", WITH_PORT, (), SandboxRoute("abc", 50005, "host"), id="direct-no-port"),
    pytest.param("1-a.e2b.localhost", PLAIN, (), SandboxRoute("a", 1, "host"), id="direct-smallest"),
    pytest.param("65535-0.e2b.localhost", PLAIN, (), SandboxRoute("0", 65535, "host"), id="direct-largest-port"),
    pytest.param(f"8080-{ID_48}.e2b.localhost", PLAIN, (), SandboxRoute(ID_48, 8080, "host"), id="direct-48-char-id"),
    pytest.param(
        f"49983-{UUID_ID}.e2b.localhost", PLAIN, (), SandboxRoute(UUID_ID, 49983, "host"), id="split-at-first-hyphen"
    ),
    pytest.param("49983-a--b.e2b.localhost", PLAIN, (), SandboxRoute("a--b", 49983, "host"), id="inner-hyphens"),
    pytest.param("49983-ABC.E2B.localhost", PLAIN, (), SandboxRoute("abc", 49983, "host"), id="direct-lowercased"),
    pytest.param("49983-abc.e2b.localhost", PLAIN, BOTH, SandboxRoute("abc", 49983, "host"), id="direct-agreeing"),
    pytest.param(
        "49983-abc.e2b.localhost",
        PLAIN,
        (("E2b-Sandbox-Port", "49983"),),
        SandboxRoute("abc", 49983, "host"),
        id="direct-agreeing-port-only",
    ),
    pytest.param("sandbox.e2b.localhost", PLAIN, BOTH, SandboxRoute("abc", 49983, "headers"), id="shared"),
    pytest.param(
        "Sandbox.E2B.localhost:8443",
        WITH_PORT,
        (("E2B-SANDBOX-ID", UUID_ID), ("user-agent", "x"), ("E2b-Sandbox-Port", "49999")),
        SandboxRoute(UUID_ID, 49999, "headers"),
        id="shared-any-case-names",
    ),
    pytest.param(
        "sandbox.example.com",
        "example.com",
        (("e2b-sandbox-id", "sandbox"), ("e2b-sandbox-port", "1")),
        SandboxRoute("sandbox", 1, "headers"),
        id="shared-other-domain",
    ),
    pytest.param("api.localhost", "localhost", (), ControlPlane(), id="single-label-domain"),
]


@pytest.mark.parametrize(("host", "domain", "headers", "expected"), ROUTED)
def test_routed(host: str, domain: str, headers: Headers, expected: Route) -> None:
    assert route(host, parse_domain(domain), headers) == expected


# --- the Host as a whole: syntax (400), then whether it is ours at all (404) -----------------

MALFORMED_HOSTS = [
    pytest.param("", PLAIN, id="empty"),
    pytest.param(" api.e2b.localhost", PLAIN, id="leading-space"),
    pytest.param("api.e2b.localhost ", PLAIN, id="trailing-space"),
    pytest.param("user@api.e2b.localhost", PLAIN, id="userinfo"),
    pytest.param("49983-a_b.e2b.localhost", PLAIN, id="underscore"),
    pytest.param("49983-abc..e2b.localhost", PLAIN, id="empty-label"),
    pytest.param("..e2b.localhost", PLAIN, id="only-dots"),
    pytest.param(".api.e2b.localhost", PLAIN, id="leading-dot"),
    pytest.param("api.e2b.localhost.", PLAIN, id="trailing-dot"),
    pytest.param("api.e2b.localhost.:8443", WITH_PORT, id="trailing-dot-with-port"),
    pytest.param("49983-\u212a.e2b.localhost", PLAIN, id="kelvin-sign-is-not-k"),
    pytest.param("api.e2b.l\u043ecalhost", PLAIN, id="cyrillic-o"),
    pytest.param("49983-abc.e2b.localhost\x00", PLAIN, id="nul"),
    pytest.param("x" * 64 + ".e2b.localhost", PLAIN, id="64-char-label"),
    pytest.param(".".join(["a"] * 125) + ".e2b.localhost", PLAIN, id="longer-than-253"),
    pytest.param("::1", PLAIN, id="unbracketed-ipv6"),
    pytest.param("api.e2b.localhost:", WITH_PORT, id="empty-port"),
    pytest.param("api.e2b.localhost:abc", WITH_PORT, id="non-numeric-port"),
    pytest.param("api.e2b.localhost:08443", WITH_PORT, id="port-leading-zero"),
    pytest.param("api.e2b.localhost:0", WITH_PORT, id="port-zero"),
    pytest.param("api.e2b.localhost:65536", WITH_PORT, id="port-too-large"),
    pytest.param("api.e2b.localhost:+8443", WITH_PORT, id="port-sign"),
    pytest.param("api.e2b.localhost:8443:8443", WITH_PORT, id="two-ports"),
]


@pytest.mark.parametrize(("host", "domain"), MALFORMED_HOSTS)
def test_malformed_host_is_400(host: str, domain: str) -> None:
    error = _refusal(host, domain, BOTH)
    assert (error.status, error.message) == (400, "Invalid host")


NOT_OURS = [
    pytest.param("49983-abc.e2b.localhost.evil.invalid", PLAIN, (), id="suffix-trick-domain-then-more"),
    pytest.param("api.e2b.localhost.evil.invalid", PLAIN, (), id="suffix-trick-control-plane"),
    pytest.param("49983-abc.evil.e2b.localhost", PLAIN, (), id="suffix-trick-label-between"),
    pytest.param("49983.abc.e2b.localhost", PLAIN, (), id="two-labels-under-domain"),
    pytest.param("sandbox.evil.e2b.localhost", PLAIN, BOTH, id="deeper-shared-host"),
    pytest.param("49983-abce2b.localhost", PLAIN, (), id="no-dot-before-domain"),
    pytest.param("49983-abc.xe2b.localhost", PLAIN, (), id="domain-as-part-of-a-label"),
    pytest.param("e2b.localhost", PLAIN, BOTH, id="bare-domain"),
    pytest.param("www.e2b.localhost", PLAIN, (), id="label-without-hyphen"),
    pytest.param("sandbox.evil.invalid", PLAIN, BOTH, id="headers-on-a-foreign-host"),
    pytest.param("example.com", PLAIN, (), id="foreign"),
    pytest.param("localhost", PLAIN, (), id="localhost"),
    pytest.param("127.0.0.1", PLAIN, (), id="ipv4"),
    pytest.param("127.0.0.1:8443", WITH_PORT, (), id="ipv4-with-port"),
    pytest.param("[::1]", PLAIN, (), id="ipv6-literal"),
    pytest.param("[::1]:8443", WITH_PORT, (), id="ipv6-literal-with-port"),
    pytest.param("[49983-abc.e2b.localhost]", PLAIN, (), id="bracketed-name"),
    pytest.param("api.e2b.localhost:8443", PLAIN, (), id="port-where-none-is-configured"),
    pytest.param("api.e2b.localhost:443", WITH_PORT, (), id="other-port"),
    pytest.param("49983-abc.e2b.localhost:8444", WITH_PORT, (), id="other-port-direct"),
]


@pytest.mark.parametrize(("host", "domain", "headers"), NOT_OURS)
def test_host_that_is_not_ours_is_404(host: str, domain: str, headers: Headers) -> None:
    error = _refusal(host, domain, headers)
    assert (error.status, error.message) == (404, "Sandbox not found")


# --- direct hosts: <port>-<id>.<domain> -------------------------------------------------------

DIRECT_PORTS = [
    pytest.param("0-abc", id="zero"),
    pytest.param("65536-abc", id="65536"),
    pytest.param("049983-abc", id="leading-zero"),
    pytest.param("00-abc", id="double-zero"),
    pytest.param("-abc", id="empty"),
    pytest.param("abc-def", id="non-numeric"),
    pytest.param("49983x-abc", id="trailing-letter"),
    pytest.param("99999999999999999999-abc", id="huge"),
]


@pytest.mark.parametrize("label", DIRECT_PORTS)
def test_direct_host_port_must_be_1_to_65535_without_leading_zero(label: str) -> None:
    error = _refusal(f"{label}.e2b.localhost", PLAIN)
    assert (error.status, error.message) == (400, "Invalid sandbox port")


DIRECT_IDS = [
    pytest.param("49983---x", id="id-starts-with-hyphens"),
    pytest.param("49983--x", id="id-starts-with-hyphen"),
    pytest.param("49983-x-", id="id-ends-with-hyphen"),
    pytest.param("49983-", id="empty-id"),
    pytest.param("49983--", id="id-only-hyphen"),
    pytest.param(f"49983-{ID_49}", id="49-char-id"),
]


@pytest.mark.parametrize("label", DIRECT_IDS)
def test_direct_host_id_must_be_1_to_48_alphanumeric_ended(label: str) -> None:
    error = _refusal(f"{label}.e2b.localhost", PLAIN)
    assert (error.status, error.message) == (400, "Invalid sandbox ID")


DIRECT_HEADERS = [
    pytest.param(
        (("e2b-sandbox-id", "abd"), ("e2b-sandbox-port", "49983")),
        "e2b-sandbox-id header does not match",
        id="other-id",
    ),
    pytest.param((("e2b-sandbox-id", "ABC"),), "e2b-sandbox-id header does not match", id="header-id-is-exact"),
    pytest.param((("e2b-sandbox-id", ""),), "e2b-sandbox-id header does not match", id="empty-header-id"),
    pytest.param((("E2b-Sandbox-Port", "49999"),), "e2b-sandbox-port header does not match", id="other-port"),
    pytest.param((("e2b-sandbox-port", "049983"),), "e2b-sandbox-port header does not match", id="port-leading-zero"),
    pytest.param((("e2b-sandbox-port", "nope"),), "e2b-sandbox-port header does not match", id="port-non-numeric"),
    pytest.param((*BOTH, ("E2B-Sandbox-Id", "abc")), "Duplicate e2b-sandbox-id", id="duplicate-id-same-value"),
    pytest.param((*BOTH, ("e2b-sandbox-port", "49983")), "Duplicate e2b-sandbox-port", id="duplicate-port"),
]


@pytest.mark.parametrize(("headers", "message"), DIRECT_HEADERS)
def test_direct_host_headers_must_agree_and_be_single(headers: Headers, message: str) -> None:
    error = _refusal("49983-abc.e2b.localhost", PLAIN, headers)
    assert error.status == 400
    assert message in error.message


# --- the shared host: sandbox.<domain> plus both headers -------------------------------------

SHARED = [
    pytest.param((), "needs both", id="no-headers"),
    pytest.param((("e2b-sandbox-id", "abc"),), "needs both", id="id-only"),
    pytest.param((("e2b-sandbox-port", "49983"),), "needs both", id="port-only"),
    pytest.param((("e2b-sandbox-ids", "abc"), ("e2b-sandbox-port", "49983")), "needs both", id="similar-name"),
    pytest.param((*BOTH, ("e2b-sandbox-id", "abc")), "Duplicate e2b-sandbox-id", id="duplicate-id"),
    pytest.param((*BOTH, ("E2B-SANDBOX-PORT", "49999")), "Duplicate e2b-sandbox-port", id="duplicate-port"),
    pytest.param((("e2b-sandbox-id", "abc"), ("e2b-sandbox-port", "0")), "Invalid sandbox port", id="port-zero"),
    pytest.param((("e2b-sandbox-id", "abc"), ("e2b-sandbox-port", "65536")), "Invalid sandbox port", id="port-65536"),
    pytest.param((("e2b-sandbox-id", "abc"), ("e2b-sandbox-port", "049983")), "Invalid sandbox port", id="port-zero-"),
    pytest.param((("e2b-sandbox-id", "abc"), ("e2b-sandbox-port", " 49983")), "Invalid sandbox port", id="port-space"),
    pytest.param((("e2b-sandbox-id", "abc"), ("e2b-sandbox-port", "4_9983")), "Invalid sandbox port", id="port-_"),
    pytest.param(
        (("e2b-sandbox-id", "abc"), ("e2b-sandbox-port", "\u0664\u0669\u0669\u0668\u0663")),
        "Invalid sandbox port",
        id="port-arabic-indic-digits",
    ),
    pytest.param((("e2b-sandbox-id", "ABC"), ("e2b-sandbox-port", "49983")), "Invalid sandbox ID", id="id-uppercase"),
    pytest.param((("e2b-sandbox-id", "--x"), ("e2b-sandbox-port", "49983")), "Invalid sandbox ID", id="id-hyphens"),
    pytest.param((("e2b-sandbox-id", "x-"), ("e2b-sandbox-port", "49983")), "Invalid sandbox ID", id="id-hyphen-end"),
    pytest.param((("e2b-sandbox-id", ""), ("e2b-sandbox-port", "49983")), "Invalid sandbox ID", id="id-empty"),
    pytest.param((("e2b-sandbox-id", "a.b"), ("e2b-sandbox-port", "49983")), "Invalid sandbox ID", id="id-dot"),
    pytest.param((("e2b-sandbox-id", ID_49), ("e2b-sandbox-port", "49983")), "Invalid sandbox ID", id="id-49-chars"),
]


@pytest.mark.parametrize(("headers", "message"), SHARED)
def test_shared_host_needs_both_headers_once_and_valid(headers: Headers, message: str) -> None:
    error = _refusal("sandbox.e2b.localhost", PLAIN, headers)
    assert error.status == 400
    assert message in error.message


# --- the configured domain ------------------------------------------------------------------

GOOD_DOMAINS = [
    pytest.param("e2b.localhost", Domain("e2b.localhost"), id="plain"),
    pytest.param("e2b.localhost:8443", Domain("e2b.localhost", 8443), id="with-port"),
    pytest.param("localhost:1", Domain("localhost", 1), id="single-label"),
    pytest.param("a-1.b2.example.com:65535", Domain("a-1.b2.example.com", 65535), id="hyphens-and-digits"),
    pytest.param("10.example", Domain("10.example"), id="numeric-first-label"),
    pytest.param(".".join(["a" * 63] * 3 + ["b" * 61]), Domain(".".join(["a" * 63] * 3 + ["b" * 61])), id="253-chars"),
]


@pytest.mark.parametrize(("configured", "expected"), GOOD_DOMAINS)
def test_parse_domain(configured: str, expected: Domain) -> None:
    assert parse_domain(configured) == expected


BAD_DOMAINS = [
    pytest.param("", "not a lowercase DNS label", id="empty"),
    pytest.param("E2B.localhost", "not a lowercase DNS label", id="uppercase"),
    pytest.param("e2b.localhost.", "must not end with a dot", id="trailing-dot"),
    pytest.param("e2b..localhost", "not a lowercase DNS label", id="empty-label"),
    pytest.param(".e2b.localhost", "not a lowercase DNS label", id="leading-dot"),
    pytest.param("-e2b.localhost", "not a lowercase DNS label", id="leading-hyphen"),
    pytest.param("e2b-.localhost", "not a lowercase DNS label", id="trailing-hyphen"),
    pytest.param("e2b_x.localhost", "not a lowercase DNS label", id="underscore"),
    pytest.param("*.e2b.localhost", "not a lowercase DNS label", id="wildcard"),
    pytest.param(" e2b.localhost", "not a lowercase DNS label", id="space"),
    pytest.param("https://e2b.localhost", "port must be", id="url"),
    pytest.param("x" * 64 + ".localhost", "not a lowercase DNS label", id="64-char-label"),
    pytest.param(".".join(["a" * 63] * 3 + ["b" * 62]), "longer than 253", id="254-chars"),
    pytest.param("e2b.l\u043ecalhost", "non-ASCII", id="cyrillic-o"),
    pytest.param("e2b.localhost:", "port must be", id="empty-port"),
    pytest.param("e2b.localhost:0", "port must be", id="port-zero"),
    pytest.param("e2b.localhost:65536", "port must be", id="port-65536"),
    pytest.param("e2b.localhost:08443", "port must be", id="port-leading-zero"),
    pytest.param("e2b.localhost:8443:1", "port must be", id="two-ports"),
    pytest.param("127.0.0.1", "all digits", id="ipv4"),
    pytest.param("[::1]:8443", "port must be", id="ipv6"),
]


@pytest.mark.parametrize(("configured", "message"), BAD_DOMAINS)
def test_parse_domain_refuses(configured: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_domain(configured)


# --- HTTP/2 :authority against Host ----------------------------------------------------------

AUTHORITIES = [
    pytest.param("api.e2b.localhost", "api.e2b.localhost", True, id="same"),
    pytest.param("API.e2b.localhost:8443", "api.E2B.localhost:8443", True, id="case-differs"),
    pytest.param("api.e2b.localhost", "49983-abc.e2b.localhost", False, id="other-host"),
    pytest.param("api.e2b.localhost:8443", "api.e2b.localhost", False, id="port-only-in-authority"),
    pytest.param("api.e2b.localhost", "api.e2b.localhost:443", False, id="default-port-not-assumed"),
    pytest.param("user@api.e2b.localhost", "api.e2b.localhost", False, id="userinfo"),
    pytest.param("49983-\u212a.e2b.localhost", "49983-k.e2b.localhost", False, id="kelvin-sign-is-not-k"),
    pytest.param("", "", False, id="both-empty"),
    pytest.param("", "api.e2b.localhost", False, id="empty-authority"),
]


@pytest.mark.parametrize(("authority", "host", "expected"), AUTHORITIES)
def test_authority_matches_host(authority: str, host: str, expected: bool) -> None:
    assert authority_matches_host(authority, host) is expected
    assert authority_matches_host(host, authority) is expected


# --- properties -----------------------------------------------------------------------------

SANDBOX_IDS = st.from_regex(r"[a-z0-9](?:[a-z0-9-]{0,46}[a-z0-9])?", fullmatch=True)
PORTS = st.integers(1, 65535)
LABELS = st.from_regex(r"[a-z0-9](?:[a-z0-9-]{0,14}[a-z0-9])?", fullmatch=True)
DOMAIN_TEXTS = st.builds(
    lambda labels, port: ".".join(labels) + ("" if port is None else f":{port}"),
    st.lists(LABELS, min_size=1, max_size=4).filter(lambda labels: not labels[-1].isdigit()),
    st.none() | PORTS,
)


@given(
    sandbox_id=SANDBOX_IDS,
    port=PORTS,
    configured=DOMAIN_TEXTS,
    with_port=st.booleans(),
    upper=st.booleans(),
    send_headers=st.booleans(),
)
def test_direct_host_round_trip(
    *, sandbox_id: str, port: int, configured: str, with_port: bool, upper: bool, send_headers: bool
) -> None:
    domain = parse_domain(configured)
    host = f"{port}-{sandbox_id}.{configured if with_port else domain.name}"
    headers: Headers = (("E2b-Sandbox-Id", sandbox_id), ("E2b-Sandbox-Port", str(port))) if send_headers else ()
    assert route(host.upper() if upper else host, domain, headers) == SandboxRoute(sandbox_id, port, "host")


@given(sandbox_id=SANDBOX_IDS, port=PORTS, configured=DOMAIN_TEXTS, with_port=st.booleans())
def test_shared_host_round_trip(sandbox_id: str, port: int, configured: str, with_port: bool) -> None:
    domain = parse_domain(configured)
    host = f"sandbox.{configured if with_port else domain.name}"
    headers = (("e2b-sandbox-port", str(port)), ("e2b-sandbox-id", sandbox_id))
    assert route(host, domain, headers) == SandboxRoute(sandbox_id, port, "headers")


# Arbitrary text rarely gets past the first check, so hosts are also assembled from pieces
# that are almost right: the domain's own labels, ports, separators and look-alikes.
FRAGMENTS = st.sampled_from(
    [
        *("api", "sandbox", "49983-abc", "49983", "-", "abc", "e2b", "localhost", "e2b.localhost", "evil", "."),
        *(":", ":8443", ":443", "[", "]", "::1", "0", "65536", "049983", "API", "\u212a", " ", "_", "@", "x" * 48),
    ]
)
HOSTS = st.one_of(st.text(max_size=60), st.lists(FRAGMENTS, max_size=10).map("".join))
HEADER_NAMES = st.one_of(
    st.sampled_from(["e2b-sandbox-id", "E2b-Sandbox-Id", "e2b-sandbox-port", "E2B-SANDBOX-PORT", "host"]),
    st.text(max_size=20),
)
HEADER_VALUES = st.one_of(st.sampled_from(["abc", "49983", "0", "ABC", "", "--x"]), st.text(max_size=20))


def _outcome(host: str, domain: Domain, headers: Headers) -> Route | RouteError:
    try:
        return route(host, domain, headers)
    except RouteError as error:
        return error


@settings(max_examples=500)
@given(
    host=HOSTS,
    configured=st.one_of(st.sampled_from([PLAIN, WITH_PORT]), DOMAIN_TEXTS),
    headers=st.lists(st.tuples(HEADER_NAMES, HEADER_VALUES), max_size=4).map(tuple),
)
def test_arbitrary_input_is_routed_under_the_domain_or_refused(host: str, configured: str, headers: Headers) -> None:
    domain = parse_domain(configured)
    result = _outcome(host, domain, headers)
    if isinstance(result, RouteError):
        assert result.status in (400, 404)
        assert result.message
        return
    assert host.isascii()  # so that lowercasing it below cannot turn a look-alike into ASCII
    if isinstance(result, ControlPlane):
        label = "api"
    elif result.via == "headers":
        label = "sandbox"
    else:
        label = f"{result.port}-{result.sandbox_id}"
    authorities = {domain.name} if domain.port is None else {domain.name, f"{domain.name}:{domain.port}"}
    assert host.lower() in {f"{label}.{authority}" for authority in authorities}
