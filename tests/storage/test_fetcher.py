"""Property tests of the on-demand k-hop fetcher, on every backend.

Random small graphs are written with the real store format into a fresh store
of each kind (file, S3 on moto, Redis); what the fetcher returns is checked
against references computed independently with scipy: hop distances by
breadth-first search (``csgraph.shortest_path``), blocks by slicing the
adjacency matrix, degrees from ``indptr``, and the bytes a fetch needs from
the definition of the format.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from scipy.sparse import csgraph

from gnn_faas.storage.backends import open_backend
from gnn_faas.storage.computation_graph import ComputationGraph
from gnn_faas.storage.fetcher import FetchStats, KHopFetcher
from gnn_faas.storage.format import open_graph, write_graph
from gnn_faas.storage.ranges import ByteBudget
from gnn_faas.storage.request_cost import FREE, RequestCost

DIM = 4
PROPERTY = settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@dataclass(frozen=True)
class Case:
    adj: sp.csr_matrix  # adj[v, u] = 1: v aggregates from u (the stored in-edge CSR)
    features: np.ndarray
    targets: np.ndarray
    hops: int
    ids: np.ndarray  # vertex ids for feature reads (repeats allowed, maybe none)
    batch: np.ndarray  # the targets of another batch

    @property
    def n(self) -> int:
        return self.adj.shape[0]


def make_case(n: int, m: int, seed: int, num_targets: int, hops: int) -> Case:
    """A random graph of ``n`` vertices and ``m`` random edges (self loops
    allowed, duplicates dropped) with features of dimension 4, and random
    targets, feature ids and a second batch drawn from ``seed``."""
    rng = np.random.default_rng(seed)
    dst, src = rng.integers(0, n, m), rng.integers(0, n, m)
    adj = sp.csr_matrix((np.ones(m, np.int8), (dst, src)), shape=(n, n))
    adj.sum_duplicates()
    adj.data[:] = 1
    adj.sort_indices()
    return Case(
        adj=adj,
        features=rng.standard_normal((n, DIM)).astype(np.float32),
        targets=rng.integers(0, n, num_targets),
        hops=hops,
        ids=rng.integers(0, n, rng.integers(0, 31)),
        batch=rng.integers(0, n, rng.integers(1, 11)),
    )


@st.composite
def cases(draw) -> Case:
    """Up to 60 vertices, 300 edges, 10 targets and 3 hops."""
    return make_case(
        n=draw(st.integers(1, 60)),
        m=draw(st.integers(0, 300)),
        seed=draw(st.integers(0, 2**32 - 1)),
        num_targets=draw(st.integers(1, 10)),
        hops=draw(st.integers(0, 3)),
    )


# the largest and densest cases always run, whatever hypothesis draws
LARGEST = [make_case(60, 300, 1, 10, 3), make_case(60, 300, 2, 3, 2), make_case(60, 40, 3, 10, 3)]


class Stores:
    """Writes each example's graph under a new name into one store."""

    def __init__(self, store_uri: str):
        self.backend = open_backend(store_uri)
        self.names = (f"g{i}" for i in itertools.count())

    def fetcher(self, case: Case) -> KHopFetcher:
        name = next(self.names)
        write_graph(
            self.backend,
            name,
            indptr=case.adj.indptr.astype(np.int64),
            indices=case.adj.indices,
            features=case.features,
            symmetrized=False,
        )
        return KHopFetcher(open_graph(self.backend, name))


def hop_distance(adj: sp.csr_matrix, targets: np.ndarray) -> np.ndarray:
    """Hops from the nearest target along in-edges (inf when unreachable)."""
    dist = csgraph.shortest_path(adj, directed=True, unweighted=True, indices=np.unique(targets))
    return dist.min(axis=0)


def sampled_matrix(cg: ComputationGraph, n: int) -> sp.csr_matrix:
    """The fetched (possibly sampled) neighbourhoods as an n x n global 0/1 matrix."""
    rows = np.repeat(cg.nodes[: cg.indptr.size - 1], np.diff(cg.indptr))
    data = np.ones(rows.size, np.int32)
    m = sp.csr_matrix((data, (rows, cg.nodes[cg.indices])), shape=(n, n))
    m.sum_duplicates()
    return m


def check_layers(cg: ComputationGraph, ref: sp.csr_matrix, targets: np.ndarray, hops: int):
    """Structure every fetch has, against ``ref`` (the graph the fetch should see)."""
    assert cg.num_layers == hops
    assert np.unique(cg.nodes).size == cg.nodes.size
    np.testing.assert_array_equal(cg.nodes[cg.target_index], targets)
    assert list(cg.layer_sizes) == sorted(cg.layer_sizes, reverse=True)
    np.testing.assert_array_equal(np.sort(cg.targets), np.unique(targets))
    for layer, block in enumerate(cg.blocks(), start=1):
        dst = cg.nodes[: cg.layer_sizes[layer]]
        src = cg.nodes[: cg.layer_sizes[layer - 1]]
        assert (block.num_dst, block.num_src) == (dst.size, src.size)
        want = ref[dst][:, src]
        assert (block.adjacency(np.int32) != want).nnz == 0, f"layer {layer}"
        # D_{l-1} is D_l and every neighbour of it, nothing more
        reach = np.union1d(dst, ref[dst].indices)
        np.testing.assert_array_equal(np.sort(src), reach)


def needed_bytes(case: Case, dist: np.ndarray, feature_ids: np.ndarray) -> int:
    """The exact bytes a full-neighbourhood fetch with degrees and a feature
    read need: per hop, the indptr entries ``[v, v+1]`` of the frontier (shared
    entries once) and its neighbour segments; the indptr entries of the
    outermost vertices (their degrees) and, where the graph has self loops,
    their int32 rows of ``self_loops.bin``; one feature row per distinct id."""
    deg = np.diff(case.adj.indptr)
    total = 0
    for h in range(case.hops + 1):
        frontier = np.flatnonzero(dist == h)
        total += 8 * np.union1d(frontier, frontier + 1).size
        if h < case.hops:
            total += 4 * int(deg[frontier].sum())
        elif case.adj.diagonal().any():
            total += 4 * frontier.size
    return total + 4 * DIM * np.unique(feature_ids).size


def gcn_degree(adj: sp.csr_matrix) -> np.ndarray:
    """In-edges from other vertices (PyG's gcn_norm replaces self loops by one)."""
    return np.diff(adj.indptr) - adj.diagonal().astype(np.int64)


@PROPERTY
@given(case=cases())
@example(case=LARGEST[0])
@example(case=LARGEST[1])
@example(case=LARGEST[2])
def _check_full_fetch(stores: Stores, is_file: bool, case: Case) -> None:
    fetcher = stores.fetcher(case)
    stats = FetchStats()
    cg = fetcher.fetch(case.targets, case.hops, stats=stats, degrees=True)

    dist = hop_distance(case.adj, case.targets)
    for h in range(case.hops + 1):
        within = np.flatnonzero(dist <= h)
        assert cg.layer_sizes[case.hops - h] == within.size
        np.testing.assert_array_equal(np.sort(cg.nodes[: within.size]), within)
    check_layers(cg, case.adj, case.targets, case.hops)
    np.testing.assert_array_equal(cg.in_degree, gcn_degree(case.adj)[cg.nodes])

    ids = case.ids
    rows = fetcher.read_features(ids, stats=stats)
    assert rows.dtype == np.float32 and rows.shape == (ids.size, DIM)
    np.testing.assert_array_equal(rows, case.features[ids])
    np.testing.assert_array_equal(fetcher.read_features(cg.input_nodes), case.features[cg.nodes])

    # figures: at most two round trips per hop; never fewer bytes than needed
    assert len(stats.hop_round_trips) == case.hops
    assert all(t <= 2 for t in stats.hop_round_trips)
    reads = stats.reads
    assert reads.bytes_needed == needed_bytes(case, dist, ids)
    assert reads.bytes_read >= reads.bytes_needed
    # with requests free (the planner's other extreme) exactly the needed bytes
    free = KHopFetcher(fetcher.graph, FREE)
    exact = FetchStats()
    free.fetch(case.targets, case.hops, stats=exact, degrees=True)
    free.read_features(ids, stats=exact)
    assert exact.reads.bytes_read == exact.reads.bytes_needed == reads.bytes_needed


@PROPERTY
@given(case=cases(), fanout=st.integers(0, 4), seed=st.integers(0, 2**63 - 1))
@example(case=LARGEST[0], fanout=2, seed=7)
@example(case=LARGEST[1], fanout=4, seed=2**63 - 1)
def _check_sampled_fetch(stores: Stores, case: Case, fanout: int, seed: int) -> None:
    fetcher = stores.fetcher(case)
    fanouts = [fanout] * case.hops
    cg = fetcher.fetch(case.targets, case.hops, fanouts, seed=seed, degrees=True)
    again = fetcher.fetch(case.targets, case.hops, fanouts, seed=seed)
    for field in ("nodes", "indptr", "indices", "target_index"):
        np.testing.assert_array_equal(getattr(cg, field), getattr(again, field))
    assert cg.layer_sizes == again.layer_sizes

    sampled = sampled_matrix(cg, case.n)
    check_layers(cg, sampled, case.targets, case.hops)
    # a subset of the true neighbours, min(fanout, degree) of them, no repeats
    assert sampled.data.max(initial=0) <= 1
    assert (sampled - sampled.multiply(case.adj)).count_nonzero() == 0
    expanded = cg.nodes[: cg.indptr.size - 1]
    deg = np.diff(case.adj.indptr)[expanded]
    np.testing.assert_array_equal(np.diff(cg.indptr), np.minimum(deg, fanout))
    # PyG's view of a sampled subgraph: sampled in-degrees without the sampled
    # self loops, 0 on the outermost hop (with no hop, nothing is sampled: the
    # stored degrees)
    outer = np.zeros(cg.nodes.size - expanded.size, np.int64)
    if case.hops == 0:
        outer = gcn_degree(case.adj)[cg.nodes]
    kept_loops = sampled.diagonal()[expanded].astype(np.int64)
    np.testing.assert_array_equal(
        cg.in_degree, np.concatenate((np.diff(cg.indptr) - kept_loops, outer))
    )

    # another batch sharing vertices samples each shared vertex identically
    batch = np.concatenate((case.batch, case.targets[:2]))
    cg2 = fetcher.fetch(batch, case.hops, fanouts, seed=seed)
    shared = np.intersect1d(expanded, cg2.nodes[: cg2.indptr.size - 1])
    assert (sampled[shared] != sampled_matrix(cg2, case.n)[shared]).nnz == 0


@PROPERTY
@given(case=cases(), fanout=st.sampled_from([None, 1, 3]), seed=st.integers(0, 2**32 - 1))
@example(case=LARGEST[0], fanout=None, seed=0)
@example(case=LARGEST[1], fanout=None, seed=0)
@example(case=LARGEST[2], fanout=2, seed=5)
def _check_budgeted_fetch(stores: Stores, case: Case, fanout: int | None, seed: int) -> None:
    # requests cost as much as 10^9 bytes: every gap would pay, the fetch-wide
    # budget is what stops the merging
    fetcher = stores.fetcher(case)
    costly = KHopFetcher(fetcher.graph, RequestCost("t", 1.0, 1e-9))
    free = KHopFetcher(fetcher.graph, FREE)
    fanouts = None if fanout is None else [fanout] * case.hops
    budget = ByteBudget(1.0)
    stats, exact = FetchStats(), FetchStats()
    cg = costly.fetch(case.targets, case.hops, fanouts, seed, stats, True, budget=budget)
    rows = costly.read_features(cg.input_nodes, stats, budget=budget)
    ref = free.fetch(case.targets, case.hops, fanouts, seed, exact, True)
    ref_rows = free.read_features(ref.input_nodes, exact)
    # the same answer as an uncoalesced fetch (requests free: only touching ranges merge)
    for field in ("nodes", "indptr", "indices", "target_index", "in_degree"):
        np.testing.assert_array_equal(getattr(cg, field), getattr(ref, field))
    np.testing.assert_array_equal(rows, ref_rows)
    np.testing.assert_array_equal(rows, case.features[cg.nodes])
    # within twice the exact bytes of the whole fetch (all hops, degrees, rows),
    # in no more requests than uncoalesced
    if fanout is None:
        dist = hop_distance(case.adj, case.targets)
        assert exact.reads.bytes_read == needed_bytes(case, dist, cg.nodes)
    needed = exact.reads.bytes_read
    assert stats.reads.bytes_needed == needed == budget.needed
    assert needed <= stats.reads.bytes_read <= 2 * needed
    assert budget.extra == stats.reads.bytes_read - needed
    assert stats.reads.ranges_requested <= exact.reads.ranges_requested


def test_a_fetch_wide_byte_budget_answers_exactly_within_twice_the_bytes(tmp_path):
    stores = Stores(f"file://{tmp_path}")
    try:
        _check_budgeted_fetch(stores)
    finally:
        stores.backend.close()


def test_full_fetch_matches_scipy_reference(store_uri):
    stores = Stores(store_uri)
    try:
        _check_full_fetch(stores, store_uri.startswith("file://"))
    finally:
        stores.backend.close()


def test_sampled_fetch_is_reproducible_bounded_and_shared(store_uri):
    stores = Stores(store_uri)
    try:
        _check_sampled_fetch(stores)
    finally:
        stores.backend.close()


def _looped_store(tmp_path, name: str, indices: list[int]) -> KHopFetcher:
    """4 vertices; row v of the in-edge CSR lists the vertices v aggregates from."""
    sizes = [3, 1, 1, 1]
    write_graph(
        f"file://{tmp_path}",
        name,
        indptr=np.concatenate(([0], np.cumsum(sizes))).astype(np.int64),
        indices=np.array(indices, np.int64),
        features=np.zeros((4, DIM), np.float32),
        symmetrized=False,
    )
    return KHopFetcher(open_graph(f"file://{tmp_path}", name))


def test_self_loops_are_stored_and_excluded_from_gcn_degrees(tmp_path):
    import dataclasses

    from gnn_faas.storage.format import MANIFEST
    from gnn_faas.storage.overlay import GraphOverlay

    # vertex 0 has two self loops and an edge from 3; vertex 2 one self loop
    f = _looped_store(tmp_path, "loops", [0, 0, 3, 0, 2, 1])
    g = f.graph
    assert g.manifest.extra["self_loops"] == 3 and g.has("self_loops")
    v = np.array([0, 1, 2, 3])
    assert f.in_degrees(v).tolist() == [3, 1, 1, 1]
    assert f.self_loops(v).tolist() == [2, 0, 1, 0]
    assert f.gcn_degrees(v).tolist() == [1, 1, 0, 1]
    cg = f.fetch([0, 2], 1, degrees=True)  # rows 0 and 2 expanded; 3 is outer
    assert cg.nodes.tolist() == [0, 2, 3] and cg.in_degree.tolist() == [1, 0, 1]
    # added edges: 4 -> 4, 4 -> 0 and another 0 -> 0
    ov = GraphOverlay.build(4, np.zeros((1, DIM)), np.array([[4, 4], [4, 0], [0, 0]]), False)
    assert f.self_loops(np.array([0, 4]), ov).tolist() == [3, 1]
    assert f.gcn_degrees(np.array([0, 4]), ov).tolist() == [2, 0]

    # a graph without self loops: count 0, no blob, and no read for them
    plain = _looped_store(tmp_path, "plain", [1, 2, 3, 0, 3, 1])
    assert plain.graph.manifest.extra["self_loops"] == 0
    assert not plain.graph.has("self_loops")
    trips = plain.reader.stats.round_trips
    assert plain.self_loops(v).tolist() == [0, 0, 0, 0]
    assert plain.reader.stats.round_trips == trips

    # a store written before the count existed: the neighbour lists are read
    extra = {k: x for k, x in g.manifest.extra.items() if k != "self_loops"}
    blobs = {k: b for k, b in g.manifest.blobs.items() if k != "self_loops"}
    legacy = dataclasses.replace(g.manifest, extra=extra, blobs=blobs)
    g.backend.pipe_file(f"loops/{MANIFEST}", legacy.to_json().encode())
    old = KHopFetcher(open_graph(g.backend, "loops"))
    assert not old.graph.has("self_loops")
    assert old.gcn_degrees(v).tolist() == [1, 1, 0, 1]


def test_a_streamed_feature_read_answers_the_same_in_bounded_chunks(tmp_path):
    stores = Stores(f"file://{tmp_path}")
    case = LARGEST[0]
    fetcher = stores.fetcher(case)
    ids = np.random.default_rng(4).integers(0, case.n, 50)  # repeats, any order
    row = 4 * DIM
    trips = fetcher.reader.stats.round_trips
    rows = fetcher.read_features(ids, max_buffer_bytes=7 * row)
    np.testing.assert_array_equal(rows, case.features[ids])
    assert rows.dtype == np.float32 and rows.flags.c_contiguous
    # 50 rows, 7 a chunk: 8 reads, each within its chunk's needed bytes twice over
    assert fetcher.reader.stats.round_trips - trips == 8
    assert fetcher.reader.stats.bytes_read <= 2 * fetcher.reader.stats.bytes_needed
    # a buffer larger than the rows: one read, as without a bound
    again = fetcher.read_features(ids, max_buffer_bytes=10**9)
    np.testing.assert_array_equal(again, rows)
    assert fetcher.reader.stats.round_trips - trips == 9
    stores.backend.close()
