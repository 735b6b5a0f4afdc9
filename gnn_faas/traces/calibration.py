"""Calibration profile: the measured figures the simulator's policies run on.

Nothing in :mod:`gnn_faas.traces.simulator` is a typed-in service time, cold
start or memory size: it all comes from a profile measured on the real system
by ``gnn-faas simulate calibrate`` (:func:`gnn_faas.traces.measure_calibration.calibrate`),
which brings the bundle up with ``gnn-faas up`` and records:

- ``execution``: seconds from a buffer's close to its requests' answers, against
  the rows it aggregates (the union of its requests' k-hop sets), from the
  gateway's own per-request figures (latency minus buffer wait) of single
  requests and of bursts that share buffers; fitted ``T(rows) = a + b·rows``
  (least squares, ``a, b >= 0``);
- ``memory_share``: the share of an execution's instance time spent in the
  memory function's calls (Aggregate) rather than the compute function's
  (Update), the median over executions of ``aggregate_ms / (aggregate_ms +
  update_ms)`` the gateway reports per request. With it the simulator runs
  memory and compute as two pools that scale on their own, as the gateway
  does; a profile without it (older files) runs memory+compute pairs;
- ``cold_start_s``: measured spawn-to-ready seconds of memory and compute
  function instances (the platform's metering);
- ``memory_function_mb``, ``compute_function_mb``, vCPUs, keep-alive and the
  instance caps of the deployment measured;
- ``runtime_mb``: resident memory of a warm memory function instance (what a
  function needs before it holds any graph data);
- ``row_bytes``: bytes a request holds per row of its computation graph
  (feature row plus CSR entries, from the graph's manifest);
- ``graph_mb`` and ``full_fetch_s``: the whole graph's bytes and the measured
  time to download all of it from the store (DGL-serverless and serverful
  instances load it at start-up).

The file is JSON; ``gnn_faas/data/calibration_<graph>.json`` ships one
measured for Bitcoin OTC (regenerate with the command in its ``meta.command``).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

from gnn_faas.errors import InvalidRequest, NotFound
from gnn_faas.paths import BUNDLED_DATA

FORMAT = "gnn-faas-calibration"
VERSION = 1


@dataclass(frozen=True)
class Calibration:
    graph: str
    hops: int
    slo_s: float
    exec_intercept_s: float
    exec_per_row_s: float
    cold_start_memory_s: float
    cold_start_compute_s: float
    memory_function_mb: float
    compute_function_mb: float
    memory_vcpus: float
    compute_vcpus: float
    keep_alive_s: float
    max_instances: int
    min_instances: int
    runtime_mb: float
    row_bytes: float
    graph_mb: float
    full_fetch_s: float
    memory_share: float | None = None
    # per-hop fanouts the executions were measured with (None: full neighbourhoods)
    fanouts: tuple[int, ...] | None = None
    samples: tuple[tuple[int, float], ...] = ()
    meta: dict = field(default_factory=dict)

    def exec_s(self, rows: np.ndarray | float, seed: int | None = None) -> np.ndarray:
        """``T(rows) = a + b·rows`` seconds; with ``seed``, each one times a ratio
        drawn from the measured samples' ``seconds / T(rows)`` (so simulated
        executions vary as the measured ones did, tails included)."""
        t = self.exec_intercept_s + self.exec_per_row_s * np.asarray(rows, dtype=np.float64)
        if seed is None or not self.samples:
            return t
        ratios = self.residual_ratios()
        draw = np.random.default_rng(seed).integers(0, ratios.size, np.shape(t))
        return t * ratios[draw]

    def residual_ratios(self) -> np.ndarray:
        r, secs = np.asarray(self.samples, dtype=np.float64).T
        fit = self.exec_intercept_s + self.exec_per_row_s * r
        return secs / np.maximum(fit, 1e-9)

    @property
    def cold_start_s(self) -> float:
        """A memory and a compute instance launch in parallel: the slower one counts."""
        return max(self.cold_start_memory_s, self.cold_start_compute_s)

    @property
    def pair_mb(self) -> float:
        return self.memory_function_mb + self.compute_function_mb

    @property
    def pair_vcpus(self) -> float:
        return self.memory_vcpus + self.compute_vcpus

    def request_mb(self, rows: np.ndarray | float) -> np.ndarray:
        """Memory of a function sized for one request of ``rows`` rows."""
        return self.runtime_mb + np.asarray(rows, dtype=np.float64) * self.row_bytes / 2**20

    @property
    def full_graph_mb(self) -> float:
        """A function holding the whole graph (DGL-serverless, serverful)."""
        return self.runtime_mb + self.graph_mb

    def refit(
        self, samples: list[tuple[int, float]], memory_share: float | None, source: str
    ) -> Calibration:
        """This profile with its execution-time fit (and memory share, when
        given) measured again on ``samples`` of ``(union rows, seconds)``;
        cold starts, sizes and memory stay as measured."""
        a, b = fit_linear(*np.asarray(samples, dtype=np.float64).T)
        share = self.memory_share if memory_share is None else memory_share
        return replace(
            self, exec_intercept_s=a, exec_per_row_s=b, memory_share=share,
            samples=tuple((int(r), float(t)) for r, t in samples),
            meta={**self.meta, "refit": source, "refit_executions": len(samples)},
        )  # fmt: skip

    # -- files -----------------------------------------------------------------
    def to_dict(self) -> dict:
        d = asdict(self)
        d["samples"] = [list(s) for s in self.samples]
        return {"format": FORMAT, "version": VERSION, **d}

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1, sort_keys=True) + "\n")

    @classmethod
    def from_dict(cls, d: dict, source: str = "calibration") -> Calibration:
        if d.get("format") != FORMAT or d.get("version") != VERSION:
            raise InvalidRequest(f"{source}: not a {FORMAT} v{VERSION} file")
        names = set(cls.__dataclass_fields__)
        optional = ("samples", "meta", "memory_share", "fanouts")
        missing = sorted(n for n in names if n not in d and n not in optional)
        if missing:
            raise InvalidRequest(f"{source}: missing field(s) {missing}")
        kw = {k: v for k, v in d.items() if k in names}
        kw["samples"] = tuple((int(r), float(s)) for r, s in kw.get("samples", ()))
        fanouts = kw.get("fanouts")
        if fanouts is not None:
            if not isinstance(fanouts, list | tuple) or len(fanouts) != kw.get("hops"):
                raise InvalidRequest(f"{source}: fanouts must list one integer per hop")
            kw["fanouts"] = tuple(int(f) for f in fanouts)
        cal = cls(**kw)
        if min(cal.exec_intercept_s, cal.exec_per_row_s, cal.cold_start_s, cal.runtime_mb) < 0:
            raise InvalidRequest(f"{source}: negative figures")
        if cal.memory_share is not None and not 0.0 < cal.memory_share < 1.0:
            raise InvalidRequest(f"{source}: memory_share must lie in (0, 1)")
        return cal

    @classmethod
    def load(cls, path: str | Path) -> Calibration:
        p = Path(path)
        if not p.is_file():
            raise NotFound(f"calibration profile not found: {p}")
        try:
            return cls.from_dict(json.loads(p.read_text()), str(p))
        except json.JSONDecodeError as exc:
            raise InvalidRequest(f"{p}: not JSON ({exc})") from None

    @classmethod
    def bundled(cls, graph: str) -> Calibration:
        p = BUNDLED_DATA / f"calibration_{graph}.json"
        if not p.is_file():
            raise NotFound(
                f"no bundled calibration for graph {graph!r}: run "
                f"`gnn-faas simulate calibrate --graph {graph} --out FILE` and pass --calibration FILE"
            )
        return cls.load(p)


def fit_linear(rows: np.ndarray, seconds: np.ndarray) -> tuple[float, float]:
    """Least-squares ``seconds ≈ a + b·rows`` with ``a, b >= 0``."""
    x = np.asarray(rows, dtype=np.float64)
    y = np.asarray(seconds, dtype=np.float64)
    if x.size < 2 or np.ptp(x) == 0:
        return float(max(np.median(y), 0.0)), 0.0
    b, a = np.polyfit(x, y, 1)
    if b < 0:
        return float(max(np.mean(y), 0.0)), 0.0
    if a < 0:
        return 0.0, float(np.sum(x * y) / np.sum(x * x))
    return float(a), float(b)
