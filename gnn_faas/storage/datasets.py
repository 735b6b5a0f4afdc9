"""Named datasets: where they come from and how they become store graphs.

``DATASETS`` maps a name to a :class:`Dataset`; ``prepare_dataset`` writes it
into a store under its name and :func:`ensure_dataset` does so only when the
store lacks it (what ``make run``, tests and benchmarks call).

- ``bitcoin-otc`` (bundled; λGrapher): SNAP's who-trusts-whom network. Edge
  ``u -> v`` means ``u`` rated ``v``, kept directed as given, so a user
  aggregates from the users who rated them. Random N(0, 1) features of
  dimension 128 (λGrapher) with a fixed seed. Label 1 where the user's mean
  *received* rating is negative (an untrusted user), else 0 (also for users
  nobody rated); 2 classes. Request order: the rated users (``dst``) in time
  order of the ratings.
- ``cora`` (bundled): the LINQS citation graph, symmetrised as the GNN
  literature uses it (5,278 undirected edges, 10,556 CSR entries), with its
  bag-of-words features and 7 classes. No request order. ``node_ids`` are the
  LINQS paper ids.
- ``higgs-retweet`` (``--from`` the shared datasets; FaaS-GNN): the Higgs
  Twitter retweet network, edge ``u -> v`` for "u retweeted v", kept directed.
  Random features of dimension 300 (FaaS-GNN). Request order: the target users
  of the activity events (retweets, mentions, replies) in time order,
  restricted to users of the retweet graph.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gnn_faas.errors import BlobNotFound, InvalidRequest, NotFound
from gnn_faas.paths import BUNDLED_DATA, shared_datasets_dir
from gnn_faas.storage.backends import StorageBackend, open_backend
from gnn_faas.storage.format import GraphHandle, Manifest, open_graph
from gnn_faas.storage.ingest import (
    CSRGraph,
    build_csr,
    random_features,
    renumbered,
    write_csr,
)


@dataclass(frozen=True)
class PreparedGraph:
    """A dataset as arrays in local id order, ready for :func:`write_csr`."""

    graph: CSRGraph
    features: np.ndarray
    labels: np.ndarray | None = None
    num_classes: int = 0
    request_order: np.ndarray | None = None
    extra: dict[str, Any] | None = None


@dataclass(frozen=True)
class Dataset:
    """A named dataset. ``files`` are the source files, looked up in the
    bundled data directory (``bundled``) or in ``--from DIR`` (default: the
    shared datasets beside the repository)."""

    name: str
    description: str
    source: str
    bundled: bool
    files: tuple[str, ...]
    feature_dim: int
    build: Callable[[dict[str, Path], int, int], PreparedGraph]


def _load(path: Path) -> np.lib.npyio.NpzFile:
    try:
        return np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise NotFound(f"dataset file not found: {path}") from None
    except (ValueError, OSError) as exc:
        raise InvalidRequest(f"{path}: not a readable .npz ({exc})") from None


def _need(z: np.lib.npyio.NpzFile, path: Path, *keys: str) -> list[np.ndarray]:
    missing = [k for k in keys if k not in z.files]
    if missing:
        raise InvalidRequest(f"{path}: missing arrays {', '.join(missing)}")
    return [z[k] for k in keys]


def _local_ids(node_ids: np.ndarray, original: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(local ids, mask)`` of the entries of ``original`` present in sorted ``node_ids``."""
    pos = np.searchsorted(node_ids, original)
    pos[pos == node_ids.size] = 0
    found = node_ids[pos] == original
    return pos[found], found


def _build_bitcoin(paths: dict[str, Path], dim: int, seed: int) -> PreparedGraph:
    path = paths["bitcoin_otc.npz"]
    with _load(path) as z:
        src, dst, rating, when = _need(z, path, "src", "dst", "rating", "time")
    graph = build_csr(src, dst)
    n = graph.num_nodes
    dst_local, _ = _local_ids(graph.node_ids, dst.astype(np.int64))
    # mean received rating < 0  <=>  sum < 0 (the count is positive where defined)
    received = np.bincount(dst_local, weights=rating.astype(np.float64), minlength=n)
    labels = (received < 0).astype(np.int64)
    order = np.argsort(when, kind="stable")
    return PreparedGraph(
        graph=graph,
        features=random_features(n, dim, seed),
        labels=labels,
        num_classes=2,
        request_order=dst_local[order],
        extra={"features": f"random normal, seed {seed}", "label": "mean received rating < 0"},
    )


def _build_cora(paths: dict[str, Path], dim: int, seed: int) -> PreparedGraph:
    path = paths["cora.npz"]
    with _load(path) as z:
        src, dst, feat, label = _need(z, path, "src", "dst", "feat", "label")
        paper_id = z["paper_id"] if "paper_id" in z.files else None
    graph = build_csr(src, dst, num_nodes=feat.shape[0], node_ids=paper_id, symmetrize=True)
    return PreparedGraph(
        graph=graph,
        features=feat.astype(np.float32),
        labels=label.astype(np.int64),
        num_classes=int(label.max()) + 1,
        extra={"features": "bag of words", "node_ids": "LINQS paper ids"},
    )


def _build_higgs(paths: dict[str, Path], dim: int, seed: int) -> PreparedGraph:
    net, act = paths["higgs_interactions.npz"], paths["higgs_activity.npz"]
    with _load(net) as z:
        src, dst = _need(z, net, "retweet_src", "retweet_dst")
    graph = build_csr(src, dst)
    with _load(act) as z:
        target, when = _need(z, act, "dst", "time")
    order = np.argsort(when, kind="stable")
    request_order, _ = _local_ids(graph.node_ids, target[order].astype(np.int64))
    return PreparedGraph(
        graph=graph,
        features=random_features(graph.num_nodes, dim, seed),
        request_order=request_order,
        extra={"features": f"random normal, seed {seed}"},
    )


DATASETS: dict[str, Dataset] = {
    d.name: d
    for d in (
        Dataset(
            name="bitcoin-otc",
            description="Bitcoin OTC trust network; label: mean received rating < 0",
            source="SNAP soc-sign-bitcoin-otc (gnn_faas/data/bitcoin_otc.npz)",
            bundled=True,
            files=("bitcoin_otc.npz",),
            feature_dim=128,
            build=_build_bitcoin,
        ),
        Dataset(
            name="cora",
            description="Cora citation graph, symmetrised; bag-of-words features, 7 classes",
            source="LINQS Cora (gnn_faas/data/cora.npz)",
            bundled=True,
            files=("cora.npz",),
            feature_dim=1433,
            build=_build_cora,
        ),
        Dataset(
            name="higgs-retweet",
            description="Higgs Twitter retweet network; requests: activity targets by time",
            source="SNAP higgs-twitter (--from DIR: higgs_interactions.npz, higgs_activity.npz)",
            bundled=False,
            files=("higgs_interactions.npz", "higgs_activity.npz"),
            feature_dim=300,
            build=_build_higgs,
        ),
    )
}


def get_dataset(name: str) -> Dataset:
    try:
        return DATASETS[name]
    except KeyError:
        raise NotFound(f"unknown dataset {name!r}; known: {', '.join(DATASETS)}") from None


def source_files(dataset: Dataset, from_path: str | Path | None = None) -> dict[str, Path]:
    """Paths of the dataset's source files. ``from_path`` is a directory holding
    them (or, for a one-file dataset, the file itself); by default bundled
    datasets read the package data and the others the shared datasets."""
    if from_path is None:
        base = BUNDLED_DATA if dataset.bundled else shared_datasets_dir()
    else:
        base = Path(from_path).expanduser()
    if base.is_file() and len(dataset.files) == 1:
        paths = {dataset.files[0]: base}
    else:
        paths = {f: base / f for f in dataset.files}
    for f, p in paths.items():
        if not p.is_file():
            hint = "" if dataset.bundled else " (pass --from DIR holding the shared datasets)"
            raise NotFound(f"dataset {dataset.name!r} needs {f}: no file {p}{hint}")
    return paths


@dataclass(frozen=True)
class PrepareResult:
    manifest: Manifest
    seconds: float


def prepare_dataset(
    store: StorageBackend | str,
    name: str,
    from_path: str | Path | None = None,
    *,
    seed: int = 0,
    feature_dim: int | None = None,
    graph_name: str | None = None,
    reorder: str = "none",
) -> PrepareResult:
    """Build dataset ``name`` and write it to ``store`` as graph ``graph_name``
    (default: the dataset's name), replacing any graph of that name.

    ``reorder`` renumbers the stored vertices as :func:`ingest` does (every
    per-vertex array follows; the request order is mapped to stored ids, as
    the fetchers read it; ``user_ids`` keeps the dataset's ids for requests).

    ``feature_dim`` overrides the dimension of random features (tests use a
    small one); datasets with real features ignore it.
    """
    dataset = get_dataset(name)
    t0 = time.perf_counter()
    paths = source_files(dataset, from_path)
    dim = dataset.feature_dim if feature_dim is None else int(feature_dim)
    prepared = dataset.build(paths, dim, seed)
    graph, features, labels, order = (
        prepared.graph, prepared.features, prepared.labels, prepared.request_order,
    )  # fmt: skip
    extra = {"dataset": dataset.name, "seed": seed, **(prepared.extra or {})}
    user_ids = None
    if reorder != "none":
        graph, user_ids = renumbered(graph, reorder)
        features = features[user_ids]
        labels = None if labels is None else labels[user_ids]
        if order is not None:
            stored = np.empty_like(user_ids)
            stored[user_ids] = np.arange(user_ids.size)
            order = stored[order]
        extra["reorder"] = reorder
    backend = open_backend(store) if isinstance(store, str) else store
    manifest = write_csr(
        backend,
        graph_name or dataset.name,
        graph,
        features,
        labels=labels,
        num_classes=prepared.num_classes,
        request_order=order,
        extra=extra,
        user_ids=user_ids,
    )
    return PrepareResult(manifest, time.perf_counter() - t0)


def ensure_dataset(
    store_uri: StorageBackend | str,
    name: str,
    from_dir: str | Path | None = None,
    verify: str = "size",
) -> GraphHandle:
    """The store's graph ``name``, prepared from the dataset of that name first
    if the store does not hold it yet."""
    backend = open_backend(store_uri) if isinstance(store_uri, str) else store_uri
    try:
        return open_graph(backend, name, verify=verify)
    except BlobNotFound:
        raise  # a graph that lost a blob is damaged, not absent: never overwritten here
    except NotFound:
        if name not in DATASETS:
            raise
    prepare_dataset(backend, name, from_dir)
    return open_graph(backend, name, verify=verify)
