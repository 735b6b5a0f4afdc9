"""Redis backend: ``redis://HOST:PORT/DB[?prefix=NS&chunk_size=BYTES&retries=N]``.

A blob is stored *chunked*, so that no read ever transfers a whole blob:

    {NS}{KEY}#meta             "SIZE CHUNK GEN"  (ASCII)
    {NS}{KEY}#{GEN}.{i}        bytes [i * CHUNK, (i + 1) * CHUNK) of the blob

``GEN`` is a random generation tag per write. A writer stores all chunks of a
new generation, then switches the meta key (one atomic SET), then deletes the
old generation: a reader never mixes two versions of a blob.

Reads are one pipeline (one network round trip) of GETRANGE commands: the
ranges are split at chunk boundaries with numpy, and the pipeline ends with a
GET of the meta key. Meta keys are cached per backend instance; the trailing
GET checks the cached generation is still current (it was, for every GETRANGE
before it, since old chunks are deleted only after the switch), and on a
change the read is planned again with the new meta. Steady-state reads thus
cost one round trip, and stay correct when another process rewrites a blob.

``NS`` (``prefix``) namespaces the keys, so several stores (or tests) share one
database. ``chunk_size`` (default 1 MiB) applies to writes; reads follow each
blob's own meta.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar
from urllib.parse import parse_qsl, urlencode, urlparse, urlunparse

import numpy as np
import redis
from redis.backoff import NoBackoff
from redis.connection import URL_QUERY_ARGUMENT_PARSERS
from redis.retry import Retry

from gnn_faas.errors import (
    BlobNotFound,
    CorruptBlob,
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

T = TypeVar("T")

DEFAULT_CHUNK = 1 << 20
_META = "#meta"
_WRITE_BATCH_BYTES = 64 << 20  # chunk bytes buffered per write pipeline
_DEL_BATCH = 1000  # keys per DEL command
_MAX_REPLANS = 5  # reads re-planned at most this often while a blob keeps changing
_GLOB = re.compile(r"([*?\[\]\\])")


@dataclass(frozen=True)
class ChunkMeta:
    """Size, chunk size and generation of one stored blob."""

    size: int
    chunk: int
    gen: str

    @property
    def num_chunks(self) -> int:
        return -(-self.size // self.chunk)

    def encode(self) -> bytes:
        return f"{self.size} {self.chunk} {self.gen}".encode()

    @classmethod
    def decode(cls, raw: bytes | None, key: str) -> ChunkMeta | None:
        if raw is None:
            return None
        try:
            size, chunk, gen = raw.decode("ascii").split(" ")
            meta = cls(int(size), int(chunk), gen)
        except (UnicodeDecodeError, ValueError):
            raise CorruptBlob(f"redis meta key {key!r} is malformed: {raw[:64]!r}") from None
        if meta.size < 0 or meta.chunk <= 0:
            raise CorruptBlob(f"redis meta key {key!r} is malformed: {raw[:64]!r}")
        return meta


def split_at_chunks(
    size: np.ndarray | int, chunk: np.ndarray | int, starts: np.ndarray, ends: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Split ranges ``[starts[i], ends[i])`` of blobs of ``size[i]`` bytes stored in
    chunks of ``chunk[i]`` bytes (scalars broadcast) at chunk boundaries.

    Ranges are clamped to the blob first, as slicing does. Returns
    ``(owner, index, first, last, pieces)``: piece ``j`` belongs to range
    ``owner[j]`` and is bytes ``first[j]..last[j]`` (inclusive, as GETRANGE
    wants) of chunk ``index[j]``; pieces are in range order, ``pieces[i]`` of
    them for range ``i`` (0 for an empty range).
    """
    starts = np.asarray(starts, dtype=np.int64)
    size = np.broadcast_to(np.asarray(size, dtype=np.int64), starts.shape)
    c = np.broadcast_to(np.asarray(chunk, dtype=np.int64), starts.shape)
    s = np.minimum(starts, size)
    e = np.clip(np.asarray(ends, dtype=np.int64), s, size)
    pieces = np.where(e > s, (e - 1) // c - s // c + 1, 0)
    owner = np.repeat(np.arange(s.size), pieces)
    k = np.arange(owner.size, dtype=np.int64) - np.repeat(np.cumsum(pieces) - pieces, pieces)
    co = c[owner]
    index = s[owner] // co + k
    base = index * co
    first = np.maximum(s[owner], base) - base
    last = np.minimum(e[owner], base + co) - base - 1
    return owner, index, first, last, pieces


class RedisBackend(StorageBackend):
    """Chunked blobs in one Redis database, under the key prefix ``prefix``.

    URI query options: ``prefix``, ``chunk_size`` and ``retries`` (this backend's), and
    redis-py's connection options (``socket_timeout``, ``max_connections``,
    ...). ``client_options`` go to ``redis.Redis.from_url`` as well.
    """

    scheme = "redis"

    def __init__(
        self,
        uri: str,
        *,
        chunk_size: int | None = None,
        prefix: str | None = None,
        retry_attempts: int = DEFAULT_ATTEMPTS,
        **client_options,
    ):
        super().__init__(uri)
        parsed = urlparse(uri)
        if parsed.scheme not in ("redis", "rediss"):
            raise InvalidRequest(f"not a redis:// URI: {uri!r}")
        query = dict(parse_qsl(parsed.query, keep_blank_values=True))
        uri_prefix = query.pop("prefix", "")
        uri_chunk = query.pop("chunk_size", None)
        uri_retries = query.pop("retries", None)
        unknown = sorted(set(query) - set(URL_QUERY_ARGUMENT_PARSERS))
        if unknown:
            raise InvalidRequest(f"unknown redis store option(s) {unknown} in {uri!r}")
        self.prefix = uri_prefix if prefix is None else prefix
        try:
            self.chunk_size = int(uri_chunk or DEFAULT_CHUNK) if chunk_size is None else chunk_size
        except ValueError:
            raise InvalidRequest(f"chunk_size must be an integer in {uri!r}") from None
        if self.chunk_size <= 0:
            raise InvalidRequest(f"chunk_size must be positive in {uri!r}")
        try:
            self.retry_attempts = max(1, int(uri_retries or retry_attempts))
        except ValueError:
            raise InvalidRequest(f"retries must be an integer in {uri!r}") from None
        # per-call socket timeouts (redis-py's socket_timeout and
        # socket_connect_timeout options in the URI override them)
        client_options.setdefault("socket_timeout", DEFAULT_READ_TIMEOUT_S)
        client_options.setdefault("socket_connect_timeout", DEFAULT_CONNECT_TIMEOUT_S)
        try:
            self._client = redis.Redis.from_url(
                urlunparse(parsed._replace(query=urlencode(query))),
                # redis-py's own retries are off: StorageBackend.guarded owns the policy
                retry=Retry(NoBackoff(), 0),
                **client_options,
            )
        except (ValueError, TypeError) as exc:
            raise InvalidRequest(f"invalid redis store URI {uri!r}: {exc}") from None
        self._metas: dict[str, ChunkMeta] = {}

    # -- keys --------------------------------------------------------------
    def _meta_key(self, path: str) -> str:
        return f"{self.prefix}{path}{_META}"

    def _chunk_base(self, path: str, gen: str) -> str:
        return f"{self.prefix}{path}#{gen}."

    # -- error handling ----------------------------------------------------
    def _call(self, what: str, fn: Callable[[], T]) -> T:
        """``fn()`` with redis errors translated and transient ones retried."""

        def once() -> T:
            try:
                return fn()
            except redis.TimeoutError as exc:
                err = TransientStorageError(f"redis timed out on {what!r}: {exc}")
                err.kind = "timeout"
                raise err from exc
            except redis.ConnectionError as exc:
                raise TransientStorageError(f"redis unreachable on {what!r}: {exc}") from exc
            except redis.RedisError as exc:
                raise StorageError(f"redis failure on {what!r} in {self.uri}: {exc}") from exc

        return self.guarded(once, attempts=self.retry_attempts)

    def _fetch_metas(self, paths: list[str]) -> dict[str, ChunkMeta]:
        """Meta of every path (cached ones from the cache; the rest in one MGET)."""
        metas = {p: self._metas[p] for p in paths if p in self._metas}
        missing = [p for p in paths if p not in metas]
        if missing:
            keys = [self._meta_key(p) for p in missing]
            for p, k, raw in zip(missing, keys, self._client.mget(keys), strict=True):
                meta = ChunkMeta.decode(raw, k)
                if meta is None:
                    raise BlobNotFound(f"no blob {p!r} in {self.uri}")
                metas[p] = self._metas[p] = meta
        return metas

    # -- reads -------------------------------------------------------------
    def _read_pieces(
        self, paths: list[str], starts: np.ndarray, ends: np.ndarray
    ) -> tuple[list[bytes], np.ndarray, int]:
        """One pipeline of GETRANGEs for ranges ``i`` of ``paths[i]``.

        Returns the piece replies (in range order), the piece count per range
        and the bytes expected in all. Re-plans (bounded) when a blob's
        generation changed meanwhile.
        """
        unique = list(dict.fromkeys(paths))
        if len(unique) == 1:
            code = np.zeros(starts.size, dtype=np.int64)
        else:
            pos = {p: i for i, p in enumerate(unique)}
            code = np.fromiter((pos[p] for p in paths), dtype=np.int64, count=len(paths))
        for _ in range(_MAX_REPLANS):
            fetched = self._fetch_metas(unique)
            metas = [fetched[p] for p in unique]
            size = np.array([m.size for m in metas], dtype=np.int64)[code]
            chunk = np.array([m.chunk for m in metas], dtype=np.int64)[code]
            owner, index, first, last, pieces = split_at_chunks(size, chunk, starts, ends)
            # arguments pre-encoded to bytes with numpy: the loop only queues commands
            bases = np.array(
                [self._chunk_base(p, m.gen).encode() for p, m in zip(unique, metas, strict=True)]
            )
            keys = np.char.add(bases[code[owner]], index.astype("S")).tolist()
            pipe = self._client.pipeline(transaction=False)
            for key, a, b in zip(
                keys, first.astype("S").tolist(), last.astype("S").tolist(), strict=True
            ):
                pipe.execute_command("GETRANGE", key, a, b)
            for p in unique:
                pipe.get(self._meta_key(p))
            replies = pipe.execute()
            changed = False
            for p, m, raw in zip(unique, metas, replies[len(replies) - len(unique) :], strict=True):
                now = ChunkMeta.decode(raw, self._meta_key(p))
                if now is None:
                    self._metas.pop(p, None)
                    raise BlobNotFound(f"no blob {p!r} in {self.uri}")
                if now != m:
                    self._metas[p] = now
                    changed = True
            if not changed:
                expected = int((last - first).sum()) + int(last.size)
                return replies[: len(replies) - len(unique)], pieces, expected
        raise TransientStorageError(f"blobs {unique[:3]} kept changing while being read")

    def read_ranges(self, path: str, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """``blob[starts[i]:ends[i]]`` concatenated, from one pipeline of GETRANGEs.

        Ranges past the end are clamped, as slicing does. The result is a
        read-only view of the joined replies.
        """
        starts = np.asarray(starts, dtype=np.int64)
        ends = np.asarray(ends, dtype=np.int64)
        if starts.size == 0:
            return np.empty(0, dtype=np.uint8)
        replies, _, expected = self._call(path, lambda: self._read_pieces([path], starts, ends))
        data = b"".join(replies)
        if len(data) != expected:
            raise CorruptBlob(f"blob {path!r} in {self.uri} has missing chunks")
        return np.frombuffer(data, dtype=np.uint8)

    def cat_ranges(
        self, paths: Sequence[str], starts: Sequence[int], ends: Sequence[int]
    ) -> list[bytes]:
        if not (len(paths) == len(starts) == len(ends)):
            raise ValueError("paths, starts and ends must have the same length")
        if len(paths) == 0:
            return []
        paths = list(paths)
        s = np.asarray(starts, dtype=np.int64)
        e = np.asarray(ends, dtype=np.int64)
        if (s < 0).any() or (e < 0).any():
            return [self.cat_file(p, int(a), int(b)) for p, a, b in zip(paths, s, e, strict=True)]
        replies, pieces, expected = self._call(paths[0], lambda: self._read_pieces(paths, s, e))
        if sum(map(len, replies)) != expected:
            raise CorruptBlob(f"blobs {sorted(set(paths))[:3]} in {self.uri} have missing chunks")
        bounds = np.concatenate(([0], np.cumsum(pieces))).tolist()
        return [b"".join(replies[lo:hi]) for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)]

    def cat_file(self, path: str, start: int | None = None, end: int | None = None) -> bytes:
        if (start is not None and start < 0) or (end is not None and end < 0):
            # negative bounds count from the end, as slicing does: needs the size
            start, end, _ = slice(start, end).indices(self.size(path))
        start = 0 if start is None else int(start)
        end = np.iinfo(np.int64).max if end is None else int(end)
        return self.read_ranges(path, np.array([start]), np.array([end])).tobytes()

    def size(self, path: str) -> int:
        key = self._meta_key(path)
        meta = ChunkMeta.decode(self._call(path, lambda: self._client.get(key)), key)
        if meta is None:
            self._metas.pop(path, None)
            raise BlobNotFound(f"no blob {path!r} in {self.uri}")
        self._metas[path] = meta
        return meta.size

    def exists(self, path: str) -> bool:
        key = self._meta_key(path)
        return bool(self._call(path, lambda: self._client.exists(key)))

    def ls(self, prefix: str = "") -> list[str]:
        # escape glob characters: keys are matched literally
        pattern = _GLOB.sub(r"\\\1", f"{self.prefix}{prefix}") + "*" + _META
        skip, cut = len(self.prefix), len(_META)

        def scan() -> list[str]:
            keys = self._client.scan_iter(match=pattern, count=1000)
            return [k.decode()[skip:-cut] for k in keys]

        return sorted(set(self._call(prefix or "/", scan)))

    # -- writes ------------------------------------------------------------
    def pipe_file(self, path: str, data: bytes | memoryview) -> None:
        if not path:
            raise InvalidRequest("empty blob key")
        view = memoryview(data).cast("B")
        self._call(path, lambda: self._write(path, view))

    def _write(self, path: str, view: memoryview) -> None:
        meta_key = self._meta_key(path)
        old = ChunkMeta.decode(self._client.get(meta_key), meta_key)
        new = ChunkMeta(view.nbytes, self.chunk_size, secrets.token_hex(6))
        base = self._chunk_base(path, new.gen)
        c = new.chunk
        per_batch = max(1, _WRITE_BATCH_BYTES // c)
        for lo in range(0, new.num_chunks, per_batch):
            pipe = self._client.pipeline(transaction=False)
            for i in range(lo, min(lo + per_batch, new.num_chunks)):
                pipe.set(f"{base}{i}", view[i * c : (i + 1) * c])
            pipe.execute()
        # the switch: readers see the new generation from here on
        self._client.set(meta_key, new.encode())
        self._metas[path] = new
        if old is not None and old.gen != new.gen:
            self._delete_chunks(path, old)

    def _delete_chunks(self, path: str, meta: ChunkMeta) -> None:
        base = self._chunk_base(path, meta.gen)
        keys = [f"{base}{i}" for i in range(meta.num_chunks)]
        pipe = self._client.pipeline(transaction=False)
        for lo in range(0, len(keys), _DEL_BATCH):
            pipe.delete(*keys[lo : lo + _DEL_BATCH])
        pipe.execute()

    def put_if_absent(self, path: str, data: bytes) -> bool:
        """The chunks of a new generation, then its meta key with ``SET NX``: the
        one atomic step. A writer that loses deletes its chunks."""
        if not path:
            raise InvalidRequest("empty blob key")
        view = memoryview(data).cast("B")

        def create() -> bool:
            meta_key = self._meta_key(path)
            new = ChunkMeta(view.nbytes, self.chunk_size, secrets.token_hex(6))
            base = self._chunk_base(path, new.gen)
            c = new.chunk
            pipe = self._client.pipeline(transaction=False)
            for i in range(new.num_chunks):
                pipe.set(f"{base}{i}", view[i * c : (i + 1) * c])
            pipe.execute()
            if self._client.set(meta_key, new.encode(), nx=True):
                self._metas[path] = new
                return True
            self._delete_chunks(path, new)
            return False

        return self._call(path, create)

    def rm(self, path: str) -> None:
        meta_key = self._meta_key(path)

        def remove() -> None:
            old = ChunkMeta.decode(self._client.get(meta_key), meta_key)
            self._metas.pop(path, None)
            if old is None:
                return
            # meta first: readers then see "missing", never a partial blob
            self._client.delete(meta_key)
            self._delete_chunks(path, old)

        self._call(path, remove)

    def close(self) -> None:
        self._metas.clear()
        self._client.close()
