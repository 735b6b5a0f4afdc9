"""Renumbering at ingest: fewer ranges per neighbourhood, the same answers in user ids."""

from __future__ import annotations

import json

import numpy as np
import pytest
import scipy.sparse as sp

from gnn_faas.cli import main
from gnn_faas.errors import InvalidRequest
from gnn_faas.functions.executor import LocalTransport, run_layers
from gnn_faas.gateway.inference_request import parse_infer_request
from gnn_faas.paths import BUNDLED_DATA
from gnn_faas.storage.datasets import ensure_dataset
from gnn_faas.storage.fetcher import KHopFetcher
from gnn_faas.storage.format import open_graph
from gnn_faas.storage.ingest import ingest
from gnn_faas.storage.reorder import (
    HUB_SHARE,
    REORDERS,
    IdMap,
    communities,
    permute_csr,
    ranges_per_neighbourhood,
    reorder_permutation,
)
from tests.functions.test_composition import ATOL, RTOL, make_model, pyg_full

BITCOIN = BUNDLED_DATA / "bitcoin_otc.npz"


def _edges(indptr, indices):
    rows = np.repeat(np.arange(indptr.size - 1), np.diff(indptr))
    return set(zip(rows.tolist(), np.asarray(indices).tolist()))


@pytest.mark.parametrize("method", REORDERS)
def test_permutation_relabels_the_same_graph(tmp_path, method):
    g = ensure_dataset(f"file://{tmp_path}", "bitcoin-otc")
    indptr, indices = g.read_blob("indptr"), g.read_blob("indices")
    order = reorder_permutation(indptr, indices, method)
    assert np.array_equal(np.sort(order), np.arange(g.num_nodes))
    pip, pix = permute_csr(indptr, indices, order)
    # stored edge (i <- j) is original edge (order[i] <- order[j]); rows stay sorted
    rows = np.repeat(np.arange(g.num_nodes), np.diff(pip))
    assert _edges(indptr, indices) == set(zip(order[rows].tolist(), order[pix].tolist()))
    assert np.all((np.diff(pix) > 0) | (np.diff(rows) != 0))


def test_bfs_and_rcm_cut_the_ranges_of_two_hop_neighbourhoods(tmp_path):
    """Cora, 200 random targets: none 36 ranges per 2-hop set on average, bfs 13, rcm 16."""
    g = ensure_dataset(f"file://{tmp_path}", "cora")
    indptr, indices = g.read_blob("indptr"), g.read_blob("indices")
    targets = np.random.default_rng(0).choice(g.num_nodes, 200, replace=False)
    mean = {}
    for method in REORDERS:
        order = reorder_permutation(indptr, indices, method)
        inv = np.empty_like(order)
        inv[order] = np.arange(order.size)
        pip, pix = permute_csr(indptr, indices, order)
        mean[method] = ranges_per_neighbourhood(pip, pix, inv[targets]).mean()
    assert mean["bfs"] < 0.6 * mean["none"] and mean["rcm"] < 0.6 * mean["none"]


def _purity(found: np.ndarray, truth: np.ndarray) -> tuple[float, int]:
    """Share of vertices in their found community's majority planted one, and
    the number of found communities holding more than 5% of the vertices."""
    table = np.zeros((found.max() + 1, truth.max() + 1), np.int64)
    np.add.at(table, (found, truth), 1)
    return table.max(axis=1).sum() / truth.size, int(
        np.count_nonzero(table.sum(1) > 0.05 * truth.size)
    )


def test_community_order_finds_planted_communities_and_cuts_ranges(tmp_path):
    """A planted partition (8 communities, homophily 0.8): Louvain recovers
    them, and grouping them (hubs first) cuts the ranges of 2-hop
    neighbourhoods below bfs's, the order without community structure."""
    from gnn_faas.storage.reorder import _pattern, _symmetric
    from gnn_faas.storage.synth import synthesize

    uri = f"file://{tmp_path}"
    synthesize(uri, "higgs-twitter", scale=0.01, seed=1)
    g = open_graph(uri, "higgs-twitter-like")
    indptr, indices = g.read_blob("indptr"), g.read_blob("indices")
    n = g.num_nodes
    found = communities(_symmetric(_pattern(indptr, indices, n)))
    assert found.shape == (n,) and np.array_equal(np.unique(found), np.arange(found.max() + 1))
    purity, big = _purity(found, g.read_blob("labels"))
    assert purity >= 0.95 and big == 8 and found.max() + 1 <= 10, (purity, big, found.max() + 1)
    # the order: communities one after another, hubs first in each
    order = reorder_permutation(indptr, indices, "community")
    assert np.array_equal(np.sort(order), np.arange(n))
    comm = found[order]
    assert int(np.count_nonzero(np.diff(comm))) == found.max()  # each community contiguous
    deg = np.diff(_symmetric(_pattern(indptr, indices, n)).indptr)[order]
    first = comm == comm[0]  # the largest community: its top degrees lead it, decreasing
    head = int(HUB_SHARE * first.sum())
    assert np.all(np.diff(deg[:head]) <= 0) and deg[:head].min() >= np.median(deg[first])
    targets = np.random.default_rng(0).choice(n, 100, replace=False)
    mean = {}
    for method in ("none", "bfs", "community"):
        order = reorder_permutation(indptr, indices, method)
        inv = np.empty_like(order)
        inv[order] = np.arange(n)
        pip, pix = permute_csr(indptr, indices, order)
        mean[method] = ranges_per_neighbourhood(pip, pix, inv[targets]).mean()
    assert mean["community"] < 0.9 * mean["bfs"] and mean["bfs"] < mean["none"], mean


def _hub_graph(seed: int, k: int = 6, size: int = 400, deg: int = 8, hubs: int = 20):
    """``k`` communities of ``size`` vertices, each vertex with ``deg`` in-edges
    from its own community, and ``hubs`` hubs, each linked (one direction or
    the other) to half of all the other vertices: every vertex neighbours
    about 10 hubs, more than its 8 to 16 neighbours in its community, and the
    hubs carry more than half of the edges. In-edge CSR and the communities."""
    rng = np.random.default_rng(seed)
    n0 = k * size
    comm = np.arange(n0) // size
    dst = np.repeat(np.arange(n0), deg)
    src = comm[dst] * size + rng.integers(0, size, dst.size)
    h, v = np.nonzero(rng.random((hubs, n0)) < 0.5)
    out = rng.random(h.size) < 0.5
    src = np.concatenate((src, np.where(out, n0 + h, v)))
    dst = np.concatenate((dst, np.where(out, v, n0 + h)))
    keep = src != dst
    n = n0 + hubs
    a = sp.csr_matrix((np.ones(keep.sum()), (dst[keep], src[keep])), shape=(n, n))
    a.sum_duplicates()
    return a.indptr.astype(np.int64), a.indices.astype(np.int32), comm


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_hubs_linked_to_every_community_do_not_merge_them(seed):
    """Label propagation counting neighbours' votes takes the hubs' label
    everywhere here (one community, purity 0.17); modularity charges a
    community for its volume, so the 6 planted ones stay apart and the hubs
    join them."""
    from gnn_faas.storage.reorder import _pattern, _symmetric

    indptr, indices, truth = _hub_graph(seed)
    n = indptr.size - 1
    s = _symmetric(_pattern(indptr, indices, n))
    hubs = np.arange(truth.size, n)
    assert (s[hubs][:, : truth.size] @ np.eye(6)[truth] > 100).all()  # each hub in every one
    found = communities(s, seed=seed)
    purity, big = _purity(found[: truth.size], truth)
    assert purity >= 0.99 and big == 6 and found.max() + 1 == 6, (purity, big, found.max() + 1)
    assert communities(s, seed=seed).tolist() == found.tolist()  # seeded: reproducible


def test_ranges_are_runs_of_consecutive_ids():
    # 0 <- 1, 0 <- 5, 5 <- 6, 1 <- 2: 2-hop set of 0 is {0, 1, 2, 5, 6}: runs 0-2, 5-6
    indptr = np.array([0, 2, 3, 3, 3, 3, 4, 4])
    indices = np.array([1, 5, 2, 6])
    assert ranges_per_neighbourhood(indptr, indices, np.array([0, 3]), hops=2).tolist() == [2, 1]
    assert ranges_per_neighbourhood(indptr, indices, np.array([0]), hops=1).tolist() == [2]


@pytest.fixture(scope="module", params=["bfs", "community"])
def stores(tmp_path_factory, request):
    """Bitcoin OTC ingested as given and renumbered by bfs and by community
    (same features by user id)."""
    root = tmp_path_factory.mktemp("reorder")
    plain, renum = f"file://{root / 'plain'}", f"file://{root / 'renum'}"
    ingest(BITCOIN, plain, "btc", random_dim=12, seed=4)
    assert main(["ingest", str(BITCOIN), "--name", "btc", "--store", renum, "--random-features",
                 "12", "--seed", "4", "--reorder", request.param]) == 0  # fmt: skip
    return open_graph(plain, "btc"), open_graph(renum, "btc", verify="full")


def test_renumbered_store_keeps_per_vertex_data_with_its_vertex(stores):
    plain, renum = stores
    idmap = IdMap.of(renum)
    assert IdMap.of(plain) is None and renum.manifest.extra["reorder"] in ("bfs", "community")
    user = idmap.user_ids
    assert not np.array_equal(user, np.arange(user.size))  # really renumbered
    np.testing.assert_array_equal(renum.read_blob("features"), plain.read_blob("features")[user])
    np.testing.assert_array_equal(renum.read_blob("node_ids"), plain.read_blob("node_ids")[user])
    ids = np.array([0, 5, user.size - 1, user.size + 3])  # the last one: a new vertex
    assert np.array_equal(idmap.to_user(idmap.to_stored(ids)), ids)
    assert idmap.to_stored(ids)[-1] == user.size + 3


@pytest.mark.parametrize("arch", ["gcn", "sage-mean"])
def test_renumbered_graph_answers_as_pyg_on_the_original_ids(stores, arch, tmp_path):
    plain, renum = stores
    fetcher = KHopFetcher(renum)
    model, update = make_model(arch, 2, KHopFetcher(plain), tmp_path)
    user_targets = np.array([3, 17, 250, 1024, plain.num_nodes - 1])
    body = {"inputs": [{"name": "targets", "datatype": "INT64", "shape": [5],
                        "data": user_targets.tolist()}]}  # fmt: skip
    req = parse_infer_request("m", body, renum.num_nodes, 100, id_map=IdMap.of(renum))
    stored = req.vertices
    assert np.array_equal(IdMap.of(renum).to_user(stored), user_targets)
    cg = fetcher.fetch(stored, 2, degrees=True)
    out = run_layers(update.plan, cg, LocalTransport(fetcher, update))
    answers = out[cg.target_index]  # rows of the targets in the order given
    ref = pyg_full(model, KHopFetcher(plain))[user_targets]  # PyG on the graph as ingested
    np.testing.assert_allclose(answers, ref, rtol=RTOL, atol=ATOL)


def test_unknown_reorder_is_a_clear_error(tmp_path):
    with pytest.raises(InvalidRequest, match="reorder"):
        ingest(BITCOIN, f"file://{tmp_path}", "x", reorder="metis")


def test_gateway_parse_maps_every_user_id_to_its_stored_id():
    from gnn_faas.gateway.new_vertices import parse_new_vertices, split_new_vertex_inputs
    from tests.gateway.test_new_vertices import D, N, body

    user_ids = np.random.default_rng(1).permutation(N)  # stored s is user user_ids[s]
    idmap = IdMap(user_ids)
    doc = body([[1, 2, 3]], [[4, N], [N, 7]], targets=(N, 7, 4))
    rest, added = split_new_vertex_inputs(json.dumps(doc).encode())
    ov = parse_new_vertices(added, N, D, False, id_map=idmap)
    # user 4 -> new vertex N -> user 7, in stored ids (the new vertex keeps its id)
    got = sorted(zip(ov.src.tolist(), ov.dst.tolist()))
    assert got == sorted([(int(idmap.to_stored([4])[0]), N), (N, int(idmap.to_stored([7])[0]))])
    req = parse_infer_request("m", rest, ov.num_nodes, 16, id_map=idmap)
    assert req.vertices.tolist() == [N, *idmap.to_stored([7, 4]).tolist()]
    edge = {"inputs": [{"name": "pairs", "datatype": "INT64", "shape": [1, 2], "data": [2, 5]}]}
    pairs = parse_infer_request("m", edge, N, 16, id_map=idmap).pairs
    assert pairs.tolist() == [idmap.to_stored([2, 5]).tolist()]
