"""Open-loop replay of a request stream against a gateway over HTTP.

Requests are sent at their arrival times whatever the previous ones are doing
(an open loop, as real users behave), from a bounded pool of sender threads.
Each result keeps the client-side latency and the parameters the gateway
reported (sharing degree, aggregated rows, buffer wait).
"""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import requests


@dataclass
class ReplayResult:
    sent: int = 0
    ok: int = 0
    errors: int = 0
    latencies_s: list[float] = field(default_factory=list)
    parameters: list[dict] = field(default_factory=list)
    error_messages: list[str] = field(default_factory=list)
    first_sent: float = 0.0
    last_done: float = 0.0

    def summary(self, slo_s: float) -> dict:
        lat = np.asarray(self.latencies_s) if self.latencies_s else np.zeros(1)
        return {
            "requests": self.sent,
            "ok": self.ok,
            "errors": self.errors,
            "p50_ms": float(np.percentile(lat, 50) * 1e3),
            "p99_ms": float(np.percentile(lat, 99) * 1e3),
            "max_ms": float(lat.max() * 1e3),
            "slo_violations": int((lat > slo_s).sum()) + self.errors,
        }


def vertex_request(targets, request_id: str | None = None) -> dict:
    targets = [int(t) for t in np.atleast_1d(targets)]
    body = {
        "inputs": [
            {"name": "targets", "datatype": "INT64", "shape": [len(targets)], "data": targets}
        ]
    }
    if request_id is not None:
        body["id"] = request_id
    return body


def replay(
    url: str,
    model: str,
    arrivals_s: np.ndarray,
    targets: np.ndarray,
    *,
    max_senders: int = 64,
    timeout_s: float = 30.0,
) -> ReplayResult:
    """Send ``vertex_request(targets[i])`` at ``arrivals_s[i]`` seconds from now."""
    result = ReplayResult()
    lock = threading.Lock()
    session = requests.Session()
    adapter = requests.adapters.HTTPAdapter(pool_connections=4, pool_maxsize=max_senders)
    session.mount("http://", adapter)
    endpoint = f"{url.rstrip('/')}/v2/models/{model}/infer"

    def send(i: int) -> None:
        t0 = time.perf_counter()
        try:
            r = session.post(
                endpoint,
                data=json.dumps(vertex_request(targets[i], f"r{i}")),
                headers={"Content-Type": "application/json"},
                timeout=timeout_s,
            )
            dt = time.perf_counter() - t0
            with lock:
                result.last_done = max(result.last_done, time.time())
                if r.status_code == 200:
                    result.ok += 1
                    result.latencies_s.append(dt)
                    result.parameters.append(r.json().get("parameters", {}))
                else:
                    result.errors += 1
                    result.error_messages.append(f"{r.status_code}: {r.text[:200]}")
        except requests.RequestException as exc:
            with lock:
                result.errors += 1
                result.error_messages.append(str(exc)[:200])
                result.last_done = max(result.last_done, time.time())

    start = time.perf_counter()
    result.first_sent = time.time()
    with ThreadPoolExecutor(max_workers=max_senders) as pool:
        for i, at in enumerate(arrivals_s):
            delay = start + float(at) - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            pool.submit(send, i)
            result.sent += 1
    session.close()
    return result
