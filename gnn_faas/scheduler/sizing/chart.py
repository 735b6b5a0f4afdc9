"""Function sizes for the Helm chart from ``gnn-faas size`` output.

``gnn-faas size`` sizes every *stage* of a model (``aggregate-L`` runs in the
memory function, ``update-L`` in the compute function; λGrapher 3.5): cores
from the solver (``bayes_opt`` or ``exhaustive``) and memory from the memory
formulas. The chart deploys one function per kind and model, serving every
layer's stage of that kind, so its size must fit the largest of them::

    cpu(kind)    = max over the kind's stages of cores(stage)
    memory(kind) = max over the kind's stages of memory_mb(stage)

(one stage runs at a time on an instance; pipelining overlaps layers across
instances, not within one). The result is the chart's ``sizing`` value.
"""

from __future__ import annotations

from typing import Any

from gnn_faas.errors import InvalidRequest

STAGE_KINDS = {"aggregate": "memory", "update": "compute"}
MIN_MEMORY_MB = 64  # the chart's schema floor


def _cpu(cores: float) -> str:
    """Cores as a Kubernetes CPU quantity: whole cores plain, else millicores."""
    milli = int(round(cores * 1000))
    return str(milli // 1000) if milli % 1000 == 0 else f"{milli}m"


def sizing_values(report: dict[str, Any], model: str, solver: str = "bayes_opt") -> dict:
    """``{"sizing": {model: {"memory": {cpu, memoryMb}, "compute": {...}}}}``."""
    try:
        cores = report[solver]["cores"]
        memory = report["memory_mb"]
    except (KeyError, TypeError):
        raise InvalidRequest(
            f"not a `gnn-faas size` report: it needs {solver}.cores and memory_mb"
        ) from None
    sizes: dict[str, dict[str, Any]] = {}
    for stage, c in cores.items():
        kind = STAGE_KINDS.get(stage.split("-", 1)[0])
        if kind is None:
            raise InvalidRequest(f"unknown stage {stage!r} in the size report")
        if stage not in memory:
            raise InvalidRequest(f"stage {stage!r} has cores but no memory_mb")
        row = sizes.setdefault(kind, {"cores": 0.0, "memoryMb": MIN_MEMORY_MB})
        row["cores"] = max(row["cores"], float(c))
        row["memoryMb"] = max(row["memoryMb"], int(memory[stage]))
    missing = {"memory", "compute"} - set(sizes)
    if missing:
        raise InvalidRequest(f"the size report has no stage for {sorted(missing)} functions")
    return {
        "sizing": {
            model: {
                kind: {"cpu": _cpu(row["cores"]), "memoryMb": row["memoryMb"]}
                for kind, row in sorted(sizes.items())
            }
        }
    }
