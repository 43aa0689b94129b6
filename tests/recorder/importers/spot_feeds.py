"""Binance spot raw feeds (``<ts_recv_ns> <raw JSON>`` lines, as a recorder of Binance's combined
streams writes them) of a market on any grid: a REST depth snapshot, 100 ms depth diffs whose ``U``
follows the previous ``u`` (spot's sync rule), trades at the touch. Numbers are written as Binance
spot writes them, eight decimals (``"61837.63000000"``), so the importer meets the real strings."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import numpy as np
import orjson

MS = 1_000_000
DEPTH = 20


def _num(units: int, unit: Decimal) -> str:
    return f"{Decimal(units) * unit:.8f}"


def spot_feed(
    path: Path,
    *,
    symbol: str = "BTCUSDT",
    price: str = "61837.63",
    tick: str = "0.01",
    step: str = "0.00001",
    seconds: int = 240,
    seed: int = 3,
    trade_lots: int = 800,
    level_lots: int = 3000,
) -> Path:
    """Write the feed to ``path``: the mid walks a tick at a time, each side shows ``DEPTH`` levels a
    tick apart, and trades of up to ``trade_lots`` lots hit the touch; everything seeded."""
    rng = np.random.default_rng(seed)
    t, s = Decimal(tick), Decimal(step)
    bid = int(Decimal(price) / t)  # the best bid, in ticks
    stream = symbol.lower()
    e_ms = 1_700_000_000_000
    lines: list[bytes] = []

    def book(best_bid: int) -> tuple[dict[int, int], dict[int, int]]:
        bids = {best_bid - i: int(rng.integers(1, level_lots)) for i in range(DEPTH)}
        asks = {best_bid + 1 + i: int(rng.integers(1, level_lots)) for i in range(DEPTH)}
        return bids, asks

    def side(levels: dict[int, int], old: dict[int, int]) -> list[list[str]]:
        rows = [[_num(k, t), _num(v, s)] for k, v in levels.items()]
        return rows + [[_num(k, t), "0.00000000"] for k in old if k not in levels]

    bids, asks = book(bid)
    snap = {"lastUpdateId": 1000, "bids": side(bids, {}), "asks": side(asks, {})}
    lines.append(f"{e_ms * MS} ".encode() + orjson.dumps(snap))
    u = 1000
    trade_id = 5_000_000
    for _ in range(seconds * 10):
        e_ms += 100
        move = int(rng.choice((-1, 0, 0, 0, 1)))
        bid += move
        new_bids, new_asks = book(bid)
        big_u, u = u + 1, u + int(rng.integers(1, 30))
        diff = {
            "e": "depthUpdate",
            "E": e_ms,
            "s": symbol,
            "U": big_u,
            "u": u,
            "b": side(new_bids, bids),
            "a": side(new_asks, asks),
        }
        bids, asks = new_bids, new_asks
        lines.append(
            f"{(e_ms + 20) * MS} ".encode() + orjson.dumps({"stream": f"{stream}@depth@100ms", "data": diff})
        )
        for _ in range(int(rng.poisson(1.5))):
            trade_id += 1
            sell = bool(rng.integers(0, 2))  # m: the buyer is the maker, a sell hit the bid
            px = bid if sell else bid + 1
            trade = {
                "e": "trade",
                "E": e_ms + 5,
                "s": symbol,
                "t": trade_id,
                "p": _num(px, t),
                "q": _num(int(rng.integers(1, trade_lots)), s),
                "T": e_ms + 4,
                "m": sell,
                "M": True,
            }
            lines.append(
                f"{(e_ms + 25) * MS} ".encode() + orjson.dumps({"stream": f"{stream}@trade", "data": trade})
            )
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path
