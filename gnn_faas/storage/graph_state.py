"""A graph at one version: its base plus the changes of its log, immutable.

A versioned graph (storage/versions.py) is an immutable base in the store
format plus delta segments (storage/delta.py). :class:`GraphState` is one
version of it in memory, built by applying the segments to the base in order:

- ``changed``: the full in-neighbour list of every vertex whose in-edges any
  segment changed (and of every added vertex), as small CSRs over sorted ids in
  two levels: the recent lists (``rc_*``) over the older ones (``ch_*``); any
  other vertex's list is the base's (read from the resident or chunk-cached
  structure). A new version rewrites only the recent level, which is folded into
  the older one when it outgrows :func:`fold_past` (``sqrt(older entries *
  4096)``, at least 65,536): a commit costs about the square root of the log,
  not the log (one level would copy every changed list on every commit);
- :class:`FeatureState`: the feature rows set since the base (added and
  replaced vertices, the latest value each), the labels of added vertices,
  the removed vertices and the vertex count.

A state never changes: :meth:`GraphState.apply` returns the next one, so a
request holds one state from start to end (snapshot isolation) while newer
ones are built beside it. :meth:`GraphState.prepare` checks a client's batch
against the state (the first offending row named, nothing applied) and spells
out what it implies. Memory functions keep only a :class:`FeatureState`: the
gateway sends them the structure of each request.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from math import isqrt

import numpy as np

from gnn_faas.errors import InvalidRequest, NotFound
from gnn_faas.storage.delta import Delta, UpdateBatch
from gnn_faas.storage.format import GraphHandle
from gnn_faas.storage.reorder import IdMap

FOLD_MIN_ENTRIES = 1 << 16  # the recent level folds past this many entries at least
FOLD_SCALE = 1 << 12  # ... and past sqrt(older entries * FOLD_SCALE)


def fold_past(older_entries: int) -> int:
    """Entries past which the recent level of changed lists folds into the older one."""
    return max(FOLD_MIN_ENTRIES, isqrt(older_entries * FOLD_SCALE))


def _csr_rows(ids: np.ndarray, ptr: np.ndarray, idx: np.ndarray, want: np.ndarray):
    """``(counts, values)`` of rows ``want`` (each in sorted ``ids``) of a small CSR."""
    pos = np.searchsorted(ids, want)
    lo, hi = ptr[pos], ptr[pos + 1]
    counts = (hi - lo).astype(np.int64)
    total = int(counts.sum())
    if total == 0:
        return counts, np.zeros(0, np.int64)
    starts = np.repeat(lo - (np.cumsum(counts) - counts), counts)
    return counts, idx[starts + np.arange(total)]


def _member(sorted_ids: np.ndarray, v: np.ndarray) -> np.ndarray:
    if sorted_ids.size == 0:
        return np.zeros(np.shape(v), bool)
    pos = np.searchsorted(sorted_ids, v)
    pos[pos == sorted_ids.size] = 0
    return sorted_ids[pos] == v


def interleave(
    mask: np.ndarray,
    counts_a: np.ndarray,
    values_a: np.ndarray,
    counts_b: np.ndarray,
    values_b: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Per-owner lists of owners ``~mask`` (``a``) and ``mask`` (``b``) put back in
    the owners' order: ``(counts, values)``."""
    pos_a, pos_b = np.flatnonzero(~mask), np.flatnonzero(mask)
    counts = np.zeros(mask.size, np.int64)
    counts[pos_a], counts[pos_b] = counts_a, counts_b
    owners = np.concatenate((np.repeat(pos_a, counts_a), np.repeat(pos_b, counts_b)))
    values = np.concatenate((values_a, values_b))
    return counts, values[np.argsort(owners, kind="stable")]


@dataclass(frozen=True)
class FeatureState:
    """What a version changed of the vertices: their count, the rows set since
    the base (``feat_ids`` sorted, ``feat_rows`` aligned), added vertices'
    labels (``new_labels[i]``: vertex ``base_nodes + i``, -1 for none), the
    removed vertices (sorted)."""

    base_nodes: int
    num_nodes: int
    feat_ids: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    feat_rows: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), np.float32))
    new_labels: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    removed: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))

    def apply(self, delta: Delta) -> FeatureState:
        rows_ids = np.concatenate((delta.new_ids, delta.feat_ids))
        rows = (
            np.concatenate((delta.new_features, delta.feat_rows))
            if rows_ids.size
            else np.zeros((0, self.feat_rows.shape[1] if self.feat_rows.size else 0), np.float32)
        )
        feat_ids, feat_rows = self.feat_ids, self.feat_rows
        if rows_ids.size:
            # the latest value wins: this delta's rows over older ones, its last over its first
            last = np.unique(rows_ids[::-1], return_index=True)[1]
            take = rows_ids.size - 1 - last
            ids_new, rows_new = rows_ids[take], rows[take]
            keep = ~_member(ids_new, self.feat_ids) if self.feat_ids.size else np.zeros(0, bool)
            ids_all = np.concatenate((self.feat_ids[keep], ids_new))
            rows_all = (
                np.concatenate((self.feat_rows[keep], rows_new))
                if self.feat_rows.size
                else rows_new
            )
            order = np.argsort(ids_all, kind="stable")
            feat_ids, feat_rows = ids_all[order], rows_all[order]
        return FeatureState(
            base_nodes=self.base_nodes,
            num_nodes=self.num_nodes + delta.num_new,
            feat_ids=feat_ids,
            feat_rows=np.ascontiguousarray(feat_rows, np.float32),
            new_labels=np.concatenate((self.new_labels, delta.new_labels)),
            removed=np.union1d(self.removed, delta.removed),
        )

    def has_row(self, ids: np.ndarray) -> np.ndarray:
        """Whether each id's row was set since the base (read it with :meth:`rows`)."""
        return _member(self.feat_ids, np.asarray(ids, np.int64))

    def rows(self, ids: np.ndarray) -> np.ndarray:
        """The set rows of ``ids`` (each one :meth:`has_row`)."""
        return self.feat_rows[np.searchsorted(self.feat_ids, np.asarray(ids, np.int64))]

    def is_removed(self, ids: np.ndarray) -> np.ndarray:
        return _member(self.removed, np.asarray(ids, np.int64))

    @property
    def nbytes(self) -> int:
        return int(self.feat_ids.nbytes + self.feat_rows.nbytes + self.removed.nbytes)


@dataclass(frozen=True)
class GraphState:
    """One version of a graph (see the module docstring). ``base_lists(v)`` reads
    base in-lists of base vertices (the fetcher's structure reads)."""

    graph: GraphHandle
    version: int
    base_version: int
    features: FeatureState
    num_edges: int
    base_lists: object = field(repr=False, compare=False)
    ch_ids: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    ch_ptr: np.ndarray = field(default_factory=lambda: np.zeros(1, np.int64))
    ch_idx: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    rc_ids: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    rc_ptr: np.ndarray = field(default_factory=lambda: np.zeros(1, np.int64))
    rc_idx: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    id_map: IdMap | None = None
    segments: tuple[str, ...] = ()
    delta_bytes: int = 0
    created: float = 0.0
    rows_version: int = -1  # the newest version <= version that added vertices, set
    # rows or moved the base; from it to ``version`` only edges changed, so a memory
    # function that knows it answers for ``version`` too (gnn_faas/graph_version.py)

    def __post_init__(self) -> None:
        if self.rows_version < 0:
            object.__setattr__(self, "rows_version", self.base_version)

    @classmethod
    def of_base(cls, graph: GraphHandle, base_lists, version: int = 0, **kw) -> GraphState:
        n = graph.num_nodes
        removed = np.asarray(graph.manifest.extra.get("removed_vertices", []), np.int64)
        feats = FeatureState(base_nodes=n, num_nodes=n, removed=np.sort(removed))
        return cls(
            graph=graph,
            version=version,
            base_version=version,
            features=feats,
            num_edges=graph.num_edges,
            base_lists=base_lists,
            id_map=IdMap.of(graph),
            **kw,
        )

    # -- reads ---------------------------------------------------------------------
    @property
    def num_nodes(self) -> int:
        return self.features.num_nodes

    @property
    def base_nodes(self) -> int:
        return self.graph.num_nodes

    @property
    def has_changes(self) -> bool:
        return self.ch_ids.size > 0 or self.rc_ids.size > 0

    def is_changed(self, v: np.ndarray) -> np.ndarray:
        changed = _member(self.rc_ids, v)
        if self.ch_ids.size:
            changed |= _member(self.ch_ids, v)
        return changed

    def changed_lists(self, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """In-lists of changed vertices ``v`` (each :meth:`is_changed`): the recent
        level's where it holds one, else the older level's."""
        recent = _member(self.rc_ids, v)
        if not recent.any():
            return _csr_rows(self.ch_ids, self.ch_ptr, self.ch_idx, v)
        if recent.all():
            return _csr_rows(self.rc_ids, self.rc_ptr, self.rc_idx, v)
        c_o, n_o = _csr_rows(self.ch_ids, self.ch_ptr, self.ch_idx, v[~recent])
        c_r, n_r = _csr_rows(self.rc_ids, self.rc_ptr, self.rc_idx, v[recent])
        return interleave(recent, c_o, n_o, c_r, n_r)

    def changed_csr(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(ids, ptr, idx)``: every changed list in one CSR over sorted ids (the two
        levels merged once per state, for the readers of them all: compaction, a
        directed graph's out-edges)."""
        if self.rc_ids.size == 0:
            return self.ch_ids, self.ch_ptr, self.ch_idx
        cached = self.__dict__.get("_changed_csr")
        if cached is None:
            cached = _merge_lists(self.ch_ids, self.ch_ptr, self.ch_idx, self.rc_ids,
                                  np.diff(self.rc_ptr), self.rc_idx)  # fmt: skip
            object.__setattr__(self, "_changed_csr", cached)
        return cached

    def in_lists(self, vertices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(counts, concatenated in-neighbours)`` of existing ``vertices``."""
        v = np.asarray(vertices, np.int64)
        changed = self.is_changed(v)
        if not changed.any():
            return self.base_lists(v)
        c_b, n_b = (
            self.base_lists(v[~changed]) if (~changed).any() else (np.zeros(0, np.int64),) * 2
        )
        c_c, n_c = self.changed_lists(v[changed])
        return interleave(changed, c_b, n_b, c_c, n_c)

    def out_neighbours(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(src, dst)`` of every current edge leaving a vertex of ``x`` (``dst``
        aggregates from it). A symmetrised graph's in-lists are its out-lists; a
        directed one's base out-edges come from the transposed base."""
        x = np.unique(np.asarray(x, np.int64))
        if self.graph.manifest.symmetrized:
            counts, nbrs = self.in_lists(x)
            return np.repeat(x, counts), nbrs
        parts = []
        base_x = x[x < self.base_nodes]
        if base_x.size:
            bt = self._base_transpose()
            c, d = _csr_rows(np.arange(self.base_nodes), bt.indptr, bt.indices, base_x)
            src, dst = np.repeat(base_x, c), d.astype(np.int64)
            # into a changed vertex only its current list counts (added below)
            keep = ~self.is_changed(dst)
            parts.append((src[keep], dst[keep]))
        ch_ids, ch_ptr, ch_idx = self.changed_csr()
        if ch_idx.size:  # the changed lists that hold a vertex of x
            owners = np.repeat(ch_ids, np.diff(ch_ptr))
            hit = _member(x, ch_idx)
            parts.append((ch_idx[hit], owners[hit]))
        if not parts:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])

    def _base_transpose(self):
        cached = self.__dict__.get("_bt")
        if cached is None:
            import scipy.sparse as sp

            ptr = self.graph.read_blob("indptr")
            idx = self.graph.read_blob("indices")
            n = self.base_nodes
            a = sp.csr_matrix((np.ones(idx.size, np.int8), idx, ptr), shape=(n, n))
            cached = a.T.tocsr()
            cached.sort_indices()
            object.__setattr__(self, "_bt", cached)
        return cached

    def changed_vertices(self) -> np.ndarray:
        """Every vertex this version changed since its base: its in-list (and so its
        in-degree), its row, or its existence (sorted)."""
        lists = np.union1d(self.ch_ids, self.rc_ids)
        return np.union1d(np.union1d(lists, self.features.feat_ids), self.features.removed)

    def reach(self, seeds: np.ndarray, hops: int) -> np.ndarray:
        """``seeds`` and every vertex that aggregates from one of them within
        ``hops`` hops (sorted): whose layer-``hops`` output a change at the seeds
        can move."""
        out = np.unique(np.asarray(seeds, np.int64))
        frontier = out
        for _ in range(max(0, hops)):
            if frontier.size == 0:
                break
            _, dst = self.out_neighbours(frontier)
            new = np.setdiff1d(np.unique(dst), out, assume_unique=True)
            out = np.union1d(out, new)
            frontier = new
        return out

    def check_targets(self, ids: np.ndarray) -> None:
        """A removed vertex is no more: :class:`NotFound` (404) naming it."""
        bad = self.features.is_removed(ids)
        if bad.any():
            raise NotFound(
                f"vertex {int(np.asarray(ids)[bad][0])} was removed from graph "
                f"{self.graph.name!r} (version {self.version})"
            )

    # -- a client's batch ----------------------------------------------------------
    def prepare(self, batch: UpdateBatch) -> Delta:
        """``batch`` checked against this version and spelt out as a :class:`Delta`
        (:class:`InvalidRequest` naming the first offending row; nothing applied)."""
        n, k = self.num_nodes, batch.new_features.shape[0]
        dim = self.graph.manifest.feature_dim
        for name, rows in (("new_features", batch.new_features), ("features", batch.features)):
            if rows.shape[0] and rows.shape[1] != dim:
                raise InvalidRequest(
                    f"{name} row 0: {rows.shape[1]} values, the graph's features have {dim}"
                )
        new_features = batch.new_features.reshape(k, dim) if k else np.zeros((0, dim), np.float32)
        labels = batch.new_labels if batch.new_labels is not None else np.full(k, -1, np.int64)
        if batch.new_ids is not None:
            ids = batch.new_ids
            _first_duplicate("new_ids", ids)
            exists = ids < n
            if exists.any():
                i = int(np.argmax(exists))
                raise InvalidRequest(f"new_ids row {i}: vertex {int(ids[i])} already exists")
            beyond = ids >= n + k
            if beyond.any():
                i = int(np.argmax(beyond))
                raise InvalidRequest(
                    f"new_ids row {i}: new vertices take the next free ids [{n}, {n + k}) "
                    f"at version {self.version}, not {int(ids[i])}"
                )
            order = np.argsort(ids)
            new_features, labels = new_features[order], labels[order]
        removing = self._ids("remove_vertices", batch.remove_vertices, n, 0)
        _first_duplicate("remove_vertices", removing)
        add = self._edges("add_edges", batch.add_edges, n, k, removing)
        rem = self._edges("remove_edges", batch.remove_edges, n, 0, removing)
        feat_ids = self._ids("feature_ids", batch.feature_ids, n, k)
        sym = self.graph.manifest.symmetrized
        add_src, add_dst = add[:, 0], add[:, 1]
        rem_src, rem_dst = rem[:, 0], rem[:, 1]
        if rem.size:
            self._check_present(rem_src, rem_dst)
        if sym:
            add_src, add_dst = (
                np.concatenate((add_src, add_dst)),
                np.concatenate((add_dst, add_src)),
            )
            rem_src, rem_dst = (
                np.concatenate((rem_src, rem_dst)),
                np.concatenate((rem_dst, rem_src)),
            )
        if removing.size:  # a removed vertex's edges go, both ways
            c, nb = self.in_lists(removing)
            o_src, o_dst = self.out_neighbours(removing)
            rem_src = np.concatenate((rem_src, nb, o_src))
            rem_dst = np.concatenate((rem_dst, np.repeat(removing, c), o_dst))
        return Delta(
            base_nodes=n,
            new_features=np.ascontiguousarray(new_features, np.float32),
            new_labels=np.asarray(labels, np.int64),
            add_src=add_src.astype(np.int64),
            add_dst=add_dst.astype(np.int64),
            rem_src=rem_src.astype(np.int64),
            rem_dst=rem_dst.astype(np.int64),
            feat_ids=feat_ids,
            feat_rows=np.ascontiguousarray(batch.features.reshape(feat_ids.size, dim), np.float32),
            removed=np.sort(removing),
        )

    def _stored(self, ids: np.ndarray) -> np.ndarray:
        """Client ids as stored ids (a renumbered graph's base vertices mapped)."""
        if self.id_map is None:
            return ids
        return self.id_map.to_stored(ids)

    def _ids(self, name: str, ids: np.ndarray, n: int, k: int, per_row: int = 1) -> np.ndarray:
        """Client ids of existing (or this batch's new) vertices as stored ids
        (``per_row`` ids make one row of ``name``, for the message)."""
        ids = np.asarray(ids, np.int64).reshape(-1)
        unknown = (ids < 0) | (ids >= n + k)
        if unknown.any():
            i = int(np.argmax(unknown))
            raise InvalidRequest(f"{name} row {i // per_row}: unknown vertex id {int(ids[i])}")
        gone = self.features.is_removed(ids)
        if gone.any():
            i = int(np.argmax(gone))
            raise InvalidRequest(f"{name} row {i // per_row}: vertex {int(ids[i])} was removed")
        return self._stored(ids)

    def _edges(self, name: str, e: np.ndarray, n: int, k: int, removing: np.ndarray) -> np.ndarray:
        flat = self._ids(name, e.reshape(-1), n, k, per_row=2)
        dropped = _member(np.sort(removing), flat)
        if dropped.any():
            i = int(np.argmax(dropped)) // 2
            raise InvalidRequest(f"{name} row {i}: vertex {int(e.reshape(-1)[np.argmax(dropped)])} "
                                 "is removed by this batch")  # fmt: skip
        return flat.reshape(-1, 2)

    def _check_present(self, src: np.ndarray, dst: np.ndarray) -> None:
        """Every edge to remove exists (:class:`InvalidRequest` naming the first that does not)."""
        c, nb = self.in_lists(dst)
        # edge i is present when src[i] is in dst[i]'s list: one pass over the lists
        # (no sort or hash of them; this runs on every commit that removes edges)
        row = np.repeat(np.arange(dst.size), c)
        missing = np.bincount(row[nb == src[row]], minlength=dst.size) == 0
        if missing.any():
            i = int(np.argmax(missing))
            raise InvalidRequest(f"remove_edges row {i}: no edge ({int(src[i])}, {int(dst[i])})")

    # -- the next version ----------------------------------------------------------
    def apply(self, delta: Delta, version: int, segment: str = "", nbytes: int = 0) -> GraphState:
        """The state after ``delta`` (this one is left as it is)."""
        return self.apply_all([(delta, version, segment, nbytes)])

    def apply_all(self, items: list[tuple[Delta, int, str, int]]) -> GraphState:
        """The state after each ``(delta, version, segment, bytes)`` of ``items`` in
        order, as :meth:`apply` one by one gives it, in one merge of the changed
        lists however many deltas (catching up, compaction).

        Within a delta removals come before additions; a removal takes every copy
        of its edge present then. So an edge of the old lists stays unless some
        delta removes it, and an added edge stays unless a later delta removes it;
        the survivors keep their order (old entries first, then the added ones in
        delta order)."""
        if not items:
            return self
        deltas = [it[0] for it in items]
        feats = self.features.apply(_joined(deltas))
        m = np.int64(feats.num_nodes + 1)
        pos = np.arange(len(deltas))
        add_src = np.concatenate([d.add_src for d in deltas])
        add_dst = np.concatenate([d.add_dst for d in deltas])
        rem_dst = np.concatenate([d.rem_dst for d in deltas])
        new_ids = np.concatenate([d.new_ids for d in deltas])
        affected = np.unique(np.concatenate((add_dst, rem_dst, new_ids)))
        existing = affected[affected < self.num_nodes]
        c_old, v_old = self.in_lists(existing) if existing.size else (np.zeros(0, np.int64),) * 2
        owners = np.repeat(existing, c_old)
        removed_edges = 0
        if rem_dst.size:
            rem_key = rem_dst * m + np.concatenate([d.rem_src for d in deltas])
            rem_at = np.repeat(pos, [d.rem_src.size for d in deltas])
            order = np.lexsort((rem_at, rem_key))
            rk, ra = rem_key[order], rem_at[order]
            last = np.append(rk[1:] != rk[:-1], True)
            keys, last_at = rk[last], ra[last]  # each removed edge, the last delta removing it
            if v_old.size:
                gone = _member(keys, owners * m + v_old)
                removed_edges = int(gone.sum())
                owners, v_old = owners[~gone], v_old[~gone]
            if add_src.size:  # an addition a later delta removed is gone too
                add_at = np.repeat(pos, [d.add_src.size for d in deltas])
                akey = add_dst * m + add_src
                hit = np.flatnonzero(_member(keys, akey))
                later = add_at[hit] < last_at[np.searchsorted(keys, akey[hit])]
                keep = np.ones(akey.size, bool)
                keep[hit[later]] = False
                add_src, add_dst = add_src[keep], add_dst[keep]
        owners = np.concatenate((owners, add_dst))
        values = np.concatenate((v_old, add_src))
        order = np.argsort(owners, kind="stable")  # old entries first, then the added ones
        counts = np.bincount(np.searchsorted(affected, owners), minlength=affected.size)
        recent = _merge_lists(self.rc_ids, self.rc_ptr, self.rc_idx, affected, counts,
                              values[order])  # fmt: skip
        older = (self.ch_ids, self.ch_ptr, self.ch_idx)
        if int(recent[1][-1]) > fold_past(int(self.ch_ptr[-1])):
            older = _merge_lists(*older, recent[0], np.diff(recent[1]), recent[2])
            recent = (np.zeros(0, np.int64), np.zeros(1, np.int64), np.zeros(0, np.int64))
        rows_at = [it[1] for it in items if it[0].sets_rows]
        return replace(
            self,
            version=items[-1][1],
            rows_version=rows_at[-1] if rows_at else self.rows_version,
            features=feats,
            num_edges=self.num_edges + int(add_src.size) - removed_edges,
            ch_ids=older[0],
            ch_ptr=older[1],
            ch_idx=older[2],
            rc_ids=recent[0],
            rc_ptr=recent[1],
            rc_idx=recent[2],
            segments=self.segments + tuple(it[2] for it in items if it[2]),
            delta_bytes=self.delta_bytes + int(sum(it[3] for it in items)),
        )

    def figures(self) -> dict:
        return {
            "version": self.version,
            "base_version": self.base_version,
            "rows_version": self.rows_version,
            "num_nodes": self.num_nodes,
            "num_edges": self.num_edges,
            "removed_vertices": int(self.features.removed.size),
            "changed_vertices": int(np.union1d(self.ch_ids, self.rc_ids).size),
            "changed_rows": int(self.features.feat_ids.size),
            "segments": len(self.segments),
            "delta_bytes": self.delta_bytes,
        }


def _joined(deltas: list[Delta]) -> Delta:
    """One delta with the rows, labels and removals of consecutive ``deltas`` in
    order (what :meth:`FeatureState.apply` reads; new vertices' ids follow on)."""
    if len(deltas) == 1:
        return deltas[0]
    cat = {
        name: np.concatenate([getattr(d, name) for d in deltas])
        for name in ("new_labels", "add_src", "add_dst", "rem_src", "rem_dst", "feat_ids",
                     "removed")
    }  # fmt: skip
    dims = {d.new_features.shape[1] for d in deltas} | {d.feat_rows.shape[1] for d in deltas}
    dim = max(dims)
    return Delta(
        base_nodes=deltas[0].base_nodes,
        new_features=np.concatenate([d.new_features.reshape(-1, dim) for d in deltas]),
        feat_rows=np.concatenate([d.feat_rows.reshape(-1, dim) for d in deltas]),
        **cat,
    )


def _merge_lists(ch_ids, ch_ptr, ch_idx, affected, counts, values):
    """The changed lists ``(ids, ptr, idx)`` with the lists of ``affected`` (sorted;
    ``counts`` and ``values`` grouped in that order) put in or replaced: one
    copy of the entries, no sort of them."""
    keep = ~_member(affected, ch_ids)
    kept = ch_ids[keep]
    ids = np.concatenate((kept, affected))
    by_id = np.argsort(ids, kind="stable")  # vertices, not entries
    ids = ids[by_id]
    sizes = np.concatenate((np.diff(ch_ptr)[keep], counts))[by_id]
    ptr = np.concatenate(([0], np.cumsum(sizes))).astype(np.int64)
    out = np.empty(int(ptr[-1]), np.int64)
    where = np.empty(by_id.size, np.int64)
    where[by_id] = np.arange(by_id.size)  # each list's place among the new ones
    k_lo, k_n = ch_ptr[:-1][keep], np.diff(ch_ptr)[keep]
    _copy_runs(out, ptr[where[: kept.size]], ch_idx, k_lo, k_n)
    a_lo = np.concatenate(([0], np.cumsum(counts)[:-1])).astype(np.int64)
    _copy_runs(out, ptr[where[kept.size :]], values, a_lo, counts)
    return ids.astype(np.int64), ptr, out


def _copy_runs(out, dst_lo, src, src_lo, n) -> None:
    """``out[dst_lo[i] : dst_lo[i] + n[i]] = src[src_lo[i] : src_lo[i] + n[i]]`` for all ``i``."""
    total = int(np.sum(n))
    if total == 0:
        return
    step = np.arange(total) - np.repeat(np.cumsum(n) - n, n)
    out[np.repeat(dst_lo, n) + step] = src[np.repeat(src_lo, n) + step]


def _first_duplicate(name: str, ids: np.ndarray) -> None:
    if ids.size < 2:
        return
    order = np.argsort(ids, kind="stable")
    same = ids[order][1:] == ids[order][:-1]
    if same.any():
        j = int(np.argmax(same))
        i = int(max(order[j], order[j + 1]))
        raise InvalidRequest(f"{name} row {i}: duplicate id {int(ids[i])}")
