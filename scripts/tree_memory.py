"""Run a command and report the peak memory of its whole process tree.

``/usr/bin/time -v`` reports the largest single process's peak RSS; a
simulation whose policies run in forked processes needs the sum over the
tree. This samples every process descended from the command every
``--every`` seconds (RSS and PSS from /proc; PSS counts pages a fork shares
once) and prints one JSON line on stderr at the end:

    python scripts/tree_memory.py -- gnn-faas simulate twitter --days 7 --json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


def tree(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += children.get(pid, [])
    return out


def memory_kb(pid: int) -> tuple[int, int]:
    """(RSS, PSS) in KiB of one process (0, 0 once it is gone)."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return 0, 0
    vals = {line.split(":")[0]: int(line.split()[1]) for line in text.splitlines()[1:]}
    return vals.get("Rss", 0), vals.get("Pss", 0)


def peak_of(cmd: list[str], every: float = 1.0, **popen: Any) -> dict:
    """Run ``cmd`` (``popen``: Popen's keywords) to its end, sampling its process
    tree every ``every`` seconds: wall seconds, exit status, peak RSS and PSS of
    the tree (MiB) and the most processes seen at once."""
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, **popen)
    peak_rss = peak_pss = peak_procs = 0
    while proc.poll() is None:
        pids = tree(proc.pid)
        rss, pss = map(sum, zip(*(memory_kb(pid) for pid in pids), strict=True))
        peak_rss, peak_pss = max(peak_rss, rss), max(peak_pss, pss)
        peak_procs = max(peak_procs, len(pids))
        time.sleep(every)
    return {"wall_s": round(time.monotonic() - t0, 1), "exit": proc.returncode,
            "peak_tree_rss_mib": round(peak_rss / 1024, 1),
            "peak_tree_pss_mib": round(peak_pss / 1024, 1), "processes": peak_procs}  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--every", type=float, default=1.0)
    p.add_argument("command", nargs=argparse.REMAINDER)
    args = p.parse_args()
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    report = peak_of(cmd, args.every)
    print(json.dumps(report), file=sys.stderr)
    return report["exit"]


if __name__ == "__main__":
    sys.exit(main())
