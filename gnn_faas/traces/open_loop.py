"""One open-loop HTTP sender: requests go out at their scheduled times, answers
are recorded per request.

Requests are sent at their due times whatever the earlier ones are doing (an
open loop: a slow server does not slow the senders down, as with real users).
At most ``max_in_flight`` requests are open at once; beyond that the next send
waits, and its recorded send time shows how late it went (``late_sends``
counts those more than 10 ms late). Latency runs from just before the
connection is opened to the last byte of the answer.

Why asyncio over raw HTTP/1.1, not a pool of threads over ``requests``: the
client shares the machine with the stack it measures (two cores in CI), so
its own cost per request must be small and must not queue. One event loop
holds every open request as a coroutine (no thread per request in flight, no
GIL hand-offs between dozens of sender threads), bodies are serialised and the
address resolved before the clock starts, and a request is the loop's socket
calls on a bare socket (no asyncio streams), a few writes and reads (one
connection per request, ``Connection: close``: the server closes first, so
TIME_WAIT stays on its side, not in the client's ephemeral ports). A thread
pool over ``requests`` costs about twice the client CPU per call and its
senders queue behind each other: 2000 requests at 500/s to a loopback server
on a loaded 2-core machine took 0.45 ms of client CPU per request with a p99
send lag of 13 ms here, against 0.92 ms and a median send lag of 0.6 s with
64 threads over ``requests`` (noisy figures; the point is the order).

Callers decide the body (JSON or the binary tensor extension: any bytes and
their ``Content-Type``) and what to make of the answers:
:func:`gnn_faas.traces.replay.replay` reads the gateway's parameters from each
answer, :func:`gnn_faas.bench.open_loop.run_open_loop` classifies answers as
ok / shed / error.
"""

from __future__ import annotations

import asyncio
import gc
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import numpy as np

LATE_S = 0.010  # a send more than this after its due time counts as late
ERROR_BODY_BYTES = 200  # what is kept of an answer that is not a 200


@dataclass
class Sent:
    """Per request, in the order given: when it went out and how it ended.

    Times are seconds from the sender's start (``start_monotonic`` is that
    start on :func:`time.monotonic`; ``first_sent`` and ``last_done`` are wall
    clock, :func:`time.time`)."""

    send: np.ndarray  # when it was sent
    latency: np.ndarray  # to the answer's last byte, or to the failure
    status: np.ndarray  # HTTP status; 0: no HTTP answer
    retry_after: list[str | None]  # the answer's Retry-After header
    body: list[bytes]  # the answer (a 200's only with keep_answers; others cut short)
    error: list[str]  # "" or "ExceptionType: message" when no answer came
    done_order: list[int] = field(default_factory=list)  # indices in answer order
    late_sends: int = 0
    start_monotonic: float = 0.0
    first_sent: float = 0.0
    last_done: float = 0.0


def _request_bytes(host: str, port: int, path: str, body: bytes, content_type: str) -> bytes:
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\n"
        f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    )
    return head.encode() + body


def _dechunk(body: bytes) -> bytes:
    """The payload of a ``Transfer-Encoding: chunked`` body (trailers dropped)."""
    out, pos = [], 0
    while True:
        line_end = body.index(b"\r\n", pos)
        size = int(body[pos:line_end].split(b";")[0], 16)
        if size == 0:
            return b"".join(out)
        out.append(body[line_end + 2 : line_end + 2 + size])
        pos = line_end + 2 + size + 2


def parse_answer(raw: bytes) -> tuple[int, dict[str, str], bytes]:
    """``(status, headers with lower-case names, body)`` of a whole HTTP/1.1
    answer read until the server closed the connection."""
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    first = lines[0].split() if lines else []
    status = int(first[1]) if len(first) > 1 else 0
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    if "chunked" in headers.get("transfer-encoding", "").lower():
        body = _dechunk(body)
    elif "content-length" in headers:
        body = body[: int(headers["content-length"])]
    return status, headers, body


async def _exchange(addresses: list[tuple], payload: bytes, timeout_s: float) -> bytes:
    """Send ``payload`` on a new connection to the first of the resolved
    ``(family, sockaddr)`` that accepts one (as ``asyncio.open_connection``
    tries them) and read until the server closes: the loop's socket calls on a
    bare non-blocking socket (asyncio's streams cost ~0.3 ms more per request
    on loopback, latency the sender would have added to every figure)."""
    loop = asyncio.get_running_loop()
    for k, (family, sockaddr) in enumerate(addresses):
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            try:
                await asyncio.wait_for(loop.sock_connect(sock, sockaddr), timeout_s)
            except OSError:
                if k + 1 < len(addresses):
                    continue  # the next address
                raise
            return await asyncio.wait_for(_send_and_read(loop, sock, payload), timeout_s)
        finally:
            sock.close()
    raise OSError("the host name did not resolve to an address")


async def _send_and_read(loop: asyncio.AbstractEventLoop, sock: socket.socket, payload: bytes):
    await loop.sock_sendall(sock, payload)
    chunks = []
    while chunk := await loop.sock_recv(sock, 256 * 1024):  # until the server closes
        chunks.append(chunk)
    return b"".join(chunks)


def send_open_loop(
    url: str,
    path: str,
    due_s: np.ndarray,
    bodies: Sequence[bytes],
    *,
    content_type: str = "application/json",
    timeout_s: float = 30.0,
    max_in_flight: int = 2048,
    keep_answers: bool = False,
    on_answer: Callable[[], None] | None = None,
) -> Sent:
    """POST ``bodies[i]`` to ``url + path`` at ``due_s[i]`` seconds from now;
    wait for every answer. ``timeout_s`` bounds the connect and, separately,
    the wait for the whole answer. ``on_answer`` is called once per request
    when it ends (a progress bar)."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    # resolved once, before any clock starts (a name that does not resolve fails
    # each request, as a refused connection does)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError:
        infos = []
    addresses = [(a[0], a[4]) for a in infos]
    due = np.asarray(due_s, dtype=np.float64)
    n = due.size
    payloads = [_request_bytes(host, port, path, b, content_type) for b in bodies]
    sent = Sent(
        send=np.full(n, np.nan),
        latency=np.full(n, np.nan),
        status=np.zeros(n, np.int64),
        retry_after=[None] * n,
        body=[b""] * n,
        error=[""] * n,
    )

    async def one(i: int, start: float, slots: asyncio.Semaphore) -> None:
        t0 = time.perf_counter()
        sent.send[i] = t0 - start
        try:
            raw = await _exchange(addresses, payloads[i], timeout_s)
            status, headers, body = parse_answer(raw)
        except (OSError, asyncio.TimeoutError, ValueError, IndexError) as exc:
            sent.latency[i] = time.perf_counter() - t0
            sent.error[i] = f"{type(exc).__name__}: {exc}"[:ERROR_BODY_BYTES]
        else:
            sent.latency[i] = time.perf_counter() - t0
            sent.status[i] = status
            sent.retry_after[i] = headers.get("retry-after")
            keep = keep_answers if status == 200 else True
            sent.body[i] = (body if status == 200 else body[:ERROR_BODY_BYTES]) if keep else b""
        finally:
            slots.release()
        sent.done_order.append(i)
        sent.last_done = max(sent.last_done, time.time())
        if on_answer is not None:
            on_answer()

    async def main() -> None:
        slots = asyncio.Semaphore(max_in_flight)
        tasks = []
        start = time.perf_counter()
        sent.start_monotonic = time.monotonic()
        sent.first_sent = time.time()
        for i in range(n):
            delay = start + due[i] - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            await slots.acquire()  # bounded: never more than max_in_flight open
            if time.perf_counter() - (start + due[i]) > LATE_S:
                sent.late_sends += 1
            tasks.append(asyncio.ensure_future(one(i, start, slots)))
        if tasks:
            await asyncio.gather(*tasks)

    # the objects alive now (the caller's graph, plans, bodies) are left out of
    # the collector's full passes, which would otherwise walk them all while
    # requests are open and add their pause (a quarter of a second once the
    # caller holds a few hundred thousand objects) to those requests' latency
    gc.freeze()
    asyncio.run(main())
    return sent
