"""Trace selection shared by ``gnn-faas replay`` and ``gnn-faas simulate``.

``TRACE`` is ``azure2019``, ``azure2021`` or ``twitter`` (files from
``../shared/datasets`` unless ``--trace-file``); ``--day`` takes the whole
trace, otherwise ``--minutes`` from ``--start-minute``, preceded by
``--warmup`` seconds of the trace that are played (or simulated) but not
measured: figures are for the window only, with the instances the warm-up
left behind, rather than for a system starting cold into full load. Twitter reads the
per-second day, or the raw first hour with ``--raw-hour``.
"""

from __future__ import annotations

import argparse

from gnn_faas.errors import InvalidRequest
from gnn_faas.traces.trace import SPREADS, Trace

TRACES = ("azure2019", "azure2021", "twitter")


def add_trace_arguments(p: argparse.ArgumentParser, default_minutes: float = 5.0) -> None:
    g = p.add_argument_group("trace")
    g.add_argument("--trace-file", default=None, help="trace file (default: ../shared/datasets)")
    g.add_argument("--day", action="store_true", help="the whole trace")
    g.add_argument("--days", type=int, default=None, metavar="N",
                   help="the whole trace played N times back to back, the request order going "
                        "on (a week: twitter --days 7); implies --day")  # fmt: skip
    g.add_argument("--minutes", type=float, default=default_minutes, help="window length")
    g.add_argument("--start-minute", type=float, default=0.0, help="window start (minutes)")
    g.add_argument(
        "--warmup",
        type=float,
        default=0.0,
        help="seconds of the trace before the window, played but not measured",
    )
    g.add_argument("--speedup", type=float, default=1.0, help="time compression (shape kept)")
    g.add_argument("--seed", type=int, default=0, help="seed for spreading arrivals")
    g.add_argument("--spread", choices=SPREADS, default=None, help="spread inside a bin")
    g.add_argument("--rank", type=int, default=0, help="azure2019: function by invocation rank")
    g.add_argument("--function", action="append", default=None, help="azure: function hash")
    g.add_argument("--frequent", action="store_true", help="azure2019: all > 10,000 invocations")
    g.add_argument("--random-offset", action="store_true", help="azure2019: shift per function")
    g.add_argument("--raw-hour", action="store_true", help="twitter: raw inter-arrival hour")


def load_trace(name: str, args: argparse.Namespace) -> Trace:
    # here, not at the top: the CLI's parser imports this module for
    # add_trace_arguments, and building the parser must stay light
    from gnn_faas.traces import azure2019, azure2021, twitter

    if name == "azure2019":
        trace = azure2019.load(
            args.trace_file,
            names=args.function,
            rank=None if args.function or args.frequent else args.rank,
            frequent=args.frequent,
            spread_method=args.spread or "exponential",
            seed=args.seed,
            random_offset=args.random_offset,
            speedup=args.speedup,
        )
    elif name == "azure2021":
        trace = azure2021.load(args.trace_file, names=args.function, speedup=args.speedup)
    elif name == "twitter":
        if args.raw_hour:
            trace = twitter.load_raw_hour(args.trace_file, speedup=args.speedup)
        elif (window := _window(args)) is not None:  # only the window's seconds
            start, length, warm = window
            w = twitter.load_window(start, length, args.trace_file, warmup_s=warm,
                                    spread_method=args.spread or "uniform", seed=args.seed,
                                    speedup=args.speedup)  # fmt: skip
            return _measured(w, name)
        else:
            trace = twitter.load_day(
                args.trace_file,
                spread_method=args.spread or "uniform",
                seed=args.seed,
                speedup=args.speedup,
            )
    else:
        raise InvalidRequest(f"unknown trace {name!r}; choose from {list(TRACES)}")
    warmup = float(getattr(args, "warmup", 0.0) or 0.0)
    if warmup < 0:
        raise InvalidRequest("--warmup must be >= 0 seconds")
    days = getattr(args, "days", None)
    if days is not None and days < 1:
        raise InvalidRequest("--days must be at least 1")
    if args.day or days:
        if warmup:
            raise InvalidRequest("--warmup needs a window (--minutes, --start-minute), not --day")
        return trace
    if args.minutes <= 0 or args.start_minute < 0:
        raise InvalidRequest("--minutes must be positive and --start-minute >= 0")
    start, length, warm = _window(args)  # type: ignore[misc]  (the checks above passed)
    return _measured(trace.window(start, length, warmup_s=warm), name)


def _window(args: argparse.Namespace) -> tuple[float, float, float] | None:
    """``(start, length, warm-up)`` in seconds of the window the arguments ask
    for (as :func:`load_trace` cuts it), or None: the whole trace, or
    arguments it refuses."""
    warmup = float(getattr(args, "warmup", 0.0) or 0.0)
    if args.day or getattr(args, "days", None) is not None or warmup < 0:
        return None
    if args.minutes <= 0 or args.start_minute < 0:
        return None
    start = args.start_minute * 60.0
    warm = min(warmup, start)  # as much of it as the trace holds before the window
    return start - warm, args.minutes * 60.0 + warm, warm


def _measured(w: Trace, name: str) -> Trace:
    if w.measured_requests == 0:
        raise InvalidRequest(f"no arrivals in that window of the {name} trace")
    return w


UPDATES = ("bitcoin-otc-time", "higgs-activity")  # traces/update_stream.py's streams


def add_update_arguments(p: argparse.ArgumentParser, what: str, token: bool = False) -> None:
    """``--updates STREAM``, ``--update-rate R``, ``--update-batch B`` (and
    ``--token`` for a command that writes to a gateway) in an "updates" group."""
    u = p.add_argument_group("updates")
    u.add_argument("--updates", default=None, metavar="STREAM", choices=UPDATES,
                   help=f"{' | '.join(UPDATES)}: {what}")  # fmt: skip
    u.add_argument(
        "--update-rate",
        type=float,
        default=None,
        metavar="R",
        help="edges per second (default: the whole stream over the measured window)",
    )
    u.add_argument("--update-batch", type=int, default=1000, metavar="B",
                   help="edges per batch, one version each (default 1000)")  # fmt: skip
    if token:
        u.add_argument(
            "--token", default=None, help="the graph's write token (default: $GNN_FAAS_WRITE_TOKEN)"
        )
