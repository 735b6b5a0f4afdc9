"""The storage backend interface, shaped like fsspec's ``cat_ranges``.

A backend addresses blobs by a relative key (``"bitcoin-otc/indptr.bin"``)
under its root. The one hot call is :meth:`StorageBackend.cat_ranges`, a
batched range read: the default here loops over :meth:`cat_file` and is
correct for every backend; each backend overrides it with its fast path
(file: vectorised gather from one mapping; S3: concurrent ranged GETs; Redis:
one pipeline of GETRANGEs).
"""

from __future__ import annotations

import random
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import ClassVar, TypeVar

import numpy as np

from gnn_faas.errors import TransientStorageError

T = TypeVar("T")


class StorageBackend(ABC):
    """A flat key -> bytes store with ranged reads.

    What a request and a byte cost on a store is measured, not declared here:
    see :mod:`gnn_faas.storage.request_cost`.
    """

    scheme: ClassVar[str] = ""

    def __init__(self, uri: str):
        self.uri = uri

    # -- reads -------------------------------------------------------------
    @abstractmethod
    def cat_file(self, path: str, start: int | None = None, end: int | None = None) -> bytes:
        """Bytes ``[start, end)`` of ``path`` (whole blob when both are None)."""

    def cat_ranges(
        self, paths: Sequence[str], starts: Sequence[int], ends: Sequence[int]
    ) -> list[bytes]:
        """Bytes ``[starts[i], ends[i])`` of ``paths[i]`` for every i, as one batch.

        Correct looping default; backends override it with their fast path.
        """
        if not (len(paths) == len(starts) == len(ends)):
            raise ValueError("paths, starts and ends must have the same length")
        return [self.cat_file(p, int(s), int(e)) for p, s, e in zip(paths, starts, ends)]

    def read_ranges(self, path: str, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """The ranges ``[starts[i], ends[i])`` of one blob, concatenated, as uint8.

        This is the call the k-hop fetcher and feature reads use: one batch, one
        buffer, no per-range Python objects on the fast paths. The default
        joins :meth:`cat_ranges`; backends override it.
        """
        starts = np.asarray(starts, dtype=np.int64)
        ends = np.asarray(ends, dtype=np.int64)
        if starts.size == 0:
            return np.empty(0, dtype=np.uint8)
        parts = self.cat_ranges([path] * starts.size, starts.tolist(), ends.tolist())
        return np.frombuffer(b"".join(parts), dtype=np.uint8)

    @abstractmethod
    def size(self, path: str) -> int:
        """Size in bytes; raises :class:`BlobNotFound` when absent."""

    @abstractmethod
    def exists(self, path: str) -> bool: ...

    @abstractmethod
    def ls(self, prefix: str = "") -> list[str]:
        """Keys under ``prefix`` (a key prefix, not a glob), sorted."""

    # -- writes ------------------------------------------------------------
    @abstractmethod
    def pipe_file(self, path: str, data: bytes | memoryview) -> None:
        """Create or replace ``path`` with ``data``."""

    @abstractmethod
    def rm(self, path: str) -> None:
        """Delete ``path``; absent paths are ignored."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections or descriptors."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.uri!r})"


def with_retries(
    call: Callable[[], T],
    *,
    attempts: int = 5,
    base_delay: float = 0.05,
    max_delay: float = 1.0,
    retry_on: tuple[type[BaseException], ...] = (TransientStorageError,),
) -> T:
    """Run ``call``, retrying transient failures with bounded, jittered backoff."""
    for attempt in range(attempts):
        try:
            return call()
        except retry_on:
            if attempt == attempts - 1:
                raise
            delay = min(max_delay, base_delay * (2**attempt))
            time.sleep(delay * (0.5 + random.random() / 2))
    raise AssertionError("unreachable")
