"""The Bitget v2 wire codec: real frame shapes in, typed events or quarantine out, never an exception."""

import math

import orjson
import pytest

from engine.events import BookSnapshot, Quarantined, Trade
from wire.bitget.bitget_v2 import Control, StreamCounters, decode, encode_books15, encode_trades

DOC_BOOKS = (
    b'{"action":"snapshot","arg":{"instType":"USDT-FUTURES","channel":"books15","instId":"BTCUSDT"},'
    b'"data":[{"asks":[["27000.5","8.760"],["27001.0","0.400"]],"bids":[["27000.0","2.710"],["26999.5","1.460"]],'
    b'"checksum":0,"seq":123,"ts":"1695716059516"}],"ts":1695716059516}'
)
DOC_TRADE = (
    b'{"action":"snapshot","arg":{"instType":"USDT-FUTURES","channel":"trade","instId":"BTCUSDT"},'
    b'"data":[{"ts":"1695716760565","price":"27000.5","size":"0.001","side":"buy","tradeId":"1111111111"},'
    b'{"ts":"1695716759514","price":"27000.0","size":"0.001","side":"sell","tradeId":"1111111110"}],'
    b'"ts":1695716761589}'
)


def test_doc_books15_example_parses_exactly():
    [b] = decode(DOC_BOOKS, 7, StreamCounters())
    assert isinstance(b, BookSnapshot)
    assert b.ts_event == 1695716059516 * 1_000_000 and b.ts_recv == 7 and b.exch_seq == 123
    assert b.bid_px[:2] == (27000.0, 26999.5) and b.ask_sz[:2] == (8.76, 0.4)
    assert all(math.isnan(x) for x in b.bid_px[2:]) and len(b.ask_px) == 15


def test_doc_trade_example_is_emitted_oldest_first():
    c = StreamCounters()
    trades = decode(DOC_TRADE, 9, c)
    assert [type(t) for t in trades] == [Trade, Trade]
    assert [t.trade_id for t in trades] == ["1111111110", "1111111111"]
    assert [t.seq for t in trades] == [0, 1]
    assert trades[1].side == "buy" and trades[1].px == 27000.5


def test_encode_roundtrip():
    raw = encode_books15(
        "ETHUSDT", ts_ms=5, seq=9, bids=[("10.0", "1.000")], asks=[("10.1", "2.000")], push_ts_ms=6
    )
    frame = orjson.loads(raw)
    assert frame["data"][0]["checksum"] == 0 and frame["data"][0]["ts"] == "5" and frame["ts"] == 6
    [b] = decode(raw, 1, StreamCounters())
    assert b.symbol == "ETHUSDT" and b.bid_px[0] == 10.0
    t = encode_trades(
        "ETHUSDT", [{"ts": "5", "price": "10.1", "size": "0.5", "side": "buy", "tradeId": "1"}], push_ts_ms=6
    )
    assert decode(t, 1, StreamCounters())[0].sz == 0.5


def _book(bids, asks):
    return orjson.dumps(
        {
            "action": "snapshot",
            "arg": {"instType": "USDT-FUTURES", "channel": "books15", "instId": "BTCUSDT"},
            "data": [{"asks": asks, "bids": bids, "checksum": 0, "seq": 1, "ts": "1"}],
            "ts": 1,
        }
    )


@pytest.mark.parametrize(
    "raw, reason",
    [
        (b"{not json", "not JSON"),
        (b"[1,2]", "not a JSON object"),
        (
            b'{"action":"snapshot","arg":{"channel":"books50","instId":"BTCUSDT"},"data":[{}]}',
            "unknown channel",
        ),
        (b'{"action":"snapshot","data":[]}', "no arg.channel"),
        (_book([["100.0", "1"]], [["99.0", "1"]]), "crossed book"),
        (_book([["100.0", "NaN"]], [["101.0", "1"]]), "not finite"),
        (_book([["100.0", "-1"]], [["101.0", "1"]]), "not positive"),
        (_book([["100.0", "1"], ["100.5", "1"]], [["101.0", "1"]]), "not strictly descending"),
        (_book([["100.0", 1]], [["101.0", "1"]]), "expected string"),
        (_book([], [["101.0", "1"]]), "empty side"),
        (_book([["1", "1"]] * 16, [["101.0", "1"]]), "16 levels"),
    ],
)
def test_bad_frames_are_quarantined_with_a_reason(raw, reason):
    c = StreamCounters()
    [q] = decode(raw, 5, c)
    assert isinstance(q, Quarantined)
    assert reason in q.reason
    assert q.raw == raw.decode()
    assert c.take("quarantine") == 1  # the quarantine stream got its own seq


def test_control_frames():
    c = StreamCounters()
    assert decode(b"pong", 1, c) == [Control("pong")]
    [ack] = decode(
        b'{"event":"subscribe","arg":{"instType":"USDT-FUTURES","channel":"books15","instId":"BTCUSDT"}}',
        1,
        c,
    )
    assert ack.kind == "subscribe" and ack.arg["instId"] == "BTCUSDT"
    for code in (b"30001", b'"30001"'):
        [err] = decode(
            b'{"event":"error","code":' + code + b',"msg":"doesn\'t exist","op":"subscribe"}', 1, c
        )
        assert err.kind == "error" and err.code == 30001
    [unsub] = decode(b'{"op":"unsubscribe","args":[{"channel":"trade"}]}', 1, c)
    assert unsub.kind == "unsubscribe"


def test_trade_without_trade_id_is_quarantined():
    raw = encode_trades("BTCUSDT", [{"ts": "5", "price": "10.1", "size": "0.5", "side": "buy"}], push_ts_ms=6)
    [q] = decode(raw, 1, StreamCounters())
    assert isinstance(q, Quarantined) and "tradeId" in q.reason
