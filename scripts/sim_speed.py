"""A/B of ``gnn-faas simulate``'s speed: a base commit against this checkout, on one machine.

    python scripts/sim_speed.py --base 493a1b1 --dir var/sim-speed
    python scripts/sim_speed.py --base 493a1b1 --dir var/sim-speed --write   # + docs/results

Runs each command below with the base's package (a detached worktree of ``--base``
under ``--dir``) and with this checkout's, one after the other, never two at once,
with this venv's Python (``python -m gnn_faas`` in a tree imports that tree's package),
its process tree sampled by ``scripts/tree_memory.py``. A run whose ``NAME.json`` and
``NAME.measure.json`` exist in ``--dir`` is not run again (delete them to measure
anew). Prints, per command, both wall times, the speed-up, both peaks of the process
tree's RSS (the policies run in forked processes) and whether the outputs are equal
once their wall-clock fields are set aside. ``--write`` also writes docs/results/simulator-speed.json, which
``make docs-gen`` renders into docs/design/simulator.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

from tree_memory import peak_of  # scripts/ is on sys.path: it holds this script

from gnn_faas.paths import shared_datasets_dir

REPO = Path(__file__).resolve().parents[1]
DAY = ["simulate", "twitter", "--day", "--graph", "bitcoin-otc", "--policies", "all"]
COMMANDS = {  # name -> (arguments, also run on the base)
    "day": (DAY, True),
    "h2": (
        ["simulate", "twitter", "--minutes", "120", "--graph", "bitcoin-otc", "--policies", "all"],
        True,
    ),
    "study": (["simulate", "study", "--day", "--graph", "bitcoin-otc"], True),
    "week": ([*DAY[:2], "--days", "7", *DAY[3:]], False),
}
TAIL = ["--json", "--no-progress"]
SAMPLE_S = 0.2  # how often the process tree's memory is read
# both trees read this checkout's datasets (the base worktree has no ../shared beside it)
ENV = {**os.environ, "GNN_FAAS_DATASETS": str(shared_datasets_dir())}


def measure(name: str, tree: Path, args: list[str], d: Path) -> dict:
    out, meas = d / f"{name}.json", d / f"{name}.measure.json"
    if not (out.is_file() and meas.is_file()):
        print(f"+ ({tree}) gnn-faas {' '.join(args + TAIL)}", file=sys.stderr, flush=True)
        cmd = [sys.executable, "-m", "gnn_faas", *args, *TAIL]
        with out.open("w") as o:
            report = peak_of(cmd, SAMPLE_S, cwd=tree, stdout=o, env=ENV)
        if report["exit"] != 0:  # not kept: a later run measures it anew
            out.unlink()
            raise SystemExit(f"{name} failed (exit {report['exit']})")
        meas.write_text(json.dumps(report))
    report = json.loads(meas.read_text())
    return {**report, "output": out.read_text()}


def comparable(output: str) -> object:
    """The output without what measures the run itself (wall-clock seconds)."""
    try:
        doc = json.loads(output)
    except json.JSONDecodeError:  # study: text tables
        return re.sub(r"simulated in \d+ s", "simulated in N s", output)

    def strip(o: object) -> object:
        if isinstance(o, dict):
            return {k: strip(v) for k, v in o.items() if k != "wall_s"}
        if isinstance(o, list):
            return [strip(v) for v in o]
        return o

    return strip(doc)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--base", required=True, help="the commit to compare against")
    p.add_argument("--dir", default="var/sim-speed", help="outputs, timings and the worktree")
    p.add_argument("--only", default=",".join(COMMANDS), help="which commands (comma-separated)")
    p.add_argument("--write", action="store_true", help="write docs/results/simulator-speed.json")
    args = p.parse_args()
    unknown = sorted(set(args.only.split(",")) - set(COMMANDS))
    if unknown:
        p.error(f"unknown command(s) {', '.join(unknown)}; choose from {', '.join(COMMANDS)}")
    d = Path(args.dir).resolve()
    d.mkdir(parents=True, exist_ok=True)
    base_tree = d / "base"
    if not base_tree.is_dir():
        subprocess.run(["git", "worktree", "add", "--detach", str(base_tree), args.base],
                       cwd=REPO, check=True)  # fmt: skip
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, check=True,
                          capture_output=True, text=True).stdout.strip()  # fmt: skip
    rows = []
    for name in args.only.split(","):
        cmd, on_base = COMMANDS[name]
        new = measure(f"{name}-new", REPO, cmd, d)
        old = measure(f"{name}-base", base_tree, cmd, d) if on_base else None
        same = None
        if old:
            same = "yes" if comparable(old["output"]) == comparable(new["output"]) else "no"
        row = ["gnn-faas " + " ".join(cmd + TAIL),
               round(old["wall_s"], 1) if old else None, round(new["wall_s"], 1),
               round(old["wall_s"] / new["wall_s"], 2) if old else None,
               round(old["peak_tree_rss_mib"]) if old else None, round(new["peak_tree_rss_mib"]), same]  # fmt: skip
        rows.append(row)
        print(json.dumps(dict(zip(["command", "base_s", "new_s", "speedup", "base_peak_mib",
                                   "new_peak_mib", "same_output"], row, strict=True))))  # fmt: skip
    if args.write:
        doc = {
            "title": "gnn-faas simulate before and after the speed work, one machine",
            "command": f"python scripts/sim_speed.py --base {args.base} --dir DIR",
            "conditions": f"base {args.base}, new {head}; one run each, one after the other, on a "
            "quiet 2-core machine; peak: the RSS of the run's whole process tree, sampled every "
            f"{SAMPLE_S:g} s (scripts/tree_memory.py); same output: equal once wall-clock "
            "seconds are set aside",
            "columns": [
                {"name": "command"}, {"name": "base s", "align": "right"},
                {"name": "new s", "align": "right"}, {"name": "speed-up", "align": "right"},
                {"name": "base peak tree MiB", "align": "right"},
                {"name": "new peak tree MiB", "align": "right"}, {"name": "same output"},
            ],
            "rows": rows,
        }  # fmt: skip
        out = REPO / "docs" / "results" / "simulator-speed.json"
        out.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {out.relative_to(REPO)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
