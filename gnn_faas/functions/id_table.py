"""A vectorised open-addressing hash table from vertex ids to numbers.

The memory function keeps per-vertex state (cache slots, access frequencies)
for the vertices its requests touched, never for the whole graph: a dense
``num_nodes`` array would make an idle instance's memory grow with the graph
(10 bytes a vertex is a gigabyte at 100M vertices). This table is sized by its
entries instead:

    capacity = smallest power of two >= 2 * (entries + tombstones)   (load <= 1/2)

Keys are non-negative int64 ids (``-1`` marks an empty slot, ``-2`` a deleted
one); the home slot is ``splitmix64(id) & (capacity - 1)`` and collisions probe
linearly. Every operation works on whole arrays of ids: one numpy pass per
probe step, and at load 1/2 the expected probe length is 1.5, so the number of
passes stays small whatever the batch size (no Python loop per id).
"""

from __future__ import annotations

import numpy as np

from gnn_faas.storage.fetcher import splitmix64

EMPTY = -1
DELETED = -2
MIN_CAPACITY = 16


class IdTable:
    """``id -> value`` for a batch of ids at a time (values of ``dtype``)."""

    def __init__(self, dtype=np.int64, capacity: int = MIN_CAPACITY):
        self.dtype = np.dtype(dtype)
        self._alloc(_pow2(max(MIN_CAPACITY, capacity)))

    def _alloc(self, capacity: int) -> None:
        self._keys = np.full(capacity, EMPTY, dtype=np.int64)
        self._vals = np.zeros(capacity, dtype=self.dtype)
        self._mask = np.int64(capacity - 1)
        self._live = 0
        self._used = 0  # live + tombstones (what lengthens probes)

    def __len__(self) -> int:
        return self._live

    @property
    def capacity(self) -> int:
        return int(self._keys.size)

    @property
    def nbytes(self) -> int:
        return int(self._keys.nbytes + self._vals.nbytes)

    def _home(self, keys: np.ndarray) -> np.ndarray:
        return (splitmix64(keys) & np.uint64(self._mask)).astype(np.int64)

    # -- lookups -----------------------------------------------------------------
    def positions(self, keys: np.ndarray) -> np.ndarray:
        """Table position of each key, ``-1`` where absent."""
        keys = np.asarray(keys, dtype=np.int64).ravel()
        out = np.full(keys.size, -1, dtype=np.int64)
        if keys.size == 0 or self._live == 0:
            return out
        todo = np.arange(keys.size)
        idx = self._home(keys)
        want = keys
        while todo.size:
            k = self._keys[idx]
            found = k == want
            out[todo[found]] = idx[found]
            more = ~found & (k != EMPTY)
            todo, idx, want = todo[more], (idx[more] + 1) & self._mask, want[more]
        return out

    def get(self, keys: np.ndarray, default=0) -> np.ndarray:
        """Values of ``keys`` (``default`` where absent)."""
        pos = self.positions(keys)
        out = np.full(pos.size, default, dtype=self.dtype)
        hit = pos >= 0
        out[hit] = self._vals[pos[hit]]
        return out

    def contains(self, keys: np.ndarray) -> np.ndarray:
        return self.positions(keys) >= 0

    def items(self) -> tuple[np.ndarray, np.ndarray]:
        """``(keys, values)`` of every entry (table order)."""
        live = self._keys >= 0
        return self._keys[live].copy(), self._vals[live].copy()

    # -- updates -----------------------------------------------------------------
    def put(self, keys: np.ndarray, values) -> None:
        """Set ``keys`` (unique) to ``values`` (an array or one number)."""
        keys = np.asarray(keys, dtype=np.int64).ravel()
        values = np.broadcast_to(np.asarray(values, dtype=self.dtype), keys.shape)
        if keys.size == 0:
            return
        pos = self.positions(keys)
        old = pos >= 0
        self._vals[pos[old]] = values[old]
        new = ~old
        if new.any():
            self._insert(keys[new], values[new])

    def add(self, keys: np.ndarray, amount=1) -> None:
        """``value += amount`` for ``keys`` (unique); absent keys start from 0."""
        keys = np.asarray(keys, dtype=np.int64).ravel()
        if keys.size == 0:
            return
        pos = self.positions(keys)
        old = pos >= 0
        amount = np.broadcast_to(np.asarray(amount, dtype=self.dtype), keys.shape)
        self._vals[pos[old]] += amount[old]
        new = ~old
        if new.any():
            self._insert(keys[new], amount[new])

    def delete(self, keys: np.ndarray) -> None:
        pos = self.positions(keys)
        pos = np.unique(pos[pos >= 0])
        self._keys[pos] = DELETED
        self._live -= int(pos.size)

    def scale(self, factor: float, floor: float | None = None) -> None:
        """Multiply every value by ``factor``; drop entries whose value falls below ``floor``."""
        live = self._keys >= 0
        self._vals[live] *= self.dtype.type(factor)
        if floor is not None:
            gone = live & (self._vals < floor)
            n = int(np.count_nonzero(gone))
            if n:
                self._keys[gone] = DELETED
                self._live -= n
        if self._used > 4 * max(self._live, MIN_CAPACITY // 4):
            self._rehash(self._live)  # mostly tombstones: shrink back to the entries

    def clear(self) -> None:
        self._alloc(MIN_CAPACITY)

    # -- internals ---------------------------------------------------------------
    def _insert(self, keys: np.ndarray, values: np.ndarray) -> None:
        """Insert keys known to be absent (unique)."""
        if 2 * (self._used + keys.size) > self.capacity:
            self._rehash(self._live + keys.size)
        todo = np.arange(keys.size)
        idx = self._home(keys)
        while todo.size:
            k = self._keys[idx]
            free = np.flatnonzero(k < 0)
            # several keys may reach the same free slot in one step: the first wins
            _, first = np.unique(idx[free], return_index=True)
            win = free[first]
            slots = idx[win]
            self._used += int(np.count_nonzero(self._keys[slots] == EMPTY))
            self._keys[slots] = keys[todo[win]]
            self._vals[slots] = values[todo[win]]
            self._live += int(win.size)
            lose = np.ones(todo.size, dtype=bool)
            lose[win] = False
            todo, idx = todo[lose], (idx[lose] + 1) & self._mask

    def _rehash(self, entries: int) -> None:
        keys, vals = self.items()
        self._alloc(_pow2(max(MIN_CAPACITY, 2 * entries + 1)))
        if keys.size:
            self._insert(keys, vals)


def _pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()
