"""Compiled fast path of the Bitget v2 ``books15`` decoder, exactly equal to :func:`bitget_v2.decode`.

Why: CPython spends ~25 us on one books15 frame (60 ``float()`` calls, tuples, checks); the
recorder's normaliser and the live tick path decode every frame. This module scans the frame bytes
once in numba and parses each price and size with Clinger's fast path, which is exact: a decimal
of at most 15 digits is an integer below 2**53 and 10**k (k <= 22) is a double, so one IEEE division
gives the correctly rounded value, the same double CPython's ``float()`` returns.

It only accepts the canonical frame, byte for byte the layout Bitget, the simulator and the local
server send (``{"action":"snapshot","arg":{...,"channel":"books15","instId":"X"},"data":[{"asks":[..],
"bids":[..],"checksum":N,"seq":N,"ts":"N"}],"ts":N}``), with plain decimals, 1..15 positive strictly
ordered levels a side and an uncrossed book. Anything else (other key order, whitespace, escapes,
exponents, too many digits, a bad level, another channel) returns "not mine" and the caller uses the
general decoder, which also finds the quarantine reason. So the fast path can only ever be faster,
never different; ``tests/test_bitget_v2_fast.py`` checks equality frame by frame.
"""

from __future__ import annotations

import math
from typing import Final

import numpy as np
from numba import njit

from engine.events import BOOK_LEVELS, BookSnapshot, Nanos, Quarantined, Trade
from engine.venues.bitget_v2 import MS, Control, StreamCounters, decode

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

_QUOTE, _COMMA, _LBRACK, _RBRACK, _DOT, _MINUS, _RBRACE = 34, 44, 91, 93, 46, 45, 125


@njit(cache=True, nogil=True)
def _expect(buf, i, lit):  # pragma: no cover - compiled
    n = lit.shape[0]
    if i + n > buf.shape[0]:
        return -1
    for k in range(n):
        if buf[i + k] != lit[k]:
            return -1
    return i + n


@njit(cache=True, nogil=True)
def _uint(buf, i, out, slot):  # pragma: no cover - compiled
    """Unsigned decimal integer of 1..18 digits into out[slot]; returns the next index or -1."""
    n = buf.shape[0]
    v = 0
    j = i
    while j < n and 48 <= buf[j] <= 57 and j - i < 19:
        v = v * 10 + (buf[j] - 48)
        j += 1
    if j == i or j - i > 18:
        return -1
    out[slot] = v
    return j


@njit(cache=True, nogil=True)
def _decimal(buf, i, pow10, vals, k):  # pragma: no cover - compiled
    """A quoted plain decimal ``"123.45"`` (<= 15 digits) into vals[k]; returns the next index or -1."""
    n = buf.shape[0]
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


@njit(cache=True, nogil=True)
def _levels(buf, i, pow10, px, sz):  # pragma: no cover - compiled
    """``["p","s"],["p","s"]...`` up to the closing ``]`` of the side; returns (next index, count)."""
    count = 0
    n = buf.shape[0]
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


@njit(cache=True, nogil=True)
def scan_books15(buf, levels, meta):  # pragma: no cover - compiled
    """Parse one canonical books15 frame. ``levels`` is float64 (4, 15): bid px, bid sz, ask px, ask sz
    (NaN past the last level); ``meta`` int64 (6,). Returns True when the frame is the fast path's."""
    pow10 = _POW10
    i = _expect(buf, 0, _HEAD)
    if i < 0:
        return False
    start = i
    n = buf.shape[0]
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
    i = _expect(buf, i, _CHECKSUM)
    if i < 0:
        return False
    if i < n and buf[i] == _MINUS:  # checksum is a signed int32; decode ignores it
        i += 1
    i = _uint(buf, i, meta, M_TS_MS)  # scratch slot, overwritten below
    if i < 0:
        return False
    i = _expect(buf, i, _SEQ)
    if i < 0:
        return False
    i = _uint(buf, i, meta, M_SEQ)
    if i < 0:
        return False
    i = _expect(buf, i, _TS)
    if i < 0:
        return False
    i = _uint(buf, i, meta, M_TS_MS)
    if i < 0:
        return False
    i = _expect(buf, i, _TAIL_TS)
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


_PAD: Final = tuple((math.nan,) * (BOOK_LEVELS - k) for k in range(BOOK_LEVELS + 1))


class Books15Scanner:
    """Reusable buffers around :func:`scan_books15` (one per thread of decoding)."""

    __slots__ = ("levels", "meta")

    def __init__(self) -> None:
        self.levels = np.empty((4, BOOK_LEVELS), dtype=np.float64)
        self.meta = np.zeros(N_META, dtype=np.int64)

    def scan(self, raw: bytes) -> bool:
        """True when ``raw`` is a canonical books15 frame; its values are then in ``levels``/``meta``."""
        return bool(scan_books15(np.frombuffer(raw, dtype=np.uint8), self.levels, self.meta))

    def symbol(self, raw: bytes) -> str:
        m = self.meta
        return raw[m[M_SYM_START] : m[M_SYM_END]].decode("ascii")

    def book(self, raw: bytes, ts_recv: Nanos, counters: StreamCounters) -> BookSnapshot:
        """The event of the frame just scanned, equal to what :func:`decode` builds."""
        lv = self.levels.tolist()
        m = self.meta
        # padding is math.nan itself, as in decode, so events compare equal (NaN == NaN only by identity)
        nb, na = int(m[M_NBID]), int(m[M_NASK])
        pb, pa = _PAD[nb], _PAD[na]
        return BookSnapshot(
            ts_event=int(m[M_TS_MS]) * MS,
            ts_recv=ts_recv,
            seq=counters.take("books15"),
            symbol=self.symbol(raw),
            exch_seq=int(m[M_SEQ]),
            bid_px=tuple(lv[0][:nb]) + pb,
            bid_sz=tuple(lv[1][:nb]) + pb,
            ask_px=tuple(lv[2][:na]) + pa,
            ask_sz=tuple(lv[3][:na]) + pa,
        )


_DEFAULT = Books15Scanner()


def decode_fast(
    raw: bytes | str, ts_recv: Nanos, counters: StreamCounters, scanner: Books15Scanner | None = None
) -> list[BookSnapshot | Trade | Quarantined | Control]:
    """Drop-in for :func:`bitget_v2.decode`: canonical books15 frames take the compiled path."""
    if isinstance(raw, bytes):
        sc = scanner or _DEFAULT
        if sc.scan(raw):
            return [sc.book(raw, ts_recv, counters)]
    return decode(raw, ts_recv, counters)


def warm_up() -> None:
    """Compile (or load from numba's cache) before the first real frame needs it."""
    from engine.venues.bitget_v2 import encode_books15

    raw = encode_books15("WARMUP", ts_ms=1, seq=1, bids=[("1.0", "1")], asks=[("2.0", "1")], push_ts_ms=1)
    Books15Scanner().scan(raw)
