"""Resident memory of every process of a running stack (gateway and function instances),
and of one process tree (:func:`tree_memory`).

Processes are found by the PIDs the stack itself reports: the ``gnn-faas up``
process (gunicorn master) and its worker, and each function instance's PID
from ``/v1/status`` with its gunicorn workers. Never by name: other stacks may
run beside this one.
"""

from __future__ import annotations

import psutil

MIB = 2**20


def _rss(proc: psutil.Process) -> int:
    try:
        return int(proc.memory_info().rss)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return 0


def stack_rss(gateway_pid: int, status: dict) -> dict[str, float]:
    """``{label: RSS MiB}``: ``gateway_master``, ``gateway_worker`` (the busiest-by-RSS
    worker), and per instance ``<instance id>`` (its worker; the master of a
    function is small and constant)."""
    out: dict[str, float] = {}
    try:
        master = psutil.Process(gateway_pid)
        workers = master.children(recursive=False)
    except psutil.NoSuchProcess:
        return out
    out["gateway_master"] = _rss(master) / MIB
    if workers:
        out["gateway_worker"] = max(_rss(w) for w in workers) / MIB
    for inst in status.get("instances", []):
        if inst.get("state") in ("stopped", "failed") or not inst.get("pid"):
            continue
        try:
            proc = psutil.Process(int(inst["pid"]))
            kids = proc.children(recursive=True)
        except psutil.NoSuchProcess:
            continue
        procs = kids or [proc]
        out[inst["id"]] = max(_rss(p) for p in procs) / MIB
    return out


def by_role(rss: dict[str, float]) -> dict[str, float]:
    """Summed MiB per role: ``gateway``, ``memory``, ``compute`` functions."""
    roles = {"gateway": 0.0, "memory": 0.0, "compute": 0.0}
    for label, mib in rss.items():
        if label.startswith("gateway"):
            roles["gateway"] += mib
        elif "-memory-" in label:
            roles["memory"] += mib
        elif "-compute-" in label:
            roles["compute"] += mib
    return roles


def tree_memory(pid: int) -> tuple[int, int, int]:
    """``(rss, pss)`` bytes summed over a process and its descendants, and the
    largest RSS of one descendant (the worker)."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0, 0, 0
    rss = pss = worker = 0
    for p in procs:
        try:
            info = p.memory_full_info()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        rss += info.rss
        pss += getattr(info, "pss", info.rss)
        if p.pid != pid:
            worker = max(worker, info.rss)
    return rss, pss, worker
