"""The volume scenarios' checks (``volume_*``, ``scenarios/volume``); see ``_checks``.

A refusal is recorded by the scenarios as ``{"error": <exception class>, "message": ...}``; the
checks accept each client's own class for it (the Python clients raise ``VolumeException`` with
the server's message, the JS client its own error classes) and read the server's words from the
message. Modes are the decimal values the clients report (0o644 is 420).
"""

from __future__ import annotations

from typing import Any

from ._checks import NOT_FOUND

__all__: list[str] = []  # the checks are reached through ``_cases.CASES``

DEFAULT_OWNER = 1000  # uid and gid of what the content API makes unless asked: the sandboxes' user
FILE_MODE, DIR_MODE = 0o644, 0o755
BIG = 100 * 1024 * 1024  # volume/large-and-concurrent's large file
AUTHENTICATION = ("AuthenticationException", "AuthenticationError")
# A 404 of the volume or of a path in it: the clients' not-found classes, and (Python e2b from 2.50,
# npm e2b from 2.50) their own volume classes for each, which the wire does not tell apart from it.
VOLUME_GONE = (*NOT_FOUND, "VolumeNotFoundException", "VolumeNotFoundError")
PATH_GONE = (*NOT_FOUND, "VolumePathNotFoundException", "VolumePathNotFoundError")


def refused(outcome: dict[str, Any], what: str, *, says: str = "", kinds: tuple[str, ...] = ()) -> None:
    """``outcome`` is a refusal (of one of ``kinds``, when given) whose message contains ``says``."""
    assert outcome.get("error"), f"{what}: not refused, answered {outcome.get('answer')}"
    if kinds:
        # A subclass of one of ``kinds`` is one (newer clients raise VolumeNotFoundException, a NotFoundException).
        raised = [outcome["error"], *outcome.get("kinds", ())]
        assert any(kind in kinds for kind in raised), (
            f"{what}: refused with {outcome['error']} ({outcome['message']}), not {kinds}"
        )
    assert says.lower() in outcome["message"].lower(), f"{what}: refused with '{outcome['message']}', not '{says}'"


def _entry(found: dict[str, Any], what: str, **expected: Any) -> None:
    wrong = {key: found.get(key) for key, value in expected.items() if found.get(key) != value}
    assert not wrong, f"{what}: {wrong} where { ({key: expected[key] for key in wrong}) } was expected ({found})"
    assert found.get("times") is True, f"{what}: atime, mtime and ctime are not all timestamps: {found}"


def volume_lifecycle(r: dict[str, Any], work: str) -> None:
    assert r["id"], "create answered no volume id"
    assert r["token"] is True, "create answered no token"
    assert r["listed"] == [r["name"]], f"list shows the new volume as {r['listed']}"
    assert r["listed_has_token"] is False, "list answers tokens (only create and get do)"
    assert r["info"] == [True, r["name"], True], f"get_info(id): [same id, name, same token] = {r['info']}"
    assert r["connected"] == [True, r["name"], True], f"connect(id): [same id, name, same token] = {r['connected']}"
    assert r["destroyed"] is True, "destroy of the owner's volume did not answer True"
    assert r["destroyed_again"] is False, "a second destroy (the volume is gone: 404) did not answer False"
    refused(r["after"], "get_info after destroy", kinds=VOLUME_GONE)
    assert r["listed_after"] is False, "list still shows the destroyed volume"


def volume_refusals(r: dict[str, Any], work: str) -> None:
    refused(r["duplicate"], "create with a name the owner has", says="already exists")
    refused(r["missing"], "get_info of an id never issued", kinds=VOLUME_GONE)
    refused(r["empty_name"], "create with an empty name", says="name")
    refused(r["slash_name"], "create with 'a/b' as the name", says="name")


def volume_owners(r: dict[str, Any], work: str) -> None:
    refused(r["second_get"], "another owner's get_info", kinds=VOLUME_GONE)
    assert r["second_lists"] is False, "another owner's list shows the volume"
    assert r["second_destroy"] is False, "another owner's destroy did not answer False (404: not theirs)"
    assert r["first_still"] == r["name"], "the volume is gone after another owner's destroy"
    # Names are per owner: the other owner makes one of the same name, its own id and token.
    assert r["second_same_name"] == [r["name"], True, True], f"[name, other id, other token]: {r['second_same_name']}"
    assert r["second_kept"] == r["name"], "the other owner's volume went with the first owner's"


def volume_files(r: dict[str, Any], work: str) -> None:
    mine = {"uid": DEFAULT_OWNER, "gid": DEFAULT_OWNER}
    _entry(r["written"], "write_file(/notes/a.txt)", name="a.txt", type="file", path="/notes/a.txt", size=12)
    _entry(r["written"], "write_file(/notes/a.txt)", mode=FILE_MODE, target=None, **mine)
    assert r["text"] == r["streamed"] == "hello volume", f"read_file: text {r['text']!r}, stream {r['streamed']!r}"
    assert bytes(r["bytes"]) == b"hello volume", f"read_file(format=bytes): {bytes(r['bytes'])!r}"
    assert r["stat"] == r["written"], f"get_info(/notes/a.txt) {r['stat']} is not what the write answered"
    # The write made the missing folder, the sandbox user's like the file.
    _entry(r["folder"], "get_info(/notes)", type="directory", path="/notes", mode=DIR_MODE, **mine)
    assert r["exists"] == [True, False], f"exists(file, missing): {r['exists']}"
    _entry(r["owned"], "write_file(uid=0, gid=0, mode=0o600)", uid=0, gid=0, mode=0o600, size=2)
    _entry(r["replaced"], "write_file over a file", size=8, mode=FILE_MODE, **mine)
    assert r["replaced_text"] == "replaced", f"after a second write the file reads {r['replaced_text']!r}"
    _entry(r["made"], "make_dir(force, uid=1234, gid=2345, mode=0o700)", type="directory", uid=1234, gid=2345)
    _entry(r["made"], "make_dir(/deep/er/est)", path="/deep/er/est", name="est", mode=0o700)
    _entry(r["made_parent"], "the parent make_dir(force) made", type="directory", uid=1234, gid=2345)
    _entry(r["made_again_forced"], "make_dir(force) of a folder that exists", path="/deep", type="directory")
    assert r["list"] == [["/deep", "directory"], ["/notes", "directory"], ["/owned.bin", "file"]], r["list"]
    assert r["list_deep"] == ["/deep/er", "/deep/er/est", "/deep/er/f.txt"], f"list(/deep, depth=3): {r['list_deep']}"
    assert r["list_shallow"] == ["/deep/er"], f"list(/deep, depth=1): {r['list_shallow']}"
    _entry(r["updated"], "update_metadata(uid=0, gid=1234, mode=0o640)", uid=0, gid=1234, mode=0o640)
    _entry(r["updated_mode_only"], "update_metadata(mode=0o444)", uid=0, gid=1234, mode=0o444)
    assert r["removed"] == [False, False, True], f"exists after remove (file, folder tree, sibling): {r['removed']}"


def volume_content_refusals(r: dict[str, Any], work: str) -> None:
    refused(r["read_missing"], "read_file of a missing file", kinds=PATH_GONE)
    refused(r["stat_missing"], "get_info of a missing path", kinds=PATH_GONE)
    refused(r["remove_missing"], "remove of a removed folder", kinds=PATH_GONE)
    refused(r["list_file"], "list of a file", says="not a directory")
    refused(r["made_again"], "make_dir of a folder that exists, without force", says="already exists")
    refused(r["made_without_parent"], "make_dir whose parent is missing, without force", kinds=PATH_GONE)
    refused(r["wrong_token"], "read_file with another token", kinds=AUTHENTICATION)
    # '..' stops at the volume's root: the file is made at its top.
    _entry(r["escape"], "write_file(/../../../escape.txt)", path="/escape.txt", name="escape.txt")
    assert r["escape_listed"] is True, "write_file(/../../../escape.txt) is not at the volume's root"


def volume_large_file(r: dict[str, Any], work: str) -> None:
    assert r["size"] == [BIG, BIG, BIG], f"[sent, write_file's size, bytes read back]: {r['size']}"
    assert r["same"] is True, "the 100 MiB file read back differs from what was written"


def volume_concurrent_writes(r: dict[str, Any], work: str) -> None:
    assert r["own"] == [True, True], f"two files written at once, each read back whole: {r['own']}"
    # Two writes of one file at once: the file is one of them, whole (never a mix or a part).
    assert r["shared_whole"] is True, "a file written by two clients at once is neither's content"
    # Nothing of an upload is left under another name.
    assert r["leftovers"] == ["big.bin", "own-2.bin", "own-3.bin", "shared.bin"], f"the volume holds {r['leftovers']}"


def volume_mounts(r: dict[str, Any], work: str) -> None:
    assert [m["path"] for m in r["mounts"]] == ["/mnt/shared"], f"get_info's volume mounts: {r['mounts']}"
    assert [[m["path"] for m in mounts] for mounts in r["listed_mounts"]] == [["/data"]], r["listed_mounts"]
    assert r["api_file"] == "written through the API", f"the sandbox reads the API's file as {r['api_file']!r}"
    assert r["second_sees"] == "from-first", f"the second sandbox reads the first's file as {r['second_sees']!r}"
    assert r["first_sees"] == "from-root", f"the first sandbox reads the second's file as {r['first_sees']!r}"
    assert r["api_sees"][0] == "from-first\n", f"the API reads a sandbox's file as {r['api_sees'][0]!r}"


def volume_mount_owners(r: dict[str, Any], work: str) -> None:
    assert r["whoami"] == "1000\n1000", f"the sandbox user's uid and gid: {r['whoami']!r}"
    assert r["api_owner"] == "1000:1000 644", f"a file the API wrote, as the sandbox sees it: {r['api_owner']}"
    assert r["root_owner"] == "1000:1000 755", f"the volume's root, as the sandbox sees it: {r['root_owner']}"
    # The user's file and folder and root's file, inside the sandbox and through the API alike.
    assert r["sandbox_owner"] == ["1000:1000", "1000:1000", "0:0"], f"user's file, folder, root's: {r['sandbox_owner']}"
    assert r["api_sees"][1] == DEFAULT_OWNER, f"the API's uid of the user's file: {r['api_sees'][1]}"
    assert r["root_file_uid"] == 0, f"the API's uid of root's file: {r['root_file_uid']}"


def volume_in_use(r: dict[str, Any], work: str) -> None:
    refused(r["in_use"], "destroy of a volume two running sandboxes mount", says="in use")
    refused(r["in_use_paused"], "destroy of a volume a paused sandbox mounts", says="in use")
    refused(r["unknown_volume"], "a create that mounts a volume the owner has no such name of", says="volume")
    assert r["destroyed"] is True, "destroy after the last sandbox that mounted it was killed did not answer True"


def volume_pause_resume(r: dict[str, Any], work: str) -> None:
    # Written through the API while the sandbox was paused, and the sandbox's own file from before.
    seen = "".join(r["resumed_sees"])
    assert seen == "keptfrom-first", f"the resumed sandbox reads the volume's files as {r['resumed_sees']}"


def volume_filesystem_pause(r: dict[str, Any], work: str) -> None:
    refused(r["in_use_cold_paused"], "destroy of a volume a sandbox paused without memory mounts", says="in use")
    # The cold-booted sandbox mounts the volume again: the API's write while paused, its own files.
    # (the API's file has no newline: it runs into the next one)
    seen = "".join(r["cold_resumed_sees"])
    assert seen == "keptin-volumeown", f"the cold-booted sandbox reads the files as {r['cold_resumed_sees']}"
    assert r["cold_resumed_mounts"] == ["/mnt/v"], f"volume mounts after the resume: {r['cold_resumed_mounts']}"


def volume_snapshot(r: dict[str, Any], work: str) -> None:
    # A sandbox from the snapshot has the source's own files and none of the volume's, nor its mount.
    own, listing = r["plain_sees"]
    assert own == "own", f"a sandbox from the snapshot reads the source's own file as {own!r}"
    assert listing in ("[]", "absent"), f"a sandbox from the snapshot, made without mounts, has /mnt/v as {listing}"
    assert r["plain_mounts"] == [], f"a sandbox from the snapshot, made without mounts, lists {r['plain_mounts']}"
    # Mounted again, the volume is as it is now (written after the snapshot), not as it was.
    assert r["again_sees"] == ["own", "later"], f"a sandbox from the snapshot with the volume: {r['again_sees']}"
    assert r["destroyed"] is True, "destroy with only the snapshot left did not answer True (a snapshot holds none)"
