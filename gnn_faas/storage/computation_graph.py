"""The computation graph of a set of target vertices, as per-layer blocks.

For ``L`` layers, layer ``l`` (1-based, applied first at ``l = 1``) computes
embeddings for ``D_l``, the vertices within ``L - l`` hops of the targets, from
``D_{l-1}``. Vertices are numbered locally in discovery order (targets first,
then each hop's new vertices), so every ``D_l`` is a *prefix* of ``nodes``:
``D_l = nodes[:layer_sizes[l]]``. One local CSR of (possibly sampled)
in-neighbours covers the expanded vertices ``D_1``; block ``l`` is its first
``layer_sizes[l]`` rows, whose columns all lie below ``layer_sizes[l - 1]``.
Destination vertices are therefore also a prefix of the source vertices, which
is what self-loops and root weights need.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from gnn_faas.errors import InvalidRequest


@dataclass(frozen=True)
class Block:
    """Message passing for one layer: ``num_dst`` rows aggregate from ``num_src``
    columns. ``indptr``/``indices`` are the CSR (local ids; dst ``i`` is src ``i``)."""

    num_dst: int
    num_src: int
    indptr: np.ndarray
    indices: np.ndarray

    @property
    def num_edges(self) -> int:
        return int(self.indices.size)

    def in_degree(self) -> np.ndarray:
        return np.diff(self.indptr)

    def edge_index(self) -> tuple[np.ndarray, np.ndarray]:
        """``(src, dst)`` local ids of every edge (PyG's ``edge_index`` order)."""
        dst = np.repeat(np.arange(self.num_dst, dtype=np.int64), np.diff(self.indptr))
        return self.indices.astype(np.int64, copy=False), dst

    def adjacency(self, dtype=np.float32) -> sp.csr_matrix:
        """The ``num_dst x num_src`` 0/1 matrix whose row ``i`` marks i's in-neighbours."""
        data = np.ones(self.indices.size, dtype=dtype)
        return sp.csr_matrix((data, self.indices, self.indptr), shape=(self.num_dst, self.num_src))


@dataclass(frozen=True)
class ComputationGraph:
    """``nodes``: global ids in discovery order. ``layer_sizes[l] = |D_l|`` for
    ``l = 0..L`` (non-increasing). ``indptr``/``indices``: local in-neighbour CSR
    over ``nodes[:layer_sizes[1]]``. ``target_index[i]``: local id of the i-th
    requested target (requests may repeat a vertex). ``in_degree`` (when
    fetched with ``degrees=True``): the in-degree of every node of ``D_0`` in the
    graph the model sees: the stored graph for full neighbourhoods; for sampled
    ones, the sampled subgraph (0 for the outermost hop), as PyG sees a sampled
    subgraph. Self loops ``v -> v`` are not counted (they stay in the CSR):
    PyG's ``gcn_norm`` replaces them by exactly one, so GCN's normalisation,
    which needs these degrees for source vertices, adds 1 to them."""

    nodes: np.ndarray
    layer_sizes: tuple[int, ...]
    indptr: np.ndarray
    indices: np.ndarray
    target_index: np.ndarray
    in_degree: np.ndarray | None = None

    @property
    def num_layers(self) -> int:
        return len(self.layer_sizes) - 1

    @property
    def input_nodes(self) -> np.ndarray:
        """Global ids whose input features layer 1 needs (``D_0``)."""
        return self.nodes[: self.layer_sizes[0]]

    @property
    def targets(self) -> np.ndarray:
        """Unique targets, global ids (``D_L``)."""
        return self.nodes[: self.layer_sizes[-1]]

    def block(self, layer: int) -> Block:
        """Block for layer ``layer`` in ``1..num_layers``."""
        if not 1 <= layer <= self.num_layers:
            raise IndexError(f"layer must be in 1..{self.num_layers}, got {layer}")
        n_dst = self.layer_sizes[layer]
        indptr = self.indptr[: n_dst + 1]
        return Block(n_dst, self.layer_sizes[layer - 1], indptr, self.indices[: indptr[-1]])

    def blocks(self) -> list[Block]:
        return [self.block(layer) for layer in range(1, self.num_layers + 1)]

    def aggregated_rows(self) -> int:
        """(vertex, layer) pairs aggregated: the work a merged plan does once."""
        return int(sum(self.layer_sizes[1:]))


# -- as frame tensors (/v1/graph, gnn_faas.wire) -----------------------------------
def cg_tensors(cg: ComputationGraph) -> dict[str, np.ndarray]:
    """A computation graph as frame tensors (int64): ``nodes``, ``layer_sizes``,
    ``indptr``, ``indices``, ``target_index`` and, when fetched, ``in_degree``."""
    t = {
        "nodes": cg.nodes.astype(np.int64, copy=False),
        "layer_sizes": np.asarray(cg.layer_sizes, dtype=np.int64),
        "indptr": cg.indptr.astype(np.int64, copy=False),
        "indices": cg.indices.astype(np.int64, copy=False),
        "target_index": np.asarray(cg.target_index, dtype=np.int64),
    }
    if cg.in_degree is not None:
        t["in_degree"] = cg.in_degree.astype(np.int64, copy=False)
    return t


def cg_from_tensors(t: dict[str, np.ndarray]) -> ComputationGraph:
    """Inverse of :func:`cg_tensors` (what a client rebuilds from ``/v1/graph``)."""
    try:
        return ComputationGraph(
            nodes=np.asarray(t["nodes"]),
            layer_sizes=tuple(int(x) for x in t["layer_sizes"]),
            indptr=np.asarray(t["indptr"]),
            indices=np.asarray(t["indices"]),
            target_index=np.asarray(t["target_index"]),
            in_degree=None if "in_degree" not in t else np.asarray(t["in_degree"]),
        )
    except KeyError as exc:
        raise InvalidRequest(f"computation graph frame lacks {exc}") from None
