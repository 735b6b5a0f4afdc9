"""What a stream of graph updates costs each simulated policy.

The stream (:mod:`gnn_faas.traces.update_stream`, scaled to ``rate`` edges/s
and cut into batches of ``batch`` edges) starts with the measured window.
Each batch is one version: the writer stores its segment (the real
:class:`~gnn_faas.storage.delta.Delta` frame, both directions on a
symmetrised graph) and creates its version record: two PUTs. When the log's
bytes pass ``compact_share`` of the base's, a compaction reads the base
(one GET per blob) and the log (one per segment), writes the new base (one
PUT per blob and the pointer) and holds a writer of the whole graph's memory
for ``bytes / bandwidth`` seconds (``bandwidth``: the calibration's measured
whole-graph download, ``graph_mb / full_fetch_s``).

Readers (:class:`UpdateReader`, driven by the simulated pools): an instance
that reads the graph (memory functions; the baselines' instances) reads, at
each call, the segments written since its previous call and not yet folded
into a base (at its first call: the log since the last compaction). A memory
function with a feature cache drops the rows a segment sets (invalidations)
and reads them again from the store when asked: at most once each, ``per_row``
GETs of the fetch model per row (:mod:`gnn_faas.traces.storage_requests`);
requests touching changed vertices otherwise aggregate as before (this
simulator does not model precomputed embeddings, so no other recomputation).
An instance holding the whole graph (``dgl_serverless``, ``serverful``)
applies the segments in place: no invalidation, no re-read. Segment and row
reads take ``bytes / bandwidth`` of the reader's time (billed GB-s and
vCPU-s); the compactions' writer time is added to every policy alike, as are
the writer's PUTs.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gnn_faas.errors import InvalidRequest
from gnn_faas.storage.delta import Delta
from gnn_faas.traces.cost import Price
from gnn_faas.traces.update_stream import UpdateStream

RECORD_BYTES = 256  # a version record (JSON: version, parent, segment key, counts)
HOLDS_GRAPH = ("dgl_serverless", "serverful")


@dataclass(frozen=True)
class UpdatePlan:
    """Batches (due times from the measured window's start, edges, rows set,
    segment bytes) and the compactions they trigger (time, batches folded)."""

    name: str
    rate: float
    batch: int
    times: np.ndarray  # per batch, seconds of the run
    edges: np.ndarray  # per batch, edges the client sent
    rows: np.ndarray  # per batch, vertices whose in-list it sets
    bytes: np.ndarray  # per batch, its segment's bytes
    base_bytes: int
    base_gets: int  # GETs to read the base whole (one per blob and the manifest)
    compact_share: float
    compact_at: np.ndarray = field(default_factory=lambda: np.zeros(0))  # compaction times
    folded: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # batches folded
    compact_bytes: np.ndarray = field(default_factory=lambda: np.zeros(0))  # read + written

    @property
    def size(self) -> int:
        return int(self.times.size)


def update_options(args: Any) -> tuple[str, float | None, int] | None:
    """``(--updates, --update-rate, --update-batch)`` of a command line, checked
    (None without ``--updates``)."""
    name = getattr(args, "updates", None)
    if not name:
        return None
    rate = getattr(args, "update_rate", None)
    batch = getattr(args, "update_batch", None)
    batch = 1000 if batch is None else int(batch)
    if rate is not None and not rate > 0:
        raise InvalidRequest("--update-rate must be positive")
    if batch < 1:
        raise InvalidRequest("--update-batch must be at least 1")
    return name, rate, batch


def window_batches(stream: UpdateStream, *, rate: float | None, batch: int, start_s: float,
                   duration_s: float) -> tuple[float, list[tuple[float, np.ndarray]]]:  # fmt: skip
    """``(rate, [(due, edges [m, 2])])``: the batches of ``stream`` at ``rate``
    edges/s (None: the whole stream spread over ``duration_s``) due within the
    window ``[start_s, start_s + duration_s)``, due times from the run's start."""
    if stream.size == 0:
        raise ValueError(f"update stream {stream.name!r} holds no edges")
    rate = float(rate) if rate is not None else stream.size / max(duration_s, 1e-9)
    out = []
    for due, e in stream.scaled(rate).batches(batch):  # a loop over batches
        if due >= duration_s:
            break
        out.append((start_s + due, e))
    return rate, out


def plan_updates(stream: UpdateStream, *, rate: float | None, batch: int, start_s: float,
                 duration_s: float, graph: Any, compact_share: float) -> UpdatePlan:  # fmt: skip
    """The batches of :func:`window_batches` and the compactions they trigger
    on ``graph``'s base."""
    rate, batches = window_batches(stream, rate=rate, batch=batch, start_s=start_s,
                                   duration_s=duration_s)  # fmt: skip
    symmetric = bool(graph.manifest.symmetrized)
    width = int(graph.manifest.feature_dim)
    times, edges, rows, sizes = [], [], [], []
    for due, e in batches:
        src, dst = e[:, 0], e[:, 1]
        if symmetric:
            src, dst = np.concatenate([src, dst]), np.concatenate([dst, src])
        times.append(due)
        edges.append(e.shape[0])
        rows.append(int(np.unique(dst).size))
        sizes.append(len(_segment(graph.num_nodes, width, src, dst).encode()))
    blobs = list(graph.manifest.blobs)
    base = int(sum(graph.info(k).nbytes for k in blobs))
    plan = UpdatePlan(stream.name, rate, int(batch), np.asarray(times, np.float64),
                      np.asarray(edges, np.int64), np.asarray(rows, np.int64),
                      np.asarray(sizes, np.int64), base, 1 + len(blobs),
                      float(compact_share))  # fmt: skip
    return _compactions(plan, graph)


def _segment(num_nodes: int, width: int, src: np.ndarray, dst: np.ndarray) -> Delta:
    empty_f, empty_i = np.zeros((0, width), np.float32), np.zeros(0, np.int64)
    return Delta(num_nodes, empty_f, empty_i, src.astype(np.int64), dst.astype(np.int64),
                 empty_i, empty_i, empty_i, empty_f, empty_i)  # fmt: skip


def _compactions(plan: UpdatePlan, graph: Any) -> UpdatePlan:
    """A compaction right after the batch whose log passes the share of the base."""
    if plan.compact_share <= 0:
        return plan
    per_edge = graph.info("indices").nbytes / max(graph.num_edges, 1)
    base, log, stored = float(plan.base_bytes), 0.0, 0
    at, folded, moved = [], [], []
    factor = 2 if graph.manifest.symmetrized else 1
    for k in range(plan.size):  # a loop over batches
        log += float(plan.bytes[k])
        stored += factor * int(plan.edges[k])
        if log > plan.compact_share * base:
            new_base = base + per_edge * stored
            at.append(float(plan.times[k]))
            folded.append(k + 1)
            moved.append(base + log + new_base)
            base, log, stored = new_base, 0.0, 0
    return UpdatePlan(**{**plan.__dict__, "compact_at": np.asarray(at, np.float64),
                         "folded": np.asarray(folded, np.int64),
                         "compact_bytes": np.asarray(moved, np.float64)})  # fmt: skip


class UpdateReader:
    """Counts, as a pool's instances make calls, the segments they read and
    the cached rows they drop (module docstring). ``call(instance, t)`` per
    call (instance: any key), in time order per instance."""

    def __init__(self, plan: UpdatePlan, holds_graph: bool = False):
        self.times = plan.times.tolist()
        self.compact_at = plan.compact_at.tolist()
        self.folded = [0] + plan.folded.tolist()
        self.cum_bytes = np.concatenate([[0], np.cumsum(plan.bytes)]).tolist()
        self.cum_rows = np.concatenate([[0], np.cumsum(plan.rows)]).tolist()
        self.holds_graph = holds_graph
        self.seen: dict = {}
        self.segments = 0
        self.segment_bytes = 0
        self.rows_invalidated = 0

    def call(self, instance: Any, t: float) -> None:
        k = bisect.bisect_right(self.times, t)
        prev = self.seen.get(instance)
        self.seen[instance] = k
        if k == 0:
            return
        f = self.folded[bisect.bisect_right(self.compact_at, t)]
        start = f if prev is None else max(prev, f)
        if k <= start:
            return
        self.segments += k - start
        self.segment_bytes += self.cum_bytes[k] - self.cum_bytes[start]
        if prev is not None and not self.holds_graph:  # a cache to drop rows from
            self.rows_invalidated += self.cum_rows[k] - self.cum_rows[start]

    def figures(self) -> dict:
        return {"segment_gets": self.segments, "segment_bytes": self.segment_bytes,
                "rows_invalidated": self.rows_invalidated}  # fmt: skip


def update_costs(
    name: str, reads: dict, plan: UpdatePlan, *, reader_mb: float, reader_vcpus: float,
    graph_mb: float, bandwidth_mb_s: float, row_bytes: float, per_row_gets: float,
    prices: dict[str, Price], requests: int,
) -> dict:  # fmt: skip
    """Policy ``name``'s figures for the updates (module docstring): store
    requests, bytes, invalidations, compactions, GB-s and dollars."""
    mb_s = max(bandwidth_mb_s, 1e-9)
    reread_rows = 0 if name in HOLDS_GRAPH else int(reads["rows_invalidated"])
    reread_gets = per_row_gets * reread_rows
    read_mb = (reads["segment_bytes"] + reread_rows * row_bytes) / 2**20
    reader_s = read_mb / mb_s
    compaction_s = float(np.sum(plan.compact_bytes)) / 2**20 / mb_s
    compactions = int(plan.compact_at.size)
    segments_folded = int(plan.folded[-1]) if compactions else 0
    puts = 2 * plan.size + compactions * (plan.base_gets + 1)
    gets = reads["segment_gets"] + reread_gets + compactions * plan.base_gets + segments_folded
    gb_s = reader_s * reader_mb / 1024 + compaction_s * graph_mb / 1024
    vcpu_s = reader_s * reader_vcpus + compaction_s * reader_vcpus
    usd: dict[str, float] = {}
    for key, price in prices.items():
        if price.kind == "faas":
            usd[key] = gb_s * (price.gb_s + price.gib_s) + vcpu_s * price.vcpu_s
        elif price.kind == "storage":
            usd[key] = price.request_cost(gets, puts)
    return {
        "batches": plan.size,
        "edges": int(plan.edges.sum()),
        "segment_puts": plan.size,
        "record_puts": plan.size,
        "segment_bytes_written": int(plan.bytes.sum()),
        "segment_gets": int(reads["segment_gets"]),
        "segment_bytes_read": int(reads["segment_bytes"]),
        "rows_invalidated": int(reads["rows_invalidated"]) if name not in HOLDS_GRAPH else 0,
        "rows_reread_gets": float(reread_gets),
        "compactions": compactions,
        "compaction_s": compaction_s,
        "store_puts": int(puts),
        "store_gets": float(gets),
        "reader_busy_s": reader_s,
        "gb_s": gb_s,
        "vcpu_s": vcpu_s,
        "gb_s_per_request": gb_s / max(requests, 1),
        "dollars": usd,
    }


def plan_summary(plan: UpdatePlan) -> dict:
    """The stream as simulated (the result's ``updates`` key)."""
    return {
        "stream": plan.name,
        "rate_edges_per_s": plan.rate,
        "batch": plan.batch,
        "batches": plan.size,
        "edges": int(plan.edges.sum()),
        "rows_set": int(plan.rows.sum()),
        "segment_bytes": int(plan.bytes.sum()),
        "base_bytes": plan.base_bytes,
        "compact_share": plan.compact_share,
        "compactions": int(plan.compact_at.size),
        "first_s": float(plan.times[0]) if plan.size else None,
        "last_s": float(plan.times[-1]) if plan.size else None,
    }
