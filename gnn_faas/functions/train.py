"""Train a reference PyG model on a store graph's vertex labels and write a checkpoint.

Training runs on CPU with :class:`~gnn_faas.functions.pyg_models.PygGNN`
(cross-entropy, Adam with weight decay, dropout between layers):

- full batch for graphs up to ``full_batch_max_nodes`` vertices (Cora,
  Bitcoin OTC): the whole graph is read from the store once;
- sampled mini-batches otherwise (or when ``fanouts`` is given): batches of
  training vertices expanded with our own on-demand :class:`KHopFetcher`
  (per-vertex deterministic sampling, the same sampler serving uses), because
  PyG's ``NeighborLoader`` needs pyg-lib or torch-sparse, which are not
  installed. The sampled subgraph is what PyG sees, exactly as when serving
  with the checkpoint's ``fanouts``.

Splits (seeded, documented, reproducible):

- ``planetoid`` (default for Cora): 20 training vertices per class, then 500
  validation and 1000 test vertices from a seeded permutation of the rest.
  Planetoid's own split is not derivable from the LINQS vertex order, so this is
  a random split of the same shape.
- ``stratified`` (default otherwise, e.g. Bitcoin OTC): 60/20/20 per class;
  the loss weights classes by inverse training frequency (``n / (k n_c)``),
  since Bitcoin OTC's untrusted users are a small minority.

The epoch with the best validation score (accuracy for planetoid, balanced
accuracy for stratified) is kept; test figures are of that epoch's weights.
"""

from __future__ import annotations

import json
import os
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from gnn_faas.errors import InvalidRequest
from gnn_faas.functions.checkpoint import save_checkpoint
from gnn_faas.functions.model_config import ModelConfig
from gnn_faas.functions.pyg_models import build_model, cg_edge_index, full_batch_adjacency
from gnn_faas.paths import default_store, var_dir
from gnn_faas.storage.datasets import ensure_dataset
from gnn_faas.storage.fetcher import KHopFetcher
from gnn_faas.storage.format import GraphHandle

SPLITS = ("planetoid", "stratified")


@dataclass(frozen=True)
class TrainOptions:
    dataset: str
    arch: str = "gcn"
    layers: int = 2
    hidden: int = 16
    epochs: int = 200
    lr: float = 0.01
    weight_decay: float = 5e-4
    dropout: float = 0.5
    heads: int = 1
    aggr: str = "mean"
    seed: int = 0
    store: str = ""
    out: str = ""
    from_dir: str | None = None
    split: str | None = None  # None: planetoid for cora, stratified otherwise
    fanouts: tuple[int, ...] | None = None  # given: sampled mini-batches
    batch_size: int = 512
    full_batch_max_nodes: int = 100_000
    # at most this many vertices of each split part (train, val, test), a seeded
    # sample: a quick model of a graph of millions of vertices (None: all)
    max_split_vertices: int | None = None
    threads: int | None = None  # torch intra-op threads; None: default_threads()


def default_threads() -> int:
    """Half the CPUs, at most 4. These models are small, so intra-op threads
    gain little, while OpenMP threads stall badly when another process holds
    a core: on a shared 2-CPU machine a ReLU over 2708 x 16 took 7 ms with 2
    threads and 8 us with 1."""
    return max(1, min(4, (os.cpu_count() or 2) // 2))


@dataclass(frozen=True)
class Split:
    train: np.ndarray
    val: np.ndarray
    test: np.ndarray
    kind: str


def planetoid_split(
    labels: np.ndarray,
    num_classes: int,
    seed: int,
    per_class: int = 20,
    val: int = 500,
    test: int = 1000,
) -> Split:
    """``per_class`` training vertices per class, then ``val`` and ``test``
    vertices from a seeded permutation of the remaining ones."""
    rng = np.random.default_rng(seed)
    perm = rng.permutation(labels.size)
    # The first per_class vertices of each class in permutation order train.
    by_class = perm[np.argsort(labels[perm], kind="stable")]
    starts = np.searchsorted(labels[by_class], np.arange(num_classes))
    rank = np.arange(by_class.size) - starts[labels[by_class]]
    train = by_class[rank < per_class]
    rest = np.setdiff1d(perm, train, assume_unique=True)
    rest = rest[rng.permutation(rest.size)]
    if rest.size < val + test:
        raise InvalidRequest(f"graph too small for a {per_class}/class, {val}, {test} split")
    return Split(np.sort(train), np.sort(rest[:val]), np.sort(rest[val : val + test]), "planetoid")


def stratified_split(
    labels: np.ndarray, seed: int, fractions: Sequence[float] = (0.6, 0.2, 0.2)
) -> Split:
    """Per class: a seeded permutation cut into train/val/test by ``fractions``."""
    rng = np.random.default_rng(seed)
    parts: list[list[np.ndarray]] = [[], [], []]
    for c in np.unique(labels):  # a loop over classes, not vertices
        idx = rng.permutation(np.flatnonzero(labels == c))
        a = int(round(fractions[0] * idx.size))
        b = a + int(round(fractions[1] * idx.size))
        for part, sl in zip(parts, (idx[:a], idx[a:b], idx[b:])):
            part.append(sl)
    train, val, test = (np.sort(np.concatenate(p)) for p in parts)
    return Split(train, val, test, "stratified")


def accuracy(pred: np.ndarray, y: np.ndarray) -> float:
    return float((pred == y).mean()) if y.size else float("nan")


def balanced_accuracy(pred: np.ndarray, y: np.ndarray, num_classes: int) -> float:
    """Mean over the classes present of the per-class recall."""
    hits = np.bincount(y[pred == y], minlength=num_classes)
    total = np.bincount(y, minlength=num_classes)
    present = total > 0
    return float((hits[present] / total[present]).mean()) if present.any() else float("nan")


def _graph_arrays(g: GraphHandle) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    if not g.has("labels"):
        raise InvalidRequest(f"graph {g.name!r} has no labels: cannot train a vertex classifier")
    indptr = g.read_blob("indptr").astype(np.int64)
    indices = g.read_blob("indices").astype(np.int64)
    feats = np.array(g.read_blob("features"), dtype=np.float32)  # writable copy for torch
    labels = g.read_blob("labels").astype(np.int64)
    return indptr, indices, feats, labels


def _labels(g: GraphHandle) -> np.ndarray:
    if not g.has("labels"):
        raise InvalidRequest(f"graph {g.name!r} has no labels: cannot train a vertex classifier")
    return g.read_blob("labels").astype(np.int64)


def limit_split(split: Split, max_vertices: int | None, seed: int) -> Split:
    """Each part of ``split`` cut to a seeded sample of at most ``max_vertices``
    (sorted, so the sample is a subset in the split's order)."""
    if max_vertices is None:
        return split
    rng = np.random.default_rng(seed)

    def cut(ids: np.ndarray) -> np.ndarray:
        if ids.size <= max_vertices:
            return ids
        return np.sort(rng.choice(ids, max_vertices, replace=False))

    return Split(cut(split.train), cut(split.val), cut(split.test), split.kind)


def train(opts: TrainOptions) -> dict:
    """Train, write the checkpoint to ``opts.out`` and return the summary."""
    threads = torch.get_num_threads()
    torch.set_num_threads(opts.threads or default_threads())
    try:
        return _train(opts)
    finally:
        torch.set_num_threads(threads)


def _split(opts: TrainOptions, labels: np.ndarray, num_classes: int) -> Split:
    kind = opts.split or ("planetoid" if opts.dataset == "cora" else "stratified")
    if kind not in SPLITS:
        raise InvalidRequest(f"split must be one of {SPLITS}, got {kind!r}")
    if kind == "planetoid":
        return planetoid_split(labels, num_classes, opts.seed)
    return stratified_split(labels, opts.seed)


def _model_config(
    opts: TrainOptions, g: GraphHandle, in_dim: int, num_classes: int
) -> tuple[ModelConfig, bool]:
    """``(config, mini_batch)``: sampled mini-batches when fanouts are given or the
    graph is too large for full batch (then 10 neighbours per hop by default)."""
    config = ModelConfig(
        arch=opts.arch,
        in_dim=in_dim,
        hidden_dim=opts.hidden,
        out_dim=num_classes,
        num_layers=opts.layers,
        aggr=opts.aggr,
        heads=opts.heads,
        graph=g.name,
        task="vertex",
        num_classes=num_classes,
        fanouts=opts.fanouts,
    )
    mini_batch = opts.fanouts is not None or g.num_nodes > opts.full_batch_max_nodes
    if mini_batch and config.fanouts is None:
        config = ModelConfig(**{**asdict(config), "fanouts": (10,) * opts.layers})
    return config, mini_batch


def _class_weight(split: Split, labels: np.ndarray, num_classes: int) -> torch.Tensor | None:
    """Inverse training frequency ``n / (k n_c)`` for the stratified split."""
    if split.kind != "stratified":
        return None
    counts = np.bincount(labels[split.train], minlength=num_classes).astype(np.float64)
    w = split.train.size / (num_classes * np.maximum(counts, 1))
    return torch.tensor(w, dtype=torch.float32)


StepFns = tuple[Callable[[], float], Callable[[], np.ndarray]]


def _full_batch(opts, g, model, optim, arrays, split, class_weight) -> StepFns:
    """``(epoch_step, predict)`` over the whole graph, read once."""
    indptr, indices, feats, labels = arrays
    x, y = torch.from_numpy(feats), torch.from_numpy(labels)
    ei = full_batch_adjacency(opts.arch, indptr, indices, g.num_nodes)
    train_idx = torch.from_numpy(split.train)

    def epoch_step() -> float:
        model.train()
        optim.zero_grad()
        logits = model(x, ei)
        loss = torch.nn.functional.cross_entropy(
            logits[train_idx], y[train_idx], weight=class_weight
        )
        loss.backward()
        optim.step()
        return float(loss.detach())

    def predict() -> np.ndarray:
        model.eval()
        with torch.no_grad():
            return model(x, ei).argmax(-1).numpy()

    return epoch_step, predict


def _mini_batch(opts, g, model, optim, labels, split, class_weight, fanouts) -> StepFns:
    """``(epoch_step, predict)`` on batches expanded by the serving sampler.
    A batch's input rows are read from the store as serving reads them, so
    memory follows the batch, not the graph (5.3 GB of features at
    stackoverflow scale are never loaded whole)."""
    fetcher = KHopFetcher(g)
    rng = np.random.default_rng(opts.seed)
    epoch_no = [0]

    def batch_logits(ids: np.ndarray, seed: int) -> tuple[torch.Tensor, np.ndarray]:
        cg = fetcher.fetch(ids, opts.layers, fanouts=fanouts, seed=seed)
        rows = fetcher.read_features(cg.input_nodes)
        xb = torch.from_numpy(rows if rows.flags.writeable else rows.copy())
        return model(xb, cg_edge_index(cg))[: cg.layer_sizes[-1]], cg.targets

    def epoch_step() -> float:
        model.train()
        epoch_no[0] += 1
        total = 0.0
        order = rng.permutation(split.train)
        for b in range(0, order.size, opts.batch_size):
            optim.zero_grad()
            logits, tgt = batch_logits(order[b : b + opts.batch_size], epoch_no[0])
            yt = torch.from_numpy(labels[tgt])
            loss = torch.nn.functional.cross_entropy(logits, yt, weight=class_weight)
            loss.backward()
            optim.step()
            total += float(loss.detach()) * tgt.size
        return total / max(order.size, 1)

    def predict() -> np.ndarray:
        # Serving's sampler (seed 0), over the vertices that are scored.
        model.eval()
        pred = np.full(labels.size, -1, dtype=np.int64)
        ids = np.concatenate((split.val, split.test))
        with torch.no_grad():
            for b in range(0, ids.size, opts.batch_size):
                logits, tgt = batch_logits(ids[b : b + opts.batch_size], 0)
                pred[tgt] = logits.argmax(-1).numpy()
        return pred

    return epoch_step, predict


def _fit(model, steps: StepFns, score: Callable, split: Split, epochs: int):
    """Train ``epochs`` epochs and keep the weights of the best validation score:
    ``(best epoch, last training loss, predictions of the kept weights)``."""
    epoch_step, predict = steps
    best = (-1.0, 0, None)
    loss = float("nan")
    with warnings.catch_warnings():
        # torch's notes about its (beta) sparse CSR tensors, raised inside PyG
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
        warnings.filterwarnings("ignore", message="Sparse invariant checks are implicitly")
        for epoch in range(1, epochs + 1):
            loss = epoch_step()
            val = score(predict(), split.val)
            if val > best[0]:
                best = (val, epoch, {k: v.detach().clone() for k, v in model.state_dict().items()})
        model.load_state_dict(best[2])
        return best[1], loss, predict()


def _train(opts: TrainOptions) -> dict:
    t0 = time.perf_counter()
    store = opts.store or default_store()
    out = opts.out or str(var_dir() / "models" / f"{opts.dataset}-{opts.arch}")
    g = ensure_dataset(store, opts.dataset, opts.from_dir)
    labels = _labels(g)
    num_classes = int(g.manifest.num_classes or labels.max() + 1)
    if opts.epochs < 1:
        raise InvalidRequest("epochs must be >= 1")
    if opts.max_split_vertices is not None and opts.max_split_vertices < 1:
        raise InvalidRequest("max_split_vertices must be >= 1")
    split = limit_split(_split(opts, labels, num_classes), opts.max_split_vertices, opts.seed)
    in_dim = int(np.prod(g.info("features").shape[1:], dtype=np.int64))
    config, mini_batch = _model_config(opts, g, in_dim, num_classes)

    torch.manual_seed(opts.seed)
    model = build_model(config, dropout=opts.dropout, cached=not mini_batch)
    optim = torch.optim.Adam(model.parameters(), lr=opts.lr, weight_decay=opts.weight_decay)
    class_weight = _class_weight(split, labels, num_classes)

    def score(pred: np.ndarray, idx: np.ndarray) -> float:
        if split.kind == "planetoid":
            return accuracy(pred[idx], labels[idx])
        return balanced_accuracy(pred[idx], labels[idx], num_classes)

    if mini_batch:
        steps = _mini_batch(opts, g, model, optim, labels, split, class_weight, config.fanouts)
    else:
        steps = _full_batch(opts, g, model, optim, _graph_arrays(g), split, class_weight)
    best_epoch, loss, pred = _fit(model, steps, score, split, opts.epochs)
    figures = {
        "split": split.kind,
        "seed": opts.seed,
        "epochs": opts.epochs,
        "best_epoch": best_epoch,
        "lr": opts.lr,
        "weight_decay": opts.weight_decay,
        "dropout": opts.dropout,
        "training": "mini-batch" if mini_batch else "full-batch",
        "threads": torch.get_num_threads(),
        "num_train": int(split.train.size),
        "num_val": int(split.val.size),
        "num_test": int(split.test.size),
        "class_weights": class_weight is not None,
        "final_train_loss": round(loss, 6),
        "val_accuracy": accuracy(pred[split.val], labels[split.val]),
        "val_balanced_accuracy": balanced_accuracy(pred[split.val], labels[split.val], num_classes),
        "test_accuracy": accuracy(pred[split.test], labels[split.test]),
        "test_balanced_accuracy": balanced_accuracy(
            pred[split.test], labels[split.test], num_classes
        ),
    }
    config = ModelConfig(**{**asdict(config), "extra": figures})
    save_checkpoint(out, config, model.state_dict())
    return {
        "dataset": opts.dataset,
        "graph": g.name,
        "arch": opts.arch,
        "layers": opts.layers,
        "hidden": opts.hidden,
        "out": str(Path(out)),
        **figures,
        "seconds": round(time.perf_counter() - t0, 3),
    }


def summary_line(summary: dict) -> str:
    return json.dumps(summary, sort_keys=True)
