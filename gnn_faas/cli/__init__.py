"""The ``gnn-faas`` command line.

Each command lives in its own module exposing ``register(subparsers)``; modules
are imported only to build the parser and must keep heavy imports (torch,
sklearn, boto3) inside their handlers, so ``gnn-faas serve memory`` never loads
torch. Handlers return an exit code; a :class:`GnnFaasError` becomes a one-line
message on stderr and exit code 2, never a traceback; so does an optional module
that is not installed (the message names the pip extra, gnn_faas/extras.py).
"""

from __future__ import annotations

import argparse
import importlib
import sys

from gnn_faas.errors import GnnFaasError
from gnn_faas.extras import missing_extra

# Command modules, in the order ``--help`` lists them.
COMMAND_MODULES = [
    "gnn_faas.cli.ingest",
    "gnn_faas.cli.datasets",
    "gnn_faas.cli.graph",
    "gnn_faas.cli.bench",
    "gnn_faas.cli.train",
    "gnn_faas.cli.model",
    "gnn_faas.cli.serve",
    "gnn_faas.cli.profile",
    "gnn_faas.cli.timeouts",
    "gnn_faas.cli.up",
    "gnn_faas.cli.demo",
    "gnn_faas.cli.size",
    "gnn_faas.cli.precompute",
    "gnn_faas.cli.chart_values",
    "gnn_faas.cli.deploy",
    "gnn_faas.cli.replay",
    "gnn_faas.cli.simulate",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gnn-faas", description="Serverless GNN inference (gnn-faas)."
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except GnnFaasError as exc:
        print(f"gnn-faas {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except ImportError as exc:
        missing = missing_extra(exc, f"gnn-faas {args.command}")
        if missing is None:
            raise
        print(f"gnn-faas {args.command}: error: {missing}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
