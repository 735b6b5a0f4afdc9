"""``datasets reorder``: a stored graph renumbered into a store, ids kept."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from gnn_faas.cli import main
from gnn_faas.errors import InvalidRequest
from gnn_faas.storage import reorder_stored as rs
from gnn_faas.storage.datasets import prepare_dataset
from gnn_faas.storage.fetcher import KHopFetcher
from gnn_faas.storage.format import open_graph
from gnn_faas.storage.reorder import IdMap
from gnn_faas.storage.synth import synthesize


def _adjacency(g):
    n = g.num_nodes
    return sp.csr_matrix(
        (np.ones(g.num_edges), g.read_blob("indices"), g.read_blob("indptr")), shape=(n, n)
    )


def _same_graph_in_user_ids(plain, renum) -> None:
    """``renum`` is ``plain`` renumbered: rows, request order and edges follow
    the user ids ``renum`` keeps."""
    user = IdMap.of(renum).user_ids
    assert not np.array_equal(user, np.arange(user.size))  # really renumbered
    assert set(renum.manifest.blobs) == set(plain.manifest.blobs) | {"user_ids"}
    for key in plain.manifest.blobs:
        if key not in ("indptr", "indices", "request_order"):
            np.testing.assert_array_equal(renum.read_blob(key), plain.read_blob(key)[user])
    np.testing.assert_array_equal(
        IdMap.of(renum).to_user(renum.read_blob("request_order")), plain.read_blob("request_order")
    )
    a, b = _adjacency(plain), _adjacency(renum)
    assert (a[user][:, user] != b).nnz == 0


def test_reorder_equals_renumbering_at_prepare(tmp_path, capsys):
    """Bitcoin OTC prepared, then renumbered by the command, is blob for blob
    the one ``datasets prepare --reorder community`` writes."""
    src, dst = f"file://{tmp_path}/src", f"file://{tmp_path}/dst"
    prepare_dataset(src, "bitcoin-otc", feature_dim=8)
    prepare_dataset(dst, "bitcoin-otc", feature_dim=8, graph_name="direct", reorder="community")
    args = ["datasets", "reorder", "bitcoin-otc", "--store", src, "--to", dst, "--as", "copy"]
    assert main([*args, "--reorder", "community"]) == 0
    assert "5881 vertices, 35592 edges" in capsys.readouterr().out
    direct, copy = open_graph(dst, "direct"), open_graph(dst, "copy", verify="full")
    assert copy.manifest.extra["reorder"] == "community"
    assert {k: b.sha256 for k, b in copy.manifest.blobs.items()} == {
        k: b.sha256 for k, b in direct.manifest.blobs.items()
    }
    _same_graph_in_user_ids(open_graph(src, "bitcoin-otc"), copy)


def test_a_renumbered_graph_renumbered_again_keeps_the_first_ids(tmp_path, monkeypatch):
    """A synthetic graph (split, degree, labels, request order) renumbered by
    bfs, then by community, chunk by chunk: every row still follows its
    vertex and ``user_ids`` maps to the ids as generated."""
    monkeypatch.setattr(rs, "ROW_CHUNK_BYTES", 100_000)  # many chunks of feature rows
    uri = f"file://{tmp_path}"
    synthesize(uri, "higgs-twitter", scale=0.005, seed=3)
    plain = open_graph(uri, "higgs-twitter-like")
    rs.reorder_stored(plain, uri, "bfs", "bfs")
    res = rs.reorder_stored(open_graph(uri, "bfs"), uri, "community", "both")
    assert res.manifest.extra["reorder"] == "community" and res.order_seconds <= res.seconds
    both = open_graph(uri, "both", verify="full")
    _same_graph_in_user_ids(plain, both)
    # a k-hop fetch in stored ids reaches the same user vertices
    ids = IdMap.of(both)
    user_targets = plain.read_blob("request_order")[:3]
    got = KHopFetcher(both).fetch(ids.to_stored(user_targets), 2).input_nodes
    want = KHopFetcher(plain).fetch(user_targets, 2).input_nodes
    assert np.array_equal(np.sort(ids.to_user(got)), np.sort(want))


def test_reorder_uploads_to_s3(tmp_path, s3_env):
    """From a file store into S3 (moto): the same blobs as into a directory."""
    src = f"file://{tmp_path}/src"
    prepare_dataset(src, "bitcoin-otc", feature_dim=4)
    graph = open_graph(src, "bitcoin-otc")
    local = rs.reorder_stored(graph, f"file://{tmp_path}/dst", "bfs").manifest
    s3 = f"{s3_env}/reorder-upload"
    remote = rs.reorder_stored(graph, s3, "bfs", "btc").manifest
    assert {k: b.sha256 for k, b in remote.blobs.items()} == {
        k: b.sha256 for k, b in local.blobs.items()
    }
    open_graph(s3, "btc", verify="full")


def test_bad_orders_and_blobs_are_refused(tmp_path, capsys):
    uri = f"file://{tmp_path}"
    prepare_dataset(uri, "bitcoin-otc", feature_dim=4)
    graph = open_graph(uri, "bitcoin-otc")
    with pytest.raises(SystemExit) as exc:  # an unknown order: usage error, exit 2
        main(["datasets", "reorder", "bitcoin-otc", "--store", uri, "--reorder", "sideways"])
    assert exc.value.code == 2 and "sideways" in capsys.readouterr().err
    with pytest.raises(InvalidRequest, match="sideways"):
        rs.reorder_stored(graph, uri, "sideways")
    assert main(["datasets", "reorder", "nograph", "--store", uri, "--reorder", "bfs"]) != 0
    # a blob whose rows are not the vertices' cannot follow them
    graph.manifest.blobs["mystery"] = graph.manifest.blobs["labels"]
    with pytest.raises(InvalidRequest, match="mystery"):
        rs.reorder_stored(graph, uri, "bfs", "other")
    assert open_graph(uri, "bitcoin-otc").manifest.extra.get("reorder") is None
