"""Executing closed buffers and single requests, and answering their requests.

A closed buffer runs merged (``graph_sharing``: one execution of the union of
its computation graphs, each request reading its own rows) or each of its
requests on its own (``no_sharing``; ``request_centric`` has no buffers). A buffer
the work-conserving gate dispatched alone as its request arrived (reason
``"idle"``) runs on that request's thread, without a hand-off to the execution
pool. Every answer carries the same figures (:func:`execution_info`), and under the
work-conserving gate (:mod:`gnn_faas.gateway.work_conserving`) each merged
execution's end is reported to the buffers, which may release the backlog.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from gnn_faas import graph_version, request_id
from gnn_faas.functions.client import call_deadline
from gnn_faas.gateway.buffer_pool import ClosedBuffer
from gnn_faas.gateway.inference_request import InferenceRequest
from gnn_faas.gateway.metrics import GatewayMetrics
from gnn_faas.scheduler.orchestrator import Orchestrator, RunStats
from gnn_faas.storage.computation_graph import ComputationGraph
from gnn_faas.storage.graph_state import GraphState
from gnn_faas.storage.overlay import GraphOverlay
from gnn_faas.storage.srpe_graph import SrpeGraph


@dataclass
class InferenceJob:
    """What the data plane runs for one request: its parsed request, computation
    graph and the future its answer goes to (the buffer holds it as the
    ``payload`` of a :class:`~gnn_faas.gateway.buffer.InferenceJobRequest`).
    ``arrival``: ``time.perf_counter()`` when the request came in; ``stages``:
    milliseconds of the steps before its buffer (parse, k-hop fetch); ``trace``:
    the request's trace context (its request id), carried to the functions."""

    request: InferenceRequest
    cg: ComputationGraph
    future: Future
    arrival: float
    overlay: GraphOverlay | None = None  # a new-vertex request's added vertices and edges
    predicted_rows: float | None = None  # Σ PSGS of the targets, known before the fetch
    stages: dict | None = None
    trace: request_id.TraceContext | None = field(default_factory=request_id.current)
    state: GraphState | None = None  # the graph version it runs on, start to end

    @property
    def version(self) -> int:
        return 0 if self.state is None else self.state.version


def stage_ms(stats: RunStats) -> dict[str, float]:
    """Milliseconds an execution held memory instances (Aggregate calls) and
    compute instances (Update calls), summed over its calls: what each
    function's pool was busy with (``gnn-faas simulate calibrate`` splits the
    execution time between the two pools by them)."""
    return {"aggregate_ms": stats.aggregate_seconds * 1e3, "update_ms": stats.update_seconds * 1e3}


def srpe_info(graph) -> dict:
    """What an answer of precomputed serving says of its execution: the
    candidates it recomputed and from what (their stored states, or their
    whole in-neighbourhoods)."""
    if not isinstance(graph, SrpeGraph):
        return {}
    return {
        "recomputed": int(graph.recomputed.size),
        "recompute_from": "neighbourhood" if graph.delta is None else "state",
        "stale_recomputed": int(graph.stale_recomputed),
    }


def execution_info(stats: RunStats, closed_at: float, predicted_rows: float | None) -> dict:
    """The figures every answer of an execution carries."""
    return {
        "execution": uuid.uuid4().hex,
        "closed_at": closed_at,
        "aggregated_rows": stats.aggregated_rows,
        "partitions": stats.partitions,
        "predicted_rows": predicted_rows,
        "update_device": stats.device,
        "calls_ms": stats.calls_ms(),
        **stage_ms(stats),
    }


class Executions:
    """Runs what the buffers close (or a request sent straight on) and sets each
    request's future to ``(outputs, info)``.

    ``merge(pendings)`` gives ``(graph, per-request rows, separate rows)`` of a
    merged batch; ``embeddings()`` the SRPE reader (None: exact) and
    ``state_set()`` the stored states' ``(model, checkpoint)`` (None: none
    read); ``finished``
    (the buffers' :meth:`~gnn_faas.gateway.buffer_pool.MultiBufferPool.finished`)
    hears of every merged execution's end; ``count_rows`` totals rows."""

    def __init__(
        self,
        name: str,
        merged: bool,
        task: str,
        orchestrator: Orchestrator,
        metrics: GatewayMetrics,
        merge: Callable,
        embeddings: Callable,
        count_rows: Callable[[int], None],
        threads: int,
        request_timeout_s: float = 30.0,
        state_set: Callable[[], tuple[str, str] | None] = lambda: None,
        move: Callable[[InferenceJob, GraphState], bool] | None = None,
    ):
        self.name = name
        self.merged = merged
        self.task = task
        self.orchestrator = orchestrator
        self.metrics = metrics
        self.merge = merge
        self.embeddings = embeddings
        self.state_set = state_set
        self.move = move
        self.count_rows = count_rows
        self.request_timeout_s = float(request_timeout_s)
        self.finished: Callable[[float, int, float, float], None] | None = None
        # closed buffers run here; single requests on request_executor, sized for
        # the gateway's concurrent requests (waiting on them from the first could deadlock)
        self.executor = ThreadPoolExecutor(max_workers=8, thread_name_prefix=f"{name}-exec")
        self.request_executor = ThreadPoolExecutor(
            max_workers=threads, thread_name_prefix=f"{name}-req"
        )

    def shutdown(self) -> None:
        self.executor.shutdown(wait=True, cancel_futures=False)
        self.request_executor.shutdown(wait=True, cancel_futures=False)

    def on_close(self, closed: ClosedBuffer) -> None:
        self.metrics.buffers_closed.labels(self.name, closed.reason).inc()
        self.metrics.sharing_degree.labels(self.name).observe(closed.sharing_degree)
        pendings = [r.payload for r in closed.requests]
        info = {
            "buffer_id": closed.buffer_id,
            "buffer_requests": len(pendings),
            "sharing_degree": closed.sharing_degree,
            "buffer_close_reason": closed.reason,
        }
        if self.merged:  # one execution of several requests: its own trace, linked to theirs
            trace = request_id.for_execution(p.trace for p in pendings)
            run = request_id.traced(trace, self.run_merged)
            if closed.reason == "idle":
                # dispatched alone as it arrived: closed on the request's own
                # thread, which would only wait for the answer, so it runs here,
                # its calls bounded by the time the request waits for its answer
                with call_deadline(self.request_timeout_s):
                    run(pendings, info)
            else:
                self.executor.submit(run, pendings, info)
        else:
            self.run_separately(pendings, info)

    def run_merged(self, pendings: list[InferenceJob], info: dict) -> None:
        closed_at = time.perf_counter()
        queued = 0.0
        try:
            queued = self._execute_merged(pendings, info, closed_at)
        finally:  # the gate counts the execution done whatever its outcome
            if self.finished is not None:
                wait = float(np.mean([closed_at - p.arrival for p in pendings]))
                duration = time.perf_counter() - closed_at
                self.finished(duration, len(pendings), max(wait, 0.0), queued)

    def _execute_merged(self, pendings: list[InferenceJob], info: dict, closed_at: float) -> float:
        """Run and answer the batch, one execution per graph version among its
        requests once each was moved onto the newest where it can be
        (:meth:`_by_version`); returns the calls' queue waits in the function
        pools (seconds; 0 for what failed)."""
        queued = 0.0
        for _, group in sorted(self._by_version(pendings).items()):
            with _version_scope(group[0].state):
                queued += self._execute_version(group, info, closed_at)
        return queued

    def _by_version(self, pendings: list[InferenceJob]) -> dict[int, list[InferenceJob]]:
        """The batch by graph version. A buffer that closed across version changes
        (a graph updated while its requests arrived) would run one execution per
        version, one after the other, and share nothing between them: each
        request on an older version is moved onto the newest among them instead
        (``move``: its k-hop fetched again there), so it still runs on one
        version, never older than the one it arrived on; one whose target that
        version removed keeps its own."""
        newest = max((p.state for p in pendings if p.state is not None),
                     key=lambda s: s.version, default=None)  # fmt: skip
        if newest is not None and self.move is not None:
            older = [p for p in pendings if p.state is not None and p.version < newest.version]
            moved = sum(self.move(p, newest) for p in older)
            if moved:
                self.metrics.version_moves.labels(self.name).inc(moved)
        groups: dict[int, list[InferenceJob]] = {}
        for p in pendings:
            groups.setdefault(p.version, []).append(p)
        return groups

    def _execute_version(self, pendings: list[InferenceJob], info: dict, closed_at: float) -> float:
        try:
            with self.metrics.stage(self.name, "merge"):
                graph, request_rows, separate_rows = self.merge(pendings)
            predicted = [p.predicted_rows for p in pendings]
            total = None if None in predicted else float(sum(predicted))
            with self.metrics.stage(self.name, "execute"):
                h, stats = self.orchestrator.run(
                    graph,
                    embeddings=self.embeddings(),
                    predicted_rows=total,
                    state_set=self.state_set(),
                )
        except BaseException as exc:  # noqa: BLE001 - delivered to the waiting requests
            for p in pendings:
                p.future.set_exception(exc)
            return 0.0
        self.count_rows(stats.aggregated_rows)
        info = {
            **info,
            **execution_info(stats, closed_at, total),
            **srpe_info(graph),
            "separate_rows": separate_rows,
        }
        for p, rows in zip(pendings, request_rows):
            self._answer(p, h, rows, info)
        return stats.queued_seconds

    def run_separately(self, pendings: list[InferenceJob], info: dict | None) -> None:
        """Each request on its own (no_sharing, request_centric)."""
        closed_at = time.perf_counter()
        for p in pendings:
            run = request_id.traced(p.trace, self._run_one)
            self.request_executor.submit(run, p, dict(info or {}), closed_at)

    def _run_one(self, p: InferenceJob, info: dict, closed_at: float) -> None:
        try:
            with self.metrics.stage(self.name, "execute"), _version_scope(p.state):
                h, stats = self.orchestrator.run(
                    p.cg,
                    overlay=p.overlay,
                    embeddings=self.embeddings(),
                    predicted_rows=p.predicted_rows,
                    state_set=self.state_set(),
                )
        except BaseException as exc:  # noqa: BLE001 - delivered to the waiting request
            p.future.set_exception(exc)
            return
        self.count_rows(stats.aggregated_rows)
        info = {**info, **execution_info(stats, closed_at, p.predicted_rows), **srpe_info(p.cg)}
        self._answer(p, h, p.cg.target_index, info)

    def _answer(self, pending: InferenceJob, h: np.ndarray, rows: np.ndarray, info: dict) -> None:
        try:
            outputs = self.heads(pending.request, h, rows)
            wait = max(info["closed_at"] - pending.arrival, 0.0) * 1e3
            done = {**info, "buffer_wait_ms": wait}
            if pending.state is not None:  # the version the answer was computed on
                done["graph_version"] = pending.state.version
            pending.future.set_result((outputs, done))
        except BaseException as exc:  # noqa: BLE001 - delivered to the waiting request
            pending.future.set_exception(exc)

    def heads(self, req: InferenceRequest, h: np.ndarray, rows: np.ndarray) -> dict:
        """Outputs for one request from the rows of its unique targets.

        ``rows[i]`` is the row of the request's i-th unique target (``req.targets``
        order). Vertex requests get scores per requested vertex; edge requests a
        score per pair; graph requests one readout per graph id.
        """
        emb = h[rows]
        order = np.searchsorted(req.targets, req.vertices)
        if req.kind == "vertex":
            scores = emb[order]
            if self.task != "vertex":  # embeddings, not class scores
                return {"embeddings": scores}
            return {"scores": scores, "predictions": scores.argmax(axis=1)}
        if req.kind == "edge":
            u = emb[np.searchsorted(req.targets, req.pairs[:, 0])]
            v = emb[np.searchsorted(req.targets, req.pairs[:, 1])]
            return {"scores": self.orchestrator.head("edge", h_u=u, h_v=v)}
        readout = self.orchestrator.head("graph", h=emb[order], segments=req.graph_ids)
        return {"readout": readout}


def _version_scope(state: GraphState | None):
    """Calls run on ``state``'s version and rows version (unversioned: ``None``)."""
    if state is None:
        return graph_version.scope(None)
    return graph_version.scope(state.version, state.rows_version)
