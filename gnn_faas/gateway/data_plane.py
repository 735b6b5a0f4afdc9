"""The gateway's protocol-neutral data plane (KServe style).

HTTP endpoints (``gateway/app.py``) stay thin and call this. For each served
model a :class:`ModelRuntime` holds the request path of DESIGN.md:

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
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass

import numpy as np
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from gnn_faas.clock import RealClock
from gnn_faas.config import ModelServingConfig, ServingConfig
from gnn_faas.errors import NotFound, Unavailable
from gnn_faas.functions.checkpoint import load_config as load_model_config
from gnn_faas.functions.layer_plan import ModelPlan
from gnn_faas.gateway import accept_clock
from gnn_faas.gateway.admission import AdmissionController, Overloaded
from gnn_faas.gateway.buffer_pool import ClosedBuffer, MultiBufferPool
from gnn_faas.gateway.inference_request import (
    InferenceRequest,
    InferResponse,
    RawInferRequest,
    model_signature,
    parse_infer_request,
)
from gnn_faas.gateway.load_aware_queue import FunctionPool
from gnn_faas.gateway.metrics import GatewayMetrics
from gnn_faas.gateway.new_vertices import (
    NewVertexLimits,
    new_vertex_parameters,
    parse_new_vertices,
    split_new_vertex_inputs,
)
from gnn_faas.gateway.timeout_configurator import load_configurator
from gnn_faas.scheduler.merge import merge_computation_graphs
from gnn_faas.scheduler.orchestrator import ClientCache, Orchestrator
from gnn_faas.scheduler.platform import open_platform
from gnn_faas.scheduler.platform.base import FunctionSpec
from gnn_faas.storage.computation_graph import ComputationGraph
from gnn_faas.storage.embeddings import EmbeddingStore, checkpoint_sha256
from gnn_faas.storage.fetcher import FetchStats, KHopFetcher
from gnn_faas.storage.format import open_graph
from gnn_faas.storage.overlay import GraphOverlay
from gnn_faas.storage.srpe_graph import build_srpe_graph

log = logging.getLogger("gnn_faas.gateway")


def stage_ms(stats) -> dict[str, float]:
    """Milliseconds an execution held memory instances (Aggregate calls) and
    compute instances (Update calls), summed over its calls: what each
    function's pool was busy with (``gnn-faas simulate calibrate`` splits the
    execution time between the two pools by them)."""
    return {"aggregate_ms": stats.aggregate_seconds * 1e3, "update_ms": stats.update_seconds * 1e3}


class MeteredPool:
    """A :class:`FunctionPool` whose every call runs inside ``platform.busy``:
    the platform meters busy GB-s and knows when an instance was last used."""

    def __init__(self, pool: FunctionPool, platform):
        self.pool = pool
        self.platform = platform

    def submit(self, fn) -> Future:
        def run(inst):
            with self.platform.busy(inst.id):
                return fn(inst)

        return self.pool.submit(run)

    def __getattr__(self, name):
        return getattr(self.pool, name)


@dataclass
class Pending:
    """A request waiting in a buffer: what it needs and where its answer goes."""

    request: InferenceRequest
    cg: ComputationGraph
    future: Future
    arrival: float
    overlay: GraphOverlay | None = None  # a new-vertex request's added vertices and edges
    predicted_rows: float | None = None  # Σ PSGS of the targets, known before the fetch


class ModelRuntime:
    def __init__(
        self,
        serving: ServingConfig,
        m: ModelServingConfig,
        platform,
        metrics: GatewayMetrics,
        clock=None,
    ):
        self.serving = serving
        self.m = m
        self.name = m.name
        self.metrics = metrics
        self.clock = clock or RealClock()
        self.graph = open_graph(serving.store, m.graph)
        self.fetcher = KHopFetcher(self.graph)
        self._fetch_lock = threading.Lock()
        ckpt = serving.checkpoint_dir(m)
        self.model_config = load_model_config(ckpt)
        self.plan = ModelPlan.from_config(self.model_config)
        self.fanouts = m.fanouts if m.fanouts is not None else self.model_config.fanouts
        self.needs_degrees = any(s.needs_degrees for s in self.plan.steps)
        # SRPE: the stored embeddings, refused at start when stale (another checkpoint)
        self.embeddings: EmbeddingStore | None = None
        if m.embeddings == "precomputed":
            self.embeddings = EmbeddingStore.open(self.graph, m.name, checkpoint_sha256(ckpt))
        self.new_vertex_limits = NewVertexLimits(m.max_new_vertices, m.max_new_edges)
        p = serving.platform
        cache_off = m.mode == "request_centric"
        mem_args = ["--store", serving.store, "--graph", m.graph]
        if cache_off:
            mem_args += ["--cache-max-rows", "0"]
        elif m.cache_prior != "degree":
            mem_args += ["--cache-prior", m.cache_prior]
        self.memory_spec = FunctionSpec(
            name=f"{m.name}-memory",
            kind="memory",
            args=tuple(mem_args),
            memory_mb=p.memory_function_mb,
            vcpus=p.memory_vcpus,
            keep_alive_s=p.keep_alive_s,
        )
        self.compute_spec = FunctionSpec(
            name=f"{m.name}-compute",
            kind="compute",
            args=("--model", str(ckpt), "--device", m.device),
            memory_mb=p.compute_function_mb,
            vcpus=p.compute_vcpus,
            keep_alive_s=p.keep_alive_s,
        )
        self.platform = platform
        policy = "request_centric" if cache_off else "load_aware"

        def pool(spec: FunctionSpec, max_instances: int) -> FunctionPool:
            return FunctionPool(
                spec.name,
                launch=lambda: platform.launch(spec),
                clock=self.clock,
                max_instances=max_instances,
                min_instances=p.min_instances,
                policy=policy,
                on_failed=lambda inst: platform.stop(inst.id),
            )

        self.memory_pool = pool(self.memory_spec, p.max_memory_instances)
        self.compute_pool = pool(self.compute_spec, p.max_compute_instances)
        runtime_bytes = p.runtime_mb * 2**20
        self.orchestrator = Orchestrator(
            self.plan,
            MeteredPool(self.memory_pool, platform),
            MeteredPool(self.compute_pool, platform),
            budget_bytes=p.memory_function_mb * 2**20,
            runtime_bytes=runtime_bytes,
            clients=ClientCache(),
        )
        b = serving.buffers
        self.buffer_config = b.for_slo(m.slo_s, m.buffers)
        self.buffers: MultiBufferPool | None = None
        if m.mode != "request_centric":
            configurator = load_configurator(b.tree, graph=m.graph, config=self.buffer_config)
            self.buffers = MultiBufferPool(
                self.buffer_config,
                self.graph.num_nodes,
                self.clock,
                configurator,
                on_close=self._on_close,
                # merged executions run work-conserving, at most one per memory instance
                max_concurrency=p.max_memory_instances if m.mode == "graph_sharing" else None,
            )
        # closed buffers run here; single requests (no_sharing, request_centric) on
        # request_executor, sized for the gateway's concurrent requests
        self.executor = ThreadPoolExecutor(max_workers=8, thread_name_prefix=f"{m.name}-exec")
        self.request_executor = ThreadPoolExecutor(
            max_workers=serving.gateway.threads, thread_name_prefix=f"{m.name}-req"
        )
        gw = serving.gateway
        self.admission = AdmissionController(
            m.slo_s, clock=self.clock, headroom=gw.admission_headroom, enabled=gw.admission
        )
        self.totals = {"requests": 0, "aggregated_rows": 0, "slo_violations": 0, "shed": 0}
        self._totals_lock = threading.Lock()

    # -- lifecycle -------------------------------------------------------------
    def start(self) -> None:
        self.memory_pool.start()
        self.compute_pool.start()
        if self.buffers is not None:
            self.buffers.start()

    def stop(self) -> None:
        if self.buffers is not None:
            self.buffers.stop()  # flushes: every waiting request is executed
        self.executor.shutdown(wait=True, cancel_futures=False)
        self.request_executor.shutdown(wait=True, cancel_futures=False)
        self.memory_pool.stop()
        self.compute_pool.stop()

    def ready(self) -> bool:
        """True only when a request could be served now: a warm memory and a warm
        compute instance (with ``min_instances = 0``: capacity to launch them)."""
        pools = (self.memory_pool, self.compute_pool)
        if self.serving.platform.min_instances == 0:
            return all(p.has_ready_instance() for p in pools)
        return all(p.instances() for p in pools)

    def expire_idle(self) -> list[str]:
        """Keep-alive and health sweep (every second): let go of instances whose
        process died (the platform saw it exit) and stop instances idle longer
        than ``keep_alive_s`` (scale to zero). The pool drops an instance first,
        so no work is routed to it while it stops."""
        stopped = []
        now = self.clock.now()
        dead = {i.id for i in self.platform.instances() if i.state == "failed"}
        pools = ((self.memory_pool, self.memory_spec), (self.compute_pool, self.compute_spec))
        for pool, spec in pools:
            for inst, since in pool.idle_instances():
                expired = now - since > spec.keep_alive_s
                if (inst.id in dead or expired) and pool.remove(inst):
                    self.platform.stop(inst.id)
                    stopped.append(inst.id)
        return stopped

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
                "graph": self.m.graph,
                "num_nodes": self.graph.num_nodes,
                "arch": cfg.arch,
                "num_layers": cfg.num_layers,
                "slo_s": self.m.slo_s,
                "mode": self.m.mode,
                "embeddings": self.m.embeddings,
                **new_vertex_parameters(self.graph.num_nodes, self.new_vertex_limits),
            },
        }

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
        decision = self.admission.decide(accepted_at)
        if not decision.admit:
            self.metrics.shed.labels(self.name).inc()
            with self._totals_lock:
                self.totals["shed"] += 1
            raise Overloaded(
                f"model {self.name!r} is overloaded: a request admitted now would take about "
                f"{decision.predicted_s:.3f} s against an SLO of {self.m.slo_s} s; "
                f"retry after {decision.retry_after_s} s",
                decision.retry_after_s,
            )
        kind = "unknown"  # the kind is known only once the body parsed
        try:
            result, kind, latency, queued = self._infer(body, accepted_at)
        except Exception:
            self.admission.done(None)
            self.metrics.requests.labels(self.name, kind, "error").inc()
            raise
        self.admission.done(latency, queued)
        self.metrics.requests.labels(self.name, kind, "ok").inc()
        return result

    def _infer(
        self, body: bytes | dict | RawInferRequest, accepted_at: float
    ) -> tuple[InferResponse, str, float, float]:
        """The answer, the request kind, its latency and time queued (seconds)."""
        t0 = time.perf_counter()
        arrival = self.clock.now()
        queued = max(0.0, arrival - accepted_at)
        m = self.metrics
        with m.stage(self.name, "parse"):
            body, added = split_new_vertex_inputs(body)
            overlay = parse_new_vertices(
                added,
                self.graph.num_nodes,
                self.graph.manifest.feature_dim,
                self.graph.manifest.symmetrized,
                self.new_vertex_limits,
            )
            num_ids = self.graph.num_nodes if overlay is None else overlay.num_nodes
            req = parse_infer_request(
                self.name,
                body,
                num_ids,
                max_targets=self.m.max_targets,
                task=self.model_config.task,
                limits=self.serving.limits,
            )
        with m.stage(self.name, "khop"):
            stats = FetchStats()
            before = self.fetcher.stats.bytes_read
            with self._fetch_lock:
                predicted = self._predicted_rows(req.targets)
                cg = self._graph_of(req.targets, overlay, stats)
            m.bytes_fetched.labels(self.name).inc(self.fetcher.stats.bytes_read - before)
        pending = Pending(req, cg, Future(), t0, overlay, predicted)
        pending.future.set_running_or_notify_cancel()
        if self.buffers is None or overlay is not None:
            # a request's added edges change its stored neighbours: never merged
            self._run_separately([pending], None)
        else:
            # clients choose OIP ids and may repeat them: the pool gets its own key
            self.buffers.submit(uuid.uuid4().hex, np.sort(cg.nodes), payload=pending)
        try:
            outputs, info = pending.future.result(timeout=self.serving.gateway.request_timeout_s)
        except FutureTimeout:
            raise Unavailable(
                f"model {self.name!r}: no answer within {self.serving.gateway.request_timeout_s} s"
            ) from None
        latency = max(0.0, self.clock.now() - accepted_at)
        m.request_seconds.labels(self.name).observe(latency)
        m.stage_seconds.labels(self.name, "queued").observe(queued)
        late = latency > self.m.slo_s
        if late:
            m.slo_violations.labels(self.name).inc()
        with self._totals_lock:
            self.totals["requests"] += 1
            self.totals["slo_violations"] += int(late)
        info = {
            **info,
            "latency_ms": latency * 1e3,
            "queued_ms": queued * 1e3,
            "arrival_s": arrival,
        }
        # only the outputs the client asked for; binary ones as binary tensor data
        response = InferResponse(
            self.name, req.id, req.select_outputs(outputs), info, req.binary_outputs
        )
        return response, req.kind, latency, queued

    def _graph_of(self, targets: np.ndarray, overlay: GraphOverlay | None, stats: FetchStats):
        """The computation graph of ``targets``: the k-hop one, or with
        ``embeddings: precomputed`` the SRPE one (call under the fetch lock)."""
        if self.embeddings is not None:
            return build_srpe_graph(
                self.fetcher,
                targets,
                self.plan.config.num_layers,
                self.m.recompute_budget,
                self.m.recompute_policy,
                overlay=overlay,
            )
        return self.fetcher.fetch(
            targets,
            self.plan.config.num_layers,
            fanouts=self.fanouts,
            stats=stats,
            degrees=self.needs_degrees,
            overlay=overlay,
        )

    def _merge(self, pendings: list[Pending]):
        """``(graph, per-request rows, separate rows)`` of a closed buffer. SRPE:
        one SRPE graph of the union of the targets, so each candidate is
        recomputed once for the whole buffer."""
        if self.embeddings is None:
            merged = merge_computation_graphs([p.cg for p in pendings])
            return merged.graph, merged.request_rows, merged.separate_rows
        targets = [p.request.targets for p in pendings]
        with self._fetch_lock:
            sg = self._graph_of(np.concatenate(targets), None, FetchStats())
        bounds = np.cumsum([0] + [t.size for t in targets])
        rows = [sg.target_index[a:b] for a, b in zip(bounds[:-1], bounds[1:])]
        return sg, rows, int(sum(p.cg.aggregated_rows() for p in pendings))

    def _predicted_rows(self, targets: np.ndarray) -> float | None:
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
            self.graph, self.fetcher.reader, targets[targets < self.graph.num_nodes]
        )

    def _embeddings_reader(self):
        return None if self.embeddings is None else self.embeddings.rows

    def _on_close(self, closed: ClosedBuffer) -> None:
        self.metrics.buffers_closed.labels(self.name, closed.reason).inc()
        self.metrics.sharing_degree.labels(self.name).observe(closed.sharing_degree)
        pendings = [r.payload for r in closed.requests]
        info = {
            "buffer_id": closed.buffer_id,
            "buffer_requests": len(pendings),
            "sharing_degree": closed.sharing_degree,
        }
        if self.m.mode == "graph_sharing":
            self.executor.submit(self._run_merged, pendings, info)
        else:
            self.executor.submit(self._run_separately, pendings, info)

    def _finish(self, pending: Pending, h: np.ndarray, rows: np.ndarray, info: dict) -> None:
        try:
            outputs = self._heads(pending.request, h, rows)
            wait = info.get("closed_at", time.perf_counter()) - pending.arrival
            pending.future.set_result((outputs, {**info, "buffer_wait_ms": max(wait, 0) * 1e3}))
        except BaseException as exc:  # noqa: BLE001 - delivered to the waiting request
            pending.future.set_exception(exc)

    def _run_merged(self, pendings: list[Pending], info: dict) -> None:
        closed_at = time.perf_counter()
        try:
            self._execute_merged(pendings, info, closed_at)
        finally:  # the gate counts the execution done whatever its outcome
            wait = float(np.mean([closed_at - p.arrival for p in pendings]))
            self.buffers.finished(time.perf_counter() - closed_at, len(pendings), max(wait, 0.0))

    def _execute_merged(self, pendings: list[Pending], info: dict, closed_at: float) -> None:
        try:
            with self.metrics.stage(self.name, "merge"):
                graph, request_rows, separate_rows = self._merge(pendings)
            predicted = [p.predicted_rows for p in pendings]
            total = None if None in predicted else float(sum(predicted))
            with self.metrics.stage(self.name, "execute"):
                h, stats = self.orchestrator.run(
                    graph, embeddings=self._embeddings_reader(), predicted_rows=total
                )
        except BaseException as exc:  # noqa: BLE001
            for p in pendings:
                p.future.set_exception(exc)
            return
        self._count_rows(stats.aggregated_rows)
        info = {
            **info,
            "execution": uuid.uuid4().hex,
            "closed_at": closed_at,
            "aggregated_rows": stats.aggregated_rows,
            "separate_rows": separate_rows,
            "partitions": stats.partitions,
            "predicted_rows": total,
            "update_device": stats.device,
            **stage_ms(stats),
        }
        for p, rows in zip(pendings, request_rows):
            self._finish(p, h, rows, info)

    def _run_separately(self, pendings: list[Pending], info: dict | None) -> None:
        """Each request on its own (no_sharing, request_centric). The runs go to
        their own executor: waiting on them from this one could deadlock it."""
        closed_at = time.perf_counter()
        for p in pendings:
            self.request_executor.submit(self._run_one, p, dict(info or {}), closed_at)

    def _run_one(self, p: Pending, info: dict, closed_at: float) -> None:
        try:
            with self.metrics.stage(self.name, "execute"):
                h, stats = self.orchestrator.run(
                    p.cg,
                    overlay=p.overlay,
                    embeddings=self._embeddings_reader(),
                    predicted_rows=p.predicted_rows,
                )
        except BaseException as exc:  # noqa: BLE001 - delivered to the waiting request
            p.future.set_exception(exc)
            return
        self._count_rows(stats.aggregated_rows)
        info = {
            **info,
            "execution": uuid.uuid4().hex,
            "closed_at": closed_at,
            "aggregated_rows": stats.aggregated_rows,
            "predicted_rows": p.predicted_rows,
            "update_device": stats.device,
            **stage_ms(stats),
        }
        self._finish(p, h, p.cg.target_index, info)

    def _count_rows(self, rows: int) -> None:
        self.metrics.aggregated_rows.labels(self.name).inc(rows)
        with self._totals_lock:
            self.totals["aggregated_rows"] += rows

    def _heads(self, req: InferenceRequest, h: np.ndarray, rows: np.ndarray) -> dict:
        """Outputs for one request from the rows of its unique targets.

        ``rows[i]`` is the row of the request's i-th unique target (``req.targets``
        order). Vertex requests get scores per requested vertex; edge requests a
        score per pair; graph requests one readout per graph id.
        """
        emb = h[rows]
        order = np.searchsorted(req.targets, req.vertices)
        if req.kind == "vertex":
            scores = emb[order]
            if self.model_config.task != "vertex":  # embeddings, not class scores
                return {"embeddings": scores}
            return {"scores": scores, "predictions": scores.argmax(axis=1)}
        if req.kind == "edge":
            u = emb[np.searchsorted(req.targets, req.pairs[:, 0])]
            v = emb[np.searchsorted(req.targets, req.pairs[:, 1])]
            return {"scores": self.orchestrator.head("edge", h_u=u, h_v=v)}
        readout = self.orchestrator.head("graph", h=emb[order], segments=req.graph_ids)
        return {"readout": readout}

    # -- status ------------------------------------------------------------------
    def status(self) -> dict:
        return {
            "model": self.name,
            "graph": self.m.graph,
            "mode": self.m.mode,
            "ready": self.ready(),
            "totals": dict(self.totals),
            "admission": self.admission.as_dict(),
            "buffers": self.buffers.snapshot() if self.buffers is not None else [],
            "buffer_stats": self.buffers.stats if self.buffers is not None else {},
            "memory_pool": {**self.memory_pool.snapshot(), "stats": self.memory_pool.stats},
            "compute_pool": {**self.compute_pool.snapshot(), "stats": self.compute_pool.stats},
            "gateway_fetch": self.fetcher.stats.as_dict(),
            "caches": self._cache_stats(),
            "functions": self.function_rows(),
        }

    def function_rows(self) -> list[dict]:
        """Per function: desired, actual and ready replicas and the ready revision
        (as the platform reports them), calls in flight and queue length (the
        gateway's pool: busy instances, items queued on instances or pending)."""
        rows = []
        for pool in (self.memory_pool, self.compute_pool):
            snap = pool.snapshot()
            try:
                row = dict(self.platform.replicas(pool.name))
            except Exception as exc:  # a platform API down must not break status
                row = {"function": pool.name, "error": str(exc)}
            row["in_flight"] = sum(1 for i in snap["instances"] if i["state"] == "busy")
            row["queue_length"] = sum(snap["queues"].values()) + snap["pending"]
            rows.append(row)
        return rows

    def _cache_stats(self) -> list[dict]:
        """Each warm memory instance's own figures (cache hit rate, bytes read)."""
        out = []
        for inst in self.memory_pool.instances():
            try:
                st = self.orchestrator.clients.memory(inst.url).stats()
            except Exception as exc:  # an instance going away must not break status
                out.append({"instance": inst.id, "error": str(exc)})
                continue
            out.append(
                {"instance": inst.id, **st.get("cache", {}), "bytes_read": st.get("bytes_read")}
            )
        return out


class DataPlane:
    """Every served model, the platform they run on, and the gateway's metrics."""

    def __init__(self, serving: ServingConfig, platform=None, clock=None):
        self.serving = serving
        self.clock = clock or RealClock()
        self.metrics = GatewayMetrics()
        # the data plane scales in (keep-alive), so the platform's own reaper is off
        self.platform = platform or open_platform(
            serving.platform.kind, reaper_interval_s=None, **serving.platform.backend_kwargs()
        )
        self.models: dict[str, ModelRuntime] = {}
        for m in serving.models:
            self.models[m.name] = ModelRuntime(serving, m, self.platform, self.metrics, self.clock)
        self.metrics.add_collector(self._gauges)
        self.started_at = time.time()

    def start(self) -> None:
        for rt in self.models.values():
            rt.start()
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
        report = self.platform.metering()
        for key, help_text in (
            ("allocated_gb_s", "Allocated memory x alive time"),
            ("busy_gb_s", "Allocated memory x busy time"),
            ("vcpu_s", "vCPUs x alive time"),
            ("cold_starts", "Cold starts"),
        ):
            g = GaugeMetricFamily(f"gnn_faas_{key}", help_text, labels=["function"])
            for fn, row in report.by_function().items():
                g.add_metric([fn], float(row[key]))
            yield g
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
