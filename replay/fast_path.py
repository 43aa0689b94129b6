"""Drive :mod:`replay.kernel` over a replay's walk and hand its events to the event log.

Every replay runs here. :func:`refuse` names, before the run, what the loop's tables cannot hold (a
latency model it cannot draw ahead, a recorded delay below zero): the run stops with that line instead.
:func:`run_kernel` runs it. The kernel's rows become the same Arrow tables, flush points and files the
per-event engine's rows give (live's, and ``run_replay(kernel=False)``'s): streams are written in row
groups of the log's ``flush_rows`` whatever produced them, and the digest is per stream.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from engine.core import Engine, EngineConfig, reply_verdict, timing_fields
from engine.errors import DualhubError
from engine.eventlog import EventLog
from engine.fastinit import frozen_maker
from engine.instruments import Portfolio, command_part, fan_out_parts, hub_context
from engine.kev.advisor import KevContext, KevContextV2
from engine.kev.command import ACTIONS, CommandV2
from engine.kev.failures import breaker_rows
from engine.kev.rules import RuleKev
from engine.kev.sim import SimKevBackend
from engine.latency.batch import RecordedTable, recorded_table, sample_many
from engine.latency.models import LatencyModel, ScaledLatency
from engine.state import CoreState
from replay import kernel as K
from replay.walk import StreamedWalk, readonly
from venue.fills import FILL_MODELS


class LookAheadError(RuntimeError):
    """A component asked for data it could not have seen yet (``ts_recv > now``)."""


_kev_context = frozen_maker(KevContext)


FILL_MODEL_CODES = {name: (m.kind, m.n) for name, m in ((k, make()) for k, make in FILL_MODELS.items())}
WALK_CHUNK = 1 << 16  # walk entries per kernel call (the book levels it needs are made per call)
OUT_CAP = 1 << 15  # rows per output stream between two drains
INITIAL_ROWS = 4096  # first size of the order ring, request and timer tables (they double as needed)
LAG_BATCH = 4096  # Kev lags drawn at a time
LATENCY_BATCH = 1 << 14  # order latencies held per model (more than K.MARGIN: one step's draws fit)
# The rule advisor decides inside the kernel; False: it answers from Python at a Kev stop, as every
# other advisor does (a test of those stops against the compiled rule).
RULES_COMPILED = True


def _stream(model: LatencyModel) -> Any:
    """The generator a batch-drawable model draws from (None for a constant one)."""
    while type(model) is ScaledLatency:
        model = model.inner
    return getattr(model, "_rng", None)


def _keyed_row(table: RecordedTable | None) -> np.ndarray | None:
    """A recorded model's table as the kernel's olat row (kernel.KEY_*), None for a drawn model."""
    if table is None:
        return None
    n, head = len(table.keys), K.KEY_HEAD
    row = np.empty(head + 3 * n + len(table.dur_ns), dtype=np.int64)
    row[K.KEY_N], row[K.KEY_FALLBACK], row[K.KEY_MISSES] = n, table.fallback_ns, 0
    row[head : head + n] = table.keys
    ends = head + 3 * n + np.cumsum(table.counts)
    row[head + n : head + 2 * n] = ends - table.counts  # each key's next duration: its first
    row[head + 2 * n : head + 3 * n] = ends
    row[head + 3 * n :] = table.dur_ns
    return row


def refuse(engine: Engine, exchange: Any) -> None:
    """Refuse, before the run, what the loop cannot take: order latencies it cannot draw ahead (drawn
    in batches, or looked up in a recorded table), two of them sharing one random stream (their draws
    would depend on how they interleave), or a recorded delay below zero (the clock cannot go back).
    The Kev lag model is one of the replay's own (drawn in batches, or recorded in a cassette)."""
    assert (
        type(engine.kev) is SimKevBackend and sample_many(engine.kev.lag, np.zeros(0, np.int64)) is not None
    )
    streams: list[Any] = []
    for name, m in (
        ("order entry", exchange.entry_latency),
        ("order response", exchange.response_latency),
        ("cancel", exchange.cancel_latency),
    ):
        table = recorded_table(m)
        if table is not None:  # looked up by key as it is drawn
            if table.fallback_ns < 0 or bool((table.dur_ns < 0).any()):
                raise DualhubError(
                    f"the recorded {name} latencies hold a delay below zero (the clock cannot go back)"
                )
            continue
        if sample_many(m, np.zeros(0, dtype=np.int64)) is None:
            raise DualhubError(
                f"the {name} latency model {type(m).__name__} cannot be drawn ahead: replay takes "
                "const, lognormal, empirical and recorded latencies"
            )
        rng = _stream(m)
        if rng is not None and any(rng is r for r in streams):
            raise DualhubError(f"the {name} latency draws from another order latency's random stream")
        streams.append(rng)


class KernelRun(CoreState):
    """The core's state for the replay's compiled loop: the simulated exchange's in it, the Kev lags
    and order latencies drawn ahead, and the loop's stops."""

    @classmethod
    def for_replay(
        cls,
        cfg: Any,
        engine: Engine,
        exchange: Any,
        advisor: Any,
        log: EventLog,
        symbol: str,
        share: KernelRun | None = None,
    ) -> KernelRun:
        """The state of a replay's compiled loop, its simulated venue included; ``share``: the first
        instrument's of a portfolio (one output buffer)."""
        assert isinstance(engine.kev, SimKevBackend)
        return cls(
            engine.cfg,
            log=log,
            symbol=symbol,
            clock=engine.clock,
            kev=engine.kev,
            advisor_name=engine.advisor_name,
            advisor=advisor,
            strategy=(engine.quoter.kind, engine.quoter.params),
            fill_model=cfg.fill_model,
            # rows K.OLAT_ENTRY, K.OLAT_RESPONSE, K.OLAT_CANCEL (refuse() checked each draws in a batch)
            olat_models=(exchange.entry_latency, exchange.response_latency, exchange.cancel_latency),
            # Python answers each request at a Kev stop unless the kernel has the advisor compiled.
            ask=not (RULES_COMPILED and type(advisor) is RuleKev),
            share=share,
        )

    def __init__(
        self,
        e: EngineConfig,
        *,
        olat_models: tuple[LatencyModel, LatencyModel, LatencyModel],
        fill_model: str,
        **kw: Any,
    ) -> None:
        super().__init__(e, fill_model=FILL_MODEL_CODES[fill_model], rows=INITIAL_ROWS, out_cap=OUT_CAP, **kw)
        C = self.C
        # rows K.OLAT_ENTRY, K.OLAT_RESPONSE, K.OLAT_CANCEL (refuse() checked each draws in a batch
        # or is a recorded table, which the kernel looks each draw up in)
        self.olat_models = olat_models
        self.olat_keyed = [_keyed_row(recorded_table(m)) for m in olat_models]
        for k, row in enumerate(self.olat_keyed):
            C[K.C_OLAT_KEYED + k] = row is not None
        self.olat = np.zeros((3, 0), dtype=np.int64)
        self.S[K.S_LAG_N] = 0
        # kev_breaker rows by their reply timer's (due, seq): the order the timers fire in
        self.breaker: list[tuple[int, int, list[tuple[Any, ...]]]] = []
        self.hub: PortfolioRun | None = None  # Kev as a portfolio's hub: its contexts and commands

    # ------------------------------------------------------------ growth

    def _more_lags(self) -> None:
        used = int(self.S[K.S_LAG_USED])
        left = self.lags[used:]
        drawn = sample_many(self.lag_model, np.zeros(LAG_BATCH, dtype=np.int64))
        assert drawn is not None
        self.lags = np.concatenate([left, drawn])
        self.S[K.S_LAG_USED] = 0
        self.S[K.S_LAG_N] = len(self.lags)

    def _more_latencies(self) -> None:
        """Each order latency model's unused draws, then new ones, LATENCY_BATCH a model; a recorded
        model's table as the kernel left it (its draws never use the row up)."""
        width = max(LATENCY_BATCH, K.MARGIN + 1, *(len(r) for r in self.olat_keyed if r is not None))
        olat = np.zeros((3, width), dtype=np.int64)
        for k, model in enumerate(self.olat_models):
            keyed = self.olat_keyed[k]
            if keyed is not None:
                olat[k, : len(keyed)] = self.olat[k, : len(keyed)] if self.olat.shape[1] else keyed
                continue
            left = self.olat[k, int(self.S[K.S_OLAT_USED + k]) :]
            olat[k, : len(left)] = left
            drawn = sample_many(model, np.zeros(width - len(left), dtype=np.int64))
            assert drawn is not None
            olat[k, len(left) :] = drawn
            self.S[K.S_OLAT_USED + k] = 0
        self.olat = olat

    def _model_lag(self, now_ns: int) -> int:
        """The next Kev lag of the lag model, from the ones drawn ahead (the kernel keeps a table of
        requests in flight's worth)."""
        used = int(self.S[K.S_LAG_USED])
        self.S[K.S_LAG_USED] = used + 1
        return int(self.lags[used])

    def _answer_kev(self) -> None:
        """The requests the last step started, in the order it started them: the advisor answers each
        as SimKevBackend.start would, the verdict goes into its row and its reply is scheduled."""
        S, RI, RF = self.S, self.RI, self.RF
        mask = RI.shape[0] - 1
        asked = [r for r in self.inflight[: int(S[K.S_INFLIGHT_N])].tolist() if RI[r & mask, K.RI_OK] == -1]
        assert len(asked) == int(S[K.S_KEV_ASKED]), (asked, int(S[K.S_KEV_ASKED]))
        for rid in asked:
            i = rid & mask
            now = int(RI[i, K.RI_STARTED])
            self.clock.t_ns = now  # a circuit breaker reads the replay clock
            ctx = self._context(rid) if self.hub is None else self.hub.context(self, rid)
            reply, lag = self.kev.answer(ctx, now, self._model_lag)
            if lag < 0:
                raise DualhubError(f"the replay cannot go on: a Kev reply due {-lag} ns before its request")
            verdict, error, failure, key, raw = reply_verdict(ctx, reply)
            reason = ""
            if isinstance(verdict, CommandV2):  # the hub's: this instrument's part, the others' later
                assert self.hub is not None
                RI[i, K.RI_ACTION], RF[i, K.RF_TARGET], RF[i, K.RF_HEDGE], RF[i, K.RF_SLIP] = (
                    self.hub.command(self, rid, verdict)
                )
                reason = verdict.reason
            elif verdict is not None:
                RI[i, K.RI_ACTION] = ACTIONS.index(verdict.action)
                RF[i, K.RF_TARGET] = verdict.target_position
                RF[i, K.RF_HEDGE] = verdict.hedge_ratio
                RF[i, K.RF_SLIP] = verdict.max_slippage_bps
                reason = verdict.reason
            RI[i, K.RI_OK] = verdict is not None
            advisor = reply.advisor or self.advisor_name
            self._replies[rid] = (error, failure, advisor, key, raw, *timing_fields(reply.timings), reason)
            if reply.breaker:
                rows = breaker_rows(reply, now + lag, rid)
                self.breaker.append((now + lag, int(RI[i, K.RI_DONE_SEQ]), rows))
            K.kev_replied(S, self.heap, self.OI, RI, rid, lag)

    def breaker_rows(self) -> list[tuple[Any, ...]]:
        """The run's kev_breaker rows, in the order the engine logs them (when each reply arrives)."""
        return [row for _, _, rows in sorted(self.breaker, key=lambda b: b[:2]) for row in rows]

    def core(self) -> tuple[np.ndarray, ...]:
        """This core's arrays as the loop takes them (one of ``CORES`` in replay/kernel.py), made anew
        for each call of the loop: a stop may have replaced any of them (a table grew, latencies were
        drawn)."""
        return (*self.state(), self.olat)

    def handle(self, status: int) -> bool:
        """Deal with a kernel stop; True when the kernel should be called again."""
        if status == K.ST_NEED_KEV:  # no drain: the rows stay buffered, the kernel goes on
            self._answer_kev()
            return True
        self.drain()
        if status == K.ST_DONE:
            return False
        if status in (K.ST_GROW_ORDERS, K.ST_GROW_HEAP, K.ST_GROW_REQUESTS, K.ST_GROW_WORK):
            self.grow(status)
        elif status == K.ST_NEED_LAGS:
            self._more_lags()
        elif status == K.ST_NEED_LATENCIES:
            self._more_latencies()
        elif status == K.ST_UNSUPPORTED:
            if int(self.S[K.S_WHY]) == K.U_LOOK_AHEAD:
                raise LookAheadError(K.UNSUPPORTED_TEXT[K.U_LOOK_AHEAD])
            raise DualhubError(f"the replay cannot go on: {K.UNSUPPORTED_TEXT[int(self.S[K.S_WHY])]}")
        return True

    # ------------------------------------------------------------ output


def run_kernel(
    run: KernelRun,
    walk: StreamedWalk,
    book_levels: Callable[[int, int], np.ndarray],
    b_loc: np.ndarray,
    labels: np.ndarray,
    probs: np.ndarray,
    trades: tuple[np.ndarray, np.ndarray, np.ndarray],
    add_labels: Callable[[np.ndarray, np.ndarray], None],
    bar: Any = None,
    between: Callable[[], None] | None = None,
) -> None:
    """The whole walk, a chunk at a time, then the timers left at its end. ``book_levels(r0, r1)``:
    rows r0..r1-1 of the tape as a (rows x 60) float64 array (bid_px, bid_sz, ask_px, ask_sz).
    ``between`` runs before each chunk is merged (a streamed tape fills rows ahead, releases behind)."""
    # The portfolio loop with one instrument (its steps around each instrument's are no-ops then): one
    # compiled loop for every replay. ``solo`` holds what it reads of a portfolio; its place in the walk
    # is solo.PI[PI_WALK].
    solo = Portfolio([run.symbol])
    PI = solo.PI
    hub = hub_arrays(solo)
    BL, LB, PR, TPX, TSZ, TSD = (b_loc,), (labels,), (probs,), *((t,) for t in trades)
    scratch = K.pf_scratch(1, len(run.NOUT))
    inst = np.zeros(0, dtype=np.int64)
    done = 0
    if bar is not None:  # a slow Kev (a real LLM) moves the bar per answer, not only per walk chunk
        run.kev.on_answer = lambda: bar.update(done + int(PI[K.PI_WALK]), run.kev.answers)
    while True:
        if between is not None:
            between()
        chunk = walk.next_chunk()
        if chunk is None:
            break
        ts, prio, kind, row = chunk
        n = len(ts)
        if bar is not None:
            bar.update(done)
        if len(inst) < n:
            inst = np.zeros(n, dtype=np.int64)
        books = row[kind != 1]
        r0, r1 = (int(books.min()), int(books.max()) + 1) if len(books) else (0, 0)
        levels = book_levels(r0, r1) if r1 > r0 else np.zeros((0, 60))
        L0 = np.array([r0], dtype=np.int64)
        PI[K.PI_WALK] = 0
        while True:
            before = int(PI[K.PI_WALK])
            status = K.run_pf(
                ts, prio, kind, row, inst[:n], n, (levels,), L0, BL, LB, PR, TPX, TSZ, TSD, run.lags,
                (run.core(),), PI, solo.PF, *hub, run.out, OUT_CAP,
                *scratch,
            )  # fmt: skip
            after = int(PI[K.PI_WALK])
            if after > before:
                m = kind[before:after] == 4
                if m.any():
                    add_labels(row[before:after][m], ts[before:after][m])
            if not run.handle(int(status)):
                break
        done += n
    PI[K.PI_WALK] = 0  # the walk is over: the bar's position is `done`
    while True:
        status = K.run_all_pf(
            (run.core(),), PI, solo.PF, BL, run.lags, run.out, OUT_CAP,
            *scratch,
        )  # fmt: skip
        if not run.handle(int(status)):
            break
    for row in run.breaker_rows():
        run.log.append("kev_breaker", row)


class PortfolioRun:
    """The compiled loop's state for a portfolio: a :class:`KernelRun` per instrument, sharing one
    output buffer (built with ``share=`` the first), the portfolio's shared arrays (``state``: counters,
    risk view, the hub's pair fits and latest labels, engine/instruments.py), and Kev's lags (one Kev
    draws every instrument's in the order they ask)."""

    def __init__(self, runs: list[KernelRun], state: Portfolio | None = None) -> None:
        self.runs = runs
        self.state = state if state is not None else Portfolio([r.symbol for r in runs])
        self.PI, self.PF = self.state.PI, self.state.PF
        self.lags = np.zeros(0, dtype=np.int64)
        for r in runs:
            r.lags = self.lags
            if self.state.hub:
                r.hub = self
                r.S[K.S_UNIT] = 1  # the hub's commands go out as units (engine/legs.py)
        # Recorded order latencies (a live portfolio's): one table of each kind for every instrument,
        # looked up in the order the instruments draw, as the per-event engines share the model. The
        # loop's cores then share one olat array (refuse_portfolio refuses recorded and drawn
        # order latencies together).
        self.shared_olat = len(runs) > 1 and all(row is not None for r in runs for row in r.olat_keyed)
        self.b_loc: list[np.ndarray] = []  # each instrument's books' receive times (the loop's BL)
        # the hub's commands by (instrument, request) until their replies reach the one that asked
        self._commands: dict[tuple[int, int], CommandV2] = {}

    # ------------------------------------------------------------ Kev as the hub

    def context(self, run: KernelRun, rid: int) -> KevContextV2:
        return hub_context(self.state, self.runs, self.runs.index(run), rid)

    def command(self, run: KernelRun, rid: int, cmd: CommandV2) -> tuple[int, float, float, float]:
        """The hub's command ``cmd``, the reply to ``run``'s request ``rid``: its part for ``run``; the
        others' go to them when the reply arrives (:meth:`_fan_out`)."""
        self._commands[(self.runs.index(run), rid)] = cmd
        return command_part(cmd, run.symbol)

    def _fan_out(self) -> None:
        """The reply to request PI_FAN of instrument PI_CUR has just become its command: every other
        instrument it names takes its part now, in instrument order (``step_command_part``), then every
        leg goes out as one unit (engine/legs.py), as ``Portfolio.fan_out`` has the per-event engines do."""
        PI = self.PI
        j = int(PI[K.PI_CUR])
        rid = int(PI[K.PI_FAN]) - 1
        PI[K.PI_FAN] = 0
        cmd = self._commands.pop((j, rid))
        src = self.runs[j]
        ts_ctx = int(src.RI[rid & (src.RI.shape[0] - 1), K.RI_TS])
        now, cid = int(src.S[K.S_NOW]), int(PI[K.PI_CMD_ID])
        order = [j]
        for o, part in fan_out_parts(self.state.symbols, j, cmd):
            order.append(o)
            self._step(o, now, lambda r, b, p=part: K.step_command_part(
                cid, rid, ts_ctx, *p, r.S, r.SF, r.C, r.CF, r.OI, r.OF, r.heap, r.olat, r.work, r.recent,
                r.eng_book, b, r.out, r.SCR,
            ))  # fmt: skip
        self.state.legs.send(lambda o, fn: self._step(o, now, fn), self.runs, PI, self.PF, order, now, ts_ctx)
        PI[K.PI_CUR] = j

    def _unit(self) -> None:
        """A label of instrument PI_CUR made its leg due (S_UNIT_DUE): every instrument's leg goes out
        now, that one's first, as one unit (engine/legs.py), as ``Portfolio.unit`` has the per-event
        engines do."""
        j = int(self.PI[K.PI_CUR])
        S = self.runs[j].S
        origin, now = int(S[K.S_UNIT_DUE]), int(S[K.S_NOW])
        S[K.S_UNIT_DUE] = 0
        order = [j, *(o for o in range(len(self.runs)) if o != j)]
        self.state.legs.send(
            lambda o, fn: self._step(o, now, fn), self.runs, self.PI, self.PF, order, now, origin
        )
        self.PI[K.PI_CUR] = j

    def _legs(self) -> None:
        """The leg check due at PI_LEG_DUE (engine/legs.py)."""
        now = int(self.PI[K.PI_LEG_DUE])
        self.state.legs.check(lambda o, fn: self._step(o, now, fn), self.runs, self.PI, self.PF, now)

    def _step(self, o: int, now: int, fn: Any) -> Any:
        """``fn(run, b_loc)`` as a step of instrument ``o`` at ``now``, as the loop steps it: room, the
        portfolio's counters and risk view, its rows tagged, the orders on to its venue."""
        PI, PF = self.PI, self.PF
        cur = int(PI[K.PI_CUR])
        PI[K.PI_CUR] = o
        run = self.runs[o]
        while True:  # room for the step (a stop's handling may replace the run's arrays)
            K.pf_enter(PI, PF, o, run.S, run.SF)
            st = int(
                K.headroom(
                    run.S, run.OI, run.RI, run.HI, run.NOUT, OUT_CAP, run.lags, run.olat, run.work,
                    run.inflight,
                )
            )  # fmt: skip
            if st == K.ST_DONE:
                break
            self.handle(st)
            run = self.runs[o]
        S, NOUT = run.S, run.NOUT
        S[K.S_NOW] = now
        S[K.S_SENT] = NOUT[K.O_ORDER]
        before = NOUT.copy()
        out = fn(run, self.b_loc[o])
        K.forward(S, run.C, run.OI, run.heap, run.olat, run.OUTI, NOUT)
        K.tag_rows(run.OUTI, NOUT, before, o)
        K.pf_leave(PI, PF, o, S, run.C, run.eng_book)
        if S[K.S_WHY] != K.U_NONE:
            self.handle(K.ST_UNSUPPORTED)
        if S[K.S_KEV_ASKED]:
            self.handle(K.ST_NEED_KEV)
        PI[K.PI_CUR] = cur
        return out

    # ------------------------------------------------------------ the loop's arrays and stops

    def cores(self) -> tuple[tuple[np.ndarray, ...], ...]:
        """Every core's arrays as the loop takes them (``CORES`` in replay/kernel.py), made anew for each
        call of the loop: a stop may have replaced any of them (a table grew, latencies were drawn)."""
        return tuple(r.core() for r in self.runs)

    def _more_lags(self) -> None:
        """Kev's lags: the unused ones, then LAG_BATCH new, for every instrument (one shared count)."""
        PI = self.PI
        drawn = sample_many(self.runs[0].lag_model, np.zeros(LAG_BATCH, dtype=np.int64))
        assert drawn is not None
        self.lags = np.concatenate([self.lags[int(PI[K.PI_LAG_USED]) :], drawn])
        PI[K.PI_LAG_USED] = 0
        for r in self.runs:
            r.lags = self.lags
            r.S[K.S_LAG_USED] = 0
            r.S[K.S_LAG_N] = len(self.lags)

    def handle(self, status: int) -> bool:
        """Deal with a stop of the loop (its instrument in PI[PI_CUR]); True to call it again."""
        run = self.runs[int(self.PI[K.PI_CUR])]
        if status == K.ST_NEED_LAGS:
            run.drain()
            self._more_lags()
            return True
        if status == K.ST_HUB:
            self._fan_out()
            return True
        if status == K.ST_LEG:
            self._legs()
            return True
        if status == K.ST_UNIT:
            self._unit()
            return True
        again = run.handle(status)
        if status == K.ST_NEED_LATENCIES and self.shared_olat:  # made from the shared one: still one
            for r in self.runs:
                r.olat = run.olat
        if status == K.ST_NEED_KEV:  # Python drew its lags: the shared count moves on
            self.PI[K.PI_LAG_USED] = run.S[K.S_LAG_USED]
            if self.PI[K.PI_FAN]:  # the step that asked also turned a hub's reply into its command
                self._fan_out()
            if run.S[K.S_UNIT_DUE]:  # the label that asked also made the legs due
                self._unit()
        return again


def hub_arrays(st: Portfolio) -> tuple[Any, ...]:
    """What the loop reads of a portfolio for a hub's Kev contexts: PS, PP, LR and the pairs' half-life."""
    return st.PS, st.PP, st.LR, st.pair_half_life_ns


def one_type(arrays: list[np.ndarray]) -> tuple[np.ndarray, ...]:
    """The arrays as one tuple the loop indexes by instrument: as they are when they have one type,
    else read-only views of all (``replay.walk.readonly``)."""
    if len({a.flags.writeable for a in arrays}) <= 1:
        return tuple(arrays)
    return tuple(readonly(a) for a in arrays)


def run_portfolio_kernel(
    pf: PortfolioRun,
    walk: StreamedWalk,
    book_levels: list[Callable[[int, int], np.ndarray]],
    b_loc: list[np.ndarray],
    labels: list[np.ndarray],
    probs: list[np.ndarray],
    trades: list[tuple[np.ndarray, np.ndarray, np.ndarray]],
    add_labels: Callable[[np.ndarray, np.ndarray, np.ndarray], None],
    bar: Any = None,
) -> None:
    """:func:`run_kernel` for a portfolio: the merged walk (ts, priority, kind, row, instrument) a chunk
    at a time (``replay.portfolio.portfolio_walk``), each instrument's book levels for the chunk from
    ``book_levels[j]``."""
    n_inst = len(pf.runs)
    PI, PF = pf.PI, pf.PF
    run0 = pf.runs[0]
    # each instrument's arrays of a kind as one tuple (the loop indexes it by instrument)
    BL, LB, PR = one_type(b_loc), one_type(labels), one_type(probs)
    pf.b_loc = b_loc
    TPX, TSZ, TSD = (one_type([t[k] for t in trades]) for k in range(3))
    scratch = K.pf_scratch(n_inst, len(run0.NOUT))
    done = 0
    while (chunk := walk.next_entries()) is not None:
        ts, prio, kind, row, inst = chunk
        if bar is not None:
            bar.update(done)
        done += len(ts)
        levels, L0 = [], np.zeros(n_inst, dtype=np.int64)
        for j in range(n_inst):
            books = row[(kind != 1) & (inst == j)]
            r0, r1 = (int(books.min()), int(books.max()) + 1) if len(books) else (0, 0)
            levels.append(book_levels[j](r0, r1) if r1 > r0 else np.zeros((0, 60)))
            L0[j] = r0
        LV = one_type(levels)
        PI[K.PI_WALK] = 0
        while True:
            before = int(PI[K.PI_WALK])
            status = K.run_pf(
                ts, prio, kind, row, inst, len(ts), LV, L0, BL, LB, PR, TPX, TSZ, TSD, pf.lags,
                pf.cores(), PI, PF, *hub_arrays(pf.state), run0.out, OUT_CAP, *scratch,
            )  # fmt: skip
            after = int(PI[K.PI_WALK])
            if after > before:
                m = kind[before:after] == 4
                if m.any():
                    add_labels(row[before:after][m], ts[before:after][m], inst[before:after][m])
            if not pf.handle(int(status)):
                break
    while True:
        status = K.run_all_pf(pf.cores(), PI, PF, BL, pf.lags, run0.out, OUT_CAP, *scratch)
        if not pf.handle(int(status)):
            break
    rows = sorted((b for r in pf.runs for b in r.breaker), key=lambda b: b[:2])
    for _, _, brows in rows:
        for row_ in brows:
            run0.log.append("kev_breaker", row_)
