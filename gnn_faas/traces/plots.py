"""PNG plots of a run (matplotlib, Agg backend: no display needed).

- latency CDF per policy (or of the live replay), the SLO marked;
- arrival rate against instances over time;
- allocated (solid) and busy (dashed) memory over time;
- dollars per million requests per policy and price.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


def _plt():
    try:
        import matplotlib
    except ImportError:
        from gnn_faas.errors import MissingExtra

        raise MissingExtra("plots", "traces", "matplotlib") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _smooth(x: np.ndarray, seconds: int) -> np.ndarray:
    if x.size < 3 * seconds or seconds <= 1:
        return x
    return np.convolve(x, np.ones(seconds) / seconds, mode="same")


def _window(n: int) -> int:
    return max(1, n // 600)  # about 600 points per line


def latency_cdf(path: Path, latencies: dict[str, np.ndarray], slo_s: float) -> None:
    """CDFs of each policy's latencies (seconds)."""
    curves = {}
    for name, lat in latencies.items():
        if lat.size == 0:
            continue
        x = np.sort(lat) * 1e3
        y = np.arange(1, x.size + 1) / x.size
        step = max(1, x.size // 2000)
        curves[name] = (x[::step], y[::step])
    latency_cdf_curves(path, curves, slo_s)


def latency_cdf_curves(path: Path, curves: dict[str, tuple], slo_s: float) -> None:
    """CDFs given as ``(ms, fraction at or under it)`` per policy."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, (x, y) in curves.items():
        ax.plot(x, y, label=name)
    ax.axvline(slo_s * 1e3, color="k", ls=":", lw=1, label=f"SLO {slo_s * 1e3:.0f} ms")
    ax.set_xscale("log")
    ax.set_xlabel("latency (ms)")
    ax.set_ylabel("fraction of requests")
    ax.set_title("Latency CDF")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def rate_and_instances(path: Path, timelines: dict[str, dict[str, np.ndarray]]) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    first = next(iter(timelines.values()))
    n = first["arrivals"].size
    w = _window(n)
    minutes = np.arange(n) / 60.0
    ax.fill_between(minutes, _smooth(first["arrivals"].astype(float), w), color="0.85",
                    label="arrivals / s")  # fmt: skip
    ax.set_xlabel("time (min)")
    ax.set_ylabel("arrivals per second")
    ax2 = ax.twinx()
    for name, tl in timelines.items():
        inst = {k: v for k, v in tl.items() if k.startswith("instances")}
        total = np.sum(list(inst.values()), axis=0)
        ax2.plot(np.arange(total.size) / 60.0, _smooth(total, w), label=f"{name} instances")
    ax2.set_ylabel("instances")
    if ax2.get_ylim()[1] > 50:  # one policy's hundreds would flatten the others
        ax2.set_yscale("symlog", linthresh=5)
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    ax.legend(h1 + h2, l1 + l2, loc="upper left", fontsize=8)
    ax.set_title("Arrival rate and instances")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def memory_over_time(path: Path, timelines: dict[str, dict[str, np.ndarray]]) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for i, (name, tl) in enumerate(timelines.items()):
        w = _window(tl["allocated_gb"].size)
        t = np.arange(tl["allocated_gb"].size) / 60.0
        color = f"C{i}"
        ax.plot(t, _smooth(tl["allocated_gb"], w), color=color, label=f"{name} allocated")
        ax.plot(t, _smooth(tl["busy_gb"], w), color=color, ls="--", lw=1, label=f"{name} busy")
    ax.set_xlabel("time (min)")
    ax.set_ylabel("memory (GB)")
    ax.set_title("Memory over time")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def cost_per_policy(path: Path, dollars: dict[str, dict[str, float]]) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    names = list(dollars)
    prices = sorted({k[: -len("_per_million")] for d in dollars.values() for k in d
                     if k.endswith("_per_million")})  # fmt: skip
    width = 0.8 / max(len(prices), 1)
    x = np.arange(len(names))
    for j, price in enumerate(prices):
        vals = [dollars[n].get(f"{price}_per_million", np.nan) for n in names]
        ax.bar(x + j * width, vals, width, label=price)
    ax.set_xticks(x + width * (len(prices) - 1) / 2)
    ax.set_xticklabels(names, rotation=15)
    ax.set_ylabel("USD per million requests")
    ax.set_title("Cost per policy")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def frontier(path: Path, points: list[dict], baselines: dict[str, dict]) -> None:
    """Mean latency against GB-s per request: gnn_faas's points (one per buffer
    objective, joined in sweep order) beside each baseline's point."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    x = [p["gb_s_per_request"] for p in points]
    y = [p["mean_ms"] for p in points]
    ax.plot(x, y, "o-", color="tab:blue", label="gnn_faas")
    for p in points:
        ax.annotate(p["label"], (p["gb_s_per_request"], p["mean_ms"]), fontsize=7,
                    xytext=(4, 4), textcoords="offset points")  # fmt: skip
    for i, (name, b) in enumerate(sorted(baselines.items())):
        ax.plot([b["gb_s_per_request"]], [b["mean_ms"]], "s", color=f"C{i + 1}", label=name)
    ax.set_xscale("log")
    # 1-2-5 ticks as plain numbers: log minor-tick labels overlap on a narrow axis
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

    xs = x + [b["gb_s_per_request"] for b in baselines.values()]
    ticks = [m * 10.0**e for e in range(-6, 4) for m in (1, 2, 5)]
    ticks = [t for t in ticks if min(xs) / 1.5 <= t <= max(xs) * 1.5] if xs else ticks
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("GB-s per request")
    ax.set_ylabel("mean latency (ms)")
    ax.set_title("Cost against latency: gnn_faas's objectives and the baselines")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
