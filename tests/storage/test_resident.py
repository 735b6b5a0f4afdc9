"""The gateway's structure: resident or chunk-cached, verified, concurrent (storage/resident.py).

A resident structure and a chunk-cached one must give the fetcher exactly what
the store gives it; every broken CSR invariant and every changed byte is
refused with its reason; reads of two requests overlap (nothing serialises
them), and two requests needing one chunk share one store read.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
import scipy.sparse as sp

from gnn_faas import deadline
from gnn_faas.errors import CorruptBlob, StoreUnavailable
from gnn_faas.storage.backends import open_backend
from gnn_faas.storage.chunked import ChunkedReads, ChunkSpec
from gnn_faas.storage.fetcher import KHopFetcher
from gnn_faas.storage.format import chunk_digests, open_graph, write_graph
from gnn_faas.storage.resident import check_csr, open_structure, with_backend

N = 3000


def random_graph(seed: int = 0, n: int = N, avg: int = 8):
    rng = np.random.default_rng(seed)
    m = n * avg
    a = sp.coo_matrix((np.ones(m), (rng.integers(0, n, m), rng.integers(0, n, m))), (n, n))
    csr = a.tocsr()
    csr.sum_duplicates()
    feats = rng.standard_normal((n, 16)).astype(np.float32)
    return csr.indptr.astype(np.int64), csr.indices.astype(np.int64), feats


@pytest.fixture
def graph_store(store_uri):
    indptr, indices, feats = random_graph()
    write_graph(store_uri, "g", indptr=indptr, indices=indices, features=feats, symmetrized=False)
    return store_uri


def same_graph(a, b) -> None:
    assert np.array_equal(a.nodes, b.nodes)
    assert np.array_equal(a.indptr, b.indptr)
    assert np.array_equal(a.indices, b.indices)
    assert np.array_equal(a.in_degree, b.in_degree)
    assert a.layer_sizes == b.layer_sizes


@pytest.mark.parametrize("budget", [1 << 30, 20_000], ids=["resident", "chunk-cached"])
def test_structure_answers_as_the_store_does(graph_store, budget):
    graph = open_graph(graph_store, "g")
    structure = open_structure(graph, budget)
    assert structure.resident == (budget > structure.nbytes)
    plain, held = KHopFetcher(graph), KHopFetcher(graph, structure=structure)
    rng = np.random.default_rng(1)
    for _ in range(5):
        targets = rng.integers(0, N, 4)
        same_graph(plain.fetch(targets, 2, degrees=True), held.fetch(targets, 2, degrees=True))
    if structure.resident:  # no store call at all for the k-hop step
        assert held.stats.round_trips == 0
    else:  # the cache stays within its budget
        assert structure.backend.cached_bytes <= budget
        assert structure.figures()["chunks_read"] > 0


def test_csr_invariants_are_checked_one_by_one():
    indptr, indices, _ = random_graph(n=50, avg=3)
    deg = np.bincount(indices, minlength=50)
    check_csr("g", indptr, indices, 50, deg)  # the intact graph passes
    bad = indptr.copy()
    bad[10], bad[11] = bad[11], bad[10] - 1
    cases = {
        "not monotonic": bad,
        "starts at 3": np.concatenate(([3], indptr[1:])),
        "ends at": np.concatenate((indptr[:-1], [indptr[-1] - 1])),
    }
    for reason, ptr in cases.items():
        with pytest.raises(CorruptBlob, match=reason):
            check_csr("g", ptr, indices, 50)
    out_of_range = indices.copy()
    out_of_range[7] = 50
    with pytest.raises(CorruptBlob, match=r"outside \[0, 50\)"):
        check_csr("g", indptr, out_of_range, 50)
    with pytest.raises(CorruptBlob, match="degree does not match"):
        check_csr("g", indptr, indices, 50, deg + (np.arange(50) == 3))
    with pytest.raises(CorruptBlob, match="self_loops"):
        check_csr("g", indptr, indices, 50, None, np.ones(50, np.int64))


def test_a_same_size_change_to_a_structure_blob_is_refused_at_open(tmp_path):
    uri = f"file://{tmp_path}"
    indptr, indices, feats = random_graph()
    write_graph(uri, "g", indptr=indptr, indices=indices, features=feats, symmetrized=False)
    blob = tmp_path / "g" / "indices.bin"
    raw = bytearray(blob.read_bytes())
    raw[100] ^= 0x01  # one bit, same size: the size check alone would pass
    blob.write_bytes(bytes(raw))
    graph = open_graph(uri, "g")
    with pytest.raises(CorruptBlob, match="indices.bin.*sha256"):
        open_structure(graph, 1 << 30)
    # chunk-cached: the chunk holding the flipped bit is refused when first read
    structure = open_structure(graph, 1024)
    fetcher = KHopFetcher(graph, structure=structure)
    with pytest.raises(CorruptBlob, match="chunk 0"):
        fetcher.fetch(np.arange(N), 1)


class GatedBackend:
    """A store whose reads wait at a gate: how many are inside at once is counted."""

    def __init__(self, inner):
        self.inner = inner
        self.gate = threading.Event()
        self.lock = threading.Lock()
        self.inside = 0
        self.most_inside = 0
        self.calls = 0
        self.two_inside = threading.Event()

    def read_ranges(self, path, starts, ends):
        with self.lock:
            self.calls += 1
            self.inside += 1
            self.most_inside = max(self.most_inside, self.inside)
            if self.inside >= 2:
                self.two_inside.set()
        try:
            assert self.gate.wait(timeout=60), "the test never opened the gate"
            return self.inner.read_ranges(path, starts, ends)
        finally:
            with self.lock:
                self.inside -= 1

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_two_requests_reads_overlap(tmp_path):
    uri = f"file://{tmp_path}"
    indptr, indices, feats = random_graph()
    write_graph(uri, "g", indptr=indptr, indices=indices, features=feats, symmetrized=False)
    graph = open_graph(uri, "g")
    gated = GatedBackend(graph.backend)
    fetcher = KHopFetcher(with_backend(graph, gated))
    results: list = [None, None]

    def fetch(i: int) -> None:
        results[i] = fetcher.fetch([i * 1000], 2)

    threads = [threading.Thread(target=fetch, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    # both requests are inside a store read at once: neither waits on the other's
    assert gated.two_inside.wait(timeout=60)
    gated.gate.set()
    for t in threads:
        t.join(timeout=60)
    assert gated.most_inside >= 2
    plain = KHopFetcher(graph)
    for i in range(2):
        same_graph(results[i], plain.fetch([i * 1000], 2))


def test_one_chunk_is_read_once_for_concurrent_requests(tmp_path):
    data = np.arange(1 << 18, dtype=np.uint8).tobytes()  # 256 KiB: four chunks
    backend = open_backend(f"file://{tmp_path}")
    backend.pipe_file("b.bin", data)
    _, chunk, digests = chunk_digests(data)
    gated = GatedBackend(backend)
    spec = ChunkSpec(len(data), chunk, np.frombuffer(digests, np.uint8).reshape(-1, 32))
    reads = ChunkedReads(gated, {"b.bin": spec}, cache_bytes=1 << 20)
    got: list = [None, None]

    def read(i: int) -> None:
        got[i] = reads.read_ranges("b.bin", np.array([10 + i]), np.array([20 + i])).tobytes()

    first = threading.Thread(target=read, args=(0,))
    first.start()
    while gated.calls == 0:  # the first read is at the store (polling a counter)
        threading.Event().wait(0.01)
    second = threading.Thread(target=read, args=(1,))
    second.start()
    while reads.figures["waits"] == 0:  # the second waits on the first's flight
        threading.Event().wait(0.01)
    gated.gate.set()
    first.join(timeout=60)
    second.join(timeout=60)
    assert got == [data[10:20], data[11:21]]
    assert gated.calls == 1 and reads.figures["chunks_read"] == 1
    # a third read of the chunk is a cache hit: no store call
    assert reads.read_ranges("b.bin", np.array([5]), np.array([9])).tobytes() == data[5:9]
    assert gated.calls == 1 and reads.figures["cache_hits"] >= 1


def test_a_wait_on_a_hung_store_ends_at_the_deadline(tmp_path):
    data = bytes(1 << 17)
    backend = open_backend(f"file://{tmp_path}")
    backend.pipe_file("b.bin", data)
    gated = GatedBackend(backend)  # never opened: the store hangs
    spec = ChunkSpec(len(data), 1 << 16, None)
    reads = ChunkedReads(gated, {"b.bin": spec}, cache_bytes=1 << 20)
    with deadline.scope(0.2), pytest.raises(StoreUnavailable, match="deadline"):
        reads.read_ranges("b.bin", np.array([0]), np.array([10]))
    gated.gate.set()  # the stuck I/O thread finishes; the chunk is then cached
    while reads.figures["chunks_read"] == 0:
        threading.Event().wait(0.01)
    assert reads.read_ranges("b.bin", np.array([0]), np.array([10])).tobytes() == data[:10]
