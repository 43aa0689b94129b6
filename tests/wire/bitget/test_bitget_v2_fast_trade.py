"""The compiled trade fast path gives exactly what the general decoder gives, frame for frame."""

from __future__ import annotations

import random

import orjson
import pytest

from engine.events import Quarantined, Trade
from venue.simulator import generate_frames
from wire.bitget.bitget_v2 import StreamCounters, decode, encode_trades
from wire.bitget.bitget_v2_fast import MAX_TS_MS, TradeScanner, decode_fast

DOC_FRAME = (
    b'{"action":"snapshot","arg":{"instType":"USDT-FUTURES","channel":"trade","instId":"BTCUSDT"},'
    b'"data":[{"ts":"1695716760565","price":"27000.5","size":"0.001","side":"buy","tradeId":"1111111111"},'
    b'{"ts":"1695716759514","price":"27000.0","size":"0.001","side":"sell","tradeId":"1111111110"}],'
    b'"ts":1695716761589}'
)


def _both(raw: bytes | str, ts: int = 5) -> tuple[list, list]:
    return decode(raw, ts, StreamCounters()), decode_fast(raw, ts, StreamCounters())


def test_doc_example_takes_the_fast_path_and_equals_decode():
    sc = TradeScanner()
    assert sc.scan(DOC_FRAME) == 2
    slow, fast = _both(DOC_FRAME)
    assert fast == slow
    assert [t.trade_id for t in fast] == ["1111111110", "1111111111"]  # oldest first
    assert [t.seq for t in fast] == [0, 1] and fast[0].side == "sell" and fast[1].px == 27000.5


def test_every_simulated_frame_decodes_identically():
    """Whole simulated sessions (books15 and trade interleaved, the counters shared): same events,
    same per-stream seq, and every trade frame took the compiled path."""
    c_slow, c_fast = StreamCounters(), StreamCounters()
    sc = TradeScanner()
    trades = fast = 0
    for ts, raw in generate_frames(minutes=2, seed=12):
        assert decode_fast(raw, ts, c_fast) == decode(raw, ts, c_slow)
        if b'"trade"' in raw:
            trades += 1
            fast += sc.scan(raw) > 0
    assert trades > 1000 and fast == trades
    assert c_fast.next_seq == c_slow.next_seq


def _random_decimal(rng: random.Random) -> str:
    ip = str(rng.choice([0, 1, 7, 99, 1234, 59944, 123456789, 10**14]))
    if rng.random() < 0.3:
        return ip
    return ip + "." + "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 9)))


def _frame(rows: list[dict[str, str]], action: str = "update") -> bytes:
    return encode_trades("ETHUSDT", rows, push_ts_ms=1700000000125, action=action)


def test_random_pushes_round_and_order_exactly_like_decode():
    """Random prices/sizes (some past 15 digits: general path, still equal), random timestamps with
    ties and out-of-order rows (the stable oldest-first order), 1..6 trades a push."""
    rng = random.Random(4)
    sc = TradeScanner()
    for _ in range(2000):
        rows = [
            {
                "ts": str(1700000000000 + rng.randint(0, 3)),
                "price": _random_decimal(rng),
                "size": _random_decimal(rng),
                "side": rng.choice(("buy", "sell")),
                "tradeId": str(rng.randint(1, 10**18)),
            }
            for _ in range(rng.randint(1, 6))
        ]
        raw = _frame(rows, action=rng.choice(("update", "snapshot")))
        slow, fast = _both(raw)
        assert fast == slow, raw
        if sc.scan(raw) > 0:
            assert all(isinstance(t, Trade) for t in fast)


ROW = '{"ts":"1700000000123","price":"2000.5","size":"0.3","side":"buy","tradeId":"77"}'


@pytest.mark.parametrize(
    "mutate",
    [
        lambda r: r.replace(b'"action":"update"', b'"action":"partial"'),
        lambda r: r.replace(b'"2000.5"', b'"2e3"'),  # exponent
        lambda r: r.replace(b'"2000.5"', b'"-2000.5"'),
        lambda r: r.replace(b'"2000.5"', b'"0"'),  # zero price: quarantined
        lambda r: r.replace(b'"0.3"', b'"0.000"'),  # zero size
        lambda r: r.replace(b'"2000.5"', b'"NaN"'),
        lambda r: r.replace(b'"2000.5"', b'"inf"'),
        lambda r: r.replace(b'"0.3"', b"0.3"),  # size as a number
        lambda r: r.replace(b'"side":"buy"', b'"side":"BUY"'),
        lambda r: r.replace(b'"side":"buy"', b'"side":"buyer"'),
        lambda r: r.replace(b'"tradeId":"77"', b'"tradeId":""'),
        lambda r: r.replace(b'"tradeId":"77"', b'"tradeId":77'),
        lambda r: r.replace(b'"tradeId":"77"', b'"tradeId":"7\\u00377"'),  # escape
        lambda r: r.replace(b'"tradeId":"77"', b'"tradeId":"7 7"'),
        lambda r: r.replace(b'"ts":"1700000000123"', b'"ts":1700000000123'),  # ts as a number
        lambda r: r.replace(b'"ts":"1700000000123"', b'"ts":""'),
        lambda r: r.replace(b'"ts":"1700000000123"', b'"ts":"17e11"'),
        lambda r: r.replace(b'"ts":"1700000000123"', b'"ts":"0001700000000123"'),  # leading zeros
        lambda r: r.replace(b'"ts":"1700000000123"', f'"ts":"{MAX_TS_MS + 1}"'.encode()),  # int64 edge
        lambda r: r.replace(b'"ts":"1700000000123"', b'"ts":"123456789012345678901"'),  # 21 digits
        lambda r: r.replace(b',"tradeId":"77"', b""),  # missing key
        lambda r: r.replace(b'"side":"buy",', b'"side":"buy","extra":1,'),  # unknown key
        lambda r: r.replace(b'"price":"2000.5","size":"0.3"', b'"size":"0.3","price":"2000.5"'),  # key order
        lambda r: r.replace(b'"data":[', b'"data": ['),  # whitespace
        lambda r: r.replace(ROW.encode(), b""),  # empty data
        lambda r: r.replace(ROW.encode(), b"[]"),  # data element not an object
        lambda r: r.replace(b'"ETHUSDT"', b'"ETH\\u0055SDT"'),  # escape in the symbol
        lambda r: r.replace(b'"channel":"trade"', b'"channel":"trades"'),
        lambda r: r.replace(b'"instType":"USDT-FUTURES"', b'"instType":"COIN-FUTURES"'),
        lambda r: r.replace(b'"ts":1700000000125}', b'"ts":"1700000000125"}'),  # push ts as a string
        lambda r: r + b" ",
        lambda r: r[:-1],  # truncated
        lambda r: r[: len(r) // 2],
    ],
)
def test_mutated_frames_agree_with_decode(mutate):
    base = _frame([orjson.loads(ROW)])
    assert TradeScanner().scan(base) == 1  # the unmutated frame is the fast path's
    raw = mutate(base)
    slow, fast = _both(raw)
    assert fast == slow


def test_too_many_trades_for_the_scanner_fall_back():
    rows = [{"ts": "1", "price": "1.5", "size": "2", "side": "sell", "tradeId": str(i)} for i in range(9)]
    raw = _frame(rows)
    assert TradeScanner(capacity=8).scan(raw) == -1
    assert TradeScanner(capacity=9).scan(raw) == 9
    slow, fast = _both(raw)
    assert fast == slow and len(fast) == 9


def test_str_input_and_non_trade_frames_go_through_decode():
    slow, fast = _both(DOC_FRAME.decode())
    assert fast == slow
    for raw in (b"pong", b"garbage", b'{"event":"subscribe","arg":{"channel":"trade","instId":"X"}}'):
        slow, fast = _both(raw)
        assert fast == slow
    (q,) = decode_fast(b'{"action":"update"', 1, StreamCounters())
    assert isinstance(q, Quarantined)
