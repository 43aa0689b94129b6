"""Pure helpers over a 15-level book snapshot."""

from __future__ import annotations

import math

from engine.events import BookSnapshot


def walk_book(book: BookSnapshot, side: str, qty: float) -> list[tuple[float, float]]:
    """Levels a market order of ``qty`` on ``side`` would take: ``[(px, qty), ...]``.

    A buy consumes asks from the best up; a sell consumes bids from the best down. The result may
    fill less than ``qty`` when the displayed depth runs out.
    """
    px, sz = (book.ask_px, book.ask_sz) if side == "buy" else (book.bid_px, book.bid_sz)
    out: list[tuple[float, float]] = []
    left = qty
    for p, s in zip(px, sz, strict=True):
        if left <= 1e-12 or math.isnan(p):
            break
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
