"""One function instance started as the platform starts it, for the cold-start benchmarks.

:func:`cold_start` spawns ``gnn-faas serve ...`` on a port, polls
``/v2/health/ready`` every 5 ms, measures the process tree's memory once ready
(after 0.5 s to settle) and stops it with SIGTERM; :func:`default_model` writes
the seeded, untrained checkpoint the benchmarks start compute functions with.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from gnn_faas.errors import Unavailable
from gnn_faas.functions.checkpoint import save_checkpoint
from gnn_faas.functions.model_config import ModelConfig
from gnn_faas.functions.pyg_models import build_model
from gnn_faas.health import probe_ready
from gnn_faas.stack_memory import tree_memory
from gnn_faas.storage.format import open_graph


def gnn_faas_command() -> list[str]:
    """How the platform runs ``gnn-faas``: the console script beside this Python."""
    script = Path(sys.executable).with_name("gnn-faas")
    if script.is_file():
        return [str(script)]
    found = shutil.which("gnn-faas")
    if found:
        return [found]
    return [sys.executable, "-c", "import sys; from gnn_faas.cli import main; sys.exit(main())"]


def cold_start(argv: list[str], port: int, timeout: float) -> dict[str, float]:
    """Start ``gnn-faas`` with ``argv``, wait for ready, measure, stop."""
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


def default_model(out_dir: str, store: str, graph_name: str, hidden_dim: int = 16) -> str:
    """A seeded, untrained 2-layer GCN checkpoint for ``graph_name``."""
    g = open_graph(store, graph_name)
    classes = max(2, int(g.manifest.num_classes))
    cfg = ModelConfig(
        arch="gcn",
        in_dim=int(g.manifest.feature_dim),
        hidden_dim=hidden_dim,
        out_dim=classes,
        num_layers=2,
        graph=graph_name,
        num_classes=classes,
    )
    model = build_model(cfg, seed=0)
    save_checkpoint(out_dir, cfg, model.state_dict())
    return out_dir
