"""Checking a stored graph on demand (``gnn-faas datasets verify``).

:func:`verify_graph` reads every blob of a graph whole and checks it against
the manifest: its size, its sha256, the sha256 of each of its chunks (where
the manifest has chunk digests), and the CSR invariants of the structure
(:func:`~gnn_faas.storage.resident.check_csr`). It reports every blob, not
just the first that fails. With ``add_digests`` a blob that verified but has
no chunk digests (a store written before they existed) gets them, and the
manifest is rewritten last, so the serving path can verify that blob chunk by
chunk (:mod:`gnn_faas.storage.chunked`).
"""

from __future__ import annotations

import dataclasses
import hashlib

import numpy as np

from gnn_faas.errors import BlobNotFound, CorruptBlob, StorageError
from gnn_faas.storage.format import MANIFEST, GraphHandle, chunk_digests
from gnn_faas.storage.resident import check_csr


def verify_graph(graph: GraphHandle, add_digests: bool = False) -> dict:
    """``{"graph", "ok", "blobs": {key: "ok" | reason}, "csr": "ok" | reason,
    "digests_added": [...]}`` of ``graph`` (opened with ``verify="none"`` so a
    missing or resized blob is reported here, not raised at open)."""
    report: dict = {"graph": graph.name, "blobs": {}, "digests_added": []}
    arrays: dict[str, np.ndarray] = {}
    new_infos = {}
    for key, info in graph.manifest.blobs.items():
        try:
            data = graph.backend.cat_file(graph.path(key))
            if len(data) != info.nbytes:
                raise CorruptBlob(f"{info.file} has {len(data)} bytes, manifest says {info.nbytes}")
            graph.check_sha256(info.file, data, info.sha256)
            if info.chunk_bytes:
                graph.check_chunks(key, data)
            elif add_digests:
                _, chunk, digests = chunk_digests(data)
                graph.backend.pipe_file(f"{graph.prefix}/{info.chunks_file}", digests)
                new_infos[key] = dataclasses.replace(
                    info, chunk_bytes=chunk, chunks_sha256=hashlib.sha256(digests).hexdigest()
                )
            if key in ("indptr", "indices", "degree", "self_loops"):
                arrays[key] = np.frombuffer(data, dtype=info.dtype).reshape(info.shape)
            report["blobs"][key] = "ok"
        except (BlobNotFound, CorruptBlob, StorageError) as exc:
            report["blobs"][key] = str(exc)
    if "indptr" in arrays and "indices" in arrays:
        try:
            check_csr(
                graph.name,
                arrays["indptr"],
                arrays["indices"],
                graph.num_nodes,
                arrays.get("degree"),
                arrays.get("self_loops"),
            )
            report["csr"] = "ok"
        except CorruptBlob as exc:
            report["csr"] = str(exc)
    else:
        report["csr"] = "not checked: indptr or indices unreadable"
    report["ok"] = report["csr"] == "ok" and all(v == "ok" for v in report["blobs"].values())
    if new_infos and report["ok"]:
        blobs = {**graph.manifest.blobs, **new_infos}
        manifest = dataclasses.replace(graph.manifest, blobs=blobs)
        graph.backend.pipe_file(f"{graph.prefix}/{MANIFEST}", manifest.to_json().encode())
        graph.manifest = manifest
        report["digests_added"] = sorted(new_infos)
    return report
