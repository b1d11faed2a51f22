"""Templates from OCI images through the official clients, from real registries the tests start.

Two distribution registries run on loopback: one anonymous, one behind basic auth. The image
pushed to both (``conformance._registry``) is a small userland with no Python, whose second layer
removes a file, makes a folder opaque and adds a file with its own owner and mode. The clients
build from it with ``from_image`` (with and without credentials) and ``from_dockerfile``, add
steps and a start command, and create sandboxes of the results. Failures are real too: a wrong
password, a registry serving tampered layer bytes, an image that does not exist. A server of its
own pulls through a mirror for a registry it cannot reach. One image build runs on every backend.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from conformance._clients import NodeClients, PythonClients
from conformance._endpoint import ManagedServer
from conformance._registry import Pushed, Registry, changes_layer, local_registry, push_image, userland_layer
from runtime.templates import ensure_template
from tests.servers import managed_server, run_client

pytestmark = [pytest.mark.artifacts]

USERNAME, PASSWORD = "builder", "pa55-w0rd-never-shown"


@dataclass(frozen=True)
class Registries:
    anonymous: Registry
    private: Registry
    image: Pushed  # on the anonymous registry
    private_image: Pushed
    layers: list[bytes]


@pytest.fixture(scope="module")
def registries() -> Iterator[Registries]:
    layers = [userland_layer(ensure_template("os").rootfs), changes_layer()]
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "IMAGE_VAR": "from-the-image"}
    with local_registry() as anonymous, local_registry(username=USERNAME, password=PASSWORD) as private:
        image = push_image(anonymous, "team/tiny", "1", layers, env=env, as_index=True)
        private_image = push_image(private, "team/secret", "v2", layers, env=env)
        yield Registries(anonymous, private, image, private_image, layers)


PY_SYNC = r"""
import json, os, pathlib, sys, tempfile
from e2b import Sandbox, Template, wait_for_file
from e2b.exceptions import BuildException

private, public, password = sys.argv[1], sys.argv[2], sys.argv[3]
ctx = pathlib.Path(tempfile.mkdtemp())
(ctx / "hello.txt").write_text("hello\n")
os.symlink("hello.txt", ctx / "link.txt")
out = {}
template = (
    Template(file_context_path=str(ctx))
    .from_image(private, username="builder", password=password)
    .run_cmd("whoami > /home/user/build-user; command -v python3 python || echo no-python > /home/user/python")
    .copy("hello.txt", "/home/user/copied/")
    .copy("link.txt", "/home/user/kept/")
    .copy("link.txt", "/home/user/resolved/", resolve_symlinks=True)
    .make_symlink("/home/user/copied/hello.txt", "/home/user/hello-link")
    .set_user("root")
    .run_cmd("mkdir -p /opt/rooted && whoami > /opt/rooted/who")
    .set_user("user")
    .set_envs({"STEP_VAR": "from-a-step"})
    .set_workdir("/home/user/work")
    .set_start_cmd("sleep 1 && touch /tmp/started && sleep infinity", wait_for_file("/tmp/started"))
)
info = Template.build(template, "img-private", tags=["t1"])
sbx = Sandbox.create("img-private:t1")
try:
    def sh(cmd):
        return sbx.commands.run(cmd).stdout.strip()
    out["whoami"] = sh("whoami; pwd")
    out["env"] = sh('echo "$IMAGE_VAR|$STEP_VAR"')
    out["python"] = sh("cat /home/user/python")
    out["build_user"] = sh("cat /home/user/build-user /opt/rooted/who")
    out["copied"] = sh(
        "cat /home/user/copied/hello.txt; readlink /home/user/kept/link.txt; cat /home/user/resolved/link.txt"
    )
    out["symlink"] = sh("readlink /home/user/hello-link")
    out["layers"] = sh("ls /etc/motd 2>&1 | wc -l; ls /opt/old; stat -c '%u %a' /srv/greeting.txt")
    out["started"] = sh("test -e /tmp/started && echo ready")
finally:
    sbx.kill()

dockerfile = f"FROM {public}\nRUN echo from-dockerfile > /srv/df.txt\nENV DF_VAR=df\nWORKDIR /srv\n"
Template.build(Template().from_dockerfile(dockerfile), "img-dockerfile")
sbx = Sandbox.create("img-dockerfile")
try:
    out["dockerfile"] = sbx.commands.run("cat /srv/df.txt; echo $DF_VAR; pwd; whoami").stdout.split()
finally:
    sbx.kill()

for name, builder in (
    ("wrong_password", Template().from_image(private, username="builder", password="not-" + password)),
    ("missing", Template().from_image(public.rsplit(":", 1)[0] + ":no-such-tag")),
):
    try:
        Template.build(builder, "img-" + name.replace("_", "-"))
        out[name] = "built?"
    except BuildException as exc:
        out[name] = str(exc)
Sandbox.delete_snapshot(info.template_id)
Sandbox.delete_snapshot("img-dockerfile")
print(json.dumps(out))
"""


def test_python_sync_builds_from_registry_images(
    live_server: ManagedServer, python_clients: PythonClients, registries: Registries
) -> None:
    args = [registries.private_image.reference, registries.image.reference, PASSWORD]
    out = run_client([str(python_clients.python), "-I", "-c", PY_SYNC, *args], live_server)
    assert out["whoami"].split() == ["user", "/home/user/work"]
    assert out["env"] == "from-the-image|from-a-step"  # the image's environment, then the steps'
    assert out["python"] == "no-python"  # the agent brought its own interpreter
    assert out["build_user"].split() == ["user", "root"]
    assert out["copied"].split() == ["hello", "hello.txt", "hello"]
    assert out["symlink"] == "/home/user/copied/hello.txt"
    # The second layer's whiteout and opaque folder applied; its file's owner and mode kept.
    assert out["layers"].split() == ["1", "kept.txt", "1234", "640"]
    assert out["started"] == "ready"
    assert out["dockerfile"] == ["from-dockerfile", "df", "/srv", "user"]
    assert "unauthorized" in out["wrong_password"] or "authentication required" in out["wrong_password"]
    assert PASSWORD not in out["wrong_password"]
    assert "no-such-tag" in out["missing"]
    assert PASSWORD not in live_server.log.read_text(errors="replace")


PY_ASYNC = r"""
import asyncio, json, sys
from e2b import AsyncSandbox, AsyncTemplate, TemplateBuildStatus

async def main():
    template = AsyncTemplate().from_image(sys.argv[1]).run_cmd("echo async > /home/user/a.txt")
    info = await AsyncTemplate.build_in_background(template, "img-async")
    offset, messages = 0, []
    while True:
        status = await AsyncTemplate.get_build_status(info, logs_offset=offset)
        offset += len(status.log_entries)
        messages += [entry.message for entry in status.log_entries]
        if status.status in (TemplateBuildStatus.READY, TemplateBuildStatus.ERROR):
            break
        await asyncio.sleep(0.2)
    sbx = await AsyncSandbox.create("img-async")
    text = (await sbx.commands.run("cat /home/user/a.txt; ls /opt/old")).stdout.split()
    await sbx.kill()
    await AsyncSandbox.delete_snapshot(info.template_id)
    print(json.dumps({"last": status.status.value, "messages": messages, "text": text}))

asyncio.run(main())
"""


def test_python_async_builds_from_an_image_in_the_background(
    live_server: ManagedServer, python_clients: PythonClients, registries: Registries
) -> None:
    out = run_client([str(python_clients.python), "-I", "-c", PY_ASYNC, registries.image.reference], live_server)
    assert out["last"] == "ready"
    assert out["text"] == ["async", "kept.txt"]
    # The log says which digest the tag was pinned to (the index narrowed to this platform).
    assert any(registries.image.digest in message for message in out["messages"]), out["messages"]


JS = r"""
const { Template, Sandbox } = require('e2b')
;(async () => {
  const [image, password] = process.argv.slice(1)
  const template = Template()
    .fromImage(image, { username: 'builder', password })
    .runCmd('echo js > /home/user/js.txt')
  const info = await Template.build(template, 'img-js')
  const sbx = await Sandbox.create('img-js')
  const shown = await sbx.commands.run('cat /home/user/js.txt; echo $IMAGE_VAR')
  await sbx.kill()
  await Sandbox.deleteSnapshot(info.templateId)
  console.log(JSON.stringify({ text: shown.stdout.trim().split('\n') }))
})().catch((err) => { console.error(err); process.exit(1) })
"""


def test_js_builds_from_a_private_image(
    live_server: ManagedServer, node_clients: NodeClients, registries: Registries
) -> None:
    command = ["node", "-e", JS, registries.private_image.reference, PASSWORD]
    out = run_client(command, live_server, cwd=str(node_clients.root))
    assert out["text"] == ["js", "from-the-image"]


TAMPERED = r"""
import json, sys
from e2b import Template
from e2b.exceptions import BuildException
try:
    Template.build(Template().from_image(sys.argv[1]), "img-tampered")
    print(json.dumps("built"))
except BuildException as exc:
    print(json.dumps(str(exc)))
"""


def test_a_registry_serving_other_bytes_fails_the_build(
    live_server: ManagedServer, python_clients: PythonClients, registries: Registries
) -> None:
    # A layer of its own (so no other test's image shares the blob), then its bytes changed in
    # the registry's storage: the registry serves them under the old digest.
    layer = registries.layers[1] + b"\0" * 1024
    pushed = push_image(registries.anonymous, "team/tampered", "1", [registries.layers[0], layer])
    blob = registries.anonymous.blob_path(pushed.layers[1])
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0xFF
    blob.write_bytes(bytes(data))
    out = run_client([str(python_clients.python), "-I", "-c", TAMPERED, pushed.reference], live_server)
    assert out != "built"
    assert "digest" in out.lower() or "checksum" in out.lower(), out


MIRRORED = r"""
import json, sys
from e2b import Sandbox, Template
info = Template.build(Template().from_image(sys.argv[1]).run_cmd("echo mirrored > /home/user/m.txt"), "img-mirror")
sbx = Sandbox.create("img-mirror")
text = sbx.commands.run("cat /home/user/m.txt; echo $IMAGE_VAR").stdout.split()
sbx.kill()
Sandbox.delete_snapshot(info.template_id)
print(json.dumps(text))
"""


def test_a_mirror_serves_a_registry_the_host_cannot_reach(
    python_clients: PythonClients, registries: Registries
) -> None:
    # 127.0.0.1:9 (discard) is refused at once: the pull can only succeed through the mirror.
    unreachable = "127.0.0.1:9"
    env = {"E2B_COMPAT_SERVER_REGISTRY_MIRRORS": f"{unreachable}={registries.anonymous.host}"}
    with managed_server("mirror", env) as server:
        out = run_client([str(python_clients.python), "-I", "-c", MIRRORED, f"{unreachable}/team/tiny:1"], server)
    assert out == ["mirrored", "from-the-image"]


SMALL = r"""
import json, sys
from e2b import Sandbox, Template, wait_for_file
t = (
    Template().from_image(sys.argv[1])
    .run_cmd("echo built > /home/user/built.txt")
    .set_start_cmd("touch /tmp/up && sleep infinity", wait_for_file("/tmp/up"))
)
info = Template.build(t, "img-small")
sbx = Sandbox.create("img-small")
try:
    # No ls: gVisor's runsc refuses the statx flags coreutils 9 passes (conformance/known-failures.json).
    shown = sbx.commands.run("cat /home/user/built.txt; whoami; echo /opt/old/*; test -e /tmp/up && echo up")
    out = shown.stdout.split()
finally:
    sbx.kill()
Sandbox.delete_snapshot(info.template_id)
print(json.dumps(out))
"""


def test_every_backend_builds_and_runs_image_templates(
    backend_server: ManagedServer, python_clients: PythonClients, registries: Registries
) -> None:
    out = run_client([str(python_clients.python), "-I", "-c", SMALL, registries.image.reference], backend_server)
    assert out == ["built", "user", "/opt/old/kept.txt", "up"]
