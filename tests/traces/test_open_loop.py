"""The shared open-loop sender: answers are parsed whatever their framing (a
``Content-Length``, chunked, or neither), a 200's body is kept only when asked,
other answers are kept cut short, and a refused connection is recorded as no
answer with the exception's name."""

from __future__ import annotations

import numpy as np
import pytest

from gnn_faas.traces.open_loop import ERROR_BODY_BYTES, parse_answer, send_open_loop
from tests.servers import QuietHandler, http_server


def test_parse_answer_framings():
    plain = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-A: b\r\n\r\nhello"
    assert parse_answer(plain) == (200, {"content-length": "5", "x-a": "b"}, b"hello")
    chunked = (
        b"HTTP/1.1 503 Service Unavailable\r\nTransfer-Encoding: chunked\r\n"
        b"Retry-After: 2\r\n\r\n4\r\nwiki\r\n6;ext=1\r\npedia \r\n0\r\n\r\n"
    )
    status, headers, body = parse_answer(chunked)
    assert (status, headers["retry-after"], body) == (503, "2", b"wikipedia ")
    assert parse_answer(b"HTTP/1.0 404 Not Found\r\n\r\nno length") == (404, {}, b"no length")
    with pytest.raises(ValueError):
        parse_answer(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n")


class _Handler(QuietHandler):
    def do_POST(self):  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers["Content-Length"]))
        status = 200 if body == b"ok" else 400
        data = (b"y" if status == 200 else b"x") * 1000
        self.send_response(status)
        self.send_header("Content-Type", self.headers["Content-Type"])
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture()
def server():
    with http_server(_Handler) as url:
        yield url


@pytest.mark.parametrize("keep", [False, True])
def test_answers_recorded_per_request(server, keep):
    due = np.linspace(0, 0.1, 6)
    bodies = [b"ok", b"bad"] * 3
    done = []
    s = send_open_loop(server, "/p", due, bodies, content_type="application/x-gnn-faas-frame",
                       keep_answers=keep, on_answer=lambda: done.append(1))  # fmt: skip
    assert s.status.tolist() == [200, 400] * 3 and sorted(s.done_order) == list(range(6))
    assert len(done) == 6 and np.all(s.send >= due - 1e-3) and np.all(s.latency > 0)
    assert s.body[0] == (b"y" * 1000 if keep else b"")
    assert s.body[1] == b"x" * ERROR_BODY_BYTES and s.error == [""] * 6
    assert s.last_done >= s.first_sent > 0


def test_refused_connection_is_no_answer():
    s = send_open_loop("http://127.0.0.1:9", "/p", np.zeros(3), [b"a"] * 3, timeout_s=2)
    assert s.status.tolist() == [0, 0, 0] and np.all(np.isfinite(s.latency))
    assert all(e.startswith("ConnectionRefusedError") for e in s.error)
    s = send_open_loop("http://no-such-host.invalid:9", "/p", np.zeros(2), [b"a"] * 2)
    assert s.status.tolist() == [0, 0] and all("did not resolve" in e for e in s.error)


def test_a_server_that_never_answers_times_out_and_localhost_resolves():
    """An accepted connection that gets no answer ends at ``timeout_s`` as a
    ``TimeoutError`` (no hang); a host name is resolved before the sends."""
    import socket

    with socket.create_server(("127.0.0.1", 0)) as listener:  # accepts (backlog), never reads
        port = listener.getsockname()[1]
        s = send_open_loop(f"http://localhost:{port}", "/p", np.zeros(2), [b"a"] * 2,
                           timeout_s=0.5)  # fmt: skip
    assert s.status.tolist() == [0, 0]
    assert all(e.startswith("TimeoutError") for e in s.error), s.error
    assert np.all((s.latency >= 0.45) & (s.latency < 10))
