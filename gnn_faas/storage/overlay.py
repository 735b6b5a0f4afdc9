"""Vertices and edges a request adds to a stored graph, never written to it.

Id convention (OIP requests, docs/serving.md, "New-vertex requests"): a graph of ``N``
stored vertices numbers a request's ``n`` new vertices ``N .. N + n - 1``, in
the order of the rows of the request's ``features``. An edge ``(u, v)`` means
``v`` aggregates from ``u`` (``u -> v``, the store's in-edge CSR direction);
on a symmetrised graph every request edge is added in both directions, as the
ingest did with the stored edges.

:class:`GraphOverlay` answers the questions the k-hop fetcher asks of the
stored CSR (in-neighbours, in-degrees, feature rows) for the added part, on
whole arrays: the in-neighbours of a frontier are one ``searchsorted`` over the
added edges sorted by destination.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from gnn_faas.errors import InvalidRequest


@dataclass(frozen=True)
class GraphOverlay:
    """``features``: float32 ``[n, d]``, the rows of ids ``base_nodes + i``;
    ``src``/``dst``: the added edges (global ids, already symmetrised when the
    graph is), sorted by ``dst`` (stable, so request order is kept per row)."""

    base_nodes: int
    features: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    _dst_sorted: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        order = np.argsort(self.dst, kind="stable")
        object.__setattr__(self, "src", np.asarray(self.src, np.int64)[order])
        object.__setattr__(self, "dst", np.asarray(self.dst, np.int64)[order])
        object.__setattr__(self, "_dst_sorted", self.dst)

    @classmethod
    def build(
        cls, base_nodes: int, features: np.ndarray, edges: np.ndarray, symmetrize: bool
    ) -> GraphOverlay:
        """From request tensors: ``features`` ``[n, d]``, ``edges`` ``[m, 2]``
        (``(u, v)``: ``v`` aggregates from ``u``)."""
        feats = np.ascontiguousarray(features, dtype=np.float32)
        e = np.asarray(edges, dtype=np.int64).reshape(-1, 2)
        total = base_nodes + feats.shape[0]
        if e.size and (e.min() < 0 or e.max() >= total):
            raise InvalidRequest(f"edge endpoints must lie in [0, {total})")
        src, dst = e[:, 0], e[:, 1]
        if symmetrize:
            src, dst = np.concatenate((src, dst)), np.concatenate((dst, src))
        return cls(base_nodes, feats, src, dst)

    @property
    def num_new(self) -> int:
        return int(self.features.shape[0])

    @property
    def num_nodes(self) -> int:
        """Stored plus added vertices."""
        return self.base_nodes + self.num_new

    @property
    def new_ids(self) -> np.ndarray:
        return np.arange(self.base_nodes, self.num_nodes, dtype=np.int64)

    def is_new(self, ids: np.ndarray) -> np.ndarray:
        return np.asarray(ids) >= self.base_nodes

    def in_degree(self, vertices: np.ndarray) -> np.ndarray:
        """Added in-edges of each of ``vertices``."""
        v = np.asarray(vertices, dtype=np.int64)
        lo = np.searchsorted(self._dst_sorted, v, side="left")
        hi = np.searchsorted(self._dst_sorted, v, side="right")
        return (hi - lo).astype(np.int64)

    def self_loops(self, vertices: np.ndarray) -> np.ndarray:
        """Added edges ``v -> v`` of each of ``vertices``."""
        v = np.asarray(vertices, dtype=np.int64)
        loops = self.dst[self.src == self.dst]  # sorted: dst is
        return (
            np.searchsorted(loops, v, side="right") - np.searchsorted(loops, v, side="left")
        ).astype(np.int64)

    def in_edges(self, vertices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(counts, concatenated sources)`` of the added in-edges of ``vertices``."""
        v = np.asarray(vertices, dtype=np.int64)
        lo = np.searchsorted(self._dst_sorted, v, side="left")
        hi = np.searchsorted(self._dst_sorted, v, side="right")
        counts = (hi - lo).astype(np.int64)
        total = int(counts.sum())
        if total == 0:
            return counts, np.zeros(0, np.int64)
        starts = np.repeat(lo - (np.cumsum(counts) - counts), counts)
        return counts, self.src[starts + np.arange(total)]

    def rows(self, ids: np.ndarray) -> np.ndarray:
        """Feature rows of new vertex ids (each ``>= base_nodes``)."""
        ids = np.asarray(ids, dtype=np.int64)
        local = ids - self.base_nodes
        if local.size and (local.min() < 0 or local.max() >= self.num_new):
            raise InvalidRequest(
                f"new vertex ids must lie in [{self.base_nodes}, {self.num_nodes})"
            )
        return self.features[local]


def merge_segments(
    counts_a: np.ndarray, values_a: np.ndarray, counts_b: np.ndarray, values_b: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Per-owner concatenation of two segment lists over the same owners
    (owner ``i``: its ``a`` values, then its ``b`` values)."""
    owners = np.concatenate(
        (
            np.repeat(np.arange(counts_a.size), counts_a),
            np.repeat(np.arange(counts_b.size), counts_b),
        )
    )
    values = np.concatenate((values_a, values_b))
    order = np.argsort(owners, kind="stable")
    return (counts_a + counts_b).astype(np.int64), values[order]
