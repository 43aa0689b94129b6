"""Replay-mode Kev worker: asks the advisor, delivers the reply after a modelled lag on the clock.

The advisor runs to completion at request time (on a private event loop, so async advisors such as
an HTTP client work too), but its reply only becomes visible at ``now + lag``: the replay never
waits on Kev, exactly as the tick path never waits on it live.

The lag is, per reply: the lag a cassette recorded with it (``use_recorded_lag``; an LLM's cached
answer carries the wall time of the call that produced it); the wall time of the call itself when a
live model answered (``measure``: how long the model really took, so a slow or hung server is late
on the virtual clock as it would be live, and the engine's Kev timeout fires); else a draw from the
lag model. Recorded and measured lags are multiplied by ``lag_scale`` (a faster or slower target
machine), and every lag that was not drawn is kept in :attr:`SimKevBackend.recorded` (kind ``kev``,
keyed by the pick-up time, late answers included), as live mode keeps them, for the run's
``latency_recorded.parquet``.

Every circuit breaker the backend drives (the advisor's, and its fallback's, e.g. a cassette's live
client) is put on the replay clock: its cooldown passes in virtual time, so a breaker opened in a
replay closes again after the cooldown of replayed time, however fast the replay runs.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from functools import partial

from engine.clock import Clock
from engine.core import PRIO_KEV, KevDone
from engine.events import Nanos
from engine.kev.advisor import KevAdvisor, KevContext, KevReply
from engine.latency.models import LatencyModel
from engine.latency.recorded import LatencySink


class SimKevBackend:
    def __init__(
        self,
        advisor: KevAdvisor,
        lag: LatencyModel,
        clock: Clock,
        *,
        use_recorded_lag: bool = False,
        recorded_lag_scale: float = 1.0,
        measure: bool = False,
        wall_ns: Callable[[], int] = time.perf_counter_ns,
    ) -> None:
        self.advisor = advisor
        self.lag = lag
        self.clock = clock
        # Cassette replies carry the lag they were recorded with; replaying it reproduces the timing.
        self.use_recorded_lag = use_recorded_lag
        self.recorded_lag_scale = recorded_lag_scale  # recorded and measured lags (--kev-lag-scale)
        self.measure = measure
        self.wall_ns = wall_ns
        self.recorded = LatencySink()  # recorded or measured lags, one per reply that had one
        self.answers = 0
        self.on_answer: Callable[[], None] | None = None  # after each reply (the progress bar)
        self._loop: asyncio.AbstractEventLoop | None = None
        for obj in (advisor, getattr(advisor, "fallback", None), getattr(advisor, "inner", None)):
            breaker = getattr(obj, "breaker", None)
            if breaker is not None:
                breaker.clock_ns = clock.now_ns

    def start(self, ctx: KevContext, now_ns: Nanos, done: KevDone) -> None:
        reply, lag_ns = self.answer(ctx, now_ns)
        self.clock.schedule(now_ns + lag_ns, PRIO_KEV, partial(done, ctx, reply, lag_ns))

    def answer(
        self, ctx: KevContext, now_ns: Nanos, model_lag: Callable[[Nanos], Nanos] | None = None
    ) -> tuple[KevReply, Nanos]:
        """The advisor's reply to ``ctx``, picked up at ``now_ns``, and its lag: what :meth:`start`
        schedules (the replay kernel asks here and schedules it itself). ``model_lag``: where a lag
        drawn from the lag model comes from (the kernel draws them ahead, in the same order)."""
        advise_now = getattr(self.advisor, "advise_now", None)
        t0 = self.wall_ns() if self.measure else 0
        if advise_now is not None:  # synchronous advisors skip the event loop round trip
            reply = advise_now(ctx)
        else:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
            reply = self._loop.run_until_complete(self.advisor.advise(ctx))
        recorded = reply.timings.get("lag_ns") if self.use_recorded_lag else None
        if recorded is None and self.measure and reply.timings.get("live"):
            recorded = self.wall_ns() - t0  # a live model answered: its real latency
        if recorded is not None:
            lag_ns = int(round(recorded * self.recorded_lag_scale))
            self.recorded.add("kev", now_ns, lag_ns)
        else:
            lag_ns = (model_lag or self.lag.sample_ns)(now_ns)
        self.answers += 1
        if self.on_answer is not None:
            self.on_answer()
        return reply, lag_ns

    def close(self) -> None:
        """Close HTTP clients (the advisor's and its fallback's) on the loop they ran on, then the loop."""
        if self._loop is None:
            return
        for obj in (self.advisor, getattr(self.advisor, "fallback", None)):
            aclose = getattr(obj, "aclose", None)
            if aclose is not None:
                self._loop.run_until_complete(aclose())
        self._loop.close()
        self._loop = None
