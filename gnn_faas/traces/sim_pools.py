"""The simulator's function pools: who runs each stage of an execution, when.

Each pool is one function's instances under the gateway's load-aware rule
(:class:`~gnn_faas.scheduler.function_pool.LoadAwarePolicy`: the rule of
docs/design/launch-and-reap.md), with the times the simulator reports (spawn
and stop per instance; per execution its stage's start, end and whether it
waited for a cold start). Two implementations with one interface, driven by
:class:`~gnn_faas.traces.gateway_sim.GatewaySim`'s loop:

- :class:`ObjectPool` runs the policy object itself (any ``policy_cls``);
- :class:`FusedPool` is the same rule for :class:`LoadAwarePolicy` (and its
  :class:`LaunchBudget`) written into the pool's own flat state, with no
  action objects, no clock calls and integer instance ids: about a third of
  the object's cost per event. ``tests/traces/test_sim_pools.py`` runs both
  on random streams and requires every decision, time and figure equal.

An execution in flight is one list (``GatewaySim.flight[e]``): request ids,
rows, dispatched at, mean buffer wait, sharing degree, then per stage
``ready at, service, start, end, cold``. A pool's ``enter(e, now)`` takes
execution ``e`` at ``now`` (its ready time set), ``ready(inst, t)`` and
``done(inst, t)`` are its instances' events (``done`` returns the execution
that ended), ``lives(horizon)`` the instances' ``(spawn, stop)``; ``reader``
(None, or an :class:`~gnn_faas.traces.update_cost.UpdateReader`) hears of
every call an instance starts.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from typing import Any

import numpy as np

from gnn_faas.scheduler import function_pool
from gnn_faas.scheduler.function_pool import IDLE, WAIT_EWMA, LaunchBudget, LoadAwarePolicy, Run

READY, DONE = 0, 1
INF = math.inf
_push = heapq.heappush

# an execution in flight: [request ids, rows, dispatched at, mean buffer wait,
# sharing degree, then per stage: ready at, service, start, end, cold]
IDS, ROWS, DISPATCHED, WAIT, SHARING, STAGE0 = 0, 1, 2, 3, 4, 5
READY_AT, SERVICE, START, END, COLD = 0, 1, 2, 3, 4
STAGE_WIDTH = 5


def expire(idle: list, now: float, keep_alive_s: float, remove: Any, stop: dict) -> float:
    """Idle instances ``(key, idle since)`` past their keep-alive stop then
    (``remove(key)``, ``stop[key]``); returns the next time one could: no
    sooner than ``now + keep_alive_s`` for an instance idle from now on."""
    next_check = now + keep_alive_s
    for key, since in idle:
        if since + keep_alive_s <= now and remove(key):
            stop[key] = since + keep_alive_s
        elif since + keep_alive_s < next_check:
            next_check = since + keep_alive_s
    return next_check


class ObjectPool:
    """One function's instances under a policy object (``policy_cls``)."""

    def __init__(self, sim: Any, stage: int, name: str, cold_s: float, memory_mb: float,
                 budget: LaunchBudget | None, policy_cls: type[LoadAwarePolicy]):  # fmt: skip
        cal = sim.cal
        self.sim, self.stage, self.base = sim, stage, STAGE0 + STAGE_WIDTH * stage
        # the loop's own objects (never rebound), read on every action
        self.events, self.seq, self.flight = sim.events, sim.seq, sim.flight
        self.last = False  # the execution's last stage (set once every stage exists)
        self.reader: Any = None
        self.policy = policy_cls(
            cal.max_instances, clock=sim.clock, name=name, budget=budget, memory_mb=memory_mb
        )
        self.instances = self.policy.instances
        self.cold_s = cold_s
        self.keep_alive_s = cal.keep_alive_s
        # only a pool with a launch budget may call an instance surplus
        self.reaps = self.policy.budget is not None
        self.check_at = -INF  # before this no idle instance can have outlived its keep-alive
        self.spawn: dict = {}
        self.stop: dict = {}
        self.warm_at: dict = {}
        self.last_end = 0.0
        for _ in range(cal.min_instances):
            launch = self.policy.launch()
            self.spawn[launch.instance] = self.warm_at[launch.instance] = 0.0
            self.policy.ready(launch.instance)
        self.prewarmed = cal.min_instances

    def enter(self, e: int, now: float) -> None:
        """Execution ``e`` (its ready time and service set on its record) arrives."""
        if now >= self.check_at:
            self._expire(now)
        policy = self.policy
        if self.reaps:
            surplus = policy.surplus()
            if surplus is not None and policy.remove(surplus):
                self.stop[surplus] = now
        actions = policy.submit(e)
        if actions:
            self.act(actions, now)

    def ready(self, inst: Any, t: float) -> None:
        self.warm_at[inst] = t
        actions = self.policy.ready(inst)
        if actions:
            self.act(actions, t)

    def done(self, inst: Any, t: float) -> int:
        e = self.instances[inst].current
        actions = self.policy.finished(inst)
        if actions:
            self.act(actions, t)
        return e

    def act(self, actions: list, now: float) -> None:
        b = self.base
        for a in actions:
            if type(a) is Run:
                rec = self.flight[a.item]
                rec[b + START] = now
                rec[b + END] = end = now + rec[b + SERVICE]
                inst = a.instance
                rec[b + COLD] = self.spawn[inst] >= rec[b + READY_AT] and now == self.warm_at.get(
                    inst
                )
                if self.reader is not None:
                    self.reader.call(inst, now)
                if end > self.last_end:
                    self.last_end = end
                heapq.heappush(self.events, (end, next(self.seq), DONE, self, inst))
                if self.last:
                    self.sim.complete(a.item, rec)
            else:  # Launch
                self.spawn[a.instance] = now
                heapq.heappush(
                    self.events, (now + self.cold_s, next(self.seq), READY, self, a.instance)
                )

    def _expire(self, now: float) -> None:
        """Idle instances past their keep-alive stop (only a submit could have
        given them work, so this runs before one); then the next time one could."""
        idle = [(inst, s.since) for inst, s in self.instances.items() if s.state == IDLE]
        self.check_at = expire(idle, now, self.keep_alive_s, self.policy.remove, self.stop)

    def lives(self, horizon: float) -> tuple[np.ndarray, np.ndarray]:
        """``(spawn, stop)`` per instance in launch order, the run ending at ``horizon``."""
        self._expire(horizon)
        if self.reaps:
            surplus = self.policy.surplus()
            if surplus is not None and self.policy.remove(surplus):
                self.stop[surplus] = horizon
        for inst in self.spawn:
            if inst not in self.stop:
                s = self.instances[inst]
                alive = s.since + self.keep_alive_s if s.state == IDLE else horizon
                self.stop[inst] = min(alive, horizon)
        ids = list(self.spawn)
        spawn = np.asarray([self.spawn[i] for i in ids], dtype=np.float64)
        stop = np.maximum(np.asarray([self.stop[i] for i in ids], dtype=np.float64), spawn)
        return spawn, stop


_LAUNCHING, _IDLE, _BUSY = 0, 1, 2


def _mean(raw: float, weight: float) -> float:
    """The policy's bias-corrected exponentially weighted mean."""
    return raw / weight if weight > 0 else 0.0


class _Inst:
    """An instance: ``id`` (launch order), state, own FIFO queue, the
    execution it runs, when it entered its state."""

    __slots__ = ("id", "state", "queue", "current", "since")

    def __init__(self, iid: int, now: float):
        self.id, self.state, self.queue, self.current, self.since = (
            iid,
            _LAUNCHING,
            deque(),
            -1,
            now,
        )


class FusedBudget:
    """:class:`LaunchBudget` over fused pools: ``B_k = r·Σ_j S̄_j·m_k / Σ_j m_j``."""

    def __init__(self, ratio: float):
        self.ratio = float(ratio)
        self.members: list[FusedPool] = []
        self.total_mb = 0.0

    def join(self, pool: FusedPool) -> None:
        self.members.append(pool)
        self.total_mb = sum(p.memory_mb for p in self.members)

    def share_s(self, pool: FusedPool) -> float:
        service = 0
        for p in self.members:
            service += p.s_mean
        return self.ratio * service * pool.memory_mb / self.total_mb


class FusedPool:
    """:class:`ObjectPool` with :class:`LoadAwarePolicy`'s rule in place
    (module docstring): the same instances, queues, launches, steals, reaps,
    means ``W̄``/``S̄`` and one-fewer replay ``Ŵ``, the same order of events."""

    def __init__(self, sim: Any, stage: int, name: str, cold_s: float, memory_mb: float,
                 budget: FusedBudget | None):  # fmt: skip
        cal = sim.cal
        self.sim, self.stage, self.base = sim, stage, STAGE0 + STAGE_WIDTH * stage
        b = self.base  # this stage's fields of an execution's record
        self.o_ready, self.o_service, self.o_start = b + READY_AT, b + SERVICE, b + START
        self.o_end, self.o_cold = b + END, b + COLD
        self.events, self.seq, self.flight = sim.events, sim.seq, sim.flight
        self.last = False
        self.reader: Any = None
        self.name = name
        self.max_instances = int(cal.max_instances)
        if self.max_instances < 1:
            raise ValueError("max_instances must be >= 1")
        self.memory_mb = float(memory_mb)
        self.budget = budget
        if budget is not None:
            if not self.memory_mb > 0:
                raise ValueError("a pool's memory_mb must be > 0")
            budget.join(self)
        self.reaps = budget is not None
        self.min_evidence = function_pool.MIN_EVIDENCE
        self.reap_margin = function_pool.REAP_MARGIN
        self.cold_s = cold_s
        self.keep_alive_s = cal.keep_alive_s
        self.check_at = -INF
        self.insts: list[_Inst] = []  # alive, in launch order
        self.launching = 0
        self.queued = 0  # items in the instances' own queues
        self.pending: deque = deque()
        self.spawn: list[float] = []  # per instance id
        self.stop: list[float] = []  # per instance id (inf: not stopped)
        self.warm_at: list[float] = []  # per instance id (nan until ready)
        self.last_end = 0.0
        self.s_raw = self.s_wt = self.s_mean = 0.0  # S̄ (never reset)
        self._afresh(0)
        for _ in range(cal.min_instances):
            s = self._new(0.0)
            self.warm_at[s.id] = 0.0
            self._ready(s, 0.0)
        self.prewarmed = cal.min_instances

    # -- the policy's state ----------------------------------------------------------
    def _afresh(self, warm: int) -> None:
        """The pool changed size (``warm`` warm instances): ``W̄`` and the
        one-fewer replay start again."""
        self.w_raw = self.w_wt = 0.0
        self.w_n = 0
        self.f_free = [-INF] * max(warm - 1, 0)
        self.f_order: deque = deque()
        self.f_arrival: dict = {}
        self.f_service: dict = {}
        self.f_raw = self.f_wt = 0.0
        self.f_n = 0

    def _new(self, now: float) -> _Inst:
        s = _Inst(len(self.spawn), now)
        self.insts.append(s)
        self.launching += 1
        self.spawn.append(now)
        self.stop.append(INF)
        self.warm_at.append(math.nan)
        return s

    def _share(self) -> float:
        return self.budget.share_s(self)  # type: ignore[union-attr]

    def _remove(self, s: _Inst) -> bool:
        if s.state != _IDLE or s.queue:
            return False
        self.insts.remove(s)
        self._afresh(len(self.insts) - self.launching)
        return True

    def _surplus(self) -> _Inst | None:
        insts = self.insts
        if len(insts) < 2 or self.pending or self.launching:
            return None
        s = insts[-1]
        if s.state != _IDLE or s.queue or self.f_n < self.min_evidence:
            return None
        if _mean(self.f_raw, self.f_wt) >= self.reap_margin * self._share():
            return None
        return s

    # -- events ----------------------------------------------------------------------
    def enter(self, e: int, now: float) -> None:
        if now >= self.check_at:
            self._expire(now)
        insts = self.insts
        if self.reaps:
            # (_surplus and _remove in place: this runs at most submits)
            if len(insts) >= 2 and insts[-1].state == _IDLE and self.f_n >= self.min_evidence:
                s = insts[-1]
                if not (self.pending or self.launching or s.queue):
                    wt = self.f_wt
                    fewer = self.f_raw / wt if wt > 0 else 0.0  # Ŵ
                    if not fewer >= self.reap_margin * self.budget.share_s(self):  # type: ignore[union-attr]
                        self._remove(s)  # (idle, nothing queued: removed)
                        self.stop[s.id] = now
            if self.f_free and e not in self.f_arrival:  # the one-fewer replay's arrival
                self.f_arrival[e] = now
                self.f_order.append(e)
        for s in insts:  # the idle instance launched first takes it
            if s.state == _IDLE:
                self._start(s, e, now)
                return
        self._queue(e, now)

    def _queue(self, e: int, now: float) -> None:
        insts = self.insts
        n_inst = len(insts)
        n_req = len(self.pending) + 1
        best = None
        for s in insts:
            if s.current >= 0:
                n_req += 1
            q = len(s.queue)
            n_req += q
            if s.state != _LAUNCHING and (best is None or q < len(best.queue)):
                best = s
        if n_req > n_inst and n_inst < self.max_instances and (best is None or self._worth()):
            s = self._new(now)
            heapq.heappush(self.events, (now + self.cold_s, next(self.seq), READY, self, s))
        if best is not None:
            best.queue.append(e)
            self.queued += 1
        else:
            self.pending.append(e)

    def _worth(self) -> bool:
        """``W̄ >= B_k`` (always, without a launch budget)."""
        if self.budget is None:
            return True
        if self.launching or self.w_n < self.min_evidence:
            return False
        return _mean(self.w_raw, self.w_wt) >= self._share()

    def _start(self, s: _Inst, e: int, now: float) -> None:
        s.state, s.current, s.since = _BUSY, e, now
        rec = self.flight[e]
        ready_at = rec[self.o_ready]
        if self.reaps:  # W̄ (read only under a launch budget: _worth)
            wait = now - ready_at
            if not wait > 0.0:
                wait = 0.0
            self.w_n += 1
            self.w_raw += WAIT_EWMA * (wait - self.w_raw)
            self.w_wt += WAIT_EWMA * (1.0 - self.w_wt)
        rec[self.o_start] = now
        rec[self.o_end] = end = now + rec[self.o_service]
        iid = s.id
        rec[self.o_cold] = self.spawn[iid] >= ready_at and now == self.warm_at[iid]
        if end > self.last_end:
            self.last_end = end
        if self.reader is not None:
            self.reader.call(s.id, now)
        _push(self.events, (end, next(self.seq), DONE, self, s))
        if self.last:
            self.sim.complete(e, rec)

    def _idle(self, s: _Inst, now: float) -> None:
        if self.queued:
            if s.queue:
                self.queued -= 1
                self._start(s, s.queue.popleft(), now)
                return
            if not self.pending:
                victim = None  # the longest queue, the earliest launched on a tie
                for o in self.insts:
                    q = o.queue
                    if q and o is not s and (victim is None or len(q) > len(victim.queue)):
                        victim = o
                if victim is not None:
                    self.queued -= 1
                    self._start(s, victim.queue.pop(), now)
                    return
        if self.pending:
            self._start(s, self.pending.popleft(), now)
            return
        s.state, s.current, s.since = _IDLE, -1, now

    def _ready(self, s: _Inst, t: float) -> None:
        self._afresh(len(self.insts) - self.launching + 1)  # the pool grew
        self.launching -= 1
        self._idle(s, t)

    def ready(self, s: _Inst, t: float) -> None:
        self.warm_at[s.id] = t
        self._ready(s, t)

    def done(self, s: _Inst, t: float) -> int:
        e = s.current
        service = t - s.since
        self.s_raw = raw = self.s_raw + WAIT_EWMA * (service - self.s_raw)
        self.s_wt = wt = self.s_wt + WAIT_EWMA * (1.0 - self.s_wt)
        self.s_mean = raw / wt if wt > 0 else 0.0  # _mean(raw, wt)
        if self.reaps and e in self.f_arrival:
            self.f_service[e] = service
            self._replay()
        if self.queued or self.pending:
            s.current = -1
            self._idle(s, t)
        else:  # (_idle with nothing waiting)
            s.state, s.current, s.since = _IDLE, -1, t
        return e

    def _replay(self) -> None:
        """The one-fewer pool's waits (Kiefer-Wolfowitz), items in arrival order."""
        free, order, service, arrival = self.f_free, self.f_order, self.f_service, self.f_arrival
        while order and order[0] in service:
            it = order.popleft()
            a, x = arrival.pop(it), service.pop(it)
            if len(free) == 1:
                k, f = 0, free[0]
            else:  # the instance free first (the first of a tie)
                f = min(free)
                k = free.index(f)
            start = f if f > a else a
            free[k] = start + x
            self.f_n += 1
            self.f_raw += WAIT_EWMA * ((start - a) - self.f_raw)
            self.f_wt += WAIT_EWMA * (1.0 - self.f_wt)

    def _expire(self, now: float) -> None:
        idle = [(s, s.since) for s in self.insts if s.state == _IDLE]
        stopped: dict = {}
        self.check_at = expire(idle, now, self.keep_alive_s, self._remove, stopped)
        for s, t in stopped.items():
            self.stop[s.id] = t

    def lives(self, horizon: float) -> tuple[np.ndarray, np.ndarray]:
        self._expire(horizon)
        if self.reaps:
            s = self._surplus()
            if s is not None and self._remove(s):
                self.stop[s.id] = horizon
        stop = self.stop
        for s in self.insts:
            alive = s.since + self.keep_alive_s if s.state == _IDLE else horizon
            stop[s.id] = min(alive, horizon)
        spawn = np.asarray(self.spawn, dtype=np.float64)
        return spawn, np.maximum(np.asarray(stop, dtype=np.float64), spawn)
