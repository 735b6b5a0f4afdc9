"""Aggregate (numpy) + Update (torch) through run_layers equals PyG on Cora.

For each architecture a PyG model with seeded random weights is saved as a
state_dict, converted with ``gnn-faas model import`` and served by
:func:`run_layers` with :class:`LocalTransport` on Cora's real features. The
reference is the PyG model itself: on the whole graph for full neighbourhoods,
on the edge_index of the sampled computation graph for sampled ones.

Helpers reusable by other tests: :func:`cora_fetcher`, :func:`import_via_cli`,
:func:`pyg_full`, :func:`pyg_sampled`, :func:`looped_cora_fetcher` (Cora with
self loops, where GCN's degree and GAT's self loop must follow PyG's rules).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from gnn_faas.cli import main
from gnn_faas.functions.aggregate import (
    AGGREGATE_OPS,
    aggregate,
    combine_partials,
    partial_aggregate,
    slice_rows,
)
from gnn_faas.functions.executor import LocalTransport, run_layers
from gnn_faas.functions.model_config import ModelConfig
from gnn_faas.functions.pyg_models import PygGNN, build_model, cg_edge_index, csr_edge_index
from gnn_faas.functions.update import UpdateModel
from gnn_faas.storage.computation_graph import ComputationGraph
from gnn_faas.storage.datasets import ensure_dataset
from gnn_faas.storage.fetcher import KHopFetcher
from gnn_faas.storage.format import open_graph
from gnn_faas.storage.ingest import build_csr, write_csr

RTOL, ATOL = 1e-4, 1e-5
ARCHS = {
    "gcn": {},
    "sage-mean": {"arch": "sage", "aggr": "mean"},
    "sage-max": {"arch": "sage", "aggr": "max"},
    "gin": {},
    "gat": {"heads": 2},
}


def cora_fetcher(store_dir: Path) -> KHopFetcher:
    """A fetcher on Cora (bundled, symmetrised) prepared into a file store."""
    return KHopFetcher(ensure_dataset(f"file://{store_dir}", "cora"))


LOOPED = "cora-loops"


def looped_cora_fetcher(cora: KHopFetcher) -> KHopFetcher:
    """Cora with self loops added: one on a third of the vertices, a second
    one on a tenth of those (PyG's GCN/GAT replace any number by exactly one;
    SAGE and GIN aggregate each as an ordinary edge). Graph ``cora-loops`` in
    the store of the fetcher ``cora``."""
    g = cora.graph
    indptr, indices = g.read_blob("indptr"), g.read_blob("indices")
    n = g.num_nodes
    dst = np.repeat(np.arange(n), np.diff(indptr))
    rng = np.random.default_rng(3)
    once = rng.choice(n, n // 3, replace=False)
    twice = once[: once.size // 10]
    loops = np.concatenate((once, twice))
    graph = build_csr(np.concatenate((indices, loops)), np.concatenate((dst, loops)), num_nodes=n)
    write_csr(g.backend, LOOPED, graph, np.array(g.read_blob("features"), np.float32))
    return KHopFetcher(open_graph(g.backend, LOOPED))


def import_via_cli(model: PygGNN, cfg: ModelConfig, out: Path) -> UpdateModel:
    """Save ``model``'s state_dict as safetensors, ``gnn-faas model import`` it,
    and load the checkpoint for the compute side."""
    src = out.with_suffix(".safetensors")
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(src))
    argv = [
        "model",
        "import",
        "--pyg",
        str(src),
        "--arch",
        cfg.arch,
        "--out",
        str(out),
        "--in-dim",
        str(cfg.in_dim),
        "--hidden",
        str(cfg.hidden_dim),
        "--out-dim",
        str(cfg.out_dim),
        "--layers",
        str(cfg.num_layers),
    ]
    if cfg.arch == "sage":
        argv += ["--aggr", cfg.aggr]
    if cfg.arch == "gat":
        argv += ["--heads", str(cfg.heads)]
    assert main(argv) == 0
    return UpdateModel.load(out, device="cpu")


def pyg_full(model: PygGNN, fetcher: KHopFetcher) -> np.ndarray:
    """The PyG model on the whole stored graph."""
    g = fetcher.graph
    ei = csr_edge_index(g.read_blob("indptr"), g.read_blob("indices"))
    x = torch.from_numpy(np.array(g.read_blob("features"), dtype=np.float32))
    with torch.no_grad():
        return model.eval()(x, ei).numpy()


def pyg_sampled(model: PygGNN, fetcher: KHopFetcher, cg: ComputationGraph) -> np.ndarray:
    """The PyG model on the sampled subgraph (local ids 0..n_0-1); rows of the targets."""
    x = torch.from_numpy(fetcher.read_features(cg.input_nodes))
    with torch.no_grad():
        out = model.eval()(x, cg_edge_index(cg)).numpy()
    return out[: cg.layer_sizes[-1]]


@pytest.fixture(scope="module")
def fetcher(tmp_path_factory) -> KHopFetcher:
    return cora_fetcher(tmp_path_factory.mktemp("store"))


@pytest.fixture(scope="module")
def targets() -> np.ndarray:
    # 50 requested vertices incl. repeats: outputs must come back in request order
    t = np.random.default_rng(42).choice(2708, 48, replace=False)
    return np.concatenate((t, t[:2]))


def make_model(name: str, layers: int, fetcher: KHopFetcher, tmp_path: Path):
    kw = dict(ARCHS[name])
    arch = kw.pop("arch", name)
    cfg = ModelConfig(
        arch=arch,
        in_dim=fetcher.graph.manifest.feature_dim,
        hidden_dim=16,
        out_dim=7,
        num_layers=layers,
        num_classes=7,
        **kw,
    )
    model = build_model(cfg, seed=layers * 100 + len(name))
    update = import_via_cli(model, cfg, tmp_path / "ckpt")
    assert update.config.arch == arch and update.config.num_layers == layers
    return model, update


@pytest.mark.parametrize("name", list(ARCHS))
def test_full_neighbourhood_equals_pyg(name, fetcher, targets, tmp_path):
    model, update = make_model(name, 2, fetcher, tmp_path)
    cg = fetcher.fetch(targets, 2, degrees=True)
    out = run_layers(update.plan, cg, LocalTransport(fetcher, update))
    assert out.shape == (cg.layer_sizes[-1], 7)
    ref = pyg_full(model, fetcher)
    np.testing.assert_allclose(out[cg.target_index], ref[targets], rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("name", list(ARCHS))
def test_sampled_neighbourhood_equals_pyg(name, fetcher, targets, tmp_path):
    model, update = make_model(name, 2, fetcher, tmp_path)
    cg = fetcher.fetch(targets, 2, fanouts=[5, 3], seed=11, degrees=True)
    full = fetcher.fetch(targets, 2)
    assert cg.indices.size < full.indices.size  # the sample really drops edges
    out = run_layers(update.plan, cg, LocalTransport(fetcher, update))
    np.testing.assert_allclose(out, pyg_sampled(model, fetcher, cg), rtol=RTOL, atol=ATOL)


@pytest.fixture(scope="module")
def looped(fetcher) -> KHopFetcher:
    return looped_cora_fetcher(fetcher)


def self_loop_rows(cg: ComputationGraph) -> np.ndarray:
    """Local ids of the expanded vertices whose (sampled) list holds themselves."""
    rows = np.repeat(np.arange(cg.indptr.size - 1), np.diff(cg.indptr))
    return np.unique(rows[cg.indices == rows])


@pytest.mark.parametrize("name", list(ARCHS))
def test_graph_with_self_loops_equals_pyg(name, looped, targets, tmp_path):
    """Stored self loops: GCN's degree excludes them (PyG ``gcn_norm`` keeps one),
    GAT replaces them by one, SAGE and GIN aggregate them; full and sampled."""
    model, update = make_model(name, 2, looped, tmp_path)
    cg = looped.fetch(targets, 2, degrees=True)
    loops = self_loop_rows(cg)
    assert loops.size > 10  # the computation graph really has self loops
    # the degree excludes them: the full in-degree (indptr) is one or two more
    full = np.diff(looped.graph.read_blob("indptr"))[cg.nodes]
    assert np.all(cg.in_degree[loops] < full[loops])
    out = run_layers(update.plan, cg, LocalTransport(looped, update))
    ref = pyg_full(model, looped)
    np.testing.assert_allclose(out[cg.target_index], ref[targets], rtol=RTOL, atol=ATOL)

    cg = looped.fetch(targets, 2, fanouts=[5, 3], seed=11, degrees=True)
    assert self_loop_rows(cg).size > 0  # some sampled lists keep their self loop
    out = run_layers(update.plan, cg, LocalTransport(looped, update))
    np.testing.assert_allclose(out, pyg_sampled(model, looped, cg), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("name", ["gcn", "gat"])
def test_three_layers(name, fetcher, targets, tmp_path):
    model, update = make_model(name, 3, fetcher, tmp_path)
    cg = fetcher.fetch(targets[:20], 3, degrees=True)
    out = run_layers(update.plan, cg, LocalTransport(fetcher, update))
    ref = pyg_full(model, fetcher)
    np.testing.assert_allclose(out[cg.target_index], ref[targets[:20]], rtol=RTOL, atol=ATOL)
    cg = fetcher.fetch(targets[:20], 3, fanouts=[4, 3, 2], seed=5, degrees=True)
    out = run_layers(update.plan, cg, LocalTransport(fetcher, update))
    np.testing.assert_allclose(out, pyg_sampled(model, fetcher, cg), rtol=RTOL, atol=ATOL)


def test_gcn_without_degrees_is_a_clear_error(fetcher, targets, tmp_path):
    from gnn_faas.errors import InvalidRequest

    _, update = make_model("gcn", 2, fetcher, tmp_path)
    cg = fetcher.fetch(targets, 2)  # degrees not fetched
    with pytest.raises(InvalidRequest, match="degrees=True"):
        run_layers(update.plan, cg, LocalTransport(fetcher, update))


@pytest.mark.parametrize("op", AGGREGATE_OPS)
def test_partitioned_aggregate_equals_whole(op, fetcher, targets):
    """Rows cut in 3 parts, each part's sources split in 2: combined == whole."""
    cg = fetcher.fetch(targets, 2, degrees=True)
    block = cg.block(1)
    x = fetcher.read_features(cg.input_nodes)
    rng = np.random.default_rng(0)
    kw = {}
    if op == "gat":
        x = x[:, :64].reshape(-1, 2, 32)
        kw = dict(
            alpha_src=rng.standard_normal((block.num_src, 2)).astype(np.float32),
            alpha_dst=rng.standard_normal((block.num_src, 2)).astype(np.float32),
        )
    if op == "gcn":
        kw["deg_src"] = cg.in_degree[: block.num_src]
    if op == "gin":
        kw["eps"] = 0.1
    whole = aggregate(op, block, x, **kw)
    bounds = np.linspace(0, block.num_dst, 4).astype(int)
    pivot = block.num_src // 2
    for a, b in zip(bounds[:-1], bounds[1:]):
        part = slice_rows(block, int(a), int(b))
        np.testing.assert_allclose(aggregate(op, part, x, **kw), whole[a:b], rtol=1e-5, atol=1e-6)
        rows = np.repeat(np.arange(part.num_dst), np.diff(part.indptr))
        states = []
        for k, keep in enumerate((part.indices < pivot, part.indices >= pivot)):
            counts = np.bincount(rows[keep], minlength=part.num_dst)
            sub = type(part)(
                part.num_dst,
                part.num_src,
                np.concatenate(([0], np.cumsum(counts))),
                part.indices[keep],
                dst_offset=part.dst_offset,
            )
            states.append(partial_aggregate(op, sub, x, include_self=k == 0, **kw))
        np.testing.assert_allclose(combine_partials(op, states), whole[a:b], rtol=1e-5, atol=1e-6)


def test_output_heads(tmp_path, fetcher):
    from gnn_faas.errors import InvalidRequest

    _, update = make_model("gcn", 2, fetcher, tmp_path)
    rng = np.random.default_rng(0)
    h = rng.standard_normal((6, 7)).astype(np.float32)
    hv = rng.standard_normal((6, 7)).astype(np.float32)
    np.testing.assert_allclose(
        update.edge_scores(h, hv), 1 / (1 + np.exp(-(h * hv).sum(1))), rtol=1e-5
    )
    seg = np.array([0, 0, 2, 2, 2, 0])
    pooled = update.graph_readout(h, seg)
    assert pooled.shape == (3, 7)
    np.testing.assert_allclose(pooled[0], h[[0, 1, 5]].mean(0), rtol=1e-5)
    np.testing.assert_allclose(pooled[2], h[[2, 3, 4]].mean(0), rtol=1e-5)
    assert not pooled[1].any()  # an empty segment
    with pytest.raises(InvalidRequest):
        update.edge_scores(h, hv[:3])
    with pytest.raises(InvalidRequest):
        update.graph_readout(h, np.array([0, 1]))
    with pytest.raises(InvalidRequest):
        update.graph_readout(h, -np.ones(6, dtype=np.int64))
    with pytest.raises(InvalidRequest):
        update.post(2, np.zeros((3, 5), np.float32))  # wrong width
    with pytest.raises(InvalidRequest):
        update.pre(1, np.zeros((3, 1433), np.float32))  # layer 1 aggregates first: no pre
