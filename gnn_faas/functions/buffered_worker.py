"""A gunicorn worker that reads each request whole on its event loop before a thread sees it.

Stock ``gthread`` gives a connection to a pool thread as soon as it is accepted,
so idle and slow clients hold threads; :class:`BufferedWorker` keeps gunicorn
(master, signals, hooks, WSGI glue, keep-alive rules) and changes only who reads.
The contract (why, what was measured, why not another server:
docs/design/buffered-front.md):

- the main thread's selector frames every request into a per-connection buffer
  (header block up to :attr:`FrontSettings.max_header_bytes`, then
  ``Content-Length`` bytes or the chunks of a chunked body); only a complete
  request goes to the thread pool, so a pool thread never waits on a client;
- deadlines as totals per phase: ``keepalive_s`` (idle, closed silently),
  ``header_timeout_s`` from the first byte and ``body_timeout_s`` from the header
  block (408); a sweep every ``sweep_s`` enforces them;
- beyond ``max_connections`` a connection is answered a canned 503 with
  ``Retry-After`` from the loop; framing errors are JSON 400 / 413 (before the body
  is read) / 431, gunicorn's own parse errors JSON too;
- a small request (``inline_max_bytes``) to an ``inline_paths`` endpoint runs on
  the loop while the pool is empty (one thread wake-up instead of three); a route
  the app's :class:`~gnn_faas.http.FrameDispatcher` takes is answered from the
  loop's bytes, without gunicorn's parser, WSGI or Flask; a closing answer ends the
  connection (``SHUT_WR``) as soon as it is sent;
- writes are bounded by ``SO_SNDTIMEO`` (``send_timeout_s``).
"""

from __future__ import annotations

import contextlib
import errno
import json
import re
import selectors
import socket
import struct
import time
from concurrent.futures import Future
from dataclasses import dataclass
from functools import partial

from gunicorn import http, util
from gunicorn.workers.gthread import TConn, ThreadWorker

from gnn_faas import request_id
from gnn_faas.http import FrameDispatcher, reason
from gnn_faas.parent_death import malloc_trim

_HEX = re.compile(rb"[0-9A-Fa-f]{1,16}")
_MAX_CHUNK_LINE = 4096
_RECV = 256 * 1024


@dataclass(frozen=True)
class FrontSettings:
    """Connection limits of one worker process (see the module docstring)."""

    max_connections: int = 2048
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    keepalive_s: float = 30.0
    max_body_bytes: int = 256 << 20
    max_header_bytes: int = 64 * 1024
    send_timeout_s: float = 30.0
    sweep_s: float = 0.25
    # after a request at least this large, hand freed heap back to the OS (0: never)
    trim_after_bytes: int = 0
    # requests up to this size to the app's inline paths run on the event loop (0: never)
    inline_max_bytes: int = 256 * 1024


_settings = FrontSettings()
# what the front refused or ended in this worker process (written by its event loop only)
_counts = {"refused": 0, "timed_out": 0, "framing_errors": 0, "requests": 0, "inline": 0, "loop": 0}


def configure(settings: FrontSettings) -> None:
    """Set the front's limits; call in the master before the workers fork."""
    global _settings
    _settings = settings


def settings() -> FrontSettings:
    return _settings


def front_stats() -> dict:
    """This worker's front: connections refused over the cap, requests ended by a
    deadline (408), framing errors answered (400/413/431), requests read whole
    (``inline``: of them, those handled on the event loop); with the limits in force. Empty counts outside such a worker."""
    return {**_counts, "max_connections": _settings.max_connections,
            "header_timeout_s": _settings.header_timeout_s,
            "body_timeout_s": _settings.body_timeout_s,
            "keepalive_s": _settings.keepalive_s}  # fmt: skip


class FramingError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


_REASONS = {
    400: "Bad Request",
    408: "Request Timeout",
    413: "Payload Too Large",
    414: "URI Too Long",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    501: "Not Implemented",
    503: "Service Unavailable",
}


def json_error(status: int, message: str, extra_headers: str = "") -> bytes:
    """A whole ``Connection: close`` HTTP/1.1 response with body ``{"error": message}``."""
    body = json.dumps({"error": message}).encode()
    reason = _REASONS.get(status, "Error")
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n{extra_headers}\r\n"
    )
    return head.encode("latin-1") + body


def _write_error_json(sock, status_int, reason, mesg) -> None:
    """Replacement for ``gunicorn.util.write_error``: the same status, a JSON body."""
    util.write_nonblock(sock, json_error(int(status_int), str(mesg)))


def parse_head(head: bytes, max_body: int) -> tuple[int | None, bool]:
    """``(content_length, chunked)`` of a header block (request line + headers).

    Only what framing needs; everything else is gunicorn's parser's job later."""
    lengths: set[bytes] = set()
    codings: list[bytes] = []
    for line in head.split(b"\r\n")[1:]:
        name, sep, value = line.partition(b":")
        if not sep:
            continue  # gunicorn answers a malformed header line
        name = name.strip().lower()
        if name == b"content-length":
            lengths.add(value.strip())
        elif name == b"transfer-encoding":
            codings += [c.strip().lower() for c in value.split(b",") if c.strip()]
    if codings:
        if codings[-1] != b"chunked":
            raise FramingError(400, "unsupported Transfer-Encoding (only chunked is accepted)")
        if lengths:
            raise FramingError(400, "both Content-Length and Transfer-Encoding: chunked")
        return None, True
    if len(lengths) > 1:
        raise FramingError(400, "conflicting Content-Length headers")
    if not lengths:
        return 0, False
    (raw,) = lengths
    if not raw.isdigit() or len(raw) > 18:
        raise FramingError(400, f"invalid Content-Length {raw[:32].decode('latin-1')!r}")
    n = int(raw)
    if n > max_body:
        raise FramingError(413, f"request body exceeds the limit of {max_body} bytes")
    return n, False


def scan_chunks(buf: bytearray, pos: int, total: int, max_body: int) -> tuple[int, int, bool]:
    """Walk the chunks of a chunked body from ``pos`` (one step per chunk).

    Returns ``(pos, total, done)``: where the next unscanned chunk starts, the
    body bytes seen, and whether the last chunk and trailers are complete (then
    ``pos`` is the end of the request). Raises :class:`FramingError` on a bad
    chunk size (400), a missing chunk terminator (400) or a body over
    ``max_body`` (413)."""
    n = len(buf)
    while True:
        eol = buf.find(b"\r\n", pos, pos + _MAX_CHUNK_LINE)
        if eol < 0:
            if n - pos >= _MAX_CHUNK_LINE:
                raise FramingError(400, "malformed chunked body: chunk-size line too long")
            return pos, total, False
        size_field = bytes(buf[pos:eol]).split(b";", 1)[0].strip()
        if not _HEX.fullmatch(size_field):
            shown = size_field[:16].decode("latin-1", "replace")
            raise FramingError(400, f"malformed chunked body: invalid chunk size {shown!r}")
        size = int(size_field, 16)
        if size == 0:  # last chunk, then trailer lines, then an empty line
            end = eol + 2
            while True:
                t = buf.find(b"\r\n", end, end + _MAX_CHUNK_LINE)
                if t < 0:
                    if n - end >= _MAX_CHUNK_LINE:
                        raise FramingError(400, "malformed chunked body: trailer too long")
                    return pos, total, False
                if t == end:
                    return t + 2, total, True
                end = t + 2
        total += size
        if total > max_body:
            raise FramingError(413, f"request body exceeds the limit of {max_body} bytes")
        data_end = eol + 2 + size
        if n < data_end + 2:
            return pos, total - size, False
        if buf[data_end : data_end + 2] != b"\r\n":
            raise FramingError(400, "malformed chunked body: chunk not terminated by CRLF")
        pos = data_end + 2


class MemorySource:
    """What gunicorn's parser reads a buffered request from (it calls ``recv``)."""

    def __init__(self, data: bytes):
        self._view = memoryview(data)
        self._pos = 0

    def recv(self, n: int) -> bytes:
        chunk = bytes(self._view[self._pos : self._pos + n])
        self._pos += len(chunk)
        return chunk


class BufferedConn(TConn):
    """A connection and the request being read on it."""

    def __init__(self, cfg, sock, client, server):
        super().__init__(cfg, sock, client, server)
        self.buf = bytearray()
        self.deadline = 0.0
        self.phase = "idle"  # idle -> head -> body -> (handed to a thread)
        self.head_end = 0
        self.need: int | None = None  # request length once known (Content-Length)
        self.chunked = False
        self.chunk_pos = 0
        self.chunk_total = 0
        self.request_bytes = 0  # size of the last request handed to a thread
        # a request the app's dispatcher answers from its bytes: (request, head end)
        self.framed: tuple[bytes, int] | None = None
        self.started_at = 0.0  # monotonic time the request's first byte was read

    def reset(self) -> None:
        self.phase, self.head_end, self.need = "idle", 0, None
        self.chunked, self.chunk_pos, self.chunk_total = False, 0, 0


class BufferedWorker(ThreadWorker):
    """gthread worker whose event loop reads whole requests (see the module docstring)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.front = settings()
        self.reading: dict[BufferedConn, None] = {}
        self._last_sweep = 0.0
        self._in_pool = 0  # requests handed to the thread pool and not finished
        self._inline_paths: frozenset[bytes] | None = None

    def init_process(self):
        util.write_error = _write_error_json  # this worker process only
        super().init_process()

    # -- accepting ---------------------------------------------------------------
    def accept(self, listener):
        for _ in range(64):  # drain a burst of connections in one wake-up
            try:
                sock, addr = listener.accept()
            except OSError as e:
                if e.errno not in (errno.EAGAIN, errno.ECONNABORTED, errno.EWOULDBLOCK):
                    raise
                return
            if self.nr_conns >= self.front.max_connections:
                self._refuse(sock)
                continue
            self.nr_conns += 1
            conn = BufferedConn(self.cfg, sock, addr, listener.getsockname())
            conn.initialized = True  # no TLS, no HTTP/2: the parser is ours
            sock.setsockopt(
                socket.SOL_SOCKET,
                socket.SO_SNDTIMEO,
                struct.pack("ll", int(self.front.send_timeout_s), 0),
            )
            conn.deadline = time.monotonic() + self.front.header_timeout_s
            self._watch(conn)

    def _refuse(self, sock: socket.socket) -> None:
        _counts["refused"] += 1
        try:
            sock.setblocking(False)
            sock.send(
                json_error(
                    503,
                    f"too many connections (this server holds {self.front.max_connections})",
                    "Retry-After: 1\r\n",
                )
            )
        except OSError:
            pass
        util.close(sock)

    # -- reading -----------------------------------------------------------------
    def _watch(self, conn: BufferedConn) -> None:
        conn.sock.setblocking(False)
        self.reading[conn] = None
        self.poller.register(conn.sock, selectors.EVENT_READ, partial(self._on_readable, conn))

    def _unwatch(self, conn: BufferedConn) -> None:
        self.reading.pop(conn, None)
        with contextlib.suppress(KeyError, ValueError, OSError):
            self.poller.unregister(conn.sock)

    def _on_readable(self, conn: BufferedConn, _sock=None) -> None:
        try:
            data = conn.sock.recv(_RECV)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:  # the client closed (or reset) the connection
            self._drop(conn)
            return
        conn.buf += data
        self._advance(conn)

    def on_request_start(self, conn: BufferedConn) -> None:
        """Called when the first byte of a request is read (a subclass stamps it)."""

    def _advance(self, conn: BufferedConn) -> None:
        """Move the connection's request forward with the bytes buffered so far."""
        now = time.monotonic()
        try:
            if conn.phase == "idle":
                conn.phase = "head"
                conn.started_at = now
                conn.deadline = now + self.front.header_timeout_s
                self.on_request_start(conn)
            if conn.phase == "head":
                end = conn.buf.find(b"\r\n\r\n")
                if end < 0:
                    if len(conn.buf) > self.front.max_header_bytes:
                        raise FramingError(
                            431, f"request header block exceeds {self.front.max_header_bytes} bytes"
                        )
                    return
                if end > self.front.max_header_bytes:
                    raise FramingError(
                        431, f"request header block exceeds {self.front.max_header_bytes} bytes"
                    )
                conn.head_end = end + 4
                length, conn.chunked = parse_head(bytes(conn.buf[:end]), self.front.max_body_bytes)
                if conn.chunked:
                    conn.chunk_pos = conn.head_end
                else:
                    conn.need = conn.head_end + length
                conn.phase = "body"
                conn.deadline = now + self.front.body_timeout_s
                if b"100-continue" in conn.buf[:end].lower():
                    with contextlib.suppress(OSError):  # the client waits for it
                        conn.sock.send(b"HTTP/1.1 100 Continue\r\n\r\n")
            if conn.phase == "body":
                if conn.chunked:
                    conn.chunk_pos, conn.chunk_total, done = scan_chunks(
                        conn.buf, conn.chunk_pos, conn.chunk_total, self.front.max_body_bytes
                    )
                    if not done:
                        return
                    conn.need = conn.chunk_pos
                if len(conn.buf) < conn.need:
                    return
                self._dispatch(conn)
        except FramingError as exc:
            _counts["framing_errors"] += 1
            self._answer_and_close(conn, exc.status, str(exc))

    def _dispatch(self, conn: BufferedConn) -> None:
        """Hand a complete request to the thread pool; extra bytes stay for the next."""
        self._unwatch(conn)
        need = conn.need or 0
        if need == len(conn.buf):
            data, conn.buf = bytes(conn.buf), bytearray()
        else:  # pipelined: keep what follows this request
            data = bytes(conn.buf[:need])
            del conn.buf[:need]
        conn.request_bytes = need
        _counts["requests"] += 1
        head_end = conn.head_end
        if self._loop_path(data) is not None:  # liveness: never waits for a thread
            conn.reset()
            conn.sock.setblocking(True)
            _counts["loop"] += 1
            done: Future = Future()
            done.set_result(self._answer_loop(conn, data, head_end))
            self.finish_request(conn, done)
            return
        inline = self._inline(data)
        conn.reset()
        conn.sock.setblocking(True)
        if inline:
            _counts["inline"] += 1
            keep = self._answer_frame(conn, data, head_end)
            if keep is None:  # not a frame call: gunicorn's parser and the WSGI app
                conn.parser = http.get_parser(self.cfg, MemorySource(data), conn.client)
                del data
                keep = self.handle(conn)  # handle() answers every error itself
            done: Future = Future()
            done.set_result(keep)
            self.finish_request(conn, done)
            return
        if self._dispatcher_takes(data):  # answered from these bytes (handle())
            conn.framed = (data, head_end)
        else:
            conn.parser = http.get_parser(self.cfg, MemorySource(data), conn.client)
        del data
        self._in_pool += 1
        conn.in_pool = True
        self.enqueue_req(conn)

    def _loop_path(self, data: bytes) -> str | None:
        """The path of a bodiless ``GET`` the app answers on the loop
        (:func:`~gnn_faas.http.loop_route`), else ``None``."""
        app = self.wsgi
        if not isinstance(app, FrameDispatcher) or not app.loop_routes:
            return None
        if not data.startswith(b"GET "):
            return None
        line = data[: data.find(b"\r\n")].decode("latin-1").split(" ")
        if len(line) != 3:
            return None
        path = line[1].partition("?")[0]
        return path if path in app.loop_routes else None

    def _answer_loop(self, conn: BufferedConn, data: bytes, head_end: int) -> bool:
        """Answer a :meth:`_loop_path` request here; whether the connection stays open."""
        app = self.wsgi
        lines = data[: head_end - 4].split(b"\r\n")
        method, target, version = lines[0].decode("latin-1").split(" ")
        connection = ""
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"connection":
                connection = value.strip().decode("latin-1").lower()
        path, _, query = target.partition("?")
        t0 = time.monotonic()
        status, out_headers, body = app.answer_loop(path)
        return self._send_answer(
            conn, version, connection, status, out_headers, body, (method, path, query, t0)
        )

    def _send_answer(
        self,
        conn: BufferedConn,
        version: str,
        connection: str,
        status: int,
        out_headers: list[tuple[str, str]],
        body: bytes,
        access: tuple[str, str, str, float],
    ) -> bool:
        """Write an answer framed here and its access line; whether the
        connection stays open (``access``: method, path, query, start time)."""
        keep = self.alive and "close" not in connection
        keep = keep and (version == "HTTP/1.1" or "keep-alive" in connection)
        head = [f"HTTP/1.1 {status} {reason(status)}"]
        head += [f"{k}: {v}" for k, v in out_headers]
        head.append("Connection: keep-alive" if keep else "Connection: close")
        try:
            conn.sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body)
            if not keep:
                # the client may read until the connection ends: end it now, not
                # after the access line and the loop's turn (finish_request closes)
                conn.sock.shutdown(socket.SHUT_WR)
        except OSError:
            keep = False
        line = getattr(self.log, "access_line", None)
        if line is not None:
            method, path, query, t0 = access
            trace = dict(out_headers).get(request_id.HEADER)
            ctx = request_id.parse_traceparent(trace)
            remote = conn.client[0] if isinstance(conn.client, tuple) else str(conn.client or "")
            trace_id = None if ctx is None else ctx.trace_id
            line(method, path, query, status, len(body), time.monotonic() - t0, remote, trace_id)
        return keep

    def _inline(self, data: bytes) -> bool:
        """Whether a complete request is handled on this thread (module docstring)."""
        if self._in_pool or len(data) > self.front.inline_max_bytes:
            return False
        if self._inline_paths is None:
            paths = getattr(self.wsgi, "inline_paths", ())
            self._inline_paths = frozenset(p.encode() for p in paths)
        if not self._inline_paths:
            return False
        line = data[: data.find(b"\r\n")].split(b" ")
        return len(line) == 3 and line[1].split(b"?")[0] in self._inline_paths

    def _dispatcher_takes(self, data: bytes) -> bool:
        """Whether the app's :class:`~gnn_faas.http.FrameDispatcher` may answer
        this request (its request line says so; :meth:`_answer_frame` checks
        the headers)."""
        app = self.wsgi
        if not isinstance(app, FrameDispatcher):
            return False
        line = data[: data.find(b"\r\n")].decode("latin-1").split(" ")
        if len(line) != 3:
            return False
        path = line[1].partition("?")[0]
        return line[0] == "POST" and app.serves(path)

    def _answer_frame(self, conn: BufferedConn, data: bytes, head_end: int) -> bool | None:
        """Answer a request the app's :class:`~gnn_faas.http.FrameDispatcher`
        takes (a frame or body route) straight from the bytes this loop framed
        (no second parse, no WSGI environ), on the loop or a pool thread;
        whether the connection stays open. ``None``: not such a request."""
        app = self.wsgi
        if not isinstance(app, FrameDispatcher):
            return None
        lines = data[: head_end - 4].split(b"\r\n")
        request_line = lines[0].decode("latin-1").split(" ")
        if len(request_line) != 3:
            return None
        method, target, version = request_line
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(b":")
            if not sep:
                return None
            headers[name.strip().decode("latin-1").lower()] = value.strip().decode("latin-1")
        path, _, query = target.partition("?")
        length = headers.get("content-length", "")
        if (
            "transfer-encoding" in headers
            or not length.isdigit()
            or not app.takes(method, path, headers.get("content-type"))
        ):
            return None
        t0 = time.monotonic()
        n = int(length)
        status, out_headers, body = app.answer(path, data[head_end : head_end + n], n, headers)
        connection = headers.get("connection", "").lower()
        return self._send_answer(
            conn, version, connection, status, out_headers, body, (method, path, query, t0)
        )

    def _answer_and_close(self, conn: BufferedConn, status: int, message: str) -> None:
        with contextlib.suppress(OSError):
            conn.sock.send(json_error(status, message))
        self._drop(conn)

    def _drop(self, conn: BufferedConn) -> None:
        self._unwatch(conn)
        self.nr_conns -= 1
        conn.buf = bytearray()
        with contextlib.suppress(OSError):
            conn.sock.shutdown(socket.SHUT_RDWR)
        util.close(conn.sock)

    def _expire(self, now: float) -> None:
        """Close the connections past their deadline (at most once per ``sweep_s``)."""
        if now - self._last_sweep < self.front.sweep_s:
            return
        self._last_sweep = now
        for conn in [c for c in self.reading if c.deadline <= now]:
            if conn.phase == "idle":
                self._drop(conn)  # an idle kept-alive connection: nothing to answer
            else:
                _counts["timed_out"] += 1
                what = "header block" if conn.phase == "head" else "body"
                self._answer_and_close(conn, 408, f"request {what} not received in time")

    # -- after a request -----------------------------------------------------------
    def handle(self, conn):
        """Pool thread: a request the app's dispatcher takes is answered from the
        bytes the loop read (:meth:`_answer_frame`); any other goes through
        gunicorn's parser and the WSGI app."""
        try:
            framed, conn.framed = conn.framed, None
            if framed is not None:
                keep = self._answer_frame(conn, *framed)
                if keep is not None:
                    return keep
                conn.parser = http.get_parser(self.cfg, MemorySource(framed[0]), conn.client)
                del framed
            return super().handle(conn)
        finally:
            self.after_request(conn)

    def after_request(self, conn: BufferedConn) -> None:
        """Called in the pool thread after each request: after a large one, glibc's
        free heap goes back to the OS (``malloc_trim``), so a burst of large bodies
        does not leave the worker's RSS at its peak."""
        limit = self.front.trim_after_bytes
        if limit and conn.request_bytes >= limit:
            conn.request_bytes = 0
            malloc_trim()

    def finish_request(self, conn, fs):
        """Main thread, after a request was answered: back to reading, or close."""
        if getattr(conn, "in_pool", False):
            conn.in_pool = False
            self._in_pool -= 1
        try:
            keep = bool(fs.result()) if not fs.cancelled() else False
        except Exception:
            keep = False
        if keep and self.alive:
            conn.parser = None
            conn.reset()
            conn.deadline = time.monotonic() + self.front.keepalive_s
            try:
                self._watch(conn)
            except (OSError, ValueError):
                self.nr_conns -= 1
                util.close(conn.sock)
                return
            if conn.buf:  # a pipelined request already arrived
                self._advance(conn)
            return
        self.nr_conns -= 1
        with contextlib.suppress(OSError):
            conn.sock.shutdown(socket.SHUT_WR)
        util.close(conn.sock)

    # -- the loop ------------------------------------------------------------------
    def run(self):
        self.poller.register(
            self.method_queue.fileno(), selectors.EVENT_READ, self.method_queue.run_callbacks
        )
        self.set_accept_enabled(True)
        tick = min(1.0, self.front.sweep_s)
        while self.alive:
            self.notify()
            self.wait_for_and_dispatch_events(timeout=tick)
            if not self.is_parent_alive():
                break
            self._expire(time.monotonic())
        # stopping: no new connections; those waiting for a request are closed,
        # those in flight are answered within the graceful timeout
        self.set_accept_enabled(False)
        for conn in list(self.reading):
            self._drop(conn)
        deadline = time.monotonic() + self.cfg.graceful_timeout
        while self.nr_conns > 0 and time.monotonic() < deadline:
            self.notify()
            self.wait_for_and_dispatch_events(timeout=0.5)
        self.tpool.shutdown(wait=False)
        self.poller.close()
        self.method_queue.close()
        for s in self.sockets:
            s.close()
