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
with the graph (issue 7: it must not). Each figure
is the median of ``--runs`` cold starts; the instance is stopped with SIGTERM
after each (``*_stop_s``: SIGTERM to exit).

Defaults: the bundled Bitcoin OTC graph in a temporary file store and a
freshly initialised (seeded, untrained: weights do not change the start) 2-layer
GCN checkpoint for it.
"""

from __future__ import annotations

import argparse
from typing import Any


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


def gnn_faas_command() -> list[str]:
    """How the platform runs ``gnn-faas``: the console script beside this Python."""
    import shutil
    import sys
    from pathlib import Path

    script = Path(sys.executable).with_name("gnn-faas")
    if script.is_file():
        return [str(script)]
    found = shutil.which("gnn-faas")
    if found:
        return [found]
    return [sys.executable, "-c", "import sys; from gnn_faas.cli import main; sys.exit(main())"]


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tree_memory(pid: int) -> tuple[int, int, int]:
    """``(rss, pss)`` bytes summed over a process and its descendants, and the
    largest RSS of one descendant (the worker)."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0, 0, 0
    rss = pss = worker = 0
    for p in procs:
        try:
            info = p.memory_full_info()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        rss += info.rss
        pss += getattr(info, "pss", info.rss)
        if p.pid != pid:
            worker = max(worker, info.rss)
    return rss, pss, worker


def cold_start(argv: list[str], port: int, timeout: float) -> dict[str, float]:
    """Start ``gnn-faas`` with ``argv``, wait for ready, measure, stop."""
    import signal
    import subprocess
    import time

    from gnn_faas.errors import Unavailable
    from gnn_faas.health import probe_ready

    url = f"http://127.0.0.1:{port}"
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [*gnn_faas_command(), *argv, "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        ready = None
        while time.perf_counter() - t0 < timeout:
            if proc.poll() is not None:
                err = proc.stderr.read().decode(errors="replace").strip().splitlines()
                raise Unavailable(f"instance exited with {proc.returncode}: {err[-1:] or ''}")
            if probe_ready(url, timeout=1.0):
                ready = time.perf_counter() - t0
                break
            time.sleep(0.005)
        if ready is None:
            raise Unavailable(f"instance not ready after {timeout} s")
        time.sleep(0.5)  # let the worker settle: idle memory, not the start's transients
        rss, pss, worker = tree_memory(proc.pid)
        t1 = time.perf_counter()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        return {
            "ready_s": ready,
            "rss": rss,
            "pss": pss,
            "worker_rss": worker,
            "stop_s": time.perf_counter() - t1,
        }
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stderr:
            proc.stderr.close()


def default_model(out_dir: str, store: str, graph_name: str) -> str:
    """A seeded, untrained 2-layer GCN checkpoint for ``graph_name``."""
    from gnn_faas.functions.checkpoint import save_checkpoint
    from gnn_faas.functions.model_config import ModelConfig
    from gnn_faas.functions.pyg_models import build_model
    from gnn_faas.storage.format import open_graph

    g = open_graph(store, graph_name)
    classes = max(2, int(g.manifest.num_classes))
    cfg = ModelConfig(
        arch="gcn",
        in_dim=int(g.manifest.feature_dim),
        hidden_dim=16,
        out_dim=classes,
        num_layers=2,
        graph=graph_name,
        num_classes=classes,
    )
    model = build_model(cfg, seed=0)
    save_checkpoint(out_dir, cfg, model.state_dict())
    return out_dir


def run(args: argparse.Namespace) -> dict[str, Any]:
    import statistics
    import tempfile

    from gnn_faas.errors import InvalidRequest

    if args.platform == "docker":
        from gnn_faas.bench import coldstart_docker

        return coldstart_docker.run(args)
    args.runs = 3 if args.runs is None else args.runs
    if args.runs < 1:
        raise InvalidRequest("--runs must be >= 1")
    with tempfile.TemporaryDirectory(prefix="gnn-faas-coldstart-") as tmp:
        store = args.store
        if store is None:
            from gnn_faas.storage.datasets import ensure_dataset

            store = f"file://{tmp}/store"
            ensure_dataset(store, args.graph)
        model = args.model or default_model(f"{tmp}/model", store, args.graph)
        roles = {
            "memory": ["serve", "memory", "--store", store, "--graph", args.graph],
            "compute": ["serve", "compute", "--model", model],
        }
        from gnn_faas.storage.format import open_graph

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
