"""The engine: one tick path shared by replay and live.

Market data comes in (``on_book``, ``on_trade``); Laya's label becomes an event after its compute
latency; non-HOLD labels go onto the Kev queue without blocking; Kev's replies become portfolio
commands; the strategy turns labels and commands into order intents; every intent passes the risk
gateway; execution reports come back through ``on_ack``/``on_fill``/... Everything the engine decides
is emitted to the :class:`EventLog`. Time comes only from the clock it is given.
"""

from __future__ import annotations

import hashlib
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from functools import partial
from typing import Any, ClassVar, Protocol

import numpy as np
import orjson

from engine.book import imbalance
from engine.clock import Clock
from engine.contract import ContractConfig
from engine.eventlog import EventLog
from engine.events import (
    BookSnapshot,
    Fill,
    Label,
    Nanos,
    PortfolioCommand,
    Trade,
)
from engine.fastinit import frozen_maker
from engine.kev.advisor import KevContext, KevReply, context_body
from engine.kev.command import CommandFields
from engine.kev.failures import breaker_rows, judge
from engine.kev.queue import KevQueue, QueueNote
from engine.portfolio import Portfolio, units
from engine.risk import (
    R_OK,
    REASONS,
    OrderIntent,
    RiskLimits,
    RiskState,
    check,
    limits_array,
    rule_codes,
    verdict_of,
)
from engine.strategy import BUY, NO_ORDER, QuoteConfig, Quoter, kev_target, rebalance_order
from venue.latency import ConstantLatency, LatencyModel

# Timer priorities: ties at one timestamp resolve market data (10, 20) first, then these in order.
PRIO_LABEL = 40
PRIO_KEV = 52
PRIO_EXCH_IN = 61
PRIO_EXCH_OUT = 62

Labeler = Callable[[BookSnapshot], tuple[int, np.ndarray]]
LABEL_NAMES: tuple[str, ...] = tuple(x.name for x in sorted(Label))  # by class index
# Positional constructors (every field, declaration order): built once per order intent / risk check.
_intent = frozen_maker(OrderIntent)
_risk_state = frozen_maker(RiskState)
KevDone = Callable[[KevContext, KevReply, Nanos], None]


class KevBackend(Protocol):
    """Runs one Kev request off the tick path and calls ``done`` when the reply is due."""

    def start(self, ctx: KevContext, now_ns: Nanos, done: KevDone) -> None: ...


class ExecutionClient(Protocol):
    """Where accepted orders go: the simulated exchange in replay, Bitget's API in live mode."""

    def submit(self, intent: OrderIntent, now_ns: Nanos) -> None: ...

    def cancel(self, client_oid: str, symbol: str, now_ns: Nanos) -> None: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineConfig:
    symbol: str = "BTCUSDT"
    contract: ContractConfig = field(default_factory=ContractConfig)
    risk: RiskLimits = field(default_factory=RiskLimits)
    quotes: QuoteConfig = field(default_factory=QuoteConfig)
    strategy: str = "baseline"  # engine.strategies.registry.STRATEGIES
    strategy_params: dict[str, float] = field(default_factory=dict)  # over the strategy's defaults
    laya_latency_ns: Nanos = 200_000
    kev_queue_max: int = 2
    kev_stale_after_ns: Nanos = 1_000_000_000
    kev_advice_ttl_ns: Nanos = 5_000_000_000
    kev_min_interval_ns: Nanos = 0  # 0: every non-HOLD label is offered to Kev
    kev_queue_policy: str = "drop_oldest"
    kev_max_in_flight: int = 1  # Kev requests in flight at once (llama-server slots)
    kev_timeout_ns: Nanos = 2_000_000_000  # no reply by then: "no advice", the slot is freed


def engine_config_from(settings: Any, *, symbol: str, contract: ContractConfig) -> EngineConfig:
    """The engine's config from a replay or live config (same field names, times in ms), so replay and
    live build it the same way."""
    ms = 1_000_000
    return EngineConfig(
        symbol=symbol,
        contract=contract,
        risk=settings.risk,
        quotes=settings.quotes,
        strategy=settings.strategy,
        strategy_params=dict(settings.strategy_params),
        kev_queue_max=settings.kev_queue_max,
        kev_queue_policy=settings.kev_queue_policy,
        kev_max_in_flight=settings.kev_max_in_flight,
        kev_timeout_ns=settings.kev_timeout_ms * ms,
        kev_stale_after_ns=settings.kev_stale_after_ms * ms,
        kev_advice_ttl_ns=settings.kev_advice_ttl_ms * ms,
        kev_min_interval_ns=settings.kev_min_interval_ms * ms,
    )


@dataclass
class _Order:
    client_oid: str
    side: str
    order_type: str
    px: float
    qty: float
    sent_ns: Nanos
    status: str = "pending_new"  # pending_new | live | pending_cancel | done
    filled: float = 0.0


class Engine:
    # on_trade does nothing (public trades are context; fills come from execution reports), so a
    # replay need not deliver them. Set True the day on_trade reads them: drivers then deliver all.
    uses_trades: ClassVar[bool] = False

    def __init__(
        self,
        config: EngineConfig,
        *,
        clock: Clock,
        log: EventLog,
        labeler: Labeler,
        kev: KevBackend,
        execution: ExecutionClient,
        advisor_name: str,
        laya_latency: LatencyModel | None = None,
    ) -> None:
        self.cfg = config
        self.clock = clock
        self.log = log
        self.labeler = labeler
        self.kev = kev
        self.execution = execution
        self.advisor_name = advisor_name
        self.portfolio = Portfolio()
        self.laya_latency = laya_latency or ConstantLatency(config.laya_latency_ns)
        self.queue = KevQueue(
            maxsize=config.kev_queue_max,
            stale_after_ns=config.kev_stale_after_ns,
            policy=config.kev_queue_policy,
        )
        self.book: BookSnapshot | None = None
        self.label = "HOLD"
        self.command: PortfolioCommand | None = None
        self.kill_switch = False
        self._orders: dict[str, _Order] = {}  # every order this engine sent, by client oid
        self._working: dict[str, _Order] = {}  # the subset not done yet (scanned on every decision)
        self._oid = 0
        self._request_id = 0
        self._command_id = 0
        self._kev_in_flight: dict[int, KevContext] = {}  # request id -> context, until reply or timeout
        self._last_kev_offer_ns = -(1 << 62)
        self._emergency_until = -(1 << 62)
        self._last_requote_ns = -(1 << 62)
        self._last_rebalance_ns = -(1 << 62)
        self._recent_orders: deque[Nanos] = deque()  # send times of accepted new orders, oldest first
        self._recent_tuple: tuple[Nanos, ...] | None = ()  # the same as a tuple; None: rebuild
        self._units_of: tuple[Decimal, Decimal] | None = None  # the (position, cash) _units were taken of
        self._units = (0, 0)
        self._position_dec: Decimal | None = None  # the portfolio position _position_f was converted from
        self._position_f = 0.0
        self._requote_min_ns = config.quotes.requote_min_ns  # read on every label
        self._rebalance_min_ns = config.quotes.rebalance_min_ns
        self._orders_ver = 0  # bumped whenever an order is sent, finishes or fills (risk state inputs)
        self._rs: RiskState | None = None  # the last risk state, for (book, key) below
        self._rs_book: BookSnapshot | None = None
        self._risk_lim = limits_array(config.risk)
        self._risk_rules = rule_codes(config.risk)
        # the configured strategy (engine/strategies); the replay kernel reads its kind and parameters
        self.quoter = Quoter(config.quotes, config.contract, config.strategy, config.strategy_params)
        self._rs_key: tuple[Any, ...] = ()

    # ------------------------------------------------------------ market data

    def on_book(self, book: BookSnapshot) -> None:
        label_id, probs = self.receive_book(book)
        due = book.ts_recv + self.laya_latency.sample_ns(book.ts_recv)
        self.clock.schedule(due, PRIO_LABEL, partial(self.on_label, book, label_id, probs))

    def receive_book(self, book: BookSnapshot) -> tuple[int, np.ndarray]:
        """:meth:`on_book` without scheduling the label: for a driver that delivers each label itself
        at ``book.ts_recv`` + the Laya latency it drew (replay, with the latencies drawn up front), by
        calling :meth:`on_label` at that time and priority :data:`PRIO_LABEL`."""
        self.book = book
        return self.labeler(book)

    def on_trade(self, trade: Trade) -> None:
        """Public trades reach the engine for context; fills are driven by the execution side."""

    # ------------------------------------------------------------ Laya

    def on_label(self, book: BookSnapshot, label_id: int, probs: np.ndarray, *, logged: bool = False) -> None:
        """Laya's label of ``book`` becomes visible now (its compute latency after the book).

        ``logged``: the caller has already recorded this LabelEvent (the replay keeps label events as
        columns, ``replay/label_columns.py``); the engine only acts on it.
        """
        now = self.clock.now_ns()
        name = LABEL_NAMES[label_id]
        self.label = name
        if not logged:
            p = probs.tolist()  # float32 -> the same Python floats as float(x) per element
            # LabelEvent row: ts_event, ts_recv, symbol, book_seq, book_ts_recv, label, p_hold..p_emergency
            self.log.append(
                "label",
                (book.ts_event, now, book.symbol, book.seq, book.ts_recv, name, p[0], p[1], p[2], p[3]),
            )
        if name == "EMERGENCY":
            # Pull quotes at once: EMERGENCY never waits for Kev.
            self._emergency_until = now + self.cfg.quotes.emergency_hold_ns
            self._cancel_all(book.ts_recv)
        if name != "HOLD" and now - self._last_kev_offer_ns >= self.cfg.kev_min_interval_ns:
            self._offer_kev(book, name, float(probs[label_id]), now)
        if now - self._last_requote_ns >= self._requote_min_ns:  # _requote's own rate limit
            self._requote(book.ts_recv)
        c = self.command  # _rebalance's own first checks: a live Kev command, and its rate limit
        if c is not None and now <= c.valid_until and now - self._last_rebalance_ns >= self._rebalance_min_ns:
            self._rebalance(book.ts_recv)

    # ------------------------------------------------------------ Kev

    def _offer_kev(self, book: BookSnapshot, label: str, p_label: float, now: Nanos) -> None:
        self._last_kev_offer_ns = now
        self._request_id += 1
        ctx = KevContext(
            request_id=self._request_id,
            ts_ns=now,
            symbol=book.symbol,
            label=label,
            label_seq=self.log.next_seq("label") - 1,
            p_label=round(p_label, 6),
            mid=book.mid,
            spread=round(book.ask_px[0] - book.bid_px[0], 10),
            imbalance=round(imbalance(book), 6),
            position=float(self.portfolio.position),
            max_position=self.cfg.risk.max_position,
        )
        self._queue_notes(self.queue.offer(ctx), now)
        self._kev_pump()

    def _queue_notes(self, notes: list[QueueNote], now: Nanos) -> None:
        for n in notes:  # KevQueueEvent rows
            self.log.append("kev_queue", (now, now, n.request_id, n.kind, n.depth))

    def _kev_pump(self) -> None:
        while len(self._kev_in_flight) < self.cfg.kev_max_in_flight and self._kev_start_next():
            pass

    def _kev_start_next(self) -> bool:
        now = self.clock.now_ns()
        ctx, notes = self.queue.take(now)
        self._queue_notes(notes, now)
        if ctx is None:
            return False
        self._kev_in_flight[ctx.request_id] = ctx
        self.log.append(  # KevRequest row
            "kev_request",
            (
                ctx.ts_ns,
                now,
                ctx.request_id,
                ctx.symbol,
                ctx.label,
                ctx.label_seq,
                ctx.mid,
                ctx.spread,
                ctx.imbalance,
                ctx.position,
                now - ctx.ts_ns,
            ),
        )
        self._span("kev_queue", f"kev:{ctx.request_id}", ctx.ts_ns, now)
        self.clock.schedule(now + self.cfg.kev_timeout_ns, PRIO_KEV, partial(self._on_kev_timeout, ctx, now))
        self.kev.start(ctx, now, self._on_kev_done)
        return True

    def _on_kev_timeout(self, ctx: KevContext, started_ns: Nanos) -> None:
        if self._kev_in_flight.pop(ctx.request_id, None) is None:
            return  # answered in time
        now = self.clock.now_ns()
        self._queue_notes([QueueNote(ctx.request_id, "timeout", len(self.queue))], now)
        error = f"timeout after {self.cfg.kev_timeout_ns / 1e6:.0f} ms: no advice"
        self._kev_response(
            ctx, now, error=error, failure="timeout", lag_ns=now - started_ns, key="", raw="", timings={}
        )
        self._kev_pump()

    def _kev_response(
        self,
        ctx: KevContext,
        now: Nanos,
        *,
        error: str,
        failure: str,
        lag_ns: Nanos,
        key: str,
        raw: str,
        timings: dict,
        advisor: str = "",
    ) -> None:
        """One KevResponse event; ``error`` empty means a valid command follows, else ``failure`` is its
        kind (engine/kev/failures.py); ``advisor``: who answered, when not the engine's advisor."""
        self.log.append(  # KevResponse row
            "kev_response",
            (
                now,
                now,
                ctx.request_id,
                not error,
                error,
                failure,
                lag_ns,
                advisor or self.advisor_name,
                key,
                raw,
                *timing_fields(timings),
            ),
        )

    def _on_kev_done(self, ctx: KevContext, reply: KevReply, lag_ns: Nanos) -> None:
        now = self.clock.now_ns()
        for row in breaker_rows(reply, now, ctx.request_id):  # late or not, the breaker did change
            self.log.append("kev_breaker", row)
        if self._kev_in_flight.pop(ctx.request_id, None) is None:
            # Its timeout already fired: the engine moved on without this advice.
            self._queue_notes([QueueNote(ctx.request_id, "late_reply", len(self.queue))], now)
            return
        verdict, error, failure, key, raw = reply_verdict(ctx, reply)
        self._kev_response(
            ctx,
            now,
            error=error,
            failure=failure,
            lag_ns=lag_ns,
            key=key,
            raw=raw,
            timings=reply.timings,
            advisor=reply.advisor,
        )
        self._span("kev", f"kev:{ctx.request_id}", now - lag_ns, now)
        if verdict is not None:
            self._command_id += 1
            self.command = self.log.emit(
                PortfolioCommand,
                ts_event=ctx.ts_ns,
                ts_recv=now,
                command_id=self._command_id,
                request_id=ctx.request_id,
                symbol=ctx.symbol,
                action=verdict.action,
                target_position=verdict.target_position,
                hedge_ratio=verdict.hedge_ratio,
                max_slippage_bps=verdict.max_slippage_bps,
                reason=verdict.reason,
                valid_until=now + self.cfg.kev_advice_ttl_ns,
            )
            self._rebalance(ctx.ts_ns)
        self._kev_pump()

    def _target(self, now: Nanos) -> float:
        """Kev's target while its advice is fresh; flat otherwise (a market maker's neutral)."""
        c = self.command
        if c is None:  # no advice yet: no fields to pass
            return 0.0
        flatten = c.action == "EMERGENCY_FLATTEN"
        return kev_target(True, now, c.valid_until, flatten, c.target_position, self.cfg.risk.max_position)

    # ------------------------------------------------------------ strategy

    def _requote(self, origin_ns: Nanos, *, force: bool = False) -> None:
        now = self.clock.now_ns()
        book = self.book
        if book is None or (not force and now - self._last_requote_ns < self.cfg.quotes.requote_min_ns):
            return
        self._last_requote_ns = now
        if now < self._emergency_until or self.kill_switch:
            self._cancel_all(origin_ns)
            return
        position = self._position()
        quotes = self.quoter(
            book,
            label=self.label,
            position=position,
            target=self._target(now),
            max_position=self.cfg.risk.max_position,
        )
        if not self._working:  # nothing to keep or cancel: the loop below reduces to this
            for quote in quotes:  # buy before sell, as below
                self._send_new(quote.side, "limit", quote.px, quote.qty, origin_ns)
            return
        want = {q.side: q for q in quotes}
        half_tick = self.cfg.contract.tick / 2
        for side in ("buy", "sell"):
            working = [o for o in self._working.values() if o.side == side and o.order_type == "limit"]
            q = want.get(side)
            keep = q is not None and any(abs(o.px - q.px) < half_tick for o in working)
            for o in working:
                if not keep and o.status in ("pending_new", "live"):
                    self._send_cancel(o, origin_ns)
            if q is not None and not working:
                self._send_new(side, "limit", q.px, q.qty, origin_ns)

    def _rebalance(self, origin_ns: Nanos) -> None:
        """Market orders towards Kev's target (or flat on EMERGENCY_FLATTEN), spaced and risk-checked."""
        now = self.clock.now_ns()
        c = self.command
        if c is None or now > c.valid_until or self.book is None:
            return
        if now - self._last_rebalance_ns < self.cfg.quotes.rebalance_min_ns:
            return
        k = self.cfg.contract
        code, qty = rebalance_order(
            self._target(now),
            float(self.portfolio.position),
            self.cfg.quotes.quote_qty,
            self.cfg.risk.max_order_qty,
            k.size_step,
            k.min_qty,
        )
        if code == NO_ORDER or any(o.order_type == "market" for o in self._working.values()):
            return
        self._last_rebalance_ns = now
        side = "buy" if code == BUY else "sell"
        reduce_only = c.action == "EMERGENCY_FLATTEN"
        self._send_new(
            side,
            "market",
            math.nan,
            qty,
            origin_ns,
            c.max_slippage_bps,
            reduce_only,
            source="flatten" if reduce_only else "kev",
            advice_age_ns=now - c.ts_recv,
        )

    def keep_warm(self) -> None:
        """Run the order decision path (strategy, risk state, risk rules) on the current book, results
        discarded, so the next decision finds its code and data in the CPU caches. Why: in live mode
        a decision runs every ~100 ms, cold; re-warmed, frame -> order p50 went from ~158 to ~104 us
        (bench/bench_tick_path.py --spin). Live mode calls it between frames, replay never does; it changes
        nothing a decision reads (only caches of pure functions, and drops order times that every
        later risk state drops anyway)."""
        book = self.book
        if book is None:
            return
        now = self.clock.now_ns()
        quotes = self.quoter(
            book,
            label=self.label,
            position=self._position(),
            target=self._target(now),
            max_position=self.cfg.risk.max_position,
        )
        state = self._build_risk_state(now)  # not _risk_state(): its cache stays the decision's
        symbol = self.cfg.symbol
        for q in quotes:
            check(
                self.cfg.risk,
                state,
                _intent("", symbol, "new", q.side, "limit", q.px, q.qty, False, None, "quote", -1),
                book,
                now,
            )

    def kill(self) -> None:
        """Kill switch: no new orders from now on; working orders are cancelled."""
        self.kill_switch = True
        self._cancel_all(self.clock.now_ns())

    def flatten(self) -> tuple[list[str], bool]:
        """Reduce-only market orders (``source="flatten"``, ``max_order_qty`` at most each) for the part
        of the position that working market orders on the closing side do not cover yet. They pass the
        risk gateway like any order; the kill switch lets exactly these through (they can only shrink
        the position: the gateway checks reduce-only). Returns the client oids accepted and whether one
        was refused (the order rate, a stale book: the caller may try again later)."""
        pos = self._position()
        side = "sell" if pos > 0 else "buy"
        # A plain loop: sum() of floats compensates from Python 3.12 on; the result must not depend on it.
        covered = 0.0
        for o in self._working.values():
            if o.order_type == "market" and o.side == side:
                covered += o.qty - o.filled
        left = abs(pos) - covered
        c, now, sent = self.cfg.contract, self.clock.now_ns(), []
        while len(sent) < 100:
            qty = c.round_qty(min(left, self.cfg.risk.max_order_qty))
            if qty < c.min_qty:
                return sent, False
            oid = f"dh-{self._oid + 1}"
            self._send_new(side, "market", math.nan, qty, now, None, True, source="flatten")
            if oid not in self._working:
                return sent, True
            sent.append(oid)
            left -= qty
        return sent, False

    # ------------------------------------------------------------ orders and risk

    def _risk_state(self, now: Nanos) -> RiskState:
        """The state the risk rules read. Both sides of a requote are checked against the same state
        unless the first was accepted: it is rebuilt only when time, the book, an order (sent,
        finished, filled), the portfolio or the kill switch changed."""
        pf = self.portfolio
        key = (now, self._orders_ver, self.kill_switch, pf.position, pf.cash)
        if self.book is self._rs_book and key == self._rs_key and self._rs is not None:
            return self._rs
        self._rs = state = self._build_risk_state(now)
        self._rs_book, self._rs_key = self.book, key
        return state

    def _build_risk_state(self, now: Nanos) -> RiskState:
        recent = self._recent_orders
        cutoff = now - 1_000_000_000
        if recent and recent[0] <= cutoff:
            while recent and recent[0] <= cutoff:  # appended in time order: the expired ones lead
                recent.popleft()
            self._recent_tuple = None
        if self._recent_tuple is None:
            self._recent_tuple = tuple(recent)
        buy = sell = 0.0
        for o in self._working.values():
            if o.side == "buy":
                buy += o.qty - o.filled
            elif o.side == "sell":
                sell += o.qty - o.filled
        pos_units, cash_units = self._portfolio_units()
        return _risk_state(  # position_units, open_buy_qty, open_sell_qty, cash_units, recent_order_ns, kill
            pos_units,
            buy,
            sell,
            cash_units,
            self._recent_tuple,
            self.kill_switch,
        )

    def _position(self) -> float:
        """``float(portfolio.position)``, converted again only when the position changed (Decimals
        are immutable: a new position is a new object)."""
        pos = self.portfolio.position
        if pos is not self._position_dec:
            self._position_dec, self._position_f = pos, float(pos)
        return self._position_f

    def _portfolio_units(self) -> tuple[int, int]:
        """The portfolio's (position, cash) as integers of 1e-12 (``engine.portfolio.units``), the
        loss stop's inputs, converted again only when either changed (a new Decimal is a new object)."""
        pf = self.portfolio
        old = self._units_of
        if old is None or old[0] is not pf.position or old[1] is not pf.cash:
            self._units_of, self._units = (pf.position, pf.cash), (units(pf.position), units(pf.cash))
        return self._units

    def _decide(self, intent: OrderIntent) -> bool:
        now = self.clock.now_ns()
        if intent.intent == "cancel":  # check() always allows cancels: skip building the state
            ok, reason = True, "ok"
        else:
            code = verdict_of(self._risk_lim, self._risk_rules, self._risk_state(now), intent, self.book, now)
            ok, reason = code == R_OK, REASONS[code]
        self.log.append(  # RiskDecision row
            "risk",
            (
                now,
                now,
                intent.client_oid,
                intent.symbol,
                intent.intent,
                intent.side,
                intent.order_type,
                intent.px,
                intent.qty,
                intent.source,
                intent.advice_age_ns,
                ok,
                reason,
            ),
        )
        return ok

    def _send_new(
        self,
        side: str,
        order_type: str,
        px: float,
        qty: float,
        origin_ns: Nanos,
        max_slippage_bps: float | None = None,
        reduce_only: bool = False,
        *,
        source: str = "quote",
        advice_age_ns: Nanos = -1,
    ) -> None:
        self._oid += 1
        oid = f"dh-{self._oid}"
        intent = _intent(  # OrderIntent fields in order
            oid,
            self.cfg.symbol,
            "new",
            side,
            order_type,
            px,
            qty,
            reduce_only,
            max_slippage_bps,
            source,
            advice_age_ns,
        )
        if not self._decide(intent):
            return
        now = self.clock.now_ns()
        self._recent_orders.append(now)
        self._recent_tuple = None
        self._orders_ver += 1
        self._orders[oid] = self._working[oid] = _Order(oid, side, order_type, px, qty, now)
        self._order_event(oid, "new", now, now, "")
        self._span("tick_to_order", oid, origin_ns, now)
        self.execution.submit(intent, now)

    def _send_cancel(self, order: _Order, origin_ns: Nanos) -> None:
        intent = OrderIntent(
            client_oid=order.client_oid,
            symbol=self.cfg.symbol,
            intent="cancel",
            side=order.side,
            order_type=order.order_type,
            px=order.px,
            qty=order.qty - order.filled,
            source="cancel",
        )
        if not self._decide(intent):
            return
        now = self.clock.now_ns()
        order.status = "pending_cancel"
        self._order_event(order.client_oid, "cancel", now, now, "")
        self.execution.cancel(order.client_oid, self.cfg.symbol, now)

    def _cancel_all(self, origin_ns: Nanos) -> None:
        """Cancel every working limit order (market orders are IOC: there is nothing to pull)."""
        for o in list(self._working.values()):
            if o.order_type == "limit" and o.status in ("pending_new", "live"):
                self._send_cancel(o, origin_ns)

    def _order_event(self, oid: str, kind: str, ts_event: Nanos, ts_recv: Nanos, reason: str) -> None:
        o = self._orders[oid]
        self.log.append(  # OrderEvent row
            "order",
            (ts_event, ts_recv, oid, self.cfg.symbol, kind, o.side, o.order_type, o.px, o.qty, reason),
        )

    def _span(self, name: str, ref: str, start: Nanos, end: Nanos) -> None:
        self.log.append("latency", (start, end, name, ref, start, end, end - start))  # LatencySpan row

    # ------------------------------------------------------------ execution reports

    def on_ack(self, client_oid: str, ts_event: Nanos) -> None:
        o = self._orders[client_oid]
        now = self.clock.now_ns()
        if o.status == "pending_new":
            o.status = "live"
        self._order_event(client_oid, "ack", ts_event, now, "")
        self._span("order_entry", client_oid, o.sent_ns, now)

    def _finish(self, client_oid: str) -> None:
        self._orders[client_oid].status = "done"
        self._working.pop(client_oid, None)
        self._orders_ver += 1

    def on_reject(self, client_oid: str, reason: str, ts_event: Nanos) -> None:
        self._finish(client_oid)
        self._order_event(client_oid, "reject", ts_event, self.clock.now_ns(), reason)

    def on_cancel_ack(self, client_oid: str, ts_event: Nanos) -> None:
        self._finish(client_oid)
        now = self.clock.now_ns()
        self._order_event(client_oid, "cancel_ack", ts_event, now, "")
        self._requote(now, force=True)  # the replacement quote goes out as soon as the old one is gone

    def on_done(self, client_oid: str, reason: str, ts_event: Nanos) -> None:
        """The exchange finished an order (fully filled, or an IOC remainder expired)."""
        self._finish(client_oid)
        self._order_event(client_oid, "done", ts_event, self.clock.now_ns(), reason)

    def on_fill(self, client_oid: str, px: float, qty: float, liquidity: str, ts_event: Nanos) -> None:
        o = self._orders[client_oid]
        rate = self.cfg.contract.maker_fee_rate if liquidity == "maker" else self.cfg.contract.taker_fee_rate
        notional, fee = self.portfolio.apply_fill(o.side, px, qty, rate)
        o.filled += qty
        self._orders_ver += 1
        self.log.emit(
            Fill,
            ts_event=ts_event,
            ts_recv=self.clock.now_ns(),
            client_oid=client_oid,
            symbol=self.cfg.symbol,
            side=o.side,
            px=px,
            qty=qty,
            liquidity=liquidity,
            notional=notional,
            fee=fee,
            position_after=float(self.portfolio.position),
        )


def reply_verdict(ctx: KevContext, reply: KevReply) -> tuple[CommandFields | None, str, str, str, str]:
    """``(command, error, failure, key, raw)`` of Kev's reply to ``ctx``: :func:`judge`'s verdict, the
    request key and the raw JSON text its ``kev_response`` event carries."""
    verdict, error, failure = judge(reply)
    raw = orjson.dumps(reply.raw, option=orjson.OPT_SORT_KEYS).decode() if reply.raw is not None else ""
    return verdict, error, failure, reply.key or _context_key(ctx), raw


def timing_fields(timings: dict) -> tuple[float, float, int, int]:
    """A ``kev_response``'s prompt_ms, predicted_ms, prompt_tokens and completion_tokens."""
    return (
        float(timings.get("prompt_ms", 0.0)),
        float(timings.get("predicted_ms", 0.0)),
        int(timings.get("prompt_tokens", 0)),
        int(timings.get("completion_tokens", 0)),
    )


def _context_key(ctx: KevContext) -> str:
    """Key of a request for advisors that have none of their own: the context minus ids and times."""
    return hashlib.sha256(orjson.dumps(context_body(ctx), option=orjson.OPT_SORT_KEYS)).hexdigest()
