"""The closed sets of names the serving config, its schema and the model
checkpoints share (one definition, imported by each)."""

from __future__ import annotations

ARCHS = ("gcn", "sage", "gin", "gat")
MODES = ("graph_sharing", "no_sharing", "request_centric")
EMBEDDINGS = ("exact", "precomputed")
RECOMPUTE_POLICIES = ("query_edge_ratio", "random", "importance")
RECOMPUTE_FROM = ("state", "neighbourhood")
CACHE_PRIORS = ("degree", "fap")
DEVICES = ("auto", "cpu", "cuda")
OBJECTIVES = ("cost", "balanced", "latency")  # the buffers' objective (gateway/work_conserving.py)
