"""The agent's in-memory state: token, environment, default user and workdir.

Everything lives in memory, as in envd: a restart of the agent forgets it all.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hmac
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from ._errors import AgentError, ErrorKind
from ._metadata import METADATA_DIR
from ._users import UnknownUserError, User, UserDatabase

# Set by the agent itself; /init cannot set or remove them.
INTERNAL_NAMES = frozenset({"E2B_SANDBOX", "E2B_SANDBOX_ID", "E2B_TEMPLATE_ID", "E2B_EVENTS_ADDRESS"})
_FROM_RUNTIME = ("E2B_SANDBOX_ID", "E2B_TEMPLATE_ID")  # what the runtime puts in the agent's environment


def internal_env(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """``E2B_SANDBOX=true``, and the sandbox's and template's ids when the runtime gave them to the agent.

    envd learns the ids from the VM's metadata service; here the runtime sets them in the agent's
    own environment (the container's). Every process the agent starts sees them, as with envd.
    """
    return {"E2B_SANDBOX": "true", **{name: environ[name] for name in _FROM_RUNTIME if environ.get(name)}}


class UserError(AgentError):
    """The request names a user that does not exist (``unauthenticated``, HTTP 401)."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorKind.UNAUTHENTICATED, message)


@dataclass
class AgentState:
    users: UserDatabase = field(default_factory=UserDatabase)
    access_token: str | None = None
    env_vars: dict[str, str] = field(default_factory=dict)
    default_user: str = "root"
    default_workdir: str | None = None
    last_init: datetime | None = None
    init_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    internal: dict[str, str] = field(default_factory=internal_env)
    metadata_dir: Path = METADATA_DIR  # what the runtime publishes (``_metadata``)

    def global_env(self) -> dict[str, str]:
        return {**self.env_vars, **self.internal}

    def token_matches(self, presented: str | None) -> bool:
        """Constant-time comparison with the access token (True when none is set)."""
        if self.access_token is None:
            return True
        if presented is None:
            return False
        return hmac.compare_digest(presented.encode(), self.access_token.encode())

    def default(self) -> User:
        try:
            return self.users.lookup(self.default_user)
        except UnknownUserError:
            raise UserError(f"invalid default user: '{self.default_user}'") from None

    def user_from_basic(self, authorization: str | None) -> User:
        """The user an RPC acts as: ``Authorization: Basic base64(user:…)``, else the default."""
        name = basic_user(authorization)
        if name is None:
            return self.default()
        try:
            return self.users.lookup(name)
        except UnknownUserError:
            raise UserError(f"invalid username: '{name}'") from None

    def user_by_name(self, name: str | None) -> User:
        """The user a ``/files`` request acts as: the ``username`` parameter, else the default."""
        if name is None:
            return self.default()
        try:
            return self.users.lookup(name)
        except UnknownUserError:
            raise UserError(f"error looking up user '{name}': user: unknown user {name}") from None


def basic_user(authorization: str | None) -> str | None:
    """The user name of a Basic ``Authorization`` header; None when absent or malformed."""
    if not authorization:
        return None
    scheme, _, value = authorization.partition(" ")
    if scheme.lower() != "basic" or not value:
        return None
    try:
        decoded = base64.b64decode(value.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None
    name, sep, _password = decoded.partition(":")
    return name if sep else None
