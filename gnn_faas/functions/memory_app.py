"""The memory function: computation graphs, feature rows and Aggregate over HTTP.

NO torch here, ever (docs/architecture.md, principle 1): numpy/scipy/flask only, so the
instance starts in a fraction of a second with a small image.

On start it opens the graph (``verify="size"``: one size check per blob), a
:class:`~gnn_faas.storage.fetcher.KHopFetcher` and the adaptive
:class:`~gnn_faas.functions.feature_cache.FeatureCache` sized from the
instance's memory limit (``--memory-mb``, else the cgroup, else physical RAM).

Endpoints (frames are ``application/x-gnn-faas-frame``, see
:mod:`gnn_faas.wire`):

- ``GET /v2/health/live`` -> ``{"live": true}``; ``GET /v2/health/ready`` ->
  ``{"ready": true}`` once the graph is open and the cache allocated (503 before).
- ``GET /v1/stats`` -> this instance's own figures: requests, bytes read,
  round trips, ranges, cache figures, RSS, memory limit, predicted and actual
  peak of the last request, re-executions.
- ``POST /v1/graph`` (JSON ``{"targets", "hops", "fanouts", "seed",
  "degrees"}``) -> frame ``nodes, layer_sizes, indptr, indices,
  target_index[, in_degree]``.
- ``POST /v1/aggregate`` (frame): tensors ``indptr`` int64 ``[num_dst + 1]``,
  ``indices`` int64 (local source ids), ``src_ids`` int64 ``[num_src]`` (global
  ids), optional ``h`` float32 ``[num_src, ...]`` (absent: the input rows of
  ``src_ids`` are read through the feature cache), optional ``deg_src``,
  ``deg_dst`` (gcn), ``alpha_src``, ``alpha_dst`` (gat); params ``op``,
  ``num_dst``, ``dst_offset``, ``eps``, ``negative_slope``, ``return_root``,
  ``partial``, ``include_self``; optional ``forward_url``, ``forward_layer``
  (and ``forward_pre_next``): send the aggregate straight to that compute
  function's ``/v1/update`` (stage ``post``) and answer with its frame ``h`` (λGrapher's pipeline: the
  gateway chose the compute instance; ``Server-Timing`` adds ``forward``,
  ``forward_app``, ``forward_serde``; an unreachable compute function is a 502
  with ``X-Gnn-Faas-Failed: forward``). A new-vertex request's source ids may lie
  beyond the stored graph (``>= num_nodes``, see ``gateway/new_vertices.py``):
  their input rows travel in ``new_x`` float32 ``[k, d]``, one row per such
  source id in ``src_ids`` order; they are used, never cached. Answer: ``agg`` (+ ``root``), or with
  ``partial`` the :func:`~gnn_faas.functions.aggregate.partial_aggregate` state.
  Precomputed serving (OMEGA's SRPE) from stored states: params ``state_model``
  and ``state_checkpoint`` name the embedding set (``gnn-faas precompute``),
  tensors ``state_ids`` int64 ``[k]`` (the last ``k`` destination rows'
  global ids), ``state_count`` int64 ``[k]``, and per entry of those rows'
  lists (their changed terms) ``state_added`` bool, ``state_degree_change``
  int64: those rows' aggregates come from their stored layer-1 states read
  from the store plus the changed terms
  (:func:`~gnn_faas.functions.srpe_recompute.recompute_last_rows`). State
  rows are read on each call, not cached (:meth:`MemoryFunction.state_rows`).
- ``POST /v1/features`` (JSON ``{"ids"}`` or a frame with ``ids``) -> frame ``x``.
- ``GET /metrics`` -> Prometheus text (:mod:`gnn_faas.functions.metrics`: cache
  hits and lookups, storage reads per backend, process figures).

The heavy endpoints run one at a time per worker, each under the cache's
memory protocol (predicted peak -> capacity -> measured peak -> re-execution
when the ceiling would be crossed); health and stats answer from other threads
meanwhile.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from flask import Flask, jsonify

from gnn_faas import graph_version
from gnn_faas.errors import (
    BlobNotFound,
    CorruptBlob,
    ForwardFailed,
    InvalidRequest,
    StoreUnavailable,
    Unavailable,
)
from gnn_faas.functions.aggregate import AGGREGATE_OPS, aggregate, partial_aggregate
from gnn_faas.functions.client import ComputeClient, server_timing
from gnn_faas.functions.feature_cache import (
    DEFAULT_DECAY_EVERY,
    DEFAULT_DEGREE_WEIGHT,
    CachePolicy,
    FeatureCache,
)
from gnn_faas.functions.memory_limit import (
    anon_rss_bytes,
    detect_memory_limit,
    feature_stream_bytes,
    rss_bytes,
)
from gnn_faas.functions.metrics import install_metrics, memory_families
from gnn_faas.functions.peak_predictor import PeakPredictor, RequestShape, bundled_predictor_path
from gnn_faas.functions.row_versions import RowVersions
from gnn_faas.http import (
    add_server_timing,
    error_response,
    frame_route,
    install,
    loop_route,
)
from gnn_faas.storage.chunked import ChunkedReads
from gnn_faas.storage.computation_graph import Block, cg_from_tensors, cg_tensors
from gnn_faas.storage.embeddings import EmbeddingStore
from gnn_faas.storage.fetcher import KHopFetcher
from gnn_faas.storage.format import GraphHandle, open_graph
from gnn_faas.storage.resident import WHOLE_VERIFY_BYTES, verified_reads
from gnn_faas.wire import (
    DEFAULT_MAX_BYTES,
    decode_frame,
    encode_frame,
    params_get,
    require,
)

log = logging.getLogger("gnn_faas.memory")
MAX_HOPS = 8
STATE_TENSORS = ("state_ids", "state_count", "state_added", "state_degree_change")
MAX_STATE_SETS = 4  # embedding sets (model, checkpoint) an instance keeps open
DEFAULT_PREDICTOR_GRAPH = "bitcoin-otc"  # the bundled predictor transfers: its inputs are shapes
# rows warmed before the instance is ready; the rest of the warm-up runs behind.
# (A blob without chunk digests, from an older store, is read whole and checked
# at start up to WHOLE_VERIFY_BYTES; the degree prior is read whole up to it too.)
WARM_SYNC_BYTES = 16 << 20
# a cache that cannot hold every row warms at most this share of its capacity:
# the rest is the room requests' working sets need first (the cache shrinks for
# them anyway) and fills with what requests actually read. One that holds the
# whole graph warms it all: a row left out costs its first request a store read
# (on S3, a chunk's round trip), and early slow requests launch instances
WARM_SHARE = 0.5
WARM_BATCH_BYTES = 4 << 20  # rows per background warm-up read


def warm_rows(capacity_rows: int, num_nodes: int) -> int:
    """Rows a new instance warms: all ``num_nodes`` when the cache holds them,
    else ``WARM_SHARE`` of its capacity."""
    if capacity_rows >= num_nodes:
        return int(num_nodes)
    return int(capacity_rows * WARM_SHARE)


@dataclass(frozen=True)
class MemoryFunctionConfig:
    """One memory function instance.

    ``memory_mb``: the instance's memory limit (``None``: detected).
    ``predictor``: a peak predictor JSON (``None``: see :func:`load_predictor`). ``reserve_mb``: memory of the
    instance held outside this worker (e.g. the gunicorn master), taken off the
    budget; ``baseline_mb`` overrides the measured resident memory of the
    started worker; ``workers`` share the limit equally.
    """

    store: str
    graph: str
    memory_mb: float | None = None
    predictor: str | None = None
    decay_every: int = DEFAULT_DECAY_EVERY
    degree_weight: float = DEFAULT_DEGREE_WEIGHT
    cache_max_rows: int | None = None
    cache_prior: str = "degree"  # or "fap": Quiver's feature access probability (top-k kept)
    reserve_mb: float = 0.0
    baseline_mb: float | None = None  # None: this worker's RSS once started (measured)
    workers: int = 1
    max_body_bytes: int = DEFAULT_MAX_BYTES
    verify: str = "size"

    def policy(self) -> CachePolicy:
        return CachePolicy(
            decay_every=self.decay_every,
            degree_weight=self.degree_weight,
            max_rows=self.cache_max_rows,
        )


def load_predictor(path: str | None, graph: str, feature_dim: int) -> PeakPredictor | None:
    """The given predictor; else the one bundled for ``graph``; else the bundled
    Bitcoin OTC one when the feature width matches what it was fitted on (its
    inputs are shapes, but it saw input rows of that width only); else ``None``
    (the conservative closed-form estimate)."""
    if path:
        return PeakPredictor.load(path)
    own = bundled_predictor_path(graph)
    if own.is_file():
        return PeakPredictor.load(own)
    default = bundled_predictor_path(DEFAULT_PREDICTOR_GRAPH)
    if default.is_file():
        pred = PeakPredictor.load(default)
        if pred.meta.get("feature_dim") == feature_dim:
            return pred
    return None


# -- request parsing (shared with the profiler) ----------------------------------------
@dataclass(frozen=True)
class AggregateCall:
    """A validated ``/v1/aggregate`` request."""

    op: str
    block: Block
    src_ids: np.ndarray
    h: np.ndarray | None
    extras: dict[str, np.ndarray]
    new_x: np.ndarray | None
    eps: float
    negative_slope: float
    dst_offset: int
    return_root: bool
    partial: bool
    include_self: bool
    states: StateCall | None = None

    def shape(self, feature_dim: int) -> RequestShape:
        width = feature_dim if self.h is None else int(np.prod(self.h.shape[1:], dtype=np.int64))
        k = 0 if self.states is None else int(self.states.ids.size)  # state rows: as many sources
        return RequestShape(
            self.block.num_dst,
            self.block.num_src + k,
            self.block.num_edges,
            width,
            self.op,
            loads_rows=self.h is None,
        )


@dataclass(frozen=True)
class StateCall:
    """The stored-state part of an aggregate call (module doc): the embedding
    set, the last ``ids.size`` rows' global ids and their changed terms."""

    model: str
    checkpoint: str
    ids: np.ndarray
    terms: dict[str, np.ndarray]


def parse_states(
    tensors: dict[str, np.ndarray], params: dict[str, Any], op: str, num_dst: int
) -> StateCall | None:
    model = params_get(params, "state_model", str, None)
    present = [k for k in STATE_TENSORS if k in tensors]
    if model is None:
        if present:
            raise InvalidRequest(f"tensors {present} need the parameter 'state_model'")
        return None
    from gnn_faas.functions.srpe_recompute import STATE_OPS

    if op not in STATE_OPS:
        raise InvalidRequest(f"aggregate op {op!r} cannot be recomputed from stored states")
    checkpoint = params_get(params, "state_checkpoint", str)
    ids = require(tensors, "state_ids", "int64", 1)
    count = require(tensors, "state_count", "int64", 1)
    added = require(tensors, "state_added", "bool", 1)
    change = require(tensors, "state_degree_change", "int64", 1)
    if count.size != ids.size or ids.size > num_dst:
        raise InvalidRequest(
            f"state_ids and state_count need one entry per state row (at most num_dst = "
            f"{num_dst}), got {ids.size} and {count.size}"
        )
    if added.size != change.size:
        raise InvalidRequest("state_added and state_degree_change need the same length")
    terms = {"state_count": count, "state_added": added, "state_degree_change": change}
    return StateCall(model, checkpoint, ids, terms)


def parse_aggregate(tensors: dict[str, np.ndarray], params: dict[str, Any]) -> AggregateCall:
    op = params_get(params, "op", str)
    if op not in AGGREGATE_OPS:
        raise InvalidRequest(f"unknown aggregate op {op!r}: use one of {AGGREGATE_OPS}")
    indptr = require(tensors, "indptr", "int64", 1)
    indices = require(tensors, "indices", "int64", 1)
    src_ids = require(tensors, "src_ids", "int64", 1)
    h = require(tensors, "h", "float32", (2, 3), optional=True)
    num_dst = params_get(params, "num_dst", int, indptr.size - 1)
    if num_dst < 0 or indptr.size != num_dst + 1:
        raise InvalidRequest(
            f"indptr must have num_dst + 1 = {num_dst + 1} entries, got {indptr.size}"
        )
    if h is not None and h.shape[0] != src_ids.size:
        raise InvalidRequest(f"h has {h.shape[0]} rows, src_ids {src_ids.size}")
    extras = {}
    for name in ("deg_src", "deg_dst"):
        arr = tensors.get(name)
        if arr is not None:
            if arr.dtype.kind not in "iuf" or arr.ndim != 1:
                raise InvalidRequest(f"tensor {name!r} must be a 1-D numeric array")
            extras[name] = arr
    for name in ("alpha_src", "alpha_dst"):
        arr = require(tensors, name, "float32", 2, optional=True)
        if arr is not None:
            extras[name] = arr
    new_x = require(tensors, "new_x", "float32", 2, optional=True)
    unknown = set(tensors) - {"indptr", "indices", "src_ids", "h", "new_x", *extras, *STATE_TENSORS}
    if unknown:
        raise InvalidRequest(f"unexpected tensors {sorted(unknown)}")
    dst_offset = params_get(params, "dst_offset", int, 0)
    if dst_offset < 0:
        raise InvalidRequest("dst_offset must be >= 0")
    states = parse_states(tensors, params, op, num_dst)
    partial = params_get(params, "partial", bool, False)
    if states is not None and partial:
        raise InvalidRequest("stored states finish whole aggregates, not partial ones")
    return AggregateCall(
        op=op,
        block=Block(num_dst, int(src_ids.size), indptr, indices),
        src_ids=src_ids,
        h=h,
        extras=extras,
        new_x=new_x,
        eps=params_get(params, "eps", float, 0.0),
        negative_slope=params_get(params, "negative_slope", float, 0.2),
        dst_offset=dst_offset,
        return_root=params_get(params, "return_root", bool, False),
        partial=partial,
        include_self=params_get(params, "include_self", bool, True),
        states=states,
    )


def execute_aggregate(call: AggregateCall, rows: np.ndarray) -> dict[str, np.ndarray]:
    """The answer tensors of an aggregate call over source rows ``rows``."""
    kw = dict(
        eps=call.eps,
        negative_slope=call.negative_slope,
        dst_offset=call.dst_offset,
        **call.extras,
    )
    if call.partial:
        out = partial_aggregate(call.op, call.block, rows, include_self=call.include_self, **kw)
    else:
        out = {"agg": aggregate(call.op, call.block, rows, **kw)}
    if call.return_root:
        off = call.dst_offset
        if off + call.block.num_dst > call.block.num_src:
            raise InvalidRequest("root rows lie outside the source rows")
        out["root"] = rows[off : off + call.block.num_dst]
    return out


def _ids_param(tensors: dict, params: dict, key: str) -> np.ndarray:
    if key in tensors:
        return require(tensors, key, "i", 1).astype(np.int64)
    if key not in params:
        raise InvalidRequest(f"missing {key!r}")
    value = params[key]
    if not isinstance(value, list):
        raise InvalidRequest(f"{key!r} must be a list of vertex ids")
    arr = np.asarray(value) if value else np.zeros(0, np.int64)
    if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
        raise InvalidRequest(f"{key!r} must be a flat list of integer vertex ids")
    return arr.astype(np.int64)


# -- forwarding to a compute function (λGrapher's pipeline) ----------------------------
def forward_target(params: dict) -> tuple[str, int, bool] | None:
    """``(compute URL, layer, pre_next)`` of an aggregate call that asks for its
    aggregate to go straight to Update (params ``forward_url``, ``forward_layer``,
    ``forward_pre_next``), else ``None``."""
    url = params_get(params, "forward_url", str, None)
    if url is None:
        return None
    layer = params_get(params, "forward_layer", int)
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme not in ("http", "https") or len(url) > 2048:
        raise InvalidRequest("forward_url must be an http(s) URL of a compute function")
    if layer < 0:
        raise InvalidRequest("forward_layer must be >= 0")
    return url, layer, params_get(params, "forward_pre_next", bool, False)


class UpdateForwarder:
    """Sends an aggregate to the compute function the gateway chose and hands
    back its answer frame unread: the gateway makes one call per partition and
    layer instead of two, and the aggregate never travels back to it.

    One keep-alive client per compute URL (the most recent ``max_clients``).
    An unreachable compute function is a 502 :class:`ForwardFailed` (its
    header tells the gateway that the compute instance failed, not this one);
    a compute function's own error keeps its status."""

    def __init__(self, max_clients: int = 32, pool_size: int = 4):
        self.max_clients = int(max_clients)
        self.pool_size = int(pool_size)
        self._clients: dict[str, ComputeClient] = {}
        self._lock = threading.Lock()

    def client(self, url: str) -> ComputeClient:
        with self._lock:
            c = self._clients.pop(url, None)
            if c is None:
                c = ComputeClient(url, pool_size=self.pool_size)
            self._clients[url] = c  # most recent last
            while len(self._clients) > self.max_clients:
                self._clients.pop(next(iter(self._clients))).close()
            return c

    def update(self, url: str, body: bytes) -> bytes:
        t0 = time.perf_counter()
        try:
            reply = self.client(url).post_encoded("/v1/update", body)
        except Unavailable as exc:
            raise ForwardFailed(f"forwarding to the compute function failed: {exc}") from None
        server = server_timing(reply.headers.get("Server-Timing", ""))
        add_server_timing("forward", (time.perf_counter() - t0) * 1e3)
        add_server_timing("forward_app", server.get("app", 0.0))
        add_server_timing("forward_serde", server.get("serde", 0.0))
        return reply.content


# -- the instance --------------------------------------------------------------------
class MemoryFunction:
    """State of one memory function worker (graph, fetcher, cache, figures)."""

    def __init__(self, cfg: MemoryFunctionConfig):
        self.cfg = cfg
        self.ready = False
        # every blob with chunk digests is verified chunk by chunk on first read
        # (storage/chunked.py); a blob read whole is checked against its sha256
        self.graph = verified_reads(open_graph(cfg.store, cfg.graph, verify=cfg.verify))
        self.fetcher = KHopFetcher(self.graph)
        self._whole_features = self._check_undigested_features()
        info = self.graph.info("features")
        self.feature_dim = int(np.prod(info.shape[1:], dtype=np.int64))
        # the degree prior is read on demand (only for vertices offered to the
        # cache) and normalised by the largest degree read so far: a dense copy,
        # or a scan for the maximum, would cost memory (and reads) in proportion
        # to the graph's vertex count
        has_degree = self.graph.has("degree") and cfg.degree_weight > 0
        degree = (lambda ids: self.fetcher.read_rows("degree", ids)) if has_degree else None
        self.limit = detect_memory_limit(cfg.memory_mb)
        self.limit_bytes = int(self.limit.bytes / max(1, cfg.workers))
        # the feature read streams in chunks of a fixed share of the limit
        # (memory_limit.feature_stream_bytes; the partitioner counts them)
        self.stream_bytes = feature_stream_bytes(self.limit_bytes)
        self.predictor = load_predictor(cfg.predictor, cfg.graph, self.feature_dim)
        prior = self._fap_prior() if cfg.cache_prior == "fap" else None
        self.cache = FeatureCache(
            self.graph.num_nodes,
            self.feature_dim,
            degree=degree,
            limit_bytes=self.limit_bytes,
            predictor=self.predictor,
            policy=cfg.policy(),
            prior=prior,
        )
        # Peaks are measured with tracemalloc only for requests too large for
        # their closed-form bound (feature_cache.FeatureCache.run): tracing the
        # whole process would slow every allocation of every small request.
        # after every allocation of the start: what the worker holds before any request
        own = rss_bytes() if cfg.baseline_mb is None else int(cfg.baseline_mb * 2**20)
        self.cache.set_baseline(own + int(cfg.reserve_mb * 2**20))
        # the rows the graph's versions set since this base (functions/row_versions.py)
        self.versions = RowVersions(
            self.graph, self._load_rows, self._open_base, self.cache.invalidate
        )
        self.warmed_rows = 0
        self._warm_thread: threading.Thread | None = None
        self._warm(prior)
        self.counts = {"graph": 0, "aggregate": 0, "features": 0}
        # SRPE's stored states, opened on first use per (model, checkpoint)
        self._state_sets: dict[tuple[str, str], EmbeddingStore] = {}
        self._state_lock = threading.Lock()
        self.state_reads = {"rows": 0, "bytes": 0, "round_trips": 0}
        self.debug_modules = os.environ.get("GNN_FAAS_DEBUG_MODULES", "") not in ("", "0")
        self.ready = True

    def _check_undigested_features(self) -> np.ndarray | None:
        """A store written before chunk digests: its feature blob, when small
        enough to read whole at start (:data:`WHOLE_VERIFY_BYTES`), is read and
        checked against its sha256 (and then warms the cache); a larger one is
        read unverified, said once in the log."""
        info = self.graph.info("features")
        if info.chunk_bytes:
            return None
        if info.nbytes <= WHOLE_VERIFY_BYTES:
            return self.graph.read_blob("features")  # sha256-checked
        log.warning(
            "graph %s: features have no chunk digests and are too large to verify whole at start "
            "(%d bytes): reads are unverified; 'gnn-faas datasets verify --add-digests' adds them",
            self.graph.name,
            info.nbytes,
        )
        return None

    def _warm(self, prior: tuple[np.ndarray, np.ndarray] | None) -> None:
        """A new instance starts with the rows its prior ranks first (FAP's top-k, or
        the highest out-degrees): every row when the cache holds the whole graph,
        else :data:`WARM_SHARE` of what it holds; up to :data:`WARM_SYNC_BYTES`
        before it is ready, the rest in the background."""
        if prior is not None:
            ids = prior[0]
        elif self.cfg.degree_weight > 0 and self.graph.has("degree"):
            ids = self._top_degree()
        else:
            return
        ids = ids[: warm_rows(self.cache.capacity_rows, self.graph.num_nodes)]
        if ids.size == 0:
            return
        ids = ids[~self.versions.has_history(ids)]  # rows a version set stay out of the cache
        if self._whole_features is not None:
            whole = self._whole_features
            self.warmed_rows = self.cache.warm(ids, lambda v: whole[v])
            return
        per_row = max(1, 4 * self.feature_dim)
        first = max(1, WARM_SYNC_BYTES // per_row)
        try:
            self.warmed_rows = self.cache.warm(ids[:first], self._load_rows)
        except (CorruptBlob, BlobNotFound, StoreUnavailable) as exc:
            # the instance still starts: a request reading those rows gets the
            # error (5xx, named), and the gateway takes the graph out of service
            log.error("cache warm-up failed: %s", exc)
            return
        rest = ids[first:]
        if rest.size:
            batch = max(1, WARM_BATCH_BYTES // per_row)
            self._warm_thread = threading.Thread(
                target=self._warm_rest, args=(rest, batch), daemon=True, name="gnn-faas-warm"
            )
            self._warm_thread.start()

    def _warm_rest(self, ids: np.ndarray, batch: int) -> None:
        try:
            for i in range(0, ids.size, batch):  # a loop over batches of rows
                self.warmed_rows += self.cache.warm(ids[i : i + batch], self._load_rows)
        except Exception as exc:  # noqa: BLE001 - a warm-up is a bonus, never a failure
            log.warning("cache warm-up stopped after %d rows: %s", self.warmed_rows, exc)

    def _top_degree(self) -> np.ndarray:
        """Vertex ids by out-degree, highest first, as many as the cache could hold
        (the degree blob read whole when at most :data:`WHOLE_VERIFY_BYTES`;
        none otherwise: the prior is then read per vertex as requests come)."""
        if self.graph.info("degree").nbytes > WHOLE_VERIFY_BYTES:
            return np.empty(0, np.int64)
        deg = self.graph.read_blob("degree").astype(np.int64)
        k = min(deg.size, self.cache.capacity_rows)
        if k <= 0:
            return np.empty(0, np.int64)
        top = np.argpartition(-deg, k - 1)[:k] if k < deg.size else np.arange(deg.size)
        return top[np.argsort(-deg[top], kind="stable")].astype(np.int64)

    def _open_base(self, prefix: str):
        """``(graph, load_rows)`` of a compacted base (a version's new base)."""
        graph = verified_reads(
            GraphHandle(
                self.graph.backend.inner
                if isinstance(self.graph.backend, ChunkedReads)
                else self.graph.backend,
                self.graph.name,
                prefix=prefix,
            )  # fmt: skip
        )
        fetcher = KHopFetcher(graph)
        return graph, lambda ids: fetcher.read_features(ids, max_buffer_bytes=self.stream_bytes)

    def rows_of(self, ids: np.ndarray) -> np.ndarray:
        """Feature rows of stored ``ids`` at the call's graph version: rows a version
        set from the log, rows it never changed through the cache, read from the
        base of that version (graph_version.get(); None: the newest known)."""
        version = self._catch_up()
        if self.versions.keys.size == 0:
            return self.cache.get_rows(ids, self._load_rows)
        set_mask, set_rows = self.versions.split(ids, version)
        base = self.versions.base_at(version)
        history = self.versions.has_history(ids) & ~set_mask  # changed later: from the base
        cached = ~set_mask & ~history
        out = np.empty((ids.size, self.feature_dim), np.float32)
        out[set_mask] = set_rows
        if history.any():
            out[history] = base.load_rows(ids[history])
        if cached.any():
            out[cached] = self.cache.get_rows(ids[cached], base.load_rows)
        return out

    def nodes_at_call(self) -> int:
        """Vertices of the graph at the call's version (ids beyond are a request's new ones)."""
        return self.versions.nodes_at(self._catch_up())

    def _catch_up(self) -> int | None:
        """The call's graph version, its rows known: the segments up to its rows
        version now (graph_version.rows), the rest behind the calls."""
        version = graph_version.get()
        if version is not None:
            self.versions.reach_back(version)  # a call from before this function's base
            self.versions.ensure(graph_version.rows())
            self.versions.follow(version)
        return version

    def _load_rows(self, ids: np.ndarray) -> np.ndarray:
        # streamed: the read buffer is a fixed share of the limit, never a
        # multiple of the rows (the partitioner counts the rows once)
        return self.fetcher.read_features(ids, max_buffer_bytes=self.stream_bytes)

    def _fap_prior(self) -> tuple[np.ndarray, np.ndarray]:
        """The top-k of the graph's FAP blob, best first, ``k`` = the rows the
        memory limit could ever cache (the full array is dropped: no dense
        per-vertex state stays resident for it)."""
        from gnn_faas.errors import NotFound

        if not self.graph.has("fap"):
            raise NotFound(
                f"graph {self.graph.name!r} has no FAP blob for cache_prior 'fap': run "
                f"'gnn-faas datasets metrics {self.graph.name} --fanouts ...'"
            )
        k = min(self.graph.num_nodes, self.limit_bytes // max(1, 4 * self.feature_dim))
        if self.cfg.cache_max_rows is not None:
            k = min(k, self.cfg.cache_max_rows)
        fap = self.graph.read_blob("fap")
        top = np.argpartition(-fap, k - 1)[:k] if 0 < k < fap.size else np.arange(k)
        top = top[np.argsort(-fap[top], kind="stable")].astype(np.int64)
        return top, np.array(fap[top], dtype=np.float32)

    # -- endpoints -------------------------------------------------------------
    def graph_request(self, tensors: dict, params: dict) -> bytes:
        targets = _ids_param(tensors, params, "targets")
        hops = params_get(params, "hops", int)
        if not 0 <= hops <= MAX_HOPS:
            raise InvalidRequest(f"hops must be in 0..{MAX_HOPS}, got {hops}")
        fanouts = params.get("fanouts")
        if fanouts is not None and (
            not isinstance(fanouts, list)
            or not all(isinstance(f, int) and not isinstance(f, bool) for f in fanouts)
        ):
            raise InvalidRequest("fanouts must be null or a list of integers (-1: all)")
        if fanouts is not None and len(fanouts) != hops:
            raise InvalidRequest(f"need one fanout per hop ({hops}), got {len(fanouts)}")
        seed = params_get(params, "seed", int, 0)
        degrees = params_get(params, "degrees", bool, True)
        self.fetcher.check_ids(targets, "targets")
        self.counts["graph"] += 1

        def work() -> bytes:
            cg = self.fetcher.fetch(targets, hops, fanouts=fanouts, seed=seed, degrees=degrees)
            return encode_frame(cg_tensors(cg), {"hops": hops, "graph": self.graph.name})

        return self.cache.run(
            work, predicted_peak=self._graph_peak(targets.size, hops, fanouts, targets)
        )

    def _graph_peak(
        self, num_targets: int, hops: int, fanouts: list[int] | None, targets=None
    ) -> int:
        """Working set of a k-hop fetch, predicted before it: from the targets'
        stored PSGS (Quiver) when the graph has it for these fanouts, else from
        the mean degree (a wrong guess re-executes)."""
        psgs = self._psgs_size(targets, hops, fanouts)
        if psgs is not None:
            return int(160 * psgs + (1 << 20))  # per tree entry: an edge (96) and a node (64)
        n = self.graph.num_nodes
        mean_deg = self.graph.num_edges / max(1, n)
        nodes = frontier = float(num_targets)
        edges = 0.0
        for h in range(hops):
            f = mean_deg if fanouts is None or fanouts[h] < 0 else min(mean_deg, fanouts[h])
            edges += frontier * f
            frontier = min(n, frontier * f)
            nodes = min(n, nodes + frontier)
        return int(96 * edges + 64 * nodes + (1 << 20))

    def _psgs_size(self, targets, hops: int, fanouts: list[int] | None) -> float | None:
        from gnn_faas.storage.workload_metrics import predicted_size, stored_fanouts

        stored = stored_fanouts(self.graph)
        if targets is None or stored is None or len(stored) != hops:
            return None
        want = [-1 if f is None or f < 0 else f for f in (fanouts or [-1] * hops)]
        if want != stored:
            return None
        return predicted_size(self.graph, self.fetcher.reader, targets)

    def aggregate_request(
        self,
        tensors: dict,
        params: dict,
        forward_layer: int | None = None,
        pre_next: bool = False,
    ) -> bytes:
        """The answer frame of an aggregate call; with ``forward_layer``, the
        frame of the Update call (layer ``forward_layer``, stage ``post``, and
        ``pre_next``) that carries its ``agg`` (and ``root``) to a compute
        function instead."""
        call = parse_aggregate(tensors, params)
        stored = self._split_new(call)
        if forward_layer is not None and call.partial:
            raise InvalidRequest("a partial aggregate cannot be forwarded to Update")
        self.counts["aggregate"] += 1

        def work() -> bytes:
            rows = call.h
            if rows is None:
                rows = self._source_rows(call, stored)
            out = execute_aggregate(call, rows)
            if call.states is not None:
                out["agg"] = self._from_states(call, rows, out["agg"])
            if forward_layer is None:
                return encode_frame(out)
            params = {"layer": forward_layer, "stage": "post", "pre_next": pre_next}
            return encode_frame(out, params)

        pinned = call.src_ids[stored] if call.h is None else None
        return self.cache.run(work, shape=call.shape(self.feature_dim), pinned=pinned)

    def state_set(self, model: str, checkpoint: str) -> EmbeddingStore:
        """The embedding set of ``model`` at ``checkpoint`` on this graph,
        checked (stale or missing: 409 / 404) and opened once."""
        # the base of the call's graph version (a compaction moves the set's fingerprint)
        base = self.versions.base_at(graph_version.get()).graph
        key = (model, checkpoint, base.prefix)
        with self._state_lock:
            emb = self._state_sets.get(key)
            if emb is None:
                emb = EmbeddingStore.open(base, model, checkpoint)
                if not emb.has_states(1):
                    from gnn_faas.errors import NotFound

                    raise NotFound(
                        f"the embeddings of model {model!r} hold no layer-1 aggregate state: "
                        f"rerun 'gnn-faas precompute --model {model}'"
                    )
                while len(self._state_sets) >= MAX_STATE_SETS:
                    self._state_sets.pop(next(iter(self._state_sets)))
                self._state_sets[key] = emb
            return emb

    def state_rows(self, call: StateCall) -> np.ndarray:
        """The stored layer-1 states of ``call.ids``, one batched ranged read.

        Not cached: a state row is read only for a candidate the request
        recomputes (a budget's share of the queries' in-neighbours), where the
        feature cache serves the input rows that every request reads (the
        queries' in-neighbours, those candidates included); a second cache
        would take its memory from the first for rows read far less often.
        ``/v1/stats`` counts them (``state_rows_read``, ``state_bytes_read``)."""
        self.fetcher.check_ids(call.ids, "state_ids")
        emb = self.state_set(call.model, call.checkpoint)
        st = emb.reader.stats
        with self._state_lock:  # one read at a time per set: its figures' differences are ours
            bytes0, trips0 = st.bytes_read, st.round_trips
            rows = emb.state_rows(1, call.ids)
            self.state_reads["rows"] += int(call.ids.size)
            self.state_reads["bytes"] += st.bytes_read - bytes0
            self.state_reads["round_trips"] += st.round_trips - trips0
        return rows

    def _from_states(self, call: AggregateCall, rows: np.ndarray, agg: np.ndarray) -> np.ndarray:
        """``agg`` with its last rows recomputed from their stored states."""
        from gnn_faas.functions.srpe_recompute import recompute_last_rows

        assert call.states is not None
        k = int(call.states.ids.size)
        if k == 0:
            return agg
        if rows.shape[1:] != (self.feature_dim,):
            raise InvalidRequest("stored states recompute layer 1: its input rows only")
        states = self.state_rows(call.states)
        rec = recompute_last_rows(
            call.op, call.block, rows, states, call.states.terms,
            call.extras.get("deg_src"), call.eps, call.dst_offset,
        )  # fmt: skip
        return np.concatenate((agg[: agg.shape[0] - k], rec))

    def state_stats(self) -> dict[str, int]:
        with self._state_lock:
            r = self.state_reads
            return {
                "state_rows_read": r["rows"],
                "state_bytes_read": r["bytes"],
                "state_round_trips": r["round_trips"],
            }

    def chain_request(
        self, tensors: dict, params: dict, forward: Callable[[str, bytes], bytes]
    ) -> bytes:
        """A whole model in one call (λGrapher's pipeline, every layer one part):
        ``params["chain"]`` lists each layer's aggregate params (with its
        ``forward_layer`` and ``forward_pre_next``), tensors ``"{i}/name"`` are
        layer ``i``'s; layer ``i``'s aggregate goes to the compute function at
        ``forward_url``, whose ``h`` is layer ``i + 1``'s source rows. The answer
        is the last Update's frame."""
        chain = params.get("chain")
        if not isinstance(chain, list) or not 1 <= len(chain) <= MAX_HOPS:
            raise InvalidRequest(f"chain must list 1..{MAX_HOPS} layers' params")
        if not all(isinstance(p, dict) for p in chain):
            raise InvalidRequest("every chain entry must be an object of aggregate params")
        url = params_get(params, "forward_url", str)
        per_layer: list[dict] = [{} for _ in chain]
        for key, arr in tensors.items():
            index, sep, name = key.partition("/")
            if not sep or not index.isdigit() or int(index) >= len(chain):
                raise InvalidRequest(f"unexpected tensor {key!r} in a chained call")
            per_layer[int(index)][name] = arr
        answer = b""
        for i, layer_params in enumerate(chain):
            layer_tensors = per_layer[i]
            if i:  # the source rows of this layer: the Update before it answered them
                out, _ = decode_frame(answer)
                if set(out) != {"h"} or "h" in layer_tensors:
                    raise InvalidRequest("a chained layer takes its rows from the Update before")
                layer_tensors["h"] = out["h"]
            target = forward_target({**layer_params, "forward_url": url})
            if target is None:  # pragma: no cover - forward_url is set just above
                raise InvalidRequest("a chained layer needs forward_layer")
            _, layer, pre_next = target
            body = self.aggregate_request(
                layer_tensors, layer_params, forward_layer=layer, pre_next=pre_next
            )
            answer = forward(url, body)
        return answer

    def _split_new(self, call: AggregateCall) -> np.ndarray:
        """Mask of the stored source ids (checked); the others need ``new_x`` rows."""
        n = self.nodes_at_call()
        stored = call.src_ids < n
        if (call.src_ids < 0).any():
            raise InvalidRequest(f"src_ids must not be negative for graph {self.graph.name!r}")
        n_new = int(call.src_ids.size - np.count_nonzero(stored))
        if call.h is None and n_new != (0 if call.new_x is None else call.new_x.shape[0]):
            shown = ", ".join(str(v) for v in call.src_ids[~stored][:5])
            raise InvalidRequest(
                f"src_ids out of range [0, {n}) for graph "
                f"{self.graph.name!r}: {shown}; a new-vertex request's {n_new} ids beyond "
                "the graph need one new_x row each"
            )
        if call.new_x is not None and call.new_x.shape[1:] != (self.feature_dim,):
            raise InvalidRequest(f"new_x rows must have width {self.feature_dim}")
        return stored

    def _source_rows(self, call: AggregateCall, stored: np.ndarray) -> np.ndarray:
        """Input rows of ``src_ids``: stored rows through the cache, new ones from the request."""
        if stored.all():
            return self.rows_of(call.src_ids)
        rows = np.empty((call.src_ids.size, self.feature_dim), np.float32)
        rows[stored] = self.rows_of(call.src_ids[stored])
        rows[~stored] = call.new_x
        return rows

    def features_request(self, tensors: dict, params: dict) -> bytes:
        ids = np.asarray(_ids_param(tensors, params, "ids"), np.int64)
        n = self.nodes_at_call()
        bad = (ids < 0) | (ids >= n)
        if bad.any():
            raise InvalidRequest(
                f"ids out of range [0, {n}) for graph {self.graph.name!r}: {ids[bad][:5].tolist()}"
            )
        self.counts["features"] += 1

        def work() -> bytes:
            return encode_frame({"x": self.rows_of(ids)})

        shape = RequestShape(ids.size, ids.size, 0, self.feature_dim, "features")
        return self.cache.run(work, shape=shape, pinned=ids)

    def _verified_chunks(self) -> dict[str, int]:
        backend = self.graph.backend
        if not isinstance(backend, ChunkedReads):
            return {}
        return {k: backend.verified_chunks(self.graph.path(k)) for k in self.graph.manifest.blobs}

    def stats(self) -> dict[str, Any]:
        reads = self.fetcher.stats.as_dict()
        cache = self.cache.as_dict()
        out = {
            "pid": os.getpid(),
            "graph": self.graph.name,
            "num_nodes": self.graph.num_nodes,
            "feature_dim": self.feature_dim,
            "requests": sum(self.counts.values()),
            "requests_by_endpoint": dict(self.counts),
            "bytes_read": reads["bytes_read"],
            "bytes_needed": reads["bytes_needed"],
            "round_trips": reads["round_trips"],
            "ranges_requested": reads["ranges_requested"],
            "read_seconds": reads["read_seconds"],
            "cache": cache,
            "rss_bytes": rss_bytes(),
            # without the mapped store pages (file store): what the worker allocated
            "rss_anon_bytes": anon_rss_bytes(),
            "memory_limit_bytes": self.limit_bytes,
            "memory_limit_source": self.limit.source,
            "baseline_bytes": self.cache.baseline_bytes,
            "predicted_peak_bytes": cache["predicted_peak_bytes"],
            "actual_peak_bytes": cache["actual_peak_bytes"],
            "reexecutions": cache["reexecutions"],
            "predictor": "mlp" if self.predictor is not None else "analytic",
            "cache_prior": self.cfg.cache_prior,
            "warmed_rows": self.warmed_rows,
            "verified_chunks": self._verified_chunks(),
            "graph_versions": self.versions.figures(),
            **self.state_stats(),
        }
        if self.debug_modules:
            out["torch_loaded"] = "torch" in sys.modules
        return out


def create_memory_app(cfg: MemoryFunctionConfig) -> Flask:
    """The memory function's Flask app (opens the graph and allocates the cache now)."""
    fn = MemoryFunction(cfg)
    forwards = UpdateForwarder()
    app = install(Flask("gnn_faas.memory"), max_content_length=cfg.max_body_bytes)
    app.extensions["gnn_faas_memory"] = fn
    timer = app.extensions["gnn_faas_timer"]
    install_metrics(app, lambda: memory_families(fn))
    log.info(
        "memory function ready: graph %s, cache capacity %d rows",
        cfg.graph,
        fn.cache.capacity_rows,
        extra={"graph": cfg.graph, "store": cfg.store, "memory_limit_bytes": fn.limit_bytes},
    )

    # answered on the server's event loop: liveness never waits for a thread
    loop_route(app, "/v2/health/live", lambda: (200, {"live": True}))

    @app.get("/_/health")  # OpenFaaS's default readiness probe path
    @app.get("/v2/health/ready")
    def ready():
        if not fn.ready:
            return error_response("graph not open yet", 503)
        return jsonify({"ready": True})

    @app.get("/v1/stats")
    def stats():
        out = fn.stats()
        out["http"] = timer.as_dict()
        return jsonify(out)

    def aggregate_(tensors: dict, params: dict) -> bytes:
        if "chain" in params:
            return fn.chain_request(tensors, params, forwards.update)
        target = forward_target(params)
        if target is None:
            return fn.aggregate_request(tensors, params)
        url, layer, pre_next = target
        body = fn.aggregate_request(tensors, params, forward_layer=layer, pre_next=pre_next)
        return forwards.update(url, body)

    frame_route(app, "/v1/graph", fn.graph_request, bounded=False)  # hops grow it, not the body
    frame_route(app, "/v1/aggregate", aggregate_)
    frame_route(app, "/v1/features", fn.features_request)
    return app


__all__ = [
    "AggregateCall",
    "MemoryFunction",
    "MemoryFunctionConfig",
    "cg_from_tensors",
    "cg_tensors",
    "create_memory_app",
    "execute_aggregate",
    "parse_aggregate",
]
