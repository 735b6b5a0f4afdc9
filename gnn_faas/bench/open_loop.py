"""A light open-loop HTTP load generator for the overload and soak benchmarks.

Requests go out at their scheduled times whatever the earlier ones are doing
(an open loop: a slow server does not slow the senders down, as with real
users). One asyncio loop sends them all over raw HTTP/1.1 connections (one
connection per request, ``Connection: close``, bodies serialised in advance),
so a single client core can drive hundreds of requests per second without its
own queueing inflating the latencies it measures. Latency is measured from
just before the connection is opened to the last byte of the answer.

Each answer is classified: ``ok`` (200), ``shed`` (503 with ``Retry-After``:
admission control), ``error`` (anything else, or a failed connection).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import numpy as np

from gnn_faas.traces.replay import vertex_request


@dataclass
class Outcome:
    """One request: when it was due, its latency and how it ended."""

    due_s: float
    latency_s: float
    status: int  # 0: no HTTP answer
    kind: str  # ok | shed | error
    retry_after: str | None = None
    error: str = ""


@dataclass
class LoadResult:
    outcomes: list[Outcome] = field(default_factory=list)
    late_sends: int = 0  # requests sent more than 10 ms after they were due

    def summary(self, slo_s: float) -> dict:
        """Client-side figures. ``slo_violations``: answered (200) after the SLO."""
        ok = np.array([o.latency_s for o in self.outcomes if o.kind == "ok"], dtype=float)
        shed = [o for o in self.outcomes if o.kind == "shed"]
        errors = [o for o in self.outcomes if o.kind == "error"]
        lat = ok if ok.size else np.zeros(1)
        out = {
            "requests": len(self.outcomes),
            "ok": int(ok.size),
            "shed": len(shed),
            "errors": len(errors),
            "p50_ms": float(np.percentile(lat, 50) * 1e3),
            "p99_ms": float(np.percentile(lat, 99) * 1e3),
            "max_ms": float(lat.max() * 1e3),
            "slo_violations": int((ok > slo_s).sum()),
            "shed_with_retry_after": sum(1 for o in shed if o.retry_after),
            "late_sends": self.late_sends,
        }
        if shed:
            out["shed_p50_ms"] = float(np.percentile([o.latency_s for o in shed], 50) * 1e3)
        if errors:
            out["error_examples"] = sorted({f"{o.status}: {o.error}"[:160] for o in errors})[:3]
        return out


def _request_bytes(host: str, port: int, path: str, body: bytes) -> bytes:
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    )
    return head.encode() + body


async def _send(host: str, port: int, payload: bytes, timeout_s: float) -> tuple[int, dict, bytes]:
    reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout_s)
    try:
        writer.write(payload)
        await writer.drain()
        raw = await asyncio.wait_for(reader.read(-1), timeout_s)  # until the server closes
    finally:
        writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1]) if lines and len(lines[0].split()) > 1 else 0
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    return status, headers, body


def run_open_loop(
    url: str,
    model: str,
    due_s: np.ndarray,
    targets: np.ndarray,
    *,
    timeout_s: float = 30.0,
    max_in_flight: int = 2048,
) -> LoadResult:
    """Send ``vertex_request(targets[i])`` at ``due_s[i]`` seconds from now; wait
    for every answer. Beyond ``max_in_flight`` open requests the sender waits
    (counted in ``late_sends`` if that makes it late)."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    path = f"/v2/models/{model}/infer"
    payloads = [
        _request_bytes(host, port, path, json.dumps(vertex_request(t, f"r{i}")).encode())
        for i, t in enumerate(np.asarray(targets))
    ]
    result = LoadResult()

    async def one(i: int, due: float, sem: asyncio.Semaphore) -> None:
        t0 = time.perf_counter()
        try:
            status, headers, body = await _send(host, port, payloads[i], timeout_s)
        except (OSError, asyncio.TimeoutError, ValueError, IndexError) as exc:
            dt = time.perf_counter() - t0
            result.outcomes.append(Outcome(due, dt, 0, "error", error=type(exc).__name__))
            return
        finally:
            sem.release()
        dt = time.perf_counter() - t0
        if status == 200:
            result.outcomes.append(Outcome(due, dt, status, "ok"))
        elif status == 503 and "retry-after" in headers:
            result.outcomes.append(Outcome(due, dt, status, "shed", headers["retry-after"]))
        else:
            result.outcomes.append(
                Outcome(due, dt, status, "error", error=body[:120].decode("utf-8", "replace"))
            )

    async def main() -> None:
        sem = asyncio.Semaphore(max_in_flight)
        tasks = []
        start = time.perf_counter()
        for i, due in enumerate(np.asarray(due_s, dtype=float)):
            delay = start + due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            await sem.acquire()
            if time.perf_counter() - (start + due) > 0.010:
                result.late_sends += 1
            tasks.append(asyncio.ensure_future(one(i, float(due), sem)))
        if tasks:
            await asyncio.gather(*tasks)

    asyncio.run(main())
    return result


def poisson_arrivals(rate: float, duration_s: float, seed: int = 0) -> np.ndarray:
    """Arrival times of a Poisson process of ``rate`` per second over ``duration_s``."""
    if rate <= 0 or duration_s <= 0:
        return np.zeros(0)
    rng = np.random.default_rng(seed)
    n = rng.poisson(rate * duration_s)
    return np.sort(rng.uniform(0.0, duration_s, n))
