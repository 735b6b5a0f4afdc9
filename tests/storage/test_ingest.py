"""Ingest: edge-list parsing in every layout, id remapping, cleaning, the CSR."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from gnn_faas.cli import main
from gnn_faas.errors import InvalidRequest, NotFound
from gnn_faas.storage.format import open_graph
from gnn_faas.storage.ingest import (
    build_csr,
    ingest,
    read_edges,
    read_text_edges,
    remap_ids,
)

BITCOIN = Path(__file__).parents[2] / "gnn_faas" / "data" / "bitcoin_otc.npz"


@pytest.fixture(scope="module")
def bitcoin() -> dict[str, np.ndarray]:
    with np.load(BITCOIN, allow_pickle=False) as z:
        return {k: z[k] for k in ("src", "dst", "rating", "time")}


def reference_csr(src, dst, node_ids) -> sp.csr_matrix:
    """The in-edge CSR built by scipy: row = local dst, column = local src."""
    s = np.searchsorted(node_ids, src)
    d = np.searchsorted(node_ids, dst)
    n = node_ids.size
    m = sp.coo_matrix((np.ones(s.size, np.int64), (d, s)), shape=(n, n)).tocsr()
    m.sum_duplicates()
    m.sort_indices()
    return m


def csr_of(graph) -> sp.csr_matrix:
    n = graph.num_nodes
    data = np.ones(graph.indices.size, np.int64)
    return sp.csr_matrix((data, graph.indices, graph.indptr), shape=(n, n))


def write_snap(path: Path, bitcoin, sep: str, header: str | None, comments: bool) -> None:
    """Bitcoin OTC in a SNAP-like text layout (SOURCE, TARGET, RATING, TIME)."""
    cols = np.stack([bitcoin["src"], bitcoin["dst"], bitcoin["rating"], bitcoin["time"]], 1)
    lines = [sep.join(map(str, row)) for row in cols.tolist()]
    if comments:
        lines[100:100] = ["# a comment in the middle", "", "   "]
        lines.insert(0, "# Bitcoin OTC\t(who-trusts-whom)")
    if header:
        lines.insert(1 if comments else 0, header)
    text = "\n".join(lines) + "\n"
    if path.suffix == ".gz":
        with gzip.open(path, "wt") as fh:
            fh.write(text)
    else:
        path.write_text(text)


@pytest.mark.parametrize(
    "fname,sep,header,comments",
    [
        ("otc.csv", ",", None, False),  # SNAP's soc-sign-bitcoinotc.csv layout
        ("otc.csv", ", ", "SOURCE,TARGET,RATING,TIME", False),
        ("otc.tsv", "\t", "# FromNodeId\tToNodeId", True),
        ("otc.txt", "  ", "src dst rating time", True),
        ("otc.csv.gz", ",", "source,target,rating,time", True),
    ],
)
def test_text_layouts_parse_to_the_same_edges(tmp_path, bitcoin, fname, sep, header, comments):
    path = tmp_path / fname
    write_snap(path, bitcoin, sep, header, comments)
    src, dst = read_edges(path)
    assert np.array_equal(src, bitcoin["src"]) and np.array_equal(dst, bitcoin["dst"])


@pytest.mark.parametrize("block", [7, 64, 1000, 1 << 20])
def test_block_boundaries_do_not_matter(tmp_path, bitcoin, block):
    path = tmp_path / "otc.tsv"
    write_snap(path, {k: v[:500] for k, v in bitcoin.items()}, "\t", "src\tdst", True)
    src, dst = read_text_edges(path, block_bytes=block)
    assert np.array_equal(src, bitcoin["src"][:500]) and np.array_equal(dst, bitcoin["dst"][:500])


def test_npz_source_and_the_csr_equals_scipy(tmp_path, bitcoin):
    path = tmp_path / "edges.npz"
    np.savez(path, src=bitcoin["src"], dst=bitcoin["dst"])
    src, dst = read_edges(path)
    g = build_csr(src, dst)
    assert (g.num_nodes, g.num_edges) == (5881, 35592)  # the datasets README
    assert g.indices.dtype == np.int32 and g.indptr.dtype == np.int64
    ref = reference_csr(bitcoin["src"], bitcoin["dst"], g.node_ids)
    assert np.array_equal(g.indptr, ref.indptr) and np.array_equal(g.indices, ref.indices)


def test_id_remap_round_trip(bitcoin):
    src, dst = bitcoin["src"] * 1_000_003 + 17, bitcoin["dst"] * 1_000_003 + 17  # sparse ids
    g = build_csr(src, dst)
    assert np.all(np.diff(g.node_ids) > 0)
    rows = np.repeat(np.arange(g.num_nodes), np.diff(g.indptr))
    back = np.stack([g.node_ids[g.indices], g.node_ids[rows]], 1)  # (src, dst) original
    want = np.stack([src, dst], 1)
    assert np.array_equal(np.unique(back, axis=0), np.unique(want, axis=0))
    # the dense (presence map) and sparse (np.unique) paths agree
    ids_a, s_a, d_a = remap_ids(bitcoin["src"], bitcoin["dst"])
    ids_b, s_b, d_b = remap_ids(src, dst)
    assert np.array_equal(ids_a * 1_000_003 + 17, ids_b)
    assert np.array_equal(s_a, s_b) and np.array_equal(d_a, d_b)


def test_self_loops_and_duplicates_dropped_only_on_request(bitcoin):
    src = np.concatenate([bitcoin["src"], bitcoin["src"][:100], [3, 3, 7]])
    dst = np.concatenate([bitcoin["dst"], bitcoin["dst"][:100], [3, 3, 7]])
    kept = build_csr(src, dst)
    assert kept.num_edges == src.size
    clean = build_csr(src, dst, drop_self_loops=True, dedupe=True)
    assert clean.num_edges == 35592
    assert clean.counts == {
        "edges_in": src.size,
        "self_loops_dropped": 3,
        "duplicates_dropped": 100,
    }
    rows = np.repeat(np.arange(clean.num_nodes), np.diff(clean.indptr))
    assert not np.any(rows == clean.indices)
    # duplicates without dedupe: same rows, the multiset kept
    ref = reference_csr(src, dst, kept.node_ids)
    assert (csr_of(kept) != ref).nnz == 0 and ref.max() == 2


def test_symmetrize(bitcoin):
    g = build_csr(bitcoin["src"], bitcoin["dst"], symmetrize=True)
    a = csr_of(g)
    assert (a != a.T).nnz == 0 and a.max() == 1
    und = np.unique(np.sort(np.stack([bitcoin["src"], bitcoin["dst"]], 1), axis=1), axis=0)
    assert g.num_edges == 2 * und.shape[0]
    assert g.symmetrized


@settings(max_examples=60, deadline=None)
@given(
    edges=st.lists(
        st.tuples(st.integers(0, 2**40), st.integers(0, 2**40)),
        min_size=1,
        max_size=60,
    ),
    loops=st.lists(st.integers(0, 59), max_size=5),
    symmetrize=st.booleans(),
    clean=st.booleans(),
    block=st.integers(4, 200),
)
def test_random_edge_lists_match_scipy(tmp_path_factory, edges, loops, symmetrize, clean, block):
    """Any ids >= 0 (sparse, huge, repeated), through the text parser in any block
    size, give scipy's CSR (duplicates merged when cleaning)."""
    pairs = np.array(edges, dtype=np.int64)
    for i in loops:  # some self loops and duplicates
        pairs = np.vstack([pairs, pairs[i % len(pairs)], [pairs[i % len(pairs), 0]] * 2])
    path = tmp_path_factory.mktemp("h") / "e.txt"
    path.write_text("src dst\n" + "".join(f"{a}\t{b}\t0.5\n" for a, b in pairs.tolist()))
    src, dst = read_text_edges(path, block_bytes=block)
    assert np.array_equal(src, pairs[:, 0]) and np.array_equal(dst, pairs[:, 1])
    g = build_csr(src, dst, symmetrize=symmetrize, drop_self_loops=clean, dedupe=clean)
    assert np.array_equal(g.node_ids, np.unique(pairs))
    if clean:
        src, dst = src[src != dst], dst[src != dst]
    if symmetrize:
        src, dst = np.r_[src, dst], np.r_[dst, src]
    ref = reference_csr(src, dst, g.node_ids)
    if clean or symmetrize:  # deduplicated: exactly scipy's canonical CSR
        assert np.array_equal(g.indptr, ref.indptr) and np.array_equal(g.indices, ref.indices)
    else:  # every edge kept: scipy's counts of each (row, column)
        assert (csr_of(g) != ref).nnz == 0 and g.num_edges == len(pairs)
    rows = np.repeat(np.arange(g.num_nodes), np.diff(g.indptr))
    assert np.all(np.diff(rows * (g.num_nodes + 1) + g.indices) >= 0)  # rows, then sources sorted


def test_ingest_writes_the_graph_with_random_features(tmp_path, bitcoin):
    path = tmp_path / "otc.csv"
    write_snap(path, bitcoin, ",", None, False)
    store = f"file://{tmp_path / 'store'}"
    res = ingest(path, store, "otc", random_dim=8, seed=3)
    g = open_graph(store, "otc", verify="full")
    assert (g.num_nodes, g.num_edges, g.manifest.feature_dim) == (5881, 35592, 8)
    feats = g.read_blob("features")
    assert np.array_equal(feats, np.random.default_rng(3).standard_normal((5881, 8), np.float32))
    assert np.array_equal(g.read_blob("node_ids"), np.unique(np.r_[bitcoin["src"], bitcoin["dst"]]))
    assert res.manifest.extra["source"] == "otc.csv"
    # degree.bin is the out-degree: how many ratings a user gave
    out = np.bincount(np.searchsorted(g.read_blob("node_ids"), bitcoin["src"]), minlength=5881)
    assert np.array_equal(g.read_blob("degree"), out)


def test_features_and_labels_files_in_both_alignments(tmp_path, bitcoin):
    src, dst = bitcoin["src"], bitcoin["dst"]
    path = tmp_path / "e.npz"
    np.savez(path, src=src, dst=dst)
    ids = np.unique(np.r_[src, dst])
    rng = np.random.default_rng(0)
    by_id = rng.standard_normal((ids.max() + 1, 4)).astype(np.float32)  # indexed by original id
    np.save(tmp_path / "by_id.npy", by_id)
    np.save(tmp_path / "by_row.npy", by_id[ids])  # one row per vertex, sorted ids
    labels = (ids % 3).astype(np.int64)
    np.save(tmp_path / "labels.npy", labels)
    store = tmp_path / "s"
    ingest(path, str(store), "a", features=tmp_path / "by_id.npy", labels=tmp_path / "labels.npy")
    ingest(path, str(store), "b", features=tmp_path / "by_row.npy")
    a, b = open_graph(str(store), "a"), open_graph(str(store), "b")
    assert np.array_equal(a.read_blob("features"), by_id[ids])
    assert np.array_equal(a.read_blob("features"), b.read_blob("features"))
    assert np.array_equal(a.read_blob("labels"), labels) and a.manifest.num_classes == 3
    np.save(tmp_path / "short.npy", by_id[:10])
    with pytest.raises(InvalidRequest, match="10 rows"):
        ingest(path, str(store), "c", features=tmp_path / "short.npy")


def test_empty_and_missing_sources(tmp_path):
    (tmp_path / "empty.txt").write_text("# nothing here\n\n")
    with pytest.raises(InvalidRequest, match="no edges"):
        read_edges(tmp_path / "empty.txt")
    with pytest.raises(NotFound):
        read_edges(tmp_path / "absent.txt")


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    "content,expect",
    [
        ("1 2\n3 4\n5 oops\n", "line 3"),
        ("src dst\n1 2\n# c\nx y\n", "line 4"),  # a second non-numeric line is no header
        ("1 2\n3\n", "line 2"),
        ("1 2\n3 4.5\n", "'3 4.5'"),
        ("# ids\n1 2\n3 99999999999999999999\n", "line 3"),  # beyond int64
        ("1 2\n3 -4\n", "line 2: negative vertex id"),
        ("# c\n\n-1,2\n", "line 3: negative vertex id"),
        ("1 2\n3 4\n\n5 6 7 8\n", "line 4: 4 columns where the file's rows have 2"),
        ("1 2 0.5\n3 4\n", "line 2: 2 columns where the file's rows have 3"),
    ],
)
def test_cli_reports_bad_lines(tmp_path, capsys, content, expect):
    path = tmp_path / "bad.txt"
    path.write_text(content)
    code, out, err = run_cli(capsys, "ingest", str(path), "--name", "g", "--store", str(tmp_path))
    assert code == 2
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "bad.txt" in err and expect in err


def test_cli_bad_inputs(tmp_path, capsys):
    store = str(tmp_path / "store")
    np.savez(tmp_path / "wrong.npz", a=np.arange(3), b=np.arange(3))
    (tmp_path / "garbage.npz").write_bytes(b"not a zip at all")
    (tmp_path / "broken.txt.gz").write_bytes(gzip.compress(b"1 2\n" * 1000)[:-40] + b"x" * 40)
    cases = [
        ([str(tmp_path / "missing.txt")], "missing.txt"),
        ([str(tmp_path / "wrong.npz")], "'src' and 'dst'"),
        ([str(tmp_path / "garbage.npz")], "garbage.npz"),
        ([str(tmp_path / "broken.txt.gz")], "broken.txt.gz"),
        ([str(tmp_path)], "directory"),
    ]
    for argv, expect in cases:
        code, out, err = run_cli(capsys, "ingest", *argv, "--name", "g", "--store", store)
        assert code == 2, argv
        assert err.count("\n") == 1 and expect in err, err
    # mutually exclusive feature options: argparse's usage error, exit 2
    with pytest.raises(SystemExit) as exc:
        main(["ingest", "x.txt", "--name", "g", "--features", "f.npy", "--random-features", "4"])
    assert exc.value.code == 2


def test_cli_ingest_prints_a_summary(tmp_path, capsys, bitcoin):
    path = tmp_path / "otc.csv.gz"
    write_snap(path, bitcoin, ",", None, False)
    store = f"file://{tmp_path / 'store'}"
    code, out, err = run_cli(
        capsys, "ingest", str(path), "--name", "otc", "--store", store, "--symmetrize"
    )
    assert code == 0 and err == ""
    g = open_graph(store, "otc")
    assert g.manifest.symmetrized and f"{g.num_edges} edges" in out
    assert g.manifest.feature_dim == 16  # the default random dimension


@pytest.mark.slow
def test_a_million_edges(tmp_path):
    """Chunked parsing of a 1M-edge list crossing many blocks; counts checked."""
    rng = np.random.default_rng(7)
    m, n = 1_000_000, 200_000
    src = (n * rng.random(m) ** 3).astype(np.int64) * 5 + 2  # power-law-ish, sparse ids
    dst = rng.integers(0, n, m) * 5 + 2
    path = tmp_path / "big.txt"
    with open(path, "w") as fh:
        fh.write("# FromNodeId\tToNodeId\n")
        np.savetxt(fh, np.stack([src, dst], 1), fmt="%d", delimiter="\t")
    s, d = read_text_edges(path, block_bytes=1 << 20)
    assert np.array_equal(s, src) and np.array_equal(d, dst)
    g = build_csr(s, d, dedupe=True, drop_self_loops=True)
    keys = np.unique(src[src != dst] * (10 * n) + dst[src != dst])
    assert g.num_edges == keys.size
    assert g.num_nodes == np.unique(np.r_[src, dst]).size


def test_cli_ingest_computes_workload_metrics(tmp_path, capsys, bitcoin):
    """``--metrics 10,5``: PSGS and FAP stored at ingest, equal to what the
    ``datasets metrics`` command computes on the stored graph."""
    from gnn_faas.storage.workload_metrics import fap, psgs

    path = tmp_path / "otc.csv.gz"
    write_snap(path, bitcoin, ",", None, False)
    store = f"file://{tmp_path / 'store'}"
    code, out, err = run_cli(capsys, "ingest", str(path), "--name", "otc", "--store", store,
                             "--symmetrize", "--metrics", "10,5")  # fmt: skip
    assert code == 0 and err == "" and "PSGS and FAP for fanouts 10,5" in out
    g = open_graph(store, "otc")
    indptr, indices = g.read_blob("indptr"), g.read_blob("indices")
    np.testing.assert_allclose(g.read_blob("psgs"), psgs(indptr, indices, [10, 5]), rtol=1e-6)
    assert g.read_blob("fap").shape == (g.num_nodes,)
    assert np.all(g.read_blob("psgs") >= 1)
    uniform = fap(indptr, indices, [10, 5], np.full(g.num_nodes, 1.0 / g.num_nodes))
    np.testing.assert_allclose(g.read_blob("fap"), uniform, rtol=1e-5)
    # bad fanouts are refused before anything is ingested
    code, _, err = run_cli(capsys, "ingest", str(path), "--name", "otc2", "--store", store,
                           "--metrics", "0,5")  # fmt: skip
    assert code == 2 and "fanout" in err
    with pytest.raises(NotFound):
        open_graph(store, "otc2")


def test_npz_with_a_negative_id_is_refused(tmp_path, capsys):
    np.savez(tmp_path / "neg.npz", src=np.array([0, 1, 2]), dst=np.array([1, -2, 0]))
    code, _, err = run_cli(
        capsys, "ingest", str(tmp_path / "neg.npz"), "--name", "g", "--store", str(tmp_path)
    )
    assert code == 2 and "neg.npz: dst[1] = -2: vertex ids must be >= 0" in err
