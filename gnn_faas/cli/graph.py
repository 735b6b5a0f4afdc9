"""``gnn-faas graph update|show|compact``: a served graph's changes, from the command line.

``gnn-faas graph update --store URI --graph G [--add-edges FILE] [--remove-edges FILE]
[--add-vertices FILE] [--features FILE] [--remove-vertices FILE] [--json]`` commits one
batch as the next version, as ``POST /v2/graphs/G/updates`` does (storage/versions.py),
straight to the store: edge files are text (``u v`` per line) or ``.npy`` ``[m, 2]``;
``--remove-vertices`` a text or ``.npy`` list of ids; ``--add-vertices`` an ``.npz`` with
``features`` ``[k, d]`` and optional ``labels``, ``ids``; ``--features`` an ``.npz`` with
``ids`` and ``features`` (rows to replace). No pickle: ``numpy.load(allow_pickle=False)``.

``gnn-faas graph show --store URI --graph G`` prints the version, counts, the log's size
and the last compaction; ``gnn-faas graph compact --store URI --graph G [--grace-s S]``
folds the log into a new base (storage/compaction.py).
"""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("graph", help="update, show or compact a stored graph's versions")
    cmds = p.add_subparsers(dest="graph_command", metavar="ACTION", required=True)
    up = cmds.add_parser("update", help="commit one batch of changes as the next version")
    _common(up)
    up.add_argument("--add-edges", metavar="FILE", help="edges to add: 'u v' lines or .npy [m, 2]")
    up.add_argument("--remove-edges", metavar="FILE", help="edges to remove (same forms)")
    up.add_argument(
        "--add-vertices", metavar="FILE", help=".npz: features [k, d], optional labels, ids"
    )
    up.add_argument("--features", metavar="FILE", help=".npz: ids and features (rows replaced)")
    up.add_argument("--remove-vertices", metavar="FILE", help="ids: text lines or .npy")
    up.set_defaults(handler=_update)
    show = cmds.add_parser("show", help="the newest version, counts, log size, last compaction")
    _common(show)
    show.set_defaults(handler=_show)
    cp = cmds.add_parser("compact", help="fold the log into a new base (serving goes on)")
    _common(cp)
    cp.add_argument(
        "--grace-s", type=float, default=None,
        help="seconds before superseded blobs are deleted (default: 120, over any deadline)",
    )  # fmt: skip
    cp.set_defaults(handler=_compact)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--store", default=None, help="store URI (default: file://./var/store)")
    p.add_argument("--graph", required=True, help="graph name in the store")
    p.add_argument("--json", action="store_true", help="print JSON")


def _versions(args: argparse.Namespace):
    from gnn_faas.paths import default_store
    from gnn_faas.storage.backends import open_backend
    from gnn_faas.storage.fetcher import KHopFetcher
    from gnn_faas.storage.format import GraphHandle
    from gnn_faas.storage.resident import open_structure
    from gnn_faas.storage.versions import GraphVersions

    backend = open_backend(args.store or default_store())

    def open_base(prefix: str):
        graph = GraphHandle(backend, args.graph, prefix=prefix)
        structure = open_structure(graph, 1 << 62)  # a writer reads every list it changes
        return graph, KHopFetcher(graph, structure=structure).base_neighbours

    return GraphVersions(backend, args.graph, open_base, freshness_s=0)


def _load(path: str, what: str):
    import numpy as np

    from gnn_faas.errors import InvalidRequest

    try:
        if path.endswith((".npy", ".npz")):
            return np.load(path, allow_pickle=False)
        return np.loadtxt(path, dtype=np.int64, ndmin=2 if what == "edges" else 1)
    except (OSError, ValueError) as exc:
        raise InvalidRequest(f"cannot read {what} from {path}: {exc}") from None


def _update(args: argparse.Namespace) -> int:
    import json

    from gnn_faas.errors import InvalidRequest
    from gnn_faas.storage.delta import UpdateBatch

    arrays: dict = {}
    for flag, name in (("add_edges", "add_edges"), ("remove_edges", "remove_edges")):
        if getattr(args, flag):
            arrays[name] = _load(getattr(args, flag), "edges")
    if args.remove_vertices:
        arrays["remove_vertices"] = _load(args.remove_vertices, "ids").reshape(-1)
    for flag, fields in (
        ("add_vertices", {"features": "new_features", "labels": "new_labels", "ids": "new_ids"}),
        ("features", {"ids": "feature_ids", "features": "features"}),
    ):
        path = getattr(args, flag)
        if path:
            z = _load(path, "arrays")
            if not hasattr(z, "files"):
                raise InvalidRequest(f"--{flag.replace('_', '-')} needs an .npz file")
            missing = [k for k in ("features",) if k not in z.files]
            if missing:
                raise InvalidRequest(f"{path} has no {missing[0]!r} array")
            arrays.update({name: z[k] for k, name in fields.items() if k in z.files})
    if not arrays:
        raise InvalidRequest("nothing to update: give --add-edges, --remove-edges, ... ")
    versions = _versions(args)
    rec, delta = versions.commit(UpdateBatch.from_arrays(arrays))
    out = {"graph": args.graph, "version": rec.version, "applied": delta.summary(),
           "new_ids": delta.new_ids.tolist(), "num_nodes": rec.num_nodes,
           "num_edges": rec.num_edges}  # fmt: skip
    print(
        json.dumps(out)
        if args.json
        else f"graph {args.graph}: version {rec.version} {out['applied']}"
    )
    return 0


def _show(args: argparse.Namespace) -> int:
    import json

    versions = _versions(args)
    state, rec = versions.state, versions.record
    base = sum(i.nbytes for i in state.graph.manifest.blobs.values())
    out = {
        "graph": args.graph,
        "version": state.version,
        "base": state.graph.prefix,
        "base_version": state.base_version,
        "num_nodes": state.num_nodes,
        "num_edges": state.num_edges,
        "removed_vertices": int(state.features.removed.size),
        "delta": {
            "segments": rec.num_segments,
            "bytes": rec.delta_bytes,
            "share_of_base": rec.delta_bytes / max(1, base),
        },  # fmt: skip
        "last_compaction": rec.last_compaction,
    }
    if args.json:
        print(json.dumps(out))
    else:
        for key, value in out.items():
            print(f"{key:<18} {value}")
    return 0


def _compact(args: argparse.Namespace) -> int:
    import json

    from gnn_faas.paths import default_store
    from gnn_faas.storage.backends import open_backend
    from gnn_faas.storage.compaction import DEFAULT_GRACE_S, compact

    backend = open_backend(args.store or default_store())
    grace = DEFAULT_GRACE_S if args.grace_s is None else args.grace_s
    out = compact(backend, args.graph, grace_s=grace)
    print(json.dumps(out) if args.json else " ".join(f"{k}={v}" for k, v in out.items()))
    return 0
