"""Dollars for a run, from a price file (``gnn_faas/data/prices.yaml``).

Serverless prices bill each function invocation (``d`` seconds on a function
of ``m`` MiB and ``v`` vCPUs), billed duration rounded up to the price's unit
``u`` (Lambda 1 ms, Cloud Run 100 ms): ``d' = ⌈d / u⌉·u``::

    faas  = Σ_inv d'·(m/1024)·(gb_s + gib_s) + Σ_inv d'·v·vcpu_s + invocations·per_million/10⁶

(Lambda bills GB-s only; Cloud Run bills GiB-s and vCPU-s.) Serverful prices
bill a fleet of machines that stays up the whole run, sized to the trace's
peak: ``machines = ⌈peak_vcpus / vcpus_per_machine⌉`` (and enough memory for
the peak GiB), ``serverful = machines·per_hour·hours``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from gnn_faas.errors import InvalidRequest, NotFound
from gnn_faas.paths import BUNDLED_DATA

PRICE_FILE = BUNDLED_DATA / "prices.yaml"
REQUIRED = {
    "faas": ("per_million_requests", "billing_ms"),
    "serverful": ("per_hour", "vcpus", "memory_gib"),
}


@dataclass(frozen=True)
class Price:
    name: str
    kind: str  # "faas" or "serverful"
    source: str
    date: str
    gb_s: float = 0.0
    gib_s: float = 0.0
    vcpu_s: float = 0.0
    per_million_requests: float = 0.0
    billing_ms: float = 1.0
    per_hour: float = 0.0
    vcpus: int = 0
    memory_gib: float = 0.0

    def faas_cost(
        self,
        durations_s: np.ndarray,
        memory_mb: np.ndarray | float,
        vcpus: np.ndarray | float = 1.0,
    ) -> float:
        """Σ over invocations (arrays broadcast) as in the module docstring."""
        d = np.asarray(durations_s, dtype=np.float64)
        unit = self.billing_ms / 1e3
        # a tiny epsilon keeps 0.002 s from rounding up to 0.003 s by float error
        billed = np.ceil(d / unit - 1e-9) * unit
        gb = np.asarray(memory_mb, dtype=np.float64) / 1024.0
        v = np.asarray(vcpus, dtype=np.float64)
        # Lambda's GB-s and Cloud Run's GiB-s are both memory MiB / 1024 · s
        memory_rate = self.gb_s + self.gib_s
        compute = float(np.sum(billed * gb)) * memory_rate + float(np.sum(billed * v)) * self.vcpu_s
        return compute + d.size * self.per_million_requests / 1e6

    def machines(self, peak_vcpus: float, peak_gib: float = 0.0) -> int:
        need = max(peak_vcpus / self.vcpus, peak_gib / self.memory_gib if self.memory_gib else 0)
        return max(1, math.ceil(need - 1e-9))

    def serverful_cost(self, duration_s: float, peak_vcpus: float, peak_gib: float = 0.0) -> float:
        return self.machines(peak_vcpus, peak_gib) * self.per_hour * duration_s / 3600.0


def load_prices(path: str | Path | None = None) -> dict[str, Price]:
    p = Path(path) if path else PRICE_FILE
    if not p.is_file():
        raise NotFound(f"price file not found: {p}")
    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError as exc:
        raise InvalidRequest(f"{p}: not YAML ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("prices"), dict):
        raise InvalidRequest(f"{p}: expected a mapping with a 'prices' section")
    out = {}
    fields = set(Price.__dataclass_fields__) - {"name"}
    for name, entry in data["prices"].items():
        if not isinstance(entry, dict):
            raise InvalidRequest(f"{p}: price {name!r} must be a mapping")
        kind = entry.get("kind")
        if kind not in REQUIRED:
            raise InvalidRequest(f"{p}: price {name!r}: kind must be one of {sorted(REQUIRED)}")
        missing = [k for k in ("source", "date", *REQUIRED[kind]) if k not in entry]
        if missing:
            raise InvalidRequest(f"{p}: price {name!r} lacks {missing}")
        extra = set(entry) - fields - {"description"}
        if extra:
            raise InvalidRequest(f"{p}: price {name!r}: unknown field(s) {sorted(extra)}")
        entry = {k: v for k, v in entry.items() if k != "description"}
        entry["date"] = str(entry["date"])
        out[name] = Price(name=name, **entry)
    return out


def dollars(
    prices: dict[str, Price],
    *,
    serverful: bool,
    durations_s: np.ndarray,
    memory_mb: np.ndarray | float,
    vcpus: np.ndarray | float,
    duration_s: float,
    peak_vcpus: float,
    peak_gib: float,
    requests: int,
) -> dict[str, float]:
    """Dollars under every price that fits the policy's kind, plus per million requests.

    A serverless policy is billed per invocation (``durations_s``); a serverful
    one as a peak-sized fleet over ``duration_s``."""
    out: dict[str, float] = {}
    for name, price in prices.items():
        if (price.kind == "serverful") != serverful:
            continue
        if serverful:
            usd = price.serverful_cost(duration_s, peak_vcpus, peak_gib)
        else:
            usd = price.faas_cost(durations_s, memory_mb, vcpus)
        out[name] = usd
        out[f"{name}_per_million"] = usd / max(requests, 1) * 1e6
    return out
