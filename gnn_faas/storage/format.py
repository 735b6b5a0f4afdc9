"""Graph store format v1.

A store root holds named graphs; graph ``NAME`` is the key prefix ``NAME/``::

    NAME/manifest.json       name, version, counts, dtypes, sha256 of every blob
    NAME/indptr.bin          int64 [num_nodes + 1]   CSR of in-edges
    NAME/indices.bin         int32 (int64 if ids do not fit) [num_edges]
    NAME/features.bin        float32 (or float16) [num_nodes, feature_dim], row-major
    NAME/labels.bin          int64 [num_nodes]                      (optional)
    NAME/degree.bin          int32 [num_nodes] out-degree           (optional)
    NAME/node_ids.bin        int64 [num_nodes] original vertex ids  (optional)
    NAME/request_order.bin   int64 [k] target vertices in time order (optional)
    NAME/self_loops.bin      int32 [num_nodes] edges v -> v of each v (only if any)
    NAME/user_ids.bin        int64 [num_nodes] user id of each stored vertex (renumbered
                             graphs only, see storage/reorder.py)
    NAME/split.bin           uint8 [num_nodes] 0 train, 1 val, 2 test  (optional)

Row ``v`` of the CSR lists the vertices ``v`` aggregates from (its in-edges), so
a neighbourhood is one contiguous range of ``indices.bin``. ``degree.bin`` is
the out-degree: how many vertices aggregate from ``v``, which is what makes a
feature row worth caching. ``self_loops.bin`` counts each vertex's edges
``v -> v`` and exists only when the graph has some; ``extra["self_loops"]`` is
their total (0 written too, so a store written before this field existed is
recognisable by its absence). GCN's degree excludes them (PyG's ``gcn_norm``
replaces every self loop by exactly one), and the fetcher reads the degree of
the outermost hop from ``indptr`` alone, so it needs them per vertex without
reading neighbour lists. All arrays are little-endian.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from gnn_faas.errors import BlobNotFound, CorruptBlob, InvalidRequest, NotFound
from gnn_faas.storage.backends import StorageBackend, open_backend

FORMAT_NAME = "gnn-faas-graph"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
REQUIRED_BLOBS = ("indptr", "indices", "features")
OPTIONAL_BLOBS = (
    "labels",
    "degree",
    "node_ids",
    "request_order",
    "self_loops",
    "user_ids",
    "split",
)
_ALLOWED_DTYPES = {"<i8", "<i4", "<f4", "<f2", "|u1", "|i1"}


# Chunk digests: every blob is also hashed in fixed chunks, so a reader that
# never reads a blob whole can verify what it reads chunk by chunk on first
# read (storage/chunked.py). Chunks are 64 KiB, doubled until a blob has at
# most 65,536 of them (its digest blob is then at most 2 MiB).
MIN_CHUNK_BYTES = 1 << 16
MAX_CHUNKS = 1 << 16
DIGEST_BYTES = 32  # sha256
CHUNKS_SUFFIX = ".chunks"


def chunk_bytes_for(nbytes: int) -> int:
    """The chunk size of a blob of ``nbytes`` bytes (see :data:`MIN_CHUNK_BYTES`)."""
    c = MIN_CHUNK_BYTES
    while int(nbytes) > c * MAX_CHUNKS:
        c *= 2
    return c


class BlobDigester:
    """sha256 of a whole blob and of each of its chunks, fed in pieces of any size."""

    def __init__(self, nbytes: int):
        self.chunk_bytes = chunk_bytes_for(nbytes)
        self.whole = hashlib.sha256()
        self._chunk = hashlib.sha256()
        self._in_chunk = 0
        self._digests: list[bytes] = []

    def update(self, data) -> None:
        view = memoryview(data).cast("B")
        self.whole.update(view)
        pos = 0
        while pos < view.nbytes:
            take = min(self.chunk_bytes - self._in_chunk, view.nbytes - pos)
            self._chunk.update(view[pos : pos + take])
            self._in_chunk += take
            pos += take
            if self._in_chunk == self.chunk_bytes:
                self._digests.append(self._chunk.digest())
                self._chunk = hashlib.sha256()
                self._in_chunk = 0

    def chunk_digests(self) -> bytes:
        """The chunks' digests, concatenated (the last, partial chunk included)."""
        tail = [self._chunk.digest()] if self._in_chunk else []
        return b"".join(self._digests + tail)


def chunk_digests(data) -> tuple[str, int, bytes]:
    """``(sha256 hex, chunk bytes, chunk digests)`` of a whole blob in memory."""
    view = memoryview(data).cast("B")
    d = BlobDigester(view.nbytes)
    d.update(view)
    return d.whole.hexdigest(), d.chunk_bytes, d.chunk_digests()


@dataclass(frozen=True)
class BlobInfo:
    file: str
    dtype: str  # numpy dtype string, explicit byte order: "<i8", "<f4", ...
    shape: tuple[int, ...]
    nbytes: int
    sha256: str
    # chunk digests (0 / "": a store written before they existed): the sha256 of
    # each chunk_bytes of the blob, concatenated in FILE.chunks, whose own
    # sha256 is chunks_sha256
    chunk_bytes: int = 0
    chunks_sha256: str = ""

    @property
    def row_bytes(self) -> int:
        """Bytes of one row (first axis) of the blob."""
        return int(np.dtype(self.dtype).itemsize * int(np.prod(self.shape[1:], dtype=np.int64)))

    @property
    def chunks_file(self) -> str:
        return self.file + CHUNKS_SUFFIX

    @property
    def num_chunks(self) -> int:
        return -(-self.nbytes // self.chunk_bytes) if self.chunk_bytes else 0


def put_blob(backend: StorageBackend, prefix: str, key: str, arr: np.ndarray) -> BlobInfo:
    """Write array ``arr`` (little-endian) as blob ``prefix/KEY.bin`` and its chunk
    digests as ``prefix/KEY.bin.chunks``; the manifest entry describing both."""
    arr = _as_le(arr)
    data = memoryview(arr).cast("B")
    whole, chunk, digests = chunk_digests(data)
    info = BlobInfo(
        file=f"{key}.bin",
        dtype=arr.dtype.str,
        shape=tuple(int(x) for x in arr.shape),
        nbytes=arr.nbytes,
        sha256=whole,
        chunk_bytes=chunk,
        chunks_sha256=hashlib.sha256(digests).hexdigest(),
    )
    backend.pipe_file(f"{prefix}/{info.chunks_file}", digests)
    backend.pipe_file(f"{prefix}/{info.file}", data)
    return info


@dataclass(frozen=True)
class Manifest:
    name: str
    num_nodes: int
    num_edges: int
    feature_dim: int
    symmetrized: bool
    blobs: dict[str, BlobInfo]
    num_classes: int = 0
    version: int = FORMAT_VERSION
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        d = asdict(self)
        d["format"] = FORMAT_NAME
        return json.dumps(d, indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes, where: str = "manifest.json") -> Manifest:
        try:
            d = json.loads(text)
            if d.pop("format", None) != FORMAT_NAME:
                raise ValueError("not a gnn-faas graph manifest")
            if d.get("version") != FORMAT_VERSION:
                raise ValueError(f"unsupported format version {d.get('version')!r}")
            blobs = {}
            for k, b in d.pop("blobs").items():
                b["shape"] = tuple(int(x) for x in b["shape"])
                if b["dtype"] not in _ALLOWED_DTYPES:
                    raise ValueError(f"blob {k!r} has unsupported dtype {b['dtype']!r}")
                blobs[k] = BlobInfo(**b)
            missing = [k for k in REQUIRED_BLOBS if k not in blobs]
            if missing:
                raise ValueError(f"manifest lists no {', '.join(missing)} blob")
            return cls(blobs=blobs, **d)
        except (ValueError, KeyError, TypeError) as exc:
            raise CorruptBlob(f"{where}: invalid manifest ({exc})") from None


def _as_le(arr: np.ndarray) -> np.ndarray:
    arr = np.ascontiguousarray(arr)
    return arr.astype(arr.dtype.newbyteorder("<"), copy=False)


def index_dtype(num_nodes: int) -> np.dtype:
    """int32 where vertex ids fit, else int64."""
    return np.dtype("<i4") if num_nodes < 2**31 else np.dtype("<i8")


# rows of the CSR are checked for self loops ~16M edges at a time: the row id
# of every edge, materialised at once, would double ingest's peak on big graphs
_LOOP_CHUNK_EDGES = 1 << 24


def self_loop_counts(
    indptr: np.ndarray, indices: np.ndarray, chunk_edges: int = _LOOP_CHUNK_EDGES
) -> np.ndarray:
    """Edges ``v -> v`` in row ``v`` of an in-edge CSR, for every ``v`` (int64)."""
    indptr = np.asarray(indptr, dtype=np.int64)
    n = indptr.size - 1
    loops = np.zeros(max(n, 0), np.int64)
    if n <= 0 or indptr[-1] == 0:
        return loops
    cuts = np.searchsorted(indptr, np.arange(0, indptr[-1], chunk_edges), side="right") - 1
    cuts = np.unique(np.concatenate((cuts, [n])))
    for r0, r1 in zip(cuts[:-1], cuts[1:]):  # a loop over edge chunks, not vertices
        rows = np.repeat(np.arange(r0, r1, dtype=np.int64), np.diff(indptr[r0 : r1 + 1]))
        cols = np.asarray(indices[indptr[r0] : indptr[r1]])
        loops[r0:r1] += np.bincount(rows[cols == rows] - r0, minlength=r1 - r0)
    return loops


def write_graph(
    store: StorageBackend | str,
    name: str,
    *,
    indptr: np.ndarray,
    indices: np.ndarray,
    features: np.ndarray,
    symmetrized: bool,
    labels: np.ndarray | None = None,
    node_ids: np.ndarray | None = None,
    request_order: np.ndarray | None = None,
    num_classes: int = 0,
    extra: dict[str, Any] | None = None,
    user_ids: np.ndarray | None = None,
) -> Manifest:
    """Write a graph's blobs, then its manifest (last, so a half-written graph
    has no manifest and cannot be opened)."""
    backend = open_backend(store) if isinstance(store, str) else store
    validate_name(name)
    n = int(indptr.shape[0]) - 1
    if n < 0 or indptr[0] != 0 or np.any(np.diff(indptr) < 0):
        raise InvalidRequest("indptr must start at 0 and be non-decreasing")
    if int(indptr[-1]) != indices.shape[0]:
        raise InvalidRequest("indptr[-1] must equal the number of edges")
    if features.ndim != 2 or features.shape[0] != n:
        raise InvalidRequest(f"features must have shape [{n}, dim], got {features.shape}")
    if features.dtype not in (np.float32, np.float16):
        features = features.astype(np.float32)
    arrays: dict[str, np.ndarray] = {
        "indptr": indptr.astype("<i8", copy=False),
        "indices": indices.astype(index_dtype(n), copy=False),
        "features": features,
        "degree": np.bincount(indices, minlength=n).astype("<i4"),
    }
    loops = self_loop_counts(indptr, indices)
    if loops.any():
        arrays["self_loops"] = loops.astype("<i4")
    if labels is not None:
        arrays["labels"] = np.asarray(labels).astype("<i8", copy=False)
    if node_ids is not None:
        arrays["node_ids"] = np.asarray(node_ids).astype("<i8", copy=False)
    if request_order is not None:
        arrays["request_order"] = np.asarray(request_order).astype("<i8", copy=False)
    if user_ids is not None:
        arrays["user_ids"] = np.asarray(user_ids).astype("<i8", copy=False)
    blobs = {key: put_blob(backend, name, key, arr) for key, arr in arrays.items()}
    manifest = Manifest(
        name=name,
        num_nodes=n,
        num_edges=int(indices.shape[0]),
        feature_dim=int(features.shape[1]),
        symmetrized=bool(symmetrized),
        blobs=blobs,
        num_classes=int(num_classes),
        extra={**(extra or {}), "self_loops": int(loops.sum())},
    )
    backend.pipe_file(f"{name}/{MANIFEST}", manifest.to_json().encode())
    return manifest


def validate_name(name: str) -> None:
    ok = name and all(c.isalnum() or c in "-_." for c in name) and not name.startswith(".")
    if not ok:
        raise InvalidRequest(f"invalid graph name {name!r}: use letters, digits, '-', '_', '.'")


class GraphHandle:
    """An opened graph: its manifest and ranged access to its blobs.

    ``verify`` chooses what opening checks: ``"size"`` (every blob exists with
    the manifest's size; what an on-demand function can afford at cold start)
    or ``"full"`` (also the sha256 of every blob).
    """

    def __init__(
        self, backend: StorageBackend, name: str, verify: str = "size", prefix: str | None = None
    ):
        if verify not in ("size", "full", "none"):
            raise ValueError(f"verify must be 'size', 'full' or 'none', not {verify!r}")
        validate_name(name)
        self.backend = backend
        self.name = name
        # where the blobs lie: the graph's own prefix, or a compacted base under it
        self.prefix = prefix or name
        try:
            raw = backend.cat_file(f"{self.prefix}/{MANIFEST}")
        except BlobNotFound:
            raise NotFound(f"no graph {name!r} in store {backend.uri}") from None
        self.manifest = Manifest.from_json(raw, where=f"{self.prefix}/{MANIFEST}")
        if verify != "none":
            self.verify(full=verify == "full")

    # -- integrity ---------------------------------------------------------
    def verify(self, full: bool = False) -> None:
        """Every blob (and chunk digest blob) exists with its manifest size;
        ``full``: also its sha256 (every byte read)."""
        for key, info in self.manifest.blobs.items():
            files = [(info.file, info.nbytes, info.sha256)]
            if info.chunk_bytes:
                files.append((info.chunks_file, info.num_chunks * DIGEST_BYTES, info.chunks_sha256))
            for file, nbytes, sha in files:
                path = f"{self.prefix}/{file}"
                try:
                    size = self.backend.size(path)
                except BlobNotFound:
                    raise BlobNotFound(f"graph {self.name!r}: blob {file!r} is missing") from None
                if size != nbytes:
                    raise CorruptBlob(
                        f"graph {self.name!r}: blob {file!r} is truncated or padded "
                        f"({size} bytes, manifest says {nbytes})"
                    )
                if full:
                    self.check_sha256(file, self.backend.cat_file(path), sha)
            if full and info.chunk_bytes:
                # the digests themselves: each chunk of the blob against its own
                self.check_chunks(key, self.backend.cat_file(self.path(key)))

    def check_sha256(self, file: str, data, expected: str) -> None:
        """Raise :class:`CorruptBlob` unless ``data`` hashes to ``expected``."""
        if hashlib.sha256(data).hexdigest() != expected:
            raise CorruptBlob(f"graph {self.name!r}: blob {file!r} is corrupted (sha256 mismatch)")

    def chunk_digests(self, key: str) -> np.ndarray | None:
        """The chunk digests of blob ``key`` (``[num_chunks, 32]`` uint8, read whole
        and checked against the manifest), or ``None`` for a blob written before
        chunk digests existed."""
        info = self.info(key)
        if not info.chunk_bytes:
            return None
        raw = self.backend.cat_file(f"{self.prefix}/{info.chunks_file}")
        if len(raw) != info.num_chunks * DIGEST_BYTES:
            raise CorruptBlob(
                f"graph {self.name!r}: blob {info.chunks_file!r} has {len(raw)} bytes, "
                f"manifest says {info.num_chunks * DIGEST_BYTES}"
            )
        self.check_sha256(info.chunks_file, raw, info.chunks_sha256)
        return np.frombuffer(raw, dtype=np.uint8).reshape(-1, DIGEST_BYTES)

    def check_chunks(self, key: str, data) -> None:
        """Raise :class:`CorruptBlob` naming the first chunk of blob ``key`` whose
        bytes in ``data`` (the whole blob) do not match its digest."""
        info = self.info(key)
        digests = self.chunk_digests(key)
        if digests is None:
            return
        _, _, got = chunk_digests(data)
        got_arr = np.frombuffer(got, dtype=np.uint8).reshape(-1, DIGEST_BYTES)
        if got_arr.shape != digests.shape:
            raise CorruptBlob(f"graph {self.name!r}: blob {info.file!r} changed size")
        bad = np.flatnonzero((got_arr != digests).any(axis=1))
        if bad.size:
            c = int(bad[0])
            raise CorruptBlob(
                f"graph {self.name!r}: blob {info.file!r} is corrupted in chunk {c} (bytes "
                f"{c * info.chunk_bytes}-{min(info.nbytes, (c + 1) * info.chunk_bytes) - 1}: "
                "sha256 mismatch)"
            )

    # -- access ------------------------------------------------------------
    @property
    def num_nodes(self) -> int:
        return self.manifest.num_nodes

    @property
    def num_edges(self) -> int:
        return self.manifest.num_edges

    def has(self, key: str) -> bool:
        return key in self.manifest.blobs

    def info(self, key: str) -> BlobInfo:
        try:
            return self.manifest.blobs[key]
        except KeyError:
            raise NotFound(f"graph {self.name!r} has no {key!r} blob") from None

    def path(self, key: str) -> str:
        return f"{self.prefix}/{self.info(key).file}"

    def read_blob(self, key: str) -> np.ndarray:
        """A whole blob as an array of its manifest dtype and shape, checked
        against the manifest's sha256 (a blob read whole is always verified)."""
        info = self.info(key)
        data = self.backend.cat_file(self.path(key))
        if len(data) != info.nbytes:
            raise CorruptBlob(f"graph {self.name!r}: blob {info.file!r} changed size")
        self.check_sha256(info.file, data, info.sha256)
        return np.frombuffer(data, dtype=info.dtype).reshape(info.shape)


# -- versions (storage/versions.py): the pointer a graph's readers start from -------------
VERSIONS_DIR = "versions"
VERSION_HINT = "LATEST"


def version_key(name: str, version: int) -> str:
    """Where version ``version``'s record of graph ``name`` lies."""
    return f"{name}/{VERSIONS_DIR}/{int(version):012d}.json"


def read_version(backend: StorageBackend, name: str, version: int) -> dict | None:
    """The record of ``version`` (``None``: no such version)."""
    try:
        raw = backend.cat_file(version_key(name, version))
    except BlobNotFound:
        return None
    try:
        rec = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise CorruptBlob(f"graph {name!r}: version {version} record is not JSON ({exc})") from None
    if not isinstance(rec, dict) or rec.get("version") != version or "base" not in rec:
        raise CorruptBlob(f"graph {name!r}: version {version} record is malformed")
    return rec


def latest_version(backend: StorageBackend, name: str, known: int = 0) -> dict | None:
    """The newest version record of ``name``, or ``None`` for a graph never
    updated (its version 0 is the graph as written). The search starts at the
    hint (a recent version) or at ``known`` (one the caller knows exists) when
    that is newer, and finds the newest after it by :func:`newest_after`."""
    try:
        v = int(backend.cat_file(f"{name}/{VERSIONS_DIR}/{VERSION_HINT}").decode().strip())
    except (BlobNotFound, ValueError, UnicodeDecodeError):
        v = 0
    v = max(v, int(known))
    rec = read_version(backend, name, v) if v > 0 else None
    if rec is None and v > 0:  # that record already collected: the newest listed one
        listed = [
            int(k.rsplit("/", 1)[1][:-5])
            for k in backend.ls(f"{name}/{VERSIONS_DIR}/")
            if k.endswith(".json") and k.rsplit("/", 1)[1][:-5].isdigit()
        ]
        rec = read_version(backend, name, max(listed)) if listed else None
    return newest_after(backend, name, rec)


def newest_after(backend: StorageBackend, name: str, rec: dict | None) -> dict | None:
    """The newest record from ``rec`` on (``None``: from version 0). Versions are
    created in order, so those present past ``rec`` are a run: probed at
    distances 1, 2, 4, ... until one is absent, then halved between the last
    present and that one (``2 log2 n`` reads for ``n`` new versions, one when
    none is new)."""
    lo = rec["version"] if rec else 0
    step, hi = 1, None
    while hi is None:  # the run's end lies before lo + step
        nxt = read_version(backend, name, lo + step)
        if nxt is None:
            hi = lo + step
        else:
            rec, lo, step = nxt, lo + step, step * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        nxt = read_version(backend, name, mid)
        if nxt is None:
            hi = mid
        else:
            rec, lo = nxt, mid
    return rec


def open_graph(store: StorageBackend | str, name: str, verify: str = "size") -> GraphHandle:
    """The graph's current base: as written, or the latest compaction's."""
    backend = open_backend(store) if isinstance(store, str) else store
    validate_name(name)
    rec = latest_version(backend, name)
    prefix = rec["base"] if rec is not None else None
    return GraphHandle(backend, name, verify=verify, prefix=prefix)


def list_graphs(store: StorageBackend | str) -> list[str]:
    backend = open_backend(store) if isinstance(store, str) else store
    names = set()
    for key in backend.ls(""):
        top, _, rest = key.partition("/")
        if rest == MANIFEST or rest.startswith(f"{VERSIONS_DIR}/"):
            names.add(top)
    return sorted(names)
