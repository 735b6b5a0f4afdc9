"""``gnn-faas datasets verify``: each kind of corruption found and named (storage/verify.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from gnn_faas.cli import main
from gnn_faas.storage.format import open_graph, write_graph
from gnn_faas.storage.verify import verify_graph


@pytest.fixture
def stored(tmp_path):
    rng = np.random.default_rng(0)
    n = 500
    indptr = np.concatenate(([0], np.cumsum(rng.integers(0, 5, n)))).astype(np.int64)
    indices = rng.integers(0, n, int(indptr[-1]))
    write_graph(
        f"file://{tmp_path}", "g", indptr=indptr, indices=indices,
        features=rng.standard_normal((n, 8)).astype(np.float32), symmetrized=False,
    )  # fmt: skip
    return tmp_path


def flip(path, offset: int = 0) -> None:
    raw = bytearray(path.read_bytes())
    raw[offset] ^= 0x10
    path.write_bytes(bytes(raw))


def report(path) -> dict:
    return verify_graph(open_graph(f"file://{path}", "g", verify="none"))


def test_an_intact_graph_verifies(stored):
    r = report(stored)
    assert r["ok"] and r["csr"] == "ok" and set(r["blobs"].values()) == {"ok"}


@pytest.mark.parametrize("blob", ["features", "indices", "indptr", "degree"])
def test_a_same_size_change_is_found_in_its_blob(stored, blob):
    flip(stored / "g" / f"{blob}.bin", 9)
    r = report(stored)
    assert not r["ok"]
    assert "sha256" in r["blobs"][blob]
    assert all(v == "ok" for k, v in r["blobs"].items() if k != blob)


def test_truncated_and_missing_blobs_are_named(stored):
    (stored / "g" / "labels.bin").unlink(missing_ok=True)
    f = stored / "g" / "features.bin"
    f.write_bytes(f.read_bytes()[:-4])
    r = report(stored)
    assert "bytes, manifest says" in r["blobs"]["features"]
    if "labels" in r["blobs"]:
        assert "no blob" in r["blobs"]["labels"]


def test_the_cli_exits_1_on_corruption_and_0_when_intact(stored, capsys):
    uri = f"file://{stored}"
    assert main(["datasets", "verify", "--store", uri, "--graph", "g"]) == 0
    assert "graph g: ok" in capsys.readouterr().out
    flip(stored / "g" / "indices.bin", 3)
    assert main(["datasets", "verify", "--store", uri, "--graph", "g", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert not doc["ok"] and "sha256" in doc["blobs"]["indices"]
    assert main(["datasets", "verify", "--store", uri, "--graph", "nope"]) == 2
    assert "no graph 'nope'" in capsys.readouterr().err


def test_digests_are_added_to_an_older_store(stored):
    uri = f"file://{stored}"
    graph = open_graph(uri, "g")
    # an older store: the manifest without chunk digests
    import dataclasses

    old = {k: dataclasses.replace(i, chunk_bytes=0, chunks_sha256="") for k, i in
           graph.manifest.blobs.items()}  # fmt: skip
    manifest = dataclasses.replace(graph.manifest, blobs=old)
    (stored / "g" / "manifest.json").write_text(manifest.to_json())
    assert open_graph(uri, "g").chunk_digests("features") is None
    r = verify_graph(open_graph(uri, "g", verify="none"), add_digests=True)
    assert r["ok"] and "features" in r["digests_added"]
    assert open_graph(uri, "g", verify="full").chunk_digests("features") is not None
