"""Admission control: shed what cannot be answered within the SLO.

Under overload a gateway that admits everything makes every request late; this
controller sheds the excess instead (503 + ``Retry-After``), so that what it
admits still meets the SLO. It decides with measured figures only, when a request
reaches its handler:

- ``waited``: seconds since the server accepted the request
  (:mod:`gnn_faas.gateway.accept_clock`), already spent out of the SLO;
- ``N``: requests admitted and not yet answered (in buffers or executing);
- ``service``: the median of the last ``window`` handler-to-answer times of
  admitted requests (a median, so a few cold starts do not shed the stream);
- ``limit``: a concurrency limit learnt by AIMD: an answer within ``target =
  headroom * SLO`` raises it by ``1 / limit``, a later one multiplies it by
  ``backoff`` (at most once per SLO), within ``[min_limit, max_limit]``.

The rule::

    predicted = waited + service
    admit  iff  (N < limit  and  predicted <= target)  or  (N == 0 and waited < SLO)

A shed request gets ``Retry-After = max(1, ceil(service))`` seconds. Thread-safe;
time comes from the injected clock (a ``FakeClock`` makes it deterministic). Why
each figure and why buffering needs no special case: docs/design/admission.md.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass

import numpy as np

from gnn_faas.clock import Clock, RealClock
from gnn_faas.errors import Unavailable


class Overloaded(Unavailable):
    """Shed by admission control: 503 with a ``Retry-After`` header."""

    def __init__(self, message: str, retry_after_s: float):
        super().__init__(message)
        self.retry_after_s = retry_after_s


@dataclass(frozen=True)
class Decision:
    admit: bool
    predicted_s: float
    waited_s: float
    in_flight: int
    limit: float
    retry_after_s: int = 0


class AdmissionController:
    """AIMD concurrency limit plus a queueing-delay check (see the module docstring)."""

    def __init__(
        self,
        slo_s: float,
        clock: Clock | None = None,
        headroom: float = 0.65,
        enabled: bool = True,
        # optimistic start: a burst that graph sharing batches well is admitted,
        # and late answers cut the limit multiplicatively within a few SLOs
        initial_limit: float = 64.0,
        min_limit: float = 1.0,
        max_limit: float = 256.0,
        backoff: float = 0.75,
        window: int = 32,
    ):
        if slo_s <= 0:
            raise ValueError("slo_s must be > 0")
        if not 0 < headroom <= 1:
            raise ValueError("headroom must be in (0, 1]")
        if not 0 < backoff < 1 or window < 1 or not 1 <= min_limit <= max_limit:
            raise ValueError("need 0 < backoff < 1, window >= 1, 1 <= min_limit <= max_limit")
        self.slo_s = float(slo_s)
        self.target_s = float(headroom) * self.slo_s
        self.clock = clock or RealClock()
        self.headroom = float(headroom)
        self.enabled = enabled
        self.min_limit, self.max_limit = float(min_limit), float(max_limit)
        self.backoff = float(backoff)
        self._recent = np.zeros(int(window))  # ring of the last service times
        self._answers = 0
        self._lock = threading.Lock()
        self.limit = min(max(float(initial_limit), self.min_limit), self.max_limit)
        self.service_s = 0.0  # median of recent handler-to-answer seconds (0 until an answer)
        self.in_flight = 0
        self._last_backoff = -math.inf
        self.admitted = 0
        self.shed = 0
        self.late = 0

    def decide(self, accepted_at: float | None = None) -> Decision:
        """Admit or shed a request accepted at ``accepted_at`` (clock time; None: now).
        An admitted request must be followed by exactly one :meth:`done`."""
        with self._lock:
            now = self.clock.now()
            waited = max(0.0, now - accepted_at) if accepted_at is not None else 0.0
            n = self.in_flight
            predicted = waited + self.service_s
            admit = (
                not self.enabled
                or (n < self.limit and predicted <= self.target_s)
                or (n == 0 and waited < self.slo_s)
            )
            if admit:
                self.in_flight += 1
                self.admitted += 1
                return Decision(True, predicted, waited, n, self.limit)
            self.shed += 1
            retry = max(1, math.ceil(self.service_s))
            return Decision(False, predicted, waited, n, self.limit, retry)

    def done(self, latency_s: float | None = None, waited_s: float = 0.0) -> None:
        """An admitted request was answered after ``latency_s`` (from its accept,
        ``waited_s`` of it before the handler); ``None``: it failed (no lesson)."""
        with self._lock:
            self.in_flight = max(0, self.in_flight - 1)
            if latency_s is None:
                return
            self._recent[self._answers % self._recent.size] = max(0.0, latency_s - waited_s)
            self._answers += 1
            self.service_s = float(np.median(self._recent[: min(self._answers, self._recent.size)]))
            if latency_s <= self.target_s:
                self.limit = min(self.max_limit, self.limit + 1.0 / self.limit)
                return
            self.late += 1
            now = self.clock.now()
            if now - self._last_backoff >= self.slo_s:
                self.limit = max(self.min_limit, self.limit * self.backoff)
                self._last_backoff = now

    def as_dict(self) -> dict:
        with self._lock:
            return {
                "in_flight": self.in_flight,
                "limit": self.limit,
                "service_s": self.service_s,
                "admitted": self.admitted,
                "shed": self.shed,
                "late": self.late,
                "target_s": self.target_s,
                "enabled": self.enabled,
            }
