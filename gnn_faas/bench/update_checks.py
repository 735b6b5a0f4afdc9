"""Steps of ``gnn-faas bench updates`` after the load: exactness, compaction, the summary.

:class:`Reference` is the final graph as the benchmark knows it (the base's
edge list plus the stream edges :class:`~gnn_faas.bench.update_writer.EdgeCycle`
says are present) and checks served answers against PyG on it.
:func:`compaction_phase` runs the compaction in a subprocess under load, in
5-second open-loop chunks until it is done and one more (the gateway moves to
the new base meanwhile). :func:`ack_figures` and :func:`summarise` make the
figures the JSON leads with.
"""

from __future__ import annotations

import json
import threading
from collections import Counter

import numpy as np

from gnn_faas.bench import update_figures as fig
from gnn_faas.bench.open_loop import poisson_arrivals
from gnn_faas.bench.overload import request_targets
from gnn_faas.bench.update_graphs import base_edges
from gnn_faas.bench.update_writer import Ack
from gnn_faas.client import GatewayClient, vertex_request
from gnn_faas.traces.open_loop import Sent, send_open_loop

CHECK_CHUNK = 64  # targets per request of the PyG check
CHUNK_S = 5.0  # seconds per open-loop chunk during the compaction
ATOL, RTOL = 1e-5, 1e-4  # an answer further from PyG than this is wrong


class Reference:
    """The base of ``graph`` with ``extra`` edges ``[m, 2]`` added, and PyG's
    answers on it; ``touched``: the vertices whose in-lists the updates changed."""

    def __init__(self, graph, extra: np.ndarray, touched: np.ndarray, ckpt: str):
        src, dst = base_edges(graph)
        self.src = np.concatenate((src, extra[:, 0]))
        self.dst = np.concatenate((dst, extra[:, 1]))
        self.x = np.array(graph.read_blob("features"), np.float32)
        self.touched = np.unique(touched)
        self.ckpt = ckpt
        self.num_nodes = graph.num_nodes
        self._want: tuple[np.ndarray, np.ndarray] | None = None

    def targets(self, sample: int, seed: int) -> np.ndarray:
        """Half touched by the stream (their in-lists changed), half any vertex."""
        rng = np.random.default_rng(seed)
        k = min(sample // 2, self.touched.size)
        touched = rng.choice(self.touched, k, replace=False)
        anywhere = rng.choice(self.num_nodes, sample - k, replace=False)
        return np.unique(np.concatenate((touched, anywhere)))

    def check(self, urls: list[str], model: str, sample: int, seed: int) -> dict:
        """Max |served - PyG| per gateway, and the versions the answers named."""
        if self._want is None:
            t = self.targets(sample, seed)
            self._want = t, fig.reference_scores(self.ckpt, self.src, self.dst, self.x, t)
        targets, want = self._want
        diffs, versions, wrong = [], [], 0
        for url in urls:
            got, seen = [], set()
            with GatewayClient(url, timeout_s=120) as client:
                for lo in range(0, targets.size, CHECK_CHUNK):  # a loop over requests
                    res = client.infer_vertices(model, targets[lo : lo + CHECK_CHUNK])
                    got.append(np.asarray(res.outputs["scores"], np.float64))
                    seen.add(int(res.parameters.get("graph_version", -1)))
            err = np.abs(np.concatenate(got) - want)
            diffs.append(float(err.max()))
            wrong += int((err > ATOL + RTOL * np.abs(want)).any(axis=1).sum())
            versions.append(sorted(seen))
        return {"targets": int(targets.size), "max_abs_diff": diffs, "versions": versions,
                "wrong_answers": wrong}  # fmt: skip


def write_checkpoint(out_dir: str, graph, arch: str, seed: int) -> str:
    """A seeded, untrained 2-layer model for ``graph`` (exactness needs no training)."""
    from gnn_faas.functions.checkpoint import save_checkpoint
    from gnn_faas.functions.model_config import ModelConfig
    from gnn_faas.functions.pyg_models import build_model

    cfg = ModelConfig(arch=arch, in_dim=int(graph.manifest.feature_dim), hidden_dim=16,
                      out_dim=2, num_layers=2, graph=graph.name, num_classes=2)  # fmt: skip
    save_checkpoint(out_dir, cfg, build_model(cfg, seed=seed).state_dict())
    return out_dir


def serve_and_check(uri: str, env: dict, graph, extra: np.ndarray, args, tmp: str) -> dict:
    """A gateway on ``graph`` (now its base plus ``extra`` edges): its answers
    against PyG (:meth:`Reference.check`)."""
    from gnn_faas.stack import Stack

    ckpt = write_checkpoint(f"{tmp}/model", graph, "gcn", args.seed)
    config = {"store": uri, "graphs": {"compact_share": 0},
              "models": [{"name": graph.name, "graph": graph.name, "checkpoint": ckpt}]}  # fmt: skip
    ref = Reference(graph, extra, extra[:, 1], ckpt)
    with Stack(config, env=env) as stack:
        return ref.check([stack.url], graph.name, args.sample, args.seed)


class Load(threading.Thread):
    """One open-loop run of single-vertex requests, in a thread; the answers are
    kept (their graph versions)."""

    def __init__(self, url: str, model: str, due: np.ndarray, targets: np.ndarray):
        super().__init__(daemon=True)
        bodies = [json.dumps(vertex_request([int(t)])).encode() for t in targets]
        self.args = (url, f"/v2/models/{model}/infer", due, bodies)
        self.sent: Sent | None = None

    def run(self) -> None:
        self.sent = send_open_loop(*self.args, keep_answers=True)


def start_loads(urls: list[str], model: str, plan: list) -> list[Load]:
    """A :class:`Load` per gateway (``plan``: its ``(due, targets)``), started."""
    out = [Load(url, model, due, tg) for url, (due, tg) in zip(urls, plan) if due.size]
    for ld in out:
        ld.start()
    return out


def sent_summary(sents: list[Sent]) -> dict:
    """Requests, 200s, failures and latency p50/p99 (ms) over open-loop runs."""
    status = np.concatenate([s.status for s in sents])
    lat = np.concatenate([s.latency for s in sents])
    ok = status == 200
    ms = lat[ok] * 1e3 if ok.any() else np.zeros(1)
    failures = Counter(
        f"{int(st)}: {(s.body[i] or s.error[i].encode()).decode(errors='replace')[:120]}"
        for s in sents for i, st in enumerate(s.status) if st != 200
    )  # fmt: skip
    return {
        **gateway_figures(sents, ms, ok),
        "failures": dict(failures.most_common(5)),
        "requests": int(status.size),
        "ok": int(ok.sum()),
        "failed": int((~ok).sum()),
        "p50_ms": float(np.percentile(ms, 50)),
        "p99_ms": float(np.percentile(ms, 99)),
        "late_sends": int(sum(s.late_sends for s in sents)),
    }


def gateway_figures(sents: list[Sent], ms: np.ndarray, ok: np.ndarray) -> dict:
    """From the answers' own ``parameters`` (each body parsed once):
    ``gateway_p99_ms``, the p99 of the latency the gateway measured itself
    (accept to answer; the client's figure adds the loopback and the load
    generator's own delays), and ``tail_breakdown_ms``, where the slowest 2 % of
    the answered requests spent their time (the mean of each stage of the
    gateway's ``breakdown_ms`` over them: queued, parse, khop, buffer, execute,
    other and the per-function calls' parts)."""
    if not ok.any():
        return {"gateway_p99_ms": None, "tail_breakdown_ms": {}}
    bodies = [b for s in sents for b in s.body]
    params = []
    for i in np.flatnonzero(ok):
        try:
            params.append(json.loads(bodies[i])["parameters"])
        except (ValueError, KeyError, TypeError):
            params.append({})
    latency = [float(p["latency_ms"]) for p in params if "latency_ms" in p]
    slow = np.flatnonzero(ms >= np.percentile(ms, 98))  # ms: the answered ones, in order
    parts: Counter = Counter()
    for i in slow:
        for k, v in _flat(params[i].get("breakdown_ms") or {}):
            parts[k] += v
    return {
        "gateway_p99_ms": float(np.percentile(latency, 99)) if latency else None,
        "tail_breakdown_ms": {k: round(v / slow.size, 3) for k, v in sorted(parts.items())},
    }


def _flat(d: dict, prefix: str = ""):
    for k, v in d.items():
        if isinstance(v, dict):
            yield from _flat(v, f"{prefix}{k}.")
        elif isinstance(v, (int, float)):
            yield f"{prefix}{k}", float(v)


def compaction_phase(args, url: str, graph, uri: str, env: dict, after_version: int) -> dict:
    """The compaction under load (see the module docstring)."""
    result: dict = {}
    worker = threading.Thread(
        target=lambda: result.update(fig.run_compaction(uri, graph.name, env)), daemon=True
    )
    worker.start()
    sents, k = [], 0
    while True:
        running = worker.is_alive()
        due = poisson_arrivals(args.rps, CHUNK_S, args.seed + 100 + k)
        ld = Load(url, graph.name, due, request_targets(graph, due.size, args.seed + 100 + k))
        ld.run()
        sents.append(ld.sent)
        k += 1
        if not running:
            break
    worker.join()
    out = {"compaction": result, "infer_during_compaction": sent_summary(sents)}
    if result.get("ok"):
        out["compaction_pickup_s"] = fig.wait_version(url, graph.name, after_version + 1)
        out["compaction_s"] = result["result"]["seconds"]
        out["compaction_wall_s"] = result["wall_s"]
        out["compaction_peak_mib"] = result["peak_rss_mib"]
        out["compaction_cpu_s"] = result["cpu_s"]
    return out


def ack_figures(acks: list[Ack], readers: list[list[Sent]], seconds: float) -> dict:
    """Throughput (over the ``seconds`` the stream ran) and acknowledgement latency
    of the stream; freshness per reader (``readers``: each gateway's open-loop
    runs while the stream ran)."""
    ok = [a for a in acks if a.status == 200]
    out: dict = {"batches_acked": len(ok), "batches_failed": len(acks) - len(ok)}
    if len(ok) < len(acks):
        out["update_errors"] = sorted({f"{a.status}: {a.error}" for a in acks if a.status != 200})
    if not ok:
        return out
    sent = np.array([a.sent for a in ok])
    acked = np.array([a.acked for a in ok])
    versions = np.array([a.version for a in ok], np.int64)
    edges = int(sum(a.edges for a in ok))
    ms = (acked - sent) * 1e3
    out.update({
        "updates_acked": edges,
        "update_seconds": seconds,
        "updates_per_s": edges / max(1e-9, seconds),
        "ack_p50_ms": float(np.percentile(ms, 50)),
        "ack_p99_ms": float(np.percentile(ms, 99)),
        "ack_max_ms": float(ms.max()),
        "freshness": [fig.summarise(fig.freshness(acked, versions, *_answers(runs)))
                      for runs in readers],
    })  # fmt: skip
    return out


def _answers(runs: list[Sent]) -> tuple[np.ndarray, np.ndarray]:
    parts = [fig.answers_at(s) for s in runs]
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


def summarise(out: dict) -> dict:
    """The figures the JSON leads with, from the detailed ones."""
    w, wo = out["infer_with_updates"], out["infer_without_updates"]
    fresh = [f.get("p99_s", float("inf")) for f in out.get("freshness", [])]
    diffs = [d for check in out["pyg"].values() for d in check["max_abs_diff"]]
    failed = sum(x["failed"] for x in (*w, *wo)) + out.get("batches_failed", 0)
    failed += out.get("infer_during_compaction", {}).get("failed", 0)
    inval = [m.get("cache_invalidations") or 0 for ms in out["memory_functions"] for m in ms]
    return {
        **out,
        "infer_p50_ms_with_updates": w[0]["p50_ms"],
        "infer_p50_ms_without_updates": wo[0]["p50_ms"],
        "infer_p99_ms_with_updates": w[0]["p99_ms"],
        "infer_p99_ms_without_updates": wo[0]["p99_ms"],
        "infer_p99_ratio": w[0]["p99_ms"] / max(1e-9, wo[0]["p99_ms"]),
        "freshness_p99_s": max(fresh) if fresh else None,
        "freshness_p99_s_writer_gateway": fresh[0] if fresh else None,
        "freshness_p99_s_second_gateway": fresh[1] if len(fresh) > 1 else None,
        "max_abs_diff_pyg": max(diffs) if diffs else None,
        "failed_requests": failed,
        "failed_requests_during_compaction": out.get("infer_during_compaction", {}).get("failed"),
        "cache_invalidations": int(sum(inval)),
    }
