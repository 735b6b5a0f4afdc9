"""A run directory's files: ``requests.csv``, ``timeline.csv``, ``summary.json``."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

TIMELINE_FIXED = ("second", "arrivals", "completions", "in_flight", "allocated_gb", "busy_gb")


def write_timeline(path: Path, timeline: dict[str, np.ndarray]) -> None:
    """One row per second; columns in ``timeline`` order (instances per function
    as ``instances`` or ``instances_<function>``)."""
    cols = list(timeline)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(cols)
        arrays = [np.asarray(timeline[c]) for c in cols]
        for row in zip(*(a.tolist() for a in arrays), strict=True):
            w.writerow([f"{v:.6g}" if isinstance(v, float) else v for v in row])


def write_requests(path: Path, rows: dict[str, np.ndarray]) -> None:
    cols = list(rows)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(cols)
        for row in zip(*(np.asarray(rows[c]).tolist() for c in cols), strict=True):
            w.writerow([f"{v:.6f}" if isinstance(v, float) else v for v in row])
