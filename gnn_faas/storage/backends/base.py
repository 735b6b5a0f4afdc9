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

from gnn_faas import deadline
from gnn_faas.errors import StoreUnavailable, TransientStorageError
from gnn_faas.storage.store_health import StoreHealth, health_of

T = TypeVar("T")

# store calls per operation at most (the first and two retries): with per-call
# timeouts of a few seconds a hung store costs a request at most that many,
# and the request's deadline cuts it shorter (docs/architecture.md, section 6)
DEFAULT_ATTEMPTS = 3
# per-call socket timeouts of the remote backends (seconds): connecting, and
# waiting for the next bytes of an answer (not the whole transfer)
DEFAULT_CONNECT_TIMEOUT_S = 2.0
DEFAULT_READ_TIMEOUT_S = 5.0


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

    def put_if_absent(self, path: str, data: bytes) -> bool:
        """Create ``path`` with ``data`` only if it does not exist: ``True`` when this
        call created it, ``False`` when it existed. The one atomic step a versioned
        graph's commits rely on (storage/versions.py). This default checks, then
        writes: correct for one writer only; every backend overrides it with an
        atomic create (file: link, S3: a conditional PUT, Redis: SET NX)."""
        if self.exists(path):
            return False
        self.pipe_file(path, data)
        return True

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections or descriptors."""

    # -- store calls -------------------------------------------------------
    @property
    def health(self) -> StoreHealth:
        """This store's process-wide health (outages, fail-fast, figures)."""
        return health_of(self.uri)

    def guarded(self, call: Callable[[], T], attempts: int = DEFAULT_ATTEMPTS) -> T:
        """``call()`` (one store operation, raising
        :class:`~gnn_faas.errors.TransientStorageError` for the store's failures),
        reported to the store's :class:`StoreHealth`:

        - a timeout is an outage at once (the store did not answer within a
          timeout of seconds: waiting again would only double it);
        - a refused or reset connection is retried (a fresh connection usually
          works), and is an outage once ``attempts`` calls failed;
        - throttling is retried with backoff, and fails that call (no outage)
          once ``attempts`` calls were throttled.

        The failure is :class:`~gnn_faas.errors.StoreUnavailable` naming the
        store. During an outage a call fails fast unless it is the probe (one
        attempt). No retry begins after the request's deadline. Other errors
        (a missing blob) mean the store answered."""
        health = self.health
        probe = health.admit()
        tries = 1 if probe else max(1, attempts)
        for attempt in range(tries):
            token = health.call_started()
            try:
                result = call()
            except StoreUnavailable:
                raise
            except TransientStorageError as exc:
                kind = failure_kind(exc)
                delay = min(1.0, 0.05 * 2**attempt) * (0.5 + random.random() / 2)
                left = deadline.remaining()
                last = attempt == tries - 1 or (left is not None and left <= delay)
                if kind == "timeout" or last:
                    health.failed(kind, str(exc), probe)
                    raise StoreUnavailable(
                        f"graph store {health.uri} is unavailable: {exc}"
                    ) from exc
                time.sleep(delay)
            except BaseException:
                health.succeeded(probe)
                raise
            else:
                health.succeeded(probe)
                return result
            finally:
                health.call_ended(token)
        raise AssertionError("unreachable")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.uri!r})"


def failure_kind(exc: BaseException) -> str:
    """How a store call failed, for the outage figures: ``timeout``,
    ``throttled`` or ``unreachable`` (a backend sets ``exc.kind``)."""
    return str(getattr(exc, "kind", "unreachable"))
