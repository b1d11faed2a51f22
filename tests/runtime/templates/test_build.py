"""Templates are built once per content key, never used half-built, and hold what sandboxes need.

The real ``base`` template is built into the default cache once per source tree (tests
marked ``artifacts``; a second run reuses it). Keys are tested on a copy of the tree, the
mirror parser on sources files written here, and interrupted builds with the real build
code around a stand-in for debootstrap that leaves a mount behind, as a killed one does.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import stat
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from rich.console import Console

from runtime.templates import (
    AGENT_COMMAND,
    Mirror,
    PlainProgress,
    ProgressEvent,
    RichProgress,
    Template,
    TemplateError,
    _build,
    _commands,
    _keys,
    base_layer_key,
    default_progress,
    ensure_template,
    find_debian_mirror,
    list_templates,
    os_layer_key,
)
from runtime.templates._progress import step

REPO = Path(__file__).resolve().parents[3]
IMPORT_CHECK = "import runtime.agent, contract.generated.process.process_pb2"

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="mounting and chroot need root")


def _unmount_all(path: Path) -> None:
    # The tests' own safety net: whatever the code under test did, nothing stays mounted.
    for point in _commands.mounts_below(path):
        subprocess.run(["umount", "--lazy", str(point)], check=False)


def _mount_tmpfs(point: Path) -> None:
    point.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(point)], check=True)
    (point / "inside-the-mount").write_text("removing through a mount would delete this")


# --- the mirror comes from apt's own configuration ---


def _apt_dir(tmp_path: Path, files: dict[str, str]) -> Path:
    apt = tmp_path / "apt"
    (apt / "sources.list.d").mkdir(parents=True)
    for name, text in files.items():
        (apt / name).write_text(text)
    return apt


def test_mirror_from_deb822(tmp_path: Path) -> None:
    keyring = tmp_path / "archive-keyring.gpg"
    keyring.write_bytes(b"not really a key")
    apt = _apt_dir(
        tmp_path,
        {
            "sources.list.d/debian.sources": f"""\
# sources only
Types: deb-src
URIs: http://sources.example/debian
Suites: bookworm
Components: main

Types: deb
URIs: http://disabled.example/debian
Suites: bookworm
Components: main
Enabled: no

Types: deb
URIs: http://security.example/debian-security
Suites: bookworm-security
Components: main

types: deb deb-src
# a comment inside a stanza does not end it
URIs: file:/srv/mirror http://mirror-a.example/debian/
Suites: bookworm bookworm-updates
Components: contrib main
Signed-By: {keyring}
""",
        },
    )
    mirror = find_debian_mirror("bookworm", apt_dir=apt)
    assert mirror == Mirror(
        uri="http://mirror-a.example/debian", keyring=keyring, origin=apt / "sources.list.d/debian.sources"
    )


def test_mirror_with_an_inline_key_has_no_keyring(tmp_path: Path) -> None:
    apt = _apt_dir(
        tmp_path,
        {
            "sources.list.d/inline.sources": """\
Types: deb
URIs: https://mirror-c.example/debian
Suites: bookworm
Components: main
Signed-By:
 -----BEGIN PGP PUBLIC KEY BLOCK-----
 .
 mQINBFxZ
 -----END PGP PUBLIC KEY BLOCK-----
""",
        },
    )
    assert find_debian_mirror("bookworm", apt_dir=apt) == Mirror(
        uri="https://mirror-c.example/debian", keyring=None, origin=apt / "sources.list.d/inline.sources"
    )


def test_mirror_from_one_line_format(tmp_path: Path) -> None:
    apt = _apt_dir(
        tmp_path,
        {
            "sources.list": """\
# deb http://commented.example/debian bookworm main
deb-src http://sources.example/debian bookworm main
deb http://updates.example/debian bookworm-updates main
deb cdrom:[Debian 12]/ bookworm main
deb [ arch=amd64 signed-by=/nonexistent/keyring.gpg ] https://mirror-b.example/debian bookworm contrib main # trailing
""",
        },
    )
    mirror = find_debian_mirror("bookworm", apt_dir=apt)
    assert mirror == Mirror(uri="https://mirror-b.example/debian", keyring=None, origin=apt / "sources.list")


def test_mirror_follows_apts_file_order(tmp_path: Path) -> None:
    line = "deb http://{}.example/debian bookworm main\n"
    stanza = "Types: deb\nURIs: http://{}.example/debian\nSuites: bookworm\nComponents: main\n"
    files = {"sources.list.d/b.list": line.format("b"), "sources.list.d/a.sources": stanza.format("a")}
    assert find_debian_mirror("bookworm", apt_dir=_apt_dir(tmp_path / "1", files)).uri == "http://a.example/debian"
    files["sources.list"] = line.format("main")
    assert find_debian_mirror("bookworm", apt_dir=_apt_dir(tmp_path / "2", files)).uri == "http://main.example/debian"


def test_no_mirror_is_an_error_naming_the_files(tmp_path: Path) -> None:
    apt = _apt_dir(tmp_path, {"sources.list": "deb http://old.example/debian bullseye main\n"})
    with pytest.raises(TemplateError, match=r"no enabled http\(s\) 'deb' source for bookworm main") as caught:
        find_debian_mirror("bookworm", apt_dir=apt)
    assert str(apt / "sources.list") in str(caught.value)


# --- keys: content, not location or timestamps ---


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of the checkout's key inputs (so edits never touch the real repository)."""
    copy = tmp_path / "repo"
    copy.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, copy / name)
    for package in _keys.PACKAGE_DIRS:
        shutil.copytree(REPO / package, copy / package, ignore=shutil.ignore_patterns("__pycache__"), symlinks=True)
    return copy


def test_key_is_stable_for_an_unchanged_tree(tree: Path, tmp_path: Path) -> None:
    os_key = os_layer_key()
    key = base_layer_key(os_key, tree)
    assert base_layer_key(os_key, tree) == key
    elsewhere = shutil.copytree(tree, tmp_path / "elsewhere", symlinks=True)
    assert base_layer_key(os_key, elsewhere) == key, "the key depends on content, not on the folder"
    some_file = tree / "runtime" / "__init__.py"
    os.utime(some_file, (0, 0))
    (tree / "runtime" / "__pycache__").mkdir(exist_ok=True)
    (tree / "runtime" / "__pycache__" / "junk.cpython-311.pyc").write_bytes(b"compiled")
    (tree / "README.md").write_text("only wheel metadata")
    assert base_layer_key(os_key, tree) == key, "timestamps, __pycache__ and README do not count"


@pytest.mark.parametrize(
    "edit",
    [
        pytest.param(lambda t: (t / "runtime" / "__init__.py").write_text("# changed\n"), id="edit-runtime"),
        pytest.param(lambda t: (t / "runtime" / "new_module.py").write_text(""), id="add-runtime"),
        pytest.param(lambda t: (t / "contract" / "manifest.json").unlink(), id="remove-contract"),
        pytest.param(lambda t: (t / "pyproject.toml").write_text("[project]\n"), id="pyproject"),
    ],
)
def test_key_changes_with_the_code(tree: Path, edit: Callable[[Path], object]) -> None:
    os_key = os_layer_key()
    before = base_layer_key(os_key, tree)
    edit(tree)
    assert base_layer_key(os_key, tree) != before


def test_key_changes_with_the_os_layer(tree: Path) -> None:
    assert base_layer_key(os_layer_key("amd64"), tree) != base_layer_key(os_layer_key("arm64"), tree)
    assert os_layer_key("amd64") == os_layer_key("amd64")


def test_os_recipe_sorts_packages_and_leaves_out_the_mirror() -> None:
    recipe = _keys.os_recipe("amd64")
    assert recipe["packages"] == sorted(_keys.OS_PACKAGES)
    assert {"tini", "python3-venv", "sudo"} <= set(_keys.OS_PACKAGES)
    assert "http" not in json.dumps(recipe)


# --- progress ---


def test_plain_progress_prints_step_lines() -> None:
    out = io.StringIO()
    report = PlainProgress(out)
    with step(report, "first") as detail:
        detail("a line of output")
    with pytest.raises(RuntimeError), step(report, "second"):
        raise RuntimeError
    report(ProgressEvent("a note", "note"))
    lines = out.getvalue().splitlines()
    assert lines[0] == "step: first …"
    assert lines[1].startswith("step: first: done in ")
    assert lines[2] == "step: second …"
    assert lines[3].startswith("step: second: failed after ")
    assert lines[4] == "step: a note"
    assert "a line of output" not in out.getvalue()


def test_rich_progress_ends_each_step_with_a_line() -> None:
    out = io.StringIO()
    report = RichProgress(Console(file=out, width=100, force_terminal=False))
    with step(report, "[bold]brackets[/] stay") as detail:
        detail("I: Retrieving [something]")
    with pytest.raises(KeyboardInterrupt), step(report, "interrupted"):
        raise KeyboardInterrupt
    text = out.getvalue()
    assert "✓ [bold]brackets[/] stay" in text
    assert "✗ interrupted" in text


def test_default_progress_is_plain_off_a_terminal() -> None:
    assert isinstance(default_progress(io.StringIO()), PlainProgress)


# --- commands and errors ---


def test_failing_command_reports_command_and_output_tail() -> None:
    cmd = ["sh", "-c", "for i in $(seq 1 50); do echo line $i; done; echo last words >&2; exit 3"]
    with pytest.raises(TemplateError) as caught:
        _commands.run(cmd, "demo step")
    message = str(caught.value)
    assert message.startswith("demo step failed (exit 3): sh -c ")
    assert message.rstrip().endswith("last words")
    assert "line 50" in message
    assert "line 1\n" not in message, "only the tail"


def test_missing_program_is_a_template_error() -> None:
    with pytest.raises(TemplateError, match="could not start no-such-program-here"):
        _commands.run(["no-such-program-here"], "demo step")


def test_unknown_template_name() -> None:
    with pytest.raises(TemplateError, match="unknown template 'nope'"):
        ensure_template("nope")


def test_list_templates_shows_only_finished_ones(tmp_path: Path) -> None:
    root = tmp_path / "templates"
    meta = {"name": "os", "key": "ab" * 32, "agent_command": []}
    for folder in ("os-abababababababab", ".os-abababababababab.build-x1y2"):
        (root / folder / "rootfs").mkdir(parents=True)
        (root / folder / "template.json").write_text(json.dumps(meta))
    (root / "base-no-metadata" / "rootfs").mkdir(parents=True)
    assert list_templates(tmp_path) == [
        Template("os", "ab" * 32, root / "os-abababababababab", root / "os-abababababababab" / "rootfs", ())
    ]
    assert list_templates(tmp_path / "empty") == []


# --- interrupted builds leave nothing behind ---


@pytest.fixture
def scratch_cache(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path / "cache"
    _unmount_all(tmp_path)


@needs_root
@pytest.mark.parametrize("interrupt", [False, True], ids=["next-step-fails", "ctrl-c-in-debootstrap"])
def test_interrupted_build_leaves_nothing(
    scratch_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, interrupt: bool
) -> None:
    def fake_debootstrap(rootfs: Path, arch: str, mirror: Mirror, detail: object) -> None:
        # Half a rootfs, with /proc still mounted: what a killed debootstrap leaves.
        (rootfs / "etc").mkdir(parents=True)
        (rootfs / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
        _mount_tmpfs(rootfs / "proc")
        if interrupt:
            raise KeyboardInterrupt

    monkeypatch.setattr(_build, "find_debian_mirror", lambda suite: Mirror("http://mirror.invalid", None, tmp_path))
    monkeypatch.setattr(_build, "_debootstrap", fake_debootstrap)
    events: list[ProgressEvent] = []
    expected: type[BaseException] = KeyboardInterrupt if interrupt else TemplateError
    with pytest.raises(expected) as caught:
        ensure_template("os", cache_root=scratch_cache, progress=events.append)

    root = scratch_cache / "templates"
    assert sorted(p.name for p in root.iterdir()) == [".lock"], "no final folder, no build folder"
    assert _commands.mounts_below(tmp_path) == []
    assert [e.state for e in events if e.state in ("done", "failed")][-1] == "failed"
    if not interrupt:
        # The next real step ran chroot in the half rootfs and said exactly what failed.
        assert "adding the sandbox group failed" in str(caught.value)
        assert "chroot " in str(caught.value)


@needs_root
def test_leftover_build_folders_are_swept_safely(tmp_path: Path) -> None:
    root = tmp_path / "templates"
    leftover = root / ".base-0123456789abcdef.build-k1ll3d"
    (leftover / "rootfs").mkdir(parents=True)
    _mount_tmpfs(leftover / "rootfs" / "proc")
    try:
        events: list[ProgressEvent] = []
        _build._sweep(root, events.append)
        assert not leftover.exists()
        assert _commands.mounts_below(tmp_path) == []
        assert events == [ProgressEvent(f"removing {leftover.name}, left by an interrupted build", "note")]
    finally:
        _unmount_all(tmp_path)


def test_profile_takes_the_uid_from_bash_and_keeps_the_rest(tmp_path: Path) -> None:
    profile = tmp_path / "etc/profile"
    profile.parent.mkdir()
    rest = b'export PATH\n\nif [ "${PS1-}" ]; then\n  :\nfi\n'
    prompt = b'if [ "$PS1" ]; then\n  if [ "$(id -u)" -eq 0 ]; then\n    PS1="# "\n  fi\nfi\n'
    profile.write_bytes(b'# profile\nif [ "$(id -u)" -eq 0 ]; then\n  PATH="/sbin"\nfi\n' + prompt + rest)
    profile.chmod(0o644)
    _build._profile_without_id_fork(tmp_path)
    assert profile.read_bytes() == (
        b'# profile\nif [ "${EUID:-$(id -u)}" -eq 0 ]; then\n  PATH="/sbin"\nfi\n'
        + prompt.replace(b'"$(id -u)"', b'"${EUID:-$(id -u)}"')
        + rest
    )
    assert stat.S_IMODE(profile.stat().st_mode) == 0o644


def test_a_profile_that_tests_the_uid_otherwise_is_refused(tmp_path: Path) -> None:
    profile = tmp_path / "etc/profile"
    profile.parent.mkdir()
    profile.write_bytes(b'if [ "`id -u`" -eq 0 ]; then\n  PATH="/sbin"\nfi\n')
    with pytest.raises(TemplateError, match="does not test the uid"):
        _build._profile_without_id_fork(tmp_path)
    assert profile.read_bytes() == b'if [ "`id -u`" -eq 0 ]; then\n  PATH="/sbin"\nfi\n'


# --- the real base template (built once into the default cache) ---


def _in_root(rootfs: Path, *cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["chroot", str(rootfs), *cmd], env=dict(_commands.CHROOT_ENV), capture_output=True, text=True, check=False
    )


@pytest.fixture(scope="session")
def base_template() -> Template:
    if os.geteuid() != 0:
        pytest.skip("building a template needs root")
    if shutil.which("debootstrap") is None:
        pytest.skip("debootstrap is not installed")
    return ensure_template("base", progress=PlainProgress())


@pytest.mark.artifacts
def test_sandbox_user(base_template: Template) -> None:
    rootfs = base_template.rootfs
    home = (rootfs / "home" / "user").stat()
    assert (home.st_uid, home.st_gid) == (1000, 1000)
    passwd = {line.split(":")[0]: line.split(":") for line in (rootfs / "etc/passwd").read_text().splitlines()}
    assert passwd["user"][2:4] == ["1000", "1000"]
    assert passwd["user"][5:] == ["/home/user", "/bin/bash"]
    assert "user:x:1000:" in (rootfs / "etc/group").read_text().splitlines()


@pytest.mark.artifacts
def test_passwordless_sudo(base_template: Template) -> None:
    sudoers = base_template.rootfs / "etc/sudoers.d/user"
    assert sudoers.read_text() == "user ALL=(ALL:ALL) NOPASSWD: ALL\n"
    assert stat.S_IMODE(sudoers.stat().st_mode) == 0o440
    checked = _in_root(base_template.rootfs, "visudo", "--check", "--file", "/etc/sudoers.d/user")
    assert checked.returncode == 0, checked.stdout + checked.stderr


@pytest.mark.artifacts
def test_os_contents(base_template: Template) -> None:
    rootfs = base_template.rootfs
    tini = rootfs / "usr/bin/tini"
    assert tini.is_file()
    assert os.access(tini, os.X_OK)
    assert (rootfs / "etc/hostname").read_bytes() == b""
    assert (rootfs / "etc/resolv.conf").read_bytes() == b""
    assert list((rootfs / "var/cache/apt/archives").glob("*.deb")) == []
    assert list((rootfs / "var/lib/apt/lists").iterdir()) == []
    assert not (rootfs / "tmp/e2b-compat-wheelhouse").exists()


ROOT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
USER_PATH = "/usr/local/bin:/usr/bin:/bin:/usr/local/games:/usr/games"


@pytest.mark.artifacts
@pytest.mark.parametrize("shell", ["/bin/bash", "/bin/sh"])
@pytest.mark.parametrize(("userspec", "path"), [(None, ROOT_PATH), ("1000:1000", USER_PATH)], ids=["root", "user"])
def test_login_shells_pick_path_by_uid_and_bash_forks_no_id(
    base_template: Template, shell: str, userspec: str | None, path: str
) -> None:
    """What the clients' ``bash -l -c`` reads: the PATH of the uid, without running ``id`` in bash."""
    user = [f"--userspec={userspec}"] if userspec else []
    home = "/home/user" if userspec else "/root"
    done = subprocess.run(
        ["chroot", *user, str(base_template.rootfs), shell, "-l", "-x", "-c", 'echo "$PATH"'],
        env={**_commands.CHROOT_ENV, "HOME": home},
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == path + "\n"
    ran_id = "id -u" in done.stderr  # -x traces the subshell's command
    assert ran_id == (shell == "/bin/sh"), done.stderr  # dash has no $EUID and still asks


@pytest.mark.artifacts
def test_agent_imports_inside_the_rootfs(base_template: Template) -> None:
    # No /proc is mounted: the import does not need it (and so nothing has to be unmounted).
    done = _in_root(base_template.rootfs, "/opt/e2b-compat/venv/bin/python", "-c", IMPORT_CHECK)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.artifacts
def test_metadata(base_template: Template) -> None:
    meta = json.loads((base_template.path / "template.json").read_text())
    assert base_template.path.name == f"base-{base_template.key[:16]}"
    assert sorted(p.name for p in base_template.path.iterdir()) == ["rootfs", "template.json"]
    assert (meta["name"], meta["key"]) == ("base", base_template.key)
    assert base_template.agent_command == AGENT_COMMAND == tuple(meta["agent_command"])
    assert AGENT_COMMAND[:3] == ("/opt/e2b-compat/venv/bin/python", "-m", "runtime.agent")
    assert meta["recipe"]["os_key"] == os_layer_key()
    assert meta["size"]["bytes"] > 100_000_000
    assert any(name.startswith("e2b_compat-") for name in meta["wheels"])
    assert meta["from"] == f"os-{os_layer_key()[:16]}"


@pytest.mark.artifacts
def test_second_call_reuses_the_template(base_template: Template) -> None:
    if base_layer_key(os_layer_key(), REPO) != base_template.key:
        pytest.skip("the checkout changed since the template was built")
    events: list[ProgressEvent] = []
    again = ensure_template("base", progress=events.append)
    assert again == base_template
    assert [e.state for e in events] == ["note"]
    assert "is cached" in events[0].step
    names = {t.path.name for t in list_templates()}
    assert {base_template.path.name, f"os-{os_layer_key()[:16]}"} <= names


@pytest.mark.artifacts
@needs_root
def test_interrupted_base_build_leaves_nothing(base_template: Template, tmp_path: Path) -> None:
    # The real base pipeline on a copy of the cached os layer: the rootfs is copied and the
    # venv made, then Ctrl-C arrives while pip wheel is running.
    cache = tmp_path / "cache"
    os_layer = base_template.path.parent / f"os-{os_layer_key()[:16]}"
    (cache / "templates").mkdir(parents=True)
    subprocess.run(["cp", "-a", "--reflink=auto", str(os_layer), str(cache / "templates")], check=True)
    seen: list[ProgressEvent] = []

    def interrupt_in_pip_wheel(event: ProgressEvent) -> None:
        seen.append(event)
        if event.state == "detail" and "pip wheel" in event.step:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        ensure_template("base", cache_root=cache, repo=REPO, progress=interrupt_in_pip_wheel)
    assert [e.step for e in seen if e.state == "done"][-1].startswith("creating /opt/e2b-compat/venv")
    assert sorted(p.name for p in (cache / "templates").iterdir()) == [".lock", os_layer.name]
    assert _commands.mounts_below(tmp_path) == []


def _fake_bases(root: Path, count: int) -> None:
    """``count`` base templates (metadata only) under ``root``, each built a second after the one before."""
    import json as _json
    import os as _os

    for index in range(count):
        folder = root / f"base-{index:016x}"
        (folder / "rootfs").mkdir(parents=True)
        meta = folder / "template.json"
        meta.write_text(_json.dumps({"name": "base", "key": f"{index:064x}", "agent_command": ["x"]}))
        _os.utime(meta, (1_000_000 + index, 1_000_000 + index))


def test_prune_keeps_the_newest_base_templates(tmp_path: Path) -> None:
    import json as _json

    from runtime.templates import list_templates, prune_templates

    root = tmp_path / "templates"
    _fake_bases(root, 4)
    (root / "os-0000000000000000" / "rootfs").mkdir(parents=True)
    (root / "os-0000000000000000" / "template.json").write_text(
        _json.dumps({"name": "os", "key": "0" * 64, "agent_command": []})
    )
    removed = prune_templates(tmp_path, keep=2)
    assert sorted(p.name for p in removed) == ["base-0000000000000000", "base-0000000000000001"]
    assert [t.path.name for t in list_templates(tmp_path)] == [
        "base-0000000000000002",
        "base-0000000000000003",
        "os-0000000000000000",
    ]


def test_prune_ranks_by_use_and_spares_what_was_used_lately(tmp_path: Path) -> None:
    """A lookup marks a template used; one used within the grace period stays whatever its rank.

    Another checkout's build on the host pruned the base a starting server had just found (its
    users not yet registered), and that server's interpreter build failed copying it.
    """
    import os as _os
    import time as _time

    from runtime.templates import list_templates, prune_templates
    from runtime.templates._build import PRUNE_GRACE_S, _materialize

    root = tmp_path / "templates"
    _fake_bases(root, 4)

    def never(_tmp: Path) -> dict[str, object]:
        raise AssertionError("found, not built")

    found = _materialize(root, "base", f"{0:064x}", recipe={}, agent_command=("x",), build=never)
    assert found.path.name == "base-0000000000000000"
    lately = _time.time() - PRUNE_GRACE_S / 2
    _os.utime(root / "base-0000000000000001" / "template.json", (lately, lately))
    removed = prune_templates(tmp_path, keep=1)
    assert sorted(p.name for p in removed) == ["base-0000000000000002", "base-0000000000000003"]
    assert [t.path.name for t in list_templates(tmp_path)] == ["base-0000000000000000", "base-0000000000000001"]


def test_parallel_prunes_remove_each_old_template_once(tmp_path: Path) -> None:
    """Parallel builds all end in a prune: the ones that pick the same old template must not fail."""
    from concurrent.futures import ThreadPoolExecutor

    from runtime.templates import list_templates, prune_templates

    _fake_bases(tmp_path / "templates", 24)
    with ThreadPoolExecutor(8) as pool:
        removed = list(pool.map(lambda _: prune_templates(tmp_path, keep=2), range(8)))  # raises what one raised
    names = sorted(path.name for paths in removed for path in paths)
    assert names == [f"base-{index:016x}" for index in range(22)], "each old one removed, by exactly one pruner"
    assert [t.path.name for t in list_templates(tmp_path)] == [f"base-{index:016x}" for index in (22, 23)]


def test_prune_removes_image_templates_whose_agent_base_is_gone(tmp_path: Path) -> None:
    from runtime.templates import list_templates, prune_templates

    root = tmp_path / "templates"

    def template(folder: str, name: str, key: str, recipe: dict[str, str] | None = None) -> None:
        (root / folder / "rootfs").mkdir(parents=True)
        meta = {"name": name, "key": key, "agent_command": ["x"], "recipe": recipe or {}}
        (root / folder / "template.json").write_text(json.dumps(meta))
        os.utime(root / folder / "template.json", (1_000_000, 1_000_000))  # long unused

    template("base-" + "b" * 16, "base", "b" * 64)
    template("image-" + "1" * 16, "image", "1" * 64, {"kind": "image", "agent": "b" * 64})
    template("image-" + "2" * 16, "image", "2" * 64, {"kind": "image", "agent": "a" * 64})  # its base is gone
    removed = prune_templates(tmp_path, keep=2)
    assert [p.name for p in removed] == ["image-" + "2" * 16]
    assert [t.path.name for t in list_templates(tmp_path)] == ["base-" + "b" * 16, "image-" + "1" * 16]
