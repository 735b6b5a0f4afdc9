"""``gnn-faas bench coldstart``: function instances from process start to ready.

Each function is started the way the platform starts it: a ``gnn-faas serve
memory|compute`` subprocess on a free loopback port. ``*_ready_s`` is the time
from just before the process is spawned to the first 200 of
``/v2/health/ready`` (polled every 5 ms); ``*_rss_mib`` is the resident memory
of the instance's whole process tree (gunicorn master + workers, psutil)
right after it is ready; ``*_pss_mib`` the same with shared pages split
between the processes (what a cgroup charges is close to this);
``*_worker_rss_mib`` the worker alone (the gunicorn master is a small
supervisor). ``--graph`` picks the graph (with ``--store``, any ingested
graph): ``num_nodes`` and ``num_edges`` are reported beside the figures, so
runs on graphs of different sizes show whether an idle instance's memory grows
with the graph (it must not). Each figure
is the median of ``--runs`` cold starts; the instance is stopped with SIGTERM
after each (``*_stop_s``: SIGTERM to exit).

Defaults: the bundled Bitcoin OTC graph in a temporary file store and a
freshly initialised (seeded, untrained: weights do not change the start) 2-layer
GCN checkpoint for it.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from typing import Any

from gnn_faas.bench import coldstart_docker
from gnn_faas.bench.instance_start import cold_start, default_model
from gnn_faas.errors import InvalidRequest
from gnn_faas.ports import free_port
from gnn_faas.storage.datasets import ensure_dataset
from gnn_faas.storage.format import open_graph


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--store", default=None, help="store URI (default: a temporary file store)")
    p.add_argument("--graph", default="bitcoin-otc", help="graph name (default: bitcoin-otc)")
    p.add_argument("--model", default=None, help="checkpoint dir (default: a fresh 2-layer GCN)")
    p.add_argument(
        "--runs", type=int, default=None, help="cold starts per function (median; 3, docker: 5)"
    )
    p.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for ready")
    p.add_argument(
        "--platform",
        choices=("local", "docker"),
        default="local",
        help="docker: containers and processes side by side (bench/coldstart_docker.py)",
    )


def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.platform == "docker":
        return coldstart_docker.run(args)
    args.runs = 3 if args.runs is None else args.runs
    if args.runs < 1:
        raise InvalidRequest("--runs must be >= 1")
    with tempfile.TemporaryDirectory(prefix="gnn-faas-coldstart-") as tmp:
        store = args.store
        if store is None:
            store = f"file://{tmp}/store"
            ensure_dataset(store, args.graph)
        model = args.model or default_model(f"{tmp}/model", store, args.graph)
        roles = {
            "memory": ["serve", "memory", "--store", store, "--graph", args.graph],
            "compute": ["serve", "compute", "--model", model],
        }
        g = open_graph(store, args.graph)
        out: dict[str, Any] = {
            "runs": args.runs,
            "graph": args.graph,
            "num_nodes": g.num_nodes,
            "num_edges": g.num_edges,
        }
        for role, argv in roles.items():
            runs = [cold_start(argv, free_port(), args.timeout) for _ in range(args.runs)]
            med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            out[f"{role}_ready_s"] = med["ready_s"]
            out[f"{role}_rss_mib"] = med["rss"] / 2**20
            out[f"{role}_pss_mib"] = med["pss"] / 2**20
            out[f"{role}_worker_rss_mib"] = med["worker_rss"] / 2**20
            out[f"{role}_stop_s"] = med["stop_s"]
            out[f"{role}_ready_s_runs"] = [r["ready_s"] for r in runs]
        return out
