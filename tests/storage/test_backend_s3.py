"""The conformance suite and S3 specifics against moto's standalone S3 server."""

from __future__ import annotations

import sys
import uuid

import numpy as np
import pytest
from botocore.exceptions import ClientError, EndpointConnectionError

from gnn_faas.errors import (
    BlobNotFound,
    InvalidRequest,
    MissingExtra,
    StorageError,
    TransientStorageError,
)
from gnn_faas.storage.backends import backend_class, open_backend
from gnn_faas.storage.backends import base as backends_base
from gnn_faas.storage.backends.s3 import S3Backend
from tests.servers import free_port
from tests.storage.backend_suite import BackendSuite, blob, random_ranges, slices


@pytest.fixture
def backend(s3_env):
    store = S3Backend(f"{s3_env}/{uuid.uuid4().hex[:12]}")
    yield store
    for key in store.ls(""):
        store.rm(key)
    store.close()


class TestS3Backend(BackendSuite):
    pass


@pytest.fixture
def no_sleep(monkeypatch):
    """Record the retries' backoff delays instead of sleeping them."""
    delays: list[float] = []
    monkeypatch.setattr(backends_base.time, "sleep", delays.append)
    return delays


def _client_error(code: str, status: int) -> ClientError:
    return ClientError(
        {"Error": {"Code": code, "Message": code}, "ResponseMetadata": {"HTTPStatusCode": status}},
        "GetObject",
    )


def _flaky_get(backend: S3Backend, monkeypatch, failures: list[Exception]) -> list[int]:
    """Make get_object raise ``failures`` in turn, then behave; returns the call log."""
    calls: list[int] = []
    original = backend._client.get_object

    def get_object(**kwargs):
        calls.append(1)
        if len(calls) <= len(failures):
            raise failures[len(calls) - 1]
        return original(**kwargs)

    monkeypatch.setattr(backend._client, "get_object", get_object)
    return calls


def test_uri_forms(s3_env):
    with S3Backend("s3://some-bucket") as store:
        assert (store.bucket, store.prefix) == ("some-bucket", "")
    with S3Backend("s3://some-bucket/a/b/") as store:
        assert (store.bucket, store.prefix) == ("some-bucket", "a/b")
    for bad in ("s3://", "s3:///prefix", "s3://bucket/p?x=1"):
        with pytest.raises(InvalidRequest):
            S3Backend(bad)


def test_one_ranged_get_per_range_into_one_buffer(backend, monkeypatch):
    data = blob(30_000, seed=1)
    backend.pipe_file("f.bin", data)
    calls = _flaky_get(backend, monkeypatch, [])
    starts, ends = random_ranges(np.random.default_rng(2), len(data), 64)
    got = backend.read_ranges("f.bin", starts, ends)
    assert got.tobytes() == slices(data, starts, ends)
    assert len(calls) == int(np.count_nonzero(ends > starts))


def test_multipart_upload_for_large_blobs(s3_env):
    size = 11 << 20
    data = blob(size, seed=3)
    uri = f"{s3_env}/{uuid.uuid4().hex[:12]}"
    with S3Backend(uri, multipart_threshold=5 << 20, part_size=5 << 20) as store:
        store.pipe_file("big.bin", data)
        head = store._client.head_object(Bucket=store.bucket, Key=store._key("big.bin"))
        assert head["ETag"].strip('"').endswith("-3")  # three parts
        assert store.size("big.bin") == size
        starts = np.array([0, (5 << 20) - 10, size - 100])
        ends = np.array([100, (5 << 20) + 10, size])
        assert store.read_ranges("big.bin", starts, ends).tobytes() == slices(data, starts, ends)
        assert store.cat_file("big.bin") == data
        store.rm("big.bin")


def test_ls_follows_pagination(backend):
    backend.list_page_size = 2
    keys = [f"g/k{i}.bin" for i in range(7)]
    for k in keys:
        backend.pipe_file(k, b"x")
    assert backend.ls("g/") == keys


def test_connection_errors_are_retried(backend, monkeypatch, no_sleep):
    data = blob(2000)
    backend.pipe_file("k.bin", data)
    down = EndpointConnectionError(endpoint_url="http://127.0.0.1:1")
    calls = _flaky_get(backend, monkeypatch, [down, _client_error("SlowDown", 503)])
    assert backend.cat_file("k.bin", 10, 1500) == data[10:1500]
    assert len(calls) == 3
    assert len(no_sleep) == 2 and all(0 < d <= 1.0 for d in no_sleep)


def test_persistent_throttling_gives_up_after_bounded_attempts(backend, monkeypatch, no_sleep):
    backend.pipe_file("k.bin", b"abc")
    calls = _flaky_get(backend, monkeypatch, [_client_error("SlowDown", 503)] * 100)
    with pytest.raises(TransientStorageError, match="SlowDown"):
        backend.cat_file("k.bin")
    assert len(calls) == backend.retry_attempts
    assert len(no_sleep) == backend.retry_attempts - 1


def test_permanent_errors_are_not_retried(backend, monkeypatch, no_sleep):
    backend.pipe_file("k.bin", b"abc")
    calls = _flaky_get(backend, monkeypatch, [_client_error("AccessDenied", 403)])
    with pytest.raises(StorageError, match="AccessDenied") as err:
        backend.cat_file("k.bin")
    assert not isinstance(err.value, TransientStorageError)
    assert len(calls) == 1 and no_sleep == []


def test_unreachable_endpoint_is_a_transient_error(s3_env, monkeypatch, no_sleep):
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")
    with (
        S3Backend(f"{s3_env}/x", retry_attempts=2) as store,
        pytest.raises(TransientStorageError, match="unreachable"),
    ):
        store.exists("k.bin")
    assert len(no_sleep) == 1


def test_missing_bucket_is_named(s3_env):
    with (
        S3Backend("s3://no-such-bucket-here/p") as store,
        pytest.raises(BlobNotFound, match="no-such-bucket-here"),
    ):
        store.cat_file("k.bin")


def test_missing_client_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "boto3", None)
    with pytest.raises(MissingExtra, match=r"pip install 'gnn-faas\[s3\]'"):
        backend_class("s3")
    with pytest.raises(MissingExtra, match="boto3"):
        open_backend("s3://bucket/prefix")
