"""Advisors for fault injection in Kev's own process (tests/engine/kev/test_kev_process.py). They live in a
small module of their own because the child process imports it to unpickle them."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from engine.kev.advisor import KevContext, KevReply


class Boom(Exception):
    pass


class FakeAdvisor:
    """Answers ``{"request_id", "pid", "cancelled"}`` after ``ctx.mid`` ms; ``label`` picks a fault:
    ``raise`` raises :class:`Boom`, ``exit`` kills the process, ``hang`` never answers."""

    name = "fake"

    def __init__(self, marker: str = "") -> None:
        self.cancelled = 0
        self.marker = marker

    async def advise(self, ctx: KevContext) -> KevReply:
        try:
            await asyncio.sleep(ctx.mid / 1000)
            if ctx.label == "hang":
                await asyncio.sleep(3600)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        if ctx.label == "raise":
            raise Boom(f"request {ctx.request_id} failed")
        if ctx.label == "exit":
            os._exit(3)
        raw = {"request_id": ctx.request_id, "pid": os.getpid(), "cancelled": self.cancelled}
        return KevReply(raw=raw, timings={"wall_ms": ctx.mid}, key=f"k{ctx.request_id}")

    async def aclose(self) -> None:
        if self.marker:
            Path(self.marker).write_text(f"closed after {self.cancelled} cancellations")
