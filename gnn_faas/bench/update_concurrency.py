"""Two writers at once (``gnn-faas bench update-faults``, step 4): no batch lost.

Bitcoin OTC as of its cut-off is written anew (version 0); ``batches`` edges it
does not hold are drawn (distinct, no self loops); two processes (this module
run as ``python -m gnn_faas.bench.update_concurrency``, each a
:class:`~gnn_faas.storage.versions.GraphVersions` of its own) commit every
other one, one edge per batch, as fast as they can. Each commit races the other
writer for the next version (create-if-absent on the version record; the loser
checks its batch again on the winner's version and takes the one after).

Afterwards the newest version must be ``batches``, each writer's acknowledged
versions distinct from the other's, and a fresh reader must hold exactly the
base plus every edge (``none_lost``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

from gnn_faas.bench.update_graphs import base_edges, matches, open_versions, prepare
from gnn_faas.storage.backends import open_backend
from gnn_faas.storage.delta import UpdateBatch


def fresh_edges(graph, n: int, seed: int) -> np.ndarray:
    """``n`` distinct ``(src, dst)`` pairs the graph does not hold, no self loops."""
    src, dst = base_edges(graph)
    nodes = np.int64(graph.num_nodes)
    held = np.unique(dst * nodes + src)
    rng = np.random.default_rng(seed)
    keys = np.zeros(0, np.int64)
    while keys.size < n:  # a few rounds of draws, each a whole array
        draw = rng.integers(0, nodes * nodes, 2 * n)
        draw = draw[(draw // nodes != draw % nodes) & ~np.isin(draw, held)]
        keys = np.unique(np.concatenate((keys, draw)))
    keys = rng.permutation(keys)[:n]
    return np.stack((keys % nodes, keys // nodes), axis=1)


def concurrent_writers(store: str, uri: str, env: dict, batches: int, seed: int, tmp: str) -> dict:
    """See the module docstring: ``{"none_lost", "final_version", ...}``."""
    graph, _, _ = prepare(store, "bitcoin-otc", 0.8)
    edges = fresh_edges(graph, batches, seed)
    path = os.path.join(tmp, "concurrent-edges.npy")
    np.save(path, edges)
    cmd = [sys.executable, "-m", "gnn_faas.bench.update_concurrency", "--store", uri,
           "--graph", graph.name, "--edges", path, "--step", "2"]  # fmt: skip
    t0 = time.monotonic()
    procs = [
        subprocess.Popen(
            [*cmd, "--start", str(w)],
            env={**os.environ, **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )  # fmt: skip
        for w in range(2)
    ]
    done = [p.communicate() for p in procs]
    wall = time.monotonic() - t0
    backend = open_backend(store)
    workers = []
    for p, (out, err) in zip(procs, done):
        if p.returncode != 0:
            workers.append({"exit": p.returncode, "error": err.decode(errors="replace")[-400:]})
        else:
            workers.append(json.loads(out))
    acked = [v for w in workers for v in w.get("versions", [])]
    src, dst = base_edges(graph)
    m = matches(backend, graph.name, np.concatenate((src, edges[:, 0])),
                np.concatenate((dst, edges[:, 1])))  # fmt: skip
    return {
        "batches": batches,
        "final_version": m["version"],
        "acknowledged": len(acked),
        "distinct_versions": len(set(acked)) == len(acked),
        "none_lost": m["equal"] and m["version"] == batches and len(acked) == batches,
        "seconds": wall,
        "commits_per_s": batches / wall,
        "workers": [{k: v for k, v in w.items() if k != "versions"} for w in workers],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="one of the concurrent writers")
    p.add_argument("--store", required=True)
    p.add_argument("--graph", required=True)
    p.add_argument("--edges", required=True, help=".npy [m, 2]")
    p.add_argument("--start", type=int, required=True)
    p.add_argument("--step", type=int, required=True)
    args = p.parse_args(argv)
    edges = np.load(args.edges, allow_pickle=False)[args.start :: args.step]
    gv = open_versions(open_backend(args.store), args.graph)
    versions = []
    t0, c0 = time.monotonic(), time.process_time()
    for e in edges:  # one commit per batch: the unit under test
        rec, _ = gv.commit(UpdateBatch.from_arrays({"add_edges": e.reshape(1, 2)}))
        versions.append(rec.version)
    print(json.dumps({"commits": len(versions), "seconds": time.monotonic() - t0,
                      "cpu_s": time.process_time() - c0, "versions": versions}))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
