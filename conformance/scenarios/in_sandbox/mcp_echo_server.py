"""Runs inside a sandbox (its own python3): a stdio MCP server with no dependencies, the repository
the ``sandbox/lifecycle/mcp`` scenarios and the gateway's tests clone and start.

It speaks JSON-RPC 2.0, one message per line, as MCP's stdio transport does, and answers the
handshake, ``tools/list``, ``tools/call`` (``echo`` and ``whoami``), ``prompts/list``,
``prompts/get``, ``resources/list``, ``resources/read`` and ``ping``. Its name and the prefix
``echo`` adds come from ``ECHO_NAME`` and ``ECHO_PREFIX``, so a test sees the server's envs arrive.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

NAME = os.environ.get("ECHO_NAME", "echo")
PREFIX = os.environ.get("ECHO_PREFIX", "")
SUPPORTED = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
TOOLS = [
    {
        "name": f"{NAME}",
        "description": "Answers with its text argument, after ECHO_PREFIX.",
        "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
    },
    {
        "name": f"{NAME}-whoami",
        "description": "Answers with the server's user id and working folder.",
        "inputSchema": {"type": "object", "properties": {}},
    },
]
PROMPT = {"name": f"{NAME}-prompt", "description": "A fixed prompt.", "arguments": []}
RESOURCE = {"uri": f"fixture://{NAME}/readme", "name": f"{NAME}-readme", "mimeType": "text/plain"}


def text(value: str) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": value}], "isError": False}


def answer(method: str, params: dict[str, Any]) -> dict[str, Any]:
    if method == "initialize":
        asked = params.get("protocolVersion")
        return {
            "protocolVersion": asked if asked in SUPPORTED else SUPPORTED[-1],
            "capabilities": {"tools": {}, "prompts": {}, "resources": {}},
            "serverInfo": {"name": NAME, "version": "1.0.0"},
        }
    if method == "ping":
        return {}
    if method == "tools/list":
        return {"tools": TOOLS}
    if method == "tools/call":
        if params["name"] == NAME:
            return text(PREFIX + params.get("arguments", {}).get("text", ""))
        if params["name"] == f"{NAME}-whoami":
            return text(f"{os.getuid()} {os.getcwd()}")
        raise KeyError(params["name"])
    if method == "prompts/list":
        return {"prompts": [PROMPT]}
    if method == "prompts/get":
        return {"messages": [{"role": "user", "content": {"type": "text", "text": f"hello from {NAME}"}}]}
    if method == "resources/list":
        return {"resources": [RESOURCE]}
    if method == "resources/read":
        return {"contents": [{"uri": params["uri"], "mimeType": "text/plain", "text": f"{NAME} readme"}]}
    raise LookupError(method)


def main() -> None:
    for line in sys.stdin:
        message = json.loads(line)
        if "id" not in message:
            continue  # a notification (initialized, cancelled): nothing to answer
        reply: dict[str, Any] = {"jsonrpc": "2.0", "id": message["id"]}
        try:
            reply["result"] = answer(message["method"], message.get("params") or {})
        except LookupError as exc:
            reply["error"] = {"code": -32601, "message": f"unknown method or name {exc}"}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
