"""The local exchange's ticker (venue/bitget/ticker.py): before its broadcast starts it answers from the
first book its frames hold, without taking any frame from the broadcast; then from its own book."""

import asyncio
import time

import pytest

from engine.events import BookSnapshot
from live.gateway import BitgetGateway
from tests.helpers import make_book
from venue.bitget.exchange import LocalExchange, LocalExchangeThread
from venue.bitget.public_server import simulator_frames
from venue.bitget.ticker import FrameLookahead
from wire.bitget.bitget_v2 import StreamCounters, decode
from wire.bitget.bitget_v2_rest import PATH_TICKER, BitgetParamError, parse_ticker

SYMBOLS = ("BTCUSDT", "ETHUSDT")


def _first_books(frames):
    first: dict[str, BookSnapshot] = {}
    counters = StreamCounters()
    for _, raw in frames:
        for ev in decode(raw, 0, counters):
            if isinstance(ev, BookSnapshot):
                first.setdefault(ev.symbol, ev)
    return first


def _tickers(ex, *symbols):
    async def go():
        gw = BitgetGateway(ex.rest_url)
        try:
            return [await gw.ticker(s) for s in symbols]
        finally:
            await gw.aclose()

    return asyncio.run(go())


def test_read_ahead_frames_all_reach_the_broadcast_in_order():
    frames = list(simulator_frames(list(SYMBOLS), minutes=0.2, seed=3))
    first = _first_books(frames)
    ahead = FrameLookahead(frames)
    eth = ahead.first_book("ETHUSDT")
    assert eth is not None and (eth.bid_px, eth.ask_px) == (first["ETHUSDT"].bid_px, first["ETHUSDT"].ask_px)
    assert ahead.first_book("SOLUSDT") is None  # read to the end: every frame is held
    assert list(ahead) == frames


def test_the_ticker_answers_the_first_book_before_the_broadcast_then_the_exchange_s():
    frames = list(simulator_frames(list(SYMBOLS), minutes=0.2, seed=3))
    first = _first_books(frames)
    with LocalExchangeThread(LocalExchange(frames, symbols=SYMBOLS)) as ex:
        btc, eth, sol = _tickers(ex, "BTCUSDT", "ETHUSDT", "SOLUSDT")
        assert ex.public.source_frames == 0  # nobody subscribed: nothing broadcast yet
        for t in (btc, eth):
            book = first[t.symbol]
            assert (t.bid, t.ask) == (book.bid_px[0], book.ask_px[0])
            assert t.mid == book.mid  # what a replay of the session reads as its first mid
        assert sol is None  # no contract listed for it: an empty list
        ex.apply_book(make_book(30000.0, 30000.2, ts=time.time_ns()))
        (now,) = _tickers(ex, "BTCUSDT")
        assert (now.bid, now.ask, now.mid) == (30000.0, 30000.2, 30000.1)

        async def no_symbol():
            gw = BitgetGateway(ex.rest_url)
            try:
                await gw.request("GET", PATH_TICKER, params={"productType": "USDT-FUTURES"}, signed=False)
            finally:
                await gw.aclose()

        with pytest.raises(BitgetParamError, match="symbol cannot be empty"):
            asyncio.run(no_symbol())


def test_a_ticker_row_parses_bitget_s_fields():
    row = {"symbol": "ETHUSDT", "lastPr": "3000.5", "bidPr": "3000.4", "askPr": "3000.6", "ts": "1695794271"}
    t = parse_ticker(row)
    assert (t.symbol, t.last, t.mid, t.ts_ms) == ("ETHUSDT", 3000.5, 3000.5, 1695794271)
    assert parse_ticker({**row, "bidPr": "", "askPr": ""}).mid == 3000.5  # no book: the last trade
    with pytest.raises(ValueError, match="lastPr"):
        parse_ticker({**row, "lastPr": "x"})
