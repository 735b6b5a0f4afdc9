"""Sharing degree between a request and graph-sharing buffers (λGrapher 3.2).

For a request with k-hop vertex set ``U_r`` and a buffer whose requests cover
``U_b`` (the union of their vertex sets)::

    S(r, b) = |U_b ∩ U_r| / |U_r|

the fraction of the request's vertices that the buffer aggregates anyway. A
buffer's own sharing degree is union-based::

    S_b = 1 − |U_b| / Σ_{r∈b} |U_r|

the fraction of vertex work that merging its requests saves (0 for one
request). Joining ``r`` to ``b`` raises ``Σ_b |U_r| − |U_b|`` (the rows saved)
by exactly ``|U_r| · S(r, b)``, so routing to the argmax of ``S`` is the greedy
step for ``S_b``.

:class:`SharingIndex` keeps, for every buffer slot, a reference count per graph
vertex (how many of the slot's requests contain it) in one vertex-major
``[num_nodes, num_slots]`` array, so ``S`` for all slots is one gather of the
request's rows. Measured on this project's 2-core machine (4 slots): for 5,881
vertices and ``|U_r|`` ≈ 1,300 the gather takes ~24 µs against ~115 µs for
per-buffer sorted arrays with ``searchsorted`` (~80 µs with ``np.isin``); for
456,626 vertices and ``|U_r|`` ≈ 20,000, ~320 µs against ~2,400 µs (~760 µs).
Counts (not booleans) make removing a request (a global move) exact.
"""

from __future__ import annotations

import numpy as np

from gnn_faas.errors import InvalidRequest


def sharing_degree(vertex_set: np.ndarray, buffer_union: np.ndarray) -> float:
    """``|U_b ∩ U_r| / |U_r|`` for sorted unique arrays (the reference formula)."""
    u = np.asarray(vertex_set)
    if u.size == 0:
        return 0.0
    return float(np.intersect1d(u, buffer_union, assume_unique=True).size) / u.size


def union_sharing_degree(union_size: int, total_vertices: int) -> float:
    """``1 − |U_b| / Σ|U_r|``: the fraction of vertex work a merged batch saves."""
    if total_vertices <= 0:
        return 0.0
    return 1.0 - union_size / total_vertices


def as_vertex_set(vertices: np.ndarray, num_nodes: int) -> np.ndarray:
    """Validate a vertex set: 1-D int64, sorted, unique, inside ``[0, num_nodes)``.

    Sorted input (what the fetcher returns after ``np.unique``) costs one pass;
    anything else is sorted and deduplicated.
    """
    u = np.asarray(vertices)
    if u.ndim != 1:
        raise InvalidRequest("a vertex set must be 1-D")
    if u.size and not np.issubdtype(u.dtype, np.integer):
        raise InvalidRequest("a vertex set must hold integer vertex ids")
    u = u.astype(np.int64, copy=False)
    if u.size and not bool(np.all(u[1:] > u[:-1])):
        u = np.unique(u)
    if u.size and (u[0] < 0 or u[-1] >= num_nodes):
        raise InvalidRequest(f"vertex set has ids outside [0, {num_nodes})")
    return u


class SharingIndex:
    """Per-slot vertex reference counts: ``counts[v, s]`` = requests of slot ``s``
    containing vertex ``v``. ``sizes[s] = |U_s|`` is kept up to date.

    With the bitmask (up to 8 slots) routing and adding need only the mask, so
    the counts are brought up to date when read (:attr:`counts`, :meth:`remove`,
    :meth:`union`): a slot's added sets wait in a list until then, and a slot
    whose counts were never brought up to date clears without touching them."""

    def __init__(self, num_nodes: int, num_slots: int, max_requests: int = 65535):
        if num_nodes <= 0 or num_slots <= 0:
            raise ValueError("num_nodes and num_slots must be positive")
        self.num_nodes = int(num_nodes)
        self.num_slots = int(num_slots)
        # uint16 halves the bytes a gather touches; a vertex's count never
        # exceeds the requests a buffer may hold.
        dtype = np.uint16 if max_requests < 2**16 else np.int32
        self._counts = np.zeros((self.num_nodes, self.num_slots), dtype=dtype)
        self.sizes = np.zeros(self.num_slots, dtype=np.int64)
        # Up to 8 slots: bit s of mask[v] says slot s holds v, so the overlaps of
        # all slots are one byte gather and a 256-bin histogram (~8 µs against
        # ~35 µs for the count gather at |U_r| ≈ 1,000, 4 slots).
        self.mask = np.zeros(self.num_nodes, np.uint8) if self.num_slots <= 8 else None
        self._bits = (np.arange(256)[:, None] >> np.arange(self.num_slots)) & 1
        # per slot: sets added and not yet counted (mask only), counts possibly non-zero
        self._lazy: list[list[np.ndarray]] = [[] for _ in range(self.num_slots)]
        self._dirty = [False] * self.num_slots

    @property
    def counts(self) -> np.ndarray:
        """``[num_nodes, num_slots]`` reference counts, up to date."""
        for slot, sets in enumerate(self._lazy):
            if sets:
                col = self._counts[:, slot]
                for u in sets:
                    col[u] += 1
                sets.clear()
                self._dirty[slot] = True
        return self._counts

    def grow(self, num_nodes: int) -> None:
        """Room for vertex ids up to ``num_nodes`` (a graph that gained vertices):
        the tables grow by half at least, their counts kept."""
        if num_nodes <= self.num_nodes:
            return
        n = max(int(num_nodes), self.num_nodes + self.num_nodes // 2 + 1)
        counts = np.zeros((n, self.num_slots), dtype=self._counts.dtype)
        counts[: self.num_nodes] = self._counts
        self._counts = counts
        if self.mask is not None:
            mask = np.zeros(n, np.uint8)
            mask[: self.num_nodes] = self.mask
            self.mask = mask
        self.num_nodes = n

    def overlaps(self, vertex_set: np.ndarray) -> np.ndarray:
        """``|U_s ∩ U_r|`` for every slot (int64 ``[num_slots]``)."""
        if vertex_set.size == 0:
            return np.zeros(self.num_slots, np.int64)
        if self.mask is not None:
            return np.bincount(self.mask[vertex_set], minlength=256) @ self._bits
        rows = np.take(self._counts, vertex_set, axis=0)  # (no bitmask: never lazy)
        return np.count_nonzero(rows, axis=0).astype(np.int64)

    def degrees(self, vertex_set: np.ndarray) -> np.ndarray:
        """``S(r, s) = |U_s ∩ U_r| / |U_r|`` for every slot (float64)."""
        if vertex_set.size == 0:
            return np.zeros(self.num_slots)
        return self.overlaps(vertex_set) / vertex_set.size

    def add(self, slot: int, vertex_set: np.ndarray) -> int:
        """Add a request's (unique) vertex set to a slot; returns the new vertices."""
        if self.mask is not None:  # the bitmask already says which vertices are new
            bit = np.uint8(1 << slot)
            m = self.mask[vertex_set]
            new = int(vertex_set.size - np.count_nonzero(m & bit))
            self.mask[vertex_set] = m | bit
            self._lazy[slot].append(vertex_set)  # counted when read
        else:
            col = self._counts[:, slot]
            new = int(np.count_nonzero(col[vertex_set] == 0))
            col[vertex_set] += 1
            self._dirty[slot] = True
        self.sizes[slot] += new
        return new

    def remove(self, slot: int, vertex_set: np.ndarray) -> int:
        """Remove a request's vertex set from a slot; returns the vertices dropped."""
        col = self.counts[:, slot]  # (brought up to date)
        if vertex_set.size and int(col[vertex_set].min()) == 0:
            raise ValueError(f"slot {slot} does not hold this vertex set")
        col[vertex_set] -= 1
        emptied = col[vertex_set] == 0
        gone = int(np.count_nonzero(emptied))
        self.sizes[slot] -= gone
        if self.mask is not None:
            self.mask[vertex_set[emptied]] &= np.uint8(~(1 << slot) & 0xFF)
        return gone

    def clear(self, slot: int) -> None:
        self._lazy[slot].clear()
        if self._dirty[slot]:
            self._counts[:, slot] = 0
            self._dirty[slot] = False
        self.sizes[slot] = 0
        if self.mask is not None:
            self.mask &= np.uint8(~(1 << slot) & 0xFF)

    def union(self, slot: int) -> np.ndarray:
        """``U_s`` as a sorted int64 array."""
        return np.flatnonzero(self.counts[:, slot]).astype(np.int64)

    def copy(self) -> SharingIndex:
        other = SharingIndex.__new__(SharingIndex)
        other.num_nodes, other.num_slots = self.num_nodes, self.num_slots
        other._counts = self.counts.copy()
        other._lazy = [[] for _ in range(self.num_slots)]
        other._dirty = list(self._dirty)
        other.sizes = self.sizes.copy()
        other.mask = self.mask.copy() if self.mask is not None else None
        other._bits = self._bits
        return other
