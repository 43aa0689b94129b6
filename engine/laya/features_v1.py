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

Two implementations, bit-identical on purpose (as for v0): :class:`FeaturesV1` is the per-tick
path (feed it trades with :meth:`FeaturesV1.on_trade`, ask for :meth:`FeaturesV1.features` at each
snapshot), :func:`features_v1_batch` the vectorised path over a whole session. Both sum level by
level and trade by trade in the same order (running sums, ``np.cumsum``; never pairwise
``ndarray.sum``), windows are differences of the same cumulative sums, and ``log1p`` is applied by
numpy to one contiguous float64 vector in both. ``tests/test_research.py`` checks equality with
``np.array_equal`` on simulated and real sessions. Change one, change the other, and bump the version.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from typing import Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engine.events import BOOK_LEVELS, STREAMS, BookSnapshot, Trade

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
_IX: Final = {name: i for i, name in enumerate(FEATURE_NAMES)}
# Columns that hold a non-negative quantity until log1p is applied at the end.
LOG_COLUMNS: Final = tuple(
    _IX[n]
    for n in (
        "slope_bid_5",
        "slope_ask_5",
        "slope_bid_15",
        "slope_ask_15",
        "depth_bid",
        "depth_ask",
        "notional_1s",
        "notional_5s",
        "trades_1s",
        "since_trade_ms",
    )
)
_LOG_IDX: Final = np.array(LOG_COLUMNS, dtype=np.intp)
_IMB0: Final = _IX["imb_l0"]
_CUM0: Final = _IX["imb_cum3"]
_SLOPE: Final = {("bid", 5): 21, ("ask", 5): 22, ("bid", 15): 23, ("ask", 15): 24}
_DEPTH: Final = {"bid": _IX["depth_bid"], "ask": _IX["depth_ask"]}
_FLOW0: Final = _IX["flow_imb_1s"]


def _finish(f: np.ndarray) -> np.ndarray:
    """log1p on :data:`LOG_COLUMNS` of a float64 row or matrix, through one contiguous vector."""
    if f.ndim == 1:
        f[_LOG_IDX] = np.log1p(np.ascontiguousarray(f[_LOG_IDX]))
    else:
        block = np.ascontiguousarray(f[:, _LOG_IDX]).ravel()
        f[:, _LOG_IDX] = np.log1p(block).reshape(f.shape[0], len(LOG_COLUMNS))
    return f.astype(np.float32)


# -- per tick ---------------------------------------------------------------------------------------


class FeaturesV1:
    """Per-tick v1 features for one symbol.

    Feed every public trade of the symbol with :meth:`on_trade` in ``(ts_recv, seq)`` order; ask for
    :meth:`features` at each snapshot. Trades received at or after the snapshot's ``ts_recv`` are
    ignored for it, so feeding a trade early never leaks it. Memory grows with the trades fed.
    """

    def __init__(self) -> None:
        self._ts: list[int] = []
        self._px: list[float] = []
        self._cum = [0.0]  # cumulative notional after each trade (index 0: before any)
        self._cum_buy = [0.0]
        self._bucket_buy = [0.0]  # cumulative buy notional at each bucket boundary k * V
        self._bucket_at: list[int] = []  # trade count (index + 1) that completed boundary k (k >= 1)
        self._bucket_imb: list[float] = []  # |buy - sell| / V of bucket k (k >= 1)

    def on_trade(self, trade: Trade) -> None:
        if self._ts and trade.ts_recv < self._ts[-1]:
            raise ValueError(
                f"trades must come in ts_recv order: ts_recv={trade.ts_recv} < previous {self._ts[-1]}"
            )
        notional = trade.px * trade.sz
        is_buy = 1.0 if trade.side == "buy" else 0.0
        c0 = self._cum[-1]
        b0 = self._cum_buy[-1]
        c1 = c0 + notional
        self._ts.append(trade.ts_recv)
        self._px.append(trade.px)
        self._cum.append(c1)
        self._cum_buy.append(b0 + notional * is_buy)
        k = len(self._bucket_buy)
        while k * VPIN_BUCKET_NOTIONAL <= c1:
            x = k * VPIN_BUCKET_NOTIONAL
            self._bucket_buy.append(b0 + (x - c0) * is_buy)
            buy = self._bucket_buy[k] - self._bucket_buy[k - 1]
            self._bucket_imb.append(abs(2.0 * buy - VPIN_BUCKET_NOTIONAL) / VPIN_BUCKET_NOTIONAL)
            self._bucket_at.append(len(self._ts))
            k += 1

    def features(self, book: BookSnapshot, out: np.ndarray | None = None) -> np.ndarray:
        """Features of ``book`` given the trades fed so far, shape ``(36,)`` float32."""
        f = [0.0] * N_FEATURES
        mid = _book_part(book, f)
        self._trade_part(book.ts_recv, mid, f)
        row = _finish(np.array(f, dtype=np.float64))
        if out is None:
            return row
        out[:] = row
        return out

    def _trade_part(self, t_ns: int, mid: float, f: list[float]) -> None:
        ts = self._ts
        m = bisect_left(ts, t_ns)  # trades strictly before t_ns
        cum, cum_buy = self._cum, self._cum_buy
        for w, window_ns in enumerate(FLOW_WINDOWS_NS):
            lo = bisect_left(ts, t_ns - window_ns, 0, m)
            vol = cum[m] - cum[lo]
            buy = cum_buy[m] - cum_buy[lo]
            if vol > 0.0:
                f[_FLOW0 + w] = (buy - (vol - buy)) / vol
            f[_FLOW0 + 2 + w] = vol
            if w == 0:
                f[_FLOW0 + 4] = float(m - lo)
        if m > 0:
            f[_FLOW0 + 5] = min((t_ns - ts[m - 1]) / 1e6, NO_TRADE_MS)
            if mid == mid:
                f[_FLOW0 + 6] = (self._px[m - 1] - mid) / mid * 1e4
        else:
            f[_FLOW0 + 5] = NO_TRADE_MS
        n_done = bisect_left(self._bucket_at, m + 1)  # boundaries completed by trades 1..m
        n_eff = min(n_done, VPIN_BUCKETS)
        if n_eff > 0:
            acc = 0.0
            for k in range(n_done - n_eff, n_done):
                acc += self._bucket_imb[k]
            f[_FLOW0 + 7] = acc / n_eff
        f[_FLOW0 + 8] = n_eff / VPIN_BUCKETS


def _book_part(book: BookSnapshot, f: list[float]) -> float:
    """Fill the book features into ``f``; returns the mid (NaN on a one-sided book)."""
    b0, a0 = book.bid_px[0], book.ask_px[0]
    qb0, qa0 = book.bid_sz[0], book.ask_sz[0]
    mid = (b0 + a0) / 2.0
    if not mid > 0.0:  # NaN (a missing side) or nonsense
        mid = math.nan
    if mid == mid:
        f[0] = (a0 - b0) / mid * 1e4
        if qb0 == qb0 and qa0 == qa0 and qb0 + qa0 > 0.0:
            f[1] = ((b0 * qa0 + a0 * qb0) / (qb0 + qa0) - mid) / mid * 1e4
    sb = sa = 0.0  # cumulative sizes
    nb = na = 0.0  # cumulative notionals
    deep_b = deep_a = math.nan  # deepest present price so far
    for i in range(BOOK_LEVELS):
        px, sz = book.bid_px[i], book.bid_sz[i]
        qb = 0.0
        if px == px and sz == sz:
            qb = sz
            nb += px * sz
            deep_b = px
        px, sz = book.ask_px[i], book.ask_sz[i]
        qa = 0.0
        if px == px and sz == sz:
            qa = sz
            na += px * sz
            deep_a = px
        if qb + qa > 0.0:
            f[_IMB0 + i] = (qb - qa) / (qb + qa)
        sb += qb
        sa += qa
        k = i + 1
        if k in CUM_LEVELS and sb + sa > 0.0:
            f[_CUM0 + CUM_LEVELS.index(k)] = (sb - sa) / (sb + sa)
        if k in SLOPE_LEVELS and mid == mid:
            dist_b = (mid - deep_b) / mid * 1e4
            dist_a = (deep_a - mid) / mid * 1e4
            if dist_b > 0.0 and nb > 0.0:
                f[_SLOPE["bid", k]] = nb / dist_b
            if dist_a > 0.0 and na > 0.0:
                f[_SLOPE["ask", k]] = na / dist_a
    f[_DEPTH["bid"]] = nb
    f[_DEPTH["ask"]] = na
    return mid


# -- batch ------------------------------------------------------------------------------------------


def _col(table: pa.Table, name: str) -> np.ndarray:
    return table.column(name).to_numpy(zero_copy_only=False).astype(np.float64, copy=False)


def _book_batch(table: pa.Table, f: np.ndarray) -> np.ndarray:
    n = table.num_rows
    b0, a0 = _col(table, "bid_px_0"), _col(table, "ask_px_0")
    qb0, qa0 = _col(table, "bid_sz_0"), _col(table, "ask_sz_0")
    with np.errstate(invalid="ignore", divide="ignore"):
        mid = (b0 + a0) / 2.0
        mid = np.where(mid > 0.0, mid, np.nan)
        has_mid = ~np.isnan(mid)
        f[:, 0] = np.where(has_mid, (a0 - b0) / mid * 1e4, 0.0)
        q = qb0 + qa0
        micro_ok = has_mid & ~np.isnan(qb0) & ~np.isnan(qa0) & (q > 0.0)
        f[:, 1] = np.where(micro_ok, ((b0 * qa0 + a0 * qb0) / q - mid) / mid * 1e4, 0.0)
        sb, sa = np.zeros(n), np.zeros(n)
        nb, na = np.zeros(n), np.zeros(n)
        deep_b, deep_a = np.full(n, np.nan), np.full(n, np.nan)
        for i in range(BOOK_LEVELS):
            px, sz = _col(table, f"bid_px_{i}"), _col(table, f"bid_sz_{i}")
            ok = ~np.isnan(px) & ~np.isnan(sz)
            qb = np.where(ok, sz, 0.0)
            nb = np.where(ok, nb + px * sz, nb)
            deep_b = np.where(ok, px, deep_b)
            px, sz = _col(table, f"ask_px_{i}"), _col(table, f"ask_sz_{i}")
            ok = ~np.isnan(px) & ~np.isnan(sz)
            qa = np.where(ok, sz, 0.0)
            na = np.where(ok, na + px * sz, na)
            deep_a = np.where(ok, px, deep_a)
            tot = qb + qa
            f[:, _IMB0 + i] = np.where(tot > 0.0, (qb - qa) / np.where(tot > 0.0, tot, 1.0), 0.0)
            sb = sb + qb
            sa = sa + qa
            k = i + 1
            if k in CUM_LEVELS:
                tot = sb + sa
                f[:, _CUM0 + CUM_LEVELS.index(k)] = np.where(
                    tot > 0.0, (sb - sa) / np.where(tot > 0.0, tot, 1.0), 0.0
                )
            if k in SLOPE_LEVELS:
                dist_b = (mid - deep_b) / mid * 1e4
                dist_a = (deep_a - mid) / mid * 1e4
                f[:, _SLOPE["bid", k]] = np.where(has_mid & (dist_b > 0.0) & (nb > 0.0), nb / dist_b, 0.0)
                f[:, _SLOPE["ask", k]] = np.where(has_mid & (dist_a > 0.0) & (na > 0.0), na / dist_a, 0.0)
        f[:, _DEPTH["bid"]] = nb
        f[:, _DEPTH["ask"]] = na
    return mid


class _TradeArrays:
    """One symbol's trades (sorted by ts_recv, seq) as the cumulative sums both paths share."""

    def __init__(self, trades: pa.Table) -> None:
        self.ts = trades.column("ts_recv").to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
        self.px = _col(trades, "px")
        notional = self.px * _col(trades, "sz")
        is_buy = np.where(
            pc.equal(trades.column("side"), "buy").to_numpy(zero_copy_only=False).astype(bool), 1.0, 0.0
        )
        self.cum = np.concatenate([[0.0], np.cumsum(notional)])
        self.cum_buy = np.concatenate([[0.0], np.cumsum(notional * is_buy)])
        # Volume buckets: boundary k (k >= 1) at cumulative notional k * V, completed by the first
        # trade whose cumulative notional reaches it; that trade is split pro rata at the boundary.
        total = float(self.cum[-1])
        ks = np.arange(1, int(total // VPIN_BUCKET_NOTIONAL) + 2)
        x = ks * VPIN_BUCKET_NOTIONAL
        x = x[x <= total]
        j = np.searchsorted(self.cum[1:], x, side="left")  # trade index (0-based) completing boundary k
        bucket_buy = np.concatenate([[0.0], self.cum_buy[j] + (x - self.cum[j]) * is_buy[j]])
        buy = bucket_buy[1:] - bucket_buy[:-1]
        self.bucket_imb = np.abs(2.0 * buy - VPIN_BUCKET_NOTIONAL) / VPIN_BUCKET_NOTIONAL
        self.bucket_at = j + 1  # trades (count) needed to complete boundary k


def _trade_batch(t_ns: np.ndarray, mid: np.ndarray, tr: _TradeArrays, f: np.ndarray) -> None:
    """Trade features for book times ``t_ns`` (and mids) into ``f``'s trade columns."""
    ts, cum, cum_buy = tr.ts, tr.cum, tr.cum_buy
    m = np.searchsorted(ts, t_ns, side="left")
    with np.errstate(invalid="ignore", divide="ignore"):
        for w, window_ns in enumerate(FLOW_WINDOWS_NS):
            lo = np.minimum(np.searchsorted(ts, t_ns - window_ns, side="left"), m)
            vol = cum[m] - cum[lo]
            buy = cum_buy[m] - cum_buy[lo]
            f[:, _FLOW0 + w] = np.where(vol > 0.0, (buy - (vol - buy)) / np.where(vol > 0.0, vol, 1.0), 0.0)
            f[:, _FLOW0 + 2 + w] = vol
            if w == 0:
                f[:, _FLOW0 + 4] = (m - lo).astype(np.float64)
        has = m > 0
        last = np.maximum(m - 1, 0)
        if len(ts):
            since = np.minimum((t_ns - ts[last]) / 1e6, NO_TRADE_MS)
            f[:, _FLOW0 + 5] = np.where(has, since, NO_TRADE_MS)
            ok = has & ~np.isnan(mid)
            f[:, _FLOW0 + 6] = np.where(ok, (tr.px[last] - mid) / mid * 1e4, 0.0)
        else:
            f[:, _FLOW0 + 5] = NO_TRADE_MS
    imb = tr.bucket_imb
    n_done = np.searchsorted(tr.bucket_at, m + 1, side="left")  # boundaries completed by trades 1..m
    n_eff = np.minimum(n_done, VPIN_BUCKETS)
    acc = np.zeros(len(t_ns))
    for o in range(VPIN_BUCKETS):  # oldest to newest, as the per-tick loop adds them
        use = o < n_eff
        k = np.where(use, n_done - n_eff + o, 0)
        acc = np.where(use, acc + (imb[k] if len(imb) else 0.0), acc)
    with np.errstate(invalid="ignore", divide="ignore"):
        f[:, _FLOW0 + 7] = np.where(n_eff > 0, acc / np.maximum(n_eff, 1), 0.0)
    f[:, _FLOW0 + 8] = n_eff / VPIN_BUCKETS


def _with_ts_recv(table: pa.Table, ts_recv: np.ndarray | None) -> pa.Table:
    if ts_recv is None:
        return table
    ts = np.asarray(ts_recv, dtype=np.int64)
    if ts.shape != (table.num_rows,):
        raise ValueError(f"ts_recv override has shape {ts.shape}, the table has {table.num_rows} rows")
    return table.set_column(table.schema.get_field_index("ts_recv"), "ts_recv", pa.array(ts))


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
    modelled feed latency sees the market at other local times than the recording did). Books are
    processed ``chunk_rows`` at a time, so float64 temporaries stay small on long sessions.
    """
    n = books.num_rows
    out = np.zeros((n, N_FEATURES), dtype=np.float32)
    if n == 0:
        return out
    books = _with_ts_recv(books, book_ts_recv)
    if trades is not None:
        trades = _with_ts_recv(trades, trade_ts_recv)
    t_all = books.column("ts_recv").to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    sym_all = books.column("symbol").to_numpy(zero_copy_only=False)
    by_symbol: dict[str, _TradeArrays] = {}
    for sym in sorted(set(sym_all.tolist())):
        if trades is not None and trades.num_rows:
            tr = trades.filter(pc.equal(trades.column("symbol"), sym))
            tr = tr.sort_by([("ts_recv", "ascending"), ("seq", "ascending")])
        else:
            tr = STREAMS["trade"].schema.empty_table()
        by_symbol[sym] = _TradeArrays(tr)
    for start in range(0, n, chunk_rows):
        chunk = books.slice(start, chunk_rows)
        f = np.zeros((chunk.num_rows, N_FEATURES), dtype=np.float64)
        mid = _book_batch(chunk, f)
        t_ns = t_all[start : start + chunk.num_rows]
        syms = sym_all[start : start + chunk.num_rows]
        for sym, tr in by_symbol.items():
            rows = np.flatnonzero(syms == sym)
            if rows.size == 0:
                continue
            sub = np.zeros((rows.size, N_FEATURES), dtype=np.float64)
            _trade_batch(t_ns[rows], mid[rows], tr, sub)
            f[rows, _FLOW0:] = sub[:, _FLOW0:]
        out[start : start + chunk.num_rows] = _finish(f)
    return out
