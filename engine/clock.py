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

    def take_next(self, ts_ns: Nanos, priority: int) -> bool: ...


_new_key = tuple.__new__  # TimerKey without NamedTuple.__new__'s keyword handling (hot path)


class _TimerHeap:
    """Entries are flat tuples ``(ts_ns, priority, seq, payload)``: cheaper to build and compare than
    ``(TimerKey, payload)``; ``seq`` is unique, so payloads are never compared."""

    def __init__(self) -> None:
        self._heap: list[tuple[Nanos, int, int, Any]] = []
        self._seq = 0

    def push(self, ts_ns: Nanos, priority: int, payload: Any) -> TimerKey:
        seq = self._seq
        self._seq = seq + 1
        heapq.heappush(self._heap, (ts_ns, priority, seq, payload))
        return _new_key(TimerKey, (ts_ns, priority, seq))

    def peek(self) -> TimerKey | None:
        return _new_key(TimerKey, self._heap[0][:3]) if self._heap else None

    def pop(self) -> tuple[TimerKey, Any]:
        ts_ns, priority, seq, payload = heapq.heappop(self._heap)
        return _new_key(TimerKey, (ts_ns, priority, seq)), payload

    def __len__(self) -> int:
        return len(self._heap)


class ReplayClock:
    """Virtual time. Never reads the wall clock; refuses to go backwards.

    ``t_ns`` (what :meth:`now_ns` returns) and :attr:`timers` are open for the replay's hot loop: it
    peeks at ``timers[0]`` and, when no timer comes before its next market event, sets ``t_ns`` to
    that event's time itself (its events are sorted, so time only moves forward) instead of calling
    :meth:`run_before`. Anything else uses the methods.
    """

    def __init__(self, start_ns: Nanos = 0) -> None:
        self.t_ns = start_ns
        self._timers = _TimerHeap()

    @property
    def timers(self) -> list[tuple[Nanos, int, int, Any]]:
        """Pending timers as a heap of ``(ts_ns, priority, seq, payload)`` (read only)."""
        return self._timers._heap

    def now_ns(self) -> Nanos:
        return self.t_ns

    def advance_to(self, ts_ns: Nanos) -> None:
        if ts_ns < self.t_ns:
            raise ClockError(f"time must not go back: ts_ns={ts_ns} < now_ns={self.t_ns}")
        self.t_ns = ts_ns

    def schedule(self, ts_ns: Nanos, priority: int, payload: Any) -> TimerKey:
        if ts_ns < self.t_ns:
            raise ClockError(f"timer in the past: ts_ns={ts_ns} < now_ns={self.t_ns}")
        return self._timers.push(ts_ns, priority, payload)

    def next_key(self) -> TimerKey | None:
        return self._timers.peek()

    def run_before(self, ts_ns: Nanos, priority: int) -> None:
        """Run every timer whose key sorts before ``(ts_ns, priority)`` (its payload is a callable),
        each at its own time, then advance to ``ts_ns``: the replay loop's step, kept tight because
        it runs once per market event."""
        heap = self._timers._heap
        pop = heapq.heappop
        while heap:
            head = heap[0]
            t = head[0]
            if t > ts_ns or (t == ts_ns and head[1] >= priority):
                break
            if t < self.t_ns:
                raise ClockError(f"time must not go back: ts_ns={t} < now_ns={self.t_ns}")
            self.t_ns = t
            pop(heap)[3]()
        if ts_ns < self.t_ns:
            raise ClockError(f"time must not go back: ts_ns={ts_ns} < now_ns={self.t_ns}")
        self.t_ns = ts_ns

    def run_all(self) -> None:
        """Run every pending timer in order (the end of a replay), including ones they schedule."""
        heap = self._timers._heap
        while heap:
            t = heap[0][0]
            self.advance_to(t)
            heapq.heappop(heap)[3]()

    def take_next(self, ts_ns: Nanos, priority: int) -> bool:
        """Never: a replay's driver schedules its inputs as it reaches them, so an entry that nothing
        on the heap precedes may still have inputs before it (live mode's clock answers otherwise)."""
        return False

    def pop_next(self) -> tuple[TimerKey, Any]:
        """Pop the earliest timer and advance time to it."""
        key, payload = self._timers.pop()
        self.advance_to(key.ts_ns)
        return key, payload

    def pop_due(self, until: tuple[int, ...] | None = None) -> list[tuple[TimerKey, Any]]:
        """Pop every timer with key <= ``until`` (default: due at ``now``), advancing time to each."""
        bound = until if until is not None else (self.t_ns, 1 << 62, 1 << 62)
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

    def take_next(self, ts_ns: Nanos, priority: int) -> bool:
        """Never here; :class:`live.clock.LiveClock`, which stamps every input, can answer yes."""
        return False

    def seconds_until_next(self) -> float | None:
        k = self._timers.peek()
        return None if k is None else max(0.0, (k.ts_ns - self.now_ns()) / 1e9)
