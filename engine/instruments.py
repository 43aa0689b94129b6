"""One engine over several instruments: a core per instrument (``engine/kernel.py``), one clock, one
portfolio.

Each instrument keeps the state of its own quoting, orders, Kev requests and money, as a single-
instrument engine does. What makes them one engine is shared: the id counters (order ``dh-N``, Kev
request and command ids are unique across the portfolio), the output buffer (the event log's rows
stay in the order the steps ran, each naming its instrument), and the risk gateway's view of the rest
of the portfolio (``PF``: each instrument's mark, net delta, gross exposure and PnL), which the
portfolio rules of ``engine/risk.py`` read (net delta, gross exposure, loss stop over all instruments).
The operator's kill switch and flatten act on every instrument, and an EMERGENCY label of any
instrument pulls the quotes of all.

Kev as the portfolio hub (``hub=True``): a label of any instrument asks Kev with the whole portfolio
(``KevContextV2``: every instrument's position, mark, spread and latest labels, every configured
pair's spread, z-score and fitted hedge ratio, ``engine/kev/pairs.py``), and its v2 command sets the
target of every instrument at once: the asking instrument's core applies its own part, the others
theirs (``step_command``), under one command id.
"""

from __future__ import annotations

import dataclasses
import math
from collections import deque
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import numpy as np

from engine import kernel as K
from engine.errors import DualhubError
from engine.kev.advisor import InstrumentState, KevContextV2, PairState
from engine.kev.command import ACTIONS, CommandV2, check_pairs, command_rows
from engine.kev.pairs import P_BETA, P_SPREAD, pair_state, pair_update, pair_z

if TYPE_CHECKING:
    from engine.core import Engine, EngineConfig, PortfolioView

# What a portfolio may set per instrument, over the engine config every instrument starts from: its
# contract's steps and its sizes (instruments of different prices trade different quantities).
INSTRUMENT_FIELDS = ("tick", "size_step", "min_qty", "quote_qty", "max_position", "max_order_qty")


def checked_instruments(d: Any) -> dict[str, dict[str, float]]:
    """Per-instrument settings ``{symbol: {field: value}}`` (INSTRUMENT_FIELDS, each > 0), or one
    DualhubError line naming what is wrong."""
    if not isinstance(d, dict):
        raise DualhubError(f"instruments must map symbols to settings, not {type(d).__name__}")
    out: dict[str, dict[str, float]] = {}
    for sym, fields in d.items():
        if not isinstance(fields, dict):
            raise DualhubError(f"instruments.{sym} must map fields to numbers")
        for k, v in fields.items():
            if k not in INSTRUMENT_FIELDS:
                raise DualhubError(f"instruments.{sym}.{k}: unknown; known: {', '.join(INSTRUMENT_FIELDS)}")
            if isinstance(v, bool) or not isinstance(v, int | float) or not (v > 0 and math.isfinite(v)):
                raise DualhubError(f"instruments.{sym}.{k} must be a finite number > 0, got {v!r}")
        out[str(sym)] = {k: float(v) for k, v in fields.items()}
    return out


def instrument_args(values: list[str] | None) -> dict[str, dict[str, float]]:
    """``--instrument SYMBOL:FIELD=V,FIELD=V`` flags (repeatable) as per-instrument settings, or one
    DualhubError line."""
    out: dict[str, dict[str, float]] = {}
    for text in values or ():
        sym, sep, rest = text.partition(":")
        if not sep or not sym or not rest:
            raise DualhubError(f"--instrument {text!r}: expected SYMBOL:FIELD=VALUE[,FIELD=VALUE...]")
        fields = out.setdefault(sym.strip(), {})
        for item in rest.split(","):
            k, eq, v = item.partition("=")
            try:
                fields[k.strip()] = float(v)
            except ValueError:
                raise DualhubError(f"--instrument {text!r}: {item!r} is not FIELD=NUMBER") from None
            if not eq:
                raise DualhubError(f"--instrument {text!r}: {item!r} is not FIELD=NUMBER")
    return checked_instruments(out)


def instrument_config(e: EngineConfig, overrides: dict[str, float]) -> EngineConfig:
    """``e`` with one instrument's settings (INSTRUMENT_FIELDS) put over it."""
    if not overrides:
        return e
    o = overrides
    contract = dataclasses.replace(
        e.contract, **{k: o[k] for k in ("tick", "size_step", "min_qty") if k in o}
    )
    risk = dataclasses.replace(e.risk, **{k: o[k] for k in ("max_position", "max_order_qty") if k in o})
    quotes = dataclasses.replace(e.quotes, **({"quote_qty": o["quote_qty"]} if "quote_qty" in o else {}))
    return dataclasses.replace(e, contract=contract, risk=risk, quotes=quotes)


class Portfolio:
    """The instruments one engine trades: build it, then one :class:`engine.core.Engine` per instrument
    with ``portfolio=`` this (the first one built is instrument 0). Drivers hand each instrument's
    events to its engine (:meth:`engine`); the portfolio keeps them one."""

    # how many of an instrument's latest labels a Kev context carries
    LABELS_KEPT = 3

    def __init__(
        self,
        symbols: list[str] | tuple[str, ...],
        *,
        pairs: tuple[tuple[str, str], ...] = (),
        hub: bool = False,
        pair_half_life_ns: int = 60_000_000_000,
    ) -> None:
        """``pairs``: (leader, follower) pairs whose hedge ratio the portfolio fits from the marks;
        ``hub``: Kev answers for the whole portfolio (v2 contexts and commands)."""
        if len(set(symbols)) != len(symbols) or not symbols:
            raise ValueError(f"a portfolio needs distinct symbols, got {list(symbols)}")
        if why := check_pairs(symbols, pairs):
            raise ValueError(f"pairs: {why}")
        self.symbols = tuple(symbols)
        self.hub = hub
        self.pairs = tuple(pairs)
        self._legs = [(self.symbols.index(a), self.symbols.index(b)) for a, b in self.pairs]
        self.pair_states = [pair_state() for _ in self.pairs]
        self._pair_t: list[int | None] = [None] * len(self.pairs)
        self.pair_half_life_ns = float(pair_half_life_ns)
        self.labels: list[deque[str]] = [deque(maxlen=self.LABELS_KEPT) for _ in symbols]
        self.PI = np.zeros(K.PI_SIZE, dtype=np.int64)
        self.PF = np.zeros((len(symbols), K.PF_COLS), dtype=np.float64)
        self.PF[:, K.PF_MARK] = math.nan  # no book yet
        self.engines: list[Engine] = []
        self._by_symbol: dict[str, Engine] = {}

    def join(self, engine: Engine) -> int:
        """``engine`` trades the next symbol; its instrument index."""
        i = len(self.engines)
        if i >= len(self.symbols) or engine.cfg.symbol != self.symbols[i]:
            raise ValueError(f"engine for {engine.cfg.symbol} joins a portfolio expecting {self.symbols}")
        self.engines.append(engine)
        self._by_symbol[engine.cfg.symbol] = engine
        return i

    def engine(self, symbol: str) -> Engine:
        return self._by_symbol[symbol]

    # ------------------------------------------------------------ Kev as the portfolio hub

    def observe(self, i: int, t_ns: int) -> None:
        """Instrument ``i`` has a new mark at ``t_ns`` (the engine's receive time): every pair with it
        as a leg takes one observation of both legs' marks."""
        PF = self.PF
        for k, (li, fi) in enumerate(self._legs):
            if i != li and i != fi:
                continue
            ml, mf = PF[li, K.PF_MARK], PF[fi, K.PF_MARK]
            if not (ml > 0 and mf > 0):  # NaN too: a leg with no book yet
                continue
            last = self._pair_t[k]
            dt = 0.0 if last is None else float(t_ns - last)
            pair_update(self.pair_states[k], math.log(ml), math.log(mf), dt, self.pair_half_life_ns)
            self._pair_t[k] = t_ns

    def note_label(self, i: int, label: str) -> None:
        self.labels[i].append(label)

    def context(self, source: Engine, rid: int) -> KevContextV2:
        """Request ``rid`` of ``source``'s instrument as the portfolio's Kev context."""
        own = source.core._context(rid)
        insts = []
        for i, e in enumerate(self.engines):
            book = e.core.eng_book
            spread = float(book[30] - book[0]) if e.core.S[K.S_ENG_BOOK] else math.nan
            insts.append(
                InstrumentState(
                    symbol=e.cfg.symbol,
                    position=float(e.core.S[K.S_POS]) / 1e12,
                    mark=float(self.PF[i, K.PF_MARK]),
                    spread=round(spread, 10),
                    labels=tuple(self.labels[i]),
                    max_position=float(e.core.CF[K.CF_MAX_POSITION]),
                )
            )
        pairs = tuple(
            PairState(
                leader=a,
                follower=b,
                spread=float(st[P_SPREAD]),
                z=float(pair_z(st)),
                hedge_ratio=float(st[P_BETA]),
            )
            for (a, b), st in zip(self.pairs, self.pair_states, strict=True)
        )
        return KevContextV2(
            request_id=rid,
            ts_ns=own.ts_ns,
            symbol=own.symbol,
            label=own.label,
            label_seq=own.label_seq,
            p_label=own.p_label,
            instruments=tuple(insts),
            pairs=pairs,
        )

    def mine(self, engine: Engine, cmd: CommandV2) -> tuple[int, float, float, float]:
        """The part of ``cmd`` for ``engine``'s instrument: (action code, target, hedge ratio, slip)."""
        for sym, target, hedge in command_rows(cmd):
            if sym == engine.cfg.symbol:
                return ACTIONS.index(cmd.action), target, hedge, cmd.max_slippage_bps
        raise KeyError(engine.cfg.symbol)

    def fan_out(self, source: Engine, cmd: CommandV2, cid: int, rid: int, ts_ctx: int) -> None:
        """Command ``cid`` (the reply to ``source``'s request ``rid``) sets every other instrument's
        target, in instrument order."""
        targets = dict(cmd.targets)  # a v1 reply (as_v2) names only the instrument that asked
        for e in self.engines:
            if e is not source and e.cfg.symbol in targets:
                e.command(cid, rid, ts_ctx, *self.mine(e, cmd))

    def emergency(self, source: Engine) -> None:
        """An EMERGENCY label on ``source``'s instrument: the others pull their quotes, in instrument
        order, at the same time."""
        for e in self.engines:
            if e is not source:
                e.pull()

    def kill(self) -> None:
        """The kill switch, on every instrument."""
        for e in self.engines:
            e.kill()

    def flatten(self) -> tuple[list[str], bool]:
        """Reduce-only market orders for every instrument's position: the client oids sent, and whether
        one was refused."""
        sent: list[str] = []
        refused = False
        for e in self.engines:
            s, r = e.flatten()
            sent += s
            refused = refused or r
        return sent, refused

    @property
    def kill_switch(self) -> bool:
        return any(e.kill_switch for e in self.engines)

    def positions(self) -> dict[str, PortfolioView]:
        return {e.cfg.symbol: e.portfolio for e in self.engines}

    def net_delta_usd(self) -> float:
        """Sum over instruments of position times mark (an instrument with no position counts 0)."""
        return float(sum(self.PF[:, K.PF_DELTA]))

    def pnl(self) -> Decimal:
        """Cash plus every position at its instrument's mark, net of fees (exact per instrument)."""
        total = Decimal(0)
        for i, e in enumerate(self.engines):
            mark = float(self.PF[i, K.PF_MARK])
            view = e.portfolio
            total += view.cash if view.position == 0 else view.pnl(mark)
        return total
