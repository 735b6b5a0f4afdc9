"""The Grafana dashboard shipped with the chart, and the series its queries name.

:func:`metric_names` reads the metric names out of a PromQL expression:
strings, label matchers (``{...}``), range and subquery selectors
(``[...]``), grouping clauses (``by (...)``, ``on (...)``, ...), durations, numbers and
Grafana's ``$variables`` go; what is left are identifiers, of which those
followed by ``(`` are functions and the rest, minus PromQL's keywords, are
metric names. :func:`sample_names` is the set of sample names in Prometheus
text (what a scrape would store).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

from tests.kube import CHART

DASHBOARD = CHART / "dashboards" / "gnn-faas.json"
KEYWORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "offset", "bool",
    "and", "or", "unless", "atan2", "inf", "nan",
}  # fmt: skip
_IDENT = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def load(path: Path = DASHBOARD) -> dict:
    return json.loads(path.read_text())


def panels(dash: dict) -> Iterator[dict]:
    for p in dash["panels"]:
        yield p
        yield from p.get("panels", [])  # panels of a collapsed row


def expressions(dash: dict) -> Iterator[tuple[str, str]]:
    """``(where, PromQL)`` of every panel target and query variable."""
    for p in panels(dash):
        for t in p.get("targets", []):
            yield f"panel {p['title']!r} {t['refId']}", t["expr"]
    for v in dash.get("templating", {}).get("list", []):
        if v.get("type") == "query":
            q = v["query"]
            q = q["query"] if isinstance(q, dict) else q
            m = re.fullmatch(r"label_values\((?:(.*),\s*)?(\w+)\)", q.strip())
            yield f"variable {v['name']!r}", (m.group(1) or "") if m else q


def metric_names(expr: str) -> set[str]:
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # strings (label values)
    e = re.sub(r"\{[^{}]*\}", " ", e)  # label matchers
    e = re.sub(r"\[[^\[\]]*\]", " ", e)  # ranges, subqueries
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)", " ", e)
    e = re.sub(r"\$\{?\w+\}?", " ", e)  # Grafana variables
    e = re.sub(r"\b(\d+(ms|s|m|h|d|w|y))+\b", " ", e)  # durations (offset 1h30m)
    e = re.sub(r"\b\d+(\.\d+)?(e[+-]?\d+)?\b", " ", e)  # numbers
    names = set()
    for m in _IDENT.finditer(e):
        rest = e[m.end() :].lstrip()
        if rest.startswith("(") or m.group(0).lower() in KEYWORDS:
            continue
        names.add(m.group(0))
    return names


def sample_names(text: str) -> set[str]:
    """Names of the samples in a Prometheus text exposition."""
    out = set()
    for line in text.splitlines():
        if line and not line.startswith("#"):
            m = _IDENT.match(line)
            if m:
                out.add(m.group(0))
    return out
