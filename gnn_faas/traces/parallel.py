"""Independent simulation jobs (policies, sweep points) on every core, one progress bar.

Each job is a function of a progress callback that returns a JSON-able dict.
With more than one worker, jobs run in forked processes, at most ``workers``
at once, longest first (the caller lists them so): a child inherits the
simulation's setup (stream, k-hop sets) from the fork, writes its progress
(requests simulated so far) into a shared array of counters, and sends its
result back as JSON over a pipe (no pickle crosses the process boundary). The
parent starts the next job as one ends and moves one progress bar over the
sum of every job's requests. A job that fails sends its error's text; the
parent raises it as a :class:`RuntimeError` (a :class:`GnnFaasError` keeps
its type and message, for the CLI's one-line error). With one worker (or no
``fork``) the jobs run in this process, one after the other.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

from gnn_faas import errors

POLL_S = 0.25  # how often the parent moves the progress bar while it waits


@dataclass(frozen=True)
class Job:
    """``run(progress)`` -> JSON-able dict; ``size``: the requests it simulates
    (its share of the progress bar)."""

    name: str
    run: Callable[[Callable[[int], None]], dict]
    size: int


def run_jobs(jobs: Sequence[Job], workers: int, bar: Any = None) -> list[dict]:
    """Every job's result, in the order given; ``bar``: a tqdm-like object
    (``update(n)``) advanced by the requests simulated."""
    if workers <= 1 or len(jobs) <= 1 or not hasattr(os, "fork"):
        return _serial(jobs, bar)
    return _forked(jobs, workers, bar)


def _serial(jobs: Sequence[Job], bar: Any) -> list[dict]:
    out = []
    for job in jobs:
        seen = [0]

        def progress(count: int, seen=seen) -> None:
            if bar is not None and count > seen[0]:
                bar.update(count - seen[0])
                seen[0] = count

        out.append(job.run(progress))
        progress(job.size)
    return out


def _forked(jobs: Sequence[Job], workers: int, bar: Any) -> list[dict]:
    ctx = mp.get_context("fork")
    counts = ctx.RawArray("q", len(jobs))
    results: list[dict | None] = [None] * len(jobs)
    running: dict[Connection, tuple[int, Any]] = {}
    shown = 0
    waiting = list(range(len(jobs)))
    try:
        while waiting or running:
            while waiting and len(running) < workers:
                k = waiting.pop(0)
                recv, send = ctx.Pipe(duplex=False)
                proc = ctx.Process(target=_child, args=(jobs[k], k, counts, send), daemon=True)
                proc.start()
                send.close()
                running[recv] = (k, proc)
            for conn in wait(list(running), timeout=POLL_S):
                k, proc = running.pop(conn)
                try:
                    payload = json.loads(conn.recv_bytes())
                except EOFError:
                    payload = {"error": f"simulation job {jobs[k].name} died"}
                conn.close()
                proc.join()
                if "error" in payload:
                    _raise(payload)
                results[k] = payload["result"]
                counts[k] = jobs[k].size
            total = sum(counts)
            if bar is not None and total > shown:
                bar.update(total - shown)
                shown = total
    finally:
        for _, proc in running.values():
            proc.kill()
            proc.join()
    return [r for r in results if r is not None]


def _child(job: Job, k: int, counts: Any, send: Connection) -> None:  # pragma: no cover
    """Runs in the forked process (coverage does not follow it)."""

    def progress(count: int) -> None:
        counts[k] = count

    try:
        data = json.dumps({"result": job.run(progress)})
    except errors.GnnFaasError as exc:
        data = json.dumps({"error": str(exc), "kind": type(exc).__name__})
    except BaseException:
        data = json.dumps({"error": traceback.format_exc()})
    send.send_bytes(data.encode())
    send.close()


def _raise(payload: dict) -> None:
    kind = getattr(errors, payload.get("kind", ""), None)
    if isinstance(kind, type) and issubclass(kind, errors.GnnFaasError):
        raise kind(payload["error"])
    raise RuntimeError(f"a simulation job failed:\n{payload['error']}")
