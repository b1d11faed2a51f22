"""Runs inside the pinned Python client's environment: times client operations and a raw floor.

``python -I client_roundtrip.py <iterations>`` prints one JSON object of samples (seconds).
The HTTP floor is a trivial loopback server answering in one write, hit with the same
httpx the client uses: anything above it is the agent's cost or the protocol's.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time

import httpx
from e2b import Sandbox

ONE_MIB = os.urandom(1024 * 1024)


def _floor_server() -> int:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()

    def serve() -> None:
        while True:
            conn, _ = listener.accept()
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with conn:
                buffer = b""
                while True:
                    data = conn.recv(65536)
                    if not data:
                        break
                    buffer += data
                    while b"\r\n\r\n" in buffer:
                        _, buffer = buffer.split(b"\r\n\r\n", 1)
                        conn.sendall(b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n")

    threading.Thread(target=serve, daemon=True).start()
    port: int = listener.getsockname()[1]
    return port


def _read_head(conn: socket.socket, buffer: bytearray) -> bytes | None:
    """One request head from ``conn`` (the rest stays in ``buffer``), or None at the end of the connection."""
    while b"\r\n\r\n" not in buffer:
        data = conn.recv(65536)
        if not data:
            return None
        buffer += data
    end = buffer.index(b"\r\n\r\n") + 4
    head = bytes(buffer[:end])
    del buffer[:end]
    return head


def _content_length(head: bytes) -> int:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return 0


def _transfer_floor_server(payload: bytes) -> int:
    """A loopback server at memory speed: GET answers ``payload`` in one write, POST drains its body.

    What the client's own httpx moves over plain loopback HTTP, with no TLS, relay or disk: the
    floor of the transfer figures. Bodies need a Content-Length (what httpx sends for bytes).
    """
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(payload)
    sink = bytearray(1 << 20)

    def serve_one(conn: socket.socket) -> None:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buffer = bytearray()
        with conn:
            while (head := _read_head(conn, buffer)) is not None:
                if head.startswith(b"GET"):
                    conn.sendall(answer)
                    conn.sendall(payload)
                    continue
                left = _content_length(head) - len(buffer)
                buffer.clear()
                while left > 0:
                    got = conn.recv_into(sink, min(left, len(sink)))
                    if not got:
                        return
                    left -= got
                conn.sendall(b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n")

    def serve() -> None:
        while True:
            conn, _ = listener.accept()
            threading.Thread(target=serve_one, args=(conn,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    port: int = listener.getsockname()[1]
    return port


def _time(fn: object, iterations: int) -> list[float]:
    samples = []
    for _ in range(iterations):
        start = time.perf_counter()
        fn()  # type: ignore[operator]
        samples.append(time.perf_counter() - start)
    return samples


def main() -> None:
    iterations = int(sys.argv[1])
    port = _floor_server()
    raw = httpx.Client()
    sbx = Sandbox.create()
    path = "bench-1mib.bin"  # relative: in the sandbox user's home

    def write_read() -> None:
        sbx.files.write(path, ONE_MIB)
        assert bytes(sbx.files.read(path, format="bytes")) == ONE_MIB

    for fn in (lambda: sbx.commands.run("true"), write_read, lambda: raw.get(f"http://127.0.0.1:{port}/")):
        fn()  # warm connections
    result = {
        "commands_run_true": _time(lambda: sbx.commands.run("true"), iterations),
        "files_write_read_1mib": _time(write_read, iterations),
        "floor_http_request": _time(lambda: raw.get(f"http://127.0.0.1:{port}/"), iterations),
    }
    sbx.files.remove(path)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
