"""Clocks: the one source of time for everything that schedules.

Gateway buffers, timeouts, queues and keep-alive take a :class:`Clock` instead
of calling :func:`time.monotonic`, so tests and discrete-event replays drive them
with a :class:`FakeClock` (no sleeps, exact event times) and serving uses
:class:`RealClock`.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol, runtime_checkable


@runtime_checkable
class Clock(Protocol):
    """``now()``: monotonic seconds (arbitrary origin); ``sleep(s)``: wait ``s`` seconds."""

    def now(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...


class RealClock:
    """Wall time from :func:`time.monotonic`."""

    def now(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)

    def __repr__(self) -> str:
        return "RealClock()"


class FakeClock:
    """Time that moves only when told: ``advance(dt)``, ``set(t)`` or ``sleep(s)``
    (which advances the clock by ``s`` and returns at once). Thread-safe; time
    never goes backwards."""

    def __init__(self, start: float = 0.0):
        self._t = float(start)
        self._lock = threading.Lock()

    def now(self) -> float:
        with self._lock:
            return self._t

    def advance(self, dt: float) -> float:
        if dt < 0:
            raise ValueError(f"cannot advance a clock by a negative time ({dt})")
        with self._lock:
            self._t += float(dt)
            return self._t

    def set(self, t: float) -> float:
        """Move to time ``t`` (no-op if the clock is already past it)."""
        with self._lock:
            self._t = max(self._t, float(t))
            return self._t

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            self.advance(seconds)

    def __repr__(self) -> str:
        return f"FakeClock(t={self.now():.6f})"
