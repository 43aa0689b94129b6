"""Clocks: one interface, a virtual replay clock and a real-time clock for live mode.

Timers and delayed events (Kev responses, order acks, Laya labels) are scheduled on the clock and
handed back in a stable total order ``(ts_ns, priority, insertion seq)``; dispatch is the caller's job.
"""

from __future__ import annotations

import heapq
import time
from typing import Any, NamedTuple, Protocol

from engine.events import Nanos


class ClockError(RuntimeError):
    """A broken clock invariant (time going backwards, a timer in the past)."""


class TimerKey(NamedTuple):
    ts_ns: Nanos
    priority: int
    seq: int


class Clock(Protocol):
    def now_ns(self) -> Nanos: ...

    def schedule(self, ts_ns: Nanos, priority: int, payload: Any) -> TimerKey: ...

    def next_key(self) -> TimerKey | None: ...

    def pop_due(self, until: tuple[int, ...] | None = None) -> list[tuple[TimerKey, Any]]: ...


class _TimerHeap:
    def __init__(self) -> None:
        self._heap: list[tuple[TimerKey, Any]] = []
        self._seq = 0

    def push(self, ts_ns: Nanos, priority: int, payload: Any) -> TimerKey:
        key = TimerKey(ts_ns, priority, self._seq)
        self._seq += 1
        heapq.heappush(self._heap, (key, payload))
        return key

    def peek(self) -> TimerKey | None:
        return self._heap[0][0] if self._heap else None

    def pop(self) -> tuple[TimerKey, Any]:
        return heapq.heappop(self._heap)

    def __len__(self) -> int:
        return len(self._heap)


class ReplayClock:
    """Virtual time. Never reads the wall clock; refuses to go backwards."""

    def __init__(self, start_ns: Nanos = 0) -> None:
        self._now_ns = start_ns
        self._timers = _TimerHeap()

    def now_ns(self) -> Nanos:
        return self._now_ns

    def advance_to(self, ts_ns: Nanos) -> None:
        if ts_ns < self._now_ns:
            raise ClockError(f"time must not go back: ts_ns={ts_ns} < now_ns={self._now_ns}")
        self._now_ns = ts_ns

    def schedule(self, ts_ns: Nanos, priority: int, payload: Any) -> TimerKey:
        if ts_ns < self._now_ns:
            raise ClockError(f"timer in the past: ts_ns={ts_ns} < now_ns={self._now_ns}")
        return self._timers.push(ts_ns, priority, payload)

    def next_key(self) -> TimerKey | None:
        return self._timers.peek()

    def pop_next(self) -> tuple[TimerKey, Any]:
        """Pop the earliest timer and advance time to it."""
        key, payload = self._timers.pop()
        self.advance_to(key.ts_ns)
        return key, payload

    def pop_due(self, until: tuple[int, ...] | None = None) -> list[tuple[TimerKey, Any]]:
        """Pop every timer with key <= ``until`` (default: due at ``now``), advancing time to each."""
        bound = until if until is not None else (self._now_ns, 1 << 62, 1 << 62)
        out = []
        while (k := self._timers.peek()) is not None and tuple(k) <= tuple(bound):
            out.append(self.pop_next())
        return out

    @property
    def pending(self) -> int:
        return len(self._timers)


class RealtimeClock:
    """Wall-clock time for live mode (``time.time_ns``); timers are due once their time has passed."""

    def __init__(self) -> None:
        self._timers = _TimerHeap()
        self._last_ns = 0

    def now_ns(self) -> Nanos:
        # The wall clock can step back (NTP); the engine must never see time go backwards.
        self._last_ns = max(self._last_ns, time.time_ns())
        return self._last_ns

    def schedule(self, ts_ns: Nanos, priority: int, payload: Any) -> TimerKey:
        return self._timers.push(ts_ns, priority, payload)

    def next_key(self) -> TimerKey | None:
        return self._timers.peek()

    def pop_due(self, until: tuple[int, ...] | None = None) -> list[tuple[TimerKey, Any]]:
        now = self.now_ns()
        bound = until if until is not None else (now, 1 << 62, 1 << 62)
        out = []
        while (k := self._timers.peek()) is not None and tuple(k) <= tuple(bound) and k.ts_ns <= now:
            out.append(self._timers.pop())
        return out

    def seconds_until_next(self) -> float | None:
        k = self._timers.peek()
        return None if k is None else max(0.0, (k.ts_ns - self.now_ns()) / 1e9)
