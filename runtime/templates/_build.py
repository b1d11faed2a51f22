"""Build the sandbox templates (``os``, then ``base`` on it) into the content-addressed cache.

A template is a root filesystem that every sandbox mounts read-only as the lower layer
of its overlay. Cache layout::

    <cache>/templates/<name>-<key[:16]>/rootfs/         the root filesystem
    <cache>/templates/<name>-<key[:16]>/template.json   name, key, recipe, build time, sizes, agent command
    <cache>/templates/.lock                             held while building

``os`` is a debootstrap of bookworm plus the sandbox user; ``base`` is a copy of it plus
the agent in ``/opt/e2b-compat/venv``; ``code-interpreter-v1`` is a copy of ``base`` plus
the ``kernels`` layer (the kernels' locked environment in ``/opt/e2b-compat/kernel``, built
once per lock, see ``_kernels``), and its agent starts the interpreter server (see ``_keys``
for what decides each key); ``mcp-gateway`` is a copy of ``base`` plus the ``mcp`` layer and
the gateway (``_mcp``). ``kernels`` and ``mcp`` are not root filesystems of their own: they
hold only the paths they add (``_layers``). A template is built in
``.<name>-<key16>.build-XXXX/`` beside its final place and renamed into it as the last step,
so a folder under its final name is complete and is reused as it is. Builds take an exclusive
lock, so concurrent callers wait and then reuse the result, and the holder of the lock
removes what killed builds left behind.
"""

from __future__ import annotations

import fcntl
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from contract import Artifact, ArtifactStore, default_cache_root

from . import _images, _kernels, _keys, _mcp, _packages
from ._commands import CHROOT_ENV, TemplateError, disk_usage, in_root, remove_tree, replace_file, run
from ._image_refs import RegistrySettings
from ._images import PulledImage, RegistryCredentials
from ._layers import apply_marks, settle_upper
from ._mirror import Mirror, find_debian_mirror
from ._progress import Progress, ProgressEvent, default_progress, step
from ._users import lowers_in_use

__all__ = [
    "METADATA",
    "TEMPLATE_MEMORY_MB",
    "TEMPLATE_NAMES",
    "Template",
    "ensure_template",
    "list_templates",
    "lock_packages",
    "templates_dir",
]

TEMPLATE_NAMES = ("os", "base", _keys.INTERPRETER_TEMPLATE, _keys.MCP_TEMPLATE)
# A template's own memory size, MiB, where it needs more than the server's default: upstream builds
# its code-interpreter template with 2 GiB, and ours starts five kernels at boot (Python, Deno,
# IRkernel, a JVM, bash), more than 512 MiB hold; under gVisor, whose sentry owns all of a
# sandbox's memory, a second JVM or Deno context got the whole sandbox OOM-killed.
TEMPLATE_MEMORY_MB = {_keys.INTERPRETER_TEMPLATE: 2048}
METADATA = "template.json"
FORMAT = 1
# Where the wheelhouse sits inside the rootfs while the agent is installed from it.
_WHEELHOUSE = "/tmp/e2b-compat-wheelhouse"  # noqa: S108 (inside the rootfs, removed again)
_IMPORT_CHECK = "import runtime.agent, contract.generated.process.process_pb2"
# Debian's /etc/profile picks PATH by asking ``id -u`` in a subshell: a fork and an exec in every
# login shell, and so in every ``commands.run`` (the clients run ``bash -l -c``), about 1 ms of
# the 5 ms round trip (docs/BENCHMARKS.md). bash knows its effective uid as ``$EUID``; dash and
# other shells, which do not set it, still ask ``id -u``. The PATH chosen is the same.
_PROFILE = "etc/profile"
_PROFILE_UID_TEST = b'[ "$(id -u)" -eq 0 ]'  # PATH's choice, and the prompt's of interactive shells
_PROFILE_EUID_TEST = b'[ "${EUID:-$(id -u)}" -eq 0 ]'

Build = Callable[[Path], Mapping[str, object]]


@dataclass(frozen=True)
class Template:
    """A finished template in the cache: mount ``rootfs`` read-only, run ``agent_command`` in it."""

    name: str
    key: str
    path: Path
    rootfs: Path
    agent_command: tuple[str, ...]


KEEP_TEMPLATES = 3  # of each name built from the sources
# A template looked up or built this recently is never pruned, whatever its rank: a server between
# finding its templates and registering them (``register_template_user``), or a build copying one
# as its base, holds it without a mount or a record. Another checkout's build on the same host
# pruned one in that gap.
PRUNE_GRACE_S = 3600.0


def templates_dir(cache_root: Path | None = None) -> Path:
    return (cache_root if cache_root is not None else default_cache_root()) / "templates"


def _used(template: Template) -> Template:
    """``template``, marked used now: its metadata's time, which pruning ranks by and spares for a while."""
    with suppress(OSError):  # a read-only cache: then it ranks by its build
        os.utime(template.path / METADATA)
    return template


def _load(path: Path) -> Template | None:
    """The template in ``path``, or None if there is no finished one."""
    try:
        meta = json.loads((path / METADATA).read_text(encoding="utf-8"))
        template = Template(
            name=str(meta["name"]),
            key=str(meta["key"]),
            path=path,
            rootfs=path / "rootfs",
            agent_command=tuple(str(part) for part in meta["agent_command"]),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return template if template.rootfs.is_dir() else None


def list_templates(cache_root: Path | None = None) -> list[Template]:
    """Finished templates in the cache (builds in progress are hidden folders), by name then key."""
    root = templates_dir(cache_root)
    if not root.is_dir():
        return []
    found = (_load(path) for path in root.iterdir() if not path.name.startswith("."))
    return sorted((t for t in found if t is not None), key=lambda t: (t.name, t.key))


def _default_repo() -> Path:
    # The checkout this package runs from (``pip install -e``); a plain install has no sources.
    repo = Path(__file__).resolve().parents[2]
    if not (repo / "pyproject.toml").is_file():
        raise TemplateError(f"no source checkout around {Path(__file__).parent}; pass repo= (the e2b-compat checkout)")
    return repo


@contextmanager
def _locked(root: Path, progress: Progress) -> Iterator[None]:
    fd = os.open(root / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            progress(ProgressEvent(f"waiting for another build in {root}", "note"))
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _sweep(root: Path, progress: Progress) -> None:
    """Remove build folders of killed builds (only called with the lock held, so none is live).

    Image pulls do not take this lock (a base build holds it for minutes); their folders are
    swept by the pulls themselves (``_images.sweep_pulls``).
    """
    for leftover in sorted(root.glob(".*.build-*")):
        if leftover.name.startswith(f".{_images.IMAGE_PREFIX}-"):
            continue
        progress(ProgressEvent(f"removing {leftover.name}, left by an interrupted build", "note"))
        remove_tree(leftover)


def _materialize(
    root: Path, name: str, key: str, *, recipe: Mapping[str, object], agent_command: tuple[str, ...], build: Build
) -> Template:
    """The template ``name``/``key``, first built with ``build(tmp)`` beside its final place if absent."""
    final = root / f"{name}-{key[:16]}"
    existing = _load(final)
    if existing is not None:
        return _used(existing)
    started = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.build-", dir=root))
    try:
        extra = build(tmp)
        meta = {
            "format": FORMAT,
            "name": name,
            "key": key,
            "recipe": dict(recipe),
            "agent_command": list(agent_command),
            "built_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "build_seconds": round(time.monotonic() - started, 1),
            "size": disk_usage(tmp / "rootfs"),
            **extra,
        }
        (tmp / METADATA).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
        tmp.chmod(0o755)  # mkdtemp made it private; sandboxes need to traverse it
        try:
            tmp.rename(final)  # the last step: from here on the template is used
        except OSError as exc:
            raise TemplateError(f"could not move the finished build to {final} (remove it if broken): {exc}") from exc
    finally:
        # After a failure or an interrupt: nothing half-built stays, nothing stays mounted.
        remove_tree(tmp)
    done = _load(final)
    if done is None:
        raise TemplateError(f"{final} holds no readable {METADATA} after building it")
    return done


# --- the os layer ---


def _debootstrap(rootfs: Path, arch: str, mirror: Mirror, detail: Callable[[str], None]) -> None:
    if shutil.which("debootstrap") is None:
        raise TemplateError("debootstrap is not installed (Debian package 'debootstrap')")
    cmd = ["debootstrap", f"--variant={_keys.VARIANT}", f"--arch={arch}", "--include=" + ",".join(_keys.OS_PACKAGES)]
    if mirror.keyring is not None:
        cmd.append(f"--keyring={mirror.keyring}")
    run([*cmd, _keys.SUITE, str(rootfs), mirror.uri], "debootstrap", detail=detail)


def _add_user(rootfs: Path) -> None:
    # The rootfs's own shadow tools keep passwd, shadow, group and gshadow consistent and
    # copy /etc/skel with the right owner; writing those files here would re-implement them.
    uid = str(_keys.USER_ID)
    in_root(rootfs, ["groupadd", "--gid", uid, _keys.USER], "adding the sandbox group")
    useradd = ["useradd", "--uid", uid, "--gid", uid, "--create-home", "--home-dir", _keys.USER_HOME]
    in_root(rootfs, [*useradd, "--shell", _keys.USER_SHELL, _keys.USER], "adding the sandbox user")
    sudoers = f"/etc/sudoers.d/{_keys.USER}"
    replace_file(rootfs / sudoers.lstrip("/"), f"{_keys.USER} ALL=(ALL:ALL) NOPASSWD: ALL\n".encode(), 0o440)
    in_root(rootfs, ["visudo", "--check", "--file", sudoers], "checking the sudoers entry")


NPM_ARTIFACT = Artifact(
    key="template-npm",
    registry="npm",
    name="npm",
    version=_keys.NPM_VERSION,
    filename=f"npm-{_keys.NPM_VERSION}.tgz",
    sha256=_keys.NPM_SHA256,
    integrity=_keys.NPM_INTEGRITY,
    source="npm registry",
)


def _add_npm(rootfs: Path) -> None:
    """The pinned npm tarball (verified by both digests) in /usr/lib/node_modules/npm, with npm and npx."""
    tarball = ArtifactStore().open(NPM_ARTIFACT)
    target = rootfs / "usr/lib/node_modules/npm"
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    # The registry's tarball holds everything under package/; owners become root's.
    run(
        ["tar", "-xzf", str(tarball.path), "-C", str(target), "--strip-components=1", "--no-same-owner"],
        "unpacking npm",
    )
    for name, script in (("npm", "npm-cli.js"), ("npx", "npx-cli.js")):
        link = rootfs / "usr/bin" / name
        link.unlink(missing_ok=True)
        link.symlink_to(f"../lib/node_modules/npm/bin/{script}")
    in_root(rootfs, ["npm", "--version"], "checking npm with the rootfs node")


def _trim(rootfs: Path) -> None:
    for pattern in ("var/cache/apt/archives/*.deb", "var/cache/apt/*.bin"):
        for path in rootfs.glob(pattern):
            path.unlink()
    lists = rootfs / "var/lib/apt/lists"
    if lists.is_dir():
        for path in lists.iterdir():
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
    # debootstrap copies the host's hostname and resolver; a template must not carry them
    # (they are not in the key). The runtime provides the sandbox's own.
    replace_file(rootfs / "etc/hostname", b"", 0o644)
    replace_file(rootfs / "etc/resolv.conf", b"", 0o644)
    replace_file(rootfs / "etc/hosts", _keys.HOSTS, 0o644)


def _build_os(tmp: Path, recipe: Mapping[str, object], progress: Progress) -> dict[str, object]:
    arch = str(recipe["arch"])
    mirror = find_debian_mirror(_keys.SUITE)
    progress(ProgressEvent(f"Debian mirror {mirror.uri} (from {mirror.origin})", "note"))
    rootfs = tmp / "rootfs"
    title = f"debootstrap {_keys.SUITE} {arch} ({_keys.VARIANT} + {len(_keys.OS_PACKAGES)} packages)"
    with step(progress, title) as out:
        _debootstrap(rootfs, arch, mirror, out)
    with step(progress, f"adding {_keys.USER!r} ({_keys.USER_ID}:{_keys.USER_ID}) with passwordless sudo"):
        _add_user(rootfs)
    with step(progress, f"adding npm {_keys.NPM_VERSION} from the npm registry"):
        _add_npm(rootfs)
    with step(progress, "removing apt caches and the host's hostname and resolver"):
        _trim(rootfs)
    return {}


# --- the base layer ---


def _check_python(rootfs: Path) -> None:
    # The wheelhouse is resolved by this interpreter, so its tags must fit the rootfs's python.
    probe = "import platform, sys; print(sys.version_info[0], sys.version_info[1], platform.machine())"
    inside = in_root(rootfs, ["python3", "-c", probe], "asking the rootfs python for its version").split()
    here = [str(sys.version_info[0]), str(sys.version_info[1]), platform.machine()]
    if inside != here:
        raise TemplateError(
            f"the rootfs has python {' '.join(inside)} but the wheelhouse would be built by python "
            f"{' '.join(here)} ({sys.executable}); run the build with a CPython {inside[0]}.{inside[1]}"
        )


def _build_base(tmp: Path, os_layer: Template, tree: _keys.SourceTree, progress: Progress) -> dict[str, object]:
    rootfs = tmp / "rootfs"
    with step(progress, f"copying {os_layer.path.name}"):
        run(["cp", "-a", "--reflink=auto", str(os_layer.rootfs), str(rootfs)], "copying the os layer")
    with step(progress, f"creating {_keys.VENV} with the rootfs python"):
        _check_python(rootfs)
        in_root(rootfs, ["python3", "-m", "venv", _keys.VENV], "creating the agent virtualenv")
    wheelhouse = rootfs / _WHEELHOUSE.lstrip("/")
    with step(progress, f"building wheels of {_keys.DISTRIBUTION} and its dependencies (pip wheel)") as out:
        # Built from a copy of exactly the hashed bytes: in the checkout, setuptools would
        # write build/ and *.egg-info and could pick up stale files from an earlier build/.
        source = tmp / "source"
        tree.write_to(source)
        pip = [sys.executable, "-m", "pip", "wheel", "--no-input", "--disable-pip-version-check"]
        run([*pip, "--wheel-dir", str(wheelhouse), str(source)], "pip wheel", cwd=tmp, detail=out)
        shutil.rmtree(source)
    wheels = sorted(path.name for path in wheelhouse.glob("*.whl"))
    with step(progress, f"installing the agent into {_keys.VENV}") as out:
        install = [f"{_keys.VENV}/bin/pip", "install", "--no-index", "--find-links", _WHEELHOUSE]
        flags = ["--no-cache-dir", "--no-input", "--disable-pip-version-check"]
        in_root(rootfs, [*install, *flags, _keys.DISTRIBUTION], "pip install in the rootfs", detail=out)
        shutil.rmtree(wheelhouse)
        in_root(rootfs, [f"{_keys.VENV}/bin/python", "-c", _IMPORT_CHECK], "importing the agent in the rootfs")
    with step(progress, "letting login shells take their uid from bash ($EUID) in /etc/profile"):
        _profile_without_id_fork(rootfs)
    return {"from": os_layer.path.name, "wheels": wheels}


def _profile_without_id_fork(rootfs: Path) -> None:
    path = rootfs / _PROFILE
    text = path.read_bytes()
    if _PROFILE_UID_TEST not in text:  # the os layer's packages are locked: a change is a surprise
        raise TemplateError(f"/{_PROFILE} of the os layer does not test the uid as expected; not changed")
    replace_file(path, text.replace(_PROFILE_UID_TEST, _PROFILE_EUID_TEST), path.stat().st_mode & 0o7777)


# --- the kernels layer and code-interpreter-v1 ---

# Imported as the sandbox user, which also leaves matplotlib's font cache in the user's
# home: without it the first plot in every new sandbox would spend seconds building it.
_KERNEL_CHECK = "import ipykernel, bash_kernel, numpy, pandas, PIL, e2b_charts, matplotlib.pyplot"
_SERVER_CHECK = "import runtime.interpreter, jupyter_client"
# Each language's own runtime answers as the sandbox user (deno, R with IRkernel, the JDK's jshell).
_LANGUAGE_CHECKS = (
    ((f"{_keys.KERNEL_VENV}/bin/deno", "eval", "console.log(1)"), "running deno"),
    (("Rscript", "-e", "library(IRkernel)"), "loading R's IRkernel"),
    (("java", "-version"), "running the JDK's java"),
    (("jshell", "--version"), "running the JDK's jshell"),
)
_OWNER = f"{_keys.USER_ID}:{_keys.USER_ID}"


def _check_kernels_as_user(rootfs: Path) -> None:
    env = {**CHROOT_ENV, "HOME": _keys.USER_HOME}
    as_user = ["chroot", f"--userspec={_OWNER}", str(rootfs)]
    run([*as_user, f"{_keys.KERNEL_VENV}/bin/python", "-c", _KERNEL_CHECK], "importing the kernels' packages", env=env)
    with _packages.proc_mounted(rootfs):
        for command, what in _LANGUAGE_CHECKS:
            run([*as_user, *command], f"{what} as the sandbox user", env=env)


def _build_kernels(
    tmp: Path, os_layer: Template, wheelhouse: Path, packages: bytes, progress: Progress
) -> dict[str, object]:
    """The kernels' Debian packages and venv, installed on an overlay over ``os``.

    The layer is the overlay's upper folder, what the installation changed, so
    ``code-interpreter-v1`` copies it onto ``base`` in seconds instead of installing everything
    again after every change of the project's code."""
    upper, work, merged = tmp / "upper", tmp / "work", tmp / "merged"
    for folder in (upper, work, merged):
        folder.mkdir()
    upper.chmod(0o755)
    venv = _keys.KERNEL_VENV
    options = f"lowerdir={os_layer.rootfs},upperdir={upper},workdir={work}"
    run(["mount", "-t", "overlay", "overlay", "-o", options, str(merged)], "mounting an overlay over the os layer")
    try:
        names = len(_packages.parse_lock(packages))
        with step(progress, f"installing {names} locked Debian packages (R, IRkernel, the JDK)") as out:
            installed = _packages.install(merged, packages, out)
        with step(progress, f"creating {venv}"):
            in_root(merged, ["python3", "-m", "venv", venv], "creating the kernels' virtualenv")
        inside = merged / _WHEELHOUSE.lstrip("/")
        shutil.copytree(wheelhouse, inside)
        wheels = sorted(path.name for path in inside.glob("*.whl"))
        with step(progress, f"installing {len(wheels)} locked wheels into {venv} (--require-hashes)") as out:
            install = [f"{venv}/bin/pip", "install", "--no-index", "--find-links", _WHEELHOUSE, "--require-hashes"]
            flags = ["--only-binary=:all:", "--no-cache-dir", "--no-input", "--disable-pip-version-check"]
            lock = f"{_WHEELHOUSE}/kernels.lock"
            in_root(merged, [*install, *flags, "-r", lock], "pip install of the kernels' lock", detail=out)
            shutil.rmtree(inside)
        with step(progress, f"handing {venv} to {_keys.USER!r}; checking every kernel's runtime as it"):
            run(["chown", "-R", "--no-dereference", _OWNER, str(merged / venv.lstrip("/"))], "chown of the venv")
            _check_kernels_as_user(merged)
    finally:
        remove_tree(merged)  # unmounts first
    for leftover in (upper / "tmp").glob("*"):  # the JVM's perf-data folders of the checks
        remove_tree(leftover)
    marks = settle_upper(upper)
    remove_tree(work)
    upper.rename(tmp / "rootfs")
    return {"from": os_layer.path.name, "kernel_wheels": wheels, "debian_packages": installed, **marks}


def _build_interpreter(tmp: Path, base: Template, kernels: Template, progress: Progress) -> dict[str, object]:
    rootfs = tmp / "rootfs"
    with step(progress, f"copying {base.path.name}, then {kernels.path.name} onto it"):
        run(["cp", "-a", "--reflink=auto", str(base.rootfs), str(rootfs)], "copying the base layer")
        run(["cp", "-a", "--reflink=auto", f"{kernels.rootfs}/.", str(rootfs)], "copying the kernels layer")
        apply_marks(rootfs, kernels.rootfs, kernels.path / METADATA)
    with step(progress, "checking the kernels and the interpreter server"):
        _check_kernels_as_user(rootfs)
        in_root(rootfs, [f"{_keys.VENV}/bin/python", "-c", _SERVER_CHECK], "importing the interpreter server")
    return {"from": [base.path.name, kernels.path.name]}


def _materialize_mcp(
    root: Path,
    *,
    key: str,
    recipe: Mapping[str, object],
    recipe_mcp: Mapping[str, object],
    lock: bytes,
    os_layer: Template,
    base: Template,
    report: Progress,
) -> Template:
    """``mcp-gateway`` (see ``_mcp``), building the ``mcp`` layer first if absent."""
    layer = _materialize(
        root,
        "mcp",
        _keys.recipe_key(recipe_mcp),
        recipe=recipe_mcp,
        agent_command=(),
        build=lambda tmp: _mcp.build_layer(
            tmp, os_layer.rootfs, _kernels.ensure_wheelhouse(root.parent, lock, name=_kernels.MCP_LOCK), report
        ),
    )

    def build(tmp: Path) -> dict[str, object]:
        _mcp.build_template(tmp, base.rootfs, layer.rootfs, layer.path / METADATA, report)
        return {"from": [base.path.name, layer.path.name]}

    return _materialize(root, _keys.MCP_TEMPLATE, key, recipe=recipe, agent_command=_keys.AGENT_COMMAND, build=build)


# --- entry point ---


def ensure_template(
    name: str = "base",
    *,
    cache_root: Path | None = None,
    repo: Path | None = None,
    progress: Progress | None = None,
) -> Template:
    """The template ``name``, built (with the layers below it) if absent.

    ``"base"`` is the agent's template, ``"code-interpreter-v1"`` adds the Jupyter kernels
    and the interpreter server, ``"mcp-gateway"`` the MCP gateway (``_mcp``), ``"os"`` is the
    bare layer under all of them. ``repo`` is the
    e2b-compat checkout whose code goes into the agent (default: the one
    this package runs from). ``progress`` receives the build's events (default: a spinner
    on a terminal, ``step:`` lines otherwise). Raises ``TemplateError``.
    """
    root = templates_dir(cache_root)
    if _images.is_image_template(name):
        # Made by ``import_image`` only; a backend asking for one gets it or a clear refusal.
        imported = _load(root / name)
        if imported is None:
            raise TemplateError(f"image template {name!r} is not in {root} (pull the image again)")
        return _used(imported)
    if name not in TEMPLATE_NAMES:
        raise TemplateError(f"unknown template {name!r}; known: {', '.join(TEMPLATE_NAMES)}")
    report = progress if progress is not None else default_progress()
    recipe_os = _keys.os_recipe()
    key_os = _keys.recipe_key(recipe_os)
    tree = _keys.read_source_tree(repo if repo is not None else _default_repo()) if name != "os" else None
    recipe_base = None if tree is None else _keys.base_recipe(key_os, tree)
    recipe = recipe_os if recipe_base is None else recipe_base
    interpreter = name == _keys.INTERPRETER_TEMPLATE
    lock = _kernels.read_lock() if interpreter else None
    arch = str(recipe_os["arch"])
    packages = _packages.read_lock(_packages.lock_path(_keys.SUITE, arch)) if interpreter else b""
    recipe_kernels = None if lock is None else _keys.kernels_recipe(key_os, lock, packages)
    if recipe_base is not None and recipe_kernels is not None:
        recipe = _keys.interpreter_recipe(_keys.recipe_key(recipe_base), _keys.recipe_key(recipe_kernels))
    mcp_lock = _kernels.read_lock(_kernels.lock_path(name=_kernels.MCP_LOCK)) if name == _keys.MCP_TEMPLATE else None
    recipe_mcp = None if mcp_lock is None else _keys.mcp_layer_recipe(key_os, mcp_lock)
    if recipe_base is not None and recipe_mcp is not None:
        recipe = _keys.mcp_template_recipe(_keys.recipe_key(recipe_base), _keys.recipe_key(recipe_mcp))
    key = _keys.recipe_key(recipe)
    cached = _load(root / f"{name}-{key[:16]}")
    if cached is not None:
        report(ProgressEvent(f"template {cached.path.name} is cached at {cached.path}", "note"))
        return _used(cached)
    if os.geteuid() != 0:
        raise TemplateError(f"building template {name!r} needs root (debootstrap, chroot)")
    root.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with _locked(root, report):
        _sweep(root, report)
        os_layer = _materialize(
            root, "os", key_os, recipe=recipe_os, agent_command=(), build=lambda tmp: _build_os(tmp, recipe_os, report)
        )
        template = os_layer
        if tree is not None and recipe_base is not None:
            base = template = _materialize(
                root,
                "base",
                _keys.recipe_key(recipe_base),
                recipe=recipe_base,
                agent_command=_keys.AGENT_COMMAND,
                build=lambda tmp: _build_base(tmp, os_layer, tree, report),
            )
            if lock is not None and recipe_kernels is not None:
                locked = lock
                kernels = _materialize(
                    root,
                    "kernels",
                    _keys.recipe_key(recipe_kernels),
                    recipe=recipe_kernels,
                    agent_command=(),
                    # The wheels are fetched (once per lock) only when the layer is built.
                    build=lambda tmp: _build_kernels(
                        tmp, os_layer, _kernels.ensure_wheelhouse(root.parent, locked), packages, report
                    ),
                )
                template = _materialize(
                    root,
                    name,
                    key,
                    recipe=recipe,
                    agent_command=_keys.INTERPRETER_AGENT_COMMAND,
                    build=lambda tmp: _build_interpreter(tmp, base, kernels, report),
                )
            if mcp_lock is not None and recipe_mcp is not None:
                template = _materialize_mcp(
                    root,
                    key=key,
                    recipe=recipe,
                    recipe_mcp=recipe_mcp,
                    lock=mcp_lock,
                    os_layer=os_layer,
                    base=base,
                    report=report,
                )
    report(ProgressEvent(f"template {template.path.name} ready in {time.monotonic() - started:.1f} s", "note"))
    if tree is not None:
        for pruned in prune_templates(cache_root, keep=KEEP_TEMPLATES):
            report(ProgressEvent(f"removed the unused older template {pruned.name}", "note"))
    return template


def import_image(
    reference: str,
    *,
    registries: RegistrySettings | None = None,
    credentials: RegistryCredentials | None = None,
    cache_root: Path | None = None,
    say: Callable[[str], None] | None = None,
) -> PulledImage:
    """The template of image ``reference``, pulled from its registry and unpacked if not cached.

    The agent comes from the ``base`` template (built if absent). ``say`` receives one line per
    stage (resolving, pulling, verifying, unpacking). Raises ``ImageError`` (a ``TemplateError``).
    """
    base = ensure_template("base", cache_root=cache_root, progress=lambda _event: None)
    return _images.pull_image(
        reference,
        root=templates_dir(cache_root),
        base_rootfs=base.rootfs,
        base_key=base.key,
        registries=registries if registries is not None else RegistrySettings(),
        credentials=credentials,
        say=say if say is not None else (lambda _line: None),
        materialize=_materialize,
    )


def lock_packages(*, cache_root: Path | None = None, progress: Progress | None = None) -> Path:
    """Resolve ``packages.in`` with the apt of a scratch copy of the ``os`` layer into its lock (root)."""
    os_layer = ensure_template("os", cache_root=cache_root, progress=progress)
    out = _packages.lock_path(_keys.SUITE, _keys.debian_arch())
    # Named like a build folder: one left by an interrupt is swept by the next build.
    scratch = Path(tempfile.mkdtemp(prefix=".os-packages.build-", dir=templates_dir(cache_root)))
    try:
        rootfs = scratch / "rootfs"
        run(["cp", "-a", "--reflink=auto", str(os_layer.rootfs), str(rootfs)], "copying the os layer")
        return _packages.write_lock(rootfs, out, _packages.requested())
    finally:
        remove_tree(scratch)


def _in_use(template: Template) -> bool:
    """True while some overlay mount uses the template's rootfs as a lower layer."""
    try:
        mounts = Path("/proc/self/mounts").read_text()
    except OSError:
        return True  # cannot tell: keep it
    return str(template.rootfs) in mounts


def _named(template: Template, lowers: set[str]) -> bool:
    """True when one of ``lowers`` (real paths) lies in the template's folder."""
    folder = os.path.realpath(template.path)
    return any(lower == folder or lower.startswith(folder + os.sep) for lower in lowers)


def _agent_key(template: Template) -> str | None:
    try:
        recipe = json.loads((template.path / METADATA).read_text(encoding="utf-8"))["recipe"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return str(recipe.get("agent")) if isinstance(recipe, dict) else None


def prune_templates(cache_root: Path | None = None, *, keep: int) -> list[Path]:
    """Remove all but the ``keep`` most recently used templates of each name built from the sources.

    Every code change gives a new ``base`` (~360 MB) and ``code-interpreter-v1`` (~700 MB),
    so without pruning the cache only grows. Templates still mounted are skipped, and so is
    every template a sandbox record or snapshot manifest of a registered backend names as a
    lower (``_users``: stopped sandboxes and snapshots mount nothing); when that cannot be
    read, nothing is pruned. Nor is one used in the last ``PRUNE_GRACE_S``. The ``os`` layer
    is kept: it rarely changes and is the slow one to build. An image's template
    (``import_image``) goes once the base whose agent it carries is gone.
    """
    root = templates_dir(cache_root)
    root.mkdir(parents=True, exist_ok=True)
    # One pruner at a time on the host (parallel builds of one server, or several servers, all end
    # in a prune): two that chose the same old template raced to rename it, and the loser's build
    # failed with FileNotFoundError. A template that vanishes meanwhile is someone else's prune.
    fd = os.open(root / ".prune.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        return _prune(cache_root, root, keep)
    finally:
        os.close(fd)  # releases the lock


def _used_at(template: Template) -> float:
    """When it was last built or looked up (``_used``)."""
    try:
        return (template.path / METADATA).stat().st_mtime
    except FileNotFoundError:  # removed since it was listed: sorts as the oldest
        return 0.0


def _prune(cache_root: Path | None, root: Path, keep: int) -> list[Path]:
    in_use = lowers_in_use(root)
    if in_use is None:
        return []
    doomed_ones: list[Template] = []
    for name in TEMPLATE_NAMES[1:]:
        built = [t for t in list_templates(cache_root) if t.name == name]
        built.sort(key=_used_at, reverse=True)
        doomed_ones.extend(built[keep:])
    # An image's template carries the agent of the base it was made with: once that base is
    # pruned, a pull of the same image makes a new one, and the old one only waits for its users.
    bases = {t.key for t in list_templates(cache_root) if t.name == "base" and t not in doomed_ones}
    for imported in (t for t in list_templates(cache_root) if t.name == _images.IMAGE_PREFIX):
        if _agent_key(imported) not in bases:
            doomed_ones.append(imported)
    removed = []
    recent = time.time() - PRUNE_GRACE_S
    for template in doomed_ones:
        if _in_use(template) or _named(template, in_use) or _used_at(template) > recent:
            continue
        doomed = template.path.with_name(f".{template.path.name}.prune")
        try:
            os.replace(template.path, doomed)  # gone from the cache at once; deleted below
        except FileNotFoundError:
            continue
        shutil.rmtree(doomed, ignore_errors=True)
        removed.append(template.path)
    return removed
