"""A transport that sends the small writes of a few passes of the event loop as one.

uvicorn writes every piece of a response as it is made: the head, then each body chunk, then
the chunked encoding's last chunk, each one ``write`` and so one ``send`` (one TLS record behind
TLS). A Connect server stream is many such pieces, a few dozen bytes each, made together: a
command's answer is the head and its start event, then its end event, the end of the stream and
the last chunk, five sends where two would do. Every send is a system call and a packet through
the receiver's whole network stack (for the agent, the sandbox's veth and the host's firewall),
and every record is one more decryption for the client. Joined, a command's stream is two sends
each way instead of five; the round trip did not measurably shorten (docs/BENCHMARKS.md).

``BatchedWrites`` holds a small write for ``HOLD_PASSES`` passes of the event loop
(``call_soon``), so whatever else is written meanwhile goes out with it. Three, because
connect-python waits for a cancelled task (two passes) between a stream's last message and its
end. Nothing waits for anything that has not already happened, so a stream's message is never
held back for the next one. A write of ``DIRECT_BYTES`` or more (a download's chunks) goes out
at once, with whatever was held before it, in order. ``close`` sends what is held first;
``abort`` drops it, as the transport would. Flow control is the transport's own: it pauses and
resumes the protocol on its buffer, which the held bytes join a few passes later.
"""

from __future__ import annotations

import asyncio
from typing import Any

__all__ = ["DIRECT_BYTES", "HOLD_PASSES", "BatchedWrites"]

DIRECT_BYTES = 16 * 1024  # a TLS record's most: larger writes gain nothing from joining
HOLD_PASSES = 3  # see above: a stream's end is two passes after its last message


class BatchedWrites(asyncio.Transport):
    """``transport``, with the small writes of one event-loop pass joined into one."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self._transport = transport
        self._loop = loop
        self._held: list[bytes] = []
        self._held_bytes = 0
        self._flush_scheduled = False

    # --- writing

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not data:
            return
        if not self._held and len(data) >= DIRECT_BYTES:
            self._transport.write(data)
            return
        self._held.append(bytes(data))
        self._held_bytes += len(data)
        if self._held_bytes >= DIRECT_BYTES:
            self.flush()
        elif not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._pass_over, HOLD_PASSES)

    def writelines(self, list_of_data: Any) -> None:
        for data in list_of_data:
            self.write(data)

    def flush(self) -> None:
        """Send what is held now (a closing transport drops it, as it would drop a write)."""
        if not self._held:
            return
        data = self._held[0] if len(self._held) == 1 else b"".join(self._held)
        self._held.clear()
        self._held_bytes = 0
        if not self._transport.is_closing():
            self._transport.write(data)

    def _pass_over(self, passes: int) -> None:
        if passes > 1:
            self._loop.call_soon(self._pass_over, passes - 1)
            return
        self._flush_scheduled = False
        self.flush()

    def get_write_buffer_size(self) -> int:
        return self._held_bytes + self._transport.get_write_buffer_size()

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._transport.get_write_buffer_limits()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._transport.set_write_buffer_limits(high, low)

    def can_write_eof(self) -> bool:
        return self._transport.can_write_eof()

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    # --- ending

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def abort(self) -> None:
        self._held.clear()
        self._held_bytes = 0
        self._transport.abort()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    # --- everything else is the transport's

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._transport.get_extra_info(name, default)

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._transport.get_protocol()

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._transport.set_protocol(protocol)

    def is_reading(self) -> bool:
        return self._transport.is_reading()

    def pause_reading(self) -> None:
        self._transport.pause_reading()

    def resume_reading(self) -> None:
        self._transport.resume_reading()
