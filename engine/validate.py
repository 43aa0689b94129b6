"""Market data validation at the door: which book and trade rows the engine may see, and why not.

Replay checks a session's rows as they are read (a block of columns at a time, compiled), live mode
checks each decoded event's top of book. An invalid row is never repaired or reordered: it is
removed and reported (``engine.events.InputQuarantined``) under one short, stable reason code.

A book row is invalid when a side is empty (``empty_book``, ``one_sided_book``: no two-sided market to
trade against), a present level's price is NaN/inf/<= 0 or its size NaN/inf/< 0 (``nan_price``,
``inf_price``, ``nonpositive_price``, ``nonfinite_size``, ``negative_size``), the top is crossed or
locked (``crossed_book``, ``locked_book``), or the levels are not strictly ordered, gaps included
(``unordered_levels``). A trade is invalid on a bad price, a size NaN/inf/<= 0 (``nonpositive_size``)
or a side other than buy/sell (``bad_side``). A price outside [1e-12, 1e12] is ``price_out_of_range``
(no market has it). A row whose ``ts_recv`` is before an earlier row's of its stream and symbol is
``time_backwards``; one stamped (ts_event or ts_recv) before 0 or after 2200 is ``bad_time``. Where
a row has several faults the first in :data:`REASONS` is named.

The second half of this module (:class:`WireGuard`) is what frames must satisfy at the wire, before
they become events at all: recorder, live mode and importers call it through the codec.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engine.book import valid_top
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
    "price_out_of_range",
    "bad_time",
)
_CODE: Final = {r: i for i, r in enumerate(REASONS)}
EMPTY, ONE_SIDED, NAN_PX, INF_PX, NONPOS_PX = 1, 2, 3, 4, 5
NONFIN_SZ, NEG_SZ, NONPOS_SZ, CROSSED, LOCKED, UNORDERED, BAD_SIDE, BACKWARDS = range(6, 14)
PX_RANGE, BAD_TIME = 14, 15
# Prices no market has (a 1e300 print; below what any tick can express) and times past what a
# session can hold (int64 ns ends in 2262; a row stamped there never comes due on replay's clock).
DOOR_MIN_PX: Final = 1e-12
DOOR_MAX_PX: Final = 1e12
DOOR_MAX_TS_NS: Final = 7_258_118_400_000_000_000  # 2200-01-01T00:00:00Z
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
        elif not DOOR_MIN_PX <= p <= DOOR_MAX_PX:
            c = PX_RANGE
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
    side_ok = (side_code == 0) | (side_code == 1)
    ok = (px >= DOOR_MIN_PX) & (px <= DOOR_MAX_PX) & (sz > 0) & (sz < _INF) & side_ok
    if ok.all():
        return out
    out[:] = np.select(
        [np.isnan(px), np.isinf(px), px <= 0, ~np.isfinite(sz), sz <= 0, ~side_ok, ~ok],
        [NAN_PX, INF_PX, NONPOS_PX, NONFIN_SZ, NONPOS_SZ, BAD_SIDE, PX_RANGE],
        0,
    )
    return out


def time_range_codes(ts_event: np.ndarray, ts_recv: np.ndarray) -> np.ndarray:
    """``bad_time`` for each row whose ts_event or ts_recv is negative or past ``DOOR_MAX_TS_NS``."""
    ev = np.asarray(ts_event, dtype=np.int64)
    rc = np.asarray(ts_recv, dtype=np.int64)
    bad = (ev < 0) | (ev > DOOR_MAX_TS_NS) | (rc < 0) | (rc > DOOR_MAX_TS_NS)
    return np.where(bad, BAD_TIME, 0).astype(np.int8)


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
    event = table.column("ts_event").to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    return _merge(_merge(codes, time_range_codes(event, recv)), _time_codes_of_valid(recv, event))


def trade_table_codes(table: pa.Table) -> np.ndarray:
    """Fault code per row of one symbol's trade table, in file order."""

    def col(name: str) -> np.ndarray:
        return table.column(name).to_numpy(zero_copy_only=False).astype(np.float64, copy=False)

    data = trade_codes(col("px"), col("sz"), side_codes(table.column("side")))
    recv = table.column("ts_recv").to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    event = table.column("ts_event").to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    return _merge(_merge(data, time_range_codes(event, recv)), _time_codes_of_valid(recv, event))


def _time_codes_of_valid(recv: np.ndarray, event: np.ndarray) -> np.ndarray:
    """:func:`time_codes` where a row stamped out of range does not count as the latest time (one row
    at INT64_MAX would otherwise make every later row ``time_backwards``)."""
    ok = time_range_codes(event, recv) == 0
    if ok.all():
        return time_codes(recv)
    clean = np.where(ok, recv, np.iinfo(np.int64).min)
    out = time_codes(clean)
    out[~ok] = 0
    return out


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
    """The tick path's check: :func:`engine.book.valid_top` of the top (a two-sided, uncrossed, finite,
    positive top with sizes >= 0; a zero size passes here and is refused as untradable by
    ``engine.book.tradable_top``). Decoded frames were checked level by level by the codec."""
    return valid_top(book.bid_px[0], book.bid_sz[0], book.ask_px[0], book.ask_sz[0])


def trade_reason(trade: Trade) -> str:
    """The reason ``trade`` is invalid, or ''."""
    side = 0 if trade.side == "buy" else 1 if trade.side == "sell" else -1
    return REASONS[int(trade_codes(np.array([trade.px]), np.array([trade.sz]), np.array([side]))[0])]


def trade_ok(trade: Trade) -> bool:
    """The tick path's check of a trade (a few comparisons)."""
    return 0.0 < trade.px < _INF and 0.0 < trade.sz < _INF and (trade.side == "buy" or trade.side == "sell")


# -- at the wire (recorder, live, importers) --------------------------------------------------------
#
# One implementation of what a decoded frame must satisfy before it becomes an event, called by every
# decoder: the codec's general parser (``wire.bitget.bitget_v2.decode``, the ``books`` channel), the
# compiled scans (``wire.bitget.bitget_v2_fast``: they run the same compiled predicates and hand any
# frame that fails to the general parser, which names the reason), live mode's tick decoder and the
# importers. A frame that fails is quarantined whole, with its reason; nothing is repaired.
#
# Why each rule: a timestamp that does not fit int64 nanoseconds cannot be stored; one before any
# market this project reads existed (0, negative) or ahead of the receive time by more than clock skew
# can only be corrupt, and would break replay's ordering or its look-ahead guard (the floor applies
# where the receive time itself is past it: synthetic feeds with a clock from 0 keep working). The
# past side is open by default because the local venue replays history at the current wall time
# (``max_lag_s`` closes it for recordings of the real venue). Prices outside [min_px, max_px] and sizes above
# max_sz cannot be a real market's and overflow the engine's integer units; a print or book whose
# price is more than ``band`` times away from the symbol's current mid (the last book accepted within
# ``band_book_age_s`` of receive time) is a bad print, not a market move. The age bound keeps a
# genuine jump after a long silence from locking a symbol out. Trade ids seen before (the ``trade``
# snapshot the venue sends after each (re)subscribe repeats recent trades) are dropped and counted.

_INT64_MAX: Final = 2**63 - 1
MAX_TS_MS: Final = _INT64_MAX // 1_000_000  # the last millisecond whose nanoseconds fit an int64
EPOCH_FLOOR_MS: Final = 1_420_070_400_000  # 2015-01-01T00:00:00Z
DEDUP_WINDOW: Final = 8192  # trade ids remembered per symbol at least (a venue snapshot repeats far fewer)

# wire fault codes (0 = accepted); texts by :func:`wire_reason`
W_TS_RANGE, W_TS_EARLY, W_TS_AHEAD, W_TS_LAG, W_PX, W_SZ, W_BAND = range(1, 8)
WIRE_TAGS: Final = ("", "bad_ts", "bad_ts", "bad_ts", "bad_ts", "bad_price", "bad_size", "out_of_band")

# slots of the limits array the compiled checks read
L_MIN_TS, L_LEAD, L_LAG, L_MIN_PX, L_MAX_PX, L_MAX_SZ, L_BAND, L_AGE, L_FAST = range(9)


@dataclass(frozen=True, slots=True)
class WireLimits:
    """What a frame may hold (see the section comment for why each bound)."""

    max_lead_s: float = 300.0
    max_lag_s: float | None = None
    min_ts_ms: int = EPOCH_FLOOR_MS
    min_px: float = 1e-12
    max_px: float = 1e12
    max_sz: float = 1e15
    band: float = 2.0
    band_book_age_s: float = 10.0

    def __post_init__(self) -> None:
        for name in ("max_lead_s", "min_px", "max_px", "max_sz", "band_book_age_s"):
            v = getattr(self, name)
            if not (isinstance(v, int | float) and 0 < v < _INF):
                raise ValueError(f"wire limit {name} must be a positive finite number, got {v!r}")
        if self.max_lag_s is not None and not 0 < self.max_lag_s < _INF:
            raise ValueError(f"wire limit max_lag_s must be positive or None, got {self.max_lag_s!r}")
        if not self.band > 1.0:
            raise ValueError(f"wire limit band must be > 1 (a ratio to the mid), got {self.band!r}")
        if not self.min_px < self.max_px:
            raise ValueError("wire limit min_px must be below max_px")
        if not 0 <= self.min_ts_ms <= MAX_TS_MS:
            raise ValueError(f"wire limit min_ts_ms out of range: {self.min_ts_ms!r}")

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None) -> WireLimits:
        """From a manifest's or record.json's ``wire_limits`` (missing keys: the defaults)."""
        if not d:
            return cls()
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def array(self, fast: bool) -> np.ndarray:
        """The limits as the compiled checks read them (``fast``: the compiled scans may take frames)."""
        lim = np.zeros(9, dtype=np.float64)
        lim[L_MIN_TS] = self.min_ts_ms
        lim[L_LEAD] = self.max_lead_s * 1e9
        lim[L_LAG] = _INF if self.max_lag_s is None else self.max_lag_s * 1e9
        lim[L_MIN_PX], lim[L_MAX_PX], lim[L_MAX_SZ] = self.min_px, self.max_px, self.max_sz
        lim[L_BAND], lim[L_AGE] = self.band, self.band_book_age_s * 1e9
        lim[L_FAST] = 1.0 if fast else 0.0
        return lim


@njit(nogil=True)
def wire_ts_code(ts_ms, ts_recv, lim):  # pragma: no cover - compiled
    """0, or the fault of an exchange timestamp (ms, already known to fit int64) received at ``ts_recv``."""
    if ts_ms < 0 or ts_ms > MAX_TS_MS:
        return W_TS_RANGE
    if ts_ms < lim[L_MIN_TS] and ts_recv >= lim[L_MIN_TS] * 1e6:  # (a receive clock that old: a test's)
        return W_TS_EARLY
    d = float(ts_ms * 1_000_000 - ts_recv)  # both fit int64: the difference cannot overflow
    if d > lim[L_LEAD]:
        return W_TS_AHEAD
    if -d > lim[L_LAG]:
        return W_TS_LAG
    return 0


@njit(nogil=True, inline="always")
def _px_code(p, lim):  # pragma: no cover - compiled
    return 0 if lim[L_MIN_PX] <= p <= lim[L_MAX_PX] else W_PX


@njit(nogil=True)
def _ref_mid(sym, ts_recv, lim, mid, mid_ts):  # pragma: no cover - compiled
    """The symbol's current mid (NaN when it has none, or it is older than the band's age bound)."""
    if sym < 0 or sym >= mid.shape[0]:
        return math.nan
    m = mid[sym]
    if m == m and float(ts_recv - mid_ts[sym]) <= lim[L_AGE]:
        return m
    return math.nan


@njit(nogil=True)
def _side_code(lv, row, n, lim):  # pragma: no cover - compiled
    for k in range(n):
        if _px_code(lv[row, k], lim):
            return W_PX
        if not 0.0 <= lv[row + 1, k] <= lim[L_MAX_SZ]:
            return W_SZ
    return 0


@njit(nogil=True)
def wire_book_code(lv, nb, na, ts_ms, ts_recv, sym, lim, mid, mid_ts):  # pragma: no cover - compiled
    """0, or the fault of a decoded book: ``lv`` float64 (4, >= max(nb, na)) bid px, bid sz, ask px, ask
    sz with ``nb``/``na`` levels (positive, ordered, uncrossed: the parsers check that). Accepted, it
    becomes the symbol's current mid (``mid``/``mid_ts`` by symbol id; ``sym`` < 0: no state)."""
    c = wire_ts_code(ts_ms, ts_recv, lim)
    if c:
        return c
    c = _side_code(lv, 0, nb, lim)
    if c:
        return c
    c = _side_code(lv, 2, na, lim)
    if c:
        return c
    m = (lv[0, 0] + lv[2, 0]) / 2.0
    ref = _ref_mid(sym, ts_recv, lim, mid, mid_ts)
    if ref == ref and not (ref / lim[L_BAND] <= m <= ref * lim[L_BAND]):
        return W_BAND
    if 0 <= sym < mid.shape[0]:
        mid[sym] = m
        mid_ts[sym] = ts_recv
    return 0


@njit(nogil=True)
def wire_trades_code(ts_ms, px, sz, k, ts_recv, sym, lim, mid, mid_ts):  # pragma: no cover - compiled
    """0, or the fault of the first bad one of ``k`` trades (first ``k`` entries of the arrays); its index
    is returned second."""
    ref = _ref_mid(sym, ts_recv, lim, mid, mid_ts)
    for i in range(k):
        c = wire_ts_code(ts_ms[i], ts_recv, lim)
        if c:
            return c, i
        p = px[i]
        if _px_code(p, lim):
            return W_PX, i
        if not 0.0 < sz[i] <= lim[L_MAX_SZ]:
            return W_SZ, i
        if ref == ref and not (ref / lim[L_BAND] <= p <= ref * lim[L_BAND]):
            return W_BAND, i
    return 0, -1


class WireGuard:
    """The wire checks' state for one feed (one normaliser, one live feed, one importer): its limits,
    each symbol's current mid (arrays by symbol id, shared with the compiled scans) and the trade ids
    seen per symbol. ``intern`` maps a symbol to its id (a normaliser passes its column buffers' table,
    so the compiled block scan and the general parser update the same slots); ``inst_type`` is the
    subscription's (None: frames of any instType are taken, as an importer of mixed captures needs);
    ``fast`` says whether the compiled scans, which only read the canonical USDT-FUTURES frame, may
    take frames at all (the codec decides: :func:`wire.bitget.bitget_v2.wire_guard`)."""

    def __init__(
        self,
        limits: WireLimits | None = None,
        *,
        inst_type: str | None = None,
        intern: Any = None,
        fast: bool = True,
        dedupe: bool = True,
        capacity: int = 8192,
    ) -> None:
        self.limits = limits or WireLimits()
        self.dedupe = dedupe  # off where trade ids are not the venue's (derived ones can collide)
        self.inst_type = inst_type
        self.lim = self.limits.array(fast)
        self.mid = np.full(capacity, np.nan, dtype=np.float64)
        self.mid_ts = np.zeros(capacity, dtype=np.int64)
        self._ids: dict[str, int] = {}
        self._intern = intern
        self._seen: dict[str, list[set[str]]] = {}
        self.duplicates: dict[str, int] = {}  # symbol -> trades dropped as already seen

    # ------------------------------------------------------------ symbols

    def sym_id(self, symbol: str) -> int:
        k = self._ids.get(symbol)
        if k is None:
            k = self._ids[symbol] = int(self._intern(symbol)) if self._intern else len(self._ids)
            if k >= len(self.mid):
                self._grow(k + 1)
        return k

    def _grow(self, n: int) -> None:
        size = max(n, 2 * len(self.mid))
        mid = np.full(size, np.nan, dtype=np.float64)
        mid[: len(self.mid)] = self.mid
        ts = np.zeros(size, dtype=np.int64)
        ts[: len(self.mid_ts)] = self.mid_ts
        self.mid, self.mid_ts = mid, ts

    # ------------------------------------------------------------ checks

    def inst_type_reason(self, inst_type: Any) -> str:
        """'' when a frame's ``arg.instType`` is the subscription's (or any is taken)."""
        if self.inst_type is None or inst_type == self.inst_type:
            return ""
        return f"inst_type: a {inst_type!r} frame on a {self.inst_type} subscription"

    @staticmethod
    def _recv_reason(ts_recv: int) -> str:
        """A receive time read from a file (an importer's) may itself be corrupt."""
        if 0 <= ts_recv <= _INT64_MAX:
            return ""
        return f"bad_ts: receive time {str(ts_recv)[:30]} ns does not fit int64"

    def ts_reason(self, ts_ms: int, ts_recv: int) -> str:
        """'' when an exchange timestamp (ms) received at ``ts_recv`` passes the checks, else the reason."""
        if why := self._recv_reason(ts_recv):
            return why
        c = W_TS_RANGE if not 0 <= ts_ms <= MAX_TS_MS else int(wire_ts_code(ts_ms, ts_recv, self.lim))
        return self.reason(c, ts_ms, ts_recv, 0.0, "") if c else ""

    def book_reason(
        self,
        ts_ms: int,
        ts_recv: int,
        symbol: str,
        bid_px: Any,
        bid_sz: Any,
        ask_px: Any,
        ask_sz: Any,
    ) -> str:
        """'' when a parsed book may become an event (it is then the symbol's current mid), else the
        reason. Levels are sequences of floats (NaN past the last level)."""
        if why := self._recv_reason(ts_recv):
            return why
        if not 0 <= ts_ms <= MAX_TS_MS:
            return self.reason(W_TS_RANGE, ts_ms, ts_recv, 0.0, symbol)
        lv = np.array((bid_px, bid_sz, ask_px, ask_sz), dtype=np.float64)
        nb = int(np.count_nonzero(lv[0] == lv[0]))
        na = int(np.count_nonzero(lv[2] == lv[2]))
        sym = self.sym_id(symbol)
        c = int(wire_book_code(lv, nb, na, ts_ms, ts_recv, sym, self.lim, self.mid, self.mid_ts))
        if not c:
            return ""
        bad = lv[0, 0] if c != W_BAND else (lv[0, 0] + lv[2, 0]) / 2.0
        if c in (W_PX, W_SZ):  # name the level at fault
            for side, n in ((0, nb), (2, na)):
                for k in range(n):
                    if c == W_PX and int(_px_code(lv[side, k], self.lim)):
                        bad = lv[side, k]
                        break
                    if c == W_SZ and not 0.0 <= lv[side + 1, k] <= self.lim[L_MAX_SZ]:
                        bad = lv[side + 1, k]
                        break
                else:
                    continue
                break
        return self.reason(c, ts_ms, ts_recv, float(bad), symbol)

    def scanned_book_ok(
        self, lv: np.ndarray, nb: int, na: int, ts_ms: int, ts_recv: int, symbol: str
    ) -> bool:
        """:meth:`book_reason` of a book a compiled scan parsed into ``lv`` (4, 15): True when accepted
        (the caller sends a refused frame through the general parser, which names the reason)."""
        sym = self.sym_id(symbol)
        return not wire_book_code(lv, nb, na, ts_ms, ts_recv, sym, self.lim, self.mid, self.mid_ts)

    def trades_reason(self, rows: Any, ts_recv: int, symbol: str) -> str:
        """'' when every ``(ts_ms, trade_id, px, sz, side)`` of one push may become an event."""
        if why := self._recv_reason(ts_recv):
            return why
        k = len(rows)
        ts = [r[0] for r in rows]
        for t in ts:
            if not 0 <= t <= MAX_TS_MS:
                return self.reason(W_TS_RANGE, t, ts_recv, 0.0, symbol)
        ts_ms = np.array(ts, dtype=np.int64)
        px = np.array([r[2] for r in rows], dtype=np.float64)
        sz = np.array([r[3] for r in rows], dtype=np.float64)
        c, i = wire_trades_code(
            ts_ms, px, sz, k, ts_recv, self.sym_id(symbol), self.lim, self.mid, self.mid_ts
        )
        if not c:
            return ""
        return self.reason(int(c), ts[i], ts_recv, float(sz[i] if c == W_SZ else px[i]), symbol)

    def scanned_trades_ok(
        self, ts_ms: np.ndarray, px: np.ndarray, sz: np.ndarray, k: int, ts_recv: int, symbol: str
    ) -> bool:
        c, _ = wire_trades_code(
            ts_ms, px, sz, k, ts_recv, self.sym_id(symbol), self.lim, self.mid, self.mid_ts
        )
        return not c

    # Seen ids per symbol live in two generations, [current, previous]: the current one takes new ids
    # until it holds DEDUP_WINDOW, then becomes the previous one (the older generation is dropped).
    # So the last DEDUP_WINDOW ids at least are always remembered, and a block of ids is taken with
    # set operations, never one Python step per id; the rotation points are the same whether ids come
    # one at a time (the general parser) or a block at a time (the compiled scan), so both decide alike.

    def _gens(self, symbol: str) -> list[set[str]]:
        g = self._seen.get(symbol)
        if g is None:
            g = self._seen[symbol] = [set(), set()]
        return g

    def fresh(self, symbol: str, trade_id: str) -> bool:
        """False (and counted) when ``trade_id`` was seen on ``symbol`` before; remembers it otherwise."""
        if not self.dedupe:
            return True
        g = self._gens(symbol)
        if trade_id in g[0] or trade_id in g[1]:
            self.duplicates[symbol] = self.duplicates.get(symbol, 0) + 1
            return False
        g[0].add(trade_id)
        if len(g[0]) >= DEDUP_WINDOW:
            g[1], g[0] = g[0], set()
        return True

    def fresh_all(self, symbol: str, trade_ids: list[str]) -> list[bool] | None:
        """:meth:`fresh` of each id in order, or None when every one is fresh (then remembered in one
        go: the common case, for a block of rows)."""
        if not self.dedupe:
            return None
        g = self._gens(symbol)
        if not (
            g[0].isdisjoint(trade_ids)
            and g[1].isdisjoint(trade_ids)
            and len(set(trade_ids)) == len(trade_ids)
        ):
            return [self.fresh(symbol, t) for t in trade_ids]
        i = 0
        while i < len(trade_ids):  # as many adds as fit before the next rotation, then rotate
            room = DEDUP_WINDOW - len(g[0])
            g[0].update(trade_ids[i : i + room])
            i += room
            if len(g[0]) >= DEDUP_WINDOW:
                g[1], g[0] = g[0], set()
        return None

    # ------------------------------------------------------------ reasons

    def reason(self, code: int, ts_ms: int, ts_recv: int, value: float, symbol: str) -> str:
        """The quarantine text of a fault: ``<tag>: <what, with the limit it broke>``."""
        lm = self.limits
        if code == W_TS_RANGE:
            what = f"ts {ts_ms} ms does not fit int64 nanoseconds"
        elif code == W_TS_EARLY:
            what = f"ts {ts_ms} ms is before min_ts_ms {lm.min_ts_ms}"
        elif code == W_TS_AHEAD:
            ahead = (ts_ms * 1_000_000 - ts_recv) / 1e9
            what = f"ts {ts_ms} ms is {ahead:.3f} s after its receive time (max_lead_s {lm.max_lead_s})"
        elif code == W_TS_LAG:
            lag = (ts_recv - ts_ms * 1_000_000) / 1e9
            what = f"ts {ts_ms} ms is {lag:.3f} s before its receive time (max_lag_s {lm.max_lag_s})"
        elif code == W_PX:
            what = f"price {value!r} is outside [{lm.min_px!r}, {lm.max_px!r}]"
        elif code == W_SZ:
            what = f"size {value!r} is outside (0, max_sz {lm.max_sz!r}]"
        else:
            ref = float(self.mid[self.sym_id(symbol)])
            what = f"price {value!r} is {value / ref:.4g}x the current mid {ref!r} (band {lm.band!r})"
        return f"{WIRE_TAGS[code]}: {what}"
