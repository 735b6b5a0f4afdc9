"""Azure Functions Invocation Trace 2021: one row per invocation.

Layout ``app,func,end_timestamp,duration`` (seconds). An invocation starts at
``end_timestamp − duration``: that is its arrival. Arrivals are shifted so the
earliest is at 0 and sorted.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from gnn_faas.paths import shared_datasets_dir
from gnn_faas.traces.trace import Trace, TraceFormatError, compress, open_lines

TRACE_FILE = "azure2021_head998.csv.gz"
HEADER = ("app", "func", "end_timestamp", "duration")


def load(
    path: str | Path | None = None,
    *,
    names: Sequence[str] | None = None,
    speedup: float = 1.0,
) -> Trace:
    """Arrivals ``end_timestamp − duration`` of every function (or those whose
    ``func`` hash starts with one of ``names``)."""
    p = Path(path) if path else shared_datasets_dir() / TRACE_FILE
    lines = open_lines(p)
    try:
        _, header = next(lines)
    except StopIteration:
        raise TraceFormatError(p, 1, "empty file (expected a header row)") from None
    if tuple(header.split(",")) != HEADER:
        raise TraceFormatError(p, 1, f"header must be {','.join(HEADER)}")
    funcs: list[str] = []
    starts: list[float] = []
    for n, line in lines:
        if not line.strip():
            continue
        fields = line.split(",")
        if len(fields) != 4:
            raise TraceFormatError(p, n, f"expected 4 fields, found {len(fields)} (truncated row?)")
        try:
            end, dur = float(fields[2]), float(fields[3])
        except ValueError:
            raise TraceFormatError(p, n, "end_timestamp and duration must be numbers") from None
        if not (math.isfinite(end) and math.isfinite(dur)) or dur < 0:
            raise TraceFormatError(p, n, "duration must be a finite number >= 0")
        funcs.append(fields[1])
        starts.append(end - dur)
    if not starts:
        raise TraceFormatError(p, None, "no invocation rows")
    start = np.asarray(starts)
    fn = np.asarray(funcs)
    if names:
        keep = np.zeros(fn.size, bool)
        for name in names:
            keep |= np.char.startswith(fn.astype(str), name)
        if not keep.any():
            raise TraceFormatError(p, None, f"no invocation of function(s) {list(names)}")
        start, fn = start[keep], fn[keep]
    functions, idx = np.unique(fn, return_inverse=True)
    order = np.argsort(start, kind="stable")
    t = start[order] - start[order[0]]
    return Trace(
        name="azure2021",
        arrivals=compress(t, speedup),
        function=idx[order].astype(np.int32),
        functions=tuple(str(f) for f in functions),
        duration_s=float(np.nextafter(t[-1], np.inf)) / speedup,
        meta={"file": str(p), "speedup": speedup},
    )
