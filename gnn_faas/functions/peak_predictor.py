"""Peak memory of a memory-function request, predicted by a small MLP (FaaS-GNN 4.3).

The feature cache sizes itself as ``limit - baseline - predicted peak of the
request in flight``, so the prediction must come before the request runs, from
what is known then: the shape of the layer (block) it aggregates,
``num_dst``, ``num_src``, ``num_edges`` and the row width, plus the kind of
work (the aggregate op, or a plain feature read).

Model: a 2-layer MLP (16 hidden ReLU units) on standardised log-features
``log1p([n_dst, n_src, n_edges, width, n_src*width, n_dst*width,
n_edges*width, n_src*width*loads])``, ``loads`` (whether the source rows are
read from the store, through the cache, rather than shipped in the request:
ranged reads allocate far more than the rows) and a one-hot of the op; it predicts the
standardised ``log(peak bytes)`` (log space makes the error relative, which is
what a capacity margin needs). It is fitted with scikit-learn by
:mod:`gnn_faas.functions.profiler` and stored as JSON (weights plus the input
and output scaling), so serving needs numpy only: no sklearn, no torch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gnn_faas.errors import InvalidRequest

FORMAT = "gnn-faas-peak-predictor"
# one input per op: their working sets differ (gin/gcn add a self term, gcn
# edge weights, max and gat per-edge rows); "features" is a plain row read
OP_CLASSES = ("sum", "mean", "gcn", "gin", "max", "gat", "features")
NUM_FEATURES = 9 + len(OP_CLASSES)


def op_class(op: str) -> int:
    try:
        return OP_CLASSES.index(op)
    except ValueError:
        raise InvalidRequest(f"no peak model for op {op!r}") from None


@dataclass(frozen=True)
class RequestShape:
    """What a request will touch: one aggregate over a block (or a feature gather,
    ``op="features"`` with ``num_dst = num_src = rows`` and no edges)."""

    num_dst: int
    num_src: int
    num_edges: int
    width: int
    op: str
    loads_rows: bool = True  # the source rows are read from storage/cache (not shipped in)

    def as_row(self) -> list[int]:
        return [
            self.num_dst,
            self.num_src,
            self.num_edges,
            self.width,
            op_class(self.op),
            int(self.loads_rows),
        ]


def shape_features(rows: np.ndarray) -> np.ndarray:
    """Design matrix from ``rows`` ``[k, 6]``: ``(num_dst, num_src, num_edges,
    width, op index, loads_rows)``."""
    rows = np.asarray(rows, dtype=np.float64).reshape(-1, 6)
    d, s, e, w, load = rows[:, 0], rows[:, 1], rows[:, 2], rows[:, 3], rows[:, 5]
    counts = np.stack([d, s, e, w, s * w, d * w, e * w, s * w * load], axis=1)
    onehot = np.zeros((rows.shape[0], len(OP_CLASSES)))
    onehot[np.arange(rows.shape[0]), rows[:, 4].astype(np.int64)] = 1.0
    return np.concatenate([np.log1p(counts), load[:, None], onehot], axis=1)


def analytic_peak(shape: RequestShape) -> int:
    """A conservative closed-form estimate, used when no predictor is fitted:
    input rows read twice (ranged read buffer + rows), the output and its frame,
    the CSR and, for max/GAT, per-edge rows."""
    row = 4 * shape.width
    est = (
        (20 if shape.loads_rows else 1) * shape.num_src * row
        + 3 * shape.num_dst * row
        + 32 * shape.num_edges
    )
    if shape.op in ("max", "gat"):
        est += 2 * shape.num_edges * row
    return int(est + (1 << 20))


class PeakPredictor:
    """The fitted MLP, evaluated in numpy."""

    def __init__(
        self,
        w1: np.ndarray,
        b1: np.ndarray,
        w2: np.ndarray,
        b2: np.ndarray,
        x_mean: np.ndarray,
        x_scale: np.ndarray,
        y_mean: float,
        y_scale: float,
        meta: dict[str, Any] | None = None,
    ):
        self.w1 = np.asarray(w1, np.float64)
        self.b1 = np.asarray(b1, np.float64)
        self.w2 = np.asarray(w2, np.float64).reshape(-1, 1)
        self.b2 = np.asarray(b2, np.float64).reshape(1)
        self.x_mean = np.asarray(x_mean, np.float64)
        self.x_scale = np.asarray(x_scale, np.float64)
        self.y_mean = float(y_mean)
        self.y_scale = float(y_scale)
        self.meta = dict(meta or {})
        if self.w1.shape != (NUM_FEATURES, self.b1.size) or self.w2.shape[0] != self.b1.size:
            raise InvalidRequest(
                f"peak predictor weights have shapes {self.w1.shape}/{self.w2.shape}, "
                f"expected ({NUM_FEATURES}, hidden)/(hidden, 1)"
            )

    def predict_rows(self, rows: np.ndarray) -> np.ndarray:
        """Predicted peak bytes for each row of :meth:`RequestShape.as_row` values."""
        x = (shape_features(rows) - self.x_mean) / self.x_scale
        hidden = np.maximum(x @ self.w1 + self.b1, 0.0)
        z = (hidden @ self.w2 + self.b2)[:, 0] * self.y_scale + self.y_mean
        return np.exp(np.clip(z, 0.0, 60.0))

    def predict(self, shape: RequestShape) -> int:
        return int(self.predict_rows(np.array([shape.as_row()]))[0])

    # -- persistence -----------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": 1,
            "features": "log1p(n_dst, n_src, n_edges, width, n_src*w, n_dst*w, n_edges*w, "
            "n_src*w*loads) + loads + onehot(" + ",".join(OP_CLASSES) + ")",
            "target": "log(peak bytes)",
            "activation": "relu",
            "w1": self.w1.tolist(),
            "b1": self.b1.tolist(),
            "w2": self.w2[:, 0].tolist(),
            "b2": float(self.b2[0]),
            "x_mean": self.x_mean.tolist(),
            "x_scale": self.x_scale.tolist(),
            "y_mean": self.y_mean,
            "y_scale": self.y_scale,
            "meta": self.meta,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PeakPredictor:
        if d.get("format") != FORMAT:
            raise InvalidRequest("not a gnn-faas peak predictor file")
        try:
            return cls(
                d["w1"], d["b1"], d["w2"], d["b2"], d["x_mean"], d["x_scale"],
                d["y_mean"], d["y_scale"], d.get("meta"),
            )  # fmt: skip
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidRequest(f"invalid peak predictor file ({exc})") from None

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1))

    @classmethod
    def load(cls, path: str | Path) -> PeakPredictor:
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise InvalidRequest(f"cannot read peak predictor {path}: {exc.strerror}") from None
        try:
            return cls.from_dict(json.loads(text))
        except ValueError:
            raise InvalidRequest(f"peak predictor {path} is not valid JSON") from None


def bundled_predictor_path(graph: str) -> Path:
    """Where a predictor fitted for a bundled graph ships (``gnn_faas/data``)."""
    return Path(__file__).resolve().parents[1] / "data" / f"peak_predictor_{graph}.json"
