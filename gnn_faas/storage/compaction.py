"""Compaction: a versioned graph's base and log folded into a new base.

:func:`compact` reads the newest version ``v`` (base plus log), writes the
graph as of ``v`` in the store format under ``NAME/base-v/`` (blobs staged,
the manifest last: storage/staged_writer.py), then publishes the next
version with that base and only the segments committed after ``v`` (a writer
may commit while it runs: the new record keeps its segment). Nothing is
renumbered: a removed vertex stays an isolated vertex with no edges, listed in
the manifest (``extra["removed_vertices"]``), so answers, caches and ids
hold across it; a renumbered graph keeps its user ids.

What the new base no longer needs (the old base unless it is the graph as
first written, the folded segments, older version records) is not deleted at
once: requests still running on older versions may read it. It is listed in
``NAME/gc.json`` with the time after which it may go (``grace_s``, longer than
any request's deadline) and deleted by a later compaction.

Killed at any moment, a compaction loses nothing: until the new record is
published the previous version is served and ``base-v`` is unreferenced; the
next run writes it again (or, when the log moved on, removes it with the
other leftovers).
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
import uuid
from dataclasses import replace

import numpy as np

from gnn_faas.errors import BlobNotFound
from gnn_faas.storage.backends.base import StorageBackend
from gnn_faas.storage.embeddings import mark_stale
from gnn_faas.storage.format import GraphHandle, self_loop_counts, version_key
from gnn_faas.storage.graph_state import GraphState
from gnn_faas.storage.staged_writer import StagedGraphWriter
from gnn_faas.storage.versions import (
    VersionRecord,
    base_prefix,
    fold,
    latest,
    publish,
    segments_after,
)

log = logging.getLogger("gnn_faas.storage")

GC_KEY = "gc.json"
DEFAULT_GRACE_S = 120.0  # over the default request deadline (30 s) with room to spare
ROWS_PER_CHUNK = 1 << 16  # feature rows written per chunk: memory stays bounded


def state_of(
    backend: StorageBackend, rec: VersionRecord
) -> tuple[GraphState, tuple[np.ndarray, np.ndarray]]:
    """The graph at ``rec`` and its base's CSR, read whole (compaction reads every
    list anyway)."""
    graph = GraphHandle(backend, rec.graph, verify="size", prefix=rec.base)
    indptr = graph.read_blob("indptr").astype(np.int64)
    indices = graph.read_blob("indices")

    def base_lists(v: np.ndarray):
        lo, hi = indptr[v], indptr[v + 1]
        counts = hi - lo
        total = int(counts.sum())
        starts = np.repeat(lo - (np.cumsum(counts) - counts), counts)
        return counts, indices[starts + np.arange(total)].astype(np.int64)

    state = GraphState.of_base(graph, base_lists, version=rec.base_version)
    segments = segments_after(backend, rec, rec.base_version)
    return fold(backend, state, segments), (indptr, indices)  # a merge per group of segments


def merged_csr(
    state: GraphState, base_csr: tuple[np.ndarray, np.ndarray]
) -> tuple[np.ndarray, np.ndarray]:
    """``(indptr, indices)`` of the whole graph at ``state``: the base's lists,
    each changed vertex's list in its place, added vertices at the end."""
    indptr, indices = base_csr
    n, base_n = state.num_nodes, state.base_nodes
    counts = np.zeros(n, np.int64)
    counts[:base_n] = np.diff(indptr)
    ch_ids, ch_ptr, ch_idx = state.changed_csr()
    changed = np.zeros(n, bool)
    changed[ch_ids] = True
    counts[ch_ids] = np.diff(ch_ptr)
    out_ptr = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
    out = np.empty(int(out_ptr[-1]), dtype=indices.dtype if n < 2**31 else np.int64)
    # unchanged base vertices: their stored segments, moved to their new offsets
    keep = np.flatnonzero(~changed[:base_n])
    for a in range(0, keep.size, ROWS_PER_CHUNK * 16):  # bounded index arrays
        v = keep[a : a + ROWS_PER_CHUNK * 16]
        c = counts[v]
        total = int(c.sum())
        if total == 0:
            continue
        offs = np.arange(total) - np.repeat(np.cumsum(c) - c, c)
        out[np.repeat(out_ptr[v], c) + offs] = indices[np.repeat(indptr[v], c) + offs]
    c = np.diff(ch_ptr)
    if c.size and int(c.sum()):
        offs = np.arange(int(c.sum())) - np.repeat(np.cumsum(c) - c, c)
        out[np.repeat(out_ptr[ch_ids], c) + offs] = ch_idx
    return out_ptr, out


def compact(
    backend: StorageBackend, name: str, grace_s: float = DEFAULT_GRACE_S, now=time.time
) -> dict:
    """Fold ``name``'s log into a new base (see the module docstring); what it did."""
    t0 = time.perf_counter()
    collected = collect_garbage(backend, name, now())
    rec = latest(backend, name)
    if rec.num_segments == 0:  # nothing after the base (a compaction's own version included)
        return {"graph": name, "compacted": False, "version": rec.version, "deleted": collected}
    state, base_csr = state_of(backend, rec)
    prefix = base_prefix(name, rec.version)
    write_base(backend, state, base_csr, prefix)
    folded = rec.version
    while True:  # publish the next version on the new base, keeping later segments
        head = latest(backend, name)
        after = segments_after(backend, head, folded)  # committed while this ran
        listed = tuple(s for s in head.segments if s[0] > folded)
        seconds = time.perf_counter() - t0
        new = replace(
            head,
            version=head.version + 1,
            base=prefix,
            base_version=folded,
            segments=listed,
            segments_from=max(folded, head.segments_from),
            log_bytes=int(sum(s[2] for s in after)),
            log_segments=len(after),
            created=now(),
            commit=f"compaction-{folded}-{uuid.uuid4().hex[:12]}",
            last_compaction={"at": now(), "seconds": seconds, "version": folded},
        )
        if publish(backend, new, hint=True):
            break
    # stored embeddings the folded log made stale: marked, recomputed until a refresh
    new_base = GraphHandle(backend, name, verify="none", prefix=prefix)
    changed = state.changed_vertices()
    mark_stale(backend, name, new_base, lambda layers: state.reach(changed, layers))
    garbage = list(state.segments)  # the folded segments
    garbage += [version_key(name, v) for v in range(max(1, rec.base_version), folded)]
    keys = backend.ls(name + "/")
    if rec.base != name:  # a compacted base: everything under its prefix
        garbage += [k for k in keys if k.startswith(rec.base + "/")]
    else:  # the graph as first written: its manifest and blobs (not its log, embeddings...)
        garbage += [k for k in keys if "/" not in k[len(name) + 1 :]
                    and k != f"{name}/{GC_KEY}"]  # fmt: skip
    garbage += leftovers(name, keys, folded, {prefix, rec.base})
    schedule_garbage(backend, name, garbage, now() + grace_s)
    out = {
        "graph": name,
        "compacted": True,
        "version": new.version,
        "folded_version": folded,
        "base": prefix,
        "num_nodes": state.num_nodes,
        "num_edges": state.num_edges,
        "segments_folded": len(state.segments),
        "seconds": time.perf_counter() - t0,
        "deleted": collected,
    }
    log.info("graph %s compacted at version %d in %.2f s", name, folded, out["seconds"])
    return out


def write_base(
    backend: StorageBackend,
    state: GraphState,
    base_csr: tuple[np.ndarray, np.ndarray],
    prefix: str,
) -> None:
    """The graph at ``state`` in the store format under ``prefix``."""
    graph = state.graph
    ptr, idx = merged_csr(state, base_csr)
    n, base_n = state.num_nodes, state.base_nodes
    feats = state.features
    with StagedGraphWriter(backend, graph.name, prefix=prefix) as w:
        w.write_array("indptr", ptr)
        w.write_array("indices", idx)
        info = graph.info("features")
        stream = w.blob("features", info.dtype, (n, *info.shape[1:]))
        for a in range(0, n, ROWS_PER_CHUNK):  # base rows, then each set row in its place
            b = min(n, a + ROWS_PER_CHUNK)
            rows = np.zeros((b - a, *info.shape[1:]), dtype=info.dtype)
            if a < base_n:
                stop = min(b, base_n)
                raw = graph.backend.cat_file(graph.path("features"), a * info.row_bytes,
                                             stop * info.row_bytes)  # fmt: skip
                rows[: stop - a] = np.frombuffer(raw, info.dtype).reshape(stop - a, -1)
            lo, hi = np.searchsorted(feats.feat_ids, [a, b])
            if hi > lo:
                rows[feats.feat_ids[lo:hi] - a] = feats.feat_rows[lo:hi]
            stream.write(rows)
        w.finish(stream)
        w.write_array("degree", np.bincount(idx, minlength=n).astype("<i4"))
        loops = self_loop_counts(ptr, idx)
        if loops.any():
            w.write_array("self_loops", loops.astype("<i4"))
        _extended(w, graph, "labels", n, np.concatenate(
            (graph.read_blob("labels"), feats.new_labels)) if graph.has("labels") else None)  # fmt: skip
        for key, fill in (("node_ids", -1), ("split", 2), ("psgs", 0), ("fap", 0)):
            if graph.has(key):
                old = graph.read_blob(key)
                _extended(
                    w, graph, key, n, np.concatenate((old, np.full(n - old.size, fill, old.dtype)))
                )
        if graph.has("user_ids"):  # added vertices keep their id in both numberings
            old = graph.read_blob("user_ids")
            _extended(w, graph, "user_ids", n, np.concatenate((old, np.arange(old.size, n))))
        if graph.has("request_order"):
            w.write_array("request_order", graph.read_blob("request_order"))
        extra = dict(graph.manifest.extra)
        extra["self_loops"] = int(loops.sum())
        extra["removed_vertices"] = feats.removed.tolist()
        extra["compacted_from_version"] = state.version
        if "workload_metrics" in extra:  # PSGS and FAP of the base: approximate from now
            extra["workload_metrics"] = {**extra["workload_metrics"],
                                         "approximate_since_version": state.base_version}  # fmt: skip
        w.publish(
            num_nodes=n,
            num_edges=int(idx.size),
            feature_dim=graph.manifest.feature_dim,
            symmetrized=graph.manifest.symmetrized,
            num_classes=graph.manifest.num_classes,
            extra=extra,
        )


def _extended(w: StagedGraphWriter, graph: GraphHandle, key: str, n: int, arr) -> None:
    if arr is not None:
        w.write_array(key, np.ascontiguousarray(arr[:n], dtype=graph.info(key).dtype))


# -- deferred deletion -------------------------------------------------------------
def leftovers(name: str, keys: list[str], folded: int, keep: set[str]) -> list[str]:
    """Keys of bases older than version ``folded`` that no version published (a
    compaction killed between writing its base and its record), but ``keep``."""
    out = []
    for key in keys:  # one pass over the graph's keys; a base is a key prefix
        prefix = "/".join(key.split("/")[:2])
        if not prefix.startswith(f"{name}/base-") or prefix in keep:
            continue
        version = prefix.rsplit("-", 1)[1]
        if version.isdigit() and int(version) < folded:
            out.append(key)
    return out


def _in_base(key: str, base: str, name: str) -> bool:
    """Whether ``key`` is a blob of base ``base`` (``name`` itself: its top-level keys)."""
    if base == name:
        return key.startswith(name + "/") and "/" not in key[len(name) + 1 :]
    return key.startswith(base + "/")


def _gc_list(backend: StorageBackend, name: str) -> list[dict]:
    try:
        return json.loads(backend.cat_file(f"{name}/{GC_KEY}"))
    except (BlobNotFound, ValueError):
        return []


def schedule_garbage(backend: StorageBackend, name: str, keys: list[str], after: float) -> None:
    """List ``keys`` for deletion once ``after`` (unix seconds) has passed (a key
    listed already keeps its time)."""
    entries = _gc_list(backend, name)
    listed = {e["key"] for e in entries}
    entries += [{"key": k, "after": after} for k in dict.fromkeys(keys) if k not in listed]
    backend.pipe_file(f"{name}/{GC_KEY}", json.dumps(entries).encode())


def collect_garbage(backend: StorageBackend, name: str, now: float) -> int:
    """Delete the listed keys whose time has come; how many. Never a key of the
    newest version's base (a compaction that published after this list was
    written: listed as a leftover, it is in use after all)."""
    entries = _gc_list(backend, name)
    if not any(e["after"] <= now for e in entries):
        return 0
    base = latest(backend, name).base
    due = [e for e in entries if e["after"] <= now and not _in_base(e["key"], base, name)]
    for e in due:
        with contextlib.suppress(BlobNotFound):  # deleted by an earlier, killed run
            backend.rm(e["key"])
    rest = [e for e in entries if e not in due]
    backend.pipe_file(f"{name}/{GC_KEY}", json.dumps(rest).encode())
    return len(due)
