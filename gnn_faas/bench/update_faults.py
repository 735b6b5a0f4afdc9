"""``gnn-faas bench update-faults``: writers and compactions killed mid-flight, two writers.

On Bitcoin OTC as of its cut-off (bench/update_graphs.py), in the store given:

1. **writer kills**: ``--writer-kills`` times, ``gnn-faas graph update --add-edges FILE``
   (``--kill-batch`` later edges) in a subprocess, SIGKILLed: every other time at a
   random moment in the second half of its life (as long as the last unkilled
   update took), the others right after its segment appears in the log (the
   commit's window: segment, record, hint, answer). After each kill one
   unkilled update of the next batch;
2. **compaction kills**: ``--compaction-kills`` times, one more batch committed,
   then ``gnn-faas graph compact`` SIGKILLed at a random moment of its life or
   right after the new base's manifest appears (before or after the record);
   every fifth time the compaction is then run again to its end;
3. **served answers**: a gateway on the result; answers for the touched
   vertices and others against PyG on the expected graph (bench/update_checks.py);
4. **two writers** (bench/update_concurrency.py): ``--batches`` one-edge batches
   committed by two processes at once, from version 0.

After every kill a fresh reader must hold exactly the base plus the batches
committed (a killed batch is either all there or not at all; an acknowledged
one always), and after a compaction kill ``gnn-faas datasets verify`` must pass
on the current base. The JSON counts what each kill hit (nothing written, a
segment only, committed but not acknowledged, acknowledged; a compaction
before its base, base written, published) and every violation.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np

from gnn_faas.bench import update_checks as chk
from gnn_faas.bench.store_proxy import add_store_arguments, store_access, store_fields
from gnn_faas.bench.update_concurrency import concurrent_writers
from gnn_faas.bench.update_graphs import base_edges, matches, new_edges, open_versions, prepare
from gnn_faas.errors import InvalidRequest
from gnn_faas.paths import default_store
from gnn_faas.storage.backends import open_backend
from gnn_faas.storage.delta import UpdateBatch
from gnn_faas.storage.format import MANIFEST
from gnn_faas.storage.versions import base_prefix, latest


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_store_arguments(p)
    p.add_argument("--writer-kills", type=int, default=20)
    p.add_argument("--compaction-kills", type=int, default=20)
    p.add_argument("--kill-batch", type=int, default=100, help="edges per killed batch")
    p.add_argument("--batches", type=int, default=10000,
                   help="one-edge batches of the two concurrent writers (0: skip)")  # fmt: skip
    p.add_argument("--sample", type=int, default=300, help="vertices checked against PyG")
    p.add_argument("--no-serving-check", action="store_true", help="skip step 3")
    p.add_argument("--seed", type=int, default=0)


class Graph:
    """The graph under test: its store, name, base edges and the batches committed."""

    def __init__(self, uri: str, env: dict, backend, graph, stream: np.ndarray, batch: int):
        self.uri, self.env, self.backend, self.graph = uri, env, backend, graph
        self.name = graph.name
        self.src, self.dst = base_edges(graph)
        self.stream, self.batch, self.next = stream, batch, 0
        self.committed: list[np.ndarray] = []
        self.violations: list[str] = []

    def take(self) -> np.ndarray:
        """The next batch of the stream."""
        lo = self.next * self.batch
        if lo >= self.stream.shape[0]:
            raise InvalidRequest("the stream ran out of edges: fewer kills or a smaller batch")
        self.next += 1
        return self.stream[lo : lo + self.batch]

    def check(self, what: str) -> bool:
        """A fresh reader holds exactly the base and the committed batches."""
        extra = np.concatenate(self.committed) if self.committed else np.zeros((0, 2), np.int64)
        m = matches(self.backend, self.name, np.concatenate((self.src, extra[:, 0])),
                    np.concatenate((self.dst, extra[:, 1])))  # fmt: skip
        if not m["equal"]:
            self.violations.append(f"{what}: the graph at version {m['version']} is not the "
                                   "base plus the committed batches")  # fmt: skip
        return m["equal"]

    def version(self) -> int:
        return latest(self.backend, self.name).version

    def segments(self) -> int:
        """Segment files in the log (read straight from the directory on a file store)."""
        if self.uri.startswith("file://"):
            log = Path(self.backend.root) / self.name / "log"
            if not log.is_dir():
                return 0
            with os.scandir(log) as it:
                return sum(1 for e in it if ".tmp-" not in e.name)
        return len(self.backend.ls(f"{self.name}/log/"))


def gnn_faas(argv: list[str], env: dict, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "gnn_faas", *argv], env={**os.environ, **env},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)  # fmt: skip


def killed(proc: subprocess.Popen, when) -> tuple[str, float]:
    """SIGKILL ``proc`` once ``when()`` is true (or it exited): ``(stdout, seconds)``."""
    t0 = time.monotonic()
    while proc.poll() is None and not when(time.monotonic() - t0):
        time.sleep(0.0005)
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    out, _ = proc.communicate(timeout=120)
    return out.decode(errors="replace"), time.monotonic() - t0


def update(g: Graph, batch: np.ndarray, tmp: str) -> subprocess.Popen:
    path = os.path.join(tmp, f"batch-{g.next}.npy")
    np.save(path, batch)
    return gnn_faas(["graph", "update", "--store", g.uri, "--graph", g.name, "--add-edges",
                     path, "--json"], g.env)  # fmt: skip


def unkilled_update(g: Graph, tmp: str) -> float:
    batch = g.take()
    t0 = time.monotonic()
    proc = update(g, batch, tmp)
    out, err = proc.communicate(timeout=300)
    if proc.returncode != 0 or b'"version"' not in out:
        g.violations.append(f"an update after a kill failed: {err.decode()[-300:]}")
        return time.monotonic() - t0
    g.committed.append(batch)
    g.check("after an unkilled update")
    return time.monotonic() - t0


def writer_kills(g: Graph, kills: int, rng, tmp: str) -> dict:
    """Step 1 (see the module docstring)."""
    hits, last_s = Counter(), unkilled_update(g, tmp)
    for i in range(kills):
        batch = g.take()
        v0, s0 = g.version(), g.segments()
        proc = update(g, batch, tmp)
        if i % 2 == 0:
            at = rng.uniform(0.5, 1.0) * last_s
            out, _ = killed(proc, lambda t, at=at: t >= at)
        else:
            out, _ = killed(proc, lambda t, s0=s0: g.segments() > s0)
        acked = '"version"' in out  # what the client received before the kill
        v1, s1 = g.version(), g.segments()
        if acked and v1 != v0 + 1:
            g.violations.append(f"writer kill {i}: acknowledged version {v0 + 1} is missing")
        hit = ("acknowledged" if acked else "committed, not acknowledged" if v1 == v0 + 1
               else "segment only" if s1 > s0 else "nothing written")  # fmt: skip
        hits[hit] += 1
        if v1 == v0 + 1:
            g.committed.append(batch)
        g.check(f"writer kill {i} ({hit})")
        last_s = unkilled_update(g, tmp)
    return {"kills": kills, "hits": dict(hits)}


def compaction_kills(g: Graph, kills: int, rng, tmp: str) -> dict:
    """Step 2 (see the module docstring)."""
    env = {**g.env, "TMPDIR": tmp}  # a killed compaction's staging directory stays in ours
    hits, runs, verify_failures = Counter(), [], 0

    def compaction() -> subprocess.Popen:
        return gnn_faas(["graph", "compact", "--store", g.uri, "--graph", g.name, "--json",
                         "--grace-s", "3600"], env)  # fmt: skip

    def commit_one() -> None:
        batch = g.take()
        open_versions(g.backend, g.name).commit(UpdateBatch.from_arrays({"add_edges": batch}))
        g.committed.append(batch)

    commit_one()
    t0 = time.monotonic()
    if compaction().wait(timeout=600) != 0:
        g.violations.append("the first compaction failed")
    last_s = time.monotonic() - t0
    for i in range(kills):
        commit_one()
        v0 = g.version()
        manifest = f"{base_prefix(g.name, v0)}/{MANIFEST}"
        proc = compaction()
        if i % 2 == 0:
            at = rng.uniform(0.2, 1.0) * last_s
            killed(proc, lambda t, at=at: t >= at)
        else:
            killed(proc, lambda t, manifest=manifest: g.backend.exists(manifest))
        published = g.version() > v0
        hit = ("published" if published else "base written, not published"
               if g.backend.exists(manifest) else "before its base was written")  # fmt: skip
        hits[hit] += 1
        g.check(f"compaction kill {i} ({hit})")
        verify = gnn_faas(["datasets", "verify", "--store", g.uri, "--graph", g.name, "--json"],
                          g.env)  # fmt: skip
        if verify.wait(timeout=600) != 0:
            verify_failures += 1
            g.violations.append(f"compaction kill {i}: datasets verify failed")
        if i % 5 == 4:
            t0 = time.monotonic()
            runs.append(compaction().wait(timeout=600))
            last_s = time.monotonic() - t0
            g.check(f"a compaction after kill {i}")
    if any(runs):
        g.violations.append(f"compactions after kills exited {runs}")
    return {"kills": kills, "hits": dict(hits), "verify_failures": verify_failures,
            "completed_runs": len(runs), "leftover_bases": leftover_bases(g)}  # fmt: skip


def leftover_bases(g: Graph) -> int:
    """Compacted bases in the store that no version uses and no deletion list names
    (what killed compactions left; they cost space, never answers)."""
    import json

    head = latest(g.backend, g.name)
    try:
        listed = {e["key"] for e in json.loads(g.backend.cat_file(f"{g.name}/gc.json"))}
    except Exception:  # noqa: BLE001 - no list yet
        listed = set()
    keys = [k for k in g.backend.ls(f"{g.name}/") if "/base-" in k and k not in listed]
    return len({k.split("/")[1] for k in keys if not k.startswith(head.base + "/")})


def run(args: argparse.Namespace) -> dict:
    if min(args.writer_kills, args.compaction_kills, args.batches) < 0 or args.kill_batch < 1:
        raise InvalidRequest("counts must be >= 0 and --kill-batch >= 1")
    store = args.store or default_store()
    graph, stream, _ = prepare(store, "bitcoin-otc", 0.8)
    out = {"graph": graph.name, **store_fields(store, args.store_rtt_ms),
           "load_avg_start": os.getloadavg()}  # fmt: skip
    rng = np.random.default_rng(args.seed)
    with (
        tempfile.TemporaryDirectory(prefix="gnn-faas-bench-faults-") as tmp,
        store_access(store, args.store_rtt_ms) as (uri, env, _),
    ):
        g = Graph(uri, env, open_backend(store), graph, new_edges(stream, graph), args.kill_batch)
        t0 = time.monotonic()
        out["writer"] = writer_kills(g, args.writer_kills, rng, tmp)
        out["compaction"] = compaction_kills(g, args.compaction_kills, rng, tmp)
        out["kill_phases_s"] = time.monotonic() - t0
        out["final_version"] = g.version()
        out["batches_committed"] = len(g.committed)
        if not args.no_serving_check:
            extra = np.concatenate(g.committed)
            out["served"] = chk.serve_and_check(g.uri, g.env, graph, extra, args, tmp)
            if out["served"]["wrong_answers"]:
                g.violations.append(f"{out['served']['wrong_answers']} wrong answers")
        if args.batches:
            out["concurrent_writers"] = concurrent_writers(store, uri, env, args.batches,
                                                           args.seed, tmp)  # fmt: skip
            if not out["concurrent_writers"]["none_lost"]:
                g.violations.append("the concurrent writers lost or duplicated batches")
        out["violations"] = g.violations
    out["ok"] = not g.violations
    out["load_avg_end"] = os.getloadavg()
    return out
