"""Kev's circuit breaker: after a run of failures the engine stops asking llama-server for a while.

The cooldown runs on an injected clock (monotonic wall time by default; replay puts it on the virtual
clock, :class:`engine.kev.sim.SimKevBackend`), and the breaker queues its state changes as
:class:`~engine.kev.advisor.BreakerChange` for the client to hand on with its next reply (the engine
logs them as ``kev_breaker`` events).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Literal

from engine.kev.advisor import BreakerChange

log = logging.getLogger(__name__)

BreakerState = Literal["closed", "open", "half_open"]


class CircuitBreaker:
    """Opens after ``failure_threshold`` consecutive failures; after ``cooldown_ns`` one probe may pass
    (half-open): its success closes the breaker, its failure opens it again. Time from ``clock_ns``
    (settable: the replay backend moves it onto the virtual clock). State changes queue up as
    :class:`~engine.kev.advisor.BreakerChange` until :meth:`take_changes`.
    """

    def __init__(
        self,
        *,
        failure_threshold: int,
        cooldown_ns: int,
        clock_ns: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        self.failure_threshold = failure_threshold
        self.cooldown_ns = cooldown_ns
        self.clock_ns = clock_ns
        self._state: BreakerState = "closed"
        self._opened_at_ns = 0
        self._probe_in_flight = False
        self.consecutive_failures = 0
        self.times_opened = 0
        self._changes: list[BreakerChange] = []

    def _change(self, state: BreakerState, reason: str) -> None:
        self._state = state
        self._changes.append(BreakerChange(self.clock_ns(), state, reason, self.consecutive_failures))

    def take_changes(self) -> tuple[BreakerChange, ...]:
        """The state changes since the last call, oldest first."""
        out, self._changes = tuple(self._changes), []
        return out

    @property
    def state(self) -> BreakerState:
        if self._state == "open" and self.clock_ns() - self._opened_at_ns >= self.cooldown_ns:
            return "half_open"
        return self._state

    def retry_in_s(self) -> float:
        left = self.cooldown_ns - (self.clock_ns() - self._opened_at_ns)
        return max(0.0, left / 1e9) if self._state == "open" else 0.0

    def allow(self) -> bool:
        """May a request go out now? In half-open state only one probe at a time."""
        state = self.state
        if state == "closed":
            return True
        if state == "half_open" and not self._probe_in_flight:
            if self._state != "half_open":
                self._change("half_open", f"cooldown of {self.cooldown_ns / 1e9:g} s over: one probe")
            self._probe_in_flight = True
            return True
        return False

    def record_success(self) -> None:
        self._probe_in_flight = False
        self.consecutive_failures = 0
        if self._state != "closed":
            log.warning("Kev circuit closed: llama-server answers again")
            self._change("closed", "probe answered")

    def record_failure(self, failure: str = "") -> None:
        """One more consecutive failure (of kind ``failure``)."""
        self.consecutive_failures += 1
        self._probe_in_flight = False
        if self._state == "half_open" or self.consecutive_failures >= self.failure_threshold:
            if self._state != "open":
                self.times_opened += 1
                log.warning(
                    "Kev circuit open after %d consecutive failures: the engine runs on Laya and the "
                    "risk gateway alone for at least %.1f s",
                    self.consecutive_failures,
                    self.cooldown_ns / 1e9,
                )
                kind = failure or "error"
                if self._state == "half_open":
                    what = f"probe failed ({kind})"
                else:
                    what = f"{self.consecutive_failures} consecutive failures, the last {kind}"
                self._change("open", f"{what}; cooldown {self.cooldown_ns / 1e9:g} s")
            self._opened_at_ns = self.clock_ns()

    def abort_probe(self) -> None:
        """A probe was cancelled without an answer: let the next call probe instead."""
        self._probe_in_flight = False
