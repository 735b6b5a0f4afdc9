"""Profiled stage latencies ``T(stage, cores, rows)`` for function sizing.

Stages are the pieces of a plan that run on one function each, named by the
caller (e.g. ``"aggregate/1"``: memory function Aggregate of layer 1,
``"update/1"``: compute function Update of layer 1). A profile holds measured
seconds per ``(stage, cores, rows)`` (the median of the samples) and answers
any ``(cores, rows)``:

- in rows, linearly between measured sizes; below the smallest, the smallest's
  latency (fixed overheads dominate small inputs); above the largest, linear
  extrapolation along the last segment (never below the largest's latency);
- in cores, linearly in ``1/c`` between measured core counts (Amdahl's law
  ``T(c) = T1·(s + (1 - s)/c)`` is linear in ``1/c``); below the fewest cores,
  extrapolated the same way; above the most, the most's latency (speedup is
  assumed to saturate, which errs on the slow side).

Profiles are JSON (no pickle): ``{"format": "gnn-faas-latency-profile",
"version": 1, "stages": {stage: [{"cores", "rows", "seconds": [...]}]}}``.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from gnn_faas.errors import InvalidRequest, NotFound

FORMAT = "gnn-faas-latency-profile"
VERSION = 1


@dataclass
class LatencyProfile:
    """``samples[stage][cores][rows]``: measured seconds."""

    samples: dict[str, dict[float, dict[int, list[float]]]] = field(default_factory=dict)

    # -- building ------------------------------------------------------------
    def add(self, stage: str, cores: float, rows: int, seconds: float) -> None:
        if cores <= 0 or rows < 0 or not seconds >= 0:
            raise InvalidRequest(f"bad sample {stage!r}: cores={cores} rows={rows} s={seconds}")
        by_rows = self.samples.setdefault(stage, {}).setdefault(float(cores), {})
        by_rows.setdefault(int(rows), []).append(float(seconds))

    # -- queries -------------------------------------------------------------
    def stages(self) -> list[str]:
        return sorted(self.samples)

    def cores(self, stage: str) -> list[float]:
        return sorted(self._stage(stage))

    def rows(self, stage: str, cores: float) -> list[int]:
        return sorted(self._stage(stage)[float(cores)])

    def _stage(self, stage: str) -> dict[float, dict[int, list[float]]]:
        try:
            return self.samples[stage]
        except KeyError:
            raise NotFound(f"no latency profile for stage {stage!r}") from None

    def _at_cores(self, stage: str, cores: float, rows: float) -> float:
        table = self._stage(stage)[cores]
        xs = np.array(sorted(table), dtype=np.float64)
        ys = np.array([statistics.median(table[int(x)]) for x in xs])
        if rows <= xs[-1] or xs.size == 1:
            if rows > xs[-1]:  # one measured size: scale proportionally
                return float(ys[-1] * rows / xs[-1]) if xs[-1] > 0 else float(ys[-1])
            return float(np.interp(rows, xs, ys))
        slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
        return float(max(ys[-1], ys[-1] + slope * (rows - xs[-1])))

    def latency(self, stage: str, cores: float, rows: float) -> float:
        """Seconds ``stage`` takes on ``cores`` cores for ``rows`` rows."""
        measured = self.cores(stage)
        if cores <= 0:
            raise InvalidRequest(f"cores must be positive, got {cores}")
        if cores >= measured[-1]:
            return self._at_cores(stage, measured[-1], rows)
        if cores in measured:
            return self._at_cores(stage, cores, rows)
        if len(measured) == 1:
            # Nothing to interpolate with: assume perfect scaling below (Amdahl, s = 0).
            return self._at_cores(stage, measured[0], rows) * measured[0] / cores
        i = int(np.searchsorted(measured, cores))
        lo, hi = (0, 1) if i == 0 else (i - 1, i)
        c0, c1 = measured[lo], measured[hi]
        t0, t1 = self._at_cores(stage, c0, rows), self._at_cores(stage, c1, rows)
        w = (1 / cores - 1 / c0) / (1 / c1 - 1 / c0)
        t = t0 + w * (t1 - t0)
        return float(max(t, t0) if i == 0 else t)

    # -- JSON ----------------------------------------------------------------
    def to_dict(self) -> dict:
        stages = {
            stage: [
                {"cores": c, "rows": r, "seconds": list(s)}
                for c in sorted(by_cores)
                for r, s in sorted(by_cores[c].items())
            ]
            for stage, by_cores in sorted(self.samples.items())
        }
        return {"format": FORMAT, "version": VERSION, "stages": stages}

    @classmethod
    def from_dict(cls, data: Mapping) -> LatencyProfile:
        if data.get("format") != FORMAT or data.get("version") != VERSION:
            raise InvalidRequest(f"not a {FORMAT} v{VERSION} document")
        profile = cls()
        try:
            for stage, entries in data["stages"].items():
                for e in entries:
                    for s in e["seconds"]:
                        profile.add(stage, float(e["cores"]), int(e["rows"]), float(s))
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidRequest(f"malformed latency profile: {exc}") from None
        return profile

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1))

    @classmethod
    def load(cls, path: str | Path) -> LatencyProfile:
        try:
            text = Path(path).read_text()
        except FileNotFoundError:
            raise NotFound(f"latency profile not found: {path}") from None
        try:
            return cls.from_dict(json.loads(text))
        except json.JSONDecodeError as exc:
            raise InvalidRequest(f"latency profile {path} is not JSON: {exc}") from None


def record_profile(
    stages: Mapping[str, Callable[[float, int], float | None]],
    cores: Sequence[float],
    rows: Sequence[int],
    *,
    repeats: int = 3,
    warmup: int = 1,
    timer: Callable[[], float] = time.perf_counter,
    profile: LatencyProfile | None = None,
) -> LatencyProfile:
    """Measure ``stages[name](cores, rows)`` for every core count and size.

    Each callable runs one real call of its stage with that many cores (e.g.
    through a function instance launched with ``vcpus=cores``) on ``rows``
    rows. If it returns a number, that is taken as the stage's own measured
    seconds (server-side timing, excluding transport); otherwise the wall time
    around the call is recorded. ``warmup`` calls per setting are discarded.
    """
    profile = profile if profile is not None else LatencyProfile()
    for name, call in stages.items():
        for c in cores:
            for r in rows:
                for _ in range(warmup):
                    call(c, r)
                for _ in range(repeats):
                    t0 = timer()
                    reported = call(c, r)
                    elapsed = timer() - t0
                    profile.add(name, c, r, elapsed if reported is None else float(reported))
    return profile


def amdahl_profile(
    stages: Mapping[str, tuple[float, float, float]],
    cores: Sequence[float],
    rows: Sequence[int],
) -> LatencyProfile:
    """A synthetic profile for simulations and tests: stage ``(overhead_s,
    seconds_per_row_1core, serial_fraction s)`` gives
    ``T(c, n) = overhead + n·t_row·(s + (1 - s)/c)``."""
    profile = LatencyProfile()
    for name, (overhead, per_row, serial) in stages.items():
        for c in cores:
            for r in rows:
                profile.add(name, c, r, overhead + r * per_row * (serial + (1 - serial) / c))
    return profile
