"""``gnn-faas bench srpe --live``: OMEGA's protocol served over HTTP.

The held-out vertices of ``gnn-faas bench srpe`` (the same split, model and
reduced graph ``NAME-srpe``) are sent as new-vertex requests (their features
and their edges to kept vertices, ``gateway/new_vertices.py``) to a
``gnn-faas up`` stack (:class:`~gnn_faas.stack.Stack`: the local platform,
one memory and one compute function instance per model) that serves the
reduced graph as several models over one checkpoint: ``exact``, and for
every ``--budgets`` value and ``--policies`` policy, precomputed serving with
``recompute_from: state`` (the memory functions read a recomputed candidate's
stored layer-1 state and add the request's changed terms) and with
``recompute_from: neighbourhood`` (they gather its whole in-neighbourhood's
input rows). The embedding sets are computed once and written under each
model's name.

Requests go one at a time, each to every model in turn, so the machine's
noise falls on every setting alike; a request's latency is the fastest of
``--repeat`` runs (``p50_ms``: the client's POST; ``gateway_p50_ms``: the
gateway's own ``latency_ms``). From each request's first run, read off
``/v1/status`` before and after it: ``memory_rows_p50``, the input rows the
memory functions gathered (feature-cache lookups, hits and misses alike: what
the execution touched, whatever the cache held); ``memory_bytes_p50``, what
they read from the store for them (cache misses only, so it falls as the
cache warms); ``state_rows_p50`` / ``state_bytes_p50``, the stored states
they read; ``gateway_bytes_p50``, what the gateway read (the SRPE or k-hop
graph's structure and the boundary's stored embeddings); ``breakdown_ms``,
the median of the first runs' ``breakdown_ms`` (parse, graph, execute, and
per kind of function call its transport, (de)serialisation and work). Answers are
compared with exact serving's (``agreement_with_exact``,
``rel_error_mean``) and, for the state setting, with the neighbourhood one's
(``rel_error_vs_neighbourhood``: the same aggregate computed two ways).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

RECOMPUTE_FROM = ("state", "neighbourhood")


def model_name(budget: float, policy: str, source: str) -> str:
    return f"{source}-{budget:g}-{policy}"


def write_sets(reduced, ckpt: Path, names: list[str]) -> float:
    """The embedding set of ``ckpt`` on ``reduced`` (layers and layer-1
    states), computed once and written under every name; seconds taken."""
    from gnn_faas.functions.checkpoint import checkpoint_sha256
    from gnn_faas.functions.precompute import full_graph_embeddings
    from gnn_faas.functions.update import UpdateModel
    from gnn_faas.storage.embeddings import write_embeddings

    t0 = time.perf_counter()
    states: dict[int, np.ndarray] = {}
    layers = full_graph_embeddings(reduced, UpdateModel.load(ckpt, "cpu"), states=states)
    sha = checkpoint_sha256(ckpt)
    for name in names:
        write_embeddings(reduced, name, sha, layers, states)
    return time.perf_counter() - t0


def stack_config(args: argparse.Namespace, store: str, graph: str, ckpt: Path, models: dict):
    """One model per setting over the same checkpoint; buffers never hold a
    new-vertex request (it runs on its own), so the SLO only sizes them."""
    base = {"graph": graph, "dataset": None, "checkpoint": str(ckpt), "slo_s": 30.0}
    return {
        "store": store,
        "gateway": {"admission": False, "request_timeout_s": 300.0},
        "platform": {
            "memory_function_mb": args.memory_mb,
            "compute_function_mb": args.compute_mb,
            "max_memory_instances": 1,
            "max_compute_instances": 1,
        },
        "models": [{"name": name, **base, **spec} for name, spec in models.items()],
    }


def reads(status: dict) -> dict[str, dict[str, float]]:
    """Per model: what its memory functions gathered and read, and what the
    gateway read for it, so far."""
    out = {}
    for m in status["models"]:
        caches = [c for c in m.get("caches", []) if "lookups" in c]
        srpe = m.get("srpe", {})
        out[m["model"]] = {
            "memory_rows": sum(c["lookups"] for c in caches),
            "memory_bytes": sum(c.get("bytes_read") or 0 for c in caches),
            "state_rows": sum(c.get("state_rows_read", 0) for c in caches),
            "state_bytes": sum(c.get("state_bytes_read", 0) for c in caches),
            "gateway_bytes": m["gateway_fetch"]["bytes_read"]
            + srpe.get("embeddings_read", {}).get("bytes_read", 0),
        }
    return out


def serve_all(stack, session, bodies: list[dict], names: list[str], repeat: int) -> dict:
    """Every request to every model in turn: per model its answers' scores,
    parameters, the fastest latencies and the first run's reads."""
    url = stack.url
    got: dict[str, dict[str, list]] = {
        n: {"scores": [], "client_s": [], "gateway_ms": [], "params": [], "reads": []}
        for n in names
    }

    def post(name: str, body: dict) -> tuple[float, dict]:
        t0 = time.perf_counter()
        resp = session.post(f"{url}/v2/models/{name}/infer", json=body, timeout=300)
        took = time.perf_counter() - t0
        if resp.status_code != 200:
            raise RuntimeError(f"model {name}: HTTP {resp.status_code}: {resp.text[:300]}")
        return took, resp.json()

    for body in bodies:
        for name in names:
            before = reads(stack.status())[name]
            took, answer = post(name, body)
            after = reads(stack.status())[name]
            g = got[name]
            g["reads"].append({k: after[k] - before[k] for k in after})
            best, best_gw = took, answer["parameters"]["latency_ms"]
            for _ in range(max(1, repeat) - 1):
                t, a = post(name, body)
                best, best_gw = min(best, t), min(best_gw, a["parameters"]["latency_ms"])
            scores = next(o for o in answer["outputs"] if o["name"] == "scores")
            g["scores"].append(np.asarray(scores["data"], np.float64).reshape(scores["shape"])[0])
            g["client_s"].append(best)
            g["gateway_ms"].append(best_gw)
            g["params"].append(answer["parameters"])
    return got


def figures(g: dict, exact: dict | None, truth: np.ndarray | None) -> dict[str, Any]:
    """One setting's figures (beside exact serving's, when given)."""
    from gnn_faas.bench.e2e import median_breakdown

    scores = np.stack(g["scores"])
    pred = scores.argmax(1)
    p50 = float(np.median(g["client_s"]) * 1e3)
    out: dict[str, Any] = {
        "p50_ms": p50,
        "p90_ms": float(np.percentile(g["client_s"], 90) * 1e3),
        "gateway_p50_ms": float(np.median(g["gateway_ms"])),
    }
    for key in ("memory_rows", "memory_bytes", "state_rows", "state_bytes", "gateway_bytes"):
        out[f"{key}_p50"] = float(np.median([r[key] for r in g["reads"]]))
    if truth is not None:
        out["accuracy"] = float((pred == truth).mean())
    out["breakdown_ms"] = median_breakdown(g["params"])  # of the first runs
    srpe = [p for p in g["params"] if "recomputed" in p]
    if srpe:
        out["recomputed_mean"] = float(np.mean([p["recomputed"] for p in srpe]))
        out["recompute_from"] = sorted({p["recompute_from"] for p in srpe})
    if exact is not None:
        ref = np.stack(exact["scores"])
        out["agreement_with_exact"] = float((pred == ref.argmax(1)).mean())
        out["rel_error_mean"] = rel_error(scores, ref)
        exact_p50 = float(np.median(exact["client_s"]) * 1e3)
        out["speedup_p50"] = exact_p50 / p50 if p50 > 0 else None
    return out


def rel_error(a: np.ndarray, b: np.ndarray) -> float:
    """Mean ``||a - b|| / ||b||`` over the rows."""
    diff = np.linalg.norm(a - b, axis=1)
    return float(np.mean(diff / np.maximum(np.linalg.norm(b, axis=1), 1e-12)))


def run_live(
    args: argparse.Namespace,
    store: str,
    reduced,
    ckpt: Path,
    raw: list,
    truth: np.ndarray | None,
    budgets: list[float],
    policies: list[str],
) -> dict[str, Any]:
    """Serve ``raw`` (per request: features and edges of the new vertex
    ``reduced.num_nodes``) live; the figures per setting."""
    import requests

    from gnn_faas.client import new_vertex_request
    from gnn_faas.stack import Stack

    models: dict[str, dict] = {"exact": {"embeddings": "exact"}}
    for policy in policies:
        for b in budgets:
            for source in RECOMPUTE_FROM:
                models[model_name(b, policy, source)] = {
                    "embeddings": "precomputed", "recompute_budget": b,
                    "recompute_policy": policy, "recompute_from": source,
                }  # fmt: skip
    precompute_s = write_sets(reduced, ckpt, [n for n in models if n != "exact"])
    bodies = [new_vertex_request([reduced.num_nodes], f, e) for f, e in raw]
    names = list(models)
    config = stack_config(args, store, reduced.name, ckpt, models)
    with tempfile.TemporaryDirectory(prefix="gnn-faas-srpe-live-") as tmp:
        log = Path(tmp) / "gateway.log"
        with Stack(config, ready_timeout_s=600, log_path=log) as stack, requests.Session() as s:
            for body in bodies[:2]:  # untimed: imports, connections, first reads
                for name in names:
                    s.post(f"{stack.url}/v2/models/{name}/infer", json=body, timeout=300)
            got = serve_all(stack, s, bodies, names, args.repeat)
    exact = got["exact"]
    out: dict[str, Any] = {
        "live": True,
        "neighbourhoods": "full",
        "accuracy_kind": "labels" if truth is not None else "agreement_with_exact",
        "precompute_seconds": precompute_s,
        "platform": {"memory_function_mb": args.memory_mb, "compute_function_mb": args.compute_mb},
        "exact": figures(exact, None, truth),
        "policies": {},
    }
    for policy in policies:
        row: dict[str, Any] = {}
        for b in budgets:
            cell = {}
            for source in RECOMPUTE_FROM:
                cell[source] = figures(got[model_name(b, policy, source)], exact, truth)
            state, nbhd = (got[model_name(b, policy, src)] for src in RECOMPUTE_FROM)
            cell["state"]["rel_error_vs_neighbourhood"] = rel_error(
                np.stack(state["scores"]), np.stack(nbhd["scores"])
            )
            row[f"{b:g}"] = cell
        out["policies"][policy] = row
    return out
