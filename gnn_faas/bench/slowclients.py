"""``gnn-faas bench slowclients``: slow and idle clients against a real gateway.

A ``gnn-faas up`` stack on loopback (local platform), then three phases:

1. ``baseline``: normal inference requests (Poisson arrivals at ``--rate``, one
   connection each) for ``--baseline-s``: p50/p99 and errors (anything but 200);
2. ``under_attack``: the same load for ``--hold-s`` while :class:`Attack` holds
   ``--idle`` connections that send nothing and ``--slow`` connections that send
   their headers and 10 bytes of a 1,000-byte body, then one more byte every 2 s.
   A connection the server closes is replaced at once (the attacker keeps the
   pressure on) until the hold ends; then the attacker stops replacing and waits
   for the server to close what is left. ``held``: connections the attacker
   opened; ``closed_by_server``: those the server closed (EOF or reset, after
   an optional 408); ``closed_late``: closed more than 2 s after their deadline
   (``header_timeout_s`` for an idle one, ``body_timeout_s`` after the headers
   for a slow one; ``keepalive`` for gunicorn's stock worker, which has neither);
3. ``rss_mib``: the gateway worker's RSS when idle (after the warm-up), and
   after ``--big-bodies`` requests of ``--big-mib`` MiB each (alternately a JSON
   ``targets`` list and binary tensor data of FP32 features: both refused after
   being read), polled for up to 60 s until it is within 2x idle (the value
   when it got there, else the last one).

``front``: the gateway's own counts after the attack (``/v1/status``): requests
ended by a deadline (408), connections refused over the cap, framing errors.

Targets: under attack p99 <= 1 s and 0 errors, ``closed_by_server == held``
(with ``closed_late == 0``); ``after_big_bodies <= 2 * idle``.

Everything is on 127.0.0.1, bounded in count (``--idle + --slow`` sockets at
once) and time (``--baseline-s + --hold-s`` plus the deadlines), and stops by
itself. ``--front gthread`` runs the same against gunicorn's stock worker (the
baseline the buffering front is measured against).
"""

from __future__ import annotations

import argparse
import json
import selectors
import socket
import threading
import time

import numpy as np

SLOW_HEAD = b"POST /v2/models/%s/infer HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
TRICKLE_S = 2.0
LATE_SLACK_S = 2.0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--graph", default="bitcoin-otc", help="graph (and dataset) name")
    p.add_argument("--store", default=None, help="graph store URI (default: ./var/store)")
    p.add_argument("--arch", default="gcn")
    p.add_argument("--slo", type=float, default=1.0, help="the model's SLO in seconds")
    p.add_argument("--idle", type=int, default=1000, help="idle connections held")
    p.add_argument("--slow", type=int, default=200, help="slow-body connections held")
    p.add_argument("--hold-s", type=float, default=60.0, help="seconds the attack lasts")
    p.add_argument("--baseline-s", type=float, default=20.0, help="seconds of load alone")
    p.add_argument("--rate", type=float, default=10.0, help="normal requests per second")
    p.add_argument("--big-bodies", type=int, default=100, help="large requests for the RSS check")
    p.add_argument("--big-mib", type=float, default=15.0, help="MiB per large request")
    p.add_argument("--front", default="buffered", choices=["buffered", "gthread"])
    p.add_argument("--threads", type=int, default=32, help="gateway threads")
    p.add_argument("--header-timeout", type=float, default=10.0, help="gateway header deadline")
    p.add_argument("--body-timeout", type=float, default=30.0, help="gateway body deadline")
    p.add_argument("--seed", type=int, default=0)


class Attack:
    """Holds idle and slow-body connections to ``addr`` on one selector thread."""

    def __init__(self, addr, model: str, idle: int, slow: int, deadlines: dict[str, float]):
        self.addr, self.idle, self.slow = addr, idle, slow
        self.head = SLOW_HEAD % model.encode()
        self.deadlines = deadlines
        self.sel = selectors.DefaultSelector()
        self.replace = True
        self.stop = threading.Event()
        self.held = 0
        self.connect_errors = 0
        self.closed_by_server = 0
        self.closed_late = 0
        self.lifetimes: list[float] = []
        self._thread = threading.Thread(target=self._run, name="slowclients-attack", daemon=True)

    def _open(self, kind: str) -> None:
        try:
            s = socket.create_connection(self.addr, timeout=5)
            if kind == "slow":
                s.sendall(self.head + b"{" + b" " * 9)
        except OSError:
            self.connect_errors += 1
            return
        s.setblocking(False)
        self.held += 1
        self.sel.register(s, selectors.EVENT_READ, (kind, time.monotonic()))

    def _closed(self, key, now: float) -> None:
        kind, opened = key.data
        self.sel.unregister(key.fileobj)
        key.fileobj.close()
        self.closed_by_server += 1
        self.lifetimes.append(now - opened)
        if now - opened > self.deadlines[kind] + LATE_SLACK_S:
            self.closed_late += 1
        if self.replace:
            self._open(kind)

    def _run(self) -> None:
        for _ in range(self.idle):
            self._open("idle")
        for _ in range(self.slow):
            self._open("slow")
        next_trickle = time.monotonic() + TRICKLE_S
        while not self.stop.is_set():
            for key, _ in self.sel.select(timeout=0.2):
                try:
                    data = key.fileobj.recv(65536)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if not data:
                    self._closed(key, time.monotonic())
            now = time.monotonic()
            if now >= next_trickle:
                next_trickle = now + TRICKLE_S
                for key in list(self.sel.get_map().values()):
                    if key.data[0] != "slow":
                        continue
                    try:
                        key.fileobj.send(b" ")
                    except BlockingIOError:
                        pass
                    except OSError:
                        self._closed(key, now)

    def start(self) -> None:
        self._thread.start()

    def open_now(self) -> int:
        return len(self.sel.get_map())

    def finish(self, wait_s: float) -> None:
        """Stop replacing; wait up to ``wait_s`` for the server to close the rest."""
        self.replace = False
        deadline = time.monotonic() + wait_s
        while self.open_now() and time.monotonic() < deadline:
            time.sleep(0.2)
        self.stop.set()
        self._thread.join(10)
        for key in list(self.sel.get_map().values()):
            key.fileobj.close()
        self.sel.close()


def _load(url: str, model: str, graph, rate: float, seconds: float, seed: int) -> dict:
    from gnn_faas.bench.open_loop import poisson_arrivals, run_open_loop
    from gnn_faas.bench.overload import request_targets

    due = poisson_arrivals(rate, seconds, seed=seed)
    targets = request_targets(graph, due.size, seed)
    s = run_open_loop(url, model, due, targets, timeout_s=30.0).summary(slo_s=1.0)
    out = {"p50_ms": round(s["p50_ms"], 2), "p99_ms": round(s["p99_ms"], 2)}
    out["errors"] = s["errors"] + s["shed"]
    out["requests"] = s["requests"]
    if s.get("error_examples"):
        out["error_examples"] = s["error_examples"]
    return out


def _big_body(k: int, nbytes: int, model: str, dim: int) -> tuple[bytes, dict]:
    """A JSON ``targets`` list (even k) or binary FP32 features (odd k) of ``nbytes``."""
    if k % 2 == 0:
        n = nbytes // 7
        ids = 1_000_000 + np.arange(n, dtype=np.int64) % 9_000_000  # 7 digits and a comma
        data = ",".join(map(str, ids.tolist()))[: nbytes - 120].rsplit(",", 1)[0]
        count = data.count(",") + 1
        tensor = f'{{"name":"targets","datatype":"INT64","shape":[{count}],"data":[{data}]}}'
        body = f'{{"inputs":[{tensor}]}}'.encode()
        return body, {"Content-Type": "application/json"}
    rows = max(1, nbytes // (4 * dim))
    head = json.dumps(
        {
            "inputs": [
                {"name": "targets", "datatype": "INT64", "shape": [1], "data": [0]},
                {
                    "name": "features",
                    "datatype": "FP32",
                    "shape": [rows, dim],
                    "parameters": {"binary_data_size": rows * dim * 4},
                },
            ]
        }
    ).encode()
    blob = np.ones(rows * dim, dtype="<f4").tobytes()
    return head + blob, {
        "Content-Type": "application/octet-stream",
        "Inference-Header-Content-Length": str(len(head)),
    }


def _worker_rss_mib(gateway_pid: int) -> float:
    from gnn_faas.stack_memory import stack_rss

    return stack_rss(gateway_pid, {}).get("gateway_worker", 0.0)


def _rss_after_big_bodies(stack, model: str, dim: int, n: int, mib: float) -> dict:
    import requests

    idle = _worker_rss_mib(stack.proc.pid)
    statuses: dict[str, int] = {}
    peak = idle
    bodies = [_big_body(k, int(mib * 2**20), model, dim) for k in range(min(n, 2))]
    with requests.Session() as session:
        for k in range(n):
            body, headers = bodies[k % 2]
            r = session.post(
                f"{stack.url}/v2/models/{model}/infer", data=body, headers=headers, timeout=120
            )
            statuses[str(r.status_code)] = statuses.get(str(r.status_code), 0) + 1
            if k % 10 == 9:
                peak = max(peak, _worker_rss_mib(stack.proc.pid))
    peak = max(peak, _worker_rss_mib(stack.proc.pid))
    t0 = time.monotonic()
    after = _worker_rss_mib(stack.proc.pid)
    while after > 2 * idle and time.monotonic() - t0 < 60:
        time.sleep(1.0)
        after = _worker_rss_mib(stack.proc.pid)
    return {
        "idle": round(idle, 1),
        "after_big_bodies": round(after, 1),
        "peak": round(peak, 1),
        "settle_s": round(time.monotonic() - t0, 1),
        "statuses": statuses,
    }


def run(args: argparse.Namespace) -> dict:
    from urllib.parse import urlsplit

    from gnn_faas.bench.open_loop import run_open_loop
    from gnn_faas.bench.overload import request_targets
    from gnn_faas.errors import InvalidRequest
    from gnn_faas.stack import Stack, prepared_model

    if min(args.idle, args.slow, args.big_bodies) < 0 or args.idle + args.slow > 20000:
        raise InvalidRequest("--idle, --slow and --big-bodies must be >= 0 (idle + slow <= 20000)")
    if min(args.hold_s, args.baseline_s, args.rate, args.big_mib) <= 0:
        raise InvalidRequest("--hold-s, --baseline-s, --rate and --big-mib must be > 0")
    base, graph, ckpt = prepared_model(args.store, args.graph, args.arch, args.slo)
    config = {
        "store": base.store,
        "gateway": {
            "front": args.front,
            "threads": args.threads,
            "max_connections": args.idle + args.slow + 1024,
            "header_timeout_s": args.header_timeout,
            "body_timeout_s": args.body_timeout,
            "admission": False,
        },
        "platform": {"memory_function_mb": 256, "compute_function_mb": 512, "min_instances": 1},
        "models": [
            {"name": args.graph, "graph": args.graph, "dataset": args.graph,
             "checkpoint": ckpt, "slo_s": args.slo}
        ],
    }  # fmt: skip
    keepalive = 30.0  # GatewayConfig.keepalive_s
    if args.front == "buffered":
        deadlines = {"idle": args.header_timeout, "slow": args.body_timeout}
    else:  # stock gthread: 5 s of waiting in a thread, then keep-alive; no body deadline
        deadlines = {"idle": 5.0 + keepalive, "slow": float("inf")}
    out: dict = {
        "settings": {
            "front": args.front,
            "threads": args.threads,
            "idle": args.idle,
            "slow": args.slow,
            "hold_s": args.hold_s,
            "rate": args.rate,
            "deadlines_s": {k: (None if v == float("inf") else v) for k, v in deadlines.items()},
        }
    }
    with Stack(config) as stack:
        warm = request_targets(graph, 20, args.seed)
        run_open_loop(stack.url, args.graph, np.linspace(0, 2.0, warm.size), warm)
        rss_idle_first = _worker_rss_mib(stack.proc.pid)
        out["baseline"] = _load(stack.url, args.graph, graph, args.rate, args.baseline_s, args.seed)
        parts = urlsplit(stack.url)
        attack = Attack((parts.hostname, parts.port), args.graph, args.idle, args.slow, deadlines)
        attack.start()
        t0 = time.monotonic()
        while attack.held < args.idle + args.slow and time.monotonic() - t0 < 30:
            time.sleep(0.1)  # the whole attack is in place before the load starts
        under = _load(stack.url, args.graph, graph, args.rate, args.hold_s, args.seed + 1)
        # what is left closes within its deadline; the margin is for a loaded machine
        wait = max(v for v in deadlines.values() if v != float("inf"))
        attack.finish(2 * wait + 30.0)
        under.update(
            held=attack.held,
            closed_by_server=attack.closed_by_server,
            closed_late=attack.closed_late,
            connect_errors=attack.connect_errors,
            max_lifetime_s=round(max(attack.lifetimes), 2) if attack.lifetimes else None,
        )
        out["under_attack"] = under
        out["front"] = stack.status().get("front", {})  # the gateway's own counts
        rss = _rss_after_big_bodies(
            stack, args.graph, graph.manifest.feature_dim, args.big_bodies, args.big_mib
        )
        rss["idle_before_load"] = round(rss_idle_first, 1)
        out["rss_mib"] = rss
    return out
