"""A memory function's view of the rows a graph's versions set (functions/row_versions.py).

A log of a few hundred versions (mostly edges, some adding vertices or setting
rows, one compaction) is read by :class:`RowVersions` the ways a memory function
does: up to each call's rows version, the rest behind the calls. At every
version the vertex count and every row must equal a plain replay of the
batches; an edge-only stretch costs the calls no read, and one started late
(or after the compaction) catches up in one go and reaches back past the
compaction for a call on an older version.
"""

from __future__ import annotations

import time

import numpy as np

from gnn_faas.functions.row_versions import FOLLOW_LAG, RowVersions
from gnn_faas.storage.backends import open_backend
from gnn_faas.storage.compaction import compact
from gnn_faas.storage.delta import UpdateBatch
from gnn_faas.storage.format import GraphHandle, open_graph
from tests.storage.test_versions import DIM, make_graph, versions_of


def row_reader(backend, prefix: str):
    graph = GraphHandle(backend, "g", prefix=prefix)
    feats = np.asarray(graph.read_blob("features"), np.float32)
    return graph, lambda ids: feats[np.asarray(ids, np.int64)]


def check_versions(rv: RowVersions, history: dict, versions) -> None:
    for v in versions:
        count, want = history[v]
        assert rv.nodes_at(v) == count, v
        ids = np.arange(count)
        mask, got = rv.split(ids, v)
        out = np.empty((count, DIM), np.float32)
        out[mask] = got
        out[~mask] = rv.base_at(v).load_rows(ids[~mask])
        assert np.array_equal(out, np.stack([want[i] for i in range(count)])), v


def test_rows_and_counts_at_every_version_of_a_log_with_a_compaction(tmp_path):
    uri = f"file://{tmp_path}"
    _, _, feats = make_graph(uri, symmetrized=False)
    backend = open_backend(uri)
    gv = versions_of(uri)
    graph, load = row_reader(backend, open_graph(backend, "g").prefix)
    follower = RowVersions(graph, load, lambda p: row_reader(backend, p), lambda ids: None)
    rng = np.random.default_rng(3)
    rows = {i: feats[i] for i in range(feats.shape[0])}
    history = {0: (len(rows), dict(rows))}  # version -> (vertex count, rows)
    compacted = None
    for step in range(240):
        n = len(rows)
        arrays: dict = {"add_edges": rng.integers(0, n, (3, 2))}
        if step % 40 == 7:  # a new vertex
            arrays["new_features"] = rng.standard_normal((1, DIM)).astype(np.float32)
        if step % 40 == 21:  # a row set
            arrays["feature_ids"] = [int(rng.integers(0, n))]
            arrays["features"] = rng.standard_normal((1, DIM)).astype(np.float32)
        rec, _ = gv.commit(UpdateBatch.from_arrays(arrays))
        if "new_features" in arrays:
            rows[n] = arrays["new_features"][0]
        if "feature_ids" in arrays:
            rows[arrays["feature_ids"][0]] = arrays["features"][0]
        history[rec.version] = (len(rows), dict(rows))
        if step == 150:
            compacted = compact(backend, "g", grace_s=3600)["version"]
            history[compacted] = (len(rows), dict(rows))
            gv.refresh()
        # as a memory function: what the call needs, then the rest behind it
        follower.ensure(gv.state.rows_version)
        follower.follow(gv.state.version)
    latest = gv.state.version
    deadline = time.monotonic() + 60
    while follower.known < latest - FOLLOW_LAG:
        assert time.monotonic() < deadline, follower.figures()
        time.sleep(0.02)
    follower.ensure(latest)  # a call on the newest rows
    check_versions(follower, history, sorted(history))
    # one started late reads the log since the newest base in one go
    graph, load = row_reader(backend, open_graph(backend, "g").prefix)
    dropped: list[np.ndarray] = []
    late = RowVersions(graph, load, lambda p: row_reader(backend, p), dropped.append)
    assert late.known == latest
    check_versions(late, history, [v for v in sorted(history) if v >= compacted])
    assert late.bases[0].version == compacted - 1 and len(late.bases) == 1
    # and is called on a version before the compaction (a request in flight across it):
    # the older base and its log, every row the two bases disagree on kept out of the cache
    late.reach_back(compacted - 100)
    assert [b.version for b in late.bases] == [0, compacted - 1]
    check_versions(late, history, sorted(history))
    before, now = history[0][1], history[compacted][1]
    differ = {i for i in before if not np.array_equal(before[i], now[i])}
    differ |= set(now) - set(before)
    assert differ and differ <= set(np.concatenate(dropped).tolist())
    assert differ <= set(late.changed.tolist())


def test_an_edge_only_stretch_is_read_behind_the_calls(tmp_path):
    uri = f"file://{tmp_path}"
    make_graph(uri, symmetrized=False)
    backend = open_backend(uri)
    gv = versions_of(uri)
    gv.commit(UpdateBatch.from_arrays({"feature_ids": [1], "features": np.ones((1, DIM))}))
    rows_version = gv.state.rows_version
    graph, load = row_reader(backend, open_graph(backend, "g").prefix)
    rv = RowVersions(graph, load, lambda p: row_reader(backend, p), lambda ids: None)
    for _ in range(300):
        gv.commit(UpdateBatch.from_arrays({"add_edges": [[0, 1]]}))
        v = gv.state.version
        assert gv.state.rows_version == rows_version
        rv.ensure(gv.state.rows_version)  # what a call waits for
        rv.follow(v)  # the rest, behind it
    deadline = time.monotonic() + 60
    while rv.known < gv.state.version - FOLLOW_LAG:
        assert time.monotonic() < deadline, rv.figures()
        time.sleep(0.02)
    figures = rv.figures()
    assert figures["segments_read_on_calls"] == 0 and figures["segments_read"] == rv.known
    assert rv.known > rows_version
    assert rv.nodes_at(gv.state.version) == graph.num_nodes
