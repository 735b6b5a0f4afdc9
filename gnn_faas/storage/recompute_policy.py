"""Which candidates precomputed serving recomputes (OMEGA §5.2.2 and Fig. 6).

A query ``q`` reads the embeddings of its in-neighbours; a candidate ``u`` (an
in-neighbour that is not itself a query) has a stored embedding ``p_u`` that
ignores the edges from the queries. With a budget ``γ``, ``k = ceil(γ |C|)``
candidates are recomputed, ranked by a policy:

- ``query_edge_ratio`` (OMEGA): ``|N_Q(u)| / |N(u)|``, the share of ``u``'s
  in-edges that come from the queries: how much of ``u``'s aggregate the
  stored embedding misses;
- ``importance``: ``Σ_{q: u ∈ N(q)} 1 / |N(q)|``, ``u``'s weight in the
  queries' (mean) aggregates: how much an error in ``p_u`` reaches the answer;
- ``random``: a keyed hash of ``(seed, u)`` (deterministic per vertex).

Ties go to the smaller vertex id, so a choice is reproducible.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from gnn_faas.errors import InvalidRequest
from gnn_faas.storage.fetcher import splitmix64

POLICIES = ("query_edge_ratio", "random", "importance")


@dataclass(frozen=True)
class CandidateScores:
    """Per candidate (``ids`` sorted): ``query_edges = |N_Q(u)|``, ``degree =
    |N(u)|`` (the request's added edges included) and ``importance``."""

    ids: np.ndarray
    query_edges: np.ndarray
    degree: np.ndarray
    importance: np.ndarray

    @property
    def query_edge_ratio(self) -> np.ndarray:
        return self.query_edges / np.maximum(self.degree, 1)


def budget_count(budget: float, num_candidates: int) -> int:
    """``ceil(γ · |C|)`` (a tiny tolerance keeps ``0.1 * 30`` at 3)."""
    if not 0.0 <= budget <= 1.0:
        raise InvalidRequest(f"recompute budget must lie in [0, 1], got {budget}")
    return min(num_candidates, math.ceil(budget * num_candidates - 1e-9))


def select_recomputed(
    scores: CandidateScores, budget: float, policy: str, seed: int = 0
) -> np.ndarray:
    """The ids of the candidates to recompute (sorted by rank, best first)."""
    if policy not in POLICIES:
        raise InvalidRequest(f"unknown recompute policy {policy!r}: use one of {POLICIES}")
    k = budget_count(budget, scores.ids.size)
    if k == 0:
        return np.zeros(0, np.int64)
    if policy == "query_edge_ratio":
        key = -scores.query_edge_ratio
    elif policy == "importance":
        key = -scores.importance
    else:
        with np.errstate(over="ignore"):
            key = splitmix64(np.uint64(seed) ^ scores.ids.astype(np.uint64)).astype(np.float64)
    order = np.lexsort((scores.ids, key))
    return scores.ids[order[:k]].astype(np.int64)
