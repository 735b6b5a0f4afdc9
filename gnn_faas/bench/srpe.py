"""``gnn-faas bench srpe``: precomputed embeddings with selective recomputation (OMEGA).

OMEGA's protocol on any graph of the store (``cora`` is prepared if absent):

1. hold out ``--queries`` vertices (a labelled graph: its test split; else
   frequently requested ones) and store the graph without them as ``NAME-srpe``;
2. the model: trained full-batch on the training vertices (a labelled graph), else
   a seeded untrained one, and accuracy is the agreement with exact serving
   (``accuracy_kind``);
3. ``gnn-faas precompute`` on the reduced graph;
4. serve each held-out vertex alone as a new-vertex request, full neighbourhoods:
   exact, and precomputed at every ``--budgets`` value and ``--policies`` policy,
   a recomputed candidate's layer 1 from its stored state (``--recompute state``)
   or its whole in-neighbourhood (``--recompute full``).

Latency is the in-process request path the functions run, without HTTP (``--live``:
over HTTP against a ``gnn-faas up`` stack, :mod:`gnn_faas.bench.srpe_live`).
Output::

    {"exact": {"accuracy", "p50_ms"},
     "policies": {NAME: {BUDGET: {"accuracy", "p50_ms", "accuracy_drop_points",
                                  "speedup_p50", "rel_error_mean", ...}}}, ...}

with, per setting, ``graph_p50_ms``, ``rows_p50``, ``bytes_p50`` and ``reads_mean``
(where the time goes). The protocol in full: docs/design/bench-srpe.md.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--graph", required=True, help="graph in the store (cora, higgs-retweet, reddit-like, ...)"
    )
    p.add_argument("--store", default=None, help="store URI (default: file://./var/store)")
    p.add_argument("--budgets", default="0,0.01,0.05,0.1,1", help="recompute budgets γ")
    p.add_argument(
        "--policies", default="query_edge_ratio,random,importance", help="recompute policies"
    )
    p.add_argument("--queries", type=int, default=200, help="held-out query vertices")
    p.add_argument("--arch", default="gcn", choices=("gcn", "sage", "gin", "gat"))
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--epochs", type=int, default=200, help="training epochs (labelled graphs)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--repeat", type=int, default=3, help="runs per request; its latency is the fastest"
    )
    p.add_argument(
        "--threads", type=int, default=1, help="torch threads, as one compute worker (default 1)"
    )
    p.add_argument(
        "--recompute",
        choices=("state", "full"),
        default="state",
        help="a recomputed candidate's layer 1: from its stored aggregate state and the "
        "request's changed terms (default, 2-layer sum/mean/max/gin/gcn models; others "
        "fall back to full) or from its whole in-neighbourhood's input rows (full)",
    )
    p.add_argument(
        "--live",
        action="store_true",
        help="serve the requests over HTTP from a gnn-faas up stack (memory and compute "
        "functions) instead of in process: exact, and every budget and policy recomputing "
        "from stored states and from neighbourhoods (gnn_faas/bench/srpe_live.py)",
    )
    p.add_argument("--memory-mb", type=int, default=1024, help="--live: memory function size")
    p.add_argument("--compute-mb", type=int, default=1024, help="--live: compute function size")


def _reduced_graph(graph, keep_mask):
    """CSR of the kept vertices (ids renumbered) and the old->new id map."""
    import numpy as np
    import scipy.sparse as sp

    n = graph.num_nodes
    indptr = graph.read_blob("indptr")
    indices = graph.read_blob("indices").astype(np.int64)
    a = sp.csr_matrix((np.ones(indices.size, np.float32), indices, indptr), shape=(n, n))
    new_id = np.full(n, -1, np.int64)
    new_id[keep_mask] = np.arange(int(keep_mask.sum()))
    sub = a[keep_mask][:, keep_mask].tocsr()
    sub.sort_indices()
    return a, sub, new_id


def _split(graph, labels, seed: int):
    """The graph's stored split (``split.bin``: 0 train, 1 val, 2 test) or the
    planetoid split of its labels."""
    import numpy as np

    from gnn_faas.functions.train import Split, planetoid_split

    if graph.has("split"):
        s = graph.read_blob("split")
        return Split(*(np.flatnonzero(s == k) for k in (0, 1, 2)), "stored")
    return planetoid_split(labels, graph.manifest.num_classes, seed)


def _train(cfg, x, edge_index, labels, train_idx, epochs: int, seed: int):
    import torch

    from gnn_faas.functions.pyg_models import build_model

    model = build_model(cfg, seed=seed)
    opt = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)
    xt, y = torch.from_numpy(x), torch.from_numpy(labels)
    idx = torch.from_numpy(train_idx)
    for _ in range(epochs):
        model.train()
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(xt, edge_index)[idx], y[idx])
        loss.backward()
        opt.step()
    return model.eval()


def _breakdown(sizes: dict) -> dict[str, float]:
    """Where a serving's time goes: ``graph_p50_ms`` builds the computation
    graph (the k-hop fetch, or the SRPE graph), the rest runs the layers;
    ``reads_mean``: batched store reads (round trips) per serving, each with a
    fixed cost whatever its size."""
    import numpy as np

    return {
        "graph_p50_ms": float(np.median(sizes["graph_s"]) * 1e3),
        "rows_p50": float(np.median(sizes["rows"])),
        "bytes_p50": float(np.median(sizes["bytes"])),
        "reads_mean": float(np.mean(sizes["reads"])),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    import shutil

    p = _prepare(args)
    try:
        return _run_live(args, p) if args.live else _run_in_process(args, p)
    finally:
        shutil.rmtree(p.tmp, ignore_errors=True)  # the checkpoint written for precompute


@dataclass(frozen=True)
class _Prepared:
    """Steps 1-2 of the protocol (module doc): the held-out queries, the
    reduced graph and the model's checkpoint (in ``tmp``)."""

    store: str
    graph: Any
    reduced: Any
    held: Any
    keep: Any
    a: Any
    new_id: Any
    feats: Any
    labels: Any
    labelled: bool
    budgets: list
    policies: list
    train_s: float
    tmp: Any
    ckpt: Any

    def request_inputs(self) -> list:
        """Each held-out vertex's features and edges to kept vertices."""
        a, n_red = self.a, self.reduced.num_nodes
        return _request_inputs(
            self.graph, a, a.tocsc(), self.held, self.keep, self.new_id, self.feats, n_red
        )


def _prepare(args: argparse.Namespace) -> _Prepared:
    import tempfile
    import time
    from pathlib import Path

    import numpy as np
    import torch

    from gnn_faas.errors import InvalidRequest
    from gnn_faas.functions.checkpoint import save_checkpoint
    from gnn_faas.paths import default_store
    from gnn_faas.storage.datasets import ensure_dataset
    from gnn_faas.storage.recompute_policy import POLICIES

    torch.set_num_threads(max(1, args.threads))
    budgets = [float(b) for b in args.budgets.split(",")]
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    if any(not 0 <= b <= 1 for b in budgets) or any(p not in POLICIES for p in policies):
        raise InvalidRequest(f"budgets must lie in [0, 1] and policies in {POLICIES}")
    if args.queries < 1 or args.layers < 1:
        raise InvalidRequest("--queries and --layers must be >= 1")
    store = args.store or default_store()
    graph = ensure_dataset(store, args.graph)
    n = graph.num_nodes
    rng = np.random.default_rng(args.seed)
    labelled = graph.has("labels") and graph.manifest.num_classes > 1
    labels, split, held = _held_out(graph, labelled, args.queries, args.seed, rng)
    keep = np.ones(n, bool)
    keep[held] = False
    a, sub, new_id = _reduced_graph(graph, keep)
    feats = np.asarray(graph.read_blob("features"), np.float32)
    reduced = _write_reduced(store, graph, sub, feats, keep, labels if labelled else None)
    cfg = _model_config(args, graph, reduced.name, labelled)
    t0 = time.perf_counter()
    model = _model(args, cfg, labelled, sub, feats, keep, labels, split, new_id)
    train_s = time.perf_counter() - t0
    tmp = Path(tempfile.mkdtemp(prefix="gnn-faas-srpe-"))
    save_checkpoint(tmp / "ckpt", cfg, model.state_dict())
    return _Prepared(store, graph, reduced, held, keep, a, new_id, feats, labels, labelled,
                     budgets, policies, train_s, tmp, tmp / "ckpt")  # fmt: skip


def _run_live(args: argparse.Namespace, p: _Prepared) -> dict[str, Any]:
    """``--live``: the requests served over HTTP (:mod:`gnn_faas.bench.srpe_live`)."""
    from gnn_faas.bench.srpe_live import run_live

    truth = p.labels[p.held] if p.labelled else None
    out = run_live(
        args, p.store, p.reduced, p.ckpt, p.request_inputs(), truth, p.budgets, p.policies
    )
    return {"graph": p.graph.name, "queries": int(p.held.size), "arch": args.arch,
            "layers": args.layers, "train_seconds": p.train_s, **out}  # fmt: skip


def _run_in_process(args: argparse.Namespace, p: _Prepared) -> dict[str, Any]:
    import time

    import numpy as np

    from gnn_faas.functions.checkpoint import checkpoint_sha256
    from gnn_faas.functions.precompute import precompute
    from gnn_faas.functions.srpe_recompute import supports_states
    from gnn_faas.functions.update import UpdateModel
    from gnn_faas.storage.embeddings import EmbeddingStore
    from gnn_faas.storage.fetcher import KHopFetcher
    from gnn_faas.storage.overlay import GraphOverlay

    t0 = time.perf_counter()
    precompute(p.reduced, p.ckpt, "bench")
    precompute_s = time.perf_counter() - t0
    emb = EmbeddingStore.open(p.reduced, "bench", checkpoint_sha256(p.ckpt))
    update = UpdateModel.load(p.ckpt, device="cpu")
    from_state = (
        args.recompute == "state"
        and args.layers == 2
        and supports_states(update.plan.steps[0])
        and emb.has_states(1)
    )

    # each held-out vertex's request: its features and its edges to kept vertices
    n_red = p.reduced.num_nodes
    sym = p.graph.manifest.symmetrized
    requests = [GraphOverlay.build(n_red, f, e, sym) for f, e in p.request_inputs()]
    fetcher = KHopFetcher(p.reduced)
    serving = _Serving(args, fetcher, update, emb, requests, n_red, from_state)

    exact_pred, exact_t, exact_sizes = _serve(serving, "exact")
    truth = p.labels[p.held] if p.labelled else exact_pred

    exact_out = np.stack(exact_sizes["outputs"])

    def acc(pred: np.ndarray) -> float:
        return float((pred == truth).mean())

    out: dict[str, Any] = {
        "graph": p.graph.name,
        "queries": int(p.held.size),
        "arch": args.arch,
        "layers": args.layers,
        "threads": args.threads,
        "neighbourhoods": "full",
        "recompute": "state" if from_state else "full",
        "accuracy_kind": "labels" if p.labelled else "agreement_with_exact",
        "train_seconds": p.train_s,
        "precompute_seconds": precompute_s,
        "exact": _exact_row(acc(exact_pred), exact_t, exact_sizes),
        "policies": {},
    }
    for policy in p.policies:
        row = {}
        for b in p.budgets:
            pred, times, rec = _serve(serving, "srpe", b, policy)
            row[f"{b:g}"] = _policy_row(
                acc(pred), acc(exact_pred), pred, exact_pred, times, exact_t, rec, exact_out
            )
        out["policies"][policy] = row
    return out


def _held_out(graph, labelled: bool, queries: int, seed: int, rng):
    """``(labels, split, held)``: the labels and split of a labelled graph
    (None otherwise) and the held-out query vertices, sorted: test vertices of
    the split, or distinct targets of requests drawn from the real order
    (frequent ones more often)."""
    import numpy as np

    labels = split = None
    if labelled:
        labels = graph.read_blob("labels").astype(np.int64)
        split = _split(graph, labels, seed)
        held = rng.choice(split.test, min(queries, split.test.size), replace=False)
    else:
        order = graph.read_blob("request_order").astype(np.int64)
        drawn = order[rng.permutation(order.size)]
        _, first = np.unique(drawn, return_index=True)
        held = drawn[np.sort(first)][:queries]
    return labels, split, np.sort(held)


def _write_reduced(store: str, graph, sub, feats, keep, labels):
    """The graph without the held-out vertices, written as ``<name>-srpe``."""
    import numpy as np

    from gnn_faas.storage.format import open_graph, write_graph

    name = f"{graph.name}-srpe"
    write_graph(
        store,
        name,
        indptr=sub.indptr.astype(np.int64),
        indices=sub.indices.astype(np.int64),
        features=feats[keep],
        symmetrized=graph.manifest.symmetrized,
        labels=labels[keep] if labels is not None else None,
        num_classes=graph.manifest.num_classes,
    )
    return open_graph(store, name)


def _model_config(args, graph, name: str, labelled: bool):
    """The bench's model on the reduced graph ``name`` (8 classes when unlabelled)."""
    from gnn_faas.functions.model_config import ModelConfig

    num_classes = graph.manifest.num_classes if labelled else 8
    return ModelConfig(
        arch=args.arch,
        in_dim=graph.manifest.feature_dim,
        hidden_dim=args.hidden,
        out_dim=num_classes,
        num_layers=args.layers,
        num_classes=num_classes,
        graph=name,
        heads=2 if args.arch == "gat" else 1,
    )


def _model(args, cfg, labelled: bool, sub, feats, keep, labels, split, new_id):
    """The model trained on the reduced graph's training vertices when it is
    labelled, seeded and untrained otherwise."""
    from gnn_faas.functions.pyg_models import build_model, csr_edge_index

    if labelled:
        ei = csr_edge_index(sub.indptr, sub.indices)
        train_idx = new_id[split.train[keep[split.train]]]
        return _train(cfg, feats[keep], ei, labels[keep], train_idx, args.epochs, args.seed)
    return build_model(cfg, seed=args.seed).eval()


def _request_inputs(graph, a, csc, held, keep, new_id, feats, n_red: int) -> list:
    """Per held-out vertex (a loop over requests): its features ``[1, d]`` and
    its edges ``[m, 2]`` to kept vertices, the vertex as id ``n_red`` (what a
    new-vertex request carries, ``gateway/new_vertices.py``)."""
    import numpy as np

    requests = []
    for q in held:
        ins = a.indices[a.indptr[q] : a.indptr[q + 1]]
        outs = csc.indices[csc.indptr[q] : csc.indptr[q + 1]]
        ins, outs = new_id[ins[keep[ins]]], new_id[outs[keep[outs]]]
        if graph.manifest.symmetrized:
            edges = np.stack((ins, np.full(ins.size, n_red)), axis=1)
        else:
            edges = np.concatenate(
                (
                    np.stack((ins, np.full(ins.size, n_red)), axis=1),
                    np.stack((np.full(outs.size, n_red), outs), axis=1),
                )
            )
        requests.append((feats[q : q + 1], edges.astype(np.int64)))
    return requests


@dataclass(frozen=True)
class _Serving:
    """What serving a request needs: the bench's arguments (layers, repeats),
    the reduced graph's fetcher, the compute model, the stored embeddings, the
    requests and the new vertex's id."""

    args: argparse.Namespace
    fetcher: Any
    update: Any
    emb: Any
    requests: list
    n_red: int
    from_state: bool = False  # recompute candidates from stored layer-1 states


def _serve(s: _Serving, kind: str, budget: float = 0.0, policy: str = "") -> tuple:
    """Every request served ``kind`` (``exact``: the whole k-hop graph;
    ``srpe``: stored embeddings, ``budget`` of the candidates recomputed by
    ``policy``), the fastest of ``--repeat`` runs each: ``(predictions,
    seconds, sizes)``."""
    import time

    import numpy as np

    from gnn_faas.functions.executor import LocalTransport, run_layers
    from gnn_faas.storage.srpe_graph import build_srpe_graph

    args, fetcher, update, emb = s.args, s.fetcher, s.update, s.emb

    def reads() -> int:
        return fetcher.reader.stats.round_trips + emb.reader.stats.round_trips

    def bytes_read() -> int:
        return fetcher.reader.stats.bytes_read + emb.reader.stats.bytes_read

    preds, times = [], []
    sizes = {"recomputed": [], "rows": [], "outputs": [], "graph_s": [], "reads": []}
    sizes["bytes"] = []
    target = np.array([s.n_red])
    for ov in s.requests:
        best, best_graph = float("inf"), 0.0
        for _ in range(max(1, args.repeat)):  # the shared machine's noise: keep the fastest
            reads0, bytes0 = reads(), bytes_read()
            t = time.perf_counter()
            tr = LocalTransport(fetcher, update, overlay=ov)
            if kind == "exact":
                cg = fetcher.fetch(target, args.layers, degrees=True, overlay=ov)
                t_graph = time.perf_counter()
                out = run_layers(update.plan, cg, tr)
            else:
                cg = build_srpe_graph(
                    fetcher, target, args.layers, budget, policy, overlay=ov,
                    from_state=s.from_state,
                )  # fmt: skip
                t_graph = time.perf_counter()
                out = run_layers(update.plan, cg, tr, emb.rows, states=emb.state_rows)
            end = time.perf_counter()
            if end - t < best:
                best, best_graph = end - t, t_graph - t
        times.append(best)
        sizes["graph_s"].append(best_graph)
        sizes["reads"].append(reads() - reads0)  # store round trips of one serving
        sizes["bytes"].append(bytes_read() - bytes0)
        sizes["rows"].append(cg.aggregated_rows())
        if kind != "exact":
            sizes["recomputed"].append(cg.recomputed.size)
        preds.append(int(out[cg.target_index[0]].argmax()))
        sizes["outputs"].append(out[cg.target_index[0]])
    return np.array(preds), times, sizes


def _exact_row(accuracy: float, times: list, sizes: dict) -> dict:
    """Exact serving's figures."""
    import numpy as np

    return {
        "accuracy": accuracy,
        "p50_ms": float(np.median(times) * 1e3),
        "p90_ms": float(np.percentile(times, 90) * 1e3),
        "mean_ms": float(np.mean(times) * 1e3),
        "rows_mean": float(np.mean(sizes["rows"])),
        **_breakdown(sizes),
    }


def _policy_row(
    accuracy: float,
    exact_accuracy: float,
    pred,
    exact_pred,
    times: list,
    exact_t: list,
    rec: dict,
    exact_out,
) -> dict:
    """One policy and budget's figures, beside exact serving's."""
    import numpy as np

    p50 = float(np.median(times) * 1e3)
    exact_p50 = float(np.median(exact_t) * 1e3)
    return {
        "accuracy": accuracy,
        "p50_ms": p50,
        "accuracy_drop_points": 100 * (exact_accuracy - accuracy),
        "agreement_with_exact": float((pred == exact_pred).mean()),
        "rel_error_mean": _rel_error(rec["outputs"], exact_out),
        "p90_ms": float(np.percentile(times, 90) * 1e3),
        "mean_ms": float(np.mean(times) * 1e3),
        "speedup_p50": exact_p50 / p50 if p50 > 0 else None,
        "speedup_mean": float(np.mean(exact_t) / np.mean(times)),
        "recomputed_mean": float(np.mean(rec["recomputed"])),
        "rows_mean": float(np.mean(rec["rows"])),
        **_breakdown(rec),
    }


def _rel_error(outputs: list, exact_out) -> float:
    """Mean ``||out - exact|| / ||exact||`` of the answers (scores)."""
    import numpy as np

    diff = np.linalg.norm(np.stack(outputs) - exact_out, axis=1)
    return float(np.mean(diff / np.maximum(np.linalg.norm(exact_out, axis=1), 1e-12)))
