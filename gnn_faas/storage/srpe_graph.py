"""The computation graph of precomputed-embedding serving (OMEGA's SRPE, §5.2).

For queries ``Q`` (a request's targets, stored or new) and a model of ``L``
layers, SRPE reads the stored embeddings ``p_u^(l)`` of the queries' direct
in-neighbours instead of recomputing their neighbourhoods, and recomputes only a
budget ``γ`` of them, the candidates ``C = N(Q) \\ Q``, chosen by a
:mod:`~gnn_faas.storage.recompute_policy`:

- vertices ``nodes = [Q, R, B]``: the queries (the requested targets, then any
  other new vertex of the request), the recomputed candidates ``R``, and the
  boundary ``B = (N(Q) ∪ N(R)) \\ (Q ∪ R)``;
- layer ``l < L`` computes ``h^(l)`` of ``Q ∪ R`` (the first ``|Q| + |R|`` rows)
  from ``Q ∪ R ∪ B``: rows of ``B`` are ``p^(l-1)`` read from the store (the input
  features at ``l = 1``); layer ``L`` computes ``Q`` only;
- neighbourhoods are full and include the request's added edges.

``from_state`` (a 2-layer model): a recomputed candidate's layer 1 comes from its
stored aggregate state plus the request's changed terms (:class:`StateDelta`;
its list in the graph is then empty), exactly. With ``R = C`` and ``L <= 3`` the
answer equals exact serving; with ``R = ∅`` every candidate's stored embedding is
reused. :class:`SrpeGraph` has the interface of a
:class:`~gnn_faas.storage.computation_graph.ComputationGraph` the layer drivers
use, plus ``boundary`` (:func:`extend_sources` appends its stored rows). Why
these hold: docs/design/srpe-graph.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from gnn_faas.errors import InvalidRequest
from gnn_faas.storage.computation_graph import Block
from gnn_faas.storage.overlay import GraphOverlay, merge_segments
from gnn_faas.storage.recompute_policy import CandidateScores, select_recomputed

if TYPE_CHECKING:  # pragma: no cover - avoids an import cycle
    from gnn_faas.storage.fetcher import KHopFetcher


@dataclass(frozen=True)
class StateDelta:
    """Layer 1's changed terms of each recomputed candidate (``from_state``).

    Row ``r`` (the candidate ``recomputed[r]``, local id ``num_queries + r``)
    lists ``src[indptr[r]:indptr[r+1]]`` (local ids): ``added`` entries are the
    request's added in-edges; the others are stored in-neighbours (self loops
    excluded) whose GCN degree (self loops excluded) the request changed, by
    ``degree_change`` (their stored degree is the graph's ``in_degree`` minus
    it). ``stored_count``: each candidate's
    stored in-edges (self loops included), the count its stored state sums."""

    indptr: np.ndarray
    src: np.ndarray
    added: np.ndarray
    degree_change: np.ndarray
    stored_count: np.ndarray


@dataclass(frozen=True)
class SrpeGraph:
    """See the module docstring. ``num_queries = |Q|``, ``num_computed = |Q| +
    |R|``; ``indptr``/``indices``: in-neighbour CSR of the computed rows (local
    source ids over all nodes); ``candidates``: ``C`` (global ids, with their
    scores), ``recomputed``: ``R`` (global ids)."""

    nodes: np.ndarray
    num_queries: int
    num_computed: int
    num_layers: int
    indptr: np.ndarray
    indices: np.ndarray
    target_index: np.ndarray
    in_degree: np.ndarray
    candidates: CandidateScores
    recomputed: np.ndarray
    delta: StateDelta | None = None  # from_state: layer 1 of R from stored states
    stale_recomputed: int = 0  # candidates recomputed because their stored embedding is stale

    @property
    def layer_sizes(self) -> tuple[int, ...]:
        """Rows computed per layer (``[0]``: all source rows), as a ComputationGraph's."""
        mid = (self.num_computed,) * (self.num_layers - 1)
        return (int(self.nodes.size),) + mid + (self.num_queries,)

    @property
    def targets(self) -> np.ndarray:
        return self.nodes[: self.num_queries]

    @property
    def input_nodes(self) -> np.ndarray:
        return self.nodes

    @property
    def boundary(self) -> np.ndarray:
        """Vertices whose rows come from the store at every layer ``l >= 2``."""
        return self.nodes[self.num_computed :]

    def block(self, layer: int) -> Block:
        if not 1 <= layer <= self.num_layers:
            raise IndexError(f"layer must be in 1..{self.num_layers}, got {layer}")
        n_dst = self.num_queries if layer == self.num_layers else self.num_computed
        indptr = self.indptr[: n_dst + 1]
        return Block(n_dst, int(self.nodes.size), indptr, self.indices[: indptr[-1]])

    def blocks(self) -> list[Block]:
        return [self.block(layer) for layer in range(1, self.num_layers + 1)]

    def aggregated_rows(self) -> int:
        return int(sum(self.layer_sizes[1:]))

    def state_block(self) -> Block:
        """Layer 1 of a graph built ``from_state`` as a memory function gets it:
        the queries' lists, then each recomputed row listing its changed terms
        (``delta.src``, in order), so a partition of the rows ships those
        terms' input rows with it and is sized with them."""
        d = self.delta
        if d is None:
            raise InvalidRequest("the SRPE graph was not built from stored states")
        nq = self.num_queries
        base = int(self.indptr[nq])  # the recomputed rows' own lists are empty
        indptr = np.concatenate((self.indptr[: nq + 1], base + d.indptr[1:])).astype(np.int64)
        indices = np.concatenate((self.indices[:base], d.src)).astype(np.int64)
        return Block(self.num_computed, int(self.nodes.size), indptr, indices)

    def state_terms(self, start: int, stop: int) -> dict[str, np.ndarray]:
        """The stored-state terms of layer 1's destination rows ``[start, stop)``
        (of :meth:`state_block`): the recomputed ones among them are its last
        rows. Tensors ``state_ids`` (their global ids), ``state_count``
        (stored in-edges), and per entry of their lists ``state_added``,
        ``state_degree_change`` (:class:`StateDelta`); empty when none is."""
        d = self.delta
        if d is None:
            raise InvalidRequest("the SRPE graph was not built from stored states")
        nq = self.num_queries
        a, b = max(start, nq) - nq, max(stop, nq) - nq
        a = min(a, b)
        lo, hi = int(d.indptr[a]), int(d.indptr[b])
        return {
            "state_ids": np.asarray(self.recomputed[a:b], np.int64),
            "state_count": np.asarray(d.stored_count[a:b], np.int64),
            "state_added": np.asarray(d.added[lo:hi], bool),
            "state_degree_change": np.asarray(d.degree_change[lo:hi], np.int64),
        }


def extend_sources(
    cg, layer: int, h: np.ndarray | None, embeddings: Callable[[int, np.ndarray], np.ndarray] | None
) -> np.ndarray | None:
    """Source rows of ``layer``: ``h`` (the previous layer's output) and, for an
    :class:`SrpeGraph` at ``layer >= 2``, the boundary's stored ``p^(layer-1)``
    below it. Anything else passes through."""
    if h is None or not isinstance(cg, SrpeGraph) or layer < 2:
        return h
    if embeddings is None:
        raise InvalidRequest("precomputed serving needs the stored embeddings")
    if cg.boundary.size == 0:
        return h
    return np.concatenate((h, embeddings(layer - 1, cg.boundary)))


def build_srpe_graph(
    fetcher: KHopFetcher,
    targets: np.ndarray,
    num_layers: int,
    budget: float,
    policy: str = "query_edge_ratio",
    overlay: GraphOverlay | None = None,
    seed: int = 0,
    from_state: bool = False,
    stale: np.ndarray | None = None,
) -> SrpeGraph | None:
    """The SRPE graph of ``targets`` (global ids, repeats allowed) with a
    recomputation budget ``budget`` (a share of the candidates, in [0, 1]).

    Three batched reads: the queries' in-neighbours, the recomputed
    candidates' in-neighbours, the in-degrees of candidates and boundary.
    ``from_state`` (2-layer models): the recomputed candidates' layer 1 comes
    from their stored aggregate states (:class:`StateDelta`), so their
    in-neighbours join the graph only where the request changed a term.
    ``stale`` (sorted ids): vertices whose stored embeddings a graph update made
    stale; every such candidate is recomputed from its neighbourhood, whatever
    the budget, so no stale embedding is ever read. With more than two layers a
    stale vertex on the boundary would be read too: then ``None`` (the caller
    serves the request exactly).
    """
    if num_layers < 1:
        raise InvalidRequest("precomputed serving needs a model of at least one layer")
    if from_state and num_layers != 2:
        raise InvalidRequest("recomputing from stored states needs a 2-layer model")
    if not 0.0 <= budget <= 1.0:
        raise InvalidRequest(f"recompute budget must lie in [0, 1], got {budget}")
    t = fetcher.check_ids(np.asarray(targets), "targets", overlay)
    if t.size == 0:
        raise InvalidRequest("targets must not be empty")
    queries, target_index = _queries(t, overlay)
    cq, nq, cand, deg_c, scores = _candidates(fetcher, queries, overlay)
    recomputed, forced = _with_stale(select_recomputed(scores, budget, policy, seed), cand, stale)
    if forced:
        from_state = False  # a stale candidate's stored state is stale too

    delta = None
    if from_state:
        rows_d, src_d, added_d, change_d, stored_count = _state_terms(fetcher, recomputed, overlay)
        c_r, n_r = np.zeros(recomputed.size, np.int64), np.zeros(0, np.int64)
        extra = src_d
    else:
        c_r, n_r = fetcher.neighbours(recomputed, overlay)
        extra = n_r
    computed = np.concatenate((queries, recomputed))
    others = np.unique(np.concatenate((nq, extra)))
    boundary = others[~np.isin(others, computed)]
    if stale is not None and num_layers > 2 and np.isin(boundary, stale).any():
        return None
    nodes = np.concatenate((computed, boundary))
    order = np.argsort(nodes, kind="stable")

    def local(ids: np.ndarray) -> np.ndarray:
        return order[np.searchsorted(nodes, ids, sorter=order)]

    counts = np.concatenate((cq, c_r))
    indptr = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
    indices = local(np.concatenate((nq, n_r))).astype(np.int64)
    # boundary degrees: the candidates' are known; one more read for the rest
    deg_b = np.zeros(boundary.size, np.int64)
    pos_b = np.searchsorted(cand, boundary)
    known = (pos_b < cand.size) & (cand[np.minimum(pos_b, max(cand.size - 1, 0))] == boundary)
    deg_b[known] = deg_c[pos_b[known]]
    if (~known).any():
        deg_b[~known] = fetcher.gcn_degrees(boundary[~known], overlay)
    # computed rows: their lists are at hand, so their self loops are counted there
    lists = np.concatenate((nq, n_r))
    owner = np.repeat(np.arange(computed.size), counts)
    loops = np.bincount(owner[lists == computed[owner]], minlength=computed.size)
    in_degree = np.concatenate((counts - loops, deg_b)).astype(np.int64)
    if from_state:
        # the recomputed rows' lists are not in the graph: their degrees are the candidates'
        in_degree[queries.size : computed.size] = deg_c[np.searchsorted(cand, recomputed)]
        delta = StateDelta(
            indptr=np.concatenate(([0], np.cumsum(np.bincount(rows_d, minlength=recomputed.size)))),
            src=local(src_d).astype(np.int64),
            added=added_d,
            degree_change=change_d,
            stored_count=stored_count,
        )  # fmt: skip
    return SrpeGraph(
        nodes=nodes,
        num_queries=int(queries.size),
        num_computed=int(computed.size),
        num_layers=int(num_layers),
        indptr=indptr,
        indices=indices,
        target_index=target_index,
        in_degree=in_degree,
        candidates=scores,
        recomputed=recomputed,
        delta=delta,
        stale_recomputed=forced,
    )


def _with_stale(
    recomputed: np.ndarray, cand: np.ndarray, stale: np.ndarray | None
) -> tuple[np.ndarray, int]:
    """``recomputed`` plus every candidate whose stored embedding is stale, and
    how many those are."""
    if stale is None or stale.size == 0 or cand.size == 0:
        return recomputed, 0
    must = cand[np.isin(cand, stale, assume_unique=True)]
    if must.size == 0:
        return recomputed, 0
    return np.union1d(recomputed, must), int(must.size)


def _queries(t: np.ndarray, overlay: GraphOverlay | None) -> tuple[np.ndarray, np.ndarray]:
    """``(queries, target_index)``: the distinct targets in order of first
    appearance (then the overlay's new vertices not requested), and each
    target's row among them."""
    uniq, first, inverse = np.unique(t, return_index=True, return_inverse=True)
    by_first = np.argsort(first, kind="stable")
    queries = uniq[by_first]
    rank = np.empty_like(by_first)
    rank[by_first] = np.arange(by_first.size)
    target_index = rank[inverse].astype(np.int64)
    if overlay is not None:
        # every new vertex is a query (OMEGA's query batch): it has no stored
        # embedding to reuse; those not requested follow the requested ones
        extra = overlay.new_ids[~np.isin(overlay.new_ids, queries)]
        queries = np.concatenate((queries, extra))
    return queries, target_index


def _candidates(
    fetcher: KHopFetcher, queries: np.ndarray, overlay: GraphOverlay | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, CandidateScores]:
    """``(cq, nq, cand, deg_c, scores)``: the queries' in-neighbour lists
    (counts, ids), the candidates (in-neighbours that are not queries), their
    GCN degrees and the scores the recompute policy ranks them by."""
    # the queries' in-neighbours: stored lists (stored queries) then added edges
    n_stored = fetcher.num_nodes  # the version's vertices (beyond: a request's new ones)
    stored_q = queries < n_stored
    c_s = np.zeros(queries.size, np.int64)
    c_s[stored_q], n_s = fetcher.neighbours(queries[stored_q])
    if overlay is not None:
        c_o, n_o = overlay.in_edges(queries)
    else:
        c_o, n_o = np.zeros(queries.size, np.int64), np.zeros(0, np.int64)
    cq, nq = merge_segments(c_s, n_s, c_o, n_o)
    in_q = np.isin(nq, queries)
    cand = np.unique(nq[~in_q])

    # |N_Q(u)|: in-edges of u from the queries. Added edges are exact; stored
    # ones are the reverse of the queries' stored lists (exact on symmetrised
    # graphs, the in-edge direction otherwise).
    pos_s = np.searchsorted(cand, n_s)
    hit_s = (pos_s < cand.size) & (cand[np.minimum(pos_s, max(cand.size - 1, 0))] == n_s)
    nq_count = np.bincount(pos_s[hit_s], minlength=cand.size).astype(np.float64)
    if overlay is not None and cand.size:
        c_u, src_u = overlay.in_edges(cand)
        owner = np.repeat(np.arange(cand.size), c_u)
        from_q = np.isin(src_u, queries)
        nq_count += np.bincount(owner[from_q], minlength=cand.size)
    deg_c = fetcher.gcn_degrees(cand, overlay)  # self loops excluded (PyG gcn_norm)
    # importance: u's weight in the queries' mean aggregates, sum_q 1 / |N(q)|
    owner_q = np.repeat(np.arange(queries.size), cq)
    w = 1.0 / np.maximum(cq[owner_q], 1)
    pos = np.searchsorted(cand, nq)
    ok = ~in_q
    importance = np.bincount(pos[ok], weights=w[ok], minlength=cand.size)
    scores = CandidateScores(
        ids=cand,
        query_edges=nq_count,
        degree=deg_c,
        importance=importance,
    )
    return cq, nq, cand, deg_c, scores


def _state_terms(
    fetcher: KHopFetcher, recomputed: np.ndarray, overlay: GraphOverlay | None
) -> tuple[np.ndarray, ...]:
    """``(row, src, added, degree_change, stored_count)`` of :class:`StateDelta`,
    entries sorted by row, ``src`` global ids: each candidate's added
    in-edges, and its stored in-neighbours (self loops excluded) whose degree
    (self loops excluded) the overlay changes. One batched read: the
    candidates' stored lists (the degrees' changes come from the overlay)."""
    c_s, n_s = fetcher.neighbours(recomputed)  # stored lists only
    owner = np.repeat(np.arange(recomputed.size), c_s)
    if overlay is None:
        c_a, n_a = np.zeros(recomputed.size, np.int64), np.zeros(0, np.int64)
        changed, change = np.zeros(0, np.int64), np.zeros(0, np.int64)
    else:
        c_a, n_a = overlay.in_edges(recomputed)
        nbrs = np.unique(n_s[n_s != recomputed[owner]])
        touched = nbrs[overlay.in_degree(nbrs) > 0]
        # the overlay's change of a degree without self loops: no store read
        change_all = overlay.in_degree(touched) - overlay.self_loops(touched)
        moved = change_all != 0
        changed, change = touched[moved], change_all[moved]
    hit = np.isin(n_s, changed) & (n_s != recomputed[owner])
    rows = np.concatenate((owner[hit], np.repeat(np.arange(recomputed.size), c_a)))
    src = np.concatenate((n_s[hit], n_a))
    added = np.concatenate((np.zeros(int(hit.sum()), bool), np.ones(n_a.size, bool)))
    change_hit = change[np.searchsorted(changed, n_s[hit])]
    degree_change = np.concatenate((change_hit, np.zeros(n_a.size, np.int64)))
    order = np.argsort(rows, kind="stable")
    return rows[order], src[order], added[order], degree_change[order], c_s.astype(np.int64)
