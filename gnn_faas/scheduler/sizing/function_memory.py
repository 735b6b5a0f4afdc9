"""Memory of a function instance (λGrapher 3.5).

Memory function (Aggregate of one partition of one layer)::

    M = M_runtime + M_V + M_E + M_h
    M_V = distinct source rows read  x row_bytes_in   (h^{l-1} rows gathered)
    M_E = edges                      x EDGE_BYTES      (int64 column + float32 weight)
    M_h = destination rows           x row_bytes_out  (aggregated output rows)

Compute function (Update of one layer)::

    M = M_runtime + M_nn
    M_nn = weight bytes + rows x activation bytes per row (input and output of
           the layer, plus any hidden activations an MLP Update keeps)

Platforms sell memory in steps: :func:`round_memory_mb` rounds up to a multiple
of ``MEMORY_STEP_MB`` (64 MiB, Knative/Kubernetes-friendly and AWS Lambda's 1 MiB
steps rounded to a page-table-friendly size) with a floor of ``MIN_MEMORY_MB``
(128 MiB, AWS Lambda's minimum) and an optional ceiling (10,240 MiB on Lambda).
All functions accept numpy arrays, so the partitioner evaluates many candidate
parts at once.
"""

from __future__ import annotations

import math

import numpy as np

MIB = 1 << 20
INDEX_BYTES = 8  # int64 column index per edge (scipy CSR indices after local renumbering)
WEIGHT_BYTES = 4  # float32 per-edge weight (GCN normalisation, GAT attention)
EDGE_BYTES = INDEX_BYTES + WEIGHT_BYTES
MEMORY_STEP_MB = 64
MIN_MEMORY_MB = 128
MAX_MEMORY_MB = 10240
# Resident size of an idle instance. RSS after the imports, CPython 3.11: about
# 58 MiB for numpy/scipy/flask (memory function, no torch: docs/architecture.md, principle 1)
# and 240 MiB with torch (compute function); the rest is headroom for the HTTP
# server and allocator slack. Override with values measured on the platform.
MEMORY_RUNTIME_MB = 96
COMPUTE_RUNTIME_MB = 384


def memory_function_bytes(
    src_rows, edges, dst_rows, row_bytes_in: int, row_bytes_out: int, runtime_bytes: int
):
    """``M_runtime + M_V + M_E + M_h`` of an Aggregate over ``dst_rows`` rows with
    ``edges`` in-edges touching ``src_rows`` distinct source rows (scalars or arrays)."""
    return (
        runtime_bytes
        + np.asarray(src_rows, dtype=np.int64) * row_bytes_in
        + np.asarray(edges, dtype=np.int64) * EDGE_BYTES
        + np.asarray(dst_rows, dtype=np.int64) * row_bytes_out
    )


def update_activation_row_bytes(
    dim_in: int, dim_out: int, hidden: tuple[int, ...] = (), itemsize: int = 4
) -> int:
    """Activation bytes per row of an Update: its input, output and hidden rows."""
    return int((dim_in + dim_out + sum(hidden)) * itemsize)


def compute_function_bytes(weight_bytes: int, rows, activation_row_bytes: int, runtime_bytes: int):
    """``M_runtime + M_nn`` with ``M_nn = weight_bytes + rows x activation_row_bytes``."""
    return (
        runtime_bytes
        + int(weight_bytes)
        + np.asarray(rows, dtype=np.int64) * int(activation_row_bytes)
    )


def round_memory_mb(
    nbytes: int | float,
    step_mb: int = MEMORY_STEP_MB,
    min_mb: int = MIN_MEMORY_MB,
    max_mb: int | None = None,
) -> int:
    """The memory size to request: ``nbytes`` rounded up to ``step_mb``, at least
    ``min_mb``; ``ValueError`` above ``max_mb`` (the function cannot be sized)."""
    mb = max(min_mb, step_mb * math.ceil(float(nbytes) / MIB / step_mb))
    if max_mb is not None and mb > max_mb:
        raise ValueError(f"needs {mb} MiB, more than the platform's {max_mb} MiB")
    return int(mb)
