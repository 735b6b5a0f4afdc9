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
