"""Open-loop replay of a request stream against a gateway over HTTP.

Requests are sent at their arrival times whatever the previous ones are doing
(an open loop, as real users behave) by the shared sender
:func:`gnn_faas.traces.open_loop.send_open_loop` (at most ``max_senders``
requests in flight; when all are busy the next send is late, and its recorded
``send`` time shows by how much). Each request keeps
its scheduled arrival, actual send time, client-side latency, HTTP status and
what the gateway reported (buffer wait, sharing degree, execution id). A
:class:`StatusSampler` polls ``/v1/status`` once a second for the timeline
(instances per function, allocated and busy GB); a request "met a cold start"
when an instance of its model was starting while it was in flight.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field, replace

import numpy as np

from gnn_faas.client import GatewayClient, vertex_request
from gnn_faas.errors import GnnFaasError
from gnn_faas.traces.open_loop import Sent, send_open_loop


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
    # per request, in arrival order (seconds from the replay's start)
    arrival: np.ndarray = field(default_factory=lambda: np.zeros(0))
    send: np.ndarray = field(default_factory=lambda: np.zeros(0))
    latency: np.ndarray = field(default_factory=lambda: np.zeros(0))
    status: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    buffer_wait: np.ndarray = field(default_factory=lambda: np.zeros(0))
    sharing: np.ndarray = field(default_factory=lambda: np.zeros(0))
    execution: list[str] = field(default_factory=list)
    # seconds the request's execution held memory / compute instances (reported)
    aggregate: np.ndarray = field(default_factory=lambda: np.zeros(0))
    update: np.ndarray = field(default_factory=lambda: np.zeros(0))
    start_monotonic: float = 0.0

    def after(self, t0: float) -> ReplayResult:
        """The requests that arrived at or after ``t0`` (the end of a warm-up),
        with times shifted so ``t0`` is 0 (``start_monotonic`` moves with them)."""
        if t0 <= 0:
            return self
        m = self.arrival >= t0
        ok = m & (self.status == 200)
        return replace(
            self,
            sent=int(m.sum()),
            ok=int(ok.sum()),
            errors=int(m.sum() - ok.sum()),
            latencies_s=self.latency[ok].tolist(),
            # answered requests' parameters are kept in answer order: not per arrival
            parameters=[],
            arrival=self.arrival[m] - t0,
            send=self.send[m] - t0,
            latency=self.latency[m],
            status=self.status[m],
            buffer_wait=self.buffer_wait[m],
            sharing=self.sharing[m],
            aggregate=self.aggregate[m],
            update=self.update[m],
            execution=[e for e, k in zip(self.execution, m, strict=True) if k],
            start_monotonic=self.start_monotonic + t0,
        )

    @property
    def last_answer_s(self) -> float:
        """Seconds from the replay's start to its last answer (0 without requests):
        the end of a metering window that starts with the first send."""
        return float(np.nanmax(self.send + self.latency)) if self.send.size else 0.0

    def summary(self, slo_s: float) -> dict:
        lat = np.asarray(self.latencies_s) if self.latencies_s else np.zeros(1)
        return {
            "requests": self.sent,
            "ok": self.ok,
            "errors": self.errors,
            "p50_ms": float(np.percentile(lat, 50) * 1e3),
            "p99_ms": float(np.percentile(lat, 99) * 1e3),
            "mean_ms": float(lat.mean() * 1e3),
            "max_ms": float(lat.max() * 1e3),
            "slo_violations": int((lat > slo_s).sum()) + self.errors,
        }


def replay(
    url: str,
    model: str,
    arrivals_s: np.ndarray,
    targets: np.ndarray,
    *,
    max_senders: int = 64,
    timeout_s: float = 30.0,
    progress: bool = False,
) -> ReplayResult:
    """Send ``vertex_request(targets[i])`` at ``arrivals_s[i]`` seconds from now."""
    n = len(arrivals_s)
    result = ReplayResult(
        arrival=np.asarray(arrivals_s, dtype=np.float64).copy(),
        send=np.full(n, np.nan),
        latency=np.full(n, np.nan),
        status=np.zeros(n, np.int64),
        buffer_wait=np.full(n, np.nan),
        sharing=np.full(n, np.nan),
        execution=[""] * n,
        aggregate=np.full(n, np.nan),
        update=np.full(n, np.nan),
    )
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=n, desc="replay", unit="req", leave=False)
    bodies = [json.dumps(vertex_request(targets[i], f"r{i}")).encode() for i in range(n)]
    try:
        sent = send_open_loop(
            url.rstrip("/"),
            f"/v2/models/{model}/infer",
            result.arrival,
            bodies,
            timeout_s=timeout_s,
            max_in_flight=max_senders,
            keep_answers=True,
            on_answer=None if bar is None else lambda: bar.update(1),
        )
    finally:
        if bar is not None:
            bar.close()
    _record(result, sent)
    return result


def _record(result: ReplayResult, sent: Sent) -> None:
    """The sender's answers into ``result``: per request its send time, latency
    and status; for a 200 the gateway's parameters (``parameters`` in answer
    order), otherwise the error's message."""
    result.sent = int(sent.send.size)
    result.send[:] = sent.send
    result.latency[:] = sent.latency
    result.start_monotonic = sent.start_monotonic
    result.first_sent, result.last_done = sent.first_sent, sent.last_done
    for i in sent.done_order:
        status = int(sent.status[i])
        if sent.error[i]:
            result.errors += 1
            result.error_messages.append(sent.error[i])
            continue
        if status != 200:
            result.status[i] = status
            result.errors += 1
            text = sent.body[i].decode("utf-8", "replace")
            result.error_messages.append(f"{status}: {text}")
            continue
        try:
            params = json.loads(sent.body[i]).get("parameters", {})
        except (ValueError, AttributeError) as exc:
            result.errors += 1
            result.error_messages.append(f"invalid answer: {exc}"[:200])
            continue
        result.status[i] = status
        result.ok += 1
        result.latencies_s.append(float(sent.latency[i]))
        result.parameters.append(params)
        result.buffer_wait[i] = params.get("buffer_wait_ms", np.nan) / 1e3
        result.sharing[i] = params.get("sharing_degree", 0.0)
        result.execution[i] = str(params.get("execution", ""))
        result.aggregate[i] = params.get("aggregate_ms", np.nan) / 1e3
        result.update[i] = params.get("update_ms", np.nan) / 1e3


class StatusSampler:
    """Polls ``/v1/status`` every ``interval_s`` in a thread: per sample the time
    (seconds from ``origin``, a :func:`time.monotonic` value), instances per
    function and state, allocated and busy GB. A poll without a 200 answer is
    no sample (the previous one holds) and is counted in ``failed``."""

    def __init__(self, url: str, origin: float, interval_s: float = 1.0):
        self.url = url.rstrip("/")
        self.origin = origin
        self.interval_s = interval_s
        self.samples: list[dict] = []
        self.failed = 0  # polls that gave no sample (no answer, or an error answer)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="status-sampler", daemon=True)

    def __enter__(self) -> StatusSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        gateway = GatewayClient(self.url, timeout_s=5)
        while not self._stop.is_set():
            t = time.monotonic() - self.origin
            try:
                st = gateway.status()
            except (GnnFaasError, ValueError):
                st = None  # an error answer is no sample (its body lists no instances)
            if st is None:
                self.failed += 1
            if st is not None:
                per_fn: dict[str, int] = {}
                alloc = busy = 0.0
                starting = 0
                for inst in st.get("instances", []):
                    if inst.get("state") in ("stopped", "failed"):
                        continue
                    name = inst["spec"]["name"]
                    gb = inst["spec"]["memory_mb"] / 1024.0
                    per_fn[name] = per_fn.get(name, 0) + 1
                    alloc += gb
                    busy += gb if inst.get("state") == "busy" else 0.0
                    starting += inst.get("state") == "starting"
                self.samples.append(
                    {"t": t, "instances": per_fn, "allocated_gb": alloc, "busy_gb": busy,
                     "starting": starting}
                )  # fmt: skip
            self._stop.wait(self.interval_s)
        gateway.close()


class UpdateSender:
    """Sends batches of added edges to ``POST /v2/graphs/{graph}/updates``
    (JSON ``{"add_edges": [[u, v], ...]}``, ``Authorization: Bearer TOKEN``)
    at their due times, seconds from when it starts, in a thread: one batch at
    a time, as one writer would (a batch whose predecessor is still
    unanswered at its due time goes late, and its send time shows by how
    much). Per batch: due, send time, ack latency, HTTP status, the version
    that holds it."""

    def __init__(self, url: str, graph: str, batches: list[tuple[float, np.ndarray]],
                 token: str, timeout_s: float = 30.0):  # fmt: skip
        self.url = f"{url.rstrip('/')}/v2/graphs/{graph}/updates"
        self.batches = batches
        self.headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        self.timeout_s = timeout_s
        n = len(batches)
        self.due = np.asarray([d for d, _ in batches], dtype=np.float64)
        self.send = np.full(n, np.nan)
        self.latency = np.full(n, np.nan)
        self.status = np.zeros(n, np.int64)
        self.version = np.full(n, -1, np.int64)
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="update-sender", daemon=True)

    def __enter__(self) -> UpdateSender:
        self.start = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if exc[0] is not None:
            self._stop.set()  # the replay failed: send nothing more
        self._thread.join()

    def _run(self) -> None:
        import requests

        with requests.Session() as session:
            for k, (due, edges) in enumerate(self.batches):
                if self._stop.wait(max(0.0, self.start + due - time.monotonic())):
                    return
                body = json.dumps({"add_edges": edges.tolist()}).encode()
                t0 = time.monotonic()
                self.send[k] = t0 - self.start
                try:
                    r = session.post(self.url, data=body, headers=self.headers,
                                     timeout=self.timeout_s)  # fmt: skip
                except requests.RequestException as exc:
                    self.errors.append(f"batch {k}: {exc}"[:200])
                    continue
                self.latency[k] = time.monotonic() - t0
                self.status[k] = r.status_code
                if r.status_code == 200:
                    self.version[k] = int(r.json().get("version", -1))
                else:
                    self.errors.append(f"batch {k}: {r.status_code} {r.text[:200]}")

    def summary(self) -> dict:
        """Acks and their latency, the versions, how late the sends went."""
        ok = self.status == 200
        lat = self.latency[ok] * 1e3
        q = np.percentile(lat, [50, 99]) if lat.size else np.full(2, np.nan)
        edges = sum(int(e.shape[0]) for (_, e), k in zip(self.batches, ok, strict=True) if k)
        sent = np.isfinite(self.send)
        return {
            "batches": len(self.batches),
            "sent": int(sent.sum()),
            "acked": int(ok.sum()),
            "errors": int(len(self.batches) - ok.sum()),
            "edges_acked": edges,
            "ack_p50_ms": float(q[0]) if lat.size else None,
            "ack_p99_ms": float(q[1]) if lat.size else None,
            "ack_mean_ms": float(lat.mean()) if lat.size else None,
            "first_version": int(self.version[ok][0]) if ok.any() else None,
            "last_version": int(self.version[ok][-1]) if ok.any() else None,
            "max_send_lag_s": float(np.max(self.send[sent] - self.due[sent]))
            if sent.any()
            else 0.0,
            "error_examples": self.errors[:3],
        }
