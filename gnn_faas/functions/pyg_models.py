"""Reference PyG models: the layout every checkpoint's weights follow.

:class:`PygGNN` keeps its layers in ``self.convs = torch.nn.ModuleList([...])``
built from ``GCNConv``, ``SAGEConv``, ``GINConv`` or ``GATConv`` with PyG's
defaults (see :mod:`gnn_faas.functions.model_config`), applies ReLU (and
dropout while training) between layers and nothing after the last. Training
(:mod:`gnn_faas.functions.train`) uses it; the composition tests compare the
Aggregate/Update split against it; ``gnn-faas model import`` accepts its
state_dict (or that of any module with the same ``convs`` layout).
"""

from __future__ import annotations

import warnings

import numpy as np
import torch
from torch import nn
from torch_geometric.nn import GATConv, GCNConv, GINConv, SAGEConv

from gnn_faas.functions.model_config import ModelConfig
from gnn_faas.storage.computation_graph import ComputationGraph
from gnn_faas.storage.format import self_loop_counts


def build_conv(config: ModelConfig, layer: int, cached: bool = False) -> nn.Module:
    """The PyG layer ``layer`` (1-based) of ``config``. ``cached``: GCN keeps its
    normalised adjacency between calls (full-batch training on one fixed graph;
    the weights are the same)."""
    d_in, c = config.layer_channels()[layer - 1]
    d_out = config.layer_dims()[layer - 1][1]
    lc = config.layer_settings()[layer - 1]
    if config.arch == "gcn":
        return GCNConv(d_in, c, cached=cached, bias=lc.bias)
    if config.arch == "sage":
        return SAGEConv(d_in, c, aggr=lc.aggr, root_weight=lc.root_weight, bias=lc.bias)
    if config.arch == "gin":
        mlp = nn.Sequential(
            nn.Linear(d_in, lc.mlp_hidden), nn.ReLU(), nn.Linear(lc.mlp_hidden, d_out)
        )
        return GINConv(mlp, eps=lc.eps, train_eps=False)
    return GATConv(
        d_in,
        c,
        heads=lc.heads,
        concat=lc.concat,
        negative_slope=lc.negative_slope,
        bias=lc.bias,
    )


class PygGNN(nn.Module):
    """``num_layers`` convolutions with ReLU + dropout between them."""

    def __init__(self, config: ModelConfig, dropout: float = 0.5, cached: bool = False):
        super().__init__()
        self.config = config
        self.dropout = dropout
        self.convs = nn.ModuleList(
            [build_conv(config, layer, cached) for layer in range(1, config.num_layers + 1)]
        )

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        for i, conv in enumerate(self.convs):
            x = conv(x, edge_index)
            if i < len(self.convs) - 1:
                x = torch.relu(x)
                x = nn.functional.dropout(x, p=self.dropout, training=self.training)
        return x


def build_model(
    config: ModelConfig, dropout: float = 0.5, seed: int | None = None, cached: bool = False
) -> PygGNN:
    """A freshly initialised reference model (seeded when ``seed`` is given)."""
    if seed is not None:
        torch.manual_seed(seed)
    return PygGNN(config, dropout=dropout, cached=cached)


def csr_edge_index(indptr: np.ndarray, indices: np.ndarray) -> torch.Tensor:
    """PyG ``edge_index`` ``[2, E]`` (row 0 source, row 1 target) of an in-edge CSR."""
    indptr = np.asarray(indptr, dtype=np.int64)
    dst = np.repeat(np.arange(indptr.size - 1, dtype=np.int64), np.diff(indptr))
    src = np.asarray(indices, dtype=np.int64)
    return torch.from_numpy(np.stack([src, dst]))


def csr_adjacency(indptr: np.ndarray, indices: np.ndarray, num_src: int) -> torch.Tensor:
    """The in-edge CSR as a torch sparse CSR ``adj_t`` (row = target), which PyG
    layers accept in place of ``edge_index`` and aggregate with a sparse matmul:
    several times faster on CPU than the scatter path, same results (to float
    rounding) on graphs without self loops."""
    indptr = np.asarray(indptr, dtype=np.int64)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
        return torch.sparse_csr_tensor(
            torch.from_numpy(indptr),
            torch.from_numpy(np.asarray(indices, dtype=np.int64)),
            torch.ones(int(indptr[-1])),
            size=(indptr.size - 1, num_src),
            check_invariants=False,
        )


def has_self_loops(indptr: np.ndarray, indices: np.ndarray) -> bool:
    """Whether any row ``v`` of the in-edge CSR lists ``v`` itself."""
    return bool(self_loop_counts(indptr, indices).any())


def full_batch_adjacency(
    arch: str, indptr: np.ndarray, indices: np.ndarray, num_nodes: int
) -> torch.Tensor:
    """What full-batch training feeds the model: the sparse ``adj_t``
    (:func:`csr_adjacency`, several times faster on CPU) where it gives the
    edge list's results, else the ``edge_index``. GATConv needs the edge list
    for its edge softmax; GCNConv too on a graph with self loops: on a sparse
    ``adj_t`` its ``gcn_norm`` adds a second self loop, where the edge list path
    (what serving reproduces) replaces the stored ones by exactly one."""
    indptr = np.asarray(indptr, dtype=np.int64)
    indices = np.asarray(indices)
    if arch == "gat" or (arch == "gcn" and has_self_loops(indptr, indices)):
        return csr_edge_index(indptr, indices)
    return csr_adjacency(indptr, indices, num_nodes)


def cg_edge_index(cg: ComputationGraph) -> torch.Tensor:
    """The edge_index of a computation graph over its local ids ``0..n_0-1``:
    what PyG runs on for a (sampled) subgraph. Vertices of the outermost hop
    have no in-edges, as in a PyG ``NeighborLoader`` batch."""
    return csr_edge_index(cg.indptr, cg.indices)
