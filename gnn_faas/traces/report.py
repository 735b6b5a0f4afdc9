"""Markdown tables of simulation results."""

from __future__ import annotations


def policy_table(result: dict) -> str:
    rows = [
        f"{result['trace']} on {result['graph']}: {result['requests']:,} requests, "
        f"{result['duration_s'] / 60:.1f} min, simulated in {result['wall_s']:.1f} s",
        "",
        "| policy | p50 ms | p99 ms | SLO violations | GB-s | vCPU-s | cold starts | $ / M req "
        "| storage GETs / req | storage $ / M req |",
        "|---|---:|---:|---:|---:|---:|---:|---|---:|---|",
    ]
    for name, p in result["policies"].items():
        usd = ", ".join(
            f"{k[: -len('_per_million')]} {v:.3f}"
            for k, v in p["dollars"].items()
            if k.endswith("_per_million")
        )
        st = p.get("storage", {})
        st_usd = ", ".join(
            f"{k[: -len('_per_million')]} {v:.3f}"
            for k, v in st.get("dollars", {}).items()
            if k.endswith("_per_million")
        )
        gets = f"{st['gets_per_request']:.2f}" if st else ""
        rows.append(
            f"| {name} | {p['p50_ms']:.1f} | {p['p99_ms']:.1f} | {p['slo_violations']:,} | "
            f"{p['gb_s']:,.0f} | {p['vcpu_s']:,.0f} | {p['cold_starts']:,} | {usd} "
            f"| {gets} | {st_usd} |"
        )
    return "\n".join(rows)
