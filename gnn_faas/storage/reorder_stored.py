"""Renumber a graph already in a store (``gnn-faas datasets reorder``).

``ingest --reorder`` and ``datasets prepare --reorder`` renumber a graph as it
is built; a graph that is already stored (a ``datasets synth`` output, a graph
to move into another store in another order) is renumbered here: its
structure is read whole (every order needs it), permuted
(:func:`~gnn_faas.storage.reorder.permute_csr`) and written with every
per-vertex blob in the new order, through a
:class:`~gnn_faas.storage.staged_writer.StagedGraphWriter` (the manifest is
published last; an interrupted run leaves the destination as it was). The
per-vertex blobs are copied ``ROW_CHUNK_BYTES`` of rows at a time by ranged
reads of the source (rows in the new order are scattered in the old one), so
the features are never held whole: the memory is the structure plus a chunk.

Ids stay the user's: ``user_ids`` of the result maps each stored vertex to the
id it had before any renumbering (a source renumbered before keeps its users'
ids through the composition), and the request order is mapped to the new
stored ids, as the fetchers read it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from gnn_faas.errors import InvalidRequest
from gnn_faas.storage.backends import StorageBackend, open_backend
from gnn_faas.storage.format import GraphHandle, Manifest
from gnn_faas.storage.ranges import RangeReader
from gnn_faas.storage.reorder import REORDERS, permute_csr, reorder_permutation
from gnn_faas.storage.staged_writer import StagedGraphWriter

ROW_CHUNK_BYTES = 64 << 20  # bytes of a per-vertex blob copied at a time
# blobs with one row per vertex: their rows follow their vertex
PER_VERTEX = ("features", "labels", "degree", "node_ids", "self_loops", "split", "psgs", "fap")


@dataclass(frozen=True)
class ReorderResult:
    manifest: Manifest
    seconds: float
    order_seconds: float  # computing the order alone


def reorder_stored(
    graph: GraphHandle,
    store: StorageBackend | str,
    method: str,
    name: str | None = None,
) -> ReorderResult:
    """Write ``graph`` renumbered by ``method`` to ``store`` as ``name`` (default:
    the graph's name), replacing any graph of that name there."""
    if method not in REORDERS:
        raise InvalidRequest(f"--reorder must be one of {', '.join(REORDERS)}, not {method!r}")
    m = graph.manifest
    unknown = sorted(set(m.blobs) - {"indptr", "indices", "request_order", "user_ids", *PER_VERTEX})
    if unknown:
        raise InvalidRequest(f"graph {graph.name!r}: cannot renumber blobs {unknown}")
    t0 = time.perf_counter()
    n = graph.num_nodes
    indptr, indices = graph.read_blob("indptr"), graph.read_blob("indices")
    order = reorder_permutation(indptr, indices, method)
    order_s = time.perf_counter() - t0
    new_indptr, new_indices = permute_csr(indptr, indices, order)
    del indptr, indices
    stored = np.empty(n, np.int64)  # new stored id of each old stored id
    stored[order] = np.arange(n)
    backend = open_backend(store) if isinstance(store, str) else store
    reader = RangeReader(graph.backend)
    with StagedGraphWriter(backend, name or graph.name) as w:
        w.write_array("indptr", new_indptr.astype("<i8"))
        w.write_array("indices", new_indices.astype(m.blobs["indices"].dtype))
        del new_indptr, new_indices
        for key in (k for k in m.blobs if k in PER_VERTEX):
            _copy_rows(graph, key, order, reader, w)
        if graph.has("request_order"):
            requests = graph.read_blob("request_order").astype(np.int64)
            w.write_array("request_order", stored[requests].astype("<i8"))
        if graph.has("user_ids"):  # renumbered before: keep the users' ids
            w.write_array("user_ids", graph.read_blob("user_ids")[order].astype("<i8"))
        elif method != "none":
            w.write_array("user_ids", order.astype("<i8"))
        extra = dict(m.extra)
        if method != "none":
            extra["reorder"] = method
        manifest = w.publish(
            num_nodes=n,
            num_edges=m.num_edges,
            feature_dim=m.feature_dim,
            symmetrized=m.symmetrized,
            num_classes=m.num_classes,
            extra=extra,
        )
    return ReorderResult(manifest, time.perf_counter() - t0, order_s)


def _copy_rows(
    graph: GraphHandle, key: str, order: np.ndarray, reader: RangeReader, w: StagedGraphWriter
) -> None:
    """Blob ``key`` with row ``i`` taken from row ``order[i]``, a chunk at a time."""
    info = graph.info(key)
    if not info.shape or info.shape[0] != order.size:
        raise InvalidRequest(
            f"graph {graph.name!r}: blob {key!r} has shape {info.shape}, not one row per vertex"
        )
    rb = info.row_bytes
    stream = w.blob(key, info.dtype, info.shape)
    per = max(1, ROW_CHUNK_BYTES // max(rb, 1))
    path = graph.path(key)
    for s0 in range(0, order.size, per):  # a loop over chunks of rows
        ids = order[s0 : s0 + per]
        raw = reader.read(path, ids * rb, ids * rb + rb)
        stream.write(raw.view(info.dtype).reshape(ids.size, *info.shape[1:]))
    w.finish(stream)
