"""The work-conserving gate's arrival path in the simulator, in one call.

Most arrivals of a Twitter day find no buffer open and an execution free, and
the gateway's :meth:`~gnn_faas.gateway.buffer_pool.BufferPoolState.submit_alone`
dispatches them alone. :meth:`FusedGate.alone` is that call with what it calls
(:meth:`~gnn_faas.gateway.buffer.ArrivalRate.observed`,
:meth:`~gnn_faas.gateway.work_conserving.WorkConservingGate.dispatch_alone`,
:meth:`~gnn_faas.gateway.buffer.ArrivalRate.observe`) written in place, on
those objects' own state: the arrival rate, the gate's executions in flight and
``L₁`` and the pool's counters stay theirs, so every other path (a request that
joins a buffer, an execution's end, a release) runs the objects unchanged.

``tests/traces/test_sim_gate.py`` drives this and ``submit_alone`` on random
streams of arrivals and execution ends and requires every answer and every
figure equal; ``tests/traces/test_sim_pools.py`` runs whole simulations both
ways. The rule itself: docs/design/work-conserving-gate.md.
"""

from __future__ import annotations

import math

from gnn_faas.gateway.buffer_pool import BufferPoolState

_exp = math.exp


class FusedGate:
    """:meth:`BufferPoolState.submit_alone` of ``state`` in one call (module docstring)."""

    def __init__(self, state: BufferPoolState):
        self.state, self.rate, self.gate = state, state.rate, state.gate
        objective = state.gate.objective  # (frozen: fixed for the run)
        self.on = objective.name != "cost"
        self.slack = 0.0 if objective.name == "latency" else objective.latency_slack
        self.opens = state.config.max_requests_per_buffer >= 1

    def alone(self, size: int, now: float) -> bool:
        """``state.submit_alone(size, now)``: the same answer, the same changes."""
        state = self.state
        if state.location or size <= 0 or not self.opens:
            return False
        gate = self.gate
        if gate.max_concurrency is None or int(gate.concurrency) - gate.in_flight <= 0:
            return False  # (no execution free)
        if not self.on:
            return False
        rate = self.rate
        last, tc = rate._last, rate.time_constant_s
        if last is None:  # ArrivalRate.observed(now)
            value = 0.0 + 1.0 / tc
        else:
            d = now - last
            value = rate._value * _exp(-(d if d > 0.0 else 0.0) / tc) + 1.0 / tc
        fit = gate.fit
        single = fit._at_one if fit._at_one is not None else fit.at(1.0)
        w = 0.5 * self.slack * single
        if value * w >= 1.0 and w > 0:  # company worth waiting for
            return False
        gate.in_flight += 1
        rate._value, rate._last = value, now  # ArrivalRate.observe(now, value)
        state.submitted += 1
        state.next_buffer_id += 1
        state.closed_buffers += 1
        state.closed_requests += 1
        state.union_sum += size
        state.total_sum += size
        state.reasons["idle"] += 1
        return True
