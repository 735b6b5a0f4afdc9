"""Precompute every stored vertex's layer embeddings for SRPE (compute side, torch).

``p^(l)``, ``1 <= l <= L - 1``, is the output of layer ``l`` of the model on
the whole stored graph with full neighbourhoods (what exact serving computes
for every vertex). The first ``L - 1`` layers run as one computation graph
whose every layer keeps all vertices (``D_l = V``), in destination chunks of
``chunk_rows`` so the working set stays bounded on large graphs; the rows go to
:func:`~gnn_faas.storage.embeddings.write_embeddings`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from gnn_faas.errors import InvalidRequest
from gnn_faas.functions.aggregate import aggregate, slice_rows
from gnn_faas.functions.checkpoint import checkpoint_sha256
from gnn_faas.functions.layer_plan import ModelPlan
from gnn_faas.functions.update import UpdateModel
from gnn_faas.storage.computation_graph import Block
from gnn_faas.storage.embeddings import write_embeddings
from gnn_faas.storage.format import GraphHandle, self_loop_counts
from gnn_faas.storage.versions import latest

DEFAULT_CHUNK_ROWS = 65536


def full_graph_embeddings(
    graph: GraphHandle,
    model: UpdateModel,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
    states: dict[int, np.ndarray] | None = None,
) -> dict[int, np.ndarray]:
    """``{l: p^(l) [N, d_l]}`` for ``1 <= l <= L - 1`` on the stored graph.

    ``states``, when given, receives layer 1's aggregate states ``s_u``
    (:func:`~gnn_faas.functions.srpe_recompute.layer_states`) where the layer
    supports them; the layer's aggregate is then finished from the state
    (:func:`~gnn_faas.functions.srpe_recompute.finish_state`), one sparse
    product for both."""
    from gnn_faas.functions.srpe_recompute import finish_state, layer_states, supports_states

    plan: ModelPlan = model.plan
    n = graph.num_nodes
    indptr = np.asarray(graph.read_blob("indptr"), dtype=np.int64)
    indices = np.asarray(graph.read_blob("indices"), dtype=np.int64)
    block = Block(n, n, indptr, indices)
    # GCN's degree excludes self loops (PyG's gcn_norm replaces them by one)
    deg = np.diff(indptr) - self_loop_counts(indptr, indices)
    h = np.asarray(graph.read_blob("features"), dtype=np.float32)
    out: dict[int, np.ndarray] = {}
    for step in plan.steps[:-1]:
        extras: dict[str, np.ndarray] = {}
        src = h
        if step.pre:
            pre = model.pre(step.layer, h)
            src = pre["h"]
            if step.needs_alpha:
                extras = {"alpha_src": pre["alpha_src"], "alpha_dst": pre["alpha_dst"]}
        if step.needs_degrees:
            extras["deg_src"] = deg
        parts, state_parts = [], []
        want_states = states is not None and step.layer == 1 and supports_states(step)
        for a in range(0, n, chunk_rows):
            b = min(n, a + chunk_rows)
            sub = slice_rows(block, a, b)
            if want_states:
                state = layer_states(step.op, sub, src, deg)
                state_parts.append(state)
                count = np.diff(indptr[a : b + 1])
                agg = finish_state(step.op, state, src[a:b], count, deg[a:b], step.eps)
            else:
                agg = aggregate(
                    step.op, sub, src, eps=step.eps, negative_slope=step.negative_slope, **extras
                )
            root = h[a:b] if step.return_root else None
            parts.append(model.post(step.layer, agg, root))
        if want_states and states is not None:
            states[step.layer] = np.concatenate(state_parts)
        h = np.concatenate(parts) if parts else np.zeros((0, step.out_dim), np.float32)
        out[step.layer] = h
    return out


def precompute(
    graph: GraphHandle, ckpt_dir: str | Path, name: str, device: str | None = "cpu"
) -> dict:
    """Compute and store the embeddings of checkpoint ``ckpt_dir`` under model ``name``."""
    model = UpdateModel.load(ckpt_dir, device)
    if model.config.in_dim != graph.manifest.feature_dim:
        raise InvalidRequest(
            f"model input dimension {model.config.in_dim} != graph {graph.name!r} feature "
            f"dimension {graph.manifest.feature_dim}"
        )
    states: dict[int, np.ndarray] = {}
    layers = full_graph_embeddings(graph, model, states=states)
    # computed on the graph's base: versions after it mark their reach stale (serving)
    version = latest(graph.backend, graph.name, base=graph).base_version
    return write_embeddings(graph, name, checkpoint_sha256(ckpt_dir), layers, states, version)
