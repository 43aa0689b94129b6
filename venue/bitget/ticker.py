"""The local exchange's ``GET /api/v2/mix/market/ticker``: a symbol's best bid and ask from the exchange's
book, and before the broadcast has started, from the first book its frame source holds for the symbol.

Live mode asks the ticker before it subscribes (it scales a portfolio's sizes by the instruments'
prices, ``engine.instruments.resolve_instruments``), and the local public server only starts
broadcasting on the first subscription: until then the exchange has no book. :class:`FrameLookahead`
lets the ticker read ahead in the frame source without taking frames from the broadcast (every frame
read ahead is kept for it, in order), so the answer is the book the session will start with, the one a
replay of the recorded session reads first.

Divergences from the venue (not verified against it): the row carries ``symbol``, ``lastPr``,
``bidPr``, ``askPr``, ``bidSz``, ``askSz``, ``markPrice``, ``indexPrice`` and ``ts`` only (no 24 h
figures, funding or open interest); ``lastPr`` is the last trade the exchange applied, the mid before
any; ``markPrice`` and ``indexPrice`` are the mid; an unlisted symbol, or one with no book within
:data:`LOOKAHEAD_MAX` frames, answers an empty list.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterator
from typing import Any, Final

from engine.events import BookSnapshot
from venue.bitget.rest_server import plain_decimal
from wire.bitget.bitget_v2 import StreamCounters, decode

# frames the ticker reads ahead at most for a symbol's first book (they are held until broadcast)
LOOKAHEAD_MAX: Final = 100_000


class FrameLookahead:
    """A frame source read once, by the broadcast (iterating it) and by :meth:`first_book` (from any
    thread): frames read ahead are kept and handed to the broadcast in their order."""

    def __init__(self, source: Any) -> None:
        self._it = iter(source)
        self._ahead: deque[Any] = deque()
        self._first: dict[str, BookSnapshot] = {}
        self._counters = StreamCounters()
        self._lock = threading.Lock()

    def __iter__(self) -> Iterator[Any]:
        while True:
            with self._lock:
                item = self._ahead.popleft() if self._ahead else next(self._it, None)
            if item is None:
                return
            yield item

    def first_book(self, symbol: str) -> BookSnapshot | None:
        """The first book of ``symbol`` among the frames not yet broadcast, reading ahead for it (at most
        LOOKAHEAD_MAX frames held); None when there is none."""
        with self._lock:
            if symbol in self._first:  # every frame read ahead was looked at as it was read
                return self._first[symbol]
            while len(self._ahead) < LOOKAHEAD_MAX:
                item = next(self._it, None)
                if item is None:
                    return None
                self._ahead.append(item)
                if (book := self._book(item, symbol)) is not None:
                    return book
            return None

    def _book(self, item: Any, symbol: str) -> BookSnapshot | None:
        for ev in decode(item[1], 0, self._counters):
            if isinstance(ev, BookSnapshot) and ev.symbol not in self._first:
                self._first[ev.symbol] = ev
        return self._first.get(symbol)


def ticker_row(symbol: str, book: BookSnapshot, last_px: float, ts_ms: int) -> dict[str, Any]:
    """A ticker row for ``symbol`` whose book is ``book`` (``last_px``: the last trade's price, NaN for
    none)."""
    bid, ask = book.bid_px[0], book.ask_px[0]
    mid = (bid + ask) / 2
    return {
        "symbol": symbol,
        "lastPr": plain_decimal(last_px if last_px == last_px else mid),
        "bidPr": plain_decimal(bid),
        "askPr": plain_decimal(ask),
        "bidSz": plain_decimal(book.bid_sz[0]),
        "askSz": plain_decimal(book.ask_sz[0]),
        "markPrice": plain_decimal(mid),
        "indexPrice": plain_decimal(mid),
        "ts": str(ts_ms),
    }
