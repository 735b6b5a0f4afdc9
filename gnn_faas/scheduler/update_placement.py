"""CPU or GPU for a buffer's Update, by a size threshold calibrated from latencies.

Quiver places each batch's work on the CPU or the GPU by its predicted size
(PSGS): small batches do not repay the transfer and launch overheads of the
GPU. Here, from measured ``(rows, seconds)`` of Update on each device, a line
``seconds = a_d + b_d * rows`` is fitted per device (least squares) and the
threshold is where they cross::

    rows* = (a_gpu - a_cpu) / (b_cpu - b_gpu)     (inf when the GPU is never faster per row)

A buffer whose predicted size (``Σ PSGS`` of its targets, before any fetch,
or its merged rows once known) reaches ``rows*`` runs on the GPU pool.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gnn_faas.errors import InvalidRequest


@dataclass(frozen=True)
class LatencyLine:
    intercept: float
    slope: float

    @classmethod
    def fit(cls, samples: Sequence[tuple[float, float]]) -> LatencyLine:
        arr = np.asarray(samples, dtype=np.float64).reshape(-1, 2)
        if arr.shape[0] < 2 or np.unique(arr[:, 0]).size < 2:
            raise InvalidRequest("calibration needs latencies at two or more sizes per device")
        slope, intercept = np.polyfit(arr[:, 0], arr[:, 1], 1)
        return cls(float(intercept), float(slope))

    def seconds(self, rows: float) -> float:
        return self.intercept + self.slope * rows


@dataclass(frozen=True)
class UpdatePlacement:
    cpu: LatencyLine
    gpu: LatencyLine

    @classmethod
    def calibrate(
        cls, cpu: Sequence[tuple[float, float]], gpu: Sequence[tuple[float, float]]
    ) -> UpdatePlacement:
        """From measured ``(rows, seconds)`` on each device."""
        return cls(LatencyLine.fit(cpu), LatencyLine.fit(gpu))

    @property
    def threshold_rows(self) -> float:
        """Smallest size at which the GPU is predicted faster (``inf``: never)."""
        gain = self.cpu.slope - self.gpu.slope
        if gain <= 0:
            return 0.0 if self.gpu.intercept <= self.cpu.intercept else math.inf
        return max(0.0, (self.gpu.intercept - self.cpu.intercept) / gain)

    def choose(self, predicted_rows: float) -> str:
        return "cuda" if predicted_rows >= self.threshold_rows else "cpu"

    def to_json(self) -> str:
        return json.dumps(
            {"cpu": self.cpu.__dict__, "gpu": self.gpu.__dict__, "threshold": self.threshold_rows}
        )

    @classmethod
    def from_json(cls, text: str) -> UpdatePlacement:
        d = json.loads(text)
        return cls(LatencyLine(**d["cpu"]), LatencyLine(**d["gpu"]))
