"""What the venue holds, compared with the engine and cleaned on the way out: reconciliation (after a
private reconnect, every ``reconcile_every_s``, and once at the end), the kill switch's flatten, and the
exit cancel-all.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

from live.gateway import GatewayExecution, GatewayTransportError
from live.symbol import SymbolRun
from wire.bitget.bitget_v2_rest import BitgetError

log = logging.getLogger("live.runner")  # the run's one logger name (live/feed.py says why)

PRIO_KILL = 0  # the kill switch's clock priority: before anything else at its timestamp
FLATTEN_TRIES, FLATTEN_RETRY_S = 5, 0.5  # --kill-flattens: what is left is sent again, 0.5 s apart


class Reconciler:
    """Live mode's checks of the venue against the engine, one at a time. A failed check after a
    reconnect trips the kill switch (``kill``); periodic ones only after three failures in a row."""

    def __init__(self, execution: GatewayExecution, errors: list[str], kill: Callable[[str], None]) -> None:
        self.execution = execution
        self.errors = errors  # the run's error list (the summary's)
        self.kill = kill
        self.lock = asyncio.Lock()  # one reconciliation at a time (reconnect or periodic)
        self.count = 0  # periodic checks completed

    async def on_private_connected(self, n: int) -> None:
        if n <= 1:
            return
        try:
            async with self.lock:
                diffs = await self.execution.reconcile(f"reconnect{n}")
            log.info("reconciled after private reconnect %d: %d differences", n, diffs)
        except (BitgetError, GatewayTransportError) as e:
            self.errors.append(f"reconcile: {e}")
            self.kill("reconcile_failed")

    async def periodically(self, every_s: float, settle_ms: int) -> None:
        """A private WebSocket can stay up and still lose pushes: compare the venue with the engine
        every ``every_s`` too. A failed check is retried at the next one; three in a row trip the kill
        switch (the engine's state can no longer be verified)."""
        failures = 0
        while True:
            await asyncio.sleep(every_s)
            try:
                async with self.lock:
                    diffs = await self.execution.reconcile("periodic", settle_ms=settle_ms)
                failures = 0
                self.count += 1
                if diffs:
                    log.warning("periodic reconciliation: %d differences", diffs)
            except (BitgetError, GatewayTransportError) as e:
                failures += 1
                self.errors.append(f"periodic reconcile: {e}")
                if failures >= 3:
                    self.kill("reconcile_failed")
                    return

    async def final(self, drain: Callable[[], Awaitable[None]]) -> Any:
        """One last check against the venue after the cancel-all: what it did that no push told the
        engine (fills during the cancel-all, pushes lost since the last periodic check) is booked (the
        clock ``drain``ed) before the run's files are written, so they end with the venue's account of
        the run. What the shutdown record says of it."""
        try:
            async with asyncio.timeout(10.0):
                info = await self.execution.reconcile("final")
            await drain()
            return info
        except Exception as e:  # the run's outcome stands; the summary says the check did not happen
            self.errors.append(f"final reconcile: {type(e).__name__}: {e}")
            return f"failed: {e}"


async def cancel_all(execution: GatewayExecution | None, syms: dict[str, SymbolRun]) -> dict[str, Any]:
    """The exit cancel-all: at the venue (live) or the paper exchanges' resting orders dropped."""
    if execution is not None:
        await execution.wait_idle(3.0)
        try:
            async with asyncio.timeout(10.0):
                return await execution.cancel_everything()
        except TimeoutError:
            return {"error": "cancel-all timed out", "left_open": "unknown: cancel-all failed: timed out"}
    resting = {s: st.paper.drop_resting() for s, st in syms.items() if st.paper is not None}
    return {"paper_resting_dropped": resting, "left_open": []}  # paper orders never reach a venue


def start_flatten(st: SymbolRun, flatten: dict[str, dict[str, Any]]) -> None:
    """``kill_flattens``, once the kill switch is on in ``st``'s engine: its position on the record
    (``flatten``, the summary's), then the first flatten orders."""
    pos = float(st.engine.portfolio.position)
    flatten[st.symbol] = {"position_before": pos, "orders": [], "refused": 0}
    send_flatten(st, flatten)


def send_flatten(st: SymbolRun, flatten: dict[str, dict[str, Any]]) -> None:
    """:meth:`Engine.flatten`: reduce-only market orders for what of the position no flatten order
    covers yet (the kill switch lets only these through; every other rule applies, so a stale or
    missing book refuses them: the position stays, and the summary says so). What is left after a
    refusal (the order rate limit, most often: the strategy's last second counts) or a venue reject
    is sent again at shutdown (:func:`finish_flatten`)."""
    f = flatten[st.symbol]
    sent, refused = st.engine.flatten()
    f["orders"] += sent
    f["refused"] += int(refused)


async def finish_flatten(
    execution: GatewayExecution | None,
    syms: dict[str, SymbolRun],
    flatten: dict[str, dict[str, Any]],
    inject: Callable[[int, Callable[[], None]], Any],
    drain: Callable[[], Awaitable[None]],
) -> None:
    """``kill_flattens``: wait for the flatten orders to finish, then send what is still open of a
    position, ``FLATTEN_RETRY_S`` apart, until it is closed or ``FLATTEN_TRIES`` rounds are spent."""
    for _ in range(FLATTEN_TRIES):
        if execution is not None:
            await execution.wait_done([o for f in flatten.values() for o in f["orders"]], 5.0)
        todo = [
            syms[sym]
            for sym in flatten
            if abs(float(syms[sym].engine.portfolio.position)) >= syms[sym].contract.min_qty
        ]
        if not todo:
            return
        await asyncio.sleep(FLATTEN_RETRY_S)
        for st in todo:
            inject(PRIO_KILL, partial(send_flatten, st, flatten))
        await drain()  # paper: the simulated exchange fills on the clock
