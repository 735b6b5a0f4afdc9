"""One batch of graph updates: as a client asks it, and as a version stores it.

An :class:`UpdateBatch` is what a client sends (``POST /v2/graphs/{g}/updates``
or ``gnn-faas graph update``), in the client's vertex ids: edges to add and to
remove (``(u, v)``: ``v`` aggregates from ``u``, the store's in-edge
direction), vertices to add (their feature rows, optional labels and ids),
feature rows to replace, vertices to remove. :meth:`GraphState.prepare
<gnn_faas.storage.graph_state.GraphState.prepare>` checks it against the graph
at one version and turns it into a :class:`Delta`, the immutable segment a
version appends to the log: stored ids, every implied change spelt out (both
directions on a symmetrised graph; a removed vertex's in- and out-edges).

Ids. New vertices take the next ids, ``num_nodes, num_nodes + 1, ...`` at the
version that commits them (the answer names them); a batch may name them
itself (``new_ids``), and must then name exactly those, so that its edges can
refer to them. A renumbered graph's new vertices keep their id in both
numberings, as a request's new vertices do (storage/reorder.py). A segment is
a frame (:mod:`gnn_faas.wire`): no pickle.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from gnn_faas.errors import InvalidRequest
from gnn_faas.wire import decode_frame, encode_frame

# the tensors of a batch, by name: (dtype, rank)
BATCH_TENSORS: dict[str, tuple[str, int]] = {
    "add_edges": ("int64", 2),
    "remove_edges": ("int64", 2),
    "new_features": ("float32", 2),
    "new_labels": ("int64", 1),
    "new_ids": ("int64", 1),
    "feature_ids": ("int64", 1),
    "features": ("float32", 2),
    "remove_vertices": ("int64", 1),
}
SEGMENT_FORMAT = "gnn-faas-delta"
SEGMENT_VERSION = 1


@dataclass(frozen=True)
class UpdateBatch:
    """One client batch, shape-checked (ids are checked against the graph later)."""

    add_edges: np.ndarray  # int64 [m, 2]
    remove_edges: np.ndarray  # int64 [m, 2]
    new_features: np.ndarray  # float32 [k, d]
    new_labels: np.ndarray | None  # int64 [k]
    new_ids: np.ndarray | None  # int64 [k]
    feature_ids: np.ndarray  # int64 [j]
    features: np.ndarray  # float32 [j, d]
    remove_vertices: np.ndarray  # int64 [r]

    @property
    def num_ops(self) -> int:
        """Edges, vertices and rows this batch touches (its size in the figures)."""
        return int(
            self.add_edges.shape[0]
            + self.remove_edges.shape[0]
            + self.new_features.shape[0]
            + self.feature_ids.size
            + self.remove_vertices.size
        )

    @classmethod
    def from_arrays(cls, arrays: dict[str, Any], max_ops: int | None = None) -> UpdateBatch:
        """From named arrays (JSON lists or numpy arrays); unknown names are a 400."""
        unknown = sorted(set(arrays) - set(BATCH_TENSORS))
        if unknown:
            raise InvalidRequest(
                f"unknown update field(s) {unknown}; known: {', '.join(BATCH_TENSORS)}"
            )
        got = {name: _array(name, arrays[name]) for name in arrays if arrays[name] is not None}
        edges = {k: got.get(k, np.zeros((0, 2), np.int64)) for k in ("add_edges", "remove_edges")}
        for k, e in edges.items():
            if e.size == 0:
                edges[k] = np.zeros((0, 2), np.int64)
            elif e.shape[1] != 2:
                raise InvalidRequest(f"{k} must have shape [m, 2], got {list(e.shape)}")
        new_features = got.get("new_features", np.zeros((0, 0), np.float32))
        features = got.get("features", np.zeros((0, 0), np.float32))
        feature_ids = got.get("feature_ids", np.zeros(0, np.int64))
        if features.shape[0] != feature_ids.size:
            raise InvalidRequest(
                f"features has {features.shape[0]} rows for {feature_ids.size} feature_ids"
            )
        k = new_features.shape[0]
        for name in ("new_labels", "new_ids"):
            if name in got and got[name].size != k:
                raise InvalidRequest(f"{name} has {got[name].size} entries for {k} new vertices")
        batch = cls(
            add_edges=edges["add_edges"],
            remove_edges=edges["remove_edges"],
            new_features=new_features,
            new_labels=got.get("new_labels"),
            new_ids=got.get("new_ids"),
            feature_ids=feature_ids,
            features=features,
            remove_vertices=got.get("remove_vertices", np.zeros(0, np.int64)),
        )
        if batch.num_ops == 0:
            raise InvalidRequest("an update batch must change something")
        if max_ops is not None and batch.num_ops > max_ops:
            raise InvalidRequest(f"an update batch may hold at most {max_ops} changes")
        for name, rows in (("new_features", new_features), ("features", features)):
            bad = ~np.isfinite(rows).all(axis=1) if rows.size else np.zeros(0, bool)
            if bad.any():
                raise InvalidRequest(f"{name} row {int(np.argmax(bad))}: not a finite number")
        return batch

    @classmethod
    def from_json(cls, doc: Any, max_ops: int | None = None) -> UpdateBatch:
        """``{"add_edges": [[u, v], ...], "add_vertices": {"features": ..., "labels": ...,
        "ids": ...}, "set_features": {"ids": ..., "features": ...}, "remove_edges": ...,
        "remove_vertices": [...]}``."""
        if not isinstance(doc, dict):
            raise InvalidRequest("an update batch is a JSON object")
        allowed = {"add_edges", "remove_edges", "add_vertices", "set_features", "remove_vertices"}
        unknown = sorted(set(doc) - allowed)
        if unknown:
            raise InvalidRequest(f"unknown update field(s) {unknown}; known: {sorted(allowed)}")
        arrays: dict[str, Any] = {
            k: doc[k] for k in ("add_edges", "remove_edges", "remove_vertices") if k in doc
        }
        add = doc.get("add_vertices")
        if add is not None:
            if not isinstance(add, dict) or "features" not in add:
                raise InvalidRequest('add_vertices is {"features": [[...]], "labels", "ids"}')
            arrays["new_features"] = add["features"]
            for key, name in (("labels", "new_labels"), ("ids", "new_ids")):
                if add.get(key) is not None:
                    arrays[name] = add[key]
        rows = doc.get("set_features")
        if rows is not None:
            if not isinstance(rows, dict) or {"ids", "features"} - set(rows):
                raise InvalidRequest('set_features is {"ids": [...], "features": [[...]]}')
            arrays["feature_ids"] = rows["ids"]
            arrays["features"] = rows["features"]
        return cls.from_arrays(arrays, max_ops)


def _array(name: str, value: Any) -> np.ndarray:
    dtype, rank = BATCH_TENSORS[name]
    try:
        arr = np.asarray(value)
    except (ValueError, TypeError):
        raise InvalidRequest(f"{name} is not a rectangular array") from None
    if arr.size == 0:
        shape = (0, 0) if rank == 2 else (0,)
        return np.zeros(shape, dtype)
    if dtype == "int64":
        if arr.dtype.kind not in "iu" or arr.dtype == np.uint64:
            raise InvalidRequest(f"{name} must hold integers")
    elif arr.dtype.kind not in "fiu":
        raise InvalidRequest(f"{name} must hold numbers")
    if arr.ndim != rank:
        raise InvalidRequest(f"{name} must have rank {rank}, got shape {list(arr.shape)}")
    return np.ascontiguousarray(arr, dtype=dtype)


@dataclass(frozen=True)
class Delta:
    """One version's changes in stored ids, every implied change spelt out.

    ``base_nodes``: vertices before it (new vertex ``i`` is ``base_nodes + i``);
    edges as ``(src, dst)`` (``dst`` aggregates from ``src``), both directions
    on a symmetrised graph; ``rem_*`` holds each removed vertex's in- and
    out-edges too; ``feat_ids`` rows replaced by ``feat_rows``."""

    base_nodes: int
    new_features: np.ndarray  # float32 [k, d]
    new_labels: np.ndarray  # int64 [k], -1 where none was given
    add_src: np.ndarray
    add_dst: np.ndarray
    rem_src: np.ndarray
    rem_dst: np.ndarray
    feat_ids: np.ndarray
    feat_rows: np.ndarray  # float32 [j, d]
    removed: np.ndarray  # vertices removed

    @property
    def num_new(self) -> int:
        return int(self.new_features.shape[0])

    @property
    def new_ids(self) -> np.ndarray:
        return np.arange(self.base_nodes, self.base_nodes + self.num_new, dtype=np.int64)

    @property
    def sets_rows(self) -> bool:
        """Whether it adds vertices or sets rows: what a memory function must read
        of it (storage/graph_state.py ``rows_version``)."""
        return self.num_new > 0 or self.feat_ids.size > 0

    def rows_changed(self) -> np.ndarray:
        """Vertices whose feature row this delta sets (new and replaced), sorted."""
        return np.union1d(self.new_ids, self.feat_ids)

    def encode(self) -> bytes:
        """The segment's bytes (kept: a commit writes them, the gateway's writer
        process sends them on; a delta never changes)."""
        data = self.__dict__.get("_encoded")
        if data is None:
            tensors = {
                f.name: getattr(self, f.name) for f in fields(self) if f.name != "base_nodes"
            }
            params = {
                "format": SEGMENT_FORMAT,
                "version": SEGMENT_VERSION,
                "base_nodes": self.base_nodes,
            }
            data = encode_frame(tensors, params)
            object.__setattr__(self, "_encoded", data)
        return data

    @classmethod
    def decode(cls, data: bytes, where: str = "segment") -> Delta:
        from gnn_faas.errors import CorruptBlob

        try:
            tensors, params = decode_frame(data, max_bytes=len(data) + 1)
        except InvalidRequest as exc:
            raise CorruptBlob(f"{where}: not a delta segment ({exc})") from None
        if params.get("format") != SEGMENT_FORMAT or params.get("version") != SEGMENT_VERSION:
            raise CorruptBlob(f"{where}: not a delta segment of this format")
        names = [f.name for f in fields(cls) if f.name != "base_nodes"]
        if set(tensors) != set(names):
            raise CorruptBlob(f"{where}: holds {sorted(tensors)}, need {sorted(names)}")
        arrays = {k: np.array(tensors[k]) for k in names}  # writable copies
        return cls(base_nodes=int(params["base_nodes"]), **arrays)

    def summary(self) -> dict:
        return {
            "added_edges": int(self.add_src.size),
            "removed_edges": int(self.rem_src.size),
            "added_vertices": self.num_new,
            "replaced_rows": int(self.feat_ids.size),
            "removed_vertices": int(self.removed.size),
        }
