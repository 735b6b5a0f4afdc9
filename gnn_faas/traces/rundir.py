"""A run directory's files: ``requests.csv``, ``timeline.csv``, ``summary.json``,
and a simulation's per-request records (``requests_<policy>.npy``)."""

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


def read_timeline(path: Path) -> dict[str, np.ndarray]:
    """A timeline :func:`write_timeline` wrote (each column as numbers)."""
    with open(path, newline="") as f:
        cols = next(csv.reader(f))
    data = np.loadtxt(path, delimiter=",", skiprows=1, ndmin=2)
    return {c: data[:, i] for i, c in enumerate(cols)}


def write_requests(path: Path, rows: dict[str, np.ndarray]) -> None:
    cols = list(rows)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(cols)
        for row in zip(*(np.asarray(rows[c]).tolist() for c in cols), strict=True):
            w.writerow([f"{v:.6f}" if isinstance(v, float) else v for v in row])


RECORD = np.dtype(
    [("arrival_s", "<f8"), ("done_s", "<f8"), ("dropped", "?"), ("cold", "?"),
     ("buffer_wait_s", "<f8"), ("sharing", "<f8")]
)  # fmt: skip


class RequestRecords:
    """A simulated policy's requests, one record each (:data:`RECORD`: arrival,
    completion (inf when dropped), dropped, waited for a cold start, buffer
    wait, its buffer's sharing degree), streamed in request order into an
    ``.npy`` file (``np.load(path, mmap_mode="r")`` reads it; no pickle)."""

    def __init__(self, path: Path, total: int, timeout_s: float):
        self.path, self.total, self.timeout_s = Path(path), int(total), float(timeout_s)
        self.written = 0
        with open(self.path, "wb") as f:
            np.lib.format.write_array_header_1_0(
                f,
                {
                    "descr": np.lib.format.dtype_to_descr(RECORD),
                    "fortran_order": False,
                    "shape": (self.total,),
                },  # fmt: skip
            )

    def write(self, arrival, done, cold, buffer_wait, sharing) -> None:
        rec = np.zeros(arrival.size, RECORD)
        dropped = done - arrival > self.timeout_s
        rec["arrival_s"], rec["done_s"] = arrival, np.where(dropped, np.inf, done)
        rec["dropped"], rec["cold"], rec["buffer_wait_s"] = dropped, cold, buffer_wait
        rec["sharing"] = sharing if sharing is not None else 0.0
        with open(self.path, "ab") as f:
            f.write(rec.tobytes())
        self.written += rec.size

    def close(self) -> None:
        if self.written != self.total:
            raise RuntimeError(f"{self.path}: {self.written} of {self.total} records written")
