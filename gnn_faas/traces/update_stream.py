"""Streams of graph updates in time order, for replays, simulations and benchmarks.

A served graph changes as its source does: Bitcoin OTC's ratings each carry a
time, Higgs' retweets, mentions and replies too. An :class:`UpdateStream` is
such a sequence of added edges ``(src, dst)`` (``dst`` aggregates from
``src``, the store's direction) at times in seconds from its start, in the ids
of the graph it updates:

- ``bitcoin-otc-time``: the Bitcoin OTC edges rated after a cut-off (a
  quantile of the rating times, 0.8 by default). :func:`prepare_cut` writes
  the graph as of that cut-off (every vertex, its features and labels, the
  earlier edges only) so that a study serves the past and streams the rest;
- ``higgs-activity``: the 563,069 time-stamped Higgs events, their user ids
  mapped to the graph's vertices through its ``node_ids`` (a graph prepared
  from Higgs) or, for a synthetic graph shaped like it, by a fixed hash of the
  user id into ``[0, num_nodes)``.

:meth:`UpdateStream.scaled` stretches or squeezes the times to a mean rate, as
the request traces are; :meth:`UpdateStream.batches` cuts the stream into
batches of ``batch`` edges (one version each), each due when its last edge is.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from gnn_faas.errors import InvalidRequest
from gnn_faas.paths import BUNDLED_DATA, shared_datasets_dir
from gnn_faas.storage.format import GraphHandle, write_graph
from gnn_faas.storage.ingest import build_csr

UPDATE_SOURCES = ("bitcoin-otc-time", "higgs-activity")
DEFAULT_CUTOFF = 0.8
CUT_SUFFIX = "-cut"


@dataclass(frozen=True)
class UpdateStream:
    """Added edges at times (seconds from the stream's start, sorted)."""

    name: str
    times: np.ndarray
    src: np.ndarray
    dst: np.ndarray

    @property
    def size(self) -> int:
        return int(self.times.size)

    @property
    def span_s(self) -> float:
        return float(self.times[-1] - self.times[0]) if self.size else 0.0

    def scaled(self, rate: float) -> UpdateStream:
        """The same edges, their times scaled to a mean of ``rate`` edges per second."""
        if rate <= 0:
            raise InvalidRequest("an update rate must be positive")
        if self.size < 2 or self.span_s == 0:
            times = np.arange(self.size, dtype=np.float64) / rate
        else:
            times = (self.times - self.times[0]) * (self.size / self.span_s / rate)
        return UpdateStream(self.name, times, self.src, self.dst)

    def head(self, n: int) -> UpdateStream:
        return UpdateStream(self.name, self.times[:n], self.src[:n], self.dst[:n])

    def batches(self, batch: int) -> Iterator[tuple[float, np.ndarray]]:
        """``(due, edges [m, 2])`` per batch of at most ``batch`` edges, in order."""
        if batch < 1:
            raise InvalidRequest("a batch holds at least one edge")
        for lo in range(0, self.size, batch):  # a loop over batches, not edges
            hi = min(lo + batch, self.size)
            yield float(self.times[hi - 1]), np.stack((self.src[lo:hi], self.dst[lo:hi]), axis=1)


def _bitcoin_edges() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    path = BUNDLED_DATA / "bitcoin_otc.npz"
    if not path.is_file():
        path = shared_datasets_dir() / "bitcoin_otc.npz"
    with np.load(path, allow_pickle=False) as z:
        return z["src"].astype(np.int64), z["dst"].astype(np.int64), z["time"].astype(np.int64)


def _local(node_ids: np.ndarray, original: np.ndarray) -> np.ndarray:
    order = np.argsort(node_ids)
    pos = np.searchsorted(node_ids, original, sorter=order)
    pos = np.minimum(pos, node_ids.size - 1)
    local = order[pos]
    if not np.array_equal(node_ids[local], original):
        raise InvalidRequest("update stream names vertices the graph does not hold")
    return local


def bitcoin_otc_time(graph: GraphHandle, cutoff: float = DEFAULT_CUTOFF) -> UpdateStream:
    """The Bitcoin OTC edges rated after the ``cutoff`` quantile of times, in
    ``graph``'s ids (a graph prepared from Bitcoin OTC: its ``node_ids``)."""
    if not 0 < cutoff < 1:
        raise InvalidRequest("the cut-off is a quantile in (0, 1)")
    src, dst, when = _bitcoin_edges()
    node_ids = graph.read_blob("node_ids") if graph.has("node_ids") else None
    if node_ids is None:
        raise InvalidRequest(f"graph {graph.name!r} was not prepared from Bitcoin OTC")
    order = np.argsort(when, kind="stable")
    src, dst, when = src[order], dst[order], when[order]
    t_cut = np.quantile(when, cutoff)
    later = when > t_cut
    times = (when[later] - when[later][0]).astype(np.float64) if later.any() else np.zeros(0)
    return UpdateStream(
        "bitcoin-otc-time", times, _local(node_ids, src[later]), _local(node_ids, dst[later])
    )


def prepare_cut(store, name: str = "bitcoin-otc", cutoff: float = DEFAULT_CUTOFF) -> str:
    """Write Bitcoin OTC as of the ``cutoff`` quantile of its rating times as graph
    ``NAME-cut``: every vertex with its features, labels and ids, and the edges
    rated up to the cut-off. The rest is :func:`bitcoin_otc_time`. Its name."""
    from gnn_faas.storage.datasets import ensure_dataset

    full = ensure_dataset(store, name)
    node_ids = full.read_blob("node_ids")
    src, dst, when = _bitcoin_edges()
    keep = when <= np.quantile(when, cutoff)
    csr = build_csr(
        _local(node_ids, src[keep]), _local(node_ids, dst[keep]),
        num_nodes=full.num_nodes, node_ids=node_ids,
    )  # fmt: skip
    cut = name + CUT_SUFFIX
    write_graph(
        full.backend,
        cut,
        indptr=csr.indptr,
        indices=csr.indices,
        features=np.array(full.read_blob("features")),
        symmetrized=False,
        labels=full.read_blob("labels") if full.has("labels") else None,
        node_ids=node_ids,
        request_order=full.read_blob("request_order") if full.has("request_order") else None,
        num_classes=full.manifest.num_classes,
        extra={**full.manifest.extra, "cut": {"source": name, "quantile": cutoff}},
    )
    return cut


def higgs_activity(graph: GraphHandle) -> UpdateStream:
    """The Higgs events as added edges in ``graph``'s ids (see the module docstring)."""
    path = shared_datasets_dir() / "higgs_activity.npz"
    with np.load(path, allow_pickle=False) as z:
        src, dst, when = (z[k].astype(np.int64) for k in ("src", "dst", "time"))
    if graph.has("node_ids") and graph.manifest.extra.get("dataset", "").startswith("higgs"):
        node_ids = graph.read_blob("node_ids")
        known = np.isin(src, node_ids) & np.isin(dst, node_ids)
        src, dst, when = src[known], dst[known], when[known]
        s, d = _local(node_ids, src), _local(node_ids, dst)
    else:  # a graph shaped like Higgs: users hashed onto its vertices, the same every run
        n = np.uint64(graph.num_nodes)
        with np.errstate(over="ignore"):
            s = ((src.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)) % n).astype(np.int64)
            d = ((dst.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)) % n).astype(np.int64)
    order = np.argsort(when, kind="stable")
    times = (when[order] - when[order][0]).astype(np.float64)
    return UpdateStream("higgs-activity", times, s[order], d[order])


def update_stream(name: str, graph: GraphHandle) -> UpdateStream:
    """The update stream ``name`` (:data:`UPDATE_SOURCES`) in ``graph``'s ids."""
    if name == "bitcoin-otc-time":
        return bitcoin_otc_time(graph, float(graph.manifest.extra.get("cut", {}).get(
            "quantile", DEFAULT_CUTOFF)))  # fmt: skip
    if name == "higgs-activity":
        return higgs_activity(graph)
    raise InvalidRequest(f"unknown update stream {name!r}; known: {', '.join(UPDATE_SOURCES)}")
