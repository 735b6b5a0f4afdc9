"""The adaptive, memory-aware feature cache on Bitcoin OTC's stored rows."""

from __future__ import annotations

import numpy as np
import pytest

from gnn_faas.errors import Unavailable
from gnn_faas.functions.aggregate import aggregate
from gnn_faas.functions.feature_cache import CachePolicy, FeatureCache, measure_peak
from gnn_faas.functions.memory_app import execute_aggregate, parse_aggregate
from gnn_faas.functions.peak_predictor import (
    PeakPredictor,
    RequestShape,
    analytic_peak,
    bundled_predictor_path,
)
from gnn_faas.storage.datasets import ensure_dataset
from gnn_faas.storage.fetcher import KHopFetcher
from gnn_faas.wire import decode_frame, encode_frame


@pytest.fixture(scope="module")
def fetcher(tmp_path_factory) -> KHopFetcher:
    store = tmp_path_factory.mktemp("store")
    return KHopFetcher(ensure_dataset(f"file://{store}", "bitcoin-otc"))


@pytest.fixture(scope="module")
def features(fetcher) -> np.ndarray:
    return np.array(fetcher.graph.read_blob("features"), dtype=np.float32)


@pytest.fixture(scope="module")
def degree(fetcher) -> np.ndarray:
    return np.asarray(fetcher.graph.read_blob("degree"))


def request_stream(fetcher: KHopFetcher, n: int, seed: int = 0):
    """Input-vertex sets of real requests: request order, 1..16 targets, 2 sampled hops."""
    order = fetcher.graph.read_blob("request_order").astype(np.int64)
    rng = np.random.default_rng(seed)
    pos = 0
    for i in range(n):
        b = int(rng.integers(1, 17))
        cg = fetcher.fetch(order[pos : pos + b], 2, fanouts=[10, 5], seed=0, degrees=True)
        pos += b
        yield i, cg


def resident_rows_are_correct(cache: FeatureCache, features: np.ndarray) -> None:
    nodes = cache.resident()
    assert np.unique(nodes).size == nodes.size == cache.rows <= cache._data.shape[0]
    np.testing.assert_array_equal(cache.slots(nodes), np.arange(cache.rows))
    assert np.count_nonzero(cache.slots(np.arange(cache.num_nodes)) >= 0) == cache.rows
    np.testing.assert_array_equal(cache._data[: cache.rows], features[nodes])


def test_hit_miss_accounting_is_exact(fetcher, features, degree):
    n, dim = features.shape
    cache = FeatureCache(n, dim, degree=degree, policy=CachePolicy(max_rows=n // 20))
    hits = misses = 0
    for _, cg in request_stream(fetcher, 60):
        ids = np.concatenate((cg.input_nodes, cg.input_nodes[:3]))  # repeats count twice
        resident = cache.contains(ids)
        rows = cache.get_rows(ids, fetcher.read_features)
        np.testing.assert_array_equal(rows, features[ids])
        hits += int(resident.sum())
        misses += int((~resident).sum())
        s = cache.stats
        assert (s.hits, s.misses, s.lookups) == (hits, misses, hits + misses)
        assert cache.rows <= n // 20
    assert hits > 0 and misses > 0
    assert cache.as_dict()["hit_rate"] == pytest.approx(hits / (hits + misses))
    assert cache.stats.admissions - cache.stats.evictions == cache.rows
    resident_rows_are_correct(cache, features)


def test_eviction_order_is_low_degree_and_low_recent_frequency():
    n, dim = 8, 3
    feats = np.arange(n * dim, dtype=np.float32).reshape(n, dim)
    degree = np.array([0, 1, 3, 7, 15, 31, 63, 127])
    policy = CachePolicy(decay_every=4, degree_weight=1.0, max_rows=n)
    cache = FeatureCache(n, dim, degree=degree, policy=policy)

    def load(ids):
        return feats[ids]

    cache.get_rows(np.arange(n), load)  # all resident, one access each
    cache.get_rows(np.array([0, 1]), load)  # 0 and 1 recently used twice
    cache.get_rows(np.array([0]), load)
    prior = np.log1p(degree) / np.log1p(127)
    freq = np.array([3, 2, 1, 1, 1, 1, 1, 1], dtype=float)
    np.testing.assert_allclose(cache.value(np.arange(n)), freq + prior, rtol=1e-6)
    cache.get_rows(np.array([7]), load)  # 4th request: every count is halved
    freq[7] += 1
    np.testing.assert_allclose(cache.frequency(np.arange(n)), freq / 2)
    value = freq / 2 + prior
    for keep in (6, 4, 2, 1):
        cache.set_capacity(keep)
        want = np.argsort(-value, kind="stable")[:keep]
        assert set(cache.resident().tolist()) == set(want.tolist())
        resident_rows_are_correct(cache, feats)
        if keep == 2:
            # frequency beats degree: 0 (degree 0, read 3 times) outlives 6 (degree 63, once)
            assert set(cache.resident().tolist()) == {0, 7}


def test_a_vertex_read_several_times_in_one_request_counts_once():
    feats = np.arange(24, dtype=np.float32).reshape(6, 4)
    cache = FeatureCache(6, 4, policy=CachePolicy(decay_every=1000))
    cache.get_rows(np.arange(6), lambda ids: feats[ids])  # all resident, once each
    out = cache.get_rows(np.array([2, 2, 5, 2, 5, 0]), lambda ids: feats[ids])
    np.testing.assert_array_equal(out, feats[[2, 2, 5, 2, 5, 0]])
    np.testing.assert_array_equal(cache.frequency(np.arange(6)), [2, 1, 2, 1, 1, 2])


def test_pinned_rows_are_never_evicted(fetcher, features, degree):
    n, dim = features.shape
    cache = FeatureCache(n, dim, degree=degree, policy=CachePolicy(max_rows=200))
    low = np.argsort(degree, kind="stable")[:150]  # the least valuable vertices
    cache.get_rows(low, fetcher.read_features)
    assert cache.rows == 150
    # shrinking with pins: only unpinned rows go, even below the capacity
    cache.set_capacity(10, pinned=low[:100])
    assert cache.contains(low[:100]).all() and cache.rows == 100
    # admission with pins: valuable misses may only replace unpinned residents
    cache.set_capacity(100)
    hubs = np.argsort(-degree, kind="stable")[:80]
    for _ in range(3):  # make the hubs clearly more valuable
        cache.get_rows(np.concatenate((low[:60], hubs)), fetcher.read_features)
    assert cache.contains(low[:60]).all()  # pinned by the request that read them
    assert cache.rows == 100
    assert cache.contains(hubs).sum() == 40  # the room the unpinned low rows left
    resident_rows_are_correct(cache, features)


def test_admission_needs_a_higher_value_than_the_lowest_resident(features, degree):
    n, dim = features.shape
    cache = FeatureCache(n, dim, degree=degree, policy=CachePolicy(max_rows=50, decay_every=1000))
    hubs = np.argsort(-degree, kind="stable")[:50]

    def load(ids):
        return features[ids]

    for _ in range(3):
        cache.get_rows(hubs, load)
    leaf = np.flatnonzero(degree == 0)[:5]
    cache.get_rows(leaf, load)  # one access and no degree: not worth a hub
    assert not cache.contains(leaf).any() and cache.stats.evictions == 0
    for _ in range(5):  # now used more often than the hubs: it gets in
        cache.get_rows(leaf, load)
    assert cache.contains(leaf).all() and cache.stats.evictions == 5
    resident_rows_are_correct(cache, features)


def aggregate_work(cache: FeatureCache, fetcher: KHopFetcher, cg, op: str = "gcn"):
    """A /v1/aggregate request of layer 1 (rows through the cache), decoded as the app does."""
    block = cg.block(1)
    src = cg.nodes[: block.num_src]
    body = encode_frame(
        {"indptr": block.indptr, "indices": block.indices, "src_ids": src,
         "deg_src": cg.in_degree[: block.num_src]},
        {"op": op, "num_dst": block.num_dst},
    )  # fmt: skip
    call = parse_aggregate(*decode_frame(body))

    def work():
        return execute_aggregate(call, cache.get_rows(call.src_ids, fetcher.read_features))

    return call, work


class TooLow:
    """A predictor that always says 1 KiB."""

    def predict(self, shape: RequestShape) -> int:
        return 1024


@pytest.mark.parametrize("predictor", ["bundled", "too-low"])
def test_memory_ceiling_holds_over_a_random_request_stream(predictor, fetcher, features, degree):
    n, dim = features.shape
    limit = 2 * 2**20  # 1 MiB baseline + 1 MiB for the cache and the request (peaks to ~0.7 MiB)
    model = (
        TooLow()
        if predictor == "too-low"
        else PeakPredictor.load(bundled_predictor_path("bitcoin-otc"))
    )
    cache = FeatureCache(n, dim, degree=degree, limit_bytes=limit, baseline_bytes=2**20,
                         predictor=model)  # fmt: skip
    rng = np.random.default_rng(3)
    most, largest = 0, 0
    for _, cg in request_stream(fetcher, 80, seed=1):
        call, work = aggregate_work(cache, fetcher, cg)
        out = cache.run(work, call.shape(dim), pinned=call.src_ids)
        assert cache.accounted_bytes(cache.last_actual_peak) <= limit
        largest = max(largest, cache.last_actual_peak)
        most = max(most, cache.stats.max_accounted_bytes)
        # the stream's most: over every request so far, within the limit
        assert cache.stats.max_peak_bytes == largest
        assert most == cache.stats.max_accounted_bytes <= limit
        if rng.random() < 0.2:  # and the answers stay right
            ref = aggregate(
                "gcn", call.block, features[call.src_ids], deg_src=call.extras["deg_src"]
            )
            np.testing.assert_allclose(out["agg"], ref, rtol=1e-6)
    s = cache.stats
    assert s.over_limit == 0 and s.evictions > 0
    assert cache.as_dict()["max_accounted_bytes"] == s.max_accounted_bytes >= 2**20 + largest
    if predictor == "too-low":  # a request bigger than the room the cache left re-executes
        assert s.reexecutions > 0
    resident_rows_are_correct(cache, features)


def test_reexecution_on_a_wrong_prediction_keeps_the_answer(fetcher, features, degree):
    n, dim = features.shape
    order = fetcher.graph.read_blob("request_order").astype(np.int64)
    cg = fetcher.fetch(order[:40], 2, degrees=True)
    probe = FeatureCache(n, dim)
    probe.set_capacity(0)  # all misses, nothing admitted: the request alone
    call, work = aggregate_work(probe, fetcher, cg)
    _, peak = measure_peak(work)  # the request's real working set
    limit = 2**20 + peak + 100 * 4 * dim  # room for the request and 100 rows
    cache = FeatureCache(
        n,
        dim,
        degree=degree,
        limit_bytes=limit,
        baseline_bytes=2**20,
        predictor=TooLow(),
        policy=CachePolicy(growth=1.0),
    )
    others = np.setdiff1d(np.arange(n), call.src_ids)[:590]
    cache.get_rows(others, fetcher.read_features)  # 590 rows the request does not read
    filled = cache.bytes
    assert cache.rows == 590 and filled + peak > limit - 2**20
    call, work = aggregate_work(cache, fetcher, cg)
    out = cache.run(work, call.shape(dim), pinned=call.src_ids)
    assert cache.stats.reexecutions == 1 and cache.stats.over_limit == 0
    ref = aggregate("gcn", call.block, features[call.src_ids], deg_src=call.extras["deg_src"])
    np.testing.assert_allclose(out["agg"], ref, rtol=1e-6)
    assert cache.accounted_bytes(cache.last_actual_peak) <= limit
    assert cache.last_predicted_peak == 1024 and cache.last_actual_peak > filled
    resident_rows_are_correct(cache, features)


def test_memory_error_reexecutes_once_then_gives_up(features):
    n, dim = features.shape
    cache = FeatureCache(n, dim, limit_bytes=2**30)
    cache.get_rows(np.arange(100), lambda ids: features[ids])
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) == 1:
            raise MemoryError
        return "done"

    assert cache.run(flaky) == "done"
    assert cache.stats.reexecutions == 1 and cache.rows == 0 and cache.bytes == 0

    def hopeless():
        raise MemoryError

    with pytest.raises(Unavailable):
        cache.run(hopeless)


def test_capacity_follows_limit_minus_predicted_peak(features):
    n, dim = features.shape
    row = 4 * dim
    cache = FeatureCache(n, dim, limit_bytes=1000 * row, baseline_bytes=200 * row)
    assert cache.capacity_rows == 800
    cache.get_rows(np.arange(700), lambda ids: features[ids])
    assert cache.rows == 700
    big = RequestShape(10, 10, 0, dim, "features")
    cache.run(lambda: None, predicted_peak=500 * row)
    assert cache.rows <= 300 and cache.bytes <= 300 * row  # shrinking evicts and frees
    cache.run(lambda: None, big, predicted_peak=0)
    assert cache.capacity_rows == 800
    resident_rows_are_correct(cache, features)


def test_bookkeeping_is_bounded_by_the_work_not_the_graph():
    """A billion-vertex graph: the cache's per-vertex state covers the vertices
    read (slots and recent counts), with degrees read on demand."""
    n, dim = 10**9, 4
    reads = []

    def degree(ids):
        reads.append(ids.size)
        return ids % 1000

    cache = FeatureCache(n, dim, degree=degree, policy=CachePolicy(max_rows=2000, decay_every=4))
    rng = np.random.default_rng(0)

    def load(ids):
        return np.repeat(ids.astype(np.float32)[:, None], dim, axis=1)

    for _ in range(50):
        ids = rng.integers(0, n, 300)
        np.testing.assert_array_equal(cache.get_rows(ids, load)[:, 0], ids.astype(np.float32))
    assert cache.rows == 2000
    assert cache.bookkeeping_bytes < 2**20  # vs 13 bytes/vertex dense: 13 GB
    assert len(cache._ghost) < 50 * 300  # counts below the floor were forgotten
    assert sum(reads) <= 50 * 300  # degrees of the misses only


def test_degree_normaliser_is_the_largest_degree_read_so_far():
    n, dim = 100, 2
    degree = np.arange(n) * 3
    cache = FeatureCache(n, dim, degree=lambda ids: degree[ids], policy=CachePolicy(max_rows=n))
    feats = np.zeros((n, dim), np.float32)
    cache.get_rows(np.array([1, 2]), lambda ids: feats[ids])
    np.testing.assert_allclose(cache.value(np.array([2])), 1 + 0.5, rtol=1e-6)
    cache.get_rows(np.array([50]), lambda ids: feats[ids])  # a larger degree rescales all
    top = np.log1p(150)
    want = 1 + 0.5 * np.log1p(degree[[1, 2, 50]]) / top
    np.testing.assert_allclose(cache.value(np.array([1, 2, 50])), want, rtol=1e-6)


def _call_of(cg, op: str, *, shipped: bool, partial: bool, rng) -> tuple[dict, dict]:
    """Tensors and params of a layer-1 aggregate call over ``cg`` (rows loaded
    through the cache, or ``h`` shipped in; GAT ships ``h`` with its heads)."""
    block = cg.block(1)
    src = cg.nodes[: block.num_src]
    tensors = {"indptr": block.indptr, "indices": block.indices, "src_ids": src}
    if op == "gcn":
        tensors["deg_src"] = cg.in_degree[: block.num_src]
    if op == "gat":
        heads = 2
        tensors["h"] = rng.standard_normal((src.size, heads, 16)).astype(np.float32)
        tensors["alpha_src"] = rng.standard_normal((src.size, heads)).astype(np.float32)
        tensors["alpha_dst"] = rng.standard_normal((block.num_dst, heads)).astype(np.float32)
    elif shipped:
        tensors["h"] = rng.standard_normal((src.size, 32)).astype(np.float32)
    params = {"op": op, "num_dst": block.num_dst, "partial": partial, "return_root": not partial}
    return tensors, params


@pytest.mark.parametrize("op", ["sum", "mean", "max", "gcn", "gin", "gat"])
@pytest.mark.parametrize("shipped", [False, True])
def test_the_closed_form_bound_covers_every_measured_peak(op, shipped, fetcher, features):
    """A request runs untraced on the strength of ``analytic_peak``: it must bound
    the whole call's measured allocations (decode, rows, Aggregate, the answer's
    frame) for every op, shipped or loaded rows, partial or whole, small and
    large requests."""
    n, dim = features.shape
    rng = np.random.default_rng(7)
    for i, cg in request_stream(fetcher, 12, seed=5):
        cache = FeatureCache(n, dim)
        cache.set_capacity(0)  # every row a miss: the largest working set
        tensors, params = _call_of(cg, op, shipped=shipped, partial=i % 2 == 1, rng=rng)
        body = encode_frame(tensors, params)

        def work(cache=cache, body=body):
            call = parse_aggregate(*decode_frame(body))
            rows = (
                call.h
                if call.h is not None
                else cache.get_rows(call.src_ids, fetcher.read_features)
            )
            return encode_frame(execute_aggregate(call, rows)), call

        (_, call), peak = measure_peak(work)
        bound = analytic_peak(call.shape(dim))
        assert 0 < peak <= bound, (op, shipped, i, peak, bound)


def test_small_requests_run_untraced_and_account_their_bound(fetcher, features, degree):
    """Under ``untraced_share`` a request is not traced (tracemalloc stays off while
    it runs), the cache reserves and accounts its closed-form bound, and the
    ceiling holds; a request over the share is traced; share 0 traces all."""
    import tracemalloc

    n, dim = features.shape
    limit = 256 * 2**20
    cache = FeatureCache(n, dim, degree=degree, limit_bytes=limit, baseline_bytes=2**20)
    seen = []
    for _, cg in request_stream(fetcher, 20, seed=2):
        call, work = aggregate_work(cache, fetcher, cg)

        def watched(work=work):
            seen.append(tracemalloc.is_tracing())
            return work()

        cache.run(watched, call.shape(dim), pinned=call.src_ids)
        bound = analytic_peak(call.shape(dim))
        assert bound <= limit / 32 and cache.last_actual_peak == bound
        assert cache.accounted_bytes(cache.last_actual_peak) <= limit
        assert cache.rows <= (limit - 2**20 - bound) // (4 * dim)
    assert not any(seen) and cache.stats.traced == 0 and cache.rows > 0

    # a share of 0 (or a request larger than its share) is traced: the peak is measured
    traced = FeatureCache(n, dim, limit_bytes=limit, policy=CachePolicy(untraced_share=0.0))
    call, work = aggregate_work(traced, fetcher, next(request_stream(fetcher, 1))[1])
    traced.run(work, call.shape(dim), pinned=call.src_ids)
    assert traced.stats.traced == 1
    assert 0 < traced.last_actual_peak < analytic_peak(call.shape(dim))
    assert not tracemalloc.is_tracing()  # started for the request, stopped after it
