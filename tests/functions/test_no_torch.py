"""The memory function never loads torch: checked in the processes the platform starts.

``gnn-faas serve memory`` runs as a real subprocess (gunicorn master + worker),
as the local platform starts it. With ``GNN_FAAS_DEBUG_MODULES=1`` the worker
reports ``"torch" in sys.modules`` in ``/v1/stats``; independently, the memory
maps of the master and the worker must not hold a torch library. A plain
``python -c`` importing every memory-side module must not import torch (nor
scikit-learn) either.
"""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import requests

from gnn_faas.functions.client import MemoryClient
from gnn_faas.storage.datasets import ensure_dataset

GNN_FAAS = [str(Path(sys.executable).with_name("gnn-faas"))]
MEMORY_MODULES = [
    "gnn_faas.functions.memory_app",
    "gnn_faas.functions.feature_cache",
    "gnn_faas.functions.peak_predictor",
    "gnn_faas.functions.memory_limit",
    "gnn_faas.wire",
    "gnn_faas.functions.client",
    "gnn_faas.functions.gunicorn_runner",
    "gnn_faas.functions.aggregate",
    "gnn_faas.functions.metrics",
    "gnn_faas.metrics",
    "gnn_faas.logs",
    "gnn_faas.request_id",
    "gnn_faas.http",
    "gnn_faas.cli.serve",
    "gnn_faas.bench.cache",
]


@contextmanager
def instance(argv: list[str], env: dict | None = None, timeout: float = 60.0):
    """Start ``gnn-faas`` + ``argv``; yield ``(proc, base_url)`` once it prints its line."""
    proc = subprocess.Popen(
        [*GNN_FAAS, *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, **(env or {})},
    )
    try:
        ready, _, _ = select.select([proc.stdout], [], [], timeout)
        line = proc.stdout.readline().decode() if ready else ""
        match = re.search(r"listening on (http://[\d.]+:\d+) \(pid (\d+)\)", line)
        assert match, f"no listening line: {line!r} {proc.stderr.read1(4000)!r}"
        assert int(match.group(2)) == proc.pid
        yield proc, match.group(1)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        proc.stdout.close()
        proc.stderr.close()


def wait_ready(base: str, timeout: float = 60.0) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        try:
            if requests.get(base + "/v2/health/ready", timeout=2).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.02)
    raise AssertionError("instance never became ready")


def mapped_files(pid: int) -> set[str]:
    with open(f"/proc/{pid}/maps") as f:
        return {line.split()[-1] for line in f if "/" in line}


def test_memory_modules_import_without_torch():
    code = (
        "import sys\n"
        + "".join(f"import {m}\n" for m in MEMORY_MODULES)
        + "bad = [m for m in ('torch', 'sklearn', 'torch_geometric') if m in sys.modules]\n"
        + "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


@pytest.mark.slow
def test_served_memory_function_has_no_torch_in_any_process(tmp_path):
    store = f"file://{tmp_path}"
    ensure_dataset(store, "bitcoin-otc")
    argv = ["serve", "memory", "--store", store, "--graph", "bitcoin-otc", "--port", "0"]
    with instance(argv, env={"GNN_FAAS_DEBUG_MODULES": "1"}) as (proc, base):
        wait_ready(base)
        client = MemoryClient(base)
        cg = client.graph([1, 2, 3], 2, fanouts=[5, 5])  # serve real work first
        client.features(cg.input_nodes)
        stats = client.stats()
        assert stats["torch_loaded"] is False
        worker = stats["pid"]
        assert worker != proc.pid
        with open(f"/proc/{worker}/stat") as f:  # the worker is a child of our master
            assert int(f.read().rsplit(")", 1)[1].split()[1]) == proc.pid
        for pid in (proc.pid, worker):
            libs = [p for p in mapped_files(pid) if "torch" in p or "sklearn" in p]
            assert not libs, (pid, libs[:3])
        np.testing.assert_array_equal(
            client.features([5]), ensure_dataset(store, "bitcoin-otc").read_blob("features")[[5]]
        )
        client.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0  # a clean shutdown


@pytest.mark.slow
def test_a_memory_function_that_cannot_start_says_why_in_one_line(tmp_path):
    store = f"file://{tmp_path}"
    ensure_dataset(store, "bitcoin-otc")
    proc = subprocess.run(
        [*GNN_FAAS, "serve", "memory", "--store", store, "--graph", "nope", "--port", "0"],
        capture_output=True,
        timeout=60,
    )
    assert proc.returncode == 2
    err = proc.stderr.decode()
    assert "gnn-faas memory function: error: no graph 'nope'" in err
    assert "Traceback" not in err
