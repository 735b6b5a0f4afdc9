"""The FAP prior of the feature cache (sparse top-k, warm start) and of the memory function."""

from __future__ import annotations

import numpy as np
import pytest

from gnn_faas.errors import NotFound
from gnn_faas.functions.feature_cache import CachePolicy, FeatureCache
from gnn_faas.functions.memory_app import WARM_SHARE, MemoryFunction, MemoryFunctionConfig
from gnn_faas.storage.datasets import ensure_dataset
from gnn_faas.storage.workload_metrics import compute_and_store


def loader(ids):
    return np.repeat(ids[:, None].astype(np.float32), 2, axis=1)


def test_sparse_prior_scores():
    cache = FeatureCache(6, 2, policy=CachePolicy(degree_weight=0.5),
                         prior=(np.array([4, 1]), np.array([0.2, 0.4])))  # fmt: skip
    np.testing.assert_allclose(cache.prior(np.arange(6)), [0, 0.5, 0, 0, 0.25, 0])
    empty = FeatureCache(3, 2, prior=(np.array([], np.int64), np.array([])))
    assert not empty.prior(np.arange(3)).any()
    assert empty.bookkeeping_bytes < 4096  # sparse: nothing sized by the graph


def test_fap_prior_ranks_admission_and_warms():
    cache = FeatureCache(
        10,
        2,
        policy=CachePolicy(max_rows=2),
        prior=(np.array([7, 3, 5]), np.array([0.9, 0.5, 0.1])),
    )
    assert cache.warm(np.array([7, 3, 5]), loader) == 2  # best first, up to the capacity
    assert sorted(cache.resident().tolist()) == [3, 7]
    assert cache.stats.lookups == 0  # warming is not a lookup
    np.testing.assert_array_equal(cache.get_rows(np.array([7]), loader), [[7, 7]])
    assert cache.stats.hits == 1
    # a vertex read by a request outranks one that is only high in the prior
    cache.get_rows(np.array([5]), loader)
    assert sorted(cache.resident().tolist()) == [5, 7]
    before = cache.value(np.array([3, 9]))
    cache.set_prior((np.array([9]), np.array([1.0])))  # a refreshed FAP
    np.testing.assert_allclose(cache.value(np.array([3, 9])) - before, [-0.5 * 0.5 / 0.9, 0.5])


def test_memory_function_with_fap_prior(tmp_path):
    store = f"file://{tmp_path}"
    graph = ensure_dataset(store, "bitcoin-otc")
    # a fixed baseline: the test process's own RSS must not eat the cache's budget
    cfg = MemoryFunctionConfig(store=store, graph="bitcoin-otc", memory_mb=256, baseline_mb=64,
                               cache_max_rows=100, cache_prior="fap")  # fmt: skip
    with pytest.raises(NotFound, match="datasets metrics"):
        MemoryFunction(cfg)
    compute_and_store(graph, [10, 5])
    fn = MemoryFunction(cfg)
    # the warm-up fills its share of the cache with the prior's best rows
    warm = int(100 * WARM_SHARE)
    assert fn.warmed_rows == warm and fn.stats()["cache_prior"] == "fap"
    fap = graph.read_blob("fap")
    top = np.argsort(-fap, kind="stable")[:warm]
    assert set(fn.cache.resident().tolist()) == set(top.tolist())
    # with PSGS stored for these fanouts, the fetch's peak comes from it
    t = np.array([1, 2, 3])
    psgs = graph.read_blob("psgs")
    assert fn._graph_peak(3, 2, [10, 5], t) == int(160 * psgs[t].sum() + (1 << 20))
    assert fn._graph_peak(3, 2, [4, 4], t) != int(160 * psgs[t].sum() + (1 << 20))
