"""Global perspective optimisation: move requests between open buffers
(λGrapher Algorithm 1).

Routing is greedy per arrival; later arrivals can make another buffer a better
home for a waiting request. The total gain of the open buffers is

    G = α · Σ_b (Σ_{r∈b} |U_r| − |U_b|) / W  −  β · Σ_r (close_{b(r)} − arrival_r) / (SLO · N)

that is Σ over buffers of ``α·S_b − β·D_b``, each weighted by its share of the
vertex work ``W = Σ_r |U_r|`` (for ``S_b = 1 − |U_b| / Σ_{r∈b}|U_r|``) and of
the ``N`` waiting requests (for ``D_b``, the mean wait over the SLO). Moving
request ``r`` from ``b`` to ``c`` changes it by

    ΔG = α · (|U_r ∩ U_c| − |U_r ∩ U_{b∖r}|) / W
         − β · ((close_c − close_b) + (N_b − 1)(close_b' − close_b)) / (SLO · N)

where ``close_b'`` is ``b``'s close time without ``r`` (``r`` may have been its
most urgent request). Greedy: compute ΔG for every (request, target) pair at
once from one gather of the per-slot vertex counts, apply the best move if
ΔG > 0, repeat (at most ``max_moves`` times). A move is allowed only if the
target can take the request (request and vertex caps) and closes early enough
for it (``close_c <= deadline_r − exec_estimate``), so no move breaks an SLO and
the target's close time is unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gnn_faas.gateway.buffer import Buffer
from gnn_faas.gateway.sharing import SharingIndex

_EPS = 1e-12


@dataclass(frozen=True)
class Move:
    """Move request ``request_id`` from slot ``source`` to slot ``target``;
    ``gain``: the rise of the total gain ``G``."""

    request_id: str
    source: int
    target: int
    gain: float


def total_gain(buffers: Sequence[Buffer | None], alpha: float, beta: float, slo_s: float) -> float:
    """``G`` for the open buffers (uses each buffer's ``union_size`` and ``close_at``)."""
    open_ = [b for b in buffers if b is not None and b.requests]
    work = sum(b.total_vertices for b in open_)
    n = sum(b.num_requests for b in open_)
    if n == 0:
        return 0.0
    saved = sum(b.total_vertices - b.union_size for b in open_)
    wait = sum(b.close_at * b.num_requests - sum(r.arrival for r in b.requests) for b in open_)
    return alpha * saved / max(work, 1) - beta * wait / (slo_s * n)


def optimise(
    buffers: Sequence[Buffer | None],
    index: SharingIndex,
    *,
    alpha: float,
    beta: float,
    slo_s: float,
    exec_estimate_s: float,
    max_requests: int,
    max_vertices: int | None = None,
    max_moves: int = 16,
) -> list[Move]:
    """The greedy sequence of moves (the caller applies them in order).
    Neither ``buffers`` nor ``index`` is modified."""
    slots = [s for s, b in enumerate(buffers) if b is not None and b.requests]
    if len(slots) < 2 or max_moves <= 0:
        return []
    st = _State.of(buffers, slots, index, exec_estimate_s)
    reqs, nslots = st.reqs, len(buffers)
    moves: list[Move] = []
    for _ in range(max_moves):
        close, close_src, close_src_after = _closes(st, nslots)
        delta, new_vertices = _move_gains(st, close, close_src, close_src_after, alpha, beta, slo_s)
        allowed = (close[None, :] <= st.cap_r[:, None]) & (st.is_open & (st.n < max_requests))[
            None, :
        ]
        if max_vertices is not None:
            allowed &= st.k[None, :] + new_vertices <= max_vertices
        allowed[np.arange(len(reqs)), st.where] = False
        delta = np.where(allowed, delta, -np.inf)
        flat = int(np.argmax(delta))
        i, c = divmod(flat, nslots)
        best = float(delta[i, c])
        if not best > _EPS:
            break
        b = int(st.where[i])
        st.move(i, b, c)
        moves.append(Move(reqs[i][1].id, b, int(c), best))
    return moves


@dataclass
class _State:
    """The waiting requests and the slots as arrays, updated move by move.

    ``local[v, s]``: how many requests of slot ``s`` hold vertex ``v`` (of the
    ``uniq`` vertices); ``inv``/``starts``/``sizes``/``seg_of``: each request's
    vertices in ``concat`` order; ``where``: each request's slot; ``cap_r``: the
    latest close a request allows; ``k``, ``n``: vertices and requests per slot."""

    reqs: list
    sizes: np.ndarray
    starts: np.ndarray
    inv: np.ndarray
    local: np.ndarray
    seg_of: np.ndarray
    where: np.ndarray
    cap_r: np.ndarray
    k: np.ndarray
    n: np.ndarray
    is_open: np.ndarray
    deadline: np.ndarray
    tmax: np.ndarray
    work: float
    n_total: float

    @classmethod
    def of(
        cls,
        buffers: Sequence[Buffer | None],
        slots: list[int],
        index: SharingIndex,
        exec_estimate_s: float,
    ) -> _State:
        nslots = len(buffers)
        reqs = [(s, r) for s in slots for r in buffers[s].requests]
        sizes = np.array([r.vertex_set.size for _, r in reqs], dtype=np.int64)
        if np.any(sizes == 0):
            raise ValueError("every waiting request needs a non-empty vertex set")
        nreq = len(reqs)
        starts = np.concatenate(([0], np.cumsum(sizes)[:-1]))
        concat = np.concatenate([r.vertex_set for _, r in reqs])
        uniq, inv = np.unique(concat, return_inverse=True)
        local = np.take(index.counts, uniq, axis=0).astype(np.int64)  # [V, slots]
        seg_of = np.repeat(np.arange(nreq), sizes)

        where = np.array([s for s, _ in reqs], dtype=np.int64)
        cap_r = np.array([r.deadline - exec_estimate_s for _, r in reqs])
        k = index.sizes.astype(np.int64).copy()
        n = np.zeros(nslots, np.int64)
        np.add.at(n, where, 1)
        is_open = np.zeros(nslots, bool)
        is_open[slots] = True
        deadline = np.full(nslots, math.inf)
        tmax = np.full(nslots, math.inf)
        for s in slots:
            deadline[s], tmax[s] = buffers[s].deadline, buffers[s].tmax_at
        return cls(
            reqs, sizes, starts, inv, local, seg_of, where, cap_r, k, n, is_open,
            deadline, tmax, work=float(sizes.sum()), n_total=float(nreq),
        )  # fmt: skip

    def move(self, i: int, b: int, c: int) -> None:
        """Request ``i`` from slot ``b`` to slot ``c``."""
        verts = self.inv[self.starts[i] : self.starts[i] + self.sizes[i]]
        self.local[verts, b] -= 1
        self.k[b] -= int(np.count_nonzero(self.local[verts, b] == 0))
        self.k[c] += int(np.count_nonzero(self.local[verts, c] == 0))
        self.local[verts, c] += 1
        self.n[b] -= 1
        self.n[c] += 1
        self.where[i] = c
        if self.n[b] == 0:
            self.is_open[b] = False


def _closes(st: _State, nslots: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(close, close_src, close_src_after)``: each slot's close time (its
    deadline, Tmax or its most urgent request's cap), each request's source
    slot's close, and that close without the request: the second smallest cap
    for the most urgent one, else unchanged."""
    where, cap_r, nreq = st.where, st.cap_r, len(st.reqs)
    cap_s = np.full(nslots, math.inf)
    np.minimum.at(cap_s, where, cap_r)
    order = np.lexsort((cap_r, where))  # by slot, then cap
    slot_sorted = where[order]
    first = np.ones(nreq, bool)
    first[1:] = slot_sorted[1:] != slot_sorted[:-1]
    head = np.flatnonzero(first)
    second = np.full(nslots, math.inf)
    nxt = head + 1
    same = nxt < nreq
    same[same] = slot_sorted[nxt[same]] == slot_sorted[head[same]]
    second[slot_sorted[head[same]]] = cap_r[order[nxt[same]]]
    is_head = np.zeros(nreq, bool)
    is_head[order[head]] = True
    cap_without = np.where(is_head, second[where], cap_s[where])
    close = np.minimum(np.minimum(st.deadline, st.tmax), cap_s)
    close[~st.is_open] = 0.0  # free slots are never targets; keep the sums finite
    close_src_after = np.minimum(np.minimum(st.deadline[where], st.tmax[where]), cap_without)
    return close, close[where], close_src_after


def _move_gains(
    st: _State,
    close: np.ndarray,
    close_src: np.ndarray,
    close_src_after: np.ndarray,
    alpha: float,
    beta: float,
    slo_s: float,
) -> tuple[np.ndarray, np.ndarray]:
    """``(delta, new_vertices)``, both ``[R, slots]``: the change of
    ``α·sharing − β·wait`` if request ``r`` moved to slot ``s``, and the
    vertices it would add there."""
    where, n = st.where, st.n
    g = st.local[st.inv]  # [T, slots] counts of each request's vertices in each slot
    overlap = np.add.reduceat((g > 0).astype(np.int64), st.starts, axis=0)  # [R, slots]
    own_shared = np.add.reduceat(
        (g[np.arange(g.shape[0]), where[st.seg_of]] >= 2).astype(np.int64), st.starts
    )
    new_vertices = st.sizes[:, None] - overlap

    d_share = alpha * (overlap - own_shared[:, None]) / st.work
    # The others left in the source wait until its new close time.
    relax = np.where(n[where] > 1, (n[where] - 1) * (close_src_after - close_src), 0.0)
    d_wait = (close[None, :] - close_src[:, None]) + relax[:, None]
    return d_share - beta * d_wait / (slo_s * st.n_total), new_vertices
