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
        # A handful of slots: plain Python over them beats a dozen small numpy
        # calls (this runs once per request, also in the simulator's day-long replays).
        open_slots = [i for i, b in enumerate(buffers) if b is not None]
        if not open_slots:
            return 0, 0.0
        overlap = self.index.overlaps(vertex_set).tolist()
        sizes = self.index.sizes.tolist()
        n_u = int(vertex_set.size)
        size = max(n_u, 1)
        best, best_key = -1, None
        for i in open_slots:
            if buffers[i].num_requests >= self.max_requests:
                continue
            # A request bigger than the cap on its own still goes to a free slot.
            if self.max_vertices is not None and sizes[i] + n_u - overlap[i] > self.max_vertices:
                continue
            key = (-(overlap[i] / size), sizes[i])  # argmax S, ties to fewer vertices
            if best_key is None or key < best_key:
                best, best_key = i, key
        # The free slot is an empty buffer (S = 0, no vertices): it wins ties at
        # S = 0 and, with ``open_below``, any S not above that threshold.
        free = next((i for i, b in enumerate(buffers) if b is None), -1)
        s_best = overlap[best] / size if best >= 0 else 0.0
        if free >= 0 and (best < 0 or s_best <= self.open_below):
            return free, 0.0
        if best < 0:
            return -1, 0.0
        return best, float(s_best)
