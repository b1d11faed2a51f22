"""What each template layer is built from, and the content keys that name its cache folder.

A key is the sha256 of a recipe written as canonical JSON. The ``os`` recipe holds what
debootstrap and the set-up steps are given (suite, variant, architecture, sorted
packages, the user) and a version number to bump when a step changes; not the mirror,
which says where the same packages come from, not which. The ``base`` recipe holds the
``os`` key and a digest of the project's source tree as it is on disk: any edit under a
package folder or to ``pyproject.toml`` gives a new template, an unchanged tree the
cached one. Built wheels are not hashed: their bytes differ from build to build.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from contract.protocol import ENVD_PORT, INTERPRETER_PORT

from ._commands import TemplateError

__all__ = [
    "AGENT_COMMAND",
    "OS_PACKAGES",
    "PACKAGE_DIRS",
    "SourceTree",
    "base_layer_key",
    "base_recipe",
    "debian_arch",
    "interpreter_recipe",
    "kernels_recipe",
    "mcp_layer_recipe",
    "mcp_template_recipe",
    "os_layer_key",
    "os_recipe",
    "read_source_tree",
    "recipe_key",
]

# Bump when a build step changes what ends up in the layer without changing its inputs.
OS_RECIPE_VERSION = 1
BASE_RECIPE_VERSION = 2  # 2: /etc/profile takes bash's $EUID (_build._profile_without_id_fork)
INTERPRETER_RECIPE_VERSION = 3  # 3: the kernels layer's removals applied
KERNELS_RECIPE_VERSION = 3  # 3: the overlay's upper folder with Debian packages
MCP_LAYER_RECIPE_VERSION = 1
MCP_TEMPLATE_RECIPE_VERSION = 1

SUITE = "bookworm"
VARIANT = "minbase"
OS_PACKAGES = (
    "bash",
    "python3",
    "python3-venv",  # the agent's virtualenv is made by the rootfs's own python
    "curl",
    "git",
    "sudo",
    "procps",
    "ca-certificates",
    "tini",  # the init the runtime runs as PID 1
    "iproute2",
    # What the clients' default base image offers their builds: python, pip, node (npm below).
    "python-is-python3",
    "python3-pip",
    "nodejs",
)
# npm from the npm registry, pinned (Debian's npm is some 350 packages of node modules; the
# registry's tarball bundles its own): unpacked where Node's own distributions put it.
NPM_VERSION = "10.9.2"  # needs node ^18.17: bookworm's nodejs is 18.20
NPM_SHA256 = "5cd1e5ab971ea6333f910bc2d50700167c5ef4e66da279b2a3efc874c6b116e4"
NPM_INTEGRITY = "sha512-iriPEPIkoMYUy3F6f3wwSZAU93E0Eg6cHwIR6jzzOXWSy+SD/rOODEs74cVONHKSx2obXtuUoyidVEhISrisgQ=="
USER = "user"
USER_ID = 1000
USER_HOME = "/home/user"
USER_SHELL = "/bin/bash"
# Written in place of the host's copies debootstrap leaves behind (see _build._trim).
HOSTS = b"127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"

VENV = "/opt/e2b-compat/venv"
DISTRIBUTION = "e2b-compat"
AGENT_PORT = ENVD_PORT
# In a sandbox the agent listens on every address of the sandbox's own network namespace.
AGENT_COMMAND = (f"{VENV}/bin/python", "-m", "runtime.agent", "--host", "0.0.0.0", "--port", str(AGENT_PORT))  # noqa: S104

# code-interpreter-v1: the kernels' own environment (``_kernels``), owned by the sandbox user so
# that ``pip install`` from a kernel works as it does upstream, and the interpreter server,
# which the agent starts as the sandbox user before it serves (``runtime.agent._services``).
INTERPRETER_TEMPLATE = "code-interpreter-v1"
KERNEL_VENV = "/opt/e2b-compat/kernel"
INTERPRETER_COMMAND = (
    f"{VENV}/bin/python",
    "-m",
    "runtime.interpreter",
    "--host",
    "0.0.0.0",  # noqa: S104 (the sandbox's own network namespace)
    "--port",
    str(INTERPRETER_PORT),
    "--kernel-python",
    f"{KERNEL_VENV}/bin/python",
)
INTERPRETER_AGENT_COMMAND = (
    *AGENT_COMMAND,
    "--service",
    f"{INTERPRETER_PORT}={shlex.join(INTERPRETER_COMMAND)}",
    "--service-user",
    USER,
)

# mcp-gateway: the MCP SDK's own locked environment (root's: the gateway runs as root), the
# gateway package (``runtime.mcp_gateway``) copied into it under a name of its own, and the
# ``mcp-gateway`` command the clients run (see ``_mcp``).
MCP_TEMPLATE = "mcp-gateway"
MCP_VENV = "/opt/e2b-compat/mcp"
MCP_PACKAGE = "e2b_compat_mcp_gateway"
MCP_COMMAND = "/usr/local/bin/mcp-gateway"

# The package folders of the distribution (pyproject ``packages.find``); their files are the key.
PACKAGE_DIRS = ("contract", "runtime", "conformance", "reference_server", "e2b_compat", "benchmarks")
# Needed to build the wheel (``readme =``) but not part of what runs: copied, not hashed.
BUILD_ONLY_FILES = ("README.md",)

_DEBIAN_ARCH = {"x86_64": "amd64", "aarch64": "arm64"}


def debian_arch(machine: str | None = None) -> str:
    """Debian's name for this machine's architecture (the rootfs runs on this kernel)."""
    name = machine if machine is not None else platform.machine()
    try:
        return _DEBIAN_ARCH[name]
    except KeyError:
        raise TemplateError(f"templates are built for {sorted(_DEBIAN_ARCH)}, not {name!r}") from None


def recipe_key(recipe: Mapping[str, object]) -> str:
    """sha256 (hex) of the recipe as canonical JSON."""
    text = json.dumps(recipe, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def os_recipe(arch: str | None = None) -> dict[str, object]:
    """The ``os`` layer's recipe: debootstrap's inputs and the set-up done after it."""
    return {
        "layer": "os",
        "version": OS_RECIPE_VERSION,
        "suite": SUITE,
        "variant": VARIANT,
        "arch": arch if arch is not None else debian_arch(),
        "packages": sorted(OS_PACKAGES),
        "npm": {"version": NPM_VERSION, "sha256": NPM_SHA256},
        "user": {"name": USER, "uid": USER_ID, "gid": USER_ID, "home": USER_HOME, "shell": USER_SHELL},
        "sudo": "NOPASSWD",
    }


def os_layer_key(arch: str | None = None) -> str:
    return recipe_key(os_recipe(arch))


@dataclass(frozen=True)
class SourceTree:
    """The project's files as read once: hashed for the key, then written out for ``pip wheel``.

    Reading the bytes once and building from the same bytes means the wheel holds
    exactly what the key describes, even if the checkout changes during the build.
    """

    pyproject: bytes
    files: tuple[tuple[str, bytes], ...]  # (posix path relative to the repo, content), sorted
    build_only: tuple[tuple[str, bytes], ...]

    def digest(self) -> str:
        """sha256 over ``path\\0sha256(content)\\n`` of every file, in path order."""
        listing = hashlib.sha256()
        for path, data in self.files:
            listing.update(f"{path}\0{hashlib.sha256(data).hexdigest()}\n".encode())
        return listing.hexdigest()

    def write_to(self, dest: Path) -> None:
        """Recreate the tree (``pyproject.toml``, build-only files, package files) under ``dest``."""
        for path, data in (("pyproject.toml", self.pyproject), *self.build_only, *self.files):
            target = dest / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)


def read_source_tree(repo: Path) -> SourceTree:
    """``pyproject.toml`` and every file under ``PACKAGE_DIRS`` (``__pycache__`` left out)."""
    try:
        pyproject = (repo / "pyproject.toml").read_bytes()
    except OSError as exc:
        raise TemplateError(f"{repo} is not an e2b-compat checkout (no readable pyproject.toml): {exc}") from exc
    files: list[tuple[str, bytes]] = []
    try:
        for package in PACKAGE_DIRS:
            for dirpath, dirnames, filenames in os.walk(repo / package):
                dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
                for name in filenames:
                    path = Path(dirpath, name)
                    files.append((path.relative_to(repo).as_posix(), path.read_bytes()))
        build_only = tuple((name, (repo / name).read_bytes()) for name in BUILD_ONLY_FILES if (repo / name).is_file())
    except OSError as exc:
        raise TemplateError(f"could not read the sources in {repo}: {exc}") from exc
    return SourceTree(pyproject=pyproject, files=tuple(sorted(files)), build_only=build_only)


def base_recipe(os_key: str, tree: SourceTree) -> dict[str, object]:
    """The ``base`` layer's recipe: the ``os`` layer it starts from and the project's sources."""
    return {
        "layer": "base",
        "version": BASE_RECIPE_VERSION,
        "os_key": os_key,
        "venv": VENV,
        "distribution": DISTRIBUTION,
        "agent_command": list(AGENT_COMMAND),
        "pyproject_sha256": hashlib.sha256(tree.pyproject).hexdigest(),
        "sources_sha256": tree.digest(),
        "source_files": len(tree.files),
    }


def base_layer_key(os_key: str, repo: Path) -> str:
    """The key of the ``base`` template built from ``repo`` on the ``os`` layer ``os_key``."""
    return recipe_key(base_recipe(os_key, read_source_tree(repo)))


def kernels_recipe(os_key: str, lock: bytes, packages: bytes) -> dict[str, object]:
    """The ``kernels`` layer's recipe: the ``os`` layer it is installed on, the wheel and package locks."""
    return {
        "layer": "kernels",
        "version": KERNELS_RECIPE_VERSION,
        "os_key": os_key,
        "kernel_venv": KERNEL_VENV,
        "owner": USER_ID,
        "kernel_lock_sha256": hashlib.sha256(lock).hexdigest(),
        "package_lock_sha256": hashlib.sha256(packages).hexdigest(),
    }


def interpreter_recipe(base_key: str, kernels_key: str) -> dict[str, object]:
    """``code-interpreter-v1``'s recipe: the ``base`` layer it copies and the ``kernels`` layer put on it."""
    return {
        "layer": INTERPRETER_TEMPLATE,
        "version": INTERPRETER_RECIPE_VERSION,
        "base_key": base_key,
        "kernels_key": kernels_key,
        "agent_command": list(INTERPRETER_AGENT_COMMAND),
    }


def mcp_layer_recipe(os_key: str, lock: bytes) -> dict[str, object]:
    """The ``mcp`` layer's recipe: the ``os`` layer it is installed on and the MCP SDK's wheel lock."""
    return {
        "layer": "mcp",
        "version": MCP_LAYER_RECIPE_VERSION,
        "os_key": os_key,
        "venv": MCP_VENV,
        "lock_sha256": hashlib.sha256(lock).hexdigest(),
    }


def mcp_template_recipe(base_key: str, mcp_key: str) -> dict[str, object]:
    """``mcp-gateway``'s recipe: the ``base`` layer (whose sources hold the gateway) and the ``mcp`` layer."""
    return {
        "layer": MCP_TEMPLATE,
        "version": MCP_TEMPLATE_RECIPE_VERSION,
        "base_key": base_key,
        "mcp_key": mcp_key,
        "package": MCP_PACKAGE,
        "command": MCP_COMMAND,
        "agent_command": list(AGENT_COMMAND),
    }
