"""S3 backend: ``s3://BUCKET`` or ``s3://BUCKET/PREFIX``.

The endpoint and credentials come from the standard AWS environment and config
(``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
``AWS_REGION``/``AWS_DEFAULT_REGION``, profiles), which boto3 reads itself; the
region defaults to ``us-east-1`` when none is configured.

Each range is one ``GET`` with ``Range: bytes=a-b``: S3 has no multi-range
requests, so a batch of ranges (:meth:`S3Backend.read_ranges`, the hot path)
is served by up to ``max_workers`` concurrent GETs on one connection pool,
each writing its bytes into its slot of one preallocated buffer. The batch
costs about one request latency instead of one per range; the range planner
(:func:`gnn_faas.storage.ranges.coalesce`, with this store's measured request
cost) keeps the number of requests down.

Retries belong to :meth:`StorageBackend.guarded` (botocore's own are switched
off so the two do not multiply): each GET is retried on its own, so one
throttled range does not repeat the whole batch, and a store that keeps
failing is an outage (:mod:`gnn_faas.storage.store_health`). URI query
options: ``connect_timeout`` and ``read_timeout`` (seconds per call: connecting,
and waiting for the next bytes of an answer), ``retries`` (calls per
operation), ``max_workers`` (concurrent GETs of one batch).
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar
from urllib.parse import parse_qsl, urlparse

import boto3
import numpy as np
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectTimeoutError,
    HTTPClientError,
    IncompleteReadError,
    ReadTimeoutError,
)
from botocore.exceptions import ConnectionError as BotoConnectionError

from gnn_faas.errors import (
    BlobNotFound,
    InvalidRequest,
    StorageError,
    TransientStorageError,
)
from gnn_faas.storage.backends.base import (
    DEFAULT_ATTEMPTS,
    DEFAULT_CONNECT_TIMEOUT_S,
    DEFAULT_READ_TIMEOUT_S,
    StorageBackend,
)
from gnn_faas.storage.backends.file import gather_ranges

T = TypeVar("T")

DEFAULT_REGION = "us-east-1"
_MISSING_CODES = frozenset({"NoSuchKey", "404", "NotFound"})
_TRANSIENT_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottled",
        "RequestLimitExceeded",
        "TooManyRequestsException",
        "RequestTimeout",
        "RequestTimeoutException",
        "InternalError",
        "ServiceUnavailable",
    }
)
_TRANSIENT_EXC = (BotoConnectionError, HTTPClientError, IncompleteReadError)


_OPTIONS = {
    "connect_timeout": float,
    "read_timeout": float,
    "retries": int,
    "max_workers": int,
}


def parse_options(query: str, uri: str) -> dict:
    """The URI's query options (see the module docstring), checked."""
    out: dict = {}
    for key, value in parse_qsl(query, keep_blank_values=True):
        kind = _OPTIONS.get(key)
        if kind is None:
            raise InvalidRequest(
                f"unknown s3 store option {key!r} in {uri!r}; known: {', '.join(sorted(_OPTIONS))}"
            )
        try:
            v = kind(value)
        except ValueError:
            raise InvalidRequest(f"s3 store option {key} must be a number in {uri!r}") from None
        if not math.isfinite(v) or v <= 0:
            raise InvalidRequest(f"s3 store option {key} must be positive in {uri!r}")
        out[key] = v
    return out


class S3Backend(StorageBackend):
    """Blobs are objects ``PREFIX/KEY`` in ``BUCKET``.

    ``max_workers`` bounds the concurrent ranged GETs of one batch (and the
    botocore connection pool, sized to match). Blobs larger than
    ``multipart_threshold`` are uploaded in parts of ``part_size`` bytes (S3
    needs at least 5 MiB per part but the last).
    """

    scheme = "s3"
    list_page_size = 1000

    def __init__(
        self,
        uri: str,
        *,
        max_workers: int = 16,
        multipart_threshold: int = 64 << 20,
        part_size: int = 16 << 20,
        retry_attempts: int = DEFAULT_ATTEMPTS,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT_S,
        read_timeout: float = DEFAULT_READ_TIMEOUT_S,
    ):
        super().__init__(uri)
        parsed = urlparse(uri)
        if parsed.scheme != "s3" or not parsed.netloc:
            raise InvalidRequest(f"not an s3://BUCKET[/PREFIX] URI: {uri!r}")
        if parsed.fragment:
            raise InvalidRequest(f"s3 store URI takes no fragment: {uri!r}")
        options = parse_options(parsed.query, uri)
        self.bucket = parsed.netloc
        self.prefix = parsed.path.strip("/")
        self.max_workers = max(1, int(options.get("max_workers", max_workers)))
        self.multipart_threshold = int(multipart_threshold)
        self.part_size = int(part_size)
        self.retry_attempts = max(1, int(options.get("retries", retry_attempts)))
        connect_timeout = options.get("connect_timeout", connect_timeout)
        read_timeout = options.get("read_timeout", read_timeout)
        session = boto3.session.Session()
        self._client = session.client(
            "s3",
            region_name=session.region_name or DEFAULT_REGION,
            config=Config(
                max_pool_connections=self.max_workers,
                # one attempt per call: StorageBackend.guarded owns the retry policy
                retries={"mode": "standard", "total_max_attempts": 1},
                connect_timeout=connect_timeout,
                read_timeout=read_timeout,
            ),
        )
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()

    # -- helpers -----------------------------------------------------------
    def _key(self, path: str) -> str:
        if not path or path.startswith("/"):
            raise InvalidRequest(f"invalid blob key {path!r}")
        return f"{self.prefix}/{path}" if self.prefix else path

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None:
            with self._pool_lock:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(
                        self.max_workers, thread_name_prefix="gnn-faas-s3"
                    )
        return self._pool

    def _translate(self, exc: Exception, path: str) -> Exception:
        """Map a botocore failure on ``path`` to the project's storage errors."""
        if isinstance(exc, ClientError):
            err = exc.response.get("Error", {})
            code = str(err.get("Code", ""))
            status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
            if code in _MISSING_CODES:
                return BlobNotFound(f"no blob {path!r} in {self.uri}")
            if code == "NoSuchBucket":
                return BlobNotFound(f"no bucket {self.bucket!r} (reading blob {path!r})")
            if code in _TRANSIENT_CODES or status == 429 or status >= 500:
                err = TransientStorageError(f"S3 {code or status} on {path!r}: {exc}")
                err.kind = (
                    "throttled" if status in (429, 503) or "Throttl" in code else "unreachable"
                )
                return err
            return StorageError(f"S3 {code or status} on {path!r} in {self.uri}: {exc}")
        if isinstance(exc, (ReadTimeoutError, ConnectTimeoutError)):
            err = TransientStorageError(f"S3 timed out on {path!r}: {exc}")
            err.kind = "timeout"
            return err
        if isinstance(exc, _TRANSIENT_EXC):
            return TransientStorageError(f"S3 unreachable or interrupted on {path!r}: {exc}")
        return StorageError(f"S3 failure on {path!r} in {self.uri}: {exc}")

    def _call(self, path: str, fn: Callable[[], T]) -> T:
        """``fn()`` with botocore errors translated and transient ones retried."""

        def once() -> T:
            try:
                return fn()
            except (BotoCoreError, ClientError) as exc:
                raise self._translate(exc, path) from exc

        return self.guarded(once, attempts=self.retry_attempts)

    def _get(self, path: str, start: int | None, end: int | None) -> bytes:
        """Bytes ``[start, end)`` with ``0 <= start`` and ``end`` past the end
        allowed (clamped, as slicing); ``None`` for both reads the whole object."""
        key = self._key(path)
        kwargs = {"Bucket": self.bucket, "Key": key}
        if start is not None or end is not None:
            start = start or 0
            if end is not None and end <= start:
                return b""
            kwargs["Range"] = f"bytes={start}-" if end is None else f"bytes={start}-{end - 1}"

        def fetch() -> bytes:
            try:
                resp = self._client.get_object(**kwargs)
            except ClientError as exc:
                # a range starting at or past the end: an empty slice, not an error
                if exc.response.get("Error", {}).get("Code") == "InvalidRange":
                    return b""
                raise
            return resp["Body"].read()

        return self._call(path, fetch)

    # -- reads -------------------------------------------------------------
    def cat_file(self, path: str, start: int | None = None, end: int | None = None) -> bytes:
        if (start is not None and start < 0) or (end is not None and end < 0):
            # negative bounds count from the end, as slicing does: needs the size
            start, end, _ = slice(start, end).indices(self.size(path))
        return self._get(path, start, end)

    def cat_ranges(
        self, paths: Sequence[str], starts: Sequence[int], ends: Sequence[int]
    ) -> list[bytes]:
        if not (len(paths) == len(starts) == len(ends)):
            raise ValueError("paths, starts and ends must have the same length")
        if len(paths) <= 1:
            return [
                self.cat_file(p, int(s), int(e))
                for p, s, e in zip(paths, starts, ends, strict=True)
            ]
        pool = self._executor()
        futures = [
            pool.submit(contextvars.copy_context().run, self.cat_file, p, int(s), int(e))
            for p, s, e in zip(paths, starts, ends, strict=True)
        ]
        return [f.result() for f in futures]

    def read_ranges(self, path: str, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """Concurrent ranged GETs into one buffer: ``out[off[i]:off[i]+len[i]] = blob[s[i]:e[i]]``.

        Ranges past the end of the blob are clamped, as slicing does; the
        result is then compacted (a rare path: the fetcher never asks for them).
        """
        starts = np.asarray(starts, dtype=np.int64)
        ends = np.asarray(ends, dtype=np.int64)
        lengths = np.maximum(ends - starts, 0)
        offsets = np.cumsum(lengths) - lengths
        out = np.empty(int(lengths.sum()), dtype=np.uint8)
        todo = np.flatnonzero(lengths)
        if todo.size == 0:
            return out
        got = np.zeros(starts.size, dtype=np.int64)
        s_list, e_list, o_list = starts.tolist(), ends.tolist(), offsets.tolist()

        def one(i: int) -> None:
            data = self._get(path, s_list[i], e_list[i])
            out[o_list[i] : o_list[i] + len(data)] = np.frombuffer(data, dtype=np.uint8)
            got[i] = len(data)

        if todo.size == 1:
            one(int(todo[0]))
        else:
            # each GET sees the caller's context (its request's deadline)
            pool = self._executor()
            futures = [pool.submit(contextvars.copy_context().run, one, i) for i in todo.tolist()]
            for f in futures:  # the first failure is raised here
                f.result()
        if np.array_equal(got, lengths):
            return out
        return gather_ranges(out, offsets, offsets + got)

    def size(self, path: str) -> int:
        resp = self._call(
            path, lambda: self._client.head_object(Bucket=self.bucket, Key=self._key(path))
        )
        return int(resp["ContentLength"])

    def exists(self, path: str) -> bool:
        try:
            self.size(path)
        except BlobNotFound:
            return False
        return True

    def ls(self, prefix: str = "") -> list[str]:
        root = f"{self.prefix}/" if self.prefix else ""

        def listing() -> list[str]:
            pages = self._client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket,
                Prefix=root + prefix,
                PaginationConfig={"PageSize": self.list_page_size},
            )
            return [obj["Key"][len(root) :] for page in pages for obj in page.get("Contents", ())]

        return sorted(self._call(prefix or "/", listing))

    # -- writes ------------------------------------------------------------
    def pipe_file(self, path: str, data: bytes | memoryview) -> None:
        view = memoryview(data).cast("B")
        key = self._key(path)
        if view.nbytes <= self.multipart_threshold:
            body = data if isinstance(data, bytes) else view.tobytes()
            self._call(
                path, lambda: self._client.put_object(Bucket=self.bucket, Key=key, Body=body)
            )
            return
        self._multipart_upload(path, key, view)

    def _multipart_upload(self, path: str, key: str, view: memoryview) -> None:
        """Upload ``view`` in parts concurrently; abort the upload on failure so
        no half-written object (or orphaned parts) is left behind."""
        upload = self._call(
            path, lambda: self._client.create_multipart_upload(Bucket=self.bucket, Key=key)
        )
        upload_id = upload["UploadId"]
        bounds = list(range(0, view.nbytes, self.part_size))

        def part(i: int) -> dict:
            lo = bounds[i]
            body = view[lo : lo + self.part_size].tobytes()
            resp = self._call(
                path,
                lambda: self._client.upload_part(
                    Bucket=self.bucket, Key=key, UploadId=upload_id, PartNumber=i + 1, Body=body
                ),
            )
            return {"PartNumber": i + 1, "ETag": resp["ETag"]}

        try:
            parts = list(self._executor().map(part, range(len(bounds))))
            self._call(
                path,
                lambda: self._client.complete_multipart_upload(
                    Bucket=self.bucket,
                    Key=key,
                    UploadId=upload_id,
                    MultipartUpload={"Parts": parts},
                ),
            )
        except BaseException:
            # the original failure is the one worth reporting
            with contextlib.suppress(BotoCoreError, ClientError):
                self._client.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload_id)
            raise

    def put_if_absent(self, path: str, data: bytes) -> bool:
        """A conditional PUT (``If-None-Match: *``, S3's conditional writes): a
        412 means the object exists. The object is then read back and compared,
        so a server that checks and writes in two steps (moto) cannot let two
        writers both believe they created it."""
        key = self._key(path)
        body = bytes(data)

        def put() -> bool:
            try:
                self._client.put_object(Bucket=self.bucket, Key=key, Body=body, IfNoneMatch="*")
            except ClientError as exc:
                code = str(exc.response.get("Error", {}).get("Code", ""))
                status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
                if code in ("PreconditionFailed", "ConditionalRequestConflict") or status in (
                    409,
                    412,
                ):
                    return False
                raise
            return True

        if not self._call(path, put):
            return False
        return self._get(path, None, None) == body

    def rm(self, path: str) -> None:
        key = self._key(path)
        self._call(path, lambda: self._client.delete_object(Bucket=self.bucket, Key=key))

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        self._client.close()
