"""gnn-faas: serverless GNN inference.

This package root stays import-light on purpose: memory functions import
``gnn_faas.storage`` and ``gnn_faas.functions.memory`` and must never pull in
torch (docs/architecture.md, principle 1). :class:`GatewayClient` (a client of
the gateway, :mod:`gnn_faas.client`) is imported on first use of the name.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["GatewayClient", "InferResult", "__version__"]

if TYPE_CHECKING:
    from gnn_faas.client import GatewayClient, InferResult


def __getattr__(name: str) -> Any:
    # PEP 562: `from gnn_faas import GatewayClient` without importing requests and
    # numpy into every process that imports a gnn_faas module
    if name in ("GatewayClient", "InferResult"):
        from gnn_faas import client

        return getattr(client, name)
    raise AttributeError(f"module 'gnn_faas' has no attribute {name!r}")
