"""The conformance suite and Redis specifics against a real ``redis-server``.

The backend under test stores blobs in 256-byte chunks, so the suite's blobs
cross many chunk boundaries.
"""

from __future__ import annotations

import sys
import uuid

import numpy as np
import pytest
import redis

from gnn_faas.errors import (
    BlobNotFound,
    CorruptBlob,
    InvalidRequest,
    MissingExtra,
    TransientStorageError,
)
from gnn_faas.storage.backends import backend_class, open_backend
from gnn_faas.storage.backends import base as backends_base
from gnn_faas.storage.backends.redis import RedisBackend, split_at_chunks
from tests.servers import free_port
from tests.storage.backend_suite import BackendSuite, blob, slices

CHUNK = 256


def _uri(redis_url: str, chunk: int = CHUNK) -> str:
    return f"{redis_url}?prefix=t-{uuid.uuid4().hex[:12]}/&chunk_size={chunk}"


def _raw_keys(backend: RedisBackend) -> list[str]:
    return sorted(k.decode() for k in backend._client.scan_iter(match=f"{backend.prefix}*"))


@pytest.fixture
def backend(redis_url):
    store = RedisBackend(_uri(redis_url))
    yield store
    for key in store.ls(""):
        store.rm(key)
    leftover = _raw_keys(store)
    store.close()
    assert leftover == [], "rm must delete chunks as well as meta keys"


class TestRedisBackend(BackendSuite):
    pass


@pytest.fixture
def no_sleep(monkeypatch):
    """Record the retries' backoff delays instead of sleeping them."""
    delays: list[float] = []
    monkeypatch.setattr(backends_base.time, "sleep", delays.append)
    return delays


def test_split_at_chunks_matches_bytewise_reference():
    rng = np.random.default_rng(0)
    size, chunk = 1000, 64
    starts = rng.integers(0, 1100, 200)
    ends = starts + rng.integers(0, 300, 200)
    owner, index, first, last, pieces = split_at_chunks(size, chunk, starts, ends)
    data = np.arange(size) % 251
    chunks = [data[i : i + chunk] for i in range(0, size, chunk)]
    got = np.concatenate([chunks[c][a : b + 1] for c, a, b in zip(index, first, last, strict=True)])
    want = np.concatenate([data[s:e] for s, e in zip(starts, ends, strict=True)])
    np.testing.assert_array_equal(got, want)
    assert np.all(last - first + 1 <= chunk) and np.all(first >= 0)
    np.testing.assert_array_equal(np.bincount(owner, minlength=starts.size), pieces)


def test_chunk_keys_follow_writes_overwrites_and_rm(backend):
    backend.pipe_file("g/f.bin", blob(1000))
    keys = _raw_keys(backend)
    assert len(keys) == 1 + 4  # meta + ceil(1000 / 256) chunks
    backend.pipe_file("g/f.bin", blob(300, seed=1))
    keys = _raw_keys(backend)
    assert len(keys) == 1 + 2, keys  # the old generation is gone
    assert backend.cat_file("g/f.bin") == blob(300, seed=1)
    backend.rm("g/f.bin")
    assert _raw_keys(backend) == []


def test_a_read_is_one_pipeline_of_getranges_over_needed_chunks(backend, monkeypatch):
    data = blob(10 * CHUNK)
    backend.pipe_file("f.bin", data)  # the writer caches the blob's meta
    server = backend._client
    server.config_resetstat()
    executes = []
    original = redis.client.Pipeline.execute
    monkeypatch.setattr(
        redis.client.Pipeline,
        "execute",
        lambda self, *a, **k: executes.append(len(self.command_stack)) or original(self, *a, **k),
    )
    # one range inside chunk 0, one crossing 2|3, one spanning chunks 5..7
    starts = np.array([10, 3 * CHUNK - 5, 5 * CHUNK + 1])
    ends = np.array([20, 3 * CHUNK + 5, 7 * CHUNK + 2])
    assert backend.read_ranges("f.bin", starts, ends).tobytes() == slices(data, starts, ends)
    assert executes == [1 + 2 + 3 + 1]  # one pipeline: 6 GETRANGEs and the meta check
    stats = server.info("commandstats")
    assert stats["cmdstat_getrange"]["calls"] == 6
    assert stats["cmdstat_get"]["calls"] == 1  # the meta check; no chunk is read whole
    assert "cmdstat_mget" not in stats


def test_reader_cache_follows_another_writer(redis_url):
    uri = _uri(redis_url)
    with RedisBackend(uri) as reader, RedisBackend(uri) as writer:
        writer.pipe_file("k.bin", blob(2000, seed=1))
        assert reader.cat_file("k.bin", 0, 600) == blob(2000, seed=1)[:600]
        writer.pipe_file("k.bin", blob(700, seed=2))  # new generation, new size
        assert reader.cat_file("k.bin", 0, 600) == blob(700, seed=2)[:600]
        assert (
            reader.read_ranges("k.bin", np.array([650]), np.array([2000])).tobytes()
            == (blob(700, seed=2)[650:])
        )
        writer.rm("k.bin")
        with pytest.raises(BlobNotFound, match="k.bin"):
            reader.read_ranges("k.bin", np.array([0]), np.array([10]))


def test_reads_follow_each_blobs_own_chunk_size(redis_url):
    uri = _uri(redis_url, chunk=100)
    data = blob(1234, seed=3)
    with RedisBackend(uri) as small:
        small.pipe_file("k.bin", data)
    other = uri.replace("chunk_size=100", "chunk_size=4096")
    with RedisBackend(other) as large:
        assert large.chunk_size == 4096
        assert large.cat_file("k.bin", 95, 1001) == data[95:1001]
        large.rm("k.bin")


def test_uri_options_and_databases(redis_url):
    ns = f"t-{uuid.uuid4().hex[:8]}/"
    with (
        RedisBackend(f"{redis_url[:-2]}/1?prefix={ns}") as db1,
        RedisBackend(f"{redis_url}?prefix={ns}") as db0,
    ):
        assert db1.chunk_size == 1 << 20 and db1.prefix == ns
        db1.pipe_file("k.bin", b"in db 1")
        assert db1.cat_file("k.bin") == b"in db 1"
        assert not db0.exists("k.bin")
        db1.rm("k.bin")
    with pytest.raises(InvalidRequest, match="chunk_size"):
        RedisBackend(f"{redis_url}?chunk_size=big")
    with pytest.raises(InvalidRequest, match="chunk_size"):
        RedisBackend(f"{redis_url}?chunk_size=-3")
    with pytest.raises(InvalidRequest, match="prefx"):
        RedisBackend(f"{redis_url}?prefx=typo/")
    with RedisBackend(f"{redis_url}?socket_timeout=7&prefix=p/") as opts:
        assert opts.prefix == "p/"
        assert opts._client.connection_pool.connection_kwargs["socket_timeout"] == 7


def test_damaged_meta_and_chunks_are_reported(backend):
    backend.pipe_file("k.bin", blob(1000))
    meta_key = f"{backend.prefix}k.bin#meta"
    gen = backend._client.get(meta_key).split()[2].decode()
    backend._client.delete(f"{backend.prefix}k.bin#{gen}.2")
    with pytest.raises(CorruptBlob, match="k.bin"):
        backend.cat_file("k.bin")
    backend._client.set(meta_key, b"not a meta")
    with pytest.raises(CorruptBlob, match="k.bin#meta"):
        backend.size("k.bin")
    backend._client.delete(*_raw_keys(backend))  # leave nothing for the fixture's check


def test_connection_errors_are_retried(backend, monkeypatch, no_sleep):
    data = blob(900)
    backend.pipe_file("k.bin", data)
    calls = []
    original = redis.client.Pipeline.execute

    def flaky(self, *args, **kwargs):
        calls.append(1)
        if len(calls) <= 2:
            self.reset()
            raise redis.ConnectionError("connection reset by peer")
        return original(self, *args, **kwargs)

    monkeypatch.setattr(redis.client.Pipeline, "execute", flaky)
    assert backend.read_ranges("k.bin", np.array([5]), np.array([800])).tobytes() == data[5:800]
    assert len(calls) == 3
    assert len(no_sleep) == 2 and all(0 < d <= 1.0 for d in no_sleep)


def test_unreachable_server_is_a_transient_error(no_sleep):
    store = RedisBackend(f"redis://127.0.0.1:{free_port()}/0", retry_attempts=3)
    with pytest.raises(TransientStorageError, match="redis unreachable"):
        store.exists("k.bin")
    assert len(no_sleep) == 2  # bounded: attempts - 1 backoffs, then the error
    store.close()


def test_missing_client_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "redis", None)
    with pytest.raises(MissingExtra, match=r"pip install 'gnn-faas\[redis\]'"):
        backend_class("redis")
    with pytest.raises(MissingExtra, match="redis"):
        open_backend("redis://127.0.0.1:6379/0")
