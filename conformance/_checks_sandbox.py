"""The control-plane scenarios' checks (``sandbox_*``, ``scenarios/sandbox``); see ``_checks``."""

from __future__ import annotations

from typing import Any

from ._checks import NOT_FOUND

__all__: list[str] = []  # the checks are reached through ``_cases.CASES``

CREATE_TIMEOUT = 120  # what sandbox/create-env-metadata asks for, in seconds


def sandbox_create(r: dict[str, Any], work: str) -> None:
    assert r["stdout"] == "yes\nuser\n/home/user\n"
    assert r["metadata"] == {"case": "create", "n": "1"}
    assert r["template"] == "base"
    assert r["state"] == "running"
    assert r["same_id"] is True
    assert r["ends_after_start"] is True
    # The scenario asks for 120 s (the clients' default is 300 s): end_at - started_at is that timeout.
    assert abs(r["lifetime"] - CREATE_TIMEOUT) <= 2, (
        f"create(timeout={CREATE_TIMEOUT} s): get_info's end_at is {r['lifetime']} s after started_at"
    )


def sandbox_get_host(r: dict[str, Any], work: str) -> None:
    assert r["ok"] is True, r
    assert r["body"] == "hello from inside"
    assert r["host"].startswith("8000-")


def sandbox_list(r: dict[str, Any], work: str) -> None:
    # The specification gives a list no order, but its cursor ("nextToken": where the list starts)
    # is a position in one: every answer to one query, whatever its limit, lists its sandboxes in
    # that order. Pages of one show it without relying on the order inside any answer.
    walks: dict[str, list[list[str]]] = r["walks"]
    call = f"Sandbox.list(query={{metadata: {{suite: {r['suite']}}}}}"
    decoy = r["decoy"]  # the same owner's sandbox with metadata {suite: <suite>-decoy, i: 0}
    listed_decoy = [
        f"{call})" if limit == "default" else f"{call}, limit={limit})"
        for limit, pages in walks.items()
        if any(decoy in page for page in pages)
    ]
    assert not listed_decoy, (
        f"the metadata filter let through {decoy}, whose metadata is {{suite: {r['suite']}-decoy, i: 0}}: "
        f"listed by {', '.join(listed_decoy)}"
    )
    order = [sandbox_id for page in walks["1"] for sandbox_id in page]
    assert [len(page) for page in walks["1"]] == [1] * len(order), f"{call}, limit=1) pages: {walks['1']}"
    assert sorted(order) == sorted(r["made"]), f"{call}, limit=1) listed {order}, not the sandboxes made {r['made']}"
    wrong = []  # every answer out of that order, so that the message names each list call
    for limit, pages in walks.items():
        listed = f"{call})" if limit == "default" else f"{call}, limit={limit})"
        offset = 0
        for number, page in enumerate(pages, 1):
            expected = order[offset : offset + len(page)]
            if page != expected:
                how = "in reverse order" if page == expected[::-1] else "out of order"
                wrong.append(
                    f"{listed} page {number} returned sandboxes {how}: {page}; pages of limit=1 give {expected}"
                )
            offset += len(page)
        if offset != len(order):
            wrong.append(f"{listed} listed {offset} sandboxes, its pages of limit=1 {len(order)}")
    assert not wrong, "; ".join(wrong)
    rest = {key: value for key, value in r.items() if key not in ("suite", "made", "decoy", "walks")}
    assert rest == {"pages": 2, "all_found": True, "paused": True, "paused_state": ["paused"], "running": True}


def sandbox_timeout(r: dict[str, Any], work: str) -> None:
    assert r["gone"] is True
    assert r["info_error"] in NOT_FOUND


def sandbox_pause_memory(r: dict[str, Any], work: str) -> None:
    assert r == {
        "first": True,
        "second": False,
        "listed_paused": True,
        "state": "paused",
        "process_survived": True,
        "still_ticking": True,
        "running_after": True,
    }


def sandbox_pause_filesystem(r: dict[str, Any], work: str) -> None:
    assert r == {"paused": True, "file": "kept across the pause", "process_gone": True, "env": "env\n"}


def sandbox_connect_reboot(r: dict[str, Any], work: str) -> None:
    # A server that drops the client's memory: false restores the memory instead: the sleep and the
    # tmpfs mark survive, which the client's documentation says must never happen silently.
    assert r["process_gone"] is True, "connect(on_resume='reboot') resumed the paused processes"
    assert r["shm"] == "gone\n", f"the reboot kept the memory's tmpfs: {r['shm']!r}"
    assert r["file"] == "kept across the reboot"
    assert r["running"] is True


def sandbox_snapshot(r: dict[str, Any], work: str) -> None:
    assert r["listed"] is True
    assert r["source_running"] is True
    assert r["content"] == "snapshot content"
    assert r["in_use"] == "409"
    assert r["deleted"] is True
    assert r["deleted_again"] is False
    assert len(r["names"]) == 1
    name, mine, theirs = r["name"], r["source_snapshots"], r["other_snapshot"]
    assert name not in " ".join(r["names"]), f"a snapshot taken without a name is named {r['names']}"
    assert any(name in full for full in r["named_names"]), f"create_snapshot(name={name!r}) answered {r['named_names']}"
    named = r["listed_names"].get(mine[1], [])
    assert any(name in full for full in named), f"the list names the snapshot {mine[1]} {named}, not {name!r}"
    listed = f"list_snapshots(sandbox_id=<source>) listed {r['listed_source']}"
    assert theirs not in r["listed_source"], f"{listed}: the sandbox filter let through {theirs}, another sandbox's"
    assert sorted(r["listed_source"]) == sorted(mine), f"{listed}, not the source's snapshots {mine}"
    assert r["listed_other"] == [theirs], (
        f"list_snapshots(sandbox_id=<other>) listed {r['listed_other']}, not [{theirs}]"
    )
    pages = r["pages"]
    assert [len(page) for page in pages] == [1, 1], f"list_snapshots(sandbox_id=<source>, limit=1) pages: {pages}"
    assert sorted(page[0] for page in pages) == sorted(mine), (
        f"list_snapshots(sandbox_id=<source>, limit=1) pages {pages}: the cursor did not walk the snapshots {mine}"
    )


def sandbox_metrics(r: dict[str, Any], work: str) -> None:
    assert r["count"] >= 2
    assert r["cpu_count"] == 2
    assert r["mem_total"] == 512 << 20
    assert r["mem_used_positive"] is True
    assert r["has_timestamp"] is True
    series, windowed, (start, end) = r["series"], r["windowed"], r["window"]
    call = f"get_metrics(start={start}, end={end}) (Unix seconds)"
    assert windowed, f"{call} returned no sample; the sandbox's samples were at {series}"
    # Whole seconds on the wire: a sample inside the window's last second may be counted in.
    outside = [t for t in windowed if not start <= t < end + 1]
    assert not outside, f"{call} returned samples outside the window, at {outside}"
    assert series[0] not in windowed, f"{call} returned the first sample ({series[0]}): start was not applied"
    assert series[-1] not in windowed, f"{call} returned the last sample ({series[-1]}): end was not applied"
    assert r["before_start"] == 0, f"a window an hour before the sandbox started returned {r['before_start']} samples"


def sandbox_kill(r: dict[str, Any], work: str) -> None:
    assert r["running"] is True
    assert r["killed"] is True
    assert r["running_after"] is False
    assert r["killed_again"] is False
    assert r["connect_error"] in (
        "SandboxNotFoundException",
        "NotFoundException",
        "SandboxNotFoundError",
        "NotFoundError",
    )


def sandbox_other_owner(r: dict[str, Any], work: str) -> None:
    assert r["listed_for_other"] is False
    assert r["connect_error"] in (
        "SandboxNotFoundException",
        "NotFoundException",
        "SandboxNotFoundError",
        "NotFoundError",
    )
    assert r["other_kill"] is False
    assert r["still_running"] is True


BURST_SIZE = 32  # what sandbox/parallel-creates makes, half for each owner


def sandbox_parallel_creates(r: dict[str, Any], work: str) -> None:
    """Every sandbox of the burst proves its identity by every path; a misrouting names both sandboxes.

    Its hostname and ``E2B_SANDBOX_ID`` come from the runtime, its marker from the create's
    environment (``/init``), its file from an upload, its metadata from the control plane: a
    request that reached another sandbox shows that sandbox's marker or id.
    """
    sandboxes = r["sandboxes"]
    assert len(sandboxes) == BURST_SIZE, f"{len(sandboxes)} sandboxes, not {BURST_SIZE}"
    ids = [s["id"] for s in sandboxes]
    assert len(set(ids)) == len(ids), "two creates answered with the same sandbox id"
    assert {s["owner"] for s in sandboxes} == {"first", "second"}
    by_marker = {s["marker"]: s for s in sandboxes}
    by_id = {s["id"]: s for s in sandboxes}
    problems = []
    for sandbox in sandboxes:
        me = f"{sandbox['id']} ({sandbox['owner']} owner)"
        if "error" in sandbox:
            problems.append(f"{me}: {sandbox['error'][:300]}")
            continue
        expected = {"hostname": sandbox["id"], "env_id": sandbox["id"]}
        expected |= dict.fromkeys(("env_marker", "file_marker", "read_marker", "metadata_marker"), sandbox["marker"])
        for what, want in expected.items():
            seen = sandbox["seen"][what]
            if seen == want:
                continue
            other = by_marker.get(seen) or by_id.get(seen)
            if other is not None:
                problems.append(f"{me}: {what} is that of {other['id']} ({other['owner']} owner)")
            else:
                problems.append(f"{me}: {what} is {seen!r}, expected {want!r}")
    assert not problems, f"{len(problems)} misrouted: " + "; ".join(problems[:8])


def sandbox_websocket(r: dict[str, Any], work: str) -> None:
    assert r == {
        "received": ["hello", [1, 2, 3], "bye"],
        "code": 4001,
        "reason": "asked to",
        "protocol": "echo.v1",
    }


NETWORK_CREATED = {
    "internet": False,
    "allow_out": ["10.91.0.0/16"],
    "deny_out": ["10.92.0.0/16"],
    "public": False,
    "mask": "${PORT}-masked.example",
}


def sandbox_network_settings(r: dict[str, Any], work: str) -> None:
    assert r["created"] == NETWORK_CREATED, f"get_info after create reported {r['created']}"
    assert r["served"] is True, "the server inside never answered through the edge with the traffic token"
    headers = r["headers"]
    assert headers.get("host") == "8001-masked.example", f"the server inside saw Host {headers.get('host')!r}"
    assert "e2b-traffic-access-token" not in headers, "the edge passed the traffic token into the sandbox"
    assert r["without_token"] == 403, f"a private sandbox's port answered {r['without_token']} without the token"
    # update_network replaces the egress lists: the deny list it left out is cleared.
    expected = {**NETWORK_CREATED, "internet": True, "allow_out": ["10.93.0.0/16"], "deny_out": []}
    assert r["updated"] == expected, f"get_info after update_network reported {r['updated']}"


def sandbox_on_timeout(r: dict[str, Any], work: str) -> None:
    assert r["lifecycle"] == {"on_timeout": "pause", "auto_resume": False}, f"lifecycle reported {r['lifecycle']}"
    assert r["memory_paused"] is True, "on_timeout pause: the sandbox was not paused at its timeout"
    assert r["file"] == "kept", "files survive the timeout's pause"
    assert r["memory_process_kept"] is True, "a memory pause keeps processes"
    assert r["remaining_ok"] is True, "connect(timeout=60) did not set the sandbox's end to about 60 s away"
    assert r["disk_paused"] is True, "keep_memory False: the sandbox was not paused at its timeout"
    assert r["disk_process_gone"] is True, "a filesystem-only pause resumes with a fresh boot: no old processes"
    assert r["woken_paused"] == "paused"
    assert r["woken_output"] == "woken\n", "auto_resume: traffic to the paused sandbox did not resume it"
    assert r["woken_state"] == "running"


def sandbox_owners_every_operation(r: dict[str, Any], work: str) -> None:
    answers = r["answers"]
    for name in ("get_info", "set_timeout", "update_network", "get_metrics", "pause", "create_snapshot", "connect"):
        assert answers[name] in NOT_FOUND, f"{name} with another owner's key answered {answers[name]!r}, not not-found"
    for name in ("kill", "delete_snapshot"):
        assert answers[name] is False, f"{name} with another owner's key answered {answers[name]!r}, not False"
    assert r["listed_for_other"] is False, "another owner's list shows the sandbox"
    assert r["snapshots_for_other"] == [], "another owner's snapshot list shows this owner's snapshot"
    assert r["snapshot_kept"] is True, "this owner's snapshot is gone"
    assert r["still_running"] is True, "this owner's sandbox is no longer running"
    assert r["timeout_kept"] is True, "another owner's set_timeout changed this owner's sandbox"


def sandbox_users_and_tokens(r: dict[str, Any], work: str) -> None:
    assert r["as_root"] == {
        "make_dir": True,
        "write": "/root/made/f.txt",
        "read": "secret",
        "list": ["f.txt"],
        "stat": 6,
        "rename": "/root/made/g.txt",
        "removed": True,
    }, f"as root: {r['as_root']}"
    # Whether the default user may work in root's home is the endpoint's policy, not the contract's:
    # upstream envd does all file work as root (the user picks the home and the owner), this
    # server as the user (docs/ARCHITECTURE.md). Either holds for every call, never a mix.
    allowed = sorted(name for name, error in r["as_user"].items() if error is None)
    assert allowed in ([], sorted(r["as_user"])), (
        f"as the default user in /root, these worked and the others were refused: {allowed} ({r['as_user']})"
    )
    assert r["owners"] == ["user", "root"], f"files written as the default user and as root are owned by {r['owners']}"
    assert r["whoami"] == ["root\n", "user\n"]
    assert r["secure_without_token"] == dict.fromkeys(("download", "upload", "list", "stat"), 401), (
        f"a secure sandbox's envd answered without its token: {r['secure_without_token']}"
    )
    if _version(r["client_version"]) >= SECURE_IGNORED_FROM:
        # The client sends no ``secure`` (documented as deprecated and ignored): secured like any other.
        assert r["public_without_token"] == dict.fromkeys(("download", "upload", "list", "stat"), 401), (
            f"e2b {r['client_version']} ignores secure=False, so its sandbox is secured, but envd answered "
            f"without the token: {r['public_without_token']}"
        )
    else:
        assert r["public_without_token"] == dict.fromkeys(("download", "upload", "list", "stat"), 200), (
            f"a sandbox created with secure=False refused requests without a token: {r['public_without_token']}"
        )
    let_through = {rpc: status for rpc, status in r["rpc_without_token"].items() if status != 401}
    assert set(r["rpc_without_token"]) == set(TOKEN_RPCS), sorted(r["rpc_without_token"])
    assert not let_through, f"a secure sandbox's envd answered these RPCs without its token (not 401): {let_through}"
    assert r["rpc_with_token"] == {
        "stdin": "through the token\n",
        "resized": True,
        "killed": True,
        "watched": True,
    }, f"process and watch calls with the token: {r['rpc_with_token']}"


# From this version on (Python e2b and npm e2b alike) ``secure`` is deprecated and ignored: the
# clients leave it out of the create body, and every sandbox is secured.
SECURE_IGNORED_FROM = (2, 51)


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(".")[:2])


# The process and watch RPCs sandbox/users-and-tokens sends to a secure sandbox without its token.
TOKEN_RPCS = (
    "SendInput",
    "CloseStdin",
    "SendSignal",
    "Update",
    "CreateWatcher",
    "GetWatcherEvents",
    "RemoveWatcher",
    "Connect",
    "WatchDir",
)


SIGNED_UPLOADS = ("up.txt", "up-expiring.txt", "up-tampered.txt", "up-late.txt", "up-read.txt")


def sandbox_signed_urls(r: dict[str, Any], work: str) -> None:
    assert r["has_signature"] is True, "download_url/upload_url on a secure sandbox gave URLs without a signature"
    assert r["download"] == [200, "signed content"], f"a signed download URL without the token: {r['download']}"
    assert r["download_expiring"] == [200, "signed content"], (
        f"a signed download URL expiring in 120 s, without the token: {r['download_expiring']}"
    )
    refusals = {
        "download with a tampered signature": r["download_tampered"],
        "download signed with an expiration 30 s ago": r["download_expired"],
        "download signed with an expiration, the expiration left out of the URL": r["download_expiration_dropped"],
        "upload with a tampered signature": r["upload_tampered"],
        "upload signed with an expiration 30 s ago": r["upload_expired"],
        "upload to a download (read) URL": r["upload_read_signature"],
    }
    accepted = {what: status for what, status in refusals.items() if status != 401}
    assert not accepted, f"signed URLs that envd should refuse with 401 answered: {accepted}"
    assert (r["upload"], r["upload_expiring"]) == (200, 200), (
        f"signed upload URLs without the token answered {r['upload']} (no expiration) "
        f"and {r['upload_expiring']} (expiring in 120 s)"
    )
    expected = dict.fromkeys(SIGNED_UPLOADS)
    expected |= {"up.txt": "uploaded", "up-expiring.txt": "uploaded before expiry"}
    assert r["uploaded"] == expected, f"the files the signed uploads left: {r['uploaded']}"


def sandbox_template_build(r: dict[str, Any], work: str) -> None:
    """A template built with the clients' builder: its steps, start command, tags, failure and deletion."""
    assert r["build_tags"] == ["t1"], f"the build answered tags {r['build_tags']}"
    assert r["exists"] == [True, False], f"Template.exists(name, name-missing) gave {r['exists']}"
    probe = r["probe"]
    expected = ["copied", "file", "built", "from-template", "/home/user/app", "user", "200"]
    assert probe == expected, (
        f"a sandbox of the template holds {probe}, not {expected} (copy, run, env, workdir, user, start)"
    )
    assert r["template_id"] is True, "the sandbox reports another templateID than the build's"
    assert r["child"] == ["built", "child", "/home/user/app"], f"a build from the template holds {r['child']}"
    assert r["other_exists"] is False, "another owner's Template.exists sees the template"
    assert r["other_create"] == "404", f"another owner's create of the template gave {r['other_create']!r}"
    assert r["other_tags"] == "404", f"another owner's get_tags of the template gave {r['other_tags']!r}"
    assert r["assigned"] == ["t2"]
    assert r["tags"] == ["t1", "t2"], f"tags after assigning t2: {r['tags']}"
    assert r["tags_after"] == ["t2"], f"tags after removing t1: {r['tags_after']}"
    assert "exit code 4" in r["failure"], f"a failing step's build raised {r['failure']!r}"
    assert "step-output" in r["failure"], f"the failing step's output is not in {r['failure']!r}"
    assert r["deleted"] is True
    assert r["after_delete"] == "404", f"a create of a deleted template gave {r['after_delete']!r}"


def sandbox_template_image(r: dict[str, Any], work: str) -> None:
    """A template from a private registry image: pulled with its credentials, its layers and env kept."""
    if "status" in r:  # built in the background and polled
        assert r["status"] == "ready", f"the background build of the image ended {r['status']!r}"
    expected = ["built", "from-the-image", "/opt/old/kept.txt", "user", "no-motd"]
    assert r["probe"] == expected, (
        f"a sandbox of the image's template holds {r['probe']}, not {expected} "
        "(the step, the image's environment, its opaque folder and whiteout, the default user)"
    )
    denied = r["denied"]
    assert denied != "built", "a build with a wrong registry password succeeded"
    assert any(word in denied.lower() for word in ("unauthorized", "authentication", "denied")), (
        f"a wrong registry password failed the build with {denied!r}, which does not say it was refused"
    )
    assert r["password_shown"] is False, "the build error shows the registry password"


def sandbox_list_order(r: dict[str, Any], work: str) -> None:
    made = r["made"]  # created one after another: their start times are in this order
    assert r["asc"] == made, f"Sandbox.list(order='asc') listed {r['asc']}, not the sandboxes as started {made}"
    assert r["desc"] == made[::-1], f"Sandbox.list(order='desc') listed {r['desc']}, not {made[::-1]}"
    assert r["default"] == made[::-1], f"Sandbox.list() listed {r['default']}: the specification's default is desc"
    assert r["started_after"] == made[1:], (
        f"started_after = the second sandbox's startedAt listed {r['started_after']}, not {made[1:]} (at or after)"
    )
    assert r["template"] == made, f"query template='base' listed {r['template']}, not {made}"
    assert r["other_template"] == [], f"a template nothing was made from listed {r['other_template']}"


def sandbox_sudo(r: dict[str, Any], work: str) -> None:
    assert (r["stdout"], r["exit_code"]) == ("root\nuser\n", 0), f"sudo as the default user gave {r!r}"


def sandbox_fork(r: dict[str, Any], work: str) -> None:
    # A refusal (a backend without memory snapshots: 501) fails with the clients' message, which has the status.
    assert r["raised"] is None, f"fork(count=2) raised {r['raised']}: {r['message']}"
    forks = r["forks"]
    assert len(forks) == 2, f"fork(count=2) answered {len(forks)} entries"
    for fork in forks:
        assert "error" not in fork, f"a fork did not start: {fork['error']}"
        # The loop, the tmpfs file (memory), the disk file, its own id beside the source's environment.
        expected = f"ok\nin-memory\non-disk\n{fork['id']} inherited\n"
        assert fork["stdout"] == expected, f"in fork {fork['id']}: {fork['stdout']!r}, not {expected!r}"
        assert fork["metadata"].get("suite"), f"fork {fork['id']} lost the source's metadata: {fork['metadata']}"
    ids = {fork["id"] for fork in forks}
    assert len(ids) == 2, f"the forks share an id: {ids}"
    assert r["source"] not in ids, "a fork answered with the source's id"
    assert r["source_runs"] == "ok\n", "the source's process does not run on after the fork"
    assert r["listed"] == 3, f"the source and two forks are {r['listed']} sandboxes of the suite's metadata"


def sandbox_mcp(r: dict[str, Any], work: str) -> None:
    # The clients build the URL from the sandbox's host for port 50005 and send the token they chose.
    assert r["host"].startswith("50005-"), f"the MCP host is {r['host']!r}"
    assert r["url"] == f"https://{r['host']}/mcp", f"the MCP URL is {r['url']!r}"
    assert r["token_read_back"] is True, "the token read back from the sandbox is not the one the client chose"
    assert r["refused"] == [401, 401], f"without the token, or with another, the gateway answered {r['refused']}"
    assert isinstance(r["server"], str), "initialize gave no serverInfo"
    assert r["server"], "initialize gave a serverInfo without a name"
    assert r["tools"] == ["echo", "echo-whoami"], f"the gateway offers {r['tools']}, not the github server's tools"
    assert r["echo"] == ["> hello"], f"tools/call echo gave {r['echo']} (the server's envs set the prefix)"


def sandbox_idempotent_create(r: dict[str, Any], work: str) -> None:
    assert r["same"] is True, "a create repeated with its Idempotency-Key made another sandbox"
    assert r["runs"] == "ok\n", f"the repeated create's sandbox ran {r['runs']!r}"
    assert r["listed"] is True, "the list shows more than the one sandbox the key made"
    # Another body with the same key: refused (our 422) or the first sandbox again, never a second one.
    other = r["other_body"]
    assert other["raised"] is not None or other["same"] is True, "the key with another body made a second sandbox"
