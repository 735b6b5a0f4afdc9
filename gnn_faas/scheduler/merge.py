"""Graph sharing: merge the computation graphs of a closed buffer (λGrapher 3.4).

Requests in one buffer overlap; aggregating each request separately repeats the
work for every shared ``(vertex, layer)`` pair. The merged graph aggregates each
pair once:

- vertex ``v`` is in merged ``D_l`` iff it is in ``D_l`` of some request, i.e.
  its merged level is ``max_r level_r(v)`` (level ``l``: in ``D_l``, not in
  ``D_{l+1}``), which is its hop distance to the *union* of the targets;
- its in-edges are those of the request where it reaches that level (sampling
  is per-vertex deterministic, so every request that expands ``v`` at the same
  hop has the same edges; with a smaller fanout at a deeper hop the sample is a
  prefix of the same keyed order, and the union's fetch expands ``v`` at its
  shallowest hop, which is the request we take).

Merged rows ``Σ_l |∪_r D_l^r| <= Σ_r Σ_l |D_l^r|`` (separate rows). The result is
the computation graph the fetcher would return for the concatenated targets,
numbered the same way (targets in order of first request, then each hop's new
vertices by id), without reading storage again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gnn_faas.errors import InvalidRequest
from gnn_faas.storage.computation_graph import ComputationGraph


@dataclass(frozen=True)
class MergedGraph:
    """``graph``: the merged computation graph (its ``target_index`` is the
    concatenation of ``request_rows``). ``request_rows[r]``: merged local row of
    each requested target of request ``r``, in that request's ``target_index``
    order. ``separate_rows = Σ_r cg_r.aggregated_rows()``; ``merged_rows =
    graph.aggregated_rows()``."""

    graph: ComputationGraph
    request_rows: list[np.ndarray]
    separate_rows: int
    merged_rows: int

    @property
    def num_requests(self) -> int:
        return len(self.request_rows)

    @property
    def saved_rows(self) -> int:
        """Aggregations graph sharing saved against per-request execution."""
        return self.separate_rows - self.merged_rows


def node_levels(cg: ComputationGraph) -> np.ndarray:
    """Level of every local node: the largest ``l`` with the node in ``D_l``
    (``L`` for targets, ``0`` for vertices only read as layer-1 inputs)."""
    n = cg.layer_sizes[0]
    # thresholds |D_L| <= ... <= |D_1| ascending: level(i) = #{l >= 1: i < |D_l|}
    ascending = np.asarray(cg.layer_sizes[:0:-1], dtype=np.int64)
    i = np.arange(n, dtype=np.int64)
    return (cg.num_layers - np.searchsorted(ascending, i, side="right")).astype(np.int64)


def merge_computation_graphs(cgs: Sequence[ComputationGraph]) -> MergedGraph:
    """Merge ``cgs`` (same number of layers, fetched with the same fanouts and
    seed) so that each ``(vertex, layer)`` is aggregated once.

    Vectorised over vertices and edges: the loops below run once per request.
    """
    if len(cgs) == 0:
        raise InvalidRequest("nothing to merge: no computation graphs")
    if len(cgs) == 1:  # already in the fetcher's numbering: the merge is the graph itself
        cg = cgs[0]
        rows = cg.aggregated_rows()
        return MergedGraph(graph=cg, request_rows=[cg.target_index], separate_rows=rows,
                           merged_rows=rows)  # fmt: skip
    num_layers = cgs[0].num_layers
    if any(cg.num_layers != num_layers for cg in cgs):
        raise InvalidRequest(
            f"computation graphs differ in depth: {sorted({cg.num_layers for cg in cgs})}"
        )
    with_degree = all(cg.in_degree is not None for cg in cgs)

    # Every (request, local node) occurrence, concatenated in request order.
    sizes = np.array([cg.layer_sizes[0] for cg in cgs], dtype=np.int64)
    offsets = np.concatenate(([0], np.cumsum(sizes)))
    nodes_cat = np.concatenate([np.asarray(cg.nodes, dtype=np.int64) for cg in cgs])
    level_cat = np.concatenate([node_levels(cg) for cg in cgs])
    pos_cat = np.arange(nodes_cat.size, dtype=np.int64)

    # The occurrence that defines each vertex: highest level, then first request.
    order = np.lexsort((pos_cat, -level_cat, nodes_cat))
    uniq, first_sorted = np.unique(nodes_cat[order], return_index=True)
    chosen = order[first_sorted]  # occurrence index per unique vertex (uniq order)
    level = level_cat[chosen]

    # Fetcher numbering: targets by first request, then deeper hops by vertex id.
    # (A target's first request is where it is first a *target*, not first seen.)
    as_target = level_cat == num_layers
    target_ids, first_as_target = np.unique(nodes_cat[as_target], return_index=True)
    secondary = uniq.copy()
    is_target = level == num_layers
    secondary[is_target] = first_as_target[np.searchsorted(target_ids, uniq[is_target])]
    perm = np.lexsort((secondary, -level))
    new_id = np.empty(uniq.size, dtype=np.int64)
    new_id[perm] = np.arange(uniq.size, dtype=np.int64)
    nodes = uniq[perm]
    layer_sizes = tuple(int(np.count_nonzero(level >= lvl)) for lvl in range(num_layers + 1))

    def to_local(global_ids: np.ndarray) -> np.ndarray:
        return new_id[np.searchsorted(uniq, global_ids)]

    dst, src = _in_edges(cgs, chosen, offsets, num_layers, nodes_cat.size)
    dst, src = to_local(dst), to_local(src)
    by_row = np.argsort(dst, kind="stable")  # keeps each row's neighbour order
    n_expanded = layer_sizes[1] if num_layers else 0
    counts = np.bincount(dst, minlength=n_expanded)
    indptr = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)

    in_degree = None
    if with_degree:
        deg_cat = np.concatenate([np.asarray(cg.in_degree, dtype=np.int64) for cg in cgs])
        in_degree = deg_cat[chosen][perm]

    request_rows = [to_local(np.asarray(cg.nodes, dtype=np.int64)[cg.target_index]) for cg in cgs]
    graph = ComputationGraph(
        nodes=nodes,
        layer_sizes=layer_sizes,
        indptr=indptr,
        indices=src[by_row],
        target_index=np.concatenate(request_rows),
        in_degree=in_degree,
    )
    return MergedGraph(
        graph=graph,
        request_rows=request_rows,
        separate_rows=int(sum(cg.aggregated_rows() for cg in cgs)),
        merged_rows=graph.aggregated_rows(),
    )


def _in_edges(
    cgs: Sequence[ComputationGraph],
    chosen: np.ndarray,
    offsets: np.ndarray,
    num_layers: int,
    occurrences: int,
) -> tuple[np.ndarray, np.ndarray]:
    """``(dst, src)`` global ids of the in-edges of each expanded vertex, from
    its defining occurrence (``chosen``) only, in request order."""
    is_chosen = np.zeros(occurrences, dtype=bool)
    is_chosen[chosen] = True
    dst_parts, src_parts = [], []
    for r, cg in enumerate(cgs):
        n1 = cg.layer_sizes[1] if num_layers else 0
        deg = np.diff(cg.indptr[: n1 + 1])
        keep = np.repeat(is_chosen[offsets[r] : offsets[r] + n1], deg)
        dst_parts.append(np.repeat(cg.nodes[:n1], deg)[keep])
        src_parts.append(cg.nodes[cg.indices[: cg.indptr[n1]][keep]])
    return (
        np.concatenate(dst_parts).astype(np.int64),
        np.concatenate(src_parts).astype(np.int64),
    )
