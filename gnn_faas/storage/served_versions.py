"""A graph's versions as a server reads them: each base's structure resident or
chunk-cached within a budget, its k-hop fetcher kept per base.

The gateway opens its graphs so (``gateway/data_plane.open_versions``), and so
does its writer process (``gateway/graph_writer.py``), which keeps states of
its own to commit on.
"""

from __future__ import annotations

import logging

from gnn_faas.storage.backends import open_backend
from gnn_faas.storage.fetcher import KHopFetcher
from gnn_faas.storage.format import GraphHandle
from gnn_faas.storage.resident import Structure, open_structure
from gnn_faas.storage.versions import GraphVersions

log = logging.getLogger("gnn_faas.gateway")


def versions_on(
    store: str,
    name: str,
    budget_bytes: int,
    freshness_s: float = 1.0,
    preloaded: Structure | None = None,
) -> GraphVersions:
    """Graph ``name``'s versions on ``store``: each base's structure resident when
    it fits ``budget_bytes``, else chunk-cached (``preloaded``: one already
    verified, used when it is the current base's); the fetchers and structures
    kept per base (``.fetchers``, ``.structures``, by prefix)."""
    backend = open_backend(store)
    fetchers: dict[str, KHopFetcher] = {}
    structures: dict[str, Structure] = {}

    def open_base(prefix: str):
        graph = GraphHandle(backend, name, prefix=prefix)
        if preloaded is not None and preloaded.prefix == prefix and preloaded.resident:
            structure = preloaded
        else:
            structure = open_structure(graph, budget_bytes)
        log.info("graph %s (base %s): %s", name, prefix, structure.describe())
        fetcher = KHopFetcher(graph, structure=structure)
        fetchers[prefix], structures[prefix] = fetcher, structure
        return graph, fetcher.base_neighbours

    versions = GraphVersions(backend, name, open_base, freshness_s=freshness_s)
    versions.fetchers, versions.structures = fetchers, structures
    return versions
