"""Book rules over a 15-level snapshot, written once and compiled.

The compiled functions read a book as 60 floats (:func:`as_levels`: bid prices, bid sizes, ask prices,
ask sizes, 15 each, NaN where a level is missing): the replay kernel keeps its books in that layout and
calls them directly; live and the general replay path call the same functions through the thin
wrappers over :class:`~engine.events.BookSnapshot` at the end of this module.
"""

from __future__ import annotations

import math

import numpy as np

from engine.contract import at_units, lots_of
from engine.events import BookSnapshot
from engine.exact import pmin
from engine.jit import njit

LEVELS = 15
BID_PX, BID_SZ, ASK_PX, ASK_SZ = 0, 15, 30, 45
WIDTH = 60
SIDE_BUY, SIDE_SELL = 0, 1


@njit
def valid_top(bid: float, bid_sz: float, ask: float, ask_sz: float) -> bool:
    """A two-sided top the door lets in (``engine.validate.top_ok``, live's tick path, agreeing with the
    replay's column check): prices finite, positive and not crossed or locked, sizes finite and >= 0.
    One chain of ``<`` so that NaN fails it."""
    return 0.0 < bid < ask < math.inf and 0.0 <= bid_sz < math.inf and 0.0 <= ask_sz < math.inf


@njit
def tradable_top(bid: float, bid_sz: float, ask: float, ask_sz: float) -> bool:
    """A valid top (:func:`valid_top`) with size on both sides: the only kind the strategy quotes on and
    the risk gateway lets a new order through on. A zero size at the top is valid input (not
    quarantined, in live and replay alike) but nothing to trade against."""
    return valid_top(bid, bid_sz, ask, ask_sz) and bid_sz > 0.0 and ask_sz > 0.0


@njit
def tradable_levels(bk) -> bool:
    return tradable_top(bk[BID_PX], bk[BID_SZ], bk[ASK_PX], bk[ASK_SZ])


@njit
def walk_levels(bk, side, lots, step, lpx, lq) -> int:
    """The levels a market order of ``lots`` whole lots of ``step`` on ``side`` (SIDE_*) would take,
    into ``lpx`` and ``lq`` (whole lots, :func:`engine.contract.lots_of` of each level's size); returns
    how many.

    A buy consumes asks from the best up, a sell bids from the best down; the result may fill less
    than ``lots`` when the displayed depth runs out. The walk stops at the first level that is not a
    real one (missing, a non-finite or non-positive price, a negative or non-finite size, a price on
    the wrong side of the previous level): past it the book says nothing trustworthy, so what it would
    fill is not counted (the risk gateway then sees a short fill and refuses). A level of less than a
    lot gives nothing and is passed over. Sizes are integers of lots, so what the takes add up to is
    exact: no decimal rounding is emulated."""
    off = ASK_PX if side == SIDE_BUY else BID_PX
    left = lots
    n = 0
    prev = 0.0 if side == SIDE_BUY else math.inf
    for i in range(LEVELS):
        p = bk[off + i]
        s = bk[off + LEVELS + i]
        if left <= 0 or not (0.0 < p < math.inf and 0.0 <= s < math.inf):
            break
        if (p <= prev) if side == SIDE_BUY else (p >= prev):
            break
        prev = p
        take = pmin(left, lots_of(s, step))
        if take > 0:
            lpx[n] = p
            lq[n] = take
            n += 1
            left -= take
    return n


@njit
def imbalance_levels(bk) -> float:
    """(bid depth - ask depth) / (bid depth + ask depth) over the displayed levels."""
    b = 0.0
    a = 0.0
    for i in range(LEVELS):
        s = bk[BID_SZ + i]
        if s == s:
            b += s
    for i in range(LEVELS):
        s = bk[ASK_SZ + i]
        if s == s:
            a += s
    return (b - a) / (b + a) if b + a > 0 else 0.0


# ---------------------------------------------------------------- over a BookSnapshot


_last: tuple[BookSnapshot | None, np.ndarray] = (None, np.empty(0))  # replaced in one store


def remember_levels(book: BookSnapshot, levels: np.ndarray) -> None:
    """``levels`` (60 float64 in :func:`as_levels`' layout, owned by the caller no more) are ``book``'s:
    a parser that has them hands them over, so the first ``as_levels(book)`` of the tick path (the paper
    exchange's, then the engine's) finds them made instead of building them from the tuples."""
    global _last
    _last = (book, levels)


def as_levels(book: BookSnapshot) -> np.ndarray:
    """The book in the compiled layout (60 float64), made once per snapshot: the strategy, the risk
    gateway and every resting order at the simulated venue read the same book. Read-only to callers."""
    global _last
    last = _last
    if last[0] is book:
        return last[1]
    bk = np.array(book.bid_px + book.bid_sz + book.ask_px + book.ask_sz, dtype=np.float64)
    _last = (book, bk)
    return bk


def tradable(book: BookSnapshot) -> bool:
    return tradable_top(book.bid_px[0], book.bid_sz[0], book.ask_px[0], book.ask_sz[0])


def walk_book(book: BookSnapshot, side: str, qty: float, step: float) -> list[tuple[float, float]]:
    """:func:`walk_levels` of ``qty`` (whole lots of ``step`` of it) as ``[(px, qty), ...]``."""
    lpx = np.empty(LEVELS)
    lq = np.empty(LEVELS)
    n = walk_levels(
        as_levels(book), SIDE_BUY if side == "buy" else SIDE_SELL, lots_of(qty, step), step, lpx, lq
    )
    return [(float(lpx[j]), at_units(lq[j], step)) for j in range(n)]


def imbalance(book: BookSnapshot) -> float:
    return float(imbalance_levels(as_levels(book)))
