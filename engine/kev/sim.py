"""Replay-mode Kev worker: asks the advisor, delivers the reply after a modelled lag on the clock.

The advisor runs to completion at request time (on a private event loop, so async advisors such as
an HTTP client work too), but its reply only becomes visible at ``now + lag``: the replay never
waits on Kev, exactly as the tick path never waits on it live.
"""

from __future__ import annotations

import asyncio
from functools import partial

from engine.clock import Clock
from engine.core import PRIO_KEV, KevDone
from engine.events import Nanos
from engine.kev.advisor import KevAdvisor, KevContext
from engine.latency import LatencyModel


class SimKevBackend:
    def __init__(
        self,
        advisor: KevAdvisor,
        lag: LatencyModel,
        clock: Clock,
        *,
        use_recorded_lag: bool = False,
        recorded_lag_scale: float = 1.0,
    ) -> None:
        self.advisor = advisor
        self.lag = lag
        self.clock = clock
        # Cassette replies carry the lag they were recorded with; replaying it reproduces the timing.
        self.use_recorded_lag = use_recorded_lag
        self.recorded_lag_scale = recorded_lag_scale  # what-if on a recorded tape (--scale-latency kev=2)
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self, ctx: KevContext, now_ns: Nanos, done: KevDone) -> None:
        advise_now = getattr(self.advisor, "advise_now", None)
        if advise_now is not None:  # synchronous advisors skip the event loop round trip
            reply = advise_now(ctx)
        else:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
            reply = self._loop.run_until_complete(self.advisor.advise(ctx))
        recorded = reply.timings.get("lag_ns") if self.use_recorded_lag else None
        if recorded is not None:
            lag_ns = int(round(recorded * self.recorded_lag_scale))
        else:
            lag_ns = self.lag.sample_ns(now_ns)
        self.clock.schedule(now_ns + lag_ns, PRIO_KEV, partial(done, ctx, reply, lag_ns))

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
