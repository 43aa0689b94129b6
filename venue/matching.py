"""The simulated venue's matching, compiled, written once: an arriving order (:func:`match_arrival`), a
new book over the resting orders (:func:`book_fills`, with :func:`crossed`), a public trade shared among
them (:func:`trade_fills`) and a maker fill (:func:`maker_fill`).

``venue/kernel.py`` calls them over the order table it keeps in the engine's state arrays; the replay's
compiled loop and :class:`venue.exchange.SimExchange` (the per-event replay, live paper mode, the local
Bitget exchange) both run that one venue. The loops read the resting orders as columns (side, price,
size, filled, queue state) indexed by row.
"""

from __future__ import annotations

from engine.book import ASK_PX, BID_PX, SIDE_BUY, SIDE_SELL, walk_levels
from engine.exact import pmin, pyround
from engine.jit import njit
from venue.fills import EPS, on_depth, on_trade

# What an arriving order does after its marketable part.
AR_REST, AR_FILLED, AR_IOC_EXPIRED = 0, 1, 2


@njit
def match_arrival(bk, side, qty, limit, market, position, lpx, lq) -> tuple[int, float, float, int]:
    """An order arriving on book ``bk``: the levels it takes (into ``lpx``/``lq``: the book walked up to
    ``limit``, all of it when NaN), and (levels taken, filled, the venue's position after, AR_*).
    A market order's unfilled rest expires (IOC); a limit order's rests on the book."""
    n = walk_levels(bk, side, qty, lpx, lq)
    filled = 0.0
    for j in range(n):
        px = lpx[j]
        if limit == limit and ((side == SIDE_BUY and px > limit) or (side == SIDE_SELL and px < limit)):
            n = j
            break
        position += lq[j] if side == SIDE_BUY else -lq[j]
        filled += lq[j]
    if qty - filled <= EPS:
        return n, filled, position, AR_FILLED
    return n, filled, position, AR_IOC_EXPIRED if market else AR_REST


@njit
def crossed(side, px, best_bid, best_ask) -> bool:
    """The book traded through a resting order at ``px``: the aggressors took it (a maker fill)."""
    return best_ask <= px if side == SIDE_BUY else best_bid >= px


@njit
def book_fills(kind, n_pow, bk, rows, n, side, px, ahead, level, traded, out) -> int:
    """A new book ``bk`` at the venue over the resting orders ``rows[:n]`` (rows of the columns
    ``side`` .. ``traded``, in arrival order): each order's queue state (``ahead``, ``level``,
    ``traded``) after it, as fill model ``kind`` (power ``n_pow``) has it; the rows of the orders the
    book traded through go to ``out`` (which may be ``rows``), in that order, and their count is
    returned. Each of those fills as maker, all that remains of it, at its price: the caller fills them
    after the loop, in that order (a fill changes nothing another order's rules read)."""
    k = 0
    for w in range(n):
        r = rows[w]
        ahead[r], level[r], traded[r] = on_depth(
            kind, n_pow, bk, side[r], px[r], ahead[r], level[r], traded[r]
        )
        if crossed(side[r], px[r], bk[BID_PX], bk[ASK_PX]):
            out[k] = r
            k += 1
    return k


@njit
def trade_fills(kind, rows, n, side, px, qty, filled, ahead, traded, tpx, tsz, tside, out, fq) -> int:
    """A public trade (``tpx``, ``tsz``, aggressor ``tside``) shared among the resting orders
    ``rows[:n]`` (rows of the columns ``side`` .. ``traded``, ``filled`` the venue's): in arrival
    order, each takes what fill model ``kind`` gives it (:func:`venue.fills.on_trade`, its queue state
    updated in ``ahead``/``traded``) out of what earlier orders left of the trade, until nothing is
    left. The maker fills go to ``out`` (their rows; may be ``rows``) and ``fq`` (their quantities,
    before :func:`maker_fill` rounds them), in that order; their count is returned. The caller makes
    them after the loop, in that order (a fill changes nothing another order's rules read)."""
    left = tsz
    k = 0
    for w in range(n):
        if left <= EPS:
            break
        r = rows[w]
        f, ahead[r], traded[r] = on_trade(
            kind, side[r], px[r], qty[r] - filled[r], ahead[r], traded[r], tpx, tsz, tside
        )
        q = pmin(f, left)
        if q > EPS:
            left -= q
            out[k] = r
            fq[k] = q
            k += 1
    return k


@njit
def maker_fill(side, qty, filled, position, q) -> tuple[float, float, float, bool]:
    """A maker fill of ``q`` on a resting order of ``qty`` with ``filled`` done: (the fill's quantity,
    filled after, the venue's position after, whether the order is done). The quantity is rounded to 12
    digits, so partial fills of sizes like 0.1 + 0.2 sum to the size."""
    r = pyround(q, 12)
    filled += r
    position += r if side == SIDE_BUY else -r
    return r, filled, position, qty - filled <= EPS
