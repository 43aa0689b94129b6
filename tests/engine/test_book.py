"""engine/book.py's top predicates and the door's tick-path check (engine.validate.top_ok) agree."""

import dataclasses
import itertools
import math

import numpy as np

from engine import validate as V
from engine.book import tradable, tradable_levels, tradable_top, valid_top
from engine.risk import R_BAD_BOOK, REASONS, OrderIntent, RiskLimits, RiskState, check
from tests.helpers import make_book


def _zero_top(side: str):
    book = make_book()
    sizes = getattr(book, f"{side}_sz")
    return dataclasses.replace(book, **{f"{side}_sz": (0.0, *sizes[1:])})


def test_a_zero_size_at_the_top_is_valid_input_but_not_tradable():
    for side in ("bid", "ask"):
        book = _zero_top(side)
        # the door: live's tick path lets it in, as the replay's column check does (no quarantine)
        assert V.top_ok(book) and V.book_reason(book) == ""
        assert V.book_codes(np.array([book.bid_px + book.bid_sz + book.ask_px + book.ask_sz]))[0] == 0
        # nothing to trade against: the strategy does not quote on it and the gateway refuses a new order
        assert not tradable(book) and not tradable_levels(
            np.array(book.bid_px + book.bid_sz + book.ask_px + book.ask_sz)
        )
        intent = OrderIntent(
            client_oid="c1",
            symbol="BTCUSDT",
            intent="new",
            side="buy",
            order_type="limit",
            px=100.0,
            qty=0.001,
        )
        ok, reason = check(RiskLimits(), RiskState(), intent, book, book.ts_recv)
        assert not ok and reason == REASONS[R_BAD_BOOK]
    assert V.top_ok(make_book()) and tradable(make_book())


def test_the_two_predicates_differ_only_on_a_zero_size():
    # one chain written once: tradable is valid with size on both sides, over every corner of the top
    prices = (math.nan, -1.0, 0.0, 99.9, 100.0, 100.1, math.inf)
    sizes = (math.nan, -1.0, 0.0, 1e-9, 2.0, math.inf)
    for bid, ask in itertools.product(prices, prices):
        for bid_sz, ask_sz in itertools.product(sizes, sizes):
            valid = valid_top(bid, bid_sz, ask, ask_sz)
            assert tradable_top(bid, bid_sz, ask, ask_sz) == (valid and bid_sz != 0.0 and ask_sz != 0.0)
            assert valid == (
                0.0 < bid < ask < math.inf and 0.0 <= bid_sz < math.inf and 0.0 <= ask_sz < math.inf
            )
