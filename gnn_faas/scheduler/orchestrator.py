"""Runs a computation graph's layers on memory and compute functions, pipelined.

For each layer, the block's destination rows are cut into partitions that fit
a memory function (λGrapher Algorithm 2, :mod:`gnn_faas.scheduler.partitioner`).
Each partition travels with only the source rows it touches (its own rows
first, so destination row ``r`` is source row ``r``). A partition's Update is
submitted to the compute pool the moment its Aggregate returns, so the memory
functions aggregate partition ``p + 1`` while a compute function updates
partition ``p``: communication and computation overlap (λGrapher 3.5).
Layers are a barrier: layer ``l + 1`` reads every row layer ``l`` produced.

With ``forward`` (λGrapher's pipeline), a partition is one call from the
gateway: the memory function sends its aggregate straight to the compute
instance the gateway chose through the compute pool and answers with
Update's rows, so the aggregate never travels back through the gateway and
the gateway makes one call per partition and layer instead of two. The two
calls stay HTTP calls between the three processes.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field

import numpy as np

from gnn_faas import errors
from gnn_faas.functions.client import (
    CallTiming,
    ComputeClient,
    MemoryClient,
    aggregate_frame,
    aggregate_step,
)
from gnn_faas.functions.layer_plan import LayerStep, ModelPlan
from gnn_faas.functions.memory_limit import call_overhead_bytes
from gnn_faas.scheduler.function_pool import queue_wait_s
from gnn_faas.scheduler.partitioner import LayerPartition, partition_layer
from gnn_faas.storage.computation_graph import Block, ComputationGraph
from gnn_faas.storage.overlay import GraphOverlay
from gnn_faas.storage.srpe_graph import SrpeGraph, extend_sources


def compact_rows(block: Block, start: int, stop: int) -> tuple[Block, np.ndarray]:
    """Destination rows ``[start, stop)`` of ``block`` with only the sources they use.

    Returns the sub-block and ``src_sel``, the block-local source ids of its
    columns: the rows' own ids first (so the self/root term of destination row
    ``r`` is source ``r``), then the other sources, sorted.
    """
    lo, hi = int(block.indptr[start]), int(block.indptr[stop])
    cols = np.asarray(block.indices[lo:hi], dtype=np.int64)
    indptr = (block.indptr[start : stop + 1] - lo).astype(np.int64)
    # one mask over the block's sources instead of sorting the columns
    used = np.zeros(block.num_src, dtype=bool)
    used[cols] = True
    used[start:stop] = False
    others = np.flatnonzero(used)
    if start == 0 and others.size == block.num_src - stop:  # every source, in order
        return Block(stop, block.num_src, indptr, cols), np.arange(block.num_src, dtype=np.int64)
    src_sel = np.concatenate((np.arange(start, stop, dtype=np.int64), others))
    position = np.empty(block.num_src, dtype=np.int64)
    position[src_sel] = np.arange(src_sel.size, dtype=np.int64)
    return Block(stop - start, int(src_sel.size), indptr, position[cols]), src_sel


@dataclass
class RunStats:
    """What one execution did (docs/architecture.md, principle 6)."""

    aggregated_rows: int = 0
    partitions: list[int] = field(default_factory=list)
    bytes_to_memory: int = 0
    bytes_to_compute: int = 0
    aggregate_seconds: float = 0.0
    update_seconds: float = 0.0
    queued_seconds: float = 0.0  # its Aggregate and Update calls' waits in the pools' queues
    wall_seconds: float = 0.0
    device: str = "cpu"  # where Update ran (see Orchestrator.compute_pool_for)
    # per kind of function call (aggregate, update, features, pre): calls and
    # seconds of transport, (de)serialisation and work (CallTiming), summed
    calls: dict[str, list[float]] = field(default_factory=dict)
    # partitions finish on pool threads at once: their figures add up under a lock
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, **amounts: float) -> None:
        with self._lock:
            for name, amount in amounts.items():
                setattr(self, name, getattr(self, name) + amount)

    def add_call(self, kind: str, timing: CallTiming | None, calls: int = 1) -> None:
        """Add ``calls`` calls of ``kind`` whose figures sum to ``timing``."""
        if timing is None:
            return
        with self._lock:
            row = self.calls.setdefault(kind, [0, 0.0, 0.0, 0.0])
            row[0] += calls
            row[1] += timing.transport
            row[2] += timing.serde
            row[3] += timing.work

    def calls_ms(self) -> dict[str, dict[str, float]]:
        """Per kind of call: ``calls``, ``transport_ms``, ``serde_ms``, ``work_ms``."""
        return {
            kind: {
                "calls": int(n),
                "transport_ms": t * 1e3,
                "serde_ms": s * 1e3,
                "work_ms": w * 1e3,
            }
            for kind, (n, t, s, w) in self.calls.items()
        }

    def as_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if not k.startswith("_")}


class _MemoryFailed(Exception):
    """A memory instance's own failure inside a compute-pool call: not the
    compute instance's (the compute pool must not drop it); re-raised as
    ``cause`` to the memory pool."""

    def __init__(self, cause: BaseException):
        super().__init__(str(cause))
        self.cause = cause


def call_timing(client) -> CallTiming | None:
    """The client's last call's timing (None for a client that keeps none)."""
    last = getattr(client, "last_timing", None)
    return last() if last is not None else None


class ClientCache:
    """One HTTP client (keep-alive session) per function instance URL, its
    connection pool sized to ``pool_size`` (the threads that may call one URL
    at once: a platform's URL may front several replicas)."""

    def __init__(self, pool_size: int = 10):
        self.pool_size = int(pool_size)
        self._memory: dict[str, MemoryClient] = {}
        self._compute: dict[str, ComputeClient] = {}
        self._lock = threading.Lock()

    def memory(self, url: str) -> MemoryClient:
        with self._lock:
            if url not in self._memory:
                self._memory[url] = MemoryClient(url, pool_size=self.pool_size)
            return self._memory[url]

    def compute(self, url: str) -> ComputeClient:
        with self._lock:
            if url not in self._compute:
                self._compute[url] = ComputeClient(url, pool_size=self.pool_size)
            return self._compute[url]


def _chain(first: Future, then) -> Future:
    """A future for ``then(first.result())``, where ``then`` returns a future."""
    out: Future = Future()

    def step(f: Future):
        try:
            nxt = then(f.result())
        except BaseException as exc:  # noqa: BLE001 - delivered to the waiter
            out.set_exception(exc)
            return

        def done(g: Future):
            try:
                out.set_result(g.result())
            except BaseException as exc:  # noqa: BLE001
                out.set_exception(exc)

        nxt.add_done_callback(done)

    first.add_done_callback(step)
    return out


class Orchestrator:
    """Executes :class:`ModelPlan` layers over function pools.

    ``memory_pool``/``compute_pool`` are :class:`FunctionPool` s: ``submit(fn)``
    runs ``fn(instance)`` on an instance the load-aware policy picks.
    ``budget_bytes`` is one memory function's memory for a partition (its
    instance memory minus its runtime), ``runtime_bytes`` the runtime's share.
    """

    def __init__(
        self,
        plan: ModelPlan,
        memory_pool,
        compute_pool,
        *,
        budget_bytes: int,
        runtime_bytes: int = 0,
        clients: ClientCache | None = None,
        gpu_compute_pool=None,
        placement=None,
        forward: bool = False,
    ):
        self.plan = plan
        self.memory_pool = memory_pool
        self.compute_pool = compute_pool
        # optional: compute functions on a GPU, chosen per run by an UpdatePlacement
        self.gpu_compute_pool = gpu_compute_pool
        self.placement = placement
        self.budget_bytes = int(budget_bytes)
        self.runtime_bytes = int(runtime_bytes)
        self.clients = clients or ClientCache()
        # memory functions send their aggregate straight to the compute function
        # (module docstring); off where they cannot reach its instance URLs
        self.forward = bool(forward)

    def partition(
        self, block: Block, row_in: int, row_out: int, whole_only: bool = False
    ) -> LayerPartition | None:
        """A layer's parts for this orchestrator's memory functions: the formula,
        plus what a memory function's call holds beyond it (its feature
        stream and the answer's frame), so each call stays inside the limit.
        ``whole_only``: the layer as one part if it fits whole, else ``None``
        without the window scan."""
        return partition_layer(
            block, row_in, row_out, self.budget_bytes, self.runtime_bytes,
            overhead_bytes=call_overhead_bytes(self.budget_bytes), answer_copies=2,
            whole_only=whole_only,
        )  # fmt: skip

    # -- single calls ------------------------------------------------------------
    # ``inline``: the call runs on this thread when an instance is idle (the
    # thread would only wait for it), else it queues on the pool as any call
    def _memory(self, fn, inline: bool = False) -> Future:
        return self.memory_pool.submit(
            lambda inst: fn(self.clients.memory(inst.url)), inline=inline
        )

    def _compute(self, fn, pool=None, inline: bool = False) -> Future:
        pool = pool or self.compute_pool
        return pool.submit(lambda inst: fn(self.clients.compute(inst.url)), inline=inline)

    def compute_pool_for(self, predicted_rows: float) -> tuple[object, str]:
        """``(pool, device)`` of a run's Update: the GPU pool when there is one and
        the placement says the run (``predicted_rows``) is big enough."""
        if self.gpu_compute_pool is None or self.placement is None:
            return self.compute_pool, "cpu"
        device = self.placement.choose(predicted_rows)
        return (self.gpu_compute_pool if device == "cuda" else self.compute_pool), device

    def features(self, ids: np.ndarray, overlay: GraphOverlay | None = None) -> np.ndarray:
        """Input rows of ``ids``: stored ones from a memory function, a new-vertex
        request's own ones from its ``overlay``."""
        if overlay is None or not overlay.is_new(ids).any():
            return self._memory(lambda c: c.features(ids), inline=True).result()
        new = overlay.is_new(ids)
        out = np.empty((ids.size, overlay.features.shape[1]), np.float32)
        if (~new).any():
            out[~new] = self._memory(lambda c: c.features(ids[~new]), inline=True).result()
        out[new] = overlay.rows(ids[new])
        return out

    def head(self, kind: str, **tensors: np.ndarray) -> np.ndarray:
        """Edge- or graph-level head on a compute function."""
        return self._compute(lambda c: c.head(kind, **tensors), inline=True).result()

    # -- a layer ---------------------------------------------------------------
    def _part(
        self,
        step: LayerStep,
        block: Block,
        start: int,
        stop: int,
        cg: ComputationGraph,
        h: np.ndarray | None,
        extras: dict[str, np.ndarray],
        stats: RunStats,
        overlay: GraphOverlay | None = None,
        pool=None,
        inline: bool = False,
        pre_next: bool = False,
        state_set: tuple[str, str] | None = None,
    ) -> Future:
        """Aggregate then Update of destination rows ``[start, stop)``: a future of
        Update's ``{"h"}`` or, with ``pre_next``, of the next layer's pre of those
        rows (one compute call). ``inline``: both calls on this thread when their
        pools have an idle instance. ``state_set``: layer 1 of an SRPE graph built
        from stored states; the recomputed rows' terms travel along."""
        caller = threading.get_ident()
        sub, src_sel = compact_rows(block, start, stop)
        tensors: dict[str, np.ndarray] = {}
        if state_set is not None:
            tensors = cg.state_terms(start, stop)
            if tensors["state_ids"].size == 0:  # only queries here: a plain aggregate
                tensors, state_set = {}, None
        h_part = None if h is None else np.ascontiguousarray(h[src_sel])
        if step.needs_degrees:
            deg = cg.in_degree
            tensors["deg_src"] = deg[src_sel]
            tensors["deg_dst"] = deg[start:stop]
        if step.needs_alpha:
            tensors["alpha_src"] = extras["alpha_src"][src_sel]
            tensors["alpha_dst"] = extras["alpha_dst"][start:stop]
        src_ids = cg.nodes[src_sel]
        if h_part is None and overlay is not None:
            new = overlay.is_new(src_ids)
            if new.any():  # the memory side reads stored rows, these travel along
                tensors["new_x"] = overlay.rows(src_ids[new])
        stats.add(
            bytes_to_memory=sum(t.nbytes for t in tensors.values())
            + sub.indices.nbytes
            + (0 if h_part is None else h_part.nbytes)
        )
        if self.forward:
            return self._forwarded(
                step, sub, src_ids, h_part, tensors, stats, pool, inline, pre_next, state_set
            )

        def aggregate(client: MemoryClient):
            t0 = time.perf_counter()
            out = aggregate_step(client, step, sub, src_ids, h_part, tensors, state_set=state_set)
            stats.add(aggregate_seconds=time.perf_counter() - t0, queued_seconds=queue_wait_s())
            stats.add_call("aggregate", call_timing(client))
            return out

        def update(out: dict[str, np.ndarray]) -> Future:
            agg, root = out["agg"], out.get("root")
            stats.add(bytes_to_compute=agg.nbytes + (0 if root is None else root.nbytes))

            def post(client: ComputeClient):
                t0 = time.perf_counter()
                if pre_next:
                    res = client.post_pre(step.layer, agg, root)
                else:
                    res = {"h": client.post(step.layer, agg, root)}
                stats.add(update_seconds=time.perf_counter() - t0, queued_seconds=queue_wait_s())
                stats.add_call("update", call_timing(client))
                return res

            # inline only on the caller's thread: a memory pool thread must not
            # wait on a compute call
            here = inline and threading.get_ident() == caller
            return self._compute(post, pool, inline=here)

        return _chain(self._memory(aggregate, inline=inline), update)

    def _chain_layers(
        self, cg: ComputationGraph, overlay: GraphOverlay | None
    ) -> list[tuple[dict, dict]] | None:
        """Every layer's aggregate call for one chained call (λGrapher's pipeline
        run through: ``MemoryClient.chain``), or ``None`` where the execution
        cannot run that way: forwarding off, a layer cut into parts, a first
        layer with a pre or a layer with attention terms (GAT), new vertices,
        or a layer whose sources are not exactly the rows the layer before
        produced."""
        steps = self.plan.steps
        if not self.forward or overlay is not None or steps[0].pre:
            return None
        if any(s.needs_alpha for s in steps):
            return None
        layers = []
        for i, step in enumerate(steps):
            block = cg.block(step.layer)
            # the whole-layer check only: a layer that needs the scan runs in parts
            if self.partition(block, step.src_dim * 4, step.agg_dim * 4, whole_only=True) is None:
                return None
            sub, src_sel = compact_rows(block, 0, block.num_dst)
            if i and src_sel.size != block.num_src:  # h rows must be the sources, in order
                return None
            tensors = {}
            if step.needs_degrees:
                tensors = {"deg_src": cg.in_degree[src_sel], "deg_dst": cg.in_degree[: sub.num_dst]}
            pre_next = i + 1 < len(steps) and steps[i + 1].pre
            layers.append(
                aggregate_frame(
                    step.op,
                    sub,
                    cg.nodes[src_sel],
                    None,
                    tensors,
                    eps=step.eps,
                    negative_slope=step.negative_slope,
                    return_root=step.return_root,
                    forward=("", step.layer),
                    forward_pre_next=pre_next,
                )  # fmt: skip
            )
        return layers

    def _chained(self, layers: list[tuple[dict, dict]], stats: RunStats, pool=None) -> Future:
        """The chained call on a memory and a compute instance (see :meth:`_paired`)."""
        to_compute = 0
        for step, (tensors, _) in zip(self.plan.steps, layers, strict=True):
            num_dst = int(tensors["indptr"].size - 1)
            stats.add(bytes_to_memory=sum(t.nbytes for t in tensors.values()))
            stats.aggregated_rows += num_dst
            stats.partitions.append(1)
            to_compute += num_dst * (step.agg_dim + (step.src_dim if step.return_root else 0)) * 4

        def call(client: MemoryClient, compute_url: str) -> dict[str, np.ndarray]:
            return client.chain(layers, compute_url)

        return self._paired(call, stats, to_compute, pool, inline=True, calls=len(layers))

    def _forwarded(
        self,
        step: LayerStep,
        sub: Block,
        src_ids: np.ndarray,
        h_part: np.ndarray | None,
        tensors: dict[str, np.ndarray],
        stats: RunStats,
        pool=None,
        inline: bool = False,
        pre_next: bool = False,
        state_set: tuple[str, str] | None = None,
    ) -> Future:
        """One partition's Aggregate and Update (``pre_next``: and the next
        layer's pre) as one call: the memory pool picks
        a memory instance, the compute pool a compute instance (both load-aware),
        and the memory function forwards its aggregate to that compute instance.
        Both instances are held for the call. A compute instance that cannot be
        reached is dropped and the call retried on another one (the memory
        instance stays); a memory instance that fails is dropped and retried by
        the memory pool."""
        # what Update receives: agg rows, and the root rows of a layer that takes them
        to_compute = sub.num_dst * (step.agg_dim + (step.src_dim if step.return_root else 0)) * 4

        def call(client: MemoryClient, compute_url: str) -> dict[str, np.ndarray]:
            return aggregate_step(
                client, step, sub, src_ids, h_part, tensors, forward=(compute_url, step.layer),
                forward_pre_next=pre_next, state_set=state_set,
            )  # fmt: skip

        return self._paired(call, stats, to_compute, pool, inline)

    def _paired(
        self, call, stats: RunStats, to_compute: int, pool=None, inline=False, calls: int = 1
    ) -> Future:
        """``call(memory client, compute URL)`` with a memory instance the memory
        pool picks and a compute instance the compute pool picks (both
        load-aware), both held for the call, the memory function forwarding
        to the compute one. A compute instance that cannot be reached is
        dropped and the call retried on another one (the memory instance
        stays); a memory instance that fails is dropped and retried by the
        memory pool."""
        compute_pool = pool or self.compute_pool

        def on_memory(memory_instance):
            client = self.clients.memory(memory_instance.url)
            memory_wait = queue_wait_s()  # this call's wait for a memory instance

            def on_compute(compute_instance):
                t0 = time.perf_counter()
                try:
                    out = call(client, compute_instance.url)
                except errors.ForwardFailed as exc:  # the compute instance's failure
                    raise errors.Unavailable(str(exc)) from None
                except errors.Unavailable as exc:  # the memory instance's own
                    raise _MemoryFailed(exc) from None
                own, fwd = call_timing(client), client.forwarded_timing()
                total = time.perf_counter() - t0
                update_s = 0.0 if fwd is None else fwd.total
                stats.add(
                    aggregate_seconds=total - update_s,
                    update_seconds=update_s,
                    bytes_to_compute=to_compute,
                    queued_seconds=queue_wait_s() + memory_wait,
                )
                # a chained call carries one Aggregate and one Update per layer
                stats.add_call("aggregate", own, calls)
                stats.add_call("update", fwd, calls)
                return out

            try:
                return compute_pool.submit(on_compute, inline=True).result()
            except _MemoryFailed as exc:
                raise exc.cause from None
            except errors.Unavailable as exc:  # not the memory instance's fault
                raise errors.ForwardFailed(f"no compute function answered: {exc}") from None

        return self.memory_pool.submit(on_memory, inline=inline)

    def run(
        self,
        cg: ComputationGraph,
        overlay: GraphOverlay | None = None,
        embeddings=None,
        predicted_rows: float | None = None,
        state_set: tuple[str, str] | None = None,
    ) -> tuple[np.ndarray, RunStats]:
        """Outputs of the last layer for ``cg``'s unique targets, and figures.

        ``overlay``: a new-vertex request's added vertices and edges (``cg``
        was fetched with it). ``cg`` may be an
        :class:`~gnn_faas.storage.srpe_graph.SrpeGraph`, whose boundary rows
        ``embeddings(l, ids)`` reads from the store at every layer ``l >= 2``;
        one built ``from_state`` has its recomputed candidates' layer 1
        recomputed by the memory functions from the stored states of the
        embedding set ``state_set = (model, checkpoint)``.
        ``predicted_rows`` (e.g. ``Σ PSGS`` of the targets; default: the
        graph's aggregated rows) places Update on the CPU or GPU pool.
        """
        stats = RunStats()
        rows = cg.aggregated_rows() if predicted_rows is None else predicted_rows
        pool, stats.device = self.compute_pool_for(rows)
        t_start = time.perf_counter()
        h: np.ndarray | None = None
        # a layer's pre is row-wise: the Update calls of the layer before run it
        # on their own rows (one compute call instead of two per partition),
        # except over SRPE's stored boundary rows, which join the sources later
        fuse = not isinstance(cg, SrpeGraph)
        steps = self.plan.steps
        layers = self._chain_layers(cg, overlay) if fuse else None
        if layers is not None:  # every layer one part: the whole model in one call
            h = self._chained(layers, stats, pool).result()["h"]
            stats.wall_seconds = time.perf_counter() - t_start
            return h, stats
        fused: dict[str, np.ndarray] | None = None  # the pre the last layer ran
        for i, step in enumerate(steps):
            block = cg.block(step.layer)
            states = _state_set_of(cg, step, state_set)
            if states is not None:
                block = cg.state_block()
            h = extend_sources(cg, step.layer, h, embeddings)
            extras: dict[str, np.ndarray] = {}
            if step.pre and fused is not None:
                h = fused["h"]
                extras = {k: v for k, v in fused.items() if k != "h"}
            elif step.pre:
                x = h if h is not None else self.features(cg.nodes[: block.num_src], overlay)

                def run_pre(c: ComputeClient, x=x, s=step) -> dict[str, np.ndarray]:
                    out = c.pre(s.layer, x)
                    stats.add_call("pre", call_timing(c))
                    return out

                pre = self._compute(run_pre, pool, inline=True).result()
                h = pre["h"]
                extras = {k: v for k, v in pre.items() if k != "h"}
            pre_next = fuse and i + 1 < len(steps) and steps[i + 1].pre
            row_in = step.src_dim * 4
            row_out = step.agg_dim * 4
            parts = self.partition(block, row_in, row_out)
            stats.partitions.append(len(parts))
            # the last partition runs on this thread (the others are out on the
            # pools by then): a lone request's calls need no pool hand-off
            last = len(parts) - 1
            futures = [
                self._part(
                    step,
                    block,
                    a,
                    b,
                    cg,
                    h,
                    extras,
                    stats,
                    overlay,
                    pool,
                    p == last,
                    pre_next,
                    states,
                )  # fmt: skip
                for p, (a, b) in enumerate(parts)
            ]
            outs = [f.result() for f in futures]
            fused = None
            if outs:
                h = np.concatenate([o["h"] for o in outs])
                if pre_next:
                    fused = {k: np.concatenate([o[k] for o in outs]) for k in outs[0]}
            stats.aggregated_rows += block.num_dst
        stats.wall_seconds = time.perf_counter() - t_start
        return h, stats


def _state_set_of(
    cg: ComputationGraph, step: LayerStep, state_set: tuple[str, str] | None
) -> tuple[str, str] | None:
    """``state_set`` where layer ``step`` of ``cg`` recomputes from stored
    states (layer 1 of an SRPE graph built ``from_state``), else None."""
    if step.layer != 1 or getattr(cg, "delta", None) is None:
        return None
    from gnn_faas.functions.srpe_recompute import supports_states

    if state_set is None:
        raise errors.InvalidRequest(
            "an SRPE graph built from stored states needs their embedding set (model, checkpoint)"
        )
    if not supports_states(step):
        raise errors.InvalidRequest(f"layer 1 ({step.op}) cannot be recomputed from stored states")
    return state_set
