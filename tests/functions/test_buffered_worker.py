"""The buffering front: framing checks, and a live server under idle and slow clients.

The live tests hold more idle and slow-body connections than the server has
threads and check that a normal request is still answered, that the server
closes every held socket by itself (polled, no timing asserted), that one
connection over the cap is refused at once with a JSON 503, and that framing
errors are JSON 400/413.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import requests

from gnn_faas.functions.buffered_worker import FramingError, parse_head, scan_chunks
from gnn_faas.wire import FRAME_MIME, decode_frame, encode_frame
from tests.functions.front_app import INLINE_MAX

REPO = Path(__file__).resolve().parents[2]


# -- framing (pure functions) ------------------------------------------------------


def test_content_length_frames_the_request():
    assert parse_head(b"POST / HTTP/1.1\r\nContent-Length: 12", 100) == (12, False)
    assert parse_head(b"GET / HTTP/1.1\r\nHost: x", 100) == (0, False)
    assert parse_head(b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked", 100) == (None, True)


@pytest.mark.parametrize(
    ("head", "status"),
    [
        (b"POST / HTTP/1.1\r\nContent-Length: 101", 413),
        (b"POST / HTTP/1.1\r\nContent-Length: 1x", 400),
        (b"POST / HTTP/1.1\r\nContent-Length: -1", 400),
        (b"POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6", 400),
        (b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip", 400),
        (b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 5", 400),
    ],
)
def test_bad_framing_headers_are_refused(head, status):
    with pytest.raises(FramingError) as err:
        parse_head(head, 100)
    assert err.value.status == status


def test_chunks_are_scanned_incrementally():
    body = bytearray(b"4\r\nabcd\r\n3;ext=1\r\nefg\r\n")
    pos, total, done = scan_chunks(body, 0, 0, 100)
    assert (total, done) == (7, False) and pos == len(body)
    body += b"0\r\nX-Trailer: 1\r\n"
    assert scan_chunks(body, pos, total, 100)[2] is False  # trailers not finished
    body += b"\r\nGET"  # end of the request, then the next one (pipelined)
    end, total, done = scan_chunks(body, pos, total, 100)
    assert done and total == 7 and bytes(body[end:]) == b"GET"


@pytest.mark.parametrize(
    ("body", "status"),
    [
        (b"zz\r\nabc\r\n", 400),  # not a hexadecimal size
        (b"3\r\nabcXY", 400),  # chunk not followed by CRLF
        (b"40\r\n", 413),  # 64 bytes declared, over the 50-byte limit
        (b"20\r\n" + b"a" * 32 + b"\r\n20\r\n", 413),  # the sum goes over
        (b"1" * 5000, 400),  # a size line without end
    ],
)
def test_bad_chunks_are_refused(body, status):
    with pytest.raises(FramingError) as err:
        scan_chunks(bytearray(body), 0, 0, 50)
    assert err.value.status == status


# -- a live server -----------------------------------------------------------------

THREADS = 2
CAP = 24
TIMEOUT_S = 1.0
MAX_BODY = 100_000


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[str, int]]:
    cmd = [sys.executable, "-m", "tests.functions.front_app"]
    args = [str(THREADS), str(CAP), str(TIMEOUT_S), str(MAX_BODY)]
    proc = subprocess.Popen(
        cmd + args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        line = proc.stdout.readline()
        m = re.search(r"http://([\d.]+):(\d+)", line)
        assert m, f"server did not start: {line}"
        yield m.group(1), int(m.group(2))
    finally:
        proc.terminate()
        proc.wait(30)


def _raw(addr, payload: bytes) -> tuple[int, dict]:
    """Send ``payload`` on a new connection; the status and JSON body of the answer."""
    with socket.create_connection(addr, timeout=30) as s:
        s.sendall(payload)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


def _closed_by_server(sock: socket.socket) -> bool:
    """True once the server has closed ``sock`` (EOF or reset after any answer)."""
    sock.setblocking(False)
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                return True
    except BlockingIOError:
        return False
    except OSError:
        return True


def _wait_all_closed(socks: list[socket.socket], limit_s: float = 60.0) -> list[bool]:
    deadline = time.monotonic() + limit_s
    closed = [False] * len(socks)
    while not all(closed) and time.monotonic() < deadline:
        for i, s in enumerate(socks):
            closed[i] = closed[i] or _closed_by_server(s)
        time.sleep(0.05)
    return closed


def test_idle_and_slow_clients_hold_no_thread_and_are_closed(server):
    idle = [socket.create_connection(server) for _ in range(8)]
    slow = []
    for _ in range(4):
        s = socket.create_connection(server)
        s.sendall(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 1000\r\n\r\n" + b"x" * 10)
        slow.append(s)
    half = socket.create_connection(server)
    half.sendall(b"GET /ping HTTP/1.1\r\nHost: t\r\n")  # a header block never finished
    held = [*idle, *slow, half]
    try:
        # 13 held connections, 2 threads: normal requests are answered all the same
        for _ in range(3):
            r = requests.post(f"http://{server[0]}:{server[1]}/echo", data=b"hello", timeout=20)
            assert r.status_code == 200 and r.json() == {"bytes": 5, "head": "hello"}
        assert all(_wait_all_closed(held))
    finally:
        for s in held:
            s.close()


def test_slow_bodies_are_answered_408(server):
    with socket.create_connection(server, timeout=30) as s:
        s.sendall(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 50\r\n\r\nabc")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    assert data.startswith(b"HTTP/1.1 408")
    assert json.loads(data.partition(b"\r\n\r\n")[2])["error"].startswith("request body")


def test_connections_over_the_cap_are_refused_with_json_503(server):
    # opened at once (the idle deadline is far longer than this loop), then read:
    # those over the cap hold a 503 already; the rest are closed later, silently
    socks = [socket.create_connection(server) for _ in range(CAP + 8)]
    try:
        answers: dict[int, bytes] = {}
        deadline = time.monotonic() + 60
        while len(answers) < len(socks) and time.monotonic() < deadline:
            for i, s in enumerate(socks):
                if i in answers:
                    continue
                s.setblocking(False)
                try:
                    data = s.recv(65536)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                answers[i] = data
            time.sleep(0.02)
    finally:
        for s in socks:
            s.close()
    refused = [d for d in answers.values() if d]
    assert len(answers) == len(socks)  # every socket was answered or closed by the server
    assert len(refused) >= 8  # at most CAP were kept, and the test's sockets came on top
    for data in refused:
        assert int(data.split()[1]) == 503 and b"Retry-After: 1" in data
        assert "too many connections" in json.loads(data.partition(b"\r\n\r\n")[2])["error"]


def test_framing_errors_are_json(server):
    status, body = _raw(
        server,
        b"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n",
    )
    assert status == 400 and "invalid chunk size" in body["error"]
    big = b"".join(b"%x\r\n%s\r\n" % (20_000, b"a" * 20_000) for _ in range(6)) + b"0\r\n\r\n"
    status, body = _raw(
        server, b"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n" + big
    )
    assert status == 413 and str(MAX_BODY) in body["error"]
    status, body = _raw(server, b"BAD\x01 /x HTTP/1.1\r\nHost: t\r\n\r\n")  # gunicorn's parser
    assert status == 400 and body["error"]


def test_chunked_pipelined_and_kept_alive_requests_are_served(server):
    chunked = b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
    with socket.create_connection(server, timeout=30) as s:
        s.sendall(
            b"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
            + chunked
            + b"GET /ping HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"
        )
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    assert data.count(b"HTTP/1.1 200") == 2
    assert b'{"bytes":5,"head":"abcde"}' in data and b'{"ok":true}' in data
    with requests.Session() as session:  # the same connection, kept alive between requests
        for _ in range(3):
            assert session.get(f"http://{server[0]}:{server[1]}/ping", timeout=20).ok


def test_a_non_finite_answer_is_a_json_500_never_nan(server):
    r = requests.get(f"http://{server[0]}:{server[1]}/nan", timeout=20)
    assert r.status_code == 500
    assert "NaN" not in r.text and r.json()["error"].startswith("internal error")


def _served_on_the_loop(base: str, padding: int = 0) -> bool:
    body = encode_frame({"pad": np.zeros(padding, np.uint8)})
    r = requests.post(f"{base}/where", data=body, headers={"Content-Type": FRAME_MIME}, timeout=20)
    assert r.ok, r.text
    return bool(decode_frame(r.content)[0]["main"][0])


def _until_served_on_the_loop(base: str) -> None:
    """Poll until a small call is served on the loop: the pool counts a request
    done when the loop hears of it, which may come just after its client (an
    earlier test's, or this one's) has the answer."""
    deadline = time.monotonic() + 30
    while not _served_on_the_loop(base):
        assert time.monotonic() < deadline, "the loop never served a small call"


def test_small_bounded_calls_run_on_the_event_loop_unless_the_pool_is_busy(server):
    base = f"http://{server[0]}:{server[1]}"
    _until_served_on_the_loop(base)  # small, an inline path, nothing in the pool
    assert not _served_on_the_loop(base, padding=INLINE_MAX)  # too large: a pool thread
    held = ThreadPoolExecutor(1).submit(requests.get, f"{base}/hold", timeout=60)
    deadline = time.monotonic() + 30
    while not requests.get(f"{base}/held", timeout=20).json()["held"]:
        assert time.monotonic() < deadline, "the held request never started"
        time.sleep(0.02)
    # a request is in the pool: the loop hands this one on too (a health check
    # may wait behind one small call at most, never behind a long one)
    assert not _served_on_the_loop(base)
    requests.get(f"{base}/release", timeout=20)
    assert held.result(timeout=60).json() == {"released": True}
    _until_served_on_the_loop(base)
    assert requests.get(f"{base}/front", timeout=20).json()["inline"] >= 2


def _frame_call(extra_headers: bytes, body: bytes, version: bytes = b"HTTP/1.1") -> bytes:
    return (
        b"POST /where " + version + b"\r\nHost: t\r\nContent-Type: " + FRAME_MIME.encode()
        + b"\r\nContent-Length: %d\r\n" % len(body) + extra_headers + b"\r\n" + body
    )  # fmt: skip


def test_frame_calls_answered_from_the_loop_keep_http_semantics(server):
    """A frame call the loop answers itself (no gunicorn parser): two calls on one
    kept-alive connection, then ``Connection: close`` honoured; HTTP/1.0 closes;
    a bad frame is a JSON 400; the trace id comes back in ``traceparent``."""
    ok = encode_frame({"pad": np.zeros(4, np.uint8)})
    trace = "00-" + "12" * 16 + "-" + "34" * 8 + "-01"
    with socket.create_connection(server, timeout=30) as s:
        s.sendall(_frame_call(b"traceparent: " + trace.encode() + b"\r\n", ok))
        s.sendall(_frame_call(b"Connection: close\r\n", ok))
        data = b""
        while chunk := s.recv(65536):  # the server closes after the second answer
            data += chunk
    answers = data.split(b"HTTP/1.1 200 OK\r\n")[1:]
    assert len(answers) == 2
    assert b"Connection: keep-alive" in answers[0] and b"Connection: close" in answers[1]
    assert b"traceparent: 00-" + b"12" * 16 in answers[0]
    with socket.create_connection(server, timeout=30) as s:
        s.sendall(_frame_call(b"", ok, b"HTTP/1.0"))
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    assert data.startswith(b"HTTP/1.1 200") and b"Connection: close" in data
    status, body = _raw(server, _frame_call(b"Connection: close\r\n", b"\x05not a frame"))
    assert status == 400 and "error" in body


def test_body_routes_are_answered_from_the_loops_bytes_on_a_pool_thread(server):
    """A body route (the gateway's inference) runs on a pool thread, answered by
    the dispatcher from the bytes the loop framed: no gunicorn parser, no
    Flask; kept-alive connections and query strings as usual. A chunked body
    goes to Flask's view of the same path."""
    base = f"http://{server[0]}:{server[1]}"
    with requests.Session() as s:
        for n in (3, 4):
            r = s.post(f"{base}/raw/{n}?x=1", data=b"abc", headers={"Content-Type": "text/x"})
            assert r.status_code == 200 and r.headers["traceparent"]
            assert r.json() == {"flask": False, "n": n, "bytes": 3, "main": False,
                                "type": "text/x"}  # fmt: skip
    r = requests.post(f"{base}/raw/5", data=iter([b"ab", b"cd"]), timeout=20)
    assert r.json()["flask"] is True and r.json()["bytes"] == 4
    assert requests.post(f"{base}/raw/x", data=b"", timeout=20).status_code == 404


def test_a_worker_keeps_its_startup_objects_out_of_the_collectors_passes(server):
    """The app and what it imported are frozen once loaded (gunicorn_runner): a
    full collection walks only what requests allocated since."""
    got = requests.get(f"http://{server[0]}:{server[1]}/gc", timeout=20).json()
    assert got["frozen"] > 10_000  # Flask, numpy, the app: tens of thousands of objects
    assert got["tracked"] < got["frozen"]  # what a full pass still walks


def test_the_front_counts_what_it_refused(server):
    """Runs last: the module's earlier tests refused, timed out and mis-framed."""
    stats = requests.get(f"http://{server[0]}:{server[1]}/front", timeout=20).json()
    assert stats["max_connections"] == CAP and stats["header_timeout_s"] == TIMEOUT_S
    assert stats["refused"] >= 8  # the connections over the cap
    assert stats["timed_out"] >= 2  # the slow body and the unfinished header block
    assert stats["framing_errors"] >= 2  # the bad chunk size and the oversize body
    assert stats["requests"] >= 5


def test_liveness_is_answered_while_every_thread_is_blocked(server):
    """Every pool thread waits (as on a hung store): the loop still answers liveness."""
    base = f"http://{server[0]}:{server[1]}"
    pool = ThreadPoolExecutor(THREADS)
    blocked = [pool.submit(requests.get, f"{base}/block", timeout=90) for _ in range(THREADS)]
    while requests.get(f"{base}/blocked", timeout=30).json()["blocked"] < THREADS:
        time.sleep(0.02)  # polling the count (a loop route: it never waits for a thread)
    live = requests.get(f"{base}/v2/health/live", timeout=30)
    assert (live.status_code, live.json()) == (200, {"live": True})
    # a route that needs a thread waits meanwhile: it is still in flight here
    waiting = pool.submit(requests.get, f"{base}/ping", timeout=90)
    assert not waiting.done()
    assert requests.get(f"{base}/unblock", timeout=30).json() == {"ok": True}
    assert [f.result().json() for f in blocked] == [{"unblocked": True}] * THREADS
    assert waiting.result().status_code == 200
    pool.shutdown()
