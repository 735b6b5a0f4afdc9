"""A trace window replayed live against ``gnn-faas up`` and simulated beside it,
through ``gnn-faas bench live-vs-sim`` on a short window.

This checks that the comparison runs and that its books balance: every request
of the window is accounted for on both sides, and what each side meters equals
the integral of its own timeline of allocated memory. How close the live and
simulated figures are depends on the machine, so it is a benchmark's figure
(``ratio``), not asserted here. The run directory ``--out`` writes is checked
too.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from gnn_faas.cli import main

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def compared(bitcoin_store, tmp_path_factory):
    out = tmp_path_factory.mktemp("live") / "run"
    argv = ["bench", "live-vs-sim", "--store", bitcoin_store, "--minutes", "0.1",
            "--warmup", "6", "--out", str(out), "--json"]  # fmt: skip
    return argv, out


def test_live_vs_sim_accounts_for_every_request_and_meters_its_timeline(compared, capsys):
    argv, out = compared
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    live, sim = report["live"], report["simulated"]

    # the same window on both sides, every request answered or counted
    assert live["requests"] == sim["requests"] > 100
    assert live["answered"] == live["requests"], report["errors"]
    assert sim["answered"] <= sim["requests"]
    lines = (out / "requests.csv").read_text().splitlines()
    assert len(lines) == live["requests"] + 1 and "cold_start" in lines[0]
    timeline = np.genfromtxt(out / "timeline.csv", delimiter=",", names=True)
    assert timeline["arrivals"].sum() == live["requests"]

    # metering equals the timeline's integral exactly in the simulation. Live, the
    # sampled timeline differs by at most one sampling gap at each launch and each
    # stop of an instance metered in the window (the bound the benchmark documents)
    assert sim["gb_s"] > 0 and sim["timeline_gb_s"] == pytest.approx(sim["gb_s"], rel=1e-9)
    slack = (
        2 * live["instances_in_window"] * report["largest_instance_gb"] * live["max_sample_gap_s"]
    )
    assert live["gb_s"] > 0 and live["instances_in_window"] >= 2
    assert abs(live["timeline_gb_s"] - live["gb_s"]) <= slack + 1e-6, report

    # the ratios are the figures' own (none where the live figure is 0: e.g. no
    # sharing when every live execution ran alone)
    for key, ratio in report["ratio"].items():
        if live[key]:
            assert ratio == pytest.approx(sim[key] / live[key]), key
        else:
            assert ratio is None, key
    assert report["calibration"]["refit"].startswith("warm-up")

    summary = json.loads((out / "summary.json").read_text())
    assert summary["simulated"]["prediction"] == "gnn_faas"
    for png in ("latency_cdf.png", "rate_instances.png", "memory.png", "cost.png"):
        assert (out / png).stat().st_size > 10_000


def test_bad_arguments_are_clear_errors(capsys):
    assert main(["bench", "live-vs-sim", "--senders", "0"]) == 2
    assert "--senders" in capsys.readouterr().err
    assert main(["bench", "live-vs-sim", "--warmup", "0"]) == 2
    assert "--warmup" in capsys.readouterr().err
