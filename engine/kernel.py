"""The decision core: the engine's state as arrays and its transitions as compiled functions.

One implementation, driven two ways. The replay's compiled loop (``replay/kernel.py``) runs it over
a session's merged walk, with the simulated venue (``venue/kernel.py``) in the same state; the engine
of live mode and of the per-event replay (``engine/core.py``) calls the ``step_*`` entries one event at
a time and owns the clock and the venue. Either way every decision is made here.

The rules themselves are not here: each is a compiled function in the module that owns it, called
from these transitions: the risk gateway's rules (``engine/risk.py``) and quoting
(``engine/strategies/``), each through the address of its compiled entry, so an edit to them does not
recompile this core; Kev's target and rebalancing (``engine/strategy.py``), the rule advisor
(``engine/kev/rules.py``), the Kev queue policy (``engine/kev/queue.py``) and the book rules
(``engine/book.py``). What this file holds is the bookkeeping around them: the order, request and
timer tables, the Kev request flow, money.

Units: sizes and positions are whole lots of the size step, order prices whole ticks (OI_PX). Money:
position, cash and fees are integers of 1e-12 (prices of ``px_decimals`` digits, checked to
be their own shortest repr, as ``Decimal(repr(px))`` reads them), quantized half-even as
``Decimal.quantize`` does. The loss stop is decided exactly on them (``engine.risk.loss_ok``).

Layout: state lives in numpy arrays so a run can stop (an output buffer is full, a table must grow,
Kev lags or order latencies must be drawn, an advisor that is not the compiled rule must answer a Kev
request in Python) and resume where it stopped. Strings are codes; ``engine/state.py`` turns the rows
into the event log's Arrow tables. An accepted order or cancel is only written to the order stream:
whoever drives the core hands it to the venue (the replay loop to its simulated one, live mode to the
exchange).
"""

from __future__ import annotations

import math

import numpy as np

from engine import risk_call
from engine.book import imbalance_levels
from engine.contract import NO_PX, lots_of, round_exact, tick_index
from engine.exact import POW10, div_half_even, mul_div_half_even, pmin, pyround  # noqa: F401 - tests call K.pyround
from engine.jit import njit
from engine.kev.command import TARGET_POSITION_ABS_MAX, within
from engine.kev.pairs import pair_update
from engine.kev.queue import (  # noqa: F401 - the queue's codes, kernel names too
    POLICY_CONFLATE,
    POLICY_DROP_OLDEST,
    POLICY_FIFO,
    Q_ENQUEUED,
    Q_LATE,
    Q_STALE,
    Q_TIMEOUT,
    QUEUE_KINDS,
    is_stale,
    offer_plan,
)
from engine.kev.rules import A_FLATTEN, A_HOLD, A_LEAN_BUY, A_LEAN_SELL, rule_decide  # noqa: F401 - codes
from engine.risk_codes import (  # noqa: F401 - the gateway's codes, kernel names (BUY ... R_REDUCE_ONLY) too
    BUY,
    LIMIT,
    MARKET,
    N_RULES,
    R_BAD_BOOK,
    R_BAD_ORDER,
    R_BAND,
    R_KILL,
    R_LOSS,
    R_MAX_DELTA,
    R_MAX_POS,
    R_MAX_QTY,
    R_NO_BOOK,
    R_OK,
    R_PF_DELTA,
    R_PF_GROSS,
    R_PF_LOSS,
    R_RATE,
    R_REDUCE_ONLY,
    R_SLIP,
    R_STALE_ADVICE,
    R_STALE_BOOK,
    RATE_WINDOW_NS,
    REASONS,
    SELL,
    SRC_CANCEL,
    SRC_FLATTEN,
    SRC_KEV,
    SRC_QUOTE,
    lots_within,
)
from engine.strategies import call
from engine.strategy import NO_ORDER, kev_target, rebalance_order

# ---------------------------------------------------------------- codes (shared with fast_path)
INTENT_NEW, INTENT_CANCEL = 0, 1
LIQ_MAKER, LIQ_TAKER = 0, 1
# order status
PENDING_NEW, LIVE, PENDING_CANCEL, DONE = 0, 1, 2, 3
# order event kinds
OK_NEW, OK_CANCEL, OK_ACK, OK_REJECT, OK_CANCEL_ACK, OK_DONE = 0, 1, 2, 3, 4, 5
ORDER_KINDS = ("new", "cancel", "ack", "reject", "cancel_ack", "done")
# reasons: engine.risk's R_* (REASONS indexes), then exchange reasons
_R0 = len(REASONS)
R_EMPTY, R_NO_MARKET, R_FILLED, R_IOC, R_CANCEL_NOT_FOUND, R_REDUCE_REJECTED = range(_R0, _R0 + 6)
REASON_TEXT = (
    *REASONS,
    "",
    "no_market",
    "filled",
    "ioc_remainder_expired",
    "cancel_rejected:order_not_found",
    "reduce_only_rejected",
)
# labels by class index (engine.core.LABEL_NAMES)
L_HOLD, L_BUY, L_SELL, L_EMERGENCY = 0, 1, 2, 3
# latency span names; refs are "dh-N" (order) or "kev:N" (request)
SPAN_TICK_TO_ORDER, SPAN_ORDER_ENTRY, SPAN_KEV_QUEUE, SPAN_KEV = 0, 1, 2, 3
SPAN_NAMES = ("tick_to_order", "order_entry", "kev_queue", "kev")
REF_ORDER, REF_KEV = 0, 1

# timer kinds
T_ARRIVE, T_ARRIVE_CANCEL, T_REPORT, T_KEV_TIMEOUT, T_KEV_DONE = 0, 1, 2, 3, 4
M_ACK, M_REJECT, M_CANCEL_ACK, M_DONE, M_FILL = 0, 1, 2, 3, 4
PRIO_KEV, PRIO_EXCH_IN, PRIO_EXCH_OUT = 52, 61, 62

# statuses
ST_DONE, ST_OUT_FULL, ST_GROW_ORDERS, ST_GROW_HEAP, ST_GROW_REQUESTS, ST_NEED_LAGS = 0, 1, 2, 3, 4, 5
ST_NEED_LATENCIES = 6
ST_GROW_WORK = 7  # the working-order list must grow (fast_path doubles it) before the next step
ST_NEED_KEV = 8  # a Kev request started whose advisor answers in Python (C_KEV_ASK): fast_path answers it
ST_UNSUPPORTED = 9
ST_HUB = 10  # a portfolio's Kev hub command (PI_FAN) goes to the other instruments before the next step
ST_LEG = 11  # a hub command's leg timeout (PI_LEG_DUE) is due: engine/legs.py checks the legs
ST_UNIT = 12  # a label of a hub's instrument rebalances (S_UNIT_DUE): every leg goes out (engine/legs.py)
# why unsupported
U_NONE, U_PX_DECIMALS, U_OVERFLOW, U_TABLE, U_LOOK_AHEAD, U_SIZE = 0, 1, 2, 3, 4, 5
UNSUPPORTED_TEXT = (
    "",
    "a fill price that is not a short decimal",
    "money or a position beyond what the core's integers hold",
    "more working orders or queued Kev requests than the kernel's tables hold",
    "a label asked for before its book was received",
    "a fill size that is not whole lots of the contract's size step",
)

# ---------------------------------------------------------------- state layout
# S (int64 scalars)
(
    S_NOW,
    S_OID,
    S_RID,
    S_CMD_ID,
    S_LABELS,
    S_LAST_KEV_OFFER,
    S_EMERGENCY_UNTIL,
    S_LAST_REQUOTE,
    S_LAST_REBALANCE,
    S_ENG_ROW,
    S_XBOOK,
    S_KILL,
    S_CMD,
    S_CMD_ACTION,
    S_CMD_TS_RECV,
    S_CMD_VALID_UNTIL,
    S_HEAP_N,
    S_HEAP_SEQ,
    S_NWORK,
    S_NREST,
    S_RECENT_HEAD,
    S_RECENT_TAIL,
    S_KQ_N,
    S_INFLIGHT_N,
    S_POS,
    S_CASH_HI,
    S_FEES_HI,
    S_LAG_USED,
    S_LAG_N,
    S_WHY,
    S_NREQ_CAP,
    S_ENG_BOOK,
    S_RID_OLDEST,
) = range(33)
S_LAST_LABEL_NAME = 33  # engine.label, as its class index
S_OLDEST = 34  # the oldest order that may still be in use
S_OLAT_USED = 35  # 35..37: how many of each row of olat (OLAT_*) the run has used
S_KEV_ASKED = 38  # Kev requests started and not answered yet (C_KEV_ASK): they wait in RI_OK == -1
S_SENT = 39  # order rows of the output buffer the replay loop has handed to its simulated venue
S_XPOS = 40  # the position as the simulated venue knows it, in lots (SimExchange.position)
# Cash and fees (integers of 1e-12 USDT) as two words each, HI * 2**32 + LO with 0 <= LO < 2**32 (the
# risk rules read money so): an int64 of 1e-12 would hold only 9.2 million USDT
S_CASH_LO, S_FEES_LO = 41, 42
# 1: Kev is a portfolio's hub and its commands go out as one unit (engine/legs.py): a reply that becomes
# this core's command does not rebalance at once; the unit sends every instrument's leg together
S_UNIT = 43
# a label of this core would rebalance (S_UNIT): the unit of every leg is due, its origin here (0: none)
S_UNIT_DUE = 44
S_SIZE = 45
# SF (float64 scalars)
SF_CMD_TARGET, SF_CMD_SLIP, SF_CMD_HEDGE = 0, 1, 2
# 3..5: the rest of the portfolio (the other instruments one engine trades), written before each step
# by engine.portfolio: their summed net delta, gross exposure and PnL in USD (0 when there are none)
SF_OTHERS_DELTA, SF_OTHERS_GROSS, SF_OTHERS_PNL = 3, 4, 5
SF_SIZE = 6
# C (int64 config)
(
    C_REQUOTE_MIN,
    C_REBALANCE_MIN,
    C_EMERGENCY_HOLD,
    C_KEV_MIN_INTERVAL,
    C_KEV_QUEUE_MAX,
    C_KEV_POLICY,
    C_KEV_MAX_IN_FLIGHT,
    C_KEV_TIMEOUT,
    C_KEV_STALE,
    C_KEV_TTL,
    C_FILL_MODEL,
    C_STRATEGY,  # the strategy's kind code (engine.strategies.registry.KINDS; a Python one's from 64)
    C_MAX_ORDERS_PER_S,
    C_STALE_BOOK,
    C_MAX_ADVICE_AGE,
    C_PX_DECIMALS,
    C_MAKER_NUM,
    C_MAKER_EXP,
    C_TAKER_NUM,
    C_TAKER_EXP,
    C_STEP_NUM,  # the size step as the exact fraction C_STEP_NUM / 10**C_STEP_DEC (its shortest decimal):
    C_STEP_DEC,  # the core counts sizes and the position in whole lots of it (engine.state sets them)
    C_TICK_NUM,  # the tick as C_TICK_NUM / 10**C_PX_DECIMALS: order prices are whole ticks (OI_PX)
) = range(23)
# the strategy's sizes in whole lots (engine.state sets them): the quote size, and the position limit
# (RiskLimits.max_position) down to whole lots
C_QUOTE_LOTS, C_MAX_POS_LOTS = 23, 24
# the address of the strategy's compiled entry (engine.strategies.registry.entry; engine/strategies/call.py)
C_STRATEGY_FN = 25
C_RISK_FN = 26  # the address of the risk rules' compiled entry (engine.risk.entry; engine/risk_call.py)
# 1: the caller owns the clock (engine/core.py: live mode, the per-event replay): Kev timeouts are its
# timers (step_timer), the heap holds nothing. 0: the replay loop, whose heap holds every timer.
C_EXTERNAL = 27
C_OLAT_KEYED = 28  # 28..30: 1 where olat row OLAT_* is a recorded table looked up by the draw's time
C_KEV_ASK = 31  # 1: the advisor is Python's (cassette, LLM); 0: the compiled rule advisor decides
C_RISK_RULES = 32  # 32..: the risk rules to run, in order (engine.risk.rule_codes: N_RULES codes)
C_SIZE = C_RISK_RULES + N_RULES
# CF (float64 config)
(
    CF_TICK,
    CF_SIZE_STEP,
    CF_MIN_QTY,
    CF_QUOTE_QTY,
    CF_MAX_POSITION,
    CF_MAX_DELTA,
    CF_MAX_ORDER_QTY,
    CF_MAX_SLIP,
    CF_BAND,
    CF_LOSS_STOP,
    CF_QUEUE_N,
    CF_STEP_FRACTION,
    CF_MIN_PROB,
    CF_PF_MAX_DELTA,  # the portfolio's limits (RiskLimits.portfolio_*)
    CF_PF_MAX_GROSS,
    CF_PF_LOSS_STOP,
) = range(16)
CF_PARAMS = 16  # 16..: the strategy's parameters (call.MAX_PARAMS)
CF_SIZE = CF_PARAMS + call.MAX_PARAMS

# Per-order table: OI (int64) / OF (float64) columns, a ring: order N lives in row N & (rows - 1). A row
# is taken again only once its order is done, off the book and named by no pending timer (S_OLDEST).
OI_SIDE, OI_TYPE, OI_SENT, OI_STATUS, OI_REDUCE, OI_SOURCE = 0, 1, 2, 3, 4, 5
OI_OID, OI_REFS, OI_RESTING = 6, 7, 8  # the slot's order, its pending timers, resting at the exchange
OI_AGE = 9  # the age of the Kev advice the order acts on (its risk row's advice_age; -1: none)
# The order's size in whole lots of the size step (the risk gateway passes only whole lots), what the
# engine has been told is filled of it, and what the simulated venue has filled (venue/matching.py: the
# reports of that reach the engine a response latency later)
OI_LOTS, OI_FILLED, OI_XFILLED = 10, 11, 12
# The order's limit price in whole ticks (NO_PX: a market order). The risk gateway passes only prices
# on the tick grid, so the engine's requote and the venue's matching compare integers; the price
# reported (order and risk rows, intents, fills) is price_of this, the double of the exact decimal.
OI_PX = 13
OI_COLS = 14
# OF_AHEAD .. OF_TRADED: the venue's queue-model state of a resting order (venue/fills.py)
OF_SLIP, OF_AHEAD, OF_LEVEL, OF_TRADED = 0, 1, 2, 3
OF_COLS = 4
# Per-request table (row = request id): RI / RF
RI_TS, RI_LABEL, RI_LABEL_SEQ, RI_ACTION, RI_WHY, RI_STARTED = 0, 1, 2, 3, 4, 5
# RI_OK: the reply is a valid command (1), is not (0), is not there yet (-1); RI_DONE_SEQ: its timer's seq
RI_OK, RI_DONE_SEQ = 6, 7
RI_COLS = 8
RF_P, RF_MID, RF_SPREAD, RF_IMB, RF_POS, RF_TARGET, RF_HEDGE, RF_SLIP, RF_MAXPOS = 0, 1, 2, 3, 4, 5, 6, 7, 8
RF_COLS = 9
# Timer heap: HI (ts, prio, seq, kind, a, b, c), HF (f1, f2)
HI_COLS, HF_COLS = 7, 2
# Order latencies drawn ahead, one row per model (each its own random stream, drawn in the order
# SimExchange draws them): olat[OLAT_*, S[S_OLAT_USED + OLAT_*]] is the next one.
OLAT_ENTRY, OLAT_RESPONSE, OLAT_CANCEL = 0, 1, 2
# A recorded model's row (C_OLAT_KEYED) is its whole table instead (venue.recorded_latency): the number
# of keys n, the fallback, the misses so far, then from KEY_HEAD the n keys ascending, each key's next
# and end position in the row, and the durations grouped by key, each key's in recorded order.
KEY_N, KEY_FALLBACK, KEY_MISSES, KEY_HEAD = 0, 1, 2, 3

# Output streams: index, int columns, float columns. OUTI[stream, column, row] and OUTF likewise: column
# by column, so the drain hands Arrow each column as one contiguous copy (a row-major buffer cost a
# strided copy per column).
O_KEV_QUEUE, O_KEV_REQUEST, O_KEV_RESPONSE, O_COMMAND, O_RISK, O_ORDER, O_FILL, O_LATENCY = range(8)
OUT_STREAMS = ("kev_queue", "kev_request", "kev_response", "command", "risk", "order", "fill", "latency")
# kev_queue: ts, request_id, kind, depth
# kev_request: ts_event, ts_recv, request_id, label, label_seq, queue_wait | mid, spread, imbalance, position
# kev_response: ts, request_id, ok, lag_ns, timeout (1) or reply (0)
# command: ts_event, ts_recv, command_id, request_id, action, valid_until | target, hedge, slip
# risk: ts, oid, intent, side, type, source, advice_age, accepted, reason | px, qty
# order: ts_event, ts_recv, oid, kind, side, type, reason | px, qty
# fill: ts_event, ts_recv, oid, side, liquidity, notional_units, fee_units | px, qty, position_after
# latency: start, end, name, ref_kind, ref_n
OUT_ICOLS = np.array([4, 6, 5, 6, 9, 7, 7, 5], dtype=np.int64)
OUT_FCOLS = np.array([1, 4, 1, 3, 2, 2, 3, 1], dtype=np.int64)
# Every stream's last int column (OUT_INST) is the instrument the row is of: a portfolio's cores share
# one output buffer, and engine.portfolio tags each step's rows with the instrument it stepped.
OUT_INST = 9
OUT_MAXI, OUT_MAXF = 10, 4

# Headroom checked before each walk entry and each timer: no single step emits more than this.
MARGIN = 256
# First sizes of the working-order list (work holds it, then two scratch copies of its size), the
# resting orders (rest: them, then one scratch copy) and the Kev queue and in-flight tables (at least
# the config's queue and in-flight limits: they never fill). The working list grows through
# ST_GROW_WORK: one step adds fewer than STEP_ORDERS orders (a requote two, a rebalance one).
WORK_CAP, REST_CAP, KQ_CAP = 64, 64, 16
STEP_ORDERS = 16
EPS = 1e-12
NAN = math.nan

# ---------------------------------------------------------------- output


@njit
def tag_rows(OUTI, NOUT, before, inst):
    """Mark the rows each stream got since ``before`` (its row counts then) as instrument ``inst``'s."""
    for s in range(NOUT.shape[0]):
        for k in range(before[s], NOUT[s]):
            OUTI[s, OUT_INST, k] = inst


# ---------------------------------------------------------------- timer heap


@njit
def _heap_push(S, HI, HF, OI, ts, prio, kind, a, b, c6, f1, f2):
    seq = S[S_HEAP_SEQ]
    S[S_HEAP_SEQ] = seq + 1
    _heap_insert(S, HI, HF, OI, ts, prio, seq, kind, a, b, c6, f1, f2)


@njit
def _heap_insert(S, HI, HF, OI, ts, prio, seq, kind, a, b, c6, f1, f2):
    """A timer under a seq taken earlier (_heap_push takes the next)."""
    if kind <= T_REPORT:  # the timer names order a: its row stays taken until the timer ran
        OI[a & (OI.shape[0] - 1), OI_REFS] += 1
    n = S[S_HEAP_N]
    i = n
    S[S_HEAP_N] = n + 1
    # sift up
    while i > 0:
        parent = (i - 1) >> 1
        pt, pp, ps = HI[parent, 0], HI[parent, 1], HI[parent, 2]
        if pt < ts or (pt == ts and (pp < prio or (pp == prio and ps < seq))):
            break
        for c in range(HI_COLS):
            HI[i, c] = HI[parent, c]
        HF[i, 0] = HF[parent, 0]
        HF[i, 1] = HF[parent, 1]
        i = parent
    HI[i, 0] = ts
    HI[i, 1] = prio
    HI[i, 2] = seq
    HI[i, 3] = kind
    HI[i, 4] = a
    HI[i, 5] = b
    HI[i, 6] = c6
    HF[i, 0] = f1
    HF[i, 1] = f2


@njit(inline="always")
def _less(HI, i, j):
    a0, b0 = HI[i, 0], HI[j, 0]
    if a0 != b0:
        return a0 < b0
    a1, b1 = HI[i, 1], HI[j, 1]
    if a1 != b1:
        return a1 < b1
    return HI[i, 2] < HI[j, 2]


@njit
def _heap_pop(S, HI, HF, tmpi, tmpf):
    """Pop the least timer into tmpi/tmpf."""
    n = S[S_HEAP_N] - 1
    S[S_HEAP_N] = n
    for c in range(HI_COLS):
        tmpi[c] = HI[0, c]
    tmpf[0] = HF[0, 0]
    tmpf[1] = HF[0, 1]
    if n == 0:
        return
    # move last to root and sift down
    for c in range(HI_COLS):
        HI[0, c] = HI[n, c]
    HF[0, 0] = HF[n, 0]
    HF[0, 1] = HF[n, 1]
    i = 0
    while True:
        left = 2 * i + 1
        if left >= n:
            break
        m = left
        right = left + 1
        if right < n and _less(HI, right, left):
            m = right
        if not _less(HI, m, i):
            break
        for c in range(HI_COLS):
            t = HI[i, c]
            HI[i, c] = HI[m, c]
            HI[m, c] = t
        for c in range(HF_COLS):
            t2 = HF[i, c]
            HF[i, c] = HF[m, c]
            HF[m, c] = t2
        i = m


@njit
def _px_units(px, dec):
    """``Decimal(repr(px))`` as an integer of 10**-dec, or -1 << 62 when it is not one."""
    p = POW10[dec]
    v = px * p
    if not (abs(v) < 1e15):
        return -(1 << 62)
    n = np.rint(v)
    if n / p != px:
        return -(1 << 62)
    return np.int64(n)


@njit(inline="always")
def _add_words(S, hi, lo, v):
    """``S[hi] * 2**32 + S[lo] += v`` (``|v| < 2**62``), keeping ``0 <= S[lo] < 2**32``: ``v >> 32``
    floors, so ``v == (v >> 32) * 2**32 + (v & 0xFFFFFFFF)`` for a negative ``v`` too."""
    w = S[lo] + (v & 0xFFFFFFFF)
    S[hi] += (v >> 32) + (w >> 32)
    S[lo] = w & 0xFFFFFFFF


@njit(inline="always")
def usdt(hi, lo):
    """Money kept as two words (integers of 1e-12 USDT), in USDT as a float."""
    return (hi * 4294967296.0 + lo) / 1e12


@njit(inline="always")
def size_of(lots, C):
    """The size of ``lots`` whole lots of the size step: the double nearest the exact decimal, as
    engine.contract.at_units gives it (one division of exact integers rounds once)."""
    return float(lots * C[C_STEP_NUM]) / POW10[C[C_STEP_DEC]]


@njit(inline="always")
def price_of(ticks, C):
    """The price of ``ticks`` whole ticks (OI_PX): the double nearest the exact decimal, as size_of
    gives a size (and engine.contract.at_units either); NaN for NO_PX, a market order's."""
    if ticks == NO_PX:
        return NAN
    return float(ticks * C[C_TICK_NUM]) / POW10[C[C_PX_DECIMALS]]


@njit
def _lots(q, C):
    """The size ``q`` as whole lots of the size step, or -1 << 62 when it is not exactly the size of
    some (the double size_of gives) or more than 2**52 of them."""
    n = np.rint(q * POW10[C[C_STEP_DEC]] / C[C_STEP_NUM])
    if not abs(n) < 2.0**52:
        return -(1 << 62)
    k = np.int64(n)
    if size_of(k, C) != q:
        return -(1 << 62)
    return k


@njit
def position_words(S, C):
    """The position in integers of 1e-12 (lots x step), as the risk rules' two words: ``hi * 2**32 +
    lo``, ``0 <= lo < 2**32``. Exact: _on_fill keeps ``|lots x C_STEP_NUM| < 2**52`` and ``m`` (the
    1e-12 units of one C_STEP_NUM) is below 2**40, so every product below stays within int64."""
    x = S[S_POS] * C[C_STEP_NUM]
    m = np.int64(10) ** (12 - C[C_STEP_DEC])
    xh = x >> 32  # x = xh * 2**32 + xl, 0 <= xl < 2**32 (xh floors for a negative x)
    xl = x & 0xFFFFFFFF
    mh = m >> 20  # m = mh * 2**20 + ml: xl * m itself would pass 2**63
    ml = m & 0xFFFFF
    a = xl * ml
    b = xl * mh  # b * 2**20 = (b >> 12) * 2**32 + (b & 0xFFF) * 2**20
    lo = a + ((b & 0xFFF) << 20)
    return xh * m + (b >> 12) + (lo >> 32), lo & 0xFFFFFFFF


@njit
def headroom(S, OI, RI, HI, NOUT, out_cap, lags, olat, work, inflight):
    """Room for one more step (ST_DONE), or the stop that makes it (ST_*): the replay loop checks it
    before each walk entry and timer, an engine driven per event before each event."""
    return _headroom(S, OI, RI, HI, NOUT, out_cap, lags, olat, work, inflight)


@njit
def _headroom(S, OI, RI, HI, NOUT, out_cap, lags, olat, work, inflight):
    if S[S_KEV_ASKED] > 0:  # the previous step started requests the advisor must answer first
        return ST_NEED_KEV
    for s in range(8):
        if NOUT[s] + MARGIN > out_cap:
            return ST_OUT_FULL
    # the ring: the next MARGIN orders must find rows no order in use holds
    mask = OI.shape[0] - 1
    oldest = S[S_OLDEST]
    while oldest <= S[S_OID]:
        r = oldest & mask
        if OI[r, OI_OID] == oldest and (
            OI[r, OI_STATUS] != DONE or OI[r, OI_REFS] != 0 or OI[r, OI_RESTING] != 0
        ):
            break  # still in use (an order the risk gateway refused never took a row)
        oldest += 1
    S[S_OLDEST] = oldest
    if S[S_OID] + MARGIN - oldest >= OI.shape[0]:
        return ST_GROW_ORDERS
    if S[S_HEAP_N] + MARGIN >= HI.shape[0]:
        return ST_GROW_HEAP
    if S[S_RID] + MARGIN - S[S_RID_OLDEST] >= RI.shape[0]:  # requests live in a ring, as orders do
        return ST_GROW_REQUESTS
    if S[S_NWORK] + STEP_ORDERS > work.shape[0] // 3:
        return ST_GROW_WORK
    if S[S_LAG_USED] + inflight.shape[0] > S[S_LAG_N]:  # a step starts fewer requests than fit in flight
        return ST_NEED_LAGS
    for k in range(3):  # a step sends fewer than MARGIN orders, cancels and reports
        if S[S_OLAT_USED + k] + MARGIN > olat.shape[1]:
            return ST_NEED_LATENCIES
    return ST_DONE


@njit
def _order_event(OUTI, OUTF, NOUT, C, OI, OF, oid, kind, ts_event, ts_recv, reason):
    k = NOUT[O_ORDER]
    NOUT[O_ORDER] = k + 1
    OUTI[O_ORDER, 0, k] = ts_event
    OUTI[O_ORDER, 1, k] = ts_recv
    OUTI[O_ORDER, 2, k] = oid
    OUTI[O_ORDER, 3, k] = kind
    OUTI[O_ORDER, 4, k] = OI[oid & (OI.shape[0] - 1), OI_SIDE]
    OUTI[O_ORDER, 5, k] = OI[oid & (OI.shape[0] - 1), OI_TYPE]
    OUTI[O_ORDER, 6, k] = reason
    OUTF[O_ORDER, 0, k] = price_of(OI[oid & (OI.shape[0] - 1), OI_PX], C)
    OUTF[O_ORDER, 1, k] = size_of(OI[oid & (OI.shape[0] - 1), OI_LOTS], C)


@njit
def _span(OUTI, NOUT, name, ref_kind, ref_n, start, end):
    k = NOUT[O_LATENCY]
    NOUT[O_LATENCY] = k + 1
    OUTI[O_LATENCY, 0, k] = start
    OUTI[O_LATENCY, 1, k] = end
    OUTI[O_LATENCY, 2, k] = name
    OUTI[O_LATENCY, 3, k] = ref_kind
    OUTI[O_LATENCY, 4, k] = ref_n


@njit
def _queue_note(OUTI, NOUT, now, rid, kind, depth):
    k = NOUT[O_KEV_QUEUE]
    NOUT[O_KEV_QUEUE] = k + 1
    OUTI[O_KEV_QUEUE, 0, k] = now
    OUTI[O_KEV_QUEUE, 1, k] = rid
    OUTI[O_KEV_QUEUE, 2, k] = kind
    OUTI[O_KEV_QUEUE, 3, k] = depth


@njit
def _risk_row(OUTI, OUTF, NOUT, now, oid, intent, side, otype, source, age, ok, reason, px, qty):
    k = NOUT[O_RISK]
    NOUT[O_RISK] = k + 1
    OUTI[O_RISK, 0, k] = now
    OUTI[O_RISK, 1, k] = oid
    OUTI[O_RISK, 2, k] = intent
    OUTI[O_RISK, 3, k] = side
    OUTI[O_RISK, 4, k] = otype
    OUTI[O_RISK, 5, k] = source
    OUTI[O_RISK, 6, k] = age
    OUTI[O_RISK, 7, k] = 1 if ok else 0
    OUTI[O_RISK, 8, k] = reason
    OUTF[O_RISK, 0, k] = px
    OUTF[O_RISK, 1, k] = qty


@njit(inline="always")
def position(S, C):
    """The engine's position in base units (its whole lots of the size step, as size_of gives them)."""
    return size_of(S[S_POS], C)


@njit
def _check_new(
    S,
    SF,
    C,
    CF,
    OI,
    OF,
    work,
    recent,
    eng_book,
    b_loc,
    side,
    otype,
    px,
    qty,
    reduce_only,
    slip,
    source,
    age,
    now,
    lpx,
    lq,
):
    """engine.risk.verdict, with the configured rules, on the engine's state for a new order (through
    the rules' entry: engine/risk_call.py); returns the reason code (R_OK when accepted)."""
    # the lots working orders have still open, by side
    buy = 0
    sell = 0
    for w in range(S[S_NWORK]):
        o = work[w] & (OI.shape[0] - 1)
        if OI[o, OI_SIDE] == BUY:
            buy += OI[o, OI_LOTS] - OI[o, OI_FILLED]
        else:
            sell += OI[o, OI_LOTS] - OI[o, OI_FILLED]
    # accepted new orders in the rate window: the ring drops the older ones (now never goes back)
    cutoff = now - RATE_WINDOW_NS
    head = S[S_RECENT_HEAD]
    tail = S[S_RECENT_TAIL]
    while head < tail and recent[head % recent.shape[0]] <= cutoff:
        head += 1
    S[S_RECENT_HEAD] = head
    has_book = S[S_ENG_BOOK] != 0
    book_ts = b_loc[S[S_ENG_ROW]] if has_book else 0
    # position and cash (integers of 1e-12) as the rules' two words each: hi * 2**32 + lo
    pos_hi, pos_lo = position_words(S, C)
    vi = (  # engine.risk_codes VI_* order
        pos_hi,
        pos_lo,
        S[S_CASH_HI],
        S[S_CASH_LO],
        S[S_POS],
        buy,
        sell,
        tail - head,
        S[S_KILL] != 0,
        side,
        otype,
        reduce_only,
        source,
        age,
        has_book,
        book_ts,
        now,
    )
    vf = (  # the limits in engine.risk_codes L_* order, then VF_*
        CF[CF_MAX_POSITION],
        CF[CF_MAX_DELTA],
        CF[CF_MAX_ORDER_QTY],
        CF[CF_MAX_SLIP],
        CF[CF_BAND],
        float(C[C_MAX_ORDERS_PER_S]),
        float(C[C_STALE_BOOK]),
        CF[CF_LOSS_STOP],
        float(C[C_MAX_ADVICE_AGE]),
        CF[CF_PF_MAX_DELTA],
        CF[CF_PF_MAX_GROSS],
        CF[CF_PF_LOSS_STOP],
        px,
        qty,
        slip,
        eng_book[0],
        eng_book[15],
        eng_book[30],
        eng_book[45],
        CF[CF_SIZE_STEP],
        CF[CF_TICK],
        SF[SF_OTHERS_DELTA],
        SF[SF_OTHERS_GROSS],
        SF[SF_OTHERS_PNL],
    )
    return risk_call.verdict(C[C_RISK_FN], vi, vf, C, C_RISK_RULES, eng_book, lpx, lq)


@njit
def _send_new(
    S,
    SF,
    C,
    CF,
    OI,
    OF,
    HI,
    HF,
    olat,
    work,
    recent,
    eng_book,
    b_loc,
    side,
    otype,
    px,
    qty,
    origin,
    slip,
    reduce_only,
    source,
    age,
    OUTI,
    OUTF,
    NOUT,
    lpx,
    lq,
):
    oid = S[S_OID] + 1
    S[S_OID] = oid
    now = S[S_NOW]
    reason = _check_new(
        S,
        SF,
        C,
        CF,
        OI,
        OF,
        work,
        recent,
        eng_book,
        b_loc,
        side,
        otype,
        px,
        qty,
        reduce_only,
        slip,
        source,
        age,
        now,
        lpx,
        lq,
    )
    if S[S_WHY] != U_NONE:
        return
    ok = reason == R_OK
    _risk_row(OUTI, OUTF, NOUT, now, oid, INTENT_NEW, side, otype, source, age, ok, reason, px, qty)
    if not ok:
        return
    lots = _lots(qty, C)
    if lots < 0:  # unreachable: the gateway's well_formed passes only whole lots
        S[S_WHY] = U_SIZE
        return
    tail = S[S_RECENT_TAIL]
    if tail - S[S_RECENT_HEAD] >= recent.shape[0]:
        S[S_WHY] = U_TABLE
        return
    recent[tail % recent.shape[0]] = now
    S[S_RECENT_TAIL] = tail + 1
    OI[oid & (OI.shape[0] - 1), OI_OID] = oid
    OI[oid & (OI.shape[0] - 1), OI_REFS] = 0
    OI[oid & (OI.shape[0] - 1), OI_RESTING] = 0
    OI[oid & (OI.shape[0] - 1), OI_SIDE] = side
    OI[oid & (OI.shape[0] - 1), OI_TYPE] = otype
    OI[oid & (OI.shape[0] - 1), OI_SENT] = now
    OI[oid & (OI.shape[0] - 1), OI_STATUS] = PENDING_NEW
    OI[oid & (OI.shape[0] - 1), OI_REDUCE] = 1 if reduce_only else 0
    OI[oid & (OI.shape[0] - 1), OI_SOURCE] = source
    OI[oid & (OI.shape[0] - 1), OI_AGE] = age
    OI[oid & (OI.shape[0] - 1), OI_PX] = np.int64(tick_index(px, CF[CF_TICK])) if otype == LIMIT else NO_PX
    OI[oid & (OI.shape[0] - 1), OI_LOTS] = lots
    OI[oid & (OI.shape[0] - 1), OI_FILLED] = 0
    OF[oid & (OF.shape[0] - 1), OF_SLIP] = slip
    nw = S[S_NWORK]
    if nw >= work.shape[0] // 3:  # unreachable: _headroom grows the list first
        S[S_WHY] = U_TABLE
        return
    work[nw] = oid
    S[S_NWORK] = nw + 1
    _order_event(OUTI, OUTF, NOUT, C, OI, OF, oid, OK_NEW, now, now, R_EMPTY)
    _span(OUTI, NOUT, SPAN_TICK_TO_ORDER, REF_ORDER, oid, origin, now)


@njit
def _send_cancel(S, C, OI, OF, HI, HF, olat, oid, OUTI, OUTF, NOUT):
    now = S[S_NOW]
    _risk_row(
        OUTI,
        OUTF,
        NOUT,
        now,
        oid,
        INTENT_CANCEL,
        OI[oid & (OI.shape[0] - 1), OI_SIDE],
        OI[oid & (OI.shape[0] - 1), OI_TYPE],
        SRC_CANCEL,
        -1,
        True,
        R_OK,
        price_of(OI[oid & (OI.shape[0] - 1), OI_PX], C),
        size_of(OI[oid & (OI.shape[0] - 1), OI_LOTS] - OI[oid & (OI.shape[0] - 1), OI_FILLED], C),
    )
    OI[oid & (OI.shape[0] - 1), OI_STATUS] = PENDING_CANCEL
    _order_event(OUTI, OUTF, NOUT, C, OI, OF, oid, OK_CANCEL, now, now, R_EMPTY)


@njit
def _cancel_all(S, C, OI, OF, HI, HF, olat, work, OUTI, OUTF, NOUT):
    n = S[S_NWORK]
    cap = work.shape[0] // 3
    snapshot = work[cap : 2 * cap]  # scratch: the list as it was (cancels do not change it)
    for w in range(n):
        snapshot[w] = work[w]
    for w in range(n):
        o = snapshot[w]
        if OI[o & (OI.shape[0] - 1), OI_TYPE] == LIMIT and (
            OI[o & (OI.shape[0] - 1), OI_STATUS] == PENDING_NEW
            or OI[o & (OI.shape[0] - 1), OI_STATUS] == LIVE
        ):
            _send_cancel(S, C, OI, OF, HI, HF, olat, o, OUTI, OUTF, NOUT)


@njit
def drop_id(S, count, ids, x):
    """Remove ``x`` from ``ids[:S[count]]``, a list kept in order (working orders, resting orders,
    Kev requests in flight); whether it was there."""
    n = S[count]
    for w in range(n):
        if ids[w] == x:
            for v in range(w, n - 1):
                ids[v] = ids[v + 1]
            S[count] = n - 1
            return True
    return False


@njit
def _finish(S, OI, work, oid):
    OI[oid & (OI.shape[0] - 1), OI_STATUS] = DONE
    drop_id(S, S_NWORK, work, oid)


@njit
def _target(S, SF, CF, now):
    flatten = S[S_CMD_ACTION] == A_FLATTEN
    m = CF[CF_MAX_POSITION]
    return kev_target(S[S_CMD] != 0, now, S[S_CMD_VALID_UNTIL], flatten, SF[SF_CMD_TARGET], m)


@njit(inline="always")
def _strategy(S, SF, C, CF, eng_book, now):
    """The configured strategy on the engine's book, in the core's units (engine.strategies): the
    quote size, position and limit in whole lots, Kev's target in lots; (bid lots, bid ticks, ask
    lots, ask ticks) back."""
    return call.quote(
        C[C_STRATEGY_FN], C[C_STRATEGY], eng_book, CF[CF_TICK], C[C_QUOTE_LOTS], S[S_LAST_LABEL_NAME],
        S[S_POS], _target(S, SF, CF, now) / CF[CF_SIZE_STEP], C[C_MAX_POS_LOTS], CF[CF_PARAMS:],
    )  # fmt: skip


@njit(inline="always")
def _quote_px(ticks, C):
    """The price of a strategy's ``ticks``; NaN (which the gateway refuses) for none the exchange
    takes: below one tick, or from 2**52 on, where prices are no longer whole ticks."""
    return price_of(ticks, C) if 1 <= ticks < 1 << 52 else NAN


@njit
def _requote(
    S,
    SF,
    C,
    CF,
    OI,
    OF,
    HI,
    HF,
    olat,
    work,
    recent,
    eng_book,
    b_loc,
    origin,
    force,
    OUTI,
    OUTF,
    NOUT,
    lpx,
    lq,
):
    now = S[S_NOW]
    if S[S_ENG_BOOK] == 0 or (not force and now - S[S_LAST_REQUOTE] < C[C_REQUOTE_MIN]):
        return
    S[S_LAST_REQUOTE] = now
    if now < S[S_EMERGENCY_UNTIL] or S[S_KILL] != 0:
        _cancel_all(S, C, OI, OF, HI, HF, olat, work, OUTI, OUTF, NOUT)
        return
    bid_lots, bid_t, ask_lots, ask_t = _strategy(S, SF, C, CF, eng_book, now)
    want_buy, want_sell = bid_lots > 0, ask_lots > 0
    bid_px, ask_px = _quote_px(bid_t, C), _quote_px(ask_t, C)
    if S[S_NWORK] == 0:
        if want_buy:
            _send_new(
                S,
                SF,
                C,
                CF,
                OI,
                OF,
                HI,
                HF,
                olat,
                work,
                recent,
                eng_book,
                b_loc,
                BUY,
                LIMIT,
                bid_px,
                size_of(bid_lots, C),
                origin,
                NAN,
                False,
                SRC_QUOTE,
                -1,
                OUTI,
                OUTF,
                NOUT,
                lpx,
                lq,
            )
            if S[S_WHY] != U_NONE:
                return
        if want_sell:
            _send_new(
                S,
                SF,
                C,
                CF,
                OI,
                OF,
                HI,
                HF,
                olat,
                work,
                recent,
                eng_book,
                b_loc,
                SELL,
                LIMIT,
                ask_px,
                size_of(ask_lots, C),
                origin,
                NAN,
                False,
                SRC_QUOTE,
                -1,
                OUTI,
                OUTF,
                NOUT,
                lpx,
                lq,
            )
        return
    for side in range(2):
        want = want_buy if side == BUY else want_sell
        qpx = bid_px if side == BUY else ask_px
        qt = bid_t if side == BUY else ask_t
        ql = bid_lots if side == BUY else ask_lots
        n = S[S_NWORK]
        sel = work[2 * (work.shape[0] // 3) :]  # scratch: this side's working limit orders
        m = 0
        for w in range(n):
            o = work[w]
            if OI[o & (OI.shape[0] - 1), OI_SIDE] == side and OI[o & (OI.shape[0] - 1), OI_TYPE] == LIMIT:
                sel[m] = o
                m += 1
        keep = False
        if want:
            for j in range(m):
                o = sel[j] & (OI.shape[0] - 1)
                if OI[o, OI_PX] == qt and OI[o, OI_LOTS] == ql:
                    keep = True
                    break
        for j in range(m):
            o = sel[j]
            if not keep and (
                OI[o & (OI.shape[0] - 1), OI_STATUS] == PENDING_NEW
                or OI[o & (OI.shape[0] - 1), OI_STATUS] == LIVE
            ):
                _send_cancel(S, C, OI, OF, HI, HF, olat, o, OUTI, OUTF, NOUT)
        if want and m == 0:
            _send_new(
                S,
                SF,
                C,
                CF,
                OI,
                OF,
                HI,
                HF,
                olat,
                work,
                recent,
                eng_book,
                b_loc,
                side,
                LIMIT,
                qpx,
                size_of(ql, C),
                origin,
                NAN,
                False,
                SRC_QUOTE,
                -1,
                OUTI,
                OUTF,
                NOUT,
                lpx,
                lq,
            )
            if S[S_WHY] != U_NONE:
                return


@njit
def leg_order(S, SF, C, CF, OI, work):
    """(side, qty) of the market order this core sends now towards Kev's target (``_rebalance``), or
    (NO_ORDER, 0.0): none while the advice is stale, the book missing, the last one too recent or a
    market order still working. A flatten sends what the quotes resting on its side leave uncovered."""
    now = S[S_NOW]
    if S[S_CMD] == 0 or now > S[S_CMD_VALID_UNTIL] or S[S_ENG_BOOK] == 0:
        return NO_ORDER, 0.0
    if now - S[S_LAST_REBALANCE] < C[C_REBALANCE_MIN]:
        return NO_ORDER, 0.0
    side, qty = rebalance_order(
        _target(S, SF, CF, now),
        S[S_POS],
        CF[CF_QUOTE_QTY],
        CF[CF_MAX_ORDER_QTY],
        CF[CF_SIZE_STEP],
        CF[CF_MIN_QTY],
    )
    if side == NO_ORDER:
        return NO_ORDER, 0.0
    same = 0  # lots resting on the order's side
    for w in range(S[S_NWORK]):
        o = work[w] & (OI.shape[0] - 1)
        if OI[o, OI_TYPE] == MARKET:
            return NO_ORDER, 0.0
        if OI[o, OI_SIDE] == side:
            same += OI[o, OI_LOTS] - OI[o, OI_FILLED]
    if S[S_CMD_ACTION] == A_FLATTEN:
        # reduce-only counts the quotes resting on its side (the gateway's reduce_only rule): flatten what
        # they leave uncovered, or wait for them (a requote or a fill) rather than be refused
        room = abs(S[S_POS]) - same
        if room < lots_of(qty, CF[CF_SIZE_STEP]):
            if room <= 0 or size_of(room, C) < CF[CF_MIN_QTY]:
                return NO_ORDER, 0.0
            qty = size_of(room, C)
    return side, qty


@njit
def _rebalance(
    S, SF, C, CF, OI, OF, HI, HF, olat, work, recent, eng_book, b_loc, origin, OUTI, OUTF, NOUT, lpx, lq
):
    side, qty = leg_order(S, SF, C, CF, OI, work)
    if side == NO_ORDER:
        return
    now = S[S_NOW]
    flatten = S[S_CMD_ACTION] == A_FLATTEN
    S[S_LAST_REBALANCE] = now
    _send_new(
        S,
        SF,
        C,
        CF,
        OI,
        OF,
        HI,
        HF,
        olat,
        work,
        recent,
        eng_book,
        b_loc,
        side,
        MARKET,
        NAN,
        qty,
        origin,
        SF[SF_CMD_SLIP],
        flatten,
        SRC_FLATTEN if flatten else SRC_KEV,
        now - S[S_CMD_TS_RECV],
        OUTI,
        OUTF,
        NOUT,
        lpx,
        lq,
    )


@njit
def _on_label(
    r,
    label_id,
    p_label32,
    S,
    SF,
    C,
    CF,
    OI,
    OF,
    RI,
    RF,
    HI,
    HF,
    olat,
    work,
    rest,
    kq,
    inflight,
    recent,
    eng_book,
    x_book,
    b_loc,
    levels,
    level_row0,
    lags,
    OUTI,
    OUTF,
    NOUT,
    lpx,
    lq,
):
    now = S[S_NOW]
    S[S_LAST_LABEL_NAME] = label_id
    origin = b_loc[r]
    if label_id == L_EMERGENCY:
        S[S_EMERGENCY_UNTIL] = now + C[C_EMERGENCY_HOLD]
        _cancel_all(S, C, OI, OF, HI, HF, olat, work, OUTI, OUTF, NOUT)
    if label_id != L_HOLD and now - S[S_LAST_KEV_OFFER] >= C[C_KEV_MIN_INTERVAL]:
        _offer_kev(
            r,
            label_id,
            float(p_label32),
            S,
            SF,
            C,
            CF,
            OI,
            OF,
            RI,
            RF,
            HI,
            HF,
            work,
            recent,
            eng_book,
            b_loc,
            levels,
            level_row0,
            kq,
            inflight,
            lags,
            OUTI,
            OUTF,
            NOUT,
            lpx,
            lq,
        )
        if S[S_WHY] != U_NONE:
            return
    if now - S[S_LAST_REQUOTE] >= C[C_REQUOTE_MIN]:
        _requote(
            S,
            SF,
            C,
            CF,
            OI,
            OF,
            HI,
            HF,
            olat,
            work,
            recent,
            eng_book,
            b_loc,
            origin,
            False,
            OUTI,
            OUTF,
            NOUT,
            lpx,
            lq,
        )
        if S[S_WHY] != U_NONE:
            return
    if S[S_CMD] != 0 and now <= S[S_CMD_VALID_UNTIL] and now - S[S_LAST_REBALANCE] >= C[C_REBALANCE_MIN]:
        if S[S_UNIT] != 0:  # a hub's instrument never trades its leg alone: the unit sends every leg
            if leg_order(S, SF, C, CF, OI, work)[0] != NO_ORDER:
                S[S_UNIT_DUE] = origin if origin > 0 else 1
            return
        _rebalance(
            S,
            SF,
            C,
            CF,
            OI,
            OF,
            HI,
            HF,
            olat,
            work,
            recent,
            eng_book,
            b_loc,
            origin,
            OUTI,
            OUTF,
            NOUT,
            lpx,
            lq,
        )


@njit
def _offer_kev(
    r,
    label_id,
    p_label,
    S,
    SF,
    C,
    CF,
    OI,
    OF,
    RI,
    RF,
    HI,
    HF,
    work,
    recent,
    eng_book,
    b_loc,
    levels,
    level_row0,
    kq,
    inflight,
    lags,
    OUTI,
    OUTF,
    NOUT,
    lpx,
    lq,
):
    now = S[S_NOW]
    S[S_LAST_KEV_OFFER] = now
    rid = S[S_RID] + 1
    S[S_RID] = rid
    # the labelled book's levels (the tape row r)
    j = r - level_row0
    bid0 = levels[j, 0]
    ask0 = levels[j, 30]
    mid = (bid0 + ask0) / 2.0
    spread = round_exact(ask0 - bid0, 10)
    imb = round_exact(imbalance_levels(levels[j]), 6)
    p = round_exact(p_label, 6)
    RI[rid & (RI.shape[0] - 1), RI_TS] = now
    RI[rid & (RI.shape[0] - 1), RI_LABEL] = label_id
    RI[rid & (RI.shape[0] - 1), RI_LABEL_SEQ] = S[S_LABELS] - 1
    RF[rid & (RF.shape[0] - 1), RF_P] = p
    RF[rid & (RF.shape[0] - 1), RF_MID] = mid
    RF[rid & (RF.shape[0] - 1), RF_SPREAD] = spread
    RF[rid & (RF.shape[0] - 1), RF_IMB] = imb
    RF[rid & (RF.shape[0] - 1), RF_POS] = position(S, C)
    RF[rid & (RF.shape[0] - 1), RF_MAXPOS] = CF[CF_MAX_POSITION]
    # KevQueue.offer
    n = S[S_KQ_N]
    drop, kind, enqueue = offer_plan(C[C_KEV_POLICY], n, C[C_KEV_QUEUE_MAX])
    for _ in range(drop):
        old = kq[0]
        for v in range(n - 1):
            kq[v] = kq[v + 1]
        n -= 1
        _queue_note(OUTI, NOUT, now, old, kind, n)
    if not enqueue:
        _queue_note(OUTI, NOUT, now, rid, kind, n)
        S[S_KQ_N] = n
        _kev_pump(
            S,
            SF,
            C,
            CF,
            OI,
            OF,
            RI,
            RF,
            HI,
            HF,
            work,
            recent,
            eng_book,
            b_loc,
            kq,
            inflight,
            lags,
            OUTI,
            OUTF,
            NOUT,
            lpx,
            lq,
        )
        return
    if n >= kq.shape[0]:  # unreachable: the table holds the configured queue
        S[S_WHY] = U_TABLE
        return
    kq[n] = rid
    n += 1
    S[S_KQ_N] = n
    _queue_note(OUTI, NOUT, now, rid, Q_ENQUEUED, n)
    _kev_pump(
        S,
        SF,
        C,
        CF,
        OI,
        OF,
        RI,
        RF,
        HI,
        HF,
        work,
        recent,
        eng_book,
        b_loc,
        kq,
        inflight,
        lags,
        OUTI,
        OUTF,
        NOUT,
        lpx,
        lq,
    )


@njit
def _kev_pump(
    S,
    SF,
    C,
    CF,
    OI,
    OF,
    RI,
    RF,
    HI,
    HF,
    work,
    recent,
    eng_book,
    b_loc,
    kq,
    inflight,
    lags,
    OUTI,
    OUTF,
    NOUT,
    lpx,
    lq,
):
    while S[S_INFLIGHT_N] < C[C_KEV_MAX_IN_FLIGHT]:
        if not _kev_start_next(S, SF, C, CF, OI, RI, RF, HI, HF, kq, inflight, lags, OUTI, OUTF, NOUT):
            break


@njit
def _kev_start_next(S, SF, C, CF, OI, RI, RF, HI, HF, kq, inflight, lags, OUTI, OUTF, NOUT):
    now = S[S_NOW]
    n = S[S_KQ_N]
    rid = -1
    while n > 0:  # KevQueue.take
        c = kq[0]
        for v in range(n - 1):
            kq[v] = kq[v + 1]
        n -= 1
        if is_stale(now, RI[c & (RI.shape[0] - 1), RI_TS], C[C_KEV_STALE]):
            _queue_note(OUTI, NOUT, now, c, Q_STALE, n)
            continue
        rid = c
        break
    S[S_KQ_N] = n
    if rid < 0:
        return False
    m = S[S_INFLIGHT_N]
    if m >= inflight.shape[0]:  # unreachable: the table holds the configured requests in flight
        S[S_WHY] = U_TABLE
        return False
    inflight[m] = rid
    S[S_INFLIGHT_N] = m + 1
    k = NOUT[O_KEV_REQUEST]
    NOUT[O_KEV_REQUEST] = k + 1
    ts = RI[rid & (RI.shape[0] - 1), RI_TS]
    OUTI[O_KEV_REQUEST, 0, k] = ts
    OUTI[O_KEV_REQUEST, 1, k] = now
    OUTI[O_KEV_REQUEST, 2, k] = rid
    OUTI[O_KEV_REQUEST, 3, k] = RI[rid & (RI.shape[0] - 1), RI_LABEL]
    OUTI[O_KEV_REQUEST, 4, k] = RI[rid & (RI.shape[0] - 1), RI_LABEL_SEQ]
    OUTI[O_KEV_REQUEST, 5, k] = now - ts
    OUTF[O_KEV_REQUEST, 0, k] = RF[rid & (RF.shape[0] - 1), RF_MID]
    OUTF[O_KEV_REQUEST, 1, k] = RF[rid & (RF.shape[0] - 1), RF_SPREAD]
    OUTF[O_KEV_REQUEST, 2, k] = RF[rid & (RF.shape[0] - 1), RF_IMB]
    OUTF[O_KEV_REQUEST, 3, k] = RF[rid & (RF.shape[0] - 1), RF_POS]
    _span(OUTI, NOUT, SPAN_KEV_QUEUE, REF_KEV, rid, ts, now)
    if C[C_EXTERNAL] == 0:
        _heap_push(S, HI, HF, OI, now + C[C_KEV_TIMEOUT], PRIO_KEV, T_KEV_TIMEOUT, rid, now, 0, 0.0, 0.0)
    RI[rid & (RI.shape[0] - 1), RI_STARTED] = now
    if C[C_KEV_ASK] != 0:
        # SimKevBackend.start asks the advisor now and schedules its reply: the run stops after this
        # step (ST_NEED_KEV), Python answers and kev_replied() schedules the reply under the seq taken
        # here, so it sorts among equal timers where the engine's would.
        RI[rid & (RI.shape[0] - 1), RI_OK] = -1
        RI[rid & (RI.shape[0] - 1), RI_DONE_SEQ] = S[S_HEAP_SEQ]
        S[S_HEAP_SEQ] += 1
        S[S_KEV_ASKED] += 1
        return True
    # SimKevBackend.start: RuleKev decides now; the reply is due after a lag drawn now
    RI[rid & (RI.shape[0] - 1), RI_OK] = _rule_kev(RI, RF, CF, rid)
    lag = lags[S[S_LAG_USED]]
    S[S_LAG_USED] += 1
    _heap_push(S, HI, HF, OI, now + lag, PRIO_KEV, T_KEV_DONE, rid, lag, 0, 0.0, 0.0)
    return True


@njit
def _rule_kev(RI, RF, CF, rid):
    """RuleKev's decision on request ``rid``'s context, into its row (fast_path writes the texts); 1 if
    it is a valid command, 0 if the schema refuses it (a target beyond the command's own bound: an
    instrument whose limits are scaled to its notional holds more than 10 units)."""
    i = rid & (RI.shape[0] - 1)
    action, target, hedge, slip, why = rule_decide(
        RI[i, RI_LABEL],
        RF[i, RF_P],
        RF[i, RF_MID],
        RF[i, RF_SPREAD],
        RF[i, RF_IMB],
        RF[i, RF_POS],
        RF[i, RF_MAXPOS],
        CF[CF_STEP_FRACTION],
        CF[CF_MIN_PROB],
    )
    RI[i, RI_ACTION] = action
    RI[i, RI_WHY] = why
    RF[i, RF_TARGET] = target
    RF[i, RF_HEDGE] = hedge
    RF[i, RF_SLIP] = slip
    # the one bound the rule's numbers can break (hedge is 0 or 1, slippage 1 to 10 bps)
    return 1 if within(target, -TARGET_POSITION_ABS_MAX, TARGET_POSITION_ABS_MAX) else 0


@njit
def kev_replied(S, HI, HF, OI, RI, rid, lag):
    """Request ``rid``'s reply (its verdict written in its row by fast_path) is due ``lag`` after it
    started."""
    i = rid & (RI.shape[0] - 1)
    due, seq = RI[i, RI_STARTED] + lag, RI[i, RI_DONE_SEQ]
    _heap_insert(S, HI, HF, OI, due, PRIO_KEV, seq, T_KEV_DONE, rid, lag, 0, 0.0, 0.0)
    S[S_KEV_ASKED] -= 1


@njit
def _inflight_pop(S, inflight, rid):
    return drop_id(S, S_INFLIGHT_N, inflight, rid)


@njit
def _engine_timer(
    tmpi,
    tmpf,
    S,
    SF,
    C,
    CF,
    OI,
    OF,
    RI,
    RF,
    HI,
    HF,
    olat,
    work,
    rest,
    kq,
    inflight,
    recent,
    eng_book,
    x_book,
    b_loc,
    lags,
    OUTI,
    OUTF,
    NOUT,
    lpx,
    lq,
):
    """The engine's timers: an exchange report reaching it (T_REPORT), a Kev request's timeout and
    its reply (T_KEV_TIMEOUT, T_KEV_DONE)."""
    kind = tmpi[3]
    a = tmpi[4]
    b = tmpi[5]
    now = S[S_NOW]
    if kind == T_REPORT:
        _engine_report(
            S,
            SF,
            C,
            CF,
            OI,
            OF,
            HI,
            HF,
            olat,
            work,
            recent,
            eng_book,
            b_loc,
            b & 0xFF,
            a,
            b >> 8,
            tmpf,
            tmpi[6],
            OUTI,
            OUTF,
            NOUT,
            lpx,
            lq,
        )
    elif kind == T_KEV_TIMEOUT:
        if _inflight_pop(S, inflight, a):
            _queue_note(OUTI, NOUT, now, a, Q_TIMEOUT, S[S_KQ_N])
            k = NOUT[O_KEV_RESPONSE]
            NOUT[O_KEV_RESPONSE] = k + 1
            OUTI[O_KEV_RESPONSE, 0, k] = now
            OUTI[O_KEV_RESPONSE, 1, k] = a
            OUTI[O_KEV_RESPONSE, 2, k] = 0
            OUTI[O_KEV_RESPONSE, 3, k] = now - b
            OUTI[O_KEV_RESPONSE, 4, k] = 1
            _kev_pump(
                S,
                SF,
                C,
                CF,
                OI,
                OF,
                RI,
                RF,
                HI,
                HF,
                work,
                recent,
                eng_book,
                b_loc,
                kq,
                inflight,
                lags,
                OUTI,
                OUTF,
                NOUT,
                lpx,
                lq,
            )
    elif kind == T_KEV_DONE:
        if not _inflight_pop(S, inflight, a):
            _queue_note(OUTI, NOUT, now, a, Q_LATE, S[S_KQ_N])
            return
        ok = RI[a & (RI.shape[0] - 1), RI_OK]
        k = NOUT[O_KEV_RESPONSE]
        NOUT[O_KEV_RESPONSE] = k + 1
        OUTI[O_KEV_RESPONSE, 0, k] = now
        OUTI[O_KEV_RESPONSE, 1, k] = a
        OUTI[O_KEV_RESPONSE, 2, k] = ok
        OUTI[O_KEV_RESPONSE, 3, k] = b
        OUTI[O_KEV_RESPONSE, 4, k] = 0
        _span(OUTI, NOUT, SPAN_KEV, REF_KEV, a, now - b, now)
        if ok != 1:  # a reply that is no valid command: the engine notes it and moves on
            _kev_pump(
                S, SF, C, CF, OI, OF, RI, RF, HI, HF, work, recent, eng_book, b_loc, kq, inflight, lags, OUTI,
                OUTF, NOUT, lpx, lq,
            )  # fmt: skip
            return
        cid = S[S_CMD_ID] + 1
        S[S_CMD_ID] = cid
        r = a & (RI.shape[0] - 1)
        ts_ctx = RI[r, RI_TS]
        _apply_command(
            S, SF, C, OUTI, OUTF, NOUT, cid, a, ts_ctx, RI[r, RI_ACTION], RF[r, RF_TARGET], RF[r, RF_HEDGE],
            RF[r, RF_SLIP],
        )  # fmt: skip
        if S[S_UNIT] == 0:  # a hub's unit sends every leg together, after every part is applied
            _rebalance(
                S, SF, C, CF, OI, OF, HI, HF, olat, work, recent, eng_book, b_loc, ts_ctx, OUTI, OUTF, NOUT,
                lpx, lq,
            )  # fmt: skip
        if S[S_WHY] != U_NONE:
            return
        _kev_pump(
            S,
            SF,
            C,
            CF,
            OI,
            OF,
            RI,
            RF,
            HI,
            HF,
            work,
            recent,
            eng_book,
            b_loc,
            kq,
            inflight,
            lags,
            OUTI,
            OUTF,
            NOUT,
            lpx,
            lq,
        )


@njit
def _apply_command(S, SF, C, OUTI, OUTF, NOUT, cid, rid, ts_ctx, action, target, hedge, slip):
    """Kev's command ``cid`` (the reply to request ``rid``, asked at ``ts_ctx``) becomes the engine's
    advice now, valid for the advice TTL, and a row of the command stream."""
    now = S[S_NOW]
    k = NOUT[O_COMMAND]
    NOUT[O_COMMAND] = k + 1
    valid_until = now + C[C_KEV_TTL]
    OUTI[O_COMMAND, 0, k] = ts_ctx
    OUTI[O_COMMAND, 1, k] = now
    OUTI[O_COMMAND, 2, k] = cid
    OUTI[O_COMMAND, 3, k] = rid
    OUTI[O_COMMAND, 4, k] = action
    OUTI[O_COMMAND, 5, k] = valid_until
    OUTF[O_COMMAND, 0, k] = target
    OUTF[O_COMMAND, 1, k] = hedge
    OUTF[O_COMMAND, 2, k] = slip
    S[S_CMD] = 1
    S[S_CMD_ACTION] = action
    S[S_CMD_TS_RECV] = now
    S[S_CMD_VALID_UNTIL] = valid_until
    SF[SF_CMD_TARGET] = target
    SF[SF_CMD_SLIP] = slip
    SF[SF_CMD_HEDGE] = hedge


@njit
def _engine_report(
    S,
    SF,
    C,
    CF,
    OI,
    OF,
    HI,
    HF,
    olat,
    work,
    recent,
    eng_book,
    b_loc,
    m,
    oid,
    arg,
    tmpf,
    ts_event,
    OUTI,
    OUTF,
    NOUT,
    lpx,
    lq,
):
    now = S[S_NOW]
    if m == M_ACK:
        if OI[oid & (OI.shape[0] - 1), OI_STATUS] == PENDING_NEW:
            OI[oid & (OI.shape[0] - 1), OI_STATUS] = LIVE
        _order_event(OUTI, OUTF, NOUT, C, OI, OF, oid, OK_ACK, ts_event, now, R_EMPTY)
        _span(OUTI, NOUT, SPAN_ORDER_ENTRY, REF_ORDER, oid, OI[oid & (OI.shape[0] - 1), OI_SENT], now)
    elif m == M_REJECT:
        _finish(S, OI, work, oid)
        _order_event(OUTI, OUTF, NOUT, C, OI, OF, oid, OK_REJECT, ts_event, now, arg)
    elif m == M_CANCEL_ACK:
        _finish(S, OI, work, oid)
        _order_event(OUTI, OUTF, NOUT, C, OI, OF, oid, OK_CANCEL_ACK, ts_event, now, R_EMPTY)
        _requote(
            S,
            SF,
            C,
            CF,
            OI,
            OF,
            HI,
            HF,
            olat,
            work,
            recent,
            eng_book,
            b_loc,
            now,
            True,
            OUTI,
            OUTF,
            NOUT,
            lpx,
            lq,
        )
    elif m == M_DONE:
        _finish(S, OI, work, oid)
        _order_event(OUTI, OUTF, NOUT, C, OI, OF, oid, OK_DONE, ts_event, now, arg)
    else:  # M_FILL: px, qty in tmpf, liquidity in arg
        _on_fill(S, C, OI, OF, oid, tmpf[0], tmpf[1], arg, ts_event, now, OUTI, OUTF, NOUT)


@njit
def _on_fill(S, C, OI, OF, oid, px, qty, liq, ts_event, now, OUTI, OUTF, NOUT):
    side = OI[oid & (OI.shape[0] - 1), OI_SIDE]
    pu = _px_units(px, C[C_PX_DECIMALS])
    lots = _lots(qty, C)
    if pu == -(1 << 62):
        S[S_WHY] = U_PX_DECIMALS
        return
    if lots < 0:
        S[S_WHY] = U_SIZE
        return
    # price x size exactly, pu x lots x C_STEP_NUM in 10**-(price decimals + step decimals) USDT, then
    # in the integers of 1e-12 USDT that money is kept in (half-even past 12 decimals)
    e = 12 - C[C_PX_DECIMALS] - C[C_STEP_DEC]
    scale = np.int64(10) ** abs(e)
    if lots > (1 << 62) // max(abs(pu), 1) // C[C_STEP_NUM] // (scale if e > 0 else 1):
        S[S_WHY] = U_OVERFLOW
        return
    x = pu * lots * C[C_STEP_NUM]
    notional = x * scale if e >= 0 else div_half_even(x, scale)
    num = C[C_MAKER_NUM] if liq == LIQ_MAKER else C[C_TAKER_NUM]
    ex = C[C_MAKER_EXP] if liq == LIQ_MAKER else C[C_TAKER_EXP]
    fee = mul_div_half_even(notional, num, np.int64(10) ** ex)  # |rate| < 1: no overflow
    if side == BUY:
        S[S_POS] += lots
        _add_words(S, S_CASH_HI, S_CASH_LO, -notional)
    else:
        S[S_POS] -= lots
        _add_words(S, S_CASH_HI, S_CASH_LO, notional)
    _add_words(S, S_CASH_HI, S_CASH_LO, -fee)
    _add_words(S, S_FEES_HI, S_FEES_LO, fee)
    # the risk rules read high words up to 2**53; position_words needs |lots x C_STEP_NUM| < 2**52
    if max(abs(S[S_CASH_HI]), abs(S[S_FEES_HI])) > 1 << 53 or abs(S[S_POS]) > (1 << 52) // C[C_STEP_NUM]:
        S[S_WHY] = U_OVERFLOW
        return
    OI[oid & (OI.shape[0] - 1), OI_FILLED] += lots
    k = NOUT[O_FILL]
    NOUT[O_FILL] = k + 1
    OUTI[O_FILL, 0, k] = ts_event
    OUTI[O_FILL, 1, k] = now
    OUTI[O_FILL, 2, k] = oid
    OUTI[O_FILL, 3, k] = side
    OUTI[O_FILL, 4, k] = liq
    OUTI[O_FILL, 5, k] = notional
    OUTI[O_FILL, 6, k] = fee
    OUTF[O_FILL, 0, k] = px
    OUTF[O_FILL, 1, k] = qty
    OUTF[O_FILL, 2, k] = position(S, C)


# ---------------------------------------------------------------- one event at a time
# The entries for a caller that owns the clock and the venue (engine/core.py): each is one event at
# S[S_NOW]; the caller checks headroom() first, then reads the rows the step wrote (orders to hand to
# the venue, Kev requests to ask) and S[S_WHY].


SCRATCH_F = 32 + HF_COLS  # a step's float scratch (CoreState.SCR): two walks' levels, a timer's floats


@njit(inline="always")
def _scratch_f(SCR):
    """A step's float scratch, zeroed: the levels a walk reads (lpx, lq) and a timer's floats."""
    SCR[:] = 0.0
    return SCR[0:16], SCR[16:32], SCR[32:SCRATCH_F]


@njit
def step_label(
    label_id, p_label, S, SF, C, CF, OI, OF, RI, RF, HI, HF, olat, work, rest, kq, inflight, recent,
    eng_book, x_book, b_loc, levels, lags, OUTI, OUTF, NOUT, SCR,
):  # fmt: skip
    """Laya's label of the book in ``levels[0]`` (received at ``b_loc[0]``) becomes visible."""
    lpx, lq, _ = _scratch_f(SCR)
    S[S_LABELS] += 1
    _on_label(
        0, label_id, p_label, S, SF, C, CF, OI, OF, RI, RF, HI, HF, olat, work, rest, kq, inflight, recent,
        eng_book, x_book, b_loc, levels, 0, lags, OUTI, OUTF, NOUT, lpx, lq,
    )  # fmt: skip


@njit
def step_report(
    m, oid, arg, px, qty, ts_event, S, SF, C, CF, OI, OF, HI, HF, olat, work, recent, eng_book, b_loc,
    OUTI, OUTF, NOUT, SCR,
):  # fmt: skip
    """The venue's report ``m`` (M_*) on order ``oid``: ``arg`` a reject or done reason (R_*) or a
    fill's liquidity (LIQ_*), ``px``/``qty`` a fill's."""
    lpx, lq, tmpf = _scratch_f(SCR)
    tmpf[0] = px
    tmpf[1] = qty
    _engine_report(
        S, SF, C, CF, OI, OF, HI, HF, olat, work, recent, eng_book, b_loc, m, oid, arg, tmpf, ts_event,
        OUTI, OUTF, NOUT, lpx, lq,
    )  # fmt: skip


@njit
def step_timer(
    kind, a, b, S, SF, C, CF, OI, OF, RI, RF, HI, HF, olat, work, rest, kq, inflight, recent, eng_book,
    x_book, b_loc, lags, OUTI, OUTF, NOUT, SCR, SCRI,
):  # fmt: skip
    """A Kev timer: T_KEV_TIMEOUT of request ``a`` started at ``b``, or T_KEV_DONE, its reply (the
    verdict in its row) after lag ``b``. ``SCRI``: HI_COLS int64 of scratch."""
    lpx, lq, tmpf = _scratch_f(SCR)
    tmpi = SCRI
    tmpi[:] = 0
    tmpi[0] = S[S_NOW]
    tmpi[1] = PRIO_KEV
    tmpi[3] = kind
    tmpi[4] = a
    tmpi[5] = b
    _engine_timer(
        tmpi, tmpf, S, SF, C, CF, OI, OF, RI, RF, HI, HF, olat, work, rest, kq, inflight, recent, eng_book,
        x_book, b_loc, lags, OUTI, OUTF, NOUT, lpx, lq,
    )  # fmt: skip


@njit
def step_command(
    cid, rid, ts_ctx, action, target, hedge, slip, S, SF, C, CF, OI, OF, HI, HF, olat, work, recent, eng_book,
    b_loc, OUTI, OUTF, NOUT, SCR,
):  # fmt: skip
    """Kev's portfolio command ``cid``, answering request ``rid`` of another instrument, sets this one's
    target (``action`` A_*, ``target``, ``hedge``: its pair's hedge ratio, ``slip``): the advice is this
    instrument's from now on, as if its own request had brought it, and it rebalances towards it."""
    lpx, lq, _ = _scratch_f(SCR)
    _apply_command(S, SF, C, OUTI, OUTF, NOUT, cid, rid, ts_ctx, action, target, hedge, slip)
    _rebalance(
        S, SF, C, CF, OI, OF, HI, HF, olat, work, recent, eng_book, b_loc, ts_ctx, OUTI, OUTF, NOUT, lpx, lq
    )


@njit
def step_command_part(
    cid, rid, ts_ctx, action, target, hedge, slip, S, SF, C, CF, OI, OF, HI, HF, olat, work, recent, eng_book,
    b_loc, OUTI, OUTF, NOUT, SCR,
):  # fmt: skip
    """Kev's portfolio command ``cid``: this instrument's part of it becomes its advice, without the
    order towards it: a hub's unit (engine/legs.py) sends every leg once every part is applied."""
    _apply_command(S, SF, C, OUTI, OUTF, NOUT, cid, rid, ts_ctx, action, target, hedge, slip)


@njit
def step_rebalance(
    origin, S, SF, C, CF, OI, OF, HI, HF, olat, work, recent, eng_book, b_loc, OUTI, OUTF, NOUT, SCR
):  # fmt: skip
    """This instrument's leg of a hub's unit: the market order towards its target (``leg_order``),
    through the risk gateway; ``origin``: when the command's context was taken."""
    lpx, lq, _ = _scratch_f(SCR)
    _rebalance(S, SF, C, CF, OI, OF, HI, HF, olat, work, recent, eng_book, b_loc, origin, OUTI, OUTF, NOUT, lpx, lq)


@njit
def step_hedge(
    side, lots, cross, cancel_oid, S, SF, C, CF, OI, OF, HI, HF, olat, work, recent, eng_book, b_loc, OUTI, OUTF,
    NOUT, SCR,
):  # fmt: skip
    """A legging residual of ``lots`` on this instrument is hedged now (engine/legs.py): a market order
    (``cross``), else a limit order at the far touch (the price that fills now, the rest resting there
    until the next check reprices it); ``cancel_oid`` (> 0): the previous hedge, cancelled first if it
    still works. Judged by the risk gateway as an order on Kev's command (a flatten's: reduce-only,
    source flatten, which the kill switch lets through). Returns the order's id."""
    lpx, lq, _ = _scratch_f(SCR)
    mask = OI.shape[0] - 1
    if cancel_oid > 0 and OI[cancel_oid & mask, OI_OID] == cancel_oid:
        st = OI[cancel_oid & mask, OI_STATUS]
        if OI[cancel_oid & mask, OI_TYPE] == LIMIT and (st == PENDING_NEW or st == LIVE):
            _send_cancel(S, C, OI, OF, HI, HF, olat, cancel_oid, OUTI, OUTF, NOUT)
    now = S[S_NOW]
    qty = size_of(lots, C)
    otype = MARKET
    px = NAN
    if not cross:
        otype = LIMIT
        px = eng_book[30] if side == BUY else eng_book[0]
    oid = S[S_OID] + 1
    flatten = S[S_CMD_ACTION] == A_FLATTEN  # a flatten's residual: reduce-only, as its legs were
    _send_new(
        S, SF, C, CF, OI, OF, HI, HF, olat, work, recent, eng_book, b_loc, side, otype, px, qty, now,
        SF[SF_CMD_SLIP], flatten, SRC_FLATTEN if flatten else SRC_KEV, now - S[S_CMD_TS_RECV], OUTI, OUTF,
        NOUT, lpx, lq,
    )  # fmt: skip
    return oid


@njit
def order_fill(OI, oid):
    """(lots filled, whether the order is done) of order ``oid`` as the engine knows it; (-1, True)
    when its row already serves another order."""
    r = oid & (OI.shape[0] - 1)
    if OI[r, OI_OID] != oid:
        return -1, True
    return OI[r, OI_FILLED], OI[r, OI_STATUS] == DONE


@njit
def step_kill(S, C, OI, OF, HI, HF, olat, work, OUTI, OUTF, NOUT):
    """The kill switch: no new orders from now on (the risk gateway's first rule); working limit
    orders are cancelled."""
    S[S_KILL] = 1
    _cancel_all(S, C, OI, OF, HI, HF, olat, work, OUTI, OUTF, NOUT)


@njit
def step_flatten(S, SF, C, CF, OI, OF, HI, HF, olat, work, recent, eng_book, b_loc, OUTI, OUTF, NOUT, SCR):
    """Reduce-only market orders (source flatten, ``max_order_qty`` at most each) for the part of the
    position that working market orders on the closing side do not cover yet. They pass the risk
    gateway like any order; the kill switch lets exactly these through (they can only shrink the
    position). Returns (orders sent, whether one was refused: the caller may try again later). The
    caller leaves room for 100 orders in the working list first."""
    lpx, lq, _ = _scratch_f(SCR)
    mask = OI.shape[0] - 1
    side = SELL if S[S_POS] > 0 else BUY
    covered = 0  # lots
    for w in range(S[S_NWORK]):
        o = work[w] & mask
        if OI[o, OI_TYPE] == MARKET and OI[o, OI_SIDE] == side:
            covered += OI[o, OI_LOTS] - OI[o, OI_FILLED]
    left = abs(S[S_POS]) - covered  # lots, counted down exactly (a float size would drift)
    cap = lots_within(CF[CF_MAX_ORDER_QTY], CF[CF_SIZE_STEP])
    now = S[S_NOW]
    sent = 0
    while sent < 100:
        lots = left if cap >= left else np.int64(cap)
        qty = size_of(lots, C)
        if lots <= 0 or qty < CF[CF_MIN_QTY]:
            return sent, False
        oid = S[S_OID] + 1
        _send_new(
            S, SF, C, CF, OI, OF, HI, HF, olat, work, recent, eng_book, b_loc, side, MARKET, NAN, qty, now,
            NAN, True, SRC_FLATTEN, -1, OUTI, OUTF, NOUT, lpx, lq,
        )  # fmt: skip
        if OI[oid & mask, OI_OID] != oid or OI[oid & mask, OI_STATUS] != PENDING_NEW:
            return sent, True
        sent += 1
        left -= lots
    return sent, False


@njit
def step_warm(S, SF, C, CF, OI, OF, work, recent, eng_book, b_loc, SCR):
    """The order decision path (the strategy, the risk rules) on the current book, results discarded,
    so the next decision finds its code and data in the CPU caches (live mode runs it between frames).
    It changes nothing a decision reads: the rate window drops only order times that the next risk
    check drops anyway. Returns how many risk checks it ran."""
    if S[S_ENG_BOOK] == 0:
        return 0
    lpx, lq, _ = _scratch_f(SCR)
    now = S[S_NOW]
    bid_lots, bid_t, ask_lots, ask_t = _strategy(S, SF, C, CF, eng_book, now)
    checks = 0
    for side in range(2):
        lots = bid_lots if side == BUY else ask_lots
        if lots > 0:
            px = _quote_px(bid_t if side == BUY else ask_t, C)
            _check_new(
                S, SF, C, CF, OI, OF, work, recent, eng_book, b_loc, side, LIMIT, px, size_of(lots, C),
                False, NAN, SRC_QUOTE, -1, now, lpx, lq,
            )  # fmt: skip
            checks += 1
    return checks


# ---------------------------------------------------------------- several instruments, one portfolio
# A portfolio engine (engine/instruments.py) keeps one core per instrument. What they share lives in
# two small arrays: PI (int64) the id counters, so order, request and command ids are unique across the
# portfolio, and PF (float64, a row per instrument) each instrument's money as the others' risk rules
# read it. Around every step of instrument i: pf_enter, the step, pf_leave. The timer seq and the Kev
# lags used are shared too: one clock orders every instrument's timers, one Kev draws their lags in the
# order they ask. PI_WALK and PI_CUR are the replay loop's (its place in the walk, the instrument of a
# stop). PI_HUB: Kev answers for the whole portfolio; PI_FAN: the request (+1) whose reply to the
# instrument PI_CUR has just become a command of the hub, which the other instruments take next.
PI_OID, PI_RID, PI_CMD_ID, PI_SEQ, PI_LAG_USED, PI_WALK, PI_CUR, PI_HUB, PI_FAN = 0, 1, 2, 3, 4, 5, 6, 7, 8
# PI_LEG_DUE: when a hub command's legs are checked for legging (engine/legs.py; 0: no check pending),
# a timer of priority PRIO_LEG on the one clock
PI_LEG_DUE = 9
PI_SIZE = 10
PRIO_LEG = 55  # no other timer or input has it: the leg check never ties with one
# PF_LEG: while a hub command's legs go out (engine/legs.py), the USD notional each instrument's leg adds:
# the portfolio rules judge each leg against the others after theirs, the portfolio after the command
PF_MARK, PF_DELTA, PF_GROSS, PF_PNL, PF_LEG = 0, 1, 2, 3, 4
PF_COLS = 5


@njit
def pf_enter(PI, PF, i, S, SF):
    """Before a step of instrument ``i``: the portfolio's id counters, and the rest of the portfolio
    (every other instrument, summed in instrument order) as its risk rules read it."""
    S[S_OID] = PI[PI_OID]
    S[S_RID] = PI[PI_RID]
    S[S_CMD_ID] = PI[PI_CMD_ID]
    S[S_HEAP_SEQ] = PI[PI_SEQ]
    S[S_LAG_USED] = PI[PI_LAG_USED]
    d = 0.0
    g = 0.0
    p = 0.0
    for j in range(PF.shape[0]):
        if j != i:
            leg = PF[j, PF_LEG]
            if leg == 0.0:
                d += PF[j, PF_DELTA]
                g += PF[j, PF_GROSS]
            else:  # its leg of the command going out: the others judged against it after its leg
                d += PF[j, PF_DELTA] + leg
                g += abs(PF[j, PF_DELTA] + leg)
            p += PF[j, PF_PNL]
    SF[SF_OTHERS_DELTA] = d
    SF[SF_OTHERS_GROSS] = g
    SF[SF_OTHERS_PNL] = p


@njit
def pf_leg(PF, i, S, SF, C, CF, OI, work):
    """Instrument ``i``'s leg of a hub's unit (engine/legs.py): the order ``leg_order`` sends now, as
    (side, lots), its USD notional at the mark in PF[i, PF_LEG] (0 without one, or no mark)."""
    side, qty = leg_order(S, SF, C, CF, OI, work)
    PF[i, PF_LEG] = 0.0
    if side == NO_ORDER:
        return NO_ORDER, 0
    lots = lots_of(qty, CF[CF_SIZE_STEP])
    m = PF[i, PF_MARK]
    if m > 0:
        PF[i, PF_LEG] = (qty if side == BUY else -qty) * m
    return side, np.int64(lots)


@njit
def pf_mark(PF, i, S, C, eng_book):
    """Instrument ``i``'s row of PF from its core: its mark (the mid of its last usable book) and its
    net delta, gross exposure and PnL at that mark."""
    bid = eng_book[0]
    ask = eng_book[30]
    if S[S_ENG_BOOK] != 0 and bid > 0 and ask > bid and math.isfinite(ask):
        PF[i, PF_MARK] = (bid + ask) / 2.0
    pos = position(S, C)
    m = PF[i, PF_MARK]
    delta = 0.0 if pos == 0 else pos * m  # no mark yet (NaN) and a position: the rules fail closed
    PF[i, PF_DELTA] = delta
    PF[i, PF_GROSS] = abs(delta)
    PF[i, PF_PNL] = usdt(S[S_CASH_HI], S[S_CASH_LO]) + delta


@njit
def pf_leave(PI, PF, i, S, C, eng_book):
    """After a step of instrument ``i``: the counters it moved, and its row of PF."""
    PI[PI_OID] = S[S_OID]
    PI[PI_RID] = S[S_RID]
    PI[PI_CMD_ID] = S[S_CMD_ID]
    PI[PI_SEQ] = S[S_HEAP_SEQ]
    PI[PI_LAG_USED] = S[S_LAG_USED]
    pf_mark(PF, i, S, C, eng_book)


@njit
def step_pull(S, C, OI, OF, HI, HF, olat, work, OUTI, OUTF, NOUT):
    """Another instrument of the portfolio saw EMERGENCY: quotes are pulled here too and stay pulled
    for the emergency hold, as on an EMERGENCY label of this instrument's own."""
    until = S[S_NOW] + C[C_EMERGENCY_HOLD]
    if until > S[S_EMERGENCY_UNTIL]:
        S[S_EMERGENCY_UNTIL] = until
    _cancel_all(S, C, OI, OF, HI, HF, olat, work, OUTI, OUTF, NOUT)


# ---------------------------------------------------------------- Kev as the portfolio hub
# What a hub's Kev context reads besides the cores (engine/instruments.py builds the context): every
# configured pair's fit (PS: a pair_state row per pair, engine/kev/pairs.py; PP: its leader's and
# follower's instrument, whether it has an observation yet and the time of the last) and each
# instrument's latest labels (LR: a row per instrument, the count seen, then a ring of LABELS_KEPT).
PP_LEADER, PP_FOLLOWER, PP_SEEN, PP_T = 0, 1, 2, 3
PP_COLS = 4
LABELS_KEPT = 3


@njit
def pf_observe(PF, PS, PP, i, t_ns, half_life_ns):
    """Instrument ``i`` has a new mark at ``t_ns`` (its book's receive time): every pair with it as a
    leg takes one observation of both legs' marks (a leg with no book yet: none)."""
    for k in range(PS.shape[0]):
        li = PP[k, PP_LEADER]
        fi = PP[k, PP_FOLLOWER]
        if i != li and i != fi:
            continue
        ml = PF[li, PF_MARK]
        mf = PF[fi, PF_MARK]
        if not (ml > 0 and mf > 0):  # NaN too
            continue
        dt = 0.0 if PP[k, PP_SEEN] == 0 else float(t_ns - PP[k, PP_T])
        pair_update(PS[k], math.log(ml), math.log(mf), dt, half_life_ns)
        PP[k, PP_SEEN] = 1
        PP[k, PP_T] = t_ns


@njit
def pf_note_label(LR, i, label):
    """Instrument ``i``'s label ``label`` became visible: the latest LABELS_KEPT are kept."""
    n = LR[i, 0]
    LR[i, 1 + n % LABELS_KEPT] = label
    LR[i, 0] = n + 1


def latest_labels(LR: np.ndarray, i: int) -> list[int]:
    """Instrument ``i``'s latest labels kept by :func:`pf_note_label`, the oldest first."""
    n = int(LR[i, 0])
    return [int(LR[i, 1 + k % LABELS_KEPT]) for k in range(max(0, n - LABELS_KEPT), n)]
