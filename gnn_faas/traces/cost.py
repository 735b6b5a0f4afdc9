"""Dollars for a run, from a price file (``gnn_faas/data/prices.yaml``).

Serverless prices bill each function invocation (``d`` seconds on a function
of ``m`` MiB and ``v`` vCPUs), billed duration rounded up to the price's unit
``u`` (Lambda 1 ms, Cloud Run 100 ms): ``d' = ⌈d / u⌉·u``::

    faas  = Σ_inv d'·(m/1024)·(gb_s + gib_s) + Σ_inv d'·v·vcpu_s + invocations·per_million/10⁶

(Lambda bills GB-s only; Cloud Run bills GiB-s and vCPU-s.) Serverful prices
bill a fleet of machines that stays up the whole run, sized to the trace's
peak: ``machines = ⌈peak_vcpus / vcpus_per_machine⌉`` (and enough memory for
the peak GiB), ``serverful = machines·per_hour·hours``.

Storage is billed apart, per policy, beside compute (:func:`storage_dollars`).
A request-priced store (kind ``storage``: S3 Standard) bills each request,
``storage = GETs·get_per_thousand/1000 + PUTs·put_per_thousand/1000``; a
node-priced one (kind ``storage_node``: ElastiCache Redis) bills the nodes
holding the graph for the whole run, ``⌈graph GiB / node GiB⌉·per_hour·hours``,
whatever the requests. How many GETs a policy makes comes from
:func:`policy_storage_requests`.
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
    "storage": ("scheme", "get_per_thousand", "put_per_thousand"),
    "storage_node": ("scheme", "per_hour", "memory_gib"),
}
COMPUTE_KINDS = ("faas", "serverful")
STORAGE_KINDS = ("storage", "storage_node")


@dataclass(frozen=True)
class Price:
    name: str
    kind: str  # "faas", "serverful", "storage" or "storage_node"
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
    scheme: str = ""  # storage prices: the store kind billed (s3, redis)
    get_per_thousand: float = 0.0
    put_per_thousand: float = 0.0

    def request_cost(self, gets: float, puts: float = 0.0) -> float:
        """Dollars of ``gets`` GET and ``puts`` PUT requests (kind ``storage``)."""
        return gets * self.get_per_thousand / 1e3 + puts * self.put_per_thousand / 1e3

    def node_cost(self, duration_s: float, graph_gib: float) -> float:
        """Dollars of the nodes holding ``graph_gib`` for ``duration_s`` (kind ``storage_node``)."""
        nodes = max(1, math.ceil(graph_gib / self.memory_gib - 1e-9))
        return nodes * self.per_hour * duration_s / 3600.0

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
        if price.kind not in COMPUTE_KINDS or (price.kind == "serverful") != serverful:
            continue
        if serverful:
            usd = price.serverful_cost(duration_s, peak_vcpus, peak_gib)
        else:
            usd = price.faas_cost(durations_s, memory_mb, vcpus)
        out[name] = usd
        out[f"{name}_per_million"] = usd / max(requests, 1) * 1e6
    return out


def policy_storage_requests(
    name: str,
    summary: dict,
    *,
    per_fetch: float,
    per_row: float,
    full_download: float,
    rows_per_request: float,
) -> float:
    """GET requests a policy's run makes to the graph store.

    A policy that fetches computation graphs on demand (``gnn_faas``: one fetch
    per buffer execution of the union of its requests' k-hop sets; ``faas_gnn``
    and ``request_centric``: one per request) makes, per fetch of ``r`` rows,
    ``per_fetch + per_row·r`` requests (measured on the store, see
    :func:`gnn_faas.traces.calibration.measure_storage_requests`). Linear in
    ``r``, so summed over the fetches::

        GETs = executions·per_fetch + per_row·Σ rows

    with ``Σ rows = aggregated_rows_per_request·requests`` where the run reports
    it, else ``rows_per_request·executions``. A policy that downloads the whole
    graph at each start (``dgl_serverless``, ``serverful``) makes
    ``cold_starts·full_download`` requests (one GET per blob). Caches are
    ignored: an upper bound for the fetching policies.
    """
    if name in ("dgl_serverless", "serverful"):
        return float(summary["cold_starts"]) * full_download
    executions = float(summary["executions"])
    rows = summary.get("aggregated_rows_per_request")
    total_rows = rows * summary["requests"] if rows is not None else rows_per_request * executions
    return executions * per_fetch + per_row * total_rows


def storage_dollars(
    prices: dict[str, Price], *, gets: float, duration_s: float, graph_gib: float, requests: int
) -> dict[str, float]:
    """Storage dollars under every storage price, and per million requests."""
    out: dict[str, float] = {}
    for name, price in prices.items():
        if price.kind == "storage":
            usd = price.request_cost(gets)
        elif price.kind == "storage_node":
            usd = price.node_cost(duration_s, graph_gib)
        else:
            continue
        out[name] = usd
        out[f"{name}_per_million"] = usd / max(requests, 1) * 1e6
    return out


def storage_price_for(prices: dict[str, Price], scheme: str) -> Price | None:
    """The request-priced storage price of a store kind (``s3``), if the file has one."""
    for price in prices.values():
        if price.kind == "storage" and price.scheme == scheme:
            return price
    return None
