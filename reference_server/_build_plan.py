"""A template build as data: the build-start body read into a plan, the step cache keys, the shell of each step.

Nothing here does I/O (``_builder`` carries a plan out in a sandbox), so every rule is tested on
its own. What the clients' ``Template`` builder sends (``POST /v2/templates/{id}/builds/{id}``):
a base (``fromImage`` or ``fromTemplate``), ``steps`` of five types, ``force`` and the start and
ready commands. Helpers such as ``remove``, ``rename``, ``make_dir``, ``make_symlink``,
``pip_install`` and ``apt_install`` arrive as ``RUN`` steps. The steps, and the context they
leave (user, working directory, environment):

    type     args                              effect
    RUN      command [user]                    bash -l -c command, as user (else the current one)
    COPY     src dest [owner] [mode]           the uploaded archive ``filesHash``, moved to dest
    WORKDIR  path                              mkdir -p, then later steps run there
    USER     name [add-to-sudo]                useradd when missing, then later steps run as name
    ENV      key value [key value ...]         values expanded by the shell, as in a Dockerfile

A build starts as ``user`` in that user's home, as upstream's do; the context after the last
step is what sandboxes of the template start with. Each step's cache key chains the previous
key with the step as sent (``filesHash`` makes a copy's key follow its files), so a later build
sharing its first steps starts from the layer after them, unless ``force`` (the template's
``skip_cache``, or a step's) says to build from there.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from runtime.templates import ImageError, RegistryCredentials, parse_reference

from ._errors import ApiError
from ._templates import BuildConfig

__all__ = [
    "BASE_IMAGES",
    "STEP_TYPES",
    "BuildPlan",
    "Step",
    "after_env",
    "after_user",
    "base_key",
    "copy_script",
    "copy_source",
    "env_script",
    "finalize_key",
    "parse_plan",
    "step_key",
    "step_name",
    "user_script",
    "workdir_script",
]

# The clients' default base image (``from_base_image()``) is this server's ``base`` template.
BASE_IMAGES = frozenset(
    f"{prefix}e2bdev/base{tag}" for prefix in ("", "docker.io/", "index.docker.io/") for tag in ("", ":latest")
)
STEP_TYPES = ("RUN", "COPY", "WORKDIR", "USER", "ENV")
MAX_STEPS = 1024
MAX_ARG_CHARS = 1 << 16
_HASH = re.compile(r"[0-9a-f]{64}")
_USER = re.compile(r"[a-z_][a-z0-9_-]{0,31}")  # what useradd takes on Debian
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_MODE = re.compile(r"[0-7]{3,4}")


@dataclass(frozen=True)
class Step:
    type: str
    args: tuple[str, ...]
    files_hash: str | None = None
    force: bool = False

    def key_document(self) -> dict[str, Any]:
        return {"type": self.type, "args": list(self.args), "filesHash": self.files_hash}

    def describe(self) -> str:
        return f"{self.type} {' '.join(self.args)}".strip()


@dataclass(frozen=True)
class BuildPlan:
    from_image: str | None
    from_template: str | None
    steps: tuple[Step, ...]
    force: bool = False
    start_cmd: str | None = None
    ready_cmd: str | None = None
    credentials: RegistryCredentials | None = field(default=None, repr=False)  # for from_image, never stored

    @property
    def from_base(self) -> bool:
        """The clients' default base image, which is this server's ``base`` template."""
        return self.from_image is not None and self.from_image in BASE_IMAGES


def _refuse(message: str) -> ApiError:
    return ApiError(400, f"Invalid build: {message}")


def _text(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise _refuse(f"{what} must be a string")
    if len(value) > MAX_ARG_CHARS:
        raise _refuse(f"{what} is longer than {MAX_ARG_CHARS} characters")
    return value


def _step(index: int, raw: object) -> Step:
    where = f"step {index + 1}"
    if not isinstance(raw, dict):
        raise _refuse(f"{where} must be an object")
    kind = _text(raw.get("type"), f"{where} type").upper()
    if kind not in STEP_TYPES:
        raise _refuse(f"{where} has an unknown type {kind[:32]!r} (known: {', '.join(STEP_TYPES)})")
    args_raw = raw.get("args") or []
    if not isinstance(args_raw, list):
        raise _refuse(f"{where} args must be a list of strings")
    args = tuple(_text(arg, f"{where} argument") for arg in args_raw)
    files_hash = raw.get("filesHash")
    if files_hash is not None:
        files_hash = _text(files_hash, f"{where} filesHash")
    _check_args(where, kind, args, files_hash)
    return Step(kind, args, files_hash, bool(raw.get("force") or False))


def _check_args(where: str, kind: str, args: tuple[str, ...], files_hash: str | None) -> None:
    if kind == "RUN":
        if not 1 <= len(args) <= 2 or not args[0].strip():
            raise _refuse(f"{where}: RUN takes a command and an optional user")
        if len(args) == 2 and args[1] and not _USER.fullmatch(args[1]):
            raise _refuse(f"{where}: {args[1][:40]!r} is not a user name")
    elif kind == "COPY":
        if not 2 <= len(args) <= 4 or not args[0] or not args[1]:
            raise _refuse(f"{where}: COPY takes a source, a destination, an optional owner and mode")
        if files_hash is None or not _HASH.fullmatch(files_hash):
            raise _refuse(f"{where}: COPY needs the filesHash of its uploaded files (64 hex digits)")
        if len(args) >= 3 and args[2] and not all(_USER.fullmatch(part) for part in args[2].split(":", 1)):
            raise _refuse(f"{where}: {args[2][:40]!r} is not user[:group]")
        if len(args) == 4 and args[3] and not _MODE.fullmatch(args[3]):
            raise _refuse(f"{where}: {args[3][:12]!r} is not an octal mode")
    elif kind == "WORKDIR":
        if len(args) != 1 or not args[0]:
            raise _refuse(f"{where}: WORKDIR takes one path")
    elif kind == "USER":
        if not 1 <= len(args) <= 2 or not _USER.fullmatch(args[0]):
            raise _refuse(f"{where}: USER takes a user name ([a-z_][a-z0-9_-]*)")
    elif kind == "ENV":
        if not args or len(args) % 2:
            raise _refuse(f"{where}: ENV takes key and value pairs")
        for name in args[::2]:
            if not _ENV_NAME.fullmatch(name):
                raise _refuse(f"{where}: {name[:40]!r} is not an environment variable name")


def parse_plan(body: Mapping[str, Any]) -> BuildPlan:
    """The build-start body read into a plan; 400 for anything a build could not carry out."""
    from_image = body.get("fromImage")
    from_template = body.get("fromTemplate")
    registry = body.get("fromImageRegistry")
    if from_image is not None:
        from_image = _text(from_image, "fromImage").strip()
    if from_template is not None:
        from_template = _text(from_template, "fromTemplate").strip()
    if bool(from_image) == bool(from_template):
        raise _refuse("give exactly one of fromImage and fromTemplate")
    credentials = _credentials(registry) if registry is not None else None
    if credentials is not None and not from_image:
        raise _refuse("fromImageRegistry goes with fromImage")
    if from_image and from_image not in BASE_IMAGES:
        try:
            parse_reference(from_image)
        except ImageError as exc:
            raise _refuse(str(exc)) from None
    steps_raw = body.get("steps") or []
    if not isinstance(steps_raw, list):
        raise _refuse("steps must be a list")
    if len(steps_raw) > MAX_STEPS:
        raise _refuse(f"at most {MAX_STEPS} steps")
    steps = tuple(_step(index, raw) for index, raw in enumerate(steps_raw))
    start_cmd = body.get("startCmd")
    ready_cmd = body.get("readyCmd")
    return BuildPlan(
        from_image=from_image,
        from_template=from_template,
        steps=steps,
        force=bool(body.get("force") or False),
        start_cmd=None if start_cmd in (None, "") else _text(start_cmd, "startCmd"),
        ready_cmd=None if ready_cmd in (None, "") else _text(ready_cmd, "readyCmd"),
        credentials=credentials,
    )


def _credentials(registry: object) -> RegistryCredentials:
    kind = registry.get("type") if isinstance(registry, dict) else None
    if kind in ("aws", "gcp"):
        raise _refuse(
            f"{str(kind).upper()} registry credentials are a cloud service this server cannot use: "
            "give the image's registry username and password (from_image(..., username=, password=))"
        )
    if kind != "registry" or not isinstance(registry, dict):
        raise _refuse("fromImageRegistry type must be registry, aws or gcp")
    username, password = registry.get("username"), registry.get("password")
    if not isinstance(username, str) or not isinstance(password, str) or not username or not password:
        raise _refuse("fromImageRegistry of type registry needs a username and a password")
    if ":" in username or any(ord(ch) < 32 for ch in username + password):
        raise _refuse("the registry username may not hold ':' or control characters")
    return RegistryCredentials(username, password)


# -- cache keys ---------------------------------------------------------------------------


def _sha(*parts: object) -> str:
    text = json.dumps(parts, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def base_key(layer: str, config: BuildConfig) -> str:
    return _sha("base", layer, config.to_dict())


def step_key(previous: str, step: Step) -> str:
    return _sha("step", previous, step.key_document())


def finalize_key(previous: str, start_cmd: str | None, ready_cmd: str | None) -> str:
    return _sha("finalize", previous, start_cmd, ready_cmd)


def step_name(index: int) -> str:
    """The ``step`` the clients map back to the builder call: "1" is the first step (0 is the base)."""
    return str(index + 1)


# -- what each step runs (as root unless said) --------------------------------------------


def workdir_script(path: str) -> str:
    """Make the folder (as the current user) and print where it is, absolute."""
    return f"mkdir -p -- {shlex.quote(path)} && cd -- {shlex.quote(path)} && pwd"


def user_script(name: str, sudo: bool) -> str:
    """Create the user with a home when missing (as root); with ``sudo``, passwordless sudo too."""
    quoted = shlex.quote(name)
    script = f"id -u {quoted} >/dev/null 2>&1 || useradd -m -s /bin/bash {quoted}"
    if sudo:
        line = shlex.quote(f"{name} ALL=(ALL:ALL) NOPASSWD: ALL")
        script += (
            f" && passwd -d {quoted} >/dev/null && printf '%s\\n' {line} > /etc/sudoers.d/{quoted}"
            f" && chmod 0440 /etc/sudoers.d/{quoted}"
        )
    return script


def env_script(value: str) -> str:
    """Print ``value`` as the shell expands it inside double quotes (``$VAR``, ``$(...)``), like ENV."""
    escaped = value.replace("\\", "\\\\").replace('"', '\\"')
    return f'printf %s "{escaped}"'


def copy_script(*, archive: str, unpack: str, source: str, target: str, owner: str, mode: str | None) -> str:
    """Unpack the archive and move ``source`` (its path inside) to ``target``, as root.

    Docker's COPY rules: a file goes to ``target`` itself, or into it when ``target`` ends with
    "/" or is a folder; a folder's contents go into ``target``; a glob copies what matched, with
    the folders they are in relative to the glob's fixed part. Owners and modes are set before
    the move; a symbolic link is moved as it is (the client resolved links when asked).
    """
    q = shlex.quote
    return "\n".join(
        [
            "set -e",
            f"rm -rf -- {q(unpack)} && mkdir -p -- {q(unpack)}",
            f"tar -xf {q(archive)} -C {q(unpack)} --no-same-owner",
            f"rm -f -- {q(archive)}",
            f"src={q(source)}",
            f"dest={q(target)}",
            'if [ -L "$src" ] || [ -f "$src" ]; then',
            f'  chown -h {q(owner)} "$src"',
            *([f'  [ -L "$src" ] || chmod {q(mode)} "$src"'] if mode else []),
            '  case "$dest" in */) mkdir -p -- "$dest"; dest="$dest$(basename -- "$src")";; esac',
            '  if [ -d "$dest" ] && [ ! -L "$dest" ]; then dest="$dest/$(basename -- "$src")"; fi',
            '  mkdir -p -- "$(dirname -- "$dest")"',
            '  mv -f -T -- "$src" "$dest"',
            'elif [ -d "$src" ]; then',
            f'  chown -hR {q(owner)} "$src"',
            *([f'  find "$src" -mindepth 1 ! -type l -exec chmod {q(mode)} {{}} +'] if mode else []),
            '  mkdir -p -- "$dest"',
            '  find "$src" -mindepth 1 -maxdepth 1 -exec cp -a -- {} "$dest/" \\;',
            "else",
            '  echo "nothing to copy: the archive has no $src" >&2; exit 1',
            "fi",
            f"rm -rf -- {q(unpack)}",
        ]
    )


def copy_source(src: str) -> str:
    """The part of a COPY source before its first glob character (the client packed what matched)."""
    parts: list[str] = []
    for part in src.strip("/").split("/"):
        if any(char in part for char in "*?[{"):
            break
        if part not in ("", "."):
            parts.append(part)
    return "/".join(parts)


def after_user(config: BuildConfig, name: str) -> BuildConfig:
    """A USER step: later steps run as ``name``, in the home of ``name`` unless a WORKDIR said otherwise."""
    return replace(config, user=name)


def after_env(config: BuildConfig, values: Sequence[tuple[str, str]]) -> BuildConfig:
    env = dict(config.env)
    env.update(values)
    return replace(config, env=env)
