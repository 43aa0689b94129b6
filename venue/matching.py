"""The simulated venue's matching, compiled, written once: an arriving order (:func:`match_arrival`), a
new book over the resting orders (:func:`book_fills`, with :func:`crossed`), a public trade shared among
them (:func:`trade_fills`) and a maker fill (:func:`maker_fill`).

Prices here are whole ticks (:func:`engine.contract.tick_index`; an order's is the core's OI_PX), sizes
whole lots of the contract's size step (:func:`engine.contract.lots_of`): an order's
size, what it has filled and the venue's position are integers, so fills add up exactly and no decimal
rounding is emulated. Displayed and traded sizes become lots where an order takes from them; the
queue models' estimates of what is ahead stay in the book's own units.

``venue/kernel.py`` calls them over the order table it keeps in the engine's state arrays; the replay's
compiled loop and :class:`venue.exchange.SimExchange` (the per-event replay, live paper mode, the local
Bitget exchange) both run that one venue. The loops read the resting orders as columns (side, price,
size, filled, queue state) indexed by row.
"""

from __future__ import annotations

from engine.book import ASK_PX, BID_PX, SIDE_BUY, SIDE_SELL, walk_levels
from engine.contract import lots_of, tick_index
from engine.exact import pmin
from engine.jit import njit
from venue.fills import EPS, on_depth, on_trade

# What an arriving order does after its marketable part.
AR_REST, AR_FILLED, AR_IOC_EXPIRED = 0, 1, 2


@njit
def match_arrival(bk, side, lots, step, limit, tick, market, position, lpx, lq) -> tuple[int, int, int, int]:
    """An order of ``lots`` (lots of ``step``) arriving on book ``bk``: the levels it takes (into
    ``lpx``/``lq``: the book walked up to ``limit`` ticks of ``tick``, all of it when NaN), and (levels taken,
    lots filled, the venue's position in lots after, AR_*). A market order's unfilled rest expires (IOC); a
    limit order's rests on the book."""
    n = walk_levels(bk, side, lots, step, lpx, lq)
    filled = 0
    for j in range(n):
        px = tick_index(lpx[j], tick)
        if limit == limit and ((side == SIDE_BUY and px > limit) or (side == SIDE_SELL and px < limit)):
            n = j
            break
        q = int(lq[j])
        position += q if side == SIDE_BUY else -q
        filled += q
    if filled >= lots:
        return n, filled, position, AR_FILLED
    return n, filled, position, AR_IOC_EXPIRED if market else AR_REST


@njit
def crossed(side, px, best_bid, best_ask) -> bool:
    """The book (its best prices in ticks) traded through a resting order at ``px`` ticks: the aggressors
    took it (a maker fill)."""
    return best_ask <= px if side == SIDE_BUY else best_bid >= px


@njit
def book_fills(kind, n_pow, bk, tick, rows, n, side, px, ahead, level, traded, out) -> int:
    """A new book ``bk`` at the venue over the resting orders ``rows[:n]`` (rows of the columns ``side`` ..
    ``traded``, in arrival order; ``px`` in ticks of ``tick``): each order's queue state (``ahead``,
    ``level``, ``traded``) after it, as fill model ``kind`` (power ``n_pow``) has it; the rows of the orders
    the book traded through go to ``out`` (which may be ``rows``), in that order, and their count is returned.
    Each of those fills as maker, all that remains of it, at its price: the caller fills them after the loop,
    in that order (a fill changes nothing another order's rules read)."""
    k = 0
    best_bid = tick_index(bk[BID_PX], tick)
    best_ask = tick_index(bk[ASK_PX], tick)
    for w in range(n):
        r = rows[w]
        ahead[r], level[r], traded[r] = on_depth(
            kind, n_pow, bk, side[r], px[r], tick, ahead[r], level[r], traded[r]
        )
        if crossed(side[r], px[r], best_bid, best_ask):
            out[k] = r
            k += 1
    return k


@njit
def trade_fills(kind, step, rows, n, side, px, lots, filled, ahead, traded, tpx, tsz, tside, out, fq) -> int:
    """A public trade (``tpx`` in ticks, ``tsz``, aggressor ``tside``) shared among the resting orders
    ``rows[:n]`` (rows of the columns ``side`` .. ``traded``, ``px`` in ticks; ``lots`` and ``filled``
    the venue's, in lots of ``step``): in arrival order, each takes what fill model ``kind`` gives it
    (:func:`venue.fills.on_trade`, its queue state updated in ``ahead``/``traded``) out of what earlier
    orders left of the trade, until nothing is left. An order fills the whole lots of what it takes;
    the part of a lot it took is gone from the trade all the same. The maker fills go to ``out``
    (their rows; may be ``rows``) and ``fq`` (their lots), in that order; their count is returned. The
    caller makes them after the loop, in that order (a fill changes nothing another order's rules
    read)."""
    left = tsz
    k = 0
    for w in range(n):
        if left <= EPS:
            break
        r = rows[w]
        f, ahead[r], traded[r] = on_trade(
            kind, side[r], px[r], (lots[r] - filled[r]) * step, ahead[r], traded[r], tpx, tsz, tside
        )
        q = pmin(f, left)
        if q > EPS:
            left -= q
            got = int(lots_of(q, step))
            if got > 0:
                out[k] = r
                fq[k] = got
                k += 1
    return k


@njit
def maker_fill(side, lots, filled, position, q) -> tuple[int, int, bool]:
    """A maker fill of ``q`` lots on a resting order of ``lots`` with ``filled`` done: (filled after,
    the venue's position after, whether the order is done)."""
    filled += q
    position += q if side == SIDE_BUY else -q
    return filled, position, filled >= lots
