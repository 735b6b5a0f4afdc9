"""Locality-aware vertex renumbering at ingest, and the user-id map it needs.

A k-hop fetch reads, per hop, the indptr entries and feature rows of a set of
vertices: every maximal run of consecutive ids is one contiguous range (one
request on S3, one seek on a file). Renumbering the vertices so that the
neighbours of a vertex get nearby ids turns many small ranges into a few long
ones. Orders (``ingest --reorder``):

- ``rcm``: reverse Cuthill-McKee of the symmetrised pattern
  (``scipy.sparse.csgraph.reverse_cuthill_mckee``): a bandwidth-reducing BFS
  that visits neighbours in increasing degree, reversed.
- ``bfs``: breadth-first order from the highest-degree vertex of each
  connected component (largest components first).
- ``degree``: decreasing total degree (hubs, which are in most neighbourhoods,
  share a few ranges at the front).
- ``community``: communities found by label propagation on the symmetrised
  pattern (:func:`communities`), one after the other (largest first), each by
  decreasing degree: a neighbourhood mostly lies in its vertex's community,
  and there the hubs, which most neighbourhoods include, share one range.
- ``none``: the ids as ingested.

:func:`ranges_per_neighbourhood` measures an order: the number of contiguous
id runs of the k-hop vertex sets of sampled vertices. Mean ranges per 2-hop
neighbourhood of 200 random vertices (none / rcm / bfs / degree):

- Bitcoin OTC (5,881 vertices):          229 / 157 / 146 / 196
- Cora (2,708):                           36 /  16 /  13 /  37
- higgs-twitter-like, scale 0.02 (9,133): 1382 / 1121 / 1135 / 1295
- stackoverflow-like, scale 0.005:        1105 /  901 /  919 / 1047

``bfs`` gives the fewest ranges on the two real graphs (-36%, -64%) and is
within 2% of ``rcm`` on the synthetic ones (whose Chung-Lu edges have little
locality to find): ``bfs`` is the recommended order.

Ids in requests and answers stay the user's: the store keeps ``user_ids.bin``
(int64 ``[n]``: the user id of each stored vertex, i.e. the id the vertex
would have had without renumbering); :class:`IdMap` maps request ids to
stored ids at the gateway's parse step. Every per-vertex blob (features,
labels, degree, node_ids) is in stored order.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from scipy.sparse import csgraph

from gnn_faas.errors import InvalidRequest

REORDERS = ("none", "rcm", "bfs", "degree", "community")
# label propagation: rounds at most, and the share of vertices whose change
# still counts as movement (below it the labels have settled)
LPA_ROUNDS = 30
LPA_SETTLED = 1e-3


def _pattern(indptr: np.ndarray, indices: np.ndarray, n: int) -> sp.csr_matrix:
    data = np.ones(indices.size, np.int8)
    return sp.csr_matrix((data, np.asarray(indices), np.asarray(indptr)), shape=(n, n))


def _symmetric(a: sp.csr_matrix) -> sp.csr_matrix:
    s = (a + a.T).tocsr()
    s.data[:] = 1
    return s


def reorder_permutation(indptr: np.ndarray, indices: np.ndarray, method: str) -> np.ndarray:
    """``order`` with ``order[new] = old``: the old id of each new (stored) id."""
    n = int(np.asarray(indptr).size - 1)
    if method not in REORDERS:
        raise InvalidRequest(f"--reorder must be one of {', '.join(REORDERS)}, not {method!r}")
    if method == "none" or n == 0:
        return np.arange(n, dtype=np.int64)
    a = _pattern(indptr, indices, n)
    if method == "degree":
        deg = np.diff(a.indptr) + np.bincount(a.indices, minlength=n)
        return np.argsort(-deg, kind="stable").astype(np.int64)
    s = _symmetric(a)
    if method == "community":
        comm = communities(s)
        size = np.bincount(comm)
        deg = np.diff(s.indptr)
        return np.lexsort((-deg, comm, -size[comm])).astype(np.int64)
    if method == "rcm":
        return csgraph.reverse_cuthill_mckee(s, symmetric_mode=True).astype(np.int64)
    return _bfs_order(s)


def communities(s: sp.csr_matrix, seed: int = 0) -> np.ndarray:
    """Community of each vertex of the symmetric pattern ``s``, by label propagation.

    Every vertex starts in its own community; each round, a random half of
    the vertices (semi-synchronous: a synchronous round oscillates on
    two-coloured structures) take the label most frequent among their
    neighbours, ties broken at random, until fewer than ``LPA_SETTLED`` of the
    vertices change or ``LPA_ROUNDS`` rounds. A round counts (vertex, label)
    pairs by one sort of the edge list (``np.unique``), never a loop per
    vertex. Raghavan, Albert and Kumara (2007), near-linear time. Measured
    on planted partitions (homophily 0.8, 8 communities): at higgs-twitter-like
    ``--scale 0.01`` it finds them with purity >= 0.8 (tested); at full size
    hubs, which neighbour every community, carry one label into several (3 of
    the 8 found, 5 merged, purity 0.50), still enough to cut the storage
    requests of a 2-hop fetch by 18% against bfs (README). Votes weighted by
    ``1 / deg`` found all 8 at the small scale but split the full-size graph
    into 46,756 communities of at most 57 vertices (more requests than bfs):
    the votes stay unweighted.
    """
    n = s.shape[0]
    rng = np.random.default_rng(seed)
    labels = np.arange(n, dtype=np.int64)
    rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(s.indptr))
    cols = np.asarray(s.indices, dtype=np.int64)
    for _ in range(LPA_ROUNDS):  # a loop over rounds, each on whole arrays
        pairs, counts = np.unique(rows * n + labels[cols], return_counts=True)
        r, lab = pairs // n, pairs % n
        order = np.lexsort((rng.random(r.size), -counts, r))
        best = order[np.concatenate(([True], r[order][1:] != r[order][:-1]))]
        move = best[rng.random(best.size) < 0.5]
        new = labels.copy()
        new[r[move]] = lab[move]
        changed = int(np.count_nonzero(new != labels))
        labels = new
        if changed < LPA_SETTLED * n:
            break
    return np.unique(labels, return_inverse=True)[1].astype(np.int64)


def _bfs_order(s: sp.csr_matrix) -> np.ndarray:
    n = s.shape[0]
    ncomp, comp = csgraph.connected_components(s, directed=False)
    deg = np.diff(s.indptr)
    sizes = np.bincount(comp, minlength=ncomp)
    # root of each component: its highest-degree vertex
    by = np.lexsort((-deg, comp))
    roots = by[np.searchsorted(comp[by], np.arange(ncomp))]
    big = np.flatnonzero(sizes > 2)
    parts = []
    for c in big[np.argsort(-sizes[big], kind="stable")]:  # a loop over components
        parts.append(csgraph.breadth_first_order(s, int(roots[c]), return_predecessors=False))
    small = np.flatnonzero(sizes[comp] <= 2)  # isolated vertices and pairs: as they come
    order = np.concatenate(parts + [small]).astype(np.int64)
    assert order.size == n
    return order


def permute_csr(
    indptr: np.ndarray, indices: np.ndarray, order: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The in-edge CSR with vertex ``order[i]`` renamed ``i`` (rows sorted)."""
    n = order.size
    a = _pattern(indptr, indices, n)
    p = a[order][:, order].tocsr()
    p.sort_indices()
    return p.indptr.astype(np.int64), p.indices.astype(np.asarray(indices).dtype)


def khop_sets(
    indptr: np.ndarray, indices: np.ndarray, targets: np.ndarray, hops: int
) -> sp.csr_matrix:
    """Row ``i``: the vertices within ``hops`` in-hops of ``targets[i]`` (sorted)."""
    n = int(np.asarray(indptr).size - 1)
    a = _pattern(indptr, indices, n).astype(np.int32)
    t = np.asarray(targets, np.int64)
    reach = sp.csr_matrix((np.ones(t.size, np.int32), (np.arange(t.size), t)), shape=(t.size, n))
    frontier = reach
    for _ in range(hops):
        frontier = frontier @ a
        frontier.data[:] = 1
        reach = reach + frontier
    reach = reach.tocsr()
    reach.sort_indices()
    return reach


def ranges_per_neighbourhood(
    indptr: np.ndarray, indices: np.ndarray, targets: np.ndarray, hops: int = 2
) -> np.ndarray:
    """Contiguous id runs of each target's ``hops``-hop vertex set (int64 per target)."""
    r = khop_sets(indptr, indices, targets, hops)
    cols = r.indices.astype(np.int64)
    same_row = np.repeat(np.arange(r.shape[0]), np.diff(r.indptr))
    gap = np.ones(cols.size, bool)
    gap[1:] = (np.diff(cols) != 1) | (same_row[1:] != same_row[:-1])
    return np.bincount(same_row[gap], minlength=r.shape[0]).astype(np.int64)


class IdMap:
    """User ids <-> stored ids of a renumbered graph.

    ``user_ids[s]`` is the user id of stored vertex ``s``; ids at or beyond
    ``n`` (new vertices of a request) are the same in both numberings.
    """

    def __init__(self, user_ids: np.ndarray):
        self.user_ids = np.asarray(user_ids, np.int64)
        self.n = self.user_ids.size
        self.stored_ids = np.empty(self.n, np.int64)
        self.stored_ids[self.user_ids] = np.arange(self.n)

    @classmethod
    def of(cls, graph) -> IdMap | None:
        """The graph's map, or None when it was not renumbered."""
        return cls(graph.read_blob("user_ids")) if graph.has("user_ids") else None

    def _map(self, ids: np.ndarray, table: np.ndarray) -> np.ndarray:
        ids = np.asarray(ids)
        out = ids.astype(np.int64, copy=True)
        inside = (out >= 0) & (out < self.n)
        out[inside] = table[out[inside]]
        return out

    def to_stored(self, ids: np.ndarray) -> np.ndarray:
        return self._map(ids, self.stored_ids)

    def to_user(self, ids: np.ndarray) -> np.ndarray:
        return self._map(ids, self.user_ids)
