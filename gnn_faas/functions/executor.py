"""A transport-neutral driver of a model's layers over a computation graph.

:func:`run_layers` walks the steps of a :class:`ModelPlan` over the blocks of a
:class:`ComputationGraph`; a :class:`Transport` decides where each stage runs:
:class:`LocalTransport` in this process, the HTTP transports in memory and
compute functions. Per layer ``l`` (block ``l`` maps ``D_{l-1}`` to ``D_l``):

1. ``pre`` (compute side) when the step has one, on ``h^{l-1}``; for layer 1
   ``h^0`` are the input rows, which the memory side reads and ships
   (``Transport.features``);
2. ``aggregate`` (memory side) of the source rows, with the step's extras:
   ``deg_src`` (gcn: in-degrees of ``D_{l-1}`` from ``cg.in_degree``) or
   ``alpha_src``/``alpha_dst`` (gat, from pre). Layer 1 without pre passes
   ``h_src=None``: the memory side reads the input rows of ``src_ids`` itself;
3. ``post`` (compute side) on the aggregated (and root) rows.

No torch is imported here; :class:`LocalTransport` takes a ready UpdateModel.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import numpy as np

from gnn_faas.errors import InvalidRequest
from gnn_faas.functions.aggregate import aggregate, slice_rows
from gnn_faas.functions.layer_plan import LayerStep, ModelPlan
from gnn_faas.storage.computation_graph import Block, ComputationGraph
from gnn_faas.storage.srpe_graph import SrpeGraph, extend_sources

if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Callable

    from gnn_faas.functions.update import UpdateModel
    from gnn_faas.storage.fetcher import FetchStats, KHopFetcher
    from gnn_faas.storage.overlay import GraphOverlay


class Transport(Protocol):
    """Where the stages of a layer run."""

    def aggregate(
        self,
        step: LayerStep,
        block: Block,
        h_src: np.ndarray | None,
        src_ids: np.ndarray,
        extras: dict[str, np.ndarray],
    ) -> dict[str, np.ndarray]:
        """``{"agg": [num_dst, ...], "root": [num_dst, d_in] if step.return_root}``.
        ``h_src is None``: read the input rows of ``src_ids`` (global ids)."""
        ...

    def features(self, ids: np.ndarray) -> np.ndarray:
        """Input rows (float32) of global ``ids`` (memory side)."""
        ...

    def pre(self, step: LayerStep, h: np.ndarray) -> dict[str, np.ndarray]: ...

    def post(self, step: LayerStep, agg: np.ndarray, root: np.ndarray | None) -> np.ndarray: ...


def step_extras(
    step: LayerStep, cg: ComputationGraph, block: Block, pre_out: dict[str, np.ndarray] | None
) -> dict[str, np.ndarray]:
    """The extra arrays ``aggregate`` needs for ``step`` on ``block``."""
    extras: dict[str, np.ndarray] = {}
    if step.needs_degrees:
        if cg.in_degree is None:
            raise InvalidRequest(
                f"layer {step.layer} ({step.op}) needs vertex degrees: fetch the "
                "computation graph with degrees=True"
            )
        extras["deg_src"] = np.asarray(cg.in_degree[: block.num_src])
    if step.needs_alpha:
        if pre_out is None or "alpha_src" not in pre_out or "alpha_dst" not in pre_out:
            raise InvalidRequest(f"layer {step.layer} (gat) needs alpha_src/alpha_dst from pre")
        extras["alpha_src"] = pre_out["alpha_src"]
        extras["alpha_dst"] = pre_out["alpha_dst"][: block.num_dst]  # dst rows are the prefix
    return extras


def run_layers(
    plan: ModelPlan,
    cg: ComputationGraph,
    transport: Transport,
    embeddings: Callable[[int, np.ndarray], np.ndarray] | None = None,
    on_layer: Callable[[int, np.ndarray], None] | None = None,
    states: Callable[[int, np.ndarray], np.ndarray] | None = None,
) -> np.ndarray:
    """Outputs (embeddings or class scores) of the unique targets, in
    ``cg.targets`` order (rows ``[:layer_sizes[-1]]``); index with
    ``cg.target_index`` for the requested order.

    ``cg`` may be an :class:`~gnn_faas.storage.srpe_graph.SrpeGraph`; then
    ``embeddings(l, ids)`` reads the stored ``p^(l)`` rows of its boundary.
    ``on_layer(l, h)`` sees every layer's output rows (precompute uses it).
    An SRPE graph built ``from_state`` computes its recomputed rows' layer 1
    from ``states(1, ids)``, their stored aggregate states
    (:mod:`gnn_faas.functions.srpe_recompute`), in this process."""
    if cg.num_layers != len(plan.steps):
        raise InvalidRequest(
            f"the computation graph has {cg.num_layers} hops, the model {len(plan.steps)} layers"
        )
    h: np.ndarray | None = None
    for step, block in zip(plan.steps, cg.blocks()):
        src_ids = cg.nodes[: block.num_src]
        h = extend_sources(cg, step.layer, h, embeddings)
        if step.layer == 1 and getattr(cg, "delta", None) is not None:
            h = first_layer_from_states(step, cg, block, transport, states)
            if on_layer is not None:
                on_layer(step.layer, h)
            continue
        pre_out = None
        h_src = h
        if step.pre:
            x = h if h is not None else transport.features(src_ids)
            pre_out = transport.pre(step, x)
            h_src = pre_out["h"]
        extras = step_extras(step, cg, block, pre_out)
        res = transport.aggregate(step, block, h_src, src_ids, extras)
        h = transport.post(step, res["agg"], res.get("root"))
        if on_layer is not None:
            on_layer(step.layer, h)
    assert h is not None
    return h


def first_layer_from_states(
    step: LayerStep,
    cg: SrpeGraph,
    block: Block,
    transport: Transport,
    states: Callable[[int, np.ndarray], np.ndarray] | None,
) -> np.ndarray:
    """Layer 1 of an SRPE graph built ``from_state``: the queries' rows
    aggregated over their lists, the recomputed candidates' from their stored
    states and the request's changed terms; one read of the input rows."""
    from gnn_faas.functions.srpe_recompute import recompute_from_states, supports_states

    if states is None:
        raise InvalidRequest("recomputing from stored states needs the stored states")
    if not supports_states(step):
        raise InvalidRequest(f"layer 1 ({step.op}) cannot be recomputed from stored states")
    src_ids = cg.nodes[: block.num_src]
    x = transport.features(src_ids)
    q_block = slice_rows(block, 0, cg.num_queries)
    res = transport.aggregate(step, q_block, x, src_ids, step_extras(step, cg, q_block, None))
    assert cg.delta is not None
    agg_r = recompute_from_states(
        step.op, states(1, cg.recomputed), cg.delta, x, cg.in_degree, cg.num_queries, step.eps
    )
    agg = np.concatenate((res["agg"], agg_r))
    root = x[: cg.num_computed] if step.return_root else None
    return transport.post(step, agg, root)


class LocalTransport:
    """Every stage in this process: features through a :class:`KHopFetcher`,
    :func:`aggregate` in numpy, Update through an :class:`UpdateModel`."""

    def __init__(
        self,
        fetcher: KHopFetcher,
        model: UpdateModel,
        stats: FetchStats | None = None,
        overlay: GraphOverlay | None = None,
    ) -> None:
        self.fetcher = fetcher
        self.model = model
        self.stats = stats
        self.overlay = overlay  # a new-vertex request's rows (ids >= num_nodes)

    def features(self, ids: np.ndarray) -> np.ndarray:
        return self.fetcher.read_features(ids, stats=self.stats, overlay=self.overlay)

    def aggregate(
        self,
        step: LayerStep,
        block: Block,
        h_src: np.ndarray | None,
        src_ids: np.ndarray,
        extras: dict[str, np.ndarray],
    ) -> dict[str, np.ndarray]:
        if h_src is None:
            h_src = self.features(src_ids)
        off = int(getattr(block, "dst_offset", 0))
        out = {
            "agg": aggregate(
                step.op,
                block,
                h_src,
                eps=step.eps,
                negative_slope=step.negative_slope,
                **extras,
            )
        }
        if step.return_root:
            out["root"] = h_src[off : off + block.num_dst]
        return out

    def pre(self, step: LayerStep, h: np.ndarray) -> dict[str, np.ndarray]:
        return self.model.pre(step.layer, h)

    def post(self, step: LayerStep, agg: np.ndarray, root: np.ndarray | None) -> np.ndarray:
        return self.model.post(step.layer, agg, root)
