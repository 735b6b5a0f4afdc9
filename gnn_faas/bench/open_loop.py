"""The open-loop load of the overload, soak and slow-client benchmarks.

Requests go out at their scheduled times whatever the earlier ones are doing,
through the shared sender :func:`gnn_faas.traces.open_loop.send_open_loop`
(asyncio over raw HTTP/1.1; why is in its docstring). Each answer is
classified: ``ok`` (200), ``shed`` (503 with ``Retry-After``: admission
control), ``error`` (anything else, or a failed connection).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np

from gnn_faas.client import vertex_request
from gnn_faas.traces.open_loop import send_open_loop


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
    due = np.asarray(due_s, dtype=float)
    bodies = [
        json.dumps(vertex_request(t, f"r{i}")).encode() for i, t in enumerate(np.asarray(targets))
    ]
    sent = send_open_loop(
        url,
        f"/v2/models/{model}/infer",
        due,
        bodies,
        timeout_s=timeout_s,
        max_in_flight=max_in_flight,
    )
    result = LoadResult(late_sends=sent.late_sends)
    for i in sent.done_order:  # in answer order, as they came
        due_i, dt, status = float(due[i]), float(sent.latency[i]), int(sent.status[i])
        if sent.error[i]:
            result.outcomes.append(
                Outcome(due_i, dt, 0, "error", error=sent.error[i].split(":")[0])
            )
        elif status == 200:
            result.outcomes.append(Outcome(due_i, dt, status, "ok"))
        elif status == 503 and sent.retry_after[i] is not None:
            result.outcomes.append(Outcome(due_i, dt, status, "shed", sent.retry_after[i]))
        else:
            error = sent.body[i][:120].decode("utf-8", "replace")
            result.outcomes.append(Outcome(due_i, dt, status, "error", error=error))
    return result


def poisson_arrivals(rate: float, duration_s: float, seed: int = 0) -> np.ndarray:
    """Arrival times of a Poisson process of ``rate`` per second over ``duration_s``."""
    if rate <= 0 or duration_s <= 0:
        return np.zeros(0)
    rng = np.random.default_rng(seed)
    n = rng.poisson(rate * duration_s)
    return np.sort(rng.uniform(0.0, duration_s, n))
