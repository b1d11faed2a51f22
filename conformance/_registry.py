"""A real OCI registry (Debian's distribution registry) on loopback, and images pushed to it.

For the cases that build templates from registry images (``Case.registry``) and for the tests.
The image is made here, not pulled from anywhere: a small userland (bash, coreutils, tar,
useradd and the libraries they load) copied out of a root directory: the harness host's own
``/``, or (the tests) the ``os`` template layer. It has no Python, so a sandbox of it shows that
the endpoint's agent needs none from the image. Its second layer exercises the unpacker: a
whiteout, an opaque folder, a file with its own owner and mode. Images are pushed with the
registry's HTTP API (blob upload, manifest put), as any client pushes them.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import bcrypt
import httpx

REGISTRY_BINARY = "/usr/bin/docker-registry"
# What the small userland holds: the shell and tools template build steps use.
TOOLS = (
    "/usr/bin/bash",
    "/usr/bin/dash",
    "/usr/bin/tar",
    "/usr/bin/gzip",
    "/usr/bin/find",
    "/usr/bin/grep",
    "/usr/bin/sed",
    "/usr/bin/getent",
    "/usr/sbin/useradd",
    "/usr/sbin/groupadd",
    *(
        f"/usr/bin/{name}"
        for name in [
            "cat",
            "basename",
            "chmod",
            "chown",
            "cp",
            "cut",
            "dirname",
            "echo",
            "env",
            "id",
            "ln",
            "ls",
            "mkdir",
            "mv",
            "pwd",
            "readlink",
            "rm",
            "sleep",
            "stat",
            "test",
            "touch",
            "true",
            "false",
            "uname",
            "whoami",
            "head",
            "tail",
            "wc",
            "sort",
        ]
    ),
)
ETC = (
    "etc/passwd",
    "etc/group",
    "etc/shadow",
    "etc/gshadow",
    "etc/login.defs",
    "etc/default/useradd",
    "etc/nsswitch.conf",
)
_ACCOUNTS = {
    "etc/passwd": b"root:x:0:0:root:/root:/bin/bash\n",
    "etc/group": b"root:x:0:\n",
    "etc/shadow": b"root:*:19000:0:99999:7:::\n",
    "etc/gshadow": b"root:*::\n",
}
MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
INDEX_TYPE = "application/vnd.oci.image.index.v1+json"


@dataclass(frozen=True)
class Registry:
    host: str  # 127.0.0.1:port
    storage: Path
    username: str | None = None
    password: str | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}"

    def client(self) -> httpx.Client:
        auth = (self.username, self.password) if self.username and self.password else None
        return httpx.Client(base_url=self.url, auth=auth, timeout=60)

    def blob_path(self, digest: str) -> Path:
        hexdigest = digest.split(":", 1)[1]
        return self.storage / "docker/registry/v2/blobs/sha256" / hexdigest[:2] / hexdigest / "data"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.contextmanager
def local_registry(*, username: str | None = None, password: str | None = None) -> Iterator[Registry]:
    """A registry on 127.0.0.1 with its own storage; basic auth when a username is given. Stopped after."""
    problem = registry_problem()
    if problem is not None:
        raise RegistryUnavailableError(problem)
    folder = Path(tempfile.mkdtemp(prefix="e2b-registry-", dir="/var/tmp"))
    port = _free_port()
    auth = ""
    if username and password:
        hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=4)).decode()
        (folder / "htpasswd").write_text(f"{username}:{hashed}\n")
        auth = f"auth:\n  htpasswd:\n    realm: e2b-compat-tests\n    path: {folder / 'htpasswd'}\n"
    config = (
        "version: 0.1\nlog:\n  level: warn\n"
        f"storage:\n  filesystem:\n    rootdirectory: {folder / 'data'}\n  delete:\n    enabled: true\n"
        f"http:\n  addr: 127.0.0.1:{port}\n{auth}"
    )
    (folder / "config.yml").write_text(config)
    log = (folder / "registry.log").open("wb")
    proc = subprocess.Popen(
        [REGISTRY_BINARY, "serve", str(folder / "config.yml")],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,  # its own process group: stopped by that, nothing else
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the registry exited: {(folder / 'registry.log').read_text()[-2000:]}")
            try:
                httpx.get(f"http://127.0.0.1:{port}/v2/", timeout=1)
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline:
                    raise RuntimeError("the registry did not answer within 30 s") from None
                time.sleep(0.1)
        yield Registry(f"127.0.0.1:{port}", folder / "data", username, password)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
        shutil.rmtree(folder, ignore_errors=True)


# -- images ----------------------------------------------------------------------------


class RegistryUnavailableError(RuntimeError):
    """This host cannot run the registry (the message says what to install)."""


def registry_problem() -> str | None:
    """Why no registry can be started here, or None."""
    if not Path(REGISTRY_BINARY).exists():
        return f"{REGISTRY_BINARY} is not installed (Debian package docker-registry)"
    return None


def _ldd(os_rootfs: Path, paths: list[str]) -> set[str]:
    # Through the tree's own ldd, so its libraries are found where its loader looks.
    inside = [] if os_rootfs == Path("/") else ["chroot", str(os_rootfs)]
    out = subprocess.run([*inside, "/usr/bin/ldd", *paths], capture_output=True, text=True, check=True).stdout
    found = set()
    for line in out.splitlines():
        parts = line.split()
        if "=>" in parts and len(parts) > parts.index("=>") + 1 and parts[parts.index("=>") + 1].startswith("/"):
            found.add(parts[parts.index("=>") + 1])
        elif parts and parts[0].startswith("/") and parts[0] != paths[0]:
            found.add(parts[0].rstrip(":"))
    return {path for path in found if not path.endswith(":")}


def _resolve(os_rootfs: Path, path: str) -> Path:
    """``path`` with its symlinks followed inside ``os_rootfs`` (never into the host's own files)."""
    current = "/"
    for _ in range(40):
        parts = [part for part in path.split("/") if part]
        for index, part in enumerate(parts):
            candidate = os.path.join(current, part)
            host = os_rootfs / candidate.lstrip("/")
            if host.is_symlink():
                target = os.readlink(host)
                base = "/" if target.startswith("/") else current
                path = os.path.normpath(os.path.join(base, target, *parts[index + 1 :]))
                current = "/"
                break
            current = candidate
        else:
            return os_rootfs / current.lstrip("/")
    raise RuntimeError(f"too many symlinks under {path}")


_MERGED = (("lib64/", "usr/lib64/"), ("lib/", "usr/lib/"), ("bin/", "usr/bin/"), ("sbin/", "usr/sbin/"))


def _add(tar: tarfile.TarFile, os_rootfs: Path, path: str) -> None:
    """``path`` of the os layer into the layer, resolving symlinks (merged /usr) to their file."""
    source = _resolve(os_rootfs, path)
    name = path.lstrip("/")
    for old, new in _MERGED:
        if name.startswith(old):
            name = new + name[len(old) :]
    info = tar.gettarinfo(str(source), arcname=name)
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    with source.open("rb") as data:
        tar.addfile(info, data)


def _dir(tar: tarfile.TarFile, name: str, mode: int = 0o755) -> None:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE
    info.mode = mode
    tar.addfile(info)


def _file(tar: tarfile.TarFile, name: str, data: bytes, *, mode: int = 0o644, uid: int = 0) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = mode
    info.uid = info.gid = uid
    tar.addfile(info, io.BytesIO(data))


def _symlink(tar: tarfile.TarFile, name: str, target: str) -> None:
    info = tarfile.TarInfo(name)
    info.type = tarfile.SYMTYPE
    info.linkname = target
    tar.addfile(info)


def userland_layer(os_rootfs: Path = Path("/")) -> bytes:
    """A tar of the small userland of ``os_rootfs`` (merged /usr: /bin, /lib, /lib64 and /sbin are symlinks)."""
    buffer = io.BytesIO()
    tools = [tool for tool in TOOLS if os.path.lexists(os_rootfs / tool.lstrip("/"))]
    libraries = _ldd(os_rootfs, tools)
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for folder in ("usr", "usr/bin", "usr/sbin", "usr/lib", "usr/lib/x86_64-linux-gnu", "usr/lib64", "etc"):
            _dir(tar, folder)
        for folder in ("etc/default", "tmp", "root", "home", "opt", "opt/old", "srv"):
            _dir(tar, folder, 0o1777 if folder == "tmp" else 0o755)
        for link, target in (("bin", "usr/bin"), ("sbin", "usr/sbin"), ("lib", "usr/lib"), ("lib64", "usr/lib64")):
            _symlink(tar, link, target)
        _symlink(tar, "usr/bin/sh", "dash")
        for path in sorted({*tools, *libraries}):
            _add(tar, os_rootfs, path)
        for path in ETC:
            if path in _ACCOUNTS:
                # Only root, and no password hash of the source's: the image has no sandbox user
                # of its own (the endpoint adds one) and nothing of the harness host's secrets.
                _file(tar, path, _ACCOUNTS[path], mode=0o640 if "shadow" in path else 0o644)
            elif (os_rootfs / path).is_file():
                _file(tar, path, (os_rootfs / path).read_bytes())
        _file(tar, "etc/motd", b"removed by the second layer\n")
        _file(tar, "opt/old/gone.txt", b"hidden by the opaque folder\n")
    return buffer.getvalue()


def changes_layer() -> bytes:
    """The second layer: a whiteout of /etc/motd, /opt/old made opaque, a file with its own mode and owner."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        _file(tar, "etc/.wh.motd", b"")
        _dir(tar, "opt/old")
        _file(tar, "opt/old/.wh..wh..opq", b"")
        _file(tar, "opt/old/kept.txt", b"from the second layer\n")
        _file(tar, "srv/greeting.txt", b"hello from the image\n", mode=0o640, uid=1234)
    return buffer.getvalue()


@dataclass(frozen=True)
class Pushed:
    reference: str  # host/repo:tag
    digest: str  # of the manifest
    layers: tuple[str, ...]  # layer digests


def _upload(client: httpx.Client, repository: str, data: bytes) -> str:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    if client.head(f"/v2/{repository}/blobs/{digest}").status_code == 200:
        return digest
    started = client.post(f"/v2/{repository}/blobs/uploads/")
    started.raise_for_status()
    location = started.headers["location"]
    joiner = "&" if "?" in location else "?"
    done = client.put(
        f"{location}{joiner}digest={digest}", content=data, headers={"content-type": "application/octet-stream"}
    )
    done.raise_for_status()
    return digest


def push_image(
    registry: Registry,
    repository: str,
    tag: str,
    layers: list[bytes],
    *,
    env: dict[str, str] | None = None,
    workdir: str | None = None,
    as_index: bool = False,
) -> Pushed:
    """Push gzip layers, a config and a manifest (inside an index when ``as_index``); the result's digests."""
    compressed = [gzip.compress(layer, compresslevel=1, mtime=0) for layer in layers]
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "Env": [f"{k}={v}" for k, v in (env or {}).items()],
            **({"WorkingDir": workdir} if workdir else {}),
            "Cmd": ["/bin/bash"],
        },
        "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(layer).hexdigest() for layer in layers]},
    }
    config_bytes = json.dumps(config).encode()
    with registry.client() as client:
        layer_digests = [_upload(client, repository, data) for data in compressed]
        config_digest = _upload(client, repository, config_bytes)
        manifest = {
            "schemaVersion": 2,
            "mediaType": MANIFEST_TYPE,
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": config_digest,
                "size": len(config_bytes),
            },
            "layers": [
                {"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": d, "size": len(data)}
                for d, data in zip(layer_digests, compressed, strict=True)
            ],
        }
        manifest_bytes = json.dumps(manifest).encode()
        digest = "sha256:" + hashlib.sha256(manifest_bytes).hexdigest()
        target, body, media = digest if as_index else tag, manifest_bytes, MANIFEST_TYPE
        client.put(
            f"/v2/{repository}/manifests/{target}", content=body, headers={"content-type": media}
        ).raise_for_status()
        if as_index:
            index = {
                "schemaVersion": 2,
                "mediaType": INDEX_TYPE,
                "manifests": [
                    {
                        "mediaType": MANIFEST_TYPE,
                        "digest": digest,
                        "size": len(manifest_bytes),
                        "platform": {"os": "linux", "architecture": "amd64"},
                    }
                ],
            }
            client.put(
                f"/v2/{repository}/manifests/{tag}",
                content=json.dumps(index).encode(),
                headers={"content-type": INDEX_TYPE},
            ).raise_for_status()
    return Pushed(f"{registry.host}/{repository}:{tag}", digest, tuple(layer_digests))


# -- what the harness offers the cases -------------------------------------------------


@dataclass(frozen=True)
class RegistryOffer:
    """A private image for the cases (``Case.registry``), as the scenarios receive it."""

    reference: str
    username: str
    password: str = field(repr=False)

    def env(self) -> dict[str, str]:
        return {"IMAGE_REF": self.reference, "IMAGE_USERNAME": self.username, "IMAGE_PASSWORD": self.password}


IMAGE_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "IMAGE_VAR": "from-the-image"}


@contextlib.contextmanager
def offered_image(source_root: Path = Path("/")) -> Iterator[RegistryOffer]:
    """A registry behind basic auth (a password of this run's own) holding the small userland image."""
    password = secrets.token_urlsafe(18)
    with local_registry(username="conformance", password=password) as registry:
        layers = [userland_layer(source_root), changes_layer()]
        pushed = push_image(registry, "conformance/userland", "1", layers, env=IMAGE_ENV, as_index=True)
        yield RegistryOffer(pushed.reference, "conformance", password)
