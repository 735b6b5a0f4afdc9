"""The gateway's protocol-neutral data plane (KServe style).

HTTP endpoints (``gateway/app.py``) stay thin and call this. For each served
model a :class:`ModelRuntime` holds the request path (docs/architecture.md, section 2):

parse -> k-hop vertex set from storage -> route to the buffer with the highest
sharing degree -> wait (decision-tree timeout) -> buffer closes -> merge the
buffer's computation graphs (each (vertex, layer) once) -> partition per layer
-> memory functions Aggregate, compute functions Update, pipelined -> answer.

``mode`` selects the policy: ``graph_sharing`` (the above), ``no_sharing``
(buffers, but each request executed on its own) and ``request_centric``
(AWSGNN: no buffers, each request straight to its own functions, no cache).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout

import numpy as np
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from gnn_faas import deadline
from gnn_faas.clock import RealClock
from gnn_faas.config import ModelServingConfig, ServingConfig
from gnn_faas.errors import (
    BlobNotFound,
    CorruptBlob,
    GraphOutOfService,
    NotFound,
    StoreUnavailable,
    Unavailable,
)
from gnn_faas.functions.checkpoint import checkpoint_sha256
from gnn_faas.functions.checkpoint import load_config as load_model_config
from gnn_faas.functions.layer_plan import ModelPlan
from gnn_faas.gateway import accept_clock
from gnn_faas.gateway.admission import AdmissionController, Overloaded
from gnn_faas.gateway.buffer_pool import BufferConfig, MultiBufferPool
from gnn_faas.gateway.execution import Executions, InferenceJob
from gnn_faas.gateway.graph_service import GraphUpdates
from gnn_faas.gateway.inference_request import (
    InferResponse,
    RawInferRequest,
    model_signature,
    parse_infer_request,
)
from gnn_faas.gateway.metrics import GatewayMetrics, metering_families
from gnn_faas.gateway.model_status import function_rows, model_status
from gnn_faas.gateway.new_vertices import (
    NewVertexLimits,
    new_vertex_parameters,
    parse_new_vertices,
    split_new_vertex_inputs,
)
from gnn_faas.gateway.timeout_configurator import load_configurator
from gnn_faas.metrics import backend_name, storage_families
from gnn_faas.scheduler.merge import merge_computation_graphs
from gnn_faas.scheduler.model_functions import build_model_functions
from gnn_faas.scheduler.platform import open_platform
from gnn_faas.storage.embeddings import EmbeddingStore
from gnn_faas.storage.fetcher import FetchStats, KHopFetcher
from gnn_faas.storage.format import open_graph
from gnn_faas.storage.graph_state import GraphState
from gnn_faas.storage.overlay import GraphOverlay
from gnn_faas.storage.resident import Structure, open_structure, verify_small_blobs
from gnn_faas.storage.served_versions import versions_on
from gnn_faas.storage.srpe_graph import build_srpe_graph
from gnn_faas.storage.store_health import health_of, public_uri, store_health_families
from gnn_faas.storage.versions import GraphVersions

log = logging.getLogger("gnn_faas.gateway")

# a graph out of service is verified again after this long, then twice as long each time
QUARANTINE_RECHECK_S = 30.0
QUARANTINE_RECHECK_MAX_S = 600.0
# a store call waiting this long while requests are shed makes the store the reason given
STORE_STALLED_S = 0.25


def breakdown_ms(
    latency: float,
    queued: float,
    parse: float,
    khop: float,
    buffer: float,
    execute: float,
    info: dict,
) -> dict:
    """Where a request's time went (milliseconds): queued before the handler,
    parse, k-hop fetch, buffer wait, execution (per kind of function call its
    transport, (de)serialisation and work, summed over the execution's calls),
    and the rest (answer, reply, thread hand-offs)."""
    steps = {"queued": queued, "parse": parse, "khop": khop, "buffer": buffer, "execute": execute}
    out: dict = {k: max(v, 0.0) * 1e3 for k, v in steps.items()}
    out["other"] = max(latency * 1e3 - sum(out.values()), 0.0)
    out.update(info.get("calls_ms", {}))
    return out


def recompute_source(
    model: ModelServingConfig, plan: ModelPlan, embeddings: EmbeddingStore | None
) -> tuple[str | None, str | None]:
    """``(recompute_from, reason)`` of a served model: ``"state"`` where it
    serves precomputed embeddings, asks for stored states (the default), is a
    2-layer model whose layer 1 keeps a state (sum, mean, max, GIN, GCN) and
    the stored set holds them; else ``"neighbourhood"`` and why (``None``
    with exact serving)."""
    from gnn_faas.functions.srpe_recompute import supports_states

    if embeddings is None:
        return None, None
    if model.recompute_from == "neighbourhood":
        return "neighbourhood", None  # asked for
    step = plan.steps[0]
    if len(plan.steps) != 2:
        reason = f"stored states serve 2-layer models, this one has {len(plan.steps)} layers"
    elif not supports_states(step):
        reason = f"layer 1 ({step.op}) keeps no aggregate state"
    elif not embeddings.has_states(1):
        reason = (
            f"the stored embeddings hold no layer-1 state: rerun 'gnn-faas precompute "
            f"--model {model.name}'"
        )
    else:
        return "state", None
    log.warning("model %s recomputes from neighbourhoods: %s", model.name, reason)
    return "neighbourhood", reason


class ModelRuntime:
    """One served model: its request path (parse, k-hop fetch, buffers), its
    functions (:mod:`gnn_faas.scheduler.model_functions`) and the executions
    (:mod:`gnn_faas.gateway.execution`)."""

    def __init__(
        self,
        serving: ServingConfig,
        model: ModelServingConfig,
        platform,
        metrics: GatewayMetrics,
        clock=None,
        versions: GraphVersions | None = None,
    ):
        self.serving = serving
        self.model = model
        self.name = model.name
        self.metrics = metrics
        self.clock = clock or RealClock()
        # the graph as it is now and as each request found it (storage/versions.py)
        self.versions = versions or open_versions(serving, model.graph)
        # a graph found corrupt while serving: its reason, and when to check the store again
        self.out_of_service: str | None = None
        self._recheck_at = 0.0
        self._recheck_s = QUARANTINE_RECHECK_S
        ckpt = serving.checkpoint_dir(model)
        self.model_config = load_model_config(ckpt)
        self.plan = ModelPlan.from_config(self.model_config)
        self.fanouts = model.fanouts if model.fanouts is not None else self.model_config.fanouts
        self.needs_degrees = any(s.needs_degrees for s in self.plan.steps)
        # SRPE: the stored embeddings, refused at start when stale (another checkpoint)
        self.embeddings: EmbeddingStore | None = None
        self.checkpoint_sha256: str | None = None
        if model.embeddings == "precomputed":
            self.checkpoint_sha256 = checkpoint_sha256(ckpt)
            self.embeddings = EmbeddingStore.open(self.graph, model.name, self.checkpoint_sha256)
        self._stale_cache: dict = {}  # (base, version) -> stale embeddings (SRPE)
        self.recompute_from, self.recompute_from_reason = recompute_source(
            model, self.plan, self.embeddings
        )
        self.new_vertex_limits = NewVertexLimits(model.max_new_vertices, model.max_new_edges)
        self.platform = platform
        self.functions = build_model_functions(
            serving, model, ckpt, self.plan, platform, self.clock
        )
        self.memory_spec, self.compute_spec = (
            self.functions.memory_spec,
            self.functions.compute_spec,
        )
        self.memory_pool, self.compute_pool = (
            self.functions.memory_pool,
            self.functions.compute_pool,
        )
        self.orchestrator = self.functions.orchestrator
        self.executions = Executions(
            model.name,
            merged=model.mode == "graph_sharing",
            task=self.model_config.task,
            orchestrator=self.orchestrator,
            metrics=metrics,
            merge=self._merge,
            embeddings=self._embeddings_reader,
            state_set=self._state_set,
            count_rows=self._count_rows,
            threads=serving.gateway.threads,
            request_timeout_s=serving.gateway.request_timeout_s,
            move=self._move,
        )
        b = serving.buffers
        self.buffer_config = BufferConfig.from_settings(b, model.slo_s, model.buffers)
        self.buffers: MultiBufferPool | None = None
        if model.mode != "request_centric":
            configurator = load_configurator(b.tree, graph=model.graph, config=self.buffer_config)
            merged = model.mode == "graph_sharing"
            self.buffers = MultiBufferPool(
                self.buffer_config,
                self.graph.num_nodes,
                self.clock,
                configurator,
                on_close=self.executions.on_close,
                # merged executions run work-conserving, at most one per memory instance
                max_concurrency=serving.platform.max_memory_instances if merged else None,
            )
            if merged:
                self.executions.finished = self.buffers.finished
        gw = serving.gateway
        self.admission = AdmissionController(
            model.slo_s, clock=self.clock, headroom=gw.admission_headroom, enabled=gw.admission
        )
        self.totals = {"requests": 0, "aggregated_rows": 0, "slo_violations": 0, "shed": 0}
        self._warmed = False
        self._totals_lock = threading.Lock()

    # -- the graph ------------------------------------------------------------------
    @property
    def graph(self):
        """The newest version's base (its manifest, blobs and counts)."""
        return self.versions.state.graph

    @property
    def structure(self) -> Structure:
        return self.versions.structures[self.graph.prefix]

    @property
    def fetcher(self) -> KHopFetcher:
        """A fetcher of the newest version."""
        return self.fetcher_at(self.versions.state)

    def fetcher_at(self, state: GraphState) -> KHopFetcher:
        """A fetcher reading ``state`` (its base's structure and its changes)."""
        return self.versions.fetchers[state.graph.prefix].at(state)

    # -- lifecycle -------------------------------------------------------------
    def start(self) -> None:
        self.memory_pool.start()
        self.compute_pool.start()
        if self.buffers is not None:
            self.buffers.start()

    def stop(self) -> None:
        if self.buffers is not None:
            self.buffers.stop()  # flushes: every waiting request is executed
        self.executions.shutdown()
        self.memory_pool.stop()
        self.compute_pool.stop()

    def ready(self) -> bool:
        """True when a request could be served now. At start that waits for the
        ``min_instances`` warm instances of each function; from then on it only
        needs each function to have a warm instance or room to launch one, so an
        idle gateway (its platform scaled the functions in, or to zero on
        Knative) stays ready. A graph out of service is not ready. The store is
        not asked: an outage is answered 503 per request (docs/architecture.md,
        section 6)."""
        if self.out_of_service is not None:
            return False
        pools = (self.memory_pool, self.compute_pool)
        if not self._warmed:
            if self.serving.platform.min_instances > 0 and not all(p.instances() for p in pools):
                return False
            self._warmed = True
        return all(p.has_ready_instance() for p in pools)

    def expire_idle(self) -> list[str]:
        """Keep-alive and health sweep (every second): let go of instances whose
        process died (the platform saw it exit) and stop instances idle longer
        than ``keep_alive_s`` (scale to zero). The pool drops an instance first,
        so no work is routed to it while it stops."""
        stopped = []
        now = self.clock.now()
        dead = {i.id for i in self.platform.instances() if i.state == "failed"}
        for pool, spec in self.functions.pools:
            for inst, since in pool.idle_instances():
                expired = now - since > spec.keep_alive_s
                # keep-alive never goes below min_instances; a dead instance always goes
                keep = pool.min_instances >= len(pool.instances())
                if (inst.id in dead or (expired and not keep)) and pool.remove(inst):
                    self.platform.stop(inst.id)
                    stopped.append(inst.id)
            for inst in pool.reap_surplus():  # a launch budget's reap rule
                self.platform.stop(inst.id)
                stopped.append(inst.id)
            pool.ensure_min()  # replace what died below min_instances
        self.recheck()
        return stopped

    # -- a graph found corrupt -------------------------------------------------------
    def take_out_of_service(self, exc: BaseException) -> GraphOutOfService:
        """Stop answering this model (503) after its graph was found corrupt or
        incomplete; :meth:`recheck` puts it back once the store verifies again."""
        reason = str(exc) or type(exc).__name__
        if self.out_of_service is None:
            log.error(
                "model %s taken out of service: graph %s in %s is corrupt: %s",
                self.name, self.model.graph, public_uri(self.serving.store), reason,
            )  # fmt: skip
            self.out_of_service = reason
            self._recheck_s = QUARANTINE_RECHECK_S
            self._recheck_at = time.monotonic() + self._recheck_s
        return self._out_of_service_error()

    def _out_of_service_error(self) -> GraphOutOfService:
        return GraphOutOfService(
            f"model {self.name!r} is out of service: graph {self.model.graph!r} failed "
            f"verification ({self.out_of_service}); it is checked again every "
            f"{self._recheck_s:.0f} s"
        )

    def recheck(self) -> bool:
        """While out of service, verify the whole graph again (every blob's
        sha256, the CSR invariants) at growing intervals; back in service when
        it passes. Whether the model serves."""
        if self.out_of_service is None:
            return True
        if time.monotonic() < self._recheck_at:
            return False
        try:
            open_graph(self.serving.store, self.model.graph, verify="full")
            self.versions.reload()  # the base's structure read and verified again
        except Exception as exc:  # noqa: BLE001 - still broken (or unreachable): stay out
            self._recheck_s = min(QUARANTINE_RECHECK_MAX_S, 2 * self._recheck_s)
            self._recheck_at = time.monotonic() + self._recheck_s
            log.warning("model %s stays out of service: %s", self.name, exc)
            return False
        log.warning("model %s back in service: graph %s verified", self.name, self.model.graph)
        self.out_of_service = None
        return True

    # -- metadata ----------------------------------------------------------------
    def metadata(self) -> dict:
        cfg = self.model_config
        return {
            "name": self.name,
            "versions": ["1"],
            "platform": "gnn-faas",
            # the inputs and outputs of the request kinds this model's task answers
            **model_signature(cfg.task, cfg.out_dim),
            "parameters": {
                "task": cfg.task,
                "graph": self.model.graph,
                "num_nodes": self.versions.state.num_nodes,
                "graph_version": self.versions.state.version,
                "arch": cfg.arch,
                "num_layers": cfg.num_layers,
                # the per-hop sample the k-hop fetch takes (None: every neighbour),
                # so a replay models the fetches this model makes
                "fanouts": None if self.fanouts is None else [int(f) for f in self.fanouts],
                "slo_s": self.model.slo_s,
                "mode": self.model.mode,
                "embeddings": self.model.embeddings,
                **self.srpe_parameters(),
                **new_vertex_parameters(self.versions.state.num_nodes, self.new_vertex_limits),
            },
        }

    def srpe_parameters(self) -> dict:
        """Precomputed serving's settings: the budget, the policy and where a
        recomputed candidate's layer 1 comes from (with why, where the stored
        states could not be used)."""
        if self.embeddings is None:
            return {}
        out = {
            "recompute_budget": self.model.recompute_budget,
            "recompute_policy": self.model.recompute_policy,
            "recompute_from": self.recompute_from,
        }
        if self.recompute_from_reason is not None:
            out["recompute_from_reason"] = self.recompute_from_reason
        return out

    # -- request path --------------------------------------------------------------
    def infer(
        self, body: bytes | dict | RawInferRequest, accepted_at: float | None = None
    ) -> InferResponse:
        """Answer one OIP request (counted by kind and outcome in the metrics).

        Latency and the SLO count run from ``accepted_at`` (clock time the server
        took the request in; default: the serving worker's accept stamp under a
        real clock, else now), so time queued before the handler counts. The
        admission controller may shed the request first (:class:`Overloaded`,
        503 + Retry-After): shed requests are counted apart, never as served."""
        if accepted_at is None:
            stamp = accept_clock.accepted_at() if isinstance(self.clock, RealClock) else None
            accepted_at = self.clock.now() if stamp is None else stamp
        if self.out_of_service is not None:
            self.metrics.requests.labels(self.name, "unknown", "out_of_service").inc()
            raise self._out_of_service_error()
        # every stage (k-hop, buffer, functions, store reads) ends by the deadline
        timeout = self.serving.gateway.request_timeout_s
        left = timeout - max(0.0, self.clock.now() - accepted_at)
        with deadline.scope(left):
            # the version this request runs on, from parse to answer (snapshot isolation)
            state = self.versions.current()
            return self._admit_and_infer(body, accepted_at, left, state)

    def _admit_and_infer(
        self,
        body: bytes | dict | RawInferRequest,
        accepted_at: float,
        left: float,
        state: GraphState,
    ) -> InferResponse:
        t0 = time.perf_counter()
        try:  # the cheap checks (parse, shape, ids) first: a 503 means only "valid, not now"
            parsed = self._parse(body, state)
        except Exception:
            self.metrics.requests.labels(self.name, "unknown", "error").inc()
            raise
        decision = self.admission.decide(accepted_at)
        if not decision.admit:
            self.metrics.shed.labels(self.name).inc()
            with self._totals_lock:
                self.totals["shed"] += 1
            health = health_of(self.serving.store)
            stalled = health.stalled_for()
            if not health.up or stalled > STORE_STALLED_S:
                # saturated by requests waiting on the store: the store is why
                cause = health.cause or f"a call has waited {stalled:.1f} s for an answer"
                raise StoreUnavailable(
                    f"model {self.name!r}: graph store {health.uri} is unavailable "
                    f"({cause}); retry after {decision.retry_after_s} s"
                )
            raise Overloaded(
                f"model {self.name!r} is overloaded: a request admitted now would take about "
                f"{decision.predicted_s:.3f} s against an SLO of {self.model.slo_s} s; "
                f"retry after {decision.retry_after_s} s",
                decision.retry_after_s,
            )
        parse_s = time.perf_counter() - t0
        kind = parsed[0].kind
        try:
            result, kind, latency, queued = self._infer(
                parsed, accepted_at, t0, parse_s, left, state
            )
        except (CorruptBlob, BlobNotFound) as exc:
            # never a wrong answer: the model stops serving until the store verifies
            self.admission.done(None)
            self.metrics.requests.labels(self.name, kind, "out_of_service").inc()
            raise self.take_out_of_service(exc) from None
        except StoreUnavailable:
            self.admission.done(None)
            self.metrics.requests.labels(self.name, kind, "store_unavailable").inc()
            raise
        except Exception:
            self.admission.done(None)
            self.metrics.requests.labels(self.name, kind, "error").inc()
            raise
        self.admission.done(latency, queued)
        self.metrics.requests.labels(self.name, kind, "ok").inc()
        return result

    def _parse(self, body: bytes | dict | RawInferRequest, state: GraphState):
        """The parsed request and its new-vertex overlay (``None``: none), at graph
        version ``state``; every input error is raised here, before admission (a
        vertex the version removed: 404)."""
        graph = state.graph
        with self.metrics.stage(self.name, "parse"):
            body, added = split_new_vertex_inputs(body)
            overlay = parse_new_vertices(
                added,
                state.num_nodes,
                graph.manifest.feature_dim,
                graph.manifest.symmetrized,
                self.new_vertex_limits,
                id_map=state.id_map,
            )
            num_ids = state.num_nodes if overlay is None else overlay.num_nodes
            req = parse_infer_request(
                self.name,
                body,
                num_ids,
                max_targets=self.model.max_targets,
                task=self.model_config.task,
                limits=self.serving.limits,
                id_map=state.id_map,
            )
            state.check_targets(req.targets)
            if overlay is not None and overlay.src.size:
                state.check_targets(overlay.src[overlay.src < state.num_nodes])
        return req, overlay

    def _infer(
        self, parsed, accepted_at: float, t0: float, parse_s: float, left: float, state: GraphState
    ) -> tuple[InferResponse, str, float, float]:
        """The answer, the request kind, its latency and time queued (seconds);
        ``t0`` is when parsing began and ``parse_s`` how long it took."""
        req, overlay = parsed
        arrival = self.clock.now()
        queued = max(0.0, arrival - accepted_at)
        m = self.metrics
        t_parsed = time.perf_counter()
        with m.stage(self.name, "khop"):  # concurrent: no lock (storage/resident.py)
            stats = FetchStats()
            fetcher = self.fetcher_at(state)
            predicted = self._predicted_rows(fetcher, req.targets)
            cg = self._graph_of(fetcher, req.targets, overlay, stats)
        t_submit = time.perf_counter()
        pending = InferenceJob(req, cg, Future(), t0, overlay, predicted, state=state)
        pending.future.set_running_or_notify_cancel()
        if self.buffers is None or overlay is not None:
            # a request's added edges change its stored neighbours: never merged
            self.executions.run_separately([pending], None)
        else:
            # clients choose OIP ids and may repeat them: the pool gets its own key
            self.buffers.submit(uuid.uuid4().hex, np.sort(cg.nodes), payload=pending)
        try:
            outputs, info = pending.future.result(timeout=max(0.0, deadline.remaining() or left))
        except FutureTimeout:
            timeout = self.serving.gateway.request_timeout_s
            health = health_of(self.serving.store)
            if not health.up:  # the store's fault, said so
                raise StoreUnavailable(
                    f"model {self.name!r}: no answer within {timeout} s: graph store "
                    f"{health.uri} is unavailable ({health.cause})"
                ) from None
            raise Unavailable(f"model {self.name!r}: no answer within {timeout} s") from None
        t_done = time.perf_counter()
        latency = max(0.0, self.clock.now() - accepted_at)
        m.request_seconds.labels(self.name).observe(latency)
        m.stage_seconds.labels(self.name, "queued").observe(queued)
        late = latency > self.model.slo_s
        if late:
            m.slo_violations.labels(self.name).inc()
        with self._totals_lock:
            self.totals["requests"] += 1
            self.totals["slo_violations"] += int(late)
        times = (queued, parse_s, t_submit - t_parsed, info["closed_at"] - t_submit)
        info = {
            **info,
            "latency_ms": latency * 1e3,
            "queued_ms": queued * 1e3,
            "arrival_s": arrival,
            "breakdown_ms": breakdown_ms(latency, *times, t_done - info["closed_at"], info),
        }
        # only the outputs the client asked for; binary ones as binary tensor data
        response = InferResponse(
            self.name, req.id, req.select_outputs(outputs), info, req.binary_outputs
        )
        return response, req.kind, latency, queued

    def _graph_of(
        self,
        fetcher: KHopFetcher,
        targets: np.ndarray,
        overlay: GraphOverlay | None,
        stats: FetchStats,
    ):
        """The computation graph of ``targets``: the k-hop one, or with
        ``embeddings: precomputed`` the SRPE one."""
        if self.embeddings is not None:
            sg = build_srpe_graph(
                fetcher,
                targets,
                self.plan.config.num_layers,
                self.model.recompute_budget,
                self.model.recompute_policy,
                overlay=overlay,
                from_state=self.recompute_from == "state",
                stale=self._stale_at(fetcher.state),
            )
            if sg is not None:
                return sg
            # a stale embedding would be read on the boundary: this request exactly
        return fetcher.fetch(
            targets,
            self.plan.config.num_layers,
            fanouts=self.fanouts,
            stats=stats,
            degrees=self.needs_degrees,
            overlay=overlay,
        )

    def _stale_at(self, state: GraphState | None) -> np.ndarray | None:
        """Vertices whose stored embeddings are stale at ``state`` (sorted): the
        marks a compaction left in the set, and every vertex within ``L - 1``
        hops downstream of a change since the base. Cached per version."""
        if self.embeddings is None:
            return None
        key = (None, 0) if state is None else (state.graph.prefix, state.version)
        cached = self._stale_cache.get(key)
        if cached is not None:
            return cached
        if state is not None and state.graph.prefix != self.embeddings.graph.prefix:
            # a compaction moved the base: the set's marks (and fingerprint) moved with it
            self.embeddings = EmbeddingStore.open(state.graph, self.name, self.checkpoint_sha256)
        stale = self.embeddings.stale
        if state is not None and state.version > state.base_version:
            hops = self.plan.config.num_layers - 1
            stale = np.union1d(stale, state.reach(state.changed_vertices(), hops))
        if len(self._stale_cache) > 8:
            self._stale_cache.clear()
        self._stale_cache[key] = stale
        return stale

    def _merge(self, pendings: list[InferenceJob]):
        """``(graph, per-request rows, separate rows)`` of a closed buffer. SRPE:
        one SRPE graph of the union of the targets, so each candidate is
        recomputed once for the whole buffer."""
        if self.embeddings is None:
            merged = merge_computation_graphs([p.cg for p in pendings])
            return merged.graph, merged.request_rows, merged.separate_rows
        targets = [p.request.targets for p in pendings]
        fetcher = self.fetcher_at(pendings[0].state) if pendings[0].state else self.fetcher
        sg = self._graph_of(fetcher, np.concatenate(targets), None, FetchStats())
        bounds = np.cumsum([0] + [t.size for t in targets])
        rows = [sg.target_index[a:b] for a, b in zip(bounds[:-1], bounds[1:])]
        return sg, rows, int(sum(p.cg.aggregated_rows() for p in pendings))

    def _move(self, job: InferenceJob, state: GraphState) -> bool:
        """Move ``job`` onto the newer graph version ``state``: its k-hop fetched
        again there (execution.Executions._by_version). False, and it stays, when
        it brought new vertices or ``state`` removed one of its targets."""
        if job.overlay is not None or state.features.is_removed(job.request.targets).any():
            return False
        job.cg = self._graph_of(self.fetcher_at(state), job.request.targets, None, FetchStats())
        job.state = state
        return True

    def _predicted_rows(self, fetcher: KHopFetcher, targets: np.ndarray) -> float | None:
        """Quiver's PSGS of the request (``Σ PSGS(t)``, one ranged read) when the
        graph has it for this model's fanouts: the request's size before its
        fetch, which places its Update (CPU or GPU pool) and is reported."""
        from gnn_faas.storage.workload_metrics import predicted_size, stored_fanouts

        stored = stored_fanouts(self.graph)
        layers = self.plan.config.num_layers
        want = [-1 if f is None or f < 0 else int(f) for f in (self.fanouts or [-1] * layers)]
        if stored != want:
            return None
        return predicted_size(
            self.graph, fetcher.reader_for("psgs"), targets[targets < self.graph.num_nodes]
        )

    def _embeddings_reader(self):
        return None if self.embeddings is None else self.embeddings.rows

    def _state_set(self) -> tuple[str, str] | None:
        """The embedding set whose stored states the memory functions read."""
        if self.recompute_from != "state" or self.checkpoint_sha256 is None:
            return None
        return self.name, self.checkpoint_sha256

    def _count_rows(self, rows: int) -> None:
        self.metrics.aggregated_rows.labels(self.name).inc(rows)
        with self._totals_lock:
            self.totals["aggregated_rows"] += rows

    # -- status ------------------------------------------------------------------
    def status(self) -> dict:
        return model_status(self)

    def function_rows(self) -> list[dict]:
        return function_rows(self)


def load_structures(serving: ServingConfig) -> dict[str, Structure]:
    """Open and verify the structure of every served graph (sha256, CSR
    invariants): a corrupt or incomplete store raises here, before anything
    is served. ``gnn-faas up`` calls this before its worker starts, which then
    inherits the resident structures instead of reading them again."""
    budget = int(serving.gateway.structure_budget_mb * 2**20)
    out: dict[str, Structure] = {}
    for m in serving.models:
        if m.graph not in out:
            graph = open_graph(serving.store, m.graph)
            out[m.graph] = open_structure(graph, budget)
            verify_small_blobs(graph, set(out[m.graph].keys))
    return out


def open_versions(
    serving: ServingConfig, name: str, preloaded: Structure | None = None
) -> GraphVersions:
    """Graph ``name``'s versions as the gateway reads them: each base's structure
    resident or chunk-cached (``preloaded``: one already verified, used when it
    is the current base's), its fetcher kept per base (``.fetchers``,
    ``.structures``, by prefix)."""
    budget = int(serving.gateway.structure_budget_mb * 2**20)
    return versions_on(serving.store, name, budget, serving.graphs.freshness_s, preloaded=preloaded)


class DataPlane:
    """Every served model, the platform they run on, and the gateway's metrics.
    ``structures``: graphs' structures already loaded (:func:`load_structures`)."""

    def __init__(
        self,
        serving: ServingConfig,
        platform=None,
        clock=None,
        structures: dict[str, Structure] | None = None,
        writer_process: bool = False,
    ):
        self.serving = serving
        self.clock = clock or RealClock()
        self.metrics = GatewayMetrics()
        # the data plane scales in (keep-alive), so the platform's own reaper is off
        self.platform = platform or open_platform(
            serving.platform.kind, reaper_interval_s=None, **serving.platform.backend_kwargs()
        )
        self.models: dict[str, ModelRuntime] = {}
        # one view per graph, shared by its models (storage/versions.py)
        self.graphs: dict[str, GraphVersions] = {}
        for m in serving.models:
            if m.graph not in self.graphs:
                pre = (structures or {}).get(m.graph)
                self.graphs[m.graph] = open_versions(serving, m.graph, pre)
        for m in serving.models:
            self.models[m.name] = ModelRuntime(
                serving, m, self.platform, self.metrics, self.clock, self.graphs[m.graph]
            )
            self.metrics.add_model(m.name)
        self.updates = GraphUpdates(serving, self.graphs, self.metrics, writer_process)
        self.metrics.add_collector(self._gauges)
        self.metrics.add_collector(self._storage_reads)
        self.metrics.add_collector(store_health_families)
        self.started_at = time.time()

    def start(self) -> None:
        for rt in self.models.values():
            rt.start()
        for versions in self.graphs.values():  # newer versions found within freshness_s
            versions.start()
        self.updates.start()
        self._stop_keepalive = threading.Event()
        self._keepalive = threading.Thread(target=self._keepalive_loop, daemon=True)
        self._keepalive.start()

    def _keepalive_loop(self) -> None:
        while not self._stop_keepalive.wait(1.0):
            for rt in self.models.values():
                try:
                    rt.expire_idle()
                except Exception:  # keep-alive must outlive one bad round
                    log.exception("keep-alive round failed for %s", rt.name)

    def shutdown(self) -> None:
        if getattr(self, "_stop_keepalive", None) is not None:
            self._stop_keepalive.set()
        for versions in self.graphs.values():
            versions.stop()
        self.updates.shutdown()
        for rt in self.models.values():
            rt.stop()
        self.platform.shutdown()

    def live(self) -> bool:
        return True

    def ready(self) -> bool:
        return all(rt.ready() for rt in self.models.values())

    def model(self, name: str) -> ModelRuntime:
        try:
            return self.models[name]
        except KeyError:
            raise NotFound(
                f"unknown model {name!r}; served: {', '.join(sorted(self.models))}"
            ) from None

    def status(self, start: float | None = None, end: float | None = None) -> dict:
        """Everything ``gnn-faas status`` shows; metering over ``[start, end]``
        (monotonic seconds, as the platform's clock) when given."""
        metering = self.platform.metering(start, end)
        return {
            "uptime_s": time.time() - self.started_at,
            "ready": self.ready(),
            "models": [rt.status() for rt in self.models.values()],
            "instances": [i.as_dict() for i in self.platform.instances()],
            "metering": metering.as_dict(),
        }

    def _storage_reads(self):
        """What the gateway read from the store (k-hop vertex sets), per backend."""
        backend = backend_name(self.serving.store)
        yield from storage_families(
            (backend, rt.model.graph, rt.fetcher.stats) for rt in self.models.values()
        )
        structure = GaugeMetricFamily(
            "gnn_faas_structure_bytes",
            "Bytes of graph structure the gateway holds: resident (read once at start, no "
            "store call per request) or chunk-cached",
            labels=["graph", "how"],
        )
        seen = set()
        for rt in self.models.values():
            if rt.model.graph in seen:
                continue
            seen.add(rt.model.graph)
            s = rt.structure
            how = "resident" if s.resident else "chunk_cache"
            held = s.nbytes if s.resident else s.figures().get("cached_bytes", 0)
            structure.add_metric([rt.model.graph, how], float(held))
        yield structure

    def _replica_gauges(self):
        """The figures of ``gnn-faas status``'s function rows, as gauges."""
        replicas = GaugeMetricFamily(
            "gnn_faas_function_replicas",
            "Function replicas: desired and actual (the platform's autoscaler), ready",
            labels=["function", "kind"],
        )
        in_flight = GaugeMetricFamily(
            "gnn_faas_function_in_flight", "Calls in flight per function", labels=["function"]
        )
        for rt in self.models.values():
            for row in rt.function_rows():
                for kind in ("desired", "actual", "ready"):
                    if row.get(kind) is not None:
                        replicas.add_metric([row["function"], kind], float(row[kind]))
                in_flight.add_metric([row["function"]], float(row["in_flight"]))
        yield replicas
        yield in_flight

    def _gauges(self):
        inst = GaugeMetricFamily(
            "gnn_faas_instances", "Function instances by state", labels=["function", "state"]
        )
        counts: dict[tuple[str, str], int] = {}
        for i in self.platform.instances():
            key = (i.spec.name, i.state)
            counts[key] = counts.get(key, 0) + 1
        for (fn, state), n in counts.items():
            inst.add_metric([fn, state], n)
        yield inst
        queue = GaugeMetricFamily(
            "gnn_faas_queue_length", "Work items queued per function", labels=["function"]
        )
        for rt in self.models.values():
            for pool in (rt.memory_pool, rt.compute_pool):
                snap = pool.snapshot()
                # on instances and pending (waiting for one): as status's queue_length
                queued = sum(snap["queues"].values()) + snap["pending"]
                queue.add_metric([pool.name], queued)
        yield queue
        yield from self._replica_gauges()
        yield from metering_families(self.platform.metering())
        # platforms that tell why instances died (docker: oom, exit_<code>, start_timeout, ...)
        failure_counts = getattr(self.platform, "failure_counts", None)
        if failure_counts is not None:
            failed = CounterMetricFamily(
                "gnn_faas_instance_failures",
                "Function instances that failed, by reason",
                labels=["function", "reason"],
            )
            for (fn, reason), n in sorted(failure_counts().items()):
                failed.add_metric([fn, reason], n)
            yield failed
