"""SRPE's recomputation of a candidate from its stored aggregate state (numpy, no torch).

A recomputed candidate ``u`` (see :mod:`gnn_faas.storage.srpe_graph`) needs
layer 1's aggregate ``a_u`` over its in-neighbours with the request's added
edges. Its stored neighbours' input rows never change; what a request changes
is a handful of terms. ``gnn-faas precompute`` stores, per vertex, layer 1's
*state* ``s_u`` over the stored in-neighbours ``N(u)`` (:func:`layer_states`),
and the recomputation (:func:`recompute_from_states`) adds the changed terms
(``A(u)``: the added in-edges' sources; ``D(u)``: stored in-neighbours whose
degree the request changed; ``x``: layer 1's input rows; ``d = deg + 1`` with
``deg`` the in-degree without self loops, ``d'`` with the request's edges):

- ``sum``:  ``s_u = Σ_{N(u)} x_v``;   ``a_u = s_u + Σ_{A(u)} x_q``
- ``mean``: ``s_u`` as sum;           ``a_u = (s_u + Σ_{A(u)} x_q) / (|N(u)| + |A(u)|)``
- ``gin``:  ``s_u`` as sum;           ``a_u = (1 + eps) x_u + s_u + Σ_{A(u)} x_q``
- ``max``:  ``s_u = max_{N(u)} x_v``; ``a_u = max(s_u, max_{A(u)} x_q)`` (0 if empty)
- ``gcn``:  ``s_u = Σ_{N'(u)} x_v / sqrt(d_v)`` (self loops excluded);
  ``a_u = (s_u + Σ_{D(u)} x_v (1/sqrt(d'_v) - 1/sqrt(d_v)) + Σ_{A(u)} x_q / sqrt(d'_q))
  / sqrt(d'_u) + x_u / d'_u``

Each is the exact aggregate of :func:`gnn_faas.functions.aggregate.aggregate`
on the graph with the request's edges, up to float32 rounding: a candidate
costs one state row and the few changed rows instead of ``|N(u)|`` input rows.
GAT (the attention of every neighbour depends on the destination) and layers
with a ``pre`` stage keep the full recomputation (:data:`STATE_OPS`).
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from gnn_faas.errors import InvalidRequest
from gnn_faas.functions.aggregate import partial_aggregate
from gnn_faas.storage.computation_graph import Block
from gnn_faas.storage.srpe_graph import StateDelta

STATE_OPS = ("sum", "mean", "gin", "max", "gcn")


def supports_states(step) -> bool:
    """Whether layer ``step`` (a :class:`~gnn_faas.functions.layer_plan.LayerStep`)
    can be recomputed from stored states."""
    return step.op in STATE_OPS and not step.pre


def layer_states(op: str, block: Block, x: np.ndarray, deg: np.ndarray | None = None) -> np.ndarray:
    """``s_u`` (module doc) of the block's destination rows from the source rows
    ``x``; ``deg`` (gcn): the sources' in-degrees without self loops."""
    if op not in STATE_OPS:
        raise InvalidRequest(f"no stored state for aggregate op {op!r}")
    if op == "max":
        return partial_aggregate("max", block, x)["max"]
    kw = {}
    if op == "gcn":  # d_dst = 1: the destination's factor is applied at serving time
        kw = {"deg_src": deg, "deg_dst": np.zeros(block.num_dst, np.int64)}
    part = partial_aggregate(op, block, x, include_self=False, **kw)
    return part["sum"]


def finish_state(
    op: str, state: np.ndarray, own: np.ndarray, count: np.ndarray, degree: np.ndarray,
    eps: float = 0.0,
) -> np.ndarray:  # fmt: skip
    """The aggregate ``a_u`` from a state over all of ``u``'s in-neighbours:
    ``own``: ``x_u``; ``count``: its in-edges (self loops included);
    ``degree``: its in-degree without self loops (gcn). Precompute finishes the
    stored states this way (one sparse product for both)."""
    if op == "gcn":
        d = degree.astype(np.float64)[:, None] + 1.0
        return (state / np.sqrt(d) + own / d).astype(np.float32)
    if op == "mean":
        return (state / np.maximum(count, 1)[:, None]).astype(np.float32)
    if op == "gin":
        return (state + np.float32(1.0 + eps) * own).astype(np.float32)
    if op == "max":
        out = np.array(state, dtype=np.float32)
        out[count == 0] = 0.0  # PyG scatter-max of an empty set
        return out
    return np.asarray(state, np.float32)


def recompute_from_states(
    op: str,
    states: np.ndarray,
    delta: StateDelta,
    x: np.ndarray,
    in_degree: np.ndarray,
    first_row: int,
    eps: float = 0.0,
) -> np.ndarray:
    """Layer 1's aggregate ``a_u`` (module doc) of the recomputed rows.

    ``states``: their stored ``s_u``; ``x``: input rows of the graph's sources
    (local ids, the recomputed rows at ``first_row + r``); ``in_degree``: the
    sources' degrees with the request's edges, self loops excluded."""
    if op not in STATE_OPS:
        raise InvalidRequest(f"aggregate op {op!r} cannot be recomputed from stored states")
    n = delta.stored_count.size
    if states.shape[0] != n:
        raise InvalidRequest(f"{states.shape[0]} state rows for {n} recomputed candidates")
    own = first_row + np.arange(n)
    rows = np.repeat(np.arange(n), np.diff(delta.indptr))
    added = delta.added
    s = np.asarray(states, np.float32)
    a_rows, a_src = rows[added], delta.src[added]
    count = delta.stored_count + np.bincount(a_rows, minlength=n)
    if op == "gcn":
        keep = ~(added & (delta.src == own[rows]))  # an added self loop: gcn has its own
        deg = in_degree[delta.src].astype(np.float64)
        d_new = 1.0 / np.sqrt(deg + 1.0)
        old = 1.0 / np.sqrt(deg - delta.degree_change + 1.0)
        coef = np.where(added, d_new, d_new - old)
        s = s + _weighted_sum(rows[keep], delta.src[keep], coef[keep], x, n)
    elif op == "max":
        s = s.copy()
        np.maximum.at(s, a_rows, x[a_src])  # few rows: the request's added edges
    else:
        s = s + _weighted_sum(a_rows, a_src, np.ones(a_src.size), x, n)
    return finish_state(op, s, x[own], count, in_degree[own], eps)


def recompute_last_rows(
    op: str,
    block: Block,
    x: np.ndarray,
    states: np.ndarray,
    terms: dict[str, np.ndarray],
    in_degree: np.ndarray | None = None,
    eps: float = 0.0,
    dst_offset: int = 0,
) -> np.ndarray:
    """A memory function's share of :func:`recompute_from_states`: the aggregate
    of ``block``'s last ``k`` destination rows (``k = states.shape[0]``), whose
    lists in the block are their changed terms
    (:meth:`~gnn_faas.storage.srpe_graph.SrpeGraph.state_block`, compacted by
    the orchestrator: row ``r``'s own source row is ``dst_offset + r``).
    ``terms``: :meth:`~gnn_faas.storage.srpe_graph.SrpeGraph.state_terms`'s
    ``state_count``, ``state_added``, ``state_degree_change``; ``x``: the
    block's source rows; ``in_degree``: the sources' degrees (gcn)."""
    count = np.asarray(terms["state_count"], np.int64)
    k = count.size
    if states.shape[0] != k or k > block.num_dst:
        raise InvalidRequest(f"{states.shape[0]} state rows for {k} of {block.num_dst} rows")
    first = block.num_dst - k
    lo, hi = int(block.indptr[first]), int(block.indptr[block.num_dst])
    added = np.asarray(terms["state_added"], bool)
    change = np.asarray(terms["state_degree_change"], np.int64)
    if added.size != hi - lo or change.size != hi - lo:
        raise InvalidRequest(
            f"state_added and state_degree_change need one entry per changed term ({hi - lo})"
        )
    if op == "gcn" and in_degree is None:
        raise InvalidRequest("gcn's recomputation from stored states needs deg_src")
    deg = np.zeros(block.num_src, np.int64) if in_degree is None else np.asarray(in_degree)
    delta = StateDelta(
        indptr=np.asarray(block.indptr[first:], np.int64) - lo,
        src=np.asarray(block.indices[lo:hi], np.int64),
        added=added,
        degree_change=change,
        stored_count=count,
    )
    return recompute_from_states(op, states, delta, x, deg, dst_offset + first, eps)


def _weighted_sum(rows: np.ndarray, src: np.ndarray, w: np.ndarray, x: np.ndarray, n: int):
    """``out[r] = Σ_{e: rows[e] = r} w[e] x[src[e]]`` as one sparse product."""
    a = sp.csr_matrix((w.astype(np.float32), (rows, src)), shape=(n, x.shape[0]))
    return np.asarray(a @ x, dtype=np.float32)
