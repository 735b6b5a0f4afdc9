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
    sizes = _kind_sizes(report, solver)
    return {
        "sizing": {
            model: {
                kind: {"cpu": _cpu(row["cores"]), "memoryMb": row["memoryMb"]}
                for kind, row in sorted(sizes.items())
            }
        }
    }


def serving_sizes(report: dict[str, Any], solver: str = "bayes_opt") -> dict[str, Any]:
    """The same sizes as a serving config's model keys (``gnn-faas up --config``):
    ``memory_function_mb``, ``compute_function_mb``, ``memory_vcpus``,
    ``compute_vcpus``."""
    sizes = _kind_sizes(report, solver)
    return {
        "memory_function_mb": sizes["memory"]["memoryMb"],
        "compute_function_mb": sizes["compute"]["memoryMb"],
        "memory_vcpus": sizes["memory"]["cores"],
        "compute_vcpus": sizes["compute"]["cores"],
    }


def _kind_sizes(report: dict[str, Any], solver: str) -> dict[str, dict[str, Any]]:
    """Per function kind: the largest cores and memory of its stages."""
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
    return sizes
