"""Adaptive, memory-aware feature cache of a memory function (FaaS-GNN 4.3).

Capacity follows memory, per request::

    capacity_bytes = limit - baseline - predicted_peak(request)

(``baseline``: the instance's resident memory at start; the prediction from
:class:`~gnn_faas.functions.peak_predictor.PeakPredictor`). What stays and what
gets in follows a vertex's value::

    value(v) = freq(v) + degree_weight * log1p(out_degree(v)) / log1p(max out_degree)

or ``freq(v) + degree_weight * FAP(v) / max FAP`` with a sparse ``prior`` (the
top-k of Quiver's feature access probability). ``freq`` counts the requests
that read ``v``, halved every ``decay_every`` requests so it is recent; the
prior term (at most ``degree_weight``) ranks vertices never seen and breaks
ties. Eviction removes the lowest values first and never a row of the request
in flight; a miss is admitted when there is space or it beats the lowest
resident value. When ``baseline + cache + working set`` would cross the limit,
the cache is cleared and the request re-executed on the empty cache
(``reexecutions``), so the request is never lost and the ceiling holds after
every request.

The working set is measured (tracemalloc) only where it can matter. A request
whose closed-form bound (:func:`~gnn_faas.functions.peak_predictor.analytic_peak`,
an upper bound of its allocations) is at most ``untraced_share`` of the limit
runs untraced: the cache reserves the bound instead of the prediction and
accounts the bound as its peak, so the ceiling holds without a measurement.
Tracing slows every allocation of the process (a lone small request's
Aggregate took ~4x longer under it, and starting it costs ~0.6 ms), while the
bound costs the cache at most that share of its room while the request runs
(the bound is loose, up to ~20x a request's real peak, so a share of 1/32 had a
quarter of the calls of Bitcoin OTC's lone requests traced, at 1/8 none of 200
with a 256 MB function). Larger requests
are traced while they run. Nothing here is sized by the graph: an idle instance's memory
must not grow with its vertex count. One re-entrant lock guards every
mutation. The design and its reasons: docs/architecture.md, section 5.
"""

from __future__ import annotations

import contextlib
import threading
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from gnn_faas.errors import InvalidRequest, Unavailable
from gnn_faas.functions.id_table import IdTable
from gnn_faas.functions.peak_predictor import PeakPredictor, RequestShape, analytic_peak

T = TypeVar("T")

# Tuned on the Higgs retweet request order (``gnn-faas bench cache``): halving
# every 128 requests beat 8..2048 there; the degree prior matters at cold start.
DEFAULT_DECAY_EVERY = 128
DEFAULT_DEGREE_WEIGHT = 0.5
# a non-resident vertex's count is forgotten below this (after 6 halvings of one read)
FREQ_FLOOR = 2.0**-6

DegreeSource = np.ndarray | Callable[[np.ndarray], np.ndarray]


@dataclass(frozen=True)
class CachePolicy:
    """Knobs of the adaptive policy (see the module docstring for the formula)."""

    decay_every: int = DEFAULT_DECAY_EVERY  # halve every count after this many requests
    degree_weight: float = DEFAULT_DEGREE_WEIGHT  # weight of the normalised log-degree prior
    max_rows: int | None = None  # hard cap on rows (benchmarks: a fraction of the graph)
    growth: float = 1.5  # allocation grows by this factor (on demand, never past capacity)
    # a request whose closed-form bound is at most this share of the limit runs untraced
    # (its bound reserved and accounted instead of a measured peak); 0: trace every request
    untraced_share: float = 1 / 8

    def __post_init__(self) -> None:
        if self.decay_every < 1:
            raise InvalidRequest("decay_every must be >= 1")
        if self.degree_weight < 0:
            raise InvalidRequest("degree_weight must be >= 0")
        if self.max_rows is not None and self.max_rows < 0:
            raise InvalidRequest("max_rows must be >= 0")
        if self.growth < 1.0:
            raise InvalidRequest("growth must be >= 1")
        if not 0.0 <= self.untraced_share <= 1.0:
            raise InvalidRequest("untraced_share must be in [0, 1]")


@dataclass
class CacheStats:
    lookups: int = 0
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    admissions: int = 0
    invalidations: int = 0  # rows dropped because a graph version changed them
    requests: int = 0
    reexecutions: int = 0
    over_limit: int = 0  # requests whose own working set exceeded limit - baseline
    traced: int = 0  # requests whose peak was measured (the others were bounded)
    # the most any request held, as the protocol accounts it (baseline + cache +
    # its working set, after a re-execution the run that answered): set against
    # the limit, it shows the headroom the partitioner left (``actual_peak_bytes``
    # is the last request's working set alone)
    max_accounted_bytes: int = 0
    max_peak_bytes: int = 0  # the largest working set of one request


def measure_peak(work: Callable[[], T]) -> tuple[T, int]:
    """Run ``work`` and return ``(result, peak bytes it allocated)`` via tracemalloc
    (started for the call and stopped after it, unless something traces already)."""
    nested = tracemalloc.is_tracing()
    if nested:
        start, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
    else:
        start = 0
        tracemalloc.start()
    try:
        result = work()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        if not nested:
            tracemalloc.stop()
    return result, max(0, peak - start)


class FeatureCache:
    """Feature rows of the most valuable vertices, within a memory budget.

    ``limit_bytes=None`` means no memory budget (capacity = ``policy.max_rows``);
    ``predictor=None`` falls back to :func:`analytic_peak`. ``degree``: an
    out-degree array of ``num_nodes`` entries, or a callable ``degree(ids)``
    (read on demand), optionally with ``max_degree`` (default: the largest
    degree read so far).
    """

    def __init__(
        self,
        num_nodes: int,
        dim: int,
        degree: DegreeSource | None = None,
        limit_bytes: int | None = None,
        predictor: PeakPredictor | None = None,
        policy: CachePolicy | None = None,
        baseline_bytes: int = 0,
        max_degree: int | None = None,
        prior: tuple[np.ndarray, np.ndarray] | None = None,
    ):
        self.num_nodes = int(num_nodes)
        self.dim = int(dim)
        self.row_bytes = 4 * self.dim
        self.limit_bytes = None if limit_bytes is None else int(limit_bytes)
        self.predictor = predictor
        self.policy = policy or CachePolicy()
        self.baseline_bytes = int(baseline_bytes)
        self.lock = threading.RLock()
        self.stats = CacheStats()
        self._slot_of = IdTable(np.int32)
        self._ghost = IdTable(np.float32)
        self._degree_of: Callable[[np.ndarray], np.ndarray] | None = None
        # normaliser of the raw prior: log1p(max degree), growing with the degrees read
        # if unknown; or the largest score of a sparse prior
        self._prior_top = 0.0
        self._prior_table: IdTable | None = None  # sparse (ids -> score), e.g. FAP's top-k
        if degree is not None and self.policy.degree_weight > 0 and self.num_nodes > 0:
            if callable(degree):
                top = 0 if max_degree is None else int(max_degree)
                self._degree_of = degree
            else:
                arr = np.asarray(degree)
                if len(arr) != self.num_nodes:
                    raise InvalidRequest(
                        f"degree has {len(arr)} entries, graph has {num_nodes} vertices"
                    )
                top = int(arr.max()) if max_degree is None else int(max_degree)
                self._degree_of = arr.__getitem__
            self._prior_top = float(np.log1p(max(top, 0)))
        if prior is not None:
            self._set_prior_table(prior)
        self._data = np.empty((0, self.dim), dtype=np.float32)
        self._slot_node = np.empty(0, dtype=np.int64)
        self._slot_freq = np.empty(0, dtype=np.float32)
        self._slot_raw = np.empty(0, dtype=np.float32)  # raw prior per slot (see _raw_prior)
        self.rows = 0
        self.capacity_rows = self._row_cap(0)
        self.last_predicted_peak = 0
        self.last_actual_peak = 0
        self._deferred: list[tuple[np.ndarray, np.ndarray]] | None = None

    # -- figures ---------------------------------------------------------------
    @property
    def bytes(self) -> int:
        """Bytes the cache holds (its allocated row array)."""
        return int(self._data.nbytes)

    @property
    def bookkeeping_bytes(self) -> int:
        """Bytes of per-vertex state beside the rows (slots, ghosts): bounded by the
        cache and the recent work, never by the graph."""
        per_slot = self._slot_node.nbytes + self._slot_freq.nbytes + self._slot_raw.nbytes
        return int(per_slot + self._slot_of.nbytes + self._ghost.nbytes)

    def accounted_bytes(self, working_set: int) -> int:
        return self.baseline_bytes + self.bytes + int(working_set)

    def as_dict(self) -> dict[str, Any]:
        s = self.stats
        return {
            "hits": s.hits,
            "misses": s.misses,
            "lookups": s.lookups,
            "hit_rate": s.hits / s.lookups if s.lookups else 0.0,
            "evictions": s.evictions,
            "admissions": s.admissions,
            "invalidations": s.invalidations,
            "requests": s.requests,
            "reexecutions": s.reexecutions,
            "over_limit": s.over_limit,
            "traced": s.traced,
            "max_accounted_bytes": s.max_accounted_bytes,
            "max_peak_bytes": s.max_peak_bytes,
            "capacity_rows": int(self.capacity_rows),
            "rows": int(self.rows),
            "bytes": self.bytes,
            "bookkeeping_bytes": self.bookkeeping_bytes,
            "ghosts": len(self._ghost),
            "baseline_bytes": self.baseline_bytes,
            "limit_bytes": self.limit_bytes,
            "predicted_peak_bytes": int(self.last_predicted_peak),
            "actual_peak_bytes": int(self.last_actual_peak),
        }

    def _set_prior_table(self, prior: tuple[np.ndarray, np.ndarray]) -> None:
        ids, scores = (np.asarray(a) for a in prior)
        table = IdTable(np.float32, capacity=2 * max(1, ids.size))
        table.put(ids.astype(np.int64), scores.astype(np.float32))
        self._prior_table = table
        self._prior_top = float(np.max(scores)) if scores.size else 0.0
        self._degree_of = None

    def _raw_prior(self, nodes: np.ndarray) -> np.ndarray:
        """The raw prior of ``nodes``: their sparse prior's score (0 outside it), or
        ``log1p(out_degree)`` (read now; raises the normaliser)."""
        if self._prior_table is not None:
            return self._prior_table.get(nodes, 0.0).astype(np.float32)
        if self._degree_of is None or nodes.size == 0:
            return np.zeros(nodes.size, dtype=np.float32)
        deg = np.asarray(self._degree_of(nodes), dtype=np.float64).clip(min=0)
        logd = np.log1p(deg)
        self._prior_top = max(self._prior_top, float(logd.max()))
        return logd.astype(np.float32)

    def _scale(self) -> float:
        """``degree_weight / log1p(max out-degree)``: prior = scale * log1p(degree)."""
        return self.policy.degree_weight / self._prior_top if self._prior_top > 0 else 0.0

    def prior(self, nodes: np.ndarray) -> np.ndarray:
        """``degree_weight * raw / top`` of ``nodes``: the normalised log-degree or
        sparse prior (see the module docstring)."""
        logd = self._raw_prior(np.asarray(nodes, dtype=np.int64))
        return (self._scale() * logd).astype(np.float32)

    def slots(self, ids: np.ndarray) -> np.ndarray:
        """Slot of each id (``-1``: not resident)."""
        return self._slot_of.get(np.asarray(ids, dtype=np.int64), -1).astype(np.int64)

    def frequency(self, ids: np.ndarray) -> np.ndarray:
        """The (decayed) count of requests that read each id."""
        ids = np.asarray(ids, dtype=np.int64)
        slots = self.slots(ids)
        out = self._ghost.get(ids, 0.0)
        hit = slots >= 0
        out[hit] = self._slot_freq[slots[hit]]
        return out

    def value(self, nodes: np.ndarray) -> np.ndarray:
        """``freq + degree prior`` of ``nodes`` (see the module docstring)."""
        nodes = np.asarray(nodes, dtype=np.int64)
        slots = self.slots(nodes)
        out = self._ghost.get(nodes, 0.0) + self.prior(nodes)
        hit = slots >= 0
        out[hit] = self._slot_freq[slots[hit]] + self._scale() * self._slot_raw[slots[hit]]
        return out

    def set_prior(self, prior: tuple[np.ndarray, np.ndarray]) -> None:
        """Replace the prior by a fresh sparse ``(ids, scores)`` (e.g. FAP recomputed
        over recent requests); residents are re-ranked from then on."""
        with self.lock:
            self._set_prior_table(prior)
            n = self.rows
            self._slot_raw[:n] = self._raw_prior(self._slot_node[:n])

    def warm(self, ids: np.ndarray, loader: Callable[[np.ndarray], np.ndarray]) -> int:
        """Load the rows of ``ids`` (best first, e.g. the top of the prior) into
        free capacity before any request: a new instance starts warm. Not
        counted as lookups. Returns the rows admitted."""
        with self.lock:
            ids = np.asarray(ids, dtype=np.int64)
            ids = ids[~self.contains(ids)][: max(0, self.capacity_rows - self.rows)]
        if ids.size == 0:
            return 0
        # the store read runs outside the lock: requests are served meanwhile
        rows = np.asarray(loader(ids), np.float32).reshape(-1, self.dim)
        with self.lock:
            fresh = ~self.contains(ids)  # a request may have admitted some meanwhile
            room = max(0, self.capacity_rows - self.rows)
            keep = np.flatnonzero(fresh)[:room]
            if keep.size == 0:
                return 0
            before = self.stats.admissions
            self._admit(ids[keep], rows[keep], None)
            return self.stats.admissions - before

    def invalidate(self, ids: np.ndarray) -> int:
        """Drop the rows of ``ids`` a graph version changed (those resident; their
        counts are forgotten too): exactly them, never a flush. How many."""
        with self.lock:
            ids = np.asarray(ids, dtype=np.int64)
            slots = self.slots(ids)
            victims = np.unique(slots[slots >= 0])
            if victims.size:
                self._remove_slots(victims)
                self.stats.evictions -= int(victims.size)  # not evictions: invalidations
                self.stats.invalidations += int(victims.size)
            self._ghost.delete(ids[self._ghost.contains(ids)])
            return int(victims.size)

    def resident(self) -> np.ndarray:
        """Global ids of the cached vertices (slot order)."""
        return self._slot_node[: self.rows].copy()

    def contains(self, ids: np.ndarray) -> np.ndarray:
        return self._slot_of.contains(np.asarray(ids, dtype=np.int64))

    # -- capacity --------------------------------------------------------------
    def predict_peak(self, shape: RequestShape | None) -> int:
        if shape is None:
            return 0
        if self.predictor is not None:
            return self.predictor.predict(shape)
        return analytic_peak(shape)

    def _row_cap(self, reserve_bytes: int) -> int:
        """Rows the budget allows while ``reserve_bytes`` of working set run."""
        cap = (
            self.num_nodes
            if self.policy.max_rows is None
            else min(self.policy.max_rows, self.num_nodes)
        )
        if self.limit_bytes is not None:
            free = self.limit_bytes - self.baseline_bytes - int(reserve_bytes)
            cap = min(cap, max(0, free // self.row_bytes) if self.row_bytes else cap)
        return int(cap)

    def set_baseline(self, baseline_bytes: int) -> None:
        """Set the memory held outside the cache and requests (and the idle capacity)."""
        with self.lock:
            self.baseline_bytes = int(baseline_bytes)
            self.set_capacity(self._row_cap(0))

    def set_capacity(self, rows: int, pinned: np.ndarray | None = None) -> None:
        """Set the row capacity, evicting the lowest-value unpinned rows when it shrinks."""
        with self.lock:
            self.capacity_rows = int(rows)
            if self.rows > self.capacity_rows:
                self._evict_lowest(self.rows - self.capacity_rows, pinned)
            self._fit_allocation()

    def clear(self) -> None:
        """Drop every row and release the memory (counts are kept: they are history)."""
        with self.lock:
            if self.rows:
                self._remove_slots(np.arange(self.rows))
            self._data = np.empty((0, self.dim), dtype=np.float32)
            self._slot_node = np.empty(0, dtype=np.int64)
            self._slot_freq = np.empty(0, dtype=np.float32)
            self._slot_raw = np.empty(0, dtype=np.float32)
            self._slot_of.clear()

    # -- lookups ---------------------------------------------------------------
    def get_rows(self, ids: np.ndarray, loader: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
        """Feature rows of ``ids`` (global, any order, repeats allowed) as a new
        float32 array: hits gathered from the cache, the (unique) misses loaded
        with one ``loader(miss_ids)`` call and then offered for admission
        (deferred to the end of the request inside :meth:`run`)."""
        ids = np.asarray(ids, dtype=np.int64)
        with self.lock:
            slots = self.slots(ids)
            hit = slots >= 0
            n_hit = int(np.count_nonzero(hit))
            if n_hit == ids.size:
                out = np.take(self._data, slots, axis=0)
                miss_u = np.empty(0, np.int64)
                miss_rows = np.empty((0, self.dim), np.float32)
            else:
                miss = ~hit
                miss_u, inverse = np.unique(ids[miss], return_inverse=True)
                if n_hit == 0 and miss_u.size == ids.size:
                    # distinct ids, none cached: the rows loaded in the asked order
                    # are the answer and what is offered for admission (one copy of
                    # the rows in memory, not two: a memory function's peak)
                    miss_u, inverse = ids, None
                miss_rows = np.asarray(loader(miss_u), dtype=np.float32).reshape(-1, self.dim)
                if miss_rows.shape[0] != miss_u.size:
                    raise InvalidRequest("feature loader returned the wrong number of rows")
                if inverse is None:
                    out = miss_rows
                else:
                    out = np.empty((ids.size, self.dim), dtype=np.float32)
                    if n_hit:
                        out[hit] = self._data[slots[hit]]
                    out[miss] = miss_rows[inverse]
            s = self.stats
            s.lookups += int(ids.size)
            s.hits += n_hit
            s.misses += int(ids.size) - n_hit
            self._touch(slots[hit], miss_u)
            if self._deferred is not None:
                self._deferred.append((miss_u, miss_rows))
            else:
                self._admit(miss_u, miss_rows, ids)
                self._tick()
            return out

    # -- request protocol ------------------------------------------------------
    def run(
        self,
        work: Callable[[], T],
        shape: RequestShape | None = None,
        pinned: np.ndarray | None = None,
        predicted_peak: int | None = None,
    ) -> T:
        """Run one request's ``work`` under the memory protocol (module docstring).

        ``shape`` gives the predicted peak (or pass ``predicted_peak``, which is
        then always traced: it is no bound); ``pinned`` are the ids the request
        reads (their rows are not evicted to make room). ``work`` reads rows with
        :meth:`get_rows`.
        """
        with self.lock:
            predicted = self.predict_peak(shape) if predicted_peak is None else int(predicted_peak)
            bound = self._untraced_bound(shape) if predicted_peak is None else None
            reserve = predicted if bound is None else max(predicted, bound)
            pin = None if pinned is None else np.asarray(pinned, dtype=np.int64)
            self.last_predicted_peak = predicted
            self.set_capacity(self._row_cap(reserve), pin)
            self._deferred = []
            try:
                result, peak = self._execute(work, bound)
                self.last_actual_peak = peak
                st = self.stats
                st.max_peak_bytes = max(st.max_peak_bytes, int(peak))
                st.max_accounted_bytes = max(st.max_accounted_bytes, self.accounted_bytes(peak))
                deferred, self._deferred = self._deferred, None
                self.capacity_rows = self._row_cap(max(reserve, peak))
                if deferred:
                    # no copy of the request's rows here: only the admitted ones
                    # are copied, into the cache (a part may load hundreds of MB)
                    if len(deferred) == 1:
                        ids, rows = deferred[0]
                    else:
                        ids = np.concatenate([d[0] for d in deferred])
                        rows = np.concatenate([d[1] for d in deferred])
                    ids, first = np.unique(ids, return_index=True)
                    both = ids if pin is None else np.concatenate((pin, ids))
                    self._admit(ids, rows, both, first)
                # the request is over: its pins go, the cache keeps to its capacity
                self.set_capacity(self.capacity_rows)
                return result
            finally:
                self._deferred = None
                self._tick()

    def _untraced_bound(self, shape: RequestShape | None) -> int | None:
        """The closed-form bound of a request small enough to run untraced, else ``None``."""
        if shape is None:
            return None
        bound = analytic_peak(shape)
        if self.limit_bytes is not None and bound > self.policy.untraced_share * self.limit_bytes:
            return None
        return bound

    def _execute(self, work: Callable[[], T], bound: int | None) -> tuple[T, int]:
        """``(result, accounted peak)`` of ``work``: untraced with its ``bound``, or
        traced, re-executed on an empty cache when the measured peak would cross
        the limit."""
        # a MemoryError in either run below falls through to the re-execution
        if bound is not None:
            with contextlib.suppress(MemoryError):  # the bound held: the process is short
                return work(), bound
        else:
            self.stats.traced += 1
            with contextlib.suppress(MemoryError):
                result, peak = measure_peak(work)
                if not (
                    self.limit_bytes is not None and self.accounted_bytes(peak) > self.limit_bytes
                ):
                    return result, peak
        # the prediction was too low: free the cache, run again on an empty one
        self.stats.reexecutions += 1
        self.clear()
        self._deferred = []
        self.stats.traced += 1
        try:
            result, peak = measure_peak(work)
        except MemoryError:
            raise Unavailable("request needs more memory than this instance has") from None
        if self.limit_bytes is not None and self.accounted_bytes(peak) > self.limit_bytes:
            self.stats.over_limit += 1
        return result, peak

    # -- internals (call with the lock held) -------------------------------------
    def _touch(self, hit_slots: np.ndarray, miss_ids: np.ndarray) -> None:
        # once per request and vertex: residents count in their slot, the rest as ghosts
        if hit_slots.size:
            # an indexed += adds once per distinct slot however often it repeats
            # (numpy writes a[i] + 1 back for each copy): no unique() needed
            self._slot_freq[hit_slots] += 1.0
        self._ghost.add(miss_ids, 1.0)

    def _tick(self) -> None:
        self.stats.requests += 1
        if self.stats.requests % self.policy.decay_every == 0:
            self._slot_freq[: self.rows] *= 0.5
            self._ghost.scale(0.5, floor=FREQ_FLOOR)

    def _resident_values(self, pinned: np.ndarray | None) -> np.ndarray:
        """Values of the residents by slot, ``inf`` for the pinned ones."""
        n = self.rows
        vals = self._slot_freq[:n].astype(np.float64) + self._scale() * self._slot_raw[:n]
        if pinned is not None and pinned.size:
            ps = self.slots(pinned)
            vals[ps[ps >= 0]] = np.inf
        return vals

    def _evict_lowest(self, k: int, pinned: np.ndarray | None = None) -> None:
        """Evict the ``k`` lowest-value unpinned rows (fewer if pinned rows block)."""
        if k <= 0 or self.rows == 0:
            return
        vals = self._resident_values(pinned)
        k = min(k, int(np.count_nonzero(np.isfinite(vals))))
        if k == 0:
            return
        victims = np.argpartition(vals, k - 1)[:k] if k < vals.size else np.arange(vals.size)
        self._remove_slots(victims)

    def _remove_slots(self, victims: np.ndarray) -> None:
        """Remove rows at slots ``victims`` (their counts become ghosts) and compact:
        live rows from the tail move into the holes below the new row count."""
        if victims.size == 0:
            return
        gone_nodes = self._slot_node[victims]
        freq = self._slot_freq[victims]
        keep = freq >= FREQ_FLOOR
        self._slot_of.delete(gone_nodes)
        self._ghost.put(gone_nodes[keep], freq[keep])
        new_rows = self.rows - victims.size
        gone = np.zeros(self.rows, dtype=bool)
        gone[victims] = True
        holes = np.flatnonzero(gone[:new_rows])
        movers = new_rows + np.flatnonzero(~gone[new_rows:])
        if holes.size:
            for arr in (self._data, self._slot_node, self._slot_freq, self._slot_raw):
                arr[holes] = arr[movers]
            self._slot_of.put(self._slot_node[holes], holes.astype(np.int32))
        self._slot_node[new_rows : self.rows] = -1
        self.rows = new_rows
        self.stats.evictions += int(victims.size)

    def _fit_allocation(self) -> None:
        """Release allocated rows above the capacity (never below the live rows)."""
        target = max(self.rows, self.capacity_rows)
        if self._data.shape[0] > target:
            self._resize(target)

    def _resize(self, rows: int) -> None:
        # in-place realloc: no second copy of the cache is ever alive
        self._data.resize((rows, self.dim), refcheck=False)
        old = self._slot_node.size
        for arr in (self._slot_node, self._slot_freq, self._slot_raw):
            arr.resize(rows, refcheck=False)
        if rows > old:
            self._slot_node[old:] = -1

    def _admit(
        self,
        ids: np.ndarray,
        rows: np.ndarray,
        pinned: np.ndarray | None,
        row_of: np.ndarray | None = None,
    ) -> None:
        """Admit misses ``ids`` (unique, not resident) with their ``rows``: into free
        slots best-first, then in exchange for the lowest-value unpinned residents
        they beat. ``row_of[i]``: the row of ``ids[i]`` in ``rows`` (default ``i``)."""
        cap = self.capacity_rows
        if ids.size == 0 or cap <= 0:
            return
        freq = self._ghost.get(ids, 0.0)
        logd = self._raw_prior(ids)  # first: it may raise the normaliser
        cand = freq.astype(np.float64) + self._scale() * logd
        order = np.argsort(-cand, kind="stable")[:cap]
        free = max(0, cap - self.rows)
        take = order[:free]
        rest = order[free:]
        victims = np.empty(0, dtype=np.int64)
        if rest.size and self.rows:
            vals = self._resident_values(pinned)
            k = min(rest.size, int(np.count_nonzero(np.isfinite(vals))))
            if k:
                low = np.argpartition(vals, k - 1)[:k] if k < vals.size else np.arange(vals.size)
                low = low[np.argsort(vals[low], kind="stable")]
                beats = cand[rest[:k]] > vals[low]  # best misses vs worst residents
                m = int(np.argmin(beats)) if not beats.all() else k
                victims = low[:m]
                take = np.concatenate((take, rest[:m]))
        if victims.size:
            self._remove_slots(victims)
        if take.size == 0:
            return
        need = self.rows + take.size
        if need > self._data.shape[0]:
            grown = int(self._data.shape[0] * self.policy.growth) + 1
            self._resize(min(cap, max(need, grown)))
        slots = np.arange(self.rows, need)
        self._data[slots] = rows[take] if row_of is None else rows[row_of[take]]
        self._slot_node[slots] = ids[take]
        self._slot_freq[slots] = freq[take]
        self._slot_raw[slots] = logd[take]
        self._slot_of.put(ids[take], slots.astype(np.int32))
        self._ghost.delete(ids[take])
        self.rows = need
        self.stats.admissions += int(take.size)
