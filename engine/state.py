"""The decision core's state (``engine/kernel/``): its arrays, sized and filled from an engine's
config, grown when a step needs room, and its output rows turned into the event log's Arrow tables.

The replay's compiled loop (``replay/fast_path.py``) and the engine driven one event at a time
(``engine/core.py``) hold the same state and hand over the same rows: the files, flush points and
digests do not depend on which drove the core.
"""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson
import pyarrow as pa

from engine import kernel as K
from engine.columns import prefixed as _prefixed
from engine.columns import texts
from engine.contract import decimal_parts, lots_below, step_parts, tick_parts
from engine.errors import DualhubError
from engine.eventlog import EventLog
from engine.events import STREAMS, Label
from engine.fastinit import frozen_maker
from engine.kev.advisor import KevContext
from engine.kev.command import ACTIONS, validate_command
from engine.kev.queue import POLICIES
from engine.risk import N_RULES, rule_codes
from engine.risk import entry as risk_entry
from engine.risk_codes import SOURCES
from engine.strategies import registry
from engine.strategy import quote_lots

if TYPE_CHECKING:
    from engine.core_config import EngineConfig

LABEL_NAMES: tuple[str, ...] = tuple(x.name for x in sorted(Label))  # by class index
_kev_context = frozen_maker(KevContext)
_NO_SEQ: dict[str, pa.Schema] = {}
# a latency span's ref by its kind (the kernel's REF_*): an order's client id or a Kev request's
_REF_PREFIXES = tuple(p for _, p in sorted({K.REF_ORDER: "dh-", K.REF_KEV: "kev:"}.items()))


class _KernelStream:
    """A stream whose events the kernel produced: Arrow tables without ``seq``, given to the log in the
    log's flush points (``EventLog.attach_columns``)."""

    def __init__(self, log: EventLog, stream: str) -> None:
        self.log, self.stream = log, stream
        self.schema = STREAMS[stream].schema
        self.tables: list[pa.Table] = []
        self.held = 0
        self.limit: int | None = None
        # called before the log reads what is held: an engine driven per event hands over its rows
        self.before: Callable[[], None] | None = None
        log.attach_columns(stream, self._rows, self._pending)

    def _pending(self) -> int:
        if self.before is not None:
            self.before()
        if self.limit is None:
            return self.held
        # A flush of one row group: none when the hand-over above already wrote it (see add)
        return self.limit if self.held >= self.limit else 0

    def _rows(self, first_seq: int, n: int, consume: bool) -> pa.Table:
        t = pa.concat_tables(self.tables) if len(self.tables) != 1 else self.tables[0]
        head = t.slice(0, n)
        if consume:
            rest = t.slice(n)
            self.tables = [rest] if rest.num_rows else []
            self.held -= n
        seq = pa.array(np.arange(first_seq, first_seq + n, dtype=np.int64))
        cols = list(head.columns)
        cols.insert(2, seq)  # every output schema is (ts_event, ts_recv, seq, ...)
        return pa.Table.from_arrays(
            [c.combine_chunks() if isinstance(c, pa.ChunkedArray) else c for c in cols], schema=self.schema
        )

    def add(self, table: pa.Table) -> None:
        if not table.num_rows:
            return
        self.tables.append(table)
        self.held += table.num_rows
        step = self.log.flush_rows
        while self.held >= step:
            # This add may run inside the log's own flush of the stream (its question of what is held
            # hands rows over first): that flush's limit holds again once this one is done.
            outer, self.limit = self.limit, step
            try:
                self.log.flush(self.stream)
            finally:
                self.limit = outer
            if self.log._dir is None:  # an in-memory log keeps everything until write()
                break


def _decimal_array(units: np.ndarray) -> pa.Array:
    """decimal128(38, 12) values from their unscaled int64 integers."""
    n = len(units)
    buf = np.empty((n, 2), dtype=np.int64)
    buf[:, 0] = units
    buf[:, 1] = units >> 63
    return pa.Array.from_buffers(pa.decimal128(38, 12), n, [None, pa.py_buffer(buf.tobytes())])


def _text(values: tuple[str, ...], codes: np.ndarray) -> pa.Array:
    return texts(tuple(values), codes)


def fee_parts(rate: Decimal) -> tuple[int, int]:
    """A fee rate as :func:`decimal_parts`; the core's fee of a fill stays below its notional."""
    parts = decimal_parts(rate) if rate.is_finite() else None
    # exact.mul_div_half_even needs |num| x 10**decimals below 2**63
    if parts is None or abs(rate) >= 1 or abs(parts[0]) * 10 ** parts[1] >= 2**62:
        raise DualhubError(f"fee rate {rate} is not a short decimal between -1 and 1 (0.0002: 2 bps)")
    return parts


def _no_seq(stream: str) -> pa.Schema:
    s = _NO_SEQ.get(stream)
    if s is None:
        full = STREAMS[stream].schema
        s = _NO_SEQ[stream] = pa.schema([f for f in full if f.name != "seq"])
    return s


class CoreState:
    """The core's state arrays, sized and filled from an engine config, and its output rows on their
    way to the event log."""

    def __init__(
        self,
        e: EngineConfig,
        *,
        log: EventLog,
        symbol: str,
        clock: Any,
        kev: Any,
        advisor_name: str,
        advisor: Any,
        strategy: tuple[int, np.ndarray],
        fill_model: tuple[int, float] | None,
        ask: bool,
        rows: int = 4096,
        out_cap: int = 1 << 15,
        share: CoreState | None = None,
    ) -> None:
        """``fill_model``: the simulated venue's fill model (kind code, queue exponent) when the state
        holds one (the replay's compiled loop); None: the caller owns the clock and the venue
        (K.C_EXTERNAL). ``rows``: first size of the order ring, request and timer tables (they grow);
        ``out_cap``: rows per output stream between two hand-overs to the log. ``share``: another
        instrument's core of the same portfolio, whose output buffer, streams and Kev texts this one
        writes to as well (``engine.portfolio``)."""
        self.e, self.log, self.symbol, self.advisor = e, log, symbol, advisor
        self.kev, self.clock, self.advisor_name = kev, clock, advisor_name
        self.lag_model = getattr(kev, "lag", None)
        self.ask = ask
        self.timeout_text = f"timeout after {e.kev_timeout_ns / 1e6:.0f} ms: no advice"
        self.S = np.zeros(K.S_SIZE, dtype=np.int64)
        self.S[K.S_OLDEST] = 1  # order ids start at 1
        far = -(1 << 62)
        for i in (K.S_LAST_KEV_OFFER, K.S_EMERGENCY_UNTIL, K.S_LAST_REQUOTE, K.S_LAST_REBALANCE):
            self.S[i] = far
        self.SF = np.zeros(K.SF_SIZE, dtype=np.float64)
        C = self.C = np.zeros(K.C_SIZE, dtype=np.int64)
        CF = self.CF = np.zeros(K.CF_SIZE, dtype=np.float64)
        q, r, c = e.quotes, e.risk, e.contract
        C[K.C_REQUOTE_MIN] = q.requote_min_ns
        C[K.C_REBALANCE_MIN] = q.rebalance_min_ns
        C[K.C_EMERGENCY_HOLD] = q.emergency_hold_ns
        C[K.C_KEV_MIN_INTERVAL] = e.kev_min_interval_ns
        C[K.C_KEV_QUEUE_MAX] = e.kev_queue_max
        C[K.C_KEV_POLICY] = POLICIES.index(e.kev_queue_policy)
        C[K.C_KEV_MAX_IN_FLIGHT] = e.kev_max_in_flight
        C[K.C_KEV_TIMEOUT] = e.kev_timeout_ns
        C[K.C_KEV_STALE] = e.kev_stale_after_ns
        C[K.C_KEV_TTL] = e.kev_advice_ttl_ns
        if fill_model is not None:
            C[K.C_FILL_MODEL], CF[K.CF_QUEUE_N] = fill_model
        C[K.C_EXTERNAL] = fill_model is None
        C[K.C_STRATEGY] = strategy[0]
        C[K.C_STRATEGY_FN] = registry.entry(strategy[0])
        CF[K.CF_PARAMS :] = strategy[1]
        C[K.C_MAX_ORDERS_PER_S] = r.max_orders_per_s
        C[K.C_STALE_BOOK] = r.stale_book_ns
        C[K.C_MAX_ADVICE_AGE] = r.max_advice_age_ns
        C[K.C_RISK_RULES : K.C_RISK_RULES + N_RULES] = rule_codes(r)
        C[K.C_RISK_FN] = risk_entry()
        C[K.C_TICK_NUM], C[K.C_PX_DECIMALS] = tick_parts(c.tick)
        C[K.C_MAKER_NUM], C[K.C_MAKER_EXP] = fee_parts(c.maker_fee_rate)
        C[K.C_TAKER_NUM], C[K.C_TAKER_EXP] = fee_parts(c.taker_fee_rate)
        C[K.C_STEP_NUM], C[K.C_STEP_DEC] = step_parts(c.size_step)
        C[K.C_QUOTE_LOTS] = quote_lots(q, c)
        C[K.C_MAX_POS_LOTS] = lots_below(r.max_position, c.size_step)
        CF[K.CF_TICK] = c.tick
        CF[K.CF_SIZE_STEP] = c.size_step
        CF[K.CF_MIN_QTY] = c.min_qty
        CF[K.CF_QUOTE_QTY] = q.quote_qty
        CF[K.CF_MAX_POSITION] = r.max_position
        CF[K.CF_MAX_DELTA] = r.max_net_delta_usd
        CF[K.CF_MAX_ORDER_QTY] = r.max_order_qty
        CF[K.CF_MAX_SLIP] = r.max_slippage_bps
        CF[K.CF_BAND] = r.price_band_bps
        CF[K.CF_LOSS_STOP] = r.daily_loss_stop_usd
        CF[K.CF_PF_MAX_DELTA] = r.portfolio_max_net_delta_usd
        CF[K.CF_PF_MAX_GROSS] = r.portfolio_max_gross_usd
        CF[K.CF_PF_LOSS_STOP] = r.portfolio_loss_stop_usd
        C[K.C_KEV_ASK] = self.ask
        if not self.ask:
            CF[K.CF_STEP_FRACTION] = advisor.step_fraction
            CF[K.CF_MIN_PROB] = advisor.min_prob
        n0 = rows
        ring = 1 << max(0, n0 - 1).bit_length()  # a power of two: order N's row is N & (ring - 1)
        self.OI = np.zeros((ring, K.OI_COLS), dtype=np.int64)
        self.OF = np.zeros((ring, K.OF_COLS), dtype=np.float64)
        self.RI = np.zeros((ring, K.RI_COLS), dtype=np.int64)  # a ring too: request N in row N & (ring - 1)
        self.RF = np.zeros((ring, K.RF_COLS), dtype=np.float64)
        self.HI = np.zeros((n0, K.HI_COLS), dtype=np.int64)
        self.HF = np.zeros((n0, K.HF_COLS), dtype=np.float64)
        self.work = np.zeros(3 * K.WORK_CAP, dtype=np.int64)  # the list, then two scratch copies
        self.rest = np.zeros(2 * K.REST_CAP, dtype=np.int64)
        self.kq = np.zeros(max(K.KQ_CAP, e.kev_queue_max + 1), dtype=np.int64)
        self.inflight = np.zeros(max(K.KQ_CAP, e.kev_max_in_flight + 1), dtype=np.int64)
        self.recent = np.zeros(r.max_orders_per_s + 16, dtype=np.int64)
        self.eng_book = np.full(60, np.nan)
        self.x_book = np.full(60, np.nan)
        self.SCR = np.zeros(K.SCRATCH_F)  # a step's scratch (the core makes no arrays: engine.jit)
        self.SCRI = np.zeros(K.HI_COLS, dtype=np.int64)
        self.OUTI = np.zeros((8, K.OUT_MAXI, out_cap), dtype=np.int64)
        self.OUTF = np.zeros((8, K.OUT_MAXF, out_cap), dtype=np.float64)
        self.NOUT = np.zeros(8, dtype=np.int64)
        self.lags = np.zeros(0, dtype=np.int64)
        # the symbols of the instruments whose rows the output buffer holds, by OUT_INST code
        self.symbols: list[str] = [symbol]
        self.streams = {s: _KernelStream(log, s) for s in K.OUT_STREAMS} if share is None else share.streams
        # reason texts by code: the core's, then those a venue reports that the core does not name
        self.reason_texts = list(K.REASON_TEXT)
        self._texts: dict[int, tuple[str, str, str]] = {}  # request id -> (key, raw, reason)
        # Python's answers, by request id until their response is drained: (error, failure, advisor,
        # key, raw, prompt_ms, predicted_ms, prompt_tokens, completion_tokens, reason)
        self._replies: dict[int, tuple[Any, ...]] = {}
        if share is not None:  # one buffer, one set of texts: rows stay in step order across instruments
            self.OUTI, self.OUTF, self.NOUT = share.OUTI, share.OUTF, share.NOUT
            self.reason_texts, self._texts, self._replies = share.reason_texts, share._texts, share._replies
            share.symbols.append(symbol)
            self.symbols = share.symbols
        # the cores writing to the buffer, by OUT_INST code: a drain reads each row's request from its own
        self.out = K.Out(self.OUTI, self.OUTF, self.NOUT)  # the steps' one parameter for the buffer
        self.cores: list[CoreState] = share.cores if share is not None else []
        self.cores.append(self)
        # nothing drawn here unless a simulated venue is (fast_path.KernelRun): headroom() never asks
        self.olat = np.zeros((3, K.MARGIN + 1), dtype=np.int64)
        self.S[K.S_LAG_N] = 1 << 60

    @property
    def heap(self) -> K.Heap:
        """The timer heap's arrays as the core's functions take them (made anew: the arrays grow)."""
        return K.Heap(self.HI, self.HF)

    def state(self) -> tuple[np.ndarray, ...]:
        """The kernel's state arrays, in its functions' argument order (S ... x_book)."""
        return (
            self.S, self.SF, self.C, self.CF, self.OI, self.OF, self.RI, self.RF, self.HI, self.HF, self.work,
            self.rest, self.kq, self.inflight, self.recent, self.eng_book, self.x_book,
        )  # fmt: skip

    def _grow(self, name: str) -> None:
        a = getattr(self, name)
        b = np.zeros((a.shape[0] * 2, a.shape[1]), dtype=a.dtype)
        b[: a.shape[0]] = a
        setattr(self, name, b)

    def _grow_orders(self) -> None:
        """Double the order ring: each order that may be in use moves to its row in the larger ring."""
        rows = self.OI.shape[0]
        oids = np.arange(int(self.S[K.S_OLDEST]), int(self.S[K.S_OID]) + 1, dtype=np.int64)
        for name in ("OI", "OF"):
            a = getattr(self, name)
            b = np.zeros((rows * 2, a.shape[1]), dtype=a.dtype)
            b[oids & (rows * 2 - 1)] = a[oids & (rows - 1)]
            setattr(self, name, b)

    def _grow_work(self) -> None:
        """Double the working-order list (its two scratch copies grow with it; they need no copy)."""
        n = int(self.S[K.S_NWORK])
        work = np.zeros(2 * self.work.shape[0], dtype=np.int64)
        work[:n] = self.work[:n]
        self.work = work

    def _oldest_request(self) -> int:
        """The lowest request id whose row the kernel may still read: one in the Kev queue or in flight.
        A timer naming a request reads its row only while it is in flight (a reply after the timeout and
        a timeout after the reply only note it), and this is called right after a drain, so no buffered
        output row names one either (a response's texts are made from its row at drain time)."""
        S = self.S
        oldest = int(S[K.S_RID]) + 1
        kq = self.kq[: int(S[K.S_KQ_N])]
        fl = self.inflight[: int(S[K.S_INFLIGHT_N])]
        for ids in (kq, fl):
            if len(ids):
                oldest = min(oldest, int(ids.min()))
        return oldest

    def _ring_requests(self) -> None:
        """Room for the next requests: rows of finished requests are reused (request N in row
        N & (rows-1)); the ring doubles, moving what is in use, only when that is not enough."""
        S = self.S
        oldest = self._oldest_request()
        rows = self.RI.shape[0]
        if int(S[K.S_RID]) + K.MARGIN - oldest >= rows:
            while int(S[K.S_RID]) + K.MARGIN - oldest >= rows:
                rows *= 2
            rids = np.arange(oldest, int(S[K.S_RID]) + 1, dtype=np.int64)
            for name in ("RI", "RF"):
                a = getattr(self, name)
                b = np.zeros((rows, a.shape[1]), dtype=a.dtype)
                b[rids & (rows - 1)] = a[rids & (a.shape[0] - 1)]
                setattr(self, name, b)
        S[K.S_RID_OLDEST] = oldest

    def _context(self, rid: int) -> KevContext:
        """Request ``rid``'s KevContext, as the engine built it, from its row."""
        RI, RF = self.RI[rid & (self.RI.shape[0] - 1)], self.RF[rid & (self.RF.shape[0] - 1)]
        return _kev_context(  # KevContext fields in order
            rid,
            int(RI[K.RI_TS]),
            self.symbol,
            LABEL_NAMES[int(RI[K.RI_LABEL])],
            int(RI[K.RI_LABEL_SEQ]),
            float(RF[K.RF_P]),
            float(RF[K.RF_MID]),
            float(RF[K.RF_SPREAD]),
            float(RF[K.RF_IMB]),
            float(RF[K.RF_POS]),
            float(RF[K.RF_MAXPOS]),
        )

    def _kev_texts(self, rid: int, inst: int = 0) -> tuple[str, str, str]:
        """The rule advisor's key, raw JSON and reason for request ``rid`` of instrument ``inst``: the
        kernel's decision (``rule_decide``, in the request's row) in the advisor's words."""
        t = self._texts.get(rid)
        if t is None:
            self._make_texts([rid], [inst])
            t = self._texts[rid]
        return t

    def _make_texts(self, rids: list[int], insts: list[int]) -> None:
        """:meth:`_kev_texts` of every request in ``rids`` (of the instruments ``insts``) not made yet,
        a batch per instrument: the rows' numbers are read as columns, not a context per request."""
        for inst in sorted(set(insts)):
            core = self.cores[inst]
            todo = [r for r, i in zip(rids, insts, strict=True) if i == inst and r not in self._texts]
            if todo:
                core._texts_of(np.array(todo, dtype=np.int64))

    def _texts_of(self, rids: np.ndarray) -> None:
        RI, RF = self.RI[rids & (self.RI.shape[0] - 1)], self.RF[rids & (self.RF.shape[0] - 1)]
        n = len(rids)
        contexts = zip(
            [self.symbol] * n,
            [LABEL_NAMES[x] for x in RI[:, K.RI_LABEL].tolist()],
            *(RF[:, c].tolist() for c in (K.RF_P, K.RF_MID, K.RF_SPREAD, K.RF_IMB, K.RF_POS, K.RF_MAXPOS)),
            strict=True,
        )
        answers = zip(
            RI[:, K.RI_ACTION].tolist(),
            *(RF[:, c].tolist() for c in (K.RF_TARGET, K.RF_HEDGE, K.RF_SLIP)),
            RI[:, K.RI_WHY].tolist(),
            strict=True,
        )
        made = self.advisor.texts_of(list(contexts), list(answers))
        self._texts.update(zip(rids.tolist(), made, strict=True))

    def drain(self) -> None:
        """Turn the kernel's buffered rows into tables for the log."""
        NOUT, OUTI, OUTF = self.NOUT, self.OUTI, self.OUTF
        for s, stream in enumerate(K.OUT_STREAMS):
            n = int(NOUT[s])
            if not n:
                continue
            ints, floats = OUTI[s, :, :n], OUTF[s, :, :n]
            self.streams[stream].add(
                pa.Table.from_arrays(self._columns(s, n, ints, floats), schema=_no_seq(stream))
            )
        NOUT[:] = 0
        self.S[K.S_SENT] = 0  # every order row was handed to the venue before the stop
        # A request's texts serve its response and command, written by the same timer: never after.
        self._texts.clear()

    def _response_columns(self, n: int, ints: np.ndarray) -> list[pa.Array]:
        """kev_response columns from Python's answers; a timeout's row names none (a late answer's is
        dropped with it). A valid command's texts stay for its command row, drained with it."""
        timeout = (self.timeout_text, "timeout", self.advisor_name, "", "", 0.0, 0.0, 0, 0, "")
        recs = []
        for rid, timed_out in zip(ints[1].tolist(), ints[4].tolist(), strict=True):
            rec = self._replies.pop(rid, None)
            if timed_out:
                rec = timeout
            else:
                assert rec is not None
                if not rec[0]:
                    self._texts[rid] = (rec[3], rec[4], rec[9])
            recs.append(rec)
        cols = list(zip(*recs, strict=True))
        ts = pa.array(ints[0].copy())
        return [
            ts,
            ts,
            pa.array(ints[1].copy()),
            pa.array(ints[2].astype(bool)),
            *(pa.array(c, pa.string()) for c in cols[:2]),  # error, failure
            pa.array(ints[3].copy()),  # lag
            *(pa.array(c, pa.string()) for c in cols[2:5]),  # advisor, key, raw
            pa.array(cols[5], pa.float64()),
            pa.array(cols[6], pa.float64()),
            pa.array(cols[7], pa.int64()),
            pa.array(cols[8], pa.int64()),
        ]

    def _sym(self, ints: np.ndarray) -> pa.Array:
        return texts(tuple(self.symbols), ints[K.OUT_INST])

    def _columns(self, s: int, n: int, ints: np.ndarray, floats: np.ndarray) -> list[pa.Array]:
        side = ("buy", "sell")
        otype = ("limit", "market")
        if s == K.O_KEV_QUEUE:
            ts = pa.array(ints[0].copy())
            return [
                ts,
                ts,
                pa.array(ints[1].copy()),
                _text(K.QUEUE_KINDS, ints[2]),
                pa.array(ints[3].copy()),
            ]
        if s == K.O_KEV_REQUEST:
            return [
                pa.array(ints[0].copy()),
                pa.array(ints[1].copy()),
                pa.array(ints[2].copy()),
                self._sym(ints),
                _text(LABEL_NAMES, ints[3]),
                pa.array(ints[4].copy()),
                *(pa.array(floats[k].copy()) for k in range(4)),
                pa.array(ints[5].copy()),
            ]
        if s == K.O_KEV_RESPONSE and self.ask:
            return self._response_columns(n, ints)
        if s == K.O_KEV_RESPONSE:
            ok = ints[2].astype(bool)
            keys, raws, errors, failures = [], [], [], []
            insts = ints[K.OUT_INST].tolist()
            answered = ints[4] == 0
            self._make_texts(ints[1, answered].tolist(), ints[K.OUT_INST, answered].tolist())
            for rid, good, timed_out, inst in zip(
                ints[1].tolist(), ok.tolist(), ints[4].tolist(), insts, strict=True
            ):
                key = raw = error = failure = ""
                if timed_out:
                    error, failure = self.timeout_text, "timeout"
                else:  # the rule answered: a valid command, or one the schema refuses (the kernel's verdict)
                    key, raw, _ = self._kev_texts(rid, inst)
                    if not good:
                        error, failure = str(validate_command(orjson.loads(raw))), "schema"
                keys.append(key)
                raws.append(raw)
                errors.append(error)
                failures.append(failure)
            ts = pa.array(ints[0].copy())
            zero_f = pa.array(np.zeros(n))
            zero_i = pa.array(np.zeros(n, dtype=np.int64))
            return [
                ts,
                ts,
                pa.array(ints[1].copy()),
                pa.array(ok),
                pa.array(errors, pa.string()),
                pa.array(failures, pa.string()),
                pa.array(ints[3].copy()),
                pa.array([self.advisor.name], pa.string()).take(zero_i),
                pa.array(keys, pa.string()),
                pa.array(raws, pa.string()),
                zero_f,
                zero_f,
                zero_i,
                zero_i,
            ]
        if s == K.O_COMMAND:
            self._make_texts(ints[3].tolist(), ints[K.OUT_INST].tolist())
            reasons = [
                self._kev_texts(rid, inst)[2]
                for rid, inst in zip(ints[3].tolist(), ints[K.OUT_INST].tolist(), strict=True)
            ]
            return [
                pa.array(ints[0].copy()),
                pa.array(ints[1].copy()),
                pa.array(ints[2].copy()),
                pa.array(ints[3].copy()),
                self._sym(ints),
                _text(ACTIONS, ints[4]),
                *(pa.array(floats[k].copy()) for k in range(3)),
                pa.array(reasons, pa.string()),
                pa.array(ints[5].copy()),
            ]
        if s == K.O_RISK:
            ts = pa.array(ints[0].copy())
            return [
                ts,
                ts,
                _prefixed("dh-", ints[1]),
                self._sym(ints),
                _text(("new", "cancel"), ints[2]),
                _text(side, ints[3]),
                _text(otype, ints[4]),
                pa.array(floats[0].copy()),
                pa.array(floats[1].copy()),
                _text(SOURCES, ints[5]),
                pa.array(ints[6].copy()),
                pa.array(ints[7].astype(bool)),
                _text(self.reason_texts, ints[8]),
            ]
        if s == K.O_ORDER:
            return [
                pa.array(ints[0].copy()),
                pa.array(ints[1].copy()),
                _prefixed("dh-", ints[2]),
                self._sym(ints),
                _text(K.ORDER_KINDS, ints[3]),
                _text(side, ints[4]),
                _text(otype, ints[5]),
                pa.array(floats[0].copy()),
                pa.array(floats[1].copy()),
                _text(self.reason_texts, ints[6]),
            ]
        if s == K.O_FILL:
            return [
                pa.array(ints[0].copy()),
                pa.array(ints[1].copy()),
                _prefixed("dh-", ints[2]),
                self._sym(ints),
                _text(side, ints[3]),
                pa.array(floats[0].copy()),
                pa.array(floats[1].copy()),
                _text(("maker", "taker"), ints[4]),
                _decimal_array(ints[5].copy()),
                _decimal_array(ints[6].copy()),
                pa.array(floats[2].copy()),
            ]
        # latency
        start, end = ints[0].copy(), ints[1].copy()
        refs = _prefixed(_REF_PREFIXES, ints[4], ints[3])
        return [
            pa.array(start),
            pa.array(end),
            _text(K.SPAN_NAMES, ints[2]),
            refs,
            pa.array(start),
            pa.array(end),
            pa.array(end - start),
        ]

    def grow(self, status: int) -> None:
        """Make the room a ``headroom()`` status asks for (after a drain: no buffered row names a
        request whose row may move)."""
        if status == K.ST_GROW_ORDERS:
            self._grow_orders()
        elif status == K.ST_GROW_HEAP:
            self._grow("HI")
            self._grow("HF")
        elif status == K.ST_GROW_REQUESTS:
            self._ring_requests()
        elif status == K.ST_GROW_WORK:
            self._grow_work()
        else:
            raise AssertionError(f"not a growth status: {status}")
