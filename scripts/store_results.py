"""Turn the JSON of scripts/bench_stores.py runs into docs/results tables.

    python scripts/store_results.py e2e DIR          # DIR/e2e-{file,s3,redis}.json
    python scripts/store_results.py overload DIR     # DIR/overload-{file,s3,redis}.json
    python scripts/store_results.py rtt DIR FILE_DIR # DIR/e2e-s3*.json against the file run
    python scripts/store_results.py outage DIR       # DIR/outage-{s3,redis}.json
    python scripts/store_results.py updates DIR...   # DIR/updates-{file,s3,redis}.json
    python scripts/store_results.py updates-scale DIR...  # higgs-twitter-like runs, same names
    python scripts/store_results.py update-faults DIR  # DIR/update-faults-{file,s3,redis}.json

Each writes docs/results/store-KIND.json (updates: graph-updates.json, updates-scale:
graph-updates-scale.json, update-faults: graph-update-faults.json; title, command, conditions, columns, rows), which
scripts/gen_docs.py renders into docs/benchmarks.md.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "docs" / "results"
STORES = ("file", "s3", "redis")


def _load(path: Path) -> dict:
    return json.loads(path.read_text())


def _runs(d: Path, kind: str, stores=STORES):
    """``(store, run)`` of each ``d/KIND-STORE.json`` present, in ``stores``' order."""
    for store in stores:
        path = d / f"{kind}-{store}.json"
        if path.is_file():
            yield store, _load(path)


def _write(name: str, doc: dict) -> None:
    (OUT / f"{name}.json").write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote docs/results/{name}.json")


def _rates(run: dict) -> dict:
    """A run's figures by rate (a one-rate run has them at the top)."""
    if "rates" in run:
        return run
    return {**run, "rates": {f"{run['rps']:g}": run}}


def e2e(d: Path, name: str = "store-e2e") -> None:
    runs = {s: _rates(run) for s, run in _runs(d, "e2e")}
    rows = []
    for rate in runs["file"]["rates"]:
        base = runs["file"]["rates"][rate]["gnn_faas"]
        for store, run in runs.items():
            g = run["rates"][rate]["gnn_faas"]
            rows.append([
                float(rate), store, round(g["p50_ms"], 1), round(g["p99_ms"], 1),
                round(g["p50_ms"] - base["p50_ms"], 1), round(g["p99_ms"] / base["p99_ms"], 2),
                g["shed"], g["slo_violations"],
                round(run["rates"][rate]["request_centric"]["p50_ms"], 1)
                if "request_centric" in run["rates"][rate] else None,
            ])  # fmt: skip
    _write(name, {
        "title": "gnn_faas on the file store, S3 (moto) and Redis, same command, one run each",
        "command": runs["file"]["command"].replace(runs["file"]["store"], "URI")
        + "  (python scripts/bench_stores.py --out DIR e2e -- ...)",
        "conditions": f"Bitcoin OTC, GCN, SLO 300 ms, {runs['file']['duration_s']:g} s of the "
        "Twitter trace per rate, "
        "2-core machine shared with other work; S3 is moto (scripts/moto_ranged_server.py) "
        "and Redis redis-server, both on loopback; request_centric's p50 beside (no cache: "
        "it reads the store on every request)",
        "columns": [
            {"name": "req/s", "align": "right", "group": True}, {"name": "store"},
            {"name": "p50 ms", "align": "right"}, {"name": "p99 ms", "align": "right"},
            {"name": "p50 - file", "align": "right"}, {"name": "p99 / file", "align": "right"},
            {"name": "shed", "align": "right"}, {"name": "SLO violations", "align": "right"},
            {"name": "request_centric p50 ms", "align": "right"},
        ],
        "rows": rows,
    })  # fmt: skip


def overload(d: Path) -> None:
    rows = []
    for store, run in _runs(d, "overload"):
        for step in run["steps"]:
            c = step["client"]
            rows.append([store, step["rate"], round(step["admitted_rps"], 1),
                         round(c["p99_ms"], 1), c["shed"], c["slo_violations"]])  # fmt: skip
    _write("store-overload", {
        "title": "Saturation on each store: admitted throughput per step",
        "command": "gnn-faas bench overload --rates 40,100,200,400 --step-seconds 15 --store URI",
        "conditions": "Bitcoin OTC, graph sharing, 2 instances per function, admission on; "
        "2-core machine shared with other work",
        "columns": [
            {"name": "store", "group": True}, {"name": "offered req/s", "align": "right"},
            {"name": "admitted req/s", "align": "right"}, {"name": "p99 ms", "align": "right"},
            {"name": "shed", "align": "right"}, {"name": "SLO violations", "align": "right"},
        ],
        "rows": rows,
    })  # fmt: skip


def rtt(d: Path, file_dir: Path) -> None:
    base = _rates(_load(file_dir / "e2e-file.json"))
    rows = []
    for path in sorted(d.glob("e2e-*.json")):
        run = _load(path)
        for rate, v in run["rates"].items():
            g = v["gnn_faas"]
            b = base["rates"].get(rate, {}).get("gnn_faas")
            rows.append([run["store_kind"], run["store_rtt_ms"], float(rate),
                         round(g["p50_ms"], 1), round(g["p99_ms"], 1),
                         None if b is None else round(g["p50_ms"] - b["p50_ms"], 1)])  # fmt: skip
    _write("store-rtt", {
        "title": "Round-trip time added to every store call (a delaying proxy)",
        "command": "gnn-faas bench e2e --rps 1,10 --duration 30 --modes gnn_faas --store URI "
        "--store-rtt-ms MS",
        "conditions": "Bitcoin OTC, GCN; ~20 ms models an in-region S3, ~1 ms Redis; the "
        "file store's p50 from the run beside it",
        "columns": [
            {"name": "store", "group": True}, {"name": "added RTT ms", "align": "right"},
            {"name": "req/s", "align": "right"}, {"name": "p50 ms", "align": "right"},
            {"name": "p99 ms", "align": "right"}, {"name": "p50 - file", "align": "right"},
        ],
        "rows": rows,
    })  # fmt: skip


def outage(d: Path) -> None:
    rows = []
    for store, run in _runs(d, "outage", ("s3", "redis")):
        for phase in ("before", "hang", "after"):
            p = run["phases"][phase]
            rows.append([store, phase, p["requests"], p["ok"], p["store_503"], p["other"],
                         round(p["max_latency_s"], 2)])  # fmt: skip
        rows.append([store, "verdict", run["liveness"]["probes"],
                     f"liveness max {run['liveness']['max_s'] * 1e3:.0f} ms",
                     f"wrong {run['wrong_answers']}",
                     f"late {run['answered_later_than_timeout_plus_1s']}",
                     f"recovered {run['recovered_after_s']:.1f} s"])  # fmt: skip
    _write("store-outage", {
        "title": "A store that hangs for 40 s under 20 req/s",
        "command": "gnn-faas bench outage --store URI --rps 20 --before 10 --hang 40 --after 20",
        "conditions": "Bitcoin OTC, GCN, request_timeout_s 30, the structure resident (the "
        "default budget) and memory functions warm; a proxy stops forwarding for 40 s",
        "columns": [
            {"name": "store", "group": True}, {"name": "phase"}, {"name": "requests", "align": "right"},
            {"name": "200", "align": "right"}, {"name": "503 naming the store", "align": "right"},
            {"name": "other", "align": "right"}, {"name": "max latency s", "align": "right"},
        ],
        "rows": rows,
    })  # fmt: skip


def updates(*dirs: Path) -> None:
    """Rows per store, then per run: DIR/updates-STORE.json (any stores) in each of ``dirs``."""
    runs = [run for store in STORES for d in dirs for _, run in _runs(d, "updates", (store,))]
    rows = []
    for run in runs:
        store = run["store_kind"]
        pyg = run["pyg"]
        diff = max(max(c["max_abs_diff"]) for c in pyg.values())
        wrong = sum(c["wrong_answers"] for c in pyg.values())
        segments = run["compaction"].get("result", {}).get("segments_folded")
        rows.append([
            store, round(run["update_rate"]) if run["update_rate"] else "as acknowledged",
            round(run["updates_per_s"]), round(run["ack_p50_ms"], 1),
            round(run["ack_p99_ms"], 1), round(run["freshness_p99_s_writer_gateway"], 2),
            round(run["freshness_p99_s_second_gateway"], 2),
            round(run["infer_p99_ms_without_updates"], 1),
            round(run["infer_p99_ms_with_updates"], 1), round(run["infer_p99_ratio"], 2),
            _gateway_ratio(run), f"{run['duration_s']:g} ({run['rounds']})",
            float(f"{diff:.1e}"), wrong, round(run["compaction_s"], 2), segments,
            round(run["compaction_peak_mib"]), run["failed_requests"]
            + (run["failed_requests_during_compaction"] or 0),
        ])  # fmt: skip
    first = runs[0]
    _write("graph-updates", {
        "title": "Bitcoin OTC changing while served: its later edges streamed as updates",
        "command": first["command"].replace(first["store"], "URI")
        + "  (python scripts/bench_stores.py --out DIR updates -- ...)",
        "conditions": f"GCN; the graph as of a cut-off, then its {first['stream_edges']:,} later "
        f"edges added and removed in turn in batches of {first['batch']:,}, each as soon as the "
        "last was acknowledged or at the offered rate (--update-rate), "
        f"{first['rps']:g} req/s to the writer's gateway and "
        f"{first['reader_rps']:g} to a second gateway on the same store, freshness_s "
        f"{first['freshness_s']:g}; windows without and with the stream in turn, the stream "
        "posted by a process of its own (seconds of each kind and rounds as the row says; "
        "inference p99 on the writer's gateway over them, as the client measured it and as "
        "the gateway did); then gnn-faas graph compact under load; PyG on the final graph "
        "for sampled targets on both gateways; one run per row on a 2-core machine; S3 is "
        "moto, Redis redis-server, both on loopback",
        "columns": [
            {"name": "store", "group": True}, {"name": "offered edges/s", "align": "right"},
            {"name": "edge updates/s", "align": "right"},
            {"name": "ack p50 ms", "align": "right"}, {"name": "ack p99 ms", "align": "right"},
            {"name": "freshness p99 s (writer)", "align": "right"},
            {"name": "freshness p99 s (second gateway)", "align": "right"},
            {"name": "p99 ms without", "align": "right"}, {"name": "p99 ms with", "align": "right"},
            {"name": "p99 ratio", "align": "right"},
            {"name": "p99 ratio (gateway's own)", "align": "right"},
            {"name": "s of each (rounds)", "align": "right"},
            {"name": "max abs diff to PyG", "align": "right"},
            {"name": "wrong answers", "align": "right"}, {"name": "compaction s", "align": "right"},
            {"name": "segments folded", "align": "right"}, {"name": "compaction peak MiB", "align": "right"},
            {"name": "failed requests", "align": "right"},
        ],
        "rows": rows,
    })  # fmt: skip


def _gateway_ratio(run: dict) -> float | str:
    """The p99 ratio of the latencies the writer's gateway measured itself ("-":
    a run from before the benchmark recorded them)."""
    w = run["infer_with_updates"][0].get("gateway_p99_ms")
    wo = run["infer_without_updates"][0].get("gateway_p99_ms")
    return round(w / wo, 2) if w and wo else "-"


def _right(*names: str) -> list[dict]:
    """Right-aligned (numeric) columns of a table."""
    return [{"name": n, "align": "right"} for n in names]


def _counts(hits: dict[str, int]) -> str:
    """``{"published": 3, "before ...": 7}`` -> ``"before ... 7, published 3"``."""
    return ", ".join(f"{k} {v}" for k, v in sorted(hits.items()))


def updates_scale(*dirs: Path) -> None:
    """The compaction target at scale: bench updates --graph higgs-twitter-like runs."""
    rows, first = [], None
    for d in dirs:
        for store, run in _runs(d, "updates"):
            first = first or run
            pyg = run["pyg"]
            during = run["infer_during_compaction"]
            rows.append([
                store, f"{run['graph_info']['num_edges'] - run['updates_acked']:,}",
                run["updates_acked"], round(run["updates_per_s"]),
                round(run["infer_p99_ms_without_updates"]),
                round(run["infer_p99_ms_with_updates"]), round(run["compaction_s"], 2),
                round(run["compaction_wall_s"], 2), round(run["compaction_peak_mib"]),
                during["ok"], during["failed"], run["failed_requests"],
                float(f"{max(max(c['max_abs_diff']) for c in pyg.values()):.1e}"),
                sum(c["wrong_answers"] for c in pyg.values()),
            ])  # fmt: skip
    _write("graph-updates-scale", {
        "title": "higgs-twitter-like changing while served: 1M edge updates, then compaction",
        "command": first["command"].replace(first["store"], "URI"),
        "conditions": f"GCN on the synthetic graph shaped like SNAP higgs-twitter; the "
        f"{first['stream_edges']:,} Higgs events hashed onto its vertices added again and "
        "again (multi-edges) in batches of "
        f"{first['batch']:,} as fast as acknowledged, {first['rps']:g} req/s to the writer's "
        f"gateway ({first['reader_rps']:g} to a second one): full 2-hop neighbourhoods of this "
        "graph's hubs take seconds per request on two cores, so the load is light; then "
        "gnn-faas graph compact in a subprocess while "
        "the load goes on (its own seconds, wall seconds and peak RSS); PyG on the final "
        "graph for sampled targets, before and after compaction; 2-core machine",
        "columns": [
            {"name": "store"},
            *_right("base edges", "edge updates", "edge updates/s", "p99 ms without",
                    "p99 ms with", "compaction s", "compaction wall s", "compaction peak MiB",
                    "answered during compaction", "failed during compaction",
                    "failed requests", "max abs diff to PyG", "wrong answers"),
        ],
        "rows": rows,
    })  # fmt: skip


def update_faults(d: Path) -> None:
    rows = []
    for store, run in _runs(d, "update-faults"):
        w, c, cw = run["writer"], run["compaction"], run["concurrent_writers"]
        rows.append([
            store, w["kills"], _counts(w["hits"]), c["kills"], _counts(c["hits"]),
            len(run["violations"]), c["verify_failures"], c["leftover_bases"],
            run["served"]["wrong_answers"], float(f"{max(run['served']['max_abs_diff']):.1e}"),
            cw["batches"], cw["acknowledged"], "yes" if cw["none_lost"] else "no",
            round(cw["commits_per_s"]),
        ])  # fmt: skip
    _write("graph-update-faults", {
        "title": "Writers and compactions killed mid-flight, and two writers racing",
        "command": "gnn-faas bench update-faults --store URI  "
        "(python scripts/bench_stores.py --out DIR update-faults --)",
        "conditions": "Bitcoin OTC as of a cut-off; each writer (gnn-faas graph update) and "
        "each compaction SIGKILLed at a random moment or right after a write step, what the "
        "kill hit as the store shows it after; after each kill a fresh reader must hold "
        "exactly the base plus the committed batches (acknowledged ones always, a killed one "
        "all or nothing) and gnn-faas datasets verify must pass (violations: either failed); "
        "then a gateway's answers against PyG; then two processes committing one-edge batches "
        "at once; quiet 2-core machine, S3 is moto and Redis redis-server on loopback",
        "columns": [
            {"name": "store"}, *_right("writer kills"), {"name": "the writers' kills hit"},
            *_right("compaction kills"), {"name": "the compactions' kills hit"},
            *_right("violations", "verify failures", "leftover bases", "wrong answers",
                    "max abs diff to PyG", "racing batches", "acknowledged"),
            {"name": "none lost"}, *_right("commits/s"),
        ],
        "rows": rows,
    })  # fmt: skip


def main() -> int:
    kind, *dirs = sys.argv[1:]
    kinds = {"e2e": e2e, "low": lambda d: e2e(d, "store-low-rate"), "overload": overload,
             "rtt": rtt, "outage": outage, "updates": updates, "updates-scale": updates_scale,
             "update-faults": update_faults}  # fmt: skip
    kinds[kind](*map(Path, dirs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
