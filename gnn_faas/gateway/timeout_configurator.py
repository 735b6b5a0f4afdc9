"""Decision-tree timeout configurator (λGrapher 3.3).

A buffer opens with timeout ``T0 = γ·SLO`` and never waits longer than ``Tmax =
δ·SLO`` from its first request. Every τ while it is open, the configurator looks at
its state ``(R, S, N, Q, K)`` (:mod:`gnn_faas.gateway.buffer`) and picks a decision
coded as an integer: ``-1`` close now, ``0`` keep the deadline, ``k`` (1..i)
extend it by ``k·τ`` (the pool caps it at Tmax and at every request's ``deadline −
exec_estimate``).

The hindsight-best decision maximises a buffer's gain ``μ = α·S − β·D`` (``S``: the
sharing degree at close; ``D``: its requests' mean wait over the SLO). A
scikit-learn ``DecisionTreeRegressor`` is fitted offline on recorded (state, best
decision) pairs (``gnn-faas timeouts fit``); serving evaluates the tree in numpy
from its JSON arrays (no sklearn, no pickle) and rounds to the nearest code.
Defaults for an SLO of 0.3 s: ``γ = 0.1``, ``δ = 0.5``, ``τ = 0.1·SLO``, ``i = 3``,
``α = 1``, ``β = 0.5``.

The low-load fast path (:class:`FastPath`), checked ahead of the tree at every
decision point: a buffer holding a lone request closes at once when ``N <= 1 and
Q·Tmax < min_expected_arrivals`` (default 1): when no request can come to share,
none waits. Why these defaults and the fast path: docs/design/timeouts.md.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from gnn_faas.errors import InvalidRequest, NotFound
from gnn_faas.gateway.buffer import FEATURES

FORMAT_NAME = "gnn-faas-timeout-tree"
FORMAT_VERSION = 1
DECISION_CLOSE = -1
DECISION_KEEP = 0
DATA_DIR = Path(__file__).resolve().parents[1] / "data"

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TimeoutParams:
    """SLO-relative timeout parameters (so a tree transfers across SLOs):
    ``T0 = gamma·SLO``, ``Tmax = delta·SLO``, ``τ = tau·SLO``, decisions up to
    ``max_steps·τ``; gain ``μ = alpha·S − beta·D``."""

    gamma: float = 0.1
    delta: float = 0.5
    tau: float = 0.1
    max_steps: int = 3
    alpha: float = 1.0
    beta: float = 0.5

    def __post_init__(self) -> None:
        if not 0 < self.gamma <= self.delta:
            raise ValueError(f"need 0 < gamma <= delta, got gamma={self.gamma}, delta={self.delta}")
        if self.tau <= 0 or self.max_steps < 0:
            raise ValueError("tau must be positive and max_steps >= 0")

    @property
    def decisions(self) -> np.ndarray:
        """Candidate decision codes ``[-1, 0, 1, ..., max_steps]``."""
        return np.arange(-1, self.max_steps + 1)

    def gain(self, sharing: float, delay_s: float, slo_s: float) -> float:
        """``μ = α·S − β·D`` with ``D = delay_s / slo_s``."""
        return self.alpha * sharing - self.beta * delay_s / slo_s

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TimeoutParams:
        names = {f.name for f in fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise InvalidRequest(f"unknown timeout parameter(s) {sorted(unknown)}")
        return cls(**d)


class TimeoutConfigurator(Protocol):
    """What the buffer pool calls at each decision point."""

    def decide(self, state: np.ndarray) -> int: ...


@dataclass(frozen=True)
class FastPath:
    """Close a lone request's buffer at once when no arrival is expected before
    it would have to close anyway (module docstring). ``min_expected_arrivals
    = 0`` turns the fast path off."""

    min_expected_arrivals: float = 1.0

    def __post_init__(self) -> None:
        if self.min_expected_arrivals < 0:
            raise ValueError("min_expected_arrivals must be >= 0")

    def closes(self, state: np.ndarray, horizon_s: float) -> bool:
        """True when the buffer with this ``(R, S, N, Q, K)`` state should close now;
        ``horizon_s``: how long it could still wait (Tmax)."""
        n, q = float(state[2]), float(state[3])
        return n <= 1 and q * horizon_s < self.min_expected_arrivals


class FixedTimeoutConfigurator:
    """Always the same decision (``0``: every buffer closes at T0); the baseline
    and the fallback when no tree is configured."""

    def __init__(self, decision: int = DECISION_KEEP):
        self.decision = int(decision)

    def decide(self, state: np.ndarray) -> int:
        return self.decision

    def decide_many(self, states: np.ndarray) -> np.ndarray:
        return np.full(np.asarray(states).reshape(-1, len(FEATURES)).shape[0], self.decision)


@dataclass(frozen=True)
class TreeArrays:
    """A fitted regression tree as plain arrays (sklearn's ``tree_`` layout):
    node ``i`` is a leaf when ``children_left[i] == -1``; otherwise samples with
    ``x[feature[i]] <= threshold[i]`` go left. ``value[i]``: the leaf's prediction."""

    children_left: np.ndarray
    children_right: np.ndarray
    feature: np.ndarray
    threshold: np.ndarray
    value: np.ndarray

    def __post_init__(self) -> None:
        n = self.children_left.size
        arrays = (self.children_right, self.feature, self.threshold, self.value)
        if n == 0 or any(a.size != n for a in arrays):
            raise InvalidRequest("timeout tree: arrays must be non-empty and of equal length")
        inner = self.children_left != -1
        idx = np.arange(n)
        ok = (
            np.all(self.children_right[inner] > idx[inner])
            and np.all(self.children_left[inner] > idx[inner])
            and np.all(self.children_left[inner] < n)
            and np.all(self.children_right[inner] < n)
            and np.all((self.feature[inner] >= 0) & (self.feature[inner] < len(FEATURES)))
            and np.all(self.children_right[~inner] == -1)
            and np.all(np.isfinite(self.value))
        )
        if not ok:
            raise InvalidRequest("timeout tree: inconsistent node arrays")

    @property
    def node_count(self) -> int:
        return int(self.children_left.size)

    @property
    def leaf_count(self) -> int:
        return int(np.count_nonzero(self.children_left == -1))

    @property
    def max_depth(self) -> int:
        depth = np.zeros(self.node_count, np.int64)
        for i in range(self.node_count):  # children come after parents
            if self.children_left[i] != -1:
                depth[self.children_left[i]] = depth[self.children_right[i]] = depth[i] + 1
        return int(depth.max())

    def predict(self, states: np.ndarray) -> np.ndarray:
        """Tree output for each row of ``states`` ``[m, 5]``, vectorised over rows
        (one step per tree level). Features are rounded to float32 first, as
        sklearn does, so the result is identical to ``DecisionTreeRegressor.predict``."""
        x = np.asarray(states, dtype=np.float64).reshape(-1, len(FEATURES))
        x = x.astype(np.float32).astype(np.float64)
        rows = np.arange(x.shape[0])
        node = np.zeros(x.shape[0], dtype=np.int64)
        while True:
            left = self.children_left[node]
            inner = left != -1
            if not inner.any():
                return self.value[node]
            feat = np.where(inner, self.feature[node], 0)
            go_left = x[rows, feat] <= self.threshold[node]
            node = np.where(inner, np.where(go_left, left, self.children_right[node]), node)

    def predict_one(self, state: np.ndarray) -> float:
        """:meth:`predict` for one state, walking the tree with Python scalars:
        one decision per buffer per τ is on the gateway's (and the simulator's)
        per-request path, where a numpy step per tree level costs ~100 µs."""
        lists = self.__dict__.get("_lists")
        if lists is None:  # frozen dataclass: cache the plain lists once
            lists = (
                self.children_left.tolist(),
                self.children_right.tolist(),
                self.feature.tolist(),
                self.threshold.tolist(),
                self.value.tolist(),
            )
            object.__setattr__(self, "_lists", lists)
        left, right, feature, threshold, value = lists
        x = np.asarray(state, dtype=np.float64).reshape(-1)
        x = x.astype(np.float32).astype(np.float64).tolist()  # as sklearn rounds
        node = 0
        while left[node] != -1:
            node = left[node] if x[feature[node]] <= threshold[node] else right[node]
        return value[node]

    def to_dict(self) -> dict[str, list]:
        return {
            "children_left": self.children_left.tolist(),
            "children_right": self.children_right.tolist(),
            "feature": self.feature.tolist(),
            "threshold": self.threshold.tolist(),
            "value": self.value.tolist(),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TreeArrays:
        try:
            return cls(
                children_left=np.asarray(d["children_left"], dtype=np.int64),
                children_right=np.asarray(d["children_right"], dtype=np.int64),
                feature=np.asarray(d["feature"], dtype=np.int64),
                threshold=np.asarray(d["threshold"], dtype=np.float64),
                value=np.asarray(d["value"], dtype=np.float64).reshape(-1),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidRequest(f"timeout tree: bad node arrays ({exc})") from None

    @classmethod
    def from_sklearn(cls, model: Any) -> TreeArrays:
        t = model.tree_
        return cls(
            children_left=np.asarray(t.children_left, dtype=np.int64),
            children_right=np.asarray(t.children_right, dtype=np.int64),
            feature=np.asarray(t.feature, dtype=np.int64),
            threshold=np.asarray(t.threshold, dtype=np.float64),
            value=np.asarray(t.value, dtype=np.float64)[:, 0, 0].copy(),
        )


class DecisionTreeTimeoutConfigurator:
    """Timeout decisions from a regression tree over the buffer state."""

    def __init__(self, params: TimeoutParams, tree: TreeArrays, meta: dict | None = None):
        self.params = params
        self.tree = tree
        self.meta = dict(meta or {})

    # -- serving -----------------------------------------------------------------
    def decide(self, state: np.ndarray) -> int:
        raw = self.tree.predict_one(state)
        return int(min(max(math.floor(raw + 0.5), -1), self.params.max_steps))

    def decide_many(self, states: np.ndarray) -> np.ndarray:
        """Decision codes: the tree's output rounded half-up, clipped to ``[-1, i]``."""
        raw = self.tree.predict(states)
        return np.clip(np.floor(raw + 0.5), -1, self.params.max_steps).astype(np.int64)

    # -- fitting -------------------------------------------------------------------
    @classmethod
    def fit(
        cls,
        states: np.ndarray,
        best_decisions: np.ndarray,
        params: TimeoutParams | None = None,
        max_depth: int = 6,
        min_samples_leaf: int = 10,
        random_state: int = 0,
        meta: dict | None = None,
    ) -> DecisionTreeTimeoutConfigurator:
        """Fit a ``DecisionTreeRegressor`` on (state, hindsight-best decision) pairs."""
        from sklearn.tree import DecisionTreeRegressor  # fitting only, never at serve time

        x = np.asarray(states, dtype=np.float64).reshape(-1, len(FEATURES))
        y = np.asarray(best_decisions, dtype=np.float64).reshape(-1)
        if x.shape[0] != y.shape[0]:
            raise InvalidRequest(f"{x.shape[0]} states but {y.shape[0]} decisions")
        if x.shape[0] == 0:
            raise InvalidRequest("no recorded decisions to fit a timeout tree on")
        if not np.all(np.isfinite(x)):
            raise InvalidRequest("states must be finite")
        model = DecisionTreeRegressor(
            max_depth=max_depth, min_samples_leaf=min_samples_leaf, random_state=random_state
        )
        model.fit(x, y)
        info = {
            "samples": int(x.shape[0]),
            "max_depth": int(model.get_depth()),
            "leaves": int(model.get_n_leaves()),
            "train_r2": float(model.score(x, y)),
            **(meta or {}),
        }
        return cls(params or TimeoutParams(), TreeArrays.from_sklearn(model), info)

    # -- (de)serialisation -----------------------------------------------------------
    def to_json(self) -> str:
        doc = {
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "features": list(FEATURES),
            "params": asdict(self.params),
            "tree": self.tree.to_dict(),
            "meta": self.meta,
        }
        return json.dumps(doc, indent=1, sort_keys=True)

    @classmethod
    def from_json(
        cls, text: str | bytes, where: str = "timeout tree"
    ) -> DecisionTreeTimeoutConfigurator:
        try:
            doc = json.loads(text)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise InvalidRequest(f"{where}: not JSON ({exc})") from None
        if not isinstance(doc, dict) or doc.get("format") != FORMAT_NAME:
            raise InvalidRequest(f"{where}: not a {FORMAT_NAME} file")
        if doc.get("version") != FORMAT_VERSION:
            raise InvalidRequest(f"{where}: unsupported version {doc.get('version')!r}")
        if doc.get("features") != list(FEATURES):
            raise InvalidRequest(
                f"{where}: features {doc.get('features')} are not {list(FEATURES)}"
            )
        try:
            params = TimeoutParams.from_dict(doc.get("params", {}))
        except (TypeError, ValueError) as exc:
            raise InvalidRequest(f"{where}: bad params ({exc})") from None
        tree = TreeArrays.from_dict(doc.get("tree") or {})
        return cls(params, tree, doc.get("meta") or {})

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json() + "\n")

    @classmethod
    def load(cls, path: str | Path) -> DecisionTreeTimeoutConfigurator:
        p = Path(path)
        if not p.is_file():
            raise NotFound(f"no timeout tree file {str(p)!r}")
        return cls.from_json(p.read_bytes(), where=str(p))

    @classmethod
    def bundled(cls, graph: str = "bitcoin-otc") -> DecisionTreeTimeoutConfigurator:
        """The tree shipped in ``gnn_faas/data/timeout_tree_{graph}.json``."""
        return cls.load(bundled_tree_path(graph))

    def __repr__(self) -> str:
        return (
            f"DecisionTreeTimeoutConfigurator(nodes={self.tree.node_count}, "
            f"leaves={self.tree.leaf_count}, params={self.params})"
        )


def bundled_tree_path(graph: str) -> Path:
    return DATA_DIR / f"timeout_tree_{graph}.json"


def load_configurator(
    tree: str | Path | None = None, graph: str | None = None, config: Any = None
) -> TimeoutConfigurator:
    """The configurator a model serves with: the tree file ``tree`` if given
    (a missing or invalid file is an error), else the tree shipped for
    ``graph``, else :class:`FixedTimeoutConfigurator` (every buffer closes at
    T0). ``config`` (a ``BufferConfig``): a warning is logged when its
    SLO-relative parameters differ from those the tree was fitted with (the
    tree still serves; the pool caps its decisions at its own ``max_steps``)."""
    if tree is not None:
        conf = DecisionTreeTimeoutConfigurator.load(tree)
    elif graph is not None and bundled_tree_path(graph).is_file():
        conf = DecisionTreeTimeoutConfigurator.load(bundled_tree_path(graph))
    else:
        log.info("no timeout tree for graph %r: buffers close at T0", graph)
        return FixedTimeoutConfigurator(DECISION_KEEP)
    params = getattr(config, "params", None)
    if params is not None and params != conf.params:
        log.warning(
            "timeout tree %s was fitted with %s but the buffers use %s",
            tree or bundled_tree_path(graph or ""),
            conf.params,
            params,
        )
    return conf
