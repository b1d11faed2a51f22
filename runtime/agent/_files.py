"""``GET /files`` and ``POST /files`` (docs/PROTOCOL-NOTES.md, envd HTTP routes), streamed both ways.

Bodies never sit in memory whole: uploads are written part by part as they arrive (raw,
gzip or multipart; gzip is inflated in bounded steps, ``_limits.INFLATE_STEP``), downloads
are read from the open file in chunks, in a worker thread. Files are opened with the
requesting user's credentials (``run_as``), so the kernel decides what that user may read or
write. Only regular files are read or written: a FIFO, socket or device (``/dev/zero``) is
refused with 400 before it is opened, and opens are non-blocking, so a FIFO without a peer
cannot stall the agent. Downloads open in a worker thread; uploads open in the loop thread
(the multipart parser's callbacks are synchronous), where switching credentials is safe:
nothing else runs on that thread until the switch is undone. Refusals are ``AgentError``s, answered as envd's JSON error
``{"code": <status>, "message": ...}`` (``_errors.answers_errors``).
"""

from __future__ import annotations

import asyncio
import base64
import errno
import hashlib
import hmac
import json
import mimetypes
import os
import stat
import time
import urllib.parse
import zlib
from collections.abc import AsyncIterator
from email.utils import formatdate
from typing import TYPE_CHECKING, Any

from python_multipart.multipart import MultipartParser, MultipartState, parse_options_header
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from contract.protocol import ACCESS_TOKEN_HEADER

from ._credentials import run_as
from ._errors import AgentError, ErrorKind, HttpBody, answers_errors

if TYPE_CHECKING:  # the callbacks' TypedDict exists for type checkers only
    from python_multipart.multipart import MultipartCallbacks
from ._credentials import as_user
from ._filesystem import METADATA_PREFIX, read_metadata
from ._gzip import GzipEncoder, pays_to_deflate
from ._limits import INFLATE_STEP, MAX_UPLOAD_PARTS
from ._paths import ensure_parents, resolve
from ._state import AgentState
from ._users import User

CHUNK = 64 * 1024
READ_CHUNK = 1024 * 1024  # per worker-thread read of a download: few thread hops per file
_METADATA_HEADER = "x-metadata-"
_MAX_KEY = 246
_MAX_METADATA = 4096


# -- signatures ---------------------------------------------------------------


def signature(path: str, operation: str, username: str, token: str, expiration: int | None) -> str:
    raw = f"{path}:{operation}:{username}:{token}"
    if expiration is not None:
        raw += f":{expiration}"
    return "v1_" + base64.b64encode(hashlib.sha256(raw.encode()).digest()).decode().rstrip("=")


def check_signature(state: AgentState, request: Request, operation: str) -> None:
    """Token or signed URL, checked only while an access token is set (§2.2)."""
    if state.access_token is None:
        return
    presented = request.headers.get(ACCESS_TOKEN_HEADER)
    if presented:
        if not state.token_matches(presented):
            raise AgentError(ErrorKind.UNAUTHENTICATED, "access token present in header but does not match")
        return
    query = request.query_params
    given = query.get("signature")
    if given is None:
        raise AgentError(ErrorKind.UNAUTHENTICATED, "missing signature query parameter")
    raw_expiration = query.get("signature_expiration")
    expiration = None
    if raw_expiration is not None:
        try:
            expiration = int(raw_expiration)
        except ValueError:
            raise AgentError(  # answered by envd's generated router, before the handler, in its form
                ErrorKind.INVALID_ARGUMENT,
                f"Invalid format for parameter signature_expiration: {raw_expiration!r} is not an integer",
                http_body=HttpBody.TEXT,
            ) from None
    expected = signature(query.get("path", ""), operation, query.get("username", ""), state.access_token, expiration)
    if not hmac.compare_digest(given.encode(), expected.encode()):
        raise AgentError(ErrorKind.UNAUTHENTICATED, "invalid signature")
    if expiration is not None and expiration < int(time.time()):
        raise AgentError(ErrorKind.UNAUTHENTICATED, "signature is already expired")


def _user_and_path(state: AgentState, request: Request) -> tuple[User, str]:
    """The user (``UserError``: 401) and the resolved path (``PathError``: 400)."""
    user = state.user_by_name(request.query_params.get("username"))
    return user, resolve(request.query_params.get("path", ""), user, state.default_workdir)


# -- download -------------------------------------------------------------------


def _accept_entries(accept: str) -> list[tuple[float, int, str]]:
    """``Accept-Encoding`` as (q, position, lowercased coding), in the order sent."""
    entries: list[tuple[float, int, str]] = []
    for index, item in enumerate(accept.split(",")):
        name, _, params = item.strip().partition(";")
        q = 1.0
        for param in params.split(";"):
            key, _, value = param.strip().partition("=")
            if key.strip().lower() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
        entries.append((q, index, name.strip().lower()))
    return entries


def _identity_rejected(entries: list[tuple[float, int, str]]) -> bool:
    rejected = {name for q, _, name in entries if q == 0}
    return "identity" in rejected or ("*" in rejected and not any(n == "identity" and q > 0 for q, _, n in entries))


def choose_encoding(accept: str | None) -> str | None:
    """``identity`` or ``gzip`` per ``Accept-Encoding``; None when nothing acceptable (406)."""
    if not accept:
        return "identity"
    entries = _accept_entries(accept)
    identity_rejected = _identity_rejected(entries)
    for q, _, name in sorted(entries, key=lambda e: (-e[0], e[1])):
        if q == 0:
            continue
        if name == "identity":
            return "identity"
        if name == "gzip":
            return "gzip"
        if name == "*":
            return "gzip" if identity_rejected else "identity"
    return None if identity_rejected else "identity"


def accepts_identity(accept: str | None) -> bool:
    """Whether ``Accept-Encoding`` leaves the unencoded body acceptable (RFC 9110 12.5.3)."""
    return not accept or not _identity_rejected(_accept_entries(accept))


def _content_disposition(filename: str) -> str:
    if filename.isascii() and filename.isprintable():
        if all(c.isalnum() or c in "!#$%&'*+-.^_`|~" for c in filename):
            return f"inline; filename={filename}"
        escaped = filename.replace("\\", "\\\\").replace('"', '\\"')
        return f'inline; filename="{escaped}"'
    return "inline; filename*=utf-8''" + urllib.parse.quote(filename, safe="")


class NotRegularError(OSError):
    """The path is a FIFO, socket or device: reading or writing it could block or never end."""


async def _read_chunks(fd: int, first: bytes, size: int | None) -> AsyncIterator[bytes]:
    """``first`` (read when the file was opened), then the rest, up to ``size`` bytes when given.

    Reads run in a worker thread: a file on a slow or hung filesystem must not stall the loop.
    A file that grows meanwhile is sent as long as it was (the Content-Length already says so).
    """
    try:
        left = None if size is None else size - len(first)
        chunk = first
        while chunk:
            yield chunk
            if left is not None and left <= 0:
                return
            want = READ_CHUNK if left is None else min(READ_CHUNK, left)
            chunk = await asyncio.to_thread(os.read, fd, want)
            if left is not None:
                left -= len(chunk)
    finally:
        os.close(fd)


async def _gzip_chunks(fd: int, first: bytes) -> AsyncIterator[bytes]:
    # Deflated only where it pays (runtime.agent._gzip); in a worker thread, as deflating a MiB
    # of text takes milliseconds that would stall the loop.
    encoder = GzipEncoder()
    yield encoder.header
    async for chunk in _read_chunks(fd, first, None):
        if out := await asyncio.to_thread(encoder.encode, chunk):
            yield out
    yield encoder.finish()


@answers_errors(HttpBody.JSON)
async def download(request: Request) -> Response:
    state: AgentState = request.app.state.agent
    check_signature(state, request, "read")
    user, path = _user_and_path(state, request)
    accept = request.headers.get("accept-encoding")
    encoding = choose_encoding(accept)  # refused (406) only once the file is known to exist, as envd
    # gzip only where it pays: when the start of the file does not deflate (an archive, an image,
    # random bytes), gzip would shrink nothing and cost the client a decoder pass, so the plain
    # body goes out instead wherever the client accepts it (runtime.agent._gzip).
    probe = encoding == "gzip" and accepts_identity(accept)

    def open_for_reading() -> tuple[int, os.stat_result, bytes, bool]:
        info = os.stat(path)
        if stat.S_ISDIR(info.st_mode):
            raise IsADirectoryError(path)
        if not stat.S_ISREG(info.st_mode):
            raise NotRegularError(path)
        # Non-blocking: the path may have become a FIFO since the stat.
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            os.close(fd)
            raise NotRegularError(path)
        os.set_blocking(fd, True)
        try:
            first = os.read(fd, READ_CHUNK)  # in the same thread hop: small files need no other
        except OSError:
            os.close(fd)
            raise
        return fd, info, first, probe and not pays_to_deflate(first)  # the probe deflates: off the loop

    try:
        fd, info, first, plain = await as_user(user, open_for_reading)
    except FileNotFoundError:
        raise AgentError(ErrorKind.NOT_FOUND, f"path '{path}' does not exist") from None
    except IsADirectoryError:
        raise AgentError(ErrorKind.INVALID_ARGUMENT, f"path '{path}' is a directory") from None
    except NotRegularError:
        raise AgentError(ErrorKind.INVALID_ARGUMENT, f"path '{path}' is not a regular file") from None
    except PermissionError as exc:
        raise AgentError(ErrorKind.PERMISSION_DENIED, f"error opening file '{path}': {exc.strerror}") from None
    except OSError as exc:
        raise AgentError(ErrorKind.INTERNAL, f"error opening file '{path}': {exc.strerror}") from None
    if encoding is None:
        os.close(fd)
        raise AgentError(
            ErrorKind.NOT_ACCEPTABLE, "error parsing Accept-Encoding: no acceptable encoding found, supported: [gzip]"
        )
    media_type, _ = mimetypes.guess_type(request.query_params.get("path", "") or path)
    if media_type is None:
        media_type = "application/octet-stream"
    elif media_type.startswith("text/"):
        media_type += "; charset=utf-8"
    headers = {"Content-Disposition": _content_disposition(os.path.basename(path)), "Vary": "Accept-Encoding"}
    if encoding == "gzip" and not plain:
        headers["Content-Encoding"] = "gzip"
        return StreamingResponse(_gzip_chunks(fd, first), 200, headers=headers, media_type=media_type)
    headers["Content-Length"] = str(info.st_size)
    headers["Last-Modified"] = formatdate(info.st_mtime, usegmt=True)
    return StreamingResponse(_read_chunks(fd, first, info.st_size), 200, headers=headers, media_type=media_type)


# -- upload -------------------------------------------------------------------------


def parse_metadata(headers: list[tuple[bytes, bytes]]) -> dict[str, str]:
    """``X-Metadata-<key>: <value>`` headers (first value per key wins) → validated map."""
    metadata: dict[str, str] = {}
    for raw_name, raw_value in headers:
        name = raw_name.decode("latin-1").lower()
        if not name.startswith(_METADATA_HEADER):
            continue
        key = name[len(_METADATA_HEADER) :]
        if not key or key in metadata:
            continue
        value = raw_value.decode("latin-1")
        if len(key.encode()) > _MAX_KEY:
            raise AgentError(
                ErrorKind.INVALID_ARGUMENT, f"invalid metadata: key {key[:32]!r}… is longer than {_MAX_KEY} bytes"
            )
        for text in (key, value):
            if any(not 0x20 <= ord(c) <= 0x7E for c in text):
                raise AgentError(
                    ErrorKind.INVALID_ARGUMENT, "invalid metadata: keys and values must be printable ASCII"
                )
        metadata[key] = value
    if sum(9 + len(k) + len(v) for k, v in metadata.items()) > _MAX_METADATA:
        raise AgentError(ErrorKind.INVALID_ARGUMENT, f"invalid metadata: total size exceeds {_MAX_METADATA} bytes")
    return metadata


class FileSink:
    """One file being written: opened as the user, filled from the event loop, then tagged."""

    def __init__(self, path: str, user: User, metadata: dict[str, str]) -> None:
        self.path = path
        self.user = user
        self.metadata = metadata
        self.written = 0

        def open_for_writing() -> int:
            ensure_parents(path)
            try:
                mode = os.stat(path).st_mode
            except FileNotFoundError:
                pass
            else:
                if stat.S_ISDIR(mode):
                    raise IsADirectoryError(path)
                if not stat.S_ISREG(mode):
                    raise NotRegularError(path)
            # Non-blocking open: a FIFO that appeared since the stat must not block the loop.
            flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NONBLOCK
            try:
                fd = os.open(path, flags, 0o666)
            except OSError as exc:
                if exc.errno == errno.ENXIO:  # a FIFO without a reader
                    raise NotRegularError(path) from None
                raise
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                os.close(fd)
                raise NotRegularError(path)
            os.set_blocking(fd, True)
            return fd

        try:
            self.fd: int | None = run_as(user, open_for_writing)
        except IsADirectoryError:
            raise AgentError(ErrorKind.INVALID_ARGUMENT, f"path is a directory: {path}") from None
        except NotRegularError:
            raise AgentError(ErrorKind.INVALID_ARGUMENT, f"path is not a regular file: {path}") from None
        except NotADirectoryError as exc:
            raise AgentError(ErrorKind.INTERNAL, f"error ensuring directories: {exc}") from None
        except PermissionError as exc:
            raise AgentError(ErrorKind.PERMISSION_DENIED, f"error opening file '{path}': {exc.strerror}") from None
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise AgentError(
                    ErrorKind.INSUFFICIENT_STORAGE, f"not enough inodes available: {exc.strerror}"
                ) from None
            raise AgentError(ErrorKind.INTERNAL, f"error opening file '{path}': {exc.strerror}") from None

    def write(self, data: bytes | memoryview) -> None:
        assert self.fd is not None
        view = memoryview(data)
        try:
            while view:
                count = os.write(self.fd, view)
                view = view[count:]
                self.written += count
        except OSError as exc:
            self.abort()
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise AgentError(ErrorKind.INSUFFICIENT_STORAGE, "not enough disk space available") from None
            raise AgentError(ErrorKind.INTERNAL, f"error writing file: {exc.strerror}") from None

    def abort(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def finish(self) -> dict[str, Any]:
        self.abort()

        def tag() -> dict[str, str]:
            try:
                for name in os.listxattr(self.path):
                    if name.startswith(METADATA_PREFIX):
                        os.removexattr(self.path, name)
                for key, value in self.metadata.items():
                    os.setxattr(self.path, METADATA_PREFIX + key, value.encode())
            except OSError as exc:
                if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                    raise AgentError(
                        ErrorKind.INSUFFICIENT_STORAGE, f"not enough space for metadata: {exc.strerror}"
                    ) from None
                if exc.errno not in (errno.ENOTSUP, errno.EOPNOTSUPP):
                    raise AgentError(ErrorKind.INTERNAL, f"error writing metadata: {exc.strerror}") from None
            return read_metadata(self.path)

        stored = run_as(self.user, tag)
        result: dict[str, Any] = {"name": os.path.basename(self.path), "path": self.path, "type": "file"}
        if stored:
            result["metadata"] = stored
        return result


async def _body(request: Request) -> AsyncIterator[bytes]:
    """The request body, gunzipped as it streams when ``Content-Encoding: gzip``."""
    encoding = request.headers.get("content-encoding", "").split(";")[0].strip().lower()
    if encoding in ("", "identity"):
        async for chunk in request.stream():
            yield chunk
        return
    if encoding != "gzip":
        raise AgentError(
            ErrorKind.INVALID_ARGUMENT,
            f"error decompressing request body: unsupported Content-Encoding: {encoding}, supported: [gzip]",
        )
    decompressor = zlib.decompressobj(31)
    first = True
    async for chunk in request.stream():
        data = chunk
        while True:  # bounded steps: one small chunk of a gzip bomb inflates ~1000 times
            try:
                out = decompressor.decompress(data, INFLATE_STEP)
            except zlib.error as exc:
                kind = ErrorKind.INVALID_ARGUMENT if first else ErrorKind.INTERNAL
                raise AgentError(kind, f"error decompressing request body: {exc}") from None
            first = False
            data = decompressor.unconsumed_tail
            if out:
                yield out
            if not data and len(out) < INFLATE_STEP:
                break
    if not decompressor.eof:
        raise AgentError(ErrorKind.INTERNAL, "error writing file: unexpected EOF in gzip stream")


class _MultipartUpload:
    """Callbacks for python-multipart: each ``file`` part streams into its own FileSink."""

    def __init__(self, state: AgentState, user: User, path_param: str | None, metadata: dict[str, str]) -> None:
        self.state = state
        self.user = user
        self.path_param = path_param
        self.metadata = metadata
        self.results: list[dict[str, Any]] = []
        self.sink: FileSink | None = None
        self.seen: set[str] = set()
        self.parts = 0
        self._headers: dict[bytes, bytes] = {}
        self._field = b""
        self._value = b""

    def callbacks(self) -> MultipartCallbacks:
        return {
            "on_part_begin": self._part_begin,
            "on_header_field": lambda data, start, end: self._grow("_field", data[start:end]),
            "on_header_value": lambda data, start, end: self._grow("_value", data[start:end]),
            "on_header_end": self._header_end,
            "on_headers_finished": self._headers_finished,
            "on_part_data": self._part_data,
            "on_part_end": self._part_end,
        }

    def _grow(self, attr: str, data: bytes) -> None:
        setattr(self, attr, getattr(self, attr) + data)

    def _part_begin(self) -> None:
        self.parts += 1
        if self.parts > MAX_UPLOAD_PARTS:
            raise AgentError(
                ErrorKind.CONTENT_TOO_LARGE, f"error parsing multipart form: more than {MAX_UPLOAD_PARTS} parts"
            )
        self._headers = {}
        self.sink = None

    def _header_end(self) -> None:
        self._headers[self._field.strip().lower()] = self._value.strip()
        self._field = self._value = b""

    def _headers_finished(self) -> None:
        _, options = parse_options_header(self._headers.get(b"content-disposition", b""))
        if options.get(b"name") != b"file":
            return
        filename = options.get(b"filename")
        raw = (
            self.path_param
            if self.path_param is not None
            else (filename.decode("utf-8", "surrogateescape") if filename is not None else None)
        )
        if raw is None:
            raise AgentError(ErrorKind.INVALID_ARGUMENT, "file part has no filename and no path parameter was given")
        target = resolve(raw, self.user, self.state.default_workdir)
        if target in self.seen:
            done = ", ".join(r["path"] for r in self.results)
            raise AgentError(
                ErrorKind.INVALID_ARGUMENT,
                f"you cannot upload multiple files to the same path '{target}' in one upload "
                f"request, only the first specified file was uploaded (uploaded: {done})",
            )
        self.seen.add(target)
        self.sink = FileSink(target, self.user, self.metadata)

    def _part_data(self, data: bytes, start: int, end: int) -> None:
        if self.sink is not None:
            self.sink.write(memoryview(data)[start:end])

    def _part_end(self) -> None:
        if self.sink is not None:
            self.results.append(self.sink.finish())
            self.sink = None


@answers_errors(HttpBody.JSON)
async def upload(request: Request) -> Response:
    state: AgentState = request.app.state.agent
    sink: FileSink | None = None
    multipart: _MultipartUpload | None = None
    try:
        check_signature(state, request, "write")
        body = _body(request)
        user = state.user_by_name(request.query_params.get("username"))
        metadata = parse_metadata(request.scope["headers"])
        content_type, options = parse_options_header(request.headers.get("content-type", ""))
        path_param = request.query_params.get("path")
        if content_type == b"application/octet-stream":
            if not path_param:
                raise AgentError(ErrorKind.INVALID_ARGUMENT, "path query parameter is required for raw body upload")
            sink = FileSink(resolve(path_param, user, state.default_workdir), user, metadata)
            async for chunk in body:
                sink.write(chunk)
            result = [sink.finish()]
        elif content_type.startswith(b"multipart/"):
            boundary = options.get(b"boundary")
            if content_type not in (b"multipart/form-data", b"multipart/mixed") or not boundary:
                raise AgentError(
                    ErrorKind.INTERNAL, "error parsing multipart form: no multipart boundary param in Content-Type"
                )
            multipart = _MultipartUpload(state, user, path_param, metadata)
            parser = MultipartParser(boundary, multipart.callbacks())
            async for chunk in body:
                parser.write(chunk)
            parser.finalize()
            if parser.state != MultipartState.END:
                raise AgentError(
                    ErrorKind.INVALID_ARGUMENT,
                    "error parsing multipart form: unexpected EOF before the closing boundary",
                )
            result = multipart.results
        else:
            shown = content_type.decode("latin-1") or "<none>"
            raise AgentError(
                ErrorKind.INVALID_ARGUMENT,
                f"unsupported content type: {shown}, expected multipart/form-data or application/octet-stream",
            )
    except Exception as exc:  # a malformed body must give an answer, not kill the request
        for open_sink in (sink, multipart.sink if multipart else None):
            if open_sink is not None:
                open_sink.abort()
        if isinstance(exc, AgentError):
            raise
        raise AgentError(ErrorKind.INVALID_ARGUMENT, f"error parsing request body: {exc}") from exc
    return Response(json.dumps(result), 200, media_type="application/json")
