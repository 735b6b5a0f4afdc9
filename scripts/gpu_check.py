"""The GPU check's steps (scripts/gpu-check.sh runs them; docs/gpu-check.md says how).

    python3 scripts/gpu_check.py deps              print the core requirements this Python lacks
    python3 scripts/gpu_check.py run --device cuda --out FILE [--quick]

``run`` on ``--device`` (``cuda``, or ``cpu`` standing in for it so the whole check runs on a
machine without a GPU), each step recorded in one JSON document, printed and written to FILE:

1. ``gpu_tests``: the ``gpu``-marked tests (pytest ``-m gpu`` over the files that hold them,
   with ``GNN_FAAS_GPU_CHECK_DEVICE`` naming the device they use).
2. ``serve``: ``gnn-faas up`` (:class:`gnn_faas.stack.Stack`, local platform) with two models on
   one Bitcoin OTC checkpoint, the compute function of one on ``--device`` and of the other on
   the CPU; the same vertex requests to both must give the same answer (``rtol 1e-4``), and
   the first model's compute instance must report ``--device`` (``GET /v1/model``).
3. ``update_bench``: Update (every layer's ``pre`` and ``post`` over ``n`` rows, numpy in and
   out, transfers included) on ``--device`` and on the CPU, median of ``reps`` runs after a
   warm-up, for Bitcoin OTC's trained model (``n`` up to the whole graph, its own feature
   rows) and a reddit-like GCN (602 -> 256 -> 41, random weights and rows, ``n`` up to 200k).
4. ``placement``: :class:`~gnn_faas.scheduler.update_placement.UpdatePlacement` calibrated
   from those latencies per series: the threshold, its choice at each measured size against
   the measured faster device, and its choice for buffers of real Bitcoin OTC requests by
   their predicted size ``Σ PSGS`` (Quiver's, full 2-hop fanouts).

``ok`` is false, and the exit status 1, when a test fails or is skipped on CUDA, the answers
differ, the device is not the one asked for, or a step raises. ``deps`` needs only the
standard library and ``packaging`` (or pip's copy of it), so it runs before anything installs.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
import traceback
import xml.etree.ElementTree as ET
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]
TOLERANCE = {"rtol": 1e-4, "atol": 1e-5}
REDDIT = {"in_dim": 602, "hidden_dim": 256, "out_dim": 41}  # Reddit's features and classes


# -- deps ----------------------------------------------------------------------
def missing_requirements(reqs: list[str], version_of) -> list[str]:
    """The requirements among ``reqs`` that ``version_of(name)`` (the installed version, or
    ``None``) does not satisfy."""
    try:
        from packaging.requirements import Requirement
    except ImportError:  # pip carries its own copy
        from pip._vendor.packaging.requirements import Requirement
    out = []
    for text in reqs:
        req = Requirement(text)
        if req.marker is not None and not req.marker.evaluate():
            continue
        have = version_of(req.name)
        if have is None or not req.specifier.contains(have, prereleases=True):
            out.append(text)
    return out


def core_requirements() -> list[str]:
    return list(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"])


def installed_version(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


# -- steps ---------------------------------------------------------------------
def gpu_tests(device: str, work: Path) -> dict:
    """pytest -m gpu over the test files that hold gpu-marked tests."""
    files = sorted(
        str(p.relative_to(ROOT))
        for p in (ROOT / "tests").rglob("test_*.py")
        if "mark.gpu" in p.read_text()
    )
    xml = work / "gpu-tests.xml"
    env = {**os.environ, "GNN_FAAS_GPU_CHECK_DEVICE": device, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider"]
    done = subprocess.run(
        [*cmd, f"--junitxml={xml}", *files], cwd=ROOT, env=env, capture_output=True, text=True
    )
    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    if xml.is_file():
        for suite in ET.parse(xml).getroot().iter("testsuite"):
            for key in counts:
                counts[key] += int(suite.get(key, 0))
    passed = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    tail = (done.stdout + done.stderr).strip().splitlines()[-15:]
    return {"files": files, "rc": done.returncode, "passed": passed, **counts, "tail": tail}


def _models(device: str, checkpoint: str) -> list[dict]:
    common = {"graph": "bitcoin-otc", "dataset": "bitcoin-otc", "checkpoint": checkpoint}
    return [
        {"name": "bitcoin-otc-gpu", **common, "epochs": 20, "device": device},
        {"name": "bitcoin-otc-cpu", **common, "epochs": 20, "device": "cpu"},
    ]


def serve(device: str, work: Path) -> dict:
    """Both models up in one stack; the same requests to each; answers compared."""
    import numpy as np
    import requests

    from gnn_faas.config import ModelServingConfig, ServingConfig
    from gnn_faas.stack import Stack, prepare
    from gnn_faas.storage.format import open_graph
    from gnn_faas.storage.workload_metrics import compute_and_store

    store = f"file://{work / 'store'}"
    models = _models(device, str(work / "models" / "bitcoin-otc"))
    config = ServingConfig(store=store, models=tuple(ModelServingConfig(**m) for m in models))
    prepare(config, log=say)  # stdout carries the JSON alone
    graph = open_graph(store, "bitcoin-otc")
    compute_and_store(graph, [None, None])  # PSGS: the gateway predicts each request's rows
    order = graph.read_blob("request_order")
    batches = [order[:1], order[1:17], order[17:273]]
    out: dict = {"requests": [], "equal": True}
    with Stack({"store": store, "models": models}, ready_timeout_s=300) as stack:
        status = stack.status()
        for m in status["models"]:
            url = m["compute_pool"]["instances"][0]["url"]
            info = requests.get(f"{url}/v1/model", timeout=30).json()
            out.setdefault("compute_device", {})[m["model"]] = info["device"]
        for targets in batches:
            body = {"inputs": [{"name": "targets", "datatype": "INT64",
                                "shape": [int(targets.size)], "data": targets.tolist()}]}  # fmt: skip
            answers, params = {}, {}
            for m in models:
                r = requests.post(
                    f"{stack.url}/v2/models/{m['name']}/infer", json=body, timeout=120
                )
                r.raise_for_status()
                doc = r.json()
                o = doc["outputs"][0]
                answers[m["name"]] = np.asarray(o["data"], np.float32).reshape(o["shape"])
                params[m["name"]] = doc.get("parameters", {})
            a, b = answers["bitcoin-otc-gpu"], answers["bitcoin-otc-cpu"]
            equal = a.shape == b.shape and bool(np.allclose(a, b, **TOLERANCE))
            out["equal"] &= equal
            out["requests"].append({
                "targets": int(targets.size), "shape": list(a.shape), "equal": equal,
                "max_abs_diff": float(np.abs(a - b).max()) if a.shape == b.shape else None,
                "predicted_rows": params["bitcoin-otc-gpu"].get("predicted_rows"),
                "aggregated_rows": params["bitcoin-otc-gpu"].get("aggregated_rows"),
            })  # fmt: skip
    return out


def _update(model, x):
    """Every layer's Update stages over the rows ``x`` (the aggregate stands in as the
    layer's own rows: Update's work and transfers, not the memory side's)."""
    h = x
    for step in model.plan.steps:
        z = model.pre(step.layer, h)["h"] if step.pre else h
        h = model.post(step.layer, z)
    return h


def _median_seconds(model, x, reps: int):
    out = _update(model, x)  # warm-up: kernels, allocator, pinned buffers
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        _update(model, x)
        times.append(time.perf_counter() - t0)
    return float(sorted(times)[len(times) // 2]), out


def _series(name: str, cpu, dev, rows: list[int], features, reps: int) -> list[dict]:
    import numpy as np

    out = []
    for n in rows:
        x = np.ascontiguousarray(features[:n])
        cpu_s, a = _median_seconds(cpu, x, reps)
        dev_s, b = _median_seconds(dev, x, reps)
        out.append({
            "series": name, "rows": int(n), "in_dim": int(x.shape[1]), "cpu_s": cpu_s,
            "device_s": dev_s, "speedup": cpu_s / dev_s if dev_s > 0 else None,
            "max_abs_diff": float(np.abs(a - b).max()),
            "equal": bool(np.allclose(b, a, rtol=1e-3, atol=1e-4)),
        })  # fmt: skip
    return out


def update_bench(device: str, work: Path, quick: bool) -> list[dict]:
    import numpy as np

    from gnn_faas.functions.model_config import ModelConfig
    from gnn_faas.functions.pyg_models import build_model
    from gnn_faas.functions.update import UpdateModel
    from gnn_faas.storage.format import open_graph

    ckpt = work / "models" / "bitcoin-otc"
    graph = open_graph(f"file://{work / 'store'}", "bitcoin-otc")
    feats = graph.read_blob("features").astype(np.float32)
    n = graph.num_nodes
    reps = 1 if quick else 5
    rows = [32, 256, 2048, n] if not quick else [32, 512, n]
    out = _series("bitcoin-otc", UpdateModel.load(ckpt, "cpu"), UpdateModel.load(ckpt, device),
                  rows, feats, reps)  # fmt: skip
    cfg = ModelConfig(arch="gcn", num_layers=2, **REDDIT)
    state = build_model(cfg, seed=0).state_dict()
    rows = [256, 1024, 4096] if quick else [1_000, 10_000, 50_000, 200_000]
    x = np.random.default_rng(0).standard_normal((rows[-1], REDDIT["in_dim"]), np.float32)
    cpu, dev = UpdateModel(cfg, state, "cpu"), UpdateModel(cfg, state, device)
    return out + _series("reddit-like", cpu, dev, rows, x, 1 if quick else 3)


def placement(bench: list[dict], work: Path) -> dict:
    """UpdatePlacement per series from the measured latencies; its choices."""
    import math

    import numpy as np

    from gnn_faas.scheduler.update_placement import UpdatePlacement
    from gnn_faas.storage.format import open_graph

    out: dict = {}
    for name in dict.fromkeys(r["series"] for r in bench):
        rows = [r for r in bench if r["series"] == name]
        p = UpdatePlacement.calibrate(
            [(r["rows"], r["cpu_s"]) for r in rows], [(r["rows"], r["device_s"]) for r in rows]
        )
        choices = [{"rows": r["rows"], "chosen": p.choose(r["rows"]),
                    "faster": "cuda" if r["device_s"] < r["cpu_s"] else "cpu"} for r in rows]  # fmt: skip
        t = p.threshold_rows
        out[name] = {
            "threshold_rows": None if math.isinf(t) else t, "cpu": vars(p.cpu), "gpu": vars(p.gpu),
            "choices": choices, "agree": sum(c["chosen"] == c["faster"] for c in choices),
        }  # fmt: skip
    graph = open_graph(f"file://{work / 'store'}", "bitcoin-otc")
    psgs, order = graph.read_blob("psgs"), graph.read_blob("request_order")
    p = UpdatePlacement.from_json(json.dumps({k: out["bitcoin-otc"][k] for k in ("cpu", "gpu")}))
    out["bitcoin-otc"]["buffers"] = [
        {"requests": k, "predicted_rows": float(psgs[np.unique(order[:k])].sum()),
         "chosen": p.choose(float(psgs[np.unique(order[:k])].sum()))}
        for k in (1, 16, 256, 4096) if k <= order.size
    ]  # fmt: skip
    return out


def run(device: str, out_path: Path, quick: bool) -> int:
    import torch

    t0 = time.monotonic()
    doc: dict = {
        "device": device, "stand_in": device == "cpu", "quick": quick,
        "python": platform.python_version(), "torch": torch.__version__,
        "gpu_name": torch.cuda.get_device_name(0) if device.startswith("cuda") else None,
        "cpu_threads": torch.get_num_threads(), "problems": [],
    }  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="gnn-faas-gpu-check-") as tmp:
        work = Path(tmp)
        steps = [("gpu_tests", lambda: gpu_tests(device, work)),
                 ("serve", lambda: serve(device, work)),
                 ("update_bench", lambda: update_bench(device, work, quick)),
                 ("placement", lambda: placement(doc["update_bench"], work))]  # fmt: skip
        for name, step in steps:
            s0 = time.monotonic()
            say(f"{name} ...")
            try:
                doc[name] = step()
            except Exception as e:  # recorded; the other steps still run where they can
                doc[name] = {"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()}
            doc.setdefault("seconds", {})[name] = round(time.monotonic() - s0, 2)
    doc["problems"] = problems(doc)
    doc["ok"] = not doc["problems"]
    doc["seconds"]["total"] = round(time.monotonic() - t0, 2)
    text = json.dumps(doc, indent=2)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(text + "\n")
    print(text)
    say(f"{'ok' if doc['ok'] else 'FAILED'} in {doc['seconds']['total']} s; wrote {out_path}")
    return 0 if doc["ok"] else 1


def problems(doc: dict) -> list[str]:
    """Every way the run fell short of the check, one sentence each."""
    out = [f"{k}: {doc[k]['error']}" for k in ("gpu_tests", "serve", "update_bench", "placement")
           if isinstance(doc.get(k), dict) and "error" in doc[k]]  # fmt: skip
    t = doc.get("gpu_tests", {})
    if "error" not in t:
        if t.get("failures") or t.get("errors") or t.get("rc") not in (0,) or not t.get("passed"):
            out.append(f"gpu tests: {t.get('passed')} passed, {t.get('failures')} failed, "
                       f"{t.get('errors')} errors (rc {t.get('rc')})")  # fmt: skip
        if t.get("skipped"):
            out.append(f"gpu tests: {t['skipped']} skipped on {doc['device']}")
    s = doc.get("serve", {})
    if "error" not in s:
        if not s.get("equal"):
            out.append("serve: the answers on the device and on the CPU differ")
        got = s.get("compute_device", {}).get("bitcoin-otc-gpu", "")
        if got.split(":")[0] != doc["device"].split(":")[0]:
            out.append(f"serve: the compute function runs on {got!r}, not {doc['device']!r}")
    b = doc.get("update_bench")
    if isinstance(b, list):
        out += [f"update_bench: {r['series']} at {r['rows']} rows differs from the CPU "
                f"(max |diff| {r['max_abs_diff']:.3g})" for r in b if not r["equal"]]  # fmt: skip
    return out


def say(msg: str) -> None:
    print(f"gpu-check: {msg}", file=sys.stderr, flush=True)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="scripts/gpu_check.py", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("deps", help="print the core requirements this Python lacks, one a line")
    r = sub.add_parser("run", help="the whole check; JSON to stdout and --out")
    r.add_argument("--device", default="cuda", help="cuda, cuda:N, or cpu (stand-in)")
    r.add_argument("--out", type=Path, default=ROOT / "build" / "gpu-check.json")
    r.add_argument("--quick", action="store_true", help="small sizes, one repetition (tests)")
    args = ap.parse_args(argv)
    if args.cmd == "deps":
        for req in missing_requirements(core_requirements(), installed_version):
            print(req)
        return 0
    if not re.fullmatch(r"cpu|cuda(:\d+)?", args.device):
        ap.error(f"--device must be cuda, cuda:N or cpu, not {args.device!r}")
    return run(args.device, args.out, args.quick)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
