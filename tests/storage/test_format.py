"""Graph store format v1: integrity checks name the blob at fault."""

from __future__ import annotations

import json

import numpy as np
import pytest

from gnn_faas.errors import BlobNotFound, CorruptBlob, InvalidRequest, NotFound
from gnn_faas.storage.backends import open_backend
from gnn_faas.storage.datasets import prepare_dataset
from gnn_faas.storage.format import list_graphs, open_graph, self_loop_counts, write_graph

BLOBS = ["indptr", "indices", "features", "labels", "degree", "node_ids", "request_order"]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> str:
    """Bitcoin OTC (every optional blob present) in a pristine store; tests copy it."""
    store = f"file://{tmp_path_factory.mktemp('pristine')}"
    prepare_dataset(store, "bitcoin-otc", feature_dim=8)
    return store


@pytest.fixture
def store(prepared, tmp_path):
    """A private copy of the prepared graph, safe to damage."""
    src, dst = open_backend(prepared), open_backend(str(tmp_path))
    for key in src.ls("bitcoin-otc/"):
        dst.pipe_file(key, src.cat_file(key))
    return dst


def test_round_trip(store):
    g = open_graph(store, "bitcoin-otc", verify="full")
    assert set(g.manifest.blobs) == set(BLOBS)
    assert list_graphs(store) == ["bitcoin-otc"]
    indptr, indices = g.read_blob("indptr"), g.read_blob("indices")
    assert indptr.dtype == np.dtype("<i8") and indices.dtype == np.dtype("<i4")
    assert indptr[-1] == indices.size == g.num_edges
    assert np.array_equal(g.read_blob("degree"), np.bincount(indices, minlength=g.num_nodes))
    assert g.info("features").row_bytes == 8 * 4


@pytest.mark.parametrize("key", BLOBS)
def test_flipped_byte_is_rejected_by_full_verification(store, key):
    path = f"bitcoin-otc/{key}.bin"
    data = bytearray(store.cat_file(path))
    data[len(data) // 2] ^= 0x01
    store.pipe_file(path, bytes(data))
    open_graph(store, "bitcoin-otc", verify="size")  # same size: only the hash can tell
    with pytest.raises(CorruptBlob, match=rf"{key}\.bin.*sha256"):
        open_graph(store, "bitcoin-otc", verify="full")


@pytest.mark.parametrize("key", BLOBS)
def test_truncated_blob_is_rejected_by_size_verification(store, key):
    path = f"bitcoin-otc/{key}.bin"
    store.pipe_file(path, store.cat_file(path)[:-4])
    with pytest.raises(CorruptBlob, match=rf"{key}\.bin.*truncated"):
        open_graph(store, "bitcoin-otc", verify="size")


@pytest.mark.parametrize("key", ["indices", "request_order"])
def test_missing_blob_is_named(store, key):
    store.rm(f"bitcoin-otc/{key}.bin")
    with pytest.raises(BlobNotFound, match=rf"{key}\.bin.*missing"):
        open_graph(store, "bitcoin-otc")


def test_missing_manifest_is_not_found(store):
    store.rm("bitcoin-otc/manifest.json")
    with pytest.raises(NotFound, match="bitcoin-otc"):
        open_graph(store, "bitcoin-otc")
    assert list_graphs(store) == []


@pytest.mark.parametrize(
    "edit",
    [
        lambda m: "{not json",
        lambda m: json.dumps({**m, "format": "something-else"}),
        lambda m: json.dumps({**m, "version": 99}),
        lambda m: json.dumps({k: v for k, v in m.items() if k != "num_nodes"}),
        lambda m: json.dumps(
            {**m, "blobs": {k: v for k, v in m["blobs"].items() if k != "indptr"}}
        ),
        lambda m: json.dumps(
            {**m, "blobs": {**m["blobs"], "labels": {**m["blobs"]["labels"], "dtype": "|O"}}}
        ),
    ],
)
def test_bad_manifest_is_corrupt(store, edit):
    path = "bitcoin-otc/manifest.json"
    store.pipe_file(path, edit(json.loads(store.cat_file(path))).encode())
    with pytest.raises(CorruptBlob, match="manifest"):
        open_graph(store, "bitcoin-otc", verify="none")


def test_write_graph_rejects_inconsistent_arrays(tmp_path):
    feats = np.zeros((3, 2), np.float32)
    with pytest.raises(InvalidRequest, match="indptr"):
        write_graph(
            str(tmp_path),
            "g",
            indptr=np.array([0, 2, 1, 3]),
            indices=np.zeros(3, np.int32),
            features=feats,
            symmetrized=False,
        )
    with pytest.raises(InvalidRequest, match="features"):
        write_graph(
            str(tmp_path),
            "g",
            indptr=np.array([0, 1, 2, 3]),
            indices=np.zeros(3, np.int32),
            features=feats[:2],
            symmetrized=False,
        )
    with pytest.raises(InvalidRequest, match="graph name"):
        write_graph(
            str(tmp_path),
            "../x",
            indptr=np.array([0, 1, 2, 3]),
            indices=np.zeros(3, np.int32),
            features=feats,
            symmetrized=False,
        )
    assert list_graphs(str(tmp_path)) == []


@pytest.mark.parametrize("chunk", [1, 2, 3, 1 << 24])
def test_self_loop_counts_any_chunking(chunk):
    # rows: 0 <- {0, 0, 3}, 1 <- {}, 2 <- {2}, 3 <- {1, 3, 3, 3}, 4 <- {0}
    indptr = np.array([0, 3, 3, 4, 8, 9])
    indices = np.array([0, 0, 3, 2, 1, 3, 3, 3, 0])
    assert self_loop_counts(indptr, indices, chunk).tolist() == [2, 0, 1, 3, 0]
    assert self_loop_counts(np.array([0]), np.array([], np.int64)).tolist() == []
    assert self_loop_counts(np.zeros(3, np.int64), np.array([], np.int64)).tolist() == [0, 0]
