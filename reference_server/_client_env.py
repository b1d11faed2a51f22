"""What the unchanged official clients need to be told to use this server: four environment variables.

- ``E2B_API_KEY``: a key of this server;
- ``E2B_DOMAIN``: ``<domain>:<port>``. Both clients build every host name from it by prefixing
  labels (``api.``, ``<port>-<sandboxID>.``), so the port travels inside the "domain"; it is left
  out only for 443, which the clients use when none is given;
- ``SSL_CERT_FILE`` (Python clients) and ``NODE_EXTRA_CA_CERTS`` (the JS client): the server's
  local CA, which both accept as an extra trust anchor.

The serve command prints them (``banner``) and writes them to a file a POSIX shell can source
(``write``). The file holds the API key, so it is written like a key: private (0600) and atomic.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from ._credentials import is_api_key, redact
from ._keys import write_private_file

__all__ = ["ClientEnvironment", "domain_with_port"]

DEFAULT_HTTPS_PORT = 443


def domain_with_port(domain: str, port: int) -> str:
    """``E2B_DOMAIN``'s value: ``domain:port``, or just ``domain`` when the port is 443."""
    return domain if port == DEFAULT_HTTPS_PORT else f"{domain}:{port}"


@dataclass(frozen=True, repr=False)
class ClientEnvironment:
    """The four variables for one server; reprs redact the key."""

    api_key: str
    domain_with_port: str
    ca_file: Path

    def __post_init__(self) -> None:
        if not is_api_key(self.api_key):
            raise ValueError(f"not an API key: {redact(self.api_key)}")
        if not self.domain_with_port:
            raise ValueError("the domain must not be empty")

    @classmethod
    def for_server(cls, api_key: str, domain: str, port: int, ca_file: Path) -> ClientEnvironment:
        return cls(api_key, domain_with_port(domain, port), ca_file)

    def __repr__(self) -> str:
        return (
            f"ClientEnvironment(api_key={redact(self.api_key)!r}, domain_with_port={self.domain_with_port!r}, "
            f"ca_file={str(self.ca_file)!r})"
        )

    def as_dict(self) -> dict[str, str]:
        ca_file = str(self.ca_file)
        return {
            "E2B_API_KEY": self.api_key,
            "E2B_DOMAIN": self.domain_with_port,
            "SSL_CERT_FILE": ca_file,
            "NODE_EXTRA_CA_CERTS": ca_file,
        }

    def render_shell(self) -> str:
        """``export NAME=value`` lines, each value quoted for a POSIX shell."""
        return "".join(f"export {name}={shlex.quote(value)}\n" for name, value in self.as_dict().items())

    def write(self, path: Path) -> None:
        """Write the exports to ``path`` (mode 0600, atomically): ``. path`` then sets up a shell."""
        header = "# E2B client environment for the e2b-compat server. Holds an API key: keep it private.\n"
        write_private_file(path, header + self.render_shell())

    def banner(self, path: Path) -> str:
        """The block the serve command prints: the exports, and how to load them from ``path`` instead."""
        return (
            "Point the official E2B clients at this server with:\n\n"
            + "".join(f"    {line}\n" for line in self.render_shell().splitlines())
            + f"\nor, in a shell: source {shlex.quote(str(path))}\n"
        )
