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

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp

from gnn_faas.errors import InvalidRequest
from gnn_faas.storage.fetcher import KHopFetcher


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


def khop_sets(
    graph: Any, vertices: np.ndarray, hops: int, fanouts: Sequence[int] | None = None
) -> KHopSets:
    """k-hop sets of ``vertices`` (unique ids) in ``graph`` (a store handle)."""
    vertices = np.asarray(vertices, dtype=np.int64)
    n = int(graph.num_nodes)
    if fanouts is not None and any(f is not None and f >= 0 for f in fanouts):
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


@dataclass(frozen=True)
class RequestStream:
    """Arrivals with their target vertex and the index of its k-hop set.

    ``targets[i]``: vertex of arrival ``i``; ``set_index[i]``: its row in
    ``sets``; ``sizes[i] = |U_r|``."""

    arrivals: np.ndarray
    targets: np.ndarray
    set_index: np.ndarray
    sets: KHopSets

    @property
    def sizes(self) -> np.ndarray:
        return self.sets.sizes[self.set_index]

    def vertex_set(self, i: int) -> np.ndarray:
        return self.sets.set_of(int(self.set_index[i]))

    def __len__(self) -> int:
        return int(self.arrivals.size)

    def head(self, n: int) -> RequestStream:
        return RequestStream(self.arrivals[:n], self.targets[:n], self.set_index[:n], self.sets)


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
) -> RequestStream:
    """Map ``arrivals`` onto the graph's request order and attach k-hop sets."""
    targets = map_targets(request_order(graph), len(arrivals), offset)
    uniq, inverse = np.unique(targets, return_inverse=True)
    sets = khop_sets(graph, uniq, hops, fanouts)
    return RequestStream(np.asarray(arrivals, dtype=np.float64), targets, inverse, sets)
