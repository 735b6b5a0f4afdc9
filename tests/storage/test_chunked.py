"""Chunk digests and reads verified chunk by chunk (storage/format.py, storage/chunked.py)."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from gnn_faas.errors import CorruptBlob
from gnn_faas.storage.chunked import ChunkedReads
from gnn_faas.storage.fetcher import KHopFetcher
from gnn_faas.storage.format import (
    MIN_CHUNK_BYTES,
    BlobDigester,
    chunk_bytes_for,
    chunk_digests,
    open_graph,
    write_graph,
)
from gnn_faas.storage.resident import verified_reads


def test_chunk_size_keeps_the_digest_blob_small():
    assert chunk_bytes_for(0) == MIN_CHUNK_BYTES
    assert chunk_bytes_for(MIN_CHUNK_BYTES * 65536) == MIN_CHUNK_BYTES
    assert chunk_bytes_for(MIN_CHUNK_BYTES * 65536 + 1) == 2 * MIN_CHUNK_BYTES
    assert chunk_bytes_for(50 << 30) * 65536 >= 50 << 30


def test_digests_fed_in_any_pieces_equal_the_whole():
    rng = np.random.default_rng(0)
    data = rng.integers(0, 256, 300_000, dtype=np.uint8).tobytes()
    whole, chunk, digests = chunk_digests(data)
    d = BlobDigester(len(data))
    pos = 0
    for size in rng.integers(1, 90_000, 50):  # uneven pieces across chunk borders
        d.update(data[pos : pos + int(size)])
        pos += int(size)
        if pos >= len(data):
            break
    d.update(data[pos:])
    assert d.whole.hexdigest() == whole == hashlib.sha256(data).hexdigest()
    assert d.chunk_digests() == digests
    expect = b"".join(
        hashlib.sha256(data[i : i + chunk]).digest() for i in range(0, len(data), chunk)
    )
    assert digests == expect


@pytest.fixture
def graph_dir(tmp_path):
    rng = np.random.default_rng(0)
    n = 4000
    indptr = np.arange(n + 1, dtype=np.int64)
    indices = rng.integers(0, n, n)
    feats = rng.standard_normal((n, 32)).astype(np.float32)  # 512 KB: 8 chunks
    write_graph(
        f"file://{tmp_path}", "g", indptr=indptr, indices=indices, features=feats,
        symmetrized=False,
    )  # fmt: skip
    return tmp_path, feats


def test_every_blob_carries_chunk_digests(graph_dir):
    path, _ = graph_dir
    graph = open_graph(f"file://{path}", "g", verify="full")
    for key, info in graph.manifest.blobs.items():
        assert info.chunk_bytes == MIN_CHUNK_BYTES, key
        assert (path / "g" / info.chunks_file).stat().st_size == info.num_chunks * 32


def test_a_changed_chunk_is_refused_and_the_others_served(graph_dir):
    path, feats = graph_dir
    blob = path / "g" / "features.bin"
    raw = bytearray(blob.read_bytes())
    raw[3 * MIN_CHUNK_BYTES + 17] ^= 0xFF  # chunk 3, same size
    blob.write_bytes(bytes(raw))
    graph = verified_reads(open_graph(f"file://{path}", "g"))
    assert isinstance(graph.backend, ChunkedReads)
    fetcher = KHopFetcher(graph)
    rows_per_chunk = MIN_CHUNK_BYTES // (32 * 4)
    ok = np.array([0, 5, rows_per_chunk + 1, 7 * rows_per_chunk + 3])
    assert np.array_equal(fetcher.read_features(ok), feats[ok])
    assert graph.backend.verified_chunks(graph.path("features")) == 3  # chunks 0, 1, 7
    bad = np.array([3 * rows_per_chunk + 2])
    with pytest.raises(CorruptBlob, match="chunk 3"):
        fetcher.read_features(bad)
    with pytest.raises(CorruptBlob, match="chunk 3"):  # and on every later read too
        fetcher.read_features(np.concatenate((ok, bad)))
    # rows of verified chunks are read as before (only the rows, no chunk)
    before = fetcher.stats.bytes_read
    assert np.array_equal(fetcher.read_features(ok[:1]), feats[ok[:1]])
    assert fetcher.stats.bytes_read - before == 32 * 4


def test_full_verify_names_a_bad_chunk(graph_dir):
    path, _ = graph_dir
    blob = path / "g" / "features.bin"
    raw = bytearray(blob.read_bytes())
    raw[-1] ^= 0x01
    blob.write_bytes(bytes(raw))
    with pytest.raises(CorruptBlob, match="features.bin"):
        open_graph(f"file://{path}", "g", verify="full")


def test_rows_spread_over_a_blob_are_verified_in_bounded_batches(graph_dir, monkeypatch):
    """A read whose rows touch every chunk holds at most VERIFY_BATCH_BYTES of
    chunks at once (a memory function's warm-up under a tight limit), and still
    answers every row, in the order asked, with every chunk verified."""
    import gnn_faas.storage.chunked as chunked

    path, feats = graph_dir
    monkeypatch.setattr(chunked, "VERIFY_BATCH_BYTES", 2 * MIN_CHUNK_BYTES)
    graph = verified_reads(open_graph(f"file://{path}", "g"))
    backend = graph.backend
    batches = []
    inner = backend._read_chunks

    def spy(p, spec, ids):
        batches.append(len(ids))
        return inner(p, spec, ids)

    monkeypatch.setattr(backend, "_read_chunks", spy)
    rows_per_chunk = MIN_CHUNK_BYTES // (32 * 4)
    ids = np.random.default_rng(1).permutation(feats.shape[0])[:300]  # every chunk, unsorted
    got = KHopFetcher(graph).read_features(ids)
    np.testing.assert_array_equal(got, feats[ids])
    assert backend.verified_chunks(graph.path("features")) == -(-feats.shape[0] // rows_per_chunk)
    assert max(batches) <= 2 and len(batches) >= 4
