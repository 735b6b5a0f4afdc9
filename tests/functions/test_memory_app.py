"""The memory function app: every endpoint on Bitcoin OTC, and bad input -> 4xx JSON."""

from __future__ import annotations

import numpy as np
import pytest

from gnn_faas.functions.aggregate import aggregate, combine_partials, slice_rows
from gnn_faas.functions.memory_app import (
    WARM_SHARE,
    MemoryFunctionConfig,
    create_memory_app,
    warm_rows,
)
from gnn_faas.storage.computation_graph import cg_from_tensors
from gnn_faas.storage.datasets import ensure_dataset
from gnn_faas.storage.fetcher import KHopFetcher
from gnn_faas.wire import FRAME_MIME, decode_frame, encode_frame


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> str:
    uri = f"file://{tmp_path_factory.mktemp('store')}"
    ensure_dataset(uri, "bitcoin-otc")
    return uri


@pytest.fixture(scope="module")
def fetcher(store) -> KHopFetcher:
    return KHopFetcher(ensure_dataset(store, "bitcoin-otc"))


@pytest.fixture(scope="module")
def features(fetcher) -> np.ndarray:
    return np.array(fetcher.graph.read_blob("features"), dtype=np.float32)


@pytest.fixture(scope="module")
def client(store):
    app = create_memory_app(MemoryFunctionConfig(store=store, graph="bitcoin-otc", memory_mb=2048))
    return app.test_client()


@pytest.fixture(scope="module")
def cg(fetcher):
    order = fetcher.graph.read_blob("request_order").astype(np.int64)
    return fetcher.fetch(order[:12], 2, degrees=True)


def post_frame(client, path, tensors, params=None):
    return client.post(path, data=encode_frame(tensors, params), content_type=FRAME_MIME)


def frame_of(resp):
    assert resp.status_code == 200, resp.get_json()
    assert resp.mimetype == FRAME_MIME
    return decode_frame(resp.data)[0]


def block_tensors(cg, layer=1):
    b = cg.block(layer)
    return b, {"indptr": b.indptr, "indices": b.indices, "src_ids": cg.nodes[: b.num_src]}


def good_request_works(client, cg, features):
    b, t = block_tensors(cg)
    out = frame_of(post_frame(client, "/v1/aggregate", t, {"op": "mean", "num_dst": b.num_dst}))
    np.testing.assert_allclose(out["agg"], aggregate("mean", b, features[t["src_ids"]]), rtol=1e-6)


def test_health(client):
    assert client.get("/v2/health/live").get_json() == {"live": True}
    assert client.get("/v2/health/ready").get_json() == {"ready": True}


@pytest.mark.parametrize("as_json", [True, False])
def test_graph_equals_the_fetcher(client, fetcher, as_json):
    targets = [3, 99, 3, 1500]
    params = {"targets": targets, "hops": 2, "fanouts": [6, 4], "seed": 3}
    if as_json:
        resp = client.post("/v1/graph", json=params)
    else:
        params.pop("targets")
        resp = post_frame(client, "/v1/graph", {"targets": np.array(targets)}, params)
    got = cg_from_tensors(frame_of(resp))
    want = fetcher.fetch(targets, 2, fanouts=[6, 4], seed=3, degrees=True)
    assert got.layer_sizes == want.layer_sizes
    for name in ("nodes", "indptr", "indices", "target_index", "in_degree"):
        np.testing.assert_array_equal(getattr(got, name), getattr(want, name))
    no_deg = cg_from_tensors(frame_of(client.post("/v1/graph", json={**params, "targets": targets,
                                                                   "degrees": False})))  # fmt: skip
    assert no_deg.in_degree is None


@pytest.mark.parametrize("op", ["sum", "mean", "max", "gcn", "gin"])
def test_layer1_aggregate_reads_rows_through_the_cache(client, cg, features, op):
    b, t = block_tensors(cg)
    params = {"op": op, "num_dst": b.num_dst, "eps": 0.25, "return_root": op == "mean"}
    if op == "gcn":
        t["deg_src"] = cg.in_degree[: b.num_src]
    before = client.get("/v1/stats").get_json()["cache"]
    out = frame_of(post_frame(client, "/v1/aggregate", t, params))
    after = client.get("/v1/stats").get_json()["cache"]
    x = features[t["src_ids"]]
    extras = {"deg_src": t["deg_src"]} if op == "gcn" else {}
    np.testing.assert_allclose(out["agg"], aggregate(op, b, x, eps=0.25, **extras), rtol=1e-5)
    if op == "mean":
        np.testing.assert_array_equal(out["root"], x[: b.num_dst])
    assert after["lookups"] - before["lookups"] == b.num_src
    assert after["hits"] + after["misses"] == after["lookups"]
    if op != "sum":  # the first test filled the cache with these rows
        assert after["hits"] - before["hits"] == b.num_src


def test_later_layer_with_shipped_rows_and_row_slices(client, cg, features):
    b, t = block_tensors(cg, 2)
    h = np.random.default_rng(0).standard_normal((b.num_src, 16)).astype(np.float32)
    t["h"] = h
    t["deg_src"] = cg.in_degree[: b.num_src]
    full = aggregate("gcn", b, h, deg_src=t["deg_src"])
    out = frame_of(post_frame(client, "/v1/aggregate", t, {"op": "gcn", "num_dst": b.num_dst}))
    np.testing.assert_allclose(out["agg"], full, rtol=1e-6)
    # a partition of the dst rows: rows [a, b) with the sources unchanged, dst_offset = a
    lo, hi = 2, b.num_dst - 1
    s = slice_rows(b, lo, hi)
    part = dict(t, indptr=s.indptr, indices=s.indices)
    out = frame_of(post_frame(client, "/v1/aggregate", part,
                              {"op": "gcn", "num_dst": s.num_dst, "dst_offset": lo}))  # fmt: skip
    np.testing.assert_allclose(out["agg"], full[lo:hi], rtol=1e-6)


def test_gat_and_partial_aggregates_combine(client, cg):
    b, t = block_tensors(cg, 2)
    rng = np.random.default_rng(1)
    h = rng.standard_normal((b.num_src, 2, 4)).astype(np.float32)
    a_src = rng.standard_normal((b.num_src, 2)).astype(np.float32)
    a_dst = rng.standard_normal((b.num_dst, 2)).astype(np.float32)
    extras = {"alpha_src": a_src, "alpha_dst": a_dst}
    full = aggregate("gat", b, h, **extras)
    out = frame_of(post_frame(client, "/v1/aggregate", {**t, "h": h, **extras},
                              {"op": "gat", "num_dst": b.num_dst}))  # fmt: skip
    np.testing.assert_allclose(out["agg"], full, rtol=1e-5, atol=1e-6)
    # split every dst row's edges in two source parts, aggregate each partially, combine
    first = np.zeros(b.num_edges, bool)
    first[::2] = True
    parts = []
    for keep, include_self in ((first, True), (~first, False)):
        counts = np.add.reduceat(keep.astype(int), b.indptr[:-1]) if b.num_edges else []
        counts = np.where(np.diff(b.indptr) > 0, counts, 0)
        indptr = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
        p = {**t, "indptr": indptr, "indices": b.indices[keep], "h": h, **extras}
        parts.append(frame_of(post_frame(client, "/v1/aggregate", p, {
            "op": "gat", "num_dst": b.num_dst, "partial": True, "include_self": include_self})))  # fmt: skip
    assert set(parts[0]) == {"max_logit", "exp_sum", "weighted"}
    np.testing.assert_allclose(combine_partials("gat", parts), full, rtol=1e-5, atol=1e-6)


def test_features(client, features):
    ids = [5, 0, 5, 5880]
    out = frame_of(client.post("/v1/features", json={"ids": ids}))
    np.testing.assert_array_equal(out["x"], features[ids])
    out = frame_of(post_frame(client, "/v1/features", {"ids": np.array(ids)}))
    np.testing.assert_array_equal(out["x"], features[ids])


def test_stats_report_the_instance_figures(client):
    s = client.get("/v1/stats").get_json()
    for key in ("requests", "bytes_read", "round_trips", "ranges_requested", "rss_bytes",
                "memory_limit_bytes", "predicted_peak_bytes", "actual_peak_bytes",
                "reexecutions"):  # fmt: skip
        assert isinstance(s[key], int), key
    for key in ("hits", "misses", "hit_rate", "evictions", "admissions", "capacity_rows",
                "rows", "bytes"):  # fmt: skip
        assert key in s["cache"], key
    assert s["memory_limit_bytes"] == 2048 * 2**20 and s["predictor"] == "mlp"
    assert s["bytes_read"] > 0 and s["round_trips"] > 0 and s["requests"] > 0
    assert s["cache"]["rows"] * 512 <= s["cache"]["bytes"]  # 128 float32 per row
    assert s["actual_peak_bytes"] > 0 and s["rss_bytes"] > 0
    assert 0 < s["rss_anon_bytes"] <= s["rss_bytes"]


def _agg(cg, **over):
    b, t = block_tensors(cg)
    t = {**t, **{k: v for k, v in over.items() if not k.startswith("p_")}}
    params = {"op": "mean", "num_dst": b.num_dst}
    params.update({k[2:]: v for k, v in over.items() if k.startswith("p_")})
    return encode_frame({k: v for k, v in t.items() if v is not None}, params)


BAD = {
    "graph: unknown target": ("/v1/graph", {"targets": [1, 123456], "hops": 2}, 400, "123456"),
    "graph: negative id": ("/v1/graph", {"targets": [-1], "hops": 1}, 400, "-1"),
    "graph: ids not integers": ("/v1/graph", {"targets": ["a"], "hops": 1}, 400, "integer"),
    "graph: no targets": ("/v1/graph", {"targets": [], "hops": 1}, 400, "empty"),
    "graph: hops": ("/v1/graph", {"targets": [1], "hops": 99}, 400, "hops"),
    "graph: fanouts": ("/v1/graph", {"targets": [1], "hops": 2, "fanouts": [3]}, 400, "fanout"),
    "graph: fanouts type": (
        "/v1/graph",
        {"targets": [1], "hops": 1, "fanouts": "x"},
        400,
        "fanouts",
    ),
    "features: unknown id": ("/v1/features", {"ids": [7, 9999999]}, 400, "9999999"),
    "features: nested": ("/v1/features", {"ids": [[1, 2]]}, 400, "flat list"),
    "aggregate: JSON body": ("/v1/aggregate", {"op": "mean"}, 400, "missing tensor 'indptr'"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_json_input_is_4xx_and_the_instance_keeps_serving(client, cg, features, case):
    path, body, status, fragment = BAD[case]
    resp = client.post(path, json=body)
    assert resp.status_code == status
    assert fragment in resp.get_json()["error"]
    good_request_works(client, cg, features)


def bad_frames(cg):
    b, t = block_tensors(cg)
    n = b.num_src
    good = _agg(cg)
    unknown = t["src_ids"].copy()
    unknown[3] = 7777777
    out_of_range = t["indices"].copy()
    out_of_range[0] = n + 5
    return {
        "unknown vertex ids": (_agg(cg, src_ids=unknown), 400, "7777777"),
        "wrong dtype indptr": (_agg(cg, indptr=t["indptr"].astype(np.float64)), 400, "'indptr'"),
        "wrong dtype h": (_agg(cg, h=np.zeros((n, 4), np.float64)), 400, "'h' must have dtype"),
        "wrong shape h": (_agg(cg, h=np.zeros((n + 1, 4), np.float32)), 400, "rows"),
        "wrong rank src_ids": (_agg(cg, src_ids=t["src_ids"][:, None]), 400, "'src_ids'"),
        "indices out of range": (_agg(cg, indices=out_of_range), 400, "indices"),
        "indptr vs num_dst": (_agg(cg, p_num_dst=b.num_dst + 1), 400, "num_dst"),
        "unknown op": (_agg(cg, p_op="median"), 400, "median"),
        "gcn without degrees": (_agg(cg, p_op="gcn"), 400, "deg_src"),
        "bad param type": (_agg(cg, p_return_root="yes"), 400, "return_root"),
        "unexpected tensor": (_agg(cg, junk=np.zeros(2)), 400, "junk"),
        "truncated frame": (good[: len(good) - 7], 400, "truncated"),
        "garbage": (b"\x08\x00\x00\x00\x00\x00\x00\x00not json", 400, "JSON"),
        "empty body": (b"", 400, "truncated"),
    }


@pytest.mark.parametrize(
    "case",
    ["unknown vertex ids", "wrong dtype indptr", "wrong dtype h", "wrong shape h",
     "wrong rank src_ids", "indices out of range", "indptr vs num_dst", "unknown op",
     "gcn without degrees", "bad param type", "unexpected tensor", "truncated frame",
     "garbage", "empty body"],
)  # fmt: skip
def test_bad_frames_are_4xx_and_the_instance_keeps_serving(client, cg, features, case):
    body, status, fragment = bad_frames(cg)[case]
    resp = client.post("/v1/aggregate", data=body, content_type=FRAME_MIME)
    assert resp.status_code == status, resp.data
    assert resp.mimetype == "application/json"
    assert fragment in resp.get_json()["error"]
    good_request_works(client, cg, features)


def test_http_errors_are_json(client, cg, features):
    resp = client.get("/v1/nothing")
    assert resp.status_code == 404 and "error" in resp.get_json()
    resp = client.get("/v1/aggregate")
    assert resp.status_code == 405 and "error" in resp.get_json()
    good_request_works(client, cg, features)


def test_oversized_body_is_413(store, features):
    app = create_memory_app(
        MemoryFunctionConfig(store=store, graph="bitcoin-otc", max_body_bytes=4096)
    )
    c = app.test_client()
    big = encode_frame({"ids": np.arange(1000, dtype=np.int64)})
    assert len(big) > 4096
    resp = c.post("/v1/features", data=big, content_type=FRAME_MIME)
    assert resp.status_code == 413 and "exceeds" in resp.get_json()["error"]
    small = encode_frame({"ids": np.arange(10, dtype=np.int64)})
    out = frame_of(c.post("/v1/features", data=small, content_type=FRAME_MIME))
    np.testing.assert_array_equal(out["x"], features[:10])


def test_a_tight_memory_limit_bounds_the_cache(store, fetcher, features):
    # 6 MiB beyond the baseline for the cache and the requests (full 2-hop requests of 8
    # targets peak at ~4 MiB and read ~4000 distinct rows, 2 MiB)
    cfg = MemoryFunctionConfig(store=store, graph="bitcoin-otc", memory_mb=70, baseline_mb=64)
    app = create_memory_app(cfg)
    c = app.test_client()
    order = fetcher.graph.read_blob("request_order").astype(np.int64)
    capacities = []
    for i in range(40):
        cg = fetcher.fetch(order[i * 8 : i * 8 + 8], 2, degrees=True)
        good_request_works(c, cg, features)
        s = c.get("/v1/stats").get_json()
        cache = s["cache"]
        accounted = cache["baseline_bytes"] + cache["bytes"] + s["actual_peak_bytes"]
        assert accounted <= s["memory_limit_bytes"]
        assert cache["rows"] <= cache["capacity_rows"]
        capacities.append(cache["capacity_rows"])
    assert cache["over_limit"] == 0
    # big requests left room for fewer rows than the graph has: the cache gave them up
    assert min(capacities) < fetcher.graph.num_nodes / 2
    assert cache["evictions"] > 0


def test_warm_rows_leave_room_only_when_the_graph_does_not_fit():
    # a cache that holds the whole graph warms all of it
    assert warm_rows(10_000, 5_881) == 5_881
    assert warm_rows(5_881, 5_881) == 5_881
    # one that cannot leaves (1 - WARM_SHARE) of itself to the requests' working sets
    assert warm_rows(5_880, 5_881) == int(5_880 * WARM_SHARE) < 5_880
    assert warm_rows(100, 120_000) == int(100 * WARM_SHARE)
    assert warm_rows(0, 10) == 0


def test_warm_start_holds_the_top_degree_rows(client, fetcher):
    """A new instance starts with the rows of the highest out-degrees, read
    before it is ready: every row, since its cache holds all of Bitcoin OTC."""
    stats = client.get("/v1/stats").get_json()
    assert stats["cache"]["capacity_rows"] >= fetcher.graph.num_nodes
    assert stats["warmed_rows"] == fetcher.graph.num_nodes
    assert stats["cache"]["rows"] >= stats["warmed_rows"] > 0
    # every chunk of the feature blob was read (and verified) to warm it
    info = fetcher.graph.info("features")
    assert stats["verified_chunks"]["features"] == info.num_chunks


def test_corrupt_rows_are_a_500_that_names_the_corruption(tmp_path, features):
    """Rows whose chunk fails its digest are never served: 500 with
    X-Gnn-Faas-Failed: corrupt (the gateway then takes the graph out of service)."""
    uri = f"file://{tmp_path}"
    graph = ensure_dataset(uri, "bitcoin-otc")
    info = graph.info("features")
    blob = tmp_path / "bitcoin-otc" / info.file
    raw = bytearray(blob.read_bytes())
    raw[info.chunk_bytes + 40] ^= 0x20  # chunk 1
    blob.write_bytes(bytes(raw))
    # a cache too small to warm: the rows are read per request
    cfg = MemoryFunctionConfig(store=uri, graph="bitcoin-otc", memory_mb=2048, cache_max_rows=1)
    app = create_memory_app(cfg).test_client()
    rows_per_chunk = info.chunk_bytes // info.row_bytes
    ok = app.post("/v1/features", json={"ids": [0, 1]})
    assert np.array_equal(frame_of(ok)["x"], features[[0, 1]])
    bad = app.post("/v1/features", json={"ids": [rows_per_chunk + 1]})
    assert bad.status_code == 500
    assert bad.headers["X-Gnn-Faas-Failed"] == "corrupt"
    assert "chunk 1" in bad.get_json()["error"]


def test_a_function_started_after_a_compaction_answers_older_versions(tmp_path):
    """A call in flight across a compaction reaches a function started after it:
    the rows are the call's version's, from the older base and its log, even for
    rows this function had cached from the newer base."""
    from gnn_faas import graph_version
    from gnn_faas.storage.backends import open_backend
    from gnn_faas.storage.compaction import compact
    from gnn_faas.storage.delta import UpdateBatch
    from tests.storage.test_versions import DIM, make_graph, versions_of

    uri = f"file://{tmp_path}"
    _, _, feats = make_graph(uri, symmetrized=False)
    gv = versions_of(uri)
    ones, twos = np.ones((1, DIM), np.float32), np.full((1, DIM), 2.0, np.float32)
    v1 = gv.commit(UpdateBatch.from_arrays({"feature_ids": [3], "features": ones}))[0].version
    gv.commit(UpdateBatch.from_arrays({"feature_ids": [5], "features": twos}))
    newest = compact(open_backend(uri), "g", grace_s=3600)["version"]
    client = create_memory_app(
        MemoryFunctionConfig(store=uri, graph="g", memory_mb=256)
    ).test_client()
    ids = [3, 5, 7]

    def rows_at(version: int) -> np.ndarray:
        head = {graph_version.HEADER: str(version)}
        return frame_of(client.post("/v1/features", json={"ids": ids}, headers=head))["x"]

    now = feats[ids].copy()
    now[0], now[1] = ones[0], twos[0]
    np.testing.assert_array_equal(rows_at(newest), now)  # cached from the new base
    then = feats[ids].copy()
    then[0] = ones[0]
    np.testing.assert_array_equal(rows_at(v1), then)
    np.testing.assert_array_equal(rows_at(0), feats[ids])
    np.testing.assert_array_equal(rows_at(newest), now)
    stats = client.get("/v1/stats").get_json()["graph_versions"]
    assert len(stats["bases"]) == 2
