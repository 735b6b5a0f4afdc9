"""The feature rows a graph's versions set, as one memory function sees them.

A call carries the graph version its request runs on (gnn_faas/graph_version.py).
:class:`RowVersions` reads, when a call names a version newer than it knows,
only the record of that version and the segments after the last one it read
(storage/versions.py), and keeps every row the log set with the version that
set it (``key = id << 32 | version``, sorted): the row of ``id`` at version
``v`` is the entry with the largest version ``<= v``, found for a whole batch
of ids with one ``searchsorted``. Rows with a history never enter the feature
cache, and a newly set row is removed from it: the cache holds only rows that
no version changed, so it is right for every version (exact invalidation,
never a flush).

A call needs the segments only up to its *rows version* (graph_version.rows):
later ones changed only edges. The ones it names beyond are read behind the
calls, in bulk once they are :data:`FOLLOW_LAG` ahead (:meth:`RowVersions.follow`,
one background reader), so the function stays close to the newest version without
a call waiting for it: a call that needs a row-setting version reads at most the
lag's segments besides (a function left far behind would read the whole log at once).

A compaction moves the graph to a new base. The function then reads the new
base's blobs for versions from the compacted one on, and keeps the base it
started on for older versions until no request can still be running on them
(``keep_s``, longer than any deadline). A function started after a compaction
can still be called on a version before it (a request in flight across the
compaction): :meth:`RowVersions.reach_back` then opens the older base and reads
its whole log (kept for the compaction's grace period), so that every row that
differs between the two bases has a history and stays out of the cache.
"""

from __future__ import annotations

import bisect
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from gnn_faas.errors import InvalidRequest
from gnn_faas.storage.format import GraphHandle
from gnn_faas.storage.versions import latest, read_deltas, record, segments_after

log = logging.getLogger("gnn_faas.memory")

KEEP_OLD_BASE_S = 300.0
FOLLOW_LAG = 64  # versions a function may lag before it reads them behind the calls


@dataclass
class Base:
    """A base this function reads: the version it holds and how to read its rows."""

    version: int
    prefix: str
    graph: GraphHandle
    load_rows: Callable[[np.ndarray], np.ndarray]
    retired_at: float | None = None


class RowVersions:
    """See the module docstring. ``open_base(prefix)`` returns ``(graph,
    load_rows)`` of a base; ``invalidate(ids)`` drops rows from the cache."""

    def __init__(
        self,
        graph: GraphHandle,
        load_rows: Callable[[np.ndarray], np.ndarray],
        open_base: Callable[[str], tuple[GraphHandle, Callable]],
        invalidate: Callable[[np.ndarray], None],
        keep_s: float = KEEP_OLD_BASE_S,
    ):
        self.backend, self.name = graph.backend, graph.name
        self._open_base = open_base
        self._invalidate = invalidate
        self.keep_s = keep_s
        self.dim = graph.manifest.feature_dim
        self._lock = threading.Lock()
        self._lock_behind = threading.Lock()
        rec = latest(self.backend, self.name, base=graph)
        self.bases = [Base(rec.base_version, graph.prefix, graph, load_rows)]
        self.known = rec.base_version
        self.keys = np.zeros(0, np.int64)
        self.rows = np.zeros((0, self.dim), np.float32)
        self.changed = np.zeros(0, np.int64)  # ids with a history, sorted
        # the vertex count from each version that changed it on (and each base), by version
        self.num_nodes = {rec.base_version: graph.num_nodes}
        self._counted = [rec.base_version]  # its keys, sorted
        self.segments_read = 0
        self.read_on_calls = 0  # segments a call waited for (the rest were read behind)
        self._behind_target = 0
        self._behind: threading.Thread | None = None
        self.invalidated = 0
        if rec.version > rec.base_version:
            self.ensure(rec.version, on_call=False)

    # -- catching up ---------------------------------------------------------------
    def ensure(self, version: int, on_call: bool = True) -> None:
        """Know every version up to ``version`` (its record and the new segments)."""
        if version <= self.known:
            return
        with self._lock:
            if version <= self.known:
                return
            rec = record(self.backend, self.name, version)
            if rec is None:
                raise InvalidRequest(f"graph {self.name!r} has no version {version}")
            if rec.base != self.bases[-1].prefix:
                self._new_base(rec.base, rec.base_version)
            self._take(segments_after(self.backend, rec, self.known), on_call)
            self.known = version

    def _take(self, segments, on_call: bool) -> None:
        """Read ``segments`` and keep the rows they set (and the vertex counts they
        change); exactly those ids leave the cache and have a history from then on."""
        keys, rows, ids = [self.keys], [self.rows], []
        for (v, _, _), delta in zip(segments, read_deltas(self.backend, segments)):
            set_ids = np.concatenate((delta.new_ids, delta.feat_ids))
            set_rows = np.concatenate((delta.new_features, delta.feat_rows))
            keys.append((set_ids << 32) | np.int64(v))
            rows.append(set_rows.reshape(-1, self.dim))
            ids.append(set_ids)
            if delta.num_new:
                self._count(v, delta.base_nodes + delta.num_new)
            self.segments_read += 1
            self.read_on_calls += on_call
        if any(k.size for k in keys[1:]):  # edges alone leave the rows as they are
            all_keys = np.concatenate(keys)
            order = np.argsort(all_keys, kind="stable")
            self.keys, self.rows = all_keys[order], np.concatenate(rows)[order]
        fresh = np.unique(np.concatenate(ids)) if ids else np.zeros(0, np.int64)
        if fresh.size:
            self._invalidate(fresh)  # exactly the rows these versions set
            self.invalidated += int(fresh.size)
            self.changed = np.union1d(self.changed, fresh)

    def follow(self, version: int) -> None:
        """Read up to ``version`` behind the calls once it is more than
        :data:`FOLLOW_LAG` versions ahead (in bulk: one read of the segments; one
        background reader at a time, a newer target while it runs is taken on)."""
        if version - self.known <= FOLLOW_LAG:
            return
        with self._lock_behind:
            self._behind_target = max(self._behind_target, version)
            if self._behind is not None and self._behind.is_alive():
                return
            self._behind = threading.Thread(target=self._read_behind, daemon=True,
                                            name=f"versions-{self.name}")  # fmt: skip
            self._behind.start()

    def _read_behind(self) -> None:
        while True:
            with self._lock_behind:
                target = self._behind_target
                if target <= self.known:
                    self._behind = None
                    return
            try:
                self.ensure(target, on_call=False)
            except Exception as exc:  # noqa: BLE001 - a call that needs it reads it itself
                log.debug("graph %s: reading version %d behind the calls: %s",
                          self.name, target, exc)  # fmt: skip
                with self._lock_behind:
                    self._behind = None
                return

    def _new_base(self, prefix: str, base_version: int) -> None:
        """A compaction: read versions from ``base_version`` on from the new base."""
        graph, load_rows = self._open_base(prefix)
        now = time.monotonic()
        self.bases[-1].retired_at = now
        self.bases.append(Base(base_version, prefix, graph, load_rows))
        self._count(base_version, graph.num_nodes)
        self.bases = [
            b for b in self.bases if b.retired_at is None or now - b.retired_at < self.keep_s
        ]
        log.info("graph %s: reading base %s from version %d on", self.name, prefix, base_version)

    def reach_back(self, version: int) -> None:
        """Know ``version`` when it is older than every base this function reads:
        the base it was on and that base's log, to the version the next base
        folded (one compaction at a time, back as far as needed)."""
        if version >= self.bases[0].version:
            return
        with self._lock:
            while version < self.bases[0].version:
                first = self.bases[0]
                # the folded version's own record is the last on the older base
                rec = record(self.backend, self.name, first.version)
                if rec is None or rec.base == first.prefix:
                    raise InvalidRequest(
                        f"graph {self.name!r}: version {version} is no longer stored "
                        f"(compacted into version {first.version} past its grace period)"
                    )
                graph, load_rows = self._open_base(rec.base)
                self._take(segments_after(self.backend, rec, rec.base_version), on_call=True)
                self._count(rec.base_version, graph.num_nodes)
                old = Base(
                    rec.base_version, rec.base, graph, load_rows, retired_at=time.monotonic()
                )
                self.bases.insert(0, old)
                log.info("graph %s: reading base %s for version %d (before base %s)",
                         self.name, rec.base, version, first.prefix)  # fmt: skip

    # -- reading ---------------------------------------------------------------------
    def nodes_at(self, version: int | None) -> int:
        """Vertices of the graph at ``version`` (the newest known for ``None``)."""
        v = self.known if version is None else min(version, self.known)
        i = bisect.bisect_right(self._counted, v) - 1
        return self.num_nodes[self._counted[max(i, 0)]]

    def _count(self, version: int, nodes: int) -> None:
        if version not in self.num_nodes:
            bisect.insort(self._counted, version)
        self.num_nodes[version] = nodes

    def base_at(self, version: int | None) -> Base:
        v = self.known if version is None else version
        usable = [b for b in self.bases if b.version <= v]
        return usable[-1] if usable else self.bases[0]

    def split(self, ids: np.ndarray, version: int | None) -> tuple[np.ndarray, np.ndarray]:
        """``(mask, rows)``: which ``ids`` have a row set at ``version`` after its
        base's version, and those rows (the others are read from the base)."""
        ids = np.asarray(ids, np.int64)
        if self.keys.size == 0:
            return np.zeros(ids.size, bool), np.zeros((0, self.dim), np.float32)
        v = self.known if version is None else version
        floor = self.base_at(v).version
        pos = np.searchsorted(self.keys, (ids << 32) | np.int64(v), side="right") - 1
        ok = pos >= 0
        hit_key = self.keys[np.maximum(pos, 0)]
        ok &= (hit_key >> 32) == ids
        ok &= (hit_key & 0xFFFFFFFF) > floor
        return ok, self.rows[pos[ok]]

    def has_history(self, ids: np.ndarray) -> np.ndarray:
        """Whether a version ever set each id's row (such rows stay out of the cache)."""
        if self.changed.size == 0:
            return np.zeros(np.shape(ids), bool)
        pos = np.searchsorted(self.changed, ids)
        pos[pos == self.changed.size] = 0
        return self.changed[pos] == ids

    def figures(self) -> dict:
        return {
            "known_version": self.known,
            "segments_read": self.segments_read,
            "segments_read_on_calls": self.read_on_calls,
            "rows_with_history": int(self.changed.size),
            "rows_invalidated": self.invalidated,
            "bases": [b.prefix for b in self.bases],
        }
