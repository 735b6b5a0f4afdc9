"""A lean HTTP/1.1 client over kept-alive connections: the gateway's calls to its functions.

Why not :mod:`urllib3` (which ``https://`` function URLs still use): a function
call on a small graph is mostly fixed cost, and a lone request makes four of
them. Client CPU per call, a 2 KB frame to a trivial loopback server, 3,000
calls: urllib3 192 us, :mod:`http.client` 86 us, this client 14 us (most of
urllib3's and http.client's time goes to building and parsing headers with
the ``email`` package).

What it speaks (RFC 9112): one request at a time per connection, its body sent
with ``Content-Length`` (head and body in one ``sendmsg``, no copy); answers
framed by ``Content-Length``, by the chunked transfer coding, or by the server
closing the connection; interim ``1xx`` answers skipped; ``HEAD``, ``204`` and
``304`` answers have no body. A connection is kept for the next call unless
the answer or the request said ``Connection: close`` or the answer came in
HTTP/1.0 without ``keep-alive``.

An idle kept-alive connection the server has closed meanwhile (its keep-alive
timeout) is found before use and replaced; when the server closes a reused
connection before a single byte of the answer, the call is sent once more on
a new connection (the request never reached the application), as browsers do.
Timeouts and refused or reset connections raise :class:`OSError` (a
``TimeoutError`` for a timeout); a malformed answer raises
:class:`ProtocolError`.
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
from dataclasses import dataclass

MAX_HEAD_BYTES = 64 * 1024
_RECV = 256 * 1024


class ProtocolError(OSError):
    """The server's answer is not HTTP/1.1 this client can read, or it closed the
    connection mid-answer."""


class _ClosedBeforeAnswer(ProtocolError):
    """The server closed the connection before any byte of an answer."""


@dataclass(frozen=True)
class HttpReply:
    """Status, headers (names lower-cased; repeats joined with ``", "``) and body."""

    status: int
    headers: dict[str, str]
    data: bytes


class Headers(dict):
    """Response headers with case-insensitive :meth:`get` (keys are lower-case)."""

    def get(self, key: str, default=None):  # type: ignore[override]
        return super().get(key.lower(), default)

    def __getitem__(self, key: str) -> str:
        return super().__getitem__(key.lower())

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and super().__contains__(key.lower())


class _Connection:
    def __init__(self, host: str, port: int, timeout: float):
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = bytearray()
        self.used = False  # carried a call before (a kept-alive connection)
        self._answering = False  # a byte of the current answer has been read

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()

    def dropped(self) -> bool:
        """Whether the server closed (or wrote unasked to) this idle connection."""
        try:
            readable, _, _ = select.select([self.sock], [], [], 0)
        except (OSError, ValueError):
            return True
        return bool(readable)  # an idle HTTP connection has nothing to read but EOF

    # -- reading -------------------------------------------------------------------
    def _fill(self) -> None:
        chunk = self.sock.recv(_RECV)
        if not chunk:
            if not self.buf and not self._answering:
                raise _ClosedBeforeAnswer("the server closed the connection before answering")
            raise ProtocolError("the server closed the connection mid-answer")
        self.buf += chunk

    def _line(self) -> bytes:
        while (end := self.buf.find(b"\r\n")) < 0:
            if len(self.buf) > MAX_HEAD_BYTES:
                raise ProtocolError("answer line too long")
            self._fill()
        line = bytes(self.buf[:end])
        del self.buf[: end + 2]
        return line

    def _exact(self, n: int) -> bytes:
        if len(self.buf) >= n:
            out = bytes(self.buf[:n])
            del self.buf[:n]
            return out
        out = bytearray(n)
        have = len(self.buf)
        out[:have] = self.buf
        self.buf.clear()
        view = memoryview(out)
        while have < n:
            got = self.sock.recv_into(view[have:], min(n - have, 1 << 24))
            if not got:
                raise ProtocolError("the server closed the connection mid-answer")
            have += got
        return bytes(out)

    def _head(self) -> tuple[int, bool, Headers]:
        while (end := self.buf.find(b"\r\n\r\n")) < 0:
            if len(self.buf) > MAX_HEAD_BYTES:
                raise ProtocolError(f"answer head over {MAX_HEAD_BYTES} bytes")
            self._fill()
        lines = bytes(self.buf[:end]).split(b"\r\n")
        del self.buf[: end + 4]
        version, _, rest = lines[0].partition(b" ")
        code = rest[:3]
        if not version.startswith(b"HTTP/1.") or not code.isdigit():
            raise ProtocolError(f"not an HTTP/1.x answer: {lines[0][:80]!r}")
        headers = Headers()
        for line in lines[1:]:
            name, sep, value = line.partition(b":")
            if not sep:
                raise ProtocolError(f"bad answer header line {line[:80]!r}")
            key = name.strip().decode("latin-1").lower()
            val = value.strip().decode("latin-1")
            headers[key] = f"{headers[key]}, {val}" if key in headers else val
        return int(code), version == b"HTTP/1.1", headers

    def _chunked(self) -> bytes:
        parts = []
        while True:
            size_line = self._line().split(b";", 1)[0].strip()
            try:
                size = int(size_line, 16)
            except ValueError:
                raise ProtocolError(f"bad chunk size {size_line[:20]!r}") from None
            if size == 0:
                trailer = self._line()
                while trailer:  # trailers, up to the empty line
                    trailer = self._line()
                return b"".join(parts)
            parts.append(self._exact(size))
            if self._line():
                raise ProtocolError("chunk not followed by CRLF")

    def exchange(self, method: str, head: bytes, body: bytes) -> tuple[HttpReply, bool]:
        """Send one request; its answer and whether the connection stays usable."""
        self._answering = False
        if not body:
            self.sock.sendall(head)
        else:  # head and body in one call; a full send buffer leaves the rest to sendall
            sent = self.sock.sendmsg([head, body])
            if sent < len(head):
                self.sock.sendall(head[sent:])
                sent = len(head)
            if sent - len(head) < len(body):
                self.sock.sendall(memoryview(body)[sent - len(head) :])
        return self._answer(method)

    def _answer(self, method: str) -> tuple[HttpReply, bool]:
        while True:
            status, http11, headers = self._head()
            self._answering = True
            if not (100 <= status < 200) or status == 101:
                break
        connection = headers.get("connection", "").lower()
        keep = "close" not in connection and (http11 or "keep-alive" in connection)
        if method == "HEAD" or status in (204, 304):
            data = b""
        elif "chunked" in headers.get("transfer-encoding", "").lower():
            data = self._chunked()
        elif "content-length" in headers:
            try:
                n = int(headers["content-length"])
            except ValueError:
                raise ProtocolError("bad Content-Length in the answer") from None
            data = self._exact(n)
        else:  # framed by the end of the connection
            while True:
                chunk = self.sock.recv(_RECV)
                if not chunk:
                    break
                self.buf += chunk
            data, keep = bytes(self.buf), False
            self.buf.clear()
        if self.buf:  # bytes beyond the answer: the connection is out of step
            keep = False
        return HttpReply(status, headers, data), keep


class KeepAlivePool:
    """Kept-alive connections to one ``host:port`` (at most ``maxsize`` idle ones
    are kept; more are opened while more threads call at once). Thread-safe."""

    def __init__(self, host: str, port: int, maxsize: int = 10):
        self.host = host
        self.port = int(port)
        self.maxsize = max(1, int(maxsize))
        self._host_header = f"{host}:{port}"
        self._idle: list[_Connection] = []
        self._lock = threading.Lock()

    def _take(self, timeout: float) -> _Connection:
        while True:
            with self._lock:
                conn = self._idle.pop() if self._idle else None
            if conn is None:
                return _Connection(self.host, self.port, timeout)
            if not conn.dropped():
                return conn
            conn.close()

    def _give(self, conn: _Connection) -> None:
        with self._lock:
            if len(self._idle) < self.maxsize:
                self._idle.append(conn)
                return
        conn.close()

    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
        timeout: float = 60.0,
    ) -> HttpReply:
        """One request and its answer (``timeout``: seconds for the connect and for
        each read or write)."""
        body = body or b""
        lines = [f"{method} {path} HTTP/1.1", f"Host: {self._host_header}"]
        if body or method in ("POST", "PUT", "PATCH"):
            lines.append(f"Content-Length: {len(body)}")
        lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        close = "close" in (headers or {}).get("Connection", "").lower()
        for attempt in (0, 1):
            conn = self._take(timeout)
            reused = conn.used
            conn.used = True
            try:
                conn.sock.settimeout(timeout)
                reply, keep = conn.exchange(method, head, body)
            except _ClosedBeforeAnswer:
                conn.close()
                if reused and attempt == 0:  # a stale kept-alive connection: once more
                    continue
                raise
            except BaseException:
                conn.close()
                raise
            if keep and not close:
                self._give(conn)
            else:
                conn.close()
            return reply
        raise AssertionError("unreachable")  # pragma: no cover

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
