"""``gnn-faas bench outage``: a store that hangs under load, and what the gateway does.

A ``gnn-faas up`` stack reads its graph from ``--store`` (S3 or Redis) through
a proxy (:mod:`gnn_faas.bench.store_proxy`). Open-loop Poisson requests at
``--rps`` run for ``--before`` seconds, then the proxy stops forwarding for
``--hang`` seconds (the store hangs, as when its process is stopped), then
``--after`` seconds more. Meanwhile a prober asks ``/v2/health/live`` every
quarter second with a 1 s timeout.

Reported per phase (by send time): answered 200, 503 naming the store, other
errors, the largest latency; over the run: answers later than
``request_timeout_s + 1`` (or never), wrong answers (a 200 whose scores differ
from PyG's on the whole graph by more than 1e-4), liveness answers slower than
1 s or failed, and how long after the store's return the last request failed
(``recovered_after_s``: full service from then on).

Targets: liveness always within 1 s; every request answered within
``request_timeout_s + 1``; 0 wrong answers; full service within 5 s of the
store's return, with no restart.
"""

from __future__ import annotations

import argparse
import json
import threading
import time

import numpy as np
import requests

from gnn_faas.bench.open_loop import poisson_arrivals
from gnn_faas.bench.overload import request_targets
from gnn_faas.bench.store_proxy import add_store_arguments, store_access, store_fields
from gnn_faas.errors import InvalidRequest
from gnn_faas.stack import Stack, prepared_model
from gnn_faas.traces.open_loop import send_open_loop
from gnn_faas.traces.replay import vertex_request

ATOL = 1e-4


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--graph", default="bitcoin-otc", help="graph (and dataset) name")
    add_store_arguments(p)
    p.add_argument("--rps", type=float, default=20.0, help="requests per second")
    p.add_argument("--before", type=float, default=10.0, help="seconds before the hang")
    p.add_argument("--hang", type=float, default=40.0, help="seconds the store hangs")
    p.add_argument("--after", type=float, default=20.0, help="seconds after the store returns")
    p.add_argument("--request-timeout-s", type=float, default=30.0, help="the gateway's")
    p.add_argument(
        "--structure-budget-mb", type=float, default=None,
        help="the gateway's structure budget (default: the config's; small: k-hop reads "
        "go to the store, so the hang reaches requests)",
    )  # fmt: skip
    p.add_argument("--slo", type=float, default=0.3)
    p.add_argument("--arch", default="gcn")
    p.add_argument("--seed", type=int, default=0)


def reference_scores(graph, ckpt: str) -> np.ndarray:
    """The model's outputs for every vertex, by PyG on the whole graph."""
    import torch  # lazily: the bench CLI starts without torch

    from gnn_faas.functions.checkpoint import load_config, load_state
    from gnn_faas.functions.pyg_models import PygGNN, csr_edge_index

    model = PygGNN(load_config(ckpt))
    model.load_state_dict({k: torch.as_tensor(v) for k, v in load_state(ckpt).items()})
    model.eval()
    ei = csr_edge_index(graph.read_blob("indptr"), graph.read_blob("indices"))
    x = torch.from_numpy(np.array(graph.read_blob("features"), dtype=np.float32))
    with torch.no_grad():
        return model(x, ei).numpy()


class LivenessProber(threading.Thread):
    """``GET /v2/health/live`` every ``every_s``, 1 s timeout: ``(t, seconds, ok)``."""

    def __init__(self, url: str, every_s: float = 0.25):
        super().__init__(daemon=True)
        self.url, self.every_s = f"{url}/v2/health/live", every_s
        self.stop = threading.Event()
        self.samples: list[tuple[float, float, bool]] = []
        self.t0 = time.monotonic()

    def run(self) -> None:
        with requests.Session() as s:
            while not self.stop.wait(self.every_s):
                t = time.monotonic()
                try:
                    ok = s.get(self.url, timeout=1.0).status_code == 200
                except requests.RequestException:
                    ok = False
                self.samples.append((t - self.t0, time.monotonic() - t, ok))


def scores_of(body: bytes) -> np.ndarray | None:
    try:
        out = {o["name"]: o for o in json.loads(body)["outputs"]}["scores"]
    except (ValueError, KeyError, TypeError):
        return None
    return np.asarray(out["data"], dtype=np.float64).reshape(out["shape"])


def run(args: argparse.Namespace) -> dict:
    if min(args.before, args.hang, args.after) < 0 or args.rps <= 0:
        raise InvalidRequest("--rps must be positive and the phases non-negative")
    base, graph, ckpt = prepared_model(args.store, args.graph, args.arch, args.slo)
    if not base.store.startswith(("s3://", "redis://", "rediss://")):
        raise InvalidRequest(
            "bench outage needs an s3:// or redis:// --store (it hangs its server)"
        )
    reference = reference_scores(graph, ckpt)
    span = args.before + args.hang + args.after
    due = poisson_arrivals(args.rps, span, seed=args.seed)
    targets = request_targets(graph, due.size, args.seed)
    bodies = [json.dumps(vertex_request([int(t)], f"r{i}")).encode() for i, t in enumerate(targets)]
    gateway = {"request_timeout_s": args.request_timeout_s}
    if args.structure_budget_mb is not None:
        gateway["structure_budget_mb"] = args.structure_budget_mb
    with store_access(base.store, args.store_rtt_ms, always=True) as (uri, env, proxy):
        config = {
            "store": uri,
            "gateway": gateway,
            "platform": {"max_memory_instances": 2, "max_compute_instances": 2},
            "models": [{"name": args.graph, "graph": args.graph, "dataset": args.graph,
                        "checkpoint": ckpt, "slo_s": args.slo}],
        }  # fmt: skip
        with Stack(config, env=env) as stack:
            for t in targets[:5]:  # warm connections outside the measured run
                requests.post(
                    f"{stack.url}/v2/models/{args.graph}/infer",
                    json=vertex_request([int(t)]),
                    timeout=args.request_timeout_s + 5,
                )
            prober = LivenessProber(stack.url)
            hang = threading.Timer(args.before, proxy.pause)
            back = threading.Timer(args.before + args.hang, proxy.resume)
            prober.start()
            hang.start()
            back.start()
            sent = send_open_loop(
                stack.url,
                f"/v2/models/{args.graph}/infer",
                due,
                bodies,
                timeout_s=args.request_timeout_s + 10,
                keep_answers=True,
            )
            prober.stop.set()
            prober.join()
            back.join()
            restarted = stack.proc.poll() is not None
    out = summarise(sent, targets, reference, prober, args)
    out.update(
        store_fields(base.store, args.store_rtt_ms), graph=args.graph, gateway_exited=restarted
    )
    return out


def summarise(sent, targets, reference, prober, args) -> dict:
    """The figures of the module docstring from the sender's record."""
    t_hang, t_back = args.before, args.before + args.hang
    limit = args.request_timeout_s + 1.0
    phases = {"before": (0.0, t_hang), "hang": (t_hang, t_back), "after": (t_back, np.inf)}
    out: dict = {"rps": args.rps, "request_timeout_s": args.request_timeout_s, "phases": {}}
    wrong = late = 0
    failed_after = []
    for name, (lo, hi) in phases.items():
        idx = np.flatnonzero((sent.send >= lo) & (sent.send < hi))
        counts = {"requests": int(idx.size), "ok": 0, "store_503": 0, "other": 0}
        for i in idx.tolist():
            status = int(sent.status[i])
            if status == 200:
                counts["ok"] += 1
                got = scores_of(sent.body[i])
                if got is None or not np.allclose(got, reference[[int(targets[i])]], atol=ATOL):
                    wrong += 1
            elif status == 503 and b"graph store" in sent.body[i]:
                counts["store_503"] += 1
            else:
                counts["other"] += 1
            if status != 200 and sent.send[i] >= t_back:
                failed_after.append(sent.send[i] + np.nan_to_num(sent.latency[i]) - t_back)
            if sent.error[i] or not sent.latency[i] <= limit:
                late += 1
        lat = sent.latency[idx]
        counts["max_latency_s"] = float(np.nanmax(lat)) if idx.size else 0.0
        counts["p50_ms"] = float(np.nanpercentile(lat, 50) * 1e3) if idx.size else 0.0
        if counts["other"]:
            ex = [sent.body[i][:120].decode("utf-8", "replace") or sent.error[i] for i in idx
                  if int(sent.status[i]) != 200 and b"graph store" not in sent.body[i]]  # fmt: skip
            counts["other_examples"] = sorted(set(ex))[:3]
            at = [float(sent.send[i] - lo) for i in idx if int(sent.status[i]) != 200
                  and b"graph store" not in sent.body[i]]  # fmt: skip
            counts["other_sent_s"] = [round(min(at), 3), round(max(at), 3)]
        out["phases"][name] = counts
    live = np.array([(s, ok) for _, s, ok in prober.samples], dtype=float).reshape(-1, 2)
    out["liveness"] = {
        "probes": int(live.shape[0]),
        "max_s": float(live[:, 0].max()) if live.size else None,
        "slow_or_failed": int(((live[:, 0] > 1.0) | (live[:, 1] == 0)).sum()) if live.size else 0,
    }
    out["answered_later_than_timeout_plus_1s"] = late
    out["wrong_answers"] = wrong
    out["recovered_after_s"] = float(max(failed_after)) if failed_after else 0.0
    out["targets_met"] = {
        "liveness_within_1s": out["liveness"]["slow_or_failed"] == 0,
        "answered_within_timeout_plus_1s": late == 0,
        "no_wrong_answers": wrong == 0,
        "full_service_within_5s": out["recovered_after_s"] <= 5.0,
    }
    return out
