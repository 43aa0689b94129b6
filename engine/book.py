"""Pure helpers over a 15-level book snapshot."""

from __future__ import annotations

import math

from engine.events import BookSnapshot


def tradable(book: BookSnapshot) -> bool:
    """A two-sided book whose best prices and sizes are finite, positive and not crossed or locked: the
    only kind the strategy quotes on and the risk gateway lets a new order through on. Written as one
    chain of ``<`` so that NaN fails it."""
    b, a = book.bid_px[0], book.ask_px[0]
    return 0.0 < b < a < math.inf and 0.0 < book.bid_sz[0] < math.inf and 0.0 < book.ask_sz[0] < math.inf


def walk_book(book: BookSnapshot, side: str, qty: float) -> list[tuple[float, float]]:
    """Levels a market order of ``qty`` on ``side`` would take: ``[(px, qty), ...]``.

    A buy consumes asks from the best up; a sell consumes bids from the best down. The result may
    fill less than ``qty`` when the displayed depth runs out. The walk stops at the first level that
    is not a real one (missing, a non-finite or non-positive price, a negative or non-finite size, a
    price on the wrong side of the previous level): past it the book says nothing trustworthy, so what
    it would fill is not counted (the risk gateway then sees a short fill and refuses).
    """
    buy = side == "buy"
    px, sz = (book.ask_px, book.ask_sz) if buy else (book.bid_px, book.bid_sz)
    out: list[tuple[float, float]] = []
    left = qty
    prev = 0.0 if buy else math.inf
    for p, s in zip(px, sz, strict=True):
        if left <= 1e-12 or not (0.0 < p < math.inf and 0.0 <= s < math.inf):
            break
        if (p <= prev) if buy else (p >= prev):
            break
        prev = p
        take = round(min(left, s), 12)
        out.append((p, take))
        left -= take
    return out


def avg_price(levels: list[tuple[float, float]]) -> float:
    q = sum(x for _, x in levels)
    return sum(p * x for p, x in levels) / q if q > 0 else math.nan


def imbalance(book: BookSnapshot) -> float:
    """(bid depth - ask depth) / (bid depth + ask depth) over the displayed levels."""
    b = sum(s for s in book.bid_sz if s == s)
    a = sum(s for s in book.ask_sz if s == s)
    return (b - a) / (b + a) if b + a > 0 else 0.0
