"""``contract.protocol``: Connect envelopes round-trip, split as a stream arrives, and refuse truncation."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contract import protocol
from contract.protocol import (
    ENVELOPE_HEADER_SIZE,
    FLAG_COMPRESSED,
    FLAG_END_STREAM,
    Envelope,
    EnvelopeError,
    decode_envelopes,
    encode_envelope,
    split_envelope,
)

envelopes = st.lists(st.builds(Envelope, st.integers(0, 0xFF), st.binary(max_size=300)), max_size=6)


def _encode(items: list[Envelope]) -> bytes:
    return b"".join(encode_envelope(e.payload, flags=e.flags) for e in items)


def test_the_wire_format() -> None:
    assert encode_envelope(b"{}", flags=FLAG_END_STREAM) == b"\x02\x00\x00\x00\x02{}"
    assert encode_envelope(b"") == b"\x00\x00\x00\x00\x00"
    assert encode_envelope(b"x" * 256)[:ENVELOPE_HEADER_SIZE] == b"\x00\x00\x00\x01\x00"
    both = Envelope(FLAG_END_STREAM | FLAG_COMPRESSED, b"")
    assert (both.end_stream, both.compressed) == (True, True)
    assert (Envelope(0, b"").end_stream, Envelope(0, b"").compressed) == (False, False)


@pytest.mark.parametrize("flags", [-1, 0x100])
def test_flags_are_one_byte(flags: int) -> None:
    with pytest.raises(ValueError, match="one byte"):
        encode_envelope(b"", flags=flags)


@given(envelopes)
def test_decode_inverts_encode(items: list[Envelope]) -> None:
    assert decode_envelopes(_encode(items)) == items


@given(envelopes, st.data())
def test_split_reads_a_stream_in_any_chunks(items: list[Envelope], data: st.DataObject) -> None:
    body = _encode(items)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(body)), max_size=8)))
    chunks = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True)]
    buffer, seen = b"", []
    for chunk in chunks:
        buffer += chunk
        while True:
            envelope, buffer = split_envelope(buffer)
            if envelope is None:
                break
            seen.append(envelope)
    assert (seen, buffer) == (items, b"")


@given(st.builds(Envelope, st.integers(0, 0xFF), st.binary(min_size=1, max_size=100)), st.data())
def test_split_waits_for_a_whole_envelope(envelope: Envelope, data: st.DataObject) -> None:
    whole = encode_envelope(envelope.payload, flags=envelope.flags)
    partial = whole[: data.draw(st.integers(0, len(whole) - 1))]
    assert split_envelope(partial) == (None, partial)
    assert split_envelope(whole + b"\x00rest") == (envelope, b"\x00rest")


def test_truncation_names_the_byte_where_it_broke() -> None:
    first = encode_envelope(b"hello")
    with pytest.raises(EnvelopeError, match=r"truncated Connect envelope header at byte 10 of 13"):
        decode_envelopes(first + b"\x00\x00\x00")
    with pytest.raises(EnvelopeError, match=r"truncated Connect envelope at byte 10 of 17"):
        decode_envelopes(first + encode_envelope(b"world!")[:7])
    assert issubclass(EnvelopeError, ValueError)


@given(envelopes.filter(bool), st.data())
def test_a_body_cut_anywhere_but_between_envelopes_is_refused(items: list[Envelope], data: st.DataObject) -> None:
    body = _encode(items)
    boundaries, offset = {0}, 0
    for item in items:
        offset += ENVELOPE_HEADER_SIZE + len(item.payload)
        boundaries.add(offset)
    cut = data.draw(st.integers(0, len(body)).filter(lambda n: n not in boundaries))
    with pytest.raises(EnvelopeError):
        decode_envelopes(body[:cut])


def test_the_module_needs_only_the_standard_library() -> None:
    import ast
    import sys
    from pathlib import Path

    tree = ast.parse(Path(protocol.__file__).read_text())
    imported = {
        (node.module or "").split(".")[0] if isinstance(node, ast.ImportFrom) else alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}, imported
