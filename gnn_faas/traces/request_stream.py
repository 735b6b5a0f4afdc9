"""A trace's arrivals mapped onto a graph's real request order (FaaS-GNN 5.1).

Arrival ``i`` asks for vertex ``order[(offset + i) mod |order|]`` where
``order`` is the graph's ``request_order`` blob (vertices in the order the
dataset's real events touched them). Every distinct vertex's k-hop vertex set
``U_v`` (sorted, unique, the vertex itself included) is computed once and kept
as a CSR (``indptr``, ``indices``), so a request's set is a slice, never a
recomputation: with full neighbourhoods the sets of all distinct vertices come
from ``k`` sparse boolean products ``X ← X·(A + I)`` with ``A`` the graph's
in-edge adjacency (``A[v, u] = 1`` when ``v`` aggregates from ``u``); with
sampled fanouts each distinct vertex goes through the on-demand fetcher once.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp

from gnn_faas.errors import InvalidRequest


@dataclass(frozen=True)
class KHopSets:
    """``U_vertices[j] = indices[indptr[j]:indptr[j+1]]`` (sorted int64)."""

    vertices: np.ndarray
    indptr: np.ndarray
    indices: np.ndarray

    @property
    def sizes(self) -> np.ndarray:
        return np.diff(self.indptr)

    def set_of(self, j: int) -> np.ndarray:
        return self.indices[self.indptr[j] : self.indptr[j + 1]]

    def views(self) -> list[np.ndarray]:
        """Every set as a view (a list index per request instead of a slice)."""
        cached = self.__dict__.get("_views")
        if cached is None:
            bounds = self.indptr.tolist()
            cached = [self.indices[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
            object.__setattr__(self, "_views", cached)
        return cached

    def sizes_list(self) -> list[int]:
        cached = self.__dict__.get("_sizes")
        if cached is None:
            cached = self.sizes.tolist()
            object.__setattr__(self, "_sizes", cached)
        return cached


def khop_sets(
    graph: Any, vertices: np.ndarray, hops: int, fanouts: Sequence[int] | None = None
) -> KHopSets:
    """k-hop sets of ``vertices`` (unique ids) in ``graph`` (a store handle)."""
    vertices = np.asarray(vertices, dtype=np.int64)
    n = int(graph.num_nodes)
    if fanouts is not None and any(f is not None and f >= 0 for f in fanouts):
        # (here: full neighbourhoods, the simulator's default, need no fetcher,
        # and the fetcher's modules take ~35 ms to import)
        from gnn_faas.storage.fetcher import KHopFetcher

        fetcher = KHopFetcher(graph)
        sets = [np.unique(fetcher.fetch([int(v)], hops, fanouts).nodes) for v in vertices]
        indptr = np.concatenate([[0], np.cumsum([s.size for s in sets])]).astype(np.int64)
        indices = np.concatenate(sets).astype(np.int64) if sets else np.zeros(0, np.int64)
        return KHopSets(vertices, indptr, indices)
    indptr = graph.read_blob("indptr").astype(np.int64)
    indices = graph.read_blob("indices").astype(np.int64)
    a = sp.csr_matrix((np.ones(indices.size, np.int8), indices, indptr), shape=(n, n))
    step = (a + sp.identity(n, dtype=np.int8, format="csr")).astype(bool).tocsr()
    x = sp.csr_matrix(
        (np.ones(vertices.size, bool), (np.arange(vertices.size), vertices)),
        shape=(vertices.size, n),
    )
    for _ in range(hops):
        x = (x @ step).astype(bool).tocsr()
    x.sort_indices()
    return KHopSets(vertices, x.indptr.astype(np.int64), x.indices.astype(np.int64))


CHUNK_REQUESTS = 1 << 15  # requests per chunk (about; chunks end on a whole minute)


@dataclass(frozen=True)
class RequestStream:
    """Arrivals with their target vertex and the index of its k-hop set.

    ``targets[i]``: vertex of arrival ``i``; ``set_index[i]``: its row in
    ``sets``; ``sizes[i] = |U_r|``.

    With ``repeats`` > 1 the arrays hold one period of ``period_s`` seconds
    and the stream plays it ``repeats`` times back to back (a day as a week):
    request ``p·n + j`` arrives at ``arrivals[j] + p·period_s`` and asks for
    ``order[(offset + p·n + j) mod |order|]`` (the request order goes on),
    whose set is row ``row_of[vertex]``. Such a stream is read in chunks
    (:meth:`chunks`), never whole."""

    arrivals: np.ndarray
    targets: np.ndarray
    set_index: np.ndarray
    sets: KHopSets
    repeats: int = 1
    period_s: float = 0.0
    order: np.ndarray | None = None
    offset: int = 0

    @property
    def sizes(self) -> np.ndarray:
        self._whole()
        return self.sets.sizes[self.set_index]

    def vertex_set(self, i: int) -> np.ndarray:
        return self.sets.set_of(int(self.set_index_of(i)))

    def __len__(self) -> int:
        return int(self.arrivals.size) * self.repeats

    def head(self, n: int) -> RequestStream:
        self._whole()
        return RequestStream(self.arrivals[:n], self.targets[:n], self.set_index[:n], self.sets)

    def _whole(self) -> None:
        if self.repeats != 1:
            raise ValueError("a repeated stream is read in chunks (RequestStream.chunks)")

    def set_index_of(self, i: int) -> int:
        n = self.arrivals.size
        if self.repeats == 1 or i < n:
            return int(self.set_index[i])
        return int(self._rows(i, i + 1)[0])

    def _rows(self, lo: int, hi: int) -> np.ndarray:
        """Set rows of requests ``[lo, hi)`` of a repeated stream."""
        assert self.order is not None
        targets = map_targets(self.order, hi - lo, self.offset + lo)
        row_of = self.__dict__.get("_row_of")
        if row_of is None:
            row_of = np.full(int(self.sets.vertices.max(initial=0)) + 1, -1, np.int64)
            row_of[self.sets.vertices] = np.arange(self.sets.vertices.size)
            object.__setattr__(self, "_row_of", row_of)
        return row_of[targets]

    def chunks(self, size: int = CHUNK_REQUESTS):
        """``(first index, arrivals, set rows)`` in order, each chunk about
        ``size`` requests ending on a whole minute of the period (so per-minute
        sums see each minute whole)."""
        arr, n = self.arrivals, int(self.arrivals.size)
        cuts = [0]
        while cuts[-1] < n:
            nxt = cuts[-1] + size
            if nxt >= n:
                cuts.append(n)
                break
            minute = math.floor(arr[nxt] / 60.0) + 1
            cuts.append(max(int(np.searchsorted(arr, minute * 60.0)), nxt))
        for p in range(self.repeats):
            shift = p * self.period_s
            for a, b in zip(cuts[:-1], cuts[1:], strict=True):
                lo = p * n + a
                rows = self.set_index[a:b] if p == 0 else self._rows(lo, p * n + b)
                yield lo, (arr[a:b] + shift if p else arr[a:b]), rows

    def arrivals_of(self, lo: int, hi: int) -> np.ndarray:
        """Arrival times of requests ``[lo, hi)`` (across repeats too)."""
        n = int(self.arrivals.size)
        parts = []
        while lo < hi:
            p = lo // n
            a, b = lo - p * n, min(hi - p * n, n)
            x = self.arrivals[a:b]
            parts.append(x + p * self.period_s if p else x)
            lo = p * n + b
        if len(parts) == 1:
            return parts[0]
        return np.concatenate(parts) if parts else np.zeros(0)

    def size_stats(self) -> tuple[int, int]:
        """``(largest |U_r|, Σ |U_r|)`` over every request."""
        sizes = self.sets.sizes
        top = total = 0
        for _, _, rows in self.chunks(1 << 20):
            s = sizes[rows]
            if s.size:
                top = max(top, int(s.max()))
                total += int(s.sum())
        return top, total


def request_order(graph: Any) -> np.ndarray:
    if not graph.has("request_order"):
        raise InvalidRequest(
            f"graph {graph.name!r} has no request order (request_order.bin): "
            "prepare it from a dataset that has one"
        )
    order = graph.read_blob("request_order").astype(np.int64)
    if order.size == 0:
        raise InvalidRequest(f"graph {graph.name!r} has an empty request order")
    return order


def map_targets(order: np.ndarray, n: int, offset: int = 0) -> np.ndarray:
    """``order[(offset + i) mod |order|]`` for ``i < n``."""
    return order[(offset + np.arange(n, dtype=np.int64)) % order.size]


def build_stream(
    graph: Any,
    arrivals: np.ndarray,
    hops: int,
    fanouts: Sequence[int] | None = None,
    offset: int = 0,
    repeats: int = 1,
    period_s: float = 0.0,
) -> RequestStream:
    """Map ``arrivals`` onto the graph's request order and attach k-hop sets
    (``repeats`` > 1: ``arrivals`` is one period of ``period_s`` seconds,
    played that many times; see :class:`RequestStream`)."""
    order = request_order(graph)
    targets = map_targets(order, len(arrivals), offset)
    if repeats > 1:  # every vertex the longer stream asks for (the order repeats)
        asked = map_targets(order, min(len(arrivals) * repeats, order.size), offset)
        uniq = np.unique(asked)
        inverse = np.searchsorted(uniq, targets)
    else:
        uniq, inverse = np.unique(targets, return_inverse=True)
    sets = khop_sets(graph, uniq, hops, fanouts)
    return RequestStream(np.asarray(arrivals, dtype=np.float64), targets, inverse, sets,
                         repeats=max(int(repeats), 1), period_s=float(period_s),
                         order=order, offset=int(offset))  # fmt: skip
