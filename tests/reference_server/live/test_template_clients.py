"""Template builds through the official clients, as their users write them, against a live server.

The Python client (sync) builds from the base image with every kind of step (run as user and
root, copy with links kept and resolved, owners and modes, make-dir, make-symlink, rename,
remove, env, workdir, a new user) and a start command with a ready check, then from that
template; it uses tags, a failing step and a missing user. The async client builds in the
background and polls; the JS client builds, tags and creates. Each then creates sandboxes of the
results and reports what they hold, which the tests assert. One build of each kind of base runs
on every serving backend (``backend_server``).
"""

from __future__ import annotations

import pytest

from conformance._clients import NodeClients, PythonClients
from conformance._endpoint import ManagedServer
from tests.servers import run_client

pytestmark = [pytest.mark.artifacts]

PY_SYNC = r"""
import json, os, pathlib, tempfile
from e2b import Sandbox, Template, wait_for_port
from e2b.exceptions import BuildException, SandboxException

ctx = pathlib.Path(tempfile.mkdtemp())
(ctx / "hello.txt").write_text("hello\n")
(ctx / "site").mkdir()
(ctx / "site" / "index.html").write_text("<p>site</p>\n")
(ctx / "site" / "tool.sh").write_text("#!/bin/sh\necho tool\n")
os.symlink("hello.txt", ctx / "link.txt")
out = {}

base = (
    Template(file_context_path=str(ctx))
    .from_base_image()
    # What the clients' default base image offers a build (a missing tool fails this step).
    .run_cmd("python --version && pip --version && node --version && npm --version && git --version && sudo -n true")
    .run_cmd("whoami > /home/user/build-user && pwd > /home/user/build-pwd")
    .run_cmd("mkdir -p /opt/rooted && touch /opt/rooted/made", user="root")
    .copy("hello.txt", "/home/user/copied/")
    .copy("site", "/srv/site/", user="root", mode=0o755)
    .copy("link.txt", "/home/user/kept/")
    .copy("link.txt", "/home/user/resolved/", resolve_symlinks=True)
    .make_dir("/home/user/data")
    .make_symlink("/home/user/copied/hello.txt", "/home/user/hello-link")
    .run_cmd("echo one > /home/user/old.txt")
    .rename("/home/user/old.txt", "/home/user/new.txt")
    .run_cmd("touch /home/user/gone.txt")
    .remove("/home/user/gone.txt")
    .set_envs({"GREETING": "hi there", "BIN_DIR": "$HOME/bin"})
    .set_workdir("/srv/site")
    .set_start_cmd("python3 -m http.server 8000 --bind 127.0.0.1", wait_for_port(8000))
)
info = Template.build(base, "live-base", tags=["v1"])
out["tags"] = info.tags
sbx = Sandbox.create("live-base:v1")
try:
    def sh(cmd):
        result = sbx.commands.run(cmd)
        return result.stdout.strip()
    out["whoami"] = sh("whoami")
    out["pwd"] = sh("pwd")
    out["env"] = sh('echo "$GREETING|$BIN_DIR"')
    out["build_user"] = sh("cat /home/user/build-user /home/user/build-pwd")
    out["rooted"] = sh("stat -c %U /opt/rooted/made")
    out["copied"] = sh("cat /home/user/copied/hello.txt; stat -c %U /home/user/copied/hello.txt")
    out["site"] = sh("stat -c '%U %a' /srv/site/index.html /srv/site/tool.sh")
    out["kept"] = sh("readlink /home/user/kept/link.txt || echo not-a-link")
    out["resolved"] = sh("test -L /home/user/resolved/link.txt && echo link || cat /home/user/resolved/link.txt")
    out["symlink"] = sh("readlink /home/user/hello-link")
    out["renamed"] = sh("cat /home/user/new.txt; ls /home/user/old.txt /home/user/gone.txt 2>&1 | wc -l")
    out["data_dir"] = sh("test -d /home/user/data && echo dir")
    out["served"] = sh("curl -s http://127.0.0.1:8000/index.html")
finally:
    sbx.kill()

child = Template().from_template("live-base:v1").set_user("guest").run_cmd("whoami > ~/me && pwd >> ~/me")
Template.build(child, "live-child")
sbx = Sandbox.create("live-child")
try:
    out["child"] = sbx.commands.run("cat ~/me; whoami; cat /home/user/copied/hello.txt").stdout.split()
finally:
    sbx.kill()

try:
    Template.build(Template().from_base_image().run_cmd("echo partial-output; exit 7"), "live-broken")
except BuildException as exc:
    out["failure"] = str(exc)
try:
    Template.build(Template().from_base_image().run_cmd("id", user="nobody-here"), "live-nouser")
except BuildException as exc:
    out["nouser"] = str(exc)

out["exists"] = [Template.exists("live-base"), Template.exists("live-missing")]
assigned = Template.assign_tags("live-base:v1", ["prod"])
out["assigned"] = assigned.tags
Template.remove_tags("live-base", ["v1"])
out["tags_after"] = sorted(tag.tag for tag in Template.get_tags("live-base"))
prod = Sandbox.create("live-base:prod")
out["prod"] = prod.commands.run("cat /home/user/new.txt").stdout.strip()
prod.kill()
Sandbox.delete_snapshot(info.template_id)
try:
    Sandbox.create("live-base:prod")
except SandboxException as exc:  # a create's 404 is the client's generic error
    out["deleted"] = str(exc)
Sandbox.delete_snapshot("live-child")
print(json.dumps(out))
"""

PY_ASYNC = r"""
import asyncio, json
from e2b import AsyncSandbox, AsyncTemplate, TemplateBuildStatus

async def main():
    template = AsyncTemplate().from_base_image().run_cmd("echo async-built > /home/user/async.txt")
    info = await AsyncTemplate.build_in_background(template, "live-async")
    statuses, offset = [], 0
    while True:
        status = await AsyncTemplate.get_build_status(info, logs_offset=offset)
        offset += len(status.log_entries)
        statuses.append(status.status.value)
        if status.status in (TemplateBuildStatus.READY, TemplateBuildStatus.ERROR):
            break
        await asyncio.sleep(0.2)
    sbx = await AsyncSandbox.create("live-async")
    text = (await sbx.commands.run("cat /home/user/async.txt")).stdout.strip()
    await sbx.kill()
    await AsyncSandbox.delete_snapshot(info.template_id)
    print(json.dumps({"last": statuses[-1], "seen": sorted(set(statuses)), "logs": offset, "text": text}))

asyncio.run(main())
"""

JS = r"""
const { Template, Sandbox, waitForFile } = require('e2b')
;(async () => {
  const out = {}
  const template = Template()
    .fromBaseImage()
    .runCmd('echo js-built > /home/user/js.txt')
    .setEnvs({ JS_VAR: 'from-js' })
    .setStartCmd('sleep 1 && touch /tmp/ready-flag && sleep infinity', waitForFile('/tmp/ready-flag'))
  const info = await Template.build(template, 'live-js', { tags: ['js1'] })
  out.exists = [await Template.exists('live-js'), await Template.exists('live-js-missing')]
  await Template.assignTags('live-js:js1', ['js2'])
  out.tags = (await Template.getTags('live-js')).map((t) => t.tag).sort()
  const sbx = await Sandbox.create('live-js:js2')
  const shown = await sbx.commands.run('cat /home/user/js.txt; echo $JS_VAR; test -e /tmp/ready-flag && echo ready')
  out.text = shown.stdout.trim()
  await sbx.kill()
  try {
    await Template.build(Template().fromBaseImage().runCmd('echo js-fail >&2; false'), 'live-js-broken')
  } catch (err) {
    out.failure = String(err.message)
  }
  await Sandbox.deleteSnapshot(info.templateId)
  console.log(JSON.stringify(out))
})().catch((err) => { console.error(err); process.exit(1) })
"""

SMALL = r"""
import json, pathlib, tempfile
from e2b import Sandbox, Template, wait_for_port
ctx = pathlib.Path(tempfile.mkdtemp())
(ctx / "f.txt").write_text("copied\n")
t = (
    Template(file_context_path=str(ctx)).from_base_image()
    .copy("f.txt", "/home/user/")
    .run_cmd("echo built > /home/user/built.txt")
    .set_start_cmd("python3 -m http.server 8001 --bind 127.0.0.1", wait_for_port(8001))
)
info = Template.build(t, "live-small")
child = Template().from_template("live-small").run_cmd("echo child >> /home/user/built.txt")
Template.build(child, "live-small-child")
sbx = Sandbox.create("live-small-child")
try:
    out = sbx.commands.run("cat /home/user/f.txt /home/user/built.txt; whoami").stdout.split()
finally:
    sbx.kill()
Sandbox.delete_snapshot("live-small-child")
Sandbox.delete_snapshot(info.template_id)
print(json.dumps(out))
"""


def test_python_sync_builds_with_every_step_and_sandboxes_start_from_them(
    live_server: ManagedServer, python_clients: PythonClients
) -> None:
    out = run_client([str(python_clients.python), "-I", "-c", PY_SYNC], live_server)
    assert out["tags"] == ["v1"]
    assert out["whoami"] == "user"
    assert out["pwd"] == "/srv/site"
    assert out["env"] == "hi there|/home/user/bin"
    assert out["build_user"].split() == ["user", "/home/user"]  # steps run as user in their home
    assert out["rooted"] == "root"
    assert out["copied"].split() == ["hello", "user"]
    assert out["site"].splitlines() == ["root 755", "root 755"]
    assert out["kept"] == "hello.txt"  # a link kept as a link
    assert out["resolved"] == "hello"  # and resolved when asked
    assert out["symlink"] == "/home/user/copied/hello.txt"
    assert out["renamed"].split() == ["one", "2"]  # renamed, and both old names gone
    assert out["data_dir"] == "dir"
    assert out["served"] == "<p>site</p>"  # the start command runs, and was ready before create answered
    assert out["child"] == ["guest", "/srv/site", "guest", "hello"]  # the base template's workdir is kept
    assert "exit code 7" in out["failure"]
    assert "partial-output" in out["failure"]
    assert "nobody-here" in out["nouser"]
    assert out["exists"] == [True, False]
    assert out["assigned"] == ["prod"]
    assert out["tags_after"] == ["prod"]
    assert out["prod"] == "one"
    assert out["deleted"].startswith("404")


def test_python_async_builds_in_the_background(live_server: ManagedServer, python_clients: PythonClients) -> None:
    out = run_client([str(python_clients.python), "-I", "-c", PY_ASYNC], live_server)
    assert out["last"] == "ready"
    assert out["logs"] > 0
    assert out["text"] == "async-built"


def test_js_builds_tags_and_creates(live_server: ManagedServer, node_clients: NodeClients) -> None:
    out = run_client(["node", "-e", JS], live_server, cwd=str(node_clients.root))
    assert out["exists"] == [True, False]
    assert out["tags"] == ["js1", "js2"]
    assert out["text"].split() == ["js-built", "from-js", "ready"]
    assert "js-fail" in out["failure"]


def test_every_backend_builds_and_runs_templates(backend_server: ManagedServer, python_clients: PythonClients) -> None:
    out = run_client([str(python_clients.python), "-I", "-c", SMALL], backend_server)
    assert out == ["copied", "built", "child", "user"]
