"""The graph structure a gateway reads for every request, held out of the store's round trips.

Every request's k-hop step reads ``indptr`` and ``indices`` (and ``degree``,
``self_loops``, ``psgs`` for GCN degrees and Quiver's size prediction). On a
remote store each read is a round trip, and a gateway serves many requests at
once, so these blobs are read through :func:`open_structure`:

- **resident** when their bytes fit ``budget_bytes``: each blob is read whole
  once at start, checked against the manifest's sha256 and the CSR invariants
  (:func:`check_csr`), and served from memory (:class:`MemoryBackend`: the
  file store's vectorised gather, no store call). Bitcoin OTC's structure is
  0.2 MB; a graph of 100M edges about 0.5 GB;
- otherwise **chunk-cached**: reads go through a bounded block cache of
  verified chunks (:class:`~gnn_faas.storage.chunked.ChunkedReads`, at most
  ``budget_bytes`` kept) with concurrent, single-flight reads of the missing
  chunks; the fetcher checks the invariants of every part it reads.

Either way nothing serialises requests: reads run concurrently. The rule and
its measurements: docs/architecture.md, section 6.
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass

import numpy as np

from gnn_faas.errors import BlobNotFound, CorruptBlob, InvalidRequest
from gnn_faas.storage.backends.base import StorageBackend
from gnn_faas.storage.backends.file import gather_ranges
from gnn_faas.storage.chunked import ChunkedReads, ChunkSpec
from gnn_faas.storage.format import GraphHandle, chunk_bytes_for

log = logging.getLogger("gnn_faas.storage")

# the per-vertex blobs the k-hop step and the size prediction read
STRUCTURE_KEYS = ("indptr", "indices", "degree", "self_loops", "psgs")


class MemoryBackend(StorageBackend):
    """Read-only blobs held in this process's memory, read like the file store."""

    scheme = "memory"

    def __init__(self, uri: str, blobs: dict[str, np.ndarray]):
        super().__init__(uri)
        self._blobs = {
            k: np.ascontiguousarray(v).reshape(-1).view(np.uint8) for k, v in blobs.items()
        }

    def _buf(self, path: str) -> np.ndarray:
        try:
            return self._blobs[path]
        except KeyError:
            raise BlobNotFound(f"no resident blob {path!r}") from None

    def read_ranges(self, path: str, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
        buf = self._buf(path)
        starts = np.asarray(starts, dtype=np.int64)
        ends = np.minimum(np.asarray(ends, dtype=np.int64), buf.size)
        return gather_ranges(buf, starts, np.maximum(ends, starts))

    def cat_file(self, path: str, start: int | None = None, end: int | None = None) -> bytes:
        return self._buf(path)[slice(start, end)].tobytes()

    def size(self, path: str) -> int:
        return int(self._buf(path).size)

    def exists(self, path: str) -> bool:
        return path in self._blobs

    def ls(self, prefix: str = "") -> list[str]:
        return sorted(k for k in self._blobs if k.startswith(prefix))

    def pipe_file(self, path: str, data) -> None:
        raise InvalidRequest("resident graph structure is read-only")

    def rm(self, path: str) -> None:
        raise InvalidRequest("resident graph structure is read-only")

    @property
    def nbytes(self) -> int:
        return int(sum(b.nbytes for b in self._blobs.values()))


def check_csr(
    name: str,
    indptr: np.ndarray,
    indices: np.ndarray,
    num_nodes: int,
    degree: np.ndarray | None = None,
    self_loops: np.ndarray | None = None,
) -> None:
    """Raise :class:`CorruptBlob` with the reason unless ``indptr``/``indices`` are
    an in-edge CSR of ``num_nodes`` vertices: ``indptr`` starts at 0, never
    decreases and ends at ``len(indices)``; every index lies in
    ``[0, num_nodes)``; ``degree`` (out-degree) is how often each vertex occurs
    in ``indices``; ``self_loops`` counts each row's own vertex."""
    where = f"graph {name!r}"
    if indptr.shape != (num_nodes + 1,):
        raise CorruptBlob(f"{where}: indptr has {indptr.size} entries, need {num_nodes + 1}")
    if num_nodes + 1 and int(indptr[0]) != 0:
        raise CorruptBlob(f"{where}: indptr starts at {int(indptr[0])}, not 0")
    steps = np.diff(indptr)
    if steps.size and int(steps.min()) < 0:
        row = int(np.argmax(steps < 0))
        raise CorruptBlob(f"{where}: indptr decreases after row {row} (not monotonic)")
    if int(indptr[-1]) != indices.size:
        raise CorruptBlob(
            f"{where}: indptr ends at {int(indptr[-1])} but indices has {indices.size} entries"
        )
    if indices.size and (int(indices.min()) < 0 or int(indices.max()) >= num_nodes):
        raise CorruptBlob(f"{where}: indices hold vertex ids outside [0, {num_nodes})")
    if degree is not None:
        counted = np.bincount(indices, minlength=num_nodes)
        if degree.shape != (num_nodes,) or not np.array_equal(counted, degree):
            raise CorruptBlob(f"{where}: degree does not match the out-degrees in indices")
    if self_loops is not None:
        from gnn_faas.storage.format import self_loop_counts

        if not np.array_equal(self_loop_counts(indptr, indices), self_loops):
            raise CorruptBlob(f"{where}: self_loops does not match the CSR")


def check_rows(name: str, lo: np.ndarray, hi: np.ndarray, num_edges: int) -> None:
    """The invariants a part of ``indptr`` (row bounds ``lo``, ``hi``) can show."""
    if lo.size and (int(lo.min()) < 0 or int(hi.max()) > num_edges or bool((hi < lo).any())):
        raise CorruptBlob(f"graph {name!r}: indptr holds bounds outside [0, {num_edges}]")


def check_ids(name: str, ids: np.ndarray, num_nodes: int) -> None:
    """The invariant a part of ``indices`` can show: every id in ``[0, num_nodes)``."""
    if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= num_nodes):
        raise CorruptBlob(f"graph {name!r}: indices hold vertex ids outside [0, {num_nodes})")


@dataclass
class Structure:
    """How a graph's structure is read: ``backend`` serves its blobs; ``resident``
    whether they are in memory (else chunk-cached); ``nbytes`` their size."""

    backend: StorageBackend
    resident: bool
    nbytes: int
    budget_bytes: int
    keys: tuple[str, ...]
    prefix: str = ""  # the base it belongs to

    def describe(self) -> str:
        mib = self.nbytes / 2**20
        how = "resident in memory" if self.resident else "read through a bounded chunk cache"
        return (
            f"structure ({', '.join(self.keys)}) {mib:.1f} MiB, {how} "
            f"(budget {self.budget_bytes / 2**20:.0f} MiB)"
        )

    def figures(self) -> dict:
        out = {"resident": self.resident, "bytes": self.nbytes, "budget_bytes": self.budget_bytes}
        if isinstance(self.backend, ChunkedReads):
            out.update(self.backend.figures, cached_bytes=self.backend.cached_bytes)
        return out


def structure_keys(graph: GraphHandle) -> tuple[str, ...]:
    return tuple(k for k in STRUCTURE_KEYS if graph.has(k))


def structure_bytes(graph: GraphHandle) -> int:
    return int(sum(graph.info(k).nbytes for k in structure_keys(graph)))


def open_structure(graph: GraphHandle, budget_bytes: int) -> Structure:
    """Load ``graph``'s structure resident when it fits ``budget_bytes`` (verified
    whole), else a chunk cache of that many bytes over its store (verified per
    chunk). Raises :class:`CorruptBlob` naming the first broken invariant."""
    keys = structure_keys(graph)
    total = structure_bytes(graph)
    if total <= budget_bytes:
        arrays = {k: graph.read_blob(k) for k in keys}  # sha256-checked
        check_csr(
            graph.name,
            arrays["indptr"],
            arrays["indices"],
            graph.num_nodes,
            arrays.get("degree"),
            arrays.get("self_loops"),
        )
        blobs = {graph.path(k): a for k, a in arrays.items()}
        backend = MemoryBackend(f"memory://{graph.name}", blobs)
        return Structure(backend, True, total, int(budget_bytes), keys, graph.prefix)
    specs = {}
    for k in keys:
        info = graph.info(k)
        chunk = info.chunk_bytes or chunk_bytes_for(info.nbytes)
        specs[graph.path(k)] = ChunkSpec(info.nbytes, chunk, graph.chunk_digests(k))
    if any(s.digests is None for s in specs.values()):
        log.warning(
            "graph %s: its structure has no chunk digests (written before they existed): reads "
            "are checked for the CSR invariants only; 'gnn-faas datasets verify --add-digests' "
            "adds them",
            graph.name,
        )
    backend = ChunkedReads(graph.backend, specs, cache_bytes=int(budget_bytes))
    return Structure(backend, False, total, int(budget_bytes), keys, graph.prefix)


# blobs up to this size are read whole and checked at a gateway's start; larger
# ones chunk by chunk where a function reads them (storage/chunked.py)
WHOLE_VERIFY_BYTES = 64 << 20


def verify_small_blobs(
    graph: GraphHandle,
    skip: set[str] | frozenset[str] = frozenset(),
    limit: int = WHOLE_VERIFY_BYTES,
) -> list[str]:
    """Read every blob of ``graph`` of at most ``limit`` bytes (except ``skip``)
    whole and check its sha256; the keys checked. Raises :class:`CorruptBlob`."""
    done = []
    for key, info in graph.manifest.blobs.items():
        if key not in skip and info.nbytes <= limit:
            graph.read_blob(key)  # sha256-checked
            done.append(key)
    return done


def with_backend(graph: GraphHandle, backend: StorageBackend) -> GraphHandle:
    """A handle of the same graph (same manifest) reading through ``backend``."""
    out = copy.copy(graph)
    out.backend = backend
    return out


def verified_reads(graph: GraphHandle) -> GraphHandle:
    """``graph`` with every blob that has chunk digests verified chunk by chunk on
    first read (a memory function's reads: no cache here, the feature cache is
    the cache). Blobs without digests are read as they are."""
    specs = {}
    for key, info in graph.manifest.blobs.items():
        if info.chunk_bytes:
            specs[graph.path(key)] = ChunkSpec(
                info.nbytes, info.chunk_bytes, graph.chunk_digests(key)
            )
    if not specs:
        return graph
    return with_backend(graph, ChunkedReads(graph.backend, specs))
