"""The core's layout: the codes its rows and stops carry, and the slot of every value in its state
arrays (S, SF: scalars; C, CF: configuration; OI/OF: the order table; RI/RF: the request table; HI/HF:
the timer heap; olat; the output streams). Every transition indexes the arrays by these names, and
``engine/state.py`` sizes and fills the arrays by them.
"""

from __future__ import annotations

import math

import numpy as np

from engine.risk_codes import N_RULES, REASONS
from engine.strategies import call

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
# A recorded model's row (C_OLAT_KEYED) is its whole table instead (engine.latency.recorded): the number
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
