"""``_hostfs.write_whole``: what records, registries and CRIU's option files are written with."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from runtime import _hostfs

_REPO = Path(__file__).resolve().parents[2]


def test_text_and_bytes_are_written_whole_with_their_mode_and_nothing_else_stays(tmp_path: Path) -> None:
    target = tmp_path / "record.json"
    _hostfs.write_whole(target, '{"a": 1}')
    assert (target.read_text(), target.stat().st_mode & 0o777) == ('{"a": 1}', 0o644)
    _hostfs.write_whole(target, b"\x00\xff", 0o600)
    assert (target.read_bytes(), target.stat().st_mode & 0o777) == (b"\x00\xff", 0o600)
    assert [p.name for p in tmp_path.iterdir()] == ["record.json"], "no temporary file is left"


_WRITER = """
import sys
from pathlib import Path
from runtime import _hostfs
target, fill = Path(sys.argv[1]), sys.argv[2]
for _ in range(300):
    _hostfs.write_whole(target, fill * 200_000)
"""


def test_two_processes_writing_at_once_never_give_a_reader_part_of_a_file(tmp_path: Path) -> None:
    """Each writer renames its own temporary file (named with its pid): a reader sees one whole file."""
    target = tmp_path / "criu.conf"
    _hostfs.write_whole(target, "a" * 200_000)
    writers = [subprocess.Popen([sys.executable, "-c", _WRITER, str(target), fill], cwd=_REPO) for fill in ("a", "b")]
    seen = set()
    while any(writer.poll() is None for writer in writers):
        text = target.read_text()
        assert len(text) == 200_000
        seen.add(text[0])
        assert text == text[0] * 200_000, "a mix of two writes, or a part of one"
    assert [writer.wait() for writer in writers] == [0, 0]
    assert seen <= {"a", "b"}
    assert [p.name for p in tmp_path.iterdir()] == ["criu.conf"]
