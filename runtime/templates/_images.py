"""Templates from OCI images: pull by digest, verify, unpack, and give the rootfs our agent.

Why like this:

- **Pulling is skopeo's, unpacking umoci's** (Debian packages): registry auth (basic and
  bearer challenges), manifest lists, mirrors, retries and layer digests are what skopeo does
  well, and applying layers with their whiteouts inside a root directory without following a
  hostile image's symlinks out of it is what umoci does well. Neither is re-written here.
- **Pinned by digest.** A tag is resolved once (``skopeo inspect --raw``; a list or index is
  narrowed to this host's platform) and everything after that pulls ``repository@digest``, so
  the bytes unpacked are the bytes the digest names. Every blob of the copied layout is hashed
  again before it is unpacked; a registry serving other bytes fails the build.
- **No host state.** Each pull gets its own registries.conf (the operator's mirrors and
  plain-HTTP registries, ``RegistrySettings``), a trust policy, and an auth file holding only
  the credentials given (mode 0600, never on a command line, removed after the pull), with
  ``HOME`` pointed away from the host's own credentials.
- **The agent comes along.** A foreign image has no Python of ours, maybe no Python at all.
  Its rootfs gets ``/opt/e2b-compat/image-agent``: the base template's interpreter, standard
  library, agent environment and the shared libraries they load (hard links where the file
  system allows), started through that copy's own dynamic loader so the image's libc never
  matters. ``/usr/bin/tini`` (the runtime's PID 1) is added from tini-static when missing, and
  the ``user`` account (uid 1000) when the image has none. Files are written from the host only
  through paths checked component by component not to be symlinks.
- **Cached by content**: the folder is keyed by the manifest digest and the base template's
  key, so the same image with the same agent is unpacked once per host.
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import json
import os
import platform
import re
import shutil
import stat
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from . import _keys
from ._commands import TemplateError, run
from ._image_refs import ImageError, ImageReference, RegistrySettings, parse_reference

__all__ = [
    "IMAGE_AGENT",
    "ImageConfig",
    "PulledImage",
    "RegistryCredentials",
    "image_template_name",
    "is_image_template",
    "pull_image",
    "sweep_pulls",
]

IMAGE_RECIPE_VERSION = 1
IMAGE_PREFIX = "image"
IMAGE_AGENT = "/opt/e2b-compat/image-agent"
_LIBDIR = "usr/lib/x86_64-linux-gnu"
_LOADER = "ld-linux-x86-64.so.2"
_PYTHON = "python3.11"
_SKOPEO_TIMEOUT = "1800s"
# A pull's session folder older than this is one a killed pull left (skopeo gives up after 30 min).
PULL_LEFTOVER_S = 2 * 3600.0
_PULL_PREFIX = ".image-pull-"
_INDEX_TYPES = (
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
)
_GOARCH = {"x86_64": "amd64", "aarch64": "arm64"}
_LDD_PATH = re.compile(r"=>\s+(/\S+)|^\s*(/\S+)\s+\(0x")
# Lines skopeo or umoci may print that could hold what a URL carried: dropped from errors.
_FATAL = re.compile(r'level=fatal msg="((?:[^"\\]|\\.)*)"')
_SECRETISH = re.compile(r"(?i)(authorization|password|token)[^\n]*")

IMAGE_AGENT_COMMAND = (
    f"{IMAGE_AGENT}/{_LIBDIR}/{_LOADER}",
    "--library-path",
    f"{IMAGE_AGENT}/{_LIBDIR}",
    f"{IMAGE_AGENT}/venv/bin/{_PYTHON}",
    "-I",  # the image's PYTHON* variables and paths never reach the agent
    "-m",
    "runtime.agent",
    "--host",
    "0.0.0.0",  # noqa: S104 (the sandbox's own network namespace)
    "--port",
    str(_keys.AGENT_PORT),
)


@dataclass(frozen=True)
class RegistryCredentials:
    username: str
    password: str = field(repr=False)


@dataclass(frozen=True)
class ImageConfig:
    """What the image's config says about running it (the parts a template build uses)."""

    env: tuple[tuple[str, str], ...] = ()
    workdir: str | None = None
    user: str | None = None


@dataclass(frozen=True)
class PulledImage:
    name: str  # the template name backends are given
    reference: str
    digest: str  # of the platform manifest
    config: ImageConfig
    cached: bool


def image_template_name(key: str) -> str:
    return f"{IMAGE_PREFIX}-{key[:16]}"


def is_image_template(name: str) -> bool:
    return re.fullmatch(rf"{IMAGE_PREFIX}-[0-9a-f]{{16}}", name) is not None


# -- skopeo ------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Session:
    """The files one pull hands skopeo: its own registries.conf, policy and auth file."""

    folder: Path
    env: Mapping[str, str]
    authfile: Path
    secrets: tuple[str, ...]

    def _command(self, args: tuple[str, ...]) -> list[str]:
        cmd = ["skopeo", "--policy", str(self.folder / "policy.json"), "--command-timeout", _SKOPEO_TIMEOUT]
        # An undocumented global flag of skopeo 1.9 (its CONTAINERS_REGISTRIES_CONF is not read).
        cmd += ["--registries-conf", str(self.folder / "registries.conf")]
        arch = _GOARCH.get(platform.machine(), platform.machine())
        return [*cmd, "--override-os", "linux", "--override-arch", arch, *args]

    def _refusal(self, what: str, output: str) -> ImageError:
        # skopeo ends with level=fatal msg="…": that line is the reason, the rest is our own
        # command line (temporary paths) and retry chatter.
        reasons = _FATAL.findall(output)
        reason = reasons[-1].replace('\\"', '"') if reasons else output.strip()[-2000:]
        return ImageError(self.scrub(f"{what}: {reason}"))

    def skopeo(self, *args: str, what: str, detail: Callable[[str], None] = lambda _line: None) -> str:
        try:
            return run(self._command(args), what, env=self.env, detail=detail)
        except TemplateError as exc:
            raise self._refusal(what, str(exc)) from None

    def stdout(self, *args: str, what: str) -> bytes:
        """skopeo's standard output, byte for byte (a manifest's digest is of its exact bytes)."""
        try:
            done = subprocess.run(
                self._command(args), env=dict(self.env), capture_output=True, stdin=subprocess.DEVNULL, check=False
            )
        except OSError as exc:
            raise ImageError(f"{what}: could not start skopeo: {exc}") from None
        if done.returncode != 0:
            raise self._refusal(what, done.stderr.decode("utf-8", "replace"))
        return done.stdout

    def scrub(self, text: str) -> str:
        for secret in self.secrets:
            text = text.replace(secret, "***")
        return _SECRETISH.sub(r"\1 …", text)


@contextmanager
def _session(
    folder: Path, reference: ImageReference, registries: RegistrySettings, credentials: RegistryCredentials | None
) -> Iterator[_Session]:
    folder.mkdir(mode=0o700)
    try:
        (folder / "registries.conf").write_text(registries.registries_conf(reference), encoding="utf-8")
        # Which images may be used is decided by the digest we pin, not by signatures.
        policy = {"default": [{"type": "insecureAcceptAnything"}]}
        (folder / "policy.json").write_text(json.dumps(policy), encoding="utf-8")
        auths: dict[str, dict[str, str]] = {}
        secrets: tuple[str, ...] = ()
        if credentials is not None:
            token = base64.b64encode(f"{credentials.username}:{credentials.password}".encode()).decode()
            auths = {host: {"auth": token} for host in registries.hosts(reference)}
            secrets = tuple(s for s in (credentials.password, token) if s)
        authfile = folder / "auth.json"
        fd = os.open(authfile, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump({"auths": auths}, out)
        env = {
            "PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
            "HOME": str(folder),  # never the host's ~/.docker/config.json
            "XDG_RUNTIME_DIR": str(folder),
            "REGISTRY_AUTH_FILE": str(authfile),
            "TMPDIR": str(folder),
        }
        yield _Session(folder, env, authfile, secrets)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _resolve(session: _Session, reference: ImageReference) -> str:
    """The digest of the platform manifest ``reference`` names (a list or index narrowed to this host)."""
    target = f"docker://{reference}"
    data = session.stdout("inspect", "--raw", "--authfile", str(session.authfile), target, what=f"reading {reference}")
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    if reference.digest is not None and digest != reference.digest:
        raise ImageError(f"{reference}: the registry answered a manifest whose digest is {digest}")
    try:
        manifest = json.loads(data)
    except ValueError:
        raise ImageError(f"{reference}: the registry's manifest is not JSON") from None
    if not isinstance(manifest, dict):
        raise ImageError(f"{reference}: the registry's manifest is not a JSON object")
    if manifest.get("mediaType") in _INDEX_TYPES or "manifests" in manifest:
        arch = _GOARCH.get(platform.machine(), platform.machine())
        for entry in manifest.get("manifests") or []:
            wanted = entry.get("platform") or {}
            if wanted.get("os") == "linux" and wanted.get("architecture") == arch:
                chosen = str(entry.get("digest", ""))
                if re.fullmatch(r"sha256:[0-9a-f]{64}", chosen) is None:
                    raise ImageError(f"{reference}: the index names a malformed digest for linux/{arch}")
                return chosen
        raise ImageError(f"{reference} has no image for linux/{arch}")
    return digest


def _verify_layout(layout: Path) -> dict[str, object]:
    """Every blob of the OCI layout hashed against its name; the image manifest returned."""
    blobs = layout / "blobs" / "sha256"
    for blob in blobs.iterdir():
        digest = hashlib.sha256()
        with blob.open("rb") as data:
            while chunk := data.read(1 << 20):
                digest.update(chunk)
        if digest.hexdigest() != blob.name:
            raise ImageError(f"blob sha256:{blob.name} holds other bytes (sha256:{digest.hexdigest()})")
    index = json.loads((layout / "index.json").read_text(encoding="utf-8"))
    descriptor = index["manifests"][0]
    manifest: dict[str, object] = json.loads(_blob(layout, descriptor))
    return manifest


def _blob(layout: Path, descriptor: Mapping[str, object]) -> bytes:
    algorithm, _, hexdigest = str(descriptor["digest"]).partition(":")
    path = layout / "blobs" / algorithm / hexdigest
    if algorithm != "sha256" or not re.fullmatch(r"[0-9a-f]{64}", hexdigest) or not path.is_file():
        raise ImageError(f"the pulled image lacks blob {descriptor['digest']}")
    data = path.read_bytes()
    if len(data) != int(str(descriptor.get("size", len(data)))):
        raise ImageError(f"blob {descriptor['digest']} has {len(data)} bytes, its descriptor says {descriptor['size']}")
    return data


def _image_config(layout: Path, manifest: Mapping[str, object]) -> ImageConfig:
    descriptor = manifest.get("config")
    if not isinstance(descriptor, dict):
        raise ImageError("the image manifest names no config")
    config = json.loads(_blob(layout, descriptor)).get("config") or {}
    env: list[tuple[str, str]] = []
    for item in config.get("Env") or []:
        name, equals, value = str(item).partition("=")
        if equals and name:
            env.append((name, value))
    workdir = config.get("WorkingDir") or None
    user = config.get("User") or None
    return ImageConfig(env=tuple(env), workdir=str(workdir) if workdir else None, user=str(user) if user else None)


# -- the agent, injected -----------------------------------------------------------------


def _safe_dir(rootfs: Path, relative: str, *, mode: int = 0o755) -> Path:
    """``rootfs/relative`` as a real folder, made where missing; no component may be a symlink."""
    path = rootfs
    for part in Path(relative).parts:
        path = path / part
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            path.mkdir(mode=mode)
            continue
        if not stat.S_ISDIR(info.st_mode):
            raise ImageError(f"the image's /{relative} is not a folder (/{path.relative_to(rootfs)} is in the way)")
    return path


def _safe_file(rootfs: Path, relative: str) -> Path:
    """``rootfs/relative`` for writing: its folder checked by ``_safe_dir``, itself no symlink."""
    parent = _safe_dir(rootfs, str(Path(relative).parent))
    path = parent / Path(relative).name
    if path.is_symlink():
        raise ImageError(f"the image's /{relative} is a symlink; it is not written through")
    return path


def _link_or_copy(source: str | Path, target: str | Path) -> None:
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def _copy_tree(source: Path, target: Path) -> None:
    shutil.copytree(source, target, symlinks=True, copy_function=_link_or_copy)


def _libraries(base_rootfs: Path, objects: list[str]) -> set[str]:
    """The shared libraries ``objects`` (paths inside the base rootfs) load, as the base's ldd finds them."""
    found: set[str] = set()
    for start in range(0, len(objects), 200):
        out = run(["chroot", str(base_rootfs), "/usr/bin/ldd", *objects[start : start + 200]], "listing libraries")
        for line in out.splitlines():
            match = _LDD_PATH.search(line)
            if match:
                found.add(match.group(1) or match.group(2))
    return found


def inject_agent(rootfs: Path, base_rootfs: Path) -> None:
    """Give ``rootfs`` the base template's agent, tini and the sandbox user (see the module docstring)."""
    agent = _safe_dir(rootfs, IMAGE_AGENT.lstrip("/"))
    if any(agent.iterdir()):
        shutil.rmtree(agent)  # an image made from one of ours: the agent is always this server's
        agent.mkdir(mode=0o755)
    base_venv = base_rootfs / _keys.VENV.lstrip("/")
    usr_lib = agent / "usr/lib"
    usr_lib.mkdir(parents=True)
    _copy_tree(base_rootfs / "usr/lib" / _PYTHON, usr_lib / _PYTHON)
    venv = agent / "venv"
    (venv / "bin").mkdir(parents=True)
    _copy_tree(base_venv / "lib", venv / "lib")
    _link_or_copy((base_rootfs / "usr/bin" / _PYTHON).resolve(), venv / "bin" / _PYTHON)
    (venv / "pyvenv.cfg").write_text(
        f"home = {IMAGE_AGENT}/usr/bin\ninclude-system-site-packages = false\n", encoding="utf-8"
    )
    (agent / "usr/bin").mkdir()
    objects = [f"/usr/bin/{_PYTHON}"]
    for folder in (base_rootfs / "usr/lib" / _PYTHON / "lib-dynload", base_venv / "lib"):
        objects += ["/" + str(p.relative_to(base_rootfs)) for p in sorted(folder.rglob("*.so*")) if p.is_file()]
    libdir = agent / _LIBDIR
    libdir.mkdir(parents=True)
    for library in sorted(_libraries(base_rootfs, objects)):
        source = base_rootfs / library.lstrip("/")
        target = libdir / Path(library).name
        if not target.exists():
            _link_or_copy(source.resolve(), target)
    if not (libdir / _LOADER).exists():
        _link_or_copy((base_rootfs / "lib64" / _LOADER).resolve(), libdir / _LOADER)
    tini = _safe_file(rootfs, "usr/bin/tini")
    if not tini.exists():
        shutil.copy2(base_rootfs / "usr/bin/tini-static", tini)
    _add_user(rootfs)


def _add_user(rootfs: Path) -> None:
    """The ``user`` account (uid and gid 1000, home /home/user) when the image has no such user."""
    passwd = _safe_file(rootfs, "etc/passwd")
    group = _safe_file(rootfs, "etc/group")
    lines = passwd.read_text(encoding="utf-8", errors="replace").splitlines() if passwd.exists() else []
    if not any(line.split(":", 1)[0] == "root" for line in lines):
        lines.insert(0, "root:x:0:0:root:/root:/bin/sh")
    uid = _keys.USER_ID
    if not any(line.split(":", 1)[0] == _keys.USER for line in lines):
        shell = "/bin/bash" if os.path.lexists(rootfs / "bin/bash") else "/bin/sh"
        lines.append(f"{_keys.USER}:x:{uid}:{uid}::{_keys.USER_HOME}:{shell}")
        groups = group.read_text(encoding="utf-8", errors="replace").splitlines() if group.exists() else []
        if not any(line.split(":", 1)[0] == "root" for line in groups):
            groups.insert(0, "root:x:0:")
        if not any(line.split(":", 3)[:1] == [_keys.USER] or line.split(":")[2:3] == [str(uid)] for line in groups):
            groups.append(f"{_keys.USER}:x:{uid}:")
        group.write_text("\n".join(groups) + "\n", encoding="utf-8")
        home = _safe_dir(rootfs, _keys.USER_HOME.lstrip("/"), mode=0o750)
        os.chown(home, uid, uid)
    passwd.write_text("\n".join(lines) + "\n", encoding="utf-8")


# -- the whole pull ----------------------------------------------------------------------


@contextmanager
def _key_lock(root: Path, key: str) -> Iterator[None]:
    """One pull per key at a time on this host (another server may be unpacking the same image).

    With the lock held no build of this key is live, so one a killed pull left is removed.
    """
    fd = os.open(root / f".{image_template_name(key)}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        for leftover in root.glob(f".{image_template_name(key)}.build-*"):
            shutil.rmtree(leftover, ignore_errors=True)
        yield
    finally:
        os.close(fd)


def sweep_pulls(root: Path, *, older_than_s: float = PULL_LEFTOVER_S) -> None:
    """Remove the session folders of pulls killed on the way (they may hold an auth file)."""
    now = time.time()
    for leftover in root.glob(f"{_PULL_PREFIX}*"):
        try:
            if now - leftover.stat().st_mtime > older_than_s:
                shutil.rmtree(leftover, ignore_errors=True)
        except OSError:
            continue


def image_key(digest: str, base_key: str) -> str:
    recipe = {"kind": "image", "version": IMAGE_RECIPE_VERSION, "digest": digest, "agent": base_key}
    return _keys.recipe_key(recipe)


def pull_image(
    text: str,
    *,
    root: Path,
    base_rootfs: Path,
    base_key: str,
    registries: RegistrySettings,
    credentials: RegistryCredentials | None = None,
    say: Callable[[str], None] = lambda _line: None,
    materialize: Callable[..., object],
) -> PulledImage:
    """The template for image ``text`` in the cache folder ``root``, pulled and unpacked if absent.

    ``materialize`` is the cache's own ``_materialize`` (build beside, rename into place);
    ``say`` gets the lines a build log shows. Raises ``ImageError``.
    """
    reference = parse_reference(text)
    root.mkdir(parents=True, exist_ok=True)
    sweep_pulls(root)
    work = Path(tempfile.mkdtemp(prefix=_PULL_PREFIX, dir=root))
    try:
        with _session(work / "session", reference, registries, credentials) as session:
            say(f"Resolving {reference}")
            digest = _resolve(session, reference)
            key = image_key(digest, base_key)
            name = image_template_name(key)
            say(f"{reference} is {digest}")
            with _key_lock(root, key):
                final = root / name
                if (final / "template.json").is_file():
                    meta = json.loads((final / "template.json").read_text(encoding="utf-8"))
                    return PulledImage(name, str(reference), digest, _config_from(meta), cached=True)
                found: dict[str, ImageConfig] = {}

                def build(tmp: Path) -> dict[str, object]:
                    layout = tmp / "layout"
                    say(f"Pulling {reference.pinned(digest)}")
                    session.skopeo(
                        "copy",
                        "--quiet",
                        "--remove-signatures",
                        "--retry-times",
                        "2",
                        "--src-authfile",
                        str(session.authfile),
                        f"docker://{reference.pinned(digest)}",
                        f"oci:{layout}:image",
                        what=f"pulling {reference.pinned(digest)}",
                    )
                    manifest = _verify_layout(layout)
                    config = found["config"] = _image_config(layout, manifest)
                    layers = manifest.get("layers")
                    count = len(layers) if isinstance(layers, list) else 0
                    say(f"Verified {count} layer(s); unpacking")
                    bundle = tmp / "bundle"
                    try:
                        run(["umoci", "unpack", "--image", f"{layout}:image", str(bundle)], "unpacking the image")
                    except TemplateError as exc:
                        raise ImageError(session.scrub(str(exc))) from None
                    (bundle / "rootfs").rename(tmp / "rootfs")
                    shutil.rmtree(bundle)
                    shutil.rmtree(layout)
                    (tmp / "rootfs").chmod(0o755)
                    inject_agent(tmp / "rootfs", base_rootfs)
                    return {
                        "image": {
                            "reference": str(reference),
                            "digest": digest,
                            "env": [list(pair) for pair in config.env],
                            "workdir": config.workdir,
                            "user": config.user,
                        }
                    }

                materialize(
                    root,
                    IMAGE_PREFIX,
                    key,
                    recipe={"kind": "image", "digest": digest, "agent": base_key},
                    agent_command=IMAGE_AGENT_COMMAND,
                    build=build,
                )
                say(f"Unpacked {reference} with the agent")
                return PulledImage(name, str(reference), digest, found["config"], cached=False)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _config_from(meta: Mapping[str, object]) -> ImageConfig:
    image = meta.get("image")
    if not isinstance(image, dict):
        raise TemplateError("the cached image template has no image section")
    env = tuple((str(pair[0]), str(pair[1])) for pair in image.get("env") or [])
    return ImageConfig(env=env, workdir=image.get("workdir") or None, user=image.get("user") or None)
