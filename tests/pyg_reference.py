"""A checkpoint and its PyG reference, for the end-to-end tests.

:func:`checkpoint_with_reference` writes a seeded model's checkpoint where a
stack can serve it and returns what PyG computes with the same weights on the
whole graph: the answer every served request must equal.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

# the two-layer GCN vertex classifier the end-to-end tests serve
GCN = {"arch": "gcn", "hidden_dim": 32, "out_dim": 2, "num_layers": 2, "num_classes": 2}


def checkpoint_with_reference(graph, ckpt: Path, seed: int, **model) -> np.ndarray:
    """Save ``build_model(ModelConfig(**model), seed)`` to ``ckpt``; return its
    outputs for every vertex of ``graph`` (a store handle), run in-process by PyG.
    ``model``: the :class:`ModelConfig` fields besides ``in_dim`` and ``graph``."""
    import torch

    from gnn_faas.functions.checkpoint import save_checkpoint
    from gnn_faas.functions.model_config import ModelConfig
    from gnn_faas.functions.pyg_models import build_model, csr_edge_index

    cfg = ModelConfig(in_dim=graph.manifest.feature_dim, graph=graph.name, **model)
    net = build_model(cfg, seed=seed).eval()
    save_checkpoint(ckpt, cfg, net.state_dict())
    ei = csr_edge_index(graph.read_blob("indptr"), graph.read_blob("indices"))
    x = torch.from_numpy(np.array(graph.read_blob("features"), dtype=np.float32))
    with torch.no_grad():
        return net(x, ei).numpy()


def pyg_outputs(ckpt: Path, src: np.ndarray, dst: np.ndarray, x: np.ndarray) -> np.ndarray:
    """What the checkpoint's model computes in PyG on a graph given as an edge
    list (``dst`` aggregates from ``src``) and feature rows ``x``: the reference
    of a graph changed by updates, built without the store's code."""
    import torch

    from gnn_faas.functions.checkpoint import load_config, load_state
    from gnn_faas.functions.pyg_models import PygGNN

    net = PygGNN(load_config(ckpt))
    net.load_state_dict({k: torch.as_tensor(v) for k, v in load_state(ckpt).items()})
    net.eval()
    ei = torch.from_numpy(np.stack([np.asarray(src, np.int64), np.asarray(dst, np.int64)]))
    with torch.no_grad():
        return net(torch.from_numpy(np.asarray(x, np.float32)), ei).numpy()
