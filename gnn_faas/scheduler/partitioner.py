"""Per-layer partitioning to fit function memory (λGrapher Algorithm 2).

A layer's destination rows are cut, in order, into contiguous ranges ``[a, b)``
whose Aggregate fits one memory function::

    M(a, b) = M_runtime + |cols(a, b)| x row_bytes_in + E(a, b) x EDGE_BYTES
              + (b - a) x row_bytes_out                  <= budget

where ``cols(a, b)`` are the distinct source rows the part reads (its in-edge
columns and, with ``include_self``, its own rows: GCN self-loops, SAGE/GIN root
terms and GAT all read ``h_i`` of the destination) and ``E(a, b) = indptr[b] -
indptr[a]``. The greedy takes the longest prefix that fits and starts the next
part after it. ``M`` grows with ``b``, so each step evaluates every candidate end
at once: cumulative edge counts come from ``indptr`` and distinct-column counts
from the first occurrence of each column in the part's window (``np.unique``
``return_index``), never a loop per row or edge. The window is bounded by how
many rows and edges the budget can hold at all, so the total work is
``O(E log E)``. A row that alone exceeds the budget becomes its own part and is
flagged in :attr:`LayerPartition.oversized`. A layer that fits whole, counted
as reading every one of its sources, is one part without the scan (a lone
request's layer, usually).

A live memory function holds more than the formula while it aggregates a part:
its streamed feature read (a few chunks of a fixed share of its limit) and the
answer's frame (a second copy of ``M_h``). The orchestrator passes them
(``overhead_bytes``, ``answer_copies=2``, from
:func:`gnn_faas.functions.memory_limit.call_overhead_bytes`), so a part that
fits the budget keeps the whole call inside the function's memory; without
them, a hub's parts on stackoverflow-like packed to a 1 GiB budget measured
1,048 MiB live (baseline + working set).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np

from gnn_faas.errors import InvalidRequest
from gnn_faas.scheduler.sizing.function_memory import EDGE_BYTES, MIB, memory_function_bytes
from gnn_faas.storage.computation_graph import Block, ComputationGraph

log = logging.getLogger(__name__)


class LayerPartition(list):
    """The parts of one layer: a list of ``(a, b)`` destination row ranges.

    ``memory_bytes[i]``: the formula's memory of part ``i``; ``oversized``: the
    indices of single-row parts that exceed the budget on their own."""

    def __init__(self, parts=(), memory_bytes=(), oversized=()):
        super().__init__(parts)
        self.memory_bytes: list[int] = list(memory_bytes)
        self.oversized: list[int] = list(oversized)


def _window_distinct(block: Block, a: int, b_max: int, include_self: bool) -> np.ndarray:
    """For ``b`` in ``a+1..b_max``: distinct source rows read by rows ``[a, b)``."""
    rows = np.arange(a, b_max, dtype=np.int64)
    lo, hi = int(block.indptr[a]), int(block.indptr[b_max])
    deg = np.diff(block.indptr[a : b_max + 1]).astype(np.int64)
    cols = np.asarray(block.indices[lo:hi], dtype=np.int64)
    if include_self:
        # Row-major tokens: each row's own id, then its columns.
        tokens = np.empty(cols.size + rows.size, dtype=np.int64)
        self_pos = (block.indptr[a:b_max] - lo) + (rows - a)
        is_self = np.zeros(tokens.size, dtype=bool)
        is_self[self_pos] = True
        tokens[is_self] = rows
        tokens[~is_self] = cols
        token_row = np.repeat(rows - a, deg + 1)
    else:
        tokens, token_row = cols, np.repeat(rows - a, deg)
    _, first = np.unique(tokens, return_index=True)
    new_per_row = np.bincount(token_row[first], minlength=rows.size)
    return np.cumsum(new_per_row)


def partition_layer(
    block: Block,
    row_bytes_in: int,
    row_bytes_out: int,
    budget_bytes: int,
    runtime_bytes: int,
    *,
    include_self: bool = True,
    overhead_bytes: int = 0,
    answer_copies: int = 1,
    whole_only: bool = False,
) -> LayerPartition | None:
    """Contiguous destination row ranges ``[a, b)`` of ``block`` covering
    ``0..num_dst`` in order, each within ``budget_bytes`` (see module doc).
    ``overhead_bytes`` is added to every part beside the runtime, and the
    output rows are counted ``answer_copies`` times (the memory function's
    call holds the answer and its frame). ``whole_only``: ``None`` unless the
    layer fits whole (no window scan)."""
    if budget_bytes <= 0 or runtime_bytes < 0 or row_bytes_in < 0 or row_bytes_out < 0:
        raise InvalidRequest("budget must be positive and sizes non-negative")
    if overhead_bytes < 0 or answer_copies < 1:
        raise InvalidRequest("overhead must be non-negative and answer_copies >= 1")
    runtime_bytes = runtime_bytes + overhead_bytes
    row_bytes_out = row_bytes_out * answer_copies
    n = block.num_dst
    indptr = np.asarray(block.indptr, dtype=np.int64)
    free = budget_bytes - runtime_bytes
    # Upper bounds on rows and edges of any part that fits: bound the window.
    per_row = row_bytes_out + (row_bytes_in if include_self else 0)
    max_rows = n if per_row == 0 else max(1, free // per_row)
    max_edges = max(0, free // EDGE_BYTES)

    # a layer that fits whole (counted as reading every source) is one part: no window scan
    whole = int(memory_function_bytes(block.num_src, indptr[n] - indptr[0], n, row_bytes_in,
                                      row_bytes_out, runtime_bytes))  # fmt: skip
    if n and whole <= budget_bytes:
        return LayerPartition([(0, n)], [whole])
    if whole_only:  # the caller only asks whether the layer is one part
        return None
    parts, memory, oversized = [], [], []
    a = 0
    while a < n:
        b_edges = int(np.searchsorted(indptr, indptr[a] + max_edges, side="right")) - 1
        b_max = max(a + 1, min(n, a + max_rows, b_edges))
        ends = np.arange(a + 1, b_max + 1, dtype=np.int64)
        mem = memory_function_bytes(
            _window_distinct(block, a, b_max, include_self),
            indptr[ends] - indptr[a],
            ends - a,
            row_bytes_in,
            row_bytes_out,
            runtime_bytes,
        )
        fits = int(np.searchsorted(mem, budget_bytes, side="right"))  # mem is non-decreasing
        if fits == 0:
            fits = 1
            oversized.append(len(parts))
        parts.append((a, a + fits))
        memory.append(int(mem[fits - 1]))
        a += fits
    if oversized:
        log.warning(
            "%d of %d rows alone exceed the %d-byte budget; each runs as its own part",
            len(oversized),
            n,
            budget_bytes,
        )
    return LayerPartition(parts, memory, oversized)


def plan_partitions(
    cg: ComputationGraph,
    dims: Sequence[tuple[int, int]],
    memory_mb: int,
    runtime_mb: int,
    *,
    itemsize: int = 4,
    include_self: bool = True,
) -> list[LayerPartition]:
    """Partitions of every layer of ``cg`` for memory functions of ``memory_mb``.

    ``dims[l - 1] = (d_in, d_out)``: the width of the rows layer ``l``'s
    Aggregate reads and writes (for GCN, which may Update before it aggregates,
    both are the narrower width the plan actually moves), at ``itemsize`` bytes
    per element.
    """
    if len(dims) != cg.num_layers:
        raise InvalidRequest(f"need dims for {cg.num_layers} layers, got {len(dims)}")
    return [
        partition_layer(
            cg.block(layer),
            d_in * itemsize,
            d_out * itemsize,
            memory_mb * MIB,
            runtime_mb * MIB,
            include_self=include_self,
        )
        for layer, (d_in, d_out) in enumerate(dims, start=1)
    ]
