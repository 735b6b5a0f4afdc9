"""Quiver's PSGS and FAP: sums and ranks by hand on a small graph, PSGS against
the mean size of many seeded samplings, and the stored blobs."""

from __future__ import annotations

import numpy as np
import pytest

from gnn_faas.cli import main
from gnn_faas.errors import InvalidRequest
from gnn_faas.storage.datasets import ensure_dataset
from gnn_faas.storage.fetcher import KHopFetcher, sample_segments
from gnn_faas.storage.format import open_graph
from gnn_faas.storage.workload_metrics import (
    fap,
    hop_probabilities,
    predicted_size,
    psgs,
    request_distribution,
    stored_fanouts,
)

# in-edge CSR: 0 <- {1, 2}; 1 <- {2}; 2 <- {0, 1, 3}; 3 <- {}
INDPTR = np.array([0, 2, 3, 6, 6])
INDICES = np.array([1, 2, 2, 0, 1, 3])


def test_psgs_by_hand():
    # fanout 1: S 1 = [1, 1, 1, 0]; S S 1 = [0.5 + 0.5, 1, (1 + 1 + 0) / 3, 0]
    np.testing.assert_allclose(psgs(INDPTR, INDICES, [1, 1]), [3, 3, 1 + 1 + 2 / 3, 1])
    # full neighbourhoods: the exact tree sizes: 0 -> 1 + 2 + (1 + 3) = 7
    np.testing.assert_allclose(psgs(INDPTR, INDICES, [-1, -1]), [7, 5, 1 + 3 + (2 + 1 + 0), 1])


def test_fap_sums_and_ranks_by_hand():
    r = request_distribution(4)
    p = hop_probabilities(INDPTR, INDICES, [1], r)
    np.testing.assert_allclose(p[1], [1 / 12, 5 / 24, 3 / 8, 1 / 12])
    # Σ_u p_1(u) = Σ_t r(t) (S 1)(t) = (1 + 1 + 1 + 0) / 4
    assert p[1].sum() == pytest.approx(0.75)
    f = fap(INDPTR, INDICES, [1], r)
    np.testing.assert_allclose(f, [0.3125, 1 - 0.75 * 19 / 24, 0.53125, 0.3125])
    assert np.argsort(-f, kind="stable").tolist() == [2, 1, 0, 3]
    # a request order skewed to vertex 3 (which nobody reads from) ranks 3 first
    r3 = request_distribution(4, "request_order", np.array([3, 3, 3, 0]))
    np.testing.assert_allclose(r3, [0.25, 0, 0, 0.75])
    f3 = fap(INDPTR, INDICES, [1], r3)
    assert f3.argmax() == 3 and f3[2] == pytest.approx(1 - (1 - 0.125))
    with pytest.raises(InvalidRequest):
        request_distribution(4, "request_order", None)
    # recency: with a half-life of 1/4 of 4 requests, each older request weighs half
    rd = request_distribution(4, "request_order", np.array([0, 1, 2, 2]), half_life=0.25)
    np.testing.assert_allclose(rd, np.array([1 / 8, 1 / 4, 1 / 2 + 1, 0]) / (15 / 8))
    mixed = request_distribution(4, "request_order", np.array([3]), uniform_mix=0.5)
    np.testing.assert_allclose(mixed, [1 / 8, 1 / 8, 1 / 8, 1 / 2 + 1 / 8])


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    return ensure_dataset(f"file://{tmp_path_factory.mktemp('store')}", "bitcoin-otc")


def mean_sampled_tree_size(fetcher: KHopFetcher, targets, fanouts, seeds) -> np.ndarray:
    """Per target: the mean (over seeds) size of its sampled computation tree."""
    total = np.zeros(len(targets))
    for seed in seeds:
        frontier = np.asarray(targets, np.int64)
        root = np.arange(frontier.size)
        size = np.ones(frontier.size)
        for f in fanouts:
            counts, nbrs = fetcher.neighbours(frontier)
            keep = sample_segments(frontier, counts, f, seed)
            root = np.repeat(root, counts)[keep]
            frontier = nbrs[keep]
            size += np.bincount(root, minlength=size.size)
        total += size
    return total / len(seeds)


def test_psgs_equals_mean_sampled_size(graph):
    fetcher = KHopFetcher(graph)
    fanouts = [5, 3]
    p = psgs(graph.read_blob("indptr"), graph.read_blob("indices"), fanouts)
    deg = np.diff(graph.read_blob("indptr"))
    # targets whose samples really vary (more neighbours than the fanout)
    targets = np.flatnonzero(deg > 5)[::37][:40]
    measured = mean_sampled_tree_size(fetcher, targets, fanouts, range(300))
    assert abs(measured.sum() / p[targets].sum() - 1) < 0.05
    assert np.all(np.abs(measured / p[targets] - 1) < 0.10)


def test_metrics_command_stores_blobs(graph):
    store = graph.backend.uri
    assert main(["datasets", "metrics", "bitcoin-otc", "--store", store, "--fanouts", "10,5"]) == 0
    g = open_graph(store, "bitcoin-otc", verify="full")
    assert stored_fanouts(g) == [10, 5]
    assert g.manifest.extra["workload_metrics"]["fap_distribution"] == "request_order"
    stored = g.read_blob("psgs")
    expected = psgs(g.read_blob("indptr"), g.read_blob("indices"), [10, 5])
    np.testing.assert_allclose(stored, expected, rtol=1e-6)
    f = g.read_blob("fap")
    assert f.min() >= 0 and f.max() <= 1
    fetcher = KHopFetcher(g)
    assert predicted_size(g, fetcher.reader, np.array([3, 3, 7])) == pytest.approx(
        float(expected[3] + expected[7]), rel=1e-6
    )
    assert main(["datasets", "metrics", "bitcoin-otc", "--store", store, "--fanouts", "x"]) == 2
