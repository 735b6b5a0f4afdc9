"""``gnn-faas chart-values``: a Helm values file from ``gnn-faas size`` output.

    gnn-faas size --model var/models/bitcoin-otc > size.json
    gnn-faas chart-values --size size.json --model bitcoin-otc --out sizing.yaml
    helm upgrade --install gnn-faas charts/ -f sizing.yaml

Writes the chart's ``sizing`` value (scheduler/sizing/chart.py: per kind, the
largest cores and memory of its stages).
"""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("chart-values", help="Helm values (function sizes) from `gnn-faas size`")
    p.add_argument("--size", required=True, help="JSON written by `gnn-faas size` ('-': stdin)")
    p.add_argument("--model", required=True, help="the chart's model name these sizes are for")
    p.add_argument("--solver", default="bayes_opt", choices=("bayes_opt", "exhaustive"))
    p.add_argument("--out", default="-", help="values file to write ('-': stdout)")
    p.set_defaults(handler=_chart_values)


def _chart_values(args: argparse.Namespace) -> int:
    import json
    import sys
    from pathlib import Path

    import yaml

    from gnn_faas.errors import InvalidRequest
    from gnn_faas.scheduler.sizing.chart import sizing_values

    try:
        text = sys.stdin.read() if args.size == "-" else Path(args.size).read_text()
        report = json.loads(text)
    except OSError as exc:
        raise InvalidRequest(f"cannot read {args.size}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise InvalidRequest(f"{args.size} is not JSON ({exc})") from None
    values = sizing_values(report, args.model, args.solver)
    out = "# function sizes from `gnn-faas size` (gnn-faas chart-values)\n" + yaml.safe_dump(
        values, sort_keys=True
    )
    if args.out == "-":
        sys.stdout.write(out)
    else:
        Path(args.out).write_text(out)
        print(f"wrote {args.out}", file=sys.stderr)
    return 0
