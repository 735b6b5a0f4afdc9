"""``gnn-faas simulate`` against reference output committed from an earlier
version: the figures of a shortened Twitter day (default objective and
``cost``) and of a shortened study day (the Azure Functions 2019 trace under
every policy) stay what they were. Only ``wall_s`` (a measurement, not a
figure) is left out; every other number must agree to 1e-12 relative (in
practice bit for bit: the reductions are numpy's own).

The references are rewritten, when a change means the figures to move, with

    .venv/bin/python -m tests.traces.test_reference_outputs

(on a store prepared as the ``bitcoin_store`` fixture prepares it).
"""

from __future__ import annotations

import io
import json
import math
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from gnn_faas.cli import main

DATA = Path(__file__).parent / "data"

# name -> the command line (without --store); short windows of the two day
# commands (`simulate twitter --day`, `simulate study --day`)
RUNS = {
    "twitter_balanced": [
        "simulate", "twitter", "--minutes", "6", "--start-minute", "450", "--warmup", "60",
        "--policies", "all", "--json",
    ],
    # from cold, with a request timeout short enough to drop requests behind cold starts
    "twitter_cost": [
        "simulate", "twitter", "--minutes", "4", "--start-minute", "450", "--objective", "cost",
        "--request-timeout", "1", "--policies", "all", "--json",
    ],
    "study_azure2019": [
        "simulate", "azure2019", "--minutes", "4", "--start-minute", "120", "--warmup", "30",
        "--policies", "all", "--json",
    ],
}  # fmt: skip


def run_json(argv: list[str], store: str) -> dict:
    out = io.StringIO()
    with redirect_stdout(out):
        code = main([*argv, "--store", store])
    assert code == 0
    return json.loads(out.getvalue())


def strip_wall(x):
    """``x`` without its ``wall_s`` entries (measured seconds, not figures) and
    its run directory (``out``)."""
    if isinstance(x, dict):
        return {k: strip_wall(v) for k, v in x.items() if k not in ("wall_s", "out")}
    if isinstance(x, list):
        return [strip_wall(v) for v in x]
    return x


def differences(got, want, path: str = "") -> list[str]:
    """Where ``got`` and ``want`` differ: keys, types, strings and integers
    exactly, floats beyond 1e-12 relative."""
    if isinstance(want, dict) and isinstance(got, dict):
        out = [f"{path}/{k}: missing" for k in want if k not in got]
        out += [f"{path}/{k}: unexpected" for k in got if k not in want]
        for k in want:
            if k in got:
                out += differences(got[k], want[k], f"{path}/{k}")
        return out
    if isinstance(want, list) and isinstance(got, list) and len(want) == len(got):
        return [
            d for i, (g, w) in enumerate(zip(got, want)) for d in differences(g, w, f"{path}[{i}]")
        ]
    if isinstance(want, float) and isinstance(got, (int, float)) and not isinstance(got, bool):
        if math.isclose(got, want, rel_tol=1e-12, abs_tol=1e-12):
            return []
        return [f"{path}: {got!r} != {want!r}"]
    if type(got) is not type(want) or got != want:
        return [f"{path}: {got!r} != {want!r}"]
    return []


@pytest.mark.parametrize("name", sorted(RUNS))
def test_figures_match_reference(name, bitcoin_store):
    want = json.loads((DATA / f"reference_{name}.json").read_text())
    got = strip_wall(run_json(RUNS[name], bitcoin_store))
    assert got["requests"] > 5_000  # the window is busy enough to share and queue
    assert differences(got, want) == []


def test_run_directory_timelines_match_reference(bitcoin_store, tmp_path):
    """The run directory's per-second timelines (as written, ``%.6g``) of the
    cost run, which starts cold and drops requests."""
    got = strip_wall(run_json([*RUNS["twitter_cost"], "--out", str(tmp_path)], bitcoin_store))
    want = json.loads((DATA / "reference_twitter_cost.json").read_text())
    assert differences(got, want) == []
    names = sorted(p.name for p in (DATA / "timelines_twitter_cost").iterdir())
    assert names == [f"timeline_{p}.csv" for p in sorted(want["policies"])]
    for name in names:
        assert (tmp_path / name).read_text() == (DATA / "timelines_twitter_cost" / name).read_text()


def test_differences_sees_a_moved_figure():
    want = {"p": {"a": 1.0, "b": [1, "x"], "c": 2}}
    assert differences(want, want) == []
    assert differences({"p": {"a": 1.0 + 1e-9, "b": [1, "x"], "c": 2}}, want) == [
        f"/p/a: {1.0 + 1e-9!r} != 1.0"
    ]
    assert differences({"p": {"a": 1.0, "b": [1, "y"], "c": 3}}, want) == [
        "/p/b[1]: 'y' != 'x'",
        "/p/c: 3 != 2",
    ]


if __name__ == "__main__":  # pragma: no cover - rewrites the references
    import tempfile

    from gnn_faas.storage.datasets import prepare_dataset

    store = f"file://{tempfile.mkdtemp(prefix='bitcoin-store-')}"
    prepare_dataset(store, "bitcoin-otc", feature_dim=4)  # as tests/traces/conftest.py
    for name, argv in RUNS.items():
        result = strip_wall(run_json(argv, store))
        (DATA / f"reference_{name}.json").write_text(
            json.dumps(result, indent=1, sort_keys=True) + "\n"
        )
        print(name, result["requests"], "requests")
    timelines = DATA / "timelines_twitter_cost"
    timelines.mkdir(exist_ok=True)
    run_json([*RUNS["twitter_cost"], "--out", str(timelines)], store)
    for path in timelines.iterdir():
        if not path.name.startswith("timeline_"):
            path.unlink()
