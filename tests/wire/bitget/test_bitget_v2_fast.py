"""The compiled books15 fast path gives exactly what the general decoder gives, frame for frame."""

from __future__ import annotations

import random

import numpy as np
import pytest

from engine.events import Quarantined
from venue.simulator import generate_frames
from wire.bitget.bitget_v2 import StreamCounters, decode, encode_books15
from wire.bitget.bitget_v2_fast import Books15Scanner, decode_fast

DOC_FRAME = (
    b'{"action":"snapshot","arg":{"instType":"USDT-FUTURES","channel":"books15","instId":"BTCUSDT"},'
    b'"data":[{"asks":[["27000.5","8.760"],["27001.0","0.400"]],"bids":[["27000.0","2.710"],'
    b'["26999.5","1.460"]],"checksum":0,"seq":123,"ts":"1695716059516"}],"ts":1695716059516}'
)


def _both(raw: bytes, ts: int = 5) -> tuple[list, list]:
    return decode(raw, ts, StreamCounters()), decode_fast(raw, ts, StreamCounters())


def test_doc_example_takes_the_fast_path_and_equals_decode():
    sc = Books15Scanner()
    assert sc.scan(DOC_FRAME)
    slow, fast = _both(DOC_FRAME)
    assert fast == slow
    assert fast[0].bid_px[:2] == (27000.0, 26999.5) and fast[0].ask_sz[1] == 0.4
    assert sc.symbol(DOC_FRAME) == "BTCUSDT"


def test_every_simulated_frame_decodes_identically():
    """Whole simulated sessions (books15 and trade interleaved, the counters shared): same events,
    same per-stream seq, and nearly every books15 frame took the compiled path."""
    c_slow, c_fast = StreamCounters(), StreamCounters()
    sc = Books15Scanner()
    books = fast = 0
    for ts, raw in generate_frames(minutes=3, seed=11):
        assert decode_fast(raw, ts, c_fast, sc) == decode(raw, ts, c_slow)
        if b'"books15"' in raw:
            books += 1
            fast += sc.scan(raw)
    assert books > 1000 and fast == books
    assert c_fast.next_seq == c_slow.next_seq


def _frame(bids, asks, **kw) -> bytes:
    return encode_books15(
        "ETHUSDT",
        ts_ms=kw.get("ts", 1700000000123),
        seq=kw.get("seq", 9),
        bids=bids,
        asks=asks,
        push_ts_ms=1700000000125,
    )


def _random_decimal(rng: random.Random) -> str:
    ip = str(rng.choice([0, 1, 7, 99, 1234, 59944, 123456789, 10**14]))
    if rng.random() < 0.3:
        return ip
    return ip + "." + "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 9)))


def test_random_decimals_round_exactly_like_float():
    """Clinger's fast path against CPython's float() over many digit patterns, including ones past
    15 digits that must fall back (and then still agree, through decode)."""
    rng = random.Random(3)
    sc = Books15Scanner()
    for _ in range(3000):
        a, b = _random_decimal(rng), _random_decimal(rng)
        raw = _frame([("1.0", a)], [(b, "2.5")] if float(b) > 1.0 else [("2.0", b)])
        slow, fast = _both(raw)
        assert fast == slow, raw
        if sc.scan(raw):
            assert sc.levels[1, 0] == float(a)


@pytest.mark.parametrize(
    "mutate",
    [
        lambda r: r.replace(b'"action":"snapshot"', b'"action":"update"'),  # other action: slow path
        lambda r: r.replace(b'"2000.5"', b'"2e3"'),  # exponent
        lambda r: r.replace(b'"2000.5"', b'"-2000.5"'),  # negative price
        lambda r: r.replace(b'"2000.5"', b'"2000.5 "'),  # trailing space inside the string
        lambda r: r.replace(b'"2000.5"', b'"0"'),  # zero price
        lambda r: r.replace(b'"2000.5"', b'"NaN"'),
        lambda r: r.replace(b'"2000.5"', b'"1999.0"'),  # ask below bid: crossed
        lambda r: r.replace(b'"2001.0"', b'"2000.5"'),  # asks not strictly ascending
        lambda r: r.replace(b'"1999.5"', b'"2000.0"'),  # bids not strictly descending
        lambda r: r.replace(b'"0.3"', b"0.3"),  # size as a number
        lambda r: r.replace(b'"ts":"1700000000123"', b'"ts":1700000000123'),  # ts as a number
        lambda r: r.replace(b'"seq":9', b'"seq":"9"'),
        lambda r: r.replace(b'"seq":9', b'"seq":-9'),
        lambda r: r.replace(b'"checksum":0', b'"checksum":-123456'),
        lambda r: r.replace(b'"ETHUSDT"', b'"ETH\\u0055SDT"'),  # escape in the symbol
        lambda r: r.replace(b'"bids":[', b'"bids": ['),  # whitespace
        lambda r: r.replace(b'"bids":[["2000.0","1.5"],["1999.5","0.3"]]', b'"bids":[]'),
        lambda r: r + b" ",
        lambda r: r[:-1],  # truncated
        lambda r: r.replace(b'"channel":"books15"', b'"channel":"books5"'),
        lambda r: r.replace(
            b'"asks":[', b'"asks":[["2000.6","1"],'
        ),  # an extra first ask above the next: unordered
    ],
)
def test_mutated_frames_agree_with_decode(mutate):
    raw = mutate(_frame([("2000.0", "1.5"), ("1999.5", "0.3")], [("2000.5", "2"), ("2001.0", "4.25")]))
    slow, fast = _both(raw)
    assert fast == slow


def test_fifteen_levels_accepted_sixteen_fall_back():
    bids = [(f"{1000 - i}.5", "1") for i in range(15)]
    asks = [(f"{1001 + i}.5", "2") for i in range(15)]
    sc = Books15Scanner()
    raw = _frame(bids, asks)
    assert sc.scan(raw) and not np.isnan(sc.levels).any()
    raw16 = _frame(bids + [("900.0", "1")], asks)
    assert not sc.scan(raw16)
    (q,) = decode_fast(raw16, 1, StreamCounters())
    assert isinstance(q, Quarantined) and "16 levels" in q.reason


def test_short_book_is_nan_padded():
    sc = Books15Scanner()
    raw = _frame([("10.0", "1")], [("11.0", "1"), ("12.0", "3")])
    assert sc.scan(raw)
    assert np.isnan(sc.levels[0, 1:]).all() and np.isnan(sc.levels[2, 2:]).all()
    slow, fast = _both(raw)
    assert fast == slow


def test_str_input_goes_through_decode():
    slow, fast = _both(DOC_FRAME.decode())
    assert fast == slow
