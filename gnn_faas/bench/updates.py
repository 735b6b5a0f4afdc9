"""``gnn-faas bench updates``: a graph that changes while it is served.

Serves a graph as of a cut-off (bench/update_graphs.py) with ``gnn-faas up``
(the writer's gateway) and a second gateway on the same store (a reader that
learns of new versions only by polling, ``graphs.freshness_s``), then:

1. **without updates**: open-loop Poisson requests at ``--rps`` to the writer's
   gateway (and ``--reader-rps`` to the reader);
2. **with updates**: the same arrivals again while the later edges are posted
   to ``POST /v2/graphs/{g}/updates`` in batches of ``--batch`` (binary
   tensors), as fast as they are acknowledged or at ``--update-rate`` edges/s,
   added and removed in turn, by a process of its own (bench/update_writer.py:
   the load generator shares no interpreter with it); 1 and 2 alternate in
   ``--rounds`` windows (``--duration`` seconds of each in all);
3. the served answers for ``--sample`` vertices (half of them ones the updates
   touched) on both gateways against PyG on the final graph, built from the
   base's edge list and the stream (bench/update_figures.py);
4. ``gnn-faas graph compact`` in a subprocess (its seconds, peak RSS, CPU)
   while the load goes on; every request during it must answer 200; then the
   PyG check again on the compacted version.

Figures: edge updates per second, acknowledgement p50/p99, freshness per
reader (ack to the first answer on that version or a later one), inference
p50/p99 with and without the stream, failed requests, the memory functions'
cache invalidations and version figures, the gateway's
``gnn_faas_graph_*`` series, peak RSS per role, CPU seconds and the load
average. Targets and recorded runs: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import secrets
import tempfile
import time

import numpy as np
import requests

from gnn_faas.bench import update_checks as chk
from gnn_faas.bench import update_figures as fig
from gnn_faas.bench.open_loop import poisson_arrivals
from gnn_faas.bench.overload import request_targets
from gnn_faas.bench.store_proxy import add_store_arguments, store_access, store_fields
from gnn_faas.bench.update_graphs import GRAPHS, new_edges, prepare
from gnn_faas.bench.update_writer import CYCLES, EdgeCycle, WriterProcess
from gnn_faas.errors import InvalidRequest
from gnn_faas.paths import default_store
from gnn_faas.stack import Stack


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--graph", default="bitcoin-otc", choices=GRAPHS)
    add_store_arguments(p)
    p.add_argument("--rps", type=float, default=40.0, help="requests/s to the writer's gateway")
    p.add_argument("--reader-rps", type=float, default=10.0,
                   help="requests/s to the second gateway (0: no second gateway)")  # fmt: skip
    p.add_argument("--batch", type=int, default=1000, help="edges per update batch")
    p.add_argument("--update-rate", type=float, default=0.0,
                   help="edge updates/s (0: each batch as soon as the last was acknowledged)")  # fmt: skip
    p.add_argument("--max-updates", type=int, default=0,
                   help="stop the stream after this many edge updates (0: at the window's end)")  # fmt: skip
    p.add_argument("--cycle", choices=CYCLES, default=None,
                   help="after the stream: remove it and add it again (add-remove, the default "
                   "for bitcoin-otc) or add it again (add: multi-edges; higgs-twitter-like)")  # fmt: skip
    p.add_argument("--duration", type=float, default=30.0,
                   help="seconds of load without the stream, and as many with it")  # fmt: skip
    p.add_argument("--rounds", type=int, default=3,
                   help="the two alternate this many times (windows of duration/rounds)")  # fmt: skip
    p.add_argument("--cutoff", type=float, default=0.8, help="bitcoin-otc: time quantile cut")
    p.add_argument("--freshness-s", type=float, default=1.0, help="graphs.freshness_s")
    p.add_argument("--compact-share", type=float, default=0.0,
                   help="graphs.compact_share (0: only the benchmark's own compaction)")  # fmt: skip
    p.add_argument("--sample", type=int, default=200, help="vertices checked against PyG")
    p.add_argument("--json-body", action="store_true", help="post JSON batches, not binary")
    p.add_argument("--no-compaction", action="store_true", help="skip step 4")
    p.add_argument("--arch", default="gcn", choices=["gcn", "sage", "gin", "gat"])
    p.add_argument("--slo", type=float, default=0.3)
    p.add_argument("--max-instances", type=int, default=1, help="per function")
    p.add_argument("--memory-mb", type=int, default=512)
    p.add_argument("--compute-mb", type=int, default=512)
    p.add_argument("--seed", type=int, default=0)


def stack_config(args, uri: str, name: str, ckpt: str, token: str | None) -> dict:
    graphs = {"freshness_s": args.freshness_s, "compact_share": args.compact_share}
    if token:
        graphs["write_token"] = token
    return {
        "store": uri,
        "graphs": graphs,
        "platform": {"memory_function_mb": args.memory_mb, "compute_function_mb": args.compute_mb,
                     "max_memory_instances": args.max_instances,
                     "max_compute_instances": args.max_instances, "min_instances": 1},
        "models": [{"name": name, "graph": name, "checkpoint": ckpt, "slo_s": args.slo}],
    }  # fmt: skip


def run(args: argparse.Namespace) -> dict:
    if args.rps <= 0 or args.batch < 1 or args.reader_rps < 0 or args.rounds < 1:
        raise InvalidRequest("--rps must be positive, --batch and --rounds >= 1")
    if args.duration / args.rounds < 4:
        raise InvalidRequest("each window (--duration / --rounds) must be at least 4 s")
    store = args.store or default_store()
    graph, stream, stream_name = prepare(store, args.graph, args.cutoff, args.seed)
    cycle_kind = args.cycle or ("add-remove" if args.graph == "bitcoin-otc" else "add")
    edges = new_edges(stream, graph) if cycle_kind == "add-remove" else stream
    cycle = EdgeCycle(edges, args.batch, cycle_kind)
    out = {"graph": args.graph, "served_graph": graph.name, "stream": stream_name,
           "stream_edges": int(edges.shape[0]), "cycle": cycle_kind, "batch": args.batch,
           "rps": args.rps, "reader_rps": args.reader_rps, "duration_s": args.duration,
           "update_rate": args.update_rate, "arch": args.arch,
           "freshness_s": args.freshness_s, "compact_share": args.compact_share,
           **store_fields(store, args.store_rtt_ms), "load_avg_start": os.getloadavg()}  # fmt: skip
    token = secrets.token_hex(16)
    with (
        tempfile.TemporaryDirectory(prefix="gnn-faas-bench-updates-") as tmp,
        store_access(store, args.store_rtt_ms) as (uri, env, _),
    ):
        ckpt = chk.write_checkpoint(tmp, graph, args.arch, args.seed)
        cycle.save(f"{tmp}/stream.npy")  # what the writer process posts
        with Stack(stack_config(args, uri, graph.name, ckpt, token), env=env) as writer:
            stacks = [writer]
            try:
                if args.reader_rps > 0:
                    reader = Stack(stack_config(args, uri, graph.name, ckpt, None), env=env)
                    stacks.append(reader.__enter__())
                out.update(serve(args, stacks, graph, cycle, token, (uri, env, ckpt)))
            finally:
                for st in stacks[1:]:
                    st.__exit__(None, None, None)
    out["load_avg_end"] = os.getloadavg()
    return chk.summarise(out)


def windows(args, stacks: list[Stack], graph, cycle: EdgeCycle, token: str) -> tuple[dict, list]:
    """Steps 1 and 2 interleaved: ``--rounds`` rounds of a window without the stream
    then one with it, each ``duration / rounds`` seconds, on the same arrivals
    (a machine whose load drifts moves both alike)."""
    name, urls = graph.name, [st.url for st in stacks]
    rates = [args.rps, args.reader_rps][: len(stacks)]
    span = args.duration / args.rounds
    tail = min(max(2.0, 2 * args.freshness_s), span / 2)  # the last batch's answers come
    sents: dict = {k: [[] for _ in stacks] for k in ("without", "with")}
    cpu = {k: np.zeros(len(stacks)) for k in ("without", "with")}
    acks: list = []
    stream_s = 0.0
    for r in range(args.rounds):
        plan = []
        for i, rps in enumerate(rates):
            due = poisson_arrivals(rps, span, args.seed + 10 * r + i)
            plan.append((due, request_targets(graph, due.size, args.seed + 10 * r + i)))
        for kind in ("without", "with"):
            streaming = kind == "with" and not (acks and acks[-1].status != 200)
            writer = WriterProcess(cycle.file, cycle.batch, cycle.cycle) if streaming else None
            c0 = np.array([fig.tree_cpu_s(st.proc.pid) for st in stacks])
            loads = chk.start_loads(urls, name, plan)
            if writer is not None:
                done = sum(a.edges for a in acks)
                got = writer.run(urls[0], name, token, until=time.monotonic() + span - tail,
                                 rate=args.update_rate, binary=not args.json_body,
                                 first=len(acks), max_edges=max(0, args.max_updates - done)
                                 if args.max_updates else 0)  # fmt: skip
                acks += got
                stream_s += got[-1].acked - got[0].sent if got else 0.0
            for ld in loads:
                ld.join()
            cpu[kind] += np.array([fig.tree_cpu_s(st.proc.pid) for st in stacks]) - c0
            for i, ld in enumerate(loads):
                sents[kind][i].append(ld.sent)
    out = {
        "rounds": args.rounds,
        "window_s": span,
        "infer_without_updates": [chk.sent_summary(s) for s in sents["without"]],
        "infer_with_updates": [chk.sent_summary(s) for s in sents["with"]],
        "cpu_s_per_gateway_stack": {k: v.tolist() for k, v in cpu.items()},
        **chk.ack_figures(acks, sents["with"], stream_s),
    }
    return out, acks


def serve(args, stacks: list[Stack], graph, cycle: EdgeCycle, token: str, where) -> dict:
    """Steps 1-4 on running gateways (see the module docstring)."""
    uri, env, ckpt = where
    name, urls = graph.name, [st.url for st in stacks]
    warm = [(np.linspace(0, 2, 20), request_targets(graph, 20, args.seed + 7))] * len(stacks)
    for ld in chk.start_loads(urls, name, warm):  # connections and caches warm, not measured
        ld.join()
    rss = [fig.RssSampler(st) for st in stacks]
    for r in rss:
        r.start()
    out, acks = windows(args, stacks, graph, cycle, token)
    done = [a for a in acks if a.status == 200]
    out["final_version"] = final = max([a.version for a in done], default=0)
    out["reader_catch_up_s"] = [fig.wait_version(u, name, final) for u in urls]
    ref = chk.Reference(graph, cycle.present(len(done)), cycle.edges[:, 1], ckpt)
    out["pyg"] = {"after_updates": ref.check(urls, name, args.sample, args.seed)}
    if not args.no_compaction:
        out.update(chk.compaction_phase(args, urls[0], graph, uri, env, final))
        if out["compaction"].get("ok"):
            for u in urls[1:]:
                fig.wait_version(u, name, final + 1)
            out["pyg"]["after_compaction"] = ref.check(urls, name, args.sample, args.seed)
    for r in rss:
        r.stop.set()
        r.sample()
    out["peak_rss_mib"] = [r.peak for r in rss]
    out["memory_functions"] = [fig.memory_function_stats(st.status()) for st in stacks]
    out["gateway_metrics"] = fig.gateway_update_metrics(urls[0])
    out["graph_info"] = requests.get(f"{urls[0]}/v2/graphs/{name}", timeout=30).json()
    return out
