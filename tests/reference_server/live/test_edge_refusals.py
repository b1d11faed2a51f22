"""Refusals at the real server's edge and control plane: each gets the upstream status and body.

Raw HTTP over the server's TLS listener (trusting its CA, as the clients do), so that hosts,
headers and bodies the official clients would never send can be tried.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from .conftest import LiveServer

pytestmark = [pytest.mark.artifacts]


@pytest.fixture(scope="module")
def http(live_server: LiveServer) -> Iterator[httpx.Client]:
    context = ssl.create_default_context(cafile=live_server.client_env["SSL_CERT_FILE"])
    with httpx.Client(verify=context, timeout=30, trust_env=False) as client:
        yield client


def api(server: LiveServer, path: str) -> str:
    return f"https://api.{server.domain}{path}"


def refused(response: httpx.Response, status: int) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["code"] == status
    assert isinstance(body["message"], str)
    assert body["message"]
    return str(body["message"])


@pytest.fixture(scope="module")
def private_sandbox(live_server: LiveServer, http: httpx.Client) -> Iterator[dict[str, Any]]:
    """A secure sandbox without public traffic: it has both an envd token and a traffic token."""
    key = {"X-API-Key": live_server.client_env["E2B_API_KEY"]}
    body = {"templateID": "base", "timeout": 300, "secure": True, "network": {"allowPublicTraffic": False}}
    created = http.post(api(live_server, "/sandboxes"), json=body, headers=key)
    assert created.status_code == 201, created.text
    yield created.json()
    http.delete(api(live_server, f"/sandboxes/{created.json()['sandboxID']}"), headers=key)


def test_api_keys(live_server: LiveServer, http: httpx.Client) -> None:
    url = api(live_server, "/v2/sandboxes")
    refused(http.get(url), 401)
    refused(http.get(url, headers={"X-API-Key": "e2b_" + "0" * 40}), 401)
    refused(http.get(url, headers={"X-API-Key": "not-a-key"}), 401)
    second = live_server.issue_key("refusals-owner")
    assert http.get(url, headers={"X-API-Key": second}).json() == []


def test_token_scopes_are_separate(
    live_server: LiveServer, http: httpx.Client, private_sandbox: dict[str, Any]
) -> None:
    sandbox_id = private_sandbox["sandboxID"]
    envd_token, traffic_token = private_sandbox["envdAccessToken"], private_sandbox["trafficAccessToken"]
    assert envd_token
    assert traffic_token
    assert envd_token != traffic_token
    envd = f"https://49983-{sandbox_id}.{live_server.domain}"
    files = f"{envd}/files?path=/etc/hostname"
    assert http.get(files, headers={"X-Access-Token": envd_token}).status_code == 200
    assert http.get(files, headers={"X-Access-Token": traffic_token}).status_code == 401, (
        "a traffic token is not envd's"
    )
    assert http.get(files).status_code == 401
    user_port = f"https://8000-{sandbox_id}.{live_server.domain}/"
    refused(http.get(user_port), 403)
    refused(http.get(user_port, headers={"E2B-Traffic-Access-Token": envd_token}), 403)
    refused(http.get(user_port, headers={"E2B-Traffic-Access-Token": traffic_token + "0"}), 403)
    # The right token passes the edge; nothing listens on 8000, so the proxy answers 502.
    passed = refused(http.get(user_port, headers={"E2B-Traffic-Access-Token": traffic_token}), 502)
    assert "8000" in passed


def test_shared_host_routing(live_server: LiveServer, http: httpx.Client, private_sandbox: dict[str, Any]) -> None:
    shared = f"https://sandbox.{live_server.domain}/health"
    headers = {"E2b-Sandbox-Id": private_sandbox["sandboxID"], "E2b-Sandbox-Port": "49983"}
    assert http.get(shared, headers=headers).status_code == 204
    refused(http.get(shared), 400)
    refused(http.get(shared, headers={"E2b-Sandbox-Id": private_sandbox["sandboxID"]}), 400)
    refused(http.get(shared, headers={**headers, "E2b-Sandbox-Port": "0"}), 400)


@pytest.mark.parametrize(
    ("host", "status"),
    [
        ("api.e2b.localhost.evil.invalid", 404),  # suffix trick: our name inside another
        ("evil.invalid", 404),
        ("49983-abc.evil.e2b.localhost", 404),  # one label too deep
        ("www.e2b.localhost", 404),
        ("0-abc.e2b.localhost", 400),
        ("65536-abc.e2b.localhost", 400),
        ("049983-abc.e2b.localhost", 400),  # leading zero
        ("49983--x.e2b.localhost", 400),  # id starting with a hyphen
        ("49983-a..b.e2b.localhost", 400),
        ("49983-abc_d.e2b.localhost", 400),  # not a DNS label
    ],
)
def test_malformed_and_foreign_hosts(live_server: LiveServer, http: httpx.Client, host: str, status: int) -> None:
    with_port = f"{host}:{live_server.port}"
    refused(http.get(api(live_server, "/health"), headers={"Host": with_port}), status)


def test_hosts_are_case_insensitive(live_server: LiveServer, http: httpx.Client) -> None:
    response = http.get(api(live_server, "/health"), headers={"Host": f"API.E2B.LocalHost:{live_server.port}"})
    assert response.status_code == 200


def test_another_port_in_the_host_is_not_ours(live_server: LiveServer, http: httpx.Client) -> None:
    refused(http.get(api(live_server, "/v2/sandboxes"), headers={"Host": "api.e2b.localhost:1"}), 404)


def test_bodies(live_server: LiveServer, http: httpx.Client) -> None:
    key = {"X-API-Key": live_server.client_env["E2B_API_KEY"]}
    url = api(live_server, "/sandboxes")
    refused(http.post(url, content=b"{oops", headers=key), 400)
    refused(http.post(url, json={"templateID": 5}, headers=key), 400)
    refused(http.post(url, json={"templateID": "base", "timeout": "300"}, headers=key), 400)
    refused(http.post(url, content=b"[" + b"0," * (1 << 20) + b"0]", headers=key), 413)
    refused(http.post(url, json={"templateID": "no-such-template"}, headers=key), 404)


def test_a_killed_sandbox_answers_502(live_server: LiveServer, http: httpx.Client) -> None:
    key = {"X-API-Key": live_server.client_env["E2B_API_KEY"]}
    created = http.post(api(live_server, "/sandboxes"), json={"templateID": "base", "timeout": 60}, headers=key).json()
    health = f"https://49983-{created['sandboxID']}.{live_server.domain}/health"
    assert http.get(health).status_code == 204
    assert http.delete(api(live_server, f"/sandboxes/{created['sandboxID']}"), headers=key).status_code == 204
    refused(http.get(health), 502)
    refused(http.get(f"https://49983-neverexisted.{live_server.domain}/health"), 502)


def test_secrets_stay_out_of_the_log(live_server: LiveServer) -> None:
    key = live_server.client_env["E2B_API_KEY"]
    # The printed client environment is the one place the key may appear.
    log = live_server.log.read_text().replace(f"export E2B_API_KEY={key}", "")
    assert key not in log
    assert os.path.exists(live_server.data_dir / "client.env")
    assert (os.stat(live_server.data_dir / "client.env").st_mode & 0o077) == 0
