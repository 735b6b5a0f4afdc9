"""Reference PyG models: the full-batch training adjacency gives the edge
list's outputs (what serving reproduces), on Cora with and without self loops."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gnn_faas.functions.model_config import ModelConfig
from gnn_faas.functions.pyg_models import build_model, csr_edge_index, full_batch_adjacency
from tests.functions.test_composition import ARCHS, cora_fetcher, looped_cora_fetcher


@pytest.fixture(scope="module")
def graphs(tmp_path_factory):
    cora = cora_fetcher(tmp_path_factory.mktemp("store"))
    return {"cora": cora, "cora-self-loops": looped_cora_fetcher(cora)}


@pytest.mark.parametrize("graph", ["cora", "cora-self-loops"])
@pytest.mark.parametrize("name", list(ARCHS))
def test_full_batch_adjacency_equals_the_edge_list(name, graph, graphs):
    g = graphs[graph].graph
    indptr, indices = np.array(g.read_blob("indptr")), np.array(g.read_blob("indices"))
    kw = dict(ARCHS[name])
    arch = kw.pop("arch", name)
    cfg = ModelConfig(arch=arch, in_dim=1433, hidden_dim=16, out_dim=7, num_layers=2, **kw)
    model = build_model(cfg, seed=1).eval()
    x = torch.from_numpy(np.array(g.read_blob("features"), np.float32))
    with torch.no_grad():
        ref = model(x, csr_edge_index(indptr, indices)).numpy()
        out = model(x, full_batch_adjacency(arch, indptr, indices, g.num_nodes)).numpy()
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-5)
