"""Compiled fast path of the Bitget v2 ``books15`` decoder, exactly equal to :func:`bitget_v2.decode`.

Why: CPython spends ~25 us on one books15 frame (60 ``float()`` calls, tuples, checks); the
recorder's normaliser and the live tick path decode every frame. This module scans the frame bytes
once in numba and parses each price and size with Clinger's fast path, which is exact: a decimal
of at most 15 digits is an integer below 2**53 and 10**k (k <= 22) is a double, so one IEEE division
gives the correctly rounded value, the same double CPython's ``float()`` returns.

It only accepts the canonical frame, byte for byte the layout Bitget, the simulator and the local
server send (``{"action":"snapshot","arg":{...,"channel":"books15","instId":"X"},"data":[{"asks":[..],
"bids":[..],"checksum":N,"seq":N,"ts":"N"}],"ts":N}``, the 2024 form without ``"seq"``, or the 2026
form ending ``"bids":[..],"ts":"N","seq":N,"pseq":N}],"ts":N}``), with plain decimals, 1..15 positive
strictly ordered levels a side and an uncrossed book. Anything else (other key order, whitespace, escapes,
exponents, too many digits, a bad level, another channel) returns "not mine" and the caller uses the
general decoder, which also finds the quarantine reason. So the fast path can only ever be faster,
never different; ``tests/wire/bitget/test_bitget_v2_fast.py`` checks equality frame by frame.
The wire checks (:mod:`engine.validate`) are the same compiled predicates here and in the general
parser: a scanned frame that fails one is handed over too, and the general parser names the fault.
"""

from __future__ import annotations

import math
from typing import Final

import numpy as np

from engine.events import BOOK_LEVELS, BookSnapshot, Nanos, Quarantined, Trade
from engine.fastinit import frozen_maker
from engine.jit import njit
from engine.validate import L_FAST, WireGuard, wire_book_code, wire_trades_code
from wire.bitget.bitget_v2 import INST_TYPE, MS, Control, StreamCounters, arg, decode

# meta slots filled by the scanner
M_TS_MS: Final = 0  # data.ts (exchange ms)
M_SEQ: Final = 1  # data.seq
M_NBID: Final = 2
M_NASK: Final = 3
M_SYM_START: Final = 4  # instId byte span in the frame
M_SYM_END: Final = 5
N_META: Final = 6

_POW10 = np.array([10.0**k for k in range(23)], dtype=np.float64)


def _lit(s: str) -> np.ndarray:
    return np.frombuffer(s.encode(), dtype=np.uint8).copy()


_HEAD = _lit('{"action":"snapshot","arg":{"instType":"USDT-FUTURES","channel":"books15","instId":"')
_DATA_ASKS = _lit('"},"data":[{"asks":[')
_BIDS = _lit('],"bids":[')
_CHECKSUM = _lit('],"checksum":')
_SEQ = _lit(',"seq":')
_TS = _lit(',"ts":"')
_TAIL_TS = _lit('"}],"ts":')
# the 2026 layout of a fixed-depth push: {"asks":[..],"bids":[..],"ts":"N","seq":N,"pseq":N}
_TS26 = _lit('],"ts":"')
_SEQ26 = _lit('","seq":')
_PSEQ26 = _lit(',"pseq":')
_TAIL26 = _lit('}],"ts":')

_QUOTE, _COMMA, _LBRACK, _RBRACK, _DOT, _MINUS, _RBRACE = 34, 44, 91, 93, 46, 45, 125


@njit(nogil=True)
def _expect(buf, i, lit):  # pragma: no cover - compiled
    n = lit.shape[0]
    if i + n > len(buf):
        return -1
    for k in range(n):
        if buf[i + k] != lit[k]:
            return -1
    return i + n


@njit(nogil=True)
def _uint(buf, i, out, slot):  # pragma: no cover - compiled
    """Unsigned decimal integer of 1..18 digits into out[slot]; returns the next index or -1."""
    n = len(buf)
    v = 0
    j = i
    while j < n and 48 <= buf[j] <= 57 and j - i < 19:
        v = v * 10 + (buf[j] - 48)
        j += 1
    if j == i or j - i > 18:
        return -1
    out[slot] = v
    return j


@njit(nogil=True)
def _decimal(buf, i, pow10, vals, k):  # pragma: no cover - compiled
    """A quoted plain decimal ``"123.45"`` (<= 15 digits) into vals[k]; returns the next index or -1."""
    n = len(buf)
    if i >= n or buf[i] != _QUOTE:
        return -1
    i += 1
    m = 0
    digits = 0
    frac = 0
    seen_dot = False
    while i < n:
        c = buf[i]
        if 48 <= c <= 57:
            m = m * 10 + (c - 48)
            digits += 1
            if seen_dot:
                frac += 1
        elif c == _DOT and not seen_dot and digits > 0:
            seen_dot = True
        else:
            break
        i += 1
    if i >= n or buf[i] != _QUOTE or digits == 0 or digits > 15 or (seen_dot and frac == 0):
        return -1
    vals[k] = m / pow10[frac]
    return i + 1


@njit(nogil=True)
def _levels(buf, i, pow10, px, sz):  # pragma: no cover - compiled
    """``["p","s"],["p","s"]...`` up to the closing ``]`` of the side; returns (next index, count)."""
    count = 0
    n = len(buf)
    while True:
        if count == px.shape[0] or i >= n or buf[i] != _LBRACK:
            return -1, 0
        i = _decimal(buf, i + 1, pow10, px, count)
        if i < 0 or i >= n or buf[i] != _COMMA:
            return -1, 0
        i = _decimal(buf, i + 1, pow10, sz, count)
        if i < 0 or i >= n or buf[i] != _RBRACK:
            return -1, 0
        count += 1
        i += 1
        if i < n and buf[i] == _COMMA:
            i += 1
            continue
        return i, count


@njit(nogil=True)
def scan_books15(buf, levels, meta):  # pragma: no cover - compiled
    """Parse one canonical books15 frame. ``levels`` is float64 (4, 15): bid px, bid sz, ask px, ask sz
    (NaN past the last level); ``meta`` int64 (6,). Returns True when the frame is the fast path's."""
    pow10 = _POW10
    i = _expect(buf, 0, _HEAD)
    if i < 0:
        return False
    start = i
    n = len(buf)
    while i < n:
        c = buf[i]
        # instId: letters, digits, '_', '-', '.'; anything else (escapes included) goes the slow way
        if (65 <= c <= 90) or (97 <= c <= 122) or (48 <= c <= 57) or c == 95 or c == 45 or c == 46:
            i += 1
        else:
            break
    if i == start:
        return False
    meta[M_SYM_START] = start
    meta[M_SYM_END] = i
    i = _expect(buf, i, _DATA_ASKS)
    if i < 0:
        return False
    levels[:, :] = np.nan
    i, na = _levels(buf, i, pow10, levels[2], levels[3])
    if i < 0:
        return False
    i = _expect(buf, i, _BIDS)
    if i < 0:
        return False
    i, nb = _levels(buf, i, pow10, levels[0], levels[1])
    if i < 0:
        return False
    j = _expect(buf, i, _CHECKSUM)
    if j >= 0:  # checksum (0), seq, ts; 2024 captures have no seq (decode reads it as 0)
        i = j
        if i < n and buf[i] == _MINUS:  # checksum is a signed int32; decode ignores it
            i += 1
        i = _uint(buf, i, meta, M_TS_MS)  # scratch slot, overwritten below
        if i < 0:
            return False
        j = _expect(buf, i, _SEQ)
        if j >= 0:
            i = _uint(buf, j, meta, M_SEQ)
            if i < 0:
                return False
        else:
            meta[M_SEQ] = 0
        i = _expect(buf, i, _TS)
        if i < 0:
            return False
        i = _uint(buf, i, meta, M_TS_MS)
        if i < 0:
            return False
        i = _expect(buf, i, _TAIL_TS)
        if i < 0:
            return False
    else:  # 2026 layout: ts, seq, pseq and no checksum
        i = _expect(buf, i, _TS26)
        if i < 0:
            return False
        i = _uint(buf, i, meta, M_TS_MS)
        if i < 0:
            return False
        i = _expect(buf, i, _SEQ26)
        if i < 0:
            return False
        i = _uint(buf, i, meta, M_SEQ)
        if i < 0:
            return False
        i = _expect(buf, i, _PSEQ26)
        if i < 0:
            return False
        i = _uint(buf, i, meta, M_NBID)  # pseq: checked as an integer, not used (scratch slot)
        if i < 0:
            return False
        i = _expect(buf, i, _TAIL26)
        if i < 0:
            return False
    # push ts: an integer, then the closing brace and nothing else
    scratch = meta[M_NBID]
    i = _uint(buf, i, meta, M_NBID)
    meta[M_NBID] = scratch
    if i < 0 or i + 1 != n or buf[i] != _RBRACE:
        return False
    # the same acceptance rules as bitget_v2._levels: positive, strictly ordered, not crossed
    for k in range(nb):
        if not (levels[0, k] > 0.0 and levels[1, k] > 0.0):
            return False
        if k > 0 and not (levels[0, k] < levels[0, k - 1]):
            return False
    for k in range(na):
        if not (levels[2, k] > 0.0 and levels[3, k] > 0.0):
            return False
        if k > 0 and not (levels[2, k] > levels[2, k - 1]):
            return False
    if not (levels[0, 0] < levels[2, 0]):
        return False
    meta[M_NBID] = nb
    meta[M_NASK] = na
    return True


_book = frozen_maker(BookSnapshot)  # without the frozen __init__'s keyword handling: one per frame
_PAD: Final = tuple((math.nan,) * (BOOK_LEVELS - k) for k in range(BOOK_LEVELS + 1))


class Books15Scanner:
    """Reusable buffers around :func:`scan_books15` (one per thread of decoding)."""

    __slots__ = ("levels", "meta")

    def __init__(self) -> None:
        self.levels = np.empty((4, BOOK_LEVELS), dtype=np.float64)
        self.meta = np.zeros(N_META, dtype=np.int64)

    def scan(self, raw: bytes) -> bool:
        """True when ``raw`` (``bytes``) is a canonical books15 frame; its values are then in
        ``levels``/``meta``. The bytes go to numba as they are (no array view: one more object a frame)."""
        return bool(scan_books15(raw, self.levels, self.meta))

    def symbol(self, raw: bytes) -> str:
        m = self.meta
        return raw[m[M_SYM_START] : m[M_SYM_END]].decode("ascii")

    def wire_ok(self, raw: bytes, ts_recv: Nanos, guard: WireGuard) -> bool:
        """The wire checks on the frame just scanned (accepted: it is the symbol's current book)."""
        m = self.meta
        return guard.scanned_book_ok(
            self.levels, int(m[M_NBID]), int(m[M_NASK]), int(m[M_TS_MS]), ts_recv, self.symbol(raw)
        )

    def book(self, raw: bytes, ts_recv: Nanos, counters: StreamCounters) -> BookSnapshot:
        """The event of the frame just scanned, equal to what :func:`decode` builds."""
        lv = self.levels.tolist()
        m = self.meta.tolist()  # Python ints at once: the tick path reads five of them
        # padding is math.nan itself, as in decode, so events compare equal (NaN == NaN only by identity)
        nb, na = m[M_NBID], m[M_NASK]
        pb, pa = _PAD[nb], _PAD[na]
        return _book(  # BookSnapshot's fields in order
            m[M_TS_MS] * MS,
            ts_recv,
            counters.take("books15"),
            raw[m[M_SYM_START] : m[M_SYM_END]].decode("ascii"),
            m[M_SEQ],
            tuple(lv[0][:nb]) + pb,
            tuple(lv[1][:nb]) + pb,
            tuple(lv[2][:na]) + pa,
            tuple(lv[3][:na]) + pa,
        )


_DEFAULT = Books15Scanner()


def warm_up() -> None:
    """Compile (or load from numba's cache) before the first real frame needs it."""
    from wire.bitget.bitget_v2 import encode_books15

    raw = encode_books15("WARMUP", ts_ms=1, seq=1, bids=[("1.0", "1")], asks=[("2.0", "1")], push_ts_ms=1)
    Books15Scanner().scan(raw)


# ---------------------------------------------------------------- trade frames (additive)
#
# Canonical ``trade`` push, byte for byte as Bitget, the simulator and the local server send it:
# ``{"action":"snapshot"|"update","arg":{"instType":"USDT-FUTURES","channel":"trade","instId":"X"},
# "data":[{"ts":"N","price":"D","size":"D","side":"buy"|"sell","tradeId":"ID"},...],"ts":N}``.
# The same rule as books15: anything else is "not mine" and goes through ``decode``.

# trade meta slots
T_SYM_START: Final = 0
T_SYM_END: Final = 1
N_TRADE_META: Final = 2
# int64 ts beyond this overflows ``ts_ms * MS`` in an int64 column; such frames take the general path
MAX_TS_MS: Final = (2**63 - 1) // 1_000_000

_T_HEAD_SNAP = _lit('{"action":"snapshot","arg":{"instType":"USDT-FUTURES","channel":"trade","instId":"')
_T_HEAD_UPD = _lit('{"action":"update","arg":{"instType":"USDT-FUTURES","channel":"trade","instId":"')
_T_DATA = _lit('"},"data":[')
_T_OBJ_TS = _lit('{"ts":"')
_T_PRICE = _lit('","price":')
_T_SIZE = _lit(',"size":')
_T_SIDE = _lit(',"side":"')
_T_BUY = _lit('buy"')
_T_SELL = _lit('sell"')
_T_TID = _lit(',"tradeId":"')
_T_TAIL = _lit('],"ts":')


@njit(nogil=True)
def _ident(buf, i):  # pragma: no cover - compiled
    """End of a run of ``[A-Za-z0-9_.-]`` starting at ``i`` (== i when empty)."""
    n = len(buf)
    while i < n:
        c = buf[i]
        if (65 <= c <= 90) or (97 <= c <= 122) or (48 <= c <= 57) or c == 95 or c == 45 or c == 46:
            i += 1
        else:
            break
    return i


@njit(nogil=True)
def scan_trade(buf, ts_ms, px, sz, side, tid, meta):  # pragma: no cover - compiled
    """Parse one canonical trade frame. Per trade, in wire order (newest first): ``ts_ms`` int64,
    ``px``/``sz`` float64, ``side`` int8 (0 buy, 1 sell), ``tid`` int64 (k, 2) byte span of the
    tradeId; ``meta`` int64 (2,) the instId span. Returns the number of trades, or -1 when the frame
    is not the fast path's (then :func:`bitget_v2.decode` decides, quarantine reason included)."""
    pow10 = _POW10
    i = _expect(buf, 0, _T_HEAD_UPD)
    if i < 0:
        i = _expect(buf, 0, _T_HEAD_SNAP)
        if i < 0:
            return -1
    start = i
    i = _ident(buf, i)
    if i == start:
        return -1
    meta[T_SYM_START] = start
    meta[T_SYM_END] = i
    i = _expect(buf, i, _T_DATA)
    if i < 0:
        return -1
    n = len(buf)
    cap = px.shape[0]
    k = 0
    while True:
        if k == cap:
            return -1
        i = _expect(buf, i, _T_OBJ_TS)
        if i < 0:
            return -1
        i = _uint(buf, i, ts_ms, k)
        if i < 0 or ts_ms[k] > MAX_TS_MS:
            return -1
        i = _expect(buf, i, _T_PRICE)
        if i < 0:
            return -1
        i = _decimal(buf, i, pow10, px, k)
        if i < 0:
            return -1
        i = _expect(buf, i, _T_SIZE)
        if i < 0:
            return -1
        i = _decimal(buf, i, pow10, sz, k)
        if i < 0:
            return -1
        i = _expect(buf, i, _T_SIDE)
        if i < 0:
            return -1
        j = _expect(buf, i, _T_BUY)
        if j >= 0:
            side[k] = 0
        else:
            j = _expect(buf, i, _T_SELL)
            if j < 0:
                return -1
            side[k] = 1
        i = _expect(buf, j, _T_TID)
        if i < 0:
            return -1
        j = _ident(buf, i)
        if j == i or j + 1 >= n or buf[j] != _QUOTE or buf[j + 1] != _RBRACE:
            return -1
        tid[k, 0] = i
        tid[k, 1] = j
        if not (px[k] > 0.0 and sz[k] > 0.0):
            return -1
        k += 1
        i = j + 2
        if i < n and buf[i] == _COMMA:
            i += 1
            continue
        break
    i = _expect(buf, i, _T_TAIL)
    if i < 0:
        return -1
    scratch = meta[T_SYM_START]
    i = _uint(buf, i, meta, T_SYM_START)  # the push ts: must be an integer; its value is not used
    meta[T_SYM_START] = scratch
    if i < 0 or i + 1 != n or buf[i] != _RBRACE:
        return -1
    return k


@njit(nogil=True)
def trade_order(ts_ms, k, order):  # pragma: no cover - compiled
    """``decode``'s output order: rows reversed (oldest first), then a stable sort by ts; ``order``
    gets wire indices. Insertion sort: a push holds a handful of trades, usually already in order."""
    for r in range(k):
        w = k - 1 - r
        j = r
        while j > 0 and ts_ms[order[j - 1]] > ts_ms[w]:
            order[j] = order[j - 1]
            j -= 1
        order[j] = w


MAX_TRADES_PER_FRAME: Final = 4096  # more than that in one push: the general path (never seen live)


class TradeScanner:
    """Reusable buffers around :func:`scan_trade` (one per thread of decoding)."""

    __slots__ = ("meta", "order", "px", "side", "sz", "tid", "ts_ms")

    def __init__(self, capacity: int = MAX_TRADES_PER_FRAME) -> None:
        self.ts_ms = np.zeros(capacity, dtype=np.int64)
        self.px = np.zeros(capacity, dtype=np.float64)
        self.sz = np.zeros(capacity, dtype=np.float64)
        self.side = np.zeros(capacity, dtype=np.int8)
        self.tid = np.zeros((capacity, 2), dtype=np.int64)
        self.order = np.zeros(capacity, dtype=np.int64)
        self.meta = np.zeros(N_TRADE_META, dtype=np.int64)

    def scan(self, raw: bytes) -> int:
        """Number of trades when ``raw`` is a canonical trade frame, else -1."""
        return int(
            scan_trade(
                raw,
                self.ts_ms,
                self.px,
                self.sz,
                self.side,
                self.tid,
                self.meta,
            )
        )

    def wire_ok(self, raw: bytes, k: int, ts_recv: Nanos, guard: WireGuard) -> bool:
        """The wire checks on the ``k`` trades just scanned."""
        symbol = raw[self.meta[T_SYM_START] : self.meta[T_SYM_END]].decode("ascii")
        return guard.scanned_trades_ok(self.ts_ms, self.px, self.sz, k, ts_recv, symbol)

    def trades(
        self, raw: bytes, k: int, ts_recv: Nanos, counters: StreamCounters, guard: WireGuard | None = None
    ) -> list[Trade] | list[Control]:
        """The events of the frame just scanned (``k`` trades), equal to what :func:`decode` builds
        (with a ``guard``: without the trade ids it has seen, as :func:`decode` does)."""
        trade_order(self.ts_ms, k, self.order)
        symbol = raw[self.meta[T_SYM_START] : self.meta[T_SYM_END]].decode("ascii")
        # the first k rows only: the buffers hold MAX_TRADES_PER_FRAME, and listing all of them would
        # cost the live event loop far more than the frame itself
        ts, px, sz, side, tid = (a[:k].tolist() for a in (self.ts_ms, self.px, self.sz, self.side, self.tid))
        out: list[Trade] = []
        for w in self.order[:k].tolist():
            a, b = tid[w]
            if guard is not None and not guard.fresh(symbol, raw[a:b].decode("ascii")):
                continue
            out.append(
                Trade(
                    ts_event=ts[w] * MS,
                    ts_recv=ts_recv,
                    seq=counters.take("trade"),
                    symbol=symbol,
                    trade_id=raw[a:b].decode("ascii"),
                    px=px[w],
                    sz=sz[w],
                    side="sell" if side[w] else "buy",
                )
            )
        if not out:
            return [Control("duplicate", arg("trade", symbol, INST_TYPE))]
        return out


_DEFAULT_TRADES = TradeScanner()


def decode_fast(
    raw: bytes | str,
    ts_recv: Nanos,
    counters: StreamCounters,
    scanner: Books15Scanner | None = None,
    trades: TradeScanner | None = None,
    guard: WireGuard | None = None,
) -> list[BookSnapshot | Trade | Quarantined | Control]:
    """Drop-in for :func:`bitget_v2.decode`: canonical books15 and trade frames take compiled paths
    (with a ``guard``, those that pass its checks; the rest, and every frame when the guard's
    instType is not the canonical one, go to the general parser)."""
    if isinstance(raw, bytes) and (guard is None or guard.lim[L_FAST]):
        sc = scanner or _DEFAULT
        if sc.scan(raw) and (guard is None or sc.wire_ok(raw, ts_recv, guard)):
            return [sc.book(raw, ts_recv, counters)]
    return decode_not_books15(raw, ts_recv, counters, trades, guard)


def decode_not_books15(
    raw: bytes | str,
    ts_recv: Nanos,
    counters: StreamCounters,
    trades: TradeScanner | None = None,
    guard: WireGuard | None = None,
) -> list[BookSnapshot | Trade | Quarantined | Control]:
    """:func:`decode_fast` of a frame the books15 scan already declined (the caller scanned it)."""
    if isinstance(raw, bytes) and (guard is None or guard.lim[L_FAST]):
        ts = trades or _DEFAULT_TRADES
        k = ts.scan(raw)
        if k > 0 and (guard is None or ts.wire_ok(raw, k, ts_recv, guard)):
            return list(ts.trades(raw, k, ts_recv, counters, guard))
    return decode(raw, ts_recv, counters, guard)


# ---------------------------------------------------------------- batch scan of a record block (additive)
#
# One call walks a run of length-prefixed records (the recorder journal's block layout: ``i64 ts
# u16 conn  u8 kind  u32 len  payload``, kind 0 = a received frame), scans every canonical books15
# and trade frame with the scanners above and appends the values to preallocated column buffers
# (``recorder.columns.Columns``). It stops at the first record it does not own (another kind,
# anything non-canonical or malformed) and returns its offset, so the caller decodes that one through
# the general path, in order, and resumes. It lives here, next to the scanners it calls, because
# numba's cache only notices edits to the file a cached function is defined in.
#
# Status codes: ``END`` (block done), ``SLOW`` (the record at ``st[S_POS]`` is the caller's), ``FULL``
# (grow the buffers, call again from ``st[S_POS]``).

END: Final = 0
SLOW: Final = 1
FULL: Final = 2

REC_HEADER: Final = 15  # struct "<qHBI"

# state slots (int64 array shared between calls)
S_NB: Final = 0  # books rows filled
S_NT: Final = 1  # trade rows filled
S_NTB: Final = 2  # tradeId bytes filled
S_FRAMES: Final = 3  # RECV records taken in this call
S_PONGS: Final = 4
S_FIRST: Final = 5  # ts of the first record taken in this call (-1: none)
S_LAST: Final = 6
S_NSYMS: Final = 7
S_NTOUCHED: Final = 8  # distinct (symbol, channel) args counted in this call
S_NREC: Final = 9  # records taken in this call
S_POS: Final = 10  # offset where the call stopped
N_STATE: Final = 11

SYM_CAP: Final = 4096  # distinct symbols the compiled table holds; more go the general path
SYM_WIDTH: Final = 64
SYM_SLOTS: Final = 8192  # open-addressing hash slots (power of two, > SYM_CAP)
MAX_FRAME_TRADES: Final = MAX_TRADES_PER_FRAME

# channel index in an arg id (sym_id * 2 + channel)
CH_BOOKS15: Final = 0
CH_TRADE: Final = 1


@njit(nogil=True)
def intern_symbol(buf, a, b, symtab, symlen, slots, st):  # pragma: no cover - compiled
    """Id of the symbol ``buf[a:b]`` in the table, added if new; -1 when it does not fit."""
    ln = b - a
    if ln > symtab.shape[1]:
        return -1
    h = 2166136261
    for i in range(a, b):
        h = ((h ^ buf[i]) * 16777619) & 0xFFFFFFFF
    mask = slots.shape[0] - 1
    s = h & mask
    while True:
        v = slots[s]
        if v == 0:
            k = st[S_NSYMS]
            if k >= symtab.shape[0]:
                return -1
            for i in range(ln):
                symtab[k, i] = buf[a + i]
            symlen[k] = ln
            slots[s] = k + 1
            st[S_NSYMS] = k + 1
            return k
        k = v - 1
        if symlen[k] == ln:
            same = True
            for i in range(ln):
                if symtab[k, i] != buf[a + i]:
                    same = False
                    break
            if same:
                return k
        s = (s + 1) & mask


@njit(nogil=True)
def _u(raw, p, nbytes):  # pragma: no cover - compiled
    v = 0
    for k in range(nbytes - 1, -1, -1):
        v = (v << 8) | raw[p + k]
    return v


@njit(nogil=True)
def _tally(st, ts, arg, agg_n, agg_first, agg_last, touched):  # pragma: no cover - compiled
    if agg_n[arg] == 0:
        touched[st[S_NTOUCHED]] = arg
        st[S_NTOUCHED] += 1
        agg_first[arg] = ts
    agg_n[arg] += 1
    agg_last[arg] = ts
    if st[S_FIRST] < 0:
        st[S_FIRST] = ts
    st[S_LAST] = ts
    st[S_FRAMES] += 1
    st[S_NREC] += 1


@njit(nogil=True)
def scan_block(
    raw,
    pos,
    st,
    symtab,
    symlen,
    slots,
    agg,
    touched,
    b_ts,
    b_recv,
    b_sym,
    b_xseq,
    b_lv,
    t_ts,
    t_recv,
    t_sym,
    t_px,
    t_sz,
    t_side,
    t_off,
    t_bytes,
    lv,
    meta,
    tr_ts,
    tr_px,
    tr_sz,
    tr_side,
    tr_tid,
    tr_order,
    tr_meta,
    lim,
    mid,
    mid_ts,
):  # pragma: no cover - compiled
    """Take records from ``raw[pos:]`` until one is not ours; returns the status (see module doc).
    ``agg`` is int64 (3, args): per arg the frames, first and last receive time of this call.
    ``lim``, ``mid``, ``mid_ts``: the wire checks' limits and state (``engine.validate.WireGuard``);
    a frame that fails them is the general parser's."""
    agg_n, agg_first, agg_last = agg[0], agg[1], agg[2]
    for j in range(st[S_NTOUCHED]):
        agg_n[touched[j]] = 0
    st[S_FRAMES] = 0
    st[S_PONGS] = 0
    st[S_FIRST] = -1
    st[S_LAST] = -1
    st[S_NTOUCHED] = 0
    st[S_NREC] = 0
    n = raw.shape[0]
    status = END
    while pos < n:
        if pos + REC_HEADER > n:
            status = SLOW  # a short header: the general reader raises, as it always has
            break
        ts = np.int64(_u(raw, pos, 8))
        kind = raw[pos + 10]
        ln = _u(raw, pos + 11, 4)
        p0 = pos + REC_HEADER
        p1 = p0 + ln
        if kind != 0 or p1 > n:
            status = SLOW
            break
        frame = raw[p0:p1]
        if ln == 4 and frame[0] == 112 and frame[1] == 111 and frame[2] == 110 and frame[3] == 103:  # pong
            if st[S_FIRST] < 0:
                st[S_FIRST] = ts
            st[S_LAST] = ts
            st[S_FRAMES] += 1
            st[S_PONGS] += 1
            st[S_NREC] += 1
            pos = p1
            continue
        if lim[L_FAST] == 0.0:  # the subscription is not the canonical frame's instType
            status = SLOW
            break
        if scan_books15(frame, lv, meta):
            if meta[M_TS_MS] > MAX_TS_MS:
                status = SLOW
                break
            row = st[S_NB]
            if row >= b_ts.shape[0]:
                status = FULL
                break
            sym = intern_symbol(frame, meta[M_SYM_START], meta[M_SYM_END], symtab, symlen, slots, st)
            if sym < 0:
                status = SLOW
                break
            if wire_book_code(lv, meta[M_NBID], meta[M_NASK], meta[M_TS_MS], ts, sym, lim, mid, mid_ts):
                status = SLOW
                break
            b_ts[row] = meta[M_TS_MS] * MS
            b_recv[row] = ts
            b_sym[row] = sym
            b_xseq[row] = meta[M_SEQ]
            for k in range(15):
                # NaN past the last level (the scanner's padding); copied as is
                b_lv[k, row] = lv[0, k]
                b_lv[15 + k, row] = lv[1, k]
                b_lv[30 + k, row] = lv[2, k]
                b_lv[45 + k, row] = lv[3, k]
            st[S_NB] = row + 1
            _tally(st, ts, sym * 2 + CH_BOOKS15, agg_n, agg_first, agg_last, touched)
            pos = p1
            continue
        k = scan_trade(frame, tr_ts, tr_px, tr_sz, tr_side, tr_tid, tr_meta)
        if k <= 0:
            status = SLOW
            break
        row = st[S_NT]
        nbytes = 0
        for w in range(k):
            nbytes += tr_tid[w, 1] - tr_tid[w, 0]
        if row + k > t_ts.shape[0] or st[S_NTB] + nbytes > t_bytes.shape[0]:
            status = FULL
            break
        sym = intern_symbol(frame, tr_meta[T_SYM_START], tr_meta[T_SYM_END], symtab, symlen, slots, st)
        if sym < 0:
            status = SLOW
            break
        c, _ = wire_trades_code(tr_ts, tr_px, tr_sz, k, ts, sym, lim, mid, mid_ts)
        if c:
            status = SLOW
            break
        trade_order(tr_ts, k, tr_order)
        off = st[S_NTB]
        for r in range(k):
            w = tr_order[r]
            t_ts[row] = tr_ts[w] * MS
            t_recv[row] = ts
            t_sym[row] = sym
            t_px[row] = tr_px[w]
            t_sz[row] = tr_sz[w]
            t_side[row] = tr_side[w]
            for i in range(tr_tid[w, 0], tr_tid[w, 1]):
                t_bytes[off] = frame[i]
                off += 1
            t_off[row + 1] = off
            row += 1
        st[S_NT] = row
        st[S_NTB] = off
        _tally(st, ts, sym * 2 + CH_TRADE, agg_n, agg_first, agg_last, touched)
        pos = p1
    st[S_POS] = pos
    return status
