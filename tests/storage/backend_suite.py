"""The conformance suite every storage backend passes.

``BackendSuite`` is mixed into one test class per backend
(``class TestFileBackend(BackendSuite)``), which provides a ``backend``
fixture: a fresh, empty store. ``large_size`` is a blob size that crosses many
chunk (or part) boundaries of the backend under test.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from gnn_faas.errors import BlobNotFound
from gnn_faas.storage.backends import StorageBackend, open_backend
from gnn_faas.storage.format import open_graph, write_graph
from gnn_faas.storage.request_cost import constants_for


def blob(size: int, seed: int = 0) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8).tobytes()


def slices(data: bytes, starts, ends) -> bytes:
    """The reference for a batched read: plain Python slicing, range by range."""
    return b"".join(data[s:e] for s, e in zip(starts, ends, strict=True))


def random_ranges(rng: np.random.Generator, size: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` ranges of a ``size``-byte blob, unsorted, with overlapping, adjacent
    and empty ones among them."""
    starts = rng.integers(0, size, n)
    lengths = rng.integers(0, max(2, size // 8), n)
    lengths[rng.random(n) < 0.15] = 0
    ends = np.minimum(starts + lengths, size)
    # a few ranges that touch the one before and a few exact repeats
    k = n // 5
    if k:
        starts[1 : 1 + k] = ends[:k]
        ends[1 : 1 + k] = np.minimum(starts[1 : 1 + k] + 7, size)
        starts[n - k :], ends[n - k :] = starts[:k].copy(), ends[:k].copy()
    return starts.astype(np.int64), ends.astype(np.int64)


class BackendSuite:
    """Behaviour shared by every backend; subclasses provide a ``backend`` fixture."""

    large_size = 40_000

    def test_round_trip(self, backend: StorageBackend):
        data = blob(1000)
        backend.pipe_file("a.bin", data)
        assert backend.cat_file("a.bin") == data
        backend.pipe_file("view.bin", memoryview(np.frombuffer(data, np.uint8)))
        assert backend.cat_file("view.bin") == data
        backend.pipe_file("empty.bin", b"")
        assert backend.cat_file("empty.bin") == b""
        assert backend.size("empty.bin") == 0

    def test_cat_file_start_end_follow_slicing(self, backend: StorageBackend):
        data = blob(777, seed=1)
        backend.pipe_file("a.bin", data)
        for start, end in [
            (None, None),
            (0, 777),
            (0, 1),
            (10, 20),
            (None, 100),
            (700, None),
            (5, 5),
            (20, 10),
            (770, 10_000),
            (777, 800),
            (5000, 6000),
            (-10, None),
            (5, -5),
            (-30, -20),
        ]:
            assert backend.cat_file("a.bin", start, end) == data[start:end], (start, end)

    def test_cat_ranges_across_paths_keeps_order(self, backend: StorageBackend):
        a, b = blob(500, seed=2), blob(300, seed=3)
        backend.pipe_file("x/a.bin", a)
        backend.pipe_file("x/b.bin", b)
        paths = ["x/b.bin", "x/a.bin", "x/a.bin", "x/b.bin", "x/a.bin", "x/b.bin"]
        starts = [10, 490, 0, 299, 100, 50]
        ends = [20, 500, 0, 300, 400, 50]
        refs = {"x/a.bin": a, "x/b.bin": b}
        got = backend.cat_ranges(paths, starts, ends)
        assert got == [refs[p][s:e] for p, s, e in zip(paths, starts, ends, strict=True)]
        assert backend.cat_ranges([], [], []) == []
        with pytest.raises(ValueError):
            backend.cat_ranges(["x/a.bin"], [0, 1], [1])

    def test_read_ranges_equals_concatenated_slices(self, backend: StorageBackend):
        data = blob(5000, seed=4)
        backend.pipe_file("r.bin", data)
        rng = np.random.default_rng(5)
        for n in (1, 2, 17, 120):
            starts, ends = random_ranges(rng, len(data), n)
            got = backend.read_ranges("r.bin", starts, ends)
            assert got.dtype == np.uint8
            assert got.tobytes() == slices(data, starts, ends), n
        assert backend.read_ranges("r.bin", np.empty(0, np.int64), np.empty(0, np.int64)).size == 0

    def test_read_ranges_past_the_end_are_clamped(self, backend: StorageBackend):
        data = blob(300, seed=6)
        backend.pipe_file("r.bin", data)
        starts = np.array([290, 0, 400, 299])
        ends = np.array([310, 10, 500, 1000])
        got = backend.read_ranges("r.bin", starts, ends)
        assert got.tobytes() == slices(data, starts, ends)

    def test_size_exists_ls_rm(self, backend: StorageBackend):
        assert backend.ls("") == []
        keys = ["g1/indptr.bin", "g1/indices.bin", "g2/indptr.bin", "top.bin"]
        for i, k in enumerate(keys):
            backend.pipe_file(k, blob(10 * (i + 1), seed=i))
        assert backend.ls("") == sorted(keys)
        assert backend.ls("g1/") == ["g1/indices.bin", "g1/indptr.bin"]
        assert backend.ls("g") == sorted(keys[:3])
        assert backend.ls("nothing/") == []
        assert [backend.size(k) for k in keys] == [10, 20, 30, 40]
        assert backend.exists("g2/indptr.bin")
        assert not backend.exists("g2/indices.bin")
        assert not backend.exists("g2")
        backend.rm("g1/indptr.bin")
        backend.rm("g1/indptr.bin")  # absent: ignored
        backend.rm("never/was.bin")
        assert not backend.exists("g1/indptr.bin")
        assert backend.ls("g1/") == ["g1/indices.bin"]

    def test_missing_blob_is_named(self, backend: StorageBackend):
        backend.pipe_file("present.bin", b"abc")
        missing = "graph-x/missing.bin"
        calls = [
            lambda: backend.cat_file(missing),
            lambda: backend.cat_file(missing, 0, 10),
            lambda: backend.size(missing),
            lambda: backend.read_ranges(missing, np.array([0]), np.array([4])),
            lambda: backend.cat_ranges(["present.bin", missing], [0, 0], [1, 1]),
        ]
        for call in calls:
            with pytest.raises(BlobNotFound, match="graph-x/missing.bin"):
                call()
        assert not backend.exists(missing)

    def test_large_blob_crosses_chunk_boundaries(self, backend: StorageBackend):
        data = blob(self.large_size, seed=7)
        backend.pipe_file("big/features.bin", data)
        assert backend.size("big/features.bin") == len(data)
        assert backend.cat_file("big/features.bin") == data
        rng = np.random.default_rng(8)
        starts, ends = random_ranges(rng, len(data), 60)
        # and ranges spanning the whole blob or most of it
        starts = np.concatenate((starts, [0, 1, len(data) // 3]))
        ends = np.concatenate((ends, [len(data), len(data) - 1, len(data)]))
        got = backend.read_ranges("big/features.bin", starts, ends)
        assert got.tobytes() == slices(data, starts, ends)

    def test_overwrite_replaces_content_and_size(self, backend: StorageBackend):
        first, second, third = blob(self.large_size, 9), blob(123, 10), blob(4000, 11)
        backend.pipe_file("o.bin", first)
        assert backend.cat_file("o.bin", 0, 50) == first[:50]  # a reader may cache metadata
        backend.pipe_file("o.bin", second)
        assert backend.size("o.bin") == 123
        assert backend.cat_file("o.bin") == second
        assert (
            backend.read_ranges("o.bin", np.array([100]), np.array([4000])).tobytes()
            == (second[100:])
        )
        backend.pipe_file("o.bin", third)
        assert backend.cat_file("o.bin", 3990, None) == third[3990:]
        assert backend.ls("") == ["o.bin"]

    def test_nested_and_odd_keys(self, backend: StorageBackend):
        keys = ["a/b/c/d.bin", "a/b/c2/e.bin", "a/bc/f.bin", "odd [1]*?/x-y_z.v2.bin"]
        for i, k in enumerate(keys):
            backend.pipe_file(k, blob(32, seed=i))
        for i, k in enumerate(keys):
            assert backend.cat_file(k) == blob(32, seed=i)
        assert backend.ls("a/b/") == ["a/b/c/d.bin", "a/b/c2/e.bin"]
        assert backend.ls("a/b/c/") == ["a/b/c/d.bin"]
        assert backend.ls("a/b") == keys[:3]
        assert backend.ls("odd [1]*?/") == [keys[3]]
        assert backend.ls("odd [1]") == [keys[3]]
        assert backend.ls("odd [") == [keys[3]]
        assert backend.ls("odd *") == []

    def test_concurrent_readers(self, backend: StorageBackend):
        data = blob(20_000, seed=12)
        backend.pipe_file("c.bin", data)
        rng = np.random.default_rng(13)
        jobs = [random_ranges(rng, len(data), 30) for _ in range(16)]
        with ThreadPoolExecutor(8) as pool:
            got = list(pool.map(lambda r: backend.read_ranges("c.bin", *r).tobytes(), jobs))
        assert got == [slices(data, s, e) for s, e in jobs]

    def test_uri_reopens_the_same_store(self, backend: StorageBackend):
        backend.pipe_file("g/k.bin", b"payload")
        with open_backend(backend.uri) as other:
            assert type(other) is type(backend)
            assert other.cat_file("g/k.bin") == b"payload"
            assert other.ls("") == ["g/k.bin"]
        # the planner has measured constants for every backend kind
        assert constants_for(backend).measured.get("command")

    def test_graph_format_round_trip(self, backend: StorageBackend):
        rng = np.random.default_rng(14)
        n, m = 40, 160
        indices = rng.integers(0, n, m).astype(np.int32)
        indptr = np.concatenate(([0], np.sort(rng.integers(0, m + 1, n)))).astype(np.int64)
        indptr[-1] = m
        features = rng.standard_normal((n, 8)).astype(np.float32)
        write_graph(
            backend, "tiny", indptr=indptr, indices=indices, features=features, symmetrized=False
        )
        graph = open_graph(backend, "tiny", verify="full")
        assert graph.num_nodes == n and graph.num_edges == m
        np.testing.assert_array_equal(graph.read_blob("indptr"), indptr)
        np.testing.assert_array_equal(graph.read_blob("indices"), indices)
        np.testing.assert_array_equal(graph.read_blob("features"), features)
