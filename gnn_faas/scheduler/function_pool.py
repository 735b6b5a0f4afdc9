"""Load-aware queueing and instance launch (FaaS-GNN section 4.4).

A function has instances; each runs one work item at a time and has its own FIFO
queue. :class:`LoadAwarePolicy` decides, for every event, what happens; it is pure
and deterministic (explicit events in, actions out), so tests drive it with a fake
clock and no threads. The rule it implements, with its derivation, is written once
in docs/design/launch-and-reap.md:

- a new item runs on an idle warm instance, else queues on the warm instance with
  the shortest queue; a new instance is launched only when ``n_req > n_instances``
  (and, with a launch budget, the pool's mean queue wait exceeds its share of the
  model's :class:`LaunchBudget`, shared between pools by instance memory);
- an instance that becomes idle takes its own queue's head, else the pending
  queue's, else the tail of the longest queue (work stealing);
- with a budget, the newest instance is reaped as soon as the pool's items,
  replayed on one instance fewer, would have waited under ``REAP_MARGIN`` of its
  share (:meth:`LoadAwarePolicy.surplus`); the last one at its keep-alive.

:class:`RequestCentricPolicy` is the AWSGNN baseline (a new instance whenever none
is idle, no stealing). :class:`FunctionPool` runs a policy for real: launches in
background threads (a launch blocks until the instance is ready), one item in
flight per instance, futures for results, and retries on another instance when
one fails (``Unavailable`` or a connection error): the failed instance is removed
(``on_failed(instance)``) and its items go back to the policy, so a killed
instance never loses a request (at most ``max_attempts`` attempts).
"""

from __future__ import annotations

import contextvars
import itertools
import logging
import math
import threading
from collections import deque
from collections.abc import Callable, Hashable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import numpy as np

from gnn_faas.clock import Clock
from gnn_faas.errors import Unavailable

log = logging.getLogger(__name__)
T = TypeVar("T")

LAUNCHING, IDLE, BUSY = "launching", "idle", "busy"
WAIT_EWMA = 0.01  # weight of one item in the mean queue wait and service time
MIN_EVIDENCE = 100  # waits measured since the pool last changed before it may launch or reap
REAP_MARGIN = 0.75  # a reap needs Ŵ this far under the pool's share (a band against flapping)


@dataclass(frozen=True)
class Run:
    """Run ``item`` on ``instance`` now (it waited ``wait_s`` in the pool's queue)."""

    instance: Hashable
    item: Hashable
    wait_s: float = field(default=0.0, compare=False)


@dataclass(frozen=True)
class Launch:
    """Start a new instance; report it with ``ready(instance)`` or ``failed(instance)``."""

    instance: Hashable


Action = Run | Launch


@dataclass
class InstanceState:
    id: Hashable
    state: str
    queue: deque = field(default_factory=deque)
    current: Hashable | None = None
    since: float = 0.0  # when it entered its state (idle_since for keep-alive)
    order: int = 0  # launch order, for deterministic ties


class LoadAwarePolicy:
    """The decision logic of FaaS-GNN 4.4 for one function (not thread-safe).

    ``clock`` (optional) stamps queue entry and idle times, for queue-wait
    figures and keep-alive; without it those figures read 0.
    """

    def __init__(
        self,
        max_instances: int,
        clock: Clock | None = None,
        name: str = "fn",
        launch_wait_ratio: float | None = None,
        budget: LaunchBudget | None = None,
        memory_mb: float = 1.0,
    ):
        if max_instances < 1:
            raise ValueError("max_instances must be >= 1")
        if launch_wait_ratio is not None and not launch_wait_ratio >= 0:
            raise ValueError("launch_wait_ratio must be >= 0")
        if budget is not None and launch_wait_ratio is None:
            launch_wait_ratio = budget.ratio
        self.max_instances = int(max_instances)
        self.launch_wait_ratio = launch_wait_ratio
        # the wait budget this pool shares with the model's other pools (alone: its own)
        if launch_wait_ratio is not None and budget is None:
            budget = LaunchBudget(launch_wait_ratio)
        self.budget = budget
        if budget is not None:
            budget.join(self, memory_mb)
        self._wait = _Mean()  # W̄
        self._service = _Mean()  # S̄
        self._fewer = _OneFewer(0)  # the pool without its newest instance: Ŵ
        self.clock = clock
        self.name = name
        self.instances: dict[Hashable, InstanceState] = {}
        self.pending: deque = deque()  # items waiting for a launching instance
        self._enqueued_at: dict[Hashable, float] = {}
        self._ids = itertools.count(1)
        self._order = itertools.count()
        self.launches = 0
        self.steals = 0
        self.queued_items = 0
        self.waits: deque[float] = deque(maxlen=10_000)

    # -- counts -------------------------------------------------------------------
    def _now(self) -> float:
        return self.clock.now() if self.clock is not None else 0.0

    @property
    def n_instances(self) -> int:
        """Warm and launching instances."""
        return len(self.instances)

    @property
    def n_requests(self) -> int:
        """Items running, queued on instances, or pending."""
        busy = sum(1 for s in self.instances.values() if s.current is not None)
        return busy + sum(len(s.queue) for s in self.instances.values()) + len(self.pending)

    def warm(self) -> list[InstanceState]:
        """Warm instances in launch order (``instances`` keeps them in it: an
        instance enters the dict when launched, and a dict keeps insertion order)."""
        return [s for s in self.instances.values() if s.state != LAUNCHING]

    def queue_lengths(self) -> dict[Hashable, int]:
        return {i: len(s.queue) for i, s in self.instances.items()}

    # -- events ---------------------------------------------------------------------
    def submit(self, item: Hashable) -> list[Action]:
        """A new (or re-queued) work item arrives."""
        now = self._enqueued_at[item] = self._now()
        if self.budget is not None:
            self._fewer.arrived(item, now)
        for s in self.instances.values():  # the idle instance launched first takes it
            if s.state == IDLE:
                return [self._run(s, item)]
        warm = self.warm()
        actions: list[Action] = []
        n_req = self.n_requests + 1
        if (
            n_req > self.n_instances
            and self.n_instances < self.max_instances
            and (not warm or self.launch_worth_it())
        ):
            actions.append(self.launch())
        self.queued_items += 1
        if warm:
            min(warm, key=lambda s: (len(s.queue), s.order)).queue.append(item)
        else:
            self.pending.append(item)
        return actions

    def launch_worth_it(self) -> bool:
        """``W̄ >= B_k`` (always, without a launch budget)."""
        if self.budget is None:
            return True
        if any(s.state == LAUNCHING for s in self.instances.values()):
            return False  # W̄ was measured without the instance on its way
        if self._wait.n < MIN_EVIDENCE:
            return False  # too few waits measured on the pool as it is
        return self.mean_wait_s >= self.budget.share_s(self)

    @property
    def mean_wait_s(self) -> float:
        return self._wait.value

    @property
    def mean_service_s(self) -> float:
        return self._service.value

    def launch(self) -> Launch:
        """Start an instance unconditionally (minimum instances, recovery)."""
        iid = f"{self.name}-{next(self._ids)}"
        self.instances[iid] = InstanceState(
            iid, LAUNCHING, since=self._now(), order=next(self._order)
        )
        self.launches += 1
        return Launch(iid)

    def ready(self, instance: Hashable) -> list[Action]:
        """A launching instance is warm: it takes work at once."""
        s = self._get(instance)
        if s.state != LAUNCHING:
            raise ValueError(f"instance {instance!r} is not launching")
        self._measure_afresh(len(self.warm()) + 1)  # the pool grew
        return self._idle(s)

    def finished(self, instance: Hashable) -> list[Action]:
        """The instance finished its item: it takes the next one."""
        s = self.instances.get(instance)
        if s is None or s.state != BUSY:
            raise ValueError(f"instance {instance!r} is {'not busy' if s else 'unknown'}")
        item, s.current = s.current, None
        clock = self.clock
        service = (clock.now() if clock is not None else 0.0) - s.since
        self._service.add(service)
        if self.budget is not None:
            self._fewer.served(item, service)
        return self._idle(s)

    def failed(self, instance: Hashable) -> tuple[list[Action], Hashable | None]:
        """The instance died or failed to launch: it is removed, its queued items
        are re-submitted; returns the actions and the item it was running (the
        caller retries or fails that one)."""
        s = self.instances.pop(instance, None)
        if s is None:
            raise ValueError(f"unknown instance {instance!r}")
        if s.state != LAUNCHING:
            self._measure_afresh(len(self.warm()))  # the pool shrank
        actions: list[Action] = []
        for item in list(s.queue):
            actions.extend(self.submit(item))
        # Items pending for a launch need some instance to come: keep one coming.
        if self.pending and self.n_instances == 0:
            actions.append(self.launch())
        return actions, s.current

    def remove(self, instance: Hashable) -> bool:
        """Remove an idle instance with an empty queue (keep-alive expiry, scale
        down); ``False`` if it is busy, launching or has queued work."""
        s = self.instances.get(instance)
        if s is None or s.state != IDLE or s.queue:
            return False
        del self.instances[instance]
        self._measure_afresh(len(self.warm()))  # the pool shrank
        return True

    def surplus(self) -> Hashable | None:
        """The newest instance when the pool's demand no longer needs it (the
        module docstring's reap rule; None: keep every instance, and always
        without a launch budget), for the caller to :meth:`remove` and stop."""
        if self.budget is None or len(self.instances) < 2 or self.pending:
            return None
        s = None
        for o in self.instances.values():  # none launching; the newest (launched last) is last
            if o.state == LAUNCHING:
                return None
            s = o
        if s is None or s.state != IDLE or s.queue or self._fewer.wait.n < MIN_EVIDENCE:
            return None
        if self._fewer.wait.value >= REAP_MARGIN * self.budget.share_s(self):
            return None
        return s.id

    def _measure_afresh(self, warm: int) -> None:
        """The pool changed size (now ``warm`` warm instances): ``W̄`` and
        ``Ŵ`` described the old one."""
        self._wait = _Mean()
        self._fewer = _OneFewer(warm - 1)

    def drain_pending(self) -> list[Hashable]:
        """Take all pending items out (to fail them when no instance can come)."""
        items = list(self.pending)
        self.pending.clear()
        for it in items:
            self._enqueued_at.pop(it, None)
            self._fewer.dropped(it)
        return items

    # -- internals ---------------------------------------------------------------------
    def _get(self, instance: Hashable) -> InstanceState:
        try:
            return self.instances[instance]
        except KeyError:
            raise ValueError(f"unknown instance {instance!r}") from None

    def _run(self, s: InstanceState, item: Hashable) -> Run:
        clock = self.clock
        now = clock.now() if clock is not None else 0.0
        s.state, s.current, s.since = BUSY, item, now
        t0 = self._enqueued_at.pop(item, None)
        wait = 0.0
        if t0 is not None:
            wait = max(0.0, now - t0)
            self.waits.append(wait)
            self._wait.add(wait)
        return Run(s.id, item, wait)

    def _idle(self, s: InstanceState) -> list[Action]:
        if s.queue:
            return [self._run(s, s.queue.popleft())]
        if self.pending:
            return [self._run(s, self.pending.popleft())]
        victim = None  # the longest queue, the earliest launched on a tie
        for o in self.instances.values():
            if o.queue and o is not s and (victim is None or len(o.queue) > len(victim.queue)):
                victim = o
        if victim is not None:
            self.steals += 1
            return [self._run(s, victim.queue.pop())]
        s.state, s.current, s.since = IDLE, None, self._now()
        return []

    def wait_percentiles(self) -> dict[str, float]:
        if not self.waits:
            return {"queue_wait_p50_s": 0.0, "queue_wait_p99_s": 0.0}
        w = np.fromiter(self.waits, float, len(self.waits))
        return {
            "queue_wait_p50_s": float(np.percentile(w, 50)),
            "queue_wait_p99_s": float(np.percentile(w, 99)),
        }


class LaunchBudget:
    """The queue-wait budget of one model's function pools (module docstring):
    an execution passes through each pool once per round, so its calls may
    wait ``B = r·Σ_j S̄_j`` in all the pools' queues together, and pool ``k``'s
    share is ``B_k = B·m_k / Σ_j m_j`` (``m``: the pool's instance memory).
    Each pool reads the others' ``S̄`` without their lock: a float read, at
    worst one item stale."""

    def __init__(self, ratio: float):
        if not ratio >= 0:
            raise ValueError("launch_wait_ratio must be >= 0")
        self.ratio = float(ratio)
        self.members: list[tuple[LoadAwarePolicy, float]] = []
        self._total_mb = 0.0
        self._mb: dict[int, float] = {}  # id(policy) -> its memory (the first join's)

    def join(self, policy: LoadAwarePolicy, memory_mb: float) -> None:
        if not memory_mb > 0:
            raise ValueError("a pool's memory_mb must be > 0")
        self.members.append((policy, float(memory_mb)))
        self._total_mb = sum(mb for _, mb in self.members)
        self._mb.setdefault(id(policy), float(memory_mb))

    def share_s(self, policy: LoadAwarePolicy) -> float:
        """``B_k``: the mean queue wait above which ``policy``'s pool launches."""
        service = 0
        for p, _ in self.members:
            service += p._service.value
        return self.ratio * service * self._mb[id(policy)] / self._total_mb


class _OneFewer:
    """The pool with one instance fewer, replayed on its real arrivals and
    service times: first come, first served over ``servers`` instances (the
    Kiefer-Wolfowitz recursion, each item in arrival order as soon as its
    service time is known); ``wait`` is ``Ŵ``, the mean of the waits it gives."""

    def __init__(self, servers: int):
        self.free = [-math.inf] * max(int(servers), 0)  # when each instance frees
        self.order: deque = deque()  # items by arrival, not yet replayed
        self.arrival: dict[Hashable, float] = {}
        self.service: dict[Hashable, float] = {}
        self.wait = _Mean()

    def arrived(self, item: Hashable, t: float) -> None:
        if self.free and item not in self.arrival:  # a re-queued item keeps its arrival
            self.arrival[item] = t
            self.order.append(item)

    def served(self, item: Hashable, seconds: float) -> None:
        if item not in self.arrival:  # arrived before the pool last changed
            return
        self.service[item] = seconds
        self._replay()

    def _replay(self) -> None:
        free = self.free
        while self.order and self.order[0] in self.service:
            it = self.order.popleft()
            a, s = self.arrival.pop(it), self.service.pop(it)
            k = free.index(min(free))  # the instance free first (the first of a tie)
            start = max(a, free[k])
            free[k] = start + s
            self.wait.add(start - a)

    def dropped(self, item: Hashable) -> None:
        """An item that will not be served here (failed, drained)."""
        if self.arrival.pop(item, None) is not None:
            self.order.remove(item)
            self.service.pop(item, None)
            self._replay()  # what it held up


class _Mean:
    """Exponentially weighted mean (``WAIT_EWMA`` per value), bias-corrected so
    that it is the plain mean of the first values rather than pulled to 0."""

    def __init__(self) -> None:
        self.raw = 0.0
        self.weight = 0.0  # 1 − (1 − w)^n
        self.n = 0

    def add(self, x: float) -> None:
        self.n += 1
        self.raw += WAIT_EWMA * (x - self.raw)
        self.weight += WAIT_EWMA * (1.0 - self.weight)

    @property
    def value(self) -> float:
        return self.raw / self.weight if self.weight > 0 else 0.0


class RequestCentricPolicy(LoadAwarePolicy):
    """The request-centric baseline (AWSGNN: one function invocation per
    request): an idle instance runs the item, otherwise a new instance is
    launched for it (while below ``max_instances``) and the item waits for
    that instance's cold start; at the cap it queues on the instance with the
    shortest queue. No bypass, no pending pool, no work stealing."""

    def submit(self, item: Hashable) -> list[Action]:
        self._enqueued_at[item] = self._now()
        idle = [s for s in self.warm() if s.state == IDLE]
        if idle:
            return [self._run(idle[0], item)]
        self.queued_items += 1
        if self.n_instances < self.max_instances:
            launch = self.launch()
            self.instances[launch.instance].queue.append(item)  # bound to its cold start
            return [launch]
        target = min(self.instances.values(), key=lambda s: (len(s.queue), s.order))
        target.queue.append(item)
        return []

    def _idle(self, s: InstanceState) -> list[Action]:
        if s.queue:
            return [self._run(s, s.queue.popleft())]
        s.state, s.current, s.since = IDLE, None, self._now()
        return []


POLICIES = {"load_aware": LoadAwarePolicy, "request_centric": RequestCentricPolicy}


_QUEUE_WAIT: contextvars.ContextVar[float] = contextvars.ContextVar(
    "gnn_faas_queue_wait", default=0.0
)


def queue_wait_s() -> float:
    """Seconds the item running in this context waited in its pool's queue
    (0 outside a pool's item): an execution's queue waits, for the
    work-conserving gate's fit (:mod:`gnn_faas.gateway.work_conserving`)."""
    return _QUEUE_WAIT.get()


def _with_wait(fn: Callable[[Any], T], inst: Any, wait_s: float) -> T:
    _QUEUE_WAIT.set(wait_s)
    return fn(inst)


def is_retryable(exc: BaseException) -> bool:
    """Failures that mean "this instance is gone", not "this request is bad":
    :class:`Unavailable` and connection errors (builtin or ``requests``')."""
    if isinstance(exc, (Unavailable, ConnectionError)):
        return True
    try:
        import requests
    except ImportError:  # pragma: no cover - requests is a core dependency
        return False
    return isinstance(exc, requests.exceptions.ConnectionError)


@dataclass
class _Work(Generic[T]):
    fn: Callable[[Any], T]
    future: Future
    attempts: int = 0
    # the submitter's context (its request id): the call and the future's callbacks run in it
    context: contextvars.Context = field(default_factory=contextvars.copy_context)


class FunctionPool:
    """Instances of one function behind a :class:`LoadAwarePolicy`.

    ``launch()`` starts an instance and returns it when ready (an opaque
    object with ``.id`` and ``.url``); ``submit(fn)`` runs ``fn(instance)`` on
    some instance and returns a future. ``on_failed(instance)`` is called when
    an instance is dropped after a retryable failure (stop it there).
    """

    def __init__(
        self,
        name: str,
        launch: Callable[[], Any],
        clock: Clock,
        max_instances: int,
        min_instances: int = 0,
        on_failed: Callable[[Any], None] | None = None,
        max_attempts: int = 3,
        policy: str = "load_aware",
        launch_wait_ratio: float | None = None,
        budget: LaunchBudget | None = None,
        memory_mb: float = 1.0,
    ):
        if not 0 <= min_instances <= max_instances:
            raise ValueError("need 0 <= min_instances <= max_instances")
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {sorted(POLICIES)}, not {policy!r}")
        self.name = name
        self.policy_name = policy
        self.min_instances = int(min_instances)
        self._launch = launch
        self.clock = clock
        self.on_failed = on_failed
        self.max_attempts = int(max_attempts)
        self.policy = POLICIES[policy](
            max_instances, clock, name, launch_wait_ratio, budget=budget, memory_mb=memory_mb
        )
        self._lock = threading.Lock()
        self._instances: dict[Hashable, Any] = {}
        self._work: dict[int, _Work] = {}
        self._keys = itertools.count()
        # Runs and launches never wait on each other, so one worker per
        # possible instance (running) plus one per possible launch suffices.
        self._executor = ThreadPoolExecutor(
            max_workers=2 * max_instances + 1, thread_name_prefix=f"pool-{name}"
        )
        self._closed = False
        self.submitted = 0
        self.completed = 0
        self.retries = 0
        self.failures = 0
        self.launch_failures = 0
        self.inline_runs = 0  # items run on the submitting thread (submit(inline=True))
        self._failed_launches_in_a_row = 0
        self._started = False

    # -- lifecycle ----------------------------------------------------------------
    def start(self) -> None:
        """Launch the minimum instances (in the background). Idempotent; work
        submitted before ``start`` launches instances on demand anyway."""
        with self._lock:
            if self._started or self._closed:
                return
            self._started = True
            missing = max(0, self.min_instances - self.policy.n_instances)
            actions = [self.policy.launch() for _ in range(missing)]
        self._execute(actions)

    def stop(self) -> None:
        """Same as :meth:`close`."""
        self.close()

    def ensure_min(self) -> int:
        """Launch instances (in the background) until ``min_instances`` are up or
        coming, e.g. after one died; the number launched. Nothing before
        :meth:`start` or after :meth:`close`."""
        with self._lock:
            if not self._started or self._closed:
                return 0
            missing = max(0, self.min_instances - self.policy.n_instances)
            actions = [self.policy.launch() for _ in range(missing)]
        self._execute(actions)
        return len(actions)

    def has_ready_instance(self) -> bool:
        """True when work could be served now: a warm instance exists, or an
        instance may still be launched (below ``max_instances``)."""
        with self._lock:
            if self._closed:
                return False
            p = self.policy
            return bool(p.warm()) or p.n_instances < p.max_instances

    # -- work ---------------------------------------------------------------------
    def submit(self, fn: Callable[[Any], T], inline: bool = False) -> Future:
        """Run ``fn(instance)`` on the instance the policy picks; a future of its result.

        ``inline``: when the policy runs the item at once (an idle warm
        instance), run it on the calling thread instead of handing it to a pool
        thread (the caller would only wait for it): the future is done on
        return. Queued work, launches and retries still go through the pool."""
        fut: Future = Future()
        with self._lock:
            if self._closed:
                raise Unavailable(f"function pool {self.name!r} is shut down")
            key = next(self._keys)
            self._work[key] = _Work(fn, fut)
            self.submitted += 1
            actions = self.policy.submit(key)
            here = [a for a in actions if inline and isinstance(a, Run) and a.item == key]
            self.inline_runs += len(here)
        self._execute([a for a in actions if a not in here])
        for a in here:
            self._do_run(a.instance, a.item, a.wait_s)
        return fut

    def _execute(self, actions: list[Action]) -> None:
        for a in actions:
            try:
                if isinstance(a, Launch):
                    self._executor.submit(self._do_launch, a.instance)
                else:
                    self._executor.submit(self._do_run, a.instance, a.item, a.wait_s)
            except RuntimeError:  # shut down: close() already failed what had not started
                log.debug("%s: dropped %s after close", self.name, a)

    def _do_launch(self, pid: Hashable) -> None:
        try:
            inst = self._launch()
        except Exception as exc:
            log.warning("%s: launching an instance failed: %s", self.name, exc)
            with self._lock:
                self.launch_failures += 1
                self._failed_launches_in_a_row += 1
                stranded: list[_Work] = []
                others_coming = any(s.id != pid for s in self.policy.instances.values())
                if self._failed_launches_in_a_row >= self.max_attempts and not others_coming:
                    # Launches keep failing and no other instance exists or is
                    # coming: fail the waiting items rather than let them wait forever.
                    keys = self.policy.drain_pending()
                    mine = self.policy.instances.get(pid)
                    if mine is not None:  # items bound to this launch (request-centric)
                        keys += list(mine.queue)
                        mine.queue.clear()
                    stranded = [self._work.pop(k) for k in keys]
                actions, _ = self.policy.failed(pid)
            for w in stranded:
                w.future.set_exception(
                    Unavailable(f"{self.name}: could not launch an instance: {exc}")
                )
            self._execute(actions)
            return
        with self._lock:
            self._failed_launches_in_a_row = 0
            self._instances[pid] = inst
            actions = self.policy.ready(pid)
        self._execute(actions)

    def _do_run(self, pid: Hashable, key: int, wait_s: float = 0.0) -> None:
        with self._lock:
            inst = self._instances[pid]
            work = self._work[key]
            work.attempts += 1
        try:
            result = work.context.run(_with_wait, work.fn, inst, wait_s)
        except BaseException as exc:
            if is_retryable(exc):
                self._instance_failed(pid, inst, key, work, exc)
                return
            with self._lock:
                self._work.pop(key, None)
                self.completed += 1
                actions = self.policy.finished(pid)
            work.context.run(work.future.set_exception, exc)
            self._execute(actions)
            return
        with self._lock:
            self._work.pop(key, None)
            self.completed += 1
            actions = self.policy.finished(pid)
        work.context.run(work.future.set_result, result)
        self._execute(actions)

    def _instance_failed(
        self, pid: Hashable, inst: Any, key: int, work: _Work, exc: BaseException
    ) -> None:
        log.warning("%s: instance %s failed (%s); retrying elsewhere", self.name, inst, exc)
        with self._lock:
            self.failures += 1
            self._instances.pop(pid, None)
            actions, _ = self.policy.failed(pid)
            retry = work.attempts < self.max_attempts and not self._closed
            if retry:
                self.retries += 1
                actions += self.policy.submit(key)
            else:
                self._work.pop(key, None)
        if not retry:
            work.future.set_exception(
                Unavailable(f"{self.name}: failed on {work.attempts} instance(s): {exc}")
            )
        # the retry goes out first: stopping the failed instance (on_failed) may
        # wait for it to exit or for a stop grace period
        self._execute(actions)
        if self.on_failed is not None:
            try:
                self.on_failed(inst)
            except Exception:
                log.exception("%s: on_failed hook failed", self.name)

    # -- scaling ------------------------------------------------------------------
    def remove(self, instance: Any) -> bool:
        """Drop an idle instance (keep-alive expiry); the caller stops it."""
        with self._lock:
            for pid, inst in self._instances.items():
                if inst is instance and self.policy.remove(pid):
                    del self._instances[pid]
                    return True
        return False

    def reap_surplus(self) -> list[Any]:
        """Remove the newest instance when the pool's demand no longer needs it
        (:meth:`LoadAwarePolicy.surplus`; never below ``min_instances``);
        returns the removed instances for the caller to stop."""
        with self._lock:
            iid = self.policy.surplus()
            if iid is None or self.policy.n_instances <= self.min_instances:
                return []
            if iid not in self._instances or not self.policy.remove(iid):
                return []
            return [self._instances.pop(iid)]

    def scale_to(self, n: int) -> list[Any]:
        """Remove idle instances (newest first) until at most ``n`` remain;
        returns the removed instances for the caller to stop."""
        removed = []
        with self._lock:
            for s in reversed(self.policy.warm()):
                if self.policy.n_instances <= n:
                    break
                if self.policy.remove(s.id):
                    removed.append(self._instances.pop(s.id))
        return removed

    def instances(self) -> list[Any]:
        """Every warm instance (to stop them at shutdown)."""
        with self._lock:
            return list(self._instances.values())

    def idle_instances(self) -> list[tuple[Any, float]]:
        """``(instance, idle_since)`` of idle instances (for keep-alive)."""
        with self._lock:
            return [
                (self._instances[s.id], s.since)
                for s in self.policy.warm()
                if s.state == IDLE and s.id in self._instances
            ]

    def close(self) -> None:
        """Fail work that has not started and stop the worker threads."""
        with self._lock:
            self._closed = True
            stranded = [self._work.pop(k) for k in self.policy.drain_pending() if k in self._work]
            for s in self.policy.instances.values():
                stranded += [self._work.pop(k) for k in s.queue if k in self._work]
                s.queue.clear()
        for w in stranded:
            w.future.set_exception(Unavailable(f"function pool {self.name!r} is shut down"))
        self._executor.shutdown(wait=True)

    # -- reporting -------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        """``{"name", "policy", "instances": [{instance, url, state, queue_length,
        since}], "queues": {instance: length}, "pending": n}``."""
        with self._lock:
            rows = []
            for s in sorted(self.policy.instances.values(), key=lambda s: s.order):
                inst = self._instances.get(s.id)
                rows.append(
                    {
                        "instance": getattr(inst, "id", s.id) if inst is not None else s.id,
                        "url": getattr(inst, "url", None),
                        "state": s.state,
                        "queue_length": len(s.queue),
                        "since": s.since,
                    }
                )
            return {
                "name": self.name,
                "policy": self.policy_name,
                "instances": rows,
                "queues": {str(r["instance"]): r["queue_length"] for r in rows},
                "pending": len(self.policy.pending),
            }

    @property
    def stats(self) -> dict[str, Any]:
        with self._lock:
            p = self.policy
            return {
                "instances": p.n_instances,
                "launches": p.launches,
                "launch_failures": self.launch_failures,
                "submitted": self.submitted,
                "completed": self.completed,
                "queued_items": p.queued_items,
                "pending": len(p.pending),
                "steals": p.steals,
                "retries": self.retries,
                "inline_runs": self.inline_runs,
                "instance_failures": self.failures,
                **p.wait_percentiles(),
            }
