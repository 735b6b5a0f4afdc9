"""``gnn-faas datasets list`` and ``gnn-faas datasets prepare NAME --store URI [--from PATH]``."""

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
    pr.set_defaults(handler=_prepare)


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
    from gnn_faas.cli.ingest import default_store
    from gnn_faas.storage.datasets import prepare_dataset

    store = args.store or default_store()
    res = prepare_dataset(
        store,
        args.dataset,
        args.from_path,
        seed=args.seed,
        feature_dim=args.feature_dim,
        graph_name=args.graph_name,
    )
    m = res.manifest
    order = m.blobs.get("request_order")
    print(
        f"prepared {m.name}: {m.num_nodes} vertices, {m.num_edges} edges, feature dim "
        f"{m.feature_dim}, {m.num_classes} classes, "
        f"{order.shape[0] if order else 0} requests in order, {res.seconds:.2f} s -> {store}"
    )
    return 0
