"""Lone requests to two gateways side by side, alternating: latency, CPU and breakdown.

Two stacks (``gnn-faas up``) run at once, each from its own code tree (a git
worktree of the commit to compare) and/or with its own config overrides; the
same Bitcoin OTC requests go to A then B (then B then A), one at a time, ``GAP``
seconds apart, so both see the same machine at the same moments. Prints JSON:
per stack the p50/mean latency seen by the client, the CPU seconds all its
processes used per request, and the medians of the answers' ``breakdown_ms``.

    git worktree add /tmp/base <commit>
    python scripts/interleaved_lone_requests.py --requests 300 --gap 0.1 \\
        --tree-a /tmp/base --tree-b . [--config-b '{"gateway": {"forward_update": false}}']

Runs with the current venv's Python; the store is the default (``var/store``,
prepared on first use).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import urllib3
import yaml

from gnn_faas.paths import default_store
from gnn_faas.ports import free_port
from gnn_faas.stack import prepared_model


def config(store: str, ckpt: str, extra: dict) -> dict:
    c = {
        "store": store,
        "platform": {"memory_function_mb": 512, "compute_function_mb": 512,
                     "max_memory_instances": 4, "max_compute_instances": 4, "min_instances": 1},
        "models": [{"name": "bitcoin-otc", "graph": "bitcoin-otc", "dataset": "bitcoin-otc",
                    "checkpoint": ckpt, "slo_s": 0.3, "mode": "graph_sharing"}],
    }  # fmt: skip
    for key, value in extra.items():
        (c["models"][0] if key == "model" else c.setdefault(key, {})).update(value)
    return c


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=300)
    p.add_argument("--gap", type=float, default=0.1, help="seconds between requests")
    p.add_argument("--tree-a", default=".")
    p.add_argument("--tree-b", default=".")
    p.add_argument("--config-a", default="{}", help="JSON overrides of A's serving config")
    p.add_argument("--config-b", default="{}")
    args = p.parse_args()
    base, graph, ckpt = prepared_model(default_store(), "bitcoin-otc", "gcn", 0.3)
    workdir = Path(os.environ.get("TMPDIR", "/tmp"))
    stacks = {}
    for tag, tree, extra in (("A", args.tree_a, args.config_a), ("B", args.tree_b, args.config_b)):
        tree = str(Path(tree).resolve())
        path = workdir / f"interleaved-{tag}-{os.getpid()}.yaml"
        path.write_text(yaml.safe_dump(config(base.store, ckpt, json.loads(extra))))
        port = free_port()
        proc = subprocess.Popen(
            [sys.executable, "-m", "gnn_faas", "up", "--config", str(path), "--port", str(port)],
            cwd=tree, env=dict(os.environ, PYTHONPATH=tree),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        stacks[tag] = (proc, urllib3.HTTPConnectionPool("127.0.0.1", port, maxsize=1))
    try:
        return run(args, graph, stacks)
    finally:
        for proc, _ in stacks.values():
            proc.send_signal(signal.SIGTERM)
        for proc, _ in stacks.values():
            proc.wait(60)


def run(args, graph, stacks) -> int:
    for proc, pool in stacks.values():
        deadline = time.monotonic() + 180
        while True:
            with contextlib.suppress(urllib3.exceptions.HTTPError):  # not listening yet
                if pool.request("GET", "/v2/health/ready").status == 200:
                    break
            if time.monotonic() > deadline or proc.poll() is not None:
                print("a stack did not become ready", file=sys.stderr)
                return 1
            time.sleep(0.2)

    def infer(tag: str, v: int) -> dict:
        body = json.dumps({"inputs": [{"name": "targets", "shape": [1], "datatype": "INT64",
                                       "data": [int(v)]}]})  # fmt: skip
        for _ in range(5):  # a lone request shed on a stalled machine: once more
            r = stacks[tag][1].request("POST", "/v2/models/bitcoin-otc/infer", body=body,
                                       headers={"Content-Type": "application/json"})  # fmt: skip
            if r.status != 503:
                break
            time.sleep(0.2)
        if r.status != 200:
            raise SystemExit(f"stack {tag}: HTTP {r.status} {r.data[:200]!r}")
        return json.loads(r.data)

    def cpu(tag: str) -> float:
        root = psutil.Process(stacks[tag][0].pid)
        total = 0.0
        for q in [root, *root.children(recursive=True)]:
            with contextlib.suppress(psutil.NoSuchProcess):
                total += sum(q.cpu_times()[:2])
        return total

    order = graph.read_blob("request_order").astype(np.int64)
    for v in order[:20]:  # warm both
        for tag in "AB":
            infer(tag, v)
            time.sleep(args.gap)
    lat: dict = {"A": [], "B": []}
    parts: dict = {"A": [], "B": []}
    c0 = {t: cpu(t) for t in "AB"}
    for k, v in enumerate(order[20 : 20 + args.requests]):
        for tag in "AB" if k % 2 == 0 else "BA":
            t0 = time.perf_counter()
            out = infer(tag, v)
            lat[tag].append(time.perf_counter() - t0)
            parts[tag].append(out.get("parameters", {}).get("breakdown_ms", {}))
            time.sleep(args.gap)
    c1 = {t: cpu(t) for t in "AB"}
    result = {}
    for t in "AB":
        b = parts[t]
        row = {
            "p50_ms": float(np.median(lat[t]) * 1e3),
            "mean_ms": float(np.mean(lat[t]) * 1e3),
            "cpu_ms_per_request": (c1[t] - c0[t]) * 1e3 / len(lat[t]),
        }
        for key in ("queued", "parse", "khop", "buffer", "execute"):
            row[key] = float(np.median([x.get(key, 0.0) for x in b]))
        for kind in ("aggregate", "update"):
            for key in ("calls", "transport_ms", "serde_ms", "work_ms"):
                row[f"{kind}_{key}"] = float(np.median([x[kind][key] for x in b if kind in x]))
        result[t] = row
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
