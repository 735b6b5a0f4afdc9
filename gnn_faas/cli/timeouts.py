"""``gnn-faas timeouts``: fit and evaluate the decision-tree timeout configurator.

``fit`` replays a graph's real request order (``request_order.bin``) with
arrivals from the Twitter trace (busiest window, scaled to ``--rps``; several
comma-separated rates give one stream each), labels every decision point with
its hindsight-best decision, refits (DAgger rounds) and writes the tree as
JSON. ``evaluate`` replays a tree (default: the bundled one for the graph) and
prints its figures. Both print one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("timeouts", help="fit or evaluate the timeout decision tree")
    cmds = p.add_subparsers(dest="timeouts_command", metavar="ACTION", required=True)

    fit = cmds.add_parser("fit", help="replay a trace, label decisions in hindsight, fit a tree")
    _stream_args(fit)
    fit.add_argument("--out", required=True, help="where to write the tree (JSON)")
    fit.add_argument("--rounds", type=int, default=2, help="oracle round + DAgger rounds")
    fit.add_argument("--max-depth", type=int, default=6)
    fit.add_argument("--min-samples-leaf", type=int, default=10)
    fit.add_argument("--gamma", type=float, default=0.1, help="T0 = gamma * SLO")
    fit.add_argument("--delta", type=float, default=0.5, help="Tmax = delta * SLO")
    fit.add_argument("--tau", type=float, default=0.1, help="decision interval, fraction of SLO")
    fit.add_argument("--max-steps", type=int, default=3, help="largest extension, in taus")
    fit.add_argument("--alpha", type=float, default=1.0, help="gain weight of sharing")
    fit.add_argument("--beta", type=float, default=0.5, help="gain weight of delay")
    fit.set_defaults(handler=_fit)

    ev = cmds.add_parser("evaluate", help="replay a trace through a fitted tree")
    _stream_args(ev)
    ev.add_argument("--tree", help="tree JSON (default: the bundled tree of --graph)")
    ev.set_defaults(handler=_evaluate)


def _stream_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--store", required=True, help="graph store URI (file://, s3://, redis://)")
    p.add_argument("--graph", required=True, help="graph name in the store")
    p.add_argument("--trace", default="twitter", help="'twitter' or a .npz with per-second 'count'")
    p.add_argument("--rps", default="40", help="mean requests/s; comma-separated for several")
    p.add_argument("--duration", type=float, default=60.0, help="seconds of trace per stream")
    p.add_argument("--slo", type=float, default=0.3, help="SLO in seconds")
    p.add_argument("--hops", type=int, default=2)
    p.add_argument("--fanouts", help="comma-separated fanout per hop (default: all neighbours)")
    p.add_argument("--exec-estimate", type=float, default=0.05, help="seconds after a close")
    p.add_argument("--num-buffers", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)


def _int_list(text: str | None) -> list[int] | None:
    if not text:
        return None
    return [int(x) for x in text.split(",")]


def _streams(args: argparse.Namespace):
    from gnn_faas.errors import InvalidRequest
    from gnn_faas.gateway.timeout_history import trace_request_stream
    from gnn_faas.storage.format import open_graph
    from gnn_faas.traces import twitter

    try:
        rates = [float(x) for x in str(args.rps).split(",")]
        fanouts = _int_list(args.fanouts)
    except ValueError:
        raise InvalidRequest("--rps and --fanouts take comma-separated numbers") from None
    if args.duration <= 0 or args.slo <= 0 or any(r <= 0 for r in rates):
        raise InvalidRequest("--rps, --duration and --slo must be positive")
    counts = twitter.load_per_second(None if args.trace == "twitter" else args.trace)
    graph = open_graph(args.store, args.graph)
    streams = []
    for k, rps in enumerate(rates):
        arrivals = twitter.arrivals(rps, args.duration, seed=args.seed + k, counts=counts)
        # Each stream starts at a different point of the request order.
        sets = trace_request_stream(graph, arrivals, args.hops, fanouts, offset=k * 10_000)
        streams.append((arrivals, sets))
    return graph, rates, streams


def _config(args: argparse.Namespace, params=None):
    from gnn_faas.gateway.buffer_pool import BufferConfig
    from gnn_faas.gateway.timeout_configurator import TimeoutParams

    if params is None:
        params = TimeoutParams(
            gamma=args.gamma,
            delta=args.delta,
            tau=args.tau,
            max_steps=args.max_steps,
            alpha=args.alpha,
            beta=args.beta,
        )
    return BufferConfig.from_params(
        params,
        slo_s=args.slo,
        exec_estimate_s=args.exec_estimate,
        num_buffers=args.num_buffers,
    )


def _fit(args: argparse.Namespace) -> int:
    from gnn_faas.gateway.timeout_history import fit_timeout_tree

    try:
        config = _config(args)
    except ValueError as exc:
        from gnn_faas.errors import InvalidRequest

        raise InvalidRequest(str(exc)) from None
    graph, rates, streams = _streams(args)
    tree, report = fit_timeout_tree(
        streams,
        config,
        graph.num_nodes,
        rounds=args.rounds,
        max_depth=args.max_depth,
        min_samples_leaf=args.min_samples_leaf,
        meta={
            "graph": args.graph,
            "trace": args.trace,
            "rps": rates,
            "duration_s": args.duration,
            "slo_s": args.slo,
            "hops": args.hops,
            "fanouts": _int_list(args.fanouts),
            "exec_estimate_s": args.exec_estimate,
            "num_buffers": args.num_buffers,
            "seed": args.seed,
        },
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tree.save(out)
    report["out"] = str(out)
    report["rps"] = rates
    json.dump(report, sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
    return 0


def _evaluate(args: argparse.Namespace) -> int:
    from gnn_faas.gateway.timeout_configurator import DecisionTreeTimeoutConfigurator
    from gnn_faas.gateway.timeout_history import replay_buffers

    if args.tree:
        tree = DecisionTreeTimeoutConfigurator.load(args.tree)
    else:
        tree = DecisionTreeTimeoutConfigurator.bundled(args.graph)
    config = _config(args, tree.params)
    graph, rates, streams = _streams(args)
    figures = [replay_buffers(a, u, config, graph.num_nodes, tree).figures() for a, u in streams]
    json.dump({"rps": rates, "replay": figures}, sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
    return 0
