"""Figures of ``gnn-faas bench updates``: freshness, the PyG reference, compaction, memory.

- :func:`answers_at` and :func:`freshness`: an update acknowledged at ``t``
  with version ``v`` is fresh at the first answer (completed, by time) whose
  ``parameters.graph_version >= v``; its freshness is that answer's end minus
  ``t`` (0 when one ended before the acknowledgement arrived). With the
  answers sorted by end time and the running maximum of their versions, the
  first such answer is one ``searchsorted`` per acknowledged version.
- :func:`reference_scores`: PyG on the graph as an edge list (no store code),
  on the edges into the ``L``-hop in-neighbourhood of the targets only
  (every degree inside it exact, so the targets' outputs are), so a 15M-edge
  graph needs no whole-graph forward pass.
- :func:`run_compaction`: ``gnn-faas graph compact`` in a subprocess, its own
  peak RSS and CPU from ``wait4``.
- :class:`RssSampler`: the stack's processes' RSS, polled, peak per role.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
import requests

from gnn_faas.stack_memory import by_role, stack_rss
from gnn_faas.traces.open_loop import Sent

MIB = 2**20


def answers_at(sent: Sent) -> tuple[np.ndarray, np.ndarray]:
    """``(end times on time.monotonic, graph versions)`` of the 200 answers."""
    ends, versions = [], []
    for i, body in enumerate(sent.body):
        if int(sent.status[i]) != 200 or not body:
            continue
        try:
            v = json.loads(body)["parameters"]["graph_version"]
        except (ValueError, KeyError, TypeError):
            continue
        ends.append(sent.start_monotonic + float(sent.send[i]) + float(sent.latency[i]))
        versions.append(int(v))
    return np.asarray(ends, float), np.asarray(versions, np.int64)


def freshness(acked: np.ndarray, versions: np.ndarray, ends: np.ndarray, seen: np.ndarray):
    """Per acknowledged version (``acked`` times, ``versions``): seconds to the first
    answer on it or later (``nan``: none came). ``ends``/``seen``: the answers."""
    out = np.full(acked.size, np.nan)
    if ends.size == 0 or acked.size == 0:
        return out
    order = np.argsort(ends, kind="stable")
    ends, running = ends[order], np.maximum.accumulate(seen[order])
    first = np.searchsorted(running, versions, side="left")
    hit = first < ends.size
    out[hit] = np.maximum(0.0, ends[first[hit]] - acked[hit])
    return out


def summarise(seconds: np.ndarray) -> dict:
    """p50/p99/max of the observed values, and how many were not observed."""
    ok = seconds[np.isfinite(seconds)]
    if ok.size == 0:
        return {"observed": 0, "unobserved": int(seconds.size)}
    return {
        "observed": int(ok.size),
        "unobserved": int(seconds.size - ok.size),
        "p50_s": float(np.percentile(ok, 50)),
        "p99_s": float(np.percentile(ok, 99)),
        "max_s": float(ok.max()),
    }


def _runs(order: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """``order[lo[i]:hi[i]]`` for every ``i``, concatenated."""
    counts = hi - lo
    starts = np.repeat(lo - (np.cumsum(counts) - counts), counts)
    return order[starts + np.arange(int(counts.sum()))]


def hop_edges(src: np.ndarray, dst: np.ndarray, targets: np.ndarray, hops: int) -> np.ndarray:
    """Indices of the edges into the ``hops``-hop in-neighbourhood of ``targets``."""
    order = np.argsort(dst, kind="stable")
    sd = dst[order]
    inside = frontier = np.unique(targets)
    for _ in range(hops):
        lo, hi = np.searchsorted(sd, frontier), np.searchsorted(sd, frontier, side="right")
        new = np.setdiff1d(np.unique(src[_runs(order, lo, hi)]), inside)
        inside, frontier = np.union1d(inside, new), new
    lo, hi = np.searchsorted(sd, inside), np.searchsorted(sd, inside, side="right")
    return _runs(order, lo, hi)


def reference_scores(ckpt: str, src, dst, x: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """What the checkpoint's model computes in PyG for ``targets`` on the graph
    given as an edge list (``dst`` aggregates from ``src``) and rows ``x``."""
    import torch  # lazily: the bench CLI starts without torch

    from gnn_faas.functions.checkpoint import load_config, load_state
    from gnn_faas.functions.pyg_models import PygGNN

    cfg = load_config(ckpt)
    net = PygGNN(cfg)
    net.load_state_dict({k: torch.as_tensor(v) for k, v in load_state(ckpt).items()})
    net.eval()
    src, dst = np.asarray(src, np.int64), np.asarray(dst, np.int64)
    keep = hop_edges(src, dst, np.asarray(targets, np.int64), cfg.num_layers)
    ei = torch.from_numpy(np.stack([src[keep], dst[keep]]))
    with torch.no_grad():
        return net(torch.from_numpy(np.asarray(x, np.float32)), ei).numpy()[targets]


# Runs a gnn-faas command and reports its own peak RSS (VmHWM is per address space,
# so it starts anew at exec; wait4's ru_maxrss would carry the forking parent's).
PEAK_WRAPPER = """import runpy, sys
sys.argv = ["gnn-faas", *sys.argv[1:]]
try:
    runpy.run_module("gnn_faas", run_name="__main__")
finally:
    with open("/proc/self/status") as fh:
        hwm = [line.split()[1] for line in fh if line.startswith("VmHWM:")]
    sys.stderr.write("\\npeak_rss_kib " + (hwm[0] if hwm else "-1") + "\\n")
"""


def run_measured(argv: list[str], env: dict[str, str]) -> dict:
    """``gnn-faas ARGV`` in a subprocess: exit code, stdout, stderr's tail, wall
    seconds, its CPU seconds (``wait4``) and its own peak RSS (MiB)."""
    with tempfile.TemporaryFile() as out_f, tempfile.TemporaryFile() as err_f:
        t0 = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-c", PEAK_WRAPPER, *argv], stdout=out_f,
                                stderr=err_f, env={**os.environ, **env})  # fmt: skip
        _, status, usage = os.wait4(proc.pid, 0)  # this child's CPU, not the bench's
        proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.monotonic() - t0
        out_f.seek(0)
        err_f.seek(0)
        out, err = out_f.read().decode(errors="replace"), err_f.read().decode(errors="replace")
    lines = err.strip().splitlines()
    peak = float(lines[-1].split()[1]) / 1024 if lines and lines[-1].startswith("peak_rss") else -1
    return {"exit": proc.returncode, "stdout": out, "stderr": "\n".join(lines[:-1])[-400:],
            "wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime, "peak_rss_mib": peak}  # fmt: skip


def run_compaction(uri: str, graph: str, env: dict[str, str], grace_s: float = 120.0) -> dict:
    """``gnn-faas graph compact`` measured (:func:`run_measured`), its answer parsed."""
    argv = ["graph", "compact", "--store", uri, "--graph", graph, "--grace-s", str(grace_s),
            "--json"]  # fmt: skip
    run = run_measured(argv, env)
    if run["exit"] != 0:
        return {"ok": False, **run}
    return {"ok": True, "result": json.loads(run.pop("stdout")), **run}


def gateway_update_metrics(url: str) -> dict:
    """The gateway's ``gnn_faas_graph_*`` series and its requests moved onto a newer
    version (``gnn_faas_version_moves``) from ``/metrics``: ``{name{labels}: value}``."""
    from prometheus_client.parser import text_string_to_metric_families

    text = requests.get(f"{url}/metrics", timeout=30).text
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            wanted = s.name.startswith(("gnn_faas_graph_", "gnn_faas_version_moves"))
            if wanted and not s.name.endswith("_created"):
                labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
                out[f"{s.name}{{{labels}}}"] = s.value
    return out


def memory_function_stats(status: dict) -> list[dict]:
    """Each memory instance's cache invalidations and version figures (``/v1/stats``)."""
    out = []
    for inst in status.get("instances", []):
        if "-memory-" not in inst["id"] or inst.get("state") in ("stopped", "failed"):
            continue
        try:
            st = requests.get(f"{inst['url']}/v1/stats", timeout=30).json()
        except (requests.RequestException, ValueError) as exc:
            out.append({"instance": inst["id"], "error": str(exc)})
            continue
        cache = st.get("cache", {})
        out.append({
            "instance": inst["id"],
            "cache_invalidations": cache.get("invalidations"),
            "cache_hit_rate": cache.get("hit_rate"),
            "graph_versions": st.get("graph_versions"),
        })  # fmt: skip
    return out


def tree_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process and its living descendants."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        total += t.user + t.system
    return total


def wait_version(url: str, graph: str, version: int, timeout_s: float = 120.0) -> float:
    """Poll ``GET /v2/graphs/{graph}`` until it names ``version`` or a later one;
    the seconds it took (raises :class:`Unavailable` past ``timeout_s``)."""
    from gnn_faas.errors import Unavailable

    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        with contextlib.suppress(requests.RequestException, ValueError, KeyError):
            if requests.get(f"{url}/v2/graphs/{graph}", timeout=10).json()["version"] >= version:
                return time.monotonic() - t0
        time.sleep(0.05)
    raise Unavailable(f"{url} did not reach version {version} of {graph} in {timeout_s} s")


class RssSampler(threading.Thread):
    """Polls a stack's processes' RSS every ``every_s``; ``peak``: MiB per role."""

    def __init__(self, stack, every_s: float = 1.0):
        super().__init__(daemon=True)
        self.stack, self.every_s = stack, every_s
        self.stop = threading.Event()
        self.peak: dict[str, float] = {}

    def sample(self) -> None:
        try:
            rss = stack_rss(self.stack.proc.pid, self.stack.status())
        except (requests.RequestException, ValueError):
            return
        for role, mib in {**by_role(rss), **{f"max_{k}": v for k, v in rss.items()}}.items():
            key = role if not role.startswith("max_") else "largest_process"
            self.peak[key] = max(self.peak.get(key, 0.0), round(mib, 1))

    def run(self) -> None:
        while not self.stop.wait(self.every_s):
            self.sample()
