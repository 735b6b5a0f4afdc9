"""The lean keep-alive HTTP/1.1 client against a scripted raw server."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator

import pytest

from gnn_faas.functions.keepalive_http import KeepAlivePool, ProtocolError

Action = Callable[[socket.socket, bytes, bytes], bool]  # (sock, head, body) -> keep open


class ScriptedServer:
    """Answers the n-th request it reads (over all connections) with ``script[n]``."""

    def __init__(self, script: list[Action]):
        self.script = script
        self.requests: list[tuple[bytes, bytes]] = []
        self.connections = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            with self._lock:
                self.connections += 1
            threading.Thread(target=self._serve, args=(sock,), daemon=True).start()

    def _serve(self, sock: socket.socket) -> None:
        buf = b""
        with sock:
            while True:
                while b"\r\n\r\n" not in buf:
                    chunk = sock.recv(65536)
                    if not chunk:
                        return
                    buf += chunk
                head, _, buf = buf.partition(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                while len(buf) < length:
                    buf += sock.recv(1 << 20)
                body, buf = buf[:length], buf[length:]
                with self._lock:
                    n = len(self.requests)
                    self.requests.append((head, body))
                if not self.script[n](sock, head, body):
                    return

    def close(self) -> None:
        self.listener.close()


def answer(body: bytes = b"ok", status: str = "200 OK", extra: str = "") -> Action:
    def act(sock, head, req_body) -> bool:
        sock.sendall(
            f"HTTP/1.1 {status}\r\nContent-Length: {len(body)}\r\n{extra}\r\n".encode() + body
        )
        return "Connection: close" not in extra

    return act


def echo(sock, head, body) -> bool:
    sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    return True


def hang_up(sock, head, body) -> bool:
    return False


@pytest.fixture
def serve() -> Iterator[Callable[[list[Action]], tuple[ScriptedServer, KeepAlivePool]]]:
    made: list = []

    def make(script: list[Action]):
        server = ScriptedServer(script)
        pool = KeepAlivePool("127.0.0.1", server.port, maxsize=2)
        made.append((server, pool))
        return server, pool

    yield make
    for server, pool in made:
        pool.close()
        server.close()


def test_kept_alive_calls_share_one_connection_and_headers_are_case_insensitive(serve):
    server, pool = serve(
        [answer(b"a", extra="Server-Timing: app;dur=1\r\nX-A: 1\r\nx-a: 2\r\n")] * 3
    )
    for _ in range(3):
        r = pool.request("POST", "/v1/x", b"body", {"Content-Type": "t/x"}, timeout=10)
        assert r.status == 200 and r.data == b"a"
        assert r.headers.get("server-timing") == "app;dur=1" == r.headers["Server-Timing"]
        assert r.headers.get("X-A") == "1, 2" and "content-length" in r.headers
    assert server.connections == 1
    head, body = server.requests[0]
    assert head.startswith(b"POST /v1/x HTTP/1.1\r\n") and body == b"body"
    assert b"Content-Type: t/x" in head and b"Content-Length: 4" in head


def test_large_bodies_cross_intact_both_ways(serve):
    _, pool = serve([echo, echo])
    big = bytes(range(256)) * (24 * 1024)  # 6 MiB: more than a socket buffer
    for _ in range(2):
        assert pool.request("POST", "/echo", big, timeout=30).data == big


def test_chunked_answers_with_extensions_and_trailers(serve):
    def chunked(sock, head, body) -> bool:
        sock.sendall(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"5;ext=1\r\nhello\r\n1\r\n \r\n5\r\nworld\r\n0\r\nX-Trailer: t\r\n\r\n"
        )
        return True

    server, pool = serve([chunked, answer(b"next")])
    assert pool.request("GET", "/c", timeout=10).data == b"hello world"
    assert pool.request("GET", "/c", timeout=10).data == b"next"
    assert server.connections == 1  # the chunked answer left the connection usable


def test_interim_answers_no_body_answers_and_close_framing(serve):
    def continue_then(sock, head, body) -> bool:
        sock.sendall(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi")
        return True

    def until_close(sock, head, body) -> bool:
        sock.sendall(b"HTTP/1.1 200 OK\r\n\r\nall of it")
        return False

    server, pool = serve([continue_then, answer(b"", "204 No Content"), until_close, answer(b"x")])
    assert pool.request("POST", "/a", b"1", timeout=10).data == b"hi"
    r = pool.request("POST", "/b", b"1", timeout=10)
    assert r.status == 204 and r.data == b""
    assert pool.request("GET", "/c", timeout=10).data == b"all of it"
    assert pool.request("GET", "/d", timeout=10).data == b"x"
    assert server.connections == 2  # the close-framed answer ended its connection


def test_connection_close_is_honoured(serve):
    server, pool = serve([answer(b"1", extra="Connection: close\r\n"), answer(b"2")])
    assert pool.request("GET", "/", timeout=10).data == b"1"
    assert pool.request("GET", "/", timeout=10).data == b"2"
    assert server.connections == 2


def test_a_stale_kept_alive_connection_is_replaced(serve):
    """The server closes a kept-alive connection after reading the next request
    without answering (its keep-alive timeout racing the call): the call is sent
    once more on a new connection. A new connection closed that way fails."""
    server, pool = serve([answer(b"1"), hang_up, answer(b"3"), hang_up])
    assert pool.request("POST", "/", b"a", timeout=10).data == b"1"
    assert pool.request("POST", "/", b"b", timeout=10).data == b"3"
    assert [body for _, body in server.requests[:3]] == [b"a", b"b", b"b"]
    pool.close()  # nothing kept: the next call opens a new connection, which hangs up
    with pytest.raises(ProtocolError):
        pool.request("POST", "/", b"c", timeout=10)


def test_an_idle_connection_closed_by_the_server_is_not_reused(serve):
    def then_close(sock, head, body) -> bool:
        sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\n1")
        sock.shutdown(socket.SHUT_WR)  # keep-alive answered, then closed
        return False

    server, pool = serve([then_close, answer(b"2")])
    assert pool.request("GET", "/", timeout=10).data == b"1"
    assert pool.request("GET", "/", timeout=10).data == b"2"
    assert server.connections == 2 and len(server.requests) == 2  # no request lost


def test_timeouts_refusals_and_bad_answers_raise_oserror(serve):
    def silent(sock, head, body) -> bool:
        threading.Event().wait(5)
        return False

    def garbage(sock, head, body) -> bool:
        sock.sendall(b"SMTP ready\r\n\r\n")
        return False

    _, pool = serve([silent, garbage])
    with pytest.raises(TimeoutError):
        pool.request("GET", "/", timeout=0.2)
    with pytest.raises(ProtocolError):
        pool.request("GET", "/", timeout=10)
    closed = socket.create_server(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    with pytest.raises(OSError):
        KeepAlivePool("127.0.0.1", port).request("GET", "/", timeout=5)
