"""Precomputed layer embeddings of a graph's vertices (OMEGA's SRPE), in the store.

``gnn-faas precompute`` writes, for a model of ``L`` layers, every stored
vertex's embedding ``p_u^(l)`` (the output of layer ``l`` on the whole stored
graph, full neighbourhoods) for ``1 <= l <= L - 1`` beside the graph::

    GRAPH/embeddings/MODEL/manifest.json   model, checkpoint sha256, graph blobs' sha256,
                                           num_nodes, sha256/shape of every layer blob
    GRAPH/embeddings/MODEL/layer{l}.bin    float32 [num_nodes, d_l], row-major
    GRAPH/embeddings/MODEL/state{l}.bin    optional: layer l's aggregate state over the
                                           stored in-neighbours (gnn_faas/functions/
                                           srpe_recompute.py), float32 [num_nodes, d_in]

The set is tied to the checkpoint (sha256 of its ``config.json`` and
``model.safetensors``) and to the graph (the sha256 of its ``indptr``,
``indices`` and ``features`` blobs): opening it for another checkpoint or a
re-ingested graph raises :class:`StaleEmbeddings` (HTTP 409), whose message
says how to refresh it. Rows are read on demand by byte ranges, like features.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from gnn_faas.errors import BlobNotFound, CorruptBlob, GnnFaasError, NotFound
from gnn_faas.storage.format import GraphHandle, validate_name
from gnn_faas.storage.ranges import RangeReader

CONFIG_ENV = "GNN_FAAS_CONFIG"  # the serving config gnn-faas up runs with (for hints)

EMBEDDINGS_FORMAT = "gnn-faas-embeddings"
EMBEDDINGS_VERSION = 1
GRAPH_KEYS = ("indptr", "indices", "features")


class StaleEmbeddings(GnnFaasError):
    """Precomputed embeddings that belong to another checkpoint or graph version."""

    http_status = 409


def graph_fingerprint(graph: GraphHandle) -> dict[str, str]:
    return {k: graph.info(k).sha256 for k in GRAPH_KEYS}


def _prefix(graph: GraphHandle, model: str) -> str:
    validate_name(model)
    return f"{graph.name}/embeddings/{model}"


def _write_rows(graph: GraphHandle, prefix: str, kind: str, arrays: dict) -> dict:
    blobs = {}
    for layer, arr in sorted(arrays.items()):
        a = np.ascontiguousarray(arr, dtype="<f4")
        if a.ndim != 2 or a.shape[0] != graph.num_nodes:
            raise ValueError(f"{kind} {layer} rows must be [{graph.num_nodes}, d]")
        data = memoryview(a).cast("B")
        graph.backend.pipe_file(f"{prefix}/{kind}{layer}.bin", data)
        blobs[str(layer)] = {
            "file": f"{kind}{layer}.bin",
            "shape": list(a.shape),
            "nbytes": a.nbytes,
            "sha256": hashlib.sha256(data).hexdigest(),
        }
    return blobs


def write_embeddings(
    graph: GraphHandle,
    model: str,
    checkpoint: str,
    layers: dict[int, np.ndarray],
    states: dict[int, np.ndarray] | None = None,
    graph_version: int = 0,
) -> dict:
    """Write ``layers[l]`` ``[num_nodes, d_l]``, the optional aggregate
    ``states[l]`` and the side manifest (last): computed on ``graph`` at
    ``graph_version``, nothing stale."""
    prefix = _prefix(graph, model)
    blobs = _write_rows(graph, prefix, "layer", layers)
    state_blobs = _write_rows(graph, prefix, "state", states or {})
    manifest = {
        "format": EMBEDDINGS_FORMAT,
        "version": EMBEDDINGS_VERSION,
        "model": model,
        "checkpoint_sha256": checkpoint,
        "graph": graph.name,
        "graph_sha256": graph_fingerprint(graph),
        "graph_version": int(graph_version),
        "num_nodes": graph.num_nodes,
        "layers": blobs,
        "states": state_blobs,
        "stale": [],
    }
    graph.backend.pipe_file(f"{prefix}/manifest.json", json.dumps(manifest, indent=2).encode())
    return manifest


def mark_stale(
    backend, graph_name: str, new_base: GraphHandle, stale_of: Callable[[int], np.ndarray]
) -> list[str]:
    """After a compaction: every embedding set of ``graph_name`` moves to
    ``new_base`` (its fingerprint) and adds to its stale marks the vertices
    ``stale_of(layers)`` whose stored embeddings the folded log changed (a set
    with ``L - 1`` stored layers is stale within ``L - 1`` hops of a change).
    Those are recomputed on every request until ``gnn-faas precompute
    --refresh``. The sets it marked."""
    marked = []
    for key in backend.ls(f"{graph_name}/embeddings/"):
        if not key.endswith("/manifest.json"):
            continue
        m = json.loads(backend.cat_file(key))
        depth = max((int(k) for k in m.get("layers", {})), default=0)
        stale = np.union1d(np.asarray(m.get("stale", []), np.int64), stale_of(max(depth, 1)))
        m["stale"] = stale.tolist()
        m["graph_sha256"] = graph_fingerprint(new_base)
        m["num_nodes_stored"] = m.get("num_nodes_stored", m["num_nodes"])
        m["num_nodes"] = new_base.num_nodes
        backend.pipe_file(key, json.dumps(m, indent=2).encode())
        marked.append(m["model"])
    return marked


@dataclass
class EmbeddingStore:
    """An opened, checked embedding set: ``rows(layer, ids)`` by ranged reads."""

    graph: GraphHandle
    model: str
    manifest: dict

    @classmethod
    def open(cls, graph: GraphHandle, model: str, checkpoint: str) -> EmbeddingStore:
        prefix = _prefix(graph, model)
        # the command must name the serving config that defines the model (gnn-faas up
        # publishes its --config in GNN_FAAS_CONFIG); without one the embedded default
        config = os.environ.get(CONFIG_ENV)
        flag = f" --config {shlex.quote(config)}" if config else ""
        hint = f"run 'gnn-faas precompute --model {shlex.quote(model)}{flag}' to (re)compute them"
        try:
            raw = graph.backend.cat_file(f"{prefix}/manifest.json")
        except BlobNotFound:
            raise NotFound(
                f"no precomputed embeddings of model {model!r} on graph {graph.name!r}: {hint}"
            ) from None
        try:
            m = json.loads(raw)
            if m.get("format") != EMBEDDINGS_FORMAT or m.get("version") != EMBEDDINGS_VERSION:
                raise ValueError("not a gnn-faas embeddings manifest")
            layers = {int(k): v for k, v in m["layers"].items()}
            states = {int(k): v for k, v in m.get("states", {}).items()}
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CorruptBlob(f"{prefix}/manifest.json: invalid ({exc})") from None
        if m.get("checkpoint_sha256") != checkpoint:
            raise StaleEmbeddings(
                f"the precomputed embeddings of model {model!r} on graph {graph.name!r} belong "
                f"to checkpoint {str(m.get('checkpoint_sha256'))[:12]}, the model is now "
                f"{checkpoint[:12]}: {hint}"
            )
        if (
            m.get("graph_sha256") != graph_fingerprint(graph)
            or m.get("num_nodes") != graph.num_nodes
        ):
            raise StaleEmbeddings(
                f"the precomputed embeddings of model {model!r} were computed on another "
                f"version of graph {graph.name!r}: {hint}"
            )
        for info in (*layers.values(), *states.values()):
            size = graph.backend.size(f"{prefix}/{info['file']}")
            if size != info["nbytes"]:
                raise CorruptBlob(
                    f"{prefix}/{info['file']}: {size} bytes, manifest says {info['nbytes']}"
                )
        m["layers"] = layers
        m["states"] = states
        return cls(graph, model, m)

    def __post_init__(self) -> None:
        self.reader = RangeReader(self.graph.backend)
        self.prefix = _prefix(self.graph, self.model)

    @property
    def layers(self) -> list[int]:
        return sorted(self.manifest["layers"])

    @property
    def stale(self) -> np.ndarray:
        """Vertices marked stale (sorted): their stored embeddings predate a change."""
        return np.asarray(self.manifest.get("stale", []), np.int64)

    def dim(self, layer: int) -> int:
        return int(self.manifest["layers"][layer]["shape"][1])

    def rows(self, layer: int, ids: np.ndarray) -> np.ndarray:
        """``p^(layer)`` rows of stored vertex ``ids`` (float32 ``[k, d_layer]``)."""
        return self._read("layers", layer, ids)

    def has_states(self, layer: int) -> bool:
        return layer in self.manifest["states"]

    def state_rows(self, layer: int, ids: np.ndarray) -> np.ndarray:
        """Layer ``layer``'s stored aggregate states of vertex ``ids``
        (float32 ``[k, d_in]``; see ``gnn_faas/functions/srpe_recompute.py``)."""
        return self._read("states", layer, ids)

    def _read(self, kind: str, layer: int, ids: np.ndarray) -> np.ndarray:
        if layer not in self.manifest[kind]:
            what = "layer" if kind == "layers" else "aggregate state of layer"
            raise NotFound(f"embeddings of model {self.model!r} hold no {what} {layer}")
        ids = np.asarray(ids, dtype=np.int64)
        info = self.manifest[kind][layer]
        d = int(info["shape"][1])
        rb = 4 * d
        raw = self.reader.read(f"{self.prefix}/{info['file']}", ids * rb, ids * rb + rb)
        return raw.view("<f4").reshape(ids.size, d).astype(np.float32, copy=False)
