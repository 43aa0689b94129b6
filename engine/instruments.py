"""One engine over several instruments: a core per instrument (``engine/kernel/``), one clock, one
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
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from engine import kernel as K
from engine.contract import ContractConfig, round_to_step
from engine.errors import DualhubError
from engine.kev.advisor import InstrumentState, KevContextV2, PairState
from engine.kev.command import ACTIONS, CommandV2, check_pairs, command_rows
from engine.kev.pairs import P_BETA, P_SPREAD, PAIR_STATE_SIZE, pair_state, pair_z
from engine.legs import Legs, checked_leg_hedge
from engine.state import LABEL_NAMES

if TYPE_CHECKING:
    from engine.core_config import EngineConfig, PortfolioView


class Engine(Protocol):
    """What a portfolio reads of each instrument's engine (``engine.core.Engine``, which joins it): named
    here so the portfolio need not import the engine that imports it."""

    cfg: EngineConfig
    core: Any
    inst: int
    clock: Any

    @property
    def portfolio(self) -> PortfolioView: ...

    def step(self, fn: Any) -> Any: ...

    def pull(self) -> None: ...


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
            if k.strip() in fields:  # the second value would silently win: say which one is meant
                raise DualhubError(f"--instrument {text!r}: {k.strip()} is given twice for {sym.strip()}")
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


# The sizes a portfolio scales from the first instrument to the others (the rest of INSTRUMENT_FIELDS is
# each instrument's contract).
SIZE_FIELDS = ("quote_qty", "max_position", "max_order_qty")
_PLACEHOLDER = {"quote_qty": "Q", "max_position": "P", "max_order_qty": "O"}


def scaled_config(e: EngineConfig, contract: ContractConfig, ratio: float) -> EngineConfig:
    """``e`` for an instrument whose price is ``1 / ratio`` of the first one's: its sizes scaled to the
    same notional, rounded down to the size step, at least the minimum order."""
    if ratio == 1.0:
        return dataclasses.replace(e, contract=contract)

    def size(q: float) -> float:
        return max(contract.min_qty, round_to_step(q * ratio, contract.size_step))

    risk = dataclasses.replace(
        e.risk, max_position=size(e.risk.max_position), max_order_qty=size(e.risk.max_order_qty)
    )
    quotes = dataclasses.replace(e.quotes, quote_qty=size(e.quotes.quote_qty))
    return dataclasses.replace(e, contract=contract, risk=risk, quotes=quotes)


def resolve_instruments(
    base: EngineConfig,
    symbols: Sequence[str],
    contracts: Mapping[str, ContractConfig],
    ref_mids: Mapping[str, float | None],
    named: Mapping[str, Mapping[str, float]],
) -> list[EngineConfig]:
    """Every instrument's engine config, as replay and live both trade them: ``base`` (sizes in the
    first instrument's units) on the instrument's contract, its sizes scaled to the first instrument's
    notional at the reference mids (a replay's first books, live's tickers at the start), rounded down
    to its size step (at least its minimum order), then the settings ``named`` for it over them.

    An instrument whose sizes are all named needs no price; one that needs scaling without a usable
    price (its own or the first instrument's) is one DualhubError line naming the way out."""
    out = []
    for j, sym in enumerate(symbols):
        own = named.get(sym, {})
        e = dataclasses.replace(base, symbol=sym)
        need = [k for k in SIZE_FIELDS if k not in own]
        if j == 0 or not need:  # the sizes are the config's, or all named: no price to scale by
            scaled = scaled_config(e, contracts[sym], 1.0)
        else:
            lacking = [s for s in (symbols[0], sym) if not _usable(ref_mids.get(s))]
            if lacking:
                give = ",".join(f"{k}={_PLACEHOLDER[k]}" for k in need)
                raise DualhubError(
                    f"{sym}: no reference price of {' and '.join(lacking)} to scale the first instrument's "
                    f"sizes to it: give them (--instrument {sym}:{give})"
                )
            ratio = float(ref_mids[symbols[0]]) / float(ref_mids[sym])  # type: ignore[arg-type]
            scaled = scaled_config(e, contracts[sym], ratio)
        out.append(instrument_config(scaled, dict(own)))
    return out


def _usable(mid: float | None) -> bool:
    return mid is not None and math.isfinite(mid) and mid > 0


class Portfolio:
    """The instruments one engine trades: build it, then one :class:`engine.core.Engine` per instrument
    with ``portfolio=`` this (the first one built is instrument 0). Drivers hand each instrument's
    events to its engine (:meth:`engine`); the portfolio keeps them one."""

    def __init__(
        self,
        symbols: list[str] | tuple[str, ...],
        *,
        pairs: tuple[tuple[str, str], ...] = (),
        hub: bool = False,
        pair_half_life_ns: int = 60_000_000_000,
        leg_timeout_ns: int = 1_000_000_000,
        leg_hedge: str = "cross",
    ) -> None:
        """``pairs``: (leader, follower) pairs whose hedge ratio the portfolio fits from the marks;
        ``hub``: Kev answers for the whole portfolio (v2 contexts and commands), each command's legs
        going out as one unit, a lagging leg hedged ``leg_timeout_ns`` later as ``leg_hedge`` says
        (engine/legs.py)."""
        if len(set(symbols)) != len(symbols) or not symbols:
            raise ValueError(f"a portfolio needs distinct symbols, got {list(symbols)}")
        if why := check_pairs(symbols, pairs):
            raise ValueError(f"pairs: {why}")
        self.symbols = tuple(symbols)
        self.hub = hub
        self.pairs = tuple(pairs)
        self.pair_half_life_ns = float(pair_half_life_ns)
        # The portfolio's shared arrays (engine/kernel/portfolio.py "several instruments" and "Kev as the
        # portfolio hub"): the replay's compiled loop runs on these very arrays.
        n = len(symbols)
        self.PI = np.zeros(K.PI_SIZE, dtype=np.int64)
        self.PI[K.PI_HUB] = hub
        self.PF = np.zeros((n, K.PF_COLS), dtype=np.float64)
        self.PF[:, K.PF_MARK] = math.nan  # no book yet
        self.PS = np.array([pair_state() for _ in self.pairs]).reshape(len(self.pairs), PAIR_STATE_SIZE)
        self.PP = np.zeros((len(self.pairs), K.PP_COLS), dtype=np.int64)
        for k, (a, b) in enumerate(self.pairs):
            self.PP[k, K.PP_LEADER] = self.symbols.index(a)
            self.PP[k, K.PP_FOLLOWER] = self.symbols.index(b)
        self.LR = np.zeros((n, 1 + K.LABELS_KEPT), dtype=np.int64)
        self.engines: list[Engine] = []
        self._by_symbol: dict[str, Engine] = {}
        self.legs = Legs(self.symbols, int(leg_timeout_ns), checked_leg_hedge(leg_hedge) == "cross")
        self.ending = (
            False  # the driver's input has ended: a leg check with nothing left to wait for is dropped
        )

    def join(self, engine: Engine) -> int:
        """``engine`` trades the next symbol; its instrument index."""
        i = len(self.engines)
        if i >= len(self.symbols) or engine.cfg.symbol != self.symbols[i]:
            raise ValueError(f"engine for {engine.cfg.symbol} joins a portfolio expecting {self.symbols}")
        self.engines.append(engine)
        self._by_symbol[engine.cfg.symbol] = engine
        if self.hub:
            engine.core.S[K.S_UNIT] = 1  # its replies' legs go out with the others' (engine/legs.py)
        return i

    def engine(self, symbol: str) -> Engine:
        return self._by_symbol[symbol]

    # ------------------------------------------------------------ Kev as the portfolio hub

    def observe(self, i: int, t_ns: int) -> None:
        """Instrument ``i`` has a new mark at ``t_ns`` (the engine's receive time): every pair with it
        as a leg takes one observation of both legs' marks."""
        K.pf_observe(self.PF, self.PS, self.PP, i, t_ns, self.pair_half_life_ns)

    def note_label(self, i: int, label: int) -> None:
        K.pf_note_label(self.LR, i, label)

    def context(self, source: Engine, rid: int) -> KevContextV2:
        """Request ``rid`` of ``source``'s instrument as the portfolio's Kev context."""
        return hub_context(self, [e.core for e in self.engines], source.inst, rid)

    def fan_out(self, source: Engine, cmd: CommandV2, cid: int, rid: int, ts_ctx: int) -> None:
        """Command ``cid`` (the reply to ``source``'s request ``rid``) sets every other instrument's
        target, in instrument order; then every leg goes out as one unit (engine/legs.py)."""
        order = [source.inst]
        for i, part in fan_out_parts(self.symbols, source.inst, cmd):
            order.append(i)
            self.engines[i].step(
                lambda c, b, p=part: K.step_command_part(
                    cid, rid, ts_ctx, *p, c.S, c.SF, c.C, c.CF, c.OI, c.OF, c.heap, c.olat, c.work,
                    c.recent, c.eng_book, b, c.out, c.SCR,
                )
            )  # fmt: skip
        now = source.clock.now_ns()
        self.legs.send(self._step, [e.core for e in self.engines], self.PI, self.PF, order, now, ts_ctx)
        self._arm()

    def unit(self, source: Engine) -> None:
        """A label of ``source``'s instrument made its leg due (S_UNIT_DUE): every instrument's leg
        goes out now, that one's first, as one unit (engine/legs.py)."""
        S = source.core.S
        origin = int(S[K.S_UNIT_DUE])
        S[K.S_UNIT_DUE] = 0
        order = [source.inst, *(i for i in range(len(self.engines)) if i != source.inst)]
        now = source.clock.now_ns()
        self.legs.send(self._step, [e.core for e in self.engines], self.PI, self.PF, order, now, origin)
        self._arm()

    def _step(self, i: int, fn: Any) -> Any:
        return self.engines[i].step(fn)

    def _arm(self) -> None:
        """The leg check due (PI_LEG_DUE) on the engines' clock."""
        due = int(self.PI[K.PI_LEG_DUE])
        if due > 0:
            self.engines[0].clock.schedule(due, K.PRIO_LEG, _LegTimer(self, due))

    def check_legs(self, due: int) -> None:
        """The leg check at ``due``, unless a later unit moved it (its own timer comes then)."""
        if int(self.PI[K.PI_LEG_DUE]) != due:
            return
        clock = self.engines[0].clock
        if self.ending and not any(not isinstance(t[3], _LegTimer) for t in getattr(clock, "timers", ())):
            self.PI[K.PI_LEG_DUE] = 0  # the input ended and nothing is pending that could fill a leg
            return
        self.legs.check(self._step, [e.core for e in self.engines], self.PI, self.PF, due)
        self._arm()

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


class _LegTimer:
    """The clock's payload for a leg check."""

    __slots__ = ("pf", "due")

    def __init__(self, pf: Portfolio, due: int) -> None:
        self.pf, self.due = pf, due

    def __call__(self) -> None:
        self.pf.check_legs(self.due)


class HubState(Protocol):
    """What a hub's Kev context reads besides the cores (a :class:`Portfolio`, or the replay loop's
    state over the same arrays)."""

    symbols: tuple[str, ...]
    pairs: tuple[tuple[str, str], ...]
    PF: np.ndarray
    PS: np.ndarray
    LR: np.ndarray


def hub_context(pf: HubState, cores: list[Any], source: int, rid: int) -> KevContextV2:
    """Request ``rid`` of instrument ``source`` as the portfolio's Kev context: every instrument's
    position, mark, spread, latest labels and position limit (``cores``: each one's ``CoreState``),
    every pair's fit."""
    own = cores[source]._context(rid)
    insts = []
    for i, core in enumerate(cores):
        book = core.eng_book
        spread = float(book[30] - book[0]) if core.S[K.S_ENG_BOOK] else math.nan
        insts.append(
            InstrumentState(
                symbol=pf.symbols[i],
                position=K.position(core.S, core.C),
                mark=float(pf.PF[i, K.PF_MARK]),
                spread=round(spread, 10),
                labels=tuple(LABEL_NAMES[c] for c in K.latest_labels(pf.LR, i)),
                max_position=float(core.CF[K.CF_MAX_POSITION]),
            )
        )
    pairs = tuple(
        PairState(
            leader=a,
            follower=b,
            spread=float(pf.PS[k, P_SPREAD]),
            z=float(pair_z(pf.PS[k])),
            hedge_ratio=float(pf.PS[k, P_BETA]),
        )
        for k, (a, b) in enumerate(pf.pairs)
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


def command_part(cmd: CommandV2, symbol: str) -> tuple[int, float, float, float]:
    """The part of the hub's command ``cmd`` for ``symbol``: (action code, target, hedge ratio, slip)."""
    for sym, target, hedge in command_rows(cmd):
        if sym == symbol:
            return ACTIONS.index(cmd.action), target, hedge, cmd.max_slippage_bps
    raise KeyError(symbol)


def fan_out_parts(
    symbols: tuple[str, ...], source: int, cmd: CommandV2
) -> list[tuple[int, tuple[int, float, float, float]]]:
    """The instruments other than ``source`` that the hub's command ``cmd`` names, in instrument
    order, each with its part (a v1 reply, made v2, names only the instrument that asked)."""
    targets = dict(cmd.targets)
    return [(i, command_part(cmd, s)) for i, s in enumerate(symbols) if i != source and s in targets]
