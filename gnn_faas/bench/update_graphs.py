"""The graphs ``gnn-faas bench updates`` serves and the edges it streams into them.

- ``bitcoin-otc``: Bitcoin OTC as of a cut-off quantile of its rating times
  (``bitcoin-otc-cut``, written anew each run: traces/update_stream.py
  :func:`prepare_cut`), and the edges rated after it (``bitcoin-otc-time``);
- ``higgs-twitter-like``: the synthetic graph shaped like SNAP higgs-twitter
  (14.9M edges; generated once, storage/synth.py) and the 563,069 Higgs events
  hashed onto its vertices (``higgs-activity``).

Each run starts from version 0: :func:`reset_versions` removes what earlier
runs left under the graph's prefix (version records, the log, compacted
bases, the deletion list, stored embeddings), keeping the base as written.
:func:`new_edges` keeps, for a stream that is added and removed in turn, each
edge once and only if the base does not hold it, so a removal takes away
exactly what the stream added.
"""

from __future__ import annotations

import numpy as np

from gnn_faas.errors import InvalidRequest, NotFound
from gnn_faas.storage.backends import open_backend
from gnn_faas.storage.datasets import ensure_dataset
from gnn_faas.storage.format import GraphHandle, open_graph
from gnn_faas.traces.update_stream import bitcoin_otc_time, higgs_activity, prepare_cut

GRAPHS = ("bitcoin-otc", "higgs-twitter-like")


def reset_versions(backend, name: str) -> int:
    """Remove everything under ``name/`` but the base as written (top-level
    blobs and manifest); how many keys."""
    gone = [k for k in backend.ls(f"{name}/") if "/" in k[len(name) + 1 :] or k.endswith("gc.json")]
    for key in gone:
        backend.rm(key)
    return len(gone)


def prepare(store: str, graph: str, cutoff: float, seed: int = 0):
    """``(served graph handle, stream edges [m, 2] in time order, stream name)``."""
    backend = open_backend(store)
    if graph == "bitcoin-otc":
        ensure_dataset(backend, "bitcoin-otc")
        cut = "bitcoin-otc" + "-cut"
        reset_versions(backend, cut)
        name = prepare_cut(backend, "bitcoin-otc", cutoff)
        served = open_graph(backend, name)
        s = bitcoin_otc_time(served, cutoff)
        return served, np.stack((s.src, s.dst), axis=1), s.name
    if graph == "higgs-twitter-like":
        reset_versions(backend, graph)
        try:
            served = GraphHandle(backend, graph, prefix=graph)
        except NotFound:
            from gnn_faas.storage.synth import synthesize

            synthesize(backend, "higgs-twitter", seed=seed, name=graph)
            served = GraphHandle(backend, graph, prefix=graph)
        s = higgs_activity(served)
        return served, np.stack((s.src, s.dst), axis=1), s.name
    raise InvalidRequest(f"unknown graph {graph!r}; known: {', '.join(GRAPHS)}")


def base_edges(graph: GraphHandle) -> tuple[np.ndarray, np.ndarray]:
    """``(src, dst)`` of every edge of the base (``dst`` aggregates from ``src``)."""
    ptr = np.asarray(graph.read_blob("indptr"), np.int64)
    dst = np.repeat(np.arange(ptr.size - 1, dtype=np.int64), np.diff(ptr))
    return np.asarray(graph.read_blob("indices"), np.int64), dst


def new_edges(edges: np.ndarray, graph: GraphHandle) -> np.ndarray:
    """``edges`` without repeats (first kept, order kept) and without the ones the
    base holds."""
    n = np.int64(graph.num_nodes)
    keys = edges[:, 1] * n + edges[:, 0]
    _, first = np.unique(keys, return_index=True)
    first.sort()
    edges, keys = edges[first], keys[first]
    src, dst = base_edges(graph)
    held = np.isin(keys, dst * n + src)
    return edges[~held]


def open_versions(backend, name: str, freshness_s: float = 0.0):
    """Graph ``name``'s versions as a writer reads them (every base's structure
    resident: a writer reads every list it changes)."""
    from gnn_faas.storage.fetcher import KHopFetcher
    from gnn_faas.storage.resident import open_structure
    from gnn_faas.storage.versions import GraphVersions

    def open_base(prefix: str):
        graph = GraphHandle(backend, name, prefix=prefix)
        structure = open_structure(graph, 1 << 62)
        return graph, KHopFetcher(graph, structure=structure).base_neighbours

    return GraphVersions(backend, name, open_base, freshness_s=freshness_s)


def matches(backend, name: str, src: np.ndarray, dst: np.ndarray) -> dict:
    """Whether a fresh reader's newest version of ``name`` holds exactly the edges
    ``(src, dst)`` (with multiplicity), and its version."""
    state = open_versions(backend, name).state
    v = np.arange(state.num_nodes, dtype=np.int64)
    counts, nbrs = state.in_lists(v)
    n = np.int64(state.num_nodes)
    got = np.sort(np.repeat(v, counts) * n + nbrs)
    want = np.sort(np.asarray(dst, np.int64) * n + np.asarray(src, np.int64))
    return {
        "version": state.version,
        "num_edges": state.num_edges,
        "equal": bool(np.array_equal(got, want)) and state.num_edges == want.size,
    }
