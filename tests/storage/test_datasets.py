"""Named datasets reproduce the counts of ../shared/datasets/README.md."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

from gnn_faas.cli import main
from gnn_faas.errors import NotFound
from gnn_faas.storage import datasets
from gnn_faas.storage.datasets import ensure_dataset, prepare_dataset
from gnn_faas.storage.format import open_graph

DATA = Path(__file__).parents[2] / "gnn_faas" / "data"
SHARED = Path(__file__).parents[2] / ".." / "shared" / "datasets"


def adjacency(g) -> sp.csr_matrix:
    indptr, indices = g.read_blob("indptr"), g.read_blob("indices")
    n = g.num_nodes
    return sp.csr_matrix((np.ones(indices.size, np.int8), indices, indptr), shape=(n, n))


@pytest.fixture
def store(tmp_path) -> str:
    return f"file://{tmp_path / 'store'}"


def test_bitcoin_otc(store):
    prepare_dataset(store, "bitcoin-otc")
    g = open_graph(store, "bitcoin-otc", verify="full")
    assert (g.num_nodes, g.num_edges) == (5881, 35592)
    assert g.manifest.feature_dim == 128 and not g.manifest.symmetrized
    with np.load(DATA / "bitcoin_otc.npz", allow_pickle=False) as z:
        src, dst, rating, when = z["src"], z["dst"], z["rating"], z["time"]
    ids = g.read_blob("node_ids")
    # edge u -> v kept as given: u is an in-neighbour of v
    a = adjacency(g).tocoo()
    got = np.unique(np.stack([ids[a.col], ids[a.row]], 1), axis=0)
    assert np.array_equal(got, np.unique(np.stack([src, dst], 1), axis=0))
    # label: mean received rating < 0, computed here per original id
    total = np.zeros(ids.max() + 1)
    count = np.zeros(ids.max() + 1)
    np.add.at(total, dst, rating)
    np.add.at(count, dst, 1)
    mean = np.divide(total, count, out=np.zeros_like(total), where=count > 0)
    labels = g.read_blob("labels")
    assert labels.shape == (5881,) and g.manifest.num_classes == 2
    assert np.array_equal(labels, (mean[ids] < 0).astype(np.int64))
    assert 0 < labels.sum() < 5881
    # request order: the rated users by time of rating, as local ids
    order = g.read_blob("request_order")
    assert order.shape == (35592,) and order.min() >= 0 and order.max() < 5881
    assert np.array_equal(ids[order], dst[np.argsort(when, kind="stable")])


def test_features_are_deterministic_for_a_seed(tmp_path):
    a, b, c = (f"file://{tmp_path / s}" for s in "abc")
    prepare_dataset(a, "bitcoin-otc", seed=0)
    prepare_dataset(b, "bitcoin-otc", seed=0)
    prepare_dataset(c, "bitcoin-otc", seed=1)
    fa, fb, fc = (open_graph(s, "bitcoin-otc").read_blob("features") for s in (a, b, c))
    assert fa.dtype == np.float32 and fa.shape == (5881, 128)
    assert np.array_equal(fa, fb) and not np.array_equal(fa, fc)
    assert abs(float(fa.mean())) < 0.01 and abs(float(fa.std()) - 1) < 0.01


def test_cora(store):
    prepare_dataset(store, "cora")
    g = open_graph(store, "cora", verify="full")
    # 5,278 undirected edges of the README, both directions stored
    assert (g.num_nodes, g.num_edges) == (2708, 2 * 5278)
    assert g.manifest.symmetrized
    a = adjacency(g)
    assert (a != a.T).nnz == 0
    with np.load(DATA / "cora.npz", allow_pickle=False) as z:
        assert np.array_equal(g.read_blob("features"), z["feat"])
        assert np.array_equal(g.read_blob("labels"), z["label"])
        assert np.array_equal(g.read_blob("node_ids"), z["paper_id"])
        assert all(a[d, s] for s, d in zip(z["src"][:50], z["dst"][:50], strict=True))
    assert g.manifest.num_classes == 7 and set(np.unique(g.read_blob("labels"))) == set(range(7))
    assert not g.has("request_order")


@pytest.mark.skipif(not (SHARED / "higgs_interactions.npz").is_file(), reason="no shared data")
def test_higgs_retweet(store):
    # a small random dimension keeps the test lean; the graph is the real one
    prepare_dataset(store, "higgs-retweet", SHARED, feature_dim=4)
    g = open_graph(store, "higgs-retweet")
    assert (g.num_nodes, g.num_edges) == (256_491, 328_132)
    assert g.manifest.feature_dim == 4 and not g.manifest.symmetrized
    ids = g.read_blob("node_ids")
    order = g.read_blob("request_order")
    with np.load(SHARED / "higgs_activity.npz", allow_pickle=False) as z:
        target = z["dst"][np.argsort(z["time"], kind="stable")]
    assert np.array_equal(ids[order], target[np.isin(target, ids)])
    assert 0 < order.size < target.size


def test_missing_source_names_the_expected_file(tmp_path, capsys):
    with pytest.raises(NotFound, match="higgs_interactions.npz"):
        prepare_dataset(str(tmp_path / "s"), "higgs-retweet", tmp_path)
    code = main(
        ["datasets", "prepare", "higgs-retweet", "--store", str(tmp_path), "--from", str(tmp_path)]
    )
    err = capsys.readouterr().err
    assert code == 2 and "higgs_interactions.npz" in err and err.count("\n") == 1
    with pytest.raises(NotFound, match="unknown dataset"):
        prepare_dataset(str(tmp_path / "s"), "no-such-dataset")


def test_ensure_dataset_prepares_once(tmp_path, monkeypatch):
    store = f"file://{tmp_path / 'store'}"
    g = ensure_dataset(store, "cora")
    assert (g.num_nodes, g.num_edges) == (2708, 10556)
    manifest = tmp_path / "store" / "cora" / "manifest.json"
    stamp = manifest.stat().st_mtime_ns

    def fail(*args, **kwargs):
        raise AssertionError("prepared again")

    monkeypatch.setattr(datasets, "prepare_dataset", fail)
    assert ensure_dataset(store, "cora").num_edges == 10556
    assert manifest.stat().st_mtime_ns == stamp
    with pytest.raises(NotFound):
        ensure_dataset(store, "not-a-dataset")


def test_cli_list_and_prepare(tmp_path, capsys):
    assert main(["datasets", "list"]) == 0
    out = capsys.readouterr().out
    for name in ("bitcoin-otc", "cora", "higgs-retweet"):
        assert name in out
    store = f"file://{tmp_path / 'store'}"
    assert main(["datasets", "prepare", "bitcoin-otc", "--store", store]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "5881 vertices, 35592 edges" in out
    args = ["datasets", "prepare", "bitcoin-otc", "--store", store, "--as", "b2", "--reorder"]
    assert main([*args, "bfs", "--feature-dim", "4"]) == 0
    assert open_graph(store, "b2").manifest.extra["reorder"] == "bfs"
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:  # an unknown order: usage error, exit 2
        main([*args, "sideways"])
    assert exc.value.code == 2 and "sideways" in capsys.readouterr().err


def test_a_renumbered_dataset_keeps_its_ids_rows_and_request_order(tmp_path):
    from gnn_faas.storage.reorder import IdMap

    plain_uri, bfs_uri = f"file://{tmp_path}/plain", f"file://{tmp_path}/bfs"
    prepare_dataset(plain_uri, "bitcoin-otc", feature_dim=8)
    res = prepare_dataset(bfs_uri, "bitcoin-otc", feature_dim=8, reorder="bfs")
    assert res.manifest.extra["reorder"] == "bfs"
    plain, bfs = open_graph(plain_uri, "bitcoin-otc"), open_graph(bfs_uri, "bitcoin-otc")
    ids = IdMap.of(bfs)
    assert ids is not None and not np.array_equal(ids.user_ids, np.arange(plain.num_nodes))
    user = ids.user_ids  # stored vertex s is the dataset's vertex user[s]
    for key in ("features", "labels"):
        np.testing.assert_array_equal(bfs.read_blob(key), plain.read_blob(key)[user])
    # the request order asks for the same vertices, in stored ids
    np.testing.assert_array_equal(
        ids.to_user(bfs.read_blob("request_order")), plain.read_blob("request_order")
    )
    # the same edges: in-neighbours of stored s are the user ids' in-neighbours
    a = sp.csr_matrix((np.ones(plain.num_edges), plain.read_blob("indices"),
                       plain.read_blob("indptr")), shape=(plain.num_nodes,) * 2)  # fmt: skip
    b = sp.csr_matrix((np.ones(bfs.num_edges), bfs.read_blob("indices"),
                       bfs.read_blob("indptr")), shape=(bfs.num_nodes,) * 2)  # fmt: skip
    assert (a[user][:, user] != b).nnz == 0
