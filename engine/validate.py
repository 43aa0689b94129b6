"""Market data validation at the door: which book and trade rows the engine may see, and why not.

Replay checks a session's rows as they are read (a block of columns at a time, compiled), live mode
checks each decoded event's top of book. An invalid row is never repaired or reordered: it is
removed and reported (``engine.events.InputQuarantined``) under one short, stable reason code.

A book row is invalid when a side is empty (``empty_book``, ``one_sided_book``: no two-sided market to
trade against), a present level's price is NaN/inf/<= 0 or its size NaN/inf/< 0 (``nan_price``,
``inf_price``, ``nonpositive_price``, ``nonfinite_size``, ``negative_size``), the top is crossed or
locked (``crossed_book``, ``locked_book``), or the levels are not strictly ordered, gaps included
(``unordered_levels``). A trade is invalid on a bad price, a size NaN/inf/<= 0 (``nonpositive_size``)
or a side other than buy/sell (``bad_side``). A row whose ``ts_recv`` is before an earlier row's of
its stream and symbol is ``time_backwards``. Where a row has several faults the first in
:data:`REASONS` is named.
"""

from __future__ import annotations

import math
from typing import Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engine.events import BOOK_LEVELS, STREAMS, BookSnapshot, Trade
from engine.jit import njit

# Code i is REASONS[i]; 0 is a valid row. Lower codes win when a row has several faults.
REASONS: Final = (
    "",
    "empty_book",
    "one_sided_book",
    "nan_price",
    "inf_price",
    "nonpositive_price",
    "nonfinite_size",
    "negative_size",
    "nonpositive_size",
    "crossed_book",
    "locked_book",
    "unordered_levels",
    "bad_side",
    "time_backwards",
)
_CODE: Final = {r: i for i, r in enumerate(REASONS)}
EMPTY, ONE_SIDED, NAN_PX, INF_PX, NONPOS_PX = 1, 2, 3, 4, 5
NONFIN_SZ, NEG_SZ, NONPOS_SZ, CROSSED, LOCKED, UNORDERED, BAD_SIDE, BACKWARDS = range(6, 14)
LEVEL_COLUMNS: Final = [
    f"{s}_{i}" for s in ("bid_px", "bid_sz", "ask_px", "ask_sz") for i in range(BOOK_LEVELS)
]
_CHUNK = 65_536
_INF = math.inf


@njit(nogil=True)
def _side(levels: np.ndarray, r: int, px0: int, bids: bool) -> int:
    """The lowest fault code of one side's 15 levels (0: none)."""
    code, ended, prev = 0, False, 0.0
    for i in range(BOOK_LEVELS):
        p, s = levels[r, px0 + i], levels[r, px0 + BOOK_LEVELS + i]
        if math.isnan(p) and math.isnan(s):  # missing level: only ever after the last present one
            ended = True
            continue
        c = 0
        if math.isnan(p):
            c = NAN_PX
        elif math.isinf(p):
            c = INF_PX
        elif p <= 0.0:
            c = NONPOS_PX
        elif not math.isfinite(s):
            c = NONFIN_SZ
        elif s < 0.0:
            c = NEG_SZ
        elif ended or (i > 0 and not (p < prev if bids else p > prev)):
            c = UNORDERED
        if c and (code == 0 or c < code):
            code = c
        prev = p
    return code


@njit(nogil=True)
def _book_codes(levels: np.ndarray, out: np.ndarray) -> int:
    """Per row of (rows x 60) levels (bid_px, bid_sz, ask_px, ask_sz) its fault code; returns how many
    rows have one."""
    bad = 0
    n = BOOK_LEVELS
    for r in range(levels.shape[0]):
        b, a = levels[r, 0], levels[r, 2 * n]
        no_bid = math.isnan(b) and math.isnan(levels[r, n])
        no_ask = math.isnan(a) and math.isnan(levels[r, 3 * n])
        if no_bid and no_ask:
            code = EMPTY
        elif no_bid or no_ask:
            code = ONE_SIDED
        else:
            code = _side(levels, r, 0, True)
            c = _side(levels, r, 2 * n, False)
            if c and (code == 0 or c < code):
                code = c
            if code == 0 or code > CROSSED:
                if b > a:
                    code = CROSSED
                elif b == a:
                    code = LOCKED
        out[r] = code
        if code:
            bad += 1
    return bad


def book_codes(levels: np.ndarray) -> np.ndarray:
    """Fault code per row of a (rows x 60) float64 level block (0 = valid)."""
    out = np.zeros(len(levels), dtype=np.int8)
    if len(levels):
        _book_codes(np.ascontiguousarray(levels, dtype=np.float64), out)
    return out


def levels_of(table: pa.Table) -> np.ndarray:
    """A book table's 60 level columns as one (rows x 60) float64 array (nulls: NaN)."""
    return np.stack(
        [
            table.column(c).to_numpy(zero_copy_only=False).astype(np.float64, copy=False)
            for c in LEVEL_COLUMNS
        ],
        axis=1,
    )


def time_codes(ts_recv: np.ndarray, last: int | None = None) -> np.ndarray:
    """``time_backwards`` for each row whose ts_recv is before an earlier row's (``last``: the latest
    ts_recv before this block), else 0. Equal times are in order."""
    ts = np.asarray(ts_recv, dtype=np.int64)
    out = np.zeros(len(ts), dtype=np.int8)
    if not len(ts):
        return out
    before = np.empty_like(ts)
    before[0] = np.iinfo(np.int64).min if last is None else last
    np.maximum.accumulate(ts[:-1], out=before[1:])
    if last is not None and len(ts) > 1:
        np.maximum(before[1:], last, out=before[1:])
    out[ts < before] = BACKWARDS
    return out


def trade_codes(px: np.ndarray, sz: np.ndarray, side_code: np.ndarray) -> np.ndarray:
    """Fault code per trade (``side_code``: 0 buy, 1 sell, anything else is not a side)."""
    px, sz = np.asarray(px, dtype=np.float64), np.asarray(sz, dtype=np.float64)
    out = np.zeros(len(px), dtype=np.int8)
    ok = (px > 0) & (px < _INF) & (sz > 0) & (sz < _INF) & ((side_code == 0) | (side_code == 1))
    if ok.all():
        return out
    out[:] = np.select(
        [np.isnan(px), np.isinf(px), px <= 0, ~np.isfinite(sz), sz <= 0, ~ok],
        [NAN_PX, INF_PX, NONPOS_PX, NONFIN_SZ, NONPOS_SZ, BAD_SIDE],
        0,
    )
    return out


def side_codes(side: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """Aggressor side per trade: 0 buy, 1 sell, -1 anything else (the replay kernel's codes)."""
    buy = pc.fill_null(pc.equal(side, "buy"), False).to_numpy(zero_copy_only=False)
    sell = pc.fill_null(pc.equal(side, "sell"), False).to_numpy(zero_copy_only=False)
    return np.where(buy, 0, np.where(sell, 1, -1)).astype(np.int64)


def _merge(data: np.ndarray, time: np.ndarray) -> np.ndarray:
    return np.where(data != 0, data, time).astype(np.int8)


def book_table_codes(table: pa.Table) -> np.ndarray:
    """Fault code per row of one symbol's books15 table, in file order (levels, then time)."""
    codes = np.zeros(table.num_rows, dtype=np.int8)
    for start in range(0, table.num_rows, _CHUNK):  # (rows x 60) a chunk at a time: flat memory
        part = table.slice(start, _CHUNK)
        codes[start : start + part.num_rows] = book_codes(levels_of(part))
    recv = table.column("ts_recv").to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    return _merge(codes, time_codes(recv))


def trade_table_codes(table: pa.Table) -> np.ndarray:
    """Fault code per row of one symbol's trade table, in file order."""

    def col(name: str) -> np.ndarray:
        return table.column(name).to_numpy(zero_copy_only=False).astype(np.float64, copy=False)

    data = trade_codes(col("px"), col("sz"), side_codes(table.column("side")))
    recv = table.column("ts_recv").to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    return _merge(data, time_codes(recv))


def counts(codes: np.ndarray) -> dict[str, int]:
    """``{reason: rows}`` of the invalid rows, in :data:`REASONS` order."""
    found = np.bincount(codes.astype(np.int64), minlength=len(REASONS))
    return {REASONS[i]: int(found[i]) for i in range(1, len(REASONS)) if found[i]}


def quarantine_table(stream: str, table: pa.Table, codes: np.ndarray, first_seq: int = 0) -> pa.Table:
    """The ``input_quarantine`` events of ``table``'s invalid rows (``codes`` from the functions above)."""
    idx = np.flatnonzero(codes)
    rows = table.select(["ts_event", "ts_recv", "symbol", "seq"]).take(pa.array(idx))
    names = np.array(REASONS, dtype=object)
    schema = STREAMS["input_quarantine"].schema
    return pa.table(
        {
            "ts_event": rows.column("ts_event"),
            "ts_recv": rows.column("ts_recv"),
            "seq": pa.array(np.arange(first_seq, first_seq + len(idx), dtype=np.int64)),
            "symbol": pc.cast(rows.column("symbol"), pa.string()),
            "stream": pa.array([stream] * len(idx), pa.string()),
            "row_seq": rows.column("seq"),
            "reason": pa.array(names[codes[idx]].tolist(), pa.string()),
        }
    ).cast(schema)


# -- per event (live decode) ------------------------------------------------------------------


def book_reason(book: BookSnapshot) -> str:
    """:func:`book_codes` for one event: its reason, or '' when the book is valid."""
    row = np.array([book.bid_px + book.bid_sz + book.ask_px + book.ask_sz], dtype=np.float64)
    return REASONS[int(book_codes(row)[0])]


def top_ok(book: BookSnapshot) -> bool:
    """The tick path's check: a two-sided, uncrossed, finite, positive top with sizes >= 0 (a few float
    comparisons; NaN fails every one). Decoded frames were checked level by level by the codec."""
    b = book.bid_px[0]
    return 0.0 < b < book.ask_px[0] < _INF and 0.0 <= book.bid_sz[0] < _INF and 0.0 <= book.ask_sz[0] < _INF


def trade_reason(trade: Trade) -> str:
    """The reason ``trade`` is invalid, or ''."""
    side = 0 if trade.side == "buy" else 1 if trade.side == "sell" else -1
    return REASONS[int(trade_codes(np.array([trade.px]), np.array([trade.sz]), np.array([side]))[0])]


def trade_ok(trade: Trade) -> bool:
    """The tick path's check of a trade (a few comparisons)."""
    return 0.0 < trade.px < _INF and 0.0 < trade.sz < _INF and (trade.side == "buy" or trade.side == "sell")
