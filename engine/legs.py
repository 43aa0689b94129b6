"""A hub's Kev command executed as a unit, and its legging risk bounded.

A portfolio hub's command (``engine/instruments.py``) names a target for several instruments: its legs.
Once every instrument has applied its part (the asking one first, then the others in instrument order),
:meth:`Legs.send` sends every leg in the same step at the same time: the order each instrument's
``leg_order`` (``engine/kernel/orders.py``) wants now, each through the risk gateway. While they go out each
leg's USD notional is in ``PF_LEG``, so the portfolio rules (``engine/risk.py``) judge a leg against the
rest of the portfolio *after* the others' legs: a hedged pair whose legs each breach the net-delta limit
alone, but not together, passes (a leg the gateway refuses is taken out before the next is judged).

Hedge ratio convention (the pairs rule's and ``engine/kev/command.py`` ``check_sense``'s): a pair's
``hedge_ratio`` is the leader's USD notional per USD of the follower, on the other side: leader
notional = -hedge_ratio x follower notional (beta of log follower on log leader: a leader move of x
moves the follower by beta x). The legs' sizes come from the command's targets, which the sense check
holds to that.

Legging: when one leg has filled and another has not ``timeout_ns`` after the legs went out, the
residual of the lagging leg is hedged (:meth:`Legs.check`): ``cross`` sends a market order for it,
``reprice`` a limit order at the far touch (the price that fills now; what rests is cancelled and
sent again at the touch at the next check). Checks repeat every ``timeout_ns`` until every leg is
filled; each lagging leg's episode becomes a ``legging`` row (``engine/events.py`` LeggingEvent): the
symbol, the residual qty and its notional at the mark when it was found, when the legs went out
(start), when it was found closed (end, to the check), and how: ``crossed``/``repriced`` (hedged),
``filled`` (the leg filled by itself before a hedge was needed), ``refused`` (the gateway refused the
hedge: the residual stays, reported), ``superseded`` (the next command's unit took over) or ``open``
(the run ended first).

The check is a timer of priority ``PRIO_LEG`` at ``PI[PI_LEG_DUE]``: the replay's compiled loop stops
for it (``ST_LEG``), the per-event engine and live schedule it on their clock; both call this code.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from engine import kernel as K
from engine.bounds import LEG_HEDGES
from engine.errors import DualhubError
from engine.store import atomic_write_parquet, sha256_file

# events/legging.parquet: a row per lagging leg's episode, in the order they closed. Beside the streams
# the run's digest covers (engine/eventlog.py OUTPUT_STREAMS): the orders that hedge it are in those.
LEGGING_SCHEMA = pa.schema(
    [
        pa.field("ts_event", pa.int64(), nullable=False),
        pa.field("ts_recv", pa.int64(), nullable=False),
        pa.field("seq", pa.int64(), nullable=False),
        pa.field("symbol", pa.string(), nullable=False),
        pa.field("residual_qty", pa.float64(), nullable=False),  # signed: what the leg still had to trade
        pa.field("residual_notional_usd", pa.float64(), nullable=False),  # |qty| x its mark when found
        pa.field("start_ns", pa.int64(), nullable=False),  # when the legs went out
        pa.field("end_ns", pa.int64(), nullable=False),  # the check that found it closed
        pa.field("closed", pa.string(), nullable=False),  # CLOSED
        pa.field("hedges", pa.int64(), nullable=False),  # hedge orders sent for it
    ],
    metadata={"dualhub.event": "LeggingEvent", "dualhub.schema_version": "1"},
)
CLOSED = ("crossed", "repriced", "filled", "refused", "superseded", "open")

# step(i, fn): run fn(core, b_loc) as a step of instrument i (its CoreState-like arrays and its books'
# receive times), inside its driver's room and after (the portfolio's counters and risk view in, orders
# out to the venue). Returns fn's result.
Step = Callable[[int, Callable[[Any, np.ndarray], Any]], Any]


def checked_leg_hedge(value: object) -> str:
    if value not in LEG_HEDGES:
        raise DualhubError(f"leg_hedge must be one of {', '.join(LEG_HEDGES)}, got {value!r}")
    return str(value)


@dataclass(slots=True)
class _Leg:
    inst: int
    want: int  # signed lots the leg adds to the position
    oids: list[int]  # the leg's order and its hedges, accepted ones
    episode: list[Any] | None = None  # [start, residual lots, notional, how, hedges]


@dataclass(slots=True)
class Legs:
    """The portfolio's current unit and the legging rows so far."""

    symbols: tuple[str, ...]
    timeout_ns: int
    cross: bool = True
    rows: list[tuple[Any, ...]] = field(default_factory=list)
    _legs: list[_Leg] = field(default_factory=list)
    _start: int = 0

    # ------------------------------------------------------------ a command's legs, together

    def send(self, step: Step, cores: list[Any], PI: np.ndarray, PF: np.ndarray, order: list[int], now: int,
             origin: int) -> None:  # fmt: skip
        """Every leg of the command just applied to the instruments in ``order`` goes out now, in that
        order (``origin``: when the command's context was taken, the orders' tick-to-order start)."""
        want: dict[int, int] = {}
        for i in order:
            c = cores[i]
            c.S[K.S_NOW] = now
            side, lots = K.pf_leg(PF, i, c.S, c.SF, c.C, c.CF, c.OI, c.work)
            if side != K.NO_ORDER:
                want[i] = int(lots) if side == K.BUY else -int(lots)
        if not want:  # a command that trades nothing now leaves the legs of the last one to their check
            return
        self._close_all(now, "superseded")
        PI[K.PI_LEG_DUE] = 0
        legs: list[_Leg] = []
        try:
            for i in order:
                if i not in want:
                    continue
                oid = step(i, lambda c, b: _rebalance(c, b, origin))
                if K.order_fill(cores[i].OI, oid)[0] < 0:  # refused: the next legs are judged without it
                    PF[i, K.PF_LEG] = 0.0
                    legs.append(_Leg(i, want[i], []))
                else:
                    legs.append(_Leg(i, want[i], [oid]))
        finally:
            PF[:, K.PF_LEG] = 0.0
        if sum(1 for g in legs if g.oids) and len(legs) >= 2 and self.timeout_ns > 0:
            self._legs = legs
            self._start = now
            PI[K.PI_LEG_DUE] = now + self.timeout_ns

    # ------------------------------------------------------------ legging

    def check(self, step: Step, cores: list[Any], PI: np.ndarray, PF: np.ndarray, now: int) -> None:
        """The legs ``timeout_ns`` after they went out (or after the last check): every lagging leg of a
        unit one of whose legs has filled is hedged; the check comes again while one is lagging."""
        PI[K.PI_LEG_DUE] = 0
        got = {id(g): _filled(cores[g.inst].OI, g) for g in self._legs}
        if any(v is None for v in got.values()):  # an order's row serves another: nothing to judge on
            self._close_all(now, "open")
            return
        some_filled = any(got[id(g)][0] != 0 for g in self._legs)  # type: ignore[index]
        again = False
        for g in self._legs:
            filled, working = got[id(g)]  # type: ignore[misc]
            residual = g.want - filled
            if residual == 0 or (residual > 0) != (g.want > 0):
                if g.episode is not None:
                    self._close(g, now, g.episode[3])
                continue
            if not some_filled:  # nothing of the unit filled yet: no exposure to hedge
                again = again or working > 0
                continue
            c = cores[g.inst]
            if g.episode is None:
                qty = float(K.size_of(abs(residual), c.C))
                mark = float(PF[g.inst, K.PF_MARK])
                g.episode = [self._start, qty if residual > 0 else -qty, qty * mark, "filled", 0]
            to_hedge = abs(residual) - working  # a market order still on its way may fill it yet
            if to_hedge <= 0:
                again = True
                continue
            side = K.BUY if residual > 0 else K.SELL
            prev = g.oids[-1] if (g.oids and not self.cross) else 0
            oid = step(g.inst, lambda c, b, s=side, n=to_hedge, p=prev: _hedge(c, b, s, n, self.cross, p))
            if K.order_fill(c.OI, oid)[0] < 0:
                self._close(g, now, "refused")
                g.want = filled  # the gateway keeps this residual: reported, not asked for again
                continue
            g.oids.append(oid)
            g.episode[3] = "crossed" if self.cross else "repriced"
            g.episode[4] += 1
            again = True
        if again:
            PI[K.PI_LEG_DUE] = now + self.timeout_ns
        else:
            self._close_all(now, "filled")

    def finish(self, now: int) -> None:
        """The run ends: an episode still open is reported as such."""
        self._close_all(now, "open")

    def table(self) -> pa.Table:
        cols = list(zip(*self.rows, strict=True)) if self.rows else [[] for _ in range(9)]
        names = [n for n in LEGGING_SCHEMA.names if n != "seq"]
        arrays = {n: cols[k] for k, n in enumerate(names)}
        arrays["seq"] = list(range(len(self.rows)))
        return pa.table({n: arrays[n] for n in LEGGING_SCHEMA.names}, schema=LEGGING_SCHEMA)

    def write(self, events_dir: Any) -> dict[str, dict[str, Any]]:
        """``legging.parquet`` in ``events_dir`` (empty when no leg lagged): its files entry."""
        path = events_dir / "legging.parquet"
        atomic_write_parquet(self.table(), path)
        return {"events/legging.parquet": {"rows": len(self.rows), "sha256": sha256_file(path)}}

    def _close(self, g: _Leg, now: int, how: str) -> None:
        ep = g.episode
        if ep is None:
            return
        start, qty, notional, _, hedges = ep
        self.rows.append((now, now, self.symbols[g.inst], qty, notional, int(start), int(now), how, hedges))
        g.episode = None

    def _close_all(self, now: int, how: str) -> None:
        for g in self._legs:
            if g.episode is not None:
                self._close(g, now, how)
        self._legs = []


def _filled(OI: np.ndarray, g: _Leg) -> tuple[int, int] | None:
    """(signed lots the leg's orders filled, lots market orders of them still have working), or None
    when a row was taken by a later order. A working limit hedge is repriced (cancelled, sent again):
    not counted."""
    filled = 0
    working = 0
    for oid in g.oids:
        r = oid & (OI.shape[0] - 1)
        if OI[r, K.OI_OID] != oid:
            return None
        n = int(OI[r, K.OI_FILLED])
        filled += n
        if OI[r, K.OI_STATUS] != K.DONE and OI[r, K.OI_TYPE] == K.MARKET:
            working += int(OI[r, K.OI_LOTS]) - n
    return (filled if g.want > 0 else -filled), working


def _rebalance(c: Any, b_loc: np.ndarray, origin: int) -> int:
    oid = int(c.S[K.S_OID]) + 1
    K.step_rebalance(
        origin, c.S, c.SF, c.C, c.CF, c.OI, c.OF, c.heap, c.olat, c.work, c.recent, c.eng_book, b_loc,
        c.out, c.SCR,
    )  # fmt: skip
    return oid


def _hedge(c: Any, b_loc: np.ndarray, side: int, lots: int, cross: bool, prev: int) -> int:
    return int(
        K.step_hedge(
            side, lots, cross, prev, c.S, c.SF, c.C, c.CF, c.OI, c.OF, c.heap, c.olat, c.work, c.recent,
            c.eng_book, b_loc, c.out, c.SCR,
        )  # fmt: skip
    )
