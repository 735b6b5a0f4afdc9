"""``gnn-faas ingest SOURCE --name NAME --store URI``: an edge list into the graph store."""

from __future__ import annotations

import argparse

from gnn_faas.paths import default_store


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "ingest",
        help="ingest an edge list (text, .gz or .npz) into the graph store",
        description=(
            "Ingest a SNAP-style edge list (whitespace, tab or comma separated, '#' comments, "
            "optional header, optionally .gz/.bz2/.xz; extra columns ignored) or an .npz with "
            "src/dst arrays. A line 'u v' is the edge u -> v (v aggregates from u). Original ids "
            "are remapped to 0..n-1 in sorted order and kept as node_ids. Per-vertex .npy files "
            "have one row per vertex in sorted original-id order, or are indexed by original id."
        ),
    )
    p.add_argument("source", metavar="SOURCE", help="edge list file")
    p.add_argument("--name", required=True, help="graph name in the store")
    p.add_argument("--store", default=None, help="store URI (default: file://./var/store)")
    p.add_argument("--symmetrize", action="store_true", help="add reverse edges (implies --dedupe)")
    p.add_argument("--drop-self-loops", action="store_true", help="drop edges u -> u")
    p.add_argument("--dedupe", action="store_true", help="drop duplicate edges")
    feats = p.add_mutually_exclusive_group()
    feats.add_argument("--features", metavar="FILE.npy", help="vertex features [n, dim]")
    feats.add_argument(
        "--random-features",
        metavar="DIM",
        type=int,
        help="standard-normal float32 features of this dimension (default: 16)",
    )
    p.add_argument("--labels", metavar="FILE.npy", help="integer vertex labels [n]")
    p.add_argument("--seed", type=int, default=0, help="seed of random features (default: 0)")
    p.add_argument(
        "--reorder",
        choices=("none", "rcm", "bfs", "degree", "community"),
        default="none",
        help="renumber stored vertices so k-hop neighbourhoods span fewer contiguous ranges "
        "(bfs: fewest on graphs with local neighbourhoods; community: Louvain communities, "
        "fewest on graphs with communities); "
        "requests and answers keep the ids of the graph without renumbering",
    )
    p.add_argument(
        "--metrics",
        metavar="FANOUTS",
        default=None,
        help="also compute Quiver's PSGS and FAP for these fanouts (e.g. 10,5; 'full')",
    )
    p.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    from gnn_faas.cli.datasets import parse_metric_fanouts
    from gnn_faas.storage.ingest import ingest

    store = args.store or default_store()
    # checked before the (possibly long) ingest, not after it
    fanouts = parse_metric_fanouts(args.metrics) if args.metrics else None
    res = ingest(
        args.source,
        store,
        args.name,
        symmetrize=args.symmetrize,
        drop_self_loops=args.drop_self_loops,
        dedupe=args.dedupe,
        features=args.features,
        random_dim=args.random_features,
        labels=args.labels,
        seed=args.seed,
        reorder=args.reorder,
    )
    m, c = res.manifest, res.counts
    metrics = ""
    if fanouts is not None:
        from gnn_faas.storage.format import open_graph
        from gnn_faas.storage.workload_metrics import compute_and_store

        compute_and_store(open_graph(store, m.name), fanouts)
        metrics = f", PSGS and FAP for fanouts {args.metrics}"
    dropped = [
        f"{c[k]} {k.replace('_dropped', '').replace('_', ' ')}"
        for k in sorted(c)
        if k.endswith("_dropped")
    ]
    print(
        f"ingested {m.name}: {m.num_nodes} vertices, {m.num_edges} edges "
        f"(from {c['edges_in']} lines{'; dropped ' + ', '.join(dropped) if dropped else ''}), "
        f"feature dim {m.feature_dim}{metrics}, {res.seconds:.1f} s -> {store}"
    )
    return 0
