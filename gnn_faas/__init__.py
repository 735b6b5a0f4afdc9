"""gnn-faas: serverless GNN inference.

This package root stays import-light on purpose: memory functions import
``gnn_faas.storage`` and ``gnn_faas.functions.memory`` and must never pull in
torch (docs/architecture.md, principle 1).
"""

__version__ = "0.1.0"
