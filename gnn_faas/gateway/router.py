"""Route a request to the buffer with the highest sharing degree (λGrapher 3.2).

The pool has ``num_buffers`` slots; a slot is open (holds a buffer) or free.
Candidates for request ``r`` are the open buffers that can take it (fewer than
``max_requests`` requests, and ``K + |U_r \\ U_b| <= max_vertices`` when a vertex
cap is set) plus the first free slot, which counts as an empty buffer with
``S = 0`` and no vertices. The request goes to the candidate with the highest
``S(r, b) = |U_b ∩ U_r| / |U_r|``; ties go to the buffer with fewer vertices.
Consequences of this rule:

- a new buffer opens only when ``r`` shares nothing with any open buffer that
  can take it (or when every open buffer is full or over its vertex cap), or
  when ``S`` stays below ``open_below`` (0 by default, so any overlap joins);
- if no slot is free and no open buffer can take ``r``, :meth:`Router.route`
  returns ``-1`` and the pool closes the open buffer due first (reason
  ``"full"``) to free a slot.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from gnn_faas.gateway.buffer import Buffer
from gnn_faas.gateway.sharing import SharingIndex


class Router:
    """Argmax-sharing router over the slots of a :class:`SharingIndex`."""

    def __init__(
        self,
        index: SharingIndex,
        max_requests_per_buffer: int = 64,
        max_vertices_per_buffer: int | None = None,
        open_below: float = 0.0,
    ):
        self.index = index
        self.max_requests = int(max_requests_per_buffer)
        self.max_vertices = max_vertices_per_buffer
        self.open_below = float(open_below)

    def route(self, vertex_set: np.ndarray, buffers: Sequence[Buffer | None]) -> tuple[int, float]:
        """``(slot, S)`` for a request with vertex set ``vertex_set`` (sorted,
        unique); ``buffers[s]`` is the buffer open in slot ``s`` or ``None``.
        Returns ``(-1, 0.0)`` when no slot can take the request."""
        n_slots = len(buffers)
        is_open = np.fromiter((b is not None for b in buffers), bool, n_slots)
        if not is_open.any():
            return 0, 0.0
        overlap = self.index.overlaps(vertex_set)[:n_slots]
        size = max(int(vertex_set.size), 1)
        s = overlap / size
        k = self.index.sizes[:n_slots]
        n = np.fromiter(
            (b.num_requests if b is not None else 0 for b in buffers), np.int64, n_slots
        )
        fits = is_open & (n < self.max_requests)
        if self.max_vertices is not None:
            # A request bigger than the cap on its own still goes to a free slot.
            fits &= k + (vertex_set.size - overlap) <= self.max_vertices
        free = np.flatnonzero(~is_open)
        best = -1
        if fits.any():
            cand = np.flatnonzero(fits)
            # argmax S, ties to fewer vertices (lexsort: last key is primary).
            order = np.lexsort((k[cand], -s[cand]))
            best = int(cand[order[0]])
        # The free slot is an empty buffer (S = 0, no vertices): it wins ties at
        # S = 0 and, with ``open_below``, any S not above that threshold.
        if free.size and (best < 0 or s[best] <= self.open_below):
            return int(free[0]), 0.0
        if best < 0:
            return -1, 0.0
        return best, float(s[best])
