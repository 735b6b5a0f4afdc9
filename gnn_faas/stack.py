"""Bring a whole gnn-faas stack up as a user would (demo, benchmarks, calibration, tests).

:func:`prepare` makes sure every model's graph and checkpoint exist (what
``gnn-faas up`` does before it serves). :class:`Stack` starts ``gnn-faas up`` as
a subprocess on a free loopback port with a given config, waits until the
gateway is ready (function instances warm), and stops it with SIGTERM (the
gateway stops its instances).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests
import yaml

from gnn_faas.config import ModelServingConfig, ServingConfig
from gnn_faas.errors import GnnFaasError, NotFound, Unavailable
from gnn_faas.health import probe_ready
from gnn_faas.ports import free_port
from gnn_faas.storage.datasets import ensure_dataset
from gnn_faas.storage.format import open_graph


def prepare(config, log=print) -> None:
    """Make sure every model's graph and checkpoint exist (idempotent)."""
    for m in config.models:
        try:
            open_graph(config.store, m.graph)
        except NotFound:
            if not m.dataset:
                raise
            log(f"preparing dataset {m.dataset!r} into {config.store}")
            ensure_dataset(config.store, m.dataset)
        ckpt = config.checkpoint_dir(m)
        if not (Path(ckpt) / "config.json").is_file():
            log(f"training {m.arch} for {m.name!r} into {ckpt} (first start only)")
            cmd = [
                sys.executable, "-m", "gnn_faas", "train",
                "--dataset", m.dataset or m.graph, "--arch", m.arch,
                "--layers", str(m.layers), "--hidden", str(m.hidden),
                "--epochs", str(m.epochs), "--store", config.store, "--out", str(ckpt),
            ]  # fmt: skip
            done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            if done.returncode != 0:
                last = (done.stderr or "").strip().splitlines()[-1:] or ["no message"]
                raise GnnFaasError(
                    f"training {m.arch} for {m.name!r} failed (exit {done.returncode}): {last[0]}"
                )


class Stack:
    """``gnn-faas up`` in a subprocess, as a context manager."""

    def __init__(
        self,
        config: dict,
        ready_timeout_s: float = 180.0,
        log_path: Path | None = None,
        log_level: str = "warning",
        env: dict[str, str] | None = None,
    ):
        self.config = config
        self.log_level = log_level
        self.env = env
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
             "--port", str(self.port), "--log-level", self.log_level],
            stdout=self._log,
            env=None if self.env is None else {**os.environ, **self.env},
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
        tail = self.log_tail()  # before __exit__ removes the log with its directory
        self.__exit__(None, None, None)
        raise Unavailable(f"gateway not ready in {self.ready_timeout_s} s:\n{tail}")

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


def prepared_model(store: str | None, graph: str, arch: str, slo_s: float):
    """``(base config, graph handle, checkpoint dir)`` of one model named after
    its graph, with its dataset and checkpoint prepared as ``gnn-faas up`` does
    (the benchmarks that bring a stack up start from this)."""
    model = ModelServingConfig(name=graph, graph=graph, dataset=graph, arch=arch, slo_s=slo_s)
    base = ServingConfig(store=store or "", models=(model,))
    prepare(base, log=lambda msg: print(msg, file=sys.stderr))  # stdout carries the JSON
    return base, open_graph(base.store, graph), str(base.checkpoint_dir(base.models[0]))
