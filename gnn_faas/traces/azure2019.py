"""Azure Functions Trace 2019: invocations per minute per function.

The original layout is one CSV row per function,
``HashOwner,HashApp,HashFunction,Trigger,<minute>,<minute>,...`` (the shared
sample labels its minute columns 480..959, the full trace 1..1440). Functions
are picked by name (a ``HashFunction`` or a unique prefix of it), by rank of
total invocations (``rank=0``: the busiest), or by FaaS-GNN's rule (frequently
invoked: more than ``10,000`` invocations in the file). Each minute's count is
spread inside its minute (see :func:`gnn_faas.traces.trace.spread`), seeded,
optionally shifted per function by a random offset inside the first minute
(arrivals that pass the end wrap to the start, so counts per function are
kept), and optionally compressed in time by ``speedup`` (shape kept).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gnn_faas.errors import InvalidRequest
from gnn_faas.paths import shared_datasets_dir
from gnn_faas.traces.trace import Trace, TraceFormatError, compress, open_lines, spread

TRACE_FILE = "azure2019_invocations_sample500_min480-959.csv.gz"
HEADER = ("HashOwner", "HashApp", "HashFunction", "Trigger")
FREQUENT_MIN_INVOCATIONS = 10_000  # FaaS-GNN: "frequently invoked" functions


@dataclass(frozen=True)
class InvocationCounts:
    """``counts[f, m]``: invocations of function ``f`` in minute ``minutes[m]``."""

    path: str
    functions: tuple[str, ...]
    apps: tuple[str, ...]
    triggers: tuple[str, ...]
    minutes: np.ndarray
    counts: np.ndarray

    def totals(self) -> np.ndarray:
        return self.counts.sum(axis=1)

    def select(
        self,
        names: Sequence[str] | None = None,
        rank: int | Sequence[int] | None = None,
        frequent: bool = False,
        min_invocations: int = FREQUENT_MIN_INVOCATIONS,
    ) -> np.ndarray:
        """Row indices: by ``names`` (hash or unique prefix), by ``rank`` of total
        invocations (0 = busiest), or every function above ``min_invocations``
        (``frequent``). Default: the busiest function."""
        totals = self.totals()
        by_rank = np.argsort(-totals, kind="stable")
        if names:
            rows = []
            for name in names:
                hit = [i for i, f in enumerate(self.functions) if f.startswith(name)]
                if len(hit) != 1:
                    raise InvalidRequest(
                        f"{self.path}: function {name!r} matches {len(hit)} functions (need 1)"
                    )
                rows.append(hit[0])
            return np.asarray(rows, dtype=np.int64)
        if frequent:
            rows = by_rank[totals[by_rank] > min_invocations]
            if rows.size == 0:
                raise InvalidRequest(
                    f"{self.path}: no function has > {min_invocations} invocations"
                )
            return rows
        ranks = np.atleast_1d(0 if rank is None else np.asarray(rank, dtype=np.int64))
        if ranks.min() < 0 or ranks.max() >= totals.size:
            raise InvalidRequest(f"rank must be in [0, {totals.size})")
        return by_rank[ranks]


def read_counts(path: str | Path | None = None) -> InvocationCounts:
    """Parse the original CSV layout, checking every row."""
    p = Path(path) if path else shared_datasets_dir() / TRACE_FILE
    lines = open_lines(p)
    try:
        _, header = next(lines)
    except StopIteration:
        raise TraceFormatError(p, 1, "empty file (expected a header row)") from None
    cols = header.split(",")
    if tuple(cols[:4]) != HEADER or len(cols) < 5:
        raise TraceFormatError(p, 1, f"header must start with {','.join(HEADER)},<minute>...")
    try:
        minutes = np.asarray([int(c) for c in cols[4:]], dtype=np.int64)
    except ValueError:
        raise TraceFormatError(p, 1, "minute column labels must be integers") from None
    if np.any(np.diff(minutes) != 1):
        raise TraceFormatError(p, 1, "minute columns must be consecutive")
    functions, apps, triggers, rows = [], [], [], []
    for n, line in lines:
        if not line.strip():
            continue
        fields = line.split(",")
        if len(fields) != len(cols):
            raise TraceFormatError(
                p, n, f"expected {len(cols)} fields, found {len(fields)} (truncated row?)"
            )
        try:
            counts = np.asarray(fields[4:], dtype=np.int64)
        except ValueError:
            raise TraceFormatError(p, n, "invocation counts must be integers") from None
        if counts.min() < 0:
            raise TraceFormatError(p, n, "invocation counts must be >= 0")
        functions.append(fields[2])
        apps.append(fields[1])
        triggers.append(fields[3])
        rows.append(counts)
    if not rows:
        raise TraceFormatError(p, None, "no function rows")
    return InvocationCounts(
        str(p), tuple(functions), tuple(apps), tuple(triggers), minutes, np.vstack(rows)
    )


def load(
    path: str | Path | None = None,
    *,
    names: Sequence[str] | None = None,
    rank: int | Sequence[int] | None = None,
    frequent: bool = False,
    spread_method: str = "exponential",
    seed: int = 0,
    random_offset: bool = False,
    speedup: float = 1.0,
    start_minute: int = 0,
    minutes: int | None = None,
) -> Trace:
    """Arrivals of the selected functions over ``minutes`` minutes from column
    ``start_minute`` (all by default), spread inside their minutes."""
    data = read_counts(path)
    rows = data.select(names, rank, frequent)
    end = data.minutes.size if minutes is None else start_minute + int(minutes)
    if not 0 <= start_minute < end <= data.minutes.size:
        raise InvalidRequest(f"minutes window must lie in [0, {data.minutes.size}]")
    rng = np.random.default_rng(seed)
    span = (end - start_minute) * 60.0
    times, owner = [], []
    for k, r in enumerate(rows):
        t = spread(data.counts[r, start_minute:end], 60.0, spread_method, rng)
        if random_offset:
            t = np.sort((t + rng.uniform(0, 60.0)) % span)
        times.append(t)
        owner.append(np.full(t.size, k, dtype=np.int32))
    t = np.concatenate(times)
    f = np.concatenate(owner)
    order = np.argsort(t, kind="stable")
    return Trace(
        name="azure2019",
        arrivals=compress(t[order], speedup),
        function=f[order],
        functions=tuple(data.functions[r] for r in rows),
        duration_s=span / speedup,
        meta={
            "file": data.path,
            "first_minute": int(data.minutes[start_minute]),
            "spread": spread_method,
            "seed": seed,
            "speedup": speedup,
        },
    )
