"""Chunked reads of a store's blobs: verified on first read, optionally cached.

A blob written with chunk digests (:mod:`gnn_faas.storage.format`: the
sha256 of every ``chunk_bytes`` of it) can be verified without reading it
whole. :class:`ChunkedReads` wraps a backend and serves the ranged reads of
such blobs:

- a range in chunks already verified is read from the store as usual;
- a range touching a chunk not yet verified makes the whole chunk be read,
  checked against its digest (:class:`~gnn_faas.errors.CorruptBlob` naming
  the chunk on a mismatch) and marked; the range is answered from those bytes,
  so the first read of a chunk is still one round trip. The cost: the first
  read of each chunk moves the chunk (64 KiB or more) instead of the rows in
  it; later reads move only what they need;
- with ``cache_bytes > 0`` the verified chunks are also kept, least recently
  used first out, within that many bytes: a bounded block cache in front of
  the store (the gateway's graph structure when it does not fit in memory).

Chunks in flight are single-flight: a thread that needs a chunk another thread
is already reading waits for that read instead of making its own, and every
wait ends at the request's deadline (:mod:`gnn_faas.deadline`) with
:class:`~gnn_faas.errors.StoreUnavailable`: the reads themselves run on a
small pool of I/O threads, so a hung store holds those threads, never a
request's. Blobs without digests and blobs not named are passed through.
"""

from __future__ import annotations

import contextvars
import hashlib
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass

import numpy as np

from gnn_faas import deadline
from gnn_faas.errors import CorruptBlob, StoreUnavailable
from gnn_faas.storage.backends.base import StorageBackend
from gnn_faas.storage.backends.file import gather_ranges

IO_THREADS = 8
# unverified chunks read (and held) at once by one read: a read of rows spread
# over a large blob verifies its chunks in batches of this many bytes, so its
# transient memory is the rows plus this, not every chunk the rows touch
VERIFY_BATCH_BYTES = 8 << 20


@dataclass(frozen=True)
class ChunkSpec:
    """The chunking of one blob: its size, chunk size and (optional) digests."""

    nbytes: int
    chunk_bytes: int
    digests: np.ndarray | None  # [num_chunks, 32] uint8

    @property
    def num_chunks(self) -> int:
        return -(-self.nbytes // self.chunk_bytes)


class ChunkedReads(StorageBackend):
    """``inner`` with the blobs of ``specs`` read by verified (and, with
    ``cache_bytes``, cached) chunks (see the module docstring)."""

    def __init__(
        self,
        inner: StorageBackend,
        specs: Mapping[str, ChunkSpec],
        cache_bytes: int = 0,
        io_threads: int = IO_THREADS,
    ):
        super().__init__(inner.uri)
        self.inner = inner
        self.scheme = inner.scheme
        self.specs = dict(specs)
        self.cache_bytes = int(cache_bytes)
        self._verified = {p: np.zeros(s.num_chunks, dtype=bool) for p, s in self.specs.items()}
        self._cache: OrderedDict[tuple[str, int], bytes] = OrderedDict()
        self._cached_bytes = 0
        self._flights: dict[tuple[str, int], Future] = {}
        self._lock = threading.Lock()
        self._io = ThreadPoolExecutor(io_threads, thread_name_prefix="gnn-faas-chunks")
        self.figures = {"chunks_read": 0, "chunks_verified": 0, "cache_hits": 0, "waits": 0}
        # the planner's constants are the inner store's (the requests still go there)
        cost = getattr(inner, "_request_cost", None)
        if cost is not None:
            self._request_cost = cost

    # -- the hot path ----------------------------------------------------------
    def read_ranges(self, path: str, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
        spec = self.specs.get(path)
        if spec is None or (spec.digests is None and not self.cache_bytes):
            return self.inner.read_ranges(path, starts, ends)
        starts = np.asarray(starts, dtype=np.int64)
        ends = np.minimum(np.asarray(ends, dtype=np.int64), spec.nbytes)
        ends = np.maximum(ends, starts)
        if starts.size == 0:
            return np.empty(0, dtype=np.uint8)
        return self._batched(path, spec, starts, ends)

    def _batched(
        self, path: str, spec: ChunkSpec, starts: np.ndarray, ends: np.ndarray
    ) -> np.ndarray:
        """The ranges read in batches whose chunks to fetch total at most
        :data:`VERIFY_BATCH_BYTES` (in blob order; one batch when they fit)."""
        c = spec.chunk_bytes
        per_batch = max(1, VERIFY_BATCH_BYTES // c)
        first = starts // c
        spans = np.where(ends > starts, (ends - 1) // c - first + 1, 0)
        if int(spans.sum()) <= per_batch:
            return self._read_once(path, spec, starts, ends)
        # in blob order, cut where the chunks spanned so far pass a batch (a chunk
        # two ranges share is counted twice: batches only get smaller)
        order = np.argsort(starts, kind="stable")
        batch = (np.cumsum(spans[order]) - 1) // per_batch
        cuts = np.flatnonzero(np.diff(batch)) + 1
        parts = [
            self._read_once(path, spec, starts[idx], ends[idx])
            for idx in np.split(order, cuts)  # a loop over batches, not ranges
        ]
        in_order = np.concatenate(parts)
        sizes = ends - starts
        if np.all(order[1:] > order[:-1]):
            return in_order
        at = np.empty(starts.size, dtype=np.int64)
        at[order] = np.cumsum(sizes[order]) - sizes[order]
        return gather_ranges(in_order, at, at + sizes)

    def _read_once(
        self, path: str, spec: ChunkSpec, starts: np.ndarray, ends: np.ndarray
    ) -> np.ndarray:
        c = spec.chunk_bytes
        live = ends > starts
        first = np.where(live, starts // c, 0)
        last = np.where(live, (ends - 1) // c, -1)
        counts = last - first + 1
        owner = np.repeat(np.arange(starts.size), counts)
        k = np.arange(owner.size) - np.repeat(np.cumsum(counts) - counts, counts)
        touched = np.unique(first[owner] + k)
        if self.cache_bytes:
            want = touched  # everything comes from (cached or freshly read) chunks
        else:
            want = touched[~self._verified[path][touched]]
        if want.size == 0:
            return self.inner.read_ranges(path, starts, ends)
        chunks = self._chunks(path, spec, want)
        have = np.zeros(spec.num_chunks, dtype=bool)
        have[want] = True
        # a range is answered from the chunks when every chunk it spans is among them
        span_ok = np.ones(starts.size, dtype=bool)
        np.logical_and.at(span_ok, owner, have[first[owner] + k])
        # chunk j of `want` lies at position j * c in `buf` (only the blob's last
        # chunk is short, and no range runs past it)
        buf = np.frombuffer(b"".join(chunks), dtype=np.uint8)
        slot = np.searchsorted(want, first)
        offset = slot * c + (starts - first * c)
        sizes = ends - starts
        direct = span_ok & live
        if direct.all():
            return gather_ranges(buf, offset, offset + sizes)
        got = gather_ranges(buf, offset[direct], offset[direct] + sizes[direct])
        rest = self.inner.read_ranges(path, starts[~direct], ends[~direct])
        # interleave the two answers back into the ranges' order
        out = np.empty(int(sizes.sum()), dtype=np.uint8)
        pos = np.cumsum(sizes) - sizes
        for mask, data in ((direct, got), (~direct, rest)):
            if mask.any():
                sub = np.cumsum(sizes[mask]) - sizes[mask]
                idx = np.repeat(pos[mask] - sub, sizes[mask]) + np.arange(int(sizes[mask].sum()))
                out[idx] = data
        return out

    # -- chunks ----------------------------------------------------------------
    def _chunks(self, path: str, spec: ChunkSpec, ids: np.ndarray) -> list[bytes]:
        """The bytes of chunks ``ids`` (sorted, unique) of ``path``, verified:
        from the cache, from another thread's read in flight, or read now."""
        ids_list = ids.tolist()
        out: dict[int, bytes] = {}
        waits: dict[int, Future] = {}
        mine: list[int] = []
        health = self.health
        joined_in_outage = False
        with self._lock:
            for i in ids_list:
                key = (path, i)
                data = self._cache.get(key)
                if data is not None:
                    self._cache.move_to_end(key)
                    out[i] = data
                    self.figures["cache_hits"] += 1
                    continue
                flight = self._flights.get(key)
                if flight is not None:
                    # during an outage the read in flight is a probe or a stuck read:
                    # waiting on it would hold this request up to a timeout
                    joined_in_outage = joined_in_outage or not health.up
                    waits[i] = flight
                    self.figures["waits"] += 1
                    continue
                flight = Future()
                flight.set_running_or_notify_cancel()
                self._flights[key] = flight
                waits[i] = flight
                mine.append(i)
        if joined_in_outage:
            for i in mine:  # give back what this request claimed, unread
                self._settle(path, [i], None, health.fail_fast())
            raise health.fail_fast()
        if mine:
            ctx = contextvars.copy_context()
            self._io.submit(ctx.run, self._read_chunks, path, spec, mine)
        for i, flight in waits.items():
            try:
                out[i] = flight.result(timeout=deadline.bounded(None))
            except FutureTimeout:
                raise StoreUnavailable(
                    f"graph store {self.health.uri}: no answer for {path!r} within the "
                    "request's deadline"
                ) from None
        return [out[i] for i in ids_list]

    def _read_chunks(self, path: str, spec: ChunkSpec, ids: list[int]) -> None:
        """Read chunks ``ids`` in one batch, verify each, settle their flights."""
        c = spec.chunk_bytes
        arr = np.asarray(ids, dtype=np.int64)
        try:
            raw = self.inner.read_ranges(path, arr * c, np.minimum((arr + 1) * c, spec.nbytes))
            data = raw.tobytes()
            expected = int((np.minimum((arr + 1) * c, spec.nbytes) - arr * c).sum())
            if len(data) != expected:
                raise CorruptBlob(f"{path}: short read ({len(data)} of {expected} bytes)")
        except BaseException as exc:  # noqa: BLE001 - every waiter gets the failure
            self._settle(path, ids, None, exc)
            return
        pieces = []
        pos = 0
        for i in ids:
            n = min(c, spec.nbytes - i * c)
            pieces.append(data[pos : pos + n])
            pos += n
        bad = None
        if spec.digests is not None:
            for i, piece in zip(ids, pieces):
                if hashlib.sha256(piece).digest() != spec.digests[i].tobytes():
                    bad = i
                    break
        if bad is not None:
            exc = CorruptBlob(
                f"blob {path!r} in {self.health.uri} is corrupted in chunk {bad} (bytes "
                f"{bad * c}-{min(spec.nbytes, (bad + 1) * c) - 1}: sha256 mismatch)"
            )
            self._settle(path, ids, None, exc)
            return
        self._settle(path, ids, pieces, None)

    def _settle(
        self, path: str, ids: Sequence[int], pieces: list[bytes] | None, exc: BaseException | None
    ) -> None:
        with self._lock:
            flights = [self._flights.pop((path, i)) for i in ids]
            if pieces is not None:
                self.figures["chunks_read"] += len(ids)
                if self.specs[path].digests is not None:
                    self._verified[path][list(ids)] = True
                    self.figures["chunks_verified"] += len(ids)
                if self.cache_bytes:
                    for i, piece in zip(ids, pieces):
                        self._cache[(path, i)] = piece
                        self._cached_bytes += len(piece)
                    while self._cached_bytes > self.cache_bytes and self._cache:
                        _, old = self._cache.popitem(last=False)
                        self._cached_bytes -= len(old)
        for j, flight in enumerate(flights):
            if exc is not None:
                flight.set_exception(exc)
            else:
                flight.set_result(pieces[j])

    @property
    def cached_bytes(self) -> int:
        return self._cached_bytes

    def verified_chunks(self, path: str) -> int:
        v = self._verified.get(path)
        return 0 if v is None else int(v.sum())

    # -- the rest goes to the inner store ---------------------------------------
    def cat_file(self, path: str, start: int | None = None, end: int | None = None) -> bytes:
        spec = self.specs.get(path)
        if spec is None or (start is None and end is None):
            return self.inner.cat_file(path, start, end)
        s, e, _ = slice(start, end).indices(spec.nbytes)
        return self.read_ranges(path, np.array([s]), np.array([max(s, e)])).tobytes()

    def size(self, path: str) -> int:
        return self.inner.size(path)

    def exists(self, path: str) -> bool:
        return self.inner.exists(path)

    def ls(self, prefix: str = "") -> list[str]:
        return self.inner.ls(prefix)

    def pipe_file(self, path: str, data) -> None:
        self.inner.pipe_file(path, data)

    def rm(self, path: str) -> None:
        self.inner.rm(path)

    def close(self) -> None:
        self._io.shutdown(wait=False)
        self.inner.close()
