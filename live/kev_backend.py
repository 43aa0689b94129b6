"""Kev on a live run's loop: the advisor's requests run as tasks off the tick path, each answer delivered
to the engine at the moment it returned, and kept as the run's cassette."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from functools import partial
from typing import Any, Protocol

from engine.core import PRIO_KEV, KevDone
from engine.kev.advisor import KevContext, KevReply
from engine.kev.cassette import Cassette, CassetteEntry, RecordingAdvisor
from engine.latency.recorded import LatencySink
from live.clock import LiveClock
from live.wal import LiveWal


class KevHost(Protocol):
    """What Kev's backend needs of the run (the runner): its task set, whether it is stopping, its
    clock, and the way an input is put on that clock."""

    kev_tasks: set[asyncio.Task[Any]]
    stopping: bool
    clock: LiveClock

    def inject(self, priority: int, fn: Callable[[], None], *, ts: int | None = None) -> int: ...


class LiveKevBackend:
    """Kev off the tick path: ``advise`` runs as a task; the reply is delivered when it returns.

    Every answer is also kept as a cassette entry with the lag the engine saw (``stamp - request``),
    in request order, late ones (after the engine's timeout) included: replayed, a late answer is
    late again, at the same time.
    """

    def __init__(self, advisor: RecordingAdvisor, runner: KevHost, sink: LatencySink) -> None:
        self.advisor = advisor
        self.runner = runner
        self.sink = sink
        self.wal: LiveWal | None = None  # every answer is journaled before the engine hears it
        self._slots: list[CassetteEntry | None] = []  # one per request, in request order

    def start(self, ctx: KevContext, now_ns: int, done: KevDone) -> None:
        task = asyncio.get_running_loop().create_task(self.advisor.advise(ctx))
        self.runner.kev_tasks.add(task)
        self._slots.append(None)
        task.add_done_callback(partial(self._finished, ctx, now_ns, done, len(self._slots) - 1))

    def _finished(
        self, ctx: KevContext, started: int, done: KevDone, slot: int, task: asyncio.Task[KevReply]
    ) -> None:
        self.runner.kev_tasks.discard(task)
        if task.cancelled():
            if not self.runner.stopping:
                return
            # Given up on at shutdown: on the record as an answer that never came, so that a replay
            # of the run (this cassette) sees the same thing at the same time.
            reply = KevReply(raw=None, error="no answer: the run stopped first", key=self.advisor.key(ctx))
        elif (exc := task.exception()) is not None:
            reply = KevReply(raw=None, error=f"kev failed: {type(exc).__name__}", key=self.advisor.key(ctx))
        else:
            reply = task.result()
        t = self.runner.clock.stamp()
        lag = t - started
        self.sink.add("kev", started, lag)
        key = reply.key or self.advisor.key(ctx)
        entry = self._slots[slot] = CassetteEntry.from_reply(
            key, reply, lag_ns=lag, request_id=ctx.request_id, advisor=self.advisor.name
        )
        if self.wal is not None:
            self.wal.cassette(slot, entry)
        self.runner.inject(PRIO_KEV, partial(done, ctx, reply, lag), ts=t)

    def cassette(self) -> Cassette:
        cas = Cassette(meta={"recorded_by": "dualhub live", "lag": "engine-observed"})
        for e in self._slots:
            if e is not None:
                cas.add(e)
        return cas
