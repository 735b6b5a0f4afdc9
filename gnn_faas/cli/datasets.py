"""``gnn-faas datasets list``, ``gnn-faas datasets prepare NAME --store URI [--from PATH]``,
``gnn-faas datasets synth --like LIKE [--scale F] [--seed S] [--name NAME] --store URI
[--json]`` (a synthetic graph shaped like a benchmark dataset, see
:mod:`gnn_faas.storage.synth`), ``gnn-faas datasets reorder NAME --store URI --reorder
METHOD [--to URI] [--as NAME]`` (a stored graph renumbered, see
:mod:`gnn_faas.storage.reorder_stored`) and ``gnn-faas datasets metrics NAME --fanouts 10,5`` (Quiver's PSGS and FAP of a
stored graph, see :mod:`gnn_faas.storage.workload_metrics`) and ``gnn-faas datasets
verify --graph NAME --store URI [--add-digests]`` (every blob checked, see
:mod:`gnn_faas.storage.verify`)."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("datasets", help="list or prepare the named datasets")
    cmds = p.add_subparsers(dest="datasets_command", metavar="ACTION", required=True)
    ls = cmds.add_parser("list", help="list the named datasets")
    ls.set_defaults(handler=_list)
    pr = cmds.add_parser("prepare", help="write a named dataset into the graph store")
    pr.add_argument("dataset", metavar="NAME", help="dataset name (see 'datasets list')")
    pr.add_argument("--store", default=None, help="store URI (default: file://./var/store)")
    pr.add_argument(
        "--from",
        dest="from_path",
        metavar="PATH",
        default=None,
        help="directory holding the source files (default: bundled data, or ../shared/datasets)",
    )
    pr.add_argument("--seed", type=int, default=0, help="seed of random features (default: 0)")
    pr.add_argument(
        "--feature-dim",
        type=int,
        default=None,
        help="dimension of random features (default: the dataset's, e.g. 128 for bitcoin-otc)",
    )
    pr.add_argument("--as", dest="graph_name", default=None, help="graph name (default: NAME)")
    pr.add_argument(
        "--reorder",
        choices=("none", "rcm", "bfs", "degree", "community"),
        default="none",
        help="renumber stored vertices as 'ingest --reorder' does (bfs: fewest storage "
        "requests per k-hop fetch on Bitcoin OTC; community: on graphs with communities); "
        "requests keep the dataset's ids",
    )
    pr.add_argument(
        "--metrics",
        metavar="FANOUTS",
        default=None,
        help="also compute PSGS and FAP for these fanouts (e.g. 10,5; 'full')",
    )
    pr.set_defaults(handler=_prepare)
    _register_verify(cmds)
    mt = cmds.add_parser(
        "metrics", help="compute Quiver's PSGS and FAP of a stored graph (blobs psgs, fap)"
    )
    mt.add_argument("graph", metavar="NAME", help="graph name in the store")
    mt.add_argument("--store", default=None, help="store URI (default: file://./var/store)")
    mt.add_argument(
        "--fanouts", required=True, help="per-hop fanouts of the model, e.g. 10,5 ('full': all)"
    )
    mt.add_argument(
        "--distribution",
        choices=("uniform", "request_order"),
        default=None,
        help="request distribution of FAP (default: the graph's request order, else uniform)",
    )
    mt.set_defaults(handler=_metrics)
    sy = cmds.add_parser(
        "synth",
        help="generate a synthetic graph shaped like a benchmark dataset",
        description=(
            "Generate a planted-partition Chung-Lu graph with the vertex count, edge count, "
            "average degree, power-law degrees and feature dimension of LIKE (scaled by F, "
            "average degree kept), random features with a class signal, community labels with a "
            "60/20/20 split and a skewed request order. Streams into the store; the manifest is "
            "published last."
        ),
    )
    sy.add_argument(
        "--like",
        required=True,
        choices=("higgs-twitter", "stackoverflow", "reddit", "products"),
        help="dataset whose shape to imitate",
    )
    sy.add_argument("--scale", type=float, default=1.0, help="fraction of its size (default 1)")
    sy.add_argument("--seed", type=int, default=0, help="seed of everything random (default 0)")
    sy.add_argument("--name", default=None, help="graph name (default: LIKE-like)")
    sy.add_argument("--store", default=None, help="store URI (default: file://./var/store)")
    sy.add_argument("--json", action="store_true", help="print a JSON summary")
    sy.set_defaults(handler=_synth)
    ro = cmds.add_parser(
        "reorder",
        help="renumber a stored graph's vertices (into the same or another store)",
        description=(
            "Write graph NAME of --store renumbered as 'ingest --reorder' does (every per-vertex "
            "blob follows its vertex, the request order is mapped, requests keep the users' ids) "
            "to --to (default: the same store) as --as (default: NAME). Features are copied a "
            "chunk of rows at a time; the manifest is published last."
        ),
    )
    ro.add_argument("graph", metavar="NAME", help="graph name in the store")
    ro.add_argument("--store", default=None, help="store URI (default: file://./var/store)")
    ro.add_argument(
        "--reorder",
        required=True,
        choices=("none", "rcm", "bfs", "degree", "community"),
        help="the order (community: fewest storage requests on graphs with communities)",
    )
    ro.add_argument("--to", default=None, help="destination store URI (default: --store)")
    ro.add_argument("--as", dest="graph_name", default=None, help="graph name (default: NAME)")
    ro.add_argument("--json", action="store_true", help="print a JSON summary")
    ro.set_defaults(handler=_reorder)


def _list(args: argparse.Namespace) -> int:
    from gnn_faas.storage.datasets import DATASETS

    rows = [("NAME", "BUNDLED", "SOURCE", "DESCRIPTION")]
    rows += [
        (d.name, "yes" if d.bundled else "no", d.source, d.description) for d in DATASETS.values()
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r[:3], widths, strict=True)) + "  " + r[3])
    return 0


def _prepare(args: argparse.Namespace) -> int:
    from gnn_faas.paths import default_store
    from gnn_faas.storage.datasets import prepare_dataset

    store = args.store or default_store()
    res = prepare_dataset(
        store,
        args.dataset,
        args.from_path,
        seed=args.seed,
        feature_dim=args.feature_dim,
        graph_name=args.graph_name,
        reorder=args.reorder,
    )
    m = res.manifest
    if args.metrics:
        from gnn_faas.storage.format import open_graph
        from gnn_faas.storage.workload_metrics import compute_and_store

        compute_and_store(open_graph(store, m.name), parse_metric_fanouts(args.metrics))
    order = m.blobs.get("request_order")
    print(
        f"prepared {m.name}: {m.num_nodes} vertices, {m.num_edges} edges, feature dim "
        f"{m.feature_dim}, {m.num_classes} classes, "
        f"{order.shape[0] if order else 0} requests in order, {res.seconds:.2f} s -> {store}"
    )
    return 0


def parse_metric_fanouts(text: str) -> list[int]:
    """``"10,5"`` -> ``[10, 5]``; ``"full"``/``"-1,-1"`` entries mean all neighbours."""
    from gnn_faas.errors import InvalidRequest

    try:
        out = [-1 if x.strip() == "full" else int(x) for x in text.split(",")]
    except ValueError:
        raise InvalidRequest(f"--fanouts must look like 10,5 (or full), not {text!r}") from None
    if not out or any(f == 0 or f < -1 for f in out):
        raise InvalidRequest("--fanouts: each fanout must be >= 1 (or -1 / full)")
    return out


def _register_verify(cmds: argparse._SubParsersAction) -> None:
    vf = cmds.add_parser(
        "verify",
        help="check a stored graph: every blob's size and sha256, its chunk digests, the CSR",
    )
    vf.add_argument("--store", default=None, help="store URI (default: file://./var/store)")
    vf.add_argument("--graph", required=True, help="graph name in the store")
    vf.add_argument(
        "--add-digests",
        action="store_true",
        help="give blobs written before chunk digests existed their digests (after they verify)",
    )
    vf.add_argument("--json", action="store_true", help="print the report as JSON")
    vf.set_defaults(handler=_verify)


def _verify(args: argparse.Namespace) -> int:
    """Exit 0 when every check passes, 1 when one fails (each blob's verdict printed)."""
    import json

    from gnn_faas.paths import default_store
    from gnn_faas.storage.format import open_graph
    from gnn_faas.storage.verify import verify_graph

    graph = open_graph(args.store or default_store(), args.graph, verify="none")
    report = verify_graph(graph, add_digests=args.add_digests)
    if args.json:
        print(json.dumps(report))
    else:
        for key, verdict in report["blobs"].items():
            print(f"{key:<14} {verdict}")
        print(f"{'csr':<14} {report['csr']}")
        if report["digests_added"]:
            print(f"chunk digests added: {', '.join(report['digests_added'])}")
        print(f"graph {graph.name}: {'ok' if report['ok'] else 'CORRUPT'}")
    return 0 if report["ok"] else 1


def _metrics(args: argparse.Namespace) -> int:
    import json

    from gnn_faas.paths import default_store
    from gnn_faas.storage.format import open_graph
    from gnn_faas.storage.workload_metrics import compute_and_store

    graph = open_graph(args.store or default_store(), args.graph)
    summary = compute_and_store(graph, parse_metric_fanouts(args.fanouts), args.distribution)
    print(json.dumps(summary))
    return 0


def _synth(args: argparse.Namespace) -> int:
    import json
    import signal
    import sys

    from gnn_faas.paths import default_store
    from gnn_faas.storage.synth import synthesize

    def _terminated(signum, frame):  # SIGTERM unwinds like Ctrl-C: staged blobs are removed
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _terminated)
    store = args.store or default_store()
    res = synthesize(
        store,
        args.like,
        scale=args.scale,
        seed=args.seed,
        name=args.name,
        progress=sys.stderr.isatty(),
    )
    if args.json:
        print(json.dumps(res.summary()))
    else:
        m = res.manifest
        print(
            f"generated {m.name}: {m.num_nodes} vertices, {m.num_edges} edges, feature dim "
            f"{m.feature_dim}, {m.num_classes} classes, {res.bytes / 2**20:.0f} MiB in "
            f"{res.wall_s:.1f} s (peak RSS {res.peak_rss_mib:.0f} MiB) -> {store}"
        )
    return 0


def _reorder(args: argparse.Namespace) -> int:
    import json
    import signal

    from gnn_faas.paths import default_store
    from gnn_faas.storage.format import open_graph
    from gnn_faas.storage.reorder_stored import reorder_stored

    def _terminated(signum, frame):  # SIGTERM unwinds like Ctrl-C: staged blobs are removed
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _terminated)
    store = args.store or default_store()
    dest = args.to or store
    res = reorder_stored(open_graph(store, args.graph), dest, args.reorder, args.graph_name)
    m = res.manifest
    if args.json:
        summary = {
            "graph": m.name,
            "reorder": args.reorder,
            "vertices": m.num_nodes,
            "edges": m.num_edges,
            "order_s": res.order_seconds,
            "wall_s": res.seconds,
            "bytes": sum(b.nbytes for b in m.blobs.values()),
        }
        print(json.dumps(summary))
    else:
        print(
            f"reordered {args.graph} ({args.reorder}): {m.num_nodes} vertices, {m.num_edges} "
            f"edges, order {res.order_seconds:.1f} s, {res.seconds:.1f} s in all -> {dest} "
            f"as {m.name}"
        )
    return 0
