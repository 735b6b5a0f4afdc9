"""Live replay against ``gnn-faas up`` beside the simulator's prediction of
the same window (the issue's validation): a 30-second window of the busiest
Azure 2019 function, replayed open loop at its own rate (~75 requests/s) into
a stack deployed as the bundled calibration was measured (256/512 MB
functions, at most 4 instances, one warm). The run directory is written.

The window is preceded by 30 s of the trace, replayed and simulated but not
measured (``--warmup``): without it the stack starts with one warm instance
into ~75 requests/s, and on the local platform the instances it launches then
(Python processes importing torch) take the same two cores the serving ones
run on, so the first second's requests wait far longer than a cloud's cold
start would make them (live p99 433-794 ms against 216 ms simulated).
``--fit-warmup`` refits the profile's execution times on the warm-up's
executions (the window is held out): CI failed when the live p50 on a loaded
2-core machine ran 20% slower than the bundled profile measured on a quiet one.
The refit takes the warm-up's second half (15 s, ~100 executions): with 15 s
of warm-up its ~50 executions made the simulated tail swing (CI once saw a
simulated p99 of 764 ms against 219 ms live, a start-up cold start drawn into
the tail, now capped by ``calibrate._executions``).

p50 and p99 must agree within 15% (measured: within 7%, also with two CPU hogs
beside the test); GB-s per request within 15% plus two instance-launch quanta
(see below)."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest

from gnn_faas.bench.stack import Stack
from gnn_faas.functions.checkpoint import save_checkpoint
from gnn_faas.functions.model_config import ModelConfig
from gnn_faas.functions.pyg_models import build_model
from gnn_faas.traces.calibration import Calibration
from gnn_faas.traces.live import run_replay

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def served(tmp_path_factory, bitcoin_store, bitcoin_graph):
    root = tmp_path_factory.mktemp("live")
    cal = Calibration.bundled("bitcoin-otc")
    cfg = ModelConfig(arch="gcn", in_dim=bitcoin_graph.manifest.feature_dim, hidden_dim=64,
                      out_dim=2, num_layers=2, num_classes=2, graph="bitcoin-otc")  # fmt: skip
    save_checkpoint(root / "ckpt", cfg, build_model(cfg, seed=1).state_dict())
    config = {
        "store": bitcoin_store,
        # the simulator models no admission control: compare like with like
        "gateway": {"admission": False},
        "platform": {
            "memory_function_mb": int(cal.memory_function_mb),
            "compute_function_mb": int(cal.compute_function_mb),
            "max_memory_instances": cal.max_instances,
            "max_compute_instances": cal.max_instances,
            "min_instances": cal.min_instances,
            "keep_alive_s": cal.keep_alive_s,
        },
        "models": [{"name": "bitcoin-otc", "graph": "bitcoin-otc", "dataset": "bitcoin-otc",
                    "checkpoint": str(root / "ckpt"), "slo_s": cal.slo_s}],
    }  # fmt: skip
    with Stack(config, ready_timeout_s=180) as stack:
        yield stack, bitcoin_store


def test_live_replay_agrees_with_the_simulation(served, tmp_path):
    stack, store = served
    out = tmp_path / "run"
    args = argparse.Namespace(
        url=stack.url, model="bitcoin-otc", store=store, out=str(out), senders=64,
        timeout=30.0, slo=None, predict=True, policies="gnn_faas", calibration=None,
        prices=None, fit_warmup=True, no_progress=True, trace_file=None, day=False, minutes=0.5,
        start_minute=60.0, warmup=30.0, speedup=1.0, seed=0, spread=None, rank=0, function=None,
        frequent=False, random_offset=False, raw_hour=False,
    )  # fmt: skip
    live = run_replay("azure2019", args)
    sim = live["simulated"]["policies"]["gnn_faas"]
    assert live["errors"] == 0 and live["requests"] == sim["requests"] > 1500
    keys = ("p50_ms", "p99_ms", "gb_s_per_request", "cold_starts")
    figures = {k: (live[k], sim[k]) for k in keys}  # shown when an assertion fails
    assert sim["p50_ms"] == pytest.approx(live["p50_ms"], rel=0.15), figures
    # GB-s per request within 15% plus two launch quanta: one memory+compute pair
    # kept over the whole window, per request. Both pools launch on momentary
    # concurrency and keep what they launched for the 600 s keep-alive, so in a
    # 30 s window the count the start-up left (live: 4 memory, 2-3 compute; the
    # simulator, folding a model's Aggregate/Update rounds into one stage each:
    # 2-3 and 1) sets the figure.
    platform = stack.config["platform"]
    pair_gb = (platform["memory_function_mb"] + platform["compute_function_mb"]) / 1024
    quantum = pair_gb * args.minutes * 60 / live["requests"]
    gap = abs(sim["gb_s_per_request"] - live["gb_s_per_request"])
    assert gap <= 0.15 * live["gb_s_per_request"] + 2 * quantum, (figures, quantum)
    assert sim["p99_ms"] == pytest.approx(live["p99_ms"], rel=0.15), figures
    assert live["simulated"]["calibration"]["refit"].startswith("warm-up")
    assert sim["mean_sharing_degree"] == pytest.approx(live["mean_sharing_degree"], abs=0.1)
    # storage requests beside compute, live and simulated: one fetch per execution
    assert live["storage"]["gets_per_request"] > 0 and "s3_standard" in sim["storage"]["dollars"]
    # the run directory
    summary = json.loads((out / "summary.json").read_text())
    assert summary["simulated"]["prediction"] == "gnn_faas"
    lines = (out / "requests.csv").read_text().splitlines()
    assert len(lines) == live["requests"] + 1 and "cold_start" in lines[0]
    timeline = np.genfromtxt(out / "timeline.csv", delimiter=",", names=True)
    assert timeline["arrivals"].sum() == live["requests"]
    for png in ("latency_cdf.png", "rate_instances.png", "memory.png", "cost.png"):
        assert (out / png).stat().st_size > 10_000
