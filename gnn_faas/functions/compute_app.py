"""The compute function: Update stages of one model over HTTP (torch).

It loads only the checkpoint's layer weights (no graph) onto the device that
``device`` (``auto``: CUDA when visible; ``cpu``; ``cuda[:N]``; see
:mod:`gnn_faas.functions.device`) selects, in the worker after the fork (the
gunicorn master never imports torch, so no CUDA context crosses a fork). The
weights stay resident on the device; each request's batch is moved there once
and its answer back once (``/v1/stats`` ``transfers``). On the CPU it runs
``GNN_FAAS_THREADS`` intra-op threads per worker (default: cores / workers).

Endpoints (frames are ``application/x-gnn-faas-frame``):

- ``GET /v2/health/live``, ``GET /v2/health/ready``;
- ``GET /v1/model`` -> ``{"config": <config.json>, "device", "threads", "plan"}``;
- ``POST /v1/update`` params ``{"layer": l, "stage": "pre"|"post"}``: ``pre``
  takes ``h`` and answers ``h`` (gat also ``alpha_src``, ``alpha_dst``);
  ``post`` takes ``agg`` (+ ``root`` for sage) and answers ``h``; with
  ``"pre_next": true`` it runs layer ``l + 1``'s ``pre`` on that ``h`` too
  and answers what ``pre`` does (one call instead of two: ``pre`` is row-wise);
- ``POST /v1/head`` params ``{"kind": "edge"|"graph"}``: edge takes ``h_u``,
  ``h_v`` and answers ``score``; graph takes ``h`` and ``segments`` (int64)
  and answers ``readout``;
- ``GET /v1/stats``; ``GET /metrics`` (Prometheus text, :mod:`gnn_faas.functions.metrics`).

Bad input is a 4xx JSON error; the instance keeps serving.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import asdict
from typing import Any

import numpy as np
from flask import Flask, jsonify

from gnn_faas.errors import InvalidRequest
from gnn_faas.functions.metrics import compute_families, install_metrics
from gnn_faas.http import frame_route, install, loop_route
from gnn_faas.wire import DEFAULT_MAX_BYTES, params_get, require

log = logging.getLogger("gnn_faas.compute")


def default_threads(workers: int = 1) -> int:
    """``GNN_FAAS_THREADS`` if set, else the cores this process may use / workers."""
    env = os.environ.get("GNN_FAAS_THREADS")
    if env:
        try:
            return max(1, int(env))
        except ValueError:
            raise InvalidRequest(f"GNN_FAAS_THREADS must be an integer, got {env!r}") from None
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cores = os.cpu_count() or 1
    return max(1, cores // max(1, workers))


def set_torch_threads(threads: int) -> None:
    """Intra-op threads of this process (call in the worker, after the fork)."""
    import torch

    torch.set_num_threads(int(threads))


def _writable(a: np.ndarray) -> np.ndarray:
    # frame tensors are read-only views of the body; torch.from_numpy wants writable memory
    return a if a.flags.writeable else np.array(a)


def create_compute_app(
    model_dir: str,
    device: str | None = None,
    threads: int | None = None,
    max_body_bytes: int = DEFAULT_MAX_BYTES,
) -> Flask:
    """The compute function's Flask app (loads the checkpoint now)."""
    from gnn_faas.functions.update import UpdateModel  # torch: only the compute side

    n_threads = default_threads() if threads is None else int(threads)
    set_torch_threads(n_threads)
    model = UpdateModel.load(model_dir, device)
    # torch ops release the GIL, but one model run at a time keeps per-worker
    # thread counts meaningful and memory bounded
    run_lock = threading.Lock()
    counts = {"pre": 0, "post": 0, "edge": 0, "graph": 0}
    app = install(Flask("gnn_faas.compute"), max_content_length=max_body_bytes)
    timer = app.extensions["gnn_faas_timer"]
    config = model.config
    plan = [asdict(s) for s in model.plan.steps]
    install_metrics(app, lambda: compute_families(counts, model.transfers.as_dict()))
    log.info(
        "compute function ready: %s model on %s",
        config.arch,
        model.device,
        extra={"model": model_dir, "device": str(model.device), "threads": n_threads},
    )

    # answered on the server's event loop: liveness never waits for a thread
    loop_route(app, "/v2/health/live", lambda: (200, {"live": True}))

    @app.get("/_/health")  # OpenFaaS's default readiness probe path
    @app.get("/v2/health/ready")
    def ready():
        return jsonify({"ready": True})

    @app.get("/v1/model")
    def model_info():
        import json

        return jsonify(
            {
                "config": json.loads(config.to_json()),
                "device": str(model.device),
                "threads": n_threads,
                "plan": plan,
            }
        )

    @app.get("/v1/stats")
    def stats():
        return jsonify(_stats(model, n_threads, counts, timer))

    def update(tensors: dict, params: dict) -> dict:
        layer = params_get(params, "layer", int)
        stage = params_get(params, "stage", str)
        if stage == "pre":
            _only(tensors, {"h"})
            h = _writable(require(tensors, "h", "float32", 2))
            with run_lock:
                out = model.pre(layer, h)
        elif stage == "post":
            _only(tensors, {"agg", "root"})
            agg = _writable(require(tensors, "agg", "float32", (2, 3)))
            root = require(tensors, "root", "float32", 2, optional=True)
            pre_next = params_get(params, "pre_next", bool, False)
            with run_lock:
                out = {"h": model.post(layer, agg, None if root is None else _writable(root))}
                if pre_next:  # the next layer's pre: row-wise, so per partition
                    out = model.pre(layer + 1, out["h"])
        else:
            raise InvalidRequest(f"stage must be 'pre' or 'post', got {stage!r}")
        counts[stage] += 1
        return out

    def head(tensors: dict, params: dict) -> dict:
        kind = params_get(params, "kind", str)
        out = _run_head(model, run_lock, kind, tensors)
        counts[kind] += 1
        return out

    frame_route(app, "/v1/update", update)
    frame_route(app, "/v1/head", head)
    return app


def _run_head(model: Any, run_lock: threading.Lock, kind: str, tensors: dict[str, Any]) -> dict:
    """``/v1/head``: an edge head's scores of ``h_u``, ``h_v`` or a graph
    readout of ``h`` by ``segments`` (checked before any work)."""
    if kind == "edge":
        _only(tensors, {"h_u", "h_v"})
        h_u = _writable(require(tensors, "h_u", "float32", 2))
        h_v = _writable(require(tensors, "h_v", "float32", 2))
        with run_lock:
            return {"score": model.edge_scores(h_u, h_v)}
    if kind == "graph":
        _only(tensors, {"h", "segments"})
        h = _writable(require(tensors, "h", "float32", 2))
        seg = require(tensors, "segments", "int64", 1)
        # a readout has at most one graph per row: bounds the allocation
        if seg.size and (seg.min() < 0 or seg.max() >= max(1, h.shape[0])):
            raise InvalidRequest(f"segments must lie in [0, {h.shape[0]})")
        with run_lock:
            return {"readout": model.graph_readout(h, _writable(seg))}
    raise InvalidRequest(f"kind must be 'edge' or 'graph', got {kind!r}")


def _stats(model: Any, n_threads: int, counts: dict[str, int], timer: Any) -> dict:
    """``/v1/stats``: process, device, threads, host-device transfers, requests
    by stage and the HTTP timer's figures."""
    return {
        "pid": os.getpid(),
        "device": str(model.device),
        "threads": n_threads,
        "transfers": model.transfers.as_dict(),
        "requests": sum(counts.values()),
        "requests_by_stage": dict(counts),
        "http": timer.as_dict(),
    }


def _only(tensors: dict[str, Any], allowed: set[str]) -> None:
    extra = set(tensors) - allowed
    if extra:
        raise InvalidRequest(f"unexpected tensors {sorted(extra)}; expected {sorted(allowed)}")
