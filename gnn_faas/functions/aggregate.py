"""Aggregate: the memory-side half of every GNN layer (numpy/scipy, no torch).

A :class:`~gnn_faas.storage.computation_graph.Block` maps ``num_src`` source rows
``h_src`` to ``num_dst`` destination rows; destination row ``r`` is source row
``dst_offset + r`` (0 for a whole block, ``start`` for rows cut by
:func:`slice_rows`). ``N(i)`` is row ``i`` of the block's CSR. The ops (PyG's
``aggregate`` step of each layer):

- ``sum``:  ``a_i = sum_{j in N(i)} h_j``
- ``mean``: ``a_i = sum_{j in N(i)} h_j / |N(i)|`` (0 for an empty row)
- ``max``:  ``a_i = max_{j in N(i)} h_j`` elementwise (0 for an empty row)
- ``gin``:  ``a_i = (1 + eps) h_i + sum_{j in N(i)} h_j``
- ``gcn``:  ``a_i = sum_{j in N'(i) u {i}} h_j / sqrt(d_j d_i)``, ``N'(i)`` = ``N(i)``
  without ``i``, ``d = in_degree + 1`` counting in-edges from *other* vertices
  (PyG's ``gcn_norm``: any self loops are replaced by exactly one of weight 1)
- ``gat``:  ``a_i = sum_{j in N(i) u {i}} softmax_j(LeakyReLU(alpha_src[j] +
  alpha_dst[i])) h_j`` per head, ``h_src`` of shape ``[num_src, heads, C]``

``gcn`` and ``gat`` add exactly one self loop per destination and ignore stored
ones (the degrees ``gcn`` is given must exclude them too, as
:meth:`~gnn_faas.storage.computation_graph.ComputationGraph.in_degree` does);
sum/mean/max/gin keep a stored self loop as an ordinary neighbour, as PyG's
SAGEConv and GINConv do.

Partitions: :func:`partial_aggregate` aggregates a block holding only part of each
destination's sources into a partial state; :func:`combine_partials` merges the
parts' states into exactly what :func:`aggregate` gives for the whole (sums add,
max takes the max, GAT rescales by ``exp(m_p - m)``, the online softmax). All work
is whole-array: scipy sparse products for the sum-like ops and GAT's weighted sum,
``np.maximum.reduceat`` / ``np.add.reduceat`` over CSR rows for max and the softmax.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from gnn_faas.errors import InvalidRequest
from gnn_faas.storage.computation_graph import Block

AGGREGATE_OPS = ("sum", "mean", "max", "gcn", "gin", "gat")
SUM_LIKE_OPS = ("sum", "mean", "gcn", "gin")
PARTIAL_KEYS = {
    "sum": ("sum", "count"),
    "mean": ("sum", "count"),
    "gcn": ("sum", "count"),
    "gin": ("sum", "count"),
    "max": ("max", "count"),
    "gat": ("max_logit", "exp_sum", "weighted"),
}


@dataclass(frozen=True)
class BlockSlice(Block):
    """Rows ``[dst_offset, dst_offset + num_dst)`` of a block; the sources are
    unchanged, so destination row ``r`` is source row ``dst_offset + r``."""

    dst_offset: int = 0


def slice_rows(block: Block, start: int, stop: int) -> BlockSlice:
    """Destination rows ``[start, stop)`` of ``block`` (a CSR row slice).

    ``num_src`` is unchanged; the slice remembers ``dst_offset`` (added to the
    block's own offset when slicing a slice) so that ops with a self or root
    term find row ``r``'s own source row ``dst_offset + r``.
    """
    if not 0 <= start <= stop <= block.num_dst:
        raise InvalidRequest(f"row slice [{start}, {stop}) outside [0, {block.num_dst}]")
    indptr = np.asarray(block.indptr[start : stop + 1], dtype=np.int64)
    lo, hi = (int(indptr[0]), int(indptr[-1])) if indptr.size else (0, 0)
    return BlockSlice(
        num_dst=stop - start,
        num_src=block.num_src,
        indptr=indptr - lo,
        indices=block.indices[lo:hi],
        dst_offset=getattr(block, "dst_offset", 0) + start,
    )


# -- validation ----------------------------------------------------------------
def _check_op(op: str) -> None:
    if op not in AGGREGATE_OPS:
        raise InvalidRequest(f"unknown aggregate op {op!r}: use one of {AGGREGATE_OPS}")


def _offset(block: Block, dst_offset: int) -> int:
    own = int(getattr(block, "dst_offset", 0))
    if dst_offset and own and int(dst_offset) != own:
        raise InvalidRequest(f"dst_offset {dst_offset} contradicts the block slice's own {own}")
    off = int(dst_offset) or own
    if off < 0 or off + block.num_dst > block.num_src:
        raise InvalidRequest(
            f"dst rows [{off}, {off + block.num_dst}) are not source rows of a block with "
            f"{block.num_src} sources"
        )
    return off


def _check_block(block: Block) -> tuple[np.ndarray, np.ndarray]:
    indptr = np.asarray(block.indptr)
    indices = np.asarray(block.indices)
    if indptr.ndim != 1 or indptr.size != block.num_dst + 1:
        raise InvalidRequest(f"block indptr must have num_dst + 1 = {block.num_dst + 1} entries")
    if indices.ndim != 1:
        raise InvalidRequest("block indices must be 1-D")
    for name, a in (("indptr", indptr), ("indices", indices)):
        if a.size and not np.issubdtype(a.dtype, np.integer):
            raise InvalidRequest(f"block {name} must be integers, got {a.dtype}")
    indptr = indptr.astype(np.int64, copy=False)
    indices = indices.astype(np.int64, copy=False)
    if indptr[0] != 0 or indptr[-1] != indices.size or np.any(np.diff(indptr) < 0):
        raise InvalidRequest("block indptr must start at 0, not decrease and end at num_edges")
    if indices.size and (indices.min() < 0 or indices.max() >= block.num_src):
        raise InvalidRequest(f"block indices must lie in [0, {block.num_src})")
    return indptr, indices


def _check_h(h_src: np.ndarray, block: Block, op: str) -> np.ndarray:
    if not isinstance(h_src, np.ndarray):
        raise InvalidRequest(f"h_src must be a numpy array, got {type(h_src).__name__}")
    if not np.issubdtype(h_src.dtype, np.floating):
        raise InvalidRequest(f"h_src must be floating point (float32), got {h_src.dtype}")
    want_ndim = 3 if op == "gat" else None
    if h_src.ndim < 2 or (want_ndim and h_src.ndim != want_ndim):
        shape = "[num_src, heads, C]" if op == "gat" else "[num_src, dim]"
        raise InvalidRequest(f"h_src for {op!r} must have shape {shape}, got {h_src.shape}")
    if h_src.shape[0] != block.num_src:
        raise InvalidRequest(f"h_src has {h_src.shape[0]} rows, the block has {block.num_src}")
    return h_src.astype(np.float32, copy=False)


def _per_dst(
    arr: np.ndarray | None, name: str, block: Block, off: int, trailing: tuple[int, ...]
) -> np.ndarray:
    """The destination rows of ``arr``, given either per destination row
    (``[num_dst, ...]``) or by source id (``[k, ...]`` with ``off + num_dst <= k
    <= num_src``, e.g. the whole source set or the unsliced block's destination
    rows; then rows ``off .. off + num_dst``). The two readings cannot clash:
    ``k == num_dst`` reads by source id only when ``off == 0``, where they agree."""
    arr = np.asarray(arr)
    k = arr.shape[0] if arr.ndim else -1
    ok = arr.shape[1:] == trailing and (
        k == block.num_dst or off + block.num_dst <= k <= block.num_src
    )
    if not ok:
        dims = "".join(f", {t}" for t in trailing)
        raise InvalidRequest(
            f"{name} must have shape [num_dst={block.num_dst}{dims}] or be indexed by source "
            f"id ([k{dims}] with {off + block.num_dst} <= k <= {block.num_src}), got {arr.shape}"
        )
    if k == block.num_dst:
        return arr
    return arr[off : off + block.num_dst]


def _numeric(arr: np.ndarray, name: str) -> np.ndarray:
    if arr.size and not (
        np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.floating)
    ):
        raise InvalidRequest(f"{name} must be numeric, got {arr.dtype}")
    return arr


# -- building blocks -------------------------------------------------------------
def _rows(indptr: np.ndarray) -> np.ndarray:
    return np.repeat(np.arange(indptr.size - 1, dtype=np.int64), np.diff(indptr))


def _drop_self_loops(
    indptr: np.ndarray, indices: np.ndarray, off: int
) -> tuple[np.ndarray, np.ndarray]:
    """The CSR without edges ``j == off + i`` (gcn/gat add their own self loop)."""
    rows = _rows(indptr)
    keep = indices != rows + off
    if keep.all():
        return indptr, indices
    counts = np.bincount(rows[keep], minlength=indptr.size - 1)
    return np.concatenate(([0], np.cumsum(counts))).astype(np.int64), indices[keep]


def _spmm(indptr, indices, data, h2: np.ndarray, num_src: int) -> np.ndarray:
    """``A @ h2`` for the CSR ``A`` (num_dst x num_src) with edge weights ``data``."""
    a = sp.csr_matrix((data, indices, indptr), shape=(indptr.size - 1, num_src))
    return np.asarray(a @ h2, dtype=np.float32)


def _degrees(deg: np.ndarray | None, name: str, n: int) -> np.ndarray:
    if deg is None:
        raise InvalidRequest(f"the 'gcn' op needs {name} (in-degrees of the block's vertices)")
    deg = _numeric(np.asarray(deg), name)
    if deg.ndim != 1 or deg.shape[0] != n:
        raise InvalidRequest(f"{name} must have shape [{n}], got {deg.shape}")
    if deg.size and deg.min() < 0:
        raise InvalidRequest(f"{name} must be >= 0")
    return deg.astype(np.float64) + 1.0  # the self loop


def _partial_sum_like(
    op, block, h, off, include_self, eps, deg_src, deg_dst
) -> dict[str, np.ndarray]:
    indptr, indices = _check_block(block)
    n = block.num_dst
    h2 = h.reshape(h.shape[0], -1)
    if op == "gcn":
        indptr, indices = _drop_self_loops(indptr, indices, off)
        d_src = _degrees(deg_src, "deg_src", block.num_src)
        if deg_dst is None:
            d_dst = d_src[off : off + n]
        else:
            d_dst = _degrees(_per_dst(deg_dst, "deg_dst", block, off, ()), "deg_dst", n)
        inv_src, inv_dst = 1.0 / np.sqrt(d_src), 1.0 / np.sqrt(d_dst)
        data = (inv_src[indices] * inv_dst[_rows(indptr)]).astype(np.float32)
    else:
        data = np.ones(indices.size, dtype=np.float32)
    total = _spmm(indptr, indices, data, h2, block.num_src)
    if include_self and op in ("gcn", "gin"):
        own = h2[off : off + n]
        if op == "gcn":
            total += own * (inv_dst * inv_dst).astype(np.float32)[:, None]
        else:
            total += np.float32(1.0 + eps) * own
    count = np.diff(indptr)
    return {"sum": total.reshape((n,) + h.shape[1:]), "count": count}


# Max gathers neighbour rows; gathering all E rows at once allocates [E, d]
# fresh pages (slow to fault in, beyond the cache). Chunks of ~1 MiB reuse one
# buffer and run several times faster: a loop over chunks, not vertices.
_MAX_CHUNK_BYTES = 1 << 20


def _partial_max(block, h, off) -> dict[str, np.ndarray]:
    indptr, indices = _check_block(block)
    n = block.num_dst
    count = np.diff(indptr)
    h2 = h.reshape(h.shape[0], -1)
    out = np.full((n, h2.shape[1]), -np.inf, dtype=np.float32)
    if indices.size:
        row_bytes = max(h2.shape[1] * 4, 1)
        chunk = max(256, _MAX_CHUNK_BYTES // row_bytes)
        # destination-row cuts with about `chunk` edges between them
        cuts = np.searchsorted(indptr, np.arange(0, indices.size, chunk), side="right") - 1
        cuts = np.unique(np.concatenate((cuts, [n])))
        buf = np.empty((min(indices.size, chunk + int(count.max())), h2.shape[1]), np.float32)
        for r0, r1 in zip(cuts[:-1], cuts[1:]):
            lo, hi = indptr[r0], indptr[r1]
            if hi == lo:
                continue
            gathered = buf[: hi - lo]
            np.take(h2, indices[lo:hi], axis=0, out=gathered)
            # reduceat over the non-empty rows only: consecutive starts then bound
            # exactly each row's segment (empty rows have no edges in between).
            nonempty = count[r0:r1] > 0
            starts = indptr[r0:r1][nonempty] - lo
            out[r0:r1][nonempty] = np.maximum.reduceat(gathered, starts, axis=0)
    return {"max": out.reshape((n,) + h.shape[1:]), "count": count}


def _partial_gat(
    block, h, off, include_self, alpha_src, alpha_dst, negative_slope
) -> dict[str, np.ndarray]:
    indptr, indices = _check_block(block)
    n, heads, chans = block.num_dst, h.shape[1], h.shape[2]
    if alpha_src is None or alpha_dst is None:
        raise InvalidRequest("the 'gat' op needs alpha_src and alpha_dst")
    a_src = _numeric(np.asarray(alpha_src), "alpha_src")
    if a_src.shape != (block.num_src, heads):
        raise InvalidRequest(
            f"alpha_src must have shape [{block.num_src}, {heads}], got {a_src.shape}"
        )
    a_dst = _numeric(_per_dst(alpha_dst, "alpha_dst", block, off, (heads,)), "alpha_dst")
    indptr, indices = _drop_self_loops(indptr, indices, off)
    if include_self:
        # Append one self loop at the end of every row, vectorised: original
        # edge e of row r moves to e + r, the self loop of row r goes last.
        counts = np.diff(indptr) + 1
        new_indptr = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
        src = np.empty(new_indptr[-1], dtype=np.int64)
        src[np.arange(indices.size) + _rows(indptr)] = indices
        src[new_indptr[1:] - 1] = off + np.arange(n)
        indptr, indices = new_indptr, src
    rows = _rows(indptr)
    count = np.diff(indptr)
    nonempty = count > 0
    max_logit = np.full((n, heads), -np.inf, dtype=np.float64)
    exp_sum = np.zeros((n, heads), dtype=np.float64)
    weighted = np.zeros((n, heads, chans), dtype=np.float32)
    if indices.size:
        logit = a_src[indices].astype(np.float64) + a_dst[rows].astype(np.float64)
        logit = np.where(logit > 0, logit, negative_slope * logit)
        starts = indptr[:-1][nonempty]
        max_logit[nonempty] = np.maximum.reduceat(logit, starts, axis=0)
        ex = np.exp(logit - max_logit[rows])
        exp_sum[nonempty] = np.add.reduceat(ex, starts, axis=0)
        ex32 = ex.astype(np.float32)
        for k in range(heads):  # one sparse product per head
            weighted[:, k, :] = _spmm(indptr, indices, ex32[:, k], h[:, k, :], block.num_src)
    return {
        "max_logit": max_logit.astype(np.float32),
        "exp_sum": exp_sum.astype(np.float32),
        "weighted": weighted,
    }


# -- public API ----------------------------------------------------------------------
def partial_aggregate(
    op: str,
    block: Block,
    h_src: np.ndarray,
    *,
    include_self: bool = False,
    eps: float = 0.0,
    deg_src: np.ndarray | None = None,
    deg_dst: np.ndarray | None = None,
    alpha_src: np.ndarray | None = None,
    alpha_dst: np.ndarray | None = None,
    negative_slope: float = 0.2,
    dst_offset: int = 0,
) -> dict[str, np.ndarray]:
    """Partial state of ``op`` over the sources this block lists.

    The block's columns may be only part of each destination's sources; the
    self/root term (gcn/gin self term, gat self loop) is included only with
    ``include_self=True`` (exactly one part of a partition should set it, and
    that part's ``h_src`` rows ``dst_offset + r`` must be the destinations' own
    rows). States: ``{"sum", "count"}`` for sum/mean/gcn/gin (weighted sums;
    ``count`` = edges, self term excluded), ``{"max", "count"}`` for max
    (``-inf`` where a row has no edge here), ``{"max_logit", "exp_sum",
    "weighted"}`` for gat: per row and head ``m = max logit``, ``sum exp(l - m)``
    and ``sum exp(l - m) h_j`` (an online softmax). ``deg_dst``/``alpha_dst``
    are read as in :func:`aggregate`.
    """
    _check_op(op)
    h = _check_h(h_src, block, op)
    off = _offset(block, dst_offset)
    if op in SUM_LIKE_OPS:
        return _partial_sum_like(op, block, h, off, include_self, eps, deg_src, deg_dst)
    if op == "max":
        return _partial_max(block, h, off)
    return _partial_gat(block, h, off, include_self, alpha_src, alpha_dst, negative_slope)


def combine_partials(op: str, partials: list[dict[str, np.ndarray]]) -> np.ndarray:
    """Merge the partial states of the same destination rows into the final
    aggregate (equal to :func:`aggregate` over the union of the parts)."""
    _check_op(op)
    if not partials:
        raise InvalidRequest("combine_partials needs at least one partial state")
    keys = PARTIAL_KEYS[op]
    for i, p in enumerate(partials):
        missing = [k for k in keys if k not in p]
        if missing:
            raise InvalidRequest(f"partial {i} for {op!r} lacks {missing}")
    shapes = {tuple(np.shape(p[keys[0]])) for p in partials}
    if len(shapes) != 1:
        raise InvalidRequest(f"partials of {op!r} have different shapes: {sorted(shapes)}")
    if op in SUM_LIKE_OPS:
        total = np.sum([np.asarray(p["sum"], dtype=np.float32) for p in partials], axis=0)
        total = total.astype(np.float32, copy=False)
        if op == "mean":
            count = np.sum([np.asarray(p["count"]) for p in partials], axis=0)
            scale = 1.0 / np.maximum(count, 1).astype(np.float32)
            total = total * scale.reshape((-1,) + (1,) * (total.ndim - 1))
        return total
    if op == "max":
        best = np.max([np.asarray(p["max"], dtype=np.float32) for p in partials], axis=0)
        count = np.sum([np.asarray(p["count"]) for p in partials], axis=0)
        best[count == 0] = 0.0  # PyG scatter-max of an empty set
        return best
    m_parts = np.stack([np.asarray(p["max_logit"], dtype=np.float64) for p in partials])
    m = m_parts.max(axis=0)
    m_safe = np.where(np.isfinite(m), m, 0.0)
    with np.errstate(invalid="ignore"):
        scale = np.where(np.isfinite(m_parts), np.exp(m_parts - m_safe), 0.0)
    exp_sum = sum(scale[i] * np.asarray(p["exp_sum"]) for i, p in enumerate(partials))
    weighted = sum(
        (scale[i][..., None] * np.asarray(p["weighted"], dtype=np.float64))
        for i, p in enumerate(partials)
    )
    denom = np.where(exp_sum > 0, exp_sum, 1.0)
    return (weighted / denom[..., None]).astype(np.float32)


def aggregate(
    op: str,
    block: Block,
    h_src: np.ndarray,
    *,
    eps: float = 0.0,
    deg_src: np.ndarray | None = None,
    deg_dst: np.ndarray | None = None,
    alpha_src: np.ndarray | None = None,
    alpha_dst: np.ndarray | None = None,
    negative_slope: float = 0.2,
    dst_offset: int = 0,
) -> np.ndarray:
    """Aggregate ``h_src`` ``[num_src, ...]`` (gat: ``[num_src, heads, C]``) into
    ``[num_dst, ...]`` float32 rows with ``op`` (formulas in the module doc).

    ``deg_src`` (gcn): in-degrees of the sources without the self loop;
    ``deg_dst`` defaults to ``deg_src[dst_offset : dst_offset + num_dst]``.
    ``alpha_src`` ``[num_src, heads]``, ``alpha_dst`` (gat): the attention terms
    ``<a_src, W x_j>``, ``<a_dst, W x_i>``. ``deg_dst`` and ``alpha_dst`` are
    given per destination row ``[num_dst, ...]`` or indexed by source id (any
    ``[k, ...]`` with ``dst_offset + num_dst <= k <= num_src``: the whole
    source set, or the unsliced block's destination rows when aggregating a
    :func:`slice_rows` slice).
    Raises :class:`InvalidRequest` on an unknown op, missing extras or a wrong
    shape or dtype.
    """
    state = partial_aggregate(
        op,
        block,
        h_src,
        include_self=True,
        eps=eps,
        deg_src=deg_src,
        deg_dst=deg_dst,
        alpha_src=alpha_src,
        alpha_dst=alpha_dst,
        negative_slope=negative_slope,
        dst_offset=dst_offset,
    )
    if op in ("sum", "gcn", "gin"):
        return state["sum"]
    return combine_partials(op, [state])
