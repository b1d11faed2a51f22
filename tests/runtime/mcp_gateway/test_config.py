"""The gateway's configuration: the clients' ``mcp`` mapping accepted, or refused with the reason."""

from __future__ import annotations

import pytest

from runtime.mcp_gateway import ConfigError, StdioServer, parse_config


def test_github_servers_are_read_in_order_with_their_commands_and_envs() -> None:
    servers = parse_config(
        {
            "github/example/echo": {"runCmd": "python3 server.py", "installCmd": "pip install .", "envs": {"A": "1"}},
            "github/Other-Org/my.repo_2": {"runCmd": "npx ."},
        }
    )
    assert servers == (
        StdioServer("github/example/echo", "example", "echo", "python3 server.py", "pip install .", {"A": "1"}),
        StdioServer("github/Other-Org/my.repo_2", "Other-Org", "my.repo_2", "npx ."),
    )
    assert servers[0].clone_url == "https://github.com/example/echo.git"
    assert parse_config({}) == ()


@pytest.mark.parametrize(
    ("config", "words"),
    [
        ([], "must be an object of servers"),
        ({"": {}}, "non-empty string"),
        ({"duckduckgo": {}}, "MCP server 'duckduckgo' is from the catalogue"),
        ({"github": {"personalAccessToken": "x"}}, "MCP server 'github' is from the catalogue"),
        ({"github/a": {"runCmd": "x"}}, "expected 'github/<owner>/<repository>'"),
        ({"github/a/b/c": {"runCmd": "x"}}, "expected 'github/<owner>/<repository>'"),
        ({"github/-a/b": {"runCmd": "x"}}, "expected 'github/<owner>/<repository>'"),
        ({"github/a-/b": {"runCmd": "x"}}, "expected 'github/<owner>/<repository>'"),
        ({"github/a/b c": {"runCmd": "x"}}, "expected 'github/<owner>/<repository>'"),
        ({"github/a/..": {"runCmd": "x"}}, "'..' is not a repository name"),
        ({"github/a/.": {"runCmd": "x"}}, "'.' is not a repository name"),
        ({"github/a/b": "python3 x.py"}, "expected an object with runCmd"),
        ({"github/a/b": {}}, "runCmd must be a non-empty string"),
        ({"github/a/b": {"runCmd": "  "}}, "runCmd must be a non-empty string"),
        ({"github/a/b": {"runCmd": "a\0b"}}, "without NUL"),
        ({"github/a/b": {"runCmd": "x" * 8193}}, "at most 8192 characters"),
        ({"github/a/b": {"runCmd": "x", "installCmd": 3}}, "installCmd must be a non-empty string"),
        ({"github/a/b": {"runCmd": "x", "envs": ["A=1"]}}, "envs must be an object of strings"),
        ({"github/a/b": {"runCmd": "x", "envs": {"1A": "x"}}}, "'1A' is not an environment variable name"),
        ({"github/a/b": {"runCmd": "x", "envs": {"A": 1}}}, "envs['A'] must be a string"),
        ({"github/a/b": {"runCmd": "x", "cwd": "/"}}, "unknown fields cwd"),
        # One refused server refuses the whole mapping: no gateway starts with part of it.
        ({"github/a/b": {"runCmd": "x"}, "notion": {}}, "'notion' is from the catalogue"),
    ],
)
def test_what_cannot_run_is_refused_with_the_server_and_the_reason(config: object, words: str) -> None:
    with pytest.raises(ConfigError) as refused:
        parse_config(config)
    assert words in str(refused.value)
