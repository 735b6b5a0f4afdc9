"""Run a whole gnn-faas stack as a user would, for the demo and the e2e benchmark.

:class:`Stack` starts ``gnn-faas up`` as a subprocess on a free loopback port
with a given config, waits until the gateway is ready (function instances
warm), and stops it with SIGTERM (the gateway stops its instances).
:func:`summarise` turns a replay into the figures the benchmark reports.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import requests
import yaml

from gnn_faas.errors import Unavailable
from gnn_faas.health import probe_ready
from gnn_faas.traces.replay import ReplayResult


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Stack:
    """``gnn-faas up`` in a subprocess, as a context manager."""

    def __init__(self, config: dict, ready_timeout_s: float = 180.0, log_path: Path | None = None):
        self.config = config
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.ready_timeout_s = ready_timeout_s
        self._dir = tempfile.TemporaryDirectory(prefix="gnn-faas-stack-")
        self.log_path = log_path or Path(self._dir.name) / "gateway.log"
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> Stack:
        cfg_path = Path(self._dir.name) / "config.yaml"
        cfg_path.write_text(yaml.safe_dump(self.config))
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gnn_faas", "up", "--config", str(cfg_path),
             "--port", str(self.port), "--log-level", "warning"],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise Unavailable(f"gateway exited during start-up:\n{self.log_tail()}")
            if probe_ready(self.url):
                return self
            time.sleep(0.2)
        self.__exit__(None, None, None)
        raise Unavailable(f"gateway not ready in {self.ready_timeout_s} s:\n{self.log_tail()}")

    def status(self, **params) -> dict:
        return requests.get(f"{self.url}/v1/status", params=params, timeout=30).json()

    def log_tail(self, n: int = 30) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-n:])

    def __exit__(self, *exc) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        if hasattr(self, "_log"):
            self._log.close()
        self._dir.cleanup()


def summarise(result: ReplayResult, slo_s: float, metering: dict) -> dict:
    """Latency, SLO, sharing and resource figures of one replay.

    ``sharing_degree``: mean over the closed buffers the replayed requests were
    in; ``aggregated_rows_per_request``: rows aggregated (each buffer's once)
    over requests; GB-s and vCPU-s: metered between the first request and the
    last response, over requests.
    """
    out = result.summary(slo_s)
    executions: dict = {}  # each execution's rows count once, however many it served
    buffers: dict = {}
    for p in result.parameters:
        executions[p.get("execution")] = p.get("aggregated_rows", 0)
        if "buffer_id" in p:
            buffers[(p["buffer_id"], p.get("closed_at"))] = p.get("sharing_degree", 0.0)
    n = max(result.ok, 1)
    sharing = float(np.mean(list(buffers.values()))) if buffers else 0.0
    rows = sum(executions.values())
    out.update(
        sharing_degree=sharing,
        buffers=len(buffers),
        aggregated_rows_per_request=rows / n,
        gb_s_per_request=metering["allocated_gb_s"] / n,
        vcpu_s_per_request=metering["vcpu_s"] / n,
        busy_gb_s_per_request=metering.get("busy_gb_s", 0.0) / n,
        cold_starts=int(metering.get("cold_starts", 0)),
        instances=int(metering.get("instances", 0)),
        breakdown_ms=median_breakdown(result.parameters),
    )
    return out


def median_breakdown(parameters: list[dict]) -> dict:
    """Per step of the answers' ``breakdown_ms`` (a number, or per kind of
    function call ``calls``/``transport_ms``/``serde_ms``/``work_ms``), its
    median over the answers that report it."""
    steps: dict = {}
    for p in parameters:
        for key, value in p.get("breakdown_ms", {}).items():
            if isinstance(value, dict):
                for k, v in value.items():
                    steps.setdefault((key, k), []).append(v)
            else:
                steps.setdefault((key, None), []).append(value)
    out: dict = {}
    for (key, sub), values in sorted(steps.items()):
        m = float(np.median(values))
        if sub is None:
            out[key] = m
        else:
            out.setdefault(key, {})[sub] = m
    return out


def prepared_model(store: str | None, graph: str, arch: str, slo_s: float):
    """``(base config, graph handle, checkpoint dir)`` of one model named after
    its graph, with its dataset and checkpoint prepared as ``gnn-faas up`` does
    (the benchmarks that bring a stack up start from this)."""
    from gnn_faas.cli.up import prepare
    from gnn_faas.config import ModelServingConfig, ServingConfig
    from gnn_faas.storage.format import open_graph

    model = ModelServingConfig(name=graph, graph=graph, dataset=graph, arch=arch, slo_s=slo_s)
    base = ServingConfig(store=store or "", models=(model,))
    prepare(base, log=lambda msg: print(msg, file=sys.stderr))  # stdout carries the JSON
    return base, open_graph(base.store, graph), str(base.checkpoint_dir(base.models[0]))
