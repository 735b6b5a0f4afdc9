"""``gnn-faas bench coldstart --platform docker``: containers against processes.

For the memory and compute functions, each started ``--runs`` times (default 5)
on the docker platform (scheduler/platform/docker.py) and as local processes
(the ``local`` figures of :mod:`gnn_faas.bench.coldstart`), in the same run::

    {"docker": {"memory": {"ready_s", "idle_mib", "image_mb"},
                "compute": {"ready_s", "idle_mib", "image_mb"},
                "gateway": {"image_mb"}},
     "local":  {"memory": {"ready_s", "idle_mib"}, "compute": {"ready_s", "idle_mib"}}}

- ``ready_s``: median, container create (process spawn) to the first 200 of
  ``/v2/health/ready`` (the platform's own cold-start measure);
- ``idle_mib``: median memory right after ready. Containers: the cgroup's
  usage minus its page cache (what ``docker stats`` shows and what counts
  against the limit; the graph's pages read through the cache are reclaimable);
  processes: the PSS of the process tree (shared pages split, the closest to
  what a cgroup charges);
- ``image_mb``: the image's size (MB, as ``docker image ls``).

Targets: memory container ready < 1.5 s and < 100 MiB idle; compute
container ready < 4 s. The instances get ``--memory-mb``-free defaults: memory
512 MiB, compute 1024 MiB, 1 vCPU each.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from typing import Any

from gnn_faas.bench.instance_start import cold_start, default_model
from gnn_faas.errors import InvalidRequest
from gnn_faas.ports import free_port
from gnn_faas.scheduler.platform import FunctionSpec
from gnn_faas.scheduler.platform.docker import DockerPlatform
from gnn_faas.storage.datasets import ensure_dataset

MEMORY_MB = {"memory": 512, "compute": 1024}


def container_memory_mib(container) -> float:
    """Usage minus page cache of a container's cgroup (v1: ``total_cache``... ``cache``;
    v2: ``inactive_file``), as ``docker stats`` computes it."""
    mem = container.stats(stream=False).get("memory_stats") or {}
    usage = float(mem.get("usage", 0))
    st = mem.get("stats") or {}
    cache = st.get("total_inactive_file", st.get("inactive_file", st.get("cache", 0)))
    return (usage - float(cache)) / 2**20


def run_docker(args: argparse.Namespace, store: str, model: str) -> dict[str, Any]:
    runs = args.runs or 5
    platform = DockerPlatform(reaper_interval_s=None, start_timeout_s=args.timeout)
    out: dict[str, Any] = {}
    try:
        platform.check_images()
        roles = {
            "memory": ("--store", store, "--graph", args.graph),
            "compute": ("--model", model),
        }
        for kind, fargs in roles.items():
            spec = FunctionSpec(
                name=f"coldstart-{kind}", kind=kind, args=fargs, memory_mb=MEMORY_MB[kind]
            )
            ready, idle = [], []
            for _ in range(runs):
                inst = platform.launch(spec)
                ready.append(inst.cold_start_s)
                c = platform.client.containers.get(platform.container_id(inst.id))
                idle.append(container_memory_mib(c))
                platform.stop(inst.id)
            out[kind] = {
                "ready_s": statistics.median(ready),
                "idle_mib": statistics.median(idle),
                "image_mb": image_mb(platform, platform.images[kind]),
                "ready_s_runs": ready,
            }
        out["gateway"] = {"image_mb": image_mb(platform, "gnn-faas-gateway:latest")}
    finally:
        platform.shutdown()
    return out


def image_mb(platform, tag: str) -> float | None:
    try:
        return platform.client.images.get(tag).attrs["Size"] / 1e6
    except Exception:
        return None


def run_local(args: argparse.Namespace, store: str, model: str) -> dict[str, Any]:
    runs = args.runs or 5
    roles = {
        "memory": ["serve", "memory", "--store", store, "--graph", args.graph],
        "compute": ["serve", "compute", "--model", model],
    }
    out: dict[str, Any] = {}
    for kind, argv in roles.items():
        rs = [cold_start(argv, free_port(), args.timeout) for _ in range(runs)]
        out[kind] = {
            "ready_s": statistics.median(r["ready_s"] for r in rs),
            "idle_mib": statistics.median(r["pss"] for r in rs) / 2**20,
            "ready_s_runs": [r["ready_s"] for r in rs],
        }
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.runs is not None and args.runs < 1:
        raise InvalidRequest("--runs must be >= 1")
    with tempfile.TemporaryDirectory(prefix="gnn-faas-coldstart-") as tmp:
        os.chmod(tmp, 0o755)  # the containers' user reads the store and the model
        store = args.store
        if store is None:
            store = f"file://{tmp}/store"
            ensure_dataset(store, args.graph)
        model = args.model or default_model(f"{tmp}/model", store, args.graph)
        return {
            "docker": run_docker(args, store, model),
            "local": run_local(args, store, model),
            "graph": args.graph,
            "runs": args.runs or 5,
        }
