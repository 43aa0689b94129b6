"""Laya's input features, version ``v1``: 36 float32 values from one ``books15`` snapshot and the trades
received before it.

Book part (one snapshot; a level counts only when both its price and size are present; ``mid`` is
the top-of-book mid, and every feature that needs it is 0 on a one-sided book):

====  ==================  ====================================================================
 0    spread_bps          ``(ask_0 - bid_0) / mid * 1e4``
 1    microprice_bps      ``((bid_0 * qa_0 + ask_0 * qb_0) / (qb_0 + qa_0) - mid) / mid * 1e4``
 2-16 imb_l0 .. imb_l14   ``(qb_i - qa_i) / (qb_i + qa_i)`` per level (0 when both are missing)
17-20 imb_cum3 .. 15      the same over the top 3, 5, 10, 15 levels together
21-24 slope_{bid,ask}_*   ``log1p(notional of the top k levels / bp distance of the deepest of
                          them from mid)``, k = 5 and 15: depth per basis point (0 if undefined)
25-26 depth_{bid,ask}     ``log1p(notional of all 15 levels)``
====  ==================  ====================================================================

Trade part: only trades with ``ts_recv < book.ts_recv`` (strictly: at a tie the replay delivers the
book first), same symbol, in ``(ts_recv, seq)`` order. Notional is ``px * sz`` (USDT):

====  ==================  ====================================================================
27-28 flow_imb_1s, _5s    ``(buy - sell) / (buy + sell)`` notional over the last 1 s / 5 s
29-30 notional_1s, _5s    ``log1p`` of the notional traded over the last 1 s / 5 s
31    trades_1s           ``log1p`` of the number of trades over the last 1 s
32    since_trade_ms      ``log1p(min(ms since the last trade, 60000))`` (60000 before any trade)
33    last_trade_bps      ``(last trade px - mid) / mid * 1e4`` (0 before any trade)
34    vpin                VPIN-style toxicity: the trade stream is cut into volume buckets of
                          100k USDT notional from its start (a trade straddling a boundary is
                          split pro rata); per bucket ``|buy - sell| / bucket``; the mean over
                          the last 50 completed buckets (fewer early on; 0 before the first)
35    vpin_fill           completed buckets used / 50
====  ==================  ====================================================================

One implementation, compiled, over explicit state arrays (:func:`new_state`): :func:`v1_trade` is
the transition (one trade into the state), :func:`v1_features` the features of one book (60 floats
in the :mod:`engine.book` layout) given that state. :class:`FeaturesV1` (per tick: replay's tick
labels) holds one state and makes one compiled call per trade and per book; :func:`features_v1_batch`
(training, replay's batch labels) feeds a symbol's trades and computes its books by the same two
kernels in compiled loops. A book's features depend only on the trades before it, so feeding a
trade early never leaks it, and books may be asked for in any order.

The state keeps every trade fed (cumulative sums from the first one, so a window is the difference
of two of them): memory grows with the trades, 40 bytes each (up to twice that: room is doubled
when it runs out). Sums run trade by trade and level by level in float64; each value is rounded to
float32 once, ``log1p`` (the C library's, as ``math.log1p``) applied first for the log columns.
NumPy's vectorised ``log1p`` may differ from the C library's in the last float64 bit; none of those
differences survives the float32 rounding on the data in ``tests/engine/laya/test_features_v1.py``, which pins
the outputs. Change a kernel and bump ``FEATURE_VERSION``.
"""

from __future__ import annotations

import math
from typing import Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engine.book import as_levels
from engine.errors import DualhubError
from engine.events import BOOK_LEVELS, BookSnapshot, Trade
from engine.jit import njit
from engine.validate import levels_of

FEATURE_VERSION: Final = "v1"
CUM_LEVELS: Final = (3, 5, 10, 15)
SLOPE_LEVELS: Final = (5, 15)
FLOW_WINDOWS_NS: Final = (1_000_000_000, 5_000_000_000)
NO_TRADE_MS: Final = 60_000.0
VPIN_BUCKET_NOTIONAL: Final = 100_000.0
VPIN_BUCKETS: Final = 50

FEATURE_NAMES: Final = (
    ("spread_bps", "microprice_bps")
    + tuple(f"imb_l{i}" for i in range(BOOK_LEVELS))
    + tuple(f"imb_cum{k}" for k in CUM_LEVELS)
    + ("slope_bid_5", "slope_ask_5", "slope_bid_15", "slope_ask_15", "depth_bid", "depth_ask")
    + ("flow_imb_1s", "flow_imb_5s", "notional_1s", "notional_5s", "trades_1s", "since_trade_ms")
    + ("last_trade_bps", "vpin", "vpin_fill")
)
N_FEATURES: Final = len(FEATURE_NAMES)  # 36

_IMB0 = FEATURE_NAMES.index("imb_l0")
_DEPTH_BID = FEATURE_NAMES.index("depth_bid")
_FLOW0 = FEATURE_NAMES.index("flow_imb_1s")
# Per level i (0-based): the imb_cum column that ends at level i (-1: none), and the slope_bid column
# (slope_ask is the next one) that ends there.
_CUM_AT = np.full(BOOK_LEVELS, -1, dtype=np.int64)
_SLOPE_AT = np.full(BOOK_LEVELS, -1, dtype=np.int64)
for _k in CUM_LEVELS:
    _CUM_AT[_k - 1] = FEATURE_NAMES.index(f"imb_cum{_k}")
for _k in SLOPE_LEVELS:
    _SLOPE_AT[_k - 1] = FEATURE_NAMES.index(f"slope_bid_{_k}")
_W1, _W5 = FLOW_WINDOWS_NS
_V = VPIN_BUCKET_NOTIONAL
_BID_PX, _BID_SZ, _ASK_PX, _ASK_SZ = 0, BOOK_LEVELS, 2 * BOOK_LEVELS, 3 * BOOK_LEVELS

# v1_trade's answers
TAKEN, NO_ROOM, BACKWARDS, NOT_FINITE, TOO_LARGE = 0, 1, 2, 3, 4
# most VPIN bucket boundaries one trade may complete: more is a notional no market trades at once (a
# 1e300 print), and the state would need room for all of them
MAX_BOUNDARIES_PER_TRADE: Final = 1 << 20


# -- state ------------------------------------------------------------------------------------------
#
# ti int64 (2, cap + 1):   ti[0, i] ts_recv of trade i; ti[1, i] volume-bucket boundaries completed by
#                          the first i trades (ti[1, 0] = 0)
# tf float64 (3, cap + 1): tf[0, i] px of trade i; tf[1, i] notional of the first i trades; tf[2, i] buy
#                          notional of the first i trades (tf[1:, 0] = 0)
# bf float64 (2, bcap + 1): bf[0, k] buy notional at boundary k (cumulative notional k * 100k; bf[0, 0]
#                          = 0); bf[1, k] |buy - sell| / 100k of the bucket that ends at boundary k
# n  int64 (2,):           trades fed, boundaries completed


def new_state(trades: int = 1024, buckets: int = 64) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """An empty state (ti, tf, bf, n) with room for ``trades`` trades and ``buckets`` boundaries."""
    return (
        np.zeros((2, trades + 1), dtype=np.int64),
        np.zeros((3, trades + 1), dtype=np.float64),
        np.zeros((2, buckets + 1), dtype=np.float64),
        np.zeros(2, dtype=np.int64),
    )


def _grown(state: tuple[np.ndarray, ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The same state with twice the room for trades and for boundaries."""
    ti, tf, bf, n = state
    new = new_state(max(1, 2 * (ti.shape[1] - 1)), max(1, 2 * (bf.shape[1] - 1)))
    for old, big in zip((ti, tf, bf), new[:3], strict=True):
        big[:, : old.shape[1]] = old
    new[3][:] = n
    return new


@njit(nogil=True)
def v1_trade(ti, tf, bf, n, t_ns, px, sz, is_buy):  # pragma: no cover - compiled
    """Feed one trade (``ts_recv`` ``t_ns``, aggressor ``is_buy``) into the state. Returns TAKEN, or
    leaves the state as it was and returns NO_ROOM (grow it, call again), BACKWARDS (``t_ns`` before
    the previous trade's), NOT_FINITE (``px * sz`` is NaN or infinite) or TOO_LARGE (the trade would
    complete more than MAX_BOUNDARIES_PER_TRADE buckets)."""
    nt = n[0]
    if nt > 0 and t_ns < ti[0, nt - 1]:
        return BACKWARDS
    notional = px * sz
    if not abs(notional) < math.inf:
        return NOT_FINITE
    c0 = tf[1, nt]
    b0 = tf[2, nt]
    c1 = c0 + notional
    k = n[1] + 1  # the next boundary
    # the first boundary past c1 (the smallest last >= k with last * V > c1), found without stepping
    # one bucket at a time: a huge notional would take forever and then need unbounded room
    if c1 / _V - k > MAX_BOUNDARIES_PER_TRADE:
        return TOO_LARGE
    last = k
    if c1 >= k * _V:
        last = max(k, int(c1 / _V))
    while last > k and (last - 1) * _V > c1:
        last -= 1
    while last * _V <= c1:
        last += 1
    if nt + 1 >= ti.shape[1] or last - 1 >= bf.shape[1]:
        return NO_ROOM
    buy = 1.0 if is_buy else 0.0
    ti[0, nt] = t_ns
    tf[0, nt] = px
    tf[1, nt + 1] = c1
    tf[2, nt + 1] = b0 + notional * buy
    while k < last:  # boundary k at cumulative notional k * V falls inside this trade: split it there
        x = k * _V
        bf[0, k] = b0 + (x - c0) * buy
        bucket_buy = bf[0, k] - bf[0, k - 1]
        bf[1, k] = abs(2.0 * bucket_buy - _V) / _V
        k += 1
    n[1] = last - 1
    ti[1, nt + 1] = last - 1
    n[0] = nt + 1
    return TAKEN


@njit(nogil=True, inline="always")
def _first_at_or_after(ts, hi, t):  # pragma: no cover - compiled
    """The first index in ``ts[:hi]`` (ascending) whose value is >= ``t`` (``hi`` if none)."""
    lo = 0
    while lo < hi:
        mid = (lo + hi) >> 1
        if ts[mid] < t:
            lo = mid + 1
        else:
            hi = mid
    return lo


@njit(nogil=True)
def v1_features(book, t_ns, ti, tf, bf, n, out):  # pragma: no cover - compiled
    """Features of ``book`` (60 float64, NaN = missing level) received at ``t_ns``, given the trades in
    the state, into ``out`` (float32, 36)."""
    for j in range(N_FEATURES):
        out[j] = 0.0
    # book part
    b0 = book[_BID_PX]
    a0 = book[_ASK_PX]
    qb0 = book[_BID_SZ]
    qa0 = book[_ASK_SZ]
    mid = (b0 + a0) / 2.0
    if not mid > 0.0:  # NaN (a missing side) or nonsense
        mid = math.nan
    if mid == mid:
        out[0] = (a0 - b0) / mid * 1e4
        if qb0 == qb0 and qa0 == qa0 and qb0 + qa0 > 0.0:
            out[1] = ((b0 * qa0 + a0 * qb0) / (qb0 + qa0) - mid) / mid * 1e4
    sb = 0.0  # cumulative sizes
    sa = 0.0
    nb = 0.0  # cumulative notionals
    na = 0.0
    deep_b = math.nan  # deepest present price so far
    deep_a = math.nan
    for i in range(BOOK_LEVELS):
        px = book[_BID_PX + i]
        sz = book[_BID_SZ + i]
        qb = 0.0
        if px == px and sz == sz:
            qb = sz
            nb += px * sz
            deep_b = px
        px = book[_ASK_PX + i]
        sz = book[_ASK_SZ + i]
        qa = 0.0
        if px == px and sz == sz:
            qa = sz
            na += px * sz
            deep_a = px
        if qb + qa > 0.0:
            out[_IMB0 + i] = (qb - qa) / (qb + qa)
        sb += qb
        sa += qa
        c = _CUM_AT[i]
        if c >= 0 and sb + sa > 0.0:
            out[c] = (sb - sa) / (sb + sa)
        s = _SLOPE_AT[i]
        if s >= 0 and mid == mid:
            dist_b = (mid - deep_b) / mid * 1e4
            dist_a = (deep_a - mid) / mid * 1e4
            if dist_b > 0.0 and nb > 0.0:
                out[s] = math.log1p(nb / dist_b)
            if dist_a > 0.0 and na > 0.0:
                out[s + 1] = math.log1p(na / dist_a)
    out[_DEPTH_BID] = math.log1p(nb)
    out[_DEPTH_BID + 1] = math.log1p(na)
    # trade part: trades 0..m-1 came strictly before the book
    m = _first_at_or_after(ti[0], n[0], t_ns)
    for w in range(2):
        lo = _first_at_or_after(ti[0], m, t_ns - (_W1 if w == 0 else _W5))
        vol = tf[1, m] - tf[1, lo]
        buy = tf[2, m] - tf[2, lo]
        if vol > 0.0:
            out[_FLOW0 + w] = (buy - (vol - buy)) / vol
        out[_FLOW0 + 2 + w] = math.log1p(vol)
        if w == 0:
            out[_FLOW0 + 4] = math.log1p(float(m - lo))
    since = NO_TRADE_MS
    if m > 0:
        since = (t_ns - ti[0, m - 1]) / 1e6
        if since > NO_TRADE_MS:
            since = NO_TRADE_MS
        if mid == mid:
            out[_FLOW0 + 6] = (tf[0, m - 1] - mid) / mid * 1e4
    out[_FLOW0 + 5] = math.log1p(since)
    done = ti[1, m]  # boundaries completed by trades 0..m-1
    used = min(done, VPIN_BUCKETS)
    if used > 0:
        acc = 0.0
        for k in range(done - used + 1, done + 1):  # oldest first
            acc += bf[1, k]
        out[_FLOW0 + 7] = acc / used
    out[_FLOW0 + 8] = used / VPIN_BUCKETS


# -- per tick ---------------------------------------------------------------------------------------


class FeaturesV1:
    """Per-tick v1 features for one symbol.

    Feed every public trade of the symbol with :meth:`on_trade` in ``(ts_recv, seq)`` order; ask for
    :meth:`features` at each snapshot. Trades received at or after the snapshot's ``ts_recv`` are
    ignored for it, so feeding a trade early never leaks it. Memory grows with the trades fed.
    """

    def __init__(self) -> None:
        self._ti, self._tf, self._bf, self._n = new_state()

    def on_trade(self, trade: Trade) -> None:
        ts, px, sz, buy = trade.ts_recv, trade.px, trade.sz, trade.side == "buy"
        answer = v1_trade(self._ti, self._tf, self._bf, self._n, ts, px, sz, buy)
        while answer == NO_ROOM:
            self._ti, self._tf, self._bf, self._n = _grown((self._ti, self._tf, self._bf, self._n))
            answer = v1_trade(self._ti, self._tf, self._bf, self._n, ts, px, sz, buy)
        if answer != TAKEN:
            _refuse(answer, ts, px, sz, int(self._ti[0, self._n[0] - 1]) if self._n[0] else 0)

    def features(self, book: BookSnapshot, out: np.ndarray | None = None) -> np.ndarray:
        """Features of ``book`` given the trades fed so far, shape ``(36,)`` float32. ``out``, if given,
        must be a contiguous float32 array of shape ``(36,)``; it is filled and returned."""
        if out is None:
            out = np.empty(N_FEATURES, dtype=np.float32)
        elif out.dtype != np.float32 or out.shape != (N_FEATURES,):  # a float64 row would skip the rounding
            raise ValueError(f"out must be float32 of shape ({N_FEATURES},), got {out.dtype} {out.shape}")
        v1_features(as_levels(book), book.ts_recv, self._ti, self._tf, self._bf, self._n, out)
        return out


def _refuse(answer: int, ts: int, px: float, sz: float, previous: int) -> None:
    if answer == BACKWARDS:
        raise ValueError(f"trades must come in ts_recv order: ts_recv={ts} < previous {previous}")
    if answer == TOO_LARGE:
        raise DualhubError(
            f"trade at ts_recv={ts} has px * sz = {px!r} * {sz!r}, a notional no market trades at once"
            " (a bad print: the recorder and importers quarantine such trades)"
        )
    raise DualhubError(f"trade at ts_recv={ts} has px * sz = {px!r} * {sz!r}, not a finite notional")


# -- batch ------------------------------------------------------------------------------------------


@njit(nogil=True)
def _feed(ti, tf, bf, n, ts, px, sz, is_buy, start):  # pragma: no cover - compiled
    """:func:`v1_trade` for trades ``start..``; returns (the trade it stopped at, its answer)."""
    for i in range(start, ts.shape[0]):
        answer = v1_trade(ti, tf, bf, n, ts[i], px[i], sz[i], is_buy[i])
        if answer != TAKEN:
            return i, answer
    return ts.shape[0], TAKEN


@njit(nogil=True)
def _rows(levels, t_ns, rows, ti, tf, bf, n, out):  # pragma: no cover - compiled
    """:func:`v1_features` of the books ``rows`` (indices into ``levels``, ``t_ns`` and ``out``)."""
    for r in rows:
        v1_features(levels[r], t_ns[r], ti, tf, bf, n, out[r])


def _state_of(trades: pa.Table, ts_recv: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The state after one symbol's trades, fed in ``(ts_recv, seq)`` order."""
    order = np.lexsort((trades.column("seq").to_numpy(zero_copy_only=False), ts_recv))
    ts = np.ascontiguousarray(ts_recv[order], dtype=np.int64)
    px = trades.column("px").to_numpy(zero_copy_only=False).astype(np.float64, copy=False)[order]
    sz = trades.column("sz").to_numpy(zero_copy_only=False).astype(np.float64, copy=False)[order]
    is_buy = pc.equal(trades.column("side"), "buy").to_numpy(zero_copy_only=False).astype(bool)[order]
    state = new_state(len(ts), 64)
    at = 0
    while True:
        at, answer = _feed(*state, ts, px, sz, is_buy, at)
        if answer == TAKEN:
            return state
        if answer != NO_ROOM:
            _refuse(answer, int(ts[at]), float(px[at]), float(sz[at]), int(ts[at - 1]) if at else 0)
        state = _grown(state)


def _ts_recv(table: pa.Table, override: np.ndarray | None) -> np.ndarray:
    if override is None:
        return table.column("ts_recv").to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    ts = np.asarray(override, dtype=np.int64)
    if ts.shape != (table.num_rows,):
        raise ValueError(f"ts_recv override has shape {ts.shape}, the table has {table.num_rows} rows")
    return ts


def features_v1_batch(
    books: pa.Table,
    trades: pa.Table | None,
    *,
    book_ts_recv: np.ndarray | None = None,
    trade_ts_recv: np.ndarray | None = None,
    chunk_rows: int = 65_536,
) -> np.ndarray:
    """Features of every row of a ``books15`` table, shape ``(n, 36)`` float32, row for row equal to
    :meth:`FeaturesV1.features` fed with the same symbol's ``trades`` (``None``: no trade stream).

    ``book_ts_recv`` / ``trade_ts_recv`` replace the tables' ``ts_recv`` columns (a replay with
    modelled feed latency sees the market at other local times than the recording did). Book levels
    are read ``chunk_rows`` rows at a time, so the float64 copy stays small on long sessions.
    """
    n = books.num_rows
    out = np.zeros((n, N_FEATURES), dtype=np.float32)
    if n == 0:
        return out
    t_books = _ts_recv(books, book_ts_recv)
    t_trades = _ts_recv(trades, trade_ts_recv) if trades is not None else None
    sym_books = books.column("symbol").to_numpy(zero_copy_only=False)
    sym_trades = trades.column("symbol").to_numpy(zero_copy_only=False) if trades is not None else None
    states = {}
    for sym in sorted(set(sym_books.tolist())):
        if trades is None or t_trades is None or sym_trades is None:
            states[sym] = new_state(0, 0)
            continue
        mine = np.flatnonzero(sym_trades == sym)
        states[sym] = _state_of(trades.take(mine), t_trades[mine])
    for start in range(0, n, chunk_rows):
        chunk = books.slice(start, chunk_rows)
        levels = levels_of(chunk)
        t_ns = t_books[start : start + chunk.num_rows]
        syms = sym_books[start : start + chunk.num_rows]
        part = out[start : start + chunk.num_rows]
        for sym, state in states.items():
            rows = np.flatnonzero(syms == sym)
            if rows.size:
                _rows(levels, t_ns, rows, *state, part)
    return out
