"""Quiver's workload metrics, computed once per graph with sparse mat-vec products.

Let ``A`` be the in-edge adjacency (row ``v`` marks the vertices ``v``
aggregates from), ``d = A 1`` the in-degrees, and for a fanout ``f`` (``-1``:
all) the sampling matrix ``S_f = diag(min(d, f) / d) A``: row ``v`` holds the
probability that each in-neighbour is among ``v``'s ``f`` uniform samples
without replacement (what :func:`~gnn_faas.storage.fetcher.sample_segments`
draws). For fanouts ``f_1..f_L`` (hop 1 expands the targets):

- **PSGS** (probabilistic sampled graph size) of a target ``v``: the expected
  number of (vertex, hop) entries of its sampled computation tree,
  ``PSGS = 1 + S_1 1 + S_1 S_2 1 + ... + S_1 ... S_L 1`` (right to left: ``L``
  mat-vecs per hop count). With full neighbourhoods it is the exact tree size.
  It predicts a request's size before any fetch: ``Σ_{t ∈ targets} PSGS(t)``
  bounds its vertices (the fetch merges repeats).
- **FAP** (feature access probability) of a vertex ``u``: the probability that
  a request reads ``u``'s feature row, for single-target requests drawn from
  ``r``: uniform, or the graph's real request order, where request ``i`` of
  ``T`` weighs ``2^{-(T-1-i)/half_life}`` (recent requests count most: request
  streams drift) and the result is mixed with the uniform distribution
  (``(1 - m) r_order + m / N``; defaults ``half_life = 2%`` of the order and
  ``m = 0.5``, picked on the Higgs retweet and Bitcoin OTC orders, where they
  beat both the plain order and the uniform distribution). ``p_0 = r``,
  ``p_h = S_h^T p_{h-1}`` (clipped at 1: expected hits may exceed one through
  several paths), ``FAP = 1 - Π_h (1 - p_h)``. ``Σ_u p_h(u) = Σ_t r(t)
  (S_1..S_h 1)(t)``: the request-weighted PSGS of hop ``h``.

Both are stored as float32 blobs ``psgs`` and ``fap`` of the graph, with their
fanouts and request distribution in the manifest's ``extra["workload_metrics"]``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import scipy.sparse as sp

from gnn_faas.errors import InvalidRequest
from gnn_faas.storage.format import MANIFEST, GraphHandle, Manifest, put_blob

DISTRIBUTIONS = ("uniform", "request_order")
DEFAULT_HALF_LIFE = 0.02  # share of the request order
DEFAULT_UNIFORM_MIX = 0.5


def sampling_matrix(indptr: np.ndarray, indices: np.ndarray, fanout: int | None) -> sp.csr_matrix:
    """``S_f`` (see the module docstring) as a CSR matrix."""
    indptr = np.asarray(indptr, dtype=np.int64)
    n = indptr.size - 1
    deg = np.diff(indptr).astype(np.float64)
    if fanout is None or fanout < 0:
        keep = np.ones(n)
    else:
        keep = np.minimum(deg, fanout) / np.maximum(deg, 1)
    data = np.repeat(keep, np.diff(indptr))
    return sp.csr_matrix((data, np.asarray(indices, np.int64), indptr), shape=(n, n))


def psgs(indptr: np.ndarray, indices: np.ndarray, fanouts: Sequence[int | None]) -> np.ndarray:
    """Expected sampled computation-tree size of every vertex as a target."""
    mats = [sampling_matrix(indptr, indices, f) for f in fanouts]
    n = np.asarray(indptr).size - 1
    total = np.ones(n)
    for h in range(1, len(mats) + 1):
        v = np.ones(n)
        for m in reversed(mats[:h]):
            v = m @ v
        total += v
    return total


def request_distribution(
    num_nodes: int,
    kind: str = "uniform",
    request_order: np.ndarray | None = None,
    half_life: float | None = None,
    uniform_mix: float = 0.0,
) -> np.ndarray:
    """``r``: the probability that a request targets each vertex.
    ``half_life`` (a share of the order; ``None``: no decay) and
    ``uniform_mix`` as in the module docstring."""
    uniform = np.full(num_nodes, 1.0 / max(1, num_nodes))
    if kind == "uniform":
        return uniform
    if kind == "request_order":
        if request_order is None or request_order.size == 0:
            raise InvalidRequest("the graph has no request order: use the uniform distribution")
        if not 0.0 <= uniform_mix <= 1.0:
            raise InvalidRequest("uniform_mix must lie in [0, 1]")
        order = np.asarray(request_order, np.int64)
        weights = None
        if half_life is not None:
            age = np.arange(order.size - 1, -1, -1, dtype=np.float64)
            weights = np.exp2(-age / max(half_life * order.size, 1e-9))
        counts = np.bincount(order, weights=weights, minlength=num_nodes)
        return (1.0 - uniform_mix) * counts / counts.sum() + uniform_mix * uniform
    raise InvalidRequest(f"request distribution must be one of {DISTRIBUTIONS}, got {kind!r}")


def hop_probabilities(
    indptr: np.ndarray, indices: np.ndarray, fanouts: Sequence[int | None], r: np.ndarray
) -> list[np.ndarray]:
    """``[p_0, ..., p_L]`` (before clipping): expected reads of each vertex per hop."""
    out = [np.asarray(r, dtype=np.float64)]
    for f in fanouts:
        out.append(sampling_matrix(indptr, indices, f).T @ out[-1])
    return out


def fap(
    indptr: np.ndarray, indices: np.ndarray, fanouts: Sequence[int | None], r: np.ndarray
) -> np.ndarray:
    """Probability that a request reads each vertex's feature row."""
    miss = np.ones(np.asarray(indptr).size - 1)
    for p in hop_probabilities(indptr, indices, fanouts, r):
        miss *= 1.0 - np.clip(p, 0.0, 1.0)
    return 1.0 - miss


def compute_and_store(
    graph: GraphHandle, fanouts: Sequence[int | None], distribution: str | None = None
) -> dict:
    """Compute PSGS and FAP of ``graph`` and add them to its store (blobs, then
    the manifest). ``distribution`` ``None``: the real request order when the
    graph has one, else uniform."""
    indptr = graph.read_blob("indptr")
    indices = graph.read_blob("indices")
    order = graph.read_blob("request_order") if graph.has("request_order") else None
    if distribution is None:
        distribution = "request_order" if order is not None and order.size else "uniform"
    r = request_distribution(
        graph.num_nodes, distribution, order, DEFAULT_HALF_LIFE, DEFAULT_UNIFORM_MIX
    )
    arrays = {"psgs": psgs(indptr, indices, fanouts), "fap": fap(indptr, indices, fanouts, r)}
    blobs = dict(graph.manifest.blobs)
    for key, arr in arrays.items():
        blobs[key] = put_blob(graph.backend, graph.prefix, key, np.asarray(arr, dtype="<f4"))
    meta = {
        "fanouts": [-1 if f is None else int(f) for f in fanouts],
        "fap_distribution": distribution,
        "fap_half_life": DEFAULT_HALF_LIFE,
        "fap_uniform_mix": DEFAULT_UNIFORM_MIX,
    }
    extra = {**graph.manifest.extra, "workload_metrics": meta}
    manifest: Manifest = dataclasses.replace(graph.manifest, blobs=blobs, extra=extra)
    graph.backend.pipe_file(f"{graph.prefix}/{MANIFEST}", manifest.to_json().encode())
    graph.manifest = manifest
    return {
        **meta,
        "graph": graph.name,
        "psgs_mean": float(arrays["psgs"].mean()),
        "psgs_max": float(arrays["psgs"].max()),
        "fap_mean": float(arrays["fap"].mean()),
        "fap_nonzero": int(np.count_nonzero(arrays["fap"])),
    }


def stored_fanouts(graph: GraphHandle) -> list[int] | None:
    """The fanouts the stored metrics were computed for (``None``: none stored)."""
    meta = graph.manifest.extra.get("workload_metrics")
    if not meta or not graph.has("psgs"):
        return None
    return [int(f) for f in meta["fanouts"]]


def predicted_size(graph: GraphHandle, reader, targets: np.ndarray) -> float | None:
    """``Σ PSGS(t)`` over ``targets`` by one ranged read, or ``None`` without PSGS."""
    if not graph.has("psgs"):
        return None
    t = np.unique(np.asarray(targets, np.int64))
    t = t[(t >= 0) & (t < graph.num_nodes)]
    raw = reader.read(graph.path("psgs"), t * 4, t * 4 + 4)
    return float(raw.view("<f4").sum())
