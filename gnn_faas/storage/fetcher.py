"""On-demand k-hop fetching from a graph store by byte ranges (FaaS-GNN 4.2).

Each hop makes one batched read of the indptr entries of its frontier and one
batched read of their neighbour segments, planned by the store's measured
request cost (:func:`gnn_faas.storage.ranges.coalesce`); a vertex
is expanded at most once per fetch. Feature rows are read the same way. The
bytes read beyond the needed ones are budgeted over the whole fetch
(:class:`~gnn_faas.storage.ranges.ByteBudget`), not per read: a caller that
passes one budget to :meth:`KHopFetcher.fetch` and then to
:meth:`KHopFetcher.read_features` reads at most ``(1 + MAX_OVERREAD)`` x the
bytes of exactly the needed indptr entries, neighbour segments and rows.
Sampling (a per-hop fanout) is uniform without replacement and *per vertex*
deterministic: a vertex keeps the neighbours with the smallest
``hash(seed, vertex, position)``, so the same vertex gets the same sample in
every request and every merged batch (graph sharing stays exact).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

from gnn_faas.errors import InvalidRequest
from gnn_faas.storage.computation_graph import ComputationGraph
from gnn_faas.storage.format import GraphHandle
from gnn_faas.storage.graph_state import interleave
from gnn_faas.storage.overlay import GraphOverlay, merge_segments
from gnn_faas.storage.ranges import ByteBudget, RangeReader, ReadStats
from gnn_faas.storage.request_cost import RequestCost
from gnn_faas.storage.resident import check_ids, check_rows

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
# A structure-only fetch (no feature read to share its budget with: the
# gateway's) may always move this many bytes beyond the ones it needs, whatever
# the fraction: an indptr read needs 16 bytes a vertex, so a fraction of that
# would forbid the merges that save the most requests, while 1 MiB of
# transient buffer is small next to any function's memory. Feature rows keep
# the fraction alone: they are what a memory function's peak is made of
# (functions/feature_cache.py).
STRUCTURE_SLACK_BYTES = 1 << 20

_GOLD = np.uint64(0x9E3779B97F4A7C15)


def splitmix64(x: np.ndarray) -> np.ndarray:
    """Vectorised splitmix64 finaliser (a good 64-bit mix; wraps modulo 2**64)."""
    with np.errstate(over="ignore"):
        z = x.astype(np.uint64) + _GOLD
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
        return z ^ (z >> np.uint64(31))


def sample_segments(owners: np.ndarray, counts: np.ndarray, fanout: int, seed: int) -> np.ndarray:
    """Mask over the concatenated neighbour segments keeping at most ``fanout``
    entries per segment, chosen uniformly without replacement by a keyed hash."""
    total = int(counts.sum())
    keep = np.ones(total, dtype=bool)
    if fanout is None or fanout < 0 or total == 0 or counts.max() <= fanout:
        return keep
    seg = np.repeat(np.arange(counts.size), counts)
    seg_start = np.cumsum(counts) - counts
    pos = np.arange(total, dtype=np.int64) - seg_start[seg]
    with np.errstate(over="ignore"):
        key = splitmix64(
            splitmix64(np.uint64(seed) ^ owners[seg].astype(np.uint64)) ^ pos.astype(np.uint64)
        )
    order = np.lexsort((key, seg))  # by segment, then by key
    rank = np.empty(total, dtype=np.int64)
    rank[order] = np.arange(total) - seg_start[seg[order]]
    return rank < fanout


@dataclass
class FetchStats:
    """Figures of one or more fetches (docs/architecture.md, principle 6)."""

    reads: ReadStats = field(default_factory=ReadStats)
    hop_seconds: list[float] = field(default_factory=list)
    hop_round_trips: list[int] = field(default_factory=list)
    vertices_expanded: int = 0
    edges_fetched: int = 0
    feature_rows: int = 0

    def as_dict(self) -> dict:
        return {
            **self.reads.as_dict(),
            "hop_ms": [s * 1e3 for s in self.hop_seconds],
            "hop_round_trips": list(self.hop_round_trips),
            "vertices_expanded": self.vertices_expanded,
            "edges_fetched": self.edges_fetched,
            "feature_rows": self.feature_rows,
        }


class KHopFetcher:
    """Fetches computation graphs and feature rows of one graph on demand.

    ``structure`` (:func:`gnn_faas.storage.resident.open_structure`): where the
    structure blobs (``indptr``, ``indices``, ``degree``, ``self_loops``,
    ``psgs``) are read from, resident or chunk-cached; without one, the store.
    A fetcher is shared by concurrent requests: nothing in it serialises them,
    and each call's figures are its own (:meth:`RangeReader.recording`).
    """

    def __init__(self, graph: GraphHandle, cost: RequestCost | None = None, structure=None):
        self.graph = graph
        self.state = None  # a version's GraphState (at()): its changes over this base
        self.reader = RangeReader(graph.backend, cost)
        self.structure = structure
        if structure is None:
            self.structure_reader = self.reader
            self._structure_keys: frozenset[str] = frozenset()
        else:
            # resident blobs are planned as memory (no request cost); chunk-cached
            # ones as the store they come from
            s_cost = None if structure.resident else self.reader.cost
            self.structure_reader = RangeReader(structure.backend, s_cost)
            self._structure_keys = frozenset(structure.keys)
        self._indptr_path = graph.path("indptr")
        self._indices_path = graph.path("indices")
        self._indices_dtype = np.dtype(graph.info("indices").dtype)
        self._features = graph.info("features")
        self._features_path = graph.path("features")

    def at(self, state) -> KHopFetcher:
        """This fetcher reading graph version ``state`` (a
        :class:`~gnn_faas.storage.graph_state.GraphState` over this base): the
        same readers and figures, the version's changed lists, rows and vertex
        count."""
        out = copy.copy(self)
        out.state = state if state is not None and state.version > state.base_version else None
        return out

    @property
    def num_nodes(self) -> int:
        return self.graph.num_nodes if self.state is None else self.state.num_nodes

    @property
    def stats(self) -> ReadStats:
        """What this fetcher read from the store (resident reads are not store reads)."""
        if self.structure_reader is self.reader or self.structure.resident:
            return self.reader.stats
        total = ReadStats()
        total.add(self.reader.stats)
        total.add(self.structure_reader.stats)
        return total

    def reader_for(self, key: str) -> RangeReader:
        """The reader of blob ``key``: the structure's for structure blobs."""
        return self.structure_reader if key in self._structure_keys else self.reader

    @contextmanager
    def _recording(self) -> Iterator[ReadStats]:
        """The store reads this thread makes inside the block (both readers;
        resident reads are not counted)."""
        with self.reader.recording() as rec:
            if self.structure_reader is self.reader or self.structure.resident:
                yield rec
                return
            with self.structure_reader.recording() as srec:
                both = _Both(rec, srec)
                yield both  # type: ignore[misc]

    # -- validation --------------------------------------------------------
    def check_ids(
        self, ids: np.ndarray, what: str = "vertex ids", overlay: GraphOverlay | None = None
    ) -> np.ndarray:
        """``ids`` as int64, each in ``[0, N)`` (``N + n_new`` with an overlay)."""
        ids = np.asarray(ids)
        if ids.ndim != 1:
            raise InvalidRequest(f"{what} must be a 1-D list")
        if ids.size and not np.issubdtype(ids.dtype, np.integer):
            raise InvalidRequest(f"{what} must be integers")
        ids = ids.astype(np.int64, copy=False)
        n = self.num_nodes if overlay is None else overlay.num_nodes
        bad = (ids < 0) | (ids >= n)
        if bad.any():
            raise InvalidRequest(
                f"{what} out of range [0, {n}) for graph {self.graph.name!r}: "
                f"{ids[bad][:5].tolist()}"
            )
        return ids

    # -- adjacency -----------------------------------------------------------
    def neighbours(
        self,
        vertices: np.ndarray,
        overlay: GraphOverlay | None = None,
        budget: ByteBudget | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """In-neighbours of ``vertices`` (global ids): ``(counts, concatenated ids)``.

        Two round trips: the indptr entries, then the neighbour segments. With
        an ``overlay``, a vertex's stored in-neighbours come first, then its
        added ones; a new vertex has added ones only. ``budget``: the
        extra bytes the two reads may move (default: the structure slack).
        """
        v = np.asarray(vertices, dtype=np.int64)
        if budget is None:
            budget = self.structure_budget()
        if v.size == 0:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        if overlay is not None:
            stored = ~overlay.is_new(v)
            counts = np.zeros(v.size, np.int64)
            c_s, nbrs = self.neighbours(v[stored], budget=budget)
            counts[stored] = c_s
            c_o, extra = overlay.in_edges(v)
            return merge_segments(counts, nbrs, c_o, extra)
        state = self.state
        if state is not None and state.has_changes:
            changed = state.is_changed(v)
            if changed.any():  # a version's changed lists, the rest from the base
                c_b, n_b = self.base_neighbours(v[~changed], budget)
                c_c, n_c = state.changed_lists(v[changed])
                return interleave(changed, c_b, n_b, c_c, n_c)
        return self.base_neighbours(v, budget)

    def base_neighbours(
        self, vertices: np.ndarray, budget: ByteBudget | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """In-neighbours of base vertices as the base stores them (no version's changes)."""
        v = np.asarray(vertices, dtype=np.int64)
        if v.size == 0:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        if budget is None:
            budget = self.structure_budget()
        reader = self.structure_reader
        raw = reader.read(self._indptr_path, v * 8, v * 8 + 16, budget)
        bounds = raw.view("<i8").reshape(-1, 2)
        lo, hi = bounds[:, 0], bounds[:, 1]
        # a corrupt store must never become a wrong answer (or a client's 400)
        check_rows(self.graph.name, lo, hi, self.graph.num_edges)
        isz = self._indices_dtype.itemsize
        seg = reader.read(self._indices_path, lo * isz, hi * isz, budget)
        nbrs = seg.view(self._indices_dtype).astype(np.int64)
        check_ids(self.graph.name, nbrs, self.graph.num_nodes)
        return hi - lo, nbrs

    def structure_budget(self) -> ByteBudget:
        """The budget of a fetch with no feature read after it: the reader's
        fraction of its needed bytes, or ``STRUCTURE_SLACK_BYTES``, whichever is more."""
        return ByteBudget(self.reader.max_overread, floor=STRUCTURE_SLACK_BYTES)

    def fetch(
        self,
        targets: Sequence[int] | np.ndarray,
        hops: int,
        fanouts: Sequence[int] | None = None,
        seed: int = 0,
        stats: FetchStats | None = None,
        degrees: bool = False,
        overlay: GraphOverlay | None = None,
        budget: ByteBudget | None = None,
    ) -> ComputationGraph:
        """The ``hops``-layer computation graph of ``targets``.

        ``fanouts[h]`` bounds the neighbours sampled at hop ``h + 1`` (hop 1
        expands the targets); ``None`` or a negative entry takes all of them.
        ``overlay``: a request's new vertices and edges (ids ``>= N``), part of
        the graph for this fetch only. ``budget``: pass one only when the
        feature rows of the graph's ``input_nodes`` are read next through it
        (:meth:`read_features`): the fetch promises them to the budget, so its
        structure reads may already spend the extra bytes those rows allow.
        Without one, the fetch has :meth:`structure_budget`.
        """
        targets = self.check_ids(np.asarray(targets), "targets", overlay)
        if targets.size == 0:
            raise InvalidRequest("targets must not be empty")
        if hops < 0:
            raise InvalidRequest("hops must be >= 0")
        if fanouts is not None and len(fanouts) != hops:
            raise InvalidRequest(f"need one fanout per hop ({hops}), got {len(fanouts)}")
        with self._recording() as rec:
            return self._fetch(targets, hops, fanouts, seed, stats, degrees, overlay, budget, rec)

    def _fetch(self, targets, hops, fanouts, seed, stats, degrees, overlay, budget, rec):
        rows_follow = budget is not None
        if budget is None:
            budget = self.structure_budget()
        row_bytes = self._features.row_bytes
        uniq, first, inverse = np.unique(targets, return_index=True, return_inverse=True)
        by_first = np.argsort(first, kind="stable")
        nodes = uniq[by_first]  # unique targets in order of first request
        rank = np.empty_like(by_first)
        rank[by_first] = np.arange(by_first.size)
        target_index = rank[inverse]

        sizes = [nodes.size]  # |D_L|, |D_{L-1}|, ...
        known = np.sort(nodes)
        frontier = nodes
        counts_all: list[np.ndarray] = []
        loops_all: list[np.ndarray] = []  # self loops among each row's kept edges
        nbrs_all: list[np.ndarray] = []
        for hop in range(hops):
            t0 = time.perf_counter()
            trips0 = rec.round_trips
            if rows_follow:  # the rows of every stored vertex found so far are read later
                budget.promise(row_bytes * int((known < self.graph.num_nodes).sum()))
            counts, nbrs = self.neighbours(frontier, overlay, budget)
            fanout = None if fanouts is None else fanouts[hop]
            if fanout is not None and fanout >= 0:
                keep = sample_segments(frontier, counts, fanout, seed)
                seg = np.repeat(np.arange(counts.size), counts)
                counts = np.bincount(seg[keep], minlength=counts.size)
                nbrs = nbrs[keep]
            counts_all.append(counts)
            nbrs_all.append(nbrs)
            if degrees:
                loops_all.append(_row_self_loops(frontier, counts, nbrs))
            new = _unseen(nbrs, known)
            nodes = np.concatenate((nodes, new))
            known = np.union1d(known, new)
            sizes.append(nodes.size)
            frontier = new
            if stats is not None:
                self._count_hop(stats, t0, rec.round_trips - trips0, counts, nbrs)

        counts = np.concatenate(counts_all) if counts_all else np.zeros(0, np.int64)
        in_degree = None
        if degrees:
            outer = nodes[counts.size :]
            sampled = fanouts is not None and any(f is not None and f >= 0 for f in fanouts)
            if sampled or outer.size == 0:
                outer_deg = np.zeros(outer.size, np.int64)
            else:
                if rows_follow:
                    budget.promise(row_bytes * int((known < self.graph.num_nodes).sum()))
                outer_deg = self.gcn_degrees(outer, overlay, budget)
            loops = np.concatenate(loops_all) if loops_all else np.zeros(0, np.int64)
            in_degree = np.concatenate((counts - loops, outer_deg)).astype(np.int64)
        if stats is not None:
            stats.reads.add(rec.snapshot() if isinstance(rec, _Both) else rec)
        nbrs = np.concatenate(nbrs_all) if nbrs_all else np.zeros(0, np.int64)
        order = np.argsort(nodes, kind="stable")
        local = order[np.searchsorted(nodes, nbrs, sorter=order)] if nbrs.size else nbrs
        indptr = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
        return ComputationGraph(
            nodes=nodes,
            layer_sizes=tuple(reversed(sizes)),
            indptr=indptr,
            indices=local.astype(np.int64),
            target_index=target_index,
            in_degree=in_degree,
        )

    def _count_hop(
        self, stats: FetchStats, t0: float, trips: int, counts: np.ndarray, nbrs: np.ndarray
    ) -> None:
        """One hop's seconds, round trips, vertices expanded and edges into ``stats``."""
        stats.hop_seconds.append(time.perf_counter() - t0)
        stats.hop_round_trips.append(trips)
        stats.vertices_expanded += int(counts.size)
        stats.edges_fetched += int(nbrs.size)

    def in_degrees(
        self,
        vertices: np.ndarray,
        overlay: GraphOverlay | None = None,
        budget: ByteBudget | None = None,
    ) -> np.ndarray:
        """Full in-degree of each of ``vertices`` (one batched indptr read),
        the overlay's added in-edges included."""
        v = np.asarray(vertices, dtype=np.int64)
        deg = np.zeros(v.size, np.int64)
        stored = v < self.num_nodes
        if self.state is not None and self.state.has_changes:
            changed = stored & self.state.is_changed(v)
            deg[changed] = self.state.changed_lists(v[changed])[0]
            stored &= ~changed
        s = v[stored]
        if s.size:
            budget = self.structure_budget() if budget is None else budget
            raw = self.structure_reader.read(self._indptr_path, s * 8, s * 8 + 16, budget)
            bounds = raw.view("<i8").reshape(-1, 2)
            check_rows(self.graph.name, bounds[:, 0], bounds[:, 1], self.graph.num_edges)
            deg[stored] = bounds[:, 1] - bounds[:, 0]
        if overlay is not None:
            deg += overlay.in_degree(v)
        return deg

    def self_loops(
        self,
        vertices: np.ndarray,
        overlay: GraphOverlay | None = None,
        budget: ByteBudget | None = None,
    ) -> np.ndarray:
        """Edges ``v -> v`` of each of ``vertices`` (stored and added).

        One batched read of the ``self_loops`` blob where the graph has one,
        none where its manifest says it has no self loops; a store written
        before the manifest recorded them gets its neighbour lists read.
        """
        v = np.asarray(vertices, dtype=np.int64)
        loops = np.zeros(v.size, np.int64)
        stored = v < self.num_nodes
        if self.state is not None and self.state.has_changes:
            changed = stored & self.state.is_changed(v)
            if changed.any():
                c, nb = self.state.changed_lists(v[changed])
                owner = np.repeat(np.arange(c.size), c)
                hits = nb == v[changed][owner]
                loops[changed] = np.bincount(owner[hits], minlength=c.size)
            stored &= ~changed
        s = v[stored]
        recorded = self.graph.manifest.extra.get("self_loops")
        if s.size and self.graph.has("self_loops"):
            loops[stored] = self.read_rows("self_loops", s, budget)
        elif s.size and recorded is None:  # legacy store: count them in the lists
            counts, nbrs = self.neighbours(s, budget=budget)
            owner = np.repeat(np.arange(s.size), counts)
            loops[stored] = np.bincount(owner[nbrs == s[owner]], minlength=s.size)
        if overlay is not None:
            loops += overlay.self_loops(v)
        return loops

    def gcn_degrees(
        self,
        vertices: np.ndarray,
        overlay: GraphOverlay | None = None,
        budget: ByteBudget | None = None,
    ) -> np.ndarray:
        """In-degree from *other* vertices, ``in_degrees - self_loops``: the
        degree PyG's ``gcn_norm`` sees before it adds one (its
        ``add_remaining_self_loops`` replaces all self loops of a vertex by
        exactly one), and what :class:`ComputationGraph` ``.in_degree`` holds."""
        return self.in_degrees(vertices, overlay, budget) - self.self_loops(
            vertices, overlay, budget
        )

    # -- per-vertex blobs ------------------------------------------------------
    def read_rows(self, key: str, ids: np.ndarray, budget: ByteBudget | None = None) -> np.ndarray:
        """Rows ``ids`` of a per-vertex blob (``degree``, ``labels``...) by ranged
        reads: a function reads what its requests need, never the whole blob."""
        info = self.graph.info(key)
        ids = np.asarray(ids, dtype=np.int64)
        rb = info.row_bytes
        stored = ids < self.graph.num_nodes
        if not stored.all():  # a vertex a version added has no row in the base's blobs
            out = np.zeros((ids.size, *info.shape[1:]), dtype=info.dtype)
            out[stored] = self.read_rows(key, ids[stored], budget)
            return out
        raw = self.reader_for(key).read(self.graph.path(key), ids * rb, ids * rb + rb, budget)
        return raw.view(info.dtype).reshape(ids.size, *info.shape[1:])

    # -- features ------------------------------------------------------------
    def read_features(
        self,
        ids: np.ndarray,
        stats: FetchStats | None = None,
        overlay: GraphOverlay | None = None,
        budget: ByteBudget | None = None,
        max_buffer_bytes: int | None = None,
    ) -> np.ndarray:
        """Feature rows of ``ids`` (global), in the given order, as float32
        (rows of new vertices from the ``overlay``). ``budget``: the one the
        fetch of these vertices used (its promise is settled here); without
        one, the read may move ``max_overread`` x its needed bytes more.

        ``max_buffer_bytes`` streams the read: the rows are read in chunks of
        at most that many needed bytes (in id order, so each chunk is one
        region of the blob) straight into the answer, so the transient read
        buffer (up to ``(1 + max_overread)`` x a chunk, plus the chunk's
        gathered rows) stays bounded whatever the number of rows; a memory
        function's peak is then the answer plus a constant. Each chunk is one
        round trip.
        """
        ids = np.asarray(ids, dtype=np.int64)
        if overlay is not None:
            new = overlay.is_new(ids)
            out = np.empty((ids.size, overlay.features.shape[1]), np.float32)
            out[~new] = self.read_features(
                ids[~new], stats, budget=budget, max_buffer_bytes=max_buffer_bytes
            )
            out[new] = overlay.rows(ids[new])
            return out
        if self.state is not None:
            own = self.state.features.has_row(ids)
            if own.any():  # rows a version set come from its log, the rest from the base
                out = np.empty((ids.size, self._features.shape[1]), np.float32)
                out[own] = self.state.features.rows(ids[own])
                out[~own] = self.at(None).read_features(
                    ids[~own], stats, budget=budget, max_buffer_bytes=max_buffer_bytes
                )
                return out
        with self.reader.recording() as rec:
            rows = self._read_rows_streamed(ids, budget, max_buffer_bytes)
        if stats is not None:
            stats.reads.add(rec)
            stats.feature_rows += int(ids.size)
        return rows

    def _read_rows_streamed(
        self, ids: np.ndarray, budget: ByteBudget | None, max_buffer_bytes: int | None
    ) -> np.ndarray:
        info = self._features
        rb = info.row_bytes
        if budget is not None:
            budget.settle()
        per_chunk = ids.size if not max_buffer_bytes else max(1, int(max_buffer_bytes) // rb)
        if per_chunk >= ids.size:
            raw = self.reader.read(self._features_path, ids * rb, ids * rb + rb, budget)
            rows = raw.view(info.dtype).reshape(ids.size, *info.shape[1:])
            rows = rows.astype(np.float32, copy=False)
        else:
            rows = np.empty((ids.size, *info.shape[1:]), np.float32)
            order = np.argsort(ids, kind="stable")
            for i in range(0, ids.size, per_chunk):  # a loop over chunks of rows
                at = order[i : i + per_chunk]
                part = ids[at]
                raw = self.reader.read(self._features_path, part * rb, part * rb + rb, budget)
                rows[at] = raw.view(info.dtype).reshape(part.size, *info.shape[1:])
        return rows


class _Both:
    """Two readers' recordings of one call, read as one (round trips summed)."""

    def __init__(self, a: ReadStats, b: ReadStats):
        self.a, self.b = a, b

    @property
    def round_trips(self) -> int:
        return self.a.round_trips + self.b.round_trips

    def snapshot(self) -> ReadStats:
        out = ReadStats()
        out.add(self.a)
        out.add(self.b)
        return out


def _row_self_loops(rows: np.ndarray, counts: np.ndarray, nbrs: np.ndarray) -> np.ndarray:
    """Per row, how many of its listed neighbours are the row's own vertex."""
    owner = np.repeat(np.arange(counts.size), counts)
    is_loop = nbrs == rows[owner]
    return np.bincount(owner[is_loop], minlength=counts.size)


def _unseen(nbrs: np.ndarray, known: np.ndarray) -> np.ndarray:
    """The distinct ids of ``nbrs`` not in ``known`` (sorted), sorted."""
    cand = np.unique(nbrs)
    pos = np.searchsorted(known, cand)
    pos[pos == known.size] = 0
    return cand[known[pos] != cand] if known.size else cand
