"""Azure Functions 2021 loader: arrival = end_timestamp − duration, sorted; bad files named."""

from __future__ import annotations

import csv
import gzip

import numpy as np
import pytest

from gnn_faas.paths import shared_datasets_dir
from gnn_faas.traces import azure2021
from gnn_faas.traces.trace import TraceFormatError


def test_start_time_rule_on_the_real_file():
    tr = azure2021.load()
    with gzip.open(shared_datasets_dir() / azure2021.TRACE_FILE, "rt") as f:
        rows = list(csv.DictReader(f))
    start = np.sort([float(r["end_timestamp"]) - float(r["duration"]) for r in rows])
    assert tr.requests == len(rows) == 998
    np.testing.assert_allclose(tr.arrivals, start - start[0])
    assert len(tr.functions) == 49
    one = tr.functions[0]
    sub = azure2021.load(names=[one[:10]])
    assert set(sub.functions) == {one}
    assert sub.requests == sum(r["func"] == one for r in rows)


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("app,func,end_timestamp,duration\na,f,1.0,0.5\na,f,2.0\n", 3),
        ("app,func,end_timestamp,duration\na,f,1.0,abc\n", 2),
        ("app,func,end_timestamp,duration\na,f,1.0,-1\n", 2),
        ("app,func,end\n", 1),
    ],
)
def test_bad_files_are_named(tmp_path, text, line):
    p = tmp_path / "inv.csv"
    p.write_text(text)
    with pytest.raises(TraceFormatError, match=rf"inv\.csv, line {line}:"):
        azure2021.load(p)
