"""``gnn-faas precompute --model M``: store every vertex's layer embeddings (SRPE).

``M`` is a model served by the serving config (``--config``, default the
embedded one: its checkpoint, graph and store) or a checkpoint directory (then
``--graph`` and ``--store`` say where). Writes ``p^(l)`` for ``1 <= l <= L-1``
under ``GRAPH/embeddings/NAME/`` tied to the checkpoint's sha256 (see
:mod:`gnn_faas.storage.embeddings`); serving with ``embeddings: precomputed``
refuses a set computed for another checkpoint or graph version.
"""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "precompute",
        help="precompute every vertex's layer embeddings for precomputed serving (SRPE)",
        description=__doc__.split("\n\n", 1)[1].replace("``", ""),
    )
    p.add_argument("--model", required=True, help="served model name, or a checkpoint directory")
    p.add_argument("--config", default=None, help="serving config YAML (default: embedded)")
    p.add_argument("--graph", default=None, help="graph name (checkpoint directory only)")
    p.add_argument("--store", default=None, help="store URI (checkpoint directory only)")
    p.add_argument(
        "--name", default=None, help="name of the embedding set (default: the model's name)"
    )
    p.add_argument(
        "--refresh",
        action="store_true",
        help="a graph that changed since: fold its log first (gnn-faas graph compact), then "
        "recompute every embedding, which clears the stale marks",
    )
    p.add_argument(
        "--if-stale-share",
        type=float,
        default=None,
        metavar="F",
        help="with --refresh: do nothing unless at least this share of the vertices is stale "
        "(a scheduled job's condition)",
    )
    p.set_defaults(handler=_precompute)


def resolve_model(args: argparse.Namespace) -> tuple[str, str, str, str]:
    """``(checkpoint dir, store, graph, name)`` of ``--model``."""
    from pathlib import Path

    from gnn_faas.config import load_config
    from gnn_faas.errors import InvalidRequest
    from gnn_faas.paths import default_store

    path = Path(args.model)
    if (path / "config.json").is_file():
        if not args.graph:
            from gnn_faas.functions.checkpoint import load_config as load_model_config

            args.graph = load_model_config(path).graph or None
        if not args.graph:
            raise InvalidRequest("--graph is needed with a checkpoint directory")
        return str(path), args.store or default_store(), args.graph, args.name or path.name
    serving = load_config(args.config)
    try:
        m = serving.model(args.model)
    except KeyError:
        names = ", ".join(x.name for x in serving.models)
        raise InvalidRequest(
            f"--model {args.model!r} is neither a checkpoint directory nor a served model ({names})"
        ) from None
    ckpt = serving.checkpoint_dir(m)
    if not (ckpt / "config.json").is_file():
        raise InvalidRequest(f"model {m.name!r} has no checkpoint at {ckpt}: train it first")
    return str(ckpt), args.store or serving.store, m.graph, args.name or m.name


def _precompute(args: argparse.Namespace) -> int:
    import json
    import time

    from gnn_faas.functions.precompute import precompute
    from gnn_faas.storage.format import open_graph

    ckpt, store, graph_name, name = resolve_model(args)
    t0 = time.perf_counter()
    if args.refresh:
        skipped = _refresh_first(store, graph_name, name, args.if_stale_share)
        if skipped is not None:
            print(json.dumps(skipped))
            return 0
    manifest = precompute(open_graph(store, graph_name), ckpt, name)
    summary = {
        "model": name,
        "graph": graph_name,
        "checkpoint_sha256": manifest["checkpoint_sha256"],
        "layers": {k: v["shape"] for k, v in manifest["layers"].items()},
        "states": {k: v["shape"] for k, v in manifest.get("states", {}).items()},
        "seconds": round(time.perf_counter() - t0, 3),
    }
    print(json.dumps(summary))
    return 0


def _refresh_first(store: str, graph_name: str, name: str, min_share: float | None) -> dict | None:
    """Fold the graph's log into its base before recomputing (``None``), or what
    says there is nothing to refresh yet."""
    import json

    from gnn_faas.errors import BlobNotFound
    from gnn_faas.storage.backends import open_backend
    from gnn_faas.storage.compaction import compact
    from gnn_faas.storage.format import open_graph
    from gnn_faas.storage.versions import latest

    backend = open_backend(store)
    if min_share is not None:
        graph = open_graph(backend, graph_name)
        rec = latest(backend, graph_name)
        try:
            m = json.loads(backend.cat_file(f"{graph_name}/embeddings/{name}/manifest.json"))
            marks = len(m.get("stale", []))
        except BlobNotFound:
            marks = graph.num_nodes  # none stored yet: everything to compute
        pending = rec.version > rec.base_version
        share = marks / max(1, graph.num_nodes)
        if share < min_share and not (pending and min_share <= 0):
            return {"model": name, "graph": graph_name, "refreshed": False, "stale_share": share,
                    "log_versions": rec.version - rec.base_version}  # fmt: skip
    compact(backend, graph_name)
    return None
