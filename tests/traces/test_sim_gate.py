"""The simulator's fused arrival path answers as the gateway's pool does.

:meth:`~gnn_faas.traces.sim_gate.FusedGate.alone` must give every arrival the
answer :meth:`BufferPoolState.submit_alone` gives it and leave the pool, its
arrival rate and its gate exactly as that call leaves them. Two pools take the
same random stream (bursts that make company worth waiting for, lulls, a
request that joins a buffer whenever neither dispatches it alone, executions
that end at random later times, under every objective, capacity and slack),
one through each path, and are compared after every event.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from gnn_faas.gateway.buffer_pool import BufferConfig, BufferPoolState, PendingRequest
from gnn_faas.traces.sim_gate import FusedGate

NODES = 200
CASES = [
    (objective, capacity, slack, seed)
    for objective, capacity in (("balanced", 1), ("balanced", 3), ("latency", 2), ("cost", 2))
    for slack in (0.1, 2.0)
    for seed in (1, 2)
    if not (objective == "cost" and seed == 2)
]  # 14 streams; slack 2.0 makes company worth a wait at the bursts' rate


def _state(objective: str, capacity: int, slack: float) -> BufferPoolState:
    cfg = BufferConfig(slo_s=0.3, objective=objective, latency_slack=slack, exec_estimate_s=0.02)
    state = BufferPoolState(cfg, NODES)
    if objective != "cost":
        state.set_capacity(capacity, 0.0)
    return state


def _figures(state: BufferPoolState) -> tuple:
    return (state.stats(), state.rate._value, state.rate._last, state.gate.in_flight,
            state.next_buffer_id, state.next_event_time())  # fmt: skip


@pytest.mark.parametrize(("objective", "capacity", "slack", "seed"), CASES)
def test_fused_arrivals_answer_as_submit_alone(objective, capacity, slack, seed):
    rng = random.Random(seed)
    sets = [np.unique(np.array([rng.randrange(NODES) for _ in range(rng.randint(1, 40))]))
            for _ in range(30)]  # fmt: skip
    fused, ref = _state(objective, capacity, slack), _state(objective, capacity, slack)
    alone = FusedGate(fused).alone
    ends: list[tuple[float, int]] = []  # (end time, requests) of executions in flight

    def both(call) -> None:
        """``call`` on both pools: the same buffers close; their executions end later."""
        got, want = call(fused), call(ref)
        assert _closes(got) == _closes(want)
        for cb in got:
            ends.append((cb.closed_at + 0.001 + (cb.buffer_id % 7) * 0.007, cb.num_requests))
        ends.sort()

    now, answers = 0.0, {True: 0, False: 0}
    for i in range(3000):
        burst = (i // 300) % 2 == 0
        now += rng.expovariate(400.0 if burst else 5.0)
        while ends and ends[0][0] <= now:  # executions that end first, in time order
            t, k = ends.pop(0)
            both(lambda st, t=t, k=k: st.finished(t, 0.03, k, 0.01, 0.005))
            both(lambda st, t=t: st.advance(t, _decide))
        both(lambda st, now=now: st.advance(now, _decide))  # buffers due before this arrival
        u = sets[rng.randrange(len(sets))]
        got, want = alone(int(u.size), now), ref.submit_alone(int(u.size), now)
        assert got == want, i
        answers[got] += 1
        if got:
            ends.append((now + rng.uniform(0.001, 0.05), 1))
            ends.sort()
        else:
            both(lambda st, i=i, u=u, t=now: st.submit(PendingRequest(i, u, t, t + 0.3), t)[2])
        assert _figures(fused) == _figures(ref), i
    if objective != "cost":  # both answers came, so both branches were compared
        assert answers[True] > 100 and answers[False] > 100, answers


def _decide(b, state, now) -> int:
    """A stand-in for the timeout tree: every code, from the state."""
    return int(state[2] + 10 * state[1]) % 4 - 1


def _closes(closed: list) -> list:
    return [(c.buffer_id, [r.id for r in c.requests], c.reason, c.closed_at) for c in closed]
