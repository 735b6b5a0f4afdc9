"""Azure Functions 2019 loader on the real sample: per-minute counts kept
exactly, arrivals inside their minute, seeds, selection rules, bad files named."""

from __future__ import annotations

import gzip

import numpy as np
import pytest

from gnn_faas.errors import InvalidRequest
from gnn_faas.paths import shared_datasets_dir
from gnn_faas.traces import azure2019
from gnn_faas.traces.trace import TraceFormatError


@pytest.fixture(scope="module")
def counts():
    return azure2019.read_counts()


def test_reads_the_original_layout(counts):
    with np.load(shared_datasets_dir() / "azure2019_sample500.npz", allow_pickle=False) as z:
        np.testing.assert_array_equal(counts.counts, z["counts"])
        np.testing.assert_array_equal(counts.minutes, z["minute"])
        assert counts.functions == tuple(z["hash_function"])
    assert counts.counts.sum() == 3_037_902


@pytest.mark.parametrize("method", ["exponential", "uniform", "equidistant"])
def test_counts_per_minute_preserved(counts, method):
    tr = azure2019.load(rank=[0, 3], spread_method=method, seed=4, minutes=30, start_minute=10)
    rows = counts.select(rank=[0, 3])
    for k, r in enumerate(rows):
        t = tr.arrivals[tr.function == k]
        per_min = np.bincount((t // 60).astype(int), minlength=30)
        np.testing.assert_array_equal(per_min, counts.counts[r, 10:40])
    assert tr.duration_s == 1800.0 and np.all(np.diff(tr.arrivals) >= 0)
    again = azure2019.load(rank=[0, 3], spread_method=method, seed=4, minutes=30, start_minute=10)
    np.testing.assert_array_equal(tr.arrivals, again.arrivals)


def test_selection_rules(counts):
    totals = counts.totals()
    busiest = azure2019.load(minutes=1)
    assert busiest.functions == (counts.functions[int(np.argmax(totals))],)
    frequent = counts.select(frequent=True)
    assert frequent.size == int((totals > 10_000).sum()) and totals[frequent].min() > 10_000
    name = counts.functions[7][:12]
    assert azure2019.load(names=[name], minutes=2).functions == (counts.functions[7],)
    with pytest.raises(InvalidRequest, match="matches 0"):
        counts.select(names=["zzzz"])
    with pytest.raises(InvalidRequest):
        counts.select(rank=10_000)


def test_offset_and_speedup_keep_counts(counts):
    a = azure2019.load(rank=1, random_offset=True, seed=2, minutes=20)
    assert a.requests == counts.counts[counts.select(rank=1)[0], :20].sum()
    assert a.arrivals.max() < 1200
    fast = azure2019.load(rank=1, minutes=20, speedup=4.0)
    assert fast.requests == a.requests and fast.duration_s == 300.0 and fast.arrivals.max() < 300


def _write(path, text):
    with gzip.open(path, "wt") as f:
        f.write(text)


@pytest.mark.parametrize(
    ("text", "line", "what"),
    [
        ("HashOwner,HashApp,HashFunction,Trigger,1,2\na,b,c,http,1,2\na,b,d,http,3\n", 3, "fields"),
        ("HashOwner,HashApp,HashFunction,Trigger,1,2\na,b,c,http,1,x\n", 2, "integers"),
        ("HashOwner,HashApp,HashFunction,Trigger,1,2\na,b,c,http,1,-2\n", 2, ">= 0"),
        ("Owner,App\n", 1, "header"),
        ("", 1, "empty"),
    ],
)
def test_bad_files_are_named(tmp_path, text, line, what):
    p = tmp_path / "bad.csv.gz"
    _write(p, text)
    with pytest.raises(TraceFormatError, match=rf"bad\.csv\.gz, line {line}: .*{what}"):
        azure2019.read_counts(p)
