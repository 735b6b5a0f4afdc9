"""Locality-aware vertex renumbering at ingest, and the user-id map it needs.

A k-hop fetch reads one contiguous range (one S3 request, one seek) per maximal
run of consecutive ids; renumbering so that neighbours get nearby ids turns many
small ranges into a few long ones. Orders (``ingest --reorder``):

- ``rcm``: reverse Cuthill-McKee of the symmetrised pattern;
- ``bfs``: breadth-first from the highest-degree vertex of each connected
  component (largest first): the recommended order for graphs without communities;
- ``degree``: decreasing total degree;
- ``community``: Louvain communities of the symmetrised pattern (:func:`communities`)
  one after the other, in each its top ``HUB_SHARE`` by degree first, then the rest
  in bfs order (:func:`community_order`);
- ``none``: the ids as ingested.

:func:`ranges_per_neighbourhood` measures an order (contiguous id runs of sampled
vertices' k-hop sets). Ids in requests and answers stay the user's: the store keeps
``user_ids.bin`` (int64 ``[n]``: each stored vertex's user id) and :class:`IdMap`
maps request ids to stored ids at the gateway's parse step; every per-vertex blob
is in stored order. What each order measured, and how ``HUB_SHARE`` was picked:
docs/design/reordering.md.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from gnn_faas.errors import InvalidRequest

REORDERS = ("none", "rcm", "bfs", "degree", "community")
# Louvain (communities): levels at most, rounds of moves per level at most,
# the share of a level's vertices whose move still counts as movement (below
# it the level has settled), the share of the vertices that would gain that
# move in one round, and the edges scored at once (bounds the temporaries)
LOUVAIN_LEVELS = 32
LOUVAIN_ROUNDS = 50
LOUVAIN_SETTLED = 1e-3
MOVE_SHARE = 0.5
SCORE_BLOCK = 1 << 21
# community order: the share of each community laid out by degree before the rest
HUB_SHARE = 0.2


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
        w, loops = _weighted(s)  # float64 CSR: also what csgraph's BFS takes without a copy
        del s
        return community_order(w, _louvain(w, loops))
    if method == "rcm":
        from scipy.sparse import csgraph  # (lazy: it loads scipy.linalg, ~0.1 s)

        return csgraph.reverse_cuthill_mckee(s, symmetric_mode=True).astype(np.int64)
    return _bfs_order(s)


def communities(s: sp.csr_matrix, seed: int = 0) -> np.ndarray:
    """Community of each vertex of the symmetric pattern ``s`` (ids ``0..C-1``).

    Louvain's modularity optimisation (Blondel, Guillaume, Lambiotte and
    Lefebvre 2008) on whole arrays. A level moves vertices between
    communities to raise the modularity
    ``Q = sum_c [in_c / 2m - (vol_c / 2m)^2]``, then merges each community into
    one vertex (edge weights summed, internal edges a self loop) and starts
    again, until a level merges nothing. Moving ``i`` into community ``c``
    changes ``Q`` by ``(k_ic - k_i vol_c / 2m) / m`` up to a term of its own
    community (``k_ic``: weight of ``i``'s edges into ``c``; ``k_i``, ``vol_c``:
    degrees): the penalty ``k_i vol_c / 2m`` is what plain label propagation
    lacks. There a label is adopted by counting neighbours, so a hub, whose
    neighbours lie in every community, carries one label into all of them:
    on full-size higgs-twitter-like (8 planted communities, homophily 0.8)
    unweighted votes merged 5 of the 8 (purity 0.50), and votes weighted
    ``1 / deg``, which stop the hubs, split it into 46,756 communities of at
    most 57 vertices. A community that spans two planted ones pays for the
    volume of both, so the hubs cannot merge them; and merging levels lift
    the small groups the first level forms into the communities they belong
    to. Measured there: all 8 found, purity 1.0, the planted partition's
    modularity (0.683), in about a minute.

    A round scores, for every vertex at once, each community its neighbours
    are in (one sort of the edge list's (vertex, community) pairs, a block of
    ``SCORE_BLOCK`` edges at a time so the temporaries stay bounded), and a
    random ``MOVE_SHARE`` of the vertices that gain move (all moving at once,
    each planning with the others' old communities, oscillates; ties are
    broken at random). A level ends when fewer than ``LOUVAIN_SETTLED`` of its
    vertices move, or after ``LOUVAIN_ROUNDS`` rounds. Seeded: the same graph
    and seed give the same communities.
    """
    return _louvain(*_weighted(s), seed=seed)


def _louvain(w: sp.csr_matrix, loops: np.ndarray, seed: int = 0) -> np.ndarray:
    """:func:`communities` of the weighted graph ``w`` (no diagonal) with self loops ``loops``."""
    n = w.shape[0]
    rng = np.random.default_rng(seed)
    member = np.arange(n, dtype=np.int64)
    for _ in range(LOUVAIN_LEVELS):  # a loop over levels, each on whole arrays
        labels = _local_moves(w, loops, rng)
        size = int(labels.max()) + 1 if labels.size else 0
        if size == w.shape[0]:
            break
        member = labels[member]
        w, loops = _merge(w, loops, labels, size)
    return np.unique(member, return_inverse=True)[1].astype(np.int64)


def _local_moves(w: sp.csr_matrix, loops: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One Louvain level: every vertex of ``w`` (weighted, no diagonal; its
    self-loop weights in ``loops``) starts alone; rounds move the vertices that
    gain modularity (a random ``MOVE_SHARE`` of them). Compact labels."""
    n = w.shape[0]
    k = np.asarray(w.sum(axis=1)).ravel() + loops
    two_m = float(k.sum())
    labels = np.arange(n, dtype=np.int64)
    if two_m == 0:
        return labels
    for _ in range(LOUVAIN_ROUNDS):  # a loop over rounds, each on whole arrays
        vol = np.bincount(labels, weights=k, minlength=n)
        best, gain = _best_moves(w, k, labels, vol, two_m, rng)
        # weights are whole numbers at the first level and sums of them after:
        # a real gain is at least 1 / 2m, below it is rounding or a tie
        movers = np.flatnonzero((best != labels) & (gain > 0.5 / two_m))
        movers = movers[rng.random(movers.size) < MOVE_SHARE]
        labels[movers] = best[movers]
        if movers.size < LOUVAIN_SETTLED * n:
            break
    return np.unique(labels, return_inverse=True)[1].astype(np.int64)


def _best_moves(
    w: sp.csr_matrix,
    k: np.ndarray,
    labels: np.ndarray,
    vol: np.ndarray,
    two_m: float,
    rng: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray]:
    """Per vertex: the community of its neighbours that scores highest
    (``k_ic - k_i vol_c / 2m``, its own community without itself), and how much
    that beats staying. Scored a block of about ``SCORE_BLOCK`` edges at a time."""
    n = w.shape[0]
    best = labels.copy()
    gain = np.zeros(n)
    at = np.searchsorted(w.indptr, np.arange(SCORE_BLOCK, w.nnz, SCORE_BLOCK))
    cuts = np.unique(np.concatenate(([0], at, [n])))  # rows whole
    for r0, r1 in zip(cuts[:-1].tolist(), cuts[1:].tolist()):  # a loop over blocks of rows
        lo, hi = w.indptr[r0], w.indptr[r1]
        # copies: sum_duplicates sorts and compacts the arrays it is given in place
        m = sp.csr_matrix(
            (w.data[lo:hi].copy(), labels[w.indices[lo:hi]], w.indptr[r0 : r1 + 1] - lo),
            shape=(r1 - r0, n),
        )
        m.sum_duplicates()
        rows = np.repeat(np.arange(r0, r1), np.diff(m.indptr))
        own = m.indices == labels[rows]
        kr = k[rows]
        score = m.data - kr * (vol[m.indices] - np.where(own, kr, 0.0)) / two_m
        stay = -k[r0:r1] * (vol[labels[r0:r1]] - k[r0:r1]) / two_m
        stay[rows[own] - r0] = score[own]
        # ties at random: the noise is below any real difference (1 / 2m)
        noisy = score + rng.random(score.size) * (0.25 / two_m)
        full = np.flatnonzero(np.diff(m.indptr))
        if full.size == 0:
            continue
        top = np.maximum.reduceat(noisy, m.indptr[full])
        at = np.flatnonzero(noisy == np.repeat(top, np.diff(m.indptr)[full]))
        first = at[np.concatenate(([True], rows[at][1:] != rows[at][:-1]))]
        best[rows[first]] = m.indices[first]
        gain[rows[first]] = score[first] - stay[rows[first] - r0]
    return best, gain


def _weighted(s: sp.csr_matrix) -> tuple[sp.csr_matrix, np.ndarray]:
    """The symmetric pattern ``s`` as a weighted graph (weight 1 an edge, float64)
    without its diagonal, and each vertex's self loops (built from the CSR
    arrays: no copy of the edge list as coordinates)."""
    n = s.shape[0]
    counts = np.diff(s.indptr)
    on = s.indices == np.repeat(np.arange(n, dtype=s.indices.dtype), counts)
    loops = (s.diagonal() != 0).astype(np.float64)  # a pattern: no duplicates
    off = ~on
    indptr = np.concatenate(([0], np.cumsum(counts - loops.astype(np.int64))))
    w = sp.csr_matrix((np.ones(indptr[-1]), s.indices[off], indptr), shape=(n, n))
    return w, loops


def _merge(
    w: sp.csr_matrix, loops: np.ndarray, labels: np.ndarray, size: int
) -> tuple[sp.csr_matrix, np.ndarray]:
    """The graph of the communities ``labels`` of ``w``: the weights between two
    communities summed (``C^T W C``, ``C`` the membership matrix: sparse
    products, never the edge list as coordinates), the weight inside each
    (both directions, as modularity counts it) plus its members' self loops
    as its self loop."""
    n = w.shape[0]
    c = sp.csr_matrix((np.ones(n), labels, np.arange(n + 1)), shape=(n, size))
    a = (c.T @ (w @ c)).tocsr()
    inner = a.diagonal() + np.bincount(labels, weights=loops, minlength=size)
    rows = np.repeat(np.arange(size), np.diff(a.indptr))
    off = a.indices != rows
    indptr = np.concatenate(([0], np.cumsum(np.bincount(rows[off], minlength=size))))
    return sp.csr_matrix((a.data[off], a.indices[off], indptr), shape=(size, size)), inner


def community_order(s: sp.csr_matrix, comm: np.ndarray) -> np.ndarray:
    """Communities ``comm`` of the symmetric graph ``s`` one after another
    (largest first); in each, its ``HUB_SHARE`` highest-degree vertices first by
    decreasing degree, then the others in breadth-first order (their places in
    :func:`_bfs_order` of the whole graph)."""
    n = s.shape[0]
    size = np.bincount(comm)
    deg = np.diff(s.indptr)
    by_deg = np.lexsort((-deg, comm))
    first = np.searchsorted(comm[by_deg], np.arange(size.size))
    rank = np.empty(n, np.int64)  # rank of each vertex's degree in its community
    rank[by_deg] = np.arange(n) - first[comm[by_deg]]
    hub = rank < HUB_SHARE * size[comm]
    bfs = np.empty(n, np.int64)
    bfs[_bfs_order(s)] = np.arange(n)
    return np.lexsort((np.where(hub, -deg, bfs), ~hub, comm, -size[comm])).astype(np.int64)


def _bfs_order(s: sp.csr_matrix) -> np.ndarray:
    from scipy.sparse import csgraph  # (lazy: see reorder_permutation)

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
