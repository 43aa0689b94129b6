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
from collections.abc import Callable
from decimal import Decimal
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import orjson

from engine import jit
from engine import kernel as K
from engine.book import WIDTH, as_levels
from engine.clock import Clock
from engine.core_config import EngineConfig, PortfolioView
from engine.errors import DualhubError
from engine.eventlog import EventLog
from engine.events import BookSnapshot, Nanos, Trade
from engine.fastinit import frozen_maker
from engine.instruments import command_part
from engine.kev.advisor import KevContext, KevContextV2, KevReply, context_body, context_body_v2
from engine.kev.command import ACTIONS, CommandFields, CommandV2, as_v2
from engine.kev.failures import breaker_rows, judge
from engine.latency.models import ConstantLatency, LatencyModel
from engine.risk import OrderIntent
from engine.risk_codes import SOURCES
from engine.state import LABEL_NAMES, CoreState
from engine.strategies.quoter import Quoter

if TYPE_CHECKING:
    from engine.instruments import Portfolio

# Timer priorities: ties at one timestamp resolve market data (10, 20) first, then these in order.
PRIO_LABEL = 40
PRIO_KEV = 52
PRIO_EXCH_IN = 61
PRIO_EXCH_OUT = 62

Labeler = Callable[[BookSnapshot], tuple[int, np.ndarray]]
# Positional constructors (every field, declaration order): built once per order intent / risk check.
_intent = frozen_maker(OrderIntent)
KevDone = Callable[[KevContext, KevReply, Nanos], None]


class KevBackend(Protocol):
    """Runs one Kev request off the tick path and calls ``done`` when the reply is due."""

    def start(self, ctx: KevContext, now_ns: Nanos, done: KevDone) -> None: ...


class ExecutionClient(Protocol):
    """Where accepted orders go: the simulated exchange in replay, Bitget's API in live mode."""

    def submit(self, intent: OrderIntent, now_ns: Nanos) -> None: ...

    def cancel(self, client_oid: str, symbol: str, now_ns: Nanos) -> None: ...


class Engine:
    """The compiled core (its state arrays, its transitions), driven one event at a time by a caller
    that owns the clock and the venue: live mode, and the per-event replay against the simulated
    exchange. Every decision is the core's; this class only moves events in and results out: it
    hands accepted orders and cancels to the execution client, asks Kev, keeps Kev's timers on the
    clock and gives the core's rows to the event log."""

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
        portfolio: Portfolio | None = None,
        warm: bool = True,
    ) -> None:
        """``portfolio``: the instruments this one trades beside (``engine/instruments.py``): it joins
        them, sharing their id counters, output buffer and risk view. ``warm``: load every compiled
        entry now, so a live engine's first frame does not wait; a replay leaves it to the first call
        of each (its compiled loop calls none of them)."""
        self.cfg = config
        self.clock = clock
        self.log = log
        self.labeler = labeler
        self.kev = kev
        self.execution = execution
        self.advisor_name = advisor_name
        self.laya_latency = laya_latency or ConstantLatency(config.laya_latency_ns)
        # the configured strategy (engine/strategies): its kind and parameters go into the core
        self.quoter = Quoter(config.quotes, config.contract, config.strategy, config.strategy_params)
        self.book: BookSnapshot | None = None
        self.core = core = CoreState(
            config,
            log=log,
            symbol=config.symbol,
            clock=clock,
            kev=kev,
            advisor_name=advisor_name,
            advisor=None,
            strategy=(self.quoter.kind, self.quoter.params),
            fill_model=None,
            ask=True,
            out_cap=1 << 12,  # rows per stream between two hand-overs to the log
            share=portfolio.engines[0].core if portfolio and portfolio.engines else None,
        )
        self.pf = portfolio
        self.inst = 0
        if portfolio is not None:
            self.inst = portfolio.join(self)
        if self.inst == 0:
            # every reader of the log (a flush, the digest, the counts) sees the core's rows up to now
            for st in core.streams.values():
                st.before = self._hand_over
        self._before = np.zeros(8, dtype=np.int64)  # the output rows before the step (portfolio tags)
        self._draining = False
        self.levels = np.full((1, WIDTH), math.nan)  # the book a label is of
        self.b_loc = np.zeros(2, dtype=np.int64)  # [0]: its receive time; [1]: the engine's book's
        self._sent = 0  # order rows of the core's buffer already handed to the venue
        self._reason_code = {t: i for i, t in enumerate(K.REASON_TEXT) if t}
        self._kev_ctx: dict[int, KevContext] = {}  # requests asked and not answered
        self._shadow: _Shadow | None = None  # keep_warm's copy of the core (_shadow_requote)
        self._shadow_for = -1  # the requote (its S_LAST_REQUOTE) the shadow last ran after
        self._warmed_at = 0  # when _shadow_requote last looked
        self.shadow_steps = 0
        if warm:
            self._compile(core)

    def _compile(self, core: CoreState) -> None:
        """Load (or, on a fresh checkout, compile) every entry of the core now, on a scratch copy of
        the state: a live engine's first frame must not wait for the compiler."""
        c = CoreState.__new__(CoreState)
        c.__dict__.update({k: v.copy() if isinstance(v, np.ndarray) else v for k, v in vars(core).items()})
        # the buffer's record over the copies: the original's would take the scratch steps' rows into
        # the run's log (a command, an order of nobody's)
        c.out = K.Out(c.OUTI, c.OUTF, c.NOUT)
        lv, b_loc = self.levels.copy(), self.b_loc.copy()
        K.headroom(c.S, c.OI, c.RI, c.HI, c.NOUT, c.OUTI.shape[2], c.lags, c.olat, c.work, c.inflight)
        K.step_label(
            0, 0.5, c.S, c.SF, c.C, c.CF, c.OI, c.OF, c.RI, c.RF, c.heap, c.olat, c.work, c.rest, c.kq,
            c.inflight, c.recent, c.eng_book, c.x_book, b_loc, lv, c.lags, c.out, c.SCR,
        )  # fmt: skip
        K.step_report(
            K.M_ACK, 0, 0, 0.0, 0.0, 0, c.S, c.SF, c.C, c.CF, c.OI, c.OF, c.heap, c.olat, c.work,
            c.recent, c.eng_book, b_loc, c.out, c.SCR,
        )  # fmt: skip
        K.step_timer(
            K.T_KEV_TIMEOUT, 0, 0, c.S, c.SF, c.C, c.CF, c.OI, c.OF, c.RI, c.RF, c.heap, c.olat, c.work,
            c.rest, c.kq, c.inflight, c.recent, c.eng_book, c.x_book, b_loc, c.lags, c.out,
            c.SCR, c.SCRI,
        )  # fmt: skip
        K.step_kill(c.S, c.C, c.OI, c.OF, c.heap, c.olat, c.work, c.out)
        K.step_flatten(
            c.S, c.SF, c.C, c.CF, c.OI, c.OF, c.heap, c.olat, c.work, c.recent, c.eng_book, b_loc,
            c.out, c.SCR,
        )  # fmt: skip
        K.step_warm(c.S, c.SF, c.C, c.CF, c.OI, c.OF, c.work, c.recent, c.eng_book, b_loc, c.SCR)
        K.step_pull(c.S, c.C, c.OI, c.OF, c.heap, c.olat, c.work, c.out)
        K.step_command(
            1, 0, 0, 0, 0.0, 0.0, 1.0, c.S, c.SF, c.C, c.CF, c.OI, c.OF, c.heap, c.olat, c.work, c.recent,
            c.eng_book, b_loc, c.out, c.SCR,
        )  # fmt: skip
        # a hub's unit of legs and its legging hedges (engine/legs.py)
        K.step_command_part(
            1, 0, 0, 0, 0.0, 0.0, 1.0, c.S, c.SF, c.C, c.CF, c.OI, c.OF, c.heap, c.olat, c.work, c.recent,
            c.eng_book, b_loc, c.out, c.SCR,
        )  # fmt: skip
        pf = np.zeros((1, K.PF_COLS))
        K.pf_leg(pf, 0, c.S, c.SF, c.C, c.CF, c.OI, c.work)
        K.step_rebalance(
            0, c.S, c.SF, c.C, c.CF, c.OI, c.OF, c.heap, c.olat, c.work, c.recent, c.eng_book, b_loc,
            c.out, c.SCR,
        )  # fmt: skip
        K.step_hedge(
            K.BUY, 1, True, 0, c.S, c.SF, c.C, c.CF, c.OI, c.OF, c.heap, c.olat, c.work, c.recent,
            c.eng_book, b_loc, c.out, c.SCR,
        )  # fmt: skip
        K.order_fill(c.OI, 1)

    def _hand_over(self) -> None:
        """The core's buffered rows to the log (forwarded already: a step forwards before it returns)."""
        if self.pf is not None and self.inst != 0:  # one buffer: the first instrument's engine drains it
            self.pf.engines[0]._hand_over()
            return
        if self._draining:  # the log flushing what this hand-over gives it
            return
        self._draining = True
        try:
            self.core.drain()
            self._sent = 0
            self._before[:] = 0
        finally:
            self._draining = False

    # ------------------------------------------------------------ state seen from outside

    @property
    def portfolio(self) -> PortfolioView:
        S = self.core.S
        words = (
            K.position_words(S, self.core.C),
            (S[K.S_CASH_HI], S[K.S_CASH_LO]),
            (S[K.S_FEES_HI], S[K.S_FEES_LO]),
        )
        return PortfolioView(*(Decimal((int(hi) << 32) + int(lo)).scaleb(-12) for hi, lo in words))

    @property
    def kill_switch(self) -> bool:
        return bool(self.core.S[K.S_KILL])

    @property
    def open_orders(self) -> int:
        """Orders sent and not finished yet (working at the venue, or on their way)."""
        return int(self.core.S[K.S_NWORK])

    @property
    def kev_in_flight(self) -> int:
        return int(self.core.S[K.S_INFLIGHT_N])

    @property
    def kev_queued(self) -> int:
        return int(self.core.S[K.S_KQ_N])

    @property
    def label(self) -> str:
        return LABEL_NAMES[int(self.core.S[K.S_LAST_LABEL_NAME])]

    # ------------------------------------------------------------ market data

    def on_book(self, book: BookSnapshot) -> None:
        label_id, probs = self.receive_book(book)
        due = book.ts_recv + self.laya_latency.sample_ns(book.ts_recv)
        if self.clock.take_next(due, PRIO_LABEL):  # live: the label is next and due; it runs now
            self.on_label(book, label_id, probs)
        else:
            self.clock.schedule(due, PRIO_LABEL, partial(self.on_label, book, label_id, probs))

    def receive_book(self, book: BookSnapshot) -> tuple[int, np.ndarray]:
        """:meth:`on_book` without scheduling the label: for a driver that delivers each label itself
        at ``book.ts_recv`` + the Laya latency it drew (replay, with the latencies drawn up front), by
        calling :meth:`on_label` at that time and priority :data:`PRIO_LABEL`."""
        self.book = book
        S = self.core.S
        self.core.eng_book[:] = as_levels(book)
        self.b_loc[1] = book.ts_recv
        S[K.S_ENG_ROW] = 1
        S[K.S_ENG_BOOK] = 1
        if self.pf is not None:  # the others' risk rules read this instrument at its new mark
            K.pf_mark(self.pf.PF, self.inst, S, self.core.C, self.core.eng_book)
            if self.pf.pairs:
                self.pf.observe(self.inst, book.ts_recv)
        return self.labeler(book)

    def on_trade(self, trade: Trade) -> None:
        """Public trades reach the engine for context; fills are driven by the execution side. The core
        reads none (a replay's walk does not deliver them): the day it does, it reads them in both."""

    def on_label(self, book: BookSnapshot, label_id: int, probs: np.ndarray, *, logged: bool = False) -> None:
        """Laya's label of ``book`` becomes visible now (its compute latency after the book).

        ``logged``: the caller has already recorded this LabelEvent (the replay keeps label events as
        columns, ``replay/label_columns.py``); the engine only acts on it.
        """
        now = self.clock.now_ns()
        if not logged:
            p = probs.tolist()  # float32 -> the same Python floats as float(x) per element
            # LabelEvent row: ts_event, ts_recv, symbol, book_seq, book_ts_recv, label, p_hold..p_emergency
            self.log.append(
                "label",
                (book.ts_event, now, book.symbol, book.seq, book.ts_recv, LABEL_NAMES[label_id], *p),
            )
        self.levels[0] = as_levels(book)
        self.b_loc[0] = book.ts_recv
        if self.pf is not None:
            self.pf.note_label(self.inst, label_id)
        c = self._room(now)
        K.step_label(
            label_id, float(probs[label_id]), c.S, c.SF, c.C, c.CF, c.OI, c.OF, c.RI, c.RF, c.heap,
            c.olat, c.work, c.rest, c.kq, c.inflight, c.recent, c.eng_book, c.x_book, self.b_loc,
            self.levels, c.lags, c.out, c.SCR,
        )  # fmt: skip
        self._after(now)
        if label_id == K.L_EMERGENCY and self.pf is not None:
            self.pf.emergency(self)
        if self.pf is not None and c.S[K.S_UNIT_DUE]:  # its leg goes out with the others' (engine/legs.py)
            self.pf.unit(self)

    def command(
        self, cid: int, rid: int, ts_ctx: Nanos, action: int, target: float, hedge: float, slip: float
    ) -> None:
        """Kev's portfolio command ``cid``, the reply to another instrument's request ``rid``: this
        instrument's part of it (``step_command``)."""
        now = self.clock.now_ns()
        c = self._room(now)
        K.step_command(
            cid, rid, ts_ctx, action, target, hedge, slip, c.S, c.SF, c.C, c.CF, c.OI, c.OF, c.heap,
            c.olat, c.work, c.recent, c.eng_book, self.b_loc, c.out, c.SCR,
        )  # fmt: skip
        self._after(now)

    def step(self, fn: Any) -> Any:
        """``fn(core, b_loc)`` as a step of this instrument now (a portfolio's unit of legs and its
        hedges, engine/legs.py): its result."""
        now = self.clock.now_ns()
        c = self._room(now)
        out = fn(c, self.b_loc)
        self._after(now)
        return out

    def pull(self) -> None:
        """EMERGENCY on another instrument of the portfolio: pull the quotes here too (``step_pull``)."""
        now = self.clock.now_ns()
        c = self._room(now)
        K.step_pull(c.S, c.C, c.OI, c.OF, c.heap, c.olat, c.work, c.out)
        self._after(now)

    # ------------------------------------------------------------ operator

    def kill(self) -> None:
        """Kill switch: no new orders from now on; working orders are cancelled."""
        now = self.clock.now_ns()
        c = self._room(now)
        K.step_kill(c.S, c.C, c.OI, c.OF, c.heap, c.olat, c.work, c.out)
        self._after(now)

    def flatten(self) -> tuple[list[str], bool]:
        """Reduce-only market orders for the position (the core's ``step_flatten``). Returns the client
        oids accepted and whether one was refused (the order rate, a stale book: the caller may try
        again later)."""
        now = self.clock.now_ns()
        c = self._room(now)
        while int(c.S[K.S_NWORK]) + 128 > c.work.shape[0] // 3:  # room for 100 orders at once
            c._grow_work()
        n, refused = K.step_flatten(
            c.S, c.SF, c.C, c.CF, c.OI, c.OF, c.heap, c.olat, c.work, c.recent, c.eng_book,
            self.b_loc, c.out, c.SCR,
        )  # fmt: skip
        sent = self._after(now)
        assert len(sent) == n
        return [f"dh-{oid}" for oid in sent], bool(refused)

    def keep_warm(self) -> int:
        """Run the order decision path on the current book, results discarded (the core's
        ``step_warm``), and build the venue's intent of the latest order again (the Python that hands
        an order over runs several times slower cold than warm), so the next decision
        finds its code and data in the CPU caches: in live mode a decision runs every ~100 ms, cold.
        Live mode calls it between frames, replay never does. Returns the risk checks it ran."""
        c = self.core
        c.S[K.S_NOW] = self.clock.now_ns()
        checks = int(
            K.step_warm(c.S, c.SF, c.C, c.CF, c.OI, c.OF, c.work, c.recent, c.eng_book, self.b_loc, c.SCR)
        )
        oid = int(c.S[K.S_OID])
        if oid > 0:
            self._intent(oid)  # discarded: building it changes nothing
        self._shadow_requote()
        return checks

    def _shadow_requote(self) -> None:
        """A requote that replaces the working quotes, on a shadow of the core, once per requote
        window, shortly before it opens (or after the frame before it, when frames are farther apart
        than that). Why: the compiled code that sends and cancels orders (step_warm runs only the
        strategy and the rules) runs at most once a requote window in live mode, and cold it runs
        from memory. Run on every frame, a shadow would evict the Python path's working set on every
        frame, the ordering one included; run :data:`SHADOW_LEAD_NS` before the window opens, its code
        is still in the last-level cache when the window's first label orders, and the frames between
        re-warm the Python path (bench/bench_tick_stages.py, bench/HISTORY.md).
        The shadow has arrays of its own: what it decides goes nowhere. It takes the small state whole
        and, of the order table, the working orders' rows and the next ids'."""
        c = self.core
        S = c.S
        if not S[K.S_ENG_BOOK] or S[K.S_HEAP_N]:  # no book yet; a heap's timers are the replay loop's
            return
        # before the window opens: within the lead, or within the time since the last keep-warm (frames
        # far apart: the next frame may be the window's first)
        now, since = self.clock.now_ns(), self._warmed_at
        self._warmed_at = now
        last = int(S[K.S_LAST_REQUOTE])
        lead = max(SHADOW_LEAD_NS, now - since)
        if last == self._shadow_for or now + lead < last + int(c.C[K.C_REQUOTE_MIN]):
            return
        self._shadow_for = last
        sh = self._shadow
        if sh is None or any(getattr(sh, k).shape != getattr(c, k).shape for k in _Shadow.SHAPED):
            sh = self._shadow = _Shadow(c)  # the core grew a table
        for name in _Shadow.WHOLE:
            np.copyto(getattr(sh, name), getattr(c, name))
        np.copyto(sh.levels, self.levels)
        np.copyto(sh.b_loc, self.b_loc)
        mask = c.OI.shape[0] - 1
        n = int(S[K.S_NWORK])
        rows = sh.rows
        rows[:n] = c.work[:n]
        rows[n : n + 4] = np.arange(int(S[K.S_OID]) + 1, int(S[K.S_OID]) + 5)
        rows &= mask
        r = rows[: n + 4]
        sh.OI[r] = c.OI[r]
        sh.OF[r] = c.OF[r]
        sh.OI[r[:n], K.OI_PX] += 3  # the working quotes are off: the requote cancels and replaces them
        sh.NOUT[:] = 0
        T = sh.S
        T[K.S_NOW] = now
        T[K.S_LAST_REQUOTE] = now - sh.C[K.C_REQUOTE_MIN] - 1  # a requote is due
        K.step_label(
            K.L_HOLD, 1.0, T, sh.SF, sh.C, sh.CF, sh.OI, sh.OF, sh.RI, sh.RF, sh.heap, sh.olat,
            sh.work, sh.rest, sh.kq, sh.inflight, sh.recent, sh.eng_book, sh.x_book, sh.b_loc, sh.levels,
            sh.lags, sh.out, sh.SCR,
        )  # fmt: skip
        self.shadow_steps += 1

    # ------------------------------------------------------------ execution reports

    def on_ack(self, client_oid: str, ts_event: Nanos) -> None:
        self._report(K.M_ACK, client_oid, 0, 0.0, 0.0, ts_event)

    def on_reject(self, client_oid: str, reason: str, ts_event: Nanos) -> None:
        self._report(K.M_REJECT, client_oid, self._reason(reason), 0.0, 0.0, ts_event)

    def on_cancel_ack(self, client_oid: str, ts_event: Nanos) -> None:
        self._report(K.M_CANCEL_ACK, client_oid, 0, 0.0, 0.0, ts_event)

    def on_done(self, client_oid: str, reason: str, ts_event: Nanos) -> None:
        """The exchange finished an order (fully filled, or an IOC remainder expired)."""
        self._report(K.M_DONE, client_oid, self._reason(reason), 0.0, 0.0, ts_event)

    def on_fill(self, client_oid: str, px: float, qty: float, liquidity: str, ts_event: Nanos) -> None:
        liq = K.LIQ_MAKER if liquidity == "maker" else K.LIQ_TAKER
        self._report(K.M_FILL, client_oid, liq, px, qty, ts_event)

    def _reason(self, text: str) -> int:
        """A venue's reason text as a code of the order stream (texts the core does not name get
        codes of their own, in the order they first come)."""
        code = self._reason_code.get(text)
        if code is None:
            code = self._reason_code[text] = len(self.core.reason_texts)
            self.core.reason_texts.append(text)
        return code

    def _report(self, m: int, client_oid: str, arg: int, px: float, qty: float, ts_event: Nanos) -> None:
        oid = int(client_oid[3:]) if client_oid.startswith("dh-") and client_oid[3:].isdigit() else 0
        c = self.core
        if not 0 < oid <= int(c.S[K.S_OID]) or c.OI[oid & (c.OI.shape[0] - 1), K.OI_OID] != oid:
            raise KeyError(client_oid)  # not an order of this engine
        now = self.clock.now_ns()
        c = self._room(now)
        K.step_report(
            m, oid, arg, px, qty, ts_event, c.S, c.SF, c.C, c.CF, c.OI, c.OF, c.heap, c.olat, c.work,
            c.recent, c.eng_book, self.b_loc, c.out, c.SCR,
        )  # fmt: skip
        self._after(now)

    # ------------------------------------------------------------ Kev

    def _on_kev_timeout(self, rid: int, started_ns: Nanos) -> None:
        self._kev_ctx.pop(rid, None)
        self._timer(K.T_KEV_TIMEOUT, rid, started_ns)

    def _on_kev_done(self, ctx: KevContext, reply: KevReply, lag_ns: Nanos) -> None:
        now = self.clock.now_ns()
        for row in breaker_rows(reply, now, ctx.request_id):  # late or not, the breaker did change
            self.log.append("kev_breaker", row)
        rid = ctx.request_id
        hub: CommandV2 | None = None  # a portfolio command: the other instruments' parts follow
        if self._kev_ctx.pop(rid, None) is not None:  # in flight: its verdict goes into its row
            c = self.core
            verdict, error, failure, key, raw = reply_verdict(ctx, reply)
            i = rid & (c.RI.shape[0] - 1)
            reason = ""
            if isinstance(verdict, CommandV2):
                assert self.pf is not None
                hub = verdict
                c.RI[i, K.RI_ACTION], c.RF[i, K.RF_TARGET], c.RF[i, K.RF_HEDGE], c.RF[i, K.RF_SLIP] = (
                    command_part(verdict, self.cfg.symbol)
                )
                reason = verdict.reason
            elif verdict is not None:
                c.RI[i, K.RI_ACTION] = ACTIONS.index(verdict.action)
                c.RF[i, K.RF_TARGET] = verdict.target_position
                c.RF[i, K.RF_HEDGE] = verdict.hedge_ratio
                c.RF[i, K.RF_SLIP] = verdict.max_slippage_bps
                reason = verdict.reason
            c.RI[i, K.RI_OK] = verdict is not None
            advisor = reply.advisor or self.advisor_name
            c._replies[rid] = (error, failure, advisor, key, raw, *timing_fields(reply.timings), reason)
        self._timer(K.T_KEV_DONE, rid, lag_ns)  # a late one: the core notes it, nothing more
        if hub is not None and self.pf is not None:
            self.pf.fan_out(self, hub, int(self.core.S[K.S_CMD_ID]), rid, ctx.ts_ns)

    def _timer(self, kind: int, a: int, b: int) -> None:
        now = self.clock.now_ns()
        c = self._room(now)
        K.step_timer(
            kind, a, b, c.S, c.SF, c.C, c.CF, c.OI, c.OF, c.RI, c.RF, c.heap, c.olat, c.work, c.rest,
            c.kq, c.inflight, c.recent, c.eng_book, c.x_book, self.b_loc, c.lags, c.out,
            c.SCR, c.SCRI,
        )  # fmt: skip
        self._after(now)

    # ------------------------------------------------------------ around each step

    def _room(self, now: Nanos) -> Any:
        """The core, with room for one step at ``now`` (output rows, order and request rows)."""
        c = self.core
        pf = self.pf
        if pf is not None:  # the portfolio's counters first: the room asked for depends on them
            K.pf_enter(pf.PI, pf.PF, self.inst, c.S, c.SF)
        while True:
            st = int(
                K.headroom(c.S, c.OI, c.RI, c.HI, c.NOUT, c.OUTI.shape[2], c.lags, c.olat, c.work, c.inflight)
            )
            if st == K.ST_DONE:
                break
            self._hand_over()  # first: growth may drain, and forwarding counts rows of the buffer
            if st != K.ST_OUT_FULL:
                c.grow(st)
        c.S[K.S_NOW] = now
        NOUT = c.NOUT
        self._sent = int(NOUT[K.O_ORDER])  # the rows before are other steps' (handed on already)
        if pf is not None:
            self._before[:] = NOUT
        return c

    def _after(self, now: Nanos) -> list[int]:
        """What the step decided that leaves the core: orders and cancels to the venue, Kev requests to
        Kev (each with its timeout on the clock). Returns the new orders' ids."""
        c = self.core
        S = c.S
        why = int(S[K.S_WHY])
        if why != K.U_NONE:
            raise DualhubError(f"the engine cannot go on: {K.UNSUPPORTED_TEXT[why]}")
        pf = self.pf
        if pf is not None:
            K.tag_rows(c.OUTI, c.NOUT, self._before, self.inst)
            K.pf_leave(pf.PI, pf.PF, self.inst, S, c.C, c.eng_book)
        sent: list[int] = []
        n = int(c.NOUT[K.O_ORDER])
        if n > self._sent:
            OUTI, symbol = c.OUTI, self.cfg.symbol
            for k in range(self._sent, n):
                kind = int(OUTI[K.O_ORDER, 3, k])
                oid = int(OUTI[K.O_ORDER, 2, k])
                if kind == K.OK_NEW:
                    sent.append(oid)
                    self.execution.submit(self._intent(oid), now)
                elif kind == K.OK_CANCEL:
                    self.execution.cancel(f"dh-{oid}", symbol, now)
            self._sent = n
        if S[K.S_KEV_ASKED]:
            self._ask_kev(now)
        return sent

    def _intent(self, oid: int) -> OrderIntent:
        """The accepted order ``oid`` as the venue gets it."""
        c = self.core
        r = oid & (c.OI.shape[0] - 1)
        oi, of = c.OI[r], c.OF[r]
        slip = float(of[K.OF_SLIP])
        return _intent(  # OrderIntent fields in order
            f"dh-{oid}",
            self.cfg.symbol,
            "new",
            "buy" if oi[K.OI_SIDE] == K.BUY else "sell",
            "limit" if oi[K.OI_TYPE] == K.LIMIT else "market",
            K.price_of(oi[K.OI_PX], c.C),
            K.size_of(oi[K.OI_LOTS], c.C),
            bool(oi[K.OI_REDUCE]),
            None if math.isnan(slip) else slip,
            SOURCES[int(oi[K.OI_SOURCE])],
            int(oi[K.OI_AGE]),
        )

    def _ask_kev(self, now: Nanos) -> None:
        """The requests the step started, in the order it started them: each gets its timeout on the
        clock, then goes to Kev, as the core's replay loop orders them."""
        c = self.core
        RI = c.RI
        mask = RI.shape[0] - 1
        for rid in c.inflight[: int(c.S[K.S_INFLIGHT_N])].tolist():
            if RI[rid & mask, K.RI_OK] != -1:
                continue
            RI[rid & mask, K.RI_OK] = 0  # asked; its verdict is written when the reply comes
            ctx = self.pf.context(self, rid) if self.pf is not None and self.pf.hub else c._context(rid)
            self._kev_ctx[rid] = ctx
            self.clock.schedule(
                now + self.cfg.kev_timeout_ns, PRIO_KEV, partial(self._on_kev_timeout, rid, now)
            )
            self.kev.start(ctx, now, self._on_kev_done)
        c.S[K.S_KEV_ASKED] = 0


# how long before a requote window opens keep-warm runs the order path on the core's shadow
SHADOW_LEAD_NS = 20_000_000


class _Shadow:
    """Arrays shaped as a core's, for :meth:`Engine._shadow_requote`: the small ones are copied whole
    before each shadow step, the order table row by row; Kev's tables and the heap are never read by
    a requote on HOLD, and its output goes to buffers of its own."""

    WHOLE = ("S", "SF", "C", "CF", "olat", "work", "rest", "kq", "inflight", "recent", "eng_book", "x_book")
    SHAPED = (*WHOLE, "OI", "OF")

    def __init__(self, c: Any) -> None:
        for name in (*self.WHOLE, "OI", "OF", "RI", "RF", "HI", "HF", "lags", "SCR"):
            setattr(self, name, getattr(c, name).copy())
        self.levels = np.full((1, WIDTH), math.nan)
        self.b_loc = np.zeros(2, dtype=np.int64)
        self.rows = np.zeros(len(c.work) + 4, dtype=np.int64)
        self.OUTI = np.zeros((8, K.OUT_MAXI, 256), dtype=np.int64)  # one step's rows, many times over
        self.OUTF = np.zeros((8, K.OUT_MAXF, 256))
        self.NOUT = np.zeros(8, dtype=np.int64)
        self.out = K.Out(self.OUTI, self.OUTF, self.NOUT)
        self.heap = K.Heap(self.HI, self.HF)


def engine_identity() -> dict[str, str]:
    """What a run's runtime.json names as its engine: the decision core, and the hash of every source
    file compiled into it (``engine.jit.core_stamp``). A replay, on its compiled loop or per event, and
    a live run of the same code name the same one."""
    return {"engine": "engine/kernel", "engine_sha256": jit.core_stamp()}


def reply_verdict(
    ctx: KevContext | KevContextV2, reply: KevReply
) -> tuple[CommandFields | CommandV2 | None, str, str, str, str]:
    """``(command, error, failure, key, raw)`` of Kev's reply to ``ctx``: :func:`judge`'s verdict, the
    request key and the raw JSON text its ``kev_response`` event carries. A portfolio's context takes
    a v2 command over its instruments (judged for sense against them too), or a v1 one for the
    instrument that asked."""
    if isinstance(ctx, KevContextV2):
        verdict, error, failure = judge(reply, ctx.symbols, ctx.pair_keys, ctx.instruments)
        if isinstance(verdict, CommandFields):
            verdict = as_v2(verdict, ctx.symbol)
    else:
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


def _context_key(ctx: KevContext | KevContextV2) -> str:
    """Key of a request for advisors that have none of their own: the context minus ids and times."""
    body = context_body_v2(ctx) if isinstance(ctx, KevContextV2) else context_body(ctx)
    return hashlib.sha256(orjson.dumps(body, option=orjson.OPT_SORT_KEYS)).hexdigest()
