"""Small builders shared by tests."""

import math

from engine.events import BookSnapshot


def make_book(
    bid: float = 100.0,
    ask: float = 100.1,
    *,
    ts: int = 1_000_000_000,
    seq: int = 0,
    size: float = 1.0,
    levels: int = 15,
    tick: float = 0.1,
    symbol: str = "BTCUSDT",
) -> BookSnapshot:
    nan = math.nan
    pad = (nan,) * (15 - levels)
    return BookSnapshot(
        ts_event=ts,
        ts_recv=ts,
        seq=seq,
        symbol=symbol,
        exch_seq=seq,
        bid_px=tuple(round(bid - i * tick, 10) for i in range(levels)) + pad,
        bid_sz=(size,) * levels + pad,
        ask_px=tuple(round(ask + i * tick, 10) for i in range(levels)) + pad,
        ask_sz=(size,) * levels + pad,
    )
